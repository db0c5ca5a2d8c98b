/*
 * cuda_kernels.cu — the CUDA backend's elementwise and reduction kernels,
 * exported as plain extern "C" launchers (cuda_kernels.h).
 *
 * Each kernel is a loop over elements (or rows) around the same
 * static inline bodies the CPU backend runs (backend/elementwise.h,
 * core/philox.h, compiled here as __host__ __device__), so both backends do
 * the same float arithmetic element by element; only sums differ in order.
 *
 * Reductions are deterministic: a fixed grid of GP_CUK_RED_BLOCKS blocks,
 * each thread striding over a fixed set of indices, a fixed shared-memory
 * tree, then one block over the partials — no atomics, so a result depends
 * only on the input and n, never on scheduling.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/elementwise.h"
#include "core/philox.h"

#include <climits>

namespace {

/* Blocks for a grid-stride loop over n items (capped; the loop covers the
 * rest). */
inline unsigned blocks_for(int64_t n)
{
    int64_t b = (n + GP_CUK_THREADS - 1) / GP_CUK_THREADS;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

#define GP_CUK_LOOP(i, n)                                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)blockDim.x * gridDim.x)

/* Kernels templated on the storage type T of their activations (float;
 * uint16_t: bf16 patterns, train.activations: bf16): ld widens on the way
 * in, st rounds once on the way out (elementwise.h), so a bf16 instance
 * does the float one's arithmetic on the widened values. */
__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(uint16_t v) { return gp_ew_bf16_value(v); }
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(uint16_t *p, float v) { *p = gp_ew_bf16_bits(v); }

__global__ void k_fill(float *x, float v, int64_t n) { GP_CUK_LOOP(i, n) x[i] = v; }
__global__ void k_scale(float *x, float a, int64_t n) { GP_CUK_LOOP(i, n) x[i] *= a; }
__global__ void k_axpy(float a, const float *x, float *y, int64_t n)
{
    GP_CUK_LOOP(i, n) y[i] += a * x[i];
}
__global__ void k_add(const float *a, const float *b, float *y, int64_t n)
{
    GP_CUK_LOOP(i, n) y[i] = a[i] + b[i];
}
__global__ void k_mul(const float *a, const float *b, float *y, int64_t n)
{
    GP_CUK_LOOP(i, n) y[i] = a[i] * b[i];
}
struct box4 {
    int64_t ds[4], ss[4], dims[4];
};
template <typename T> __global__ void k_copy_box(T *dst, const T *src, box4 b, int64_t n)
{
    GP_CUK_LOOP(i, n)
    {
        int64_t r = i, d3 = r % b.dims[3];
        r /= b.dims[3];
        int64_t d2 = r % b.dims[2];
        r /= b.dims[2];
        int64_t d1 = r % b.dims[1], d0 = r / b.dims[1];
        dst[d0 * b.ds[0] + d1 * b.ds[1] + d2 * b.ds[2] + d3 * b.ds[3]] =
            src[d0 * b.ss[0] + d1 * b.ss[1] + d2 * b.ss[2] + d3 * b.ss[3]];
    }
}
__global__ void k_relu_fwd(const float *x, float *y, int64_t n)
{
    GP_CUK_LOOP(i, n) y[i] = gp_ew_relu(x[i]);
}
__global__ void k_relu_bwd(const float *y, const float *dy, float *dx, int64_t n)
{
    GP_CUK_LOOP(i, n) dx[i] = gp_ew_relu_bwd(y[i], dy[i]);
}
__global__ void k_sgd(float *w, const float *g, float *v, int64_t n, float lr, float mu,
                      float wd, int nesterov)
{
    GP_CUK_LOOP(i, n)
    {
        float t = 0.0f; /* v NULL: plain SGD, no state */
        gp_ew_sgd(&w[i], g[i], v ? &v[i] : &t, lr, mu, wd, nesterov);
    }
}
/* A part's blocks at most (gp_cuk_sgd_table). */
#define SGD_BLOCKS_CAP 4096
/* k_sgd's body over part p's elements, strided by p's blocks. */
__global__ void k_sgd_multi(gp_cuk_sgd_table t, float lr, float mu, int nesterov)
{
    int p = 0;
    while (p + 1 < t.parts && blockIdx.x >= t.first[p + 1]) p++;
    float *w = t.w[p], *v = t.v[p], wd = t.wd[p], cf = t.clip[p];
    uint16_t *w16 = t.w16[p];
    float *flag = t.nonfinite[p];
    const float *g = t.g[p];
    int64_t nb = t.first[p + 1] - t.first[p], n = t.n[p];
    for (int64_t i = (int64_t)(blockIdx.x - t.first[p]) * blockDim.x + threadIdx.x; i < n;
         i += nb * blockDim.x) {
        float tmp = 0.0f; /* v NULL: plain SGD, no state */
        gp_ew_sgd(&w[i], g[i] * cf, v ? &v[i] : &tmp, lr, mu, wd, nesterov);
        if (w16) w16[i] = gp_ew_bf16_bits(w[i]);
        if (flag && gp_ew_nonfinite(w[i])) *flag = 1.0f; /* (every writer writes 1) */
    }
}
/* k_sgd_multi's walk with Adam's body. */
__global__ void k_adam_multi(gp_cuk_sgd_table t, gp_adam_step a)
{
    int p = 0;
    while (p + 1 < t.parts && blockIdx.x >= t.first[p + 1]) p++;
    float *w = t.w[p], *m = t.v[p], *v = t.v2[p], wd = t.wd[p], cf = t.clip[p];
    uint16_t *w16 = t.w16[p];
    float *flag = t.nonfinite[p];
    const float *g = t.g[p];
    int64_t nb = t.first[p + 1] - t.first[p], n = t.n[p];
    for (int64_t i = (int64_t)(blockIdx.x - t.first[p]) * blockDim.x + threadIdx.x; i < n;
         i += nb * blockDim.x) {
        gp_ew_adam(&w[i], g[i] * cf, &m[i], &v[i], &a, wd);
        if (w16) w16[i] = gp_ew_bf16_bits(w[i]);
        if (flag && gp_ew_nonfinite(w[i])) *flag = 1.0f;
    }
}
__global__ void k_dropout(float *mask, int64_t n, float p, uint64_t seed, uint64_t stream,
                          uint64_t first)
{
    GP_CUK_LOOP(i, n)
        mask[i] = gp_ew_dropout(gp_philox_uniform(seed, stream, first + (uint64_t)i), p);
}
__global__ void k_dropout_apply(const float *x, float *y, int64_t n, float p, uint64_t seed,
                                uint64_t stream, uint64_t first)
{
    GP_CUK_LOOP(i, n)
        y[i] = x[i] * gp_ew_dropout(gp_philox_uniform(seed, stream, first + (uint64_t)i), p);
}
__global__ void k_dropout_apply_bf16(const uint16_t *x, uint16_t *y, int64_t n, float p,
                                     uint64_t seed, uint64_t stream, uint64_t first)
{
    GP_CUK_LOOP(i, n)
        y[i] = gp_ew_bf16_bits(gp_ew_bf16_value(x[i]) *
                               gp_ew_dropout(gp_philox_uniform(seed, stream, first + (uint64_t)i), p));
}
__global__ void k_bf16_pack(uint16_t *dst, const float *src, int64_t n)
{
    GP_CUK_LOOP(i, n) dst[i] = gp_ew_bf16_bits(src[i]);
}
__global__ void k_bf16_unpack(float *dst, const uint16_t *src, int64_t n)
{
    GP_CUK_LOOP(i, n) dst[i] = gp_ew_bf16_value(src[i]);
}
/* precision bf16: a (rows x cols) block at leading dimension ld into a
 * dense one, rounded (a matrix operand for cuBLAS) */
__global__ void k_bf16_pack2d(uint16_t *dst, const float *src, int64_t rows, int64_t cols,
                              int64_t ld)
{
    GP_CUK_LOOP(i, rows * cols) dst[i] = gp_ew_bf16_bits(src[(i / cols) * ld + i % cols]);
}
/* y = value(src) (+ b[channel] where b is given): a convolution's output
 * from its bf16 result, with its bias */
__global__ void k_bf16_unpack_bias(float *dst, const uint16_t *src, const float *b, int64_t n,
                                   int64_t k, int64_t hw)
{
    /* no bias: the value as it is (adding 0 would turn -0 into +0) */
    GP_CUK_LOOP(i, n) dst[i] = b ? gp_ew_bf16_value(src[i]) + b[(i / hw) % k] : gp_ew_bf16_value(src[i]);
}
/* y = bits(value(y) + b[c]) in place: a bf16 convolution's output on bf16
 * storage with its bias, the bits k_bf16_unpack_bias's widened sum rounds
 * to */
__global__ void k_bf16_bias(uint16_t *y, const float *b, int64_t n, int64_t k, int64_t hw)
{
    GP_CUK_LOOP(i, n) y[i] = gp_ew_bf16_bits(gp_ew_bf16_value(y[i]) + b[(i / hw) % k]);
}
/* dst += value(src): a weight gradient's bf16 part into its FP32 sum */
__global__ void k_bf16_unpack_add(float *dst, const uint16_t *src, int64_t n)
{
    GP_CUK_LOOP(i, n) dst[i] += gp_ew_bf16_value(src[i]);
}
__global__ void k_scale_matrix(float *c, int64_t m, int64_t n, int64_t ldc, float beta)
{
    GP_CUK_LOOP(e, m * n) {
        float *p = c + (e / n) * ldc + e % n;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}
__global__ void k_add_bias_rows(float *y, const float *bias, int64_t rows, int64_t cols)
{
    GP_CUK_LOOP(e, rows * cols) y[e] += bias[e % cols];
}
/* linear_fwd's pass after a product without an epilogue: y = relu(y +
 * bias) (bias may be NULL), the float operations of add_bias_rows then
 * relu_fwd. */
__global__ void k_bias_relu_rows(float *y, const float *bias, int64_t rows, int64_t cols)
{
    GP_CUK_LOOP(e, rows * cols) y[e] = gp_ew_relu(bias ? y[e] + bias[e % cols] : y[e]);
}
/* Column sums in two passes.  Pass 1: a block is 32 columns (a warp reads
 * 32 consecutive floats of a row) by 8 rows; blockIdx.y strides down the
 * rows; the 8 row-threads of a column meet in a fixed tree.  Pass 2: one
 * thread per column adds the partials in order. */
#define SR_COLS 32
#define SR_ROWS 8
/* Pass 1's meeting: v of the 8 row-threads of column threadIdx.x summed in
 * the fixed tree, returned to every thread (called by all of the block; it
 * may be called again, for another sum, as the layer norm's weights do). */
__device__ double sr_tile_sum(double v)
{
    __shared__ double sh[SR_ROWS][SR_COLS];
    sh[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    for (unsigned h = SR_ROWS / 2; h > 0; h >>= 1) {
        if (threadIdx.y < h) sh[threadIdx.y][threadIdx.x] += sh[threadIdx.y + h][threadIdx.x];
        __syncthreads();
    }
    double s = sh[0][threadIdx.x];
    __syncthreads(); /* read before a next call writes */
    return s;
}

template <typename T>
__global__ void k_sum_rows_part(const T *dy, double *part, int64_t rows, int64_t cols)
{
    int64_t j = (int64_t)blockIdx.x * SR_COLS + threadIdx.x;
    double acc = 0.0;
    if (j < cols)
        for (int64_t r = (int64_t)blockIdx.y * SR_ROWS + threadIdx.y; r < rows;
             r += (int64_t)gridDim.y * SR_ROWS)
            acc += (double)ld(dy[r * cols + j]);
    double s = sr_tile_sum(acc);
    if (threadIdx.y == 0 && j < cols) part[(int64_t)blockIdx.y * cols + j] = s;
}
/* db[j] += the sum (over: db[j] = it, the same bits as over a zeroed db,
 * with no fill before it) */
__global__ void k_sum_rows_final(const double *part, int parts, float *db, int64_t cols,
                                 int over)
{
    GP_CUK_LOOP(j, cols) {
        double acc = 0.0;
        for (int p = 0; p < parts; p++) acc += part[(int64_t)p * cols + j];
        db[j] = over ? (float)acc : db[j] + (float)acc;
    }
}

/* The sum of v over a warp into lane 0 (a fixed butterfly: deterministic). */
__device__ inline double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
__global__ void k_sum_planes_part(const T *dy, double *part, int64_t planes, int64_t hw)
{
    int64_t plane = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = (int)(threadIdx.x % 32);
    if (plane >= planes) return; /* the whole warp: planes split at warp edges */
    const T *p = dy + plane * hw;
    double acc = 0.0;
    for (int64_t i = lane; i < hw; i += 32) acc += (double)ld(p[i]);
    acc = warp_sum(acc);
    if (lane == 0) part[plane] = acc;
}

/* Sum of v over the block into thread 0's return value (fixed tree). */
__device__ double block_sum(double v)
{
    __shared__ double sh[GP_CUK_THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned h = GP_CUK_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) sh[threadIdx.x] += sh[threadIdx.x + h];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

/* Block j: channel j's planes over n (thread t takes t, t + 256, .. in
 * order, then the fixed tree). */
__global__ void k_sum_planes_final(const double *part, float *db, int64_t n, int64_t k)
{
    for (int64_t j = blockIdx.x; j < k; j += gridDim.x) {
        double acc = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += part[i * k + j];
        acc = block_sum(acc);
        if (threadIdx.x == 0) db[j] += (float)acc;
    }
}

__device__ long long block_min(long long v)
{
    __shared__ long long sh[GP_CUK_THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned h = GP_CUK_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h && sh[threadIdx.x + h] < sh[threadIdx.x])
            sh[threadIdx.x] = sh[threadIdx.x + h];
        __syncthreads();
    }
    long long r = sh[0];
    __syncthreads();
    return r;
}

__global__ void k_sumsq_partial(const float *x, int64_t n, double *partials)
{
    double acc = 0.0;
    GP_CUK_LOOP(i, n) acc += (double)x[i] * (double)x[i];
    double s = block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void k_sum_partials(const double *partials, int count, double *out)
{
    double acc = 0.0;
    for (int i = (int)threadIdx.x; i < count; i += GP_CUK_THREADS) acc += partials[i];
    double s = block_sum(acc);
    if (threadIdx.x == 0) *out = s;
}

/* k_sumsq_partial on up to GP_CUK_TABLE tensors, one per blockIdx.y, with
 * GP_CUK_RED_BLOCKS blocks each (so each tensor's partials are the bits
 * k_sumsq_partial gives it): tensor y's into partials[y * RED_BLOCKS..]. */
__global__ void k_sumsq_partial_many(gp_cuk_tensor_table t, double *partials)
{
    const float *x = t.x[blockIdx.y];
    int64_t n = t.n[blockIdx.y];
    double acc = 0.0;
    GP_CUK_LOOP(i, n) acc += (double)x[i] * (double)x[i];
    double s = block_sum(acc);
    if (threadIdx.x == 0) partials[(size_t)blockIdx.y * GP_CUK_RED_BLOCKS + blockIdx.x] = s;
}

/* k_sum_partials for each of gridDim.x tensors (one block each, the same
 * order of sums): out[b] from partials[b * RED_BLOCKS..]. */
__global__ void k_sum_partials_many(const double *partials, double *out)
{
    const double *p = partials + (size_t)blockIdx.x * GP_CUK_RED_BLOCKS;
    double acc = 0.0;
    for (int i = (int)threadIdx.x; i < GP_CUK_RED_BLOCKS; i += GP_CUK_THREADS) acc += p[i];
    double s = block_sum(acc);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void k_nonfinite(const float *x, int64_t n, int *flag)
{
    int bad = 0;
    GP_CUK_LOOP(i, n) bad |= gp_ew_nonfinite(x[i]);
    if (bad) *flag = 1; /* every writer stores the same value */
}

__global__ void k_nonfinite_or(const float *x, int64_t n, float *flag)
{
    int bad = 0;
    GP_CUK_LOOP(i, n) bad |= gp_ew_nonfinite(x[i]);
    if (bad) *flag = 1.0f; /* every writer stores the same value */
}

/* Up to GP_NONFINITE_BATCH tensors, one per blockIdx.y; the table rides
 * in the kernel's parameters, so nothing is uploaded for it. */
__global__ void k_nonfinite_or_many(gp_cuk_tensor_table t, float *flag)
{
    const float *x = t.x[blockIdx.y];
    int64_t n = t.n[blockIdx.y];
    int bad = 0;
    GP_CUK_LOOP(i, n) bad |= gp_ew_nonfinite(x[i]);
    if (bad) *flag = 1.0f; /* every writer stores the same value */
}

/* Up to GP_CUK_TABLE tensors zeroed, one per blockIdx.y (the table's
 * pointers are const for the readers; zero_many's are the caller's
 * writable gradients). */
__global__ void k_zero_many(gp_cuk_tensor_table t)
{
    float *x = (float *)t.x[blockIdx.y];
    int64_t n = t.n[blockIdx.y];
    GP_CUK_LOOP(i, n) x[i] = 0.0f;
}

/* ---- cross-entropy -------------------------------------------------------- */

__global__ void k_xent_check(const float *labels, int64_t rows, int64_t cols,
                             long long *row_flag)
{
    GP_CUK_LOOP(r, rows) row_flag[r] = gp_ew_label_ok(labels[r], cols) ? LLONG_MAX : r;
}

__global__ void k_xent_first_bad(const long long *row_flag, int64_t rows,
                                 gp_cuk_xent_out *out)
{
    long long m = LLONG_MAX;
    for (int64_t r = threadIdx.x; r < rows; r += GP_CUK_THREADS)
        if (row_flag[r] < m) m = row_flag[r];
    long long b = block_min(m);
    if (threadIdx.x == 0) out->bad_row = b == LLONG_MAX ? -1 : b;
}

/* One warp per row (issue 15: coalesced): lane l reads columns l, l + 32,
 * ..., so a warp's loads are consecutive floats.  The row's max and its
 * first index (the CPU's strict > scan gives the first occurrence) meet in
 * a fixed butterfly, the sum of exp(x - max) in double per lane then in a
 * fixed butterfly (deterministic; another order than the CPU's, so equal
 * to it within double rounding), and each lane writes its columns of the
 * gradient with elementwise.h's per-element formula (gp_ew_xent_grad_one;
 * the CPU's own exponentials are gp_cpu_exp_d's, so the two agree within
 * rounding, not bit for bit).  A
 * NaN logit makes the sum, and so the loss, NaN, as on the CPU.  Skipped
 * entirely after a bad label.  Rows are ld floats apart; a padded
 * vocabulary's columns [cols, ld) are not read, and their gradient is 0. */
#define XENT_WARPS (GP_CUK_THREADS / 32)
template <typename T>
__global__ void k_xent_rows(const T *logits, const float *labels, int64_t rows, int64_t cols,
                            int64_t ldr, float scale, float eps, T *dlogits, double *row_loss,
                            long long *row_hit, const gp_cuk_xent_out *out)
{
    if (out->bad_row >= 0) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t r = (int64_t)blockIdx.x * XENT_WARPS + warp; r < rows;
         r += (int64_t)gridDim.x * XENT_WARPS) {
        const T *x = logits + r * ldr;
        float m = -INFINITY;
        int64_t a = cols; /* none: loses every tie */
        for (int64_t j = lane; j < cols; j += 32) {
            float v = ld(x[j]);
            /* a lane starts at its first value that is not NaN, except
             * column 0, which the CPU's scan starts from whatever it is
             * (a NaN there stays the max; a NaN elsewhere never wins) */
            if (a == cols ? (j == 0 || v == v) : v > m) {
                m = v;
                a = j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o);
            long long a2 = __shfl_xor_sync(0xffffffffu, (long long)a, o);
            if (a2 != cols && (a == cols || m2 > m || (m2 == m && a2 < a))) {
                m = m2;
                a = a2;
            }
        }
        double sum = 0.0;
        for (int64_t j = lane; j < cols; j += 32) sum += exp((double)(ld(x[j]) - m));
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        double lse = log(sum);
        /* label smoothing: the row's sum of x - max, as the sum above */
        double shift = 0.0;
        if (eps != 0.0f) {
            for (int64_t j = lane; j < cols; j += 32) shift += (double)(ld(x[j]) - m);
            for (int o = 16; o > 0; o >>= 1) shift += __shfl_xor_sync(0xffffffffu, shift, o);
        }
        int64_t label = (int64_t)labels[r];
        const float xl = ld(x[label]); /* the only logit the loss reads */
        /* every lane has read the row before any writes its gradient: dlogits
         * may be the logits' memory (the gradient over the logits in place,
         * issue 64) */
        __syncwarp();
        if (lane == 0) {
            row_loss[r] = gp_ew_xent_loss_ls(&xl, 0, m, lse, shift, cols, eps);
            row_hit[r] = a == label;
        }
        if (dlogits) {
            for (int64_t j = lane; j < cols; j += 32)
                st(&dlogits[r * ldr + j],
                   gp_ew_xent_grad_ls(ld(x[j]), j == label, m, lse, scale, eps, cols));
            for (int64_t j = cols + lane; j < ldr; j += 32) st(&dlogits[r * ldr + j], 0.0f);
        }
    }
}

__global__ void k_xent_total(const double *row_loss, const long long *row_hit, int64_t rows,
                             gp_cuk_xent_out *out)
{
    bool bad = out->bad_row >= 0;
    double loss = 0.0, hits = 0.0;
    for (int64_t r = threadIdx.x; !bad && r < rows; r += GP_CUK_THREADS) {
        loss += row_loss[r];
        hits += (double)row_hit[r];
    }
    double l = block_sum(loss), h = block_sum(hits);
    if (threadIdx.x == 0) {
        out->loss_sum = bad ? 0.0 : l;
        out->correct = bad ? 0 : (long long)h;
    }
}

/* ---- a step's batch-norm statistics, on the device --------------------------- */

__global__ void k_bn_merge(double *mean_acc, double *m2_acc, double na, double nb,
                           const float *mean, const float *var, int64_t c)
{
    GP_CUK_LOOP(k, c) gp_ew_bn_merge(&mean_acc[k], &m2_acc[k], na, nb, mean[k], var[k]);
}

__global__ void k_bn_commit(float *rmean, float *rvar, double *mean_acc, double *m2_acc,
                            double m, double count, int64_t c)
{
    GP_CUK_LOOP(k, c) gp_ew_bn_commit(&rmean[k], &rvar[k], &mean_acc[k], &m2_acc[k], m, count);
}

/* ---- Transformer layers -------------------------------------------------------- */

__global__ void k_gelu_fwd(const float *x, float *y, int64_t n)
{
    GP_CUK_LOOP(i, n) y[i] = gp_ew_gelu(x[i]);
}
__global__ void k_gelu_bwd(const float *x, const float *dy, float *dx, int64_t n)
{
    GP_CUK_LOOP(i, n) dx[i] = gp_ew_gelu_bwd(x[i], dy[i]);
}

/* act_bf16 (backend.h): the activations on bf16 storage, the FP32 kernels'
 * functions on the widened values, rounded once: the adapter's bits. */
__global__ void k_act_bf16(int kind, const uint16_t *xy, const uint16_t *dy, uint16_t *out,
                           int64_t n, float slope)
{
    GP_CUK_LOOP(i, n) {
        float v = gp_ew_bf16_value(xy[i]), r;
        if (!dy)
            r = kind == 0 ? gp_ew_relu(v) : kind == 1 ? gp_ew_leaky_relu(v, slope) : gp_ew_gelu(v);
        else {
            float g = gp_ew_bf16_value(dy[i]);
            r = kind == 0   ? gp_ew_relu_bwd(v, g)
                : kind == 1 ? gp_ew_leaky_relu_bwd(v, g, slope)
                            : gp_ew_gelu_bwd(v, g);
        }
        out[i] = gp_ew_bf16_bits(r);
    }
}

/* add_bf16 (backend.h): the FP32 sum of the widened values, rounded once. */
__global__ void k_add_bf16(const uint16_t *a, const uint16_t *b, uint16_t *y, int64_t n)
{
    GP_CUK_LOOP(i, n) y[i] = gp_ew_bf16_bits(gp_ew_bf16_value(a[i]) + gp_ew_bf16_value(b[i]));
}

/* ---- U-Net layers ------------------------------------------------------------- */

__global__ void k_leaky_relu_fwd(const float *x, float *y, int64_t n, float slope)
{
    GP_CUK_LOOP(i, n) y[i] = gp_ew_leaky_relu(x[i], slope);
}
__global__ void k_leaky_relu_bwd(const float *y, const float *dy, float *dx, int64_t n,
                                 float slope)
{
    GP_CUK_LOOP(i, n) dx[i] = gp_ew_leaky_relu_bwd(y[i], dy[i], slope);
}
__global__ void k_mul_rows(const float *x, const float *f, float *y, int64_t rows,
                           int64_t cols)
{
    GP_CUK_LOOP(e, rows * cols) y[e] = x[e] * f[e / cols];
}
__global__ void k_mul_rows_bf16(const uint16_t *x, const float *f, uint16_t *y, int64_t rows,
                                int64_t cols)
{
    GP_CUK_LOOP(e, rows * cols) y[e] = gp_ew_bf16_bits(gp_ew_bf16_value(x[e]) * f[e / cols]);
}
/* One thread per output element: y[p, i, j] = x[p, i / s, j / s]. */
__global__ void k_upsample_fwd(const float *x, float *y, int64_t planes, int64_t h, int64_t w,
                               int64_t sc)
{
    const int64_t ow = w * sc, ohw = h * sc * ow;
    GP_CUK_LOOP(e, planes * ohw) {
        int64_t p = e / ohw, r = e % ohw, i = r / ow, j = r % ow;
        y[e] = x[(p * h + i / sc) * w + j / sc];
    }
}
/* A linear layer's FP32 product c (rows, cols, leading dimension cols) with
 * its bias (NULL: none; never + 0, which would turn -0 into +0) and relu
 * (gp_ew_relu), as gp_cuk_add_bias_rows / gp_cuk_bias_relu_rows compute
 * them, rounded once into bf16 y. */
__global__ void k_bias_relu_pack(const float *c, const float *bias, int relu, uint16_t *y,
                                 int64_t rows, int64_t cols)
{
    GP_CUK_LOOP(e, rows * cols) {
        float v = bias ? c[e] + bias[e % cols] : c[e];
        y[e] = gp_ew_bf16_bits(relu ? gp_ew_relu(v) : v);
    }
}
/* On bf16 storage: bits copied forward; backward the CPU's float sums in
 * its order (cpu_upsample.c: (a + b) + (c + d) for scale 2, else each
 * block row's sum, the rows added top to bottom), rounded once, so the
 * bits are the CPU's. */
__global__ void k_upsample_fwd_bf16(const uint16_t *x, uint16_t *y, int64_t planes, int64_t h,
                                    int64_t w, int64_t sc)
{
    const int64_t ow = w * sc, ohw = h * sc * ow;
    GP_CUK_LOOP(e, planes * ohw) {
        int64_t p = e / ohw, r = e % ohw, i = r / ow, j = r % ow;
        y[e] = x[(p * h + i / sc) * w + j / sc];
    }
}
__global__ void k_upsample_bwd_bf16(const uint16_t *dy, uint16_t *dx, int64_t planes, int64_t h,
                                    int64_t w, int64_t sc)
{
    const int64_t ow = w * sc;
    GP_CUK_LOOP(e, planes * h * w) {
        int64_t p = e / (h * w), r = e % (h * w), i = r / w, j = r % w;
        const uint16_t *b = dy + (p * h * sc + i * sc) * ow + j * sc;
        float acc;
        if (sc == 2) {
            acc = (ld(b[0]) + ld(b[1])) + (ld(b[ow]) + ld(b[ow + 1]));
        } else {
            acc = 0.0f;
            for (int64_t a = 0; a < sc; a++) {
                float row = 0.0f;
                for (int64_t c = 0; c < sc; c++) row += ld(b[a * ow + c]);
                acc += row;
            }
        }
        st(&dx[e], acc);
    }
}
/* One thread per input element: the sum of its block, row by row, in
 * double, rounded once (the CPU sums in float: equal to rounding). */
__global__ void k_upsample_bwd(const float *dy, float *dx, int64_t planes, int64_t h, int64_t w,
                               int64_t sc)
{
    const int64_t ow = w * sc;
    GP_CUK_LOOP(e, planes * h * w) {
        int64_t p = e / (h * w), r = e % (h * w), i = r / w, j = r % w;
        const float *b = dy + (p * h * sc + i * sc) * ow + j * sc;
        double acc = 0.0;
        for (int64_t a = 0; a < sc; a++)
            for (int64_t c = 0; c < sc; c++) acc += (double)b[a * ow + c];
        dx[e] = (float)acc;
    }
}

/* ---- causal self-attention (backend.h's attn_fwd / attn_bwd) ------------------------ */

/* The straightforward kernels: one thread per (batch row, head, position),
 * FP32, its sums in a fixed order and no atomics, so the results repeat bit
 * for bit (not the CPU's bits: its tiles rescale in another order).  x (b,
 * t, R) with R = c + 2 kv_heads d (d = c / heads): q's heads, then k's and
 * v's kv_heads (grouped-query attention: query head h reads k and v head
 * h / (heads / kv_heads), in place, never copied).  The score of query i
 * (q at qo) and key j (k at ko). */
__device__ float attn_score(const float *xb, int64_t i, int64_t j, int64_t R, int64_t qo,
                            int64_t ko, int64_t d, float scale)
{
    const float *q = xb + i * R + qo, *k = xb + j * R + ko;
    float s = 0.0f;
    for (int64_t e = 0; e < d; e++) s += q[e] * k[e];
    return s * scale;
}

/* One thread per query row: the online softmax over keys 0..i, its output
 * accumulated in y's row (which only this thread writes). */
__global__ void k_attn_fwd(const float *x, float *y, float *lse, int64_t b, int64_t t,
                           int64_t heads, int64_t kv_heads, int64_t c)
{
    const int64_t d = c / heads, R = c + 2 * kv_heads * d, rep = heads / kv_heads;
    const float scale = rsqrtf((float)d);
    GP_CUK_LOOP(e, b * heads * t) {
        int64_t i = e % t, h = (e / t) % heads, bi = e / (t * heads), g = h / rep;
        const int64_t ko = c + g * d, vo = c + kv_heads * d + g * d;
        const float *xb = x + bi * t * R;
        float *yi = y + (bi * t + i) * c + h * d, m = -INFINITY, l = 0.0f;
        for (int64_t q = 0; q < d; q++) yi[q] = 0.0f;
        for (int64_t j = 0; j <= i; j++) {
            float s = attn_score(xb, i, j, R, h * d, ko, d, scale);
            if (s > m) { /* rescale what is summed so far to the new maximum */
                float corr = expf(m - s);
                l *= corr;
                for (int64_t q = 0; q < d; q++) yi[q] *= corr;
                m = s;
            }
            float p = expf(s - m);
            const float *v = xb + j * R + vo;
            l += p;
            for (int64_t q = 0; q < d; q++) yi[q] += p * v[q];
        }
        for (int64_t q = 0; q < d; q++) yi[q] /= l;
        if (lse) lse[e] = m + logf(l);
    }
}

/* backend.h's attn_cached: the new positions' k and v into the cache, a
 * thread a value, then a thread per (sequence, head, new position): the
 * online softmax of k_attn_fwd over the cache's keys 0 .. pos + i, summed
 * in FP32 registers (d <= GP_CUK_ATT_MAX_D), the output rounded once. */
#define GP_CUK_ATT_MAX_D 256
template <typename T>
__global__ void k_attn_cache_put(const T *x, T *kv, int64_t b, int64_t n, int64_t pos,
                                 int64_t cap, int64_t R, int64_t c, int64_t KR)
{
    GP_CUK_LOOP(e, b * n * KR) {
        int64_t u = e % KR, i = (e / KR) % n, bi = e / (KR * n);
        kv[(bi * cap + pos + i) * KR + u] = x[(bi * n + i) * R + c + u];
    }
}

template <typename T>
__global__ void k_attn_cached(const T *x, const T *kv, T *y, int64_t b, int64_t n, int64_t pos,
                              int64_t cap, int64_t heads, int64_t kv_heads, int64_t c)
{
    const int64_t d = c / heads, R = c + 2 * kv_heads * d, KR = 2 * kv_heads * d;
    const int64_t rep = heads / kv_heads;
    const float scale = rsqrtf((float)d);
    GP_CUK_LOOP(e, b * heads * n) {
        int64_t i = e % n, h = (e / n) % heads, bi = e / (n * heads), g = h / rep;
        const T *q = x + (bi * n + i) * R + h * d, *kb = kv + bi * cap * KR;
        float acc[GP_CUK_ATT_MAX_D], m = -INFINITY, l = 0.0f;
        for (int64_t u = 0; u < d; u++) acc[u] = 0.0f;
        for (int64_t j = 0; j <= pos + i; j++) {
            const T *k = kb + j * KR + g * d, *v = kb + j * KR + kv_heads * d + g * d;
            float s = 0.0f;
            for (int64_t u = 0; u < d; u++) s += ld(q[u]) * ld(k[u]);
            s *= scale;
            if (s > m) {
                float corr = expf(m - s);
                l *= corr;
                for (int64_t u = 0; u < d; u++) acc[u] *= corr;
                m = s;
            }
            float p = expf(s - m);
            l += p;
            for (int64_t u = 0; u < d; u++) acc[u] += p * ld(v[u]);
        }
        T *yi = y + (bi * n + i) * c + h * d;
        for (int64_t u = 0; u < d; u++) st(&yi[u], acc[u] / l);
    }
}

/* dy_i . y_i for query i of head h. */
__device__ float attn_dd(const float *y, const float *dy, int64_t row, int64_t c, int64_t hd,
                         int64_t d)
{
    const float *a = y + row * c + hd, *g = dy + row * c + hd;
    float s = 0.0f;
    for (int64_t q = 0; q < d; q++) s += a[q] * g[q];
    return s;
}

/* One thread per query row: dq_i = scale sum_{j <= i} p_ij (dy_i . v_j - D_i) k_j. */
__global__ void k_attn_bwd_q(const float *x, const float *y, const float *lse, const float *dy,
                             float *dx, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                             int64_t c)
{
    const int64_t d = c / heads, R = c + 2 * kv_heads * d, rep = heads / kv_heads;
    const float scale = rsqrtf((float)d);
    GP_CUK_LOOP(e, b * heads * t) {
        int64_t i = e % t, h = (e / t) % heads, bi = e / (t * heads), hd = h * d, g = h / rep;
        const int64_t ko = c + g * d, vo = c + kv_heads * d + g * d;
        const float *xb = x + bi * t * R, *dyi = dy + (bi * t + i) * c + hd;
        float *dq = dx + (bi * t + i) * R + hd, dd = attn_dd(y, dy, bi * t + i, c, hd, d);
        for (int64_t q = 0; q < d; q++) dq[q] = 0.0f;
        for (int64_t j = 0; j <= i; j++) {
            const float *k = xb + j * R + ko, *v = xb + j * R + vo;
            float p = expf(attn_score(xb, i, j, R, hd, ko, d, scale) - lse[e]), dp = 0.0f;
            for (int64_t q = 0; q < d; q++) dp += dyi[q] * v[q];
            float ds = p * (dp - dd);
            for (int64_t q = 0; q < d; q++) dq[q] += ds * k[q];
        }
        for (int64_t q = 0; q < d; q++) dq[q] *= scale;
    }
}

/* One thread per key row j of k and v head g: over the query heads that
 * share it (in order), dv_j = sum_{i >= j} p_ij dy_i and
 * dk_j = scale sum_{i >= j} p_ij (dy_i . v_j - D_i) q_i. */
__global__ void k_attn_bwd_kv(const float *x, const float *y, const float *lse, const float *dy,
                              float *dx, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                              int64_t c)
{
    const int64_t d = c / heads, R = c + 2 * kv_heads * d, rep = heads / kv_heads;
    const float scale = rsqrtf((float)d);
    GP_CUK_LOOP(e, b * kv_heads * t) {
        int64_t j = e % t, g = (e / t) % kv_heads, bi = e / (t * kv_heads);
        const int64_t ko = c + g * d, vo = c + kv_heads * d + g * d;
        const float *xb = x + bi * t * R, *v = xb + j * R + vo;
        float *dk = dx + (bi * t + j) * R + ko, *dv = dx + (bi * t + j) * R + vo;
        for (int64_t q = 0; q < d; q++) dk[q] = dv[q] = 0.0f;
        for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
            const int64_t hd = h * d;
            const float *lh = lse + (bi * heads + h) * t;
            for (int64_t i = j; i < t; i++) {
                const float *qi = xb + i * R + hd, *dyi = dy + (bi * t + i) * c + hd;
                float p = expf(attn_score(xb, i, j, R, hd, ko, d, scale) - lh[i]), dp = 0.0f;
                for (int64_t q = 0; q < d; q++) dp += dyi[q] * v[q];
                float ds = p * (dp - attn_dd(y, dy, bi * t + i, c, hd, d));
                for (int64_t q = 0; q < d; q++) {
                    dv[q] += p * dyi[q];
                    dk[q] += ds * qi[q];
                }
            }
        }
        for (int64_t q = 0; q < d; q++) dk[q] *= scale;
    }
}

/* ---- binary cross-entropy ------------------------------------------------------ */

/* Per block: the first element whose target is not in [0, 1]. */
__global__ void k_bce_check(const float *t, int64_t n, long long *idx_part)
{
    long long first = LLONG_MAX;
    GP_CUK_LOOP(i, n)
        if (!gp_ew_bce_target_ok(t[i]) && i < first) first = i;
    long long b = block_min(first);
    if (threadIdx.x == 0) idx_part[blockIdx.x] = b;
}

__global__ void k_bce_first_bad(const long long *idx_part, int count, gp_cuk_bce_out *out)
{
    long long m = LLONG_MAX;
    for (int i = (int)threadIdx.x; i < count; i += GP_CUK_THREADS)
        if (idx_part[i] < m) m = idx_part[i];
    long long b = block_min(m);
    if (threadIdx.x == 0) out->bad = b == LLONG_MAX ? -1 : b;
}

/* Per block: loss and hits; dz.  Skipped entirely after a bad target. */
__global__ void k_bce_elems(const float *z, const float *t, int64_t n, float scale, float *dz,
                            double *loss_part, long long *idx_part, const gp_cuk_bce_out *out)
{
    if (out->bad >= 0) return;
    double loss = 0.0, hits = 0.0;
    GP_CUK_LOOP(i, n) {
        loss += gp_ew_bce_loss(z[i], t[i]);
        hits += (double)gp_ew_bce_hit(z[i], t[i]);
        if (dz) dz[i] = gp_ew_bce_grad(z[i], t[i], scale);
    }
    double l = block_sum(loss), h = block_sum(hits);
    if (threadIdx.x == 0) {
        loss_part[blockIdx.x] = l;
        idx_part[blockIdx.x] = (long long)h;
    }
}

__global__ void k_bce_total(const double *loss_part, const long long *idx_part, int count,
                            gp_cuk_bce_out *out)
{
    bool bad = out->bad >= 0;
    double loss = 0.0, hits = 0.0;
    for (int i = (int)threadIdx.x; !bad && i < count; i += GP_CUK_THREADS) {
        loss += loss_part[i];
        hits += (double)idx_part[i];
    }
    double l = block_sum(loss), h = block_sum(hits);
    if (threadIdx.x == 0) {
        out->loss_sum = bad ? 0.0 : l;
        out->correct = bad ? 0 : (long long)h;
    }
}

/* ---- batch norm helpers ----------------------------------------------------- */

__global__ void k_bn_biased_var(float *var, int64_t c, double cnt)
{
    GP_CUK_LOOP(i, c) var[i] = gp_ew_bn_biased_var(var[i], cnt);
}

__global__ void k_bn_invstd(const float *var, float eps, float *inv, int64_t c)
{
    GP_CUK_LOOP(i, c) inv[i] = gp_ew_bn_invstd(var[i], eps);
}

/* ---- synchronised batch norm: one block per channel ------------------------
 * Channel c of x (N, C, S) is N runs of S values, n * C * S + c * S apart;
 * t in [0, N S) walks them as (t / S, t % S); channels-last (cl: x is
 * (N, S, C)) they are N S values C apart, t the same walk, so the sums
 * meet in the same order and the bits are the plain layout's.  Sums are
 * in double, in a fixed order (block_sum), as the CPU's are in double. */

__device__ inline int64_t bn_at(int64_t t, int64_t c, int64_t C, int64_t S, int cl)
{
    return cl ? t * C + c : (t / S) * C * S + c * S + t % S;
}

template <typename T>
__global__ void k_bn_stats(const T *x, int64_t N, int64_t C, int64_t S, float *mean, float *var,
                           int cl)
{
    const int64_t cnt = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        double acc = 0.0;
        for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x)
            acc += (double)ld(x[bn_at(t, c, C, S, cl)]);
        double m = block_sum(acc) / (double)cnt;
        double sq = 0.0;
        for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
            double d = (double)ld(x[bn_at(t, c, C, S, cl)]) - m;
            sq += d * d;
        }
        double v = block_sum(sq) / (double)cnt;
        if (threadIdx.x == 0) {
            mean[c] = (float)m;
            var[c] = (float)v;
        }
    }
}

