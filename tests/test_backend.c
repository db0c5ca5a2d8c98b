/*
 * test_backend.c — the CPU backend against naive reference loops (double
 * precision) on random data with odd sizes: every math slot of the device
 * interface, the accumulate (+=) vs overwrite (=) conventions, the memory
 * accounting and OOM message, cross-device copies and the primitive cache.
 *
 * Convolutions run on a device with the default layout policy (plain for few
 * channels, blocked for >= 16) and on one forced to blocked layouts
 * (GPIPE_CPU_CONV=blocked), so both code paths meet the same oracle.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_impl.h" /* gp_cpu_conv_act_reorders */
#include "backend/elementwise.h"
#include "test_util.h"

#include <float.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_state = 0x12345678u;

static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *dalloc(gp_device *dev, int64_t n)
{
    void *p = NULL;
    gp_status s = gp_dev_alloc(dev, (size_t)(n > 0 ? n : 1) * sizeof(float), GP_MEM_ACTIVATIONS, &p);
    if (s != GP_OK) {
        fprintf(stderr, "allocation failed: %s\n", gp_last_error());
        exit(1);
    }
    return p;
}

static void dfree(gp_device *dev, float *p, int64_t n)
{
    gp_dev_free(dev, p, (size_t)(n > 0 ? n : 1) * sizeof(float), GP_MEM_ACTIVATIONS);
}

static float *drand(gp_device *dev, int64_t n)
{
    float *h = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = frand();
    float *d = dalloc(dev, n);
    gp_dev_upload(dev, d, h, n);
    free(h);
    return d;
}

/* One check per array: max |got - ref| <= tol * (1 + max |ref|). */
static void check_close(const char *what, const float *got, const double *ref, int64_t n,
                        double tol)
{
    double maxerr = 0, maxref = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (!(e <= maxerr)) { maxerr = e; at = i; }
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    }
    CHECK_MSG(maxerr <= tol * (1.0 + maxref), "%s: max error %.3g at %lld (got %.9g, ref %.9g), "
              "max |ref| %.3g", what, maxerr, (long long)at, n ? (double)got[at] : 0.0,
              n ? ref[at] : 0.0, maxref);
}

static double *dcopy_f(const float *x, int64_t n)
{
    double *r = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) r[i] = x[i];
    return r;
}

/* ---- convolution ------------------------------------------------------------- */

static void ref_conv_fwd(const gp_conv_desc *d, const float *x, const float *w, const float *b,
                         double *y)
{
    for (int64_t n = 0; n < d->n; n++)
        for (int64_t k = 0; k < d->k; k++)
            for (int64_t oh = 0; oh < d->oh; oh++)
                for (int64_t ow = 0; ow < d->ow; ow++) {
                    double s = d->has_bias ? b[k] : 0.0;
                    for (int64_t c = 0; c < d->c; c++)
                        for (int64_t i = 0; i < d->kh; i++)
                            for (int64_t j = 0; j < d->kw; j++) {
                                int64_t ih = oh * d->sh - d->ph + i, iw = ow * d->sw - d->pw + j;
                                if (ih < 0 || ih >= d->h || iw < 0 || iw >= d->w) continue;
                                s += (double)x[((n * d->c + c) * d->h + ih) * d->w + iw] *
                                     w[((k * d->c + c) * d->kh + i) * d->kw + j];
                            }
                    y[((n * d->k + k) * d->oh + oh) * d->ow + ow] = s;
                }
}

/* dx = conv^T(dy, w); dw += ..., db += ... (dw, db hold their start values) */
static void ref_conv_bwd(const gp_conv_desc *d, const float *x, const float *w, const float *dy,
                         double *dx, double *dw, double *db)
{
    memset(dx, 0, sizeof(double) * (size_t)(d->n * d->c * d->h * d->w));
    for (int64_t n = 0; n < d->n; n++)
        for (int64_t k = 0; k < d->k; k++)
            for (int64_t oh = 0; oh < d->oh; oh++)
                for (int64_t ow = 0; ow < d->ow; ow++) {
                    double g = dy[((n * d->k + k) * d->oh + oh) * d->ow + ow];
                    if (db) db[k] += g;
                    for (int64_t c = 0; c < d->c; c++)
                        for (int64_t i = 0; i < d->kh; i++)
                            for (int64_t j = 0; j < d->kw; j++) {
                                int64_t ih = oh * d->sh - d->ph + i, iw = ow * d->sw - d->pw + j;
                                if (ih < 0 || ih >= d->h || iw < 0 || iw >= d->w) continue;
                                int64_t xi = ((n * d->c + c) * d->h + ih) * d->w + iw;
                                int64_t wi = ((k * d->c + c) * d->kh + i) * d->kw + j;
                                dx[xi] += g * w[wi];
                                dw[wi] += g * x[xi];
                            }
                }
}

/* kernel (kh, kw), stride (sh, sw), padding (ph, pw): each axis its own. */
static void test_conv_hw(gp_device *dev, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                         int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                         int bias)
{
    gp_conv_desc d = {n, c, h, w, k, kh, kw, sh, sw, ph, pw,
                      (h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1, bias, 0, 0};
    char tag[200];
    snprintf(tag, sizeof tag, "%s conv n%lld c%lld %lldx%lld k%lld ker%lldx%lld s%lldx%lld "
             "p%lldx%lld b%d", dev->name, (long long)n, (long long)c, (long long)h,
             (long long)w, (long long)k, (long long)kh, (long long)kw, (long long)sh,
             (long long)sw, (long long)ph, (long long)pw, bias);
    int64_t nx = n * c * h * w, nw = k * c * kh * kw, ny = n * k * d.oh * d.ow;
    float *x = drand(dev, nx), *wt = drand(dev, nw), *b = drand(dev, k), *dy = drand(dev, ny);
    float *y = dalloc(dev, ny), *dx = dalloc(dev, nx), *dw = drand(dev, nw), *db = drand(dev, k);
    double *ry = malloc(sizeof(double) * (size_t)ny), *rdx = malloc(sizeof(double) * (size_t)nx);
    double *rdw = dcopy_f(dw, nw), *rdb = dcopy_f(db, k);
    char what[256];

    /* Garbage in the outputs: "=" must overwrite it. */
    for (int64_t i = 0; i < ny; i++) y[i] = 1e6f;
    for (int64_t i = 0; i < nx; i++) dx[i] = -1e6f;
    CHECK_OK(gp_dev_conv_fwd(dev, &d, x, wt, bias ? b : NULL, y));
    ref_conv_fwd(&d, x, wt, b, ry);
    snprintf(what, sizeof what, "%s fwd", tag);
    check_close(what, y, ry, ny, 1e-5);

    CHECK_OK(gp_dev_conv_bwd_data(dev, &d, wt, dy, dx));
    CHECK_OK(gp_dev_conv_bwd_weights(dev, &d, x, dy, dw, bias ? db : NULL));
    ref_conv_bwd(&d, x, wt, dy, rdx, rdw, bias ? rdb : NULL);
    snprintf(what, sizeof what, "%s bwd_data", tag);
    check_close(what, dx, rdx, nx, 1e-5);
    snprintf(what, sizeof what, "%s bwd_weights dw +=", tag);
    check_close(what, dw, rdw, nw, 1e-5);
    if (bias) {
        snprintf(what, sizeof what, "%s bwd_weights db +=", tag);
        check_close(what, db, rdb, k, 1e-5);
    }

    /* Accumulation: from zero, two calls give exactly twice one call. */
    float *dw1 = dalloc(dev, nw), *dw2 = dalloc(dev, nw), *db1 = dalloc(dev, k), *db2 = dalloc(dev, k);
    gp_dev_fill(dev, dw1, 0.0f, nw);
    gp_dev_fill(dev, dw2, 0.0f, nw);
    gp_dev_fill(dev, db1, 0.0f, k);
    gp_dev_fill(dev, db2, 0.0f, k);
    int64_t before = gp_cpu_primitives_created(dev);
    CHECK_OK(gp_dev_conv_bwd_weights(dev, &d, x, dy, dw1, bias ? db1 : NULL));
    CHECK_OK(gp_dev_conv_bwd_weights(dev, &d, x, dy, dw2, bias ? db2 : NULL));
    CHECK_OK(gp_dev_conv_bwd_weights(dev, &d, x, dy, dw2, bias ? db2 : NULL));
    int twice = 1;
    for (int64_t i = 0; i < nw; i++) twice &= dw2[i] == 2.0f * dw1[i];
    for (int64_t i = 0; bias && i < k; i++) twice &= db2[i] == 2.0f * db1[i];
    CHECK_MSG(twice, "%s: two bwd_weights calls != 2 x one call", tag);
    /* Repeated identical calls reuse the cached primitives. */
    CHECK_OK(gp_dev_conv_fwd(dev, &d, x, wt, bias ? b : NULL, y));
    CHECK_OK(gp_dev_conv_bwd_data(dev, &d, wt, dy, dx));
    CHECK_MSG(gp_cpu_primitives_created(dev) == before, "%s: primitives created %lld -> %lld",
              tag, (long long)before, (long long)gp_cpu_primitives_created(dev));

    dfree(dev, dw1, nw); dfree(dev, dw2, nw); dfree(dev, db1, k); dfree(dev, db2, k);
    dfree(dev, x, nx); dfree(dev, wt, nw); dfree(dev, b, k); dfree(dev, dy, ny);
    dfree(dev, y, ny); dfree(dev, dx, nx); dfree(dev, dw, nw); dfree(dev, db, k);
    free(ry); free(rdx); free(rdw); free(rdb);
}

static void test_conv_shape(gp_device *dev, int64_t n, int64_t c, int64_t h, int64_t w,
                            int64_t k, int64_t ker, int64_t stride, int64_t pad, int bias)
{
    test_conv_hw(dev, n, c, h, w, k, ker, ker, stride, stride, pad, pad, bias);
}

/* x rounded to the nearest bfloat16 (ties to even), as a float. */
static float to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- bfloat16 conversions (pipeline copies in bf16) -------------------------- */

/* The value of bfloat16 pattern b, by its definition (sign, 8-bit exponent
 * with bias 127, 7-bit mantissa; subnormals), in double; 2^128 for the
 * infinities' patterns, which is where rounding past the largest value
 * lands. */
static double bf16_ref_value(uint32_t b)
{
    int sign = (b >> 15) & 1, e = (b >> 7) & 0xff, f = b & 0x7f;
    double mag = e == 0 ? ldexp((double)f, -133) : ldexp(128.0 + f, e - 134);
    return sign ? -mag : mag;
}

/* x rounded to the nearest bfloat16 by distance in double, ties to the
 * even pattern: the two patterns around x (the one toward zero, and the
 * next one up in magnitude), compared. */
static uint16_t bf16_ref_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t lo = u >> 16, hi = lo + 1; /* same sign: magnitudes lo <= |x| < hi */
    if ((u & 0xffff) == 0) return (uint16_t)lo;
    double dl = fabs((double)x - bf16_ref_value(lo)), dh = fabs(bf16_ref_value(hi) - (double)x);
    if (dl < dh) return (uint16_t)lo;
    if (dh < dl) return (uint16_t)hi;
    return (uint16_t)((lo & 1) ? hi : lo);
}

/* gp_dev_bf16_pack against bf16_ref_round on every kind of float (random
 * bit patterns over all exponents, subnormals, exact ties both ways, the
 * largest float, zeros, infinities, NaNs), at odd sizes and one past the
 * parallel threshold; gp_dev_bf16_unpack gives every one of the 65536
 * patterns its value (NaNs stay NaN), and packing that value gives the
 * pattern back. */
static void test_bf16_convert(gp_device *dev)
{
    const int64_t sizes[] = {1, 7, 100003};
    for (int z = 0; z < 3; z++) {
        int64_t n = sizes[z];
        float *h = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t u = (uint32_t)(rng_state >> 32); /* any bit pattern */
            switch (i % 8) {
            case 0: u = (u & 0xffff0000u) | 0x8000u; break;          /* a tie */
            case 1: u = (u & 0x807f0000u) | 0x8000u | (u & 0x10000u); break; /* subnormal tie */
            case 2: u &= 0x807fffffu; break;                           /* subnormal */
            default: break;
            }
            memcpy(&h[i], &u, 4);
        }
        const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX,
                                  NAN, FLT_MIN, 1.0f, 3.0f};
        for (int q = 0; q < 10 && q < n; q++) h[q * (n / 10 > 0 ? n / 10 : 1) % n] = specials[q];
        float *src = dalloc(dev, n), *back = dalloc(dev, n);
        uint16_t *pk = (uint16_t *)dalloc(dev, (n + 1) / 2);
        gp_dev_upload(dev, src, h, n);
        CHECK_OK(gp_dev_bf16_pack(dev, pk, src, n));
        CHECK_OK(gp_dev_bf16_unpack(dev, back, pk, n));
        int64_t bad = 0, bad_back = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &h[i], 4);
            if (isnan(h[i])) { /* a NaN becomes the one quiet NaN, PyTorch's 0x7fc0 */
                if (!isnan(back[i]) || pk[i] != 0x7fc0) bad++;
                continue;
            }
            uint16_t want = bf16_ref_round(h[i]);
            if (pk[i] != want) {
                if (bad++ < 3) fprintf(stderr, "bf16_pack: %a (0x%08x) gave 0x%04x, want 0x%04x\n",
                                       (double)h[i], u, pk[i], want);
            }
            if ((double)back[i] != bf16_ref_value(want) && !(isinf(back[i]) && (want & 0x7fff) == 0x7f80))
                bad_back++;
        }
        CHECK_MSG(bad == 0, "bf16_pack, n = %lld: %lld of the values rounded wrong", (long long)n,
                  (long long)bad);
        CHECK_MSG(bad_back == 0, "bf16_unpack, n = %lld: %lld wrong", (long long)n,
                  (long long)bad_back);
        dfree(dev, src, n);
        dfree(dev, back, n);
        dfree(dev, (float *)pk, (n + 1) / 2);
        free(h);
    }
    /* every pattern: its value, and back to itself (NaNs: the quiet NaN 0x7fc0) */
    const int64_t all = 65536;
    uint16_t *pat = (uint16_t *)dalloc(dev, all / 2), *again = (uint16_t *)dalloc(dev, all / 2);
    float *val = dalloc(dev, all);
    for (int64_t b = 0; b < all; b++) pat[b] = (uint16_t)b;
    CHECK_OK(gp_dev_bf16_unpack(dev, val, pat, all));
    CHECK_OK(gp_dev_bf16_pack(dev, again, val, all));
    int64_t wrong = 0;
    for (int64_t b = 0; b < all; b++) {
        bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f);
        if (nan) {
            if (!isnan(val[b]) || again[b] != 0x7fc0) wrong++;
        } else if ((b & 0x7fff) == 0x7f80) {
            if (!isinf(val[b]) || (val[b] < 0) != (b >> 15) || again[b] != b) wrong++;
        } else if ((double)val[b] != bf16_ref_value((uint32_t)b) || again[b] != b) {
            wrong++;
        }
    }
    CHECK_MSG(wrong == 0, "bf16 patterns: %lld of 65536 do not round-trip", (long long)wrong);
    /* relu on bf16 (act_bf16 and its integer forms, elementwise.h): every
     * pattern forward; backward every y against 64 dy (zeros, infinities,
     * NaNs of both signs and payloads, the subnormal edges and random ones)
     * and every dy against 64 y: the bits of the float forms, rounded */
    {
        uint16_t dys[64] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xffff,
                            0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x7f7f, 0xff7f};
        for (int q = 16; q < 64; q++) dys[q] = (uint16_t)(frand() * 32768.0f + 32768.0f);
        uint16_t *o = (uint16_t *)dalloc(dev, all / 2), *dyv = (uint16_t *)dalloc(dev, all / 2);
        int64_t bad_f = 0, bad_b = 0;
        CHECK(gp_dev_act_bf16_has(dev, GP_ACT_RELU));
        CHECK_OK(gp_dev_act_bf16(dev, GP_ACT_RELU, pat, NULL, o, all, 0.0f));
        for (int64_t b = 0; b < all; b++) {
            uint16_t want = gp_ew_bf16_bits(gp_ew_relu(gp_ew_bf16_value((uint16_t)b)));
            bad_f += o[b] != want || gp_ew_bf16_relu_fwd_bits((uint16_t)b) != want;
        }
        for (int side = 0; side < 2; side++)
            for (int q = 0; q < 64; q++) {
                /* side 0: y = every pattern, dy fixed; side 1: the reverse */
                for (int64_t b = 0; b < all; b++) dyv[b] = side ? (uint16_t)b : dys[q];
                const uint16_t *yv = side ? NULL : pat;
                uint16_t *yfix = NULL;
                if (side) {
                    yfix = (uint16_t *)dalloc(dev, all / 2);
                    for (int64_t b = 0; b < all; b++) yfix[b] = dys[q];
                    yv = yfix;
                }
                CHECK_OK(gp_dev_act_bf16(dev, GP_ACT_RELU, yv, dyv, o, all, 0.0f));
                for (int64_t b = 0; b < all; b++) {
                    uint16_t want = gp_ew_bf16_bits(
                        gp_ew_relu_bwd(gp_ew_bf16_value(yv[b]), gp_ew_bf16_value(dyv[b])));
                    bad_b += o[b] != want || gp_ew_bf16_relu_bwd_bits(yv[b], dyv[b]) != want;
                }
                if (yfix) dfree(dev, (float *)yfix, all / 2);
            }
        CHECK_MSG(bad_f == 0 && bad_b == 0, "bf16 relu: %lld forward and %lld backward patterns "
                  "differ from the float forms' bits", (long long)bad_f, (long long)bad_b);
        dfree(dev, (float *)o, all / 2);
        dfree(dev, (float *)dyv, all / 2);
    }
    dfree(dev, (float *)pat, all / 2);
    dfree(dev, (float *)again, all / 2);
    dfree(dev, val, all);
}

/* ---- bf16 (precision) ------------------------------------------------------ */
/* precision bf16 (backend.h, gp_precision) on the CPU.  Where the processor
 * has bf16 instructions: each convolution equals the double-precision
 * reference on its operands rounded to bf16 (x and w forward, dy and w for
 * dx, x and dy for dw; bias and results in FP32) to FP32 summation
 * accuracy, and differs measurably from the FP32 result, so the bf16
 * kernels ran; one of 1 input channel (9 products an output,
 * gp_bf16_conv_worth) equals the reference on its unrounded operands.
 * Without them: the device refuses bf16, saying why. */
static void test_bf16_storage(gp_device *dev);
static void test_linear_gelu(gp_device *dev, bool bf16);
static void test_gelu_values(gp_device *dev);
static void test_xent_exp(gp_device *dev);

static void test_bf16(void)
{
    gp_device_opts o = {.threads = 1, .precision = GP_PRECISION_BF16};
    gp_device *dev = NULL;
    gp_status st = gp_device_open("cpu:7", &o, &dev);
    bool native = gp_cpu_isa_has(dnnl_cpu_isa_avx512_core_bf16); /* GPIPE_CPU_ISA's */
    if (!native) {
        CHECK(st == GP_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(gp_last_error(), "avx512_bf16") && strstr(gp_last_error(), "fp32"),
                  "%s", gp_last_error());
        gp_error_clear();
        printf("test_backend: no bf16 instructions here: bf16 refused (checked)\n");
        return;
    }
    CHECK_OK(st);
    if (!dev) return;
    CHECK(dev->precision == GP_PRECISION_BF16);
    /* blocked (16 -> 32 channels) and plain (2 input channels) paths; 1
     * input channel, 9 products an output, is FP32 (gp_bf16_conv_worth) */
    static const int64_t shapes[][4] = {{2, 16, 12, 32}, {2, 2, 10, 8}, {2, 1, 10, 8}};
    for (int q = 0; q < 3; q++) {
        int64_t n = shapes[q][0], c = shapes[q][1], h = shapes[q][2], k = shapes[q][3];
        gp_conv_desc d = {n, c, h, h, k, 3, 3, 1, 1, 1, 1, h, h, 1, 0, 0};
        int64_t nx = n * c * h * h, nw = k * c * 9, ny = n * k * h * h;
        float *x = drand(dev, nx), *w = drand(dev, nw), *b = drand(dev, k), *dy = drand(dev, ny);
        float *y = dalloc(dev, ny), *dx = dalloc(dev, nx), *dw = dalloc(dev, nw), *db = dalloc(dev, k);
        float *xr = malloc(sizeof(float) * (size_t)nx), *wr = malloc(sizeof(float) * (size_t)nw);
        float *dyr = malloc(sizeof(float) * (size_t)ny);
        double *ry = malloc(sizeof(double) * (size_t)ny), *ry32 = malloc(sizeof(double) * (size_t)ny);
        double *rdx = malloc(sizeof(double) * (size_t)nx), *rdw = calloc((size_t)nw, sizeof(double));
        double *rdb = calloc((size_t)k, sizeof(double));
        bool worth = gp_bf16_conv_worth(&d);
        CHECK(worth == (c > 1));
        for (int64_t i = 0; i < nx; i++) xr[i] = worth ? to_bf16(x[i]) : x[i];
        for (int64_t i = 0; i < nw; i++) wr[i] = worth ? to_bf16(w[i]) : w[i];
        for (int64_t i = 0; i < ny; i++) dyr[i] = worth ? to_bf16(dy[i]) : dy[i];
        char what[96];
        CHECK_OK(gp_dev_conv_fwd(dev, &d, x, w, b, y));
        ref_conv_fwd(&d, xr, wr, b, ry);
        snprintf(what, sizeof what, "bf16 conv c%lld fwd", (long long)c);
        check_close(what, y, ry, ny, 1e-5);
        ref_conv_fwd(&d, x, w, b, ry32); /* the FP32 answer is another */
        double diff = 0;
        for (int64_t i = 0; i < ny; i++) diff = fmax(diff, fabs(y[i] - ry32[i]));
        if (worth)
            CHECK_MSG(diff > 1e-4, "%s: equal to the FP32 result (max difference %.3g)", what, diff);
        gp_dev_fill(dev, dw, 0.0f, nw);
        gp_dev_fill(dev, db, 0.0f, k);
        CHECK_OK(gp_dev_conv_bwd_data(dev, &d, w, dy, dx));
        CHECK_OK(gp_dev_conv_bwd_weights(dev, &d, x, dy, dw, db));
        ref_conv_bwd(&d, xr, wr, dyr, rdx, rdw, rdb); /* from zero; db from the bf16 dy */
        snprintf(what, sizeof what, "bf16 conv c%lld bwd_data", (long long)c);
        check_close(what, dx, rdx, nx, 1e-5);
        snprintf(what, sizeof what, "bf16 conv c%lld bwd_weights dw", (long long)c);
        check_close(what, dw, rdw, nw, 1e-5);
        snprintf(what, sizeof what, "bf16 conv c%lld bwd_weights db", (long long)c);
        check_close(what, db, rdb, k, 1e-5);
        dfree(dev, x, nx); dfree(dev, w, nw); dfree(dev, b, k); dfree(dev, dy, ny);
        dfree(dev, y, ny); dfree(dev, dx, nx); dfree(dev, dw, nw); dfree(dev, db, k);
        free(xr); free(wr); free(dyr); free(ry); free(ry32); free(rdx); free(rdw); free(rdb);
    }
    /* matrix products: every transpose, a scale, accumulation, padded
     * leading dimensions; the oracle on bf16-rounded A and B */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                const int64_t m = 24, n = 40, k = 72;
                int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
                int64_t lda = ac + 3, ldb = bc + 2, ldc = n + 5;
                float *a = drand(dev, ar * lda), *bm = drand(dev, br * ldb);
                float *c = drand(dev, m * ldc);
                double *ref = malloc(sizeof(double) * (size_t)(m * ldc));
                float alpha = 0.75f, beta = acc ? 1.0f : 0.0f;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < ldc; j++) {
                        double sum = 0;
                        for (int64_t q = 0; q < k && j < n; q++)
                            sum += (double)to_bf16(ta ? a[q * lda + i] : a[i * lda + q]) *
                                   (double)to_bf16(tb ? bm[j * ldb + q] : bm[q * ldb + j]);
                        ref[i * ldc + j] = j < n ? alpha * sum + beta * c[i * ldc + j]
                                                 : c[i * ldc + j]; /* padding untouched */
                    }
                CHECK_OK(gp_dev_gemm(dev, ta, tb, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc));
                char what[64];
                snprintf(what, sizeof what, "bf16 gemm ta=%d tb=%d beta=%g", ta, tb, (double)beta);
                check_close(what, c, ref, m * ldc, 1e-5);
                dfree(dev, a, ar * lda); dfree(dev, bm, br * ldb); dfree(dev, c, m * ldc);
                free(ref);
            }
    /* gemm_wb (B is frozen weights): while frozen its bf16 copy is kept
     * and reused, bit for bit the product gemm gives; after a thaw, new
     * weights are converted again.  (It writes weights behind the freeze's
     * back to see the copy reused, which GPIPE_CHECK_MIRRORS refuses, as
     * test_mirrors checks: off here.) */
    {
        bool check0 = dev->check_mirrors;
        dev->check_mirrors = false;
        const int64_t m = 16, n = 64, k = 48;
        float *a = drand(dev, m * k), *w = drand(dev, n * k);
        float *c0 = dalloc(dev, m * n), *c1 = dalloc(dev, m * n), *c2 = dalloc(dev, m * n);
        CHECK_OK(gp_dev_gemm(dev, 0, 1, m, n, k, 1.0f, a, k, w, k, 0.0f, c0, n));
        CHECK_OK(gp_dev_freeze_weights(dev, true));
        CHECK_OK(gp_dev_gemm_wb(dev, 0, 1, m, n, k, 1.0f, a, k, w, k, 0.0f, c1, n));
        /* the kept copy is what the second call reads: weights changed
         * behind its back (which the freeze forbids) do not show */
        for (int64_t i = 0; i < n * k; i++) w[i] = -w[i];
        CHECK_OK(gp_dev_gemm_wb(dev, 0, 1, m, n, k, 1.0f, a, k, w, k, 0.0f, c2, n));
        CHECK(memcmp(c0, c1, sizeof(float) * (size_t)(m * n)) == 0);
        CHECK_MSG(memcmp(c0, c2, sizeof(float) * (size_t)(m * n)) == 0,
                  "gemm_wb did not reuse its kept bf16 weights");
        CHECK_OK(gp_dev_freeze_weights(dev, false));
        for (int64_t i = 0; i < n * k; i++) w[i] = -w[i]; /* back */
        for (int64_t i = 0; i < n * k; i++) w[i] = -w[i]; /* the update */
        CHECK_OK(gp_dev_freeze_weights(dev, true));
        CHECK_OK(gp_dev_gemm_wb(dev, 0, 1, m, n, k, 1.0f, a, k, w, k, 0.0f, c2, n));
        CHECK_OK(gp_dev_freeze_weights(dev, false));
        bool negated = true;
        for (int64_t i = 0; i < m * n; i++) negated &= c2[i] == -c0[i];
        CHECK_MSG(negated, "gemm_wb after a thaw used the old weights");
        /* two weight tensors of one shape (two layers sharing the op)
         * each keep their own copy: alternating calls reuse both */
        float *w2 = drand(dev, n * k), *c3 = dalloc(dev, m * n), *c4 = dalloc(dev, m * n);
        CHECK_OK(gp_dev_gemm(dev, 0, 1, m, n, k, 1.0f, a, k, w2, k, 0.0f, c3, n));
        CHECK_OK(gp_dev_freeze_weights(dev, true));
        CHECK_OK(gp_dev_gemm_wb(dev, 0, 1, m, n, k, 1.0f, a, k, w, k, 0.0f, c1, n));
        CHECK_OK(gp_dev_gemm_wb(dev, 0, 1, m, n, k, 1.0f, a, k, w2, k, 0.0f, c4, n));
        for (int64_t i = 0; i < n * k; i++) w[i] = 0.0f, w2[i] = 0.0f; /* behind their back */
        CHECK_OK(gp_dev_gemm_wb(dev, 0, 1, m, n, k, 1.0f, a, k, w, k, 0.0f, c2, n));
        CHECK_MSG(memcmp(c1, c2, sizeof(float) * (size_t)(m * n)) == 0,
                  "the first tensor's kept copy was not reused after the second's");
        CHECK_OK(gp_dev_gemm_wb(dev, 0, 1, m, n, k, 1.0f, a, k, w2, k, 0.0f, c2, n));
        CHECK_MSG(memcmp(c3, c2, sizeof(float) * (size_t)(m * n)) == 0 &&
                  memcmp(c3, c4, sizeof(float) * (size_t)(m * n)) == 0,
                  "the second tensor's kept copy was not reused");
        CHECK_OK(gp_dev_freeze_weights(dev, false));
        dfree(dev, w2, n * k); dfree(dev, c3, m * n); dfree(dev, c4, m * n);
        dfree(dev, a, m * k); dfree(dev, w, n * k);
        dfree(dev, c0, m * n); dfree(dev, c1, m * n); dfree(dev, c2, m * n);
        dev->check_mirrors = check0;
    }
    test_bf16_storage(dev);
    test_linear_gelu(dev, true);
    gp_device_close(dev);
}

/* bf16 storage under precision bf16 (the conv_*_bf16 and linear_*_bf16
 * slots, oneDNN's bf16 kernels on bf16 memory): each slot gives bit for bit
 * what the storage adapter gives (the FP32-storage slot on the widened
 * activations, its FP32 results rounded once), with the weights frozen
 * (their kept bf16 copies) and not; a convolution not worth bf16 is the
 * adapter's (gp_dev_conv_bf16_takes false). */
static uint16_t *b16rand(gp_device *dev, int64_t n, float **wide)
{
    float *f = drand(dev, n);
    uint16_t *b = (uint16_t *)dalloc(dev, (n + 1) / 2);
    CHECK_OK(gp_dev_bf16_pack(dev, b, f, n));
    CHECK_OK(gp_dev_bf16_unpack(dev, f, b, n)); /* the exact values the bf16 side reads */
    *wide = f;
    return b;
}

static void check_bits(const char *what, const uint16_t *slot, const float *adapter_f32,
                       int64_t n)
{
    int64_t wrong = 0, at = -1;
    uint16_t want_at = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t want = gp_ew_bf16_bits(adapter_f32[i]); /* the adapter's one rounding */
        if (slot[i] != want && wrong++ == 0) at = i, want_at = want;
    }
    CHECK_MSG(wrong == 0, "%s: %lld of %lld values differ from the adapter's (first at %lld: "
              "0x%04x, adapter 0x%04x)", what, (long long)wrong, (long long)n, (long long)at,
              at >= 0 ? slot[at] : 0, want_at);
}

