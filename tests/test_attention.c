/*
 * test_attention.c — the causal multi-head self-attention layer
 * (layers/attention.c) and its CPU kernel (backend/cpu/cpu_attention.c).
 *
 *   - forward against naive loops in double precision (the full T x T
 *     softmax with the causal mask) on odd shapes: T not a multiple of the
 *     tiles (37, 70, 100, 129), T = 1, heads 1 and 3, head dims 5 and 8,
 *     extra batch axes (N, 1, T, 3C);
 *   - backward (dq, dk, dv in one (N, T, 3C) gradient) against central
 *     finite differences of that reference;
 *   - causality: changing token t's q, k and v changes no output before t
 *     (bit for bit) and does change output t;
 *   - determinism: the same bits for the whole batch and for any split of
 *     it into micro-batches, on 1 and 2 threads, and on recompute;
 *   - memory: what a forward keeps is the rows' log-sum-exp, N H T floats
 *     (gp_saved_bytes and the layer's saved_bytes agree), linear in T;
 *   - spec errors: heads not dividing C, an input without the T axis; the
 *     YAML form and its errors at file:line:column;
 *   - bf16 storage: the bf16 slots' y, lse and dx bit for bit the storage
 *     adapter's (the FP32 kernel on widened values, rounded once);
 *   - the KV cache (attn_cached, sampling): the positions fed in chunks of
 *     3, 1, 1, 2, ... against a cache give attn_fwd's outputs over the
 *     whole sequence bit for bit, FP32 and bf16, on 1 and 2 threads, and
 *     the cache holds each position's k and v as they were.
 * The pipeline on two devices against one is in test_pipeline.c.
 */
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_impl.h" /* gp_cpu_isa_has */
#include "layers/layers_impl.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static gp_device *dev1, *dev2; /* 1 and 2 math threads */

/* Values in [-amp, amp) from a counter-based stream. */
static float *rand_vals(int64_t n, uint64_t stream, float amp)
{
    float *v = malloc((size_t)n * sizeof *v);
    gp_rng_uniform_fill(21, stream, 0, v, n);
    for (int64_t q = 0; q < n; q++) v[q] = (v[q] * 2 - 1) * amp;
    return v;
}

/* The reference: y (b, t, c) of x (b, t, 3c) in double, the full masked
 * softmax per (row, head, query). */
static void ref_attention(const double *x, double *y, int64_t b, int64_t t, int64_t h,
                          int64_t c, int64_t kv)
{
    /* grouped (kv < h): x (b, t, c + 2 kv d), query head hh reading k and
     * v head hh / (h / kv) */
    if (kv == 0) kv = h;
    int64_t d = c / h, R = c + 2 * kv * d;
    double *p = malloc((size_t)t * sizeof *p);
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t hh = 0; hh < h; hh++)
            for (int64_t i = 0; i < t; i++) {
                const double *q = x + (bi * t + i) * R + hh * d;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = x + (bi * t + j) * R + c + hh / (h / kv) * d;
                    double s = 0;
                    for (int64_t e = 0; e < d; e++) s += q[e] * k[e];
                    p[j] = s / sqrt((double)d);
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
                double *yi = y + (bi * t + i) * c + hh * d;
                for (int64_t e = 0; e < d; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= i; j++)
                        acc += p[j] * x[(bi * t + j) * R + c + kv * d + hh / (h / kv) * d + e];
                    yi[e] = acc / sum;
                }
            }
    free(p);
}

static gp_fwd_ctx train_ctx(void)
{
    gp_fwd_ctx ctx = {.training = true, .seed = 5, .batch_total = 1};
    return ctx;
}

/* An attention layer of `heads` for input (rows, t, 3c) (extra: as
 * (rows, 1, t, 3c)) on dev. */
static bool make_layer_kv(gp_device *dev, int64_t t, int64_t c, int64_t heads, int64_t kv,
                          bool extra, gp_layer *l)
{
    gp_layer_spec sp = gp_layer_spec_default(GP_LAYER_ATTENTION);
    sp.heads = heads;
    sp.kv_heads = kv;
    int64_t w = c + 2 * (kv ? kv : heads) * (c / heads);
    gp_shape in = extra ? gp_shape_4d(1, 1, t, w) : (gp_shape){3, {1, t, w, 0}};
    gp_status s = gp_layer_create(&sp, 0, &in, dev, 7, l);
    CHECK_MSG(s == GP_OK, "create: %s", gp_last_error());
    return s == GP_OK;
}

