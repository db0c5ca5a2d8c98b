/*
 * cpu_math.c — the CPU backend's elementwise ops, reductions, gemm,
 * cross-entropy and dropout masks, and the elementwise ops of the U-Net
 * layers (leaky relu, per-row scaling) and its binary cross-entropy.
 *
 * Loops are OpenMP `parallel for` with the device's thread count and a
 * static schedule (so reductions are reproducible for a given thread
 * count); the arithmetic of each element or row is in backend/elementwise.h,
 * shared with the other backends.  Small arrays run on one thread: waking
 * the team costs more than the work.  gemm is oneDNN's JIT sgemm (a short
 * wide A B^T runs transposed, see gemm_wide_nt).
 */
#include "backend/cpu/cpu_impl.h"
#include "backend/elementwise.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Below this many elements a loop runs on the calling thread alone. */
#define CPU_PAR_MIN 32768

GP_CPU_LOOPS
gp_status gp_cpu_fill(gp_device *dev, float *x, float v, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = v;
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_scale(gp_device *dev, float *x, float a, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= a;
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_axpy(gp_device *dev, float a, const float *x, float *y, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_add(gp_device *dev, const float *a, const float *b, float *y, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_mul(gp_device *dev, const float *a, const float *b, float *y, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_copy_box(gp_device *dev, void *dst, const int64_t ds[4], const void *src,
                          const int64_t ss[4], const int64_t dims[4], size_t es)
{
    int nt = dev->threads;
    /* rows of dims[3] values, split among the threads by row (the box comes
     * collapsed, gp_box_collapse: a concatenation's slice is a few long
     * contiguous rows, one memcpy each) */
    int64_t nrows = dims[0] * dims[1] * dims[2];
    bool contiguous = ds[3] == 1 && ss[3] == 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nrows > 1 && nrows * dims[3] >= CPU_PAR_MIN)
    for (int64_t r = 0; r < nrows; r++) {
        int64_t c = r % dims[2], p = r / dims[2];
        int64_t a = p / dims[1], b = p % dims[1];
        char *d = (char *)dst + (size_t)(a * ds[0] + b * ds[1] + c * ds[2]) * es;
        const char *s = (const char *)src + (size_t)(a * ss[0] + b * ss[1] + c * ss[2]) * es;
        if (contiguous) memcpy(d, s, (size_t)dims[3] * es);
        else
            for (int64_t e = 0; e < dims[3]; e++)
                memcpy(d + (size_t)(e * ds[3]) * es, s + (size_t)(e * ss[3]) * es, es);
    }
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_sumsq(gp_device *dev, const float *x, int64_t n, double *out)
{
    int nt = dev->threads;
    double s = 0.0;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN) reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    *out = s;
    return GP_OK;
}

/* Each tensor as gp_cpu_sumsq sums it (the same bits): host memory is the
 * device's, so nothing is read back. */
gp_status gp_cpu_sumsq_multi(gp_device *dev, const float *const *xs, const int64_t *ns, int n,
                             double *out)
{
    for (int t = 0; t < n; t++) GP_TRY(gp_cpu_sumsq(dev, xs[t], ns[t], &out[t]));
    return GP_OK;
}

gp_status gp_cpu_nonfinite_or(gp_device *dev, const float *x, int64_t n, float *flag)
{
    int bad = 0;
    GP_TRY(gp_cpu_nonfinite(dev, x, n, &bad));
    if (bad) *flag = 1.0f;
    return GP_OK;
}

/* zero_many: every tensor's zeros in one parallel region (each split over
 * the threads, no barrier between them). */
gp_status gp_cpu_zero_many(gp_device *dev, float *const *xs, const int64_t *ns, int count)
{
    int nt = dev->threads;
    int64_t total = 0;
    for (int t = 0; t < count; t++) total += ns[t];
#pragma omp parallel num_threads(nt) if (total >= CPU_PAR_MIN)
    for (int t = 0; t < count; t++) {
        float *x = xs[t];
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < ns[t]; i++) x[i] = 0.0f;
    }
    return GP_OK;
}

gp_status gp_cpu_nonfinite_or_many(gp_device *dev, const float *const *xs, const int64_t *ns,
                                   int count, float *flag)
{
    for (int i = 0; i < count && *flag == 0.0f; i++)
        GP_TRY(gp_cpu_nonfinite_or(dev, xs[i], ns[i], flag));
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_nonfinite(gp_device *dev, const float *x, int64_t n, int *out)
{
    int nt = dev->threads;
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN) reduction(| : bad)
    for (int64_t i = 0; i < n; i++) bad |= gp_ew_nonfinite(x[i]);
    *out = bad;
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_sgd_update(gp_device *dev, float *w, const float *g, float *v,
                            int64_t n, float lr, float mu, float wd, int nesterov)
{
    int nt = dev->threads;
    if (!v) { /* plain SGD: v = g' each step, kept in a register */
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float t = 0.0f;
            gp_ew_sgd(&w[i], g[i], &t, lr, mu, wd, nesterov);
        }
        return GP_OK;
    }
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) gp_ew_sgd(&w[i], g[i], &v[i], lr, mu, wd, nesterov);
    return GP_OK;
}

/* One part's elements split over the region's threads (a worksharing loop
 * inside the caller's parallel region, no barrier after it): UPD updates
 * element i of w, then the part's bf16 mirror gets the new value's
 * rounding and `bad` its finiteness where the part asks (w16, nonfinite):
 * four loops spelt out, so that none tests per element what it writes. */
#define CPU_UPDATE_PART(pt, w, bad, UPD)                                                     \
    do {                                                                                     \
        uint16_t *w16_ = (pt)->w16;                                                          \
        int64_t n_ = (pt)->n;                                                                \
        if (w16_ && (pt)->nonfinite) {                                                       \
            _Pragma("omp for schedule(static) nowait")                                       \
            for (int64_t i = 0; i < n_; i++) {                                               \
                UPD;                                                                         \
                w16_[i] = gp_ew_bf16_bits(w[i]);                                             \
                bad |= gp_ew_nonfinite(w[i]);                                                \
            }                                                                                \
        } else if (w16_) {                                                                   \
            _Pragma("omp for schedule(static) nowait")                                       \
            for (int64_t i = 0; i < n_; i++) {                                               \
                UPD;                                                                         \
                w16_[i] = gp_ew_bf16_bits(w[i]);                                             \
            }                                                                                \
        } else if ((pt)->nonfinite) {                                                        \
            _Pragma("omp for schedule(static) nowait")                                       \
            for (int64_t i = 0; i < n_; i++) {                                               \
                UPD;                                                                         \
                bad |= gp_ew_nonfinite(w[i]);                                                \
            }                                                                                \
        } else {                                                                             \
            _Pragma("omp for schedule(static) nowait")                                       \
            for (int64_t i = 0; i < n_; i++) {                                               \
                UPD;                                                                         \
            }                                                                                \
        }                                                                                    \
    } while (0)

/* The check the parts asked for, once the region is over: their flag. */
static void flag_parts(const gp_update_part *parts, int n, int bad)
{
    for (int p = 0; p < n && bad; p++)
        if (parts[p].nonfinite) *parts[p].nonfinite = 1.0f;
}

/* Every part in one parallel region (each part's elements split over the
 * threads as sgd_update splits them, without a barrier between parts):
 * one fork and join per stage and step instead of one per parameter.  A
 * part's bf16 mirror (w16), the finiteness check of its new values
 * (nonfinite) and clipping's factor (clip; g * 1 is g) in the same pass. */
GP_CPU_LOOPS
gp_status gp_cpu_sgd_multi(gp_device *dev, const gp_update_part *parts, int n, float lr, float mu,
                           int nesterov)
{
    int nt = dev->threads;
    int64_t total = 0;
    int bad = 0;
    for (int p = 0; p < n; p++) total += parts[p].n;
#pragma omp parallel num_threads(nt) if (total >= CPU_PAR_MIN) reduction(| : bad)
    for (int p = 0; p < n; p++) {
        float *w = parts[p].w, *v = parts[p].v, wd = parts[p].wd;
        const float *g = parts[p].g, cf = parts[p].clip > 0.0f ? parts[p].clip : 1.0f;
        float t = 0.0f; /* v NULL: plain SGD, no state */
        if (v)
            CPU_UPDATE_PART(&parts[p], w, bad,
                            gp_ew_sgd(&w[i], g[i] * cf, &v[i], lr, mu, wd, nesterov));
        else
            CPU_UPDATE_PART(&parts[p], w, bad,
                            (t = 0.0f, gp_ew_sgd(&w[i], g[i] * cf, &t, lr, mu, wd, nesterov)));
    }
    flag_parts(parts, n, bad);
    return GP_OK;
}

/* Adam's parts as sgd_multi's: one parallel region, each part split over
 * the threads, no barrier between parts. */
GP_CPU_LOOPS
gp_status gp_cpu_adam_multi(gp_device *dev, const gp_update_part *parts, int n,
                            const gp_adam_step *a)
{
    int nt = dev->threads;
    int64_t total = 0;
    int bad = 0;
    for (int p = 0; p < n; p++) total += parts[p].n;
    gp_adam_step st = *a; /* by value: the loop reads it from a register */
#pragma omp parallel num_threads(nt) if (total >= CPU_PAR_MIN) firstprivate(st) reduction(| : bad)
    for (int p = 0; p < n; p++) {
        float *w = parts[p].w, *m = parts[p].v, *v = parts[p].v2, wd = parts[p].wd;
        const float *g = parts[p].g, cf = parts[p].clip > 0.0f ? parts[p].clip : 1.0f;
        CPU_UPDATE_PART(&parts[p], w, bad, gp_ew_adam(&w[i], g[i] * cf, &m[i], &v[i], &st, wd));
    }
    flag_parts(parts, n, bad);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = gp_ew_relu(x[i]);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_relu_bwd(gp_device *dev, const float *y, const float *dy,
                          float *dx, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dx[i] = gp_ew_relu_bwd(y[i], dy[i]);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_add_bias_rows(gp_device *dev, float *y, const float *bias,
                               int64_t rows, int64_t cols)
{
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * cols;
        for (int64_t j = 0; j < cols; j++) yr[j] += bias[j];
    }
    return GP_OK;
}

/* linear_fwd's pass after the product: y = relu(y + bias), or either
 * alone; the same float operations as add_bias_rows then relu_fwd. */
GP_CPU_LOOPS
static void bias_relu_rows(gp_device *dev, float *y, const float *bias, int64_t rows,
                           int64_t cols)
{
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * cols;
        if (bias)
            for (int64_t j = 0; j < cols; j++) yr[j] = gp_ew_relu(yr[j] + bias[j]);
        else
            for (int64_t j = 0; j < cols; j++) yr[j] = gp_ew_relu(yr[j]);
    }
}

gp_status gp_cpu_linear_fwd(gp_device *dev, int64_t n, int64_t out, int64_t in, const float *x,
                            const float *w, const float *bias, bool relu, float *y)
{
    GP_TRY(gp_cpu_gemm_wb(dev, 0, 1, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out));
    if (relu) bias_relu_rows(dev, y, bias, n, out);
    else if (bias) GP_TRY(gp_cpu_add_bias_rows(dev, y, bias, n, out));
    return GP_OK;
}

/* Columns per task of sum_rows: the partial sums stay in registers / L1. */
#define CPU_SUM_COLS 64

/* One body for both storage types (B16_LD): db += dy's column sums (over:
 * db = them, the fresh step's fill and sums in one pass). */
static inline __attribute__((always_inline)) void
sum_rows_to(const void *dy, float *db, int64_t rows, int64_t cols, const bool b16,
            bool over)
{
    int64_t blocks = (cols + CPU_SUM_COLS - 1) / CPU_SUM_COLS;
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t b = 0; b < blocks; b++) {
        int64_t j0 = b * CPU_SUM_COLS;
        int64_t nj = cols - j0 < CPU_SUM_COLS ? cols - j0 : CPU_SUM_COLS;
        double acc[CPU_SUM_COLS] = {0};
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < nj; j++) acc[j] += (double)B16_LD(dy, r * cols + j0 + j);
        for (int64_t j = 0; j < nj; j++) db[j0 + j] = (over ? 0.0f : db[j0 + j]) + (float)acc[j];
    }
}

