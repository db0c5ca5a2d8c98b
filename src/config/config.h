/*
 * config.h — a run description: YAML in, plain structs out.
 *
 * gp_config_load() parses one YAML file with libyaml, applies `--set`
 * overrides (each "a.b.c=value", the value parsed as YAML), fills defaults
 * and validates ranges.  No libyaml type leaves this module.
 *
 * Errors carry "file:line:column: message" plus a hint (unknown key with a
 * "did you mean", wrong type, out-of-range value, unknown layer type).  An
 * error inside an override names the override ("--set train.lr=abc: ...").
 * Unknown keys are errors, never silently ignored.  A value that is valid
 * but most likely a mistake is a warning (gp_config.warnings, and logged).
 *
 * Owns: the run spec and its validation.  May call: core, layers (layer
 * specs) and pipeline/schedule.h (the schedule and checkpoint enums); the
 * modules that run the spec (train, tools) sit above it.
 *
 * Memory: gp_config is a plain value; gp_config_free releases its arrays.
 * Thread safety: none needed (pure functions over their arguments).
 */
#ifndef GP_CONFIG_H
#define GP_CONFIG_H

#include "layers/layers.h"
#include "pipeline/schedule.h"

#define GP_MAX_CHANNELS 4

typedef enum { GP_DATASET_SYNTHETIC = 0, GP_DATASET_MNIST, GP_DATASET_FASHION_MNIST,
               GP_DATASET_CIFAR10, GP_DATASET_IMAGE_FOLDER,
               GP_DATASET_TOKENS /* llm.c token files (data.h) */ } gp_dataset_kind;
typedef enum { GP_LAYOUT_CLASSIFICATION = 0, GP_LAYOUT_SEGMENTATION } gp_data_layout;
typedef enum { GP_SCHED_CONSTANT = 0, GP_SCHED_STEP, GP_SCHED_COSINE } gp_sched_kind;
typedef enum { GP_LR_SCALING_NONE = 0, GP_LR_SCALING_LINEAR } gp_lr_scaling;

typedef struct gp_device_spec {
    char name[32];        /* "cpu:0" */
    size_t memory;        /* capacity in bytes, >= 1 when given; 0 = not given
                             (pipeline.memory, else unlimited) */
    int threads;          /* math threads; 0 = default split */
} gp_device_spec;

typedef struct gp_model_config {
    int64_t input[3];     /* (C, H, W) of one sample; for flat inputs (F,1,1) */
    gp_layer_spec *layers;/* n_layers entries, owned */
    int n_layers;
    gp_loss_kind loss;    /* model.loss; default cross_entropy (class ids);
                             bce_with_logits takes one target per output
                             element (masks) */
    float label_smoothing; /* cross_entropy's, in [0, 1); default 0 */
    char init_from[512];  /* safetensors file; "" = fresh init */
    char input_at[600];   /* where model.input was given ("my.yaml:3:10",
                             "--set model.input=[3,8,8]"), for messages that
                             compare it with the data; "" when built in C */
    char loss_at[600];    /* where model.loss was given; "" when defaulted */
    char family[16];      /* the built-in model the layers came from
                             ("resnet", "amoebanet", "unet"); "" for a list */
    char family_at[600];  /* where it was given */
    /* The text of model.init_from's config.json where model.llama's sizes
     * came from it (owned; NULL otherwise): snapshots keep it, so that a
     * run resumes, samples and exports after that folder is gone (issue 77
     * item 18). */
    char *hf_config;
} gp_model_config;

/* pipeline.copy_precision: the tensors copied between stages in FP32 or
 * bfloat16; auto: bfloat16 exactly when train.precision is bf16. */
typedef enum { GP_COPY_AUTO = 0, GP_COPY_FP32, GP_COPY_BF16 } gp_copy_precision;