static bool make_layer(gp_device *dev, int64_t t, int64_t c, int64_t heads, bool extra,
                       gp_layer *l)
{
    return make_layer_kv(dev, t, c, heads, 0, extra, l);
}

static gp_shape in_shape(const gp_layer *l, int64_t rows)
{
    gp_shape s = l->in_shape;
    s.dims[0] = rows;
    return s;
}

/* Forward of x (host) on l: y and the saved state's log-sum-exp on the host
 * (either may be NULL), the saved bytes in *saved. */
static void run_fwd(gp_layer *l, const float *xh, int64_t rows, bool recompute, float **yh,
                    float **lse, size_t *saved)
{
    gp_fwd_ctx ctx = train_ctx();
    ctx.recompute = recompute;
    gp_shape xs = in_shape(l, rows);
    gp_tensor x = gpt_upload(l->dev, &xs, xh), y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(l, &ctx, &x, &y, &s));
    if (yh) *yh = gpt_download(&y);
    if (lse) *lse = gpt_download(&s.t[0]);
    if (saved) *saved = gp_saved_bytes(&s);
    gp_saved_free(&s);
    gp_tensor_free(&y);
    gp_tensor_free(&x);
}

/* Forward then backward of x with output gradient dyh: dx on the host. */
static float *run_bwd(gp_layer *l, const float *xh, const float *dyh, int64_t rows)
{
    gp_fwd_ctx ctx = train_ctx();
    gp_shape xs = in_shape(l, rows);
    gp_tensor x = gpt_upload(l->dev, &xs, xh), y = {0}, dx = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(l, &ctx, &x, &y, &s));
    gp_shape ys = gp_tensor_shape(&y);
    gp_tensor dy = gpt_upload(l->dev, &ys, dyh);
    CHECK_OK(gp_layer_backward(l, &ctx, &x, &y, &dy, &dx, &s));
    float *dxh = gpt_download(&dx);
    gp_saved_free(&s);
    gp_tensor_free(&dy);
    gp_tensor_free(&dx);
    gp_tensor_free(&y);
    gp_tensor_free(&x);
    return dxh;
}

typedef struct shape_case {
    int64_t b, t, c, heads;
    bool extra;
    int64_t kv; /* grouped-query: k's and v's heads (0: heads) */
} shape_case;

/* x's last axis: q's c, then k's and v's heads. */
static int64_t x_width(const shape_case *sc)
{
    return sc->c + 2 * (sc->kv ? sc->kv : sc->heads) * (sc->c / sc->heads);
}

static const shape_case cases[] = {
    {2, 37, 15, 3, false, 0},  /* head dim 5, one partial query tile */
    {1, 1, 15, 3, false, 0},   /* T = 1 */
    {3, 5, 4, 1, false, 0},    /* one head of 4 */
    {2, 70, 5, 1, false, 0},   /* head dim 5, T past one key tile */
    {1, 100, 24, 3, true, 0},  /* head dim 8 (the dot product's lanes), extra batch axis */
    {2, 129, 10, 1, false, 0}, /* head dim 10, T one past two key tiles */
    /* grouped-query attention (issue 66): 4 query heads of 3 over 2 k, v
     * heads; 4 of 4 over one (multi-query), T past a key tile; 6 of 8 over
     * 3, T past two */
    {2, 37, 12, 4, false, 2},
    {1, 70, 16, 4, false, 1},
    {2, 129, 48, 6, true, 3},
};