static void test_bf16_storage(gp_device *dev)
{
    char what[96];
    static const int64_t cshapes[][4] = {{2, 16, 12, 32}, {2, 2, 10, 8}, {3, 24, 7, 16}};
    for (int frozen = 0; frozen < 2; frozen++)
        for (int q = 0; q < 3; q++) {
            int64_t n = cshapes[q][0], c = cshapes[q][1], h = cshapes[q][2], k = cshapes[q][3];
            int64_t s = q == 2 ? 2 : 1, oh = (h + 2 - 3) / s + 1;
            gp_conv_desc d = {n, c, h, h, k, 3, 3, s, s, 1, 1, oh, oh, 1, 0, 0};
            CHECK(gp_dev_conv_bf16_takes(dev, &d));
            int64_t nx = n * c * h * h, nw = k * c * 9, ny = n * k * oh * oh;
            float *xf, *dyf;
            uint16_t *x = b16rand(dev, nx, &xf), *dy = b16rand(dev, ny, &dyf);
            float *w = drand(dev, nw), *b = drand(dev, k);
            float *yf = dalloc(dev, ny), *dxf = dalloc(dev, nx);
            float *dw0 = drand(dev, nw), *db0 = drand(dev, k);
            float *dw1 = dalloc(dev, nw), *db1 = dalloc(dev, k);
            uint16_t *y = (uint16_t *)dalloc(dev, ny), *dx = (uint16_t *)dalloc(dev, nx);
            memcpy(dw1, dw0, sizeof(float) * (size_t)nw); /* += into the same start */
            memcpy(db1, db0, sizeof(float) * (size_t)k);
            if (frozen) CHECK_OK(gp_dev_freeze_weights(dev, true));
            for (int rep = 0; rep < 1 + frozen; rep++) { /* frozen: the kept copy's turn */
                CHECK_OK(gp_dev_conv_fwd(dev, &d, xf, w, b, yf));
                CHECK_OK(gp_dev_conv_fwd_bf16(dev, &d, x, w, b, y));
                snprintf(what, sizeof what, "bf16-storage conv c%lld fwd%s", (long long)c,
                         frozen ? (rep ? " (kept weights)" : " (frozen)") : "");
                check_bits(what, y, yf, ny);
                CHECK_OK(gp_dev_conv_bwd_data(dev, &d, w, dyf, dxf));
                CHECK_OK(gp_dev_conv_bwd_data_bf16(dev, &d, w, dy, dx));
                snprintf(what, sizeof what, "bf16-storage conv c%lld bwd_data%s", (long long)c,
                         frozen ? (rep ? " (kept weights)" : " (frozen)") : "");
                check_bits(what, dx, dxf, nx);
            }
            CHECK_OK(gp_dev_conv_bwd_weights(dev, &d, xf, dyf, dw0, db0));
            CHECK_OK(gp_dev_conv_bwd_weights_bf16(dev, &d, x, dy, dw1, db1));
            if (frozen) CHECK_OK(gp_dev_freeze_weights(dev, false)); /* held sums added */
            snprintf(what, sizeof what, "bf16-storage conv c%lld bwd_weights%s", (long long)c,
                     frozen ? " (held)" : "");
            CHECK_MSG(memcmp(dw0, dw1, sizeof(float) * (size_t)nw) == 0 &&
                      memcmp(db0, db1, sizeof(float) * (size_t)k) == 0,
                      "%s: dw or db differs from the adapter's", what);
            dfree(dev, xf, nx); dfree(dev, dyf, ny); dfree(dev, (float *)x, (nx + 1) / 2);
            dfree(dev, (float *)dy, (ny + 1) / 2); dfree(dev, w, nw); dfree(dev, b, k);
            dfree(dev, yf, ny); dfree(dev, dxf, nx); dfree(dev, dw0, nw); dfree(dev, db0, k);
            dfree(dev, dw1, nw); dfree(dev, db1, k); dfree(dev, (float *)y, ny);
            dfree(dev, (float *)dx, nx);
        }
    /* channel-blocked bf16 (a chain's layout, gp_layers_blocked): the same
     * bits as the plain layout's, value for value */
    if (gp_dev_act_block(dev, &(gp_conv_desc){2, 32, 9, 9, 32, 3, 3, 1, 1, 1, 1, 9, 9, 1, 0, 0},
                         true) == 16) {
        const int64_t n = 2, c = 32, h = 9, k = 32, B = 16;
        gp_conv_desc pd = {n, c, h, h, k, 3, 3, 1, 1, 1, 1, h, h, 1, 0, 0}, bd = pd;
        bd.xblk = bd.yblk = B;
        CHECK(gp_dev_conv_bf16_takes(dev, &bd));
        int64_t nx = n * c * h * h, ny = n * k * h * h, nw = k * c * 9;
        float *xf, *dyf;
        uint16_t *x = b16rand(dev, nx, &xf), *dy = b16rand(dev, ny, &dyf);
        float *w = drand(dev, nw), *b = drand(dev, k);
        uint16_t *xb = (uint16_t *)dalloc(dev, nx), *dyb = (uint16_t *)dalloc(dev, ny);
        uint16_t *y = (uint16_t *)dalloc(dev, ny), *yb = (uint16_t *)dalloc(dev, ny);
        uint16_t *dx = (uint16_t *)dalloc(dev, nx), *dxb = (uint16_t *)dalloc(dev, nx);
        float *dw0 = dalloc(dev, nw), *dw1 = dalloc(dev, nw), *db0 = dalloc(dev, k);
        float *db1 = dalloc(dev, k);
        /* (n, c, p) plain -> ((n, c / B, p), c % B) blocked */
#define BLK(cc, i, ch, p, hw) ((((i) * ((cc) / B) + (ch) / B) * (hw) + (p)) * B + (ch) % B)
        for (int64_t i = 0; i < n; i++)
            for (int64_t ch = 0; ch < c; ch++)
                for (int64_t p = 0; p < h * h; p++) {
                    xb[BLK(c, i, ch, p, h * h)] = x[(i * c + ch) * h * h + p];
                    dyb[BLK(k, i, ch, p, h * h)] = dy[(i * k + ch) * h * h + p];
                }
        CHECK_OK(gp_dev_fill(dev, dw0, 0.0f, nw)); CHECK_OK(gp_dev_fill(dev, db0, 0.0f, k));
        CHECK_OK(gp_dev_fill(dev, dw1, 0.0f, nw)); CHECK_OK(gp_dev_fill(dev, db1, 0.0f, k));
        CHECK_OK(gp_dev_conv_fwd_bf16(dev, &pd, x, w, b, y));
        CHECK_OK(gp_dev_conv_fwd_bf16(dev, &bd, xb, w, b, yb));
        CHECK_OK(gp_dev_conv_bwd_data_bf16(dev, &pd, w, dy, dx));
        CHECK_OK(gp_dev_conv_bwd_data_bf16(dev, &bd, w, dyb, dxb));
        CHECK_OK(gp_dev_conv_bwd_weights_bf16(dev, &pd, x, dy, dw0, db0));
        CHECK_OK(gp_dev_conv_bwd_weights_bf16(dev, &bd, xb, dyb, dw1, db1));
        int64_t bad_y = 0, bad_dx = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t ch = 0; ch < c; ch++)
                for (int64_t p = 0; p < h * h; p++) {
                    bad_y += yb[BLK(k, i, ch, p, h * h)] != y[(i * k + ch) * h * h + p];
                    bad_dx += dxb[BLK(c, i, ch, p, h * h)] != dx[(i * c + ch) * h * h + p];
                }
#undef BLK
        CHECK_MSG(bad_y == 0 && bad_dx == 0, "blocked bf16 conv: %lld y and %lld dx values "
                  "differ from the plain layout's", (long long)bad_y, (long long)bad_dx);
        CHECK_MSG(memcmp(dw0, dw1, sizeof(float) * (size_t)nw) == 0 &&
                  memcmp(db0, db1, sizeof(float) * (size_t)k) == 0,
                  "blocked bf16 conv: dw or db differs from the plain layout's");
        dfree(dev, xf, nx); dfree(dev, dyf, ny); dfree(dev, (float *)x, (nx + 1) / 2);
        dfree(dev, (float *)dy, (ny + 1) / 2); dfree(dev, w, nw); dfree(dev, b, k);
        dfree(dev, (float *)xb, nx); dfree(dev, (float *)dyb, ny); dfree(dev, (float *)y, ny);
        dfree(dev, (float *)yb, ny); dfree(dev, (float *)dx, nx); dfree(dev, (float *)dxb, nx);
        dfree(dev, dw0, nw); dfree(dev, dw1, nw); dfree(dev, db0, k); dfree(dev, db1, k);
    } else {
        printf("test_backend: bf16 storage, blocked convolutions: this processor's oneDNN "
               "block is not 16 (not run)\n");
    }
    gp_conv_desc thin = {2, 1, 10, 10, 8, 3, 3, 1, 1, 1, 1, 10, 10, 1, 0, 0};
    CHECK_MSG(!gp_dev_conv_bf16_takes(dev, &thin), "a 1-channel 3x3 convolution (9 products) "
              "takes bf16 storage");
    /* linear layers: products worth bf16 (n, out, in) and not (in < 16),
     * with and without bias and relu, dW fresh and accumulated */
    static const int64_t lshapes[][3] = {{24, 40, 72}, {5, 33, 64}, {24, 40, 8}, {1, 3, 20}};
    for (int frozen = 0; frozen < 2; frozen++)
        for (int q = 0; q < 4; q++)
            for (int variant = 0; variant < 3; variant++) {
                int64_t n = lshapes[q][0], out = lshapes[q][1], in = lshapes[q][2];
                bool has_bias = variant > 0, relu = variant == 2, fresh = variant != 1;
                float *xf, *dyf;
                uint16_t *x = b16rand(dev, n * in, &xf), *dy = b16rand(dev, n * out, &dyf);
                float *w = drand(dev, out * in), *bias = has_bias ? drand(dev, out) : NULL;
                float *yf = dalloc(dev, n * out), *dxf = dalloc(dev, n * in);
                uint16_t *y = (uint16_t *)dalloc(dev, n * out);
                uint16_t *dx = (uint16_t *)dalloc(dev, n * in);
                float *dw0 = drand(dev, out * in), *db0 = drand(dev, out);
                float *dw1 = dalloc(dev, out * in), *db1 = dalloc(dev, out);
                memcpy(dw1, dw0, sizeof(float) * (size_t)(out * in));
                memcpy(db1, db0, sizeof(float) * (size_t)out);
                if (frozen) CHECK_OK(gp_dev_freeze_weights(dev, true));
                CHECK_OK(gp_dev_linear_fwd(dev, n, out, in, xf, w, bias, relu, yf));
                CHECK_OK(gp_dev_linear_fwd_bf16(dev, n, out, in, x, w, bias, relu, y));
                snprintf(what, sizeof what, "bf16-storage linear %lldx%lldx%lld v%d%s fwd",
                         (long long)n, (long long)out, (long long)in, variant,
                         frozen ? " frozen" : "");
                check_bits(what, y, yf, n * out);
                CHECK_OK(gp_dev_gemm_wb(dev, 0, 0, n, in, out, 1.0f, dyf, out, w, in, 0.0f, dxf,
                                        in));
                CHECK_OK(gp_dev_linear_bwd_data_bf16(dev, n, out, in, dy, w, dx));
                snprintf(what, sizeof what, "bf16-storage linear %lldx%lldx%lld v%d%s bwd_data",
                         (long long)n, (long long)out, (long long)in, variant,
                         frozen ? " frozen" : "");
                check_bits(what, dx, dxf, n * in);
                CHECK_OK(gp_dev_gemm(dev, 1, 0, out, in, n, 1.0f, dyf, out, xf, in,
                                     fresh ? 0.0f : 1.0f, dw0, in));
                if (has_bias) {
                    if (fresh) CHECK_OK(gp_dev_fill(dev, db0, 0.0f, out));
                    CHECK_OK(gp_dev_sum_rows(dev, dyf, db0, n, out));
                }
                CHECK_OK(gp_dev_linear_bwd_weights(dev, GP_BF16, n, out, in, dy, x, dw1,
                                                   has_bias ? db1 : NULL, fresh));
                if (frozen) CHECK_OK(gp_dev_freeze_weights(dev, false));
                CHECK_MSG(memcmp(dw0, dw1, sizeof(float) * (size_t)(out * in)) == 0 &&
                              memcmp(db0, db1, sizeof(float) * (size_t)out) == 0,
                          "bf16-storage linear %lldx%lldx%lld v%d%s bwd_weights: dw or db "
                          "differs from the adapter's", (long long)n, (long long)out,
                          (long long)in, variant, frozen ? " frozen" : "");
                /* FP32 storage: the weights half in one call (the slot,
                 * issue 64: the bias's sums in the product's call, no
                 * fill), the bits of the three calls it replaces, on the
                 * gradients as they were before the step */
                if (!frozen) {
                    float *dw2 = drand(dev, out * in), *db2 = drand(dev, out);
                    float *dw3 = dalloc(dev, out * in), *db3 = dalloc(dev, out);
                    memcpy(dw3, dw2, sizeof(float) * (size_t)(out * in));
                    memcpy(db3, db2, sizeof(float) * (size_t)out);
                    CHECK_OK(gp_dev_gemm(dev, 1, 0, out, in, n, 1.0f, dyf, out, xf, in,
                                         fresh ? 0.0f : 1.0f, dw2, in));
                    if (has_bias) {
                        if (fresh) CHECK_OK(gp_dev_fill(dev, db2, 0.0f, out));
                        CHECK_OK(gp_dev_sum_rows(dev, dyf, db2, n, out));
                    }
                    uint64_t l0 = gp_dev_launches(dev);
                    CHECK_OK(gp_dev_linear_bwd_weights(dev, GP_F32, n, out, in, dyf, xf, dw3,
                                                       has_bias ? db3 : NULL, fresh));
                    CHECK_MSG(gp_dev_launches(dev) - l0 == 1, "FP32 linear bwd_weights: %llu "
                              "launches, one expected",
                              (unsigned long long)(gp_dev_launches(dev) - l0));
                    CHECK_MSG(memcmp(dw2, dw3, sizeof(float) * (size_t)(out * in)) == 0 &&
                                  memcmp(db2, db3, sizeof(float) * (size_t)out) == 0,
                              "FP32 linear %lldx%lldx%lld v%d bwd_weights: dw or db differs "
                              "from gemm, fill and sum_rows", (long long)n, (long long)out,
                              (long long)in, variant);
                    for (int64_t j = 0; has_bias && fresh && j < out; j++) {
                        double ref = 0.0; /* a naive double-precision column sum */
                        for (int64_t r = 0; r < n; r++) ref += (double)dyf[r * out + j];
                        CHECK_MSG(fabs((double)db3[j] - ref) <= 1e-5 * (1.0 + fabs(ref)),
                                  "FP32 linear bwd_weights: db[%lld] %g, the column sum %g",
                                  (long long)j, (double)db3[j], ref);
                    }
                    dfree(dev, dw2, out * in); dfree(dev, db2, out);
                    dfree(dev, dw3, out * in); dfree(dev, db3, out);
                }
                dfree(dev, xf, n * in); dfree(dev, dyf, n * out);
                dfree(dev, (float *)x, (n * in + 1) / 2); dfree(dev, (float *)dy, (n * out + 1) / 2);
                dfree(dev, w, out * in);
                if (bias) dfree(dev, bias, out);
                dfree(dev, yf, n * out); dfree(dev, dxf, n * in);
                dfree(dev, (float *)y, n * out); dfree(dev, (float *)dx, n * in);
                dfree(dev, dw0, out * in); dfree(dev, db0, out);
                dfree(dev, dw1, out * in); dfree(dev, db1, out);
            }
}

static void test_conv(gp_device *dev)
{
    test_conv_shape(dev, 3, 5, 7, 9, 4, 3, 2, 1, 1);
    test_conv_shape(dev, 3, 5, 7, 9, 4, 1, 1, 0, 0);
    test_conv_shape(dev, 2, 1, 9, 8, 6, 3, 1, 1, 1);   /* first-layer style */
    test_conv_shape(dev, 2, 17, 6, 5, 19, 3, 1, 1, 1); /* blocked by default */
    test_conv_shape(dev, 2, 16, 7, 7, 32, 3, 2, 1, 0);
    test_conv_shape(dev, 2, 32, 5, 5, 16, 1, 2, 0, 1); /* projection shortcut */
    /* per axis: AmoebaNet's 1x7 and 7x1 (the second with stride (2, 1)),
     * and one with every pair different */
    test_conv_hw(dev, 2, 6, 7, 9, 5, 1, 7, 1, 1, 0, 3, 0);
    test_conv_hw(dev, 2, 6, 9, 7, 5, 7, 1, 2, 1, 3, 0, 1);
    test_conv_hw(dev, 3, 4, 8, 11, 3, 2, 5, 3, 2, 1, 2, 1);
}

/* ---- pooling ---------------------------------------------------------------------- */

/* kernel (kh, kw), stride (sh, sw), padding (ph, pw); the average divides
 * by the window's elements inside the image (GP_POOL_AVG) or by kh * kw
 * (GP_POOL_AVG_INCLUDE_PAD). */
static void test_pool_hw(gp_device *dev, gp_pool_kind kind, int64_t n, int64_t c, int64_t h,
                         int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                         int64_t pw)
{
    gp_pool_desc d = {n, c, h, w, kh, kw, sh, sw, ph, pw,
                      (h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1, kind, 0, false};
    const char *kn = kind == GP_POOL_MAX ? "max" : kind == GP_POOL_AVG ? "avg" : "avg-incl-pad";
    int64_t nx = n * c * h * w, ny = n * c * d.oh * d.ow;
    float *x = drand(dev, nx), *dy = drand(dev, ny), *y = dalloc(dev, ny), *dx = dalloc(dev, nx);
    double *ry = calloc((size_t)ny, sizeof(double)), *rdx = calloc((size_t)nx, sizeof(double));
    size_t wsb = gp_dev_pool_ws_bytes(dev, &d);
    CHECK_MSG(kind != GP_POOL_MAX || wsb > 0, "max pooling needs a workspace");
    void *ws = NULL;
    if (wsb) CHECK_OK(gp_dev_alloc(dev, wsb, GP_MEM_ACTIVATIONS, &ws));
    for (int64_t i = 0; i < nx; i++) dx[i] = 1e6f;

    for (int64_t p = 0; p < n * c; p++)
        for (int64_t oh = 0; oh < d.oh; oh++)
            for (int64_t ow = 0; ow < d.ow; ow++) {
                double best = -DBL_MAX, sum = 0;
                int64_t arg = -1, cnt = 0;
                for (int64_t i = 0; i < kh; i++)
                    for (int64_t j = 0; j < kw; j++) {
                        int64_t ih = oh * sh - ph + i, iw = ow * sw - pw + j;
                        if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                        int64_t xi = (p * h + ih) * w + iw;
                        if (x[xi] > best) { best = x[xi]; arg = xi; }
                        sum += x[xi];
                        cnt++;
                    }
                int64_t yi = (p * d.oh + oh) * d.ow + ow;
                if (kind == GP_POOL_MAX) {
                    ry[yi] = best;
                    rdx[arg] += dy[yi];
                } else {
                    if (kind == GP_POOL_AVG_INCLUDE_PAD) cnt = kh * kw;
                    ry[yi] = sum / (double)cnt;
                    for (int64_t i = 0; i < kh; i++)
                        for (int64_t j = 0; j < kw; j++) {
                            int64_t ih = oh * sh - ph + i, iw = ow * sw - pw + j;
                            if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                            rdx[(p * h + ih) * w + iw] += dy[yi] / (double)cnt;
                        }
                }
            }
    char what[160];
    CHECK_OK(gp_dev_pool_fwd(dev, &d, x, y, ws));
    char geo[96];
    snprintf(geo, sizeof geo, "%lldx%lld k%lldx%lld s%lldx%lld p%lldx%lld", (long long)h,
             (long long)w, (long long)kh, (long long)kw, (long long)sh, (long long)sw,
             (long long)ph, (long long)pw);
    snprintf(what, sizeof what, "%s pool fwd %s", kn, geo);
    check_close(what, y, ry, ny, 1e-6);
    CHECK_OK(gp_dev_pool_bwd(dev, &d, x, y, dy, dx, ws));
    snprintf(what, sizeof what, "%s pool bwd %s", kn, geo);
    check_close(what, dx, rdx, nx, 1e-6);
    if (kind != GP_POOL_MAX) { /* an average reads neither x nor y (none kept for it) */
        float *dx2 = dalloc(dev, nx);
        CHECK_OK(gp_dev_pool_bwd(dev, &d, NULL, NULL, dy, dx2, ws));
        CHECK_MSG(memcmp(dx, dx2, (size_t)nx * sizeof(float)) == 0,
                  "%s: without x and y, other bits", what);
        dfree(dev, dx2, nx);
    }
    /* Inference forward (no workspace) gives the same y. */
    float *y2 = dalloc(dev, ny);
    CHECK_OK(gp_dev_pool_fwd(dev, &d, x, y2, NULL));
    CHECK(memcmp(y, y2, (size_t)ny * sizeof(float)) == 0);
    dfree(dev, y2, ny);
    if (ws) gp_dev_free(dev, ws, wsb, GP_MEM_ACTIVATIONS);
    dfree(dev, x, nx); dfree(dev, dy, ny); dfree(dev, y, ny); dfree(dev, dx, nx);
    free(ry); free(rdx);
}

static void test_pool_shape(gp_device *dev, gp_pool_kind kind, int64_t n, int64_t c, int64_t h,
                            int64_t w, int64_t ker, int64_t stride, int64_t pad)
{
    test_pool_hw(dev, kind, n, c, h, w, ker, ker, stride, stride, pad, pad);
}

static void test_pool(gp_device *dev)
{
    test_pool_shape(dev, GP_POOL_MAX, 3, 5, 7, 9, 2, 2, 0);
    test_pool_shape(dev, GP_POOL_MAX, 2, 3, 7, 9, 3, 2, 1);
    test_pool_shape(dev, GP_POOL_AVG, 3, 5, 7, 9, 2, 2, 0);
    test_pool_shape(dev, GP_POOL_AVG, 2, 3, 7, 9, 3, 2, 1);
    test_pool_shape(dev, GP_POOL_AVG, 2, 3, 5, 5, 3, 1, 1);
    test_pool_shape(dev, GP_POOL_AVG_INCLUDE_PAD, 2, 3, 7, 9, 3, 2, 1);
    test_pool_shape(dev, GP_POOL_AVG_INCLUDE_PAD, 2, 3, 5, 5, 3, 1, 1);
    test_pool_shape(dev, GP_POOL_AVG_INCLUDE_PAD, 3, 5, 7, 9, 2, 2, 0); /* no padding: = AVG */
    /* per axis */
    test_pool_hw(dev, GP_POOL_MAX, 2, 3, 7, 9, 1, 3, 1, 2, 0, 1);
    test_pool_hw(dev, GP_POOL_MAX, 2, 3, 7, 9, 3, 2, 2, 1, 1, 0);
    test_pool_hw(dev, GP_POOL_AVG, 2, 3, 7, 9, 3, 1, 1, 1, 1, 0);
    test_pool_hw(dev, GP_POOL_AVG_INCLUDE_PAD, 2, 3, 7, 9, 3, 1, 1, 1, 1, 0);
    test_pool_hw(dev, GP_POOL_AVG, 2, 3, 8, 11, 2, 5, 1, 2, 1, 2);
    test_pool_hw(dev, GP_POOL_AVG_INCLUDE_PAD, 2, 3, 8, 11, 2, 5, 1, 2, 1, 2);
    /* refused: an unknown kind; a window reaching past the padding (the
     * include-pad divisor kh * kw would count cells that are not there) */
    float *x = dalloc(dev, 2 * 3 * 7 * 9), *y = dalloc(dev, 2 * 3 * 7 * 9);
    gp_pool_desc d = {2, 3, 7, 9, 3, 3, 2, 2, 1, 1, 4, 5, (gp_pool_kind)7, 0, false};
    CHECK_ERR(gp_dev_pool_fwd(dev, &d, x, y, NULL), GP_ERR_INVALID, "invalid pooling (kind 7");
    d.kind = GP_POOL_AVG_INCLUDE_PAD;
    d.oh = 5; /* (5 - 1) * 2 + 3 = 11 > 7 + 2 */
    CHECK_ERR(gp_dev_pool_fwd(dev, &d, x, y, NULL), GP_ERR_INVALID, "end inside the padding");
    dfree(dev, x, 2 * 3 * 7 * 9);
    dfree(dev, y, 2 * 3 * 7 * 9);
}

/* ---- batch norm ------------------------------------------------------------------- */

static void test_bn_shape(gp_device *dev, int64_t n, int64_t c, int64_t s)
{
    gp_bn_desc d = {n, c, s, 1e-5f, 0, false, NULL, NULL};
    int64_t nx = n * c * s;
    float *x = drand(dev, nx), *dy = drand(dev, nx), *g = drand(dev, c), *b = drand(dev, c);
    for (int64_t i = 0; i < nx; i++) x[i] = 3.0f * x[i] + 0.5f; /* non-zero mean */
    float *y = dalloc(dev, nx), *dx = dalloc(dev, nx), *mean = dalloc(dev, c), *var = dalloc(dev, c);
    float *dg = drand(dev, c), *dbt = drand(dev, c), *yi = dalloc(dev, nx);
    double *ry = malloc(sizeof(double) * (size_t)nx), *rdx = malloc(sizeof(double) * (size_t)nx);
    double *rm = malloc(sizeof(double) * (size_t)c), *rv = malloc(sizeof(double) * (size_t)c);
    double *rdg = dcopy_f(dg, c), *rdb = dcopy_f(dbt, c);
    double *rinc = malloc(sizeof(double) * (size_t)(2 * c));
    double cnt = (double)(n * s);
    for (int64_t ch = 0; ch < c; ch++) {
        double m, v;
        gpt_bn_moments(x, n, c, s, ch, &m, &v);
        v /= cnt;
        rm[ch] = m;
        rv[ch] = v;
        double inv = 1.0 / sqrt(v + (double)d.eps), sdy = 0, sdyx = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < s; j++) {
                int64_t k = (i * c + ch) * s + j;
                double xh = (x[k] - m) * inv;
                ry[k] = g[ch] * xh + b[ch];
                sdy += dy[k];
                sdyx += dy[k] * xh;
            }
        rdg[ch] += sdyx;
        rdb[ch] += sdy;
        rinc[2 * ch] = sdyx;
        rinc[2 * ch + 1] = sdy;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < s; j++) {
                int64_t k = (i * c + ch) * s + j;
                double xh = (x[k] - m) * inv;
                rdx[k] = g[ch] * inv * (dy[k] - sdy / cnt - xh * sdyx / cnt);
            }
    }
    char what[120];
    snprintf(what, sizeof what, "bn n%lld c%lld s%lld", (long long)n, (long long)c, (long long)s);
    char w2[160];
    CHECK_OK(gp_dev_bn_fwd_train(dev, &d, x, g, b, y, mean, var));
    snprintf(w2, sizeof w2, "%s fwd y", what);
    check_close(w2, y, ry, nx, 2e-5);
    snprintf(w2, sizeof w2, "%s mean", what);
    check_close(w2, mean, rm, c, 1e-5);
    snprintf(w2, sizeof w2, "%s biased var", what);
    check_close(w2, var, rv, c, 1e-5);
    CHECK_OK(gp_dev_bn_fwd_infer(dev, &d, x, g, b, mean, var, yi));
    snprintf(w2, sizeof w2, "%s infer y", what);
    check_close(w2, yi, ry, nx, 2e-5);
    CHECK_OK(gp_dev_bn_bwd(dev, &d, x, g, b, mean, var, dy, dx, dg, dbt));
    snprintf(w2, sizeof w2, "%s bwd dx", what);
    check_close(w2, dx, rdx, nx, 5e-5);
    snprintf(w2, sizeof w2, "%s bwd dgamma +=", what);
    check_close(w2, dg, rdg, c, 5e-5);
    snprintf(w2, sizeof w2, "%s bwd dbeta +=", what);
    check_close(w2, dbt, rdb, c, 5e-5);
    /* A second backward adds the same amount again. */
    CHECK_OK(gp_dev_bn_bwd(dev, &d, x, g, b, mean, var, dy, dx, dg, dbt));
    for (int64_t ch = 0; ch < c; ch++) {
        rdg[ch] += rinc[2 * ch];
        rdb[ch] += rinc[2 * ch + 1];
    }
    snprintf(w2, sizeof w2, "%s second bwd dgamma +=", what);
    check_close(w2, dg, rdg, c, 5e-5);
    snprintf(w2, sizeof w2, "%s second bwd dbeta +=", what);
    check_close(w2, dbt, rdb, c, 5e-5);
    snprintf(w2, sizeof w2, "%s second bwd dx =", what);
    check_close(w2, dx, rdx, nx, 5e-5);
    free(rinc);
    dfree(dev, x, nx); dfree(dev, dy, nx); dfree(dev, g, c); dfree(dev, b, c); dfree(dev, y, nx);
    dfree(dev, dx, nx); dfree(dev, mean, c); dfree(dev, var, c); dfree(dev, dg, c);
    dfree(dev, dbt, c); dfree(dev, yi, nx);
    free(ry); free(rdx); free(rm); free(rv); free(rdg); free(rdb);
}

static void test_bn(gp_device *dev)
{
    /* SyncBN's wrappers check their arguments for every backend. */
    float v[8] = {0}, sums[4] = {0};
    gp_bn_desc bad = {2, 0, 1, 1e-5f, 0, false, NULL, NULL}, ok = {2, 2, 1, 1e-5f, 0, false, NULL, NULL};
    CHECK_ERR(gp_dev_bn_stats(dev, &bad, v, v, v), GP_ERR_INVALID, "invalid batch norm");
    CHECK_ERR(gp_dev_bn_bwd_sums(dev, &bad, v, NULL, NULL, v, v, v, sums), GP_ERR_INVALID,
              "invalid batch norm");
    CHECK_ERR(gp_dev_bn_bwd_apply(dev, &ok, v, NULL, NULL, v, v, v, sums, 0.0, v, NULL, NULL,
                                  NULL),
              GP_ERR_INVALID, "backward over 0 values");
    test_bn_shape(dev, 3, 5, 63); /* 2-d: (3, 5, 7, 9) */
    test_bn_shape(dev, 7, 6, 1);  /* 1-d over features */
    test_bn_shape(dev, 4, 17, 25);
}


/* ---- channel-blocked layouts (backend.h): the plain layout's bits ---------------- */

/* (n, c, s) plain <-> (n, c / B, s, B) blocked, element by element. */
static void to_blocked(const float *x, float *o, int64_t n, int64_t c, int64_t s, int64_t B)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t j = 0; j < s; j++)
                o[((i * (c / B) + ch / B) * s + j) * B + ch % B] = x[(i * c + ch) * s + j];
}

static void from_blocked(const float *x, float *o, int64_t n, int64_t c, int64_t s, int64_t B)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t j = 0; j < s; j++)
                o[(i * c + ch) * s + j] = x[((i * (c / B) + ch / B) * s + j) * B + ch % B];
}

/* got holds exactly the bits of ref, n floats; a message names the first
 * that differs. */
