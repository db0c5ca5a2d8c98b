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

#include <omp.h>

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
 * blocked layout a multiple of the block. */
static int64_t bn_block(const gp_bn_desc *d)
{
    int64_t per = d->n * d->s;
    int64_t cb = per > 0 ? 65536 / per : 1;
    if (cb < 1) cb = 1;
    if (cb > d->c) cb = d->c;
    if (d->blk) cb = (cb + d->blk - 1) / d->blk * d->blk;
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

/* `cnt` consecutive pixels of one plain channel into lanes 0 .. cnt - 1. */
static inline __attribute__((always_inline)) void
lanes_add(double *a1, double *a2, const float *p, const float *q, double k, int cnt,
          const float *msk)
{
    if (q && msk) { /* dy masked by the relu after the norm: msk = scale, shift */
        const float sc = msk[0], sh = msk[1];
#pragma omp simd
        for (int l = 0; l < cnt; l++) {
            double gv = (double)gp_ew_bn_relu_dy(q[l], p[l], sc, sh);
            a1[l] += gv;
            a2[l] += gv * ((double)p[l] - k);
        }
    } else if (q) {
#pragma omp simd
        for (int l = 0; l < cnt; l++) {
            double gv = (double)q[l];
            a1[l] += gv;
            a2[l] += gv * ((double)p[l] - k);
        }
    } else {
#pragma omp simd
        for (int l = 0; l < cnt; l++) {
            double t = (double)p[l] - k;
            a1[l] += t;
            a2[l] += t * t;
        }
    }
}

/* One channel of a plain layout: x at cs between samples, S contiguous. */
static inline __attribute__((always_inline)) void
sums_plain(const float *x, const float *g, int64_t n, int64_t cs, int64_t s, double k,
           const float *msk, double *s1, double *s2)
{
    double a1[BN_LANES] = {0}, a2[BN_LANES] = {0};
    const int64_t sv = s - s % BN_LANES;
    for (int64_t i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = g ? g + i * cs : NULL;
        for (int64_t j = 0; j < sv; j += BN_LANES)
            lanes_add(a1, a2, p + j, q ? q + j : NULL, k, BN_LANES, msk);
        lanes_add(a1, a2, p + sv, q ? q + sv : NULL, k, (int)(s - sv), msk); /* the tail */
    }
    *s1 = lanes_total(a1);
    *s2 = lanes_total(a2);
}

/* B channels of a blocked layout at once: pixel j's B values contiguous,
 * samples cs apart; k[b] per channel. */
static inline __attribute__((always_inline)) void
sums_block(const float *x, const float *g, int64_t n, int64_t cs, int64_t s, const int64_t B,
           const double *k, const float *msc, const float *msh, double *s1, double *s2)
{
    double a1[BN_LANES][BN_MAX_BLOCK] = {{0}}, a2[BN_LANES][BN_MAX_BLOCK] = {{0}};
    float ms[BN_MAX_BLOCK], mh[BN_MAX_BLOCK]; /* in registers, as apply_block's */
    for (int64_t b = 0; b < B; b++) ms[b] = msc ? msc[b] : 0.0f, mh[b] = msh ? msh[b] : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = g ? g + i * cs : NULL;
        for (int64_t j = 0, l = 0; j < s; j++, l = l + 1 == BN_LANES ? 0 : l + 1) {
            const float *pj = p + j * B;
            double *u = a1[l], *v = a2[l];
            if (q && msc) { /* dy masked by the relu after the norm */
                const float *qj = q + j * B;
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    double gv = (double)gp_ew_bn_relu_dy(qj[b], pj[b], ms[b], mh[b]);
                    u[b] += gv;
                    v[b] += gv * ((double)pj[b] - k[b]);
                }
            } else if (q) {
                const float *qj = q + j * B;
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    double gv = (double)qj[b];
                    u[b] += gv;
                    v[b] += gv * ((double)pj[b] - k[b]);
                }
            } else {
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    double t = (double)pj[b] - k[b];
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
GP_CPU_LOOPS
static void chan_sums(const gp_bn_desc *d, const float *x, const float *g, int64_t c0,
                      double *k, bool set_k, const float *msc, const float *msh, double *s1,
                      double *s2)
{
    const int64_t cs = d->c * d->s, o = chan_base(d, c0);
    const int64_t B = d->blk ? d->blk : 1;
    if (set_k)
        for (int64_t b = 0; b < B; b++) k[b] = (double)x[o + b];
    const float msk[2] = {msc ? msc[0] : 0.0f, msh ? msh[0] : 0.0f};
    if (!d->blk)
        sums_plain(x + o, g ? g + o : NULL, d->n, cs, d->s, k[0], msc ? msk : NULL, s1, s2);
    else if (B == 16)
        sums_block(x + o, g ? g + o : NULL, d->n, cs, d->s, 16, k, msc, msh, s1, s2);
    else sums_block(x + o, g ? g + o : NULL, d->n, cs, d->s, 8, k, msc, msh, s1, s2);
}

/* The backward's sums of channels [c0, c0 + unit): dy, and dy (x - mean);
 * dy masked where msc is given (chan_sums). */
static void chan_grad_sums(const gp_bn_desc *d, const float *x, const float *dy,
                           const float *mean, int64_t c0, const float *msc, const float *msh,
                           double *sdy, double *sdyx)
{
    double k[BN_MAX_BLOCK];
    for (int64_t b = 0; b < (d->blk ? d->blk : 1); b++) k[b] = (double)mean[c0 + b];
    chan_sums(d, x, dy, c0, k, false, msc, msh, sdy, sdyx);
}

/* Mean and biased variance of channels [c0, c0 + B) from one pass. */
static void chan_stats(const gp_bn_desc *d, const float *x, int64_t c0, float *mean, float *var)
{
    double k[BN_MAX_BLOCK], s1[BN_MAX_BLOCK], s2[BN_MAX_BLOCK];
    const double cnt = (double)(d->n * d->s);
    chan_sums(d, x, NULL, c0, k, true, NULL, NULL, s1, s2);
    for (int64_t b = 0; b < (d->blk ? d->blk : 1); b++) {
        double off = s1[b] / cnt, v = s2[b] / cnt - off * off;
        mean[c0 + b] = (float)(k[b] + off);
        var[c0 + b] = (float)(v < 0.0 ? 0.0 : v); /* rounding's negatives; NaN stays */
    }
}

/* ---- the per-element passes over channels [c0, c0 + B) ----------------------- */

/* B channels of a blocked layout: the coefficients of one pixel's B values
 * stay in registers (B a constant where it is inlined). */
static inline __attribute__((always_inline)) void
apply_block(const float *x, const float *g, float *y, int64_t n, int64_t cs, int64_t s,
            const int64_t B, const float *ca, const float *cb, const float *cc, const float *cm,
            bool relu, const float *msc, const float *msh, const float *add)
{
    float a[BN_MAX_BLOCK], b2[BN_MAX_BLOCK], c[BN_MAX_BLOCK], m[BN_MAX_BLOCK];
    float ms[BN_MAX_BLOCK], mh[BN_MAX_BLOCK];
    for (int64_t b = 0; b < B; b++) {
        a[b] = ca[b], b2[b] = cb[b];
        c[b] = cc ? cc[b] : 0.0f, m[b] = cm ? cm[b] : 0.0f;
        ms[b] = msc ? msc[b] : 0.0f, mh[b] = msh ? msh[b] : 0.0f;
    }
    for (int64_t i = 0; i < n; i++) {
        const float *p = x + i * cs, *q = g ? g + i * cs : NULL;
        float *r = y + i * cs;
        if (add) { /* a residual sum, then relu where asked */
            const float *t = add + i * cs;
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    float v = gp_ew_bn_apply(p[j * B + b], a[b], b2[b]) + t[j * B + b];
                    r[j * B + b] = relu ? gp_ew_relu(v) : v;
                }
            }
        } else if (q && msc) {
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++) {
                    float gv = gp_ew_bn_relu_dy(q[j * B + b], p[j * B + b], ms[b], mh[b]);
                    r[j * B + b] = gp_ew_bn_bwd_apply(gv, p[j * B + b], m[b], a[b], b2[b], c[b]);
                }
            }
        } else if (q) {
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++)
                    r[j * B + b] = gp_ew_bn_bwd_apply(q[j * B + b], p[j * B + b], m[b], a[b],
                                                      b2[b], c[b]);
            }
        } else if (relu) {
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++)
                    r[j * B + b] = gp_ew_relu(gp_ew_bn_apply(p[j * B + b], a[b], b2[b]));
            }
        } else {
            for (int64_t j = 0; j < s; j++) {
#pragma omp simd
                for (int64_t b = 0; b < B; b++) r[j * B + b] = gp_ew_bn_apply(p[j * B + b], a[b], b2[b]);
            }
        }
    }
}