static inline __attribute__((always_inline)) void
sum_rows(const void *dy, float *db, int64_t rows, int64_t cols, const bool b16)
{
    sum_rows_to(dy, db, rows, cols, b16, false);
}

GP_CPU_LOOPS
void gp_cpu_col_sums(gp_device *dev, gp_dtype dt, const void *dy, float *db, int64_t rows,
                     int64_t cols, bool over)
{
    GP_CPU_TEAM(dev->threads, rows * cols >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) sum_rows_to(dy, db, rows, cols, true, over);
        else sum_rows_to(dy, db, rows, cols, false, over);
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_sum_rows(gp_device *dev, const float *dy, float *db,
                          int64_t rows, int64_t cols)
{
    GP_CPU_TEAM(dev->threads, rows * cols >= CPU_PAR_MIN)
    sum_rows(dy, db, rows, cols, false);
    return GP_OK;
}

/* sum_rows on bf16 dy: the FP32 slot's sums of the widened values */
GP_CPU_LOOPS
gp_status gp_cpu_sum_rows_bf16(gp_device *dev, const uint16_t *dy, float *db,
                               int64_t rows, int64_t cols)
{
    GP_CPU_TEAM(dev->threads, rows * cols >= CPU_PAR_MIN)
    sum_rows(dy, db, rows, cols, true);
    return GP_OK;
}

/* dst(cols, rows) = src(rows, cols)^T + beta dst (beta == 0 overwrites);
 * row strides lds, ldd; 32 x 32 tiles so both sides use whole cache lines. */
GP_CPU_LOOPS
static void transpose(gp_device *dev, const float *src, int64_t rows, int64_t cols, int64_t lds,
                      float beta, float *dst, int64_t ldd)
{
    const int64_t T = 32;
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && rows * cols >= CPU_PAR_MIN)
    for (int64_t c0 = 0; c0 < cols; c0 += T)
        for (int64_t r0 = 0; r0 < rows; r0 += T)
            for (int64_t c = c0; c < c0 + T && c < cols; c++) {
                float *d = dst + c * ldd;
                if (beta == 0.0f)
                    for (int64_t r = r0; r < r0 + T && r < rows; r++) d[r] = src[r * lds + c];
                else
                    for (int64_t r = r0; r < r0 + T && r < rows; r++)
                        d[r] = src[r * lds + c] + beta * d[r];
            }
}

