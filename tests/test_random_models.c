/*
 * test_random_models.c — random layouts of layers and skips against two
 * oracles, for the bugs that only a layout nobody wrote by hand shows.
 *
 * Each seed draws one model (gen_model): a 4-D phase of conv, relu, leaky
 * relu, batch norm, identity, dropout, max / average pools, instance norm,
 * dropout2d, upsample and residual blocks, then global average pool or not,
 * flatten, and a 2-D phase of linear, gelu, layer norm, rms norm, relu,
 * leaky relu, swiglu and dropout, with skips (stash / pop) drawn between
 * any two layers of a phase, closed by add (plain, or a projection with a
 * stride), concat or a 2-D add, so that skips nest, overlap and sit next
 * to each other in every order.  Two oracles:
 *
 *   - finite differences (fd_model): on one device, the gradient of the
 *     summed loss with respect to sampled coordinates of every trained
 *     parameter and of the input, from the whole backward and from the
 *     split one (backward-data, then backward-weights), against central
 *     differences of the double-precision loss sum.  Kink-aware: a
 *     coordinate whose +eps and -eps forwards differ in the sign of any
 *     relu / leaky relu output or the arg-max of any max-pool window
 *     (kink_pattern) has a kink inside the step, where a central
 *     difference is no oracle; it is drawn again.  The whole and the split
 *     backward also equal each other bit for bit;
 *   - transparency (pipe_model): the one-device step against 2 to 4
 *     devices at random cuts, schedules gpipe, 1f1b, zb-h1 and zb-v,
 *     m in 1..4, every checkpoint mode, lockstep on and off, dropout on
 *     and off, SGD with momentum or AdamW: losses, the first step's
 *     gradients and the parameters after two steps equal bit for bit.
 *
 * A failure prints the seed and the model in the DSL below, which the
 * replay mode takes:
 *     test_random_models                       the default seeds (default_seeds)
 *     test_random_models fuzz SEED COUNT       seeds SEED .. SEED + COUNT - 1
 *     test_random_models run "MODEL" [SEED]    one model; SEED (default 1)
 *                                              draws its samples and settings
 * DSL: "in=2x8x8 conv,o=4,k=3,pd=1,st=a relu add,p=a flatten linear,o=5";
 * options o= out, k= kernel, s= stride, pd= padding, nb no bias, sl= slope,
 * sc= scale, st= stash, p= pop.
 * The default seeds (default_seeds) include layouts that catch the two
 * bugs found by the random layouts that came before this test, with their
 * fixes reverted (a stash by the layer before an add's pop, 6ad02f3;
 * x + LN(x), 3cffeeb).  Under a sanitizer (GPIPE_SANITIZED) a third of the
 * seeds run, those included.  A residual block's relus are inside it, where
 * no kink_pattern sees them: the coordinates of it and of the layers before
 * it are left to the pipeline oracle.
 */
#include "config/config.h"
#include "pipeline/pipeline.h"
#include "test_ref.h"

#include <math.h>

enum { MAXL = 40, NDEV = 4, FD_B = 5, PIPE_B = 6, FD_SAMPLES = 3, PIPE_CHECKS = 3 };

static gp_device *devs[NDEV];

typedef struct {
    gp_layer_spec sp[MAXL];
    int n;
    int64_t in[3]; /* (C, H, W) */
} rmodel;

/* ---- the DSL --------------------------------------------------------------------------- */

static const struct {
    const char *name;
    gp_layer_type type;
} k_names[] = {
    {"conv", GP_LAYER_CONV2D}, {"relu", GP_LAYER_RELU}, {"leaky", GP_LAYER_LEAKY_RELU},
    {"bn", GP_LAYER_BATCHNORM}, {"id", GP_LAYER_IDENTITY}, {"maxpool", GP_LAYER_MAXPOOL2D},
    {"avgpool", GP_LAYER_AVGPOOL2D}, {"drop", GP_LAYER_DROPOUT}, {"flatten", GP_LAYER_FLATTEN},
    {"linear", GP_LAYER_LINEAR}, {"add", GP_LAYER_ADD}, {"concat", GP_LAYER_CONCAT},
    {"gap", GP_LAYER_GLOBAL_AVGPOOL}, {"gelu", GP_LAYER_GELU}, {"ln", GP_LAYER_LAYER_NORM},
    {"in", GP_LAYER_INSTANCE_NORM}, {"drop2d", GP_LAYER_DROPOUT2D}, {"up", GP_LAYER_UPSAMPLE},
    {"res", GP_LAYER_RESIDUAL}, {"rms", GP_LAYER_RMS_NORM}, {"swiglu", GP_LAYER_SWIGLU},
};

static const char *type_name(gp_layer_type t)
{
    for (size_t i = 0; i < sizeof k_names / sizeof *k_names; i++)
        if (k_names[i].type == t) return k_names[i].name;
    return "?";
}

static bool windowed(gp_layer_type t)
{
    return t == GP_LAYER_CONV2D || t == GP_LAYER_MAXPOOL2D || t == GP_LAYER_AVGPOOL2D;
}

