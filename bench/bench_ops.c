/*
 * bench_ops.c — CPU backend op throughput against the compute ceiling.
 *
 * Prints the GFLOP/s of a 4096^3 oneDNN sgemm and, for each convolution of
 * the benchmark convnet (bench/convnet.yaml, batch 128, 3x3 pad 1), the time
 * and GFLOP/s of forward, backward-data and backward-weights through the
 * device interface (plain NCHW in and out, reorders included), with the
 * backend's layout policy and, for comparison, with plain and blocked layouts
 * forced.  Then the memory-bound ops of the same network (batch norm, relu,
 * max pooling) and an estimate of a whole training step's FLOP/s as the sum
 * of its ops; GELU and causal attention (bench_ops.c, time_attn) at a GPT's
 * sizes.  Best of several repetitions; the machine may be shared, so
 * numbers are noisy.  Usage: bench_ops [threads [quick]] (default 2 threads;
 * quick skips the forced-layout rows).  Never fails.
 */
#include "backend/backend.h"
#include "backend/elementwise.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define REPS 5

static float *buf(gp_device *dev, int64_t n, float v)
{
    void *p = NULL;
    if (gp_dev_alloc(dev, (size_t)n * sizeof(float), GP_MEM_ACTIVATIONS, &p) != GP_OK) {
        fprintf(stderr, "bench_ops: %s\n", gp_last_error());
        exit(0);
    }
    float *f = p;
    for (int64_t i = 0; i < n; i++) f[i] = v * (float)((i * 7919) % 1000 - 500) / 500.0f;
    return f;
}

static void unbuf(gp_device *dev, float *p, int64_t n)
{
    gp_dev_free(dev, p, (size_t)n * sizeof(float), GP_MEM_ACTIVATIONS);
}

typedef struct shape { int64_t c, k, hw; } shape;
static const shape shapes[] = {{1, 64, 28}, {64, 64, 28}, {64, 128, 14},
                               {128, 128, 14}, {128, 256, 7}, {256, 256, 7}};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])
#define BATCH 128

static void report(gp_status s)
{
    if (s != GP_OK) {
        fprintf(stderr, "bench_ops: %s\n", gp_last_error());
        exit(0);
    }
}

/* Best-of-REPS seconds of conv fwd, bwd_data, bwd_weights for one shape. */
static void time_conv(gp_device *dev, const shape *sh, double t[3])
{
    gp_conv_desc d = {BATCH, sh->c, sh->hw, sh->hw, sh->k, 3, 3, 1, 1, 1, 1, sh->hw, sh->hw, 1, 0, 0};
    int64_t nx = BATCH * sh->c * sh->hw * sh->hw, ny = BATCH * sh->k * sh->hw * sh->hw;
    int64_t nw = sh->k * sh->c * 9;
    float *x = buf(dev, nx, 1), *w = buf(dev, nw, 0.1f), *b = buf(dev, sh->k, 0.1f);
    float *y = buf(dev, ny, 0), *dy = buf(dev, ny, 1), *dx = buf(dev, nx, 0);
    float *dw = buf(dev, nw, 0), *db = buf(dev, sh->k, 0);
    t[0] = t[1] = t[2] = 1e30;
    for (int r = 0; r <= REPS; r++) { /* r == 0 is the warm-up (creates primitives) */
        double t0 = gp_now();
        report(gp_dev_conv_fwd(dev, &d, x, w, b, y));
        double t1 = gp_now();
        report(gp_dev_conv_bwd_data(dev, &d, w, dy, dx));
        double t2 = gp_now();
        report(gp_dev_conv_bwd_weights(dev, &d, x, dy, dw, db));
        double t3 = gp_now();
        if (r == 0) continue;
        if (t1 - t0 < t[0]) t[0] = t1 - t0;
        if (t2 - t1 < t[1]) t[1] = t2 - t1;
        if (t3 - t2 < t[2]) t[2] = t3 - t2;
    }
    unbuf(dev, x, nx); unbuf(dev, w, nw); unbuf(dev, b, sh->k); unbuf(dev, y, ny);
    unbuf(dev, dy, ny); unbuf(dev, dx, nx); unbuf(dev, dw, nw); unbuf(dev, db, sh->k);
}

