/*
 * skip.c — the layers of skip connections (torchgpipe's skip module): a
 * layer's output is stashed under a name (spec.stash, any layer) and a later
 * layer pops it as an extra input.  These are the layers that pop, plus the
 * identity that torchgpipe's models stash from:
 *
 * identity: y = x.  A copy, not a view: callers free a layer's input once
 *   the next layer has consumed it (checkpointed stages, eval), so a view
 *   would dangle.  ResNet's bottleneck stashes its input from one.
 * add: y = x + s, s the popped tensor, or with `out` (torchvision's
 *   projection shortcut, torchgpipe's Residual(downsample)) y = x +
 *   bn(conv1x1_stride(s)): parameters "module.downsample.0.weight" (conv,
 *   no bias), "module.downsample.1.{weight,bias,running_mean,running_var,
 *   num_batches_tracked}" (batch norm), as torchgpipe's state dict names
 *   them: its @skippable wrapper keeps the Residual as `.module`.  (gpipe
 *   named them without "module." before 2026-11-26; gp_snapshot_apply still
 *   loads such files.)  The projection's children are the
 *   stand-alone conv2d and batchnorm layers (the same code), holding views
 *   of the layer's parameters like residual.c's.
 *   gp_saved: t[0] conv output, t[1], t[2] the norm's batch mean and var.
 * concat: y = cat(x', s) along channels, where x' is x zero-padded at the
 *   right and bottom to s's height and width (torchgpipe's U-Net PopCat; an
 *   upsampled decoder map can be a pixel smaller than its encoder's).  2-D
 *   inputs (N, F) concatenate along features.
 *
 * Every popped input gets its gradient in backward_data (dx[1]), which the
 * caller carries back to the layer that stashed it.
 */
#include "layers/layers_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- identity -------------------------------------------------------------- */

static gp_status id_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    (void)l;
    *out = in[0];
    return GP_OK;
}

static gp_status no_init(gp_layer *l, uint64_t seed)
{
    (void)l;
    (void)seed;
    return GP_OK;
}

static gp_status id_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x, gp_tensor *y,
                            gp_saved *s)
{
    (void)ctx;
    (void)s;
    return gp_layers_copy(l->dev, gp_tensor_mem(y), x);
}

static gp_status id_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                  gp_saved *s)
{
    (void)ctx;
    (void)x;
    (void)y;
    (void)s;
    return gp_layers_copy(l->dev, gp_tensor_mem(dx), dy);
}

static double zero_flops(const gp_layer *l, int64_t n)
{
    (void)l;
    (void)n;
    return 0.0;
}

const gp_layer_ops gp_identity_ops = {
    .type = GP_LAYER_IDENTITY,
    .infer = id_infer,
    .init = no_init,
    .forward = id_forward,
    .backward_data = id_backward_data,
    .flops = zero_flops,
    .inplace = GP_INPLACE_VIEW,
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
    .dx_is_dy = true,
    .any_dtype = true,
};

/* ---- add --------------------------------------------------------------------- */

enum { P_CONV = 0, P_BN, P_COUNT };
static const char *const proj_names[P_COUNT] = {"module.downsample.0", "module.downsample.1"};

typedef struct {
    gp_layer child[P_COUNT];
    int first[P_COUNT];
} add_state;

static bool projects(const gp_layer *l) { return l->spec.out > 0; }

