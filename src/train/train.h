/*
 * train.h — from a run spec to a trained model: the sequential model, the
 * optimizer and learning-rate schedule, one training step over micro-batches,
 * evaluation, and the training loop with progress and metrics.
 *
 * Module order: train sits on config, pipeline (and below it optim,
 * checkpoint, layers, backend, core), balance and trace; only tools/ and
 * the public API (api.c) sit above it.  Inside it, replicas.c builds on
 * model.c (one replica) and never the other way round.
 *
 * Memory: a gp_model owns its layers (parameters on their devices), its
 * optimizer (gp_optim: the optimizer state) and its pipeline;
 * gp_model_free releases everything.  A step allocates its
 * activations on the device and frees them before it returns, so between
 * steps only parameters, gradients and optimizer state are resident.
 *
 * Thread safety: a gp_model is driven by one thread at a time.
 */
#ifndef GP_TRAIN_H
#define GP_TRAIN_H

#include "config/config.h"
#include "data/data.h"
#include "pipeline/pipeline.h"
#include "pipeline/procs.h"

/* ---- learning-rate schedule ---------------------------------------------
 * lr(step) for 0-based step of total_steps:
 *   base = optim.lr * (lr_scaling == linear ? batch / base_batch : 1)
 *   warm-up (step < warmup_steps): linear from warmup_start * base to base,
 *     reaching base at step == warmup_steps;
 *   then constant: base;  step: base * gamma^floor((step - warmup) / step_size);
 *   cosine: min_lr + (base - min_lr) * (1 + cos(pi * t)) / 2 with
 *     t = (step - warmup) / (total_steps - warmup), clamped to [0, 1]. */
double gp_lr_at(const gp_train_config *t, int64_t step, int64_t total_steps);

/* Throughput over half-second windows (the log's samples/s and the
 * --metrics records').  The run's first step is a window of its own (its
 * wall time holds its batch's fetch and the one-time set-up a first step
 * does: oneDNN's primitives, the pipeline); until the next window closes,
 * the rate is over the run's steps since, so no record reads 0 samples/s
 * and no short run's rate is its first step's set-up spread over the rest
 * (a 12-step run of 0.1 ms steps read 1229 samples/s on one device against
 * 25914 on two, for steps 1.2x slower). */
typedef struct gp_throughput {
    double start;           /* when the window opened (gp_now()) */
    int64_t samples;        /* samples trained in it */
    double wait;            /* seconds spent waiting for batches in it (the caller's) */
    bool first;             /* the run's first window after its first step, still open */
    double sps;             /* samples/s of the last window closed (or so far) */
    double wait_share;      /* the share of that time spent waiting for data */
} gp_throughput;
/* A step of `samples` ended at `now`: run_first, the run's first step;
 * last, its last (which closes the window). */
void gp_throughput_add(gp_throughput *w, int64_t samples, double now, bool run_first, bool last);
/* `seconds` of other work between two steps (an epoch's evaluation): left
 * out of the window, as if it had opened that much later. */
void gp_throughput_pause(gp_throughput *w, double seconds);
/* (gp_lr_base, the rate it starts from: config/config.h) */
/* The steps a run of this config takes in all: train.steps, or its epochs
 * of per_epoch batches. */
static inline int64_t gp_train_total_steps(const gp_train_config *t, int64_t per_epoch)
{
    if (t->steps > 0) return t->steps;
    /* (a run refuses epochs past this; a snapshot's check may ask first) */
    return per_epoch > 0 && t->epochs > INT64_MAX / per_epoch ? INT64_MAX : t->epochs * per_epoch;
}

/* ---- the model ----------------------------------------------------------- */

