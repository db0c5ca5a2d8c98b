/*
 * test_ref.h — host helpers and naive double-precision reference ops for
 * the layer tests (test_layers.c, test_amoeba.c): a splitmix RNG and fills,
 * downloads to double, and the reference convolution, batch norm, relu,
 * pools, instance norm, upsample, dropout2d mask and factorized reduce.
 * Plain loops, no cleverness: they are the oracle.  All static inline, so a
 * test uses what it needs.  Not thread-safe (CHECK's counters).
 */
#ifndef GP_TEST_REF_H
#define GP_TEST_REF_H

#include "layers/layers_impl.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- host helpers -------------------------------------------------------- */

typedef struct {
    uint64_t s;
} hrng;

static inline double hrng_unit(hrng *r) /* [0, 1) */
{
    r->s += 0x9e3779b97f4a7c15ull;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static inline float hrng_sym(hrng *r) { return (float)(2.0 * hrng_unit(r) - 1.0); }

static inline void fill_sym(hrng *r, float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = scale * hrng_sym(r);
}

/* Values at least `gap` away from 0 (relu kinks). */
static inline void fill_away_from_zero(hrng *r, float *x, int64_t n, float gap)
{
    for (int64_t i = 0; i < n; i++) {
        float v = hrng_sym(r);
        x[i] = v >= 0 ? gap + v : -gap + v;
    }
}

/* A random permutation of evenly spaced values (distinct maxima for pools). */
static inline void fill_distinct(hrng *r, float *x, int64_t n, float step)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)(i - n / 2) * step;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(hrng_unit(r) * (double)(i + 1));
        float t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}


static inline double *download_d(const gp_tensor *t)
{
    int64_t n = gp_tensor_numel(t);
    float *f = gpt_download(t);
    double *d = calloc((size_t)(n ? n : 1), sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    return d;
}

static inline void set_param(gp_layer *l, int p, const float *h)
{
    gp_tensor *v = &l->params[p].value;
    CHECK_OK(gp_dev_upload(l->dev, gp_f32(v), h, gp_tensor_numel(v)));
}

static inline gp_fwd_ctx train_ctx(void)
{
    gp_fwd_ctx c = {.training = true, .recompute = false, .seed = 99, .step = 4,
                    .sample_offset = 0, .batch_total = 0};
    return c;
}

static inline int param_index(const gp_layer *l, const char *name)
{
    for (int p = 0; p < l->n_params; p++)
        if (!strcmp(l->params[p].name, name)) return p;
    return -1;
}

/* ---- reference implementations (double) ---------------------------------- */

/* x (N, F), W (O, F), b (O) or NULL -> y (N, O) */
static inline void ref_linear(int64_t n, int64_t f, int64_t o, const double *x, const double *w,
                       const double *b, double *y)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < o; k++) {
            double s = b ? b[k] : 0.0;
            for (int64_t j = 0; j < f; j++) s += x[i * f + j] * w[k * f + j];
            y[i * o + k] = s;
        }
}

/* A window op: input (n, c, h, w), k output channels, kernel (kh, kw),
 * stride (sh, sw), padding (ph, pw), output (oh, ow). */
typedef struct {
    int64_t n, c, h, w, k, kh, kw, sh, sw, ph, pw, oh, ow;
} geom;

static inline geom geom_of(const gp_shape *xs, int64_t k, gp_hw kk, gp_hw st, gp_hw pad)
{
    geom g = {xs->dims[0], xs->dims[1], xs->dims[2], xs->dims[3], k, kk.h, kk.w,
              st.h, st.w, pad.h, pad.w, 0, 0};
    g.oh = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
    g.ow = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
    return g;
}

static inline void ref_conv(const geom *g, const double *x, const double *w, const double *b, double *y)
{
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t k = 0; k < g->k; k++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    double s = b ? b[k] : 0.0;
                    for (int64_t c = 0; c < g->c; c++)
                        for (int64_t ky = 0; ky < g->kh; ky++)
                            for (int64_t kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                s += x[((n * g->c + c) * g->h + iy) * g->w + ix] *
                                     w[((k * g->c + c) * g->kh + ky) * g->kw + kx];
                            }
                    y[((n * g->k + k) * g->oh + oy) * g->ow + ox] = s;
                }
}

/* Batch statistics of (N, C, S) per channel: mean and biased variance. */
static inline void ref_bn_stats(int64_t n, int64_t c, int64_t s, const double *x, double *mean,
                         double *var)
{
    for (int64_t ch = 0; ch < c; ch++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < s; j++) m += x[(i * c + ch) * s + j];
        m /= (double)(n * s);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < s; j++) {
                double d = x[(i * c + ch) * s + j] - m;
                v += d * d;
            }
        mean[ch] = m;
        var[ch] = v / (double)(n * s);
    }
}

/* mean/var NULL: batch statistics (training). */
static inline void ref_bn(int64_t n, int64_t c, int64_t s, double eps, const double *x,
                   const double *gamma, const double *beta, const double *rmean,
                   const double *rvar, double *y)
{
    double *mean = calloc((size_t)c, sizeof *mean), *var = calloc((size_t)c, sizeof *var);
    if (rmean) {
        memcpy(mean, rmean, (size_t)c * sizeof *mean);
        memcpy(var, rvar, (size_t)c * sizeof *var);
    } else {
        ref_bn_stats(n, c, s, x, mean, var);
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t j = 0; j < s; j++) {
                int64_t q = (i * c + ch) * s + j;
                y[q] = gamma[ch] * (x[q] - mean[ch]) / sqrt(var[ch] + eps) + beta[ch];
            }
    free(mean);
    free(var);
}

