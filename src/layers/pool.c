/*
 * pool.c — window pooling: maxpool2d, avgpool2d (square kernel; stride
 * defaults to the kernel; the average excludes padding, like PyTorch with
 * count_include_pad=False) and global_avgpool ((N, C, H, W) -> (N, C, 1, 1)).
 *
 * Output size floor((H + 2p - k) / s) + 1 (PyTorch's ceil_mode=False).
 * gp_saved: the backend's workspace (max pooling's argmax indices), if the
 * backend wants one (pool_ws_bytes > 0), in s->ws.
 */
#include "layers/layers_impl.h"

static int64_t pool_stride(const gp_layer *l)
{
    return l->spec.stride > 0 ? l->spec.stride : l->spec.kernel;
}

static gp_pool_desc pool_desc(const gp_layer *l, int64_t n)
{
    gp_pool_desc d = {0};
    d.n = n;
    d.c = l->in_shape.dims[1];
    d.h = l->in_shape.dims[2];
    d.w = l->in_shape.dims[3];
    if (l->spec.type == GP_LAYER_GLOBAL_AVGPOOL) {
        d.kh = d.sh = d.h;
        d.kw = d.sw = d.w;
        d.ph = d.pw = 0;
        d.kind = GP_POOL_AVG;
    } else {
        d.kh = d.kw = l->spec.kernel;
        d.sh = d.sw = pool_stride(l);
        d.ph = d.pw = l->spec.padding;
        d.kind = l->spec.type == GP_LAYER_MAXPOOL2D ? GP_POOL_MAX : GP_POOL_AVG;
    }
    d.oh = l->out_shape.dims[2];
    d.ow = l->out_shape.dims[3];
    return d;
}

static gp_status need_4d(const gp_layer *l, const gp_shape *in)
{
    char b[96];
    if (in->ndim != 4)
        return gp_layer_spec_error(l,
                                   "expected 4-D input (N, C, H, W) but got %s; pooling cannot "
                                   "follow flatten or linear layers, move it before them",
                                   gp_layers_shape_n(in, b, sizeof b));
    return GP_OK;
}

static gp_status pool_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    const gp_layer_spec *sp = &l->spec;
    GP_TRY(need_4d(l, in));
    if (sp->kernel <= 0)
        return gp_layer_spec_error(l, "kernel is missing or not positive; write e.g. kernel: 2");
    if (sp->stride < 0)
        return gp_layer_spec_error(l, "stride = %lld must be positive (or omitted: the kernel)",
                                   (long long)sp->stride);
    if (sp->padding < 0 || 2 * sp->padding > sp->kernel)
        return gp_layer_spec_error(l,
                                   "padding = %lld must be between 0 and half the kernel (%lld)",
                                   (long long)sp->padding, (long long)(sp->kernel / 2));
    int64_t h = in->dims[2], w = in->dims[3], st = pool_stride(l);
    if (h + 2 * sp->padding < sp->kernel || w + 2 * sp->padding < sp->kernel)
        return gp_layer_spec_error(l,
                                   "kernel %lld is larger than the padded input %lldx%lld "
                                   "(input %s with padding %lld); use a smaller kernel or less "
                                   "downsampling before this layer",
                                   (long long)sp->kernel, (long long)(h + 2 * sp->padding),
                                   (long long)(w + 2 * sp->padding),
                                   gp_layers_shape_n(in, b, sizeof b), (long long)sp->padding);
    *out = gp_shape_4d(in->dims[0], in->dims[1],
                       gp_layers_out_size(h, sp->kernel, st, sp->padding),
                       gp_layers_out_size(w, sp->kernel, st, sp->padding));
    return GP_OK;
}

static gp_status gap_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    GP_TRY(need_4d(l, in));
    *out = gp_shape_4d(in->dims[0], in->dims[1], 1, 1);
    return GP_OK;
}

static gp_status pool_init(gp_layer *l, uint64_t seed) { return GP_OK; }

static gp_status pool_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              gp_tensor *y, gp_saved *s)
{
    gp_device *dev = l->dev;
    if (x->dims[0] == 0) return GP_OK;
    gp_pool_desc d = pool_desc(l, x->dims[0]);
    size_t ws = gp_dev_pool_ws_bytes(dev, &d);
    if (ws > 0) {
        GP_ASSERT(s->ws == NULL);
        GP_TRY(gp_dev_alloc(dev, ws, GP_MEM_ACTIVATIONS, &s->ws));
        s->ws_bytes = ws;
        s->ws_dev = dev;
    }
    return gp_dev_pool_fwd(dev, &d, x->data, y->data, s->ws);
}

static gp_status pool_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                    gp_saved *s)
{
    if (x->dims[0] == 0) return GP_OK;
    gp_pool_desc d = pool_desc(l, x->dims[0]);
    return gp_dev_pool_bwd(l->dev, &d, x->data, y->data, dy->data, dx->data, s->ws);
}

static double pool_flops(const gp_layer *l, int64_t n)
{
    gp_pool_desc d = pool_desc(l, n);
    return (double)n * (double)gp_shape_numel(&l->out_shape) * (double)(d.kh * d.kw);
}

static size_t pool_saved_bytes(const gp_layer *l, int64_t n)
{
    if (!l->dev || n == 0) return 0;
    gp_pool_desc d = pool_desc(l, n);
    return gp_dev_pool_ws_bytes(l->dev, &d);
}

const gp_layer_ops gp_maxpool2d_ops = {
    .type = GP_LAYER_MAXPOOL2D,
    .infer = pool_infer,
    .init = pool_init,
    .forward = pool_forward,
    .backward_data = pool_backward_data,
    .flops = pool_flops,
    .saved_bytes = pool_saved_bytes,
};

const gp_layer_ops gp_avgpool2d_ops = {
    .type = GP_LAYER_AVGPOOL2D,
    .infer = pool_infer,
    .init = pool_init,
    .forward = pool_forward,
    .backward_data = pool_backward_data,
    .flops = pool_flops,
    .saved_bytes = pool_saved_bytes,
};

const gp_layer_ops gp_global_avgpool_ops = {
    .type = GP_LAYER_GLOBAL_AVGPOOL,
    .infer = gap_infer,
    .init = pool_init,
    .forward = pool_forward,
    .backward_data = pool_backward_data,
    .flops = pool_flops,
    .saved_bytes = pool_saved_bytes,
};
