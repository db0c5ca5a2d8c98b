/*
 * cuda_impl.h — shared inside the CUDA backend (the .c files of backend/cuda): the
 * device context, the check macros for CUDA / cuBLAS / cuDNN / NCCL calls,
 * NVTX ranges, and the slots implemented in cuda_dnn.c.
 *
 * Ownership.  gp_cuda_ctx belongs to its gp_device.  Its streams, library
 * handles, pinned staging buffers, workspace and convolution cache are used
 * only by the thread driving the device (backend.h: one at a time).  The
 * caching allocator's free lists are guarded by `lock`, because a block may
 * be freed from another thread (a pipeline worker freeing a received
 * buffer); peer copies touch the source device's streams only through
 * thread-safe CUDA calls (event record / stream wait).
 *
 * CI compiles and links this backend (no GPU there); test_cuda ran on an
 * H100 on 2026-11-23 and 2026-11-24 (bench/README.md, "GPU").  See
 * docs/gpus.md.
 */
#ifndef GP_CUDA_IMPL_H
#define GP_CUDA_IMPL_H

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>
#include <nvtx3/nvToolsExt.h>

/* ---- checks ----------------------------------------------------------------
 * One family: each records the library, the call text, the status (number
 * and name), the function, file and line as GP_ERR_RUNTIME. */
gp_status gp_cuda_fail(const char *lib, int code, const char *what, const char *call,
                       const char *func, const char *file, int line);

#define GP_CUDA_CHECK_(lib, type, okv, strfn, call, onfail)                         \
    do {                                                                        \
        type gp_cu_s_ = (call);                                                 \
        if (gp_cu_s_ != (okv)) {                                                \
            gp_status gp_cu_st_ = gp_cuda_fail(lib, (int)gp_cu_s_, strfn(gp_cu_s_), #call, \
                                               __func__, __FILE__, __LINE__);   \
            onfail;                                                             \
        }                                                                       \
    } while (0)

/* Return the failure from the enclosing function. */
#define GP_CUDA(call) \
    GP_CUDA_CHECK_("CUDA", cudaError_t, cudaSuccess, cudaGetErrorString, call, return gp_cu_st_)
#define GP_CUBLAS(call)                                                         \
    GP_CUDA_CHECK_("cuBLAS", cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, \
                   call, return gp_cu_st_)
#define GP_CUDNN(call)                                                          \
    GP_CUDA_CHECK_("cuDNN", cudnnStatus_t, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, call, \
                   return gp_cu_st_)
#define GP_NCCL(call) \
    GP_CUDA_CHECK_("NCCL", ncclResult_t, ncclSuccess, ncclGetErrorString, call, return gp_cu_st_)

/* The same, setting the local `st` and jumping to the local label `fail`
 * (functions that clean up). */
#define GP_CUDA_GO(call)                                                        \
    GP_CUDA_CHECK_("CUDA", cudaError_t, cudaSuccess, cudaGetErrorString, call,  \
                   { st = gp_cu_st_; goto fail; })
#define GP_CUBLAS_GO(call)                                                      \
    GP_CUDA_CHECK_("cuBLAS", cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, \
                   call, { st = gp_cu_st_; goto fail; })
#define GP_CUDNN_GO(call)                                                       \
    GP_CUDA_CHECK_("cuDNN", cudnnStatus_t, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, call, \
                   { st = gp_cu_st_; goto fail; })
#define GP_NCCL_GO(call)                                                        \
    GP_CUDA_CHECK_("NCCL", ncclResult_t, ncclSuccess, ncclGetErrorString, call, \
                   { st = gp_cu_st_; goto fail; })
/* The same, storing the failure in `var` and going on (a group that must
 * still be ended). */
#define GP_NCCL_SET(var, call)                                                  \
    GP_CUDA_CHECK_("NCCL", ncclResult_t, ncclSuccess, ncclGetErrorString, call, \
                   { var = gp_cu_st_; })

/* ---- NVTX: named ranges for Nsight Systems (no cost without a profiler) ---- */
static inline void gp_cuda_nvtx_push(const char *name) { nvtxRangePushA(name); }
static inline void gp_cuda_nvtx_pop(void) { nvtxRangePop(); }

