/*
 * balance.h — how to split a sequential model over n devices: a per-layer
 * profiler (time and memory), the exact min-max contiguous partitioner, and a
 * pipeline simulator that replays the executor's own schedule.
 *
 * Data flow:
 *
 *   layer specs --gp_profile_run--> gp_profile (per layer: times at one or
 *       more micro-batch sizes, bytes from the allocator)  <--> JSON file
 *   gp_profile --gp_balance_plan--> balance (exact min-max of the time each
 *       stage adds to the critical path, subject to device capacities)
 *   gp_profile + balance --gp_simulate--> step time, bubble, peak bytes
 *
 * The profiler runs each layer on a fresh device of the configured kind (so
 * the allocator's counters, including the backend's workspace arena, belong
 * to that layer alone), warms up, then takes the median of `reps` runs of
 * forward, backward-data, backward-weights and recompute, synchronising the
 * device around each.  The cost of a stage boundary is a timed
 * gp_tensor_copy of the layer's output to a second device.
 *
 * Stage model (shared by the partitioner and the simulator, so the two agree
 * exactly): stage j = layers [a, b) at micro-batch size s runs
 *   F = sum fwd (+ input upload on stage 0, + loss on the last stage)
 *   R = sum recompute                      (checkpointed micro-batches)
 *   B = sum (bwd_data + bwd_weights), except on stage 0 where layers before
 *       the first trainable one run no backward and that one no dx
 *       (bwd_alone), as the executor does
 *   copies on its own worker: the activation of layer a-1 (j > 0) and the
 *       gradient of layer b-1's output (j < n-1)
 * and the partitioner's cost of the stage is F + B + copies + R x (share of
 * checkpointed micro-batches): the time the stage adds to every clock pair
 * of GPipe's step bound (m + n - 1) (max F + max (R + B)).
 *
 * Owns: profiles and their JSON files, partitions, simulations.  May call:
 * core, backend (the profiler opens devices), layers, checkpoint and
 * pipeline's schedules (the simulator replays them).  Knows nothing of the
 * training loop or configs.
 *
 * Memory: a gp_profile owns its arrays (gp_profile_free).  Everything else
 * is plain values.  Thread safety: pure functions except gp_profile_run,
 * which opens and drives its own devices from the calling thread.
 */
#ifndef GP_BALANCE_H
#define GP_BALANCE_H

#include "layers/layers.h"
#include "pipeline/schedule.h"

/* ---- profile ------------------------------------------------------------- */

#define GP_PROFILE_MAX_SIZES 16
/* Room for gp_profile_layer_spec's longest text (seven 19-digit numbers). */
#define GP_PROFILE_SPEC_LEN 256

typedef enum { GP_BALANCE_BY_TIME = 0, GP_BALANCE_BY_SIZE, GP_BALANCE_BY_BOTH } gp_balance_by;
const char *gp_balance_by_name(gp_balance_by b);
bool gp_balance_by_parse(const char *s, gp_balance_by *out);

/* Times of one layer at one micro-batch size, seconds. */
typedef struct gp_layer_times {
    double fwd;          /* forward, training mode */
    double bwd_data;     /* backward-data (dx =) */
    double bwd_weights;  /* backward-weights (dW +=) after backward-data */
    double bwd_alone;    /* backward-weights without backward-data (the first
                            trainable layer on stage 0); 0 if not measured */
    double recompute;    /* forward with ctx.recompute (checkpointing) */
    double copy;         /* gp_tensor_copy of the output to another device */
} gp_layer_times;

/* What a layer holds, from the allocator's counters (bytes), and per-sample
 * activation sizes (bytes per sample; a micro-batch of s keeps s times it). */
