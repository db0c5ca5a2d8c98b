/*
 * conv2d.c — 2-D convolution, cross-correlation as in PyTorch.
 *
 * Parameters: weight (K, C, KH, KW), bias (K) when spec.bias.  Kernel,
 * stride and padding per axis from the spec (AmoebaNet's 1x7 / 7x1).
 * Input (N, C, H, W), output (N, K, OH, OW) with OH = (H + 2 PH - KH) / SH
 * + 1 and OW likewise.  Saves nothing: backward needs x (kept by the
 * caller) and the weights.  The composite layers (residual, add's
 * projection, factorized_reduce) use this layer as their convolutions.
 *
 * Init: PyTorch's default, weight and bias uniform(+-1/sqrt(C KH KW)); or
 * with spec.init = kaiming_normal_fan_out (torchvision's ResNet) the weight
 * normal(0, sqrt(2 / (K KH KW))).  Both are drawn on the host from the
 * stream keyed by (seed, layer index, parameter), so they do not depend on
 * the device.
 */
#include "layers/layers_impl.h"

#include <math.h>

gp_conv_desc gp_conv2d_desc(const gp_layer *l, int64_t n)
{
    gp_conv_desc d = {0};
    d.n = n;
    d.c = l->in_shape.dims[1];
    d.h = l->in_shape.dims[2];
    d.w = l->in_shape.dims[3];
    d.k = l->out_shape.dims[1];
    d.kh = l->spec.kernel.h;
    d.kw = l->spec.kernel.w;
    d.sh = l->spec.stride.h;
    d.sw = l->spec.stride.w;
    d.ph = l->spec.padding.h;
    d.pw = l->spec.padding.w;
    d.oh = l->out_shape.dims[2];
    d.ow = l->out_shape.dims[3];
    d.has_bias = l->spec.bias ? 1 : 0;
    d.xblk = l->in_blk; /* gp_layers_blocked */
    d.yblk = l->out_blk;
    return d;
}

static gp_status conv_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96], k[48], p[48], st[48];
    const gp_layer_spec *sp = &l->spec;
    if (in->ndim != 4)
        return gp_layer_spec_error(l,
                                   "expected 4-D input (N, C, H, W) but got %s; a convolution "
                                   "cannot follow flatten or linear layers, move it before them",
                                   gp_layers_shape_n(in, b, sizeof b));
    if (sp->out <= 0)
        return gp_layer_spec_error(l, "out (the number of output channels) is missing; write "
                                      "e.g. {conv2d: {out: 16, kernel: 3}}");
    if (sp->kernel.h <= 0 || sp->kernel.w <= 0)
        return gp_layer_spec_error(l, "kernel is missing or not positive (got %s); write "
                                   "e.g. kernel: 3 or kernel: [1, 7]",
                                   gp_hw_str(sp->kernel, k, sizeof k));
    if (sp->stride.h <= 0 || sp->stride.w <= 0)
        return gp_layer_spec_error(l, "stride = %s must be at least 1",
                                   gp_hw_str(sp->stride, st, sizeof st));
    if (sp->padding.h < 0 || sp->padding.w < 0)
        return gp_layer_spec_error(l, "padding = %s must not be negative",
                                   gp_hw_str(sp->padding, p, sizeof p));
    if ((int)sp->init < 0 || sp->init >= GP_INIT_COUNT)
        return gp_layer_spec_error(l, "unknown init %d", (int)sp->init);
    if (sp->in > 0 && sp->in != in->dims[1])
        return gp_layer_spec_error(l,
                                   "in = %lld but the input has %lld channels %s; remove 'in' "
                                   "(it is inferred) or fix the layers before it",
                                   (long long)sp->in, (long long)in->dims[1],
                                   gp_layers_shape_n(in, b, sizeof b));
    int64_t h = in->dims[2], w = in->dims[3];
    int64_t ph = h + 2 * sp->padding.h, pw = w + 2 * sp->padding.w;
    if (ph < sp->kernel.h || pw < sp->kernel.w)
        return gp_layer_spec_error(l,
                                   "kernel %s is larger than the padded input %lldx%lld "
                                   "(input %s with padding %s); use a smaller kernel, more "
                                   "padding, or less downsampling before this layer",
                                   gp_hw_str(sp->kernel, k, sizeof k), (long long)ph,
                                   (long long)pw, gp_layers_shape_n(in, b, sizeof b),
                                   gp_hw_str(sp->padding, p, sizeof p));
    gp_hw o = gp_layers_out_hw(h, w, sp->kernel, sp->stride, sp->padding);
    *out = gp_shape_4d(in->dims[0], sp->out, o.h, o.w);
    return GP_OK;
}

