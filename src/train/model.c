/*
 * model.c — the sequential model on one device: build, one training step
 * over micro-batches (the single-device oracle every pipeline run is
 * checked against), the SGD update, evaluation.
 *
 * Step memory: activations of one micro-batch live from its forward to its
 * backward; gradients accumulate across micro-batches (dW +=) and are zeroed
 * once per step.
 */
#include "train/train.h"
#include "pipeline/pipeline.h"
#include "balance/balance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

gp_status gp_model_build(const gp_config *cfg, gp_device *dev, gp_model *out)
{
    int balance = cfg->model.n_layers;
    return gp_model_build_placed(cfg, &dev, 1, &balance, out);
}

gp_status gp_model_build_placed(const gp_config *cfg, gp_device *const *devs, int n,
                                const int *balance, gp_model *out)
{
    memset(out, 0, sizeof *out);
    const gp_model_config *mc = &cfg->model;
    if (mc->n_layers < 1)
        return gp_error_set(GP_ERR_INVALID, "%s: model.layers is empty; list at least one layer",
                            cfg->path);
    GP_ASSERT(n >= 1 && n <= GP_MAX_DEVICES);
    out->layers = calloc((size_t)mc->n_layers, sizeof *out->layers);
    out->mom_first = calloc((size_t)mc->n_layers, sizeof *out->mom_first);
    if (!out->layers || !out->mom_first) {
        gp_model_free(out);
        return gp_error_set(GP_ERR_OOM, "out of host memory building the model");
    }
    out->dev = devs[0];
    out->n_stages = n;
    for (int j = 0; j < n; j++) {
        out->devs[j] = devs[j];
        out->balance[j] = balance[j];
    }
    out->input = gp_shape_4d(1, mc->input[0], mc->input[1], mc->input[2]);
    gp_shape cur = out->input;
    int stage = 0, in_stage = 0;
    for (int k = 0; k < mc->n_layers; k++) {
        while (stage < n - 1 && in_stage >= balance[stage]) {
            stage++;
            in_stage = 0;
        }
        gp_status s = gp_layer_create(&mc->layers[k], k, &cur, devs[stage], cfg->train.seed,
                                      &out->layers[k]);
        if (s != GP_OK) {
            gp_model_free(out);
            return s;
        }
        in_stage++;
        out->n_layers = k + 1;
        cur = out->layers[k].out_shape;
    }
    out->output = cur;
    if (cur.ndim != 2) {
        char b[64];
        gp_model_free(out);
        return gp_error_set(GP_ERR_INVALID,
                            "%s: the model's output is %s per sample but cross_entropy needs "
                            "(N, classes); end the model with flatten and linear",
                            cfg->path, gp_shape_str(&cur, b, sizeof b));
    }
    /* Optimizer state: one momentum buffer per trainable parameter, on the
     * parameter's device. */
    int n_mom = 0;
    for (int k = 0; k < out->n_layers; k++)
        for (int p = 0; p < out->layers[k].n_params; p++)
            if (!out->layers[k].params[p].is_buffer) n_mom++;
    out->momentum = calloc((size_t)(n_mom ? n_mom : 1), sizeof *out->momentum);
    if (!out->momentum) {
        gp_model_free(out);
        return gp_error_set(GP_ERR_OOM, "out of host memory building the model");
    }
    int j = 0;
    for (int k = 0; k < out->n_layers; k++) {
        out->mom_first[k] = j;
        for (int p = 0; p < out->layers[k].n_params; p++) {
            gp_param *pr = &out->layers[k].params[p];
            if (pr->is_buffer) continue;
            gp_shape sh = gp_tensor_shape(&pr->value);
            gp_status s = gp_tensor_zeros(&out->momentum[j], pr->value.dev, &sh, GP_MEM_OPTIMIZER);
            if (s != GP_OK) {
                gp_model_free(out);
                return s;
            }
            out->n_momentum = ++j;
        }
    }
    return GP_OK;
}

