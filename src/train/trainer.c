/*
 * trainer.c — the training loop: data, model, steps, evaluation, progress
 * on a terminal or log lines otherwise, JSON Lines metrics (core/json.h's
 * writer: escaped strings, NaN as null), stopping cleanly between steps on
 * request (a signal), and the model summary printed by --dry-run.
 * "the training loop" below maps gp_train_run, step by step.
 */
#include "train/train.h"
#include "balance/balance.h" /* the simulator, beside the measured bubble */
#include "train/snapshot.h"
#include "train/tensorboard.h"
#include "trace/trace.h"
#include "core/json.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

void gp_train_metrics_step(struct gp_json_writer *w, int64_t step, int64_t epoch, double lr,
                           double samples_per_s, const gp_step_stats *st, bool data_parallel,
                           gp_device *const *devs, int n_dev, const gp_step_counts *counts)
{
    gp_json_open_object(w, NULL);
    gp_json_put_int(w, "step", step);
    gp_json_put_int(w, "epoch", epoch);
    gp_json_put_num(w, "loss", st->loss);
    gp_json_put_num(w, "accuracy", st->accuracy);
    gp_json_put_num(w, "lr", lr);
    gp_json_put_fixed(w, "samples_per_s", samples_per_s, 1);
    gp_json_put_fixed(w, "step_seconds", st->seconds, 6);
    gp_json_put_fixed(w, "data_wait_seconds", st->data_wait_seconds, 6);
    if (st->bad_files >= 0) gp_json_put_int(w, "bad_files", st->bad_files);
    if (isfinite(st->grad_norm)) gp_json_put_num(w, "grad_norm", st->grad_norm); /* clipping */
    if (data_parallel) gp_json_put_fixed(w, "allreduce_seconds", st->allreduce_seconds, 6);
    if (st->n_devices > 1) { /* a pipeline's step: its bubble (gp_pipeline_out) */
        gp_json_put_fixed(w, "bubble", st->bubble, 4);
        gp_json_put_fixed(w, "pipeline_seconds", st->window, 6);
    }
    gp_json_open_array(w, "devices");
    for (int j = 0; j < n_dev; j++) {
        gp_allocator a;
        gp_allocator_snapshot(&devs[j]->alloc, &a);
        gp_json_open_object(w, NULL);
        gp_json_put_str(w, "name", devs[j]->name);
        gp_json_put_uint(w, "peak_bytes", a.peak);
        gp_json_put_uint(w, "current_bytes", a.current);
        if (st->n_devices > 1 && j < st->n_devices) { /* (the first replica's pipeline) */
            gp_json_put_fixed(w, "busy_seconds", st->busy[j], 6);
            gp_json_put_fixed(w, "idle_seconds", st->window - st->busy[j], 6);
        }
        if (counts && counts[j].host_waits >= 0) {
            gp_json_put_int(w, "host_waits", counts[j].host_waits);
            gp_json_put_int(w, "launches", counts[j].launches);
            gp_json_put_int(w, "adapter_bytes", counts[j].adapter_bytes);
        }
        for (int c = 0; c < GP_MEM_COUNT; c++) {
            char key[48];
            snprintf(key, sizeof key, "peak_%s", gp_mem_category_name((gp_mem_category)c));
            gp_json_put_uint(w, key, a.peak_by[c]);
        }
        gp_json_close(w);
    }
    gp_json_close(w);
    gp_json_close(w);
}

/* An evaluation's --metrics record. */
static void metrics_eval(gp_json_writer *w, int64_t step, int64_t epoch, double loss,
                         double accuracy, bool final)
{
    gp_json_open_object(w, NULL);
    gp_json_put_bool(w, "eval", true);
    gp_json_put_int(w, "step", step);
    gp_json_put_int(w, "epoch", epoch);
    gp_json_put_num(w, "test_loss", loss);
    gp_json_put_num(w, "test_accuracy", accuracy);
    if (final) gp_json_put_bool(w, "final", true);
    gp_json_close(w);
}

/* The record in w as one line of the metrics file, whole or not at all: a
 * write that fails part way (a full disk, ulimit -f) is cut back to the
 * last whole record, where it had left a torn line that a resumed run
 * drops, and the record's text stays in w (w->text, without its newline)
 * for the final snapshot to keep (gp_snapshot_pos.metrics); the caller
 * empties w.  Written with write(2), past stdio, so no buffered rest of
 * it is written by the fclose at the end; the text and its newline in one
 * call (the newline in the place of the text's '\0' meanwhile), so that a
 * record that fills the file to its limit exactly is one short write, not
 * a whole text and a refused newline; and the cut is checked (fstat), not
 * taken on ftruncate's word. */
static gp_status metrics_line(gp_json_writer *w, FILE *f, const char *path)
{
    if (w->oom)
        return gp_error_set(GP_ERR_OOM, "writing metrics file '%s' failed: out of host memory",
                            path);
    struct stat sb, after;
    int fd = fileno(f);
    bool regular = fflush(f) == 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    errno = 0;
    size_t done = 0, n = w->len + 1;
    char empty[1] = "";
    char *text = w->text ? w->text : empty; /* (NUL-terminated: text[len] is there) */
    text[w->len] = '\n';
    while (done < n) {
        ssize_t k = write(fd, text + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        done += (size_t)k;
    }
    text[w->len] = '\0';
    if (done == n) {
        w->len = 0; /* (emptied, as gp_json_flush leaves it) */
        text[0] = '\0';
        return GP_OK;
    }
    int err = errno ? errno : EIO;
    /* (the file is this run's alone; a pipe or a device is left as it is) */
    bool cut = regular && ftruncate(fd, sb.st_size) == 0 &&
               lseek(fd, sb.st_size, SEEK_SET) == sb.st_size && fstat(fd, &after) == 0 &&
               after.st_size == sb.st_size;
    return gp_error_set(GP_ERR_IO, "writing metrics file '%s' failed: %s%s", path,
                        strerror(err), !regular ? ""
                        : cut ? " (cut back to its last whole record)"
                              : "; its last line is torn (a resumed run drops it)");
}

/* The record in w to the TensorBoard events (tb, first) and the metrics
 * file (f), either of them NULL when not wanted; as metrics_line, the
 * record's text stays in w when either fails (*tb_failed says which). */
static gp_status record_line(gp_json_writer *w, FILE *f, const char *path, gp_tboard *tb,
                             bool *tb_failed)
{
    gp_status s = tb ? gp_tboard_record(tb, w->text, w->len) : GP_OK;
    if (tb_failed) *tb_failed = s != GP_OK;
    if (s == GP_OK && f) return metrics_line(w, f, path);
    if (s == GP_OK) w->len = 0; /* (emptied, as metrics_line leaves it) */
    return s;
}

/* A resumed run's metrics go on in the file it is given, as the run it
 * resumes left it: the records of steps after `step` (this run takes them
 * again) are dropped, and so are the evaluations at `step` that this run
 * writes again (drop_final: the final one; drop_epoch: the epoch's, when
 * it resumes at an epoch's start), and a last line cut short by a kill;
 * the rest is kept, then `lost` (the snapshot's kept record of step
 * `step`, or NULL) where the file lacks it, and the new records follow
 * (the file is open for appending).  A regular file only: a pipe or a terminal is not read.
 * Before, the file was emptied and a resumed run's metrics began at the
 * step it resumed from. */
static gp_status metrics_resume(FILE *f, const char *path, int64_t step, bool drop_final,
                                bool drop_epoch, const char *lost)
{
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) return GP_OK;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    off_t at = 0, keep = 0;
    bool has_step = false; /* the record of step `step` is there */
    rewind(f);
    while ((n = getline(&line, &cap, f)) > 0) {
        const char *p = strstr(line, "\"step\":");
        long long v = p ? strtoll(p + 7, NULL, 10) : -1;
        bool eval = !strncmp(line, "{\"eval\":true", 12),
             final = eval && strstr(line, "\"final\":true");
        if (line[n - 1] != '\n' || v > step ||
            (eval && v == step && (final ? drop_final : drop_epoch)))
            break;
        has_step |= !eval && v == step;
        at += n;
        keep = at;
    }
    free(line);
    bool ok = !ferror(f) && fflush(f) == 0 && ftruncate(fileno(f), keep) == 0 &&
              fseeko(f, 0, SEEK_END) == 0;
    /* The snapshot kept the record of its step that the file could not
     * take (it stopped the run): written now, in its place after the
     * records before it.  (Its own step, checked: a record of another
     * step has no place here.) */
    const char *ls = lost ? strstr(lost, "\"step\":") : NULL;
    if (ok && ls && !has_step && strtoll(ls + 7, NULL, 10) == step)
        ok = fprintf(f, "%s\n", lost) > 0 && fflush(f) == 0;
    if (!ok)
        return gp_error_set(GP_ERR_IO, "%s '%s': cannot go on with it after the steps the "
                            "resumed snapshot holds: %s", gp_opt_name(GP_OPT_METRICS), path,
                            strerror(errno));
    return GP_OK;
}

/* ---- stopping on request (gp_train_opts.stop) ----------------------------- */

/* 0, or the signal that asked the run to stop. */
static int stop_asked(const gp_train_opts *o) { return o->stop ? atomic_load(o->stop) : 0; }

static const char *signal_name(int sig, char *buf, size_t len)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGUSR1: return "SIGUSR1";
    case -1: return "a stop request (gp_run_stop)";
    default: snprintf(buf, len, "signal %d", sig); return buf;
    }
}

/* The data gives what the model's loss takes: for cross-entropy a class id
 * below the model's outputs; for binary cross-entropy one target per output
 * element, the masks (one per pixel of an output of the input's size) or,
 * for a one-element output, the class id (0 or 1: the loss names any
 * other). */
/* From the config's shapes alone, before the model is placed: a mismatch
 * is said before `balance: auto` spends its profile (minutes on a large
 * model) or any device memory.  A cross-entropy model whose output is not
 * (batch, classes) is gp_model_describe's to say (gp_train_open asks it
 * too, for the library's callers). */
/* Every token id of a split below the model's vocabulary, checked when the
 * files are read (a pass over the ids): an id past it only in the
 * validation split failed the run at its end, and one in the training
 * split only at the step that read its window. */
static gp_status tokens_fit(const gp_config *cfg, const gp_dataset *ds, int64_t vocab)
{
    if (!ds || !ds->tokens || ds->classes <= vocab) return GP_OK;
    int64_t i = 0;
    while (i < ds->n_tokens && ds->tokens[i] < vocab) i++;
    const gp_model_config *mc = &cfg->model;
    char key[96];
    if (!strcmp(mc->family, "gpt")) snprintf(key, sizeof key, "model.gpt.vocab");
    else if (!strcmp(mc->family, "llama")) snprintf(key, sizeof key, "model.llama.vocab");
    else snprintf(key, sizeof key, "the last linear layer's out");
    return gp_error_set(GP_ERR_DATA, "%s: token %lld (byte offset %lld) is id %d, but the "
                        "model's vocabulary is %lld (%s): ids must be below it; encode the text "
                        "with the model's tokenizer, or give %s of at least %d",
                        ds->source, (long long)i,
                        (long long)(4 * GP_TOKENS_HEADER + (ds->token_bytes ? ds->token_bytes : 2) * i),
                        (int)ds->tokens[i], (long long)vocab, key, key, ds->classes);
}

static gp_status check_targets(const gp_config *cfg, const gp_dataset *ds,
                               const gp_dataset *test)
{
    int64_t params;
    gp_shape out;
    GP_TRY(gp_model_describe(cfg, &params, &out));
    gp_loss_kind loss = cfg->model.loss;
    int64_t targets = gp_loss_targets_per_sample(loss, &out);
    char b[64];
    gp_shape_str(&out, b, sizeof b);
    if (ds->tokens) { /* (n, T) next tokens: one target per position */
        int64_t vocab = gp_model_config_classes(&cfg->model);
        if (vocab <= 0 && out.ndim >= 1) vocab = out.dims[out.ndim - 1];
        if (targets == ds->c && loss == GP_LOSS_CROSS_ENTROPY) {
            GP_TRY(tokens_fit(cfg, ds, vocab));
            return tokens_fit(cfg, test, vocab);
        }
        if (targets == ds->c) return GP_OK;
        return gp_error_set(GP_ERR_INVALID, "%s: data.dataset tokens gives %lld next-token "
                            "targets per sample (one per position of model.input [%lld]), but "
                            "model.loss %s on the model's output %s takes %lld; end the model "
                            "with logits for every position, (T, vocabulary) per sample",
                            cfg->path, (long long)ds->c, (long long)ds->c, gp_loss_name(loss),
                            b, (long long)targets);
    }
    if (loss == GP_LOSS_CROSS_ENTROPY && out.ndim == 3) /* (read past the labels otherwise) */
        return gp_error_set(GP_ERR_INVALID, "%s: the model's output %s is a class per position "
                            "(a language model's next tokens), but %s has one class id per "
                            "sample; give it token data: data.dataset: tokens, or synthetic, "
                            "which makes token windows for a model whose first layer is an "
                            "embedding", cfg->path, b, ds->source);
    if (loss == GP_LOSS_CROSS_ENTROPY) {
        if (out.ndim != 2 || out.dims[1] >= ds->classes) return GP_OK;
        const gp_model_config *mc = &cfg->model;
        if (mc->family[0] && strcmp(mc->family, "unet"))
            return gp_error_set(GP_ERR_INVALID, "%s: model.%s has %lld classes but the data has "
                                "%d; set model.%s.classes: %d", mc->family_at, mc->family,
                                (long long)out.dims[1], ds->classes, mc->family, ds->classes);
        /* the last layer that sets its outputs: a linear one */
        int k = mc->n_layers - 1;
        while (k > 0 && mc->layers[k].type != GP_LAYER_LINEAR) k--;
        char d[400];
        if (mc->layers[k].type == GP_LAYER_LINEAR)
            return gp_error_set(GP_ERR_INVALID, "%s: the model has %lld outputs but the data has "
                                "%d classes; make this layer's out %d",
                                gp_layer_spec_describe(&mc->layers[k], k, d, sizeof d),
                                (long long)out.dims[1], ds->classes, ds->classes);
        return gp_error_set(GP_ERR_INVALID, "%s: the model has %lld outputs but the data has %d "
                            "classes; end it with a linear layer of out %d", cfg->path,
                            (long long)out.dims[1], ds->classes, ds->classes);
    }
    if (gp_dataset_has_masks(ds)) {
        const gp_shape *o = &out;
        if (o->ndim == 4 && o->dims[1] == 1 && o->dims[2] == ds->h && o->dims[3] == ds->w)
            return GP_OK;
        return gp_error_set(GP_ERR_INVALID, "%s: model.loss bce_with_logits compares the "
                            "output with the masks of %s, one target per pixel, but the model's "
                            "output is %s per sample and a mask (1, 1, %lld, %lld); end the "
                            "model with one channel at the input's height and width (a 1x1 "
                            "conv2d {out: 1})", cfg->path, ds->source, b, (long long)ds->h,
                            (long long)ds->w);
    }
    if (targets == 1 && ds->classes <= 2) return GP_OK;
    if (targets == 1) /* one logit is a yes / no: ids past 1 fail at the first batch */
        return gp_error_set(GP_ERR_INVALID, "%s: model.loss bce_with_logits with one output "
                            "takes class ids 0 and 1, but %s has %d classes; for %d classes use "
                            "model.loss: cross_entropy with a last linear layer of out %d",
                            cfg->path, ds->source, ds->classes, ds->classes, ds->classes);
    return gp_error_set(GP_ERR_INVALID, "%s: model.loss bce_with_logits takes one target per "
                        "output element, but the model's output is %s per sample (%lld "
                        "elements) and %s has one class id per sample; end the model with "
                        "linear {out: 1} for labels 0 and 1, or give the data masks "
                        "(an image folder: data.layout: segmentation; synthetic data: "
                        "data.synthetic.masks: true)", cfg->path, b, (long long)targets,
                        ds->source);
}

/* train.snapshot.dir can be written (it is made if missing, and removed
 * again: the check leaves nothing behind). */
static gp_status check_snapshot_dir(const gp_config *cfg)
{
    gp_status s = gp_check_writable_dir(cfg->train.snapshot.dir, "train.snapshot.dir");
    return s == GP_OK ? GP_OK : gp_error_wrap(s, "%s", cfg->path);
}

/* Processes (mpirun): a decision every rank takes together (stop now, a
 * snapshot now), taken where any rank takes it: a rank that stopped alone
 * would leave the others waiting for its messages. */
static int agreed(int x)
{
    if (gp_procs_size() > 1 && gp_procs_max_int(&x) != GP_OK) gp_procs_abort(1);
    return x;
}

/* Processes: train.snapshot.dir must be one directory every rank sees (a
 * shared file system at the same path): ranks r > 0 write their snapshot
 * parts there and rank 0's file names them.  A node-local directory would
 * make every snapshot unusable, found only when a resume fails.  Each rank
 * r > 0 writes "<dir>/.gpipe-probe-rank<r>-<pid>"; rank 0 looks for every
 * one; then each removes its own.  A probe rank 0 cannot see is every
 * rank's error alike, before any step. */
static gp_status check_dir_shared(const gp_config *cfg, gp_train_result *res)
{
    int me = gp_procs_rank(), N = gp_procs_size();
    const char *dir = cfg->train.snapshot.dir;
    /* per rank: its pid (the probe's name), then the errno of its write
     * (0: written) */
    int mine[2] = {(int)getpid(), 0}, *all = calloc((size_t)N * 2, sizeof *all);
    if (!all) return gp_error_set(GP_ERR_OOM, "out of host memory");
    char path[1200];
    if (me > 0) {
        snprintf(path, sizeof path, "%s/.gpipe-probe-rank%d-%d", dir, me, mine[0]);
        FILE *f = fopen(path, "w");
        if (!f || fclose(f) != 0) mine[1] = errno ? errno : EIO;
    }
    /* (also the barrier: every probe written before rank 0 looks) */
    gp_status s = gp_procs_allgather_bytes(mine, all, sizeof mine);
    int unwritten = 0, missing = 0;
    for (int r = 1; r < N && s == GP_OK && !unwritten; r++)
        if (all[2 * r + 1]) unwritten = r;
    for (int r = 1; r < N && s == GP_OK && me == 0 && !unwritten && !missing; r++) {
        snprintf(path, sizeof path, "%s/.gpipe-probe-rank%d-%d", dir, r, all[2 * r]);
        if (access(path, F_OK) != 0) missing = r;
    }
    if (s == GP_OK) missing = agreed(missing);
    if (me > 0 && !mine[1]) {
        snprintf(path, sizeof path, "%s/.gpipe-probe-rank%d-%d", dir, me, mine[0]);
        (void)unlink(path);
    }
    int err = unwritten ? all[2 * unwritten + 1] : 0;
    free(all);
    if (s != GP_OK || (!unwritten && !missing)) return s;
    res->failed_alike = true;
    if (unwritten)
        return gp_error_set(GP_ERR_IO, "%s: rank %d cannot write into train.snapshot.dir '%s' "
                            "(%s), which rank 0 made and writes: snapshots of a run in "
                            "processes need one directory that every machine mounts at the "
                            "same path (a shared file system), writable by every rank",
                            cfg->path, unwritten, dir, strerror(err));
    return gp_error_set(GP_ERR_IO, "%s: train.snapshot.dir '%s' is not one directory for every "
                        "rank: rank 0 does not see the file rank %d wrote there, so its parts "
                        "of every snapshot would be missing; give a directory that every "
                        "machine mounts at the same path (a shared file system)",
                        cfg->path, dir, missing);
}

/* 64-bit FNV-1a of n bytes, on from h. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * 0x100000001b3ull;
    return h;
}

/* Sample i of ds as the ranks compare it: an image folder's file (its
 * path under the split's folder) and label; an array's pixels, label and
 * mask. */
static uint64_t sample_hash(const gp_dataset *ds, int64_t i)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int32_t label = ds->folder ? gp_image_folder_label(ds->folder, i)
                               : ds->labels ? ds->labels[i] : -1;
    h = fnv1a(h, &label, sizeof label);
    if (ds->folder) {
        const char *f = gp_image_folder_file(ds->folder, i);
        return fnv1a(h, f, strlen(f));
    }
    size_t px = (size_t)(ds->c * ds->h * ds->w), hw = (size_t)(ds->h * ds->w);
    if (ds->images) h = fnv1a(h, ds->images + (size_t)i * px, px);
    if (ds->tokens) /* its window: ids below 65,536 as the uint16 they were read as
                     * before uint32 files (the same hashes as then) */
        for (size_t q = 0; q <= px; q++) {
            uint32_t v = ds->tokens[(size_t)i * (px + 1) + q];
            uint16_t v16 = (uint16_t)v;
            h = v < 65536u ? fnv1a(h, &v16, 2) : fnv1a(h, &v, 4);
        }
    if (ds->masks) h = fnv1a(h, ds->masks + (size_t)i * hw, hw);
    return h;
}

static uint64_t split_hash(const gp_dataset *ds)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < ds->n; i++) {
        uint64_t x = sample_hash(ds, i);
        h = fnv1a(h, &x, sizeof x);
    }
    return h;
}

/* "'cat/3.jpg' in class 1", "sample 7 in class 2" */
static void describe_sample(const gp_dataset *ds, int64_t i, char *buf, size_t len)
{
    int label = ds->folder ? gp_image_folder_label(ds->folder, i)
                           : ds->labels ? ds->labels[i] : -1;
    if (ds->folder)
        snprintf(buf, len, "'%s' in class %d", gp_image_folder_file(ds->folder, i), label);
    else
        snprintf(buf, len, "sample %lld (class %d)", (long long)i, label);
}

/* The counts agree but split q's hashes do not (rank `r` the first that
 * differs): where.  Rank 0's per-sample hashes go to every rank, each
 * finds its first sample that differs and says what it has there; every
 * rank calls this (a collective).  The message is every rank's. */