/* The normalised value before a relu, one expression (an explicit FMA)
 * wherever the forward computes it and the backward asks where it was
 * positive (gp_bn_desc.relu), so both see the same bits. */
__device__ __forceinline__ float bn_pre(float x, float m, float sc, float sh)
{
    return __fmaf_rn(x - m, sc, sh);
}

/* The forward's scale (gamma inv) and shift (beta) of channel c, as
 * k_bnp_stats_final makes them. */
__device__ __forceinline__ void bn_scale_shift(const float *gamma, const float *beta,
                                               const float *var, float eps, int64_t c,
                                               float *sc, float *sh)
{
    *sc = (gamma ? gamma[c] : 1.0f) * gp_ew_bn_invstd(var[c], eps);
    *sh = beta ? beta[c] : 0.0f;
}

template <typename T>
__global__ void k_bn_bwd_sums(const T *x, const float *mean, const T *dy, int64_t N, int64_t C,
                              int64_t S, const float *gamma, const float *beta,
                              const float *var, float eps, int relu, float *sums, int cl)
{
    const int64_t cnt = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        const double m = (double)mean[c];
        float sc = 0.0f, sh = 0.0f;
        if (relu) bn_scale_shift(gamma, beta, var, eps, c, &sc, &sh);
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
            int64_t at = bn_at(t, c, C, S, cl);
            const float xv = ld(x[at]);
            double g = relu && !(bn_pre(xv, mean[c], sc, sh) > 0.0f) ? 0.0 : (double)ld(dy[at]);
            sdy += g;
            sdyx += g * ((double)xv - m);
        }
        double a = block_sum(sdy), b = block_sum(sdyx);
        if (threadIdx.x == 0) {
            sums[c] = (float)a;
            sums[C + c] = (float)b;
        }
    }
}

