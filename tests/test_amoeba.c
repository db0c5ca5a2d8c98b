/*
 * test_amoeba.c — AmoebaNet-D: the amoeba_cell layer and model.amoebanet.
 *
 *   - each kind of cell (normal and reduction; with a popped tensor of the
 *     input's size, of twice it (the cell after a reduction: factorized
 *     reduce, odd sizes included), and none (the first cell, reduce2 a
 *     convolution or the identity)) against a naive double-precision
 *     reference written here from torchgpipe's genotype, transcribed
 *     independently of the layer's own table;
 *   - the gradient of every input and of every parameter (sampled) against
 *     central differences;
 *   - parameter and counter names as torchgpipe's state dict names them
 *     inside a cell;
 *   - the family: (L, D) = (18, 256) and (18, 208) have torchgpipe's
 *     122,470,120 and 81,505,540 parameters in 28 layers (torchgpipe's 24:
 *     stem1 and classify are three layers each here), the cells pop what
 *     the layer two back stashed, and bad sizes are errors naming the key;
 *   - transparency: AmoebaNet-D (6, 32) at 64x64 on 1, 2 and 3 stages,
 *     with the (x, skip) pair crossing every boundary, m in {1, 4}, every
 *     checkpoint mode: per-step losses, the first step's gradients and the
 *     parameters after the steps equal the single-device run's bit for bit;
 *     on bf16 storage too (3 stages, m = 4), where each cell keeps its
 *     inner maps in bf16 (checked against the reference and the FP32 cell
 *     within bf16's rounding, and by the bytes it keeps).
 * Runs under ThreadSanitizer in CI (label "threads").
 */
#include "config/config.h"
#include "test_ref.h"

/* ---- the reference cell ------------------------------------------------------- */

/* A host tensor in double. */
typedef struct {
    double *d;
    gp_shape s;
} htensor;

static htensor hnew(gp_shape s)
{
    htensor t = {calloc((size_t)gp_shape_numel(&s), sizeof(double)), s};
    return t;
}

/* The cell's parameters on the host, looked up by torchgpipe's names. */
typedef struct {
    const gp_layer *l;
    double **P;
} params;

static const double *par(const params *p, const char *prefix, const char *name)
{
    char full[96];
    snprintf(full, sizeof full, "%s.%s", prefix, name);
    int i = param_index(p->l, full);
    CHECK_MSG(i >= 0, "no parameter '%s'", full);
    static const double zero[1024] = {0};
    return i >= 0 ? p->P[i] : zero;
}

/* relu -> conv (no bias) -> norm (batch statistics) from units j, j+1, j+2
 * of Sequential `base`. */
static htensor ref_rcb(const params *p, const char *base, int j, const htensor *x, int64_t out,
                       gp_hw k, gp_hw st, gp_hw pad)
{
    int64_t nx = gp_shape_numel(&x->s);
    double *r = calloc((size_t)nx, sizeof *r);
    ref_relu(nx, x->d, r);
    geom g = geom_of(&x->s, out, k, st, pad);
    htensor c = hnew(gp_shape_4d(g.n, out, g.oh, g.ow)), y = hnew(c.s);
    char pc[64], pb[64];
    snprintf(pc, sizeof pc, "%s.%d", base, j + 1);
    snprintf(pb, sizeof pb, "%s.%d", base, j + 2);
    ref_conv(&g, r, par(p, pc, "weight"), NULL, c.d);
    ref_bn(g.n, out, g.oh * g.ow, 1e-5, c.d, par(p, pb, "weight"), par(p, pb, "bias"), NULL, NULL,
           y.d);
    free(r);
    free(c.d);
    return y;
}

static htensor ref_fr(const params *p, const char *base, const htensor *x, int64_t out)
{
    int64_t oh = (x->s.dims[2] + 1) / 2, ow = (x->s.dims[3] + 1) / 2, n = x->s.dims[0];
    htensor cat = hnew(gp_shape_4d(n, out, oh, ow)), y = hnew(cat.s);
    char pb[64];
    snprintf(pb, sizeof pb, "%s.bn", base);
    ref_fr_cat(&x->s, out, x->d, par(p, base, "conv1.weight"), par(p, base, "conv2.weight"), cat.d);
    ref_bn(n, out, oh * ow, 1e-5, cat.d, par(p, pb, "weight"), par(p, pb, "bias"), NULL, NULL, y.d);
    free(cat.d);
    return y;
}

static htensor ref_pool_op(const htensor *x, bool is_max, int64_t k, int64_t st, int64_t pad)
{
    geom g = geom_of(&x->s, x->s.dims[1], gp_hw_square(k), gp_hw_square(st), gp_hw_square(pad));
    htensor y = hnew(gp_shape_4d(g.n, g.c, g.oh, g.ow));
    ref_pool(&g, is_max, false, x->d, y.d);
    return y;
}

static htensor hcopy(const htensor *x)
{
    htensor y = hnew(x->s);
    memcpy(y.d, x->d, (size_t)gp_shape_numel(&x->s) * sizeof *y.d);
    return y;
}

