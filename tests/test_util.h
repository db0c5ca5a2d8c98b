/*
 * test_util.h — helpers that several test programs share, written once so
 * that the pipeline, replica and training tests build their models,
 * batches and oracles the same way and a fix to a helper reaches them all.
 *
 *   gpt_open_cpu_devices  cpu:0..count-1, the caller closes them
 *   gpt_model_cfg         the small MLP and convnet the pipeline tests train
 *   gpt_make_batch        a deterministic batch per step
 *   gpt_make_tokens       a deterministic batch of token ids and targets per step
 *   gpt_counting_tokens   token sequences that count, and their next tokens
 *   gpt_make_masks        0 / 1 targets for binary cross-entropy
 *   gpt_gather            a model's parameters (or gradients) on the host
 *   gpt_same_tensor       whether two tensors hold the same values, bit for bit
 *   gpt_param_diff        the largest relative difference of two models' parameters
 *   gpt_set_schedule      a schedule, its stages per device and an even split
 *   gpt_split_even        layers per stage, as even as can be
 *   gpt_bn_moments        the naive reference for batch norm's statistics
 *   gpt_binary_path       where the build put a program (gpipe-train)
 *   gpt_make_tmpdir       a private scratch directory under /tmp
 *   gpt_read_file         (test.h) a whole file into memory, '\0'-terminated
 *   gpt_same_files        whether two files hold the same bytes
 *   gpt_write_file        bytes into a file
 *   gpt_run_cmd           a shell command's exit status and output
 *   gpt_metrics_records   a --metrics file without its timing fields, to compare runs
 *   gpt_run_losses        the losses of a few steps of a run from a config text
 *
 * Everything is static inline (a program uses what it needs; the rest
 * costs nothing and warns about nothing).  Include it instead of test.h,
 * in one .c file per test program, like test.h.  Memory: gpt_gather,
 * gpt_read_file and gpt_metrics_records return malloc'ed memory the caller
 * frees; gpt_model_cfg's config points into the caller's spec array.  Not
 * thread-safe: CHECK's counters are plain ints.
 */
#ifndef GP_TEST_UTIL_H
#define GP_TEST_UTIL_H

#include "backend/elementwise.h"
#include "gpipe.h"
#include "train/train.h"
#include "test.h"

#include <sys/wait.h>

/* Most parameters of one layer a test keeps host copies of (an AmoebaNet
 * cell has about 70). */
#define GPT_MAX_PARAMS 128

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
        specs[n].out = 4; specs[n].kernel = gp_hw_square(3);
        specs[n].padding = gp_hw_square(1); n++;
        specs[n] = gp_layer_spec_default(GP_LAYER_BATCHNORM); specs[n].sync = sync_bn; n++;
        specs[n++] = gp_layer_spec_default(GP_LAYER_RELU);
        specs[n] = gp_layer_spec_default(GP_LAYER_MAXPOOL2D);
        specs[n].kernel = gp_hw_square(2); specs[n].stride = gp_hw_square(2); n++;
        specs[n] = gp_layer_spec_default(GP_LAYER_CONV2D);
        specs[n].out = 6; specs[n].kernel = gp_hw_square(3);
        specs[n].padding = gp_hw_square(1); n++;
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

/* `rows` token sequences of length T over a vocabulary of V that count,
 * a, a + d, a + 2d, ... (mod V), into x, and each position's next token
 * into y: a pattern a language model learns in a few steps; a and d (1 to
 * 3) drawn from `seed`. */
