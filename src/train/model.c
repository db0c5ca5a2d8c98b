/*
 * model.c — one replica of the model: build (layers placed on their
 * stages' devices, the optimizer), one training step over micro-batches on
 * one device (the single-device oracle every pipeline run is checked
 * against), the pipelined step of one replica, evaluation, and the
 * balance a config asks for.
 *
 * Step memory: activations of one micro-batch live from its forward to its
 * backward; gradients accumulate across micro-batches (dW +=) and are zeroed
 * once per step.
 */
#include "train/train.h"
#include "balance/balance.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static gp_status build_placed(const gp_config *cfg, gp_device *const *devs, int n, int v,
                              const int *balance, bool meta, gp_model *out);

gp_status gp_model_build(const gp_config *cfg, gp_device *dev, gp_model *out)
{
    int balance = cfg->model.n_layers; /* one stage, whatever the schedule */
    return build_placed(cfg, &dev, 1, 1, &balance, false, out);
}

gp_status gp_model_build_placed(const gp_config *cfg, gp_device *const *devs, int n,
                                const int *balance, gp_model *out)
{
    return build_placed(cfg, devs, n, gp_model_virtual(cfg), balance, false, out);
}

/* The replica (shard of shards) the builds on this thread make
 * (gp_model_build_replica), whose optimizer keeps that chunk of its state. */
static _Thread_local int build_shard, build_shards;

gp_status gp_model_build_replica(const gp_config *cfg, gp_device *const *devs, int n,
                                 const int *balance, int replica, int replicas, gp_model *out)
{
    build_shard = replica;
    build_shards = replicas;
    gp_status s = build_placed(cfg, devs, n, gp_model_virtual(cfg), balance, false, out);
    build_shard = 0;
    build_shards = 0;
    return s;
}

gp_status gp_model_build_meta(const gp_config *cfg, const int *balance, gp_model *out)
{
    gp_device *none[GP_MAX_DEVICES] = {0};
    return build_placed(cfg, none, cfg->pipeline.n_devices, gp_model_virtual(cfg), balance, true,
                        out);
}

static _Thread_local const _Atomic int *build_stop;

void gp_model_build_stop(const _Atomic int *stop) { build_stop = stop; }

static _Thread_local bool build_loads;

void gp_model_build_loads(bool loads) { build_loads = loads; }

static _Thread_local bool build_inference;

bool gp_model_build_inference(bool inference)
{
    bool was = build_inference;
    build_inference = inference;
    return was;
}

bool gp_model_building_inference(void) { return build_inference; }

int64_t gp_model_config_classes(const gp_model_config *mc)
{
    const gp_layer_spec *last = mc->n_layers > 0 ? &mc->layers[mc->n_layers - 1] : NULL;
    if (mc->loss != GP_LOSS_CROSS_ENTROPY || !last || last->type != GP_LAYER_LINEAR) return 0;
    return last->valid_rows > 0 && last->valid_rows < last->out ? last->valid_rows : 0;
}

/* The loss takes the model's output: cross_entropy needs (N, classes) or
 * (N, T, classes) (a class per position: a language model's next token);
 * binary cross-entropy takes any output, one target per element. */
static gp_status loss_takes_output(const gp_config *cfg, const gp_shape *out)
{
    if (cfg->model.loss != GP_LOSS_CROSS_ENTROPY || out->ndim == 2 || out->ndim == 3)
        return GP_OK;
    char b[64];
    gp_shape one = *out; /* (per sample: without the batch dimension) */
    if (one.ndim > 1) {
        one.ndim--;
        memmove(one.dims, one.dims + 1, sizeof one.dims[0] * (size_t)one.ndim);
    }
    const char *at = cfg->model.loss_at[0] ? cfg->model.loss_at : cfg->path;
    return gp_error_set(GP_ERR_INVALID,
                        "%s: the model's output is %s per sample but cross_entropy%s needs "
                        "(N, classes) or (N, T, classes); end the model with flatten and linear, or for one "
                        "target per output element (masks) set model.loss: "
                        "bce_with_logits", at, gp_shape_str(&one, b, sizeof b),
                        cfg->model.loss_at[0] ? "" : " (model.loss's default)");
}

static gp_status place_layers(const gp_config *cfg, gp_device *const *devs, int n, int v,
                              const int *balance, bool meta, gp_model *out);

/* n devices, v stages on each (stage j on device j % n); meta: every layer
 * shapes only (gp_layer_meta), devs may be NULL.  No random draws where
 * a load follows (gp_model_build_loads). */
static gp_status build_placed(const gp_config *cfg, gp_device *const *devs, int n, int v,
                              const int *balance, bool meta, gp_model *out)
{
    bool was = gp_layers_draw_init(!build_loads);
    bool grads = gp_layers_with_grads(!build_inference);
    gp_status s = place_layers(cfg, devs, n, v, balance, meta, out);
    gp_layers_with_grads(grads);
    gp_layers_draw_init(was);
    if (s == GP_OK) out->inference = build_inference;
    return s;
}

static gp_status place_layers(const gp_config *cfg, gp_device *const *devs, int n, int v,
                              const int *balance, bool meta, gp_model *out)
{
    memset(out, 0, sizeof *out);
    const gp_model_config *mc = &cfg->model;
    if (mc->n_layers < 1)
        return gp_error_set(GP_ERR_INVALID, "%s: model.layers is empty; list at least one layer",
                            cfg->path);
    GP_ASSERT(n >= 1 && n <= GP_MAX_DEVICES);
    out->layers = calloc((size_t)mc->n_layers, sizeof *out->layers);
    if (!out->layers) {
        gp_model_release(out);
        return gp_error_set(GP_ERR_OOM, "out of host memory building the model");
    }
    /* interleaved: v stages per device, stage j on device j % n; zb-v: 2,
     * in a V */
    int S = n * v;
    GP_ASSERT(S <= GP_MAX_DEVICES);
    out->dev = devs[0];
    out->n_stages = S;
    out->n_devices = n;
    /* under mpirun (gp_train_check_processes: one device per rank, rank r
     * running device r % n of replica r / n) */
    int R = gp_pipeline_replicas(&cfg->pipeline), N = gp_procs_size();
    out->local_device = N > 1 && N == n * R ? gp_procs_rank() % n : -1;
    out->rank_base = N > 1 && N == n * R ? gp_procs_rank() / n * n : 0;
    for (int j = 0; j < S; j++) {
        out->dev_of[j] = gp_schedule_device_of(cfg->pipeline.schedule, n, j);
        out->devs[j] = devs[out->dev_of[j]];
        out->balance[j] = balance[j];
    }
    out->input = gp_shape_4d(1, mc->input[0], mc->input[1], mc->input[2]);
    gp_status s = gp_skip_map_build(mc->layers, mc->n_layers, &out->skips);
    gp_shape *outs = s == GP_OK ? malloc((size_t)mc->n_layers * sizeof *outs) : NULL;
    if (s == GP_OK && !outs) s = gp_error_set(GP_ERR_OOM, "out of host memory building the model");
    if (s != GP_OK) {
        gp_model_release(out);
        return s;
    }
    int stage = 0, in_stage = 0;
    for (int k = 0; k < mc->n_layers; k++) {
        while (stage < S - 1 && in_stage >= balance[stage]) {
            stage++;
            in_stage = 0;
        }
        gp_shape in[1 + GP_MAX_POPS];
        gp_skip_map_inputs(&out->skips, k, &out->input, outs, in);
        if (meta || (out->local_device >= 0 && out->dev_of[stage] != out->local_device))
            s = gp_layer_meta(&mc->layers[k], k, in, &out->layers[k]); /* another rank's */
        else
            s = gp_layer_create(&mc->layers[k], k, in, devs[out->dev_of[stage]], cfg->train.seed,
                                &out->layers[k]);
        if (s == GP_OK && !meta && build_stop && atomic_load(build_stop)) {
            gp_layer_destroy(&out->layers[k]);
            s = gp_error_set(GP_ERR_STOPPED, "stopped by a signal while initialising the model "
                             "(at layer %d of %d), before the first step; nothing was trained",
                             k + 1, mc->n_layers);
        }
        if (s != GP_OK) {
            free(outs);
            gp_model_release(out);
            return s;
        }
        out->layers[k].out_dtype = gp_config_act_dtype(cfg); /* train.activations */
        in_stage++;
        out->n_layers = k + 1;
        outs[k] = out->layers[k].out_shape;
    }
    gp_shape cur = outs[mc->n_layers - 1];
    free(outs);
    /* tied weights: each replica starts as its owner (gp_layers_tie_sync;
     * again after model.init_from and --resume, which load owners only) */
    s = gp_layers_tie(out->layers, out->n_layers);
    if (s == GP_OK && !meta) s = gp_model_tie_sync(out);
    if (s != GP_OK) {
        gp_model_release(out);
        return s;
    }
    out->output = cur;
    out->loss = mc->loss;
    out->label_smoothing = mc->label_smoothing;
    out->classes = gp_model_config_classes(mc);
    out->targets = gp_loss_targets_per_sample(mc->loss, &cur);
    gp_status ls = loss_takes_output(cfg, &cur);
    if (ls != GP_OK) {
        gp_model_release(out);
        return ls;
    }
    /* an inference-only model keeps no update state: plain SGD's none */
    gp_optim_opts so = build_inference ? (gp_optim_opts){.kind = GP_OPTIM_SGD}
                                       : gp_model_optim_opts(cfg);
    gp_status st = build_shards > 1 && !build_inference
                       ? gp_optim_create_sharded(out->layers, out->n_layers, &so, build_shard,
                                                 build_shards, &out->optim)
                       : gp_optim_create(out->layers, out->n_layers, &so, &out->optim);
    if (st != GP_OK) gp_model_release(out);
    return st;
}

