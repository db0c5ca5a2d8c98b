/*
 * test_skip.c — skip connections (stash / pop) and the layers that pop.
 *
 *   - identity, add (with and without the projection shortcut) and concat
 *     (equal shapes, zero padding, 2-D) against naive double-precision
 *     references, and every input's and parameter's gradient against
 *     central differences;
 *   - the skip map: a pop without its stash, a pop before its stash, a
 *     second pop, a stash never popped and a name stashed twice are errors
 *     that name the layers involved and where the config defines them;
 *   - the checkpoint loops: a forward that keeps only its inputs, then the
 *     recompute, gives bit for bit the outputs (so the stashes) of the
 *     forward that kept them, and a skip that leaves the stage is the same
 *     tensor either way;
 *   - transparency: a model whose skips cross one, two and three stage
 *     boundaries (and stay inside a stage) on 1 to 4 devices, every
 *     schedule, m in {1, 4}, every checkpoint mode, lockstep on and off:
 *     per-step losses, the first step's gradients and the parameters after
 *     4 steps equal the single-device run's bit for bit;
 *   - ResNet-50 (the built-in family: torchgpipe's layer and parameter
 *     counts, torchvision's init) at 32x32 on 1, 2 and 3 stages whose
 *     boundaries cut blocks, m in {1, 4}, every checkpoint mode: bit-equal
 *     to one device;
 *   - copies in bf16 (pipeline.copy_precision): the same model and
 *     partitions against gpt_rounded_step (one device, every tensor that
 *     crosses a stage boundary rounded to bfloat16, skips straight across),
 *     every schedule on 2-4 devices, bit for bit;
 *   - portals: on 4 stages the skip from stage 0 to stage 3 is copied once
 *     per micro-batch straight from stage 0 to stage 3 (the events show
 *     it), none passes through stages 1 and 2, and every byte of the step
 *     is freed.
 * Runs under ThreadSanitizer in CI (label "threads").
 */
#include "config/config.h"
#include "pipeline/pipeline.h"
#include "test_ref.h"

#include <math.h>

/* ---- host helpers ------------------------------------------------------------ */

static uint64_t rng_state = 77;
static double unit(void)
{
    rng_state += 0x9e3779b97f4a7c15ull;
    uint64_t z = rng_state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static bool same_tensor(const gp_tensor *a, const gp_tensor *b)
{
    int64_t n = gp_tensor_numel(a);
    if (n != gp_tensor_numel(b)) return false;
    float *x = gpt_download(a), *y = gpt_download(b);
    bool eq = !memcmp(x, y, (size_t)n * sizeof *x);
    free(x);
    free(y);
    return eq;
}

/* ---- the layers that pop ------------------------------------------------------ */

/* Naive double reference of a pop layer's forward (training batch norm). */
static void ref_pop(const gp_layer *l, const gp_shape *xs, const double *x0, const gp_shape *ps,
                    const double *x1, double **P, double *y)
{
    int64_t ny = gp_shape_numel(xs);
    switch (l->spec.type) {
    case GP_LAYER_IDENTITY:
        for (int64_t i = 0; i < ny; i++) y[i] = x0[i];
        break;
    case GP_LAYER_ADD: {
        if (l->spec.out <= 0) {
            for (int64_t i = 0; i < ny; i++) y[i] = x0[i] + x1[i];
            break;
        }
        /* conv 1x1 stride s of x1 (N, C, H, W) -> (N, K, OH, OW), then BN */
        int64_t N = ps->dims[0], C = ps->dims[1], H = ps->dims[2], W = ps->dims[3];
        int64_t K = xs->dims[1], OH = xs->dims[2], OW = xs->dims[3], s = l->spec.stride.h;
        double *a = calloc((size_t)ny, sizeof *a);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        double acc = 0;
                        for (int64_t c = 0; c < C; c++)
                            acc += P[0][k * C + c] * x1[((n * C + c) * H + oh * s) * W + ow * s];
                        a[((n * K + k) * OH + oh) * OW + ow] = acc;
                    }
        int64_t S = OH * OW;
        for (int64_t k = 0; k < K; k++) {
            double mean = 0, var = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t q = 0; q < S; q++) mean += a[(n * K + k) * S + q];
            mean /= (double)(N * S);
            for (int64_t n = 0; n < N; n++)
                for (int64_t q = 0; q < S; q++) {
                    double d = a[(n * K + k) * S + q] - mean;
                    var += d * d;
                }
            var /= (double)(N * S);
            for (int64_t n = 0; n < N; n++)
                for (int64_t q = 0; q < S; q++) {
                    int64_t i = (n * K + k) * S + q;
                    y[i] = x0[i] + P[1][k] * (a[i] - mean) / sqrt(var + l->spec.eps) + P[2][k];
                }
        }
        free(a);
        break;
    }
    case GP_LAYER_CONCAT: {
        int64_t N = xs->dims[0], C0 = xs->dims[1], C1 = ps->dims[1];
        int64_t H0 = xs->ndim == 4 ? xs->dims[2] : 1, W0 = xs->ndim == 4 ? xs->dims[3] : 1;
        int64_t H = ps->ndim == 4 ? ps->dims[2] : 1, W = ps->ndim == 4 ? ps->dims[3] : 1;
        int64_t C = C0 + C1;
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t w = 0; w < W; w++) {
                        double v;
                        if (c < C0) v = h < H0 && w < W0 ? x0[((n * C0 + c) * H0 + h) * W0 + w] : 0;
                        else v = x1[((n * C1 + c - C0) * H + h) * W + w];
                        y[((n * C + c) * H + h) * W + w] = v;
                    }
        break;
    }
    default: CHECK(!"not a pop layer");
    }
}

/* sum(y * r) of a forward, in double. */
/* The training forward the gradient checks differentiate: batch norms
 * use the batch's statistics and leave their accumulators alone. */
static const gp_fwd_ctx k_fd_ctx = {.training = true, .recompute = true, .seed = 5};

static void fd(const char *what, gp_layer *l, const gp_tensor *x, gp_tensor *t, const double *r,
               const float *an)
{
    int64_t n = gp_tensor_numel(t);
    float *h = gpt_download(t);
    int bad = 0;
    const float eps = 1e-2f;
    for (int64_t i = 0; i < n; i++) {
        float o = h[i], v = o + eps;
        CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &v, 1));
        double lp = loss_of(l, &k_fd_ctx, x, r);
        v = o - eps;
        CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &v, 1));
        double lm = loss_of(l, &k_fd_ctx, x, r);
        CHECK_OK(gp_dev_upload(t->dev, gp_f32(t) + i, &o, 1));
        double step = (double)(float)(o + eps) - (double)(float)(o - eps);
        double num = (lp - lm) / step;
        if (fabs(an[i] - num) > 3e-3 + 1e-2 * fabs(num) && bad++ < 3)
            fprintf(stderr, "  %s of %s [%lld]: analytic %.7g, numeric %.7g\n", what,
                    gp_layer_type_name(l->spec.type), (long long)i, (double)an[i], num);
    }
    CHECK_MSG(bad == 0, "%s of %s: %d of %lld elements off", what,
              gp_layer_type_name(l->spec.type), bad, (long long)n);
    free(h);
}