static gp_status split_differs(const gp_dataset *ds, int q, int r, int64_t n)
{
    int me = gp_procs_rank(), N = gp_procs_size();
    uint64_t *ref = malloc((size_t)(n > 0 ? n : 1) * sizeof *ref);
    enum { DESC = 400 };
    struct { int64_t at; char desc[DESC]; } mine = {-1, ""}, *all = calloc((size_t)N, sizeof *all);
    if (!ref || !all) {
        free(ref);
        free(all);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    for (int64_t i = 0; i < n && me == 0; i++) ref[i] = sample_hash(ds, i);
    gp_status s = gp_procs_bcast(ref, (size_t)n * sizeof *ref, 0);
    for (int64_t i = 0; i < n && s == GP_OK && mine.at < 0; i++)
        if (sample_hash(ds, i) != ref[i]) mine.at = i;
    if (mine.at >= 0) describe_sample(ds, mine.at, mine.desc, sizeof mine.desc);
    if (s == GP_OK) s = gp_procs_allgather_bytes(&mine, all, sizeof mine);
    free(ref);
    if (s == GP_OK) {
        int64_t at = all[r].at;
        char zero[DESC] = "";
        if (me == 0 && at >= 0) describe_sample(ds, at, zero, sizeof zero);
        /* (rank 0 says it: every rank's error alike) */
        s = gp_error_set(GP_ERR_DATA, "the ranks read different data: rank %d's %s split has "
                         "the same %lld samples and classes as rank 0's but differs at sample "
                         "%lld of the index: rank %d has %s, rank 0 has %s (data.path %s); give "
                         "every machine the same files", r, q ? "test" : "training",
                         (long long)n, (long long)at, r, all[r].desc,
                         me == 0 ? zero : "another", ds->source);
    }
    free(all);
    return s;
}

/* Processes: every rank must read the same data (an image folder with
 * more files on one machine than on another gives that rank more steps
 * per epoch, and the ranks then wait on each other forever; one with an
 * image in another class, or another image, trains silently wrong).
 * Compared once loaded: the samples of each split, the classes, and a
 * hash of each split's index (an image folder's files and labels; an
 * array's pixels, labels and masks), naming the first rank and sample
 * that differ.  A difference is every rank's error alike.  Every rank
 * comes here, whether its own load succeeded (`loaded`) or not: one that
 * failed keeps its error (it says it and ends the run), the others learn
 * that another rank failed. */
static gp_status agree_on_data(gp_status loaded, const gp_dataset *train,
                               const gp_dataset *test, gp_train_result *res)
{
    int N = gp_procs_size();
    bool ok = loaded == GP_OK;
    enum { K = 6 };
    int64_t mine[K] = {ok ? train->n : -1, ok ? test->n : -1, ok ? train->classes : -1, !ok,
                       ok ? (int64_t)split_hash(train) : 0, ok ? (int64_t)split_hash(test) : 0},
            *all = calloc((size_t)N * K, sizeof *all);
    if (!all) return ok ? gp_error_set(GP_ERR_OOM, "out of host memory") : loaded;
    gp_status s = gp_procs_allgather_bytes(mine, all, sizeof mine);
    if (!ok) { /* (its own message stands, whatever the exchange did) */
        free(all);
        return loaded;
    }
    for (int r = 0; r < N && s == GP_OK; r++)
        if (all[K * r + 3]) {
            res->other_failed = true;
            s = gp_error_set(GP_ERR_DATA, "rank %d could not load its data (its message says "
                             "why)", r);
        }
    for (int r = 1; r < N && s == GP_OK; r++)
        if (memcmp(all + K * r, all, 3 * sizeof *all)) {
            res->failed_alike = true;
            s = gp_error_set(GP_ERR_DATA, "the ranks read different data: rank %d has %lld "
                             "training samples, %lld test samples and %lld classes, rank 0 has "
                             "%lld, %lld and %lld (data.path %s); give every machine the same "
                             "files", r, (long long)all[K * r], (long long)all[K * r + 1],
                             (long long)all[K * r + 2], (long long)all[0], (long long)all[1],
                             (long long)all[2], train->source);
        }
    /* the counts agree on every rank (or every rank has said otherwise) */
    for (int q = 0; q < 2 && s == GP_OK; q++)
        for (int r = 1; r < N; r++)
            if (all[K * r + 4 + q] != all[4 + q]) {
                res->failed_alike = true;
                s = split_differs(q ? test : train, q, r, all[q]);
                break;
            }
    free(all);
    return s;
}

/* Processes (every rank passes here, whatever s): one rank's failure in a
 * phase before the first step is every rank's, so the collectives after it
 * are reached by all or by none (gp_procs_agree; a failing rank used to go
 * on into the next collective while the others waited in another).  The
 * others stop with GP_ERR_CANCELLED and res->other_failed, so gpipe-train
 * lets the failed rank say why; every rank failing is res->failed_alike,
 * said once by rank 0.  One process: s. */
static gp_status agree_phase(gp_status s, const char *during, gp_train_result *res)
{
    return gp_procs_agree(s, during, &res->other_failed, &res->failed_alike);
}

/* Checked between the phases before the first step: nothing trained yet,
 * so nothing to save. */
static gp_status stop_early(const gp_train_opts *o, const char *during, gp_train_result *res)
{
    int sig = agreed(stop_asked(o)); /* (processes: every rank passes here) */
    if (!sig) return GP_OK;
    char b[32];
    res->stop_signal = sig;
    return gp_error_set(GP_ERR_STOPPED, "stopped by %s %s, before the first step; nothing was "
                        "trained", signal_name(sig, b, sizeof b), during);
}

/* A snapshot that failed (err, its message set): where the message does
 * not name one already, the newest this run saved or resumed from (step
 * `saved`), if it is still there.  The snapshot's own message names the
 * newest it finds in the directory, but a directory that cannot be listed
 * (too many open files, which failed the snapshot too) says nothing of
 * them; stat(2) needs no file descriptor. */
static gp_status name_saved(const gp_config *cfg, gp_status err, int64_t saved)
{
    char path[1100], msg[2048];
    struct stat sb;
    if (saved <= 0) return err;
    gp_snapshot_path(cfg->train.snapshot.dir, saved, path, sizeof path);
    snprintf(msg, sizeof msg, "%s", gp_error_message());
    if (strstr(msg, path) || stat(path, &sb) != 0) return err;
    return gp_error_set(err, "%s; snapshot %s, of step %lld, is as it was: go on from it with %s",
                        msg, path, (long long)saved, gp_opt_name(GP_OPT_RESUME_LATEST));
}

/* What a run that stops between steps saves: nothing when snapshots are
 * off (*on false), else a snapshot of `step` unless the newest already is
 * that step (saved == step); path names it.  A failed save is its
 * status. */
static gp_status final_snapshot(gp_model *m, const gp_config *cfg, int64_t step, int64_t saved,
                                const gp_snapshot_pos *pos, gp_snapshot_lock *lock, bool *on,
                                char *path, size_t len)
{
    const gp_snapshot_config *snc = &cfg->train.snapshot;
    *on = snc->every_steps > 0 || snc->every_minutes > 0;
    if (!*on) return GP_OK;
    if (gp_snapshot_wait(lock, true) != GP_OK) { /* said, and written again below */
        GP_WARN("%s; writing a snapshot of step %lld now", gp_error_message(), (long long)step);
        saved = -1;
    }
    if (saved < step) {
        gp_status s = gp_snapshot_save(m, cfg, pos, lock);
        if (s != GP_OK) return name_saved(cfg, s, saved);
    }
    gp_snapshot_path(snc->dir, step, path, len);
    /* stopped before this run trained a step, and no snapshot of its first
     * step here (a fresh run's step 0, or one resumed from elsewhere):
     * nothing holds it, and nothing needs to (path "") */
    if (saved == step && access(path, F_OK) != 0) path[0] = '\0';
    return GP_OK;
}

/* Stopped before this run trained a step, with no snapshot of its first
 * step: a message naming a snapshot, or "nothing saved since step 0",
 * would point at a file that is not there. */
static bool stopped_untrained(bool on, const char *path, int64_t step, int64_t saved)
{
    return step == saved && !(on && path[0]);
}

/* Stopped between steps after `step` steps, `pos` being the loader's place
 * then: a final snapshot unless the newest one (step `saved`) is of this
 * step already, or say what is lost when snapshots are off. */
static gp_status stop_between_steps(gp_model *m, const gp_config *cfg, const gp_train_opts *o,
                                    int sig, int64_t step, int64_t total, int64_t saved,
                                    const gp_snapshot_pos *pos, gp_snapshot_lock *lock,
                                    gp_train_result *res)
{
    char b[32], path[1100], unwritten[1200] = "";
    const char *by = signal_name(sig, b, sizeof b);
    res->stop_signal = sig;
    if (o->export_path)
        snprintf(unwritten, sizeof unwritten, "; %s '%s' not written (the run did not finish)",
                 gp_opt_name(GP_OPT_EXPORT), o->export_path);
    bool on;
    gp_status s = final_snapshot(m, cfg, step, saved, pos, lock, &on, path, sizeof path);
    if (s != GP_OK)
        return gp_error_wrap(s, "stopped at step %lld by %s, but the final snapshot failed",
                             (long long)step, by);
    if (stopped_untrained(on, path, step, saved))
        return gp_error_set(GP_ERR_STOPPED, "stopped at step %lld of %lld by %s, before this run "
                            "trained a step: nothing to save; run the same command again%s",
                            (long long)step, (long long)total, by, unwritten);
    /* snapshots off, and the run was to export its weights: the weights
     * it has are written there rather than lost (nothing else holds them;
     * a run that trained none returned above) */
    if (!on && o->export_path) {
        s = gp_gpt_export(m, cfg, o->export_path, (gp_weights_format)o->export_format);
        if (s == GP_OK)
            return gp_error_set(GP_ERR_STOPPED, "stopped at step %lld of %lld by %s; snapshots "
                                "are off, so the weights of step %lld (not the %lld the run was "
                                "to train) are written to %s '%s' rather than lost (set "
                                "train.snapshot.every_steps for a run that can go on)",
                                (long long)step, (long long)total, by, (long long)step,
                                (long long)total, gp_opt_name(GP_OPT_EXPORT), o->export_path);
        snprintf(unwritten, sizeof unwritten, "; %s '%s' failed too: %s",
                 gp_opt_name(GP_OPT_EXPORT), o->export_path, gp_error_message());
    }
    if (!on)
        return gp_error_set(GP_ERR_STOPPED, "stopped at step %lld of %lld by %s; nothing saved "
                            "since step %lld (snapshots are off: set train.snapshot.every_steps "
                            "to keep a run's progress)%s", (long long)step, (long long)total, by,
                            (long long)saved, unwritten);
    return gp_error_set(GP_ERR_STOPPED, "stopped at step %lld of %lld by %s; snapshot %s holds "
                        "it: go on with %s%s", (long long)step, (long long)total, by, path,
                        gp_opt_name(GP_OPT_RESUME_LATEST), unwritten);
}

/* The run stopped on an error that left the model as it was at step
 * `step` (the data failed between steps, a file that cannot be decoded, in
 * training or in an evaluation; or a step failed before its update): like
 * a stop by a signal, the steps since the last snapshot are saved first,
 * so one bad image or one bad step never costs a long run its work.
 * advice: what to do to go on. */
/* off_advice: what to say instead of `advice` when snapshots are off
 * (nothing to resume), or NULL. */
static gp_status failure_snapshot(gp_model *m, const gp_config *cfg, gp_status err, int64_t step,
                                  int64_t saved, const gp_snapshot_pos *pos,
                                  gp_snapshot_lock *lock, const char *advice,
                                  const char *off_advice)
{
    char msg[2048], path[1100];
    snprintf(msg, sizeof msg, "%s", gp_error_message());
    bool on;
    gp_status s = final_snapshot(m, cfg, step, saved, pos, lock, &on, path, sizeof path);
    /* processes, snapshots on: every rank is here, as the save's own
     * exchanges need (the failure is agreed, or each rank found it alike);
     * the run ends in an abort (gpipe-train), so no rank may go on to it
     * before rank 0 has written the snapshot's file */
    if (on && gp_procs_size() > 1) (void)agreed(0);
    if (s != GP_OK)
        return gp_error_wrap(s, "%s; stopped at step %lld, and the final snapshot failed", msg,
                             (long long)step);
    if (stopped_untrained(on, path, step, saved))
        return gp_error_set(err, "%s; stopped at step %lld, before this run trained a step: "
                            "nothing to save; run the same command again once that is fixed",
                            msg, (long long)step);
    if (!on)
        return gp_error_set(err, "%s; stopped at step %lld, nothing saved since step %lld "
                            "(snapshots are off: set train.snapshot.every_steps to keep a run's "
                            "progress)%s%s", msg, (long long)step, (long long)saved,
                            off_advice ? "; " : "", off_advice ? off_advice : "");
    return gp_error_set(err, "%s; stopped at step %lld: snapshot %s holds it; %s", msg,
                        (long long)step, path, advice);
}

static gp_status data_failure(gp_model *m, const gp_config *cfg, gp_status err, int64_t step,
                              int64_t saved, const gp_snapshot_pos *pos, gp_snapshot_lock *lock)
{
    bool folder = cfg->data.dataset == GP_DATASET_IMAGE_FOLDER && !cfg->data.skip_bad_files;
    char advice[160];
    snprintf(advice, sizeof advice, "fix the data%s and go on with %s",
             folder ? " (or set data.on_bad_file: skip)" : "", gp_opt_name(GP_OPT_RESUME_LATEST));
    return failure_snapshot(m, cfg, err, step, saved, pos, lock, advice,
                            folder ? "fix the data, or set data.on_bad_file: skip" : NULL);
}

static void fmt_duration(double s, char *buf, size_t len)
{
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

/* How device j of the config is opened: its threads, capacity, precision. */
static gp_device_opts device_opts(const gp_config *cfg, int j)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    const gp_device_spec *ds = &pc->devices[j];
    return (gp_device_opts){.threads = gp_model_device_threads(pc, j),
                            .capacity = ds->memory ? ds->memory : pc->memory,
                            .precision = (gp_precision)cfg->train.precision,
                            .deterministic = cfg->train.deterministic};
}

/* Where device j's memory limit was written, for a message that it is too
 * small: pipeline.memory's place ("f.yaml:5:11", or its --set), the device
 * list's where the device has a memory of its own, else the config; the
 * config where the limit is the device's own memory (own). */
static const char *memory_at(const gp_config *cfg, int j, bool own)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    if (own) return cfg->path;
    if (pc->memory_at[0] && pc->devices[j].memory == pc->memory) return pc->memory_at;
    return pc->devices_at[0] ? pc->devices_at : cfg->path;
}

/* What the limit is called there: "the device's memory," (its own, no
 * limit given), "its pipeline.memory of" or "its memory of" (its entry in
 * pipeline.devices). */
static const char *memory_words(const gp_config *cfg, int j, bool own)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    if (own) return "the device's memory,";
    return pc->devices[j].memory == pc->memory ? "its pipeline.memory of" : "its memory of";
}

/* "N CPU devices on M cores: ..." into buf where the config's CPU devices
 * outnumber this machine's cores (false and "" where they do not): what a
 * run warns and --dry-run notes. */
static bool cores_shared(const gp_pipeline_config *pc, char *buf, size_t len)
{
    int n_cpu = gp_pipeline_cpu_devices(pc);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    buf[0] = '\0';
    if (n_cpu <= cores) return false;
    snprintf(buf, len, "%d CPU devices on %ld cores: devices will share cores and run slower "
             "than they would with their own", n_cpu, cores);
    return true;
}

/* "CPU devices compute in AVX2 (GPIPE_CPU_ISA caps it); gpipe's loops
 * in AVX2 (x86-64-v3)" into buf, for a run's log and --dry-run: the
 * processor a CPU benchmark or bug report must name (false and "" where
 * the config has no CPU device). */
static bool cpu_isa_line(const gp_pipeline_config *pc, char *buf, size_t len)
{
    buf[0] = '\0';
    if (gp_pipeline_cpu_devices(pc) == 0) return false;
    const char *cap = gp_cpu_isa_switch(), *loops = gp_cpu_loops_isa(), *isa = gp_cpu_isa_name();
    /* the loops' clones are the loader's pick by cpuid (cpu_isa.c): the
     * same bits as the capped set's, faster */
    bool above = (!strncmp(loops, "AVX-512", 7) && strncmp(isa, "AVX-512", 7)) ||
                 (!strncmp(loops, "AVX2", 4) && !strncmp(isa, "SSE", 3));
    snprintf(buf, len, "CPU devices compute in %s%s%s%s; gpipe's loops in %s%s", isa,
             cap ? " (" : "", cap ? cap : "", cap ? " caps it)" : "", loops,
             above ? ", the processor's (the same bits; -DGPIPE_ISA_CLONES=3 builds no "
                     "AVX-512 ones)" : "");
    return true;
}

/* Open the config's devices.  CPU devices share the machine's cores: by
 * default each gets cores / devices threads (at least 1). */
static gp_status open_devices(const gp_config *cfg, gp_device **devs)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    int n = gp_pipeline_devices_total(&cfg->pipeline);
    char shared[160];
    if (cores_shared(pc, shared, sizeof shared)) GP_WARN("%s", shared);
    /* processes: this rank opens its own device; the others' are stand-ins
     * (a host device under their names: their layers are shapes only, and
     * nothing runs on them here), so a GPU is opened by its rank alone */
    int mine = gp_procs_size() > 1 ? gp_procs_rank() : -1;
    for (int j = 0; j < n; j++) {
        const gp_device_spec *ds = &pc->devices[j];
        gp_device_opts o = device_opts(cfg, j);
        bool stand_in = mine >= 0 && j != mine;
        if (stand_in) o = (gp_device_opts){.threads = 1};
        gp_status s = gp_device_open(stand_in ? "cpu" : ds->name, &o, &devs[j]);
        if (s != GP_OK) {
            for (int q = 0; q < j; q++) gp_device_close(devs[q]);
            /* name where the device was listed (or the config, by default) */
            return gp_error_wrap(s, "%s: pipeline.devices", pc->devices_at[0] ? pc->devices_at
                                                                              : cfg->path);
        }
        if (stand_in) snprintf(devs[j]->name, sizeof devs[j]->name, "%s", ds->name);
    }
    gp_device_bind_thread(devs[mine >= 0 ? mine : 0]);
    return GP_OK;
}

static void close_devices(gp_device **devs, int n)
{
    for (int j = 0; j < n; j++) gp_device_close(devs[j]);
}

static gp_status summary_fits(const gp_config *cfg, const gp_model *m, gp_device **devs,
                               bool dry);
static gp_status activations_fit(const gp_config *cfg, const gp_model *meta, gp_device **devs,
                                 bool dry, FILE *f);
static gp_status fits_at_all(const gp_config *cfg, int64_t params);
static uint64_t host_memory(bool *limited);
static const char *host_words(uint64_t ram, bool limited, char *buf, size_t len);

gp_status gp_train_open(const gp_config *cfg, gp_device **devs, gp_model *model, bool quiet)
{
    int n = cfg->pipeline.n_devices, S = n * gp_model_virtual(cfg);
    int balance[GP_MAX_DEVICES];
    /* a model its loss cannot take is said as such, not as a failure of
     * whatever first runs it (balance: auto's profile) */
    int64_t params;
    gp_shape output;
    GP_TRY(gp_model_describe(cfg, &params, &output));
    GP_TRY(fits_at_all(cfg, params)); /* before a profile builds it */
    /* processes: from here on a rank that stops answering ends the run
     * after pipeline.peer_timeout (rank 0 profiles, the others wait) */
    gp_procs_watch(cfg->pipeline.peer_timeout > 0 ? cfg->pipeline.peer_timeout
                                                  : GP_PEER_TIMEOUT_DEFAULT, n, S,
                   cfg->pipeline.schedule);
    if (gp_procs_size() > 1) {
        /* processes: rank 0 balances (profiling once), every rank takes
         * its split, or its failure */
        int msg[1 + GP_MAX_DEVICES] = {0};
        gp_status bs = GP_OK;
        if (gp_procs_rank() == 0) msg[0] = (int)(bs = gp_model_balance(cfg, S, msg + 1, quiet));
        GP_TRY(gp_procs_bcast(msg, sizeof msg, 0));
        if (bs != GP_OK) return bs;
        if (msg[0] != GP_OK)
            return gp_error_set((gp_status)msg[0], "rank 0 could not balance the model (its "
                                "message says why)");
        memcpy(balance, msg + 1, sizeof balance);
    } else {
        GP_TRY(gp_model_balance(cfg, S, balance, quiet));
    }
    /* A capacity the stages' weights, gradients and optimizer state do not
     * fit is said as --dry-run says it, naming the device and what would
     * help, rather than as the allocator's refusal of whichever tensor came
     * first (which suggested micro-batches and checkpointing, no help) */
    gp_model meta = {0};
    gp_status fs = gp_model_build_meta(cfg, balance, &meta);
    if (fs == GP_OK) fs = summary_fits(cfg, &meta, NULL, false);
    if (fs != GP_OK) { /* (alike on every rank: the same config, the same count) */
        if (meta.layers) gp_model_free(&meta);
        return fs;
    }
    gp_status os = open_devices(cfg, devs);
    /* a GPU's own memory, once it is open (each rank its own) */
    if (os == GP_OK && meta.layers) {
        os = summary_fits(cfg, &meta, devs, false);
        if (os == GP_OK) os = activations_fit(cfg, &meta, devs, false, NULL);
        if (os != GP_OK) close_devices(devs, gp_pipeline_devices_total(&cfg->pipeline));
    }
    if (meta.layers) gp_model_free(&meta);
    /* processes: a rank whose device does not open ends here with every
     * rank, before the communicator below that all must make together */
    if (gp_procs_size() > 1) {
        bool opened = os == GP_OK;
        os = gp_procs_agree(os, "while opening its device", NULL, NULL);
        if (os != GP_OK && opened) close_devices(devs, gp_pipeline_devices_total(&cfg->pipeline));
    }
    GP_TRY(os);
    int R = gp_pipeline_replicas(&cfg->pipeline);
    gp_status s;
    if (gp_procs_size() > 1 && R > 1) {
        /* processes: this rank's replica only, its data-parallel group over
         * the ranks that run the same device of the other replicas */
        int rank = gp_procs_rank(), rho = rank / n, d = rank % n;
        s = gp_model_build_replica(cfg, devs + (size_t)rho * (size_t)n, n, balance, rho, R,
                                   model);
        gp_device *grp[GP_MAX_DEVICES];
        for (int r = 0; r < R; r++) grp[r] = devs[(size_t)r * (size_t)n + (size_t)d];
        gp_comm *comm = NULL;
        gp_status cs = gp_procs_comm_create(grp, R, d, rho, &comm); /* every rank, always */
        if (s == GP_OK) s = cs;
        if (s == GP_OK) {
            model->proc_comm = comm;
            model->proc_replicas = R;
        } else {
            gp_comm_destroy(comm);
            if (model->layers) gp_model_free(model);
        }
    } else {
        s = gp_model_build_replicated(cfg, devs, R, n, balance, model);
    }
    if (s != GP_OK) {
        close_devices(devs, gp_pipeline_devices_total(&cfg->pipeline));
        return s;
    }
    if (!quiet && n > 1) {
        char line[512];
        int off = 0;
        for (int j = 0; j < S && off < (int)sizeof line - 32; j++)
            off += snprintf(line + off, sizeof line - (size_t)off, "%s%d", j ? ", " : "", balance[j]);
        GP_INFO("balance%s%s%s: [%s] over %d %s", cfg->pipeline.n_balance ? "" : " (auto, by ",
                cfg->pipeline.n_balance ? "" : (strcmp(gp_model_balance_method(), "flops")
                                                    ? "profiled time" : "estimated FLOPs"),
                cfg->pipeline.n_balance ? "" : ")", line, S, S > n ? "stages" : "devices");
        if (!cfg->pipeline.n_balance && gp_config_bf16_copies(cfg) &&
            strcmp(gp_model_balance_method(), "flops"))
            GP_INFO("copies in bf16 round where the stages meet, and balance: auto placed "
                    "them by measured times: a rerun may split otherwise and give other "
                    "bits; for exact reruns set pipeline.balance: [%s]", line);
    }
    return GP_OK;
}

