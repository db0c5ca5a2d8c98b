/*
 * cuda_kernels.h — the plain C launchers of cuda_kernels.cu: the CUDA
 * backend's own elementwise and reduction kernels.
 *
 * Every launcher enqueues its kernel(s) on `stream` (the device's compute
 * stream; the caller has made the device current) and returns
 * cudaGetLastError() right after the launch, which the caller checks with
 * GP_CUDA (cuda_impl.h) so a bad launch is reported with the launcher's
 * call text, function, file and line.  n == 0 launches nothing.
 *
 * The per-element arithmetic is that of backend/elementwise.h and
 * core/philox.h, the same functions the CPU backend runs.
 *
 * Memory: all pointers are device memory of the current device unless
 * named `host_`; scratch buffers are supplied by the caller (sizes below).
 */
#ifndef GP_CUDA_KERNELS_H
#define GP_CUDA_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "backend/elementwise.h" /* gp_adam_step */

#ifdef __cplusplus
extern "C" {
#endif

/* Threads per block of every 1-D launch, and the block count of the
 * two-pass reductions (their partials buffer holds GP_CUK_RED_BLOCKS
 * entries). */
#define GP_CUK_THREADS 256
#define GP_CUK_RED_BLOCKS 256

/* Each of `batches` row-major (rows, cols) matrices of src transposed into
 * dst (cols, rows), src and dst FP32 or (src16, dst16) bf16 patterns,
 * converted as gp_cuk_bf16_pack / unpack convert, and added to dst's
 * values where add: NCHW to channels-last is (C, H W) to (H W, C) per
 * image, and KCRS weights to KRSC per output channel (cuda_dnn.c). */
cudaError_t gp_cuk_transpose(cudaStream_t s, void *dst, int dst16, const void *src, int src16,
                             int64_t batches, int64_t rows, int64_t cols, int add);
cudaError_t gp_cuk_fill(cudaStream_t s, float *x, float v, int64_t n);
cudaError_t gp_cuk_scale(cudaStream_t s, float *x, float a, int64_t n);
cudaError_t gp_cuk_axpy(cudaStream_t s, float a, const float *x, float *y, int64_t n);
cudaError_t gp_cuk_add(cudaStream_t s, const float *a, const float *b, float *y, int64_t n);
/* The strided 4-D box copy of gp_device_iface.copy_box. */
cudaError_t gp_cuk_copy_box(cudaStream_t s, void *dst, const int64_t ds[4], const void *src,
                            const int64_t ss[4], const int64_t dims[4], size_t es);
cudaError_t gp_cuk_mul(cudaStream_t s, const float *a, const float *b, float *y, int64_t n);
cudaError_t gp_cuk_relu_fwd(cudaStream_t s, const float *x, float *y, int64_t n);
cudaError_t gp_cuk_relu_bwd(cudaStream_t s, const float *y, const float *dy, float *dx,
                            int64_t n);
cudaError_t gp_cuk_sgd(cudaStream_t s, float *w, const float *g, float *v, int64_t n,
                       float lr, float mu, float wd, int nesterov);
/* The parts of one multi-tensor SGD launch, passed by value as the
 * kernel's parameter (32 x 64 bytes and the block table, well under the
 * 4 KiB a launch takes): the caller fills w, g, v (NULL: plain SGD), w16, nonfinite, n,
 * wd and parts (at most GP_CUK_SGD_PARTS); gp_cuk_sgd_multi fills first,
 * so that part p owns blocks [first[p], first[p + 1]) of the grid, as many
 * as its size asks for (capped), and a launch of one large weight and many
 * small biases runs no idle blocks for the biases. */
#define GP_CUK_SGD_PARTS 32
typedef struct gp_cuk_sgd_table {
    float *w[GP_CUK_SGD_PARTS];
    const float *g[GP_CUK_SGD_PARTS];
    float *v[GP_CUK_SGD_PARTS];
    float *v2[GP_CUK_SGD_PARTS]; /* Adam's second moment (gp_cuk_adam_multi) */
    uint16_t *w16[GP_CUK_SGD_PARTS]; /* the weight's bf16 mirror, written too (NULL: none) */
    float *nonfinite[GP_CUK_SGD_PARTS]; /* set to 1 if a new weight is not finite (NULL: none) */
    int64_t n[GP_CUK_SGD_PARTS];
    float wd[GP_CUK_SGD_PARTS];
    float clip[GP_CUK_SGD_PARTS]; /* the gradient's factor (gp_update_part.clip; 0: none) */
    unsigned first[GP_CUK_SGD_PARTS + 1];
    int parts;
} gp_cuk_sgd_table;
/* gp_cuk_sgd on each part of t in one launch. */
cudaError_t gp_cuk_sgd_multi(cudaStream_t s, gp_cuk_sgd_table *t, float lr, float mu,
                             int nesterov);
/* gp_ew_adam on each part of t (v the first moment, v2 the second) in one
 * launch. */
cudaError_t gp_cuk_adam_multi(cudaStream_t s, gp_cuk_sgd_table *t, gp_adam_step a);
/* bfloat16 patterns from floats and back (gp_ew_bf16_bits / _value) */
cudaError_t gp_cuk_bf16_pack(cudaStream_t s, uint16_t *dst, const float *src, int64_t n);
cudaError_t gp_cuk_bf16_unpack(cudaStream_t s, float *dst, const uint16_t *src, int64_t n);
/* precision bf16 (cuda_dnn.c, cuda_device.c's gemm): a rows x cols block
 * at leading dimension ld packed dense; a convolution's bf16 output
 * widened with its bias (b NULL: none; channel (i / hw) % k); dst +=
 * value(src), a bf16 weight gradient into its FP32 sum */
cudaError_t gp_cuk_bf16_pack2d(cudaStream_t s, uint16_t *dst, const float *src, int64_t rows,
                               int64_t cols, int64_t ld);
cudaError_t gp_cuk_bf16_unpack_bias(cudaStream_t s, float *dst, const uint16_t *src,
                                    const float *b, int64_t n, int64_t k, int64_t hw);
/* y = bits(value(y) + b[(i / hw) % k]) in place, on n bf16 values. */
cudaError_t gp_cuk_bf16_bias(cudaStream_t s, uint16_t *y, const float *b, int64_t n, int64_t k,
                             int64_t hw);
cudaError_t gp_cuk_bf16_unpack_add(cudaStream_t s, float *dst, const uint16_t *src, int64_t n);
/* y = x * the dropout mask of gp_cuk_dropout_mask, drawn on the fly */
cudaError_t gp_cuk_dropout_apply(cudaStream_t s, const float *x, float *y, int64_t n, float p,
                                 uint64_t seed, uint64_t stream, uint64_t first);
cudaError_t gp_cuk_dropout_mask(cudaStream_t s, float *mask, int64_t n, float p,
                                uint64_t seed, uint64_t stream, uint64_t first);
/* C(M, N) with leading dimension ldc: C = beta * C (beta == 0 writes 0),
 * gemm's k == 0 case. */
cudaError_t gp_cuk_scale_matrix(cudaStream_t s, float *c, int64_t m, int64_t n,
                                int64_t ldc, float beta);
/* y(rows, cols) += bias(cols) */
cudaError_t gp_cuk_add_bias_rows(cudaStream_t s, float *y, const float *bias, int64_t rows,
                                 int64_t cols);
/* y(rows, cols) = relu(y + bias(cols)), bias NULL: relu(y) */
cudaError_t gp_cuk_bias_relu_rows(cudaStream_t s, float *y, const float *bias, int64_t rows,
                                  int64_t cols);
/* db(cols) += column sums of dy(rows, cols), each in double: blocks of 32
 * columns x 8 rows, gp_cuk_sum_rows_parts(rows, cols) of them down the rows
 * (about 2048 blocks in all where the rows allow),
 * write double partials into part (that many x cols doubles), which a
 * second kernel sums per column in a fixed order (deterministic).  One
 * thread per column (the first version) left an H100 almost idle on a
 * 2048 x 2048 gradient. */
static inline int gp_cuk_sum_rows_parts(int64_t rows, int64_t cols)
{
    int64_t p = (rows + 255) / 256, col_blocks = (cols + 31) / 32;
    int64_t fill = 2048 / (col_blocks > 0 ? col_blocks : 1); /* enough blocks, no more */
    if (p > fill) p = fill;
    return (int)(p < 1 ? 1 : p > 64 ? 64 : p);
}
cudaError_t gp_cuk_sum_rows(cudaStream_t s, const float *dy, float *db, int64_t rows,
                            int64_t cols, double *part, bool over);
/* The same over bf16 dy (a linear layer on bf16 storage), widened exactly:
 * the bits sum_rows gives on the widened values.  over (both): db = the
 * sums, where db's old values are not read (a fresh step's bias gradient,
 * with no fill before it: the bits of db zeroed and then added to). */
cudaError_t gp_cuk_sum_rows_bf16(cudaStream_t s, const uint16_t *dy, float *db, int64_t rows,
                                 int64_t cols, double *part, bool over);
/* bf16 y(rows, cols) = relu(c + bias) (relu 0: c + bias; bias NULL: none),
 * c FP32, rounded once: a linear layer's output on bf16 storage. */
cudaError_t gp_cuk_bias_relu_pack(cudaStream_t s, const float *c, const float *bias, int relu,
                                  uint16_t *y, int64_t rows, int64_t cols);
/* A convolution's bias gradient: db(k) += the sum of dy(n, k, hw) over n
 * and the plane, in double: a warp per (n, k) plane into part (n x k
 * doubles, a fixed butterfly), then a block per channel down n in a fixed
 * order (deterministic).  cudnnConvolutionBackwardBias took 0.4-0.9 ms per
 * layer of the convnet at batch 1024 on an H100, 4x its memory traffic. */
cudaError_t gp_cuk_sum_planes(cudaStream_t s, const float *dy, float *db, int64_t n, int64_t k,
                              int64_t hw, double *part);
/* The same over bf16 dy (a convolution on bf16 storage), widened exactly. */
cudaError_t gp_cuk_sum_planes_bf16(cudaStream_t s, const uint16_t *dy, float *db, int64_t n,
                                   int64_t k, int64_t hw, double *part);
/* *out = sum x^2 in double; partials: GP_CUK_RED_BLOCKS doubles. */
cudaError_t gp_cuk_sumsq(cudaStream_t s, const float *x, int64_t n, double *partials,
                         double *out);
/* *flag = 1 if any element is NaN or Inf, else 0. */
cudaError_t gp_cuk_nonfinite(cudaStream_t s, const float *x, int64_t n, int *flag);
/* flag (one float on the device) = 1 if any x is NaN or Inf; else untouched. */
cudaError_t gp_cuk_nonfinite_or(cudaStream_t s, const float *x, int64_t n, float *flag);
/* The NaN check of up to GP_CUK_TABLE tensors in one launch (the table by
 * value, in the kernel's parameters: 1 KiB of the 4 KiB allowed);
 * GP_NONFINITE_BATCH (backend.h) is the same number. */
#define GP_CUK_TABLE 64
typedef struct gp_cuk_tensor_table {
    const float *x[GP_CUK_TABLE];
    int64_t n[GP_CUK_TABLE];
    int count;
} gp_cuk_tensor_table;
cudaError_t gp_cuk_nonfinite_or_many(cudaStream_t s, const gp_cuk_tensor_table *t, float *flag);
/* sumsq_multi in two kinds of launch: the partials of t's tensors (each
 * the bits gp_cuk_sumsq's first kernel gives it) into partials[y *
 * GP_CUK_RED_BLOCKS..], y < t->count; then out[y] = their sum for count
 * tensors' partials laid end to end (gp_cuk_sumsq's second kernel). */
cudaError_t gp_cuk_sumsq_many_partial(cudaStream_t s, const gp_cuk_tensor_table *t,
                                      double *partials);
cudaError_t gp_cuk_sum_partials_many(cudaStream_t s, const double *partials, int count,
                                     double *out);
/* Each of t's tensors zeroed, in one launch (zero_many). */
cudaError_t gp_cuk_zero_many(cudaStream_t s, const gp_cuk_tensor_table *t);

/* backend.h's bn_merge and bn_commit, one thread per channel
 * (elementwise.h's gp_ew_bn_merge, gp_ew_bn_commit). */
cudaError_t gp_cuk_bn_merge(cudaStream_t s, double *mean_acc, double *m2_acc, double na,
                            double nb, const float *mean, const float *var, int64_t c);
/* bn_commit_multi: each of n <= GP_CUK_BN_COMMIT_MAX parts' pending slots
 * merged (gp_ew_bn_fold) and its gp_ew_bn_commit, in one launch (its table
 * in the kernel's parameters: 96 bytes a part, 3.75 KiB of the 4). */
#define GP_CUK_BN_COMMIT_MAX 40
typedef struct gp_cuk_bn_commit_part {
    int64_t c;
    float *rmean, *rvar;
    double *mean_acc, *m2_acc;
    double momentum, count;
    const float *pend;
    int n_pend, n_hi;
    double na, nb_hi, nb_lo;
} gp_cuk_bn_commit_part;
cudaError_t gp_cuk_bn_commit_multi(cudaStream_t s, const gp_cuk_bn_commit_part *parts, int n);
cudaError_t gp_cuk_bn_commit(cudaStream_t s, float *rmean, float *rvar, double *mean_acc,
                             double *m2_acc, double m, double count, int64_t c);

/* Cross-entropy results, written on the device by gp_cuk_xent (backend.h's
 * gp_loss_result has the same layout: xent_dev writes straight into one). */
typedef struct gp_cuk_xent_out {
    double loss_sum;
    long long correct;
    long long bad_row;   /* first row with an invalid label, else -1 */
} gp_cuk_xent_out;

/* Row-wise cross-entropy (backend.h's xent): validates every label first
 * and, if one is bad, writes only out->bad_row (no dlogits).  Rows are ld
 * floats apart; the gradient's columns [cols, ld) are set to 0.
 * Scratch: row_loss (rows doubles), row_flag (rows long longs). */
cudaError_t gp_cuk_xent(cudaStream_t s, const float *logits, const float *labels,
                        int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                        float *dlogits, double *row_loss, long long *row_flag,
                        gp_cuk_xent_out *out);
/* The same on bf16 logits and dlogits (xent_bf16): widened on load, the
 * gradient rounded once. */
cudaError_t gp_cuk_xent_bf16(cudaStream_t s, const uint16_t *logits, const float *labels,
                             int64_t rows, int64_t cols, int64_t ld, float scale,
                             float smoothing, uint16_t *dlogits, double *row_loss,
                             long long *row_flag, gp_cuk_xent_out *out);

/* Transformer layers (backend.h's gelu_fwd/bwd): one thread per element. */
/* dropout_apply_bf16, mul_rows_bf16 (backend.h): dropout's mask and
 * dropout2d's rows on bf16 values, rounded once. */
cudaError_t gp_cuk_dropout_apply_bf16(cudaStream_t s, const uint16_t *x, uint16_t *y, int64_t n,
                                      float p, uint64_t seed, uint64_t stream, uint64_t first);
cudaError_t gp_cuk_mul_rows_bf16(cudaStream_t s, const uint16_t *x, const float *f, uint16_t *y,
                                 int64_t rows, int64_t cols);
/* add_bf16 (backend.h): y = a + b on bf16 values, rounded once. */
cudaError_t gp_cuk_add_bf16(cudaStream_t s, const uint16_t *a, const uint16_t *b, uint16_t *y,
                            int64_t n);
/* act_bf16 (backend.h): kind 0 relu, 1 leaky relu, 2 GELU; dy NULL: forward. */
cudaError_t gp_cuk_act_bf16(cudaStream_t s, int kind, const uint16_t *xy, const uint16_t *dy,
                            uint16_t *out, int64_t n, float slope);
cudaError_t gp_cuk_gelu_fwd(cudaStream_t s, const float *x, float *y, int64_t n);
cudaError_t gp_cuk_gelu_bwd(cudaStream_t s, const float *x, const float *dy, float *dx,
                            int64_t n);

/* backend.h's layer_norm_*: a block per row (its sums in double through a
 * fixed tree), a thread per column for the weights (rows in order). */
cudaError_t gp_cuk_layer_norm_fwd(cudaStream_t s, const float *x, const float *w, const float *b,
                                  float *y, float *mean, float *rstd, int64_t rows, int64_t c,
                                  float eps);
cudaError_t gp_cuk_layer_norm_bwd_data(cudaStream_t s, const float *x, const float *w,
                                       const float *mean, const float *rstd, const float *dy,
                                       float *dx, int64_t rows, int64_t c);
/* layer_norm_bwd_weights: the sums in part (2 gp_cuk_sum_rows_parts(rows,
 * c) c doubles of workspace), then added in order. */
cudaError_t gp_cuk_layer_norm_bwd_weights(cudaStream_t s, const float *x, const float *mean,
                                          const float *rstd, const float *dy, float *dw,
                                          float *db, int64_t rows, int64_t c, double *part);
/* add_layer_norm_fwd and layer_norm_bwd_data_add (backend.h) on FP32 or
 * (bf16 != 0) bf16 activations: a block per row, as the slots above. */
cudaError_t gp_cuk_add_layer_norm_fwd(cudaStream_t s, int bf16, const void *a, const void *b,
                                      void *sum, const float *w, const float *bias, void *y,
                                      float *mean, float *rstd, int64_t rows, int64_t c,
                                      float eps);
cudaError_t gp_cuk_layer_norm_bwd_data_add(cudaStream_t s, int bf16, const void *x,
                                           const float *w, const float *mean, const float *rstd,
                                           const void *dy, void *dx, int64_t rows, int64_t c);
/* The same on bf16 x, y, dy and dx (layer_norm_*_bf16). */
cudaError_t gp_cuk_layer_norm_fwd_bf16(cudaStream_t s, const uint16_t *x, const float *w,
                                       const float *b, uint16_t *y, float *mean, float *rstd,
                                       int64_t rows, int64_t c, float eps);
cudaError_t gp_cuk_layer_norm_bwd_data_bf16(cudaStream_t s, const uint16_t *x, const float *w,
                                            const float *mean, const float *rstd,
                                            const uint16_t *dy, uint16_t *dx, int64_t rows,
                                            int64_t c);
cudaError_t gp_cuk_layer_norm_bwd_weights_bf16(cudaStream_t s, const uint16_t *x,
                                               const float *mean, const float *rstd,
                                               const uint16_t *dy, float *dw, float *db,
                                               int64_t rows, int64_t c, double *part);

/* backend.h's attn_cached on FP32 or bf16 (bf16 != 0) storage: two
 * launches (the cache's new rows, then the attention); head size d up to
 * 256 (cudaErrorInvalidValue past it). */
cudaError_t gp_cuk_attn_cached(cudaStream_t s, int bf16, const void *x, void *kv, void *y,
                               int64_t b, int64_t n, int64_t pos, int64_t cap, int64_t heads,
                               int64_t kv_heads, int64_t c);
/* backend.h's rope on FP32 or bf16 (bf16 != 0) storage. */
cudaError_t gp_cuk_rope(cudaStream_t s, int bf16, const gp_rope_desc *d, int inverse,
                        const void *x, void *y);
/* backend.h's swiglu_fwd (dy NULL) and swiglu_bwd (out: dx) on FP32 or
 * (bf16 != 0) bf16 activations: a thread per output. */
cudaError_t gp_cuk_swiglu(cudaStream_t s, int bf16, const void *x, const void *dy, void *out,
                          int64_t rows, int64_t h);
/* backend.h's rms_norm_* on FP32 or (bf16 != 0) bf16 activations: a block
 * per row; the weight's sums in part (gp_cuk_sum_rows_parts(rows, c) c
 * doubles of workspace), then added in order. */
cudaError_t gp_cuk_rms_norm_fwd(cudaStream_t s, int bf16, const void *x, const float *w, void *y,
                               float *rstd, int64_t rows, int64_t c, float eps);
cudaError_t gp_cuk_rms_norm_bwd_data(cudaStream_t s, int bf16, const void *x, const float *w,
                                    const float *rstd, const void *dy, void *dx, int64_t rows,
                                    int64_t c);
cudaError_t gp_cuk_rms_norm_bwd_weights(cudaStream_t s, int bf16, const void *x,
                                       const float *rstd, const void *dy, float *dw,
                                       int64_t rows, int64_t c, double *part);

/* backend.h's embed_fwd/bwd: embed_check writes into *first (device) the
 * first row whose id is not a whole number in [0, vocab), or -1; embed_fwd
 * a thread per output element; embed_bwd a block per vocabulary row for
 * dwte (the ids scanned a tile at a time) and a thread per (position,
 * column) for dwpe, each element's rows in order (no atomics). */
cudaError_t gp_cuk_embed_check(cudaStream_t s, const float *ids, int64_t rows, int64_t vocab,
                               long long *first);
cudaError_t gp_cuk_embed_fwd(cudaStream_t s, const float *ids, const float *wte, const float *wpe,
                             void *y, int b16, int64_t n, int64_t t, int64_t c);
cudaError_t gp_cuk_embed_bwd(cudaStream_t s, const float *ids, const void *dy, int b16,
                             float *dwte, float *dwpe, int64_t n, int64_t t, int64_t c,
                             int64_t vocab);

/* U-Net layers (backend.h's leaky_relu_fwd/bwd, mul_rows, upsample_fwd/bwd):
 * one thread per output element; upsample_bwd sums its block in a fixed
 * order (no atomics). */
cudaError_t gp_cuk_leaky_relu_fwd(cudaStream_t s, const float *x, float *y, int64_t n,
                                  float slope);
cudaError_t gp_cuk_leaky_relu_bwd(cudaStream_t s, const float *y, const float *dy, float *dx,
                                  int64_t n, float slope);
cudaError_t gp_cuk_mul_rows(cudaStream_t s, const float *x, const float *f, float *y,
                            int64_t rows, int64_t cols);
/* norm_leaky_bwd_bf16, upsample_*_bf16 (backend.h): the FP32 kernels'
 * arithmetic on the widened values, rounded once (upsampling's sums in
 * the CPU's float order: the CPU's bits). */
cudaError_t gp_cuk_norm_leaky_bwd_bf16(cudaStream_t s, const uint16_t *yz, int from_z,
                                       float slope, const float *var, float eps,
                                       const uint16_t *dy, uint16_t *dx, int64_t n, int64_t c,
                                       int64_t sp);
cudaError_t gp_cuk_upsample_fwd_bf16(cudaStream_t s, const uint16_t *x, uint16_t *y,
                                     int64_t planes, int64_t h, int64_t w, int64_t scale);
cudaError_t gp_cuk_upsample_bwd_bf16(cudaStream_t s, const uint16_t *dy, uint16_t *dx,
                                     int64_t planes, int64_t h, int64_t w, int64_t scale);
/* backend.h's norm_leaky_bwd: a block per channel (n samples of sp values,
 * c channels), sums in double (block_sum's fixed tree). */
cudaError_t gp_cuk_norm_leaky_bwd(cudaStream_t s, const float *yz, int from_z, float slope,
                                  const float *var, float eps, const float *dy, float *dx,
                                  int64_t n, int64_t c, int64_t sp);
/* x (planes, h, w) -> y (planes, h*scale, w*scale) and back. */
cudaError_t gp_cuk_upsample_fwd(cudaStream_t s, const float *x, float *y, int64_t planes,
                                int64_t h, int64_t w, int64_t scale);
cudaError_t gp_cuk_upsample_bwd(cudaStream_t s, const float *dy, float *dx, int64_t planes,
                                int64_t h, int64_t w, int64_t scale);
/* Causal self-attention (backend.h's attn_fwd / attn_bwd): one thread per
 * (batch row, head, position), sums in a fixed order, no atomics. */
cudaError_t gp_cuk_attn_fwd(cudaStream_t s, const float *x, float *y, float *lse, int64_t b,
                            int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
cudaError_t gp_cuk_attn_bwd(cudaStream_t s, const float *x, const float *y, const float *lse,
                            const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                            int64_t kv_heads, int64_t c);

/* Binary cross-entropy results, written on the device by gp_cuk_bce. */
typedef struct gp_cuk_bce_out {
    double loss_sum;
    long long correct;
    long long bad;       /* first element with a target outside [0, 1], else -1 */
} gp_cuk_bce_out;

/* backend.h's bce_logits: validates every target first and, if one is bad,
 * writes only out->bad (no dz).  Scratch: loss_part (GP_CUK_RED_BLOCKS
 * doubles), idx_part (GP_CUK_RED_BLOCKS long longs: first the per-block
 * first bad index, then the per-block hit counts). */
cudaError_t gp_cuk_bce(cudaStream_t s, const float *z, const float *t, int64_t n, float scale,
                       float *dz, double *loss_part, long long *idx_part, gp_cuk_bce_out *out);

/* Batch norm helpers (cuda_dnn.c): var[c] = biased(var[c]) from cuDNN's
 * unbiased running-variance output; inv[c] = 1 / sqrt(var[c] + eps). */
cudaError_t gp_cuk_bn_biased_var(cudaStream_t s, float *var, int64_t c, double cnt);
cudaError_t gp_cuk_bn_invstd(cudaStream_t s, const float *var, float eps, float *inv,
                             int64_t c);
/* Every batch-norm launcher takes cl: 0 for x, y, dy, dx (and add) in the
 * plain layout (n, c, sp), 1 for channels-last (n, sp, c), the layout a
 * chain of convolutions keeps on a GPU (backend.h, act_block); the sums
 * meet in the same order either way, so the bits are the same.
 * Batch norm over planes of sp >= 32 values (cuda_kernels.cu; cuda_dnn.c
 * takes them from 64): a warp per
 * (n, c) plane sums into part (2 n c doubles), a block per channel adds
 * the planes in a fixed order, a block per plane applies (deterministic).
 * fwd: mean(c) and biased var(c), and with y also y = (x - mean) gamma inv
 * + beta (+ add where not NULL), relu'd where relu (vec: 2 c floats of
 * workspace; gamma / beta NULL: 1 / 0).  bwd:
 * sums(2 c) = (sum dy, sum dy (x - mean)) where not NULL, and with dx its
 * dx = and dgamma +=, dbeta += where not NULL (vec: 3 c floats); with relu
 * dy is first masked where the forward's value (before its relu) was not
 * positive (var, gamma, beta say where; gamma / beta NULL: 1 / 0);
 * channels-last (cl) with dx and relu, vec holds 5 c floats.  On an
 * H100 cuDNN's NCHW batch-norm kernels moved about 1.3 TB/s. */
cudaError_t gp_cuk_bnp_fwd(cudaStream_t s, const float *x, int64_t n, int64_t c, int64_t sp,
                           float eps, const float *gamma, const float *beta, int relu,
                           const float *add, float *y, float *mean, float *var, double *part,
                           float *vec, int cl);
cudaError_t gp_cuk_bnp_bwd(cudaStream_t s, const float *x, const float *mean, const float *var,
                           const float *gamma, const float *beta, int relu, const float *dy,
                           int64_t n, int64_t c, int64_t sp, float eps, float *sums, float *dx,
                           float *dgamma, float *dbeta, double *part, float *vec, int cl);
/* Batch norm followed by a relu (gp_bn_desc.relu) on any plane size: y =
 * relu((x - mean) gamma inv + beta (+ add)), the expression gp_cuk_bnp_fwd
 * uses (relu 0: without it); and dym = dy where that value was positive, else
 * 0, the relu's backward folded into the norm's.  vec: 2 c floats of
 * workspace; gamma / beta NULL: 1 / 0. */
cudaError_t gp_cuk_bn_apply(cudaStream_t s, const float *x, const float *mean, const float *var,
                            const float *gamma, const float *beta, float eps, int64_t n,
                            int64_t c, int64_t sp, int relu, const float *add, float *y,
                            float *vec, int cl);
cudaError_t gp_cuk_bn_relu_mask(cudaStream_t s, const float *x, const float *mean,
                                const float *var, const float *gamma, const float *beta,
                                float eps, int64_t n, int64_t c, int64_t sp, const float *dy,
                                float *dym, float *vec, int cl);
/* Batch norm on bf16 storage (backend.h's bn_*_bf16): the kernels above
 * instantiated for bf16 x, y, dy and dx, widened on load and rounded once
 * on store, the statistics, coefficients and sums as in FP32.  bnp_*: the
 * plane kernels (planes of 64+ values), no residual sum; bn_apply_bf16:
 * any plane size; bn_stats_bf16: the channel kernel's mean and biased
 * variance; bn_bwd_bf16: its backward on any plane size, sums(2 c) floats
 * of workspace, dx =, dgamma / dbeta += where not NULL. */
cudaError_t gp_cuk_bnp_fwd_bf16(cudaStream_t s, const uint16_t *x, int64_t n, int64_t c,
                                int64_t sp, float eps, const float *gamma, const float *beta,
                                int relu, const uint16_t *add, uint16_t *y, float *mean,
                                float *var, double *part, float *vec, int cl);
cudaError_t gp_cuk_bnp_bwd_bf16(cudaStream_t s, const uint16_t *x, const float *mean,
                                const float *var, const float *gamma, const float *beta,
                                int relu, const uint16_t *dy, int64_t n, int64_t c, int64_t sp,
                                float eps, uint16_t *dx, float *dgamma, float *dbeta,
                                double *part, float *vec, int cl);
cudaError_t gp_cuk_bn_apply_bf16(cudaStream_t s, const uint16_t *x, const float *mean,
                                 const float *var, const float *gamma, const float *beta,
                                 float eps, int64_t n, int64_t c, int64_t sp, int relu,
                                 const uint16_t *add, uint16_t *y, float *vec, int cl);
cudaError_t gp_cuk_bn_stats_bf16(cudaStream_t s, const uint16_t *x, int64_t n, int64_t c,
                                 int64_t sp, float *mean, float *var, int cl);
cudaError_t gp_cuk_bn_bwd_bf16(cudaStream_t s, const uint16_t *x, const float *mean,
                               const float *var, const float *gamma, const float *beta, int relu,
                               const uint16_t *dy, int64_t n, int64_t c, int64_t sp, float eps,
                               uint16_t *dx, float *dgamma, float *dbeta, float *sums, int cl);
/* The same backward on FP32 storage (channels-last maps narrower than the
 * plane kernels', where the plain layout runs cuDNN's). */
cudaError_t gp_cuk_bn_bwd(cudaStream_t s, const float *x, const float *mean, const float *var,
                          const float *gamma, const float *beta, int relu, const float *dy,
                          int64_t n, int64_t c, int64_t sp, float eps, float *dx, float *dgamma,
                          float *dbeta, float *sums, int cl);
/* Synchronised batch norm (backend.h's bn_stats, bn_bwd_sums, bn_bwd_apply)
 * on x (n, c, sp): one block per channel, sums in double.  gamma may be
 * NULL (1); dx, local / dgamma / dbeta may be NULL as in backend.h; with
 * relu dy is masked where the forward's value (before its relu) was not
 * positive (gamma, beta, var: the forward's). */
cudaError_t gp_cuk_bn_stats(cudaStream_t s, const float *x, int64_t n, int64_t c, int64_t sp,
                            float *mean, float *var, int cl);
cudaError_t gp_cuk_bn_bwd_sums(cudaStream_t s, const float *x, const float *mean,
                               const float *dy, int64_t n, int64_t c, int64_t sp,
                               const float *gamma, const float *beta, const float *var,
                               float eps, int relu, float *sums, int cl);
cudaError_t gp_cuk_bn_bwd_apply(cudaStream_t s, const float *x, const float *gamma,
                                const float *beta, int relu, const float *mean,
                                const float *var, const float *dy, const float *sums,
                                double count, float eps, int64_t n, int64_t c, int64_t sp,
                                float *dx, const float *local, float *dgamma, float *dbeta,
                                int cl);

/* pool_fwd_bf16, pool_bwd_bf16 (backend.h) on plain layouts: the CPU's
 * loops, bit for bit (cuda_kernels.cu).  kind 0 max, 1 average over the
 * window inside the image, 2 average over kh kw. */
typedef struct gp_cuk_pool {
    int64_t n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
    int kind;
    int cl_x, cl_y; /* x and dx, y and dy channels-last (n, h, w, c): 1 */
} gp_cuk_pool;
cudaError_t gp_cuk_pool_fwd_bf16(cudaStream_t s, const uint16_t *x, uint16_t *y,
                                 const gp_cuk_pool *p);
cudaError_t gp_cuk_pool_bwd_bf16(cudaStream_t s, const uint16_t *x, const uint16_t *dy,
                                 uint16_t *dx, const gp_cuk_pool *p);
/* The same on FP32 storage: channels-last pooling (cuDNN's pools a
 * plain layout here), and the averages' backward (kind 1, 2), which reads
 * neither x (NULL allowed there) nor y: cuDNN's pooling backward takes
 * both, so an average pool's output would have to be kept for it. */
cudaError_t gp_cuk_pool_fwd(cudaStream_t s, const float *x, float *y, const gp_cuk_pool *p);
cudaError_t gp_cuk_pool_bwd(cudaStream_t s, const float *x, const float *dy, float *dx,
                            const gp_cuk_pool *p);

#ifdef __cplusplus
}
#endif

#endif /* GP_CUDA_KERNELS_H */