typedef struct gp_model {
    gp_layer *layers;      /* n_layers, owned; layer k lives on its stage's device */
    int n_layers;
    gp_shape input;        /* (1, C, H, W) of one sample */
    gp_shape output;       /* of one sample: (1, classes) for cross-entropy,
                              any shape for binary cross-entropy */
    gp_loss_kind loss;     /* model.loss */
    float label_smoothing; /* model.label_smoothing (cross-entropy) */
    int64_t classes;       /* cross-entropy: the logits it reads, the first of
                              the output's last dimension (the last layer's
                              spec.valid_rows: a padded vocabulary); 0: all */
    int64_t targets;       /* targets per sample (gp_loss_targets_per_sample):
                              the host batches' y holds n x this many */
    gp_skip_map skips;     /* the skip connections (stash -> pop), owned */
    gp_device *dev;        /* stage 0's device (the only one when n_stages = 1) */
    gp_device *devs[GP_MAX_DEVICES]; /* stage j's device, not owned */
    int balance[GP_MAX_DEVICES];     /* layers per stage */
    int n_stages;
    int n_devices;         /* stage j on device dev_of[j] */
    int dev_of[GP_MAX_DEVICES]; /* j % n_devices, or zb-v's V (gp_schedule_device_of) */
    /* Processes (mpirun; procs.h): the device this process trains, its
     * rank; the other devices' layers are shapes only (gp_layer_meta: no
     * parameters, gradients or momentum here).  -1: every device is this
     * process's. */
    int local_device;
    int rank_base;         /* processes: the rank that runs devs[0] */
    /* Processes with replicas (pipeline.replicas = R under mpirun, rank r =
     * replica r / n, device r % n): this process builds one replica; its
     * device's data-parallel group is proc_comm (owned), over MPI. */
    int proc_replicas;
    struct gp_comm *proc_comm;
    gp_optim *optim;       /* optimizer state and update, owned */
    bool inference;        /* built for inference only: no gradients (gp_model_build_inference) */
    int64_t step;          /* optimizer steps taken */
    bool fail_next;        /* test hook (GPIPE_TEST_FAIL_STEP): the next pipelined step
                              fails in stage 0's first forward, as a device error there */
    bool refused;          /* the last step failed before any commit or update
                              (before the pipeline's barrier: out of memory,
                              a bad label, a device error; at its CLIP:
                              gradients not finite; in gp_model_train_step
                              a NaN loss): the model is as it was before it */
    int64_t eval_batch;    /* the evaluation batch that fitted last (0: none
                              yet; gp_model_evaluate) */
    gp_pipeline *pipe;     /* created on the first pipelined step, owned */
    bool device_time;      /* pipelined steps record device time (timelines:
                              gp_pipeline_set_device_time) */
    /* Data parallelism (replicas.c): this model is replica 0; replicas
     * 1..R-1 are whole models like it on their own devices, stepped with it
     * and kept identical to it.  Everything else (evaluation, snapshots,
     * summaries) reads replica 0. */
    int n_replicas;        /* R; 0 or 1 = no data parallelism */
    struct gp_model *replicas;       /* [R - 1], owned */
    struct gp_replica_group *group;  /* communicators, failure state; owned,
                                        made on the first step */
    /* Closed while a snapshot's copy of the state (parameters, optimizer
     * state, running statistics) is made in the background, during the
     * next step's forward and backward (snapshot.c); the step's commit and
     * update, a load and gp_model_release wait for it.  Owned; NULL until
     * the first pipelined step or deferred snapshot (gp_model_gate). */
    gp_gate *gate;
} gp_model;

/* Build every layer from the config on one device (shapes inferred in
 * order; errors name the layer and its config position). */
gp_status gp_model_build(const gp_config *cfg, gp_device *dev, gp_model *out);
/* Build with stage j's balance[j] layers on devs[j % n] (balance has n x
 * gp_model_virtual(cfg) entries). */
gp_status gp_model_build_placed(const gp_config *cfg, gp_device *const *devs, int n,
                                const int *balance, gp_model *out);
/* How many ways cfg's replicas split the optimizer's state (ZeRO stage 1,
 * gp_optim_create_sharded): pipeline.replicas, or 1 where the state is
 * whole (one replica, tied weights, inference).  What --dry-run, the
 * memory checks and the planner count. */
int gp_model_optim_shards(const gp_config *cfg);
/* The optimizer's state tensors per trainable parameter (0 plain SGD, 1
 * momentum, 2 Adam and AdamW): what a profile allocates and times
 * (gp_profile.optim_slots). */
int gp_model_optim_slots(const gp_config *cfg);
/* Which of cfg's own inputs, besides the config file, writing `out` would
 * replace: model.init_from (a file, or one its folder is made of:
 * gp_path_overlaps), the schedule file (pipeline.schedule: {file: ..}), or
 * a file the dataset reads (gp_dataset_reads); GP_CONFIG_READS_NONE where
 * none.  The one check behind gpipe-train's and gpipe-balance's outputs. */
typedef enum gp_config_reads {
    GP_CONFIG_READS_NONE,
    GP_CONFIG_READS_INIT_FROM,
    GP_CONFIG_READS_SCHEDULE,
    GP_CONFIG_READS_DATASET
} gp_config_reads;
gp_config_reads gp_config_input_of(const gp_config *cfg, const char *out);
/* The same for `replicas` replicas of cfg's model (the planner's layouts;
 * it counted R ways for a tied model, whose run keeps its state whole). */
