/*
 * test_api.c — the public C API (include/gpipe.h) as a program that
 * includes nothing else uses it:
 *   - gp_run_evaluate on the caller's batch, in evaluation mode: on a
 *     model without dropout or batch norm it equals the loss and accuracy
 *     of a gp_run_step's forward on the same batch (taken before that
 *     step's update), whatever the evaluation batch size;
 *   - gp_run_predict: the logits whose cross-entropy and accuracy are
 *     gp_run_evaluate's, the same on one device in other batches;
 *   - gp_run_export_weights: a second run that starts from the file
 *     (model.init_from), on one device, evaluates to the same loss;
 *   - gp_run_summary: the placement and parameter count, for a cuda:N
 *     config too on a machine without a GPU;
 *   - gp_run_train_ex: metrics, a trace of the chosen steps and the export
 *     are written; an output that would replace another is refused before
 *     any step, and so are trace steps without a trace or out of order;
 *     the trained model stays with the run (gp_run_export_weights then
 *     writes the same bytes as the run's own export);
 *   - gp_run_save / gp_run_restore: a caller's own loop resumes bit for
 *     bit (also with replicas), and a refused restore changes nothing;
 *     gp_run_describe sizes batches without opening a device;
 *   - bad arguments are GP_ERR_INVALID with a message, never a crash.
 */
#include "gpipe.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

/* Two stages, four micro-batches, no dropout and no batch norm: evaluation
 * mode computes what training's forward computes. */
static const char *k_yaml =
    "model:\n"
    "  input: [1, 4, 4]\n"
    "  layers: [flatten, {linear: {out: 32}}, relu, {linear: {out: 32}}, relu,\n"
    "           {linear: {out: 4}}]\n"
    "data:\n"
    "  dataset: synthetic\n"
    "  synthetic: {train: 128, test: 64, classes: 4, shape: [1, 4, 4]}\n"
    "pipeline: {devices: [cpu:0, cpu:1], chunks: 4, threads: 1}\n"
    "train:\n"
    "  batch_size: 32\n"
    "  steps: 6\n"
    "  seed: 3\n"
    "  log_every: 0\n"
    "  optimizer: {lr: 0.1, momentum: 0.9}\n";

static void make_batch(unsigned *seed, float *x, float *y, int n)
{
    for (int i = 0; i < n; i++) {
        int label = (int)(rand_r(seed) % 4);
        for (int p = 0; p < 16; p++) {
            int quad = (p / 8) * 2 + (p % 4) / 2;
            x[i * 16 + p] = (float)rand_r(seed) / (float)RAND_MAX - 0.5f + (quad == label);
        }
        y[i] = (float)label;
    }
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

static void test_evaluate_and_export(void)
{
    enum { N = 32 };
    float x[N * 16], y[N];
    unsigned seed = 11;
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    if (!run) return;
    /* a few steps, so the weights are not the initial ones */
    for (int s = 0; s < 5; s++) {
        make_batch(&seed, x, y, N);
        CHECK_OK(gp_run_step(run, x, y, N, 0, NULL));
    }
    make_batch(&seed, x, y, N);
    double loss = -1, acc = -1;
    CHECK_OK(gp_run_evaluate(run, x, y, N, &loss, &acc));
    /* the same batch's forward in training mode: the step reports the
     * loss before its update */
    gp_metrics m;
    CHECK_OK(gp_run_step(run, x, y, N, 0, &m));
    CHECK_NEAR(loss, m.loss, 0.0, 1e-6);
    CHECK_NEAR(acc, m.accuracy, 0.0, 0.0);
    CHECK(loss > 0 && acc >= 0 && acc <= 1);
    CHECK(isnan(m.grad_norm)); /* no clipping: no norm */

    /* after the update the model changed: evaluation sees it */
    double loss2, acc2;
    CHECK_OK(gp_run_evaluate(run, x, y, N, &loss2, &acc2));
    CHECK_MSG(loss2 != loss, "evaluation after a step: %.9g both times", loss);

    /* gp_run_predict: the logits evaluation scores, through both stages
     * (their cross-entropy and accuracy, in double here, are evaluate's) */
    float logits[N * 4];
    CHECK_OK(gp_run_predict(run, x, N, logits));
    double ce = 0;
    int right = 0;
    for (int i = 0; i < N; i++) {
        const float *z = logits + i * 4;
        double mx = z[0], se = 0;
        int best = 0;
        for (int c = 1; c < 4; c++) {
            if (z[c] > mx) mx = z[c];
            if (z[c] > z[best]) best = c;
        }
        for (int c = 0; c < 4; c++) se += exp(z[c] - mx);
        ce += mx + log(se) - z[(int)y[i]];
        right += best == (int)y[i];
    }
    CHECK_NEAR(ce / N, loss2, 0.0, 1e-6);
    CHECK_NEAR((double)right / N, acc2, 0.0, 0.0);
    CHECK_ERR(gp_run_predict(run, x, 0, logits), GP_ERR_INVALID, "at least one sample");
    CHECK(gp_run_predict(run, x, N, NULL) == GP_ERR_INVALID);

    /* export, then start a one-device run from the file: same numbers */
    char wpath[320];
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", tmpdir);
    CHECK_OK(gp_run_export_weights(run, wpath));
    CHECK(file_size(wpath) > 4 * (16 * 32 + 32 * 32 + 32 * 4));
    char o1[400];
    snprintf(o1, sizeof o1, "model.init_from=%s", wpath);
    const char *ov[] = {o1, "pipeline.devices=[cpu:0]", "train.eval_batch_size=5"};
    gp_run *run2 = NULL;
    /* with train.clip_grad_norm the step reports the norm it clipped */
    const char *clip[] = {"train.clip_grad_norm=1e-4"};
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, clip, 1, &run2));
    if (run2) {
        gp_metrics mc;
        CHECK_OK(gp_run_step(run2, x, y, N, 0, &mc));
        CHECK_MSG(mc.grad_norm > 1e-4 && isfinite(mc.grad_norm), "clipped step's norm %g",
                  mc.grad_norm);
        gp_run_free(run2);
        run2 = NULL;
    }
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, ov, 3, &run2));
    if (run2) {
        double l3, a3;
        /* batches of 5 (the last of 2) on one device against 32 at once on two */
        CHECK_OK(gp_run_evaluate(run2, x, y, N, &l3, &a3));
        CHECK_NEAR(l3, loss2, 0.0, 1e-6);
        CHECK_NEAR(a3, acc2, 0.0, 0.0);
        /* and its logits, in batches of 5 on one device: the two stages' */
        float logits1[N * 4];
        CHECK_OK(gp_run_predict(run2, x, N, logits1));
        double worst = 0;
        for (int k = 0; k < N * 4; k++)
            worst = fmax(worst, fabs((double)logits1[k] - (double)logits[k]));
        CHECK_MSG(worst <= 1e-5, "gp_run_predict on one device differs by %g", worst);
        CHECK(gp_run_devices(run2) == 1);
    }
    gp_run_free(run2);

    /* a missing init_from file fails the first call that builds the model */
    const char *bad_ov[] = {"model.init_from=/nonexistent/w.safetensors"};
    gp_run *run3 = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, bad_ov, 1, &run3));
    if (run3) {
        CHECK_ERR(gp_run_step(run3, x, y, N, 0, NULL), GP_ERR_IO, "model.init_from");
        CHECK(strstr(gp_last_error(), "/nonexistent/w.safetensors") != NULL);
        CHECK(gp_run_devices(run3) == 0);
    }
    gp_run_free(run3);

    /* bad arguments: a message, no crash */
    CHECK_ERR(gp_run_evaluate(run, x, y, 0, &loss, &acc), GP_ERR_INVALID, "at least one sample");
    CHECK(gp_run_evaluate(run, NULL, y, N, &loss, &acc) == GP_ERR_INVALID);
    CHECK(gp_run_export_weights(run, "") == GP_ERR_INVALID);
    char nodir[320];
    snprintf(nodir, sizeof nodir, "%s/missing/w.safetensors", tmpdir);
    CHECK_ERR(gp_run_export_weights(run, nodir), GP_ERR_IO, "missing");
    gp_run_free(run);
}

