/*
 * bench_schedules — GPipe, 1F1B, ZB-H1, interleaved and ZB-V side by side, in one run: the
 * bars of the schedules issue, on 2 CPU devices x 1 thread, checkpointing
 * off (pipeline.checkpoint: never), free-running (lockstep: false),
 * bench/convnet.yaml by default:
 *
 *   - memory: the peak of stage 0's activations and received copies at
 *     m = 8 (1F1B keeps 2 micro-batches alive there, GPipe 8), from the
 *     device's allocator; step time at the same m;
 *   - interleaved with v = 2 stages per device, bubble at m = 8;
 *   - the V schedules (zb-v, dualpipe-v, v-half, v-min: 4 stages, 2 per
 *     device): bubble, throughput and device 0's activations against 1F1B
 *     at m = 8 (issue 78's bars);
 *   - the simulator: each schedule's step time and device 0's peak memory
 *     predicted from one profile, against runs with the planned balance;
 *   - bubble: the idle share of each device's step at m = 4, from the
 *     executor's event log (1 - busy / wall; busy = the instructions' time
 *     without the waits of copies and of the barrier), as the trace shows it.
 *
 * --lockstep instead: every schedule at m = 8 in lockstep and free-running,
 * alternated within each round, step and bubble side by side (what
 * pipeline.lockstep's default per schedule, gp_lockstep_default, rests on).
 *
 * Rounds alternate the schedules so the host's drift hits all alike;
 * medians over the rounds' steps.  The processor is printed first.
 *
 * usage: bench_schedules [--steps N] [--rounds R] [--lockstep] [CONFIG.yaml]
 * Benchmarks print; they never fail a build.
 */
#include "balance/balance.h"
#include "pipeline/pipeline.h"
#include "train/train.h"

#include "bench_util.h"
#include <stdlib.h>
#include <string.h>

enum { KINDS = GP_SCHEDULE_KINDS, MAXS = 256 };

typedef struct {
    double steps[MAXS];
    double bubble[MAXS]; /* mean over devices, per step */
    int n;
    size_t act0;         /* stage 0's peak activations + copies */
    size_t peak0;        /* device 0's peak, every category */
    size_t level0;       /* device 0's peak above the level a step starts
                            from (parameters, gradients, optimizer state):
                            what the step's tensors held at once at most,
                            the timeline's "allocated bytes" over its floor */
} series;

/* bal: the layers per stage (NULL: balance: auto). */
static gp_status run_ls(const gp_config *base, gp_schedule_kind kind, int m, int steps,
                        series *out, const int *bal, bool lockstep)
{
    gp_config cfg = *base;
    cfg.pipeline.chunks = m;
    cfg.pipeline.checkpoint = GP_CKPT_NEVER;
    cfg.pipeline.schedule = kind;
    cfg.pipeline.virtual_stages = gp_schedule_stages_per_device(kind, 2); /* zb-v: 2, a V */
    cfg.pipeline.lockstep = lockstep;
    gp_bench_cpu_devices(&cfg, 2);
    if (bal) {
        cfg.pipeline.n_balance = 2 * cfg.pipeline.virtual_stages;
        memcpy(cfg.pipeline.balance, bal, (size_t)cfg.pipeline.n_balance * sizeof *bal);
    }
    gp_device *devs[GP_MAX_DEVICES];
    gp_model model;
    GP_TRY(gp_train_open(&cfg, devs, &model, true));
    int n = cfg.pipeline.n_devices; /* devices (interleaved: fewer than stages) */
    int64_t b = cfg.train.batch_size;
    float *x, *y;
    gp_bench_model_batch(&model, b, &x, &y); /* (token ids for a language model) */
    gp_status s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, NULL); /* warm-up */
    gp_allocator_reset_peak(&devs[0]->alloc);
    size_t floor0 = gp_allocator_current(&devs[0]->alloc);
    for (int it = 0; it < steps && s == GP_OK && out->n < MAXS; it++) {
        gp_step_stats st;
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, &st);
        /* the step's bubble as a run's --metrics records it (and the
         * timeline measures it): 1 - the devices' busy time over n x the
         * window from the first start of work to the last end */
        out->steps[out->n] = st.seconds;
        out->bubble[out->n++] = s == GP_OK ? st.bubble : 0;
    }
    size_t a = devs[0]->alloc.peak_by[GP_MEM_ACTIVATIONS] + devs[0]->alloc.peak_by[GP_MEM_COPIES];
    if (a > out->act0) out->act0 = a;
    if (devs[0]->alloc.peak > out->peak0) out->peak0 = devs[0]->alloc.peak;
    if (devs[0]->alloc.peak - floor0 > out->level0) out->level0 = devs[0]->alloc.peak - floor0;
    free(x);
    free(y);
    gp_model_free(&model);
    for (int j = 0; j < n; j++) gp_device_close(devs[j]);
    return s;
}

/* Free-running: lockstep holds every copy until all earlier clocks are
 * done, which costs every schedule but gpipe's (--lockstep measures it). */
