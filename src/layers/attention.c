/*
 * attention.c — causal multi-head self-attention, `attention: {heads: H}`.
 *
 * Input (N, ..., T, 3C): q, k and v side by side on the last axis, as
 * GPT-2's c_attn (a linear layer to 3C) makes them; every axis before the
 * last two is a batch axis.  Output (N, ..., T, C):
 *   y_h = softmax(q_h k_h^T / sqrt(C / H), key j <= query i) v_h
 * for each head h (columns [h C/H, (h+1) C/H) of each third), the heads
 * side by side, ready for c_proj.  `attention: {heads: H, kv_heads: G}`
 * is grouped-query attention (Llama's num_key_value_heads): the input is
 * (N, ..., T, (H + 2 G) d), q's H heads, then k's and v's G heads of d
 * (Hugging Face's q_proj, k_proj and v_proj stacked), and query head h
 * reads k and v head h / (H / G) where it is, never a copy per query
 * head; the output is (N, ..., T, H d).  The projections around it are ordinary
 * linear layers, so a Transformer block partitions and checkpoints like
 * any chain of layers; this layer has no parameters.
 *
 * The kernel is the device's (backend.h's attn_fwd / attn_bwd; CPU:
 * cpu_attention.c, blocked with an online softmax, never a T x T matrix).
 * Saved for backward: each row's log-sum-exp, (N', H, T) floats (N' the
 * product of the batch axes), O(N T H) and not O(N T^2); backward reads x,
 * y and it, and recomputes the probabilities.  The kernel's results do not
 * depend on the micro-batch split, the thread count or a recompute.
 */
#include "layers/layers_impl.h"

/* k's and v's heads: kv_heads, or heads where it is not given. */
static int64_t kv_of(const gp_layer_spec *s) { return s->kv_heads ? s->kv_heads : s->heads; }

/* The width of q (and of the output), C = heads d, of an input last axis w
 * = (heads + 2 kv_heads) d; 0 where w does not split so. */
static int64_t attention_c(const gp_layer_spec *s, int64_t w)
{
    int64_t all = s->heads + 2 * kv_of(s);
    return s->heads >= 1 && all > 0 && w % all == 0 ? w / all * s->heads : 0;
}

static gp_status attention_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    const gp_layer_spec *s = &l->spec;
    if (in->ndim < 3)
        return gp_layer_spec_error(l,
                                   "expected input (N, T, 3C) (q, k, v side by side on the last "
                                   "axis) but got %s; put a linear layer to 3C before it",
                                   gp_layers_shape_n(in, b, sizeof b));
    int64_t w = in->dims[in->ndim - 1], kv = kv_of(s);
    if (s->heads < 1 || kv < 1 || s->heads % kv)
        return gp_layer_spec_error(l, "heads = %lld and kv_heads = %lld: kv_heads must divide "
                                      "heads (each k and v head serves heads / kv_heads query "
                                      "heads); leave kv_heads out for as many as heads",
                                   (long long)s->heads, (long long)kv);
    if (kv == s->heads && w % 3)
        return gp_layer_spec_error(l,
                                   "the last axis of %s has %lld values, not a multiple of 3 "
                                   "(q, k and v of C each); make the layer before it give 3C",
                                   gp_layers_shape_n(in, b, sizeof b), (long long)w);
    if (kv == s->heads && (w / 3) % s->heads)
        return gp_layer_spec_error(l,
                                   "heads = %lld does not divide C = %lld (the input %s is 3C "
                                   "wide); choose heads that divide C",
                                   (long long)s->heads, (long long)(w / 3),
                                   gp_layers_shape_n(in, b, sizeof b));
    if (attention_c(s, w) == 0)
        return gp_layer_spec_error(l,
                                   "heads = %lld and kv_heads = %lld do not split the last axis "
                                   "of %s, %lld values, into q's heads and k's and v's heads of "
                                   "one size d ((heads + 2 kv_heads) d); give the linear layer "
                                   "before it (heads + 2 kv_heads) d outputs",
                                   (long long)s->heads, (long long)kv,
                                   gp_layers_shape_n(in, b, sizeof b), (long long)w);
    *out = *in;
    out->dims[in->ndim - 1] = attention_c(s, w);
    return GP_OK;
}

static gp_status attention_init(gp_layer *l, uint64_t seed) { return GP_OK; }

