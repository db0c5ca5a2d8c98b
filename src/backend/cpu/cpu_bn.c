/*
 * cpu_bn.c — batch normalisation with OpenMP loops, on plain NCHW ((N, C)
 * for 1-d) and on the channel-blocked layouts of backend.h (nChw8c,
 * nChw16c: the convolutions' own, kept between them inside a stage); the
 * per-element arithmetic is in backend/elementwise.h.
 *
 * Why not oneDNN: its plain-layout (ncsp) batch norm makes separate sweeps
 * over the whole tensor and measured 7.4 ms forward / 9.7 ms backward for
 * (128, 64, 28, 28) on 2 cores, about a quarter of a convnet step.  Here each
 * task owns a block of channels whose data (~256 KiB) stays in L2 across the
 * passes (statistics, normalise; sums, dx), so the tensor crosses memory
 * about once per direction: 2.3 ms / 3.6 ms for the same shape
 * (bench/bench_ops.c).  On a blocked layout a task owns whole blocks of
 * channels and the loops run across the block's channels.
 *
 * Sums, in one order for every layout and processor.  A channel's values
 * are summed in double over BN_LANES lanes, value (n, j) (sample n, pixel
 * j of S) into lane j % BN_LANES, samples in order, and the lanes are then
 * added in a fixed pairwise tree (lanes_total).  The plain loops vectorise
 * along j, the blocked ones across the block's channels, each lane still
 * adding its own values in the same order, so a blocked tensor gets the
 * same bits as its plain form, and the AVX-512, AVX2 and baseline builds
 * (GP_CPU_LOOPS) the same bits as each other (before 2026-11-24 `omp simd`
 * reductions left the order to the compiler and the last bits differed
 * between kinds of processor).  Statistics: one pass of the values
 * shifted by the channel's first value, sum and sum of squares, so the
 * variance has no cancellation worth naming in double (the shift is a
 * value of the channel; even 1e4 standard deviations from the mean it
 * costs under float precision); var is the biased variance.
 */
#include "backend/cpu/cpu_impl.h"
#include "backend/elementwise.h"

#define BN_LANES 32
#define BN_MAX_BLOCK 16

/* The lanes' sum, pairwise: (l0 + l16) + ... in halves down to one. */
static inline __attribute__((always_inline)) double lanes_total(double *a)
{
    for (int w = BN_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) a[l] += a[l + w];
    return a[0];
}

/* Channels per task so that one task's data is about 64 Ki floats; on a
 * blocked layout a multiple of its unit (gp_blk_unit: the block of 8 or
 * 16, or 16 or 8 of a channels-last pixel's C). */
static int64_t bn_block(const gp_bn_desc *d)
{
    int64_t per = d->n * d->s;
    int64_t cb = per > 0 ? 65536 / per : 1;
    if (cb < 1) cb = 1;
    if (cb > d->c) cb = d->c;
    const int64_t u = gp_blk_unit(d->blk);
    cb = (cb + u - 1) / u * u;
    return cb;
}

/* Where channel c starts (its samples lie C * S apart in every layout; its
 * pixels 1 apart plain, the block apart blocked). */
static inline int64_t chan_base(const gp_bn_desc *d, int64_t c)
{
    return d->blk ? (c / d->blk * d->s) * d->blk + c % d->blk : c * d->s;
}

/* ---- the per-channel sums ---------------------------------------------------
 * Without a gradient g the two sums are those of the statistics (a1 += x -
 * k, a2 += (x - k)^2, k a shift); with one, those of the backward (a1 +=
 * dy, a2 += dy (x - k), k the mean). */

/* One body for both storage types (B16_LD, B16_ST): on bf16 storage x, dy
 * and the forward's residual are bf16 patterns widened on load (exactly)
 * and y / dx are rounded once on store, so the sums and the per-element
 * math are the FP32 loops' on the widened values, in the same order: the
 * storage adapter's bits, with no FP32 copy at all.  Until 2026-11-27 the
 * bf16 slots widened each task's channels into FP32 tiles, ran these
 * loops on the tiles and rounded the output tile: on bench/convnet.yaml
 * the widening and rounding passes took 6% of a bf16 step (AMD EPYC with
 * avx512_bf16, 2 threads), more than the sums themselves.  Element
 * offsets are in values; cadv/adv turn them into addresses. */
static inline __attribute__((always_inline)) const void *cadv(const void *p, int64_t i,
                                                              const bool b16)
{
    return p ? (const char *)p + i * (b16 ? 2 : 4) : NULL;
}