typedef struct gp_pipeline_config {
    /* Replica r's stage j runs on devices[r * n_devices + j]; replica 0's
     * are the first n_devices.  A grid [[cpu:0, cpu:1], [cpu:2, cpu:3]]
     * gives one row per replica; a plain list with replicas: R shifts the
     * listed indices by r x n_devices for replica r. */
    gp_device_spec devices[GP_MAX_DEVICES];
    int n_devices;        /* devices per replica (stages); default 1: [cpu:0] */
    int balance[GP_MAX_DEVICES]; /* layers per stage */
    int n_balance;        /* 0 = balance: auto */
    int chunks;           /* micro-batches per mini-batch; default 1 */
    gp_checkpoint_mode checkpoint; /* default except_last */
    gp_ckpt_keep checkpoint_keep; /* pipeline.checkpoint.keep: the layer types
                                     a checkpointed forward keeps; 0 (default):
                                     none, its input only */
    bool lockstep;        /* default gp_lockstep_default(schedule): true
                             for gpipe, false (free-running) otherwise */
    bool lockstep_given;  /* pipeline.lockstep was written in the config:
                             the simulator's sweep over schedules keeps it
                             for every schedule, else each takes its own
                             default */
    gp_schedule_kind schedule; /* default gpipe */
    int virtual_stages;   /* pipeline.virtual: stages per device; 1, or >= 2
                             (default 2) with schedule: interleaved; 2 with
                             zb-v; a schedule file's stages / devices */
    /* pipeline.schedule: {file: PATH} (schedule GP_SCHEDULE_FILE or
     * _FILE_V): the file as given, and its orders, read and checked when
     * the config is (owned: gp_config_free) */
    char schedule_path[1024];
    struct gp_schedule_file *schedule_file;
    int threads;          /* per CPU device; 0 = cores / devices */
    size_t memory;        /* default capacity per device, >= 1 when given;
                             0 = not given, unlimited */
    int replicas;         /* data-parallel replicas; default 1 (or the grid's rows) */
    gp_copy_precision copy_precision; /* what crosses a stage boundary; default
                                         auto (gp_config_bf16_copies) */
    double peer_timeout;  /* processes: seconds a rank waits for another before
                             every rank is stopped (procs.h, the watchdog);
                             0 = GP_PEER_TIMEOUT_DEFAULT */
    char devices_at[600]; /* where pipeline.devices was given ("my.yaml:9:12",
                             "--set pipeline.devices=..."), for a device
                             that cannot be opened; "" by default or in C */
    char memory_at[600];  /* where pipeline.memory was given, likewise, for a
                             device whose stages do not fit it */
} gp_pipeline_config;

/* The lockstep schedule k runs under in a sweep over schedules (the
 * simulator's, gpipe-balance --simulate's and the run-end suggestion's):
 * the config's lockstep where it wrote one, else k's own default. */
static inline bool gp_config_lockstep_for(const gp_pipeline_config *pc, gp_schedule_kind k)
{
    return pc->lockstep_given ? pc->lockstep : gp_lockstep_default(k);
}

/* pipeline.peer_timeout's default, seconds: longer than any wait a healthy
 * run has (one rank profiling balance: auto or writing a snapshot while
 * the others wait). */
#define GP_PEER_TIMEOUT_DEFAULT 600.0

/* Data-parallel replicas, at least 1 (a zeroed struct's 0 is 1). */
static inline int gp_pipeline_replicas(const gp_pipeline_config *pc)
{
    return pc->replicas > 1 ? pc->replicas : 1;
}
/* Whether every replica's devices are the first replica's with their
 * indices shifted by r x n_devices, each spec otherwise the same: what a
 * plain list with replicas: R derives (so a writer may give that). */
bool gp_pipeline_replicas_shifted(const gp_pipeline_config *pc);
/* Devices of all replicas: n_devices x replicas. */
static inline int gp_pipeline_devices_total(const gp_pipeline_config *pc)
{
    return pc->n_devices * gp_pipeline_replicas(pc);
}
/* Whether a device spec names a CPU device, and how many of all replicas'
 * devices do (they share the machine's cores). */
bool gp_device_spec_is_cpu(const gp_device_spec *d);
int gp_pipeline_cpu_devices(const gp_pipeline_config *pc);

typedef struct gp_data_config {
    gp_dataset_kind dataset;  /* default fashion-mnist */
    char path[512];           /* directory; default per dataset */
    bool shuffle;             /* default true */
    bool normalize;           /* default true */
    float mean[GP_MAX_CHANNELS]; /* per channel; default dataset statistics */
    float std[GP_MAX_CHANNELS];
    int n_mean;               /* 0 = dataset default */
    char mean_at[160];        /* where data.mean and data.std were given, for messages:
                                 "f.yaml:9:9", or "--set data.mean=[...]" where one was
                                 set by an override; "" for the default */
    int crop_padding;         /* random crop with this zero padding; 0 = off */
    bool hflip;               /* random horizontal flip */
    int prefetch;             /* batches queued ahead; default 2 */
    int64_t train_limit;      /* use the first N training samples; 0 = all */
    int64_t test_limit;       /* likewise for the test split */
    int64_t synthetic_train;  /* synthetic dataset sizes; default 1024/256 */
    int64_t synthetic_test;
    int synthetic_classes;    /* default 10 */
    bool synthetic_masks;     /* each sample also gets a 0 / 1 mask of its
                                 pixels (gp_data_make_masks), the targets of
                                 model.loss: bce_with_logits; default false */
    int64_t synthetic_shape[3]; /* (C, H, W) of a synthetic sample; zeros =
                                   1 x 28 x 28 */
    /* image_folder (docs/config.md "Image folders") */
    gp_data_layout layout;    /* default classification */
    bool masks_binary;        /* segmentation masks: any non-zero -> 1
                                 (binary, default) or the value (index) */
    int workers;              /* decode threads; 0 = the cores the devices
                                 leave (gp_data_workers) */
    bool skip_bad_files;      /* on_bad_file: skip (warn once, count) vs
                                 error (default) */
    char cache_dir[512];      /* where the file index is cached; "" =
                                 beside the data (~/.cache/gpipe if that is
                                 read-only) */
    bool rrc;                 /* random resized crop for training; default
                                 true */
    float rrc_scale[2];       /* area fraction range; default [0.08, 1] */
    float rrc_ratio[2];       /* aspect range; default [3/4, 4/3] */
    int resize;               /* evaluation: shorter side before the centre
                                 crop; 0 = crop x 256 / 224 */
    int64_t image_shape[3];   /* model.input: (3, crop height, crop width) */
    int64_t token_vocab;      /* the model reads token ids (its first layer an
                                 embedding): its vocabulary (the valid rows
                                 of a padded one), and synthetic data are
                                 token windows of model.input[0] + 1 ids;
                                 0 otherwise */
} gp_data_config;