template <typename T>
__global__ void k_bn_bwd_apply(const T *x, const float *gamma, const float *beta, int relu,
                               const float *mean, const float *var, const T *dy,
                               const float *sums, double count, float eps, int64_t N, int64_t C,
                               int64_t S, T *dx, const float *local, float *dgamma,
                               float *dbeta, int cl)
{
    const int64_t cnt = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        const float g = gamma ? gamma[c] : 1.0f, m = mean[c];
        float ka, kb, kc;
        double dg, db;
        gp_ew_bn_bwd_coeffs(var[c], eps, g, (double)sums[c], (double)sums[C + c], count, &ka,
                            &kb, &kc, &dg, &db);
        if (threadIdx.x == 0 && dgamma && local) {
            float unused[3];
            gp_ew_bn_bwd_coeffs(var[c], eps, g, (double)local[c], (double)local[C + c], count,
                                &unused[0], &unused[1], &unused[2], &dg, &db);
            dgamma[c] += (float)dg;
            if (dbeta) dbeta[c] += (float)db;
        }
        if (!dx) continue;
        float sc = 0.0f, sh = 0.0f;
        if (relu) bn_scale_shift(gamma, beta, var, eps, c, &sc, &sh);
        for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
            int64_t at = bn_at(t, c, C, S, cl);
            const float xv = ld(x[at]);
            float g = relu && !(bn_pre(xv, m, sc, sh) > 0.0f) ? 0.0f : ld(dy[at]);
            st(&dx[at], gp_ew_bn_bwd_apply(g, xv, m, ka, kb, kc));
        }
    }
}

/* Channel c of (N, C, S) per block: y' and the sums in double, then dx
 * (backend.h's norm_leaky_bwd). */
/* y' of a stored value: FP32's rule, or bf16's (the relu's output rounded
 * as the leaky relu stores it, norm_leaky_bwd_bf16). */
__device__ __forceinline__ float nl_y(float v, int from_z, float slope)
{
    return gp_ew_norm_leaky_y(v, from_z, slope);
}
__device__ __forceinline__ float nl_y(uint16_t v, int from_z, float slope)
{
    return gp_ew_norm_leaky_y_b16(gp_ew_bf16_value(v), from_z, slope);
}

template <typename T>
__global__ void k_norm_leaky_bwd(const T *yz, int from_z, float slope, const float *var,
                                 float eps, const T *dy, T *dx, int64_t N, int64_t C, int64_t S)
{
    const int64_t cnt = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        double sdy = 0.0, sdyy = 0.0;
        for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
            int64_t at = bn_at(t, c, C, S, 0);
            double g = (double)ld(dy[at]);
            sdy += g;
            sdyy += g * (double)nl_y(yz[at], from_z, slope);
        }
        double a = block_sum(sdy), b = block_sum(sdyy);
        float ka, kb, kc;
        gp_ew_norm_leaky_coeffs(var[c], eps, a, b, (double)cnt, &ka, &kb, &kc);
        for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
            int64_t at = bn_at(t, c, C, S, 0);
            st(&dx[at], ka * ld(dy[at]) + kb * nl_y(yz[at], from_z, slope) + kc);
        }
    }
}

/* ---- layer norm: a block per row (backend.h's layer_norm_*) ---------------- */

/* Templated on the storage type of x, y, dy and dx (ld / st): the bf16
 * instances are layer_norm_*_bf16. */
/* Row r (xr) normalised into y's row, from each thread's partial sum s of
 * the values it reads (the j stride): the block's statistics, then y. */
template <typename T>
__device__ void ln_row(const T *xr, double s, const float *w, const float *b, T *y, float *mean,
                       float *rstd, int64_t r, int64_t c, float eps)
{
    double m = block_sum(s) / (double)c, v = 0.0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        v += ((double)ld(xr[j]) - m) * ((double)ld(xr[j]) - m);
    v = block_sum(v) / (double)c;
    float mf = (float)m, rs = gp_ew_ln_rstd(v, eps);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
        st(&y[r * c + j], (ld(xr[j]) - mf) * rs * w[j] + b[j]);
    if (threadIdx.x == 0) {
        mean[r] = mf;
        rstd[r] = rs;
    }
}

template <typename T>
__global__ void k_layer_norm_fwd(const T *x, const float *w, const float *b, T *y, float *mean,
                                 float *rstd, int64_t rows, int64_t c, float eps)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * c;
        double s = 0.0;
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += (double)ld(xr[j]);
        ln_row(xr, s, w, b, y, mean, rstd, r, c, eps);
    }
}

/* add_layer_norm_fwd: each row's sum s = a + b written (rounded as
 * stored) and normalised as k_layer_norm_fwd does, in one launch: each
 * thread reads back only the sums it wrote (the same j stride). */
template <typename T>
__global__ void k_add_layer_norm_fwd(const T *a, const T *bb, T *sum, const float *w,
                                     const float *b, T *y, float *mean, float *rstd, int64_t rows,
                                     int64_t c, float eps)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        T *xr = sum + r * c;
        double s = 0.0;
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
            st(&xr[j], ld(a[r * c + j]) + ld(bb[r * c + j]));
            s += (double)ld(xr[j]);
        }
        ln_row(static_cast<const T *>(xr), s, w, b, y, mean, rstd, r, c, eps);
    }
}

/* acc: dx += the gradient rounded to T first (gp_layers_accumulate's bits:
 * the norm's dx, then the sum of two T gradients in float, rounded once). */
template <typename T, bool acc>
__global__ void k_layer_norm_bwd_data(const T *x, const float *w, const float *mean,
                                      const float *rstd, const T *dy, T *dx, int64_t rows,
                                      int64_t c)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * c, *gr = dy + r * c;
        float mf = mean[r], rs = rstd[r];
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
            float g = ld(gr[j]) * w[j];
            sg += (double)g;
            sgx += (double)g * (double)((ld(xr[j]) - mf) * rs);
        }
        float a = (float)(block_sum(sg) / (double)c), bb = (float)(block_sum(sgx) / (double)c);
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
            float v = rs * (ld(gr[j]) * w[j] - a - (ld(xr[j]) - mf) * rs * bb);
            if (acc) {
                T t;
                st(&t, v);
                v = ld(t) + ld(dx[r * c + j]);
            }
            st(&dx[r * c + j], v);
        }
    }
}

/* The weights' sums as sum_rows's: a grid of (column tiles, row parts),
 * each part's sums in double into part[(p cols + j) 2 + {0: dw, 1: db}],
 * then a thread per column adding the parts in order (deterministic), where
 * a thread per column over every row left an H100 all but idle. */
template <typename T>
__global__ void k_layer_norm_bwd_weights_part(const T *x, const float *mean, const float *rstd,
                                              const T *dy, double *part, int64_t rows,
                                              int64_t cols)
{
    int64_t j = (int64_t)blockIdx.x * SR_COLS + threadIdx.x;
    double aw = 0.0, ab = 0.0;
    if (j < cols)
        for (int64_t r = (int64_t)blockIdx.y * SR_ROWS + threadIdx.y; r < rows;
             r += (int64_t)gridDim.y * SR_ROWS) {
            float g = ld(dy[r * cols + j]);
            aw += (double)g * (double)((ld(x[r * cols + j]) - mean[r]) * rstd[r]);
            ab += (double)g;
        }
    double sw = sr_tile_sum(aw), sb = sr_tile_sum(ab); /* each in the same tree */
    if (threadIdx.y == 0 && j < cols) {
        part[((int64_t)blockIdx.y * cols + j) * 2] = sw;
        part[((int64_t)blockIdx.y * cols + j) * 2 + 1] = sb;
    }
}