static inline __attribute__((always_inline)) void *adv(void *p, int64_t i, const bool b16)
{
    return p ? (char *)p + i * (b16 ? 2 : 4) : NULL;
}

/* `cnt` consecutive pixels of one plain channel into lanes 0 .. cnt - 1. */
static inline __attribute__((always_inline)) void
lanes_add(double *a1, double *a2, const void *p, const void *q, double k, int cnt,
          const float *msk, const bool b16)
{
    if (q && msk) { /* dy masked by the relu after the norm: msk = scale, shift */
        const float sc = msk[0], sh = msk[1];
#pragma omp simd
        for (int l = 0; l < cnt; l++) {
            const float pv = B16_LD(p, l);
            double gv = (double)gp_ew_bn_relu_dy(B16_LD(q, l), pv, sc, sh);
            a1[l] += gv;
            a2[l] += gv * ((double)pv - k);
        }
    } else if (q) {
#pragma omp simd
        for (int l = 0; l < cnt; l++) {
            double gv = (double)B16_LD(q, l);
            a1[l] += gv;
            a2[l] += gv * ((double)B16_LD(p, l) - k);
        }
    } else {
#pragma omp simd
        for (int l = 0; l < cnt; l++) {
            double t = (double)B16_LD(p, l) - k;
            a1[l] += t;
            a2[l] += t * t;
        }
    }
}

/* One channel of a plain layout: x at cs between samples, S contiguous. */
static inline __attribute__((always_inline)) void
sums_plain(const void *x, const void *g, int64_t n, int64_t cs, int64_t s, double k,
           const float *msk, double *s1, double *s2, const bool b16)
{
    double a1[BN_LANES] = {0}, a2[BN_LANES] = {0};
    const int64_t sv = s - s % BN_LANES;
    for (int64_t i = 0; i < n; i++) {
        const void *p = cadv(x, i * cs, b16), *q = cadv(g, i * cs, b16);
        for (int64_t j = 0; j < sv; j += BN_LANES)
            lanes_add(a1, a2, cadv(p, j, b16), cadv(q, j, b16), k, BN_LANES, msk, b16);
        lanes_add(a1, a2, cadv(p, sv, b16), cadv(q, sv, b16), k, (int)(s - sv), msk,
                  b16); /* the tail */
    }
    *s1 = lanes_total(a1);
    *s2 = lanes_total(a2);
}

/* B channels of a blocked layout at once: pixel j's B values contiguous,
 * pixels P apart (the layout's block: B itself, or a channels-last C),
 * samples cs apart; k[b] per channel. */
static inline __attribute__((always_inline)) void
sums_block(const void *x, const void *g, int64_t n, int64_t cs, int64_t s, const int64_t B,
           const int64_t P, const double *k, const float *msc, const float *msh, double *s1,
           double *s2, const bool b16)
{
    double a1[BN_LANES][BN_MAX_BLOCK] = {{0}}, a2[BN_LANES][BN_MAX_BLOCK] = {{0}};
    float ms[BN_MAX_BLOCK], mh[BN_MAX_BLOCK]; /* in registers, as apply_block's */
    for (int64_t b = 0; b < B; b++) ms[b] = msc ? msc[b] : 0.0f, mh[b] = msh ? msh[b] : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const void *p = cadv(x, i * cs, b16), *q = cadv(g, i * cs, b16);
        for (int64_t j = 0, l = 0; j < s; j++, l = l + 1 == BN_LANES ? 0 : l + 1) {
            const void *pj = cadv(p, j * P, b16);
            double *u = a1[l], *v = a2[l];
            if (q && msc) { /* dy masked by the relu after the norm */
                const void *qj = cadv(q, j * P, b16);
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    const float pv = B16_LD(pj, b);
                    double gv = (double)gp_ew_bn_relu_dy(B16_LD(qj, b), pv, ms[b], mh[b]);
                    u[b] += gv;
                    v[b] += gv * ((double)pv - k[b]);
                }
            } else if (q) {
                const void *qj = cadv(q, j * P, b16);
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    double gv = (double)B16_LD(qj, b);
                    u[b] += gv;
                    v[b] += gv * ((double)B16_LD(pj, b) - k[b]);
                }
            } else {
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    double t = (double)B16_LD(pj, b) - k[b];
                    u[b] += t;
                    v[b] += t * t;
                }
            }
        }
    }
    for (int64_t b = 0; b < B; b++) {
        double c1[BN_LANES], c2[BN_LANES];
        for (int l = 0; l < BN_LANES; l++) c1[l] = a1[l][b], c2[l] = a2[l][b];
        s1[b] = lanes_total(c1);
        s2[b] = lanes_total(c2);
    }
}