static void check_pop_layer(gp_device *dev, gp_layer_spec sp, gp_shape xs, gp_shape ps)
{
    if (sp.type != GP_LAYER_IDENTITY) {
        sp.n_pop = 1;
        snprintf(sp.pop[0], sizeof sp.pop[0], "s");
    }
    gp_shape in[2] = {xs, ps};
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 3, in, dev, 9, &l));
    int nin = l.n_in;
    CHECK(nin == (sp.type == GP_LAYER_IDENTITY ? 1 : 2));
    gp_tensor x[2] = {{0}};
    double *xd[2] = {NULL};
    for (int q = 0; q < nin; q++) {
        int64_t n = gp_shape_numel(&in[q]);
        float *h = malloc((size_t)n * sizeof *h);
        xd[q] = malloc((size_t)n * sizeof *xd[q]);
        for (int64_t i = 0; i < n; i++) xd[q][i] = h[i] = (float)(2 * unit() - 1);
        x[q] = gpt_upload(dev, &in[q], h);
        free(h);
    }
    double *P[GPT_MAX_PARAMS] = {NULL};
    GP_ASSERT(l.n_params <= GPT_MAX_PARAMS);
    for (int p = 0; p < l.n_params; p++) { /* random affine, so the norm's gradient shows */
        int64_t n = gp_tensor_numel(&l.params[p].value);
        float *h = malloc((size_t)n * sizeof *h);
        P[p] = malloc((size_t)n * sizeof *P[p]);
        for (int64_t i = 0; i < n; i++)
            P[p][i] = h[i] = (float)(strstr(l.params[p].name, "var") ? 0.5 + unit() : unit() - 0.3);
        CHECK_OK(gp_dev_upload(dev, gp_f32(&l.params[p].value), h, n));
        free(h);
    }
    gp_fwd_ctx ctx = {.training = true, .recompute = true, .seed = 5};
    gp_tensor y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(&l, &ctx, x, &y, &s));
    gp_shape ys = gp_tensor_shape(&y), want = gp_shape_with_batch(&l.out_shape, xs.dims[0]);
    CHECK_MSG(gp_shape_equal(&ys, &want), "%s: output shape", gp_layer_type_name(sp.type));
    int64_t ny = gp_tensor_numel(&y);
    double *yr = calloc((size_t)ny, sizeof *yr);
    ref_pop(&l, sp.type == GP_LAYER_CONCAT ? &xs : &ys, xd[0], &ps, xd[1], P, yr);
    float *yh = gpt_download(&y);
    double err = 0;
    for (int64_t i = 0; i < ny; i++) err = fmax(err, fabs(yh[i] - yr[i]));
    CHECK_MSG(err < 1e-4, "%s forward: max error %.3g", gp_layer_type_name(sp.type), err);
    double *r = malloc((size_t)ny * sizeof *r);
    float *rf = malloc((size_t)ny * sizeof *rf);
    for (int64_t i = 0; i < ny; i++) r[i] = rf[i] = (float)(2 * unit() - 1);
    gp_tensor dy = gpt_upload(dev, &ys, rf), dx[2] = {{0}};
    CHECK_OK(gp_layer_zero_grad(&l));
    CHECK_OK(gp_layer_backward(&l, &ctx, x, &y, &dy, dx, &s));
    for (int q = 0; q < nin; q++) {
        float *g = gpt_download(&dx[q]);
        fd(q ? "d popped" : "dx", &l, x, &x[q], r, g);
        free(g);
    }
    for (int p = 0; p < l.n_params; p++) {
        if (l.params[p].is_buffer) continue;
        float *g = gpt_download(&l.params[p].grad);
        fd(l.params[p].name, &l, x, &l.params[p].value, r, g);
        free(g);
    }
    for (int q = 0; q < nin; q++) {
        gp_tensor_free(&x[q]);
        gp_tensor_free(&dx[q]);
        free(xd[q]);
    }
    for (int p = 0; p < l.n_params; p++) free(P[p]);
    gp_tensor_free(&y);
    gp_tensor_free(&dy);
    gp_saved_free(&s);
    free(yr);
    free(yh);
    free(r);
    free(rf);
    gp_layer_destroy(&l);
}

static void pop_layers(gp_device *dev)
{
    gp_shape a = gp_shape_4d(3, 4, 5, 6);
    check_pop_layer(dev, gp_layer_spec_default(GP_LAYER_IDENTITY), a, a);
    check_pop_layer(dev, gp_layer_spec_default(GP_LAYER_ADD), a, a);
    gp_layer_spec proj = gp_layer_spec_default(GP_LAYER_ADD);
    proj.out = 6;
    proj.stride = gp_hw_square(2); /* (3, 5, 6, 7) -> (3, 6, 3, 4) */
    check_pop_layer(dev, proj, gp_shape_4d(3, 6, 3, 4), gp_shape_4d(3, 5, 6, 7));
    gp_layer_spec cat = gp_layer_spec_default(GP_LAYER_CONCAT);
    check_pop_layer(dev, cat, a, gp_shape_4d(3, 2, 5, 6));                /* same size */
    check_pop_layer(dev, cat, gp_shape_4d(3, 2, 4, 5), gp_shape_4d(3, 3, 5, 7)); /* padded */
    check_pop_layer(dev, cat, gp_shape_2d(4, 3), gp_shape_2d(4, 5));      /* features */
    /* shapes that do not fit are errors naming the layer and the pop */
    gp_layer l;
    gp_layer_spec add = gp_layer_spec_default(GP_LAYER_ADD);
    add.n_pop = 1;
    snprintf(add.pop[0], sizeof add.pop[0], "enc1");
    gp_shape bad[2] = {a, gp_shape_4d(3, 4, 5, 5)};
    CHECK(gp_layer_create(&add, 2, bad, dev, 1, &l) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "layer 2 (add)") && strstr(gp_last_error(), "'enc1'"),
              "%s", gp_last_error());
    cat.n_pop = 1;
    snprintf(cat.pop[0], sizeof cat.pop[0], "enc1");
    gp_shape big[2] = {gp_shape_4d(3, 4, 6, 6), a};
    CHECK(gp_layer_create(&cat, 2, big, dev, 1, &l) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "never cropped"), "%s", gp_last_error());
    gp_layer_spec relu = gp_layer_spec_default(GP_LAYER_RELU);
    relu.n_pop = 1;
    snprintf(relu.pop[0], sizeof relu.pop[0], "enc1");
    CHECK(gp_layer_create(&relu, 2, bad, dev, 1, &l) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "takes no popped tensor"), "%s", gp_last_error());
}

