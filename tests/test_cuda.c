/*
 * test_cuda.c — the CUDA backend against the CPU backend (itself checked
 * against naive double-precision loops in test_backend.c) on the same
 * inputs: every math slot of the device interface, the accumulate (+=) vs
 * overwrite (=) conventions, the caching allocator's accounting and OOM
 * message, copies (host, device, peer between two GPUs), events, the NCCL
 * all-reduce, broadcast, reduce-scatter and all-gather against a sum on the
 * host (two GPUs, sizes 1, 3 and 100001: uneven chunks, one of them
 * empty), pinned host buffers, every layer type's forward and
 * backward (output, dx, parameter gradients and buffers within 1e-4 x (1 +
 * max |cpu|); per-axis windows, both average divisors, factorized_reduce
 * and the kaiming_normal_fan_out init among them) with initial parameters
 * bitwise equal on both devices, and the pipeline transparency check:
 * an MLP with dropout and a convnet with batch norm trained for 3 steps on
 * cuda:0,cuda:1 (2 stages; test_cuda runs 1 stage on cuda:0) for m in {1, 4},
 * against the same steps on one CPU device: parameters (and separately the
 * batch-norm buffers) within 1e-3 of the largest change the steps made to
 * them, the loss of every step within 1e-4 relative (the kernels sum in
 * other orders; with CPU devices standing in for the GPUs the differences
 * are 0, and a 1% error in the learning rate fails every case).
 *
 * Error bound per op: max |gpu - cpu| <= tol * (1 + max |cpu|) with
 *   0     fill, scale, add, mul, relu fwd/bwd, add_bias_rows, dropout mask and apply
 *         (same float operation per element; the mask uses the same Philox),
 *         max pooling, nonfinite, xent's correct count and bad row, leaky
 *         relu fwd/bwd, mul_rows, upsample forward, bce's correct count and
 *         bad element
 *   1e-6  axpy, sgd and sgd_multi (nvcc may fuse a*x+y into one FMA), sum_rows, average
 *         pooling, xent and bce gradients, upsample backward (the GPU sums
 *         a block in double, the CPU in float)
 *   1e-12 sumsq, xent and bce loss (double accumulation, another order)
 *   1e-5  attention forward (y and log-sum-exp: one thread per row against
 *         the CPU's tiles, which rescale in another order),
 *         gemm (another summation order over k; cuBLASLt's measured algorithm,
 *         the heuristics' first, and cublasSgemm), linear_fwd (the same
 *         with the bias and relu as cuBLASLt's epilogue or gpipe's kernel,
 *         a NaN kept by the relu), log-softmax, batch norm
 *         forward (y, mean, biased var), inference
 *   1e-4  attention backward (dq, dk, dv), convolutions (cuDNN may pick Winograd or FFT algorithms; checked
 *         with the measured choice and again on a train.deterministic
 *         handle, with the searches each made: 3 per shape, then 0; none)
 *         and batch norm backward (dx, dgamma +=, dbeta +=), also SyncBN's
 *   1e-5  SyncBN statistics and backward sums (double sums, another order)
 *   2e-5  precision bf16's matrix products against a double product of the
 *         operands rounded to bfloat16 (test_bf16_ops; and 4e-3 off the
 *         unrounded product, so the check sees the rounding)
 *   4e-3  precision bf16's convolutions (their result rounded to bfloat16
 *         too) against the CPU's FP32 on the rounded operands; and bf16
 *         training within 2% of the CPU's FP32 losses (test_bf16_training)
 *
 * Two CTest tests, both labelled "gpu": test_cuda (what one GPU can check;
 * its pipeline is 1 stage on cuda:0, its copies stay on it) and test_cuda_2gpu
 * (`test_cuda --two-gpus`: peer copies both ways, the NCCL collectives, the
 * barrier, abort and reset, and the 2-stage pipeline on cuda:0,cuda:1),
 * which exits 77 with fewer than two GPUs, so a one-GPU machine reports it
 * skipped, not passed.
 * Without a CUDA device (or in a build without the CUDA backend) both check
 * that opening cuda:0 fails with GP_ERR_UNSUPPORTED and a message that says
 * why, print the message and exit 77, which CTest reports as skipped.
 * test_cuda ran on an H100 on 2026-11-23 and 2026-11-24 (bench/README.md,
 * "GPU"); test_cuda_2gpu has never had two GPUs.
 */
#include "backend/backend.h"
#include "backend/elementwise.h"
#include "config/config.h"
#include "layers/layers.h"
#include "train/train.h"
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- a buffer on both devices: [0] cpu:0 (reference), [1] cuda:N ----------- */

static gp_device *D2[2];

typedef struct {
    float *p[2];
    int64_t n;
} buf;

/* UPDATE_PARTS consecutive slices of x on each device as an update's parts: sizes
 * from 0 up (slice 5 empty), each its own decay (wd_step x 0..3); with v2
 * (Adam's second moment) every part has both states, without it every
 * third part has no momentum (plain SGD). */
enum { UPDATE_PARTS = 40 };
static void update_slices(gp_update_part (*parts)[UPDATE_PARTS], const buf *x, const buf *g,
                          const buf *v, const buf *v2, float wd_step)
{
    int64_t n = x->n;
    for (int k = 0; k < 2; k++) {
        int64_t off = 0;
        for (int p = 0; p < UPDATE_PARTS; p++) {
            int64_t len = p == 5 ? 0 : (n / UPDATE_PARTS) * (p % 3) / 2 + p;
            if (off + len > n) len = n - off;
            parts[k][p] = (gp_update_part){.w = x->p[k] + off, .g = g->p[k] + off,
                                           .v = v2 || p % 3 ? v->p[k] + off : NULL,
                                           .v2 = v2 ? v2->p[k] + off : NULL, .n = len,
                                           .wd = wd_step * (float)(p % 4)};
            off += len;
        }
    }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static buf bnew(int64_t n)
{
    buf b = {{NULL, NULL}, n};
    for (int k = 0; k < 2; k++) {
        void *p = NULL;
        gp_status s = gp_dev_alloc(D2[k], (size_t)(n > 0 ? n : 1) * sizeof(float),
                                   GP_MEM_ACTIVATIONS, &p);
        if (s != GP_OK) {
            fprintf(stderr, "allocation of %lld floats on %s failed: %s\n", (long long)n,
                    D2[k]->name, gp_last_error());
            exit(1);
        }
        b.p[k] = p;
    }
    return b;
}

static void bset(buf *b, const float *h)
{
    for (int k = 0; k < 2; k++) CHECK_OK(gp_dev_upload(D2[k], b->p[k], h, b->n));
}

/* Random values in [lo, hi) (the same on both devices). */
static buf brand(int64_t n, float lo, float hi)
{
    buf b = bnew(n);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * 0.5f * (frand() + 1.0f);
    bset(&b, h);
    free(h);
    return b;
}

/* Garbage that "=" outputs must overwrite. */
static buf bjunk(int64_t n)
{
    buf b = bnew(n);
    for (int k = 0; k < 2; k++) CHECK_OK(gp_dev_fill(D2[k], b.p[k], 1e6f, n));
    return b;
}

static void bfree(buf *b)
{
    for (int k = 0; k < 2; k++)
        gp_dev_free(D2[k], b->p[k], (size_t)(b->n > 0 ? b->n : 1) * sizeof(float),
                    GP_MEM_ACTIVATIONS);
}

/* Over a buffer on both devices: max |gpu - cpu| (a NaN counts as the
 * largest), where it is and the two values there, and max |cpu|. */
typedef struct {
    double err, ref, gpu, cpu;
    int64_t at;
} bstat;

static bstat bstats(const buf *b)
{
    size_t bytes = (size_t)(b->n > 0 ? b->n : 1) * sizeof(float);
    float *h[2] = {malloc(bytes), malloc(bytes)};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gp_dev_download(D2[k], h[k], b->p[k], b->n));
        CHECK_OK(gp_dev_synchronize(D2[k]));
    }
    bstat st = {0, 0, 0, 0, 0};
    for (int64_t i = 0; i < b->n; i++) {
        double e = fabs((double)h[1][i] - (double)h[0][i]);
        if (!(e <= st.err)) { st.err = e; st.at = i; }
        if (fabs((double)h[0][i]) > st.ref) st.ref = fabs((double)h[0][i]);
    }
    if (b->n) st.gpu = h[1][st.at], st.cpu = h[0][st.at];
    free(h[0]);
    free(h[1]);
    return st;
}

/* max |gpu - cpu| / (1 + max |cpu|) */
static double bdiff(const buf *b)
{
    bstat st = bstats(b);
    return st.err / (1.0 + st.ref);
}

/* max |gpu - cpu| <= tol * (1 + max |cpu|) */
static void bcheck(const char *what, const buf *b, double tol)
{
    bstat st = bstats(b);
    CHECK_MSG(st.err <= tol * (1.0 + st.ref),
              "%s: max |gpu - cpu| %.3g at %lld (gpu %.9g, cpu %.9g), max |cpu| %.3g, tol %.1g",
              what, st.err, (long long)st.at, st.gpu, st.cpu, st.ref, tol);
}

/* Run `call` on both devices: D is the device, K its index into buf.p. */
#define BOTH(call)                                                              \
    do {                                                                        \
        for (int K = 0; K < 2; K++) {                                           \
            gp_device *D = D2[K];                                               \
            CHECK_OK(call);                                                     \
        }                                                                       \
    } while (0)

/* ---- elementwise and reductions ---------------------------------------------- */

static void test_elementwise(void)
{
    const int64_t n = 100003; /* odd, several blocks */
    buf x = brand(n, -1, 1), y = brand(n, -1, 1), z = bjunk(n), g = brand(n, -1, 1);
    buf v = brand(n, -0.1f, 0.1f);
    BOTH(gp_dev_fill(D, z.p[K], 2.5f, n));
    bcheck("fill", &z, 0);
    BOTH(gp_dev_scale(D, z.p[K], -0.75f, n));
    bcheck("scale", &z, 0);
    BOTH(gp_dev_axpy(D, 0.3f, x.p[K], z.p[K], n));
    bcheck("axpy y += a x", &z, 1e-6);
    BOTH(gp_dev_add(D, x.p[K], y.p[K], z.p[K], n));
    bcheck("add", &z, 0);
    BOTH(gp_dev_mul(D, x.p[K], y.p[K], z.p[K], n));
    bcheck("mul", &z, 0);
    BOTH(gp_dev_relu_fwd(D, x.p[K], z.p[K], n));
    bcheck("relu_fwd", &z, 0);
    buf dx = bjunk(n);
    BOTH(gp_dev_relu_bwd(D, z.p[K], y.p[K], dx.p[K], n));
    bcheck("relu_bwd", &dx, 0);
    BOTH(gp_dev_leaky_relu_fwd(D, x.p[K], z.p[K], n, 0.01f));
    bcheck("leaky_relu_fwd", &z, 0);
    BOTH(gp_dev_leaky_relu_bwd(D, z.p[K], y.p[K], dx.p[K], n, 0.01f));
    bcheck("leaky_relu_bwd", &dx, 0);
    /* n = 100003 = 7 x 14286 + 1: rows of 7 over the first n - 1 */
    buf f = brand((n - 1) / 7, -2, 2);
    BOTH(gp_dev_mul_rows(D, x.p[K], f.p[K], z.p[K], (n - 1) / 7, 7));
    bcheck("mul_rows", &z, 0);
    bfree(&f);
    /* upsampling (2, 3, 37, 41) by 3 = 81918 values, within n */
    BOTH(gp_dev_upsample_fwd(D, x.p[K], z.p[K], 2, 3, 37, 41, 3));
    bcheck("upsample_fwd", &z, 0);
    buf us = bjunk(2 * 3 * 37 * 41);
    BOTH(gp_dev_upsample_bwd(D, y.p[K], us.p[K], 2, 3, 37, 41, 3));
    bcheck("upsample_bwd", &us, 1e-6);
    bfree(&us);
    { /* causal attention, (2, 70, 3C = 36), 3 heads of 4 */
        buf ax = brand(2 * 70 * 36, -2, 2), ady = brand(2 * 70 * 12, -1, 1);
        buf ay = bjunk(2 * 70 * 12), al = bjunk(2 * 3 * 70), adx = bjunk(2 * 70 * 36);
        BOTH(gp_dev_attn_fwd(D, ax.p[K], ay.p[K], al.p[K], 2, 70, 3, 3, 12));
        bcheck("attn_fwd y", &ay, 1e-5);
        bcheck("attn_fwd lse", &al, 1e-5);
        BOTH(gp_dev_attn_bwd(D, ax.p[K], ay.p[K], al.p[K], ady.p[K], adx.p[K], 2, 70, 3, 3, 12));
        bcheck("attn_bwd", &adx, 1e-4);
        /* grouped-query (issue 66): 6 query heads of 4 over 2 k, v heads,
         * (2, 70, 24 + 2 * 2 * 4 = 40) in the same buffers' first values */
        buf gx = brand(2 * 70 * 40, -2, 2), gdy = brand(2 * 70 * 24, -1, 1);
        buf gy = bjunk(2 * 70 * 24), gl = bjunk(2 * 6 * 70), gdx = bjunk(2 * 70 * 40);
        BOTH(gp_dev_attn_fwd(D, gx.p[K], gy.p[K], gl.p[K], 2, 70, 6, 2, 24));
        bcheck("grouped attn_fwd y", &gy, 1e-5);
        bcheck("grouped attn_fwd lse", &gl, 1e-5);
        BOTH(gp_dev_attn_bwd(D, gx.p[K], gy.p[K], gl.p[K], gdy.p[K], gdx.p[K], 2, 70, 6, 2, 24));
        bcheck("grouped attn_bwd", &gdx, 1e-4);
        /* the KV cache (attn_cached, sampling): the first sequence's 70
         * positions fed as 50 and then 20 into a cache of 72, against the
         * CPU's (whose bits are attn_fwd's); the cache's rows exact */
        buf cy = bjunk(70 * 24), ckv = bjunk(72 * 16);
        BOTH(gp_dev_attn_cached(D, GP_F32, gx.p[K], ckv.p[K], cy.p[K], 1, 50, 0, 72, 6, 2, 24));
        BOTH(gp_dev_attn_cached(D, GP_F32, gx.p[K] + 50 * 40, ckv.p[K], cy.p[K] + 50 * 24, 1,
                                20, 50, 72, 6, 2, 24));
        bcheck("attn_cached y", &cy, 1e-5);
        bcheck("attn_cached cache", &ckv, 0);
        bfree(&cy);
        bfree(&ckv);
        bfree(&gx); bfree(&gdy); bfree(&gy); bfree(&gl); bfree(&gdx);
        bfree(&ax);
        bfree(&ady);
        bfree(&ay);
        bfree(&al);
        bfree(&adx);
    }
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        BOTH(gp_dev_sgd_update(D, x.p[K], g.p[K], v.p[K], n, 0.05f, 0.9f, 1e-4f, nesterov));
        bcheck(nesterov ? "sgd nesterov w" : "sgd w", &x, 1e-6);
        bcheck(nesterov ? "sgd nesterov v" : "sgd v", &v, 1e-6);
    }
    /* sgd_multi: 40 slices of x (two launches of up to 32 parts; sizes 0
     * up, every third without momentum, each its own decay) */
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        gp_update_part parts[2][UPDATE_PARTS];
        update_slices(parts, &x, &g, &v, NULL, 1e-4f);
        for (int k = 0; k < 2; k++)
            CHECK_OK(gp_dev_sgd_multi(D2[k], parts[k], UPDATE_PARTS, 0.05f, 0.9f, nesterov));
        bcheck(nesterov ? "sgd_multi nesterov w" : "sgd_multi w", &x, 1e-6);
        bcheck(nesterov ? "sgd_multi nesterov v" : "sgd_multi v", &v, 1e-6);
    }
    /* adam_multi: the same 40 slices, Adam and AdamW, three steps (the
     * bias corrections of t = 1, 2, 3); the second moment from [0, 1) */
    {
        buf v2 = brand(n, 0, 1);
        gp_update_part parts[2][UPDATE_PARTS];
        update_slices(parts, &x, &g, &v, &v2, 1e-2f);
        for (int t = 1; t <= 3; t++) {
            gp_adam_step a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .step_size = (float)(1e-3 / (1 - pow(0.9, t))),
                              .bc2_sqrt = (float)sqrt(1 - pow(0.999, t)), .decoupled = t != 2};
            for (int k = 0; k < 2; k++) CHECK_OK(gp_dev_adam_multi(D2[k], parts[k], UPDATE_PARTS, &a));
            bcheck("adam_multi w", &x, 1e-6);
            bcheck("adam_multi m", &v, 1e-6);
            bcheck("adam_multi v", &v2, 1e-6);
        }
        bfree(&v2);
    }
    /* dropout: the same Philox bits, so the very same mask, at any offset */
    BOTH(gp_dev_dropout_mask(D, z.p[K], n, 0.3f, 1234, 77, 5));
    bcheck("dropout_mask p=0.3 first=5", &z, 0);
    BOTH(gp_dev_dropout_mask(D, z.p[K], n, 0.0f, 99, 1, 0));
    bcheck("dropout_mask p=0", &z, 0);
    /* the mask drawn on the fly and multiplied in: the same product */
    BOTH(gp_dev_dropout_apply(D, y.p[K], z.p[K], n, 0.3f, 1234, 77, 5));
    bcheck("dropout_apply p=0.3 first=5", &z, 0);
    /* bf16 copies: packed on each device and widened back, the same values
     * (gp_ew_bf16_bits in both, to nearest even), from the same inputs: x
     * has been through the updates above by now, equal within 1e-6 only,
     * and a value that close to a bf16 rounding boundary rounds to either
     * neighbour (an H200 saw one element of 2^14 do so at e937221) */
    buf pk = bjunk((n + 1) / 2), xp = brand(n, -2, 2);
    BOTH(gp_dev_bf16_pack(D, (uint16_t *)pk.p[K], xp.p[K], n));
    BOTH(gp_dev_bf16_unpack(D, z.p[K], (const uint16_t *)pk.p[K], n));
    bcheck("bf16_pack + bf16_unpack", &z, 0);
    bfree(&pk);
    bfree(&xp);

    double ss[2];
    int bad[2];
    for (int k = 0; k < 2; k++) CHECK_OK(gp_dev_sumsq(D2[k], y.p[k], n, &ss[k]));
    CHECK_NEAR(ss[1], ss[0], 0, 1e-12);
    /* sumsq_multi (clipping's one read per stage): each slice the bits
     * sumsq gives it on its device, and the devices agree; 70 slices, so
     * the GPU's second table of partials (past GP_CUK_TABLE) and an empty
     * one (NULL, 0) are in it */
    double multi2[2][70];
    for (int k = 0; k < 2; k++) {
        const float *xs[70] = {y.p[k], y.p[k] + 1000, NULL};
        int64_t ns[70] = {1000, n - 1000, 0};
        for (int t = 3; t < 70; t++) xs[t] = y.p[k] + 97 * t, ns[t] = 1 + (t * 211) % 5000;
        double one[70];
        CHECK_OK(gp_dev_sumsq_multi(D2[k], xs, ns, 70, multi2[k]));
        for (int t = 0; t < 70; t++) CHECK_OK(gp_dev_sumsq(D2[k], xs[t], ns[t], &one[t]));
        CHECK_MSG(!memcmp(multi2[k], one, sizeof one), "sumsq_multi on %s differs from sumsq",
                  D2[k]->name);
        CHECK(multi2[k][2] == 0.0);
        CHECK_NEAR(multi2[k][0] + multi2[k][1], ss[0], 0, 1e-12);
    }
    for (int t = 0; t < 70; t++) CHECK_NEAR(multi2[1][t], multi2[0][t], 0, 1e-12);
    for (int k = 0; k < 2; k++) CHECK_OK(gp_dev_nonfinite(D2[k], y.p[k], n, &bad[k]));
    CHECK(bad[0] == 0 && bad[1] == 0);
    float nan = NAN;
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gp_dev_upload(D2[k], y.p[k] + n - 2, &nan, 1));
        CHECK_OK(gp_dev_nonfinite(D2[k], y.p[k], n, &bad[k]));
    }
    CHECK(bad[0] != 0 && bad[1] != 0);
    /* nonfinite_or_many (the step's NaN check of every parameter in one
     * launch a batch): 70 finite slices, one of them empty, leave the flag;
     * a 71st holding the NaN, past the first batch's end, sets it; on both
     * devices */
    buf flag = bnew(1);
    for (int k = 0; k < 2; k++) {
        const float *xs[71];
        int64_t ns[71];
        for (int t = 0; t < 70; t++) xs[t] = y.p[k] + 10 * t, ns[t] = t == 5 ? 0 : 10;
        xs[70] = y.p[k] + n - 2, ns[70] = 2;
        float got[2];
        for (int c = 0; c < 2; c++) {
            CHECK_OK(gp_dev_fill(D2[k], flag.p[k], 0.0f, 1));
            CHECK_OK(gp_dev_nonfinite_or_many(D2[k], xs, ns, 70 + c, flag.p[k]));
            CHECK_OK(gp_dev_download(D2[k], &got[c], flag.p[k], 1));
            CHECK_OK(gp_dev_synchronize(D2[k]));
        }
        CHECK_MSG(got[0] == 0.0f && got[1] == 1.0f, "nonfinite_or_many on %s: %g %g, want 0 1",
                  D2[k]->name, (double)got[0], (double)got[1]);
    }
    bfree(&flag);

    /* rows x cols */
    const int64_t rows = 301, cols = 67;
    buf m = brand(rows * cols, -1, 1), bias = brand(cols, -1, 1), db = brand(cols, -1, 1);
    BOTH(gp_dev_add_bias_rows(D, m.p[K], bias.p[K], rows, cols));
    bcheck("add_bias_rows +=", &m, 0);
    BOTH(gp_dev_sum_rows(D, m.p[K], db.p[K], rows, cols));
    bcheck("sum_rows db +=", &db, 1e-6);
    bfree(&m); bfree(&bias); bfree(&db);
    /* sum_rows' two passes: one row-block or many, partial column blocks */
    const int64_t shapes[4][2] = {{1, 1}, {8, 2048}, {5000, 33}, {70000, 3}};
    for (int q = 0; q < 4; q++) {
        char what[64];
        buf a = brand(shapes[q][0] * shapes[q][1], -1, 1), s = brand(shapes[q][1], -1, 1);
        BOTH(gp_dev_sum_rows(D, a.p[K], s.p[K], shapes[q][0], shapes[q][1]));
        snprintf(what, sizeof what, "sum_rows %lld x %lld", (long long)shapes[q][0],
                 (long long)shapes[q][1]);
        bcheck(what, &s, 1e-6);
        bfree(&a); bfree(&s);
    }
    bfree(&x); bfree(&y); bfree(&z); bfree(&g); bfree(&v); bfree(&dx);
}

/* ---- gemm ------------------------------------------------------------------------ */

static void test_gemm(void)
{
    const int64_t m = 37, n = 29, k = 53;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
                int64_t lda = ac + 3, ldb = bc + 2, ldc = n + 5;
                buf a = brand(ar * lda, -1, 1), b = brand(br * ldb, -1, 1);
                buf c = acc ? brand(m * ldc, -1, 1) : bjunk(m * ldc);
                float beta = acc ? 1.0f : 0.0f;
                BOTH(gp_dev_gemm(D, ta, tb, m, n, k, 0.75f, a.p[K], lda, b.p[K], ldb, beta,
                                 c.p[K], ldc));
                char what[64];
                snprintf(what, sizeof what, "gemm ta=%d tb=%d beta=%g", ta, tb, (double)beta);
                bcheck(what, &c, 1e-5);
                bfree(&a); bfree(&b); bfree(&c);
            }
    buf c = brand(6 * 4, -1, 1);
    BOTH(gp_dev_gemm(D, 0, 0, 6, 4, 0, 1.0f, c.p[K], 4, c.p[K], 4, 0.5f, c.p[K], 4));
    bcheck("gemm k=0: C = beta C", &c, 0);
    bfree(&c);
}

/* ---- a linear layer's forward: product, bias and relu in one call ------------------ */

/* gp_dev_linear_fwd on D2[1] against the CPU, every combination of bias and
 * relu, an odd shape and one cuBLASLt has many algorithms for; the
 * searches it makes: at most one per shape on its first call, two where
 * the epilogue's shape has no plan and the plain product runs (none with
 * train.deterministic or GPIPE_CUBLASLT=0), none on the second, so a warm
 * step queries nothing.  A NaN in a row of x leaves that row of y NaN with
 * the relu too (gpipe's relu keeps NaN; the epilogue's must not hide one
 * from the NaN check). */
static void test_linear_fwd(const char *tag, bool searches)
{
    static const int64_t shapes[2][3] = {{37, 29, 53}, {64, 256, 128}};
    for (int sh = 0; sh < 2; sh++)
        for (int v = 0; v < 4; v++) {
            bool has_bias = v & 1, relu = v & 2;
            int64_t n = shapes[sh][0], out = shapes[sh][1], in = shapes[sh][2];
            buf x = brand(n * in, -1, 1), w = brand(out * in, -1, 1), b = brand(out, -1, 1);
            buf y = bjunk(n * out);
            for (int rep = 0; rep < 2; rep++) {
                uint64_t searched = D2[1]->algo_searches;
                BOTH(gp_dev_linear_fwd(D, n, out, in, x.p[K], w.p[K], has_bias ? b.p[K] : NULL,
                                       relu, y.p[K]));
                uint64_t made = D2[1]->algo_searches - searched;
                /* the second: an epilogue shape with no plan, whose
                 * plain product cuda_gemm then searches */
                CHECK_MSG(rep == 0 && searches ? made <= 2 : made == 0,
                          "%s: linear %lldx%lldx%lld bias %d relu %d, call %d: %llu searches",
                          tag, (long long)n, (long long)out, (long long)in, has_bias, relu,
                          rep + 1, (unsigned long long)made);
            }
            char what[128];
            snprintf(what, sizeof what, "%s: linear_fwd %lldx%lldx%lld bias %d relu %d", tag,
                     (long long)n, (long long)out, (long long)in, has_bias, relu);
            bcheck(what, &y, 1e-5);
            /* a NaN in row 3 of x */
            float nan = NAN;
            for (int k = 0; k < 2; k++) CHECK_OK(gp_dev_upload(D2[k], x.p[k] + 3 * in + 1, &nan, 1));
            BOTH(gp_dev_linear_fwd(D, n, out, in, x.p[K], w.p[K], has_bias ? b.p[K] : NULL, relu,
                                   y.p[K]));
            float *row = malloc((size_t)out * sizeof *row);
            for (int k = 0; k < 2; k++) {
                CHECK_OK(gp_dev_download(D2[k], row, y.p[k] + 3 * out, out));
                CHECK_OK(gp_dev_synchronize(D2[k]));
                int64_t nans = 0;
                for (int64_t j = 0; j < out; j++) nans += isnan(row[j]) != 0;
                CHECK_MSG(nans == out, "%s on %s: a NaN in row 3 of x left %lld of %lld NaN", what,
                          D2[k]->name, (long long)nans, (long long)out);
            }
            free(row);
            if (has_bias) {
                /* the same shape with a bias only 16-byte aligned (a view
                 * 4 floats into a block): cuBLASLt's heuristics read the
                 * bias pointer's alignment, so the plan chosen for the
                 * 256-aligned bias above must not be reused for it
                 * (cuda_blas.c, balign) */
                buf bb = brand(out + 4, -1, 1), xx = brand(n * in, -1, 1); /* x has a NaN */
                uint64_t searched = D2[1]->algo_searches;
                BOTH(gp_dev_linear_fwd(D, n, out, in, xx.p[K], w.p[K], bb.p[K] + 4, relu,
                                       y.p[K]));
                uint64_t made = D2[1]->algo_searches - searched;
                CHECK_MSG(searches ? made >= 1 && made <= 2 : made == 0,
                          "%s with a 16-byte aligned bias: %llu searches", what,
                          (unsigned long long)made);
                snprintf(what + strlen(what), sizeof what - strlen(what), ", bias 16-byte aligned");
                bcheck(what, &y, 1e-5);
                bfree(&bb); bfree(&xx);
            }
            bfree(&x); bfree(&w); bfree(&b); bfree(&y);
        }
}

/* ---- convolution ------------------------------------------------------------------ */

/* D2[1] was opened with train.deterministic (heuristic, deterministic
 * algorithms: no searches) rather than the default measured choice. */
static bool det_gpu;

