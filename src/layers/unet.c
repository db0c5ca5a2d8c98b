/*
 * unet.c — the parameter-free layers of torchgpipe's U-Net
 * (benchmarks/models/unet): leaky_relu, dropout2d, instance_norm, upsample.
 *
 * leaky_relu (nn.LeakyReLU(slope)): y = x > 0 ? x : slope x, slope >= 0.
 *   Backward uses y, like relu (y > 0 exactly where x > 0), so nothing is
 *   saved.
 * dropout2d (nn.Dropout2d(p)): one Bernoulli draw per (sample, channel),
 *   kept planes scaled by 1 / (1 - p), so a whole H x W plane is kept or
 *   dropped.  The mask comes from the counter-based RNG keyed by (seed,
 *   stream(step, layer index, "dr2d")) and indexed by the (sample, channel)
 *   pair's position in the whole mini-batch, sample_offset * C + c, so every
 *   micro-batch split and every recompute draws the same mask (as dropout
 *   does, simple.c, with its own tag so the two never share bits).
 *   gp_saved t[0] = the scaled mask (N, C).  Eval (or p = 0) is the
 *   identity and saves nothing.
 * instance_norm (nn.InstanceNorm2d(C), affine=False,
 *   track_running_stats=False): each (sample, channel) plane normalised over
 *   its own H*W values with the biased variance, in training and eval alike.
 *   That is batch norm in training mode of the same memory viewed as
 *   (1, N*C, H*W) without gamma and beta, so it runs on the backend's
 *   bn_fwd_train / bn_bwd (gp_bn_desc {n = 1, c = N*C, s = H*W}).
 *   gp_saved t[0] = mean (N*C), t[1] = biased variance (N*C).  No parameters
 *   and no running statistics, so nothing to commit.  Followed in the model
 *   by a leaky_relu of slope > 0 (spec.leaky_after, gp_layer_specs_link:
 *   torchgpipe's U-Net unit, conv -> dropout2d -> instance_norm ->
 *   leaky_relu), its backward reads its output y, or the relu's output z
 *   that overwrote y in place (leaky_inplace), and recovers y from z
 *   (gp_ew_leaky_relu_inv) as InPlace-ABN does, never reading its input:
 *   dx = inv (dy - mean(dy) - y mean(dy y)).  So a recompute keeps one
 *   tensor per unit (z) where it kept two (the convolution's output, which
 *   the dropout overwrites in place, and z), and the bits do not depend on
 *   whether a stage boundary falls between the norm and the relu (from y
 *   the relu's rounding is applied and undone the same way).  Recovering
 *   y from z costs up to an ulp where y < 0, as it does InPlace-ABN.
 * upsample (nn.Upsample(scale_factor=scale), nearest): (N, C, H, W) ->
 *   (N, C, H*scale, W*scale), y[n, c, i, j] = x[n, c, i / scale, j / scale];
 *   backward sums each scale x scale block of dy.  Nothing saved.
 */
#include "layers/layers_impl.h"

#include <math.h>

/* ---- shared -------------------------------------------------------------- */

static gp_status no_init(gp_layer *l, uint64_t seed) { return GP_OK; }

static gp_status need_4d(const gp_layer *l, const gp_shape *in, const char *why)
{
    char b[96];
    if (in->ndim != 4)
        return gp_layer_spec_error(l, "expected 4-D input (N, C, H, W) but got %s; %s",
                                   gp_layers_shape_n(in, b, sizeof b), why);
    return GP_OK;
}

static double numel_flops(const gp_layer *l, int64_t n)
{
    return (double)n * (double)gp_shape_numel(&l->out_shape);
}

/* ---- leaky_relu ------------------------------------------------------------ */

static gp_status leaky_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    /* !(>=) also refuses NaN */
    if (!(l->spec.slope >= 0.0f) || isinf(l->spec.slope))
        return gp_layer_spec_error(l, "slope = %g must be a finite number >= 0 (default 0.01)",
                                   (double)l->spec.slope);
    *out = *in;
    return GP_OK;
}