/* data.augment.resize in effect for a centre crop of out_h x out_w: the
 * given one, else the crop's shorter side x 256 / 224 (torchvision's
 * ImageNet evaluation; image_folder.c resizes to it, and the config check
 * that the crop fits holds it against the crop). */
int gp_data_config_resize(const gp_data_config *dc, int64_t out_h, int64_t out_w);

typedef struct gp_optim_config {
    char type[16];            /* "sgd", "adam" or "adamw" */
    int kind;                 /* gp_optim_kind (optim.h): 0 sgd, 1 adam, 2 adamw */
    double lr;                /* default 0.01 (sgd), 0.001 (adam, adamw) */
    float momentum;           /* sgd; default 0.9 (0 for adam, adamw) */
    bool nesterov;            /* sgd; default false */
    float beta1, beta2;       /* adam, adamw; default 0.9, 0.999 */
    float eps;                /* adam, adamw; default 1e-8 */
    float weight_decay;       /* default 0 (adamw: 0.01) */
    bool decay_bias_and_norm; /* apply weight decay to biases/norm params;
                                 default false (they are exempt) */
} gp_optim_config;

typedef struct gp_sched_config {
    gp_sched_kind kind;       /* default constant */
    int64_t warmup_steps;     /* linear warm-up from warmup_start * lr */
    double warmup_start;      /* default 0 */
    int64_t step_size;        /* step: decay every step_size steps */
    double gamma;             /* step: factor; default 0.1 */
    double min_lr;            /* cosine: floor; default 0 */
} gp_sched_config;

/* Snapshots (docs/snapshots.md): taken between steps when either trigger
 * fires; the newest `keep` are kept in `dir`. */
typedef struct gp_snapshot_config {
    int64_t every_steps;      /* 0 = no step trigger */
    float every_minutes;      /* 0 = no time trigger */
    int64_t keep;             /* default 3, >= 1 */
    char dir[512];            /* default "snapshots" */
} gp_snapshot_config;

typedef struct gp_train_config {
    int64_t epochs;           /* default 1; ignored if steps > 0 */
    int64_t steps;            /* total optimizer steps; 0 = use epochs */
    int64_t batch_size;       /* default 64 */
    uint64_t seed;            /* default 0 */
    int precision;            /* gp_precision: fp32 (default), tf32, bf16 */
    int activations;          /* gp_act_storage: what every layer output, its
                                 gradient, skip and copy between stages is
                                 stored as; default auto (gp_config_act_dtype) */
    bool deterministic;       /* algorithms that repeat bit for bit (CUDA: cuDNN's
                                 heuristics, deterministic only); default false:
                                 the fastest measured */
    gp_optim_config optim;
    gp_sched_config sched;
    gp_lr_scaling lr_scaling; /* default none */
    int64_t base_batch;       /* for linear scaling; default batch_size */
    int64_t log_every;        /* log line every N steps; default 50 */
    bool eval_each_epoch;     /* default true */
    int64_t eval_batch_size;  /* default 1000 */
    float clip_grad_norm;     /* > 0: the gradients of all parameters scaled
                                 so that their global L2 norm is at most this
                                 (PyTorch's clip_grad_norm_); 0 (default): off */
    gp_snapshot_config snapshot;
    char tensorboard[512];    /* TensorBoard event files' directory; "" (default): none */
} gp_train_config;
/* base: optimizer.lr, scaled by lr_scaling (the rate without a schedule;
 * train/lr_schedule.c's schedules start from it). */
