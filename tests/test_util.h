/*
 * test_util.h — helpers the model-level test programs share, so that the
 * pipeline, replica and training tests build their models, batches and
 * oracles the same way and a fix to a helper reaches all of them.
 *
 *   gpt_open_cpu_devices  cpu:0..count-1, the caller closes them
 *   gpt_model_cfg         the small MLP and convnet the pipeline tests train
 *   gpt_make_batch        a deterministic batch per step
 *   gpt_gather            a model's parameters (or gradients) on the host
 *   gpt_split_even        layers per stage, as even as can be
 *
 * Everything is static inline (a program uses what it needs, unused ones
 * cost nothing and warn about nothing).  Include it instead of test.h, in
 * one .c file per test program, like test.h.  Memory: gpt_gather returns a
 * malloc'ed array the caller frees; gpt_model_cfg's config points into the
 * caller's spec array.  Not thread-safe: CHECK's counters are plain ints.
 */
#ifndef GP_TEST_UTIL_H
#define GP_TEST_UTIL_H

#include "train/train.h"
#include "test.h"

/* Opens cpu:0..count-1 into devs, each with `threads` math threads, and
 * binds the calling thread to devs[0]. */
static inline void gpt_open_cpu_devices(gp_device **devs, int count, int threads)
{
    gp_device_opts o = {.threads = threads};
    char name[16];
    for (int j = 0; j < count; j++) {
        snprintf(name, sizeof name, "cpu:%d", j);
        CHECK_OK(gp_device_open(name, &o, &devs[j]));
    }
    if (count > 0) gp_device_bind_thread(devs[0]);
}

enum { GPT_MAX_SPECS = 16 };

/* The two small models, written into specs[0..GPT_MAX_SPECS), which the
 * returned config points to (so specs must outlive it, and a test may edit
 * a layer through it):
 *   mlp (1, 4, 4):     flatten, linear 12, relu, dropout 0.3, linear 10,
 *                      relu, linear 5
 *   convnet (2, 6, 6): conv 4 (3x3, pad 1), batchnorm, relu, maxpool 2,
 *                      conv 6 (3x3, pad 1), batchnorm, relu, flatten,
 *                      linear 5
 * Batch norms synchronise across replicas when sync_bn.  Seed 3, SGD with
 * lr 0.05, momentum 0.9, weight decay 1e-3; 1 chunk, lockstep, checkpoint
 * mode 0 (always). */
static inline gp_config gpt_model_cfg(gp_layer_spec *specs, bool convnet, bool sync_bn,
                                      int64_t batch)
{
    gp_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.path, sizeof c.path, "test");
    int n = 0;
    if (convnet) {
        specs[n] = gp_layer_spec_default(GP_LAYER_CONV2D);
        specs[n].out = 4; specs[n].kernel = 3; specs[n].padding = 1; n++;
        specs[n] = gp_layer_spec_default(GP_LAYER_BATCHNORM); specs[n].sync = sync_bn; n++;
        specs[n++] = gp_layer_spec_default(GP_LAYER_RELU);
        specs[n] = gp_layer_spec_default(GP_LAYER_MAXPOOL2D);
        specs[n].kernel = 2; specs[n].stride = 2; n++;
        specs[n] = gp_layer_spec_default(GP_LAYER_CONV2D);
        specs[n].out = 6; specs[n].kernel = 3; specs[n].padding = 1; n++;
        specs[n] = gp_layer_spec_default(GP_LAYER_BATCHNORM); specs[n].sync = sync_bn; n++;
        specs[n++] = gp_layer_spec_default(GP_LAYER_RELU);
        specs[n++] = gp_layer_spec_default(GP_LAYER_FLATTEN);
        specs[n] = gp_layer_spec_default(GP_LAYER_LINEAR); specs[n].out = 5; n++;
        c.model.input[0] = 2; c.model.input[1] = 6; c.model.input[2] = 6;
    } else {
        specs[n++] = gp_layer_spec_default(GP_LAYER_FLATTEN);
        specs[n] = gp_layer_spec_default(GP_LAYER_LINEAR); specs[n].out = 12; n++;
        specs[n++] = gp_layer_spec_default(GP_LAYER_RELU);
        specs[n] = gp_layer_spec_default(GP_LAYER_DROPOUT); specs[n].p = 0.3f; n++;
        specs[n] = gp_layer_spec_default(GP_LAYER_LINEAR); specs[n].out = 10; n++;
        specs[n++] = gp_layer_spec_default(GP_LAYER_RELU);
        specs[n] = gp_layer_spec_default(GP_LAYER_LINEAR); specs[n].out = 5; n++;
        c.model.input[0] = 1; c.model.input[1] = 4; c.model.input[2] = 4;
    }
    c.model.layers = specs;
    c.model.n_layers = n;
    c.train.seed = 3;
    c.train.batch_size = batch;
    c.train.optim.lr = 0.05f;
    c.train.optim.momentum = 0.9f;
    c.train.optim.weight_decay = 1e-3f;
    c.pipeline.chunks = 1;
    c.pipeline.lockstep = true;
    return c;
}

/* Batch `step` for c's input shape: x (batch, C, H, W) uniform in [-1, 1)
 * from the counter-based RNG (stream 11, counter step), labels
 * (7 i + step) mod 5. */
static inline void gpt_make_batch(const gp_config *c, int64_t batch, int step, float *x, float *y)
{
    int64_t per = c->model.input[0] * c->model.input[1] * c->model.input[2];
    gp_rng_uniform_fill(11, (uint64_t)step, 0, x, batch * per);
    for (int64_t q = 0; q < batch * per; q++) x[q] = x[q] * 2 - 1;
    for (int64_t i = 0; i < batch; i++) y[i] = (float)((i * 7 + step) % 5);
}

typedef enum {
    GPT_VALUES,  /* every parameter's value, buffers (BN running statistics) included */
    GPT_GRADS,   /* every parameter's gradient; zeros where there is none (buffers) */
    GPT_TRAINED, /* the values of trained parameters only, buffers left out */
} gpt_gather_what;

/* What `what` names, for every layer and parameter in order, flattened into
 * a new host array of *count floats (at least one allocated); each tensor is
 * read from the device it lives on. */
static inline float *gpt_gather(gp_model *m, gpt_gather_what what, int64_t *count)
{
    int64_t n = 0;
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params; p++) {
            gp_param *pr = &m->layers[k].params[p];
            if (what == GPT_TRAINED && pr->is_buffer) continue;
            n += gp_tensor_numel(&pr->value);
        }
    float *h = calloc((size_t)(n ? n : 1), sizeof *h);
    int64_t off = 0;
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params; p++) {
            gp_param *pr = &m->layers[k].params[p];
            if (what == GPT_TRAINED && pr->is_buffer) continue;
            gp_tensor *t = what == GPT_GRADS ? &pr->grad : &pr->value;
            int64_t c = gp_tensor_numel(&pr->value);
            if (t->data) gp_dev_download(t->dev, h + off, t->data, c);
            off += c;
        }
    *count = n;
    return h;
}

/* L layers over n stages: the first L % n stages get one more. */
static inline void gpt_split_even(int L, int n, int *bal)
{
    for (int j = 0; j < n; j++) bal[j] = L / n + (j < L % n ? 1 : 0);
}

#endif /* GP_TEST_UTIL_H */
