/*
 * cuda_dnn.c — convolution, pooling, batch normalisation and log-softmax on
 * cuDNN's (legacy, descriptor-based) API, on the device's compute stream.
 *
 * Convolutions.  Each shape gets one cuda_conv with its descriptors and,
 * per direction on first use, the algorithm (issue 15), picked by
 * gp_algo_pick among those that need at most ws_limit of workspace (an
 * eighth of a capped device, a sixteenth of an uncapped GPU):
 *  - by default measured: cudnnFind*AlgorithmEx runs every algorithm once
 *    on the call's own operands (the backward-filter search into a scratch
 *    dw, since the real one accumulates) and the fastest wins (within
 *    GP_ALGO_SLACK of it, the one with the least workspace).  The search
 *    blocks the host once per shape and direction and borrows a workspace
 *    of the limit (less where memory refuses it) that it gives back;
 *  - with train.deterministic: the heuristics (cudnnGet*Algorithm_v7) rank
 *    them and the first deterministic one wins, so every run picks the same
 *    algorithm and repeats bit for bit; none that fits is an error that
 *    says so;
 *  - while channels to other processes are open (mpirun): the heuristics'
 *    first, untimed, any algorithm (a search synchronizes the stream, which
 *    may wait behind a receive another process has yet to send).
 * The math type is CUDNN_FMA_MATH: plain FP32, no TF32 tensor cores, so results
 * stay within FP32 rounding of the CPU's; with precision tf32 it is
 * CUDNN_DEFAULT_MATH, which lets cuDNN use TF32 tensor cores.  dw += and db += are cuDNN's
 * beta = 1.  Workspace comes from the device's workspace buffer
 * (GP_MEM_WORKSPACE), so peak memory includes it.
 *
 * Precision bf16, for a convolution worth it (gp_bf16_conv_worth; else
 * FP32 as above): the operands are packed into bf16 copies
 * (gp_cuda_bf16_reserve) and cuDNN runs its BFLOAT16 configuration (bf16
 * x, w, y; FP32 compute; CUDNN_TENSOR_OP_MATH, tensor cores), GEMM-style
 * algorithms only (bf16_algo_ok).  Its bf16 result is widened: y with the
 * bias in one kernel, dx as is; backward-filter writes the gradient's bf16
 * part (beta 0), added to dw in FP32.  The bias gradient sums the FP32 dy.
 * On bf16 storage (train.activations: bf16; conv_*_bf16) x, y, dx and dy
 * are bf16 already: cuDNN reads and writes them as they are (nothing
 * packed but the weights, nothing widened), the bias is added to y in one
 * pass and the bias gradient sums the widened dy: the adapter's bits.
 *
 * Channels-last (issue 67; gp_cuda_conv_nhwc): a bf16 convolution whose
 * channels are multiples of 8 has NHWC x and y and KRSC weights in its
 * descriptors (cuDNN's tensor cores read NHWC natively and transpose NCHW
 * inside), the weights transposed from their bf16 mirror per call and the
 * filter gradient transposed back as it is added to dw.  act_block says so
 * to the layers, which keep the maps between such convolutions
 * channels-last; a side given in the other layout (a chain's end) goes
 * through scratch, transposed (conv_turn).  Batch norm and pooling given
 * d->blk = the channels run gpipe's kernels in that layout (cuDNN's here
 * only ever see plain tensors); GPIPE_CUDA_NHWC=0 keeps all plain.
 *
 * Batch norm on bf16 storage (bn_*_bf16) runs gpipe's kernels on every
 * map size, templated on the storage type (below).
 *
 * Batch norm.  Maps of 64 values or more run gpipe's own kernels
 * (bn_planes below: sums in double, a warp per plane, a fixed order), the
 * rest cuDNN's as follows; y is always written by gpipe's expression
 * ((x - mean) gamma inv + beta, an FMA: gp_cuk_bn_apply), after cuDNN's
 * forward on small maps and instead of its inference kernel, so that a
 * relu or a residual sum folded in (gp_bn_desc.relu, .add) changes no bit
 * of the normalised value and the backward's relu mask sees the forward's
 * signs.  The interface wants the batch mean and the BIASED batch
 * variance from bn_fwd_train, and takes them back in bn_bwd; cuDNN keeps a
 * saved mean and inverse standard deviation instead.  Forward training
 * therefore asks cuDNN for its running statistics with an averaging factor
 * of 1 into the caller's mean/var (zeroed first: the update multiplies the
 * old value by 0, and 0 * NaN is NaN), which leaves the batch mean and the
 * UNBIASED batch variance, and a tiny kernel rescales the latter by
 * (cnt - 1) / cnt (gp_ew_bn_biased_var).  Backward makes the inverse
 * standard deviation 1 / sqrt(var + eps) from the given var
 * (gp_ew_bn_invstd) and passes it with the mean as cuDNN's saved
 * statistics.  dgamma/dbeta accumulate (cuDNN's betaParamDiff = 1).
 *
 * Pooling.  Max pooling is CUDNN_POOLING_MAX_DETERMINISTIC and needs no
 * workspace (backward reads x and y); when a window has tied maxima cuDNN
 * may route the gradient to another of the tied elements than the CPU
 * (first in scan order).  Average pooling divides as the CPU does: by the
 * window's elements inside the image for GP_POOL_AVG
 * (CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING), by kh * kw for
 * GP_POOL_AVG_INCLUDE_PAD (CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING).
 * Kernel, stride and padding are per axis in both cuDNN descriptors.
 *
 * Compiled and linked in CI; test_cuda ran on an H100 (2026-11-24); the
 * channels-last paths (2026-11-28) are compiled, not run.
 */
#include "backend/cuda/cuda_impl.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

static const float one = 1.0f, zero = 0.0f;

gp_status gp_cuda_dnn_init(gp_cuda_ctx *ctx)
{
    for (int i = 0; i < 3; i++) GP_CUDNN(cudnnCreateTensorDescriptor(&ctx->td[i]));
    GP_CUDNN(cudnnCreatePoolingDescriptor(&ctx->pool));
    return GP_OK;
}

static void conv_free(cuda_conv *cv)
{
    if (cv->x) cudnnDestroyTensorDescriptor(cv->x);
    if (cv->y) cudnnDestroyTensorDescriptor(cv->y);
    if (cv->b) cudnnDestroyTensorDescriptor(cv->b);
    if (cv->w) cudnnDestroyFilterDescriptor(cv->w);
    if (cv->conv) cudnnDestroyConvolutionDescriptor(cv->conv);
    gp_cuda_graph_free(cv);
    free(cv);
}

void gp_cuda_dnn_destroy(gp_cuda_ctx *ctx)
{
    for (int i = 0; i < 3; i++)
        if (ctx->td[i]) cudnnDestroyTensorDescriptor(ctx->td[i]);
    if (ctx->pool) cudnnDestroyPoolingDescriptor(ctx->pool);
    while (ctx->convs) {
        cuda_conv *next = ctx->convs->next;
        conv_free(ctx->convs);
        ctx->convs = next;
    }
}

/* cuDNN's legacy API takes int dimensions and int32 strides. */
static gp_status fits(gp_device *dev, const char *what, int64_t n, int64_t c, int64_t h,
                      int64_t w)
{
    if (n < 0 || c < 0 || h < 0 || w < 0 || n > INT_MAX || c > INT_MAX || h > INT_MAX ||
        w > INT_MAX || (c && h && w && n > INT_MAX / c / h / w))
        return gp_error_set(GP_ERR_UNSUPPORTED,
                            "device %s: %s (%lld, %lld, %lld, %lld) exceeds cuDNN's 32-bit "
                            "sizes; split the batch into more micro-batches",
                            dev->name, what, (long long)n, (long long)c, (long long)h,
                            (long long)w);
    return GP_OK;
}

static gp_status set4d_fmt(cudnnTensorDescriptor_t t, cudnnTensorFormat_t f, cudnnDataType_t dt,
                           int64_t n, int64_t c, int64_t h, int64_t w)
{
    GP_CUDNN(cudnnSetTensor4dDescriptor(t, f, dt, (int)n, (int)c, (int)h, (int)w));
    return GP_OK;
}

static gp_status set4d_as(cudnnTensorDescriptor_t t, cudnnDataType_t dt, int64_t n, int64_t c,
                          int64_t h, int64_t w)
{
    return set4d_fmt(t, CUDNN_TENSOR_NCHW, dt, n, c, h, w);
}