static void forward_reference(void)
{
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const shape_case *sc = &cases[k];
        gp_layer l;
        if (!make_layer_kv(dev2, sc->t, sc->c, sc->heads, sc->kv, sc->extra, &l)) continue;
        int64_t nx = sc->b * sc->t * x_width(sc), ny = sc->b * sc->t * sc->c;
        float *xh = rand_vals(nx, 100 + k, 2.0f), *yh;
        double *xd = malloc((size_t)nx * sizeof *xd), *yd = malloc((size_t)ny * sizeof *yd);
        for (int64_t q = 0; q < nx; q++) xd[q] = xh[q];
        ref_attention(xd, yd, sc->b, sc->t, sc->heads, sc->c, sc->kv);
        run_fwd(&l, xh, sc->b, false, &yh, NULL, NULL);
        double worst = 0; /* the error over FP32's |y| 2^-24 (x in [-2, 2): |y| < 2) */
        for (int64_t q = 0; q < ny; q++) {
            double e = fabs(yh[q] - yd[q]) / (2e-7 * (1 + fabs(yd[q])));
            if (e > worst || isnan(yh[q])) worst = isnan(yh[q]) ? INFINITY : e;
        }
        CHECK_MSG(worst < 16, "b %lld t %lld c %lld heads %lld: worst error %g x 2e-7 (1 + |y|)",
                  (long long)sc->b, (long long)sc->t, (long long)sc->c, (long long)sc->heads,
                  worst);
        free(xh);
        free(yh);
        free(xd);
        free(yd);
        gp_layer_destroy(&l);
    }
}

/* dx against central differences of sum(r y(x)) on the double reference,
 * at every element of x. */
static void backward_fd(void)
{
    const shape_case fd[] = {{2, 37, 15, 3, false, 0}, {1, 70, 5, 1, false, 0}, {1, 1, 6, 3, false, 0},
                             {2, 37, 12, 4, false, 2}, {1, 70, 8, 4, false, 1}};
    for (size_t k = 0; k < sizeof fd / sizeof *fd; k++) {
        const shape_case *sc = &fd[k];
        gp_layer l;
        if (!make_layer_kv(dev2, sc->t, sc->c, sc->heads, sc->kv, false, &l)) continue;
        int64_t nx = sc->b * sc->t * x_width(sc), ny = sc->b * sc->t * sc->c;
        float *xh = rand_vals(nx, 200 + k, 1.5f), *rh = rand_vals(ny, 300 + k, 1.0f);
        float *dx = run_bwd(&l, xh, rh, sc->b);
        double *xd = malloc((size_t)nx * sizeof *xd), *yd = malloc((size_t)ny * sizeof *yd);
        for (int64_t q = 0; q < nx; q++) xd[q] = xh[q];
        int bad = 0;
        double worst = 0, eps = 1e-5;
        for (int64_t q = 0; q < nx; q++) {
            double f[2];
            for (int side = 0; side < 2; side++) {
                xd[q] = (double)xh[q] + (side ? -eps : eps);
                ref_attention(xd, yd, sc->b, sc->t, sc->heads, sc->c, sc->kv);
                f[side] = 0;
                for (int64_t o = 0; o < ny; o++) f[side] += rh[o] * yd[o];
            }
            xd[q] = xh[q];
            double g = (f[0] - f[1]) / (2 * eps), e = fabs(dx[q] - g);
            if (e > worst) worst = e;
            if (!(e <= 2e-4 + 1e-3 * fabs(g)) && bad++ < 3)
                fprintf(stderr, "  t %lld c %lld heads %lld: dx[%lld] %.7g, differences %.7g\n",
                        (long long)sc->t, (long long)sc->c, (long long)sc->heads, (long long)q,
                        (double)dx[q], g);
        }
        CHECK_MSG(bad == 0, "t %lld heads %lld: %d of %lld gradients off (worst %g)",
                  (long long)sc->t, (long long)sc->heads, bad, (long long)nx, worst);
        free(xh);
        free(rh);
        free(dx);
        free(xd);
        free(yd);
        gp_layer_destroy(&l);
    }
}