gp_status gp_train_check_processes(const gp_config *cfg)
{
    int N = gp_procs_size();
    const gp_pipeline_config *pc = &cfg->pipeline;
    if (N <= 1) return GP_OK;
    int total = gp_pipeline_devices_total(pc), R = gp_pipeline_replicas(pc);
    if (total != N) {
        char rep[64] = "", alt[160];
        if (R > 1) snprintf(rep, sizeof rep, " (%d stages x %d replicas)", pc->n_devices, R);
        if (R > 1) /* the devices listed are one replica's: the product must match */
            snprintf(alt, sizeof alt, "or choose pipeline.devices and pipeline.replicas whose "
                     "product (stages x replicas) is %d", N);
        else
            snprintf(alt, sizeof alt, "or list %d devices", N);
        return gp_error_set(GP_ERR_INVALID, "%s: mpirun started %d processes but "
                            "pipeline.devices lists %d device%s%s; each process runs one device: "
                            "start mpirun -np %d, %s", cfg->path, N, total,
                            total == 1 ? "" : "s", rep, total, alt);
    }
    return GP_OK;
}

/* An evaluation whose loss is not finite while training's were (a NaN
 * training loss ends the run): said once, with the usual causes, rather
 * than printed as a test loss of nan. */
static void warn_eval_not_finite(double test_loss, double train_loss, bool *said)
{
    if (isfinite(test_loss) || *said) return;
    *said = true;
    GP_WARN("the test loss is %s (training's last loss %.4g): the model's outputs in evaluation "
            "mode are not finite. Batch norm evaluates with its running statistics, which "
            "micro-batches of one or two samples estimate badly (raise train.batch_size or "
            "lower pipeline.chunks); weights grown too large overflow too (lower "
            "train.optimizer.lr)", isnan(test_loss) ? "NaN" : test_loss > 0 ? "+inf" : "-inf",
            train_loss);
}

/* MNIST and Fashion-MNIST come in files of the same names and shapes, so
 * data.dataset: mnist over a Fashion-MNIST folder (a config's data.path
 * left as it was) trains on the wrong set, normalised with the wrong
 * statistics, without a word.  Their mean pixels (0.131 and 0.286) tell
 * them apart; a training split far from its set's says so. */
static void warn_other_mnist(const gp_config *cfg, const gp_dataset *ds)
{
    gp_dataset_kind k = cfg->data.dataset;
    if ((k != GP_DATASET_MNIST && k != GP_DATASET_FASHION_MNIST) || !ds->images || ds->n < 100)
        return;
    int64_t n = ds->n * ds->c * ds->h * ds->w;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += ds->images[i];
    double mean = sum / (double)n / 255.0, want = k == GP_DATASET_MNIST ? 0.1307 : 0.2860;
    if (fabs(mean - want) > 0.06)
        GP_WARN("data.dataset is %s, but the training images' mean pixel is %.3f (mnist's is "
                "0.131, fashion-mnist's 0.286): check that data.path holds %s (read: %s)",
                gp_dataset_name(k), mean, gp_dataset_name(k), ds->source);
}

/* No output may replace an input or another output: the config, the
 * snapshot resumed from, model.init_from, or a snapshot in the snapshot
 * directory (an export holds weights only, a metrics file or a trace
 * nothing of it; each would replace it, and a metrics file is truncated
 * before the resumed snapshot is even read). */
/* The same name, or the same file spelled otherwise (gp_same_file: existing
 * or not yet written). */
static bool same_path(const char *a, const char *b)
{
    return a && b && a[0] && b[0] && (!strcmp(a, b) || gp_same_file(a, b));
}

/* --export-weights failed (err, its message set) after the run reached
 * step `step`: say where the weights still are, and how to write them
 * once there is room: the final snapshot (snapshots on: the last step
 * saves one), the snapshot a conversion read (`trained` false), or
 * nowhere (snapshots off: the run's work is lost, and nothing else said
 * so). */
static gp_status export_failed(const gp_config *cfg, const gp_train_opts *opts, gp_status err,
                               int64_t step, int64_t saved, bool trained)
{
    const gp_snapshot_config *snc = &cfg->train.snapshot;
    bool on = snc->every_steps > 0 || snc->every_minutes > 0;
    char msg[2048], snap[1100] = "", flag[1200], from[1200];
    snprintf(msg, sizeof msg, "%s", gp_error_message());
    gp_opt_value(GP_OPT_EXPORT, opts->export_path, flag, sizeof flag);
    snprintf(from, sizeof from, "%s", gp_opt_name(GP_OPT_RESUME_LATEST));
    if (!trained && opts->resume_path && strcmp(opts->resume_path, "latest")) {
        snprintf(snap, sizeof snap, "%s", opts->resume_path);
        gp_opt_value(GP_OPT_RESUME, snap, from, sizeof from);
    } else if ((!trained && opts->resume_path) || (on && saved == step)) {
        gp_snapshot_path(snc->dir, step, snap, sizeof snap);
    }
    struct stat sb;
    if (snap[0] && stat(snap, &sb) == 0)
        return gp_error_set(err, "%s; the weights of step %lld are in snapshot %s: once that is "
                            "fixed, write them from it with %s %s (it trains nothing again)", msg,
                            (long long)step, snap, from, flag);
    if (!trained) return err;
    if (on)
        return gp_error_set(err, "%s; the trained weights (step %lld) are lost: the final "
                            "snapshot is not there either; make room (or give %s another path) "
                            "and train again", msg, (long long)step, gp_opt_name(GP_OPT_EXPORT));
    return gp_error_set(err, "%s; the trained weights (step %lld) are lost: snapshots are off, so "
                        "nothing else holds them; make room (or give %s another path) and train "
                        "again, with train.snapshot.every_steps set to keep a run's weights",
                        msg, (long long)step, gp_opt_name(GP_OPT_EXPORT));
}

static gp_status check_outputs_spare_inputs(const gp_config *cfg, const gp_train_opts *opts,
                                            const char *tb_dir, const char *tb_what)
{
    enum { N_OUTS = 4 };
    const struct {
        const char *opt, *path;
    } outs[N_OUTS] = {{gp_opt_name(GP_OPT_EXPORT), opts->export_path},
                      {gp_opt_name(GP_OPT_METRICS), opts->metrics_path},
                      {gp_opt_name(GP_OPT_TRACE), opts->trace_path},
                      {tb_what, tb_dir}}; /* (a directory: the same name is a clash too) */
    char reads[80];
    snprintf(reads, sizeof reads, "the snapshot %s reads", gp_opt_name(GP_OPT_RESUME));
    const struct {
        const char *what, *path;
    } ins[2] = {{"the config", cfg->path}, {reads, opts->resume_path}};
    const char *snap_dir = cfg->train.snapshot.dir;
    for (int o = 0; o < N_OUTS; o++) {
        const char *out = outs[o].path;
        if (!out || !out[0]) continue;
        const char *what = NULL, *path = NULL;
        for (int k = 0; k < 2 && !what; k++)
            if (gp_path_overlaps(out, ins[k].path)) { /* a folder's members too */
                what = ins[k].what;
                path = ins[k].path;
            }
        switch (what ? GP_CONFIG_READS_NONE : gp_config_input_of(cfg, out)) {
        case GP_CONFIG_READS_NONE: break;
        case GP_CONFIG_READS_INIT_FROM:
            what = "model.init_from";
            path = cfg->model.init_from;
            break;
        case GP_CONFIG_READS_SCHEDULE:
            what = "pipeline.schedule.file";
            path = cfg->pipeline.schedule_path;
            break;
        case GP_CONFIG_READS_DATASET:
            return gp_error_set(GP_ERR_INVALID, "%s %s is a file of the dataset (data.path: "
                                "%s): writing it would replace what the run reads; give the "
                                "output another name", outs[o].opt, out,
                                cfg->data.path[0] ? cfg->data.path : "its default folder");
        }
        if (what)
            return gp_error_set(GP_ERR_INVALID, "%s %s is %s (%s), or a file of it: "
                                "writing it would replace what the run reads; give the "
                                "output another name", outs[o].opt, out, what, path);
        for (int q = 0; q < o; q++)
            if (same_path(out, outs[q].path))
                return gp_error_set(GP_ERR_INVALID, "%s and %s name the same file (%s); give "
                                    "each its own", outs[q].opt, outs[o].opt, out);
        const char *slash = strrchr(out, '/');
        const char *base = slash ? slash + 1 : out;
        if (snap_dir[0] && !strncmp(base, "snapshot-", 9) && gp_path_in_dir(out, snap_dir))
            return gp_error_set(GP_ERR_INVALID, "%s %s: a snapshot's name in train.snapshot.dir "
                                "(%s); %s and would replace that snapshot: write it under "
                                "another name or folder", outs[o].opt, out, snap_dir,
                                o == 0 ? "the export holds weights only"
                                       : "it holds no snapshot");
    }
    return GP_OK;
}

/* ---- the training loop ------------------------------------------------------
 *
 * Reading the trainer: gp_train_run is a loop over steps between a start
 * and an end, each part its own function below, in this order:
 *
 *   run_check_outputs        every output checked, the snapshot directory
 *                            locked (nothing written yet)
 *   run_open_outputs         the trace opened
 *   run_load_data            both splits loaded and checked against the model
 *   run_place_model          balanced, devices opened, the model built
 *   run_start_loader         the weights read (model.init_from, or the
 *                            snapshot resumed), the loader started, the
 *                            metrics file opened (run_open_metrics: one a
 *                            run that fails before spares) and it and
 *                            TensorBoard cut back to the snapshot
 *   run_plan                 the run's length, and what it says of it
 *   run_begin_steps          the clocks, and what a stop saves so far
 *   each step:
 *     stop_if_asked          a signal: the final snapshot, then stop
 *     background_write_ok    a snapshot written in the background failed
 *     wait_for_batch         the loader's next batch
 *     evaluate_if_epoch_ended  train.eval_each_epoch's evaluation, decided here
 *     take_step              forward, backward and update on every stage
 *     trace_step             the step's timeline, when --trace wants it
 *     count_throughput       samples/s and the share spent waiting for data
 *     record_step            the --metrics and TensorBoard record
 *     snapshot_if_due        train.snapshot.every_steps / every_minutes / the
 *                            last step
 *     report_progress        the progress bar, or a log line
 *   run_finish               the last snapshot written, --export-weights, a
 *                            stop after the last step, the final evaluation,
 *                            the memory report
 *   run_close                everything closed; the run's error kept
 *
 * A stop asked by a signal saves in stop_between_steps (a final snapshot,
 * unless the newest is of this step); a failure after the first step saves
 * in failure_snapshot (data_failure for data and evaluations), so a stop
 * or one bad batch never costs a run its work.  Under mpirun every call
 * of agreed() is a collective: every rank makes them in the same order. */

/* The run's files besides snapshots, and how progress is shown. */
typedef struct run_outputs {
    FILE *metrics;          /* --metrics, or NULL */
    gp_json_writer record;  /* the metrics record being written */
    gp_tboard *tb;          /* TensorBoard's event file (processes: rank 0's), or NULL */
    const char *tb_dir;     /* where it goes: NULL when not wanted or not this rank's */
    const char *tb_what;    /* the flag or key that named it, for messages */
    gp_trace *trace;        /* --trace, or NULL */
    int64_t traced;         /* steps the trace holds */
    int progress;           /* 1: the progress bar on stderr; 0: log lines */
} run_outputs;

/* Where the run's work is saved: what a stop, a failure and the next
 * snapshot need. */
typedef struct run_saves {
    gp_snapshot_lock *lock; /* the snapshot directory, held for the whole run */
    bool on;                /* train.snapshot.every_steps or every_minutes is set */
    /* Where the loader stood after the last step (before the first: the
     * resumed snapshot's place): what a stop between steps saves. */
    gp_snapshot_pos pos;
    int64_t saved_step;     /* the newest snapshot's step (or the first step) */
    /* saved_step's, or while it is written in the background, the one
     * before: the newest known to be on disk, which a failed write names */
    int64_t written_step;
    double last_time;       /* gp_now() at the newest snapshot (or the start) */
} run_saves;

/* The devices, and the memory and waits measured on them. */
typedef struct run_devices {
    gp_device *devs[GP_MAX_DEVICES]; /* every replica's, replica-major */
    int n;                           /* opened: gp_pipeline_devices_total */
    /* the run's peaks (the allocators' are reset every step, so the
     * metrics' are per step): the total, and each kind's own */
    size_t peak[GP_MAX_DEVICES], peak_by[GP_MAX_DEVICES][GP_MEM_COUNT];
    /* per device, what it did in the step (host_waits -1: another rank's) */
    gp_step_counts counts[GP_MAX_DEVICES];
} run_devices;

/* What one gp_train_run holds from its start to its end. */
typedef struct train_run {
    const gp_config *cfg;
    const gp_train_config *tc;  /* &cfg->train */
    const gp_train_opts *opts;
    gp_train_result *res;       /* the caller's, filled in as the run goes */
    gp_dataset train, test;
    run_devices dev;
    /* built where the caller keeps it (keep_model: its address is final, as
     * the pipeline holds pointers into it), else in model_here */
    gp_model model_here;
    gp_model *mp;
    gp_loader *loader;
    run_outputs out;
    run_saves saves;
    gp_throughput window;
    /* the run's shape (run_start_loader, run_plan) */
    int64_t min_batch;          /* pipeline.chunks x replicas: the smallest batch a step splits */
    int64_t rest;               /* the samples an epoch's full batches leave over */
    bool drop_rest;             /* too few to split: the loader drops them */
    int64_t per_epoch, total;   /* steps in an epoch, and in the run */
    int64_t first_step;         /* 0, or the step a resumed run starts from */
    /* the epoch of the last batch trained (-1: none yet): an evaluation is
     * due when the next batch's epoch differs */
    int64_t last_epoch;
    bool eval_nan_said;         /* a test loss that is not finite was warned of */
    double t_start;             /* gp_now() when the first step began */
    int64_t run_first, run_last; /* the steps this run took (-1: none) */
    int64_t fail_step;          /* GPIPE_TEST_FAIL_STEP (tests/test_snapshot.c), or -1 */
    /* the bubble (gp_train_result.bubble): summed over the steps after the
     * run's first */
    double bub_busy, bub_window;
    int64_t bub_steps;
} train_run;

/* One step's batch, and what taking it measured. */
typedef struct train_step {
    int64_t step;           /* 0-based: the step taken is step + 1 of total */
    gp_batch b;
    double waited;          /* seconds spent waiting for b */
    double lr;
    gp_step_stats st;
    double now;             /* gp_now() after the step (and its trace) */
} train_step;

static void run_init(train_run *r, const gp_config *cfg, const gp_train_opts *opts,
                     gp_train_result *res)
{
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    r->tc = &cfg->train;
    r->opts = opts;
    r->res = res;
    memset(res, 0, sizeof *res);
    /* (a run that takes no step, resumed at or past its end, has no last
     * step: NaN, not a loss of 0 that reads as a perfect model) */
    res->final_loss = res->final_accuracy = res->final_lr = res->final_seconds = NAN;
    res->test_loss = NAN;
    res->test_accuracy = NAN;
    res->final_grad_norm = NAN;
    r->fail_step = -1; /* GPIPE_TEST_FAIL_STEP, read with the other options below */
    r->mp = opts->keep_model ? opts->keep_model : &r->model_here;
    memset(r->mp, 0, sizeof *r->mp);
    r->out.tb_dir = opts->tensorboard_dir ? opts->tensorboard_dir : cfg->train.tensorboard;
    r->out.tb_what = opts->tensorboard_dir ? "--tensorboard" : "train.tensorboard";
    if (!r->out.tb_dir[0] || gp_procs_rank() != 0) r->out.tb_dir = NULL;
    r->saves.on = r->tc->snapshot.every_steps > 0 || r->tc->snapshot.every_minutes > 0;
    r->run_first = r->run_last = -1;
}

/* --export-weights's path checked: a file, or for a Llama in Hugging
 * Face's format the folder it writes (hf_llama.c). */
static gp_status check_export_path(const gp_config *cfg, const gp_train_opts *opts)
{
    gp_weights_format f = (gp_weights_format)opts->export_format;
    if ((f == GP_WEIGHTS_HF && (!strcmp(cfg->model.family, "llama") ||
                                gp_gpt_hf_folder_path(opts->export_path))) ||
        f == GP_WEIGHTS_HF_BF16)
        return gp_check_writable_dir(opts->export_path, gp_opt_name(GP_OPT_EXPORT));
    return gp_check_writable_file(opts->export_path, gp_opt_name(GP_OPT_EXPORT), true);
}

/* Every output is checked before any work: a bad path costs a second, not
 * the run; then the snapshot directory is taken.  Nothing is open yet, so
 * a failure here has nothing to close. */
static gp_status run_check_outputs(train_run *r)
{
    const gp_config *cfg = r->cfg;
    const gp_train_opts *opts = r->opts;
    gp_status chk = GP_OK;
    if (opts->export_path && gp_procs_rank() == 0) /* processes: rank 0 writes it */
        chk = check_export_path(cfg, opts);
    if (chk == GP_OK) chk = check_outputs_spare_inputs(cfg, opts, r->out.tb_dir, r->out.tb_what);
    /* a test hook read as an option is (tests/test_snapshot.c) */
    if (chk == GP_OK) chk = gp_env_int("GPIPE_TEST_FAIL_STEP", -1, -1, INT64_MAX, &r->fail_step);
    /* the files opened below, checked before either is (a metrics file
     * emptied for a trace path that then fails would be lost) */
    if (chk == GP_OK && opts->metrics_path)
        chk = gp_check_writable_file(opts->metrics_path, gp_opt_name(GP_OPT_METRICS), false);
    if (chk == GP_OK && opts->trace_path)
        chk = gp_check_writable_file(opts->trace_path, gp_opt_name(GP_OPT_TRACE), false);
    if (chk == GP_OK && r->out.tb_dir) chk = gp_check_writable_dir(r->out.tb_dir, r->out.tb_what);
    if (chk == GP_OK) chk = gp_snapshot_resume_check(opts->resume_path, r->tc->snapshot.dir);
    if (chk == GP_OK) chk = gp_snapshot_fresh_check(cfg, opts->resume_path);
    /* processes: no rank opens an output before every rank's are checked */
    chk = agree_phase(chk, "checking its outputs; nothing was written", r->res);
    if (chk != GP_OK) return chk;
    /* Processes: rank 0 checks the directory, makes it and takes its lock
     * before any other rank checks it.  The check makes a missing directory
     * and removes it again, so checked on every rank at once it could
     * remove the directory under rank 0's lock file. */
    if (r->saves.on && gp_procs_rank() == 0) GP_TRY(check_snapshot_dir(cfg));
    /* Then: a second run on the same snapshot directory stops here. */
    return gp_snapshot_lock_run(cfg, opts->resume_path, &r->saves.lock);
}

/* The metrics file opened (truncated, or appended to by a resumed run),
 * once the model is built and its weights loaded: a run that fails before
 * (a bad model.init_from, data that does not load) leaves an existing
 * file as it was (issue 77: it was emptied).  Its path was checked with
 * the other outputs before anything was read. */