/* kernel (kh, kw), stride (sh, sw), padding (ph, pw): each axis its own. */
static void test_conv_hw(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t kh,
                         int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int bias)
{
    gp_conv_desc d = {n, c, h, w, k, kh, kw, sh, sw, ph, pw,
                      (h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1, bias, 0, 0};
    int64_t nx = n * c * h * w, nw = k * c * kh * kw, ny = n * k * d.oh * d.ow;
    buf x = brand(nx, -1, 1), wt = brand(nw, -1, 1), b = brand(k, -1, 1), dy = brand(ny, -1, 1);
    buf y = bjunk(ny), dx = bjunk(nx), dw = brand(nw, -1, 1), db = brand(k, -1, 1);
    char tag[192], what[256];
    snprintf(tag, sizeof tag, "conv n%lld c%lld %lldx%lld k%lld ker%lldx%lld s%lldx%lld "
             "p%lldx%lld b%d", (long long)n, (long long)c, (long long)h, (long long)w,
             (long long)k, (long long)kh, (long long)kw, (long long)sh, (long long)sw,
             (long long)ph, (long long)pw, bias);
    uint64_t searched = D2[1]->algo_searches;
    gp_allocator a0; /* the workspace held before: earlier tests' buffers */
    gp_allocator_reset_peak(&D2[1]->alloc);
    gp_allocator_snapshot(&D2[1]->alloc, &a0);
    for (int rep = 0; rep < 2; rep++) { /* the second call uses the cached algorithms */
        BOTH(gp_dev_conv_fwd(D, &d, x.p[K], wt.p[K], bias ? b.p[K] : NULL, y.p[K]));
        snprintf(what, sizeof what, "%s fwd (call %d)", tag, rep + 1);
        bcheck(what, &y, 1e-4);
        BOTH(gp_dev_conv_bwd_data(D, &d, wt.p[K], dy.p[K], dx.p[K]));
        snprintf(what, sizeof what, "%s bwd_data = (call %d)", tag, rep + 1);
        bcheck(what, &dx, 1e-4);
        BOTH(gp_dev_conv_bwd_weights(D, &d, x.p[K], dy.p[K], dw.p[K], bias ? db.p[K] : NULL));
        snprintf(what, sizeof what, "%s bwd_weights dw += (call %d)", tag, rep + 1);
        bcheck(what, &dw, 1e-4);
        if (bias) {
            snprintf(what, sizeof what, "%s bwd_weights db += (call %d)", tag, rep + 1);
            bcheck(what, &db, 1e-4);
        }
        /* measured choice: one search per direction on the first call, none
         * after; deterministic: none ever */
        uint64_t want = det_gpu ? 0 : 3;
        CHECK_MSG(D2[1]->algo_searches - searched == want,
                  "%s: %llu algorithm searches after call %d, want %llu", tag,
                  (unsigned long long)(D2[1]->algo_searches - searched), rep + 1,
                  (unsigned long long)want);
        /* a search borrows what its algorithms need, not the workspace
         * limit (a sixteenth of the GPU): these maps need a few MiB */
        gp_allocator a;
        gp_allocator_snapshot(&D2[1]->alloc, &a);
        size_t grew = a.peak_by[GP_MEM_WORKSPACE] - a0.cur_by[GP_MEM_WORKSPACE];
        CHECK_MSG(grew <= ((size_t)128 << 20),
                  "%s: the searches' workspace peaked %zu MiB above what was held", tag,
                  grew >> 20);
    }
    bfree(&x); bfree(&wt); bfree(&b); bfree(&dy); bfree(&y); bfree(&dx); bfree(&dw); bfree(&db);
}

static void test_conv_shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t ker,
                            int64_t stride, int64_t pad, int bias)
{
    test_conv_hw(n, c, h, w, k, ker, ker, stride, stride, pad, pad, bias);
}

static void test_conv(void)
{
    test_conv_shape(3, 5, 7, 9, 4, 3, 2, 1, 1);
    test_conv_shape(3, 5, 7, 9, 4, 1, 1, 0, 0);
    test_conv_shape(2, 1, 28, 28, 16, 5, 1, 2, 1);
    test_conv_shape(4, 32, 14, 14, 64, 3, 1, 1, 0);
    test_conv_shape(2, 32, 8, 8, 16, 1, 2, 0, 1);
    /* per axis: AmoebaNet's 1x7 and 7x1, and every pair different */
    test_conv_hw(2, 16, 14, 14, 16, 1, 7, 1, 1, 0, 3, 0);
    test_conv_hw(2, 16, 14, 14, 16, 7, 1, 2, 1, 3, 0, 0);
    test_conv_hw(3, 4, 8, 11, 3, 2, 5, 3, 2, 1, 2, 1);
}

/* ---- pooling --------------------------------------------------------------------- */

/* Per axis; the average kinds divide by the window's cells inside the image
 * (AVG) or by kh * kw (AVG_INCLUDE_PAD). */
static void test_pool_hw(gp_pool_kind kind, int64_t n, int64_t c, int64_t h, int64_t w,
                         int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw)
{
    gp_pool_desc d = {n, c, h, w, kh, kw, sh, sw, ph, pw,
                      (h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1, kind, 0, false};
    int64_t nx = n * c * h * w, ny = n * c * d.oh * d.ow;
    buf x = brand(nx, -1, 1), dy = brand(ny, -1, 1), y = bjunk(ny), dx = bjunk(nx);
    void *ws[2] = {NULL, NULL};
    size_t wsb[2];
    for (int k = 0; k < 2; k++) {
        wsb[k] = gp_dev_pool_ws_bytes(D2[k], &d);
        if (wsb[k]) CHECK_OK(gp_dev_alloc(D2[k], wsb[k], GP_MEM_WORKSPACE, &ws[k]));
    }
    char what[128];
    snprintf(what, sizeof what, "%s pool n%lld c%lld %lldx%lld k%lldx%lld s%lldx%lld p%lldx%lld",
             kind == GP_POOL_MAX ? "max" : kind == GP_POOL_AVG ? "avg" : "avg-incl-pad",
             (long long)n, (long long)c, (long long)h, (long long)w, (long long)kh,
             (long long)kw, (long long)sh, (long long)sw, (long long)ph, (long long)pw);
    /* A max is exact and so is routing each dy to its window's maximum;
     * but where windows overlap (stride < kernel) one dx is the sum of the
     * dy of several windows, which cuDNN adds in another order than the
     * CPU: float rounding of a sum of a few terms in [-1, 1], 6e-8 apart
     * on the H100 (k3 s2 p1), so 1e-6 as for the averages. */
    bool overlap = kh > sh || kw > sw;
    double tol = kind == GP_POOL_MAX ? 0 : 1e-6;
    double tol_bwd = kind == GP_POOL_MAX && !overlap ? 0 : 1e-6;
    BOTH(gp_dev_pool_fwd(D, &d, x.p[K], y.p[K], ws[K]));
    bcheck(what, &y, tol);
    /* an average's backward reads neither x nor y (backend.h; on the GPU
     * gpipe's kernel, which sums in the CPU's order, checked to 1e-6 as
     * cuDNN's was) */
    bool avg = kind != GP_POOL_MAX;
    BOTH(gp_dev_pool_bwd(D, &d, avg ? NULL : x.p[K], avg ? NULL : y.p[K], dy.p[K], dx.p[K],
                         ws[K]));
    strncat(what, " bwd", sizeof what - strlen(what) - 1);
    bcheck(what, &dx, tol_bwd);
    for (int k = 0; k < 2; k++)
        if (wsb[k]) gp_dev_free(D2[k], ws[k], wsb[k], GP_MEM_WORKSPACE);
    bfree(&x); bfree(&dy); bfree(&y); bfree(&dx);
}

static void test_pool_shape(gp_pool_kind kind, int64_t n, int64_t c, int64_t h, int64_t w,
                            int64_t ker, int64_t stride, int64_t pad)
{
    test_pool_hw(kind, n, c, h, w, ker, ker, stride, stride, pad, pad);
}

static void test_pool(void)
{
    test_pool_shape(GP_POOL_MAX, 3, 5, 8, 10, 2, 2, 0);
    test_pool_shape(GP_POOL_MAX, 2, 3, 7, 9, 3, 2, 1);
    test_pool_shape(GP_POOL_AVG, 3, 5, 8, 10, 2, 2, 0);
    test_pool_shape(GP_POOL_AVG, 2, 3, 7, 9, 3, 2, 1);
    test_pool_shape(GP_POOL_AVG_INCLUDE_PAD, 2, 3, 7, 9, 3, 2, 1);
    test_pool_shape(GP_POOL_AVG_INCLUDE_PAD, 2, 3, 5, 5, 3, 1, 1);
    test_pool_hw(GP_POOL_MAX, 2, 3, 7, 9, 1, 3, 1, 2, 0, 1);
    test_pool_hw(GP_POOL_MAX, 2, 3, 7, 9, 3, 2, 2, 1, 1, 0);
    test_pool_hw(GP_POOL_AVG, 2, 3, 8, 11, 2, 5, 1, 2, 1, 2);
    test_pool_hw(GP_POOL_AVG_INCLUDE_PAD, 2, 3, 8, 11, 2, 5, 1, 2, 1, 2);
}

/* ---- batch norm ------------------------------------------------------------------ */

/* Device K's copy of a buffer and b's equal bit for bit. */
static bool bsame(const float *p, const float *q, int64_t n)
{
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
    float *h[2] = {malloc(bytes), malloc(bytes)};
    CHECK_OK(gp_dev_download(D2[1], h[0], p, n));
    CHECK_OK(gp_dev_download(D2[1], h[1], q, n));
    CHECK_OK(gp_dev_synchronize(D2[1]));
    bool eq = !memcmp(h[0], h[1], (size_t)n * sizeof(float));
    free(h[0]);
    free(h[1]);
    return eq;
}

/* On the GPU alone: batch norm with the relu folded in (gp_bn_desc.relu)
 * against bn then relu_fwd, training and inference, and its backward
 * against relu_bwd on that output then the plain norm's (bn_bwd, and the
 * SyncBN pair), with a residual sum folded in (gp_bn_desc.add) against
 * bn, add, relu: bit for bit, on whichever path the shape takes (cuDNN's
 * below 64 values a plane, gpipe's plane kernels from 64). */
static void test_bn_fused_bits(const gp_bn_desc *d, const buf *x, const buf *dy, const buf *g,
                               const buf *b, const char *tag)
{
    gp_device *G = D2[1];
    int64_t nx = d->n * d->c * d->s, c = d->c;
    gp_bn_desc dr = *d, da = *d;
    dr.relu = da.relu = true;
    float *y0, *y1, *res, *dym, *m0, *v0, *m1, *v1, *dx0, *dx1, *g0, *g1, *b0, *b1, *s0, *s1;
    float **all[] = {&y0, &y1, &res, &dym, &dx0, &dx1};
    float **ch[] = {&m0, &v0, &m1, &v1, &g0, &g1, &b0, &b1, &s0, &s1};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        CHECK_OK(gp_dev_alloc(G, (size_t)nx * sizeof(float), GP_MEM_ACTIVATIONS, (void **)all[i]));
    for (size_t i = 0; i < sizeof ch / sizeof *ch; i++)
        CHECK_OK(gp_dev_alloc(G, 2 * (size_t)c * sizeof(float), GP_MEM_ACTIVATIONS,
                              (void **)ch[i]));
    CHECK_OK(gp_dev_copy_d2d(G, res, dy->p[1], (size_t)nx * sizeof(float)));
    da.add = res;
    char what[160];
    const float *X = x->p[1], *DY = dy->p[1], *GM = g->p[1], *BT = b->p[1];
    /* forward, training: the same statistics, the same y */
    CHECK_OK(gp_dev_bn_fwd_train(G, d, X, GM, BT, y0, m0, v0));
    CHECK_OK(gp_dev_relu_fwd(G, y0, y0, nx));
    CHECK_OK(gp_dev_bn_fwd_train(G, &dr, X, GM, BT, y1, m1, v1));
    snprintf(what, sizeof what, "%s on the GPU: bn+relu fwd = bn, relu", tag);
    CHECK_MSG(bsame(y0, y1, nx) && bsame(m0, m1, c) && bsame(v0, v1, c), "%s", what);
    CHECK_OK(gp_dev_bn_fwd_infer(G, d, X, GM, BT, m0, v0, dx0));
    CHECK_OK(gp_dev_relu_fwd(G, dx0, dx0, nx));
    CHECK_OK(gp_dev_bn_fwd_infer(G, &dr, X, GM, BT, m0, v0, dx1));
    CHECK_MSG(bsame(dx0, dx1, nx), "%s on the GPU: bn+relu infer = bn, relu", tag);
    /* with the residual sum */
    for (int train = 0; train < 2; train++) {
        if (train) CHECK_OK(gp_dev_bn_fwd_train(G, d, X, GM, BT, dx0, m1, v1));
        else CHECK_OK(gp_dev_bn_fwd_infer(G, d, X, GM, BT, m0, v0, dx0));
        CHECK_OK(gp_dev_add(G, dx0, res, dx0, nx));
        CHECK_OK(gp_dev_relu_fwd(G, dx0, dx0, nx));
        if (train) CHECK_OK(gp_dev_bn_fwd_train(G, &da, X, GM, BT, dx1, m1, v1));
        else CHECK_OK(gp_dev_bn_fwd_infer(G, &da, X, GM, BT, m0, v0, dx1));
        CHECK_MSG(bsame(dx0, dx1, nx), "%s on the GPU: bn+add+relu %s = bn, add, relu", tag,
                  train ? "fwd" : "infer");
    }
    /* backward */
    CHECK_OK(gp_dev_relu_bwd(G, y0, DY, dym, nx));
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gp_dev_fill(G, k ? g1 : g0, 0.5f, c));
        CHECK_OK(gp_dev_fill(G, k ? b1 : b0, -0.25f, c));
    }
    CHECK_OK(gp_dev_bn_bwd(G, d, X, GM, BT, m0, v0, dym, dx0, g0, b0));
    CHECK_OK(gp_dev_bn_bwd(G, &dr, X, GM, BT, m0, v0, DY, dx1, g1, b1));
    {
        bool sx = bsame(dx0, dx1, nx), sg = bsame(g0, g1, c), sb = bsame(b0, b1, c);
        CHECK_MSG(sx && sg && sb, "%s on the GPU: bn_bwd with the relu = relu_bwd, bn_bwd "
                  "(dx %s, dgamma %s, dbeta %s)", tag, sx ? "same" : "differs",
                  sg ? "same" : "differs", sb ? "same" : "differs");
    }
    CHECK_OK(gp_dev_bn_bwd_sums(G, d, X, GM, BT, m0, v0, dym, s0));
    CHECK_OK(gp_dev_bn_bwd_sums(G, &dr, X, GM, BT, m0, v0, DY, s1));
    CHECK_MSG(bsame(s0, s1, 2 * c), "%s on the GPU: sync sums with the relu", tag);
    CHECK_OK(gp_dev_bn_bwd_apply(G, d, X, GM, BT, m0, v0, dym, s0, (double)(d->n * d->s), dx0,
                                 s0, g0, b0));
    CHECK_OK(gp_dev_bn_bwd_apply(G, &dr, X, GM, BT, m0, v0, DY, s1, (double)(d->n * d->s), dx1,
                                 s1, g1, b1));
    CHECK_MSG(bsame(dx0, dx1, nx) && bsame(g0, g1, c), "%s on the GPU: sync apply with the relu",
              tag);
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        gp_dev_free(G, *all[i], (size_t)nx * sizeof(float), GP_MEM_ACTIVATIONS);
    for (size_t i = 0; i < sizeof ch / sizeof *ch; i++)
        gp_dev_free(G, *ch[i], 2 * (size_t)c * sizeof(float), GP_MEM_ACTIVATIONS);
}

static void test_bn_shape(int64_t n, int64_t c, int64_t s)
{
    gp_bn_desc d = {n, c, s, 1e-5f, 0, false, NULL, NULL};
    int64_t nx = n * c * s;
    buf x = brand(nx, -1, 2), dy = brand(nx, -1, 1), g = brand(c, 0.5f, 1.5f), b = brand(c, -1, 1);
    buf y = bjunk(nx), yi = bjunk(nx), dx = bjunk(nx), mean = bjunk(c), var = bjunk(c);
    buf dg = brand(c, -1, 1), dbt = brand(c, -1, 1);
    char tag[64], what[128];
    snprintf(tag, sizeof tag, "bn n%lld c%lld s%lld", (long long)n, (long long)c, (long long)s);
    BOTH(gp_dev_bn_fwd_train(D, &d, x.p[K], g.p[K], b.p[K], y.p[K], mean.p[K], var.p[K]));
    snprintf(what, sizeof what, "%s fwd y", tag);
    bcheck(what, &y, 1e-5);
    snprintf(what, sizeof what, "%s mean", tag);
    bcheck(what, &mean, 1e-5);
    snprintf(what, sizeof what, "%s biased var", tag);
    bcheck(what, &var, 1e-5);
    BOTH(gp_dev_bn_fwd_infer(D, &d, x.p[K], g.p[K], b.p[K], mean.p[K], var.p[K], yi.p[K]));
    snprintf(what, sizeof what, "%s infer y", tag);
    bcheck(what, &yi, 1e-5);
    /* with the relu after it (gp_bn_desc.relu): gpipe's kernels from 64
     * values, cuDNN's and a relu pass below */
    gp_bn_desc dr = d;
    dr.relu = true;
    BOTH(gp_dev_bn_fwd_infer(D, &dr, x.p[K], g.p[K], b.p[K], mean.p[K], var.p[K], yi.p[K]));
    snprintf(what, sizeof what, "%s infer y, relu", tag);
    bcheck(what, &yi, 1e-5);
    BOTH(gp_dev_bn_fwd_train(D, &dr, x.p[K], g.p[K], b.p[K], yi.p[K], mean.p[K], var.p[K]));
    snprintf(what, sizeof what, "%s fwd y, relu", tag);
    bcheck(what, &yi, 1e-5);
    for (int rep = 0; rep < 2; rep++) {
        BOTH(gp_dev_bn_bwd(D, &d, x.p[K], g.p[K], b.p[K], mean.p[K], var.p[K], dy.p[K],
                           dx.p[K], dg.p[K], dbt.p[K]));
        snprintf(what, sizeof what, "%s bwd dx = (call %d)", tag, rep + 1);
        bcheck(what, &dx, 1e-4);
        snprintf(what, sizeof what, "%s bwd dgamma += (call %d)", tag, rep + 1);
        bcheck(what, &dg, 1e-4);
        snprintf(what, sizeof what, "%s bwd dbeta += (call %d)", tag, rep + 1);
        bcheck(what, &dbt, 1e-4);
    }
    /* a residual's sum folded in (gp_bn_desc.add), with the relu */
    {
        buf res = brand(nx, -1, 1), ya = bjunk(nx);
        gp_bn_desc da = dr;
        for (int train = 0; train < 2; train++) {
            for (int K = 0; K < 2; K++) {
                da.add = res.p[K];
                gp_device *D = D2[K];
                if (train)
                    CHECK_OK(gp_dev_bn_fwd_train(D, &da, x.p[K], g.p[K], b.p[K], ya.p[K],
                                                 mean.p[K], var.p[K]));
                else
                    CHECK_OK(gp_dev_bn_fwd_infer(D, &da, x.p[K], g.p[K], b.p[K], mean.p[K],
                                                 var.p[K], ya.p[K]));
            }
            snprintf(what, sizeof what, "%s %s y + add, relu", tag, train ? "fwd" : "infer");
            bcheck(what, &ya, 1e-5);
        }
        bfree(&res); bfree(&ya);
    }
    /* and the relu's backward folded in, on the GPU alone (against the
     * CPU a value within rounding of 0 may take the other side of the
     * relu): bit for bit what the unfused layers give there */
    test_bn_fused_bits(&d, &x, &dy, &g, &b, tag);
    /* Without gamma / beta / parameter gradients. */
    BOTH(gp_dev_bn_fwd_train(D, &d, x.p[K], NULL, NULL, y.p[K], mean.p[K], var.p[K]));
    snprintf(what, sizeof what, "%s fwd y, no affine", tag);
    bcheck(what, &y, 1e-5);
    BOTH(gp_dev_bn_bwd(D, &d, x.p[K], NULL, NULL, mean.p[K], var.p[K], dy.p[K], dx.p[K], NULL,
                       NULL));
    snprintf(what, sizeof what, "%s bwd dx, no affine", tag);
    bcheck(what, &dx, 1e-4);
    /* The SyncBN pieces: statistics alone, the two backward sums, and the
     * backward from (here: this device's own) sums, with the parameter
     * gradients from `local` accumulating. */
    BOTH(gp_dev_bn_stats(D, &d, x.p[K], mean.p[K], var.p[K]));
    snprintf(what, sizeof what, "%s sync stats mean", tag);
    bcheck(what, &mean, 1e-5);
    snprintf(what, sizeof what, "%s sync stats biased var", tag);
    bcheck(what, &var, 1e-5);
    buf sums = bjunk(2 * c);
    BOTH(gp_dev_bn_bwd_sums(D, &d, x.p[K], g.p[K], b.p[K], mean.p[K], var.p[K], dy.p[K],
                            sums.p[K]));
    snprintf(what, sizeof what, "%s sync bwd sums", tag);
    bcheck(what, &sums, 1e-5);
    BOTH(gp_dev_bn_bwd_apply(D, &d, x.p[K], g.p[K], b.p[K], mean.p[K], var.p[K], dy.p[K],
                             sums.p[K], (double)(n * s), dx.p[K], sums.p[K], dg.p[K], dbt.p[K]));
    snprintf(what, sizeof what, "%s sync bwd dx =", tag);
    bcheck(what, &dx, 1e-4);
    snprintf(what, sizeof what, "%s sync bwd dgamma +=", tag);
    bcheck(what, &dg, 1e-4);
    snprintf(what, sizeof what, "%s sync bwd dbeta +=", tag);
    bcheck(what, &dbt, 1e-4);
    bfree(&sums);
    bfree(&x); bfree(&dy); bfree(&g); bfree(&b); bfree(&y); bfree(&yi); bfree(&dx);
    bfree(&mean); bfree(&var); bfree(&dg); bfree(&dbt);
}

static void test_bn(void)
{
    test_bn_shape(3, 5, 63);  /* cuDNN's kernels */
    test_bn_shape(3, 5, 65);  /* gpipe's (cuda_dnn.c, bn_planes): odd planes */
    test_bn_shape(7, 6, 1);
    test_bn_shape(16, 32, 196);
}

/* ---- log-softmax and cross-entropy ------------------------------------------------- */

static void test_softmax_xent(void)
{
    const int64_t rows = 67, cols = 13;
    buf x = brand(rows * cols, -4, 4), y = bjunk(rows * cols), dl = bjunk(rows * cols);
    BOTH(gp_dev_log_softmax(D, x.p[K], y.p[K], rows, cols));
    bcheck("log_softmax", &y, 1e-5);
    float labels[67];
    for (int64_t r = 0; r < rows; r++) labels[r] = (float)(r * 7 % cols);
    buf lab = bnew(rows);
    bset(&lab, labels);
    double loss[2];
    int64_t correct[2], badr[2];
    BOTH(gp_dev_xent(D, x.p[K], lab.p[K], rows, cols, 1.0f / (float)rows, 0.0f, dl.p[K],
                     &loss[K], &correct[K], &badr[K]));
    CHECK_NEAR(loss[1], loss[0], 0, 1e-12);
    CHECK(correct[1] == correct[0]);
    CHECK(badr[0] == -1 && badr[1] == -1);
    bcheck("xent dlogits", &dl, 1e-6);
    /* ImageNet's 1000 classes: a warp's lanes take 31-32 columns each, and
     * ties for the max (column pairs set equal) go to the first one */
    {
        const int64_t wc = 1000;
        buf wx = brand(rows * wc, -4, 4), wd = bjunk(rows * wc);
        float *h = malloc((size_t)(rows * wc) * sizeof *h);
        for (int64_t q = 0; q < rows * wc; q++) h[q] = (float)((q * 7919) % 1999) / 250.0f - 4.0f;
        /* a tie between lanes: 101 in lane 5, 900 in lane 4 (the later
         * column in the lower lane), so the merge must pick by index */
        for (int64_t r = 0; r < rows; r++) h[r * wc + 900] = h[r * wc + 101] = 9.0f;
        bset(&wx, h);
        float wl[67];
        for (int64_t r = 0; r < rows; r++) wl[r] = (float)(r % 3 ? (r * 37) % wc : 101);
        buf wlab = bnew(rows);
        bset(&wlab, wl);
        BOTH(gp_dev_xent(D, wx.p[K], wlab.p[K], rows, wc, 1.0f / (float)rows, 0.0f, wd.p[K],
                         &loss[K], &correct[K], &badr[K]));
        CHECK_NEAR(loss[1], loss[0], 0, 1e-12);
        CHECK_MSG(correct[1] == correct[0] && correct[0] > 0, "xent 1000 classes: %lld correct "
                  "on the GPU, %lld on the CPU", (long long)correct[1], (long long)correct[0]);
        bcheck("xent dlogits, 1000 classes", &wd, 1e-6);
        /* label smoothing 0.1: the lanes' sums of x - max in the butterfly */
        BOTH(gp_dev_xent(D, wx.p[K], wlab.p[K], rows, wc, 1.0f / (float)rows, 0.1f, wd.p[K],
                         &loss[K], &correct[K], &badr[K]));
        CHECK_NEAR(loss[1], loss[0], 0, 1e-12);
        bcheck("xent dlogits, 1000 classes, label smoothing", &wd, 1e-6);
        /* a padded vocabulary (model.gpt.vocab_pad): rows ld = 1000 floats
         * apart of which the first 976 are classes; the gradient's 24
         * padding columns are 0 on both */
        float pl[67];
        for (int64_t r = 0; r < rows; r++) pl[r] = (float)((r * 37) % 976);
        buf plab = bnew(rows);
        bset(&plab, pl);
        BOTH(gp_dev_xent_ld(D, wx.p[K], plab.p[K], rows, 976, wc, 1.0f / (float)rows, 0.0f,
                            wd.p[K], &loss[K], &correct[K], &badr[K]));
        CHECK_NEAR(loss[1], loss[0], 0, 1e-12);
        CHECK(correct[1] == correct[0] && badr[0] == -1 && badr[1] == -1);
        bcheck("xent dlogits, 976 classes of rows of 1000", &wd, 1e-6);
        bfree(&plab);
        free(h);
        bfree(&wx);
        bfree(&wd);
        bfree(&wlab);
    }
    /* A bad label: the first bad row is reported, nothing else written. */
    labels[40] = 2.5f;
    labels[50] = (float)cols;
    bset(&lab, labels);
    BOTH(gp_dev_xent(D, x.p[K], lab.p[K], rows, cols, 1.0f, 0.0f, dl.p[K], &loss[K], &correct[K],
                     &badr[K]));
    CHECK(badr[0] == 40 && badr[1] == 40);
    bcheck("xent dlogits untouched after a bad label", &dl, 1e-6);
    /* binary cross-entropy: x as logits against targets in [0, 1], several
     * reduction blocks' worth of elements */
    const int64_t nb = 300007;
    buf z = brand(nb, -8, 8), t = brand(nb, 0, 1), dz = bjunk(nb);
    double bl[2];
    int64_t bc[2], bb[2];
    BOTH(gp_dev_bce_logits(D, z.p[K], t.p[K], nb, 1.0f / (float)nb, dz.p[K], &bl[K], &bc[K],
                           &bb[K]));
    CHECK_NEAR(bl[1], bl[0], 0, 1e-12);
    CHECK(bc[1] == bc[0]);
    CHECK(bb[0] == -1 && bb[1] == -1);
    bcheck("bce dz", &dz, 1e-6);
    float badt[2] = {1.5f, -0.5f};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gp_dev_upload(D2[k], t.p[k] + 200001, &badt[0], 1));
        CHECK_OK(gp_dev_upload(D2[k], t.p[k] + 250001, &badt[1], 1));
    }
    BOTH(gp_dev_bce_logits(D, z.p[K], t.p[K], nb, 1.0f, dz.p[K], &bl[K], &bc[K], &bb[K]));
    CHECK(bb[0] == 200001 && bb[1] == 200001);
    bcheck("bce dz untouched after a bad target", &dz, 1e-6);
    bfree(&z); bfree(&t); bfree(&dz);
    bfree(&x); bfree(&y); bfree(&dl); bfree(&lab);
}