/* gp_run_summary of the run k_yaml with `ov` makes (name: gp_run_parse's),
 * as text (malloc'd; NULL where a step failed, said). */
static char *summary_of(const char *name, const char *const *ov, int n_ov)
{
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse(name, k_yaml, ov, n_ov, &run));
    if (!run) return NULL;
    char path[320];
    snprintf(path, sizeof path, "%s/summary.txt", tmpdir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    char *s = NULL;
    if (f) {
        CHECK_OK(gp_run_summary(run, f));
        fclose(f);
        s = gpt_read_file(path, NULL);
    }
    CHECK(gp_run_devices(run) == 0); /* a summary opens nothing for good */
    gp_run_free(run);
    return s;
}

static void test_summary(void)
{
    char *s = summary_of("api.yaml", NULL, 0);
    /* 16*32+32 + 32*32+32 + 32*4+4 parameters */
    CHECK_MSG(s && strstr(s, "total: 1732 parameters") && strstr(s, "stage 1 on cpu:1"),
              "summary: %s", s ? s : "(none)");
    free(s);

    /* a GPU config is described without a GPU */
    const char *ov[] = {"pipeline.devices=[cuda:0, cuda:1]"};
    s = summary_of("api.yaml", ov, 1);
    CHECK_MSG(s && strstr(s, "total: 1732 parameters") && strstr(s, "stage 1 on cuda:1"),
              "cuda summary: %s", s ? s : "(none)");
    free(s);

    /* balance: auto from YAML text: the command to see the profiled split
     * takes a file, and says what it stands for (it named '<yaml>'), with
     * the run's override as --set */
    const char *auto_ov[] = {"pipeline.balance=auto"};
    s = summary_of(NULL, auto_ov, 1);
    CHECK_MSG(s && strstr(s, "gpipe-balance CONFIG.yaml --set pipeline.balance=auto --devices 2 "
                             "(CONFIG.yaml: this run's YAML") &&
                  strstr(s, "saved to a file) prints that split") && !strstr(s, "'<yaml>'"),
              "balance: auto from text: %s", s ? s : "(none)");
    free(s);
}

static void test_train_ex(void)
{
    char met[320], trace[320], wts[320];
    snprintf(met, sizeof met, "%s/m.jsonl", tmpdir);
    snprintf(trace, sizeof trace, "%s/t.json", tmpdir);
    snprintf(wts, sizeof wts, "%s/final.safetensors", tmpdir);
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    if (!run) return;

    gp_train_options o = GP_TRAIN_OPTIONS_INIT;
    CHECK(o.metrics_path == NULL && o.trace_path == NULL && o.trace_first == 0 &&
          o.trace_last < 0 && o.resume == NULL && o.export_weights == NULL &&
          o.progress == 0 && o.quiet == 0);
    /* refusals before any work */
    o.trace_path = trace;
    o.trace_first = 3;
    o.trace_last = 1;
    CHECK(gp_run_train_ex(run, &o, NULL) == GP_ERR_INVALID);
    o.trace_first = 1;
    o.trace_last = 2;
    o.metrics_path = met;
    o.export_weights = met; /* would replace the metrics */
    gp_status s = gp_run_train_ex(run, &o, NULL);
    CHECK_MSG(s != GP_OK && file_size(met) <= 0, "%s: %s", gp_status_name(s), gp_last_error());

    o.export_weights = wts;
    o.quiet = 1;
    gp_metrics m;
    CHECK_OK(gp_run_train_ex(run, &o, &m));
    CHECK(m.step == 6 && m.test_accuracy >= 0 && m.test_accuracy <= 1);
    CHECK(m.accuracy > 0 && m.accuracy <= 1 && m.seconds > 0);
    CHECK_NEAR(m.lr, 0.1, 0.0, 1e-6);
    char *ms = gpt_read_file(met, NULL);
    /* one line per step, one per epoch's evaluation (4 steps an epoch) and
     * the final one */
    CHECK_MSG(ms && count_lines(ms) == 8 && strstr(ms, "\"final\":true"), "metrics: %s",
              ms ? ms : "(none)");
    free(ms);
    char *ts = gpt_read_file(trace, NULL);
    /* steps 1 and 2 only (0-based): their names appear, step 3's does not */
    CHECK_MSG(ts && ts[0] == '{' && strstr(ts, "step 1") && strstr(ts, "step 2") &&
                  !strstr(ts, "step 3") && !strstr(ts, "step 0"),
              "trace: %.300s", ts ? ts : "(none)");
    free(ts);
    CHECK(file_size(wts) > 0);
    /* the trained model stays with the run: its export is the same file */
    CHECK(gp_run_devices(run) == 2);
    char wts2[320];
    snprintf(wts2, sizeof wts2, "%s/again.safetensors", tmpdir);
    CHECK_OK(gp_run_export_weights(run, wts2));
    char *w1 = gpt_read_file(wts, NULL), *w2 = gpt_read_file(wts2, NULL);
    CHECK_MSG(w1 && w2 && file_size(wts) == file_size(wts2) &&
                  !memcmp(w1, w2, (size_t)file_size(wts)),
              "gp_run_export_weights after gp_run_train_ex differs from its export_weights");
    free(w1);
    free(w2);
    gp_run_free(run);
}

/* What a run refuses, and what it says: NULL arguments, a model a
 * non-finite step left behind, a stop without a signal, a summary that
 * cannot be written; the learning rate without a schedule keeps its
 * scaling; a zeroed gp_train_options is "no outputs". */
