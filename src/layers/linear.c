/*
 * linear.c — fully connected layer, y = x W^T + b.
 *
 * Parameters (PyTorch layout): weight (out, in), bias (out) when spec.bias;
 * initialised as PyTorch's nn.Linear, or (init: normal) as GPT-2's:
 * weight normal(0, spec.std), bias 0.  A padded LM head (spec.valid_rows <
 * out, model.gpt.vocab_pad) has its weight's rows (and bias) past
 * valid_rows at 0: the logits no loss reads.
 * Input (N, in), output (N, out); or (N, T, in) -> (N, T, out), every
 * position through the same weights (a Transformer's projections and LM
 * head): the N*T positions are the rows of one product, as nn.Linear does.
 * 4-D input is refused with a hint to add a flatten layer.  Saves nothing: backward needs only x (kept by the caller).
 * Followed in its stage by a relu in place (gp_layers_relu_fused), the
 * forward applies the relu too (relu_after: in the product's epilogue on a
 * GPU, the same pass as the bias on a CPU) and the relu's forward does
 * nothing; the relu's backward runs as ever, on the relu's output.
 */
#include "layers/layers_impl.h"

#include <math.h>

static gp_status linear_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    if (in->ndim != 2 && in->ndim != 3)
        return gp_layer_spec_error(l,
                                   "expected input (N, features) or (N, T, features) but got "
                                   "%s; add a flatten layer before this linear layer",
                                   gp_layers_shape_n(in, b, sizeof b));
    if (l->spec.out <= 0)
        return gp_layer_spec_error(l, "out (the number of output features) is missing; "
                                      "write e.g. {linear: {out: 10}}");
    int64_t f = in->dims[in->ndim - 1];
    if (l->spec.in > 0 && l->spec.in != f)
        return gp_layer_spec_error(l,
                                   "in = %lld but the input has %lld features %s; remove 'in' "
                                   "(it is inferred) or fix the layers before it",
                                   (long long)l->spec.in, (long long)f,
                                   gp_layers_shape_n(in, b, sizeof b));
    *out = *in;
    out->dims[in->ndim - 1] = l->spec.out;
    return GP_OK;
}

static gp_status linear_init(gp_layer *l, uint64_t seed)
{
    int64_t in = l->in_shape.dims[l->in_shape.ndim - 1], out = l->spec.out;
    gp_shape ws = gp_shape_2d(out, in);
    float bound = 1.0f / sqrtf((float)in); /* kaiming_uniform(a = sqrt(5)) */
    /* init: normal is GPT-2's (llm.c's): weight normal(0, std), bias 0 */
    bool normal = l->spec.init == GP_INIT_NORMAL;
    GP_TRY(gp_layers_add_param(l, "weight", &ws, false, false));
    if (normal) GP_TRY(gp_layers_init_normal(l, 0, seed, l->spec.std));
    else GP_TRY(gp_layers_init_uniform(l, 0, seed, bound));
    /* tie: a replica of the owner's weight, which gp_layers_tie_sync copies
     * in once the owner is initialised (its own draw here is overwritten) */
    l->params[0].tied = l->spec.tie[0] != '\0';
    int64_t valid = gp_layer_spec_valid_rows(&l->spec, out);
    GP_TRY(gp_layers_zero_rows(l, 0, valid));
    if (l->spec.bias) {
        gp_shape bs = {1, {out, 0, 0, 0}};
        GP_TRY(gp_layers_add_param(l, "bias", &bs, false, true));
        if (normal) GP_TRY(gp_layers_fill_param(l, 1, 0.0f));
        else GP_TRY(gp_layers_init_uniform(l, 1, seed, bound));
        GP_TRY(gp_layers_zero_rows(l, 1, valid));
    }
    return GP_OK;
}

static gp_status linear_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                gp_tensor *y, gp_saved *s)
{
    gp_device *dev = l->dev;
    /* n rows: N, or N*T positions of (N, T, in) */
    int64_t in = x->dims[x->ndim - 1], out = l->spec.out;
    int64_t n = in > 0 ? gp_tensor_numel(x) / in : 0;
    if (n == 0) return GP_OK;
    /* the product, the bias and (relu_after: the in-place relu that
     * follows, gp_layers_relu_fused) the relu in one device call */
    if (x->dtype == GP_BF16) /* bf16 storage, without the adapter (takes_bf16) */
        return gp_dev_linear_fwd_bf16(dev, n, out, in, gp_bf16(x), gp_f32(&l->params[0].value),
                                      l->spec.bias ? gp_f32(&l->params[1].value) : NULL,
                                      l->relu_after, gp_bf16(y));
    return gp_dev_linear_fwd(dev, n, out, in, gp_f32(x), gp_f32(&l->params[0].value),
                             l->spec.bias ? gp_f32(&l->params[1].value) : NULL, l->relu_after,
                             gp_f32(y));
}

