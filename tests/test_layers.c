/*
 * test_layers.c — every layer and the cross-entropy loss on a CPU device.
 *
 *   - forward against naive reference loops in double precision written
 *     here (linear, conv, batch norm train/eval, relu, pools, flatten,
 *     dropout with the mask recomputed from the core RNG, residual composed
 *     of the references), on odd shapes (batch 3, 5 channels, 7x9 images,
 *     stride 2, padding 1), with and without bias;
 *   - backward-data and backward-weights against central finite differences
 *     of L = sum(y * r) for a fixed random r, the forward in float and L
 *     accumulated in double; checked per element (atol + rtol) and on the
 *     norm of the whole sampled gradient vector;
 *   - dW += (two backward passes give twice one), weights-only backward
 *     equals the weights of a full backward;
 *   - dropout: micro-batch halves with sample_offset draw the full-batch
 *     mask, recompute reproduces it, eval is identity, keep fraction ~ 1-p;
 *   - batch norm: two uneven micro-batches + commit give the full-batch
 *     running statistics (unbiased variance, naive double reference);
 *     recompute leaves the accumulator alone; eval uses running statistics;
 *   - the U-Net layers (leaky_relu, dropout2d, instance_norm, upsample)
 *     through the same reference and finite-difference checks; dropout2d's
 *     mask constant over each plane and the same for any micro-batch split
 *     and recompute; instance norm per sample (a split changes nothing);
 *     upsample's backward the sum of each block;
 *   - binary cross-entropy with logits against a double reference, its
 *     gradient by finite differences, extreme logits, bad targets;
 *   - what AmoebaNet-D and torchvision's ResNets need: conv and pools with
 *     a kernel, stride and padding per axis (1x7, 7x1, ...) through the
 *     reference loops and finite differences; avgpool with and without
 *     count_include_pad against the reference and a case written out;
 *     factorized_reduce against torchgpipe's FactorizedReduce composed of
 *     the reference ops (shifted, zero-padded input included) and finite
 *     differences, its parameter names and counts, its norm's running
 *     statistics over micro-batches; kaiming_normal_fan_out init: moments
 *     of a large layer within statistical tolerance, bitwise the same on
 *     two devices, handed to the convolutions of composite layers;
 *   - parameter counts and names (torchvision BasicBlock), FLOPs and
 *     saved_bytes, shape-inference messages, a layer's description cut
 *     by a small buffer between characters (UTF-8 names and paths), init
 *     determinism and independence of placement, and no leaked device
 *     memory.
 */
#include "layers/layers_impl.h"
#include "test_util.h"
#include "test_ref.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the layer reference: dispatch on the type ---------------------------- */

/* P[p] = host copy of params[p] (double).  train: batch statistics. */
/* rope's frequency i of head size d in double, from the formulas
 * (Hugging Face's, Llama 3's scaling by wavelength), not gpipe's float
 * steps. */
static double ref_rope_freq(const gp_layer_spec *sp, int64_t i, int64_t d)
{
    double f = pow((double)sp->rope_theta, -2.0 * (double)i / (double)d);
    if (!sp->rope_llama3) return f;
    double wl = 2.0 * acos(-1.0) / f, orig = (double)sp->rope_orig_positions;
    double lo = (double)sp->rope_low_freq, hi = (double)sp->rope_high_freq;
    double k = (double)sp->rope_factor;
    if (wl < orig / hi) return f;    /* short wavelengths: as they were */
    if (wl > orig / lo) return f / k; /* long ones: slowed by the factor */
    double sm = (orig / wl - lo) / (hi - lo);
    return (1.0 - sm) * f / k + sm * f;
}

static void ref_forward(const gp_layer *l, double **P, bool train, const gp_fwd_ctx *ctx,
                        const gp_shape *xs, const double *x, double *y)
{
    const gp_layer_spec *sp = &l->spec;
    int64_t nx = gp_shape_numel(xs);
    switch (sp->type) {
    case GP_LAYER_LINEAR:
        /* (N, T, in): the N*T positions are the rows */
        ref_linear(nx / xs->dims[xs->ndim - 1], xs->dims[xs->ndim - 1], sp->out, x, P[0],
                   sp->bias ? P[1] : NULL, y);
        break;
    case GP_LAYER_CONV2D: {
        geom g = geom_of(xs, sp->out, sp->kernel, sp->stride, sp->padding);
        ref_conv(&g, x, P[0], sp->bias ? P[1] : NULL, y);
        break;
    }
    case GP_LAYER_BATCHNORM: {
        int64_t s = xs->ndim == 4 ? xs->dims[2] * xs->dims[3] : 1;
        ref_bn(xs->dims[0], xs->dims[1], s, sp->eps, x, P[0], P[1], train ? NULL : P[2],
               train ? NULL : P[3], y);
        break;
    }
    case GP_LAYER_RELU: ref_relu(nx, x, y); break;
    case GP_LAYER_MAXPOOL2D:
    case GP_LAYER_AVGPOOL2D: {
        gp_hw st = sp->stride.h || sp->stride.w ? sp->stride : sp->kernel;
        geom g = geom_of(xs, xs->dims[1], sp->kernel, st, sp->padding);
        ref_pool(&g, sp->type == GP_LAYER_MAXPOOL2D,
                 sp->type == GP_LAYER_AVGPOOL2D && sp->count_include_pad, x, y);
        break;
    }
    case GP_LAYER_GLOBAL_AVGPOOL: {
        int64_t s = xs->dims[2] * xs->dims[3];
        for (int64_t i = 0; i < xs->dims[0] * xs->dims[1]; i++) {
            double a = 0;
            for (int64_t j = 0; j < s; j++) a += x[i * s + j];
            y[i] = a / (double)s;
        }
        break;
    }
    case GP_LAYER_FLATTEN: memcpy(y, x, (size_t)nx * sizeof *y); break;
    case GP_LAYER_DROPOUT: {
        int64_t per = nx / xs->dims[0];
        uint64_t stream = gp_rng_stream(ctx->step, (uint64_t)l->index, 0x64726f70ull);
        for (int64_t i = 0; i < nx; i++) {
            double m = 1.0;
            if (train && sp->p > 0) {
                float u = gp_rng_uniform(ctx->seed, stream,
                                         (uint64_t)(ctx->sample_offset * per + i));
                m = u >= sp->p ? 1.0 / (1.0 - (double)sp->p) : 0.0;
            }
            y[i] = x[i] * m;
        }
        break;
    }
    case GP_LAYER_RESIDUAL: {
        geom g1 = geom_of(xs, sp->out, gp_hw_square(3), sp->stride, gp_hw_square(1));
        gp_shape ms = gp_shape_4d(xs->dims[0], sp->out, g1.oh, g1.ow);
        geom g2 = geom_of(&ms, sp->out, gp_hw_square(3), gp_hw_square(1), gp_hw_square(1));
        geom gd = geom_of(xs, sp->out, gp_hw_square(1), sp->stride, gp_hw_square(0));
        int64_t nm = gp_shape_numel(&ms), s = g1.oh * g1.ow, k = sp->out;
        double *a = calloc((size_t)nm, sizeof *a), *b = calloc((size_t)nm, sizeof *b);
        double *sc = calloc((size_t)nm, sizeof *sc);
        ref_conv(&g1, x, P[0], NULL, a);
        ref_bn(g1.n, k, s, sp->eps, a, P[1], P[2], train ? NULL : P[3], train ? NULL : P[4], b);
        ref_relu(nm, b, b);
        ref_conv(&g2, b, P[5], NULL, a);
        ref_bn(g1.n, k, s, sp->eps, a, P[6], P[7], train ? NULL : P[8], train ? NULL : P[9], y);
        if (l->n_params > 10) {
            ref_conv(&gd, x, P[10], NULL, a);
            ref_bn(g1.n, k, s, sp->eps, a, P[11], P[12], train ? NULL : P[13],
                   train ? NULL : P[14], sc);
        } else {
            memcpy(sc, x, (size_t)nm * sizeof *sc);
        }
        for (int64_t i = 0; i < nm; i++) y[i] = y[i] + sc[i] > 0 ? y[i] + sc[i] : 0.0;
        free(a);
        free(b);
        free(sc);
        break;
    }
    case GP_LAYER_FACTORIZED_REDUCE: {
        int64_t K = sp->out, OH = (xs->dims[2] + 1) / 2, OW = (xs->dims[3] + 1) / 2;
        double *cat = calloc((size_t)(xs->dims[0] * K * OH * OW), sizeof *cat);
        ref_fr_cat(xs, K, x, P[0], P[1], cat);
        ref_bn(xs->dims[0], K, OH * OW, sp->eps, cat, P[2], P[3], train ? NULL : P[4],
               train ? NULL : P[5], y);
        free(cat);
        break;
    }
    case GP_LAYER_LEAKY_RELU:
        for (int64_t i = 0; i < nx; i++) y[i] = x[i] > 0 ? x[i] : (double)sp->slope * x[i];
        break;
    case GP_LAYER_DROPOUT2D: {
        int64_t C = xs->dims[1], s = xs->dims[2] * xs->dims[3];
        for (int64_t n = 0; n < xs->dims[0]; n++)
            for (int64_t c = 0; c < C; c++) {
                double m = train && sp->p > 0 ? ref_dropout2d_mask(l, ctx, n, c, C) : 1.0;
                for (int64_t j = 0; j < s; j++) y[(n * C + c) * s + j] = x[(n * C + c) * s + j] * m;
            }
        break;
    }
    case GP_LAYER_INSTANCE_NORM:
        ref_instance_norm(xs->dims[0] * xs->dims[1], xs->dims[2] * xs->dims[3], sp->eps, x, y);
        break;
    case GP_LAYER_UPSAMPLE:
        ref_upsample(xs->dims[0] * xs->dims[1], xs->dims[2], xs->dims[3], sp->scale, x, y);
        break;
    case GP_LAYER_GELU: /* GPT-2's tanh form, in double */
        for (int64_t i = 0; i < nx; i++)
            y[i] = 0.5 * x[i] *
                   (1.0 + tanh(sqrt(2.0 / acos(-1.0)) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
        break;
    case GP_LAYER_LAYER_NORM: { /* each row of the last dimension, biased variance */
        int64_t c = xs->dims[xs->ndim - 1];
        for (int64_t r = 0; r < nx / c; r++) {
            const double *xr = x + r * c;
            double m = 0, v = 0;
            for (int64_t j = 0; j < c; j++) m += xr[j] / (double)c;
            for (int64_t j = 0; j < c; j++) v += (xr[j] - m) * (xr[j] - m) / (double)c;
            for (int64_t j = 0; j < c; j++)
                y[r * c + j] = (xr[j] - m) / sqrt(v + (double)sp->eps) * P[0][j] + P[1][j];
        }
        break;
    }
    case GP_LAYER_RMS_NORM: { /* Hugging Face's LlamaRMSNorm, in double */
        int64_t c = xs->dims[xs->ndim - 1];
        for (int64_t r = 0; r < nx / c; r++) {
            const double *xr = x + r * c;
            double ms = 0;
            for (int64_t j = 0; j < c; j++) ms += xr[j] * xr[j] / (double)c;
            for (int64_t j = 0; j < c; j++)
                y[r * c + j] = xr[j] / sqrt(ms + (double)sp->eps) * P[0][j];
        }
        break;
    }
    case GP_LAYER_ROPE: { /* q's and k's heads turned, v's copied, in double */
        int64_t W = xs->dims[xs->ndim - 1], T = xs->dims[xs->ndim - 2];
        int64_t kv = sp->kv_heads ? sp->kv_heads : sp->heads, d = W / (sp->heads + 2 * kv);
        memcpy(y, x, (size_t)nx * sizeof *y);
        for (int64_t r = 0; r < nx / W; r++)
            for (int64_t h = 0; h < sp->heads + kv; h++)
                for (int64_t i = 0; i < d / 2; i++) {
                    double ang = (double)(r % T) * ref_rope_freq(sp, i, d);
                    int64_t ia = r * W + h * d + i, ib = ia + d / 2;
                    y[ia] = x[ia] * cos(ang) - x[ib] * sin(ang);
                    y[ib] = x[ib] * cos(ang) + x[ia] * sin(ang);
                }
        break;
    }
    case GP_LAYER_SWIGLU: { /* silu(gate) up, in double */
        int64_t h = xs->dims[xs->ndim - 1] / 2;
        for (int64_t r = 0; r < nx / (2 * h); r++)
            for (int64_t j = 0; j < h; j++) {
                double a = x[r * 2 * h + j], bb = x[r * 2 * h + h + j];
                y[r * h + j] = a / (1.0 + exp(-a)) * bb;
            }
        break;
    }
    default: CHECK(!"unknown layer type");
    }
}

/* ---- finite differences ---------------------------------------------------- */

typedef struct {
    double eps, atol, rtol, norm_rtol;
} fd_tol;

/* Compare analytic gradient `an` of device tensor `t` against central
 * differences, on all elements up to 64, else on 48 random ones. */
static void fd_check(const char *what, gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                     gp_tensor *t, const double *r, const float *an, const fd_tol *tol,
                     hrng *rng)
{
    int64_t n = gp_tensor_numel(t);
    int64_t m = n <= 64 ? n : 48;
    float *h = gpt_download(t);
    double num2 = 0, diff2 = 0;
    int bad = 0;
    for (int64_t q = 0; q < m; q++) {
        int64_t i = n <= 64 ? q : (int64_t)(hrng_unit(rng) * (double)n);
        float orig = h[i];
        float v = (float)(orig + tol->eps);
        CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &v, 1));
        double lp = loss_of(l, ctx, x, r);
        v = (float)(orig - tol->eps);
        CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &v, 1));
        double lm = loss_of(l, ctx, x, r);
        CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &orig, 1));
        /* the float perturbation actually applied */
        double step = (double)(float)(orig + tol->eps) - (double)(float)(orig - tol->eps);
        double num = (lp - lm) / step;
        double d = (double)an[i] - num;
        num2 += num * num;
        diff2 += d * d;
        if (fabs(d) > tol->atol + tol->rtol * fabs(num)) {
            if (bad++ < 3)
                fprintf(stderr, "  %s (%s) [%lld]: analytic %.7g vs numeric %.7g\n", what,
                        gp_layer_type_name(l->spec.type), (long long)i, (double)an[i], num);
        }
    }
    double rel = sqrt(diff2) / (sqrt(num2) > 1e-12 ? sqrt(num2) : 1e-12);
    CHECK_MSG(bad == 0, "%s of %s: %d of %lld elements off", what,
              gp_layer_type_name(l->spec.type), bad, (long long)m);
    CHECK_MSG(rel <= tol->norm_rtol || sqrt(num2) < 1e-9, "%s of %s: relative error %.3g",
              what, gp_layer_type_name(l->spec.type), rel);
    free(h);
}

/* ---- the generic per-layer check ------------------------------------------- */

typedef enum { X_SYM, X_AWAY, X_DISTINCT } x_kind;

typedef struct {
    gp_layer_spec spec;
    gp_shape in;          /* with the batch */
    x_kind xk;
    bool randomize;       /* random values for every parameter and buffer */
    fd_tol tol;
} layer_case;

