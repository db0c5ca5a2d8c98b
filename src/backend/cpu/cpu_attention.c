/*
 * cpu_attention.c — causal multi-head self-attention (backend.h's attn_fwd
 * and attn_bwd) in the flash-attention manner, FP32, with OpenMP over the
 * (batch row, head) pairs.
 *
 * x (b, t, 3c) holds q, k and v side by side on its last axis (GPT-2's
 * c_attn output); head h reads columns [h d, (h + 1) d) of each third,
 * d = c / heads; y (b, t, c) has the heads side by side (GPT-2's input to
 * c_proj).  Grouped-query attention (Llama's kv_heads below heads): x is
 * (b, t, c + 2 kv_heads d), q's heads and then k's and v's kv_heads, and
 * query head h reads k and v head h / (heads / kv_heads) where they are;
 * the backward's task is a k and v head with its query heads in order, so
 * their dk and dv sums stay in one thread.  No t x t matrix is ever held:
 *
 *   forward: for each query, the keys in tiles of ATT_BK up to the query
 *     (the causal mask cuts the rest), the row keeping a running maximum
 *     m, a running sum l of exp(s - m) and its unnormalised output; a new
 *     key tile rescales them by exp(m_old - m_new).  At the end
 *     y = acc / l and lse = m + log(l), the row's log-sum-exp, which the
 *     backward keeps (b, heads, t).
 *   backward (FlashAttention-2's order): D_i = dy_i . y_i per query; then
 *     for each key tile, every query at or after it: p = exp(s - lse)
 *     recomputed, dv_j += p dy_i, ds = p (dy_i . v_j - D_i),
 *     dk_j += ds q_i, dq_i += ds k_j; the tile's dk, dv are written once,
 *     dq accumulates in place and is scaled by 1 / sqrt(d) at the end.
 *
 * The grain (what makes it fast): a task first packs its head's keys (and,
 * backward, values) transposed, k^T (d, t) zero-padded to whole tiles, so
 * a query's ATT_BK scores are d multiply-adds of one q value into ATT_BK
 * lanes (s[j] += q[u] k^T[u][j]: whole vectors, no horizontal sums); the
 * tile's exponentials are one vectorised loop (att_exp, below); dk and dv
 * accumulate transposed the same way.  Queries go in blocks of ATT_QB = 4
 * consecutive positions (aligned to multiples of 4, so a block never
 * straddles a tile): a tile's k^T vectors are loaded once for the block's
 * four score rows (att_tile), and a tile's value rows once for the four
 * weighted sums p v_j forward, the key rows once for four ds k_j backward
 * (att_rows), 16 accumulators in registers; dk^T and dv^T take four of
 * their rows a pass (att_acc_t).  A query's sums run in the same order
 * whatever shares its block, so a query decoded alone against a cache gets
 * the bits of the forward over the window.  The kernels are built twice
 * (cpu_attention_body.h): with 16-float vectors for processors with
 * AVX-512 and 8-float ones for the others, whose 16 ymm registers the wide
 * blocks overflowed (the AVX2 clone of the 16-wide code ran 4 to 8 times
 * slower than AVX-512's); the same bits either way (test_attention), and
 * GPIPE_ATTN_WIDTH=8 takes the narrow ones on any processor.  What this
 * bought, per layer on one thread of an AVX-512 EPYC at tiny-gpt's sizes
 * (b 32, t 128, 4 heads of 32): forward 7.3 -> 4.9 ms, backward 11.8 -> 8.3 ms; at GPT-2's
 * (b 2, t 1024, 12 heads of 64) forward 151 -> 62 ms, backward 313 -> 119;
 * the AVX2 build on the same machine, tiny-gpt's 28 -> 8.5 and 58 -> 12.7
 * ms, GPT-2's 539 -> 123 and 1184 -> 243 ms.
 *
 * Multiply-adds are fmaf, which is one correctly rounded operation in every
 * ISA clone (an instruction on AVX2 and AVX-512, the C library's exact
 * fmaf on the baseline), so the clones give the same bits.  att_exp is
 * gpipe's own: exp(x) = 2^n e^r with |r| <= ln2 / 2 and Cephes' degree-6
 * polynomial for e^r (relative error under 2^-22 on FP32's range), 0 below
 * -87.3, so it vectorises where the C library's expf is a call per value.
 *
 * Per thread: O(d t_pad + ATT_QB ATT_BK (d + 4)) floats forward, twice
 * the packed part backward.  Determinism: a (batch row, head) pair is one task of one
 * thread, and its sums run in a fixed order (the tiles sit at fixed
 * positions of t; the tile's sum in ATT_LANES lanes added in a fixed
 * order), so any split of the batch, any thread count and any recompute
 * give the same bits.
 */
#include "backend/cpu/cpu_attention.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Below this many score evaluations (b heads t^2 / 2) one thread runs it. */
#define ATT_PAR_MIN 65536

/* The 16-wide kernels where CPU devices run AVX-512 (gp_cpu_isa_has: the
 * processor's, as GPIPE_CPU_ISA caps it) and the build has them, else the
 * 8-wide ones: the same bits either way. */
static bool att_wide(void)
{
    static int wide = -1;
    int w = __atomic_load_n(&wide, __ATOMIC_RELAXED);
    if (w < 0) {
        const char *force = getenv("GPIPE_ATTN_WIDTH"); /* 8: the narrow ones anyway */
        w = gp_cpu_att_w16_built() && gp_cpu_isa_has(dnnl_cpu_isa_avx512_core) &&
            !(force && !strcmp(force, "8"));
        __atomic_store_n(&wide, w, __ATOMIC_RELAXED);
    }
    return w;
}

