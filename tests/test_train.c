/*
 * test_train.c — the learning-rate schedules against hand-computed values,
 * micro-batch sizes, and the single-device step: m micro-batches accumulate
 * the same gradients (and give the same update) as one full batch; with
 * batch norm, whose statistics are per micro-batch, the loss and update of
 * m micro-batches are the mean of each micro-batch's own one-step run;
 * SGD with momentum, Adam and AdamW against a double-precision oracle; and
 * train.precision: bf16 on the CPU.
 */
#include "test_util.h"

#include "gpipe.h"

#include "backend/cpu/cpu_impl.h" /* gp_cpu_isa_has */
#include <oneapi/dnnl/dnnl.h>

static gp_train_config base_cfg(void)
{
    gp_train_config t;
    memset(&t, 0, sizeof t);
    t.batch_size = 64;
    t.base_batch = 64;
    t.optim.lr = 0.1;
    t.sched.gamma = 0.1;
    return t;
}

/* The throughput's windows, on made-up clocks: the first step a window
 * of its own, the steps after it over their own time (not spread over the
 * first's set-up), a half-second window, and the last step closing one. */
static void test_throughput(void)
{
    gp_throughput w = {.start = 100.0, .first = true};
    gp_throughput_add(&w, 4, 100.022, true, false); /* 22 ms: set-up */
    CHECK_NEAR(w.sps, 4 / 0.022, 1e-9, 1e-12);
    gp_throughput_add(&w, 4, 100.0221, false, false);
    CHECK_NEAR(w.sps, 4 / 0.0001, 1e-6, 1e-9);
    gp_throughput_add(&w, 4, 100.0223, false, false); /* 8 in 0.3 ms, not 12 in 22.3 */
    CHECK_NEAR(w.sps, 8 / 0.0003, 1e-6, 1e-9);
    /* a window closes past half a second: its own rate, then held until the
     * next closes */
    gp_throughput_add(&w, 100, 100.6, false, false);
    double closed = w.sps;
    CHECK_NEAR(closed, 108 / (100.6 - 100.022), 1e-6, 1e-9);
    gp_throughput_add(&w, 4, 100.7, false, false);
    CHECK(w.sps == closed && !w.first);
    gp_throughput_add(&w, 4, 100.8, false, true); /* the last step closes it */
    CHECK_NEAR(w.sps, 8 / 0.2, 1e-9, 1e-12);
    /* a resumed run's first step is its first too */
    gp_throughput r = {.start = 5.0, .first = true};
    gp_throughput_add(&r, 2, 6.0, true, false);
    gp_throughput_add(&r, 2, 6.5, false, false);
    CHECK_NEAR(r.sps, 4.0, 1e-12, 1e-12);
    /* an evaluation between steps is not in the window: 2 steps of 0.1 s
     * around 3 s of it are 40 samples/s, not 2.5 */
    gp_throughput e = {.start = 10.0};
    gp_throughput_add(&e, 4, 10.1, false, false);
    gp_throughput_pause(&e, 3.0);
    gp_throughput_add(&e, 4, 13.2, false, true);
    CHECK_NEAR(e.sps, 8 / 0.2, 1e-9, 1e-12);
}