static void check_layer(gp_device *dev, const layer_case *lc, int index, hrng *rng)
{
    gp_layer l;
    gp_status cs = gp_layer_create(&lc->spec, index, &lc->in, dev, 1234, &l);
    CHECK_OK(cs);
    if (cs != GP_OK) return;
    const char *tn = gp_layer_type_name(lc->spec.type);
    if (lc->randomize) {
        for (int p = 0; p < l.n_params; p++) {
            int64_t n = gp_tensor_numel(&l.params[p].value);
            float *h = malloc((size_t)n * sizeof *h);
            bool var = strstr(l.params[p].name, "running_var") != NULL;
            /* norm weights (gamma) are the no_decay "weight"s */
            bool gamma = l.params[p].no_decay && strstr(l.params[p].name, "weight") != NULL;
            for (int64_t i = 0; i < n; i++) {
                double u = hrng_unit(rng);
                h[i] = var ? (float)(0.5 + u) : gamma ? (float)(0.5 + u) : (float)(u - 0.5);
            }
            set_param(&l, p, h);
            free(h);
        }
    }
    int64_t nx = gp_shape_numel(&lc->in);
    float *xh = malloc((size_t)nx * sizeof *xh);
    if (lc->xk == X_AWAY) fill_away_from_zero(rng, xh, nx, 0.05f);
    else if (lc->xk == X_DISTINCT) fill_distinct(rng, xh, nx, 0.01f);
    else fill_sym(rng, xh, nx, 1.0f);
    gp_tensor x = gpt_upload(dev, &lc->in, xh);
    double *xd = malloc((size_t)nx * sizeof *xd);
    for (int64_t i = 0; i < nx; i++) xd[i] = xh[i];
    double *P[GPT_MAX_PARAMS] = {0};
    GP_ASSERT(l.n_params <= GPT_MAX_PARAMS);
    for (int p = 0; p < l.n_params; p++) P[p] = download_d(&l.params[p].value);

    /* forward, training and eval, against the reference */
    for (int mode = 0; mode < 2; mode++) {
        gp_fwd_ctx ctx = train_ctx();
        ctx.training = mode == 0;
        ctx.recompute = true; /* leave batch-norm accumulators alone */
        gp_tensor y = {0};
        gp_saved s = {0};
        CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &s));
        gp_shape want = gp_shape_with_batch(&l.out_shape, lc->in.dims[0]);
        gp_shape got = gp_tensor_shape(&y);
        CHECK_MSG(gp_shape_equal(&got, &want), "%s output shape", tn);
        int64_t ny = gp_tensor_numel(&y);
        float *yh = gpt_download(&y);
        double *yr = calloc((size_t)ny, sizeof *yr);
        ref_forward(&l, P, ctx.training, &ctx, &lc->in, xd, yr);
        double maxerr = 0, maxref = 0;
        for (int64_t i = 0; i < ny; i++) {
            maxerr = fmax(maxerr, fabs(yh[i] - yr[i]));
            maxref = fmax(maxref, fabs(yr[i]));
        }
        CHECK_MSG(maxerr <= 1e-4 * (1.0 + maxref), "%s forward (%s): max error %.3g (max |y| %.3g)",
                  tn, mode ? "eval" : "train", maxerr, maxref);
        if (mode == 0 && l.ops->saved_bytes)
            CHECK_MSG(l.ops->saved_bytes(&l, lc->in.dims[0]) == gp_saved_bytes(&s),
                      "%s saved_bytes %zu vs held %zu", tn, l.ops->saved_bytes(&l, lc->in.dims[0]),
                      gp_saved_bytes(&s));
        if (mode == 0 && !l.ops->saved_bytes) CHECK(gp_saved_bytes(&s) == 0);
        free(yh);
        free(yr);
        gp_saved_free(&s);
        gp_tensor_free(&y);
    }

    /* backward against finite differences */
    gp_fwd_ctx ctx = train_ctx();
    ctx.recompute = true;
    gp_tensor y = {0}, dx = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &s));
    int64_t ny = gp_tensor_numel(&y);
    double *r = malloc((size_t)ny * sizeof *r);
    float *rf = malloc((size_t)ny * sizeof *rf);
    for (int64_t i = 0; i < ny; i++) {
        rf[i] = hrng_sym(rng);
        r[i] = rf[i];
    }
    gp_shape ys = gp_tensor_shape(&y);
    gp_tensor dy = gpt_upload(dev, &ys, rf);
    CHECK_OK(gp_layer_zero_grad(&l));
    CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, &dx, &s));
    float *dxh = gpt_download(&dx);
    fd_check("dx", &l, &ctx, &x, &x, r, dxh, &lc->tol, rng);
    for (int p = 0; p < l.n_params; p++) {
        if (l.params[p].is_buffer) continue;
        float *g = gpt_download(&l.params[p].grad);
        char what[64];
        snprintf(what, sizeof what, "d %s", l.params[p].name);
        fd_check(what, &l, &ctx, &x, &l.params[p].value, r, g, &lc->tol, rng);
        free(g);
    }

    /* dW accumulates: a second backward doubles; weights-only equals */
    if (l.n_params > 0) {
        float *g1[GPT_MAX_PARAMS] = {0};
        for (int p = 0; p < l.n_params; p++)
            if (!l.params[p].is_buffer) g1[p] = gpt_download(&l.params[p].grad);
        gp_tensor dx2 = {0};
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, &dx2, &s));
        float *dx2h = gpt_download(&dx2);
        CHECK_MSG(!memcmp(dx2h, dxh, (size_t)gp_tensor_numel(&dx) * sizeof(float)),
                  "%s: dx of a second backward differs", tn);
        free(dx2h);
        gp_tensor_free(&dx2);
        for (int p = 0; p < l.n_params; p++) {
            if (l.params[p].is_buffer) continue;
            float *g2 = gpt_download(&l.params[p].grad);
            int64_t n = gp_tensor_numel(&l.params[p].grad);
            double worst = 0;
            for (int64_t i = 0; i < n; i++)
                worst = fmax(worst, fabs(g2[i] - 2.0 * g1[p][i]) / (1e-6 + fabs(2.0 * g1[p][i])));
            CHECK_MSG(worst < 1e-4, "%s %s: two backward passes are not 2x one (%.3g)", tn,
                      l.params[p].name, worst);
            free(g2);
        }
        CHECK_OK(gp_layer_zero_grad(&l));
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, NULL, &s));
        for (int p = 0; p < l.n_params; p++) {
            if (l.params[p].is_buffer) continue;
            float *g = gpt_download(&l.params[p].grad);
            int64_t n = gp_tensor_numel(&l.params[p].grad);
            double worst = 0;
            for (int64_t i = 0; i < n; i++)
                worst = fmax(worst, fabs(g[i] - g1[p][i]) / (1e-6 + fabs(g1[p][i])));
            CHECK_MSG(worst < 1e-4, "%s %s: weights-only backward differs (%.3g)", tn,
                      l.params[p].name, worst);
            free(g);
        }
        /* A step without a zeroing pass: stale gradients (here NaN, which
         * any read would spread) are marked with grads_begin; the first
         * backward must replace them and the second accumulate, giving the
         * same bits as zero_grad + two backwards. */
        CHECK_OK(gp_layer_zero_grad(&l));
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, NULL, &s));
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, NULL, &s));
        float *want[GPT_MAX_PARAMS] = {0};
        for (int p = 0; p < l.n_params; p++) {
            if (l.params[p].is_buffer) continue;
            want[p] = gpt_download(&l.params[p].grad);
            gp_tensor *g = &l.params[p].grad;
            CHECK_OK(gp_dev_fill(dev, gp_f32(g), NAN, gp_tensor_numel(g)));
        }
        gp_layer_grads_begin(&l);
        CHECK(l.grads_stale);
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, NULL, &s));
        CHECK(!l.grads_stale);
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, NULL, &s));
        CHECK_OK(gp_layer_grads_finish(&l));
        for (int p = 0; p < l.n_params; p++) {
            if (l.params[p].is_buffer) continue;
            float *g = gpt_download(&l.params[p].grad);
            CHECK_MSG(!memcmp(g, want[p], (size_t)gp_tensor_numel(&l.params[p].grad) * sizeof *g),
                      "%s %s: overwrite-on-first-backward differs from zero + accumulate%s", tn,
                      l.params[p].name, l.ops->overwrites_grads ? "" : " (zeroing fallback)");
            free(g);
            CHECK_OK(gp_dev_fill(dev, gp_f32(&l.params[p].grad), NAN,
                                 gp_tensor_numel(&l.params[p].grad)));
        }
        /* The split backward (zb-h1, the V schedules): backward-data then
         * backward-weights, twice (one saved state: a micro-batch's), from
         * stale (NaN) gradients, give the same bits.  A product's
         * (ops->overwrites_grads) are not filled by its backward-data: its
         * first backward-weights writes them (bench/README.md, "Schedules
         * in a V"). */
        gp_layer_grads_begin(&l);
        for (int r2 = 0; r2 < 2; r2++) {
            gp_tensor dxs = {0};
            CHECK_OK(gp_layer_backward_data(&l, &ctx, &x, &y, &dy, &dxs, &s));
            gp_tensor_free(&dxs);
            for (int p = 0; r2 == 0 && l.ops->overwrites_grads && p < l.n_params; p++) {
                if (l.params[p].is_buffer || !l.ops->backward_weights) continue;
                float *g = gpt_download(&l.params[p].grad);
                CHECK_MSG(isnan(g[0]) && l.grads_stale,
                          "%s %s: backward-data filled a product's gradients (%g)", tn,
                          l.params[p].name, (double)g[0]);
                free(g);
            }
            CHECK_OK(gp_layer_backward_weights(&l, &ctx, &x, &y, &dy, &s));
        }
        CHECK_OK(gp_layer_grads_finish(&l));
        for (int p = 0; p < l.n_params; p++) {
            if (l.params[p].is_buffer) continue;
            float *g = gpt_download(&l.params[p].grad);
            CHECK_MSG(!memcmp(g, want[p], (size_t)gp_tensor_numel(&l.params[p].grad) * sizeof *g),
                      "%s %s: the split backward from stale gradients differs from zero + "
                      "accumulate", tn, l.params[p].name);
            /* No backward at all in a step: grads_finish zeroes them. */
            CHECK_OK(gp_dev_fill(dev, gp_f32(&l.params[p].grad), NAN,
                                 gp_tensor_numel(&l.params[p].grad)));
            free(g);
            free(want[p]);
            free(g1[p]);
        }
        gp_layer_grads_begin(&l);
        CHECK_OK(gp_layer_grads_finish(&l));
        for (int p = 0; p < l.n_params; p++) {
            if (l.params[p].is_buffer) continue;
            float *g = gpt_download(&l.params[p].grad);
            int64_t n = gp_tensor_numel(&l.params[p].grad), nonzero = 0;
            for (int64_t i = 0; i < n; i++) nonzero += g[i] != 0.0f;
            CHECK_MSG(nonzero == 0, "%s %s: grads_finish left %lld stale values", tn,
                      l.params[p].name, (long long)nonzero);
            free(g);
        }
    }
    free(dxh);
    free(r);
    free(rf);
    free(xh);
    free(xd);
    for (int p = 0; p < l.n_params; p++) free(P[p]);
    gp_tensor_free(&dy);
    gp_tensor_free(&dx);
    gp_tensor_free(&y);
    gp_saved_free(&s);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);
}

static gp_layer_spec spec_of(gp_layer_type t)
{
    return gp_layer_spec_default(t);
}

