/*
 * transformer.c — the layers a GPT-2 block needs besides linear and gelu
 * (issue 53): layer_norm and embedding.
 *
 * layer_norm: PyTorch's nn.LayerNorm(C) over the last dimension of (N, C)
 *   or (N, T, C) inputs: every row of C values normalised by its own mean
 *   and biased variance (statistics in FP32, their sums in double), then
 *   scaled by weight (C, init 1) and shifted by bias (C, init 0).  Training
 *   and eval compute the same (no running statistics).  Saves each row's
 *   mean and 1 / sqrt(var + eps) (2 floats a row); backward reads x too.
 *   backward_data (dx =) and backward_weights (dW +=) are separate passes,
 *   so a weights-only backward (the first stage) reads no w.
 * embedding: GPT-2's token and position embeddings as one layer (wte +
 *   wpe, as llm.c's encoder: one layer keeps a Transformer's first stage a
 *   plain chain, and the position table needs the same T as the tokens).
 *   Input (N, T) token ids stored as floats (model.input [T], which
 *   arrives as (N, T, 1, 1)) (exact below 2^24, the most
 *   `vocab` takes), output (N, T, dim) = wte[id] + wpe[position].
 *   Parameters wte.weight (vocab, dim), normal(0, 0.02), and wpe.weight
 *   (positions, dim), normal(0, 0.01), as llm.c initialises them (the names
 *   are Hugging Face GPT-2's without its "transformer." prefix).  The input
 *   is data, so there is no dx: the layer must be the model's first (the
 *   first stage asks no dx of it), and backward_data, which only a caller
 *   outside the pipeline asks (the profiler times every layer's), writes
 *   zeros: ids are constants.  Backward is
 *   a scatter-add into the gradients (embed_bwd).  An id that is not a
 *   whole number in [0, vocab) fails the forward with the layer, the
 *   sample's row in the mini-batch and the position.  A padded vocabulary
 *   (spec.valid_rows < vocab, model.gpt.vocab_pad) has wte rows past
 *   valid_rows that start at 0, and the ids must be below valid_rows: the
 *   padding rows are then never read, and their gradient stays 0.
 */
#include "layers/layers_impl.h"

#include <math.h>

/* ---- layer_norm ----------------------------------------------------------- */

static int64_t ln_rows(const gp_tensor *x)
{
    int64_t c = x->dims[x->ndim - 1];
    return c > 0 ? gp_tensor_numel(x) / c : 0;
}

static gp_status layer_norm_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    if (!(l->spec.eps > 0.0f) || isinf(l->spec.eps))
        return gp_layer_spec_error(l, "eps = %g must be a finite number > 0 (default 1e-5)",
                                   (double)l->spec.eps);
    if (in->ndim != 2 && in->ndim != 3)
        return gp_layer_spec_error(l,
                                   "%s normalises the last dimension of (N, C) or (N, T, C) "
                                   "inputs, but got %s; for images use batchnorm or "
                                   "instance_norm",
                                   gp_layer_type_name(l->spec.type),
                                   gp_layers_shape_n(in, b, sizeof b));
    *out = *in;
    return GP_OK;
}

static gp_status layer_norm_init(gp_layer *l, uint64_t seed)
{
    gp_shape cs = {1, {l->in_shape.dims[l->in_shape.ndim - 1], 0, 0, 0}};
    GP_TRY(gp_layers_add_param(l, "weight", &cs, false, true));
    GP_TRY(gp_layers_fill_param(l, 0, 1.0f));
    GP_TRY(gp_layers_add_param(l, "bias", &cs, false, true));
    return gp_layers_fill_param(l, 1, 0.0f);
}