static gp_status add_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char a[96], b[96];
    if (!projects(l)) {
        if (!gp_shape_equal(&in[0], &in[1]))
            return gp_layer_spec_error(l, "adds '%s' of shape %s to an input of shape %s; the "
                                       "shapes must match (give `out` and `stride` for a "
                                       "projection shortcut)", l->spec.pop[0],
                                       gp_layers_shape_n(&in[1], a, sizeof a),
                                       gp_layers_shape_n(&in[0], b, sizeof b));
        *out = in[0];
        return GP_OK;
    }
    if (in[1].ndim != 4)
        return gp_layer_spec_error(l, "a projection shortcut needs a 4-D '%s' (N, C, H, W) but "
                                   "it is %s", l->spec.pop[0],
                                   gp_layers_shape_n(&in[1], a, sizeof a));
    if (l->spec.stride.h < 1 || l->spec.stride.w != l->spec.stride.h) {
        char st[48];
        return gp_layer_spec_error(l, "stride = %s must be one number, at least 1",
                                   gp_hw_str(l->spec.stride, st, sizeof st));
    }
    gp_hw o = gp_layers_out_hw(in[1].dims[2], in[1].dims[3], gp_hw_square(1), l->spec.stride,
                               gp_hw_square(0));
    gp_shape p = gp_shape_4d(in[1].dims[0], l->spec.out, o.h, o.w);
    if (!gp_shape_equal(&p, &in[0]))
        return gp_layer_spec_error(l, "the projection of '%s' has shape %s but the input is %s; "
                                   "out and stride must give the input's shape",
                                   l->spec.pop[0], gp_layers_shape_n(&p, a, sizeof a),
                                   gp_layers_shape_n(&in[0], b, sizeof b));
    *out = in[0];
    return GP_OK;
}

/* The child's parameter views, and its layouts (gp_layers_blocked): the
 * projection's convolution reads the popped tensor's (pop_blk) and writes
 * the sum's, in which the norm runs. */
static void sync_child(gp_layer *l, add_state *st, int which)
{
    gp_layer *c = &st->child[which];
    gp_layers_child_view(l, c, st->first[which]);
    c->in_blk = which == P_CONV ? l->pop_blk : l->in_blk;
    c->out_blk = l->in_blk;
}

static gp_status add_init(gp_layer *l, uint64_t seed)
{
    if (!projects(l)) return GP_OK;
    add_state *st = calloc(1, sizeof *st);
    if (!st) return gp_error_set(GP_ERR_OOM, "out of host memory for an add layer");
    l->state = st;
    gp_shape in = l->pop_shape[0];
    for (int k = 0; k < P_COUNT; k++) {
        gp_layer_spec s = gp_layers_child_spec(l, k == P_CONV ? GP_LAYER_CONV2D : GP_LAYER_BATCHNORM,
                                               proj_names[k]);
        s.out = l->spec.out;
        s.bias = false;
        s.kernel = gp_hw_square(1);
        s.stride = l->spec.stride;
        s.padding = gp_hw_square(0);
        s.init = l->spec.init;
        s.momentum = l->spec.momentum;
        s.eps = l->spec.eps;
        s.sync = l->spec.sync;
        GP_TRY(gp_layers_child_setup(l, &s, proj_names[k], k == P_CONV ? &in : &l->out_shape,
                                     seed, &st->child[k], &st->first[k]));
    }
    return GP_OK;
}

static void add_destroy(gp_layer *l)
{
    add_state *st = l->state;
    if (!st) return;
    for (int k = 0; k < P_COUNT; k++) gp_layer_destroy(&st->child[k]); /* views only */
    free(st);
    l->state = NULL;
}

static gp_status add_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x, gp_tensor *y,
                             gp_saved *s)
{
    int64_t n = gp_tensor_numel(y);
    if (!projects(l) && y->dtype == GP_BF16) /* bf16 storage, one pass (takes_bf16) */
        return gp_dev_add_bf16(l->dev, gp_bf16(&x[0]), gp_bf16(&x[1]), gp_bf16(y), n);
    if (!projects(l)) return n ? gp_dev_add(l->dev, gp_f32(&x[0]), gp_f32(&x[1]), gp_f32(y), n) : GP_OK;
    add_state *st = l->state;
    sync_child(l, st, P_CONV);
    sync_child(l, st, P_BN);
    gp_shape ys = gp_tensor_shape(y);
    GP_TRY(gp_layers_saved_alloc(s, 0, l->dev, &ys));
    gp_layer *conv = &st->child[P_CONV], *bn = &st->child[P_BN];
    GP_TRY(conv->ops->forward(conv, ctx, &x[1], &s->t[0], NULL));
    gp_saved bs = {0};
    gp_status r = bn->ops->forward(bn, ctx, &s->t[0], y, &bs);
    s->t[1] = bs.t[0]; /* the batch statistics (training) */
    s->t[2] = bs.t[1];
    bs.t[0] = bs.t[1] = (gp_tensor){0};
    gp_saved_free(&bs);
    GP_TRY(r);
    if (n) GP_TRY(gp_dev_add(l->dev, gp_f32(y), gp_f32(&x[0]), gp_f32(y), n));
    if (!ctx->training) {
        gp_saved_free(s); /* eval: no backward will come */
        s->flags |= GP_SAVED_EVAL;
    }
    return GP_OK;
}

