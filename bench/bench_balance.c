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
 * Rounds: the 2-core benchmark machine's speed drifts — convnet steps at
 * m = 4, [10, 13], went from 541 to 610 ms within half a minute of
 * back-to-back steps, and one thread of fixed work from 14.6 to 16.3 ms per
 * run over two minutes, with nothing else running.  That is as large as what is
 * measured, so both bars are taken in `rounds` interleaved rounds (bar 1:
 * profile then steps, per round; bar 2: every split once per round, odd
 * rounds in reverse order) and report medians, with the rounds' spread.
 *
 * --detail: for the simulator bar, where the time goes — per stage and
 * instruction kind, the executor's event log (mean over the timed steps) next
 * to the stage model's prediction for the same instructions, the copies'
 * waits, and the step's time outside the instruction lists (commit, update,
 * barriers).  The way to see which part of a prediction is off.
 *
 * usage: bench_balance [--steps N] [--rounds R] [--skip-splits] [--detail]
 *   --steps: timed steps per measurement (bar 1) or per split in all (bar 2)
 * Benchmarks print; they never fail a build.
 */
#include "balance/balance.h"
#include "pipeline/pipeline.h"
#include "train/train.h"
#include "bench_util.h"

#include <stdlib.h>
#include <string.h>

static void two_devices(gp_config *cfg)
{
    gp_bench_cpu_devices(cfg, 2);
    cfg->pipeline.threads = 1;
}

/* Seconds per step by stage and instruction kind: measured from the
 * executor's event log, predicted by the stage model for the same
 * instructions. */
typedef struct {
    double meas[2][GP_INSTR_KIND_COUNT], pred[2][GP_INSTR_KIND_COUNT];
    double wait[2];
    double outside;  /* step time outside every instruction list */
    double pred_update; /* the simulator's: the slower stage's update */
} detail;

/* Add one step's events to d (divided by `steps`, so d holds means). */
static void detail_add(detail *d, const gp_profile *p, const gp_model *model, int m,
                       double seconds, int steps)
{
    int64_t sizes[GP_MAX_CHUNKS];
    if (gp_microbatch_split(p->batch, m, sizes) != GP_OK) return;
    gp_layer_times *lt = calloc((size_t)p->L, sizeof *lt);
    if (!lt) return;
    double lo = 1e300, hi = -1e300;
    for (int j = 0; j < 2; j++) {
        int count = 0;
        const gp_event_rec *ev = gp_pipeline_events(model->pipe, j, &count);
        int first = j == 0 ? 0 : model->balance[0];
        for (int e = 0; e < count; e++) {
            double loss, upload;
            gp_profile_times_at(p, sizes[ev[e].i], lt, &loss, &upload);
            gp_stage_times st = gp_stage_times_of(p, lt, loss, upload, j, 2, first,
                                                  model->balance[j]);
            if (st.update > d->pred_update) d->pred_update = st.update;
            double dt = (ev[e].t1 - ev[e].t0) / steps;
            if (ev[e].t0 < lo) lo = ev[e].t0;
            if (ev[e].t1 > hi) hi = ev[e].t1;
            if (ev[e].is_wait) {
                d->wait[j] += dt;
                continue;
            }
            gp_instr_kind k = ev[e].kind;
            d->meas[j][k] += dt;
            d->pred[j][k] += (k == GP_INSTR_FORWARD     ? st.F
                              : k == GP_INSTR_RECOMPUTE ? st.R
                              : k == GP_INSTR_BACKWARD  ? st.B
                              : k == GP_INSTR_RECV_ACT  ? st.copy_act
                                                        : st.copy_grad) / steps;
        }
    }
    d->outside += (seconds - (hi - lo)) / steps;
    free(lt);
}

static void detail_print(const detail *d, const gp_sim_result *r)
{
    printf("      %-6s %-10s %10s %10s %7s\n", "stage", "kind", "meas ms", "pred ms", "ratio");
    for (int j = 0; j < 2; j++) {
        for (int k = 0; k < GP_INSTR_KIND_COUNT; k++) {
            if (d->meas[j][k] == 0 && d->pred[j][k] == 0) continue;
            printf("      %-6d %-10s %10.1f %10.1f %7.2f\n", j,
                   gp_instr_kind_name((gp_instr_kind)k), d->meas[j][k] * 1e3,
                   d->pred[j][k] * 1e3, d->pred[j][k] > 0 ? d->meas[j][k] / d->pred[j][k] : 0);
        }
        printf("      %-6d %-10s %10.1f %10s\n", j, "waits", d->wait[j] * 1e3, "");
    }
    printf("      outside the lists (commit, update, barriers): %.1f ms, predicted %.1f "
           "(the slower stage's update); step %.1f predicted\n", d->outside * 1e3,
           d->pred_update * 1e3, r->step * 1e3);
}