int gp_model_optim_shards(const gp_config *cfg)
{
    return gp_model_optim_shards_for(cfg, gp_pipeline_replicas(&cfg->pipeline));
}

int gp_model_optim_shards_for(const gp_config *cfg, int replicas)
{
    if (replicas <= 1 || gp_model_building_inference()) return 1;
    for (int k = 0; k < cfg->model.n_layers; k++)
        if (cfg->model.layers[k].tie[0]) return 1; /* (gp_optim_shardable: no tied weights) */
    return replicas;
}

gp_config_reads gp_config_input_of(const gp_config *cfg, const char *out)
{
    if (!out || !out[0]) return GP_CONFIG_READS_NONE;
    if (gp_path_overlaps(out, cfg->model.init_from)) return GP_CONFIG_READS_INIT_FROM;
    if (gp_path_overlaps(out, cfg->pipeline.schedule_path)) return GP_CONFIG_READS_SCHEDULE;
    if (gp_dataset_reads(&cfg->data, out)) return GP_CONFIG_READS_DATASET;
    return GP_CONFIG_READS_NONE;
}

gp_optim_opts gp_model_optim_opts(const gp_config *cfg)
{
    const gp_optim_config *o = &cfg->train.optim;
    return (gp_optim_opts){.kind = (gp_optim_kind)o->kind, .momentum = o->momentum,
                           .nesterov = o->nesterov, .beta1 = o->beta1, .beta2 = o->beta2,
                           .eps = o->eps, .weight_decay = o->weight_decay,
                           .decay_bias_and_norm = o->decay_bias_and_norm};
}

gp_step_stats gp_step_stats_of(double loss_sum, int64_t correct, int64_t count, int64_t n,
                               double lr, double seconds, double comm_seconds)
{
    double c = count > 0 ? (double)count : 1.0;
    return (gp_step_stats){.loss = loss_sum / c, .accuracy = (double)correct / c,
                           .samples = n, .lr = lr, .seconds = seconds,
                           .allreduce_seconds = comm_seconds, .grad_norm = NAN};
}

int gp_model_optim_slots(const gp_config *cfg)
{
    gp_optim_opts o = gp_model_optim_opts(cfg);
    return gp_optim_states_per_param(&o);
}

gp_pipeline_opts gp_model_pipeline_opts(const gp_model *m, const gp_config *cfg)
{
    return (gp_pipeline_opts){.chunks = cfg->pipeline.chunks, .skips = &m->skips,
                              .checkpoint = cfg->pipeline.checkpoint,
                              .ckpt_keep = cfg->pipeline.checkpoint_keep,
                              .schedule = cfg->pipeline.schedule,
                              .virtual_stages = gp_model_virtual(cfg),
                              .schedule_file = cfg->pipeline.schedule_file,
                              .lockstep = cfg->pipeline.lockstep, .fault_j = -1,
                              .processes = m->local_device >= 0,
                              .local_device = m->local_device, .rank_base = m->rank_base,
                              .optim = m->optim, .loss = m->loss,
                              .label_smoothing = m->label_smoothing,
                              .classes = m->classes,
                              .clip_norm = cfg->train.clip_grad_norm,
                              .bf16_copies = gp_config_bf16_copies(cfg)};
}

/* Every layer of the config's model from shapes alone, in order, each
 * with its inputs (the previous output and its pops) resolved:
 * gp_layer_meta (parameters as shapes) with `params`, else
 * gp_layer_shapes; visit(arg, k, layer) sees it before it is destroyed. */
static gp_status each_layer(const gp_config *cfg, bool params,
                            void (*visit)(void *arg, int k, const gp_layer *l), void *arg)
{
    gp_shape input = gp_shape_4d(1, cfg->model.input[0], cfg->model.input[1], cfg->model.input[2]);
    int L = cfg->model.n_layers;
    gp_skip_map map;
    GP_TRY(gp_skip_map_build(cfg->model.layers, L, &map));
    gp_shape *outs = malloc((size_t)(L ? L : 1) * sizeof *outs);
    gp_shape *ins = malloc((size_t)(L ? L : 1) * sizeof *ins); /* main inputs, for the ties */
    int *owner = malloc((size_t)(L ? L : 1) * sizeof *owner);
    gp_status s = outs && ins && owner ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory");
    for (int k = 0; k < L && s == GP_OK; k++) {
        gp_layer l;
        gp_shape in[1 + GP_MAX_POPS];
        gp_skip_map_inputs(&map, k, &input, outs, in);
        ins[k] = in[0];
        s = params ? gp_layer_meta(&cfg->model.layers[k], k, in, &l)
                   : gp_layer_shapes(&cfg->model.layers[k], k, in, &l);
        if (s != GP_OK) break;
        visit(arg, k, &l);
        outs[k] = l.out_shape;
        if (params) gp_layer_destroy(&l);
    }
    /* ties checked as the built model checks them (gp_layers_tie) */
    if (s == GP_OK) s = gp_layer_specs_ties(cfg->model.layers, ins, L, owner);
    free(outs);
    free(ins);
    free(owner);
    gp_skip_map_free(&map);
    return s;
}

typedef struct {
    int64_t batch;
    double *costs;
} costs_arg;

static void cost_of(void *arg, int k, const gp_layer *l)
{
    costs_arg *a = arg;
    /* Layers without FLOPs (relu, flatten) still take time: count their
     * output elements too so they are not all piled on one stage. */
    a->costs[k] = l->ops->flops(l, a->batch) +
                  (double)gp_shape_numel(&l->out_shape) * (double)a->batch;
}

gp_status gp_model_costs(const gp_config *cfg, int64_t batch, double *costs)
{
    costs_arg a = {batch, costs};
    return each_layer(cfg, false, cost_of, &a);
}

const char *gp_model_balance_method(void)
{
    const char *e = getenv("GPIPE_BALANCE");
    return e && !strcmp(e, "flops") ? "flops" : "time";
}

int gp_model_device_threads(const gp_pipeline_config *pc, int d)
{
    int n_cpu = gp_pipeline_cpu_devices(pc);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    int t = pc->devices[d].threads ? pc->devices[d].threads : pc->threads;
    if (!t) t = n_cpu > 0 ? (int)(cores / n_cpu) : 1;
    return t < 1 ? 1 : t;
}

int gp_data_workers(const gp_config *cfg)
{
    if (cfg->data.workers > 0) return cfg->data.workers;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* each CPU device computes on the threads the trainer opens it with; a
     * GPU's worker mostly waits, so it is counted as one */
    long used = 0;
    const gp_pipeline_config *p = &cfg->pipeline;
    int n = gp_pipeline_devices_total(p);
    for (int j = 0; j < n && j < GP_MAX_DEVICES; j++)
        used += gp_device_spec_is_cpu(&p->devices[j]) ? gp_model_device_threads(p, j) : 1;
    long left = cores - used;
    return left < 1 ? 1 : (int)left;
}

/* The profiler's options for cfg as gp_model_profile takes its profile. */
static void model_profile_opts(const gp_config *cfg, const gp_model_profile_opts *o,
                               gp_profile_opts *out)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    int m = pc->chunks;
    int64_t batch = gp_config_replica_batch(cfg), mb = (batch + m - 1) / m; /* one replica's */
    gp_profile_opts po = {.device = pc->devices[0].name,
                          .threads = o->threads > 0 ? o->threads : gp_model_device_threads(pc, 0),
                          .precision = cfg->train.precision, /* timed as it trains */
                          .deterministic = cfg->train.deterministic,
                          .warmup = o->warmup, .reps = o->reps, .timed = o->timed,
                          .batch = batch, .chunks = m,
                          .optim_slots = gp_model_optim_slots(cfg),
                          .seed = cfg->train.seed, .loss = cfg->model.loss,
                          .label_smoothing = cfg->model.label_smoothing, .say = o->say,
                          .stop = build_stop};
    /* Every CPU device of the run (all replicas) computes at once. */
    int n_cpu = gp_pipeline_cpu_devices(pc);
    if (!o->alone && gp_device_spec_is_cpu(&pc->devices[0]) && n_cpu > 1) po.contend = n_cpu - 1;
    if (o->n_sizes > 0) {
        po.n_sizes = o->n_sizes;
        memcpy(po.sizes, o->sizes, (size_t)o->n_sizes * sizeof *o->sizes);
    } else {
        po.n_sizes = 1;
        po.sizes[0] = mb > 0 ? mb : 1;
    }
    *out = po;
}