/* The slots of a step without host waits (backend.h, iface 13) on both
 * devices: the results the GPU leaves in its memory equal the CPU's, and
 * none of the calls waits on the host. */
static void test_step_slots(void)
{
    enum { C = 37, MB = 3 };
    const double nb[MB] = {100, 250, 7};
    buf mean[MB], var[MB];
    for (int b = 0; b < MB; b++) {
        mean[b] = brand(C, -2, 2);
        var[b] = brand(C, 0, 3);
    }
    /* accumulator: 2C doubles = 4C floats, zeroed */
    buf acc = bnew(4 * C), rm = brand(C, -1, 1), rv = brand(C, 0.5f, 2);
    BOTH(gp_dev_fill(D, acc.p[K], 0.0f, 4 * C));
    uint64_t w0 = gp_dev_host_waits(D2[1]);
    double na = 0;
    for (int b = 0; b < MB; b++) {
        BOTH(gp_dev_bn_merge(D, C, (double *)acc.p[K], (double *)acc.p[K] + C, na, nb[b],
                             mean[b].p[K], var[b].p[K]));
        na += nb[b];
    }
    double h[2][2 * C];
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gp_dev_download(D2[k], (float *)h[k], acc.p[k], 4 * C));
        CHECK_OK(gp_dev_synchronize(D2[k]));
    }
    for (int c = 0; c < 2 * C; c++)
        CHECK_MSG(fabs(h[1][c] - h[0][c]) <= 1e-12 * (1 + fabs(h[0][c])),
                  "bn_merge [%d]: gpu %.17g, cpu %.17g", c, h[1][c], h[0][c]);
    w0 = gp_dev_host_waits(D2[1]);
    BOTH(gp_dev_bn_commit(D, C, rm.p[K], rv.p[K], (double *)acc.p[K], (double *)acc.p[K] + C,
                          0.1, na));
    CHECK(gp_dev_host_waits(D2[1]) == w0);
    bcheck("bn_commit running mean", &rm, 1e-7);
    bcheck("bn_commit running var", &rv, 1e-7);
    bcheck("bn_commit zeroes the accumulator", &acc, 0);
    /* a commit part's pending slots (3 micro-batches of 64, 64 and 9
     * values per channel, mean then var each) merged and committed in its
     * one launch (bn_commit_multi, iface 49), no host wait */
    buf pend = bnew(3 * 2 * C);
    for (int q = 0; q < 3; q++) {
        float hp[2 * C];
        for (int c = 0; c < C; c++) {
            hp[c] = (float)(c % 5) - 2.0f + 0.25f * q;
            hp[C + c] = 0.5f + q;
        }
        for (int k = 0; k < 2; k++)
            CHECK_OK(gp_dev_upload(D2[k], pend.p[k] + q * 2 * C, hp, 2 * C));
    }
    w0 = gp_dev_host_waits(D2[1]);
    uint64_t l0 = gp_dev_launches(D2[1]);
    for (int K = 0; K < 2; K++) {
        gp_bn_commit_part part = {.c = C, .rmean = rm.p[K], .rvar = rv.p[K],
                                  .mean_acc = (double *)acc.p[K],
                                  .m2_acc = (double *)acc.p[K] + C, .momentum = 0.1,
                                  .count = 137, .pend = pend.p[K], .n_pend = 3, .n_hi = 2,
                                  .na = 0, .nb_hi = 64, .nb_lo = 9};
        CHECK_OK(gp_dev_bn_commit_part(D2[K], &part));
    }
    CHECK(gp_dev_host_waits(D2[1]) == w0 && gp_dev_launches(D2[1]) - l0 == 1);
    bcheck("bn_commit_multi's pending slots: running mean", &rm, 1e-7);
    bcheck("bn_commit_multi's pending slots: running var", &rv, 1e-7);
    bcheck("bn_commit_multi's pending slots: the accumulator zeroed", &acc, 0);
    bfree(&pend);
    /* the losses into device memory: as the host-returning slots */
    const int64_t rows = 67, cols = 13;
    buf x = brand(rows * cols, -4, 4), dl = bjunk(rows * cols), lab = bnew(rows);
    float labels[67];
    for (int64_t r = 0; r < rows; r++) labels[r] = (float)(r * 5 % cols);
    bset(&lab, labels);
    buf res = bnew(6); /* one gp_loss_result */
    w0 = gp_dev_host_waits(D2[1]);
    BOTH(gp_dev_xent_dev(D, x.p[K], lab.p[K], rows, cols, 0.5f, 0.0f, dl.p[K],
                         (gp_loss_result *)res.p[K]));
    CHECK(gp_dev_host_waits(D2[1]) == w0);
    gp_loss_result r[2];
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gp_dev_download(D2[k], (float *)&r[k], res.p[k], 6));
        CHECK_OK(gp_dev_synchronize(D2[k]));
    }
    CHECK_NEAR(r[1].loss_sum, r[0].loss_sum, 0, 1e-12);
    CHECK(r[1].correct == r[0].correct && r[0].bad == -1 && r[1].bad == -1);
    bcheck("xent_dev dlogits", &dl, 1e-6);
    /* dlogits as targets: some negative, so a bad one (the same first one) */
    BOTH(gp_dev_bce_logits_dev(D, x.p[K], dl.p[K], rows * cols, 1.0f, NULL,
                               (gp_loss_result *)res.p[K]));
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gp_dev_download(D2[k], (float *)&r[k], res.p[k], 6));
        CHECK_OK(gp_dev_synchronize(D2[k]));
    }
    CHECK(r[0].bad >= 0 && r[1].bad == r[0].bad && r[1].loss_sum == 0.0);
    labels[33] = -1.0f;
    bset(&lab, labels);
    BOTH(gp_dev_xent_dev(D, x.p[K], lab.p[K], rows, cols, 0.5f, 0.0f, NULL,
                         (gp_loss_result *)res.p[K]));
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gp_dev_download(D2[k], (float *)&r[k], res.p[k], 6));
        CHECK_OK(gp_dev_synchronize(D2[k]));
    }
    CHECK(r[0].bad == 33 && r[1].bad == 33 && r[1].loss_sum == 0.0 && r[1].correct == 0);
    /* an upload on the copy stream, ordered by its event */
    float src[1000];
    for (int i = 0; i < 1000; i++) src[i] = (float)i * 0.25f;
    buf up = bjunk(1000);
    void *ev = NULL;
    CHECK_OK(gp_dev_event_create(D2[1], &ev));
    w0 = gp_dev_host_waits(D2[1]);
    CHECK_OK(gp_dev_upload_async(D2[1], up.p[1], src, 1000, ev));
    CHECK(gp_dev_host_waits(D2[1]) == w0);
    CHECK_OK(gp_dev_event_wait(D2[1], ev));
    CHECK_OK(gp_dev_upload(D2[0], up.p[0], src, 1000));
    bcheck("upload_async", &up, 0);
    gp_dev_event_destroy(D2[1], ev);
    bfree(&up);
    bfree(&res);
    bfree(&x); bfree(&dl); bfree(&lab);
    bfree(&acc); bfree(&rm); bfree(&rv);
    for (int b = 0; b < MB; b++) {
        bfree(&mean[b]);
        bfree(&var[b]);
    }
}

/* ---- memory ------------------------------------------------------------------------ */

static void test_memory(gp_device *gpu)
{
    gp_allocator a0, a1;
    gp_allocator_snapshot(&gpu->alloc, &a0);
    void *p = NULL, *q = NULL;
    CHECK_OK(gp_dev_alloc(gpu, 1000003, GP_MEM_PARAMS, &p));
    gp_allocator_snapshot(&gpu->alloc, &a1);
    CHECK(a1.current == a0.current + 1000003);
    CHECK(a1.cur_by[GP_MEM_PARAMS] == a0.cur_by[GP_MEM_PARAMS] + 1000003);
    CHECK(a1.peak >= a1.current);
    gp_dev_free(gpu, p, 1000003, GP_MEM_PARAMS);
    gp_allocator_snapshot(&gpu->alloc, &a1);
    CHECK(a1.current == a0.current);
    /* The freed block is cached: the same size class gets it back. */
    CHECK_OK(gp_dev_alloc(gpu, 1000000, GP_MEM_ACTIVATIONS, &q));
    CHECK_MSG(q == p, "a freed block of the same size class was not reused (%p vs %p)", q, p);
    gp_dev_free(gpu, q, 1000000, GP_MEM_ACTIVATIONS);

    /* Capacity is honoured with the shared accounting's message. */
    gp_device_opts o = {.threads = 0, .capacity = (size_t)1 << 20};
    gp_device *small = NULL;
    CHECK_OK(gp_device_open(gpu->name, &o, &small));
    if (small) {
        CHECK_ERR(gp_dev_alloc(small, (size_t)2 << 20, GP_MEM_ACTIVATIONS, &p), GP_ERR_OOM,
                  gpu->name);
        gp_device_close(small);
    }
}

/* ---- copies and events --------------------------------------------------------------- */