static void check_same_bits(const char *what, const float *got, const float *ref, int64_t n)
{
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (memcmp(&got[i], &ref[i], sizeof(float))) bad = i;
    CHECK_MSG(bad < 0, "%s: element %lld is %.9g, %.9g wanted", what, (long long)bad,
              bad >= 0 ? (double)got[bad] : 0.0, bad >= 0 ? (double)ref[bad] : 0.0);
}

/* got (blocked, (n, c, s)) holds exactly the bits of ref (plain). */
static void check_blocked_bits(const char *what, const float *got, const float *ref, int64_t n,
                               int64_t c, int64_t s, int64_t B)
{
    int64_t nx = n * c * s;
    float *p = malloc((size_t)nx * sizeof(float));
    from_blocked(got, p, n, c, s, B);
    check_same_bits(what, p, ref, nx);
    free(p);
}

/* A blocked copy of plain x on dev. */
static float *dblocked(gp_device *dev, const float *x, int64_t n, int64_t c, int64_t s, int64_t B)
{
    float *o = dalloc(dev, n * c * s);
    to_blocked(x, o, n, c, s, B);
    return o;
}

/* Every batch-norm slot on a blocked tensor: the plain slot's bits. */
/* gp_bn_desc.relu: bn_fwd_train and bn_fwd_infer with the relu after them
 * give bit for bit bn then relu_fwd (the same statistics too), on the plain
 * layout and in blocks B (0: plain only), with NaN, zeros of both signs
 * and a channel that is all one value among the inputs. */
static void test_bn_relu(gp_device *dev, int64_t n, int64_t c, int64_t s, int64_t B)
{
    gp_bn_desc d = {n, c, s, 1e-5f, B, false, NULL, NULL}, dr = d;
    dr.relu = true;
    int64_t nx = n * c * s;
    float *x = drand(dev, nx), *g = drand(dev, c), *b = drand(dev, c);
    for (int64_t i = 0; i < nx; i++) x[i] = 2.0f * x[i] - 0.25f;
    x[1] = NAN; /* channel 0's statistics and outputs: NaN */
    x[nx - 1] = -0.0f;
    x[nx - 2] = 0.0f;
    for (int64_t i = 0; i < n; i++) /* the last channel all 0.5: normalised to beta */
        for (int64_t j = 0; j < s; j++)
            x[B ? ((i * (c / B) + (c - 1) / B) * s + j) * B + (c - 1) % B
                : (i * c + c - 1) * s + j] = 0.5f;
    b[c - 1] = -0.0f; /* so its outputs are -0.0 before the relu */
    float *y = dalloc(dev, nx), *yr = dalloc(dev, nx), *m0 = dalloc(dev, c), *v0 = dalloc(dev, c);
    float *m1 = dalloc(dev, c), *v1 = dalloc(dev, c), *yi = dalloc(dev, nx), *yir = dalloc(dev, nx);
    CHECK_OK(gp_dev_bn_fwd_train(dev, &d, x, g, b, y, m0, v0));
    CHECK_OK(gp_dev_relu_fwd(dev, y, y, nx));
    CHECK_OK(gp_dev_bn_fwd_train(dev, &dr, x, g, b, yr, m1, v1));
    char w[96];
    snprintf(w, sizeof w, "bn+relu n%lld c%lld s%lld B%lld", (long long)n, (long long)c,
             (long long)s, (long long)B);
    check_same_bits(w, yr, y, nx);
    check_same_bits(w, m1, m0, c);
    check_same_bits(w, v1, v0, c);
    CHECK_OK(gp_dev_bn_fwd_infer(dev, &d, x, g, b, m0, v0, yi));
    CHECK_OK(gp_dev_relu_fwd(dev, yi, yi, nx));
    CHECK_OK(gp_dev_bn_fwd_infer(dev, &dr, x, g, b, m0, v0, yir));
    check_same_bits(w, yir, yi, nx);
    /* in place, as the forward loop runs it on the norm's own output */
    CHECK_OK(gp_dev_bn_fwd_train(dev, &dr, x, g, b, yi, m1, v1));
    check_same_bits(w, yi, y, nx);
    int pos = 0;
    for (int64_t i = 0; i < nx; i++) pos += y[i] > 0.0f;
    CHECK_MSG(pos > nx / 8 && pos < nx - nx / 8, "%s: %d of %lld positive", w, pos,
              (long long)nx);
    /* a residual's sum folded in (gp_bn_desc.add), with and without the
     * relu, training and inference: bit for bit bn, add, relu */
    float *res = drand(dev, nx), *ya = dalloc(dev, nx), *yb = dalloc(dev, nx);
    for (int relu = 0; relu < 2; relu++)
        for (int train = 0; train < 2; train++) {
            gp_bn_desc da = d;
            da.relu = relu;
            da.add = res;
            if (train) CHECK_OK(gp_dev_bn_fwd_train(dev, &d, x, g, b, ya, m1, v1));
            else CHECK_OK(gp_dev_bn_fwd_infer(dev, &d, x, g, b, m0, v0, ya));
            CHECK_OK(gp_dev_add(dev, ya, res, ya, nx));
            if (relu) CHECK_OK(gp_dev_relu_fwd(dev, ya, ya, nx));
            if (train) CHECK_OK(gp_dev_bn_fwd_train(dev, &da, x, g, b, yb, m1, v1));
            else CHECK_OK(gp_dev_bn_fwd_infer(dev, &da, x, g, b, m0, v0, yb));
            char wa[128];
            snprintf(wa, sizeof wa, "%s + add, relu %d, train %d", w, relu, train);
            check_same_bits(wa, yb, ya, nx);
        }
    dfree(dev, res, nx); dfree(dev, ya, nx); dfree(dev, yb, nx);
    /* backward: the norm's with the relu folded in (dr: dy masked where the
     * forward's value was not positive) against relu_bwd on the relu's
     * output and then the plain norm's, bit for bit, for bn_bwd and the
     * SyncBN pair; dgamma and dbeta accumulate from the same start */
    float *dy = drand(dev, nx), *dym = dalloc(dev, nx), *dx[2], *dg[2], *dbt[2], *sm[2];
    for (int k = 0; k < 2; k++) {
        dx[k] = dalloc(dev, nx), dg[k] = dalloc(dev, c), dbt[k] = dalloc(dev, c);
        sm[k] = dalloc(dev, 2 * c);
        for (int64_t i = 0; i < c; i++) dg[k][i] = 0.5f, dbt[k][i] = -0.25f;
    }
    CHECK_OK(gp_dev_relu_bwd(dev, y, dy, dym, nx));
    CHECK_OK(gp_dev_bn_bwd(dev, &d, x, g, b, m0, v0, dym, dx[0], dg[0], dbt[0]));
    CHECK_OK(gp_dev_bn_bwd(dev, &dr, x, g, b, m0, v0, dy, dx[1], dg[1], dbt[1]));
    char w2[128];
    snprintf(w2, sizeof w2, "%s bwd dx", w);
    check_same_bits(w2, dx[1], dx[0], nx);
    snprintf(w2, sizeof w2, "%s bwd dgamma", w);
    check_same_bits(w2, dg[1], dg[0], c);
    snprintf(w2, sizeof w2, "%s bwd dbeta", w);
    check_same_bits(w2, dbt[1], dbt[0], c);
    CHECK_OK(gp_dev_bn_bwd_sums(dev, &d, x, g, b, m0, v0, dym, sm[0]));
    CHECK_OK(gp_dev_bn_bwd_sums(dev, &dr, x, g, b, m0, v0, dy, sm[1]));
    snprintf(w2, sizeof w2, "%s sync sums", w);
    check_same_bits(w2, sm[1], sm[0], 2 * c);
    CHECK_OK(gp_dev_bn_bwd_apply(dev, &d, x, g, b, m0, v0, dym, sm[0], (double)(n * s), dx[0],
                                 sm[0], dg[0], dbt[0]));
    CHECK_OK(gp_dev_bn_bwd_apply(dev, &dr, x, g, b, m0, v0, dy, sm[1], (double)(n * s), dx[1],
                                 sm[1], dg[1], dbt[1]));
    snprintf(w2, sizeof w2, "%s sync dx", w);
    check_same_bits(w2, dx[1], dx[0], nx);
    snprintf(w2, sizeof w2, "%s sync dgamma", w);
    check_same_bits(w2, dg[1], dg[0], c);
    /* the mask mattered: some of dy was cut, some kept */
    int cut = 0;
    for (int64_t i = 0; i < nx; i++) cut += dym[i] == 0.0f && dy[i] != 0.0f;
    CHECK_MSG(cut > nx / 8 && cut < nx - nx / 8, "%s: the relu cut %d of %lld", w, cut,
              (long long)nx);
    for (int k = 0; k < 2; k++) {
        dfree(dev, dx[k], nx); dfree(dev, dg[k], c); dfree(dev, dbt[k], c);
        dfree(dev, sm[k], 2 * c);
    }
    dfree(dev, dy, nx); dfree(dev, dym, nx);
    dfree(dev, x, nx); dfree(dev, g, c); dfree(dev, b, c); dfree(dev, y, nx); dfree(dev, yr, nx);
    dfree(dev, m0, c); dfree(dev, v0, c); dfree(dev, m1, c); dfree(dev, v1, c);
    dfree(dev, yi, nx); dfree(dev, yir, nx);
}

static void test_blocked_bn(gp_device *dev, int64_t n, int64_t c, int64_t s, int64_t B)
{
    gp_bn_desc d = {n, c, s, 1e-5f, 0, false, NULL, NULL}, db = d;
    db.blk = B;
    int64_t nx = n * c * s;
    float *x = drand(dev, nx), *dy = drand(dev, nx), *g = drand(dev, c), *b = drand(dev, c);
    for (int64_t i = 0; i < nx; i++) x[i] = 3.0f * x[i] + 0.5f;
    float *xb = dblocked(dev, x, n, c, s, B), *dyb = dblocked(dev, dy, n, c, s, B);
    float *y[2], *dx[2], *dx2[2], *mean[2], *var[2], *m2[2], *v2[2], *sums[2], *dg[2], *dbt[2];
    for (int k = 0; k < 2; k++) {
        y[k] = dalloc(dev, nx), dx[k] = dalloc(dev, nx), dx2[k] = dalloc(dev, nx);
        mean[k] = dalloc(dev, c), var[k] = dalloc(dev, c), m2[k] = dalloc(dev, c);
        v2[k] = dalloc(dev, c), sums[k] = dalloc(dev, 2 * c);
        dg[k] = dalloc(dev, c), dbt[k] = dalloc(dev, c);
        for (int64_t i = 0; i < c; i++) dg[k][i] = 0.25f * (float)i, dbt[k][i] = -0.5f;
    }
    for (int k = 0; k < 2; k++) {
        const gp_bn_desc *dd = k ? &db : &d;
        const float *xx = k ? xb : x, *gg = k ? dyb : dy;
        CHECK_OK(gp_dev_bn_fwd_train(dev, dd, xx, g, b, y[k], mean[k], var[k]));
        CHECK_OK(gp_dev_bn_bwd(dev, dd, xx, g, b, mean[k], var[k], gg, dx[k], dg[k], dbt[k]));
        CHECK_OK(gp_dev_bn_stats(dev, dd, xx, m2[k], v2[k]));
        CHECK_OK(gp_dev_bn_bwd_sums(dev, dd, xx, g, b, m2[k], v2[k], gg, sums[k]));
        CHECK_OK(gp_dev_bn_bwd_apply(dev, dd, xx, g, b, m2[k], v2[k], gg, sums[k], (double)(n * s),
                                     dx2[k], sums[k], dg[k], dbt[k]));
    }
    char w[120];
    snprintf(w, sizeof w, "blocked bn n%lld c%lld s%lld B%lld", (long long)n, (long long)c,
             (long long)s, (long long)B);
    char w2[160];
#define BLK_BITS(name, a, b2, cnt)                                                            \
    (snprintf(w2, sizeof w2, "%s %s", w, name), check_same_bits(w2, a, b2, cnt))
    BLK_BITS("mean", mean[1], mean[0], c);
    BLK_BITS("var", var[1], var[0], c);
    BLK_BITS("stats mean", m2[1], m2[0], c);
    BLK_BITS("stats var", v2[1], v2[0], c);
    BLK_BITS("bwd sums", sums[1], sums[0], 2 * c);
    BLK_BITS("dgamma", dg[1], dg[0], c);
    BLK_BITS("dbeta", dbt[1], dbt[0], c);
#undef BLK_BITS
    snprintf(w2, sizeof w2, "%s y", w);
    check_blocked_bits(w2, y[1], y[0], n, c, s, B);
    snprintf(w2, sizeof w2, "%s dx", w);
    check_blocked_bits(w2, dx[1], dx[0], n, c, s, B);
    snprintf(w2, sizeof w2, "%s dx (sync pieces)", w);
    check_blocked_bits(w2, dx2[1], dx2[0], n, c, s, B);
    CHECK_OK(gp_dev_bn_fwd_infer(dev, &d, x, g, b, mean[0], var[0], y[0]));
    CHECK_OK(gp_dev_bn_fwd_infer(dev, &db, xb, g, b, mean[0], var[0], y[1]));
    snprintf(w2, sizeof w2, "%s infer y", w);
    check_blocked_bits(w2, y[1], y[0], n, c, s, B);
    /* the statistics are still right (the lanes' order is not wrong, only fixed) */
    double rm, rv;
    gpt_bn_moments(x, n, c, s, c - 1, &rm, &rv);
    CHECK_MSG(fabs(mean[0][c - 1] - rm) <= 1e-6 * (1 + fabs(rm)) &&
                  fabs(var[0][c - 1] - rv / (double)(n * s)) <= 1e-6 * (1 + rv / (double)(n * s)),
              "%s: channel %lld mean %g var %g, reference %g %g", w, (long long)(c - 1),
              (double)mean[0][c - 1], (double)var[0][c - 1], rm, rv / (double)(n * s));
    for (int k = 0; k < 2; k++) {
        dfree(dev, y[k], nx), dfree(dev, dx[k], nx), dfree(dev, dx2[k], nx);
        dfree(dev, mean[k], c), dfree(dev, var[k], c), dfree(dev, m2[k], c), dfree(dev, v2[k], c);
        dfree(dev, sums[k], 2 * c), dfree(dev, dg[k], c), dfree(dev, dbt[k], c);
    }
    dfree(dev, x, nx), dfree(dev, dy, nx), dfree(dev, g, c), dfree(dev, b, c);
    dfree(dev, xb, nx), dfree(dev, dyb, nx);
}

/* Pooling of every kind on a blocked tensor, with ties and a NaN: the plain
 * bits, forward and backward. */
static void test_blocked_pool(gp_device *dev, gp_pool_kind kind, int64_t n, int64_t c, int64_t h,
                              int64_t w, int64_t k, int64_t st, int64_t pad, int64_t B)
{
    gp_pool_desc d = {n, c, h, w, k, k, st, st, pad, pad, (h + 2 * pad - k) / st + 1,
                      (w + 2 * pad - k) / st + 1, kind, 0, false};
    int64_t nx = n * c * h * w, ny = n * c * d.oh * d.ow;
    float *x = drand(dev, nx), *dy = drand(dev, ny);
    for (int64_t i = 0; i < nx; i++) x[i] = floorf(x[i] * 3.0f) / 4.0f; /* ties in most windows */
    x[nx / 3] = NAN;
    for (int64_t i = 0; i < ny; i += 7) dy[i] = -0.0f; /* 0 + -0 is +0: dx's zeros are added */
    float *xb = dblocked(dev, x, n, c, h * w, B), *dyb = dblocked(dev, dy, n, c, d.oh * d.ow, B);
    float *y[2] = {dalloc(dev, ny), dalloc(dev, ny)}, *dx[2] = {dalloc(dev, nx), dalloc(dev, nx)};
    size_t wsb = gp_dev_pool_ws_bytes(dev, &d);
    void *ws[2] = {NULL, NULL};
    for (int q = 0; q < 2 && wsb; q++) CHECK_OK(gp_dev_alloc(dev, wsb, GP_MEM_WORKSPACE, &ws[q]));
    CHECK_OK(gp_dev_pool_fwd(dev, &d, x, y[0], ws[0]));
    CHECK_OK(gp_dev_pool_bwd(dev, &d, x, y[0], dy, dx[0], ws[0]));
    /* blocked in and out, and blocked in with a plain out (a chain's end) */
    for (int po = 0; po < 2; po++) {
        gp_pool_desc db = d;
        db.blk = B;
        db.plain_out = po == 1;
        for (int64_t i = 0; i < ny; i++) y[1][i] = NAN; /* nothing left from the last pass */
        for (int64_t i = 0; i < nx; i++) dx[1][i] = NAN;
        CHECK(wsb == gp_dev_pool_ws_bytes(dev, &db));
        CHECK_OK(gp_dev_pool_fwd(dev, &db, xb, y[1], ws[1]));
        CHECK_OK(gp_dev_pool_bwd(dev, &db, xb, y[1], po ? dy : dyb, dx[1], ws[1]));
        char what[200];
        int l = snprintf(what, sizeof what, "blocked pool%s kind %d n%lld c%lld %lldx%lld k%lld "
                         "s%lld p%lld B%lld ", po ? " (plain out)" : "", (int)kind, (long long)n,
                         (long long)c, (long long)h, (long long)w, (long long)k, (long long)st,
                         (long long)pad, (long long)B);
        snprintf(what + l, sizeof what - (size_t)l, "y");
        if (po) check_same_bits(what, y[1], y[0], ny);
        else check_blocked_bits(what, y[1], y[0], n, c, d.oh * d.ow, B);
        snprintf(what + l, sizeof what - (size_t)l, "dx");
        check_blocked_bits(what, dx[1], dx[0], n, c, h * w, B);
    }
    for (int q = 0; q < 2; q++) {
        if (ws[q]) gp_dev_free(dev, ws[q], wsb, GP_MEM_WORKSPACE);
        dfree(dev, y[q], ny), dfree(dev, dx[q], nx);
    }
    dfree(dev, x, nx), dfree(dev, dy, ny), dfree(dev, xb, nx), dfree(dev, dyb, ny);
}

/* A convolution given blocked x and / or y: the plain bits in all three
 * directions; with the device's own block (act_block) no reorder of an
 * activation is left. */
static void test_blocked_conv(gp_device *dev, int64_t n, int64_t c, int64_t hw, int64_t k,
                              int64_t kern, int64_t st, int64_t xb_, int64_t yb_)
{
    int64_t pad = kern / 2, o = (hw + 2 * pad - kern) / st + 1;
    gp_conv_desc d = {n, c, hw, hw, k, kern, kern, st, st, pad, pad, o, o, 1, 0, 0}, db = d;
    db.xblk = xb_, db.yblk = yb_;
    int64_t nx = n * c * hw * hw, ny = n * k * o * o, nw = k * c * kern * kern;
    float *x = drand(dev, nx), *wt = drand(dev, nw), *bias = drand(dev, k), *dy = drand(dev, ny);
    float *xq = xb_ ? dblocked(dev, x, n, c, hw * hw, xb_) : x;
    float *dyq = yb_ ? dblocked(dev, dy, n, k, o * o, yb_) : dy;
    float *y[2], *dx[2], *dw[2], *dbias[2];
    for (int q = 0; q < 2; q++) {
        y[q] = dalloc(dev, ny), dx[q] = dalloc(dev, nx), dw[q] = dalloc(dev, nw);
        dbias[q] = dalloc(dev, k);
        for (int64_t i = 0; i < nw; i++) dw[q][i] = 0.5f;
        for (int64_t i = 0; i < k; i++) dbias[q][i] = -1.0f;
    }
    CHECK_OK(gp_dev_conv_fwd(dev, &d, x, wt, bias, y[0]));
    CHECK_OK(gp_dev_conv_bwd_data(dev, &d, wt, dy, dx[0]));
    CHECK_OK(gp_dev_conv_bwd_weights(dev, &d, x, dy, dw[0], dbias[0]));
    CHECK_OK(gp_dev_conv_fwd(dev, &db, xq, wt, bias, y[1]));
    CHECK_OK(gp_dev_conv_bwd_data(dev, &db, wt, dyq, dx[1]));
    CHECK_OK(gp_dev_conv_bwd_weights(dev, &db, xq, dyq, dw[1], dbias[1]));
    char w[160];
    int l = snprintf(w, sizeof w, "blocked conv n%lld c%lld %lld k%lld %lldx%lld s%lld x/%lld y/%lld ",
                     (long long)n, (long long)c, (long long)hw, (long long)k, (long long)kern,
                     (long long)kern, (long long)st, (long long)xb_, (long long)yb_);
    snprintf(w + l, sizeof w - (size_t)l, "y");
    if (yb_) check_blocked_bits(w, y[1], y[0], n, k, o * o, yb_);
    else check_same_bits(w, y[1], y[0], ny);
    snprintf(w + l, sizeof w - (size_t)l, "dx");
    if (xb_) check_blocked_bits(w, dx[1], dx[0], n, c, hw * hw, xb_);
    else check_same_bits(w, dx[1], dx[0], nx);
    snprintf(w + l, sizeof w - (size_t)l, "dw +=");
    check_same_bits(w, dw[1], dw[0], nw);
    snprintf(w + l, sizeof w - (size_t)l, "db +=");
    check_same_bits(w, dbias[1], dbias[0], k);
    /* in the device's own blocks (act_block, per side) nothing is reordered
     * (a first layer's backward-data, which a first layer never runs, aside);
     * plain, each blocked side is reordered in forward and backward-weights.
     * Except a first layer's backward-weights with AVX2 (nChw8c): oneDNN's
     * jit:avx2 kernel reads a plain source only with exactly 3 input
     * channels (its "flat" case; AVX-512's takes 1 to 3), so with 1 or 2
     * the plain x leaves the gemm path, which reads dy plain: the blocked
     * dy is reordered (1) and a plain one is not (0) */
    int64_t ox = gp_dev_act_block(dev, &d, false), oy = gp_dev_act_block(dev, &d, true);
    if ((ox || oy) && ox == xb_ && oy == yb_) {
        int got[3] = {-1, -1, -1}, plain[3] = {-1, -1, -1};
        CHECK_OK(gp_cpu_conv_act_reorders(dev, &db, got));
        CHECK_OK(gp_cpu_conv_act_reorders(dev, &d, plain));
        int sides = (ox != 0) + (oy != 0);
        bool avx2_first = oy == 8 && c < 3; /* conv_mode's CONV_FIRST in nChw8c */
        CHECK_MSG(got[0] == 0 && got[2] == avx2_first && (got[1] == 0 || !ox) &&
                      plain[0] == sides && plain[2] == (avx2_first ? 0 : sides),
                  "%s: activation reorders %d/%d/%d in the device's blocks %lld/%lld (plain: "
                  "%d/%d/%d)", w, got[0], got[1], got[2], (long long)ox, (long long)oy,
                  plain[0], plain[1], plain[2]);
    }
    for (int q = 0; q < 2; q++) {
        dfree(dev, y[q], ny), dfree(dev, dx[q], nx), dfree(dev, dw[q], nw), dfree(dev, dbias[q], k);
    }
    if (xq != x) dfree(dev, xq, nx);
    if (dyq != dy) dfree(dev, dyq, ny);
    dfree(dev, x, nx), dfree(dev, wt, nw), dfree(dev, bias, k), dfree(dev, dy, ny);
}

static void test_blocked(gp_device *dev)
{
    /* the block a direct convolution computes in here: 16 with AVX-512,
     * 8 with AVX2, none below (GPIPE_CPU_ISA=sse41, a processor without
     * AVX: activations stay plain; the loops below still run every block);
     * with another oneDNN these checks and the reorder counts below say
     * the guess in gp_cpu_act_block needs a look */
    gp_conv_desc probe = {1, 32, 14, 14, 32, 3, 3, 1, 1, 1, 1, 14, 14, 1, 0, 0};
    int64_t own = gp_dev_act_block(dev, &probe, true);
    int64_t want = gp_cpu_isa_has(dnnl_cpu_isa_avx512_core) ? 16
                   : gp_cpu_isa_has(dnnl_cpu_isa_avx2)      ? 8
                                                            : 0;
    CHECK_MSG(own == want && gp_dev_act_block(dev, &probe, false) == own,
              "act_block of a 32 -> 32 3x3 convolution: %lld (the ISA's block: %lld)",
              (long long)own, (long long)want);
    probe.c = 3; /* 3 channels: blocked, but not in blocks of 8 or 16 */
    CHECK_MSG(gp_dev_act_block(dev, &probe, false) == 0 && gp_dev_act_block(dev, &probe, true) == own,
              "act_block of a 3-channel input");
    probe.c = 1; /* a first layer: plain input, blocked output */
    CHECK_MSG(gp_dev_act_block(dev, &probe, false) == 0 && gp_dev_act_block(dev, &probe, true) == own,
              "act_block of a 1-channel input");
    probe.k = 4; /* too few outputs: plain */
    CHECK_MSG(gp_dev_act_block(dev, &probe, true) == 0, "act_block of 4 output channels");
    test_bn_relu(dev, 3, 5, 63, 0);
    test_bn_relu(dev, 7, 6, 1, 0);
    test_bn_relu(dev, 2, 64, 4096, 0); /* the parallel loops */
    for (int64_t B = 8; B <= 16; B += 8) {
        test_blocked_bn(dev, 3, 32, 49, B);  /* 7x7: a tail of 17 after the lanes */
        test_blocked_bn(dev, 2, 16, 196, B); /* 14x14 */
        test_blocked_bn(dev, 5, 16, 1, B);
        test_bn_relu(dev, 3, 32, 49, B);
        test_blocked_bn(dev, 1, 48, 33, B);
        test_blocked_pool(dev, GP_POOL_MAX, 2, 32, 8, 8, 2, 2, 0, B);
        test_blocked_pool(dev, GP_POOL_MAX, 2, 16, 9, 7, 3, 2, 1, B);
        test_blocked_pool(dev, GP_POOL_AVG, 2, 16, 9, 7, 3, 2, 1, B);
        test_blocked_pool(dev, GP_POOL_AVG_INCLUDE_PAD, 1, 16, 6, 6, 3, 1, 1, B);
        /* plain 2x2 max pooling's three forwards: a plane's outputs in one
         * loop (rows under 16 outputs: the 8x8 above and 28x28 below), a
         * row at a time (18 outputs), and short rows in a plane of more
         * outputs than the one loop's table holds (420 x 10) */
        test_blocked_pool(dev, GP_POOL_MAX, 2, 16, 34, 36, 2, 2, 0, B);
        test_blocked_pool(dev, GP_POOL_MAX, 1, 16, 841, 21, 2, 2, 0, B);
        /* the parallel paths (more work than one task's) and a window of
         * more than 256 elements (int32 positions) */
        test_blocked_bn(dev, 8, 64, 196, B);
        test_blocked_pool(dev, GP_POOL_MAX, 8, 32, 28, 28, 2, 2, 0, B);
        test_blocked_pool(dev, GP_POOL_MAX, 2, 16, 20, 20, 17, 1, 0, B);
        test_blocked_pool(dev, GP_POOL_AVG, 2, 16, 20, 20, 17, 3, 8, B);
        test_blocked_conv(dev, 2, 32, 9, 32, 3, 1, B, B);
        test_blocked_conv(dev, 3, 16, 8, 32, 3, 2, B, 0);
        test_blocked_conv(dev, 3, 16, 8, 16, 1, 1, 0, B);
        test_blocked_conv(dev, 2, 1, 9, 16, 3, 1, 0, B); /* a first layer */
        test_blocked_conv(dev, 2, 2, 8, 32, 3, 2, 0, B);
    }
    /* channels-last, the block the channel count (a GPU's layout, backend.h):
     * pixels of several units of 8 or 16, the parallel paths, both pools'
     * plain out, and convolutions from and to it */
    test_blocked_bn(dev, 3, 40, 49, 40);
    test_blocked_bn(dev, 2, 48, 33, 48);
    test_blocked_bn(dev, 8, 64, 196, 64);
    test_bn_relu(dev, 3, 24, 49, 24);
    test_blocked_pool(dev, GP_POOL_MAX, 2, 40, 8, 8, 2, 2, 0, 40);
    test_blocked_pool(dev, GP_POOL_AVG, 2, 24, 9, 7, 3, 2, 1, 24);
    test_blocked_pool(dev, GP_POOL_MAX, 2, 48, 20, 20, 17, 1, 0, 48);
    test_blocked_pool(dev, GP_POOL_MAX, 8, 32, 28, 28, 2, 2, 0, 32);
    test_blocked_conv(dev, 2, 32, 9, 40, 3, 1, 32, 40);
    test_blocked_conv(dev, 3, 24, 8, 16, 3, 2, 24, 0);
    test_blocked_conv(dev, 2, 1, 9, 24, 3, 1, 0, 24);
    float v[64] = {0};
    gp_bn_desc nbad = {2, 12, 1, 1e-5f, 12, false, NULL, NULL}; /* channels-last of 12 */
    CHECK_ERR(gp_dev_bn_fwd_train(dev, &nbad, v, NULL, NULL, v, v, v), GP_ERR_INVALID,
              "blocks of 12");
    gp_bn_desc bad = {2, 12, 1, 1e-5f, 8, false, NULL, NULL};
    CHECK_ERR(gp_dev_bn_fwd_train(dev, &bad, v, NULL, NULL, v, v, v), GP_ERR_INVALID,
              "blocks of 8");
    gp_pool_desc pbad = {1, 12, 2, 2, 2, 2, 2, 2, 0, 0, 1, 1, GP_POOL_MAX, 8, false};
    CHECK_ERR(gp_dev_pool_fwd(dev, &pbad, v, v, NULL), GP_ERR_INVALID, "block 8");
    pbad.c = 16, pbad.blk = 0, pbad.plain_out = true;
    CHECK_ERR(gp_dev_pool_fwd(dev, &pbad, v, v, NULL), GP_ERR_INVALID, "block 0, plain out");
    gp_conv_desc cbad = {1, 12, 2, 2, 8, 1, 1, 1, 1, 0, 0, 2, 2, 0, 8, 0};
    CHECK_ERR(gp_dev_conv_fwd(dev, &cbad, v, v, NULL, v), GP_ERR_INVALID, "blocks 8/0");
}

/* ---- gemm -------------------------------------------------------------------------- */

/* Where the CPU device's blocks start (cpu_device.c, cpu_alloc): a weight
 * block of 64 KiB or more 16 bytes past a 64-byte boundary where CPU
 * devices compute in AVX2 (oneDNN's AVX2 sgemm runs dy W 1.6-1.8x slower
 * with W on a 32-byte boundary), on one elsewhere; smaller weights, every
 * other block and the workspace arena on one always; a block cached and
 * handed out again keeps its start, also to a request of the same size for
 * the other kind; and a product gives the same bits whichever start its
 * operands have. */