typedef struct gp_layer_mem {
    char desc[96];          /* "layer 3 (conv2d 'c1')" */
    char spec[GP_PROFILE_SPEC_LEN]; /* what decides its cost and shape
                               (gp_profile_layer_spec): "conv2d {out: 64,
                               kernel: 3, stride: 1, padding: 1, bias: true}" */
    size_t param_bytes;     /* category PARAMS (incl. buffers) */
    size_t grad_bytes;      /* GRADS */
    size_t optim_bytes;     /* OPTIMIZER (SGD's momentum or Adam's two moments
                               per trainable tensor) */
    size_t workspace_bytes; /* peak WORKSPACE while it ran (backend arena,
                               layer scratch) */
    double in_per_sample;   /* input bytes: what a checkpointed stage that
                               starts here keeps per micro-batch sample */
    double out_per_sample;  /* output bytes (also the copied activation) */
    double keep_per_sample; /* ACTIVATIONS kept by a training forward for its
                               backward (output + gp_saved), per sample; the
                               output not counted when `inplace` */
    bool inplace;           /* runs in place in the whole model's sequence
                               (gp_layer_specs_inplace): its output shares its
                               input's memory, except as a stage's first
                               layer, where gp_stage_peak_bytes adds it back */
    bool unkept;            /* no backward reads its output
                               (gp_layer_specs_unkept), so a kept forward frees
                               it, except as a stage's last layer (the stage
                               output), where gp_stage_peak_bytes adds it
                               back; keep_per_sample leaves it out */
    bool end_unread;        /* as a stage's last layer, run out of place, its
                               output is read by no backward of its stage
                               (gp_layer_spec_end_unread): a forward that
                               keeps frees it once the next stage has its
                               copy (gp_stash_hand_out) */
    bool in_unread;         /* its backward does not read its main input
                               (gp_layer_spec_ignores_x): as a stage's first
                               layer, a forward that keeps frees the stage
                               input after it ran (checkpoint.c,
                               drop_unread_input) */
    /* A convolution at an end of a blocked chain
     * (gp_layers_blocked) of the one-stage run the profile times it in:
     * x_chain, its input blocked there, by the chain that begins at layer
     * x_from; y_chain, its output blocked, up to layer y_to (the chain's
     * first pool, where a stage may end it, else the convolution that reads
     * it).  A stage that begins after x_from, or ends before y_to, cuts the
     * chain: the layer then reads (x) or writes (y) plain and reorders, a
     * pass over that tensor in each of its forward, recompute,
     * backward-data and backward-weights, which the simulator adds (timed
     * as the boundary copy of the same bytes).  Facts of the model and the
     * profiled device's layouts (saved with the profile).  A residual
     * block's chains are not marked: a cut there turns a run of blocks
     * plain (profile.c, profile_chains), which is not modelled */
    bool x_chain, y_chain;
    int x_from, y_to;
    bool fused;             /* a relu a batch norm before it does
                               (gp_layer_specs_relu_fused): inside a stage its
                               forward, recompute and backward cost nothing;
                               as a stage's first layer it runs (its times
                               are measured alone either way) */
    bool ckpt_keep;         /* its type is one a checkpointed forward keeps
                               (pipeline.checkpoint.keep): with the layers
                               in place over its output (gp_ckpt_kept) it is
                               held from the forward to the backward and not
                               recomputed.  A fact of the run like
                               bf16_copies (gp_model_profile_facts), not
                               measured nor saved */
    double flops_per_sample;/* forward FLOPs per sample (layer estimate) */
    double update;          /* seconds: zero grads + SGD update of its params */
} gp_layer_mem;

/* A skip connection of the profiled model: layer `from`'s output is popped
 * by layer `to`.  Across a stage boundary it is its own copy (its bytes are
 * mem[from].out_per_sample, its time t[from].copy) and is held on both
 * stages. */
typedef struct gp_profile_skip {
    int from, to;
} gp_profile_skip;