/* One operation of the genotype, by torchgpipe's name. */
static htensor ref_op(const params *p, int k, const char *op, const htensor *x, int64_t c, int st)
{
    char base[48];
    snprintf(base, sizeof base, "operations.%d.module", k);
    gp_hw one = gp_hw_square(1), zero = gp_hw_square(0), s = gp_hw_square(st);
    if (!strcmp(op, "none")) return st == 1 ? hcopy(x) : ref_fr(p, base, x, c);
    /* torchgpipe's max_pool_3x3 is nn.AvgPool2d(3, stride, 1, count_include_pad=False) */
    if (!strcmp(op, "avg_pool_3x3") || !strcmp(op, "max_pool_3x3"))
        return ref_pool_op(x, false, 3, st, 1);
    if (!strcmp(op, "max_pool_2x2")) return ref_pool_op(x, true, 2, st, 0);
    if (!strcmp(op, "conv_1x1")) return ref_rcb(p, base, 0, x, c, one, s, zero);
    htensor a, b, y;
    if (!strcmp(op, "conv_3x3")) {
        a = ref_rcb(p, base, 0, x, c / 4, one, one, zero);
        b = ref_rcb(p, base, 3, &a, c / 4, gp_hw_square(3), s, one);
        y = ref_rcb(p, base, 6, &b, c, one, one, zero);
        free(a.d);
        free(b.d);
        return y;
    }
    CHECK(!strcmp(op, "conv_1x7_7x1"));
    a = ref_rcb(p, base, 0, x, c / 4, one, one, zero);
    b = ref_rcb(p, base, 3, &a, c / 4, (gp_hw){1, 7}, (gp_hw){1, st}, (gp_hw){0, 3});
    free(a.d);
    a = ref_rcb(p, base, 6, &b, c / 4, (gp_hw){7, 1}, (gp_hw){st, 1}, (gp_hw){3, 0});
    free(b.d);
    y = ref_rcb(p, base, 9, &a, c, one, one, zero);
    free(a.d);
    return y;
}

/* torchgpipe's genotype.py, AmoebaNet-D (written out again here, from the
 * source, so that a slip in the layer's copy shows). */
static const struct {
    int from;
    const char *op;
} k_ref_normal[10] = {{1, "conv_1x1"}, {1, "max_pool_3x3"}, {1, "none"}, {0, "conv_1x7_7x1"},
                      {0, "conv_1x1"}, {0, "conv_1x7_7x1"}, {2, "max_pool_3x3"}, {2, "none"},
                      {1, "avg_pool_3x3"}, {5, "conv_1x1"}},
  k_ref_reduction[10] = {{0, "max_pool_2x2"}, {0, "max_pool_3x3"}, {2, "none"},
                         {1, "conv_3x3"}, {2, "conv_1x7_7x1"}, {2, "max_pool_3x3"},
                         {3, "none"}, {1, "max_pool_2x2"}, {2, "avg_pool_3x3"},
                         {3, "conv_1x1"}};

/* The cell's forward (training: batch statistics) on x and p (NULL: none). */
static htensor ref_cell(const params *pp, const htensor *x, const htensor *p)
{
    const gp_layer_spec *sp = &pp->l->spec;
    int64_t c = sp->out;
    bool red = sp->reduction;
    const htensor *skip = p ? p : x;
    gp_hw one = gp_hw_square(1), zero = gp_hw_square(0);
    htensor s[7];
    s[0] = ref_rcb(pp, "reduce1", 0, x, c, one, one, zero);
    if (skip->s.dims[2] != x->s.dims[2]) s[1] = ref_fr(pp, "reduce2", skip, c);
    else if (skip->s.dims[1] != c) s[1] = ref_rcb(pp, "reduce2", 0, skip, c, one, one, zero);
    else s[1] = hcopy(skip);
    for (int t = 0; t < 5; t++) {
        htensor h[2];
        for (int q = 0; q < 2; q++) {
            int k = 2 * t + q;
            int from = red ? k_ref_reduction[k].from : k_ref_normal[k].from;
            const char *op = red ? k_ref_reduction[k].op : k_ref_normal[k].op;
            h[q] = ref_op(pp, k, op, &s[from], c, red && from < 2 ? 2 : 1);
        }
        CHECK(gp_shape_equal(&h[0].s, &h[1].s));
        s[2 + t] = hnew(h[0].s);
        for (int64_t i = 0; i < gp_shape_numel(&h[0].s); i++)
            s[2 + t].d[i] = h[0].d[i] + h[1].d[i];
        free(h[0].d);
        free(h[1].d);
    }
    static const int normal_concat[4] = {0, 3, 4, 6}, reduction_concat[3] = {4, 5, 6};
    const int *cc = red ? reduction_concat : normal_concat;
    int nc = red ? 3 : 4;
    int64_t n = x->s.dims[0], hw = s[cc[0]].s.dims[2] * s[cc[0]].s.dims[3];
    htensor y = hnew(gp_shape_4d(n, c * nc, s[cc[0]].s.dims[2], s[cc[0]].s.dims[3]));
    for (int64_t i = 0; i < n; i++)
        for (int q = 0; q < nc; q++)
            memcpy(y.d + (i * c * nc + q * c) * hw, s[cc[q]].d + i * c * hw,
                   (size_t)(c * hw) * sizeof *y.d);
    for (int k = 0; k < 7; k++) free(s[k].d);
    return y;
}

