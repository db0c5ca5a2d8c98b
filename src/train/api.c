/*
 * api.c — the public gp_run API of include/gpipe.h over the config, model,
 * pipeline and trainer modules.
 */
#include "gpipe.h"
#include "backend/elementwise.h"
#include "train/snapshot.h"
#include "train/train.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct gp_run {
    gp_config cfg;
    gp_device *devs[GP_MAX_DEVICES];
    int n_dev;
    gp_model *model;    /* heap: the pipeline holds pointers into it */
    bool prepared;
    pid_t prepared_by;  /* the process that prepared it: its worker threads */
    gp_metrics last;
    _Atomic int stop;   /* gp_run_stop's signal (-1: asked without one); 0 = go on */
    int64_t diverged;   /* the step (1-based) whose update left non-finite values
                           in the model (GP_ERR_NUMERIC), or that failed once
                           its update had begun (the model part updated);
                           0 = none */
    gp_status diverged_by; /* that step's status */
    bool inference;     /* gp_run_inference_only: no gradients, no optimizer state */
    bool restored;      /* a snapshot's weights were put back (gp_run_restore) */
    _Atomic int decoders; /* gp_decoder_open's decoders not yet freed: their caches
                             are on the model's devices */
};

/* The checks every call on a run makes first. */
/* A NULL run refused, named by the public call the caller made (__func__
 * named the static helper, or the public call twice prefixed). */
#define RUN_ARG(r, call)                                                                \
    do {                                                                                \
        if (!(r)) return gp_error_set(GP_ERR_INVALID, "%s: the run is NULL", (call));   \
    } while (0)

/* The caller's batch: inputs, targets and at least one sample. */
static gp_status batch_arg(const char *what, const float *x, const float *y, int64_t n)
{
    if (n >= 1 && x && y) return GP_OK;
    return gp_error_set(GP_ERR_INVALID, "%s needs at least one sample and both inputs and "
                        "targets (got n = %lld, x %s, y %s)", what, (long long)n,
                        x ? "given" : "NULL", y ? "given" : "NULL");
}

/* The caller's inputs, before anything is computed: a NaN or Inf among
 * them would reach the loss and, in a step, the update (a NaN model the
 * run must then refuse), so it is refused here instead, named by its
 * sample and index, and the model stays as it was.  gpipe-train's loaders
 * make finite inputs by construction; a library caller's floats are its
 * own.  Scanned in blocks with the devices' own test (gp_ew_nonfinite,
 * which vectorises), about a millisecond per 10 MiB. */
static gp_status inputs_finite(const gp_run *r, const char *what, const float *x, int64_t n)
{
    const gp_shape *in = &r->model->input;
    int64_t per = gp_shape_numel(in), total = per * n;
    for (int64_t b0 = 0; b0 < total; b0 += 4096) {
        int64_t b1 = b0 + 4096 < total ? b0 + 4096 : total;
        int bad = 0;
        for (int64_t e = b0; e < b1; e++) bad |= gp_ew_nonfinite(x[e]);
        if (!bad) continue;
        int64_t e = b0;
        while (e < b1 && isfinite(x[e])) e++;
        GP_ASSERT(e < b1);
        char where[128], idx[80];
        snprintf(where, sizeof where, "sample %lld, index %s", (long long)(e / per),
                 gp_shape_index_str(in, 1, e % per, 0, idx, sizeof idx));
        return gp_error_set(GP_ERR_DATA,
                            "%s: input x[%lld] is %s (%s of the batch): the model takes finite "
                            "inputs; nothing was computed and the model is as it was (clean or "
                            "drop that sample)",
                            what, (long long)e, isnan(x[e]) ? "NaN" : x[e] > 0 ? "Inf" : "-Inf",
                            where);
    }
    return GP_OK;
}

/* A prepared run's worker threads and devices are its process's: a child
 * of fork() has none, and a step there waited for ever. */