static void test_block_starts(gp_device *dev)
{
    bool avx2 = gp_cpu_isa_has(dnnl_cpu_isa_avx2) && !gp_cpu_isa_has(dnnl_cpu_isa_avx512_core);
    uintptr_t want = avx2 ? 16 : 0;
    const int64_t m = 64, k = 256, n = 512; /* B: k x n floats, 512 KiB */
    void *small = NULL, *big = NULL, *a = NULL, *c = NULL;
    CHECK_OK(gp_dev_alloc(dev, 1000, GP_MEM_ACTIVATIONS, &small));
    CHECK_OK(gp_dev_alloc(dev, (size_t)(k * n) * 4, GP_MEM_PARAMS, &big));
    CHECK_MSG(((uintptr_t)small & 63) == 0, "a 1000-byte block starts at %lu past 64",
              (unsigned long)((uintptr_t)small & 63));
    CHECK_MSG(((uintptr_t)big & 63) == want, "a 512 KiB block starts at %lu past 64, not %lu",
              (unsigned long)((uintptr_t)big & 63), (unsigned long)want);
    gp_dev_free(dev, big, (size_t)(k * n) * 4, GP_MEM_PARAMS);
    void *act = NULL; /* the same size, not a weight: not the cached weight block */
    CHECK_OK(gp_dev_alloc(dev, (size_t)(k * n) * 4, GP_MEM_ACTIVATIONS, &act));
    CHECK_MSG(((uintptr_t)act & 63) == 0, "a 512 KiB activation block starts at %lu past 64",
              (unsigned long)((uintptr_t)act & 63));
    CHECK_OK(gp_dev_alloc(dev, (size_t)(k * n) * 4, GP_MEM_PARAMS, &big)); /* from the cache */
    CHECK(((uintptr_t)big & 63) == want);
    gp_dev_free(dev, act, (size_t)(k * n) * 4, GP_MEM_ACTIVATIONS);
    CHECK_OK(gp_cpu_arena_reserve(dev, 200000));
    CHECK(((uintptr_t)gp_cpu_ctx_of(dev)->arena & 63) == 0);
    CHECK(gp_cpu_ctx_of(dev)->arena_bytes >= 200000);
    /* dy W (not transposed: a linear layer's backward-data) with W in the
     * block and in a copy on a 64-byte boundary: the same bits */
    CHECK_OK(gp_dev_alloc(dev, (size_t)(m * k) * 4, GP_MEM_ACTIVATIONS, &a));
    CHECK_OK(gp_dev_alloc(dev, (size_t)(m * n) * 4, GP_MEM_ACTIVATIONS, &c));
    float *b2 = NULL, *c2 = malloc((size_t)(m * n) * 4);
    CHECK(posix_memalign((void **)&b2, 64, (size_t)(k * n) * 4) == 0 && c2);
    float *fa = a, *fb = big;
    for (int64_t i = 0; i < m * k; i++) fa[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    for (int64_t i = 0; i < k * n; i++) fb[i] = b2[i] = (float)((i * 104729) % 997) / 5000.0f;
    CHECK_OK(gp_dev_gemm(dev, 0, 0, m, n, k, 1.0f, fa, k, fb, n, 0.0f, c, n));
    memcpy(c2, c, (size_t)(m * n) * 4);
    CHECK_OK(gp_dev_gemm(dev, 0, 0, m, n, k, 1.0f, fa, k, b2, n, 0.0f, c, n));
    CHECK_MSG(!memcmp(c, c2, (size_t)(m * n) * 4), "dy W differs with W 16 bytes off");
    free(b2);
    free(c2);
    gp_dev_free(dev, a, (size_t)(m * k) * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(dev, c, (size_t)(m * n) * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(dev, big, (size_t)(k * n) * 4, GP_MEM_PARAMS);
    gp_dev_free(dev, small, 1000, GP_MEM_ACTIVATIONS);
}

static void test_gemm(gp_device *dev)
{
    /* Shapes: a small one, and short wide ones (2m <= n, k >= 64) that the
     * CPU backend runs transposed (cpu_math.c gemm_wide_nt; from m = 32 on
     * only where it computes in AVX-512: the AVX2 pass runs them plain),
     * the last one large enough for its threaded transposes. */
    static const int64_t shapes[][3] = {{13, 7, 11}, {5, 40, 70}, {31, 70, 64}, {32, 64, 96},
                                        {64, 600, 600}};
    for (int sh = 0; sh < 5; sh++)
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                const int64_t m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2];
                /* op(A) is m x k; stored (ta ? k x m : m x k) with a padded ld */
                int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
                int64_t lda = ac + 3, ldb = bc + 2, ldc = n + 5;
                float *a = drand(dev, ar * lda), *b = drand(dev, br * ldb), *c = drand(dev, m * ldc);
                double *ref = malloc(sizeof(double) * (size_t)(m * ldc));
                float alpha = 0.75f, beta = acc ? 1.0f : 0.0f;
                if (!acc)
                    for (int64_t i = 0; i < m * ldc; i++) c[i] = NAN; /* beta 0 ignores C */
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < ldc; j++) {
                        if (j >= n) { ref[i * ldc + j] = c[i * ldc + j]; continue; }
                        double s = 0;
                        for (int64_t p = 0; p < k; p++)
                            s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                                 (tb ? b[j * ldb + p] : b[p * ldb + j]);
                        ref[i * ldc + j] = alpha * s + (acc ? (double)c[i * ldc + j] : 0.0);
                    }
                CHECK_OK(gp_dev_gemm(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
                char what[64];
                snprintf(what, sizeof what, "gemm %lldx%lldx%lld ta=%d tb=%d beta=%g", (long long)m,
                         (long long)n, (long long)k, ta, tb, (double)beta);
                /* compare only the n valid columns of each row */
                double maxerr = 0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double e = fabs(c[i * ldc + j] - ref[i * ldc + j]);
                        if (!(e <= maxerr)) maxerr = e;
                    }
                CHECK_MSG(maxerr < 1e-5 * k, "%s: max error %g", what, maxerr);
                dfree(dev, a, ar * lda); dfree(dev, b, br * ldb); dfree(dev, c, m * ldc);
                free(ref);
            }
    /* A large product exercises the threaded path. */
    const int64_t L = 257;
    float *a = drand(dev, L * L), *b = drand(dev, L * L), *c = dalloc(dev, L * L);
    CHECK_OK(gp_dev_gemm(dev, 0, 1, L, L, L, 1.0f, a, L, b, L, 0.0f, c, L));
    double maxerr = 0;
    for (int64_t i = 0; i < L; i += 17)
        for (int64_t j = 0; j < L; j += 13) {
            double s = 0;
            for (int64_t p = 0; p < L; p++) s += (double)a[i * L + p] * b[j * L + p];
            if (fabs(s - c[i * L + j]) > maxerr) maxerr = fabs(s - c[i * L + j]);
        }
    CHECK_MSG(maxerr < 1e-3, "gemm 257^3: max error %g", maxerr);
    dfree(dev, a, L * L); dfree(dev, b, L * L); dfree(dev, c, L * L);
}

/* ---- softmax, cross-entropy ----------------------------------------------------------- */

static void test_softmax_xent(gp_device *dev)
{
    const int64_t rows = 37, cols = 11;
    float *x = drand(dev, rows * cols), *y = dalloc(dev, rows * cols), *lab = dalloc(dev, rows);
    float *dl = dalloc(dev, rows * cols);
    for (int64_t i = 0; i < rows * cols; i++) x[i] *= 4.0f;
    double *ry = malloc(sizeof(double) * (size_t)(rows * cols));
    double *rdl = malloc(sizeof(double) * (size_t)(rows * cols));
    double rloss = 0;
    int64_t rcorrect = 0;
    const float scale = 1.0f / 64.0f;
    for (int64_t r = 0; r < rows; r++) {
        int64_t label = (r * 7) % cols;
        lab[r] = (float)label;
        if (r % 5 == 0) { /* make some rows correct */
            x[r * cols + label] = 10.0f;
        }
        double mx = -DBL_MAX, s = 0;
        int64_t am = 0;
        for (int64_t j = 0; j < cols; j++)
            if (x[r * cols + j] > mx) { mx = x[r * cols + j]; am = j; }
        for (int64_t j = 0; j < cols; j++) s += exp(x[r * cols + j] - mx);
        for (int64_t j = 0; j < cols; j++) {
            ry[r * cols + j] = x[r * cols + j] - mx - log(s);
            rdl[r * cols + j] = (exp(ry[r * cols + j]) - (j == label)) * scale;
        }
        rloss -= ry[r * cols + label];
        rcorrect += am == label;
    }
    CHECK_OK(gp_dev_log_softmax(dev, x, y, rows, cols));
    check_close("log_softmax", y, ry, rows * cols, 1e-5);
    double loss = -1;
    int64_t correct = -1, bad = 7;
    CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, 0.0f, dl, &loss, &correct, &bad));
    CHECK_NEAR(loss, rloss, 1e-9, 1e-6);
    CHECK(correct == rcorrect);
    CHECK(correct >= rows / 5);
    CHECK(bad == -1);
    check_close("xent dlogits", dl, rdl, rows * cols, 1e-6);
    /* Without dlogits: same loss. */
    double loss2 = -1;
    CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, 0.0f, NULL, &loss2, &correct, &bad));
    CHECK(loss2 == loss);
    /* Label smoothing eps: the target (1 - eps) onehot + eps / cols, PyTorch's
     * CrossEntropyLoss(label_smoothing=eps): against the double reference
     * -sum_j target_j log softmax_j, its gradient (softmax - target) scale,
     * and that gradient against central differences of the loss. */
    {
        const double eps = 0.1;
        double rls = 0;
        double *rdls = malloc(sizeof(double) * (size_t)(rows * cols));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < cols; j++) {
                double t = (j == (int64_t)lab[r] ? 1.0 - eps : 0.0) + eps / (double)cols;
                rls -= t * ry[r * cols + j];
                rdls[r * cols + j] = (exp(ry[r * cols + j]) - t) * scale;
            }
        double ls = -1;
        CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, (float)eps, dl, &ls, &correct, &bad));
        CHECK_NEAR(ls, rls, 1e-9, 1e-6);
        CHECK(correct == rcorrect && bad == -1 && ls > loss); /* smoothing costs loss here */
        check_close("xent dlogits, label smoothing", dl, rdls, rows * cols, 1e-6);
        double worst = 0;
        for (int64_t q = 0; q < rows * cols; q += 7) {
            float keep = x[q];
            const float h = 1e-2f;
            double lp, lm;
            x[q] = keep + h;
            CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, (float)eps, NULL, &lp, &correct,
                                 &bad));
            x[q] = keep - h;
            CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, (float)eps, NULL, &lm, &correct,
                                 &bad));
            x[q] = keep;
            double fd = (lp - lm) / (2.0 * (double)h) * scale;
            worst = fmax(worst, fabs(fd - dl[q]));
        }
        CHECK_MSG(worst <= 1e-5, "label smoothing: gradient against central differences %.3g",
                  worst);
        free(rdls);
    }
    /* Rows ld = cols + 5 apart (a padded vocabulary, model.gpt.vocab_pad):
     * the first cols columns give the compact rows' loss, hits and
     * gradient bit for bit, with and without smoothing and with the
     * results on the device, though the padding holds the row's largest
     * values; the gradient's padding columns are 0. */
    {
        const int64_t ld = cols + 5;
        float *xp = dalloc(dev, rows * ld), *dp = dalloc(dev, rows * ld);
        float *dc = dalloc(dev, rows * cols);
        gp_loss_result *res = (gp_loss_result *)dalloc(dev, 8);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < ld; j++) xp[r * ld + j] = j < cols ? x[r * cols + j] : 100.0f;
        for (int q = 0; q < 3; q++) {
            float eps = q == 1 ? 0.1f : 0.0f;
            double lc = -1, lp = -2;
            int64_t cc = -1, cp = -2, bc = 7, bp = 7;
            for (int64_t i = 0; i < rows * ld; i++) dp[i] = 5.0f;
            CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, eps, dc, &lc, &cc, &bc));
            if (q < 2) {
                CHECK_OK(gp_dev_xent_ld(dev, xp, lab, rows, cols, ld, scale, eps, dp, &lp, &cp,
                                        &bp));
            } else {
                CHECK_OK(gp_dev_xent_dev_ld(dev, xp, lab, rows, cols, ld, scale, eps, dp, res));
                CHECK_OK(gp_dev_synchronize(dev));
                lp = res->loss_sum;
                cp = res->correct;
                bp = res->bad;
            }
            int grad_bad = 0, pad_bad = 0;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < ld; j++) {
                    if (j < cols) grad_bad += memcmp(&dp[r * ld + j], &dc[r * cols + j], 4) != 0;
                    else pad_bad += dp[r * ld + j] != 0.0f;
                }
            CHECK_MSG(lp == lc && cp == cc && bp == -1 && bc == -1 && grad_bad == 0 &&
                          pad_bad == 0,
                      "xent with ld %lld (%s): loss %.17g against %.17g, hits %lld against "
                      "%lld, %d gradients differ, %d padding gradients not 0", (long long)ld,
                      q == 0 ? "plain" : q == 1 ? "smoothing" : "xent_dev", lp, lc,
                      (long long)cp, (long long)cc, grad_bad, pad_bad);
        }
        dfree(dev, xp, rows * ld); dfree(dev, dp, rows * ld); dfree(dev, dc, rows * cols);
        dfree(dev, (float *)res, 8);
    }
    /* A bad label names its row and computes nothing. */
    lab[23] = (float)cols;
    for (int64_t i = 0; i < rows * cols; i++) dl[i] = 5.0f;
    CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, 0.0f, dl, &loss, &correct, &bad));
    CHECK(bad == 23);
    CHECK(dl[0] == 5.0f && dl[rows * cols - 1] == 5.0f);
    lab[23] = -1.0f;
    CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, 0.0f, NULL, &loss, &correct, &bad));
    CHECK(bad == 23);
    lab[23] = 2.5f;
    CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, scale, 0.0f, NULL, &loss, &correct, &bad));
    CHECK(bad == 23);
    dfree(dev, x, rows * cols); dfree(dev, y, rows * cols); dfree(dev, lab, rows);
    dfree(dev, dl, rows * cols);
    free(ry); free(rdl);
}

/* ---- elementwise, reductions, optimizer, dropout ---------------------------------------- */

static void test_elementwise(gp_device *dev)
{
    for (int big = 0; big < 2; big++) {
        const int64_t n = big ? 100003 : 37;
        float *a = drand(dev, n), *b = drand(dev, n), *y = dalloc(dev, n);
        double *r = malloc(sizeof(double) * (size_t)n);
        CHECK_OK(gp_dev_fill(dev, y, 2.5f, n));
        for (int64_t i = 0; i < n; i++) r[i] = 2.5;
        check_close("fill", y, r, n, 0);
        CHECK_OK(gp_dev_add(dev, a, b, y, n));
        for (int64_t i = 0; i < n; i++) r[i] = (float)(a[i] + b[i]);
        check_close("add", y, r, n, 0);
        CHECK_OK(gp_dev_axpy(dev, -0.5f, a, y, n));
        for (int64_t i = 0; i < n; i++) r[i] = (double)y[i];
        for (int64_t i = 0; i < n; i++) r[i] = (float)(a[i] + b[i]) + -0.5 * a[i];
        check_close("axpy", y, r, n, 1e-6);
        CHECK_OK(gp_dev_scale(dev, y, 3.0f, n));
        for (int64_t i = 0; i < n; i++) r[i] *= 3.0;
        check_close("scale", y, r, n, 1e-6);
        CHECK_OK(gp_dev_mul(dev, a, b, y, n));
        for (int64_t i = 0; i < n; i++) r[i] = (double)a[i] * b[i];
        check_close("mul", y, r, n, 1e-7);
        CHECK_OK(gp_dev_relu_fwd(dev, a, y, n));
        for (int64_t i = 0; i < n; i++) r[i] = a[i] > 0 ? a[i] : 0;
        check_close("relu_fwd", y, r, n, 0);
        float *dx = dalloc(dev, n);
        CHECK_OK(gp_dev_relu_bwd(dev, y, b, dx, n));
        for (int64_t i = 0; i < n; i++) r[i] = a[i] > 0 ? b[i] : 0;
        check_close("relu_bwd", dx, r, n, 0);
        dfree(dev, dx, n);
        double ss = -1, rs = 0;
        for (int64_t i = 0; i < n; i++) rs += (double)a[i] * a[i];
        CHECK_OK(gp_dev_sumsq(dev, a, n, &ss));
        CHECK_NEAR(ss, rs, 0, 1e-12);
        {
            /* sumsq_multi: each slice the bits sumsq gives it (a slice
             * crossing the parallel threshold among them), and the same
             * through the wrapper's fallback for a backend without it */
            const float *xs[4] = {a, a + 1, a + 7, a};
            int64_t ns[4] = {1, 6, n - 7, n};
            double one[4], multi[4], fall[4];
            for (int t = 0; t < 4; t++) CHECK_OK(gp_dev_sumsq(dev, xs[t], ns[t], &one[t]));
            CHECK_OK(gp_dev_sumsq_multi(dev, xs, ns, 4, multi));
            gp_device_iface no = *dev->iface;
            no.sumsq_multi = NULL;
            const gp_device_iface *own = dev->iface;
            dev->iface = &no;
            CHECK_OK(gp_dev_sumsq_multi(dev, xs, ns, 4, fall));
            dev->iface = own;
            CHECK_MSG(!memcmp(one, multi, sizeof one) && !memcmp(one, fall, sizeof one),
                      "sumsq_multi differs from sumsq: %.17g %.17g / %.17g %.17g", one[3],
                      multi[3], one[1], fall[1]);
        }
        int bad = -1;
        CHECK_OK(gp_dev_nonfinite(dev, a, n, &bad));
        CHECK(bad == 0);
        a[n - 1] = INFINITY;
        CHECK_OK(gp_dev_nonfinite(dev, a, n, &bad));
        CHECK(bad != 0);
        a[n - 1] = NAN;
        a[0] = 1.0f;
        CHECK_OK(gp_dev_nonfinite(dev, a, n, &bad));
        CHECK(bad != 0);
        dfree(dev, a, n); dfree(dev, b, n); dfree(dev, y, n);
        free(r);
    }
    /* bias rows: y(N,F) += bias; sum_rows: db(F) += column sums */
    for (int big = 0; big < 2; big++) {
        const int64_t rows = big ? 301 : 9, cols = big ? 203 : 13;
        float *y = drand(dev, rows * cols), *bias = drand(dev, cols), *db = drand(dev, cols);
        double *r = malloc(sizeof(double) * (size_t)(rows * cols)), *rdb = dcopy_f(db, cols);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                r[i * cols + j] = (float)(y[i * cols + j] + bias[j]);
                rdb[j] += y[i * cols + j];
            }
        CHECK_OK(gp_dev_sum_rows(dev, y, db, rows, cols));
        check_close("sum_rows +=", db, rdb, cols, 1e-6);
        CHECK_OK(gp_dev_add_bias_rows(dev, y, bias, rows, cols));
        check_close("add_bias_rows", y, r, rows * cols, 0);
        dfree(dev, y, rows * cols); dfree(dev, bias, cols); dfree(dev, db, cols);
        free(r); free(rdb);
    }
}

static void test_sgd(gp_device *dev)
{
    const int64_t n = 1001;
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        float *w = drand(dev, n), *g = drand(dev, n), *v = drand(dev, n);
        double *rw = dcopy_f(w, n), *rv = dcopy_f(v, n);
        const float lr = 0.1f, mu = 0.9f, wd = 5e-4f;
        for (int64_t i = 0; i < n; i++) {
            double gg = g[i] + (double)wd * rw[i];
            rv[i] = mu * rv[i] + gg;
            rw[i] -= lr * (nesterov ? gg + mu * rv[i] : rv[i]);
        }
        CHECK_OK(gp_dev_sgd_update(dev, w, g, v, n, lr, mu, wd, nesterov));
        check_close(nesterov ? "sgd nesterov w" : "sgd w", w, rw, n, 1e-6);
        check_close(nesterov ? "sgd nesterov v" : "sgd v", v, rv, n, 1e-6);
        dfree(dev, w, n); dfree(dev, g, n); dfree(dev, v, n);
        free(rw); free(rv);
    }
    /* plain SGD: no momentum buffer (v NULL), w -= lr (g + wd w) */
    float *w = drand(dev, n), *g = drand(dev, n);
    double *rw = dcopy_f(w, n);
    const float lr = 0.1f, wd = 5e-4f;
    for (int64_t i = 0; i < n; i++) rw[i] -= lr * (g[i] + (double)wd * rw[i]);
    CHECK_OK(gp_dev_sgd_update(dev, w, g, NULL, n, lr, 0.0f, wd, 0));
    check_close("sgd without momentum w", w, rw, n, 1e-6);
    dfree(dev, w, n); dfree(dev, g, n);
    free(rw);
}

/* sgd_multi (a stage's update in one pass) against sgd_update per part,
 * bitwise: parts with and without momentum, their own weight decays, sizes
 * from 0 to above the parallel threshold, plain and Nesterov; and the
 * wrapper's fallback (no sgd_multi slot) the same. */
static void test_sgd_multi(gp_device *dev)
{
    enum { P = 7 };
    const int64_t len[P] = {1, 0, 3, 70001, 17, 40000, 5};
    const float wd[P] = {0.0f, 1e-3f, 5e-4f, 0.0f, 1e-2f, 5e-4f, 0.0f};
    gp_device_iface bare = *dev->iface;
    bare.sgd_multi = NULL;
    gp_device fake = *dev;
    fake.iface = &bare;
    for (int variant = 0; variant < 3; variant++) {
        float mu = variant == 2 ? 0.0f : 0.9f;
        int nesterov = variant == 1;
        float *w[3][P], *v[3][P], *g[P], *w0[P];
        gp_update_part parts[2][P];
        for (int p = 0; p < P; p++) {
            int64_t n = len[p];
            g[p] = dalloc(dev, n);
            for (int64_t i = 0; i < n; i++) g[p][i] = frand();
            for (int k = 0; k < 3; k++) {
                w[k][p] = dalloc(dev, n);
                v[k][p] = dalloc(dev, n);
            }
            w0[p] = malloc((size_t)(n ? n : 1) * sizeof(float));
            for (int64_t i = 0; i < n; i++) {
                w0[p][i] = w[0][p][i] = w[1][p][i] = w[2][p][i] = frand();
                v[0][p][i] = v[1][p][i] = v[2][p][i] = 0.1f * frand();
            }
            bool stateless = mu == 0.0f || p == 2; /* part 2 keeps no momentum */
            for (int k = 0; k < 2; k++)
                parts[k][p] = (gp_update_part){.w = w[k + 1][p], .g = g[p],
                                            .v = stateless ? NULL : v[k + 1][p], .n = n,
                                            .wd = wd[p]};
            CHECK_OK(gp_dev_sgd_update(dev, w[0][p], g[p], stateless ? NULL : v[0][p], n, 0.05f,
                                       mu, wd[p], nesterov));
        }
        CHECK_OK(gp_dev_sgd_multi(dev, parts[0], P, 0.05f, mu, nesterov));
        CHECK_OK(gp_dev_sgd_multi(&fake, parts[1], P, 0.05f, mu, nesterov));
        int changed = 0;
        for (int p = 0; p < P; p++) {
            size_t bytes = (size_t)len[p] * sizeof(float);
            for (int k = 1; k < 3; k++)
                CHECK_MSG(!memcmp(w[0][p], w[k][p], bytes) && !memcmp(v[0][p], v[k][p], bytes),
                          "variant %d part %d: sgd_multi (%s) != sgd_update", variant, p,
                          k == 1 ? "slot" : "fallback");
            changed += len[p] > 0 && memcmp(w[1][p], w0[p], bytes) != 0; /* it did update */
            free(w0[p]);
            for (int k = 0; k < 3; k++) {
                dfree(dev, w[k][p], len[p]);
                dfree(dev, v[k][p], len[p]);
            }
            dfree(dev, g[p], len[p]);
        }
        CHECK(changed == P - 1);
    }
    CHECK_OK(gp_dev_sgd_multi(dev, NULL, 0, 0.05f, 0.9f, 0)); /* nothing to do */
}

/* The check after the step in the update's own pass
 * (gp_update_part.nonfinite): SGD's slot, its fallback without the slot
 * and Adam leave the flag as it is when every new value of the parts that
 * ask is finite, even where a part that does not ask went bad, and set it
 * when one that asks did (an infinite gradient), whichever element. */
static void test_update_check(gp_device *dev)
{
    enum { N = 70001 };
    gp_device_iface bare = *dev->iface;
    bare.sgd_multi = NULL;
    gp_device fake = *dev;
    fake.iface = &bare;
    float *w = drand(dev, 2 * N), *g = drand(dev, 2 * N), *v = dalloc(dev, 2 * N),
          *v2 = dalloc(dev, 2 * N), *flag = dalloc(dev, 1);
    for (int way = 0; way < 3; way++)
        for (int bad_at = -1; bad_at < 2; bad_at++) { /* none, the unchecked part, the checked */
            for (int64_t i = 0; i < 2 * N; i++) {
                w[i] = frand();
                g[i] = frand();
                v[i] = v2[i] = 0.0f;
            }
            if (bad_at >= 0) g[bad_at * N + 12345] = INFINITY;
            *flag = 0.0f;
            gp_update_part parts[2] = {
                {.w = w, .g = g, .v = v, .v2 = v2, .n = N},
                {.w = w + N, .g = g + N, .v = v + N, .v2 = v2 + N, .n = N, .nonfinite = flag}};
            gp_adam_step adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .step_size = 1e-3f, .bc2_sqrt = 1.0f};
            if (way == 0) CHECK_OK(gp_dev_sgd_multi(dev, parts, 2, 0.05f, 0.9f, 0));
            if (way == 1) CHECK_OK(gp_dev_sgd_multi(&fake, parts, 2, 0.05f, 0.9f, 0));
            if (way == 2) CHECK_OK(gp_dev_adam_multi(dev, parts, 2, &adam));
            CHECK(bad_at < 0 || !isfinite(w[bad_at * N + 12345])); /* it did go bad */
            CHECK_MSG(*flag == (bad_at == 1 ? 1.0f : 0.0f), "way %d, bad part %d: flag %g",
                      way, bad_at, (double)*flag);
        }
    dfree(dev, w, 2 * N);
    dfree(dev, g, 2 * N);
    dfree(dev, v, 2 * N);
    dfree(dev, v2, 2 * N);
    dfree(dev, flag, 1);
}

/* Clipping's factor in the update's pass (gp_update_part.clip): SGD's
 * slot, its fallback and Adam give the bits of the same update on the
 * gradient scaled first (g * clip, one FP32 product, as the pipeline's
 * CLIP scaled it before), momentum and moments included; the slots leave
 * the gradient as it was. */
static void test_update_clip(gp_device *dev)
{
    enum { N = 70001 };
    const float clip = 0.3712f;
    gp_device_iface bare = *dev->iface;
    bare.sgd_multi = NULL;
    gp_device fake = *dev;
    fake.iface = &bare;
    float *w[2], *v[2], *v2[2], *g = dalloc(dev, N), *gs = dalloc(dev, N), *g0 = dalloc(dev, N);
    for (int k = 0; k < 2; k++) {
        w[k] = dalloc(dev, N);
        v[k] = dalloc(dev, N);
        v2[k] = dalloc(dev, N);
    }
    for (int way = 0; way < 3; way++) {
        for (int64_t i = 0; i < N; i++) {
            w[0][i] = w[1][i] = frand();
            v[0][i] = v[1][i] = 0.1f * frand();
            v2[0][i] = v2[1][i] = 0.01f * (frand() + 1.0f);
            g0[i] = g[i] = 4.0f * frand();
            gs[i] = g[i] * clip;
        }
        gp_update_part ref = {.w = w[0], .g = gs, .v = v[0], .v2 = v2[0], .n = N, .wd = 1e-2f};
        gp_update_part got = {.w = w[1], .g = g, .v = v[1], .v2 = v2[1], .n = N, .wd = 1e-2f,
                              .clip = clip};
        gp_adam_step adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                             .step_size = 1e-2f, .bc2_sqrt = 0.3f, .decoupled = 1};
        gp_device *d = way == 1 ? &fake : dev;
        if (way < 2) {
            CHECK_OK(gp_dev_sgd_multi(d, &ref, 1, 0.05f, 0.9f, 1));
            CHECK_OK(gp_dev_sgd_multi(d, &got, 1, 0.05f, 0.9f, 1));
        } else {
            CHECK_OK(gp_dev_adam_multi(d, &ref, 1, &adam));
            CHECK_OK(gp_dev_adam_multi(d, &got, 1, &adam));
        }
        size_t b = (size_t)N * sizeof(float);
        CHECK_MSG(!memcmp(w[0], w[1], b) && !memcmp(v[0], v[1], b) && !memcmp(v2[0], v2[1], b),
                  "way %d: the update with clip %g is not the update of the scaled gradient",
                  way, (double)clip);
        CHECK_MSG(memcmp(w[1], g0, b) != 0, "way %d: nothing was updated", way);
        if (way != 1) CHECK_MSG(!memcmp(g, g0, b), "way %d: the slot wrote the gradient", way);
    }
    for (int k = 0; k < 2; k++) {
        dfree(dev, w[k], N);
        dfree(dev, v[k], N);
        dfree(dev, v2[k], N);
    }
    dfree(dev, g, N);
    dfree(dev, gs, N);
    dfree(dev, g0, N);
}

/* Weight mirrors (gp_wmirror, backend.h), on any processor (the table and
 * its rules are device-independent; the CPU's products read mirrors only
 * under precision bf16, which test_pipeline's bf16_native checks end to
 * end): a mirror is made while frozen and current for the rest of that
 * freeze; the update writes it in its own pass (sgd_multi, adam_multi and
 * the wrapper's fallback: the rounding of the new weights, bit for bit) and
 * it is current for the next freeze without a conversion; every other
 * write into the tensor (upload, copy, a copy between devices, a
 * collective's wrapper) makes it stale, as does a freeze the update did
 * not precede; GPIPE_CHECK_MIRRORS's check finds a write that bypassed all
 * of them; and freeing the parameter frees its mirror. */
