/*
 * checkpoint.c — the checkpointing policy, the stash, and the loops over a
 * stage's layers (checkpoint.h).
 */
#include "checkpoint/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool gp_ckpt_checkpointed(gp_checkpoint_mode mode, bool backward_next)
{
    switch (mode) {
    case GP_CKPT_ALWAYS: return true;
    case GP_CKPT_EXCEPT_LAST: return !backward_next;
    case GP_CKPT_NEVER: return false;
    }
    return false;
}

void gp_ckpt_kept(const bool *inplace, int count, bool *kept)
{
    for (int h = 0, e; h < count; h = e + 1) {
        bool any = kept[h];
        for (e = h; e + 1 < count && inplace[e + 1]; e++) any = any || kept[e + 1];
        for (int c = h; c <= e; c++) kept[c] = any;
    }
}

void gp_ckpt_keep_str(gp_ckpt_keep keep, char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = '\0';
    for (int t = 0; t < GP_LAYER_TYPE_COUNT && at < len; t++)
        if (keep >> t & 1u) {
            int w = snprintf(buf + at, len - at, "%s%s", at ? ", " : "",
                             gp_layer_type_name((gp_layer_type)t));
            at += w > 0 ? (size_t)w : 0;
        }
}

gp_status gp_stash_init(gp_stash *s, int count, const gp_skip_map *skips, int first)
{
    *s = (gp_stash){0};
    s->count = count;
    s->acts = calloc((size_t)count + 1, sizeof *s->acts);
    s->grads = calloc((size_t)count + 1, sizeof *s->grads);
    s->saved = calloc((size_t)(count > 0 ? count : 1), sizeof *s->saved);
    s->uses = calloc((size_t)count + 1, sizeof *s->uses);
    s->inplace = calloc((size_t)count + 1, sizeof *s->inplace);
    s->unkept = calloc((size_t)count + 1, sizeof *s->unkept);
    s->fused = calloc((size_t)count + 1, sizeof *s->fused);
    s->kept = calloc((size_t)count + 1, sizeof *s->kept);
    bool ok = s->acts && s->grads && s->saved && s->uses && s->inplace && s->unkept && s->fused &&
              s->kept;
    if (ok && skips && skips->n > 0) {
        size_t t = (size_t)skips->n;
        s->skips = skips;
        s->first = first;
        s->skip_in = calloc(t, sizeof *s->skip_in);
        s->skip_out = calloc(t, sizeof *s->skip_out);
        s->skip_dout = calloc(t, sizeof *s->skip_dout);
        s->skip_din = calloc(t, sizeof *s->skip_din);
        ok = s->skip_in && s->skip_out && s->skip_dout && s->skip_din;
    }
    if (!ok) {
        gp_stash_destroy(s);
        return gp_error_set(GP_ERR_OOM, "out of host memory for a stash of %d layers", count);
    }
    return GP_OK;
}

gp_skip_role gp_stash_skip_role(const gp_stash *s, int t)
{
    const gp_skip *k = &s->skips->skips[t];
    bool from = k->from >= s->first && k->from < s->first + s->count;
    bool to = k->to >= s->first && k->to < s->first + s->count;
    return from && to ? GP_SKIP_INSIDE : from ? GP_SKIP_LEAVES : to ? GP_SKIP_ARRIVES
                                                                    : GP_SKIP_APART;
}

static int n_skips(const gp_stash *s) { return s->skips ? s->skips->n : 0; }

void gp_stash_drop_acts(gp_stash *s)
{
    if (s->acts)
        for (int c = 1; c <= s->count; c++) gp_tensor_free(&s->acts[c]);
    if (s->saved)
        for (int c = 0; c < s->count; c++) gp_saved_free(&s->saved[c]);
    if (s->grads)
        for (int c = 0; c <= s->count; c++) gp_tensor_free(&s->grads[c]);
    if (s->acts) s->acts[0] = (gp_tensor){0};
    for (int t = 0; t < n_skips(s); t++) {
        if (!s->skip_out[t].owned) s->skip_out[t] = (gp_tensor){0}; /* a view of acts */
        gp_tensor_free(&s->skip_dout[t]);
        if (gp_stash_skip_role(s, t) == GP_SKIP_INSIDE) gp_tensor_free(&s->skip_din[t]);
    }
    s->live = false;
    s->weights_due = false;
}

/* Everything but the gradients a backward hands out (skip_din of the
 * skips that arrive). */
