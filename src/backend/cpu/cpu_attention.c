/*
 * cpu_attention.c — causal multi-head self-attention (backend.h's attn_fwd
 * and attn_bwd) in the flash-attention manner, FP32, with OpenMP over the
 * (batch row, head) pairs.
 *
 * x (b, t, 3c) holds q, k and v side by side on its last axis (GPT-2's
 * c_attn output); head h reads columns [h d, (h + 1) d) of each third,
 * d = c / heads; y (b, t, c) has the heads side by side (GPT-2's input to
 * c_proj).  No t x t matrix is ever held:
 *
 *   forward: for a tile of ATT_BQ queries, the keys in tiles of ATT_BK up
 *     to the tile's last query (the causal mask cuts the rest), each
 *     query row keeping a running maximum m, a running sum l of exp(s - m)
 *     and its unnormalised output; a new key tile rescales them by
 *     exp(m_old - m_new).  At the end y = acc / l and lse = m + log(l),
 *     the row's log-sum-exp, which the backward keeps (b, heads, t).
 *   backward (FlashAttention-2's order): D_i = dy_i . y_i per query; then
 *     for each key tile, every query at or after it: p = exp(s - lse)
 *     recomputed, dv_j += p dy_i, ds = p (dy_i . v_j - D_i),
 *     dk_j += ds q_i, dq_i += ds k_j; the tile's dk, dv are written once,
 *     dq accumulates in place and is scaled by 1 / sqrt(d) at the end.
 *
 * Per thread: O(ATT_BQ ATT_BK + ATT_BQ d) floats forward, O(t + ATT_BK d)
 * backward.  Determinism: a (batch row, head) pair is one task of one
 * thread, and its sums run in a fixed order (the tiles sit at fixed
 * positions of t; dot products in ATT_LANES lanes added in a fixed order),
 * so any split of the batch, any thread count and any recompute give the
 * same bits.
 */
#include "backend/cpu/cpu_impl.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define ATT_BQ 32   /* queries per tile (forward) */
#define ATT_BK 64   /* keys per tile */
#define ATT_LANES 8 /* partial sums of a dot product */

/* Below this many score evaluations (b heads t^2 / 2) one thread runs it. */
#define ATT_PAR_MIN 65536

/* sum a[q] b[q], q < n: ATT_LANES partial sums, then the tail, added in a
 * fixed order (vectorises without reassociation). */
GP_CPU_LOOPS
static float att_dot(const float *a, const float *b, int64_t n)
{
    float s[ATT_LANES] = {0};
    int64_t q = 0;
    for (; q + ATT_LANES <= n; q += ATT_LANES)
#pragma omp simd
        for (int r = 0; r < ATT_LANES; r++) s[r] += a[q + r] * b[q + r];
    float tail = 0.0f;
    for (; q < n; q++) tail += a[q] * b[q];
    return (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) + tail;
}

/* y[q] += p v[q], q < n */
GP_CPU_LOOPS
static void att_axpy(float *y, float p, const float *v, int64_t n)
{
#pragma omp simd
    for (int64_t q = 0; q < n; q++) y[q] += p * v[q];
}

typedef struct att_dims {
    int64_t t, heads, c, d, row; /* row: 3c, x's row stride */
    float scale;                 /* 1 / sqrt(d) */
} att_dims;

/* Forward of one (batch row bi, head h); buf holds ATT_BQ (ATT_BK + d + 2)
 * floats. */