static void test_mirrors(gp_device *dev)
{
    enum { N = 70001 }; /* above the parallel threshold */
    float *w = NULL, *g = drand(dev, N), *v = dalloc(dev, N), *v2 = dalloc(dev, N),
          *host = malloc(N * sizeof(float));
    uint16_t *want = malloc(N * sizeof(uint16_t));
    CHECK_OK(gp_dev_alloc(dev, N * sizeof(float), GP_MEM_PARAMS, (void **)&w));
    for (int64_t i = 0; i < N; i++) {
        w[i] = frand();
        v[i] = v2[i] = 0.0f;
        host[i] = frand();
    }
    bool check0 = dev->check_mirrors;
    dev->check_mirrors = true;
    size_t ws0 = dev->alloc.cur_by[GP_MEM_WORKSPACE];
    int n0 = dev->n_mirrors;
    uint16_t *m = NULL; /* the mirror's copy */
    bool cur = true;
    CHECK_OK(gp_dev_mirror_get(dev, w, N, &m, &cur)); /* thawed: none made */
    CHECK(!m && !cur && dev->n_mirrors == n0);
    CHECK(gp_dev_mirror_for_update(dev, w, N) == NULL); /* none yet: nothing to write */

    gp_dev_freeze_weights(dev, true);
    CHECK_OK(gp_dev_mirror_get(dev, w, N, &m, &cur));
    CHECK(m && !cur && dev->n_mirrors == n0 + 1);
    if (!m) {
        gp_dev_freeze_weights(dev, false);
        return;
    }
    uint16_t *copy = m;
    CHECK(dev->alloc.cur_by[GP_MEM_WORKSPACE] == ws0 + N * sizeof(uint16_t));
    CHECK_OK(gp_dev_bf16_pack(dev, copy, w, N));
    uint64_t kept = dev->weights_kept;
    gp_dev_mirror_made(dev, w, N);
    CHECK(dev->weights_kept == kept + 1);
    CHECK_OK(gp_dev_mirror_get(dev, w, N, &m, &cur));
    CHECK(cur && m == copy); /* current for the rest of the freeze */
    gp_dev_freeze_weights(dev, false);

    /* the update writes it: SGD's slot, its fallback without the slot, Adam */
    gp_device_iface bare = *dev->iface;
    bare.sgd_multi = NULL;
    gp_device fake = *dev;
    fake.iface = &bare;
    for (int way = 0; way < 3; way++) {
        uint16_t *w16 = gp_dev_mirror_for_update(dev, w, N);
        CHECK(w16 == copy);
        CHECK(gp_dev_mirror_for_update(dev, w, N - 1) == NULL); /* a chunk: not the tensor */
        gp_update_part part = {.w = w, .g = g, .v = v, .v2 = v2, .n = N, .wd = 1e-4f, .w16 = w16};
        gp_adam_step adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                             .step_size = 1e-3f, .bc2_sqrt = 1.0f};
        if (way == 0) CHECK_OK(gp_dev_sgd_multi(dev, &part, 1, 0.05f, 0.9f, 0));
        if (way == 1) CHECK_OK(gp_dev_sgd_multi(&fake, &part, 1, 0.05f, 0.9f, 0));
        if (way == 2) CHECK_OK(gp_dev_adam_multi(dev, &part, 1, &adam));
        int finite = 1;
        for (int64_t i = 0; i < N; i++) {
            want[i] = gp_ew_bf16_bits(w[i]);
            finite &= isfinite(w[i]);
        }
        CHECK(finite);
        CHECK_MSG(!memcmp(copy, want, N * sizeof(uint16_t)),
                  "way %d: the mirror the update wrote is not the new weights' rounding", way);
        uint64_t by = dev->mirrors_by_update;
        kept = dev->weights_kept;
        gp_dev_freeze_weights(dev, true);
        CHECK_OK(gp_dev_mirror_get(dev, w, N, &m, &cur)); /* (and GPIPE_CHECK_MIRRORS's check) */
        CHECK_MSG(cur && dev->mirrors_by_update == by + 1 && dev->weights_kept == kept,
                  "way %d: the update's mirror not current at the next freeze", way);
        gp_dev_freeze_weights(dev, false);
    }
    /* a freeze without an update before it: stale (its weights may have
     * changed any way) */
    gp_dev_freeze_weights(dev, true);
    CHECK_OK(gp_dev_mirror_get(dev, w, N, &m, &cur));
    CHECK(!cur);
    gp_dev_freeze_weights(dev, false);

    /* every other way into the tensor after the update: stale */
    const char *ways[] = {"upload", "upload_async", "copy_d2d", "copy_async", "a copy between "
                          "devices (staged)", "all_gather's wrapper", "fill", "bf16_unpack",
                          "a chunk's update (for_update while frozen)"};
    gp_device *other = NULL;
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:7", &o, &other));
    float *src = other ? drand(other, 8) : NULL;
    for (int way = 0; way < 9; way++) {
        uint16_t *w16 = gp_dev_mirror_for_update(dev, w, N);
        gp_update_part part = {.w = w, .g = g, .v = v, .n = N, .w16 = w16};
        CHECK_OK(gp_dev_sgd_multi(dev, &part, 1, 0.05f, 0.9f, 0));
        gp_status st = GP_OK;
        if (way == 0) st = gp_dev_upload(dev, w + 5, host, 3);
        if (way == 1) st = gp_dev_upload_async(dev, w + N - 2, host, 2, NULL);
        if (way == 2) st = gp_dev_copy_d2d(dev, w + 100, g, 4 * sizeof(float));
        if (way == 3) st = gp_dev_copy_async(dev, w, dev, g, sizeof(float), NULL, NULL);
        if (way == 4 && src) {
            gp_tensor a = {.mem = (gp_mem *)(void *)(w + 7), .dtype = GP_F32, .ndim = 1,
                           .dims = {8}, .dev = dev};
            gp_tensor b = a;
            b.mem = (gp_mem *)(void *)src;
            b.dev = other;
            st = gp_tensor_copy(&a, &b);
        }
        if (way == 5) st = gp_dev_all_gather(dev, NULL, w + 9, 1); /* (no comm: it refuses) */
        if (way == 6) st = gp_dev_fill(dev, w + 3, 0.5f, 2);
        if (way == 7) st = gp_dev_bf16_unpack(dev, w + 11, want, 4);
        if (way == 5) gp_error_clear();
        else CHECK_OK(st);
        if (way == 8) {
            gp_dev_freeze_weights(dev, true);
            CHECK(gp_dev_mirror_for_update(dev, w, N) == NULL); /* frozen: stale, not stamped */
            gp_dev_freeze_weights(dev, false);
        }
        gp_dev_freeze_weights(dev, true);
        CHECK_OK(gp_dev_mirror_get(dev, w, N, &m, &cur));
        CHECK_MSG(!cur, "%s into the weights after the update left the mirror current",
                  ways[way]);
        CHECK_OK(gp_dev_bf16_pack(dev, m, w, N)); /* what a backend does */
        gp_dev_mirror_made(dev, w, N);
        gp_dev_freeze_weights(dev, false);
    }
    if (other) {
        dfree(other, src, 8);
        gp_device_close(other);
    }

    /* mirrors of several tensors (the table sorted by address): each
     * lookup finds its own, whatever the order they were made in */
    {
        enum { K = 5 };
        float *ws[K];
        uint16_t *cs[K];
        const int order[K] = {4, 2, 0, 1, 3};
        for (int k = 0; k < K; k++) { /* (no draws: later tests' values stay theirs) */
            ws[k] = dalloc(dev, 64 + k);
            for (int i = 0; i < 64 + k; i++) ws[k][i] = 0.01f * (float)(i * (k + 3) % 97);
        }
        gp_dev_freeze_weights(dev, true);
        for (int q = 0; q < K; q++) {
            int k = order[q];
            CHECK_OK(gp_dev_mirror_get(dev, ws[k], 64 + k, &cs[k], &cur));
        }
        CHECK(dev->n_mirrors == n0 + 1 + K);
        for (int k = 0; k < K; k++) {
            CHECK_OK(gp_dev_bf16_pack(dev, cs[k], ws[k], 64 + k));
            gp_dev_mirror_made(dev, ws[k], 64 + k);
        }
        for (int k = 0; k < K; k++) {
            uint16_t *again = NULL;
            CHECK_OK(gp_dev_mirror_get(dev, ws[k], 64 + k, &again, &cur)); /* (and checked) */
            CHECK_MSG(cur && again == cs[k], "tensor %d of %d: another tensor's mirror", k, K);
            for (int q = 0; q < k; q++) CHECK(cs[q] != cs[k]);
        }
        /* a write during the freeze (none may be) is what the check finds
         * in a mirror made in it too */
        ws[2][7] += 1.0f;
        uint16_t *again = NULL;
        gp_status st = gp_dev_mirror_get(dev, ws[2], 66, &again, &cur);
        CHECK_MSG(st == GP_ERR_RUNTIME && strstr(gp_last_error(), "made earlier in this freeze"),
                  "a write during the freeze: %s", gp_last_error());
        gp_error_clear();
        gp_dev_freeze_weights(dev, false);
        for (int k = 0; k < K; k++) { /* (activations' memory: dropped by hand) */
            gp_dev_mirrors_drop(dev, ws[k], (size_t)(64 + k) * sizeof(float));
            dfree(dev, ws[k], 64 + k);
        }
        CHECK(dev->n_mirrors == n0 + 1);
    }

    /* a write none of them saw (a host store into CPU memory):
     * GPIPE_CHECK_MIRRORS finds it at the next use, and says what */
    uint16_t *w16 = gp_dev_mirror_for_update(dev, w, N);
    gp_update_part part = {.w = w, .g = g, .v = v, .n = N, .w16 = w16};
    CHECK_OK(gp_dev_sgd_multi(dev, &part, 1, 0.05f, 0.9f, 0));
    w[N / 2] += 1.0f;
    gp_dev_freeze_weights(dev, true);
    gp_status st = gp_dev_mirror_get(dev, w, N, &m, &cur);
    CHECK(st == GP_ERR_RUNTIME && strstr(gp_last_error(), "GPIPE_CHECK_MIRRORS") &&
          strstr(gp_last_error(), "value 35000"));
    gp_error_clear();
    dev->check_mirrors = false; /* unchecked, the stale copy is served: the check is what
                                   tells */
    CHECK_OK(gp_dev_mirror_get(dev, w, N, &m, &cur));
    CHECK(cur);
    gp_dev_freeze_weights(dev, false);

    /* the parameter's free takes its mirror */
    gp_dev_free(dev, w, N * sizeof(float), GP_MEM_PARAMS);
    CHECK(dev->n_mirrors == n0 && dev->alloc.cur_by[GP_MEM_WORKSPACE] == ws0);
    dev->check_mirrors = check0;
    dfree(dev, g, N);
    dfree(dev, v, N);
    dfree(dev, v2, N);
    free(host);
    free(want);
}

/* adam_multi against a double-precision Adam (PyTorch's formula, optim.h),
 * four steps from zero moments, Adam (L2 decay into the gradient) and
 * AdamW (decoupled decay), parts of sizes 0 to above the parallel
 * threshold with their own decays; and bitwise against gp_ew_adam one
 * element at a time (the threads split the parts, not the arithmetic). */
static void test_adam(gp_device *dev)
{
    enum { P = 5, T = 4 };
    const int64_t len[P] = {3, 0, 70001, 17, 40000};
    const float wd[P] = {0.0f, 1e-2f, 5e-2f, 0.0f, 1e-1f};
    const double lr = 2e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int decoupled = 0; decoupled < 2; decoupled++) {
        float *w[P], *m[P], *v[P], *g[T][P], *sw[P], *sm[P], *sv[P];
        double *rw[P], *rm[P], *rv[P];
        gp_update_part parts[P];
        for (int p = 0; p < P; p++) {
            int64_t n = len[p];
            w[p] = drand(dev, n);
            m[p] = dalloc(dev, n);
            v[p] = dalloc(dev, n);
            for (int t = 0; t < T; t++) g[t][p] = drand(dev, n);
            size_t b = (size_t)(n ? n : 1) * sizeof(float);
            sw[p] = malloc(b);
            sm[p] = calloc(1, b);
            sv[p] = calloc(1, b);
            for (int64_t i = 0; i < n; i++) m[p][i] = v[p][i] = 0.0f, sw[p][i] = w[p][i];
            rw[p] = dcopy_f(w[p], n);
            rm[p] = calloc((size_t)(n ? n : 1), sizeof(double));
            rv[p] = calloc((size_t)(n ? n : 1), sizeof(double));
            parts[p] = (gp_update_part){.w = w[p], .g = NULL, .v = m[p], .v2 = v[p], .n = n,
                                        .wd = wd[p]};
        }
        for (int t = 1; t <= T; t++) {
            gp_adam_step a = {.lr = (float)lr, .beta1 = (float)b1, .beta2 = (float)b2,
                              .eps = (float)eps, .step_size = (float)(lr / (1 - pow(b1, t))),
                              .bc2_sqrt = (float)sqrt(1 - pow(b2, t)), .decoupled = decoupled};
            for (int p = 0; p < P; p++) {
                parts[p].g = g[t - 1][p];
                for (int64_t i = 0; i < len[p]; i++) {
                    double gg = g[t - 1][p][i];
                    if (decoupled) rw[p][i] *= 1 - lr * wd[p];
                    else gg += wd[p] * rw[p][i];
                    rm[p][i] = b1 * rm[p][i] + (1 - b1) * gg;
                    rv[p][i] = b2 * rv[p][i] + (1 - b2) * gg * gg;
                    double mh = rm[p][i] / (1 - pow(b1, t)), vh = rv[p][i] / (1 - pow(b2, t));
                    rw[p][i] -= lr * mh / (sqrt(vh) + eps);
                    gp_ew_adam(&sw[p][i], g[t - 1][p][i], &sm[p][i], &sv[p][i], &a, wd[p]);
                }
            }
            CHECK_OK(gp_dev_adam_multi(dev, parts, P, &a));
        }
        for (int p = 0; p < P; p++) {
            char what[48];
            snprintf(what, sizeof what, "%s part %d w", decoupled ? "adamw" : "adam", p);
            check_close(what, w[p], rw[p], len[p], 1e-5);
            what[strlen(what) - 1] = 'm';
            check_close(what, m[p], rm[p], len[p], 1e-6);
            what[strlen(what) - 1] = 'v';
            check_close(what, v[p], rv[p], len[p], 1e-6);
            size_t b = (size_t)len[p] * sizeof(float);
            CHECK_MSG(!memcmp(w[p], sw[p], b) && !memcmp(m[p], sm[p], b) &&
                      !memcmp(v[p], sv[p], b), "%s: adam_multi != gp_ew_adam element by element",
                      what);
            dfree(dev, w[p], len[p]);
            dfree(dev, m[p], len[p]);
            dfree(dev, v[p], len[p]);
            for (int t = 0; t < T; t++) dfree(dev, g[t][p], len[p]);
            free(sw[p]); free(sm[p]); free(sv[p]);
            free(rw[p]); free(rm[p]); free(rv[p]);
        }
    }
    CHECK_OK(gp_dev_adam_multi(dev, NULL, 0, NULL)); /* nothing to do */
}

static void test_dropout(gp_device *dev)
{
    const int64_t n = 70001;
    const float p = 0.3f;
    const uint64_t seed = 42, stream = 7, first = 1001;
    float *m = dalloc(dev, n), *s = dalloc(dev, n);
    CHECK_OK(gp_dev_dropout_mask(dev, m, n, p, seed, stream, first));
    int64_t kept = 0;
    int formula = 1;
    for (int64_t i = 0; i < n; i++) {
        float u = gp_rng_uniform(seed, stream, first + (uint64_t)i);
        formula &= m[i] == gp_ew_dropout(u, p);
        kept += m[i] != 0.0f;
        formula &= m[i] == 0.0f || m[i] == 1.0f / (1.0f - p);
    }
    CHECK_MSG(formula, "dropout mask != gp_ew_dropout(gp_rng_uniform(...))");
    CHECK_NEAR((double)kept / (double)n, 1.0 - p, 0.01, 0);
    /* Sub-ranges (odd offsets, not multiples of 4) equal the slice of the whole. */
    const int64_t offs[3] = {0, 3, 40001}, lens[3] = {5, 40003, 29999};
    for (int t = 0; t < 3; t++) {
        CHECK_OK(gp_dev_dropout_mask(dev, s, lens[t], p, seed, stream, first + (uint64_t)offs[t]));
        CHECK(memcmp(s, m + offs[t], (size_t)lens[t] * sizeof(float)) == 0);
    }
    CHECK_OK(gp_dev_dropout_mask(dev, s, n, p, seed, stream + 1, first));
    CHECK(memcmp(s, m, (size_t)n * sizeof(float)) != 0);
    /* dropout_apply: x times the mask drawn on the fly, bitwise x * m, for
     * the whole and for sub-ranges at odd offsets, in place too; and the
     * wrapper's fallback without the slot (mask in a temporary) the same */
    float *x = dalloc(dev, n), *want = dalloc(dev, n), *got = dalloc(dev, n);
    for (int64_t i = 0; i < n; i++) x[i] = frand();
    CHECK_OK(gp_dev_mul(dev, x, m, want, n));
    const int64_t at[4] = {0, 5, 40006, n}; /* three pieces that tile [0, n) */
    const gp_device_iface *slots = dev->iface;
    gp_device_iface bare = *slots;
    bare.dropout_apply = NULL;
    size_t ws = dev->alloc.cur_by[GP_MEM_WORKSPACE];
    for (int k = 0; k < 3; k++) {
        dev->iface = k == 2 ? &bare : slots;
        memset(got, 0, (size_t)n * sizeof(float));
        for (int t = 0; t < 3; t++) {
            int64_t o = at[t], len = at[t + 1] - at[t];
            if (k == 1) { /* in place */
                memcpy(got + o, x + o, (size_t)len * sizeof(float));
                CHECK_OK(gp_dev_dropout_apply(dev, got + o, got + o, len, p, seed, stream,
                                              first + (uint64_t)o));
            } else {
                CHECK_OK(gp_dev_dropout_apply(dev, x + o, got + o, len, p, seed, stream,
                                              first + (uint64_t)o));
            }
        }
        CHECK_MSG(!memcmp(got, want, (size_t)n * sizeof(float)),
                  "dropout_apply (%s) != x * dropout_mask", k == 0 ? "slot" : k == 1 ? "in place"
                                                                               : "fallback");
    }
    dev->iface = slots;
    CHECK(dev->alloc.cur_by[GP_MEM_WORKSPACE] == ws); /* the fallback's temporary is freed */
    dfree(dev, x, n); dfree(dev, want, n); dfree(dev, got, n);
    dfree(dev, m, n); dfree(dev, s, n);
}

/* A copy into a CPU stage from a device of another backend with
 * copy_to_host (a GPU's, run on the CPU stage's worker): the wrapper hands
 * it the producer's event and counts one host wait on the source and none
 * on the receiver; a zero-byte copy with nothing to wait for calls nothing
 * and waits for nothing; a copy the other way, or from a backend without
 * the slot, does not call it.  The other backend is played
 * by a copy of the CPU's table with a recording copy_to_host. */
static int cth_calls;
static void *cth_after;
static gp_status fake_copy_to_host(gp_device *d, void *dst, const void *src, size_t bytes,
                                   void *after)
{
    (void)d;
    cth_calls++;
    cth_after = after;
    memcpy(dst, src, bytes);
    return GP_OK;
}

static void test_copy_to_host(gp_device *dev)
{
    enum { N = 777 };
    gp_device *src = NULL;
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:5", &o, &src));
    if (!src) return;
    const gp_device_iface *cpu = src->iface;
    gp_device_iface other = *cpu;
    other.copy_to_host = fake_copy_to_host;
    src->iface = &other;
    float *x = dalloc(src, N), *y = dalloc(dev, N);
    for (int i = 0; i < N; i++) x[i] = (float)i * 0.25f, y[i] = -1.0f;
    int token; /* stands for the producer's event; the fake never reads it */
    uint64_t ws = gp_dev_host_waits(src), wd = gp_dev_host_waits(dev);
    CHECK_OK(gp_dev_copy_async(dev, y, src, x, N * sizeof(float), &token, NULL));
    CHECK(cth_calls == 1 && cth_after == &token);
    CHECK(!memcmp(x, y, N * sizeof(float)));
    CHECK_MSG(gp_dev_host_waits(src) == ws + 1 && gp_dev_host_waits(dev) == wd,
              "one host wait, on the source: %llu and %llu",
              (unsigned long long)(gp_dev_host_waits(src) - ws),
              (unsigned long long)(gp_dev_host_waits(dev) - wd));
    ws = gp_dev_host_waits(src);
    CHECK_OK(gp_dev_copy_async(dev, y, src, x, 0, NULL, NULL));
    CHECK(cth_calls == 1 && gp_dev_host_waits(src) == ws && gp_dev_host_waits(dev) == wd);
    /* into the other backend's device: its own copy, not copy_to_host */
    for (int i = 0; i < N; i++) y[i] = (float)(N - i);
    CHECK_OK(gp_dev_copy_async(src, x, dev, y, N * sizeof(float), NULL, NULL));
    CHECK(cth_calls == 1 && !memcmp(x, y, N * sizeof(float)));
    /* a source backend without the slot: the staged copy */
    other.copy_to_host = NULL;
    for (int i = 0; i < N; i++) x[i] = (float)i - 3.0f;
    CHECK_OK(gp_dev_copy_async(dev, y, src, x, N * sizeof(float), NULL, NULL));
    CHECK(cth_calls == 1 && !memcmp(x, y, N * sizeof(float)));
    dfree(src, x, N);
    dfree(dev, y, N);
    src->iface = cpu;
    gp_device_close(src);
}

/* ---- the interface table: version check, optional slots ------------------------------------ */

/* A backend compiled against another backend.h is refused where devices are
 * admitted (gp_device_new, which both backends' constructors go through),
 * before any of its slots is read, with a message that names the backend,
 * both versions and the fix. */
static void test_iface_version(gp_device *dev)
{
    gp_device_iface other = *dev->iface;
    other.backend_name = "stale";
    for (int delta = -1; delta <= 1; delta += 2) {
        other.version = GP_DEVICE_IFACE_VERSION + delta;
        gp_device *d = NULL;
        CHECK_ERR(gp_device_new(&other, GP_DEV_CPU, 9, NULL, &d), GP_ERR_UNSUPPORTED, "cpu:9");
        const char *msg = gp_last_error();
        char theirs[32], ours[32];
        snprintf(theirs, sizeof theirs, "version %d", other.version);
        snprintf(ours, sizeof ours, "version %d", GP_DEVICE_IFACE_VERSION);
        CHECK_MSG(strstr(msg, "stale") && strstr(msg, theirs) && strstr(msg, ours) &&
                      strstr(msg, "rebuild"),
                  "the refusal names the backend, both versions and the fix: %s", msg);
        CHECK(d == NULL);
        gp_device_close(d);
    }
    /* The right version is admitted, with the common fields set. */
    other.version = GP_DEVICE_IFACE_VERSION;
    gp_device *d = NULL;
    gp_device_opts o = {.capacity = 4096};
    CHECK_OK(gp_device_new(&other, GP_DEV_CPU, 9, &o, &d));
    if (!d) return;
    CHECK(d->iface == &other && d->ctx == NULL && d->kind == GP_DEV_CPU && d->index == 9);
    CHECK(!strcmp(d->name, "cpu:9") && d->alloc.capacity == 4096);
    gp_device_close(d); /* the CPU backend's destroy takes ctx == NULL */
}

/* The wrappers of optional slots fall back as the slots' comments say. */
static void test_optional_slots(gp_device *dev)
{
    gp_device_iface bare = *dev->iface;
    bare.event_create = NULL;
    bare.event_destroy = NULL;
    bare.event_record = NULL;
    bare.event_wait = NULL;
    bare.event_sync = NULL;
    bare.pool_ws_bytes = NULL;
    gp_device fake = *dev;
    fake.iface = &bare;
    void *ev = &ev;
    CHECK_OK(gp_dev_event_create(&fake, &ev));
    CHECK(ev == NULL);
    CHECK_OK(gp_dev_event_record(&fake, ev));
    CHECK_OK(gp_dev_event_wait(&fake, ev));
    CHECK_OK(gp_dev_event_sync(&fake, ev));
    gp_dev_event_destroy(&fake, ev);
    /* without copy_async: a synchronous copy */
    bare.copy_async = NULL;
    float from[5] = {1, 2, 3, 4, 5}, into[5] = {0};
    CHECK_OK(gp_dev_copy_async(&fake, into, &fake, from, sizeof from, NULL, NULL));
    CHECK(memcmp(into, from, sizeof from) == 0);
    gp_pool_desc pd = {.n = 2, .c = 3, .h = 8, .w = 8, .kh = 2, .kw = 2, .sh = 2, .sw = 2,
                       .oh = 4, .ow = 4, .kind = GP_POOL_MAX};
    CHECK(gp_dev_pool_ws_bytes(&fake, &pd) == 0);
    /* The U-Net slots: without them the wrappers refuse, naming the device,
     * the backend, the op and the layer; nothing is called or written. */
    bare.leaky_relu_fwd = NULL;
    bare.leaky_relu_bwd = NULL;
    bare.mul_rows = NULL;
    bare.upsample_fwd = NULL;
    bare.upsample_bwd = NULL;
    bare.bce_logits = NULL;
    float v[4] = {0.25f, 0.5f, 0.75f, 1.0f}, o[4] = {0}, s = 2.0f;
    double loss = 1.0;
    int64_t correct = 1, bad = 1;
    CHECK_ERR(gp_dev_leaky_relu_fwd(&fake, v, o, 4, 0.01f), GP_ERR_UNSUPPORTED,
              "device cpu:0: the cpu backend has no leaky_relu_fwd, which leaky_relu needs");
    CHECK_ERR(gp_dev_leaky_relu_bwd(&fake, v, v, o, 4, 0.01f), GP_ERR_UNSUPPORTED,
              "leaky_relu_bwd");
    CHECK_ERR(gp_dev_mul_rows(&fake, v, &s, o, 1, 4), GP_ERR_UNSUPPORTED,
              "no mul_rows, which dropout2d needs");
    CHECK_ERR(gp_dev_upsample_fwd(&fake, v, o, 1, 1, 1, 1, 2), GP_ERR_UNSUPPORTED,
              "no upsample_fwd, which upsample needs");
    CHECK_ERR(gp_dev_upsample_bwd(&fake, v, o, 1, 1, 1, 1, 2), GP_ERR_UNSUPPORTED,
              "upsample_bwd");
    CHECK_ERR(gp_dev_bce_logits(&fake, v, v, 4, 1.0f, o, &loss, &correct, &bad),
              GP_ERR_UNSUPPORTED, "no bce_logits, which the binary cross-entropy loss needs");
    CHECK(loss == 0.0 && correct == 0 && bad == -1);
    CHECK(o[0] == 0.0f && o[3] == 0.0f);
}

/* The U-Net slots on the CPU: arithmetic against plain loops (the layers'
 * tests check them against double references and finite differences),
 * and the wrappers' argument checks. */
static void test_unet_ops(gp_device *dev)
{
    const int64_t n = 2, c = 3, h = 5, w = 4, sc = 2, nx = n * c * h * w, ny = nx * sc * sc;
    float *x = dalloc(dev, ny), *y = dalloc(dev, ny), *z = dalloc(dev, ny);
    float hx[480], hy[480], hz[480], f[6];
    for (int64_t i = 0; i < ny; i++) hx[i] = (float)((i * 37) % 23) / 7.0f - 1.5f;
    for (int k = 0; k < 6; k++) f[k] = (float)k - 2.0f;
    CHECK_OK(gp_dev_upload(dev, x, hx, ny));
    /* leaky relu forward and backward (from y) */
    CHECK_OK(gp_dev_leaky_relu_fwd(dev, x, y, ny, 0.125f));
    CHECK_OK(gp_dev_download(dev, hy, y, ny));
    int ok = 1;
    for (int64_t i = 0; i < ny; i++) ok &= hy[i] == (hx[i] > 0 ? hx[i] : 0.125f * hx[i]);
    CHECK_MSG(ok, "leaky_relu_fwd");
    CHECK_OK(gp_dev_leaky_relu_bwd(dev, y, x, z, ny, 0.125f)); /* dy = x */
    CHECK_OK(gp_dev_download(dev, hz, z, ny));
    ok = 1;
    for (int64_t i = 0; i < ny; i++) ok &= hz[i] == (hx[i] > 0 ? hx[i] : 0.125f * hx[i]);
    CHECK_MSG(ok, "leaky_relu_bwd");
    /* mul_rows: 6 rows of 80, in place */
    float *dfac = dalloc(dev, 6);
    CHECK_OK(gp_dev_upload(dev, dfac, f, 6));
    CHECK_OK(gp_dev_copy_d2d(dev, z, x, (size_t)ny * sizeof(float)));
    CHECK_OK(gp_dev_mul_rows(dev, z, dfac, z, 6, ny / 6));
    CHECK_OK(gp_dev_download(dev, hz, z, ny));
    ok = 1;
    for (int64_t i = 0; i < ny; i++) ok &= hz[i] == hx[i] * f[i / (ny / 6)];
    CHECK_MSG(ok, "mul_rows");
    /* upsample by 2 and its adjoint: <up(a), b> = <a, up^T(b)> */
    CHECK_OK(gp_dev_upsample_fwd(dev, x, y, n, c, h, w, sc));
    CHECK_OK(gp_dev_download(dev, hy, y, ny));
    ok = 1;
    for (int64_t p = 0; p < n * c; p++)
        for (int64_t i = 0; i < h * sc; i++)
            for (int64_t j = 0; j < w * sc; j++)
                ok &= hy[(p * h * sc + i) * w * sc + j] == hx[(p * h + i / sc) * w + j / sc];
    CHECK_MSG(ok, "upsample_fwd");
    CHECK_OK(gp_dev_upsample_bwd(dev, x, z, n, c, h, w, sc)); /* dy = x (ny values) */
    CHECK_OK(gp_dev_download(dev, hz, z, nx));
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < ny; i++) lhs += (double)hy[i] * hx[i];
    for (int64_t i = 0; i < nx; i++) rhs += (double)hx[i] * hz[i];
    CHECK_NEAR(lhs, rhs, 1e-4, 1e-6);
    /* scale 3: every input element gets the sum of its 9 */
    CHECK_OK(gp_dev_upsample_bwd(dev, x, z, 1, 1, 4, 5, 3)); /* dy (12, 15) */
    CHECK_OK(gp_dev_download(dev, hz, z, 20));
    ok = 1;
    for (int64_t i = 0; i < 4; i++)
        for (int64_t j = 0; j < 5; j++) {
            float acc = 0.0f;
            for (int64_t a = 0; a < 3; a++) {
                float row = 0.0f;
                for (int64_t b = 0; b < 3; b++) row += hx[(i * 3 + a) * 15 + j * 3 + b];
                acc += row;
            }
            ok &= hz[i * 5 + j] == acc;
        }
    CHECK_MSG(ok, "upsample_bwd by 3 (rows summed left to right, then top to bottom)");
    /* scale 1 copies; empty tensors do nothing; bad sizes are refused */
    CHECK_OK(gp_dev_upsample_fwd(dev, x, y, n, c, h, w, 1));
    CHECK_OK(gp_dev_download(dev, hy, y, nx));
    CHECK(!memcmp(hy, hx, (size_t)nx * sizeof *hx));
    CHECK_OK(gp_dev_upsample_fwd(dev, NULL, NULL, 0, c, h, w, 2));
    CHECK_OK(gp_dev_upsample_bwd(dev, NULL, NULL, n, c, 0, w, 2));
    CHECK_ERR(gp_dev_upsample_fwd(dev, x, y, n, c, h, w, 0), GP_ERR_INVALID,
              "device cpu:0: invalid upsampling of (2, 3, 5, 4) by 0");
    CHECK_ERR(gp_dev_upsample_bwd(dev, x, y, n, -1, h, w, 2), GP_ERR_INVALID,
              "invalid upsampling");
    /* bce: n = 0 reports nothing; a bad target stops before any output */
    double loss = 1.0;
    int64_t correct = 1, bad = 1;
    CHECK_OK(gp_dev_bce_logits(dev, x, x, 0, 1.0f, z, &loss, &correct, &bad));
    CHECK(loss == 0.0 && correct == 0 && bad == -1);
    CHECK_OK(gp_dev_bce_logits(dev, x, x, 8, 1.0f, z, &loss, &correct, &bad));
    CHECK(bad == 0); /* hx[0] = -1.5 is no probability */
    dfree(dev, dfac, 6);
    dfree(dev, x, ny); dfree(dev, y, ny); dfree(dev, z, ny);
}