static gp_status leaky_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                               gp_tensor *y, gp_saved *s)
{
    if (x->dtype == GP_BF16) /* bf16 storage, in one pass (takes_bf16) */
        return gp_dev_act_bf16(l->dev, GP_ACT_LEAKY_RELU, gp_bf16(x), NULL, gp_bf16(y),
                               gp_tensor_numel(x), l->spec.slope);
    return gp_dev_leaky_relu_fwd(l->dev, gp_f32(x), gp_f32(y), gp_tensor_numel(x), l->spec.slope);
}

static gp_status leaky_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                     const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                     gp_saved *s)
{
    if (y->dtype == GP_BF16)
        return gp_dev_act_bf16(l->dev, GP_ACT_LEAKY_RELU, gp_bf16(y), gp_bf16(dy), gp_bf16(dx),
                               gp_tensor_numel(x), l->spec.slope);
    return gp_dev_leaky_relu_bwd(l->dev, gp_f32(y), gp_f32(dy), gp_f32(dx), gp_tensor_numel(x),
                                 l->spec.slope);
}

static bool leaky_takes_bf16(const gp_layer *l)
{
    return gp_dev_act_bf16_has(l->dev, GP_ACT_LEAKY_RELU);
}

const gp_layer_ops gp_leaky_relu_ops = {
    .type = GP_LAYER_LEAKY_RELU,
    .infer = leaky_infer,
    .init = no_init,
    .forward = leaky_forward,
    .backward_data = leaky_backward_data,
    .flops = numel_flops,
    .inplace = GP_INPLACE_VALUES,
    .bwd_ignores_x = true,
    .takes_bf16 = leaky_takes_bf16,
};

/* ---- dropout2d ------------------------------------------------------------- */

static gp_status dropout2d_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    if (!(l->spec.p >= 0.0f && l->spec.p < 1.0f))
        return gp_layer_spec_error(l, "p = %g must be a probability in [0, 1) (default 0.5)",
                                   (double)l->spec.p);
    GP_TRY(need_4d(l, in, "dropout2d drops whole channels of images; use dropout for "
                          "features"));
    *out = *in;
    return GP_OK;
}

static gp_status dropout2d_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   gp_tensor *y, gp_saved *s)
{
    gp_device *dev = l->dev;
    if (!ctx->training || l->spec.p == 0.0f) return gp_layers_copy(dev, gp_tensor_mem(y), x);
    const int64_t N = x->dims[0], C = x->dims[1], plane = x->dims[2] * x->dims[3];
    if (N * C * plane == 0) return GP_OK;
    gp_shape ms = gp_shape_2d(N, C);
    GP_TRY(gp_layers_saved_alloc(s, 0, dev, &ms));
    uint64_t stream = gp_rng_stream(ctx->step, (uint64_t)l->index, GP_RNG_TAG_DROPOUT2D);
    GP_TRY(gp_dev_dropout_mask(dev, gp_f32(&s->t[0]), N * C, l->spec.p, ctx->seed, stream,
                               (uint64_t)(ctx->sample_offset * C)));
    if (x->dtype == GP_BF16) /* bf16 storage, in one pass (takes_bf16) */
        return gp_dev_mul_rows_bf16(dev, gp_bf16(x), gp_f32(&s->t[0]), gp_bf16(y), N * C, plane);
    return gp_dev_mul_rows(dev, gp_f32(x), gp_f32(&s->t[0]), gp_f32(y), N * C, plane);
}

static gp_status dropout2d_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                         const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                         gp_saved *s)
{
    if (!gp_tensor_mem(&s->t[0])) return gp_layers_copy(l->dev, gp_tensor_mem(dx), dy); /* identity forward */
    const int64_t N = x->dims[0], C = x->dims[1], plane = x->dims[2] * x->dims[3];
    if (dy->dtype == GP_BF16)
        return gp_dev_mul_rows_bf16(l->dev, gp_bf16(dy), gp_f32(&s->t[0]), gp_bf16(dx), N * C,
                                    plane);
    return gp_dev_mul_rows(l->dev, gp_f32(dy), gp_f32(&s->t[0]), gp_f32(dx), N * C, plane);
}

static bool dropout2d_takes_bf16(const gp_layer *l) { return l->dev->iface->mul_rows_bf16; }

static size_t dropout2d_saved_bytes(const gp_layer *l, int64_t n)
{
    if (l->spec.p == 0.0f) return 0;
    return (size_t)n * (size_t)l->in_shape.dims[1] * sizeof(float);
}