typedef struct gp_profile {
    int L;                     /* layers */
    int n_skips;
    gp_profile_skip *skips;    /* [n_skips], owned, ordered by from */
    int64_t input[3];          /* (C, H, W) of one sample of the model */
    uint64_t model_hash;       /* gp_profile_model_hash of the model profiled */
    char device[32];           /* where it was taken ("cpu:0") */
    int threads;               /* math threads of that device */
    int contend;               /* devices loaded alongside while timing */
    int64_t evict_bytes;       /* cache evicted before each timed op (0: none) */
    int64_t batch;             /* mini-batch size of the config */
    int chunks;                /* configured micro-batches */
    int first_trainable;       /* gp_layers_first_trainable */
    bool timed;                /* times measured (false: --by size) */
    int precision;             /* gp_precision it was timed for (the config's
                                  train.precision); -1: not recorded (a
                                  profile saved before 2026-11-25) */
    int optim_slots;           /* optimizer state tensors a parameter it was
                                  taken with (0 plain SGD, 1 momentum, 2 Adam:
                                  its optim_bytes and update times); -1: not
                                  recorded (saved before 2026-12-01) */
    bool bf16_copies;          /* the run's copies travel in bfloat16
                                  (pipeline.copy_precision), so what crosses a
                                  stage boundary holds half its bytes while in
                                  flight or held for a recompute: a fact of the
                                  run, not measured nor saved (gp_model_profile
                                  sets it from the config; set it again on a
                                  loaded profile) */
    int act_dtype;             /* gp_dtype the run stores activations in
                               (train.activations): the profile measures
                               FP32 layer outputs, and the simulator counts
                               each at this size (bf16: half; the model
                               input and what a layer keeps beside its
                               output stay FP32).  A fact of the run like
                               bf16_copies, not saved: set on a loaded
                               profile too */
    int optim_shards;          /* the run's replicas split the optimizer's
                                  state this many ways (ZeRO stage 1,
                                  gp_model_optim_shards; 0 or 1: whole): each
                                  device holds optim_bytes / optim_shards.
                                  A fact of the run like bf16_copies, not
                                  measured nor saved */
    double target_bytes;       /* the loss's targets (labels, FP32) a sample
                                  on the last stage: a micro-batch's, and the
                                  next one's uploaded during its loss.  A fact
                                  of the run like bf16_copies (the loss:
                                  gp_model_profile_facts), not measured nor
                                  saved; 0: none counted */
    int warmup, reps;
    int n_sizes;               /* micro-batch sizes measured, ascending */
    int64_t sizes[GP_PROFILE_MAX_SIZES];
    gp_layer_mem *mem;         /* [L] */
    gp_layer_times *t;         /* [n_sizes * L]: t[z * L + k] */
    double loss[GP_PROFILE_MAX_SIZES];   /* cross-entropy fwd+bwd at size z */
    double upload[GP_PROFILE_MAX_SIZES]; /* host -> device of the input + labels */
} gp_profile;

typedef struct gp_profile_opts {
    const char *device;     /* "cpu:0" */
    int threads;            /* math threads; 0 = device default */
    int precision;          /* gp_precision the devices train in (train.precision) */
    bool deterministic;     /* train.deterministic: the algorithms it trains with */
    int warmup;             /* runs before timing (>= 0; default 2) */
    int reps;               /* timed runs, median taken (>= 1; default 5) */
    bool timed;             /* false: memory only (fast; --by size) */
    int n_sizes;            /* micro-batch sizes to time (each <= batch) */
    int64_t sizes[GP_PROFILE_MAX_SIZES];
    int64_t batch;          /* mini-batch size (recorded) */
    int chunks;             /* configured micro-batches (recorded) */
    int optim_slots;        /* optimizer tensors per trainable parameter
                               (plain SGD 0, momentum 1, Adam 2) */
    uint64_t seed;
    /* CPU devices share the host's memory bus and caches: in a pipeline on
     * n CPU devices the other n - 1 compute while a layer runs.  contend =
     * n - 1 times each layer while that many other devices (same thread
     * count) run the same layer's forward and backward in a loop, so a
     * memory-bound layer is timed as slow as it runs in the pipeline.
     * 0: alone (GPUs, or one device). */
    int contend;
    gp_loss_kind loss;      /* the loss timed on the last layer's output
                               (default cross-entropy) */
    float label_smoothing;  /* its label smoothing (cross-entropy; 0: none) */
    bool say;               /* log what it profiles and, on a long profile,
                               its progress and the time left (a run's
                               balance: auto; gpipe-balance says its own) */
    const _Atomic int *stop; /* non-zero: a signal asked the run to stop; the
                                profile ends before its next layer with
                                GP_ERR_STOPPED (NULL: none) */
} gp_profile_opts;

/* Profile the model given by its layer specs and per-sample input (C, H, W).
 * Memory columns come from the allocator during the largest size's runs and
 * are stored per sample where they scale with the micro-batch. */
gp_status gp_profile_run(const gp_layer_spec *specs, int L, const int64_t input[3],
                         const gp_profile_opts *opts, gp_profile *out);
