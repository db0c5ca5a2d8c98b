/*
 * residual.c — torchvision's BasicBlock as one layer:
 *
 *   x -> conv1 (3x3, stride s, no bias) -> bn1 -> relu -> conv2 (3x3, no bias)
 *     -> bn2 -> (+ shortcut) -> relu -> y
 *   shortcut = x, or downsample = conv 1x1 (stride s, no bias) -> bn when
 *   s != 1 or the channel count changes.
 *
 * Built from child layers (conv2d, batchnorm, relu) so the math is the very
 * same code as the stand-alone layers.  The block owns all parameters, named
 * like torchvision's state dict ("conv1.weight", "bn1.running_mean",
 * "downsample.0.weight", "downsample.1.bias", ...); each child holds
 * non-owning views of its own, re-pointed at the parent's tensors before
 * every use (so whoever replaces a parameter tensor of the block is safe).
 * The children's RNG numbering continues the block's (param_base), so every
 * weight has its own stream.
 *
 * gp_saved slots (training forward; eval keeps nothing):
 *   t[0] a1 = conv1(x)          (N, K, OH, OW)
 *   t[1] r1 = relu(bn1(a1))     (N, K, OH, OW)
 *   t[2] a2 = conv2(r1)         (N, K, OH, OW)
 *   t[3] ad = downsample.0(x)   (N, K, OH, OW), only with a downsample
 *   t[4], t[5]   bn1 batch mean, var (C)
 *   t[6], t[7]   bn2 batch mean, var
 *   t[8], t[9]   downsample.1 batch mean, var
 * Backward is one pass that produces dx and all weight gradients, so
 * backward_data does it all and flags gp_saved; without dx (first layer)
 * backward_weights runs the pass and skips the dx-only work.
 *
 * Elementwise ops (add, relu) run in place on the block's own buffers: the
 * backends apply them per element (backend/elementwise.h), so that is safe.
 *
 * Fusion (unless GPIPE_FUSE_RELU=0, or gp_residual_fuse for an A/B): bn1's
 * forward applies the relu after it and its backward masks with it
 * (gp_bn_desc.relu); the shortcut runs first, so bn2's forward adds it and
 * applies the final relu in its own pass (gp_bn_desc.add): the middle map
 * and the output each cross memory once where they crossed 2 and 3 times.
 * The final relu's backward still runs (both the main path and the
 * shortcut take its gradient).  Bit for bit the unfused block
 * (tests/test_checkpoint.c).
 *
 * In a chain of blocked layouts (gp_layers_blocked: the block counts as a
 * convolution, reading one block and writing one) the children run in
 * them (sync_all): the saved maps and the gradients between the children
 * in the output's, x and dx in the input's.
 *
 * On bf16 storage (out_dtype, res_takes_bf16) the saved maps and the
 * gradients between the children are bf16 too, each child run on them
 * through gp_layers_child_forward / _backward (its bf16 kernels, or the
 * storage adapter around it alone), so the block is bit for bit its
 * children as stand-alone bf16 layers (tests/test_bf16.c), but for bn2,
 * which adds the bf16 shortcut and applies the final relu in its own pass
 * where it takes bf16 (gp_bn_desc.add16): one rounding of the sum where
 * the stand-alone layers would round three times.
 */
#include "layers/layers_impl.h"

#include <stdlib.h>
#include <string.h>

enum { C_CONV1 = 0, C_BN1, C_RELU, C_CONV2, C_BN2, C_DCONV, C_DBN, C_COUNT };

static const char *const child_names[C_COUNT] = {
    "conv1", "bn1", "relu", "conv2", "bn2", "downsample.0", "downsample.1",
};

enum { S_A1 = 0, S_R1 = 1, S_A2 = 2, S_AD = 3, S_BN1 = 4, S_BN2 = 6, S_DBN = 8 };