/* The sums of channels [c0, c0 + cnt) (cnt = 1 on a plain layout, the
 * block on a blocked one): x alone (g NULL; k[] the shifts, set here to
 * each channel's first value) or dy with x centred on k[] = the means;
 * with msc / msh (the forward's scale and shift per channel of the unit)
 * dy masked by the relu after the norm. */
static inline __attribute__((always_inline)) void
chan_sums_body(const gp_bn_desc *d, const void *x, const void *g, int64_t c0, double *k,
               bool set_k, const float *msc, const float *msh, double *s1, double *s2,
               const bool b16)
{
    const int64_t cs = d->c * d->s, o = chan_base(d, c0);
    const int64_t B = gp_blk_unit(d->blk), P = d->blk;
    if (set_k)
        for (int64_t b = 0; b < B; b++) k[b] = (double)B16_LD(x, o + b);
    const float msk[2] = {msc ? msc[0] : 0.0f, msh ? msh[0] : 0.0f};
    const void *xo = cadv(x, o, b16), *go = cadv(g, o, b16);
#define SUMS(b, p) sums_block(xo, go, d->n, cs, d->s, b, p, k, msc, msh, s1, s2, b16)
    if (!d->blk) sums_plain(xo, go, d->n, cs, d->s, k[0], msc ? msk : NULL, s1, s2, b16);
    else CPU_BLK_CALL(P, SUMS);
#undef SUMS
}

GP_CPU_LOOPS
static void chan_sums_f32(const gp_bn_desc *d, const float *x, const float *g, int64_t c0,
                          double *k, bool set_k, const float *msc, const float *msh, double *s1,
                          double *s2)
{
    chan_sums_body(d, x, g, c0, k, set_k, msc, msh, s1, s2, false);
}

GP_CPU_LOOPS
static void chan_sums_b16(const gp_bn_desc *d, const uint16_t *x, const uint16_t *g, int64_t c0,
                          double *k, bool set_k, const float *msc, const float *msh, double *s1,
                          double *s2)
{
    chan_sums_body(d, x, g, c0, k, set_k, msc, msh, s1, s2, true);
}

static void chan_sums(const gp_bn_desc *d, const void *x, const void *g, int64_t c0, double *k,
                      bool set_k, const float *msc, const float *msh, double *s1, double *s2,
                      bool b16)
{
    if (b16) chan_sums_b16(d, x, g, c0, k, set_k, msc, msh, s1, s2);
    else chan_sums_f32(d, x, g, c0, k, set_k, msc, msh, s1, s2);
}

/* The backward's sums of channels [c0, c0 + unit): dy, and dy (x - mean);
 * dy masked where msc is given (chan_sums). */
static void chan_grad_sums(const gp_bn_desc *d, const void *x, const void *dy,
                           const float *mean, int64_t c0, const float *msc, const float *msh,
                           double *sdy, double *sdyx, bool b16)
{
    double k[BN_MAX_BLOCK];
    for (int64_t b = 0; b < gp_blk_unit(d->blk); b++) k[b] = (double)mean[c0 + b];
    chan_sums(d, x, dy, c0, k, false, msc, msh, sdy, sdyx, b16);
}

/* Mean and biased variance of channels [c0, c0 + B) from one pass. */
static void chan_stats(const gp_bn_desc *d, const void *x, int64_t c0, float *mean, float *var,
                       bool b16)
{
    double k[BN_MAX_BLOCK], s1[BN_MAX_BLOCK], s2[BN_MAX_BLOCK];
    const double cnt = (double)(d->n * d->s);
    chan_sums(d, x, NULL, c0, k, true, NULL, NULL, s1, s2, b16);
    for (int64_t b = 0; b < gp_blk_unit(d->blk); b++) {
        double off = s1[b] / cnt, v = s2[b] / cnt - off * off;
        mean[c0 + b] = (float)(k[b] + off);
        var[c0 + b] = (float)(v < 0.0 ? 0.0 : v); /* rounding's negatives; NaN stays */
    }
}

/* ---- the per-element passes over channels [c0, c0 + B) ----------------------- */

/* B channels of a blocked layout, pixels P apart (sums_block): the
 * coefficients of one pixel's B values stay in registers (B a constant
 * where it is inlined). */