/* The same model's memory columns from its shapes alone (no device is
 * opened, nothing runs; no times, no workspace; dev, optional, says
 * what its backend keeps for a pooling): what a run checks its
 * activation memory against when no measured profile is cached. */
gp_status gp_profile_estimate(const gp_layer_spec *specs, int L, const int64_t input[3],
                              const gp_profile_opts *opts, struct gp_device *dev,
                              gp_profile *out);
void gp_profile_free(gp_profile *p);
/* Save as JSON / load what gp_profile_save wrote (messages name the file and
 * the key that is wrong). */
gp_status gp_profile_save(const gp_profile *p, const char *path);
gp_status gp_profile_load(const char *path, gp_profile *out);
/* Which model a profile belongs to.  A profile's times hold for the model
 * it was taken of, so gp_profile_run records the input shape, per layer the
 * canonical text of what decides its cost and shape, and a hash of both;
 * gp_profile_save / gp_profile_load carry them (format version 2).
 *
 * gp_profile_layer_spec: the type and every option that changes the
 * layer's cost or output shape, defaults filled in ("linear {out: 10,
 * bias: true}", "maxpool2d {kernel: 2, stride: 2, padding: 0}", "relu");
 * not its name, its position in the file, `in` (fixed by the layers before
 * it) or batch norm's momentum and eps.  Returns buf. */
const char *gp_profile_layer_spec(const gp_layer_spec *s, char *buf, size_t len);
/* FNV-1a (64-bit) over the input shape, every layer's spec text and the
 * skips ("skip 2 -> 4" each; none adds nothing, so a model without skips
 * hashes as before skips were recorded). */
uint64_t gp_profile_model_hash(const gp_layer_spec *specs, int L, const int64_t input[3]);
/* GP_OK if p was taken of this model; else GP_ERR_INVALID naming the
 * difference: the input shape, the number of layers, the first layer
 * whose spec differs ("layer 3 is conv2d {out: 64, ...} there, conv2d
 * {out: 128, ...} here"), or else the hashes.  `path` names the profile. */
gp_status gp_profile_check_model(const gp_profile *p, const char *path,
                                 const gp_layer_spec *specs, int L, const int64_t input[3]);
/* The sizes of sizes[0..n) that p did not measure, into missing[]; returns
 * how many (0: all measured). */
int gp_profile_missing_sizes(const gp_profile *p, const int64_t *sizes, int n,
                             int64_t *missing);

/* Per-layer times at micro-batch size s: exact at a measured size, else
 * linear between the two nearest measured sizes (extrapolated from the
 * nearest two outside them, clamped at 0; proportional with one size).
 * loss / upload may be NULL. */
void gp_profile_times_at(const gp_profile *p, int64_t s, gp_layer_times *out /* [L] */,
                         double *loss, double *upload);

/* ---- stage model --------------------------------------------------------- */

typedef struct gp_stage_times {
    double F, R, B;          /* per micro-batch, seconds */
    double Bd, W;            /* B's two halves, where a schedule splits it
                                (zero bubble): backward-data, -weights */
    double copy_act;         /* receiving the activation (j > 0) */
    double copy_grad;        /* receiving the gradient (j < n - 1) */
    double update;           /* once per step: zero grads + optimizer */
} gp_stage_times;

/* Stage j of n with layers [first, first + count) at micro-batch size s,
 * from per-layer times `lt` (gp_profile_times_at at s).  A skip that
 * arrives from an earlier stage adds its copy to copy_act, one that leaves
 * for a later stage its gradient's copy to copy_grad (the receiving worker
 * copies, as the executor does). */
gp_stage_times gp_stage_times_of(const gp_profile *p, const gp_layer_times *lt, double loss,
                                 double upload, int j, int n, int first, int count);

/* The same figures for the planner's n L^2 stages at O(1) each, bit for bit
 * gp_stage_times_of's (the same terms added in the same order, from running
 * sums kept per first layer, about 20 L^2 bytes once every first is asked).
 * NULL where that would pass 256 MiB (about 3600 layers) or memory runs
 * out: use gp_stage_times_of.  p and lt must outlive it. */