GP_CPU_LOOPS
static void att_fwd_task(const att_dims *a, const float *x, float *y, float *lse, int64_t bi,
                         int64_t h, float *buf)
{
    const int64_t t = a->t, c = a->c, d = a->d, R = a->row;
    const float *xb = x + bi * t * R;
    float *s = buf, *acc = s + ATT_BQ * ATT_BK, *m = acc + ATT_BQ * d, *l = m + ATT_BQ;
    for (int64_t i0 = 0; i0 < t; i0 += ATT_BQ) {
        int64_t i1 = i0 + ATT_BQ < t ? i0 + ATT_BQ : t;
        for (int64_t r = 0; r < i1 - i0; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        memset(acc, 0, (size_t)((i1 - i0) * d) * sizeof *acc);
        for (int64_t j0 = 0; j0 < i1; j0 += ATT_BK) {
            int64_t j1 = j0 + ATT_BK < i1 ? j0 + ATT_BK : i1;
            for (int64_t i = i0 < j0 ? j0 : i0; i < i1; i++) {
                int64_t r = i - i0, jend = j1 < i + 1 ? j1 : i + 1;
                const float *qi = xb + i * R + h * d;
                float *sr = s + r * ATT_BK, mx = m[r];
                for (int64_t j = j0; j < jend; j++) {
                    float sc = att_dot(qi, xb + j * R + c + h * d, d) * a->scale;
                    sr[j - j0] = sc;
                    if (sc > mx) mx = sc;
                }
                float corr = expf(m[r] - mx), sum = 0.0f, *ar = acc + r * d;
                for (int64_t q = 0; q < d; q++) ar[q] *= corr;
                for (int64_t j = j0; j < jend; j++) {
                    float p = expf(sr[j - j0] - mx);
                    sum += p;
                    att_axpy(ar, p, xb + j * R + 2 * c + h * d, d);
                }
                l[r] = l[r] * corr + sum;
                m[r] = mx;
            }
        }
        for (int64_t i = i0; i < i1; i++) {
            int64_t r = i - i0;
            float inv = 1.0f / l[r], *yi = y + (bi * t + i) * c + h * d;
            const float *ar = acc + r * d;
            for (int64_t q = 0; q < d; q++) yi[q] = ar[q] * inv;
            if (lse) lse[(bi * a->heads + h) * t + i] = m[r] + logf(l[r]);
        }
    }
}

/* Backward of one (batch row bi, head h) into dx's q, k, v columns of the
 * head (dx =); buf holds t + 2 ATT_BK d floats. */
GP_CPU_LOOPS
static void att_bwd_task(const att_dims *a, const float *x, const float *y, const float *lse,
                         const float *dy, float *dx, int64_t bi, int64_t h, float *buf)
{
    const int64_t t = a->t, c = a->c, d = a->d, R = a->row;
    const float *xb = x + bi * t * R, *lb = lse + (bi * a->heads + h) * t;
    float *dxb = dx + bi * t * R;
    float *dd = buf, *dk = dd + t, *dv = dk + ATT_BK * d;
    for (int64_t i = 0; i < t; i++) {
        const float *dyi = dy + (bi * t + i) * c + h * d;
        dd[i] = att_dot(dyi, y + (bi * t + i) * c + h * d, d);
        memset(dxb + i * R + h * d, 0, (size_t)d * sizeof(float));
    }
    for (int64_t j0 = 0; j0 < t; j0 += ATT_BK) {
        int64_t j1 = j0 + ATT_BK < t ? j0 + ATT_BK : t;
        memset(dk, 0, (size_t)(2 * ATT_BK * d) * sizeof(float)); /* dk and dv */
        for (int64_t i = j0; i < t; i++) {
            int64_t jend = j1 < i + 1 ? j1 : i + 1;
            const float *qi = xb + i * R + h * d, *dyi = dy + (bi * t + i) * c + h * d;
            float *dqi = dxb + i * R + h * d;
            for (int64_t j = j0; j < jend; j++) {
                const float *kj = xb + j * R + c + h * d, *vj = kj + c;
                float p = expf(att_dot(qi, kj, d) * a->scale - lb[i]);
                float ds = p * (att_dot(dyi, vj, d) - dd[i]);
                att_axpy(dv + (j - j0) * d, p, dyi, d);
                att_axpy(dk + (j - j0) * d, ds, qi, d);
                att_axpy(dqi, ds, kj, d);
            }
        }
        for (int64_t j = j0; j < j1; j++) {
            float *dkj = dxb + j * R + c + h * d, *dvj = dkj + c;
            const float *sk = dk + (j - j0) * d, *sv = dv + (j - j0) * d;
            for (int64_t q = 0; q < d; q++) {
                dkj[q] = sk[q] * a->scale;
                dvj[q] = sv[q];
            }
        }
    }
    for (int64_t i = 0; i < t; i++) {
        float *dqi = dxb + i * R + h * d;
        for (int64_t q = 0; q < d; q++) dqi[q] *= a->scale;
    }
}

static att_dims att_dims_of(int64_t t, int64_t heads, int64_t c)
{
    att_dims a = {.t = t, .heads = heads, .c = c, .d = c / heads, .row = 3 * c};
    a.scale = 1.0f / sqrtf((float)a.d);
    return a;
}

static gp_status att_oom(gp_device *dev, const char *op, size_t bytes)
{
    return gp_error_set(GP_ERR_OOM,
                        "device %s: %s could not get %zu bytes of host memory for a thread's "
                        "tiles; free memory on the host or run fewer threads", dev->name, op,
                        bytes);
}

GP_CPU_LOOPS
gp_status gp_cpu_attn_fwd(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                          int64_t t, int64_t heads, int64_t c)
{
    att_dims a = att_dims_of(t, heads, c);
    const int64_t tasks = b * heads;
    const size_t bytes = (size_t)(ATT_BQ * (ATT_BK + a.d + 2)) * sizeof(float);
    int nt = dev->threads, failed = 0;
#pragma omp parallel num_threads(nt) if (tasks > 1 && tasks * t * t / 2 >= ATT_PAR_MIN)
    {
        float *buf = malloc(bytes);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t k = 0; k < tasks; k++)
            if (buf) att_fwd_task(&a, x, y, lse, k / heads, k % heads, buf);
        free(buf);
    }
    return failed ? att_oom(dev, "attn_fwd", bytes) : GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_attn_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                          const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                          int64_t c)
{
    att_dims a = att_dims_of(t, heads, c);
    const int64_t tasks = b * heads;
    const size_t bytes = (size_t)(t + 2 * ATT_BK * a.d) * sizeof(float);
    int nt = dev->threads, failed = 0;
#pragma omp parallel num_threads(nt) if (tasks > 1 && tasks * t * t / 2 >= ATT_PAR_MIN)
    {
        float *buf = malloc(bytes);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t k = 0; k < tasks; k++)
            if (buf) att_bwd_task(&a, x, y, lse, dy, dx, k / heads, k % heads, buf);
        free(buf);
    }
    return failed ? att_oom(dev, "attn_bwd", bytes) : GP_OK;
}
