/*
 * factorized_reduce.c — AmoebaNet's FactorizedReduce (torchgpipe's
 * benchmarks/models/amoebanet/operations.py) as one layer: halves the
 * height and width with two 1x1 stride-2 convolutions that see the even
 * and the odd pixels.
 *
 *   r  = relu(x)                                         (N, C, H, W)
 *   c1 = conv1(r)            1x1, stride 2, no bias      (N, K/2, OH, OW)
 *   c2 = conv2(pad(r[:, :, 1:, 1:]))  the same on the input shifted by one
 *        pixel up and left, zero-padded at the bottom and right
 *   y  = bn(cat(c1, c2) along channels)                  (N, K, OH, OW)
 *
 * with OH = ceil(H / 2), OW = ceil(W / 2).  Parameters as torchgpipe's
 * state dict names them: "conv1.weight", "conv2.weight" (K/2, C, 1, 1),
 * "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var" (K), and the
 * counter "bn.num_batches_tracked".
 *
 * conv2 reads the shifted, padded input at the even positions (2a, 2b),
 * i.e. r at (2a + 1, 2b + 1), or zero past the edge.  Rather than the
 * padded (N, C, H, W) copy PyTorch makes, the layer gathers just those
 * pixels, xs = r[:, :, 1::2, 1::2] zero-padded to (OH, OW), with one
 * strided copy (copy_box), and runs conv2 as a 1x1 stride-1 convolution on
 * it: the same products, a quarter of the memory.  Its gradient goes back
 * the same way: conv1's backward-data writes every element of dx and leaves
 * zeros at the odd positions (2a + 1, 2b + 1), which no stride-2 1x1 window
 * reads, so conv2's input gradient is copied (not added) into them.
 *
 * Built from child layers (conv2d, batchnorm) as residual.c is: the layer
 * owns the parameters, the children hold views re-pointed before every
 * use, and their RNG streams continue the layer's numbering (param_base).
 * `init` applies to both convolutions; momentum, eps and sync to the norm.
 *
 * gp_saved slots (training forward; eval keeps nothing):
 *   t[0] r = relu(x)             (N, C, H, W)
 *   t[1] xs (conv2's input)      (N, C, OH, OW)
 *   t[2] cat (the norm's input)  (N, K, OH, OW)
 *   t[3], t[4] the norm's batch mean and var (K)
 * Backward is one pass that produces dx and all weight gradients, so
 * backward_data does it all and flags gp_saved; without dx (first layer)
 * backward_weights runs it without the dx-only work.
 */
#include "layers/layers_impl.h"

#include <stdlib.h>
#include <string.h>

enum { C_CONV1 = 0, C_CONV2, C_BN, C_COUNT };

static const char *const child_names[C_COUNT] = {"conv1", "conv2", "bn"};

enum { S_R = 0, S_XS = 1, S_CAT = 2, S_BN = 3 };

typedef struct {
    gp_layer child[C_COUNT];
    int first[C_COUNT]; /* index in the layer's params of child's params[0] */
} fr_state;

static gp_status fr_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    const gp_layer_spec *sp = &l->spec;
    if (in->ndim != 4)
        return gp_layer_spec_error(l,
                                   "expected 4-D input (N, C, H, W) but got %s; a factorized "
                                   "reduce cannot follow flatten or linear layers",
                                   gp_layers_shape_n(in, b, sizeof b));
    if (sp->out <= 0 || sp->out % 2 != 0)
        return gp_layer_spec_error(l, "out = %lld must be a positive even number (two "
                                   "convolutions of out / 2 channels are concatenated); write "
                                   "e.g. {factorized_reduce: {out: 64}}", (long long)sp->out);
    if (sp->in > 0 && sp->in != in->dims[1])
        return gp_layer_spec_error(l, "in = %lld but the input has %lld channels %s; remove 'in' "
                                   "(it is inferred)", (long long)sp->in, (long long)in->dims[1],
                                   gp_layers_shape_n(in, b, sizeof b));
    gp_hw o = gp_layers_out_hw(in->dims[2], in->dims[3], gp_hw_square(1), gp_hw_square(2),
                               gp_hw_square(0));
    *out = gp_shape_4d(in->dims[0], sp->out, o.h, o.w);
    return GP_OK;
}

