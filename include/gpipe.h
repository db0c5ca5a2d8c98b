/*
 * gpipe.h — the public C API of gpipe, a pipeline-parallel trainer.
 *
 * Everything a program needs to load a run description (YAML), build the
 * model, train and evaluate it, and read metrics.  Handles are opaque; every
 * function that can fail returns a gp_status and leaves a human-readable
 * message for the calling thread in gp_last_error().
 *
 * Memory: a gp_run from gp_run_load or gp_run_parse is freed with
 * gp_run_free, which accepts NULL (as the functions that return nothing
 * do: gp_run_stop, gp_run_stop_clear; gp_run_devices gives 0).  Any other
 * call with a NULL run, NULL data or a NULL override is GP_ERR_INVALID;
 * out-parameters (gp_metrics *out, loss, accuracy, name, peak, current)
 * may be NULL where not wanted.
 * Threads: a gp_run is used from one thread at a time; distinct runs may
 * be used from distinct threads at once (each starts its own worker
 * threads, and each CPU device takes cores / devices math threads unless
 * pipeline.threads says otherwise, so runs side by side share the cores).
 * gp_run_stop is the exception: any thread, or a signal handler.  A run
 * prepared (its devices open) belongs to its process: in a child of fork()
 * the calls that use its devices or threads (prepare, step, evaluate,
 * train, save, restore, export, device memory) fail with GP_ERR_INVALID,
 * and gp_run_free leaves the parent's threads and devices alone; fork
 * before gp_run_prepare.  A call
 * leaves the calling thread's OpenMP thread count as it found it, though a
 * CPU device may run its ops on that thread meanwhile.  Opening a CPU
 * device turns oneDNN's process-wide primitive cache off (each device
 * keeps its own primitives), for any other oneDNN user in the process too.
 *
 * Processes: a gp_run runs in one process.  In a program started by
 * mpirun or srun as several processes each trains its own copy (a sweep;
 * give each process its own output paths), and the first gp_run_prepare
 * or gp_run_train_ex warns that the run does not span them; stages in
 * separate processes are gpipe-train's (docs/processes.md).
 */
#ifndef GPIPE_H
#define GPIPE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPIPE_VERSION_MAJOR 0
#define GPIPE_VERSION_MINOR 1
#define GPIPE_VERSION_PATCH 0

/* Status codes.  The integer values are stable (they are part of the ABI). */
typedef enum gp_status {
    GP_OK = 0,
    GP_ERR_INVALID = 1,     /* bad argument or configuration */
    GP_ERR_IO = 2,          /* file missing, unreadable, unwritable */
    GP_ERR_DATA = 3,        /* malformed or truncated data file */
    GP_ERR_OOM = 4,         /* a device's memory capacity was exceeded (or
                               no split of the model fits the devices'
                               capacities), or the host's memory ran out */
    GP_ERR_NUMERIC = 5,     /* NaN or Inf in the loss or gradients */
    GP_ERR_UNSUPPORTED = 6, /* feature or device not available in this build */
    GP_ERR_RUNTIME = 7,     /* a backend library call failed */
    GP_ERR_CANCELLED = 8,   /* stopped because another worker failed */
    GP_ERR_STOPPED = 9      /* training stopped between steps on request (a
                               signal: gp_run_stop); what could be kept was
                               (see gp_run_train) */
} gp_status;

/* "ok", "invalid", ... */
const char *gp_status_name(gp_status s);
/* The calling thread's last error message ("" if there has been none).  A
 * call that succeeds leaves it as it was (as errno): read it after a
 * status other than GP_OK.  Messages name what the caller gave as the
 * library takes it ("override train.steps=...", gp_train_options.resume),
 * not as gpipe-train's flags (--set, --resume). */
const char *gp_last_error(void);
/* "MAJOR.MINOR.PATCH", from GPIPE_VERSION_* */
const char *gp_version(void);
/* How much gpipe logs on stderr, for the whole process: "debug", "info"
 * (the default), "warn", "error" or "quiet" (nothing); NULL goes back to
 * the environment's GPIPE_LOG.  Anything else is GP_ERR_INVALID.  Errors
 * are returned (gp_last_error), not logged, whatever the level. */