static void test_copies(gp_device *g0, gp_device *g1)
{
    const int64_t n = (3 << 20) + 17; /* > one 4 MiB staging chunk */
    float *h = malloc((size_t)n * sizeof(float)), *back = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = (float)i * 0.5f - 3.0f;
    gp_shape sh = gp_shape_2d(1, n);
    gp_tensor a, b, c;
    CHECK_OK(gp_tensor_alloc(&a, g0, &sh, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_alloc(&b, g0, &sh, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_alloc(&c, g1, &sh, GP_MEM_COPIES));
    CHECK_OK(gp_dev_upload(g0, gp_f32(&a), h, n));
    CHECK_OK(gp_tensor_copy(&b, &a)); /* d2d */
    CHECK_OK(gp_tensor_copy(&c, &b)); /* peer (or d2d when g1 == g0) */
    memset(back, 0, (size_t)n * sizeof(float));
    CHECK_OK(gp_dev_download(g1, back, gp_f32(&c), n));
    CHECK_OK(gp_dev_synchronize(g1));
    CHECK_MSG(!memcmp(back, h, (size_t)n * sizeof(float)), "%s -> %s -> %s round trip differs",
              g0->name, g0->name, g1->name);
    /* Events: record after a fill on g0, wait on g1, then copy back. */
    void *ev = NULL;
    CHECK_OK(gp_dev_event_create(g0, &ev));
    CHECK_OK(gp_dev_fill(g0, gp_f32(&b), 7.0f, n));
    CHECK_OK(gp_dev_event_record(g0, ev));
    CHECK_OK(gp_dev_event_wait(g1, ev));
    CHECK_OK(gp_tensor_copy(&c, &b));
    CHECK_OK(gp_dev_event_sync(g0, ev));
    CHECK_OK(gp_dev_download(g1, back, gp_f32(&c), n));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= back[i] == 7.0f;
    CHECK_MSG(ok, "copy after an event wait did not see the fill");
    /* copy_async (what the executor's copies between stages use): behind
     * the producer's event on g1's copy stream, `done` waited for by g1's
     * compute; the source freed right after and taken again by a fill must
     * not reach the copy (the stream-ordered free). */
    void *done = NULL;
    CHECK_OK(gp_dev_event_create(g1, &done));
    CHECK_OK(gp_dev_fill(g0, gp_f32(&b), -2.5f, n));
    CHECK_OK(gp_dev_event_record(g0, ev));
    CHECK_OK(gp_dev_copy_async(g1, gp_f32(&c), g0, gp_f32(&b), (size_t)n * sizeof(float), ev, done));
    gp_tensor_free(&b);
    CHECK_OK(gp_tensor_alloc(&b, g0, &sh, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_fill(g0, gp_f32(&b), 99.0f, n));
    CHECK_OK(gp_dev_event_wait(g1, done));
    CHECK_OK(gp_dev_scale(g1, gp_f32(&c), 2.0f, n)); /* compute after the copy */
    CHECK_OK(gp_dev_download(g1, back, gp_f32(&c), n));
    CHECK_OK(gp_dev_synchronize(g1));
    ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= back[i] == -5.0f;
    CHECK_MSG(ok, "%s -> %s copy_async: the reader did not see the producer's data",
              g0->name, g1->name);
    gp_dev_event_destroy(g1, done);
    gp_dev_event_destroy(g0, ev);
    gp_tensor_free(&a); gp_tensor_free(&b); gp_tensor_free(&c);
    free(h); free(back);
}

/* ---- NCCL ------------------------------------------------------------------------------ */

typedef struct {
    gp_device *dev;
    gp_comm *comm;
    float *buf;
    int64_t n;
    int root; /* -1: all-reduce, -2: reduce-scatter, -3: all-gather, -4: barrier */
    gp_status st;
} coll_job;

static void *coll_main(void *arg)
{
    coll_job *j = arg;
    gp_device_bind_thread(j->dev);
    switch (j->root) {
    case -1: j->st = gp_dev_allreduce(j->dev, j->comm, j->buf, j->n); break;
    case -2: j->st = gp_dev_reduce_scatter(j->dev, j->comm, j->buf, j->n); break;
    case -3: j->st = gp_dev_all_gather(j->dev, j->comm, j->buf, j->n); break;
    case -4: j->st = gp_dev_barrier(j->dev, j->comm); break;
    default: j->st = gp_dev_broadcast(j->dev, j->comm, j->buf, j->n, j->root);
    }
    if (j->st == GP_OK) j->st = gp_dev_synchronize(j->dev);
    return NULL;
}

/* Run one collective on both ranks from their own threads. */
static void coll_run(gp_device *const *devs, gp_comm *comm, float *const *d, int64_t n, int root,
                     const char *what)
{
    coll_job jobs[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        jobs[r] = (coll_job){devs[r], comm, d[r], n, root, GP_OK};
        pthread_create(&t[r], NULL, coll_main, &jobs[r]);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(t[r], NULL);
        CHECK_MSG(jobs[r].st == GP_OK, "%s on %s: %s", what, devs[r]->name, gp_last_error());
    }
}

/* One size of the collectives on two GPUs against the host sum (exact: the
 * sum of two floats does not depend on the order). */
static void test_nccl_size(gp_device *const *devs, gp_comm *comm, int64_t n)
{
    size_t bytes = (size_t)n * sizeof(float);
    float *h[2], *sum = malloc(bytes), *back = malloc(bytes);
    float *d[2];
    for (int r = 0; r < 2; r++) {
        h[r] = malloc(bytes);
        for (int64_t i = 0; i < n; i++) h[r][i] = frand();
        CHECK_OK(gp_dev_alloc(devs[r], bytes, GP_MEM_GRADS, (void **)&d[r]));
        CHECK_OK(gp_dev_upload(devs[r], d[r], h[r], n));
    }
    for (int64_t i = 0; i < n; i++) sum[i] = h[0][i] + h[1][i];
    for (int root = -1; root < 1; root++) {
        coll_run(devs, comm, d, n, root, root < 0 ? "all-reduce" : "broadcast");
        for (int r = 0; r < 2; r++) {
            CHECK_OK(gp_dev_download(devs[r], back, d[r], n));
            /* after the all-reduce both hold the sum; broadcast from 0 keeps it */
            CHECK_MSG(!memcmp(back, sum, bytes), "%s of %lld floats: %s != host sum",
                      root < 0 ? "all-reduce" : "broadcast", (long long)n, devs[r]->name);
        }
        if (root < 0) { /* make rank 1 differ so the broadcast has something to do */
            CHECK_OK(gp_dev_fill(devs[1], d[1], -1.0f, n));
        }
    }
    /* The sharded pair: after the reduce-scatter rank r's chunk r (odd n:
     * uneven chunks; n = 1: rank 0's chunk is empty) holds the sum; after the
     * all-gather every rank holds all of it. */
    for (int r = 0; r < 2; r++) CHECK_OK(gp_dev_upload(devs[r], d[r], h[r], n));
    coll_run(devs, comm, d, n, -2, "reduce-scatter");
    for (int r = 0; r < 2; r++) {
        int64_t lo, hi;
        gp_comm_chunk(n, 2, r, &lo, &hi);
        CHECK_OK(gp_dev_download(devs[r], back, d[r], n));
        CHECK_MSG(!memcmp(back + lo, sum + lo, (size_t)(hi - lo) * sizeof(float)),
                  "reduce-scatter of %lld floats: chunk %d [%lld, %lld) of %s != host sum",
                  (long long)n, r, (long long)lo, (long long)hi, devs[r]->name);
    }
    coll_run(devs, comm, d, n, -3, "all-gather");
    for (int r = 0; r < 2; r++) {
        CHECK_OK(gp_dev_download(devs[r], back, d[r], n));
        CHECK_MSG(!memcmp(back, sum, bytes), "reduce-scatter + all-gather of %lld floats: %s != "
                  "host sum", (long long)n, devs[r]->name);
    }
    for (int r = 0; r < 2; r++) {
        gp_dev_free(devs[r], d[r], bytes, GP_MEM_GRADS);
        free(h[r]);
    }
    free(sum); free(back);
}

static void test_nccl(gp_device *g0, gp_device *g1)
{
    gp_device *devs[2] = {g0, g1};
    gp_comm *comm = NULL;
    CHECK_OK(gp_comm_create(devs, 2, &comm));
    if (!comm) return;
    const int64_t sizes[] = {1, 3, 100001}; /* none divisible by the 2 ranks */
    for (size_t q = 0; q < sizeof sizes / sizeof *sizes; q++) test_nccl_size(devs, comm, sizes[q]);
    float *none[2] = {NULL, NULL};
    coll_run(devs, comm, none, 0, -4, "barrier");
    /* Abort: rank 0 waits in an all-reduce that rank 1 never joins; the
     * abort (ncclCommAbort) must release it, and after a reset the group
     * works again. */
    float *d0 = NULL;
    CHECK_OK(gp_dev_alloc(g0, 1000 * sizeof(float), GP_MEM_GRADS, (void **)&d0));
    if (d0) {
        coll_job lone = {g0, comm, d0, 1000, -1, GP_OK};
        pthread_t t;
        pthread_create(&t, NULL, coll_main, &lone);
        nanosleep(&(struct timespec){0, 200000000L}, NULL);
        double t0 = gp_now();
        gp_comm_abort(comm);
        pthread_join(t, NULL);
        CHECK_MSG(lone.st != GP_OK, "an all-reduce without its peer succeeded");
        CHECK_MSG(gp_now() - t0 < 10.0, "abort took %.1f s", gp_now() - t0);
        gp_dev_free(g0, d0, 1000 * sizeof(float), GP_MEM_GRADS);
        gp_comm_reset(comm);
        test_nccl_size(devs, comm, 1001);
    }
    gp_comm_destroy(comm);
}

/* ---- pinned host buffers ---------------------------------------------------------- */

static void test_pinned(gp_device *gpu)
{
    const int64_t n = 300007;
    float *h = NULL, *want = malloc((size_t)n * sizeof(float)),
          *back = malloc((size_t)n * sizeof(float));
    CHECK_OK(gp_dev_host_alloc(gpu, (size_t)n * sizeof(float), (void **)&h));
    if (!h || !want || !back) return;
    for (int64_t i = 0; i < n; i++) want[i] = h[i] = frand();
    float *d = NULL;
    CHECK_OK(gp_dev_alloc(gpu, (size_t)n * sizeof(float), GP_MEM_ACTIVATIONS, (void **)&d));
    CHECK_OK(gp_dev_upload(gpu, d, h, n)); /* direct DMA from pinned memory */
    memset(h, 0, (size_t)n * sizeof(float)); /* upload returned: the source is free */
    CHECK_OK(gp_dev_download(gpu, back, d, n));
    CHECK_MSG(!memcmp(back, want, (size_t)n * sizeof(float)), "pinned upload lost data");
    gp_dev_free(gpu, d, (size_t)n * sizeof(float), GP_MEM_ACTIVATIONS);
    gp_dev_host_free(gpu, h);
    free(want);
    free(back);
}

/* ---- every layer, forward and backward, on the GPU against the CPU ----------------- */

typedef struct {
    gp_layer_type type;
    int64_t out, kernel, stride, padding;
    float p;
    gp_shape in; /* batch 1 */
} layer_case;

/* The U-Net layers' options (their own table, so the one above keeps its
 * positional initialisers). */
typedef struct {
    gp_layer_type type;
    float p, slope;
    int64_t scale;
    gp_shape in; /* batch 1 */
} unet_case;

/* AmoebaNet's and torchvision's needs: per-axis windows, the average's
 * divisor, conv init, factorized_reduce (a table of their own too). */
typedef struct {
    gp_layer_type type;
    int64_t out;
    gp_hw kernel, stride, padding;
    bool count_include_pad;
    gp_conv_init init;
    gp_shape in; /* batch 1 */
} window_case;

/* max |a - b| <= tol (1 + max |a|) over n host floats */
static void close_enough(const char *what, const char *tag, const float *a, const float *b,
                         int64_t n, double tol)
{
    double maxa = 0, err = 0;
    for (int64_t i = 0; i < n; i++) {
        maxa = fmax(maxa, fabs(a[i]));
        err = fmax(err, fabs((double)a[i] - b[i]));
    }
    CHECK_MSG(err <= tol * (1 + maxa), "%s %s: max error %.3g (max |cpu| %.3g)", tag, what, err,
              maxa);
}

static float *to_host(const gp_tensor *t)
{
    int64_t n = gp_tensor_numel(t);
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    if (gp_dev_download(t->dev, h, gp_f32(t), n) != GP_OK) CHECK_MSG(0, "%s", gp_last_error());
    return h;
}

static void test_layers(gp_device *cpu, gp_device *gpu)
{
    const layer_case cases[] = {
        {GP_LAYER_LINEAR, 7, 0, 0, 0, 0, {2, {1, 20, 0, 0}}},
        {GP_LAYER_CONV2D, 6, 3, 1, 1, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_CONV2D, 4, 3, 2, 0, 0, {4, {1, 3, 9, 9}}},
        {GP_LAYER_BATCHNORM, 0, 0, 0, 0, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_BATCHNORM, 0, 0, 0, 0, 0, {2, {1, 20, 0, 0}}},
        {GP_LAYER_RELU, 0, 0, 0, 0, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_MAXPOOL2D, 0, 2, 2, 0, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_MAXPOOL2D, 0, 3, 2, 1, 0, {4, {1, 3, 9, 9}}},
        {GP_LAYER_AVGPOOL2D, 0, 2, 2, 0, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_GLOBAL_AVGPOOL, 0, 0, 0, 0, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_FLATTEN, 0, 0, 0, 0, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_DROPOUT, 0, 0, 0, 0, 0.3f, {2, {1, 20, 0, 0}}},
        {GP_LAYER_RESIDUAL, 3, 0, 1, 0, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_RESIDUAL, 6, 0, 2, 0, 0, {4, {1, 3, 8, 8}}},
    };
    const unet_case ucases[] = {
        {GP_LAYER_LEAKY_RELU, 0, 0.01f, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_LEAKY_RELU, 0, 0.3f, 0, {2, {1, 20, 0, 0}}},
        {GP_LAYER_DROPOUT2D, 0.3f, 0, 0, {4, {1, 6, 5, 7}}},
        {GP_LAYER_INSTANCE_NORM, 0, 0, 0, {4, {1, 3, 8, 8}}},
        {GP_LAYER_INSTANCE_NORM, 0, 0, 0, {4, {1, 5, 3, 7}}},
        {GP_LAYER_UPSAMPLE, 0, 0, 2, {4, {1, 3, 5, 7}}},
        {GP_LAYER_UPSAMPLE, 0, 0, 3, {4, {1, 2, 4, 3}}},
    };
    const gp_conv_init kn = GP_INIT_KAIMING_NORMAL_FAN_OUT, kd = GP_INIT_DEFAULT;
    const window_case wcases[] = {
        {GP_LAYER_CONV2D, 6, {1, 7}, {1, 1}, {0, 3}, true, kd, {4, {1, 4, 9, 9}}},
        {GP_LAYER_CONV2D, 6, {7, 1}, {2, 1}, {3, 0}, true, kn, {4, {1, 4, 9, 9}}},
        {GP_LAYER_CONV2D, 5, {2, 5}, {3, 2}, {1, 2}, true, kn, {4, {1, 3, 8, 11}}},
        {GP_LAYER_MAXPOOL2D, 0, {1, 3}, {1, 2}, {0, 1}, true, kd, {4, {1, 3, 7, 9}}},
        {GP_LAYER_AVGPOOL2D, 0, {3, 3}, {1, 1}, {1, 1}, true, kd, {4, {1, 3, 7, 9}}},
        {GP_LAYER_AVGPOOL2D, 0, {3, 3}, {2, 2}, {1, 1}, false, kd, {4, {1, 3, 7, 9}}},
        {GP_LAYER_AVGPOOL2D, 0, {2, 5}, {1, 2}, {1, 2}, true, kd, {4, {1, 3, 8, 11}}},
        {GP_LAYER_AVGPOOL2D, 0, {2, 5}, {1, 2}, {1, 2}, false, kd, {4, {1, 3, 8, 11}}},
        {GP_LAYER_FACTORIZED_REDUCE, 6, {0, 0}, {0, 0}, {0, 0}, true, kd, {4, {1, 5, 7, 9}}},
        {GP_LAYER_FACTORIZED_REDUCE, 8, {0, 0}, {0, 0}, {0, 0}, true, kn, {4, {1, 4, 8, 8}}},
    };
    const size_t n_base = sizeof cases / sizeof *cases;
    const size_t n_unet = sizeof ucases / sizeof *ucases;
    const size_t n_all = n_base + n_unet + sizeof wcases / sizeof *wcases;
    const int64_t N = 4;
    for (size_t q = 0; q < n_all; q++) {
        gp_layer_spec sp;
        const gp_shape *in;
        if (q < n_base) {
            const layer_case *lc = &cases[q];
            sp = gp_layer_spec_default(lc->type);
            if (lc->out) sp.out = lc->out;
            if (lc->kernel) sp.kernel = gp_hw_square(lc->kernel);
            if (lc->stride) sp.stride = gp_hw_square(lc->stride);
            sp.padding = gp_hw_square(lc->padding);
            if (lc->type == GP_LAYER_DROPOUT) sp.p = lc->p;
            in = &lc->in;
        } else if (q >= n_base + n_unet) {
            const window_case *wc = &wcases[q - n_base - n_unet];
            sp = gp_layer_spec_default(wc->type);
            sp.out = wc->out;
            if (wc->type != GP_LAYER_FACTORIZED_REDUCE) {
                sp.kernel = wc->kernel;
                sp.stride = wc->stride;
                sp.padding = wc->padding;
            }
            sp.count_include_pad = wc->count_include_pad;
            sp.init = wc->init;
            in = &wc->in;
        } else {
            const unet_case *uc = &ucases[q - n_base];
            sp = gp_layer_spec_default(uc->type);
            if (uc->type == GP_LAYER_DROPOUT2D) sp.p = uc->p;
            if (uc->type == GP_LAYER_LEAKY_RELU) sp.slope = uc->slope;
            if (uc->type == GP_LAYER_UPSAMPLE) sp.scale = uc->scale;
            in = &uc->in;
        }
        char tag[64];
        snprintf(tag, sizeof tag, "layer case %zu (%s)", q, gp_layer_type_name(sp.type));
        gp_layer l[2];
        gp_device *dv[2] = {cpu, gpu};
        memset(l, 0, sizeof l);
        bool ok = true;
        for (int k = 0; k < 2 && ok; k++) {
            /* the same seed and index: the same initial parameters */
            gp_status st = gp_layer_create(&sp, 3, in, dv[k], 7, &l[k]);
            CHECK_MSG(st == GP_OK, "%s on %s: %s", tag, dv[k]->name, gp_last_error());
            ok = st == GP_OK;
        }
        if (!ok) {
            if (l[0].ops) gp_layer_destroy(&l[0]);
            continue;
        }
        /* initialised on the host from (seed, index, parameter): the very
         * same values on both devices, whatever the init */
        for (int p = 0; p < l[0].n_params; p++) {
            gp_device_bind_thread(gpu);
            float *a = to_host(&l[0].params[p].value), *b = to_host(&l[1].params[p].value);
            CHECK_OK(gp_dev_synchronize(gpu));
            CHECK_MSG(!memcmp(a, b, (size_t)gp_tensor_numel(&l[0].params[p].value) * sizeof *a),
                      "%s: initial %s differs between %s and %s", tag, l[0].params[p].name,
                      cpu->name, gpu->name);
            free(a);
            free(b);
        }
        gp_shape xs = gp_shape_with_batch(in, N), ys = gp_shape_with_batch(&l[0].out_shape, N);
        int64_t nx = gp_shape_numel(&xs), ny = gp_shape_numel(&ys);
        float *hx = malloc((size_t)nx * sizeof *hx), *hdy = malloc((size_t)ny * sizeof *hdy);
        for (int64_t i = 0; i < nx; i++) hx[i] = frand();
        for (int64_t i = 0; i < ny; i++) hdy[i] = frand();
        gp_tensor x[2], y[2], dy[2], dx[2];
        gp_saved sv[2];
        memset(x, 0, sizeof x); memset(y, 0, sizeof y); memset(dy, 0, sizeof dy);
        memset(dx, 0, sizeof dx); memset(sv, 0, sizeof sv);
        gp_fwd_ctx ctx = {.training = true, .seed = 11, .step = 2, .batch_total = N};
        for (int k = 0; k < 2; k++) {
            gp_device_bind_thread(dv[k]);
            CHECK_OK(gp_tensor_alloc(&x[k], dv[k], &xs, GP_MEM_ACTIVATIONS));
            CHECK_OK(gp_tensor_alloc(&dy[k], dv[k], &ys, GP_MEM_ACTIVATIONS));
            CHECK_OK(gp_dev_upload(dv[k], gp_f32(&x[k]), hx, nx));
            CHECK_OK(gp_dev_upload(dv[k], gp_f32(&dy[k]), hdy, ny));
            CHECK_OK(gp_layer_zero_grad(&l[k]));
            CHECK_OK(gp_layer_forward(&l[k], &ctx, &x[k], &y[k], &sv[k]));
            CHECK_OK(gp_layer_backward(&l[k], &ctx, &x[k], &y[k], &dy[k], &dx[k], &sv[k]));
            CHECK_OK(gp_dev_synchronize(dv[k]));
        }
        gp_device_bind_thread(gpu);
        float *a = to_host(&y[0]), *b = to_host(&y[1]);
        close_enough("forward y", tag, a, b, ny, 1e-4);
        free(a); free(b);
        a = to_host(&dx[0]);
        b = to_host(&dx[1]);
        close_enough("backward dx", tag, a, b, nx, 1e-4);
        free(a); free(b);
        for (int p = 0; p < l[0].n_params; p++) {
            bool buffer = l[0].params[p].is_buffer;
            const gp_tensor *t0 = buffer ? &l[0].params[p].value : &l[0].params[p].grad;
            const gp_tensor *t1 = buffer ? &l[1].params[p].value : &l[1].params[p].grad;
            a = to_host(t0);
            b = to_host(t1);
            char what[96];
            snprintf(what, sizeof what, "%s %s", buffer ? "buffer" : "gradient of",
                     l[0].params[p].name);
            close_enough(what, tag, a, b, gp_tensor_numel(t0), 1e-4);
            free(a); free(b);
        }
        for (int k = 0; k < 2; k++) {
            gp_saved_free(&sv[k]);
            gp_tensor_free(&x[k]); gp_tensor_free(&y[k]); gp_tensor_free(&dy[k]);
            gp_tensor_free(&dx[k]);
            gp_layer_destroy(&l[k]);
        }
        free(hx);
        free(hdy);
    }
}

/* ---- pipeline transparency on GPUs ------------------------------------------------ */

static const char *k_models[2] = {
    "model:\n"
    "  input: [1, 8, 8]\n"
    "  layers:\n"
    "    - flatten\n"
    "    - linear: {out: 32}\n"
    "    - relu\n"
    "    - dropout: {p: 0.2}\n"
    "    - linear: {out: 32}\n"
    "    - relu\n"
    "    - linear: {out: 10}\n"
    "train: {batch_size: 16, seed: 5, optimizer: {lr: 0.05, momentum: 0.9}}\n",
    "model:\n"
    "  input: [3, 8, 8]\n"
    "  layers:\n"
    "    - conv2d: {out: 8, kernel: 3, padding: 1}\n"
    "    - batchnorm\n"
    "    - relu\n"
    "    - maxpool2d: {kernel: 2}\n"
    "    - conv2d: {out: 8, kernel: 3, padding: 1}\n"
    "    - batchnorm\n"
    "    - relu\n"
    "    - flatten\n"
    "    - linear: {out: 10}\n"
    "train: {batch_size: 16, seed: 5, optimizer: {lr: 0.05, momentum: 0.9}}\n",
};

/* Every parameter and buffer of m, in layer order, on the host; if
 * is_buffer is not NULL, (*is_buffer)[i] says which are buffers. */
static float *all_params(gp_model *m, int64_t *count, unsigned char **is_buffer)
{
    int64_t n = 0;
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params; p++)
            n += gp_tensor_numel(&m->layers[k].params[p].value);
    float *h = calloc((size_t)(n ? n : 1), sizeof *h), *at = h;
    unsigned char *kind = is_buffer ? calloc((size_t)(n ? n : 1), 1) : NULL;
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params; p++) {
            gp_tensor *t = &m->layers[k].params[p].value;
            int64_t c = gp_tensor_numel(t);
            if (gp_dev_download(t->dev, at, gp_f32(t), c) != GP_OK) CHECK_MSG(0, "%s", gp_last_error());
            if (kind) memset(kind + (at - h), m->layers[k].params[p].is_buffer, (size_t)c);
            at += c;
        }
    *count = n;
    if (is_buffer) *is_buffer = kind;
    return h;
}

/* n stages on devs[0..n-1] (GPUs, two handles of one GPU, or a CPU and a
 * GPU) against the single-device run on the CPU; every stage waits on the
 * host once per step (issue 14), and a GPU stage beside a CPU stage once
 * more per copy out of it. */
/* The last step's events of a pipeline that recorded device time (issue
 * 14, item 5): every one timed on its device; on each device compute and
 * copies each in order; every copy after its producer and before the
 * forward or backward that reads it (CUDA events resolve ~0.5 us). */
static void check_device_time(gp_model *pipe, const char *what)
{
    const double eps = 2e-6;
    int host = 0, order = 0, late = 0, copies = 0;
    for (int d = 0; d < gp_pipeline_devices(pipe->pipe); d++) {
        int cnt;
        const gp_event_rec *ev = gp_pipeline_events(pipe->pipe, d, &cnt);
        double end[2] = {0, 0};
        for (int e = 0; e < cnt; e++) {
            const gp_event_rec *r = &ev[e];
            bool cp = gp_instr_copies(r->kind);
            host += !r->device_time;
            order += r->t1 < r->t0 || r->t0 < end[cp] - eps;
            end[cp] = r->t1;
            if (!cp || r->is_wait) continue;
            copies++;
            const gp_event_rec *src = gp_pipeline_producer(pipe->pipe, r);
            late += !src || r->t0 < src->t1 - eps;
            gp_instr_kind want = r->kind == GP_INSTR_RECV_ACT ? GP_INSTR_FORWARD
                                 : r->kind == GP_INSTR_RECV_GRAD ? GP_INSTR_BACKWARD
                                                                 : GP_INSTR_KIND_COUNT;
            for (int q = 0; q < cnt; q++)
                if (ev[q].kind == want && ev[q].i == r->i && ev[q].j == r->j)
                    late += ev[q].t0 < r->t1 - eps;
        }
    }
    CHECK_MSG(host == 0 && order == 0 && late == 0,
              "%s, device time: %d events in host time, %d out of order on their stream, %d "
              "copies before their producer or after their reader (%d copies)",
              what, host, order, late, copies);
}

static void test_transparency(gp_device *cpu, gp_device *const *gpus, int n)
{
    for (int which = 0; which < 2; which++)
        for (int m = 1; m <= 4; m += 3) {
            gp_config c;
            CHECK_OK(gp_config_parse(which ? "convnet.yaml" : "mlp.yaml", k_models[which],
                                     strlen(k_models[which]), NULL, 0, &c));
            c.pipeline.chunks = m;
            int L = c.model.n_layers, bal[3];
            for (int j = 0; j < n; j++) bal[j] = L / n + (j < L % n);
            gp_model ref, pipe;
            CHECK_OK(gp_model_build(&c, cpu, &ref));
            CHECK_OK(gp_model_build_replicated(&c, gpus, 1, n, bal, &pipe));
            int64_t per = c.model.input[0] * c.model.input[1] * c.model.input[2], b = 16;
            float *x = malloc((size_t)(b * per) * sizeof *x), y[16];
            int64_t n0;
            unsigned char *is_buf = NULL;
            float *p0 = all_params(&ref, &n0, &is_buf); /* both models start from these */
            double worst_loss = 0;
            uint64_t waits[3] = {0, 0, 0};
            for (int step = 0; step < 3; step++) {
                for (int64_t i = 0; i < b * per; i++) x[i] = frand();
                for (int i = 0; i < 16; i++) y[i] = (float)((i * 3 + step) % 10);
                gp_step_stats a, g;
                CHECK_OK(gp_model_train_step(&ref, &c, x, y, b, m, 0.05, &a));
                uint64_t w0[3];
                for (int j = 0; j < n; j++) w0[j] = gp_dev_host_waits(gpus[j]);
                pipe.device_time = step == 2; /* the last step as a traced one: no more waits */
                CHECK_OK(gp_model_pipeline_step(&pipe, &c, x, y, b, 0.05, &g));
                if (step == 2) check_device_time(&pipe, which ? "convnet" : "mlp");
                if (step > 0) /* steady state */
                    for (int j = 0; j < n; j++) waits[j] += gp_dev_host_waits(gpus[j]) - w0[j];
                worst_loss = fmax(worst_loss, fabs(a.loss - g.loss) / fmax(fabs(a.loss), 1e-6));
            }
            /* Between a CPU and a GPU stage every copy out of the GPU
             * waits on the host once (the CPU stage reads host memory, and
             * the GPU's events mean nothing to it), on the CPU's worker:
             * 2 x (1 + m) for the GPU stage, m copies out of it per step
             * whichever side it is on; the copies into the GPU wait for
             * nothing, and a CPU device's events are NULL (its streams
             * synchronous here), so the CPU stage waits once per step. */
            for (int j = 0; j < n; j++) {
                bool mixed = n == 2 && gpus[0]->kind != gpus[1]->kind;
                uint64_t want = 2 * (uint64_t)(1 + (mixed && gpus[j]->kind == GP_DEV_CUDA ? m : 0));
                CHECK_MSG(waits[j] == want, "%s, %s stage %d of %d, m = %d: %llu host waits in 2 "
                          "steady steps, not %llu", which ? "convnet" : "mlp", gpus[j]->name, j,
                          n, m, (unsigned long long)waits[j], (unsigned long long)want);
            }
            /* Parameters, and separately the batch-norm buffers, differ by
             * at most 1e-3 of the largest change the 3 steps made to any of
             * them: relative to the update, since the starting values (the
             * same on both) cancel. */
            int64_t na, nb;
            float *pa = all_params(&ref, &na, NULL), *pb = all_params(&pipe, &nb, NULL);
            double step[2] = {0, 0}, err[2] = {0, 0}; /* [0] parameters, [1] buffers */
            for (int64_t i = 0; i < na && na == nb && na == n0; i++) {
                int q = is_buf[i] != 0;
                step[q] = fmax(step[q], fabs((double)pa[i] - p0[i]));
                err[q] = fmax(err[q], fabs((double)pa[i] - pb[i]));
            }
            CHECK_MSG(na == nb && na == n0 && step[0] > 0 && err[0] <= 1e-3 * step[0] &&
                          err[1] <= 1e-3 * step[1] && worst_loss <= 1e-4,
                      "%s on %d stage(s), m = %d: parameters differ by %.3g (their largest "
                      "change in 3 steps: %.3g), buffers by %.3g (%.3g), loss by %.3g relative",
                      which ? "convnet" : "mlp", n, m, err[0], step[0], err[1], step[1],
                      worst_loss);
            free(p0);
            free(is_buf);
            free(pa);
            free(pb);
            free(x);
            gp_model_free(&ref);
            gp_model_free(&pipe);
            gp_config_free(&c);
        }
}

/* Several stages on one GPU (issue 14): two and three handles of cuda:0,
 * each its own streams and allocator, copies between them on the GPU; and a
 * mixed pipeline, a CPU stage feeding cuda:0. */
static void test_shared_gpu(gp_device *gpu, gp_device *cpu)
{
    gp_device *more[2] = {NULL, NULL}, *cpu1 = NULL;
    gp_device_opts co = {.threads = 1};
    CHECK_OK(gp_device_open("cuda:0", NULL, &more[0]));
    CHECK_OK(gp_device_open("cuda:0", NULL, &more[1]));
    CHECK_OK(gp_device_open("cpu:1", &co, &cpu1));
    if (!more[0] || !more[1] || !cpu1) goto out;
    test_copies(gpu, more[0]);
    gp_device *two[2] = {gpu, more[0]}, *three[3] = {gpu, more[0], more[1]}, *mixed[2] = {cpu1, gpu};
    test_transparency(cpu, two, 2);
    test_transparency(cpu, three, 3);
    test_transparency(cpu, mixed, 2);
    /* each handle accounts its own memory: what stage 1 allocated is not
     * stage 0's */
    size_t before = gpu->alloc.current;
    gp_tensor t;
    gp_shape sh = gp_shape_2d(1, 1 << 20);
    CHECK_OK(gp_tensor_alloc(&t, more[0], &sh, GP_MEM_ACTIVATIONS));
    CHECK_MSG(gpu->alloc.current == before && more[0]->alloc.current >= (size_t)4 << 20,
              "cuda:0 handles share their accounting: %zu -> %zu, other %zu", before,
              gpu->alloc.current, more[0]->alloc.current);
    gp_tensor_free(&t);
out:
    gp_device_close(more[0]);
    gp_device_close(more[1]);
    gp_device_close(cpu1);
    gp_device_bind_thread(gpu);
}

/* Two GPUs: peer copies both ways, the NCCL collectives and the 2-stage
 * pipeline on cuda:0,cuda:1.  A separate CTest test (test_cuda_2gpu), so a
 * machine with one GPU reports it skipped rather than passed. */
static int main_two_gpus(gp_device *gpu, gp_device *cpu)
{
    gp_device *gpu1 = NULL;
    if (gp_device_open("cuda:1", NULL, &gpu1) != GP_OK) {
        printf("test_cuda --two-gpus: SKIPPED, needs 2 CUDA devices: %s\n", gp_last_error());
        gp_device_close(gpu);
        gp_device_close(cpu);
        return 77;
    }
    test_copies(gpu, gpu1);
    test_copies(gpu1, gpu);
    test_nccl(gpu, gpu1);
    gp_device *gpus[2] = {gpu, gpu1};
    test_transparency(cpu, gpus, 2);
    gp_device_close(gpu1);
    gp_device_close(gpu);
    gp_device_close(cpu);
    return gpt_finish("test_cuda --two-gpus");
}

/* train.precision on a GPU (backend.h, gp_precision): tf32 runs cuBLAS and
 * cuDNN on TF32 tensor cores, within TF32's rounding of the CPU's FP32
 * (a 10-bit mantissa: 2e-2 of the largest value, where FP32 gets 1e-4). */
static void test_tf32(gp_device *cpu)
{
    gp_device_opts o = {.precision = GP_PRECISION_TF32};
    gp_device *g = NULL;
    CHECK_OK(gp_device_open("cuda:0", &o, &g));
    if (!g) return;
    CHECK(g->precision == GP_PRECISION_TF32);
    gp_device *keep[2] = {D2[0], D2[1]};
    D2[0] = cpu;
    D2[1] = g;
    gp_device_bind_thread(g);
    const int64_t m = 64, n = 48, k = 256;
    buf a = brand(m * k, -1, 1), b = brand(k * n, -1, 1), c = bjunk(m * n);
    BOTH(gp_dev_gemm(D, 0, 0, m, n, k, 1.0f, a.p[K], k, b.p[K], n, 0.0f, c.p[K], n));
    bcheck("tf32 gemm", &c, 2e-2);
    bfree(&a); bfree(&b); bfree(&c);
    gp_conv_desc d = {4, 32, 14, 14, 32, 3, 3, 1, 1, 1, 1, 14, 14, 1, 0, 0};
    int64_t nx = 4 * 32 * 14 * 14, nw = 32 * 32 * 9;
    buf x = brand(nx, -1, 1), w = brand(nw, -1, 1), bb = brand(32, -1, 1), y = bjunk(nx);
    BOTH(gp_dev_conv_fwd(D, &d, x.p[K], w.p[K], bb.p[K], y.p[K]));
    bcheck("tf32 conv fwd", &y, 2e-2);
    bfree(&x); bfree(&w); bfree(&bb); bfree(&y);
    D2[0] = keep[0];
    D2[1] = keep[1];
    gp_device_close(g);
}

static float bf16_round(float v) { return gp_ew_bf16_value(gp_ew_bf16_bits(v)); }

/* A buffer of random values in [-1, 1), rounded to bfloat16 if `round`. */
static buf brand_bf16(int64_t n, bool round)
{
    buf b = bnew(n);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = round ? bf16_round(frand()) : frand();
    bset(&b, h);
    free(h);
    return b;
}

/* RMSNorm (rms_norm_*, issue 66) on FP32 and bf16 storage: the GPU's y,
 * rstd, dx and dw within rounding of the CPU's (their sums in another
 * order); 768 wide as Llama's smallest, rows past a block's threads. */
static void test_rms_norm(void)
{
    const int64_t rows = 40, c = 768, n = rows * c;
    for (int b16 = 0; b16 < 2; b16++) {
        const gp_dtype dt = b16 ? GP_BF16 : GP_F32;
        const int64_t wn = b16 ? n / 2 : n;
        buf fx = brand(n, -2, 2), fdy = brand(n, -1, 1), w = brand(c, 0.5f, 1.5f);
        buf x = bjunk(wn), dy = bjunk(wn), y = bjunk(wn), dx = bjunk(wn), r = bjunk(rows),
            dw = bnew(c), fy = bjunk(n), fdx = bjunk(n);
        BOTH(gp_dev_fill(D, dw.p[K], 0.0f, c));
        if (b16) {
            BOTH(gp_dev_bf16_pack(D, (uint16_t *)x.p[K], fx.p[K], n));
            BOTH(gp_dev_bf16_pack(D, (uint16_t *)dy.p[K], fdy.p[K], n));
        } else {
            BOTH(gp_dev_copy_d2d(D, x.p[K], fx.p[K], (size_t)n * 4));
            BOTH(gp_dev_copy_d2d(D, dy.p[K], fdy.p[K], (size_t)n * 4));
        }
        BOTH(gp_dev_rms_norm_fwd(D, dt, x.p[K], w.p[K], y.p[K], r.p[K], rows, c, 1e-5f));
        BOTH(gp_dev_rms_norm_bwd_data(D, dt, x.p[K], w.p[K], r.p[K], dy.p[K], dx.p[K], rows, c));
        BOTH(gp_dev_rms_norm_bwd_weights(D, dt, x.p[K], r.p[K], dy.p[K], dw.p[K], rows, c));
        if (b16) {
            BOTH(gp_dev_bf16_unpack(D, fy.p[K], (uint16_t *)y.p[K], n));
            BOTH(gp_dev_bf16_unpack(D, fdx.p[K], (uint16_t *)dx.p[K], n));
        } else {
            BOTH(gp_dev_copy_d2d(D, fy.p[K], y.p[K], (size_t)n * 4));
            BOTH(gp_dev_copy_d2d(D, fdx.p[K], dx.p[K], (size_t)n * 4));
        }
        double tol = b16 ? 1.0 / 64 : 1e-4;
        bcheck(b16 ? "bf16 rms_norm y" : "rms_norm y", &fy, tol);
        bcheck(b16 ? "bf16 rms_norm dx" : "rms_norm dx", &fdx, tol);
        bcheck(b16 ? "bf16 rms_norm rstd" : "rms_norm rstd", &r, 1e-5);
        bcheck(b16 ? "bf16 rms_norm dw" : "rms_norm dw", &dw, 1e-4);
        /* swiglu (issue 66) on the same values as (rows, 2 h) with h = c / 2 */
        const int64_t sh = c / 2;
        BOTH(gp_dev_swiglu_fwd(D, dt, x.p[K], y.p[K], rows, sh));
        BOTH(gp_dev_swiglu_bwd(D, dt, x.p[K], dy.p[K], dx.p[K], rows, sh));
        if (b16) {
            BOTH(gp_dev_fill(D, fy.p[K], 0.0f, n));
            BOTH(gp_dev_bf16_unpack(D, fy.p[K], (uint16_t *)y.p[K], rows * sh));
            BOTH(gp_dev_bf16_unpack(D, fdx.p[K], (uint16_t *)dx.p[K], n));
        } else {
            BOTH(gp_dev_fill(D, fy.p[K], 0.0f, n));
            BOTH(gp_dev_copy_d2d(D, fy.p[K], y.p[K], (size_t)(rows * sh) * 4));
            BOTH(gp_dev_copy_d2d(D, fdx.p[K], dx.p[K], (size_t)n * 4));
        }
        bcheck(b16 ? "bf16 swiglu y" : "swiglu y", &fy, tol);
        bcheck(b16 ? "bf16 swiglu dx" : "swiglu dx", &fdx, tol);
        /* rope (issue 66) on the same values as 5 sequences of 8 positions
         * from 100, 768 = (8 + 2 * 2) heads of 64 (Llama 3.2 1B's head):
         * forward out of place, then its inverse in place */
        gp_rope_desc rd = {.rows = 5, .t = 8, .pos0 = 100, .width = c, .heads = 10, .d = 64};
        for (int i = 0; i < 32; i++) rd.inv_freq[i] = (float)pow(500000.0, -i / 32.0);
        BOTH(gp_dev_rope(D, dt, &rd, false, x.p[K], y.p[K]));
        BOTH(gp_dev_rope(D, dt, &rd, true, dy.p[K], dy.p[K]));
        if (b16) {
            BOTH(gp_dev_bf16_unpack(D, fy.p[K], (uint16_t *)y.p[K], n));
            BOTH(gp_dev_bf16_unpack(D, fdx.p[K], (uint16_t *)dy.p[K], n));
        } else {
            BOTH(gp_dev_copy_d2d(D, fy.p[K], y.p[K], (size_t)n * 4));
            BOTH(gp_dev_copy_d2d(D, fdx.p[K], dy.p[K], (size_t)n * 4));
        }
        bcheck(b16 ? "bf16 rope y" : "rope y", &fy, tol);
        bcheck(b16 ? "bf16 rope dx (in place)" : "rope dx (in place)", &fdx, tol);
        /* attn_cached on this storage (sampling with a KV cache): 3
         * sequences of 16 positions of Llama 3.2 1B's heads (4 query heads
         * of 64 over 2 k, v heads: rows of 512 in x), fed as 9 and then 7
         * into a cache of 20 (x's first 3 x 16 x 512 values) */
        const size_t es = b16 ? 2 : 4;
        buf kvb = bjunk(3 * 20 * 512);
        BOTH(gp_dev_fill(D, fy.p[K], 0.0f, n));
        BOTH(gp_dev_attn_cached(D, dt, x.p[K], kvb.p[K], y.p[K], 3, 9, 0, 20, 4, 2, 256));
        BOTH(gp_dev_attn_cached(D, dt, (char *)x.p[K] + 3 * 9 * 512 * es, kvb.p[K],
                                (char *)y.p[K] + 3 * 9 * 256 * es, 3, 7, 9, 20, 4, 2, 256));
        if (b16) BOTH(gp_dev_bf16_unpack(D, fy.p[K], (uint16_t *)y.p[K], 3 * 16 * 256));
        else BOTH(gp_dev_copy_d2d(D, fy.p[K], y.p[K], (size_t)(3 * 16 * 256) * 4));
        bcheck(b16 ? "bf16 attn_cached y" : "attn_cached y (Llama's heads)", &fy, tol);
        bfree(&kvb);
        buf *all[] = {&fx, &fdy, &w, &x, &dy, &y, &dx, &r, &dw, &fy, &fdx};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
    }
}

/* The embedding's backward (embed_bwd, issue 64: a block per vocabulary
 * row for wte, a thread per position and column for wpe, where a thread
 * per column did all of it): the CPU's bits on the GPU, each element's
 * rows in the same order, on FP32 and bf16 gradients, with ids repeated
 * within and across samples and a vocabulary row no id takes. */
static void test_embed_bwd(void)
{
    const int64_t n = 3, t = 50, c = 40, vocab = 37, rows = n * t;
    float hid[150];
    for (int64_t r = 0; r < rows; r++) hid[r] = (float)((r * 7 + r / 11) % (vocab - 1));
    buf ids = bnew(rows), fdy = brand(rows * c, -1, 1), dy16 = bjunk(rows * c / 2);
    bset(&ids, hid);
    BOTH(gp_dev_bf16_pack(D, (uint16_t *)dy16.p[K], fdy.p[K], rows * c));
    for (int b16 = 0; b16 < 2; b16++) {
        buf dwte = brand(vocab * c, -1, 1), dwpe = brand(t * c, -1, 1); /* dW += */
        const buf *dy = b16 ? &dy16 : &fdy;
        BOTH(gp_dev_embed_bwd(D, ids.p[K], b16 ? GP_BF16 : GP_F32, dy->p[K], dwte.p[K],
                              dwpe.p[K], n, t, c, vocab));
        const buf *out[2] = {&dwte, &dwpe};
        const int64_t nv[2] = {vocab * c, t * c};
        for (int q = 0; q < 2; q++) {
            float *h[2] = {malloc(sizeof(float) * (size_t)nv[q]),
                           malloc(sizeof(float) * (size_t)nv[q])};
            for (int k = 0; k < 2; k++) {
                CHECK_OK(gp_dev_download(D2[k], h[k], out[q]->p[k], nv[q]));
                CHECK_OK(gp_dev_synchronize(D2[k]));
            }
            CHECK_MSG(!memcmp(h[0], h[1], sizeof(float) * (size_t)nv[q]), "embedding backward "
                      "(%s dy) %s: the GPU's bits differ from the CPU's", b16 ? "bf16" : "FP32",
                      q ? "dwpe" : "dwte");
            free(h[0]);
            free(h[1]);
        }
        bfree(&dwte);
        bfree(&dwpe);
    }
    bfree(&ids);
    bfree(&fdy);
    bfree(&dy16);
}

/* A product with GELU (linear_gelu_fwd) and GELU's derivative
 * (linear_gelu_bwd_data) as its epilogue, issue 64: cuBLASLt's
 * GELU_AUX_BIAS and DGELU epilogues where it has a plan, on the GPU (D2[1])
 * against the same GPU's unfused slots (the product, then GELU's kernel)
 * within rounding (cuBLASLt's tanh and sums are its own), pre, y and dx;
 * on FP32 storage also against the CPU's (D2[0]) fused slots. */
static void test_linear_gelu(gp_dtype dt)
{
    gp_device *g = D2[1];
    const bool b16 = dt == GP_BF16;
    CHECK(gp_dev_linear_gelu_has(g, dt));
    const int64_t ln = 64, lout = 96, lin = 256, nx = ln * lin, ny = ln * lout;
    const int64_t wx = b16 ? nx / 2 : nx, wy = b16 ? ny / 2 : ny; /* storage in floats */
    buf fx = brand(nx, -1, 1), fdy = brand(ny, -1, 1), fg = brand(nx, -2, 2),
        w = brand(lout * lin, -0.1f, 0.1f), bias = brand(lout, -0.5f, 0.5f);
    buf x = bjunk(wx), dy = bjunk(wy), gin = bjunk(wx), pre = bjunk(wy), y = bjunk(wy),
        dx = bjunk(wx), pre2 = bjunk(wy), y2 = bjunk(wy), dx2 = bjunk(wx), d = bjunk(wx);
    buf *src[3] = {&fx, &fdy, &fg}, *dst[3] = {&x, &dy, &gin};
    const int64_t cnt[3] = {nx, ny, nx};
    for (int q = 0; q < 3; q++) {
        if (b16) BOTH(gp_dev_bf16_pack(D, (uint16_t *)dst[q]->p[K], src[q]->p[K], cnt[q]));
        else BOTH(gp_dev_copy_d2d(D, dst[q]->p[K], src[q]->p[K], (size_t)cnt[q] * 4));
    }
    int kk = b16 ? 1 : 0; /* FP32: the CPU's fused slots too */
    for (int K = kk; K < 2; K++) {
        CHECK_OK(gp_dev_linear_gelu_fwd(D2[K], dt, ln, lout, lin, x.p[K], w.p[K], bias.p[K],
                                        pre.p[K], y.p[K]));
        CHECK_OK(gp_dev_linear_gelu_bwd_data(D2[K], dt, ln, lout, lin, dy.p[K], w.p[K], gin.p[K],
                                             dx.p[K]));
    }
    if (b16) { /* the unfused slots on the GPU */
        CHECK_OK(gp_dev_linear_fwd_bf16(g, ln, lout, lin, (uint16_t *)x.p[1], w.p[1], bias.p[1],
                                        false, (uint16_t *)pre2.p[1]));
        CHECK_OK(gp_dev_act_bf16(g, GP_ACT_GELU, (uint16_t *)pre2.p[1], NULL,
                                 (uint16_t *)y2.p[1], ny, 0.0f));
        CHECK_OK(gp_dev_linear_bwd_data_bf16(g, ln, lout, lin, (uint16_t *)dy.p[1], w.p[1],
                                             (uint16_t *)d.p[1]));
        CHECK_OK(gp_dev_act_bf16(g, GP_ACT_GELU, (uint16_t *)gin.p[1], (uint16_t *)d.p[1],
                                 (uint16_t *)dx2.p[1], nx, 0.0f));
    } else {
        CHECK_OK(gp_dev_linear_fwd(g, ln, lout, lin, x.p[1], w.p[1], bias.p[1], false,
                                   pre2.p[1]));
        CHECK_OK(gp_dev_gelu_fwd(g, pre2.p[1], y2.p[1], ny));
        CHECK_OK(gp_dev_gemm_wb(g, 0, 0, ln, lin, lout, 1.0f, dy.p[1], lout, w.p[1], lin, 0.0f,
                                d.p[1], lin));
        CHECK_OK(gp_dev_gelu_bwd(g, gin.p[1], d.p[1], dx2.p[1], nx));
    }
    const buf *got[3] = {&pre, &y, &dx}, *want[3] = {&pre2, &y2, &dx2};
    static const char *const names[3] = {"pre", "y", "dx"};
    for (int t = 0; t < 3; t++) {
        int64_t nv = t == 2 ? nx : ny;
        float *h[3];
        for (int k = 0; k < 3; k++) h[k] = malloc(sizeof(float) * (size_t)nv);
        for (int k = 0; k < 3; k++) { /* GPU fused, GPU unfused, CPU fused */
            gp_device *dd = k == 2 ? D2[0] : g;
            const void *p = k == 0 ? got[t]->p[1] : k == 1 ? want[t]->p[1] : got[t]->p[0];
            if (k == 2 && b16) break;
            if (b16) {
                uint16_t *r = malloc(2 * (size_t)nv);
                CHECK_OK(gp_dev_download(dd, (float *)r, p, nv / 2));
                CHECK_OK(gp_dev_synchronize(dd));
                for (int64_t i = 0; i < nv; i++) h[k][i] = gp_ew_bf16_value(r[i]);
                free(r);
            } else {
                CHECK_OK(gp_dev_download(dd, h[k], p, nv));
                CHECK_OK(gp_dev_synchronize(dd));
            }
        }
        for (int k = 1; k < (b16 ? 2 : 3); k++) {
            double worst = 0.0, big = 0.0;
            for (int64_t i = 0; i < nv; i++) {
                double e = fabs((double)h[0][i] - (double)h[k][i]);
                if (!(e <= worst)) worst = e;
                if (fabs((double)h[k][i]) > big) big = fabs((double)h[k][i]);
            }
            CHECK_MSG(worst <= (b16 ? 1.0 / 64 : 1e-4) * (1.0 + big), "product with a GELU "
                      "epilogue (%s) %s: %.3g from the %s", gp_dtype_name(dt), names[t], worst,
                      k == 1 ? "GPU's unfused slots" : "CPU's");
        }
        for (int k = 0; k < 3; k++) free(h[k]);
    }
    buf *all[] = {&fx, &fdy, &fg, &w, &bias, &x, &dy, &gin, &pre, &y, &dx, &pre2, &y2, &dx2, &d};
    for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
}

/* Precision bf16 on the GPU (backend.h): matrix products worth it
 * (gp_bf16_gemm_worth) on operands rounded to bfloat16 with FP32 sums,
 * against a double-precision product of the rounded operands within FP32
 * summation's error (2e-5 of the largest), on data where the unrounded
 * product is at least 4 times that far off (so the check sees whether the
 * operands were rounded); smaller products exact FP32.  Convolutions on
 * rounded operands, their result rounded to bfloat16 too: against the CPU's
 * FP32 on operands rounded on the host, within 4e-3 (2^-8) of the largest
 * value, forward, backward-data and backward-filter (dw += its bf16 part),
 * with cuDNN's choice and again with the graph API forced; given unrounded
 * operands the result is the same as for the rounded ones within that
 * bound (the bias gradient sums dy in FP32: 1e-4, 4e-3 from unrounded dy);
 * given the CPU's own unrounded operands, every direction is more than
 * 1e-4 (FP32's bound) and less than 2e-2 from the CPU's FP32, so the
 * check sees whether the convolutions ran in bf16;
 * a convolution of 1 channel, too few products for bf16, is FP32 (1e-4).
 * A GPU before sm_80 refuses bf16 saying what to use. */
/* ---- channels-last on the GPU (issue 67) -------------------------------------
 * Each op of a chain (convolution, batch norm, pooling) on a bf16 handle of
 * cuda:0 with train.deterministic (deterministic algorithms: two calls on
 * the same operands give the same bits), called once on plain tensors and
 * once on the same values laid out channels-last (the descriptors' blocks =
 * the channels, as act_block says), on FP32 and on bf16 storage: the
 * channels-last results, turned back on the host, are the plain call's
 * bits where both run the same kernels in the same order, else within the
 * tolerance said.  The convolution's plain call is also checked against
 * the CPU's FP32 (the layouts could agree and both be wrong); batch norm's
 * and pooling's plain calls are test_bn's, test_pool's and test_bf16_ops'.
 * Compiled, not run, until a GPU session runs it. */

/* Each of n (rows, cols) matrices of es-byte elements transposed. */
static void cl_turn(const void *src, void *dst, size_t es, int64_t n, int64_t rows, int64_t cols)
{
    const char *s = src;
    char *d = dst;
    for (int64_t b = 0; b < n; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                memcpy(d + ((b * cols + c) * rows + r) * es, s + ((b * rows + r) * cols + c) * es,
                       es);
}

/* bytes (a multiple of 4) of host h on g, or zeros (h NULL). */
static void *cl_put(gp_device *g, const void *h, size_t bytes)
{
    void *p = NULL;
    CHECK_OK(gp_dev_alloc(g, bytes, GP_MEM_ACTIVATIONS, &p));
    if (h)
        CHECK_OK(gp_dev_upload(g, p, h, (int64_t)(bytes / 4)));
    else
        CHECK_OK(gp_dev_fill(g, p, 0.0f, (int64_t)(bytes / 4)));
    return p;
}

static void *cl_get(gp_device *g, const void *p, size_t bytes)
{
    void *h = malloc(bytes);
    CHECK_OK(gp_dev_download(g, h, p, (int64_t)(bytes / 4)));
    CHECK_OK(gp_dev_synchronize(g));
    return h;
}

/* Element i of storage h (bf16 patterns where io16) as a double. */
static double cl_val(const void *h, bool io16, int64_t i)
{
    return io16 ? gp_ew_bf16_value(((const uint16_t *)h)[i]) : ((const float *)h)[i];
}

/* Random storage of n values: bf16 patterns, or floats (of bf16 values
 * where round: the convolution's operands, exact in bf16). */
static void *cl_rand(int64_t n, bool io16, bool round)
{
    void *h = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        float v = frand();
        if (io16)
            ((uint16_t *)h)[i] = gp_ew_bf16_bits(v);
        else
            ((float *)h)[i] = round ? bf16_round(v) : v;
    }
    return h;
}

/* Plain result a (n values) against channels-last b of (imgs, px, ch),
 * turned back: max |a - b| / (1 + max |a|) <= tol (0: the same bits). */
static void cl_check(const char *what, const void *a, const void *b, bool io16, int64_t imgs,
                     int64_t ch, int64_t px, double tol)
{
    size_t es = io16 ? 2 : 4;
    int64_t n = imgs * ch * px;
    void *t = malloc((size_t)n * es);
    cl_turn(b, t, es, imgs, px, ch);
    double err = 0, big = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(cl_val(a, io16, i) - cl_val(t, io16, i));
        if (!(e <= err)) err = e, at = i;
        big = fmax(big, fabs(cl_val(a, io16, i)));
    }
    if (tol == 0)
        CHECK_MSG(memcmp(a, t, (size_t)n * es) == 0, "%s: channels-last is not the plain "
                  "layout's bits (max diff %.3g at %lld)", what, err, (long long)at);
    else
        CHECK_MSG(err <= tol * (1 + big), "%s: channels-last %.3g from plain at %lld (max %.3g, "
                  "tol %.1g)", what, err, (long long)at, big, tol);
    free(t);
}