/* The projection's backward: dconv = dBN(dy) (weights of both), then the
 * conv's weights and, with ds, ds = dconv^T. */
static gp_status proj_backward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                               const gp_tensor *dy, gp_tensor *ds, gp_saved *s)
{
    if (s->flags & GP_SAVED_EVAL)
        return gp_layer_spec_error(l, "backward after an eval-mode forward: the projection "
                                      "saved nothing (run forward with training)");
    add_state *st = l->state;
    sync_child(l, st, P_CONV);
    sync_child(l, st, P_BN);
    gp_layer *conv = &st->child[P_CONV], *bn = &st->child[P_BN];
    gp_shape as = gp_tensor_shape(&s->t[0]);
    gp_tensor da = {0};
    GP_TRY(gp_tensor_alloc(&da, l->dev, &as, GP_MEM_ACTIVATIONS));
    gp_saved bs = {0};
    bs.t[0] = s->t[1];
    bs.t[1] = s->t[2];
    bs.t[0].owned = bs.t[1].owned = false;
    gp_status r = bn->ops->backward_data(bn, ctx, &s->t[0], NULL, dy, &da, &bs);
    if (r == GP_OK && bn->ops->backward_weights)
        r = bn->ops->backward_weights(bn, ctx, &s->t[0], NULL, dy, &bs);
    if (r == GP_OK && ds) r = conv->ops->backward_data(conv, ctx, &x[1], NULL, &da, ds, NULL);
    if (r == GP_OK) r = conv->ops->backward_weights(conv, ctx, &x[1], NULL, &da, NULL);
    gp_tensor_free(&da);
    return r;
}

static gp_status add_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                   gp_saved *s)
{
    (void)y;
    GP_TRY(gp_layers_copy(l->dev, gp_tensor_mem(&dx[0]), dy));
    if (!projects(l)) return gp_layers_copy(l->dev, gp_tensor_mem(&dx[1]), dy);
    GP_TRY(proj_backward(l, ctx, x, dy, &dx[1], s));
    s->flags |= GP_SAVED_WEIGHTS_DONE;
    return GP_OK;
}

static gp_status add_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                      const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    (void)y;
    if (!projects(l)) return GP_OK;
    if (gp_saved_take_weights_done(s)) return GP_OK;
    return proj_backward(l, ctx, x, dy, NULL, s);
}

static gp_status add_commit(gp_layer *l)
{
    add_state *st = l->state;
    if (!st) return GP_OK;
    sync_child(l, st, P_BN);
    return st->child[P_BN].ops->commit(&st->child[P_BN]);
}

static void add_discard(gp_layer *l)
{
    add_state *st = l->state;
    if (st) gp_layers_discard(&st->child[P_BN], 1);
}

static gp_status add_allreduce_stats(gp_layer *l, gp_comm *comm)
{
    add_state *st = l->state;
    if (!st) return GP_OK;
    sync_child(l, st, P_BN);
    gp_layer *bn = &st->child[P_BN];
    return bn->ops->allreduce_stats ? bn->ops->allreduce_stats(bn, comm) : GP_OK;
}