static gp_status run_open_metrics(train_run *r)
{
    const gp_train_opts *opts = r->opts;
    if (!opts->metrics_path) return GP_OK;
    /* (a resumed run appends to a file, after metrics_resume's cut;
     * a pipe or a device is written as before) */
    struct stat ms;
    bool append = opts->resume_path &&
                  (stat(opts->metrics_path, &ms) != 0 || S_ISREG(ms.st_mode));
    r->out.metrics = fopen(opts->metrics_path, append ? "a+" : "w");
    if (!r->out.metrics)
        return gp_error_set(GP_ERR_IO, "%s '%s' cannot be written: %s; check the directory "
                            "exists and is writable", gp_opt_name(GP_OPT_METRICS),
                            opts->metrics_path, strerror(errno));
    return GP_OK;
}

/* The snapshot directory on every rank, then the trace opened (the
 * metrics file later: run_open_metrics). */
static gp_status run_open_outputs(train_run *r)
{
    const gp_train_opts *opts = r->opts;
    gp_status s = GP_OK;
    if (r->saves.on && gp_procs_size() > 1) {
        (void)agreed(0); /* rank 0 has made the directory (it aborts the run if it cannot) */
        /* the other ranks write their parts there too */
        if (gp_procs_rank() != 0) s = check_snapshot_dir(r->cfg);
        if (s == GP_OK) s = check_dir_shared(r->cfg, r->res);
        if (s != GP_OK) return s;
    }
    if (opts->trace_path) {
        s = gp_trace_open(opts->trace_path, opts->trace_first, opts->trace_last, &r->out.trace);
        if (s != GP_OK) gp_error_wrap(s, "%s", gp_opt_name(GP_OPT_TRACE));
    }
    return s;
}

/* Both splits' samples of the model's input shape: evaluation uploads test
 * samples of it too (a test split of no samples: nothing to check). */
static gp_status check_input_shape(const gp_config *cfg, const gp_dataset *train,
                                   const gp_dataset *test)
{
    for (int q = 0; q < 2; q++) {
        const gp_dataset *d = q ? test : train;
        if (q && d->n == 0) break;
        if (d->c != cfg->model.input[0] || d->h != cfg->model.input[1] ||
            d->w != cfg->model.input[2])
            return gp_error_set(GP_ERR_INVALID,
                                "%s: model.input is [%lld, %lld, %lld] but %s has samples of "
                                "[%lld, %lld, %lld]; set model.input to match the data%s",
                                cfg->model.input_at[0] ? cfg->model.input_at : cfg->path,
                                (long long)cfg->model.input[0], (long long)cfg->model.input[1],
                                (long long)cfg->model.input[2], d->source, (long long)d->c,
                                (long long)d->h, (long long)d->w,
                                q ? " (the test split must have the training split's shape)"
                                  : "");
    }
    return GP_OK;
}

gp_status gp_train_check_data(const gp_config *cfg)
{
    gp_dataset tr, te;
    bool k1, k2;
    GP_TRY(gp_dataset_peek(&cfg->data, true, &tr, &k1));
    GP_TRY(gp_dataset_peek(&cfg->data, false, &te, &k2));
    if (!k1 || !k2) return GP_OK;
    GP_TRY(check_input_shape(cfg, &tr, &te));
    return check_targets(cfg, &tr, &te);
}

/* Both splits loaded, of the model's input shape (evaluation uploads test
 * samples too), agreed between the ranks, and their targets checked. */
static gp_status run_load_data(train_run *r)
{
    const gp_config *cfg = r->cfg;
    gp_dataset *train = &r->train, *test = &r->test;
    gp_status s = gp_dataset_load(&cfg->data, true, r->tc->seed, train);
    if (s == GP_OK) s = gp_dataset_load(&cfg->data, false, r->tc->seed, test);
    if (s == GP_OK && train->folder && test->folder) {
        s = gp_image_folder_align_classes(test->folder, train->folder);
        if (s == GP_OK) test->classes = gp_image_folder_classes(test->folder);
    }
    if (s == GP_OK) s = check_input_shape(cfg, train, test);
    /* A limit beyond a split keeps all of it: said, since the config reads
     * as N samples and the run trains on fewer (rank 0: every rank loads) */
    for (int q = 0; q < 2 && s == GP_OK && gp_procs_rank() == 0; q++) {
        int64_t lim = q ? cfg->data.test_limit : cfg->data.train_limit;
        const gp_dataset *d = q ? test : train;
        if (lim > d->n)
            GP_WARN("%s: data.%s_limit = %lld is more than the %lld samples of %s; all %lld "
                    "are used", cfg->path, q ? "test" : "train", (long long)lim,
                    (long long)d->n, d->source, (long long)d->n);
    }
    if (gp_procs_size() > 1) s = agree_on_data(s, train, test, r->res); /* (every rank) */
    /* one normalisation value for every channel, or one per channel */
    if (s == GP_OK && cfg->data.normalize && cfg->data.n_mean > 1 && cfg->data.n_mean != train->c)
        s = gp_error_set(GP_ERR_INVALID, "%s: data.mean and data.std have %d values but %s has "
                         "%lld channel%s; give one value per channel, or one for all",
                         cfg->data.mean_at[0] ? cfg->data.mean_at : cfg->path,
                         cfg->data.n_mean, train->source, (long long)train->c,
                         train->c == 1 ? "" : "s");
    if (s == GP_OK) s = check_targets(cfg, train, test);
    if (s == GP_OK) s = stop_early(r->opts, "while loading the data", r->res);
    return s;
}

/* Models from this many parameters say that they are being built. */
#define GP_BUILD_SAY_PARAMS ((int64_t)100 * 1000 * 1000)

/* Balanced, the devices opened and the model built on them. */
static gp_status run_place_model(train_run *r)
{
    gp_model_build_stop(r->opts->stop); /* a signal stops the initialisation too */
    /* every parameter loaded next (gp_snapshot_prepare): no random draws */
    bool loads = r->opts->resume_path || r->cfg->model.init_from[0];
    gp_model_build_loads(loads);
    /* a large model's build takes a while (a 1.2B one ~40 s of draws on 2
     * cores): said before it, not only after */
    int64_t params = 0;
    if (!r->opts->quiet && gp_model_count_params(r->cfg, &params) == GP_OK &&
        params >= GP_BUILD_SAY_PARAMS)
        GP_INFO("building the model: %lld parameters, %s", (long long)params,
                loads ? "loaded next (no random draws)" : "drawing their initial values");
    gp_status s = gp_train_open(r->cfg, r->dev.devs, r->mp, r->opts->quiet);
    gp_model_build_loads(false);
    gp_model_build_stop(NULL);
    if (s == GP_ERR_STOPPED) r->res->stop_signal = stop_asked(r->opts);
    if (s == GP_OK) r->dev.n = gp_pipeline_devices_total(&r->cfg->pipeline);
    s = agree_phase(s, "while placing the model (balance, devices)", r->res);
    if (s == GP_OK) s = stop_early(r->opts, "while placing the model (balance, devices)", r->res);
    return s;
}

/* A resumed run's metrics file and TensorBoard events cut back to the
 * snapshot's step (processes: rank 0's), then the events opened. */
static gp_status resume_records(train_run *r)
{
    const gp_train_opts *opts = r->opts;
    const gp_train_config *tc = r->tc;
    gp_model *mp = r->mp;
    gp_status s = GP_OK;
    bool drop_final = false, drop_epoch = false;
    if ((r->out.metrics || r->out.tb_dir) && opts->resume_path) { /* (processes: rank 0's) */
        int64_t n = gp_train_total_steps(tc, gp_loader_batches_per_epoch(r->loader));
        /* what this run writes again at its first step: the final
         * evaluation, unless it only exports (nothing left to train);
         * the epoch's, resumed at an epoch's start with steps left */
        bool trains = mp->step < n;
        drop_final = trains || !opts->export_path;
        drop_epoch = trains && r->saves.pos.batch == 0 && mp->step > 0 && tc->eval_each_epoch;
        if (r->out.metrics)
            s = metrics_resume(r->out.metrics, opts->metrics_path, mp->step, drop_final,
                               drop_epoch, r->saves.pos.metrics);
    }
    if (s == GP_OK && r->out.tb_dir) /* (cut back as the metrics file is) */
        s = gp_tboard_open(r->out.tb_dir, r->out.tb_what, opts->resume_path ? mp->step : -1,
                           drop_final || drop_epoch, r->saves.pos.metrics, &r->out.tb);
    return s;
}

/* The snapshot to resume read into the model (r->saves.pos: where it
 * stopped), and the loader started there. */
static gp_status run_start_loader(train_run *r)
{
    const gp_config *cfg = r->cfg;
    const gp_train_config *tc = r->tc;
    gp_model *mp = r->mp;
    /* A step splits its batch into chunks micro-batches on every replica:
     * an epoch's last, partial batch that cannot be is dropped (said
     * below), not a failure at the end of every epoch. */
    r->min_batch = (int64_t)cfg->pipeline.chunks * gp_pipeline_replicas(&cfg->pipeline);
    r->rest = r->train.n % tc->batch_size;
    r->drop_rest = r->rest > 0 && r->rest < r->min_batch && r->train.n > tc->batch_size;
    gp_loader_opts lo = {.batch_size = tc->batch_size, .shuffle = cfg->data.shuffle,
                         .augment = true, .drop_last = r->drop_rest,
                         .masks = mp->loss == GP_LOSS_BCE_WITH_LOGITS &&
                                  gp_dataset_has_masks(&r->train),
                         .prefetch = cfg->data.prefetch > 0 ? cfg->data.prefetch : 2,
                         .seed = tc->seed, .pin = r->dev.devs[0],
                         .workers = r->train.folder ? gp_data_workers(cfg) : 1,
                         /* processes: only stage 0's rank needs the images */
                         .labels_only = mp->local_device > 0 && !cfg->data.skip_bad_files};
    /* (a snapshot every rank refuses, another model or damaged, is said
     * once, by rank 0) */
    int64_t per_epoch = gp_loader_batches(r->train.n, tc->batch_size, r->drop_rest);
    gp_status s = gp_snapshot_prepare(mp, cfg, r->opts->resume_path, per_epoch, r->saves.lock,
                                      r->opts->quiet, &r->saves.pos);
    s = agree_phase(s, "while reading the snapshot to resume", r->res);
    lo.start_epoch = r->saves.pos.epoch;
    lo.start_batch = r->saves.pos.batch;
    if (s == GP_OK) {
        if (tc->batch_size > r->train.n) {
            bool cut = cfg->data.train_limit > 0 && cfg->data.train_limit == r->train.n;
            s = gp_error_set(GP_ERR_INVALID, "%s: train.batch_size = %lld exceeds the %lld "
                             "training samples%s; lower train.batch_size to %lld or less%s",
                             cfg->path, (long long)tc->batch_size, (long long)r->train.n,
                             cut ? " data.train_limit keeps" : "", (long long)r->train.n,
                             cut ? ", or raise data.train_limit" : "");
        }
        if (s == GP_OK) s = gp_loader_create(&r->train, &cfg->data, &lo, &r->loader);
        /* steps, and samples seen, fit int64 (the loader's per_epoch is
         * the one above) */
        if (s == GP_OK && tc->steps <= 0 && tc->epochs > INT64_MAX / tc->batch_size / per_epoch)
            s = gp_error_set(GP_ERR_INVALID, "%s: train.epochs = %lld of %lld batches each "
                             "is more steps than a run can count; give fewer epochs, or "
                             "train.steps", cfg->path, (long long)tc->epochs,
                             (long long)per_epoch);
        /* the weights are in (model.init_from, the snapshot): now the metrics */
        if (s == GP_OK) s = run_open_metrics(r);
        if (s == GP_OK) s = resume_records(r);
        gp_wmodel wv = gp_model_weights(mp);
        if (s == GP_OK && r->opts->export_path) /* a GPT-2 format that cannot hold it */
            s = gp_gpt_export_check(&wv, (gp_weights_format)r->opts->export_format,
                                    mp->step < gp_train_total_steps(
                                                   tc, gp_loader_batches_per_epoch(r->loader)));
        s = agree_phase(s, "while starting its data loader", r->res);
    }
    free(r->saves.pos.metrics); /* (written again, or not wanted) */
    r->saves.pos.metrics = NULL;
    return s;
}

/* A resumed run whose learning rate goes on from another value than the
 * snapshot's run would have taken next (train.steps raised under a cosine
 * schedule stretches the decay: the rate jumps back up), said once with
 * both rates and the likely cause.  Deliberate changes are common (a new
 * rate, a longer run): a warning, not a refusal. */
static void warn_lr_jump(const train_run *r)
{
    const gp_snapshot_pos *p = &r->saves.pos;
    int64_t step = r->mp->step;
    if (!r->opts->resume_path || p->total < 1 || step >= r->total) return;
    double now = gp_lr_at(r->tc, step, r->total);
    if (fabs(now - p->lr) <= 1e-6 * fmax(fabs(now), fabs(p->lr))) return;
    char why[200];
    if (p->total != r->total)
        snprintf(why, sizeof why, "the run now has %lld steps in all where the snapshot's had "
                 "%lld (train.steps, or train.epochs), and its schedule depends on the run's "
                 "length", (long long)r->total, (long long)p->total);
    else
        snprintf(why, sizeof why, "train.lr or train.schedule differs from the snapshot's run");
    GP_WARN("resumed at step %lld with learning rate %.6g where the snapshot's run would have "
            "gone on at %.6g: %s. As intended if changed on purpose; to go on as that run "
            "would have, give it its train settings back", (long long)step + 1, now, p->lr, why);
}

/* The run's length, warnings about it, and what it is about to train
 * (quiet keeps the warnings: warnings and errors are always said). */
static void run_plan(train_run *r)
{
    const gp_config *cfg = r->cfg;
    const gp_train_config *tc = r->tc;
    const gp_train_opts *opts = r->opts;
    gp_model *mp = r->mp;
    int64_t per_epoch = r->per_epoch = gp_loader_batches_per_epoch(r->loader);
    int64_t total = r->total = gp_train_total_steps(tc, per_epoch);
    warn_lr_jump(r);
    if (r->drop_rest)
        GP_WARN("each epoch's last %lld sample%s (%lld %% %lld) %s fewer than pipeline.chunks "
                "x replicas = %lld: that partial batch is dropped", (long long)r->rest,
                r->rest == 1 ? "" : "s", (long long)r->train.n, (long long)tc->batch_size,
                r->rest == 1 ? "is" : "are", (long long)r->min_batch);
    /* (a warm-up as long as the run reaches the base rate at its last
     * step: a constant schedule then lost nothing) */
    bool decays = tc->sched.kind != GP_SCHED_CONSTANT;
    if (tc->sched.warmup_steps > total && total > 0 && tc->sched.warmup_start < 1)
        GP_WARN("train.schedule.warmup_steps = %lld is more than the run's %lld step%s: the "
                "learning rate never reaches its base rate (%g)%s; lower warmup_steps",
                (long long)tc->sched.warmup_steps, (long long)total, total == 1 ? "" : "s",
                gp_lr_base(tc), decays ? " and the schedule after the warmup never starts" : "");
    else if (tc->sched.warmup_steps == total && total > 0 && decays)
        GP_WARN("train.schedule.warmup_steps = %lld is the run's %lld step%s: the learning rate "
                "reaches its base rate (%g) at the last step, and the schedule after the warmup "
                "never starts; lower warmup_steps", (long long)total, (long long)total,
                total == 1 ? "" : "s", gp_lr_base(tc));
    r->out.progress = opts->progress;
    if (r->out.progress < 0) r->out.progress = isatty(STDERR_FILENO) ? 1 : 0;
    if (opts->quiet) r->out.progress = 0;
    int chunks = cfg->pipeline.chunks, n_dev = r->dev.n;
    const char *dev0 = r->dev.devs[0]->name;
    /* (warnings whether quiet or not: quiet keeps warnings and errors) */
    if (mp->step > total) /* most likely not what was meant */
        GP_WARN("%lld parameters on %s%s: resumed at step %lld, past this run's %lld steps "
                "(train.steps, or train.epochs x %lld per epoch): nothing is trained; raise "
                "train.steps or train.epochs to go on", (long long)gp_model_param_count(mp),
                dev0, n_dev > 1 ? " and more (pipelined)" : "", (long long)mp->step,
                (long long)total, (long long)per_epoch);
    else if (!opts->quiet && mp->step == total) /* resumed at the end: the outputs are left */
        GP_INFO("%lld parameters on %s%s: resumed at step %lld of %lld, nothing left to train",
                (long long)gp_model_param_count(mp), dev0,
                n_dev > 1 ? " and more (pipelined)" : "", (long long)mp->step, (long long)total);
    else if (!opts->quiet) {
        char span[96]; /* "8 steps", or a resumed run's "steps 4 to 8 of 8" */
        if (mp->step > 0)
            snprintf(span, sizeof span, "steps %lld to %lld of %lld", (long long)mp->step + 1,
                     (long long)total, (long long)total);
        else
            snprintf(span, sizeof span, "%lld step%s", (long long)total, total == 1 ? "" : "s");
        /* the math and the storage, where either is not plain FP32 */
        char prec[80] = "";
        bool act16 = gp_config_act_dtype(cfg) == GP_BF16;
        if (tc->precision != GP_PRECISION_FP32 || act16)
            snprintf(prec, sizeof prec, ", precision %s, activations in %s",
                     gp_precision_name(tc->precision), act16 ? "bf16" : "fp32");
        GP_INFO("training %lld parameters on %s%s: %s (%lld per epoch), batch %lld, "
                "%d micro-batch%s%s", (long long)gp_model_param_count(mp), dev0,
                n_dev > 1 ? " and more (pipelined)" : "", span, (long long)per_epoch,
                (long long)tc->batch_size, chunks, chunks == 1 ? "" : "es", prec);
        char isa[256]; /* what a CPU benchmark or bug report must name */
        if (cpu_isa_line(&cfg->pipeline, isa, sizeof isa)) GP_INFO("%s", isa);
    }
    if (!opts->quiet)
        GP_INFO("data: %s, %lld samples; test: %lld samples", r->train.source,
                (long long)r->train.n, (long long)r->test.n);
    warn_other_mnist(cfg, &r->train);
    if (!opts->quiet && cfg->pipeline.replicas > 1)
        GP_INFO("data parallel: %d replicas x %d stage%s; each step's batch of %lld is split "
                "into %d shards of about %lld", cfg->pipeline.replicas, cfg->pipeline.n_devices,
                cfg->pipeline.n_devices == 1 ? "" : "s", (long long)tc->batch_size,
                cfg->pipeline.replicas, (long long)(tc->batch_size / cfg->pipeline.replicas));
}

/* The clocks started, the first step and epoch known, and what the
 * watchdog says is kept when a rank stops answering: no snapshot of that
 * step can be made (the silent rank holds its stages), so the newest one
 * is what a resume takes. */
static void run_begin_steps(train_run *r)
{
    r->t_start = r->window.start = r->saves.last_time = gp_now();
    r->window.first = true;
    /* Resumed at an epoch's first batch: that epoch's evaluation is due. */
    r->first_step = r->mp->step;
    r->last_epoch = r->saves.pos.batch > 0 ? r->saves.pos.epoch : r->saves.pos.epoch - 1;
    if (r->first_step == 0) r->last_epoch = -1;
    r->saves.saved_step = r->saves.written_step = r->first_step;
    r->res->steps = r->first_step;
    if (!r->saves.on)
        gp_procs_watch_note("Snapshots are off, so nothing of this run is saved: set "
                            "train.snapshot.every_steps to keep a run's progress.");
    else if (r->first_step > 0)
        gp_procs_watch_note("Nothing after step %lld is saved: the snapshot this run resumed "
                            "from holds step %lld; go on with %s.", (long long)r->first_step,
                            (long long)r->first_step, gp_opt_name(GP_OPT_RESUME_LATEST));
    else
        gp_procs_watch_note("No snapshot of this run is written yet (train.snapshot in %s), so "
                            "nothing of it is saved.", r->cfg->path);
}

/* A stop asked by a signal, taken between steps: before the first, nothing
 * to save; after it, the final snapshot (stop_between_steps). */
static gp_status stop_if_asked(train_run *r, int64_t step)
{
    int sig = agreed(stop_asked(r->opts));
    if (sig && step == r->first_step) return stop_early(r->opts, "while starting", r->res);
    if (!sig) return GP_OK;
    if (r->out.progress) fputc('\n', stderr);
    return stop_between_steps(r->mp, r->cfg, r->opts, sig, step, r->total, r->saves.saved_step,
                              &r->saves.pos, r->saves.lock, r->res);
}

/* A snapshot written in the background that failed stops the run, as one
 * written in the foreground always has. */
static gp_status background_write_ok(train_run *r)
{
    gp_status s = gp_snapshot_poll(r->saves.lock);
    return s == GP_OK ? GP_OK : name_saved(r->cfg, s, r->saves.written_step);
}

/* The loader's next batch, one a step can split into micro-batches; a
 * batch that cannot be read (on any rank) saves the work and stops. */
static gp_status wait_for_batch(train_run *r, train_step *t)
{
    const gp_config *cfg = r->cfg;
    int64_t step = t->step;
    double t_wait = gp_now();
    gp_status s = gp_loader_next(r->loader, &t->b);
    /* files skipped as bad (data.on_bad_file: skip) can leave a batch
     * too small to split: the next batch takes its place, for an epoch
     * at most (a batch too small for any other reason, or an epoch of
     * them, would make this loop forever) */
    for (int64_t tries = 0; s == GP_OK && t->b.n < r->min_batch; tries++) {
        if (!cfg->data.skip_bad_files || tries >= r->per_epoch) {
            s = gp_error_set(GP_ERR_DATA, "step %lld: a batch of %lld samples cannot be "
                             "split into pipeline.chunks x replicas = %lld micro-batches%s",
                             (long long)step + 1, (long long)t->b.n, (long long)r->min_batch,
                             cfg->data.skip_bad_files
                                 ? ", and neither could the epoch's other batches after "
                                   "skipping bad files: most of the data is bad"
                                 : "; raise train.batch_size or lower pipeline.chunks");
            break;
        }
        GP_WARN("step %lld: a batch of %lld samples after skipping bad files cannot be "
                "split into %lld micro-batches; skipping the batch", (long long)step + 1,
                (long long)t->b.n, (long long)r->min_batch);
        s = gp_loader_next(r->loader, &t->b);
    }
    t->waited = gp_now() - t_wait;
    /* processes: a batch one rank cannot read stops every rank (each
     * saves its part of the final snapshot) */
    if (agreed(s != GP_OK) && s == GP_OK)
        s = gp_error_set(GP_ERR_DATA, "another rank could not read batch %lld (its message "
                         "says why)", (long long)step);
    if (s != GP_OK)
        return data_failure(r->mp, cfg, s, step, r->saves.saved_step, &r->saves.pos,
                            r->saves.lock);
    r->window.wait += t->waited;
    return GP_OK;
}