int gp_model_optim_shards_for(const gp_config *cfg, int replicas);
/* The same as data-parallel replica `replica` of `replicas` whose updates
 * are sharded: its optimizer keeps only that chunk of each state (ZeRO
 * stage 1, gp_optim_create_sharded). */
gp_status gp_model_build_replica(const gp_config *cfg, gp_device *const *devs, int n,
                                 const int *balance, int replica, int replicas, gp_model *out);
/* A stop flag (a signal's number once one came) that the builds on this
 * thread poll between layers, so that a signal stops a large model's
 * initialisation too (GP_ERR_STOPPED); NULL: none.  The trainer sets its
 * gp_train_opts.stop around gp_train_open. */
void gp_model_build_stop(const _Atomic int *stop);
/* Whether the builds on this thread are followed by a load of every
 * parameter (model.init_from, --resume, a snapshot's export): their layers
 * then skip the random draws the load would replace (gp_layers_draw_init).
 * The trainer sets it around gp_train_open; false: draw (the default). */
void gp_model_build_loads(bool loads);
/* Whether the models this thread builds are for inference only (the
 * forward pass and decoding: no gradients, no optimizer state; a step on
 * one is refused): gp_run_inference_only's, for gpipe-sample.  Returns the
 * previous setting; gp_model_building_inference reads it (the start-up
 * memory check counts the weights alone then). */
bool gp_model_build_inference(bool inference);
bool gp_model_building_inference(void);
/* The same placement with every layer shapes only (gp_layer_meta: no
 * device, nothing allocated; layers[k].dev is NULL): what --dry-run
 * describes, whatever the size of the model or the devices it names. */
gp_status gp_model_build_meta(const gp_config *cfg, const int *balance, gp_model *out);
/* Frees the model, its replicas and their group (replicas.c). */
void gp_model_free(gp_model *m);
/* One replica's pipeline, optimizer and layers (model.c; gp_model_free
 * calls it for each). */
void gp_model_release(gp_model *m);
/* m's gate (gp_model.gate), made on the first call; NULL out of memory. */
gp_gate *gp_model_gate(gp_model *m);
int64_t gp_model_param_count(const gp_model *m);
/* The trainable parameters layer l adds to the model's count: its own,
 * less a weight it ties to an earlier layer (spec.tie: GPT-2's lm_head
 * holds the embedding's wte.weight, which the embedding counts), so a
 * tied weight is counted once (GPT-2 124M: 124,439,808).  Every count of
 * a model's parameters goes through it.  A padded vocabulary's rows
 * (model.gpt.vocab_pad) are not counted either, as Hugging Face counts
 * GPT-2: they are gp_model_layer_padding's. */
int64_t gp_model_layer_params(const gp_layer *l);
/* The elements of layer l's own (untied) parameters in a padded
 * vocabulary's rows (spec.valid_rows): held, updated (they stay 0) and
 * multiplied like any other, but no parameter of the model the padding
 * stands for.  Its padded rows: *rows (NULL: not asked). */
int64_t gp_model_layer_padding(const gp_layer *l, int64_t *rows);
/* The trainable parameters the config's model would have, from shape
 * inference alone (gp_layer_meta): no device, no device memory, so a
 * model far larger than this machine's memory can be counted. */
gp_status gp_model_count_params(const gp_config *cfg, int64_t *count);
/* The same count and the output shape of one sample (the last layer's),
 * from the config alone (shapes only: nothing is allocated). */
gp_status gp_model_describe(const gp_config *cfg, int64_t *params, gp_shape *output);
/* Stages per device: pipeline.virtual with schedule: interleaved, else 1.
 * A model built on n devices has n x this many stages, stage j on device
 * j % n. */
int gp_model_virtual(const gp_config *cfg);
/* SGD options of the config. */
gp_optim_opts gp_model_optim_opts(const gp_config *cfg);
/* Pipeline options of the config (chunks, checkpointing, lockstep) with
 * the model's optimizer. */
gp_pipeline_opts gp_model_pipeline_opts(const gp_model *m, const gp_config *cfg);
/* Math threads of device d (0-based over all replicas' devices) in
 * gp_train_open: its own or pipeline.threads, else the machine's cores
 * divided among all the run's CPU devices (at least 1).  The profile of
 * `balance: auto` times with the same count. */