typedef struct {
    gp_layer child[C_COUNT];
    int first[C_COUNT]; /* index in the block's params of child's params[0] */
    bool has_down;
    bool fuse_add;      /* bn2's forward adds the shortcut and applies the relu */
} res_state;

static bool needs_down(const gp_layer *l, const gp_shape *in)
{
    return l->spec.stride.h != 1 || in->dims[1] != l->spec.out;
}

static gp_status res_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    const gp_layer_spec *sp = &l->spec;
    if (in->ndim != 4)
        return gp_layer_spec_error(l,
                                   "expected 4-D input (N, C, H, W) but got %s; a residual "
                                   "block cannot follow flatten or linear layers",
                                   gp_layers_shape_n(in, b, sizeof b));
    if (sp->out <= 0)
        return gp_layer_spec_error(l, "out (the number of output channels) is missing; write "
                                      "e.g. {residual: {out: 64, stride: 1}}");
    if (sp->stride.h <= 0 || sp->stride.w != sp->stride.h) {
        char st[48];
        return gp_layer_spec_error(l, "stride = %s must be one number, at least 1",
                                   gp_hw_str(sp->stride, st, sizeof st));
    }
    if (sp->in > 0 && sp->in != in->dims[1])
        return gp_layer_spec_error(l,
                                   "in = %lld but the input has %lld channels %s; remove 'in' "
                                   "(it is inferred)",
                                   (long long)sp->in, (long long)in->dims[1],
                                   gp_layers_shape_n(in, b, sizeof b));
    /* 3x3 kernel with padding 1 fits any input of at least 1x1 */
    gp_hw o = gp_layers_out_hw(in->dims[2], in->dims[3], gp_hw_square(3), sp->stride,
                               gp_hw_square(1));
    *out = gp_shape_4d(in->dims[0], sp->out, o.h, o.w);
    return GP_OK;
}

static gp_layer_spec child_spec(const gp_layer *l, int which)
{
    static const gp_layer_type types[C_COUNT] = {
        GP_LAYER_CONV2D, GP_LAYER_BATCHNORM, GP_LAYER_RELU, GP_LAYER_CONV2D,
        GP_LAYER_BATCHNORM, GP_LAYER_CONV2D, GP_LAYER_BATCHNORM,
    };
    gp_layer_spec s = gp_layers_child_spec(l, types[which], child_names[which]);
    s.out = l->spec.out;
    s.bias = false;
    s.momentum = l->spec.momentum;
    s.eps = l->spec.eps;
    s.sync = l->spec.sync;
    s.init = l->spec.init;
    if (which == C_CONV1 || which == C_CONV2) {
        s.kernel = gp_hw_square(3);
        s.padding = gp_hw_square(1);
        s.stride = which == C_CONV1 ? l->spec.stride : gp_hw_square(1);
    } else if (which == C_DCONV) {
        s.kernel = gp_hw_square(1);
        s.padding = gp_hw_square(0);
        s.stride = l->spec.stride;
    }
    return s;
}

static void sync_child(gp_layer *l, res_state *st, int which)
{
    gp_layers_child_view(l, &st->child[which], st->first[which]);
}

static gp_status add_child(gp_layer *l, res_state *st, int which, const gp_shape *in,
                           uint64_t seed)
{
    gp_layer_spec s = child_spec(l, which);
    return gp_layers_child_setup(l, &s, child_names[which], in, seed, &st->child[which],
                                 &st->first[which]);
}

