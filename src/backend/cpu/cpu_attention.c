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
 * the bits of the forward over the window.  What this bought, per layer on
 * one thread of an AVX-512 EPYC at tiny-gpt's sizes (b 32, t 128, 4 heads
 * of 32): forward 7.3 -> 4.9 ms, backward 11.8 -> 8.3 ms; at GPT-2's
 * (b 2, t 1024, 12 heads of 64) forward 151 -> 62 ms, backward 313 -> 119.
 *
 * Multiply-adds are fmaf, which is one correctly rounded operation in every
 * ISA clone (an instruction on AVX2 and AVX-512, the C library's exact
 * fmaf on the baseline), so the clones give the same bits.  att_exp is
 * gpipe's own: exp(x) = 2^n e^r with |r| <= ln2 / 2 and Cephes' degree-6
 * polynomial for e^r (relative error under 2^-22 on FP32's range), 0 below
 * -87.3, so it vectorises where the C library's expf is a call per value.
 *
 * Per thread: O(d t_pad + ATT_QB ATT_BK (d + 4)) floats forward, twice the packed
 * part backward.  Determinism: a (batch row, head) pair is one task of one
 * thread, and its sums run in a fixed order (the tiles sit at fixed
 * positions of t; the tile's sum in ATT_LANES lanes added in a fixed
 * order), so any split of the batch, any thread count and any recompute
 * give the same bits.
 */
#include "backend/cpu/cpu_impl.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define ATT_BK 64    /* keys per tile: 4 AVX-512 vectors of scores */
#define ATT_BQ 32    /* queries per chunk (backward's dk, dv sums): a multiple of ATT_QB */
#define ATT_LANES 16 /* partial sums of a tile's probabilities */
#define ATT_QB 4     /* queries a block of att_tile_q / att_rows_q */

/* Below this many score evaluations (b heads t^2 / 2) one thread runs it. */
#define ATT_PAR_MIN 65536


/* sum a[q] b[q], q < n: 8 partial sums, then the tail, added in a fixed
 * order. */
static inline __attribute__((always_inline)) float att_dot(const float *a, const float *b,
                                                           int64_t n)
{
    float s[8] = {0};
    int64_t q = 0;
    for (; q + 8 <= n; q += 8)
#pragma omp simd
        for (int r = 0; r < 8; r++) s[r] = fmaf(a[q + r], b[q + r], s[r]);
    float tail = 0.0f;
    for (; q < n; q++) tail = fmaf(a[q], b[q], tail);
    return (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) + tail;
}

/* Sixteen floats as one value (GCC's vector extension: a zmm register in
 * the AVX-512 clone, two ymm in the AVX2 one, four xmm in the baseline), so
 * that a tile's running sums stay in registers across a loop.  The helpers
 * take pointers and are inlined, so no vector crosses a call (whose ABI
 * differs by clone). */
typedef float att_v16 __attribute__((vector_size(64)));
#define ATT_V 16

static inline __attribute__((always_inline)) void att_load(att_v16 *v, const float *p)
{
    memcpy(v, p, sizeof *v);
}

static inline __attribute__((always_inline)) void att_store(float *p, const att_v16 *v)
{
    memcpy(p, v, sizeof *v);
}

static inline __attribute__((always_inline)) void att_splat(att_v16 *v, float x)
{
    *v = (att_v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

/* acc = a b + acc, lane by lane, each one fmaf (one vector instruction) */
static inline __attribute__((always_inline)) void att_fma(att_v16 *acc, const att_v16 *a,
                                                          const att_v16 *b)
{
    att_v16 r;
#pragma GCC unroll 16
    for (int k = 0; k < ATT_V; k++) r[k] = fmaf((*a)[k], (*b)[k], (*acc)[k]);
    *acc = r;
}

/* s[r ATT_BK + j] = sum_u a[r S + u] bt[u tp + j], j < 16 nv, for the nq
 * (<= ATT_QB) rows r of a block: their products with one tile of a
 * transposed, padded operand (tp its row stride), each of the tile's first
 * nv vectors loaded once for all of them; the tile's other vectors 0.  A
 * row's sums run over u in order, one chain a vector: the same bits
 * whatever nq and nv (a lane's sum is its own).  nq and nv are constants
 * where it is inlined. */
static inline __attribute__((always_inline)) void
att_tile_qv(float *restrict s, const float *a, int64_t S, const float *restrict bt, int64_t d,
            int64_t tp, const int nq, const int nv)
{
    att_v16 acc[ATT_QB][4] = {{{0}}}, b[4], au;
    for (int64_t u = 0; u < d; u++) {
        const float *row = bt + u * tp;
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) att_load(&b[k], row + k * ATT_V);
#pragma GCC unroll 4
        for (int r = 0; r < nq; r++) {
            att_splat(&au, a[r * S + u]);
#pragma GCC unroll 4
            for (int k = 0; k < nv; k++) att_fma(&acc[r][k], &au, &b[k]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nq; r++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) att_store(s + r * ATT_BK + k * ATT_V, &acc[r][k]);
}

/* The block's products for its first n keys (the causal mask cuts the
 * rest; n the block's most): only the vectors that hold them. */
static inline __attribute__((always_inline)) void
att_tile_q(float *restrict s, const float *a, int64_t S, const float *restrict bt, int64_t d,
           int64_t tp, int n, const int nq)
{
    switch ((n + ATT_V - 1) / ATT_V) {
    case 1: att_tile_qv(s, a, S, bt, d, tp, nq, 1); break;
    case 2: att_tile_qv(s, a, S, bt, d, tp, nq, 2); break;
    case 3: att_tile_qv(s, a, S, bt, d, tp, nq, 3); break;
    default: att_tile_qv(s, a, S, bt, d, tp, nq, 4); break;
    }
}

/* att_tile_q with nq a constant where it is inlined. */
static inline __attribute__((always_inline)) void
att_tile(float *restrict s, const float *a, int64_t S, const float *restrict bt, int64_t d,
         int64_t tp, int n, int nq)
{
    switch (nq) {
    case 1: att_tile_q(s, a, S, bt, d, tp, n, 1); break;
    case 2: att_tile_q(s, a, S, bt, d, tp, n, 2); break;
    case 3: att_tile_q(s, a, S, bt, d, tp, n, 3); break;
    default: att_tile_q(s, a, S, bt, d, tp, n, 4); break;
    }
}

/* acc[r A + u] += sum_{j < n} p[r ATT_BK + j] rows[j R + u], u < d, for
 * the nq (<= ATT_QB) queries r of a block: their weighted sums of the same
 * n rows (R apart), each row's vectors loaded once for all of them.  Per
 * column, a query's sum runs in two chains, the even keys and the odd
 * ones, in order, added at the end (e + o) and then to acc: the same bits
 * whatever nq and whatever columns go together (ATT_RV vectors a pass
 * where nq > 1, all of d's vectors up to 4 for one query: its chains are
 * its only independent ones).  The columns past the last sixteen the same
 * way, one at a time.  A query whose p is 0 past its own keys (the block's
 * shorter rows) adds exact zeros there. */
#define ATT_RV 2 /* column vectors a pass of att_rows_q for a block */
static inline __attribute__((always_inline)) void
att_rows_pass(float *restrict acc, int64_t A, const float *p, const float *restrict rows,
              int64_t R, int n, int64_t u0, const int nq, const int nv)
{
    att_v16 e[ATT_QB][4] = {{{0}}}, o[ATT_QB][4] = {{{0}}}, v[4], pj;
    const float *col = rows + u0;
    int j = 0;
    for (; j + 2 <= n; j += 2) {
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) att_load(&v[k], col + j * R + k * ATT_V);
#pragma GCC unroll 4
        for (int r = 0; r < nq; r++) {
            att_splat(&pj, p[r * ATT_BK + j]);
#pragma GCC unroll 4
            for (int k = 0; k < nv; k++) att_fma(&e[r][k], &pj, &v[k]);
        }
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) att_load(&v[k], col + (j + 1) * R + k * ATT_V);
#pragma GCC unroll 4
        for (int r = 0; r < nq; r++) {
            att_splat(&pj, p[r * ATT_BK + j + 1]);
#pragma GCC unroll 4
            for (int k = 0; k < nv; k++) att_fma(&o[r][k], &pj, &v[k]);
        }
    }
    if (j < n) {
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) att_load(&v[k], col + j * R + k * ATT_V);
#pragma GCC unroll 4
        for (int r = 0; r < nq; r++) {
            att_splat(&pj, p[r * ATT_BK + j]);
#pragma GCC unroll 4
            for (int k = 0; k < nv; k++) att_fma(&e[r][k], &pj, &v[k]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nq; r++)
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) {
            att_v16 a;
            att_load(&a, acc + r * A + u0 + k * ATT_V);
            a += e[r][k] + o[r][k];
            att_store(acc + r * A + u0 + k * ATT_V, &a);
        }
}

static inline __attribute__((always_inline)) void
att_rows_q(float *restrict acc, int64_t A, const float *p, const float *restrict rows, int64_t R,
           int n, int64_t d, const int nq)
{
    int64_t u0 = 0;
    if (nq == 1) {
        for (; u0 + 4 * ATT_V <= d; u0 += 4 * ATT_V) att_rows_pass(acc, A, p, rows, R, n, u0, 1, 4);
        for (; u0 + 2 * ATT_V <= d; u0 += 2 * ATT_V) att_rows_pass(acc, A, p, rows, R, n, u0, 1, 2);
        for (; u0 + ATT_V <= d; u0 += ATT_V) att_rows_pass(acc, A, p, rows, R, n, u0, 1, 1);
    } else {
        for (; u0 + ATT_RV * ATT_V <= d; u0 += ATT_RV * ATT_V)
            att_rows_pass(acc, A, p, rows, R, n, u0, nq, ATT_RV);
        for (; u0 + ATT_V <= d; u0 += ATT_V) att_rows_pass(acc, A, p, rows, R, n, u0, nq, 1);
    }
    for (int64_t u = u0; u < d; u++)
        for (int r = 0; r < nq; r++) {
            const float *pr = p + r * ATT_BK;
            float e = 0.0f, o = 0.0f;
            int j = 0;
            for (; j + 2 <= n; j += 2) {
                e = fmaf(pr[j], rows[j * R + u], e);
                o = fmaf(pr[j + 1], rows[(j + 1) * R + u], o);
            }
            if (j < n) e = fmaf(pr[j], rows[j * R + u], e);
            acc[r * A + u] += e + o;
        }
}

/* att_rows_q with nq a constant where it is inlined. */
static inline __attribute__((always_inline)) void
att_rows(float *restrict acc, int64_t A, const float *p, const float *restrict rows, int64_t R,
         int n, int64_t d, int nq)
{
    switch (nq) {
    case 1: att_rows_q(acc, A, p, rows, R, n, d, 1); break;
    case 2: att_rows_q(acc, A, p, rows, R, n, d, 2); break;
    case 3: att_rows_q(acc, A, p, rows, R, n, d, 3); break;
    default: att_rows_q(acc, A, p, rows, R, n, d, 4); break;
    }
}

/* dst[u tp + j] = src[j R + u]: the head's d columns of t rows transposed,
 * rows t..tp zero. */
static inline __attribute__((always_inline)) void att_pack_t(float *restrict dst,
                                                             const void *restrict src, int64_t t,
                                                             int64_t tp, int64_t d, int64_t R,
                                                             const bool b16)
{
    for (int64_t u = 0; u < d; u++) {
        float *row = dst + u * tp;
        for (int64_t j = 0; j < t; j++) row[j] = B16_LD(src, j * R + u);
        for (int64_t j = t; j < tp; j++) row[j] = 0.0f;
    }
}

/* dst[j d + u] = src[j R + u]: the head's t rows of d columns, widened
 * (bf16 storage: rows the FP32 kernel then reads R = d apart). */
static inline __attribute__((always_inline)) void att_pack_rows(float *restrict dst,
                                                                const uint16_t *restrict src,
                                                                int64_t t, int64_t d, int64_t R)
{
    for (int64_t j = 0; j < t; j++)
        for (int64_t u = 0; u < d; u++) dst[j * d + u] = gp_ew_bf16_value(src[j * R + u]);
}

/* max(m, s[0..n)), n <= ATT_BK, in ATT_LANES lanes (a maximum is exact in
 * any order). */
static inline __attribute__((always_inline)) float att_tile_max(const float *s, int n, float m)
{
    float lane[ATT_LANES];
    for (int r = 0; r < ATT_LANES; r++) lane[r] = m;
    for (int b = 0; b < ATT_BK; b += ATT_LANES)
#pragma omp simd
        for (int r = 0; r < ATT_LANES; r++) {
            float v = b + r < n ? s[b + r] : m;
            lane[r] = v > lane[r] ? v : lane[r];
        }
    for (int w = ATT_LANES / 2; w > 0; w /= 2)
        for (int r = 0; r < w; r++) lane[r] = lane[r + w] > lane[r] ? lane[r + w] : lane[r];
    return lane[0];
}

/* The sum of p[0..ATT_BK) in ATT_LANES lanes, added in a fixed order. */
static inline __attribute__((always_inline)) float att_tile_sum(const float *p)
{
    float lane[ATT_LANES] = {0};
    for (int b = 0; b < ATT_BK; b += ATT_LANES)
#pragma omp simd
        for (int r = 0; r < ATT_LANES; r++) lane[r] += p[b + r];
    for (int w = ATT_LANES / 2; w > 0; w /= 2)
        for (int r = 0; r < w; r++) lane[r] += lane[r + w];
    return lane[0];
}

/* dst[u ATT_BK + j] += sum_{r < nq} src[r S + u] m[r ATT_BK + j], u < d,
 * j < ATT_BK: a chunk's transposed weight-gradient-like sum (dv^T += dy^T P,
 * dk^T += q^T dS), nu rows u of dst in 4 nu registers while the chunk's
 * rows r go by in order, so each dst row is read and written once a chunk
 * and each row of m is loaded once for nu of them.  An element's sum runs
 * over r in order whatever nu: the same bits. */
static inline __attribute__((always_inline)) void
att_acc_t_rows(float *restrict dst, const float *src, int64_t S, const float *restrict m, int nq,
               int64_t u, const int nu)
{
    att_v16 a[4][4], mv[4], su;
#pragma GCC unroll 4
    for (int w = 0; w < nu; w++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) att_load(&a[w][k], dst + (u + w) * ATT_BK + k * ATT_V);
    for (int r = 0; r < nq; r++) {
        const float *mr = m + r * ATT_BK;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) att_load(&mv[k], mr + k * ATT_V);
#pragma GCC unroll 4
        for (int w = 0; w < nu; w++) {
            att_splat(&su, src[r * S + u + w]);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) att_fma(&a[w][k], &su, &mv[k]);
        }
    }
#pragma GCC unroll 4
    for (int w = 0; w < nu; w++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) att_store(dst + (u + w) * ATT_BK + k * ATT_V, &a[w][k]);
}