/*
 * C(m, n) = alpha A(m, k) B(n, k)^T + beta C, for a short wide C (m <= n/2):
 * a linear layer's forward, x(batch, in) W(out, in)^T, with the batch as m.
 * oneDNN's sgemm runs this "NT" shape slowly when m is small (measured on
 * AVX-512, 2 threads, k = n = 2048: 142 GFLOP/s at m = 32, 323 at m = 256),
 * but the transposed product C^T = B A^T as a plain "NN" gemm with m and n
 * swapped at 341 and 393 GFLOP/s.  So: A^T and C^T go through the arena
 * (m (k + n) floats, small because m is), C^T = B A^T, then C from C^T.
 * The two transposes move 4 m (k + n) bytes, about 1% of the gemm's time at
 * these sizes.  Returns false (caller runs the plain call) when the arena
 * cannot grow, e.g. under a device memory capacity.
 *
 * oneDNN's AVX2 kernels see it the other way round: on an AVX2-only AMD
 * EPYC (Zen 3, 2 threads, n = k = 512-4096) the plain NT call is faster
 * from m = 32 on (1.05-1.9x at m 64-512; the mlp's 256 x 2048 x 2048
 * forward 133 GFLOP/s against 92 transposed) and slower only below (1.1-1.5x
 * at m = 16): so where CPU devices compute in AVX2 (gp_cpu_isa_has, the one
 * switch), only m < 32 runs transposed.  A function of the shape and the
 * instruction set only, so every device of a run takes the same path.
 */
static bool wide_nt_worth(int64_t m, int64_t n, int64_t k)
{
    if (2 * m > n || k < 64) return false;
    return m < 32 || gp_cpu_isa_has(dnnl_cpu_isa_avx512_core);
}

static bool gemm_wide_nt(gp_device *dev, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc)
{
    size_t need = (size_t)(m * k + m * n) * sizeof(float);
    if (gp_cpu_arena_reserve(dev, need) != GP_OK) return false;
    float *at = gp_cpu_ctx_of(dev)->arena, *ct = at + m * k;
    transpose(dev, a, m, k, lda, 0.0f, at, m);
    if (dnnl_sgemm('N', 'N', n, m, k, alpha, b, ldb, at, m, 0.0f, ct, m) != dnnl_success)
        return false;
    transpose(dev, ct, n, m, m, beta, c, ldc);
    return true;
}

/* The gemm and gemm_wb slots: b_weights says B is frozen weights. */
static gp_status gemm(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc, bool b_weights)
{
    if (m == 0 || n == 0) return GP_OK;
    if (k == 0) {
        /* op(A) op(B) is zero: C = beta * C (beta == 0 overwrites NaNs too). */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return GP_OK;
    }
    gp_cpu_enter(dev);
    /* precision bf16: products of any size worth converting for */
    if (gp_cpu_ctx_of(dev)->bf16 && gp_bf16_gemm_worth(m, n, k))
        return gp_cpu_gemm_bf16(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                ldc, b_weights);
    if (!trans_a && trans_b && wide_nt_worth(m, n, k) &&
        gemm_wide_nt(dev, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
        return GP_OK;
    GP_DNNL_RET(dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                           a, lda, b, ldb, beta, c, ldc));
    return GP_OK;
}

gp_status gp_cpu_gemm(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc)
{
    return gemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, false);
}

gp_status gp_cpu_gemm_wb(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                         int64_t ldb, float beta, float *c, int64_t ldc)
{
    return gemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, true);
}

/* gp_ew_row_logsumexp's sum through gp_cpu_exp_d, in 8 running sums
 * (element j to sum j % 8, added in a fixed tree at the end): the same
 * bits from every clone, whose vectors hold 2, 4 or 8 of them. */
static inline __attribute__((always_inline)) double cpu_row_logsumexp(const float *x,
                                                                     int64_t cols, float max)
{
    double acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8)
#pragma omp simd
        for (int l = 0; l < 8; l++) acc[l] += gp_cpu_exp_d((double)(x[j + l] - max));
    for (int l = 0; j + l < cols; l++) acc[l] += gp_cpu_exp_d((double)(x[j + l] - max));
    return log(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
}

/* gp_ew_row_max's maximum and first index of it, in two passes that
 * vectorise: 8 running maxima (NaN never wins a comparison, as there), then
 * the first element equal to it.  The same answer (a set's maximum does not
 * depend on the order it is taken in): x[0] where it is NaN, else the
 * largest of the others. */
static inline __attribute__((always_inline)) float cpu_row_max(const float *x, int64_t cols,
                                                              int64_t *argmax)
{
    float mv[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                   -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t j = 1;
    for (; j + 8 <= cols; j += 8)
#pragma omp simd
        for (int l = 0; l < 8; l++) mv[l] = x[j + l] > mv[l] ? x[j + l] : mv[l];
    for (int l = 0; j + l < cols; l++) mv[l] = x[j + l] > mv[l] ? x[j + l] : mv[l];
    float m = x[0];
    for (int l = 0; l < 8; l++) m = mv[l] > m ? mv[l] : m;
    int64_t a = 0;
    while (m == m && x[a] != m) a++; /* (found: m is one of them) */
    *argmax = a;
    return m;
}

/* One row of the cross-entropy: x (cols logits, ld apart from the next
 * row's), the loss added to *loss, whether the first maximum is the label
 * to *hits, the gradient (padding zeroed) into g where not NULL.  The
 * formulas of elementwise.h, with the exponentials of gp_cpu_exp_d (the C
 * library's exp, a call per logit, was 4% of tiny-gpt's step). */
static inline __attribute__((always_inline)) void
xent_row(const float *x, int64_t cols, int64_t ld, int64_t label, float scale, float smoothing,
         float *g, double *loss, int64_t *hits)
{
    int64_t argmax;
    float max = cpu_row_max(x, cols, &argmax);
    double lse = cpu_row_logsumexp(x, cols, max);
    if (smoothing == 0.0f)
        *loss += gp_ew_xent_loss(x, label, max, lse);
    else
        *loss += gp_ew_xent_loss_ls(x, label, max, lse, gp_ew_row_shift_sum(x, cols, max), cols,
                                    smoothing);
    /* gp_ew_xent_grad_ls: the target eps / cols, 1 - eps + eps / cols on the
     * label (eps = 0: 0 and 1, gp_ew_xent_grad_one's bits) */
    double qo = (double)smoothing / (double)cols, ql = (1.0 - (double)smoothing) + qo;
    if (g)
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) {
            double p = gp_cpu_exp_d((double)(x[j] - max) - lse);
            g[j] = (float)((p - (j == label ? ql : qo)) * (double)scale);
        }
    for (int64_t j = cols; g && j < ld; j++) g[j] = 0.0f; /* padding */
    *hits += argmax == label;
}

static int64_t first_bad_label(const float *labels, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        if (!gp_ew_label_ok(labels[r], cols)) return r;
    return -1;
}

GP_CPU_LOOPS
gp_status gp_cpu_xent(gp_device *dev, const float *logits, const float *labels,
                      int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                      float *dlogits, double *loss_sum, int64_t *correct, int64_t *bad_row)
{
    *loss_sum = 0.0;
    *correct = 0;
    *bad_row = first_bad_label(labels, rows, cols);
    if (*bad_row >= 0 || cols <= 0) return GP_OK;
    int nt = dev->threads;
    double loss = 0.0;
    int64_t hits = 0;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= CPU_PAR_MIN) \
    reduction(+ : loss, hits)
    for (int64_t r = 0; r < rows; r++)
        xent_row(logits + r * ld, cols, ld, (int64_t)labels[r], scale, smoothing,
                 dlogits ? dlogits + r * ld : NULL, &loss, &hits);
    *loss_sum = loss;
    *correct = hits;
    return GP_OK;
}