__global__ void k_layer_norm_bwd_weights_final(const double *part, int parts, float *dw,
                                               float *db, int64_t cols)
{
    GP_CUK_LOOP(j, cols) {
        double aw = 0.0, ab = 0.0;
        for (int p = 0; p < parts; p++) {
            aw += part[((int64_t)p * cols + j) * 2];
            ab += part[((int64_t)p * cols + j) * 2 + 1];
        }
        dw[j] += (float)aw;
        db[j] += (float)ab;
    }
}

/* ---- RMSNorm (backend.h's rms_norm_*, issue 66): a block per row as the
 * layer norm's; the weight's sums as its two-phase ones ---------------------- */

template <typename T>
__global__ void k_rms_norm_fwd(const T *x, const float *w, T *y, float *rstd, int64_t rows,
                               int64_t c, float eps)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * c;
        double s = 0.0;
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
            double v = (double)ld(xr[j]);
            s += v * v;
        }
        float rs = gp_ew_ln_rstd(block_sum(s) / (double)c, eps);
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
            st(&y[r * c + j], ld(xr[j]) * rs * w[j]);
        if (threadIdx.x == 0) rstd[r] = rs;
    }
}

template <typename T>
__global__ void k_rms_norm_bwd_data(const T *x, const float *w, const float *rstd, const T *dy,
                                    T *dx, int64_t rows, int64_t c)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * c, *gr = dy + r * c;
        float rs = rstd[r];
        double s = 0.0;
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
            s += (double)(ld(gr[j]) * w[j]) * (double)ld(xr[j]);
        float k2 = (float)(block_sum(s) / (double)c) * rs * rs;
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
            st(&dx[r * c + j], rs * (ld(gr[j]) * w[j] - ld(xr[j]) * k2));
    }
}

template <typename T>
__global__ void k_rms_norm_bwd_weights_part(const T *x, const float *rstd, const T *dy,
                                            double *part, int64_t rows, int64_t cols)
{
    int64_t j = (int64_t)blockIdx.x * SR_COLS + threadIdx.x;
    double aw = 0.0;
    if (j < cols)
        for (int64_t r = (int64_t)blockIdx.y * SR_ROWS + threadIdx.y; r < rows;
             r += (int64_t)gridDim.y * SR_ROWS)
            aw += (double)ld(dy[r * cols + j]) * (double)(ld(x[r * cols + j]) * rstd[r]);
    double s = sr_tile_sum(aw);
    if (threadIdx.y == 0 && j < cols) part[(int64_t)blockIdx.y * cols + j] = s;
}

/* ---- SwiGLU (backend.h's swiglu_*, issue 66): a thread per output ---------- */

template <typename T>
__global__ void k_swiglu_fwd(const T *x, T *y, int64_t rows, int64_t h)
{
    GP_CUK_LOOP(e, rows * h) {
        int64_t r = e / h, j = e % h;
        st(&y[e], gp_ew_swiglu(ld(x[r * 2 * h + j]), ld(x[r * 2 * h + h + j])));
    }
}

template <typename T>
__global__ void k_swiglu_bwd(const T *x, const T *dy, T *dx, int64_t rows, int64_t h)
{
    GP_CUK_LOOP(e, rows * h) {
        int64_t r = e / h, j = e % h;
        float da, db;
        gp_ew_swiglu_bwd(ld(x[r * 2 * h + j]), ld(x[r * 2 * h + h + j]), ld(dy[e]), &da, &db);
        st(&dx[r * 2 * h + j], da);
        st(&dx[r * 2 * h + h + j], db);
    }
}

/* ---- rotary position embeddings (backend.h's rope, issue 66): a thread per
 * rotated pair or copied value, the angle's cosine and sine on the fly */
template <typename T>
__global__ void k_rope(gp_rope_desc d, int inverse, const T *x, T *y)
{
    const int64_t half = d.d / 2, rot = d.heads * d.d, per = d.heads * half + (d.width - rot);
    GP_CUK_LOOP(e, d.rows * d.t * per) {
        int64_t r = e / per, k = e % per, o = r * d.width;
        if (k >= d.heads * half) { /* a value no rope touches */
            int64_t j = o + rot + (k - d.heads * half);
            if (x != y) y[j] = x[j];
            continue;
        }
        int64_t h = k / half, i = k % half, ia = o + h * d.d + i, ib = ia + half;
        float c, s, ya, yb;
        gp_ew_rope_cs(d.pos0 + r % d.t, d.inv_freq[i], &c, &s);
        gp_ew_rope(ld(x[ia]), ld(x[ib]), c, s, inverse != 0, &ya, &yb);
        st(&y[ia], ya);
        st(&y[ib], yb);
    }
}

/* ---- token and position embeddings (backend.h's embed_*) ------------------- */

__global__ void k_embed_check(const float *ids, int64_t rows, int64_t vocab, long long *first)
{
    GP_CUK_LOOP(r, rows) {
        float v = ids[r];
        if (!(v >= 0.0f && v < (float)vocab) || v != floorf(v)) atomicMin(first, (long long)r);
    }
}
__global__ void k_embed_none(long long *first, long long rows)
{
    if (*first >= rows) *first = -1;
}
/* y FP32, or bf16 (b16: the sum rounded once) */
__global__ void k_embed_fwd(const float *ids, const float *wte, const float *wpe, void *y,
                            int b16, int64_t rows, int64_t t, int64_t c)
{
    GP_CUK_LOOP(e, rows * c) {
        int64_t r = e / c, j = e % c;
        float v = wte[(int64_t)ids[r] * c + j];
        if (wpe) v += wpe[(r % t) * c + j]; /* NULL: no position table */
        if (b16) ((uint16_t *)y)[e] = gp_ew_bf16_bits(v);
        else ((float *)y)[e] = v;
    }
}
/* dy FP32, or bf16 (b16: widened as it is read) */
__device__ __forceinline__ float embed_dy(const void *dy, int b16, int64_t i)
{
    return b16 ? gp_ew_bf16_value(((const uint16_t *)dy)[i]) : ((const float *)dy)[i];
}

/* dwte: a block per vocabulary row v, its threads over the columns; the
 * rows' ids read a tile at a time into shared memory, and each row of id v
 * added in row order (every element's sum in the order a thread per column
 * over all rows gave: the same bits, without c threads doing all the work
 * while the GPU idles).  No atomics: the bits repeat. */
#define EB_TILE 1024
__global__ void k_embed_bwd_wte(const float *ids, const void *dy, int b16, float *dwte,
                                int64_t rows, int64_t c, int64_t vocab)
{
    __shared__ int64_t tile[EB_TILE];
    for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
        for (int64_t r0 = 0; r0 < rows; r0 += EB_TILE) {
            int64_t nt = rows - r0 < EB_TILE ? rows - r0 : EB_TILE;
            __syncthreads(); /* the last tile is read */
            for (int64_t i = threadIdx.x; i < nt; i += blockDim.x) tile[i] = (int64_t)ids[r0 + i];
            __syncthreads();
            for (int64_t i = 0; i < nt; i++) {
                if (tile[i] != v) continue;
                for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
                    dwte[v * c + j] += embed_dy(dy, b16, (r0 + i) * c + j);
            }
        }
    }
}

/* dwpe: a thread per (position, column), the samples in order. */
__global__ void k_embed_bwd_wpe(const void *dy, int b16, float *dwpe, int64_t rows, int64_t t,
                                int64_t c)
{
    GP_CUK_LOOP(e, t * c) {
        int64_t p = e / c, j = e % c;
        for (int64_t r = p; r < rows; r += t) dwpe[p * c + j] += embed_dy(dy, b16, r * c + j);
    }
}

inline unsigned channel_blocks(int64_t C) { return (unsigned)(C < 65535 ? C : 65535); }

/* ---- batch norm over planes (S >= 32): a warp per (n, c) plane of S
 * contiguous values for the sums, a block per channel to add the planes'
 * partials in a fixed order, and a block per plane for the elementwise
 * pass, where a block per channel left most of an H100 idle and cuDNN's
 * NCHW kernels move about 1.3 TB/s.  Sums in double. */

/* Block c (every thread): the pairs part[2 (n C + c)], part[2 (n C + c) +
 * 1] added over n, thread t taking n = t, t + 256, .. in order, then the
 * fixed tree; the totals in thread 0's *a and *b. */
__device__ void channel_pair_sum(const double *part, int64_t N, int64_t C, int64_t c, double *a,
                                 double *b)
{
    double sa = 0.0, sb = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        sa += part[2 * (n * C + c)];
        sb += part[2 * (n * C + c) + 1];
    }
    *a = block_sum(sa);
    *b = block_sum(sb);
}

/* part[2 p], part[2 p + 1] of plane p = n C + c: the sums of (x - pivot[c])
 * and of its square, pivot = the channel's first value (x[c S]), which
 * keeps the square sums from cancelling. */
template <typename T>
__global__ void k_bnp_stats_part(const T *x, int64_t planes, int64_t C, int64_t S, double *part)
{
    int64_t p = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = (int)(threadIdx.x % 32);
    if (p >= planes) return; /* the whole warp */
    const T *q = x + p * S;
    double piv = (double)ld(x[(p % C) * S]), a = 0.0, b = 0.0;
    for (int64_t i = lane; i < S; i += 32) {
        double d = (double)ld(q[i]) - piv;
        a += d;
        b += d * d;
    }
    a = warp_sum(a);
    b = warp_sum(b);
    if (lane == 0) {
        part[2 * p] = a;
        part[2 * p + 1] = b;
    }
}

/* Block c: the channel's sums over n (thread t takes n = t, t + 256, ..
 * in order, then the fixed tree), mean and biased var; with vec (2 C
 * floats) also the scale gamma inv and the shift beta of y = (x - mean)
 * scale + shift.  The pivot x[c ps]: the channel's first value, ps = S
 * plain, 1 channels-last. */
template <typename T>
__global__ void k_bnp_stats_final(const double *part, const T *x, int64_t N, int64_t C,
                                  int64_t S, int64_t ps, float eps, const float *gamma,
                                  const float *beta, float *mean, float *var, float *vec)
{
    int64_t c = blockIdx.x;
    double a, b;
    channel_pair_sum(part, N, C, c, &a, &b);
    if (threadIdx.x == 0) {
        double cnt = (double)(N * S), piv = (double)ld(x[c * ps]), ma = a / cnt;
        double v = b / cnt - ma * ma;
        float m = (float)(piv + ma), vv = (float)(v > 0.0 ? v : 0.0);
        if (v != v) vv = (float)v; /* NaN stays NaN */
        if (mean) mean[c] = m;
        if (var) var[c] = vv;
        if (vec) {
            vec[c] = (gamma ? gamma[c] : 1.0f) * gp_ew_bn_invstd(vv, eps);
            vec[C + c] = beta ? beta[c] : 0.0f;
        }
    }
}

/* y = (x - mean) scale + shift over plane blockIdx.x, plus add where
 * given (a residual block's sum, gp_bn_desc.add), then relu where asked
 * (gp_ew_relu, as the relu kernel). */
template <typename T>
__global__ void k_bnp_apply(const T *x, const float *mean, const float *vec, int64_t C,
                            int64_t S, int relu, const T *add, T *y)
{
    int64_t p = blockIdx.x, c = p % C;
    const float m = mean[c], sc = vec[c], sh = vec[C + c];
    const T *q = x + p * S;
    T *o = y + p * S;
    if (add) {
        const T *t = add + p * S;
        for (int64_t i = threadIdx.x; i < S; i += blockDim.x) {
            float v = bn_pre(ld(q[i]), m, sc, sh) + ld(t[i]);
            st(&o[i], relu ? gp_ew_relu(v) : v);
        }
    } else if (relu)
        for (int64_t i = threadIdx.x; i < S; i += blockDim.x)
            st(&o[i], gp_ew_relu(bn_pre(ld(q[i]), m, sc, sh)));
    else
        for (int64_t i = threadIdx.x; i < S; i += blockDim.x) st(&o[i], bn_pre(ld(q[i]), m, sc, sh));
}

/* vec = the forward's scale (C) and shift (C) per channel. */
__global__ void k_bn_vec(const float *gamma, const float *beta, const float *var, float eps,
                         int64_t C, float *vec)
{
    GP_CUK_LOOP(c, C) bn_scale_shift(gamma, beta, var, eps, c, &vec[c], &vec[C + c]);
}

/* y = bn_pre (+ add where given; relu'd where asked) over all n values,
 * any plane size. */
template <typename T>
__global__ void k_bn_apply(const T *x, const float *mean, const float *vec, int64_t C,
                           int64_t S, int64_t n, int relu, const T *add, T *y)
{
    GP_CUK_LOOP(i, n)
    {
        int64_t c = (i / S) % C;
        float v = bn_pre(ld(x[i]), mean[c], vec[c], vec[C + c]);
        if (add) v += ld(add[i]);
        st(&y[i], relu ? gp_ew_relu(v) : v);
    }
}

/* dym = dy where the forward's bn_pre was positive, else 0 (relu_bwd's
 * rule on the relu's output). */
__global__ void k_bn_relu_mask(const float *x, const float *mean, const float *vec, int64_t C,
                               int64_t S, int64_t n, const float *dy, float *dym)
{
    GP_CUK_LOOP(i, n)
    {
        int64_t c = (i / S) % C;
        dym[i] = bn_pre(x[i], mean[c], vec[c], vec[C + c]) > 0.0f ? dy[i] : 0.0f;
    }
}

/* part[2 p] = sum dy, part[2 p + 1] = sum dy (x - mean) over plane p;
 * with relu, dy masked where the forward's value was not positive. */
template <typename T>
__global__ void k_bnp_bwd_part(const T *x, const float *mean, const T *dy, int64_t planes, int64_t C, int64_t S, const float *gamma,
                               const float *beta, const float *var, float eps, int relu,
                               double *part)
{
    int64_t p = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = (int)(threadIdx.x % 32);
    if (p >= planes) return;
    const T *q = x + p * S, *g = dy + p * S;
    const float mf = mean[p % C];
    float sc = 0.0f, sh = 0.0f;
    if (relu) bn_scale_shift(gamma, beta, var, eps, p % C, &sc, &sh);
    double m = (double)mf, a = 0.0, b = 0.0;
    for (int64_t i = lane; i < S; i += 32) {
        const float xv = ld(q[i]);
        double d = relu && !(bn_pre(xv, mf, sc, sh) > 0.0f) ? 0.0 : (double)ld(g[i]);
        a += d;
        b += d * ((double)xv - m);
    }
    a = warp_sum(a);
    b = warp_sum(b);
    if (lane == 0) {
        part[2 * p] = a;
        part[2 * p + 1] = b;
    }
}

/* Block c: the sums over n into sums (2 C floats, bn_bwd_sums' layout)
 * where not NULL; with vec (3 C floats) the coefficients of dx = a dy +
 * b (x - mean) + c, and dgamma +=, dbeta += where not NULL. */
__global__ void k_bnp_bwd_final(const double *part, int64_t N, int64_t C, int64_t S,
                                const float *var, float eps, const float *gamma, float *sums,
                                float *vec, float *dgamma, float *dbeta)
{
    int64_t c = blockIdx.x;
    double a, b;
    channel_pair_sum(part, N, C, c, &a, &b);
    if (threadIdx.x == 0) {
        if (sums) {
            sums[c] = (float)a;
            sums[C + c] = (float)b;
        }
        if (vec) {
            double dg, db;
            gp_ew_bn_bwd_coeffs(var[c], eps, gamma ? gamma[c] : 1.0f, a, b, (double)(N * S),
                                &vec[c], &vec[C + c], &vec[2 * C + c], &dg, &db);
            if (dgamma) dgamma[c] += (float)dg;
            if (dbeta) dbeta[c] += (float)db;
        }
    }
}

template <typename T>
__global__ void k_bnp_bwd_apply(const T *x, const float *mean, const T *dy, const float *vec,
                                int64_t C, int64_t S, const float *gamma, const float *beta,
                                const float *var, float eps, int relu, T *dx)
{
    int64_t p = blockIdx.x, c = p % C;
    const float m = mean[c], ka = vec[c], kb = vec[C + c], kc = vec[2 * C + c];
    const T *q = x + p * S, *g = dy + p * S;
    T *o = dx + p * S;
    if (relu) {
        float sc, sh;
        bn_scale_shift(gamma, beta, var, eps, c, &sc, &sh);
        for (int64_t i = threadIdx.x; i < S; i += blockDim.x) {
            const float xv = ld(q[i]);
            float gv = bn_pre(xv, m, sc, sh) > 0.0f ? ld(g[i]) : 0.0f;
            st(&o[i], gp_ew_bn_bwd_apply(gv, xv, m, ka, kb, kc));
        }
    } else {
        for (int64_t i = threadIdx.x; i < S; i += blockDim.x)
            st(&o[i], gp_ew_bn_bwd_apply(ld(g[i]), ld(q[i]), m, ka, kb, kc));
    }
}