static void test_misuse(void)
{
    enum { N = 32 };
    float x[N * 16], y[N];
    unsigned seed = 5;
    make_batch(&seed, x, y, N);
    double l, a;
    CHECK_ERR(gp_run_prepare(NULL), GP_ERR_INVALID, "gp_run_prepare: the run is NULL");
    /* named as the caller calls it, not by the library's own functions */
    CHECK_ERR(gp_run_step(NULL, x, y, N, 0, NULL), GP_ERR_INVALID, "gp_run_step: the run is NULL");
    gp_decoder *dec = NULL;
    CHECK_ERR(gp_decoder_open(NULL, 1, &dec), GP_ERR_INVALID, "gp_decoder_open: the run is NULL");
    /* every call that takes a run, each by its own name (gp_run_train was
     * named gp_run_train_ex, gp_run_device_memory gp_gp_run_device_memory) */
    CHECK_ERR(gp_run_evaluate(NULL, x, y, N, &l, &a), GP_ERR_INVALID,
              "gp_run_evaluate: the run is NULL");
    CHECK_ERR(gp_run_train(NULL, NULL, NULL), GP_ERR_INVALID, "gp_run_train: the run is NULL");
    CHECK_ERR(gp_run_train_ex(NULL, NULL, NULL), GP_ERR_INVALID,
              "gp_run_train_ex: the run is NULL");
    CHECK_ERR(gp_run_export_weights(NULL, "w"), GP_ERR_INVALID,
              "gp_run_export_weights: the run is NULL");
    CHECK_ERR(gp_run_summary(NULL, NULL), GP_ERR_INVALID, "gp_run_summary: the run is NULL");
    CHECK_ERR(gp_run_device_memory(NULL, 0, NULL, NULL, NULL), GP_ERR_INVALID,
              "gp_run_device_memory: the run is NULL");
    CHECK_ERR(gp_run_inference_only(NULL), GP_ERR_INVALID,
              "gp_run_inference_only: the run is NULL");
    CHECK_ERR(gp_run_predict(NULL, x, N, y), GP_ERR_INVALID, "gp_run_predict: the run is NULL");
    CHECK_ERR(gp_run_check_output(NULL, "w", "--x"), GP_ERR_INVALID,
              "gp_run_check_output: the run is NULL");
    CHECK(gp_run_devices(NULL) == 0);
    gp_run_stop(NULL, 2);
    gp_run *run = NULL;
    CHECK(gp_run_parse("api.yaml", NULL, NULL, 0, &run) == GP_ERR_INVALID && !run);
    CHECK(gp_run_parse("api.yaml", k_yaml, NULL, 2, &run) == GP_ERR_INVALID && !run);
    const char *one_null[] = {"train.seed=4", NULL};
    CHECK(gp_run_parse("api.yaml", k_yaml, one_null, 2, &run) == GP_ERR_INVALID && !run);

    /* labels: a bad one named by its row in the caller's batch (row 30 is
     * in micro-batch 3, and in the evaluation's fourth piece of 8) */
    const char *ev8[] = {"train.eval_batch_size=8"};
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, ev8, 1, &run));
    if (!run) return;
    y[30] = 7;
    CHECK_ERR(gp_run_step(run, x, y, N, 0, NULL), GP_ERR_DATA, "label 7 in row 30 of the batch");
    CHECK_ERR(gp_run_evaluate(run, x, y, N, &l, &a), GP_ERR_DATA,
              "label 7 in row 30 of the batch");
    gp_run_free(run);
    /* with replicas too: replica 1's share starts at row 16 */
    const char *rep[] = {"train.eval_batch_size=8", "pipeline.replicas=2",
                         "pipeline.devices=[[cpu:0, cpu:1], [cpu:2, cpu:3]]"};
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, rep, 3, &run));
    if (!run) return;
    CHECK_ERR(gp_run_step(run, x, y, N, 0, NULL), GP_ERR_DATA, "label 7 in row 30 of the batch");
    y[30] = 1.5f;
    CHECK_ERR(gp_run_step(run, x, y, N, 0, NULL), GP_ERR_DATA,
              "label 1.5 in row 30 of the batch is not a whole number");
    y[30] = 1;
    gp_run_free(run);

    /* lr_scaling without a schedule: base 0.1 x 32 / 16 */
    const char *sc[] = {"train.lr_scaling=linear", "train.base_batch=16"};
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, sc, 2, &run));
    if (!run) return;
    gp_metrics m;
    CHECK(gp_run_step(run, NULL, y, N, 0, &m) == GP_ERR_INVALID);
    CHECK(gp_run_step(run, x, y, 0, 0, &m) == GP_ERR_INVALID);
    CHECK_OK(gp_run_step(run, x, y, N, 0, &m));
    CHECK_NEAR(m.lr, 0.2, 0.0, 1e-6);

    /* a NaN or Inf input is refused before anything is computed, named by
     * its sample and index; the model is as it was and the run goes on */
    char before[320], after[320];
    snprintf(before, sizeof before, "%s/in-before.safetensors", tmpdir);
    snprintf(after, sizeof after, "%s/in-after.safetensors", tmpdir);
    CHECK_OK(gp_run_export_weights(run, before));
    x[5] = NAN;
    CHECK_ERR(gp_run_step(run, x, y, N, 0, &m), GP_ERR_DATA,
              "gp_run_step: input x[5] is NaN (sample 0, index (0, 1, 1) of the batch)");
    CHECK_ERR(gp_run_evaluate(run, x, y, N, &l, &a), GP_ERR_DATA,
              "gp_run_evaluate: input x[5] is NaN (sample 0, index (0, 1, 1) of the batch)");
    x[5] = 0.5f;
    x[30 * 16 + 14] = -INFINITY;
    CHECK_ERR(gp_run_step(run, x, y, N, 0, &m), GP_ERR_DATA,
              "input x[494] is -Inf (sample 30, index (0, 3, 2) of the batch)");
    x[30 * 16 + 14] = 0.25f;
    CHECK_OK(gp_run_export_weights(run, after));
    size_t nb = 0, na = 0;
    char *wb = gpt_read_file(before, &nb), *wa = gpt_read_file(after, &na);
    CHECK_MSG(wb && wa && nb == na && !memcmp(wb, wa, nb),
              "the model changed in a step refused for its input");
    free(wb);
    free(wa);
    CHECK_OK(gp_run_step(run, x, y, N, 0, &m));
    CHECK(m.step == 2 && isfinite(m.loss));
    gp_run_free(run);

    /* a step whose update overflows the model (lr 1e38) fails after that
     * update (GP_ERR_NUMERIC), and the run refuses to go on with (or
     * write) what it left */
    const char *huge[] = {"train.optimizer.lr=1e38"};
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, huge, 1, &run));
    if (!run) return;
    gp_status s = GP_OK;
    int failed = 0;
    while (s == GP_OK && failed < 6) {
        failed++;
        s = gp_run_step(run, x, y, N, 0, &m);
    }
    CHECK_MSG(s == GP_ERR_NUMERIC, "lr 1e38: %d steps, then %s", failed, gp_status_name(s));
    char left[64];
    snprintf(left, sizeof left, "step %d left NaN or Inf in the model", failed);
    CHECK_ERR(gp_run_step(run, x, y, N, 0, &m), GP_ERR_NUMERIC, left);
    CHECK(gp_run_evaluate(run, x, y, N, &l, &a) == GP_ERR_NUMERIC);
    char wpath[320];
    snprintf(wpath, sizeof wpath, "%s/nan.safetensors", tmpdir);
    CHECK(gp_run_export_weights(run, wpath) == GP_ERR_NUMERIC && file_size(wpath) < 0);
    gp_run_free(run);

    /* with clipping the same blow-up is found before the update: the step
     * fails saying so, the model is as it was (an export before and after
     * are the same bytes), and the run is not refused: a later step meets
     * the clipping check again, not the diverged run's refusal */
    const char *clip[] = {"train.optimizer.lr=1e38", "train.clip_grad_norm=1"};
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, clip, 2, &run));
    if (!run) return;
    s = GP_OK;
    failed = 0;
    while (s == GP_OK && failed < 6) {
        CHECK_OK(gp_run_export_weights(run, before));
        failed++;
        s = gp_run_step(run, x, y, N, 0, &m);
    }
    CHECK_MSG(s == GP_ERR_NUMERIC && failed > 1, "lr 1e38, clipped: %d steps, then %s", failed,
              gp_status_name(s));
    CHECK(strstr(gp_last_error(), "the gradients are not finite (global norm") != NULL);
    CHECK(strstr(gp_last_error(), "the update was skipped") != NULL);
    CHECK_OK(gp_run_export_weights(run, after));
    wb = gpt_read_file(before, &nb);
    wa = gpt_read_file(after, &na);
    CHECK_MSG(wb && wa && nb == na && !memcmp(wb, wa, nb),
              "the model changed in a step that failed before its update");
    free(wb);
    free(wa);
    CHECK_ERR(gp_run_step(run, x, y, N, 0, &m), GP_ERR_NUMERIC, "the gradients are not finite");
    CHECK(strstr(gp_last_error(), "left NaN or Inf in the model") == NULL);
    gp_run_free(run);

    /* a summary that cannot be written is an error */
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    if (!run) return;
    FILE *full = fopen("/dev/full", "w");
    if (full) {
        CHECK(gp_run_summary(run, full) == GP_ERR_IO);
        fclose(full);
    }
    /* a zeroed options struct: no outputs; a stop asked without a signal */
    gp_train_options z;
    memset(&z, 0, sizeof z);
    z.quiet = 1;
    gp_run_stop(run, 0);
    memset(&m, 0x7f, sizeof m); /* stopped before a step: *out says nothing was trained */
    CHECK_ERR(gp_run_train_ex(run, &z, &m), GP_ERR_STOPPED, "a stop request (gp_run_stop)");
    CHECK_MSG(m.step == 0 && isnan(m.loss) && isnan(m.lr) && isnan(m.test_loss),
              "stopped before a step: *out step %lld, loss %g", (long long)m.step, m.loss);
    CHECK_ERR(gp_run_train_ex(run, &z, &m), GP_ERR_STOPPED, "a stop request"); /* it stays */
    gp_run_stop_clear(run);
    CHECK_OK(gp_run_train_ex(run, &z, &m));
    CHECK(m.step == 6);
    gp_run_stop_clear(NULL);
    gp_run_free(run);

    /* the version is the header's */
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d.%d", GPIPE_VERSION_MAJOR, GPIPE_VERSION_MINOR,
             GPIPE_VERSION_PATCH);
    CHECK_MSG(!strcmp(gp_version(), ver), "gp_version %s, header %s", gp_version(), ver);
    CHECK_ERR(gp_set_log_level("loud"), GP_ERR_INVALID, "debug, info, warn, error or quiet");
}