/* xent_bf16 (backend.h): each row widened into an FP32 tile of its
 * thread's (the arena), xent_row on it, its gradient rounded once; the
 * same threads and reduction as gp_cpu_xent, so the same loss bits. */
GP_CPU_LOOPS
gp_status gp_cpu_xent_bf16(gp_device *dev, const uint16_t *logits, const float *labels,
                           int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                           uint16_t *dlogits, gp_loss_result *out)
{
    *out = (gp_loss_result){.bad = first_bad_label(labels, rows, cols)};
    if (out->bad >= 0 || cols <= 0 || rows <= 0) return GP_OK;
    const int nt = dev->threads;
    const bool par = rows * cols >= CPU_PAR_MIN;
    GP_TRY(gp_cpu_arena_reserve(dev, (size_t)(par ? nt : 1) * 2 * (size_t)ld * sizeof(float)));
    float *arena = gp_cpu_ctx_of(dev)->arena;
    double loss = 0.0;
    int64_t hits = 0;
#pragma omp parallel for schedule(static) num_threads(nt) if (par) reduction(+ : loss, hits)
    for (int64_t r = 0; r < rows; r++) {
        float *x = arena + (size_t)omp_get_thread_num() * 2 * (size_t)ld, *g = x + ld;
        gp_cpu_widen_run(x, logits + r * ld, cols);
        xent_row(x, cols, ld, (int64_t)labels[r], scale, smoothing, dlogits ? g : NULL, &loss,
                 &hits);
        if (dlogits) gp_cpu_round_run(dlogits + r * ld, g, ld);
    }
    out->loss_sum = loss;
    out->correct = hits;
    return GP_OK;
}

/* Elements per dropout task: a multiple of 4 so each Philox call serves
 * four consecutive elements. */
#define CPU_DROPOUT_CHUNK 4096

GP_CPU_LOOPS
gp_status gp_cpu_dropout_mask(gp_device *dev, float *mask, int64_t n, float p,
                              uint64_t seed, uint64_t stream, uint64_t first)
{
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t c0 = 0; c0 < n; c0 += CPU_DROPOUT_CHUNK) {
        int64_t len = n - c0 < CPU_DROPOUT_CHUNK ? n - c0 : CPU_DROPOUT_CHUNK;
        float *m = mask + c0;
        gp_rng_uniform_fill(seed, stream, first + (uint64_t)c0, m, len);
        for (int64_t i = 0; i < len; i++) m[i] = gp_ew_dropout(m[i], p);
    }
    return GP_OK;
}

/* dropout_mask's chunks, multiplied into x as they are drawn: the mask
 * lives in a chunk on the stack, never in memory of its own. */
static inline __attribute__((always_inline)) void
dropout_apply(const void *x, void *y, int64_t n, float p, uint64_t seed,
              uint64_t stream, uint64_t first, const bool b16)
{
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t c0 = 0; c0 < n; c0 += CPU_DROPOUT_CHUNK) {
        float m[CPU_DROPOUT_CHUNK];
        int64_t len = n - c0 < CPU_DROPOUT_CHUNK ? n - c0 : CPU_DROPOUT_CHUNK;
        gp_rng_uniform_fill(seed, stream, first + (uint64_t)c0, m, len);
        for (int64_t i = 0; i < len; i++)
            B16_ST(y, c0 + i, B16_LD(x, c0 + i) * gp_ew_dropout(m[i], p));
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_dropout_apply(gp_device *dev, const float *x, float *y, int64_t n, float p,
                               uint64_t seed, uint64_t stream, uint64_t first)
{
    GP_CPU_TEAM(dev->threads, n >= CPU_PAR_MIN)
    dropout_apply(x, y, n, p, seed, stream, first, false);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_dropout_apply_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                    float p, uint64_t seed, uint64_t stream, uint64_t first)
{
    GP_CPU_TEAM(dev->threads, n >= CPU_PAR_MIN)
    dropout_apply(x, y, n, p, seed, stream, first, true);
    return GP_OK;
}

/* ---- bfloat16 conversions (pipeline copies in bf16) ------------------------ */

GP_CPU_LOOPS
gp_status gp_cpu_bf16_pack(gp_device *dev, uint16_t *dst, const float *src, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = gp_ew_bf16_bits(src[i]);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_bf16_unpack(gp_device *dev, float *dst, const uint16_t *src, int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = gp_ew_bf16_value(src[i]);
    return GP_OK;
}

/* ---- Transformer: layer norm (a row per task; the weights a block of
 * columns per task)
 * One body for both storage types (B16_LD, B16_ST): x, y, dy and dx.
 * A row's sums are in double, in LN_LANES lanes (element j into lane
 * j mod LN_LANES, the tail past the last whole group into lane 0 after
 * them) added in a fixed tree, so they vectorise and their bits do not
 * depend on the thread count.  The weights' sums run over the rows in
 * order, a column per lane, a block of columns per task. */

#define LN_LANES 8

/* The fixed-order total of LN_LANES lanes. */
static inline __attribute__((always_inline)) double ln_total(const double *l)
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* One row r of the layer norm's forward (ln_fwd; add_ln_fwd after the
 * row's sum). */
static inline __attribute__((always_inline)) void
ln_fwd_row(const void *x, const float *w, const float *b, void *y, float *mean, float *rstd,
           int64_t r, int64_t c, float eps, const bool b16)
{
    const int64_t o = r * c, cw = c / LN_LANES * LN_LANES;
    double s[LN_LANES] = {0}, v[LN_LANES] = {0};
    for (int64_t j = 0; j < cw; j += LN_LANES)
#pragma omp simd
        for (int k = 0; k < LN_LANES; k++) s[k] += (double)B16_LD(x, o + j + k);
    for (int64_t j = cw; j < c; j++) s[0] += (double)B16_LD(x, o + j);
    double m = ln_total(s) / (double)c;
    for (int64_t j = 0; j < cw; j += LN_LANES)
#pragma omp simd
        for (int k = 0; k < LN_LANES; k++) {
            double d = (double)B16_LD(x, o + j + k) - m;
            v[k] += d * d;
        }
    for (int64_t j = cw; j < c; j++) {
        double d = (double)B16_LD(x, o + j) - m;
        v[0] += d * d;
    }
    float mf = (float)m, rs = gp_ew_ln_rstd(ln_total(v) / (double)c, eps);
#pragma omp simd
    for (int64_t j = 0; j < c; j++) B16_ST(y, o + j, (B16_LD(x, o + j) - mf) * rs * w[j] + b[j]);
    mean[r] = mf;
    rstd[r] = rs;
}

static inline __attribute__((always_inline)) void
ln_fwd(const void *x, const float *w, const float *b, void *y, float *mean, float *rstd,
       int64_t rows, int64_t c, float eps, const bool b16)
{
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++) ln_fwd_row(x, w, b, y, mean, rstd, r, c, eps, b16);
}

/* add_layer_norm_fwd: a row's sum s = a + b (rounded as stored: add's and
 * add_bf16's bits), then the norm of that row as ln_fwd reads it, while it
 * is in cache: one pass over the activations instead of two. */
static inline __attribute__((always_inline)) void
add_ln_fwd(const void *a, const void *bs, void *s, const float *w, const float *b,
           void *y, float *mean, float *rstd, int64_t rows, int64_t c, float eps, const bool b16)
{
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * c;
#pragma omp simd
        for (int64_t j = 0; j < c; j++) B16_ST(s, o + j, B16_LD(a, o + j) + B16_LD(bs, o + j));
        ln_fwd_row(s, w, b, y, mean, rstd, r, c, eps, b16);
    }
}