static inline __attribute__((always_inline)) void att_acc_t(float *restrict dst,
                                                            const float *src, int64_t S,
                                                            const float *restrict m, int nq,
                                                            int64_t d)
{
    int64_t u = 0;
    for (; u + 4 <= d; u += 4) att_acc_t_rows(dst, src, S, m, nq, u, 4);
    for (; u < d; u++) att_acc_t_rows(dst, src, S, m, nq, u, 1);
}

typedef struct att_dims {
    int64_t t, tp, heads, c, d, row; /* tp: t padded to whole tiles; row: c + 2 kvh d */
    int64_t kvh, rep;                /* k's and v's heads; query heads per k, v head */
    int64_t vc;                      /* v's first column (k's: c) */
    float scale;                     /* 1 / sqrt(d) */
} att_dims;

/* Where one forward task reads and writes: queries i = 0 .. nq - 1 at
 * positions pos + i, each attending keys 0 .. pos + i of the L = pos + nq
 * keys and values (rows R apart: x's own rows in training, the KV cache's
 * in decoding), q rows QR apart, the output's rows c apart. */
typedef struct att_src {
    const void *q, *k, *v;
    void *y;
    int64_t nq, pos, QR, KR;
} att_src;

/* Forward of one (batch row, head): the queries of src against its keys;
 * buf holds att_fwd_floats for L keys.  x, y FP32, or bf16 (b16: x
 * widened as it is packed, y rounded as it is stored, the FP32 kernel's
 * arithmetic between: the storage adapter's bits).  The queries go in
 * blocks of up to ATT_QB at absolute positions [ATT_QB k, ATT_QB (k + 1)),
 * so a block never straddles a tile (ATT_BK is a multiple of ATT_QB) and
 * all its queries see the same tiles; the block's probabilities weigh the
 * values' rows together (att_rows), each query's sum in the same order
 * whatever else is in its block.  So a query's result depends on its q,
 * its keys and values and their positions only, and a query decoded at
 * position p against a cache gives the bits it gets in a forward over the
 * window (where its block's later queries add exact zeros past its own
 * keys). */
