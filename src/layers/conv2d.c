/*
 * conv2d.c — 2-D convolution, cross-correlation as in PyTorch.
 *
 * Parameters: weight (K, C, KH, KW), bias (K) when spec.bias.  Square
 * kernel, stride and padding from the spec.  Input (N, C, H, W), output
 * (N, K, OH, OW) with OH = (H + 2p - kernel) / stride + 1.  Saves nothing:
 * backward needs x (kept by the caller) and the weights.  The residual block
 * uses this layer as its child convolutions.
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
    d.kh = d.kw = l->spec.kernel;
    d.sh = d.sw = l->spec.stride;
    d.ph = d.pw = l->spec.padding;
    d.oh = l->out_shape.dims[2];
    d.ow = l->out_shape.dims[3];
    d.has_bias = l->spec.bias ? 1 : 0;
    return d;
}

static gp_status conv_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    const gp_layer_spec *sp = &l->spec;
    if (in->ndim != 4)
        return gp_layer_spec_error(l,
                                   "expected 4-D input (N, C, H, W) but got %s; a convolution "
                                   "cannot follow flatten or linear layers, move it before them",
                                   gp_layers_shape_n(in, b, sizeof b));
    if (sp->out <= 0)
        return gp_layer_spec_error(l, "out (the number of output channels) is missing; write "
                                      "e.g. {conv2d: {out: 16, kernel: 3}}");
    if (sp->kernel <= 0)
        return gp_layer_spec_error(l, "kernel is missing or not positive; write e.g. kernel: 3");
    if (sp->stride <= 0)
        return gp_layer_spec_error(l, "stride = %lld must be at least 1", (long long)sp->stride);
    if (sp->padding < 0)
        return gp_layer_spec_error(l, "padding = %lld must not be negative",
                                   (long long)sp->padding);
    if (sp->in > 0 && sp->in != in->dims[1])
        return gp_layer_spec_error(l,
                                   "in = %lld but the input has %lld channels %s; remove 'in' "
                                   "(it is inferred) or fix the layers before it",
                                   (long long)sp->in, (long long)in->dims[1],
                                   gp_layers_shape_n(in, b, sizeof b));
    int64_t h = in->dims[2], w = in->dims[3];
    if (h + 2 * sp->padding < sp->kernel || w + 2 * sp->padding < sp->kernel)
        return gp_layer_spec_error(l,
                                   "kernel %lld is larger than the padded input %lldx%lld "
                                   "(input %s with padding %lld); use a smaller kernel, more "
                                   "padding, or less downsampling before this layer",
                                   (long long)sp->kernel, (long long)(h + 2 * sp->padding),
                                   (long long)(w + 2 * sp->padding),
                                   gp_layers_shape_n(in, b, sizeof b), (long long)sp->padding);
    *out = gp_shape_4d(in->dims[0], sp->out,
                       gp_layers_out_size(h, sp->kernel, sp->stride, sp->padding),
                       gp_layers_out_size(w, sp->kernel, sp->stride, sp->padding));
    return GP_OK;
}

static gp_status conv_init(gp_layer *l, uint64_t seed)
{
    int64_t c = l->in_shape.dims[1], k = l->spec.out, kk = l->spec.kernel;
    gp_shape ws = gp_shape_4d(k, c, kk, kk);
    float bound = 1.0f / sqrtf((float)(c * kk * kk)); /* kaiming_uniform(a = sqrt(5)) */
    GP_TRY(gp_layers_add_param(l, "weight", &ws, false, false));
    GP_TRY(gp_layers_init_uniform(l, 0, seed, bound));
    if (l->spec.bias) {
        gp_shape bs = {1, {k, 0, 0, 0}};
        GP_TRY(gp_layers_add_param(l, "bias", &bs, false, true));
        GP_TRY(gp_layers_init_uniform(l, 1, seed, bound));
    }
    return GP_OK;
}

static gp_status conv_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              gp_tensor *y, gp_saved *s)
{
    if (x->dims[0] == 0) return GP_OK;
    gp_conv_desc d = gp_conv2d_desc(l, x->dims[0]);
    return gp_dev_conv_fwd(l->dev, &d, x->data, l->params[0].value.data,
                           l->spec.bias ? l->params[1].value.data : NULL, y->data);
}

static gp_status conv_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                    gp_saved *s)
{
    if (x->dims[0] == 0) return GP_OK;
    gp_conv_desc d = gp_conv2d_desc(l, x->dims[0]);
    return gp_dev_conv_bwd_data(l->dev, &d, l->params[0].value.data, dy->data, dx->data);
}

static gp_status conv_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                       const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    if (x->dims[0] == 0) return GP_OK;
    gp_conv_desc d = gp_conv2d_desc(l, x->dims[0]);
    return gp_dev_conv_bwd_weights(l->dev, &d, x->data, dy->data,
                                   l->params[0].grad.data,
                                   l->spec.bias ? l->params[1].grad.data : NULL);
}

static double conv_flops(const gp_layer *l, int64_t n)
{
    double outs = (double)n * (double)gp_shape_numel(&l->out_shape); /* N K OH OW */
    double per = (double)l->in_shape.dims[1] * (double)(l->spec.kernel * l->spec.kernel);
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
};