static void test_all_layers(gp_device *dev)
{
    hrng rng = {42};
    fd_tol smooth = {.eps = 1e-2, .atol = 3e-3, .rtol = 1e-2, .norm_rtol = 5e-3};
    fd_tol kinky = {.eps = 1e-3, .atol = 1e-2, .rtol = 2e-2, .norm_rtol = 2e-2};
    gp_shape img = gp_shape_4d(3, 5, 7, 9);
    layer_case cases[64];
    int n = 0;
    /* linear, with and without bias */
    cases[n] = (layer_case){spec_of(GP_LAYER_LINEAR), gp_shape_2d(3, 7), X_SYM, false, smooth};
    cases[n++].spec.out = 5;
    cases[n] = (layer_case){spec_of(GP_LAYER_LINEAR), gp_shape_2d(4, 6), X_SYM, false, smooth};
    cases[n].spec.out = 3;
    cases[n++].spec.bias = false;
    /* conv: k3 s2 p1 bias; k3 s1 p0 no bias; k2 s2 p1; 1x1 */
    cases[n] = (layer_case){spec_of(GP_LAYER_CONV2D), img, X_SYM, false, smooth};
    cases[n].spec.out = 4; cases[n].spec.kernel = gp_hw_square(3);
    cases[n].spec.stride = gp_hw_square(2); cases[n++].spec.padding = gp_hw_square(1);
    cases[n] = (layer_case){spec_of(GP_LAYER_CONV2D), img, X_SYM, false, smooth};
    cases[n].spec.out = 6; cases[n].spec.kernel = gp_hw_square(3); cases[n++].spec.bias = false;
    cases[n] = (layer_case){spec_of(GP_LAYER_CONV2D), img, X_SYM, false, smooth};
    cases[n].spec.out = 3; cases[n].spec.kernel = gp_hw_square(2);
    cases[n].spec.stride = gp_hw_square(2); cases[n++].spec.padding = gp_hw_square(1);
    cases[n] = (layer_case){spec_of(GP_LAYER_CONV2D), gp_shape_4d(2, 3, 4, 5), X_SYM, false,
                            smooth};
    cases[n].spec.out = 7; cases[n++].spec.kernel = gp_hw_square(1);
    /* batch norm 4-D and 2-D with random affine and running statistics */
    cases[n++] = (layer_case){spec_of(GP_LAYER_BATCHNORM), img, X_SYM, true, smooth};
    cases[n++] = (layer_case){spec_of(GP_LAYER_BATCHNORM), gp_shape_2d(6, 7), X_SYM, true, smooth};
    /* relu */
    cases[n++] = (layer_case){spec_of(GP_LAYER_RELU), img, X_AWAY, false, kinky};
    /* pools (averages count the padding, PyTorch's default) */
    cases[n] = (layer_case){spec_of(GP_LAYER_MAXPOOL2D), img, X_DISTINCT, false, kinky};
    cases[n].spec.kernel = gp_hw_square(3); cases[n].spec.stride = gp_hw_square(2);
    cases[n++].spec.padding = gp_hw_square(1);
    cases[n] = (layer_case){spec_of(GP_LAYER_MAXPOOL2D), img, X_DISTINCT, false, kinky};
    cases[n++].spec.kernel = gp_hw_square(2); /* stride defaults to the kernel */
    cases[n] = (layer_case){spec_of(GP_LAYER_AVGPOOL2D), img, X_SYM, false, smooth};
    cases[n].spec.kernel = gp_hw_square(3); cases[n].spec.stride = gp_hw_square(2);
    cases[n++].spec.padding = gp_hw_square(1);
    cases[n] = (layer_case){spec_of(GP_LAYER_AVGPOOL2D), img, X_SYM, false, smooth};
    cases[n++].spec.kernel = gp_hw_square(2);
    cases[n++] = (layer_case){spec_of(GP_LAYER_GLOBAL_AVGPOOL), img, X_SYM, false, smooth};
    /* flatten, dropout */
    cases[n++] = (layer_case){spec_of(GP_LAYER_FLATTEN), img, X_SYM, false, smooth};
    cases[n] = (layer_case){spec_of(GP_LAYER_DROPOUT), img, X_SYM, false, smooth};
    cases[n++].spec.p = 0.3f;
    cases[n] = (layer_case){spec_of(GP_LAYER_DROPOUT), gp_shape_2d(5, 11), X_SYM, false, smooth};
    cases[n++].spec.p = 0.0f;
    /* residual: with a downsample (stride 2, 5 -> 8) and identity (6 -> 6) */
    cases[n] = (layer_case){spec_of(GP_LAYER_RESIDUAL), img, X_SYM, true, kinky};
    cases[n].spec.out = 8; cases[n++].spec.stride = gp_hw_square(2);
    cases[n] = (layer_case){spec_of(GP_LAYER_RESIDUAL), gp_shape_4d(3, 6, 5, 5), X_SYM, true,
                            kinky};
    cases[n++].spec.out = 6;
    /* the U-Net layers: leaky relu (PyTorch's 0.01, a steep 0.3, 0 = relu;
     * 2-D too), dropout2d, instance norm, upsample by 2, 3 and 1 */
    cases[n++] = (layer_case){spec_of(GP_LAYER_LEAKY_RELU), img, X_AWAY, false, kinky};
    cases[n] = (layer_case){spec_of(GP_LAYER_LEAKY_RELU), gp_shape_2d(4, 9), X_AWAY, false, kinky};
    cases[n++].spec.slope = 0.3f;
    cases[n] = (layer_case){spec_of(GP_LAYER_LEAKY_RELU), img, X_AWAY, false, kinky};
    cases[n++].spec.slope = 0.0f;
    cases[n] = (layer_case){spec_of(GP_LAYER_DROPOUT2D), img, X_SYM, false, smooth};
    cases[n++].spec.p = 0.4f;
    cases[n] = (layer_case){spec_of(GP_LAYER_DROPOUT2D), img, X_SYM, false, smooth};
    cases[n++].spec.p = 0.0f;
    cases[n++] = (layer_case){spec_of(GP_LAYER_INSTANCE_NORM), img, X_SYM, false, smooth};
    cases[n] = (layer_case){spec_of(GP_LAYER_INSTANCE_NORM), gp_shape_4d(2, 3, 1, 4), X_SYM,
                            false, smooth};
    cases[n++].spec.eps = 1e-3f;
    /* instance norm linked to the leaky relu after it (spec.leaky_after,
     * gp_layer_specs_link): its backward from its own output, through the
     * relu and back, never its input (the in-place form: test_checkpoint) */
    cases[n] = (layer_case){spec_of(GP_LAYER_INSTANCE_NORM), img, X_SYM, false, smooth};
    cases[n++].spec.leaky_after = 0.01f;
    cases[n] = (layer_case){spec_of(GP_LAYER_INSTANCE_NORM), gp_shape_4d(2, 3, 2, 4), X_SYM,
                            false, smooth};
    cases[n].spec.leaky_after = 0.3f;
    cases[n++].spec.eps = 1e-3f;
    cases[n++] = (layer_case){spec_of(GP_LAYER_UPSAMPLE), img, X_SYM, false, smooth};
    cases[n] = (layer_case){spec_of(GP_LAYER_UPSAMPLE), gp_shape_4d(2, 3, 4, 5), X_SYM, false,
                            smooth};
    cases[n++].spec.scale = 3;
    cases[n] = (layer_case){spec_of(GP_LAYER_UPSAMPLE), gp_shape_4d(2, 2, 3, 3), X_SYM, false,
                            smooth};
    cases[n++].spec.scale = 1;
    /* Appended (so the cases above keep their random draws).  Per-axis
     * windows: AmoebaNet's 1x7 conv (padding (0, 3)) and 7x1 (stride
     * (2, 1), padding (3, 0)), a 2x3 with stride (1, 2), padding (1, 0);
     * max pools 1x3 (stride (1, 2), padding (0, 1)) and 3x2 (stride
     * (2, 1)); averages with and without the padding in the divisor
     * (AmoebaNet's count_include_pad=False), square and per axis */
    cases[n] = (layer_case){spec_of(GP_LAYER_CONV2D), img, X_SYM, false, smooth};
    cases[n].spec.out = 4; cases[n].spec.kernel = (gp_hw){1, 7};
    cases[n++].spec.padding = (gp_hw){0, 3};
    cases[n] = (layer_case){spec_of(GP_LAYER_CONV2D), img, X_SYM, false, smooth};
    cases[n].spec.out = 4; cases[n].spec.kernel = (gp_hw){7, 1};
    cases[n].spec.stride = (gp_hw){2, 1}; cases[n].spec.padding = (gp_hw){3, 0};
    cases[n++].spec.bias = false;
    cases[n] = (layer_case){spec_of(GP_LAYER_CONV2D), img, X_SYM, false, smooth};
    cases[n].spec.out = 3; cases[n].spec.kernel = (gp_hw){2, 3};
    cases[n].spec.stride = (gp_hw){1, 2}; cases[n++].spec.padding = (gp_hw){1, 0};
    cases[n] = (layer_case){spec_of(GP_LAYER_MAXPOOL2D), img, X_DISTINCT, false, kinky};
    cases[n].spec.kernel = (gp_hw){1, 3}; cases[n].spec.stride = (gp_hw){1, 2};
    cases[n++].spec.padding = (gp_hw){0, 1};
    cases[n] = (layer_case){spec_of(GP_LAYER_MAXPOOL2D), img, X_DISTINCT, false, kinky};
    cases[n].spec.kernel = (gp_hw){3, 2}; cases[n].spec.stride = (gp_hw){2, 1};
    cases[n++].spec.padding = (gp_hw){1, 0};
    cases[n] = (layer_case){spec_of(GP_LAYER_AVGPOOL2D), img, X_SYM, false, smooth};
    cases[n].spec.kernel = gp_hw_square(3); cases[n].spec.stride = gp_hw_square(2);
    cases[n].spec.padding = gp_hw_square(1); cases[n++].spec.count_include_pad = false;
    cases[n] = (layer_case){spec_of(GP_LAYER_AVGPOOL2D), img, X_SYM, false, smooth};
    cases[n].spec.kernel = (gp_hw){3, 1}; cases[n].spec.stride = gp_hw_square(1);
    cases[n++].spec.padding = (gp_hw){1, 0};
    cases[n] = (layer_case){spec_of(GP_LAYER_AVGPOOL2D), img, X_SYM, false, smooth};
    cases[n].spec.kernel = (gp_hw){2, 5}; cases[n].spec.stride = (gp_hw){1, 2};
    cases[n].spec.padding = (gp_hw){1, 2}; cases[n++].spec.count_include_pad = false;
    /* factorized reduce: odd sizes (the shifted conv reads padding in the
     * last row and column), even sizes, a 1-pixel-high input (only
     * padding for conv2); torchvision's init on the second */
    cases[n] = (layer_case){spec_of(GP_LAYER_FACTORIZED_REDUCE), img, X_AWAY, true, kinky};
    cases[n++].spec.out = 6;
    cases[n] = (layer_case){spec_of(GP_LAYER_FACTORIZED_REDUCE), gp_shape_4d(2, 4, 6, 8), X_AWAY,
                            true, kinky};
    cases[n].spec.out = 4; cases[n++].spec.init = GP_INIT_KAIMING_NORMAL_FAN_OUT;
    cases[n] = (layer_case){spec_of(GP_LAYER_FACTORIZED_REDUCE), gp_shape_4d(4, 3, 1, 5), X_AWAY,
                            true, kinky};
    cases[n++].spec.out = 2;
    /* gelu: 4-D, 2-D and (N, T, C) (a Transformer's MLP) */
    cases[n++] = (layer_case){spec_of(GP_LAYER_GELU), img, X_SYM, false, smooth};
    cases[n++] = (layer_case){spec_of(GP_LAYER_GELU), gp_shape_2d(5, 11), X_SYM, false, smooth};
    cases[n++] = (layer_case){spec_of(GP_LAYER_GELU), (gp_shape){3, {2, 7, 5, 0}}, X_SYM, false,
                              smooth};
    /* layer_norm: (N, C), (N, T, C) with odd sizes, random weight and bias;
     * a wide eps; a row of 1 value (y = bias, dx = 0) */
    cases[n++] = (layer_case){spec_of(GP_LAYER_LAYER_NORM), gp_shape_2d(3, 7), X_SYM, true, smooth};
    cases[n++] = (layer_case){spec_of(GP_LAYER_LAYER_NORM), (gp_shape){3, {3, 5, 9, 0}}, X_SYM,
                              true, smooth};
    cases[n] = (layer_case){spec_of(GP_LAYER_LAYER_NORM), (gp_shape){3, {2, 3, 4, 0}}, X_SYM, true,
                            smooth};
    cases[n++].spec.eps = 1e-2f;
    cases[n++] = (layer_case){spec_of(GP_LAYER_LAYER_NORM), gp_shape_2d(4, 1), X_SYM, true, smooth};
    /* rms_norm (issue 66): (N, C) and (N, T, C) with odd sizes (a tail past
     * the 8 lanes), random weight; a wide eps */
    cases[n++] = (layer_case){spec_of(GP_LAYER_RMS_NORM), gp_shape_2d(3, 7), X_SYM, true, smooth};
    cases[n++] = (layer_case){spec_of(GP_LAYER_RMS_NORM), (gp_shape){3, {3, 5, 19, 0}}, X_SYM,
                              true, smooth};
    cases[n] = (layer_case){spec_of(GP_LAYER_RMS_NORM), (gp_shape){3, {2, 3, 4, 0}}, X_SYM, true,
                            smooth};
    cases[n++].spec.eps = 1e-1f;
    /* swiglu (issue 66): (N, 2 I) and (N, T, 2 I) */
    cases[n++] = (layer_case){spec_of(GP_LAYER_SWIGLU), gp_shape_2d(3, 10), X_SYM, false, smooth};
    cases[n++] = (layer_case){spec_of(GP_LAYER_SWIGLU), (gp_shape){3, {2, 3, 14, 0}}, X_SYM, false,
                              smooth};
    /* rope (issue 66): grouped (2 q heads, 1 k and v head of 4), one head
     * per q, k and v of 2 at base 500000, and Llama 3's scaling with its
     * three bands of wavelength in one head of 8 (orig 64: 6.3 kept, 63
     * blended, 628 and 6283 slowed) */
    cases[n] = (layer_case){spec_of(GP_LAYER_ROPE), (gp_shape){3, {2, 5, 16, 0}}, X_SYM, false,
                            smooth};
    cases[n].spec.heads = 2; cases[n++].spec.kv_heads = 1;
    cases[n] = (layer_case){spec_of(GP_LAYER_ROPE), (gp_shape){3, {1, 4, 6, 0}}, X_SYM, false,
                            smooth};
    cases[n++].spec.rope_theta = 500000.0f;
    cases[n] = (layer_case){spec_of(GP_LAYER_ROPE), (gp_shape){3, {2, 7, 24, 0}}, X_SYM, false,
                            smooth};
    cases[n].spec.rope_llama3 = true; cases[n].spec.rope_orig_positions = 64;
    cases[n++].spec.rope_factor = 8.0f;
    /* linear on (N, T, C): every position through the same weights */
    cases[n] = (layer_case){spec_of(GP_LAYER_LINEAR), (gp_shape){3, {3, 5, 7, 0}}, X_SYM, false,
                            smooth};
    cases[n++].spec.out = 4;
    cases[n] = (layer_case){spec_of(GP_LAYER_LINEAR), (gp_shape){3, {2, 1, 6, 0}}, X_SYM, false,
                            smooth};
    cases[n].spec.out = 9;
    cases[n++].spec.bias = false;
    CHECK((size_t)n <= sizeof cases / sizeof *cases);
    for (int k = 0; k < n; k++) check_layer(dev, &cases[k], k, &rng);
}

/* ---- linear on an empty micro-batch ---------------------------------------- */

/* A step whose micro-batch has no rows still starts its gradients afresh:
 * the first backward after gp_layer_grads_begin leaves weight and bias
 * gradients zero, not the last step's (the product's backward overwrites
 * instead of adding, and with no rows there is no product to do it). */
static void test_linear_empty_batch(gp_device *dev)
{
    hrng rng = {11};
    gp_layer_spec sp = spec_of(GP_LAYER_LINEAR);
    sp.out = 2;
    sp.bias = true;
    gp_shape in = gp_shape_2d(4, 3), os = gp_shape_2d(4, 2);
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &l));
    float xh[12], dyh[8];
    fill_sym(&rng, xh, 12, 1.0f);
    fill_sym(&rng, dyh, 8, 1.0f);
    gp_tensor x = gpt_upload(dev, &in, xh), dy = gpt_upload(dev, &os, dyh);
    for (int step = 0; step < 2; step++) { /* a step of 4 rows, then one of none */
        gp_fwd_ctx ctx = train_ctx();
        gp_tensor xs = gp_tensor_slice(&x, 0, step ? 0 : 4);
        gp_tensor dys = gp_tensor_slice(&dy, 0, step ? 0 : 4), y = {0}, dx = {0};
        gp_saved s = {0};
        gp_layer_grads_begin(&l);
        CHECK_OK(gp_layer_forward(&l, &ctx, &xs, &y, &s));
        CHECK_OK(gp_layer_backward(&l, &ctx, &xs, &y, &dys, &dx, &s));
        CHECK_OK(gp_layer_grads_finish(&l));
        bool zero = true;
        for (int p = 0; p < l.n_params; p++) {
            int64_t n = gp_tensor_numel(&l.params[p].grad);
            float *g = gpt_download(&l.params[p].grad);
            for (int64_t i = 0; i < n; i++) zero &= g[i] == 0.0f;
            free(g);
        }
        CHECK_MSG(step ? zero : !zero, "linear, a step of %d rows: its gradients are %s",
                  step ? 0 : 4, zero ? "zero" : "not zero (the last step's left over?)");
        gp_saved_free(&s);
        gp_tensor_free(&y);
        gp_tensor_free(&dx);
    }
    gp_tensor_free(&x);
    gp_tensor_free(&dy);
    gp_layer_destroy(&l);
}

/* ---- dropout ------------------------------------------------------------- */

static void test_dropout(gp_device *dev)
{
    hrng rng = {7};
    gp_layer_spec sp = spec_of(GP_LAYER_DROPOUT);
    sp.p = 0.3f;
    gp_shape in = gp_shape_4d(6, 3, 5, 7);
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 5, &in, dev, 1, &l));
    int64_t nx = gp_shape_numel(&in), per = nx / 6;
    float *xh = malloc((size_t)nx * sizeof *xh);
    fill_away_from_zero(&rng, xh, nx, 0.1f);
    gp_tensor x = gpt_upload(dev, &in, xh);
    gp_fwd_ctx ctx = train_ctx();
    ctx.batch_total = 6;
    gp_tensor y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &s));
    float *full = gpt_download(&y);
    /* no mask is kept: the backward draws it again, dx = dy * mask exactly,
     * the mask from the RNG here (the float formula of the layer), for the
     * whole batch and for a micro-batch of it */
    CHECK(gp_saved_bytes(&s) == 0 && l.ops->saved_bytes(&l, 6) == 0);
    {
        float *dyh = malloc((size_t)nx * sizeof *dyh);
        fill_away_from_zero(&rng, dyh, nx, 0.1f);
        gp_tensor dy = gpt_upload(dev, &in, dyh), dx = {0}, dxs = {0};
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, &dx, &s));
        float *dxh = gpt_download(&dx);
        uint64_t stream = gp_rng_stream(ctx.step, (uint64_t)l.index, GP_RNG_TAG_DROPOUT);
        int same = 1;
        for (int64_t i = 0; i < nx; i++) {
            float u = gp_rng_uniform(ctx.seed, stream, (uint64_t)i);
            float m = u >= sp.p ? 1.0f / (1.0f - sp.p) : 0.0f;
            same &= dxh[i] == dyh[i] * m && full[i] == xh[i] * m;
        }
        CHECK_MSG(same, "dropout: dx != dy * mask or y != x * mask (the replayed mask differs)");
        gp_fwd_ctx c = ctx;
        c.sample_offset = 4;
        gp_tensor dys = gp_tensor_slice(&dy, 4, 2), xs = gp_tensor_slice(&x, 4, 2),
                  ys = gp_tensor_slice(&y, 4, 2);
        gp_saved ss = {0};
        CHECK_OK(gp_layer_backward(&l, &c, &xs, &ys, &dys, &dxs, &ss));
        float *part = gpt_download(&dxs);
        CHECK_MSG(!memcmp(part, dxh + 4 * per, (size_t)(2 * per) * sizeof *part),
                  "dropout backward of samples 4-5 differs from the whole batch's");
        free(part); free(dxh); free(dyh);
        gp_tensor_free(&dx); gp_tensor_free(&dxs); gp_tensor_free(&dy);
    }
    /* two uneven micro-batches with their offsets */
    float *parts = malloc((size_t)nx * sizeof *parts);
    int64_t cut = 2;
    for (int h = 0; h < 2; h++) {
        gp_tensor xs = gp_tensor_slice(&x, h ? cut : 0, h ? 6 - cut : cut);
        gp_fwd_ctx c = ctx;
        c.sample_offset = h ? cut : 0;
        gp_tensor yy = {0};
        gp_saved ss = {0};
        CHECK_OK(gp_layer_forward(&l, &c, &xs, &yy, &ss));
        float *p = gpt_download(&yy);
        memcpy(parts + (h ? cut * per : 0), p, (size_t)gp_tensor_numel(&yy) * sizeof *p);
        free(p);
        gp_tensor_free(&yy);
        gp_saved_free(&ss);
    }
    CHECK_MSG(!memcmp(parts, full, (size_t)nx * sizeof *full),
              "micro-batch masks differ from the full-batch mask");
    /* recompute draws the same mask */
    gp_fwd_ctx rc = ctx;
    rc.recompute = true;
    gp_tensor y2 = {0};
    gp_saved s2 = {0};
    CHECK_OK(gp_layer_forward(&l, &rc, &x, &y2, &s2));
    float *again = gpt_download(&y2);
    CHECK(!memcmp(again, full, (size_t)nx * sizeof *full));
    gp_tensor_free(&y2);
    gp_saved_free(&s2);
    /* another step draws another mask */
    gp_fwd_ctx nc = ctx;
    nc.step++;
    CHECK_OK(gp_layer_forward(&l, &nc, &x, &y2, &s2));
    float *other = gpt_download(&y2);
    CHECK(memcmp(other, full, (size_t)nx * sizeof *full) != 0);
    gp_tensor_free(&y2);
    gp_saved_free(&s2);
    /* eval is the identity */
    gp_fwd_ctx ec = ctx;
    ec.training = false;
    CHECK_OK(gp_layer_forward(&l, &ec, &x, &y2, &s2));
    float *ev = gpt_download(&y2);
    CHECK(!memcmp(ev, xh, (size_t)nx * sizeof *xh));
    CHECK(gp_saved_bytes(&s2) == 0);
    gp_tensor_free(&y2);
    gp_saved_free(&s2);
    /* outputs are 0 or x / (1 - p) */
    int ok = 1;
    for (int64_t i = 0; i < nx; i++)
        ok &= full[i] == 0.0f || fabsf(full[i] - xh[i] / 0.7f) <= 1e-6f * fabsf(xh[i]) + 1e-7f;
    CHECK(ok);
    free(xh); free(full); free(parts); free(again); free(other); free(ev);
    gp_tensor_free(&y);
    gp_saved_free(&s);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);

    /* keep fraction ~ 1 - p on a large tensor */
    sp.p = 0.25f;
    gp_shape big = gp_shape_2d(64, 1000);
    CHECK_OK(gp_layer_create(&sp, 2, &big, dev, 1, &l));
    int64_t nb = gp_shape_numel(&big);
    float *ones = malloc((size_t)nb * sizeof *ones);
    for (int64_t i = 0; i < nb; i++) ones[i] = 1.0f;
    x = gpt_upload(dev, &big, ones);
    CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &s));
    float *m = gpt_download(&y);
    int64_t kept = 0;
    for (int64_t i = 0; i < nb; i++) kept += m[i] != 0.0f;
    CHECK_NEAR((double)kept / (double)nb, 0.75, 0.01, 0);
    free(ones);
    free(m);
    gp_tensor_free(&y);
    gp_saved_free(&s);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);
}