int gp_model_device_threads(const gp_pipeline_config *pc, int d);
/* data.workers resolved: the configured number, else the cores left after
 * the pipeline's compute threads (at least 1). */
int gp_data_workers(const gp_config *cfg);

/* Per-layer forward FLOPs of the config's model at batch `batch`, from shape
 * inference alone (no parameters allocated): the costs of the fast path of
 * `balance: auto` (GPIPE_BALANCE=flops). */
gp_status gp_model_costs(const gp_config *cfg, int64_t batch, double *costs);
/* The balance the config asks for: its list, or for `auto` (n > 1) the exact
 * min-max partition over n stages of
 *   - by default, profiled stage times (gp_model_profile with 1 warm-up and
 *     the median of 3 runs at the configured micro-batch size, then
 *     gp_balance_plan: the same code path as gpipe-balance --by time), with
 *     every device's memory capacity as a constraint;
 *   - with the environment variable GPIPE_BALANCE=flops, gp_model_costs
 *     (estimated FLOPs; fast and deterministic, no memory check). */
gp_status gp_model_balance(const gp_config *cfg, int n, int *balance, bool quiet);
/* The min-max partition over n stages of the estimated FLOPs alone (what
 * GPIPE_BALANCE=flops uses, and --dry-run's summary for `auto`). */
gp_status gp_model_balance_flops(const gp_config *cfg, int n, int *balance);
/* "time" or "flops": what `balance: auto` uses (GPIPE_BALANCE). */
const char *gp_model_balance_method(void);

/* Profiling the config's model (balance/balance.h) on stage 0's device kind
 * with its thread count. */
struct gp_profile;
struct gp_plan_opts;
typedef struct gp_model_profile_opts {
    int warmup, reps;
    bool timed;              /* false: memory only */
    int threads;             /* 0: what stage 0 gets in gp_train_open */
    int n_sizes;             /* 0: the configured micro-batch size */
    int64_t sizes[16];
    bool alone;              /* time each layer alone; default: with the other
                                CPU devices of the run loaded (gp_profile_opts
                                contend) */
    bool say;                /* gp_profile_opts.say */
} gp_model_profile_opts;
gp_status gp_model_profile(const gp_config *cfg, const gp_model_profile_opts *o,
                           struct gp_profile *out);
/* The memory columns of cfg's model from its shapes alone
 * (gp_profile_estimate; dev optional): nothing opened or run. */
/* The facts of the run a profile does not measure nor save, from cfg:
 * bf16 copies, the activations' storage, the optimizer's shards and the
 * layers a checkpointed forward keeps (balance.h).  gp_model_profile and
 * gp_model_profile_estimate set them; set them again on a loaded profile. */
void gp_model_profile_facts(const gp_config *cfg, struct gp_profile *p);
/* Of those, the layers a checkpointed forward keeps: each of cfg's layers
 * whose type is in keep (a bit per gp_layer_type), into p's memory rows. */
void gp_model_profile_keep(const gp_config *cfg, gp_ckpt_keep keep, struct gp_profile *p);
gp_status gp_model_profile_estimate(const gp_config *cfg, struct gp_device *dev,
                                    struct gp_profile *out);
/* balance: auto's cached profile of cfg's model, batch, device and build
 * (*found false where none is kept; an error where the entry is unusable),
 * without profiling. */
gp_status gp_model_profile_cached(const gp_config *cfg, struct gp_profile *out, bool *found);
/* Planning options from the config for n devices: chunks, checkpoint mode,
 * each device's capacity, by time. */
void gp_model_plan_opts(const gp_config *cfg, int n, struct gp_plan_opts *o);
/* The split of prof's layers into v x n stages (n = cfg's devices) for
 * schedule kind, as a run of cfg with that schedule, v and checkpoint mode
 * ckpt would balance them: the config's m, keep list and memory, under the
 * lockstep a sweep over schedules gives kind (gp_config_lockstep_for).
 * What the run-end suggestion and gpipe-balance --simulate weigh the
 * interleaved and V placements on, each under the mode they name (a
 * mode moves the split: except_last recomputes every stage but a V's
 * last, which then takes more layers); balance gets v x n entries. */
gp_status gp_model_plan_placement(const gp_config *cfg, const struct gp_profile *prof,
                                  gp_schedule_kind kind, int v, gp_checkpoint_mode ckpt,
                                  int *balance);