/* ---- the caching allocator --------------------------------------------------
 * Freed blocks go to a free list of their size class and are handed out
 * again without cudaMalloc; cudaFree happens only when cudaMalloc fails
 * (the cache is released and the malloc retried) and at destruction.
 * Size classes: 512 B, then four per power of two (2^k * {5,6,7,8}/4), so
 * a block wastes at most a quarter of its size; sizes above the last class
 * are not cached.  A freed block carries two events recorded at free time on
 * the device's compute and copy streams; whoever gets it next makes both
 * streams wait on them, so memory is never reused while queued work (or a
 * peer device's copy, see cuda_copy_peer) may still touch it. */
#define CUDA_NCLASSES 160

typedef struct cuda_block {
    void *ptr;
    cudaEvent_t done_compute, done_copy; /* recorded when freed */
    struct cuda_block *next;
} cuda_block;

/* Pinned host staging: two chunks used alternately, each with an event
 * that says when its last transfer has finished. */
#define CUDA_STAGE_BYTES ((size_t)4 << 20)

/* A convolution shape's cuDNN descriptors and chosen algorithms. */
typedef struct cuda_conv {
    gp_conv_desc d;
    cudnnTensorDescriptor_t x, y, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    bool bf16; /* precision bf16 and gp_bf16_conv_worth: bf16 operands */
    bool nhwc; /* channels-last x, KRSC w and y (gp_cuda_conv_nhwc) */
    int have_fwd, have_bwd_data, have_bwd_filter;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    /* each direction's math type as its algorithm was chosen with (set on
     * the shared descriptor before each use; tf32 only, else FMA) */
    cudnnMathType_t math_fwd, math_bwd_data, math_bwd_filter;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t ws_fwd, ws_bwd_data, ws_bwd_filter;
    /* cuda_graph.c: the graph API's execution plan per direction
     * (GP_CUDA_FWD ..) and operand alignment (16 bytes, 4), its workspace,
     * and whether it was looked for; a NULL plan once tried: the legacy
     * algorithm above */
    cudnnBackendDescriptor_t gplan[3][2];
    cudnnBackendDescriptor_t gkeep[3][2][2]; /* the plan's graph and engine config */
    float lms[3]; /* the legacy algorithm's measured ms per direction (-1: not measured) */
    size_t gws[3][2];
    unsigned char gtried[3][2];
    struct cuda_conv *next;
} cuda_conv;

enum { GP_CUDA_FWD, GP_CUDA_BWD_DATA, GP_CUDA_BWD_FILTER };

/* The largest cuDNN workspace an algorithm may ask for is an eighth of a
 * capped device's memory, else a sixteenth of the GPU's (5 GiB of an H100):
 * FFT convolutions at 28x28 and a batch of 1024 want more than 256 MiB,
 * the limit before, and ran 2x slower without them (bench/README.md).
 * Never below this floor. */
#define CUDA_CONV_WS_FLOOR ((size_t)256 << 20)

#define CUDA_MAX_DEVICES 64