static inline __attribute__((always_inline)) void
apply_block(const void *x, const void *g, void *y, int64_t n, int64_t cs, int64_t s,
            const int64_t B, const int64_t P, const float *ca, const float *cb, const float *cc,
            const float *cm, bool relu, const float *msc, const float *msh, const void *add,
            const bool b16)
{
    float a[BN_MAX_BLOCK], b2[BN_MAX_BLOCK], c[BN_MAX_BLOCK], m[BN_MAX_BLOCK];
    float ms[BN_MAX_BLOCK], mh[BN_MAX_BLOCK];
    for (int64_t b = 0; b < B; b++) {
        a[b] = ca[b], b2[b] = cb[b];
        c[b] = cc ? cc[b] : 0.0f, m[b] = cm ? cm[b] : 0.0f;
        ms[b] = msc ? msc[b] : 0.0f, mh[b] = msh ? msh[b] : 0.0f;
    }
    for (int64_t i = 0; i < n; i++) {
        const void *p = cadv(x, i * cs, b16), *q = cadv(g, i * cs, b16);
        void *r = adv(y, i * cs, b16);
        if (add) { /* a residual sum, then relu where asked */
            const void *t = cadv(add, i * cs, b16);
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    float v = gp_ew_bn_apply(B16_LD(p, j * P + b), a[b], b2[b]) +
                              B16_LD(t, j * P + b);
                    B16_ST(r, j * P + b, relu ? gp_ew_relu(v) : v);
                }
            }
        } else if (q && msc) {
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    const float pv = B16_LD(p, j * P + b);
                    float gv = gp_ew_bn_relu_dy(B16_LD(q, j * P + b), pv, ms[b], mh[b]);
                    B16_ST(r, j * P + b, gp_ew_bn_bwd_apply(gv, pv, m[b], a[b], b2[b], c[b]));
                }
            }
        } else if (q) {
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++)
                    B16_ST(r, j * P + b,
                           gp_ew_bn_bwd_apply(B16_LD(q, j * P + b), B16_LD(p, j * P + b), m[b],
                                              a[b], b2[b], c[b]));
            }
        } else if (relu) {
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++)
                    B16_ST(r, j * P + b,
                           gp_ew_relu(gp_ew_bn_apply(B16_LD(p, j * P + b), a[b], b2[b])));
            }
        } else {
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++)
                    B16_ST(r, j * P + b, gp_ew_bn_apply(B16_LD(p, j * P + b), a[b], b2[b]));
            }
        }
    }
}

/* y = x scale + shift (fwd; then relu where d->relu; the residual d->add,
 * or d->add16 on bf16, added first) or dx = a dy + b (x - m) + c (bwd: g =
 * dy; masked by the relu after the norm where msc, msh, the forward's
 * scale and shift, are given), with per-channel coefficients, over
 * channels [c0, c0 + unit). */
static inline __attribute__((always_inline)) void
chan_apply_body(const gp_bn_desc *d, const void *x, const void *g, void *y, int64_t c0,
                const float *ca, const float *cb, const float *cc, const float *cm,
                const float *msc, const float *msh, const bool b16)
{
    const int64_t cs = d->c * d->s, o = chan_base(d, c0), S = d->s, N = d->n;
    const bool relu = !g && d->relu;
    const void *add = g ? NULL : b16 ? (const void *)d->add16 : (const void *)d->add;
    const void *ad = cadv(add, o, b16); /* forward only */
    const void *xo = cadv(x, o, b16), *go = cadv(g, o, b16);
    void *yo = adv(y, o, b16);
    if (d->blk) {
#define APPLY(b, p) apply_block(xo, go, yo, N, cs, S, b, p, ca, cb, cc, cm, relu, msc, msh, ad, b16)
        CPU_BLK_CALL(d->blk, APPLY);
#undef APPLY
        return;
    }
    const float a = ca[0], b = cb[0], c = cc ? cc[0] : 0.0f, m = cm ? cm[0] : 0.0f;
    const float ms = msc ? msc[0] : 0.0f, mh = msh ? msh[0] : 0.0f;
    for (int64_t i = 0; i < N; i++) {
        const void *p = cadv(xo, i * cs, b16), *q = cadv(go, i * cs, b16);
        void *r = adv(yo, i * cs, b16);
        if (ad) { /* a residual sum, then relu where asked */
            const void *t = cadv(ad, i * cs, b16);
            if (relu) {
#pragma omp simd
                for (int64_t j = 0; j < S; j++)
                    B16_ST(r, j, gp_ew_relu(gp_ew_bn_apply(B16_LD(p, j), a, b) + B16_LD(t, j)));
            } else {
#pragma omp simd
                for (int64_t j = 0; j < S; j++)
                    B16_ST(r, j, gp_ew_bn_apply(B16_LD(p, j), a, b) + B16_LD(t, j));
            }
        } else if (q && msc) {
#pragma omp simd
            for (int64_t j = 0; j < S; j++) {
                const float pv = B16_LD(p, j);
                B16_ST(r, j,
                       gp_ew_bn_bwd_apply(gp_ew_bn_relu_dy(B16_LD(q, j), pv, ms, mh), pv, m, a,
                                          b, c));
            }
        } else if (q) {
#pragma omp simd
            for (int64_t j = 0; j < S; j++)
                B16_ST(r, j, gp_ew_bn_bwd_apply(B16_LD(q, j), B16_LD(p, j), m, a, b, c));
        } else if (relu) {
#pragma omp simd
            for (int64_t j = 0; j < S; j++)
                B16_ST(r, j, gp_ew_relu(gp_ew_bn_apply(B16_LD(p, j), a, b)));
        } else {
#pragma omp simd
            for (int64_t j = 0; j < S; j++) B16_ST(r, j, gp_ew_bn_apply(B16_LD(p, j), a, b));
        }
    }
}