/* ---- the same on channels-last maps (x as (N, S, C): issue 67).  A block
 * is CL_CH channels of one n by the 32 lanes of the plain kernels' warp:
 * lane l of channel c sums the pixels l, l + 32, .. of plane (n, c) in
 * order, as the plain warp does, and the lanes meet in warp_sum's tree
 * (shfl_down by 16, 8, 4, 2, 1) in shared memory, so the partials are the
 * plain kernels' bits; a warp reads 32 consecutive channels of a pixel.
 * Blocks of 1024 threads: __launch_bounds__ keeps their registers within
 * what a launch of that size may have. */
#define CL_CH 32

/* The 32 lanes' a and b of column threadIdx.x summed in warp_sum's tree,
 * into lane (threadIdx.y) 0's *a and *b. */
__device__ void cl_lane_sum(double *a, double *b)
{
    __shared__ double sa[32][CL_CH + 1], sb[32][CL_CH + 1];
    sa[threadIdx.y][threadIdx.x] = *a;
    sb[threadIdx.y][threadIdx.x] = *b;
    __syncthreads();
    for (unsigned o = 16; o > 0; o >>= 1) {
        if (threadIdx.y < o) {
            sa[threadIdx.y][threadIdx.x] += sa[threadIdx.y + o][threadIdx.x];
            sb[threadIdx.y][threadIdx.x] += sb[threadIdx.y + o][threadIdx.x];
        }
        __syncthreads();
    }
    *a = sa[0][threadIdx.x];
    *b = sb[0][threadIdx.x];
}

/* k_bnp_stats_part on channels-last x: grid (C / CL_CH rounded up, N). */
template <typename T>
__global__ void __launch_bounds__(CL_CH * 32)
    k_bnp_stats_part_cl(const T *x, int64_t C, int64_t S, double *part)
{
    int64_t c = (int64_t)blockIdx.x * CL_CH + threadIdx.x, n = blockIdx.y;
    double a = 0.0, b = 0.0;
    if (c < C) {
        const T *q = x + n * S * C + c;
        double piv = (double)ld(x[c]);
        for (int64_t i = threadIdx.y; i < S; i += 32) {
            double d = (double)ld(q[i * C]) - piv;
            a += d;
            b += d * d;
        }
    }
    cl_lane_sum(&a, &b); /* every thread: it synchronises */
    if (threadIdx.y == 0 && c < C) {
        part[2 * (n * C + c)] = a;
        part[2 * (n * C + c) + 1] = b;
    }
}

/* k_bnp_bwd_part on channels-last x and dy. */
template <typename T>
__global__ void __launch_bounds__(CL_CH * 32)
    k_bnp_bwd_part_cl(const T *x, const float *mean, const T *dy, int64_t C, int64_t S,
                      const float *gamma, const float *beta, const float *var, float eps,
                      int relu, double *part)
{
    int64_t c = (int64_t)blockIdx.x * CL_CH + threadIdx.x, n = blockIdx.y;
    double a = 0.0, b = 0.0;
    if (c < C) {
        const T *q = x + n * S * C + c, *g = dy + n * S * C + c;
        const float mf = mean[c];
        float sc = 0.0f, sh = 0.0f;
        if (relu) bn_scale_shift(gamma, beta, var, eps, c, &sc, &sh);
        double m = (double)mf;
        for (int64_t i = threadIdx.y; i < S; i += 32) {
            const float xv = ld(q[i * C]);
            double d = relu && !(bn_pre(xv, mf, sc, sh) > 0.0f) ? 0.0 : (double)ld(g[i * C]);
            a += d;
            b += d * ((double)xv - m);
        }
    }
    cl_lane_sum(&a, &b);
    if (threadIdx.y == 0 && c < C) {
        part[2 * (n * C + c)] = a;
        part[2 * (n * C + c) + 1] = b;
    }
}

/* k_bnp_bwd_apply's expression over all n values of channels-last maps;
 * with relu the forward's scale and shift are vec[3 C + c], vec[4 C + c]
 * (k_bn_vec's, bn_scale_shift's bits), made once, not per element. */
template <typename T>
__global__ void k_bnp_bwd_apply_cl(const T *x, const float *mean, const T *dy, const float *vec,
                                   int64_t C, int64_t n, int relu, T *dx)
{
    GP_CUK_LOOP(i, n)
    {
        int64_t c = i % C;
        const float m = mean[c], xv = ld(x[i]);
        float gv = ld(dy[i]);
        if (relu && !(bn_pre(xv, m, vec[3 * C + c], vec[4 * C + c]) > 0.0f)) gv = 0.0f;
        st(&dx[i], gp_ew_bn_bwd_apply(gv, xv, m, vec[c], vec[C + c], vec[2 * C + c]));
    }
}

/* Launch shapes: warps for the partials, and a block of S rounded up to
 * a warp (at most 256) per plane for the elementwise passes. */
inline unsigned warp_blocks(int64_t planes)
{
    return (unsigned)((planes * 32 + GP_CUK_THREADS - 1) / GP_CUK_THREADS);
}
/* The channels-last partials' grid: CL_CH channels by one n a block. */
inline dim3 cl_grid(int64_t n, int64_t c)
{
    return dim3((unsigned)((c + CL_CH - 1) / CL_CH), (unsigned)n);
}
inline unsigned plane_threads(int64_t S)
{
    int64_t t = (S + 31) / 32 * 32;
    return (unsigned)(t < GP_CUK_THREADS ? t : GP_CUK_THREADS);
}

/* ---- layout changes (issue 67): each of `batches` row-major (rows, cols)
 * matrices of src transposed into dst, through a 32x32 tile in shared
 * memory so that both sides are read and written a row of 32 at a time;
 * the values widened (ld) and rounded once (st) where the storage types
 * differ, as the pack and unpack kernels do, and added to dst with add.
 * NCHW to NHWC is (C, H W) to (H W, C) per image, and back; KCRS weights
 * to KRSC likewise per output channel. */
template <typename S, typename D>
__global__ void k_transpose(const S *src, D *dst, int64_t rows, int64_t cols, int add)
{
    __shared__ float tile[32][33];
    const S *sp = src + (int64_t)blockIdx.z * rows * cols;
    D *dp = dst + (int64_t)blockIdx.z * rows * cols;
    int64_t c0 = (int64_t)blockIdx.x * 32;
    /* the row tiles in steps of gridDim.y: a map of any height */
    for (int64_t r0 = (int64_t)blockIdx.y * 32; r0 < rows; r0 += (int64_t)gridDim.y * 32) {
        for (unsigned k = threadIdx.y; k < 32; k += blockDim.y) {
            int64_t r = r0 + k, c = c0 + threadIdx.x;
            if (r < rows && c < cols) tile[k][threadIdx.x] = ld(sp[r * cols + c]);
        }
        __syncthreads();
        for (unsigned k = threadIdx.y; k < 32; k += blockDim.y) {
            int64_t c = c0 + k, r = r0 + threadIdx.x; /* dst is (cols, rows) */
            if (r < rows && c < cols) {
                float v = tile[threadIdx.x][k];
                D *o = &dp[c * rows + r];
                st(o, add ? ld(*o) + v : v);
            }
        }
        __syncthreads(); /* the tile read before the next rows overwrite it */
    }
}

template <typename S, typename D>
cudaError_t transpose(cudaStream_t s, D *dst, const S *src, int64_t batches, int64_t rows,
                      int64_t cols, int add)
{
    int64_t gx = (cols + 31) / 32, gy = (rows + 31) / 32;
    if (batches <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
    if (gx > INT_MAX || batches > 65535) return cudaErrorInvalidValue;
    if (gy > 65535) gy = 65535; /* (k_transpose steps over the rest) */
    k_transpose<S, D><<<dim3((unsigned)gx, (unsigned)gy, (unsigned)batches), dim3(32, 8), 0, s>>>(
        src, dst, rows, cols, add);
    return cudaGetLastError();
}
} /* namespace */

/* ---- launchers -------------------------------------------------------------- */

#define GP_CUK_LAUNCH(n, kernel, ...)                                                      \
    do {                                                                                    \
        if ((n) > 0) kernel<<<blocks_for(n), GP_CUK_THREADS, 0, s>>>(__VA_ARGS__);          \
        return cudaGetLastError();                                                          \
    } while (0)

extern "C" {

cudaError_t gp_cuk_transpose(cudaStream_t s, void *dst, int dst16, const void *src, int src16,
                             int64_t batches, int64_t rows, int64_t cols, int add)
{
    if (src16 && dst16)
        return transpose(s, (uint16_t *)dst, (const uint16_t *)src, batches, rows, cols, add);
    if (src16)
        return transpose(s, (float *)dst, (const uint16_t *)src, batches, rows, cols, add);
    if (dst16)
        return transpose(s, (uint16_t *)dst, (const float *)src, batches, rows, cols, add);
    return transpose(s, (float *)dst, (const float *)src, batches, rows, cols, add);
}

cudaError_t gp_cuk_fill(cudaStream_t s, float *x, float v, int64_t n)
{
    GP_CUK_LAUNCH(n, k_fill, x, v, n);
}

cudaError_t gp_cuk_scale(cudaStream_t s, float *x, float a, int64_t n)
{
    GP_CUK_LAUNCH(n, k_scale, x, a, n);
}

cudaError_t gp_cuk_axpy(cudaStream_t s, float a, const float *x, float *y, int64_t n)
{
    GP_CUK_LAUNCH(n, k_axpy, a, x, y, n);
}

cudaError_t gp_cuk_add(cudaStream_t s, const float *a, const float *b, float *y, int64_t n)
{
    GP_CUK_LAUNCH(n, k_add, a, b, y, n);
}

cudaError_t gp_cuk_copy_box(cudaStream_t s, void *dst, const int64_t ds[4], const void *src,
                            const int64_t ss[4], const int64_t dims[4], size_t es)
{
    box4 b;
    for (int q = 0; q < 4; q++) {
        b.ds[q] = ds[q];
        b.ss[q] = ss[q];
        b.dims[q] = dims[q];
    }
    int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
    if (n <= 0) return cudaSuccess;
    if (es == 2) /* bf16: moved as 16-bit patterns */
        GP_CUK_LAUNCH(n, k_copy_box<uint16_t>, (uint16_t *)dst, (const uint16_t *)src, b, n);
    GP_CUK_LAUNCH(n, k_copy_box<float>, (float *)dst, (const float *)src, b, n);
}

cudaError_t gp_cuk_mul(cudaStream_t s, const float *a, const float *b, float *y, int64_t n)
{
    GP_CUK_LAUNCH(n, k_mul, a, b, y, n);
}

cudaError_t gp_cuk_relu_fwd(cudaStream_t s, const float *x, float *y, int64_t n)
{
    GP_CUK_LAUNCH(n, k_relu_fwd, x, y, n);
}

cudaError_t gp_cuk_relu_bwd(cudaStream_t s, const float *y, const float *dy, float *dx,
                            int64_t n)
{
    GP_CUK_LAUNCH(n, k_relu_bwd, y, dy, dx, n);
}

cudaError_t gp_cuk_sgd(cudaStream_t s, float *w, const float *g, float *v, int64_t n,
                       float lr, float mu, float wd, int nesterov)
{
    GP_CUK_LAUNCH(n, k_sgd, w, g, v, n, lr, mu, wd, nesterov);
}

cudaError_t gp_cuk_dropout_apply(cudaStream_t s, const float *x, float *y, int64_t n, float p,
                                 uint64_t seed, uint64_t stream, uint64_t first)
{
    GP_CUK_LAUNCH(n, k_dropout_apply, x, y, n, p, seed, stream, first);
}

cudaError_t gp_cuk_bf16_pack(cudaStream_t s, uint16_t *dst, const float *src, int64_t n)
{
    GP_CUK_LAUNCH(n, k_bf16_pack, dst, src, n);
}

cudaError_t gp_cuk_bf16_unpack(cudaStream_t s, float *dst, const uint16_t *src, int64_t n)
{
    GP_CUK_LAUNCH(n, k_bf16_unpack, dst, src, n);
}

cudaError_t gp_cuk_bf16_pack2d(cudaStream_t s, uint16_t *dst, const float *src, int64_t rows,
                               int64_t cols, int64_t ld)
{
    GP_CUK_LAUNCH(rows * cols, k_bf16_pack2d, dst, src, rows, cols, ld);
}

cudaError_t gp_cuk_bf16_unpack_bias(cudaStream_t s, float *dst, const uint16_t *src,
                                    const float *b, int64_t n, int64_t k, int64_t hw)
{
    GP_CUK_LAUNCH(n, k_bf16_unpack_bias, dst, src, b, n, k, hw);
}

cudaError_t gp_cuk_bf16_bias(cudaStream_t s, uint16_t *y, const float *b, int64_t n, int64_t k,
                             int64_t hw)
{
    GP_CUK_LAUNCH(n, k_bf16_bias, y, b, n, k, hw);
}

cudaError_t gp_cuk_bf16_unpack_add(cudaStream_t s, float *dst, const uint16_t *src, int64_t n)
{
    GP_CUK_LAUNCH(n, k_bf16_unpack_add, dst, src, n);
}

/* Fills t's block table (part p owns blocks [first[p], first[p + 1]),
 * as many as its size asks, capped) and returns the grid's blocks. */
static unsigned multi_blocks(gp_cuk_sgd_table *t)
{
    unsigned blocks = 0;
    for (int i = 0; i < t->parts; i++) {
        t->first[i] = blocks;
        int64_t b = (t->n[i] + GP_CUK_THREADS - 1) / GP_CUK_THREADS;
        blocks += (unsigned)(b < 1 ? 1 : b > SGD_BLOCKS_CAP ? SGD_BLOCKS_CAP : b);
    }
    t->first[t->parts] = blocks;
    return blocks;
}

cudaError_t gp_cuk_sgd_multi(cudaStream_t s, gp_cuk_sgd_table *t, float lr, float mu,
                             int nesterov)
{
    if (t->parts <= 0) return cudaSuccess;
    if (t->parts > GP_CUK_SGD_PARTS) return cudaErrorInvalidValue;
    unsigned blocks = multi_blocks(t);
    k_sgd_multi<<<blocks, GP_CUK_THREADS, 0, s>>>(*t, lr, mu, nesterov);
    return cudaGetLastError();
}

cudaError_t gp_cuk_adam_multi(cudaStream_t s, gp_cuk_sgd_table *t, gp_adam_step a)
{
    if (t->parts <= 0) return cudaSuccess;
    if (t->parts > GP_CUK_SGD_PARTS) return cudaErrorInvalidValue;
    unsigned blocks = multi_blocks(t);
    k_adam_multi<<<blocks, GP_CUK_THREADS, 0, s>>>(*t, a);
    return cudaGetLastError();
}

cudaError_t gp_cuk_dropout_mask(cudaStream_t s, float *mask, int64_t n, float p,
                                uint64_t seed, uint64_t stream, uint64_t first)
{
    GP_CUK_LAUNCH(n, k_dropout, mask, n, p, seed, stream, first);
}

cudaError_t gp_cuk_scale_matrix(cudaStream_t s, float *c, int64_t m, int64_t n,
                                int64_t ldc, float beta)
{
    GP_CUK_LAUNCH(m * n, k_scale_matrix, c, m, n, ldc, beta);
}

cudaError_t gp_cuk_add_bias_rows(cudaStream_t s, float *y, const float *bias, int64_t rows,
                                 int64_t cols)
{
    GP_CUK_LAUNCH(rows * cols, k_add_bias_rows, y, bias, rows, cols);
}

cudaError_t gp_cuk_bias_relu_rows(cudaStream_t s, float *y, const float *bias, int64_t rows,
                                  int64_t cols)
{
    GP_CUK_LAUNCH(rows * cols, k_bias_relu_rows, y, bias, rows, cols);
}

cudaError_t gp_cuk_sum_rows(cudaStream_t s, const float *dy, float *db, int64_t rows,
                            int64_t cols, double *part, bool over)
{
    if (cols <= 0) return cudaSuccess;
    int parts = gp_cuk_sum_rows_parts(rows, cols);
    int64_t bx = (cols + SR_COLS - 1) / SR_COLS;
    if (bx > INT_MAX) return cudaErrorInvalidValue;
    k_sum_rows_part<float><<<dim3((unsigned)bx, (unsigned)parts), dim3(SR_COLS, SR_ROWS), 0, s>>>(
        dy, part, rows, cols);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    GP_CUK_LAUNCH(cols, k_sum_rows_final, part, parts, db, cols, (int)over);
}

cudaError_t gp_cuk_sum_rows_bf16(cudaStream_t s, const uint16_t *dy, float *db, int64_t rows,
                                 int64_t cols, double *part, bool over)
{
    if (cols <= 0) return cudaSuccess; /* as gp_cuk_sum_rows */
    int parts = gp_cuk_sum_rows_parts(rows, cols);
    int64_t bx = (cols + SR_COLS - 1) / SR_COLS;
    if (bx > INT_MAX) return cudaErrorInvalidValue;
    k_sum_rows_part<uint16_t><<<dim3((unsigned)bx, (unsigned)parts), dim3(SR_COLS, SR_ROWS), 0,
                                s>>>(dy, part, rows, cols);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    GP_CUK_LAUNCH(cols, k_sum_rows_final, part, parts, db, cols, (int)over);
}

} /* extern "C" */