static gp_status res_init(gp_layer *l, uint64_t seed)
{
    res_state *st = calloc(1, sizeof *st);
    if (!st) return gp_error_set(GP_ERR_OOM, "out of host memory for a residual block");
    l->state = st;
    st->has_down = needs_down(l, &l->in_shape);
    gp_shape mid = l->out_shape;
    GP_TRY(add_child(l, st, C_CONV1, &l->in_shape, seed));
    GP_TRY(add_child(l, st, C_BN1, &mid, seed));
    /* bn1's forward applies the relu after it (gp_layer.relu_after): one
     * pass over the block's middle map fewer, the same bits */
    st->child[C_BN1].relu_after = gp_layers_fuse_relu_on();
    st->fuse_add = gp_layers_fuse_relu_on();
    GP_TRY(add_child(l, st, C_RELU, &mid, seed));
    GP_TRY(add_child(l, st, C_CONV2, &mid, seed));
    GP_TRY(add_child(l, st, C_BN2, &mid, seed));
    if (st->has_down) {
        GP_TRY(add_child(l, st, C_DCONV, &l->in_shape, seed));
        GP_TRY(add_child(l, st, C_DBN, &mid, seed));
    }
    return GP_OK;
}

int gp_residual_convs(const gp_layer *l, gp_conv_desc conv[3])
{
    const res_state *st = l->state;
    if (!st || !st->child[C_CONV1].ops) return 0;
    static const int which[3] = {C_CONV1, C_CONV2, C_DCONV};
    int n = st->has_down ? 3 : 2;
    for (int j = 0; j < n; j++) {
        conv[j] = gp_conv2d_desc(&st->child[which[j]], 1);
        conv[j].xblk = conv[j].yblk = 0;
    }
    return n;
}

void gp_residual_fuse(gp_layer *l, bool on)
{
    res_state *st = l->state;
    GP_ASSERT(l->ops && l->ops->type == GP_LAYER_RESIDUAL && st);
    st->child[C_BN1].relu_after = on;
    st->fuse_add = on;
}

static void res_destroy(gp_layer *l)
{
    res_state *st = l->state;
    if (!st) return;
    for (int k = 0; k < C_COUNT; k++) gp_layer_destroy(&st->child[k]); /* views only */
    free(st);
    l->state = NULL;
}

/* Every child's parameter views, its output type (the block's tensors'
 * own: dt, x's, bf16 where the block runs on bf16 storage) and layouts: in
 * a chain (gp_layers_blocked) x and dx are in the block's in_blk, and every
 * map after the convolutions, y included, in its out_blk (the same where
 * the shortcut is x). */
static void sync_all(gp_layer *l, res_state *st, gp_dtype dt)
{
    for (int k = 0; k < C_COUNT; k++)
        if (st->child[k].ops) {
            sync_child(l, st, k);
            st->child[k].out_dtype = dt;
            st->child[k].in_blk = k == C_CONV1 || k == C_DCONV ? l->in_blk : l->out_blk;
            st->child[k].out_blk = l->out_blk;
        }
}

/* Child forward into a preallocated y; a batch norm's saved statistics move
 * into the block's slots [slot, slot + 1]. */
static gp_status child_fwd(res_state *st, int which, const gp_fwd_ctx *ctx, const gp_tensor *x,
                           gp_tensor *y, gp_saved *s, int slot)
{
    gp_layer *c = &st->child[which];
    gp_saved cs;
    memset(&cs, 0, sizeof cs);
    gp_status r = gp_layers_child_forward(c, ctx, x, y, &cs);
    if (slot >= 0) {
        s->t[slot] = cs.t[0];
        s->t[slot + 1] = cs.t[1];
        cs.t[0] = cs.t[1] = (gp_tensor){0};
    }
    gp_saved_free(&cs); /* nothing else: convs and relu save nothing */
    return r;
}

/* Child backward with a preallocated dx (NULL: weights only).  A batch
 * norm's statistics are lent from the block's slots. */
static gp_status child_bwd(res_state *st, int which, const gp_fwd_ctx *ctx, const gp_tensor *x,
                           const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx, gp_saved *s,
                           int slot)
{
    gp_layer *c = &st->child[which];
    gp_saved cs;
    memset(&cs, 0, sizeof cs);
    if (slot >= 0) {
        cs.t[0] = s->t[slot];
        cs.t[1] = s->t[slot + 1];
        cs.t[0].owned = cs.t[1].owned = false;
    }
    return gp_layers_child_backward(c, ctx, x, y, dy, dx, &cs);
}