gp_status gp_set_log_level(const char *level);

/* ---- running a configuration --------------------------------------------
 * The same path gpipe-train takes: load YAML (+ overrides), open the
 * devices, place the model's stages, and train; or drive the steps from your
 * own loop with your own data. */

typedef struct gp_run gp_run;

/* Load `path` and apply `n_overrides` strings of the form "a.b.c=value"
 * (value parsed as YAML).  Errors name file:line:column. */
gp_status gp_run_load(const char *path, const char *const *overrides,
                      int n_overrides, gp_run **out);
/* The same for a run that will go on from the snapshot `resume` (its
 * path, or "latest": train.snapshot.dir's newest), by gp_run_restore or
 * gp_train_options.resume: where model.init_from's folder is gone and
 * model.llama leaves its sizes to that folder's config.json, the copy of
 * the file the snapshot keeps stands for it.  resume NULL: gp_run_load. */
gp_status gp_run_load_resume(const char *path, const char *const *overrides, int n_overrides,
                             const char *resume, gp_run **out);
/* The same from YAML text; `name` stands for the file name in messages. */
gp_status gp_run_parse(const char *name, const char *yaml,
                       const char *const *overrides, int n_overrides,
                       gp_run **out);
/* Closes the run's devices, joins its worker threads and frees it, its
 * model and its configuration; it saves nothing (gp_run_save first for a
 * snapshot).  Call it after the run's other calls have returned (to end a
 * gp_run_train early: gp_run_stop, then let it return).  NULL: nothing.
 * In a child of fork(): the run and its configuration only; the child's
 * copy of the model is left as it is (its threads and devices are the
 * parent's: above). */
void gp_run_free(gp_run *run);

typedef struct gp_metrics {
    int64_t step;          /* optimizer steps taken so far */
    /* loss, accuracy, lr, seconds: NaN where no step ran (a new or just
     * restored run; a gp_run_train resumed at or past its end) */
    double loss;           /* last step: mean training loss */
    double accuracy;       /* last step: training accuracy */
    double lr;             /* last step's learning rate */
    double seconds;        /* last step's wall time */
    double test_loss;      /* last evaluation (NaN if none) */
    double test_accuracy;
    double grad_norm;      /* last step: the gradients' global L2 norm before
                              clipping (train.clip_grad_norm); NaN without */
} gp_metrics;

/* Open the devices and build the placed model (done by the first step if
 * not called), from model.init_from's weights if the config names them.
 * With pipeline.balance: auto this profiles the layers on the device (a
 * second or so), so two runs may split a model differently where layers
 * time alike; GPIPE_BALANCE=flops in the environment balances by estimated
 * FLOPs instead, the same split every time.  The shapes a batch needs
 * are known before it: gp_run_describe. */
gp_status gp_run_prepare(gp_run *run);
/* Before gp_run_prepare (or gp_run_restore): the run will only predict
 * and decode (gp_run_predict, gp_decoder_open), so its model is built
 * without gradients or optimizer state, and the start-up memory check
 * counts the weights alone (gpipe-sample: a 3B model needs its 12 GiB of
 * weights, not training's 48).  gp_run_step and gp_run_train_ex on it are
 * refused.  An error once the run is prepared. */
gp_status gp_run_inference_only(gp_run *run);
/* One pipelined optimizer step on your own batch: x is (n, C, H, W) floats
 * (already normalised), y holds n class ids as floats (model.loss:
 * cross_entropy; n x T of them, sample after sample, for a model whose
 * output is (N, T, classes), with x then n x T token ids) or, with model.loss: bce_with_logits, one target in
 * [0, 1] per element of the model's output, sample after sample (a mask
 * (n, 1, H, W)).  Loss and accuracy are then per element.  The learning
 * rate follows the config's schedule over `total_steps` (0 or less: no
 * schedule, train.optimizer.lr with its lr_scaling).  x holds n x
 * gp_run_info.input_numel floats and y n x target_numel (gp_run_describe).
 * A NaN or Inf in x is refused before anything is computed (GP_ERR_DATA,
 * naming its sample and index; the model is as it was and the run goes
 * on); a bad label or target is refused by the loss, naming its device,
 * stage and micro-batch, and the step is undone (the model as it was, the
 * run goes on); so is any other failure before the update begins (out of
 * memory on a device, a device error in a forward or backward).  A loss
 * or parameter that is not finite (GP_ERR_NUMERIC: a model that diverged)
 * is found after the step's update, and a failure while the stages or
 * replicas update leaves some updated and others not: the run then
 * refuses further steps, evaluation and exports until gp_run_restore (or
 * start a new one).  With train.clip_grad_norm, gradients that are not
 * finite are found before the update instead: the step fails
 * (GP_ERR_NUMERIC, "the update was skipped"), the model is as it was, and
 * the run goes on. */