/* An epoch ended (train.eval_each_epoch): evaluate before the next one's
 * first step, record it, and take a stop asked during the evaluation. */
static gp_status evaluate_if_epoch_ended(train_run *r, const train_step *t)
{
    const gp_train_opts *opts = r->opts;
    gp_train_result *res = r->res;
    int64_t step = t->step;
    bool ended = t->b.epoch != r->last_epoch && r->last_epoch >= 0 && r->tc->eval_each_epoch;
    int64_t epoch = r->last_epoch;
    r->last_epoch = t->b.epoch;
    if (!ended) return GP_OK;
    gp_procs_watch_phase("the evaluation after epoch %lld", (long long)epoch + 1);
    double t0 = gp_now();
    gp_status s = gp_model_evaluate(r->mp, r->cfg, &r->test, &res->test_loss,
                                    &res->test_accuracy);
    if (s != GP_OK)
        return data_failure(r->mp, r->cfg, s, step, r->saves.saved_step, &r->saves.pos,
                            r->saves.lock);
    if (r->out.progress) fputc('\n', stderr);
    warn_eval_not_finite(res->test_loss, res->final_loss, &r->eval_nan_said);
    if (!opts->quiet && r->test.tokens)
        GP_INFO("epoch %lld: validation loss %.4f nats per token (%.4f bits), next-token "
                "accuracy %.2f%%", (long long)epoch + 1, res->test_loss,
                res->test_loss / log(2.0), 100 * res->test_accuracy);
    else if (!opts->quiet)
        GP_INFO("epoch %lld: test loss %.4f, test accuracy %.2f%%", (long long)epoch + 1,
                res->test_loss, 100 * res->test_accuracy);
    if (r->out.metrics || r->out.tb) {
        metrics_eval(&r->out.record, step, epoch + 1, res->test_loss, res->test_accuracy, false);
        s = record_line(&r->out.record, r->out.metrics, opts->metrics_path, r->out.tb, NULL);
        if (s != GP_OK) return s;
    }
    /* samples/s is the steps' rate: the evaluation (minutes on a large test
     * set) is not in the window the next steps close */
    gp_throughput_pause(&r->window, gp_now() - t0);
    /* A stop asked during the evaluation (minutes on a large test set) is
     * taken now, not after one more step.  The batch just read is not
     * trained: the snapshot's position is before it, and a run resumed
     * there evaluates this epoch again. */
    int esig = agreed(stop_asked(opts));
    if (esig && step == r->first_step) /* a resumed run's first evaluation: no step yet */
        return stop_early(opts, "during the evaluation", res);
    if (esig)
        return stop_between_steps(r->mp, r->cfg, opts, esig, step, r->total,
                                  r->saves.saved_step, &r->saves.pos, r->saves.lock, res);
    /* the step's own waits are the step's, not the evaluation's */
    gp_procs_watch_phase("step %lld of %lld", (long long)step + 1, (long long)r->total);
    return GP_OK;
}

/* Before a step: the run's peaks kept (the metrics' are per step, so the
 * allocators' are reset) and the host waits counted from here. */
static void devices_before_step(run_devices *d)
{
    for (int j = 0; j < d->n; j++) {
        gp_allocator a;
        gp_allocator_snapshot(&d->devs[j]->alloc, &a);
        d->peak[j] = a.peak > d->peak[j] ? a.peak : d->peak[j];
        for (int c = 0; c < GP_MEM_COUNT; c++)
            if (a.peak_by[c] > d->peak_by[j][c]) d->peak_by[j][c] = a.peak_by[c];
        gp_allocator_reset_peak(&d->devs[j]->alloc);
        d->counts[j] = (gp_step_counts){(int64_t)gp_dev_host_waits(d->devs[j]),
                                        (int64_t)gp_dev_launches(d->devs[j]),
                                        (int64_t)gp_dev_adapter_bytes(d->devs[j])};
    }
}

/* A step that failed (s): said with its batch, and where it failed before
 * its update (out of memory, a device error, or clipping found the
 * gradients not finite) the model is step `step`'s, worth a snapshot, so
 * the work since the last one is kept.  Under mpirun only the clip
 * refusal: every rank refuses that step alike (they sum the same norms),
 * so all of them save their parts together, where another failing rank
 * ends the others before they could. */
static gp_status step_failed(train_run *r, const train_step *t, gp_status s)
{
    const gp_train_config *tc = r->tc;
    const gp_batch *b = &t->b;
    /* an epoch's partial last batch fails where full ones did not (batch
     * norm with one value per channel in a micro-batch): say it is that
     * batch; one that bad files shrank (any batch of the epoch), which
     * files (under mpirun a file bad on one rank's copy only leaves the
     * ranks' batches different) */
    char part[1600] = "";
    if (b->skipped > 0 && r->train.folder)
        snprintf(part, sizeof part, ", its batch %lld of %lld: %lld samples, %lld fewer "
                 "after skipping %s %s/%s (data.on_bad_file: skip)%s",
                 (long long)b->index + 1, (long long)r->per_epoch, (long long)b->n,
                 (long long)b->skipped,
                 b->skipped == 1 ? "the bad file" : "bad files, the first",
                 gp_image_folder_dir(r->train.folder),
                 gp_image_folder_file(r->train.folder, b->skipped_first),
                 gp_procs_size() > 1 ? "; under mpirun every rank must skip the same "
                                       "files: give every machine the same copy of "
                                       "the data" : "");
    else if (b->n < tc->batch_size)
        snprintf(part, sizeof part, ", its last batch: %lld samples, the %lld of %lld "
                 "training samples that a batch of %lld leaves over",
                 (long long)b->n, (long long)(r->train.n % tc->batch_size),
                 (long long)r->train.n, (long long)tc->batch_size);
    gp_error_wrap(s, "step %lld (epoch %lld%s)", (long long)t->step + 1,
                  (long long)b->epoch + 1, part);
    bool numeric = s == GP_ERR_NUMERIC;
    if (!r->mp->refused || (!numeric && gp_procs_size() > 1)) return s;
    char advice[480];
    if (numeric) {
        char earlier[80];
        snprintf(advice, sizeof advice, "go on with %s once that is changed (as it "
                 "is, this step would fail again), or, where the weights have run "
                 "away already (a learning rate far too large moves them in one "
                 "step), from an earlier snapshot (%s) or from the start",
                 gp_opt_name(GP_OPT_RESUME_LATEST),
                 gp_opt_value(GP_OPT_RESUME, "PATH", earlier, sizeof earlier));
    } else {
        snprintf(advice, sizeof advice, "go on with %s once that is fixed (this "
                 "step's batch comes first)", gp_opt_name(GP_OPT_RESUME_LATEST));
    }
    s = failure_snapshot(r->mp, r->cfg, s, t->step, r->saves.saved_step, &r->saves.pos,
                         r->saves.lock, advice, NULL);
    /* every rank summed the same norms and refused alike (a snapshot that
     * failed may have failed on one rank only) */
    r->res->failed_alike = gp_procs_size() > 1 && s == GP_ERR_NUMERIC;
    return s;
}

/* The step: forward, backward and update on every stage, then what it
 * measured kept, and the loader's place after it (what a stop saves). */
static gp_status take_step(train_run *r, train_step *t)
{
    const gp_train_config *tc = r->tc;
    gp_model *mp = r->mp;
    int64_t step = t->step;
    t->lr = gp_lr_at(tc, step, r->total);
    devices_before_step(&r->dev);
    mp->device_time = r->out.trace && gp_trace_wants(r->out.trace, step); /* timelines */
    /* test hook (tests/test_snapshot.c): GPIPE_TEST_FAIL_STEP=N fails step
     * N (0-based) in stage 0's first forward, as a device error there
     * would */
    if (r->fail_step >= 0 && step == r->fail_step && mp->n_replicas <= 1 && mp->n_stages > 1)
        mp->fail_next = true;
    gp_status s = gp_model_pipeline_step(mp, r->cfg, t->b.x, t->b.y, t->b.n, t->lr, &t->st);
    /* processes: only this rank's device is counted here */
    for (int j = 0; j < r->dev.n; j++) {
        gp_step_counts *c = &r->dev.counts[j];
        gp_device *dj = r->dev.devs[j];
        if (mp->local_device >= 0 && j != mp->local_device) {
            *c = (gp_step_counts){-1, -1, -1};
            continue;
        }
        *c = (gp_step_counts){(int64_t)gp_dev_host_waits(dj) - c->host_waits,
                              (int64_t)gp_dev_launches(dj) - c->launches,
                              (int64_t)gp_dev_adapter_bytes(dj) - c->adapter_bytes};
    }
    if (s != GP_OK) return step_failed(r, t, s);
    gp_train_result *res = r->res;
    res->final_loss = t->st.loss;
    res->final_accuracy = t->st.accuracy;
    res->final_lr = t->lr;
    res->final_seconds = t->st.seconds;
    res->final_grad_norm = t->st.grad_norm;
    if (t->st.n_devices > 1 && step > r->first_step) { /* (the run's first step warms up) */
        for (int d = 0; d < t->st.n_devices; d++) r->bub_busy += t->st.busy[d];
        r->bub_window += (double)t->st.n_devices * t->st.window;
        r->bub_steps++;
    }
    t->st.data_wait_seconds = t->waited;
    t->st.bad_files = r->cfg->data.skip_bad_files ? gp_loader_bad_files(r->loader) : -1;
    /* Between steps, the pipeline drained: the loader's next batch is the
     * one after b. */
    gp_snapshot_pos *pos = &r->saves.pos;
    *pos = (gp_snapshot_pos){.step = step + 1, .epoch = t->b.epoch, .batch = t->b.index + 1,
                             .batch_size = tc->batch_size, .total = r->total};
    if (pos->batch >= r->per_epoch) {
        pos->epoch++;
        pos->batch = 0;
    }
    return GP_OK;
}

/* The step's timeline (--trace, the steps it wants): every replica's
 * devices, this process's one under mpirun, all of them in one process. */
static gp_status trace_step(train_run *r, train_step *t)
{
    gp_model *mp = r->mp;
    int64_t step = t->step;
    if (r->out.trace && gp_trace_wants(r->out.trace, step)) {
        int R = gp_pipeline_replicas(&r->cfg->pipeline);
        int rho = mp->proc_replicas > 1 ? gp_procs_rank() / mp->n_devices : 0;
        gp_status s = gp_trace_add_step(r->out.trace, mp->pipe, mp->devs, step, rho, R);
        for (int q = 1; q < mp->n_replicas && s == GP_OK; q++)
            s = gp_trace_add_step(r->out.trace, mp->replicas[q - 1].pipe,
                                  mp->replicas[q - 1].devs, step, q, R);
        /* a full disk or a file-size limit: the step's work is saved as
         * the metrics file's failure saves it (processes: the rank that
         * failed ends every rank, so none saves) */
        if (s != GP_OK && gp_procs_size() == 1) {
            char advice[240];
            snprintf(advice, sizeof advice, "make room for the trace (or give %s another "
                     "path, or leave it out) and go on with %s", gp_opt_name(GP_OPT_TRACE),
                     gp_opt_name(GP_OPT_RESUME_LATEST));
            s = failure_snapshot(mp, r->cfg, s, step + 1, r->saves.saved_step, &r->saves.pos,
                                 r->saves.lock, advice, NULL);
        } else if (s != GP_OK) {
            gp_error_wrap(s, "step %lld", (long long)step + 1);
        }
        if (s != GP_OK) return s;
        r->out.traced++;
    }
    if (r->run_first < 0) r->run_first = step;
    r->run_last = step;
    return GP_OK;
}

/* The step's samples into the throughput (gp_throughput_add). */
static void count_throughput(train_run *r, train_step *t)
{
    t->now = gp_now();
    gp_throughput_add(&r->window, t->b.n, t->now, t->step == r->first_step,
                      t->step == r->total - 1);
}

/* The step's --metrics record and TensorBoard scalars.  A full disk or a
 * file-size limit saves the step's work as a failure's is (processes:
 * rank 0 alone writes them, and its failure ends every rank). */
static gp_status record_step(train_run *r, const train_step *t)
{
    run_outputs *o = &r->out;
    if (!o->metrics && !o->tb) return GP_OK;
    gp_train_metrics_step(&o->record, t->step + 1, t->b.epoch + 1, t->lr, r->window.sps, &t->st,
                          r->cfg->pipeline.replicas > 1, r->dev.devs, r->dev.n, r->dev.counts);
    bool tb_failed = false;
    gp_status s = record_line(&o->record, o->metrics, r->opts->metrics_path, o->tb, &tb_failed);
    if (s != GP_OK && gp_procs_size() == 1) {
        char advice[200];
        snprintf(advice, sizeof advice, "make room for the %s (or give %s "
                 "another path) and go on with %s",
                 tb_failed ? "TensorBoard event file" : "metrics file",
                 tb_failed ? o->tb_what : gp_opt_name(GP_OPT_METRICS),
                 gp_opt_name(GP_OPT_RESUME_LATEST));
        /* the snapshot keeps the step's record, which the resumed run
         * writes (metrics_resume) */
        r->saves.pos.metrics = o->record.text;
        s = failure_snapshot(r->mp, r->cfg, s, t->step + 1, r->saves.saved_step, &r->saves.pos,
                             r->saves.lock, advice, NULL);
        r->saves.pos.metrics = NULL;
    }
    return s;
}

/* A snapshot when one is due: every_steps, every_minutes (agreed between
 * the ranks), or the last step with either set.  It is copied off the
 * devices now and written in the background, after the one before is on
 * disk (at most one write in flight). */
static gp_status snapshot_if_due(train_run *r, const train_step *t)
{
    const gp_snapshot_config *snc = &r->tc->snapshot;
    run_saves *sv = &r->saves;
    int64_t step = t->step;
    bool minutes_due = snc->every_minutes > 0 &&
                       agreed(t->now - sv->last_time >= 60.0 * snc->every_minutes);
    if (!((snc->every_steps > 0 && (step + 1) % snc->every_steps == 0) || minutes_due ||
          ((snc->every_steps > 0 || snc->every_minutes > 0) && step == r->total - 1)))
        return GP_OK;
    gp_procs_watch_phase("the snapshot of step %lld", (long long)step + 1);
    gp_status s = gp_snapshot_wait(sv->lock, false); /* the one before: on disk, or failed */
    if (s == GP_OK) sv->written_step = sv->saved_step;
    if (s == GP_OK) s = gp_snapshot_save_async(r->mp, r->cfg, &sv->pos, sv->lock);
    if (s != GP_OK) return name_saved(r->cfg, s, sv->written_step);
    sv->last_time = gp_now();
    sv->saved_step = step + 1;
    char sp[1100];
    gp_snapshot_path(snc->dir, sv->saved_step, sp, sizeof sp);
    gp_procs_watch_note("Nothing after step %lld is saved: snapshot %s holds step %lld; "
                        "go on with %s.", (long long)sv->saved_step, sp,
                        (long long)sv->saved_step, gp_opt_name(GP_OPT_RESUME_LATEST));
    return GP_OK;
}

/* The progress bar on a terminal, or a log line every train.log_every
 * steps (and the last) otherwise. */
static void report_progress(const train_run *r, const train_step *t)
{
    const gp_train_config *tc = r->tc;
    const gp_step_stats *st = &t->st;
    int64_t step = t->step, total = r->total;
    double wait_share = r->window.wait_share;
    double elapsed = t->now - r->t_start;
    double eta = elapsed / (double)(step + 1 - r->first_step) * (double)(total - step - 1);
    char e1[32], e2[32];
    if (r->out.progress) {
        fmt_duration(elapsed, e1, sizeof e1);
        fmt_duration(eta, e2, sizeof e2);
        /* a loader that falls behind shows, as the share of the time spent
         * waiting for batches */
        char wb[48] = "";
        if (wait_share >= 0.05)
            snprintf(wb, sizeof wb, "  waiting for data %.0f%%", 100 * wait_share);
        fprintf(stderr, "\r\033[Kepoch %lld step %lld/%lld  loss %.4f  acc %5.1f%%  "
                        "lr %.4g  %.0f samples/s%s  %s elapsed, ETA %s",
                (long long)t->b.epoch + 1, (long long)step + 1, (long long)total, st->loss,
                100 * st->accuracy, t->lr, r->window.sps, wb, e1, e2);
        fflush(stderr);
    } else if (!r->opts->quiet && tc->log_every > 0 &&
               ((step + 1) % tc->log_every == 0 || step == total - 1)) {
        fmt_duration(eta, e2, sizeof e2);
        char gn[48] = "";
        if (isfinite(st->grad_norm)) /* train.clip_grad_norm: before clipping */
            snprintf(gn, sizeof gn, " grad norm %.3g%s", st->grad_norm,
                     st->grad_norm > tc->clip_grad_norm ? " (clipped)" : "");
        GP_INFO("epoch %lld step %lld/%lld loss %.4f acc %.1f%% lr %.4g%s %.0f samples/s%s "
                "ETA %s", (long long)t->b.epoch + 1, (long long)step + 1, (long long)total,
                st->loss, 100 * st->accuracy, t->lr, gn, r->window.sps,
                wait_share >= 0.05 ? " (waiting for data)" : "", e2);
    }
}

/* --export-weights after the last step; *converted: the run trained
 * nothing (resumed at its end), so the export was all it did. */
static gp_status export_weights(train_run *r, bool *converted)
{
    const gp_train_opts *opts = r->opts;
    *converted = false;
    if (!opts->export_path) return GP_OK;
    gp_status s = gp_gpt_export(r->mp, r->cfg, opts->export_path,
                                (gp_weights_format)opts->export_format);
    if (s != GP_OK)
        return export_failed(r->cfg, opts, s, r->mp->step, r->saves.saved_step,
                             r->res->steps > r->first_step);
    if (!opts->quiet)
        GP_INFO("weights after step %lld written to %s", (long long)r->mp->step,
                opts->export_path);
    *converted = r->res->steps == r->first_step; /* nothing trained: a conversion */
    return GP_OK;
}

/* A stop asked after the last step: every step ran (and the last
 * snapshot, and the export, are written): only the final evaluation is
 * left out. */
static gp_status stop_after_last_step(train_run *r)
{
    int late = agreed(stop_asked(r->opts));
    if (!late || r->res->steps <= r->first_step) return GP_OK;
    char b[32];
    r->res->stop_signal = late;
    return gp_error_set(GP_ERR_STOPPED, "stopped by %s after the last step (%lld): the run is "
                        "complete%s, only the final evaluation was skipped",
                        signal_name(late, b, sizeof b), (long long)r->res->steps,
                        r->saves.on ? " and its last snapshot written" : "");
}

/* The final evaluation (the last epoch's, or a steps-limited run's), said
 * and recorded. */
static gp_status final_evaluation(train_run *r)
{
    gp_train_result *res = r->res;
    gp_procs_watch_phase("the final evaluation");
    gp_status s = gp_model_evaluate(r->mp, r->cfg, &r->test, &res->test_loss,
                                    &res->test_accuracy);
    if (s != GP_OK) /* as an epoch's: where it stopped, what holds it, what to do */
        return data_failure(r->mp, r->cfg, s, r->mp->step, r->saves.saved_step, &r->saves.pos,
                            r->saves.lock);
    warn_eval_not_finite(res->test_loss, res->final_loss, &r->eval_nan_said);
    if (!r->opts->quiet && r->test.tokens) /* a language model: per token, in its units */
        GP_INFO("final: validation loss %.4f nats per token (%.4f bits), next-token accuracy "
                "%.2f%% after %lld step%s", res->test_loss, res->test_loss / log(2.0),
                100 * res->test_accuracy, (long long)res->steps, res->steps == 1 ? "" : "s");
    else if (!r->opts->quiet)
        GP_INFO("final: test loss %.4f, test accuracy %.2f%% after %lld step%s",
                res->test_loss, 100 * res->test_accuracy, (long long)res->steps,
                res->steps == 1 ? "" : "s");
    if (r->out.metrics || r->out.tb) {
        metrics_eval(&r->out.record, res->steps, r->last_epoch + 1, res->test_loss,
                     res->test_accuracy, true);
        s = record_line(&r->out.record, r->out.metrics, r->opts->metrics_path, r->out.tb, NULL);
    }
    return s;
}

/* Each device's peak memory over the run, evaluation included, into
 * res->peak_bytes and said (processes: device j's numbers are rank j's). */