static gp_status set4d(cudnnTensorDescriptor_t t, int64_t n, int64_t c, int64_t h, int64_t w)
{
    return set4d_as(t, CUDNN_DATA_FLOAT, n, c, h, w);
}

/* The one blocked layout a GPU keeps: channels-last, a block of all the
 * channels (act_block); 1 where blk says it, 0 plain. */
static gp_status cuda_layout(gp_device *dev, const char *what, int64_t blk, int64_t c, int *cl)
{
    *cl = blk != 0;
    if (blk && blk != c)
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: %s over %lld channels in blocks of %lld: a GPU keeps "
                            "activations plain or channels-last (a block of all the channels)",
                            dev->name, what, (long long)c, (long long)blk);
    return GP_OK;
}

/* ---- convolution ------------------------------------------------------------------ */

static int conv_same(const gp_conv_desc *a, const gp_conv_desc *b)
{
    return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->k == b->k &&
           a->kh == b->kh && a->kw == b->kw && a->sh == b->sh && a->sw == b->sw &&
           a->ph == b->ph && a->pw == b->pw && a->oh == b->oh && a->ow == b->ow &&
           a->has_bias == b->has_bias;
}

static gp_status conv_build(gp_device *dev, const gp_conv_desc *d, bool nhwc, cuda_conv *cv)
{
    GP_TRY(fits(dev, "convolution input", d->n, d->c, d->h, d->w));
    GP_TRY(fits(dev, "convolution output", d->n, d->k, d->oh, d->ow));
    GP_TRY(fits(dev, "convolution weights", d->k, d->c, d->kh, d->kw));
    if (d->sh > INT_MAX || d->sw > INT_MAX || d->ph > INT_MAX || d->pw > INT_MAX)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: convolution stride/padding too large",
                            dev->name);
    GP_CUDNN(cudnnCreateTensorDescriptor(&cv->x));
    GP_CUDNN(cudnnCreateTensorDescriptor(&cv->y));
    GP_CUDNN(cudnnCreateTensorDescriptor(&cv->b));
    GP_CUDNN(cudnnCreateFilterDescriptor(&cv->w));
    GP_CUDNN(cudnnCreateConvolutionDescriptor(&cv->conv));
    /* precision bf16: x, w and y are the operands' bf16 copies (cuDNN's
     * BFLOAT16 configuration: FP32 compute, a bf16 result) */
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    cv->bf16 = ctx->bf16 && gp_bf16_conv_worth(d); /* else FP32 (backend.h) */
    /* channels-last where the device keeps it (gp_cuda_conv_call_nhwc): x,
     * w (KRSC) and y all NHWC, the layout cuDNN's bf16 tensor-core kernels
     * read without transposing inside */
    cv->nhwc = nhwc;
    cudnnDataType_t dt = cv->bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    cudnnTensorFormat_t f = cv->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    GP_TRY(set4d_fmt(cv->x, f, dt, d->n, d->c, d->h, d->w));
    GP_TRY(set4d_fmt(cv->y, f, dt, d->n, d->k, d->oh, d->ow));
    GP_TRY(set4d(cv->b, 1, d->k, 1, 1));
    GP_CUDNN(cudnnSetFilter4dDescriptor(cv->w, dt, f, (int)d->k, (int)d->c, (int)d->kh,
                                        (int)d->kw));
    GP_CUDNN(cudnnSetConvolution2dDescriptor(cv->conv, (int)d->ph, (int)d->pw, (int)d->sh,
                                             (int)d->sw, 1, 1, CUDNN_CROSS_CORRELATION,
                                             CUDNN_DATA_FLOAT));
    /* precision tf32 or bf16: cuDNN may use tensor cores (its default math) */
    GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, gp_cuda_conv_math(ctx, cv)));
    int n, c, h, w;
    GP_CUDNN(cudnnGetConvolution2dForwardOutputDim(cv->conv, cv->x, cv->w, &n, &c, &h, &w));
    if (n != d->n || c != d->k || h != d->oh || w != d->ow)
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: convolution output (%lld, %lld, %lld, %lld) given, cuDNN "
                            "computes (%d, %d, %d, %d)", dev->name, (long long)d->n,
                            (long long)d->k, (long long)d->oh, (long long)d->ow, n, c, h, w);
    return GP_OK;
}

/* The shape's convolution in the layout call d computes in (one of each
 * where GPIPE_CUDA_NHWC=chains runs a shape both ways). */
static gp_status conv_get(gp_device *dev, const gp_conv_desc *d, cuda_conv **out)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    bool nhwc = gp_cuda_conv_call_nhwc(ctx, d);
    for (cuda_conv *cv = ctx->convs; cv; cv = cv->next)
        if (conv_same(&cv->d, d) && cv->nhwc == nhwc) {
            *out = cv;
            return GP_OK;
        }
    cuda_conv *cv = calloc(1, sizeof *cv);
    if (!cv) return gp_error_set(GP_ERR_OOM, "out of host memory for a convolution descriptor");
    cv->d = *d;
    gp_status st = conv_build(dev, d, nhwc, cv);
    if (st != GP_OK) {
        conv_free(cv);
        return st;
    }
    cv->next = ctx->convs;
    ctx->convs = cv;
    *out = cv;
    return GP_OK;
}

/* Workspace bound for one algorithm (cuda_impl.h, CUDA_CONV_WS_FLOOR): an
 * eighth of the device's capacity, or a sixteenth of the GPU's memory. */
size_t gp_cuda_ws_limit(gp_device *dev)
{
    size_t cap = dev->alloc.capacity, lim = cap ? cap / 8 : gp_cuda_ctx_of(dev)->gpu_bytes / 16;
    return lim > CUDA_CONV_WS_FLOOR || cap ? lim : CUDA_CONV_WS_FLOOR;
}

/* GPIPE_LOG=debug: what a search measured and what it chose, per shape and
 * direction (where a convolution's time goes on a GPU). */
static void log_pick(const gp_device *dev, const char *dir, const gp_conv_desc *d,
                     const gp_algo_cand *c, int n, int idx, size_t limit)
{
    char buf[1536];
    int at = 0;
    for (int i = 0; i < n && at < (int)sizeof buf - 64; i++)
        at += snprintf(buf + at, sizeof buf - (size_t)at, " %d:%s%.3fms/%zuMiB", c[i].algo,
                       c[i].ok ? "" : "failed:", (double)c[i].time_ms, c[i].memory >> 20);
    GP_DEBUG("device %s: conv %s n=%lld c=%lld %lldx%lld k=%lld %lldx%lld: algorithm %d of%s "
             "(limit %zu MiB)",
             dev->name, dir, (long long)d->n, (long long)d->c, (long long)d->h, (long long)d->w,
             (long long)d->k, (long long)d->kh, (long long)d->kw, idx >= 0 ? c[idx].algo : -1,
             buf, limit >> 20);
}

/* Precision bf16 promises FP32 sums of the rounded operands: the FFT and
 * Winograd algorithms, which may keep their transformed tiles in the data
 * type (bf16), are left out; the GEMM-style ones remain (and on sm_80+
 * run the bf16 tensor cores). */
static bool bf16_algo_ok(int dir, int algo)
{
    switch (dir) {
    case GP_CUDA_FWD:
        return algo != CUDNN_CONVOLUTION_FWD_ALGO_FFT &&
               algo != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
               algo != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD &&
               algo != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case GP_CUDA_BWD_DATA:
        return algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT &&
               algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
               algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD &&
               algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    default:
        return algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT &&
               algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
               algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD &&
               algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
    }
}

/* Results a query may return: cudnnGet*AlgorithmMaxCount says how many
 * (with DEFAULT_MATH an algorithm can come once per math type), at most
 * this many are asked for. */
#define CUDA_ALGO_CAP 32

/* room = the workspace a measured search borrows: the most that any
 * algorithm the heuristics list in `perf` (got of them, any direction)
 * needs, among those that can run here within `limit`, and at least 1 MiB.
 * Not the limit itself: on an H100 (2026-11-27, b3c7ece) the searches,
 * each borrowing a sixteenth of the GPU, put 5.3 GB on the first step's
 * peak above every later step's (ResNet-101 at 128 in bf16: 15.2 GB
 * against 9.9), where PyTorch's peak over the same steps was 8.9 GB. */