/* The plain sum's gradient is dy for both inputs (no projection). */
static bool add_dx_all_dy(const gp_layer *l) { return !projects(l); }

/* The plain sum takes bf16 storage where the device adds bf16 (its
 * backward hands dy on as it is); the projection's convolution and norm
 * are a composite's children, FP32 inside. */
static bool add_takes_bf16(const gp_layer *l)
{
    return !projects(l) && l->dev->iface->add_bf16;
}

static double add_flops(const gp_layer *l, int64_t n)
{
    double outs = (double)n * (double)gp_shape_numel(&l->out_shape);
    if (!projects(l)) return outs;
    return outs + 2.0 * outs * (double)l->pop_shape[0].dims[1] + 4.0 * outs;
}

static size_t add_saved_bytes(const gp_layer *l, int64_t n)
{
    if (!projects(l)) return 0;
    return (size_t)n * (size_t)gp_shape_numel(&l->out_shape) * sizeof(float) +
           2 * (size_t)l->spec.out * sizeof(float);
}

static int add_counters(gp_layer *l, const char **names, int64_t **values, int max)
{
    add_state *st = l->state;
    if (!st) return 0;
    if (max > 0) {
        names[0] = "module.downsample.1.num_batches_tracked";
        values[0] = gp_batchnorm_counter(&st->child[P_BN]);
    }
    return 1;
}

const gp_layer_ops gp_add_ops = {
    .type = GP_LAYER_ADD,
    .counters = add_counters,
    .infer = add_infer,
    .init = add_init,
    .forward = add_forward,
    .backward_data = add_backward_data,
    .backward_weights = add_backward_weights,
    .commit = add_commit,
    .discard = add_discard,
    .allreduce_stats = add_allreduce_stats,
    .takes_bf16 = add_takes_bf16,
    .flops = add_flops,
    .saved_bytes = add_saved_bytes,
    .destroy = add_destroy,
    .pops = 1,
    .bwd_ignores_y = true, /* reads x, dy and what it saved */
    .bwd_ignores_x = true,
    .dx_is_dy = true,
    .dx_all_dy = add_dx_all_dy,
};

/* ---- concat ------------------------------------------------------------------ */

/* (N, C, H, W) of a 4-D shape, or (N, F, 1, 1) of a 2-D one. */
static void dims4(const gp_shape *s, int64_t d[4])
{
    d[0] = s->dims[0];
    d[1] = s->ndim > 1 ? s->dims[1] : 1;
    d[2] = s->ndim == 4 ? s->dims[2] : 1;
    d[3] = s->ndim == 4 ? s->dims[3] : 1;
}

static gp_status concat_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char a[96], b[96];
    bool four = in[0].ndim == 4 && in[1].ndim == 4, two = in[0].ndim == 2 && in[1].ndim == 2;
    if (!four && !two)
        return gp_layer_spec_error(l, "concatenates '%s' %s with an input %s; both must be 4-D "
                                   "(N, C, H, W) or both 2-D (N, F)", l->spec.pop[0],
                                   gp_layers_shape_n(&in[1], a, sizeof a),
                                   gp_layers_shape_n(&in[0], b, sizeof b));
    if (four && (in[0].dims[2] > in[1].dims[2] || in[0].dims[3] > in[1].dims[3]))
        return gp_layer_spec_error(l, "the input %s is larger than '%s' %s; the input is padded "
                                   "up to the popped tensor's height and width, never cropped",
                                   gp_layers_shape_n(&in[0], b, sizeof b), l->spec.pop[0],
                                   gp_layers_shape_n(&in[1], a, sizeof a));
    *out = in[1];
    out->dims[1] = in[0].dims[1] + in[1].dims[1];
    return GP_OK;
}

/* Copy box `dims` between a dense tensor of dims `dd` and channel offset
 * c0 of a dense tensor of dims `yd` (to_y: into y; else out of it), of one
 * element type (FP32 or bf16: bits moved as they are). */