static gp_status conv_init(gp_layer *l, uint64_t seed)
{
    int64_t c = l->in_shape.dims[1], k = l->spec.out;
    int64_t kh = l->spec.kernel.h, kw = l->spec.kernel.w;
    gp_shape ws = gp_shape_4d(k, c, kh, kw);
    float bound = 1.0f / sqrtf((float)(c * kh * kw)); /* kaiming_uniform(a = sqrt(5)) */
    GP_TRY(gp_layers_add_param(l, "weight", &ws, false, false));
    if (l->spec.init == GP_INIT_KAIMING_NORMAL_FAN_OUT) /* gain sqrt(2) over fan_out */
        GP_TRY(gp_layers_init_normal(l, 0, seed, (float)sqrt(2.0 / (double)(k * kh * kw))));
    else if (l->spec.init == GP_INIT_NORMAL)
        GP_TRY(gp_layers_init_normal(l, 0, seed, l->spec.std));
    else
        GP_TRY(gp_layers_init_uniform(l, 0, seed, bound));
    if (l->spec.bias) {
        gp_shape bs = {1, {k, 0, 0, 0}};
        GP_TRY(gp_layers_add_param(l, "bias", &bs, false, true));
        if (l->spec.init == GP_INIT_NORMAL) GP_TRY(gp_layers_fill_param(l, 1, 0.0f));
        else GP_TRY(gp_layers_init_uniform(l, 1, seed, bound));
    }
    return GP_OK;
}

static gp_status conv_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              gp_tensor *y, gp_saved *s)
{
    if (x->dims[0] == 0) return GP_OK;
    gp_conv_desc d = gp_conv2d_desc(l, x->dims[0]);
    const float *w = gp_f32(&l->params[0].value);
    const float *b = l->spec.bias ? gp_f32(&l->params[1].value) : NULL;
    if (x->dtype == GP_BF16) /* bf16 storage, without the adapter (takes_bf16) */
        return gp_dev_conv_fwd_bf16(l->dev, &d, gp_bf16(x), w, b, gp_bf16(y));
    return gp_dev_conv_fwd(l->dev, &d, gp_f32(x), w, b, gp_f32(y));
}

static gp_status conv_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                    gp_saved *s)
{
    if (x->dims[0] == 0) return GP_OK;
    gp_conv_desc d = gp_conv2d_desc(l, x->dims[0]);
    const float *w = gp_f32(&l->params[0].value);
    if (dy->dtype == GP_BF16)
        return gp_dev_conv_bwd_data_bf16(l->dev, &d, w, gp_bf16(dy), gp_bf16(dx));
    return gp_dev_conv_bwd_data(l->dev, &d, w, gp_f32(dy), gp_f32(dx));
}

static gp_status conv_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                       const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    if (x->dims[0] == 0) return GP_OK;
    gp_conv_desc d = gp_conv2d_desc(l, x->dims[0]);
    float *dw = gp_f32(&l->params[0].grad);
    float *db = l->spec.bias ? gp_f32(&l->params[1].grad) : NULL;
    if (x->dtype == GP_BF16)
        return gp_dev_conv_bwd_weights_bf16(l->dev, &d, gp_bf16(x), gp_bf16(dy), dw, db);
    return gp_dev_conv_bwd_weights(l->dev, &d, gp_f32(x), gp_f32(dy), dw, db);
}

/* bf16 storage without the adapter where the device runs this convolution
 * in bf16 anyway (gp_dev_conv_bf16_takes: CUDA under precision bf16); the
 * depth that decides it does not depend on the batch. */
static bool conv_takes_bf16(const gp_layer *l)
{
    gp_conv_desc d = gp_conv2d_desc(l, 1);
    return gp_dev_conv_bf16_takes(l->dev, &d);
}

static double conv_flops(const gp_layer *l, int64_t n)
{
    double outs = (double)n * (double)gp_shape_numel(&l->out_shape); /* N K OH OW */
    double per = (double)l->in_shape.dims[1] * (double)(l->spec.kernel.h * l->spec.kernel.w);
    return 2.0 * outs * per + (l->spec.bias ? outs : 0.0);
}

const gp_layer_ops gp_conv2d_ops = {
    .type = GP_LAYER_CONV2D,
    .infer = conv_infer,
    .init = conv_init,
    .forward = conv_forward,
    .backward_data = conv_backward_data,
    .backward_weights = conv_backward_weights,
    .flops = conv_flops,
    .bwd_ignores_y = true, /* reads x, dy and what it saved */
    .takes_bf16 = conv_takes_bf16,
};