static gp_layer_spec child_spec(const gp_layer *l, int which)
{
    gp_layer_spec s = gp_layers_child_spec(l, which == C_BN ? GP_LAYER_BATCHNORM : GP_LAYER_CONV2D,
                                           child_names[which]);
    s.out = which == C_BN ? l->spec.out : l->spec.out / 2;
    s.bias = false;
    s.init = l->spec.init;
    s.momentum = l->spec.momentum;
    s.eps = l->spec.eps;
    s.sync = l->spec.sync;
    s.kernel = gp_hw_square(1);
    s.padding = gp_hw_square(0);
    /* conv2 runs on the gathered odd pixels: stride 1 there */
    s.stride = gp_hw_square(which == C_CONV1 ? 2 : 1);
    return s;
}

static void sync_child(gp_layer *l, fr_state *st, int which)
{
    gp_layers_child_view(l, &st->child[which], st->first[which]);
}

/* Every child's parameter views, and its output type: the layer's
 * tensors' own (dt: bf16 where it runs on bf16 storage, fr_takes_bf16). */
static void sync_all(gp_layer *l, fr_state *st, gp_dtype dt)
{
    for (int k = 0; k < C_COUNT; k++)
        if (st->child[k].ops) {
            sync_child(l, st, k);
            st->child[k].out_dtype = dt;
        }
}

static gp_status add_child(gp_layer *l, fr_state *st, int which, const gp_shape *in,
                           uint64_t seed)
{
    gp_layer_spec s = child_spec(l, which);
    return gp_layers_child_setup(l, &s, child_names[which], in, seed, &st->child[which],
                                 &st->first[which]);
}

static gp_status fr_init(gp_layer *l, uint64_t seed)
{
    fr_state *st = calloc(1, sizeof *st);
    if (!st) return gp_error_set(GP_ERR_OOM, "out of host memory for a factorized reduce");
    l->state = st;
    gp_shape xs = gp_shape_4d(1, l->in_shape.dims[1], l->out_shape.dims[2], l->out_shape.dims[3]);
    GP_TRY(add_child(l, st, C_CONV1, &l->in_shape, seed));
    GP_TRY(add_child(l, st, C_CONV2, &xs, seed));
    GP_TRY(add_child(l, st, C_BN, &l->out_shape, seed));
    return GP_OK;
}

static void fr_destroy(gp_layer *l)
{
    fr_state *st = l->state;
    if (!st) return;
    for (int k = 0; k < C_COUNT; k++) gp_layer_destroy(&st->child[k]); /* views only */
    free(st);
    l->state = NULL;
}

/* ---- the strided copies ----------------------------------------------------- */

/* The odd pixels of a (N, C, H, W) tensor, (1 + 2a, 1 + 2b) for a < H / 2,
 * b < W / 2, against the first (H / 2, W / 2) pixels of a (N, C, OH, OW)
 * one: gather (to_odd false: sub = full's odd pixels) or scatter (to_odd
 * true: full's odd pixels = sub). */
static gp_status odd_pixels(gp_device *dev, const gp_tensor *full, const gp_tensor *sub,
                            bool to_odd)
{
    GP_ASSERT(full->dtype == sub->dtype);
    const int64_t n = full->dims[0], c = full->dims[1], h = full->dims[2], w = full->dims[3];
    const int64_t oh = sub->dims[2], ow = sub->dims[3];
    const int64_t fs[4] = {c * h * w, h * w, 2 * w, 2}, ss[4] = {c * oh * ow, oh * ow, ow, 1};
    const int64_t dims[4] = {n, c, h / 2, w / 2};
    if (dims[0] * dims[1] * dims[2] * dims[3] == 0) return GP_OK;
    const size_t es = gp_dtype_size(full->dtype);
    char *odd = (char *)gp_tensor_mem(full) + (size_t)(w + 1) * es, *sm = gp_tensor_mem(sub);
    return to_odd ? gp_dev_copy_box_es(dev, odd, fs, sm, ss, dims, es)
                  : gp_dev_copy_box_es(dev, sm, ss, odd, fs, dims, es);
}