static void release_kept(gp_stash *s)
{
    gp_stash_drop_acts(s);
    if (s->out.owned) gp_tensor_free(&s->out);
    s->out = (gp_tensor){0}; /* a view of acts[count], freed above */
    gp_tensor_free(&s->in);
    for (int t = 0; t < n_skips(s); t++) {
        gp_tensor_free(&s->skip_in[t]);
        gp_tensor_free(&s->skip_out[t]);
    }
}

void gp_stash_release(gp_stash *s)
{
    release_kept(s);
    for (int t = 0; t < n_skips(s); t++) gp_tensor_free(&s->skip_din[t]);
}

void gp_stash_destroy(gp_stash *s)
{
    if (s->acts || s->saved) gp_stash_release(s);
    free(s->acts);
    free(s->grads);
    free(s->saved);
    free(s->uses);
    free(s->inplace);
    free(s->unkept);
    free(s->fused);
    free(s->kept);
    free(s->skip_in);
    free(s->skip_out);
    free(s->skip_dout);
    free(s->skip_din);
    *s = (gp_stash){0};
}

static size_t owned_bytes(const gp_tensor *t) { return t->owned ? gp_tensor_bytes(t) : 0; }

size_t gp_stash_bytes(const gp_stash *s)
{
    size_t b = owned_bytes(&s->in) + owned_bytes(&s->out);
    for (int c = 1; s->acts && c <= s->count; c++) b += owned_bytes(&s->acts[c]);
    for (int c = 0; s->saved && c < s->count; c++) b += gp_saved_bytes(&s->saved[c]);
    for (int c = 0; s->grads && c <= s->count; c++) b += owned_bytes(&s->grads[c]);
    for (int t = 0; t < n_skips(s); t++)
        b += owned_bytes(&s->skip_in[t]) + owned_bytes(&s->skip_out[t]) +
             owned_bytes(&s->skip_dout[t]) + owned_bytes(&s->skip_din[t]);
    return b;
}

/* The skip layer c of the stage stashes (-1: none) and the one of its pop q. */
static int stash_of(const gp_stash *s, int c)
{
    return s->skips ? s->skips->stashes[s->first + c] : -1;
}
static int pop_of(const gp_stash *s, int c, int q)
{
    return s->skips ? s->skips->pops[(s->first + c) * GP_MAX_POPS + q] : -1;
}

/* The inputs of layer c: its main input and what it pops. */
static int layer_inputs(const gp_stash *s, int c, const gp_tensor *main, gp_tensor *x)
{
    x[0] = *main;
    int n = 1;
    for (int q = 0; q < GP_MAX_POPS; q++) {
        int t = pop_of(s, c, q);
        if (t < 0) break;
        int from = s->skips->skips[t].from - s->first;
        x[n] = from >= 0 ? s->acts[from + 1] : s->skip_in[t];
        GP_ASSERT(gp_tensor_mem(&x[n]) || gp_tensor_numel(&x[n]) == 0);
        x[n++].owned = false;
    }
    return n;
}

/* A forward that does not keep: one fewer use of layer output a (0 = the
 * stage input), freed at none (the stage input only when evaluating). */
static void consumed(gp_stash *s, int a, gp_fwd_keep mode)
{
    if (a == 0) {
        if (mode == GP_FWD_NOTHING) gp_tensor_free(&s->in);
        return;
    }
    if (s->kept[a - 1]) return; /* the stash keeps it for the backward */
    if (--s->uses[a] == 0) gp_tensor_free(&s->acts[a]);
}

/* Which layers a forward keeps beyond what `mode` says: those of the
 * stash's policy (gp_ckpt_kept) in a checkpointed forward and its
 * recompute; none otherwise. */
static void mark_kept(const gp_layer *layers, gp_fwd_keep mode, bool recompute, gp_stash *s)
{
    bool sel = s->keep != 0 && (mode == GP_FWD_INPUT || recompute);
    for (int c = 0; c < s->count; c++)
        s->kept[c] = sel && (s->keep >> layers[c].spec.type & 1u);
    if (sel) gp_ckpt_kept(s->inplace, s->count, s->kept);
}

/* Layer c has run (or is a kept layer a recompute passes over), keeping:
 * the memory it read, made by layer o and overwritten in place by o + 1 ..
 * c - 1, is read by no backward (unkept), so only its shapes stay.  In a
 * checkpointed forward (`select`) only where o and c are kept: an output
 * the recompute reads again stays, and the others go by their uses. */