/* What the run writes on stderr while `fn` runs. */
static char *stderr_of(void (*fn)(void *), void *arg)
{
    char path[300];
    snprintf(path, sizeof path, "%s/stderr.txt", tmpdir);
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w");
    if (saved < 0 || !f) return NULL;
    dup2(fileno(f), 2);
    fclose(f);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    f = fopen(path, "r");
    char *text = calloc(1, 65536);
    if (f && text) text[fread(text, 1, 65535, f)] = '\0';
    if (f) fclose(f);
    return text;
}

typedef struct {
    const char *snapshot;
    int quiet;
    gp_status s;
    const char *steps; /* the train.steps override; NULL: train.steps=8 */
    gp_metrics m;      /* what the run reports */
} train_arg;

/* k_yaml trained (8 steps), resumed from `snapshot` when given */
static void train_quietly(void *p)
{
    train_arg *a = p;
    gp_run *run = NULL;
    const char *ov[] = {a->steps ? a->steps : "train.steps=8"};
    a->s = gp_run_parse("api.yaml", k_yaml, ov, 1, &run);
    gp_train_options o = GP_TRAIN_OPTIONS_INIT;
    o.quiet = a->quiet;
    o.resume = a->snapshot;
    if (a->s == GP_OK) a->s = gp_run_train_ex(run, &o, &a->m);
    gp_run_free(run);
}

/* gp_train_options.quiet leaves warnings and errors only, also when it
 * resumes (a library caller's own snapshot: the run says that it records
 * no data position, a warning); gp_set_log_level("quiet") leaves nothing;
 * the default level says what it resumed from. */
static void test_quiet(void)
{
    char snap[300];
    snprintf(snap, sizeof snap, "%s/quiet.safetensors", tmpdir);
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    enum { N = 32 };
    float x[N * 16], y[N];
    unsigned seed = 5;
    make_batch(&seed, x, y, N);
    CHECK_OK(gp_run_step(run, x, y, N, 0, NULL));
    CHECK_OK(gp_run_save(run, snap));
    gp_run_free(run);

    train_arg a = {.snapshot = snap, .quiet = 1};
    char *said = stderr_of(train_quietly, &a);
    CHECK_OK(a.s);
    CHECK_MSG(said && !strstr(said, "info:") && strstr(said, "records no data position"),
              "quiet, resumed: %s", said ? said : "(nothing captured)");
    free(said);
    a.quiet = 0;
    said = stderr_of(train_quietly, &a);
    CHECK_OK(a.s);
    CHECK_MSG(said && strstr(said, "info: resuming from") && strstr(said, snap),
              "default level, resumed: %s", said ? said : "(nothing captured)");
    free(said);
    CHECK_OK(gp_set_log_level("quiet"));
    said = stderr_of(train_quietly, &a);
    CHECK_OK(a.s);
    CHECK_MSG(said && !said[0], "log level quiet: %s", said ? said : "(nothing captured)");
    free(said);
    CHECK_OK(gp_set_log_level(NULL));
}