#define SEARCH_ROOM(perf, got, limit, gdir, room)                                          \
    do {                                                                                   \
        size_t r_ = (size_t)1 << 20;                                                       \
        for (int i_ = 0; i_ < (got); i_++)                                                 \
            if ((perf)[i_].status == CUDNN_STATUS_SUCCESS &&                               \
                (!cv->bf16 || bf16_algo_ok((gdir), (int)(perf)[i_].algo)) &&               \
                (perf)[i_].memory <= (limit) && (perf)[i_].memory > r_)                    \
                r_ = (perf)[i_].memory;                                                    \
        (room) = r_ < (limit) ? r_ : (limit);                                              \
    } while (0)

/* idx = gp_algo_pick's choice among cuDNN's results `perf` of any
 * direction (got of them; times only where measured), or the error
 * no_algo returns for direction `dir`. */
#define PICK_OR_FAIL(perf, got, measured, limit, dir, gdir, idx)                           \
    do {                                                                                   \
        gp_algo_cand cand_[CUDA_ALGO_CAP];                                                 \
        for (int i_ = 0; i_ < (got); i_++)                                                 \
            cand_[i_] = (gp_algo_cand){                                                    \
                .algo = (int)(perf)[i_].algo,                                              \
                .ok = (perf)[i_].status == CUDNN_STATUS_SUCCESS &&                         \
                      (!cv->bf16 || bf16_algo_ok((gdir), (int)(perf)[i_].algo)),           \
                .time_ms = (measured) ? (perf)[i_].time : -1.0f,                           \
                .memory = (perf)[i_].memory,                                               \
                .deterministic = (perf)[i_].determinism == CUDNN_DETERMINISTIC};           \
        (idx) = gp_algo_pick(cand_, (got), (limit), ctx->deterministic);                   \
        log_pick(dev, (dir), d, cand_, (got), (idx), (limit));                             \
        if ((idx) < 0) return no_algo(dev, (dir), d, (limit));                             \
    } while (0)

/* The workspace a measured search may use: `most` (0: the limit), or half
 * of it and so on where the device's capacity or the GPU's free memory
 * refuses that (nothing below 1 MiB: then only algorithms that need no
 * workspace are tried).  The caller frees it after the search, so no step
 * keeps it; the chosen algorithm's own workspace is reserved when it runs.
 * Counts the search (dev->algo_searches) when `count`. */
void gp_cuda_search_ws(gp_device *dev, size_t most, void **ws, size_t *bytes, bool count)
{
    dev->algo_searches += count;
    for (size_t b = most ? most : gp_cuda_ws_limit(dev); b >= ((size_t)1 << 20); b /= 2) {
        if (gp_dev_alloc(dev, b, GP_MEM_WORKSPACE, ws) == GP_OK) {
            *bytes = b;
            return;
        }
        gp_error_clear();
    }
    *ws = NULL;
    *bytes = 0;
}

static gp_status no_algo(gp_device *dev, const char *dir, const gp_conv_desc *d, size_t limit)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    return gp_error_set(GP_ERR_UNSUPPORTED,
                        "device %s: cuDNN offers no %s%s algorithm for convolution (n=%lld c=%lld "
                        "%lldx%lld k=%lld kernel %lldx%lld) within a %zu-byte workspace%s",
                        dev->name, ctx->deterministic ? "deterministic " : "", dir,
                        (long long)d->n, (long long)d->c, (long long)d->h, (long long)d->w,
                        (long long)d->k, (long long)d->kh, (long long)d->kw, limit,
                        ctx->deterministic ? "; train.deterministic: false lets it choose any"
                                           : "; give the device more memory");
}

/* Whether side i (0 x or dx, 2 y or dy) of call d is in another layout
 * than convolution cv computes in: given channels-last (d->xblk, d->yblk)
 * to a plain convolution, or plain to a channels-last one (the ends of a
 * chain: backend.h, act_block). */
static bool conv_flip(const cuda_conv *cv, const gp_conv_desc *d, int i)
{
    return ((i == 0 ? d->xblk : d->yblk) != 0) != cv->nhwc;
}

/* The layout change of side i into cv's layout (to: true) or out of it:
 * (C, H W) to (H W, C) per image into channels-last, the reverse out. */
static gp_status conv_turn(gp_device *dev, const cuda_conv *cv, int i, bool to, void *dst,
                           bool dst16, const void *src, bool src16, bool add)
{
    const gp_conv_desc *d = &cv->d;
    int64_t ch = i == 0 ? d->c : d->k, px = i == 0 ? d->h * d->w : d->oh * d->ow;
    bool to_cl = to == cv->nhwc; /* into channels-last */
    GP_CUDA(gp_cuk_transpose(gp_cuda_ctx_of(dev)->compute, dst, dst16, src, src16, d->n,
                             to_cl ? ch : px, to_cl ? px : ch, add));
    return GP_OK;
}

/* Convolution cv's three tensors as cuDNN takes them for call d, t[0] x or
 * dx, t[1] w or dw, t[2] y or dy (n[i] values each): the caller's p[i], or
 * under bf16 their copies in gp_cuda_bf16_reserve's buffer, the inputs
 * (bit i of `in`) packed into them and the output left for the caller to
 * widen from t[i] (conv_out).  With io16 (bf16 storage: conv_*_bf16) p0
 * and p2 are bf16 already and are taken as they are: only the weights are
 * packed; one that is not 16-byte aligned (a view at an odd offset:
 * tensor-core kernels want aligned operands) goes through scratch, copied
 * in where it is an input and back by the caller where it is the output
 * (t[i] != p[i]).  A channels-last convolution (cv->nhwc) takes its
 * weights as KRSC, transposed from the kept copy or packed from w, and a
 * side in the other layout (conv_flip) goes through scratch, transposed. */
static gp_status conv_tensors(gp_device *dev, const cuda_conv *cv, const gp_conv_desc *d,
                              const void *p0, const float *p1, const void *p2, unsigned in,
                              bool io16, void *t[3], int64_t n[3])
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    const void *p[3] = {p0, p1, p2};
    n[0] = d->n * d->c * d->h * d->w;
    n[1] = d->k * d->c * d->kh * d->kw;
    n[2] = d->n * d->k * d->oh * d->ow;
    for (int i = 0; i < 3; i++) t[i] = (void *)p[i];
    if (io16 && !cv->bf16)
        return gp_error_set(GP_ERR_INVALID, "device %s: a convolution on bf16 storage that runs "
                                            "in FP32 (gp_dev_conv_bf16_takes is false for it)",
                            dev->name);
    int cl; /* a block other than all the channels: refused, as batch norm's and pooling's */
    GP_TRY(cuda_layout(dev, "convolution input", d->xblk, d->c, &cl));
    GP_TRY(cuda_layout(dev, "convolution output", d->yblk, d->k, &cl));
    if (!cv->bf16 && (d->xblk || d->yblk))
        return gp_error_set(GP_ERR_INVALID, "device %s: an FP32 convolution given channels-last "
                                            "activations (act_block says plain for it)",
                            dev->name);
    if (!cv->bf16) return GP_OK;
    uint16_t *bp[3];
    /* the weights as an input (forward, backward-data): their copy for the
     * step where one may be kept (gp_cuda_weights_bf16) */
    const uint16_t *kept = NULL;
    if (in >> 1 & 1) GP_TRY(gp_cuda_weights_bf16(dev, p[1], n[1], &kept));
    bool flip[3] = {conv_flip(cv, d, 0), cv->nhwc, conv_flip(cv, d, 2)};
    /* no scratch for a kept weight in its layout, nor for aligned
     * activations stored in bf16 in the convolution's layout */
    bool own[3] = {false, false, false};
    for (int i = 0; i < 3; i += 2) own[i] = io16 && !flip[i] && (uintptr_t)p[i] % 16 == 0;
    int64_t room[3] = {own[0] ? 0 : n[0], kept && !flip[1] ? 0 : n[1], own[2] ? 0 : n[2]};
    GP_TRY(gp_cuda_bf16_reserve(dev, room, 3, bp));
    for (int i = 0; i < 3; i++) {
        if (own[i]) continue; /* the caller's bf16 tensor */
        t[i] = bp[i];
        if (i == 1) {
            if (kept && !flip[1])
                t[1] = (void *)kept;
            else if ((in >> 1 & 1) && flip[1]) /* KCRS to KRSC: (C, R S) per k */
                GP_CUDA(gp_cuk_transpose(ctx->compute, bp[1], 1, kept ? (const void *)kept : p[1],
                                         kept != NULL, d->k, d->c, d->kh * d->kw, 0));
            else if (in >> 1 & 1)
                GP_CUDA(gp_cuk_bf16_pack(ctx->compute, bp[1], (const float *)p[1], n[1]));
            continue;
        }
        if (!(in >> i & 1)) continue; /* an output: conv_out */
        if (flip[i])
            GP_TRY(conv_turn(dev, cv, i, true, bp[i], true, p[i], io16, false));
        else if (io16) /* misaligned bf16: an aligned copy */
            GP_CUDA(cudaMemcpyAsync(bp[i], p[i], (size_t)n[i] * sizeof(uint16_t),
                                    cudaMemcpyDeviceToDevice, ctx->compute));
        else
            GP_CUDA(gp_cuk_bf16_pack(ctx->compute, bp[i], (const float *)p[i], n[i]));
    }
    return GP_OK;
}