static void drop_unread(gp_stash *s, int c, bool select)
{
    if (c < 1 || s->inplace[c]) return;
    int o = c - 1;
    while (o >= 1 && s->inplace[o]) o--;
    if (!s->unkept[o] || (select && !(s->kept[o] && s->kept[c]))) return;
    for (int k = o + 1; k <= c; k++) gp_tensor_drop(&s->acts[k]); /* acts[o + 1] owns it */
}

/* After the stage's first layer ran in a forward that keeps: where its
 * backward does not read its input (a relu, which reads its output; a
 * flatten), no backward of the stage does (the layers after it read
 * their own inputs), so the stage input goes now, not at the backward:
 * its shape stays for that backward.  (A checkpointed forward keeps it for
 * the recompute; the first layer never runs in place over it.) */
static void drop_unread_input(const gp_layer *layers, gp_stash *s)
{
    if (!s->in.owned || gp_tensor_mem(&s->acts[0]) != gp_tensor_mem(&s->in) ||
        !gp_layer_spec_ignores_x(&layers[0].spec))
        return;
    gp_tensor_drop(&s->in);
    s->acts[0].mem = NULL;
}

/* The one forward loop.  recompute: the stage output and the skips that
 * leave were handed on already and stay as they are. */
static gp_status run_forward(gp_layer *layers, const gp_fwd_ctx *ctx, gp_fwd_keep mode,
                             bool recompute, gp_stash *s, int *bad)
{
    bool keep = mode == GP_FWD_KEEP;
    s->acts[0] = s->in;
    s->acts[0].owned = false;
    gp_layers_blocked(layers, s->count);
    gp_layers_inplace(layers, s->count, s->inplace);
    gp_layers_unkept(layers, s->count, s->inplace, s->unkept);
    gp_layers_relu_fused(layers, s->count, s->inplace, s->fused);
    gp_layers_norm_leaky(layers, s->count, s->inplace);
    mark_kept(layers, mode, recompute, s);
    gp_status st = GP_OK;
    /* a residual add's forward also gave the norm after it its output
     * (gp_layers_add_norm): that norm's y and saved statistics */
    gp_tensor next_y = {0};
    gp_saved next_sv = {0};
    bool have_next = false;
    for (int c = 0; c < s->count; c++) {
        if (recompute && s->kept[c]) { /* as its forward left it */
            drop_unread(s, c, false);
            continue;
        }
        gp_tensor x[1 + GP_MAX_POPS];
        layer_inputs(s, c, &s->acts[c], x);
        gp_tensor y = {0};
        /* a pair runs as one call only where both are kept or neither
         * (a GPU's fused epilogue need not give the lone layer's bits) */
        bool pair_ok = s->kept[c] == s->kept[c + 1 < s->count ? c + 1 : c];
        gp_saved sv = {0};
        bool ip = s->inplace[c];
        if (have_next) {
            y = next_y;
            sv = next_sv;
            next_y = (gp_tensor){0};
            next_sv = (gp_saved){0};
            have_next = false;
        } else if (pair_ok && gp_layers_add_norm(layers, s->count, c, s->inplace)) {
            st = gp_layer_add_norm_forward(&layers[c], &layers[c + 1], ctx, x, &y, &next_y,
                                           &next_sv, &have_next);
            if (st == GP_OK && !have_next) st = gp_layer_forward(&layers[c], ctx, x, &y, &sv);
        } else if (pair_ok && gp_layers_linear_gelu(layers, s->count, c, s->inplace)) {
            st = gp_layer_linear_gelu_forward(&layers[c], &layers[c + 1], ctx, x, &y, &next_y,
                                              &have_next);
            if (st == GP_OK && !have_next) st = gp_layer_forward(&layers[c], ctx, x, &y, &sv);
        } else {
            st = ip ? gp_layer_forward_inplace(&layers[c], ctx, x, &y, &sv)
                    : gp_layer_forward(&layers[c], ctx, x, &y, &sv);
        }
        if (st != GP_OK) {
            *bad = c;
            gp_saved_free(&sv);
            break;
        }
        if (c == 0 && keep && !recompute) drop_unread_input(layers, s);
        bool kc = keep || s->kept[c]; /* layer c's output stays for the backward */
        if (ip && !kc) { /* y takes over the memory (c >= 1: a layer output) */
            GP_ASSERT(s->acts[c].owned);
            y.owned = s->acts[c].owned;
            s->acts[c] = (gp_tensor){0};
        }
        s->acts[c + 1] = y;
        int t = stash_of(s, c);
        gp_skip_role role = t >= 0 ? gp_stash_skip_role(s, t) : GP_SKIP_APART;
        if (kc) {
            drop_unread(s, c, !keep);
            s->saved[c] = sv;
            if (role == GP_SKIP_LEAVES && !recompute) {
                s->skip_out[t] = y;
                s->skip_out[t].owned = false;
            }
            if (keep) continue;
        } else {
            gp_saved_free(&sv);
        }
        /* uses of y: the next layer, and a pop inside the stage */
        s->uses[c + 1] = (c + 1 < s->count) + (role == GP_SKIP_INSIDE);
        if (role == GP_SKIP_LEAVES && !kc) {
            if (c + 1 == s->count) { /* also the stage output: a copy of its own */
                gp_shape ys = gp_tensor_shape(&y);
                st = gp_tensor_alloc_as(&s->skip_out[t], y.dev, &ys, y.dtype, GP_MEM_ACTIVATIONS);
                if (st == GP_OK) st = gp_tensor_copy(&s->skip_out[t], &y);
            } else { /* it owns y; the next layer reads a view */
                s->skip_out[t] = y;
                s->acts[c + 1].owned = false;
            }
        }
        consumed(s, c, mode);
        for (int q = 0; q < GP_MAX_POPS && pop_of(s, c, q) >= 0; q++) {
            int u = pop_of(s, c, q), from = s->skips->skips[u].from - s->first;
            if (from >= 0) consumed(s, from + 1, mode);
            else if (mode == GP_FWD_NOTHING) gp_tensor_free(&s->skip_in[u]);
        }
        if (st != GP_OK) {
            *bad = c;
            break;
        }
    }
    if (have_next) { /* a failure between the pair's two layers */
        gp_tensor_free(&next_y);
        gp_saved_free(&next_sv);
    }
    if (st != GP_OK) {
        if (keep) {
            gp_stash_drop_acts(s);
        } else {
            for (int c = 1; c <= s->count; c++) gp_tensor_free(&s->acts[c]);
            for (int c = 0; c < s->count; c++) gp_saved_free(&s->saved[c]);
            for (int t = 0; t < n_skips(s); t++)
                if (gp_stash_skip_role(s, t) == GP_SKIP_LEAVES) gp_tensor_free(&s->skip_out[t]);
        }
        return st;
    }
    if (keep) {
        s->live = true;
        if (!recompute) {
            s->out = s->acts[s->count];
            s->out.owned = false; /* acts[count] owns it */
        }
    } else {
        s->out = s->acts[s->count]; /* owned, or kept: a view of acts[count] */
        if (s->count > 0 && s->kept[s->count - 1]) s->out.owned = false;
        else s->acts[s->count] = (gp_tensor){0};
        s->acts[0] = (gp_tensor){0};
    }
    return GP_OK;
}