/* The GPU's plain result a (storage) against the CPU's FP32 r (floats). */
static void cl_ref(const char *what, const void *a, bool io16, const float *r, int64_t n,
                   double tol)
{
    double err = 0, big = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(cl_val(a, io16, i) - r[i]);
        if (!(e <= err)) err = e;
        big = fmax(big, fabs((double)r[i]));
    }
    CHECK_MSG(err <= tol * (1 + big), "%s: the GPU's plain layout %.3g from the CPU's FP32 "
              "(max %.3g, tol %.1g)", what, err, big, tol);
}

/* Storage h (n values) as floats on the CPU device. */
static float *cl_cpu(gp_device *cpu, const void *h, bool io16, int64_t n)
{
    float *f = malloc((size_t)n * 4), *p = NULL;
    for (int64_t i = 0; i < n; i++) f[i] = (float)cl_val(h, io16, i);
    CHECK_OK(gp_dev_alloc(cpu, (size_t)n * 4, GP_MEM_ACTIVATIONS, (void **)&p));
    CHECK_OK(gp_dev_upload(cpu, p, f, n));
    free(f);
    return p;
}

static float *cl_cpu_get(gp_device *cpu, const float *p, int64_t n)
{
    float *h = malloc((size_t)n * 4);
    CHECK_OK(gp_dev_download(cpu, h, p, n));
    CHECK_OK(gp_dev_synchronize(cpu));
    return h;
}

/* A convolution c16 -> k24, 3x3, with a bias: the three directions.
 * exact: both calls run one NHWC convolution (the default); else the
 * plain call runs NCHW (GPIPE_CUDA_NHWC=chains), another algorithm: the
 * layouts agree within bf16's rounding. */
