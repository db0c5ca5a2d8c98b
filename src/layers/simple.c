/*
 * simple.c — layers without parameters that act element by element or only
 * on the shape: relu, flatten, dropout.
 *
 * gelu: GPT-2's tanh form (gp_ew_gelu), any shape.  Its derivative is not
 *   a function of y (gelu is not monotonic), so backward reads x, which
 *   its caller keeps: nothing saved, and never in place.
 * relu: backward uses y (relu's output), so nothing is saved.  After a
 *   batch norm that does its work (gp_layers_relu_fused), in place, the
 *   forward does nothing (the norm's applies the relu), and the stage's
 *   backward loop hands the gradient past it (the norm's backward masks
 *   it: gp_bn_desc.relu; checkpoint.c).
 * flatten: (N, C, H, W) -> (N, C*H*W).  The data is already in that order,
 *   so inside a stage it runs in place (gp_layers_inplace: the stage's
 *   loops hand the input's memory on to the output); called on its own, or
 *   as a stage's first layer, y is a copy.  dx is a copy of dy, which its
 *   caller frees as soon as backward returns.
 * dropout: mask from the counter-based RNG keyed by (seed, stream(step,
 *   layer index, "drop")) and indexed by the element's position in the whole
 *   mini-batch (sample_offset * per-sample elements), so every micro-batch
 *   split and every recompute draws the same mask, and so does the
 *   backward: it draws the mask again (gp_dev_dropout_apply on dy) instead
 *   of keeping it, so the layer saves nothing (until 2026-11-24 it kept
 *   the scaled mask, as many bytes as its input).  Eval (or p = 0) is the
 *   identity.
 */
#include "layers/layers_impl.h"

/* ---- relu ---------------------------------------------------------------- */

static gp_status same_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    *out = *in;
    return GP_OK;
}

static gp_status no_init(gp_layer *l, uint64_t seed) { return GP_OK; }

static gp_status relu_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              gp_tensor *y, gp_saved *s)
{
    int64_t n = gp_tensor_numel(x);
    if (n == 0) return GP_OK;
    if (l->relu_done && gp_tensor_mem(x) == gp_tensor_mem(y)) { /* the batch norm before did it */
        l->relu_skipped++;
        return GP_OK;
    }
    if (x->dtype == GP_BF16) /* bf16 storage, in one pass (takes_bf16) */
        return gp_dev_act_bf16(l->dev, GP_ACT_RELU, gp_bf16(x), NULL, gp_bf16(y), n, 0.0f);
    return gp_dev_relu_fwd(l->dev, gp_f32(x), gp_f32(y), n);
}

static gp_status relu_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                    gp_saved *s)
{
    int64_t n = gp_tensor_numel(x);
    if (n == 0) return GP_OK;
    if (y->dtype == GP_BF16)
        return gp_dev_act_bf16(l->dev, GP_ACT_RELU, gp_bf16(y), gp_bf16(dy), gp_bf16(dx), n,
                               0.0f);
    return gp_dev_relu_bwd(l->dev, gp_f32(y), gp_f32(dy), gp_f32(dx), n);
}

static bool relu_takes_bf16(const gp_layer *l) { return gp_dev_act_bf16_has(l->dev, GP_ACT_RELU); }

static double numel_flops(const gp_layer *l, int64_t n)
{
    return (double)n * (double)gp_shape_numel(&l->out_shape);
}

const gp_layer_ops gp_relu_ops = {
    .type = GP_LAYER_RELU,
    .infer = same_infer,
    .init = no_init,
    .forward = relu_forward,
    .backward_data = relu_backward_data,
    .flops = numel_flops,
    .inplace = GP_INPLACE_VALUES,
    .bwd_ignores_x = true,
    .takes_bf16 = relu_takes_bf16,
};

/* ---- gelu ---------------------------------------------------------------- */

static gp_status gelu_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              gp_tensor *y, gp_saved *s)
{
    if (x->dtype == GP_BF16) /* bf16 storage, in one pass (takes_bf16) */
        return gp_dev_act_bf16(l->dev, GP_ACT_GELU, gp_bf16(x), NULL, gp_bf16(y),
                               gp_tensor_numel(x), 0.0f);
    return gp_dev_gelu_fwd(l->dev, gp_f32(x), gp_f32(y), gp_tensor_numel(x));
}