static gp_status run(const gp_config *base, gp_schedule_kind kind, int m, int steps, series *out,
                     const int *bal)
{
    return run_ls(base, kind, m, steps, out, bal, false);
}

static int simulator(gp_config *cfg, int steps, int rounds);

/* --lockstep: each schedule at m = 8 in lockstep and free-running, the two
 * alternated within every round so the host's drift hits both alike. */
static int lockstep_table(const gp_config *cfg, int steps, int rounds)
{
    static series ls[KINDS][2];
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < KINDS; k++)
            for (int q = 0; q < 2; q++)
                if (run_ls(cfg, (gp_schedule_kind)k, 8, steps, &ls[k][q], NULL, q == 0) != GP_OK) {
                    fprintf(stderr, "bench_schedules: %s\n", gp_last_error());
                    return 1;
                }
    printf("m = 8%-7s %14s %10s %14s %10s %16s\n", "", "lockstep ms", "bubble", "free ms",
           "bubble", "lockstep / free");
    for (int k = 0; k < KINDS; k++) {
        double a = gp_bench_median(ls[k][0].steps, ls[k][0].n);
        double b = gp_bench_median(ls[k][1].steps, ls[k][1].n);
        printf("%-12s %14.1f %10.3f %14.1f %10.3f %16.3f   (default: %s)\n",
               k == GP_SCHEDULE_INTERLEAVED ? "interleaved2" : gp_schedule_kind_name((gp_schedule_kind)k),
               a * 1e3, gp_bench_median(ls[k][0].bubble, ls[k][0].n), b * 1e3,
               gp_bench_median(ls[k][1].bubble, ls[k][1].n), a / b,
               gp_lockstep_default((gp_schedule_kind)k) ? "lockstep" : "free-running");
    }
    return 0;
}

int main(int argc, char **argv)
{
    int steps = 5, rounds = 3;
    bool lockstep = false;
    const char *path = GPIPE_SOURCE_DIR "/bench/convnet.yaml";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lockstep")) lockstep = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            puts("usage: bench_schedules [--steps N] [--rounds R] [--lockstep] [CONFIG.yaml]");
            return 0;
        } else path = argv[i];
    }
    if (steps < 1) steps = 1;
    if (rounds < 1) rounds = 1;
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) {
        fprintf(stderr, "bench_schedules: %s\n", gp_last_error());
        return 1;
    }
    char cpu[256];
    gp_bench_cpu_name(cpu, sizeof cpu);
    printf("%s\n%s, batch %lld, 2 CPU devices x 1 thread, checkpoint never, %s; "
           "%d rounds x %d steps\n\n", cpu, path, (long long)cfg.train.batch_size,
           lockstep ? "lockstep against free-running" : "free-running", rounds, steps);
    if (lockstep) {
        int rc = lockstep_table(&cfg, steps, rounds);
        gp_config_free(&cfg);
        return rc;
    }
    static series mem[KINDS], bub[KINDS];
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < KINDS; k++) {
            if (run(&cfg, (gp_schedule_kind)k, 8, steps, &mem[k], NULL) != GP_OK ||
                run(&cfg, (gp_schedule_kind)k, 4, steps, &bub[k], NULL) != GP_OK) {
                fprintf(stderr, "bench_schedules: %s\n", gp_last_error());
                return 1;
            }
        }
    /* dev-0 MiB: the per-kind peaks of activations and copies, summed
     * (each at its own moment); dev-0 level: device 0's peak above the
     * step's starting level (both at once, and workspace) */
    printf("%-12s %12s %14s %14s %11s %12s %11s\n", "schedule", "m=8 step ms", "m=8 dev-0 MiB",
           "dev-0 level", "m=8 bubble", "m=4 step ms", "m=4 bubble");
    double step8[KINDS], bub4[KINDS], bub8[KINDS];
    for (int k = 0; k < KINDS; k++) {
        step8[k] = gp_bench_median(mem[k].steps, mem[k].n);
        bub8[k] = gp_bench_median(mem[k].bubble, mem[k].n);
        bub4[k] = gp_bench_median(bub[k].bubble, bub[k].n);
        printf("%-12s %12.1f %14.2f %14.2f %11.3f %12.1f %11.3f\n",
               k == GP_SCHEDULE_INTERLEAVED ? "interleaved2" : gp_schedule_kind_name((gp_schedule_kind)k),
               step8[k] * 1e3, (double)mem[k].act0 / 1048576.0,
               (double)mem[k].level0 / 1048576.0, bub8[k],
               gp_bench_median(bub[k].steps, bub[k].n) * 1e3, bub4[k]);
    }
    printf("\n1f1b / gpipe, m = 8: stage-0 activation peak %.2f (bar <= 0.35), step time %.3f "
           "(bar <= 1.05)\n",
           (double)mem[GP_SCHEDULE_1F1B].act0 / (double)mem[GP_SCHEDULE_GPIPE].act0,
           step8[GP_SCHEDULE_1F1B] / step8[GP_SCHEDULE_GPIPE]);
    printf("zb-h1 / 1f1b, m = 4: bubble %.2f (bar <= 0.5)\n",
           bub4[GP_SCHEDULE_ZB_H1] / bub4[GP_SCHEDULE_1F1B]);
    printf("interleaved (v = 2) / 1f1b, m = 8: bubble %.2f (bar <= 0.6)\n",
           bub8[GP_SCHEDULE_INTERLEAVED] / bub8[GP_SCHEDULE_1F1B]);
    printf("zb-v / 1f1b, m = 8: bubble %.2f (bar <= 0.25), stage-0 device's activation peak "
           "%.2f (per-kind peaks summed; its level above the step's start %.2f; bar <= 1), "
           "throughput %.3f (tiny-gpt's bar >= 1.05)\n",
           bub8[GP_SCHEDULE_ZB_V] / bub8[GP_SCHEDULE_1F1B],
           (double)mem[GP_SCHEDULE_ZB_V].act0 / (double)mem[GP_SCHEDULE_1F1B].act0,
           (double)mem[GP_SCHEDULE_ZB_V].level0 / (double)mem[GP_SCHEDULE_1F1B].level0,
           step8[GP_SCHEDULE_1F1B] / step8[GP_SCHEDULE_ZB_V]);
    for (int k = GP_SCHEDULE_DUALPIPE_V; k <= GP_SCHEDULE_V_MIN; k++)
        printf("%s / 1f1b, m = 8: bubble %.2f, stage-0 device's activation peak %.2f "
               "(level %.2f), throughput %.3f\n", gp_schedule_kind_name((gp_schedule_kind)k),
               bub8[k] / bub8[GP_SCHEDULE_1F1B],
               (double)mem[k].act0 / (double)mem[GP_SCHEDULE_1F1B].act0,
               (double)mem[k].level0 / (double)mem[GP_SCHEDULE_1F1B].level0,
               step8[GP_SCHEDULE_1F1B] / step8[k]);
    return simulator(&cfg, steps, rounds);
}