typedef struct gp_cuda_ctx {
    int ordinal;                  /* the N of cuda:N */
    size_t gpu_bytes;             /* the GPU's memory (cudaMemGetInfo's total) */
    bool tf32;                    /* precision tf32: TF32 tensor-core math (cuBLAS, cuDNN) */
    bool bf16;                    /* precision bf16: convolutions and matrix products on
                                     operands rounded to bfloat16, FP32 sums (tensor cores) */
    bool legacy_conv;             /* GPIPE_CUDNN_LEGACY=1: no graph API for convolutions */
    bool graph_force;             /* GPIPE_CUDNN_GRAPH=force: its plan wherever one builds */
    bool sdpa_off;                /* GPIPE_CUDNN_SDPA=0: attention on gpipe's own kernels */
    int nhwc;                     /* channels-last convolutions (gp_cuda_conv_nhwc):
                                     GP_CUDA_NHWC_ALL (the default), _CHAINS
                                     (GPIPE_CUDA_NHWC=chains) or _OFF (=0) */
    int sm;                       /* compute capability, major * 10 + minor */
    struct cuda_sdpa *sdpas;      /* per-shape fused attention plans (cuda_sdpa.c) */
    bool deterministic;           /* train.deterministic: cuDNN algorithms by heuristics,
                                     deterministic only; else measured (cudnnFind) */
    int chans_open;               /* channels (chan_open) open on this device */
    /* Uncached frees held back while channels are open (cuda_free), done by
     * the next synchronize; under lock. */
    void **deferred;
    size_t *deferred_bytes;
    int n_deferred, cap_deferred;
    cudaStream_t compute, copy;   /* the device's two in-order streams */
    cudaEvent_t fence_compute;    /* "everything issued to compute so far" */
    cudaEvent_t fence_copy;       /* the same for the copy stream */
    cublasHandle_t blas;          /* bound to `compute` */
    cublasLtHandle_t lt;          /* FP32 / TF32 products and their epilogues (cuda_blas.c) */
    bool lt_off;                  /* GPIPE_CUBLASLT=0: cublasSgemm and own kernels instead */
    bool lt_relu;                 /* the relu epilogue keeps NaN (gp_cuda_lt_probe_relu) */
    struct cuda_mm *mms;          /* per-shape cuBLASLt plans (cuda_blas.c) */
    cudnnHandle_t dnn;            /* bound to `compute` */

    /* caching allocator (guarded by lock) */
    pthread_mutex_t lock;
    cuda_block *free_list[CUDA_NCLASSES];
    cuda_block *spare;            /* nodes (with their events) not in use */
    size_t cached_bytes;          /* bytes of blocks in free lists */
    size_t device_bytes;          /* bytes obtained from cudaMalloc, live */

    /* pinned staging for copy_h2d / copy_d2h */
    void *stage[2];
    cudaEvent_t stage_done[2];
    int stage_next;

    /* device-side scratch results, read back through pinned `host_res` */
    void *dev_res;                /* (cuda_res) GP_MEM_WORKSPACE */
    void *host_res;               /* (cuda_res) pinned */

    /* workspace for cuDNN and the reductions (GP_MEM_WORKSPACE), grown */
    void *ws;
    size_t ws_bytes;
    /* precision bf16: the operands of one convolution or matrix product
     * rounded to bfloat16 (gp_cuda_bf16_reserve), grown */
    void *bws;
    size_t bws_bytes;

    /* peer access and the events a copy from device s records on s */
    unsigned char can_peer[CUDA_MAX_DEVICES]; /* peer access to GPU j: 0 not asked yet,
                                                 1 enabled, 2 not possible */
    cudaEvent_t peer_ev[CUDA_MAX_DEVICES];  /* created on device s, lazily */

    /* cuDNN descriptors reused by pooling, batch norm and softmax */
    cudnnTensorDescriptor_t td[3];
    cudnnPoolingDescriptor_t pool;
    cuda_conv *convs;             /* per-shape convolution cache */

    /* device-time markers (timing events, reused across steps): marks[0 ..
     * n_marks) taken since the last mark_reset, on the device's worker;
     * read between steps against `anchor`, an event recorded once the
     * streams are idle and waited for, whose host time is anchor_host */
    cudaEvent_t *marks;
    int n_marks, cap_marks;
    cudaEvent_t anchor;
    double anchor_host;
    bool anchored;
} gp_cuda_ctx;

/* Results the reductions leave in device memory. */
typedef struct cuda_res {
    double sumsq;
    int nonfinite;
    gp_cuk_xent_out xent;
    gp_cuk_bce_out bce;
} cuda_res;

static inline gp_cuda_ctx *gp_cuda_ctx_of(gp_device *dev) { return (gp_cuda_ctx *)dev->ctx; }

/* Whether algorithm choices (cuDNN's, cuBLASLt's) are measured: not with
 * train.deterministic (heuristics, deterministic only), and not while
 * channels to other processes are open (a timed search synchronizes the
 * stream, which may wait behind a receive another process has yet to
 * send; the heuristics' first then). */
static inline bool gp_cuda_may_measure(const gp_cuda_ctx *ctx)
{
    return !ctx->deterministic && ctx->chans_open == 0;
}

/* Make the device current on the calling thread if it is not (cheap: a
 * thread-local read).  Every slot calls it, so an op is right even on a
 * thread that never called gp_device_bind_thread. */
gp_status gp_cuda_enter(gp_device *dev);

/* At least `bytes` of workspace (accounted as GP_MEM_WORKSPACE). */
gp_status gp_cuda_ws_reserve(gp_device *dev, size_t bytes, void **out);

/* Precision bf16: out[i] = room for counts[i] bfloat16 values, i < n,
 * each 256-byte aligned, in one buffer apart from the workspace (valid
 * until the next call; accounted as GP_MEM_WORKSPACE). */
#define GP_CUDA_BF16_PARTS 5
gp_status gp_cuda_bf16_reserve(gp_device *dev, const int64_t *counts, int n, uint16_t **out);

/* Precision bf16: *out = the bf16 mirror of the n weights at w
 * (gp_wmirror, backend.h), rounded on its first use while the device's
 * weights are frozen (gp_dev_freeze_weights: a step's forwards and
 * backwards, which do not change them) and after that written by the
 * update in its own pass, so no step rounds weights (issue 50: nothing
 * repacks weights per call).  *out NULL where nothing may be kept (not
 * frozen, or the device has a memory capacity, whose estimates count no
 * kept copies): the caller packs into gp_cuda_bf16_reserve's scratch as
 * before. */