static gp_status res_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                             gp_tensor *y, gp_saved *s)
{
    res_state *st = l->state;
    gp_device *dev = l->dev;
    const gp_dtype dt = x->dtype; /* y's too (res_takes_bf16) */
    sync_all(l, st, dt);
    gp_shape ms = gp_tensor_shape(y);
    int64_t n = gp_tensor_numel(y);
    gp_tensor dbn_out = {0};
    gp_status r = GP_OK;
#define RES_TRY(e) do { if ((r = (e)) != GP_OK) goto done; } while (0)
    RES_TRY(gp_layers_saved_alloc_as(s, S_A1, dev, &ms, dt));
    RES_TRY(gp_layers_saved_alloc_as(s, S_R1, dev, &ms, dt));
    RES_TRY(gp_layers_saved_alloc_as(s, S_A2, dev, &ms, dt));
    RES_TRY(child_fwd(st, C_CONV1, ctx, x, &s->t[S_A1], s, -1));
    RES_TRY(child_fwd(st, C_BN1, ctx, &s->t[S_A1], &s->t[S_R1], s, S_BN1));
    if (!st->child[C_BN1].relu_after) /* else bn1 applied it */
        RES_TRY(child_fwd(st, C_RELU, ctx, &s->t[S_R1], &s->t[S_R1], s, -1));
    RES_TRY(child_fwd(st, C_CONV2, ctx, &s->t[S_R1], &s->t[S_A2], s, -1));
    if (st->has_down) { /* the shortcut first: bn2 may add it (fuse_add) */
        RES_TRY(gp_layers_saved_alloc_as(s, S_AD, dev, &ms, dt));
        RES_TRY(gp_tensor_alloc_as(&dbn_out, dev, &ms, dt, GP_MEM_ACTIVATIONS));
        RES_TRY(child_fwd(st, C_DCONV, ctx, x, &s->t[S_AD], s, -1));
        RES_TRY(child_fwd(st, C_DBN, ctx, &s->t[S_AD], &dbn_out, s, S_DBN));
    }
    const gp_tensor *sc = st->has_down ? &dbn_out : x;
    /* on bf16 storage the norm adds a bf16 shortcut (gp_bn_desc.add16)
     * where it takes bf16 itself; else (a sync norm) the sum and relu run
     * as their own passes, each rounded once */
    gp_layer *bn2 = &st->child[C_BN2];
    bool fuse = st->fuse_add && n && (dt == GP_F32 || bn2->ops->takes_bf16(bn2));
    if (fuse) { /* y = relu(bn2(a2) + shortcut) in bn2's pass, rounded once */
        if (dt == GP_F32) bn2->fwd_add = gp_f32(sc);
        else bn2->fwd_add16 = gp_bf16(sc);
        r = child_fwd(st, C_BN2, ctx, &s->t[S_A2], y, s, S_BN2);
        bn2->fwd_add = NULL;
        bn2->fwd_add16 = NULL;
        RES_TRY(r);
    } else {
        RES_TRY(child_fwd(st, C_BN2, ctx, &s->t[S_A2], y, s, S_BN2));
        if (n && dt == GP_F32) RES_TRY(gp_dev_add(dev, gp_f32(y), gp_f32(sc), gp_f32(y), n));
        else if (n) RES_TRY(gp_layers_accumulate(dev, y, sc));
        RES_TRY(child_fwd(st, C_RELU, ctx, y, y, s, -1));
    }
done:
#undef RES_TRY
    gp_tensor_free(&dbn_out);
    if (r == GP_OK && !ctx->training) {
        gp_saved_free(s); /* eval: no backward will come */
        s->flags |= GP_SAVED_EVAL;
    }
    return r;
}