static inline __attribute__((always_inline)) void
att_fwd_body(const att_dims *a, const att_src *src, float *lse, float *buf, const bool b16)
{
    const int64_t L = src->pos + src->nq, tp = (L + ATT_BK - 1) / ATT_BK * ATT_BK;
    const int64_t c = a->c, d = a->d, KR = src->KR;
    float *kt = buf, *s = kt + d * tp, *q = s + ATT_QB * ATT_BK, *acc = q + ATT_QB * d;
    float *vp = acc + ATT_QB * d;
    att_pack_t(kt, src->k, L, tp, d, KR, b16);
    /* the values' rows: the source's own (FP32), or widened into vp, d apart */
    const float *vb = b16 ? vp : (const float *)src->v;
    const int64_t vs = b16 ? d : KR;
    if (b16) att_pack_rows(vp, (const uint16_t *)src->v, L, d, KR);
    for (int64_t q0 = 0; q0 < src->nq;) {
        const int64_t i0 = src->pos + q0; /* the block's first position */
        const int nb = (int)(ATT_QB - i0 % ATT_QB < src->nq - q0 ? ATT_QB - i0 % ATT_QB
                                                                 : src->nq - q0);
        float m[ATT_QB], l[ATT_QB];
        for (int r = 0; r < nb; r++) {
            for (int64_t u = 0; u < d; u++)
                q[r * d + u] = B16_LD(src->q, (q0 + r) * src->QR + u) * a->scale;
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        memset(acc, 0, (size_t)(nb * d) * sizeof *acc);
        const int64_t last = i0 + nb - 1; /* the block's last position */
        for (int64_t j0 = 0; j0 <= last; j0 += ATT_BK) {
            const int nmax = (int)(last + 1 - j0 < ATT_BK ? last + 1 - j0 : ATT_BK);
            att_tile(s, q, d, kt + j0, d, tp, nmax, nb);
            for (int r = 0; r < nb; r++) {
                float *sr = s + r * ATT_BK;
                int n = (int)(i0 + r + 1 - j0 < ATT_BK ? i0 + r + 1 - j0 : ATT_BK); /* keys <= i */
                float mx = att_tile_max(sr, n, m[r]);
#pragma omp simd
                for (int j = 0; j < ATT_BK; j++) {
                    float e = gp_cpu_exp(sr[j] - mx); /* computed for all: a select vectorises */
                    sr[j] = j < n ? e : 0.0f;
                }
                float corr = gp_cpu_exp(m[r] - mx); /* 0 on the first tile (m = -inf) */
                for (int64_t u = 0; u < d; u++) acc[r * d + u] *= corr;
                l[r] = fmaf(l[r], corr, att_tile_sum(sr));
                m[r] = mx;
            }
            att_rows(acc, d, s, vb + j0 * vs, vs, nmax, d, nb);
        }
        for (int r = 0; r < nb; r++) {
            float inv = 1.0f / l[r];
            for (int64_t u = 0; u < d; u++)
                B16_ST(src->y, (q0 + r) * c + u, acc[r * d + u] * inv);
            if (lse) lse[q0 + r] = m[r] + logf(l[r]);
        }
        q0 += nb;
    }
}

/* Training's and evaluation's forward of (batch row bi, head h): x's own
 * rows are the keys. */
static inline __attribute__((always_inline)) void
att_fwd_x(const att_dims *a, const void *x, void *y, float *lse, int64_t bi, int64_t h,
          float *buf, const bool b16)
{
    const int64_t t = a->t, R = a->row, xo = bi * t * R; /* x's first element of the row */
    const int64_t ko = a->c + (h / a->rep) * a->d, vo = a->vc + (h / a->rep) * a->d;
    const size_t es = b16 ? 2 : 4;
    att_src src = {.q = (const char *)x + (size_t)(xo + h * a->d) * es,
                   .k = (const char *)x + (size_t)(xo + ko) * es,
                   .v = (const char *)x + (size_t)(xo + vo) * es,
                   .y = (char *)y + (size_t)(bi * t * a->c + h * a->d) * es,
                   .nq = t, .pos = 0, .QR = R, .KR = R};
    att_fwd_body(a, &src, lse ? lse + (bi * a->heads + h) * t : NULL, buf, b16);
}

/* The floats a thread's forward tiles take (bf16: the values widened too). */
static int64_t att_fwd_floats(const att_dims *a, bool b16)
{
    return a->d * a->tp + ATT_QB * (ATT_BK + 2 * a->d) + (b16 ? a->t * a->d : 0);
}

/* Backward of one (batch row bi, k and v head g) into dx's columns of g
 * and of the query heads that share it, h = g rep .. g rep + rep - 1, in
 * that order (dx =; MHA: rep 1, the head's own); buf holds att_bwd_floats.
 * bf16 (b16): x, y and dy widened as they are read, dq summed in FP32 in
 * buf and dk, dv, dq rounded once as they are stored (the storage
 * adapter's bits). */
static inline __attribute__((always_inline)) void
att_bwd_body(const att_dims *a, const void *x, const void *y, const float *lse, const void *dy,
             void *dx, int64_t bi, int64_t g, float *buf, const bool b16)
{
    const int64_t t = a->t, tp = a->tp, c = a->c, d = a->d, R = a->row, rep = a->rep;
    const int64_t xo = bi * t * R, yo = bi * t * c; /* the row's first elements */
    const int64_t ko = c + g * d, vo = a->vc + g * d;
    float *kt = buf, *vt = kt + d * tp, *dd = vt + d * tp, *dkt = dd + rep * t;
    float *dvt = dkt + d * ATT_BK, *p = dvt + d * ATT_BK, *ds = p + ATT_BQ * ATT_BK;
    /* bf16: the chunk's q and dy rows widened (ATT_BQ d each), the keys'
     * rows widened (t d), dq's FP32 sums (rep t d) */
    float *qw = ds + ATT_BQ * ATT_BK, *dyw = qw + ATT_BQ * d, *kw = dyw + ATT_BQ * d;
    float *dqs = kw + t * d;
#define ATT_X(off) (b16 ? (const void *)((const uint16_t *)x + (off)) \
                        : (const void *)((const float *)x + (off)))
    att_pack_t(kt, ATT_X(xo + ko), t, tp, d, R, b16);
    att_pack_t(vt, ATT_X(xo + vo), t, tp, d, R, b16);
#undef ATT_X
    if (b16) att_pack_rows(kw, (const uint16_t *)x + xo + ko, t, d, R);
    /* the keys' rows (dq's sums read them): x's own (FP32) or kw, d apart */
    const float *kb = b16 ? kw : (const float *)x + xo + ko;
    const int64_t ks = b16 ? d : R;
    /* head h's dq rows: dx's own (FP32), or its part of dqs, d apart */
#define ATT_DQ(h) (b16 ? dqs + ((h) - g * rep) * t * d : (float *)dx + xo + (h) * d)
    for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
        float *dqb = ATT_DQ(h), *ddh = dd + (h - g * rep) * t;
        for (int64_t i = 0; i < t; i++) {
            const float *dyr, *yr; /* dy_i, y_i: dy's and y's own, or widened */
            if (b16) {
                for (int64_t u = 0; u < d; u++) {
                    dyw[u] = B16_LD(dy, yo + i * c + h * d + u);
                    qw[u] = B16_LD(y, yo + i * c + h * d + u);
                }
                dyr = dyw;
                yr = qw;
            } else {
                dyr = (const float *)dy + yo + i * c + h * d;
                yr = (const float *)y + yo + i * c + h * d;
            }
            ddh[i] = att_dot(dyr, yr, d);
            memset(dqb + i * ks, 0, (size_t)d * sizeof(float));
        }
    }
    for (int64_t j0 = 0; j0 < t; j0 += ATT_BK) {
        int64_t j1 = j0 + ATT_BK < t ? j0 + ATT_BK : t;
        memset(dkt, 0, (size_t)(2 * ATT_BK * d) * sizeof(float)); /* dk^T and dv^T */
        for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
            const float *lb = lse + (bi * a->heads + h) * t, *ddh = dd + (h - g * rep) * t;
            float *dqb = ATT_DQ(h);
            for (int64_t i0 = j0; i0 < t; i0 += ATT_BQ) {
                int nq = (int)(i0 + ATT_BQ < t ? ATT_BQ : t - i0);
                /* the chunk's q and dy rows: x's and dy's own, or widened */
                const float *qc = b16 ? qw : (const float *)x + xo + i0 * R + h * d;
                const float *dyc = b16 ? dyw : (const float *)dy + yo + i0 * c + h * d;
                const int64_t qs = b16 ? d : R, dys = b16 ? d : c;
                if (b16)
                    for (int r = 0; r < nq; r++)
                        for (int64_t u = 0; u < d; u++) {
                            qw[r * d + u] = B16_LD(x, xo + (i0 + r) * R + h * d + u);
                            dyw[r * d + u] = B16_LD(dy, yo + (i0 + r) * c + h * d + u);
                        }
                /* ATT_QB queries at a time (i0 is a multiple of ATT_BQ, so
                 * of ATT_QB): their tiles of q_i . k_j (unscaled) and
                 * dy_i . v_j, P and dS (0 past each one's own keys), and
                 * dq_i += dS_i K over the tile */
                for (int r0 = 0; r0 < nq; r0 += ATT_QB) {
                    const int nb = nq - r0 < ATT_QB ? nq - r0 : ATT_QB;
                    const int64_t il = i0 + r0 + nb - 1; /* the block's last query */
                    const int nmax = (int)(il + 1 - j0 < ATT_BK ? il + 1 - j0 : ATT_BK);
                    att_tile(p + r0 * ATT_BK, qc + r0 * qs, qs, kt + j0, d, tp, nmax, nb);
                    att_tile(ds + r0 * ATT_BK, dyc + r0 * dys, dys, vt + j0, d, tp, nmax, nb);
                    for (int r = r0; r < r0 + nb; r++) {
                        const int64_t i = i0 + r;
                        float *pr = p + r * ATT_BK, *dsr = ds + r * ATT_BK;
                        const int n = (int)(i + 1 - j0 < ATT_BK ? i + 1 - j0 : ATT_BK);
                        const float li = lb[i], di = ddh[i];
#pragma omp simd
                        for (int j = 0; j < ATT_BK; j++) {
                            float e = gp_cpu_exp(fmaf(pr[j], a->scale, -li));
                            float pj = j < n ? e : 0.0f;
                            pr[j] = pj;
                            dsr[j] = pj * (dsr[j] - di);
                        }
                    }
                    att_rows(dqb + (i0 + r0) * ks, ks, ds + r0 * ATT_BK, kb + j0 * ks, ks, nmax,
                             d, nb);
                }
                /* dv^T += dy^T P and dk^T += q^T dS over the chunk's queries */
                att_acc_t(dvt, dyc, dys, p, nq, d);
                att_acc_t(dkt, qc, qs, ds, nq, d);
            }
        }
        for (int64_t j = j0; j < j1; j++)
            for (int64_t u = 0; u < d; u++) {
                B16_ST(dx, xo + j * R + ko + u, dkt[u * ATT_BK + (j - j0)] * a->scale);
                B16_ST(dx, xo + j * R + vo + u, dvt[u * ATT_BK + (j - j0)]);
            }
    }
    for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
        float *dqb = ATT_DQ(h);
        for (int64_t i = 0; i < t; i++)
            for (int64_t u = 0; u < d; u++) {
                float v = dqb[i * ks + u] * a->scale;
                if (b16) B16_ST(dx, xo + i * R + h * d + u, v);
                else dqb[i * ks + u] = v;
            }
    }
