/*
 * bench_step — the foundation's performance bars, measured in one run:
 *
 *   1. the machine's ceiling: FLOP/s of a 4096 x 4096 x 4096 sgemm through
 *      the CPU device (oneDNN) with the same threads;
 *   2. per layer of each benchmark model: forward, backward-data and
 *      backward-weights times (median) and GFLOP/s;
 *   3. the whole training step (forward + backward + SGD update) on a
 *      random batch: samples/s and 3 x forward FLOPs / step time as a
 *      fraction of the ceiling, which is sampled between the steps (median
 *      step against median sgemm, so both see the same machine);
 *   4. peak device memory of a step against the sum of the tensors it must
 *      hold (parameters, gradients, momentum, activations kept for backward).
 *
 * usage: bench_step [--threads N] [--steps N] [--steps-only] [CONFIG.yaml ...]
 * (--steps-only: part 3 alone, steps back to back, for bench_cpu_peer.py)
 * (defaults: 2 threads, 10 timed steps, bench/mlp.yaml bench/convnet.yaml).
 * Benchmarks print; they never fail a build.
 */
#include "train/train.h"

#include "bench_util.h"
#include <stdlib.h>
#include <string.h>


static void fill_random(gp_device *dev, gp_tensor *t, uint64_t stream)
{
    int64_t n = gp_tensor_numel(t);
    float *h = malloc((size_t)n * sizeof *h);
    gp_rng_uniform_fill(1, stream, 0, h, n);
    for (int64_t i = 0; i < n; i++) h[i] = h[i] * 2 - 1;
    gp_dev_upload(dev, gp_f32(t), h, n);
    free(h);
}

/* The ceiling: a 4096^3 sgemm through the CPU device.  Its operands are
 * host buffers outside the device's allocator (the CPU device computes on
 * host memory), so they do not count in the step's peak memory. */
#define CEIL_N 4096
typedef struct {
    float *a, *b, *c;
} ceiling_bufs;

static void ceiling_init(ceiling_bufs *cb)
{
    size_t bytes = (size_t)CEIL_N * CEIL_N * sizeof(float);
    cb->a = aligned_alloc(64, bytes);
    cb->b = aligned_alloc(64, bytes);
    cb->c = aligned_alloc(64, bytes);
    if (!cb->a || !cb->b || !cb->c) {
        fprintf(stderr, "bench_step: out of host memory for the sgemm ceiling\n");
        exit(1);
    }
    gp_rng_uniform_fill(1, 1, 0, cb->a, (int64_t)CEIL_N * CEIL_N);
    gp_rng_uniform_fill(1, 2, 0, cb->b, (int64_t)CEIL_N * CEIL_N);
}

static void ceiling_free(ceiling_bufs *cb)
{
    free(cb->a);
    free(cb->b);
    free(cb->c);
}

/* FLOP/s of one 4096^3 sgemm. */
static double ceiling_once(gp_device *dev, const ceiling_bufs *cb)
{
    const int64_t n = CEIL_N;
    double t0 = gp_now();
    gp_dev_gemm(dev, 0, 0, n, n, n, 1.0f, cb->a, n, cb->b, n, 0.0f, cb->c, n);
    gp_dev_synchronize(dev);
    return 2.0 * (double)n * n * n / (gp_now() - t0);
}

#define REPS 7