namespace {
template <typename T>
cudaError_t sum_planes(cudaStream_t s, const T *dy, float *db, int64_t n, int64_t k, int64_t hw,
                       double *part)
{
    int64_t planes = n * k, blocks = (planes * 32 + GP_CUK_THREADS - 1) / GP_CUK_THREADS;
    if (planes <= 0) return cudaSuccess;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    k_sum_planes_part<T><<<(unsigned)blocks, GP_CUK_THREADS, 0, s>>>(dy, part, planes, hw);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    k_sum_planes_final<<<k < 65535 ? (unsigned)k : 65535u, GP_CUK_THREADS, 0, s>>>(part, db, n,
                                                                                 k);
    return cudaGetLastError();
}
} /* namespace */

extern "C" {

cudaError_t gp_cuk_sum_planes(cudaStream_t s, const float *dy, float *db, int64_t n, int64_t k,
                              int64_t hw, double *part)
{
    return sum_planes(s, dy, db, n, k, hw, part);
}

cudaError_t gp_cuk_sum_planes_bf16(cudaStream_t s, const uint16_t *dy, float *db, int64_t n,
                                   int64_t k, int64_t hw, double *part)
{
    return sum_planes(s, dy, db, n, k, hw, part);
}

cudaError_t gp_cuk_sumsq(cudaStream_t s, const float *x, int64_t n, double *partials,
                         double *out)
{
    k_sumsq_partial<<<GP_CUK_RED_BLOCKS, GP_CUK_THREADS, 0, s>>>(x, n, partials);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    k_sum_partials<<<1, GP_CUK_THREADS, 0, s>>>(partials, GP_CUK_RED_BLOCKS, out);
    return cudaGetLastError();
}

cudaError_t gp_cuk_sumsq_many_partial(cudaStream_t s, const gp_cuk_tensor_table *t,
                                      double *partials)
{
    if (t->count <= 0) return cudaSuccess;
    k_sumsq_partial_many<<<dim3(GP_CUK_RED_BLOCKS, (unsigned)t->count), GP_CUK_THREADS, 0, s>>>(
        *t, partials);
    return cudaGetLastError();
}

cudaError_t gp_cuk_sum_partials_many(cudaStream_t s, const double *partials, int count,
                                     double *out)
{
    if (count <= 0) return cudaSuccess;
    k_sum_partials_many<<<(unsigned)count, GP_CUK_THREADS, 0, s>>>(partials, out);
    return cudaGetLastError();
}

cudaError_t gp_cuk_nonfinite(cudaStream_t s, const float *x, int64_t n, int *flag)
{
    cudaError_t e = cudaMemsetAsync(flag, 0, sizeof *flag, s);
    if (e != cudaSuccess) return e;
    GP_CUK_LAUNCH(n, k_nonfinite, x, n, flag);
}

cudaError_t gp_cuk_nonfinite_or(cudaStream_t s, const float *x, int64_t n, float *flag)
{
    GP_CUK_LAUNCH(n, k_nonfinite_or, x, n, flag);
}

cudaError_t gp_cuk_nonfinite_or_many(cudaStream_t s, const gp_cuk_tensor_table *t, float *flag)
{
    if (t->count <= 0) return cudaSuccess;
    int64_t most = 0;
    for (int i = 0; i < t->count; i++) most = t->n[i] > most ? t->n[i] : most;
    unsigned bx = blocks_for(most);
    if (bx > 1024) bx = 1024; /* the grid-stride loop covers the rest */
    k_nonfinite_or_many<<<dim3(bx, (unsigned)t->count), GP_CUK_THREADS, 0, s>>>(*t, flag);
    return cudaGetLastError();
}

cudaError_t gp_cuk_zero_many(cudaStream_t s, const gp_cuk_tensor_table *t)
{
    if (t->count <= 0) return cudaSuccess;
    int64_t most = 0;
    for (int i = 0; i < t->count; i++) most = t->n[i] > most ? t->n[i] : most;
    unsigned bx = blocks_for(most);
    if (bx > 1024) bx = 1024; /* the grid-stride loop covers the rest */
    k_zero_many<<<dim3(bx, (unsigned)t->count), GP_CUK_THREADS, 0, s>>>(*t);
    return cudaGetLastError();
}

cudaError_t gp_cuk_bn_merge(cudaStream_t s, double *mean_acc, double *m2_acc, double na,
                            double nb, const float *mean, const float *var, int64_t c)
{
    GP_CUK_LAUNCH(c, k_bn_merge, mean_acc, m2_acc, na, nb, mean, var, c);
}

cudaError_t gp_cuk_bn_commit(cudaStream_t s, float *rmean, float *rvar, double *mean_acc,
                             double *m2_acc, double m, double count, int64_t c)
{
    GP_CUK_LAUNCH(c, k_bn_commit, rmean, rvar, mean_acc, m2_acc, m, count, c);
}

} /* extern "C" */

namespace {
/* Up to GP_CUK_BN_COMMIT_MAX commits in one launch: the table travels in
 * the kernel's parameters (96 bytes a norm); blockIdx.y picks the norm, a
 * thread a channel: its pending micro-batches merged in order, then the
 * commit. */
struct bn_commit_table {
    gp_cuk_bn_commit_part p[GP_CUK_BN_COMMIT_MAX];
};
static_assert(sizeof(bn_commit_table) <= 4096, "a kernel's parameters hold at most 4 KiB");
__global__ void k_bn_commit_multi(bn_commit_table t)
{
    const gp_cuk_bn_commit_part &q = t.p[blockIdx.y];
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < q.c;
         k += (int64_t)blockDim.x * gridDim.x) {
        gp_ew_bn_fold(&q.mean_acc[k], &q.m2_acc[k], q.pend, q.c, k, q.n_pend, q.n_hi, q.na,
                      q.nb_hi, q.nb_lo);
        gp_ew_bn_commit(&q.rmean[k], &q.rvar[k], &q.mean_acc[k], &q.m2_acc[k], q.momentum,
                        q.count);
    }
}
} /* namespace */

extern "C" {

cudaError_t gp_cuk_bn_commit_multi(cudaStream_t s, const gp_cuk_bn_commit_part *parts, int n)
{
    if (n <= 0) return cudaSuccess;
    if (n > GP_CUK_BN_COMMIT_MAX) return cudaErrorInvalidValue;
    bn_commit_table t;
    int64_t most = 1;
    for (int i = 0; i < n; i++) {
        t.p[i] = parts[i];
        if (t.p[i].c > most) most = t.p[i].c;
    }
    k_bn_commit_multi<<<dim3(blocks_for(most), (unsigned)n), GP_CUK_THREADS, 0, s>>>(t);
    return cudaGetLastError();
}

} /* extern "C" */

namespace {
template <typename T>
cudaError_t xent(cudaStream_t s, const T *logits, const float *labels, int64_t rows, int64_t cols,
                 int64_t ld, float scale, float smoothing, T *dlogits, double *row_loss,
                 long long *row_flag, gp_cuk_xent_out *out)
{
    if (rows <= 0) return cudaSuccess;
    k_xent_check<<<blocks_for(rows), GP_CUK_THREADS, 0, s>>>(labels, rows, cols, row_flag);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    k_xent_first_bad<<<1, GP_CUK_THREADS, 0, s>>>(row_flag, rows, out);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    /* row_flag now holds per-row hits (the minimum above has been taken:
     * same stream, so in order). */
    unsigned wblocks = (unsigned)((rows + XENT_WARPS - 1) / XENT_WARPS < 65535
                                      ? (rows + XENT_WARPS - 1) / XENT_WARPS : 65535);
    k_xent_rows<T><<<wblocks, GP_CUK_THREADS, 0, s>>>(logits, labels, rows, cols, ld, scale,
                                                      smoothing, dlogits, row_loss, row_flag,
                                                      out);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    k_xent_total<<<1, GP_CUK_THREADS, 0, s>>>(row_loss, row_flag, rows, out);
    return cudaGetLastError();
}
} /* namespace */

extern "C" {

cudaError_t gp_cuk_xent(cudaStream_t s, const float *logits, const float *labels,
                        int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                        float *dlogits, double *row_loss, long long *row_flag,
                        gp_cuk_xent_out *out)
{
    return xent(s, logits, labels, rows, cols, ld, scale, smoothing, dlogits, row_loss, row_flag,
                out);
}

cudaError_t gp_cuk_xent_bf16(cudaStream_t s, const uint16_t *logits, const float *labels,
                             int64_t rows, int64_t cols, int64_t ld, float scale,
                             float smoothing, uint16_t *dlogits, double *row_loss,
                             long long *row_flag, gp_cuk_xent_out *out)
{
    return xent(s, logits, labels, rows, cols, ld, scale, smoothing, dlogits, row_loss, row_flag,
                out);
}

cudaError_t gp_cuk_act_bf16(cudaStream_t s, int kind, const uint16_t *xy, const uint16_t *dy,
                            uint16_t *out, int64_t n, float slope)
{
    GP_CUK_LAUNCH(n, k_act_bf16, kind, xy, dy, out, n, slope);
}

cudaError_t gp_cuk_add_bf16(cudaStream_t s, const uint16_t *a, const uint16_t *b, uint16_t *y,
                            int64_t n)
{
    GP_CUK_LAUNCH(n, k_add_bf16, a, b, y, n);
}

cudaError_t gp_cuk_gelu_fwd(cudaStream_t s, const float *x, float *y, int64_t n)
{
    GP_CUK_LAUNCH(n, k_gelu_fwd, x, y, n);
}

cudaError_t gp_cuk_gelu_bwd(cudaStream_t s, const float *x, const float *dy, float *dx,
                            int64_t n)
{
    GP_CUK_LAUNCH(n, k_gelu_bwd, x, dy, dx, n);
}

cudaError_t gp_cuk_leaky_relu_fwd(cudaStream_t s, const float *x, float *y, int64_t n,
                                  float slope)
{
    GP_CUK_LAUNCH(n, k_leaky_relu_fwd, x, y, n, slope);
}

cudaError_t gp_cuk_leaky_relu_bwd(cudaStream_t s, const float *y, const float *dy, float *dx,
                                  int64_t n, float slope)
{
    GP_CUK_LAUNCH(n, k_leaky_relu_bwd, y, dy, dx, n, slope);
}

cudaError_t gp_cuk_mul_rows_bf16(cudaStream_t s, const uint16_t *x, const float *f, uint16_t *y,
                                 int64_t rows, int64_t cols)
{
    GP_CUK_LAUNCH(rows * cols, k_mul_rows_bf16, x, f, y, rows, cols);
}

cudaError_t gp_cuk_dropout_apply_bf16(cudaStream_t s, const uint16_t *x, uint16_t *y, int64_t n,
                                      float p, uint64_t seed, uint64_t stream, uint64_t first)
{
    GP_CUK_LAUNCH(n, k_dropout_apply_bf16, x, y, n, p, seed, stream, first);
}

cudaError_t gp_cuk_mul_rows(cudaStream_t s, const float *x, const float *f, float *y,
                            int64_t rows, int64_t cols)
{
    GP_CUK_LAUNCH(rows * cols, k_mul_rows, x, f, y, rows, cols);
}

cudaError_t gp_cuk_upsample_fwd(cudaStream_t s, const float *x, float *y, int64_t planes,
                                int64_t h, int64_t w, int64_t scale)
{
    GP_CUK_LAUNCH(planes * h * w * scale * scale, k_upsample_fwd, x, y, planes, h, w, scale);
}

cudaError_t gp_cuk_upsample_bwd(cudaStream_t s, const float *dy, float *dx, int64_t planes,
                                int64_t h, int64_t w, int64_t scale)
{
    GP_CUK_LAUNCH(planes * h * w, k_upsample_bwd, dy, dx, planes, h, w, scale);
}

cudaError_t gp_cuk_bias_relu_pack(cudaStream_t s, const float *c, const float *bias, int relu,
                                  uint16_t *y, int64_t rows, int64_t cols)
{
    GP_CUK_LAUNCH(rows * cols, k_bias_relu_pack, c, bias, relu, y, rows, cols);
}

cudaError_t gp_cuk_upsample_fwd_bf16(cudaStream_t s, const uint16_t *x, uint16_t *y,
                                     int64_t planes, int64_t h, int64_t w, int64_t scale)
{
    GP_CUK_LAUNCH(planes * h * w * scale * scale, k_upsample_fwd_bf16, x, y, planes, h, w, scale);
}

cudaError_t gp_cuk_upsample_bwd_bf16(cudaStream_t s, const uint16_t *dy, uint16_t *dx,
                                     int64_t planes, int64_t h, int64_t w, int64_t scale)
{
    GP_CUK_LAUNCH(planes * h * w, k_upsample_bwd_bf16, dy, dx, planes, h, w, scale);
}

cudaError_t gp_cuk_attn_fwd(cudaStream_t s, const float *x, float *y, float *lse, int64_t b,
                            int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    GP_CUK_LAUNCH(b * heads * t, k_attn_fwd, x, y, lse, b, t, heads, kv_heads, c);
}

cudaError_t gp_cuk_attn_bwd(cudaStream_t s, const float *x, const float *y, const float *lse,
                            const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                            int64_t kv_heads, int64_t c)
{
    const int64_t n = b * heads * t, nkv = b * kv_heads * t;
    if (n <= 0) return cudaSuccess;
    k_attn_bwd_q<<<blocks_for(n), GP_CUK_THREADS, 0, s>>>(x, y, lse, dy, dx, b, t, heads,
                                                          kv_heads, c);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    k_attn_bwd_kv<<<blocks_for(nkv), GP_CUK_THREADS, 0, s>>>(x, y, lse, dy, dx, b, t, heads,
                                                             kv_heads, c);
    return cudaGetLastError();
}

cudaError_t gp_cuk_bce(cudaStream_t s, const float *z, const float *t, int64_t n, float scale,
                       float *dz, double *loss_part, long long *idx_part, gp_cuk_bce_out *out)
{
    if (n <= 0) return cudaSuccess;
    k_bce_check<<<GP_CUK_RED_BLOCKS, GP_CUK_THREADS, 0, s>>>(t, n, idx_part);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    k_bce_first_bad<<<1, GP_CUK_THREADS, 0, s>>>(idx_part, GP_CUK_RED_BLOCKS, out);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    /* idx_part now holds per-block hits (the minimum above has been taken:
     * same stream, so in order). */
    k_bce_elems<<<GP_CUK_RED_BLOCKS, GP_CUK_THREADS, 0, s>>>(z, t, n, scale, dz, loss_part,
                                                             idx_part, out);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    k_bce_total<<<1, GP_CUK_THREADS, 0, s>>>(loss_part, idx_part, GP_CUK_RED_BLOCKS, out);
    return cudaGetLastError();
}

cudaError_t gp_cuk_bn_biased_var(cudaStream_t s, float *var, int64_t c, double cnt)
{
    GP_CUK_LAUNCH(c, k_bn_biased_var, var, c, cnt);
}

cudaError_t gp_cuk_bn_invstd(cudaStream_t s, const float *var, float eps, float *inv,
                             int64_t c)
{
    GP_CUK_LAUNCH(c, k_bn_invstd, var, eps, inv, c);
}

} /* extern "C" */