/* The whole backward; dx == NULL skips the work only dx needs. */
static gp_status res_backward_all(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                  gp_saved *s)
{
    res_state *st = l->state;
    gp_device *dev = l->dev;
    if (s->flags & GP_SAVED_EVAL)
        return gp_layer_spec_error(l, "backward after an eval-mode forward: the block saved "
                                      "nothing (run forward with training)");
    GP_ASSERT(gp_tensor_mem(&s->t[S_A1]) && gp_tensor_mem(&s->t[S_R1]) && gp_tensor_mem(&s->t[S_A2]));
    const gp_dtype dt = x->dtype;
    sync_all(l, st, dt);
    gp_shape ms = gp_tensor_shape(y);
    gp_shape xs = gp_tensor_shape(x);
    gp_tensor g = {0}, t1 = {0}, t2 = {0}, tx = {0};
    gp_status r = GP_OK;
#define RES_TRY(e) do { if ((r = (e)) != GP_OK) goto done; } while (0)
    /* g = d(sum before the final relu) */
    RES_TRY(gp_tensor_alloc_as(&g, dev, &ms, dt, GP_MEM_ACTIVATIONS));
    RES_TRY(gp_tensor_alloc_as(&t1, dev, &ms, dt, GP_MEM_ACTIVATIONS));
    RES_TRY(gp_tensor_alloc_as(&t2, dev, &ms, dt, GP_MEM_ACTIVATIONS));
    RES_TRY(child_bwd(st, C_RELU, ctx, y, y, dy, &g, s, -1));
    /* main path, from the top */
    RES_TRY(child_bwd(st, C_BN2, ctx, &s->t[S_A2], NULL, &g, &t1, s, S_BN2));     /* t1 = d a2 */
    RES_TRY(child_bwd(st, C_CONV2, ctx, &s->t[S_R1], NULL, &t1, &t2, s, -1));      /* t2 = d r1 */
    if (!st->child[C_BN1].relu_after) /* else bn1's backward masks with it */
        RES_TRY(child_bwd(st, C_RELU, ctx, &s->t[S_R1], &s->t[S_R1], &t2, &t2, s, -1)); /* d b1 */
    RES_TRY(child_bwd(st, C_BN1, ctx, &s->t[S_A1], NULL, &t2, &t1, s, S_BN1));     /* t1 = d a1 */
    RES_TRY(child_bwd(st, C_CONV1, ctx, x, NULL, &t1, dx, s, -1));                /* dx = ... */
    /* shortcut */
    if (st->has_down) {
        RES_TRY(child_bwd(st, C_DBN, ctx, &s->t[S_AD], NULL, &g, &t1, s, S_DBN));  /* t1 = d ad */
        if (dx) RES_TRY(gp_tensor_alloc_as(&tx, dev, &xs, dt, GP_MEM_ACTIVATIONS));
        RES_TRY(child_bwd(st, C_DCONV, ctx, x, NULL, &t1, dx ? &tx : NULL, s, -1));
        if (dx && gp_tensor_numel(dx)) RES_TRY(gp_layers_accumulate(dev, dx, &tx));
    } else if (dx && gp_tensor_numel(dx)) {
        RES_TRY(gp_layers_accumulate(dev, dx, &g));
    }
done:
#undef RES_TRY
    gp_tensor_free(&g);
    gp_tensor_free(&t1);
    gp_tensor_free(&t2);
    gp_tensor_free(&tx);
    return r;
}

static gp_status res_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                   gp_saved *s)
{
    GP_TRY(res_backward_all(l, ctx, x, y, dy, dx, s));
    s->flags |= GP_SAVED_WEIGHTS_DONE;
    return GP_OK;
}

static gp_status res_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                      const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    if (gp_saved_take_weights_done(s)) return GP_OK;
    return res_backward_all(l, ctx, x, y, dy, NULL, s);
}