/* relu(x) into y (forward), or the relu's backward in place over g from
 * its output r; in x's element type. */
static gp_status relu_fwd(gp_device *dev, const gp_tensor *x, gp_tensor *y)
{
    int64_t n = gp_tensor_numel(x);
    if (x->dtype == GP_BF16)
        return gp_dev_act_bf16(dev, GP_ACT_RELU, gp_bf16(x), NULL, gp_bf16(y), n, 0.0f);
    return gp_dev_relu_fwd(dev, gp_f32(x), gp_f32(y), n);
}

static gp_status relu_bwd(gp_device *dev, const gp_tensor *r, gp_tensor *g)
{
    int64_t n = gp_tensor_numel(g);
    if (g->dtype == GP_BF16)
        return gp_dev_act_bf16(dev, GP_ACT_RELU, gp_bf16(r), gp_bf16(g), gp_bf16(g), n, 0.0f);
    return gp_dev_relu_bwd(dev, gp_f32(r), gp_f32(g), gp_f32(g), n);
}

/* ---- forward and backward ----------------------------------------------------- */

static gp_status child_fwd(fr_state *st, int which, const gp_fwd_ctx *ctx, const gp_tensor *x,
                           gp_tensor *y, gp_saved *s, int slot)
{
    gp_layer *c = &st->child[which];
    gp_saved cs;
    memset(&cs, 0, sizeof cs);
    gp_status r = gp_layers_child_forward(c, ctx, x, y, &cs);
    if (slot >= 0) { /* the norm's statistics move into the layer's slots */
        s->t[slot] = cs.t[0];
        s->t[slot + 1] = cs.t[1];
        cs.t[0] = cs.t[1] = (gp_tensor){0};
    }
    gp_saved_free(&cs); /* nothing else: convolutions save nothing */
    return r;
}

static gp_status child_bwd(fr_state *st, int which, const gp_fwd_ctx *ctx, const gp_tensor *x,
                           const gp_tensor *dy, gp_tensor *dx, gp_saved *s, int slot)
{
    gp_layer *c = &st->child[which];
    gp_saved cs;
    memset(&cs, 0, sizeof cs);
    if (slot >= 0) { /* lent, not given */
        cs.t[0] = s->t[slot];
        cs.t[1] = s->t[slot + 1];
        cs.t[0].owned = cs.t[1].owned = false;
    }
    return gp_layers_child_backward(c, ctx, x, NULL, dy, dx, &cs);
}