/* Per-step statistics. */
typedef struct gp_step_stats {
    double loss;           /* mean over the batch */
    double accuracy;       /* fraction correct */
    int64_t samples;
    double seconds;
    double lr;
    double allreduce_seconds; /* data parallelism: the longest time a worker
                                 spent in its stage's collectives (gradient
                                 reduction; on stage 0 the whole fused
                                 sharded update) and waiting for the other
                                 replicas */
    double grad_norm;      /* train.clip_grad_norm: the gradients' global L2
                              norm before clipping; NaN without clipping */
    double data_wait_seconds; /* the trainer waited this long for the batch
                                 (the loader fell behind); set by the trainer */
    int64_t bad_files;     /* files skipped so far (data.on_bad_file: skip);
                              -1 = not skipping */
    /* a pipeline's step (gp_pipeline_out): devices (0: one device, no
     * pipeline), each one's busy time, the step's window and its bubble */
    int n_devices;
    double busy[GP_MAX_DEVICES];
    double window;
    double bubble;
} gp_step_stats;

/* The bubble of a pipeline's step into st (gp_step_stats.n_devices ...). */
void gp_step_stats_bubble(gp_step_stats *st, const gp_pipeline_out *po);

/* The statistics of a step over n samples with `count` targets in all (n
 * for cross-entropy, n x output elements for binary cross-entropy): the
 * mean loss and the accuracy are per target (pixel accuracy for masks). */
gp_step_stats gp_step_stats_of(double loss_sum, int64_t correct, int64_t count, int64_t n,
                               double lr, double seconds, double comm_seconds);

/* The logits a cross-entropy reads (gp_model.classes): the last layer's
 * real rows where it is a padded LM head (model.gpt.vocab_pad), else 0
 * (all). */
int64_t gp_model_config_classes(const gp_model_config *mc);

/* One optimizer step on a host batch (x: (n, C, H, W), y: (n, m->targets):
 * class ids, or one target in [0, 1] per output element, sample after
 * sample) on a single device, without threads: the reference every
 * pipelined run is checked against.  The batch is split into `chunks`
 * micro-batches (gp_microbatch_split); all forwards run first, then the
 * backwards in the order cfg->pipeline.schedule runs them on every stage
 * (GPipe: from the last micro-batch to the first; 1F1B: from the first), so
 * the gradient sums add up in the same order as on a pipeline stage, and
 * the device's weights are frozen through them as on a stage (converted
 * copies kept, gradients held: gp_dev_freeze_weights, the same bits);
 * batch-norm running statistics commit once; then the SGD update with
 * `lr`, and the check that every parameter and buffer is finite.  A non-finite loss or state is
 * GP_ERR_NUMERIC naming the step, the micro-batch or tensor. */
gp_status gp_model_train_step(gp_model *m, const gp_config *cfg, const float *x,
                              const float *y, int64_t n, int chunks, double lr,
                              gp_step_stats *st);

/* The same step pipelined over the model's stages, with one worker thread
 * per device, cfg->pipeline's chunks, checkpointing and lockstep, over the
 * replicas where the model has them (replicas.c).  Equal to
 * gp_model_train_step with the same chunks (see tests/test_pipeline.c). */
gp_status gp_model_pipeline_step(gp_model *m, const gp_config *cfg, const float *x,
                                 const float *y, int64_t n, double lr, gp_step_stats *st);
/* That step for a model without replicas (model.c). */
gp_status gp_model_pipeline_step_one(gp_model *m, const gp_config *cfg, const float *x,
                                     const float *y, int64_t n, double lr, gp_step_stats *st);

/* ---- data parallelism (replicas.c) ---------------------------------------
 * R replicas of an n-stage pipeline on R x n devices: replica r's stage j on
 * devs[r * n + j].  A step splits the global mini-batch of N samples into
 * R x chunks micro-batches (gp_microbatch_split) and gives replica r the
 * micro-batches r x chunks .. (r + 1) x chunks - 1 — a contiguous shard
 * whose own split into chunks reproduces them — so a step runs exactly the
 * micro-batches of the single-device step with R x chunks chunks.  Every
 * replica scales its loss gradient by 1 / N and indexes dropout by global
 * sample position; stage j's gradients are summed over the replicas as soon
 * as its backward ends; then every replica applies the same SGD update.
 * A failure in any replica cancels all of them and changes no model. */
gp_status gp_model_build_replicated(const gp_config *cfg, gp_device *const *devs, int R,
                                    int n, const int *balance, gp_model *out);
/* GP_OK if every replica's parameters and buffers are bitwise those of
 * replica 0; else GP_ERR_RUNTIME naming the replica and layer (a bug).
 * Debug builds run it every 100 steps. */