static void bench_layers(gp_model *m, const gp_config *cfg, int64_t batch)
{
    gp_device *dev = m->dev;
    int L = m->n_layers;
    gp_tensor *acts = calloc((size_t)L + 1, sizeof *acts);
    gp_shape in = gp_shape_with_batch(&m->input, batch);
    gp_tensor_alloc(&acts[0], dev, &in, GP_MEM_ACTIVATIONS);
    fill_random(dev, &acts[0], 3);
    gp_fwd_ctx ctx = {.training = true, .seed = 1, .step = 0, .sample_offset = 0, .batch_total = batch};
    printf("  %3s %-16s %-20s %9s %9s %9s %9s %9s %9s\n", "#", "layer", "output", "fwd ms",
           "GF/s", "bwd-d ms", "GF/s", "bwd-w ms", "GF/s");
    for (int k = 0; k < L; k++) {
        gp_layer *l = &m->layers[k];
        double tf[REPS], td[REPS], tw[REPS];
        gp_saved sv = {0};
        for (int r = 0; r < REPS; r++) {
            gp_tensor y = {0};
            gp_saved s = {0};
            double t0 = gp_now();
            gp_layer_forward(l, &ctx, &acts[k], &y, &s);
            gp_dev_synchronize(dev);
            tf[r] = gp_now() - t0;
            if (r == REPS - 1) {
                acts[k + 1] = y;
                sv = s;
            } else {
                gp_tensor_free(&y);
                gp_saved_free(&s);
            }
        }
        gp_tensor dy;
        gp_shape os = gp_tensor_shape(&acts[k + 1]);
        gp_tensor_alloc(&dy, dev, &os, GP_MEM_ACTIVATIONS);
        fill_random(dev, &dy, 4 + (uint64_t)k);
        for (int r = 0; r < REPS; r++) {
            gp_tensor dx = {0};
            gp_shape is = gp_tensor_shape(&acts[k]);
            gp_tensor_alloc(&dx, dev, &is, GP_MEM_ACTIVATIONS);
            double t0 = gp_now();
            if (k > 0) l->ops->backward_data(l, &ctx, &acts[k], &acts[k + 1], &dy, &dx, &sv);
            gp_dev_synchronize(dev);
            td[r] = gp_now() - t0;
            sv.flags = 0; /* let backward_weights do its full work each time */
            t0 = gp_now();
            if (l->ops->backward_weights)
                l->ops->backward_weights(l, &ctx, &acts[k], &acts[k + 1], &dy, &sv);
            gp_dev_synchronize(dev);
            tw[r] = gp_now() - t0;
            gp_tensor_free(&dx);
        }
        gp_tensor_free(&dy);
        gp_saved_free(&sv);
        double f = l->ops->flops(l, batch);
        double mf = gp_bench_median(tf, REPS), md = gp_bench_median(td, REPS), mw = gp_bench_median(tw, REPS);
        char sh[64], nm[40];
        gp_shape_str(&l->out_shape, sh, sizeof sh);
        snprintf(nm, sizeof nm, "%s", gp_layer_type_name(l->spec.type));
        bool heavy = l->spec.type == GP_LAYER_CONV2D || l->spec.type == GP_LAYER_LINEAR;
        printf("  %3d %-16s %-20s %9.3f %9.1f %9.3f %9.1f %9.3f %9.1f\n", k, nm, sh, mf * 1e3,
               f / mf / 1e9, md * 1e3, (heavy && k > 0) ? f / md / 1e9 : 0.0, mw * 1e3,
               heavy ? f / mw / 1e9 : 0.0);
    }
    for (int k = 0; k <= L; k++) gp_tensor_free(&acts[k]);
    free(acts);
    (void)cfg;
}

static void bench_model(const char *path, int threads, int steps, const ceiling_bufs *cb,
                        gp_device *dev, bool steps_only, gp_act_storage act)
{
    gp_config cfg;
    if (gp_config_load(path, NULL, 0, &cfg) != GP_OK) {
        fprintf(stderr, "bench_step: %s\n", gp_last_error());
        return;
    }
    /* the device's precision and --activations decide the storage, as
     * train.precision and train.activations would */
    cfg.train.precision = dev->precision;
    cfg.train.activations = act;
    gp_model m;
    if (gp_model_build(&cfg, dev, &m) != GP_OK) {
        fprintf(stderr, "bench_step: %s\n", gp_last_error());
        gp_config_free(&cfg);
        return;
    }
    int64_t batch = cfg.train.batch_size;
    double fwd = 0;
    for (int k = 0; k < m.n_layers; k++) fwd += m.layers[k].ops->flops(&m.layers[k], batch);
    printf("\n%s: %d layers, %lld parameters, batch %lld, %.2f GFLOP forward per batch, "
           "activations in %s\n", path, m.n_layers, (long long)gp_model_param_count(&m),
           (long long)batch, fwd / 1e9, gp_config_act_dtype(&cfg) == GP_BF16 ? "bf16" : "fp32");
    if (!steps_only && gp_config_act_dtype(&cfg) == GP_BF16)
        puts("  (the per-layer table fills FP32 activations: skipped with bf16 storage)");
    else if (!steps_only)
        bench_layers(&m, &cfg, batch);

    /* Whole steps on a random batch (the data loader is measured elsewhere). */
    int64_t per = gp_shape_numel(&m.input);
    float *x, *y;
    gp_bench_model_batch(&m, batch, &x, &y);
    gp_step_stats st;
    for (int w = 0; w < 2; w++) gp_model_train_step(&m, &cfg, x, y, batch, 1, 0.01, &st);
    gp_allocator_reset_peak(&dev->alloc);
    /* The ceiling is sampled between the steps, so both see the same
     * machine: on a shared VM each moves by 10% over a minute, and a
     * ceiling measured once before the steps would compare a fast moment
     * against a slow one (or the reverse). */
    double *ts = malloc((size_t)steps * sizeof *ts), *cs = malloc((size_t)steps * sizeof *cs);
    for (int s = 0; s < steps; s++) {
        cs[s] = steps_only ? 1.0 : ceiling_once(dev, cb);
        double t0 = gp_now();
        if (gp_model_train_step(&m, &cfg, x, y, batch, 1, 0.01, &st) != GP_OK) {
            fprintf(stderr, "bench_step: %s\n", gp_last_error());
            break;
        }
        ts[s] = gp_now() - t0;
    }
    double t = gp_bench_median(ts, steps), tbest = ts[0], ceiling = gp_bench_median(cs, steps);
    double cbest = cs[0];
    for (int s = 1; s < steps; s++) {
        if (ts[s] < tbest) tbest = ts[s];
        if (cs[s] > cbest) cbest = cs[s];
    }
    gp_allocator a;
    gp_allocator_snapshot(&dev->alloc, &a);
    /* What a step must hold: params, grads, momentum, and every activation
     * kept for backward (layer outputs, the input, and saved extras). */
    double need = (double)(a.peak_by[GP_MEM_PARAMS] + a.peak_by[GP_MEM_GRADS] +
                           a.peak_by[GP_MEM_OPTIMIZER]);
    double acts = (double)batch * (double)per * 4.0;
    for (int k = 0; k < m.n_layers; k++) {
        gp_layer *l = &m.layers[k];
        acts += (double)gp_shape_numel(&l->out_shape) * (double)batch * 4.0;
        if (l->ops->saved_bytes) acts += (double)l->ops->saved_bytes(l, batch);
    }
    need += acts;
    double frac = 3.0 * fwd / t / ceiling;
    char b1[32], b2[32], b3[32];
    if (steps_only) {
        printf("  step: %.1f ms median of %d, %.1f samples/s (%d threads, steps back to back)\n",
               t * 1e3, steps, (double)batch / t, threads);
        printf("  activations peak: %s\n",
               gp_format_bytes(a.peak_by[GP_MEM_ACTIVATIONS], b1, sizeof b1));
        goto done;
    }
    printf("  ceiling during the steps: sgemm 4096^3 %.1f GFLOP/s median (best %.1f)\n",
           ceiling / 1e9, cbest / 1e9);
    printf("  step: %.1f ms median of %d, %.0f samples/s, %.1f GFLOP/s = %.1f%% of the sgemm "
           "ceiling (%d threads; medians of both; best step / best sgemm: %.1f%%)\n",
           t * 1e3, steps, (double)batch / t, 3.0 * fwd / t / 1e9, 100 * frac, threads,
           100 * (3.0 * fwd / tbest) / cbest);
    printf("  memory: peak %s vs %s of params+grads+momentum+activations: ratio %.2f "
           "(workspace peak %s)\n",
           gp_format_bytes(a.peak, b1, sizeof b1), gp_format_bytes((size_t)need, b2, sizeof b2),
           (double)a.peak / need, gp_format_bytes(a.peak_by[GP_MEM_WORKSPACE], b3, sizeof b3));
done:
    free(ts);
    free(cs);
    free(x);
    free(y);
    gp_model_free(&m);
    gp_config_free(&cfg);
}