typedef struct gp_stage_sums gp_stage_sums;
gp_stage_sums *gp_stage_sums_new(const gp_profile *p, const gp_layer_times *lt);
gp_stage_times gp_stage_sums_times(gp_stage_sums *s, double loss, double upload, int j, int n,
                                   int first, int count);
void gp_stage_sums_free(gp_stage_sums *s);

/* Peak bytes of stage j's device over one step of m micro-batches of the
 * given sizes under `ckpt`: parameters, gradients, optimizer state and the
 * stage's workspace, plus activations tracked instruction by instruction
 * over the stage's schedule list (what the executor allocates and frees).
 * A skip that arrives from an earlier stage is held like the stage's input
 * (received, kept to the backward, its gradient until copied back), one
 * that leaves like its output. */
double gp_stage_peak_bytes(const gp_profile *p, const gp_schedule *sched, const int64_t *sizes,
                           int j, int first, int count);
/* The same, and level[c] (optional; count[d] entries, d the stage's
 * device) the stage's bytes during instruction c of its device's list
 * (another stage's instruction: what this one holds meanwhile), so a
 * device's stages add up instruction by instruction. */
double gp_stage_peak_trace(const gp_profile *p, const gp_schedule *sched, const int64_t *sizes,
                           int j, int first, int count, double *level);

/* ---- partitioner ---------------------------------------------------------- */

/* A min-max contiguous partition problem: L layers into n stages, stage j =
 * [first, first + count).  cost(j, first, count) is what the stage adds to
 * the critical path; mem (optional, NULL = unconstrained) its peak bytes,
 * which must not exceed capacity[j] (capacity NULL or 0 = unlimited). */
typedef struct gp_partition_problem {
    int L, n;
    double (*cost)(void *arg, int j, int first, int count);
    double (*mem)(void *arg, int j, int first, int count);
    const double *capacity;
    void *arg;
    /* optional: layer k's name for messages ("layer 3 (conv2d)") */
    const char *(*layer_name)(void *arg, int k, char *buf, size_t len);
} gp_partition_problem;

/* The exact optimum: minimises the largest stage cost over every split with
 * at least one layer per stage whose stages fit their capacities; among
 * those, the smallest second-largest stage; remaining ties go to the split
 * that is first in lexicographic order of balance (deterministic).  O(n L^2)
 * calls of cost and mem.  Infeasible: GP_ERR_INVALID for fewer layers
 * than stages; GP_ERR_OOM (memory capacity, as an allocation beyond it is)
 * for a layer that alone exceeds every capacity (saying by how much) or
 * no split that fits (naming the stage that overflows least in the best
 * attempt).
 * out_max / out_second may be NULL. */
gp_status gp_partition_solve(const gp_partition_problem *pb, int *balance, double *out_max,
                             double *out_second);
/* V placement (zb-v): L layers into 2 pb->n stages over pb->n devices, device
 * d holding stage d and stage 2n-1-d (device n-1 holds the two middle
 * stages, n-1 and n, adjacent).  pb->n is the number of DEVICES; cost and
 * mem are called with the STAGE index j in 0..2n-1 and capacity[d] is per
 * device (NULL or 0 = unlimited): a device's time is the sum of its two
 * stages' costs, its bytes the sum of their mem, which must not exceed
 * capacity[d].  balance gets 2n counts (stage order, each >= 1, sum L).
 * The exact optimum, like gp_partition_solve's: minimises the largest
 * device time, then the second-largest; remaining ties go to the first
 * split in a fixed scan order (deterministic, not necessarily the
 * lexicographically first).  Costs need not be monotone in a stage's
 * length nor the same for every stage.  At most about (n - 2) L^4 / 24
 * steps (what cannot beat a feasible split found first is skipped, so
 * usually far fewer) on tables filled by O(n L^2) calls of cost and mem,
 * O(n L^2) memory; refused
 * (GP_ERR_INVALID) past 2^33 steps (about 15 s: n = 8 at 400 layers) or
 * 512 MiB of tables.  Errors as gp_partition_solve's: GP_ERR_INVALID for
 * fewer than 2n layers, GP_ERR_OOM when no split fits memory (a layer that
 * alone exceeds every device, or the device that overflows least in the
 * closest split).  out_max may be NULL. */