/* The batch-norm launchers, on either storage type (the kernels above). */
namespace {

template <typename T>
cudaError_t bnp_fwd(cudaStream_t s, const T *x, int64_t n, int64_t c, int64_t sp, float eps,
                    const float *gamma, const float *beta, int relu, const T *add, T *y,
                    float *mean, float *var, double *part, float *vec, int cl)
{
    int64_t planes = n * c;
    if (planes <= 0) return cudaSuccess;
    if (planes > INT_MAX / 32 || c > 65535 || (cl && n > 65535)) return cudaErrorInvalidValue;
    if (cl)
        k_bnp_stats_part_cl<T><<<cl_grid(n, c), dim3(CL_CH, 32), 0, s>>>(x, c, sp, part);
    else
        k_bnp_stats_part<T><<<warp_blocks(planes), GP_CUK_THREADS, 0, s>>>(x, planes, c, sp,
                                                                           part);
    k_bnp_stats_final<T><<<(unsigned)c, GP_CUK_THREADS, 0, s>>>(
        part, x, n, c, sp, cl ? 1 : sp, eps, gamma, beta, mean, var, y ? vec : NULL);
    if (y && cl) /* k_bn_apply with a plane of 1: channel i % c */
        k_bn_apply<T><<<blocks_for(planes * sp), GP_CUK_THREADS, 0, s>>>(
            x, mean, vec, c, 1, planes * sp, relu, add, y);
    else if (y)
        k_bnp_apply<T><<<(unsigned)planes, plane_threads(sp), 0, s>>>(x, mean, vec, c, sp, relu,
                                                                      add, y);
    return cudaGetLastError();
}

template <typename T>
cudaError_t bnp_bwd(cudaStream_t s, const T *x, const float *mean, const float *var,
                    const float *gamma, const float *beta, int relu, const T *dy, int64_t n,
                    int64_t c, int64_t sp, float eps, float *sums, T *dx, float *dgamma,
                    float *dbeta, double *part, float *vec, int cl)
{
    int64_t planes = n * c;
    if (planes <= 0) return cudaSuccess;
    if (planes > INT_MAX / 32 || c > 65535 || (cl && n > 65535)) return cudaErrorInvalidValue;
    if (cl)
        k_bnp_bwd_part_cl<T><<<cl_grid(n, c), dim3(CL_CH, 32), 0, s>>>(
            x, mean, dy, c, sp, gamma, beta, var, eps, relu, part);
    else
        k_bnp_bwd_part<T><<<warp_blocks(planes), GP_CUK_THREADS, 0, s>>>(
            x, mean, dy, planes, c, sp, gamma, beta, var, eps, relu, part);
    k_bnp_bwd_final<<<(unsigned)c, GP_CUK_THREADS, 0, s>>>(part, n, c, sp, var, eps, gamma, sums,
                                                          dx ? vec : NULL, dgamma, dbeta);
    if (dx && cl && relu) /* the forward's scale and shift after the coefficients */
        k_bn_vec<<<blocks_for(c), GP_CUK_THREADS, 0, s>>>(gamma, beta, var, eps, c, vec + 3 * c);
    if (dx && cl)
        k_bnp_bwd_apply_cl<T><<<blocks_for(planes * sp), GP_CUK_THREADS, 0, s>>>(
            x, mean, dy, vec, c, planes * sp, relu, dx);
    else if (dx)
        k_bnp_bwd_apply<T><<<(unsigned)planes, plane_threads(sp), 0, s>>>(
            x, mean, dy, vec, c, sp, gamma, beta, var, eps, relu, dx);
    return cudaGetLastError();
}

template <typename T>
cudaError_t bn_apply(cudaStream_t s, const T *x, const float *mean, const float *var,
                     const float *gamma, const float *beta, float eps, int64_t n, int64_t c,
                     int64_t sp, int relu, const T *add, T *y, float *vec, int cl)
{
    if (n * c * sp <= 0) return cudaSuccess;
    k_bn_vec<<<blocks_for(c), GP_CUK_THREADS, 0, s>>>(gamma, beta, var, eps, c, vec);
    k_bn_apply<T><<<blocks_for(n * c * sp), GP_CUK_THREADS, 0, s>>>(x, mean, vec, c, cl ? 1 : sp,
                                                                    n * c * sp, relu, add, y);
    return cudaGetLastError();
}

template <typename T>
cudaError_t bn_stats(cudaStream_t s, const T *x, int64_t n, int64_t c, int64_t sp, float *mean,
                     float *var, int cl)
{
    if (c <= 0) return cudaSuccess;
    k_bn_stats<T><<<channel_blocks(c), GP_CUK_THREADS, 0, s>>>(x, n, c, sp, mean, var, cl);
    return cudaGetLastError();
}

template <typename T>
cudaError_t bn_bwd_sums(cudaStream_t s, const T *x, const float *mean, const T *dy, int64_t n,
                        int64_t c, int64_t sp, const float *gamma, const float *beta,
                        const float *var, float eps, int relu, float *sums, int cl)
{
    if (c <= 0) return cudaSuccess;
    k_bn_bwd_sums<T><<<channel_blocks(c), GP_CUK_THREADS, 0, s>>>(x, mean, dy, n, c, sp, gamma,
                                                                  beta, var, eps, relu, sums, cl);
    return cudaGetLastError();
}

template <typename T>
cudaError_t bn_bwd_apply(cudaStream_t s, const T *x, const float *gamma, const float *beta,
                         int relu, const float *mean, const float *var, const T *dy,
                         const float *sums, double count, float eps, int64_t n, int64_t c,
                         int64_t sp, T *dx, const float *local, float *dgamma, float *dbeta,
                         int cl)
{
    if (c <= 0) return cudaSuccess;
    k_bn_bwd_apply<T><<<channel_blocks(c), GP_CUK_THREADS, 0, s>>>(
        x, gamma, beta, relu, mean, var, dy, sums, count, eps, n, c, sp, dx, local, dgamma,
        dbeta, cl);
    return cudaGetLastError();
}

/* The channel kernels' whole backward on any plane size: the sums into
 * sums (2 c floats), then dx =, dgamma / dbeta += where not NULL. */
template <typename T>
cudaError_t bn_bwd(cudaStream_t s, const T *x, const float *mean, const float *var,
                   const float *gamma, const float *beta, int relu, const T *dy, int64_t n,
                   int64_t c, int64_t sp, float eps, T *dx, float *dgamma, float *dbeta,
                   float *sums, int cl)
{
    cudaError_t e = bn_bwd_sums(s, x, mean, dy, n, c, sp, gamma, beta, var, eps, relu, sums, cl);
    if (e != cudaSuccess) return e;
    return bn_bwd_apply(s, x, gamma, beta, relu, mean, var, dy, sums, (double)(n * sp), eps, n,
                        c, sp, dx, sums, dgamma, dbeta, cl);
}

} /* namespace */

extern "C" {

cudaError_t gp_cuk_bnp_fwd(cudaStream_t s, const float *x, int64_t n, int64_t c, int64_t sp,
                           float eps, const float *gamma, const float *beta, int relu,
                           const float *add, float *y, float *mean, float *var, double *part,
                           float *vec, int cl)
{
    return bnp_fwd(s, x, n, c, sp, eps, gamma, beta, relu, add, y, mean, var, part, vec, cl);
}

cudaError_t gp_cuk_bnp_bwd(cudaStream_t s, const float *x, const float *mean, const float *var,
                           const float *gamma, const float *beta, int relu, const float *dy,
                           int64_t n, int64_t c, int64_t sp, float eps, float *sums, float *dx,
                           float *dgamma, float *dbeta, double *part, float *vec, int cl)
{
    return bnp_bwd(s, x, mean, var, gamma, beta, relu, dy, n, c, sp, eps, sums, dx, dgamma,
                   dbeta, part, vec, cl);
}

cudaError_t gp_cuk_bn_apply(cudaStream_t s, const float *x, const float *mean, const float *var,
                            const float *gamma, const float *beta, float eps, int64_t n,
                            int64_t c, int64_t sp, int relu, const float *add, float *y,
                            float *vec, int cl)
{
    return bn_apply(s, x, mean, var, gamma, beta, eps, n, c, sp, relu, add, y, vec, cl);
}

cudaError_t gp_cuk_bnp_fwd_bf16(cudaStream_t s, const uint16_t *x, int64_t n, int64_t c,
                                int64_t sp, float eps, const float *gamma, const float *beta,
                                int relu, const uint16_t *add, uint16_t *y, float *mean,
                                float *var, double *part, float *vec, int cl)
{
    return bnp_fwd(s, x, n, c, sp, eps, gamma, beta, relu, add, y, mean, var, part, vec, cl);
}

cudaError_t gp_cuk_bnp_bwd_bf16(cudaStream_t s, const uint16_t *x, const float *mean,
                                const float *var, const float *gamma, const float *beta,
                                int relu, const uint16_t *dy, int64_t n, int64_t c, int64_t sp,
                                float eps, uint16_t *dx, float *dgamma, float *dbeta,
                                double *part, float *vec, int cl)
{
    return bnp_bwd(s, x, mean, var, gamma, beta, relu, dy, n, c, sp, eps, (float *)NULL, dx,
                   dgamma, dbeta, part, vec, cl);
}

cudaError_t gp_cuk_bn_apply_bf16(cudaStream_t s, const uint16_t *x, const float *mean,
                                 const float *var, const float *gamma, const float *beta,
                                 float eps, int64_t n, int64_t c, int64_t sp, int relu,
                                 const uint16_t *add, uint16_t *y, float *vec, int cl)
{
    return bn_apply(s, x, mean, var, gamma, beta, eps, n, c, sp, relu, add, y, vec, cl);
}

cudaError_t gp_cuk_bn_stats_bf16(cudaStream_t s, const uint16_t *x, int64_t n, int64_t c,
                                 int64_t sp, float *mean, float *var, int cl)
{
    return bn_stats(s, x, n, c, sp, mean, var, cl);
}

cudaError_t gp_cuk_bn_bwd_bf16(cudaStream_t s, const uint16_t *x, const float *mean,
                               const float *var, const float *gamma, const float *beta, int relu,
                               const uint16_t *dy, int64_t n, int64_t c, int64_t sp, float eps,
                               uint16_t *dx, float *dgamma, float *dbeta, float *sums, int cl)
{
    return bn_bwd(s, x, mean, var, gamma, beta, relu, dy, n, c, sp, eps, dx, dgamma, dbeta, sums,
                  cl);
}

cudaError_t gp_cuk_bn_bwd(cudaStream_t s, const float *x, const float *mean, const float *var,
                          const float *gamma, const float *beta, int relu, const float *dy,
                          int64_t n, int64_t c, int64_t sp, float eps, float *dx, float *dgamma,
                          float *dbeta, float *sums, int cl)
{
    return bn_bwd(s, x, mean, var, gamma, beta, relu, dy, n, c, sp, eps, dx, dgamma, dbeta, sums,
                  cl);
}

cudaError_t gp_cuk_bn_relu_mask(cudaStream_t s, const float *x, const float *mean,
                                const float *var, const float *gamma, const float *beta,
                                float eps, int64_t n, int64_t c, int64_t sp, const float *dy,
                                float *dym, float *vec, int cl)
{
    if (n * c * sp <= 0) return cudaSuccess;
    k_bn_vec<<<blocks_for(c), GP_CUK_THREADS, 0, s>>>(gamma, beta, var, eps, c, vec);
    k_bn_relu_mask<<<blocks_for(n * c * sp), GP_CUK_THREADS, 0, s>>>(
        x, mean, vec, c, cl ? 1 : sp, n * c * sp, dy, dym);
    return cudaGetLastError();
}

cudaError_t gp_cuk_bn_stats(cudaStream_t s, const float *x, int64_t n, int64_t c, int64_t sp,
                            float *mean, float *var, int cl)
{
    return bn_stats(s, x, n, c, sp, mean, var, cl);
}

cudaError_t gp_cuk_bn_bwd_sums(cudaStream_t s, const float *x, const float *mean,
                               const float *dy, int64_t n, int64_t c, int64_t sp,
                               const float *gamma, const float *beta, const float *var,
                               float eps, int relu, float *sums, int cl)
{
    return bn_bwd_sums(s, x, mean, dy, n, c, sp, gamma, beta, var, eps, relu, sums, cl);
}

cudaError_t gp_cuk_bn_bwd_apply(cudaStream_t s, const float *x, const float *gamma,
                                const float *beta, int relu, const float *mean,
                                const float *var, const float *dy, const float *sums,
                                double count, float eps, int64_t n, int64_t c, int64_t sp,
                                float *dx, const float *local, float *dgamma, float *dbeta,
                                int cl)
{
    return bn_bwd_apply(s, x, gamma, beta, relu, mean, var, dy, sums, count, eps, n, c, sp, dx,
                        local, dgamma, dbeta, cl);
}

} /* extern "C" */

namespace {
template <typename T>
cudaError_t layer_norm_fwd(cudaStream_t s, const T *x, const float *w, const float *b, T *y,
                           float *mean, float *rstd, int64_t rows, int64_t c, float eps)
{
    if (rows <= 0) return cudaSuccess;
    k_layer_norm_fwd<T><<<channel_blocks(rows), GP_CUK_THREADS, 0, s>>>(x, w, b, y, mean, rstd,
                                                                        rows, c, eps);
    return cudaGetLastError();
}

template <typename T>
cudaError_t layer_norm_bwd_data(cudaStream_t s, const T *x, const float *w, const float *mean,
                                const float *rstd, const T *dy, T *dx, int64_t rows, int64_t c)
{
    if (rows <= 0) return cudaSuccess;
    k_layer_norm_bwd_data<T, false><<<channel_blocks(rows), GP_CUK_THREADS, 0, s>>>(
        x, w, mean, rstd, dy, dx, rows, c);
    return cudaGetLastError();
}

template <typename T>
cudaError_t layer_norm_bwd_data_add(cudaStream_t s, const T *x, const float *w,
                                    const float *mean, const float *rstd, const T *dy, T *dx,
                                    int64_t rows, int64_t c)
{
    if (rows <= 0) return cudaSuccess;
    k_layer_norm_bwd_data<T, true><<<channel_blocks(rows), GP_CUK_THREADS, 0, s>>>(
        x, w, mean, rstd, dy, dx, rows, c);
    return cudaGetLastError();
}

template <typename T>
cudaError_t add_layer_norm_fwd(cudaStream_t s, const T *a, const T *b, T *sum, const float *w,
                               const float *bias, T *y, float *mean, float *rstd, int64_t rows,
                               int64_t c, float eps)
{
    if (rows <= 0) return cudaSuccess;
    k_add_layer_norm_fwd<T><<<channel_blocks(rows), GP_CUK_THREADS, 0, s>>>(
        a, b, sum, w, bias, y, mean, rstd, rows, c, eps);
    return cudaGetLastError();
}

template <typename T>
cudaError_t layer_norm_bwd_weights(cudaStream_t s, const T *x, const float *mean,
                                   const float *rstd, const T *dy, float *dw, float *db,
                                   int64_t rows, int64_t c, double *part)
{
    if (c <= 0 || rows <= 0) return cudaSuccess;
    int parts = gp_cuk_sum_rows_parts(rows, c);
    int64_t bx = (c + SR_COLS - 1) / SR_COLS;
    if (bx > INT_MAX) return cudaErrorInvalidValue;
    k_layer_norm_bwd_weights_part<T><<<dim3((unsigned)bx, (unsigned)parts),
                                       dim3(SR_COLS, SR_ROWS), 0, s>>>(x, mean, rstd, dy, part,
                                                                       rows, c);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    GP_CUK_LAUNCH(c, k_layer_norm_bwd_weights_final, part, parts, dw, db, c);
}
} /* namespace */