const gp_layer_ops gp_dropout2d_ops = {
    .type = GP_LAYER_DROPOUT2D,
    .infer = dropout2d_infer,
    .init = no_init,
    .forward = dropout2d_forward,
    .backward_data = dropout2d_backward_data,
    .flops = numel_flops,
    .saved_bytes = dropout2d_saved_bytes,
    .inplace = GP_INPLACE_VALUES,
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
    .takes_bf16 = dropout2d_takes_bf16,
};

/* ---- instance_norm --------------------------------------------------------- */

static gp_status instance_norm_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    if (!(l->spec.eps > 0.0f) || isinf(l->spec.eps))
        return gp_layer_spec_error(l, "eps = %g must be a finite number > 0 (default 1e-5)",
                                   (double)l->spec.eps);
    GP_TRY(need_4d(l, in, "instance_norm normalises each channel of an image over H*W"));
    if (in->dims[2] * in->dims[3] < 2)
        return gp_layer_spec_error(l,
                                   "input %s has one value per channel, which instance norm "
                                   "would make 0; it needs H*W > 1 (as PyTorch's "
                                   "InstanceNorm2d in training): move it before the pooling "
                                   "that shrinks the image to 1x1",
                                   gp_layers_shape_n(in, b, sizeof b));
    *out = *in;
    return GP_OK;
}

/* (N, C, H, W) as one batch-norm "sample" of N*C channels. */
static gp_bn_desc instance_desc(const gp_layer *l, int64_t n)
{
    gp_bn_desc d = {1, n * l->in_shape.dims[1], l->in_shape.dims[2] * l->in_shape.dims[3],
                    l->spec.eps, 0, false, NULL, NULL};
    return d;
}

static gp_status instance_norm_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                       gp_tensor *y, gp_saved *s)
{
    gp_device *dev = l->dev;
    int64_t n = x->dims[0];
    if (n == 0) return GP_OK;
    gp_bn_desc d = instance_desc(l, n);
    gp_shape st = gp_shape_2d(n, l->in_shape.dims[1]);
    GP_TRY(gp_layers_saved_alloc(s, 0, dev, &st));
    GP_TRY(gp_layers_saved_alloc(s, 1, dev, &st));
    /* gamma, beta NULL: 1 and 0 (backend.h) */
    if (x->dtype == GP_BF16) /* bf16 storage, without the adapter (takes_bf16) */
        return gp_dev_bn_fwd_train_bf16(dev, &d, gp_bf16(x), NULL, NULL, gp_bf16(y),
                                        gp_f32(&s->t[0]), gp_f32(&s->t[1]));
    return gp_dev_bn_fwd_train(dev, &d, gp_f32(x), NULL, NULL, gp_f32(y), gp_f32(&s->t[0]),
                               gp_f32(&s->t[1]));
}

static gp_status instance_norm_backward_data(gp_layer *l, const gp_fwd_ctx *ctx,
                                             const gp_tensor *x, const gp_tensor *y,
                                             const gp_tensor *dy, gp_tensor *dx, gp_saved *s)
{
    int64_t n = x->dims[0];
    if (n == 0) return GP_OK;
    gp_bn_desc d = instance_desc(l, n);
    const bool b16 = dy->dtype == GP_BF16; /* bf16 storage (instance_norm_takes_bf16) */
    if (l->spec.leaky_after > 0.0f) { /* x is not kept: from y, or the relu's z over it */
        if (b16)
            return gp_dev_norm_leaky_bwd_bf16(l->dev, &d, gp_bf16(y), l->leaky_inplace,
                                              l->spec.leaky_after, gp_f32(&s->t[1]),
                                              gp_bf16(dy), gp_bf16(dx));
        return gp_dev_norm_leaky_bwd(l->dev, &d, gp_f32(y), l->leaky_inplace,
                                     l->spec.leaky_after, gp_f32(&s->t[1]), gp_f32(dy), gp_f32(dx));
    }
    if (b16)
        return gp_dev_bn_bwd_bf16(l->dev, &d, gp_bf16(x), NULL, NULL, gp_f32(&s->t[0]),
                                  gp_f32(&s->t[1]), gp_bf16(dy), gp_bf16(dx), NULL, NULL);
    return gp_dev_bn_bwd(l->dev, &d, gp_f32(x), NULL, NULL, gp_f32(&s->t[0]), gp_f32(&s->t[1]), gp_f32(dy),
                         gp_f32(dx), NULL, NULL);
}