/* Output side i (0 dx, 2 y) of a bf16 convolution from cuDNN's result
 * t (conv_tensors) into the caller's dst: nothing where cuDNN wrote dst
 * itself, else transposed (conv_flip), copied (misaligned bf16) or widened
 * (FP32 storage), without the bias. */
static gp_status conv_out(gp_device *dev, const cuda_conv *cv, const gp_conv_desc *d, int i,
                          void *dst, const void *t, int64_t n, bool io16)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (t == dst) return GP_OK;
    if (conv_flip(cv, d, i)) return conv_turn(dev, cv, i, false, dst, io16, t, true, false);
    if (io16)
        GP_CUDA(cudaMemcpyAsync(dst, t, (size_t)n * sizeof(uint16_t), cudaMemcpyDeviceToDevice,
                                ctx->compute));
    else
        GP_CUDA(gp_cuk_bf16_unpack(ctx->compute, dst, t, n));
    return GP_OK;
}

/* The three directions on FP32 or (io16) bf16 storage: x, y, dx and dy are
 * floats, or bf16 patterns cuDNN reads and writes as they are. */
static gp_status conv_fwd(gp_device *dev, const gp_conv_desc *d, const void *x, const float *w,
                          const float *b, void *y, bool io16)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    cuda_conv *cv;
    void *ws = NULL;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(conv_get(dev, d, &cv));
    void *t[3]; /* x, w in; y out */
    int64_t n[3];
    GP_TRY(conv_tensors(dev, cv, d, x, w, y, 3, io16, t, n));
    const void *xo = t[0], *wo = t[1];
    void *yo = t[2];
    if (!cv->have_fwd) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDA_ALGO_CAP];
        int got = 0, idx, cap = 0;
        GP_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(ctx->dnn, &cap));
        if (cap < 1 || cap > CUDA_ALGO_CAP) cap = CUDA_ALGO_CAP;
        size_t limit = gp_cuda_ws_limit(dev);
        /* tf32, bf16: every algorithm, tensor cores included, is a candidate */
        GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, gp_cuda_conv_math(ctx, cv)));
        bool measure = gp_cuda_may_measure(ctx);
        /* the heuristics' list: the choice unmeasured, the search's room measured */
        GP_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(ctx->dnn, cv->x, cv->w, cv->conv, cv->y,
                                                        cap, &got, perf));
        if (measure) {
            void *sws;
            size_t room;
            SEARCH_ROOM(perf, got, limit, GP_CUDA_FWD, room);
            gp_cuda_search_ws(dev, room, &sws, &limit, true);
            /* runs every algorithm on these operands; y is written again below */
            cudnnStatus_t cs = cudnnFindConvolutionForwardAlgorithmEx(
                ctx->dnn, cv->x, xo, cv->w, wo, cv->conv, cv->y, yo,
                cap, &got, perf, sws, limit);
            if (sws) gp_dev_free(dev, sws, limit, GP_MEM_WORKSPACE);
            GP_CUDNN(cs);
        }
        PICK_OR_FAIL(perf, got, measure, limit, "forward", GP_CUDA_FWD, idx);
        cv->lms[GP_CUDA_FWD] = measure ? perf[idx].time : -1.0f;
        cv->fwd = perf[idx].algo;
        cv->math_fwd = gp_cuda_conv_tensor_math(ctx, cv) ? perf[idx].mathType : CUDNN_FMA_MATH;
        GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, cv->math_fwd));
        GP_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(ctx->dnn, cv->x, cv->w, cv->conv, cv->y,
                                                         cv->fwd, &cv->ws_fwd));
        cv->have_fwd = 1;
    }
    bool graph; /* the graph API's plan where it is faster (cuda_graph.c) */
    GP_TRY(gp_cuda_graph_conv(dev, cv, GP_CUDA_FWD, xo, wo, yo, &graph));
    if (!graph && cv->ws_fwd) GP_TRY(gp_cuda_ws_reserve(dev, cv->ws_fwd, &ws));
    gp_cuda_nvtx_push("conv_fwd");
    if (!graph && gp_cuda_conv_tensor_math(ctx, cv))
        GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, cv->math_fwd));
    if (!graph)
        GP_CUDNN(cudnnConvolutionForward(ctx->dnn, &one, cv->x, xo, cv->w, wo, cv->conv, cv->fwd,
                                         ws, cv->ws_fwd, &zero, cv->y, yo));
    /* y's values of one channel lie `plane` apart: 1 channels-last */
    int64_t plane = d->yblk ? 1 : d->oh * d->ow;
    if (io16) { /* y is cuDNN's bf16 result; the bias added to it, rounded once */
        GP_TRY(conv_out(dev, cv, d, 2, y, yo, n[2], true));
        if (d->has_bias && b)
            GP_CUDA(gp_cuk_bf16_bias(ctx->compute, (uint16_t *)y, b, n[2], d->k, plane));
    } else if (cv->bf16 && conv_flip(cv, d, 2)) { /* widened across layouts, then the bias */
        GP_TRY(conv_out(dev, cv, d, 2, y, yo, n[2], false));
        if (d->has_bias && b) {
            GP_TRY(set4d_fmt(ctx->td[0], d->yblk ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                             CUDNN_DATA_FLOAT, d->n, d->k, d->oh, d->ow));
            GP_CUDNN(cudnnAddTensor(ctx->dnn, &one, cv->b, b, &one, ctx->td[0], y));
        }
    } else if (cv->bf16) { /* widened, with the bias, in one pass */
        GP_CUDA(gp_cuk_bf16_unpack_bias(ctx->compute, y, yo, d->has_bias ? b : NULL, n[2],
                                        d->k, plane));
    } else if (d->has_bias && b) {
        GP_CUDNN(cudnnAddTensor(ctx->dnn, &one, cv->b, b, &one, cv->y, y));
    }
    gp_cuda_nvtx_pop();
    return GP_OK;
}

gp_status gp_cuda_conv_fwd(gp_device *dev, const gp_conv_desc *d, const float *x,
                           const float *w, const float *b, float *y)
{
    return conv_fwd(dev, d, x, w, b, y, false);
}

gp_status gp_cuda_conv_fwd_bf16(gp_device *dev, const gp_conv_desc *d, const uint16_t *x,
                                const float *w, const float *b, uint16_t *y)
{
    return conv_fwd(dev, d, x, w, b, y, true);
}

