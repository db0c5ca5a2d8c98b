/*
 * test_train.c — the learning-rate schedules against hand-computed values,
 * micro-batch sizes, and the single-device step: m micro-batches accumulate
 * the same gradients (and give the same update) as one full batch.
 */
#include "train/train.h"
#include "test.h"

static gp_train_config base_cfg(void)
{
    gp_train_config t;
    memset(&t, 0, sizeof t);
    t.batch_size = 64;
    t.base_batch = 64;
    t.optim.lr = 0.1f;
    t.sched.gamma = 0.1f;
    return t;
}

static void test_schedules(void)
{
    gp_train_config t = base_cfg();
    t.sched.kind = GP_SCHED_CONSTANT;
    CHECK_NEAR(gp_lr_at(&t, 0, 100), 0.1, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 99, 100), 0.1, 1e-7, 0);

    /* warm-up 10 steps from 0: step 0 -> 0, step 5 -> 0.05, step 10 -> 0.1 */
    t.sched.warmup_steps = 10;
    CHECK_NEAR(gp_lr_at(&t, 0, 100), 0.0, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 5, 100), 0.05, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 10, 100), 0.1, 1e-7, 0);
    t.sched.warmup_start = 0.1f; /* from 0.01 to 0.1 */
    CHECK_NEAR(gp_lr_at(&t, 5, 100), 0.01 + 0.09 * 0.5, 1e-7, 0);

    /* step: every 30 steps after warm-up, times 0.1 */
    t.sched.kind = GP_SCHED_STEP;
    t.sched.warmup_steps = 0;
    t.sched.step_size = 30;
    CHECK_NEAR(gp_lr_at(&t, 29, 100), 0.1, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 30, 100), 0.01, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 65, 100), 0.001, 1e-7, 0);

    /* cosine from 0.1 to min 0.0 over 100 steps: halfway is 0.05; a quarter
     * is 0.1 * (1 + cos(pi/4)) / 2 = 0.085355339 */
    t.sched.kind = GP_SCHED_COSINE;
    t.sched.min_lr = 0.0f;
    CHECK_NEAR(gp_lr_at(&t, 0, 100), 0.1, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 50, 100), 0.05, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 25, 100), 0.0853553390593, 1e-7, 0);
    CHECK_NEAR(gp_lr_at(&t, 100, 100), 0.0, 1e-7, 0);
    /* cosine after a 20-step warm-up spans the remaining 80 */
    t.sched.warmup_steps = 20;
    CHECK_NEAR(gp_lr_at(&t, 60, 100), 0.05, 1e-7, 0);

    /* linear scaling: batch 256 of base 64 -> 4x */
    t = base_cfg();
    t.lr_scaling = GP_LR_SCALING_LINEAR;
    t.batch_size = 256;
    CHECK_NEAR(gp_lr_at(&t, 3, 10), 0.4, 1e-7, 0);
    /* ... and it composes with warm-up: halfway through warm-up = 0.2 */
    t.sched.warmup_steps = 10;
    CHECK_NEAR(gp_lr_at(&t, 5, 100), 0.2, 1e-7, 0);
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
    layers[n].out = 4; layers[n].kernel = 3; layers[n].padding = 1; n++;
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

/* Parameters of a model as one host vector. */
static float *params_host(gp_model *m, int64_t *n_out)
{
    int64_t n = 0;
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params; p++) n += gp_tensor_numel(&m->layers[k].params[p].value);
    float *h = malloc((size_t)n * sizeof *h);
    int64_t off = 0;
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params; p++) {
            gp_tensor *t = &m->layers[k].params[p].value;
            gp_dev_download(m->dev, h + off, t->data, gp_tensor_numel(t));
            off += gp_tensor_numel(t);
        }
    *n_out = n;
    return h;
}

/* m micro-batches vs one batch: same loss and, after 3 steps, the same
 * parameters within float reduction-order tolerance.  Dropout masks are
 * keyed by the sample's position, so they agree too. */
static void test_microbatch_equivalence(bool bn, bool dropout)
{
    gp_device_opts o = {.threads = 2};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_device_bind_thread(dev);
    gp_config c = model_cfg(bn, dropout);
    enum { N = 12 };
    float x[N * 60], y[N];
    for (int i = 0; i < N * 60; i++) x[i] = gp_rng_uniform(1, 2, (uint64_t)i) * 2 - 1;
    for (int i = 0; i < N; i++) y[i] = (float)(i % 5);
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
        float *p = params_host(&m, &n);
        if (ci == 0) {
            ref = p;
            nref = n;
            ref_loss = first_loss;
            CHECK(isfinite(first_loss) && first_loss > 0);
        } else {
            /* BN normalises with micro-batch statistics, so only the
             * no-BN model is expected to match the full batch. */
            if (!bn) {
                CHECK_NEAR(first_loss, ref_loss, 1e-6, 1e-5);
                double maxd = 0;
                for (int64_t i = 0; i < n && n == nref; i++)
                    maxd = fmax(maxd, fabs((double)p[i] - ref[i]) / (1e-3 + fabs(ref[i])));
                CHECK_MSG(maxd < 1e-4, "chunks=%d: max relative param difference %g", chunks[ci], maxd);
            } else {
                CHECK(isfinite(first_loss));
            }
            free(p);
        }
        gp_model_free(&m);
    }
    free(ref);
    /* everything the models and steps held is released (backend workspace
     * caches may stay until the device closes) */
    CHECK(dev->alloc.cur_by[GP_MEM_PARAMS] == 0 && dev->alloc.cur_by[GP_MEM_GRADS] == 0 &&
          dev->alloc.cur_by[GP_MEM_OPTIMIZER] == 0 && dev->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0);
    gp_device_close(dev);
}

int main(void)
{
    test_schedules();
    test_split();
    test_microbatch_equivalence(false, false);
    test_microbatch_equivalence(false, true);
    test_microbatch_equivalence(true, false);
    return gpt_finish("test_train");
}
