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
 * accumulate transposed the same way.  What stays a d-long axpy per (query,
 * key) pair is p v_j forward and ds k_j backward.
 *
 * Multiply-adds are fmaf, which is one correctly rounded operation in every
 * ISA clone (an instruction on AVX2 and AVX-512, the C library's exact
 * fmaf on the baseline), so the clones give the same bits.  att_exp is
 * gpipe's own: exp(x) = 2^n e^r with |r| <= ln2 / 2 and Cephes' degree-6
 * polynomial for e^r (relative error under 2^-22 on FP32's range), 0 below
 * -87.3, so it vectorises where the C library's expf is a call per value.
 *
 * Per thread: O(d t_pad + ATT_BK (d + 4)) floats forward, twice the packed
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
#define ATT_BQ 32    /* queries per chunk (backward's dk, dv sums) */
#define ATT_LANES 16 /* partial sums of a tile's probabilities */

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

/* s[j] = sum_u a[u] bt[u tp + j], j < 16 nv: the first nv vectors of one
 * tile of products against a transposed, padded operand (tp its row
 * stride), the sums in registers: even u into one set of vectors, odd u
 * into another (twice the independent chains), added at the end; the
 * tile's other vectors 0.  nv is a constant where it is inlined. */
static inline __attribute__((always_inline)) void att_tile_nv(float *restrict s, const float *a,
                                                              const float *restrict bt,
                                                              int64_t d, int64_t tp, const int nv)
{
    att_v16 e[4] = {{0}, {0}, {0}, {0}}, o[4] = {{0}, {0}, {0}, {0}}, au, b;
    int64_t u = 0;
    for (; u + 2 <= d; u += 2) {
        const float *r0 = bt + u * tp, *r1 = r0 + tp;
        att_v16 a1;
        att_splat(&au, a[u]);
        att_splat(&a1, a[u + 1]);
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) {
            att_load(&b, r0 + k * ATT_V);
            att_fma(&e[k], &au, &b);
            att_load(&b, r1 + k * ATT_V);
            att_fma(&o[k], &a1, &b);
        }
    }
    if (u < d) {
        const float *r0 = bt + u * tp;
        att_splat(&au, a[u]);
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) {
            att_load(&b, r0 + k * ATT_V);
            att_fma(&e[k], &au, &b);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        e[k] += o[k];
        att_store(s + k * ATT_V, &e[k]); /* (past nv: zeros) */
    }
}

/* The tile's products for its first n keys (the causal mask cuts the
 * rest): only the vectors that hold them are computed, the rest are 0. */
static inline __attribute__((always_inline)) void att_tile(float *restrict s, const float *a,
                                                           const float *restrict bt,
                                                           int64_t d, int64_t tp, int n)
{
    switch ((n + ATT_V - 1) / ATT_V) {
    case 1: att_tile_nv(s, a, bt, d, tp, 1); break;
    case 2: att_tile_nv(s, a, bt, d, tp, 2); break;
    case 3: att_tile_nv(s, a, bt, d, tp, 3); break;
    default: att_tile_nv(s, a, bt, d, tp, 4); break;
    }
}

/* acc[u] += sum_{j < n} p[j] rows[j R + u], u < d: the weighted sum of n
 * rows (R apart) into one.  Sixteen columns at a time in registers, the
 * keys in four interleaved chains (j = 4k + 0..3; the last n mod 4 keys
 * into chain 0) added ((0 + 1) + (2 + 3)) at the end; the columns past
 * the last sixteen in the same order, one at a time. */
