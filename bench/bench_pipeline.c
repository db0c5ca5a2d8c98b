/*
 * bench_pipeline — the pipeline's performance bars, measured in one run:
 *
 *   1. efficiency: bench/convnet.yaml on 2 CPU devices (1 thread each) for
 *      m in {1, 2, 4, 8, 16}: the measured step time against GPipe's bound
 *      (m + n - 1) * (max_j F_j + max_j (R_j + B_j)), where F, R, B are the
 *      per-micro-batch forward, recompute and backward times of each stage
 *      measured from the executor's own event log in the same steps;
 *   2. overlap: summed busy time of the workers / step wall time;
 *   3. executor overhead per instruction with trivial layers;
 *   4. checkpointing: step time and peak activation memory, always vs never,
 *      for m in {1, 4, 8};
 *   5. scaling: 2 devices x 1 thread over 1 device x 1 thread, both at
 *      m = 8 without recomputation (issue 18's bar: >= 1.6), on GPipe's
 *      schedule in lockstep (the bubble allows 2m / (m + 1) = 1.78) and on
 *      the interleaved one (v = 2, free-running: 2 v m / (v m + 1) =
 *      1.88), in --rounds alternating rounds, medians reported with their
 *      spread.
 *
 * usage: bench_pipeline [--steps N] [--rounds R] [--scaling] [CONFIG.yaml]
 *   (default bench/convnet.yaml; --scaling: part 5 only)
 * Benchmarks print; they never fail a build.
 */
#include "pipeline/pipeline.h"
#include "train/train.h"

#include "bench_util.h"
#include <stdlib.h>
#include <string.h>


typedef struct {
    double step;      /* median step seconds */
    double bound;     /* GPipe bound from measured stage times */
    double overlap;   /* sum busy / wall */
    size_t act_peak;  /* max over devices of activation + copy peak */
    int instrs;       /* instructions per step (all devices) */
} result;

/* n devices; sched GP_SCHEDULE_INTERLEAVED or GP_SCHEDULE_ZB_V: 2 stages
 * each (balance: auto evens the devices), else the config's schedule */
static gp_status run_sched(const gp_config *base, int n, int m, gp_checkpoint_mode ck,
                           bool lockstep, int steps, result *r, gp_schedule_kind sched)
{
    gp_config cfg = *base;
    if (sched == GP_SCHEDULE_INTERLEAVED || sched == GP_SCHEDULE_ZB_V) {
        cfg.pipeline.schedule = sched;
        cfg.pipeline.virtual_stages = 2;
    }
    cfg.pipeline.chunks = m;
    cfg.pipeline.checkpoint = ck;
    cfg.pipeline.lockstep = lockstep;
    gp_bench_cpu_devices(&cfg, n);
    cfg.pipeline.n_balance = 0;
    gp_device *devs[GP_MAX_DEVICES];
    gp_model model;
    GP_TRY(gp_train_open(&cfg, devs, &model, true));
    int64_t b = cfg.train.batch_size, per = gp_shape_numel(&model.input);
    float *x, *y;
    gp_bench_random_batch(b, per, 5, 6, &x, &y);
    double *ts = malloc((size_t)steps * sizeof *ts), *bounds = malloc((size_t)steps * sizeof *bounds),
           *ovl = malloc((size_t)steps * sizeof *ovl);
    gp_status s = GP_OK;
    memset(r, 0, sizeof *r);
    for (int w = 0; w < 2 && s == GP_OK; w++)
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, NULL);
    for (int j = 0; j < n; j++) gp_allocator_reset_peak(&devs[j]->alloc);
    for (int it = 0; it < steps && s == GP_OK; it++) {
        gp_step_stats st;
        s = gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, &st);
        ts[it] = st.seconds;
        /* per-stage mean F, R, B per micro-batch from the event log */
        double maxF = 0, maxRB = 0, busy = 0;
        int instrs = 0;
        for (int j = 0; j < n; j++) {
            int cnt;
            const gp_event_rec *ev = gp_pipeline_events(model.pipe, j, &cnt);
            double F = 0, R = 0, B = 0;
            for (int e = 0; e < cnt; e++) {
                double d = ev[e].t1 - ev[e].t0;
                if (ev[e].is_wait) continue;
                instrs++;
                if (ev[e].kind == GP_INSTR_FORWARD) F += d;
                else if (ev[e].kind == GP_INSTR_RECOMPUTE) R += d;
                else if (ev[e].kind == GP_INSTR_BACKWARD) B += d;
            }
            F /= m;
            R /= m;
            B /= m;
            if (F > maxF) maxF = F;
            if (R + B > maxRB) maxRB = R + B;
            busy += gp_pipeline_busy(model.pipe, j);
        }
        bounds[it] = (double)(m + n - 1) * (maxF + maxRB);
        ovl[it] = busy / st.seconds;
        r->instrs = instrs;
    }
    if (s == GP_OK) {
        r->step = gp_bench_median(ts, steps);
        r->bound = gp_bench_median(bounds, steps);
        r->overlap = gp_bench_median(ovl, steps);
        for (int j = 0; j < n; j++) {
            size_t a = devs[j]->alloc.peak_by[GP_MEM_ACTIVATIONS] + devs[j]->alloc.peak_by[GP_MEM_COPIES];
            if (a > r->act_peak) r->act_peak = a;
        }
    }
    free(ts);
    free(bounds);
    free(ovl);
    free(x);
    free(y);
    gp_model_free(&model);
    for (int j = 0; j < n; j++) gp_device_close(devs[j]);
    return s;
}