static gp_status fr_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                            gp_tensor *y, gp_saved *s)
{
    fr_state *st = l->state;
    gp_device *dev = l->dev;
    int64_t n = x->dims[0], c = x->dims[1], h = x->dims[2], w = x->dims[3];
    int64_t k = l->spec.out, oh = y->dims[2], ow = y->dims[3];
    if (n == 0) return GP_OK;
    const gp_dtype dt = x->dtype; /* y's too (fr_takes_bf16) */
    sync_all(l, st, dt);
    gp_shape xs = gp_tensor_shape(x), subs = gp_shape_4d(n, c, oh, ow);
    gp_shape ys = gp_tensor_shape(y), hs = gp_shape_4d(n, k / 2, oh, ow);
    gp_tensor half = {0};
    gp_status r = GP_OK;
#define FR_TRY(e) do { if ((r = (e)) != GP_OK) goto done; } while (0)
    FR_TRY(gp_layers_saved_alloc_as(s, S_R, dev, &xs, dt));
    FR_TRY(gp_layers_saved_alloc_as(s, S_XS, dev, &subs, dt));
    FR_TRY(gp_layers_saved_alloc_as(s, S_CAT, dev, &ys, dt));
    FR_TRY(gp_tensor_alloc_as(&half, dev, &hs, dt, GP_MEM_ACTIVATIONS));
    FR_TRY(relu_fwd(dev, x, &s->t[S_R]));
    if (oh * 2 != h || ow * 2 != w) /* odd sizes: the last row / column is padding (zero bits) */
        FR_TRY(gp_dev_fill(dev, (float *)gp_tensor_mem(&s->t[S_XS]), 0.0f,
                           gp_tensor_words(&s->t[S_XS])));
    FR_TRY(odd_pixels(dev, &s->t[S_R], &s->t[S_XS], false));
    FR_TRY(child_fwd(st, C_CONV1, ctx, &s->t[S_R], &half, s, -1));
    FR_TRY(gp_layers_copy_channels(dev, &s->t[S_CAT], 0, &half, 0, k / 2));
    FR_TRY(child_fwd(st, C_CONV2, ctx, &s->t[S_XS], &half, s, -1));
    FR_TRY(gp_layers_copy_channels(dev, &s->t[S_CAT], k / 2, &half, 0, k / 2));
    FR_TRY(child_fwd(st, C_BN, ctx, &s->t[S_CAT], y, s, S_BN));
done:
#undef FR_TRY
    gp_tensor_free(&half);
    if (r == GP_OK && !ctx->training) {
        gp_saved_free(s); /* eval: no backward will come */
        s->flags |= GP_SAVED_EVAL;
    }
    return r;
}

/* The whole backward; dx == NULL skips the work only dx needs. */
static gp_status fr_backward_all(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                 const gp_tensor *dy, gp_tensor *dx, gp_saved *s)
{
    fr_state *st = l->state;
    gp_device *dev = l->dev;
    int64_t n = x->dims[0], c = x->dims[1];
    int64_t k = l->spec.out, oh = dy->dims[2], ow = dy->dims[3];
    if (n == 0) return GP_OK;
    if (s->flags & GP_SAVED_EVAL)
        return gp_layer_spec_error(l, "backward after an eval-mode forward: the layer saved "
                                      "nothing (run forward with training)");
    GP_ASSERT(gp_tensor_mem(&s->t[S_R]) && gp_tensor_mem(&s->t[S_XS]) && gp_tensor_mem(&s->t[S_CAT]));
    const gp_dtype dt = x->dtype;
    sync_all(l, st, dt);
    gp_shape ys = gp_tensor_shape(dy), hs = gp_shape_4d(n, k / 2, oh, ow);
    gp_shape subs = gp_shape_4d(n, c, oh, ow);
    gp_tensor g = {0}, gh = {0}, dsub = {0};
    gp_status r = GP_OK;
#define FR_TRY(e) do { if ((r = (e)) != GP_OK) goto done; } while (0)
    FR_TRY(gp_tensor_alloc_as(&g, dev, &ys, dt, GP_MEM_ACTIVATIONS));
    FR_TRY(gp_tensor_alloc_as(&gh, dev, &hs, dt, GP_MEM_ACTIVATIONS));
    /* g = d cat (the convolutions have weights: always needed) */
    FR_TRY(child_bwd(st, C_BN, ctx, &s->t[S_CAT], dy, &g, s, S_BN));
    /* conv1: dx = its input gradient (every element written) */
    FR_TRY(gp_layers_copy_channels(dev, &gh, 0, &g, 0, k / 2));
    FR_TRY(child_bwd(st, C_CONV1, ctx, &s->t[S_R], &gh, dx, s, -1));
    /* conv2: its input gradient into dx's odd pixels, which conv1 left 0 */
    FR_TRY(gp_layers_copy_channels(dev, &gh, 0, &g, k / 2, k / 2));
    if (dx) FR_TRY(gp_tensor_alloc_as(&dsub, dev, &subs, dt, GP_MEM_ACTIVATIONS));
    FR_TRY(child_bwd(st, C_CONV2, ctx, &s->t[S_XS], &gh, dx ? &dsub : NULL, s, -1));
    if (dx) {
        FR_TRY(odd_pixels(dev, dx, &dsub, true));
        /* relu: in place, per element (backend/elementwise.h) */
        FR_TRY(relu_bwd(dev, &s->t[S_R], dx));
    }
done:
#undef FR_TRY
    gp_tensor_free(&g);
    gp_tensor_free(&gh);
    gp_tensor_free(&dsub);
    return r;
}

