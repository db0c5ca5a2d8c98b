/*
 * cpu_attention_body.h — the causal attention kernels of cpu_attention.c
 * for one vector width, compiled once per width: cpu_attention_w16.c (16
 * floats a vector: zmm, for processors with AVX-512) and
 * cpu_attention_w8.c (8: ymm, for AVX2 and the baseline), each of which
 * defines, before including this (no include guard on purpose):
 *   ATT_V        floats a vector
 *   ATT_TV       vectors of a score tile a pass of att_tile_q (its
 *                accumulators: ATT_QB ATT_TV)
 *   ATT_RV       column vectors a pass of att_rows_q for a block
 *   ATT_AV       vectors of a row a pass of att_acc_t
 *   ATT_NAME(x)  the exported functions' names (x##_w16, x##_w8)
 *   ATT_TARGET   their target attribute
 * so that a width's accumulators fit its register file (32 zmm; 16 ymm on
 * AVX2, where the 16-wide code spilled: 4 to 8 times slower).  Every sum
 * runs lane by lane in the same order at any width and pass size, so both
 * builds give the same bits (test_attention compares them).  The
 * algorithm, its grain and its determinism: cpu_attention.c.
 */
#ifndef ATT_V
#error "cpu_attention_body.h is included by cpu_attention_w16.c and cpu_attention_w8.c only"
#endif

#include "backend/cpu/cpu_attention.h"

#include <math.h>
#include <string.h>

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

/* ATT_V floats as one value (GCC's vector extension: a zmm register in
 * the 16-wide build, a ymm in the 8-wide one), so that a tile's running
 * sums stay in registers across a loop.  The helpers take pointers and
 * are inlined, so no vector crosses a call. */
typedef float att_vec __attribute__((vector_size(ATT_V * 4)));

static inline __attribute__((always_inline)) void att_load(att_vec *v, const float *p)
{
    memcpy(v, p, sizeof *v);
}

static inline __attribute__((always_inline)) void att_store(float *p, const att_vec *v)
{
    memcpy(p, v, sizeof *v);
}

static inline __attribute__((always_inline)) void att_splat(att_vec *v, float x)
{
#pragma GCC unroll 16
    for (int k = 0; k < ATT_V; k++) (*v)[k] = x;
}

/* acc = a b + acc, lane by lane, each one fmaf (one vector instruction) */
static inline __attribute__((always_inline)) void att_fma(att_vec *acc, const att_vec *a,
                                                          const att_vec *b)
{
    att_vec r;
#pragma GCC unroll 16
    for (int k = 0; k < ATT_V; k++) r[k] = fmaf((*a)[k], (*b)[k], (*acc)[k]);
    *acc = r;
}

/* v[k] = the vector at p + k ATT_V, k < nv. */
static inline __attribute__((always_inline)) void att_loads(att_vec *v, const float *p,
                                                            const int nv)
{
#pragma GCC unroll 4
    for (int k = 0; k < nv; k++) att_load(&v[k], p + k * ATT_V);
}

/* acc[r][k] += x[r xs] v[k], r < nq, k < nv: one step of a block's outer
 * products (a rank-one update of its accumulators), each an fmaf. */
static inline __attribute__((always_inline)) void att_outer(att_vec acc[ATT_QB][4],
                                                            const att_vec *v, const float *x,
                                                            int64_t xs, const int nq,
                                                            const int nv)
{
    att_vec xr;
#pragma GCC unroll 4
    for (int r = 0; r < nq; r++) {
        att_splat(&xr, x[r * xs]);
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) att_fma(&acc[r][k], &xr, &v[k]);
    }
}

/* s[r ATT_BK + j] = sum_u a[r S + u] bt[u tp + j], j < ATT_V nv, for the
 * nq (<= ATT_QB) rows r of a block: their products with ATT_TV vectors of
 * a tile of a transposed, padded operand (tp its row stride), each of the
 * first nv loaded once for all of them; the other vectors 0.  A row's sums
 * run over u in order, one chain a lane: the same bits whatever nq, nv and
 * vector width (a lane's sum is its own).  nq and nv are constants where
 * it is inlined. */