static void causality(void)
{
    const int64_t b = 2, t = 75, c = 12, heads = 3;
    gp_layer l;
    if (!make_layer(dev2, t, c, heads, false, &l)) return;
    int64_t nx = b * t * 3 * c;
    float *xh = rand_vals(nx, 400, 1.0f), *ya, *yb;
    run_fwd(&l, xh, b, false, &ya, NULL, NULL);
    const int64_t ts[] = {0, 31, 32, 64, 74};
    for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) {
        int64_t at = ts[k];
        float *x2 = malloc((size_t)nx * sizeof *x2);
        memcpy(x2, xh, (size_t)nx * sizeof *x2);
        for (int64_t bi = 0; bi < b; bi++)
            for (int64_t e = 0; e < 3 * c; e++) x2[(bi * t + at) * 3 * c + e] += 0.5f;
        run_fwd(&l, x2, b, false, &yb, NULL, NULL);
        bool before = true, at_t = true;
        for (int64_t bi = 0; bi < b; bi++) {
            const float *pa = ya + bi * t * c, *pb = yb + bi * t * c;
            if (memcmp(pa, pb, (size_t)(at * c) * sizeof *pa)) before = false;
            if (!memcmp(pa + at * c, pb + at * c, (size_t)c * sizeof *pa)) at_t = false;
        }
        CHECK_MSG(before, "changing token %lld changed an output before it", (long long)at);
        CHECK_MSG(at_t, "changing token %lld left its own output unchanged", (long long)at);
        free(x2);
        free(yb);
    }
    free(xh);
    free(ya);
    gp_layer_destroy(&l);
}

/* The same bits for the whole batch, its micro-batches, 1 or 2 threads and
 * a recompute: y, the saved log-sum-exp and dx. */
static void determinism(void)
{
    const int64_t b = 5, t = 67, c = 15, heads = 3;
    gp_layer l1, l2;
    if (!make_layer(dev1, t, c, heads, false, &l1)) return;
    if (!make_layer(dev2, t, c, heads, false, &l2)) {
        gp_layer_destroy(&l1);
        return;
    }
    int64_t px = t * 3 * c, py = t * c, pl = heads * t;
    float *xh = rand_vals(b * px, 500, 2.0f), *dyh = rand_vals(b * py, 501, 1.0f);
    float *y, *lse, *y1, *lse1, *yr, *lser;
    run_fwd(&l2, xh, b, false, &y, &lse, NULL);
    run_fwd(&l1, xh, b, false, &y1, &lse1, NULL);
    run_fwd(&l2, xh, b, true, &yr, &lser, NULL);
    CHECK_MSG(!memcmp(y, y1, (size_t)(b * py) * sizeof *y) &&
                  !memcmp(lse, lse1, (size_t)(b * pl) * sizeof *lse),
              "1 and 2 threads differ");
    CHECK_MSG(!memcmp(y, yr, (size_t)(b * py) * sizeof *y) &&
                  !memcmp(lse, lser, (size_t)(b * pl) * sizeof *lse),
              "recompute differs");
    float *dx = run_bwd(&l2, xh, dyh, b), *dx1 = run_bwd(&l1, xh, dyh, b);
    CHECK_MSG(!memcmp(dx, dx1, (size_t)(b * px) * sizeof *dx), "dx: 1 and 2 threads differ");
    /* micro-batches of 2, 1, 2 rows */
    const int64_t split[] = {2, 1, 2};
    bool fwd = true, bwd = true;
    for (int64_t k = 0, at = 0; k < 3; at += split[k], k++) {
        float *ym, *lm;
        run_fwd(&l2, xh + at * px, split[k], false, &ym, &lm, NULL);
        float *dxm = run_bwd(&l2, xh + at * px, dyh + at * py, split[k]);
        if (memcmp(ym, y + at * py, (size_t)(split[k] * py) * sizeof *y) ||
            memcmp(lm, lse + at * pl, (size_t)(split[k] * pl) * sizeof *lse))
            fwd = false;
        if (memcmp(dxm, dx + at * px, (size_t)(split[k] * px) * sizeof *dx)) bwd = false;
        free(ym);
        free(lm);
        free(dxm);
    }
    CHECK_MSG(fwd, "micro-batches' y or log-sum-exp differ from the whole batch's");
    CHECK_MSG(bwd, "micro-batches' dx differs from the whole batch's");
    free(xh);
    free(dyh);
    free(y);
    free(lse);
    free(y1);
    free(lse1);
    free(yr);
    free(lser);
    free(dx);
    free(dx1);
    gp_layer_destroy(&l1);
    gp_layer_destroy(&l2);
}

/* What a forward keeps: N H T floats, linear in T (the T x T scores of a
 * plain implementation would be N H T^2). */