static inline void gpt_counting_tokens(unsigned seed, int rows, int T, int V, float *x, float *y)
{
    for (int i = 0; i < rows; i++) {
        int a = (int)(rand_r(&seed) % (unsigned)V), d = 1 + (int)(rand_r(&seed) % 3);
        for (int p = 0; p < T; p++) {
            x[i * T + p] = (float)((a + d * p) % V);
            y[i * T + p] = (float)((a + d * (p + 1)) % V);
        }
    }
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

/* Batch `step` for a language model m (its first layer an embedding):
 * x (batch, T) token ids below the embedding's real rows, y (batch, T)
 * next-token targets below the loss's classes, each uniform from the
 * counter-based RNG (streams 13 and 14, counter step). */
static inline void gpt_make_tokens(const gp_model *m, int64_t batch, int step, float *x, float *y)
{
    const gp_layer_spec *e = &m->layers[0].spec;
    int64_t n = batch * m->targets, ids = gp_layer_spec_valid_rows(e, e->vocab);
    int64_t classes = m->classes > 0 ? m->classes : m->output.dims[m->output.ndim - 1];
    gp_rng_uniform_fill(13, (uint64_t)step, 0, x, n);
    gp_rng_uniform_fill(14, (uint64_t)step, 0, y, n);
    for (int64_t q = 0; q < n; q++) { /* (u < 1: in double, the product stays below) */
        x[q] = (float)(int64_t)((double)x[q] * (double)ids);
        y[q] = (float)(int64_t)((double)y[q] * (double)classes);
    }
}

/* Binary cross-entropy's targets: n values 0 or 1 from the counter-based
 * RNG (stream 12, counter step), one per output element of the batch. */
static inline void gpt_make_masks(int64_t n, int step, float *y)
{
    gp_rng_uniform_fill(12, (uint64_t)step, 0, y, n);
    for (int64_t q = 0; q < n; q++) y[q] = y[q] < 0.5f ? 0.0f : 1.0f;
}

typedef enum {
    GPT_VALUES,  /* every parameter's value, buffers (BN running statistics) included */
    GPT_GRADS,   /* every parameter's gradient; zeros where there is none (buffers) */
    GPT_TRAINED, /* the values of trained parameters only, buffers left out */
    GPT_TRAINED_GRADS, /* their gradients, buffers left out */
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
            if ((what == GPT_TRAINED || what == GPT_TRAINED_GRADS) && pr->is_buffer) continue;
            n += gp_tensor_numel(&pr->value);
        }
    float *h = calloc((size_t)(n ? n : 1), sizeof *h);
    int64_t off = 0;
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params; p++) {
            gp_param *pr = &m->layers[k].params[p];
            if ((what == GPT_TRAINED || what == GPT_TRAINED_GRADS) && pr->is_buffer) continue;
            gp_tensor *t = what == GPT_GRADS || what == GPT_TRAINED_GRADS ? &pr->grad : &pr->value;
            int64_t c = gp_tensor_numel(&pr->value);
            if (gp_tensor_mem(t)) CHECK_OK(gp_dev_download(t->dev, h + off, gp_f32(t), c));
            off += c;
        }
    *count = n;
    return h;
}

/* The largest difference of two models' parameter values, relative to
 * ref's with a floor of 1e-2: max |a - b| / max(|a|, 1e-2).  *same_count
 * says whether both have as many values (nothing is compared otherwise:
 * 0 is returned). */
static inline double gpt_param_diff(gp_model *ref, gp_model *other, bool *same_count)
{
    int64_t na, nb;
    float *pa = gpt_gather(ref, GPT_VALUES, &na), *pb = gpt_gather(other, GPT_VALUES, &nb);
    double worst = 0;
    *same_count = pa && pb && na == nb;
    for (int64_t q = 0; *same_count && q < na; q++)
        worst = fmax(worst, fabs((double)pa[q] - pb[q]) / fmax(fabs((double)pa[q]), 1e-2));
    free(pa);
    free(pb);
    return worst;
}

/* Whether two models' parameter values, buffers (batch-norm running
 * statistics) included, are equal bit for bit. */
static inline bool gpt_same_values(gp_model *a, gp_model *b)
{
    int64_t na, nb;
    float *pa = gpt_gather(a, GPT_VALUES, &na), *pb = gpt_gather(b, GPT_VALUES, &nb);
    bool same = pa && pb && na == nb && !memcmp(pa, pb, (size_t)na * sizeof *pa);
    free(pa);
    free(pb);
    return same;
}

/* A new tensor of shape s on dev (category ACTIVATIONS) holding h. */
static inline gp_tensor gpt_upload(gp_device *dev, const gp_shape *s, const float *h)
{
    gp_tensor t;
    CHECK_OK(gp_tensor_alloc(&t, dev, s, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&t), h, gp_shape_numel(s)));
    return t;
}

