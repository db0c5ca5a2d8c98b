/*
 * bench_replicas — data-parallel scaling on the CPU (issue: data
 * parallelism): R replicas x 1 stage, 1 math thread per device, against
 * 1 replica with 1 thread, on the same global batch of a model config.
 *
 * Prints, per configuration, the median step time, samples/s, the median of
 * the longest time a worker spent in collectives in a step (on the one
 * stage: the fused sharded update, i.e. gradient sum + SGD on the replica's
 * chunk + parameter all-gather, gp_dev_sharded_sgd; including
 * waiting for the slower replica), and the throughput ratio to 1 replica
 * (bar: >= 1.7 for 2 replicas on bench/mlp.yaml).  The two configurations'
 * steps alternate, so both see the same machine.
 *
 * usage: bench_replicas [--steps N] [--replicas R] [CONFIG.yaml]
 * (defaults: 20 timed steps after 2 warm-up steps, R = 2, bench/mlp.yaml).
 * Benchmarks print; they never fail a build.
 */
#include "train/train.h"

#include "bench_util.h"
#include <stdlib.h>
#include <string.h>

/* One configuration: R replicas x 1 stage on cpu:0 .. cpu:R-1, 1 thread each. */
typedef struct {
    int R;
    gp_device *devs[GP_MAX_DEVICES];
    gp_model m;
    double *ts, *ar;      /* per timed step: wall, longest all-reduce */
} config_run;

static int setup(const gp_config *cfg, int R, int steps, config_run *c)
{
    memset(c, 0, sizeof *c);
    c->R = R;
    gp_device_opts o = {.threads = 1};
    for (int r = 0; r < R; r++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%d", r);
        if (gp_device_open(name, &o, &c->devs[r]) != GP_OK) return 1;
    }
    int bal = cfg->model.n_layers;
    if (gp_model_build_replicated(cfg, c->devs, R, 1, &bal, &c->m) != GP_OK) return 1;
    c->ts = calloc((size_t)steps, sizeof *c->ts);
    c->ar = calloc((size_t)steps, sizeof *c->ar);
    return !c->ts || !c->ar;
}

static int step(const gp_config *cfg, config_run *c, int s, const float *x, const float *y,
                int64_t batch)
{
    gp_device_bind_thread(c->devs[0]);
    gp_step_stats st;
    if (gp_model_pipeline_step(&c->m, cfg, x, y, batch, 0.001, &st) != GP_OK) return 1;
    if (s >= 0) {
        c->ts[s] = st.seconds;
        c->ar[s] = st.allreduce_seconds;
    }
    return 0;
}

static void teardown(config_run *c)
{
    gp_model_free(&c->m);
    for (int r = 0; r < c->R; r++)
        if (c->devs[r]) gp_device_close(c->devs[r]);
    free(c->ts);
    free(c->ar);
}

int main(int argc, char **argv)
{
    const char *path = GPIPE_SOURCE_DIR "/bench/mlp.yaml";
    int steps = 20, R = 2;
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
           (long long)batch, cfg.pipeline.chunks,
           (long long)params, (double)params * 4 / 1e6);
    printf("  %-22s %10s %12s %14s %10s\n", "configuration", "step ms", "samples/s",
           "collectives ms", "ratio");
    /* Both configurations exist at once and their steps alternate, so a
     * drift of the shared machine affects both alike. */
    config_run one, many;
    if (setup(&cfg, 1, steps, &one) || setup(&cfg, R, steps, &many)) {
        fprintf(stderr, "bench_replicas: %s\n", gp_last_error());
        return 1;
    }
    for (int s = -2; s < steps; s++)
        if (step(&cfg, &one, s, x, y, batch) || step(&cfg, &many, s, x, y, batch)) {
            fprintf(stderr, "bench_replicas: %s\n", gp_last_error());
            return 1;
        }
    /* Three views of the same steps: the ratio of the median step times
     * (the headline), the median of the per-step ratios (each pair ran back
     * to back, so slow drifts of a shared machine cancel) and the ratio of
     * the fastest steps (noise only ever adds time). */
    double *pair = calloc((size_t)steps, sizeof *pair);
    double best1 = one.ts[0], bestr = many.ts[0];
    for (int s = 0; s < steps; s++) {
        if (pair) pair[s] = one.ts[s] / many.ts[s];
        if (one.ts[s] < best1) best1 = one.ts[s];
        if (many.ts[s] < bestr) bestr = many.ts[s];
    }
    double pr = pair ? gp_bench_median(pair, steps) : 0;
    free(pair);
    double t1 = gp_bench_median(one.ts, steps), tr = gp_bench_median(many.ts, steps);
    double ar = gp_bench_median(many.ar, steps);
    printf("  %-22s %10.1f %12.1f %14s %10s\n", "1 replica x 1 stage", t1 * 1e3,
           (double)batch / t1, "-", "1.00");
    char label[64];
    snprintf(label, sizeof label, "%d replicas x 1 stage", R);
    printf("  %-22s %10.1f %12.1f %14.1f %10.2f\n", label, tr * 1e3, (double)batch / tr,
           ar * 1e3, t1 / tr);
    printf("bench_replicas: throughput ratio %.2f with %d replicas (bar >= %.1f for 2); "
           "median of the per-step ratios %.2f, fastest steps %.1f / %.1f ms = %.2f; "
           "gradient sum + sharded update + parameter all-gather %.0f%% of the step\n",
           t1 / tr, R, 1.7, pr, best1 * 1e3, bestr * 1e3, best1 / bestr, 100 * ar / tr);
    teardown(&one);
    teardown(&many);
    free(x);
    free(y);
    gp_config_free(&cfg);
    return 0;
}