static gp_status layer_norm_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    gp_tensor *y, gp_saved *s)
{
    int64_t rows = ln_rows(x), c = x->dims[x->ndim - 1];
    if (rows == 0) return GP_OK;
    gp_shape st = gp_shape_2d(rows, 1);
    GP_TRY(gp_layers_saved_alloc(s, 0, l->dev, &st)); /* mean (rows) */
    GP_TRY(gp_layers_saved_alloc(s, 1, l->dev, &st)); /* rstd (rows) */
    const float *w = gp_f32(&l->params[0].value), *b = gp_f32(&l->params[1].value);
    float *mean = gp_f32(&s->t[0]), *rstd = gp_f32(&s->t[1]);
    if (x->dtype == GP_BF16) /* bf16 storage, without the adapter (takes_bf16) */
        return gp_dev_layer_norm_fwd_bf16(l->dev, gp_bf16(x), w, b, gp_bf16(y), mean, rstd,
                                          rows, c, l->spec.eps);
    return gp_dev_layer_norm_fwd(l->dev, gp_f32(x), w, b, gp_f32(y), mean, rstd, rows, c,
                                 l->spec.eps);
}

/* The forward of a residual add a + b and this norm over the sum s, in one
 * device call (gp_layer_add_norm_forward; s and y allocated). */
gp_status gp_layers_norm_forward_add(gp_layer *l, const gp_tensor *a, const gp_tensor *b,
                                     gp_tensor *sum, gp_tensor *y, gp_saved *s)
{
    int64_t rows = ln_rows(sum), c = sum->dims[sum->ndim - 1];
    GP_ASSERT(rows > 0 && a->dtype == sum->dtype && b->dtype == sum->dtype &&
              y->dtype == sum->dtype);
    gp_shape st = gp_shape_2d(rows, 1);
    GP_TRY(gp_layers_saved_alloc(s, 0, l->dev, &st)); /* mean (rows) */
    GP_TRY(gp_layers_saved_alloc(s, 1, l->dev, &st)); /* rstd (rows) */
    return gp_dev_add_layer_norm_fwd(l->dev, sum->dtype, gp_tensor_mem(a), gp_tensor_mem(b),
                                     gp_tensor_mem(sum), gp_f32(&l->params[0].value),
                                     gp_f32(&l->params[1].value), gp_tensor_mem(y),
                                     gp_f32(&s->t[0]), gp_f32(&s->t[1]), rows, c, l->spec.eps);
}

static gp_status layer_norm_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                          const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                          gp_saved *s)
{
    int64_t rows = ln_rows(x), c = x->dims[x->ndim - 1];
    if (rows == 0) return GP_OK;
    const float *w = gp_f32(&l->params[0].value), *mean = gp_f32(&s->t[0]);
    const float *rstd = gp_f32(&s->t[1]);
    if (ctx->dx_into && gp_tensor_mem(ctx->dx_into) == gp_tensor_mem(dx)) /* dx += */
        return gp_dev_layer_norm_bwd_data_add(l->dev, x->dtype, gp_tensor_mem(x), w, mean, rstd,
                                              gp_tensor_mem(dy), gp_tensor_mem(dx), rows, c);
    if (x->dtype == GP_BF16)
        return gp_dev_layer_norm_bwd_data_bf16(l->dev, gp_bf16(x), w, mean, rstd, gp_bf16(dy),
                                               gp_bf16(dx), rows, c);
    return gp_dev_layer_norm_bwd_data(l->dev, gp_f32(x), w, mean, rstd, gp_f32(dy), gp_f32(dx),
                                      rows, c);
}

static gp_status layer_norm_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx,
                                             const gp_tensor *x, const gp_tensor *y,
                                             const gp_tensor *dy, gp_saved *s)
{
    int64_t rows = ln_rows(x), c = x->dims[x->ndim - 1];
    if (rows == 0) return GP_OK;
    const float *mean = gp_f32(&s->t[0]), *rstd = gp_f32(&s->t[1]);
    float *dw = gp_f32(&l->params[0].grad), *db = gp_f32(&l->params[1].grad);
    if (x->dtype == GP_BF16)
        return gp_dev_layer_norm_bwd_weights_bf16(l->dev, gp_bf16(x), mean, rstd, gp_bf16(dy),
                                                  dw, db, rows, c);
    return gp_dev_layer_norm_bwd_weights(l->dev, gp_f32(x), mean, rstd, gp_f32(dy), dw, db, rows,
                                         c);
}