/* t's values in a new host array (at least one element allocated). */
static inline float *gpt_download(const gp_tensor *t)
{
    int64_t n = gp_tensor_numel(t);
    float *h = calloc((size_t)(n ? n : 1), sizeof *h);
    if (n) CHECK_OK(gp_dev_download(t->dev, h, gp_f32(t), n));
    CHECK_OK(gp_dev_synchronize(t->dev));
    return h;
}

/* Whether a and b hold the same values, bit for bit. */
static inline bool gpt_same_tensor(const gp_tensor *a, const gp_tensor *b)
{
    float *ha = gpt_download(a), *hb = gpt_download(b);
    bool same = gp_tensor_numel(a) == gp_tensor_numel(b) &&
                !memcmp(ha, hb, (size_t)gp_tensor_numel(a) * sizeof *ha);
    free(ha);
    free(hb);
    return same;
}

/* ---- the oracle of copies in bfloat16 ------------------------------------ */

/* A new tensor on dev holding t's values rounded to bfloat16 (to nearest
 * even: gp_ew_bf16_bits, which test_backend checks against a reference by
 * distance): what a copy in bf16 delivers. */
static inline gp_tensor gpt_bf16_copy(gp_device *dev, const gp_tensor *t)
{
    gp_shape sh = gp_tensor_shape(t);
    float *h = gpt_download(t);
    for (int64_t q = 0; q < gp_shape_numel(&sh); q++) h[q] = gp_ew_bf16_value(gp_ew_bf16_bits(h[q]));
    gp_tensor r = gpt_upload(dev, &sh, h);
    free(h);
    return r;
}

/* ---- the oracle of copies in bfloat16 ------------------------------------ */

/* What a pipeline whose copies travel in bf16 (pipeline.copy_precision)
 * computes, without a pipeline: gp_model_train_step's order on one device
 * (every forward, then the backwards in the schedule's order, in halves
 * where it splits them, then commit and update with lr 0.05) with the
 * model cut into the S stages of bal, and every tensor that crosses a cut
 * rounded to bf16 on the way: a stage's output before the next stage reads
 * it, a stage's input gradient before the stage before it does, a skip
 * stashed in one stage and popped in a later one (copied straight across,
 * once) and its gradient back.  A skip inside a stage is not rounded.
 * Tied weights summed and synced as gp_model_train_step does; *out as
 * its. */