/* ---- the layer against it ------------------------------------------------------- */

static gp_device *devs[3];

/* The training forward the gradient checks differentiate: batch norms
 * use the batch's statistics and leave their accumulators alone. */
static const gp_fwd_ctx k_fd_ctx = {.training = true, .recompute = true, .seed = 5};

/* Central differences on up to `most` elements of t (all if fewer; else
 * spread by the rng), at steps 4e-3, 1e-3, 2.5e-4 and 6e-5: a cell is a
 * stack of relus, pools and batch norms whose batch statistics move every
 * pre-activation of a channel at once, so a step crosses kinks that no
 * single step avoids everywhere, yet a right gradient matches at one of
 * them and a wrong one (a branch's gradient lost or misrouted) at none. */
static void fd(const char *what, gp_layer *l, const gp_tensor *x, gp_tensor *t, const double *r,
               const float *an, int most, hrng *rng)
{
    static const float steps[4] = {4e-3f, 1e-3f, 2.5e-4f, 6e-5f};
    int64_t n = gp_tensor_numel(t), m = n <= most ? n : most;
    float *h = gpt_download(t);
    int bad = 0;
    double num2 = 0, diff2 = 0;
    for (int64_t q = 0; q < m; q++) {
        int64_t i = n <= most ? q : (int64_t)(hrng_unit(rng) * (double)n);
        float o = h[i];
        double best = INFINITY, best_num = 0;
        for (int e = 0; e < 4 && fabs(best) > 5e-3 + 2e-2 * fabs(best_num); e++) {
            float v = o + steps[e];
            CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &v, 1));
            double lp = loss_of(l, &k_fd_ctx, x, r);
            v = o - steps[e];
            CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &v, 1));
            double lm = loss_of(l, &k_fd_ctx, x, r);
            CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &o, 1));
            double step = (double)(float)(o + steps[e]) - (double)(float)(o - steps[e]);
            double num = (lp - lm) / step;
            if (fabs(an[i] - num) < fabs(best)) {
                best = an[i] - num;
                best_num = num;
            }
        }
        num2 += best_num * best_num;
        diff2 += best * best;
        if (fabs(best) > 5e-3 + 2e-2 * fabs(best_num) && bad++ < 3)
            fprintf(stderr, "  %s [%lld]: analytic %.7g, numeric %.7g\n", what, (long long)i,
                    (double)an[i], best_num);
    }
    CHECK_MSG(bad == 0, "%s: %d of %lld elements off", what, bad, (long long)m);
    CHECK_MSG(sqrt(diff2) <= 2e-2 * sqrt(num2) + 1e-6, "%s: relative error %.3g", what,
              sqrt(diff2) / (sqrt(num2) + 1e-30));
    free(h);
}

/* The cell's parameters (and `also`'s, a cell of the same spec) set at
 * random, a random affine so the norms' gradients show; P[p] their values
 * in double, for the reference. */
static void random_params(gp_layer *l, gp_layer *also, hrng *rng, double **P)
{
    GP_ASSERT(l->n_params <= GPT_MAX_PARAMS);
    for (int p = 0; p < l->n_params; p++) {
        int64_t n = gp_tensor_numel(&l->params[p].value);
        float *h = malloc((size_t)n * sizeof *h);
        bool pos = strstr(l->params[p].name, "var") || (l->params[p].no_decay &&
                                                        strstr(l->params[p].name, "weight"));
        for (int64_t i = 0; i < n; i++) {
            double u = hrng_unit(rng);
            h[i] = (float)(pos ? 0.5 + u : u - 0.5);
        }
        set_param(l, p, h);
        if (also) set_param(also, p, h);
        P[p] = download_d(&l->params[p].value);
        free(h);
    }
}

/* A cell of C channels per state, popping "prev" where `pops`. */
static gp_layer_spec cell_spec(bool reduction, int64_t c, bool pops)
{
    gp_layer_spec sp = gp_layer_spec_default(GP_LAYER_AMOEBA_CELL);
    sp.out = c;
    sp.reduction = reduction;
    if (pops) {
        sp.n_pop = 1;
        snprintf(sp.pop[0], sizeof sp.pop[0], "prev");
    }
    return sp;
}