static void saved_memory(void)
{
    const int64_t b = 2, c = 12, heads = 3;
    size_t got[2];
    const int64_t ts[2] = {256, 1024};
    for (int k = 0; k < 2; k++) {
        gp_layer l;
        if (!make_layer(dev2, ts[k], c, heads, false, &l)) return;
        float *xh = rand_vals(b * ts[k] * 3 * c, 600, 1.0f);
        run_fwd(&l, xh, b, false, NULL, NULL, &got[k]);
        size_t want = (size_t)(b * heads * ts[k]) * sizeof(float);
        CHECK_MSG(got[k] == want, "T %lld: saved %zu bytes, want N H T floats = %zu",
                  (long long)ts[k], got[k], want);
        CHECK_MSG(l.ops->saved_bytes && l.ops->saved_bytes(&l, b) == got[k],
                  "T %lld: saved_bytes says %zu, the forward kept %zu", (long long)ts[k],
                  l.ops->saved_bytes ? l.ops->saved_bytes(&l, b) : 0, got[k]);
        free(xh);
        gp_layer_destroy(&l);
    }
    CHECK_MSG(got[1] == 4 * got[0], "saved %zu bytes at T 256, %zu at T 1024: not linear in T",
              got[0], got[1]);
}

/* Eval keeps nothing, and the output equals the training forward's. */
static void eval_mode(void)
{
    gp_layer l;
    if (!make_layer(dev2, 20, 6, 2, false, &l)) return;
    float *xh = rand_vals(3 * 20 * 18, 700, 1.0f), *yt;
    run_fwd(&l, xh, 3, false, &yt, NULL, NULL);
    gp_fwd_ctx ctx = {.training = false};
    gp_shape xs = in_shape(&l, 3);
    gp_tensor x = gpt_upload(dev2, &xs, xh), y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &s));
    float *ye = gpt_download(&y);
    CHECK(gp_saved_bytes(&s) == 0);
    CHECK(!memcmp(ye, yt, (size_t)(3 * 20 * 6) * sizeof *ye));
    free(xh);
    free(yt);
    free(ye);
    gp_saved_free(&s);
    gp_tensor_free(&x);
    gp_tensor_free(&y);
    gp_layer_destroy(&l);
}

static void spec_errors(void)
{
    gp_layer l;
    gp_layer_spec sp = gp_layer_spec_default(GP_LAYER_ATTENTION);
    sp.heads = 4;
    gp_shape in = {3, {1, 8, 18, 0}}; /* C = 6 */
    CHECK_ERR(gp_layer_shapes(&sp, 2, &in, &l), GP_ERR_INVALID, "heads = 4 does not divide C = 6");
    sp.heads = 1;
    gp_shape flat = gp_shape_2d(1, 18);
    CHECK_ERR(gp_layer_shapes(&sp, 2, &flat, &l), GP_ERR_INVALID, "(N, T, 3C)");
    gp_shape odd = {3, {1, 8, 17, 0}};
    CHECK_ERR(gp_layer_shapes(&sp, 2, &odd, &l), GP_ERR_INVALID, "not a multiple of 3");
    sp.heads = 2;
    CHECK_OK(gp_layer_shapes(&sp, 2, &in, &l));
    CHECK(l.out_shape.ndim == 3 && l.out_shape.dims[1] == 8 && l.out_shape.dims[2] == 6);
    gp_layer_type t;
    CHECK(gp_layer_type_parse("attention", &t) && t == GP_LAYER_ATTENTION);
}