/* ---- the skip map --------------------------------------------------------------- */

static gp_layer_spec named(gp_layer_type t, int line, const char *stash, const char *pop)
{
    gp_layer_spec s = gp_layer_spec_default(t);
    snprintf(s.file, sizeof s.file, "m.yaml");
    s.line = line;
    s.column = 5;
    if (stash) snprintf(s.stash, sizeof s.stash, "%s", stash);
    if (pop) {
        snprintf(s.pop[0], sizeof s.pop[0], "%s", pop);
        s.n_pop = 1;
    }
    return s;
}

static void expect_map_error(const gp_layer_spec *sp, int n, const char *a, const char *b,
                             const char *c)
{
    gp_skip_map map;
    gp_status s = gp_skip_map_build(sp, n, &map);
    CHECK(s == GP_ERR_INVALID);
    const char *e = gp_last_error();
    CHECK_MSG(strstr(e, a) && strstr(e, b) && (!c || strstr(e, c)), "message: %s", e);
}

static void skip_map(void)
{
    gp_layer_spec sp[6];
    /* a good map: two skips, the name 'x' used again after its pop */
    sp[0] = named(GP_LAYER_IDENTITY, 1, "x", NULL);
    sp[1] = named(GP_LAYER_RELU, 2, "y", NULL);
    sp[2] = named(GP_LAYER_ADD, 3, "x", "x");
    sp[3] = named(GP_LAYER_CONCAT, 4, NULL, "y");
    sp[4] = named(GP_LAYER_ADD, 5, NULL, "x");
    gp_skip_map map;
    CHECK_OK(gp_skip_map_build(sp, 5, &map));
    CHECK(map.n == 3);
    CHECK(map.skips[0].from == 0 && map.skips[0].to == 2 && map.skips[0].slot == 1);
    CHECK(map.skips[1].from == 1 && map.skips[1].to == 3);
    CHECK(map.skips[2].from == 2 && map.skips[2].to == 4);
    CHECK(map.stashes[2] == 2 && map.pops[2 * GP_MAX_POPS] == 0 && map.pops[4 * GP_MAX_POPS] == 2);
    CHECK(gp_skip_crosses(&map.skips[0], 1) && !gp_skip_crosses(&map.skips[0], 2));
    gp_skip_map_free(&map);
    /* a pop without a stash names the layer, its place and the name */
    sp[0] = named(GP_LAYER_RELU, 1, NULL, NULL);
    sp[1] = named(GP_LAYER_ADD, 7, NULL, "enc3");
    expect_map_error(sp, 2, "layer 1 (add) at m.yaml:7:5", "'enc3'", "no layer stashes it");
    /* a pop before its stash names both */
    sp[2] = named(GP_LAYER_RELU, 9, "enc3", NULL);
    expect_map_error(sp, 3, "layer 1 (add) at m.yaml:7:5", "layer 2 (relu) at m.yaml:9:5",
                     "before");
    /* a stash never popped */
    sp[0] = named(GP_LAYER_RELU, 1, "lost", NULL);
    sp[1] = named(GP_LAYER_RELU, 2, NULL, NULL);
    expect_map_error(sp, 2, "layer 0 (relu) at m.yaml:1:5", "'lost'", "no later layer pops it");
    /* a second pop names the stash and both pops */
    sp[0] = named(GP_LAYER_IDENTITY, 1, "s", NULL);
    sp[1] = named(GP_LAYER_ADD, 2, NULL, "s");
    sp[2] = named(GP_LAYER_ADD, 3, NULL, "s");
    expect_map_error(sp, 3, "layer 2 (add) at m.yaml:3:5", "layer 0 (identity) at m.yaml:1:5",
                     "layer 1 (add) at m.yaml:2:5");
    /* a name stashed twice while open */
    sp[0] = named(GP_LAYER_IDENTITY, 1, "s", NULL);
    sp[1] = named(GP_LAYER_IDENTITY, 2, "s", NULL);
    sp[2] = named(GP_LAYER_ADD, 3, NULL, "s");
    expect_map_error(sp, 3, "layer 1 (identity) at m.yaml:2:5", "layer 0 (identity) at m.yaml:1:5",
                     "stashed it already");
}

/* ---- the model ------------------------------------------------------------------ */

enum { BATCH = 12, NL = 15 };
static gp_layer_spec specs[GPT_MAX_SPECS];
static gp_device *devs[4];

/* input (2, 8, 8):
 *   0 conv 4 (3x3, pad 1)          stash a     a: 0 -> 11, the long one
 *   1 batchnorm
 *   2 relu                         stash b     b: 2 -> 4
 *   3 conv 4 (3x3, pad 1)
 *   4 add pop b
 *   5 identity                     stash c     c: 5 -> 8, projected
 *   6 maxpool 2                    (4, 4, 4)
 *   7 conv 6 (3x3, pad 1)          (6, 4, 4)
 *   8 add pop c, out 6, stride 2   (6, 4, 4)
 *   9 relu
 *  10 dropout 0.3
 *  11 concat pop a                 (10, 8, 8): padded from 4x4
 *  12 global_avgpool, 13 flatten, 14 linear 5
 * Balances used: 4 stages [3, 4, 4, 4] (a crosses 3 boundaries, b and c
 * one), 3 stages [3, 5, 7] (a crosses 2), 2 stages [5, 10]. */
static gp_config make_cfg(void)
{
    gp_config c = gpt_model_cfg(specs, true, false, BATCH);
    int n = 0;
    specs[n] = named(GP_LAYER_CONV2D, 1, "a", NULL);
    specs[n].out = 4; specs[n].kernel = gp_hw_square(3); specs[n++].padding = gp_hw_square(1);
    specs[n++] = named(GP_LAYER_BATCHNORM, 2, NULL, NULL);
    specs[n++] = named(GP_LAYER_RELU, 3, "b", NULL);
    specs[n] = named(GP_LAYER_CONV2D, 4, NULL, NULL);
    specs[n].out = 4; specs[n].kernel = gp_hw_square(3); specs[n++].padding = gp_hw_square(1);
    specs[n++] = named(GP_LAYER_ADD, 5, NULL, "b");
    specs[n++] = named(GP_LAYER_IDENTITY, 6, "c", NULL);
    specs[n] = named(GP_LAYER_MAXPOOL2D, 7, NULL, NULL);
    specs[n].kernel = gp_hw_square(2); specs[n++].stride = gp_hw_square(2);
    specs[n] = named(GP_LAYER_CONV2D, 8, NULL, NULL);
    specs[n].out = 6; specs[n].kernel = gp_hw_square(3); specs[n++].padding = gp_hw_square(1);
    specs[n] = named(GP_LAYER_ADD, 9, NULL, "c");
    specs[n].out = 6; specs[n++].stride = gp_hw_square(2);
    specs[n++] = named(GP_LAYER_RELU, 10, NULL, NULL);
    specs[n] = named(GP_LAYER_DROPOUT, 11, NULL, NULL);
    specs[n++].p = 0.3f;
    specs[n++] = named(GP_LAYER_CONCAT, 12, NULL, "a");
    specs[n++] = named(GP_LAYER_GLOBAL_AVGPOOL, 13, NULL, NULL);
    specs[n++] = named(GP_LAYER_FLATTEN, 14, NULL, NULL);
    specs[n] = named(GP_LAYER_LINEAR, 15, NULL, NULL);
    specs[n++].out = 5;
    GP_ASSERT(n == NL);
    c.model.n_layers = n;
    c.model.input[0] = 2;
    c.model.input[1] = 8;
    c.model.input[2] = 8;
    return c;
}