/* A run resumed past its end trains nothing: quiet still says so (a
 * warning), and its metrics have no last step (NaN, not a loss of 0 that
 * reads as a perfect model). */
static void test_past_end(void)
{
    char snap[300];
    snprintf(snap, sizeof snap, "%s/past-end.safetensors", tmpdir);
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    if (!run) return;
    gp_metrics m;
    enum { N = 32 };
    float x[N * 16], y[N];
    unsigned seed = 9;
    make_batch(&seed, x, y, N);
    CHECK_OK(gp_run_step(run, x, y, N, 0, NULL));
    CHECK_OK(gp_run_step(run, x, y, N, 0, &m));
    CHECK(m.step == 2 && isfinite(m.loss) && isfinite(m.lr));
    CHECK_OK(gp_run_save(run, snap));
    gp_run_free(run);

    train_arg a = {.snapshot = snap, .quiet = 1, .steps = "train.steps=1"};
    char *said = stderr_of(train_quietly, &a);
    CHECK_OK(a.s);
    CHECK_MSG(said && strstr(said, "warning:") &&
                  strstr(said, "resumed at step 2, past this run's 1 steps"),
              "quiet, resumed past the end: %s", said ? said : "(nothing captured)");
    CHECK_MSG(a.m.step == 2 && isnan(a.m.loss) && isnan(a.m.accuracy) && isnan(a.m.lr),
              "resumed past the end: step %lld loss %g accuracy %g", (long long)a.m.step,
              a.m.loss, a.m.accuracy);
    free(said);
}

/* train.epochs times the batches of an epoch past what a run counts
 * (int64 steps, and samples seen) is refused naming train.epochs; it
 * wrapped, and the run said "nothing left to train" and ended well, or
 * advised raising train.steps past a negative total. */
static void test_epochs_overflow(void)
{
    static const char *yaml =
        "model: {input: [1], layers: [flatten, {linear: {out: 2}}]}\n"
        "data:\n"
        "  dataset: synthetic\n"
        "  synthetic: {train: 16777216, test: 16, classes: 2, shape: [1]}\n"
        "train: {batch_size: 1, epochs: 1099511627776, log_every: 0}\n";
    for (int q = 0; q < 2; q++) {
        gp_run *run = NULL;
        const char *ov[] = {q ? "train.epochs=1000" : "train.epochs=1099511627776",
                            "train.steps=2"};
        CHECK_OK(gp_run_parse("epochs.yaml", yaml, ov, q ? 2 : 1, &run));
        if (!run) return;
        gp_train_options o = GP_TRAIN_OPTIONS_INIT;
        o.quiet = 1;
        gp_metrics m;
        gp_status s = gp_run_train_ex(run, &o, &m);
        if (q) /* the same data and train.steps: trains */
            CHECK_MSG(s == GP_OK && m.step == 2, "2 steps: %s", gp_last_error());
        else
            CHECK_ERR(s, GP_ERR_INVALID, "train.epochs = 1099511627776 of 16777216 batches");
        gp_run_free(run);
    }
}

/* A batch larger than the training split says what to change, and
 * names data.train_limit where that is what made the split small (it
 * said only "exceeds the 16 training samples"). */
static void test_batch_past_split(void)
{
    for (int q = 0; q < 2; q++) {
        gp_run *run = NULL;
        const char *ov[] = {q ? "data.synthetic.train=16" : "data.train_limit=16"};
        CHECK_OK(gp_run_parse("api.yaml", k_yaml, ov, 1, &run));
        if (!run) return;
        gp_train_options o = GP_TRAIN_OPTIONS_INIT;
        o.quiet = 1;
        CHECK_ERR(gp_run_train_ex(run, &o, NULL), GP_ERR_INVALID,
                  q ? "exceeds the 16 training samples; lower train.batch_size to 16 or less"
                    : "exceeds the 16 training samples data.train_limit keeps; lower "
                      "train.batch_size to 16 or less, or raise data.train_limit");
        gp_run_free(run);
    }
}

/* gp_run_save and gp_run_export_weights refuse to write over the run's
 * config file (gp_run_train_ex refused the same; these replaced it). */
static void test_outputs_spare_config(void)
{
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/spare.yaml", tmpdir);
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(k_yaml, f);
    fclose(f);
    gp_run *run = NULL;
    CHECK_OK(gp_run_load(cfg, NULL, 0, &run));
    if (!run) return;
    CHECK_ERR(gp_run_export_weights(run, cfg), GP_ERR_INVALID, "is the run's config");
    CHECK_ERR(gp_run_save(run, cfg), GP_ERR_INVALID, "is the run's config");
    gp_run_free(run);
    run = NULL;
    CHECK_OK(gp_run_load(cfg, NULL, 0, &run)); /* still the YAML it was */
    gp_run_free(run);
}

/* A model its loss cannot take (cross_entropy after a convolution) is said
 * as such by gp_run_describe (which reported success) and by the first
 * step (which failed while profiling, and said so). */
static void test_output_loss_mismatch(void)
{
    static const char *yaml =
        "model:\n"
        "  input: [1, 4, 4]\n"
        "  layers: [{conv2d: {out: 4, kernel: 1}}, relu, {conv2d: {out: 4, kernel: 1}}]\n"
        "data: {dataset: synthetic, synthetic: {train: 32, test: 8, classes: 4, "
        "shape: [1, 4, 4]}}\n"
        "pipeline: {devices: [cpu:0, cpu:1], threads: 1}\n"
        "train: {batch_size: 8, steps: 1}\n";
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("ce.yaml", yaml, NULL, 0, &run));
    if (!run) return;
    gp_run_info info;
    CHECK_ERR(gp_run_describe(run, &info), GP_ERR_INVALID,
              "ce.yaml: the model's output is (4, 4, 4) per sample but cross_entropy "
              "(model.loss's default) needs (N, classes)");
    float x[8 * 16] = {0}, y[8] = {0};
    gp_status s = gp_run_step(run, x, y, 8, 0, NULL);
    CHECK_MSG(s == GP_ERR_INVALID && strstr(gp_last_error(), "end the model with flatten") &&
                  !strstr(gp_last_error(), "profiling"),
              "step: %s: %s", gp_status_name(s), gp_last_error());
    gp_run_free(run);
}

static void prepare_run(void *run) { CHECK_OK(gp_run_prepare(run)); }

static void train_run(void *run)
{
    gp_train_options o = GP_TRAIN_OPTIONS_INIT;
    o.quiet = 1;
    CHECK_OK(gp_run_train_ex(run, &o, NULL));
}

/* A library program started by mpirun as several processes: each process
 * trains its own copy (a sweep), and the first run says once that it does
 * not span them (each trained its own copy and wrote the same files
 * without a word); one process of one is not told.  An empty config or
 * resume path: GP_ERR_INVALID (they were I/O errors about a file '' while
 * an empty output path was invalid).  Messages name the library's
 * options. */