/* y = x scale + shift (fwd; then relu where d->relu) or dx = a dy + b (x -
 * m) + c (bwd: g = dy; masked by the relu after the norm where msc, msh,
 * the forward's scale and shift, are given), with per-channel
 * coefficients, over channels [c0, c0 + unit). */
GP_CPU_LOOPS
static void chan_apply(const gp_bn_desc *d, const float *x, const float *g, float *y,
                       int64_t c0, const float *ca, const float *cb, const float *cc,
                       const float *cm, const float *msc, const float *msh)
{
    const int64_t cs = d->c * d->s, o = chan_base(d, c0), S = d->s, N = d->n;
    const bool relu = !g && d->relu;
    const float *ad = !g && d->add ? d->add + o : NULL; /* forward only */
    if (d->blk == 16) {
        apply_block(x + o, g ? g + o : NULL, y + o, N, cs, S, 16, ca, cb, cc, cm, relu, msc,
                    msh, ad);
        return;
    }
    if (d->blk) {
        apply_block(x + o, g ? g + o : NULL, y + o, N, cs, S, 8, ca, cb, cc, cm, relu, msc, msh,
                    ad);
        return;
    }
    const float a = ca[0], b = cb[0], c = cc ? cc[0] : 0.0f, m = cm ? cm[0] : 0.0f;
    const float ms = msc ? msc[0] : 0.0f, mh = msh ? msh[0] : 0.0f;
    for (int64_t i = 0; i < N; i++) {
        const float *p = x + o + i * cs, *q = g ? g + o + i * cs : NULL;
        float *r = y + o + i * cs;
        if (ad) { /* a residual sum, then relu where asked */
            const float *t = ad + i * cs;
            if (relu) {
#pragma omp simd
                for (int64_t j = 0; j < S; j++) r[j] = gp_ew_relu(gp_ew_bn_apply(p[j], a, b) + t[j]);
            } else {
#pragma omp simd
                for (int64_t j = 0; j < S; j++) r[j] = gp_ew_bn_apply(p[j], a, b) + t[j];
            }
        } else if (q && msc) {
#pragma omp simd
            for (int64_t j = 0; j < S; j++)
                r[j] = gp_ew_bn_bwd_apply(gp_ew_bn_relu_dy(q[j], p[j], ms, mh), p[j], m, a, b, c);
        } else if (q) {
#pragma omp simd
            for (int64_t j = 0; j < S; j++) r[j] = gp_ew_bn_bwd_apply(q[j], p[j], m, a, b, c);
        } else if (relu) {
#pragma omp simd
            for (int64_t j = 0; j < S; j++) r[j] = gp_ew_relu(gp_ew_bn_apply(p[j], a, b));
        } else {
#pragma omp simd
            for (int64_t j = 0; j < S; j++) r[j] = gp_ew_bn_apply(p[j], a, b);
        }
    }
}