static gp_status conv_bwd_data(gp_device *dev, const gp_conv_desc *d, const float *w,
                               const void *dy, void *dx, bool io16)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    cuda_conv *cv;
    void *ws = NULL;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(conv_get(dev, d, &cv));
    void *t[3]; /* w, dy in; dx out */
    int64_t n[3];
    GP_TRY(conv_tensors(dev, cv, d, dx, w, dy, 6, io16, t, n));
    const void *wo = t[1], *dyo = t[2];
    void *dxo = t[0];
    if (!cv->have_bwd_data) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDA_ALGO_CAP];
        int got = 0, idx, cap = 0;
        GP_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(ctx->dnn, &cap));
        if (cap < 1 || cap > CUDA_ALGO_CAP) cap = CUDA_ALGO_CAP;
        size_t limit = gp_cuda_ws_limit(dev);
        /* tf32, bf16: every algorithm, tensor cores included, is a candidate */
        GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, gp_cuda_conv_math(ctx, cv)));
        bool measure = gp_cuda_may_measure(ctx);
        GP_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx->dnn, cv->w, cv->y, cv->conv,
                                                             cv->x, cap, &got, perf));
        if (measure) {
            void *sws;
            size_t room;
            SEARCH_ROOM(perf, got, limit, GP_CUDA_BWD_DATA, room);
            gp_cuda_search_ws(dev, room, &sws, &limit, true);
            /* dx is written (beta 0) again below */
            cudnnStatus_t cs = cudnnFindConvolutionBackwardDataAlgorithmEx(
                ctx->dnn, cv->w, wo, cv->y, dyo, cv->conv, cv->x, dxo,
                cap, &got, perf, sws, limit);
            if (sws) gp_dev_free(dev, sws, limit, GP_MEM_WORKSPACE);
            GP_CUDNN(cs);
        }
        PICK_OR_FAIL(perf, got, measure, limit, "backward-data", GP_CUDA_BWD_DATA, idx);
        cv->lms[GP_CUDA_BWD_DATA] = measure ? perf[idx].time : -1.0f;
        cv->bwd_data = perf[idx].algo;
        cv->math_bwd_data = gp_cuda_conv_tensor_math(ctx, cv) ? perf[idx].mathType : CUDNN_FMA_MATH;
        GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, cv->math_bwd_data));
        GP_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(ctx->dnn, cv->w, cv->y, cv->conv,
                                                              cv->x, cv->bwd_data,
                                                              &cv->ws_bwd_data));
        cv->have_bwd_data = 1;
    }
    bool graph;
    GP_TRY(gp_cuda_graph_conv(dev, cv, GP_CUDA_BWD_DATA, dxo, wo, dyo, &graph));
    if (!graph) {
        if (cv->ws_bwd_data) GP_TRY(gp_cuda_ws_reserve(dev, cv->ws_bwd_data, &ws));
        gp_cuda_nvtx_push("conv_bwd_data");
        /* dx = (beta 0) */
        if (gp_cuda_conv_tensor_math(ctx, cv))
            GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, cv->math_bwd_data));
        GP_CUDNN(cudnnConvolutionBackwardData(ctx->dnn, &one, cv->w, wo, cv->y, dyo, cv->conv,
                                              cv->bwd_data, ws, cv->ws_bwd_data, &zero, cv->x,
                                              dxo));
        gp_cuda_nvtx_pop();
    }
    if (cv->bf16) GP_TRY(conv_out(dev, cv, d, 0, dx, dxo, n[0], io16));
    return GP_OK;
}

gp_status gp_cuda_conv_bwd_data(gp_device *dev, const gp_conv_desc *d, const float *w,
                                const float *dy, float *dx)
{
    return conv_bwd_data(dev, d, w, dy, dx, false);
}

gp_status gp_cuda_conv_bwd_data_bf16(gp_device *dev, const gp_conv_desc *d, const float *w,
                                     const uint16_t *dy, uint16_t *dx)
{
    return conv_bwd_data(dev, d, w, dy, dx, true);
}

static gp_status conv_bwd_weights(gp_device *dev, const gp_conv_desc *d, const void *x,
                                  const void *dy, float *dw, float *db, bool io16)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    cuda_conv *cv;
    void *ws = NULL;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(conv_get(dev, d, &cv));
    /* x, dy in; bf16: cuDNN writes (beta 0) the weight gradient's bf16
     * part, added to dw in FP32 after */
    void *t[3];
    int64_t n[3];
    GP_TRY(conv_tensors(dev, cv, d, x, dw, dy, 5, io16, t, n));
    const void *xo = t[0], *dyo = t[2];
    void *dwo = t[1];
    if (!cv->have_bwd_filter) {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDA_ALGO_CAP];
        int got = 0, idx, cap = 0;
        GP_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(ctx->dnn, &cap));
        if (cap < 1 || cap > CUDA_ALGO_CAP) cap = CUDA_ALGO_CAP;
        size_t limit = gp_cuda_ws_limit(dev);
        /* tf32, bf16: every algorithm, tensor cores included, is a candidate */
        GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, gp_cuda_conv_math(ctx, cv)));
        /* the search writes its dw (beta 0): into a scratch tensor, not the
         * gradient this call adds to (bf16: the bf16 part is one); no room
         * for one: the heuristics */
        size_t dw_bytes = (size_t)n[1] * sizeof(float);
        void *sdw = NULL;
        bool measure = gp_cuda_may_measure(ctx);
        if (measure && cv->bf16) {
            sdw = dwo;
            dw_bytes = 0;
        } else if (measure && gp_dev_alloc(dev, dw_bytes, GP_MEM_WORKSPACE, &sdw) != GP_OK) {
            gp_error_clear();
            measure = false;
        }
        GP_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx->dnn, cv->x, cv->y, cv->conv,
                                                               cv->w, cap, &got, perf));
        if (measure) {
            void *sws;
            size_t room;
            SEARCH_ROOM(perf, got, limit, GP_CUDA_BWD_FILTER, room);
            gp_cuda_search_ws(dev, room, &sws, &limit, true);
            cudnnStatus_t cs = cudnnFindConvolutionBackwardFilterAlgorithmEx(
                ctx->dnn, cv->x, xo, cv->y, dyo, cv->conv, cv->w, sdw,
                cap, &got, perf, sws, limit);
            if (sws) gp_dev_free(dev, sws, limit, GP_MEM_WORKSPACE);
            if (dw_bytes) gp_dev_free(dev, sdw, dw_bytes, GP_MEM_WORKSPACE);
            GP_CUDNN(cs);
        }
        PICK_OR_FAIL(perf, got, measure, limit, "backward-filter", GP_CUDA_BWD_FILTER, idx);
        cv->lms[GP_CUDA_BWD_FILTER] = measure ? perf[idx].time : -1.0f;
        cv->bwd_filter = perf[idx].algo;
        cv->math_bwd_filter = gp_cuda_conv_tensor_math(ctx, cv) ? perf[idx].mathType : CUDNN_FMA_MATH;
        GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, cv->math_bwd_filter));
        GP_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx->dnn, cv->x, cv->y, cv->conv,
                                                                cv->w, cv->bwd_filter,
                                                                &cv->ws_bwd_filter));
        cv->have_bwd_filter = 1;
    }
    bool graph;
    GP_TRY(gp_cuda_graph_conv(dev, cv, GP_CUDA_BWD_FILTER, xo, dwo, dyo, &graph));
    if (!graph && cv->ws_bwd_filter) GP_TRY(gp_cuda_ws_reserve(dev, cv->ws_bwd_filter, &ws));
    gp_cuda_nvtx_push("conv_bwd_weights");
    /* dw += (beta 1; bf16: = into the bf16 part, then added), db += (beta 1) */
    if (!graph && gp_cuda_conv_tensor_math(ctx, cv))
        GP_CUDNN(cudnnSetConvolutionMathType(cv->conv, cv->math_bwd_filter));
    if (!graph)
        GP_CUDNN(cudnnConvolutionBackwardFilter(ctx->dnn, &one, cv->x, xo, cv->y, dyo, cv->conv,
                                                cv->bwd_filter, ws, cv->ws_bwd_filter,
                                                cv->bf16 ? &zero : &one, cv->w, dwo));
    if (cv->nhwc) /* KRSC back to KCRS: (R S, C) per k, added */
        GP_CUDA(gp_cuk_transpose(ctx->compute, dw, 0, dwo, 1, d->k, d->kh * d->kw, d->c, 1));
    else if (cv->bf16)
        GP_CUDA(gp_cuk_bf16_unpack_add(ctx->compute, dw, dwo, n[1]));
    if (d->has_bias && db && d->yblk) { /* channels-last dy: its columns' sums */
        void *part;
        int64_t rows = d->n * d->oh * d->ow;
        GP_TRY(gp_cuda_ws_reserve(dev, (size_t)gp_cuk_sum_rows_parts(rows, d->k) *
                                           (size_t)d->k * sizeof(double), &part));
        if (io16)
            GP_CUDA(gp_cuk_sum_rows_bf16(ctx->compute, dy, db, rows, d->k, part, false));
        else
            GP_CUDA(gp_cuk_sum_rows(ctx->compute, dy, db, rows, d->k, part, false));
    } else if (d->has_bias && db) { /* cuda_kernels.h: a quarter of cuDNN's time */
        void *part;
        GP_TRY(gp_cuda_ws_reserve(dev, (size_t)(d->n * d->k) * sizeof(double), &part));
        if (io16)
            GP_CUDA(gp_cuk_sum_planes_bf16(ctx->compute, dy, db, d->n, d->k, d->oh * d->ow,
                                           part));
        else
            GP_CUDA(gp_cuk_sum_planes(ctx->compute, dy, db, d->n, d->k, d->oh * d->ow, part));
    }
    gp_cuda_nvtx_pop();
    return GP_OK;
}