gp_status gp_model_check_replicas(const gp_model *m);
/* Replica 0's parameters, buffers, optimizer state and step copied to the
 * other replicas (after a snapshot was loaded into replica 0 of a model
 * that has stepped); a no-op without replicas or before the first step. */
gp_status gp_model_sync_replicas(gp_model *m);
/* Data parallelism with sharded updates leaves replica r's momentum current
 * only in chunk r of each tensor (the chunk it updates).  Copies every
 * chunk from its owner into replica 0's momentum, so replica 0 holds the
 * whole optimizer state (snapshots read it).  No-op without replicas. */
gp_status gp_model_gather_momentum(gp_model *m);
/* Tied weights (layers.h): every replica of this model's layers set to its
 * owner's value, under mpirun the owner's rank sending it to the
 * replica's (every rank calls it); after the model was built, loaded from
 * a snapshot or model.init_from.  The pipeline keeps them equal from then
 * on. */
gp_status gp_model_tie_sync(gp_model *m);
/* Processes: the rank that trains layer k (0 without processes). */
int gp_model_layer_rank(const gp_model *m, int k);
/* Under mpirun (gp_procs_size() > 1): whether the config can run one
 * device per process (as many devices as processes, one replica, CPU
 * devices); GP_ERR_INVALID saying what to change otherwise. */
gp_status gp_train_check_processes(const gp_config *cfg);

/* Loss and accuracy of the model in evaluation mode over a whole dataset:
 * per sample against its class (cross-entropy), per pixel against its mask
 * (binary cross-entropy; the dataset must have masks of the output's
 * size, or class ids 0 / 1 for an output of one element). */
gp_status gp_model_evaluate(gp_model *m, const gp_config *cfg,
                            const gp_dataset *ds, double *loss, double *accuracy);
/* The same over the caller's batch: x (n, C, H, W) normalised inputs, y
 * m->targets per sample (class ids, or per-element targets), in batches of
 * train.eval_batch_size (halved where one does not fit, as above); n >= 1,
 * x and y given (gp_run_evaluate checks them). */
gp_status gp_model_evaluate_host(gp_model *m, const gp_config *cfg, const float *x,
                                 const float *y, int64_t n, double *loss, double *accuracy);
typedef struct gp_decoder gp_decoder;
/* gpipe.h's gp_decoder_open on a prepared model (decode.c).  `open`, where
 * given, counts the decoders of the model that are open: one more on
 * success, one less at gp_decoder_free (gp_run refuses to replace its
 * model while any is). */
gp_status gp_model_decoder_open(gp_model *m, const gp_config *cfg, int64_t samples,
                                _Atomic int *open, gp_decoder **out);
/* t (FP32) rounded to bfloat16 in place, on its device
 * (pipeline.copy_precision: what crosses a stage, as training's copies
 * round it). */
gp_status gp_tensor_round_bf16(gp_tensor *t);
/* t moved onto dev: a copy where it is elsewhere (t's memory freed; a
 * view's is nothing to free), else nothing.  On failure t is empty. */
gp_status gp_tensor_move(gp_tensor *t, gp_device *dev);
/* t's values to the host as FP32 (dst: its numel), widened on its device
 * where it is bf16. */
gp_status gp_tensor_download_f32(const gp_tensor *t, float *dst);
/* The stage holding layer k. */
int gp_model_stage_of(const gp_model *m, int k);
/* The model's outputs (logits) for n samples x (host, as for
 * gp_model_evaluate_host) in evaluation mode, through the stages as
 * evaluation runs them, into out (host, n x the output's elements, FP32;
 * bf16 activations widened).  One process only. */
gp_status gp_model_forward_host(gp_model *m, const gp_config *cfg, const float *x, int64_t n,
                                float *out);

/* ---- the training loop --------------------------------------------------- */