gp_status gp_model_costs(const gp_config *cfg, int64_t batch, double *costs)
{
    gp_shape cur = gp_shape_4d(1, cfg->model.input[0], cfg->model.input[1], cfg->model.input[2]);
    for (int k = 0; k < cfg->model.n_layers; k++) {
        gp_layer l;
        memset(&l, 0, sizeof l);
        l.spec = cfg->model.layers[k];
        l.ops = gp_layer_ops_for(l.spec.type);
        l.index = k;
        l.in_shape = cur;
        gp_shape o;
        GP_TRY(l.ops->infer(&l, &cur, &o));
        l.out_shape = o;
        /* Layers without FLOPs (relu, flatten) still take time: count their
         * output elements too so they are not all piled on one stage. */
        costs[k] = l.ops->flops(&l, batch) + (double)gp_shape_numel(&o) * (double)batch;
        cur = o;
    }
    return GP_OK;
}

const char *gp_model_balance_method(void)
{
    const char *e = getenv("GPIPE_BALANCE");
    return e && !strcmp(e, "flops") ? "flops" : "time";
}

/* CPU devices among one replica's pipeline devices. */
static int cpu_devices(const gp_pipeline_config *pc)
{
    int n_cpu = 0;
    for (int j = 0; j < pc->n_devices; j++) n_cpu += !strncmp(pc->devices[j].name, "cpu", 3);
    return n_cpu;
}

/* Math threads stage 0's device gets in gp_train_open: the profile must run
 * with the same count for its times to mean anything. */
static int stage0_threads(const gp_pipeline_config *pc)
{
    int n_cpu = cpu_devices(pc);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    int t = pc->devices[0].threads ? pc->devices[0].threads : pc->threads;
    if (!t) t = n_cpu > 0 ? (int)(cores / n_cpu) : 1;
    return t < 1 ? 1 : t;
}

gp_status gp_model_profile(const gp_config *cfg, const gp_model_profile_opts *o, gp_profile *out)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    int m = pc->chunks > 0 ? pc->chunks : 1;
    int64_t mb = (cfg->train.batch_size + m - 1) / m;
    gp_profile_opts po = {.device = pc->devices[0].name,
                          .threads = o->threads > 0 ? o->threads : stage0_threads(pc),
                          .warmup = o->warmup, .reps = o->reps, .timed = o->timed,
                          .batch = cfg->train.batch_size, .chunks = m, .optim_slots = 1,
                          .seed = cfg->train.seed};
    /* Every CPU device of the run (all replicas) computes at once. */
    int n_cpu = cpu_devices(pc), R = pc->replicas > 1 ? pc->replicas : 1;
    if (!o->alone && !strncmp(po.device, "cpu", 3) && n_cpu * R > 1) po.contend = n_cpu * R - 1;
    if (o->n_sizes > 0) {
        po.n_sizes = o->n_sizes;
        memcpy(po.sizes, o->sizes, (size_t)o->n_sizes * sizeof *o->sizes);
    } else {
        po.n_sizes = 1;
        po.sizes[0] = mb > 0 ? mb : 1;
    }
    return gp_profile_run(cfg->model.layers, cfg->model.n_layers, cfg->model.input, &po, out);
}

void gp_model_plan_opts(const gp_config *cfg, int n, gp_plan_opts *o)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    memset(o, 0, sizeof *o);
    o->n = n;
    o->m = pc->chunks > 0 ? pc->chunks : 1;
    o->checkpoint = pc->checkpoint;
    o->by = GP_BALANCE_BY_TIME;
    for (int j = 0; j < n && j < GP_MAX_DEVICES; j++) {
        size_t cap = j < pc->n_devices && pc->devices[j].memory ? pc->devices[j].memory : pc->memory;
        o->capacity[j] = (double)cap;
    }
}