/* acc: dx += the gradient, as gp_layers_accumulate adds a gradient of
 * dx's type into dx (bf16: the gradient rounded first, the sum in FP32
 * rounded once). */
static inline __attribute__((always_inline)) void
ln_bwd_data(const void *x, const float *w, const float *mean, const float *rstd,
            const void *dy, void *dx, int64_t rows, int64_t c, const bool b16, const bool acc)
{
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * c, cw = c / LN_LANES * LN_LANES;
        float mf = mean[r], rs = rstd[r];
        double sg[LN_LANES] = {0}, sgx[LN_LANES] = {0};
        for (int64_t j = 0; j < cw; j += LN_LANES)
#pragma omp simd
            for (int k = 0; k < LN_LANES; k++) {
                float g = B16_LD(dy, o + j + k) * w[j + k];
                sg[k] += (double)g;
                sgx[k] += (double)g * (double)((B16_LD(x, o + j + k) - mf) * rs);
            }
        for (int64_t j = cw; j < c; j++) {
            float g = B16_LD(dy, o + j) * w[j];
            sg[0] += (double)g;
            sgx[0] += (double)g * (double)((B16_LD(x, o + j) - mf) * rs);
        }
        float a = (float)(ln_total(sg) / (double)c), bb = (float)(ln_total(sgx) / (double)c);
        if (acc) {
#pragma omp simd
            for (int64_t j = 0; j < c; j++) {
                float v = rs * (B16_LD(dy, o + j) * w[j] - a - (B16_LD(x, o + j) - mf) * rs * bb);
                if (b16) v = gp_ew_bf16_value(gp_ew_bf16_bits(v));
                B16_ST(dx, o + j, B16_LD(dx, o + j) + v);
            }
            continue;
        }
#pragma omp simd
        for (int64_t j = 0; j < c; j++)
            B16_ST(dx, o + j,
                  rs * (B16_LD(dy, o + j) * w[j] - a - (B16_LD(x, o + j) - mf) * rs * bb));
    }
}

/* Columns per task of the weights' sums: each task walks every row, in
 * order, over its block of columns (contiguous reads; each column's sum the
 * same order as a column at a time). */
#define LN_COLS 64

static inline __attribute__((always_inline)) void
ln_bwd_weights(const void *x, const float *mean, const float *rstd, const void *dy,
               float *dw, float *db, int64_t rows, int64_t c, const bool b16)
{
    const int64_t blocks = (c + LN_COLS - 1) / LN_COLS;
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t bk = 0; bk < blocks; bk++) {
        const int64_t j0 = bk * LN_COLS, nj = c - j0 < LN_COLS ? c - j0 : LN_COLS;
        double sw[LN_COLS] = {0}, sb[LN_COLS] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float mr = mean[r], rr = rstd[r];
            const int64_t o = r * c + j0;
#pragma omp simd
            for (int64_t k = 0; k < nj; k++) {
                float g = B16_LD(dy, o + k);
                sw[k] += (double)g * (double)((B16_LD(x, o + k) - mr) * rr);
                sb[k] += (double)g;
            }
        }
        for (int64_t k = 0; k < nj; k++) {
            dw[j0 + k] += (float)sw[k];
            db[j0 + k] += (float)sb[k];
        }
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_layer_norm_fwd(gp_device *dev, const float *x, const float *w, const float *b,
                                float *y, float *mean, float *rstd, int64_t rows, int64_t c,
                                float eps)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    ln_fwd(x, w, b, y, mean, rstd, rows, c, eps, false);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_layer_norm_bwd_data(gp_device *dev, const float *x, const float *w,
                                     const float *mean, const float *rstd, const float *dy,
                                     float *dx, int64_t rows, int64_t c)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    ln_bwd_data(x, w, mean, rstd, dy, dx, rows, c, false, false);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_layer_norm_bwd_weights(gp_device *dev, const float *x, const float *mean,
                                        const float *rstd, const float *dy, float *dw,
                                        float *db, int64_t rows, int64_t c)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    ln_bwd_weights(x, mean, rstd, dy, dw, db, rows, c, false);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_layer_norm_fwd_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                     const float *b, uint16_t *y, float *mean, float *rstd,
                                     int64_t rows, int64_t c, float eps)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    ln_fwd(x, w, b, y, mean, rstd, rows, c, eps, true);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_layer_norm_bwd_data_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                          const float *mean, const float *rstd,
                                          const uint16_t *dy, uint16_t *dx, int64_t rows,
                                          int64_t c)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    ln_bwd_data(x, w, mean, rstd, dy, dx, rows, c, true, false);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_layer_norm_bwd_weights_bf16(gp_device *dev, const uint16_t *x,
                                             const float *mean, const float *rstd,
                                             const uint16_t *dy, float *dw, float *db,
                                             int64_t rows, int64_t c)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    ln_bwd_weights(x, mean, rstd, dy, dw, db, rows, c, true);
    return GP_OK;
}

/* ---- RMSNorm (Llama's): a row per task, its sums in LN_LANES double lanes
 * as the layer norm's; the weight's sums over rows in order, a block of
 * columns per task ---------------------------------------------------------- */

static inline __attribute__((always_inline)) void
rms_fwd(const void *x, const float *w, void *y, float *rstd, int64_t rows, int64_t c,
        float eps, const bool b16)
{
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * c, cw = c / LN_LANES * LN_LANES;
        double s[LN_LANES] = {0};
        for (int64_t j = 0; j < cw; j += LN_LANES)
#pragma omp simd
            for (int k = 0; k < LN_LANES; k++) {
                double v = (double)B16_LD(x, o + j + k);
                s[k] += v * v;
            }
        for (int64_t j = cw; j < c; j++) {
            double v = (double)B16_LD(x, o + j);
            s[0] += v * v;
        }
        float rs = gp_ew_ln_rstd(ln_total(s) / (double)c, eps);
#pragma omp simd
        for (int64_t j = 0; j < c; j++) B16_ST(y, o + j, B16_LD(x, o + j) * rs * w[j]);
        rstd[r] = rs;
    }
}

static inline __attribute__((always_inline)) void
rms_bwd_data(const void *x, const float *w, const float *rstd, const void *dy, void *dx,
             int64_t rows, int64_t c, const bool b16)
{
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * c, cw = c / LN_LANES * LN_LANES;
        float rs = rstd[r];
        double s[LN_LANES] = {0};
        for (int64_t j = 0; j < cw; j += LN_LANES)
#pragma omp simd
            for (int k = 0; k < LN_LANES; k++)
                s[k] += (double)(B16_LD(dy, o + j + k) * w[j + k]) *
                        (double)B16_LD(x, o + j + k);
        for (int64_t j = cw; j < c; j++)
            s[0] += (double)(B16_LD(dy, o + j) * w[j]) * (double)B16_LD(x, o + j);
        float k2 = (float)(ln_total(s) / (double)c) * rs * rs;
#pragma omp simd
        for (int64_t j = 0; j < c; j++)
            B16_ST(dx, o + j, rs * (B16_LD(dy, o + j) * w[j] - B16_LD(x, o + j) * k2));
    }
}