static bool in_own_process(const gp_run *r) { return !r->prepared || r->prepared_by == getpid(); }

static gp_status same_process(const gp_run *r, const char *what)
{
    if (in_own_process(r)) return GP_OK;
    return gp_error_set(GP_ERR_INVALID, "%s: this run was prepared by process %ld, and this is "
                        "another (a child of fork()), which has none of its worker threads; "
                        "make a new run in this process, or fork before gp_run_prepare",
                        what, (long)r->prepared_by);
}

/* A run whose model took a non-finite update refuses to go on with it. */
static gp_status usable(const gp_run *r, const char *what)
{
    GP_TRY(same_process(r, what));
    if (!r->diverged) return GP_OK;
    if (r->diverged_by != GP_ERR_NUMERIC)
        return gp_error_set(GP_ERR_INVALID, "%s: step %lld failed once its update had begun (the "
                            "step's error said why), so some stages or replicas were updated and "
                            "others not; restore a snapshot (gp_run_restore) or start a new run",
                            what, (long long)r->diverged);
    return gp_error_set(GP_ERR_NUMERIC, "%s: step %lld left NaN or Inf in the model (the step "
                        "failed with that error); restore a snapshot (gp_run_restore) or start "
                        "a new run, from weights exported before it (model.init_from) if you "
                        "have them", what, (long long)r->diverged);
}

/* gp_run_stop may be called from a signal handler: only a lock-free
 * atomic is safe there. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "gp_run_stop needs a lock-free atomic int");

/* The metrics of a run at `step` before a step of its own (new, or just
 * restored): NaN for what only a step or an evaluation gives. */
static void no_step_yet(gp_metrics *m, int64_t step)
{
    *m = (gp_metrics){.step = step, .loss = NAN, .accuracy = NAN, .lr = NAN, .seconds = NAN,
                      .test_loss = NAN, .test_accuracy = NAN, .grad_norm = NAN};
}