/* ---- dropout2d ------------------------------------------------------------ */

/* A forward of x's samples [lo, lo + n) as one micro-batch; host copy of y. */
static float *forward_part(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x, int64_t lo,
                           int64_t n, size_t *saved)
{
    gp_tensor xs = gp_tensor_slice(x, lo, n);
    gp_fwd_ctx c = *ctx;
    c.sample_offset = ctx->sample_offset + lo;
    gp_tensor y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(l, &c, &xs, &y, &s));
    float *h = gpt_download(&y);
    if (saved) *saved = gp_saved_bytes(&s);
    gp_tensor_free(&y);
    gp_saved_free(&s);
    return h;
}

static void test_dropout2d(gp_device *dev)
{
    hrng rng = {17};
    gp_layer_spec sp = spec_of(GP_LAYER_DROPOUT2D);
    sp.p = 0.3f;
    const int64_t N = 6, C = 8, S = 5 * 7;
    gp_shape in = gp_shape_4d(N, C, 5, 7);
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 5, &in, dev, 1, &l));
    int64_t nx = gp_shape_numel(&in);
    float *xh = malloc((size_t)nx * sizeof *xh);
    fill_away_from_zero(&rng, xh, nx, 0.1f);
    gp_tensor x = gpt_upload(dev, &in, xh);
    gp_fwd_ctx ctx = train_ctx();
    ctx.batch_total = N;
    size_t saved = 0;
    float *full = forward_part(&l, &ctx, &x, 0, N, &saved);
    CHECK(saved == (size_t)(N * C) * sizeof(float));
    /* each plane is all dropped or all kept (x / (1 - p)), and it is the
     * reference mask's choice */
    int planes_ok = 1, mask_ok = 1;
    int64_t kept = 0;
    for (int64_t q = 0; q < N * C; q++) {
        bool keep = full[q * S] != 0.0f;
        kept += keep;
        for (int64_t j = 0; j < S; j++) {
            float want = keep ? xh[q * S + j] / 0.7f : 0.0f;
            planes_ok &= fabsf(full[q * S + j] - want) <= 1e-6f * fabsf(want);
        }
        mask_ok &= keep == (ref_dropout2d_mask(&l, &ctx, q / C, q % C, C) != 0.0);
    }
    CHECK_MSG(planes_ok, "dropout2d: a plane is partly kept");
    CHECK_MSG(mask_ok, "dropout2d: kept planes differ from the reference mask");
    CHECK_MSG(kept > 0 && kept < N * C, "dropout2d kept %lld of %lld planes", (long long)kept,
              (long long)(N * C));
    /* uneven micro-batches with their offsets draw the full-batch mask */
    int64_t cuts[2] = {1, 4};
    for (int k = 0; k < 2; k++) {
        float *a = forward_part(&l, &ctx, &x, 0, cuts[k], NULL);
        float *b = forward_part(&l, &ctx, &x, cuts[k], N - cuts[k], NULL);
        CHECK_MSG(!memcmp(a, full, (size_t)(cuts[k] * C * S) * sizeof *a) &&
                      !memcmp(b, full + cuts[k] * C * S, (size_t)((N - cuts[k]) * C * S) * sizeof *b),
                  "dropout2d: micro-batches split at %lld differ from the full batch",
                  (long long)cuts[k]);
        free(a);
        free(b);
    }
    /* recompute draws the same mask; another step or layer another one */
    gp_fwd_ctx rc = ctx;
    rc.recompute = true;
    float *again = forward_part(&l, &rc, &x, 0, N, NULL);
    CHECK(!memcmp(again, full, (size_t)nx * sizeof *full));
    gp_fwd_ctx nc = ctx;
    nc.step++;
    float *other = forward_part(&l, &nc, &x, 0, N, NULL);
    CHECK(memcmp(other, full, (size_t)nx * sizeof *full) != 0);
    /* not dropout's bits: dropout of the same index draws per element
     * (tag "drop"), so its first element of each plane is another stream */
    gp_layer_spec ds = spec_of(GP_LAYER_DROPOUT);
    ds.p = 0.3f;
    gp_layer d;
    CHECK_OK(gp_layer_create(&ds, 5, &in, dev, 1, &d));
    float *elem = forward_part(&d, &ctx, &x, 0, N, NULL);
    int same = 1;
    for (int64_t q = 0; q < N * C; q++) same &= (elem[q] != 0.0f) == (full[q * S] != 0.0f);
    CHECK_MSG(!same, "dropout2d draws dropout's bits");
    free(elem);
    gp_layer_destroy(&d);
    /* eval is the identity and keeps nothing */
    gp_fwd_ctx ec = ctx;
    ec.training = false;
    float *ev = forward_part(&l, &ec, &x, 0, N, &saved);
    CHECK(!memcmp(ev, xh, (size_t)nx * sizeof *xh));
    CHECK(saved == 0);
    /* backward: dx = dy * mask, the same planes */
    gp_tensor y = {0}, dx = {0};
    gp_saved sv = {0};
    CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &sv));
    CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &x, &dx, &sv)); /* dy = x */
    float *dxh = gpt_download(&dx);
    CHECK(!memcmp(dxh, full, (size_t)nx * sizeof *full));
    free(dxh);
    gp_tensor_free(&dx);
    gp_tensor_free(&y);
    gp_saved_free(&sv);
    free(xh); free(full); free(again); free(other); free(ev);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);

    /* p = 0 is the identity in training too, and keeps nothing */
    sp.p = 0.0f;
    gp_shape small = gp_shape_4d(2, 3, 2, 2);
    CHECK_OK(gp_layer_create(&sp, 1, &small, dev, 1, &l));
    float sh[24];
    fill_sym(&rng, sh, 24, 1.0f);
    x = gpt_upload(dev, &small, sh);
    float *id = forward_part(&l, &ctx, &x, 0, 2, &saved);
    CHECK(!memcmp(id, sh, sizeof sh) && saved == 0);
    free(id);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);

    /* planes kept ~ 1 - p over many (sample, channel) pairs */
    sp.p = 0.25f;
    gp_shape big = gp_shape_4d(64, 500, 1, 2);
    CHECK_OK(gp_layer_create(&sp, 2, &big, dev, 1, &l));
    int64_t nb = gp_shape_numel(&big);
    float *ones = malloc((size_t)nb * sizeof *ones);
    for (int64_t i = 0; i < nb; i++) ones[i] = 1.0f;
    x = gpt_upload(dev, &big, ones);
    float *m = forward_part(&l, &ctx, &x, 0, 64, NULL);
    int64_t kept_big = 0;
    for (int64_t q = 0; q < nb / 2; q++) kept_big += m[2 * q] != 0.0f;
    CHECK_NEAR((double)kept_big / (double)(nb / 2), 0.75, 0.015, 0);
    free(ones);
    free(m);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);
}

/* ---- instance norm, upsample ----------------------------------------------- */

/* Instance norm is per sample: micro-batches give the full batch's output,
 * and the saved statistics are the planes' mean and biased variance. */
static void test_instance_norm(gp_device *dev)
{
    hrng rng = {23};
    gp_layer_spec sp = spec_of(GP_LAYER_INSTANCE_NORM);
    const int64_t N = 5, C = 4, S = 6 * 3;
    gp_shape in = gp_shape_4d(N, C, 6, 3);
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &l));
    CHECK(l.n_params == 0);
    int64_t nx = gp_shape_numel(&in);
    float *xh = malloc((size_t)nx * sizeof *xh);
    /* planes with their own offset and spread, far from mean 0 / var 1 */
    for (int64_t q = 0; q < N * C; q++)
        for (int64_t j = 0; j < S; j++)
            xh[q * S + j] = (float)(q - 7) * 3.0f + (0.5f + (float)q * 0.2f) * hrng_sym(&rng);
    gp_tensor x = gpt_upload(dev, &in, xh);
    float *xh2 = malloc((size_t)nx * sizeof *xh2);
    memcpy(xh2, xh, (size_t)nx * sizeof *xh2);
    gp_fwd_ctx ctx = train_ctx();
    gp_tensor y = {0};
    gp_saved sv = {0};
    CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &sv));
    float *full = gpt_download(&y), *mean = gpt_download(&sv.t[0]), *var = gpt_download(&sv.t[1]);
    CHECK(gp_tensor_numel(&sv.t[0]) == N * C && gp_tensor_numel(&sv.t[1]) == N * C);
    double worst = 0;
    for (int64_t q = 0; q < N * C; q++) {
        double m = 0, v = 0, om = 0, ov = 0;
        for (int64_t j = 0; j < S; j++) m += xh[q * S + j];
        m /= (double)S;
        for (int64_t j = 0; j < S; j++) v += (xh[q * S + j] - m) * (xh[q * S + j] - m);
        v /= (double)S;
        worst = fmax(worst, fabs(mean[q] - m) / (1 + fabs(m)));
        worst = fmax(worst, fabs(var[q] - v) / (1 + v));
        /* every output plane has mean 0 and variance v / (v + eps) */
        for (int64_t j = 0; j < S; j++) om += full[q * S + j];
        om /= (double)S;
        for (int64_t j = 0; j < S; j++) ov += (full[q * S + j] - om) * (full[q * S + j] - om);
        ov /= (double)S;
        worst = fmax(worst, fabs(om));
        worst = fmax(worst, fabs(ov - v / (v + 1e-5)));
    }
    CHECK_MSG(worst < 2e-5, "instance norm statistics off by %.3g", worst);
    for (int64_t cut = 1; cut < N; cut += 2) {
        float *a = forward_part(&l, &ctx, &x, 0, cut, NULL);
        float *b = forward_part(&l, &ctx, &x, cut, N - cut, NULL);
        double err = 0;
        for (int64_t i = 0; i < cut * C * S; i++) err = fmax(err, fabs(a[i] - full[i]));
        for (int64_t i = 0; i < (N - cut) * C * S; i++)
            err = fmax(err, fabs(b[i] - full[cut * C * S + i]));
        CHECK_MSG(err <= 1e-6, "instance norm split at %lld differs by %.3g", (long long)cut, err);
        free(a);
        free(b);
    }
    /* eval normalises the same way (no running statistics) */
    gp_fwd_ctx ec = ctx;
    ec.training = false;
    float *ev = forward_part(&l, &ec, &x, 0, N, NULL);
    CHECK(!memcmp(ev, full, (size_t)nx * sizeof *full));
    free(ev); free(full); free(mean); free(var); free(xh);
    gp_saved_free(&sv);
    gp_tensor_free(&y);

    /* linked to a leaky relu (spec.leaky_after): the backward reads y or
     * the relu's z over it, not x.  From y and from z (what the relu wrote
     * over y in place) the same bits; x overwritten with NaN changes
     * nothing; and the unlinked backward (from x) agrees to float
     * rounding, the recovered y' being within an ulp of y */
    for (int k = 0; k < 2; k++) {
        float slope = k ? 0.2f : 0.01f;
        gp_layer_spec ls = sp;
        ls.leaky_after = slope;
        gp_layer ll;
        CHECK_OK(gp_layer_create(&ls, 0, &in, dev, 1, &ll));
        gp_tensor ly = {0}, g1 = {0}, g2 = {0}, g0 = {0}, z = {0};
        gp_saved s1 = {0}, s0 = {0};
        CHECK_OK(gp_layer_forward(&ll, &ctx, &x, &ly, &s1));
        float *dyh = malloc((size_t)nx * sizeof *dyh);
        for (int64_t i = 0; i < nx; i++) dyh[i] = (float)hrng_sym(&rng);
        gp_tensor dy = gpt_upload(dev, &in, dyh);
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &ly, &dy, &g0, &s1)); /* from x */
        CHECK_OK(gp_layer_backward(&ll, &ctx, &x, &ly, &dy, &g1, &s1)); /* from y */
        CHECK_OK(gp_tensor_zeros(&z, dev, &in, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_dev_leaky_relu_fwd(dev, gp_f32(&ly), gp_f32(&z), nx, slope));
        CHECK_OK(gp_dev_fill(dev, gp_f32(&x), NAN, nx));
        ll.leaky_inplace = true;
        CHECK_OK(gp_layer_backward(&ll, &ctx, &x, &z, &dy, &g2, &s1)); /* from z */
        float *a0 = gpt_download(&g0), *a1 = gpt_download(&g1), *a2 = gpt_download(&g2);
        CHECK_MSG(!memcmp(a1, a2, (size_t)nx * sizeof *a1),
                  "slope %g: the linked backward from y and from z differ", (double)slope);
        double err = 0, big = 0;
        for (int64_t i = 0; i < nx; i++) {
            err = fmax(err, fabs((double)a1[i] - a0[i]));
            big = fmax(big, fabs((double)a0[i]));
        }
        CHECK_MSG(err <= 1e-5 * big && isfinite(err) && big > 0,
                  "slope %g: linked backward %.3g from the unlinked one (max %.3g)",
                  (double)slope, err, big);
        CHECK_OK(gp_dev_upload(dev, gp_f32(&x), xh2, nx)); /* x back for the next slope */
        free(a0); free(a1); free(a2); free(dyh);
        gp_tensor_free(&dy); gp_tensor_free(&g0); gp_tensor_free(&g1); gp_tensor_free(&g2);
        gp_tensor_free(&z); gp_tensor_free(&ly);
        gp_saved_free(&s1); gp_saved_free(&s0);
        gp_layer_destroy(&ll);
    }
    free(xh2);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);
}

static void test_upsample(gp_device *dev)
{
    hrng rng = {29};
    gp_layer_spec sp = spec_of(GP_LAYER_UPSAMPLE);
    CHECK(sp.scale == 2);
    sp.scale = 3;
    const int64_t N = 2, C = 3, H = 4, W = 5, sc = 3;
    gp_shape in = gp_shape_4d(N, C, H, W);
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &l));
    gp_shape want = gp_shape_4d(1, C, H * sc, W * sc);
    CHECK(gp_shape_equal(&l.out_shape, &want));
    CHECK(l.ops->flops(&l, N) == (double)(N * C * H * W * sc * sc));
    int64_t nx = N * C * H * W, ny = nx * sc * sc;
    float *xh = malloc((size_t)nx * sizeof *xh), *dyh = malloc((size_t)ny * sizeof *dyh);
    fill_sym(&rng, xh, nx, 1.0f);
    fill_sym(&rng, dyh, ny, 1.0f);
    gp_tensor x = gpt_upload(dev, &in, xh);
    gp_shape ys = gp_shape_with_batch(&l.out_shape, N);
    gp_tensor dy = gpt_upload(dev, &ys, dyh);
    gp_fwd_ctx ctx = train_ctx();
    gp_tensor y = {0}, dx = {0};
    gp_saved sv = {0};
    CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &sv));
    CHECK(gp_saved_bytes(&sv) == 0);
    gp_shape got = gp_tensor_shape(&y);
    CHECK(gp_shape_equal(&got, &ys));
    float *yh = gpt_download(&y);
    /* the copy is exact */
    int fwd_ok = 1;
    for (int64_t q = 0; q < N * C; q++)
        for (int64_t i = 0; i < H * sc; i++)
            for (int64_t j = 0; j < W * sc; j++)
                fwd_ok &= yh[(q * H * sc + i) * W * sc + j] == xh[(q * H + i / sc) * W + j / sc];
    CHECK_MSG(fwd_ok, "upsample forward is not nearest-neighbour");
    /* backward: each input element gets the sum of its 3x3 block */
    CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, &dx, &sv));
    float *dxh = gpt_download(&dx);
    double worst = 0;
    for (int64_t q = 0; q < N * C; q++)
        for (int64_t i = 0; i < H; i++)
            for (int64_t j = 0; j < W; j++) {
                double acc = 0;
                for (int64_t a = 0; a < sc; a++)
                    for (int64_t b = 0; b < sc; b++)
                        acc += dyh[(q * H * sc + i * sc + a) * W * sc + j * sc + b];
                worst = fmax(worst, fabs(dxh[(q * H + i) * W + j] - acc));
            }
    CHECK_MSG(worst <= 1e-5, "upsample backward off the block sums by %.3g", worst);
    free(xh); free(dyh); free(yh); free(dxh);
    gp_saved_free(&sv);
    gp_tensor_free(&y);
    gp_tensor_free(&dx);
    gp_tensor_free(&dy);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);
}