static inline gp_status gpt_rounded_step(gp_model *m, const gp_config *c, const float *x,
                                         const float *y, int64_t n, const int *bal, int S,
                                         gp_step_stats *out)
{
    enum { MAXS = 16 };
    int chunks = c->pipeline.chunks, L = m->n_layers, bad = -1;
    int first[MAXS], stage_of[512];
    GP_ASSERT(S <= MAXS && L <= 512);
    for (int j = 0, f = 0; j < S; f += bal[j++]) {
        first[j] = f;
        for (int k = f; k < f + bal[j]; k++) stage_of[k] = j;
    }
    int64_t sizes[GP_MAX_CHUNKS], off[GP_MAX_CHUNKS];
    GP_TRY(gp_microbatch_split(n, chunks, sizes));
    for (int k = 0; k < L; k++) gp_layer_grads_begin(&m->layers[k]);
    gp_stash(*st)[MAXS] = calloc((size_t)chunks, sizeof *st);
    gp_tensor *dy = calloc((size_t)chunks, sizeof *dy);
    if (!st || !dy) return gp_error_set(GP_ERR_OOM, "out of host memory");
    const gp_skip_map *sk = &m->skips;
    int ft = gp_layers_first_trainable(m->layers, L);
    int64_t per = gp_shape_numel(&m->input);
    double sum = 0;
    int64_t correct = 0, count = 0;
    gp_status s = GP_OK;
    for (int i = 0, at = 0; i < chunks && s == GP_OK; at += (int)sizes[i++]) {
        off[i] = at;
        gp_fwd_ctx ctx = {.training = true, .seed = c->train.seed, .step = (uint64_t)m->step,
                          .sample_offset = at, .batch_total = n};
        for (int j = 0; j < S && s == GP_OK; j++) s = gp_stash_init(&st[i][j], bal[j], sk, first[j]);
        for (int j = 0; j < S && s == GP_OK; j++) {
            if (j == 0) {
                gp_shape xs = gp_shape_with_batch(&m->input, sizes[i]);
                st[i][0].in = gpt_upload(m->dev, &xs, x + at * per);
            } else { /* the copy in: the previous stage's output */
                st[i][j].in = gpt_bf16_copy(m->dev, &st[i][j - 1].out);
            }
            for (int t = 0; t < sk->n; t++) /* skips popped here, stashed earlier */
                if (stage_of[sk->skips[t].to] == j && stage_of[sk->skips[t].from] < j)
                    st[i][j].skip_in[t] =
                        gpt_bf16_copy(m->dev, &st[i][stage_of[sk->skips[t].from]].skip_out[t]);
            s = gp_ckpt_forward(m->layers + first[j], &ctx, GP_FWD_KEEP, &st[i][j], &bad);
        }
        if (s != GP_OK) break;
        gp_shape ys = gp_loss_targets_shape(m->loss, &m->output, sizes[i]);
        gp_tensor labels = gpt_upload(m->dev, &ys, y + at * m->targets);
        gp_loss_out lo = {0};
        s = gp_ckpt_loss(m->dev, m->loss, m->label_smoothing, m->classes, &st[i][S - 1].out,
                         &labels, (float)(1.0 / ((double)n * (double)m->targets)), &dy[i], &lo);
        gp_tensor_free(&labels);
        sum += lo.loss_sum;
        correct += lo.correct;
        count += lo.count;
    }
    bool up = gp_schedule_backward_ascending(c->pipeline.schedule);
    bool split = gp_schedule_splits_backward(c->pipeline.schedule);
    for (int q = 0; q < chunks && s == GP_OK; q++) {
        int i = up ? q : chunks - 1 - q;
        gp_fwd_ctx ctx = {.training = true, .seed = c->train.seed, .step = (uint64_t)m->step,
                          .sample_offset = off[i], .batch_total = n};
        gp_tensor g = dy[i];
        dy[i] = (gp_tensor){0};
        for (int j = S - 1; j >= 0 && s == GP_OK; j--) {
            for (int t = 0; t < sk->n; t++) /* the copies back of skips stashed here */
                if (stage_of[sk->skips[t].from] == j && stage_of[sk->skips[t].to] > j)
                    st[i][j].skip_dout[t] =
                        gpt_bf16_copy(m->dev, &st[i][stage_of[sk->skips[t].to]].skip_din[t]);
            gp_tensor dx = {0};
            gp_layer *ls = m->layers + first[j];
            if (split) {
                s = gp_ckpt_backward_data(ls, &ctx, &st[i][j], &g, ft, j > 0 ? &dx : NULL, &bad);
                if (s == GP_OK)
                    s = gp_ckpt_backward_weights(ls, &ctx, &st[i][j], ft, j > 0, &bad);
            } else {
                s = gp_ckpt_backward(ls, &ctx, &st[i][j], &g, ft, j > 0 ? &dx : NULL, &bad);
            }
            gp_tensor_free(&g);
            if (j > 0 && s == GP_OK) g = gpt_bf16_copy(m->dev, &dx); /* the copy back */
            gp_tensor_free(&dx);
        }
        gp_tensor_free(&g);
    }
    for (int i = 0; i < chunks; i++) {
        for (int j = 0; j < S; j++) gp_stash_destroy(&st[i][j]);
        gp_tensor_free(&dy[i]);
    }
    free(st);
    free(dy);
    for (int k = 0; k < L && s == GP_OK; k++) s = gp_layer_grads_finish(&m->layers[k]);
    if (s == GP_OK) s = gp_layers_tie_grads(m->layers, L); /* (as gp_model_train_step) */
    for (int k = 0; k < L && s == GP_OK; k++)
        if (m->layers[k].ops->commit) s = m->layers[k].ops->commit(&m->layers[k]);
    if (s == GP_OK) s = gp_optim_update(m->optim, 0, L, 0.05, m->step, 0, 1, NULL, NULL, 0.0f);
    if (s == GP_OK) s = gp_layers_tie_sync(m->layers, L);
    m->step++;
    if (out) *out = gp_step_stats_of(sum, correct, count, n, 0.05, 0, 0);
    return s;
}