/* The forward's per-channel scale and shift of channels [c0, c0 + unit). */
static void fwd_coeffs(const gp_bn_desc *d, int64_t c0, const float *mean, const float *var,
                       const float *gamma, const float *beta, float *sc, float *sh)
{
    for (int64_t b = 0; b < (d->blk ? d->blk : 1); b++) {
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
        const int64_t unit_ = (d)->blk ? (d)->blk : 1;                                        \
        for (int64_t c0 = lo_; c0 < hi_; c0 += unit_) { __VA_ARGS__ }                         \
    })

/* The bodies of bn_fwd_train, bn_fwd_infer and bn_bwd over the units of
 * channels [lo, hi): run by BN_FOR_RUNS on the tensors themselves, and by
 * bn_bf16 on a task's FP32 tiles. */
static void fwd_train_run(const gp_bn_desc *d, const float *x, const float *gamma,
                          const float *beta, float *y, float *mean, float *var, int64_t lo,
                          int64_t hi)
{
    for (int64_t c0 = lo; c0 < hi; c0 += d->blk ? d->blk : 1) {
        float sc[BN_MAX_BLOCK], sh[BN_MAX_BLOCK];
        chan_stats(d, x, c0, mean, var);
        fwd_coeffs(d, c0, mean, var, gamma, beta, sc, sh);
        chan_apply(d, x, NULL, y, c0, sc, sh, NULL, NULL, NULL, NULL);
    }
}

static void fwd_infer_run(const gp_bn_desc *d, const float *x, const float *gamma,
                          const float *beta, const float *mean, const float *var, float *y,
                          int64_t lo, int64_t hi)
{
    for (int64_t c0 = lo; c0 < hi; c0 += d->blk ? d->blk : 1) {
        float sc[BN_MAX_BLOCK], sh[BN_MAX_BLOCK];
        fwd_coeffs(d, c0, mean, var, gamma, beta, sc, sh);
        chan_apply(d, x, NULL, y, c0, sc, sh, NULL, NULL, NULL, NULL);
    }
}