static void cl_conv(gp_device *g, gp_device *cpu, bool io16, bool exact)
{
    const gp_conv_desc d0 = {.n = 3, .c = 16, .h = 10, .w = 9, .k = 24, .kh = 3, .kw = 3,
                             .sh = 1, .sw = 1, .ph = 1, .pw = 1, .oh = 10, .ow = 9,
                             .has_bias = 1};
    gp_conv_desc d1 = d0;
    d1.xblk = 16;
    d1.yblk = 24;
    CHECK_MSG(gp_dev_act_block(g, &d0, false) == 16 && gp_dev_act_block(g, &d0, true) == 24,
              "act_block on a bf16 GPU: %lld / %lld, want 16 / 24 (channels-last)",
              (long long)gp_dev_act_block(g, &d0, false), (long long)gp_dev_act_block(g, &d0, true));
    const int64_t nx = 3 * 16 * 90, ny = 3 * 24 * 90, nw = 24 * 16 * 9, px = 90;
    size_t es = io16 ? 2 : 4, bx = (size_t)nx * es, by = (size_t)ny * es;
    void *hx = cl_rand(nx, io16, true), *hdy = cl_rand(ny, io16, true), *hxt = malloc(bx),
         *hdyt = malloc(by);
    float *hw = malloc((size_t)nw * 4), hb[24];
    for (int64_t i = 0; i < nw; i++) hw[i] = 0.3f * frand();
    for (int i = 0; i < 24; i++) hb[i] = 0.5f * frand();
    cl_turn(hx, hxt, es, 3, 16, px);
    cl_turn(hdy, hdyt, es, 3, 24, px);
    void *x[2] = {cl_put(g, hx, bx), cl_put(g, hxt, bx)};
    void *dy[2] = {cl_put(g, hdy, by), cl_put(g, hdyt, by)};
    float *w = cl_put(g, hw, (size_t)nw * 4), *b = cl_put(g, hb, sizeof hb);
    void *y[2], *dx[2];
    float *dw[2], *db[2];
    for (int l = 0; l < 2; l++) {
        const gp_conv_desc *d = l ? &d1 : &d0;
        y[l] = cl_put(g, NULL, by);
        dx[l] = cl_put(g, NULL, bx);
        dw[l] = cl_put(g, NULL, (size_t)nw * 4);
        db[l] = cl_put(g, NULL, sizeof hb);
        if (io16) {
            CHECK_OK(gp_dev_conv_fwd_bf16(g, d, x[l], w, b, y[l]));
            CHECK_OK(gp_dev_conv_bwd_data_bf16(g, d, w, dy[l], dx[l]));
            CHECK_OK(gp_dev_conv_bwd_weights_bf16(g, d, x[l], dy[l], dw[l], db[l]));
        } else {
            CHECK_OK(gp_dev_conv_fwd(g, d, x[l], w, b, y[l]));
            CHECK_OK(gp_dev_conv_bwd_data(g, d, w, dy[l], dx[l]));
            CHECK_OK(gp_dev_conv_bwd_weights(g, d, x[l], dy[l], dw[l], db[l]));
        }
    }
    const char *st = io16 ? "bf16 storage" : "FP32 storage";
    char what[128];
    void *hy[2] = {cl_get(g, y[0], by), cl_get(g, y[1], by)};
    void *hdx[2] = {cl_get(g, dx[0], bx), cl_get(g, dx[1], bx)};
    float *hdw[2] = {cl_get(g, dw[0], (size_t)nw * 4), cl_get(g, dw[1], (size_t)nw * 4)};
    float *hdb[2] = {cl_get(g, db[0], sizeof hb), cl_get(g, db[1], sizeof hb)};
    /* one cuDNN call in NHWC both ways; the plain call's transposes are
     * exact; the bias is one FP32 add either way */
    snprintf(what, sizeof what, "conv forward, %s%s", st, exact ? "" : ", chains only");
    cl_check(what, hy[0], hy[1], io16, 3, 24, px, !exact ? 1.0 / 64 : io16 ? 0 : 1e-6);
    snprintf(what, sizeof what, "conv backward-data, %s%s", st, exact ? "" : ", chains only");
    cl_check(what, hdx[0], hdx[1], io16, 3, 16, px, exact ? 0 : 1.0 / 64);
    snprintf(what, sizeof what, "conv backward-filter, %s%s", st, exact ? "" : ", chains only");
    if (exact)
        CHECK_MSG(memcmp(hdw[0], hdw[1], (size_t)nw * 4) == 0, "%s: channels-last dw is not the "
                  "plain layout's bits", what);
    else
        cl_ref(what, hdw[1], false, hdw[0], nw, 1.0 / 64);
    /* the bias gradient sums columns channels-last, planes plain */
    double e = 0;
    for (int i = 0; i < 24; i++) e = fmax(e, fabs(hdb[0][i] - hdb[1][i]) / (1 + fabs(hdb[0][i])));
    CHECK_MSG(e <= 1e-5, "conv bias gradient, %s: channels-last %.3g from plain", st, e);
    /* the CPU's FP32 on the same values (the GPU rounds the weights) */
    float *cx = cl_cpu(cpu, hx, io16, nx), *cdy = cl_cpu(cpu, hdy, io16, ny);
    float *cw = cl_cpu(cpu, hw, false, nw), *cb = cl_cpu(cpu, hb, false, 24);
    float *cy = cl_put(cpu, NULL, (size_t)ny * 4), *cdx = cl_put(cpu, NULL, (size_t)nx * 4);
    float *cdw = cl_put(cpu, NULL, (size_t)nw * 4), *cdb = cl_put(cpu, NULL, sizeof hb);
    CHECK_OK(gp_dev_conv_fwd(cpu, &d0, cx, cw, cb, cy));
    CHECK_OK(gp_dev_conv_bwd_data(cpu, &d0, cw, cdy, cdx));
    CHECK_OK(gp_dev_conv_bwd_weights(cpu, &d0, cx, cdy, cdw, cdb));
    float *ry = cl_cpu_get(cpu, cy, ny), *rdx = cl_cpu_get(cpu, cdx, nx);
    float *rdw = cl_cpu_get(cpu, cdw, nw), *rdb = cl_cpu_get(cpu, cdb, 24);
    snprintf(what, sizeof what, "conv forward, %s", st);
    cl_ref(what, hy[0], io16, ry, ny, 1.0 / 64);
    snprintf(what, sizeof what, "conv backward-data, %s", st);
    cl_ref(what, hdx[0], io16, rdx, nx, 1.0 / 64);
    snprintf(what, sizeof what, "conv backward-filter, %s", st);
    cl_ref(what, hdw[0], false, rdw, nw, 1.0 / 64);
    snprintf(what, sizeof what, "conv bias gradient, %s", st); /* sums of the same dy */
    cl_ref(what, hdb[0], false, rdb, 24, 1e-5);
    void *hs[] = {hx, hdy, hxt, hdyt, hw, hy[0], hy[1], hdx[0], hdx[1], hdw[0], hdw[1],
                  hdb[0], hdb[1], ry, rdx, rdw, rdb};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
    gp_dev_free(cpu, cx, (size_t)nx * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(cpu, cdy, (size_t)ny * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(cpu, cw, (size_t)nw * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(cpu, cb, sizeof hb, GP_MEM_ACTIVATIONS);
    gp_dev_free(cpu, cy, (size_t)ny * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(cpu, cdx, (size_t)nx * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(cpu, cdw, (size_t)nw * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(cpu, cdb, sizeof hb, GP_MEM_ACTIVATIONS);
    for (int l = 0; l < 2; l++) {
        gp_dev_free(g, x[l], bx, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, dy[l], by, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, y[l], by, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, dx[l], bx, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, dw[l], (size_t)nw * 4, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, db[l], sizeof hb, GP_MEM_ACTIVATIONS);
    }
    gp_dev_free(g, w, (size_t)nw * 4, GP_MEM_ACTIVATIONS);
    gp_dev_free(g, b, sizeof hb, GP_MEM_ACTIVATIONS);
}

/* Batch norm over 40 channels (a tile of 32 and a partial one) of s
 * values: the plane kernels (s >= 64) or the channel kernels; forward with
 * the relu and a residual sum, backward with the relu.  Narrow maps on
 * FP32 storage run cuDNN plain and gpipe's kernels channels-last: within
 * FP32 rounding, not the bits. */
static void cl_bn(gp_device *g, bool io16, int64_t s)
{
    const int64_t N = 3, C = 40, n = N * C * s;
    size_t es = io16 ? 2 : 4, bytes = (size_t)n * es;
    void *hx = cl_rand(n, io16, true), *ha = cl_rand(n, io16, true), *hdy = cl_rand(n, io16, true);
    void *t[3] = {malloc(bytes), malloc(bytes), malloc(bytes)};
    cl_turn(hx, t[0], es, N, C, s);
    cl_turn(ha, t[1], es, N, C, s);
    cl_turn(hdy, t[2], es, N, C, s);
    float hg[40], hbt[40];
    for (int i = 0; i < 40; i++) hg[i] = 1.0f + 0.5f * frand(), hbt[i] = 0.3f * frand();
    float *gm = cl_put(g, hg, sizeof hg), *bt = cl_put(g, hbt, sizeof hbt);
    void *x[2] = {cl_put(g, hx, bytes), cl_put(g, t[0], bytes)};
    void *ad[2] = {cl_put(g, ha, bytes), cl_put(g, t[1], bytes)};
    void *dy[2] = {cl_put(g, hdy, bytes), cl_put(g, t[2], bytes)};
    void *y[2], *dx[2];
    float *mv[2], *dgb[2];
    for (int l = 0; l < 2; l++) {
        gp_bn_desc d = {.n = N, .c = C, .s = s, .eps = 1e-5f, .blk = l ? C : 0, .relu = true};
        y[l] = cl_put(g, NULL, bytes);
        dx[l] = cl_put(g, NULL, bytes);
        mv[l] = cl_put(g, NULL, 2 * sizeof hg);
        dgb[l] = cl_put(g, NULL, 2 * sizeof hg);
        gp_bn_desc f = d;
        if (io16) {
            f.add16 = ad[l];
            CHECK_OK(gp_dev_bn_fwd_train_bf16(g, &f, x[l], gm, bt, y[l], mv[l], mv[l] + C));
            CHECK_OK(gp_dev_bn_bwd_bf16(g, &d, x[l], gm, bt, mv[l], mv[l] + C, dy[l], dx[l],
                                        dgb[l], dgb[l] + C));
        } else {
            f.add = ad[l];
            CHECK_OK(gp_dev_bn_fwd_train(g, &f, x[l], gm, bt, y[l], mv[l], mv[l] + C));
            CHECK_OK(gp_dev_bn_bwd(g, &d, x[l], gm, bt, mv[l], mv[l] + C, dy[l], dx[l], dgb[l],
                                   dgb[l] + C));
        }
    }
    bool same = io16 || s >= 64;
    char what[128];
    snprintf(what, sizeof what, "batch norm s%lld, %s storage", (long long)s,
             io16 ? "bf16" : "FP32");
    void *hy[2] = {cl_get(g, y[0], bytes), cl_get(g, y[1], bytes)};
    void *hdx[2] = {cl_get(g, dx[0], bytes), cl_get(g, dx[1], bytes)};
    float *hmv[2] = {cl_get(g, mv[0], 2 * sizeof hg), cl_get(g, mv[1], 2 * sizeof hg)};
    float *hgb[2] = {cl_get(g, dgb[0], 2 * sizeof hg), cl_get(g, dgb[1], 2 * sizeof hg)};
    double e1 = 0, e2 = 0;
    for (int i = 0; i < 80; i++) {
        e1 = fmax(e1, fabs(hmv[0][i] - hmv[1][i]) / (1 + fabs(hmv[0][i])));
        e2 = fmax(e2, fabs(hgb[0][i] - hgb[1][i]) / (1 + fabs(hgb[0][i])));
    }
    CHECK_MSG(same ? e1 == 0 && e2 == 0 : e1 <= 1e-5 && e2 <= 1e-4,
              "%s: channels-last mean / var %.3g, dgamma / dbeta %.3g from plain", what, e1, e2);
    strncat(what, " y", sizeof what - strlen(what) - 1);
    cl_check(what, hy[0], hy[1], io16, N, C, s, same ? 0 : 1e-5);
    what[strlen(what) - 1] = '\0';
    strncat(what, "dx", sizeof what - strlen(what) - 1);
    cl_check(what, hdx[0], hdx[1], io16, N, C, s, same ? 0 : 1e-4);
    void *hs[] = {hx, ha, hdy, t[0], t[1], t[2], hy[0], hy[1], hdx[0], hdx[1], hmv[0], hmv[1],
                  hgb[0], hgb[1]};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
    for (int l = 0; l < 2; l++) {
        void *ps[] = {x[l], ad[l], dy[l], y[l], dx[l]};
        for (int i = 0; i < 5; i++) gp_dev_free(g, ps[i], bytes, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, mv[l], 2 * sizeof hg, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, dgb[l], 2 * sizeof hg, GP_MEM_ACTIVATIONS);
    }
    gp_dev_free(g, gm, sizeof hg, GP_MEM_ACTIVATIONS);
    gp_dev_free(g, bt, sizeof hbt, GP_MEM_ACTIVATIONS);
}

/* Pooling over 24 channels of 9x9: kind, window ker, stride, padding;
 * glob: the global average that ends a chain (y plain, plain_out; ker,
 * stride and pad unused).  On bf16 storage gpipe's kernels run both
 * layouts (the bits); on FP32 plain runs cuDNN's: a max's forward is
 * exact, sums may round apart, and a max window's tie could route its
 * gradient elsewhere (FP32 values unrounded: no ties in practice). */
static void cl_pool(gp_device *g, bool io16, gp_pool_kind kind, int64_t ker, int64_t stride,
                    int64_t pad, bool glob)
{
    const int64_t N = 2, C = 24, H = 9, W = 9;
    gp_pool_desc d0 = {N, C, H, W, H, W, 1, 1, 0, 0, 1, 1, GP_POOL_AVG, 0, false};
    if (!glob)
        d0 = (gp_pool_desc){N, C, H, W, ker, ker, stride, stride, pad, pad,
                            (H + 2 * pad - ker) / stride + 1, (W + 2 * pad - ker) / stride + 1,
                            kind, 0, false};
    gp_pool_desc d1 = d0;
    d1.blk = C;
    d1.plain_out = glob;
    const int64_t px = H * W, po = d0.oh * d0.ow, nx = N * C * px, ny = N * C * po;
    size_t es = io16 ? 2 : 4, bx = (size_t)nx * es, by = (size_t)ny * es;
    void *hx = cl_rand(nx, io16, false), *hdy = cl_rand(ny, io16, false), *hxt = malloc(bx),
         *hdyt = malloc(by);
    cl_turn(hx, hxt, es, N, C, px);
    cl_turn(hdy, hdyt, es, N, C, po);
    if (glob) memcpy(hdyt, hdy, by); /* y and dy plain both ways */
    void *x[2] = {cl_put(g, hx, bx), cl_put(g, hxt, bx)};
    void *dy[2] = {cl_put(g, hdy, by), cl_put(g, hdyt, by)};
    void *y[2], *dx[2];
    for (int l = 0; l < 2; l++) {
        const gp_pool_desc *d = l ? &d1 : &d0;
        y[l] = cl_put(g, NULL, by);
        dx[l] = cl_put(g, NULL, bx);
        if (io16) {
            CHECK_OK(gp_dev_pool_fwd_bf16(g, d, x[l], y[l], NULL));
            CHECK_OK(gp_dev_pool_bwd_bf16(g, d, x[l], y[l], dy[l], dx[l], NULL));
        } else {
            CHECK_OK(gp_dev_pool_fwd(g, d, x[l], y[l], NULL));
            CHECK_OK(gp_dev_pool_bwd(g, d, x[l], y[l], dy[l], dx[l], NULL));
        }
    }
    char what[128];
    snprintf(what, sizeof what, "%s pool %lld/%lld/%lld, %s storage",
             glob ? "global average" : kind == GP_POOL_MAX ? "max" : "average", (long long)ker,
             (long long)stride, (long long)pad, io16 ? "bf16" : "FP32");
    void *hy[2] = {cl_get(g, y[0], by), cl_get(g, y[1], by)};
    void *hdx[2] = {cl_get(g, dx[0], bx), cl_get(g, dx[1], bx)};
    bool exact = io16 || (kind == GP_POOL_MAX && ker <= stride);
    if (glob) { /* y plain both ways */
        double e = 0;
        for (int64_t i = 0; i < ny; i++)
            e = fmax(e, fabs(cl_val(hy[0], io16, i) - cl_val(hy[1], io16, i)));
        CHECK_MSG(io16 ? memcmp(hy[0], hy[1], by) == 0 : e <= 1e-6,
                  "%s: plain_out y %.3g from plain", what, e);
    } else {
        cl_check(what, hy[0], hy[1], io16, N, C, po, io16 || kind == GP_POOL_MAX ? 0 : 1e-6);
    }
    strncat(what, " backward", sizeof what - strlen(what) - 1);
    cl_check(what, hdx[0], hdx[1], io16, N, C, px, exact ? 0 : 1e-6);
    void *hs[] = {hx, hdy, hxt, hdyt, hy[0], hy[1], hdx[0], hdx[1]};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
    for (int l = 0; l < 2; l++) {
        gp_dev_free(g, x[l], bx, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, dy[l], by, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, y[l], by, GP_MEM_ACTIVATIONS);
        gp_dev_free(g, dx[l], bx, GP_MEM_ACTIVATIONS);
    }
}

static void test_channels_last(gp_device *cpu)
{
    gp_device_opts o = {.precision = GP_PRECISION_BF16, .deterministic = true};
    gp_device *g = NULL;
    CHECK_OK(gp_device_open("cuda:0", &o, &g));
    if (!g) return;
    gp_device_bind_thread(g);
    for (int io16 = 0; io16 < 2; io16++) {
        cl_conv(g, cpu, io16, true);
        cl_bn(g, io16, 81); /* 9x9: the plane kernels */
        cl_bn(g, io16, 16); /* 4x4: the channel kernels */
        cl_pool(g, io16, GP_POOL_MAX, 3, 2, 1, false);
        cl_pool(g, io16, GP_POOL_MAX, 2, 2, 0, false);
        cl_pool(g, io16, GP_POOL_AVG, 3, 1, 1, false);
        cl_pool(g, io16, GP_POOL_AVG, 0, 0, 0, true);
    }
    /* a nChw16c block is the CPU's, not a GPU's layout */
    gp_bn_desc bad = {.n = 2, .c = 32, .s = 64, .eps = 1e-5f, .blk = 16};
    const int64_t n = 2 * 32 * 64;
    float *p = cl_put(g, NULL, (size_t)(2 * n + 64) * 4); /* x, y, mean, var */
    gp_status s = gp_dev_bn_fwd_train(g, &bad, p, NULL, NULL, p + n, p + 2 * n, p + 2 * n + 32);
    CHECK_MSG(s == GP_ERR_INVALID && strstr(gp_last_error(), "channels-last"),
              "batch norm in nChw16c on a GPU: %s (%s)", gp_status_name(s), gp_last_error());
    gp_error_clear();
    /* and a convolution given one, likewise */
    const gp_conv_desc cb = {.n = 2, .c = 32, .h = 8, .w = 8, .k = 32, .kh = 1, .kw = 1, .sh = 1,
                             .sw = 1, .oh = 8, .ow = 8, .xblk = 16};
    s = gp_dev_conv_fwd(g, &cb, p, p, NULL, p + n); /* (weights within x: refused first) */
    CHECK_MSG(s == GP_ERR_INVALID && strstr(gp_last_error(), "channels-last"),
              "a convolution in nChw16c on a GPU: %s (%s)", gp_status_name(s), gp_last_error());
    gp_error_clear();
    gp_dev_free(g, p, (size_t)(2 * n + 64) * 4, GP_MEM_ACTIVATIONS);
    gp_device_close(g);
    /* GPIPE_CUDA_NHWC=chains: a plain call runs NCHW, a channels-last one
     * NHWC; and =0 says plain to the layers */
    setenv("GPIPE_CUDA_NHWC", "chains", 1);
    CHECK_OK(gp_device_open("cuda:0", &o, &g));
    setenv("GPIPE_CUDA_NHWC", "0", 1);
    gp_device *off = NULL;
    CHECK_OK(gp_device_open("cuda:0", &o, &off));
    unsetenv("GPIPE_CUDA_NHWC");
    if (g) {
        gp_device_bind_thread(g);
        for (int io16 = 0; io16 < 2; io16++) cl_conv(g, cpu, io16, false);
        gp_device_close(g);
    }
    if (off) {
        const gp_conv_desc d = {.n = 2, .c = 16, .h = 8, .w = 8, .k = 24, .kh = 3, .kw = 3,
                                .sh = 1, .sw = 1, .ph = 1, .pw = 1, .oh = 8, .ow = 8};
        CHECK_MSG(gp_dev_act_block(off, &d, true) == 0, "GPIPE_CUDA_NHWC=0: act_block %lld",
                  (long long)gp_dev_act_block(off, &d, true));
        gp_device_close(off);
    }
}

static void test_bf16_ops(gp_device *cpu, const char *graph)
{
    if (graph) setenv("GPIPE_CUDNN_GRAPH", graph, 1);
    gp_device_opts o = {.precision = GP_PRECISION_BF16};
    gp_device *g = NULL;
    gp_status st = gp_device_open("cuda:0", &o, &g);
    if (graph) unsetenv("GPIPE_CUDNN_GRAPH");
    if (st != GP_OK) {
        CHECK_MSG(st == GP_ERR_UNSUPPORTED && strstr(gp_last_error(), "sm_") &&
                      strstr(gp_last_error(), "fp32"),
                  "opening cuda:0 in bf16: %s", gp_last_error());
        printf("test_cuda: bf16 SKIPPED, this GPU has no bf16 tensor cores: %s\n",
               gp_last_error());
        gp_error_clear();
        return;
    }
    CHECK(g->precision == GP_PRECISION_BF16);
    gp_device *keep[2] = {D2[0], D2[1]};
    D2[0] = cpu;
    D2[1] = g;
    gp_device_bind_thread(g);
    char what[160];
    const char *tag = graph ? " (graph API forced)" : "";
    for (int ta = 0; ta < 2 && !graph; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int64_t k = 8; k <= 256; k += 248) { /* 8: FP32; 256: bf16 */
                const int64_t m = 64, n = 48;
                int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
                int64_t lda = ac + 3, ldb = bc + 2, ldc = n + 5;
                buf a = brand_bf16(ar * lda, false), b = brand_bf16(br * ldb, false);
                buf c = bjunk(m * ldc);
                CHECK_OK(gp_dev_gemm(g, ta, tb, m, n, k, 0.5f, a.p[1], lda, b.p[1], ldb, 0.0f,
                                     c.p[1], ldc));
                float *ha = malloc((size_t)(ar * lda) * sizeof(float));
                float *hb = malloc((size_t)(br * ldb) * sizeof(float));
                float *hc = malloc((size_t)(m * ldc) * sizeof(float));
                CHECK_OK(gp_dev_download(g, ha, a.p[1], ar * lda));
                CHECK_OK(gp_dev_download(g, hb, b.p[1], br * ldb));
                CHECK_OK(gp_dev_download(g, hc, c.p[1], m * ldc));
                CHECK_OK(gp_dev_synchronize(g));
                bool worth = gp_bf16_gemm_worth(m, n, k);
                double err = 0, off = 0, big = 0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double r = 0, u = 0;
                        for (int64_t q = 0; q < k; q++) {
                            float av = ta ? ha[q * lda + i] : ha[i * lda + q];
                            float bv = tb ? hb[j * ldb + q] : hb[q * ldb + j];
                            r += (double)bf16_round(av) * bf16_round(bv);
                            u += (double)av * bv;
                        }
                        r *= 0.5;
                        u *= 0.5;
                        double want = worth ? r : u;
                        err = fmax(err, fabs(hc[i * ldc + j] - want));
                        off = fmax(off, fabs(u - r));
                        big = fmax(big, fabs(want));
                    }
                double tol = 2e-5 * (1 + big);
                snprintf(what, sizeof what, "bf16 gemm ta=%d tb=%d k=%lld (%s)", ta, tb,
                         (long long)k, worth ? "bf16 operands" : "FP32");
                CHECK_MSG(err <= tol, "%s: max error %.3g against the product of the %s "
                          "operands, tol %.3g", what, err, worth ? "rounded" : "given", tol);
                if (worth)
                    CHECK_MSG(off >= 4 * tol, "%s: the rounded and unrounded products differ "
                              "by only %.3g: the check cannot tell them apart", what, off);
                free(ha); free(hb); free(hc);
                bfree(&a); bfree(&b); bfree(&c);
            }
    gp_conv_desc d = {4, 32, 14, 14, 24, 3, 3, 1, 1, 1, 1, 14, 14, 1, 0, 0};
    int64_t nx = 4 * 32 * 14 * 14, nw = 24 * 32 * 9, ny = 4 * 24 * 14 * 14;
    for (int rounded = 1; rounded >= 0; rounded--) {
        /* the CPU computes on the rounded values; the GPU on the same or on
         * the unrounded ones it must round itself */
        buf x = brand_bf16(nx, true), w = brand_bf16(nw, true), dy = brand_bf16(ny, true);
        buf bb = brand(24, -1, 1), y = bjunk(ny), dx = bjunk(nx), dw = brand(nw, -1, 1),
            db = brand(24, -1, 1);
        if (!rounded) { /* the GPU's copies perturbed below bf16's last bit */
            buf *t[3] = {&x, &w, &dy};
            for (int q = 0; q < 3; q++) {
                float *h = malloc((size_t)t[q]->n * sizeof(float));
                CHECK_OK(gp_dev_download(g, h, t[q]->p[1], t[q]->n));
                CHECK_OK(gp_dev_synchronize(g));
                for (int64_t i = 0; i < t[q]->n; i++) h[i] *= 1.0f + 0x1p-10f * frand();
                CHECK_OK(gp_dev_upload(g, t[q]->p[1], h, t[q]->n));
                free(h);
            }
        }
        for (int rep = 0; rep < 2; rep++) {
            const char *r = rounded ? "rounded" : "unrounded";
            BOTH(gp_dev_conv_fwd(D, &d, x.p[K], w.p[K], bb.p[K], y.p[K]));
            snprintf(what, sizeof what, "bf16 conv fwd, %s operands, call %d%s", r, rep + 1, tag);
            bcheck(what, &y, 4e-3);
            BOTH(gp_dev_conv_bwd_data(D, &d, w.p[K], dy.p[K], dx.p[K]));
            snprintf(what, sizeof what, "bf16 conv bwd_data, %s operands, call %d%s", r, rep + 1,
                     tag);
            bcheck(what, &dx, 4e-3);
            BOTH(gp_dev_conv_bwd_weights(D, &d, x.p[K], dy.p[K], dw.p[K], db.p[K]));
            snprintf(what, sizeof what, "bf16 conv bwd_weights dw +=, %s operands, call %d%s", r,
                     rep + 1, tag);
            bcheck(what, &dw, 4e-3);
            /* db sums dy in FP32 (the CPU's bf16 kernels its bf16 copy) */
            snprintf(what, sizeof what, "bf16 conv bwd_weights db +=, %s, call %d%s", r, rep + 1,
                     tag);
            bcheck(what, &db, rounded ? 1e-4 : 4e-3);
        }
        bfree(&x); bfree(&w); bfree(&dy); bfree(&bb); bfree(&y); bfree(&dx); bfree(&dw);
        bfree(&db);
    }
    /* Both devices given the same unrounded operands: the CPU computes FP32,
     * the GPU rounds them to bf16, so every direction differs by more than
     * FP32's 1e-4 (the convolutions ran in bf16) and by less than 2e-2 */
    {
        buf x = brand(nx, -1, 1), w = brand(nw, -1, 1), dy = brand(ny, -1, 1);
        buf bb = brand(24, -1, 1), y = bjunk(ny), dx = bjunk(nx), dw = brand(nw, -1, 1),
            db = brand(24, -1, 1);
        BOTH(gp_dev_conv_fwd(D, &d, x.p[K], w.p[K], bb.p[K], y.p[K]));
        BOTH(gp_dev_conv_bwd_data(D, &d, w.p[K], dy.p[K], dx.p[K]));
        BOTH(gp_dev_conv_bwd_weights(D, &d, x.p[K], dy.p[K], dw.p[K], db.p[K]));
        const buf *out[3] = {&y, &dx, &dw};
        static const char *const dir[3] = {"fwd", "bwd_data", "bwd_weights"};
        for (int q = 0; q < 3; q++) {
            double e = bdiff(out[q]);
            CHECK_MSG(e > 1e-4 && e < 2e-2, "bf16 conv %s%s on unrounded operands: %.3g x (1 + "
                      "max) from the CPU's FP32, want between 1e-4 (bf16 ran) and 2e-2",
                      dir[q], tag, e);
        }
        bfree(&x); bfree(&w); bfree(&dy); bfree(&bb); bfree(&y); bfree(&dx); bfree(&dw);
        bfree(&db);
    }
    /* Causal attention under bf16 (cuda_sdpa.c): on Hopper (sm_90) cuDNN's
     * fused scaled-dot-product attention runs both directions, on operands
     * and probabilities rounded to bf16, so each differs from the CPU's
     * FP32 by more than FP32 would (1e-4) and less than 2e-2; its backward
     * repeats bit for bit; the saved log-sum-exp is FP32 either way.  t =
     * 200 is not a multiple of any tile; d = 64 as in GPT-2. */
    {
        const int64_t ab = 2, at = 200, ah = 2, ac = 128;
        buf ax = brand(ab * at * 3 * ac, -2, 2), ady = brand(ab * at * ac, -1, 1);
        buf ay = bjunk(ab * at * ac), al = bjunk(ab * ah * at), adx = bjunk(ab * at * 3 * ac);
        uint64_t fused = g->attn_fused;
        BOTH(gp_dev_attn_fwd(D, ax.p[K], ay.p[K], al.p[K], ab, at, ah, ah, ac));
        BOTH(gp_dev_attn_bwd(D, ax.p[K], ay.p[K], al.p[K], ady.p[K], adx.p[K], ab, at, ah, ah,
                             ac));
        uint64_t ran = g->attn_fused - fused;
        const buf *out[3] = {&ay, &al, &adx};
        static const char *const nm[3] = {"y", "lse", "dx"};
        for (int q = 0; q < 3; q++) {
            double e = bdiff(out[q]);
            double lo = ran == 2 && q != 1 ? 1e-4 : 0; /* lse: FP32 sums of rounded q, k */
            CHECK_MSG(e >= lo && e < 2e-2, "bf16 attention %s%s (%s): %.3g x (1 + max) from "
                      "the CPU's FP32, want in [%.0g, 2e-2)", nm[q], tag,
                      ran ? "cuDNN fused" : "own kernel", e, lo);
        }
        if (g->arch / 10 == 9) /* Hopper: where cuda_sdpa.c takes it */
            CHECK_MSG(ran == 2, "bf16 attention on sm_%d: cuDNN's fused SDPA ran %llu of 2 "
                      "calls (the log's warning says why)", g->arch, (unsigned long long)ran);
        /* the backward again, into a second buffer: the same bits */
        buf adx2 = bjunk(ab * at * 3 * ac);
        CHECK_OK(gp_dev_attn_bwd(g, ax.p[1], ay.p[1], al.p[1], ady.p[1], adx2.p[1], ab, at, ah,
                                 ah, ac));
        size_t bytes = (size_t)adx.n * sizeof(float);
        float *h1 = malloc(bytes), *h2 = malloc(bytes);
        CHECK_OK(gp_dev_download(g, h1, adx.p[1], adx.n));
        CHECK_OK(gp_dev_download(g, h2, adx2.p[1], adx.n));
        CHECK_OK(gp_dev_synchronize(g));
        CHECK_MSG(memcmp(h1, h2, bytes) == 0,
                  "bf16 attention backward%s: two calls on the same operands differ", tag);
        free(h1);
        free(h2);
        bfree(&adx2);
        bfree(&ax); bfree(&ady); bfree(&ay); bfree(&al); bfree(&adx);
    }
    /* Weights kept in bf16 while frozen (gp_cuda_weights_bf16): a linear
     * layer's forward and backward-data products and a convolution give
     * frozen the bits they give unfrozen, each weight is rounded once for
     * all the calls of a freeze, and the next freeze, after the weights
     * changed, rounds the new ones. */
    {
        const int64_t n = 64, in = 256, out = 96;
        CHECK(gp_bf16_gemm_worth(n, out, in) && gp_bf16_gemm_worth(n, in, out));
        buf x = brand(n * in, -1, 1), w = brand(out * in, -1, 1), bias = brand(out, -1, 1);
        buf dy = brand(n * out, -1, 1), y0 = bjunk(n * out), y1 = bjunk(n * out);
        buf dx0 = bjunk(n * in), dx1 = bjunk(n * in);
        buf cx = brand(nx, -1, 1), cw = brand(nw, -1, 1), cb = brand(24, -1, 1);
        buf cy0 = bjunk(ny), cy1 = bjunk(ny);
        for (int epoch = 0; epoch < 2; epoch++) {
            if (epoch) { /* the weights change between steps */
                CHECK_OK(gp_dev_scale(g, w.p[1], 1.5f, w.n));
                CHECK_OK(gp_dev_scale(g, cw.p[1], -0.75f, cw.n));
            }
            CHECK_OK(gp_dev_linear_fwd(g, n, out, in, x.p[1], w.p[1], bias.p[1], false, y0.p[1]));
            CHECK_OK(gp_dev_gemm_wb(g, 0, 0, n, in, out, 1.0f, dy.p[1], out, w.p[1], in, 0.0f,
                                    dx0.p[1], in));
            CHECK_OK(gp_dev_conv_fwd(g, &d, cx.p[1], cw.p[1], cb.p[1], cy0.p[1]));
            uint64_t kept = g->weights_kept;
            CHECK_OK(gp_dev_freeze_weights(g, true));
            for (int rep = 0; rep < 2; rep++) {
                CHECK_OK(gp_dev_linear_fwd(g, n, out, in, x.p[1], w.p[1], bias.p[1], false,
                                           y1.p[1]));
                CHECK_OK(gp_dev_gemm_wb(g, 0, 0, n, in, out, 1.0f, dy.p[1], out, w.p[1], in,
                                        0.0f, dx1.p[1], in));
                CHECK_OK(gp_dev_conv_fwd(g, &d, cx.p[1], cw.p[1], cb.p[1], cy1.p[1]));
            }
            unsigned long long made = (unsigned long long)(g->weights_kept - kept);
            CHECK_MSG(made == 2, "bf16 weights kept in freeze %d: %llu copies for 2 weights",
                      epoch + 1, made);
            CHECK_OK(gp_dev_freeze_weights(g, false));
            CHECK_MSG(bsame(y0.p[1], y1.p[1], y0.n) && bsame(dx0.p[1], dx1.p[1], dx0.n) &&
                          bsame(cy0.p[1], cy1.p[1], cy0.n),
                      "bf16 products with kept weights (freeze %d) differ from packed ones",
                      epoch + 1);
        }
        /* The update writes the linear weight's mirror (gp_update_part.w16,
         * gp_dev_mirror_for_update) and checks its new values (nonfinite,
         * left 0): the next freeze rounds only the convolution's weight,
         * which nothing but the update would have kept current, reads the
         * update's mirror (under GPIPE_CHECK_MIRRORS compared with its
         * master's rounding), and its products give the bits of the new
         * weights packed per call. */
        buf gw = brand(out * in, -1, 1), flag = bjunk(1);
        CHECK_OK(gp_dev_fill(g, flag.p[1], 0.0f, 1));
        uint16_t *w16 = gp_dev_mirror_for_update(g, w.p[1], w.n);
        CHECK_MSG(w16 != NULL, "no bf16 mirror of the linear weight after its freezes");
        gp_update_part part = {.w = w.p[1], .g = gw.p[1], .n = w.n, .w16 = w16,
                               .nonfinite = flag.p[1]};
        CHECK_OK(gp_dev_sgd_multi(g, &part, 1, 0.1f, 0.0f, 0));
        CHECK_OK(gp_dev_linear_fwd(g, n, out, in, x.p[1], w.p[1], bias.p[1], false, y0.p[1]));
        CHECK_OK(gp_dev_gemm_wb(g, 0, 0, n, in, out, 1.0f, dy.p[1], out, w.p[1], in, 0.0f,
                                dx0.p[1], in));
        uint64_t kept = g->weights_kept, by = g->mirrors_by_update;
        CHECK_OK(gp_dev_freeze_weights(g, true));
        CHECK_OK(gp_dev_linear_fwd(g, n, out, in, x.p[1], w.p[1], bias.p[1], false, y1.p[1]));
        CHECK_OK(gp_dev_gemm_wb(g, 0, 0, n, in, out, 1.0f, dy.p[1], out, w.p[1], in, 0.0f,
                                dx1.p[1], in));
        CHECK_OK(gp_dev_conv_fwd(g, &d, cx.p[1], cw.p[1], cb.p[1], cy1.p[1]));
        unsigned long long made = (unsigned long long)(g->weights_kept - kept),
                           served = (unsigned long long)(g->mirrors_by_update - by);
        CHECK_OK(gp_dev_freeze_weights(g, false));
        CHECK_MSG(made == 1 && served == 2, "after the update: %llu weights rounded (want the "
                  "convolution's 1), %llu uses of the update's mirror (want 2)", made, served);
        CHECK_MSG(bsame(y0.p[1], y1.p[1], y0.n) && bsame(dx0.p[1], dx1.p[1], dx0.n),
                  "bf16 products on the update's mirror differ from packed ones");
        float hflag = -1.0f;
        CHECK_OK(gp_dev_download(g, &hflag, flag.p[1], 1));
        CHECK_OK(gp_dev_synchronize(g));
        CHECK_MSG(hflag == 0.0f, "the update flagged finite weights (%g)", (double)hflag);
        bfree(&gw);
        bfree(&flag);
        bfree(&x); bfree(&w); bfree(&bias); bfree(&dy); bfree(&y0); bfree(&y1); bfree(&dx0);
        bfree(&dx1); bfree(&cx); bfree(&cw); bfree(&cb); bfree(&cy0); bfree(&cy1);
    }
    /* Activations on bf16 storage (act_bf16), on random 16-bit patterns
     * (NaNs, infinities and subnormals among them): for every kind the
     * bits of the GPU's FP32 kernel on the widened values rounded once
     * (what the storage adapter gives), and for relu and leaky relu the
     * CPU's bits. */
    {
        enum { AN = 8192 }; /* bf16 values: AN / 2 floats' room */
        buf bx = brand(AN / 2, -1, 1), bdy = brand(AN / 2, -1, 1), bo = bjunk(AN / 2);
        buf bo2 = bjunk(AN / 2), wx = bjunk(AN), wdy = bjunk(AN), wy = bjunk(AN);
        CHECK(gp_dev_act_bf16_has(g, GP_ACT_GELU));
        for (int kind = 0; kind < GP_ACT_COUNT; kind++)
            for (int bwd = 0; bwd < 2; bwd++) {
                gp_act_kind k = (gp_act_kind)kind;
                float slope = k == GP_ACT_LEAKY_RELU ? 0.2f : 0.0f;
                uint16_t *x1 = (uint16_t *)bx.p[1], *dy1 = bwd ? (uint16_t *)bdy.p[1] : NULL;
                CHECK_OK(gp_dev_act_bf16(g, k, x1, dy1, (uint16_t *)bo.p[1], AN, slope));
                CHECK_OK(gp_dev_bf16_unpack(g, wx.p[1], x1, AN));
                CHECK_OK(gp_dev_bf16_unpack(g, wdy.p[1], (uint16_t *)bdy.p[1], AN));
                if (k == GP_ACT_RELU)
                    CHECK_OK(bwd ? gp_dev_relu_bwd(g, wx.p[1], wdy.p[1], wy.p[1], AN)
                                 : gp_dev_relu_fwd(g, wx.p[1], wy.p[1], AN));
                else if (k == GP_ACT_LEAKY_RELU)
                    CHECK_OK(bwd ? gp_dev_leaky_relu_bwd(g, wx.p[1], wdy.p[1], wy.p[1], AN, slope)
                                 : gp_dev_leaky_relu_fwd(g, wx.p[1], wy.p[1], AN, slope));
                else
                    CHECK_OK(bwd ? gp_dev_gelu_bwd(g, wx.p[1], wdy.p[1], wy.p[1], AN)
                                 : gp_dev_gelu_fwd(g, wx.p[1], wy.p[1], AN));
                CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)bo2.p[1], wy.p[1], AN));
                CHECK_MSG(bsame(bo.p[1], bo2.p[1], AN / 2), "bf16 activation %d %s on the GPU: "
                          "not its FP32 kernel's values rounded", kind, bwd ? "bwd" : "fwd");
                if (k == GP_ACT_GELU) continue; /* the CPU's GELU is oneDNN's, via the adapter */
                CHECK_OK(gp_dev_act_bf16(cpu, k, (uint16_t *)bx.p[0],
                                         bwd ? (uint16_t *)bdy.p[0] : NULL, (uint16_t *)bo.p[0],
                                         AN, slope));
                float *h[2] = {malloc(AN * 2), malloc(AN * 2)};
                CHECK_OK(gp_dev_download(cpu, h[0], bo.p[0], AN / 2));
                CHECK_OK(gp_dev_download(g, h[1], bo.p[1], AN / 2));
                CHECK_OK(gp_dev_synchronize(g));
                int bad = 0, at = -1;
                const uint16_t *hc = (const uint16_t *)h[0], *hg = (const uint16_t *)h[1];
                for (int i = 0; i < AN; i++)
                    if (hc[i] != hg[i] && bad++ == 0) at = i;
                uint16_t hx = 0, hdy = 0, vc = at >= 0 ? hc[at] : 0, vg = at >= 0 ? hg[at] : 0;
                if (at >= 0) {
                    CHECK_OK(gp_dev_download(cpu, h[0], bx.p[0], AN / 2));
                    CHECK_OK(gp_dev_download(cpu, h[1], bdy.p[0], AN / 2));
                    hx = ((const uint16_t *)h[0])[at];
                    hdy = ((const uint16_t *)h[1])[at];
                }
                CHECK_MSG(bad == 0, "bf16 activation %d %s: the GPU's bits differ from the "
                          "CPU's in %d of %d values, first at %d (x 0x%04x, dy 0x%04x: CPU "
                          "0x%04x, GPU 0x%04x)", kind, bwd ? "bwd" : "fwd", bad, AN, at, hx,
                          hdy, vc, vg);
                free(h[0]);
                free(h[1]);
            }
        bfree(&bx); bfree(&bdy); bfree(&bo); bfree(&bo2); bfree(&wx); bfree(&wdy); bfree(&wy);
    }
    /* Attention on bf16 storage (attn_fwd_bf16 / attn_bwd_bf16): the bits
     * of the FP32 slots on the widened operands rounded (the storage
     * adapter's), with cuDNN's fused attention taking the bf16 operands as
     * they are on Hopper (sm_90). */
    {
        const int64_t ab = 2, at = 200, ah = 2, ac = 128;
        const int64_t qx = ab * at * 3 * ac, qy = ab * at * ac, nl = ab * ah * at;
        buf fx = brand(qx, -2, 2), fdy = brand(qy, -1, 1), fy = bjunk(qy), fdx = bjunk(qx);
        buf xb = bjunk(qx / 2), dyb = bjunk(qy / 2), yb = bjunk(qy / 2), dxb = bjunk(qx / 2);
        buf yb2 = bjunk(qy / 2), dxb2 = bjunk(qx / 2), l1 = bjunk(nl), l2 = bjunk(nl);
        uint16_t *X = (uint16_t *)xb.p[1], *DY = (uint16_t *)dyb.p[1], *Y = (uint16_t *)yb.p[1];
        /* the operands in bf16, and their widened values as the FP32 inputs */
        CHECK_OK(gp_dev_bf16_pack(g, X, fx.p[1], qx));
        CHECK_OK(gp_dev_bf16_pack(g, DY, fdy.p[1], qy));
        CHECK_OK(gp_dev_bf16_unpack(g, fx.p[1], X, qx));
        CHECK_OK(gp_dev_bf16_unpack(g, fdy.p[1], DY, qy));
        uint64_t fused = g->attn_fused;
        CHECK(gp_dev_attn_bf16_has(g));
        CHECK_OK(gp_dev_attn_fwd_bf16(g, X, Y, l1.p[1], ab, at, ah, ah, ac));
        CHECK_OK(gp_dev_attn_bwd_bf16(g, X, Y, l1.p[1], DY, (uint16_t *)dxb.p[1], ab, at, ah,
                                      ah, ac));
        uint64_t ran = g->attn_fused - fused;
        /* the adapter's way: FP32 slots on the widened values, rounded */
        CHECK_OK(gp_dev_attn_fwd(g, fx.p[1], fy.p[1], l2.p[1], ab, at, ah, ah, ac));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)yb2.p[1], fy.p[1], qy));
        CHECK_OK(gp_dev_bf16_unpack(g, fy.p[1], (uint16_t *)yb2.p[1], qy)); /* y as stored */
        CHECK_OK(gp_dev_attn_bwd(g, fx.p[1], fy.p[1], l2.p[1], fdy.p[1], fdx.p[1], ab, at, ah,
                                 ah, ac));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)dxb2.p[1], fdx.p[1], qx));
        CHECK_MSG(bsame(yb.p[1], yb2.p[1], qy / 2) && bsame(l1.p[1], l2.p[1], nl),
                  "bf16 attention forward (%s): not the FP32 slot's rounded",
                  ran ? "cuDNN fused" : "own kernel");
        CHECK_MSG(bsame(dxb.p[1], dxb2.p[1], qx / 2), "bf16 attention backward (%s): not the "
                  "FP32 slot's rounded", ran ? "cuDNN fused" : "own kernel");
        if (g->arch / 10 == 9) /* Hopper: where cuda_sdpa.c takes it */
            CHECK_MSG(ran == 2, "bf16 attention on bf16 storage, sm_%d: the fused path ran %llu "
                      "of 2 calls", g->arch, (unsigned long long)ran);
        bfree(&fx); bfree(&fdy); bfree(&fy); bfree(&fdx); bfree(&xb); bfree(&dyb); bfree(&yb);
        bfree(&dxb); bfree(&yb2); bfree(&dxb2); bfree(&l1); bfree(&l2);
    }
    /* Batch norm on bf16 storage (bn_*_bf16): against the storage
     * adapter's way on the GPU (x and dy widened, the FP32 slots, y and dx
     * rounded).  Planes of 64+ values run the same plane kernels either
     * way: the same bits, statistics and parameter gradients included;
     * narrower ones run the channel kernels where FP32 runs cuDNN's: within
     * a bf16 unit of the output.  And the CPU's bf16 norm within the same. */
    for (int shape = 0; shape < 2; shape++)
        for (int relu = 0; relu < 2; relu++) {
            const gp_bn_desc bd = {.n = 4, .c = 6, .s = shape ? 49 : 100, .eps = 1e-5f,
                                   .relu = relu != 0};
            const int64_t nv = bd.n * bd.c * bd.s, C = bd.c; /* nv even */
            buf fx = brand(nv, -2, 2), fdy = brand(nv, -1, 1), gm = brand(C, 0.5f, 1.5f),
                bt = brand(C, -0.5f, 0.5f);
            buf xb = bjunk(nv / 2), dyb = bjunk(nv / 2), yb = bjunk(nv / 2), dxb = bjunk(nv / 2);
            buf yb2 = bjunk(nv / 2), dxb2 = bjunk(nv / 2), fy = bjunk(nv), fdx = bjunk(nv);
            buf st1 = bjunk(2 * C), st2 = bjunk(2 * C), pg1 = bnew(2 * C), pg2 = bnew(2 * C);
            BOTH(gp_dev_bf16_pack(D, (uint16_t *)xb.p[K], fx.p[K], nv));
            BOTH(gp_dev_bf16_pack(D, (uint16_t *)dyb.p[K], fdy.p[K], nv));
            BOTH(gp_dev_bf16_unpack(D, fx.p[K], (uint16_t *)xb.p[K], nv));
            BOTH(gp_dev_bf16_unpack(D, fdy.p[K], (uint16_t *)dyb.p[K], nv));
            BOTH(gp_dev_fill(D, pg1.p[K], 0.0f, 2 * C));
            BOTH(gp_dev_fill(D, pg2.p[K], 0.0f, 2 * C));
            CHECK(gp_dev_bn_bf16_has(g));
            BOTH(gp_dev_bn_fwd_train_bf16(D, &bd, (uint16_t *)xb.p[K], gm.p[K], bt.p[K],
                                          (uint16_t *)yb.p[K], st1.p[K], st1.p[K] + C));
            BOTH(gp_dev_bn_bwd_bf16(D, &bd, (uint16_t *)xb.p[K], gm.p[K], bt.p[K], st1.p[K],
                                    st1.p[K] + C, (uint16_t *)dyb.p[K], (uint16_t *)dxb.p[K],
                                    pg1.p[K], pg1.p[K] + C));
            /* the adapter's way, on the GPU */
            CHECK_OK(gp_dev_bn_fwd_train(g, &bd, fx.p[1], gm.p[1], bt.p[1], fy.p[1], st2.p[1],
                                         st2.p[1] + C));
            CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)yb2.p[1], fy.p[1], nv));
            CHECK_OK(gp_dev_bn_bwd(g, &bd, fx.p[1], gm.p[1], bt.p[1], st2.p[1], st2.p[1] + C,
                                   fdy.p[1], fdx.p[1], pg2.p[1], pg2.p[1] + C));
            CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)dxb2.p[1], fdx.p[1], nv));
            float *h[4];
            for (int q = 0; q < 4; q++) h[q] = malloc((size_t)nv * 2);
            CHECK_OK(gp_dev_download(g, h[0], yb.p[1], nv / 2));
            CHECK_OK(gp_dev_download(g, h[1], yb2.p[1], nv / 2));
            CHECK_OK(gp_dev_download(g, h[2], dxb.p[1], nv / 2));
            CHECK_OK(gp_dev_download(g, h[3], dxb2.p[1], nv / 2));
            CHECK_OK(gp_dev_synchronize(g));
            if (!shape) {
                CHECK_MSG(!memcmp(h[0], h[1], (size_t)nv * 2) && !memcmp(h[2], h[3], (size_t)nv * 2),
                          "bf16 batch norm (planes of %lld, relu %d) on the GPU: y or dx is not "
                          "the FP32 slots' rounded", (long long)bd.s, relu);
                CHECK_MSG(bsame(st1.p[1], st2.p[1], 2 * C) && bsame(pg1.p[1], pg2.p[1], 2 * C),
                          "bf16 batch norm (planes of %lld, relu %d) on the GPU: the statistics "
                          "or parameter gradients differ from FP32's", (long long)bd.s, relu);
            }
            double worst = 0.0;
            for (int q = 0; q < 2; q++) {
                const uint16_t *a = (const uint16_t *)h[2 * q], *b = (const uint16_t *)h[2 * q + 1];
                for (int64_t i = 0; i < nv; i++) {
                    double va = gp_ew_bf16_value(a[i]), vb = gp_ew_bf16_value(b[i]);
                    double e = fabs(va - vb) / (1.0 + fabs(vb));
                    if (!(e <= worst)) worst = e;
                }
            }
            CHECK_MSG(worst <= 1.0 / 128, "bf16 batch norm (planes of %lld, relu %d) on the GPU: "
                      "%.3g from the FP32 slots' rounded", (long long)bd.s, relu, worst);
            /* against the CPU's bf16 norm: the widened outputs */
            BOTH(gp_dev_bf16_unpack(D, fy.p[K], (uint16_t *)yb.p[K], nv));
            BOTH(gp_dev_bf16_unpack(D, fdx.p[K], (uint16_t *)dxb.p[K], nv));
            snprintf(what, sizeof what, "bf16 batch norm y (planes of %lld, relu %d)",
                     (long long)bd.s, relu);
            bcheck(what, &fy, 1.0 / 128);
            snprintf(what, sizeof what, "bf16 batch norm dx (planes of %lld, relu %d)",
                     (long long)bd.s, relu);
            bcheck(what, &fdx, 1.0 / 128);
            snprintf(what, sizeof what, "bf16 batch norm dgamma, dbeta (planes of %lld)",
                     (long long)bd.s);
            bcheck(what, &pg1, 1e-4);
            for (int q = 0; q < 4; q++) free(h[q]);
            buf *all[] = {&fx, &fdy, &gm, &bt, &xb, &dyb, &yb, &dxb, &yb2, &dxb2, &fy, &fdx,
                          &st1, &st2, &pg1, &pg2};
            for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
        }
    /* A residual block's second norm on bf16 storage, its shortcut added
     * and relu applied in its own pass (gp_bn_desc.add16): on planes of
     * 64+ values, bits(relu(the FP32 norm's output + the widened
     * shortcut)), both devices; planes of 49 on the GPU within a bf16 unit
     * of the CPU's. */
    for (int shape = 0; shape < 2; shape++) {
        const gp_bn_desc ad = {.n = 4, .c = 6, .s = shape ? 49 : 100, .eps = 1e-5f};
        const int64_t nv = ad.n * ad.c * ad.s, C = ad.c;
        buf fx = brand(nv, -2, 2), fa = brand(nv, -1, 1), gm = brand(C, 0.5f, 1.5f),
            bt = brand(C, -0.5f, 0.5f), xb = bjunk(nv / 2), ab = bjunk(nv / 2),
            yb = bjunk(nv / 2), fy = bjunk(nv), st1 = bjunk(2 * C), st2 = bjunk(2 * C),
            wy = bjunk(nv);
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)xb.p[K], fx.p[K], nv));
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)ab.p[K], fa.p[K], nv));
        BOTH(gp_dev_bf16_unpack(D, fx.p[K], (uint16_t *)xb.p[K], nv));
        BOTH(gp_dev_bf16_unpack(D, fa.p[K], (uint16_t *)ab.p[K], nv));
        gp_bn_desc a16 = ad;
        a16.relu = true;
        for (int k = 0; k < 2; k++) {
            a16.add16 = (const uint16_t *)ab.p[k];
            CHECK_OK(gp_dev_bn_fwd_train_bf16(D2[k], &a16, (uint16_t *)xb.p[k], gm.p[k], bt.p[k],
                                              (uint16_t *)yb.p[k], st1.p[k], st1.p[k] + C));
        }
        BOTH(gp_dev_bn_fwd_train(D, &ad, fx.p[K], gm.p[K], bt.p[K], fy.p[K], st2.p[K],
                                 st2.p[K] + C));
        BOTH(gp_dev_bf16_unpack(D, wy.p[K], (uint16_t *)yb.p[K], nv));
        for (int k = 0; k < 2 && !shape; k++) {
            float *h[3] = {malloc((size_t)nv * 4), malloc((size_t)nv * 4), malloc((size_t)nv * 4)};
            CHECK_OK(gp_dev_download(D2[k], h[0], fy.p[k], nv));
            CHECK_OK(gp_dev_download(D2[k], h[1], fa.p[k], nv));
            CHECK_OK(gp_dev_download(D2[k], h[2], wy.p[k], nv));
            CHECK_OK(gp_dev_synchronize(D2[k]));
            int64_t bad = 0;
            for (int64_t i = 0; i < nv; i++) {
                float want = gp_ew_bf16_value(gp_ew_bf16_bits(gp_ew_relu(h[0][i] + h[1][i])));
                bad += memcmp(&want, &h[2][i], sizeof want) != 0;
            }
            CHECK_MSG(bad == 0, "bf16 batch norm + shortcut + relu (planes of %lld) on %s: %lld "
                      "of %lld outputs are not the FP32 norm's plus the shortcut, relu'd, rounded",
                      (long long)ad.s, D2[k]->name, (long long)bad, (long long)nv);
            for (int q = 0; q < 3; q++) free(h[q]);
        }
        snprintf(what, sizeof what, "bf16 batch norm + shortcut + relu (planes of %lld)",
                 (long long)ad.s);
        bcheck(what, &wy, 1.0 / 128);
        buf *all[] = {&fx, &fa, &gm, &bt, &xb, &ab, &yb, &fy, &st1, &st2, &wy};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
    }
    /* Convolutions on bf16 storage (conv_*_bf16): cuDNN reads and writes
     * the bf16 tensors as they are; against the storage adapter's way on
     * the GPU (widened, the FP32 slots, which pack them again, rounded):
     * the forward bit for bit (the same algorithm on the same operands),
     * the backward within a bf16 unit (cuDNN's backward algorithms may add
     * in any order), the bias gradient bit for bit; a 1-channel
     * convolution (FP32 on every device) is not taken. */
    {
        const gp_conv_desc cd = {.n = 4, .c = 16, .h = 12, .w = 12, .k = 8, .kh = 3, .kw = 3,
                                 .sh = 1, .sw = 1, .ph = 1, .pw = 1, .oh = 12, .ow = 12,
                                 .has_bias = 1};
        const gp_conv_desc c1 = {.n = 4, .c = 1, .h = 12, .w = 12, .k = 8, .kh = 3, .kw = 3,
                                 .sh = 1, .sw = 1, .ph = 1, .pw = 1, .oh = 12, .ow = 12};
        CHECK(gp_dev_conv_bf16_takes(g, &cd) && !gp_dev_conv_bf16_takes(g, &c1) &&
              !gp_dev_conv_bf16_takes(cpu, &cd));
        const int64_t sx = 4 * 16 * 144, sy = 4 * 8 * 144, nwt = 8 * 16 * 9;
        buf fx = brand(sx, -1, 1), fdy = brand(sy, -1, 1), cw = brand(nwt, -0.3f, 0.3f),
            cb = brand(8, -0.5f, 0.5f), fy = bjunk(sy), fdx = bjunk(sx);
        buf xb = bjunk(sx / 2), dyb = bjunk(sy / 2), yb = bjunk(sy / 2), yb2 = bjunk(sy / 2),
            dxb = bjunk(sx / 2), dxb2 = bjunk(sx / 2);
        buf dw1 = bnew(nwt), dw2 = bnew(nwt), db1 = bnew(8), db2 = bnew(8);
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)xb.p[1], fx.p[1], sx));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)dyb.p[1], fdy.p[1], sy));
        CHECK_OK(gp_dev_bf16_unpack(g, fx.p[1], (uint16_t *)xb.p[1], sx));
        CHECK_OK(gp_dev_bf16_unpack(g, fdy.p[1], (uint16_t *)dyb.p[1], sy));
        buf *zero[] = {&dw1, &dw2, &db1, &db2};
        for (int q = 0; q < 4; q++) CHECK_OK(gp_dev_fill(g, zero[q]->p[1], 0.0f, zero[q]->n));
        CHECK_OK(gp_dev_conv_fwd_bf16(g, &cd, (uint16_t *)xb.p[1], cw.p[1], cb.p[1],
                                      (uint16_t *)yb.p[1]));
        CHECK_OK(gp_dev_conv_bwd_data_bf16(g, &cd, cw.p[1], (uint16_t *)dyb.p[1],
                                           (uint16_t *)dxb.p[1]));
        CHECK_OK(gp_dev_conv_bwd_weights_bf16(g, &cd, (uint16_t *)xb.p[1], (uint16_t *)dyb.p[1],
                                              dw1.p[1], db1.p[1]));
        CHECK_OK(gp_dev_conv_fwd(g, &cd, fx.p[1], cw.p[1], cb.p[1], fy.p[1]));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)yb2.p[1], fy.p[1], sy));
        CHECK_OK(gp_dev_conv_bwd_data(g, &cd, cw.p[1], fdy.p[1], fdx.p[1]));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)dxb2.p[1], fdx.p[1], sx));
        CHECK_OK(gp_dev_conv_bwd_weights(g, &cd, fx.p[1], fdy.p[1], dw2.p[1], db2.p[1]));
        CHECK_MSG(bsame(yb.p[1], yb2.p[1], sy / 2), "bf16 convolution forward on bf16 storage: "
                  "not the adapter's bits");
        CHECK_MSG(bsame(db1.p[1], db2.p[1], 8), "bf16 convolution's bias gradient on bf16 "
                  "storage: not the adapter's bits");
        float *h[2] = {malloc((size_t)sx * 2), malloc((size_t)sx * 2)};
        CHECK_OK(gp_dev_download(g, h[0], dxb.p[1], sx / 2));
        CHECK_OK(gp_dev_download(g, h[1], dxb2.p[1], sx / 2));
        CHECK_OK(gp_dev_synchronize(g));
        double worst = 0.0;
        for (int64_t i = 0; i < sx; i++) {
            double va = gp_ew_bf16_value(((const uint16_t *)h[0])[i]);
            double vb = gp_ew_bf16_value(((const uint16_t *)h[1])[i]);
            double e = fabs(va - vb) / (1.0 + fabs(vb));
            if (!(e <= worst)) worst = e;
        }
        CHECK_MSG(worst <= 1.0 / 128, "bf16 convolution backward-data on bf16 storage: %.3g "
                  "from the adapter's", worst);
        free(h[0]);
        free(h[1]);
        float *w[2] = {malloc((size_t)nwt * 4), malloc((size_t)nwt * 4)};
        CHECK_OK(gp_dev_download(g, w[0], dw1.p[1], nwt));
        CHECK_OK(gp_dev_download(g, w[1], dw2.p[1], nwt));
        CHECK_OK(gp_dev_synchronize(g));
        double wmax = 0.0, werr = 0.0;
        for (int64_t i = 0; i < nwt; i++) {
            wmax = fmax(wmax, fabs((double)w[1][i]));
            double e = fabs((double)w[0][i] - (double)w[1][i]);
            if (!(e <= werr)) werr = e;
        }
        CHECK_MSG(werr <= 1e-4 * (1.0 + wmax), "bf16 convolution backward-filter on bf16 "
                  "storage: %.3g from the adapter's (max %.3g)", werr, wmax);
        free(w[0]);
        free(w[1]);
        buf *all[] = {&fx, &fdy, &cw, &cb, &fy, &fdx, &xb, &dyb, &yb, &yb2, &dxb, &dxb2,
                      &dw1, &dw2, &db1, &db2};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
    }
    /* Cross-entropy on bf16 logits (xent_bf16), rows of a padded
     * vocabulary, label smoothing: the FP32 kernel's loss and hits on the
     * widened logits bit for bit, its gradient rounded (the same kernel
     * instantiated for bf16); and the CPU's within double rounding. */
    {
        const int64_t rows = 38, cols = 1000, ldv = 1003, nl = rows * ldv; /* even */
        buf fl = brand(nl, -4, 4), lb = bjunk(nl / 2), db = bjunk(nl / 2), db2 = bjunk(nl / 2);
        buf fd = bjunk(nl), lab = bnew(rows), r1 = bnew(6), r2 = bnew(6);
        float hl[38];
        for (int64_t r = 0; r < rows; r++) hl[r] = (float)((r * 131 + 7) % cols);
        bset(&lab, hl);
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)lb.p[K], fl.p[K], nl));
        BOTH(gp_dev_bf16_unpack(D, fl.p[K], (uint16_t *)lb.p[K], nl));
        BOTH(gp_dev_xent_bf16(D, (uint16_t *)lb.p[K], lab.p[K], rows, cols, ldv, 0.25f, 0.1f,
                              (uint16_t *)db.p[K], (gp_loss_result *)r1.p[K]));
        CHECK_OK(gp_dev_xent_dev_ld(g, fl.p[1], lab.p[1], rows, cols, ldv, 0.25f, 0.1f, fd.p[1],
                                    (gp_loss_result *)r2.p[1]));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)db2.p[1], fd.p[1], rows * ldv));
        CHECK_MSG(bsame(r1.p[1], r2.p[1], 6) && bsame(db.p[1], db2.p[1], rows * ldv / 2),
                  "cross-entropy on bf16 logits on the GPU: not the FP32 kernel's results on "
                  "the widened logits");
        gp_loss_result h[2];
        for (int k = 0; k < 2; k++) {
            CHECK_OK(gp_dev_download(D2[k], (float *)&h[k], r1.p[k], 6));
            CHECK_OK(gp_dev_synchronize(D2[k]));
        }
        CHECK_MSG(h[0].bad == -1 && h[1].bad == -1 && h[0].correct == h[1].correct &&
                      fabs(h[0].loss_sum - h[1].loss_sum) <= 1e-9 * fabs(h[0].loss_sum),
                  "cross-entropy on bf16 logits: GPU %.17g (%lld right) against the CPU's %.17g "
                  "(%lld)", h[1].loss_sum, (long long)h[1].correct, h[0].loss_sum,
                  (long long)h[0].correct);
        buf *all[] = {&fl, &lb, &db, &db2, &fd, &lab, &r1, &r2};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
    }
    /* Layer norm on bf16 storage (layer_norm_*_bf16): the FP32 kernels'
     * results on the widened values, y and dx rounded (the same kernels
     * instantiated for bf16), statistics and parameter gradients bit for
     * bit; the CPU's within rounding. */
    {
        const int64_t lr = 48, lc = 768, ln = lr * lc;
        buf fx = brand(ln, -2, 2), fdy = brand(ln, -1, 1), lw = brand(lc, 0.5f, 1.5f),
            lbias = brand(lc, -0.5f, 0.5f), fy = bjunk(ln), fdx = bjunk(ln);
        buf xb = bjunk(ln / 2), dyb = bjunk(ln / 2), yb = bjunk(ln / 2), yb2 = bjunk(ln / 2),
            dxb = bjunk(ln / 2), dxb2 = bjunk(ln / 2), st1 = bjunk(2 * lr), st2 = bjunk(2 * lr),
            g1 = bnew(2 * lc), g2 = bnew(2 * lc);
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)xb.p[K], fx.p[K], ln));
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)dyb.p[K], fdy.p[K], ln));
        BOTH(gp_dev_bf16_unpack(D, fx.p[K], (uint16_t *)xb.p[K], ln));
        BOTH(gp_dev_bf16_unpack(D, fdy.p[K], (uint16_t *)dyb.p[K], ln));
        BOTH(gp_dev_fill(D, g1.p[K], 0.0f, 2 * lc));
        BOTH(gp_dev_fill(D, g2.p[K], 0.0f, 2 * lc));
        BOTH(gp_dev_layer_norm_fwd_bf16(D, (uint16_t *)xb.p[K], lw.p[K], lbias.p[K],
                                        (uint16_t *)yb.p[K], st1.p[K], st1.p[K] + lr, lr, lc,
                                        1e-5f));
        BOTH(gp_dev_layer_norm_bwd_data_bf16(D, (uint16_t *)xb.p[K], lw.p[K], st1.p[K],
                                             st1.p[K] + lr, (uint16_t *)dyb.p[K],
                                             (uint16_t *)dxb.p[K], lr, lc));
        BOTH(gp_dev_layer_norm_bwd_weights_bf16(D, (uint16_t *)xb.p[K], st1.p[K], st1.p[K] + lr,
                                                (uint16_t *)dyb.p[K], g1.p[K], g1.p[K] + lc, lr,
                                                lc));
        CHECK_OK(gp_dev_layer_norm_fwd(g, fx.p[1], lw.p[1], lbias.p[1], fy.p[1], st2.p[1],
                                       st2.p[1] + lr, lr, lc, 1e-5f));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)yb2.p[1], fy.p[1], ln));
        CHECK_OK(gp_dev_layer_norm_bwd_data(g, fx.p[1], lw.p[1], st2.p[1], st2.p[1] + lr,
                                            fdy.p[1], fdx.p[1], lr, lc));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)dxb2.p[1], fdx.p[1], ln));
        CHECK_OK(gp_dev_layer_norm_bwd_weights(g, fx.p[1], st2.p[1], st2.p[1] + lr, fdy.p[1],
                                               g2.p[1], g2.p[1] + lc, lr, lc));
        CHECK_MSG(bsame(yb.p[1], yb2.p[1], ln / 2) && bsame(dxb.p[1], dxb2.p[1], ln / 2) &&
                      bsame(st1.p[1], st2.p[1], 2 * lr) && bsame(g1.p[1], g2.p[1], 2 * lc),
                  "bf16 layer norm on the GPU: not the FP32 kernels' results rounded");
        BOTH(gp_dev_bf16_unpack(D, fy.p[K], (uint16_t *)yb.p[K], ln));
        BOTH(gp_dev_bf16_unpack(D, fdx.p[K], (uint16_t *)dxb.p[K], ln));
        bcheck("bf16 layer norm y", &fy, 1.0 / 128);
        bcheck("bf16 layer norm dx", &fdx, 1.0 / 128);
        bcheck("bf16 layer norm dw, db", &g1, 1e-4);
        buf *all[] = {&fx, &fdy, &lw, &lbias, &fy, &fdx, &xb, &dyb, &yb, &yb2, &dxb, &dxb2,
                      &st1, &st2, &g1, &g2};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
    }
    /* The residual add with the layer norm after it in one launch
     * (add_layer_norm_fwd) and the norm's data gradient added into its
     * input's other gradient (layer_norm_bwd_data_add), issue 64, on FP32
     * and bf16 storage: on the GPU the bits of the unfused kernels (add /
     * add_bf16, layer_norm_fwd (_bf16); layer_norm_bwd_data (_bf16), then
     * axpy / add_bf16), and within rounding of the CPU's (sums in another
     * order). */
    for (int b16 = 0; b16 < 2; b16++) {
        const int64_t lr = 40, lc = 768, ln = lr * lc, words = b16 ? ln / 2 : ln;
        const gp_dtype dt = b16 ? GP_BF16 : GP_F32;
        buf fa = brand(ln, -2, 2), fb = brand(ln, -2, 2), fdy = brand(ln, -1, 1),
            fg = brand(ln, -1, 1), lw = brand(lc, 0.5f, 1.5f), lbias = brand(lc, -0.5f, 0.5f);
        buf a = bjunk(words), b = bjunk(words), dy = bjunk(words), g0 = bjunk(words),
            s1 = bjunk(words), y1 = bjunk(words), s2 = bjunk(words), y2 = bjunk(words),
            dx1 = bjunk(words), dx2 = bjunk(words), st1 = bjunk(2 * lr), st2 = bjunk(2 * lr);
        buf *src[4] = {&fa, &fb, &fdy, &fg}, *dst[4] = {&a, &b, &dy, &g0};
        for (int q = 0; q < 4; q++) {
            if (b16) BOTH(gp_dev_bf16_pack(D, (uint16_t *)dst[q]->p[K], src[q]->p[K], ln));
            else BOTH(gp_dev_copy_d2d(D, dst[q]->p[K], src[q]->p[K], (size_t)ln * 4));
        }
        BOTH(gp_dev_add_layer_norm_fwd(D, dt, a.p[K], b.p[K], s1.p[K], lw.p[K], lbias.p[K],
                                       y1.p[K], st1.p[K], st1.p[K] + lr, lr, lc, 1e-5f));
        BOTH(gp_dev_copy_d2d(D, dx1.p[K], g0.p[K], (size_t)words * 4));
        BOTH(gp_dev_layer_norm_bwd_data_add(D, dt, s1.p[K], lw.p[K], st1.p[K], st1.p[K] + lr,
                                            dy.p[K], dx1.p[K], lr, lc));
        if (b16) {
            CHECK_OK(gp_dev_add_bf16(g, (uint16_t *)a.p[1], (uint16_t *)b.p[1],
                                     (uint16_t *)s2.p[1], ln));
            CHECK_OK(gp_dev_layer_norm_fwd_bf16(g, (uint16_t *)s2.p[1], lw.p[1], lbias.p[1],
                                                (uint16_t *)y2.p[1], st2.p[1], st2.p[1] + lr, lr,
                                                lc, 1e-5f));
            CHECK_OK(gp_dev_layer_norm_bwd_data_bf16(g, (uint16_t *)s1.p[1], lw.p[1], st1.p[1],
                                                     st1.p[1] + lr, (uint16_t *)dy.p[1],
                                                     (uint16_t *)dx2.p[1], lr, lc));
            CHECK_OK(gp_dev_add_bf16(g, (uint16_t *)dx2.p[1], (uint16_t *)g0.p[1],
                                     (uint16_t *)dx2.p[1], ln));
        } else {
            CHECK_OK(gp_dev_add(g, a.p[1], b.p[1], s2.p[1], ln));
            CHECK_OK(gp_dev_layer_norm_fwd(g, s2.p[1], lw.p[1], lbias.p[1], y2.p[1], st2.p[1],
                                           st2.p[1] + lr, lr, lc, 1e-5f));
            CHECK_OK(gp_dev_layer_norm_bwd_data(g, s1.p[1], lw.p[1], st1.p[1], st1.p[1] + lr,
                                                dy.p[1], dx2.p[1], lr, lc));
            CHECK_OK(gp_dev_axpy(g, 1.0f, g0.p[1], dx2.p[1], ln));
        }
        CHECK_MSG(bsame(s1.p[1], s2.p[1], words) && bsame(y1.p[1], y2.p[1], words) &&
                      bsame(st1.p[1], st2.p[1], 2 * lr) && bsame(dx1.p[1], dx2.p[1], words),
                  "fused residual add and layer norm (%s) on the GPU: not the unfused kernels' "
                  "bits", gp_dtype_name(dt));
        buf *out[3] = {&s1, &y1, &dx1};
        static const char *const names[3] = {"sum", "y", "dx"};
        for (int q = 0; q < 3; q++) {
            if (b16) BOTH(gp_dev_bf16_unpack(D, fa.p[K], (uint16_t *)out[q]->p[K], ln));
            else BOTH(gp_dev_copy_d2d(D, fa.p[K], out[q]->p[K], (size_t)ln * 4));
            char wh[96];
            snprintf(wh, sizeof wh, "fused residual add and layer norm (%s): %s",
                     gp_dtype_name(dt), names[q]);
            bcheck(wh, &fa, b16 ? 1.0 / 64 : 1e-4);
        }
        buf *all[] = {&fa, &fb, &fdy, &fg, &lw, &lbias, &a, &b, &dy, &g0, &s1, &y1, &s2, &y2,
                      &dx1, &dx2, &st1, &st2};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
    }
    /* the sum on bf16 storage (add_bf16), on rounded random values (a
     * NaN's payload is the processor's own): the GPU's bits are the CPU's */
    {
        enum { SN = 6000 };
        buf fa = brand(SN, -4, 4), fb = brand(SN, -4, 4), a = bjunk(SN / 2), b = bjunk(SN / 2),
            y = bjunk(SN / 2);
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)a.p[K], fa.p[K], SN));
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)b.p[K], fb.p[K], SN));
        BOTH(gp_dev_add_bf16(D, (uint16_t *)a.p[K], (uint16_t *)b.p[K], (uint16_t *)y.p[K], SN));
        float *h[2] = {malloc(SN * 2), malloc(SN * 2)};
        for (int k = 0; k < 2; k++) {
            CHECK_OK(gp_dev_download(D2[k], h[k], y.p[k], SN / 2));
            CHECK_OK(gp_dev_synchronize(D2[k]));
        }
        CHECK_MSG(!memcmp(h[0], h[1], SN * 2), "bf16 add: the GPU's bits differ from the CPU's");
        /* dropout's mask (the counter-based draw) and dropout2d's rows on
         * bf16 values: the CPU's bits too */
        buf rs = brand(SN / 100, 0, 2);
        BOTH(gp_dev_dropout_apply_bf16(D, (uint16_t *)a.p[K], (uint16_t *)y.p[K], SN, 0.3f, 5, 77,
                                       1000));
        for (int k = 0; k < 2; k++) {
            CHECK_OK(gp_dev_download(D2[k], h[k], y.p[k], SN / 2));
            CHECK_OK(gp_dev_synchronize(D2[k]));
        }
        CHECK_MSG(!memcmp(h[0], h[1], SN * 2), "bf16 dropout: the GPU's bits differ from the "
                  "CPU's");
        BOTH(gp_dev_mul_rows_bf16(D, (uint16_t *)b.p[K], rs.p[K], (uint16_t *)y.p[K], SN / 100,
                                  100));
        for (int k = 0; k < 2; k++) {
            CHECK_OK(gp_dev_download(D2[k], h[k], y.p[k], SN / 2));
            CHECK_OK(gp_dev_synchronize(D2[k]));
        }
        CHECK_MSG(!memcmp(h[0], h[1], SN * 2), "bf16 dropout2d's rows: the GPU's bits differ "
                  "from the CPU's");
        bfree(&rs);
        free(h[0]);
        free(h[1]);
        bfree(&fa); bfree(&fb); bfree(&a); bfree(&b); bfree(&y);
    }
    /* pooling on bf16 storage (pool_*_bf16): gpipe's kernels, the CPU's
     * loops one element a thread, so the GPU's bits are the CPU's, forward
     * and backward: max 3x3 stride 2 (overlapping windows, padding), max
     * 2x2, average 3x3 stride 1 over the window inside the image
     * (AmoebaNet's) and over kh kw, on odd sizes */
    {
        static const gp_pool_desc pds[4] = {
            {.n = 2, .c = 3, .h = 9, .w = 11, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1,
             .pw = 1, .oh = 5, .ow = 6, .kind = GP_POOL_MAX},
            {.n = 2, .c = 3, .h = 8, .w = 10, .kh = 2, .kw = 2, .sh = 2, .sw = 2, .oh = 4,
             .ow = 5, .kind = GP_POOL_MAX},
            {.n = 2, .c = 3, .h = 7, .w = 9, .kh = 3, .kw = 3, .sh = 1, .sw = 1, .ph = 1,
             .pw = 1, .oh = 7, .ow = 9, .kind = GP_POOL_AVG},
            {.n = 2, .c = 3, .h = 7, .w = 9, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1,
             .pw = 1, .oh = 4, .ow = 5, .kind = GP_POOL_AVG_INCLUDE_PAD},
        };
        CHECK(gp_dev_pool_bf16_has(g));
        for (int q = 0; q < 4; q++) {
            const gp_pool_desc *pd = &pds[q];
            const int64_t pnx = pd->n * pd->c * pd->h * pd->w;
            const int64_t pny = pd->n * pd->c * pd->oh * pd->ow;
            buf fx = brand(pnx, -4, 4), fdy = brand(pny, -4, 4), x = bjunk((pnx + 1) / 2),
                dy = bjunk((pny + 1) / 2), y = bjunk((pny + 1) / 2), dx = bjunk((pnx + 1) / 2);
            BOTH(gp_dev_bf16_pack(D, (uint16_t *)x.p[K], fx.p[K], pnx));
            BOTH(gp_dev_bf16_pack(D, (uint16_t *)dy.p[K], fdy.p[K], pny));
            size_t wsb = gp_dev_pool_ws_bytes(cpu, pd);
            void *ws[2] = {wsb ? malloc(wsb) : NULL, NULL};
            CHECK(gp_dev_pool_ws_bytes(g, pd) == 0);
            BOTH(gp_dev_pool_fwd_bf16(D, pd, (uint16_t *)x.p[K], (uint16_t *)y.p[K], ws[K]));
            BOTH(gp_dev_pool_bwd_bf16(D, pd, (uint16_t *)x.p[K], (uint16_t *)y.p[K],
                                      (uint16_t *)dy.p[K], (uint16_t *)dx.p[K], ws[K]));
            for (int dir = 0; dir < 2; dir++) {
                const buf *r = dir ? &dx : &y;
                int64_t nv = dir ? pnx : pny;
                uint16_t *h[2] = {malloc((size_t)nv * 2 + 4), malloc((size_t)nv * 2 + 4)};
                for (int k = 0; k < 2; k++) {
                    CHECK_OK(gp_dev_download(D2[k], (float *)h[k], r->p[k], (nv + 1) / 2));
                    CHECK_OK(gp_dev_synchronize(D2[k]));
                }
                CHECK_MSG(!memcmp(h[0], h[1], (size_t)nv * 2), "bf16 pooling %d (kind %d, "
                          "%lldx%lld stride %lld) %s: the GPU's bits differ from the CPU's", q,
                          (int)pd->kind, (long long)pd->kh, (long long)pd->kw, (long long)pd->sh,
                          dir ? "backward" : "forward");
                free(h[0]);
                free(h[1]);
            }
            free(ws[0]);
            bfree(&fx); bfree(&fdy); bfree(&x); bfree(&dy); bfree(&y); bfree(&dx);
        }
    }
    /* Linear layers on bf16 storage (linear_*_bf16, precision bf16): a
     * product worth bf16 (in 256) and one that is not (in 8, FP32 as the
     * CPU's), with bias and relu, against the storage adapter's way on the
     * GPU (widened, the FP32 slots, rounded): y and dx within a bf16 unit
     * where cuBLASLt's epilogue may sum in another order, bit for bit
     * where not worth bf16; dw and db bit for bit (cublasGemmEx on the same
     * bf16 operands; dy's column sums widened exactly).  Not taken by the
     * CPU (no bf16 products there). */
    CHECK(gp_dev_linear_bf16_has(g) && !gp_dev_linear_bf16_has(cpu));
    for (int64_t lin = 8; lin <= 256; lin += 248) {
        const int64_t ln = 64, lout = 48, nxl = ln * lin, nyl = ln * lout;
        const bool worth = gp_bf16_gemm_worth(ln, lout, lin);
        buf fx = brand(nxl, -1, 1), fdy = brand(nyl, -1, 1), lw = brand(lout * lin, -0.2f, 0.2f),
            lb = brand(lout, -0.5f, 0.5f), xb = bjunk(nxl / 2), dyb = bjunk(nyl / 2),
            yb = bjunk(nyl / 2), yb2 = bjunk(nyl / 2), dxb = bjunk(nxl / 2), dxb2 = bjunk(nxl / 2),
            fy = bjunk(nyl), fdx = bjunk(nxl), dw1 = bjunk(lout * lin), dw2 = bjunk(lout * lin),
            db1 = bjunk(lout), db2 = bjunk(lout);
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)xb.p[1], fx.p[1], nxl));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)dyb.p[1], fdy.p[1], nyl));
        CHECK_OK(gp_dev_bf16_unpack(g, fx.p[1], (uint16_t *)xb.p[1], nxl));
        CHECK_OK(gp_dev_bf16_unpack(g, fdy.p[1], (uint16_t *)dyb.p[1], nyl));
        CHECK_OK(gp_dev_linear_fwd_bf16(g, ln, lout, lin, (uint16_t *)xb.p[1], lw.p[1], lb.p[1],
                                        true, (uint16_t *)yb.p[1]));
        CHECK_OK(gp_dev_linear_bwd_data_bf16(g, ln, lout, lin, (uint16_t *)dyb.p[1], lw.p[1],
                                             (uint16_t *)dxb.p[1]));
        CHECK_OK(gp_dev_linear_bwd_weights(g, GP_BF16, ln, lout, lin, dyb.p[1], xb.p[1],
                                           dw1.p[1], db1.p[1], true));
        /* the adapter's way */
        CHECK_OK(gp_dev_linear_fwd(g, ln, lout, lin, fx.p[1], lw.p[1], lb.p[1], true, fy.p[1]));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)yb2.p[1], fy.p[1], nyl));
        CHECK_OK(gp_dev_gemm_wb(g, 0, 0, ln, lin, lout, 1.0f, fdy.p[1], lout, lw.p[1], lin, 0.0f,
                                fdx.p[1], lin));
        CHECK_OK(gp_dev_bf16_pack(g, (uint16_t *)dxb2.p[1], fdx.p[1], nxl));
        CHECK_OK(gp_dev_gemm(g, 1, 0, lout, lin, ln, 1.0f, fdy.p[1], lout, fx.p[1], lin, 0.0f,
                             dw2.p[1], lin));
        CHECK_OK(gp_dev_fill(g, db2.p[1], 0.0f, lout));
        CHECK_OK(gp_dev_sum_rows(g, fdy.p[1], db2.p[1], ln, lout));
        CHECK_MSG(bsame(dw1.p[1], dw2.p[1], lout * lin) && bsame(db1.p[1], db2.p[1], lout),
                  "bf16 linear (in %lld) weight and bias gradients: not the adapter's bits",
                  (long long)lin);
        /* FP32 storage through the same slot (issue 64: the weights half in
         * one call): the bits of gemm, fill and sum_rows above */
        CHECK_OK(gp_dev_linear_bwd_weights(g, GP_F32, ln, lout, lin, fdy.p[1], fx.p[1],
                                           dw1.p[1], db1.p[1], true));
        CHECK_MSG(bsame(dw1.p[1], dw2.p[1], lout * lin) && bsame(db1.p[1], db2.p[1], lout),
                  "FP32 linear (in %lld) weight and bias gradients in one call: not the bits of "
                  "gemm, fill and sum_rows", (long long)lin);
        for (int dir = 0; dir < 2; dir++) {
            const buf *a = dir ? &dxb : &yb, *b = dir ? &dxb2 : &yb2;
            int64_t nv = dir ? nxl : nyl;
            uint16_t *h[2] = {malloc((size_t)nv * 2), malloc((size_t)nv * 2)};
            CHECK_OK(gp_dev_download(g, (float *)h[0], a->p[1], nv / 2));
            CHECK_OK(gp_dev_download(g, (float *)h[1], b->p[1], nv / 2));
            CHECK_OK(gp_dev_synchronize(g));
            double worst = 0.0;
            for (int64_t i = 0; i < nv; i++) {
                double va = gp_ew_bf16_value(h[0][i]), vb = gp_ew_bf16_value(h[1][i]);
                double e = fabs(va - vb) / (1.0 + fabs(vb));
                if (!(e <= worst)) worst = e;
            }
            if (worth)
                CHECK_MSG(worst <= 1.0 / 128, "bf16 linear (in %lld) %s on bf16 storage: %.3g "
                          "from the adapter's", (long long)lin, dir ? "dx" : "y", worst);
            else
                CHECK_MSG(!memcmp(h[0], h[1], (size_t)nv * 2), "bf16 linear (in %lld, FP32) %s "
                          "on bf16 storage: not the adapter's bits", (long long)lin,
                          dir ? "dx" : "y");
            free(h[0]);
            free(h[1]);
        }
        buf *all[] = {&fx, &fdy, &lw, &lb, &xb, &dyb, &yb, &yb2, &dxb, &dxb2, &fy, &fdx,
                      &dw1, &dw2, &db1, &db2};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
    }
    test_linear_gelu(GP_BF16);
    /* U-Net's layers on bf16 storage: upsampling by 2 and 3 (bits copied;
     * the block sums in the CPU's float order) the CPU's bits; the
     * instance norm's backward through the leaky relu after it
     * (norm_leaky_bwd_bf16) the same bits from the norm's output and from
     * the relu's bf16 output, and within a bf16 unit of the CPU's */
    {
        for (int64_t sc = 2; sc <= 3; sc++) {
            const int64_t un = 2, uc = 3, uh = 5, uw = 7, unx = un * uc * uh * uw;
            const int64_t uny = unx * sc * sc;
            buf fx = brand(unx, -4, 4), fdy = brand(uny, -4, 4), x = bjunk((unx + 1) / 2),
                dy = bjunk((uny + 1) / 2), y = bjunk((uny + 1) / 2), dx = bjunk((unx + 1) / 2);
            BOTH(gp_dev_bf16_pack(D, (uint16_t *)x.p[K], fx.p[K], unx));
            BOTH(gp_dev_bf16_pack(D, (uint16_t *)dy.p[K], fdy.p[K], uny));
            BOTH(gp_dev_upsample_fwd_bf16(D, (uint16_t *)x.p[K], (uint16_t *)y.p[K], un, uc, uh,
                                          uw, sc));
            BOTH(gp_dev_upsample_bwd_bf16(D, (uint16_t *)dy.p[K], (uint16_t *)dx.p[K], un, uc, uh,
                                          uw, sc));
            for (int dir = 0; dir < 2; dir++) {
                const buf *r = dir ? &dx : &y;
                int64_t unv = dir ? unx : uny;
                uint16_t *h[2] = {malloc((size_t)unv * 2 + 4), malloc((size_t)unv * 2 + 4)};
                for (int k = 0; k < 2; k++) {
                    CHECK_OK(gp_dev_download(D2[k], (float *)h[k], r->p[k], (unv + 1) / 2));
                    CHECK_OK(gp_dev_synchronize(D2[k]));
                }
                CHECK_MSG(!memcmp(h[0], h[1], (size_t)unv * 2), "bf16 upsample by %lld %s: the "
                          "GPU's bits differ from the CPU's", (long long)sc,
                          dir ? "backward" : "forward");
                free(h[0]);
                free(h[1]);
            }
            bfree(&fx); bfree(&fdy); bfree(&x); bfree(&dy); bfree(&y); bfree(&dx);
        }
        const gp_bn_desc nd = {.n = 1, .c = 6, .s = 90, .eps = 1e-5f};
        const int64_t unv = 6 * 90;
        const float slope = 0.01f;
        buf fy = brand(unv, -3, 3), fdy = brand(unv, -1, 1), var = brand(6, 0.5f, 2),
            yb = bjunk(unv / 2), zb = bjunk(unv / 2), dyb = bjunk(unv / 2), d1 = bjunk(unv / 2),
            d2 = bjunk(unv / 2), w1 = bjunk(unv);
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)yb.p[K], fy.p[K], unv));
        BOTH(gp_dev_bf16_pack(D, (uint16_t *)dyb.p[K], fdy.p[K], unv));
        BOTH(gp_dev_act_bf16(D, GP_ACT_LEAKY_RELU, (uint16_t *)yb.p[K], NULL, (uint16_t *)zb.p[K],
                             unv, slope));
        BOTH(gp_dev_norm_leaky_bwd_bf16(D, &nd, (uint16_t *)yb.p[K], false, slope, var.p[K],
                                        (uint16_t *)dyb.p[K], (uint16_t *)d1.p[K]));
        BOTH(gp_dev_norm_leaky_bwd_bf16(D, &nd, (uint16_t *)zb.p[K], true, slope, var.p[K],
                                        (uint16_t *)dyb.p[K], (uint16_t *)d2.p[K]));
        CHECK_MSG(bsame(d1.p[1], d2.p[1], unv / 2), "bf16 instance norm + leaky relu backward on "
                  "the GPU: from the norm's output and from the relu's differ");
        BOTH(gp_dev_bf16_unpack(D, w1.p[K], (uint16_t *)d1.p[K], unv));
        bcheck("bf16 instance norm + leaky relu backward", &w1, 1.0 / 128);
        buf *all[] = {&fy, &fdy, &var, &yb, &zb, &dyb, &d1, &d2, &w1};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) bfree(all[q]);
    }
    uint64_t plans = g->graph_plans; /* the bf16 convolution's */
    /* 1 input channel, 3x3: 9 products an output, too few for bf16
     * (gp_bf16_conv_worth): FP32, as the CPU's, where bf16 operands would
     * be 2^-9 off */
    gp_conv_desc d1 = {4, 1, 14, 14, 8, 3, 3, 1, 1, 1, 1, 14, 14, 1, 0, 0};
    CHECK(!gp_bf16_conv_worth(&d1) && gp_bf16_conv_worth(&d));
    buf x1 = brand(4 * 196, -1, 1), w1 = brand(72, -1, 1), b1 = brand(8, -1, 1),
        y1 = bjunk(4 * 8 * 196);
    BOTH(gp_dev_conv_fwd(D, &d1, x1.p[K], w1.p[K], b1.p[K], y1.p[K]));
    snprintf(what, sizeof what, "bf16 device, conv of 1 channel (FP32)%s", tag);
    bcheck(what, &y1, 1e-4);
    bfree(&x1); bfree(&w1); bfree(&b1); bfree(&y1);
    if (graph)
        CHECK_MSG(plans >= 1, "bf16 with the graph API forced: %llu plans kept",
                  (unsigned long long)plans);
    D2[0] = keep[0];
    D2[1] = keep[1];
    gp_device_close(g);
    if (!graph) test_channels_last(cpu); /* (on a handle of its own) */
}