gp_status gp_cuda_conv_bwd_weights(gp_device *dev, const gp_conv_desc *d, const float *x,
                                   const float *dy, float *dw, float *db)
{
    return conv_bwd_weights(dev, d, x, dy, dw, db, false);
}

gp_status gp_cuda_conv_bwd_weights_bf16(gp_device *dev, const gp_conv_desc *d,
                                        const uint16_t *x, const uint16_t *dy, float *dw,
                                        float *db)
{
    return conv_bwd_weights(dev, d, x, dy, dw, db, true);
}

/* act_block: all the channels (channels-last) on the sides of a
 * convolution that computes in NHWC, else plain. */
int64_t gp_cuda_act_block(gp_device *dev, const gp_conv_desc *d, bool output)
{
    return gp_cuda_conv_nhwc(gp_cuda_ctx_of(dev), d) ? (output ? d->k : d->c) : 0;
}

/* ---- pooling ------------------------------------------------------------------------ */

size_t gp_cuda_pool_ws_bytes(gp_device *dev, const gp_pool_desc *d) { return 0; }

/* td[0] = x, td[1] = y, ctx->pool = the window. */
static gp_status pool_setup(gp_device *dev, const gp_pool_desc *d)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(fits(dev, "pooling input", d->n, d->c, d->h, d->w));
    GP_TRY(fits(dev, "pooling output", d->n, d->c, d->oh, d->ow));
    if (d->kh <= 0 || d->kw <= 0 || d->sh <= 0 || d->sw <= 0 || d->ph < 0 || d->pw < 0 ||
        d->ph >= d->kh || d->pw >= d->kw || d->kh > INT_MAX || d->kw > INT_MAX ||
        d->sh > INT_MAX || d->sw > INT_MAX)
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: invalid pooling window (kernel %lldx%lld stride %lldx%lld "
                            "pad %lldx%lld); padding must be smaller than the kernel", dev->name,
                            (long long)d->kh, (long long)d->kw, (long long)d->sh,
                            (long long)d->sw, (long long)d->ph, (long long)d->pw);
    cudnnPoolingMode_t mode;
    switch (d->kind) {
    case GP_POOL_MAX: mode = CUDNN_POOLING_MAX_DETERMINISTIC; break;
    case GP_POOL_AVG: mode = CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING; break;
    case GP_POOL_AVG_INCLUDE_PAD: mode = CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING; break;
    default:
        return gp_error_set(GP_ERR_INVALID, "device %s: unknown pooling kind %d", dev->name,
                            (int)d->kind);
    }
    GP_CUDNN(cudnnSetPooling2dDescriptor(ctx->pool, mode, CUDNN_NOT_PROPAGATE_NAN, (int)d->kh,
                                         (int)d->kw, (int)d->ph, (int)d->pw, (int)d->sh,
                                         (int)d->sw));
    GP_TRY(set4d(ctx->td[0], d->n, d->c, d->h, d->w));
    GP_TRY(set4d(ctx->td[1], d->n, d->c, d->oh, d->ow));
    int n, c, h, w;
    GP_CUDNN(cudnnGetPooling2dForwardOutputDim(ctx->pool, ctx->td[0], &n, &c, &h, &w));
    if (h != d->oh || w != d->ow)
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: pooling output %lldx%lld given, cuDNN computes %dx%d",
                            dev->name, (long long)d->oh, (long long)d->ow, h, w);
    return GP_OK;
}

static gp_status pool_kernel_desc(gp_device *dev, const gp_pool_desc *d, gp_cuk_pool *p);

/* Channels-last (d->blk) on FP32 storage: gpipe's kernels (those of bf16
 * storage, on floats), the layout cuDNN's descriptors here do not say. */
gp_status gp_cuda_pool_fwd(gp_device *dev, const gp_pool_desc *d, const float *x, float *y,
                           void *ws)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    if (d->blk) {
        gp_cuk_pool p;
        GP_TRY(pool_kernel_desc(dev, d, &p));
        GP_CUDA(gp_cuk_pool_fwd(ctx->compute, x, y, &p));
        return GP_OK;
    }
    GP_TRY(pool_setup(dev, d));
    GP_CUDNN(cudnnPoolingForward(ctx->dnn, ctx->pool, &one, ctx->td[0], x, &zero, ctx->td[1], y));
    return GP_OK;
}

/* The window for gpipe's pooling kernels (cuda_kernels.cu, the CPU's loops
 * bit for bit: bf16 storage, and FP32 averages' backward), checked as
 * cuDNN's path checks it. */
static gp_status pool_kernel_desc(gp_device *dev, const gp_pool_desc *d, gp_cuk_pool *p)
{
    int cl;
    GP_TRY(pool_setup(dev, d));
    GP_TRY(cuda_layout(dev, "pooling", d->blk, d->c, &cl));
    *p = (gp_cuk_pool){d->n,  d->c,  d->h,  d->w,  d->oh, d->ow, d->kh,
                       d->kw, d->sh, d->sw, d->ph, d->pw,
                       d->kind == GP_POOL_MAX ? 0 : d->kind == GP_POOL_AVG ? 1 : 2,
                       cl,    cl && !d->plain_out};
    return GP_OK;
}

/* An average's backward reads neither x nor y (backend.h: an average
 * pool's output is not kept for it): gpipe's kernel, which the bf16 path
 * runs too (the CPU's loops bit for bit), not cuDNN's, whose API takes
 * both.  Max pooling: cuDNN's, from x and y. */
gp_status gp_cuda_pool_bwd(gp_device *dev, const gp_pool_desc *d, const float *x,
                           const float *y, const float *dy, float *dx, const void *ws)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    if (d->kind != GP_POOL_MAX || d->blk) {
        gp_cuk_pool p;
        GP_TRY(pool_kernel_desc(dev, d, &p));
        GP_CUDA(gp_cuk_pool_bwd(ctx->compute, d->kind == GP_POOL_MAX ? x : NULL, dy, dx, &p));
        return GP_OK;
    }
    GP_TRY(pool_setup(dev, d));
    /* dx = (beta 0) */
    GP_CUDNN(cudnnPoolingBackward(ctx->dnn, ctx->pool, &one, ctx->td[1], y, ctx->td[1], dy,
                                  ctx->td[0], x, &zero, ctx->td[0], dx));
    return GP_OK;
}

gp_status gp_cuda_pool_fwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                                uint16_t *y, void *ws)
{
    (void)ws;
    gp_cuk_pool p;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(pool_kernel_desc(dev, d, &p));
    GP_CUDA(gp_cuk_pool_fwd_bf16(gp_cuda_ctx_of(dev)->compute, x, y, &p));
    return GP_OK;
}

gp_status gp_cuda_pool_bwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                                const uint16_t *y, const uint16_t *dy, uint16_t *dx,
                                const void *ws)
{
    (void)y;
    (void)ws;
    gp_cuk_pool p;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(pool_kernel_desc(dev, d, &p));
    GP_CUDA(gp_cuk_pool_bwd_bf16(gp_cuda_ctx_of(dev)->compute, x, dy, dx, &p));
    return GP_OK;
}

/* ---- batch normalisation ---------------------------------------------------------------- */

/* td[0] = x as (N, C, S, 1), td[2] = the (1, C, 1, 1) parameters.  The
 * workspace holds five channel vectors: ones, zeros (for absent gamma /
 * beta), the inverse std, and two sinks for absent dgamma / dbeta. */
/* The checks every batch-norm slot makes, on either path (bn_planes). */
static gp_status bn_check(gp_device *dev, const gp_bn_desc *d)
{
    if (d->n <= 0 || d->c <= 0 || d->s <= 0 || !(d->eps >= 0.0f) ||
        (double)d->eps < CUDNN_BN_MIN_EPSILON)
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: invalid batch norm (n=%lld c=%lld s=%lld eps=%g; cuDNN "
                            "needs eps >= %g)", dev->name, (long long)d->n, (long long)d->c,
                            (long long)d->s, (double)d->eps, (double)CUDNN_BN_MIN_EPSILON);
    int cl;
    GP_TRY(cuda_layout(dev, "batch norm", d->blk, d->c, &cl));
    return fits(dev, "batch norm input", d->n, d->c, d->s, 1);
}

/* cuDNN's descriptors and workspace (d checked by bn_check): *vecs 5 c
 * floats (bn_params' ones and zeros, the inverse deviations, two sinks);
 * with extra, *more: `extra` floats after them, 256-byte aligned. */