static void check_cell(gp_device *dev, bool reduction, int64_t c, gp_shape xs, const gp_shape *ps,
                       const char *reduce2_param)
{
    gp_layer_spec sp = cell_spec(reduction, c, ps != NULL);
    gp_shape in[2] = {xs, ps ? *ps : xs};
    gp_layer l;
    gp_status cs = gp_layer_create(&sp, 4, in, dev, 11, &l);
    CHECK_OK(cs);
    if (cs != GP_OK) return;
    char what[160];
    snprintf(what, sizeof what, "%s cell, C %lld, input (%lld, %lld, %lld), pop %s",
             reduction ? "reduction" : "normal", (long long)c, (long long)xs.dims[1],
             (long long)xs.dims[2], (long long)xs.dims[3], ps ? "yes" : "none");
    /* torchgpipe's names */
    CHECK_MSG(param_index(&l, "reduce1.1.weight") == 0 && param_index(&l, "reduce1.2.bias") >= 0,
              "%s: reduce1's names", what);
    CHECK_MSG(!reduce2_param || param_index(&l, reduce2_param) >= 0, "%s: no %s", what,
              reduce2_param);
    const char *deep = reduction ? "operations.4.module.10.weight" : "operations.5.module.11.bias";
    CHECK_MSG(param_index(&l, deep) >= 0, "%s: no %s", what, deep);
    const char *cn[32];
    int64_t *cv[32];
    int ncount = gp_layer_counters(&l, cn, cv, 32), norms = 0;
    for (int p = 0; p < l.n_params; p++) norms += strstr(l.params[p].name, "running_mean") != NULL;
    CHECK_MSG(ncount == norms && ncount > 0 && !strcmp(cn[0], "reduce1.2.num_batches_tracked"),
              "%s: %d counters for %d norms", what, ncount, norms);

    hrng rng = {(uint64_t)(c * 131 + xs.dims[2] + (reduction ? 7 : 0) + (ps ? 3 : 0))};
    int nin = l.n_in;
    gp_tensor x[2] = {{0}};
    htensor hx[2];
    for (int q = 0; q < nin; q++) {
        int64_t n = gp_shape_numel(&in[q]);
        float *h = malloc((size_t)n * sizeof *h);
        hx[q] = hnew(in[q]);
        for (int64_t i = 0; i < n; i++) hx[q].d[i] = h[i] = hrng_sym(&rng);
        x[q] = gpt_upload(dev, &in[q], h);
        free(h);
    }
    double *P[GPT_MAX_PARAMS] = {NULL};
    random_params(&l, NULL, &rng, P);
    params pp = {&l, P};
    htensor want = ref_cell(&pp, &hx[0], nin > 1 ? &hx[1] : NULL);

    gp_fwd_ctx ctx = {.training = true, .recompute = true, .seed = 5};
    gp_tensor y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(&l, &ctx, x, &y, &s));
    gp_shape ys = gp_tensor_shape(&y);
    CHECK_MSG(gp_shape_equal(&ys, &want.s), "%s: output shape", what);
    int64_t ny = gp_tensor_numel(&y);
    float *yh = gpt_download(&y);
    double err = 0;
    for (int64_t i = 0; i < ny && gp_shape_equal(&ys, &want.s); i++)
        err = fmax(err, fabs(yh[i] - want.d[i]));
    CHECK_MSG(err < 1e-4, "%s: forward max error %.3g against the reference", what, err);
    CHECK_MSG(gp_saved_bytes(&s) > 0, "%s: a training forward keeps what backward needs", what);

    double *r = malloc((size_t)ny * sizeof *r);
    float *rf = malloc((size_t)ny * sizeof *rf);
    for (int64_t i = 0; i < ny; i++) r[i] = rf[i] = hrng_sym(&rng);
    gp_tensor dy = gpt_upload(dev, &ys, rf), dx[2] = {{0}};
    CHECK_OK(gp_layer_zero_grad(&l));
    CHECK_OK(gp_layer_backward(&l, &ctx, x, &y, &dy, dx, &s));
    char name[256];
    for (int q = 0; q < nin; q++) {
        float *g = gpt_download(&dx[q]);
        snprintf(name, sizeof name, "%s: d%s", what, q ? "popped" : "x");
        fd(name, &l, x, &x[q], r, g, 64, &rng);
        free(g);
    }
    for (int p = 0; p < l.n_params; p++) {
        if (l.params[p].is_buffer) continue;
        float *g = gpt_download(&l.params[p].grad);
        snprintf(name, sizeof name, "%s: %s", what, l.params[p].name);
        fd(name, &l, x, &l.params[p].value, r, g, 8, &rng);
        free(g);
    }
    for (int q = 0; q < nin; q++) {
        gp_tensor_free(&x[q]);
        gp_tensor_free(&dx[q]);
        free(hx[q].d);
    }
    for (int p = 0; p < l.n_params; p++) free(P[p]);
    free(want.d);
    gp_tensor_free(&y);
    gp_tensor_free(&dy);
    gp_saved_free(&s);
    free(yh);
    free(r);
    free(rf);
    gp_layer_destroy(&l);
}