static void bwd_run(const gp_bn_desc *d, const float *x, const float *gamma, const float *beta,
                    const float *mean, const float *var, const float *dy, float *dx,
                    float *dgamma, float *dbeta, int64_t lo, int64_t hi)
{
    const double cnt = (double)(d->n * d->s);
    const int64_t unit = d->blk ? d->blk : 1;
    for (int64_t c0 = lo; c0 < hi; c0 += unit) {
        double sdy[BN_MAX_BLOCK], sdyx[BN_MAX_BLOCK];
        float ka[BN_MAX_BLOCK], kb[BN_MAX_BLOCK], kc[BN_MAX_BLOCK];
        float sc[BN_MAX_BLOCK], sh[BN_MAX_BLOCK]; /* d->relu: the forward's */
        if (d->relu) fwd_coeffs(d, c0, mean, var, gamma, beta, sc, sh);
        const float *msc = d->relu ? sc : NULL, *msh = d->relu ? sh : NULL;
        chan_grad_sums(d, x, dy, mean, c0, msc, msh, sdy, sdyx);
        for (int64_t b = 0; b < unit; b++) {
            int64_t c = c0 + b;
            double dg, db;
            gp_ew_bn_bwd_coeffs(var[c], d->eps, gamma ? gamma[c] : 1.0f, sdy[b], sdyx[b], cnt,
                                &ka[b], &kb[b], &kc[b], &dg, &db);
            if (dgamma) dgamma[c] += (float)dg;
            if (dbeta) dbeta[c] += (float)db;
        }
        chan_apply(d, x, dy, dx, c0, ka, kb, kc, mean + c0, msc, msh);
    }
}

gp_status gp_cpu_bn_fwd_train(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, float *y, float *mean,
                              float *var)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_RUNS(dev, d, lo, hi, { fwd_train_run(d, x, gamma, beta, y, mean, var, lo, hi); });
    return GP_OK;
}

gp_status gp_cpu_bn_fwd_infer(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, float *y)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_RUNS(dev, d, lo, hi, { fwd_infer_run(d, x, gamma, beta, mean, var, y, lo, hi); });
    return GP_OK;
}

gp_status gp_cpu_bn_bwd(gp_device *dev, const gp_bn_desc *d, const float *x,
                        const float *gamma, const float *beta, const float *mean,
                        const float *var, const float *dy, float *dx, float *dgamma,
                        float *dbeta)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    BN_FOR_RUNS(dev, d, lo, hi,
                { bwd_run(d, x, gamma, beta, mean, var, dy, dx, dgamma, dbeta, lo, hi); });
    return GP_OK;
}

/* ---- on bf16 storage (backend.h's bn_*_bf16) ---------------------------------
 * A task's channels [lo, hi) are, in every sample, one contiguous run of
 * (hi - lo) S values (plain and blocked layouts alike: bn_block's runs are
 * whole blocks).  The task widens its runs of x (and dy) into FP32 tiles
 * laid out as a tensor of hi - lo channels, runs the FP32 body above on
 * them, and rounds its output tile into the runs of y (dx) once: the same
 * sums in the same order and the same per-element math as the FP32 slots
 * on the widened tensor, so the bits are the storage adapter's, while the
 * FP32 copies are a few tiles (one per task in flight, in the device's
 * arena, about bn_block's 64 Ki values each) instead of whole tensors. */

typedef enum { BN_FWD_TRAIN, BN_FWD_INFER, BN_BWD } bn_op;

typedef struct {
    bn_op op;
    const uint16_t *x, *dy; /* dy: backward; the residual (d->add16): forward */
    uint16_t *out;          /* y, or dx */
    const float *gamma, *beta, *mean, *var; /* mean, var: inference, backward */
    float *mean_out, *var_out;              /* training forward */
    float *dgamma, *dbeta;                  /* backward */
} bn_bf16_args;

static inline const float *at(const float *p, int64_t k) { return p ? p + k : NULL; }
static inline float *at_w(float *p, int64_t k) { return p ? p + k : NULL; }

GP_CPU_LOOPS
static void runs_widen(float *tile, const uint16_t *src, int64_t n, int64_t cs, int64_t len)
{
    for (int64_t i = 0; i < n; i++) gp_cpu_widen_run(tile + i * len, src + i * cs, len);
}

GP_CPU_LOOPS
static void runs_round(uint16_t *dst, const float *tile, int64_t n, int64_t cs, int64_t len)
{
    for (int64_t i = 0; i < n; i++) gp_cpu_round_run(dst + i * cs, tile + i * len, len);
}

/* One task: channels [lo, hi) through tiles tx, tg (backward: dy; forward
 * with a residual: the residual, which the FP32 body then adds as its
 * d->add), ty. */