#define ATT_CALL(op, ...) \
    (att_wide() ? gp_cpu_att_##op##_w16(__VA_ARGS__) : gp_cpu_att_##op##_w8(__VA_ARGS__))

static gp_status att_oom(gp_device *dev, const char *op, size_t bytes)
{
    return gp_error_set(GP_ERR_OOM,
                        "device %s: %s could not get %zu bytes of host memory for a thread's "
                        "tiles; free memory on the host or run fewer threads", dev->name, op,
                        bytes);
}

/* The tasks ((batch row, head) pairs) over the device's threads, each
 * thread with its own tiles of `floats` floats; run(k, buf) runs task k;
 * `work`, the score evaluations, decides whether threads pay. */
#define ATT_RUN(dev, tasks, work, floats, op, RUN)                                           \
    do {                                                                                     \
        const size_t bytes_ = (size_t)(floats) * sizeof(float);                              \
        int nt_ = (dev)->threads, failed_ = 0;                                               \
        const int64_t work_ = (work);                                                        \
        _Pragma("omp parallel num_threads(nt_) if (tasks > 1 && work_ >= ATT_PAR_MIN)")    \
        {                                                                                    \
            float *buf = malloc(bytes_);                                                     \
            if (!buf) {                                                                      \
                _Pragma("omp atomic write") failed_ = 1;                                     \
            }                                                                                \
            _Pragma("omp for schedule(static)") for (int64_t k = 0; k < tasks; k++) if (buf) \
                RUN;                                                                         \
            free(buf);                                                                       \
        }                                                                                    \
        if (failed_) return att_oom(dev, op, bytes_);                                        \
    } while (0)

gp_status gp_cpu_attn_fwd(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                          int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    att_dims a = att_dims_of(t, heads, kv_heads, c);
    const int64_t tasks = b * heads;
    ATT_RUN(dev, tasks, tasks * t * t / 2, att_fwd_floats(&a, false), "attn_fwd",
            ATT_CALL(fwd, &a, x, y, lse, k / heads, k % heads, buf, false));
    return GP_OK;
}

gp_status gp_cpu_attn_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                          const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                          int64_t kv_heads, int64_t c)
{
    att_dims a = att_dims_of(t, heads, kv_heads, c);
    const int64_t tasks = b * kv_heads; /* a (batch row, k and v head) each */
    ATT_RUN(dev, tasks, tasks * t * t / 2, att_bwd_floats(&a, false), "attn_bwd",
            ATT_CALL(bwd, &a, x, y, lse, dy, dx, k / kv_heads, k % kv_heads, buf, false));
    return GP_OK;
}

gp_status gp_cpu_attn_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                               int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    att_dims a = att_dims_of(t, heads, kv_heads, c);
    const int64_t tasks = b * heads;
    ATT_RUN(dev, tasks, tasks * t * t / 2, att_fwd_floats(&a, true), "attn_fwd_bf16",
            ATT_CALL(fwd, &a, x, y, lse, k / heads, k % heads, buf, true));
    return GP_OK;
}

gp_status gp_cpu_attn_bwd_bf16(gp_device *dev, const uint16_t *x, const uint16_t *y,
                               const float *lse, const uint16_t *dy, uint16_t *dx, int64_t b,
                               int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    att_dims a = att_dims_of(t, heads, kv_heads, c);
    const int64_t tasks = b * kv_heads; /* a (batch row, k and v head) each */
    ATT_RUN(dev, tasks, tasks * t * t / 2, att_bwd_floats(&a, true), "attn_bwd_bf16",
            ATT_CALL(bwd, &a, x, y, lse, dy, dx, k / kv_heads, k % kv_heads, buf, true));
    return GP_OK;
}

gp_status gp_cpu_attn_cached(gp_device *dev, gp_dtype dt, const void *x, void *kv, void *y,
                             int64_t b, int64_t n, int64_t pos, int64_t cap, int64_t heads,
                             int64_t kv_heads, int64_t c)
{
    const bool b16 = dt == GP_BF16;
    const size_t es = b16 ? 2 : 4;
    att_dims a = att_dims_of(pos + n, heads, kv_heads, c);
    const int64_t R = a.row, KR = 2 * kv_heads * a.d;
    /* the new positions' k and v into the cache, as they are */
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t i = 0; i < n; i++)
            memcpy((char *)kv + (size_t)((bi * cap + pos + i) * KR) * es,
                   (const char *)x + (size_t)((bi * n + i) * R + c) * es, (size_t)KR * es);
    const int64_t tasks = b * heads;
    ATT_RUN(dev, tasks, tasks * n * (pos + n), att_fwd_floats(&a, b16), "attn_cached", ({
        const int64_t bi = k / heads, h = k % heads, g = h / a.rep;
        const char *row = (const char *)kv + (size_t)(bi * cap * KR) * es;
        att_src src = {.q = (const char *)x + (size_t)(bi * n * R + h * a.d) * es,
                       .k = row + (size_t)(g * a.d) * es,
                       .v = row + (size_t)(kv_heads * a.d + g * a.d) * es,
                       .y = (char *)y + (size_t)(bi * n * c + h * a.d) * es,
                       .nq = n, .pos = pos, .QR = R, .KR = KR};
        ATT_CALL(cached, &a, &src, buf, b16);
    }));
    return GP_OK;
}