#undef ATT_DQ
}

/* The floats a thread's backward tiles take. */
static int64_t att_bwd_floats(const att_dims *a, bool b16)
{
    return 2 * a->d * a->tp + a->rep * a->t + 2 * ATT_BK * (a->d + ATT_BQ) +
           (b16 ? 2 * ATT_BQ * a->d + (1 + a->rep) * a->t * a->d : 0);
}

GP_CPU_LOOPS
static void att_fwd_task(const att_dims *a, const float *x, float *y, float *lse, int64_t bi,
                         int64_t h, float *buf)
{
    att_fwd_x(a, x, y, lse, bi, h, buf, false);
}

GP_CPU_LOOPS
static void att_fwd_task_bf16(const att_dims *a, const uint16_t *x, uint16_t *y, float *lse,
                              int64_t bi, int64_t h, float *buf)
{
    att_fwd_x(a, x, y, lse, bi, h, buf, true);
}

GP_CPU_LOOPS
static void att_bwd_task(const att_dims *a, const float *x, const float *y, const float *lse,
                         const float *dy, float *dx, int64_t bi, int64_t h, float *buf)
{
    att_bwd_body(a, x, y, lse, dy, dx, bi, h, buf, false);
}

GP_CPU_LOOPS
static void att_bwd_task_bf16(const att_dims *a, const uint16_t *x, const uint16_t *y,
                              const float *lse, const uint16_t *dy, uint16_t *dx, int64_t bi,
                              int64_t h, float *buf)
{
    att_bwd_body(a, x, y, lse, dy, dx, bi, h, buf, true);
}