/* ---- checkpointing with skips ------------------------------------------------------ */

static void checkpoint_skips(void)
{
    gp_config c = make_cfg();
    gp_model m;
    CHECK_OK(gp_model_build(&c, devs[0], &m));
    float x[4 * 128];
    gpt_make_batch(&c, 4, 0, x, (float[4]){0});
    gp_shape xs = gp_shape_4d(4, 2, 8, 8);
    gp_fwd_ctx ctx = {.training = true, .seed = 3, .step = 2, .batch_total = 4};
    /* stage 0 of a 2-stage split: layers 0 .. 4; 'a' leaves, 'b' stays */
    enum { C0 = 5 };
    gp_stash keep, ck;
    CHECK_OK(gp_stash_init(&keep, C0, &m.skips, 0));
    CHECK_OK(gp_stash_init(&ck, C0, &m.skips, 0));
    CHECK(gp_stash_skip_role(&keep, 0) == GP_SKIP_LEAVES);
    CHECK(gp_stash_skip_role(&keep, 1) == GP_SKIP_INSIDE);
    CHECK(gp_stash_skip_role(&keep, 2) == GP_SKIP_APART);
    keep.in = gpt_upload(devs[0], &xs, x);
    ck.in = gpt_upload(devs[0], &xs, x);
    int bad = -1;
    CHECK_OK(gp_ckpt_forward(m.layers, &ctx, GP_FWD_KEEP, &keep, &bad));
    size_t before = gp_allocator_current(&devs[0]->alloc);
    CHECK_OK(gp_ckpt_forward(m.layers, &ctx, GP_FWD_INPUT, &ck, &bad));
    /* a checkpointed forward holds its input, its output and the skip that
     * leaves, nothing else */
    size_t held = gp_stash_bytes(&ck);
    size_t want = gp_tensor_bytes(&ck.in) + gp_tensor_bytes(&ck.out) +
                  gp_tensor_bytes(&ck.skip_out[0]);
    CHECK_MSG(held == want, "checkpointed stash holds %zu bytes, want %zu", held, want);
    CHECK_MSG(gp_allocator_current(&devs[0]->alloc) - before == want - gp_tensor_bytes(&ck.in),
              "the allocator disagrees with the stash");
    CHECK(same_tensor(&ck.skip_out[0], &keep.skip_out[0]));
    CHECK(same_tensor(&ck.out, &keep.out));
    CHECK_OK(gp_ckpt_recompute(m.layers, &ctx, &ck, &bad));
    for (int k = 1; k <= C0; k++) {
        /* an output no backward reads is kept as its shape alone, by both */
        bool kept = gp_tensor_mem(&ck.acts[k]) != NULL;
        CHECK_MSG(kept == (gp_tensor_mem(&keep.acts[k]) != NULL) &&
                      gp_tensor_numel(&ck.acts[k]) == gp_tensor_numel(&keep.acts[k]) &&
                      (!kept || same_tensor(&ck.acts[k], &keep.acts[k])),
                  "recomputed output of layer %d differs", k - 1);
    }
    CHECK(same_tensor(&ck.acts[1], &keep.skip_out[0])); /* the stash itself */
    gp_stash_destroy(&keep);
    gp_stash_destroy(&ck);
    gp_model_free(&m);
}

/* ---- the gradient through the skips, against finite differences ----------------------- */

/* The summed loss of one forward of the whole model; with `backward` 1 also
 * the backward (gradients of every parameter, not scaled), with 2 the same
 * as backward-data then backward-weights; *copied (NULL: not wanted) gets
 * the bytes the backward copied within the device. */
static double model_run(gp_model *m, const float *x, const float *y, int64_t b, int backward,
                        uint64_t *copied)
{
    gp_fwd_ctx ctx = {.training = true, .recompute = !backward, .seed = 3, .step = 1,
                      .batch_total = b};
    gp_stash s;
    CHECK_OK(gp_stash_init(&s, m->n_layers, &m->skips, 0));
    gp_shape xs = gp_shape_4d(b, 2, 8, 8), ls = {1, {b, 0, 0, 0}};
    s.in = gpt_upload(m->dev, &xs, x);
    gp_tensor labels = gpt_upload(m->dev, &ls, y), dl = {0};
    int bad = -1;
    CHECK_OK(gp_ckpt_forward(m->layers, &ctx, backward ? GP_FWD_KEEP : GP_FWD_INPUT, &s, &bad));
    gp_loss_out lo = {0};
    CHECK_OK(gp_ckpt_loss(m->dev, GP_LOSS_CROSS_ENTROPY, 0.0f, 0, &s.out, &labels, 1.0f,
                          backward ? &dl : NULL, &lo));
    if (backward) {
        for (int k = 0; k < m->n_layers; k++) gp_layer_grads_begin(&m->layers[k]);
        uint64_t before = gp_dev_d2d_bytes(m->dev);
        if (backward == 2) {
            CHECK_OK(gp_ckpt_backward_data(m->layers, &ctx, &s, &dl, 0, NULL, &bad));
            CHECK_OK(gp_ckpt_backward_weights(m->layers, &ctx, &s, 0, false, &bad));
        } else {
            CHECK_OK(gp_ckpt_backward(m->layers, &ctx, &s, &dl, 0, NULL, &bad));
        }
        if (copied) *copied = gp_dev_d2d_bytes(m->dev) - before;
        for (int k = 0; k < m->n_layers; k++) CHECK_OK(gp_layer_grads_finish(&m->layers[k]));
    }
    gp_tensor_free(&labels);
    gp_stash_destroy(&s);
    return lo.loss_sum;
}

static double model_loss(gp_model *m, const float *x, const float *y, int64_t b, bool grads)
{
    return model_run(m, x, y, b, grads ? 1 : 0, NULL);
}