void gp_model_profile_facts(const gp_config *cfg, gp_profile *p)
{
    p->bf16_copies = gp_config_bf16_copies(cfg);
    p->act_dtype = (int)gp_config_act_dtype(cfg);
    p->optim_shards = gp_model_optim_shards(cfg);
    /* binary cross-entropy: a target an output element; cross-entropy: one
     * a row of classes, the last layer's outputs (gp_loss_targets_shape).
     * A last layer that is not a linear (a dropout over the head) says
     * nothing of the rows: the model's output shape does, from its meta
     * build; where even that fails, as many targets as outputs (an upper
     * bound, as the plan is) */
    const gp_model_config *mc = &cfg->model;
    const gp_layer_spec *last = mc->n_layers > 0 ? &mc->layers[mc->n_layers - 1] : NULL;
    double out = p->mem && p->L > 0 ? p->mem[p->L - 1].out_per_sample : 0;
    int64_t params;
    gp_shape o;
    if (mc->loss == GP_LOSS_BCE_WITH_LOGITS) p->target_bytes = out;
    else if (last && last->type == GP_LAYER_LINEAR && last->out > 0)
        p->target_bytes = out / (double)last->out;
    else if (gp_model_describe(cfg, &params, &o) == GP_OK)
        p->target_bytes = (double)gp_loss_targets_per_sample(mc->loss, &o) * sizeof(float);
    else {
        gp_error_clear();
        p->target_bytes = out;
    }
    gp_model_profile_keep(cfg, cfg->pipeline.checkpoint_keep, p);
}

void gp_model_profile_keep(const gp_config *cfg, gp_ckpt_keep keep, gp_profile *p)
{
    for (int k = 0; p->mem && k < p->L && k < cfg->model.n_layers; k++)
        p->mem[k].ckpt_keep = keep >> cfg->model.layers[k].type & 1u;
}

gp_status gp_model_profile(const gp_config *cfg, const gp_model_profile_opts *o, gp_profile *out)
{
    gp_profile_opts po;
    model_profile_opts(cfg, o, &po);
    GP_TRY(gp_profile_run(cfg->model.layers, cfg->model.n_layers, cfg->model.input, &po, out));
    gp_model_profile_facts(cfg, out);
    return GP_OK;
}

gp_status gp_model_profile_estimate(const gp_config *cfg, gp_device *dev, gp_profile *out)
{
    gp_model_profile_opts mo = {.timed = false};
    gp_profile_opts po;
    model_profile_opts(cfg, &mo, &po);
    GP_TRY(gp_profile_estimate(cfg->model.layers, cfg->model.n_layers, cfg->model.input, &po,
                               dev, out));
    gp_model_profile_facts(cfg, out);
    return GP_OK;
}

void gp_model_plan_opts(const gp_config *cfg, int n, gp_plan_opts *o)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    memset(o, 0, sizeof *o);
    o->n = n;
    o->m = pc->chunks;
    o->checkpoint = pc->checkpoint;
    o->by = GP_BALANCE_BY_TIME;
    /* Interleaved, n = devices x v stages share their device's memory; the
     * plan models their memory as 1F1B's stages (the closest schedule the
     * planner walks), each with 1/v of its device. */
    int nd = pc->n_devices > 0 ? pc->n_devices : n, v = n > nd && n % nd == 0 ? n / nd : 1;
    bool several = pc->schedule == GP_SCHEDULE_INTERLEAVED || gp_schedule_v_shape(pc->schedule) ||
                   pc->schedule == GP_SCHEDULE_FILE;
    /* zb-v likewise: its 2n stages hold 1F1B's micro-batches in flight
     * (schedule.h), each with half its device, placed in a V */
    o->schedule = several ? GP_SCHEDULE_1F1B : pc->schedule;
    o->virtual_stages = several ? v : 1;
    o->v_shape = gp_schedule_v_shape(pc->schedule) && v == 2;
    /* what the split is refined against: the schedule itself, a file's as
     * its placement's built-in one */
    o->sim_kind = pc->schedule == GP_SCHEDULE_FILE_V   ? GP_SCHEDULE_ZB_V
                  : pc->schedule == GP_SCHEDULE_FILE ? GP_SCHEDULE_INTERLEAVED
                  : several                          ? pc->schedule
                                                     : GP_SCHEDULE_INTERLEAVED;
    o->lockstep = pc->lockstep;
    for (int j = 0; j < n && j < GP_MAX_DEVICES; j++) {
        int d = o->v_shape ? gp_schedule_v_device(nd, j) : j % nd;
        size_t cap = d < pc->n_devices && pc->devices[d].memory ? pc->devices[d].memory : pc->memory;
        o->capacity[j] = (double)cap / v;
    }
}

gp_status gp_model_plan_placement(const gp_config *cfg, const gp_profile *prof,
                                  gp_schedule_kind kind, int v, gp_checkpoint_mode ckpt,
                                  int *balance)
{
    gp_config c = *cfg; /* (shallow: the schedule and the mode alone differ) */
    c.pipeline.schedule = kind;
    c.pipeline.virtual_stages = v;
    c.pipeline.checkpoint = ckpt;
    c.pipeline.lockstep = gp_config_lockstep_for(&cfg->pipeline, kind);
    gp_plan_opts po;
    gp_model_plan_opts(&c, v * cfg->pipeline.n_devices, &po);
    return gp_balance_plan(prof, &po, balance);
}

int gp_model_virtual(const gp_config *cfg)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    if (gp_schedule_v_shape(pc->schedule) && pc->schedule != GP_SCHEDULE_FILE_V) return 2;
    if (pc->schedule == GP_SCHEDULE_FILE || pc->schedule == GP_SCHEDULE_FILE_V)
        return pc->virtual_stages > 0 ? pc->virtual_stages : 1;
    return pc->schedule == GP_SCHEDULE_INTERLEAVED && pc->virtual_stages > 1 ? pc->virtual_stages
                                                                              : 1;
}

/* Every one of n stages needs a layer: said with the config's name. */
static gp_status enough_layers(const gp_config *cfg, int n)
{
    int L = cfg->model.n_layers;
    if (L >= 1 && L < n)
        return gp_error_set(GP_ERR_INVALID,
                            "%s: %d stages (pipeline.devices%s) for a model of %d layer%s: "
                            "every stage needs at least one layer; use at most %d stages",
                            cfg->path, n, gp_schedule_v_shape(cfg->pipeline.schedule) ? " x 2 (in a V)"
                                          : gp_model_virtual(cfg) > 1 ? " x pipeline.virtual" : "",
                            L, L == 1 ? "" : "s", L);
    return GP_OK;
}

gp_status gp_model_balance_flops(const gp_config *cfg, int n, int *balance)
{
    GP_TRY(enough_layers(cfg, n));
    int L = cfg->model.n_layers;
    double *costs = malloc((size_t)(L > 0 ? L : 1) * sizeof *costs);
    if (!costs) return gp_error_set(GP_ERR_OOM, "out of host memory");
    int64_t mb = gp_config_replica_batch(cfg) / cfg->pipeline.chunks;
    gp_status s = gp_model_costs(cfg, mb > 0 ? mb : 1, costs);
    if (s == GP_OK) {
        s = gp_schedule_v_shape(cfg->pipeline.schedule) && n % 2 == 0
                ? gp_partition_minmax_v(costs, L, n / 2, balance) /* 2 stages a device */
                : gp_partition_minmax(costs, L, n, balance);
        if (s == GP_ERR_INVALID) gp_error_wrap(s, "%s", cfg->path); /* name the config */
    }
    free(costs);
    return s;
}

/* ---- balance: auto's profiles, kept and reused ------------------------------
 *
 * A profile depends on the model, the batch, the device and the build; a
 * run that finds one taken for all of those reuses it instead of
 * profiling again.  The cache is GPIPE_PROFILE_CACHE's directory, else
 * $XDG_CACHE_HOME/gpipe/profiles, else ~/.cache/gpipe/profiles;
 * GPIPE_PROFILE_CACHE=off keeps none (the tests run so). */

static uint64_t fnv(uint64_t h, const char *s)
{
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* This machine's processor, as /proc/cpuinfo names it ("" if unknown). */
static void cpu_model(char *out, size_t len)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *c = strchr(line, ':');
        if (c) snprintf(out, len, "%.*s", (int)strcspn(c + 2, "\n"), c + 2);
        break;
    }
    if (f) fclose(f);
}

/* The cache file for a profile of cfg taken with po; false when there is
 * no cache (off, or no home). */