/* Transparency, the pipeline's oracle: `steps` steps of batch `batch`
 * (gpt_make_batch, or gpt_make_tokens where the first layer is an
 * embedding; for binary cross-entropy the targets of gpt_make_masks)
 * on ref (gp_model_train_step, c->pipeline.chunks micro-batches) and on pip
 * (gp_model_pipeline_step), both built from c.
 * same[0]: every step's loss and accuracy equal; same[1]: the first step's
 * gradients equal bit for bit; same[2]: every parameter and buffer equal
 * after the last step.  A failing step is a CHECK failure and leaves the
 * flags false. */
static inline void gpt_compare_steps(const gp_config *c, gp_model *ref, gp_model *pip,
                                     int64_t batch, int steps, bool same[3])
{
    int64_t per = c->model.input[0] * c->model.input[1] * c->model.input[2], t = ref->targets;
    float *x = malloc((size_t)(batch * per) * sizeof *x);
    float *y = malloc((size_t)(batch * t) * sizeof *y);
    same[0] = same[1] = same[2] = false;
    bool loss = true, grads = true, ok = x && y, bf16 = gp_config_bf16_copies(c);
    for (int step = 0; step < steps && ok; step++) {
        if (ref->layers[0].spec.type == GP_LAYER_EMBEDDING)
            gpt_make_tokens(ref, batch, step, x, y);
        else
            gpt_make_batch(c, batch, step, x, y);
        if (c->model.loss == GP_LOSS_BCE_WITH_LOGITS) gpt_make_masks(batch * t, step, y);
        gp_step_stats a, b;
        gp_status s1 = bf16 ? gpt_rounded_step(ref, c, x, y, batch, pip->balance, pip->n_stages, &a)
                            : gp_model_train_step(ref, c, x, y, batch, c->pipeline.chunks, 0.05, &a);
        gp_status s2 = gp_model_pipeline_step(pip, c, x, y, batch, 0.05, &b);
        if (s1 != GP_OK || s2 != GP_OK) {
            CHECK_MSG(0, "step: %s", gp_last_error());
            ok = false;
            break;
        }
        if (a.loss != b.loss || a.accuracy != b.accuracy) loss = false;
        if (step == 0) {
            int64_t na, nb;
            float *ga = gpt_gather(ref, GPT_GRADS, &na), *gb = gpt_gather(pip, GPT_GRADS, &nb);
            if (na != nb || memcmp(ga, gb, (size_t)na * sizeof *ga)) grads = false;
            free(ga);
            free(gb);
        }
    }
    free(x);
    free(y);
    if (!ok) return;
    same[0] = loss;
    same[1] = grads;
    same[2] = gpt_same_values(ref, pip);
}

/* c's optimizer becomes Adam or AdamW (kind), PyTorch's betas and eps,
 * with weight decay so that both decays are exercised. */
static inline void gpt_set_adam(gp_config *c, gp_optim_kind kind)
{
    gp_optim_config *o = &c->train.optim;
    snprintf(o->type, sizeof o->type, "%s", kind == GP_OPTIM_ADAM ? "adam" : "adamw");
    o->kind = kind;
    o->momentum = 0;
    o->nesterov = false;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-8f;
    o->weight_decay = 0.01f;
}

/* L layers over n stages: the first L % n stages get one more. */
static inline void gpt_split_even(int L, int n, int *bal)
{
    for (int j = 0; j < n; j++) bal[j] = L / n + (j < L % n ? 1 : 0);
}

/* c runs schedule k on n devices (interleaved: 2 stages on each): sets the
 * schedule and its stages per device, splits the layers evenly over the
 * stages into bal, and returns the stage count. */