static double conv_flops(const shape *sh)
{
    return 2.0 * BATCH * (double)sh->k * (double)sh->c * 9.0 * (double)(sh->hw * sh->hw);
}

/* Best-of-REPS seconds of the memory-bound ops after one conv of `sh`:
 * bn fwd+bwd, relu fwd+bwd, and (if pooled) max pool fwd+bwd; on the plain
 * layout, or (blk > 0) on the channel-blocked one of a stage's chain. */
static double time_other(gp_device *dev, const shape *sh, int pooled, int64_t blk)
{
    int64_t hw = sh->hw, n = BATCH * sh->k * hw * hw;
    gp_bn_desc bd = {BATCH, sh->k, hw * hw, 1e-5f, blk, false, NULL, NULL};
    gp_pool_desc pd = {BATCH, sh->k, hw, hw, 2, 2, 2, 2, 0, 0, hw / 2, hw / 2, GP_POOL_MAX, blk, false};
    int64_t np = BATCH * sh->k * (hw / 2) * (hw / 2);
    float *x = buf(dev, n, 1), *y = buf(dev, n, 0), *z = buf(dev, n, 0), *dz = buf(dev, n, 1);
    float *g = buf(dev, sh->k, 1), *be = buf(dev, sh->k, 1), *m = buf(dev, sh->k, 0);
    float *v = buf(dev, sh->k, 0), *dg = buf(dev, sh->k, 0), *dbe = buf(dev, sh->k, 0);
    float *p = buf(dev, np, 0), *dp = buf(dev, np, 1);
    size_t wsb = gp_dev_pool_ws_bytes(dev, &pd);
    void *ws = NULL;
    if (pooled && wsb) report(gp_dev_alloc(dev, wsb, GP_MEM_ACTIVATIONS, &ws));
    double best[6] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30};
    for (int r = 0; r <= REPS; r++) {
        double t[7];
        t[0] = gp_now();
        report(gp_dev_bn_fwd_train(dev, &bd, x, g, be, y, m, v));
        t[1] = gp_now();
        report(gp_dev_relu_fwd(dev, y, z, n));
        t[2] = gp_now();
        if (pooled) report(gp_dev_pool_fwd(dev, &pd, z, p, ws));
        t[3] = gp_now();
        if (pooled) report(gp_dev_pool_bwd(dev, &pd, z, p, dp, dz, ws));
        t[4] = gp_now();
        report(gp_dev_relu_bwd(dev, z, dz, y, n));
        t[5] = gp_now();
        report(gp_dev_bn_bwd(dev, &bd, x, g, be, m, v, y, z, dg, dbe));
        t[6] = gp_now();
        for (int i = 0; r > 0 && i < 6; i++)
            if (t[i + 1] - t[i] < best[i]) best[i] = t[i + 1] - t[i];
    }
    printf("  %4lld x %2lldx%-2lld %-7s: bn_fwd %6.2f relu_fwd %6.2f pool_fwd %6.2f pool_bwd %6.2f "
           "relu_bwd %6.2f bn_bwd %6.2f ms\n", (long long)sh->k, (long long)hw, (long long)hw,
           blk ? (blk == 16 ? "nChw16c" : "nChw8c") : "plain",
           best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, best[3] * 1e3, best[4] * 1e3,
           best[5] * 1e3);
    double tot = 0;
    for (int i = 0; i < 6; i++) tot += best[i];
    if (ws) gp_dev_free(dev, ws, wsb, GP_MEM_ACTIVATIONS);
    unbuf(dev, x, n); unbuf(dev, y, n); unbuf(dev, z, n); unbuf(dev, dz, n);
    unbuf(dev, g, sh->k); unbuf(dev, be, sh->k); unbuf(dev, m, sh->k); unbuf(dev, v, sh->k);
    unbuf(dev, dg, sh->k); unbuf(dev, dbe, sh->k); unbuf(dev, p, np); unbuf(dev, dp, np);
    return tot;
}

static gp_device *open_dev(int threads, const char *layout)
{
    if (layout) setenv("GPIPE_CPU_CONV", layout, 1);
    else unsetenv("GPIPE_CPU_CONV");
    gp_device *dev = NULL;
    gp_device_opts o = {.threads = threads};
    report(gp_device_open("cpu:0", &o, &dev));
    gp_device_bind_thread(dev);
    unsetenv("GPIPE_CPU_CONV");
    return dev;
}