/* Layer k's first parameter, every `stride`-th of its first `limit`
 * values, against central finite differences of the summed loss
 * (model_loss, in double); the values off are printed (4 a parameter at
 * most) and counted, *total counts those checked. */
static int fd_param(gp_model *m, int k, const float *x, const float *y, int64_t b, int64_t limit,
                    int stride, int *total)
{
    gp_layer *l = &m->layers[k];
    gp_tensor *w = &l->params[0].value;
    float *g = gpt_download(&l->params[0].grad), *h = gpt_download(w);
    int bad = 0;
    for (int64_t i = 0; i < gp_tensor_numel(w) && i < limit; i += stride) {
        const float eps = 1e-3f; /* small: relu and max-pool kinks */
        float o = h[i], v = o + eps;
        CHECK_OK(gp_dev_upload(m->dev, gp_f32(w) + i, &v, 1));
        double lp = model_loss(m, x, y, b, false);
        v = o - eps;
        CHECK_OK(gp_dev_upload(m->dev, gp_f32(w) + i, &v, 1));
        double lm = model_loss(m, x, y, b, false);
        CHECK_OK(gp_dev_upload(m->dev, gp_f32(w) + i, &o, 1));
        double num = (lp - lm) / ((double)(float)(o + eps) - (double)(float)(o - eps));
        (*total)++;
        if (fabs(g[i] - num) > 2e-3 + 2e-2 * fabs(num) && bad++ < 4)
            fprintf(stderr, "  layer %d %s[%lld]: analytic %.6g, numeric %.6g\n", k,
                    l->params[0].name, (long long)i, (double)g[i], num);
    }
    free(g);
    free(h);
    return bad;
}

static void model_gradients(void)
{
    gp_config c = make_cfg();
    specs[10].p = 0.0f; /* dropout's kinks aside: the paths are what is checked */
    gp_model m;
    CHECK_OK(gp_model_build(&c, devs[0], &m));
    enum { B = 6 };
    float x[B * 128], y[B];
    gpt_make_batch(&c, B, 1, x, y);
    model_loss(&m, x, y, B, true);
    /* layer 0 feeds the main path and skip a; layer 3 the add of skip b;
     * layer 8's projection is skip c's */
    static const int probe[] = {0, 3, 8};
    int bad = 0, total = 0;
    for (int q = 0; q < 3; q++) bad += fd_param(&m, probe[q], x, y, B, 12, 1, &total);
    CHECK_MSG(bad == 0, "%d of %d model gradients off the finite differences", bad, total);
    gp_model_free(&m);
}

/* Layers [0, n) of sp (input 2 x 8 x 8, 5 classes) on one device: every
 * `stride`-th weight of the first parameter of each layer in probe[]
 * against finite differences, after the whole backward and after the split
 * one (backward-data, then backward-weights). */
static void fd_layout(const char *what, gp_layer_spec *sp, int n, const int *probe, int np,
                      int stride)
{
    static gp_layer_spec scratch[GPT_MAX_SPECS];
    gp_config c = gpt_model_cfg(scratch, true, false, BATCH);
    c.model.layers = sp; /* (its layers are sp's) */
    c.model.n_layers = n;
    c.model.input[0] = 2;
    c.model.input[1] = 8;
    c.model.input[2] = 8;
    enum { B = 6 };
    float x[B * 128], y[B];
    gpt_make_batch(&c, B, 1, x, y);
    for (int backward = 1; backward <= 2; backward++) {
        gp_model m;
        CHECK_OK(gp_model_build(&c, devs[0], &m));
        model_run(&m, x, y, B, backward, NULL);
        int bad = 0, total = 0;
        for (int q = 0; q < np; q++) bad += fd_param(&m, probe[q], x, y, B, INT64_MAX, stride,
                                                     &total);
        CHECK_MSG(bad == 0, "%s, %s backward: %d of %d gradients off the finite differences",
                  what, backward == 1 ? "whole" : "split", bad, total);
        gp_model_free(&m);
    }
}

/* Two skips that overlap, the second stashed by the layer just before the
 * first's pop (conv a, conv d, add pop a, relu, add pop d): the add hands
 * its input and the pop one memory (gp_layer_backward_take's views), and
 * the conv before it adds skip d's gradient into its own.  That addition
 * went through the view into skip a's gradient too, and layer 0's weights
 * got skip d's gradient a second time: off by 0.009 after a step on one
 * device, where a pipeline that cut between the stashes was right.  And a
 * layer norm between a stash and its pop (x + LN(x): linear t, layer_norm,
 * add pop t): the norm's backward added its dx into the pop's gradient,
 * which the add had made the norm's own dy, and its weights half read the
 * sum (80x off).  Every weight of the convolutions, and of the norm,
 * against finite differences. */
static void overlapping_skips(void)
{
    static gp_layer_spec sp[GPT_MAX_SPECS];
    int n = 0;
    sp[n] = named(GP_LAYER_CONV2D, 1, "a", NULL);
    sp[n].out = 4; sp[n].kernel = gp_hw_square(3); sp[n++].padding = gp_hw_square(1);
    sp[n] = named(GP_LAYER_CONV2D, 2, "d", NULL);
    sp[n].out = 4; sp[n].kernel = gp_hw_square(3); sp[n++].padding = gp_hw_square(1);
    sp[n++] = named(GP_LAYER_ADD, 3, NULL, "a");
    sp[n++] = named(GP_LAYER_RELU, 4, NULL, NULL);
    sp[n++] = named(GP_LAYER_ADD, 5, NULL, "d");
    sp[n++] = named(GP_LAYER_FLATTEN, 6, NULL, NULL);
    sp[n] = named(GP_LAYER_LINEAR, 7, NULL, NULL);
    sp[n++].out = 5;
    fd_layout("overlapping skips", sp, n, (const int[]){0, 1}, 2, 7);
    static gp_layer_spec ln[GPT_MAX_SPECS];
    n = 0;
    ln[n++] = named(GP_LAYER_FLATTEN, 1, NULL, NULL);
    ln[n] = named(GP_LAYER_LINEAR, 2, "t", NULL);
    ln[n++].out = 6;
    ln[n++] = named(GP_LAYER_LAYER_NORM, 3, NULL, NULL);
    ln[n++] = named(GP_LAYER_ADD, 4, NULL, "t");
    ln[n] = named(GP_LAYER_LINEAR, 5, NULL, NULL);
    ln[n++].out = 5;
    fd_layout("a layer norm between a stash and its pop", ln, n, (const int[]){1, 2}, 2, 1);
}

/* ---- gradients handed on without a copy ---------------------------------------------- */

/* One forward and backward of the whole model (make_cfg) on one device,
 * whole (split false) or as backward-data then backward-weights; returns
 * the bytes copied within the device during the backward, and layer 0's
 * weight gradient in *g0 (malloc'd). */