static inline int gpt_set_schedule(gp_config *c, gp_schedule_kind k, int n, int *bal)
{
    int v = gp_schedule_stages_per_device(k, 2); /* interleaved: 2; zb-v: 2, in a V */
    c->pipeline.schedule = k;
    c->pipeline.virtual_stages = v;
    gpt_split_even(c->model.n_layers, n * v, bal);
    return n * v;
}

/* Channel ch of x (N, C, S): its mean, and the sum of squared deviations
 * from that mean (divide by N S for the biased variance, N S - 1 for the
 * unbiased one); two passes in double, the reference the backends' batch
 * norms are checked against. */
static inline void gpt_bn_moments(const float *x, int64_t n, int64_t c, int64_t s, int64_t ch,
                                  double *mean, double *sq_dev)
{
    double m = 0, v = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < s; j++) m += x[(i * c + ch) * s + j];
    m /= (double)(n * s);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < s; j++) {
            double t = x[(i * c + ch) * s + j] - m;
            v += t * t;
        }
    *mean = m;
    *sq_dev = v;
}

/* The path of `name` in the build tree: $GPIPE_BINARY_DIR (CTest sets it)
 * or the build directory this test was compiled for. */
static inline void gpt_binary_path(char *out, size_t len, const char *name)
{
    const char *b = getenv("GPIPE_BINARY_DIR");
    snprintf(out, len, "%s/%s", b ? b : GPIPE_BINARY_DIR, name);
}

/* A new directory /tmp/<prefix>XXXXXX, only ours, its name in dir; false
 * (with the reason on stderr) when it cannot be made.  The caller removes
 * it. */
static inline bool gpt_make_tmpdir(char *dir, size_t len, const char *prefix)
{
    snprintf(dir, len, "/tmp/%sXXXXXX", prefix);
    if (mkdtemp(dir)) return true;
    perror("mkdtemp");
    return false;
}

/* Whether two files hold the same bytes (and both could be read). */
static inline bool gpt_same_files(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    uint8_t *x = gpt_read_file(a, &na), *y = gpt_read_file(b, &nb);
    bool same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

/* The n bytes at data as the whole of the file at path. */
static inline void gpt_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return;
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Run a shell command (stderr into stdout); its exit status (-1 when it
 * could not run or did not exit), its output in out (len bytes at most,
 * '\0'-terminated). */
static inline int gpt_run_cmd(const char *cmd, char *out, size_t len)
{
    char full[4200]; /* the command (at most 4096) and " 2>&1" */
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A --metrics file with each step's record cut before its first timing
 * field (the evaluations' have none), for comparing two runs; NULL when
 * it cannot be read. */
static inline char *gpt_metrics_records(const char *path)
{
    char *t = gpt_read_file(path, NULL);
    if (!t) return NULL;
    char *w = t;
    for (char *r = t; *r;) {
        char *nl = strchr(r, '\n');
        size_t len = nl ? (size_t)(nl - r) + 1 : strlen(r);
        char *cut = strstr(r, ",\"samples_per_s\"");
        if (cut && cut < r + len) { /* the line's text before it, and its end */
            memmove(w, r, (size_t)(cut - r));
            w += cut - r;
            *w++ = '\n';
        } else {
            memmove(w, r, len);
            w += len;
        }
        r += len;
    }
    *w = '\0';
    return t;
}

/* The losses of `steps` training steps (loss[0 .. steps)) of the run a
 * config text and its `n` --set overrides make, every step on the batch
 * (x, y) of b rows.  Returns the first failure (its message left for the
 * caller, which says which run it was: a prepare that must fail is the
 * caller's to check), else GP_OK. */
static inline gp_status gpt_run_losses(const char *yaml, const char *const *sets, int n,
                                       const float *x, const float *y, int64_t b, int steps,
                                       double *loss)
{
    gp_run *run = NULL;
    gp_status st = gp_run_parse("run.yaml", yaml, sets, n, &run);
    if (st == GP_OK) st = gp_run_prepare(run);
    for (int k = 0; k < steps && st == GP_OK; k++) {
        gp_metrics m;
        st = gp_run_step(run, x, y, b, 0, &m);
        if (st == GP_OK) loss[k] = m.loss;
    }
    if (run) gp_run_free(run);
    return st;
}

#endif /* GP_TEST_UTIL_H */