/* ---- batch-norm running statistics --------------------------------------- */

static void test_bn_stats(gp_device *dev)
{
    hrng rng = {11};
    gp_layer_spec sp = spec_of(GP_LAYER_BATCHNORM);
    sp.momentum = 0.3f;
    gp_shape in = gp_shape_4d(7, 3, 4, 5);
    int64_t nx = gp_shape_numel(&in), C = 3, S = 20, N = 7;
    float *xh = malloc((size_t)nx * sizeof *xh);
    for (int64_t i = 0; i < nx; i++) xh[i] = 3.0f + 2.0f * hrng_sym(&rng); /* offset mean */
    double *xd = malloc((size_t)nx * sizeof *xd);
    for (int64_t i = 0; i < nx; i++) xd[i] = xh[i];
    gp_tensor x = gpt_upload(dev, &in, xh);
    gp_layer a, b;
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &a));
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &b));
    gp_fwd_ctx ctx = train_ctx();
    ctx.batch_total = N;
    /* a: micro-batches of 3 and 4 (and a recompute of the first) */
    int64_t cut = 3;
    for (int h = 0; h < 2; h++) {
        gp_tensor xs = gp_tensor_slice(&x, h ? cut : 0, h ? N - cut : cut);
        gp_fwd_ctx c = ctx;
        c.sample_offset = h ? cut : 0;
        gp_tensor y = {0};
        gp_saved s = {0};
        CHECK_OK(gp_layer_forward(&a, &c, &xs, &y, &s));
        gp_tensor_free(&y);
        gp_saved_free(&s);
        if (h == 0) {
            CHECK(gp_batchnorm_pending_count(&a) == cut * S);
            c.recompute = true;
            CHECK_OK(gp_layer_forward(&a, &c, &xs, &y, &s));
            CHECK(gp_batchnorm_pending_count(&a) == cut * S); /* untouched */
            gp_tensor_free(&y);
            gp_saved_free(&s);
        }
    }
    int rm = param_index(&a, "running_mean"), rv = param_index(&a, "running_var");
    CHECK(rm >= 0 && rv >= 0);
    if (rm < 0 || rv < 0) return;
    /* nothing moves before commit */
    float *before = gpt_download(&a.params[rm].value);
    CHECK(before[0] == 0.0f && before[1] == 0.0f);
    free(before);
    CHECK(gp_batchnorm_batches_tracked(&a) == 0);
    CHECK_OK(a.ops->commit(&a));
    CHECK(gp_batchnorm_batches_tracked(&a) == 1);
    CHECK(gp_batchnorm_pending_count(&a) == 0);
    /* b: the whole batch at once */
    gp_tensor y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(&b, &ctx, &x, &y, &s));
    gp_tensor_free(&y);
    gp_saved_free(&s);
    CHECK_OK(b.ops->commit(&b));
    /* naive double reference with the unbiased variance */
    double mean[3], var[3];
    ref_bn_stats(N, C, S, xd, mean, var);
    float *am = gpt_download(&a.params[rm].value), *av = gpt_download(&a.params[rv].value);
    float *bm = gpt_download(&b.params[rm].value), *bv = gpt_download(&b.params[rv].value);
    double m = 0.3;
    for (int64_t c = 0; c < C; c++) {
        double em = m * mean[c];
        double ev = (1 - m) * 1.0 + m * var[c] * (double)(N * S) / (double)(N * S - 1);
        CHECK_NEAR(am[c], em, 1e-5, 1e-5);
        CHECK_NEAR(av[c], ev, 1e-5, 1e-5);
        CHECK_NEAR(bm[c], em, 1e-5, 1e-5);
        CHECK_NEAR(bv[c], ev, 1e-5, 1e-5);
    }
    /* a commit without a forward changes nothing */
    CHECK_OK(a.ops->commit(&a));
    CHECK(gp_batchnorm_batches_tracked(&a) == 1);
    /* eval normalises with the running statistics */
    gp_fwd_ctx ec = ctx;
    ec.training = false;
    CHECK_OK(gp_layer_forward(&a, &ec, &x, &y, &s));
    float *yh = gpt_download(&y);
    double g[3] = {1, 1, 1}, be[3] = {0, 0, 0}, rmean[3], rvar[3];
    for (int c = 0; c < 3; c++) {
        rmean[c] = am[c];
        rvar[c] = av[c];
    }
    double *yr = malloc((size_t)nx * sizeof *yr);
    ref_bn(N, C, S, 1e-5, xd, g, be, rmean, rvar, yr);
    double worst = 0;
    for (int64_t i = 0; i < nx; i++) worst = fmax(worst, fabs(yh[i] - yr[i]));
    CHECK_MSG(worst < 1e-4, "eval batch norm off by %.3g", worst);
    CHECK(gp_batchnorm_pending_count(&a) == 0); /* eval merges nothing */
    /* backward after an eval forward is refused */
    gp_tensor dx = {0};
    CHECK_ERR(gp_layer_backward(&a, &ec, &x, &y, &y, &dx, &s), GP_ERR_INVALID, "eval-mode");
    free(yh); free(yr); free(am); free(av); free(bm); free(bv);
    gp_tensor_free(&y);
    gp_saved_free(&s);
    /* a 1-sample 2-D micro-batch cannot be normalised in training */
    gp_shape v = gp_shape_2d(1, 4);
    gp_layer c1;
    CHECK_OK(gp_layer_create(&sp, 9, &v, dev, 1, &c1));
    float one[4] = {1, 2, 3, 4};
    gp_tensor x1 = gpt_upload(dev, &v, one);
    CHECK_ERR(gp_layer_forward(&c1, &ctx, &x1, &y, &s), GP_ERR_INVALID,
              "more than one value per channel");
    gp_saved_free(&s);
    gp_tensor_free(&x1);
    gp_layer_destroy(&c1);
    free(xh);
    free(xd);
    gp_tensor_free(&x);
    gp_layer_destroy(&a);
    gp_layer_destroy(&b);

    /* residual: commit reaches every norm of the block; recompute does not */
    gp_layer_spec rs = spec_of(GP_LAYER_RESIDUAL);
    rs.out = 4;
    rs.stride = gp_hw_square(2);
    gp_shape ri = gp_shape_4d(4, 3, 6, 6);
    gp_layer r;
    CHECK_OK(gp_layer_create(&rs, 1, &ri, dev, 1, &r));
    int64_t nr = gp_shape_numel(&ri);
    float *rh = malloc((size_t)nr * sizeof *rh);
    fill_sym(&rng, rh, nr, 2.0f);
    gp_tensor rx = gpt_upload(dev, &ri, rh);
    gp_fwd_ctx rc = ctx;
    rc.recompute = true;
    CHECK_OK(gp_layer_forward(&r, &rc, &rx, &y, &s));
    gp_tensor_free(&y);
    gp_saved_free(&s);
    CHECK_OK(r.ops->commit(&r));
    const char *names[3] = {"bn1.running_mean", "bn2.running_mean", "downsample.1.running_mean"};
    for (int k = 0; k < 3; k++) {
        int p = param_index(&r, names[k]);
        CHECK(p >= 0);
        if (p < 0) continue;
        float *h = gpt_download(&r.params[p].value);
        CHECK_MSG(h[0] == 0.0f, "%s moved after a recompute-only step", names[k]);
        free(h);
    }
    CHECK_OK(gp_layer_forward(&r, &ctx, &rx, &y, &s));
    gp_tensor_free(&y);
    gp_saved_free(&s);
    CHECK_OK(r.ops->commit(&r));
    for (int k = 0; k < 3; k++) {
        int p = param_index(&r, names[k]);
        if (p < 0) continue;
        float *h = gpt_download(&r.params[p].value);
        CHECK_MSG(h[0] != 0.0f, "%s did not move after commit", names[k]);
        free(h);
    }
    free(rh);
    gp_tensor_free(&rx);
    gp_layer_destroy(&r);
}

/* A step's micro-batch statistics kept in the norm's slots (ctx->step_micro)
 * and merged by the commit in one launch, against the same micro-batches
 * merged one launch each (step_micro 0): the running statistics bitwise
 * equal, with no merge launch in the slots' forwards; the saved mean and
 * var are views of the slot (a recompute computes the slot again, the same
 * bits, and allocates nothing), and the backward over them gives the
 * merged run's dx.  Cases: micro-batches of 3, 2, 2 (the split's two runs
 * of counts); 2, 3, 2 (not two runs: the commit merges slot by slot);
 * three forwards for two slots (the third merged at once, after the two
 * kept: forward order); and a second
 * step with more micro-batches than the first (the slots grow). */
static void test_bn_slots(gp_device *dev)
{
    hrng rng = {29};
    gp_layer_spec sp = spec_of(GP_LAYER_BATCHNORM);
    sp.momentum = 0.2f;
    enum { N = 7, C = 3, S = 6 };
    gp_shape in = gp_shape_4d(N, C, 2, 3);
    float xh[N * C * S];
    for (int i = 0; i < N * C * S; i++) xh[i] = 1.5f + 2.0f * hrng_sym(&rng);
    gp_tensor x = gpt_upload(dev, &in, xh);
    gp_layer a, b;
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &a));
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &b));
    int rm = param_index(&a, "running_mean"), rv = param_index(&a, "running_var");
    CHECK(rm >= 0 && rv >= 0);
    if (rm < 0 || rv < 0) return;
    const int64_t splits[4][4] = {{3, 2, 2, 0}, {2, 3, 2, 0}, {3, 2, 2, 0}, {2, 2, 2, 1}};
    const int micro[4] = {3, 3, 2, 4}; /* step_micro of the slots' run */
    for (int k = 0; k < 4; k++) {
        int64_t off = 0;
        for (int i = 0; i < 4 && splits[k][i] > 0; off += splits[k][i], i++) {
            gp_tensor xs = gp_tensor_slice(&x, off, splits[k][i]);
            gp_fwd_ctx ctx = train_ctx();
            ctx.batch_total = N;
            ctx.sample_offset = off;
            gp_tensor ya = {0}, yb = {0}, yr = {0}, dxa = {0}, dxb = {0};
            gp_saved sa = {0}, sb = {0}, sr = {0};
            ctx.step_micro = micro[k];
            uint64_t l0 = gp_dev_launches(dev);
            CHECK_OK(gp_layer_forward(&a, &ctx, &xs, &ya, &sa));
            uint64_t la = gp_dev_launches(dev) - l0;
            bool slotted = i < micro[k];
            CHECK_MSG(slotted == !sa.t[0].owned &&
                          gp_saved_bytes(&sa) == (slotted ? 0 : 2 * C * sizeof(float)),
                      "case %d, micro-batch %d: saved statistics %s, %zu bytes", k, i,
                      sa.t[0].owned ? "owned" : "a view", gp_saved_bytes(&sa));
            ctx.recompute = true;
            CHECK_OK(gp_layer_forward(&a, &ctx, &xs, &yr, &sr));
            CHECK(slotted == !sr.t[0].owned);
            CHECK(gpt_same_tensor(&ya, &yr));
            ctx.recompute = false;
            ctx.step_micro = 0;
            l0 = gp_dev_launches(dev);
            CHECK_OK(gp_layer_forward(&b, &ctx, &xs, &yb, &sb));
            uint64_t lb = gp_dev_launches(dev) - l0;
            /* a slot: no merge; the first forward past them merges the
             * kept slots too */
            uint64_t want = slotted ? lb - 1 : lb + (i == micro[k] ? (uint64_t)micro[k] : 0);
            CHECK_MSG(la == want, "case %d, micro-batch %d: %llu launches with slots, %llu "
                      "merging", k, i, (unsigned long long)la, (unsigned long long)lb);
            CHECK(gpt_same_tensor(&ya, &yb));
            CHECK_OK(gp_layer_backward(&a, &ctx, &xs, &ya, &ya, &dxa, &sr)); /* dy = y */
            CHECK_OK(gp_layer_backward(&b, &ctx, &xs, &yb, &yb, &dxb, &sb));
            CHECK(gpt_same_tensor(&dxa, &dxb));
            gp_tensor_free(&ya); gp_tensor_free(&yb); gp_tensor_free(&yr);
            gp_tensor_free(&dxa); gp_tensor_free(&dxb);
            gp_saved_free(&sa); gp_saved_free(&sb); gp_saved_free(&sr);
        }
        CHECK(gp_batchnorm_pending_count(&a) == N * S && gp_batchnorm_pending_count(&b) == N * S);
        CHECK_OK(a.ops->commit(&a));
        CHECK_OK(b.ops->commit(&b));
        CHECK(gp_batchnorm_pending_count(&a) == 0);
        CHECK_MSG(gpt_same_tensor(&a.params[rm].value, &b.params[rm].value) &&
                      gpt_same_tensor(&a.params[rv].value, &b.params[rv].value),
                  "case %d: the slots' running statistics differ from the merged ones", k);
    }
    gp_tensor_free(&x);
    gp_layer_destroy(&a);
    gp_layer_destroy(&b);
}

/* ---- cross-entropy --------------------------------------------------------- */

static void test_cross_entropy(gp_device *dev)
{
    hrng rng = {5};
    int64_t N = 5, K = 7;
    gp_shape ls = gp_shape_2d(N, K);
    float lh[35], lab[5] = {0, 6, 3, 3, 1};
    fill_sym(&rng, lh, N * K, 3.0f);
    lh[1 * K + 6] = 10.0f; /* row 1 is certainly right */
    gp_tensor logits = gpt_upload(dev, &ls, lh);
    gp_shape lbs = {1, {N, 0, 0, 0}};
    gp_tensor labels = gpt_upload(dev, &lbs, lab);
    gp_tensor dl;
    CHECK_OK(gp_tensor_alloc(&dl, dev, &ls, GP_MEM_ACTIVATIONS));
    gp_loss_out lo;
    float scale = 0.25f;
    CHECK_OK(gp_cross_entropy(dev, &logits, &labels, 0.0f, scale, &dl, &lo));
    float *dh = gpt_download(&dl);
    double loss = 0;
    int64_t correct = 0;
    int grad_ok = 1;
    for (int64_t i = 0; i < N; i++) {
        double mx = -INFINITY, se = 0;
        int64_t am = 0;
        for (int64_t j = 0; j < K; j++)
            if (lh[i * K + j] > mx) { mx = lh[i * K + j]; am = j; }
        for (int64_t j = 0; j < K; j++) se += exp(lh[i * K + j] - mx);
        double lse = log(se) + mx;
        loss += lse - lh[i * K + (int64_t)lab[i]];
        correct += am == (int64_t)lab[i];
        for (int64_t j = 0; j < K; j++) {
            double g = (exp(lh[i * K + j] - lse) - (j == (int64_t)lab[i])) * scale;
            grad_ok &= fabs(dh[i * K + j] - g) < 1e-6;
        }
    }
    CHECK_NEAR(lo.loss_sum, loss, 1e-5, 1e-6);
    CHECK(lo.correct == correct);
    CHECK(lo.count == N);
    CHECK(grad_ok);
    /* the gradient is d(scale * loss_sum)/d logits: finite differences */
    int fd_ok = 1;
    for (int64_t q = 0; q < N * K; q += 3) {
        float orig = lh[q];
        double l2[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            float v = orig + (sgn ? -1e-2f : 1e-2f);
            CHECK_OK(gp_dev_upload(dev, gp_f32(&logits) + q, &v, 1));
            gp_loss_out o2;
            CHECK_OK(gp_cross_entropy(dev, &logits, &labels, 0.0f, 1.0f, NULL, &o2));
            l2[sgn] = o2.loss_sum;
        }
        CHECK_OK(gp_dev_upload(dev, gp_f32(&logits) + q, &orig, 1));
        double step = (double)(orig + 1e-2f) - (double)(orig - 1e-2f);
        double num = scale * (l2[0] - l2[1]) / step;
        fd_ok &= fabs(num - dh[q]) < 1e-3;
    }
    CHECK(fd_ok);
    /* a label outside [0, K) names the row and the label */
    lab[2] = 7.0f;
    CHECK_OK(gp_dev_upload(dev, gp_f32(&labels), lab, N));
    CHECK_ERR(gp_cross_entropy(dev, &logits, &labels, 0.0f, 1.0f, &dl, &lo), GP_ERR_DATA,
              "label 7 in row 2");
    /* 4-D logits are refused */
    gp_shape s4 = gp_shape_4d(N, K, 1, 1);
    gp_tensor l4 = gp_tensor_reshape(&logits, &s4);
    CHECK_ERR(gp_cross_entropy(dev, &l4, &labels, 0.0f, 1.0f, NULL, &lo), GP_ERR_INVALID,
              "flatten");
    free(dh);
    gp_tensor_free(&dl);
    gp_tensor_free(&labels);
    gp_tensor_free(&logits);
}