gp_status gp_run_step(gp_run *run, const float *x, const float *y, int64_t n,
                      int64_t total_steps, gp_metrics *out);
/* Train on the config's data as gpipe-train does (metrics_path may be NULL).
 * After gp_run_stop it stops between steps and returns GP_ERR_STOPPED: it
 * finishes the step under way, writes a final snapshot when the config
 * takes snapshots (train.snapshot; else the message says that nothing was
 * saved since the last one), closes the metrics file as valid JSON Lines,
 * and keeps the model trained so far with the run (as gp_run_train_ex
 * says); gp_last_error() says at which step and why. */
gp_status gp_run_train(gp_run *run, const char *metrics_path, gp_metrics *out);
/* What gpipe-train's options do, for gp_run_train_ex.  Start from
 * GP_TRAIN_OPTIONS_INIT (every field off) and set what you need; a zeroed
 * struct is the same (the trace steps count only with a trace_path). */
typedef struct gp_train_options {
    const char *metrics_path;   /* JSON Lines, one object per step and per
                                   evaluation (docs/timelines-and-metrics.md); NULL: none */
    const char *trace_path;     /* Chrome-trace JSON timeline; NULL: none */
    int64_t trace_first;        /* the steps it records, 0-based, from ... */
    int64_t trace_last;         /* ... to (inclusive); < 0: to the end */
    const char *resume;         /* a snapshot to go on from: its path, or
                                   "latest" (the newest in train.snapshot.dir);
                                   NULL: a fresh run */
    const char *export_weights; /* write the final weights there (safetensors);
                                   NULL: none */
    int progress;               /* 1: a progress line on stderr, 0: log lines,
                                   -1: a progress line where stderr is a terminal */
    int quiet;                  /* nonzero: only warnings and errors (no
                                   progress, no info lines) */
} gp_train_options;
#define GP_TRAIN_OPTIONS_INIT {NULL, NULL, 0, -1, NULL, NULL, 0, 0}
/* gp_run_train with gpipe-train's options (gp_run_train is this with
 * metrics_path alone; opts NULL: every option off).  Outputs that would replace an input (the config,
 * the snapshot resumed, each other) are refused before any work.  Each
 * call trains from the start (fresh weights, model.init_from, or
 * opts->resume), as gpipe-train does, not from the run's current model;
 * once it trained (GP_OK, or GP_ERR_STOPPED after a step) its model
 * replaces the run's and *out holds its last step; on any other error the
 * run keeps the model it had, and *out (where given) says step 0 with NaN
 * for every number: nothing trained. */
gp_status gp_run_train_ex(gp_run *run, const gp_train_options *opts, gp_metrics *out);
/* Ask a gp_run_train under way (or the next one) to stop after the current
 * step.  `signo` (> 0) is the cause named in the message, normally the
 * signal that asked (<= 0: "a stop request", no signal).  Async-signal-safe and thread-safe: one store to a
 * lock-free atomic, so a SIGINT / SIGTERM handler may call it (gpipe
 * installs no handler itself).  Better, as gpipe-train does: block the
 * signals before training starts (its threads inherit the mask) and take
 * them with sigwait() on a thread of your own, so no signal interrupts a
 * computing thread.  gpipe-train then exits with 128 + the signal's
 * number (130 SIGINT, 143 SIGTERM, 129 SIGHUP, 138 SIGUSR1); a second signal there
 * 2 s or more after the first exits at once (one sooner is the same stop).
 * The request stays: later calls to gp_run_train on this run stop before
 * their first step. */