static inline __attribute__((always_inline)) void
rms_bwd_weights(const void *x, const float *rstd, const void *dy, float *dw, int64_t rows,
                int64_t c, const bool b16)
{
    const int64_t blocks = (c + LN_COLS - 1) / LN_COLS;
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t bk = 0; bk < blocks; bk++) {
        const int64_t j0 = bk * LN_COLS, nj = c - j0 < LN_COLS ? c - j0 : LN_COLS;
        double sw[LN_COLS] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float rr = rstd[r];
            const int64_t o = r * c + j0;
#pragma omp simd
            for (int64_t k = 0; k < nj; k++)
                sw[k] += (double)B16_LD(dy, o + k) * (double)(B16_LD(x, o + k) * rr);
        }
        for (int64_t k = 0; k < nj; k++) dw[j0 + k] += (float)sw[k];
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_rms_norm_fwd(gp_device *dev, gp_dtype dt, const void *x, const float *w, void *y,
                              float *rstd, int64_t rows, int64_t c, float eps)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) rms_fwd(x, w, y, rstd, rows, c, eps, true);
        else rms_fwd(x, w, y, rstd, rows, c, eps, false);
    }
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_rms_norm_bwd_data(gp_device *dev, gp_dtype dt, const void *x, const float *w,
                                   const float *rstd, const void *dy, void *dx, int64_t rows,
                                   int64_t c)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) rms_bwd_data(x, w, rstd, dy, dx, rows, c, true);
        else rms_bwd_data(x, w, rstd, dy, dx, rows, c, false);
    }
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_rms_norm_bwd_weights(gp_device *dev, gp_dtype dt, const void *x,
                                      const float *rstd, const void *dy, float *dw, int64_t rows,
                                      int64_t c)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) rms_bwd_weights(x, rstd, dy, dw, rows, c, true);
        else rms_bwd_weights(x, rstd, dy, dw, rows, c, false);
    }
    return GP_OK;
}

/* ---- rotary position embeddings (issue 66) --------------------------------- */

/* The t positions' cosines and sines (t x d/2 each) once a call, then
 * every sequence and head turned by them. */
static inline __attribute__((always_inline)) void
rope_rows(const gp_rope_desc *d, bool inverse, const void *x, void *y, const float *cs,
          const bool b16)
{
    const int64_t half = d->d / 2, rot = d->heads * d->d, n = d->rows * d->t;
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < n; r++) {
        const float *c = cs + (r % d->t) * 2 * half, *s = c + half;
        const int64_t o = r * d->width;
        for (int64_t h = 0; h < d->heads; h++)
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                int64_t ia = o + h * d->d + i, ib = ia + half;
                float ya, yb;
                gp_ew_rope(B16_LD(x, ia), B16_LD(x, ib), c[i], s[i], inverse, &ya, &yb);
                B16_ST(y, ia, ya);
                B16_ST(y, ib, yb);
            }
        if (x != y)
            memcpy((char *)y + (size_t)(o + rot) * (b16 ? 2 : 4),
                   (const char *)x + (size_t)(o + rot) * (b16 ? 2 : 4),
                   (size_t)(d->width - rot) * (b16 ? 2 : 4));
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_rope(gp_device *dev, gp_dtype dt, const gp_rope_desc *d, bool inverse,
                      const void *x, void *y)
{
    const int64_t half = d->d / 2;
    float *cs = malloc((size_t)(d->t * 2 * half) * sizeof *cs);
    if (!cs) return gp_error_set(GP_ERR_OOM, "out of host memory for rope's table");
    for (int64_t p = 0; p < d->t; p++)
        for (int64_t i = 0; i < half; i++)
            gp_ew_rope_cs(d->pos0 + p, d->inv_freq[i], &cs[p * 2 * half + i],
                          &cs[p * 2 * half + half + i]);
    GP_CPU_TEAM(dev->threads, d->rows * d->t * d->width >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) rope_rows(d, inverse, x, y, cs, true);
        else rope_rows(d, inverse, x, y, cs, false);
    }
    free(cs);
    return GP_OK;
}

/* ---- SwiGLU (Llama's MLP activation): element by element ------------------ */

/* sigmoid(a) through gp_cpu_exp, which vectorises (gp_ew_sigmoid's expf
 * is a library call per value); the rest is gp_ew_swiglu_s's. */
static inline __attribute__((always_inline)) float cpu_sigmoid(float a)
{
    return 1.0f / (1.0f + gp_cpu_exp(-a));
}

/* Rows [r0, r1): the forward (dy NULL) or the backward.  Its own
 * GP_CPU_LOOPS function, called from the parallel region: an OpenMP
 * region's outlined body does not inherit its caller's target clones, and
 * built for the baseline ISA gp_cpu_exp's fmaf is a library call. */
static inline __attribute__((always_inline)) void
swiglu_rows(const void *x, const void *dy, void *out, int64_t r0, int64_t r1, int64_t h,
            const bool b16)
{
    for (int64_t r = r0; r < r1; r++) {
        if (!dy) {
#pragma omp simd
            for (int64_t j = 0; j < h; j++) {
                float a = B16_LD(x, r * 2 * h + j), b = B16_LD(x, r * 2 * h + h + j);
                B16_ST(out, r * h + j, gp_ew_swiglu_s(a, b, cpu_sigmoid(a)));
            }
            continue;
        }
#pragma omp simd
        for (int64_t j = 0; j < h; j++) {
            float a = B16_LD(x, r * 2 * h + j), b = B16_LD(x, r * 2 * h + h + j), da, db;
            gp_ew_swiglu_bwd_s(a, b, B16_LD(dy, r * h + j), cpu_sigmoid(a), &da, &db);
            B16_ST(out, r * 2 * h + j, da);
            B16_ST(out, r * 2 * h + h + j, db);
        }
    }
}

GP_CPU_LOOPS
static void swiglu_rows_f32(const void *x, const void *dy, void *out, int64_t r0, int64_t r1,
                            int64_t h)
{
    swiglu_rows(x, dy, out, r0, r1, h, false);
}

GP_CPU_LOOPS
static void swiglu_rows_b16(const void *x, const void *dy, void *out, int64_t r0, int64_t r1,
                            int64_t h)
{
    swiglu_rows(x, dy, out, r0, r1, h, true);
}

static void swiglu_run(gp_device *dev, gp_dtype dt, const void *x, const void *dy, void *out,
                       int64_t rows, int64_t h)
{
    int nt = dev->threads;
    if (rows * h < CPU_PAR_MIN) nt = 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int k = 0; k < nt; k++) {
        int64_t r0 = rows * k / nt, r1 = rows * (k + 1) / nt;
        if (dt == GP_BF16) swiglu_rows_b16(x, dy, out, r0, r1, h);
        else swiglu_rows_f32(x, dy, out, r0, r1, h);
    }
}

gp_status gp_cpu_swiglu_fwd(gp_device *dev, gp_dtype dt, const void *x, void *y, int64_t rows,
                            int64_t h)
{
    swiglu_run(dev, dt, x, NULL, y, rows, h);
    return GP_OK;
}

gp_status gp_cpu_swiglu_bwd(gp_device *dev, gp_dtype dt, const void *x, const void *dy, void *dx,
                            int64_t rows, int64_t h)
{
    swiglu_run(dev, dt, x, dy, dx, rows, h);
    return GP_OK;
}