static bool profile_cache_path(const gp_config *cfg, const gp_profile_opts *po, char *path,
                               size_t len)
{
    const char *env = getenv("GPIPE_PROFILE_CACHE"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    char dir[1024];
    if (env && (!strcmp(env, "off") || !strcmp(env, "0") || !env[0])) return false;
    if (env) snprintf(dir, sizeof dir, "%s", env);
    else if (xdg && xdg[0]) snprintf(dir, sizeof dir, "%s/gpipe/profiles", xdg);
    else if (home && home[0]) snprintf(dir, sizeof dir, "%s/.cache/gpipe/profiles", home);
    else return false;
    char key[1536], cpu[256];
    cpu_model(cpu, sizeof cpu);
    snprintf(key, sizeof key, "gpipe %d.%d.%d built %s %s|model %016llx|%s threads %d contend "
             "%d precision %d deterministic %d|batch %lld chunks %d micro-batch %lld|optimizer "
             "%d loss %d %g|acts %d copies %d|cpu %s", GPIPE_VERSION_MAJOR, GPIPE_VERSION_MINOR,
             GPIPE_VERSION_PATCH, __DATE__, __TIME__,
             (unsigned long long)gp_profile_model_hash(cfg->model.layers, cfg->model.n_layers,
                                                       cfg->model.input),
             po->device, po->threads, po->contend, po->precision, (int)po->deterministic,
             (long long)po->batch, po->chunks, (long long)po->sizes[0], po->optim_slots,
             (int)po->loss, (double)po->label_smoothing, (int)gp_config_act_dtype(cfg),
             (int)gp_config_bf16_copies(cfg), cpu);
    snprintf(path, len, "%s/%016llx.json", dir,
             (unsigned long long)fnv(0xcbf29ce484222325ull, key));
    return strlen(dir) + 24 < len;
}

/* mkdir -p of path's directory; false if it cannot be made. */
static bool make_parent(const char *path)
{
    char d[1200];
    if (strlen(path) >= sizeof d) return false;
    memcpy(d, path, strlen(path) + 1);
    char *slash = strrchr(d, '/');
    if (!slash) return true;
    *slash = '\0';
    for (char *p = d + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(d, 0755) != 0 && errno != EEXIST) return false;
        *p = '/';
    }
    return mkdir(d, 0755) == 0 || errno == EEXIST;
}

/* The cached profile of cfg's model at path, checked as any input is
 * (issue 77); an error where it is unusable. */
static gp_status cached_profile(const gp_config *cfg, const gp_profile_opts *po,
                                const char *path, gp_profile *prof)
{
    gp_status s = gp_profile_load(path, prof);
    if (s == GP_OK)
        s = gp_profile_check_model(prof, path, cfg->model.layers, cfg->model.n_layers,
                                   cfg->model.input);
    if (s == GP_OK && (prof->n_sizes != 1 || prof->sizes[0] != po->sizes[0] || !prof->timed))
        s = gp_error_set(GP_ERR_INVALID, "another micro-batch size");
    if (s != GP_OK) {
        gp_profile_free(prof);
        return s;
    }
    gp_model_profile_facts(cfg, prof);
    return GP_OK;
}

gp_status gp_model_profile_cached(const gp_config *cfg, gp_profile *prof, bool *found)
{
    *found = false;
    gp_model_profile_opts mo = {.warmup = 1, .reps = 3, .timed = true};
    gp_profile_opts po;
    model_profile_opts(cfg, &mo, &po);
    char path[1200];
    if (!profile_cache_path(cfg, &po, path, sizeof path) || access(path, F_OK) != 0)
        return GP_OK;
    GP_TRY(cached_profile(cfg, &po, path, prof));
    *found = true;
    return GP_OK;
}

/* balance: auto's profile: the cached one where it fits this run, else
 * taken (and kept for the next run). */
static gp_status balance_profile(const gp_config *cfg, bool quiet, gp_profile *prof)
{
    gp_model_profile_opts mo = {.warmup = 1, .reps = 3, .timed = true, .say = !quiet};
    gp_profile_opts po;
    model_profile_opts(cfg, &mo, &po);
    char path[1200];
    bool cache = profile_cache_path(cfg, &po, path, sizeof path);
    if (cache && access(path, F_OK) == 0) {
        gp_status s = cached_profile(cfg, &po, path, prof);
        if (s == GP_OK) {
            if (!quiet)
                GP_INFO("balance: the profile of this model, batch, device and build from the "
                        "cache (%s; GPIPE_PROFILE_CACHE=off profiles afresh)", path);
            return GP_OK;
        }
        /* checked as any input is: a damaged or edited entry is said, and
         * replaced by the profile taken now (issue 77: one with a negative
         * time or first_trainable past the model changed the balance, one
         * with "batch": 1e300 stopped every run without naming the file) */
        GP_WARN("balance: the cached profile %s is not usable (%s); profiling again, and it "
                "will be replaced", path, gp_last_error());
        gp_error_clear();
    }
    GP_TRY(gp_model_profile(cfg, &mo, prof));
    if (cache) {
        if (make_parent(path) && gp_profile_save(prof, path) == GP_OK) {
            if (!quiet) GP_INFO("balance: the profile kept at %s for the next run", path);
        } else {
            GP_DEBUG("balance: could not keep the profile at %s: %s", path,
                     gp_last_error());
            gp_error_clear();
        }
    }
    return GP_OK;
}

gp_status gp_model_balance(const gp_config *cfg, int n, int *balance, bool quiet)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    int L = cfg->model.n_layers;
    if (pc->n_balance > 0) {
        if (pc->n_balance != n)
            return gp_error_set(GP_ERR_INVALID,
                                "%s: pipeline.balance has %d entries for %d stages; give one "
                                "layer count per stage", cfg->path, pc->n_balance, n);
        int64_t sum = 0; /* entries up to INT_MAX each: no wrap */
        for (int j = 0; j < n; j++) sum += pc->balance[j];
        if (sum != L)
            return gp_error_set(GP_ERR_INVALID,
                                "%s: pipeline.balance sums to %lld layers but the model has %d; "
                                "make the entries add up to %d, or use balance: auto",
                                cfg->path, (long long)sum, L, L);
        memcpy(balance, pc->balance, (size_t)n * sizeof *balance);
        return GP_OK;
    }
    if (n == 1 && L >= 1) { /* nothing to choose */
        balance[0] = L;
        return GP_OK;
    }
    gp_status s;
    /* the fast, deterministic path: estimated FLOPs, no memory limit */
    if (!strcmp(gp_model_balance_method(), "flops")) return gp_model_balance_flops(cfg, n, balance);
    GP_TRY(enough_layers(cfg, n));
    /* What gpipe-balance --by time does, with few repetitions so that start-up
     * stays quick: profile every layer at the configured micro-batch size
     * on stage 0's kind of device, then the exact min-max partition of the
     * stage times subject to each device's memory. */
    gp_profile prof;
    s = balance_profile(cfg, quiet, &prof);
    if (s != GP_OK) return s;
    gp_plan_opts po;
    gp_model_plan_opts(cfg, n, &po);
    s = gp_balance_plan(&prof, &po, balance);
    gp_profile_free(&prof);
    if (s != GP_OK) return gp_error_wrap(s, "%s: balance: auto", cfg->path);
    return GP_OK;
}

void gp_model_release(gp_model *m)
{
    if (!m) return;
    gp_gate_free(m->gate); /* a snapshot's copy of the state, first */
    gp_pipeline_destroy(m->pipe);
    gp_optim_destroy(m->optim);
    for (int k = 0; k < m->n_layers; k++) gp_layer_destroy(&m->layers[k]);
    free(m->layers);
    gp_skip_map_free(&m->skips);
    memset(m, 0, sizeof *m);
}

gp_gate *gp_model_gate(gp_model *m)
{
    if (!m->gate) m->gate = gp_gate_new();
    return m->gate;
}

int64_t gp_model_layer_padding(const gp_layer *l, int64_t *rows)
{
    int64_t n = 0, r = 0;
    bool emb = l->spec.type == GP_LAYER_EMBEDDING, lin = l->spec.type == GP_LAYER_LINEAR;
    if ((emb || lin) && l->spec.valid_rows > 0) {
        /* wte.weight or weight, then (linear) bias: rows of the first dimension */
        for (int p = 0; p < (emb ? 1 : l->n_params); p++) {
            const gp_tensor *t = &l->params[p].value;
            int64_t all = t->dims[0], pad = all - gp_layer_spec_valid_rows(&l->spec, all);
            if (p == 0) r = pad;
            if (!l->params[p].tied && all > 0) n += pad * (gp_tensor_numel(t) / all);
        }
    }
    if (rows) *rows = r;
    return n;
}

int64_t gp_model_layer_params(const gp_layer *l)
{
    /* a tied weight: its owner's; a padded vocabulary's rows: no one's */
    return gp_layer_param_count(l) - gp_layer_tied_count(l) - gp_model_layer_padding(l, NULL);
}

int64_t gp_model_param_count(const gp_model *m)
{
    int64_t n = 0;
    for (int k = 0; k < m->n_layers; k++) n += gp_model_layer_params(&m->layers[k]);
    return n;
}


typedef struct {
    int64_t params;
    gp_shape out;
} describe_arg;

static void describe_of(void *arg, int k, const gp_layer *l)
{
    (void)k;
    describe_arg *a = arg;
    a->params += gp_model_layer_params(l);
    a->out = l->out_shape;
}

gp_status gp_model_describe(const gp_config *cfg, int64_t *params, gp_shape *output)
{
    describe_arg a = {0};
    GP_TRY(each_layer(cfg, true, describe_of, &a));
    *params = a.params;
    *output = a.out;
    return loss_takes_output(cfg, &a.out);
}

gp_status gp_model_count_params(const gp_config *cfg, int64_t *count)
{
    gp_shape out;
    *count = 0;
    return gp_model_describe(cfg, count, &out);
}

