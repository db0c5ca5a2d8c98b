/*
 * bench_trace — what --trace costs.  The executor records its event log on
 * every step whether or not a trace is wanted (a few stores and two clock
 * reads per instruction), so the cost of tracing is gp_trace_add_step: the
 * JSON written after each recorded step.  Issue 5 bounds it at 2% of the
 * step time.
 *
 * For a model config on 2 CPU devices (1 thread each) and m micro-batches,
 * it runs the same steps twice, interleaved: once bare, once followed by
 * gp_trace_add_step into a real file, and prints the median step time, the
 * median trace-writing time, their ratio, and the end-to-end ratio
 * (step + trace) / step.  A last row uses trivial layers (almost no compute,
 * many instructions): the worst case, not a real run.
 *
 * usage: bench_trace [--steps N] [--batch B] [CONFIG.yaml]  (default bench/mlp.yaml, batch 64)
 * Benchmarks print; they never fail a build.
 */
#include "pipeline/pipeline.h"
#include "trace/trace.h"
#include "train/train.h"

#include "bench_util.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


typedef struct {
    double bare;     /* median step seconds without tracing */
    double traced;   /* median step + gp_trace_add_step seconds */
    double write;    /* median gp_trace_add_step seconds */
    int events;      /* events per step, all devices */
    long bytes;      /* trace bytes per step */
} result;

static gp_status run(const gp_config *base, int m, int steps, const char *path, result *r)
{
    gp_config cfg = *base;
    cfg.pipeline.chunks = m;
    gp_bench_cpu_devices(&cfg, 2);
    cfg.pipeline.n_balance = 0;
    gp_device *devs[GP_MAX_DEVICES];
    gp_model model;
    GP_TRY(gp_train_open(&cfg, devs, &model, true));
    int64_t b = cfg.train.batch_size, per = gp_shape_numel(&model.input);
    float *x, *y;
    gp_bench_random_batch(b, per, 5, 6, &x, &y);
    double *bare = malloc((size_t)steps * sizeof *bare), *traced = malloc((size_t)steps * sizeof *traced),
           *write = malloc((size_t)steps * sizeof *write);
    gp_trace *t = NULL;
    gp_status s = gp_trace_open(path, 0, -1, &t);
    for (int w = 0; w < 2 && s == GP_OK; w++)
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, NULL);
    memset(r, 0, sizeof *r);
    for (int it = 0; it < steps && s == GP_OK; it++) {
        double t0 = gp_now();
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, NULL);
        bare[it] = gp_now() - t0;
        if (s != GP_OK) break;
        t0 = gp_now();
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, NULL);
        double t1 = gp_now();
        if (s == GP_OK) s = gp_trace_add_step(t, model.pipe, devs, it, 0, 1);
        double t2 = gp_now();
        traced[it] = t2 - t0;
        write[it] = t2 - t1;
    }
    if (s == GP_OK) {
        r->bare = gp_bench_median(bare, steps);
        r->traced = gp_bench_median(traced, steps);
        r->write = gp_bench_median(write, steps);
        for (int j = 0; j < 2; j++) {
            int cnt;
            gp_pipeline_events(model.pipe, j, &cnt);
            r->events += cnt;
        }
    }
    gp_status cs = gp_trace_close(t);
    if (s == GP_OK) s = cs;
    FILE *f = fopen(path, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        r->bytes = ftell(f) / steps;
        fclose(f);
    }
    free(bare);
    free(traced);
    free(write);
    free(x);
    free(y);
    gp_model_free(&model);
    for (int j = 0; j < 2; j++) gp_device_close(devs[j]);
    return s;
}

static void print_row(const char *what, int m, const result *r)
{
    printf("%-16s %4d %8d %10ld %10.3f %10.3f %9.2f%% %9.3f\n", what, m, r->events, r->bytes,
           r->bare * 1e3, r->write * 1e3, 100.0 * r->write / r->bare, r->traced / r->bare);
}

static gp_layer_spec trivial_layers[8];

int main(int argc, char **argv)
{
    int steps = 10, batch = 64;
    const char *path = GPIPE_SOURCE_DIR "/bench/mlp.yaml";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            puts("usage: bench_trace [--steps N] [--batch B] [CONFIG.yaml]");
            return 0;
        } else path = argv[i];
    }
    if (steps < 1) steps = 1;
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) {
        fprintf(stderr, "bench_trace: %s\n", gp_last_error());
        return 1;
    }
    if (batch > 0) cfg.train.batch_size = batch;
    char out[] = "/tmp/bench_trace_XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0) {
        perror("bench_trace: mkstemp");
        return 1;
    }
    close(fd);
    printf("%s, batch %lld, 2 CPU devices x 1 thread, lockstep; median of %d steps\n\n", path,
           (long long)cfg.train.batch_size, steps);
    printf("%-16s %4s %8s %10s %10s %10s %10s %9s\n", "model", "m", "events", "bytes/step",
           "step ms", "trace ms", "trace/step", "e2e ratio");
    int ms[] = {1, 4, 16};
    for (int q = 0; q < 3; q++) {
        result r;
        if (run(&cfg, ms[q], steps, out, &r) != GP_OK) {
            fprintf(stderr, "bench_trace: %s\n", gp_last_error());
            remove(out);
            return 1;
        }
        print_row("config", ms[q], &r);
    }
    /* Worst case: trivial layers, so a step is nearly all executor work and
     * each instruction's slice costs the most relative to it. */
    gp_config t = cfg;
    trivial_layers[0] = gp_layer_spec_default(GP_LAYER_FLATTEN);
    for (int k = 1; k < 4; k++) trivial_layers[k] = gp_layer_spec_default(GP_LAYER_RELU);
    trivial_layers[4] = gp_layer_spec_default(GP_LAYER_LINEAR);
    trivial_layers[4].out = 10; /* the labels are i % 10 */
    t.model.layers = trivial_layers;
    t.model.n_layers = 5;
    t.model.input[0] = 1;
    t.model.input[1] = 1;
    t.model.input[2] = 2;
    t.train.batch_size = 64;
    result r;
    if (run(&t, 64, steps, out, &r) == GP_OK) print_row("trivial layers", 64, &r);
    else fprintf(stderr, "bench_trace: trivial layers: %s\n", gp_last_error());
    remove(out);
    gp_config_free(&cfg);
    return 0;
}