gp_status gp_ckpt_forward(gp_layer *layers, const gp_fwd_ctx *ctx, gp_fwd_keep keep,
                          gp_stash *s, int *bad)
{
    GP_ASSERT(!s->live && !gp_tensor_mem(&s->out));
    return run_forward(layers, ctx, keep, false, s, bad);
}

bool gp_stash_hand_out(gp_stash *s, const gp_layer *layers)
{
    int c = s->count - 1;
    if (c < 0 || !s->live || s->inplace[c] || s->out.owned ||
        !gp_layer_spec_end_unread(&layers[c].spec))
        return false;
    gp_tensor *y = &s->acts[s->count];
    if (!y->owned || gp_tensor_mem(y) != gp_tensor_mem(&s->out)) return false;
    s->out.owned = true;
    y->mem = NULL; /* the shape stays: the last layer's backward reads it */
    y->owned = false;
    return true;
}

gp_status gp_ckpt_recompute(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s, int *bad)
{
    GP_ASSERT(!s->live);
    gp_fwd_ctx rc = *ctx;
    rc.recompute = true;
    return run_forward(layers, &rc, GP_FWD_KEEP, true, s, bad);
}

/* dL/d (output of layer c) gets the gradients of the skip it stashes: from
 * its pop inside the stage, or received from a later stage. */