/* Batch norm's training forward + backward on bf16 storage in oneDNN's
 * nChw16c (the layout of a blocked chain), the convnet's maps at batch
 * 128: gpipe's loops (gp_dev_bn_*_bf16) against oneDNN's own bf16 batch
 * normalization (scale and shift, FP32 statistics), on a precision-bf16
 * device; issue 50 asks for oneDNN's where it is faster.  Skipped where
 * the processor has no bf16 instructions (the device refuses bf16). */
#define BN_DNNL(call)                                                               \
    do {                                                                            \
        if ((call) != dnnl_success) {                                               \
            fprintf(stderr, "bench_ops: %s failed\n", #call);                       \
            exit(0);                                                                \
        }                                                                           \
    } while (0)

static void time_bn_bf16(int threads)
{
    gp_device_opts o = {.threads = threads, .precision = GP_PRECISION_BF16};
    gp_device *dev = NULL;
    if (gp_device_open("cpu:1", &o, &dev) != GP_OK) {
        printf("\nbf16 batch norm: %s (not measured)\n", gp_last_error());
        gp_error_clear();
        return;
    }
    gp_device_bind_thread(dev);
    omp_set_num_threads(threads);
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    BN_DNNL(dnnl_engine_create(&eng, dnnl_cpu, 0));
    BN_DNNL(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    printf("\nbf16 batch norm fwd (training) + bwd, nChw16c, batch %d, %d threads: gpipe's loops "
           "against oneDNN's\n", BATCH, threads);
    static const int64_t bs[][2] = {{64, 28}, {128, 14}, {256, 7}};
    for (int s = 0; s < 3; s++) {
        int64_t c = bs[s][0], hw = bs[s][1], n = BATCH * c * hw * hw;
        gp_bn_desc bd = {BATCH, c, hw * hw, 1e-5f, 16, false, NULL, NULL};
        uint16_t *x = (uint16_t *)buf(dev, (n + 1) / 2, 0), *y = (uint16_t *)buf(dev, (n + 1) / 2, 0);
        uint16_t *dy = (uint16_t *)buf(dev, (n + 1) / 2, 0), *dx = (uint16_t *)buf(dev, (n + 1) / 2, 0);
        for (int64_t i = 0; i < n; i++) {
            x[i] = gp_ew_bf16_bits((float)((i * 7919) % 1000 - 500) / 250.0f);
            dy[i] = gp_ew_bf16_bits((float)((i * 104729) % 1000 - 500) / 500.0f);
        }
        float *g = buf(dev, c, 1), *be = buf(dev, c, 1), *m = buf(dev, c, 0), *v = buf(dev, c, 0);
        float *dg = buf(dev, c, 0), *dbe = buf(dev, c, 0);
        /* oneDNN's */
        dnnl_memory_desc_t dmd, cmd;
        dnnl_dims_t dims = {BATCH, c, hw, hw}, cd = {c};
        BN_DNNL(dnnl_memory_desc_init_by_tag(&dmd, 4, dims, dnnl_bf16, dnnl_nChw16c));
        BN_DNNL(dnnl_memory_desc_init_by_tag(&cmd, 1, cd, dnnl_f32, dnnl_a));
        unsigned flags = dnnl_use_scale | dnnl_use_shift;
        dnnl_batch_normalization_desc_t fd, bdd;
        dnnl_primitive_desc_t fpd, bpd;
        dnnl_primitive_t fp, bp;
        BN_DNNL(dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &dmd, 1e-5f,
                                                           flags));
        BN_DNNL(dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL));
        BN_DNNL(dnnl_batch_normalization_backward_desc_init(&bdd, dnnl_backward, &dmd, &dmd, 1e-5f,
                                                            flags));
        BN_DNNL(dnnl_primitive_desc_create(&bpd, &bdd, NULL, eng, fpd));
        BN_DNNL(dnnl_primitive_create(&fp, fpd));
        BN_DNNL(dnnl_primitive_create(&bp, bpd));
        const char *impl_f = "", *impl_b = "";
        dnnl_primitive_desc_query(fpd, dnnl_query_impl_info_str, 0, &impl_f);
        dnnl_primitive_desc_query(bpd, dnnl_query_impl_info_str, 0, &impl_b);
        dnnl_memory_t mx, my, mdy, mdx, mg, mb, mm, mv, mdg, mdb;
        BN_DNNL(dnnl_memory_create(&mx, &dmd, eng, x));
        BN_DNNL(dnnl_memory_create(&my, &dmd, eng, y));
        BN_DNNL(dnnl_memory_create(&mdy, &dmd, eng, dy));
        BN_DNNL(dnnl_memory_create(&mdx, &dmd, eng, dx));
        BN_DNNL(dnnl_memory_create(&mg, &cmd, eng, g));
        BN_DNNL(dnnl_memory_create(&mb, &cmd, eng, be));
        BN_DNNL(dnnl_memory_create(&mm, &cmd, eng, m));
        BN_DNNL(dnnl_memory_create(&mv, &cmd, eng, v));
        BN_DNNL(dnnl_memory_create(&mdg, &cmd, eng, dg));
        BN_DNNL(dnnl_memory_create(&mdb, &cmd, eng, dbe));
        dnnl_exec_arg_t fa[] = {{DNNL_ARG_SRC, mx},      {DNNL_ARG_DST, my},
                                {DNNL_ARG_SCALE, mg},    {DNNL_ARG_SHIFT, mb},
                                {DNNL_ARG_MEAN, mm},     {DNNL_ARG_VARIANCE, mv}};
        dnnl_exec_arg_t ba[] = {{DNNL_ARG_SRC, mx},         {DNNL_ARG_DIFF_DST, mdy},
                                {DNNL_ARG_SCALE, mg},       {DNNL_ARG_SHIFT, mb},
                                {DNNL_ARG_MEAN, mm},
                                {DNNL_ARG_VARIANCE, mv},    {DNNL_ARG_DIFF_SRC, mdx},
                                {DNNL_ARG_DIFF_SCALE, mdg}, {DNNL_ARG_DIFF_SHIFT, mdb}};
        double best[4] = {1e30, 1e30, 1e30, 1e30};
        for (int r = 0; r <= REPS; r++) {
            double t[5];
            t[0] = gp_now();
            report(gp_dev_bn_fwd_train_bf16(dev, &bd, x, g, be, y, m, v));
            t[1] = gp_now();
            report(gp_dev_bn_bwd_bf16(dev, &bd, x, g, be, m, v, dy, dx, dg, dbe));
            t[2] = gp_now();
            BN_DNNL(dnnl_primitive_execute(fp, strm, 6, fa));
            BN_DNNL(dnnl_stream_wait(strm));
            t[3] = gp_now();
            BN_DNNL(dnnl_primitive_execute(bp, strm, 9, ba));
            BN_DNNL(dnnl_stream_wait(strm));
            t[4] = gp_now();
            for (int i = 0; r > 0 && i < 4; i++)
                if (t[i + 1] - t[i] < best[i]) best[i] = t[i + 1] - t[i];
        }
        printf("  %4lld x %2lldx%-2lld: gpipe fwd %6.2f bwd %6.2f ms | oneDNN (%s, %s) fwd %6.2f "
               "bwd %6.2f ms\n", (long long)c, (long long)hw, (long long)hw, best[0] * 1e3,
               best[1] * 1e3, impl_f, impl_b, best[2] * 1e3, best[3] * 1e3);
        dnnl_memory_t all[] = {mx, my, mdy, mdx, mg, mb, mm, mv, mdg, mdb};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) dnnl_memory_destroy(all[i]);
        dnnl_primitive_destroy(fp);
        dnnl_primitive_destroy(bp);
        dnnl_primitive_desc_destroy(fpd);
        dnnl_primitive_desc_destroy(bpd);
        unbuf(dev, (float *)x, (n + 1) / 2); unbuf(dev, (float *)y, (n + 1) / 2);
        unbuf(dev, (float *)dy, (n + 1) / 2); unbuf(dev, (float *)dx, (n + 1) / 2);
        unbuf(dev, g, c); unbuf(dev, be, c); unbuf(dev, m, c); unbuf(dev, v, c);
        unbuf(dev, dg, c); unbuf(dev, dbe, c);
    }
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    gp_device_close(dev);
}