gp_status gp_cuda_weights_bf16(gp_device *dev, const float *w, int64_t n, const uint16_t **out);

/* Tensor-core math may be used for a convolution: precision tf32 (TF32
 * on its FP32 data), or its operands in bf16. */
static inline bool gp_cuda_conv_tensor_math(const gp_cuda_ctx *ctx, const cuda_conv *cv)
{
    return ctx->tf32 || cv->bf16;
}

/* The math type a convolution's algorithm search allows: CUDNN_FMA_MATH
 * for exact FP32; CUDNN_DEFAULT_MATH for tf32 (TF32 tensor cores on FP32
 * data, as PyTorch sets it); CUDNN_TENSOR_OP_MATH for bf16 operands, as
 * PyTorch sets it for half-width data (cuDNN's documentation ties the
 * default's tensor cores to TF32 and does not say it admits them for
 * bf16). */
static inline cudnnMathType_t gp_cuda_conv_math(const gp_cuda_ctx *ctx, const cuda_conv *cv)
{
    return cv->bf16 ? CUDNN_TENSOR_OP_MATH : ctx->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

/* Whether cuBLASLt's relu epilogue keeps a NaN as gpipe's relu does (its
 * documentation says max(x, 0), which fmaxf makes 0): a 128 x 128 x 128
 * product with a NaN, through CUBLASLT_EPILOGUE_RELU_BIAS when the device
 * opens, read back (layer-sized: cuBLASLt picks kernels by shape);
 * ctx->lt_relu says.  Where it does not, linear_fwd asks cuBLASLt for the
 * bias alone and runs gpipe's relu kernel after it, so the NaN check sees
 * what the CPU's would. */
gp_status gp_cuda_lt_probe_relu(gp_device *dev);

/* cuda_blas.c: the cuBLASLt handle and per-shape plans. */
typedef struct cuda_mm cuda_mm;
gp_status gp_cuda_lt_init(gp_cuda_ctx *ctx);
void gp_cuda_lt_destroy(gp_cuda_ctx *ctx);
/* Row-major C(m, n) = alpha op(A) op(B) + beta C, then + bias(n) on every
 * row (bias NULL: none), then relu (relu false: none), as cuda_gemm's
 * arguments, in one cuBLASLt call on the compute stream with the shape's
 * chosen algorithm (measured on its first call).  *done false: nothing
 * ran (GPIPE_CUBLASLT=0, no algorithm, a failed launch); the caller
 * computes the same with cublasSgemm and its own kernels.  FP32 / TF32
 * only (precision bf16 takes cuda_gemm's cublasGemmEx). */
gp_status gp_cuda_lt_gemm(gp_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k,
                          float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                          float beta, float *c, int64_t ldc, const float *bias, bool relu,
                          bool *done);
/* The operand types of gp_cuda_lt_gemm_io: FP32 throughout, or A, B and C
 * bf16 (bf16 storage: the product, bias and relu in FP32, C rounded once
 * by the epilogue). */
typedef enum { GP_LT_F32 = 0, GP_LT_ABC16 } gp_lt_io;
/* gp_cuda_lt_gemm on operands of types `io` (compute FP32; TF32 only for
 * GP_LT_F32 under precision tf32); the bias stays FP32. */
gp_status gp_cuda_lt_gemm_io(gp_device *dev, gp_lt_io io, int ta, int tb, int64_t m, int64_t n,
                             int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                             int64_t ldb, float beta, void *c, int64_t ldc, const float *bias,
                             bool relu, bool *done);
/* A product with GELU in its epilogue (issue 64), beta 0: forward, C =
 * GELU(A op B + bias) with aux = the product and bias before it (laid out
 * as C); backward, C = (A op B) times GELU'(aux) (bias unused).  The
 * tanh GELU of GPT-2, within rounding of gpipe's kernels.  *done false:
 * nothing ran (no plan, aux not 16-byte aligned, GPIPE_CUBLASLT=0); the
 * caller runs the product and gpipe's GELU kernel.  Compiled, not run. */
gp_status gp_cuda_lt_gemm_gelu(gp_device *dev, gp_lt_io io, bool backward, int ta, int tb,
                               int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                               const void *b, int64_t ldb, void *c, int64_t ldc,
                               const float *bias, const void *aux, bool *done);

/* cuda_graph.c's pieces of cuDNN's graph API that cuda_sdpa.c shares:
 * the engine configurations the heuristics offer for `graph` in `mode`,
 * appended to cfg (cap in all, *n counting them); and cfg's execution
 * plan with its workspace size (*plan NULL on failure). */
void gp_cuda_graph_heuristics(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                              cudnnBackendDescriptor_t *cfg, int *n, int cap);
cudnnStatus_t gp_cuda_graph_plan(gp_cuda_ctx *ctx, cudnnBackendDescriptor_t cfg,
                                 cudnnBackendDescriptor_t *plan, int64_t *ws);

/* cuda_sdpa.c: causal self-attention (backend.h's attn_fwd / attn_bwd)
 * through cuDNN's fused scaled-dot-product attention under precision
 * bf16 on Hopper (sm_90).  *done false: nothing ran (not allowed here, no plan, a
 * failed launch); the caller runs gpipe's own kernels. */
gp_status gp_cuda_sdpa_fwd(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                           int64_t t, int64_t heads, int64_t c, bool *done);
gp_status gp_cuda_sdpa_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                           const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                           int64_t c, bool *done);
/* The same on bf16 storage (attn_fwd_bf16 / attn_bwd_bf16): the operands
 * as they are, nothing packed or widened. */