static void test_schedules(void)
{
    gp_train_config t = base_cfg();
    t.sched.kind = GP_SCHED_CONSTANT;
    /* the rate as written, in double (as PyTorch's), not 0.1f's 0.10000000149 */
    CHECK(gp_lr_at(&t, 0, 100) == 0.1 && gp_lr_at(&t, 99, 100) == 0.1);

    /* warm-up 10 steps from 0, step k at (k + 1) / 10 as llm.c and nanoGPT
     * (the first step learns): step 0 -> 0.01, step 4 -> 0.05, step 9 ->
     * 0.1, and on */
    t.sched.warmup_steps = 10;
    CHECK_NEAR(gp_lr_at(&t, 0, 100), 0.01, 1e-7, 0);
    CHECK(gp_lr_at(&t, 0, 100) > 0);
    CHECK_NEAR(gp_lr_at(&t, 4, 100), 0.05, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 9, 100), 0.1, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 10, 100), 0.1, 1e-7, 0);
    t.sched.warmup_start = 0.1; /* from 0.01 to 0.1 */
    CHECK_NEAR(gp_lr_at(&t, 4, 100), 0.01 + 0.09 * 0.5, 1e-7, 0);

    /* step: every 30 steps after warm-up, times 0.1 */
    t.sched.kind = GP_SCHED_STEP;
    t.sched.warmup_steps = 0;
    t.sched.step_size = 30;
    CHECK_NEAR(gp_lr_at(&t, 29, 100), 0.1, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 30, 100), 0.01, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 65, 100), 0.001, 1e-7, 0);
    /* ... counted from the warm-up's end (train.h): with 10 warm-up steps
     * the first decay is at step 40, not 30 */
    t.sched.warmup_steps = 10;
    CHECK_NEAR(gp_lr_at(&t, 39, 100), 0.1, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 40, 100), 0.01, 1e-7, 0);
    t.sched.warmup_steps = 0;

    /* cosine from 0.1 to min 0.0 over 100 steps: halfway is 0.05; a quarter
     * is 0.1 * (1 + cos(pi/4)) / 2 = 0.085355339 */
    t.sched.kind = GP_SCHED_COSINE;
    t.sched.min_lr = 0.0f;
    CHECK_NEAR(gp_lr_at(&t, 0, 100), 0.1, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 50, 100), 0.05, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 25, 100), 0.0853553390593, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 100, 100), 0.0, 1e-7, 0);
    /* clamped past the end (gp_run_step beyond its total_steps): min_lr,
     * not back up the cosine */
    t.sched.min_lr = 0.001;
    CHECK_NEAR(gp_lr_at(&t, 150, 100), 0.001, 1e-9, 0);
    CHECK_NEAR(gp_lr_at(&t, 200, 100), 0.001, 1e-9, 0);
    t.sched.min_lr = 0.0f;
    /* cosine after a 20-step warm-up spans the remaining 80 */
    t.sched.warmup_steps = 20;
    CHECK_NEAR(gp_lr_at(&t, 60, 100), 0.05, 1e-7, 0);

    /* linear scaling: batch 256 of base 64 -> 4x */
    t = base_cfg();
    t.lr_scaling = GP_LR_SCALING_LINEAR;
    t.batch_size = 256;
    CHECK_NEAR(gp_lr_at(&t, 3, 10), 0.4, 1e-7, 0);
    /* ... and it composes with warm-up: halfway through warm-up (step 4 of
     * 10) = 0.2 */
    t.sched.warmup_steps = 10;
    CHECK_NEAR(gp_lr_at(&t, 4, 100), 0.2, 1e-7, 0);
}

static void test_split(void)
{
    int64_t s[8];
    CHECK_OK(gp_microbatch_split(10, 4, s));
    CHECK(s[0] == 3 && s[1] == 3 && s[2] == 2 && s[3] == 2);
    CHECK_OK(gp_microbatch_split(8, 8, s));
    CHECK(s[0] == 1 && s[7] == 1);
    CHECK_OK(gp_microbatch_split(7, 1, s));
    CHECK(s[0] == 7);
    CHECK_ERR(gp_microbatch_split(3, 4, s), GP_ERR_INVALID, "larger than the batch");
    CHECK_ERR(gp_microbatch_split(3, 0, s), GP_ERR_INVALID, "in 1..1024");
}