/* GELU fwd+bwd over a tiny GPT's MLP activations (batch 16 x 256
 * positions x 4 * 128 wide): the backend's (oneDNN) against the plain loop
 * over elementwise.h the CPU backend ran before, in one run. */
static void time_gelu(gp_device *dev)
{
    const int64_t n = 16 * 256 * 512;
    float *x = buf(dev, n, 4), *y = buf(dev, n, 0), *dy = buf(dev, n, 1), *dx = buf(dev, n, 0);
    double best[2] = {1e30, 1e30};
    for (int r = 0; r <= REPS; r++) {
        double t0 = gp_now();
        report(gp_dev_gelu_fwd(dev, x, y, n));
        report(gp_dev_gelu_bwd(dev, x, dy, dx, n));
        double t1 = gp_now();
        for (int64_t i = 0; i < n; i++) y[i] = gp_ew_gelu(x[i]);
        for (int64_t i = 0; i < n; i++) dx[i] = gp_ew_gelu_bwd(x[i], dy[i]);
        double t2 = gp_now();
        if (r > 0 && t1 - t0 < best[0]) best[0] = t1 - t0;
        if (r > 0 && t2 - t1 < best[1]) best[1] = t2 - t1;
    }
    printf("\ngelu fwd+bwd, %lld elements: backend %.2f ms (%.2f ns/element), plain loop "
           "(1 thread) %.2f ms (%.2f ns/element)\n", (long long)n, best[0] * 1e3,
           best[0] * 1e9 / (double)n, best[1] * 1e3, best[1] * 1e9 / (double)n);
    unbuf(dev, x, n); unbuf(dev, y, n); unbuf(dev, dy, n); unbuf(dev, dx, n);
}