gp_status gp_model_pipeline_step_one(gp_model *m, const gp_config *cfg, const float *x,
                                     const float *y, int64_t n, double lr, gp_step_stats *st)
{
    GP_ASSERT(m->n_replicas <= 1);
    m->refused = true; /* (an error before the step runs changes nothing) */
    if (!m->pipe) {
        gp_pipeline_opts po = gp_model_pipeline_opts(m, cfg);
        po.state_gate = gp_model_gate(m);
        if (!po.state_gate) return gp_error_set(GP_ERR_OOM, "out of host memory");
        GP_TRY(gp_pipeline_create(m->layers, m->n_layers, &m->input, m->n_stages, m->devs,
                                  m->balance, &po, &m->pipe));
    }
    if (m->fail_next) gp_pipeline_set_fault(m->pipe, 0, 0, GP_INSTR_FORWARD);
    m->fail_next = false;
    gp_pipeline_out po;
    gp_pipeline_set_device_time(m->pipe, m->device_time);
    gp_status s = gp_pipeline_step(m->pipe, x, y, n, cfg->train.seed, (uint64_t)m->step, lr, &po);
    m->refused = s != GP_OK && gp_pipeline_step_untouched(m->pipe);
    GP_TRY(s);
    m->step++;
    if (st) {
        *st = gp_step_stats_of(po.loss_sum, po.correct, po.count, n, lr, po.seconds, 0);
        st->grad_norm = po.grad_norm;
        gp_step_stats_bubble(st, &po);
    }
    return GP_OK;
}

void gp_step_stats_bubble(gp_step_stats *st, const gp_pipeline_out *po)
{
    st->n_devices = po->n;
    st->window = po->window;
    st->bubble = po->bubble;
    for (int d = 0; d < po->n; d++) st->busy[d] = po->busy[d];
}

/* Upload samples [first, first+n) of a host batch to device tensors: the
 * inputs, and their targets as the loss takes them (n class ids, or the
 * output's shape for n samples). */
static gp_status upload_chunk(gp_model *m, const float *x, const float *y, int64_t first,
                              int64_t n, gp_tensor *xt, gp_tensor *yt)
{
    gp_shape xs = gp_shape_with_batch(&m->input, n);
    gp_shape ys = gp_loss_targets_shape(m->loss, &m->output, n);
    int64_t per = gp_shape_numel(&m->input), t = m->targets;
    GP_ASSERT(gp_shape_numel(&ys) == n * t);
    GP_TRY(gp_tensor_alloc(xt, m->dev, &xs, GP_MEM_ACTIVATIONS));
    gp_status s = gp_tensor_alloc(yt, m->dev, &ys, GP_MEM_ACTIVATIONS);
    if (s == GP_OK) s = gp_dev_upload(m->dev, gp_f32(xt), x + first * per, n * per);
    if (s == GP_OK) s = gp_dev_upload(m->dev, gp_f32(yt), y + first * t, n * t);
    if (s != GP_OK) {
        gp_tensor_free(xt);
        gp_tensor_free(yt);
    }
    return s;
}

/* The end of a step once its gradients are final: the update, the tied
 * replicas from their owners, and the check that every parameter is
 * finite, as a pipeline stage checks: the update checks what it writes in
 * its own pass, one batched check reads the rest (running statistics,
 * tied replicas) into the same flag, and one read of the flag waits for it
 * all; only a flag found set reads the tensors one by one, to name the
 * first bad one. */
static gp_status after_step(gp_model *m, double lr, float clip)
{
    int L = m->n_layers;
    float *flag = NULL, hflag = 0.0f;
    GP_TRY(gp_dev_alloc(m->dev, sizeof *flag, GP_MEM_WORKSPACE, (void **)&flag));
    gp_status s = gp_dev_fill(m->dev, flag, 0.0f, 1);
    if (s == GP_OK) s = gp_optim_update(m->optim, 0, L, lr, m->step, 0, 1, m->dev, flag, clip);
    if (s == GP_OK) s = gp_layers_tie_sync(m->layers, L); /* the updated owners */
    if (s == GP_OK) s = gp_layers_flag_nonfinite(m->layers, L, m->dev, flag, true);
    for (int k = 0; k < L && s == GP_OK; k++) /* (a layer on another device: its own check) */
        if (!m->layers[k].meta && m->layers[k].dev != m->dev)
            s = gp_layer_check_finite(&m->layers[k], "after the step");
    if (s == GP_OK) s = gp_dev_download(m->dev, &hflag, flag, 1); /* (waits for the queue) */
    gp_dev_free(m->dev, flag, sizeof *flag, GP_MEM_WORKSPACE);
    if (s != GP_OK || hflag == 0.0f) return s;
    GP_TRY(gp_layers_name_nonfinite(m->layers, L, "after the step"));
    return gp_error_set(GP_ERR_NUMERIC, "a parameter is NaN or Inf after the step, but no "
                        "tensor read one by one is: the device's check and the host's disagree");
}

/* The single-device reference step.  It runs GPipe's order on one device
 * without threads: every micro-batch's forward (keeping its activations),
 * then the backwards from the last micro-batch to the first.  Gradients
 * therefore accumulate in the same order as on every pipeline stage, which
 * makes pipelined runs comparable bit for bit.  The whole model is one
 * stage here: the same loops (checkpoint.h) over all of its layers. */
gp_status gp_model_train_step(gp_model *m, const gp_config *cfg, const float *x,
                              const float *y, int64_t n, int chunks, double lr,
                              gp_step_stats *st)
{
    double t0 = gp_now();
    int64_t sizes[GP_MAX_CHUNKS], offs[GP_MAX_CHUNKS];
    m->refused = true; /* (an error before the step runs changes nothing) */
    GP_TRY(gp_microbatch_split(n, chunks, sizes));
    int L = m->n_layers;
    for (int k = 0; k < L; k++) gp_layer_grads_begin(&m->layers[k]);
    gp_stash *mbs = calloc((size_t)chunks, sizeof *mbs);
    gp_tensor *dy = calloc((size_t)chunks, sizeof *dy);
    gp_status s = mbs && dy ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory");
    int ft = gp_layers_first_trainable(m->layers, L), bad = -1, at = 0;
    double loss_sum = 0;
    int64_t correct = 0, count = 0, first = 0;
    /* the mean over every target of the batch (as the pipeline's last stage) */
    float scale = (float)(1.0 / ((double)n * (double)m->targets));
    /* as on a pipeline stage: the forwards and backwards never write the
     * weights, so the backend may keep its converted copies of them and
     * hold the gradients it sums (gp_dev_freeze_weights); the thaw below,
     * before anything reads a gradient, adds those in, the same bits */
    gp_dev_freeze_weights(m->dev, true);
    for (int i = 0; i < chunks && s == GP_OK; i++, at = i) {
        gp_tensor labels = {0};
        offs[i] = first;
        s = gp_stash_init(&mbs[i], L, &m->skips, 0);
        if (s == GP_OK) s = upload_chunk(m, x, y, first, sizes[i], &mbs[i].in, &labels);
        gp_fwd_ctx ctx = {.training = true, .seed = cfg->train.seed, .step = (uint64_t)m->step,
                          .sample_offset = first, .batch_total = n, .step_micro = chunks};
        gp_loss_out lo = {0};
        if (s == GP_OK) s = gp_ckpt_forward(m->layers, &ctx, GP_FWD_KEEP, &mbs[i], &bad);
        if (s == GP_OK)
            s = gp_ckpt_loss(m->dev, m->loss, m->label_smoothing, m->classes, &mbs[i].out,
                             &labels, scale, &dy[i], &lo);
        gp_tensor_free(&labels);
        loss_sum += lo.loss_sum;
        correct += lo.correct;
        count += lo.count;
        first += sizes[i];
    }
    /* backwards in the order the pipeline's schedule runs them on every
     * stage, in halves where it splits them */
    gp_schedule_kind sk = cfg->pipeline.schedule;
    bool up = gp_schedule_backward_ascending(sk), split = gp_schedule_splits_backward(sk);
    for (int q = 0; q < chunks && s == GP_OK; q++) {
        int i = up ? q : chunks - 1 - q;
        at = i;
        gp_fwd_ctx ctx = {.training = true, .seed = cfg->train.seed, .step = (uint64_t)m->step,
                          .sample_offset = offs[i], .batch_total = n};
        if (split) { /* the two halves, as a zero-bubble stage runs them */
            s = gp_ckpt_backward_data(m->layers, &ctx, &mbs[i], &dy[i], ft, NULL, &bad);
            if (s == GP_OK) s = gp_ckpt_backward_weights(m->layers, &ctx, &mbs[i], ft, false, &bad);
            continue;
        }
        s = gp_ckpt_backward(m->layers, &ctx, &mbs[i], &dy[i], ft, NULL, &bad);
    }
    gp_status thawed = gp_dev_freeze_weights(m->dev, false);
    if (s == GP_OK) s = thawed;
    if (s != GP_OK) {
        char d[160];
        gp_error_wrap(s, "step %lld, micro-batch %d%s%s", (long long)m->step, at,
                      bad >= 0 ? ", " : "",
                      bad >= 0 ? gp_layer_describe(&m->layers[bad], d, sizeof d) : "");
    }
    for (int i = 0; mbs && dy && i < chunks; i++) {
        gp_stash_destroy(&mbs[i]);
        gp_tensor_free(&dy[i]);
    }
    free(mbs);
    free(dy);
    for (int k = 0; k < L && s == GP_OK; k++) s = gp_layer_grads_finish(&m->layers[k]);
    /* tied weights: the replicas' gradients into their owners', in layer
     * order, as the pipeline sums them after its barrier */
    if (s == GP_OK) s = gp_layers_tie_grads(m->layers, L);
    /* clipping first: gradients that are not finite stop the step before
     * the batch-norm statistics are committed (as the pipeline's CLIP does) */
    double norm = NAN;
    float clip = 0.0f; /* applied in the update's pass, as the pipeline's UPDATE does */
    if (s == GP_OK && cfg->train.clip_grad_norm > 0)
        s = gp_clip_grad_factor(m->layers, L, cfg->train.clip_grad_norm, &norm, &clip);
    /* nothing committed or updated yet: whatever failed so far (a NaN loss,
     * which this step checks per micro-batch, gradients clipping found not
     * finite, out of memory) left the model as it was */
    m->refused = s != GP_OK;
    gp_gate_wait(m->gate); /* a snapshot's copy of the state in the background */
    if (s == GP_OK) s = gp_layers_commit(m->layers, L, m->dev, NULL);
    if (s == GP_OK) s = after_step(m, lr, clip);
    if (s != GP_OK) {
        gp_layers_discard(m->layers, L); /* a failed step's statistics */
        return s;
    }
    m->step++;
    if (st) {
        *st = gp_step_stats_of(loss_sum, correct, count, n, lr, gp_now() - t0, 0);
        st->grad_norm = norm;
    }
    return GP_OK;
}