gp_status gp_partition_solve_v(const gp_partition_problem *pb, int *balance, double *out_max);
/* For tests: gp_partition_solve_v prunes what cannot beat a feasible
 * split's largest device time (exact: the same split, ties included);
 * false turns that off.  Default true. */
extern bool gp_partition_v_prune;

/* Additive costs (stage cost = sum of its layers' costs), no memory limit. */
gp_status gp_partition_minmax(const double *costs, int L, int n, int *balance);
/* The same placed in a V over n devices (2n stages: gp_partition_solve_v). */
gp_status gp_partition_minmax_v(const double *costs, int L, int n, int *balance);
/* Additive costs and additive memory (bytes per layer) with capacity[j]
 * per stage (0 = unlimited). */
gp_status gp_partition_minmax_mem(const double *costs, const double *mem, const double *capacity,
                                  int L, int n, int *balance);

/* ---- planning from a profile ---------------------------------------------- */

typedef struct gp_plan_opts {
    gp_schedule_kind schedule;    /* the schedule the plan's memory is for */
    int n;                        /* stages (devices) */
    int m;                        /* micro-batches */
    gp_checkpoint_mode checkpoint;
    gp_balance_by by;             /* TIME/BOTH: balance time; SIZE: bytes */
    double capacity[GP_MAX_DEVICES]; /* [j]: bytes stage j may hold, 0 =
                                     unlimited: its device's; interleaved, its
                                     share of it (gp_model_plan_opts gives each
                                     of a device's v stages 1/v) */
    /* interleaved: n = devices x virtual stages, stage j on device j %
     * (n / virtual_stages); 0 or 1: one stage per device */
    int virtual_stages;
    /* zb-v: virtual_stages 2, stage j on device j for j < n / 2, else
     * n - 1 - j (the V): the split is gp_partition_solve_v's, each device's
     * capacity the sum of its two stages' */
    bool v_shape;
    /* the schedule the split is refined against where virtual_stages > 1
     * (interleaved, zb-v, dualpipe-v) */
    gp_schedule_kind sim_kind;
    bool lockstep;                /* the run's (for the simulated refinement) */
    double mem_slack;             /* the refinement's memory pass: how much
                                     longer than the refined step a split that
                                     holds less may simulate (0: the default,
                                     GP_REFINE_MEM_SLACK; < 0: no pass) */
} gp_plan_opts;

/* The balance for `o` from a profile (memory is always a constraint).  By
 * time with virtual_stages > 1 (interleaved), the min-max split of the
 * stages' costs is then refined against the simulated step: the min-max
 * split evens the stages but not the devices, each of which runs the sum
 * of its v stages (bench/convnet.yaml on 2 devices x 2: [7, 4, 4, 8] gives
 * devices 25.3 and 34.6 ms per micro-batch), so stage boundaries move one
 * to three layers at a time while gp_simulate_schedule's free-running
 * step of the interleaved schedule falls (under lockstep the result is
 * kept only if its lockstep step is no longer), every stage stays within
 * its capacity and every device's simulated peak within the sum of its
 * stages' capacities (or, if the min-max split needs more, that).  Then
 * boundaries move past one layer of next to no time (at most
 * GP_REFINE_MEM_LAYER of a stage's mean) while the largest device peak
 * falls and the step stays within GP_REFINE_MEM_SLACK of the refined one
 * and no longer than the min-max split's (which side of a relu a cut falls
 * changes what a stage keeps, not its time); of zb-v's two refined
 * candidates the shorter.  A budget of simulated work bounds the search at
 * large n and m. */
#define GP_REFINE_MEM_SLACK 0.005
#define GP_REFINE_MEM_LAYER 0.02
gp_status gp_balance_plan(const gp_profile *p, const gp_plan_opts *o, int *balance);
/* Models of more than GP_UNIT_MIN_LAYERS layers are split at their repeated
 * blocks, as Megatron-LM splits at Transformer layers: the exact min-max
 * over every layer boundary is O(n L^3) (O(n L^4) in a V), minutes a
 * layout at Llama 3 70B's 883 layers.  The blocks: the shortest period P
 * (2 <= P <= L / 8) at which the layers' specs (gp_layer_mem.spec) repeat
 * over at least half the model, counted from the first layer that
 * repeats; a stage then begins only at a block's first layer or at a
 * layer outside the blocks (Llama's embedding, final norm and head).
 * Writes the units' first layers to start[0..U] (start[U] = L; room for
 * p->L + 1) and returns U, or 0 where the model is not that long or has no
 * such blocks (every layer boundary stays a candidate). */