static uint64_t backward_copies(gp_model *m, bool split, float **g0)
{
    enum { B = 4 };
    float x[B * 128], y[B];
    gp_config c = make_cfg();
    gpt_make_batch(&c, B, 2, x, y);
    uint64_t moved = 0;
    model_run(m, x, y, B, split ? 2 : 1, &moved);
    *g0 = gpt_download(&m->layers[0].params[0].grad);
    return moved;
}

/* Identity, flatten and add hand their output's gradient on as their
 * input's (gp_layer_backward_take), and an add without projection hands
 * it to its popped input too (ops->dx_all_dy: the pop's gradient owns
 * dy's memory, the main input's views it; issue 64): the whole backward
 * copies nothing within the device.  The split backward still copies the
 * add's popped gradient (layer 4, skip b: the layer before keeps its dy
 * for its weights half) and the projecting add's (layer 8), whose weights
 * half reads its dy again.  Before, every one of them copied (4 adds' and
 * identities' copies and flatten's), and until issue 64 the whole
 * backward the plain add's pop's. */
static void grads_handed_on(void)
{
    gp_config c = make_cfg();
    gp_model m;
    CHECK_OK(gp_model_build(&c, devs[0], &m));
    float *whole = NULL, *split = NULL;
    uint64_t cw = backward_copies(&m, false, &whole);
    uint64_t cs = backward_copies(&m, true, &split);
    const uint64_t b4 = 4 * 4 * 8 * 8 * sizeof(float); /* layer 4's output, batch 4 */
    const uint64_t b8 = 4 * 6 * 4 * 4 * sizeof(float); /* layer 8's */
    CHECK_MSG(cw == 0, "the whole backward copied %llu bytes within the device, want none",
              (unsigned long long)cw);
    CHECK_MSG(cs == b4 + b8, "the split backward copied %llu bytes, want %llu",
              (unsigned long long)cs, (unsigned long long)(b4 + b8));
    int64_t n = gp_tensor_numel(&m.layers[0].params[0].grad);
    CHECK_MSG(memcmp(whole, split, (size_t)n * sizeof *whole) == 0,
              "the split backward's gradients differ from the whole backward's");
    free(whole);
    free(split);
    gp_model_free(&m);
}

/* ---- transparency --------------------------------------------------------------------- */

static int failures;

static void balance_for(int S, int *bal)
{
    static const int b4[4] = {3, 4, 4, 4}, b3[3] = {3, 5, 7}, b2[2] = {5, 10};
    const int *b = S == 4 ? b4 : S == 3 ? b3 : S == 2 ? b2 : NULL;
    if (b) memcpy(bal, b, (size_t)S * sizeof *bal);
    else gpt_split_even(NL, S, bal);
}

/* bf16: copies in bfloat16 (pipeline.copy_precision), against the
 * one-device run rounded wherever a tensor crosses a stage boundary
 * (gpt_rounded_step, which gpt_compare_steps takes for such a config):
 * skips crossing one, two and three of them straight across, once, and
 * their gradients back; skips inside a stage not at all. */
static gp_act_storage act; /* transparency's train.activations; auto (FP32) */

static void transparency(int n, int m, gp_checkpoint_mode ck, bool lockstep, gp_schedule_kind kind,
                         bool bf16)
{
    gp_config c = make_cfg();
    c.train.activations = act;
    int bal[8];
    int S = gpt_set_schedule(&c, kind, n, bal);
    if (kind != GP_SCHEDULE_INTERLEAVED && !gp_schedule_v_shape(kind)) balance_for(S, bal);
    c.pipeline.chunks = m;
    c.pipeline.checkpoint = ck;
    c.pipeline.lockstep = lockstep;
    c.pipeline.copy_precision = bf16 ? GP_COPY_BF16 : GP_COPY_FP32;
    gp_model ref, pip;
    if (gp_model_build(&c, devs[0], &ref) != GP_OK) {
        CHECK_MSG(0, "build: %s", gp_last_error());
        return;
    }
    if (gp_model_build_placed(&c, devs, n, bal, &pip) != GP_OK) {
        CHECK_MSG(0, "build: %s", gp_last_error());
        gp_model_free(&ref);
        return;
    }
    bool same[3];
    gpt_compare_steps(&c, &ref, &pip, BATCH, 4, same);
    bool same_loss = same[0], same_grads = same[1], same_params = same[2];
    if (!(same_loss && same_grads && same_params)) failures++;
    CHECK_MSG(same_loss && same_grads && same_params,
              "skips%s%s: %s n=%d m=%d ckpt=%s lockstep=%d: loss %s, grads %s, params %s",
              bf16 ? ", bf16 copies" : "", act == GP_ACT_BF16 ? ", bf16 activations" : "", gp_schedule_kind_name(kind), n, m, gp_checkpoint_mode_name(ck), lockstep,
              same_loss ? "same" : "DIFFER", same_grads ? "same" : "DIFFER",
              same_params ? "same" : "DIFFER");
    gp_model_free(&ref);
    gp_model_free(&pip);
}

/* ---- portals ------------------------------------------------------------------------ */

static void portals(void)
{
    gp_config c = make_cfg();
    int bal[4];
    balance_for(4, bal);
    enum { M = 4 };
    c.pipeline.chunks = M;
    gp_model pip;
    CHECK_OK(gp_model_build_placed(&c, devs, 4, bal, &pip));
    float x[BATCH * 128], y[BATCH];
    gpt_make_batch(&c, BATCH, 0, x, y);
    /* a first step makes the momentum and the backends' scratch */
    CHECK_OK(gp_model_pipeline_step(&pip, &c, x, y, BATCH, 0.05, NULL));
    size_t base[4];
    for (int j = 0; j < 4; j++) base[j] = gp_allocator_current(&devs[j]->alloc);
    CHECK_OK(gp_model_pipeline_step(&pip, &c, x, y, BATCH, 0.05, NULL));
    int fwd[4][4] = {{0}}, bwd[4][4] = {{0}}; /* [from][to] copies of skip a */
    size_t bytes = 0;
    int64_t per = 4 * 8 * 8 * (int64_t)sizeof(float); /* a: (4, 8, 8) per sample */
    for (int d = 0; d < 4; d++) {
        int cnt;
        const gp_event_rec *ev = gp_pipeline_events(pip.pipe, d, &cnt);
        for (int e = 0; e < cnt; e++) {
            if (ev[e].is_wait || ev[e].skip != 0) continue;
            if (ev[e].kind == GP_INSTR_RECV_SKIP) {
                fwd[ev[e].from][ev[e].j]++;
                bytes += ev[e].bytes;
            }
            if (ev[e].kind == GP_INSTR_RECV_SKIP_GRAD) bwd[ev[e].from][ev[e].j]++;
        }
    }
    CHECK_MSG(fwd[0][3] == M && bwd[3][0] == M, "skip a copied %d times forward, %d back, want %d",
              fwd[0][3], bwd[3][0], M);
    int other = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) other += (a != 0 || b != 3) * fwd[a][b] + (a != 3 || b != 0) * bwd[a][b];
    CHECK_MSG(other == 0, "skip a also went through other stages (%d copies)", other);
    CHECK_MSG(bytes == (size_t)(per * BATCH), "skip a moved %zu bytes, want %lld", bytes,
              (long long)(per * BATCH));
    /* the activation copies are those of a model without skips: one per
     * boundary and micro-batch */
    int acts = 0;
    for (int d = 0; d < 4; d++) {
        int cnt;
        const gp_event_rec *ev = gp_pipeline_events(pip.pipe, d, &cnt);
        for (int e = 0; e < cnt; e++) acts += !ev[e].is_wait && ev[e].kind == GP_INSTR_RECV_ACT;
    }
    CHECK_MSG(acts == 3 * M, "%d activation copies, want %d", acts, 3 * M);
    for (int j = 0; j < 4; j++)
        CHECK_MSG(gp_allocator_current(&devs[j]->alloc) == base[j],
                  "device %d holds %zu bytes after the step, %zu before", j,
                  gp_allocator_current(&devs[j]->alloc), base[j]);
    gp_model_free(&pip);
}