/* A small model config built in code (no YAML needed). */
static gp_config model_cfg(bool with_bn, bool with_dropout)
{
    static gp_layer_spec layers[8];
    gp_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.path, sizeof c.path, "test");
    int n = 0;
    layers[n] = gp_layer_spec_default(GP_LAYER_CONV2D);
    layers[n].out = 4; layers[n].kernel = gp_hw_square(3); layers[n].padding = gp_hw_square(1); n++;
    if (with_bn) layers[n++] = gp_layer_spec_default(GP_LAYER_BATCHNORM);
    layers[n++] = gp_layer_spec_default(GP_LAYER_RELU);
    layers[n++] = gp_layer_spec_default(GP_LAYER_FLATTEN);
    layers[n] = gp_layer_spec_default(GP_LAYER_LINEAR); layers[n].out = 16; n++;
    if (with_dropout) { layers[n] = gp_layer_spec_default(GP_LAYER_DROPOUT); layers[n].p = 0.3f; n++; }
    layers[n++] = gp_layer_spec_default(GP_LAYER_RELU);
    layers[n] = gp_layer_spec_default(GP_LAYER_LINEAR); layers[n].out = 5; n++;
    c.model.layers = layers;
    c.model.n_layers = n;
    c.model.input[0] = 2; c.model.input[1] = 6; c.model.input[2] = 5;
    c.train.seed = 9;
    c.train.optim.lr = 0.1f;
    c.train.optim.momentum = 0.9f;
    c.train.optim.weight_decay = 1e-3f;
    c.pipeline.chunks = 1;
    return c;
}

/* The device the model tests run on: 2 math threads. */
static gp_device *open_dev(void)
{
    gp_device *dev = NULL;
    gpt_open_cpu_devices(&dev, 1, 2);
    return dev;
}

/* Everything the models and steps held is released (backend workspace
 * caches may stay until the device closes). */
static void check_released(gp_device *dev)
{
    CHECK(dev->alloc.cur_by[GP_MEM_PARAMS] == 0 && dev->alloc.cur_by[GP_MEM_GRADS] == 0 &&
          dev->alloc.cur_by[GP_MEM_OPTIMIZER] == 0 && dev->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0);
}

enum { N = 12, PER = 2 * 6 * 5 };

static void make_data(float *x, float *y)
{
    for (int i = 0; i < N * PER; i++) x[i] = gp_rng_uniform(1, 2, (uint64_t)i) * 2 - 1;
    for (int i = 0; i < N; i++) y[i] = (float)(i % 5);
}

/* m micro-batches vs one batch: same loss and, after 3 steps, the same
 * parameters within float reduction-order tolerance.  Dropout masks are
 * keyed by the sample's position, so they agree too. */
static void test_microbatch_equivalence(bool dropout)
{
    gp_device *dev = open_dev();
    gp_config c = model_cfg(false, dropout);
    float x[N * PER], y[N];
    make_data(x, y);
    int chunks[] = {1, 3, 4};
    float *ref = NULL;
    int64_t nref = 0;
    double ref_loss = 0;
    for (int ci = 0; ci < 3; ci++) {
        gp_model m;
        CHECK_OK(gp_model_build(&c, dev, &m));
        gp_step_stats st = {0};
        double first_loss = 0;
        for (int s = 0; s < 3; s++) {
            CHECK_OK(gp_model_train_step(&m, &c, x, y, N, chunks[ci], 0.05, &st));
            if (s == 0) first_loss = st.loss;
        }
        int64_t n;
        float *p = gpt_gather(&m, GPT_VALUES, &n);
        if (ci == 0) {
            ref = p;
            nref = n;
            ref_loss = first_loss;
            CHECK(isfinite(first_loss) && first_loss > 0);
        } else {
            CHECK_NEAR(first_loss, ref_loss, 1e-6, 1e-5);
            CHECK_MSG(n == nref && n > 0, "chunks=%d: %lld parameters, the full batch's model %lld",
                      chunks[ci], (long long)n, (long long)nref);
            double maxd = n == nref ? 0 : INFINITY;
            for (int64_t i = 0; i < n && n == nref; i++)
                maxd = fmax(maxd, fabs((double)p[i] - ref[i]) / (1e-3 + fabs(ref[i])));
            CHECK_MSG(maxd < 1e-4, "chunks=%d: max relative param difference %g", chunks[ci], maxd);
            free(p);
        }
        gp_model_free(&m);
    }
    free(ref);
    check_released(dev);
    gp_device_close(dev);
}