/* The step times of `balance` at m micro-batches (2 warm-up steps, then
 * `steps` timed ones into times[0..steps)); with p and d, the timed steps'
 * events are added to d. */
static gp_status measure(const gp_config *base, const int *balance, int m, int steps,
                         double *times, const gp_profile *p, detail *d)
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
    gp_status s = GP_OK;
    for (int w = 0; w < 2 && s == GP_OK; w++)
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.0, NULL);
    for (int it = 0; it < steps && s == GP_OK; it++) {
        gp_step_stats st;
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.0, &st);
        times[it] = st.seconds;
        if (s == GP_OK && d) detail_add(d, p, &model, m, st.seconds, steps);
    }
    free(x);
    free(y);
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

/* `rounds` rounds of: profile, then for each m plan, simulate and measure.
 * The table gives the medians over the rounds and the range of the
 * rounds' own errors, so a slow minute of the host shows as spread instead
 * of as the simulator's error. */
static int simulator_bar(const char *path, int steps, int rounds, bool detailed)
{
    enum { NM = 3, MAXR = 16 };
    const int ms[NM] = {1, 4, 8};
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) {
        fprintf(stderr, "bench_balance: %s\n", gp_last_error());
        return 1;
    }
    two_devices(&cfg);
    if (rounds > MAXR) rounds = MAXR;
    double pred[NM][MAXR], meas[NM][MAXR], bubble[NM][MAXR];
    int bal[NM][MAXR][2];
    double *ts = malloc((size_t)steps * sizeof *ts);
    gp_status s = ts ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory");
    for (int r = 0; r < rounds && s == GP_OK; r++) {
        gp_profile p = {0};
        s = profile(&cfg, &p);
        for (int q = 0; q < NM && s == GP_OK; q++) {
            gp_plan_opts po;
            cfg.pipeline.chunks = ms[q];
            gp_model_plan_opts(&cfg, 2, &po);
            gp_sim_result sr;
            detail d;
            memset(&d, 0, sizeof d);
            bool show = detailed && r == rounds - 1;
            s = gp_balance_plan(&p, &po, bal[q][r]);
            if (s == GP_OK)
                s = gp_simulate(&p, 2, bal[q][r], ms[q], cfg.pipeline.checkpoint, true, NULL, &sr);
            if (s == GP_OK) s = measure(&cfg, bal[q][r], ms[q], steps, ts, &p, show ? &d : NULL);
            if (s != GP_OK) break;
            pred[q][r] = sr.step;
            meas[q][r] = gp_bench_median(ts, steps);
            bubble[q][r] = sr.bubble;
            if (show) {
                printf("%s, m = %d, [%d, %d], last round: where the time goes\n", path, ms[q],
                       bal[q][r][0], bal[q][r][1]);
                detail_print(&d, &sr);
            }
        }
        gp_profile_free(&p);
    }
    free(ts);
    if (s != GP_OK) {
        fprintf(stderr, "bench_balance: %s\n", gp_last_error());
        gp_config_free(&cfg);
        return 1;
    }
    printf("%s, batch %lld, 2 CPU devices x 1 thread, %s, lockstep; medians of %d rounds "
           "(profile, then the steps), %d steps each\n", path, (long long)cfg.train.batch_size,
           gp_checkpoint_mode_name(cfg.pipeline.checkpoint), rounds, steps);
    printf("%4s %10s %12s %12s %8s %17s %8s\n", "m", "balance", "predicted ms", "measured ms",
           "error", "rounds' errors", "bubble");
    bool differed = false;
    for (int q = 0; q < NM; q++) {
        double e_lo = 1e30, e_hi = -1e30, pv[MAXR], mv[MAXR], bv[MAXR];
        bool same = true;
        for (int r = 0; r < rounds; r++) {
            double e = (pred[q][r] - meas[q][r]) / meas[q][r];
            e_lo = e < e_lo ? e : e_lo;
            e_hi = e > e_hi ? e : e_hi;
            pv[r] = pred[q][r];
            mv[r] = meas[q][r];
            bv[r] = bubble[q][r];
            same = same && bal[q][r][0] == bal[q][0][0];
        }
        differed = differed || !same;
        double pm = gp_bench_median(pv, rounds), mm = gp_bench_median(mv, rounds);
        char bs[32];
        snprintf(bs, sizeof bs, "[%d, %d]%s", bal[q][0][0], bal[q][0][1], same ? "" : "*");
        printf("%4d %10s %12.1f %12.1f %+7.1f%%   %+6.1f .. %+5.1f%% %7.1f%%\n", ms[q], bs,
               pm * 1e3, mm * 1e3, 100 * (pm - mm) / mm, 100 * e_lo, 100 * e_hi,
               100 * gp_bench_median(bv, rounds));
    }
    if (differed) printf("(* the balance differed between rounds; the first round's is shown)\n");
    printf("\n");
    gp_config_free(&cfg);
    return 0;
}