/* Precision bf16 in training (the tolerance test_train uses for the CPU's
 * bf16): a convnet with batch norm for 8 steps on cuda:0, 1 stage with
 * FP32 activations (their copies packed to bf16) and 2 stages on two
 * handles of it with activations as `auto` stores them on GPUs under
 * bf16 (bf16 since 2026-11-27: compiled, not run), against the same steps
 * in FP32 on cpu:0: every loss within 2%, not all equal (bf16 ran), and
 * falling. */
static void test_bf16_training(void)
{
    static const char *yaml =
        "model:\n  input: [3, 16, 16]\n  layers:\n"
        "    - conv2d: {out: 16, kernel: 3, padding: 1}\n    - batchnorm\n    - relu\n"
        "    - conv2d: {out: 32, kernel: 3, padding: 1}\n    - relu\n    - maxpool2d: {kernel: 2}\n"
        "    - conv2d: {out: 32, kernel: 3, padding: 1}\n    - relu\n    - flatten\n"
        "    - linear: {out: 64}\n    - relu\n    - linear: {out: 10}\n"
        "data: {dataset: synthetic, synthetic: {train: 64, test: 16, classes: 10}}\n"
        "train: {batch_size: 32, seed: 5, optimizer: {lr: 0.05, momentum: 0.9}}\n"
        "pipeline: {devices: [cpu:0], threads: 2, chunks: 2}\n";
    enum { B = 32, STEPS = 8, NPIX = 3 * 16 * 16 };
    float *x = malloc(sizeof(float) * B * NPIX), y[B];
    for (int i = 0; i < B * NPIX; i++) x[i] = 0.5f * frand();
    for (int i = 0; i < B; i++) y[i] = (float)(i % 10);
    static const char *runs[3][3] = {
        {"train.precision=fp32", "pipeline.devices=[cpu:0]", NULL},
        {"train.precision=bf16", "pipeline.devices=[cuda:0]", "train.activations=fp32"},
        {"train.precision=bf16", "pipeline.devices=[cuda:0, cuda:0]", NULL}};
    double loss[3][STEPS];
    for (int r = 0; r < 3; r++) {
        gp_status st = gpt_run_losses(yaml, runs[r], runs[r][2] ? 3 : 2, x, y, B, STEPS, loss[r]);
        CHECK_MSG(st == GP_OK, "%s %s: %s", runs[r][0], runs[r][1], gp_last_error());
        if (st != GP_OK) break;
        if (r == 0) continue;
        bool same = true;
        double worst = 0;
        for (int k = 0; k < STEPS; k++) {
            same &= loss[r][k] == loss[0][k];
            worst = fmax(worst, fabs(loss[r][k] - loss[0][k]) / fabs(loss[0][k]));
        }
        CHECK_MSG(worst <= 2e-2 && !same && loss[r][STEPS - 1] < loss[r][0],
                  "%s: losses %.3g relative from fp32 on the CPU (at most 2e-2 and not 0), "
                  "first %.4f last %.4f", runs[r][1], worst, loss[r][0], loss[r][STEPS - 1]);
    }
    free(x);
}