enum { GP_UNIT_MIN_LAYERS = 400 };
int gp_profile_units(const gp_profile *p, int *start);
/* The partitioner's cost and the peak bytes of each stage of `balance`. */
void gp_balance_stage_costs(const gp_profile *p, const gp_plan_opts *o, const int *balance,
                            double *cost, double *peak_bytes);

/* ---- simulator ------------------------------------------------------------ */

typedef struct gp_sim_result {
    gp_schedule_kind schedule;
    int n, v, m;             /* devices, stages per device (1 but interleaved), micro-batches */
    gp_checkpoint_mode checkpoint;
    double step;             /* seconds per step */
    double bubble;           /* 1 - sum busy / (n * step) */
    double throughput;       /* samples per second */
    double busy[GP_MAX_DEVICES];
    double peak_bytes[GP_MAX_DEVICES];
    bool fits;               /* every peak within its capacity */
} gp_sim_result;

/* Replay gp_schedule_gpipe(n, m, ckpt) instruction list by instruction
 * list, the end of the step included: each device runs its list in order;
 * a copy of clock k starts when every computation of clock k - 1 has
 * finished (lockstep) or when its source is ready (free-running); the
 * BARRIER lets every stage go when the last one reaches it; durations from
 * the stage model at each micro-batch's size, UPDATE from the profile's
 * update time (reductions, commit and gather are not modelled: one
 * replica).  capacity may be NULL. */
gp_status gp_simulate(const gp_profile *p, int n, const int *balance, int m,
                      gp_checkpoint_mode ckpt, bool lockstep, const double *capacity,
                      gp_sim_result *out);
/* The same for any schedule kind (gp_simulate: GPipe) on n devices;
 * interleaved with v stages per device, balance has n v entries, stage j
 * on device j % n (v is ignored by the other kinds; zb-v and dualpipe-v
 * have 2, in a V). */
gp_status gp_simulate_schedule(const gp_profile *p, gp_schedule_kind kind, int n, int v,
                               const int *balance, int m, gp_checkpoint_mode ckpt, bool lockstep,
                               const double *capacity, gp_sim_result *out);
/* The same for a schedule read from a file (kind GP_SCHEDULE_FILE or
 * _FILE_V, v its stages per device; file: the config's
 * pipeline.schedule_file), or any kind where file is NULL. */
gp_status gp_simulate_schedule_file(const gp_profile *p, gp_schedule_kind kind, int n, int v,
                                    const struct gp_schedule_file *file, const int *balance,
                                    int m, gp_checkpoint_mode ckpt, bool lockstep,
                                    const double *capacity, gp_sim_result *out);
/* Each of the n devices' peak bytes (peak[n]) under that schedule, split
 * and m, from the profile's memory columns alone (times are not needed: a
 * gp_profile_estimate will do).  floor (optional, [n]): what each device
 * holds at least, the peak where it runs one stage, else each of its
 * stages' own peak beside the others' weights, gradients and state (the
 * model of stages that share a device errs high: up to 1.7x measured). */
gp_status gp_simulate_memory(const gp_profile *p, gp_schedule_kind kind, int n, int v,
                             const struct gp_schedule_file *file, const int *balance, int m,
                             gp_checkpoint_mode ckpt, double *peak, double *floor);
/* Index into r[0..count) of the recommended run: the smallest m whose
 * throughput is within 5% of the best among those that fit (-1 if none fit). */
int gp_sim_recommend(const gp_sim_result *r, int count);
/* The largest peak_bytes over the run's devices. */
double gp_sim_peak(const gp_sim_result *r);
/* Index into r[0..count) of the run with the smallest peak memory among
 * those that fit and whose throughput is within 5% of the best that fits
 * (ties: the higher throughput); -1 if none fits.  What gpipe-balance
 * --simulate recommends across schedules, checkpoint modes and m. */
int gp_sim_recommend_memory(const gp_sim_result *r, int count);

#endif /* GP_BALANCE_H */
