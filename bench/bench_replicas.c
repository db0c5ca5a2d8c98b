/*
 * bench_replicas — data-parallel scaling on the CPU (issue: data
 * parallelism): R replicas x 1 stage, 1 math thread per device, against
 * 1 replica with 1 thread, on the same global batch of a model config.
 *
 * Prints, per configuration, the median step time, samples/s, the median of
 * the longest gradient all-reduce of a step (it includes waiting for the
 * slower replica), and the throughput ratio to 1 replica (bar: >= 1.7 for
 * 2 replicas on bench/mlp.yaml).
 *
 * usage: bench_replicas [--steps N] [--replicas R] [CONFIG.yaml]
 * (defaults: 8 timed steps after 2 warm-up steps, R = 2, bench/mlp.yaml).
 * Benchmarks print; they never fail a build.
 */
#include "train/train.h"

#include "bench_util.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
    double step, allreduce;
} result;

static int run(const gp_config *cfg, int R, int steps, const float *x, const float *y,
               int64_t batch, result *out)
{
    gp_device *devs[GP_MAX_DEVICES] = {0};
    gp_device_opts o = {.threads = 1};
    for (int r = 0; r < R; r++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%d", r);
        if (gp_device_open(name, &o, &devs[r]) != GP_OK) return 1;
    }
    gp_device_bind_thread(devs[0]);
    int bal = cfg->model.n_layers;
    gp_model m;
    if (gp_model_build_replicated(cfg, devs, R, 1, &bal, &m) != GP_OK) {
        fprintf(stderr, "bench_replicas: %s\n", gp_last_error());
        return 1;
    }
    double *ts = malloc((size_t)steps * sizeof *ts), *ar = malloc((size_t)steps * sizeof *ar);
    int rc = 0;
    for (int s = -2; s < steps; s++) {
        gp_step_stats st;
        if (gp_model_pipeline_step(&m, cfg, x, y, batch, 0.001, &st) != GP_OK) {
            fprintf(stderr, "bench_replicas: %s\n", gp_last_error());
            rc = 1;
            break;
        }
        if (s >= 0) {
            ts[s] = st.seconds;
            ar[s] = st.allreduce_seconds;
        }
    }
    if (!rc) {
        out->step = gp_bench_median(ts, steps);
        out->allreduce = gp_bench_median(ar, steps);
    }
    free(ts);
    free(ar);
    gp_model_free(&m);
    for (int r = 0; r < R; r++) gp_device_close(devs[r]);
    return rc;
}

int main(int argc, char **argv)
{
    const char *path = GPIPE_SOURCE_DIR "/bench/mlp.yaml";
    int steps = 8, R = 2;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--steps") && a + 1 < argc) steps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--replicas") && a + 1 < argc) R = atoi(argv[++a]);
        else path = argv[a];
    }
    if (steps < 1) steps = 1;
    if (R < 2 || R > 8) R = 2;
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) {
        fprintf(stderr, "bench_replicas: %s\n", gp_last_error());
        return 1;
    }
    int64_t batch = cfg.train.batch_size;
    int64_t per = cfg.model.input[0] * cfg.model.input[1] * cfg.model.input[2];
    float *x, *y;
    gp_bench_random_batch(batch, per, 1, 2, &x, &y);
    int64_t params = 0;
    {
        gp_device *d;
        gp_device_opts o = {.threads = 1};
        gp_model m;
        if (gp_device_open("cpu:0", &o, &d) == GP_OK) {
            if (gp_model_build(&cfg, d, &m) == GP_OK) {
                params = gp_model_param_count(&m);
                gp_model_free(&m);
            }
            gp_device_close(d);
        }
    }
    printf("bench_replicas: %s, global batch %lld, %d micro-batch(es) per replica, %lld "
           "parameters (%.1f MB of gradients), 1 math thread per device\n", path,
           (long long)batch, cfg.pipeline.chunks > 0 ? cfg.pipeline.chunks : 1,
           (long long)params, (double)params * 4 / 1e6);
    printf("  %-22s %10s %12s %14s %10s\n", "configuration", "step ms", "samples/s",
           "all-reduce ms", "ratio");
    result one, many;
    if (run(&cfg, 1, steps, x, y, batch, &one)) return 1;
    printf("  %-22s %10.1f %12.1f %14s %10s\n", "1 replica x 1 stage", one.step * 1e3,
           (double)batch / one.step, "-", "1.00");
    if (run(&cfg, R, steps, x, y, batch, &many)) return 1;
    char label[64];
    snprintf(label, sizeof label, "%d replicas x 1 stage", R);
    printf("  %-22s %10.1f %12.1f %14.1f %10.2f\n", label, many.step * 1e3,
           (double)batch / many.step, many.allreduce * 1e3, one.step / many.step);
    printf("bench_replicas: throughput ratio %.2f with %d replicas (bar >= %.1f for 2), "
           "all-reduce %.0f%% of the step\n", one.step / many.step, R, 1.7,
           100 * many.allreduce / many.step);
    free(x);
    free(y);
    gp_config_free(&cfg);
    return 0;
}