double gp_lr_base(const gp_train_config *t);

typedef struct gp_config {
    char path[512];           /* file it came from */
    gp_model_config model;
    gp_pipeline_config pipeline;
    gp_data_config data;
    gp_train_config train;
    /* Human-readable list of the defaults that were applied, one per line,
     * for --dry-run / -v (owned). */
    char *defaults_applied;
    /* Values that are valid but most likely a mistake (threads far above
     * this machine's cores), one per line, each starting with
     * "file:line:column: " or "--set ...: " (owned; "" when none).
     * gp_config_parse also logs each line with GP_WARN. */
    char *warnings;
    /* What it was made from, stored in snapshots so a run can be resumed
     * from the snapshot alone (owned; "" when unknown): the YAML text and
     * the overrides, one per line. */
    char *text;
    char *overrides;
} gp_config;

/* The batch one replica's pipeline splits into pipeline.chunks
 * micro-batches: train.batch_size over pipeline.replicas, rounded up (a
 * step splits the batch R x chunks ways, replica by replica), so its
 * micro-batches are at most ceil(batch / (R chunks)).  What the planner,
 * the profile and the simulator size a pipeline by. */
static inline int64_t gp_config_replica_batch(const gp_config *cfg)
{
    int R = gp_pipeline_replicas(&cfg->pipeline);
    return (cfg->train.batch_size + R - 1) / R;
}

/* The largest config file gp_config_load reads (16 MiB). */
#define GP_CONFIG_MAX_BYTES ((size_t)16 << 20)

/* Load and validate.  overrides[i] is "a.b.c=value". */
gp_status gp_config_load(const char *path, const char *const *overrides,
                         int n_overrides, gp_config *out);
/* Parse from a string (tests, and the library API); `name` is used in
 * messages in place of a file name. */
gp_status gp_config_parse(const char *name, const char *text, size_t len,
                          const char *const *overrides, int n_overrides,
                          gp_config *out);
void gp_config_free(gp_config *c);

/* Where a config's inputs may be found besides the files it names.  Issue
 * 77 item 18: a run whose model.llama sizes came from model.init_from's
 * config.json resumes from its snapshot, and samples from it, after that
 * folder is gone, since the snapshot keeps the file's text. */
typedef struct gp_config_sources {
    /* init_from's config.json as the run was made with it, where the
     * folder cannot be read now: *text malloc'd, or NULL where none is
     * known, and `from` naming where it was kept.  snapshot_dir: the
     * YAML's train.snapshot.dir ("snapshots" where it gives none). */
    gp_status (*hf_config)(void *ctx, const char *init_from, const char *snapshot_dir,
                           char **text, char *from, size_t from_len);
    void *ctx;
} gp_config_sources;

gp_status gp_config_load_with(const char *path, const char *const *overrides,
                              int n_overrides, const gp_config_sources *src, gp_config *out);
gp_status gp_config_parse_with(const char *name, const char *text, size_t len,
                               const char *const *overrides, int n_overrides,
                               const gp_config_sources *src, gp_config *out);
/* c's YAML (c->text) with its overrides (c->overrides) written in, which
 * loads without overrides to the config c is: the top-level sections no
 * override touches as the file has them (comments kept), the touched ones
 * written again from the overridden tree after them, and the top-level
 * section `drop` (NULL: none) left out, for a caller that writes it
 * itself (gpipe-balance --write, the pipeline section).  *out: malloc'd. */
gp_status gp_config_text_applied(const gp_config *c, const char *drop, char **out);
/* Every key a config may contain, with its type, default, range and
 * meaning, printed to f from the table the parser checks keys and getters
 * against (config_keys.c): plain text, one key per entry, or Markdown
 * tables (gpipe-train --help-config[=markdown]). */
void gp_config_help(FILE *f, bool markdown);

const char *gp_checkpoint_mode_name(gp_checkpoint_mode m);
/* train.activations: auto (bf16 under precision bf16 where every device
 * is a GPU, else fp32: gp_config_act_dtype), fp32, bf16 (with
 * precision fp32 or tf32: FP32 math with one rounding at each layer
 * output, the storage-only mode). */
typedef enum { GP_ACT_AUTO = 0, GP_ACT_FP32, GP_ACT_BF16 } gp_act_storage;
/* The element type c's activations are stored in (activations resolved). */
gp_dtype gp_config_act_dtype(const gp_config *c);
/* Whether c's pipeline copies are packed to bfloat16 to travel
 * (copy_precision resolved): never where the activations are stored in
 * bf16 already, which travel as they are. */
bool gp_config_bf16_copies(const gp_config *c);
const char *gp_dataset_name(gp_dataset_kind k);

#endif /* GP_CONFIG_H */