/* Batch norm normalises each micro-batch with its own statistics, so m
 * micro-batches are not one batch of N but m batches of N / m whose losses
 * and gradients are averaged.  Oracle: one step on each micro-batch alone
 * (chunks = 1, batch N / m) from the same initial parameters.  The chunked
 * step's loss is the mean of theirs; and one SGD step from zero momentum
 * is affine in the gradient (w1 = w0 - lr (g + wd w0), whatever the
 * momentum), so the chunked step's update of the trained parameters is the
 * mean of theirs.  (BN's running statistics are not SGD-updated, so they
 * are left out.)  Updates are compared as vectors, |got - ref| / |ref|:
 * float parameters resolve a small update only to ~1e-6 of it. */
static void test_microbatch_bn(void)
{
    gp_device *dev = open_dev();
    gp_config c = model_cfg(true, false);
    const double lr = 0.05;
    float x[N * PER], y[N];
    make_data(x, y);
    /* the initial parameters, and the full batch's step: that the chunked
     * step differs from it shows micro-batch statistics at work */
    gp_model full;
    gp_step_stats fs = {0};
    CHECK_OK(gp_model_build(&c, dev, &full));
    int64_t n0, nf;
    float *w0 = gpt_gather(&full, GPT_TRAINED, &n0);
    CHECK_OK(gp_model_train_step(&full, &c, x, y, N, 1, lr, &fs));
    float *wf = gpt_gather(&full, GPT_TRAINED, &nf);
    gp_model_free(&full);
    CHECK(n0 == nf && n0 > 0);
    int chunks[] = {2, 3, 4};
    for (int ci = 0; ci < 3; ci++) {
        int mc = chunks[ci], per = N / mc;
        gp_model m;
        gp_step_stats st = {0};
        CHECK_OK(gp_model_build(&c, dev, &m));
        CHECK_OK(gp_model_train_step(&m, &c, x, y, N, mc, lr, &st));
        int64_t n;
        float *p = gpt_gather(&m, GPT_TRAINED, &n);
        gp_model_free(&m);
        /* ref: the mean of the micro-batches' own updates */
        double ref_loss = 0, *ref = calloc((size_t)n0, sizeof *ref);
        bool same_count = n == n0 && nf == n0;
        for (int k = 0; k < mc; k++) {
            gp_model mk;
            gp_step_stats sk = {0};
            CHECK_OK(gp_model_build(&c, dev, &mk));
            CHECK_OK(gp_model_train_step(&mk, &c, x + k * per * PER, y + k * per, per, 1, lr, &sk));
            ref_loss += sk.loss / mc;
            int64_t nk;
            float *pk = gpt_gather(&mk, GPT_TRAINED, &nk);
            same_count = same_count && nk == n0;
            for (int64_t i = 0; i < n0 && nk == n0; i++) ref[i] += ((double)pk[i] - w0[i]) / mc;
            free(pk);
            gp_model_free(&mk);
        }
        CHECK_MSG(same_count, "chunks=%d: parameter counts differ", mc);
        CHECK_NEAR(st.loss, ref_loss, 1e-6, 1e-5);
        double e2 = 0, r2 = 0, f2 = 0;
        for (int64_t i = 0; i < n0 && same_count; i++) {
            double got = (double)p[i] - w0[i], fu = (double)wf[i] - w0[i];
            e2 += (got - ref[i]) * (got - ref[i]);
            f2 += (fu - ref[i]) * (fu - ref[i]);
            r2 += ref[i] * ref[i];
        }
        double err = same_count && r2 > 0 ? sqrt(e2 / r2) : INFINITY, full_err = sqrt(f2 / r2);
        CHECK_MSG(err < 1e-4, "chunks=%d: the update differs by %.3g (relative) from the mean of "
                  "the micro-batches' own updates", mc, err);
        CHECK_MSG(full_err > 1e-2, "chunks=%d: the full batch's update is as close (%.3g): the "
                  "check cannot tell micro-batch statistics from the full batch's", mc, full_err);
        free(p);
        free(ref);
    }
    free(w0);
    free(wf);
    check_released(dev);
    gp_device_close(dev);
}

