/*
 * bench_balance — the balance module's bars, measured in one run:
 *
 *   1. simulator: for bench/convnet.yaml and bench/mlp.yaml on 2 CPU devices
 *      (1 thread each, except_last, lockstep) and m in {1, 4, 8}: the step
 *      time gp_simulate predicts from a profile against the measured median
 *      step (bar: within 15%);
 *   2. choice: every split of bench/convnet.yaml over 2 devices at m = 4,
 *      measured; where the balance `--by time` picks ranks (bar: best, or
 *      tied with the best within noise).
 *
 * usage: bench_balance [--steps N] [--skip-splits]
 * Benchmarks print; they never fail a build.
 */
#include "balance/balance.h"
#include "train/train.h"
#include "bench_util.h"

#include <stdlib.h>
#include <string.h>

static void two_devices(gp_config *cfg)
{
    gp_bench_cpu_devices(cfg, 2);
    cfg->pipeline.threads = 1;
}

/* Median step seconds of `balance` at m micro-batches. */
static gp_status measure(const gp_config *base, const int *balance, int m, int steps, double *out)
{
    gp_config cfg = *base;
    cfg.pipeline.chunks = m;
    cfg.pipeline.n_balance = 2;
    cfg.pipeline.balance[0] = balance[0];
    cfg.pipeline.balance[1] = balance[1];
    gp_device *devs[GP_MAX_DEVICES];
    gp_model model;
    GP_TRY(gp_train_open(&cfg, devs, &model, true));
    int64_t b = cfg.train.batch_size, per = gp_shape_numel(&model.input);
    float *x, *y;
    gp_bench_random_batch(b, per, 5, 6, &x, &y);
    double *ts = malloc((size_t)steps * sizeof *ts);
    gp_status s = GP_OK;
    for (int w = 0; w < 2 && s == GP_OK; w++)
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.0, NULL);
    for (int it = 0; it < steps && s == GP_OK; it++) {
        gp_step_stats st;
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.0, &st);
        ts[it] = st.seconds;
    }
    if (s == GP_OK) *out = gp_bench_median(ts, steps);
    free(x);
    free(y);
    free(ts);
    gp_model_free(&model);
    for (int j = 0; j < 2; j++) gp_device_close(devs[j]);
    return s;
}

static gp_status profile(gp_config *cfg, gp_profile *p)
{
    gp_model_profile_opts mo = {.warmup = 2, .reps = 5, .timed = true, .threads = 1};
    int ms[3] = {1, 4, 8};
    for (int q = 0; q < 3; q++) mo.sizes[mo.n_sizes++] = (cfg->train.batch_size + ms[q] - 1) / ms[q];
    return gp_model_profile(cfg, &mo, p);
}

static int simulator_bar(const char *path, int steps)
{
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) {
        fprintf(stderr, "bench_balance: %s\n", gp_last_error());
        return 1;
    }
    two_devices(&cfg);
    gp_profile p;
    if (profile(&cfg, &p) != GP_OK) {
        fprintf(stderr, "bench_balance: %s\n", gp_last_error());
        return 1;
    }
    printf("%s, batch %lld, 2 CPU devices x 1 thread, %s, lockstep\n", path,
           (long long)cfg.train.batch_size, gp_checkpoint_mode_name(cfg.pipeline.checkpoint));
    printf("%4s %10s %12s %12s %8s %8s\n", "m", "balance", "predicted ms", "measured ms",
           "error", "bubble");
    int ms[3] = {1, 4, 8};
    for (int q = 0; q < 3; q++) {
        gp_plan_opts po;
        cfg.pipeline.chunks = ms[q];
        gp_model_plan_opts(&cfg, 2, &po);
        int bal[2];
        gp_sim_result r;
        double t = 0;
        if (gp_balance_plan(&p, &po, bal) != GP_OK ||
            gp_simulate(&p, 2, bal, ms[q], cfg.pipeline.checkpoint, true, NULL, &r) != GP_OK ||
            measure(&cfg, bal, ms[q], steps, &t) != GP_OK) {
            fprintf(stderr, "bench_balance: %s\n", gp_last_error());
            return 1;
        }
        char bs[32];
        snprintf(bs, sizeof bs, "[%d, %d]", bal[0], bal[1]);
        printf("%4d %10s %12.1f %12.1f %+7.1f%% %7.1f%%\n", ms[q], bs, r.step * 1e3, t * 1e3,
               100 * (r.step - t) / t, 100 * r.bubble);
    }
    printf("\n");
    gp_profile_free(&p);
    gp_config_free(&cfg);
    return 0;
}

