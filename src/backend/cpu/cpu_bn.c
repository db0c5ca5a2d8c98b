/*
 * cpu_bn.c — batch normalisation on plain NCHW (and (N, C) for 1-d) with
 * OpenMP loops; the per-element arithmetic is in backend/elementwise.h.
 *
 * Why not oneDNN: its plain-layout (ncsp) batch norm makes separate sweeps
 * over the whole tensor and measured 7.4 ms forward / 9.7 ms backward for
 * (128, 64, 28, 28) on 2 cores, about a quarter of a convnet step.  Here each
 * task owns a block of channels whose data (~256 KiB) stays in L2 across the
 * passes (mean, variance, normalise; sums, dx), so the tensor crosses memory
 * about once per direction: 2.3 ms / 3.6 ms for the same shape
 * (bench/bench_ops.c).
 *
 * Statistics: two passes per channel in double (mean, then squared
 * deviations), so no cancellation; var is the biased variance.  Sums use
 * `omp simd` reductions: the order is fixed for a build and processor (the
 * AVX-512, AVX2 and baseline versions, GP_CPU_LOOPS, sum across 8, 4 or
 * 2 lanes), so results are deterministic and independent of the thread
 * count, and may differ in the last bits between kinds of processor.
 */
#include "backend/cpu/cpu_impl.h"
#include "backend/elementwise.h"

#include <omp.h>

/* Channels per task so that one task's data is about 64 Ki floats. */
static int64_t bn_block(const gp_bn_desc *d)
{
    int64_t per = d->n * d->s;
    int64_t cb = per > 0 ? 65536 / per : 1;
    if (cb < 1) cb = 1;
    if (cb > d->c) cb = d->c;
    return cb;
}

/* Sum over the channel's N planes of S elements (stride C*S between planes). */
GP_CPU_LOOPS
static double chan_sum(const float *x, int64_t n, int64_t cs, int64_t s)
{
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float *p = x + i * cs;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < s; j++) acc += (double)p[j];
    }
    return acc;
}

GP_CPU_LOOPS
static double chan_sqdev(const float *x, int64_t n, int64_t cs, int64_t s, double mean)
{
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float *p = x + i * cs;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < s; j++) {
            double t = (double)p[j] - mean;
            acc += t * t;
        }
    }
    return acc;
}

GP_CPU_LOOPS
static void chan_apply(const float *x, float *y, int64_t n, int64_t cs, int64_t s,
                       float scale, float shift)
{
    for (int64_t i = 0; i < n; i++) {
        const float *p = x + i * cs;
        float *q = y + i * cs;
#pragma omp simd
        for (int64_t j = 0; j < s; j++) q[j] = gp_ew_bn_apply(p[j], scale, shift);
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_bn_fwd_train(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, float *y, float *mean,
                              float *var)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    const int64_t N = d->n, C = d->c, S = d->s, cs = C * S, cb = bn_block(d);
    const int64_t nb = (C + cb - 1) / cb;
    const double cnt = (double)(N * S);
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (N * C * S >= 32768)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c1 = (b + 1) * cb < C ? (b + 1) * cb : C;
        for (int64_t c = b * cb; c < c1; c++) {
            const float *xc = x + c * S;
            double m = chan_sum(xc, N, cs, S) / cnt;
            double v = chan_sqdev(xc, N, cs, S, m) / cnt;
            mean[c] = (float)m;
            var[c] = (float)v;
            float scale, shift;
            gp_ew_bn_coeffs(mean[c], var[c], d->eps, gamma ? gamma[c] : 1.0f,
                            beta ? beta[c] : 0.0f, &scale, &shift);
            chan_apply(xc, y + c * S, N, cs, S, scale, shift);
        }
    }
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_bn_fwd_infer(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, float *y)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    const int64_t N = d->n, C = d->c, S = d->s, cs = C * S, cb = bn_block(d);
    const int64_t nb = (C + cb - 1) / cb;
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (N * C * S >= 32768)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c1 = (b + 1) * cb < C ? (b + 1) * cb : C;
        for (int64_t c = b * cb; c < c1; c++) {
            float scale, shift;
            gp_ew_bn_coeffs(mean[c], var[c], d->eps, gamma ? gamma[c] : 1.0f,
                            beta ? beta[c] : 0.0f, &scale, &shift);
            chan_apply(x + c * S, y + c * S, N, cs, S, scale, shift);
        }
    }
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_bn_bwd(gp_device *dev, const gp_bn_desc *d, const float *x,
                        const float *gamma, const float *mean, const float *var,
                        const float *dy, float *dx, float *dgamma, float *dbeta)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    const int64_t N = d->n, C = d->c, S = d->s, cs = C * S, cb = bn_block(d);
    const int64_t nb = (C + cb - 1) / cb;
    const double cnt = (double)(N * S);
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (N * C * S >= 32768)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c1 = (b + 1) * cb < C ? (b + 1) * cb : C;
        for (int64_t c = b * cb; c < c1; c++) {
            const float *xc = x + c * S, *gc = dy + c * S;
            float *dc = dx + c * S;
            const float m = mean[c];
            double sdy = 0.0, sdyx = 0.0;
            for (int64_t i = 0; i < N; i++) {
                const float *p = xc + i * cs, *g = gc + i * cs;
#pragma omp simd reduction(+ : sdy, sdyx)
                for (int64_t j = 0; j < S; j++) {
                    sdy += (double)g[j];
                    sdyx += (double)g[j] * ((double)p[j] - (double)m);
                }
            }
            float ka, kb, kc;
            double dg, db;
            gp_ew_bn_bwd_coeffs(var[c], d->eps, gamma ? gamma[c] : 1.0f, sdy, sdyx, cnt, &ka,
                                &kb, &kc, &dg, &db);
            if (dgamma) dgamma[c] += (float)dg;
            if (dbeta) dbeta[c] += (float)db;
            for (int64_t i = 0; i < N; i++) {
                const float *p = xc + i * cs, *g = gc + i * cs;
                float *q = dc + i * cs;
#pragma omp simd
                for (int64_t j = 0; j < S; j++) q[j] = gp_ew_bn_bwd_apply(g[j], p[j], m, ka, kb, kc);
            }
        }
    }
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