/* The simulator against the same runs: profile once (1 thread per device,
 * the micro-batch size of m = 8), plan each schedule's balance from it,
 * simulate free-running, then run with that balance; the step's median and
 * device 0's peak (every category) against the prediction. */
static int simulator(gp_config *cfg, int steps, int rounds)
{
    enum { M = 8 };
    gp_config c = *cfg;
    gp_bench_cpu_devices(&c, 2);
    c.pipeline.chunks = M;
    c.pipeline.checkpoint = GP_CKPT_NEVER;
    gp_model_profile_opts mo = {.warmup = 2, .reps = 5, .timed = true, .threads = 1};
    mo.sizes[mo.n_sizes++] = (c.train.batch_size + M - 1) / M;
    gp_profile p = {0};
    if (gp_model_profile(&c, &mo, &p) != GP_OK) {
        fprintf(stderr, "bench_schedules: %s\n", gp_last_error());
        return 1;
    }
    printf("\nsimulator, m = %d, free-running, balance planned from one profile:\n", M);
    printf("%-12s %-14s %10s %10s %8s %12s %12s %8s\n", "schedule", "balance", "pred ms",
           "meas ms", "ratio", "pred MiB", "meas MiB", "ratio");
    for (int k = 0; k < KINDS; k++) {
        int v = gp_schedule_stages_per_device((gp_schedule_kind)k, 2), bal[GP_MAX_DEVICES];
        c.pipeline.schedule = (gp_schedule_kind)k;
        c.pipeline.virtual_stages = v;
        gp_plan_opts po;
        gp_model_plan_opts(&c, 2 * v, &po);
        gp_sim_result sr;
        series me = {0};
        gp_status s = gp_balance_plan(&p, &po, bal);
        if (s == GP_OK)
            s = gp_simulate_schedule(&p, (gp_schedule_kind)k, 2, v, bal, M, GP_CKPT_NEVER, false,
                                     NULL, &sr);
        for (int r = 0; r < rounds && s == GP_OK; r++)
            s = run(&c, (gp_schedule_kind)k, M, steps, &me, bal);
        if (s != GP_OK) {
            fprintf(stderr, "bench_schedules: %s\n", gp_last_error());
            gp_profile_free(&p);
            return 1;
        }
        char bs[64];
        int off = 0;
        for (int j = 0; j < 2 * v; j++)
            off += snprintf(bs + off, sizeof bs - (size_t)off, "%s%d", j ? "," : "[", bal[j]);
        snprintf(bs + off, sizeof bs - (size_t)off, "]");
        double meas = gp_bench_median(me.steps, me.n);
        printf("%-12s %-14s %10.1f %10.1f %8.2f %12.1f %12.1f %8.2f\n",
               k == GP_SCHEDULE_INTERLEAVED ? "interleaved2" : gp_schedule_kind_name((gp_schedule_kind)k),
               bs, sr.step * 1e3, meas * 1e3, sr.step / meas, sr.peak_bytes[0] / 1048576.0,
               (double)me.peak0 / 1048576.0, sr.peak_bytes[0] / (double)me.peak0);
    }
    printf("(bars: step ratio within 0.9-1.1, memory ratio within 0.9-1.3)\n");
    gp_profile_free(&p);
    return 0;
}