/* The cell on bf16 storage (gp_layer.out_dtype; FP32 math, each inner map
 * rounded once): its output near the double reference on the widened
 * input, its gradients near the FP32 cell's on the same values, and every
 * inner map it keeps for backward in bf16 (the storage adapter around the
 * whole cell would keep them in FP32: twice the bytes). */
static void check_cell_bf16(gp_device *dev, bool reduction, int64_t c, gp_shape xs,
                            const gp_shape *ps)
{
    gp_layer_spec sp = cell_spec(reduction, c, ps != NULL);
    gp_shape in[2] = {xs, ps ? *ps : xs};
    gp_layer lb, lf;
    CHECK_OK(gp_layer_create(&sp, 4, in, dev, 11, &lb));
    CHECK_OK(gp_layer_create(&sp, 4, in, dev, 11, &lf));
    lb.out_dtype = GP_BF16;
    char what[160];
    snprintf(what, sizeof what, "bf16 %s cell, C %lld, pop %s", reduction ? "reduction" : "normal",
             (long long)c, ps ? "yes" : "none");
    hrng rng = {(uint64_t)(c * 17 + xs.dims[2])};
    int nin = lb.n_in;
    gp_tensor xb[2] = {{0}}, xf[2] = {{0}};
    htensor hx[2];
    for (int q = 0; q < nin; q++) { /* values bf16 holds exactly */
        int64_t n = gp_shape_numel(&in[q]);
        float *h = malloc((size_t)n * sizeof *h);
        hx[q] = hnew(in[q]);
        for (int64_t i = 0; i < n; i++)
            hx[q].d[i] = h[i] = gp_ew_bf16_value(gp_ew_bf16_bits(hrng_sym(&rng)));
        xf[q] = gpt_upload(dev, &in[q], h);
        CHECK_OK(gp_tensor_as(&xb[q], &xf[q], GP_BF16, GP_MEM_ACTIVATIONS));
        free(h);
    }
    double *P[GPT_MAX_PARAMS] = {NULL};
    random_params(&lb, &lf, &rng, P);
    params pp = {&lb, P};
    htensor want = ref_cell(&pp, &hx[0], nin > 1 ? &hx[1] : NULL);
    gp_fwd_ctx ctx = {.training = true, .recompute = true, .seed = 5};
    gp_tensor yb = {0}, yf = {0};
    gp_saved sb = {0}, sf = {0};
    CHECK_OK(gp_layer_forward(&lb, &ctx, xb, &yb, &sb));
    CHECK_OK(gp_layer_forward(&lf, &ctx, xf, &yf, &sf));
    CHECK(yb.dtype == GP_BF16);
    int64_t ny = gp_tensor_numel(&yb), maps = 0, wide = 0;
    gp_tensor yw;
    CHECK_OK(gp_tensor_as(&yw, &yb, GP_F32, GP_MEM_ACTIVATIONS));
    float *yh = gpt_download(&yw);
    double err = 0, mean = 0;
    for (int64_t i = 0; i < ny; i++) {
        err = fmax(err, fabs(yh[i] - want.d[i]));
        mean += fabs(yh[i] - want.d[i]) / (double)ny;
    }
    /* bf16 keeps 8 bits; a dozen roundings on the way through batch norms */
    CHECK_MSG(err < 0.25 && mean < 0.02, "%s: forward error max %.3g, mean %.3g against the "
              "reference", what, err, mean);
    for (int k = 0; k < sb.n_sub; k++)
        for (int q = 0; q < GP_SAVED_MAX; q++) {
            const gp_tensor *t = &sb.sub[k].t[q];
            if (!t->owned || t->ndim != 4) continue; /* a map (not statistics) */
            maps++;
            wide += t->dtype != GP_BF16;
        }
    CHECK_MSG(maps > 10 && wide == 0, "%s: %lld of the %lld maps kept are not bf16", what,
              (long long)wide, (long long)maps);
    /* the maps no backward reads (every unit's batch-norm output, the
     * sums only relus, average pools, sums and the concatenation take, the
     * average pools' outputs) are dropped, their shapes kept: a normal
     * cell drops 21 (13 norms' outputs, 5 sums, 3 pools' outputs; 16
     * while the pools' backward read their input and output) */
    int64_t dropped = 0;
    size_t dropped_bytes = 0;
    for (int k = 0; k < sb.n_sub; k++)
        for (int q = 0; q < GP_SAVED_MAX; q++) {
            const gp_tensor *t = &sb.sub[k].t[q];
            if (t->ndim != 4 || gp_tensor_mem(t)) continue;
            dropped++;
            dropped_bytes += (size_t)gp_tensor_numel(t) * gp_dtype_size(t->dtype);
        }
    CHECK_MSG(reduction ? dropped >= 4 : dropped == 21,
              "%s: %lld maps dropped after the forward (want %s)", what, (long long)dropped,
              reduction ? "4 or more" : "21");
    CHECK_MSG(reduction || dropped_bytes * 4 >= gp_saved_bytes(&sb),
              "%s: the dropped maps are %zu bytes, the kept %zu", what, dropped_bytes,
              gp_saved_bytes(&sb));
    CHECK_MSG(gp_saved_bytes(&sb) == lb.ops->saved_bytes(&lb, xs.dims[0]),
              "%s: keeps %zu bytes, saved_bytes counts %zu", what, gp_saved_bytes(&sb),
              lb.ops->saved_bytes(&lb, xs.dims[0]));
    /* backward: near the FP32 cell's on the same values */
    gp_shape ys = gp_tensor_shape(&yb);
    float *rf = malloc((size_t)ny * sizeof *rf);
    for (int64_t i = 0; i < ny; i++) rf[i] = gp_ew_bf16_value(gp_ew_bf16_bits(hrng_sym(&rng)));
    gp_tensor dyf = gpt_upload(dev, &ys, rf), dyb, dxb[2] = {{0}}, dxf[2] = {{0}};
    CHECK_OK(gp_tensor_as(&dyb, &dyf, GP_BF16, GP_MEM_ACTIVATIONS));
    gp_tensor yfw;
    CHECK_OK(gp_tensor_as(&yfw, &yf, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_layer_zero_grad(&lb));
    CHECK_OK(gp_layer_zero_grad(&lf));
    CHECK_OK(gp_layer_backward(&lb, &ctx, xb, &yb, &dyb, dxb, &sb));
    CHECK_OK(gp_layer_backward(&lf, &ctx, xf, &yfw, &dyf, dxf, &sf));
    /* each input's gradient, then all the parameters' together (a bias's
     * gradient alone can be a sum that nearly cancels) */
    const gp_tensor *gb[GPT_MAX_PARAMS + 2], *gf[GPT_MAX_PARAMS + 2];
    int ng = 0;
    for (int q = 0; q < nin; q++, ng++) {
        gb[ng] = &dxb[q], gf[ng] = &dxf[q];
        CHECK(dxb[q].dtype == GP_BF16);
    }
    for (int p = 0; p < lb.n_params; p++)
        if (!lb.params[p].is_buffer) gb[ng] = &lb.params[p].grad, gf[ng++] = &lf.params[p].grad;
    double d2 = 0, n2 = 0;
    for (int k = 0; k < ng; k++) {
        gp_tensor w;
        CHECK_OK(gp_tensor_as(&w, gb[k], GP_F32, GP_MEM_ACTIVATIONS));
        float *a = gpt_download(&w), *b = gpt_download(gf[k]);
        for (int64_t i = 0; i < gp_tensor_numel(gf[k]); i++) {
            d2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            n2 += (double)b[i] * b[i];
        }
        if (k < nin || k == ng - 1) {
            CHECK_MSG(n2 > 0 && d2 <= 0.1 * 0.1 * n2, "%s: %s off the FP32 cell's by %.3g "
                      "(relative)", what, k == ng - 1 ? "the parameters' gradients" : k ? "dpopped"
                                                                                       : "dx",
                      n2 > 0 ? sqrt(d2 / n2) : sqrt(d2));
            d2 = n2 = 0;
        }
        free(a);
        free(b);
        gp_tensor_free(&w);
    }
    for (int q = 0; q < nin; q++) {
        gp_tensor *all[] = {&xb[q], &xf[q], &dxb[q], &dxf[q]};
        for (int k = 0; k < 4; k++) gp_tensor_free(all[k]);
        free(hx[q].d);
    }
    for (int p = 0; p < lb.n_params; p++) free(P[p]);
    gp_tensor *all[] = {&yb, &yf, &yw, &yfw, &dyf, &dyb};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
    gp_saved_free(&sb);
    gp_saved_free(&sf);
    free(want.d);
    free(yh);
    free(rf);
    gp_layer_destroy(&lb);
    gp_layer_destroy(&lf);
}

static void cells(gp_device *dev)
{
    gp_shape p_same = gp_shape_4d(2, 12, 5, 5), p_twice = gp_shape_4d(2, 8, 6, 6);
    gp_shape p_odd = gp_shape_4d(2, 8, 5, 5), p_red = gp_shape_4d(2, 16, 4, 4);
    /* a normal cell: reduce2 a convolution (12 -> 8 channels) */
    check_cell(dev, false, 8, gp_shape_4d(2, 16, 5, 5), &p_same, "reduce2.1.weight");
    /* after a reduction: the popped tensor is twice the size (and odd: ceil) */
    check_cell(dev, false, 8, gp_shape_4d(2, 24, 3, 3), &p_twice, "reduce2.conv1.weight");
    check_cell(dev, false, 8, gp_shape_4d(2, 24, 3, 3), &p_odd, "reduce2.bn.weight");
    /* a reduction cell, reduce2 the identity (16 channels already) */
    check_cell(dev, true, 16, gp_shape_4d(2, 16, 4, 4), &p_red, NULL);
    /* the first cell: no pop, x feeds both reduce1 and reduce2 */
    check_cell(dev, true, 8, gp_shape_4d(2, 4, 4, 4), NULL, "reduce2.1.weight");
    check_cell(dev, true, 8, gp_shape_4d(2, 8, 4, 4), NULL, NULL);
    /* on bf16 storage: normal after a reduction (factorized reduce), a
     * reduction, the first cell */
    { /* larger maps: batch norm's backward on few values per channel magnifies the roundings */
        gp_shape pt = gp_shape_4d(2, 8, 12, 12);
        check_cell_bf16(dev, false, 8, gp_shape_4d(2, 24, 6, 6), &pt);
    }
    check_cell_bf16(dev, true, 16, gp_shape_4d(2, 16, 4, 4), &p_red);
    check_cell_bf16(dev, true, 8, gp_shape_4d(2, 4, 4, 4), NULL);

    /* what does not fit is an error naming the layer and what to change */
    gp_layer l;
    gp_layer_spec sp = gp_layer_spec_default(GP_LAYER_AMOEBA_CELL);
    gp_shape odd[1] = {gp_shape_4d(2, 8, 5, 5)};
    sp.out = 6;
    CHECK(gp_layer_create(&sp, 3, odd, dev, 1, &l) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "layer 3 (amoeba_cell)") &&
              strstr(gp_last_error(), "multiple of 4"), "%s", gp_last_error());
    sp.out = 8;
    sp.reduction = true;
    CHECK(gp_layer_create(&sp, 3, odd, dev, 1, &l) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "even height and width"), "%s", gp_last_error());
    sp.reduction = false;
    sp.n_pop = 1;
    snprintf(sp.pop[0], sizeof sp.pop[0], "cell3");
    gp_shape far[2] = {gp_shape_4d(2, 8, 5, 5), gp_shape_4d(2, 8, 20, 20)};
    CHECK(gp_layer_create(&sp, 3, far, dev, 1, &l) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "popped 'cell3'") && strstr(gp_last_error(), "twice"),
              "%s", gp_last_error());
}