int main(int argc, char **argv)
{
    int threads = 2, steps = 10;
    bool steps_only = false;
    gp_precision precision = GP_PRECISION_FP32;
    gp_act_storage act = GP_ACT_AUTO;
    const char *configs[16];
    int nc = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps-only")) steps_only = true;
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *p = argv[++i];
            if (!strcmp(p, "bf16")) precision = GP_PRECISION_BF16;
            else if (strcmp(p, "fp32")) {
                fprintf(stderr, "bench_step: --precision takes fp32 or bf16\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--activations") && i + 1 < argc) {
            const char *p = argv[++i];
            if (!strcmp(p, "bf16")) act = GP_ACT_BF16;
            else if (!strcmp(p, "fp32")) act = GP_ACT_FP32;
            else if (strcmp(p, "auto")) {
                fprintf(stderr, "bench_step: --activations takes auto, fp32 or bf16\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: bench_step [--threads N] [--steps N] [--steps-only] [--precision fp32|bf16]\n"
                 "                  [--activations auto|fp32|bf16] [CONFIG.yaml ...]\n"
                 "  --precision   the device's (train.precision); bf16 needs avx512_bf16 or AMX\n"
                 "  --activations train.activations (default auto); bf16 needs --steps-only\n"
                 "  --steps-only  whole steps back to back: no per-layer table, no sgemm\n"
                 "                ceiling (what bench/bench_cpu_peer.py compares with PyTorch)");
            return 0;
        } else if (nc < 16) configs[nc++] = argv[i];
    }
    if (steps < 1) steps = 1;
    if (nc == 0) {
        configs[nc++] = GPIPE_SOURCE_DIR "/bench/mlp.yaml";
        configs[nc++] = GPIPE_SOURCE_DIR "/bench/convnet.yaml";
    }
    gp_device_opts o = {.threads = threads, .precision = precision};
    gp_device *dev;
    if (gp_device_open("cpu:0", &o, &dev) != GP_OK) {
        fprintf(stderr, "bench_step: %s\n", gp_last_error());
        return 1;
    }
    gp_device_bind_thread(dev);
    char cpu[256];
    gp_bench_cpu_name(cpu, sizeof cpu);
    printf("processor: %s\n", cpu);
    ceiling_bufs cb = {0};
    if (!steps_only) {
        ceiling_init(&cb);
        double c0 = 0;
        for (int r = 0; r < 3; r++) c0 = ceiling_once(dev, &cb); /* the first runs warm up */
        printf("ceiling: sgemm 4096^3 on cpu:0 with %d threads: %.1f GFLOP/s (sampled again "
               "between the steps below)\n", threads, c0 / 1e9);
    }
    for (int i = 0; i < nc; i++)
        bench_model(configs[i], threads, steps, &cb, dev, steps_only, act);
    if (!steps_only) ceiling_free(&cb);
    gp_device_close(dev);
    return 0;
}