static int splits_bar(int steps)
{
    const char *path = GPIPE_SOURCE_DIR "/bench/convnet.yaml";
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) return 1;
    two_devices(&cfg);
    int m = 4;
    cfg.pipeline.chunks = m;
    gp_profile p;
    gp_plan_opts po;
    int chosen[2];
    if (profile(&cfg, &p) != GP_OK) return 1;
    gp_model_plan_opts(&cfg, 2, &po);
    if (gp_balance_plan(&p, &po, chosen) != GP_OK) return 1;
    int L = cfg.model.n_layers;
    double *t = calloc((size_t)L, sizeof *t), *pred = calloc((size_t)L, sizeof *pred);
    printf("every split of %s over 2 devices, m = %d (median of %d steps):\n", path, m, steps);
    printf("%10s %12s %12s\n", "balance", "measured ms", "predicted ms");
    for (int a = 1; a < L; a++) {
        int bal[2] = {a, L - a};
        gp_sim_result r;
        if (measure(&cfg, bal, m, steps, &t[a]) != GP_OK ||
            gp_simulate(&p, 2, bal, m, cfg.pipeline.checkpoint, true, NULL, &r) != GP_OK) {
            fprintf(stderr, "bench_balance: %s\n", gp_last_error());
            return 1;
        }
        pred[a] = r.step;
        printf("   [%2d,%2d] %12.1f %12.1f%s\n", a, L - a, t[a] * 1e3, r.step * 1e3,
               a == chosen[0] ? "   <- --by time" : "");
    }
    /* re-measure the few best and the chosen one, then rank */
    int rank = 1;
    double best = 1e30;
    int best_a = 1;
    for (int a = 1; a < L; a++)
        if (t[a] < best) {
            best = t[a];
            best_a = a;
        }
    double tc = 0, tb = 0;
    int chosen_a = chosen[0];
    int best_bal[2] = {best_a, L - best_a};
    if (measure(&cfg, chosen, m, steps, &tc) == GP_OK &&
        measure(&cfg, best_bal, m, steps, &tb) == GP_OK) {
        t[chosen_a] = 0.5 * (t[chosen_a] + tc);
        t[best_a] = 0.5 * (t[best_a] + tb);
    }
    for (int a = 1; a < L; a++)
        if (t[a] < t[chosen_a]) rank++;
    double bestt = 1e30;
    for (int a = 1; a < L; a++)
        if (t[a] < bestt) bestt = t[a];
    printf("\n--by time chose [%d, %d]: rank %d of %d splits, %.1f ms vs best %.1f ms "
           "(+%.1f%%)\n", chosen[0], chosen[1], rank, L - 1, t[chosen_a] * 1e3, bestt * 1e3,
           100 * (t[chosen_a] - bestt) / bestt);
    free(t);
    free(pred);
    gp_profile_free(&p);
    gp_config_free(&cfg);
    return 0;
}

int main(int argc, char **argv)
{
    int steps = 5, skip_splits = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--skip-splits")) skip_splits = 1;
        else {
            puts("usage: bench_balance [--steps N] [--skip-splits]");
            return 0;
        }
    }
    if (steps < 1) steps = 1;
    gp_log_set_level(GP_LOG_WARN);
    if (simulator_bar(GPIPE_SOURCE_DIR "/bench/convnet.yaml", steps)) return 1;
    if (simulator_bar(GPIPE_SOURCE_DIR "/bench/mlp.yaml", steps)) return 1;
    if (!skip_splits && splits_bar(steps)) return 1;
    return 0;
}