static void print_layer(const gp_layer_spec *s, FILE *f)
{
    fprintf(f, " %s", type_name(s->type));
    if (s->out) fprintf(f, ",o=%lld", (long long)s->out);
    if (windowed(s->type)) fprintf(f, ",k=%lld", (long long)s->kernel.h);
    if ((s->type == GP_LAYER_CONV2D || s->type == GP_LAYER_ADD) && s->stride.h > 1)
        fprintf(f, ",s=%lld", (long long)s->stride.h);
    if (s->padding.h) fprintf(f, ",pd=%lld", (long long)s->padding.h);
    if ((s->type == GP_LAYER_CONV2D || s->type == GP_LAYER_LINEAR) && !s->bias) fprintf(f, ",nb");
    if (s->type == GP_LAYER_LEAKY_RELU) fprintf(f, ",sl=%g", (double)s->slope);
    if (s->type == GP_LAYER_UPSAMPLE) fprintf(f, ",sc=%lld", (long long)s->scale);
    if (s->n_pop) fprintf(f, ",p=%s", s->pop[0]);
    if (s->stash[0]) fprintf(f, ",st=%s", s->stash);
}

static void print_model(const rmodel *m, FILE *f)
{
    fprintf(f, "in=%lldx%lldx%lld", (long long)m->in[0], (long long)m->in[1],
            (long long)m->in[2]);
    for (int k = 0; k < m->n; k++) print_layer(&m->sp[k], f);
    fputc('\n', f);
}

static gp_layer_spec mk(gp_layer_type t, int line)
{
    gp_layer_spec s = gp_layer_spec_default(t);
    snprintf(s.file, sizeof s.file, "random.yaml");
    s.line = line;
    s.column = 5;
    if (t == GP_LAYER_DROPOUT || t == GP_LAYER_DROPOUT2D) s.p = 0.0f; /* (pipe_model sets it) */
    return s;
}

static bool parse_option(gp_layer_spec *s, const char *o)
{
    if (!strncmp(o, "o=", 2)) s->out = atoll(o + 2);
    else if (!strncmp(o, "k=", 2)) s->kernel = gp_hw_square(atoll(o + 2));
    else if (!strncmp(o, "s=", 2)) s->stride = gp_hw_square(atoll(o + 2));
    else if (!strncmp(o, "pd=", 3)) s->padding = gp_hw_square(atoll(o + 3));
    else if (!strcmp(o, "nb")) s->bias = false;
    else if (!strncmp(o, "sl=", 3)) s->slope = (float)atof(o + 3);
    else if (!strncmp(o, "sc=", 3)) s->scale = atoll(o + 3);
    else if (!strncmp(o, "st=", 3)) snprintf(s->stash, sizeof s->stash, "%s", o + 3);
    else if (!strncmp(o, "p=", 2)) {
        snprintf(s->pop[0], sizeof s->pop[0], "%s", o + 2);
        s->n_pop = 1;
    } else return false;
    return true;
}

/* The model the DSL text describes; false (with the reason on stderr) for
 * a word it does not know. */
static bool parse_model(const char *txt, rmodel *m)
{
    memset(m, 0, sizeof *m);
    char *dup = strdup(txt), *save = NULL;
    bool ok = dup != NULL;
    for (char *tok = ok ? strtok_r(dup, " \n", &save) : NULL; tok && ok;
         tok = strtok_r(NULL, " \n", &save)) {
        long long c, h, w;
        if (sscanf(tok, "in=%lldx%lldx%lld", &c, &h, &w) == 3) {
            m->in[0] = c, m->in[1] = h, m->in[2] = w;
            continue;
        }
        char *s2 = NULL, *name = strtok_r(tok, ",", &s2);
        gp_layer_type t = GP_LAYER_TYPE_COUNT;
        for (size_t i = 0; i < sizeof k_names / sizeof *k_names; i++)
            if (!strcmp(k_names[i].name, name)) t = k_names[i].type;
        ok = t != GP_LAYER_TYPE_COUNT && m->n < MAXL;
        gp_layer_spec s = mk(t, m->n + 1);
        for (char *o = strtok_r(NULL, ",", &s2); o && ok; o = strtok_r(NULL, ",", &s2))
            ok = parse_option(&s, o);
        if (ok) m->sp[m->n++] = s;
        else fprintf(stderr, "test_random_models: cannot read '%s'\n", name);
    }
    free(dup);
    return ok && m->n > 0;
}

/* ---- the generator --------------------------------------------------------------------- */

static int draw(hrng *r, int n) { return (int)(hrng_unit(r) * n); }

typedef struct {
    char name[8];
    int64_t c, h, w; /* its shape (c: features in the 2-D phase) */
} open_skip;

typedef struct {
    rmodel *m;
    hrng *r;
    open_skip open[8];
    int n_open, n_named, line;
    int64_t c, h, w; /* the current shape */
    double p_stash, p_pop;
} gen_state;

static void gen_push(gen_state *g, gp_layer_spec s) { g->m->sp[g->m->n++] = s; }

/* Maybe stash the layer's output s (not the phase's closing layers). */
static void gen_maybe_stash(gen_state *g, gp_layer_spec *s, char prefix)
{
    if (g->n_open >= 6 || hrng_unit(g->r) >= g->p_stash) return;
    open_skip *o = &g->open[g->n_open++];
    snprintf(o->name, sizeof o->name, "%c%d", prefix, g->n_named++ % 1000);
    snprintf(s->stash, sizeof s->stash, "%s", o->name);
    o->c = g->c, o->h = g->h, o->w = g->w;
}

/* A 4-D pop of open skip q: add (same shape), add with a projection (the
 * skip is larger by a stride), or concat (the skip at least as large); false
 * where none fits. */