gp_status gp_cuda_sdpa_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                                int64_t b, int64_t t, int64_t heads, int64_t c, bool *done);
gp_status gp_cuda_sdpa_bwd_bf16(gp_device *dev, const uint16_t *x, const uint16_t *y,
                                const float *lse, const uint16_t *dy, uint16_t *dx, int64_t b,
                                int64_t t, int64_t heads, int64_t c, bool *done);
void gp_cuda_sdpa_destroy(gp_cuda_ctx *ctx);
/* cuda_graph.c's and cuda_sdpa.c's test hooks (tests/test_cuda_graphs.c,
 * no GPU needed). */
int gp_cuda_conv_graph_check(const gp_conv_desc *d, int bf16, int nhwc, int dir);
int gp_cuda_sdpa_graph_check(int64_t b, int64_t t, int64_t heads, int64_t c, int dir,
                             int *n_ops, int *n_desc, char *why, size_t len);

/* cuda_dnn.c: create / destroy the shared descriptors and the conv cache. */
gp_status gp_cuda_dnn_init(gp_cuda_ctx *ctx);
void gp_cuda_dnn_destroy(gp_cuda_ctx *ctx);

/* cuda_dnn.c: the largest workspace a convolution algorithm may use, and
 * a search's borrowed workspace, at most `most` bytes (0: that limit;
 * count: count the search). */
size_t gp_cuda_ws_limit(gp_device *dev);
void gp_cuda_search_ws(gp_device *dev, size_t most, void **ws, size_t *bytes, bool count);

/* cuda_graph.c: convolution direction dir through cuDNN's graph API on
 * tensors 1 (x / dx), 2 (w / dw), 3 (y / dy), choosing its plan on the
 * first call (after the legacy search, whose measured time cv->lms it must
 * beat); *done false: no plan, the caller runs the legacy algorithm. */
gp_status gp_cuda_graph_conv(gp_device *dev, cuda_conv *cv, int dir, const void *p1,
                             const void *p2, const void *p3, bool *done);
void gp_cuda_graph_free(cuda_conv *cv);

/* Channels-last (issue 67): a convolution whose operands are bf16 and
 * whose channels on both sides are multiples of 8 computes in NHWC, the
 * layout cuDNN's bf16 tensor-core kernels read natively (on NCHW they
 * transpose inside), unless GPIPE_CUDA_NHWC=0.  act_block says so to the
 * layers, which then keep the maps between such convolutions, through
 * batch norm, pooling, relu and the residual sums, channels-last
 * (gp_layers_blocked); a chain's ends transpose (cuda_dnn.c, conv_turn). */
enum { GP_CUDA_NHWC_OFF, GP_CUDA_NHWC_ALL, GP_CUDA_NHWC_CHAINS };
static inline bool gp_cuda_conv_nhwc(const gp_cuda_ctx *ctx, const gp_conv_desc *d)
{
    return ctx->nhwc && ctx->bf16 && gp_bf16_conv_worth(d) && d->c % 8 == 0 && d->k % 8 == 0;
}
/* Whether call d of such a convolution computes in NHWC: always (ALL: a
 * convolution outside any chain transposes its sides itself, the same
 * algorithm and bits wherever the stages cut), or only where a side is
 * given channels-last (CHAINS: one outside the chains runs NCHW as before
 * issue 67, cuDNN's own way; an A/B for models whose convolutions mostly
 * sit alone, as in AmoebaNet's cells, whose children stay plain). */