/* ---- GELU (GPT-2's tanh form): element by element ------------------------
 * 0.5 x (1 + tanh(u)) is x sigmoid(2 u), u = sqrt(2 / pi) (x + 0.044715 x^3)
 * (1 + tanh(u) = 2 / (1 + e^-2u)); its derivative s + 2 x s (1 - s) u'
 * with s = sigmoid(2 u), u' = sqrt(2 / pi) (1 + 3 0.044715 x^2): the tanh
 * form's 0.5 (1 + t) + 0.5 x (1 - t^2) u', as 1 - t^2 = 4 s (1 - s).  e^-2u
 * through gp_cpu_exp, so the loops vectorise.  Until 2026-11 this was
 * oneDNN's eltwise gelu_tanh, whose tanh gathers its polynomial's
 * coefficients a lane at a time (vgatherdps): on an AVX2-only AMD EPYC
 * (Zen 3, whose gathers are slow) a forward over tiny-gpt's 4096 x 512
 * values took 7-12 ms on 2 threads, the same library's erf form 1.6-2, and
 * the GELU passes were 17% of the step (bench/README.md, "GELU without
 * oneDNN's gathers").  The sigmoid form is also the more accurate one
 * where x is well below 0: 1 + tanh(u) there cancels to a few bits.
 * One loop for every processor: fmaf and -ffp-contract=off give every ISA
 * clone (and thread count: element by element) the same bits. */
static inline __attribute__((always_inline)) float cpu_gelu_s(float x)
{
    float m = -2.0f * GP_EW_GELU_K * (x + GP_EW_GELU_C * x * x * x);
    float s = 1.0f / (1.0f + gp_cpu_exp(m));
    /* past gp_cpu_exp's clamp (x below about -9.8) sigmoid(2u) is under
     * e^-88: 0, so y is -0 there as the tanh form's is (and NaN at -inf) */
    return m > 88.0f ? 0.0f : s;
}

/* Values [i0, i1): the forward (dy NULL: out = gelu(x)) or the backward
 * (out = dy gelu'(x)); out may be x or dy.  As swiglu_rows, its own
 * GP_CPU_LOOPS functions called from the parallel region. */
static inline __attribute__((always_inline)) void
gelu_span(const void *x, const void *dy, void *out, int64_t i0, int64_t i1, const bool b16)
{
    if (!dy) {
#pragma omp simd
        for (int64_t i = i0; i < i1; i++) {
            float v = B16_LD(x, i);
            B16_ST(out, i, v * cpu_gelu_s(v));
        }
        return;
    }
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float v = B16_LD(x, i), s = cpu_gelu_s(v), q = s * (1.0f - s);
        float du = GP_EW_GELU_K * (1.0f + 3.0f * GP_EW_GELU_C * v * v);
        /* (q is 0 where s saturates: the term is 0, not 0 x inf where v^2
         * overflows) */
        float g = q == 0.0f ? 0.0f : 2.0f * v * q * du;
        B16_ST(out, i, B16_LD(dy, i) * (s + g));
    }
}

GP_CPU_LOOPS
static void gelu_span_f32(const void *x, const void *dy, void *out, int64_t i0, int64_t i1)
{
    gelu_span(x, dy, out, i0, i1, false);
}

GP_CPU_LOOPS
static void gelu_span_b16(const void *x, const void *dy, void *out, int64_t i0, int64_t i1)
{
    gelu_span(x, dy, out, i0, i1, true);
}

static void gelu_run(gp_device *dev, bool b16, const void *x, const void *dy, void *out,
                     int64_t n)
{
    int nt = n < CPU_PAR_MIN ? 1 : dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int k = 0; k < nt; k++) {
        int64_t i0 = n * k / nt, i1 = n * (k + 1) / nt;
        if (b16) gelu_span_b16(x, dy, out, i0, i1);
        else gelu_span_f32(x, dy, out, i0, i1);
    }
}

gp_status gp_cpu_gelu_fwd(gp_device *dev, const float *x, float *y, int64_t n)
{
    gelu_run(dev, false, x, NULL, y, n);
    return GP_OK;
}

gp_status gp_cpu_gelu_bwd(gp_device *dev, const float *x, const float *dy, float *dx, int64_t n)
{
    gelu_run(dev, false, x, dy, dx, n);
    return GP_OK;
}

/* act_bf16's GELU (dy NULL: forward): the FP32 slot's arithmetic on the
 * widened values, each result rounded once. */
gp_status gp_cpu_gelu_bf16(gp_device *dev, const uint16_t *x, const uint16_t *dy, uint16_t *out,
                           int64_t n)
{
    gelu_run(dev, true, x, dy, out, n);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_add_layer_norm_fwd(gp_device *dev, gp_dtype dt, const void *a, const void *b,
                                    void *s, const float *w, const float *bias, void *y,
                                    float *mean, float *rstd, int64_t rows, int64_t c, float eps)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) add_ln_fwd(a, b, s, w, bias, y, mean, rstd, rows, c, eps, true);
        else add_ln_fwd(a, b, s, w, bias, y, mean, rstd, rows, c, eps, false);
    }
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_layer_norm_bwd_data_add(gp_device *dev, gp_dtype dt, const void *x,
                                         const float *w, const float *mean, const float *rstd,
                                         const void *dy, void *dx, int64_t rows, int64_t c)
{
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) ln_bwd_data(x, w, mean, rstd, dy, dx, rows, c, true, true);
        else ln_bwd_data(x, w, mean, rstd, dy, dx, rows, c, false, true);
    }
    return GP_OK;
}

/* ---- Transformer: token and position embeddings --------------------------- */

static inline __attribute__((always_inline)) void
embed_fwd(const float *ids, const float *wte, const float *wpe, void *y, int64_t rows,
          int64_t t, int64_t c, const bool b16)
{
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++) {
        const float *e = wte + (int64_t)ids[r] * c;
        if (!wpe) { /* no position table (Llama's rotary positions) */
            for (int64_t j = 0; j < c; j++) B16_ST(y, r * c + j, e[j]);
            continue;
        }
        const float *p = wpe + (r % t) * c;
        for (int64_t j = 0; j < c; j++) B16_ST(y, r * c + j, e[j] + p[j]);
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_embed_fwd(gp_device *dev, const float *ids, const float *wte, const float *wpe,
                           gp_dtype dt, void *y, int64_t n, int64_t t, int64_t c, int64_t vocab,
                           int64_t *bad)
{
    int64_t rows = n * t;
    *bad = -1;
    for (int64_t r = 0; r < rows; r++) /* !(in range) also catches NaN */
        if (!(ids[r] >= 0.0f && ids[r] < (float)vocab) || ids[r] != floorf(ids[r])) {
            *bad = r;
            return GP_OK;
        }
    GP_CPU_TEAM(dev->threads, rows * c >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) embed_fwd(ids, wte, wpe, y, rows, t, c, true);
        else embed_fwd(ids, wte, wpe, y, rows, t, c, false);
    }
    return GP_OK;
}

/* A block of columns per task, every row in order within it: two tasks
 * never add into the same element, and each sum has one order. */