int gp_model_stage_of(const gp_model *m, int k)
{
    int j = 0, first = 0;
    while (j + 1 < m->n_stages && first + m->balance[j] <= k) first += m->balance[j++];
    return j;
}

int gp_model_layer_rank(const gp_model *m, int k)
{
    return m->local_device < 0 ? 0 : m->dev_of[gp_model_stage_of(m, k)];
}

gp_status gp_model_tie_sync(gp_model *m)
{
    GP_TRY(gp_layers_tie_sync(m->layers, m->n_layers)); /* the ties within this process */
    if (m->local_device < 0) return GP_OK;
    int me = gp_procs_rank();
    for (int k = 0; k < m->n_layers; k++) {
        gp_layer *l = &m->layers[k];
        for (int q = 0; q < l->n_params; q++) {
            gp_param *r = &l->params[q];
            if (!r->tied) continue;
            int ro = m->rank_base + gp_model_layer_rank(m, r->tie_layer);
            int rr = m->rank_base + gp_model_layer_rank(m, k);
            if (ro == rr || (me != ro && me != rr)) continue;
            /* tag 0 between the two, in layer order (as the snapshot's parts) */
            gp_tensor *v = me == ro ? &m->layers[r->tie_layer].params[r->tie_param].value
                                    : &r->value;
            int64_t n = gp_tensor_numel(v);
            float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
            if (!h) return gp_error_set(GP_ERR_OOM, "out of host memory");
            gp_status s = GP_OK;
            if (me == ro) {
                s = gp_dev_download(v->dev, h, gp_f32(v), n);
                if (s == GP_OK) s = gp_dev_synchronize(v->dev);
                if (s == GP_OK) s = gp_procs_send_bytes(h, (size_t)n * sizeof *h, rr, 0);
            } else {
                s = gp_procs_recv_bytes(h, (size_t)n * sizeof *h, ro, 0);
                if (s == GP_OK) s = gp_dev_upload(v->dev, gp_f32(v), h, n);
                if (s == GP_OK) s = gp_dev_synchronize(v->dev);
            }
            free(h);
            GP_TRY(s);
        }
    }
    return GP_OK;
}

/* t rounded to bfloat16 in place, on its device (pipeline.copy_precision:
 * evaluation moves FP32 between stages, and rounds where training's
 * copies do, so it evaluates the network that was trained). */
gp_status gp_tensor_round_bf16(gp_tensor *t)
{
    int64_t n = gp_tensor_numel(t);
    size_t bytes = (size_t)((n + 1) / 2) * sizeof(float);
    void *pk = NULL;
    if (n == 0) return GP_OK;
    GP_TRY(gp_dev_alloc(t->dev, bytes, GP_MEM_COPIES, &pk));
    gp_status s = gp_dev_bf16_pack(t->dev, pk, gp_f32(t), n);
    if (s == GP_OK) s = gp_dev_bf16_unpack(t->dev, gp_f32(t), pk, n);
    gp_dev_free(t->dev, pk, bytes, GP_MEM_COPIES);
    return s;
}

gp_status gp_tensor_move(gp_tensor *t, gp_device *dev)
{
    if (t->dev == dev) return GP_OK;
    gp_tensor n;
    gp_shape sh = gp_tensor_shape(t);
    GP_TRY(gp_tensor_alloc_as(&n, dev, &sh, t->dtype, GP_MEM_COPIES));
    gp_status s = gp_tensor_copy(&n, t);
    gp_tensor_free(t);
    *t = n;
    if (s != GP_OK) gp_tensor_free(t);
    return s;
}

gp_status gp_tensor_download_f32(const gp_tensor *t, float *dst)
{
    int64_t k = gp_tensor_numel(t);
    if (t->dtype == GP_F32) return gp_dev_download(t->dev, dst, gp_f32(t), k);
    gp_tensor w;
    gp_shape sh = gp_tensor_shape(t);
    GP_TRY(gp_tensor_alloc(&w, t->dev, &sh, GP_MEM_COPIES));
    gp_status s = gp_dev_bf16_unpack(t->dev, gp_f32(&w), gp_tensor_mem(t), k);
    if (s == GP_OK) s = gp_dev_download(w.dev, dst, gp_f32(&w), k);
    gp_tensor_free(&w);
    return s;
}

/* What evaluation reads: a dataset, or the caller's batch of normalised
 * inputs and targets (host: x (n, C, H, W), y m->targets per sample). */
typedef struct {
    const gp_dataset *ds;
    const float *x, *y;
    int64_t n;
} eval_source;

/* One evaluation: what it reads, the buffers its batches are assembled
 * in, what is on its way between stages, and the sums it scores.  Each
 * batch runs stage after stage (eval_batch: eval_inputs, then eval_stage
 * per stage, then eval_score); under mpirun each rank runs its own stages
 * and passes activations and skips on as messages (tag 1, skip t 2 + t:
 * in order between two ranks), and the last stage's rank scores. */
typedef struct eval_run {
    gp_model *m;
    const gp_config *cfg;
    const eval_source *src;
    int64_t bs;             /* samples per batch */
    int64_t per, tps;       /* input floats and targets per sample */
    int64_t total;          /* samples evaluated */
    bool masks;             /* binary cross-entropy against the dataset's masks */
    bool bf16;              /* pipeline.copy_precision: rounded where stages meet */
    bool procs;             /* under mpirun: this rank runs its stages only */
    /* a dataset's batch, assembled here (NULL: read in place from the
     * caller's arrays) */
    float *x, *y;
    float mean[GP_MAX_CHANNELS], std[GP_MAX_CHANNELS];
    gp_loader *ld;          /* an image folder's decoding threads, or NULL */
    gp_tensor *pend;        /* (skips.n) skips on their way from one stage to a later one */
    /* processes: a batch's sends in flight, at most every skip and one
     * activation per stage */
    gp_tensor *sent;
    gp_procs_req *reqs;
    int n_sent;
    double loss_sum;        /* the scores so far (the last stage's rank's) */
    int64_t correct, count;
    float *logits;          /* forward only (gp_model_forward_host): each batch's
                               outputs go here, (total, output) FP32, unscored */
} eval_run;

static void eval_free(eval_run *e)
{
    free(e->sent);
    free(e->reqs);
    free(e->x);
    free(e->y);
    free(e->pend);
}

/* The targets checked against the model's output, and the host buffers
 * an evaluation needs (nothing to free when it fails). */
static gp_status eval_alloc(eval_run *e)
{
    gp_model *m = e->m;
    const gp_dataset *ds = e->src->ds;
    if (e->tps != m->targets) {
        char b[64];
        return gp_error_set(GP_ERR_INVALID, "%s: the model's output %s has %lld element%s per "
                            "sample but %s has %lld target%s per sample for %s", e->cfg->path,
                            gp_shape_str(&m->output, b, sizeof b), (long long)m->targets,
                            m->targets == 1 ? "" : "s", ds->source, (long long)e->tps,
                            e->tps == 1 ? "" : "s", gp_loss_name(m->loss));
    }
    /* the batches are assembled here from a dataset, read in place from
     * the caller's arrays */
    e->x = ds ? malloc((size_t)(e->bs * e->per) * sizeof *e->x) : NULL;
    e->y = ds ? malloc((size_t)(e->bs * e->tps) * sizeof *e->y) : NULL;
    e->pend = calloc((size_t)(m->skips.n ? m->skips.n : 1), sizeof *e->pend);
    if ((ds && (!e->x || !e->y)) || !e->pend) {
        eval_free(e);
        return gp_error_set(GP_ERR_OOM, "out of host memory for evaluation batches");
    }
    if (ds) gp_data_norm(&e->cfg->data, ds->c, e->mean, e->std);
    int max_sent = m->skips.n + m->n_stages;
    e->sent = e->procs ? calloc((size_t)max_sent, sizeof *e->sent) : NULL;
    e->reqs = e->procs ? calloc((size_t)max_sent, sizeof *e->reqs) : NULL;
    if (e->procs && (!e->sent || !e->reqs)) {
        eval_free(e);
        return gp_error_set(GP_ERR_OOM, "out of host memory for evaluation batches");
    }
    return GP_OK;
}