static gp_status box(gp_device *dev, const gp_tensor *y, const int64_t yd[4], int64_t c0,
                     const gp_tensor *t, const int64_t td[4], bool to_y)
{
    GP_ASSERT(y->dtype == t->dtype);
    int64_t ys[4] = {yd[1] * yd[2] * yd[3], yd[2] * yd[3], yd[3], 1};
    int64_t ts[4] = {td[1] * td[2] * td[3], td[2] * td[3], td[3], 1};
    if (td[0] * td[1] * td[2] * td[3] == 0) return GP_OK;
    const size_t es = gp_dtype_size(y->dtype);
    char *yo = (char *)gp_tensor_mem(y) + (size_t)(c0 * ys[1]) * es, *tm = gp_tensor_mem(t);
    return to_y ? gp_dev_copy_box_es(dev, yo, ys, tm, ts, td, es)
                : gp_dev_copy_box_es(dev, tm, ts, yo, ys, td, es);
}

static gp_status concat_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                gp_tensor *y, gp_saved *s)
{
    (void)ctx;
    (void)s;
    int64_t yd[4], ad[4], bd[4];
    gp_shape ys = gp_tensor_shape(y), as = gp_tensor_shape(&x[0]), bs = gp_tensor_shape(&x[1]);
    dims4(&ys, yd);
    dims4(&as, ad);
    dims4(&bs, bd);
    if ((ad[2] != yd[2] || ad[3] != yd[3]) && gp_tensor_numel(y)) /* the padding: zero bits */
        GP_TRY(gp_dev_fill(l->dev, (float *)gp_tensor_mem(y), 0.0f, gp_tensor_words(y)));
    GP_TRY(box(l->dev, y, yd, 0, &x[0], ad, true));
    return box(l->dev, y, yd, ad[1], &x[1], bd, true);
}

static gp_status concat_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                      const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                      gp_saved *s)
{
    (void)ctx;
    (void)y;
    (void)s;
    int64_t yd[4], ad[4], bd[4];
    gp_shape ys = gp_tensor_shape(dy), as = gp_tensor_shape(&x[0]), bs = gp_tensor_shape(&x[1]);
    dims4(&ys, yd);
    dims4(&as, ad);
    dims4(&bs, bd);
    GP_TRY(box(l->dev, dy, yd, 0, &dx[0], ad, false));
    return box(l->dev, dy, yd, ad[1], &dx[1], bd, false);
}

const gp_layer_ops gp_concat_ops = {
    .type = GP_LAYER_CONCAT,
    .infer = concat_infer,
    .init = no_init,
    .forward = concat_forward,
    .backward_data = concat_backward_data,
    .flops = zero_flops,
    .pops = 1,
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
    .any_dtype = true, /* moves bits (copy_box's element size), pads with zero bits */
};

/* ---- the skip map ------------------------------------------------------------ */

void gp_skip_map_free(gp_skip_map *map)
{
    free(map->skips);
    free(map->stashes);
    free(map->pops);
    memset(map, 0, sizeof *map);
}