/* ---- the family ---------------------------------------------------------------- */

static gp_status amoeba_cfg(int layers, int64_t filters, int64_t side, gp_config *c)
{
    char text[512], s1[64], s2[64];
    snprintf(text, sizeof text,
             "model:\n  input: [3, %lld, %lld]\n  amoebanet: {layers: 18, filters: 256, "
             "classes: 1000}\n"
             "data: {dataset: synthetic, synthetic: {train: 8, test: 8, classes: 1000}}\n"
             "train: {batch_size: 4, seed: 5}\n",
             (long long)side, (long long)side);
    snprintf(s1, sizeof s1, "model.amoebanet.layers=%d", layers);
    snprintf(s2, sizeof s2, "model.amoebanet.filters=%lld", (long long)filters);
    const char *sets[2] = {s1, s2};
    return gp_config_parse("a.yaml", text, strlen(text), sets, 2, c);
}

static void family(void)
{
    static const struct {
        int layers;
        int64_t filters, params;
    } want[] = {{18, 256, 122470120}, {18, 208, 81505540}};
    for (int q = 0; q < 2; q++) {
        gp_config c;
        gp_status s = amoeba_cfg(want[q].layers, want[q].filters, 224, &c);
        CHECK_OK(s);
        if (s != GP_OK) continue;
        CHECK_MSG(c.model.n_layers == 28, "amoebanet: %d layers, want 28", c.model.n_layers);
        /* parameters from the shapes alone: no 490 MB allocation */
        int64_t total = 0;
        gp_skip_map map;
        CHECK_OK(gp_skip_map_build(c.model.layers, c.model.n_layers, &map));
        gp_shape *outs = calloc((size_t)c.model.n_layers, sizeof *outs);
        gp_shape input = gp_shape_4d(1, 3, 224, 224);
        for (int k = 0; k < c.model.n_layers && s == GP_OK; k++) {
            gp_shape in[1 + GP_MAX_POPS];
            gp_skip_map_inputs(&map, k, &input, outs, in);
            gp_layer l;
            s = gp_layer_create(&c.model.layers[k], k, in, devs[0], 1, &l);
            CHECK_OK(s);
            if (s != GP_OK) break;
            total += gp_layer_param_count(&l);
            outs[k] = l.out_shape;
            if (k == 4) /* stem3: pops the stem's output, twice its size */
                CHECK(param_index(&l, "reduce2.conv1.weight") >= 0);
            gp_layer_destroy(&l);
        }
        free(outs);
        CHECK_MSG(total == want[q].params, "amoebanet (18, %lld): %lld parameters, want %lld",
                  (long long)want[q].filters, (long long)total, (long long)want[q].params);
        /* every cell after the first pops the output of the layer two back */
        CHECK(map.n == 21); /* every cell but the first pops */
        for (int t = 0; t < map.n; t++) CHECK(map.skips[t].to == map.skips[t].from + 2);
        gp_skip_map_free(&map);
        CHECK(!strcmp(c.model.layers[3].name, "stem2") && c.model.layers[3].n_pop == 0 &&
              !strcmp(c.model.layers[11].name, "cell2_reduction") &&
              c.model.layers[11].reduction && !strcmp(c.model.layers[27].name, "classify.fc"));
        gp_config_free(&c);
    }
    gp_config c;
    CHECK(amoeba_cfg(4, 256, 224, &c) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "model.amoebanet.layers must be a multiple of 3"), "%s",
              gp_last_error());
    CHECK(amoeba_cfg(6, 40, 224, &c) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "multiple of 16"), "%s", gp_last_error());
}