static att_dims att_dims_of(int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    att_dims a = {.t = t, .heads = heads, .c = c, .d = c / heads, .kvh = kv_heads,
                  .rep = heads / kv_heads};
    a.row = c + 2 * kv_heads * a.d;
    a.vc = c + kv_heads * a.d;
    a.tp = (t + ATT_BK - 1) / ATT_BK * ATT_BK;
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
            att_fwd_task(&a, x, y, lse, k / heads, k % heads, buf));
    return GP_OK;
}

gp_status gp_cpu_attn_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                          const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                          int64_t kv_heads, int64_t c)
{
    att_dims a = att_dims_of(t, heads, kv_heads, c);
    const int64_t tasks = b * kv_heads; /* a (batch row, k and v head) each */
    ATT_RUN(dev, tasks, tasks * t * t / 2, att_bwd_floats(&a, false), "attn_bwd",
            att_bwd_task(&a, x, y, lse, dy, dx, k / kv_heads, k % kv_heads, buf));
    return GP_OK;
}

gp_status gp_cpu_attn_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                               int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    att_dims a = att_dims_of(t, heads, kv_heads, c);
    const int64_t tasks = b * heads;
    ATT_RUN(dev, tasks, tasks * t * t / 2, att_fwd_floats(&a, true), "attn_fwd_bf16",
            att_fwd_task_bf16(&a, x, y, lse, k / heads, k % heads, buf));
    return GP_OK;
}

gp_status gp_cpu_attn_bwd_bf16(gp_device *dev, const uint16_t *x, const uint16_t *y,
                               const float *lse, const uint16_t *dy, uint16_t *dx, int64_t b,
                               int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    att_dims a = att_dims_of(t, heads, kv_heads, c);
    const int64_t tasks = b * kv_heads; /* a (batch row, k and v head) each */
    ATT_RUN(dev, tasks, tasks * t * t / 2, att_bwd_floats(&a, true), "attn_bwd_bf16",
            att_bwd_task_bf16(&a, x, y, lse, dy, dx, k / kv_heads, k % kv_heads, buf));
    return GP_OK;
}

GP_CPU_LOOPS
static void att_cached_task(const att_dims *a, const att_src *src, float *buf, bool b16)
{
    if (b16) att_fwd_body(a, src, NULL, buf, true);
    else att_fwd_body(a, src, NULL, buf, false);
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
        att_cached_task(&a, &src, buf, b16);
    }));
    return GP_OK;
}