void gp_run_stop(gp_run *run, int signo);
/* Withdraw a stop request (gp_run_stop's), so that the next gp_run_train
 * on this run trains.  gp_run_step never looks at the request: a loop of
 * your own decides itself when to stop. */
void gp_run_stop_clear(gp_run *run);

/* Loss and accuracy, in evaluation mode (batch norm's running statistics,
 * no dropout), of the run's model on your batch: x and y as for
 * gp_run_step, evaluated train.eval_batch_size samples at a time (halved
 * where that does not fit a device).  The run's model is the one
 * gp_run_step trains, or the one the last gp_run_train(_ex) trained (it
 * stays with the run; later steps go on from it).  Prepares the run if
 * needed.  A NaN or Inf in x is GP_ERR_DATA, as for gp_run_step. */
gp_status gp_run_evaluate(gp_run *run, const float *x, const float *y, int64_t n,
                          double *loss, double *accuracy);
/* The run's model's outputs for n samples x (as for gp_run_evaluate, in
 * evaluation mode, through its stages) into out: n x output_numel floats
 * (gp_run_describe), the logits before the loss.  A language model's
 * next-token logits, for sampling (gpipe-sample); a padded vocabulary's
 * (model.gpt.vocab_pad) past gp_run_info.classes are no tokens.  One
 * process only. */
gp_status gp_run_predict(gp_run *run, const float *x, int64_t n, float *out);
/* Sampling with a KV cache.  A decoder holds, for `samples` sequences, each
 * attention layer's keys and values of the positions fed so far, up to
 * model.input's T, on that layer's device.  gp_decoder_feed appends n
 * positions to every sequence and computes only them: a new token costs a
 * position per layer, not a forward over T.  Its logits are
 * gp_run_predict's for those positions of the sequence from position 0,
 * within rounding (the products may sum a row in another order than a
 * window).  For language models whose layers a Transformer decoder has
 * (embedding first; linear, layer_norm, rms_norm, gelu, relu, leaky_relu,
 * swiglu, rope, attention, add, dropout, identity), across stages and devices as
 * the run places them; anything else is GP_ERR_UNSUPPORTED naming the
 * layer.  One process.  The run's model must stay as it is while a cache
 * is filled: a feed after a step is refused until a rewind to 0.  Free
 * it before the run, and before gp_run_train(_ex), which replaces the
 * run's model and devices, and gp_run_restore, which replaces its weights:
 * both are refused (GP_ERR_INVALID) while a decoder is open. */
typedef struct gp_decoder gp_decoder;
gp_status gp_decoder_open(gp_run *run, int64_t samples, gp_decoder **out);
/* ids (samples, n): the next n token ids of each sequence (as floats).
 * out: (samples, n, row) logits of every new position when `all` is
 * nonzero, else (samples, row) of each sequence's last new position (a
 * last layer that acts on each position alone then runs on it alone; an
 * attention, rope or embedding runs on all n, which it needs); row =
 * gp_run_info.output_numel / T, a padded vocabulary's padding included.
 * Past T positions in all: GP_ERR_INVALID (rewind and feed the last ones
 * again); a failed feed leaves the positions fed before it. */
gp_status gp_decoder_feed(gp_decoder *dec, const float *ids, int64_t n, int all, float *out);
/* Positions fed so far, and the most there is room for (T). */
int64_t gp_decoder_length(const gp_decoder *dec);
int64_t gp_decoder_capacity(const gp_decoder *dec);
/* Forget the positions from `length` on (0: all), to feed others after. */
gp_status gp_decoder_rewind(gp_decoder *dec, int64_t length);
void gp_decoder_free(gp_decoder *dec);
/* Write the weights of the run's model (as for gp_run_evaluate) to `path` as a
 * safetensors file (PyTorch's state_dict names; docs/snapshots-and-weights.md), readable by model.init_from and safetensors' loaders. */