/* ---- transparency ----------------------------------------------------------------- */

/* sanitized: the sanitizer builds run 3 stages, m = 4 (the one where
 * micro-batches overlap across every boundary), each checkpoint mode; the
 * other configurations differ in the partition and the count, not in what
 * the threads do, and the unsanitized build runs all 18. */
static void transparency(bool sanitized)
{
    gp_config c;
    CHECK_OK(amoeba_cfg(6, 32, 64, &c));
    static const gp_checkpoint_mode modes[3] = {GP_CKPT_NEVER, GP_CKPT_EXCEPT_LAST, GP_CKPT_ALWAYS};
    /* 16 layers: stem 0-2, cells 3-12, classifier 13-15.  Boundaries after
     * cells put the pair (x, skip) across each: the cell after a boundary
     * pops the output of the layer before the one just before it. */
    static const int bal2[2] = {7, 9}, bal3[3] = {5, 5, 6};
    int runs = 0;
    for (int n = 1; n <= 3; n++)
        for (int m = 1; m <= 4; m += 3)
            for (int ck = 0; ck < 3; ck++) {
                if (sanitized && !(n == 3 && m == 4)) continue;
                c.pipeline.chunks = m;
                c.pipeline.checkpoint = modes[ck];
                c.pipeline.lockstep = true;
                int one[1] = {16};
                const int *bal = n == 1 ? one : n == 2 ? bal2 : bal3;
                gp_model ref, pip;
                CHECK_OK(gp_model_build(&c, devs[0], &ref));
                CHECK_OK(gp_model_build_placed(&c, devs, n, bal, &pip));
                /* every boundary has a skip across it */
                for (int j = 0, end = 0; j + 1 < n; j++) {
                    end += bal[j];
                    int across = 0;
                    for (int t = 0; t < pip.skips.n; t++)
                        across += gp_skip_crosses(&pip.skips.skips[t], end - 1);
                    CHECK_MSG(across == 2, "%d skips cross the boundary after layer %d, want 2",
                              across, end - 1);
                }
                bool same[3];
                gpt_compare_steps(&c, &ref, &pip, 4, 2, same);
                CHECK_MSG(same[0] && same[1] && same[2],
                          "amoebanet (6, 32) on %d stages, m %d, checkpoint %d differs from one "
                          "device: loss %d, grads %d, params %d", n, m, ck, same[0], same[1],
                          same[2]);
                gp_model_free(&ref);
                gp_model_free(&pip);
                runs++;
            }
    CHECK_MSG(runs == (sanitized ? 3 : 18), "%d transparency runs", runs);
    /* on bf16 storage (the cells' and factorized reductions' inner maps
     * too): 3 stages, m = 4, every checkpoint mode */
    c.train.activations = GP_ACT_BF16;
    for (int ck = 0; ck < 3; ck++) {
        c.pipeline.chunks = 4;
        c.pipeline.checkpoint = modes[ck];
        gp_model ref, pip;
        CHECK_OK(gp_model_build(&c, devs[0], &ref));
        CHECK_OK(gp_model_build_placed(&c, devs, 3, bal3, &pip));
        CHECK(pip.layers[5].out_dtype == GP_BF16 && pip.layers[5].ops->takes_bf16(&pip.layers[5]));
        bool same[3];
        gpt_compare_steps(&c, &ref, &pip, 4, 2, same);
        CHECK_MSG(same[0] && same[1] && same[2],
                  "amoebanet (6, 32) in bf16 on 3 stages, m 4, checkpoint %d differs from one "
                  "device: loss %d, grads %d, params %d", ck, same[0], same[1], same[2]);
        gp_model_free(&ref);
        gp_model_free(&pip);
    }
    gp_config_free(&c);
}

int main(void)
{
    gpt_open_cpu_devices(devs, 3, 1);
    /* The cells against their reference and the family's parameter counts
     * run on one thread: ThreadSanitizer has nothing to check there (under
     * it they took 60 s of 160), and the other builds run them. */
    gpt_san san = gpt_sanitizer();
    if (san != GPT_SAN_THREAD) {
        cells(devs[0]);
        family();
    } else {
        printf("test_amoeba: ThreadSanitizer: the cells and the family (one thread) left to the "
               "unsanitized and AddressSanitizer runs\n");
    }
    transparency(san != GPT_SAN_NONE);
    for (int j = 0; j < 3; j++) gp_device_close(devs[j]);
    return gpt_finish("test_amoeba");
}