static void report_peaks(train_run *r)
{
    run_devices *d = &r->dev;
    for (int j = 0; j < d->n; j++) {
        gp_allocator a;
        gp_allocator_snapshot(&d->devs[j]->alloc, &a);
        if (d->peak[j] > a.peak) a.peak = d->peak[j];
        for (int c = 0; c < GP_MEM_COUNT; c++)
            if (d->peak_by[j][c] > a.peak_by[c]) a.peak_by[c] = d->peak_by[j][c];
        if (r->mp->local_device >= 0) { /* processes: device j's numbers are rank j's */
            size_t v[1 + GP_MEM_COUNT];
            v[0] = a.peak;
            memcpy(v + 1, a.peak_by, sizeof a.peak_by);
            if (gp_procs_bcast(v, sizeof v, j) != GP_OK) gp_procs_abort(1);
            a.peak = v[0];
            memcpy(a.peak_by, v + 1, sizeof a.peak_by);
        }
        if (a.peak > r->res->peak_bytes) r->res->peak_bytes = a.peak;
        if (!r->opts->quiet) {
            char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
            /* each category's own peak, not the parts of the total's
             * moment; evaluation's batches count too */
            GP_INFO("%s peak memory %s over the run, evaluation included; each kind's own "
                    "peak: parameters %s, gradients %s, optimizer %s, activations %s, copies "
                    "%s, workspace %s", d->devs[j]->name,
                    gp_format_bytes(a.peak, b1, sizeof b1),
                    gp_format_bytes(a.peak_by[GP_MEM_PARAMS], b2, sizeof b2),
                    gp_format_bytes(a.peak_by[GP_MEM_GRADS], b3, sizeof b3),
                    gp_format_bytes(a.peak_by[GP_MEM_OPTIMIZER], b4, sizeof b4),
                    gp_format_bytes(a.peak_by[GP_MEM_ACTIVATIONS], b5, sizeof b5),
                    gp_format_bytes(a.peak_by[GP_MEM_COPIES], b6, sizeof b6),
                    gp_format_bytes(a.peak_by[GP_MEM_WORKSPACE], b7, sizeof b7));
        }
    }
}

/* A simulated throughput at least this many times the run's own is worth
 * a line at the run's end (suggest_setup). */
#define GP_SUGGEST_RATIO 1.15

/* Where another schedule or checkpoint mode simulates much faster than the
 * run's own at its micro-batches, say so at the run's end: the shipped
 * tiny configs ran 1.4x and big-mlp 1.9x slower than what gpipe-balance
 * --simulate ranked first, and nothing told their users.  From the profile
 * the run cached (of this micro-batch size: the count stays the run's),
 * every checkpoint mode of the schedules that keep one stage per device on
 * this split (gpipe, 1f1b, zb-h1) and of those that place two on each
 * (interleaved, zb-v, dualpipe-v) on the split balance: auto gives them,
 * each under its default lockstep unless the config wrote one, counting
 * only setups whose peaks fit every device's memory.  A hint, not a plan:
 * gpipe-balance --simulate also weighs other micro-batch counts. */
typedef struct suggestion {
    gp_sim_result sim;
    int balance[GP_MAX_DEVICES]; /* n v entries (v: sim.v, which the simulator sets) */
} suggestion;

static const gp_checkpoint_mode k_modes[] = {GP_CKPT_ALWAYS, GP_CKPT_EXCEPT_LAST, GP_CKPT_NEVER};

/* Schedule k with checkpoint mode `mode` on split bal into *best where it
 * is faster and fits. */
static void suggest_one(const gp_profile *prof, const gp_pipeline_config *pc, gp_schedule_kind k,
                        int n, int v, const int *bal, gp_checkpoint_mode mode,
                        const double *capacity, suggestion *best)
{
    gp_sim_result a;
    if (gp_simulate_schedule(prof, k, n, v, bal, pc->chunks, mode, gp_config_lockstep_for(pc, k),
                             capacity, &a) == GP_OK &&
        a.fits && a.throughput > best->sim.throughput) {
        best->sim = a;
        memcpy(best->balance, bal, (size_t)(n * v) * sizeof *bal);
    }
    gp_error_clear();
}

/* Each checkpoint mode of schedule k on split bal (v stages a device) into
 * *best where it fits and is faster. */
static void suggest_try(const gp_profile *prof, const gp_pipeline_config *pc, gp_schedule_kind k,
                        int n, int v, const int *bal, const double *capacity, suggestion *best)
{
    for (int c = 0; c < 3; c++) suggest_one(prof, pc, k, n, v, bal, k_modes[c], capacity, best);
}

/* The two-stages-a-device placements into *best: interleaved (v = 2, where
 * the micro-batches are a multiple of n), zb-v and dualpipe-v (where there
 * are at least 2n micro-batches), each on the split balance: auto gives it
 * under each checkpoint mode (the split named beside the mode is the one
 * a run of it makes). */
static void suggest_two_a_device(const gp_config *cfg, const gp_profile *prof, int n,
                                 const double *capacity, suggestion *best)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    if (2 * n > GP_MAX_DEVICES || 2 * n > prof->L) return;
    static const gp_schedule_kind kinds[] = {GP_SCHEDULE_INTERLEAVED, GP_SCHEDULE_ZB_V,
                                             GP_SCHEDULE_DUALPIPE_V};
    for (int q = 0; q < 3; q++) {
        if (kinds[q] == GP_SCHEDULE_INTERLEAVED && pc->chunks % n) continue;
        if (kinds[q] == GP_SCHEDULE_DUALPIPE_V && pc->chunks < 2 * n) continue;
        for (int c = 0; c < 3; c++) {
            int bal[GP_MAX_DEVICES];
            if (gp_model_plan_placement(cfg, prof, kinds[q], 2, k_modes[c], bal) != GP_OK) {
                gp_error_clear();
                continue;
            }
            suggest_one(prof, pc, kinds[q], n, 2, bal, k_modes[c], capacity, best);
        }
    }
}

/* The gpipe-balance to name in advice: the one beside this program where
 * there is one (a checkout's build/, said relative to the working directory
 * when it is under it), else by name (installed, on PATH). */
static const char *balance_tool(char *buf, size_t len)
{
    char exe[PATH_MAX], cwd[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    snprintf(buf, len, "gpipe-balance");
    if (k <= 0) return buf;
    exe[k] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return buf;
    *slash = '\0';
    char tool[PATH_MAX + 16];
    snprintf(tool, sizeof tool, "%s/gpipe-balance", exe);
    if (access(tool, X_OK) != 0) return buf;
    size_t n = getcwd(cwd, sizeof cwd) ? strlen(cwd) : 0;
    const char *path = getenv("PATH");
    char on_path[PATH_MAX + 2];
    snprintf(on_path, sizeof on_path, ":%s:", exe);
    char paths[8192];
    snprintf(paths, sizeof paths, ":%s:", path ? path : "");
    if (strstr(paths, on_path)) return buf; /* installed: by name */
    if (n && !strncmp(exe, cwd, n) && exe[n] == '/')
        snprintf(buf, len, "%s/gpipe-balance", exe + n + 1);
    else
        snprintf(buf, len, "%s", tool);
    return buf;
}

/* Whether the run's config is a file a command can name (gp_run_parse's
 * YAML text is not: its path is a name). */
static bool config_is_file(const gp_config *cfg)
{
    struct stat st;
    return stat(cfg->path, &st) == 0 && S_ISREG(st.st_mode);
}

/* After a command balance_command made: where the config is no file, what
 * CONFIG.yaml stands for ("" otherwise). */
static const char *config_note(const gp_config *cfg, char *buf, size_t len)
{
    if (config_is_file(cfg)) return "";
    bool named = cfg->path[0] && cfg->path[0] != '<'; /* (gp_run_parse's "<yaml>": none) */
    snprintf(buf, len, " (CONFIG.yaml: this run's YAML%s%.200s%s, saved to a file)",
             named ? " '" : "", named ? cfg->path : "", named ? "'" : "");
    return buf;
}

/* "gpipe-balance CONFIG --set K=V ..." for advice: the config with the run's
 * own overrides, so that it names the model and the devices the run had
 * (it named the config alone: a run on 2 devices set by --set was advised
 * a command that balanced 1). */
static const char *balance_command(const gp_config *cfg, char *buf, size_t len)
{
    /* a command to run whoever trains (gpipe-train, or a library caller):
     * gpipe-balance's own flags, each word quoted for a shell */
    char tool[PATH_MAX + 16], tq[PATH_MAX + 64], pq[PATH_MAX + 64];
    /* a config given as YAML text (gp_run_parse) has no file to name: the
     * command takes one, and says so */
    bool file = config_is_file(cfg);
    size_t off = (size_t)snprintf(buf, len, "%s %s",
                                  gp_shell_word(balance_tool(tool, sizeof tool), tq, sizeof tq),
                                  file ? gp_shell_word(cfg->path, pq, sizeof pq)
                                       : "CONFIG.yaml");
    for (const char *o = cfg->overrides; o && *o && off < len;) {
        const char *e = strchr(o, '\n');
        size_t l = e ? (size_t)(e - o) : strlen(o);
        char one[1024], q[1200];
        snprintf(one, sizeof one, "%.*s", (int)(l < sizeof one ? l : sizeof one - 1), o);
        if (one[0])
            off += (size_t)snprintf(buf + off, len - off, " --set %s",
                                    gp_shell_word(one, q, sizeof q));
        o = e ? e + 1 : o + l;
    }
    return buf;
}

static void suggest_setup(const train_run *r, const gp_profile *prof, const gp_sim_result *own)
{
    const gp_config *cfg = r->cfg;
    const gp_pipeline_config *pc = &cfg->pipeline;
    const gp_model *m = r->mp;
    bool loops = pc->schedule == GP_SCHEDULE_GPIPE || pc->schedule == GP_SCHEDULE_1F1B ||
                 pc->schedule == GP_SCHEDULE_ZB_H1;
    int n = m->n_devices;
    if (!loops || n < 2 || m->n_stages != n || !(own->throughput > 0)) return;
    gp_plan_opts po;
    gp_model_plan_opts(cfg, m->n_stages, &po);
    static const gp_schedule_kind kinds[] = {GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B,
                                             GP_SCHEDULE_ZB_H1};
    suggestion best = {.sim.throughput = 0};
    for (int k = 0; k < 3; k++)
        suggest_try(prof, pc, kinds[k], n, 1, m->balance, po.capacity, &best);
    suggest_two_a_device(cfg, prof, n, po.capacity, &best);
    const gp_sim_result *b = &best.sim;
    if (!(b->throughput >= GP_SUGGEST_RATIO * own->throughput)) return;
    /* the profile marks the layers the config's keep list keeps, so a
     * checkpointing mode was simulated keeping them: say so */
    char keep[320] = "";
    if (pc->checkpoint_keep && b->checkpoint != GP_CKPT_NEVER) {
        char ks[256];
        gp_ckpt_keep_str(pc->checkpoint_keep, ks, sizeof ks);
        snprintf(keep, sizeof keep, " (keeping [%s], as pipeline.checkpoint.keep says)", ks);
    }
    char split[512] = "the same split";
    if (b->v > 1) {
        int off = snprintf(split, sizeof split, "%d stages, 2 a device, split [", 2 * n);
        for (int j = 0; j < 2 * n; j++)
            off += snprintf(split + off, sizeof split - (size_t)off, "%s%d", j ? ", " : "",
                            best.balance[j]);
        snprintf(split + off, sizeof split - (size_t)off, "] (balance: auto's for it)");
    }
    char cmd[4096], note[300];
    GP_INFO("the simulator, from this run's profile, puts schedule %s with checkpoint %s%s at "
            "%.2fx this run's throughput on %s and %d micro-batches (a step of %.1f ms against "
            "%.1f); `%s --simulate`%s compares every schedule, checkpoint mode and micro-batch "
            "count, and its --write writes the config",
            gp_schedule_kind_name(b->schedule), gp_checkpoint_mode_name(b->checkpoint), keep,
            b->throughput / own->throughput, split, pc->chunks, 1e3 * b->step, 1e3 * own->step,
            balance_command(cfg, cmd, sizeof cmd), config_note(cfg, note, sizeof note));
}

/* report_bubble's lines: the measured bubble beside the simulated one, and
 * a faster setup where the simulator finds one. */
static void print_bubble(const train_run *r, const gp_profile *prof, const gp_sim_result *sim)
{
    const gp_config *cfg = r->cfg;
    const gp_train_result *res = r->res;
    char sched[1100];
    if (cfg->pipeline.schedule == GP_SCHEDULE_FILE || cfg->pipeline.schedule == GP_SCHEDULE_FILE_V)
        snprintf(sched, sizeof sched, "file %s", cfg->pipeline.schedule_path);
    else
        snprintf(sched, sizeof sched, "%s", gp_schedule_kind_name(cfg->pipeline.schedule));
    int m = cfg->pipeline.chunks;
    if (isfinite(res->bubble_simulated))
        GP_INFO("pipeline bubble %.1f%% over %lld step%s (schedule %s, %d micro-batch%s); the "
                "simulator's for this split, from the cached profile: %.1f%%",
                100 * res->bubble, (long long)r->bub_steps, r->bub_steps == 1 ? "" : "s", sched,
                m, m == 1 ? "" : "es", 100 * res->bubble_simulated);
    else
        GP_INFO("pipeline bubble %.1f%% over %lld step%s (schedule %s, %d micro-batch%s); no "
                "profile of this model is cached to simulate it (a run with balance: auto "
                "keeps one; gpipe-balance --simulate simulates every schedule)",
                100 * res->bubble, (long long)r->bub_steps, r->bub_steps == 1 ? "" : "s", sched,
                m, m == 1 ? "" : "es");
    if (isfinite(res->bubble_simulated)) suggest_setup(r, prof, sim);
}

/* The run's measured bubble, and the simulator's for the same schedule,
 * split and micro-batches where a profile of this model is cached
 * (issue 78: what the plan promised beside what the run got). */
static void report_bubble(train_run *r)
{
    gp_train_result *res = r->res;
    res->bubble = res->bubble_simulated = NAN;
    if (r->bub_steps < 1 || r->bub_window <= 0) return;
    res->bubble = 1.0 - r->bub_busy / r->bub_window;
    const gp_config *cfg = r->cfg;
    const gp_model *m = r->mp;
    gp_profile prof = {0};
    bool found = false;
    gp_sim_result sim = {.throughput = 0};
    if (gp_model_profile_cached(cfg, &prof, &found) == GP_OK && found &&
        gp_simulate_schedule_file(&prof, cfg->pipeline.schedule, m->n_devices,
                                  m->n_stages / m->n_devices, cfg->pipeline.schedule_file,
                                  m->balance, cfg->pipeline.chunks, cfg->pipeline.checkpoint,
                                  cfg->pipeline.lockstep, NULL, &sim) == GP_OK)
        res->bubble_simulated = sim.bubble;
    gp_error_clear();
    if (!r->opts->quiet) print_bubble(r, &prof, &sim);
    if (found) gp_profile_free(&prof);
}

/* After the last step: its snapshot on disk, the export, a stop asked
 * meanwhile, the final evaluation and the memory report. */
static gp_status run_finish(train_run *r)
{
    if (r->out.progress && r->res->steps > r->first_step) fputc('\n', stderr);
    gp_status s = gp_snapshot_wait(r->saves.lock, false); /* the last one written */
    if (s != GP_OK) return name_saved(r->cfg, s, r->saves.written_step);
    bool converted;
    s = export_weights(r, &converted);
    if (s != GP_OK || converted) return s;
    if ((s = stop_after_last_step(r)) != GP_OK) return s;
    if ((s = final_evaluation(r)) != GP_OK) return s;
    /* a stop asked during the final evaluation: the run is done (the tool
     * said "stopping after the current step", and nothing after it did) */
    char sb[32];
    int late = stop_asked(r->opts);
    if (late && !r->opts->quiet)
        GP_INFO("%s came during the final evaluation, after the last step: the run is complete",
                signal_name(late, sb, sizeof sb));
    r->res->seconds = gp_now() - r->t_start;
    report_peaks(r);
    report_bubble(r);
    return GP_OK;
}

/* A trace that holds no step (--trace-steps outside the steps taken):
 * said, since the file is written and reads as empty. */
static void warn_trace_empty(const train_run *r)
{
    const gp_train_opts *opts = r->opts;
    char range[64];
    if (opts->trace_last < 0)
        snprintf(range, sizeof range, "%lld:", (long long)opts->trace_first);
    else
        snprintf(range, sizeof range, "%lld:%lld", (long long)opts->trace_first,
                 (long long)opts->trace_last);
    char tp[1100], steps_at[128];
    GP_WARN("%s holds no step: %s (0-based) is outside the steps this run took, "
            "%lld:%lld", gp_opt_value(GP_OPT_TRACE, opts->trace_path, tp, sizeof tp),
            gp_opt_value(GP_OPT_TRACE_STEPS, range, steps_at, sizeof steps_at),
            (long long)r->run_first, (long long)r->run_last);
}

/* Everything the run opened closed (the model and its devices handed to
 * the caller instead where it keeps them); the run's status, s, or the
 * first failure closing the outputs. */
static gp_status run_close(train_run *r, gp_status s)
{
    const gp_train_opts *opts = r->opts;
    gp_model *mp = r->mp;
    /* the run's error, kept: closing the trace or the metrics below may
     * set a message of its own, which must not replace the cause */
    char *cause = s != GP_OK ? strdup(gp_error_message()) : NULL;
    if (r->out.trace) {
        gp_status ts = gp_trace_close(r->out.trace);
        if (s == GP_OK) s = ts;
        if (s == GP_OK && r->out.traced == 0 && r->run_first >= 0) warn_trace_empty(r);
    }
    gp_status tbs = gp_tboard_close(r->out.tb);
    if (s == GP_OK) s = tbs;
    if (r->out.metrics && fclose(r->out.metrics) != 0 && s == GP_OK)
        s = gp_error_set(GP_ERR_IO, "writing metrics file '%s' failed", opts->metrics_path);
    gp_json_writer_free(&r->out.record);
    gp_loader_destroy(r->loader);
    if (opts->keep_model && opts->keep_devs && mp->layers && r->dev.n > 0 &&
        (s == GP_OK || (s == GP_ERR_STOPPED && r->res->steps > 0))) {
        /* kept by the caller (the library's run goes on with what it
         * trained), with its devices; untraced from here */
        mp->device_time = false;
        memcpy(opts->keep_devs, r->dev.devs, (size_t)r->dev.n * sizeof *r->dev.devs);
        memset(r->dev.devs, 0, sizeof r->dev.devs);
    } else {
        gp_model_free(mp);
    }
    close_devices(r->dev.devs, r->dev.n);
    gp_dataset_free(&r->train);
    gp_dataset_free(&r->test);
    gp_snapshot_lock_release(r->saves.lock);
    if (cause && strcmp(cause, gp_error_message())) gp_error_set(s, "%s", cause);
    free(cause);
    return s;
}

gp_status gp_train_run(const gp_config *cfg, const gp_train_opts *opts, gp_train_result *res)
{
    gp_train_opts defo = {.progress = -1};
    train_run r;
    run_init(&r, cfg, opts ? opts : &defo, res);
    gp_status s = run_check_outputs(&r);
    if (s != GP_OK) return s; /* (nothing opened yet) */
    s = run_open_outputs(&r);
    if (s == GP_OK) s = run_load_data(&r);
    if (s == GP_OK) s = run_place_model(&r);
    if (s == GP_OK) s = run_start_loader(&r);
    if (s == GP_OK) {
        run_plan(&r);
        run_begin_steps(&r);
    }
    for (int64_t step = r.first_step; s == GP_OK && step < r.total; step++) {
        gp_procs_watch_phase("step %lld of %lld", (long long)step + 1, (long long)r.total);
        train_step t = {.step = step};
        s = stop_if_asked(&r, step);
        if (s == GP_OK) s = background_write_ok(&r);
        if (s == GP_OK) s = wait_for_batch(&r, &t);
        if (s == GP_OK) s = evaluate_if_epoch_ended(&r, &t);
        if (s == GP_OK) s = take_step(&r, &t);
        if (s == GP_OK) s = trace_step(&r, &t);
        if (s == GP_OK) {
            count_throughput(&r, &t);
            s = record_step(&r, &t);
        }
        if (s == GP_OK) s = snapshot_if_due(&r, &t);
        if (s == GP_OK) {
            report_progress(&r, &t);
            res->steps = step + 1;
        }
    }
    if (s == GP_OK) s = run_finish(&r);
    return run_close(&r, s);
}

gp_status gp_train_convert(const gp_config *cfg, const gp_train_opts *opts)
{
    if (!opts->resume_path || !opts->export_path)
        return gp_error_set(GP_ERR_INVALID, "a conversion reads a snapshot (%s) and writes "
                            "its weights (%s): give both", gp_opt_name(GP_OPT_RESUME),
                            gp_opt_name(GP_OPT_EXPORT));
    char path[4200];
    snprintf(path, sizeof path, "%s", opts->resume_path);
    if (!strcmp(path, "latest")) {
        GP_TRY(gp_snapshot_resume_check(path, cfg->train.snapshot.dir));
        GP_TRY(gp_snapshot_latest(cfg->train.snapshot.dir, path, sizeof path));
    }
    gp_train_opts o = *opts;
    o.resume_path = path;
    GP_TRY(check_export_path(cfg, &o));
    GP_TRY(check_outputs_spare_inputs(cfg, &o, NULL, NULL));
    /* The model is built on one CPU device to hold its weights alone (no
     * gradients, no optimizer state: an export writes the weights), and
     * checked against the machine's memory first, as a run's start-up is
     * (issue 77: a model that could not fit grew the process for ever,
     * silent, until it was killed). */
    int64_t params;
    gp_shape output;
    GP_TRY(gp_model_describe(cfg, &params, &output));
    bool limited;
    uint64_t ram = host_memory(&limited);
    /* the model's weights, and the snapshot read whole beside them (an
     * Adam snapshot is 12 bytes a parameter) */
    struct stat sst;
    uint64_t snap = stat(path, &sst) == 0 ? (uint64_t)sst.st_size : 0;
    uint64_t need = (uint64_t)params * 4 + snap;
    if (ram && need > ram) {
        char nb[32], sb[32], hw[200];
        gp_format_bytes((size_t)need, nb, sizeof nb);
        gp_format_bytes((size_t)snap, sb, sizeof sb);
        return gp_error_set(GP_ERR_OOM, "%s: --convert holds the model's %lld parameters on one "
                            "CPU device and reads the snapshot (%s) beside them, %s in all, more "
                            "than %sconvert on a machine with more memory", cfg->path,
                            (long long)params, sb, nb, host_words(ram, limited, hw, sizeof hw));
    }
    gp_device *dev = NULL;
    gp_device_opts dopts = {.threads = 0};
    GP_TRY(gp_device_open("cpu:0", &dopts, &dev));
    gp_model m = {0};
    gp_model_build_loads(true); /* the snapshot's weights replace every one */
    bool was = gp_model_build_inference(true);
    gp_status s = gp_model_build(cfg, dev, &m);
    gp_model_build_inference(was);
    gp_model_build_loads(false);
    gp_snapshot_pos pos = {0};
    gp_wmodel wv = gp_model_weights(&m);
    if (s == GP_OK) s = gp_gpt_export_check(&wv, (gp_weights_format)o.export_format, false);
    if (s == GP_OK) s = gp_snapshot_restore(&m, cfg, path, o.quiet, &pos, NULL);
    if (s == GP_OK) s = gp_gpt_export(&m, cfg, o.export_path, (gp_weights_format)o.export_format);
    if (s == GP_OK && !o.quiet)
        GP_INFO("the weights of %s (step %lld) written to %s; nothing trained", path,
                (long long)m.step, o.export_path);
    if (m.layers) gp_model_free(&m);
    gp_device_close(dev);
    return s;
}

/* The devices a summary asks about layouts and workspaces: each of the
 * pipeline's first n opened as a run opens it (nothing is allocated on
 * it), or NULL where it cannot be opened here (a cuda:N on a machine
 * without that GPU), with a note saying what the summary leaves out. */
static void summary_devices(const gp_config *cfg, gp_device **devs, FILE *f)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    char names[512] = "", why[512] = "", planned[512] = "", plan_why[512] = "";
    int missing = 0, n_planned = 0;
    for (int j = 0; j < pc->n_devices; j++) {
        const gp_device_spec *ds = &pc->devices[j];
        gp_device_opts o = device_opts(cfg, j);
        if (gp_device_open(ds->name, &o, &devs[j]) == GP_OK) continue;
        /* A device here that cannot run as configured (precision bf16 on a
         * processor without bf16 instructions): planned as one that can,
         * and said so; a run stops at start-up with the same reason. */
        char cannot[512];
        snprintf(cannot, sizeof cannot, "%s", gp_last_error());
        gp_error_clear();
        o.plan = true;
        if (gp_device_open(ds->name, &o, &devs[j]) == GP_OK) {
            size_t used = strlen(planned);
            snprintf(planned + used, sizeof planned - used, "%s%s", n_planned ? ", " : "",
                     ds->name);
            if (!n_planned++) snprintf(plan_why, sizeof plan_why, "%s", cannot);
            continue;
        }
        gp_error_clear();
        devs[j] = NULL;
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", missing ? ", " : "", ds->name);
        if (!missing++) snprintf(why, sizeof why, "%s", cannot);
    }
    if (n_planned)
        fprintf(f, "note: %s cannot run this config on this machine (%s); the plan below is "
                   "for a processor that can, and a run here stops at start-up\n", planned,
                plan_why);
    if (missing)
        fprintf(f, "note: %s %s not available here (%s); the summary comes from the config "
                   "alone, without the layouts and pooling workspaces %s backend would choose\n",
                names, missing == 1 ? "is" : "are", why, missing == 1 ? "its" : "their");
}