static inline __attribute__((always_inline)) void att_rows(float *restrict acc, const float *p,
                                                           const float *restrict rows, int64_t R,
                                                           int n, int64_t d)
{
    int64_t u0 = 0;
    for (; u0 + ATT_V <= d; u0 += ATT_V) {
        att_v16 r0 = {0}, r1 = {0}, r2 = {0}, r3 = {0}, pj, v, a;
        const float *col = rows + u0;
        int j = 0;
        for (; j + 4 <= n; j += 4) {
            att_splat(&pj, p[j]);
            att_load(&v, col + j * R);
            att_fma(&r0, &pj, &v);
            att_splat(&pj, p[j + 1]);
            att_load(&v, col + (j + 1) * R);
            att_fma(&r1, &pj, &v);
            att_splat(&pj, p[j + 2]);
            att_load(&v, col + (j + 2) * R);
            att_fma(&r2, &pj, &v);
            att_splat(&pj, p[j + 3]);
            att_load(&v, col + (j + 3) * R);
            att_fma(&r3, &pj, &v);
        }
        for (; j < n; j++) {
            att_splat(&pj, p[j]);
            att_load(&v, col + j * R);
            att_fma(&r0, &pj, &v);
        }
        att_load(&a, acc + u0);
        a += (r0 + r1) + (r2 + r3);
        att_store(acc + u0, &a);
    }
    for (int64_t u = u0; u < d; u++) {
        float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f, r3 = 0.0f;
        int j = 0;
        for (; j + 4 <= n; j += 4) {
            r0 = fmaf(p[j], rows[j * R + u], r0);
            r1 = fmaf(p[j + 1], rows[(j + 1) * R + u], r1);
            r2 = fmaf(p[j + 2], rows[(j + 2) * R + u], r2);
            r3 = fmaf(p[j + 3], rows[(j + 3) * R + u], r3);
        }
        for (; j < n; j++) r0 = fmaf(p[j], rows[j * R + u], r0);
        acc[u] += (r0 + r1) + (r2 + r3);
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
 * dk^T += q^T dS), two rows u of dst in eight registers while the chunk's
 * rows r go by in order, so each dst row is read and written once a chunk. */
static inline __attribute__((always_inline)) void att_acc_t(float *restrict dst,
                                                            const float *src, int64_t S,
                                                            const float *restrict m, int nq,
                                                            int64_t d)
{
    int64_t u = 0;
    for (; u + 2 <= d; u += 2) {
        float *d0 = dst + u * ATT_BK, *d1 = d0 + ATT_BK;
        att_v16 a[8], mv;
        for (int k = 0; k < 4; k++) {
            att_load(&a[k], d0 + k * ATT_V);
            att_load(&a[4 + k], d1 + k * ATT_V);
        }
        for (int r = 0; r < nq; r++) {
            const float *mr = m + r * ATT_BK;
            att_v16 s0, s1;
            att_splat(&s0, src[r * S + u]);
            att_splat(&s1, src[r * S + u + 1]);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                att_load(&mv, mr + k * ATT_V);
                att_fma(&a[k], &s0, &mv);
                att_fma(&a[4 + k], &s1, &mv);
            }
        }
        for (int k = 0; k < 4; k++) {
            att_store(d0 + k * ATT_V, &a[k]);
            att_store(d1 + k * ATT_V, &a[4 + k]);
        }
    }
    for (; u < d; u++) {
        float *d0 = dst + u * ATT_BK;
        for (int r = 0; r < nq; r++) {
            const float su = src[r * S + u], *mr = m + r * ATT_BK;
#pragma omp simd
            for (int j = 0; j < ATT_BK; j++) d0[j] = fmaf(su, mr[j], d0[j]);
        }
    }
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
 * arithmetic between: the storage adapter's bits).  A query's result
 * depends on its q, its keys and values and their positions only (the
 * tiles sit at fixed key positions), so a query decoded at position p
 * against a cache gives the bits it gets in a forward over the window. */
static inline __attribute__((always_inline)) void
att_fwd_body(const att_dims *a, const att_src *src, float *lse, float *buf, const bool b16)
{
    const int64_t L = src->pos + src->nq, tp = (L + ATT_BK - 1) / ATT_BK * ATT_BK;
    const int64_t c = a->c, d = a->d, KR = src->KR;
    float *kt = buf, *s = kt + d * tp, *q = s + ATT_BK, *acc = q + d, *vp = acc + d;
    att_pack_t(kt, src->k, L, tp, d, KR, b16);
    /* the values' rows: the source's own (FP32), or widened into vp, d apart */
    const float *vb = b16 ? vp : (const float *)src->v;
    const int64_t vs = b16 ? d : KR;
    if (b16) att_pack_rows(vp, (const uint16_t *)src->v, L, d, KR);
    for (int64_t qi = 0; qi < src->nq; qi++) {
        const int64_t i = src->pos + qi; /* the query's position */
        for (int64_t u = 0; u < d; u++) q[u] = B16_LD(src->q, qi * src->QR + u) * a->scale;
        float m = -INFINITY, l = 0.0f;
        memset(acc, 0, (size_t)d * sizeof *acc);
        for (int64_t j0 = 0; j0 <= i; j0 += ATT_BK) {
            int n = (int)(i + 1 - j0 < ATT_BK ? i + 1 - j0 : ATT_BK); /* keys <= i */
            att_tile(s, q, kt + j0, d, tp, n);
            float mx = att_tile_max(s, n, m);
#pragma omp simd
            for (int j = 0; j < ATT_BK; j++) {
                float e = gp_cpu_exp(s[j] - mx); /* computed for all: a select vectorises */
                s[j] = j < n ? e : 0.0f;
            }
            float corr = gp_cpu_exp(m - mx); /* 0 on the first tile (m = -inf) */
            for (int64_t u = 0; u < d; u++) acc[u] *= corr;
            att_rows(acc, s, vb + j0 * vs, vs, n, d);
            l = fmaf(l, corr, att_tile_sum(s));
            m = mx;
        }
        float inv = 1.0f / l;
        for (int64_t u = 0; u < d; u++) B16_ST(src->y, qi * c + u, acc[u] * inv);
        if (lse) lse[qi] = m + logf(l);
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
    return a->d * a->tp + ATT_BK + 2 * a->d + (b16 ? a->t * a->d : 0);
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
                for (int r = 0; r < nq; r++) {
                    int64_t i = i0 + r;
                    const float *qi = qc + r * qs, *dyi = dyc + r * dys;
                    float *pr = p + r * ATT_BK, *dsr = ds + r * ATT_BK;
                    int n = (int)(i + 1 - j0 < ATT_BK ? i + 1 - j0 : ATT_BK); /* keys <= i */
                    const float li = lb[i], di = ddh[i];
                    att_tile(pr, qi, kt + j0, d, tp, n);   /* q_i . k_j, unscaled */
                    att_tile(dsr, dyi, vt + j0, d, tp, n); /* dy_i . v_j */
#pragma omp simd
                    for (int j = 0; j < ATT_BK; j++) {
                        float e = gp_cpu_exp(fmaf(pr[j], a->scale, -li));
                        float pj = j < n ? e : 0.0f;
                        pr[j] = pj;
                        dsr[j] = pj * (dsr[j] - di);
                    }
                    att_rows(dqb + i * ks, dsr, kb + j0 * ks, ks, n, d);
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