/* On bf16 storage through batch norm's bf16 slots (gamma 1, beta 0) and,
 * linked to the leaky relu after it, norm_leaky_bwd_bf16, whose y' rounds
 * the relu's output as the relu stores it: the same bits whether the relu
 * ran in place over the norm's output or in the next stage. */
static bool instance_norm_takes_bf16(const gp_layer *l)
{
    return gp_dev_bn_bf16_has(l->dev) &&
           (l->spec.leaky_after <= 0.0f || l->dev->iface->norm_leaky_bwd_bf16);
}

static double instance_norm_flops(const gp_layer *l, int64_t n)
{
    /* statistics (2 per element) and the normalisation (2 per element) */
    return 4.0 * (double)n * (double)gp_shape_numel(&l->out_shape);
}

static size_t instance_norm_saved_bytes(const gp_layer *l, int64_t n)
{
    return 2 * (size_t)n * (size_t)l->in_shape.dims[1] * sizeof(float);
}

const gp_layer_ops gp_instance_norm_ops = {
    .type = GP_LAYER_INSTANCE_NORM,
    .infer = instance_norm_infer,
    .init = no_init,
    .forward = instance_norm_forward,
    .backward_data = instance_norm_backward_data,
    .takes_bf16 = instance_norm_takes_bf16,
    .flops = instance_norm_flops,
    .saved_bytes = instance_norm_saved_bytes,
    .bwd_ignores_y = true,
};

/* ---- upsample ---------------------------------------------------------------- */

/* Output sides above this are refused (an int64 overflow long before). */
#define UPSAMPLE_MAX_SIDE ((int64_t)1 << 24)

static gp_status upsample_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    int64_t sc = l->spec.scale;
    if (sc < 1)
        return gp_layer_spec_error(l, "scale = %lld must be an integer >= 1 (default 2)",
                                   (long long)sc);
    GP_TRY(need_4d(l, in, "upsample enlarges images; it cannot follow flatten or linear"));
    if (in->dims[2] > UPSAMPLE_MAX_SIDE / sc || in->dims[3] > UPSAMPLE_MAX_SIDE / sc)
        return gp_layer_spec_error(l, "scale %lld makes the input %s larger than %lld per side",
                                   (long long)sc, gp_layers_shape_n(in, b, sizeof b),
                                   (long long)UPSAMPLE_MAX_SIDE);
    *out = gp_shape_4d(in->dims[0], in->dims[1], in->dims[2] * sc, in->dims[3] * sc);
    return GP_OK;
}

static gp_status upsample_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  gp_tensor *y, gp_saved *s)
{
    if (x->dtype == GP_BF16) /* bf16 storage, bits copied (takes_bf16) */
        return gp_dev_upsample_fwd_bf16(l->dev, gp_bf16(x), gp_bf16(y), x->dims[0], x->dims[1],
                                        x->dims[2], x->dims[3], l->spec.scale);
    return gp_dev_upsample_fwd(l->dev, gp_f32(x), gp_f32(y), x->dims[0], x->dims[1], x->dims[2],
                               x->dims[3], l->spec.scale);
}

static gp_status upsample_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                        const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                        gp_saved *s)
{
    if (dy->dtype == GP_BF16)
        return gp_dev_upsample_bwd_bf16(l->dev, gp_bf16(dy), gp_bf16(dx), x->dims[0], x->dims[1],
                                        x->dims[2], x->dims[3], l->spec.scale);
    return gp_dev_upsample_bwd(l->dev, gp_f32(dy), gp_f32(dx), x->dims[0], x->dims[1], x->dims[2],
                               x->dims[3], l->spec.scale);
}

static bool upsample_takes_bf16(const gp_layer *l)
{
    return l->dev->iface->upsample_fwd_bf16 && l->dev->iface->upsample_bwd_bf16;
}

const gp_layer_ops gp_upsample_ops = {
    .type = GP_LAYER_UPSAMPLE,
    .infer = upsample_infer,
    .init = no_init,
    .forward = upsample_forward,
    .backward_data = upsample_backward_data,
    .takes_bf16 = upsample_takes_bf16,
    .flops = numel_flops, /* a copy (backward: an add) per output element */
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
};