GP_CPU_LOOPS
static void chan_apply_f32(const gp_bn_desc *d, const float *x, const float *g, float *y,
                           int64_t c0, const float *ca, const float *cb, const float *cc,
                           const float *cm, const float *msc, const float *msh)
{
    chan_apply_body(d, x, g, y, c0, ca, cb, cc, cm, msc, msh, false);
}

GP_CPU_LOOPS
static void chan_apply_b16(const gp_bn_desc *d, const uint16_t *x, const uint16_t *g,
                           uint16_t *y, int64_t c0, const float *ca, const float *cb,
                           const float *cc, const float *cm, const float *msc, const float *msh)
{
    chan_apply_body(d, x, g, y, c0, ca, cb, cc, cm, msc, msh, true);
}

static void chan_apply(const gp_bn_desc *d, const void *x, const void *g, void *y, int64_t c0,
                       const float *ca, const float *cb, const float *cc, const float *cm,
                       const float *msc, const float *msh, bool b16)
{
    if (b16) chan_apply_b16(d, x, g, y, c0, ca, cb, cc, cm, msc, msh);
    else chan_apply_f32(d, x, g, y, c0, ca, cb, cc, cm, msc, msh);
}

/* The forward's per-channel scale and shift of channels [c0, c0 + unit). */
static void fwd_coeffs(const gp_bn_desc *d, int64_t c0, const float *mean, const float *var,
                       const float *gamma, const float *beta, float *sc, float *sh)
{
    for (int64_t b = 0; b < gp_blk_unit(d->blk); b++) {
        int64_t c = c0 + b;
        gp_ew_bn_coeffs(mean[c], var[c], d->eps, gamma ? gamma[c] : 1.0f, beta ? beta[c] : 0.0f,
                        &sc[b], &sh[b]);
    }
}

/* The tasks, on dev's threads: runs of bn_block() channels, the body run
 * once per run with the run's channels [lo, hi). */
#define BN_FOR_RUNS(dev, d, lo, hi, ...)                                                      \
    do {                                                                                      \
        const int64_t cb_ = bn_block(d), nb_ = ((d)->c + cb_ - 1) / cb_;                      \
        const int nt_ = (dev)->threads;                                                       \
        const bool par_ = (d)->n * (d)->c * (d)->s >= 32768;                                  \
        _Pragma("omp parallel for schedule(static) num_threads(nt_) if (par_)")               \
        for (int64_t b_ = 0; b_ < nb_; b_++) {                                                \
            const int64_t lo = b_ * cb_, hi = lo + cb_ < (d)->c ? lo + cb_ : (d)->c;          \
            __VA_ARGS__                                                                       \
        }                                                                                     \
    } while (0)

/* BN_FOR_RUNS by units: the body run on each unit of a run (a channel, or
 * a block of them), the unit starting at channel c0 and `unit_` wide. */
#define BN_FOR_UNITS(dev, d, c0, ...)                                                         \
    BN_FOR_RUNS(dev, d, lo_, hi_, {                                                           \
        const int64_t unit_ = gp_blk_unit((d)->blk);                                          \
        for (int64_t c0 = lo_; c0 < hi_; c0 += unit_) { __VA_ARGS__ }                         \
    })

/* The bodies of bn_fwd_train, bn_fwd_infer and bn_bwd over the units of
 * channels [lo, hi), on FP32 or (b16) bf16 storage. */
