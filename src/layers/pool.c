/*
 * pool.c — window pooling: maxpool2d, avgpool2d (kernel, stride and
 * padding per axis; stride defaults to the kernel; padding at most half the
 * kernel, as PyTorch requires) and global_avgpool ((N, C, H, W) -> (N, C,
 * 1, 1)).  The average divides by KH * KW, zero padding included, like
 * PyTorch's default count_include_pad=True; with count_include_pad: false
 * (AmoebaNet's pools) by the window's elements inside the image.
 *
 * Output size floor((H + 2 PH - KH) / SH) + 1 and likewise for W
 * (PyTorch's ceil_mode=False), so no window reaches past the padding and
 * KH * KW is the count of the padded window.
 * gp_saved: the backend's workspace (max pooling's argmax indices), if the
 * backend wants one (pool_ws_bytes > 0), in s->ws.
 */
#include "layers/layers_impl.h"

static gp_hw pool_stride(const gp_layer *l)
{
    gp_hw s = l->spec.stride;
    return s.h > 0 || s.w > 0 ? s : l->spec.kernel;
}

static gp_pool_desc pool_desc(const gp_layer *l, int64_t n)
{
    gp_pool_desc d = {0};
    d.n = n;
    d.blk = l->in_blk; /* gp_layers_blocked */
    d.plain_out = l->in_blk && !l->out_blk; /* a chain's last layer */
    d.c = l->in_shape.dims[1];
    d.h = l->in_shape.dims[2];
    d.w = l->in_shape.dims[3];
    if (l->spec.type == GP_LAYER_GLOBAL_AVGPOOL) {
        d.kh = d.sh = d.h;
        d.kw = d.sw = d.w;
        d.ph = d.pw = 0;
        d.kind = GP_POOL_AVG;
    } else {
        gp_hw st = pool_stride(l);
        d.kh = l->spec.kernel.h;
        d.kw = l->spec.kernel.w;
        d.sh = st.h;
        d.sw = st.w;
        d.ph = l->spec.padding.h;
        d.pw = l->spec.padding.w;
        if (l->spec.type == GP_LAYER_MAXPOOL2D) d.kind = GP_POOL_MAX;
        else d.kind = l->spec.count_include_pad ? GP_POOL_AVG_INCLUDE_PAD : GP_POOL_AVG;
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
    char b[96], k[48], p[48], st[48];
    const gp_layer_spec *sp = &l->spec;
    GP_TRY(need_4d(l, in));
    if (sp->kernel.h <= 0 || sp->kernel.w <= 0)
        return gp_layer_spec_error(l, "kernel is missing or not positive (got %s); write "
                                   "e.g. kernel: 2 or kernel: [1, 3]",
                                   gp_hw_str(sp->kernel, k, sizeof k));
    /* {0, 0} is "the kernel"; a stride given per axis must be positive on both */
    if (sp->stride.h < 0 || sp->stride.w < 0 ||
        ((sp->stride.h > 0 || sp->stride.w > 0) && (sp->stride.h == 0 || sp->stride.w == 0)))
        return gp_layer_spec_error(l, "stride = %s must be positive (or omitted: the kernel)",
                                   gp_hw_str(sp->stride, st, sizeof st));
    if (sp->padding.h < 0 || sp->padding.w < 0 || 2 * sp->padding.h > sp->kernel.h ||
        2 * sp->padding.w > sp->kernel.w) {
        gp_hw half = {sp->kernel.h / 2, sp->kernel.w / 2};
        char hk[48];
        return gp_layer_spec_error(l,
                                   "padding = %s must be between 0 and half the kernel (%s)",
                                   gp_hw_str(sp->padding, p, sizeof p),
                                   gp_hw_str(half, hk, sizeof hk));
    }
    int64_t h = in->dims[2], w = in->dims[3];
    int64_t ph = h + 2 * sp->padding.h, pw = w + 2 * sp->padding.w;
    if (ph < sp->kernel.h || pw < sp->kernel.w)
        return gp_layer_spec_error(l,
                                   "kernel %s is larger than the padded input %lldx%lld "
                                   "(input %s with padding %s); use a smaller kernel or less "
                                   "downsampling before this layer",
                                   gp_hw_str(sp->kernel, k, sizeof k), (long long)ph,
                                   (long long)pw, gp_layers_shape_n(in, b, sizeof b),
                                   gp_hw_str(sp->padding, p, sizeof p));
    gp_hw o = gp_layers_out_hw(h, w, sp->kernel, pool_stride(l), sp->padding);
    *out = gp_shape_4d(in->dims[0], in->dims[1], o.h, o.w);
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
    if (x->dtype == GP_BF16) /* bf16 storage, without the adapter (takes_bf16) */
        return gp_dev_pool_fwd_bf16(dev, &d, gp_bf16(x), gp_bf16(y), s->ws);
    return gp_dev_pool_fwd(dev, &d, gp_f32(x), gp_f32(y), s->ws);
}

static gp_status pool_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                    gp_saved *s)
{
    if (x->dims[0] == 0) return GP_OK;
    gp_pool_desc d = pool_desc(l, x->dims[0]);
    if (x->dtype == GP_BF16)
        return gp_dev_pool_bwd_bf16(l->dev, &d, gp_bf16(x), gp_bf16(y), gp_bf16(dy), gp_bf16(dx),
                                    s->ws);
    return gp_dev_pool_bwd(l->dev, &d, gp_f32(x), gp_f32(y), gp_f32(dy), gp_f32(dx), s->ws);
}

static bool pool_takes_bf16(const gp_layer *l) { return gp_dev_pool_bf16_has(l->dev); }

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
    .takes_bf16 = pool_takes_bf16,
};

/* An average's backward spreads dy over the windows: it reads neither x
 * nor y (backend.h, pool_bwd), so neither is kept for it (gp_layers_unkept;
 * AmoebaNet's cells kept their three average pools' outputs until
 * 2026-11-27). */
const gp_layer_ops gp_avgpool2d_ops = {
    .type = GP_LAYER_AVGPOOL2D,
    .infer = pool_infer,
    .init = pool_init,
    .forward = pool_forward,
    .backward_data = pool_backward_data,
    .flops = pool_flops,
    .saved_bytes = pool_saved_bytes,
    .takes_bf16 = pool_takes_bf16,
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
};

const gp_layer_ops gp_global_avgpool_ops = {
    .type = GP_LAYER_GLOBAL_AVGPOOL,
    .infer = gap_infer,
    .init = pool_init,
    .forward = pool_forward,
    .backward_data = pool_backward_data,
    .flops = pool_flops,
    .saved_bytes = pool_saved_bytes,
    .takes_bf16 = pool_takes_bf16,
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
};