gp_status gp_skip_map_build(const gp_layer_spec *specs, int n, gp_skip_map *map)
{
    memset(map, 0, sizeof *map);
    map->n_layers = n;
    int max = 0;
    for (int k = 0; k < n; k++) max += specs[k].stash[0] != '\0';
    map->skips = calloc((size_t)(max ? max : 1), sizeof *map->skips);
    map->stashes = malloc((size_t)(n ? n : 1) * sizeof *map->stashes);
    map->pops = malloc((size_t)(n ? n : 1) * GP_MAX_POPS * sizeof *map->pops);
    if (!map->skips || !map->stashes || !map->pops) {
        gp_skip_map_free(map);
        return gp_error_set(GP_ERR_OOM, "out of host memory for the skip connections");
    }
    for (int k = 0; k < n * GP_MAX_POPS; k++) map->pops[k] = -1;
    char a[256], b[256];
    gp_status st = GP_OK;
    /* Walk the layers in order; a skip is open from its stash to its pop. */
    for (int k = 0; k < n && st == GP_OK; k++) {
        const gp_layer_spec *s = &specs[k];
        for (int q = 0; q < s->n_pop && st == GP_OK; q++) {
            int found = -1, popped = -1;
            for (int t = map->n - 1; t >= 0; t--)
                if (!strcmp(map->skips[t].name, s->pop[q])) {
                    if (map->skips[t].to < 0) found = t;
                    else popped = t;
                    break;
                }
            if (found >= 0) {
                map->skips[found].to = k;
                map->skips[found].slot = 1 + q;
                map->pops[k * GP_MAX_POPS + q] = found;
                continue;
            }
            if (popped >= 0) {
                const gp_skip *p = &map->skips[popped];
                char c[256];
                st = gp_error_set(GP_ERR_INVALID, "%s: pops '%s', but %s stashed it and %s "
                                  "popped it already; a stash is popped once (stash it again, "
                                  "or under another name)", gp_layer_spec_describe(s, k, a, sizeof a),
                                  s->pop[q], gp_layer_spec_describe(&specs[p->from], p->from, b, sizeof b),
                                  gp_layer_spec_describe(&specs[p->to], p->to, c, sizeof c));
                break;
            }
            int later = -1;
            for (int t = k; t < n && later < 0; t++)
                if (!strcmp(specs[t].stash, s->pop[q])) later = t;
            if (later >= 0)
                st = gp_error_set(GP_ERR_INVALID, "%s: pops '%s' before %s stashes it; a skip "
                                  "goes from an earlier layer to a later one",
                                  gp_layer_spec_describe(s, k, a, sizeof a), s->pop[q],
                                  gp_layer_spec_describe(&specs[later], later, b, sizeof b));
            else
                st = gp_error_set(GP_ERR_INVALID, "%s: pops '%s', but no layer stashes it; add "
                                  "stash: %s to the layer whose output it is",
                                  gp_layer_spec_describe(s, k, a, sizeof a), s->pop[q], s->pop[q]);
        }
        map->stashes[k] = -1;
        if (st != GP_OK || !s->stash[0]) continue;
        for (int t = 0; t < map->n; t++)
            if (map->skips[t].to < 0 && !strcmp(map->skips[t].name, s->stash)) {
                st = gp_error_set(GP_ERR_INVALID, "%s: stashes '%s', but %s stashed it already "
                                  "and no layer popped it in between; use another name",
                                  gp_layer_spec_describe(s, k, a, sizeof a), s->stash,
                                  gp_layer_spec_describe(&specs[map->skips[t].from], map->skips[t].from,
                                                b, sizeof b));
                break;
            }
        if (st != GP_OK) break;
        gp_skip *sk = &map->skips[map->n];
        snprintf(sk->name, sizeof sk->name, "%s", s->stash);
        sk->from = k;
        sk->to = -1;
        map->stashes[k] = map->n++;
    }
    for (int t = 0; t < map->n && st == GP_OK; t++)
        if (map->skips[t].to < 0)
            st = gp_error_set(GP_ERR_INVALID, "%s: stashes '%s', but no later layer pops it; pop "
                              "it (add or concat with pop: %s) or remove the stash",
                              gp_layer_spec_describe(&specs[map->skips[t].from], map->skips[t].from, a,
                                            sizeof a), map->skips[t].name, map->skips[t].name);
    if (st != GP_OK) gp_skip_map_free(map);
    return st;
}

int gp_skip_map_inputs(const gp_skip_map *map, int k, const gp_shape *input, const gp_shape *outs,
                       gp_shape *in)
{
    in[0] = k ? outs[k - 1] : *input;
    int n = 1;
    for (int q = 0; q < GP_MAX_POPS; q++) {
        int t = map->pops[k * GP_MAX_POPS + q];
        if (t < 0) break;
        in[n++] = outs[map->skips[t].from];
    }
    return n;
}