static gp_status bn_setup(gp_device *dev, const gp_bn_desc *d, float **vecs, size_t extra,
                          float **more)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(set4d(ctx->td[0], d->n, d->c, d->s, 1));
    GP_CUDNN(cudnnDeriveBNTensorDescriptor(ctx->td[2], ctx->td[0], CUDNN_BATCHNORM_SPATIAL));
    void *ws;
    size_t head = (5 * (size_t)d->c * sizeof(float) + 255) & ~(size_t)255;
    GP_TRY(gp_cuda_ws_reserve(dev, head + extra * sizeof(float), &ws));
    *vecs = ws;
    if (more) *more = (float *)((char *)ws + head);
    return GP_OK;
}

/* Room for the forward's scale and shift (2 c floats) in the workspace. */
static gp_status bn_vec_room(gp_device *dev, const gp_bn_desc *d, float **vec)
{
    void *ws;
    GP_TRY(gp_cuda_ws_reserve(dev, 2 * (size_t)d->c * sizeof(float), &ws));
    *vec = ws;
    return GP_OK;
}

/* gamma or ones, beta or zeros (filled in the workspace when absent). */
static gp_status bn_params(gp_cuda_ctx *ctx, const gp_bn_desc *d, float *vecs,
                           const float **gamma, const float **beta)
{
    if (!*gamma) {
        GP_CUDA(gp_cuk_fill(ctx->compute, vecs, 1.0f, d->c));
        *gamma = vecs;
    }
    if (!*beta) {
        GP_CUDA(gp_cuk_fill(ctx->compute, vecs + d->c, 0.0f, d->c));
        *beta = vecs + d->c;
    }
    return GP_OK;
}

/* Planes of at least 64 values (8x8 maps and larger) take gpipe's kernels
 * (gp_cuk_bnp_fwd / gp_cuk_bnp_bwd: at 28x28 and a batch of 1024 on an
 * H100, forward 0.27 ms and backward 0.40 ms where cuDNN's NCHW kernels
 * took 0.51 and 1.23), narrower ones cuDNN's (a 1-D batch norm; at 7x7 a
 * warp per plane of 49 values was 20-40% slower than cuDNN).  *part: 2 n c
 * doubles of workspace, then *vec: 5 c floats. */
static bool bn_planes(gp_device *dev, const gp_bn_desc *d, double **part, float **vec,
                      gp_status *st)
{
    *st = GP_OK;
    if (d->s < 64 || d->c > 65535 || d->n * d->c > INT_MAX / 32 || (d->blk && d->n > 65535))
        return false;
    size_t pb = 2 * (size_t)(d->n * d->c) * sizeof(double);
    void *ws;
    /* (5 c: channels-last backward's relu mask keeps its scale and shift) */
    *st = gp_cuda_ws_reserve(dev, pb + 5 * (size_t)d->c * sizeof(float), &ws);
    *part = ws;
    *vec = (float *)((char *)ws + pb);
    return true;
}

gp_status gp_cuda_bn_fwd_train(gp_device *dev, const gp_bn_desc *d, const float *x,
                               const float *gamma, const float *beta, float *y, float *mean,
                               float *var)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    float *vecs = NULL;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(bn_check(dev, d));
    double *part;
    float *vec;
    gp_status st;
    if (bn_planes(dev, d, &part, &vec, &st)) {
        GP_TRY(st);
        gp_cuda_nvtx_push("bn_fwd_train");
        GP_CUDA(gp_cuk_bnp_fwd(ctx->compute, x, d->n, d->c, d->s, d->eps, gamma, beta, d->relu,
                               d->add, y, mean, var, part, vec, d->blk != 0));
        gp_cuda_nvtx_pop();
        return GP_OK;
    }
    if (d->blk) { /* channels-last, narrow maps: the channel kernels, not cuDNN's */
        GP_TRY(bn_vec_room(dev, d, &vec));
        gp_cuda_nvtx_push("bn_fwd_train");
        GP_CUDA(gp_cuk_bn_stats(ctx->compute, x, d->n, d->c, d->s, mean, var, 1));
        GP_CUDA(gp_cuk_bn_apply(ctx->compute, x, mean, var, gamma, beta, d->eps, d->n, d->c,
                                d->s, d->relu, d->add, y, vec, 1));
        gp_cuda_nvtx_pop();
        return GP_OK;
    }
    float *vec2 = NULL;
    GP_TRY(bn_setup(dev, d, &vecs, 2 * (size_t)d->c, &vec2));
    GP_TRY(bn_params(ctx, d, vecs, &gamma, &beta));
    size_t cb = (size_t)d->c * sizeof(float);
    GP_CUDA(cudaMemsetAsync(mean, 0, cb, ctx->compute));
    GP_CUDA(cudaMemsetAsync(var, 0, cb, ctx->compute));
    gp_cuda_nvtx_push("bn_fwd_train");
    /* factor 1: mean = batch mean, var = unbiased batch variance */
    GP_CUDNN(cudnnBatchNormalizationForwardTraining(
        ctx->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, ctx->td[0], x, ctx->td[0], y, ctx->td[2],
        gamma, beta, 1.0, mean, var, (double)d->eps, NULL, NULL));
    GP_CUDA(gp_cuk_bn_biased_var(ctx->compute, var, d->c, (double)(d->n * d->s)));
    /* y written again with the plane kernels' expression (and the relu and
     * sum where asked, which cuDNN's kernels cannot fuse), so every path
     * normalises the same bits, with or without them, and the backward
     * (the relu's folded into the norm's) sees the same signs */
    GP_CUDA(gp_cuk_bn_apply(ctx->compute, x, mean, var, gamma, beta, d->eps, d->n, d->c, d->s,
                            d->relu, d->add, y, vec2, 0));
    gp_cuda_nvtx_pop();
    return GP_OK;
}

gp_status gp_cuda_bn_fwd_infer(gp_device *dev, const gp_bn_desc *d, const float *x,
                               const float *gamma, const float *beta, const float *mean,
                               const float *var, float *y)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(bn_check(dev, d));
    /* one pass, the expression of every other path (cuDNN's inference
     * kernel rounds differently), with the relu and sum where asked */
    float *vec;
    GP_TRY(bn_vec_room(dev, d, &vec));
    GP_CUDA(gp_cuk_bn_apply(ctx->compute, x, mean, var, gamma, beta, d->eps, d->n, d->c, d->s,
                            d->relu, d->add, y, vec, d->blk != 0));
    return GP_OK;
}

gp_status gp_cuda_bn_bwd(gp_device *dev, const gp_bn_desc *d, const float *x,
                         const float *gamma, const float *beta, const float *mean,
                         const float *var, const float *dy, float *dx, float *dgamma,
                         float *dbeta)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    float *vecs = NULL;
    const float *beta_unused = NULL;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(bn_check(dev, d));
    double *part;
    float *vec;
    gp_status st;
    if (bn_planes(dev, d, &part, &vec, &st)) {
        GP_TRY(st);
        gp_cuda_nvtx_push("bn_bwd");
        GP_CUDA(gp_cuk_bnp_bwd(ctx->compute, x, mean, var, gamma, beta, d->relu, dy, d->n, d->c,
                               d->s, d->eps, NULL, dx, dgamma, dbeta, part, vec, d->blk != 0));
        gp_cuda_nvtx_pop();
        return GP_OK;
    }
    if (d->blk) { /* channels-last, narrow maps: the channel kernels */
        void *sums;
        GP_TRY(gp_cuda_ws_reserve(dev, 2 * (size_t)d->c * sizeof(float), &sums));
        gp_cuda_nvtx_push("bn_bwd");
        GP_CUDA(gp_cuk_bn_bwd(ctx->compute, x, mean, var, gamma, beta, d->relu, dy, d->n, d->c,
                              d->s, d->eps, dx, dgamma, dbeta, sums, 1));
        gp_cuda_nvtx_pop();
        return GP_OK;
    }
    /* relu: dy masked first, a pass of its own (cuDNN's backward has no
     * mask to take) */
    float *more = NULL;
    size_t nv = (size_t)(d->n * d->c * d->s), vb = (2 * (size_t)d->c + 63) & ~(size_t)63;
    GP_TRY(bn_setup(dev, d, &vecs, d->relu ? vb + nv : 0, &more));
    if (d->relu) {
        GP_CUDA(gp_cuk_bn_relu_mask(ctx->compute, x, mean, var, gamma, beta, d->eps, d->n, d->c,
                                    d->s, dy, more + vb, more, 0));
        dy = more + vb;
    }
    GP_TRY(bn_params(ctx, d, vecs, &gamma, &beta_unused));
    float *inv = vecs + 2 * d->c;
    GP_CUDA(gp_cuk_bn_invstd(ctx->compute, var, d->eps, inv, d->c));
    gp_cuda_nvtx_push("bn_bwd");
    /* dx = (beta 0); dgamma +=, dbeta += (beta 1); absent ones go to sinks */
    GP_CUDNN(cudnnBatchNormalizationBackward(
        ctx->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &one, ctx->td[0], x, ctx->td[0], dy,
        ctx->td[0], dx, ctx->td[2], gamma, dgamma ? dgamma : vecs + 3 * d->c,
        dbeta ? dbeta : vecs + 4 * d->c, (double)d->eps, mean, inv));
    gp_cuda_nvtx_pop();
    return GP_OK;
}