static inline __attribute__((always_inline)) void
att_tile_qv(float *restrict s, const float *a, int64_t S, const float *restrict bt, int64_t d,
            int64_t tp, const int nq, const int nv)
{
    att_vec acc[ATT_QB][4] = {{{0}}}, b[4];
    for (int64_t u = 0; u < d; u++) {
        att_loads(b, bt + u * tp, nv);
        att_outer(acc, b, a + u, S, nq, nv);
    }
#pragma GCC unroll 4
    for (int r = 0; r < nq; r++)
#pragma GCC unroll 4
        for (int k = 0; k < ATT_TV; k++) att_store(s + r * ATT_BK + k * ATT_V, &acc[r][k]);
}

/* The block's products for its first n keys (the causal mask cuts the
 * rest; n the block's most), ATT_TV vectors a pass: only the vectors that
 * hold them are computed. */
static inline __attribute__((always_inline)) void
att_tile_q(float *restrict s, const float *a, int64_t S, const float *restrict bt, int64_t d,
           int64_t tp, int n, const int nq)
{
    const int nvec = (n + ATT_V - 1) / ATT_V;
    for (int v0 = 0; v0 < ATT_BK / ATT_V; v0 += ATT_TV) {
        float *sp = s + v0 * ATT_V;
        const float *bp = bt + v0 * ATT_V;
        const int nv = nvec - v0 < 0 ? 0 : nvec - v0 > ATT_TV ? ATT_TV : nvec - v0;
        if (nv == 0)
            for (int r = 0; r < nq; r++) memset(sp + r * ATT_BK, 0, ATT_TV * ATT_V * sizeof *sp);
        else if (nv == 1)
            att_tile_qv(sp, a, S, bp, d, tp, nq, 1);
#if ATT_TV > 2
        else if (nv == 2)
            att_tile_qv(sp, a, S, bp, d, tp, nq, 2);
        else if (nv == 3)
            att_tile_qv(sp, a, S, bp, d, tp, nq, 3);
#endif
        else
            att_tile_qv(sp, a, S, bp, d, tp, nq, ATT_TV);
    }
}

/* CALL(k) with k = nq (1 .. ATT_QB) a constant, so that the block kernel
 * CALL names is inlined for it. */
#define ATT_BY_NQ(nq, CALL)          \
    do {                             \
        switch (nq) {                \
        case 1: CALL(1); break;      \
        case 2: CALL(2); break;      \
        case 3: CALL(3); break;      \
        default: CALL(4); break;     \
        }                            \
    } while (0)