static void bf16_task(const gp_bn_desc *d, const bn_bf16_args *a, int64_t lo, int64_t hi,
                      float *tx, float *tg, float *ty)
{
    const int64_t cs = d->c * d->s, len = (hi - lo) * d->s, o = lo * d->s;
    gp_bn_desc t = *d;
    t.c = hi - lo;
    t.add16 = NULL;
    runs_widen(tx, a->x + o, d->n, cs, len);
    if (a->op == BN_BWD) runs_widen(tg, a->dy + o, d->n, cs, len);
    if (a->op != BN_BWD && d->add16) {
        runs_widen(tg, d->add16 + o, d->n, cs, len);
        t.add = tg;
    }
    const float *g = at(a->gamma, lo), *b = at(a->beta, lo);
    if (a->op == BN_FWD_TRAIN)
        fwd_train_run(&t, tx, g, b, ty, a->mean_out + lo, a->var_out + lo, 0, t.c);
    else if (a->op == BN_FWD_INFER)
        fwd_infer_run(&t, tx, g, b, a->mean + lo, a->var + lo, ty, 0, t.c);
    else
        bwd_run(&t, tx, g, b, a->mean + lo, a->var + lo, tg, ty, at_w(a->dgamma, lo),
                at_w(a->dbeta, lo), 0, t.c);
    runs_round(a->out + o, ty, d->n, cs, len);
}

static gp_status bn_bf16(gp_device *dev, const gp_bn_desc *d, const bn_bf16_args *a)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    if (d->add || (a->op == BN_BWD && d->add16))
        return gp_error_set(GP_ERR_INVALID, "device %s: batch norm on bf16 storage takes its "
                                            "forward's residual in bf16 (gp_bn_desc.add16), "
                                            "not FP32 (.add)", dev->name);
    if (d->n * d->c * d->s == 0) return GP_OK;
    const int64_t cb = bn_block(d), nb = (d->c + cb - 1) / cb;
    const int64_t tile = d->n * cb * d->s; /* values, the largest task's */
    const int ntiles = a->op == BN_BWD || d->add16 ? 3 : 2;
    const bool par = d->n * d->c * d->s >= 32768;
    const int nt = par ? dev->threads : 1;
    GP_TRY(gp_cpu_arena_reserve(dev, (size_t)nt * (size_t)ntiles * (size_t)tile * sizeof(float)));
    float *arena = gp_cpu_ctx_of(dev)->arena;
#pragma omp parallel num_threads(nt) if (par)
    {
        float *tx = arena + (size_t)omp_get_thread_num() * (size_t)ntiles * (size_t)tile;
        float *ty = tx + tile, *tg = ntiles == 3 ? ty + tile : NULL;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++)
            bf16_task(d, a, b * cb, (b + 1) * cb < d->c ? (b + 1) * cb : d->c, tx, tg, ty);
    }
    return GP_OK;
}

gp_status gp_cpu_bn_fwd_train_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, uint16_t *y,
                                   float *mean, float *var)
{
    bn_bf16_args a = {.op = BN_FWD_TRAIN, .x = x, .out = y, .gamma = gamma, .beta = beta,
                      .mean_out = mean, .var_out = var};
    return bn_bf16(dev, d, &a);
}

gp_status gp_cpu_bn_fwd_infer_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, const float *mean,
                                   const float *var, uint16_t *y)
{
    bn_bf16_args a = {.op = BN_FWD_INFER, .x = x, .out = y, .gamma = gamma, .beta = beta,
                      .mean = mean, .var = var};
    return bn_bf16(dev, d, &a);
}

gp_status gp_cpu_bn_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const uint16_t *dy, uint16_t *dx, float *dgamma,
                             float *dbeta)
{
    bn_bf16_args a = {.op = BN_BWD, .x = x, .dy = dy, .out = dx, .gamma = gamma,
                      .beta = beta, .mean = mean, .var = var,
                      .dgamma = dgamma, .dbeta = dbeta};
    return bn_bf16(dev, d, &a);
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
    for (int i = 0; i < n; i++)
        GP_TRY(gp_cpu_bn_commit(dev, parts[i].c, parts[i].rmean, parts[i].rvar, parts[i].mean_acc,
                                parts[i].m2_acc, parts[i].momentum, parts[i].count));
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
    BN_FOR_UNITS(dev, d, c0, { chan_stats(d, x, c0, mean, var); });
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
        chan_grad_sums(d, x, dy, mean, c0, d->relu ? sc : NULL, d->relu ? sh : NULL, sdy, sdyx);
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
                       d->relu ? sh : NULL);
    });
    return GP_OK;
}
