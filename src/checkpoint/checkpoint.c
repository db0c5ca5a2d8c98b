/*
 * checkpoint.c — the checkpointing policy, the stash, and the loops over a
 * stage's layers (checkpoint.h).
 */
#include "checkpoint/checkpoint.h"

#include <math.h>
#include <stdlib.h>

bool gp_ckpt_checkpointed(gp_checkpoint_mode mode, int i, int j, int m, int n)
{
    (void)j;
    (void)n;
    switch (mode) {
    case GP_CKPT_ALWAYS: return true;
    case GP_CKPT_EXCEPT_LAST: return i < m - 1;
    case GP_CKPT_NEVER: return false;
    }
    return false;
}

gp_status gp_stash_init(gp_stash *s, int count)
{
    *s = (gp_stash){0};
    s->count = count;
    s->acts = calloc((size_t)count + 1, sizeof *s->acts);
    s->grads = calloc((size_t)count + 1, sizeof *s->grads);
    s->saved = calloc((size_t)(count > 0 ? count : 1), sizeof *s->saved);
    if (!s->acts || !s->grads || !s->saved) {
        gp_stash_destroy(s);
        return gp_error_set(GP_ERR_OOM, "out of host memory for a stash of %d layers", count);
    }
    return GP_OK;
}

void gp_stash_drop_acts(gp_stash *s)
{
    if (s->acts)
        for (int c = 1; c <= s->count; c++) gp_tensor_free(&s->acts[c]);
    if (s->saved)
        for (int c = 0; c < s->count; c++) gp_saved_free(&s->saved[c]);
    if (s->grads)
        for (int c = 0; c <= s->count; c++) gp_tensor_free(&s->grads[c]);
    if (s->acts) s->acts[0] = (gp_tensor){0};
    s->live = false;
    s->weights_due = false;
}

void gp_stash_release(gp_stash *s)
{
    gp_stash_drop_acts(s);
    if (s->out.owned) gp_tensor_free(&s->out);
    s->out = (gp_tensor){0}; /* a view of acts[count], freed above */
    gp_tensor_free(&s->in);
}

void gp_stash_destroy(gp_stash *s)
{
    if (s->acts || s->saved) gp_stash_release(s);
    free(s->acts);
    free(s->grads);
    free(s->saved);
    *s = (gp_stash){0};
}

size_t gp_stash_bytes(const gp_stash *s)
{
    size_t b = s->in.owned ? gp_tensor_bytes(&s->in) : 0;
    if (s->out.owned) b += gp_tensor_bytes(&s->out);
    for (int c = 1; s->acts && c <= s->count; c++)
        if (s->acts[c].owned) b += gp_tensor_bytes(&s->acts[c]);
    for (int c = 0; s->saved && c < s->count; c++) b += gp_saved_bytes(&s->saved[c]);
    for (int c = 0; s->grads && c <= s->count; c++)
        if (s->grads[c].owned) b += gp_tensor_bytes(&s->grads[c]);
    return b;
}

/* The one forward loop. */
static gp_status run_forward(gp_layer *layers, const gp_fwd_ctx *ctx, gp_fwd_keep mode,
                             gp_stash *s, gp_tensor *out, int *bad)
{
    bool keep = mode == GP_FWD_KEEP;
    s->acts[0] = s->in;
    s->acts[0].owned = false;
    gp_tensor cur = s->acts[0];
    for (int c = 0; c < s->count; c++) {
        gp_tensor y = {0};
        gp_saved sv = {0};
        gp_status st = gp_layer_forward(&layers[c], ctx, &cur, &y, &sv);
        if (st != GP_OK) {
            *bad = c;
            gp_saved_free(&sv);
            if (keep) gp_stash_drop_acts(s);
            else if (c > 0) gp_tensor_free(&cur); /* the stage input stays in s->in */
            return st;
        }
        if (keep) {
            s->acts[c + 1] = y;
            s->saved[c] = sv;
        } else {
            gp_saved_free(&sv);
            if (c > 0) gp_tensor_free(&cur);
            else if (mode == GP_FWD_NOTHING) {
                gp_tensor_free(&s->in);
                s->acts[0] = (gp_tensor){0};
            }
        }
        cur = y;
    }
    if (keep) {
        s->live = true;
        cur.owned = false; /* acts[count] owns it */
    }
    *out = cur;
    return GP_OK;
}

gp_status gp_ckpt_forward(gp_layer *layers, const gp_fwd_ctx *ctx, gp_fwd_keep keep,
                          gp_stash *s, int *bad)
{
    GP_ASSERT(!s->live && !s->out.data);
    return run_forward(layers, ctx, keep, s, &s->out, bad);
}

gp_status gp_ckpt_recompute(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s, int *bad)
{
    GP_ASSERT(!s->live);
    gp_fwd_ctx rc = *ctx;
    rc.recompute = true;
    gp_tensor out;
    return run_forward(layers, &rc, GP_FWD_KEEP, s, &out, bad);
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
    for (int c = s->count - 1; c >= 0; c--) {
        gp_tensor d = {0};
        if (c >= ft)
            st = gp_layer_backward(&layers[c], ctx, &s->acts[c], &s->acts[c + 1], &g,
                                   c > ft ? &d : NULL, &s->saved[c]);
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
    gp_stash_release(s); /* out: a view of acts[count], or (checkpointed) owned */
    return st;
}

gp_status gp_ckpt_backward_data(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s,
                                gp_tensor *dy, int first_trainable, gp_tensor *dx, int *bad)
{
    GP_ASSERT(s->live && !s->weights_due);
    s->grads[s->count] = *dy;
    *dy = (gp_tensor){0};
    int ft = dx ? -1 : first_trainable;
    for (int c = s->count - 1; c >= 0 && c > ft; c--) {
        gp_status st = gp_layer_backward_data(&layers[c], ctx, &s->acts[c], &s->acts[c + 1],
                                              &s->grads[c + 1], &s->grads[c], &s->saved[c]);
        if (st != GP_OK) {
            *bad = c;
            return st;
        }
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
        st = gp_layer_backward_weights(&layers[c], ctx, &s->acts[c], &s->acts[c + 1],
                                       &s->grads[c + 1], &s->saved[c]);
        if (st != GP_OK) *bad = c;
        gp_tensor_free(&s->grads[c + 1]);
    }
    gp_stash_release(s);
    return st;
}

gp_status gp_ckpt_loss(gp_device *dev, const gp_tensor *logits, const gp_tensor *labels,
                       float grad_scale, gp_tensor *dlogits, gp_loss_out *lo)
{
    if (dlogits) {
        gp_shape os = gp_tensor_shape(logits);
        GP_TRY(gp_tensor_alloc(dlogits, dev, &os, GP_MEM_ACTIVATIONS));
    }
    GP_TRY(gp_cross_entropy(dev, logits, labels, grad_scale, dlogits, lo));
    if (!isfinite(lo->loss_sum))
        return gp_error_set(GP_ERR_NUMERIC,
                            "the loss is %g; lower train.optimizer.lr, add warm-up, or check "
                            "the data normalisation", lo->loss_sum);
    return GP_OK;
}