static void fwd_train_run(const gp_bn_desc *d, const void *x, const float *gamma,
                          const float *beta, void *y, float *mean, float *var, int64_t lo,
                          int64_t hi, bool b16)
{
    for (int64_t c0 = lo; c0 < hi; c0 += gp_blk_unit(d->blk)) {
        float sc[BN_MAX_BLOCK], sh[BN_MAX_BLOCK];
        chan_stats(d, x, c0, mean, var, b16);
        fwd_coeffs(d, c0, mean, var, gamma, beta, sc, sh);
        chan_apply(d, x, NULL, y, c0, sc, sh, NULL, NULL, NULL, NULL, b16);
    }
}

static void fwd_infer_run(const gp_bn_desc *d, const void *x, const float *gamma,
                          const float *beta, const float *mean, const float *var, void *y,
                          int64_t lo, int64_t hi, bool b16)
{
    for (int64_t c0 = lo; c0 < hi; c0 += gp_blk_unit(d->blk)) {
        float sc[BN_MAX_BLOCK], sh[BN_MAX_BLOCK];
        fwd_coeffs(d, c0, mean, var, gamma, beta, sc, sh);
        chan_apply(d, x, NULL, y, c0, sc, sh, NULL, NULL, NULL, NULL, b16);
    }
}

static void bwd_run(const gp_bn_desc *d, const void *x, const float *gamma, const float *beta,
                    const float *mean, const float *var, const void *dy, void *dx,
                    float *dgamma, float *dbeta, int64_t lo, int64_t hi, bool b16)
{
    const double cnt = (double)(d->n * d->s);
    const int64_t unit = gp_blk_unit(d->blk);
    for (int64_t c0 = lo; c0 < hi; c0 += unit) {
        double sdy[BN_MAX_BLOCK], sdyx[BN_MAX_BLOCK];
        float ka[BN_MAX_BLOCK], kb[BN_MAX_BLOCK], kc[BN_MAX_BLOCK];
        float sc[BN_MAX_BLOCK], sh[BN_MAX_BLOCK]; /* d->relu: the forward's */
        if (d->relu) fwd_coeffs(d, c0, mean, var, gamma, beta, sc, sh);
        const float *msc = d->relu ? sc : NULL, *msh = d->relu ? sh : NULL;
        chan_grad_sums(d, x, dy, mean, c0, msc, msh, sdy, sdyx, b16);
        for (int64_t b = 0; b < unit; b++) {
            int64_t c = c0 + b;
            double dg, db;
            gp_ew_bn_bwd_coeffs(var[c], d->eps, gamma ? gamma[c] : 1.0f, sdy[b], sdyx[b], cnt,
                                &ka[b], &kb[b], &kc[b], &dg, &db);
            if (dgamma) dgamma[c] += (float)dg;
            if (dbeta) dbeta[c] += (float)db;
        }
        chan_apply(d, x, dy, dx, c0, ka, kb, kc, mean + c0, msc, msh, b16);
    }
}

gp_status gp_cpu_bn_fwd_train(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, float *y, float *mean,
                              float *var)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_RUNS(dev, d, lo, hi,
                { fwd_train_run(d, x, gamma, beta, y, mean, var, lo, hi, false); });
    return GP_OK;
}

gp_status gp_cpu_bn_fwd_infer(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, float *y)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_RUNS(dev, d, lo, hi,
                { fwd_infer_run(d, x, gamma, beta, mean, var, y, lo, hi, false); });
    return GP_OK;
}

gp_status gp_cpu_bn_bwd(gp_device *dev, const gp_bn_desc *d, const float *x,
                        const float *gamma, const float *beta, const float *mean,
                        const float *var, const float *dy, float *dx, float *dgamma,
                        float *dbeta)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_RUNS(dev, d, lo, hi,
                { bwd_run(d, x, gamma, beta, mean, var, dy, dx, dgamma, dbeta, lo, hi, false); });
    return GP_OK;
}

/* ---- on bf16 storage (backend.h's bn_*_bf16): the loops above on the bf16
 * tensors themselves (b16), the FP32 slots' sums in the same order and
 * their per-element math on the widened values, y and dx rounded once: the
 * storage adapter's bits.  The forward's residual comes in bf16 (add16). */

static gp_status bf16_check(gp_device *dev, const gp_bn_desc *d, bool bwd)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    if (d->add || (bwd && d->add16))
        return gp_error_set(GP_ERR_INVALID, "device %s: batch norm on bf16 storage takes its "
                                            "forward's residual in bf16 (gp_bn_desc.add16), "
                                            "not FP32 (.add)", dev->name);
    return GP_OK;
}