static gp_status fr_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                  gp_saved *s)
{
    (void)y;
    GP_TRY(fr_backward_all(l, ctx, x, dy, dx, s));
    s->flags |= GP_SAVED_WEIGHTS_DONE;
    return GP_OK;
}

static gp_status fr_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                     const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    (void)y;
    if (gp_saved_take_weights_done(s)) return GP_OK;
    return fr_backward_all(l, ctx, x, dy, NULL, s);
}

static gp_status fr_commit(gp_layer *l)
{
    fr_state *st = l->state;
    gp_layer *c = &st->child[C_BN];
    sync_child(l, st, C_BN);
    return c->ops->commit(c);
}

static void fr_discard(gp_layer *l)
{
    fr_state *st = l->state;
    gp_layers_discard(&st->child[C_BN], 1);
}

static gp_status fr_allreduce_stats(gp_layer *l, gp_comm *comm)
{
    fr_state *st = l->state;
    gp_layer *c = &st->child[C_BN];
    sync_child(l, st, C_BN);
    return c->ops->allreduce_stats ? c->ops->allreduce_stats(c, comm) : GP_OK;
}

static double fr_flops(const gp_layer *l, int64_t n)
{
    double outs = (double)n * (double)gp_shape_numel(&l->out_shape); /* N K OH OW */
    double ins = (double)n * (double)gp_shape_numel(&l->in_shape);
    /* two convs of K/2 outputs over C inputs; relu; the norm */
    return 2.0 * outs * (double)l->in_shape.dims[1] + ins + 4.0 * outs;
}

static size_t fr_saved_bytes(const gp_layer *l, int64_t n)
{
    size_t in = (size_t)n * (size_t)gp_shape_numel(&l->in_shape);
    size_t sub = (size_t)n * (size_t)(l->in_shape.dims[1] * l->out_shape.dims[2] *
                                      l->out_shape.dims[3]);
    size_t out = (size_t)n * (size_t)gp_shape_numel(&l->out_shape);
    return n == 0 ? 0
                  : (in + sub + out) * gp_dtype_size(l->out_dtype) +
                        2 * (size_t)l->spec.out * sizeof(float);
}

static int fr_counters(gp_layer *l, const char **names, int64_t **values, int max)
{
    fr_state *st = l->state;
    if (max > 0) {
        names[0] = "bn.num_batches_tracked";
        values[0] = gp_batchnorm_counter(&st->child[C_BN]);
    }
    return 1;
}

/* On bf16 storage the layer keeps r, xs and the concatenation in bf16: the
 * relu on bf16 in one pass (act_bf16), the copies move bits, each child
 * runs on bf16 or through the storage adapter around it alone. */
static bool fr_takes_bf16(const gp_layer *l)
{
    return l->dev && l->dev->iface->copy_box && gp_dev_act_bf16_has(l->dev, GP_ACT_RELU);
}

const gp_layer_ops gp_factorized_reduce_ops = {
    .type = GP_LAYER_FACTORIZED_REDUCE,
    .takes_bf16 = fr_takes_bf16,
    .counters = fr_counters,
    .infer = fr_infer,
    .init = fr_init,
    .forward = fr_forward,
    .backward_data = fr_backward_data,
    .backward_weights = fr_backward_weights,
    .commit = fr_commit,
    .discard = fr_discard,
    .allreduce_stats = fr_allreduce_stats,
    .flops = fr_flops,
    .saved_bytes = fr_saved_bytes,
    .destroy = fr_destroy,
    .bwd_ignores_y = true, /* reads x, dy and what it saved */
};