/* ---- memory, copies, devices ---------------------------------------------------------------- */

static void test_memory(void)
{
    gp_device *dev = NULL;
    gp_device_opts o = {.threads = 1, .capacity = 1 << 20};
    CHECK_OK(gp_device_open("cpu:3", &o, &dev));
    if (!dev) return;
    CHECK(!strcmp(dev->name, "cpu:3"));
    CHECK(dev->threads == 1);
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(gp_dev_alloc(dev, 600000, GP_MEM_PARAMS, &a));
    CHECK(((uintptr_t)a & 63) == gp_cpu_ctx_of(dev)->block_shift); /* (test_block_starts) */
    CHECK_OK(gp_dev_alloc(dev, 300000, GP_MEM_GRADS, &b));
    CHECK(dev->alloc.current == 900000 && dev->alloc.peak == 900000);
    CHECK_ERR(gp_dev_alloc(dev, 200000, GP_MEM_ACTIVATIONS, &c), GP_ERR_OOM, "cpu:3");
    const char *msg = gp_last_error();
    CHECK_MSG(strstr(msg, "195.3 KiB") && strstr(msg, "1.0 MiB"),
              "OOM message names request and capacity: %s", msg);
    CHECK(c == NULL);
    CHECK(dev->alloc.current == 900000);
    gp_dev_free(dev, b, 300000, GP_MEM_GRADS);
    CHECK(dev->alloc.current == 600000 && dev->alloc.peak == 900000);
    CHECK(dev->alloc.cur_by[GP_MEM_GRADS] == 0 && dev->alloc.peak_by[GP_MEM_GRADS] == 300000);
    CHECK_OK(gp_dev_alloc(dev, 200000, GP_MEM_ACTIVATIONS, &c));
    CHECK(dev->alloc.current == 800000 && dev->alloc.peak == 900000);
    gp_allocator_reset_peak(&dev->alloc);
    CHECK(dev->alloc.peak == 800000);
    gp_dev_free(dev, a, 600000, GP_MEM_PARAMS);
    gp_dev_free(dev, c, 200000, GP_MEM_ACTIVATIONS);
    CHECK(dev->alloc.current == 0 && dev->alloc.live_blocks == 0);

    /* Backend workspace is accounted: a conv whose reorder temporaries do not
     * fit fails with OOM naming the device, not a crash. */
    gp_conv_desc d = {8, 32, 16, 16, 32, 3, 3, 1, 1, 1, 1, 16, 16, 0, 0, 0};
    int64_t nx = 8 * 32 * 16 * 16;
    float *x = NULL, *w = NULL, *y = NULL;
    CHECK_OK(gp_dev_alloc(dev, (size_t)nx * 4, GP_MEM_ACTIVATIONS, (void **)&x));
    CHECK_OK(gp_dev_alloc(dev, 32 * 32 * 9 * 4, GP_MEM_PARAMS, (void **)&w));
    CHECK_OK(gp_dev_alloc(dev, (size_t)nx * 4, GP_MEM_ACTIVATIONS, (void **)&y));
    memset(x, 0, (size_t)nx * 4);
    memset(w, 0, 32 * 32 * 9 * 4);
    gp_status s = gp_dev_conv_fwd(dev, &d, x, w, NULL, y);
    if (dev->alloc.cur_by[GP_MEM_WORKSPACE] == 0) {
        CHECK_MSG(s == GP_ERR_OOM && strstr(gp_last_error(), "cpu:3"),
                  "conv without room for its workspace: %s", gp_last_error());
    } else {
        /* The layout policy needed no temporaries: then it must have worked. */
        CHECK_OK(s);
    }
    gp_dev_free(dev, x, (size_t)nx * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(dev, w, 32 * 32 * 9 * 4, GP_MEM_PARAMS);
    gp_dev_free(dev, y, (size_t)nx * 4, GP_MEM_ACTIVATIONS);
    gp_device_close(dev);

    /* Workspace shows up in the accounting of an unlimited device. */
    gp_device_opts o2 = {.threads = 2};
    CHECK_OK(gp_device_open("cpu:4", &o2, &dev));
    CHECK_OK(gp_dev_alloc(dev, (size_t)nx * 4, GP_MEM_ACTIVATIONS, (void **)&x));
    CHECK_OK(gp_dev_alloc(dev, 32 * 32 * 9 * 4, GP_MEM_PARAMS, (void **)&w));
    CHECK_OK(gp_dev_alloc(dev, (size_t)nx * 4, GP_MEM_ACTIVATIONS, (void **)&y));
    memset(x, 0, (size_t)nx * 4);
    memset(w, 0, 32 * 32 * 9 * 4);
    CHECK_OK(gp_dev_conv_fwd(dev, &d, x, w, NULL, y));
    CHECK_MSG(dev->alloc.cur_by[GP_MEM_WORKSPACE] > 0 &&
              dev->alloc.peak >= (size_t)nx * 8 + dev->alloc.cur_by[GP_MEM_WORKSPACE],
              "workspace %zu, peak %zu", dev->alloc.cur_by[GP_MEM_WORKSPACE], dev->alloc.peak);
    gp_dev_free(dev, x, (size_t)nx * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(dev, w, 32 * 32 * 9 * 4, GP_MEM_PARAMS);
    gp_dev_free(dev, y, (size_t)nx * 4, GP_MEM_ACTIVATIONS);
    gp_device_close(dev);

    CHECK_ERR(gp_device_open("cpu:x", NULL, &dev), GP_ERR_INVALID, "cpu:x");
    gp_device_opts bad = {.threads = -2};
    CHECK_ERR(gp_device_open("cpu:0", &bad, &dev), GP_ERR_INVALID, "threads");
}

static void test_copies(gp_device *d0, gp_device *d1)
{
    gp_tensor a, b;
    gp_shape s = gp_shape_2d(13, 17);
    CHECK_OK(gp_tensor_alloc(&a, d0, &s, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_alloc(&b, d1, &s, GP_MEM_COPIES));
    float host[13 * 17], back[13 * 17];
    for (int i = 0; i < 13 * 17; i++) host[i] = frand();
    CHECK_OK(gp_dev_upload(d0, gp_f32(&a), host, 13 * 17));
    CHECK_OK(gp_tensor_copy(&b, &a));
    CHECK_OK(gp_dev_download(d1, back, gp_f32(&b), 13 * 17));
    CHECK(memcmp(host, back, sizeof host) == 0);
    CHECK(d1->alloc.cur_by[GP_MEM_COPIES] == sizeof host);
    CHECK_OK(gp_dev_synchronize(d1));
    gp_tensor_free(&a);
    gp_tensor_free(&b);
    CHECK(d1->alloc.cur_by[GP_MEM_COPIES] == 0);
}

/* Host waits (gp_device.host_waits): each call that returns only after the
 * device finished counts one, on every backend; the calls that only
 * enqueue count none. */
static void test_host_waits(gp_device *dev)
{
    float h[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8];
    float labels[2] = {0, 1};
    void *p = NULL;
    CHECK_OK(gp_dev_alloc(dev, sizeof h, GP_MEM_WORKSPACE, &p));
    if (!p) return;
    float *d = p;
    void *ev = NULL;
    CHECK_OK(gp_dev_event_create(dev, &ev));
    double ss = 0;
    int bad = 0;
    int64_t correct = 0, bad_row = 0;
    double loss = 0;
    uint64_t w0 = gp_dev_host_waits(dev);
    /* enqueue only */
    CHECK_OK(gp_dev_fill(dev, d, 0.5f, 8));
    CHECK_OK(gp_dev_scale(dev, d, 2.0f, 8));
    CHECK_OK(gp_dev_event_record(dev, ev));
    CHECK_OK(gp_dev_event_wait(dev, ev));
    CHECK_OK(gp_dev_copy_async(dev, d + 4, dev, d, 4 * sizeof(float), ev, NULL));
    CHECK_MSG(gp_dev_host_waits(dev) == w0, "calls that only enqueue counted %llu host waits",
              (unsigned long long)(gp_dev_host_waits(dev) - w0));
    /* one each */
    typedef struct {
        const char *what;
        gp_status st;
    } wait_call;
    wait_call calls[8];
    int n = 0;
    uint64_t before = gp_dev_host_waits(dev);
    calls[n++] = (wait_call){"upload", gp_dev_upload(dev, d, h, 8)};
    calls[n++] = (wait_call){"download", gp_dev_download(dev, back, d, 8)};
    calls[n++] = (wait_call){"synchronize", gp_dev_synchronize(dev)};
    calls[n++] = (wait_call){"event_sync", gp_dev_event_sync(dev, ev)};
    calls[n++] = (wait_call){"sumsq", gp_dev_sumsq(dev, d, 8, &ss)};
    calls[n++] = (wait_call){"nonfinite", gp_dev_nonfinite(dev, d, 8, &bad)};
    /* three tensors' sums of squares, one wait for all */
    const float *xs3[3] = {d, d + 2, d + 5};
    int64_t ns3[3] = {2, 3, 0};
    double ss3[3] = {-1, -1, -1};
    calls[n++] = (wait_call){"sumsq_multi", gp_dev_sumsq_multi(dev, xs3, ns3, 3, ss3)};
    calls[n++] = (wait_call){"xent", gp_dev_xent(dev, d, labels, 2, 4, 1.0f, 0.0f, NULL, &loss,
                                                        &correct, &bad_row)};
    for (int k = 0; k < n; k++) CHECK_MSG(calls[k].st == GP_OK, "%s failed", calls[k].what);
    CHECK_MSG(gp_dev_host_waits(dev) - before == (uint64_t)n,
              "%d waiting calls counted %llu host waits", n,
              (unsigned long long)(gp_dev_host_waits(dev) - before));
    CHECK(ss == 204.0 && bad == 0 && memcmp(back, h, sizeof h) == 0);
    CHECK_MSG(ss3[0] == 5.0 && ss3[1] == 50.0 && ss3[2] == 0.0, "sumsq_multi: %g %g %g",
              ss3[0], ss3[1], ss3[2]);
    gp_dev_event_destroy(dev, ev);
    gp_dev_free(dev, p, sizeof h, GP_MEM_WORKSPACE);
}

/* nonfinite_or: the flag gathers any number of tensors and is never
 * cleared by a finite one; without the slot the wrapper does the same. */
static void test_nonfinite_or(gp_device *dev)
{
    gp_device_iface bare = *dev->iface;
    bare.nonfinite_or = NULL;
    gp_device fake = *dev;
    fake.iface = &bare;
    gp_device *both[2] = {dev, &fake};
    for (int k = 0; k < 2; k++) {
        float ok[1000], nan_at[7] = {1, 2, 3, 4, 5, 6, 7}, flag = -1.0f;
        for (int i = 0; i < 1000; i++) ok[i] = (float)i - 500.0f;
        CHECK_OK(gp_dev_fill(both[k], &flag, 0.0f, 1));
        CHECK_OK(gp_dev_nonfinite_or(both[k], ok, 1000, &flag));
        CHECK(flag == 0.0f);
        nan_at[6] = NAN;
        CHECK_OK(gp_dev_nonfinite_or(both[k], nan_at, 7, &flag));
        CHECK_OK(gp_dev_nonfinite_or(both[k], ok, 1000, &flag));
        CHECK_MSG(flag == 1.0f, "%s: NaN then finite left the flag at %g",
                  k ? "fallback" : "slot", (double)flag);
        CHECK_OK(gp_dev_fill(both[k], &flag, 0.0f, 1));
        ok[999] = -INFINITY;
        CHECK_OK(gp_dev_nonfinite_or(both[k], ok, 1000, &flag));
        CHECK(flag == 1.0f);
    }
}

/* Every (dst, src) offset pair of a box, in the copy's order, into out
 * (room for n); returns how many. */
static int64_t box_pairs(const int64_t ds[4], const int64_t ss[4], const int64_t d[4],
                         int64_t (*out)[2], int64_t room)
{
    int64_t k = 0;
    for (int64_t a = 0; a < d[0]; a++)
        for (int64_t b = 0; b < d[1]; b++)
            for (int64_t c = 0; c < d[2]; c++)
                for (int64_t e = 0; e < d[3]; e++) {
                    if (k < room) {
                        out[k][0] = a * ds[0] + b * ds[1] + c * ds[2] + e * ds[3];
                        out[k][1] = a * ss[0] + b * ss[1] + c * ss[2] + e * ss[3];
                    }
                    k++;
                }
    return k;
}

/* gp_box_collapse: the collapsed box visits the very same (dst, src)
 * pairs in the same order as the box it came from, for concatenation
 * slices, padding, size-1 axes and strides that merge on one side only;
 * the axes it leaves are the fewest (a concat slice: 2, a whole tensor: 1,
 * a padded copy: 3); and gp_dev_copy_box, which copies the collapsed box,
 * writes what a loop over the original writes and nothing else. */
static void test_box_collapse(gp_device *dev)
{
    enum { ROOM = 4096 };
    static int64_t want[ROOM][2], got[ROOM][2];
    struct {
        int64_t ds[4], ss[4], d[4];
        int axes;
    } cases[] = {
        /* concat: src (3, 4, 5, 6) into channels 2..5 of dst (3, 10, 5, 6) */
        {{600, 30, 6, 1}, {120, 30, 6, 1}, {3, 4, 5, 6}, 2},
        /* a whole tensor */
        {{120, 30, 6, 1}, {120, 30, 6, 1}, {3, 4, 5, 6}, 1},
        /* zero padding at the right and bottom: (3, 4, 5, 6) into (3, 4, 6, 7) */
        {{168, 42, 7, 1}, {120, 30, 6, 1}, {3, 4, 5, 6}, 3},
        /* size-1 axes around a contiguous row */
        {{0, 0, 9, 1}, {0, 0, 9, 1}, {1, 1, 1, 9}, 1},
        /* 2-D features: (4, 7) into columns 3..9 of (4, 12) */
        {{0, 0, 12, 1}, {0, 0, 7, 1}, {1, 1, 4, 7}, 2},
        /* contiguous on the source only: no merge */
        {{7, 1, 0, 0}, {1, 4, 0, 0}, {4, 7, 1, 1}, 2},
        /* a transposed inner pair on one side */
        {{60, 1, 10, 0}, {60, 6, 1, 0}, {2, 10, 6, 1}, 3},
        /* one element */
        {{5, 3, 2, 1}, {9, 4, 3, 1}, {1, 1, 1, 1}, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t ds[4], ss[4], d[4];
        int axes = gp_box_collapse(cases[c].ds, cases[c].ss, cases[c].d, ds, ss, d);
        int64_t nw = box_pairs(cases[c].ds, cases[c].ss, cases[c].d, want, ROOM);
        int64_t ng = box_pairs(ds, ss, d, got, ROOM);
        CHECK_MSG(nw == ng && nw <= ROOM && !memcmp(want, got, (size_t)nw * sizeof want[0]),
                  "box %zu: the collapsed box visits other pairs (%lld, %lld values)", c,
                  (long long)nw, (long long)ng);
        CHECK_MSG(axes == cases[c].axes, "box %zu collapsed to %d axes, want %d", c, axes,
                  cases[c].axes);
        /* the copy itself on this device */
        int64_t dmax = 0, smax = 0;
        for (int64_t k = 0; k < nw; k++) {
            if (want[k][0] > dmax) dmax = want[k][0];
            if (want[k][1] > smax) smax = want[k][1];
        }
        float *src = malloc((size_t)(smax + 1) * sizeof *src);
        float *dst = malloc((size_t)(dmax + 2) * sizeof *dst);
        float *ref = malloc((size_t)(dmax + 2) * sizeof *ref);
        for (int64_t k = 0; k <= smax; k++) src[k] = (float)k + 0.5f;
        for (int64_t k = 0; k <= dmax + 1; k++) dst[k] = ref[k] = -1.0f;
        for (int64_t k = 0; k < nw; k++) ref[want[k][0]] = src[want[k][1]];
        CHECK_OK(gp_dev_copy_box(dev, dst, cases[c].ds, src, cases[c].ss, cases[c].d));
        CHECK_MSG(!memcmp(dst, ref, (size_t)(dmax + 2) * sizeof *dst),
                  "box %zu: copy_box wrote other values", c);
        free(src), free(dst), free(ref);
    }
    int64_t ds[4], ss[4], d[4];
    CHECK(gp_box_collapse(cases[0].ds, cases[0].ss, (int64_t[4]){3, 0, 5, 6}, ds, ss, d) == 0);
}

/* nonfinite_or_many: one flag over many tensors, batched by
 * GP_NONFINITE_BATCH in the wrapper, with empty tensors among them: for a
 * NaN or an infinity in each position of 150 tensors (across three
 * batches) the flag is set, for none it stays 0; on the slot, on the
 * wrapper's fallback (slot NULL) and on the counting shim, which checks
 * that the wrapper hands the slot full batches of non-empty tensors. */
static int many_calls, many_tensors;
static gp_status (*many_real)(gp_device *, const float *const *, const int64_t *, int, float *);
static gp_status count_many(gp_device *dev, const float *const *xs, const int64_t *ns, int count,
                            float *flag)
{
    many_calls++;
    many_tensors += count;
    for (int i = 0; i < count; i++) CHECK(ns[i] > 0);
    CHECK(count >= 1 && count <= GP_NONFINITE_BATCH);
    return many_real(dev, xs, ns, count, flag);
}

static void test_nonfinite_or_many(gp_device *dev)
{
    enum { T = 150, N = 37 };
    gp_device_iface bare = *dev->iface, counted = *dev->iface;
    bare.nonfinite_or_many = NULL;
    many_real = dev->iface->nonfinite_or_many;
    CHECK(many_real != NULL);
    counted.nonfinite_or_many = count_many;
    gp_device fake = *dev, shim = *dev;
    fake.iface = &bare;
    shim.iface = &counted;
    gp_device *all[3] = {dev, &fake, &shim};
    static float vals[T][N];
    const float *xs[T];
    int64_t ns[T];
    int nonempty = 0;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < N; i++) vals[t][i] = (float)(t - i);
        xs[t] = vals[t];
        ns[t] = t % 7 == 3 ? 0 : N - t % 5; /* some empty, lengths vary */
        nonempty += ns[t] > 0;
    }
    for (int k = 0; k < 3; k++) {
        float flag = -1.0f;
        CHECK_OK(gp_dev_fill(all[k], &flag, 0.0f, 1));
        many_calls = many_tensors = 0;
        CHECK_OK(gp_dev_nonfinite_or_many(all[k], xs, ns, T, &flag));
        CHECK_MSG(flag == 0.0f, "device %d: finite tensors set the flag", k);
        if (k == 2)
            CHECK_MSG(many_tensors == nonempty &&
                          many_calls == (nonempty + GP_NONFINITE_BATCH - 1) / GP_NONFINITE_BATCH,
                      "%d tensors in %d calls, want %d in full batches", many_tensors, many_calls,
                      nonempty);
        int missed = 0;
        for (int t = 0; t < T; t++) {
            if (ns[t] == 0) continue;
            int64_t at = (t * 11) % ns[t];
            float keep = vals[t][at];
            vals[t][at] = t % 2 ? NAN : -INFINITY;
            CHECK_OK(gp_dev_fill(all[k], &flag, 0.0f, 1));
            CHECK_OK(gp_dev_nonfinite_or_many(all[k], xs, ns, T, &flag));
            missed += flag != 1.0f;
            vals[t][at] = keep;
        }
        CHECK_MSG(missed == 0, "device %d: %d of the nonfinite values were missed", k, missed);
        /* a value past a tensor's length is not its */
        vals[0][N - 1] = NAN;
        ns[0] = N - 1;
        CHECK_OK(gp_dev_fill(all[k], &flag, 0.0f, 1));
        CHECK_OK(gp_dev_nonfinite_or_many(all[k], xs, ns, T, &flag));
        CHECK(flag == 0.0f);
        vals[0][N - 1] = (float)(1 - N);
        ns[0] = N;
    }
}

/* A commit part's pending slots (gp_dev_bn_commit_part): 3 micro-batches
 * of 8, 8 and 5 values kept as slots over an accumulator that holds 4
 * already, merged and committed in one call, give bitwise the running
 * statistics and accumulator of three bn_merge calls and a bn_commit; on
 * the backend's bn_commit_multi, on it with bn_merge and bn_commit gone,
 * and with none of the three (the host's fallback); held between begin
 * and end with a second norm, still one call.  Counts that do not add up
 * are refused. */
/* A norm of c channels whose accumulator holds 4 values of `first` (its
 * means, then its variances) and whose running statistics are set. */
static void bn_norm_init(gp_device *d, int64_t c, double *acc, float *rm, float *rv,
                         const float *first)
{
    CHECK_OK(gp_dev_fill(d, (float *)acc, 0.0f, 4 * c));
    for (int64_t k = 0; k < c; k++) rm[k] = 0.25f * (float)k, rv[k] = 1.5f;
    CHECK_OK(gp_dev_bn_merge(d, c, acc, acc + c, 0, 4, first, first + c));
}

/* The oracle of a commit with pending slots: the p slots at pend (2c floats
 * each, nb[i] values) merged one call at a time, then committed. */
static void bn_merges_commit(gp_device *d, int64_t c, double *acc, float *rm, float *rv,
                             const float *pend, const double *nb, int p)
{
    double na = 4;
    for (int q = 0; q < p; q++) {
        const float *slot = pend + 2 * c * q;
        CHECK_OK(gp_dev_bn_merge(d, c, acc, acc + c, na, nb[q], slot, slot + c));
        na += nb[q];
    }
    CHECK_OK(gp_dev_bn_commit(d, c, rm, rv, acc, acc + c, 0.3, na));
}

static void test_bn_commit_pending(gp_device *dev)
{
    enum { C = 4, P = 3 };
    gp_device_iface no_single = *dev->iface, bare = *dev->iface;
    no_single.bn_merge = NULL;
    no_single.bn_commit = NULL;
    bare.bn_merge = NULL;
    bare.bn_commit = NULL;
    bare.bn_commit_multi = NULL;
    gp_device fake1 = *dev, fake2 = *dev;
    fake1.iface = &no_single;
    fake2.iface = &bare;
    /* the copies hold commits in arrays of their own (freed below) */
    fake1.bn_held = fake2.bn_held = NULL;
    fake1.n_bn_held = fake2.n_bn_held = fake1.cap_bn_held = fake2.cap_bn_held = 0;
    gp_device *ds[3] = {dev, &fake1, &fake2};
    const double nb[P] = {8, 8, 5};
    float pend[P][2 * C], first[2 * C];
    for (int q = 0; q < P; q++)
        for (int c = 0; c < C; c++) {
            pend[q][c] = (float)(c + 0.5 * q) + 0.1f * frand();
            pend[q][C + c] = 0.5f + 0.25f * fabsf(frand()) + (float)q;
        }
    for (int c = 0; c < C; c++) first[c] = 2.0f * frand(), first[C + c] = 1.0f;
    for (int k = 0; k < 3; k++) {
        gp_device *d = ds[k];
        /* two norms: [0] merged one call at a time, [1] as a part */
        double acc[2][2 * C];
        float rm[2][C], rv[2][C];
        for (int n = 0; n < 2; n++) bn_norm_init(d, C, acc[n], rm[n], rv[n], first);
        bn_merges_commit(d, C, acc[0], rm[0], rv[0], &pend[0][0], nb, P);
        double na = 4 + nb[0] + nb[1] + nb[2];
        gp_bn_commit_part p = {.c = C, .rmean = rm[1], .rvar = rv[1], .mean_acc = acc[1],
                               .m2_acc = acc[1] + C, .momentum = 0.3, .count = na,
                               .pend = &pend[0][0], .n_pend = P, .n_hi = 2, .na = 4,
                               .nb_hi = 8, .nb_lo = 5};
        gp_bn_commit_part bad = p;
        bad.count += 1;
        CHECK_ERR(gp_dev_bn_commit_part(d, &bad), GP_ERR_INVALID, "do not add up");
        uint64_t calls = d->bn_commit_calls;
        CHECK_OK(gp_dev_bn_commit_part(d, &p));
        CHECK(d->bn_commit_calls - calls == 1);
        CHECK_MSG(!memcmp(rm[0], rm[1], sizeof rm[0]) && !memcmp(rv[0], rv[1], sizeof rv[0]) &&
                      !memcmp(acc[0], acc[1], sizeof acc[0]),
                  "device %d: a part's pending slots commit other bits than merges", k);
        /* held with another norm (the accumulators zero again): one call */
        float rm2[2][C], rv2[2][C];
        memcpy(rm2, rm, sizeof rm2);
        memcpy(rv2, rv, sizeof rv2);
        gp_bn_commit_part q2 = p;
        q2.rmean = rm2[1];
        q2.rvar = rv2[1];
        q2.mean_acc = acc[0];
        q2.m2_acc = acc[0] + C;
        CHECK_OK(gp_dev_bn_commit_begin(d));
        CHECK_OK(gp_dev_bn_commit_part(d, &p));
        CHECK_OK(gp_dev_bn_commit_part(d, &q2));
        calls = d->bn_commit_calls;
        CHECK_OK(gp_dev_bn_commit_end(d));
        CHECK_MSG(d->bn_commit_calls - calls == (k < 2 ? 1u : 2u), "device %d: %llu calls", k,
                  (unsigned long long)(d->bn_commit_calls - calls));
        CHECK(!memcmp(rm[1], rm2[1], sizeof rm[1]) && !memcmp(rv[1], rv2[1], sizeof rv[1]));
        /* a layer's commit (gp_dev_bn_commit_slots) from per-slot counts:
         * two runs (8 8 5) in one part, and counts that are not (5 8 5)
         * merged slot by slot first; the bits of the merges either way */
        static const double counts[2][P] = {{8, 8, 5}, {5, 8, 5}};
        for (int w = 0; w < 2; w++) {
            double a3[2][2 * C];
            float m3[2][C], v3[2][C];
            for (int n = 0; n < 2; n++) bn_norm_init(d, C, a3[n], m3[n], v3[n], first);
            bn_merges_commit(d, C, a3[0], m3[0], v3[0], &pend[0][0], counts[w], P);
            gp_bn_commit_part sp = {.c = C, .rmean = m3[1], .rvar = v3[1], .mean_acc = a3[1],
                                    .m2_acc = a3[1] + C, .momentum = 0.3, .pend = &pend[0][0],
                                    .n_pend = P, .na = 4};
            calls = d->bn_commit_calls;
            CHECK_OK(gp_dev_bn_commit_slots(d, sp, counts[w]));
            CHECK(d->bn_commit_calls - calls == 1);
            CHECK_MSG(!memcmp(m3[0], m3[1], sizeof m3[0]) && !memcmp(v3[0], v3[1], sizeof v3[0]) &&
                          !memcmp(a3[0], a3[1], sizeof a3[0]),
                      "device %d, counts %s: gp_dev_bn_commit_slots commits other bits than "
                      "merges", k, w ? "5 8 5" : "8 8 5");
        }
    }
    free(fake1.bn_held);
    free(fake2.bn_held);
}

/* The slots of a step without host waits (iface 13), each against an
 * oracle, with its host waits counted, on the backend's slot and on the
 * wrapper's fallback (the slot NULL):
 *   - bn_merge over 3 micro-batches of raw data equals the two-pass
 *     statistics of all of it, in double; bn_commit gives PyTorch's
 *     running statistics from them and zeroes the accumulator;
 *   - xent_dev / bce_logits_dev write bitwise what xent / bce_logits
 *     return, bad labels and targets included;
 *   - upload_async lands its data by the time its event is waited for.
 * The slots enqueue only (no host wait); the fallbacks wait. */
static void test_step_slots(gp_device *dev)
{
    gp_device_iface bare = *dev->iface;
    bare.upload_async = NULL;
    bare.bn_merge = NULL;
    bare.bn_commit = NULL;
    bare.xent_dev = NULL;
    bare.bce_logits_dev = NULL;
    gp_device fake = *dev;
    fake.iface = &bare;
    gp_device *both[2] = {dev, &fake};
    enum { C = 5, MB = 3, PER = 7 }; /* channels, micro-batches, values per channel in each */
    const int per[MB] = {PER, 2 * PER, 3};
    for (int k = 0; k < 2; k++) {
        gp_device *d = both[k];
        const char *how = k ? "fallback" : "slot";
        /* raw data per micro-batch and channel, its float statistics */
        double x[MB][C][3 * PER], sum[C] = {0}, total = 0;
        float mean[MB][C], var[MB][C];
        for (int b = 0; b < MB; b++)
            for (int c = 0; c < C; c++) {
                double m = 0, v = 0;
                for (int e = 0; e < per[b]; e++) {
                    x[b][c][e] = 3.0 * c + frand() + (b == 1 ? 0.75 : 0.0);
                    m += x[b][c][e];
                    sum[c] += x[b][c][e];
                }
                m /= per[b];
                for (int e = 0; e < per[b]; e++) v += (x[b][c][e] - m) * (x[b][c][e] - m);
                mean[b][c] = (float)m;
                var[b][c] = (float)(v / per[b]);
            }
        for (int b = 0; b < MB; b++) total += per[b];
        double ref_mean[C], ref_m2[C];
        for (int c = 0; c < C; c++) {
            ref_mean[c] = sum[c] / total;
            ref_m2[c] = 0;
            for (int b = 0; b < MB; b++)
                for (int e = 0; e < per[b]; e++)
                    ref_m2[c] += (x[b][c][e] - ref_mean[c]) * (x[b][c][e] - ref_mean[c]);
        }
        double acc[2 * C];
        float rmean[C], rvar[C], mom = 0.25f;
        for (int c = 0; c < C; c++) acc[c] = acc[C + c] = -7.0, rmean[c] = 0.5f, rvar[c] = 2.0f;
        CHECK_OK(gp_dev_fill(d, (float *)acc, 0.0f, 4 * C));
        uint64_t w0 = gp_dev_host_waits(d);
        double na = 0;
        for (int b = 0; b < MB; b++) {
            CHECK_OK(gp_dev_bn_merge(d, C, acc, acc + C, na, per[b], mean[b], var[b]));
            na += per[b];
        }
        uint64_t merge_waits = gp_dev_host_waits(d) - w0;
        CHECK_MSG(k ? merge_waits > 0 : merge_waits == 0, "%s: bn_merge counted %llu host waits",
                  how, (unsigned long long)merge_waits);
        for (int c = 0; c < C; c++) {
            /* the only roundings: each micro-batch's mean and var to float */
            CHECK_MSG(fabs(acc[c] - ref_mean[c]) <= 1e-6 * (1 + fabs(ref_mean[c])) &&
                          fabs(acc[C + c] - ref_m2[c]) <= 1e-5 * (1 + ref_m2[c]),
                      "%s: channel %d: merged (%.9g, %.9g), two-pass (%.9g, %.9g)", how, c,
                      acc[c], acc[C + c], ref_mean[c], ref_m2[c]);
        }
        w0 = gp_dev_host_waits(d);
        CHECK_OK(gp_dev_bn_commit(d, C, rmean, rvar, acc, acc + C, mom, na));
        CHECK_MSG(k ? gp_dev_host_waits(d) > w0 : gp_dev_host_waits(d) == w0,
                  "%s: bn_commit counted %llu host waits", how,
                  (unsigned long long)(gp_dev_host_waits(d) - w0));
        for (int c = 0; c < C; c++) {
            double em = 0.75 * 0.5 + 0.25 * ref_mean[c], ev = 0.75 * 2.0 + 0.25 * ref_m2[c] / (na - 1);
            CHECK_MSG(fabs(rmean[c] - em) <= 1e-6 * (1 + fabs(em)) &&
                          fabs(rvar[c] - ev) <= 1e-6 * (1 + ev) && acc[c] == 0.0 && acc[C + c] == 0.0,
                      "%s: channel %d: running (%g, %g), expected (%g, %g), accumulator (%g, %g)",
                      how, c, (double)rmean[c], (double)rvar[c], em, ev, acc[c], acc[C + c]);
        }
        CHECK(gp_dev_bn_commit(d, C, rmean, rvar, acc, acc + C, mom, 1) == GP_ERR_INVALID);

        /* the losses: results on the device equal the host's, bitwise */
        enum { R = 6, K = 4 };
        float logits[R * K], labels[R], dl_host[R * K], dl_dev[R * K];
        for (int i = 0; i < R * K; i++) logits[i] = 2 * frand();
        for (int r = 0; r < R; r++) labels[r] = (float)(r % K);
        for (int bad = 0; bad < 2; bad++) {
            if (bad) labels[4] = (float)K; /* out of range */
            double loss = -1;
            int64_t correct = -1, bad_row = -2;
            gp_loss_result res = {-1, -1, -2};
            memset(dl_dev, 0, sizeof dl_dev);
            CHECK_OK(gp_dev_xent(d, logits, labels, R, K, 0.5f, 0.0f, dl_host, &loss, &correct,
                                 &bad_row));
            w0 = gp_dev_host_waits(d);
            CHECK_OK(gp_dev_xent_dev(d, logits, labels, R, K, 0.5f, 0.0f, dl_dev, &res));
            CHECK(k ? gp_dev_host_waits(d) > w0 : gp_dev_host_waits(d) == w0);
            CHECK_MSG(res.bad == bad_row && res.bad == (bad ? 4 : -1) &&
                          res.loss_sum == (bad ? 0.0 : loss) && res.correct == (bad ? 0 : correct) &&
                          (bad || memcmp(dl_dev, dl_host, sizeof dl_dev) == 0),
                      "%s: xent_dev (%g, %lld, %lld) against xent (%g, %lld, %lld)", how,
                      res.loss_sum, (long long)res.correct, (long long)res.bad, loss,
                      (long long)correct, (long long)bad_row);
            float t[R * K];
            for (int i = 0; i < R * K; i++) t[i] = (float)(i % 3) * 0.5f;
            if (bad) t[9] = 1.5f;
            res = (gp_loss_result){-1, -1, -2};
            CHECK_OK(gp_dev_bce_logits(d, logits, t, R * K, 0.25f, dl_host, &loss, &correct,
                                       &bad_row));
            CHECK_OK(gp_dev_bce_logits_dev(d, logits, t, R * K, 0.25f, dl_dev, &res));
            CHECK_MSG(res.bad == bad_row && res.bad == (bad ? 9 : -1) &&
                          res.loss_sum == (bad ? 0.0 : loss) && res.correct == (bad ? 0 : correct) &&
                          (bad || memcmp(dl_dev, dl_host, sizeof dl_dev) == 0),
                      "%s: bce_logits_dev (%g, %lld, %lld) against bce_logits (%g, %lld, %lld)",
                      how, res.loss_sum, (long long)res.correct, (long long)res.bad, loss,
                      (long long)correct, (long long)bad_row);
        }

        /* an upload, ordered by its event */
        float src[64], *dst = dalloc(d, 64);
        void *ev = NULL;
        for (int i = 0; i < 64; i++) src[i] = (float)(i * i);
        CHECK_OK(gp_dev_event_create(d, &ev));
        if (dst) {
            w0 = gp_dev_host_waits(d);
            CHECK_OK(gp_dev_upload_async(d, dst, src, 64, ev));
            CHECK(k ? gp_dev_host_waits(d) > w0 : gp_dev_host_waits(d) == w0);
            CHECK_OK(gp_dev_event_wait(d, ev));
            CHECK(memcmp(dst, src, sizeof src) == 0);
        }
        gp_dev_event_destroy(d, ev);
        dfree(d, dst, 64);
    }
}

/* copy_async (backend.h) on the CPU's two modes.  Synchronous (the
 * default): the copy is done when the call returns and events are NULL.
 * GPIPE_CPU_STREAMS=threads: each device's copy stream is a queue with a
 * thread of its own, held back GPIPE_CPU_COPY_DELAY_US, so every property
 * below would fail if it did not hold: the reader sees the data only after
 * waiting for `done`; a copy waits for `after` even when that is another
 * device's copy; copies on one stream run in order; a free of a copy's
 * source or destination waits for it (the block is reused at once, so an
 * early free would hand the copy's source to the next writer);
 * synchronize waits for the queue. */
static void test_copy_async(gp_device *sync_dev)
{
    enum { N = 3000 };
    size_t bytes = N * sizeof(float);
    float *x = malloc(bytes), *y = malloc(bytes), *back = malloc(bytes);
    if (!x || !y || !back) {
        CHECK(!"out of memory");
        free(x), free(y), free(back);
        return;
    }
    for (int i = 0; i < N; i++) x[i] = (float)i + 0.5f, y[i] = -(float)i;
    /* synchronous: done on return, no events */
    void *ev = &ev, *a = NULL, *b = NULL;
    CHECK_OK(gp_dev_event_create(sync_dev, &ev));
    CHECK(ev == NULL);
    CHECK_OK(gp_dev_alloc(sync_dev, bytes, GP_MEM_COPIES, &a));
    CHECK_OK(gp_dev_alloc(sync_dev, bytes, GP_MEM_COPIES, &b));
    if (a && b) {
        memcpy(a, x, bytes);
        CHECK_OK(gp_dev_copy_async(sync_dev, b, sync_dev, a, bytes, NULL, NULL));
        CHECK(memcmp(b, x, bytes) == 0);
    }
    gp_dev_free(sync_dev, a, bytes, GP_MEM_COPIES);
    gp_dev_free(sync_dev, b, bytes, GP_MEM_COPIES);

    setenv("GPIPE_CPU_STREAMS", "threads", 1);
    setenv("GPIPE_CPU_COPY_DELAY_US", "20000", 1);
    gp_device *d[3] = {NULL, NULL, NULL};
    gp_device_opts o = {.threads = 1};
    for (int k = 0; k < 3; k++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%d", 5 + k);
        CHECK_OK(gp_device_open(name, &o, &d[k]));
    }
    unsetenv("GPIPE_CPU_STREAMS");
    unsetenv("GPIPE_CPU_COPY_DELAY_US");
    void *buf[3] = {NULL, NULL, NULL}, *done[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3 && d[k]; k++) {
        CHECK_OK(gp_dev_alloc(d[k], bytes, GP_MEM_COPIES, &buf[k]));
        CHECK_OK(gp_dev_event_create(d[k], &done[k]));
    }
    if (!d[2] || !buf[2] || !done[2]) goto out;
    CHECK(done[0] && done[1] && done[2]); /* real events in this mode */
    memcpy(buf[0], x, bytes);
    CHECK_OK(gp_dev_event_record(d[0], done[0])); /* the producer's: complete at once */
    /* d0 -> d1, then d1 -> d2 behind d1's copy (an event of d1's copy stream) */
    CHECK_OK(gp_dev_copy_async(d[1], buf[1], d[0], buf[0], bytes, done[0], done[1]));
    CHECK_OK(gp_dev_copy_async(d[2], buf[2], d[1], buf[1], bytes, done[1], done[2]));
    /* freed and taken again at once: the same block comes back from the
     * cache, and whatever is written to it now must not reach the copies */
    gp_dev_free(d[0], buf[0], bytes, GP_MEM_COPIES);
    buf[0] = NULL;
    CHECK_OK(gp_dev_alloc(d[0], bytes, GP_MEM_COPIES, &buf[0]));
    if (buf[0]) memcpy(buf[0], y, bytes);
    CHECK_OK(gp_dev_event_wait(d[2], done[2]));
    memcpy(back, buf[2], bytes);
    CHECK(memcmp(back, x, bytes) == 0);
    /* in order on one stream: the second copy into buf[1] lands last */
    CHECK_OK(gp_dev_copy_async(d[1], buf[1], d[2], buf[2], bytes, NULL, NULL));
    CHECK_OK(gp_dev_copy_async(d[1], buf[1], d[0], buf[0], bytes, NULL, done[1]));
    CHECK_OK(gp_dev_event_sync(d[1], done[1]));
    CHECK(memcmp(buf[1], y, bytes) == 0);
    /* synchronize drains the queue; a free of a copy's destination waits */
    CHECK_OK(gp_dev_copy_async(d[2], buf[2], d[0], buf[0], bytes, NULL, NULL));
    CHECK_OK(gp_dev_synchronize(d[2]));
    CHECK(memcmp(buf[2], y, bytes) == 0);
    CHECK_OK(gp_dev_copy_async(d[2], buf[2], d[1], buf[1], bytes, NULL, NULL));
    gp_dev_free(d[2], buf[2], bytes, GP_MEM_COPIES);
    buf[2] = NULL;
    /* an upload is a copy on the copy stream too: its data is there once
     * its event is waited for, a copy behind that event reads it, and a
     * free of its destination waits for it */
    memset(buf[1], 0, bytes);
    CHECK_OK(gp_dev_upload_async(d[1], buf[1], x, N, done[1]));
    CHECK_OK(gp_dev_copy_async(d[0], buf[0], d[1], buf[1], bytes, done[1], done[0]));
    CHECK_OK(gp_dev_event_wait(d[1], done[1]));
    CHECK(memcmp(buf[1], x, bytes) == 0);
    CHECK_OK(gp_dev_event_wait(d[0], done[0]));
    CHECK(memcmp(buf[0], x, bytes) == 0);
    CHECK_OK(gp_dev_upload_async(d[1], buf[1], y, N, NULL));
    gp_dev_free(d[1], buf[1], bytes, GP_MEM_COPIES);
    buf[1] = NULL;
out:
    for (int k = 0; k < 3; k++) {
        if (d[k]) {
            gp_dev_free(d[k], buf[k], bytes, GP_MEM_COPIES);
            gp_dev_event_destroy(d[k], done[k]);
            CHECK(d[k]->alloc.cur_by[GP_MEM_COPIES] == 0);
        }
        gp_device_close(d[k]);
    }
    free(x), free(y), free(back);
}

/* The missing-wait checker of GPIPE_CPU_STREAMS=threads (cpu_streams.c,
 * "Allocation epochs"): a copy that reads a buffer allocated after the
 * event it waits on was recorded on the source's compute stream fails
 * (nothing wrote the buffer before that event, so on a GPU the copy could
 * read it unwritten), naming both devices; behind an event recorded after
 * the allocation it copies.  A block from the allocator's cache is a new
 * buffer too; `after` NULL, or last recorded by a copy stream, is not
 * checked. */
static void test_copy_checker(void)
{
    setenv("GPIPE_CPU_STREAMS", "threads", 1);
    gp_device *d[2] = {NULL, NULL};
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:11", &o, &d[0]));
    CHECK_OK(gp_device_open("cpu:12", &o, &d[1]));
    unsetenv("GPIPE_CPU_STREAMS");
    enum { N = 500 };
    size_t bytes = N * sizeof(float);
    void *e = NULL, *e2 = NULL, *got = NULL, *b = NULL, *c = NULL, *dst = NULL;
    if (!d[0] || !d[1]) goto out;
    CHECK_OK(gp_dev_event_create(d[0], &e));
    CHECK_OK(gp_dev_event_create(d[0], &e2));
    CHECK_OK(gp_dev_event_create(d[1], &got));
    CHECK_OK(gp_dev_alloc(d[1], bytes, GP_MEM_COPIES, &dst));
    if (!e || !e2 || !got || !dst) goto out;
    /* record E, allocate B, copy B behind E: missing wait */
    CHECK_OK(gp_dev_event_record(d[0], e));
    CHECK_OK(gp_dev_alloc(d[0], bytes, GP_MEM_ACTIVATIONS, &b));
    if (!b) goto out;
    memset(b, 0, bytes);
    gp_status st = gp_dev_copy_async(d[1], dst, d[0], (char *)b + 64, 256, e, got);
    CHECK(st == GP_ERR_RUNTIME);
    CHECK_MSG(strstr(gp_last_error(), "from cpu:11 to cpu:12") &&
              strstr(gp_last_error(), "allocated after") && strstr(gp_last_error(), "byte 64 "),
              "%s", gp_last_error());
    gp_error_clear();
    /* and a channel-less copy on the same device alike */
    CHECK(gp_dev_copy_async(d[0], b, d[0], b, bytes, e, NULL) == GP_ERR_RUNTIME);
    gp_error_clear();
    /* allocate B, record E, copy: fine (B's start and a byte inside it) */
    CHECK_OK(gp_dev_event_record(d[0], e));
    CHECK_OK(gp_dev_copy_async(d[1], dst, d[0], b, bytes, e, got));
    CHECK_OK(gp_dev_copy_async(d[1], dst, d[0], (char *)b + 4, 4, e, got));
    /* an event never recorded waits for nothing, on a GPU too: unchecked */
    CHECK_OK(gp_dev_copy_async(d[1], dst, d[0], b, bytes, e2, got));
    CHECK_OK(gp_dev_event_sync(d[1], got));
    gp_dev_free(d[0], b, bytes, GP_MEM_ACTIVATIONS);
    CHECK_OK(gp_dev_event_record(d[0], e2));
    /* the same block back from the cache after E2: a new buffer */
    CHECK_OK(gp_dev_alloc(d[0], bytes, GP_MEM_ACTIVATIONS, &c));
    CHECK(c == b);
    b = NULL;
    if (!c) goto out;
    CHECK(gp_dev_copy_async(d[1], dst, d[0], c, bytes, e2, got) == GP_ERR_RUNTIME);
    gp_error_clear();
    CHECK(gp_dev_copy_async(d[1], dst, d[0], c, bytes, e, got) == GP_ERR_RUNTIME);
    gp_error_clear();
    /* not checked: no event, and an event a copy stream recorded last */
    CHECK_OK(gp_dev_copy_async(d[1], dst, d[0], c, bytes, NULL, got));
    CHECK_OK(gp_dev_copy_async(d[0], c, d[1], dst, bytes, got, e2));
    CHECK_OK(gp_dev_copy_async(d[1], dst, d[0], c, bytes, e2, got));
    CHECK_OK(gp_dev_synchronize(d[0]));
    CHECK_OK(gp_dev_synchronize(d[1]));
out:
    if (d[0]) {
        gp_dev_free(d[0], b, bytes, GP_MEM_ACTIVATIONS);
        gp_dev_free(d[0], c, bytes, GP_MEM_ACTIVATIONS);
        gp_dev_event_destroy(d[0], e);
        gp_dev_event_destroy(d[0], e2);
    }
    if (d[1]) {
        gp_dev_free(d[1], dst, bytes, GP_MEM_COPIES);
        gp_dev_event_destroy(d[1], got);
    }
    gp_device_close(d[0]);
    gp_device_close(d[1]);
}

/* Device-time markers (backend.h, mark) on the CPU's two modes.  On the
 * compute stream (the caller) and in the synchronous mode, a marker's time
 * is that of the call.  With GPIPE_CPU_STREAMS=threads a marker on the
 * copy stream is reached only once the copies before it are done: behind
 * two copies each held back 20 ms it reads at least 40 ms after it was
 * enqueued, reading it waits for it, and markers on one stream keep their
 * order.  mark_reset forgets them (AddressSanitizer: nothing leaks). */
static void test_marks(gp_device *sync_dev)
{
    void *m0, *m1;
    double t0, t1, before = gp_now();
    CHECK_OK(gp_dev_mark(sync_dev, false, &m0));
    CHECK_OK(gp_dev_mark(sync_dev, true, &m1));
    double after = gp_now();
    CHECK(m0 && m1);
    CHECK_OK(gp_dev_mark_time(sync_dev, m0, &t0));
    CHECK_OK(gp_dev_mark_time(sync_dev, m1, &t1));
    CHECK_MSG(before <= t0 && t0 <= t1 && t1 <= after, "synchronous markers %.9f, %.9f outside "
              "[%.9f, %.9f]", t0, t1, before, after);
    gp_dev_mark_reset(sync_dev);
    CHECK_OK(gp_dev_mark_time(sync_dev, NULL, &t0)); /* a NULL marker reads 0 */
    CHECK(t0 == 0);

    setenv("GPIPE_CPU_STREAMS", "threads", 1);
    setenv("GPIPE_CPU_COPY_DELAY_US", "20000", 1);
    gp_device *d = NULL;
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:9", &o, &d));
    unsetenv("GPIPE_CPU_STREAMS");
    unsetenv("GPIPE_CPU_COPY_DELAY_US");
    if (!d) return;
    enum { N = 1000 };
    void *a = NULL, *b = NULL;
    CHECK_OK(gp_dev_alloc(d, N * sizeof(float), GP_MEM_COPIES, &a));
    CHECK_OK(gp_dev_alloc(d, N * sizeof(float), GP_MEM_COPIES, &b));
    if (a && b) {
        void *c0, *c1, *c2, *k0;
        double s0 = gp_now();
        CHECK_OK(gp_dev_mark(d, true, &c0));
        CHECK_OK(gp_dev_copy_async(d, b, d, a, N * sizeof(float), NULL, NULL));
        CHECK_OK(gp_dev_mark(d, true, &c1));
        CHECK_OK(gp_dev_copy_async(d, a, d, b, N * sizeof(float), NULL, NULL));
        CHECK_OK(gp_dev_mark(d, true, &c2));
        CHECK_OK(gp_dev_mark(d, false, &k0)); /* the compute stream: now */
        double s1 = gp_now(), tc0, tc1, tc2, tk;
        CHECK_OK(gp_dev_mark_time(d, c2, &tc2)); /* waits for the queue to reach it */
        CHECK_OK(gp_dev_mark_time(d, c0, &tc0));
        CHECK_OK(gp_dev_mark_time(d, c1, &tc1));
        CHECK_OK(gp_dev_mark_time(d, k0, &tk));
        CHECK_MSG(s0 <= tc0 && tc0 + 0.02 <= tc1 && tc1 + 0.02 <= tc2,
                  "copy-stream markers %.6f, %.6f, %.6f: not 20 ms apart behind the copies",
                  tc0 - s0, tc1 - s0, tc2 - s0);
        CHECK_MSG(tk <= s1 && tk + 0.035 < tc2, "the compute marker (%.6f) waited for the copy "
                  "stream (%.6f)", tk - s0, tc2 - s0);
    }
    CHECK_OK(gp_dev_synchronize(d));
    gp_dev_mark_reset(d);
    gp_dev_free(d, a, N * sizeof(float), GP_MEM_COPIES);
    gp_dev_free(d, b, N * sizeof(float), GP_MEM_COPIES);
    gp_device_close(d);
}

/* Two devices driven by two threads at once, each with its own thread
 * count, compute the same convolution as one device alone. */
typedef struct conc_job {
    gp_device *dev;
    const gp_conv_desc *d;
    const float *x, *w;
    float *y;
    gp_status st;
} conc_job;

static void *conc_main(void *arg)
{
    conc_job *j = arg;
    gp_device_bind_thread(j->dev);
    j->st = GP_OK;
    for (int it = 0; it < 3 && j->st == GP_OK; it++)
        j->st = gp_dev_conv_fwd(j->dev, j->d, j->x, j->w, NULL, j->y);
    return NULL;
}

static void test_concurrent(void)
{
    gp_device *da = NULL, *db = NULL;
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:5", &o, &da));
    CHECK_OK(gp_device_open("cpu:6", &o, &db));
    gp_conv_desc d = {4, 16, 12, 12, 24, 3, 3, 1, 1, 1, 1, 12, 12, 0, 0, 0};
    int64_t nx = 4 * 16 * 144, nw = 24 * 16 * 9, ny = 4 * 24 * 144;
    float *x = drand(da, nx), *w = drand(da, nw), *ya = dalloc(da, ny), *yb = dalloc(db, ny);
    double *ref = malloc(sizeof(double) * (size_t)ny);
    ref_conv_fwd(&d, x, w, NULL, ref);
    conc_job ja = {da, &d, x, w, ya, GP_OK}, jb = {db, &d, x, w, yb, GP_OK};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, conc_main, &ja);
    pthread_create(&tb, NULL, conc_main, &jb);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(ja.st == GP_OK && jb.st == GP_OK);
    check_close("concurrent conv on cpu:5", ya, ref, ny, 1e-5);
    check_close("concurrent conv on cpu:6", yb, ref, ny, 1e-5);
    free(ref);
    dfree(da, x, nx); dfree(da, w, nw); dfree(da, ya, ny); dfree(db, yb, ny);
    gp_device_close(da);
    gp_device_close(db);
}

/* Weights kept converted while frozen (gp_dev_freeze_weights): the same
 * results as unfrozen calls, a new weight tensor or new values after a
 * thaw are converted again (never a stale copy), and the kept bytes are
 * workspace that the thaw gives back. */
static void test_frozen_weights(gp_device *dev)
{
    gp_conv_desc d = {4, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 12, 12, 0, 0, 0};
    int64_t nx = 4 * 16 * 144, nw = 32 * 16 * 9, ny = 4 * 32 * 144;
    float *x = drand(dev, nx), *w1 = drand(dev, nw), *w2 = drand(dev, nw), *dy = drand(dev, ny);
    float *y0 = dalloc(dev, ny), *y1 = dalloc(dev, ny), *dx0 = dalloc(dev, nx),
          *dx1 = dalloc(dev, nx);
    CHECK_OK(gp_dev_conv_fwd(dev, &d, x, w1, NULL, y0));
    CHECK_OK(gp_dev_conv_bwd_data(dev, &d, w1, dy, dx0));
    size_t before = dev->alloc.cur_by[GP_MEM_WORKSPACE];
    gp_dev_freeze_weights(dev, true);
    for (int rep = 0; rep < 3; rep++) {
        CHECK_OK(gp_dev_conv_fwd(dev, &d, x, w1, NULL, y1));
        CHECK_OK(gp_dev_conv_bwd_data(dev, &d, w1, dy, dx1));
        CHECK(!memcmp(y0, y1, sizeof(float) * (size_t)ny));
        CHECK(!memcmp(dx0, dx1, sizeof(float) * (size_t)nx));
    }
    /* another weight tensor of the same shape while frozen */
    float *y2 = dalloc(dev, ny), *y3 = dalloc(dev, ny);
    CHECK_OK(gp_dev_conv_fwd(dev, &d, x, w2, NULL, y2));
    CHECK(memcmp(y2, y0, sizeof(float) * (size_t)ny) != 0);
    size_t frozen = dev->alloc.cur_by[GP_MEM_WORKSPACE];
    gp_dev_freeze_weights(dev, false);
    /* these shapes run blocked (16 and 32 channels): a copy was kept */
    CHECK(dev->alloc.cur_by[GP_MEM_WORKSPACE] == before);
    CHECK_MSG(frozen > before, "%s kept no converted weights", dev->name);
    /* new values in w2's memory after the thaw: converted again */
    for (int64_t i = 0; i < nw; i++) w2[i] = w1[i];
    gp_dev_freeze_weights(dev, true);
    CHECK_OK(gp_dev_conv_fwd(dev, &d, x, w2, NULL, y3));
    gp_dev_freeze_weights(dev, false);
    CHECK_MSG(!memcmp(y3, y0, sizeof(float) * (size_t)ny), "%s: a stale converted copy of "
              "the weights survived a thaw", dev->name);
    dfree(dev, x, nx);
    dfree(dev, w1, nw);
    dfree(dev, w2, nw);
    dfree(dev, dy, ny);
    dfree(dev, y0, ny);
    dfree(dev, y1, ny);
    dfree(dev, y2, ny);
    dfree(dev, y3, ny);
    dfree(dev, dx0, nx);
    dfree(dev, dx1, nx);
}

/* gp_algo_pick (the CUDA backend's convolution algorithm choice, decided
 * here so that it runs without a GPU) against its definition, on random
 * candidate lists: the pick qualifies (ok, within the workspace limit,
 * deterministic when asked); asked for determinism, no earlier candidate
 * qualifies; otherwise the pick is within GP_ALGO_SLACK of the fastest and
 * no qualifying candidate within it needs less workspace, or as much and is
 * faster, or as fast and earlier; where nothing was measured it is the
 * first; -1 exactly when nothing qualifies.  Times are whole milliseconds
 * plus 0, 1/64 or 2/64 (exact in a float): 1/64 is within the 2% slack of
 * 1 ms and 2/64 is not. */
static uint64_t next_u(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return *r >> 33;
}

static void test_algo_pick(void)
{
    uint64_t r = 12345;
    int seen[4] = {0, 0, 0, 0}; /* picks: none, deterministic, measured, slower but leaner */
    for (int trial = 0; trial < 4000; trial++) {
        gp_algo_cand c[8];
        int n = (int)(next_u(&r) % 9);
        bool measured = next_u(&r) % 4 != 0, det = next_u(&r) % 2;
        size_t limit = (size_t)(next_u(&r) % 5) << 20;
        for (int i = 0; i < n; i++)
            c[i] = (gp_algo_cand){.algo = i,
                                  .ok = next_u(&r) % 5 != 0,
                                  .time_ms = measured ? (float)(next_u(&r) % 6) +
                                                            (float)(next_u(&r) % 3) / 64.0f
                                                      : -1.0f,
                                  .memory = (size_t)(next_u(&r) % 6) << 20,
                                  .deterministic = next_u(&r) % 2};
        int k = gp_algo_pick(c, n, limit, det);
        bool any = false;
        for (int i = 0; i < n; i++)
            any |= c[i].ok && c[i].memory <= limit && (!det || c[i].deterministic);
        CHECK_MSG((k >= 0) == any, "trial %d: pick %d with%s a candidate that qualifies", trial,
                  k, any ? "" : "out");
        if (k < 0) {
            seen[0]++;
            continue;
        }
        CHECK_MSG(k < n && c[k].ok && c[k].memory <= limit && (!det || c[k].deterministic),
                  "trial %d: pick %d does not qualify", trial, k);
        double tmin = 1e30;
        for (int i = 0; i < n; i++)
            if (c[i].ok && c[i].memory <= limit && c[i].time_ms < tmin) tmin = c[i].time_ms;
        const double within = tmin * (1.0 + GP_ALGO_SLACK);
        if (!det && measured)
            CHECK_MSG(c[k].time_ms <= within, "trial %d: pick %d (%.4f ms) is past the slack of "
                      "the fastest (%.4f ms)", trial, k, c[k].time_ms, tmin);
        for (int i = 0; i < n; i++) {
            if (i == k || !c[i].ok || c[i].memory > limit || (det && !c[i].deterministic))
                continue;
            if (det || !measured) {
                CHECK_MSG(i > k, "trial %d: %d qualifies and comes before the pick %d", trial, i,
                          k);
            } else if (c[i].time_ms <= within) {
                bool leaner = c[i].memory < c[k].memory, same = c[i].memory == c[k].memory;
                CHECK_MSG(!leaner && (!same || c[i].time_ms > c[k].time_ms ||
                                      (c[i].time_ms == c[k].time_ms && i > k)),
                          "trial %d: %d (%.4f ms, %zu B) beats the pick %d (%.4f ms, %zu B)",
                          trial, i, c[i].time_ms, c[i].memory, k, c[k].time_ms, c[k].memory);
            }
        }
        seen[det ? 1 : 2]++;
        if (!det && measured && c[k].time_ms > tmin) seen[3]++;
    }
    /* every branch was exercised, the slack's too */
    CHECK(seen[0] > 0 && seen[1] > 0 && seen[2] > 0 && seen[3] > 0);
}

/* The residual add and layer norm in one pass (add_layer_norm_fwd) and the
 * norm's backward adding into its input's other gradient
 * (layer_norm_bwd_data_add), issue 64: on FP32 and bf16 storage, the bits
 * of the calls they replace (add / add_bf16 then layer_norm_fwd (_bf16);
 * layer_norm_bwd_data (_bf16) then the sum gp_layers_accumulate makes:
 * axpy / add_bf16), and the FP32 forward against a naive double-precision
 * norm; widths with a tail past the 8 lanes. */
static void test_add_norm(gp_device *dev)
{
    CHECK(gp_dev_add_norm_has(dev, GP_F32) && gp_dev_add_norm_has(dev, GP_BF16));
    static const int64_t shapes[][2] = {{7, 37}, {33, 128}, {1, 5}};
    for (int q = 0; q < 3; q++)
        for (int b16 = 0; b16 < 2; b16++) {
            const int64_t rows = shapes[q][0], c = shapes[q][1], n = rows * c;
            const gp_dtype dt = b16 ? GP_BF16 : GP_F32;
            const int64_t words = b16 ? (n + 1) / 2 : n; /* storage in floats */
            float *fa = drand(dev, n), *fb = drand(dev, n), *fdy = drand(dev, n);
            float *fg = drand(dev, n), *w = drand(dev, c), *bias = drand(dev, c);
            void *a = fa, *bb = fb, *dy = fdy, *g0 = fg;
            if (b16) { /* the same values rounded, as bf16 storage */
                a = dalloc(dev, words); bb = dalloc(dev, words);
                dy = dalloc(dev, words); g0 = dalloc(dev, words);
                CHECK_OK(gp_dev_bf16_pack(dev, a, fa, n));
                CHECK_OK(gp_dev_bf16_pack(dev, bb, fb, n));
                CHECK_OK(gp_dev_bf16_pack(dev, dy, fdy, n));
                CHECK_OK(gp_dev_bf16_pack(dev, g0, fg, n));
            }
            float *s1 = dalloc(dev, words), *y1 = dalloc(dev, words), *s2 = dalloc(dev, words);
            float *y2 = dalloc(dev, words), *st1 = dalloc(dev, 2 * rows);
            float *st2 = dalloc(dev, 2 * rows);
            uint64_t l0 = gp_dev_launches(dev);
            CHECK_OK(gp_dev_add_layer_norm_fwd(dev, dt, a, bb, s1, w, bias, y1, st1, st1 + rows,
                                               rows, c, 1e-5f));
            CHECK(gp_dev_launches(dev) - l0 == 1);
            if (b16) {
                CHECK_OK(gp_dev_add_bf16(dev, a, bb, (uint16_t *)s2, n));
                CHECK_OK(gp_dev_layer_norm_fwd_bf16(dev, (uint16_t *)s2, w, bias, (uint16_t *)y2,
                                                    st2, st2 + rows, rows, c, 1e-5f));
            } else {
                CHECK_OK(gp_dev_add(dev, fa, fb, s2, n));
                CHECK_OK(gp_dev_layer_norm_fwd(dev, s2, w, bias, y2, st2, st2 + rows, rows, c,
                                               1e-5f));
            }
            size_t bytes = (size_t)n * (b16 ? 2 : 4);
            CHECK_MSG(!memcmp(s1, s2, bytes) && !memcmp(y1, y2, bytes) &&
                          !memcmp(st1, st2, sizeof(float) * (size_t)(2 * rows)),
                      "add_layer_norm_fwd %lldx%lld %s: not the bits of the add and the norm",
                      (long long)rows, (long long)c, gp_dtype_name(dt));
            for (int64_t r = 0; !b16 && r < rows; r++) { /* a naive double-precision norm */
                double m = 0.0, v = 0.0;
                for (int64_t j = 0; j < c; j++) m += (double)fa[r * c + j] + (double)fb[r * c + j];
                m /= (double)c;
                for (int64_t j = 0; j < c; j++) {
                    double d = (double)fa[r * c + j] + (double)fb[r * c + j] - m;
                    v += d * d;
                }
                double rs = 1.0 / sqrt(v / (double)c + 1e-5);
                for (int64_t j = 0; j < c; j++) {
                    double want = ((double)fa[r * c + j] + (double)fb[r * c + j] - m) * rs *
                                      (double)w[j] + (double)bias[j];
                    CHECK_MSG(fabs((double)y1[r * c + j] - want) <= 1e-4 * (1.0 + fabs(want)),
                              "add_layer_norm_fwd %lldx%lld: y[%lld][%lld] %g, the double "
                              "norm %g", (long long)rows, (long long)c, (long long)r,
                              (long long)j, (double)y1[r * c + j], want);
                }
            }
            /* backward: dx (holding the pop's gradient g0) += the norm's */
            float *dx1 = dalloc(dev, words), *dx2 = dalloc(dev, words);
            memcpy(dx1, g0, bytes);
            l0 = gp_dev_launches(dev);
            CHECK_OK(gp_dev_layer_norm_bwd_data_add(dev, dt, s1, w, st1, st1 + rows, dy, dx1,
                                                    rows, c));
            CHECK(gp_dev_launches(dev) - l0 == 1);
            if (b16) {
                CHECK_OK(gp_dev_layer_norm_bwd_data_bf16(dev, (uint16_t *)s1, w, st1,
                                                         st1 + rows, dy, (uint16_t *)dx2, rows,
                                                         c));
                CHECK_OK(gp_dev_add_bf16(dev, (uint16_t *)dx2, g0, (uint16_t *)dx2, n));
            } else {
                CHECK_OK(gp_dev_layer_norm_bwd_data(dev, s1, w, st1, st1 + rows, fdy, dx2, rows,
                                                    c));
                CHECK_OK(gp_dev_axpy(dev, 1.0f, fg, dx2, n));
            }
            CHECK_MSG(!memcmp(dx1, dx2, bytes), "layer_norm_bwd_data_add %lldx%lld %s: not the "
                      "bits of the norm's dx and the sum after", (long long)rows, (long long)c,
                      gp_dtype_name(dt));
            if (b16) {
                dfree(dev, a, words); dfree(dev, bb, words);
                dfree(dev, dy, words); dfree(dev, g0, words);
            }
            float *wide[] = {fa, fb, fdy, fg}, *store[] = {s1, y1, s2, y2, dx1, dx2};
            for (size_t k = 0; k < 4; k++) dfree(dev, wide[k], n);
            for (size_t k = 0; k < 6; k++) dfree(dev, store[k], words);
            dfree(dev, w, c); dfree(dev, bias, c);
            dfree(dev, st1, 2 * rows); dfree(dev, st2, 2 * rows);
        }
}

/* gp_cpu_exp_d (the cross-entropy's exponential, cpu_impl.h) against the
 * C library's exp over [-708, 709] in steps that put every lane of a
 * vector on every kind of value, and near 0 where the polynomial's r is
 * the whole argument: within 2 ulp; 0 below -708 and at -inf, NaN stays
 * NaN.  Then the cross-entropy's rows (cpu_math.c's 8-lane maximum and
 * log-sum-exp) against elementwise.h's formulas through the C library, on
 * rows of 1 to 19 logits (every tail of the 8 lanes) and 50,257 (GPT-2's
 * vocabulary), with ties for the maximum (the first one counts as the
 * guess), the maximum first and last, -inf logits, and a NaN first and in
 * the middle (the loss NaN as before); without and with label smoothing:
 * loss within 1e-13 relative, the same hits, the gradient within 1e-6
 * relative. */
static void test_xent_exp(gp_device *dev)
{
    double worst = 0;
    enum { N = 200003 };
    for (int i = 0; i <= N; i++) {
        double x = -708.0 + 1417.0 * (double)i / N, r = exp(x), g = gp_cpu_exp_d(x);
        worst = fmax(worst, fabs(g - r) / r);
        double t = ldexp((double)(i - N / 2), -40); /* |x| < 1e-7 */
        worst = fmax(worst, fabs(gp_cpu_exp_d(t) - exp(t)) / exp(t));
    }
    CHECK_MSG(worst <= 2 * DBL_EPSILON, "gp_cpu_exp_d: %.3g relative from exp", worst);
    CHECK(gp_cpu_exp_d(0.0) == 1.0 && gp_cpu_exp_d(-709.0) == 0.0 &&
          gp_cpu_exp_d(-INFINITY) == 0.0 && isnan(gp_cpu_exp_d(NAN)));
    /* every tail of the 8 lanes, for the sums (cols % 8) and for the
     * maximum, which starts at element 1 ((cols - 1) % 8) */
    const int64_t widths[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 50257};
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        const int64_t cols = widths[w], rows = 9;
        float *x = drand(dev, rows * cols), *lab = dalloc(dev, rows);
        float *dl = dalloc(dev, rows * cols);
        for (int64_t i = 0; i < rows * cols; i++) x[i] = 8.0f * x[i] - 4.0f;
        for (int64_t r = 0; r < rows; r++) {
            float *xr = x + r * cols;
            lab[r] = (float)((r * 5) % cols);
            if (r == 1) xr[0] = 9.0f;                       /* maximum first */
            if (r == 2) xr[cols - 1] = 9.0f;                /* last */
            if (r == 3) xr[cols / 2] = xr[cols - 1] = 9.0f; /* a tie: the first */
            if (r == 4) xr[(int64_t)lab[r]] = 9.0f;         /* a hit */
            if (r == 5 && cols > 2) xr[cols - 1] = -INFINITY; /* (not the label) */
        }
        double *rdl = malloc(sizeof(double) * (size_t)(rows * cols));
        for (int e = 0; e < 2; e++) { /* without and with label smoothing */
            const float eps = e ? 0.1f : 0.0f;
            double loss = 0, ref = 0;
            int64_t hits = 0, rhits = 0, bad = 0;
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = x + r * cols;
                int64_t am, label = (int64_t)lab[r];
                float mx = gp_ew_row_max(xr, cols, &am);
                double lse = gp_ew_row_logsumexp(xr, cols, mx);
                ref += gp_ew_xent_loss_ls(xr, label, mx, lse, gp_ew_row_shift_sum(xr, cols, mx),
                                          cols, eps);
                rhits += am == label;
                for (int64_t j = 0; j < cols; j++)
                    rdl[r * cols + j] =
                        gp_ew_xent_grad_ls(xr[j], j == label, mx, lse, 0.25f, eps, cols);
            }
            CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, 0.25f, eps, dl, &loss, &hits, &bad));
            /* (smoothing: a -inf logit makes the loss +inf in both) */
            CHECK_MSG((loss == ref || fabs(loss - ref) <= 1e-13 * fabs(ref)) && hits == rhits &&
                          bad == -1, "xent, %lld logits a row, smoothing %g: loss %.17g against %.17g, hits "
                      "%lld against %lld", (long long)cols, eps, loss, ref, (long long)hits,
                      (long long)rhits);
            check_close(e ? "xent rows' gradient, smoothing" : "xent rows' gradient", dl, rdl,
                        rows * cols, 1e-6);
        }
        double loss = 0;
        int64_t hits = 0, bad = 0;
        for (int q = 0; q < 2 && cols > 2; q++) { /* a NaN first, then in the middle */
            x[q ? cols / 2 : 0] = NAN;
            CHECK_OK(gp_dev_xent(dev, x, lab, rows, cols, 0.25f, 0.0f, NULL, &loss, &hits,
                                 &bad));
            CHECK_MSG(isnan(loss), "xent with a NaN logit (%s): loss %g", q ? "middle" : "first",
                      loss);
            x[q ? cols / 2 : 0] = 0.5f;
        }
        free(rdl);
        dfree(dev, x, rows * cols);
        dfree(dev, lab, rows);
        dfree(dev, dl, rows * cols);
    }
}