static inline bool gp_cuda_conv_call_nhwc(const gp_cuda_ctx *ctx, const gp_conv_desc *d)
{
    return gp_cuda_conv_nhwc(ctx, d) &&
           (ctx->nhwc == GP_CUDA_NHWC_ALL || d->xblk != 0 || d->yblk != 0);
}
int64_t gp_cuda_act_block(gp_device *dev, const gp_conv_desc *d, bool output);

gp_status gp_cuda_conv_fwd(gp_device *dev, const gp_conv_desc *d, const float *x,
                           const float *w, const float *b, float *y);
gp_status gp_cuda_conv_bwd_data(gp_device *dev, const gp_conv_desc *d, const float *w,
                                const float *dy, float *dx);
gp_status gp_cuda_conv_bwd_weights(gp_device *dev, const gp_conv_desc *d, const float *x,
                                   const float *dy, float *dw, float *db);
/* Convolutions on bf16 storage (backend.h's conv_*_bf16; cuda_dnn.c). */
gp_status gp_cuda_conv_fwd_bf16(gp_device *dev, const gp_conv_desc *d, const uint16_t *x,
                                const float *w, const float *b, uint16_t *y);
gp_status gp_cuda_conv_bwd_data_bf16(gp_device *dev, const gp_conv_desc *d, const float *w,
                                     const uint16_t *dy, uint16_t *dx);
gp_status gp_cuda_conv_bwd_weights_bf16(gp_device *dev, const gp_conv_desc *d,
                                        const uint16_t *x, const uint16_t *dy, float *dw,
                                        float *db);
size_t gp_cuda_pool_ws_bytes(gp_device *dev, const gp_pool_desc *d);
gp_status gp_cuda_pool_fwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                                uint16_t *y, void *ws);
gp_status gp_cuda_pool_bwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                                const uint16_t *y, const uint16_t *dy, uint16_t *dx,
                                const void *ws);
gp_status gp_cuda_pool_fwd(gp_device *dev, const gp_pool_desc *d, const float *x, float *y,
                           void *ws);
gp_status gp_cuda_pool_bwd(gp_device *dev, const gp_pool_desc *d, const float *x,
                           const float *y, const float *dy, float *dx, const void *ws);
gp_status gp_cuda_bn_fwd_train(gp_device *dev, const gp_bn_desc *d, const float *x,
                               const float *gamma, const float *beta, float *y, float *mean,
                               float *var);
gp_status gp_cuda_bn_fwd_infer(gp_device *dev, const gp_bn_desc *d, const float *x,
                               const float *gamma, const float *beta, const float *mean,
                               const float *var, float *y);
gp_status gp_cuda_bn_bwd(gp_device *dev, const gp_bn_desc *d, const float *x,
                         const float *gamma, const float *beta, const float *mean,
                         const float *var, const float *dy, float *dx, float *dgamma,
                         float *dbeta);
/* Batch norm on bf16 storage (backend.h's bn_*_bf16; cuda_dnn.c). */
gp_status gp_cuda_bn_fwd_train_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                    const float *gamma, const float *beta, uint16_t *y,
                                    float *mean, float *var);
gp_status gp_cuda_bn_fwd_infer_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                    const float *gamma, const float *beta, const float *mean,
                                    const float *var, uint16_t *y);
gp_status gp_cuda_bn_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const uint16_t *dy, uint16_t *dx, float *dgamma,
                              float *dbeta);
/* SyncBN slots (backend.h), on cuda_kernels.cu's per-channel kernels. */
gp_status gp_cuda_bn_stats(gp_device *dev, const gp_bn_desc *d, const float *x, float *mean,
                           float *var);
gp_status gp_cuda_bn_bwd_sums(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const float *dy, float *sums);
gp_status gp_cuda_bn_bwd_apply(gp_device *dev, const gp_bn_desc *d, const float *x,
                               const float *gamma, const float *beta, const float *mean,
                               const float *var, const float *dy, const float *sums,
                               double count, float *dx, const float *local, float *dgamma,
                               float *dbeta);
gp_status gp_cuda_log_softmax(gp_device *dev, const float *x, float *y, int64_t rows,
                              int64_t cols);

#endif /* GP_CUDA_IMPL_H */