gp_status gp_cpu_bn_fwd_train_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, uint16_t *y,
                                   float *mean, float *var)
{
    GP_TRY(bf16_check(dev, d, false));
    BN_FOR_RUNS(dev, d, lo, hi,
                { fwd_train_run(d, x, gamma, beta, y, mean, var, lo, hi, true); });
    return GP_OK;
}

gp_status gp_cpu_bn_fwd_infer_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, const float *mean,
                                   const float *var, uint16_t *y)
{
    GP_TRY(bf16_check(dev, d, false));
    BN_FOR_RUNS(dev, d, lo, hi,
                { fwd_infer_run(d, x, gamma, beta, mean, var, y, lo, hi, true); });
    return GP_OK;
}

gp_status gp_cpu_bn_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const uint16_t *dy, uint16_t *dx, float *dgamma,
                             float *dbeta)
{
    GP_TRY(bf16_check(dev, d, true));
    BN_FOR_RUNS(dev, d, lo, hi,
                { bwd_run(d, x, gamma, beta, mean, var, dy, dx, dgamma, dbeta, lo, hi, true); });
    return GP_OK;
}

/* ---- in-place activated instance norm's backward (backend.h's
 * norm_leaky_bwd): y' from the relu's output (or the norm's), sums in the
 * lanes' fixed order like the rest of this file ---------------------------- */

/* One body for both storage types (B16_LD, B16_ST): on bf16, yz and dy
 * widened on load, dx rounded once, y' by gp_ew_norm_leaky_y_b16. */
#define NL_Y(v) (b16 ? gp_ew_norm_leaky_y_b16(v, from_z, slope) : gp_ew_norm_leaky_y(v, from_z, slope))

static inline __attribute__((always_inline)) void
norm_leaky_body(const gp_bn_desc *d, const void *yz, int from_z, float slope, float var,
                const void *dy, void *dx, int64_t c, const bool b16)
{
    const int64_t cs = d->c * d->s, S = d->s, o = c * S, sv = S - S % BN_LANES;
    double a1[BN_LANES] = {0}, a2[BN_LANES] = {0};
    for (int64_t i = 0; i < d->n; i++) {
        const int64_t p = o + i * cs;
        for (int64_t j = 0; j < S; j += BN_LANES) {
            const int cnt = j < sv ? BN_LANES : (int)(S - sv);
#pragma omp simd
            for (int l = 0; l < cnt; l++) {
                double g = (double)B16_LD(dy, p + j + l);
                a1[l] += g;
                a2[l] += g * (double)NL_Y(B16_LD(yz, p + j + l));
            }
        }
    }
    float ka, kb, kc;
    gp_ew_norm_leaky_coeffs(var, d->eps, lanes_total(a1), lanes_total(a2), (double)(d->n * S),
                            &ka, &kb, &kc);
    for (int64_t i = 0; i < d->n; i++) {
        const int64_t p = o + i * cs;
#pragma omp simd
        for (int64_t j = 0; j < S; j++)
            B16_ST(dx, p + j, ka * B16_LD(dy, p + j) + kb * NL_Y(B16_LD(yz, p + j)) + kc);
    }
}
#undef NL_Y

GP_CPU_LOOPS
static void norm_leaky_chan(const gp_bn_desc *d, const float *yz, int from_z, float slope,
                            float var, const float *dy, float *dx, int64_t c)
{
    norm_leaky_body(d, yz, from_z, slope, var, dy, dx, c, false);
}

GP_CPU_LOOPS
static void norm_leaky_chan_bf16(const gp_bn_desc *d, const uint16_t *yz, int from_z,
                                 float slope, float var, const uint16_t *dy, uint16_t *dx,
                                 int64_t c)
{
    norm_leaky_body(d, yz, from_z, slope, var, dy, dx, c, true);
}

gp_status gp_cpu_norm_leaky_bwd(gp_device *dev, const gp_bn_desc *d, const float *yz,
                                bool from_z, float slope, const float *var, const float *dy,
                                float *dx)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_UNITS(dev, d, c0, { norm_leaky_chan(d, yz, from_z, slope, var[c0], dy, dx, c0); });
    return GP_OK;
}

gp_status gp_cpu_norm_leaky_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *yz,
                                     bool from_z, float slope, const float *var,
                                     const uint16_t *dy, uint16_t *dx)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_UNITS(dev, d, c0,
                 { norm_leaky_chan_bf16(d, yz, from_z, slope, var[c0], dy, dx, c0); });
    return GP_OK;
}