/* The YAML form: attention: {heads: H}, and its errors at file:line:column. */
static void config_yaml(void)
{
    const char *good = "model:\n"
                       "  input: [1, 8, 12]\n"
                       "  layers:\n"
                       "    - attention: {heads: 2}\n"
                       "    - flatten\n"
                       "    - linear: {out: 5}\n";
    gp_config c;
    gp_status gs = gp_config_parse("att.yaml", good, strlen(good), NULL, 0, &c);
    CHECK_MSG(gs == GP_OK, "%s", gp_last_error());
    if (gs == GP_OK) {
        CHECK(c.model.layers[0].type == GP_LAYER_ATTENTION && c.model.layers[0].heads == 2);
        gp_config_free(&c);
    }
    const char *zero = "model:\n"
                       "  input: [1, 8, 12]\n"
                       "  layers:\n"
                       "    - attention: {heads: 0}\n";
    CHECK_ERR(gp_config_parse("att.yaml", zero, strlen(zero), NULL, 0, &c), GP_ERR_INVALID,
              "att.yaml:4:26: model.layers.0.heads must be >= 1");
    const char *three = "model:\n"
                        "  input: [1, 8, 12]\n"
                        "  layers:\n"
                        "    - attention: {heads: 3}\n";
    gs = gp_config_parse("att.yaml", three, strlen(three), NULL, 0, &c);
    CHECK_MSG(gs == GP_OK, "%s", gp_last_error());
    if (gs == GP_OK) { /* the shapes are checked when the model is built */
        gp_model m;
        CHECK_ERR(gp_model_build(&c, dev2, &m), GP_ERR_INVALID,
                  "layer 0 (attention) at att.yaml:4:7: heads = 3 does not divide C = 4");
        gp_config_free(&c);
    }
}

/* bf16 storage (attn_fwd_bf16 / attn_bwd_bf16, the CPU's own): y, lse and
 * dx bit for bit the storage adapter's, the FP32 kernel on the widened
 * values with each output rounded once, on the shapes above (head dims
 * past and short of a vector, T past a tile), on 1 and 2 threads. */
static void bf16_storage(void)
{
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int th = 0; th < 2; th++) {
            const shape_case *sc = &cases[k];
            gp_device *dev = th ? dev2 : dev1;
            int64_t b = sc->b, t = sc->t, c = sc->c, hh = sc->heads;
            int64_t kv = sc->kv ? sc->kv : hh;
            int64_t nx = b * t * x_width(sc), ny = b * t * c, nl = b * hh * t;
            float *xf = rand_vals(nx, 500 + k, 2.0f), *dyf = rand_vals(ny, 600 + k, 1.0f);
            uint16_t *x = malloc((size_t)nx * 2), *dy = malloc((size_t)ny * 2);
            uint16_t *y = malloc((size_t)ny * 2), *dx = malloc((size_t)nx * 2);
            float *yf = malloc((size_t)ny * 4), *dxf = malloc((size_t)nx * 4);
            float *lse = malloc((size_t)nl * 4), *lsef = malloc((size_t)nl * 4);
            float *yr = malloc((size_t)ny * 4);
            for (int64_t q = 0; q < nx; q++) xf[q] = gp_ew_bf16_value(x[q] = gp_ew_bf16_bits(xf[q]));
            for (int64_t q = 0; q < ny; q++)
                dyf[q] = gp_ew_bf16_value(dy[q] = gp_ew_bf16_bits(dyf[q]));
            CHECK_OK(gp_dev_attn_fwd_bf16(dev, x, y, lse, b, t, hh, kv, c));
            CHECK_OK(gp_dev_attn_fwd(dev, xf, yf, lsef, b, t, hh, kv, c));
            int bad = 0;
            for (int64_t q = 0; q < ny; q++) {
                bad += y[q] != gp_ew_bf16_bits(yf[q]);
                yr[q] = gp_ew_bf16_value(y[q]); /* the y the backward reads */
            }
            CHECK_MSG(bad == 0 && !memcmp(lse, lsef, (size_t)nl * 4),
                      "bf16 forward, case %zu, %d thread(s): %d of %lld outputs differ from the "
                      "adapter's, lse %s", k, th + 1, bad, (long long)ny,
                      memcmp(lse, lsef, (size_t)nl * 4) ? "differs" : "same");
            CHECK_OK(gp_dev_attn_bwd_bf16(dev, x, y, lse, dy, dx, b, t, hh, kv, c));
            CHECK_OK(gp_dev_attn_bwd(dev, xf, yr, lse, dyf, dxf, b, t, hh, kv, c));
            bad = 0;
            for (int64_t q = 0; q < nx; q++) bad += dx[q] != gp_ew_bf16_bits(dxf[q]);
            CHECK_MSG(bad == 0, "bf16 backward, case %zu, %d thread(s): %d of %lld values of dx "
                      "differ from the adapter's", k, th + 1, bad, (long long)nx);
            free(xf);
            free(dyf);
            free(x);
            free(dy);
            free(y);
            free(dx);
            free(yf);
            free(dxf);
            free(lse);
            free(lsef);
            free(yr);
        }
}