typedef struct gp_train_opts {
    const char *metrics_path;  /* JSON Lines; NULL = none */
    const char *trace_path;    /* Chrome trace JSON; NULL = none */
    int64_t trace_first;       /* steps recorded in the trace (0-based) */
    int64_t trace_last;        /* < 0: to the end */
    int progress;              /* 1 = terminal progress bar, 0 = log lines,
                                  -1 = decide by isatty(stderr) */
    bool quiet;
    const char *resume_path;   /* snapshot to go on from; "latest" = the newest
                                  in train.snapshot.dir; NULL = a fresh run */
    const char *export_path;   /* write the final weights (safetensors); NULL = none */
    int export_format;         /* gp_weights_format (weights/weights.h): 0 = gpipe's
                                  names, 1 = Hugging Face's (GPT-2, a Llama's
                                  folder), 2 = llm.c's checkpoint, 3 = a Llama's
                                  folder in bf16 */
    const char *tensorboard_dir; /* TensorBoard event files (train/tensorboard.h);
                                    NULL = train.tensorboard's ("" = none) */
    /* Stop between steps once *stop is non-zero: a signal handler or
     * another thread stores the signal's number there (lock-free atomic,
     * so async-signal-safe).  The step under way finishes; then a final
     * snapshot when train.snapshot is on, the metrics file and trace
     * closed as valid files, res->stop_signal set and GP_ERR_STOPPED with
     * a message that says at which step and what was saved.  Also read
     * between the phases before the first step (data, profiling and
     * model, loader).  NULL = never stop. */
    const _Atomic int *stop;
    /* Where a run that trained (GP_OK, or GP_ERR_STOPPED after a step)
     * hands over its model and devices instead of freeing them: *keep_model
     * and keep_devs[0 .. gp_pipeline_devices_total) (GP_MAX_DEVICES room),
     * which the caller frees (gp_model_free, then gp_device_close each).
     * Both NULL: freed here. */
    gp_model *keep_model;
    gp_device **keep_devs;
} gp_train_opts;

typedef struct gp_train_result {
    int64_t steps;
    double final_loss;         /* last step's training loss */
    double final_accuracy;     /* last step's training accuracy */
    double final_lr;           /* last step's learning rate */
    double final_seconds;      /* last step's wall time */
    double final_grad_norm;    /* last step's gradient norm (clipping; else NaN) */
    double test_loss;          /* last evaluation (NaN if none) */
    double test_accuracy;
    double seconds;
    size_t peak_bytes;         /* device peak */
    /* a pipeline's bubble over the run's steps but its first (which
     * allocates and warms up): 1 - their summed busy time over n x their
     * summed windows (gp_pipeline_out); NaN on one device or with one step.
     * bubble_simulated: gp_simulate_schedule's for the same schedule,
     * balance and micro-batches from the cached profile of this model
     * (balance: auto's, gpipe-balance's), NaN where there is none. */
    double bubble, bubble_simulated;
    int stop_signal;           /* *opts->stop when the run stopped on it, else 0 */
    bool failed_alike;         /* processes: the error is every rank's alike (a step every
                                  rank refused before its update), so one rank may say it */
    bool other_failed;         /* processes: this rank's error is another rank's failure
                                  (which that rank says, then ends the run) */
} gp_train_result;

/* Open the config's devices (cores split among CPU devices), choose the
 * balance, and build the placed model.  devs receives n_devices handles
 * that the caller closes after gp_model_free. */
gp_status gp_train_open(const gp_config *cfg, gp_device **devs, gp_model *model, bool quiet);

/* Convert a snapshot: opts->resume_path's weights (a path or "latest")
 * written to opts->export_path in opts->export_format, nothing trained
 * and no data read (the model built on one CPU device, whatever devices
 * the config names).  Outputs checked first, as gp_train_run checks them. */
gp_status gp_train_convert(const gp_config *cfg, const gp_train_opts *opts);

/* --dry-run's check of the data against the model, where the data's shape
 * and classes are known without reading it (gp_dataset_peek: IDX and
 * CIFAR-10): the model's input and its outputs, as a run checks them after
 * loading (the same messages); GP_OK for the kinds only a read tells. */
gp_status gp_train_check_data(const gp_config *cfg);

/* Load data, build the model, train and evaluate as the config says. */
gp_status gp_train_run(const gp_config *cfg, const gp_train_opts *opts,
                       gp_train_result *res);

/* The --metrics record of step `step` (1-based) as one JSON object, no
 * newline, into w (core/json.h): loss, accuracy, lr, throughput, the
 * step's time (and the all-reduce's with data_parallel), and each
 * device's name, memory peaks and, where counts (NULL: none) has them for
 * it (counts[j].host_waits >= 0: -1 for another rank's device), what the
 * device did in the step: the times the host waited for it
 * (gp_dev_host_waits), its launches (gp_dev_launches) and the FP32 bytes
 * its storage adapter made (gp_dev_adapter_bytes).  Strings are escaped,
 * so any device name stays valid JSON. */