static bool gen_pop_4d(gen_state *g, int q, bool closing, gp_layer_spec *s)
{
    open_skip o = g->open[q];
    bool same = o.c == g->c && o.h == g->h && o.w == g->w;
    int stride = 0;
    for (int st = 1; st <= 3 && !stride; st++)
        if ((o.h - 1) / st + 1 == g->h && (o.w - 1) / st + 1 == g->w) stride = st;
    int choice = draw(g->r, 3); /* 0 add, 1 projection, 2 concat */
    if (choice == 0 && !same) choice = stride ? 1 : 2;
    if (choice == 1 && !stride) choice = 2;
    if (choice == 2 && (o.h < g->h || o.w < g->w)) return false;
    if (choice == 2 && closing && g->c + o.c > 12 && stride) choice = 1;
    if (choice == 0) *s = mk(GP_LAYER_ADD, g->line++);
    else if (choice == 1) {
        *s = mk(GP_LAYER_ADD, g->line++);
        s->out = g->c;
        s->stride = gp_hw_square(stride);
    } else {
        *s = mk(GP_LAYER_CONCAT, g->line++);
        g->c += o.c, g->h = o.h, g->w = o.w;
    }
    snprintf(s->pop[0], sizeof s->pop[0], "%s", o.name);
    s->n_pop = 1;
    g->open[q] = g->open[--g->n_open];
    return true;
}

static gp_layer_spec gen_conv(gen_state *g)
{
    gp_layer_spec s = mk(GP_LAYER_CONV2D, g->line++);
    s.out = 2 + draw(g->r, 3);
    int k = draw(g->r, 3) ? 3 : 1;
    s.kernel = gp_hw_square(k);
    s.padding = gp_hw_square(k / 2);
    if (g->h >= 4 && draw(g->r, 6) == 0) s.stride = gp_hw_square(2);
    s.bias = draw(g->r, 2);
    g->c = s.out;
    g->h = (g->h + 2 * (k / 2) - k) / (s.stride.h > 0 ? s.stride.h : 1) + 1;
    g->w = g->h;
    return s;
}

/* instance norm, dropout2d, upsample or a residual block */
static gp_layer_spec gen_rare_4d(gen_state *g)
{
    int e = draw(g->r, 4);
    if (e == 0 && g->h * g->w > 1) return mk(GP_LAYER_INSTANCE_NORM, g->line++);
    if (e == 1) return mk(GP_LAYER_DROPOUT2D, g->line++);
    if (e == 2 && g->h <= 4) {
        gp_layer_spec s = mk(GP_LAYER_UPSAMPLE, g->line++);
        s.scale = 2;
        g->h *= 2, g->w *= 2;
        return s;
    }
    gp_layer_spec s = mk(GP_LAYER_RESIDUAL, g->line++);
    s.out = g->c;
    return s;
}

static gp_layer_spec gen_layer_4d(gen_state *g)
{
    int r = draw(g->r, 11);
    if (r <= 2) return gen_conv(g);
    if (r == 3) return mk(GP_LAYER_RELU, g->line++);
    if (r == 4) {
        gp_layer_spec s = mk(GP_LAYER_LEAKY_RELU, g->line++);
        s.slope = 0.1f;
        return s;
    }
    if (r == 5) return mk(GP_LAYER_BATCHNORM, g->line++);
    if (r == 6) return mk(GP_LAYER_IDENTITY, g->line++);
    if (r == 7 && g->h >= 4) {
        gp_layer_spec s = mk(draw(g->r, 2) ? GP_LAYER_MAXPOOL2D : GP_LAYER_AVGPOOL2D, g->line++);
        s.kernel = gp_hw_square(2);
        g->h /= 2, g->w /= 2;
        return s;
    }
    if (r == 8) return gen_rare_4d(g);
    return mk(GP_LAYER_DROPOUT, g->line++);
}

static void gen_phase_4d(gen_state *g)
{
    int n4 = 3 + draw(g->r, 8);
    for (int k = 0; k < n4 + 40 && g->m->n < MAXL - 12; k++) {
        bool closing = k >= n4;
        if (closing && g->n_open == 0) break;
        gp_layer_spec s;
        bool popped = false;
        if (g->n_open > 0 && (closing || hrng_unit(g->r) < g->p_pop)) {
            int q = closing && draw(g->r, 2) ? g->n_open - 1 : draw(g->r, g->n_open);
            popped = gen_pop_4d(g, q, closing, &s);
        }
        if (!popped) s = closing ? mk(GP_LAYER_IDENTITY, g->line++) : gen_layer_4d(g);
        if (!closing) gen_maybe_stash(g, &s, 's');
        gen_push(g, s);
    }
}

static gp_layer_spec gen_layer_2d(gen_state *g)
{
    int r = draw(g->r, 10);
    gp_layer_spec s;
    if (r <= 1 || r == 9) {
        s = mk(GP_LAYER_LINEAR, g->line++);
        s.out = 4 + draw(g->r, 4);
        s.bias = draw(g->r, 3) != 0;
        if (r == 9) { /* linear 2f, swiglu: f */
            s.out = 2 * (2 + draw(g->r, 3));
            gen_push(g, s);
            s = mk(GP_LAYER_SWIGLU, g->line++);
            g->c = g->m->sp[g->m->n - 1].out / 2;
            return s;
        }
        g->c = s.out;
        return s;
    }
    static const gp_layer_type k_plain[] = {GP_LAYER_GELU, GP_LAYER_LAYER_NORM, GP_LAYER_RELU,
                                            GP_LAYER_IDENTITY, GP_LAYER_DROPOUT,
                                            GP_LAYER_LEAKY_RELU, GP_LAYER_RMS_NORM};
    s = mk(k_plain[r - 2], g->line++);
    if (s.type == GP_LAYER_LEAKY_RELU) s.slope = 0.1f;
    return s;
}