static void test_many_processes(void)
{
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    if (!run) return;
    /* an empty path is a bad argument, as an empty output path is */
    gp_run *none = NULL;
    CHECK_ERR(gp_run_load("", NULL, 0, &none), GP_ERR_INVALID, "the path is empty");
    gp_train_options o = GP_TRAIN_OPTIONS_INIT;
    o.resume = "";
    CHECK_ERR(gp_run_train_ex(run, &o, NULL), GP_ERR_INVALID, "resume is empty");
    /* messages name gp_train_options' fields and overrides, not
     * gpipe-train's flags */
    char same[300];
    snprintf(same, sizeof same, "%s/same.out", tmpdir);
    o.resume = NULL;
    o.metrics_path = o.trace_path = same;
    CHECK_ERR(gp_run_train_ex(run, &o, NULL), GP_ERR_INVALID,
              "gp_train_options.metrics_path and gp_train_options.trace_path name the same "
              "file");
    o.metrics_path = o.trace_path = NULL;
    o.resume = tmpdir;
    char dir_said[400];
    snprintf(dir_said, sizeof dir_said, "gp_train_options.resume = \"%s\" is a directory",
             tmpdir);
    CHECK_ERR(gp_run_train_ex(run, &o, NULL), GP_ERR_INVALID, dir_said);
    CHECK_MSG(strstr(gp_last_error(), "gp_train_options.resume = \"latest\" and "
                                      "train.snapshot.dir="), "%s", gp_last_error());
    const char *layer[] = {"model.layers.1={conv2d: {out: 4, kernel: 9}}"};
    gp_run *bad_layer = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, layer, 1, &bad_layer));
    gp_run_info info;
    if (bad_layer)
        CHECK_ERR(gp_run_describe(bad_layer, &info), GP_ERR_INVALID,
                  "from override model.layers.1={conv2d: {out: 4, kernel: 9}}");
    gp_run_free(bad_layer);
    const char *bad[] = {"train.steps="};
    CHECK_ERR(gp_run_parse("api.yaml", k_yaml, bad, 1, &none), GP_ERR_INVALID,
              "override train.steps=: empty value");
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    char *said = stderr_of(prepare_run, run);
    CHECK_MSG(said && !strstr(said, "several processes"), "one of one: %s", said ? said : "");
    free(said);
    gp_run_free(run);
    run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    said = stderr_of(prepare_run, run);
    CHECK_MSG(said && strstr(said, "warning: this program was started as one of several "
                                   "processes (mpirun or srun), and a gp_run does not span"),
              "one of two: %s", said ? said : "");
    free(said);
    said = stderr_of(train_run, run); /* (once a process) */
    CHECK_MSG(said && !strstr(said, "several processes"), "said again: %s", said ? said : "");
    free(said);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    gp_run_free(run);
}

/* A prepared run used in a child of fork(): refused (a step there waited
 * for ever on worker threads the child does not have), and freed there
 * without waiting for them; the parent's run goes on. */
static void test_fork(void)
{
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    if (!run) return;
    enum { N = 32 };
    float x[N * 16], y[N];
    unsigned seed = 6;
    make_batch(&seed, x, y, N);
    CHECK_OK(gp_run_step(run, x, y, N, 0, NULL));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30); /* (a hang ends the child, and the check below fails) */
        gp_status s = gp_run_step(run, x, y, N, 0, NULL);
        int ok = s == GP_ERR_INVALID && strstr(gp_last_error(), "a child of fork()");
        gp_run_free(run);
        _exit(ok ? 0 : 1);
    }
    CHECK(pid > 0);
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    CHECK_MSG(pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the child: %s %d", WIFEXITED(st) ? "exit" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    CHECK_OK(gp_run_step(run, x, y, N, 0, NULL));
    gp_run_free(run);
}

/* OpenMP's, declared here rather than through omp.h: the test is built
 * without -fopenmp and links the runtime through libgpipe */
int omp_get_max_threads(void);
void omp_set_num_threads(int n);

/* A CPU device sets the OpenMP thread count of the thread that runs its
 * ops, the caller's included (pipeline.threads: 1 here): every entry point
 * puts the caller's own count back. */
static void test_caller_threads(void)
{
    omp_set_num_threads(3);
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    if (!run) return;
    enum { N = 32 };
    float x[N * 16], y[N];
    unsigned seed = 4;
    make_batch(&seed, x, y, N);
    FILE *devnull = fopen("/dev/null", "w");
    gp_run_info info;
    struct {
        const char *what;
        gp_status s;
    } call[6];
    int k = 0;
    call[k].what = "gp_run_summary", call[k++].s = gp_run_summary(run, devnull);
    call[k].what = "gp_run_prepare", call[k++].s = gp_run_prepare(run);
    call[k].what = "gp_run_step", call[k++].s = gp_run_step(run, x, y, N, 0, NULL);
    call[k].what = "gp_run_evaluate", call[k++].s = gp_run_evaluate(run, x, y, N, NULL, NULL);
    call[k].what = "gp_run_describe", call[k++].s = gp_run_describe(run, &info);
    gp_train_options o = GP_TRAIN_OPTIONS_INIT;
    o.quiet = 1;
    call[k].what = "gp_run_train_ex", call[k++].s = gp_run_train_ex(run, &o, NULL);
    for (int i = 0; i < k; i++) CHECK_MSG(call[i].s == GP_OK, "%s failed", call[i].what);
    int after = omp_get_max_threads();
    CHECK_MSG(after == 3, "the caller's OpenMP threads: 3 before, %d after", after);
    gp_run_free(run);
    after = omp_get_max_threads();
    CHECK_MSG(after == 3, "after gp_run_free: %d OpenMP threads, not 3", after);
    run = NULL;
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, NULL, 0, &run));
    CHECK_OK(gp_run_step(run, x, y, N, 0, NULL)); /* (prepares on its own) */
    after = omp_get_max_threads();
    CHECK_MSG(after == 3, "after a first gp_run_step: %d OpenMP threads, not 3", after);
    gp_run_free(run);
    if (devnull) fclose(devnull);
}

/* A model with a skip across the stages: trained by gp_run_train_ex, the
 * run then steps on from it (the pipeline kept pointers into the model,
 * which must stay where it was built). */
static void test_train_then_step(void)
{
    static const char *yaml =
        "model:\n"
        "  input: [1, 4, 4]\n"
        "  layers: [flatten, {linear: {out: 16, stash: a}}, relu, {linear: {out: 16}},\n"
        "           {add: {pop: a}}, {linear: {out: 4}}]\n"
        "data:\n"
        "  dataset: synthetic\n"
        "  synthetic: {train: 64, test: 32, classes: 4, shape: [1, 4, 4]}\n"
        "pipeline: {devices: [cpu:0, cpu:1], balance: [3, 3], chunks: 2, threads: 1}\n"
        "train: {batch_size: 16, steps: 3, log_every: 0, optimizer: {lr: 0.05}}\n";
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("skip.yaml", yaml, NULL, 0, &run));
    if (!run) return;
    gp_train_options o = GP_TRAIN_OPTIONS_INIT;
    o.quiet = 1;
    gp_metrics m;
    CHECK_OK(gp_run_train_ex(run, &o, &m));
    CHECK(m.step == 3);
    enum { N = 16 };
    float x[N * 16], y[N];
    unsigned seed = 9;
    make_batch(&seed, x, y, N);
    CHECK_OK(gp_run_step(run, x, y, N, 0, &m));
    CHECK(m.step == 4 && isfinite(m.loss));
    gp_run_free(run);
}