/* Plain SGD (momentum 0) keeps no state: the model's optimizer holds no
 * bytes on the device and has no momentum tensors, and its steps are the
 * double-precision oracle's w -= lr (g + wd w), from the gradients of the
 * same step (gradients are left in place after a step).  And the first
 * step from zero momentum is the plain step whatever the momentum
 * (v = 0.9 * 0 + g'), so a momentum-0.9 model's first step is bit for bit
 * the stateless one's: the register path and the buffered path compute
 * the same update. */
static void test_plain_sgd(void)
{
    gp_device *dev = open_dev();
    gp_config c = model_cfg(true, true);
    float x[N * PER], y[N];
    make_data(x, y);
    const double lr = 0.05;
    gp_model heavy, plain;
    CHECK_OK(gp_model_build(&c, dev, &heavy));
    size_t with_state = dev->alloc.cur_by[GP_MEM_OPTIMIZER];
    c.train.optim.momentum = 0;
    CHECK_OK(gp_model_build(&c, dev, &plain));
    CHECK_MSG(dev->alloc.cur_by[GP_MEM_OPTIMIZER] == with_state && with_state > 0,
              "plain SGD allocated %zu optimizer bytes (momentum 0.9: %zu)",
              dev->alloc.cur_by[GP_MEM_OPTIMIZER] - with_state, with_state);
    CHECK(!gp_optim_has_state(plain.optim) && gp_optim_has_state(heavy.optim));
    bool none = true;
    for (int k = 0; k < plain.n_layers; k++)
        for (int p = 0; p < plain.layers[k].n_params; p++)
            none = none && !gp_optim_state(plain.optim, k, p, 0);
    CHECK_MSG(none, "plain SGD returned a momentum tensor");
    gp_config ch = c;
    ch.train.optim.momentum = 0.9f;
    CHECK_OK(gp_model_train_step(&heavy, &ch, x, y, N, 2, lr, NULL));
    for (int step = 0; step < 3; step++) {
        int64_t n0, ng, n1;
        float *w0 = gpt_gather(&plain, GPT_TRAINED, &n0);
        CHECK_OK(gp_model_train_step(&plain, &c, x, y, N, 2, lr, NULL));
        float *g = gpt_gather(&plain, GPT_TRAINED_GRADS, &ng);
        float *w1 = gpt_gather(&plain, GPT_TRAINED, &n1);
        if (step == 0) { /* the first step equals momentum's, bit for bit */
            int64_t nh;
            float *wh = gpt_gather(&heavy, GPT_TRAINED, &nh);
            CHECK(nh == n1 && !memcmp(wh, w1, (size_t)n1 * sizeof *w1));
            free(wh);
        }
        /* w1 = w0 - lr (g + wd w0), wd 0 for biases and norms: at least
         * every parameter is one of the two updates, and some moved */
        double worst = 0;
        int64_t moved = 0;
        for (int64_t i = 0; i < n1 && n0 == n1 && ng == n1; i++) {
            double plain_w = w0[i] - (double)(float)lr * g[i];
            double decayed = w0[i] - (double)(float)lr * (g[i] + (double)c.train.optim.weight_decay * w0[i]);
            double d = fmin(fabs(w1[i] - plain_w), fabs(w1[i] - decayed)) / fmax(fabs(w0[i]), 1e-2);
            worst = fmax(worst, d);
            moved += w1[i] != w0[i];
        }
        CHECK_MSG(n0 == n1 && ng == n1 && worst < 1e-6 && moved > n1 / 2,
                  "step %d: plain SGD off the oracle by %g (relative), %lld of %lld moved", step,
                  worst, (long long)moved, (long long)n1);
        free(w0); free(g); free(w1);
    }
    gp_model_free(&heavy);
    gp_model_free(&plain);
    check_released(dev);
    gp_device_close(dev);
}

/* SGD with momentum (plain and Nesterov), Adam and AdamW through the
 * model's optimizer against optim.h's formulas in double precision, four
 * steps from zero state: SGD's v = mu v + g', w -= lr (Nesterov: g' +
 * mu v; else v), g' = g + wd w; Adam's t the 1-based step in both bias
 * corrections, its decay added to the gradient and AdamW's applied to the
 * weight (w *= 1 - lr wd); no decay for biases and norm parameters unless
 * decay_bias_and_norm.  The step's gradients are left in place, so each
 * step is checked from its own w and g.  test_backend checks the kernels
 * against these formulas with given constants; this checks the constants
 * and switches the optimizer gives them. */