/* ---- binary cross-entropy with logits --------------------------------------- */

static double ref_bce(double z, double t)
{
    /* the textbook form, fine in double for the moderate logits used here */
    double sig = 1.0 / (1.0 + exp(-z));
    return -(t * log(sig) + (1.0 - t) * log(1.0 - sig));
}

static void test_bce(gp_device *dev)
{
    hrng rng = {31};
    const int64_t N = 3, H = 5, W = 7, n = N * H * W;
    gp_shape zs = gp_shape_4d(N, 1, H, W);
    float zh[105], th[105];
    fill_sym(&rng, zh, n, 4.0f);
    for (int64_t i = 0; i < n; i++) /* masks of 0 / 1, some soft targets */
        th[i] = i % 5 == 0 ? (float)hrng_unit(&rng) : (hrng_unit(&rng) < 0.4 ? 1.0f : 0.0f);
    th[3] = 0.5f; /* a tie counts as class 0 */
    gp_tensor z = gpt_upload(dev, &zs, zh), t = gpt_upload(dev, &zs, th);
    gp_tensor dz;
    CHECK_OK(gp_tensor_alloc(&dz, dev, &zs, GP_MEM_ACTIVATIONS));
    float scale = 1.0f / (float)n;
    gp_loss_out lo;
    CHECK_OK(gp_bce_with_logits(dev, &z, &t, scale, &dz, &lo));
    float *dh = gpt_download(&dz);
    double loss = 0;
    int64_t correct = 0;
    double gworst = 0;
    for (int64_t i = 0; i < n; i++) {
        loss += ref_bce(zh[i], th[i]);
        correct += (zh[i] > 0) == (th[i] > 0.5);
        double g = (1.0 / (1.0 + exp(-(double)zh[i])) - th[i]) * scale;
        gworst = fmax(gworst, fabs(dh[i] - g));
    }
    CHECK_NEAR(lo.loss_sum, loss, 1e-9, 1e-9);
    CHECK(lo.correct == correct);
    CHECK(lo.count == n);
    CHECK_MSG(gworst < 1e-8, "bce gradient off by %.3g", gworst);
    /* the gradient is d(scale * loss_sum)/dz: finite differences */
    double fworst = 0;
    for (int64_t q = 0; q < n; q += 4) {
        float orig = zh[q];
        double l2[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            float v = orig + (sgn ? -1e-2f : 1e-2f);
            CHECK_OK(gp_dev_upload(dev, gp_f32(&z) + q, &v, 1));
            gp_loss_out o2;
            CHECK_OK(gp_bce_with_logits(dev, &z, &t, 1.0f, NULL, &o2));
            l2[sgn] = o2.loss_sum;
        }
        CHECK_OK(gp_dev_upload(dev, gp_f32(&z) + q, &orig, 1));
        double step = (double)(orig + 1e-2f) - (double)(orig - 1e-2f);
        double num = scale * (l2[0] - l2[1]) / step;
        fworst = fmax(fworst, fabs(num - dh[q]) / (1e-4 * scale + fabs(num)));
    }
    CHECK_MSG(fworst < 1e-3, "bce gradient vs finite differences: relative error %.3g", fworst);
    /* extreme logits: finite loss |z| for the wrong sign, 0 for the right
     * one, gradients exactly -1 / 0 / 1 scaled (no overflow in exp) */
    float ez[4] = {100.0f, -100.0f, 100.0f, -100.0f}, et[4] = {0.0f, 1.0f, 1.0f, 0.0f};
    gp_shape s4 = gp_shape_2d(2, 2);
    gp_tensor z4 = gpt_upload(dev, &s4, ez), t4 = gpt_upload(dev, &s4, et), d4;
    CHECK_OK(gp_tensor_alloc(&d4, dev, &s4, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_bce_with_logits(dev, &z4, &t4, 1.0f, &d4, &lo));
    float *g4 = gpt_download(&d4);
    CHECK_NEAR(lo.loss_sum, 200.0, 1e-9, 0);
    CHECK(lo.correct == 2 && lo.count == 4);
    CHECK(g4[0] == 1.0f && g4[1] == -1.0f && fabsf(g4[2]) < 1e-30f && fabsf(g4[3]) < 1e-30f);
    free(g4);
    /* a target outside [0, 1] names the element (flat and as an index) and
     * writes nothing */
    th[40] = 1.5f;
    th[50] = -1.0f;
    CHECK_OK(gp_dev_upload(dev, gp_f32(&t), th, n));
    CHECK_OK(gp_dev_fill(dev, gp_f32(&dz), 7.0f, n));
    CHECK_ERR(gp_bce_with_logits(dev, &z, &t, 1.0f, &dz, &lo), GP_ERR_DATA,
              "target 1.5 at element 40 (1, 0, 0, 5) of the batch is not in [0, 1]");
    CHECK(lo.count == 0 && lo.loss_sum == 0.0);
    float *dbad = gpt_download(&dz);
    CHECK(dbad[0] == 7.0f && dbad[n - 1] == 7.0f);
    free(dbad);
    th[40] = NAN;
    CHECK_OK(gp_dev_upload(dev, gp_f32(&t), th, n));
    CHECK_ERR(gp_bce_with_logits(dev, &z, &t, 1.0f, NULL, &lo), GP_ERR_DATA,
              "target nan at element 40");
    /* logits and targets must match in size */
    gp_tensor t3 = gp_tensor_slice(&t4, 0, 1);
    CHECK_ERR(gp_bce_with_logits(dev, &z4, &t3, 1.0f, NULL, &lo), GP_ERR_INVALID,
              "one target per logit, but the logits are (2, 2) and the targets (1, 2)");
    free(dh);
    gp_tensor_free(&z4); gp_tensor_free(&t4); gp_tensor_free(&d4);
    gp_tensor_free(&dz); gp_tensor_free(&t); gp_tensor_free(&z);
}

/* ---- counts, names, FLOPs ------------------------------------------------- */

static void test_counts(gp_device *dev)
{
    gp_layer l;
    gp_layer_spec rs = spec_of(GP_LAYER_RESIDUAL);
    rs.out = 128;
    rs.stride = gp_hw_square(2);
    gp_shape in = gp_shape_4d(1, 64, 8, 8);
    CHECK_OK(gp_layer_create(&rs, 0, &in, dev, 1, &l));
    /* torchvision BasicBlock(64, 128, stride=2, downsample): 230144 */
    CHECK(gp_layer_param_count(&l) == 230144);
    static const char *const tv[] = {
        "conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
        "conv2.weight", "bn2.weight", "bn2.bias", "bn2.running_mean", "bn2.running_var",
        "downsample.0.weight", "downsample.1.weight", "downsample.1.bias",
        "downsample.1.running_mean", "downsample.1.running_var",
    };
    CHECK(l.n_params == 15);
    for (int p = 0; p < l.n_params && p < 15; p++)
        CHECK_MSG(!strcmp(l.params[p].name, tv[p]), "param %d is %s, want %s", p,
                  l.params[p].name, tv[p]);
    CHECK(l.params[1].no_decay && !l.params[0].no_decay && l.params[3].is_buffer);
    gp_shape want = gp_shape_4d(1, 128, 4, 4);
    CHECK(gp_shape_equal(&l.out_shape, &want));
    double fl = 2.0 * 128 * 16 * (64 * 9 + 128 * 9 + 64);
    CHECK(l.ops->flops(&l, 1) >= fl && l.ops->flops(&l, 1) < fl * 1.01);
    gp_layer_destroy(&l);
    rs.out = 64;
    rs.stride = gp_hw_square(1);
    CHECK_OK(gp_layer_create(&rs, 0, &in, dev, 1, &l));
    CHECK(gp_layer_param_count(&l) == 73984); /* BasicBlock(64, 64) */
    CHECK(l.n_params == 10);
    gp_layer_destroy(&l);

    gp_layer_spec ls = spec_of(GP_LAYER_LINEAR);
    ls.out = 10;
    gp_shape li = gp_shape_2d(1, 784);
    CHECK_OK(gp_layer_create(&ls, 0, &li, dev, 1, &l));
    CHECK(gp_layer_param_count(&l) == 7850);
    CHECK(l.ops->flops(&l, 32) == 2.0 * 32 * 784 * 10 + 32 * 10);
    CHECK(!strcmp(l.params[0].name, "weight") && !strcmp(l.params[1].name, "bias"));
    CHECK(l.params[1].no_decay && !l.params[0].no_decay);
    gp_layer_destroy(&l);

    gp_layer_spec cs = spec_of(GP_LAYER_CONV2D);
    cs.out = 16;
    cs.kernel = gp_hw_square(3);
    cs.padding = gp_hw_square(1);
    gp_shape ci = gp_shape_4d(1, 3, 32, 32);
    CHECK_OK(gp_layer_create(&cs, 0, &ci, dev, 1, &l));
    CHECK(gp_layer_param_count(&l) == 448);
    CHECK(l.ops->flops(&l, 2) == 2.0 * 2 * 16 * 32 * 32 * 27 + 2.0 * 16 * 32 * 32);
    gp_layer_destroy(&l);

    gp_layer_spec bs = spec_of(GP_LAYER_BATCHNORM);
    CHECK_OK(gp_layer_create(&bs, 0, &ci, dev, 1, &l));
    CHECK(gp_layer_param_count(&l) == 6 && l.n_params == 4);
    gp_layer_destroy(&l);

    /* AmoebaNet's 1x7 and 7x1: weight (K, C, 1, 7), 7 taps per output */
    cs = spec_of(GP_LAYER_CONV2D);
    cs.out = 8;
    cs.kernel = (gp_hw){1, 7};
    cs.stride = (gp_hw){1, 2};
    cs.padding = (gp_hw){0, 3};
    cs.bias = false;
    gp_shape ai = gp_shape_4d(1, 4, 14, 14);
    CHECK_OK(gp_layer_create(&cs, 0, &ai, dev, 1, &l));
    gp_shape aw = gp_tensor_shape(&l.params[0].value), awant = gp_shape_4d(8, 4, 1, 7);
    CHECK(gp_shape_equal(&aw, &awant) && gp_layer_param_count(&l) == 224);
    gp_shape ao = gp_shape_4d(1, 8, 14, 7);
    CHECK(gp_shape_equal(&l.out_shape, &ao));
    CHECK(l.ops->flops(&l, 1) == 2.0 * 8 * 14 * 7 * 4 * 7);
    gp_layer_destroy(&l);
    cs.kernel = (gp_hw){7, 1};
    cs.stride = (gp_hw){2, 1};
    cs.padding = (gp_hw){3, 0};
    CHECK_OK(gp_layer_create(&cs, 0, &ai, dev, 1, &l));
    ao = gp_shape_4d(1, 8, 7, 14);
    CHECK(gp_shape_equal(&l.out_shape, &ao));
    gp_layer_destroy(&l);
    gp_layer_spec ps = spec_of(GP_LAYER_MAXPOOL2D);
    ps.kernel = (gp_hw){1, 3}; /* stride = the kernel, per axis */
    CHECK_OK(gp_layer_create(&ps, 0, &ai, dev, 1, &l));
    ao = gp_shape_4d(1, 4, 14, 4);
    CHECK(gp_shape_equal(&l.out_shape, &ao));
    gp_layer_destroy(&l);

    /* torchgpipe's FactorizedReduce(64, 128): two 1x1 convs of 64 -> 64
     * and BatchNorm2d(128), its state dict names; 7x7 -> 4x4 */
    gp_layer_spec fs = spec_of(GP_LAYER_FACTORIZED_REDUCE);
    fs.out = 128;
    gp_shape fi = gp_shape_4d(1, 64, 7, 7);
    CHECK_OK(gp_layer_create(&fs, 0, &fi, dev, 1, &l));
    CHECK(gp_layer_param_count(&l) == 2 * 64 * 64 + 2 * 128);
    static const char *const fr[] = {"conv1.weight", "conv2.weight", "bn.weight", "bn.bias",
                                     "bn.running_mean", "bn.running_var"};
    CHECK(l.n_params == 6);
    for (int p = 0; p < l.n_params && p < 6; p++)
        CHECK_MSG(!strcmp(l.params[p].name, fr[p]), "param %d is %s, want %s", p,
                  l.params[p].name, fr[p]);
    gp_shape fw = gp_tensor_shape(&l.params[1].value), fwant = gp_shape_4d(64, 64, 1, 1);
    CHECK(gp_shape_equal(&fw, &fwant));
    CHECK(!l.params[0].no_decay && l.params[2].no_decay && l.params[4].is_buffer);
    gp_shape fo = gp_shape_4d(1, 128, 4, 4);
    CHECK(gp_shape_equal(&l.out_shape, &fo));
    double ffl = 2.0 * 128 * 16 * 64;
    CHECK(l.ops->flops(&l, 1) >= ffl && l.ops->flops(&l, 1) < ffl * 1.1);
    const char *cn[2];
    int64_t *cv[2];
    CHECK(gp_layer_counters(&l, cn, cv, 2) == 1 && !strcmp(cn[0], "bn.num_batches_tracked"));
    gp_layer_destroy(&l);

    /* type names round-trip */
    int ok = 1;
    for (int t = 0; t < GP_LAYER_TYPE_COUNT; t++) {
        gp_layer_type back;
        ok &= gp_layer_type_parse(gp_layer_type_name((gp_layer_type)t), &back) &&
              back == (gp_layer_type)t;
    }
    CHECK(ok);
    gp_layer_type junk;
    CHECK(!gp_layer_type_parse("conv3d", &junk));
}

/* ---- shape inference messages ---------------------------------------------- */

static void test_errors(gp_device *dev)
{
    gp_layer l;
    gp_shape flat = gp_shape_2d(1, 784), img = gp_shape_4d(1, 1, 28, 28);
    gp_layer_spec s = spec_of(GP_LAYER_CONV2D);
    s.out = 8;
    s.kernel = gp_hw_square(3);
    snprintf(s.file, sizeof s.file, "cfg.yaml");
    s.line = 12;
    s.column = 7;
    CHECK_ERR(gp_layer_create(&s, 3, &flat, dev, 1, &l), GP_ERR_INVALID,
              "layer 3 (conv2d) at cfg.yaml:12:7: expected 4-D input (N, C, H, W) but got (N, 784)");
    s.kernel = gp_hw_square(31);
    CHECK_ERR(gp_layer_create(&s, 3, &img, dev, 1, &l), GP_ERR_INVALID,
              "kernel 31 is larger than the padded input 28x28");
    s.kernel = gp_hw_square(3);
    s.out = 0;
    CHECK_ERR(gp_layer_create(&s, 3, &img, dev, 1, &l), GP_ERR_INVALID, "out (the number");
    s.out = 8;
    s.in = 3;
    snprintf(s.name, sizeof s.name, "stem");
    CHECK_ERR(gp_layer_create(&s, 3, &img, dev, 1, &l), GP_ERR_INVALID,
              "layer 3 (conv2d 'stem') at cfg.yaml:12:7: in = 3 but the input has 1 channels");

    gp_layer_spec li = spec_of(GP_LAYER_LINEAR);
    li.out = 10;
    CHECK_ERR(gp_layer_create(&li, 4, &img, dev, 1, &l), GP_ERR_INVALID,
              "layer 4 (linear): expected input (N, features) or (N, T, features) but got "
              "(N, 1, 28, 28); add a flatten");
    gp_layer_spec ln = spec_of(GP_LAYER_LAYER_NORM);
    CHECK_ERR(gp_layer_create(&ln, 2, &img, dev, 1, &l), GP_ERR_INVALID,
              "layer 2 (layer_norm): layer_norm normalises the last dimension of (N, C) or "
              "(N, T, C) inputs, but got (N, 1, 28, 28)");
    ln.eps = 0.0f;
    CHECK_ERR(gp_layer_create(&ln, 2, &flat, dev, 1, &l), GP_ERR_INVALID,
              "eps = 0 must be a finite number > 0");
    li.in = 100;
    CHECK_ERR(gp_layer_create(&li, 4, &flat, dev, 1, &l), GP_ERR_INVALID,
              "in = 100 but the input has 784 features");
    li.in = 0;
    li.out = 0;
    CHECK_ERR(gp_layer_create(&li, 4, &flat, dev, 1, &l), GP_ERR_INVALID, "out (the number");

    gp_layer_spec mp = spec_of(GP_LAYER_MAXPOOL2D);
    mp.kernel = gp_hw_square(2);
    CHECK_ERR(gp_layer_create(&mp, 5, &flat, dev, 1, &l), GP_ERR_INVALID, "expected 4-D input");
    mp.kernel = gp_hw_square(0);
    CHECK_ERR(gp_layer_create(&mp, 5, &img, dev, 1, &l), GP_ERR_INVALID, "kernel is missing");
    mp.kernel = gp_hw_square(3);
    mp.padding = gp_hw_square(2);
    CHECK_ERR(gp_layer_create(&mp, 5, &img, dev, 1, &l), GP_ERR_INVALID, "half the kernel");
    gp_shape tiny = gp_shape_4d(1, 2, 2, 2);
    mp.padding = gp_hw_square(0);
    mp.kernel = gp_hw_square(3);
    CHECK_ERR(gp_layer_create(&mp, 5, &tiny, dev, 1, &l), GP_ERR_INVALID,
              "kernel 3 is larger than the padded input 2x2");

    /* per-axis windows: messages show [h, w] */
    mp.kernel = (gp_hw){1, 3};
    mp.padding = (gp_hw){0, 2};
    CHECK_ERR(gp_layer_create(&mp, 5, &img, dev, 1, &l), GP_ERR_INVALID,
              "padding = [0, 2] must be between 0 and half the kernel ([0, 1])");
    mp.padding = (gp_hw){0, 1};
    mp.stride = (gp_hw){2, 0};
    CHECK_ERR(gp_layer_create(&mp, 5, &img, dev, 1, &l), GP_ERR_INVALID,
              "stride = [2, 0] must be positive");
    mp.stride = (gp_hw){0, 0};
    mp.kernel = (gp_hw){1, 29};
    mp.padding = (gp_hw){0, 0};
    CHECK_ERR(gp_layer_create(&mp, 5, &img, dev, 1, &l), GP_ERR_INVALID,
              "kernel [1, 29] is larger than the padded input 28x28");
    s.kernel = (gp_hw){1, 7};
    s.padding = (gp_hw){0, -1};
    s.in = 0;
    CHECK_ERR(gp_layer_create(&s, 3, &img, dev, 1, &l), GP_ERR_INVALID,
              "padding = [0, -1] must not be negative");
    s.padding = (gp_hw){0, 0};
    s.stride = (gp_hw){1, 0};
    CHECK_ERR(gp_layer_create(&s, 3, &img, dev, 1, &l), GP_ERR_INVALID,
              "stride = [1, 0] must be at least 1");
    s.stride = (gp_hw){1, 1};
    s.kernel = (gp_hw){0, 7};
    CHECK_ERR(gp_layer_create(&s, 3, &img, dev, 1, &l), GP_ERR_INVALID,
              "kernel is missing or not positive (got [0, 7])");
    gp_layer_spec rsq = spec_of(GP_LAYER_RESIDUAL);
    rsq.out = 4;
    rsq.stride = (gp_hw){2, 1};
    CHECK_ERR(gp_layer_create(&rsq, 7, &img, dev, 1, &l), GP_ERR_INVALID,
              "stride = [2, 1] must be one number");
    gp_layer_spec fr = spec_of(GP_LAYER_FACTORIZED_REDUCE);
    fr.out = 7;
    CHECK_ERR(gp_layer_create(&fr, 14, &img, dev, 1, &l), GP_ERR_INVALID,
              "layer 14 (factorized_reduce): out = 7 must be a positive even number");
    fr.out = 0;
    CHECK_ERR(gp_layer_create(&fr, 14, &img, dev, 1, &l), GP_ERR_INVALID, "out = 0 must be");
    fr.out = 8;
    CHECK_ERR(gp_layer_create(&fr, 14, &flat, dev, 1, &l), GP_ERR_INVALID, "expected 4-D input");

    gp_layer_spec dr = spec_of(GP_LAYER_DROPOUT);
    dr.p = 1.5f;
    CHECK_ERR(gp_layer_create(&dr, 6, &flat, dev, 1, &l), GP_ERR_INVALID, "p = 1.5");
    gp_layer_spec rs = spec_of(GP_LAYER_RESIDUAL);
    CHECK_ERR(gp_layer_create(&rs, 7, &img, dev, 1, &l), GP_ERR_INVALID, "out (the number");
    rs.out = 4;
    CHECK_ERR(gp_layer_create(&rs, 7, &flat, dev, 1, &l), GP_ERR_INVALID, "expected 4-D input");
    gp_layer_spec gap = spec_of(GP_LAYER_GLOBAL_AVGPOOL);
    CHECK_ERR(gp_layer_create(&gap, 8, &flat, dev, 1, &l), GP_ERR_INVALID, "expected 4-D input");
    gp_layer_spec bn = spec_of(GP_LAYER_BATCHNORM);
    bn.momentum = 2.0f;
    CHECK_ERR(gp_layer_create(&bn, 9, &img, dev, 1, &l), GP_ERR_INVALID, "momentum");

    /* the U-Net layers' options and inputs */
    gp_layer_spec lr = spec_of(GP_LAYER_LEAKY_RELU);
    lr.slope = -0.1f;
    CHECK_ERR(gp_layer_create(&lr, 10, &img, dev, 1, &l), GP_ERR_INVALID,
              "layer 10 (leaky_relu): slope = -0.1 must be a finite number >= 0");
    lr.slope = NAN;
    CHECK_ERR(gp_layer_create(&lr, 10, &img, dev, 1, &l), GP_ERR_INVALID, "slope = nan");
    gp_layer_spec d2 = spec_of(GP_LAYER_DROPOUT2D);
    d2.p = 1.0f;
    CHECK_ERR(gp_layer_create(&d2, 11, &img, dev, 1, &l), GP_ERR_INVALID,
              "layer 11 (dropout2d): p = 1 must be a probability in [0, 1)");
    d2.p = 0.1f;
    CHECK_ERR(gp_layer_create(&d2, 11, &flat, dev, 1, &l), GP_ERR_INVALID,
              "expected 4-D input (N, C, H, W) but got (N, 784); dropout2d drops whole channels");
    gp_layer_spec in = spec_of(GP_LAYER_INSTANCE_NORM);
    CHECK_ERR(gp_layer_create(&in, 12, &flat, dev, 1, &l), GP_ERR_INVALID, "expected 4-D input");
    gp_shape dot = gp_shape_4d(1, 8, 1, 1);
    CHECK_ERR(gp_layer_create(&in, 12, &dot, dev, 1, &l), GP_ERR_INVALID,
              "input (N, 8, 1, 1) has one value per channel");
    in.eps = 0.0f;
    CHECK_ERR(gp_layer_create(&in, 12, &img, dev, 1, &l), GP_ERR_INVALID, "eps = 0 must be");
    gp_layer_spec up = spec_of(GP_LAYER_UPSAMPLE);
    up.scale = 0;
    CHECK_ERR(gp_layer_create(&up, 13, &img, dev, 1, &l), GP_ERR_INVALID,
              "layer 13 (upsample): scale = 0 must be an integer >= 1");
    up.scale = 2;
    CHECK_ERR(gp_layer_create(&up, 13, &flat, dev, 1, &l), GP_ERR_INVALID, "expected 4-D input");
    up.scale = 1 << 20;
    CHECK_ERR(gp_layer_create(&up, 13, &img, dev, 1, &l), GP_ERR_INVALID, "larger than");

    /* forward with an input of the wrong shape is refused, not run */
    li = spec_of(GP_LAYER_LINEAR);
    li.out = 3;
    CHECK_OK(gp_layer_create(&li, 2, &flat, dev, 1, &l));
    gp_shape wrong = gp_shape_2d(2, 783);
    gp_tensor x;
    CHECK_OK(gp_tensor_zeros(&x, dev, &wrong, GP_MEM_ACTIVATIONS));
    gp_tensor y = {0};
    gp_saved sv = {0};
    gp_fwd_ctx ctx = train_ctx();
    CHECK_ERR(gp_layer_forward(&l, &ctx, &x, &y, &sv), GP_ERR_INVALID,
              "input has shape (2, 783) but the layer was built for (N, 784)");
    CHECK(gp_tensor_mem(&y) == NULL);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);

    /* out of memory during init names the layer and the device */
    gp_device *small;
    gp_device_opts o = {.threads = 1, .capacity = 4096};
    CHECK_OK(gp_device_open("cpu:3", &o, &small));
    li.out = 100;
    CHECK_ERR(gp_layer_create(&li, 11, &flat, small, 1, &l), GP_ERR_OOM, "layer 11 (linear)");
    CHECK(small->alloc.current == 0);
    gp_device_close(small);
}