gp_status gp_run_export_weights(gp_run *run, const char *path);
/* What a caller needs to size its batches and report on the run, from the
 * config alone (shapes only: no device is opened, nothing is trained), or
 * from the run's model once prepared.  Fields are only ever appended. */
typedef struct gp_run_info {
    int64_t input[3];      /* one sample's input (C, H, W) */
    int64_t input_numel;   /* floats per sample in x: C x H x W */
    int64_t output_numel;  /* the model's output per sample: its classes
                              (model.loss: cross_entropy), or the elements
                              of its map (bce_with_logits) */
    int64_t target_numel;  /* floats per sample in y: 1 (a class id), T (a
                              class id per position of an (N, T, classes)
                              output), or output_numel (bce_with_logits'
                              targets) */
    int64_t batch_size;    /* train.batch_size */
    int64_t parameters;    /* trainable parameters (--dry-run's count) */
    int64_t step;          /* optimizer steps the run's model has taken */
    int devices;           /* devices of the pipeline, every replica's */
    int64_t classes;       /* model.loss: cross_entropy: the classes it reads of
                              the output's last dimension, the first ones: all
                              of them, or of a padded vocabulary
                              (model.gpt.vocab_pad) the real ones (a logit past
                              them is no token: sample below this); 0 for
                              bce_with_logits */
    int fresh;             /* 1 when the weights are the random initial draw:
                              no model.init_from, no snapshot restored, no step
                              taken (gpipe-sample says so before it samples) */
} gp_run_info;
gp_status gp_run_describe(const gp_run *run, gp_run_info *out);

/* Save the run's model to `path` as a snapshot: weights, batch-norm
 * statistics, the optimizer's state and the step count, written atomically
 * (a crash leaves what was at `path` as it was).  For your own gp_run_step
 * loop: gp_run_restore puts exactly this back, so the steps after it
 * repeat bit for bit what they would have been (the data and its order are
 * yours to keep: the snapshot records no data position, and gpipe-train
 * --resume of it starts its data at the first batch, saying so). */
gp_status gp_run_save(gp_run *run, const char *path);
/* Restore the run's model from a snapshot (gp_run_save's or gpipe-train's):
 * weights, statistics, optimizer state and step, all or nothing (names and
 * shapes must match this run's model; the message lists any that do not;
 * on an error the model is as it was).  The run's config stays this run's;
 * a snapshot made with another train.seed is a warning.  Also the way on
 * for a run whose model diverged (GP_ERR_NUMERIC).  path "latest": the
 * newest complete snapshot in the config's train.snapshot.dir, as
 * gpipe-train --resume latest.  On a run not yet prepared it prepares it
 * without drawing the random initial values the snapshot replaces (a
 * large model's start-up: see gpipe-sample --resume); refused there, the
 * run is unprepared again and a later gp_run_prepare draws them. */
gp_status gp_run_restore(gp_run *run, const char *path);
/* Whether `path` can take a file the caller will write (created beside it
 * and renamed over it), checked before the work that makes it: not the
 * run's config or model.init_from (it would replace an input), and a
 * writable place (the directory exists and takes a new file; not a
 * directory, /proc, ...).  The error names `what` (the caller's flag) and
 * the system's reason.  Creates nothing. */
gp_status gp_run_check_output(const gp_run *run, const char *path, const char *what);

/* Print the model summary gpipe-train --dry-run prints (per layer: device,
 * output shape, parameters, FLOPs, activation bytes; stages; skips) to f.
 * Builds the model as shapes only: no weights are allocated, and a device
 * this machine lacks is a note, not an error.  f NULL: stdout. */
gp_status gp_run_summary(const gp_run *run, FILE *f);

/* Devices of the pipeline (0 until the run is prepared, and after a
 * failed gp_run_prepare) and their memory high-water marks in bytes.
 * *name stays valid until the run's devices change (gp_run_train(_ex)
 * replaces them) or gp_run_free. */
int gp_run_devices(const gp_run *run);
gp_status gp_run_device_memory(const gp_run *run, int device, const char **name,
                               size_t *peak_bytes, size_t *current_bytes);

#ifdef __cplusplus
}
#endif
#endif /* GPIPE_H */