static void test_optimizers(void)
{
    gp_device *dev = open_dev();
    float x[N * PER], y[N];
    make_data(x, y);
    const double lr = 0.01;
    const struct {
        gp_optim_kind kind;
        bool all;      /* decay_bias_and_norm */
        bool nesterov; /* SGD */
    } cases[] = {{GP_OPTIM_SGD, false, false}, {GP_OPTIM_SGD, false, true},
                 {GP_OPTIM_ADAM, false, false}, {GP_OPTIM_ADAMW, false, false},
                 {GP_OPTIM_ADAMW, true, false}};
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        gp_config c = model_cfg(true, false);
        gp_optim_config *o = &c.train.optim;
        bool sgd = cases[q].kind == GP_OPTIM_SGD;
        o->kind = cases[q].kind;
        o->momentum = sgd ? 0.9f : 0.0f;
        o->nesterov = cases[q].nesterov;
        o->beta1 = 0.8f;
        o->beta2 = 0.95f;
        o->eps = 1e-6f;
        o->weight_decay = 0.1f;
        o->decay_bias_and_norm = cases[q].all;
        gp_model m;
        CHECK_OK(gp_model_build(&c, dev, &m));
        int64_t n = 0, exempt = 0;
        for (int k = 0; k < m.n_layers; k++)
            for (int p = 0; p < m.layers[k].n_params; p++) {
                const gp_param *pr = &m.layers[k].params[p];
                n += pr->is_buffer ? 0 : gp_tensor_numel(&pr->value);
            }
        /* each value's decay, in gpt_gather's order */
        double *wd = calloc((size_t)n, sizeof *wd), *mom = calloc((size_t)n, sizeof *mom);
        double *var = calloc((size_t)n, sizeof *var);
        int64_t off = 0;
        for (int k = 0; k < m.n_layers; k++)
            for (int p = 0; p < m.layers[k].n_params; p++) {
                const gp_param *pr = &m.layers[k].params[p];
                if (pr->is_buffer) continue;
                for (int64_t i = 0; i < gp_tensor_numel(&pr->value); i++, off++) {
                    wd[off] = pr->no_decay && !cases[q].all ? 0.0 : (double)o->weight_decay;
                    exempt += wd[off] == 0.0;
                }
            }
        CHECK(cases[q].all ? exempt == 0 : exempt > 0 && exempt < n);
        double b1 = o->beta1, b2 = o->beta2, eps = o->eps, lrf = (float)lr, mu = o->momentum;
        for (int t = 1; t <= 4; t++) {
            int64_t n0, ng, n1;
            float *w0 = gpt_gather(&m, GPT_TRAINED, &n0);
            CHECK_OK(gp_model_train_step(&m, &c, x, y, N, 2, lr, NULL));
            float *g = gpt_gather(&m, GPT_TRAINED_GRADS, &ng);
            float *w1 = gpt_gather(&m, GPT_TRAINED, &n1);
            double worst = 0;
            int64_t moved = 0;
            for (int64_t i = 0; i < n && n0 == n && ng == n && n1 == n; i++) {
                double w = w0[i], gi = g[i], want;
                if (cases[q].kind == GP_OPTIM_ADAMW) w *= 1.0 - lrf * wd[i];
                else gi += wd[i] * w;
                if (sgd) { /* (mom: the momentum) */
                    mom[i] = mu * mom[i] + gi;
                    want = w - lrf * (cases[q].nesterov ? gi + mu * mom[i] : mom[i]);
                } else {
                    mom[i] = b1 * mom[i] + (1.0 - b1) * gi;
                    var[i] = b2 * var[i] + (1.0 - b2) * gi * gi;
                    want = w - lrf / (1.0 - pow(b1, t)) * mom[i] /
                                   (sqrt(var[i]) / sqrt(1.0 - pow(b2, t)) + eps);
                }
                worst = fmax(worst, fabs(w1[i] - want) / fmax(fabs((double)w0[i]), 1e-2));
                moved += w1[i] != w0[i];
            }
            CHECK_MSG(n0 == n && ng == n && n1 == n && worst < 1e-5 && moved > n / 2,
                      "%s%s step %d: off the oracle by %g (relative), %lld of %lld moved",
                      sgd ? (cases[q].nesterov ? "sgd nesterov" : "sgd")
                      : cases[q].kind == GP_OPTIM_ADAMW ? "adamw" : "adam",
                      cases[q].all ? " (decay_bias_and_norm)" : "", t, worst, (long long)moved,
                      (long long)n);
            free(w0);
            free(g);
            free(w1);
        }
        free(wd);
        free(mom);
        free(var);
        gp_model_free(&m);
    }
    check_released(dev);
    gp_device_close(dev);
}