gp_status gp_model_balance(const gp_config *cfg, int n, int *balance)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    int L = cfg->model.n_layers;
    if (pc->n_balance > 0) {
        if (pc->n_balance != n)
            return gp_error_set(GP_ERR_INVALID,
                                "%s: pipeline.balance has %d entries for %d devices; give one "
                                "layer count per device", cfg->path, pc->n_balance, n);
        int sum = 0;
        for (int j = 0; j < n; j++) sum += pc->balance[j];
        if (sum != L)
            return gp_error_set(GP_ERR_INVALID,
                                "%s: pipeline.balance sums to %d layers but the model has %d; "
                                "make the entries add up to %d, or use balance: auto",
                                cfg->path, sum, L, L);
        memcpy(balance, pc->balance, (size_t)n * sizeof *balance);
        return GP_OK;
    }
    if (n == 1 && L >= 1) { /* nothing to choose */
        balance[0] = L;
        return GP_OK;
    }
    gp_status s;
    if (!strcmp(gp_model_balance_method(), "flops")) {
        /* the fast, deterministic path: estimated FLOPs, no memory limit */
        double *costs = malloc((size_t)(L > 0 ? L : 1) * sizeof *costs);
        if (!costs) return gp_error_set(GP_ERR_OOM, "out of host memory");
        int64_t mb = cfg->train.batch_size / (pc->chunks > 0 ? pc->chunks : 1);
        s = gp_model_costs(cfg, mb > 0 ? mb : 1, costs);
        if (s == GP_OK) s = gp_partition_minmax(costs, L, n, balance);
        free(costs);
        return s;
    }
    /* What gpipe-balance --by time does, with few repetitions so that start-up
     * stays quick: profile every layer at the configured micro-batch size
     * on stage 0's kind of device, then the exact min-max partition of the
     * stage times subject to each device's memory. */
    gp_model_profile_opts mo = {.warmup = 1, .reps = 3, .timed = true};
    gp_profile prof;
    s = gp_model_profile(cfg, &mo, &prof);
    if (s != GP_OK) return s;
    gp_plan_opts po;
    gp_model_plan_opts(cfg, n, &po);
    s = gp_balance_plan(&prof, &po, balance);
    gp_profile_free(&prof);
    if (s != GP_OK) return gp_error_wrap(s, "%s: balance: auto", cfg->path);
    return GP_OK;
}