/* ---- batch norm on bf16 storage (backend.h's bn_*_bf16) ------------------------------------
 * gpipe's kernels on every plane size, x, y, dy and dx read and written as
 * bf16: planes of 64+ values take the plane kernels, as in FP32, so the
 * bits are the storage adapter's; narrower ones (where FP32 runs cuDNN's
 * statistics and backward) take the channel kernels of synchronised batch
 * norm: sums in double as cuDNN's are not, so within FP32 rounding of the
 * adapter's, not bit for bit. */

static gp_status bn_bf16_check(gp_device *dev, const gp_bn_desc *d, bool forward)
{
    GP_TRY(bn_check(dev, d));
    if (d->add || (!forward && d->add16))
        return gp_error_set(GP_ERR_INVALID, "device %s: batch norm on bf16 storage takes its "
                                            "forward's residual in bf16 (gp_bn_desc.add16), "
                                            "not FP32 (.add)", dev->name);
    return GP_OK;
}

gp_status gp_cuda_bn_fwd_train_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                    const float *gamma, const float *beta, uint16_t *y,
                                    float *mean, float *var)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(bn_bf16_check(dev, d, true));
    double *part;
    float *vec;
    gp_status st;
    if (bn_planes(dev, d, &part, &vec, &st)) {
        GP_TRY(st);
        gp_cuda_nvtx_push("bn_fwd_train");
        GP_CUDA(gp_cuk_bnp_fwd_bf16(ctx->compute, x, d->n, d->c, d->s, d->eps, gamma, beta,
                                    d->relu, d->add16, y, mean, var, part, vec, d->blk != 0));
        gp_cuda_nvtx_pop();
        return GP_OK;
    }
    GP_TRY(bn_vec_room(dev, d, &vec));
    gp_cuda_nvtx_push("bn_fwd_train");
    GP_CUDA(gp_cuk_bn_stats_bf16(ctx->compute, x, d->n, d->c, d->s, mean, var, d->blk != 0));
    GP_CUDA(gp_cuk_bn_apply_bf16(ctx->compute, x, mean, var, gamma, beta, d->eps, d->n, d->c,
                                 d->s, d->relu, d->add16, y, vec, d->blk != 0));
    gp_cuda_nvtx_pop();
    return GP_OK;
}

gp_status gp_cuda_bn_fwd_infer_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                    const float *gamma, const float *beta, const float *mean,
                                    const float *var, uint16_t *y)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(bn_bf16_check(dev, d, true));
    float *vec;
    GP_TRY(bn_vec_room(dev, d, &vec));
    GP_CUDA(gp_cuk_bn_apply_bf16(ctx->compute, x, mean, var, gamma, beta, d->eps, d->n, d->c,
                                 d->s, d->relu, d->add16, y, vec, d->blk != 0));
    return GP_OK;
}

gp_status gp_cuda_bn_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const uint16_t *dy, uint16_t *dx, float *dgamma,
                              float *dbeta)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(bn_bf16_check(dev, d, false));
    double *part;
    float *vec;
    gp_status st;
    if (bn_planes(dev, d, &part, &vec, &st)) {
        GP_TRY(st);
        gp_cuda_nvtx_push("bn_bwd");
        GP_CUDA(gp_cuk_bnp_bwd_bf16(ctx->compute, x, mean, var, gamma, beta, d->relu, dy, d->n,
                                    d->c, d->s, d->eps, dx, dgamma, dbeta, part, vec,
                                    d->blk != 0));
        gp_cuda_nvtx_pop();
        return GP_OK;
    }
    void *sums;
    GP_TRY(gp_cuda_ws_reserve(dev, 2 * (size_t)d->c * sizeof(float), &sums));
    gp_cuda_nvtx_push("bn_bwd");
    GP_CUDA(gp_cuk_bn_bwd_bf16(ctx->compute, x, mean, var, gamma, beta, d->relu, dy, d->n, d->c,
                               d->s, d->eps, dx, dgamma, dbeta, sums, d->blk != 0));
    gp_cuda_nvtx_pop();
    return GP_OK;
}

/* ---- log-softmax --------------------------------------------------------------------------- */

gp_status gp_cuda_log_softmax(gp_device *dev, const float *x, float *y, int64_t rows,
                              int64_t cols)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (rows <= 0 || cols <= 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(fits(dev, "log-softmax input", rows, cols, 1, 1));
    GP_TRY(set4d(ctx->td[0], rows, cols, 1, 1));
    GP_CUDNN(cudnnSoftmaxForward(ctx->dnn, CUDNN_SOFTMAX_LOG, CUDNN_SOFTMAX_MODE_INSTANCE, &one,
                                 ctx->td[0], x, &zero, ctx->td[0], y));
    return GP_OK;
}

/* ---- synchronised batch norm: our kernels (cuDNN has no split statistics) ---- */

/* d and count are checked by the gp_dev_bn_* wrappers (device.c). */
gp_status gp_cuda_bn_stats(gp_device *dev, const gp_bn_desc *d, const float *x, float *mean,
                           float *var)
{
    int cl;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(cuda_layout(dev, "batch norm", d->blk, d->c, &cl));
    double *part;
    float *vec;
    gp_status st;
    if (bn_planes(dev, d, &part, &vec, &st)) {
        GP_TRY(st);
        GP_CUDA(gp_cuk_bnp_fwd(gp_cuda_ctx_of(dev)->compute, x, d->n, d->c, d->s, d->eps, NULL,
                               NULL, 0, NULL, NULL, mean, var, part, NULL, cl));
        return GP_OK;
    }
    gp_cuda_nvtx_push("bn_stats");
    GP_CUDA(gp_cuk_bn_stats(gp_cuda_ctx_of(dev)->compute, x, d->n, d->c, d->s, mean, var, cl));
    gp_cuda_nvtx_pop();
    return GP_OK;
}

gp_status gp_cuda_bn_bwd_sums(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const float *dy, float *sums)
{
    int cl;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(cuda_layout(dev, "batch norm", d->blk, d->c, &cl));
    double *part;
    float *vec;
    gp_status st;
    if (bn_planes(dev, d, &part, &vec, &st)) {
        GP_TRY(st);
        GP_CUDA(gp_cuk_bnp_bwd(gp_cuda_ctx_of(dev)->compute, x, mean, var, gamma, beta, d->relu,
                               dy, d->n, d->c, d->s, d->eps, sums, NULL, NULL, NULL, part, NULL,
                               cl));
        return GP_OK;
    }
    GP_CUDA(gp_cuk_bn_bwd_sums(gp_cuda_ctx_of(dev)->compute, x, mean, dy, d->n, d->c, d->s,
                               gamma, beta, var, d->eps, d->relu, sums, cl));
    return GP_OK;
}

gp_status gp_cuda_bn_bwd_apply(gp_device *dev, const gp_bn_desc *d, const float *x,
                               const float *gamma, const float *beta, const float *mean,
                               const float *var, const float *dy, const float *sums,
                               double count, float *dx, const float *local, float *dgamma,
                               float *dbeta)
{
    int cl;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(cuda_layout(dev, "batch norm", d->blk, d->c, &cl));
    GP_CUDA(gp_cuk_bn_bwd_apply(gp_cuda_ctx_of(dev)->compute, x, gamma, beta, d->relu, mean,
                                var, dy, sums, count, d->eps, d->n, d->c, d->s, dx, local,
                                dgamma, dbeta, cl));
    return GP_OK;
}