/* train.precision: bf16 (backend.h, gp_precision) through the library, on
 * a 2-stage pipeline of convolutions: where the processor has bf16
 * instructions, 8 steps on the same batches as the fp32 run give losses
 * within 2% of its, not equal to them (the bf16 kernels ran), and falling;
 * without them, preparing the run fails with what to do instead. */
static void test_bf16_training(void)
{
    static const char *yaml =
        "model:\n  input: [3, 16, 16]\n  layers:\n"
        "    - conv2d: {out: 16, kernel: 3, padding: 1}\n    - batchnorm\n    - relu\n"
        "    - conv2d: {out: 32, kernel: 3, padding: 1}\n    - relu\n    - maxpool2d: {kernel: 2}\n"
        "    - conv2d: {out: 32, kernel: 3, padding: 1}\n    - relu\n    - flatten\n"
        "    - linear: {out: 10}\n"
        "data: {dataset: synthetic, synthetic: {train: 64, test: 16, classes: 10}}\n"
        "train: {batch_size: 32, seed: 5, optimizer: {lr: 0.05, momentum: 0.9}}\n"
        "pipeline: {devices: [cpu:0, cpu:1], threads: 1, chunks: 2}\n";
    enum { B = 32, STEPS = 8, NPIX = 3 * 16 * 16 };
    float *x = malloc(sizeof(float) * B * NPIX), y[B];
    uint64_t r = 99;
    for (int i = 0; i < B * NPIX; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((r >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    for (int i = 0; i < B; i++) y[i] = (float)(i % 10);
    double loss[2][STEPS];
    bool native = gp_cpu_isa_has(dnnl_cpu_isa_avx512_core_bf16); /* GPIPE_CPU_ISA's */
    for (int pr = 0; pr < 2; pr++) {
        const char *set = pr ? "train.precision=bf16" : "train.precision=fp32";
        gp_status st = gpt_run_losses(yaml, &set, 1, x, y, B, STEPS, loss[pr]);
        if (pr && !native) {
            CHECK(st == GP_ERR_UNSUPPORTED);
            CHECK_MSG(strstr(gp_last_error(), "avx512_bf16") && strstr(gp_last_error(), "fp32"),
                      "%s", gp_last_error());
            gp_error_clear();
            printf("test_train: no bf16 instructions here: bf16 refused (checked)\n");
            break;
        }
        CHECK_OK(st);
        if (pr && st == GP_OK) {
            bool same = true;
            for (int k = 0; k < STEPS; k++) {
                same &= loss[1][k] == loss[0][k];
                CHECK_NEAR(loss[1][k], loss[0][k], 0, 2e-2);
            }
            CHECK_MSG(!same, "bf16 losses equal the fp32 ones: bf16 did not run");
            CHECK(loss[1][STEPS - 1] < loss[1][0]);
        }
    }
    free(x);
}

int main(void)
{
    test_schedules();
    test_throughput();
    test_split();
    test_microbatch_equivalence(false);
    test_microbatch_equivalence(true);
    test_microbatch_bn();
    test_plain_sgd();
    test_optimizers();
    test_bf16_training();
    return gpt_finish("test_train");
}