void gp_model_free(gp_model *m)
{
    if (!m) return;
    gp_model_free_replicas(m);
    gp_pipeline_destroy(m->pipe);
    free(m->mom_first);
    for (int j = 0; j < m->n_momentum; j++) gp_tensor_free(&m->momentum[j]);
    free(m->momentum);
    for (int k = 0; k < m->n_layers; k++) gp_layer_destroy(&m->layers[k]);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

int64_t gp_model_param_count(const gp_model *m)
{
    int64_t n = 0;
    for (int k = 0; k < m->n_layers; k++) n += gp_layer_param_count(&m->layers[k]);
    return n;
}

/* The step's gradients start stale: each layer's first backward overwrites
 * them (gp_layer_grads_begin), so there is no zeroing pass. */
static void begin_grads(gp_model *m)
{
    for (int k = 0; k < m->n_layers; k++) gp_layer_grads_begin(&m->layers[k]);
}

static gp_status finish_grads(gp_model *m)
{
    for (int k = 0; k < m->n_layers; k++) GP_TRY(gp_layer_grads_finish(&m->layers[k]));
    return GP_OK;
}

/* SGD on layers [first, first + count), on their devices: on chunk `shard`
 * of `shards` of every parameter (gp_comm_chunk; shards = 1: all of it). */
static gp_status sgd_range(gp_model *m, const gp_optim_config *o, double lr, int first, int count,
                           int shard, int shards, gp_comm *fused)
{
    for (int k = first; k < first + count; k++) {
        gp_layer *l = &m->layers[k];
        int j = m->mom_first[k];
        for (int p = 0; p < l->n_params; p++) {
            gp_param *pr = &l->params[p];
            if (pr->is_buffer) continue;
            float wd = (pr->no_decay && !o->decay_bias_and_norm) ? 0.0f : o->weight_decay;
            gp_device *dev = pr->value.dev;
            if (fused) { /* sum, update and gather this parameter in one pass */
                GP_TRY(gp_dev_sharded_sgd(dev, fused, pr->value.data, pr->grad.data,
                                          m->momentum[j].data,
                                          gp_tensor_numel(&pr->value), (float)lr,
                                          o->momentum, wd, o->nesterov));
                j++;
                continue;
            }
            int64_t lo, hi;
            gp_comm_chunk(gp_tensor_numel(&pr->value), shards, shard, &lo, &hi);
            if (hi > lo)
                GP_TRY(dev->iface->sgd_update(dev, pr->value.data + lo, pr->grad.data + lo,
                                              m->momentum[j].data + lo, hi - lo, (float)lr,
                                              o->momentum, wd, o->nesterov));
            j++;
        }
    }
    return GP_OK;
}

gp_status gp_model_sgd_range(gp_model *m, const gp_optim_config *o, double lr, int first,
                             int count, int shard, int shards, gp_comm *fused)
{
    return sgd_range(m, o, lr, first, count, shard, shards, fused);
}

static gp_status sgd_update(gp_model *m, const gp_optim_config *o, double lr)
{
    return sgd_range(m, o, lr, 0, m->n_layers, 0, 1, NULL);
}

typedef struct {
    gp_model *m;
    const gp_optim_config *o;
    double lr;
} sgd_hook_arg;

/* Runs on worker j once stage j's gradients are complete. */
static gp_status sgd_hook(void *arg, int j, int first, int count, int shard, int shards,
                          gp_comm *fused)
{
    (void)j;
    sgd_hook_arg *a = arg;
    return sgd_range(a->m, a->o, a->lr, first, count, shard, shards, fused);
}

gp_status gp_model_pipeline_step(gp_model *m, const gp_config *cfg, const float *x,
                                 const float *y, int64_t n, double lr, gp_step_stats *st)
{
    if (m->n_replicas > 1) return gp_model_replicated_step(m, cfg, x, y, n, lr, st);
    if (!m->pipe) {
        gp_pipeline_opts po = {.chunks = cfg->pipeline.chunks > 0 ? cfg->pipeline.chunks : 1,
                               .checkpoint = cfg->pipeline.checkpoint,
                               .lockstep = cfg->pipeline.lockstep,
                               .fault_j = -1};
        GP_TRY(gp_pipeline_create(m->layers, m->n_layers, &m->input, m->n_stages, m->devs,
                                  m->balance, &po, &m->pipe));
    }
    sgd_hook_arg a = {m, &cfg->train.optim, lr};
    gp_pipeline_out po;
    GP_TRY(gp_pipeline_step(m->pipe, x, y, n, cfg->train.seed, (uint64_t)m->step, sgd_hook, &a,
                            &po));
    m->step++;
    if (st) {
        st->loss = po.loss_sum / (double)n;
        st->accuracy = (double)po.correct / (double)n;
        st->samples = n;
        st->lr = lr;
        st->seconds = po.seconds;
        st->allreduce_seconds = 0;
    }
    return GP_OK;
}

/* Upload rows [first, first+n) of a host batch to device tensors. */
static gp_status upload_chunk(gp_model *m, const float *x, const float *y, int64_t first,
                              int64_t n, gp_tensor *xt, gp_tensor *yt)
{
    gp_shape xs = gp_shape_with_batch(&m->input, n);
    gp_shape ys = gp_shape_2d(n, 1);
    ys.ndim = 1;
    int64_t per = gp_shape_numel(&m->input);
    GP_TRY(gp_tensor_alloc(xt, m->dev, &xs, GP_MEM_ACTIVATIONS));
    gp_status s = gp_tensor_alloc(yt, m->dev, &ys, GP_MEM_ACTIVATIONS);
    if (s == GP_OK) s = gp_dev_upload(m->dev, xt->data, x + first * per, n * per);
    if (s == GP_OK) s = gp_dev_upload(m->dev, yt->data, y + first, n);
    if (s != GP_OK) {
        gp_tensor_free(xt);
        gp_tensor_free(yt);
    }
    return s;
}

/* The single-device reference step.  It runs GPipe's order on one device
 * without threads: every micro-batch's forward (keeping its activations),
 * then the backwards from the last micro-batch to the first.  Gradients
 * therefore accumulate in the same order as on every pipeline stage, which
 * makes pipelined runs comparable bit for bit. */
typedef struct {
    gp_tensor *acts;  /* [L + 1]: input, then every layer's output */
    gp_saved *saved;  /* [L] */
    gp_tensor labels;
    gp_tensor dy;     /* dlogits */
} ref_mb;

static void ref_mb_free(ref_mb *r, int L)
{
    if (r->acts)
        for (int k = 0; k <= L; k++) gp_tensor_free(&r->acts[k]);
    if (r->saved)
        for (int k = 0; k < L; k++) gp_saved_free(&r->saved[k]);
    free(r->acts);
    free(r->saved);
    gp_tensor_free(&r->labels);
    gp_tensor_free(&r->dy);
}

static gp_status ref_forward(gp_model *m, const gp_fwd_ctx *ctx, ref_mb *r, gp_loss_out *lo,
                             int chunk)
{
    int L = m->n_layers;
    for (int k = 0; k < L; k++)
        GP_TRY(gp_layer_forward(&m->layers[k], ctx, &r->acts[k], &r->acts[k + 1], &r->saved[k]));
    gp_shape ls = gp_tensor_shape(&r->acts[L]);
    GP_TRY(gp_tensor_alloc(&r->dy, m->dev, &ls, GP_MEM_ACTIVATIONS));
    GP_TRY(gp_cross_entropy(m->dev, &r->acts[L], &r->labels,
                            (float)(1.0 / (double)ctx->batch_total), &r->dy, lo));
    if (!isfinite(lo->loss_sum))
        return gp_error_set(GP_ERR_NUMERIC,
                            "loss is %g at step %llu, micro-batch %d; lower train.optimizer.lr, "
                            "add warm-up, or check the data normalisation",
                            lo->loss_sum, (unsigned long long)ctx->step, chunk);
    return GP_OK;
}

static gp_status ref_backward(gp_model *m, const gp_fwd_ctx *ctx, ref_mb *r)
{
    int L = m->n_layers;
    gp_tensor dy = r->dy;
    r->dy = (gp_tensor){0};
    gp_status s = GP_OK;
    int ft = gp_layers_first_trainable(m->layers, L);
    for (int k = L - 1; k >= 0 && s == GP_OK; k--) {
        gp_tensor dx = {0};
        if (k >= ft)
            s = gp_layer_backward(&m->layers[k], ctx, &r->acts[k], &r->acts[k + 1], &dy,
                                  k > ft ? &dx : NULL, &r->saved[k]);
        gp_tensor_free(&dy);
        gp_tensor_free(&r->acts[k + 1]);
        gp_saved_free(&r->saved[k]);
        dy = dx;
    }
    gp_tensor_free(&dy);
    return s;
}

gp_status gp_model_train_step(gp_model *m, const gp_config *cfg, const float *x,
                              const float *y, int64_t n, int chunks, double lr,
                              gp_step_stats *st)
{
    double t0 = gp_now();
    int64_t sizes[1024], offs[1024];
    if (chunks > 1024)
        return gp_error_set(GP_ERR_INVALID, "pipeline.chunks = %d exceeds 1024", chunks);
    GP_TRY(gp_microbatch_split(n, chunks, sizes));
    begin_grads(m);
    int L = m->n_layers;
    ref_mb *mbs = calloc((size_t)chunks, sizeof *mbs);
    if (!mbs) return gp_error_set(GP_ERR_OOM, "out of host memory");
    gp_status s = GP_OK;
    double loss_sum = 0;
    int64_t correct = 0, first = 0;
    for (int i = 0; i < chunks && s == GP_OK; i++) {
        ref_mb *r = &mbs[i];
        offs[i] = first;
        r->acts = calloc((size_t)L + 1, sizeof *r->acts);
        r->saved = calloc((size_t)L, sizeof *r->saved);
        if (!r->acts || !r->saved) {
            s = gp_error_set(GP_ERR_OOM, "out of host memory");
            break;
        }
        s = upload_chunk(m, x, y, first, sizes[i], &r->acts[0], &r->labels);
        gp_fwd_ctx ctx = {.training = true, .seed = cfg->train.seed, .step = (uint64_t)m->step,
                          .sample_offset = first, .batch_total = n};
        gp_loss_out lo = {0};
        if (s == GP_OK) s = ref_forward(m, &ctx, r, &lo, i);
        loss_sum += lo.loss_sum;
        correct += lo.correct;
        first += sizes[i];
    }
    for (int i = chunks - 1; i >= 0 && s == GP_OK; i--) {
        gp_fwd_ctx ctx = {.training = true, .seed = cfg->train.seed, .step = (uint64_t)m->step,
                          .sample_offset = offs[i], .batch_total = n};
        s = ref_backward(m, &ctx, &mbs[i]);
    }
    for (int i = 0; i < chunks; i++) ref_mb_free(&mbs[i], L);
    free(mbs);
    if (s == GP_OK) s = finish_grads(m);
    if (s == GP_OK)
        for (int k = 0; k < L && s == GP_OK; k++)
            if (m->layers[k].ops->commit) s = m->layers[k].ops->commit(&m->layers[k]);
    if (s == GP_OK) s = sgd_update(m, &cfg->train.optim, lr);
    if (s == GP_OK) s = m->dev->iface->synchronize(m->dev);
    if (s != GP_OK) return s;
    m->step++;
    if (st) {
        st->loss = loss_sum / (double)n;
        st->accuracy = (double)correct / (double)n;
        st->samples = n;
        st->lr = lr;
        st->seconds = gp_now() - t0;
        st->allreduce_seconds = 0;
    }
    return GP_OK;
}

gp_status gp_model_evaluate(gp_model *m, const gp_config *cfg, const gp_dataset *ds,
                            double *loss, double *accuracy)
{
    int64_t bs = cfg->train.eval_batch_size > 0 ? cfg->train.eval_batch_size : 1000;
    int64_t per = ds->c * ds->h * ds->w;
    float *x = malloc((size_t)(bs * per) * sizeof *x);
    float *y = malloc((size_t)bs * sizeof *y);
    float mean[GP_MAX_CHANNELS], std[GP_MAX_CHANNELS];
    if (!x || !y) {
        free(x);
        free(y);
        return gp_error_set(GP_ERR_OOM, "out of host memory for evaluation batches");
    }
    gp_data_norm(&cfg->data, ds->c, mean, std);
    int L = m->n_layers;
    double loss_sum = 0;
    int64_t correct = 0;
    gp_status s = GP_OK;
    for (int64_t b0 = 0; b0 < ds->n && s == GP_OK; b0 += bs) {
        int64_t n = ds->n - b0 < bs ? ds->n - b0 : bs;
        gp_data_assemble(ds, b0, n, cfg->data.normalize, mean, std, x, y);
        gp_tensor cur = {0}, labels = {0};
        s = upload_chunk(m, x, y, 0, n, &cur, &labels);
        gp_fwd_ctx ctx = {.training = false, .seed = cfg->train.seed, .step = (uint64_t)m->step,
                          .sample_offset = 0, .batch_total = n};
        for (int k = 0; k < L && s == GP_OK; k++) {
            gp_tensor next = {0};
            gp_saved sv = {0};
            if (cur.dev != m->layers[k].dev) {
                /* a stage boundary: move the activation to the next device */
                gp_shape cs = gp_tensor_shape(&cur);
                s = gp_tensor_alloc(&next, m->layers[k].dev, &cs, GP_MEM_COPIES);
                if (s == GP_OK) s = gp_tensor_copy(&next, &cur);
                gp_tensor_free(&cur);
                cur = next;
                next = (gp_tensor){0};
                if (s != GP_OK) break;
            }
            s = gp_layer_forward(&m->layers[k], &ctx, &cur, &next, &sv);
            gp_saved_free(&sv);
            gp_tensor_free(&cur);
            cur = next;
        }
        gp_loss_out lo = {0};
        if (s == GP_OK && labels.dev != cur.dev) {
            gp_tensor l2;
            gp_shape lsh = gp_tensor_shape(&labels);
            s = gp_tensor_alloc(&l2, cur.dev, &lsh, GP_MEM_COPIES);
            if (s == GP_OK) s = gp_tensor_copy(&l2, &labels);
            gp_tensor_free(&labels);
            labels = l2;
        }
        if (s == GP_OK) s = gp_cross_entropy(cur.dev, &cur, &labels, 1.0f, NULL, &lo);
        loss_sum += lo.loss_sum;
        correct += lo.correct;
        gp_tensor_free(&cur);
        gp_tensor_free(&labels);
    }
    free(x);
    free(y);
    if (s != GP_OK) return s;
    *loss = loss_sum / (double)(ds->n ? ds->n : 1);
    *accuracy = (double)correct / (double)(ds->n ? ds->n : 1);
    return GP_OK;
}