/* x's batch rows (every axis but the last two), T and C (q's width). */
static void attention_sizes(const gp_layer *l, const gp_tensor *x, int64_t *rows, int64_t *t,
                            int64_t *c)
{
    int nd = x->ndim;
    *t = x->dims[nd - 2];
    *c = attention_c(&l->spec, x->dims[nd - 1]);
    *rows = 1;
    for (int k = 0; k < nd - 2; k++) *rows *= x->dims[k];
}

static gp_status attention_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   gp_tensor *y, gp_saved *s)
{
    int64_t rows, t, c, heads = l->spec.heads;
    attention_sizes(l, x, &rows, &t, &c);
    if (rows * t == 0) return GP_OK;
    if (ctx->kv) { /* sampling: over the cache, which takes this input's k and v */
        GP_ASSERT(!ctx->training && ctx->kv->dtype == x->dtype &&
                  ctx->kv->ndim == 3 && ctx->kv->dims[0] == rows);
        return gp_dev_attn_cached(l->dev, x->dtype, gp_tensor_mem(x), gp_tensor_mem(ctx->kv),
                                  gp_tensor_mem(y), rows, t, ctx->pos0, ctx->kv->dims[1], heads,
                                  kv_of(&l->spec), c);
    }
    float *lse = NULL;
    if (ctx->training) { /* the rows' log-sum-exp, for backward */
        gp_shape ls = {3, {rows, heads, t, 0}};
        GP_TRY(gp_layers_saved_alloc(s, 0, l->dev, &ls));
        lse = gp_f32(&s->t[0]);
    }
    if (x->dtype == GP_BF16) /* bf16 storage, without the adapter (takes_bf16) */
        return gp_dev_attn_fwd_bf16(l->dev, gp_bf16(x), gp_bf16(y), lse, rows, t, heads,
                                    kv_of(&l->spec), c);
    return gp_dev_attn_fwd(l->dev, gp_f32(x), gp_f32(y), lse, rows, t, heads, kv_of(&l->spec), c);
}

static gp_status attention_backward_data(gp_layer *l, const gp_fwd_ctx *ctx,
                                         const gp_tensor *x, const gp_tensor *y,
                                         const gp_tensor *dy, gp_tensor *dx, gp_saved *s)
{
    int64_t rows, t, c;
    attention_sizes(l, x, &rows, &t, &c);
    if (rows * t == 0) return GP_OK;
    GP_ASSERT(gp_tensor_mem(&s->t[0]) != NULL); /* backward after a training forward only */
    if (x->dtype == GP_BF16)
        return gp_dev_attn_bwd_bf16(l->dev, gp_bf16(x), gp_bf16(y), gp_f32(&s->t[0]),
                                    gp_bf16(dy), gp_bf16(dx), rows, t, l->spec.heads, kv_of(&l->spec), c);
    return gp_dev_attn_bwd(l->dev, gp_f32(x), gp_f32(y), gp_f32(&s->t[0]), gp_f32(dy),
                           gp_f32(dx), rows, t, l->spec.heads, kv_of(&l->spec), c);
}

static bool attention_takes_bf16(const gp_layer *l) { return gp_dev_attn_bf16_has(l->dev); }

/* Per batch row: T (T + 1) / 2 (query, key) pairs, each a d-long dot product
 * for the score and a d-long update of the output per head, i.e. 4 C FLOPs
 * a pair over the heads. */
static double attention_flops(const gp_layer *l, int64_t n)
{
    const gp_shape *in = &l->in_shape;
    double t = (double)in->dims[in->ndim - 2];
    double c = (double)attention_c(&l->spec, in->dims[in->ndim - 1]);
    double rows = (double)n;
    for (int k = 1; k < in->ndim - 2; k++) rows *= (double)in->dims[k];
    return rows * t * (t + 1) / 2 * 4 * c;
}

static size_t attention_saved_bytes(const gp_layer *l, int64_t n)
{
    const gp_shape *in = &l->in_shape;
    int64_t rows = n;
    for (int k = 1; k < in->ndim - 2; k++) rows *= in->dims[k];
    return (size_t)(rows * l->spec.heads * in->dims[in->ndim - 2]) * sizeof(float);
}

const gp_layer_ops gp_attention_ops = {
    .type = GP_LAYER_ATTENTION,
    .infer = attention_infer,
    .init = attention_init,
    .forward = attention_forward,
    .takes_bf16 = attention_takes_bf16,
    .backward_data = attention_backward_data,
    .flops = attention_flops,
    .saved_bytes = attention_saved_bytes,
};