/* Activations stored in bf16 with FP32 math (train.activations: bf16, the
 * storage-only mode) on the GPU: two stages on cuda:0 give the one-stage
 * run's losses bit for bit (the stage boundary rounds nothing the layers
 * did not; deterministic algorithms on both), and both stay within 1e-2 of
 * the same mode on the CPU, whose FP32 kernels differ (not bit for bit:
 * a different sum can round to a neighbouring bf16), and differ from the
 * GPU's FP32 storage (the rounding happened). */
static void test_bf16_storage(void)
{
    static const char *yaml =
        "model:\n  input: [3, 16, 16]\n  layers:\n"
        "    - conv2d: {out: 16, kernel: 3, padding: 1}\n    - batchnorm\n    - relu\n"
        "    - conv2d: {out: 32, kernel: 3, padding: 1}\n    - relu\n    - maxpool2d: {kernel: 2}\n"
        "    - flatten\n    - linear: {out: 64}\n    - relu\n    - dropout: {p: 0.2}\n"
        "    - linear: {out: 10}\n"
        "data: {dataset: synthetic, synthetic: {train: 64, test: 16, classes: 10}}\n"
        "train: {batch_size: 32, seed: 5, deterministic: true, optimizer: {lr: 0.05, "
        "momentum: 0.9}}\n"
        "pipeline: {devices: [cpu:0], threads: 2, chunks: 2, balance: [5, 6]}\n";
    enum { B = 32, STEPS = 6, NPIX = 3 * 16 * 16 };
    float *x = malloc(sizeof(float) * B * NPIX), y[B];
    for (int i = 0; i < B * NPIX; i++) x[i] = 0.5f * frand();
    for (int i = 0; i < B; i++) y[i] = (float)(i % 10);
    static const char *runs[4][2] = {{"train.activations=bf16", "pipeline.devices=[cpu:0]"},
                                     {"train.activations=bf16", "pipeline.devices=[cuda:0]"},
                                     {"train.activations=bf16", "pipeline.devices=[cuda:0, cuda:0]"},
                                     {"train.activations=fp32", "pipeline.devices=[cuda:0]"}};
    double loss[4][STEPS];
    for (int r = 0; r < 4; r++) {
        /* one device takes every layer: no balance */
        const char *sets[3] = {runs[r][0], runs[r][1], "pipeline.balance=auto"};
        gp_status st = gpt_run_losses(yaml, sets, r == 2 ? 2 : 3, x, y, B, STEPS, loss[r]);
        CHECK_MSG(st == GP_OK, "%s %s: %s", runs[r][0], runs[r][1], gp_last_error());
        if (st != GP_OK) {
            free(x);
            return;
        }
    }
    bool same12 = true, same13 = true;
    double worst = 0;
    for (int k = 0; k < STEPS; k++) {
        same12 &= loss[1][k] == loss[2][k];
        same13 &= loss[1][k] == loss[3][k];
        worst = fmax(worst, fabs(loss[1][k] - loss[0][k]) / fabs(loss[0][k]));
    }
    CHECK_MSG(same12, "bf16 activations: two stages on cuda:0 differ from one (first %.9g / %.9g)",
              loss[2][0], loss[1][0]);
    CHECK_MSG(!same13, "bf16 activations on cuda:0: the same losses as fp32 storage (%.9g)",
              loss[3][0]);
    CHECK_MSG(worst <= 1e-2 && loss[1][STEPS - 1] < loss[1][0],
              "bf16 activations: cuda:0 %.3g relative from cpu:0 (at most 1e-2), first %.4f "
              "last %.4f", worst, loss[1][0], loss[1][STEPS - 1]);
    printf("test_cuda: bf16 activations: cuda:0 within %.3g of cpu:0 over %d steps; 2 stages on "
           "cuda:0 %s\n", worst, STEPS, same12 ? "bit for bit the one-stage run" : "DIFFER");
    free(x);
}

/* Another handle of cuda:0 (opts, and the environment variable env = value
 * while it opens; NULLs: none) in D2[1]'s place, bound to this thread;
 * variant_close gives the place back to gpu. */
static gp_device *variant_open(gp_device *gpu, const gp_device_opts *opts, const char *env,
                               const char *value)
{
    if (env) setenv(env, value, 1);
    gp_device *v = NULL;
    CHECK_OK(gp_device_open("cuda:0", opts, &v));
    if (env) unsetenv(env);
    if (v) {
        gp_device_bind_thread(v);
        D2[1] = v;
    } else {
        gp_device_bind_thread(gpu);
    }
    return v;
}

static void variant_close(gp_device *v, gp_device *gpu)
{
    D2[1] = gpu;
    gp_device_close(v);
    gp_device_bind_thread(gpu);
}

int main(int argc, char **argv)
{
    bool two = argc > 1 && !strcmp(argv[1], "--two-gpus");
    if (argc > 2 || (argc == 2 && !two)) {
        fprintf(stderr, "usage: %s [--two-gpus]\n", argv[0]);
        return 2;
    }
    const char *name = two ? "test_cuda --two-gpus" : "test_cuda";
    gp_device *gpu = NULL;
    gp_status s = gp_device_open("cuda:0", NULL, &gpu);
    if (s != GP_OK) {
        /* The "clear message" is part of the contract: check it, then skip. */
        const char *msg = gp_last_error();
        CHECK_MSG(s == GP_ERR_UNSUPPORTED, "opening cuda:0 failed with %s, not GP_ERR_UNSUPPORTED",
                  gp_status_name(s));
        CHECK_MSG(strstr(msg, "cpu:N") != NULL, "message does not point to cpu:N devices: %s", msg);
        if (gpt_failed) return gpt_finish(name);
        printf("%s: SKIPPED, no CUDA device: %s\n", name, msg);
        return 77;
    }
    gp_device *cpu = NULL;
    gp_device_opts co = {.threads = 2};
    if (gp_device_open("cpu:0", &co, &cpu) != GP_OK) {
        fprintf(stderr, "cpu:0: %s\n", gp_last_error());
        return 1;
    }
    gp_device_bind_thread(gpu);
    if (two) return main_two_gpus(gpu, cpu);

    D2[0] = cpu;
    D2[1] = gpu;
    test_elementwise();
    test_gemm();
    test_linear_fwd("measured", true);
    test_linear_gelu(GP_F32);
    test_embed_bwd();
    test_rms_norm();
    test_conv();
    {
        /* again with train.deterministic: heuristics, no searches */
        gp_device_opts dopt = {.deterministic = true};
        gp_device *det = variant_open(gpu, &dopt, NULL, NULL);
        if (det) {
            det_gpu = true;
            test_conv();
            test_linear_fwd("deterministic", false);
            test_gemm();
            det_gpu = false;
            variant_close(det, gpu);
        }
        /* and without cuBLASLt: cublasSgemm and gpipe's bias / relu kernel */
        gp_device *classic = variant_open(gpu, NULL, "GPIPE_CUBLASLT", "0");
        if (classic) {
            test_gemm();
            test_linear_fwd("GPIPE_CUBLASLT=0", false);
            variant_close(classic, gpu);
        }
        /* and with cuDNN's graph API wherever a plan builds (the measured
         * choice keeps it only where it beats the legacy algorithm, so
         * the checks above may never have run it) */
        gp_device *forced = variant_open(gpu, NULL, "GPIPE_CUDNN_GRAPH", "force");
        if (forced) {
            test_conv();
            CHECK_MSG(forced->graph_plans >= 8, "graph API plans kept: %llu of 24",
                      (unsigned long long)forced->graph_plans);
            variant_close(forced, gpu);
        }
    }
    test_pool();
    test_bn();
    test_softmax_xent();
    test_step_slots();
    test_memory(gpu);
    test_pinned(gpu);
    test_layers(cpu, gpu);
    test_tf32(cpu);
    test_bf16_ops(cpu, NULL);
    test_bf16_ops(cpu, "force");
    test_bf16_training();
    test_bf16_storage();
    gp_device_bind_thread(gpu);
    /* One GPU's share of the copies and the pipeline: device-to-device, and
     * a 1-stage pipeline on cuda:0 against the CPU.  The 2-GPU parts are
     * test_cuda_2gpu (--two-gpus). */
    test_copies(gpu, gpu);
    gp_device *gpus[1] = {gpu};
    test_transparency(cpu, gpus, 1);
    test_shared_gpu(gpu, cpu);
    gp_device_close(gpu);
    gp_device_close(cpu);
    return gpt_finish("test_cuda");
}