static bool layer_norm_takes_bf16(const gp_layer *l) { return gp_dev_layer_norm_bf16_has(l->dev); }

static double layer_norm_flops(const gp_layer *l, int64_t n)
{
    /* statistics (3 per element) and the affine normalisation (4) */
    return 7.0 * (double)n * (double)gp_shape_numel(&l->out_shape);
}

static size_t layer_norm_saved_bytes(const gp_layer *l, int64_t n)
{
    const gp_shape *in = &l->in_shape;
    int64_t per = gp_shape_numel(in) / (in->dims[0] * in->dims[in->ndim - 1]);
    return 2 * (size_t)(n * per) * sizeof(float);
}

static bool layer_norm_dx_adds(const gp_layer *l, gp_dtype dt)
{
    return gp_dev_add_norm_has(l->dev, dt);
}

const gp_layer_ops gp_layer_norm_ops = {
    .type = GP_LAYER_LAYER_NORM,
    .infer = layer_norm_infer,
    .init = layer_norm_init,
    .forward = layer_norm_forward,
    .backward_data = layer_norm_backward_data,
    .backward_weights = layer_norm_backward_weights,
    .flops = layer_norm_flops,
    .saved_bytes = layer_norm_saved_bytes,
    .bwd_ignores_y = true,
    .takes_bf16 = layer_norm_takes_bf16,
    .dx_adds = layer_norm_dx_adds,
};

/* ---- rms_norm (issue 66) ------------------------------------------------------
 * Hugging Face's LlamaRMSNorm over the last dimension of (N, C) or (N, T,
 * C): each row times 1 / sqrt(mean(x^2) + eps) (the mean of squares in
 * double), then times weight (C, init 1); no bias, no mean taken out.
 * Saves each row's 1 / sqrt(...) (a float a row); the backward reads x.
 * The same in training and eval. */

static gp_status rms_norm_init(gp_layer *l, uint64_t seed)
{
    (void)seed;
    gp_shape cs = {1, {l->in_shape.dims[l->in_shape.ndim - 1], 0, 0, 0}};
    GP_TRY(gp_layers_add_param(l, "weight", &cs, false, true));
    return gp_layers_fill_param(l, 0, 1.0f);
}

static gp_status rms_norm_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  gp_tensor *y, gp_saved *s)
{
    (void)ctx;
    int64_t rows = ln_rows(x), c = x->dims[x->ndim - 1];
    if (rows == 0) return GP_OK;
    gp_shape st = gp_shape_2d(rows, 1);
    GP_TRY(gp_layers_saved_alloc(s, 0, l->dev, &st)); /* rstd (rows) */
    return gp_dev_rms_norm_fwd(l->dev, x->dtype, gp_tensor_mem(x), gp_f32(&l->params[0].value),
                               gp_tensor_mem(y), gp_f32(&s->t[0]), rows, c, l->spec.eps);
}

static gp_status rms_norm_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                        const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                        gp_saved *s)
{
    (void)ctx;
    (void)y;
    int64_t rows = ln_rows(x), c = x->dims[x->ndim - 1];
    if (rows == 0) return GP_OK;
    return gp_dev_rms_norm_bwd_data(l->dev, x->dtype, gp_tensor_mem(x),
                                    gp_f32(&l->params[0].value), gp_f32(&s->t[0]),
                                    gp_tensor_mem(dy), gp_tensor_mem(dx), rows, c);
}

static gp_status rms_norm_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                           const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    (void)ctx;
    (void)y;
    int64_t rows = ln_rows(x), c = x->dims[x->ndim - 1];
    if (rows == 0) return GP_OK;
    return gp_dev_rms_norm_bwd_weights(l->dev, x->dtype, gp_tensor_mem(x), gp_f32(&s->t[0]),
                                       gp_tensor_mem(dy), gp_f32(&l->params[0].grad), rows, c);
}

/* bf16 storage as it is wherever the device has the slots (they take the
 * element type) */
static bool rms_norm_takes_bf16(const gp_layer *l) { return l->dev->iface->rms_norm_fwd != NULL; }