static bool same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = false;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Steps `from` .. `to` - 1 of a fixed sequence of batches (batch k made
 * from seed 100 + k), each one's loss into losses[k]. */
static void steps(gp_run *run, int from, int to, double *losses)
{
    enum { N = 32 };
    float x[N * 16], y[N];
    for (int k = from; k < to; k++) {
        unsigned seed = 100u + (unsigned)k;
        make_batch(&seed, x, y, N);
        gp_metrics m;
        gp_status s = gp_run_step(run, x, y, N, 8, &m);
        CHECK_MSG(s == GP_OK, "step %d: %s", k, gp_last_error());
        losses[k] = s == GP_OK ? m.loss : NAN;
    }
}

/* gp_run_save / gp_run_restore from the caller's own loop: the steps after
 * a restore equal, bit for bit, the uninterrupted run's (dropout, batch
 * norm's statistics, momentum and the learning-rate schedule all carried),
 * restored into a run that went on past the snapshot, into a fresh run,
 * and with replicas (which a restore after steps must bring along);
 * gp_run_describe sizes the batches from the config alone. */
static void test_save_restore(const char *replicas)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model:\n"
             "  input: [1, 4, 4]\n"
             "  layers: [flatten, {linear: {out: 32}}, batchnorm, relu, {dropout: {p: 0.2}},\n"
             "           {linear: {out: 4}}]\n"
             "data:\n"
             "  dataset: synthetic\n"
             "  synthetic: {train: 128, test: 64, classes: 4, shape: [1, 4, 4]}\n"
             "pipeline: {devices: [cpu:0, cpu:1], chunks: 2, threads: 1, balance: [3, 3]%s}\n"
             "train:\n"
             "  batch_size: 32\n"
             "  seed: 3\n"
             "  log_every: 0\n"
             "  schedule: cosine\n"
             "  optimizer: {lr: 0.1, momentum: 0.9}\n",
             replicas);
    char snap[300], wa[300], wb[300], wc[300];
    snprintf(snap, sizeof snap, "%s/run.safetensors", tmpdir);
    snprintf(wa, sizeof wa, "%s/whole.safetensors", tmpdir);
    snprintf(wb, sizeof wb, "%s/restored.safetensors", tmpdir);
    snprintf(wc, sizeof wc, "%s/fresh.safetensors", tmpdir);
    double whole[5], back[5], fresh[5];
    gp_run *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(gp_run_parse("save.yaml", yaml, NULL, 0, &a));
    CHECK_OK(gp_run_parse("save.yaml", yaml, NULL, 0, &b));
    CHECK_OK(gp_run_parse("save.yaml", yaml, NULL, 0, &c));
    if (!a || !b || !c) goto out;

    gp_run_info info;
    CHECK_OK(gp_run_describe(c, &info));
    CHECK(info.input[0] == 1 && info.input[1] == 4 && info.input[2] == 4);
    CHECK(info.input_numel == 16 && info.output_numel == 4 && info.target_numel == 1);
    CHECK(info.batch_size == 32 && info.step == 0);
    /* 16x32 + 32, batch norm's 2 x 32, 32x4 + 4 */
    CHECK_MSG(info.parameters == 16 * 32 + 32 + 64 + 32 * 4 + 4, "parameters %lld",
              (long long)info.parameters);
    CHECK_MSG(info.devices == (replicas[0] ? 4 : 2), "devices %d", info.devices);
    CHECK(gp_run_devices(c) == 0); /* describing opened nothing */

    steps(a, 0, 5, whole);
    CHECK_OK(gp_run_export_weights(a, wa));

    steps(b, 0, 3, back);
    CHECK_OK(gp_run_save(b, snap));
    steps(b, 3, 5, back); /* past the snapshot: what the restore must undo */
    CHECK_OK(gp_run_restore(b, snap));
    CHECK_OK(gp_run_describe(b, &info));
    CHECK_MSG(info.step == 3, "restored to step %lld", (long long)info.step);
    steps(b, 3, 5, back);
    CHECK_OK(gp_run_export_weights(b, wb));

    CHECK_OK(gp_run_restore(c, snap)); /* before its first step */
    steps(c, 3, 5, fresh);
    CHECK_OK(gp_run_export_weights(c, wc));
    for (int k = 3; k < 5; k++)
        CHECK_MSG(back[k] == whole[k] && fresh[k] == whole[k],
                  "%s: step %d loss %.9g restored, %.9g fresh, %.9g whole",
                  replicas[0] ? "replicas" : "one pipeline", k, back[k], fresh[k], whole[k]);
    CHECK_MSG(same_bytes(wa, wb) && same_bytes(wa, wc),
              "the restored runs' weights differ from the uninterrupted run's");

    /* refusals leave the model as it was: the run steps on to the same
     * step 5 as before */
    if (!replicas[0]) {
        CHECK_OK(gp_run_restore(c, snap));
        CHECK_ERR(gp_run_restore(c, "/nonexistent/snap.safetensors"), GP_ERR_IO,
                  "/nonexistent/snap.safetensors");
        CHECK_ERR(gp_run_restore(c, wa), GP_ERR_DATA, "not a gpipe snapshot");
        CHECK_ERR(gp_run_restore(c, NULL), GP_ERR_INVALID, "path");
        /* "latest" from a directory not there, and from one with no
         * snapshot: said in the call's own words, not gpipe-train's
         * options' nor gp_train_options' */
        {
            gp_run *lr = NULL;
            char ov[400];
            snprintf(ov, sizeof ov, "train.snapshot.dir=%s/no-such-dir", tmpdir);
            const char *ovs[] = {ov};
            CHECK_OK(gp_run_parse("latest.yaml", k_yaml, ovs, 1, &lr));
            CHECK_ERR(gp_run_restore(lr, "latest"), GP_ERR_IO,
                      "gp_run_restore(\"latest\"): train.snapshot.dir '");
            CHECK_MSG(!strstr(gp_last_error(), "gp_train_options") &&
                          !strstr(gp_last_error(), "--"), "%s", gp_last_error());
            gp_run_free(lr);
            snprintf(ov, sizeof ov, "train.snapshot.dir=%s", tmpdir); /* (no snapshot-*) */
            CHECK_OK(gp_run_parse("latest.yaml", k_yaml, ovs, 1, &lr));
            CHECK_ERR(gp_run_restore(lr, "latest"), GP_ERR_IO,
                      "gp_run_restore(\"latest\"): no complete snapshot in");
            CHECK_MSG(!strstr(gp_last_error(), "--"), "%s", gp_last_error());
            gp_run_free(lr);
        }
        CHECK_ERR(gp_run_save(c, tmpdir), GP_ERR_IO, "is a directory");
        CHECK_ERR(gp_run_export_weights(c, tmpdir), GP_ERR_IO, "is a directory");
        CHECK_ERR(gp_run_save(c, NULL), GP_ERR_INVALID, "gp_run_save");
        CHECK_ERR(gp_run_save(NULL, snap), GP_ERR_INVALID, "NULL");
        CHECK_ERR(gp_run_restore(NULL, snap), GP_ERR_INVALID, "NULL");
        CHECK_ERR(gp_run_describe(NULL, &info), GP_ERR_INVALID, "NULL");
        CHECK_ERR(gp_run_describe(c, NULL), GP_ERR_INVALID, "NULL");
        gp_run *other = NULL;
        CHECK_OK(gp_run_parse("other.yaml", k_yaml, NULL, 0, &other));
        if (other) { /* another model: names and shapes do not match */
            CHECK(gp_run_restore(other, snap) == GP_ERR_INVALID);
            /* refused before the run was prepared: the model built for it
             * without random draws (the snapshot was to replace them) is
             * gone, and the next prepare draws them as a fresh run's */
            CHECK(gp_run_devices(other) == 0);
            char wo[300], wf[300];
            snprintf(wo, sizeof wo, "%s/other.safetensors", tmpdir);
            snprintf(wf, sizeof wf, "%s/other-fresh.safetensors", tmpdir);
            gp_run *twin = NULL;
            CHECK_OK(gp_run_parse("other.yaml", k_yaml, NULL, 0, &twin));
            CHECK_OK(gp_run_export_weights(other, wo));
            if (twin) CHECK_OK(gp_run_export_weights(twin, wf));
            CHECK_MSG(same_bytes(wo, wf), "a run whose first restore failed does not start "
                      "from a fresh run's drawn weights");
            gp_run_free(twin);
            gp_run_free(other);
        }
        steps(c, 3, 5, fresh);
        CHECK_MSG(fresh[4] == whole[4], "after refusals: step 4 loss %.9g, whole %.9g", fresh[4],
                  whole[4]);
    }