gp_status gp_cpu_bn_commit(gp_device *dev, int64_t c, float *rmean, float *rvar,
                           double *mean_acc, double *m2_acc, double momentum, double count)
{
    for (int64_t k = 0; k < c; k++)
        gp_ew_bn_commit(&rmean[k], &rvar[k], &mean_acc[k], &m2_acc[k], momentum, count);
    return GP_OK;
}

/* ---- synchronised batch norm: the pieces between the reductions --------- */

GP_CPU_LOOPS
gp_status gp_cpu_bn_stats(gp_device *dev, const gp_bn_desc *d, const float *x, float *mean,
                          float *var)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    const int64_t N = d->n, C = d->c, S = d->s, cs = C * S, cb = bn_block(d);
    const int64_t nb = (C + cb - 1) / cb;
    const double cnt = (double)(N * S);
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (N * C * S >= 32768)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c1 = (b + 1) * cb < C ? (b + 1) * cb : C;
        for (int64_t c = b * cb; c < c1; c++) {
            const float *xc = x + c * S;
            double m = chan_sum(xc, N, cs, S) / cnt;
            mean[c] = (float)m;
            var[c] = (float)(chan_sqdev(xc, N, cs, S, m) / cnt);
        }
    }
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_bn_bwd_sums(gp_device *dev, const gp_bn_desc *d, const float *x,
                             const float *mean, const float *dy, float *sums)
{
    GP_TRY(gp_bn_desc_check(dev, d));
    const int64_t N = d->n, C = d->c, S = d->s, cs = C * S, cb = bn_block(d);
    const int64_t nb = (C + cb - 1) / cb;
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (N * C * S >= 32768)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c1 = (b + 1) * cb < C ? (b + 1) * cb : C;
        for (int64_t c = b * cb; c < c1; c++) {
            const float *xc = x + c * S, *gc = dy + c * S;
            const float m = mean[c];
            double sdy = 0.0, sdyx = 0.0;
            for (int64_t i = 0; i < N; i++) {
                const float *p = xc + i * cs, *g = gc + i * cs;
#pragma omp simd reduction(+ : sdy, sdyx)
                for (int64_t j = 0; j < S; j++) {
                    sdy += (double)g[j];
                    sdyx += (double)g[j] * ((double)p[j] - (double)m);
                }
            }
            sums[c] = (float)sdy;
            sums[C + c] = (float)sdyx;
        }
    }
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_bn_bwd_apply(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *mean, const float *var,
                              const float *dy, const float *sums, double count, float *dx,
                              const float *local, float *dgamma, float *dbeta)
{
    GP_TRY(gp_bn_desc_check(dev, d)); /* count: checked by gp_dev_bn_bwd_apply */
    const int64_t N = d->n, C = d->c, S = d->s, cs = C * S, cb = bn_block(d);
    const int64_t nb = (C + cb - 1) / cb;
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (N * C * S >= 32768)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c1 = (b + 1) * cb < C ? (b + 1) * cb : C;
        for (int64_t c = b * cb; c < c1; c++) {
            const float g = gamma ? gamma[c] : 1.0f, m = mean[c];
            float ka, kb, kc;
            double dg, db;
            gp_ew_bn_bwd_coeffs(var[c], d->eps, g, (double)sums[c], (double)sums[C + c], count,
                                &ka, &kb, &kc, &dg, &db);
            if (dgamma && local) {
                /* this device's share of the parameter gradients */
                float unused[3];
                gp_ew_bn_bwd_coeffs(var[c], d->eps, g, (double)local[c], (double)local[C + c],
                                    count, &unused[0], &unused[1], &unused[2], &dg, &db);
                dgamma[c] += (float)dg;
                if (dbeta) dbeta[c] += (float)db;
            }
            if (!dx) continue;
            const float *xc = x + c * S, *gc = dy + c * S;
            float *dc = dx + c * S;
            for (int64_t i = 0; i < N; i++) {
                const float *p = xc + i * cs, *q = gc + i * cs;
                float *o = dc + i * cs;
#pragma omp simd
                for (int64_t j = 0; j < S; j++) o[j] = gp_ew_bn_bwd_apply(q[j], p[j], m, ka, kb, kc);
            }
        }
    }
    return GP_OK;
}