/* ---- ResNet: the built-in family ---------------------------------------------------- */

static gp_status resnet_cfg(int depth, int64_t side, gp_config *c)
{
    char text[512], set[64];
    snprintf(text, sizeof text,
             "model:\n  input: [3, %lld, %lld]\n  resnet: {depth: 101, classes: 1000}\n"
             "data: {dataset: synthetic, synthetic: {train: 8, test: 8, classes: 1000}}\n"
             "train: {batch_size: 4, seed: 5}\n",
             (long long)side, (long long)side);
    snprintf(set, sizeof set, "model.resnet.depth=%d", depth);
    const char *sets[1] = {set};
    return gp_config_parse("r.yaml", text, strlen(text), sets, 1, c);
}

/* Layer counts and parameter counts as torchgpipe's (and torchvision's)
 * models have them; layer 13 is the first block's projected residual, with
 * torchvision's parameter names. */
static void resnet_family(void)
{
    static const struct {
        int depth, layers;
        int64_t params;
    } want[] = {{50, 183, 25557032}, {101, 370, 44549160}, {152, 557, 60192808}};
    for (int q = 0; q < 3; q++) {
        gp_config c;
        gp_status s = resnet_cfg(want[q].depth, 32, &c);
        CHECK_OK(s);
        if (s != GP_OK) continue;
        CHECK_MSG(c.model.n_layers == want[q].layers, "resnet-%d: %d layers, want %d",
                  want[q].depth, c.model.n_layers, want[q].layers);
        gp_model m;
        CHECK_OK(gp_model_build(&c, devs[0], &m));
        CHECK_MSG(gp_model_param_count(&m) == want[q].params, "resnet-%d: %lld parameters, want %lld",
                  want[q].depth, (long long)gp_model_param_count(&m), (long long)want[q].params);
        gp_layer *r = &m.layers[13];
        CHECK(r->spec.type == GP_LAYER_ADD && !strcmp(r->spec.name, "layer1_0_residual"));
        CHECK(r->n_params == 5 && !strcmp(r->params[0].name, "module.downsample.0.weight") &&
              !strcmp(r->params[4].name, "module.downsample.1.running_var"));
        CHECK(m.skips.n == (want[q].layers - 7) / 11);
        /* torchvision's init: every conv and projection kaiming_normal_
         * (fan_out, relu); the stem's 64x3x7x7 and layer1_0's projection
         * 256x64x1x1 have the std sqrt(2 / fan_out) within 5 standard errors */
        int convs = 0, kaiming = 0;
        for (int k = 0; k < m.n_layers; k++) {
            const gp_layer_spec *sp = &m.layers[k].spec;
            if (sp->type != GP_LAYER_CONV2D && !(sp->type == GP_LAYER_ADD && sp->out)) continue;
            convs++;
            kaiming += sp->init == GP_INIT_KAIMING_NORMAL_FAN_OUT;
        }
        CHECK(convs > 0 && kaiming == convs);
        const gp_tensor *ws[2] = {&m.layers[0].params[0].value, &r->params[0].value};
        const double fan_out[2] = {64.0 * 49.0, 256.0};
        for (int t = 0; q == 0 && t < 2; t++) {
            int64_t n = gp_tensor_numel(ws[t]);
            float *h = malloc((size_t)n * sizeof *h);
            CHECK_OK(gp_dev_download(ws[t]->dev, h, gp_f32(ws[t]), n));
            CHECK_OK(gp_dev_synchronize(ws[t]->dev));
            double m2 = 0;
            for (int64_t i = 0; i < n; i++) m2 += (double)h[i] * h[i];
            CHECK_NEAR(sqrt(m2 / (double)n) / sqrt(2.0 / fan_out[t]), 1.0,
                       5.0 * sqrt(0.5 / (double)n), 0);
            free(h);
        }
        gp_model_free(&m);
        gp_config_free(&c);
    }
    gp_config c;
    CHECK(resnet_cfg(34, 32, &c) == GP_ERR_INVALID);
    CHECK_MSG(strstr(gp_last_error(), "model.resnet.depth must be 50, 101 or 152"), "%s",
              gp_last_error());
}

/* ResNet-50 at 32x32 on 1, 2 and 3 stages whose boundaries cut blocks, so
 * skips cross them, m in {1, 4}, every checkpoint mode: the same steps as
 * on one device, bit for bit (the sanitizer builds run one of them). */