static void gen_phase_2d(gen_state *g)
{
    gp_layer_spec s = mk(GP_LAYER_LINEAR, g->line++);
    s.out = g->c = 4 + draw(g->r, 4);
    gen_push(g, s);
    g->n_open = 0;
    int n2 = 2 + draw(g->r, 6);
    for (int k = 0; k < n2 + 20 && g->m->n < MAXL - 3; k++) {
        bool closing = k >= n2;
        if (closing && g->n_open == 0) break;
        bool popped = false;
        if (g->n_open > 0 && (closing || hrng_unit(g->r) < g->p_pop)) {
            int q = draw(g->r, g->n_open);
            bool add = g->open[q].c == g->c && draw(g->r, 3);
            s = mk(add ? GP_LAYER_ADD : GP_LAYER_CONCAT, g->line++);
            if (!add) g->c += g->open[q].c;
            snprintf(s.pop[0], sizeof s.pop[0], "%s", g->open[q].name);
            s.n_pop = 1;
            g->open[q] = g->open[--g->n_open];
            popped = true;
        }
        if (!popped) s = closing ? mk(GP_LAYER_IDENTITY, g->line++) : gen_layer_2d(g);
        if (!closing) gen_maybe_stash(g, &s, 't');
        gen_push(g, s);
    }
}

/* The model of seed `seed`: input 2 x H x H (H 6 or 8), 5 classes. */
static void gen_model(uint64_t seed, rmodel *m)
{
    memset(m, 0, sizeof *m);
    hrng r = {seed * 1000003ull};
    gen_state g = {.m = m, .r = &r, .line = 1, .c = 2};
    g.h = g.w = draw(&r, 2) ? 8 : 6;
    m->in[0] = g.c, m->in[1] = g.h, m->in[2] = g.w;
    g.p_stash = 0.25 + 0.35 * hrng_unit(&r);
    g.p_pop = 0.3 + 0.4 * hrng_unit(&r);
    gen_phase_4d(&g);
    if (draw(&r, 2)) {
        gen_push(&g, mk(GP_LAYER_GLOBAL_AVGPOOL, g.line++));
        g.h = g.w = 1;
    }
    gen_push(&g, mk(GP_LAYER_FLATTEN, g.line++));
    g.c *= g.h * g.w;
    if (draw(&r, 2)) gen_phase_2d(&g);
    gp_layer_spec s = mk(GP_LAYER_LINEAR, g.line++);
    s.out = 5;
    gen_push(&g, s);
}

/* ---- one device: forward, backward, kinks ---------------------------------------------- */

static gp_config cfg_of(rmodel *md, int64_t batch)
{
    static gp_layer_spec scratch[GPT_MAX_SPECS];
    gp_config c = gpt_model_cfg(scratch, true, false, batch); /* (its layers replaced) */
    c.model.layers = md->sp;
    c.model.n_layers = md->n;
    for (int d = 0; d < 3; d++) c.model.input[d] = md->in[d];
    c.pipeline.threads = 1;
    return c;
}

/* Bytes that say where every kink of the model's forward stands: a relu's
 * and a leaky relu's output signs, and each max-pool window's arg-max. */
typedef struct {
    uint8_t *b;
    size_t n, cap;
} kink_pattern;

static void pattern_put(kink_pattern *p, uint8_t v)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 4096;
        p->b = realloc(p->b, p->cap);
    }
    p->b[p->n++] = v;
}

/* Index of (n, c, s) in a (N, C, S) tensor in layout blk (gp_blk_valid). */
static int64_t blk_index(int64_t blk, int64_t C, int64_t S, int64_t n, int64_t c, int64_t s)
{
    if (!blk) return (n * C + c) * S + s;
    if (gp_blk_nhwc(blk)) return (n * S + s) * C + c;
    return ((n * (C / blk) + c / blk) * S + s) * blk + c % blk;
}

/* The arg-max of every window of max-pool l over its input x (host, numel
 * values: l's shapes are one sample's). */
static void maxpool_kinks(const gp_layer *l, const float *x, int64_t numel, kink_pattern *p)
{
    const gp_shape *in = &l->in_shape;
    int64_t C = in->dims[1], H = in->dims[2], W = in->dims[3], N = numel / (C * H * W);
    gp_hw k = l->spec.kernel, st = l->spec.stride.h > 0 ? l->spec.stride : k, pd = l->spec.padding;
    int64_t oh = l->out_shape.dims[2], ow = l->out_shape.dims[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < oh * ow; i++) {
                int best = -1;
                float v = -INFINITY;
                for (int64_t q = 0; q < k.h * k.w; q++) {
                    int64_t y = i / ow * st.h - pd.h + q / k.w, xx = i % ow * st.w - pd.w + q % k.w;
                    if (y < 0 || y >= H || xx < 0 || xx >= W) continue;
                    float u = x[blk_index(l->in_blk, C, H * W, n, c, y * W + xx)];
                    if (u > v) v = u, best = (int)q;
                }
                pattern_put(p, (uint8_t)best);
            }
}