static void cached(void)
{
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int v = 0; v < 4; v++) {
            const shape_case *sc = &cases[k];
            gp_device *dev = v & 1 ? dev2 : dev1;
            bool b16 = v >= 2;
            size_t es = b16 ? 2 : 4;
            int64_t b = sc->b, t = sc->t, c = sc->c, hh = sc->heads, R = x_width(sc);
            int64_t kv = sc->kv ? sc->kv : hh, KR = R - c, cap = t + 3;
            int64_t nx = b * t * R, ny = b * t * c;
            float *xf = rand_vals(nx, 700 + k, 2.0f), *yf = malloc((size_t)ny * 4);
            uint16_t *x16 = malloc((size_t)nx * 2), *y16 = malloc((size_t)ny * 2);
            char *chunk = malloc((size_t)(b * t * R) * es), *out = malloc((size_t)(b * t * c) * es);
            char *cache = calloc((size_t)(b * cap * KR), es);
            for (int64_t q = 0; q < nx; q++) xf[q] = gp_ew_bf16_value(x16[q] = gp_ew_bf16_bits(xf[q]));
            if (b16) CHECK_OK(gp_dev_attn_fwd_bf16(dev, x16, y16, NULL, b, t, hh, kv, c));
            else CHECK_OK(gp_dev_attn_fwd(dev, xf, yf, NULL, b, t, hh, kv, c));
            const char *x = b16 ? (const char *)x16 : (const char *)xf;
            const char *y = b16 ? (const char *)y16 : (const char *)yf;
            int64_t bad = 0, bad_kv = 0;
            static const int64_t plan[] = {3, 1, 1, 2, 1000};
            for (int64_t p = 0, i = 0; p < t; i++) {
                int64_t n = plan[i < 4 ? i : 4];
                if (n > t - p) n = t - p;
                for (int64_t bi = 0; bi < b; bi++) /* positions p .. p + n - 1 of each row */
                    memcpy(chunk + (size_t)(bi * n * R) * es, x + (size_t)((bi * t + p) * R) * es,
                           (size_t)(n * R) * es);
                CHECK_OK(gp_dev_attn_cached(dev, b16 ? GP_BF16 : GP_F32, chunk, cache, out, b, n,
                                            p, cap, hh, kv, c));
                for (int64_t bi = 0; bi < b; bi++)
                    bad += memcmp(out + (size_t)(bi * n * c) * es,
                                  y + (size_t)((bi * t + p) * c) * es, (size_t)(n * c) * es) != 0;
                p += n;
            }
            for (int64_t bi = 0; bi < b; bi++)
                for (int64_t j = 0; j < t; j++)
                    bad_kv += memcmp(cache + (size_t)((bi * cap + j) * KR) * es,
                                     x + (size_t)((bi * t + j) * R + c) * es, (size_t)KR * es) != 0;
            CHECK_MSG(bad == 0 && bad_kv == 0,
                      "cached attention, case %zu, %s, %d thread(s): %lld chunks differ from "
                      "attn_fwd's bits, %lld cache rows from x's k and v", k,
                      b16 ? "bf16" : "FP32", (v & 1) + 1, (long long)bad, (long long)bad_kv);
            free(xf);
            free(yf);
            free(x16);
            free(y16);
            free(chunk);
            free(out);
            free(cache);
        }
    /* past the cache: refused, naming the positions */
    float x[12] = {0}, kvc[8] = {0}, y[4];
    CHECK_ERR(gp_dev_attn_cached(dev1, GP_F32, x, kvc, y, 1, 1, 1, 1, 1, 1, 4), GP_ERR_INVALID,
              "past the cache's 1");
}

/* The kernels' two builds, 16-float vectors (AVX-512, where the processor
 * has it) and 8-float ones (AVX2 and the baseline), give the same bits:
 * forward, log-sum-exp and backward, FP32 and bf16, on head dims that fill
 * whole vectors of either (32, 64), leave a tail (24, 10) and the grouped
 * heads' layout, T past tiles and not a multiple of the query blocks. */