static void resnet_transparency(bool sanitized)
{
    /* With the CPU's copy streams (test_skip_streams), what they add is
     * copies between stages finishing late: 2 and 3 stages at m = 4, every
     * checkpoint mode (one device has no copies; test_skip runs m = 1 and
     * one device) */
    bool streams = getenv("GPIPE_CPU_STREAMS") != NULL;
    gp_config c;
    CHECK_OK(resnet_cfg(50, 32, &c));
    static const int bal1[1] = {183}, bal2[2] = {50, 133}, bal3[3] = {20, 90, 73};
    const int *bals[3] = {bal1, bal2, bal3};
    for (int n = 1; n <= 3; n++)
        for (int m = 1; m <= 4; m += 3)
            for (int ck = 0; ck < 3; ck++) {
                if (sanitized && !(n == 3 && m == 4 && ck == GP_CKPT_EXCEPT_LAST)) continue;
                if (streams && (n == 1 || m == 1)) continue;
                c.pipeline.chunks = m;
                c.pipeline.checkpoint = (gp_checkpoint_mode)ck;
                c.pipeline.lockstep = true;
                gp_model ref, pip;
                CHECK_OK(gp_model_build(&c, devs[0], &ref));
                CHECK_OK(gp_model_build_placed(&c, devs, n, bals[n - 1], &pip));
                /* a skip crosses every boundary (each cuts a block) */
                for (int j = 0, end = 0; j + 1 < n; j++) {
                    end += bals[n - 1][j];
                    int across = 0;
                    for (int t = 0; t < pip.skips.n; t++)
                        across += gp_skip_crosses(&pip.skips.skips[t], end - 1);
                    CHECK_MSG(across == 1, "%d skips cross the boundary after layer %d", across,
                              end - 1);
                }
                bool same[3];
                /* batch 8: at m = 4 two samples per micro-batch, so layer4's
                 * 1x1 maps give batch norm two values per channel */
                gpt_compare_steps(&c, &ref, &pip, 8, 1, same);
                CHECK_MSG(same[0] && same[1] && same[2],
                          "resnet-50 on %d stages, m %d, checkpoint %d differs from one device: "
                          "loss %d, grads %d, params %d", n, m, ck, same[0], same[1], same[2]);
                gp_model_free(&ref);
                gp_model_free(&pip);
            }
    gp_config_free(&c);
}

/* The configurations of the two bf16 grids (copies, activations) that the
 * sanitizer builds run: the largest stage count (4; interleaved: its 2),
 * every schedule and checkpoint mode, lockstep on for some and off for
 * others of each schedule.  With 2 or 3 stages the threads hand on the
 * same bf16 tensors the same way, across fewer boundaries; the
 * unsanitized build runs both grids in full. */
static bool bf16_sampled(gp_schedule_kind kind, int n, int ck, int ls)
{
    bool two = kind == GP_SCHEDULE_INTERLEAVED || kind == GP_SCHEDULE_ZB_V;
    return n == (two ? 2 : 4) && ls == (ck + (int)kind) % 2;
}

int main(void)
{
    gpt_open_cpu_devices(devs, 4, 1);
    pop_layers(devs[0]);
    skip_map();
    checkpoint_skips();
    model_gradients();
    overlapping_skips();
    grads_handed_on();
    portals();
    gpt_san san = gpt_sanitizer();
    bool sanitized = san != GPT_SAN_NONE;
    /* The family's models are built on one device by one thread:
     * ThreadSanitizer has nothing to check there (under it they took a
     * third of the test's time), and the other builds run them. */
    if (san != GPT_SAN_THREAD) resnet_family();
    else printf("test_skip: ThreadSanitizer: the ResNet family's builds (one thread) left to "
                "the unsanitized and AddressSanitizer runs\n");
    resnet_transparency(sanitized);
    static const gp_schedule_kind kinds[] = {GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B,
                                             GP_SCHEDULE_ZB_H1, GP_SCHEDULE_INTERLEAVED,
                                             GP_SCHEDULE_ZB_V};
    /* zb-v: 2n stages in a V, so skips also join two stages of one device
     * (stage 0's stash popped on stage 2n - 1) */
    for (int k = 0; k < 5; k++)
        for (int n = 1; n <= 4; n++) {
            if (kinds[k] == GP_SCHEDULE_INTERLEAVED && n != 2) continue;
            for (int m = 1; m <= 4; m += 3) {
                if (kinds[k] == GP_SCHEDULE_INTERLEAVED && m % n) continue;
                for (int ck = 0; ck < 3; ck++)
                    for (int ls = 0; ls < 2; ls++) {
                        if (sanitized && (ls == 0 || ck == 1) && n != 4) continue;
                        transparency(n, m, (gp_checkpoint_mode)ck, ls, kinds[k], false);
                    }
            }
        }
    /* the other V schedules: the same skips across a V (DualPipeV feeds
     * both ends: m = 4 on 2 devices), every checkpoint mode */
    static const gp_schedule_kind v_kinds[] = {GP_SCHEDULE_DUALPIPE_V, GP_SCHEDULE_V_HALF,
                                               GP_SCHEDULE_V_MIN};
    for (int k = 0; k < 3; k++)
        for (int ck = 0; ck < 3; ck++)
            transparency(2, 4, (gp_checkpoint_mode)ck, ck % 2, v_kinds[k], false);
    /* copies in bf16: every schedule on 2-4 devices (interleaved on 2, 4
     * stages), every checkpoint mode, lockstep on and off.  With the CPU's
     * copy streams (test_skip_streams) both bf16 grids run the sanitizers'
     * sample as well: what the streams add, copies that finish later than
     * they are enqueued, is the same for a bf16 tensor as for the FP32
     * grid above, which they run whole; test_skip runs these whole */
    bool thin = sanitized || getenv("GPIPE_CPU_STREAMS") != NULL;
    if (thin && !sanitized)
        printf("test_skip: copy streams: the bf16 grids run a sample (every schedule and "
               "checkpoint mode on the most stages); test_skip runs them whole\n");
    for (int k = 0; k < 5; k++)
        for (int n = 2; n <= 4; n++) {
            if ((kinds[k] == GP_SCHEDULE_INTERLEAVED || kinds[k] == GP_SCHEDULE_ZB_V) && n != 2)
                continue;
            for (int ck = 0; ck < 3; ck++)
                for (int ls = 0; ls < 2; ls++) {
                    if (thin && !bf16_sampled(kinds[k], n, ck, ls)) continue;
                    transparency(n, 4, (gp_checkpoint_mode)ck, ls, kinds[k], true);
                }
        }
    /* activations stored in bf16 (train.activations): the skips and their
     * gradients are bf16 tensors, rounded where the one-device run rounds
     * them, so the same configurations give its bits with no rounded
     * oracle */
    act = GP_ACT_BF16;
    int before = failures;
    for (int k = 0; k < 5; k++)
        for (int n = 2; n <= 4; n++) {
            if ((kinds[k] == GP_SCHEDULE_INTERLEAVED || kinds[k] == GP_SCHEDULE_ZB_V) && n != 2)
                continue;
            for (int ck = 0; ck < 3; ck++)
                for (int ls = 0; ls < 2; ls++) {
                    if (thin ? !bf16_sampled(kinds[k], n, ck, ls) : ls == 0 && n != 4)
                        continue;
                    transparency(n, 4, (gp_checkpoint_mode)ck, ls, kinds[k], false);
                }
        }
    act = GP_ACT_AUTO;
    printf("test_skip: bf16 activations: %d configurations differ\n", failures - before);
    if (sanitized)
        printf("test_skip: sanitizer build: the bf16 grids on 4 stages (interleaved: 2) only; "
               "the unsanitized build runs them on 2-4\n");
    CHECK_MSG(failures == 0, "%d transparency runs differ", failures);
    for (int j = 0; j < 4; j++) gp_device_close(devs[j]);
    return gpt_finish("test_skip");
}