/* The kinks of the forward s kept (GP_FWD_KEEP): relu and leaky relu read
 * their output in backward, so it is kept and nothing overwrites it
 * (gp_layers_inplace); a max pool reads its input. */
static void kinks_of(const gp_model *m, const gp_stash *s, kink_pattern *p)
{
    p->n = 0;
    for (int k = 0; k < m->n_layers; k++) {
        gp_layer_type t = m->layers[k].spec.type;
        if (t != GP_LAYER_RELU && t != GP_LAYER_LEAKY_RELU && t != GP_LAYER_MAXPOOL2D) continue;
        const gp_tensor *a = &s->acts[t == GP_LAYER_MAXPOOL2D ? k : k + 1];
        CHECK_MSG(gp_tensor_mem(a) != NULL, "layer %d's kinks are not kept", k);
        if (!gp_tensor_mem(a)) continue;
        float *h = gpt_download(a);
        if (t == GP_LAYER_MAXPOOL2D) maxpool_kinks(&m->layers[k], h, gp_tensor_numel(a), p);
        else
            for (int64_t i = 0; i < gp_tensor_numel(a); i++) pattern_put(p, h[i] > 0);
        free(h);
    }
}

/* One forward of the whole model on (x, y) and the summed loss.  backward
 * 0: the forward alone, its kinks into *kinks (NULL: not wanted); 1 the
 * whole backward, 2 the split one (data, then weights), with dL/dx into
 * *dx (every parameter's gradient set, not scaled). */
static double model_run(gp_model *m, const float *x, const float *y, int backward,
                        kink_pattern *kinks, gp_tensor *dx)
{
    gp_fwd_ctx ctx = {.training = true, .recompute = !backward, .seed = 3, .step = 1,
                      .batch_total = FD_B};
    gp_stash s;
    CHECK_OK(gp_stash_init(&s, m->n_layers, &m->skips, 0));
    gp_shape xs = gp_shape_with_batch(&m->input, FD_B), ls = {1, {FD_B, 0, 0, 0}};
    s.in = gpt_upload(m->dev, &xs, x);
    gp_tensor labels = gpt_upload(m->dev, &ls, y), dl = {0};
    int bad = -1;
    CHECK_OK(gp_ckpt_forward(m->layers, &ctx, GP_FWD_KEEP, &s, &bad));
    if (kinks) kinks_of(m, &s, kinks);
    gp_loss_out lo = {0};
    CHECK_OK(gp_ckpt_loss(m->dev, GP_LOSS_CROSS_ENTROPY, 0.0f, 0, &s.out, &labels, 1.0f,
                          backward ? &dl : NULL, &lo));
    if (backward) {
        for (int k = 0; k < m->n_layers; k++) gp_layer_grads_begin(&m->layers[k]);
        if (backward == 2) {
            CHECK_OK(gp_ckpt_backward_data(m->layers, &ctx, &s, &dl, 0, dx, &bad));
            CHECK_OK(gp_ckpt_backward_weights(m->layers, &ctx, &s, 0, true, &bad));
        } else {
            CHECK_OK(gp_ckpt_backward(m->layers, &ctx, &s, &dl, 0, dx, &bad));
        }
        for (int k = 0; k < m->n_layers; k++) CHECK_OK(gp_layer_grads_finish(&m->layers[k]));
    }
    gp_tensor_free(&labels);
    gp_stash_destroy(&s);
    return lo.loss_sum;
}

/* ---- finite differences ---------------------------------------------------------------- */

/* A model's gradients on the host: g[0] the whole backward's, g[1] the
 * split one's, for each trained parameter and then the input. */
typedef struct {
    int n;                        /* tensors: the trained parameters, then the input */
    float *g[2][GPT_MAX_PARAMS];
    gp_param *param[GPT_MAX_PARAMS]; /* NULL: the input */
    int layer[GPT_MAX_PARAMS];       /* -1: the input */
    int64_t numel[GPT_MAX_PARAMS];
} grad_set;

static const char *grad_name(const grad_set *gs, int q)
{
    return gs->param[q] ? gs->param[q]->name : "input";
}

static void grads_collect(gp_model *m, const float *x, const float *y, grad_set *gs)
{
    memset(gs, 0, sizeof *gs);
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params && gs->n < GPT_MAX_PARAMS - 1; p++) {
            gp_param *pr = &m->layers[k].params[p];
            if (pr->is_buffer) continue;
            gs->param[gs->n] = pr;
            gs->layer[gs->n] = k;
            gs->numel[gs->n++] = gp_tensor_numel(&pr->value);
        }
    gs->layer[gs->n] = -1;
    gs->numel[gs->n++] = FD_B * m->input.dims[1] * m->input.dims[2] * m->input.dims[3];
    for (int half = 0; half < 2; half++) {
        gp_tensor dx = {0};
        model_run(m, x, y, half + 1, NULL, &dx);
        for (int q = 0; q < gs->n - 1; q++) gs->g[half][q] = gpt_download(&gs->param[q]->grad);
        gs->g[half][gs->n - 1] = gpt_download(&dx);
        CHECK(gp_tensor_numel(&dx) == gs->numel[gs->n - 1]);
        gp_tensor_free(&dx);
    }
}