static double rms_norm_flops(const gp_layer *l, int64_t n)
{
    /* the squares' sum (2 per element) and the scaling (2) */
    return 4.0 * (double)n * (double)gp_shape_numel(&l->out_shape);
}

static size_t rms_norm_saved_bytes(const gp_layer *l, int64_t n)
{
    const gp_shape *in = &l->in_shape;
    int64_t per = gp_shape_numel(in) / (in->dims[0] * in->dims[in->ndim - 1]);
    return (size_t)(n * per) * sizeof(float);
}

const gp_layer_ops gp_rms_norm_ops = {
    .type = GP_LAYER_RMS_NORM,
    .infer = layer_norm_infer,
    .init = rms_norm_init,
    .forward = rms_norm_forward,
    .backward_data = rms_norm_backward_data,
    .backward_weights = rms_norm_backward_weights,
    .flops = rms_norm_flops,
    .saved_bytes = rms_norm_saved_bytes,
    .bwd_ignores_y = true,
    .takes_bf16 = rms_norm_takes_bf16,
};

/* ---- swiglu (issue 66) ---------------------------------------------------------
 * Llama's MLP activation on the gate's and the up projection's outputs side
 * by side (one linear layer of 2 I outputs, gate first, as Hugging Face's
 * gate_proj and up_proj stacked): (N, 2 I) or (N, T, 2 I) in, silu(gate)
 * up out, (N, I) or (N, T, I).  No parameters; saves nothing (the
 * backward reads x). */

static gp_status swiglu_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    int64_t f = in->ndim >= 2 ? in->dims[in->ndim - 1] : 0;
    if ((in->ndim != 2 && in->ndim != 3) || f % 2 != 0)
        return gp_layer_spec_error(l, "swiglu takes (N, 2 I) or (N, T, 2 I): the gate's and the "
                                      "up projection's outputs side by side, an even number of "
                                      "features; got %s (give the linear layer before it 2 I "
                                      "outputs)",
                                   gp_layers_shape_n(in, b, sizeof b));
    *out = *in;
    out->dims[in->ndim - 1] = f / 2;
    return GP_OK;
}

static gp_status swiglu_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                gp_tensor *y, gp_saved *s)
{
    (void)ctx;
    (void)s;
    int64_t h = y->dims[y->ndim - 1], rows = h > 0 ? gp_tensor_numel(y) / h : 0;
    return gp_dev_swiglu_fwd(l->dev, x->dtype, gp_tensor_mem(x), gp_tensor_mem(y), rows, h);
}

static gp_status swiglu_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                      const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                      gp_saved *s)
{
    (void)ctx;
    (void)y;
    (void)s;
    int64_t h = dy->dims[dy->ndim - 1], rows = h > 0 ? gp_tensor_numel(dy) / h : 0;
    return gp_dev_swiglu_bwd(l->dev, x->dtype, gp_tensor_mem(x), gp_tensor_mem(dy),
                             gp_tensor_mem(dx), rows, h);
}

static gp_status swiglu_init(gp_layer *l, uint64_t seed)
{
    (void)l;
    (void)seed;
    return GP_OK; /* no parameters */
}

static bool swiglu_takes_bf16(const gp_layer *l) { return l->dev->iface->swiglu_fwd != NULL; }

static double swiglu_flops(const gp_layer *l, int64_t n)
{
    /* the sigmoid counted as one operation: about 4 per output */
    return 4.0 * (double)n * (double)gp_shape_numel(&l->out_shape);
}

const gp_layer_ops gp_swiglu_ops = {
    .type = GP_LAYER_SWIGLU,
    .infer = swiglu_infer,
    .init = swiglu_init,
    .forward = swiglu_forward,
    .backward_data = swiglu_backward_data,
    .flops = swiglu_flops,
    .bwd_ignores_y = true,
    .takes_bf16 = swiglu_takes_bf16,
};