/* att_tile_q with nq a constant where it is inlined. */
static inline __attribute__((always_inline)) void
att_tile(float *restrict s, const float *a, int64_t S, const float *restrict bt, int64_t d,
         int64_t tp, int n, int nq)
{
#define ATT_TILE_K(k) att_tile_q(s, a, S, bt, d, tp, n, k)
    ATT_BY_NQ(nq, ATT_TILE_K);
#undef ATT_TILE_K
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
static inline __attribute__((always_inline)) void
att_rows_pass(float *restrict acc, int64_t A, const float *p, const float *restrict rows,
              int64_t R, int n, int64_t u0, const int nq, const int nv)
{
    att_vec e[ATT_QB][4] = {{{0}}}, o[ATT_QB][4] = {{{0}}}, v[4];
    const float *col = rows + u0;
    int j = 0;
    for (; j + 2 <= n; j += 2) {
        att_loads(v, col + j * R, nv);
        att_outer(e, v, p + j, ATT_BK, nq, nv);
        att_loads(v, col + (j + 1) * R, nv);
        att_outer(o, v, p + j + 1, ATT_BK, nq, nv);
    }
    if (j < n) {
        att_loads(v, col + j * R, nv);
        att_outer(e, v, p + j, ATT_BK, nq, nv);
    }
#pragma GCC unroll 4
    for (int r = 0; r < nq; r++)
#pragma GCC unroll 4
        for (int k = 0; k < nv; k++) {
            att_vec a;
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
#define ATT_ROWS_K(k) att_rows_q(acc, A, p, rows, R, n, d, k)
    ATT_BY_NQ(nq, ATT_ROWS_K);
#undef ATT_ROWS_K
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
 * dk^T += q^T dS), nu rows u of dst, ATT_AV vectors of each, in registers
 * while the chunk's rows r go by in order, so each dst vector is read and
 * written once a chunk and each vector of m is loaded once for nu rows.
 * An element's sum runs over r in order whatever nu and width: the same
 * bits. */
static inline __attribute__((always_inline)) void
att_acc_t_rows(float *restrict dst, const float *src, int64_t S, const float *restrict m, int nq,
               int64_t u, int v0, const int nu)
{
    att_vec a[ATT_QB][4], mv[4];
#pragma GCC unroll 4
    for (int w = 0; w < nu; w++) att_loads(a[w], dst + (u + w) * ATT_BK + v0 * ATT_V, ATT_AV);
    for (int r = 0; r < nq; r++) {
        att_loads(mv, m + r * ATT_BK + v0 * ATT_V, ATT_AV);
        att_outer(a, mv, src + r * S + u, 1, nu, ATT_AV);
    }
#pragma GCC unroll 4
    for (int w = 0; w < nu; w++)
#pragma GCC unroll 4
        for (int k = 0; k < ATT_AV; k++)
            att_store(dst + (u + w) * ATT_BK + (v0 + k) * ATT_V, &a[w][k]);
}

static inline __attribute__((always_inline)) void att_acc_t(float *restrict dst,
                                                            const float *src, int64_t S,
                                                            const float *restrict m, int nq,
                                                            int64_t d)
{
    for (int v0 = 0; v0 < ATT_BK / ATT_V; v0 += ATT_AV) {
        int64_t u = 0;
        for (; u + 4 <= d; u += 4) att_acc_t_rows(dst, src, S, m, nq, u, v0, 4);
        for (; u < d; u++) att_acc_t_rows(dst, src, S, m, nq, u, v0, 1);
    }
}

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
            const int nmax = att_keys(last, j0);
            att_tile(s, q, d, kt + j0, d, tp, nmax, nb);
            for (int r = 0; r < nb; r++) {
                float *sr = s + r * ATT_BK;
                int n = att_keys(i0 + r, j0);
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
                    const int nmax = att_keys(il, j0);
                    att_tile(p + r0 * ATT_BK, qc + r0 * qs, qs, kt + j0, d, tp, nmax, nb);
                    att_tile(ds + r0 * ATT_BK, dyc + r0 * dys, dys, vt + j0, d, tp, nmax, nb);
                    for (int r = r0; r < r0 + nb; r++) {
                        const int64_t i = i0 + r;
                        float *pr = p + r * ATT_BK, *dsr = ds + r * ATT_BK;
                        const int n = att_keys(i, j0);
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

ATT_TARGET void ATT_NAME(gp_cpu_att_fwd)(const att_dims *a, const void *x, void *y, float *lse,
                                         int64_t bi, int64_t h, float *buf, bool b16)
{
    if (b16) att_fwd_x(a, x, y, lse, bi, h, buf, true);
    else att_fwd_x(a, x, y, lse, bi, h, buf, false);
}

ATT_TARGET void ATT_NAME(gp_cpu_att_bwd)(const att_dims *a, const void *x, const void *y,
                                         const float *lse, const void *dy, void *dx, int64_t bi,
                                         int64_t g, float *buf, bool b16)
{
    if (b16) att_bwd_body(a, x, y, lse, dy, dx, bi, g, buf, true);
    else att_bwd_body(a, x, y, lse, dy, dx, bi, g, buf, false);
}

ATT_TARGET void ATT_NAME(gp_cpu_att_cached)(const att_dims *a, const att_src *src, float *buf,
                                            bool b16)
{
    if (b16) att_fwd_body(a, src, NULL, buf, true);
    else att_fwd_body(a, src, NULL, buf, false);
}