/* A product with GELU as its epilogue (linear_gelu_fwd) and with GELU's
 * derivative as its epilogue (linear_gelu_bwd_data), issue 64: on FP32
 * and bf16 storage the bits of the calls they stand for (linear_fwd /
 * linear_fwd_bf16 then gelu_fwd / act_bf16's GELU; the data product then
 * gelu_bwd / act_bf16's GELU backward), one launch each; a product worth
 * bf16 and one not (in 8). */
/* GELU's values (the CPU's own loop, x sigmoid(2u) through gp_cpu_exp,
 * cpu_math.c) against GPT-2's tanh form in double, over [-12, 12] in steps
 * that land every lane of a vector on every kind of value, and at its
 * edges: y within 4e-7 |x| of the reference (the rounding of u moves
 * e^-2u by about 2 |u| ulps where x is negative), and within 1e-6 relative
 * where |y| is over 1e-3 |x|; dx within 1e-6 (|x| + 1) |dy|; a NaN stays
 * NaN, +inf gives +inf, large positive x gives x, and below about -9.8
 * (sigmoid(2u) under e^-88) y is -0 and dx 0, as the tanh form's are.  In
 * place too (y on x, dx on dy), as linear_gelu_bwd_data runs it. */
static void test_gelu_values(gp_device *dev)
{
    enum { N = 4099, E = 5 };
    float *x = dalloc(dev, N + E), *y = dalloc(dev, N + E), *dy = dalloc(dev, N + E);
    float *dx = dalloc(dev, N + E), *c = dalloc(dev, N + E);
    for (int i = 0; i < N; i++) {
        x[i] = -12.0f + 24.0f * (float)i / (float)(N - 1);
        dy[i] = 0.5f + 0.25f * (float)(i % 7);
    }
    const float edge[E] = {NAN, INFINITY, 1e20f, -20.0f, -1e20f};
    for (int i = 0; i < E; i++) x[N + i] = edge[i], dy[N + i] = 1.0f;
    CHECK_OK(gp_dev_gelu_fwd(dev, x, y, N + E));
    CHECK_OK(gp_dev_gelu_bwd(dev, x, dy, dx, N + E));
    const double K = 0.7978845608028654, C = 0.044715;
    double worst_y = 0, worst_r = 0, worst_d = 0;
    for (int i = 0; i < N; i++) {
        double v = x[i], t = tanh(K * (v + C * v * v * v));
        double ry = 0.5 * v * (1.0 + t);
        double rd = dy[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * K * (1.0 + 3.0 * C * v * v));
        worst_y = fmax(worst_y, fabs(y[i] - ry) / fabs(v));
        if (fabs(ry) > 1e-3 * fabs(v)) worst_r = fmax(worst_r, fabs(y[i] - ry) / fabs(ry));
        worst_d = fmax(worst_d, fabs(dx[i] - rd) / ((fabs(v) + 1.0) * dy[i]));
    }
    printf("gelu: |y - ref| / |x| %.2g, relative %.2g, |dx - ref| / ((|x| + 1) |dy|) %.2g\n",
           worst_y, worst_r, worst_d);
    CHECK_MSG(worst_y <= 4e-7 && worst_r <= 1e-6 && worst_d <= 1e-6,
              "gelu against the tanh form in double: %.3g of |x|, %.3g relative, dx %.3g",
              worst_y, worst_r, worst_d);
    CHECK(isnan(y[N]) && isnan(dx[N]));
    CHECK(y[N + 1] == INFINITY && dx[N + 1] == 1.0f && y[N + 2] == 1e20f && dx[N + 2] == 1.0f);
    CHECK(y[N + 3] == 0.0f && signbit(y[N + 3]) && dx[N + 3] == 0.0f);
    CHECK(y[N + 4] == 0.0f && signbit(y[N + 4]) && dx[N + 4] == 0.0f);
    /* in place: the same bits */
    memcpy(c, x, (size_t)(N + E) * sizeof *c);
    CHECK_OK(gp_dev_gelu_fwd(dev, c, c, N + E));
    CHECK(!memcmp(c, y, (size_t)(N + E) * sizeof *c));
    memcpy(c, dy, (size_t)(N + E) * sizeof *c);
    CHECK_OK(gp_dev_gelu_bwd(dev, x, c, c, N + E));
    CHECK(!memcmp(c, dx, (size_t)(N + E) * sizeof *c));
    float *bufs[] = {x, y, dy, dx, c};
    for (int k = 0; k < 5; k++) dfree(dev, bufs[k], N + E);
}