static gp_status run_new(gp_config *cfg, gp_run **out)
{
    gp_run *r = calloc(1, sizeof *r);
    gp_model *m = r ? calloc(1, sizeof *m) : NULL;
    if (r && !m) {
        free(r);
        r = NULL;
    }
    if (!r) {
        gp_config_free(cfg);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    r->cfg = *cfg;
    r->model = m;
    no_step_yet(&r->last, 0);
    *out = r;
    return GP_OK;
}

static gp_status check_overrides(const char *const *overrides, int n)
{
    if (n < 0 || (n > 0 && !overrides))
        return gp_error_set(GP_ERR_INVALID, "overrides: %d given in %s; give n_overrides >= 0 "
                            "strings", n, overrides ? "an array" : "a NULL array");
    for (int i = 0; i < n; i++)
        if (!overrides[i])
            return gp_error_set(GP_ERR_INVALID, "override %d of %d is NULL", i, n);
    return GP_OK;
}

gp_status gp_run_load(const char *path, const char *const *overrides, int n_overrides,
                      gp_run **out)
{
    return gp_run_load_resume(path, overrides, n_overrides, NULL, out);
}

gp_status gp_run_load_resume(const char *path, const char *const *overrides, int n_overrides,
                             const char *resume, gp_run **out)
{
    if (!out) return gp_error_set(GP_ERR_INVALID, "gp_run_load: out is NULL");
    *out = NULL;
    if (path && !path[0]) /* (as an empty output path is: not a file that is missing) */
        return gp_error_set(GP_ERR_INVALID, "gp_run_load: the path is empty; give a config file");
    GP_TRY(check_overrides(overrides, n_overrides));
    gp_config cfg;
    gp_config_sources src = {.hf_config = gp_snapshot_hf_config, .ctx = (void *)resume};
    GP_TRY(gp_config_load_with(path, overrides, n_overrides, &src, &cfg));
    return run_new(&cfg, out);
}

gp_status gp_run_parse(const char *name, const char *yaml, const char *const *overrides,
                       int n_overrides, gp_run **out)
{
    if (!out) return gp_error_set(GP_ERR_INVALID, "gp_run_parse: out is NULL");
    *out = NULL;
    if (!yaml) return gp_error_set(GP_ERR_INVALID, "gp_run_parse: the YAML text is NULL");
    GP_TRY(check_overrides(overrides, n_overrides));
    gp_config cfg;
    GP_TRY(gp_config_parse(name ? name : "<yaml>", yaml, strlen(yaml), overrides, n_overrides,
                           &cfg));
    return run_new(&cfg, out);
}

/* The run's model freed (the struct stays, zeroed) and its devices closed:
 * unprepared again. */
static void drop_model(gp_run *r)
{
    gp_model_free(r->model);
    for (int j = 0; j < r->n_dev; j++) gp_device_close(r->devs[j]);
    r->n_dev = 0;
    r->prepared = false;
}

void gp_run_free(gp_run *r)
{
    if (!r) return;
    int threads = gp_caller_threads(); /* (closing a device may run its ops here) */
    /* in a child of fork() the model's threads and devices are the
     * parent's: leave them (joining them would wait for ever) */
    if (in_own_process(r)) {
        drop_model(r);
        free(r->model);
    }
    gp_config_free(&r->cfg);
    free(r);
    gp_caller_threads_restore(threads);
}

/* A program of the library's started by mpirun or srun as several
 * processes: each trains a whole copy, which is what a sweep wants and a
 * surprise to one who meant a pipeline over the processes (whose outputs
 * then overwrite each other).  Said once a process.  (A run spans
 * processes under gpipe-train, which joins them first.) */
static void say_many_processes(void)
{
    static atomic_bool said;
    if (gp_procs_size() > 1 || !gp_procs_launched_many() || atomic_exchange(&said, true))
        return;
    GP_WARN("this program was started as one of several processes (mpirun or srun), and a "
            "gp_run does not span processes: each process trains its own copy of the model, "
            "and outputs given the same path in each overwrite each other; for stages in "
            "separate processes run gpipe-train under mpirun");
}

/* The model built on its devices, from model.init_from where given; with
 * loads (a snapshot's restore follows) its random values are not drawn. */
static gp_status prepare(gp_run *r, bool loads)
{
    if (r->prepared) return GP_OK;
    say_many_processes();
    /* loaded below or next: no draws */
    gp_model_build_loads(loads || r->cfg.model.init_from[0] != 0);
    bool was = gp_model_build_inference(r->inference);
    gp_status os = gp_train_open(&r->cfg, r->devs, r->model, true);
    gp_model_build_inference(was);
    gp_model_build_loads(false);
    GP_TRY(os);
    r->n_dev = gp_pipeline_devices_total(&r->cfg.pipeline);
    r->prepared = true;
    r->prepared_by = getpid();
    /* model.init_from, as gpipe-train starts from it; not where a snapshot
     * replaces every weight next (loads: gp_run_restore), which the folder
     * need not be there for (issue 77: gpipe-sample --resume failed once a
     * run's init_from folder was gone) */
    if (r->cfg.model.init_from[0] && !loads) {
        gp_status s = gp_snapshot_init_from(r->model, r->cfg.model.init_from);
        if (s != GP_OK) {
            drop_model(r);
            return s;
        }
    }
    return GP_OK;
}

static gp_status run_prepare(gp_run *r)
{
    RUN_ARG(r, "gp_run_prepare");
    GP_TRY(same_process(r, "gp_run_prepare"));
    return prepare(r, false);
}

static gp_status run_step(gp_run *r, const float *x, const float *y, int64_t n,
                          int64_t total_steps, gp_metrics *out)
{
    RUN_ARG(r, "gp_run_step");
    GP_TRY(batch_arg("gp_run_step", x, y, n));
    GP_TRY(usable(r, "gp_run_step"));
    if (r->inference)
        return gp_error_set(GP_ERR_INVALID, "gp_run_step: the run is for inference only "
                            "(gp_run_inference_only): its model has no gradients; load the "
                            "config again to train");
    GP_TRY(gp_run_prepare(r));
    GP_TRY(inputs_finite(r, "gp_run_step", x, n));
    /* total_steps <= 0: no schedule, the base rate (with its scaling) */
    double lr = total_steps > 0 ? gp_lr_at(&r->cfg.train, r->model->step, total_steps)
                                : gp_lr_base(&r->cfg.train);
    gp_step_stats st;
    gp_status s = gp_model_pipeline_step(r->model, &r->cfg, x, y, n, lr, &st);
    /* a step that failed before its update (out of memory, a bad label,
     * clipping found the gradients not finite) left the model as it was:
     * the run goes on; one that failed after (a non-finite update, or an
     * error while the stages or replicas were updating) did not */
    /* (a run across processes goes on only from a refusal every rank met
     * alike: after another failure the peers were not told, and a send
     * given up may still be matched by their next receive) */
    bool procs = r->model->local_device >= 0;
    if (s != GP_OK && (!r->model->refused || (procs && s != GP_ERR_NUMERIC))) {
        r->diverged = r->model->step + 1;
        r->diverged_by = s;
    }
    if (s != GP_OK) return s;
    r->last.step = r->model->step;
    r->last.loss = st.loss;
    r->last.accuracy = st.accuracy;
    r->last.lr = lr;
    r->last.seconds = st.seconds;
    r->last.grad_norm = st.grad_norm;
    if (out) *out = r->last;
    return GP_OK;
}

gp_status gp_run_train(gp_run *r, const char *metrics_path, gp_metrics *out)
{
    RUN_ARG(r, "gp_run_train"); /* (not gp_run_train_ex's name) */
    gp_train_options o = GP_TRAIN_OPTIONS_INIT;
    o.metrics_path = metrics_path;
    return gp_run_train_ex(r, &o, out);
}

/* Refused while a decoder is open: `why` ends in what the caches are to
 * the call ("... which hold" their caches). */
static gp_status no_decoders(gp_run *r, const char *fn, const char *why)
{
    int open = atomic_load(&r->decoders);
    if (open <= 0) return GP_OK;
    return gp_error_set(GP_ERR_INVALID, "%s: %d decoder%s of this run %s open; free %s first "
                        "(gp_decoder_free): %s %s caches", fn, open, open > 1 ? "s" : "",
                        open > 1 ? "are" : "is", open > 1 ? "them" : "it", why,
                        open > 1 ? "their" : "its");
}

static gp_status run_train_ex(gp_run *r, const gp_train_options *opt, gp_metrics *out)
{
    RUN_ARG(r, "gp_run_train_ex");
    if (out) no_step_yet(out, 0); /* what it says where nothing is trained */
    GP_TRY(same_process(r, "gp_run_train_ex"));
    GP_TRY(no_decoders(r, "gp_run_train_ex", "training replaces the run's model and devices, "
                       "which hold"));
    if (r->inference)
        return gp_error_set(GP_ERR_INVALID, "gp_run_train_ex: the run is for inference only "
                            "(gp_run_inference_only); load the config again to train");
    say_many_processes();
    gp_train_options none = GP_TRAIN_OPTIONS_INIT;
    if (!opt) opt = &none;
    if (opt->resume && !opt->resume[0])
        return gp_error_set(GP_ERR_INVALID, "gp_run_train_ex: resume is empty; give a "
                            "snapshot's path, \"latest\", or NULL for a fresh run");
    /* (the steps only mean something with a trace: a zeroed struct is fine) */
    if (opt->trace_path &&
        (opt->trace_first < 0 || (opt->trace_last >= 0 && opt->trace_last < opt->trace_first)))
        return gp_error_set(GP_ERR_INVALID, "trace steps %lld to %lld: give 0 <= first <= "
                            "last, or last < 0 for every step from first",
                            (long long)opt->trace_first, (long long)opt->trace_last);
    gp_train_opts o = {.metrics_path = opt->metrics_path, .trace_path = opt->trace_path,
                       .trace_first = opt->trace_path ? opt->trace_first : 0,
                       .trace_last = opt->trace_path ? opt->trace_last : -1,
                       .progress = opt->progress < 0 ? -1 : opt->progress != 0,
                       .quiet = opt->quiet != 0, .resume_path = opt->resume,
                       .export_path = opt->export_weights, .stop = &r->stop};
    gp_train_result res;
    /* built in its final place: its pipeline points into it */
    gp_model *trained = calloc(1, sizeof *trained);
    if (!trained) return gp_error_set(GP_ERR_OOM, "out of host memory");
    gp_device *tdevs[GP_MAX_DEVICES] = {0};
    o.keep_model = trained;
    o.keep_devs = tdevs;
    gp_status s = gp_train_run(&r->cfg, &o, &res);
    if (!trained->layers) {
        free(trained); /* nothing kept (gp_train_run freed what it built) */
    } else {
        /* the run goes on with what was trained: gp_run_step,
         * gp_run_evaluate and gp_run_export_weights see it */
        drop_model(r);
        free(r->model);
        r->model = trained;
        r->n_dev = gp_pipeline_devices_total(&r->cfg.pipeline);
        memcpy(r->devs, tdevs, sizeof r->devs);
        r->prepared = true;
        r->prepared_by = getpid();
        r->diverged = 0;
        /* the last step's numbers, also when a stop ended it early */
        r->last.step = res.steps;
        r->last.loss = res.final_loss;
        r->last.accuracy = res.final_accuracy;
        r->last.lr = res.final_lr;
        r->last.seconds = res.final_seconds;
        r->last.grad_norm = res.final_grad_norm;
        r->last.test_loss = res.test_loss;
        r->last.test_accuracy = res.test_accuracy;
        if (out) *out = r->last;
    }
    return s;
}

static gp_status run_evaluate(gp_run *r, const float *x, const float *y, int64_t n,
                              double *loss, double *accuracy)
{
    RUN_ARG(r, "gp_run_evaluate");
    GP_TRY(batch_arg("gp_run_evaluate", x, y, n));
    GP_TRY(usable(r, "gp_run_evaluate"));
    GP_TRY(gp_run_prepare(r));
    GP_TRY(inputs_finite(r, "gp_run_evaluate", x, n));
    double l = 0, a = 0;
    GP_TRY(gp_model_evaluate_host(r->model, &r->cfg, x, y, n, &l, &a));
    r->last.test_loss = l;
    r->last.test_accuracy = a;
    if (loss) *loss = l;
    if (accuracy) *accuracy = a;
    return GP_OK;
}

static gp_status run_predict(gp_run *r, const float *x, int64_t n, float *out)
{
    RUN_ARG(r, "gp_run_predict");
    if (n < 1 || !x || !out)
        return gp_error_set(GP_ERR_INVALID, "gp_run_predict needs at least one sample, inputs "
                            "and an output buffer (got n = %lld, x %s, out %s)", (long long)n,
                            x ? "given" : "NULL", out ? "given" : "NULL");
    GP_TRY(usable(r, "gp_run_predict"));
    GP_TRY(gp_run_prepare(r));
    GP_TRY(inputs_finite(r, "gp_run_predict", x, n));
    return gp_model_forward_host(r->model, &r->cfg, x, n, out);
}

/* An output of gp_run_save or gp_run_export_weights must not replace the
 * run's inputs (gp_run_train_ex refuses the same for its outputs): the
 * config file, model.init_from.  (A config parsed from text is named by
 * its caller: a file of that name that exists is spared too.) */
static gp_status spares_inputs(const gp_run *r, const char *path, const char *what)
{
    const struct {
        const char *what, *path;
    } ins[2] = {{"the run's config", r->cfg.path},
                {gp_opt_name(GP_OPT_INIT_FROM), r->cfg.model.init_from}};
    for (int k = 0; k < 2; k++) {
        const char *in = ins[k].path;
        if (in[0] && gp_path_overlaps(path, in) && access(in, F_OK) == 0)
            return gp_error_set(GP_ERR_INVALID, "%s: %s is %s (%s), or a file of it: writing "
                                "it would replace what the run reads; give the output another "
                                "name", what, path, ins[k].what, in);
    }
    return GP_OK;
}

static gp_status run_check_output(const gp_run *r, const char *path, const char *what)
{
    RUN_ARG(r, "gp_run_check_output");
    if (!what || !what[0]) what = "gp_run_check_output";
    GP_TRY(spares_inputs(r, path ? path : "", what));
    return gp_check_writable_file(path, what, true);
}

static gp_status run_export_weights(gp_run *r, const char *path)
{
    RUN_ARG(r, "gp_run_export_weights");
    GP_TRY(usable(r, "gp_run_export_weights"));
    if (!path || !path[0])
        return gp_error_set(GP_ERR_INVALID, "gp_run_export_weights needs a file path");
    /* (a directory, or one that cannot be written, said as such rather than
     * as the rename of a temporary file made somewhere else) */
    GP_TRY(spares_inputs(r, path, "gp_run_export_weights"));
    GP_TRY(gp_check_writable_file(path, "gp_run_export_weights", true));
    GP_TRY(gp_run_prepare(r));
    return gp_snapshot_export(r->model, &r->cfg, path);
}

static gp_status run_describe(const gp_run *r, gp_run_info *out)
{
    RUN_ARG(r, "gp_run_describe");
    if (!out) return gp_error_set(GP_ERR_INVALID, "gp_run_describe: out is NULL");
    memset(out, 0, sizeof *out);
    const gp_model_config *mc = &r->cfg.model;
    int64_t params;
    gp_shape o;
    if (r->prepared) {
        params = gp_model_param_count(r->model);
        o = r->model->output;
    } else {
        GP_TRY(gp_model_describe(&r->cfg, &params, &o));
    }
    out->input_numel = 1;
    for (int i = 0; i < 3; i++) {
        out->input[i] = mc->input[i];
        out->input_numel *= mc->input[i];
    }
    out->output_numel = gp_shape_numel(&o);
    out->target_numel = gp_loss_targets_per_sample(mc->loss, &o);
    out->batch_size = r->cfg.train.batch_size;
    out->parameters = params;
    out->step = r->prepared ? r->model->step : 0;
    out->fresh = !mc->init_from[0] && !r->restored && out->step == 0;
    out->devices = gp_pipeline_devices_total(&r->cfg.pipeline);
    int64_t cls = gp_model_config_classes(mc);
    out->classes = mc->loss != GP_LOSS_CROSS_ENTROPY ? 0 : cls > 0 ? cls : o.dims[o.ndim - 1];
    return GP_OK;
}

/* Snapshots of a run in processes are written by every rank together
 * (gp_run_train_ex's train.snapshot); gp_run_save / gp_run_restore are one
 * process's. */
static gp_status one_process(const gp_run *r, const char *what)
{
    if (r->model->local_device < 0) return GP_OK;
    return gp_error_set(GP_ERR_UNSUPPORTED, "%s: this run spans processes (mpirun); its "
                        "snapshots are written and resumed by gp_run_train_ex (train.snapshot "
                        "and gp_train_options.resume)", what);
}

static gp_status run_save(gp_run *r, const char *path)
{
    if (r && r->inference)
        return gp_error_set(GP_ERR_INVALID, "gp_run_save: the run is for inference only "
                            "(gp_run_inference_only): it holds no optimizer state to save; "
                            "gp_run_export_weights writes its weights");
    RUN_ARG(r, "gp_run_save");
    GP_TRY(usable(r, "gp_run_save"));
    if (path && path[0]) GP_TRY(spares_inputs(r, path, "gp_run_save"));
    GP_TRY(gp_check_writable_file(path, "gp_run_save", true));
    GP_TRY(gp_run_prepare(r));
    GP_TRY(one_process(r, "gp_run_save"));
    gp_status s = gp_snapshot_save_file(r->model, &r->cfg, path);
    if (s != GP_OK) return gp_error_wrap(s, "gp_run_save");
    return GP_OK;
}

static gp_status run_restore(gp_run *r, const char *path)
{
    RUN_ARG(r, "gp_run_restore");
    if (!path || !path[0])
        return gp_error_set(GP_ERR_INVALID, "gp_run_restore needs a snapshot's path");
    GP_TRY(same_process(r, "gp_run_restore"));
    /* a snapshot of the same step would pass the decoder's own check (the
     * step count) with the keys and values of other weights */
    GP_TRY(no_decoders(r, "gp_run_restore", "the snapshot's weights would not be the ones in "
                       "the keys and values of"));
    char newest[4200];
    if (!strcmp(path, "latest")) { /* the newest complete one, as gpipe-train --resume latest */
        const char *dir = r->cfg.train.snapshot.dir;
        struct stat st;
        if (stat(dir, &st) != 0)
            return gp_error_set(GP_ERR_IO, "gp_run_restore(\"latest\"): train.snapshot.dir '%s' "
                                "does not exist (%s); give the run's config the directory the "
                                "earlier run wrote its snapshots to", dir, strerror(errno));
        gp_status s = gp_snapshot_latest(dir, newest, sizeof newest);
        if (s != GP_OK) return gp_error_wrap(s, "gp_run_restore(\"latest\")");
        path = newest;
    }
    /* a run restored before it was prepared draws no random values the
     * snapshot replaces (a Llama 3.2 1B's took ~40 s); should the restore
     * fail, that model goes again, and the next prepare draws them */
    bool fresh = !r->prepared;
    GP_TRY(prepare(r, true));
    gp_status s = one_process(r, "gp_run_restore");
    if (s != GP_OK) {
        if (fresh) drop_model(r);
        return s;
    }
    gp_snapshot_pos pos;
    s = gp_snapshot_restore(r->model, &r->cfg, path, false, &pos, NULL);
    if (s != GP_OK && fresh) drop_model(r);
    if (s != GP_OK) return gp_error_wrap(s, "gp_run_restore");
    /* a model that diverged is replaced whole: the run may go on */
    r->diverged = 0;
    r->restored = true;
    no_step_yet(&r->last, pos.step);
    return GP_OK;
}

static gp_status run_summary(const gp_run *r, FILE *f)
{
    RUN_ARG(r, "gp_run_summary");
    if (!f) f = stdout;
    GP_TRY(gp_model_summary(&r->cfg, f));
    if (fflush(f) != 0 || ferror(f))
        return gp_error_set(GP_ERR_IO, "writing the summary failed: %s", strerror(errno));
    return GP_OK;
}

void gp_run_stop(gp_run *r, int signo)
{
    /* (no signal: -1, which the message calls a stop request) */
    if (r) atomic_store(&r->stop, signo > 0 ? signo : -1);
}

void gp_run_stop_clear(gp_run *r)
{
    if (r) atomic_store(&r->stop, 0);
}

int gp_run_devices(const gp_run *r) { return r && r->prepared ? r->n_dev : 0; }

gp_status gp_run_device_memory(const gp_run *r, int j, const char **name, size_t *peak,
                               size_t *current)
{
    RUN_ARG(r, "gp_run_device_memory");
    GP_TRY(same_process(r, "gp_run_device_memory")); /* (its lock may be held) */
    if (!r->prepared)
        return gp_error_set(GP_ERR_INVALID, "gp_run_device_memory: the run has no devices "
                            "yet; call gp_run_prepare first");
    if (j < 0 || j >= r->n_dev)
        return gp_error_set(GP_ERR_INVALID, "gp_run_device_memory: device %d does not exist "
                            "(the run has %d: 0 to %d)", j, r->n_dev, r->n_dev - 1);
    gp_allocator a;
    gp_allocator_snapshot(&r->devs[j]->alloc, &a);
    if (name) *name = r->devs[j]->name;
    if (peak) *peak = a.peak;
    if (current) *current = a.current;
    return GP_OK;
}

/* ---- the public entry points ----------------------------------------------
 * A CPU device sets the OpenMP thread count of whichever thread runs its
 * ops, the caller's too (opening devices, profiling, a step's first stage):
 * each entry point that may run one puts the caller's count back, so the
 * program's own parallel loops keep the threads they had. */
#define CALLER_THREADS(call)                                                  \
    do {                                                                      \
        int threads_ = gp_caller_threads();                                   \
        gp_status s_ = (call);                                                \
        gp_caller_threads_restore(threads_);                                  \
        return s_;                                                            \
    } while (0)

gp_status gp_run_inference_only(gp_run *r)
{
    RUN_ARG(r, "gp_run_inference_only");
    if (r->prepared)
        return gp_error_set(GP_ERR_INVALID, "gp_run_inference_only: the run is prepared "
                            "already (its model has its gradients); call it before "
                            "gp_run_prepare, gp_run_restore or any step");
    r->inference = true;
    return GP_OK;
}

gp_status gp_run_prepare(gp_run *r)
{
    CALLER_THREADS(run_prepare(r));
}

gp_status gp_run_step(gp_run *r, const float *x, const float *y, int64_t n,
                      int64_t total_steps, gp_metrics *out)
{
    CALLER_THREADS(run_step(r, x, y, n, total_steps, out));
}

gp_status gp_run_train_ex(gp_run *r, const gp_train_options *opt, gp_metrics *out)
{
    CALLER_THREADS(run_train_ex(r, opt, out));
}

gp_status gp_run_evaluate(gp_run *r, const float *x, const float *y, int64_t n, double *loss,
                          double *accuracy)
{
    CALLER_THREADS(run_evaluate(r, x, y, n, loss, accuracy));
}

gp_status gp_run_predict(gp_run *r, const float *x, int64_t n, float *out)
{
    CALLER_THREADS(run_predict(r, x, n, out));
}

static gp_status decoder_open(gp_run *r, int64_t samples, gp_decoder **out)
{
    RUN_ARG(r, "gp_decoder_open");
    if (!out) return gp_error_set(GP_ERR_INVALID, "gp_decoder_open: out is NULL");
    *out = NULL;
    GP_TRY(usable(r, "gp_decoder_open"));
    GP_TRY(gp_run_prepare(r));
    return gp_model_decoder_open(r->model, &r->cfg, samples, &r->decoders, out);
}

gp_status gp_decoder_open(gp_run *r, int64_t samples, gp_decoder **out)
{
    CALLER_THREADS(decoder_open(r, samples, out));
}

gp_status gp_run_export_weights(gp_run *r, const char *path)
{
    CALLER_THREADS(run_export_weights(r, path));
}

gp_status gp_run_describe(const gp_run *r, gp_run_info *out)
{
    CALLER_THREADS(run_describe(r, out));
}

gp_status gp_run_save(gp_run *r, const char *path)
{
    CALLER_THREADS(run_save(r, path));
}

gp_status gp_run_check_output(const gp_run *r, const char *path, const char *what)
{
    CALLER_THREADS(run_check_output(r, path, what));
}

gp_status gp_run_restore(gp_run *r, const char *path)
{
    CALLER_THREADS(run_restore(r, path));
}

gp_status gp_run_summary(const gp_run *r, FILE *f)
{
    CALLER_THREADS(run_summary(r, f));
}