static void widths(void)
{
    if (!gp_cpu_att_w16_built() || !gp_cpu_isa_has(dnnl_cpu_isa_avx512_core)) {
        printf("test_attention: no AVX-512 %s; the 16-wide kernels were not compared\n",
               gp_cpu_att_w16_built() ? "here (the processor, or GPIPE_CPU_ISA)"
                                      : "clones in this build");
        return;
    }
    static const int64_t shapes[][5] = {{2, 133, 64, 2, 2}, {1, 70, 128, 2, 2},
                                        {2, 37, 48, 2, 2},  {1, 100, 40, 4, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
        for (int b16 = 0; b16 < 2; b16++) {
            const int64_t b = shapes[k][0], t = shapes[k][1], c = shapes[k][2];
            const int64_t hh = shapes[k][3], kv = shapes[k][4];
            att_dims a = att_dims_of(t, hh, kv, c);
            const int64_t nx = b * t * a.row, ny = b * t * c;
            const size_t es = b16 ? 2 : 4;
            float *xf = rand_vals(nx, 900 + k, 2.0f), *dyf = rand_vals(ny, 950 + k, 1.0f);
            uint16_t *x16 = malloc((size_t)nx * 2), *dy16 = malloc((size_t)ny * 2);
            for (int64_t q = 0; q < nx; q++) x16[q] = gp_ew_bf16_bits(xf[q]);
            for (int64_t q = 0; q < ny; q++) dy16[q] = gp_ew_bf16_bits(dyf[q]);
            const void *x = b16 ? (const void *)x16 : (const void *)xf;
            const void *dy = b16 ? (const void *)dy16 : (const void *)dyf;
            char *y[2], *dx[2];
            float *lse[2];
            int64_t nf = att_fwd_floats(&a, b16) > att_bwd_floats(&a, b16)
                             ? att_fwd_floats(&a, b16) : att_bwd_floats(&a, b16);
            float *buf = malloc((size_t)nf * sizeof *buf);
            for (int w = 0; w < 2; w++) {
                y[w] = calloc((size_t)ny, es);
                dx[w] = calloc((size_t)nx, es);
                lse[w] = calloc((size_t)(b * hh * t), sizeof(float));
                for (int64_t bi = 0; bi < b; bi++)
                    for (int64_t h = 0; h < hh; h++)
                        (w ? gp_cpu_att_fwd_w16 : gp_cpu_att_fwd_w8)(&a, x, y[w], lse[w], bi, h,
                                                                     buf, b16);
                for (int64_t bi = 0; bi < b; bi++)
                    for (int64_t g = 0; g < kv; g++)
                        (w ? gp_cpu_att_bwd_w16 : gp_cpu_att_bwd_w8)(&a, x, y[w], lse[w], dy,
                                                                     dx[w], bi, g, buf, b16);
            }
            CHECK_MSG(!memcmp(y[0], y[1], (size_t)ny * es) &&
                          !memcmp(lse[0], lse[1], (size_t)(b * hh * t) * sizeof(float)) &&
                          !memcmp(dx[0], dx[1], (size_t)nx * es),
                      "shape %zu, %s: the 8- and 16-wide kernels differ", k, b16 ? "bf16" : "FP32");
            for (int w = 0; w < 2; w++) {
                free(y[w]);
                free(dx[w]);
                free(lse[w]);
            }
            free(buf);
            free(xf);
            free(dyf);
            free(x16);
            free(dy16);
        }
}

int main(void)
{
    gp_device_opts o1 = {.threads = 1}, o2 = {.threads = 2};
    CHECK_OK(gp_device_open("cpu:0", &o1, &dev1));
    CHECK_OK(gp_device_open("cpu:1", &o2, &dev2));
    if (!dev1 || !dev2) return gpt_finish("test_attention");
    gp_device_bind_thread(dev2);
    forward_reference();
    backward_fd();
    causality();
    determinism();
    saved_memory();
    eval_mode();
    spec_errors();
    config_yaml();
    bf16_storage();
    cached();
    widths();
    gp_device_close(dev1);
    gp_device_close(dev2);
    return gpt_finish("test_attention");
}