static gp_status add_stash_grad(gp_layer *l, gp_stash *s, int c, gp_tensor *g)
{
    int t = stash_of(s, c);
    if (t < 0) return GP_OK;
    gp_tensor *sg = gp_stash_skip_role(s, t) == GP_SKIP_INSIDE ? &s->skip_din[t]
                                                                : &s->skip_dout[t];
    if (!gp_tensor_mem(sg))
        return gp_error_set(GP_ERR_RUNTIME, "no gradient arrived for the skip '%s' it stashes",
                            s->skips->skips[t].name);
    gp_status st;
    if (!g->owned && gp_tensor_mem(g) != gp_tensor_mem(sg) && sg->owned) {
        /* g views another skip's gradient (an add's input and pop share
         * one memory: gp_layer_backward_take's views), which that skip's
         * stash reads later: added into g, the sum went there too, and the
         * layers before that stash got this skip's gradient twice.  The
         * sum goes into sg, and g takes sg over in its own shape (the same
         * bits: the addition commutes). */
        st = gp_layers_accumulate(l->dev, sg, g);
        if (st == GP_OK) {
            gp_tensor v = *g;
            *g = *sg;
            g->ndim = v.ndim;
            memcpy(g->dims, v.dims, sizeof g->dims);
            *sg = (gp_tensor){0};
        }
        gp_tensor_free(sg);
        return st;
    }
    st = gp_layers_accumulate(l->dev, g, sg);
    if (st == GP_OK && gp_tensor_mem(g) == gp_tensor_mem(sg) && !g->owned) {
        /* g views the pop's gradient (an add of a tensor to itself,
         * gp_layer_backward_take's views): g takes the memory over */
        g->owned = sg->owned;
        *sg = (gp_tensor){0};
    }
    gp_tensor_free(sg);
    return st;
}

/* The gradient that layer c's backward may add its dx into (ctx.dx_into):
 * the one that layer c - 1's stash got from its pop, when c reads c - 1's
 * output alone and its backward adds (gp_layer_dx_adds; a residual add's
 * sum and the layer norm after it).  Not where that gradient is c's own
 * incoming one, g (the pop's add right after c handed its input and pop
 * one memory, gp_layer_backward_take's views: x + LN(x)): a layer norm's
 * data half adds into it in place, and its weights half then read the
 * input's gradient as its dy (weights 80x off).  NULL: none. */
static gp_tensor *fold_target(gp_layer *layers, gp_stash *s, int c, const gp_tensor *g)
{
    int t = c >= 1 ? stash_of(s, c - 1) : -1;
    if (t < 0 || layers[c].n_in != 1 || pop_of(s, c, 0) >= 0) return NULL;
    gp_tensor *sg = gp_stash_skip_role(s, t) == GP_SKIP_INSIDE ? &s->skip_din[t]
                                                                : &s->skip_dout[t];
    if (!gp_tensor_mem(sg) || !sg->owned || gp_tensor_mem(sg) == gp_tensor_mem(g)) return NULL;
    return gp_layer_dx_adds(&layers[c], &s->acts[c], sg) ? sg : NULL;
}

/* Layer c's backward (whole, or its data half), its input gradients
 * distributed: dx[0] into *gin, the pops' into skip_din.  *g is the
 * caller's and read by nobody after this layer (the whole backward, or a
 * data half of a layer without parameters, whose weights half reads
 * nothing): a layer that hands it on unchanged takes it as dx[0]
 * (gp_layer_backward_take), leaving *g empty, instead of copying it. */
static gp_status layer_backward(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s, int c,
                                bool half, gp_tensor *g, bool want_dx, gp_tensor *gin)
{
    gp_tensor x[1 + GP_MAX_POPS], dx[1 + GP_MAX_POPS] = {{0}};
    int nx = layer_inputs(s, c, &s->acts[c], x);
    gp_status st;
    /* every input's gradient may be g's memory (a residual add's: no copy
     * for its pop) where each pop's stash is inside the stage, where the
     * pop's gradient stays until that layer, after the layer before has
     * read the view, and not at the stage's first layer, whose dx leaves */
    bool views = !half && c > 0;
    for (int q = 0; views && q < GP_MAX_POPS && pop_of(s, c, q) >= 0; q++)
        views = s->skips->skips[pop_of(s, c, q)].from - s->first >= 0;
    if (!half || gp_layer_param_count(&layers[c]) == 0)
        st = gp_layer_backward_take(&layers[c], ctx, x, &s->acts[c + 1], g, want_dx ? dx : NULL,
                                    half, views, &s->saved[c]);
    else
        st = gp_layer_backward_data(&layers[c], ctx, x, &s->acts[c + 1], g, want_dx ? dx : NULL,
                                    &s->saved[c]);
    if (st != GP_OK || !want_dx) return st;
    *gin = dx[0];
    for (int q = 1; q < nx; q++) {
        int t = pop_of(s, c, q - 1);
        gp_tensor_free(&s->skip_din[t]);
        s->skip_din[t] = dx[q];
    }
    return GP_OK;
}