/* Causal attention's forward and backward (gp_dev_attn_*), FP32, at the
 * tiny GPT's sizes (batch 32, 128 positions, 4 heads of 32) and GPT-2's
 * (batch 2, 1024 positions, 12 heads of 64).  The kernels' width is the
 * processor's (16 floats with AVX-512, else 8); GPIPE_ATTN_WIDTH=8 in the
 * environment times the 8-wide build on an AVX-512 processor. */
static void time_attn(gp_device *dev)
{
    static const struct { const char *name; int64_t b, t, heads, c; } cases[] = {
        {"tiny-gpt", 32, 128, 4, 128}, {"gpt-2", 2, 1024, 12, 768}};
    const char *w = getenv("GPIPE_ATTN_WIDTH");
    printf("\ncausal attention, FP32 (%s):\n", w && !strcmp(w, "8") ? "GPIPE_ATTN_WIDTH=8"
                                                                  : "the processor's width");
    for (int k = 0; k < 2; k++) {
        const int64_t b = cases[k].b, t = cases[k].t, h = cases[k].heads, c = cases[k].c;
        const int64_t nx = b * t * 3 * c, ny = b * t * c;
        float *x = buf(dev, nx, 2), *y = buf(dev, ny, 0), *lse = buf(dev, b * h * t, 0);
        float *dy = buf(dev, ny, 1), *dx = buf(dev, nx, 0);
        double best[2] = {1e30, 1e30};
        for (int r = 0; r <= REPS; r++) {
            double t0 = gp_now();
            report(gp_dev_attn_fwd(dev, x, y, lse, b, t, h, h, c));
            double t1 = gp_now();
            report(gp_dev_attn_bwd(dev, x, y, lse, dy, dx, b, t, h, h, c));
            double t2 = gp_now();
            if (r > 0 && t1 - t0 < best[0]) best[0] = t1 - t0;
            if (r > 0 && t2 - t1 < best[1]) best[1] = t2 - t1;
        }
        printf("  %-8s b %lld, t %lld, %lld heads of %lld: forward %.2f ms, backward %.2f ms\n",
               cases[k].name, (long long)b, (long long)t, (long long)h, (long long)(c / h),
               best[0] * 1e3, best[1] * 1e3);
        unbuf(dev, x, nx); unbuf(dev, y, ny); unbuf(dev, lse, b * h * t);
        unbuf(dev, dy, ny); unbuf(dev, dx, nx);
    }
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads <= 0) threads = 2;
    gp_log_set_level(GP_LOG_WARN);
    gp_device *dev = open_dev(threads, NULL);

    const int64_t G = 4096;
    float *a = buf(dev, G * G, 1), *b = buf(dev, G * G, 1), *c = buf(dev, G * G, 0);
    double tg = 1e30;
    for (int r = 0; r <= 3; r++) {
        double t0 = gp_now();
        report(gp_dev_gemm(dev, 0, 0, G, G, G, 1.0f, a, G, b, G, 0.0f, c, G));
        double t = gp_now() - t0;
        if (r > 0 && t < tg) tg = t;
    }
    unbuf(dev, a, G * G); unbuf(dev, b, G * G); unbuf(dev, c, G * G);
    double gemm_gf = 2.0 * (double)G * G * G / tg / 1e9;
    printf("CPU backend ops, %d threads, batch %d (best of %d)\n", threads, BATCH, REPS);
    printf("sgemm 4096^3: %.1f ms, %.1f GFLOP/s (the ceiling)\n\n", tg * 1e3, gemm_gf);

    printf("%-16s %-8s | %9s %7s %5s | %9s %7s %5s | %9s %7s %5s\n", "conv 3x3 p1", "layout",
           "fwd ms", "GF/s", "%gem", "bwd_d ms", "GF/s", "%gem", "bwd_w ms", "GF/s", "%gem");
    const char *layouts[3] = {NULL, "plain", "blocked"};
    const char *lnames[3] = {"auto", "plain", "blocked"};
    double conv_total_t = 0, conv_total_f = 0;
    int nlayouts = argc > 2 && !strcmp(argv[2], "quick") ? 1 : 3;
    for (int l = 0; l < nlayouts; l++) {
        gp_device *ld = l == 0 ? dev : open_dev(threads, layouts[l]);
        for (int s = 0; s < NSHAPES; s++) {
            double t[3];
            time_conv(ld, &shapes[s], t);
            double f = conv_flops(&shapes[s]);
            char name[32];
            snprintf(name, sizeof name, "%lld->%lld @%lld", (long long)shapes[s].c,
                     (long long)shapes[s].k, (long long)shapes[s].hw);
            printf("%-16s %-8s", name, lnames[l]);
            for (int i = 0; i < 3; i++)
                printf(" | %9.2f %7.1f %4.0f%%", t[i] * 1e3, f / t[i] / 1e9,
                       100.0 * f / t[i] / 1e9 / gemm_gf);
            printf("\n");
            if (l == 0) {
                /* the first layer's dx is never needed in training */
                conv_total_t += t[0] + t[2] + (s == 0 ? 0 : t[1]);
                conv_total_f += f * (s == 0 ? 2 : 3);
            }
        }
        if (l != 0) gp_device_close(ld);
        printf("\n");
    }

    printf("bn+relu(+maxpool) fwd+bwd after each conv:\n");
    double other_t = 0;
    for (int s = 0; s < NSHAPES; s++) {
        int pooled = s % 2 == 1;
        double t = time_other(dev, &shapes[s], pooled, 0);
        other_t += t;
        gp_conv_desc cd = {BATCH, shapes[s].k, shapes[s].hw, shapes[s].hw, shapes[s].k, 3, 3, 1, 1,
                           1, 1, shapes[s].hw, shapes[s].hw, 1, 0, 0};
        int64_t blk = gp_dev_act_block(dev, &cd, true);
        if (blk) time_other(dev, &shapes[s], pooled, blk);
    }
    double step_gf = conv_total_f / (conv_total_t + other_t) / 1e9;
    printf("\nconvnet step estimate (convs + bn/relu/pool, linear head omitted):\n"
           "  convs %.1f ms (%.1f GF/s), other %.1f ms, total %.1f ms -> %.1f GF/s = %.0f%% of sgemm\n",
           conv_total_t * 1e3, conv_total_f / conv_total_t / 1e9, other_t * 1e3,
           (conv_total_t + other_t) * 1e3, step_gf, 100.0 * step_gf / gemm_gf);
    time_gelu(dev);
    time_attn(dev);
    time_bn_bf16(threads);
    printf("primitives created: %lld\n", (long long)gp_cpu_primitives_created(dev));
    gp_device_close(dev);
    return 0;
}