static void grads_free(grad_set *gs)
{
    for (int half = 0; half < 2; half++)
        for (int q = 0; q < gs->n; q++) free(gs->g[half][q]);
}

/* The whole and the split backward compute the same sums in the same order
 * (checkpoint.h: equal bit for bit). */
static int check_split(const grad_set *gs)
{
    int off = 0;
    for (int q = 0; q < gs->n; q++)
        if (gs->numel[q] > 0 &&
            memcmp(gs->g[0][q], gs->g[1][q], (size_t)gs->numel[q] * sizeof(float))) {
            if (off++ < 3)
                fprintf(stderr, "  layer %d %s: the split backward's gradient differs from the "
                        "whole one's\n", gs->layer[q], grad_name(gs, q));
        }
    CHECK_MSG(off == 0, "%d tensors' gradients differ between the whole and the split backward",
              off);
    return off;
}

/* One coordinate moved by +-eps (a parameter's on the device, or the
 * input's in x). */
static void set_coord(gp_model *m, gp_tensor *w, float *x, int64_t i, float v)
{
    if (w) CHECK_OK(gp_dev_upload(m->dev, gp_f32(w) + i, &v, 1));
    else x[i] = v;
}

typedef struct {
    gp_model *m;
    float *x, *y;
    kink_pattern base, kp, km;
    double l0;   /* the loss unmoved */
    double atol; /* fd_tensor's absolute tolerance */
    int opaque;  /* the last residual block (-1: none): relus inside, whose
                    outputs no stash shows, so no kink_pattern sees their
                    kinks; a coordinate of it or before it is not drawn */
    int checked, kinked, bad;
} fd_ctx;

/* eps: float32's rounding of the loss sum (about 1e-7 of 8) stays under
 * 1e-3 of a derivative of 1, and the step's own error (eps^2 / 6 times the
 * third derivative) under that, on most pieces (fd_tensor) */
#define FD_EPS 1e-3f

/* The central difference of coordinate i of tensor q (w NULL: the input)
 * with step eps; false where a kink lies inside the step (the kinks of the
 * two forwards, or of either and the unmoved one, differ). */
static bool central_diff(fd_ctx *f, gp_tensor *w, int64_t i, float eps, double *num)
{
    float o;
    if (w) {
        CHECK_OK(gp_dev_download(f->m->dev, &o, gp_f32(w) + i, 1));
        CHECK_OK(gp_dev_synchronize(f->m->dev));
    } else {
        o = f->x[i];
    }
    float up = o + eps, down = o - eps;
    set_coord(f->m, w, f->x, i, up);
    double lp = model_run(f->m, f->x, f->y, 0, &f->kp, NULL);
    set_coord(f->m, w, f->x, i, down);
    double lm = model_run(f->m, f->x, f->y, 0, &f->km, NULL);
    set_coord(f->m, w, f->x, i, o);
    /* (no kinks recorded: no pattern, its buffers NULL, which memcmp may not take) */
    bool smooth = f->kp.n == f->km.n && f->kp.n == f->base.n &&
                  (f->kp.n == 0 || (!memcmp(f->kp.b, f->km.b, f->kp.n) &&
                                    !memcmp(f->kp.b, f->base.b, f->kp.n)));
    *num = (lp - lm) / ((double)up - (double)down);
    return smooth;
}

/* FD_SAMPLES coordinates of tensor q (each drawn again up to 4 times where
 * a kink lies inside its step), both backwards' gradients against the
 * central difference, within f->atol + 2e-2 |numeric|.  The forward is
 * float32: the loss sum moved by a coordinate that cannot change it (a
 * bias before a batch norm) still moves by up to ~100 u |L| (u = 2^-24:
 * 6e-6 on a loss of 8.5 in one fuzzed layout, the same at every step
 * from 1e-4 to 1e-3), which the 2 eps = 2e-3 step divides into
 * 100 u |L| / (2 eps); atol is twice that, plus 1e-3.  The step's own
 * error on a smooth piece (eps^2 / 6 times the third derivative) stays
 * far under it; 2 % covers the float32 sums of the analytic side through
 * ~40 layers.  The bugs this test was written for were off by 10 % to
 * 80x. */
static gp_tensor *w_of(const grad_set *gs, int q)
{
    return gs->param[q] ? &gs->param[q]->value : NULL;
}

static void fd_tensor(fd_ctx *f, const grad_set *gs, int q, hrng *r)
{
    int64_t n = gs->numel[q];
    for (int t = 0; t < FD_SAMPLES && t < n; t++) {
        double num = 0;
        int64_t i = 0;
        bool smooth = false;
        for (int a = 0; a < 4 && !smooth; a++) {
            i = n <= FD_SAMPLES ? t : (int64_t)(hrng_unit(r) * (double)n);
            smooth = central_diff(f, w_of(gs, q), i, FD_EPS, &num);
            if (!smooth) f->kinked++;
        }
        if (!smooth) continue;
        f->checked++;
        double tol = f->atol;
        for (int half = 0; half < 2; half++) {
            double g = gs->g[half][q][i];
            if (fabs(g - num) <= tol + 2e-2 * fabs(num)) continue;
            /* a piece curved enough that the step's own error (eps^2 / 6
             * times the third derivative) shows: again at half the step,
             * and Richardson's (4 D(eps/2) - D(eps)) / 3 takes the eps^2
             * term out (its float32 noise 3x the one step's).  Seed 1019's
             * bias read -0.92, -0.38, -0.24 at eps 2e-3, 1e-3, 5e-4 for an
             * analytic -0.196; a wrong gradient stays wrong */
            double half_step;
            if (tol == f->atol && central_diff(f, w_of(gs, q), i, FD_EPS / 2, &half_step)) {
                num = (4 * half_step - num) / 3;
                tol = 3 * f->atol;
                if (fabs(g - num) <= tol + 2e-2 * fabs(num)) continue;
            }
            if (f->bad++ < 6)
                fprintf(stderr, "  %s backward: layer %d (%s) %s[%lld]: analytic %.7g, "
                        "numeric %.7g\n", half ? "split" : "whole", gs->layer[q],
                        gs->layer[q] >= 0 ? type_name(f->m->layers[gs->layer[q]].spec.type)
                                          : "-", grad_name(gs, q), (long long)i, g, num);
        }
    }
}