static inline __attribute__((always_inline)) void
embed_bwd(const float *ids, const void *dy, float *dwte, float *dwpe, int64_t n,
          int64_t t, int64_t c, const bool b16)
{
    const int64_t blk = 16, nb = (c + blk - 1) / blk;
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t b = 0; b < nb; b++) {
        int64_t j0 = b * blk, j1 = j0 + blk < c ? j0 + blk : c;
        for (int64_t r = 0; r < n * t; r++) {
            float *e = dwte + (int64_t)ids[r] * c;
            if (!dwpe) {
                for (int64_t j = j0; j < j1; j++) e[j] += B16_LD(dy, r * c + j);
                continue;
            }
            float *p = dwpe + (r % t) * c;
            for (int64_t j = j0; j < j1; j++) {
                float g = B16_LD(dy, r * c + j);
                e[j] += g;
                p[j] += g;
            }
        }
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_embed_bwd(gp_device *dev, const float *ids, gp_dtype dt, const void *dy,
                           float *dwte, float *dwpe, int64_t n, int64_t t, int64_t c,
                           int64_t vocab)
{
    (void)vocab; /* the rows' ids are in range (embed_fwd checked them) */
    GP_CPU_TEAM(dev->threads, n * t * c >= CPU_PAR_MIN)
    {
        if (dt == GP_BF16) embed_bwd(ids, dy, dwte, dwpe, n, t, c, true);
        else embed_bwd(ids, dy, dwte, dwpe, n, t, c, false);
    }
    return GP_OK;
}

/* ---- U-Net: leaky relu, per-row scaling, binary cross-entropy ------------- */

GP_CPU_LOOPS
gp_status gp_cpu_leaky_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n,
                                float slope)
{
    int nt = dev->threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = gp_ew_leaky_relu(x[i], slope);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_leaky_relu_bwd(gp_device *dev, const float *y, const float *dy, float *dx,
                                int64_t n, float slope)
{
    int nt = dev->threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dx[i] = gp_ew_leaky_relu_bwd(y[i], dy[i], slope);
    return GP_OK;
}

/* add_bf16 (backend.h): the FP32 sum of the widened values, rounded once. */
GP_CPU_LOOPS
gp_status gp_cpu_add_bf16(gp_device *dev, const uint16_t *a, const uint16_t *b, uint16_t *y,
                          int64_t n)
{
    int nt = dev->threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] = gp_ew_bf16_bits(gp_ew_bf16_value(a[i]) + gp_ew_bf16_value(b[i]));
    return GP_OK;
}

/* act_bf16 (backend.h): relu and leaky relu, elementwise.h's functions on
 * the widened values, rounded once (the adapter's bits in one pass); GELU
 * the FP32 slot's loop on the widened values (gp_cpu_gelu_bf16, above). */
GP_CPU_LOOPS
gp_status gp_cpu_act_bf16(gp_device *dev, gp_act_kind kind, const uint16_t *xy,
                          const uint16_t *dy, uint16_t *out, int64_t n, float slope)
{
    int nt = dev->threads;
    bool lk = kind == GP_ACT_LEAKY_RELU;
    if (kind == GP_ACT_GELU) return gp_cpu_gelu_bf16(dev, xy, dy, out, n);
    if (kind != GP_ACT_RELU && !lk)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no bf16 kernel for activation %d",
                            dev->name, (int)kind);
    if (!lk) {
        /* relu on the patterns themselves, which vectorise as 16-bit
         * integers (the float form ran at ~2 ns a value): the same bits
         * as rounding gp_ew_relu / gp_ew_relu_bwd of the widened values,
         * which keep a positive (1 .. 0x7f80, +inf included) and give 0
         * for the rest, and whose rounding makes every NaN 0x7fc0 */
        if (!dy) {
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
            for (int64_t i = 0; i < n; i++)
                out[i] = gp_ew_bf16_relu_fwd_bits(xy[i]);
        } else {
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
            for (int64_t i = 0; i < n; i++)
                out[i] = gp_ew_bf16_relu_bwd_bits(xy[i], dy[i]);
        }
        return GP_OK;
    }
    if (!dy) {
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float x = gp_ew_bf16_value(xy[i]);
            out[i] = gp_ew_bf16_bits(gp_ew_leaky_relu(x, slope));
        }
    } else {
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float y = gp_ew_bf16_value(xy[i]), g = gp_ew_bf16_value(dy[i]);
            out[i] = gp_ew_bf16_bits(lk ? gp_ew_leaky_relu_bwd(y, g, slope)
                                        : gp_ew_relu_bwd(y, g));
        }
    }
    return GP_OK;
}

/* Row r of x times s[r] (dropout2d), one body for both storage types. */
static inline __attribute__((always_inline)) void
mul_rows(const void *x, const float *s, void *y, int64_t rows, int64_t cols,
         const bool b16)
{
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++) {
        const float f = s[r];
        const int64_t o = r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) B16_ST(y, o + j, B16_LD(x, o + j) * f);
    }
}

GP_CPU_LOOPS
gp_status gp_cpu_mul_rows_bf16(gp_device *dev, const uint16_t *x, const float *s, uint16_t *y,
                               int64_t rows, int64_t cols)
{
    GP_CPU_TEAM(dev->threads, rows * cols >= CPU_PAR_MIN)
    mul_rows(x, s, y, rows, cols, true);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_mul_rows(gp_device *dev, const float *x, const float *s, float *y,
                          int64_t rows, int64_t cols)
{
    GP_CPU_TEAM(dev->threads, rows * cols >= CPU_PAR_MIN)
    mul_rows(x, s, y, rows, cols, false);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_bce_logits(gp_device *dev, const float *z, const float *t, int64_t n,
                            float scale, float *dz, double *loss_sum, int64_t *correct,
                            int64_t *bad)
{
    *loss_sum = 0.0;
    *correct = 0;
    *bad = -1;
    for (int64_t i = 0; i < n; i++)
        if (!gp_ew_bce_target_ok(t[i])) {
            *bad = i;
            return GP_OK;
        }
    int nt = dev->threads;
    double loss = 0.0;
    int64_t hits = 0;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= CPU_PAR_MIN) \
    reduction(+ : loss, hits)
    for (int64_t i = 0; i < n; i++) {
        loss += gp_ew_bce_loss(z[i], t[i]);
        hits += gp_ew_bce_hit(z[i], t[i]);
        if (dz) dz[i] = gp_ew_bce_grad(z[i], t[i], scale);
    }
    *loss_sum = loss;
    *correct = hits;
    return GP_OK;
}

static gp_status loss_result(gp_status s, double loss, int64_t correct, int64_t bad,
                             gp_loss_result *out)
{
    if (s != GP_OK) return s;
    *out = (gp_loss_result){.loss_sum = bad >= 0 ? 0.0 : loss, .correct = bad >= 0 ? 0 : correct,
                            .bad = bad};
    return GP_OK;
}

gp_status gp_cpu_xent_dev(gp_device *dev, const float *logits, const float *labels,
                          int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                          float *dlogits, gp_loss_result *out)
{
    double loss = 0.0;
    int64_t correct = 0, bad = -1;
    gp_status s = gp_cpu_xent(dev, logits, labels, rows, cols, ld, scale, smoothing, dlogits,
                              &loss, &correct, &bad);
    return loss_result(s, loss, correct, bad, out);
}

gp_status gp_cpu_bce_logits_dev(gp_device *dev, const float *z, const float *t, int64_t n,
                                float scale, float *dz, gp_loss_result *out)
{
    double loss = 0.0;
    int64_t correct = 0, bad = -1;
    gp_status s = gp_cpu_bce_logits(dev, z, t, n, scale, dz, &loss, &correct, &bad);
    return loss_result(s, loss, correct, bad, out);
}