static void summary_free(gp_model *m, gp_device **devs, int n)
{
    for (int k = 0; k < m->n_layers; k++) m->layers[k].dev = NULL; /* borrowed for queries */
    gp_model_free(m);
    close_devices(devs, n);
}

/* Bytes a parameter holds on its device while training: value, gradient
 * and the update's state (SGD's momentum, Adam's two moments), 4 each. */
static size_t state_bytes(const gp_config *cfg)
{
    if (gp_model_building_inference()) return 4; /* the value alone (gpipe-sample) */
    gp_optim_opts so = gp_model_optim_opts(cfg);
    return 8 + 4 * (size_t)gp_optim_states_per_param(&so);
}

/* The bytes a device holds per parameter of its stages: state_bytes, with
 * the optimizer's state split over the replicas (ZeRO stage 1,
 * gp_model_optim_shards: each holds its 1/R). */
static double held_bytes(const gp_config *cfg)
{
    size_t per = state_bytes(cfg);
    if (per <= 8) return (double)per;
    return 8.0 + (double)(per - 8) / gp_model_optim_shards(cfg);
}

/* " and momentum", " and Adam's moments" or "": what state_bytes adds. */
static const char *state_words(const gp_config *cfg, bool plus)
{
    if (gp_model_building_inference()) return ""; /* the weights alone */
    gp_optim_opts so = gp_model_optim_opts(cfg);
    int n = gp_optim_states_per_param(&so);
    if (plus) return n == 2 ? "+adam moments" : n == 1 ? "+momentum" : "";
    return n == 2 ? ", gradients and Adam's moments" : n == 1 ? ", gradients and momentum"
                                                         : " and gradients";
}

/* The memory CPU devices share: the machine's RAM, or an address-space
 * limit below it (ulimit -v: *limited); 0 when unknown. */
static uint64_t host_memory(bool *limited)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    struct rlimit as;
    *limited = false;
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY &&
        (ram == 0 || (uint64_t)as.rlim_cur < ram)) {
        ram = (uint64_t)as.rlim_cur;
        *limited = true;
    }
    return ram;
}

/* Where host memory runs out: "this machine's memory of X, which they
 * share", or the address-space limit, as gp_error_set says it. */
static const char *host_words(uint64_t ram, bool limited, char *buf, size_t len)
{
    char hb[32];
    gp_format_bytes((size_t)ram, hb, sizeof hb);
    if (limited)
        snprintf(buf, len, "this process may map: its address space is limited to %llu MiB "
                 "(ulimit -v); raise the limit, or ", (unsigned long long)(ram >> 20));
    else
        snprintf(buf, len, "this machine's memory of %s, which they share: ", hb);
    return buf;
}

/* Before anything is allocated or profiled: the whole model's weights,
 * gradients and optimizer state against the memory its devices have at
 * most, where that is known now (CPU devices: their capacities, and the
 * machine's RAM they share).  A model of 160 G parameters grew memory for
 * a minute, deaf to signals, before this; GPUs are checked once opened. */
static gp_status fits_at_all(const gp_config *cfg, int64_t params)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    if (gp_procs_size() > 1) return GP_OK; /* each rank its own machine, maybe */
    for (int d = 0; d < pc->n_devices; d++)
        if (!gp_device_spec_is_cpu(&pc->devices[d])) return GP_OK;
    bool limited;
    uint64_t ram = host_memory(&limited);
    uint64_t need = (uint64_t)((double)params * held_bytes(cfg) * gp_pipeline_replicas(pc));
    if (!ram || need <= ram) return GP_OK;
    char nb[32], hw[200];
    gp_format_bytes((size_t)need, nb, sizeof nb);
    return gp_error_set(GP_ERR_OOM, "%s: the model's %lld parameters need %s for their weights%s "
                        "alone%s, more than %smake the model smaller, or train it "
                        "on devices with more memory (--dry-run shows each layer's share)",
                        cfg->path, (long long)params, nb, state_words(cfg, false),
                        gp_pipeline_replicas(pc) > 1 ? " in every replica" : "",
                        host_words(ram, limited, hw, sizeof hw));
}

/* A device whose capacity cannot hold its stages' weights, gradients and
 * (with momentum) optimizer state, before any activation: what building
 * the model there would stop at, said after the summary.  The capacity is
 * pipeline.memory's, else (devs given: opened) the device's own memory
 * (a GPU's); the CPU devices without one together against the machine's
 * RAM (dry: --dry-run, which plans for any machine, notes that instead). */
static gp_status summary_fits(const gp_config *cfg, const gp_model *m, gp_device **devs,
                               bool dry)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    int n = pc->n_devices;
    int64_t held[GP_MAX_DEVICES] = {0}, buffers[GP_MAX_DEVICES] = {0};
    int64_t tied[GP_MAX_DEVICES] = {0}; /* tied replicas: value and gradient, no state */
    for (int j = 0, f0 = 0; j < m->n_stages; f0 += m->balance[j++])
        for (int k = f0; k < f0 + m->balance[j]; k++) {
            tied[m->dev_of[j]] += gp_layer_tied_count(&m->layers[k]);
            held[m->dev_of[j]] +=
                gp_layer_param_count(&m->layers[k]) - gp_layer_tied_count(&m->layers[k]);
            buffers[m->dev_of[j]] += gp_layer_buffer_count(&m->layers[k]); /* values alone */
        }
    double per = held_bytes(cfg); /* (the optimizer's share of it: ZeRO stage 1) */
    uint64_t host_need = 0;
    /* every replica's devices: each holds what replica 0's of its place do,
     * and may have its own memory: */
    for (int d = 0; d < gp_pipeline_devices_total(pc); d++) {
        uint64_t cap = device_opts(cfg, d).capacity;
        bool own = !cap && devs && devs[d];
        if (own) cap = gp_dev_mem_total(devs[d]);
        uint64_t need = (uint64_t)((double)held[d % n] * per) +
                        (uint64_t)buffers[d % n] * sizeof(float) +
                        (uint64_t)tied[d % n] * 2 * sizeof(float);
        if (!cap && gp_device_spec_is_cpu(&pc->devices[d % n])) host_need += need;
        if (!cap || need <= cap) continue;
        char nb[32], cb[32];
        gp_format_bytes((size_t)need, nb, sizeof nb);
        gp_format_bytes((size_t)cap, cb, sizeof cb);
        return gp_error_set(GP_ERR_OOM, "%s: %s's stages hold %s of weights%s alone"
                            "%s, more than %s %s; %sspread the model over more devices",
                            memory_at(cfg, d, own), pc->devices[d].name, nb,
                            state_words(cfg, false),
                            buffers[d % n] ? " (batch-norm statistics included)" : "",
                            memory_words(cfg, d, own), cb,
                            own ? "" : "give it more memory, or ");
    }
    bool limited;
    uint64_t ram = host_memory(&limited);
    if (!ram || host_need <= ram || gp_procs_size() > 1) return GP_OK; /* (ranks: their own) */
    char nb[32], hw[200];
    gp_format_bytes((size_t)host_need, nb, sizeof nb);
    host_words(ram, limited, hw, sizeof hw);
    if (dry) { /* --dry-run plans for any machine: this one's RAM is a note */
        fprintf(stderr, "note: the CPU devices' stages hold %s of weights%s alone, "
                "more than %sa run here would stop at start-up\n", nb,
                state_words(cfg, false), hw);
        return GP_OK;
    }
    return gp_error_set(GP_ERR_OOM, "%s: the CPU devices' stages hold %s of weights%s "
                        "alone, more than %smake the model smaller, or train it "
                        "on devices with more memory", cfg->path, nb, state_words(cfg, false),
                        hw);
}

/* Each device's bytes at the peak of a step, before any step runs (issue
 * 78): the simulator's memory walk (gp_simulate_memory) over the run's own
 * schedule (built-in or read from a file), split, micro-batches and
 * checkpointing, with every layer's parameters, gradients, optimizer state
 * and activations taken from its shapes (gp_model_profile_estimate:
 * nothing runs, so a model of any size is checked at once; the backend's
 * workspace is not counted).  A device whose capacity (pipeline.memory, or
 * a GPU's own) is below what it holds at least stops the run here, naming
 * the device, the schedule and what would help; GPIPE_MEMORY_CHECK=0 runs
 * it anyway.  "At least": the estimated peak where a device runs one
 * stage; where it runs several, each stage's own peak beside the others'
 * weights and state (the estimate of their sum errs high, up to 1.5x
 * measured on a U-Net's V schedules, and a run that fits must not be
 * refused).  dry: --dry-run prints the estimated peaks (into f) and notes
 * a device that would not fit instead.  devs (opened, or NULL): what a
 * pooling keeps is asked of the first. */
static gp_status activations_fit(const gp_config *cfg, const gp_model *meta, gp_device **devs,
                                 bool dry, FILE *f)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    int n = pc->n_devices;
    if (gp_model_building_inference()) return GP_OK; /* (gpipe-sample: no training step) */
    if (!dry && getenv("GPIPE_MEMORY_CHECK") && !strcmp(getenv("GPIPE_MEMORY_CHECK"), "0"))
        return GP_OK;
    gp_device *ask = NULL;
    for (int d = 0; devs && d < gp_pipeline_devices_total(pc) && !ask; d++) ask = devs[d];
    gp_profile prof;
    gp_status s = gp_model_profile_estimate(cfg, ask, &prof);
    double peak[GP_MAX_DEVICES], floor_[GP_MAX_DEVICES];
    if (s == GP_OK) {
        s = gp_simulate_memory(&prof, pc->schedule, n, meta->n_stages / n, pc->schedule_file,
                               meta->balance, pc->chunks, pc->checkpoint, peak, floor_);
        gp_profile_free(&prof);
    }
    if (s != GP_OK) { /* (the schedule's own errors are the config's, said elsewhere) */
        gp_error_clear();
        return GP_OK;
    }
    char sched[1100];
    if (pc->schedule == GP_SCHEDULE_FILE || pc->schedule == GP_SCHEDULE_FILE_V)
        snprintf(sched, sizeof sched, "the schedule in %s", pc->schedule_path);
    else
        snprintf(sched, sizeof sched, "schedule %s", gp_schedule_kind_name(pc->schedule));
    if (dry && f) {
        fprintf(f, "memory at a step's peak (%s, %d micro-batch%s of up to %lld, checkpoint "
                   "%s; estimated from the layers' shapes, the backend's workspace not "
                   "counted):", sched, pc->chunks, pc->chunks == 1 ? "" : "es",
                (long long)((gp_config_replica_batch(cfg) + pc->chunks - 1) / pc->chunks),
                gp_checkpoint_mode_name(pc->checkpoint));
        for (int d = 0; d < n; d++) {
            char b[32], lb[32];
            fprintf(f, "%s %s %s", d ? "," : "", pc->devices[d].name,
                    gp_format_bytes((size_t)peak[d], b, sizeof b));
            if (meta->n_stages > n) /* several stages a device: what it holds at least */
                fprintf(f, " (at least %s)", gp_format_bytes((size_t)floor_[d], lb, sizeof lb));
        }
        fprintf(f, "\n");
    }
    uint64_t host_need = 0;
    for (int d = 0; d < gp_pipeline_devices_total(pc); d++) {
        uint64_t cap = device_opts(cfg, d).capacity;
        bool own = !cap && devs && devs[d];
        if (own) cap = gp_dev_mem_total(devs[d]);
        double need = floor_[d % n];
        if (!cap && gp_device_spec_is_cpu(&pc->devices[d % n])) host_need += (uint64_t)need;
        if (!cap || need <= (double)cap) continue;
        char nb[32], cb[32];
        gp_format_bytes((size_t)need, nb, sizeof nb);
        gp_format_bytes((size_t)cap, cb, sizeof cb);
        const char *help =
            pc->checkpoint != GP_CKPT_ALWAYS
                ? "pipeline.checkpoint: always keeps only each stage's input; or "
                : "";
        if (dry) {
            fprintf(stderr, "note: %s needs %s%s at a step's peak under %s, more than %s "
                    "%s; a run would stop at start-up (%smore micro-batches, a schedule with "
                    "fewer in flight, or more devices)\n", pc->devices[d].name,
                    meta->n_stages > n ? "at least " : "about ", nb, sched,
                    memory_words(cfg, d, own), cb, help);
            continue;
        }
        return gp_error_set(GP_ERR_OOM, "%s: %s needs %s%s at a step's peak (weights%s "
                            "and the activations of %d micro-batch%s under %s, "
                            "checkpoint %s; estimated from the layers' shapes), more than %s "
                            "%s: %smore micro-batches, a schedule with fewer in flight "
                            "(1f1b, v-half, v-min), or more devices would lower it "
                            "(gpipe-train --dry-run shows every device's; "
                            "GPIPE_MEMORY_CHECK=0 runs anyway)", memory_at(cfg, d, own),
                            pc->devices[d].name,
                            meta->n_stages > n ? "at least " : "about ", nb,
                            state_words(cfg, false), pc->chunks,
                            pc->chunks == 1 ? "" : "es", sched,
                            gp_checkpoint_mode_name(pc->checkpoint),
                            memory_words(cfg, d, own), cb, help);
    }
    bool limited;
    uint64_t ram = host_memory(&limited);
    if (dry || !ram || host_need <= ram || gp_procs_size() > 1) return GP_OK;
    char nb[32], hw[200];
    gp_format_bytes((size_t)host_need, nb, sizeof nb);
    host_words(ram, limited, hw, sizeof hw);
    return gp_error_set(GP_ERR_OOM, "%s: the CPU devices need about %s at a step's peak "
                        "(weights%s, and activations, estimated from the layers' shapes), more "
                        "than %sfewer or smaller micro-batches, pipeline.checkpoint: always, "
                        "or a smaller model would lower it (GPIPE_MEMORY_CHECK=0 runs anyway)",
                        cfg->path, nb, state_words(cfg, false), hw);
}

/* What the summary's table adds up: every layer's, and the stage's so far. */
typedef struct summary_sums {
    int64_t params;         /* as Hugging Face counts them (gp_model_layer_params) */
    int64_t pad;            /* a padded vocabulary's elements (model.gpt.vocab_pad):
                               held and multiplied, not counted */
    int64_t pad_rows;
    double flops;           /* forward, per batch */
    double act;             /* activation bytes kept for backward, per batch */
} summary_sums;

/* The per-layer notes after a row of the table into sk: its window, what
 * it stashes and pops, and what its stage does with it (run in place, not
 * kept, fused, blocked). */
static void summary_layer_notes(const gp_layer *l, bool inplace, bool unkept, bool fused,
                                bool paired, char *sk, size_t len)
{
    char win[160];
    sk[0] = '\0';
    if (gp_layer_window_str(&l->spec, win, sizeof win)[0]) snprintf(sk, len, "  %s", win);
    if (l->spec.stash[0])
        snprintf(sk + strlen(sk), len - strlen(sk), "  stash %s", l->spec.stash);
    for (int q = 0; q < l->spec.n_pop; q++)
        snprintf(sk + strlen(sk), len - strlen(sk), "  pop %s", l->spec.pop[q]);
    if (l->spec.tie[0]) /* its weight is counted with its owner's */
        snprintf(sk + strlen(sk), len - strlen(sk), "  weight tied to %s", l->spec.tie);
    int64_t pad_rows = 0;
    gp_model_layer_padding(l, &pad_rows);
    if (pad_rows > 0) /* model.gpt.vocab_pad: not in the params column */
        snprintf(sk + strlen(sk), len - strlen(sk), "  + %lld padded rows", (long long)pad_rows);
    if (inplace) snprintf(sk + strlen(sk), len - strlen(sk), "  in place");
    if (fused) /* gp_layers_relu_fused: the norm before computed it */
        snprintf(sk + strlen(sk), len - strlen(sk), "  fused into the norm");
    else if (l->relu_done) /* its forward is the linear's epilogue */
        snprintf(sk + strlen(sk), len - strlen(sk), "  forward fused into the linear");
    if (paired && l->spec.type == GP_LAYER_GELU) /* gp_layers_linear_gelu */
        snprintf(sk + strlen(sk), len - strlen(sk), "  one product with the linear");
    else if (paired) /* gp_layers_add_norm: the add before runs it in its pass */
        snprintf(sk + strlen(sk), len - strlen(sk), "  one pass with the add");
    if (unkept) snprintf(sk + strlen(sk), len - strlen(sk), "  not kept");
    if (gp_blk_nhwc(l->out_blk)) /* channels-last (backend.h) */
        snprintf(sk + strlen(sk), len - strlen(sk), "  out nhwc");
    else if (l->out_blk) /* gp_layers_blocked: the convolutions' own layout */
        snprintf(sk + strlen(sk), len - strlen(sk), "  out nChw%lldc", (long long)l->out_blk);
}

/* The layer column as wide as its longest entry ("amoeba_cell
 * cell5_normal6", "conv2d layer3_22_conv2"), 16 to 79. */
static int summary_name_width(const gp_model *m)
{
    int wl = 16;
    for (int k = 0; k < m->n_layers; k++) {
        int w = (int)(strlen(gp_layer_type_name(m->layers[k].spec.type)) + 1 +
                      strlen(m->layers[k].spec.name));
        if (w > wl) wl = w < 79 ? w : 79;
    }
    return wl;
}

/* The bytes layer l keeps for its backward over a batch of b: its output
 * where it owns it (not run in place over its input, and read by some
 * backward; train.activations' storage) and what its backward saves
 * beside it. */
static double layer_act_bytes(const gp_layer *l, int64_t b, bool inplace, bool unkept)
{
    double out = !inplace && !unkept ? (double)gp_shape_numel(&l->out_shape) * (double)b *
                                           (double)gp_dtype_size(l->out_dtype)
                                     : 0.0;
    return out + (l->ops->saved_bytes ? (double)l->ops->saved_bytes(l, b) : 0.0);
}

/* Selective recompute (pipeline.checkpoint.keep): what a checkpointed
 * micro-batch of stage [f0, f0 + count) holds for the backward besides its
 * input, of what a forward that keeps everything holds, and how much of
 * the forward its recompute runs again (gp_ckpt_kept; checkpoint.h).  The
 * batch's bytes and FLOPs, as the table's columns. */