/* An image folder is decoded (Resize + CenterCrop) by the loader's
 * threads, in file order; in-memory data is assembled by eval_inputs. */
static gp_status eval_start_loader(eval_run *e)
{
    const gp_dataset *ds = e->src->ds;
    const gp_config *cfg = e->cfg;
    if (!ds || !ds->folder) return GP_OK;
    gp_loader_opts o = {.batch_size = e->bs, .shuffle = false, .augment = false,
                        .masks = e->masks, .prefetch = 2, .seed = cfg->train.seed,
                        .workers = gp_data_workers(cfg),
                        /* processes: only stage 0's rank needs the images */
                        .labels_only = e->procs && e->m->local_device > 0 &&
                                       !cfg->data.skip_bad_files};
    return gp_loader_create(ds, &cfg->data, &o, &e->ld);
}

/* Batch bi's inputs and targets on the host (*n samples from sample b0):
 * the caller's arrays, the loader's batch, or assembled from the dataset. */
static gp_status eval_inputs(eval_run *e, int64_t b0, int64_t *n, const float **bx,
                             const float **by)
{
    const gp_dataset *ds = e->src->ds;
    *bx = e->x;
    *by = e->y;
    if (!ds) {
        *bx = e->src->x + b0 * e->per;
        *by = e->src->y + b0 * e->tps;
    } else if (e->ld) {
        gp_batch b;
        GP_TRY(gp_loader_next(e->ld, &b));
        *bx = b.x;
        *by = b.y;
        *n = b.n;
    } else {
        gp_data_assemble(ds, b0, *n, e->cfg->data.normalize, e->mean, e->std, e->masks, e->x,
                         e->y);
    }
    return GP_OK;
}

/* The skips that arrive at stage j, moved from the stage that stashed
 * them (processes: received from its rank when another runs it). */
static gp_status eval_skips_arrive(eval_run *e, gp_stash *st, int j, int64_t n)
{
    gp_model *m = e->m;
    gp_status s = GP_OK;
    for (int t = 0; t < m->skips.n && s == GP_OK; t++) {
        if (gp_stash_skip_role(st, t) != GP_SKIP_ARRIVES) continue;
        int from = m->skips.skips[t].from, a = gp_model_stage_of(m, from);
        if (e->procs && m->dev_of[a] != m->local_device) {
            gp_shape ks = gp_shape_with_batch(&m->layers[from].out_shape, n);
            s = gp_tensor_alloc_as(&st->skip_in[t], m->devs[j], &ks, m->layers[from].out_dtype,
                                   GP_MEM_COPIES);
            if (s == GP_OK)
                s = gp_procs_recv_dev(m->devs[j], (float *)gp_tensor_mem(&st->skip_in[t]),
                                      gp_tensor_words(&st->skip_in[t]),
                                      m->rank_base + m->dev_of[a], 2 + t);
            continue;
        }
        gp_shape ks = gp_tensor_shape(&e->pend[t]);
        s = gp_tensor_alloc_as(&st->skip_in[t], m->devs[j], &ks, e->pend[t].dtype, GP_MEM_COPIES);
        if (s == GP_OK) s = gp_tensor_copy(&st->skip_in[t], &e->pend[t]);
        gp_tensor_free(&e->pend[t]);
    }
    return s;
}

/* Processes: stage j's skips and output sent on to the ranks of the
 * stages after, not waiting: a rank may take them in another order. */
static gp_status eval_send_on(eval_run *e, int j, gp_tensor *cur)
{
    gp_model *m = e->m;
    gp_status s = GP_OK;
    for (int t = 0; t < m->skips.n && s == GP_OK; t++) {
        int b = gp_model_stage_of(m, m->skips.skips[t].to);
        if (!gp_tensor_mem(&e->pend[t]) || m->dev_of[b] == m->local_device) continue;
        e->sent[e->n_sent] = e->pend[t];
        e->pend[t] = (gp_tensor){0};
        s = gp_procs_isend_dev(e->sent[e->n_sent].dev, (float *)gp_tensor_mem(&e->sent[e->n_sent]),
                               gp_tensor_words(&e->sent[e->n_sent]),
                               m->rank_base + m->dev_of[b], 2 + t, &e->reqs[e->n_sent]);
        e->n_sent++;
    }
    if (s == GP_OK && j + 1 < m->n_stages && m->dev_of[j + 1] != m->local_device) {
        e->sent[e->n_sent] = *cur;
        *cur = (gp_tensor){0};
        s = gp_procs_isend_dev(e->sent[e->n_sent].dev, (float *)gp_tensor_mem(&e->sent[e->n_sent]),
                               gp_tensor_words(&e->sent[e->n_sent]),
                               m->rank_base + m->dev_of[j + 1], 1, &e->reqs[e->n_sent]);
        e->n_sent++;
    }
    return s;
}

/* Stage j (its layers from `first`) forward on its device: *cur, the
 * previous stage's output (processes: received from its rank), in; its
 * output out, the skips it stashes into e->pend. */
static gp_status eval_stage(eval_run *e, int j, int first, const gp_fwd_ctx *ctx, int64_t n,
                            gp_tensor *cur)
{
    gp_model *m = e->m;
    gp_status s = GP_OK;
    if (e->procs && j > 0 && m->dev_of[j - 1] != m->local_device) {
        /* the previous stage's output, from its rank */
        gp_tensor_free(cur);
        gp_shape cs = gp_shape_with_batch(&m->layers[first].in_shape, n);
        s = gp_tensor_alloc_as(cur, m->devs[j], &cs, m->layers[first - 1].out_dtype,
                               GP_MEM_COPIES);
        if (s == GP_OK)
            s = gp_procs_recv_dev(m->devs[j], (float *)gp_tensor_mem(cur), gp_tensor_words(cur),
                                  m->rank_base + m->dev_of[j - 1], 1);
    }
    if (s != GP_OK) return s;
    gp_stash st;
    s = gp_stash_init(&st, m->balance[j], &m->skips, first);
    if (s != GP_OK) return s; /* (*cur stays the caller's to free: a failed stash holds none) */
    s = eval_skips_arrive(e, &st, j, n);
    /* a stage boundary: the activation moved to the next device */
    if (s == GP_OK) s = gp_tensor_move(cur, m->devs[j]);
    st.in = *cur;
    *cur = (gp_tensor){0};
    if (e->bf16 && j > 0) { /* what crossed a stage boundary, as training sees it */
        if (s == GP_OK) s = gp_tensor_round_bf16(&st.in);
        for (int t = 0; t < m->skips.n && s == GP_OK; t++)
            if (gp_stash_skip_role(&st, t) == GP_SKIP_ARRIVES) s = gp_tensor_round_bf16(&st.skip_in[t]);
    }
    int bad;
    if (s == GP_OK) s = gp_ckpt_forward(m->layers + first, ctx, GP_FWD_NOTHING, &st, &bad);
    if (s == GP_OK) {
        *cur = st.out;
        st.out = (gp_tensor){0};
        for (int t = 0; t < m->skips.n; t++)
            if (gp_stash_skip_role(&st, t) == GP_SKIP_LEAVES) {
                e->pend[t] = st.skip_out[t];
                st.skip_out[t] = (gp_tensor){0};
            }
    }
    gp_stash_destroy(&st);
    if (e->procs && s == GP_OK) s = eval_send_on(e, j, cur);
    return s;
}

/* The batch's loss and correct predictions added to the sums, with the
 * labels moved to the output's device first. */
static gp_status eval_score(eval_run *e, gp_status s, gp_tensor *cur, gp_tensor *labels)
{
    gp_loss_out lo = {0};
    if (s == GP_OK && labels->dev != cur->dev) {
        gp_tensor l2;
        gp_shape lsh = gp_tensor_shape(labels);
        s = gp_tensor_alloc(&l2, cur->dev, &lsh, GP_MEM_COPIES);
        if (s == GP_OK) s = gp_tensor_copy(&l2, labels);
        gp_tensor_free(labels);
        *labels = l2;
    }
    if (s == GP_OK)
        s = gp_loss(cur->dev, e->m->loss, e->m->label_smoothing, e->m->classes, cur, labels, 1.0f,
                    NULL, &lo);
    e->loss_sum += lo.loss_sum;
    e->correct += lo.correct;
    e->count += lo.count;
    return s;
}

/* Forward only: the last stage's output of the batch of n samples from
 * sample b0 to the host, widened to FP32 where it is bf16. */