static gp_status gelu_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                    gp_saved *s)
{
    if (x->dtype == GP_BF16)
        return gp_dev_act_bf16(l->dev, GP_ACT_GELU, gp_bf16(x), gp_bf16(dy), gp_bf16(dx),
                               gp_tensor_numel(x), 0.0f);
    return gp_dev_gelu_bwd(l->dev, gp_f32(x), gp_f32(dy), gp_f32(dx), gp_tensor_numel(x));
}

static bool gelu_takes_bf16(const gp_layer *l) { return gp_dev_act_bf16_has(l->dev, GP_ACT_GELU); }

/* tanh counted as one operation: about 8 per element */
static double gelu_flops(const gp_layer *l, int64_t n)
{
    return 8.0 * (double)n * (double)gp_shape_numel(&l->out_shape);
}

const gp_layer_ops gp_gelu_ops = {
    .type = GP_LAYER_GELU,
    .infer = same_infer,
    .init = no_init,
    .forward = gelu_forward,
    .backward_data = gelu_backward_data,
    .flops = gelu_flops,
    .bwd_ignores_y = true,
    .takes_bf16 = gelu_takes_bf16,
};

/* ---- flatten ------------------------------------------------------------- */

static gp_status flatten_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    int64_t f = 1;
    for (int i = 1; i < in->ndim; i++) f *= in->dims[i];
    *out = gp_shape_2d(in->dims[0], f);
    return GP_OK;
}

static gp_status flatten_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                 gp_tensor *y, gp_saved *s)
{
    return gp_layers_copy(l->dev, gp_tensor_mem(y), x);
}

static gp_status flatten_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                       const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                       gp_saved *s)
{
    return gp_layers_copy(l->dev, gp_tensor_mem(dx), dy);
}

static double zero_flops(const gp_layer *l, int64_t n) { return 0.0; }

const gp_layer_ops gp_flatten_ops = {
    .type = GP_LAYER_FLATTEN,
    .infer = flatten_infer,
    .init = no_init,
    .forward = flatten_forward,
    .backward_data = flatten_backward_data,
    .flops = zero_flops,
    .inplace = GP_INPLACE_VIEW,
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
    .dx_is_dy = true,
    .any_dtype = true,
};

/* ---- dropout ------------------------------------------------------------- */

static gp_status dropout_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    if (!(l->spec.p >= 0.0f && l->spec.p <= 1.0f))
        return gp_layer_spec_error(l, "p = %g must be a probability in [0, 1] (default 0.5)",
                                   (double)l->spec.p);
    *out = *in;
    return GP_OK;
}

/* out = in * the mask of this micro-batch (forward: in = x; backward: dy) */
static gp_status dropout_masked(const gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *in,
                                gp_tensor *out)
{
    int64_t per_sample = gp_shape_numel(&l->in_shape);
    uint64_t stream = gp_rng_stream(ctx->step, (uint64_t)l->index, GP_RNG_TAG_DROPOUT);
    uint64_t first = (uint64_t)(ctx->sample_offset * per_sample);
    if (in->dtype == GP_BF16) /* bf16 storage, in one pass (takes_bf16) */
        return gp_dev_dropout_apply_bf16(l->dev, gp_bf16(in), gp_bf16(out), gp_tensor_numel(in),
                                         l->spec.p, ctx->seed, stream, first);
    return gp_dev_dropout_apply(l->dev, gp_f32(in), gp_f32(out), gp_tensor_numel(in), l->spec.p,
                                ctx->seed, stream, first);
}

static bool dropout_takes_bf16(const gp_layer *l) { return l->dev->iface->dropout_apply_bf16; }

static gp_status dropout_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                 gp_tensor *y, gp_saved *s)
{
    if (!ctx->training || l->spec.p == 0.0f) return gp_layers_copy(l->dev, gp_tensor_mem(y), x);
    return dropout_masked(l, ctx, x, y);
}

static gp_status dropout_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                       const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                       gp_saved *s)
{
    if (!ctx->training || l->spec.p == 0.0f) /* identity forward */
        return gp_layers_copy(l->dev, gp_tensor_mem(dx), dy);
    return dropout_masked(l, ctx, dy, dx);
}

static size_t dropout_saved_bytes(const gp_layer *l, int64_t n) { return 0; }

const gp_layer_ops gp_dropout_ops = {
    .type = GP_LAYER_DROPOUT,
    .infer = dropout_infer,
    .init = no_init,
    .forward = dropout_forward,
    .backward_data = dropout_backward_data,
    .flops = numel_flops,
    .saved_bytes = dropout_saved_bytes,
    .takes_bf16 = dropout_takes_bf16,
    .inplace = GP_INPLACE_VALUES,
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
};