/* ---- rope (issue 66) -------------------------------------------------------------
 * Rotary position embeddings on a fused q, k, v: (N, T, (H + 2 Hkv) d) in
 * and out, H = heads, Hkv = kv_heads (the layout of Hugging Face's
 * q_proj, k_proj and v_proj stacked, one linear layer before it), each of
 * q's and k's heads turned in the rotate_half layout (gp_rope_desc), v
 * copied.  Position p of a window is p (from 0).  Its backward turns dy
 * back and reads neither x nor y, so it runs in place over the linear's
 * output, whose backward does not read it either. */

/* The rotated head's size: the last axis over H + 2 Hkv heads (0: the
 * shape does not fit). */
static int64_t rope_head(const gp_layer_spec *s, const gp_shape *in)
{
    int64_t kv = s->kv_heads ? s->kv_heads : s->heads, all = s->heads + 2 * kv;
    int64_t w = in->ndim >= 3 ? in->dims[in->ndim - 1] : 0;
    return all > 0 && w % all == 0 ? w / all : 0;
}

static gp_status rope_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    const gp_layer_spec *s = &l->spec;
    int64_t kv = s->kv_heads ? s->kv_heads : s->heads, d = rope_head(s, in);
    if (s->heads < 1 || kv < 1 || s->heads % kv)
        return gp_layer_spec_error(l, "heads = %lld and kv_heads = %lld: kv_heads must divide "
                                      "heads (each k and v head serves heads / kv_heads query "
                                      "heads); leave kv_heads out for as many as heads",
                                   (long long)s->heads, (long long)kv);
    if (d == 0 || d % 2 || d / 2 > GP_ROPE_MAX_HALF)
        return gp_layer_spec_error(l, "rope takes (N, T, (heads + 2 kv_heads) d), q, k and v side "
                                      "by side, with an even head size d up to %d; got %s for "
                                      "heads %lld and kv_heads %lld: give the linear layer before "
                                      "it (heads + 2 kv_heads) d outputs",
                                   2 * GP_ROPE_MAX_HALF, gp_layers_shape_n(in, b, sizeof b),
                                   (long long)s->heads, (long long)kv);
    if (!(s->rope_theta > 1.0f))
        return gp_layer_spec_error(l, "theta = %g: the base of rope's frequencies is above 1 "
                                      "(Llama: 10000, Llama 3: 500000)", (double)s->rope_theta);
    if (s->rope_llama3 && (!(s->rope_factor >= 1.0f) || !(s->rope_low_freq > 0.0f) ||
                           !(s->rope_high_freq > s->rope_low_freq) || s->rope_orig_positions < 1))
        return gp_layer_spec_error(l, "llama3 scaling takes factor >= 1, 0 < low_freq_factor < "
                                      "high_freq_factor and original_positions >= 1 (Llama 3.2: "
                                      "32, 1, 4, 8192); got %g, %g, %g, %lld",
                                   (double)s->rope_factor, (double)s->rope_low_freq,
                                   (double)s->rope_high_freq, (long long)s->rope_orig_positions);
    *out = *in;
    return GP_OK;
}

void gp_rope_inv_freq(const gp_layer_spec *s, int64_t d, float *inv)
{
    /* Hugging Face's float32 steps: 1 / theta^(2i / d), then Llama 3's
     * scaling (_compute_llama3_parameters): long wavelengths divided by
     * the factor, short ones kept, those between blended */
    const double lo_wl = (double)s->rope_orig_positions / (double)s->rope_low_freq;
    const double hi_wl = (double)s->rope_orig_positions / (double)s->rope_high_freq;
    for (int64_t i = 0; i < d / 2; i++) {
        float e = (float)(2 * i) / (float)d;
        float f = 1.0f / (float)pow((double)s->rope_theta, (double)e);
        if (s->rope_llama3) {
            float wl = (float)(2.0 * acos(-1.0)) / f;
            float g = (double)wl > lo_wl ? f / s->rope_factor : f;
            float sm = ((float)s->rope_orig_positions / wl - s->rope_low_freq) /
                       (s->rope_high_freq - s->rope_low_freq);
            float blend = (1.0f - sm) * g / s->rope_factor + sm * g;
            bool medium = !((double)wl < hi_wl) && !((double)wl > lo_wl);
            f = medium ? blend : g;
        }
        inv[i] = f;
    }
}