/* The linear layer's weights slot on an empty micro-batch (n = 0): a fresh
 * step's dw and db are zero, as the gemm with beta 0, the fill and no
 * sum_rows it stands for make them (device.c's fallback); an accumulating
 * one leaves them as they were.  Both storage types (bf16 where the
 * device has the slot's bf16 half). */
static void test_linear_bwd_weights_empty(gp_device *dev)
{
    const int64_t out = 5, in = 3;
    for (int bf16 = 0; bf16 < 1 + gp_dev_linear_bf16_has(dev); bf16++)
        for (int fresh = 0; fresh < 2; fresh++) {
            float *dw = drand(dev, out * in), *db = drand(dev, out), *x = dalloc(dev, in);
            float *dy = dalloc(dev, out), w0[5 * 3], b0[5], w1[5 * 3], b1[5];
            CHECK_OK(gp_dev_download(dev, w0, dw, out * in));
            CHECK_OK(gp_dev_download(dev, b0, db, out));
            CHECK_OK(gp_dev_linear_bwd_weights(dev, bf16 ? GP_BF16 : GP_F32, 0, out, in, dy, x,
                                               dw, db, fresh));
            CHECK_OK(gp_dev_download(dev, w1, dw, out * in));
            CHECK_OK(gp_dev_download(dev, b1, db, out));
            bool ok = true;
            for (int64_t j = 0; j < out * in; j++) ok &= w1[j] == (fresh ? 0.0f : w0[j]);
            for (int64_t j = 0; j < out; j++) ok &= b1[j] == (fresh ? 0.0f : b0[j]);
            CHECK_MSG(ok, "%s linear bwd_weights on 0 rows, %s: dw or db is not %s",
                      bf16 ? "bf16" : "FP32", fresh ? "fresh" : "accumulating",
                      fresh ? "zero" : "as it was");
            dfree(dev, dw, out * in); dfree(dev, db, out); dfree(dev, x, in); dfree(dev, dy, out);
        }
}

static void test_linear_gelu(gp_device *dev, bool bf16)
{
    CHECK(gp_dev_linear_gelu_has(dev, GP_F32));
    /* bf16 storage under precision bf16 only (test_bf16's device) */
    CHECK(gp_dev_linear_gelu_has(dev, GP_BF16) == bf16);
    static const int64_t shapes[][3] = {{24, 40, 72}, {5, 33, 8}};
    for (int q = 0; q < 2; q++)
        for (int b16 = 0; b16 < 2; b16++) {
            if (b16 && !bf16) continue;
            const int64_t n = shapes[q][0], out = shapes[q][1], in = shapes[q][2];
            const gp_dtype dt = b16 ? GP_BF16 : GP_F32;
            float *fx, *fdy;
            uint16_t *x16 = b16rand(dev, n * in, &fx), *dy16 = b16rand(dev, n * out, &fdy);
            const void *x = b16 ? (const void *)x16 : fx, *dy = b16 ? (const void *)dy16 : fdy;
            float *w = drand(dev, out * in), *bias = drand(dev, out);
            float *pre1 = dalloc(dev, n * out), *y1 = dalloc(dev, n * out);
            float *pre2 = dalloc(dev, n * out), *y2 = dalloc(dev, n * out);
            float *gin = drand(dev, n * in); /* the GELU's input before the product */
            void *gi = gin;
            uint16_t *gin16 = NULL;
            if (b16) {
                gin16 = (uint16_t *)dalloc(dev, n * in);
                CHECK_OK(gp_dev_bf16_pack(dev, gin16, gin, n * in));
                gi = gin16;
            }
            float *dx1 = dalloc(dev, n * in), *dx2 = dalloc(dev, n * in);
            uint64_t l0 = gp_dev_launches(dev);
            CHECK_OK(gp_dev_linear_gelu_fwd(dev, dt, n, out, in, x, w, bias, pre1, y1));
            CHECK_OK(gp_dev_linear_gelu_bwd_data(dev, dt, n, out, in, dy, w, gi, dx1));
            CHECK(gp_dev_launches(dev) - l0 == 2);
            if (b16) {
                CHECK_OK(gp_dev_linear_fwd_bf16(dev, n, out, in, x16, w, bias, false,
                                                (uint16_t *)pre2));
                CHECK_OK(gp_dev_act_bf16(dev, GP_ACT_GELU, (uint16_t *)pre2, NULL,
                                         (uint16_t *)y2, n * out, 0.0f));
            } else {
                CHECK_OK(gp_dev_linear_fwd(dev, n, out, in, fx, w, bias, false, pre2));
                CHECK_OK(gp_dev_gelu_fwd(dev, pre2, y2, n * out));
            }
            size_t yb = (size_t)(n * out) * (b16 ? 2 : 4), xb = (size_t)(n * in) * (b16 ? 2 : 4);
            CHECK_MSG(!memcmp(pre1, pre2, yb) && !memcmp(y1, y2, yb), "linear_gelu_fwd "
                      "%lldx%lldx%lld %s: not the bits of the product and the GELU",
                      (long long)n, (long long)out, (long long)in, gp_dtype_name(dt));
            /* the backward's reference: the data product, then GELU's
             * backward from the GELU's input into a tensor of its own */
            float *d = dalloc(dev, n * in);
            if (b16) {
                CHECK_OK(gp_dev_linear_bwd_data_bf16(dev, n, out, in, dy16, w, (uint16_t *)d));
                CHECK_OK(gp_dev_act_bf16(dev, GP_ACT_GELU, gin16, (uint16_t *)d,
                                         (uint16_t *)dx2, n * in, 0.0f));
            } else {
                CHECK_OK(gp_dev_gemm_wb(dev, 0, 0, n, in, out, 1.0f, fdy, out, w, in, 0.0f, d,
                                        in));
                CHECK_OK(gp_dev_gelu_bwd(dev, gin, d, dx2, n * in));
            }
            CHECK_MSG(!memcmp(dx1, dx2, xb), "linear_gelu_bwd_data %lldx%lldx%lld %s: not the "
                      "bits of the product and GELU's backward", (long long)n, (long long)out,
                      (long long)in, gp_dtype_name(dt));
            dfree(dev, d, n * in);
            if (gin16) dfree(dev, (float *)gin16, n * in);
            dfree(dev, fx, n * in); dfree(dev, fdy, n * out);
            dfree(dev, (float *)x16, (n * in + 1) / 2); dfree(dev, (float *)dy16, (n * out + 1) / 2);
            dfree(dev, w, out * in); dfree(dev, bias, out); dfree(dev, gin, n * in);
            float *ys[] = {pre1, y1, pre2, y2};
            for (int k = 0; k < 4; k++) dfree(dev, ys[k], n * out);
            dfree(dev, dx1, n * in); dfree(dev, dx2, n * in);
        }
}

/* RMSNorm's slots (issue 66) on bf16 storage: the FP32 slots' arithmetic
 * on the widened values, y and dx rounded once, rstd and dw bit for bit;
 * one launch each. */
static void test_rms_bf16(gp_device *dev)
{
    const int64_t rows = 9, c = 21, n = rows * c;
    float *fx, *fdy;
    uint16_t *x = b16rand(dev, n, &fx), *dy = b16rand(dev, n, &fdy);
    float *w = drand(dev, c), *y1 = dalloc(dev, n), *dx1 = dalloc(dev, n);
    uint16_t *y2 = (uint16_t *)dalloc(dev, n), *dx2 = (uint16_t *)dalloc(dev, n);
    float *r1 = dalloc(dev, rows), *r2 = dalloc(dev, rows);
    float *dw1 = drand(dev, c), *dw2 = dalloc(dev, c);
    memcpy(dw2, dw1, sizeof(float) * (size_t)c);
    CHECK_OK(gp_dev_rms_norm_fwd(dev, GP_F32, fx, w, y1, r1, rows, c, 1e-5f));
    CHECK_OK(gp_dev_rms_norm_bwd_data(dev, GP_F32, fx, w, r1, fdy, dx1, rows, c));
    CHECK_OK(gp_dev_rms_norm_bwd_weights(dev, GP_F32, fx, r1, fdy, dw1, rows, c));
    uint64_t l0 = gp_dev_launches(dev);
    CHECK_OK(gp_dev_rms_norm_fwd(dev, GP_BF16, x, w, y2, r2, rows, c, 1e-5f));
    CHECK_OK(gp_dev_rms_norm_bwd_data(dev, GP_BF16, x, w, r2, dy, dx2, rows, c));
    CHECK_OK(gp_dev_rms_norm_bwd_weights(dev, GP_BF16, x, r2, dy, dw2, rows, c));
    CHECK(gp_dev_launches(dev) - l0 == 3);
    check_bits("bf16 rms_norm y", y2, y1, n);
    check_bits("bf16 rms_norm dx", dx2, dx1, n);
    CHECK_MSG(!memcmp(r1, r2, sizeof(float) * (size_t)rows) &&
                  !memcmp(dw1, dw2, sizeof(float) * (size_t)c),
              "bf16 rms_norm: rstd or dw not the FP32 slots' bits on the widened values");
    /* swiglu (issue 66) on the same rows as (rows, 2 h): bf16 is the FP32
     * slots' arithmetic on the widened values, rounded once */
    const int64_t h = c / 2 + 1, nh = rows * h;
    float *sy = dalloc(dev, nh), *sdx = dalloc(dev, 2 * nh);
    uint16_t *sy16 = (uint16_t *)dalloc(dev, nh), *sdx16 = (uint16_t *)dalloc(dev, 2 * nh);
    const int64_t rr = n / (2 * h); /* rows of (2 h) inside x */
    CHECK_OK(gp_dev_swiglu_fwd(dev, GP_F32, fx, sy, rr, h));
    CHECK_OK(gp_dev_swiglu_bwd(dev, GP_F32, fx, fdy, sdx, rr, h));
    CHECK_OK(gp_dev_swiglu_fwd(dev, GP_BF16, x, sy16, rr, h));
    CHECK_OK(gp_dev_swiglu_bwd(dev, GP_BF16, x, dy, sdx16, rr, h));
    check_bits("bf16 swiglu y", sy16, sy, rr * h);
    check_bits("bf16 swiglu dx", sdx16, sdx, rr * 2 * h);
    /* rope (issue 66) on the same values as 3 sequences of 3 positions of
     * 21 = (2 + 2 * 1) heads of 4 and 5 untouched: bf16 is the FP32 slot's
     * arithmetic on the widened values, rounded once; in place (y == x) the
     * same as apart; the inverse turns the FP32 result back within
     * rounding, and v's columns are copied */
    gp_rope_desc rd = {.rows = 3, .t = 3, .pos0 = 5, .width = c, .heads = 4, .d = 4};
    rd.inv_freq[0] = 1.0f, rd.inv_freq[1] = 0.01f;
    float *ry = dalloc(dev, n), *rb = dalloc(dev, n), *rin = dalloc(dev, n);
    uint16_t *ry16 = (uint16_t *)dalloc(dev, n), *rip16 = (uint16_t *)dalloc(dev, n);
    uint64_t l1 = gp_dev_launches(dev);
    CHECK_OK(gp_dev_rope(dev, GP_F32, &rd, false, fx, ry));
    CHECK(gp_dev_launches(dev) - l1 == 1);
    CHECK_OK(gp_dev_rope(dev, GP_BF16, &rd, false, x, ry16));
    check_bits("bf16 rope y", ry16, ry, n);
    memcpy(rip16, x, sizeof(uint16_t) * (size_t)n);
    CHECK_OK(gp_dev_rope(dev, GP_BF16, &rd, false, rip16, rip16));
    CHECK_MSG(!memcmp(rip16, ry16, sizeof(uint16_t) * (size_t)n), "rope in place differs");
    memcpy(rin, ry, sizeof(float) * (size_t)n);
    CHECK_OK(gp_dev_rope(dev, GP_F32, &rd, true, rin, rb));
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)rb[i] - fx[i]));
    CHECK_MSG(worst < 1e-6, "rope's inverse does not turn it back: %g", worst);
    for (int64_t r = 0; r < 9; r++)
        for (int64_t j = 16; j < c; j++) CHECK(ry[r * c + j] == fx[r * c + j]);
    CHECK(ry[0] != fx[0] || ry[2] != fx[2]); /* position 5 turned something */
    dfree(dev, ry, n); dfree(dev, rb, n); dfree(dev, rin, n);
    dfree(dev, (float *)ry16, n); dfree(dev, (float *)rip16, n);
    dfree(dev, sy, nh); dfree(dev, sdx, 2 * nh);
    dfree(dev, (float *)sy16, nh); dfree(dev, (float *)sdx16, 2 * nh);
    dfree(dev, fx, n); dfree(dev, fdy, n);
    dfree(dev, (float *)x, (n + 1) / 2); dfree(dev, (float *)dy, (n + 1) / 2);
    dfree(dev, w, c); dfree(dev, y1, n); dfree(dev, dx1, n);
    dfree(dev, (float *)y2, n); dfree(dev, (float *)dx2, n);
    dfree(dev, r1, rows); dfree(dev, r2, rows); dfree(dev, dw1, c); dfree(dev, dw2, c);
}

/* A device allocation the backend refuses (a cudaMalloc past what is
 * free, which a workspace search then halves and tries again) leaves the
 * allocator as it was, its peaks too: they were raised by the reservation
 * and reported memory never held (64 TiB in a step's peak_bytes). */
static gp_status refusing_alloc(gp_device *dev, size_t bytes, gp_mem_category cat, void **out)
{
    (void)dev, (void)bytes, (void)cat, (void)out;
    return gp_error_set(GP_ERR_OOM, "the backend has none");
}

static void test_refused_alloc_peak(void)
{
    gp_device_iface iface = {0};
    iface.alloc = refusing_alloc;
    gp_device dev = {0};
    dev.iface = &iface;
    gp_allocator_init(&dev.alloc, "fake:0", 0); /* no capacity: the backend decides */
    void *p = &dev;
    CHECK_ERR(gp_dev_alloc(&dev, (size_t)1 << 46, GP_MEM_WORKSPACE, &p), GP_ERR_OOM, "has none");
    CHECK_MSG(p == NULL && dev.alloc.current == 0 && dev.alloc.live_blocks == 0 &&
                  dev.alloc.peak == 0 && dev.alloc.peak_by[GP_MEM_WORKSPACE] == 0,
              "a refused allocation left current %zu, peak %zu, workspace peak %zu",
              dev.alloc.current, dev.alloc.peak, dev.alloc.peak_by[GP_MEM_WORKSPACE]);
    gp_allocator_destroy(&dev.alloc);
}

int main(void)
{
    gp_log_set_level(GP_LOG_WARN);
    unsetenv("GPIPE_CPU_KEEP_BLOCKS"); /* test_blocked checks the device's blocks */
    test_algo_pick();
    test_refused_alloc_peak();
    gp_device *dev = NULL, *blk = NULL;
    gp_device_opts o = {.threads = 2};
    if (gp_device_open("cpu:0", &o, &dev) != GP_OK) {
        fprintf(stderr, "cannot open cpu:0: %s\n", gp_last_error());
        return 1;
    }
    gp_device_bind_thread(dev);
    CHECK(!strcmp(dev->iface->backend_name, "cpu"));
    CHECK(dev->iface->version == GP_DEVICE_IFACE_VERSION);
    test_iface_version(dev);
    test_optional_slots(dev);

    test_elementwise(dev);
    test_sgd(dev);
    test_sgd_multi(dev);
    test_adam(dev);
    test_mirrors(dev);
    test_update_check(dev);
    test_update_clip(dev);
    test_dropout(dev);
    test_unet_ops(dev);
    test_block_starts(dev);
    test_gemm(dev);
    test_softmax_xent(dev);
    test_xent_exp(dev);
    test_add_norm(dev);
    test_rms_bf16(dev);
    test_linear_gelu(dev, false);
    test_linear_bwd_weights_empty(dev);
    test_gelu_values(dev);
    test_pool(dev);
    test_bn(dev);
    test_conv(dev);
    test_blocked(dev);
    test_frozen_weights(dev);

    /* The same convolutions with blocked layouts forced everywhere. */
    setenv("GPIPE_CPU_CONV", "blocked", 1);
    CHECK_OK(gp_device_open("cpu:1", &o, &blk));
    unsetenv("GPIPE_CPU_CONV");
    if (blk) {
        test_conv(blk);
        test_frozen_weights(blk);
        test_copies(dev, blk);
    }
    test_copy_async(dev);
    test_copy_checker();
    test_copy_to_host(dev);
    test_bf16();
    test_bf16_convert(dev);
    test_marks(dev);
    test_host_waits(dev);
    test_nonfinite_or(dev);
    test_nonfinite_or_many(dev);
    test_box_collapse(dev);
    test_step_slots(dev);
    test_bn_commit_pending(dev);

    test_memory();
    test_concurrent();

    gp_device_close(blk);
    CHECK(dev->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0);
    gp_device_close(dev);
    return gpt_finish("test_backend");
}