static gp_status res_commit(gp_layer *l)
{
    res_state *st = l->state;
    static const int norms[3] = {C_BN1, C_BN2, C_DBN};
    for (int k = 0; k < 3; k++) {
        gp_layer *c = &st->child[norms[k]];
        if (!c->ops) continue;
        sync_child(l, st, norms[k]);
        GP_TRY(c->ops->commit(c));
    }
    return GP_OK;
}

static void res_discard(gp_layer *l)
{
    res_state *st = l->state;
    static const int norms[3] = {C_BN1, C_BN2, C_DBN};
    for (int k = 0; k < 3; k++)
        if (st->child[norms[k]].ops) gp_layers_discard(&st->child[norms[k]], 1);
}

/* Data parallelism: the inner norms merge their pending statistics with the
 * other replicas' (in the same fixed order on every replica). */
static gp_status res_allreduce_stats(gp_layer *l, gp_comm *comm)
{
    res_state *st = l->state;
    static const int norms[3] = {C_BN1, C_BN2, C_DBN};
    for (int k = 0; k < 3; k++) {
        gp_layer *c = &st->child[norms[k]];
        if (!c->ops || !c->ops->allreduce_stats) continue;
        sync_child(l, st, norms[k]);
        GP_TRY(c->ops->allreduce_stats(c, comm));
    }
    return GP_OK;
}

static double res_flops(const gp_layer *l, int64_t n)
{
    double outs = (double)n * (double)gp_shape_numel(&l->out_shape); /* N K OH OW */
    double c = (double)l->in_shape.dims[1], k = (double)l->spec.out;
    double f = 2.0 * outs * c * 9.0 + 2.0 * outs * k * 9.0; /* conv1, conv2 */
    f += 2.0 * 4.0 * outs + 3.0 * outs;                     /* bn1, bn2; relu x2, add */
    if (needs_down(l, &l->in_shape)) f += 2.0 * outs * c + 4.0 * outs;
    return f;
}

static size_t res_saved_bytes(const gp_layer *l, int64_t n)
{
    bool down = needs_down(l, &l->in_shape);
    size_t act = (size_t)n * (size_t)gp_shape_numel(&l->out_shape) * gp_dtype_size(l->out_dtype);
    size_t stats = 2 * (size_t)l->spec.out * sizeof(float);
    return (down ? 4 : 3) * act + (down ? 3 : 2) * stats;
}

static int res_counters(gp_layer *l, const char **names, int64_t **values, int max)
{
    static const char *const counter_names[] = {"bn1.num_batches_tracked",
                                                 "bn2.num_batches_tracked",
                                                 "downsample.1.num_batches_tracked"};
    static const int which[] = {C_BN1, C_BN2, C_DBN};
    res_state *st = l->state;
    int n = 0;
    for (int k = 0; k < 3; k++) {
        if (which[k] == C_DBN && !st->has_down) continue;
        if (n < max) {
            names[n] = counter_names[k];
            values[n] = gp_batchnorm_counter(&st->child[which[k]]);
        }
        n++;
    }
    return n;
}

/* On bf16 storage the block keeps its inner maps in bf16 too: each child
 * takes bf16 where its device has the kernels and runs through the
 * storage adapter where not (gp_layers_child_forward), so every map the
 * block keeps, and each gradient between its children, is rounded once
 * as the stand-alone layers' would be.  (Not the adapter's bits around
 * the whole block, which kept the inner maps in FP32: autocast's contract
 * on the children as layers.) */
static bool res_takes_bf16(const gp_layer *l) { return true; }

const gp_layer_ops gp_residual_ops = {
    .type = GP_LAYER_RESIDUAL,
    .takes_bf16 = res_takes_bf16,
    .counters = res_counters,
    .infer = res_infer,
    .init = res_init,
    .forward = res_forward,
    .backward_data = res_backward_data,
    .backward_weights = res_backward_weights,
    .commit = res_commit,
    .discard = res_discard,
    .allreduce_stats = res_allreduce_stats,
    .flops = res_flops,
    .saved_bytes = res_saved_bytes,
    .destroy = res_destroy,
};