gp_status gp_layers_linear_forward_gelu(gp_layer *l, const gp_tensor *x, gp_tensor *pre,
                                        gp_tensor *y)
{
    int64_t in = x->dims[x->ndim - 1], out = l->spec.out;
    int64_t n = in > 0 ? gp_tensor_numel(x) / in : 0;
    GP_ASSERT(x->dtype == pre->dtype && x->dtype == y->dtype && !l->relu_after);
    return gp_dev_linear_gelu_fwd(l->dev, x->dtype, n, out, in, gp_tensor_mem(x),
                                  gp_f32(&l->params[0].value),
                                  l->spec.bias ? gp_f32(&l->params[1].value) : NULL,
                                  gp_tensor_mem(pre), gp_tensor_mem(y));
}

static gp_status linear_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                      const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                      gp_saved *s)
{
    gp_device *dev = l->dev;
    /* n rows: N, or N*T positions of (N, T, in) */
    int64_t in = x->dims[x->ndim - 1], out = l->spec.out;
    int64_t n = in > 0 ? gp_tensor_numel(x) / in : 0;
    if (n == 0) return GP_OK;
    /* the GELU before this layer, its backward as the product's epilogue
     * (ctx->gelu_in: its input; gp_layers_gelu_linear) */
    if (ctx->gelu_in)
        return gp_dev_linear_gelu_bwd_data(dev, dy->dtype, n, out, in, gp_tensor_mem(dy),
                                           gp_f32(&l->params[0].value),
                                           gp_tensor_mem(ctx->gelu_in), gp_tensor_mem(dx));
    /* dx(N, in) = dy(N, out) W(out, in) */
    if (dy->dtype == GP_BF16)
        return gp_dev_linear_bwd_data_bf16(dev, n, out, in, gp_bf16(dy),
                                           gp_f32(&l->params[0].value), gp_bf16(dx));
    return gp_dev_gemm_wb(dev, 0, 0, n, in, out, 1.0f, gp_f32(dy), out,
                          gp_f32(&l->params[0].value), in, 0.0f, gp_f32(dx), in);
}

static gp_status linear_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx,
                                         const gp_tensor *x, const gp_tensor *y,
                                         const gp_tensor *dy, gp_saved *s)
{
    gp_device *dev = l->dev;
    /* n rows: N, or N*T positions of (N, T, in) */
    int64_t in = x->dims[x->ndim - 1], out = l->spec.out;
    int64_t n = in > 0 ? gp_tensor_numel(x) / in : 0;
    if (n == 0) /* nothing to add; a fresh step's gradients are zero */
        return ctx->grads_overwrite ? gp_layer_zero_grad(l) : GP_OK;
    /* dW(out, in) += dy^T(out, N) x(N, in); = on the step's first backward */
    /* the weight and bias gradients in one device call on either storage
     * (the bias's sums overwrite on a fresh step: no fill first) */
    GP_ASSERT(dy->dtype == x->dtype);
    return gp_dev_linear_bwd_weights(dev, dy->dtype, n, out, in, gp_tensor_mem(dy),
                                     gp_tensor_mem(x), gp_f32(&l->params[0].grad),
                                     l->spec.bias ? gp_f32(&l->params[1].grad) : NULL,
                                     ctx->grads_overwrite);
}

static double linear_flops(const gp_layer *l, int64_t n)
{
    /* rows: N, or N*T positions */
    const gp_shape *is = &l->in_shape;
    double in = (double)is->dims[is->ndim - 1], out = (double)l->spec.out;
    double rows = (double)n * (double)(gp_shape_numel(is) / is->dims[is->ndim - 1]);
    return 2.0 * rows * in * out + (l->spec.bias ? rows * out : 0.0);
}

/* On bf16 storage where the device multiplies bf16 (precision bf16 and
 * the linear_*_bf16 slots: CUDA): the products read and write the bf16
 * activations as they are; elsewhere the storage adapter (FP32 math on the
 * widened values). */
static bool linear_takes_bf16(const gp_layer *l) { return gp_dev_linear_bf16_has(l->dev); }

const gp_layer_ops gp_linear_ops = {
    .type = GP_LAYER_LINEAR,
    .takes_bf16 = linear_takes_bf16,
    .infer = linear_infer,
    .init = linear_init,
    .forward = linear_forward,
    .backward_data = linear_backward_data,
    .backward_weights = linear_backward_weights,
    .overwrites_grads = true,
    .flops = linear_flops,
    .bwd_ignores_y = true, /* reads x, dy and what it saved */
};