/* ---- initialisation --------------------------------------------------------- */

/* A layer's description cut by a small buffer (a profile's 96 bytes, a
 * message's) ends between two characters of its name, path and override,
 * not inside one: at every buffer size, the longest prefix of the whole
 * description that ends on a character boundary and fits. */
static void test_describe_utf8(void)
{
    gp_layer_spec s = spec_of(GP_LAYER_LINEAR);
    s.out = 4;
    for (int k = 0; k < 31; k++) memcpy(s.name + 2 * k, "\xc3\xa9", 3);        /* e acute */
    snprintf(s.file, sizeof s.file, "/d/");
    for (int k = 0; k < 40; k++) memcpy(s.file + 3 + 3 * k, "\xe6\x97\xa5", 4); /* CJK */
    s.line = 12;
    s.column = 7;
    snprintf(s.set, sizeof s.set, "model.layers.9.out=");
    for (int k = 0; k < 18; k++) memcpy(s.set + 19 + 4 * k, "\xf0\x9f\x99\x82", 5); /* emoji */
    char whole[1024], cut[1024];
    gp_layer_spec_describe(&s, 9, whole, sizeof whole);
    size_t n = strlen(whole);
    CHECK(n > 300 && gpt_utf8_valid(whole) && strstr(whole, s.name) && strstr(whole, s.file) &&
          strstr(whole, s.set));
    int bad = 0;
    for (size_t len = 1; len <= n + 1; len++) {
        memset(cut, 'x', sizeof cut);
        gp_layer_spec_describe(&s, 9, cut, len);
        size_t want = len - 1 < n ? len - 1 : n;
        while (want > 0 && want < n && ((unsigned char)whole[want] & 0xC0) == 0x80) want--;
        bool ok = strnlen(cut, len) == want && !memcmp(cut, whole, want) && gpt_utf8_valid(cut);
        if (!ok && bad++ < 3)
            fprintf(stderr, "describe in %zu bytes: \"%.*s\" (%zu bytes), want the first %zu "
                    "of \"%s\"\n", len, (int)strnlen(cut, len), cut, strnlen(cut, len), want,
                    whole);
    }
    CHECK_MSG(bad == 0, "%d of %zu buffer sizes cut a character of the description", bad, n + 1);
}

/* A layer's error message longer than its 512 bytes is cut between two
 * characters too: at each offset of 3-byte characters against the cut,
 * the message is valid UTF-8 and holds every whole character that fits. */
static void test_spec_error_utf8(void)
{
    gp_layer l = {.spec = spec_of(GP_LAYER_LINEAR), .index = 2};
    snprintf(l.spec.name, sizeof l.spec.name, "fc");
    for (int shift = 0; shift < 3; shift++) {
        char text[700] = "";
        for (int k = 0; k < shift; k++) strcat(text, "a");
        for (int k = 0; k < 200; k++) strcat(text, "\xe6\x97\xa5"); /* CJK */
        gp_layer_spec_error(&l, "%s", text);
        const char *m = gp_last_error(), *at = strstr(m, "'fc'): ");
        at = at ? at + 7 : NULL;
        size_t got = at ? strlen(at) : 0;
        CHECK_MSG(gpt_utf8_valid(m) && at && got + 3 > 511 && got <= 511 &&
                  !strncmp(at, text, got), "shift %d: \"%s\" (%zu bytes of the text)", shift,
                  m, got);
    }
}

static void test_init(gp_device *dev, gp_device *dev2)
{
    gp_layer_spec cs = spec_of(GP_LAYER_CONV2D);
    cs.out = 6;
    cs.kernel = gp_hw_square(3);
    gp_shape in = gp_shape_4d(1, 4, 8, 8);
    gp_layer a, b, c, d, e;
    CHECK_OK(gp_layer_create(&cs, 2, &in, dev, 77, &a));
    CHECK_OK(gp_layer_create(&cs, 2, &in, dev2, 77, &b)); /* other device */
    CHECK_OK(gp_layer_create(&cs, 3, &in, dev, 77, &c)); /* other index */
    CHECK_OK(gp_layer_create(&cs, 2, &in, dev, 78, &d)); /* other seed */
    int64_t nw = gp_tensor_numel(&a.params[0].value);
    float *wa = gpt_download(&a.params[0].value), *wb = gpt_download(&b.params[0].value);
    float *wc = gpt_download(&c.params[0].value), *wd = gpt_download(&d.params[0].value);
    float *ba = gpt_download(&a.params[1].value);
    CHECK(!memcmp(wa, wb, (size_t)nw * sizeof *wa));
    CHECK(memcmp(wa, wc, (size_t)nw * sizeof *wa) != 0);
    CHECK(memcmp(wa, wd, (size_t)nw * sizeof *wa) != 0);
    /* Kaiming-uniform(a = sqrt(5)): |w| <= 1/sqrt(fan_in), spread over it */
    double bound = 1.0 / sqrt(4.0 * 9.0), mx = 0, mean = 0;
    for (int64_t i = 0; i < nw; i++) {
        mx = fmax(mx, fabs(wa[i]));
        mean += wa[i];
    }
    CHECK(mx <= bound * (1 + 1e-6) && mx > 0.9 * bound);
    CHECK(fabs(mean / (double)nw) < 0.2 * bound);
    double bmx = 0;
    for (int k = 0; k < 6; k++) bmx = fmax(bmx, fabs(ba[k]));
    CHECK(bmx <= bound * (1 + 1e-6) && bmx > 0);
    /* weight and bias draw from different streams */
    CHECK(memcmp(wa, ba, 6 * sizeof *wa) != 0);
    free(wa); free(wb); free(wc); free(wd); free(ba);
    /* grads start at zero */
    float *g = gpt_download(&a.params[0].grad);
    int zero = 1;
    for (int64_t i = 0; i < nw; i++) zero &= g[i] == 0.0f;
    CHECK(zero);
    free(g);
    /* residual: conv1 and conv2 of the same block differ; placement-free */
    gp_layer_spec rs = spec_of(GP_LAYER_RESIDUAL);
    rs.out = 4;
    gp_layer r1, r2;
    gp_shape ri = gp_shape_4d(1, 4, 5, 5);
    CHECK_OK(gp_layer_create(&rs, 1, &ri, dev, 5, &r1));
    CHECK_OK(gp_layer_create(&rs, 1, &ri, dev2, 5, &r2));
    float *c1 = gpt_download(&r1.params[0].value), *c2 = gpt_download(&r1.params[5].value);
    float *c1b = gpt_download(&r2.params[0].value);
    CHECK(memcmp(c1, c2, 144 * sizeof *c1) != 0);
    CHECK(!memcmp(c1, c1b, 144 * sizeof *c1));
    free(c1); free(c2); free(c1b);
    gp_layer_destroy(&r1);
    gp_layer_destroy(&r2);
    /* linear */
    gp_layer_spec ls = spec_of(GP_LAYER_LINEAR);
    ls.out = 3;
    gp_shape li = gp_shape_2d(1, 25);
    CHECK_OK(gp_layer_create(&ls, 4, &li, dev, 77, &e));
    float *we = gpt_download(&e.params[0].value);
    double lmx = 0;
    for (int i = 0; i < 75; i++) lmx = fmax(lmx, fabs(we[i]));
    CHECK(lmx <= 0.2 * (1 + 1e-6) && lmx > 0.15);
    free(we);
    gp_layer_destroy(&a);
    gp_layer_destroy(&b);
    gp_layer_destroy(&c);
    gp_layer_destroy(&d);
    gp_layer_destroy(&e);
}