static gp_rope_desc rope_desc(const gp_layer *l, const gp_tensor *x)
{
    gp_rope_desc d = {0};
    const gp_layer_spec *s = &l->spec;
    int nd = x->ndim;
    d.t = x->dims[nd - 2];
    d.width = x->dims[nd - 1];
    d.rows = 1;
    for (int k = 0; k < nd - 2; k++) d.rows *= x->dims[k];
    d.d = rope_head(s, &l->in_shape);
    d.heads = s->heads + (s->kv_heads ? s->kv_heads : s->heads);
    gp_rope_inv_freq(s, d.d, d.inv_freq);
    return d;
}

static gp_status rope_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              gp_tensor *y, gp_saved *s)
{
    (void)s;
    gp_rope_desc d = rope_desc(l, x);
    d.pos0 = ctx->pos0; /* sampling: the positions after the cache's (else 0) */
    return gp_dev_rope(l->dev, x->dtype, &d, false, gp_tensor_mem(x), gp_tensor_mem(y));
}

static gp_status rope_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                    gp_saved *s)
{
    (void)ctx;
    (void)x;
    (void)y;
    (void)s;
    gp_rope_desc d = rope_desc(l, dy);
    return gp_dev_rope(l->dev, dy->dtype, &d, true, gp_tensor_mem(dy), gp_tensor_mem(dx));
}

static gp_status rope_init(gp_layer *l, uint64_t seed)
{
    (void)l;
    (void)seed;
    return GP_OK; /* no parameters */
}

static bool rope_takes_bf16(const gp_layer *l) { return l->dev->iface->rope != NULL; }

static double rope_flops(const gp_layer *l, int64_t n)
{
    return 3.0 * (double)n * (double)gp_shape_numel(&l->out_shape); /* 6 per turned pair */
}

const gp_layer_ops gp_rope_ops = {
    .type = GP_LAYER_ROPE,
    .infer = rope_infer,
    .init = rope_init,
    .forward = rope_forward,
    .backward_data = rope_backward_data,
    .flops = rope_flops,
    .inplace = GP_INPLACE_VALUES,
    .bwd_ignores_y = true,
    .bwd_ignores_x = true,
    .takes_bf16 = rope_takes_bf16,
};

/* ---- embedding ------------------------------------------------------------- */

static gp_status embedding_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    const gp_layer_spec *sp = &l->spec;
    if (l->index != 0)
        return gp_layer_spec_error(l,
                                   "an embedding takes token ids, the model's input data, so it "
                                   "must be the model's first layer (it is layer %d)",
                                   l->index);
    if (sp->vocab < 1 || sp->vocab > ((int64_t)1 << 24) || sp->dim < 1 || sp->positions < 0)
        return gp_layer_spec_error(l,
                                   "vocab = %lld (in [1, 2^24]: ids are floats) and dim = %lld "
                                   "must be given and >= 1, and positions = %lld >= 0 (0: no "
                                   "position table), like {embedding: {vocab: 256, dim: 64, "
                                   "positions: 128}}",
                                   (long long)sp->vocab, (long long)sp->dim,
                                   (long long)sp->positions);
    /* model.input [T] reaches the first layer as (N, T, 1, 1) */
    bool ids = in->ndim == 2 || (in->ndim == 4 && in->dims[2] == 1 && in->dims[3] == 1);
    if (!ids)
        return gp_layer_spec_error(l,
                                   "expected token ids (N, T) but got %s; set model.input to "
                                   "[T], the sequence length",
                                   gp_layers_shape_n(in, b, sizeof b));
    if (sp->positions > 0 && in->dims[1] > sp->positions)
        return gp_layer_spec_error(l,
                                   "the input has %lld positions but positions = %lld; raise "
                                   "positions to at least the sequence length",
                                   (long long)in->dims[1], (long long)sp->positions);
    *out = (gp_shape){3, {in->dims[0], in->dims[1], sp->dim, 0}};
    return GP_OK;
}