extern "C" {

cudaError_t gp_cuk_layer_norm_fwd(cudaStream_t s, const float *x, const float *w, const float *b,
                                  float *y, float *mean, float *rstd, int64_t rows, int64_t c,
                                  float eps)
{
    return layer_norm_fwd(s, x, w, b, y, mean, rstd, rows, c, eps);
}

cudaError_t gp_cuk_layer_norm_bwd_data(cudaStream_t s, const float *x, const float *w,
                                       const float *mean, const float *rstd, const float *dy,
                                       float *dx, int64_t rows, int64_t c)
{
    return layer_norm_bwd_data(s, x, w, mean, rstd, dy, dx, rows, c);
}

cudaError_t gp_cuk_layer_norm_bwd_weights(cudaStream_t s, const float *x, const float *mean,
                                          const float *rstd, const float *dy, float *dw,
                                          float *db, int64_t rows, int64_t c, double *part)
{
    return layer_norm_bwd_weights(s, x, mean, rstd, dy, dw, db, rows, c, part);
}

cudaError_t gp_cuk_layer_norm_fwd_bf16(cudaStream_t s, const uint16_t *x, const float *w,
                                       const float *b, uint16_t *y, float *mean, float *rstd,
                                       int64_t rows, int64_t c, float eps)
{
    return layer_norm_fwd(s, x, w, b, y, mean, rstd, rows, c, eps);
}

cudaError_t gp_cuk_layer_norm_bwd_data_bf16(cudaStream_t s, const uint16_t *x, const float *w,
                                            const float *mean, const float *rstd,
                                            const uint16_t *dy, uint16_t *dx, int64_t rows,
                                            int64_t c)
{
    return layer_norm_bwd_data(s, x, w, mean, rstd, dy, dx, rows, c);
}

cudaError_t gp_cuk_layer_norm_bwd_weights_bf16(cudaStream_t s, const uint16_t *x,
                                               const float *mean, const float *rstd,
                                               const uint16_t *dy, float *dw, float *db,
                                               int64_t rows, int64_t c, double *part)
{
    return layer_norm_bwd_weights(s, x, mean, rstd, dy, dw, db, rows, c, part);
}

cudaError_t gp_cuk_add_layer_norm_fwd(cudaStream_t s, int bf16, const void *a, const void *b,
                                      void *sum, const float *w, const float *bias, void *y,
                                      float *mean, float *rstd, int64_t rows, int64_t c, float eps)
{
    if (bf16)
        return add_layer_norm_fwd(s, (const uint16_t *)a, (const uint16_t *)b, (uint16_t *)sum,
                                  w, bias, (uint16_t *)y, mean, rstd, rows, c, eps);
    return add_layer_norm_fwd(s, (const float *)a, (const float *)b, (float *)sum, w, bias,
                              (float *)y, mean, rstd, rows, c, eps);
}

cudaError_t gp_cuk_layer_norm_bwd_data_add(cudaStream_t s, int bf16, const void *x,
                                           const float *w, const float *mean, const float *rstd,
                                           const void *dy, void *dx, int64_t rows, int64_t c)
{
    if (bf16)
        return layer_norm_bwd_data_add(s, (const uint16_t *)x, w, mean, rstd,
                                       (const uint16_t *)dy, (uint16_t *)dx, rows, c);
    return layer_norm_bwd_data_add(s, (const float *)x, w, mean, rstd, (const float *)dy,
                                   (float *)dx, rows, c);
}

cudaError_t gp_cuk_attn_cached(cudaStream_t s, int bf16, const void *x, void *kv, void *y,
                               int64_t b, int64_t n, int64_t pos, int64_t cap, int64_t heads,
                               int64_t kv_heads, int64_t c)
{
    const int64_t d = c / heads, R = c + 2 * kv_heads * d, KR = 2 * kv_heads * d;
    if (d > GP_CUK_ATT_MAX_D) return cudaErrorInvalidValue;
    if (b * n <= 0) return cudaSuccess;
    if (bf16) {
        k_attn_cache_put<<<blocks_for(b * n * KR), GP_CUK_THREADS, 0, s>>>(
            (const uint16_t *)x, (uint16_t *)kv, b, n, pos, cap, R, c, KR);
        GP_CUK_LAUNCH(b * heads * n, k_attn_cached<uint16_t>, (const uint16_t *)x,
                      (const uint16_t *)kv, (uint16_t *)y, b, n, pos, cap, heads, kv_heads, c);
    }
    k_attn_cache_put<<<blocks_for(b * n * KR), GP_CUK_THREADS, 0, s>>>(
        (const float *)x, (float *)kv, b, n, pos, cap, R, c, KR);
    GP_CUK_LAUNCH(b * heads * n, k_attn_cached<float>, (const float *)x, (const float *)kv,
                  (float *)y, b, n, pos, cap, heads, kv_heads, c);
}

cudaError_t gp_cuk_rope(cudaStream_t s, int bf16, const gp_rope_desc *d, int inverse,
                        const void *x, void *y)
{
    int64_t n = d->rows * d->t * (d->heads * (d->d / 2) + d->width - d->heads * d->d);
    if (n <= 0) return cudaSuccess;
    if (bf16)
        GP_CUK_LAUNCH(n, k_rope<uint16_t>, *d, inverse, (const uint16_t *)x, (uint16_t *)y);
    GP_CUK_LAUNCH(n, k_rope<float>, *d, inverse, (const float *)x, (float *)y);
}

cudaError_t gp_cuk_swiglu(cudaStream_t s, int bf16, const void *x, const void *dy, void *out,
                          int64_t rows, int64_t h)
{
    if (rows * h <= 0) return cudaSuccess;
    if (dy) {
        if (bf16)
            GP_CUK_LAUNCH(rows * h, k_swiglu_bwd<uint16_t>, (const uint16_t *)x,
                          (const uint16_t *)dy, (uint16_t *)out, rows, h);
        GP_CUK_LAUNCH(rows * h, k_swiglu_bwd<float>, (const float *)x, (const float *)dy,
                      (float *)out, rows, h);
    }
    if (bf16) GP_CUK_LAUNCH(rows * h, k_swiglu_fwd<uint16_t>, (const uint16_t *)x, (uint16_t *)out, rows, h);
    GP_CUK_LAUNCH(rows * h, k_swiglu_fwd<float>, (const float *)x, (float *)out, rows, h);
}

cudaError_t gp_cuk_rms_norm_fwd(cudaStream_t s, int bf16, const void *x, const float *w, void *y,
                               float *rstd, int64_t rows, int64_t c, float eps)
{
    if (rows <= 0 || c <= 0) return cudaSuccess;
    if (bf16)
        k_rms_norm_fwd<uint16_t><<<channel_blocks(rows), GP_CUK_THREADS, 0, s>>>(
            (const uint16_t *)x, w, (uint16_t *)y, rstd, rows, c, eps);
    else
        k_rms_norm_fwd<float><<<channel_blocks(rows), GP_CUK_THREADS, 0, s>>>(
            (const float *)x, w, (float *)y, rstd, rows, c, eps);
    return cudaGetLastError();
}

cudaError_t gp_cuk_rms_norm_bwd_data(cudaStream_t s, int bf16, const void *x, const float *w,
                                    const float *rstd, const void *dy, void *dx, int64_t rows,
                                    int64_t c)
{
    if (rows <= 0 || c <= 0) return cudaSuccess;
    if (bf16)
        k_rms_norm_bwd_data<uint16_t><<<channel_blocks(rows), GP_CUK_THREADS, 0, s>>>(
            (const uint16_t *)x, w, rstd, (const uint16_t *)dy, (uint16_t *)dx, rows, c);
    else
        k_rms_norm_bwd_data<float><<<channel_blocks(rows), GP_CUK_THREADS, 0, s>>>(
            (const float *)x, w, rstd, (const float *)dy, (float *)dx, rows, c);
    return cudaGetLastError();
}

cudaError_t gp_cuk_rms_norm_bwd_weights(cudaStream_t s, int bf16, const void *x,
                                       const float *rstd, const void *dy, float *dw,
                                       int64_t rows, int64_t c, double *part)
{
    if (rows <= 0 || c <= 0) return cudaSuccess;
    int parts = gp_cuk_sum_rows_parts(rows, c);
    int64_t bx = (c + SR_COLS - 1) / SR_COLS;
    if (bx > INT_MAX) return cudaErrorInvalidValue;
    dim3 grid((unsigned)bx, (unsigned)parts), block(SR_COLS, SR_ROWS);
    if (bf16)
        k_rms_norm_bwd_weights_part<uint16_t><<<grid, block, 0, s>>>(
            (const uint16_t *)x, rstd, (const uint16_t *)dy, part, rows, c);
    else
        k_rms_norm_bwd_weights_part<float><<<grid, block, 0, s>>>((const float *)x, rstd,
                                                                 (const float *)dy, part, rows,
                                                                 c);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    GP_CUK_LAUNCH(c, k_sum_rows_final, part, parts, dw, c, 0);
}

cudaError_t gp_cuk_embed_check(cudaStream_t s, const float *ids, int64_t rows, int64_t vocab,
                               long long *first)
{
    long long none = (long long)rows; /* above every row: "none" after the min */
    cudaError_t e = cudaMemcpyAsync(first, &none, sizeof none, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) return e;
    if (rows > 0) k_embed_check<<<blocks_for(rows), GP_CUK_THREADS, 0, s>>>(ids, rows, vocab, first);
    k_embed_none<<<1, 1, 0, s>>>(first, (long long)rows);
    return cudaGetLastError();
}

cudaError_t gp_cuk_embed_fwd(cudaStream_t s, const float *ids, const float *wte, const float *wpe,
                             void *y, int b16, int64_t n, int64_t t, int64_t c)
{
    GP_CUK_LAUNCH(n * t * c, k_embed_fwd, ids, wte, wpe, y, b16, n * t, t, c);
}

cudaError_t gp_cuk_embed_bwd(cudaStream_t s, const float *ids, const void *dy, int b16,
                             float *dwte, float *dwpe, int64_t n, int64_t t, int64_t c,
                             int64_t vocab)
{
    if (vocab <= 0 || n * t <= 0) return cudaSuccess;
    k_embed_bwd_wte<<<vocab < 65535 ? (unsigned)vocab : 65535u, GP_CUK_THREADS, 0, s>>>(
        ids, dy, b16, dwte, n * t, c, vocab);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || !dwpe) return e;
    GP_CUK_LAUNCH(t * c, k_embed_bwd_wpe, dy, b16, dwpe, n * t, t, c);
}

cudaError_t gp_cuk_norm_leaky_bwd(cudaStream_t s, const float *yz, int from_z, float slope,
                                  const float *var, float eps, const float *dy, float *dx,
                                  int64_t n, int64_t c, int64_t sp)
{
    if (c <= 0) return cudaSuccess;
    k_norm_leaky_bwd<float><<<channel_blocks(c), GP_CUK_THREADS, 0, s>>>(yz, from_z, slope,
                                                                         var, eps, dy, dx, n, c,
                                                                         sp);
    return cudaGetLastError();
}

cudaError_t gp_cuk_norm_leaky_bwd_bf16(cudaStream_t s, const uint16_t *yz, int from_z,
                                       float slope, const float *var, float eps,
                                       const uint16_t *dy, uint16_t *dx, int64_t n, int64_t c,
                                       int64_t sp)
{
    if (c <= 0) return cudaSuccess;
    k_norm_leaky_bwd<uint16_t><<<channel_blocks(c), GP_CUK_THREADS, 0, s>>>(
        yz, from_z, slope, var, eps, dy, dx, n, c, sp);
    return cudaGetLastError();
}

} /* extern "C" */

/* ---- pooling on bf16 storage (pool_fwd_bf16, pool_bwd_bf16) ---------------
 * The CPU's loops (cpu_pool.c) one output (forward) or one input element
 * (backward) a thread, on the widened values, each result rounded once: the
 * first maximum in scan order, the window's sum in scan order over its
 * count; backward gathers, for its element, the windows over it in scan
 * order (the order the CPU adds them in), recomputing a max window's
 * argument from x, so no workspace.  Bit for bit the CPU's bf16 pooling. */

namespace {

struct pool_win {
    int64_t r0, c0, i0, i1, j0, j1;
};

__device__ __forceinline__ pool_win pool_window(const gp_cuk_pool &p, int64_t oh, int64_t ow)
{
    pool_win v;
    v.r0 = oh * p.sh - p.ph;
    v.c0 = ow * p.sw - p.pw;
    v.i0 = v.r0 < 0 ? 0 : v.r0;
    v.j0 = v.c0 < 0 ? 0 : v.c0;
    v.i1 = v.r0 + p.kh < p.h ? v.r0 + p.kh : p.h;
    v.j1 = v.c0 + p.kw < p.w ? v.c0 + p.kw : p.w;
    return v;
}

/* Where element (n, c, i, j) of an (N, C, H, W) map lies: the plain
 * layout, or channels-last (cl: (N, H, W, C)). */
__device__ __forceinline__ int64_t pool_at(int cl, int64_t n, int64_t c, int64_t C, int64_t H,
                                           int64_t W, int64_t i, int64_t j)
{
    return cl ? ((n * H + i) * W + j) * C + c : ((n * C + c) * H + i) * W + j;
}

/* The coordinates of the e-th element of such a map in layout cl. */
__device__ __forceinline__ void pool_coords(int cl, int64_t e, int64_t C, int64_t H, int64_t W,
                                            int64_t *n, int64_t *c, int64_t *i, int64_t *j)
{
    if (cl) {
        *c = e % C;
        e /= C;
        *j = e % W;
        e /= W;
        *i = e % H;
        *n = e / H;
    } else {
        *j = e % W;
        e /= W;
        *i = e % H;
        e /= H;
        *c = e % C;
        *n = e / C;
    }
}

/* The first maximum of window v in plane (n, c) of x, as its flat index
 * i w + j in the plane. */
template <typename T>
__device__ __forceinline__ int64_t pool_argmax(const T *x, const gp_cuk_pool &p, int64_t n,
                                               int64_t c, pool_win v, float *best)
{
    int64_t arg = v.i0 * p.w + v.j0;
    float b = ld(x[pool_at(p.cl_x, n, c, p.c, p.h, p.w, v.i0, v.j0)]);
    for (int64_t i = v.i0; i < v.i1; i++)
        for (int64_t j = v.j0; j < v.j1; j++) {
            float e = ld(x[pool_at(p.cl_x, n, c, p.c, p.h, p.w, i, j)]);
            if (e > b) {
                b = e;
                arg = i * p.w + j;
            }
        }
    *best = b;
    return arg;
}

__device__ __forceinline__ float pool_count(const gp_cuk_pool &p, pool_win v)
{
    return p.kind == 2 ? (float)(p.kh * p.kw) : (float)((v.i1 - v.i0) * (v.j1 - v.j0));
}

/* y in its layout's order (cl_y), x read in its own (cl_x). */
template <typename T> __global__ void k_pool_fwd(const T *x, T *y, gp_cuk_pool p, int64_t n)
{
    GP_CUK_LOOP(o, n)
    {
        int64_t b, c, oh, ow;
        pool_coords(p.cl_y, o, p.c, p.oh, p.ow, &b, &c, &oh, &ow);
        pool_win v = pool_window(p, oh, ow);
        float r;
        if (p.kind == 0) {
            (void)pool_argmax(x, p, b, c, v, &r);
        } else {
            float sum = 0.0f;
            for (int64_t i = v.i0; i < v.i1; i++)
                for (int64_t j = v.j0; j < v.j1; j++)
                    sum += ld(x[pool_at(p.cl_x, b, c, p.c, p.h, p.w, i, j)]);
            r = sum / pool_count(p, v);
        }
        st(&y[o], r);
    }
}

/* dx in its layout's order (cl_x), dy read in its own (cl_y). */
template <typename T>
__global__ void k_pool_bwd(const T *x, const T *dy, T *dx, gp_cuk_pool p, int64_t n)
{
    GP_CUK_LOOP(e, n)
    {
        int64_t b, c, i, j;
        pool_coords(p.cl_x, e, p.c, p.h, p.w, &b, &c, &i, &j);
        /* the outputs whose windows hold (i, j): oh sh - ph <= i < oh sh - ph + kh */
        int64_t a0 = i + p.ph - p.kh + 1, b0 = j + p.pw - p.kw + 1;
        int64_t oh0 = a0 > 0 ? (a0 + p.sh - 1) / p.sh : 0, ow0 = b0 > 0 ? (b0 + p.sw - 1) / p.sw : 0;
        int64_t oh1 = (i + p.ph) / p.sh, ow1 = (j + p.pw) / p.sw;
        oh1 = oh1 < p.oh - 1 ? oh1 : p.oh - 1;
        ow1 = ow1 < p.ow - 1 ? ow1 : p.ow - 1;
        float g = 0.0f;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                pool_win v = pool_window(p, oh, ow);
                float gy = ld(dy[pool_at(p.cl_y, b, c, p.c, p.oh, p.ow, oh, ow)]);
                if (p.kind == 0) {
                    float best; /* (x: max pooling's only) */
                    if (pool_argmax(x, p, b, c, v, &best) == i * p.w + j) g += gy;
                } else {
                    g += gy / pool_count(p, v);
                }
            }
        st(&dx[e], g);
    }
}

} /* namespace */

extern "C" {

cudaError_t gp_cuk_pool_fwd_bf16(cudaStream_t s, const uint16_t *x, uint16_t *y,
                                 const gp_cuk_pool *p)
{
    int64_t n = p->n * p->c * p->oh * p->ow;
    GP_CUK_LAUNCH(n, k_pool_fwd<uint16_t>, x, y, *p, n);
}

cudaError_t gp_cuk_pool_bwd_bf16(cudaStream_t s, const uint16_t *x, const uint16_t *dy,
                                 uint16_t *dx, const gp_cuk_pool *p)
{
    int64_t n = p->n * p->c * p->h * p->w;
    GP_CUK_LAUNCH(n, k_pool_bwd<uint16_t>, x, dy, dx, *p, n);
}

cudaError_t gp_cuk_pool_fwd(cudaStream_t s, const float *x, float *y, const gp_cuk_pool *p)
{
    int64_t n = p->n * p->c * p->oh * p->ow;
    GP_CUK_LAUNCH(n, k_pool_fwd<float>, x, y, *p, n);
}

cudaError_t gp_cuk_pool_bwd(cudaStream_t s, const float *x, const float *dy, float *dx,
                            const gp_cuk_pool *p)
{
    if (p->kind == 0 && !x) return cudaErrorInvalidValue; /* max pooling reads x */
    int64_t n = p->n * p->c * p->h * p->w;
    GP_CUK_LAUNCH(n, k_pool_bwd<float>, x, dy, dx, *p, n);
}

} /* extern "C" */