/* init: kaiming_normal_fan_out (torchvision's ResNet): the weights of a
 * large conv are normal(0, sqrt(2 / (K KH KW))) within statistical
 * tolerance (mean, std, 4th moment, the share within one std), identical
 * for the same seed on two devices, a fresh draw for another layer index;
 * the bias stays PyTorch's uniform.  Non-square kernels count KH * KW; the
 * composite layers hand the option to their convolutions. */
static void test_init_kaiming_normal(gp_device *dev, gp_device *dev2)
{
    gp_layer_spec cs = spec_of(GP_LAYER_CONV2D);
    cs.out = 256;
    cs.kernel = gp_hw_square(3);
    cs.init = GP_INIT_KAIMING_NORMAL_FAN_OUT;
    gp_shape in = gp_shape_4d(1, 64, 4, 4);
    gp_layer a, b, c;
    CHECK_OK(gp_layer_create(&cs, 2, &in, dev, 77, &a));
    CHECK_OK(gp_layer_create(&cs, 2, &in, dev2, 77, &b));
    CHECK_OK(gp_layer_create(&cs, 3, &in, dev, 77, &c));
    int64_t nw = gp_tensor_numel(&a.params[0].value); /* 147456 */
    float *wa = gpt_download(&a.params[0].value), *wb = gpt_download(&b.params[0].value);
    float *wc = gpt_download(&c.params[0].value), *ba = gpt_download(&a.params[1].value);
    CHECK(!memcmp(wa, wb, (size_t)nw * sizeof *wa));
    CHECK(memcmp(wa, wc, (size_t)nw * sizeof *wa) != 0);
    double std = sqrt(2.0 / (256.0 * 9.0)), m1 = 0, m2 = 0, m4 = 0;
    int64_t within = 0;
    for (int64_t i = 0; i < nw; i++) {
        double z = wa[i] / std;
        m1 += z;
        m2 += z * z;
        m4 += z * z * z * z;
        within += fabs(z) < 1.0;
    }
    m1 /= (double)nw;
    m2 /= (double)nw;
    m4 /= (double)nw;
    double n = (double)nw;
    CHECK_NEAR(m1, 0.0, 5.0 / sqrt(n), 0);
    CHECK_NEAR(sqrt(m2), 1.0, 5.0 * sqrt(0.5 / n), 0);
    CHECK_NEAR(m4, 3.0, 5.0 * sqrt(96.0 / n), 0);
    CHECK_NEAR((double)within / n, 0.682689, 5.0 * sqrt(0.6827 * 0.3173 / n), 0);
    double bound = 1.0 / sqrt(64.0 * 9.0), bmx = 0;
    for (int k = 0; k < 256; k++) bmx = fmax(bmx, fabs(ba[k]));
    CHECK(bmx <= bound * (1 + 1e-6) && bmx > 0.9 * bound);
    free(wa); free(wb); free(wc); free(ba);
    gp_layer_destroy(&a);
    gp_layer_destroy(&b);
    gp_layer_destroy(&c);

    /* 1x7: fan_out = K * 7 */
    cs.out = 512;
    cs.kernel = (gp_hw){1, 7};
    cs.padding = (gp_hw){0, 3};
    cs.bias = false;
    CHECK_OK(gp_layer_create(&cs, 4, &in, dev, 77, &a));
    nw = gp_tensor_numel(&a.params[0].value);
    wa = gpt_download(&a.params[0].value);
    std = sqrt(2.0 / (512.0 * 7.0));
    m2 = 0;
    for (int64_t i = 0; i < nw; i++) m2 += (double)wa[i] * wa[i];
    CHECK_NEAR(sqrt(m2 / (double)nw) / std, 1.0, 5.0 * sqrt(0.5 / (double)nw), 0);
    CHECK(a.n_params == 1);
    free(wa);
    gp_layer_destroy(&a);

    /* inside composites: a factorized reduce's conv1 (K/2 = 256 outputs, 1x1)
     * and a residual block's conv1 (K = 128, 3x3), placement-free */
    gp_layer_spec fs = spec_of(GP_LAYER_FACTORIZED_REDUCE);
    fs.out = 512;
    fs.init = GP_INIT_KAIMING_NORMAL_FAN_OUT;
    CHECK_OK(gp_layer_create(&fs, 5, &in, dev, 9, &a));
    CHECK_OK(gp_layer_create(&fs, 5, &in, dev2, 9, &b));
    nw = gp_tensor_numel(&a.params[0].value);
    wa = gpt_download(&a.params[0].value);
    wb = gpt_download(&b.params[0].value);
    wc = gpt_download(&a.params[1].value);
    CHECK(!memcmp(wa, wb, (size_t)nw * sizeof *wa));
    CHECK(memcmp(wa, wc, (size_t)nw * sizeof *wa) != 0); /* conv1 and conv2 differ */
    std = sqrt(2.0 / 256.0);
    m2 = 0;
    for (int64_t i = 0; i < nw; i++) m2 += (double)wa[i] * wa[i];
    CHECK_NEAR(sqrt(m2 / (double)nw) / std, 1.0, 5.0 * sqrt(0.5 / (double)nw), 0);
    free(wa); free(wb); free(wc);
    gp_layer_destroy(&a);
    gp_layer_destroy(&b);
    gp_layer_spec rs = spec_of(GP_LAYER_RESIDUAL);
    rs.out = 128;
    rs.init = GP_INIT_KAIMING_NORMAL_FAN_OUT;
    CHECK_OK(gp_layer_create(&rs, 6, &in, dev, 9, &a));
    nw = gp_tensor_numel(&a.params[0].value);
    wa = gpt_download(&a.params[0].value);
    std = sqrt(2.0 / (128.0 * 9.0));
    m2 = 0;
    for (int64_t i = 0; i < nw; i++) m2 += (double)wa[i] * wa[i];
    CHECK_NEAR(sqrt(m2 / (double)nw) / std, 1.0, 5.0 * sqrt(0.5 / (double)nw), 0);
    free(wa);
    gp_layer_destroy(&a);
}

/* A factorized reduce's norm: two uneven micro-batches and a commit give
 * running statistics of the whole batch's concatenated convolutions
 * (unbiased variance, momentum 0.1, double reference); a recompute leaves
 * them alone; bn.num_batches_tracked counts the commit. */
static void test_fr_stats(gp_device *dev)
{
    hrng rng = {31};
    gp_layer_spec sp = spec_of(GP_LAYER_FACTORIZED_REDUCE);
    sp.out = 6;
    gp_shape in = gp_shape_4d(5, 3, 5, 6);
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 2, &in, dev, 3, &l));
    int64_t nx = gp_shape_numel(&in);
    float *xh = malloc((size_t)nx * sizeof *xh);
    fill_sym(&rng, xh, nx, 1.0f);
    gp_tensor x = gpt_upload(dev, &in, xh);
    gp_fwd_ctx ctx = train_ctx();
    ctx.batch_total = 5;
    const char *cn[1];
    int64_t *cv[1];
    CHECK(gp_layer_counters(&l, cn, cv, 1) == 1);
    for (int rec = 1; rec >= 0; rec--) { /* a recompute-only step first: no effect */
        for (int h = 0; h < 2; h++) {
            gp_tensor part = gp_tensor_slice(&x, h ? 2 : 0, h ? 3 : 2), y = {0};
            gp_saved s = {0};
            gp_fwd_ctx c = ctx;
            c.sample_offset = h ? 2 : 0;
            c.recompute = rec;
            CHECK_OK(gp_layer_forward(&l, &c, &part, &y, &s));
            gp_saved_free(&s);
            gp_tensor_free(&y);
        }
        CHECK_OK(l.ops->commit(&l));
        CHECK(*cv[0] == 1 - rec);
    }
    double *w1 = download_d(&l.params[0].value), *w2 = download_d(&l.params[1].value);
    double *xd = malloc((size_t)nx * sizeof *xd);
    for (int64_t i = 0; i < nx; i++) xd[i] = xh[i];
    int64_t S = 3 * 3, K = 6;
    double *cat = calloc((size_t)(5 * K * S), sizeof *cat);
    ref_fr_cat(&in, K, xd, w1, w2, cat);
    double mean[6], var[6];
    ref_bn_stats(5, K, S, cat, mean, var);
    float *rm = gpt_download(&l.params[param_index(&l, "bn.running_mean")].value);
    float *rv = gpt_download(&l.params[param_index(&l, "bn.running_var")].value);
    for (int k = 0; k < K; k++) {
        double n = 5.0 * (double)S;
        CHECK_NEAR(rm[k], 0.1 * mean[k], 1e-5, 1e-4);
        CHECK_NEAR(rv[k], 0.9 + 0.1 * var[k] * n / (n - 1), 1e-5, 1e-4);
    }
    free(rm);
    free(rv);
    free(w1);
    free(w2);
    free(xd);
    free(xh);
    free(cat);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);
}

/* The two average divisors on a case small enough to write out: ones
 * (1, 1, 2, 2), a 3x3 window, stride 1, padding 1: each window holds the
 * four ones, so the average is 4/9 counting the padding (PyTorch's
 * default) and 1 without it; every element is in all four windows, so
 * the gradient of the outputs' sum is 4 * 1/9 and 4 * 1/4 per element.
 * Per axis: kernel (1, 3), padding (0, 1) on one row of 1, 2, 3:
 * (0+1+2)/3, (1+2+3)/3, (2+3+0)/3 vs /2, /3, /2. */
static void test_avgpool_divisor(gp_device *dev)
{
    for (int incl = 0; incl < 2; incl++) {
        gp_layer_spec sp = spec_of(GP_LAYER_AVGPOOL2D);
        sp.kernel = gp_hw_square(3);
        sp.stride = gp_hw_square(1);
        sp.padding = gp_hw_square(1);
        sp.count_include_pad = incl;
        gp_shape in = gp_shape_4d(1, 1, 2, 2);
        gp_layer l;
        CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &l));
        float ones[4] = {1, 1, 1, 1};
        gp_tensor x = gpt_upload(dev, &in, ones), y = {0}, dy = gpt_upload(dev, &in, ones), dx = {0};
        gp_saved s = {0};
        gp_fwd_ctx ctx = train_ctx();
        CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &s));
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, &dx, &s));
        float *yh = gpt_download(&y), *dxh = gpt_download(&dx);
        double want = incl ? 4.0 / 9.0 : 1.0, gwant = incl ? 4.0 / 9.0 : 1.0;
        for (int i = 0; i < 4; i++) {
            CHECK_NEAR(yh[i], want, 1e-6, 0);
            CHECK_NEAR(dxh[i], gwant, 1e-5, 0);
        }
        free(yh);
        free(dxh);
        gp_saved_free(&s);
        gp_tensor_free(&x);
        gp_tensor_free(&y);
        gp_tensor_free(&dy);
        gp_tensor_free(&dx);
        gp_layer_destroy(&l);

        sp.kernel = (gp_hw){1, 3};
        sp.padding = (gp_hw){0, 1};
        in = gp_shape_4d(1, 1, 1, 3);
        CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 1, &l));
        float row[3] = {1, 2, 3};
        x = gpt_upload(dev, &in, row);
        y = (gp_tensor){0};
        CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &s));
        yh = gpt_download(&y);
        CHECK_NEAR(yh[0], incl ? 1.0 : 1.5, 1e-6, 0);
        CHECK_NEAR(yh[1], 2.0, 1e-6, 0);
        CHECK_NEAR(yh[2], incl ? 5.0 / 3.0 : 2.5, 1e-6, 0);
        free(yh);
        gp_saved_free(&s);
        gp_tensor_free(&x);
        gp_tensor_free(&y);
        gp_layer_destroy(&l);
    }
}

/* ReLU lets a NaN through, as PyTorch does (relu(nan) = nan), so the loss
 * sees it; infinities and signs as the definition says. */
static void test_relu_nonfinite(gp_device *dev)
{
    float h[6] = {NAN, -NAN, INFINITY, -INFINITY, -2.0f, 3.0f}, o[6];
    gp_shape sh = gp_shape_2d(1, 6);
    gp_tensor x, y;
    CHECK_OK(gp_tensor_alloc(&x, dev, &sh, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_alloc(&y, dev, &sh, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&x), h, 6));
    CHECK_OK(gp_dev_relu_fwd(dev, gp_f32(&x), gp_f32(&y), 6));
    CHECK_OK(gp_dev_download(dev, o, gp_f32(&y), 6));
    CHECK_OK(gp_dev_synchronize(dev));
    CHECK(isnan(o[0]) && isnan(o[1]));
    CHECK(o[2] == INFINITY && o[3] == 0.0f && o[4] == 0.0f && o[5] == 3.0f);
    gp_tensor_free(&x);
    gp_tensor_free(&y);
}

/* Leaky ReLU lets a NaN through too; infinities follow the formula. */
static void test_leaky_relu_nonfinite(gp_device *dev)
{
    float h[6] = {NAN, -NAN, INFINITY, -INFINITY, -2.0f, 3.0f}, o[6];
    gp_shape sh = gp_shape_2d(1, 6);
    gp_tensor x, y;
    CHECK_OK(gp_tensor_alloc(&x, dev, &sh, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_alloc(&y, dev, &sh, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&x), h, 6));
    CHECK_OK(gp_dev_leaky_relu_fwd(dev, gp_f32(&x), gp_f32(&y), 6, 0.25f));
    CHECK_OK(gp_dev_download(dev, o, gp_f32(&y), 6));
    CHECK_OK(gp_dev_synchronize(dev));
    CHECK(isnan(o[0]) && isnan(o[1]));
    CHECK(o[2] == INFINITY && o[3] == -INFINITY && o[4] == -0.5f && o[5] == 3.0f);
    gp_tensor_free(&x);
    gp_tensor_free(&y);
}

int main(void)
{
    gp_device *dev = NULL, *dev2 = NULL;
    gp_device_opts opts = {.threads = 2};
    gp_status s = gp_device_open("cpu:0", &opts, &dev);
    if (s != GP_OK) {
        fprintf(stderr, "cannot open cpu:0: %s\n", gp_last_error());
        return 1;
    }
    CHECK_OK(gp_device_open("cpu:1", &opts, &dev2));
    gp_device_bind_thread(dev);
    test_all_layers(dev);
    test_dropout(dev);
    test_linear_empty_batch(dev);
    test_bn_stats(dev);
    test_bn_slots(dev);
    test_cross_entropy(dev);
    test_counts(dev);
    test_errors(dev);
    test_describe_utf8();
    test_spec_error_utf8();
    test_init(dev, dev2);
    test_init_kaiming_normal(dev, dev2);
    test_avgpool_divisor(dev);
    test_fr_stats(dev);
    test_relu_nonfinite(dev);
    test_dropout2d(dev);
    test_instance_norm(dev);
    test_upsample(dev);
    test_bce(dev);
    test_leaky_relu_nonfinite(dev);
    /* every byte came back (the backend's own scratch arena aside) */
    for (int c = 0; c < GP_MEM_COUNT; c++) {
        if (c == GP_MEM_WORKSPACE) continue;
        CHECK_MSG(dev->alloc.cur_by[c] == 0 && dev2->alloc.cur_by[c] == 0,
                  "leaked %zu + %zu bytes of %s", dev->alloc.cur_by[c], dev2->alloc.cur_by[c],
                  gp_mem_category_name((gp_mem_category)c));
    }
    gp_device_close(dev2);
    gp_device_close(dev);
    return gpt_finish("test_layers");
}