typedef struct {
    int models, refused, fd_checked, fd_kinked, pipe_checks, failed;
} totals;

/* The finite-difference oracle on model md; returns the failures (0 when
 * it holds; -1 when the model cannot be built: a layout the generator drew
 * that the config rejects). */
static int fd_model(rmodel *md, hrng *r, totals *tot)
{
    gp_config c = cfg_of(md, FD_B);
    gp_model m;
    if (gp_model_build(&c, devs[0], &m) != GP_OK) return -1;
    int64_t per = md->in[0] * md->in[1] * md->in[2];
    fd_ctx f = {.m = &m, .x = malloc(FD_B * per * sizeof(float))};
    float y[FD_B];
    f.y = y;
    gpt_make_batch(&c, FD_B, 1, f.x, y);
    grad_set gs;
    grads_collect(&m, f.x, y, &gs);
    int fails = check_split(&gs);
    f.l0 = model_run(&m, f.x, y, 0, &f.base, NULL);
    f.atol = 1e-3 + 100.0 * 0x1p-24 * fabs(f.l0) / 1e-3;
    f.opaque = -1;
    for (int k = 0; k < md->n; k++)
        if (md->sp[k].type == GP_LAYER_RESIDUAL) f.opaque = k;
    for (int q = 0; q < gs.n; q++)
        if (gs.layer[q] > f.opaque || (f.opaque < 0 && gs.layer[q] < 0)) fd_tensor(&f, &gs, q, r);
    CHECK_MSG(f.bad == 0, "%d of %d gradients off the finite differences", f.bad, f.checked);
    tot->fd_checked += f.checked;
    tot->fd_kinked += f.kinked;
    grads_free(&gs);
    free(f.base.b), free(f.kp.b), free(f.km.b), free(f.x);
    gp_model_free(&m);
    return fails + f.bad;
}

/* ---- transparency ---------------------------------------------------------------------- */

typedef struct {
    gp_schedule_kind kind;
    int n, m, ck, lockstep, adam, S;
    float drop;
    int bal[2 * NDEV];
} pipe_set;

static void print_set(const pipe_set *p, FILE *f)
{
    fprintf(f, "schedule %s, %d devices, m %d, checkpoint %d, lockstep %d, dropout %g, %s, "
            "balance", gp_schedule_kind_name(p->kind), p->n, p->m, p->ck, p->lockstep,
            (double)p->drop, p->adam ? "adamw" : "sgd");
    for (int j = 0; j < p->S; j++) fprintf(f, "%c%d", j ? ',' : ' ', p->bal[j]);
    fputc('\n', f);
}

/* S stages at S - 1 distinct random cuts of L layers. */
static void random_cuts(hrng *r, int L, int S, int *bal)
{
    int cuts[2 * NDEV], k = 0;
    while (k < S - 1) {
        int c = 1 + draw(r, L - 1), dup = 0;
        for (int q = 0; q < k; q++) dup |= cuts[q] == c;
        if (!dup) cuts[k++] = c;
    }
    for (int a = 0; a < k; a++)
        for (int b = a + 1; b < k; b++)
            if (cuts[b] < cuts[a]) {
                int t = cuts[a];
                cuts[a] = cuts[b], cuts[b] = t;
            }
    int prev = 0;
    for (int q = 0; q < k; q++) bal[q] = cuts[q] - prev, prev = cuts[q];
    bal[k] = L - prev;
}

static bool draw_set(hrng *r, int L, pipe_set *p)
{
    static const gp_schedule_kind kinds[] = {GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B,
                                             GP_SCHEDULE_ZB_H1, GP_SCHEDULE_ZB_V};
    memset(p, 0, sizeof *p);
    p->kind = kinds[draw(r, 4)];
    int v = gp_schedule_stages_per_device(p->kind, 2);
    if (L < 2 * v) p->kind = GP_SCHEDULE_1F1B, v = 1;
    if (L < 2) return false;
    int most = L / v < NDEV ? L / v : NDEV;
    p->n = 2 + draw(r, most - 1);
    p->S = p->n * v;
    p->m = 1 + draw(r, 4);
    p->ck = draw(r, 3);
    p->lockstep = draw(r, 2);
    p->adam = draw(r, 3) == 0;
    p->drop = draw(r, 3) ? 0.0f : 0.25f;
    random_cuts(r, L, p->S, p->bal);
    return true;
}

/* One device against the pipeline p, two steps; returns whether they
 * differ (-1: the placed build refused, which fails too). */