static gp_status embedding_init(gp_layer *l, uint64_t seed)
{
    gp_shape te = gp_shape_2d(l->spec.vocab, l->spec.dim);
    gp_shape pe = gp_shape_2d(l->spec.positions, l->spec.dim);
    GP_TRY(gp_layers_add_param(l, "wte.weight", &te, false, false));
    GP_TRY(gp_layers_init_normal(l, 0, seed, 0.02f));
    /* the padding rows start at 0 (the real ones draw what they would
     * without padding: the draw is by element) */
    GP_TRY(gp_layers_zero_rows(l, 0, gp_layer_spec_valid_rows(&l->spec, l->spec.vocab)));
    if (l->spec.positions == 0) return GP_OK; /* positions elsewhere (rope) */
    GP_TRY(gp_layers_add_param(l, "wpe.weight", &pe, false, false));
    return gp_layers_init_normal(l, 1, seed, 0.01f);
}

static gp_status embedding_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   gp_tensor *y, gp_saved *s)
{
    int64_t n = x->dims[0], t = x->dims[1], bad = -1, p0 = ctx->pos0;
    int64_t vocab = gp_layer_spec_valid_rows(&l->spec, l->spec.vocab);
    if (l->n_params > 1 && p0 + t > l->spec.positions)
        return gp_layer_spec_error(l, "positions %lld .. %lld are past its position table's "
                                      "%lld rows", (long long)p0, (long long)(p0 + t - 1),
                                   (long long)l->spec.positions);
    /* decoding: the rows of positions p0 .. p0 + t - 1 */
    GP_TRY(gp_dev_embed_fwd(l->dev, gp_f32(x), gp_f32(&l->params[0].value),
                            l->n_params > 1 ? gp_f32(&l->params[1].value) + p0 * l->spec.dim
                                            : NULL,
                            y->dtype,
                            gp_tensor_mem(y), n, t,
                            l->spec.dim, vocab, &bad));
    if (bad < 0) return GP_OK;
    float v = 0.0f;
    GP_TRY(gp_dev_download(l->dev, &v, gp_f32(x) + bad, 1)); /* the message's id */
    return gp_layer_spec_error(l,
                               "token id %g at row %lld of the mini-batch, position %lld, is "
                               "not a whole number in [0, %lld) (vocab); the data's tokens "
                               "need a larger vocab, or they are not token ids",
                               (double)v, (long long)(ctx->sample_offset + bad / t),
                               (long long)(p0 + bad % t), (long long)vocab);
}

static gp_status embedding_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                         const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                         gp_saved *s)
{
    return gp_dev_fill(l->dev, gp_f32(dx), 0.0f, gp_tensor_numel(dx));
}

static gp_status embedding_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx,
                                            const gp_tensor *x, const gp_tensor *y,
                                            const gp_tensor *dy, gp_saved *s)
{
    return gp_dev_embed_bwd(l->dev, gp_f32(x), dy->dtype, gp_tensor_mem(dy),
                            gp_f32(&l->params[0].grad),
                            l->n_params > 1 ? gp_f32(&l->params[1].grad) : NULL, x->dims[0],
                            x->dims[1], l->spec.dim,
                            l->spec.vocab);
}

/* y and dy in bf16 on every backend (embed_fwd / embed_bwd take dt); the
 * ids stay FP32 (data_input). */
static bool embedding_takes_bf16(const gp_layer *l) { return true; }

static double embedding_flops(const gp_layer *l, int64_t n)
{
    return (double)n * (double)gp_shape_numel(&l->out_shape); /* one add per element */
}

const gp_layer_ops gp_embedding_ops = {
    .type = GP_LAYER_EMBEDDING,
    .infer = embedding_infer,
    .init = embedding_init,
    .forward = embedding_forward,
    .backward_data = embedding_backward_data,
    .backward_weights = embedding_backward_weights,
    .flops = embedding_flops,
    .bwd_ignores_y = true,
    .takes_bf16 = embedding_takes_bf16,
    .data_input = true,
};