typedef struct gp_step_counts {
    int64_t host_waits, launches, adapter_bytes;
} gp_step_counts;
struct gp_json_writer;
void gp_train_metrics_step(struct gp_json_writer *w, int64_t step, int64_t epoch, double lr,
                           double samples_per_s, const gp_step_stats *st, bool data_parallel,
                           gp_device *const *devs, int n_dev, const gp_step_counts *counts);

/* Print the model summary (--dry-run) to `f`: the model built as shapes
 * (gp_model_build_meta), the devices opened only to ask their layouts
 * and pooling workspaces (one that cannot be opened is a note, not an
 * error).  GP_ERR_OOM, after the summary, where a device's capacity cannot
 * hold its stages' weights, gradients and momentum. */
gp_status gp_model_summary(const gp_config *cfg, FILE *f);
/* A roofline floor for one step of cfg's model on one GPU of kind `gpu`
 * ("h100", "h200") into `f`: per layer type the launches, FLOPs, bytes and
 * the time each launch takes at least (max of FLOPs / peak and bytes /
 * bandwidth), and the step's (roofline.c says what is counted).  From the
 * shapes alone: no device opened.  GP_ERR_INVALID names an unknown gpu. */
gp_status gp_model_roofline(const gp_config *cfg, const char *gpu, FILE *f);
/* ---- the planner (plan.c; gpipe-balance --plan) ---------------------------- */

/* One layout of N devices: R replicas of a pipeline of `devices`. */
typedef struct gp_layout {
    int devices;              /* n: a pipeline's devices */
    int replicas;             /* R = N / n */
    gp_schedule_kind schedule;
    int virtual_stages;       /* stages a device (interleaved and zb-v 2) */
    int m;                    /* micro-batches of a replica's batch */
    gp_checkpoint_mode checkpoint;
    gp_ckpt_keep keep;        /* pipeline.checkpoint.keep (0: the input only) */
    int balance[GP_MAX_DEVICES]; /* layers per stage (devices x virtual) */
    double step;              /* predicted seconds a step, the reduction included */
    double reduce;            /* of it, the replicas' gradient reduction */
    double bubble;            /* the pipeline's idle share (simulated) */
    double samples_per_s;     /* train.batch_size / step */
    double mfu;               /* model FLOPs / (N x the GPU's peak x step); NAN on CPUs */
    double peak;              /* the largest device's peak bytes */
} gp_layout;

typedef struct gp_plan_request {
    int devices;              /* N */
    const char *gpu;          /* "h100" or "h200" (the roofline's times), or
                                 NULL: N CPU devices of this machine (profiled) */
    double memory;            /* bytes a device holds (0: pipeline.memory, else
                                 unlimited on CPUs, the GPU's own 80 / 141 GB) */
    int threads;              /* CPU devices' math threads (0: 1) */
    int reps;                 /* the profile's timed runs (CPU; 0: 3) */
    bool say;                 /* progress while profiling */
} gp_plan_request;

typedef struct gp_plan_result {
    gp_layout *layouts;       /* the ones that fit, fastest first (owned) */
    int n_layouts;
    int considered;           /* every (n, schedule, m, checkpoint) tried */
    int no_batch;             /* fewer samples than replicas x micro-batches,
                                 or more of those than GP_MAX_CHUNKS */
    int no_schedule;          /* more stages than layers, interleaved's m */
    int no_memory;            /* no split within the devices' memory */
    double capacity;          /* the memory planned for (0: unlimited) */
    bool capacity_smallest;   /* the config's devices hold different amounts:
                                 capacity is the smallest */
} gp_plan_result;

/* Every layout of rq->devices devices for cfg's model and batch, planned,
 * simulated and ranked (plan.c says how).  GP_OK with n_layouts 0 where
 * none fits (the counts say why). */
gp_status gp_plan_layouts(const gp_config *cfg, const gp_plan_request *rq, gp_plan_result *out);
void gp_plan_result_free(gp_plan_result *r);

/* A profile of cfg's model on one GPU of kind `gpu` from the same
 * roofline: each layer's forward, backward halves and copy at each of the
 * micro-batch sizes (ascending), its memory columns from its shapes
 * (gp_model_profile_estimate): what the planner simulates a GPU run with
 * (gp_plan_layouts).  A floor, as the roofline is. */
gp_status gp_roofline_profile(const gp_config *cfg, const char *gpu, const int64_t *sizes,
                              int n_sizes, struct gp_profile *out);
/* The GPU's peak FLOP/s at a precision (0: not a GPU the roofline knows). */
double gp_roofline_peak(const char *gpu, int precision);

#endif /* GP_TRAIN_H */