static void summary_keep_line(const gp_config *cfg, gp_model *m, FILE *f, int f0, int count,
                              const bool *inplace, const bool *unkept)
{
    if (!cfg->pipeline.checkpoint_keep || cfg->pipeline.checkpoint == GP_CKPT_NEVER) return;
    bool *kept = calloc((size_t)count + 1, sizeof *kept);
    if (!kept) return;
    int64_t b = cfg->train.batch_size;
    for (int c = 0; c < count; c++)
        kept[c] = cfg->pipeline.checkpoint_keep >> m->layers[f0 + c].spec.type & 1u;
    gp_ckpt_kept(inplace + f0, count, kept);
    double held = 0, all = 0, rfl = 0, fl = 0;
    for (int c = 0; c < count; c++) {
        gp_layer *l = &m->layers[f0 + c];
        double act = layer_act_bytes(l, b, inplace[f0 + c], unkept[f0 + c]);
        double lf = l->ops->flops(l, b);
        all += act;
        fl += lf;
        if (!kept[c]) {
            rfl += lf;
            continue;
        }
        held += act;
        /* an output no backward reads stays for the recompute of the layer
         * after its run in place, unless that one is kept too */
        int o = c;
        while (o > 0 && inplace[f0 + o]) o--;
        if (c + 1 < count && !inplace[f0 + c + 1] && unkept[f0 + o] && !kept[c + 1])
            held += (double)gp_shape_numel(&m->layers[f0 + o].out_shape) * (double)b *
                    (double)gp_dtype_size(m->layers[f0 + o].out_dtype);
    }
    char hb[32], ab[32];
    fprintf(f, "      checkpointed, it keeps %s of the %s for the backward and recomputes "
               "%.1f of %.1f MFLOP (pipeline.checkpoint.keep)\n",
            gp_format_bytes((size_t)held, hb, sizeof hb), gp_format_bytes((size_t)all, ab, sizeof ab),
            rfl / 1e6, fl / 1e6);
    free(kept);
}

/* The table: a row per layer, and with several devices a line per stage;
 * the whole model's sums into *tot. */
static gp_status summary_layers(const gp_config *cfg, gp_model *m, FILE *f, summary_sums *tot)
{
    int n = cfg->pipeline.n_devices, wl = summary_name_width(m);
    int64_t b = cfg->train.batch_size;
    fprintf(f, "%4s  %-7s %-*s %-20s %12s %14s %14s\n", "#", "device", wl, "layer",
            "output (per sample)", "params", "fwd MFLOP/b", "act. bytes/b");
    summary_sums sg = {0}; /* the stage's */
    int64_t sg_tied = 0;   /* the stage's tied copies: a value and a gradient each */
    int stage = 0, first = 0;
    /* which layers run in place in their stage: their output is no extra */
    /* one allocation: inplace, unkept, fused and add_norm [n_layers] */
    bool *inplace = calloc(4 * (size_t)m->n_layers + 1, sizeof *inplace);
    if (!inplace) return gp_error_set(GP_ERR_OOM, "out of host memory");
    bool *unkept = inplace + m->n_layers, *fused = unkept + m->n_layers;
    bool *add_norm = fused + m->n_layers;
    for (int j = 0, f0 = 0; j < m->n_stages; f0 += m->balance[j++]) {
        gp_layers_blocked(m->layers + f0, m->balance[j]);
        gp_layers_inplace(m->layers + f0, m->balance[j], inplace + f0);
        gp_layers_unkept(m->layers + f0, m->balance[j], inplace + f0, unkept + f0);
        gp_layers_relu_fused(m->layers + f0, m->balance[j], inplace + f0, fused + f0);
        for (int c = 0; c + 1 < m->balance[j]; c++)
            add_norm[f0 + c + 1] =
                gp_layers_add_norm(m->layers + f0, m->balance[j], c, inplace + f0) ||
                gp_layers_linear_gelu(m->layers + f0, m->balance[j], c, inplace + f0);
    }
    for (int k = 0; k < m->n_layers; k++) {
        gp_layer *l = &m->layers[k];
        char sh[64], nm[80], ab[32], sk[256];
        gp_shape os = l->out_shape;
        gp_shape_str(&os, sh, sizeof sh);
        snprintf(nm, sizeof nm, "%s%s%s", gp_layer_type_name(l->spec.type),
                 l->spec.name[0] ? " " : "", l->spec.name);
        summary_layer_notes(l, inplace[k], unkept[k], fused[k], add_norm[k], sk, sizeof sk);
        int64_t np = gp_model_layer_params(l), pr = 0, pad = gp_model_layer_padding(l, &pr);
        double fl = l->ops->flops(l, b);
        double act = layer_act_bytes(l, b, inplace[k], unkept[k]);
        tot->params += np; tot->flops += fl; tot->act += act;
        sg.params += np; sg.flops += fl; sg.act += act;
        tot->pad += pad; sg.pad += pad;
        if (pad > 0 && pr > tot->pad_rows) tot->pad_rows = pr;
        sg_tied += gp_layer_tied_count(l);
        const char *dn = cfg->pipeline.devices[m->dev_of[stage]].name;
        fprintf(f, "%4d  %-7s %-*s %-20s %12lld %14.1f %14s%s\n", k, dn, wl, nm, sh,
                (long long)np, fl / 1e6, gp_format_bytes((size_t)act, ab, sizeof ab), sk);
        if (n > 1 && k - first + 1 == m->balance[stage]) {
            char pb[32], mb[32];
            fprintf(f, "      stage %d on %s: layers %d-%d, %lld parameters (%s), %.1f MFLOP, "
                       "~%s weights+grads%s, %s activations per batch\n",
                    stage, dn, first, k, (long long)sg.params,
                    gp_format_bytes((size_t)(sg.params + sg.pad) * 4, pb, sizeof pb),
                    sg.flops / 1e6,
                    gp_format_bytes((size_t)((double)(sg.params + sg.pad) * held_bytes(cfg)) +
                                        (size_t)sg_tied * 2 * sizeof(float), mb, sizeof mb),
                    state_words(cfg, true),
                    gp_format_bytes((size_t)sg.act, ab, sizeof ab));
            summary_keep_line(cfg, m, f, first, m->balance[stage], inplace, unkept);
            stage++;
            first = k + 1;
            sg = (summary_sums){0};
            sg_tied = 0;
        }
    }
    if (n == 1) summary_keep_line(cfg, m, f, 0, m->n_layers, inplace, unkept);
    free(inplace); /* and unkept, fused */
    return GP_OK;
}

/* A batch norm that a micro-batch gives one value per channel stops the
 * first step (batchnorm.c); the shapes say so now.  Synchronised ones
 * count every replica's micro-batch. */
static void summary_batchnorm_note(const gp_config *cfg, const gp_model *m, FILE *f)
{
    int64_t b = cfg->train.batch_size;
    int64_t parts = (int64_t)cfg->pipeline.chunks * gp_pipeline_replicas(&cfg->pipeline);
    int64_t mb_min = parts > 0 ? b / parts : b;
    for (int k = 0; k < m->n_layers; k++) {
        const gp_layer *l = &m->layers[k];
        if (l->spec.type != GP_LAYER_BATCHNORM) continue;
        int64_t per = 1;
        for (int d = 2; d < l->in_shape.ndim; d++) per *= l->in_shape.dims[d];
        int64_t n_mb = l->spec.sync ? mb_min * gp_pipeline_replicas(&cfg->pipeline) : mb_min;
        if (n_mb * per >= 2) continue;
        char d[400];
        fprintf(f, "note: %s: training batch norm needs more than one value per channel, but "
                   "the smallest micro-batch (train.batch_size %lld in %lld) has %lld sample(s) "
                   "of %lld value(s) per channel: a run stops at its first step; use fewer "
                   "pipeline.chunks or a larger batch\n",
                gp_layer_describe(l, d, sizeof d), (long long)b, (long long)parts,
                (long long)n_mb, (long long)per);
        break;
    }
}

/* The skips, and the stage boundaries they cross (copied straight from
 * the stash's stage to the pop's, once per micro-batch). */
/* With bf16 activations (train.activations): the FP32 activation bytes a
 * batch's forward makes, those of the layers that run on FP32 copies (the
 * storage adapter: each input widened and the output in FP32 before its
 * rounding), and which layer types they are; none where every layer has
 * bf16 kernels on its device.  A layer whose device could not be opened
 * here is counted apart (what its kernels take is not known). */
static void summary_fp32_acts(const gp_config *cfg, const gp_model *m, FILE *f)
{
    int64_t b = cfg->train.batch_size;
    double bytes = 0;
    int adapted = 0, unknown = 0, bf16 = 0;
    char types[160] = "";
    for (int k = 0; k < m->n_layers; k++) {
        const gp_layer *l = &m->layers[k];
        if (l->out_dtype != GP_BF16) continue;
        bf16++;
        if (l->ops->any_dtype) continue;
        if (!l->dev) {
            unknown++;
            continue;
        }
        if (l->ops->takes_bf16 && l->ops->takes_bf16(l)) continue;
        adapted++;
        double n = (double)gp_shape_numel(&l->out_shape);
        if (!l->ops->data_input) n += (double)gp_shape_numel(&l->in_shape);
        bytes += n * (double)b * sizeof(float);
        const char *t = gp_layer_type_name(l->spec.type);
        if (!strstr(types, t) && strlen(types) + strlen(t) + 3 < sizeof types)
            snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s",
                     types[0] ? ", " : "", t);
    }
    if (!bf16) return;
    char ab[32];
    if (!adapted && unknown)
        fprintf(f, "bf16 activations: the FP32 activation bytes are not known here: %d layer%s "
                   "on devices not opened here (what their kernels take is the device's)\n",
                unknown, unknown == 1 ? " is" : "s are");
    else if (!adapted)
        fprintf(f, "bf16 activations: no FP32 activation bytes, every layer reads and writes "
                   "bf16 with its own kernels\n");
    else
        fprintf(f, "bf16 activations: %d layer%s (%s) run on FP32 copies (the storage adapter): "
                   "up to %s of FP32 activations a batch%s\n", adapted, adapted == 1 ? "" : "s",
                types, gp_format_bytes((size_t)bytes, ab, sizeof ab),
                unknown ? ", and the layers on devices not opened here" : "");
}

static void summary_skips(const gp_config *cfg, const gp_model *m, FILE *f)
{
    for (int t = 0; t < m->skips.n; t++) {
        const gp_skip *k = &m->skips.skips[t];
        int s_from = 0, s_to = 0;
        for (int a = 0, f0 = 0; a < m->n_stages; f0 += m->balance[a++]) {
            if (k->from >= f0 && k->from < f0 + m->balance[a]) s_from = a;
            if (k->to >= f0 && k->to < f0 + m->balance[a]) s_to = a;
        }
        char kb[32];
        gp_shape ks = m->layers[k->from].out_shape;
        size_t bytes = (size_t)gp_shape_numel(&ks) * gp_dtype_size(m->layers[k->from].out_dtype);
        if (s_from == s_to)
            fprintf(f, "skip '%s': layer %d -> %d, inside stage %d (%s per sample)\n", k->name,
                    k->from, k->to, s_from, gp_format_bytes(bytes, kb, sizeof kb));
        else
            fprintf(f, "skip '%s': layer %d -> %d, stage %d -> %d: crosses %d boundar%s, copied "
                       "straight across (%s per sample%s)\n", k->name, k->from, k->to, s_from,
                    s_to, s_to - s_from, s_to - s_from == 1 ? "y" : "ies",
                    gp_format_bytes(gp_config_bf16_copies(cfg) ? bytes / 2 : bytes, kb, sizeof kb),
                    gp_config_bf16_copies(cfg) ? " in bf16" : "");
    }
}

/* The pipeline's line: devices (and replicas), chunks, checkpointing,
 * schedule, copies; and the note a run warns when CPU devices share cores. */
static void summary_pipeline(const gp_config *cfg, FILE *f)
{
    const gp_pipeline_config *pc = &cfg->pipeline;
    int n = pc->n_devices, R = gp_pipeline_replicas(pc);
    char reps[256] = "";
    if (R > 1) { /* data parallel: the devices above are replica 0's */
        int total = gp_pipeline_devices_total(pc), at = 0;
        char all[96] = "";
        /* every device where they fit (a grid need not run in order),
         * else the first and the last */
        for (int d = 0; d < total && at < (int)sizeof all; d++)
            at += snprintf(all + at, sizeof all - (size_t)at, "%s%s", d ? ", " : "",
                           pc->devices[d].name);
        if (at >= (int)sizeof all)
            snprintf(all, sizeof all, "%s to %s", pc->devices[0].name,
                     pc->devices[total - 1].name);
        snprintf(reps, sizeof reps, " x %d data-parallel replicas (%d devices: %s; each "
                 "replica's share of the batch is %lld)", R, total, all,
                 (long long)(cfg->train.batch_size / R));
    }
    char keep[256] = "";
    if (pc->checkpoint_keep && pc->checkpoint != GP_CKPT_NEVER) {
        snprintf(keep, sizeof keep, " keeping ");
        gp_ckpt_keep_str(pc->checkpoint_keep, keep + strlen(keep), sizeof keep - strlen(keep));
    }
    fprintf(f, "pipeline: %d device(s)%s, chunks %d, checkpoint %s%s, %s%s%s\n", n, reps,
            pc->chunks, gp_checkpoint_mode_name(pc->checkpoint), keep,
            pc->lockstep ? "lockstep" : "free-running",
            n > 1 && gp_config_bf16_copies(cfg) ? ", copies in bf16" : "",
            gp_config_act_dtype(cfg) == GP_BF16 ? ", activations in bf16" : "");
    char shared[160], isa[256];
    if (cores_shared(pc, shared, sizeof shared)) fprintf(f, "note: %s\n", shared); /* as a run */
    if (cpu_isa_line(pc, isa, sizeof isa)) fprintf(f, "processor: %s\n", isa);
}

/* The optimizer's line: its settings, the rate the run starts from, and
 * the bytes each parameter holds. */
static void summary_optimizer(const gp_config *cfg, FILE *f)
{
    const gp_optim_config *oc = &cfg->train.optim;
    char clip[64] = "";
    if (cfg->train.clip_grad_norm > 0)
        snprintf(clip, sizeof clip, ", gradients clipped to norm %g",
                 (double)cfg->train.clip_grad_norm);
    size_t per = state_bytes(cfg);
    const char *held = per == 16 ? "value, gradient, two moments"
                       : per == 12 ? "value, gradient, momentum" : "value, gradient";
    /* the rate the run starts from: with lr_scaling, the config's scaled */
    char lr[96];
    double base = gp_lr_base(&cfg->train);
    if (base != oc->lr)
        snprintf(lr, sizeof lr, "lr %g (%g x batch %lld / base_batch %lld)", base, oc->lr,
                 (long long)cfg->train.batch_size, (long long)cfg->train.base_batch);
    else snprintf(lr, sizeof lr, "lr %g", oc->lr);
    /* with replicas each holds its share of the state (ZeRO stage 1) */
    int R = gp_model_optim_shards(cfg);
    char shard[160] = "";
    if (R > 1 && per > 8)
        snprintf(shard, sizeof shard, "; the %d replicas split the optimizer's state, so a "
                 "device holds %.4g bytes per parameter of its stages", R, held_bytes(cfg));
    if (oc->kind == GP_OPTIM_SGD)
        fprintf(f, "optimizer: sgd (%s, momentum %g%s, weight decay %g): %zu bytes per "
                   "parameter (%s%s)%s\n", lr, (double)oc->momentum,
                oc->nesterov ? ", nesterov" : "", (double)oc->weight_decay, per, held, shard,
                clip);
    else
        fprintf(f, "optimizer: %s (%s, betas [%g, %g], eps %g, weight decay %g): %zu bytes "
                   "per parameter (%s%s)%s\n", oc->type, lr, (double)oc->beta1,
                (double)oc->beta2, (double)oc->eps, (double)oc->weight_decay, per, held, shard,
                clip);
}

/* A language model's line (one that starts with an embedding: model.gpt,
 * or layers written so): the parameters, the tied weight counted once; the
 * training FLOPs per token as llm.c's and PaLM's estimate (appendix B),
 * 6 N + 12 L H Q T: 6 N for the forward and backward of every weight's
 * multiply-add per token, and 12 x T x the width H Q of each of the L
 * attention layers for its scores and weighted sum (counted over the full
 * T x T, as PaLM does, not the causal half); and the activation bytes one
 * sequence keeps for backward (the table's total over the batch). */
static void summary_lm(const gp_config *cfg, const gp_model *m, const summary_sums *tot, FILE *f)
{
    if (!m->n_layers || m->layers[0].spec.type != GP_LAYER_EMBEDDING) return;
    int64_t T = cfg->model.input[0], attn = 0;
    int L = 0;
    for (int k = 0; k < m->n_layers; k++) {
        const gp_layer *l = &m->layers[k];
        if (l->spec.type != GP_LAYER_ATTENTION) continue;
        L++;
        attn += l->out_shape.dims[l->out_shape.ndim - 1]; /* H Q: its width */
    }
    /* 6N at the padded vocabulary's size: its rows are multiplied too */
    double six_n = 6.0 * (double)(tot->params + tot->pad), att = 12.0 * (double)attn * (double)T;
    char ab[32];
    double per_seq = cfg->train.batch_size > 0 ? tot->act / (double)cfg->train.batch_size : 0;
    char pad[96] = "";
    if (tot->pad > 0)
        snprintf(pad, sizeof pad, " + %lld in %lld padded vocabulary rows", (long long)tot->pad,
                 (long long)tot->pad_rows);
    fprintf(f, "language model: %lld parameters (a tied weight counted once)%s; %.1f MFLOP per "
               "token to train (6N + 12 L H Q T: 6N = %.1f, %d attention layers at T = %lld: "
               "%.1f); %s of activations per sequence of %lld tokens\n",
            (long long)tot->params, pad, (six_n + att) / 1e6, six_n / 1e6, L, (long long)T,
            att / 1e6, gp_format_bytes((size_t)per_seq, ab, sizeof ab), (long long)T);
}

/* --dry-run: the model as shapes, on the devices that can be asked about
 * layouts, printed as a table (summary_layers) between the model's line
 * and the pipeline's and optimizer's; then whether the stages' state fits
 * the devices' memory (summary_fits), as a run would check it. */
gp_status gp_model_summary(const gp_config *cfg0, FILE *f)
{
    gp_device *devs[GP_MAX_DEVICES] = {0};
    gp_model m = {0};
    int n = cfg0->pipeline.n_devices, S = n * gp_model_virtual(cfg0);
    /* balance: auto profiles every layer (AmoebaNet-D (18, 256): 25 s); a
     * summary shows the split by estimated FLOPs instead, and says so.  A
     * shallow copy: only the balance differs, nothing is freed through it. */
    gp_config c2 = *cfg0;
    const gp_config *cfg = &c2;
    bool flops_split = false;
    if (cfg0->pipeline.n_balance == 0 && S > 1) {
        GP_TRY(gp_model_balance_flops(cfg0, S, c2.pipeline.balance));
        c2.pipeline.n_balance = S;
        flops_split = true;
    }
    int balance[GP_MAX_DEVICES];
    GP_TRY(gp_model_balance(cfg, S, balance, true));
    /* The model as shapes (gp_model_build_meta): nothing is allocated, so
     * the summary takes no time or memory whatever the model's size, and
     * needs none of the devices it names. */
    GP_TRY(gp_model_build_meta(cfg, balance, &m));
    summary_devices(cfg, devs, f);
    /* device of each layer, by its stage (m.dev_of) */
    for (int j = 0, f0 = 0; j < m.n_stages; f0 += m.balance[j++])
        for (int k = f0; k < f0 + m.balance[j]; k++) m.layers[k].dev = devs[m.dev_of[j]];
    char cmd[4096], note[300];
    if (flops_split) /* (--devices: devices, not stages: a V or interleaved run has more) */
        fprintf(f, "balance: auto; shown split by estimated FLOPs (a run profiles each layer "
                   "first and may split otherwise: %s --devices %d%s prints that split)\n",
                balance_command(cfg0, cmd, sizeof cmd), n, config_note(cfg0, note, sizeof note));
    fprintf(f, "model: %d layers, input %lld x %lld x %lld, batch %lld, on %d device%s%s%s%s\n",
            m.n_layers, (long long)cfg->model.input[0], (long long)cfg->model.input[1],
            (long long)cfg->model.input[2], (long long)cfg->train.batch_size, n,
            n == 1 ? "" : "s", cfg->train.precision ? ", precision " : "",
            cfg->train.precision ? gp_precision_name((gp_precision)cfg->train.precision) : "",
            cfg->train.deterministic ? ", deterministic algorithms" : "");
    summary_sums tot = {0};
    gp_status s = summary_layers(cfg, &m, f, &tot);
    if (s != GP_OK) {
        summary_free(&m, devs, n);
        return s;
    }
    summary_batchnorm_note(cfg, &m, f);
    char ab[32], pb[32], pad[64] = "";
    if (tot.pad > 0) /* the bytes are the padded rows' too */
        snprintf(pad, sizeof pad, " + %lld padded", (long long)tot.pad);
    fprintf(f, "total: %lld parameters%s (%s), %.1f MFLOP forward per batch (%.1f per step "
               "with backward), %s of activations per batch\n",
            (long long)tot.params, pad,
            gp_format_bytes((size_t)(tot.params + tot.pad) * 4, pb, sizeof pb),
            tot.flops / 1e6, 3 * tot.flops / 1e6, gp_format_bytes((size_t)tot.act, ab, sizeof ab));
    summary_lm(cfg, &m, &tot, f);
    summary_fp32_acts(cfg, &m, f);
    summary_skips(cfg, &m, f);
    summary_pipeline(cfg, f);
    summary_optimizer(cfg, f);
    if (cfg->train.eval_batch_size > 0)
        fprintf(f, "evaluation: batches of %lld samples (train.eval_batch_size)\n",
                (long long)cfg->train.eval_batch_size);
    else
        fprintf(f, "evaluation: batches of %lld samples, the training batch (set "
                   "train.eval_batch_size for another)\n", (long long)cfg->train.batch_size);
    s = summary_fits(cfg, &m, NULL, true);
    if (s == GP_OK) s = activations_fit(cfg, &m, devs, true, f);
    summary_free(&m, devs, n);
    return s;
}