gp_status gp_ckpt_backward(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s, gp_tensor *dy,
                           int first_trainable, gp_tensor *dx, int *bad)
{
    GP_ASSERT(s->live);
    gp_tensor g = *dy;
    *dy = (gp_tensor){0};
    gp_status st = GP_OK;
    /* Without dx (the model's first stage) the layers before the first
     * trainable one need no backward and that one needs no dx. */
    int ft = dx ? -1 : first_trainable;
    int folded = -1; /* the layer whose stash's gradient its successor added in */
    int gelu_done = -1; /* the GELU whose backward its successor's product did */
    for (int c = s->count - 1; c >= 0; c--) {
        gp_tensor d = {0};
        if (c >= ft) {
            gp_tensor *into = c > ft ? fold_target(layers, s, c, &g) : NULL;
            bool gelu_before = c - 1 > ft && !into && s->acts[c - 1].dtype == g.dtype &&
                               gp_layers_gelu_linear(layers, s->count, c - 1, &s->acts[c - 1]);
            if (folded != c) st = add_stash_grad(&layers[c], s, c, &g);
            if (st == GP_OK && gelu_done == c) {
                /* its backward was the next layer's epilogue: d is its
                 * input's gradient already */
                d = g;
                g = (gp_tensor){0};
            } else if (st == GP_OK && gelu_before) {
                gp_fwd_ctx gc = *ctx;
                gc.gelu_in = &s->acts[c - 1];
                st = layer_backward(layers, &gc, s, c, false, &g, true, &d);
                if (st == GP_OK) gelu_done = c - 1;
            } else if (st == GP_OK && into) {
                /* dL/d (its input) is the pop's gradient plus this
                 * layer's: its backward adds into the pop's tensor, which
                 * then is the input's whole gradient (no sum after) */
                gp_fwd_ctx fc = *ctx;
                fc.dx_into = into;
                st = layer_backward(layers, &fc, s, c, false, &g, true, &d);
                if (st == GP_OK) {
                    gp_shape ds = gp_tensor_shape(&d);
                    d = gp_tensor_reshape(into, &ds);
                    d.owned = true;
                    *into = (gp_tensor){0};
                    folded = c - 1;
                }
            } else if (st == GP_OK && s->fused[c] && c > ft) {
                /* a relu whose batch norm does its work: the norm's
                 * backward masks this very gradient (gp_bn_desc.relu), so
                 * it passes down untouched, no pass and no copy */
                d = g;
                g = (gp_tensor){0};
                layers[c].relu_bwd_skipped++;
            } else if (st == GP_OK) {
                st = layer_backward(layers, ctx, s, c, false, &g, c > ft, &d);
            }
        }
        gp_tensor_free(&g);
        gp_tensor_free(&s->acts[c + 1]);
        gp_saved_free(&s->saved[c]);
        if (st != GP_OK) {
            gp_tensor_free(&d);
            *bad = c;
            break;
        }
        g = d;
    }
    if (st == GP_OK && dx) *dx = g;
    else gp_tensor_free(&g);
    release_kept(s); /* out: a view of acts[count], or (checkpointed) owned */
    return st;
}