static inline void ref_relu(int64_t n, const double *x, double *y)
{
    for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0.0;
}

/* Max pads with -inf; the average divides by the valid elements only, or
 * with count_include_pad by the whole (padded) window, kh * kw. */
static inline void ref_pool(const geom *g, bool is_max, bool count_include_pad, const double *x,
                     double *y)
{
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t c = 0; c < g->c; c++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    double acc = is_max ? -INFINITY : 0.0;
                    int cnt = 0;
                    for (int64_t ky = 0; ky < g->kh; ky++)
                        for (int64_t kx = 0; kx < g->kw; kx++) {
                            int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
                            if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                            double v = x[((n * g->c + c) * g->h + iy) * g->w + ix];
                            if (is_max) acc = v > acc ? v : acc;
                            else acc += v;
                            cnt++;
                        }
                    if (count_include_pad) cnt = (int)(g->kh * g->kw);
                    y[((n * g->c + c) * g->oh + oy) * g->ow + ox] = is_max ? acc : acc / cnt;
                }
}

/* Each (sample, channel) plane of S values normalised by its own mean and
 * biased variance (InstanceNorm2d without affine or running statistics). */
static inline void ref_instance_norm(int64_t planes, int64_t s, double eps, const double *x, double *y)
{
    for (int64_t p = 0; p < planes; p++) {
        const double *xp = x + p * s;
        double m = 0, v = 0;
        for (int64_t j = 0; j < s; j++) m += xp[j];
        m /= (double)s;
        for (int64_t j = 0; j < s; j++) v += (xp[j] - m) * (xp[j] - m);
        v /= (double)s;
        for (int64_t j = 0; j < s; j++) y[p * s + j] = (xp[j] - m) / sqrt(v + eps);
    }
}

/* Nearest: y[n, c, i, j] = x[n, c, i / sc, j / sc]. */
static inline void ref_upsample(int64_t planes, int64_t h, int64_t w, int64_t sc, const double *x,
                         double *y)
{
    for (int64_t p = 0; p < planes; p++)
        for (int64_t i = 0; i < h * sc; i++)
            for (int64_t j = 0; j < w * sc; j++)
                y[(p * h * sc + i) * w * sc + j] = x[(p * h + i / sc) * w + j / sc];
}

/* The (N, C) dropout2d mask of a micro-batch, from the core RNG: element
 * (n, c) of the whole mini-batch draws at (sample_offset + n) * C + c. */
static inline double ref_dropout2d_mask(const gp_layer *l, const gp_fwd_ctx *ctx, int64_t n, int64_t c,
                                 int64_t C)
{
    uint64_t stream = gp_rng_stream(ctx->step, (uint64_t)l->index, 0x64723264ull); /* "dr2d" */
    float u = gp_rng_uniform(ctx->seed, stream, (uint64_t)((ctx->sample_offset + n) * C + c));
    return u >= l->spec.p ? 1.0 / (1.0 - (double)l->spec.p) : 0.0;
}

/* torchgpipe's FactorizedReduce before its norm, as written there: relu,
 * conv1 (1x1, stride 2) on it, conv2 on ZeroPad2d((0, 1, 0, 1))(r[:, :,
 * 1:, 1:]), concatenated along channels: cat (N, K, ceil(H/2), ceil(W/2)).
 * w1, w2 (K/2, C, 1, 1). */
static inline void ref_fr_cat(const gp_shape *xs, int64_t K, const double *x, const double *w1,
                       const double *w2, double *cat)
{
    int64_t N = xs->dims[0], C = xs->dims[1], H = xs->dims[2], W = xs->dims[3];
    int64_t nx = gp_shape_numel(xs), half = K / 2;
    double *r = calloc((size_t)nx, sizeof *r), *sh = calloc((size_t)nx, sizeof *sh);
    ref_relu(nx, x, r);
    for (int64_t p = 0; p < N * C; p++)
        for (int64_t i = 0; i + 1 < H; i++)
            for (int64_t j = 0; j + 1 < W; j++)
                sh[(p * H + i) * W + j] = r[(p * H + i + 1) * W + j + 1];
    geom g = geom_of(xs, half, gp_hw_square(1), gp_hw_square(2), gp_hw_square(0));
    int64_t s = g.oh * g.ow, nh = N * half * s;
    double *c1 = calloc((size_t)nh, sizeof *c1), *c2 = calloc((size_t)nh, sizeof *c2);
    ref_conv(&g, r, w1, NULL, c1);
    ref_conv(&g, sh, w2, NULL, c2);
    for (int64_t n = 0; n < N; n++) {
        memcpy(cat + n * K * s, c1 + n * half * s, (size_t)(half * s) * sizeof *cat);
        memcpy(cat + (n * K + half) * s, c2 + n * half * s, (size_t)(half * s) * sizeof *cat);
    }
    free(r);
    free(sh);
    free(c1);
    free(c2);
}

/* L = sum(y * r) of a forward of x (an array of the layer's n_in inputs)
 * under ctx, accumulated in double: the function finite differences
 * differentiate. */
static inline double loss_of(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                             const double *r)
{
    gp_tensor y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(l, ctx, x, &y, &s));
    float *h = gpt_download(&y);
    double L = 0;
    for (int64_t i = 0; i < gp_tensor_numel(&y); i++) L += (double)h[i] * r[i];
    free(h);
    gp_saved_free(&s);
    gp_tensor_free(&y);
    return L;
}

#endif /* GP_TEST_REF_H */