out:
    gp_run_free(a);
    gp_run_free(b);
    gp_run_free(c);
}

/* A step that runs out of a device's memory fails before its update: the
 * run goes on from the model as it was, step for step what a run that never
 * tried that batch computes. */
static void test_step_after_oom(void)
{
    static const char *ov[] = {"pipeline.devices=[{name: cpu:0, memory: 400KiB}, "
                               "{name: cpu:1, memory: 400KiB}]"};
    gp_run *a = NULL, *b = NULL;
    CHECK_OK(gp_run_parse("oom.yaml", k_yaml, ov, 1, &a));
    CHECK_OK(gp_run_parse("oom.yaml", k_yaml, ov, 1, &b));
    enum { BIG = 8192 };
    float *x = malloc(BIG * 16 * sizeof *x), *y = malloc(BIG * sizeof *y);
    if (!a || !b || !x || !y) goto out;
    unsigned seed = 21;
    make_batch(&seed, x, y, BIG);
    double la[3], lb[3];
    steps(a, 0, 1, la);
    steps(b, 0, 1, lb);
    CHECK_ERR(gp_run_step(a, x, y, BIG, 0, NULL), GP_ERR_OOM, "out of memory");
    steps(a, 1, 3, la);
    steps(b, 1, 3, lb);
    for (int k = 0; k < 3; k++)
        CHECK_MSG(la[k] == lb[k], "step %d after a step out of memory: loss %.9g, %.9g without it",
                  k, la[k], lb[k]);
out:
    free(x);
    free(y);
    gp_run_free(a);
    gp_run_free(b);
}

/* gp_run_inference_only (issue 77): a run for predicting alone gives the
 * trained-for run's outputs bit for bit, holds no gradients or optimizer
 * state, and refuses steps; once prepared it is too late to ask. */
static void test_inference_only(void)
{
    enum { N = 8 };
    float x[N * 16], y[N];
    unsigned seed = 11;
    make_batch(&seed, x, y, N);
    gp_run *a = NULL, *b = NULL;
    const char *adam[] = {"train.optimizer={type: adamw, lr: 0.001}"};
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, adam, 1, &a));
    CHECK_OK(gp_run_parse("api.yaml", k_yaml, adam, 1, &b));
    if (!a || !b) return;
    CHECK_OK(gp_run_inference_only(a));
    gp_run_info ia;
    CHECK_OK(gp_run_describe(a, &ia));
    float *oa = calloc((size_t)(N * ia.output_numel), sizeof *oa);
    float *ob = calloc((size_t)(N * ia.output_numel), sizeof *ob);
    CHECK_OK(gp_run_predict(a, x, N, oa));
    CHECK_OK(gp_run_predict(b, x, N, ob));
    CHECK_MSG(!memcmp(oa, ob, (size_t)(N * ia.output_numel) * sizeof *oa),
              "an inference-only run predicts the same bits");
    size_t peak_a = 0, peak_b = 0, cur_a = 0, cur_b = 0;
    const char *name = NULL;
    CHECK_OK(gp_run_device_memory(a, 0, &name, &peak_a, &cur_a));
    CHECK_OK(gp_run_device_memory(b, 0, &name, &peak_b, &cur_b));
    CHECK_MSG(cur_a < cur_b, "it holds less (no gradients, no moments): %zu bytes against %zu",
              cur_a, cur_b);
    CHECK_ERR(gp_run_step(a, x, y, N, 0, NULL), GP_ERR_INVALID, "inference only");
    char snap[400];
    snprintf(snap, sizeof snap, "%s/inference.safetensors", tmpdir);
    CHECK_ERR(gp_run_save(a, snap), GP_ERR_INVALID, "no optimizer state to save");
    CHECK(access(snap, F_OK) != 0);
    CHECK_ERR(gp_run_inference_only(b), GP_ERR_INVALID, "prepared already");
    free(oa);
    free(ob);
    gp_run_free(a);
    gp_run_free(b);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gpipe_apiXXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_evaluate_and_export();
    test_summary();
    test_train_ex();
    test_misuse();
    test_train_then_step();
    test_save_restore("");
    test_save_restore(", replicas: 2");
    test_quiet();
    test_past_end();
    test_epochs_overflow();
    test_batch_past_split();
    test_caller_threads();
    test_outputs_spare_config();
    test_output_loss_mismatch();
    test_many_processes();
    test_fork();
    test_step_after_oom();
    test_inference_only();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return gpt_finish("test_api");
}