static gp_status eval_logits(eval_run *e, gp_tensor *cur, int64_t b0, int64_t n)
{
    int64_t per = gp_shape_numel(&e->m->output);
    GP_ASSERT(gp_tensor_numel(cur) == n * per);
    return gp_tensor_download_f32(cur, e->logits + b0 * per);
}

/* Batch bi through every stage (this rank's, under mpirun), scored by the
 * last stage's. */
static gp_status eval_batch(eval_run *e, int64_t bi)
{
    gp_model *m = e->m;
    int64_t b0 = bi * e->bs, n = e->total - b0 < e->bs ? e->total - b0 : e->bs;
    const float *bx, *by;
    gp_status s = eval_inputs(e, b0, &n, &bx, &by);
    if (s != GP_OK) return s;
    gp_tensor cur = {0}, labels = {0};
    /* the targets checked on the host, as a step checks them: a bad one is
     * named by its row of the whole evaluation, not of a batch */
    gp_shape os = gp_shape_with_batch(&m->output, n);
    if (s == GP_OK && (m->loss != GP_LOSS_CROSS_ENTROPY || os.ndim == 2 || os.ndim == 3))
        s = gp_loss_check_targets(m->loss, m->classes, by, &os, b0);
    /* processes: the inputs are stage 0's rank's, the labels the last
     * stage's */
    if (s == GP_OK && (!e->procs || m->local_device == 0 ||
                       m->dev_of[m->n_stages - 1] == m->local_device))
        s = upload_chunk(m, bx, by, 0, n, &cur, &labels);
    gp_fwd_ctx ctx = {.training = false, .seed = e->cfg->train.seed, .step = (uint64_t)m->step,
                      .sample_offset = 0, .batch_total = n};
    for (int j = 0, first = 0; j < m->n_stages && s == GP_OK; first += m->balance[j++]) {
        if (e->procs && m->dev_of[j] != m->local_device) continue; /* another rank's */
        s = eval_stage(e, j, first, &ctx, n, &cur);
    }
    for (int q = 0; q < e->n_sent; q++) { /* this batch's sends done, their tensors freed */
        gp_status ws = gp_procs_wait(&e->reqs[q]);
        if (s == GP_OK) s = ws;
        gp_tensor_free(&e->sent[q]);
    }
    e->n_sent = 0;
    /* the loss is the last stage's rank's */
    if (e->logits && s == GP_OK)
        s = eval_logits(e, &cur, b0, n);
    else if (!e->logits && (!e->procs || m->dev_of[m->n_stages - 1] == m->local_device))
        s = eval_score(e, s, &cur, &labels);
    gp_tensor_free(&cur);
    gp_tensor_free(&labels);
    for (int t = 0; t < m->skips.n; t++) gp_tensor_free(&e->pend[t]);
    return s;
}

/* Processes: every rank's answer is the last stage's rank's sums; the
 * other ranks wait for this one's messages, so a failure here cannot be
 * told to them, only end them all. */
static gp_status eval_agree(eval_run *e, gp_status s)
{
    gp_model *m = e->m;
    if (!e->procs) return s;
    if (s != GP_OK) {
        /* (evaluate_fit halves the batch where one does not fit; ranks
         * that wait for this one's messages cannot retry with it) */
        if (s == GP_ERR_OOM)
            gp_error_wrap(s, "evaluating in batches of %lld samples: under mpirun evaluation "
                          "cannot halve its batch by itself; set train.eval_batch_size to %lld "
                          "or less", (long long)e->bs, (long long)(e->bs > 1 ? e->bs / 2 : 1));
        gp_procs_fail(s);
    }
    int last = m->dev_of[m->n_stages - 1];
    double v[4] = {e->loss_sum, (double)e->correct, (double)e->count, (double)s};
    gp_status got = gp_procs_bcast(v, sizeof v, last);
    if (s == GP_OK) s = got;
    e->loss_sum = v[0];
    e->correct = (int64_t)v[1];
    e->count = (int64_t)v[2];
    if (s == GP_OK && v[3] != 0)
        s = gp_error_set((gp_status)v[3], "evaluation failed on rank %d (its message "
                         "says why)", last);
    return s;
}

/* The mean loss and the accuracy over src, in batches of bs. */
static gp_status evaluate_at(gp_model *m, const gp_config *cfg, const eval_source *src,
                             int64_t bs, double *loss, double *accuracy, float *logits)
{
    const gp_dataset *ds = src->ds;
    /* binary cross-entropy against masks where the data has them; the
     * loss checks that there is one target per output element */
    bool masks = ds && m->loss == GP_LOSS_BCE_WITH_LOGITS && gp_dataset_has_masks(ds);
    eval_run e = {.m = m, .cfg = cfg, .src = src, .bs = bs, .masks = masks,
                  .per = ds ? ds->c * ds->h * ds->w : gp_shape_numel(&m->input),
                  .tps = !ds ? m->targets : masks ? ds->h * ds->w : ds->tokens ? ds->c : 1,
                  .total = ds ? ds->n : src->n, .bf16 = gp_config_bf16_copies(cfg),
                  .procs = m->local_device >= 0, .logits = logits};
    GP_TRY(eval_alloc(&e));
    gp_status s = eval_start_loader(&e);
    int64_t n_batches = e.ld ? gp_loader_batches_per_epoch(e.ld) : (e.total + bs - 1) / bs;
    for (int64_t bi = 0; bi < n_batches && s == GP_OK; bi++) s = eval_batch(&e, bi);
    gp_loader_destroy(e.ld);
    s = eval_agree(&e, s);
    eval_free(&e);
    if (s != GP_OK) return s;
    *loss = e.loss_sum / (double)(e.count ? e.count : 1);
    *accuracy = (double)e.correct / (double)(e.count ? e.count : 1);
    return GP_OK;
}

/* Evaluation batches are train.eval_batch_size, which does not take part
 * in training's memory: where one does not fit a device (a capacity, a
 * GPU's memory), evaluation halves it until it does, says so once, and
 * keeps the size that fitted.  Every allocation of a failed try is freed
 * before the next.  Processes cannot retry together (a rank that ran out
 * stops them all), so there the error says what to set. */
static gp_status evaluate_fit(gp_model *m, const gp_config *cfg, const eval_source *src,
                              double *loss, double *accuracy, float *logits)
{
    int64_t want = cfg->train.eval_batch_size > 0 ? cfg->train.eval_batch_size
                   : cfg->train.batch_size > 0              ? cfg->train.batch_size
                                                            : 64;
    int64_t bs = m->eval_batch > 0 && m->eval_batch < want ? m->eval_batch : want;
    /* the caller's batch, or the test set, is all there is: the messages
     * below name the batch that ran */
    int64_t all = src->ds ? src->ds->n : src->n;
    if (all >= 1 && all < bs) bs = all;
    bool procs = m->local_device >= 0, halved = false;
    for (;;) {
        gp_status s = evaluate_at(m, cfg, src, bs, loss, accuracy, logits);
        if (s == GP_OK) {
            if (halved) m->eval_batch = bs; /* what fits, for the next evaluations */
            return GP_OK;
        }
        if (s != GP_ERR_OOM || bs <= 1 || procs)
            return s == GP_ERR_OOM
                       ? gp_error_wrap(s, "evaluating in batches of %lld samples (set "
                                          "train.eval_batch_size lower)", (long long)bs)
                       : s;
        char why[512];
        snprintf(why, sizeof why, "%s", gp_last_error());
        gp_error_clear();
        bs = (bs + 1) / 2;
        halved = true;
        GP_WARN("an evaluation batch did not fit (%s); evaluating in batches of %lld instead "
                "(set train.eval_batch_size to choose)", why, (long long)bs);
    }
}

gp_status gp_model_evaluate(gp_model *m, const gp_config *cfg, const gp_dataset *ds,
                            double *loss, double *accuracy)
{
    eval_source src = {.ds = ds};
    return evaluate_fit(m, cfg, &src, loss, accuracy, NULL);
}

gp_status gp_model_evaluate_host(gp_model *m, const gp_config *cfg, const float *x,
                                 const float *y, int64_t n, double *loss, double *accuracy)
{
    GP_ASSERT(n >= 1 && x && y); /* (the API checks its caller's batch) */
    eval_source src = {.x = x, .y = y, .n = n};
    return evaluate_fit(m, cfg, &src, loss, accuracy, NULL);
}

gp_status gp_model_forward_host(gp_model *m, const gp_config *cfg, const float *x, int64_t n,
                                float *out)
{
    GP_ASSERT(n >= 1 && x && out);
    if (m->local_device >= 0)
        return gp_error_set(GP_ERR_UNSUPPORTED, "a forward pass to the host runs in one "
                            "process: run it without mpirun");
    /* the targets upload_chunk moves are not read: class 0 everywhere */
    float *y = calloc((size_t)(n * m->targets), sizeof *y);
    if (!y) return gp_error_set(GP_ERR_OOM, "out of host memory");
    eval_source src = {.x = x, .y = y, .n = n};
    double loss, acc;
    gp_status s = evaluate_fit(m, cfg, &src, &loss, &acc, out);
    free(y);
    return s;
}