static int pipe_check(const rmodel *md0, const pipe_set *p)
{
    rmodel md = *md0;
    for (int k = 0; k < md.n; k++)
        if (md.sp[k].type == GP_LAYER_DROPOUT || md.sp[k].type == GP_LAYER_DROPOUT2D)
            md.sp[k].p = p->drop;
    gp_config c = cfg_of(&md, PIPE_B);
    if (p->adam) gpt_set_adam(&c, GP_OPTIM_ADAMW);
    c.pipeline.chunks = p->m;
    c.pipeline.checkpoint = (gp_checkpoint_mode)p->ck;
    c.pipeline.lockstep = p->lockstep;
    c.pipeline.schedule = p->kind;
    c.pipeline.virtual_stages = gp_schedule_stages_per_device(p->kind, 2);
    gp_model ref, pip;
    if (gp_model_build(&c, devs[0], &ref) != GP_OK) return 0; /* (fd_model said so) */
    gp_status st = gp_model_build_placed(&c, devs, p->n, p->bal, &pip);
    CHECK_MSG(st == GP_OK, "placed build: %s", gp_last_error());
    bool same[3] = {false, false, false};
    if (st == GP_OK) {
        gpt_compare_steps(&c, &ref, &pip, PIPE_B, 2, same);
        gp_model_free(&pip);
    }
    gp_model_free(&ref);
    bool ok = same[0] && same[1] && same[2];
    CHECK_MSG(ok, "pipeline against one device: losses %s, gradients %s, weights %s",
              same[0] ? "equal" : "differ", same[1] ? "equal" : "differ",
              same[2] ? "equal" : "differ");
    if (!ok) {
        fprintf(stderr, "  pipeline: ");
        print_set(p, stderr);
    }
    return !ok;
}

/* ---- driving --------------------------------------------------------------------------- */

/* Both oracles on model md, the samples and settings drawn from seed;
 * prints the seed and the model where one fails. */
static void test_model(rmodel *md, uint64_t seed, totals *tot)
{
    hrng r = {seed ^ 0x5bd1e995ull};
    int fails = fd_model(md, &r, tot);
    if (fails < 0) {
        tot->refused++;
        return;
    }
    tot->models++;
    for (int t = 0; t < PIPE_CHECKS; t++) {
        pipe_set p;
        if (!draw_set(&r, md->n, &p)) break;
        tot->pipe_checks++;
        fails += pipe_check(md, &p);
    }
    if (fails) {
        tot->failed++;
        fprintf(stderr, "test_random_models: seed %llu fails; replay: test_random_models run \"",
                (unsigned long long)seed);
        print_model(md, stderr);
        fprintf(stderr, "\" %llu\n", (unsigned long long)seed);
    }
}

static void run_seeds(uint64_t first, int count, totals *tot)
{
    for (int i = 0; i < count; i++) {
        rmodel md;
        gen_model(first + (uint64_t)i, &md);
        test_model(&md, first + (uint64_t)i, tot);
    }
}

static void report(const char *what, const totals *t)
{
    printf("test_random_models: %s: %d models (%d refused by the config), %d gradients against "
           "finite differences (%d draws on a kink drawn again), %d pipelines, %d models failing\n",
           what, t->models, t->refused, t->fd_checked, t->fd_kinked, t->pipe_checks, t->failed);
}

/* The default seeds, 1 .. 200 (about 5 s in Release); under a sanitizer
 * every third of them and k_caught: the seeds that catch the two bugs the
 * random layouts found before this test, with their fixes reverted (seeds
 * 25 and 60 a stash by the layer before an add's pop, 6ad02f3; 99 and 122
 * x + LN(x), 3cffeeb; checkpoint.c, add_stash_grad and fold_target). */
enum { SEEDS = 200 };
static const uint64_t k_caught[] = {25, 60, 99, 122};

static void default_seeds(totals *tot)
{
    bool san = gpt_sanitizer() != GPT_SAN_NONE;
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        bool caught = false;
        for (size_t i = 0; i < sizeof k_caught / sizeof *k_caught; i++)
            caught |= seed == k_caught[i];
        if (!san || caught || seed % 3 == 0) run_seeds(seed, 1, tot);
    }
    if (san) printf("test_random_models: sanitized: every third seed and those of k_caught\n");
    CHECK_MSG(tot->models >= (san ? SEEDS / 4 : SEEDS * 9 / 10), "only %d models built",
              tot->models);
    CHECK_MSG(tot->fd_checked > 20 * tot->models, "only %d finite differences",
              tot->fd_checked);
}

int main(int argc, char **argv)
{
    gpt_open_cpu_devices(devs, NDEV, 1);
    totals tot = {0};
    if (argc >= 3 && !strcmp(argv[1], "run")) {
        rmodel md;
        bool ok = parse_model(argv[2], &md);
        CHECK(ok);
        if (ok) test_model(&md, argc > 3 ? strtoull(argv[3], NULL, 10) : 1, &tot);
        CHECK_MSG(tot.models == 1, "the model was not built: %s", gp_last_error());
        report("run", &tot);
    } else if (argc >= 4 && !strcmp(argv[1], "fuzz")) {
        run_seeds(strtoull(argv[2], NULL, 10), atoi(argv[3]), &tot);
        report("fuzz", &tot);
    } else {
        default_seeds(&tot);
        report("default seeds", &tot);
    }
    for (int j = 0; j < NDEV; j++) gp_device_close(devs[j]);
    return gpt_finish("test_random_models");
}