/* Every split measured in `rounds` interleaved rounds (odd rounds in reverse
 * order), so the host's drift spreads over all splits instead of favouring
 * whichever ran in a fast minute; a split's time is the median of all its
 * timed steps. */
static int splits_bar(int steps, int rounds)
{
    const char *path = GPIPE_SOURCE_DIR "/bench/convnet.yaml";
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) {
        fprintf(stderr, "bench_balance: %s\n", gp_last_error());
        return 1;
    }
    two_devices(&cfg);
    int m = 4, chosen[2] = {0, 0};
    cfg.pipeline.chunks = m;
    gp_profile p = {0};
    gp_plan_opts po;
    gp_model_plan_opts(&cfg, 2, &po);
    int L = cfg.model.n_layers, per = (steps + rounds - 1) / rounds, n = rounds * per;
    double *ts = calloc((size_t)L * (size_t)n, sizeof *ts);       /* [a][round][step] */
    double *rmed = calloc((size_t)L * (size_t)rounds, sizeof *rmed); /* [a][round] */
    double *t = calloc((size_t)L, sizeof *t);                      /* [a] */
    gp_status s = ts && rmed && t ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory");
    if (s == GP_OK) s = profile(&cfg, &p);
    if (s == GP_OK) s = gp_balance_plan(&p, &po, chosen);
    for (int r = 0; r < rounds && s == GP_OK; r++)
        for (int q = 1; q < L && s == GP_OK; q++) {
            int a = r % 2 ? L - q : q;
            int bal[2] = {a, L - a};
            double *v = ts + (size_t)a * (size_t)n + (size_t)(r * per);
            s = measure(&cfg, bal, m, per, v, NULL, NULL);
            if (s == GP_OK) rmed[(size_t)a * (size_t)rounds + (size_t)r] = gp_bench_median(v, per);
        }
    if (s == GP_OK) {
        printf("every split of %s over 2 devices, m = %d (median of %d steps in %d interleaved "
               "rounds):\n", path, m, n, rounds);
        printf("%10s %12s %18s %12s\n", "balance", "measured ms", "rounds' medians",
               "predicted ms");
    }
    for (int a = 1; a < L && s == GP_OK; a++) {
        int bal[2] = {a, L - a};
        gp_sim_result r;
        s = gp_simulate(&p, 2, bal, m, cfg.pipeline.checkpoint, true, NULL, &r);
        if (s != GP_OK) break;
        t[a] = gp_bench_median(ts + (size_t)a * (size_t)n, n);
        double lo = 1e30, hi = 0;
        for (int k = 0; k < rounds; k++) {
            double v = rmed[(size_t)a * (size_t)rounds + (size_t)k];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        printf("   [%2d,%2d] %12.1f    %6.1f .. %6.1f %12.1f%s\n", a, L - a, t[a] * 1e3,
               lo * 1e3, hi * 1e3, r.step * 1e3, a == chosen[0] ? "   <- --by time" : "");
    }
    if (s == GP_OK) {
        int ca = chosen[0], rank = 1, best = 1;
        for (int a = 1; a < L; a++) {
            if (t[a] < t[ca]) rank++;
            if (t[a] < t[best]) best = a;
        }
        printf("\n--by time chose [%d, %d]: rank %d of %d splits, %.1f ms vs best [%d, %d] "
               "%.1f ms (+%.1f%%)\n", chosen[0], chosen[1], rank, L - 1, t[ca] * 1e3, best,
               L - best, t[best] * 1e3, 100 * (t[ca] - t[best]) / t[best]);
    } else {
        fprintf(stderr, "bench_balance: %s\n", gp_last_error());
    }
    free(ts);
    free(rmed);
    free(t);
    gp_profile_free(&p);
    gp_config_free(&cfg);
    return s == GP_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    int steps = 5, rounds = 3, skip_splits = 0;
    bool detailed = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--skip-splits")) skip_splits = 1;
        else if (!strcmp(argv[i], "--detail")) detailed = true;
        else {
            puts("usage: bench_balance [--steps N] [--rounds R] [--skip-splits] [--detail]");
            return 0;
        }
    }
    if (steps < 1) steps = 1;
    if (rounds < 1) rounds = 1;
    gp_log_set_level(GP_LOG_WARN);
    char cpu[256];
    gp_bench_cpu_name(cpu, sizeof cpu);
    printf("processor: %s\n", cpu);
    if (simulator_bar(GPIPE_SOURCE_DIR "/bench/convnet.yaml", steps, rounds, detailed)) return 1;
    if (simulator_bar(GPIPE_SOURCE_DIR "/bench/mlp.yaml", steps, rounds, detailed)) return 1;
    if (!skip_splits && splits_bar(steps, rounds)) return 1;
    return 0;
}