static gp_status run(const gp_config *base, int n, int m, gp_checkpoint_mode ck, bool lockstep,
                     int steps, result *r)
{
    return run_sched(base, n, m, ck, lockstep, steps, r, base->pipeline.schedule);
}

static gp_layer_spec trivial_layers[8];

/* Part 5: what a second device buys at m = 8 without recomputation: on
 * GPipe's fill-drain schedule in lockstep (the bubble allows 2m / (m + 1)),
 * on the interleaved one (2 stages per device, free-running, the balance
 * planned to even the devices), whose bubble is half of that, and on
 * ZB-V (2 stages per device in a V, free-running, its weights halves in
 * the bubbles: it allows about 2).  The rounds alternate the four runs, so
 * the machine's drift (10% within a minute on this VM) hits all. */
static int scaling(const gp_config *cfg, int steps, int rounds)
{
    enum { K = 4 };
    static const char *const names[K] = {"1 x 1 thread", "2 x 1 thread (fill-drain)",
                                         "interleaved", "zb-v"};
    double t[K][16], ratio[K][16];
    printf("\nscaling: m = 8, checkpoint never, %d rounds of %d steps; 1 device, 2 devices "
           "(fill-drain, lockstep), 2 devices (interleaved v = 2, free-running), 2 devices "
           "(zb-v, free-running)\n", rounds, steps);
    for (int q = 0; q < rounds; q++) {
        result r[K];
        if (run(cfg, 1, 8, GP_CKPT_NEVER, true, steps, &r[0]) != GP_OK ||
            run(cfg, 2, 8, GP_CKPT_NEVER, true, steps, &r[1]) != GP_OK ||
            run_sched(cfg, 2, 8, GP_CKPT_NEVER, false, steps, &r[2], GP_SCHEDULE_INTERLEAVED) !=
                GP_OK ||
            run_sched(cfg, 2, 8, GP_CKPT_NEVER, false, steps, &r[3], GP_SCHEDULE_ZB_V) != GP_OK) {
            fprintf(stderr, "bench_pipeline: %s\n", gp_last_error());
            return 1;
        }
        printf("  round %d: %s %.1f ms", q + 1, names[0], r[0].step * 1e3);
        for (int k = 0; k < K; k++) {
            t[k][q] = r[k].step;
            ratio[k][q] = r[0].step / r[k].step;
            if (k) printf("; %s %.1f ms (overlap %.2f): %.3f", names[k], r[k].step * 1e3,
                          r[k].overlap, ratio[k][q]);
        }
        printf("\n");
    }
    static const double allows[K] = {1, 2.0 * 8 / 9, 2.0 * 16 / 17, 2};
    printf("  median: 1 device %.1f ms\n", gp_bench_median(t[0], rounds) * 1e3);
    for (int k = 1; k < K; k++) {
        double lo = ratio[k][0], hi = ratio[k][0];
        for (int q = 1; q < rounds; q++) {
            if (ratio[k][q] < lo) lo = ratio[k][q];
            if (ratio[k][q] > hi) hi = ratio[k][q];
        }
        printf("  %s: 2 devices %.1f ms, speed-up %.3f (rounds %.3f..%.3f; the bubble allows "
               "%s%.2f)\n", names[k], gp_bench_median(t[k], rounds) * 1e3,
               gp_bench_median(ratio[k], rounds), lo, hi, k == 3 ? "about " : "", allows[k]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int steps = 5, rounds = 3;
    bool scaling_only = false;
    const char *path = GPIPE_SOURCE_DIR "/bench/convnet.yaml";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--scaling")) scaling_only = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            puts("usage: bench_pipeline [--steps N] [--rounds R] [--scaling] [CONFIG.yaml]");
            return 0;
        } else path = argv[i];
    }
    if (steps < 1) steps = 1;
    if (rounds < 1) rounds = 1;
    if (rounds > 16) rounds = 16;
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) {
        fprintf(stderr, "bench_pipeline: %s\n", gp_last_error());
        return 1;
    }
    char cpu[256];
    gp_bench_cpu_name(cpu, sizeof cpu);
    printf("processor: %s\n", cpu);
    if (scaling_only) {
        int rc = scaling(&cfg, steps, rounds);
        gp_config_free(&cfg);
        return rc;
    }
    printf("%s, batch %lld, 2 CPU devices x 1 thread, except_last checkpointing, lockstep\n\n",
           path, (long long)cfg.train.batch_size);
    printf("%4s %12s %12s %10s %10s\n", "m", "step ms", "bound ms", "step/bound", "overlap");
    int ms[] = {1, 2, 4, 8, 16};
    for (int q = 0; q < 5; q++) {
        result r;
        if (run(&cfg, 2, ms[q], GP_CKPT_EXCEPT_LAST, true, steps, &r) != GP_OK) {
            fprintf(stderr, "bench_pipeline: %s\n", gp_last_error());
            return 1;
        }
        printf("%4d %12.1f %12.1f %10.3f %10.2f\n", ms[q], r.step * 1e3, r.bound * 1e3,
               r.step / r.bound, r.overlap);
    }
    printf("\nlockstep vs free-running at m = 8:\n");
    for (int ls = 1; ls >= 0; ls--) {
        result r;
        if (run(&cfg, 2, 8, GP_CKPT_EXCEPT_LAST, ls == 1, steps, &r) == GP_OK)
            printf("  %-13s step %.1f ms, overlap %.2f\n", ls ? "lockstep" : "free-running",
                   r.step * 1e3, r.overlap);
    }

    printf("\ncheckpointing, always vs never (2 devices):\n");
    printf("%4s %14s %14s %10s %16s %16s %10s\n", "m", "always ms", "never ms", "time a/n",
           "always act.", "never act.", "mem a/n");
    int mc[] = {1, 4, 8};
    for (int q = 0; q < 3; q++) {
        result a, nv;
        if (run(&cfg, 2, mc[q], GP_CKPT_ALWAYS, true, steps, &a) != GP_OK ||
            run(&cfg, 2, mc[q], GP_CKPT_NEVER, true, steps, &nv) != GP_OK) {
            fprintf(stderr, "bench_pipeline: %s\n", gp_last_error());
            return 1;
        }
        char b1[32], b2[32];
        printf("%4d %14.1f %14.1f %10.3f %16s %16s %10.3f\n", mc[q], a.step * 1e3, nv.step * 1e3,
               a.step / nv.step, gp_format_bytes(a.act_peak, b1, sizeof b1),
               gp_format_bytes(nv.act_peak, b2, sizeof b2), (double)a.act_peak / (double)nv.act_peak);
    }

    /* Executor overhead: 4 trivial layers on tiny micro-batches, so almost
     * all of a step is the executor's own work. */
    gp_config t = cfg;
    trivial_layers[0] = gp_layer_spec_default(GP_LAYER_FLATTEN);
    for (int k = 1; k < 4; k++) trivial_layers[k] = gp_layer_spec_default(GP_LAYER_RELU);
    trivial_layers[4] = gp_layer_spec_default(GP_LAYER_LINEAR);
    trivial_layers[4].out = 10; /* the labels are 0..9 */
    t.model.layers = trivial_layers;
    t.model.n_layers = 5;
    t.model.input[0] = 1;
    t.model.input[1] = 1;
    t.model.input[2] = 2;
    t.train.batch_size = 64;
    result r;
    if (run(&t, 2, 64, GP_CKPT_NEVER, true, steps, &r) == GP_OK) {
        /* wall time per device-instruction: the executor's cost plus the
         * (tiny) layer work, an upper bound on the overhead */
        double per = r.step / ((double)r.instrs / 2.0);
        printf("\nexecutor: trivial layers, 2 devices, m = 64: %d instructions per step, "
               "%.1f us wall per instruction per device\n", r.instrs, per * 1e6);
    }
    int rc = scaling(&cfg, steps, rounds);
    gp_config_free(&cfg);
    return rc;
}