gp_status gp_ckpt_backward_data(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s,
                                gp_tensor *dy, int first_trainable, gp_tensor *dx, int *bad)
{
    GP_ASSERT(s->live && !s->weights_due);
    s->grads[s->count] = *dy;
    *dy = (gp_tensor){0};
    int ft = dx ? -1 : first_trainable;
    for (int c = s->count - 1; c >= 0 && c >= ft; c--) {
        /* grads[c + 1]: all of dL/d (output of c), for both halves */
        gp_status st = add_stash_grad(&layers[c], s, c, &s->grads[c + 1]);
        if (st == GP_OK && c > ft && s->fused[c]) {
            /* a relu whose batch norm does its work, as gp_ckpt_backward
             * hands it down: the norm's backward-data masks this very
             * gradient (gp_bn_desc.relu) and its weights half reads it
             * through the same mask, so it passes untouched (it ran
             * here until 2026-11-29: 0.17 ms of a 1.0 ms stage 0 under
             * zb-h1 on configs/default.yaml, which the simulator, as the
             * profile, counts as nothing) */
            s->grads[c] = s->grads[c + 1];
            s->grads[c + 1] = (gp_tensor){0};
            layers[c].relu_bwd_skipped++;
        } else if (st == GP_OK && c > ft) {
            st = layer_backward(layers, ctx, s, c, true, &s->grads[c + 1], true, &s->grads[c]);
        }
        if (st != GP_OK) {
            *bad = c;
            return st;
        }
        /* only a layer with parameters reads its dy again (its weights
         * half): the others' go now, not at the weights pass (a U-Net
         * block's dropout, norm and leaky ReLU held three maps each until
         * then; balance/sim.c counts what stays) */
        if (c > ft && gp_layer_param_count(&layers[c]) == 0) gp_tensor_free(&s->grads[c + 1]);
    }
    s->weights_due = true;
    if (dx) { /* dL/d in leaves the stash: the previous stage copies it */
        *dx = s->grads[0];
        s->grads[0] = (gp_tensor){0};
    }
    return GP_OK;
}

gp_status gp_ckpt_backward_weights(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s,
                                   int first_trainable, bool has_dx, int *bad)
{
    GP_ASSERT(s->live && s->weights_due);
    int ft = has_dx ? -1 : first_trainable;
    gp_status st = GP_OK;
    for (int c = s->count - 1; c >= 0 && c >= ft && st == GP_OK; c--) {
        gp_tensor x[1 + GP_MAX_POPS];
        layer_inputs(s, c, &s->acts[c], x);
        st = gp_layer_backward_weights(&layers[c], ctx, x, &s->acts[c + 1], &s->grads[c + 1],
                                       &s->saved[c]);
        if (st != GP_OK) *bad = c;
        gp_tensor_free(&s->grads[c + 1]);
    }
    release_kept(s);
    return st;
}

gp_status gp_ckpt_loss_finite(double loss_sum)
{
    if (isfinite(loss_sum)) return GP_OK;
    return gp_error_set(GP_ERR_NUMERIC, "the loss is %s; lower train.optimizer.lr, add warm-up, "
                        "or check the data normalisation",
                        isnan(loss_sum) ? "NaN" : loss_sum > 0 ? "Inf" : "-Inf");
}

/* dlogits (NULL: none) shaped as the logits, of their element type. */
static gp_status alloc_dlogits(gp_device *dev, const gp_tensor *logits, gp_tensor *dlogits)
{
    if (!dlogits) return GP_OK;
    gp_shape os = gp_tensor_shape(logits);
    return gp_tensor_alloc_as(dlogits, dev, &os, logits->dtype, GP_MEM_ACTIVATIONS);
}

gp_status gp_ckpt_loss(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                       const gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                       gp_tensor *dlogits, gp_loss_out *lo)
{
    GP_TRY(alloc_dlogits(dev, logits, dlogits));
    GP_TRY(gp_loss(dev, k, smoothing, classes, logits, targets, grad_scale, dlogits, lo));
    return gp_ckpt_loss_finite(lo->loss_sum);
}

gp_status gp_ckpt_loss_dev(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                           gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                           gp_tensor *dlogits, bool over, gp_loss_result *out)
{
    /* the gradient over the logits: cross-entropy's kernels read each row
     * whole before they write its gradient; the storage adapter's copies
     * (logits neither FP32 nor bf16 with xent_bf16) keep their own */
    over = over && dlogits && k == GP_LOSS_CROSS_ENTROPY &&
           (logits->dtype == GP_F32 || (logits->dtype == GP_BF16 && dev->iface->xent_bf16));
    if (!over) {
        GP_TRY(alloc_dlogits(dev, logits, dlogits));
        return gp_loss_dev(dev, k, smoothing, classes, logits, targets, grad_scale, dlogits,
                           out);
    }
    *dlogits = *logits;
    dlogits->owned = false;
    GP_TRY(gp_loss_dev(dev, k, smoothing, classes, logits, targets, grad_scale, dlogits, out));
    if (logits->owned) { /* the gradient takes the memory over */
        dlogits->owned = true;
        *logits = (gp_tensor){0};
    }
    return GP_OK;
}