/* ---- the step's statistics, kept on the device (backend.h's bn_merge,
 * bn_commit): C channels, a few hundred at most, so plain loops ------------ */

gp_status gp_cpu_bn_merge(gp_device *dev, int64_t c, double *mean_acc, double *m2_acc,
                          double na, double nb, const float *mean, const float *var)
{
    for (int64_t k = 0; k < c; k++) gp_ew_bn_merge(&mean_acc[k], &m2_acc[k], na, nb, mean[k], var[k]);
    return GP_OK;
}

gp_status gp_cpu_bn_commit_multi(gp_device *dev, const gp_bn_commit_part *parts, int n)
{
    for (int i = 0; i < n; i++) {
        const gp_bn_commit_part *p = &parts[i];
        for (int64_t k = 0; k < p->c; k++)
            gp_ew_bn_fold(&p->mean_acc[k], &p->m2_acc[k], p->pend, p->c, k, p->n_pend, p->n_hi,
                          p->na, p->nb_hi, p->nb_lo);
        GP_TRY(gp_cpu_bn_commit(dev, p->c, p->rmean, p->rvar, p->mean_acc, p->m2_acc,
                                p->momentum, p->count));
    }
    return GP_OK;
}

gp_status gp_cpu_bn_commit(gp_device *dev, int64_t c, float *rmean, float *rvar,
                           double *mean_acc, double *m2_acc, double momentum, double count)
{
    for (int64_t k = 0; k < c; k++)
        gp_ew_bn_commit(&rmean[k], &rvar[k], &mean_acc[k], &m2_acc[k], momentum, count);
    return GP_OK;
}

/* ---- synchronised batch norm: the pieces between the reductions --------- */

gp_status gp_cpu_bn_stats(gp_device *dev, const gp_bn_desc *d, const float *x, float *mean,
                          float *var)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_UNITS(dev, d, c0, { chan_stats(d, x, c0, mean, var, false); });
    return GP_OK;
}

gp_status gp_cpu_bn_bwd_sums(gp_device *dev, const gp_bn_desc *d, const float *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const float *dy, float *sums)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    const int64_t C = d->c;
    BN_FOR_UNITS(dev, d, c0, {
        double sdy[BN_MAX_BLOCK], sdyx[BN_MAX_BLOCK];
        float sc[BN_MAX_BLOCK], sh[BN_MAX_BLOCK]; /* d->relu: the forward's */
        if (d->relu) fwd_coeffs(d, c0, mean, var, gamma, beta, sc, sh);
        chan_grad_sums(d, x, dy, mean, c0, d->relu ? sc : NULL, d->relu ? sh : NULL, sdy, sdyx,
                       false);
        for (int64_t b = 0; b < unit_; b++) {
            sums[c0 + b] = (float)sdy[b];
            sums[C + c0 + b] = (float)sdyx[b];
        }
    });
    return GP_OK;
}

gp_status gp_cpu_bn_bwd_apply(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const float *dy, const float *sums,
                              double count, float *dx, const float *local, float *dgamma,
                              float *dbeta)
{
    GP_TRY(gp_bn_desc_check(dev, d)); /* count: checked by gp_dev_bn_bwd_apply */
    const int64_t C = d->c;
    BN_FOR_UNITS(dev, d, c0, {
        float ka[BN_MAX_BLOCK], kb[BN_MAX_BLOCK], kc[BN_MAX_BLOCK];
        float sc[BN_MAX_BLOCK], sh[BN_MAX_BLOCK]; /* d->relu: the forward's */
        if (d->relu) fwd_coeffs(d, c0, mean, var, gamma, beta, sc, sh);
        for (int64_t b = 0; b < unit_; b++) {
            int64_t c = c0 + b;
            const float g = gamma ? gamma[c] : 1.0f;
            double dg, db;
            gp_ew_bn_bwd_coeffs(var[c], d->eps, g, (double)sums[c], (double)sums[C + c], count,
                                &ka[b], &kb[b], &kc[b], &dg, &db);
            if (dgamma && local) {
                /* this device's share of the parameter gradients */
                float unused[3];
                gp_ew_bn_bwd_coeffs(var[c], d->eps, g, (double)local[c], (double)local[C + c],
                                    count, &unused[0], &unused[1], &unused[2], &dg, &db);
                dgamma[c] += (float)dg;
                if (dbeta) dbeta[c] += (float)db;
            }
        }
        if (dx)
            chan_apply(d, x, dy, dx, c0, ka, kb, kc, mean + c0, d->relu ? sc : NULL,
                       d->relu ? sh : NULL, false);
    });
    return GP_OK;
}
