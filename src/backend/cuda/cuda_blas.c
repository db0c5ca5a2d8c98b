/*
 * cuda_blas.c — FP32 and TF32 matrix products on cuBLASLt, each shape's
 * algorithm chosen once, and a linear layer's bias and relu in the
 * product's epilogue (issue 15).
 *
 * Layout.  As cuda_gemm explains, row-major C(m, n) = op(A) op(B) is the
 * column-major C^T(n, m) = op(B)^T op(A)^T, so cuBLASLt's "A" is gpipe's B
 * (transposed when B is), its "B" is gpipe's A, and its result is n x m,
 * column-major, leading dimension ldc.  A bias on every row of C is a bias
 * on every column of C^T: cuBLASLt's bias vector, one value per row of its
 * result (n of them).
 *
 * Algorithms.  Each product shape (transposes, sizes, leading dimensions,
 * operand alignment, the bias pointer's own alignment, epilogue, whether C
 * accumulates) gets one cuda_mm:
 * its descriptors and the algorithm, chosen on its first call among
 * cublasLtMatmulAlgoGetHeuristic's first LT_CANDIDATES within a workspace
 * of LT_WS_MAX (cuBLAS's recommendation for Hopper; less on a device whose
 * memory capacity allows less):
 *  - by default measured, as convolutions are (cuda_dnn.c): each candidate
 *    runs once to warm and LT_RUNS times timed on the call's own operands
 *    (a product that adds into C runs into a zeroed scratch C instead), the
 *    fastest wins (gp_algo_pick: within its slack, the leanest), and the
 *    search counts in dev->algo_searches.  It blocks the host once per shape;
 *  - with train.deterministic, or while channels to other processes are
 *    open (a timed search synchronizes the compute stream, whose queue may
 *    hold a receive that waits for another process), the heuristics' first
 *    candidate, without timing.
 * Every cuBLASLt algorithm is deterministic for a given algorithm (its
 * split-K reductions keep a fixed order: CUBLASLT_REDUCTION_SCHEME_INPLACE
 * uses counters to serialise the parts), so train.deterministic only needs
 * the choice itself to repeat.  Compute type CUBLAS_COMPUTE_32F (plain FP32
 * FMA, the results within FP32 rounding of cublasSgemm's) or, with
 * precision tf32, CUBLAS_COMPUTE_32F_FAST_TF32.  Precision bf16 keeps
 * cuda_gemm's cublasGemmEx path for FP32 tensors; a linear layer on bf16
 * storage (gp_cuda_lt_gemm_io) gives cuBLASLt its bf16 A and B as they
 * are, and its bf16 C where the result is an activation (the epilogue's
 * bias and relu in FP32, rounded once), with CUBLAS_COMPUTE_32F.
 *
 * Anything that does not work out (no handle, no descriptors, no
 * candidate, no room for the workspace, a failed launch, or
 * GPIPE_CUBLASLT=0 for an A/B) leaves *done false, and the caller runs
 * cublasSgemm and gpipe's own bias / relu kernel, which compute the same
 * thing within rounding.  A shape whose plan failed to run keeps the
 * classic call, and the error a failed launch left in the runtime is
 * cleared so that the next kernel's launch check does not report it.
 *
 * Not known without a GPU: whether cuBLASLt's relu epilogue keeps a NaN
 * (gpipe's relu does; its documentation says max(x, 0), and fmaxf(NaN, 0)
 * is 0).  So each device asks once, when it opens (gp_cuda_lt_probe_relu);
 * where it does not, linear_fwd's epilogue is CUBLASLT_EPILOGUE_BIAS and
 * the relu gpipe's kernel, so that the NaN check keeps seeing what the CPU
 * would.  test_cuda asserts that a NaN survives linear_fwd's relu either
 * way.
 *
 * Compiled, not run: written in a session without a GPU.
 */
#include "backend/cuda/cuda_impl.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LT_CANDIDATES 8
#define LT_RUNS 3
#define LT_WS_MAX ((size_t)32 << 20)

/* bits; GELU_AUX: GELU with the product (and bias) kept in the aux
 * buffer (GPT-2's MLP forward); DGELU: the product times GELU' of the aux
 * buffer's values (its backward, issue 64) */
enum { EPI_NONE = 0, EPI_BIAS = 1, EPI_RELU = 2, EPI_GELU_AUX = 4, EPI_DGELU = 8 };
#define EPI_AUX (EPI_GELU_AUX | EPI_DGELU)

struct cuda_mm {
    /* the shape */
    gp_lt_io io;
    int ta, tb, epi, align;
    /* the bias pointer's alignment (up to 256; 0 without one): the
     * heuristics read it from the descriptor's pointer, and no preference
     * caps it as MIN_ALIGNMENT_* caps A's, B's and C's, so an algorithm
     * chosen for one bias is reused only for biases aligned as well */
    int balign;
    bool acc; /* beta != 0: C is read */
    int64_t m, n, k, lda, ldb, ldc;
    /* the plan */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    size_t ws;
    bool ok; /* false: cublasSgemm takes this shape */
    struct cuda_mm *next;
};

gp_status gp_cuda_lt_init(gp_cuda_ctx *ctx)
{
    const char *e = getenv("GPIPE_CUBLASLT");
    ctx->lt_off = e && strcmp(e, "0") == 0;
    if (ctx->lt_off) return GP_OK;
    cublasStatus_t s = cublasLtCreate(&ctx->lt);
    if (s != CUBLAS_STATUS_SUCCESS) { /* every product on the classic call then */
        GP_WARN("cuda:%d: cublasLtCreate failed: %s; matrix products run on cublasSgemm",
                ctx->ordinal, cublasGetStatusString(s));
        ctx->lt = NULL;
        ctx->lt_off = true;
    }
    return GP_OK;
}

gp_status gp_cuda_lt_probe_relu(gp_device *dev)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    ctx->lt_relu = false; /* until a NaN is seen to survive */
    if (ctx->lt_off || !ctx->lt) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    /* A product of a linear layer's size (cuBLASLt picks its kernels by
     * shape: a 1 x 1 product may not run the tiles a real one does), x (P x
     * P) ones but for a NaN in row 0, w (P x P) ones, bias zeros: row 0 of
     * y must come out NaN, every other row P.  Each block 16-byte aligned. */
    enum { P = 128 };
    const int64_t nx = (int64_t)P * P, nb = P, total = 3 * nx + nb;
    float *host = malloc(sizeof *host * (size_t)total), *buf = NULL;
    if (!host) return gp_error_set(GP_ERR_OOM, "out of host memory");
    for (int64_t i = 0; i < 2 * nx; i++) host[i] = 1.0f;
    for (int64_t i = 2 * nx; i < total; i++) host[i] = 0.0f;
    host[1] = NAN;
    float *x = NULL, *w = NULL, *bias = NULL, *y = NULL;
    gp_status st = gp_dev_alloc(dev, sizeof *host * (size_t)total, GP_MEM_WORKSPACE,
                                (void **)&buf);
    bool done = false;
    if (st == GP_OK) {
        x = buf, w = buf + nx, y = buf + 2 * nx, bias = buf + 3 * nx;
        st = gp_dev_upload(dev, buf, host, total);
    }
    if (st == GP_OK)
        st = gp_cuda_lt_gemm(dev, 0, 1, P, P, P, 1.0f, x, P, w, P, 0.0f, y, P, bias, true, &done);
    if (st == GP_OK && done) st = gp_dev_download(dev, host, y, nx);
    if (st == GP_OK) st = gp_dev_synchronize(dev);
    if (buf) gp_dev_free(dev, buf, sizeof *host * (size_t)total, GP_MEM_WORKSPACE);
    bool kept = done && st == GP_OK;
    for (int64_t j = 0; kept && j < P; j++) kept = isnan(host[j]) != 0;
    float row1 = done && st == GP_OK ? host[P] : 0.0f;
    free(host);
    GP_TRY(st);
    ctx->lt_relu = kept && row1 == (float)P;
    if (done && !ctx->lt_relu)
        GP_DEBUG("device %s: cuBLASLt's relu epilogue lost a NaN (or computed %g for %d); a "
                 "linear layer's relu runs as gpipe's own kernel after the product", dev->name,
                 (double)row1, P);
    return GP_OK;
}

static void mm_free(cuda_mm *mm)
{
    if (mm->la) cublasLtMatrixLayoutDestroy(mm->la);
    if (mm->lb) cublasLtMatrixLayoutDestroy(mm->lb);
    if (mm->lc) cublasLtMatrixLayoutDestroy(mm->lc);
    if (mm->op) cublasLtMatmulDescDestroy(mm->op);
    free(mm);
}

void gp_cuda_lt_destroy(gp_cuda_ctx *ctx)
{
    while (ctx->mms) {
        cuda_mm *mm = ctx->mms;
        ctx->mms = mm->next;
        mm_free(mm);
    }
    if (ctx->lt) cublasLtDestroy(ctx->lt);
    ctx->lt = NULL;
}

static int alignment(const void *a, const void *b, const void *c, const void *bias)
{
    uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)bias;
    return u % 16 == 0 ? 16 : u % 4 == 0 ? 4 : 2; /* 2: a bf16 view at an odd element */
}

static int bias_alignment(const void *bias)
{
    uintptr_t u = (uintptr_t)bias | 256;
    return bias ? (int)(u & (~u + 1)) : 0; /* the lowest set bit */
}

/* The descriptors of mm's shape (mm->op etc. NULL on entry). */
static gp_status mm_describe(gp_cuda_ctx *ctx, cuda_mm *mm)
{
    cublasComputeType_t ct = ctx->tf32 && mm->io == GP_LT_F32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                              : CUBLAS_COMPUTE_32F;
    cudaDataType_t tab = mm->io == GP_LT_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cudaDataType_t tc = mm->io == GP_LT_ABC16 ? CUDA_R_16BF : CUDA_R_32F;
    GP_CUBLAS(cublasLtMatmulDescCreate(&mm->op, ct, CUDA_R_32F));
    cublasOperation_t oa = mm->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t ob = mm->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    GP_CUBLAS(cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
    GP_CUBLAS(cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
    cublasLtEpilogue_t ep = mm->epi == (EPI_BIAS | EPI_RELU)     ? CUBLASLT_EPILOGUE_RELU_BIAS
                            : mm->epi == EPI_BIAS               ? CUBLASLT_EPILOGUE_BIAS
                            : mm->epi == EPI_RELU               ? CUBLASLT_EPILOGUE_RELU
                            : mm->epi == (EPI_BIAS | EPI_GELU_AUX) ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                            : mm->epi == EPI_GELU_AUX           ? CUBLASLT_EPILOGUE_GELU_AUX
                            : mm->epi == EPI_DGELU              ? CUBLASLT_EPILOGUE_DGELU
                                                                : CUBLASLT_EPILOGUE_DEFAULT;
    GP_CUBLAS(cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep,
                                             sizeof ep));
    if (mm->epi & EPI_AUX) { /* the aux buffer laid out as C, of C's type (the default) */
        int64_t ald = mm->ldc;
        GP_CUBLAS(cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                 &ald, sizeof ald));
    }
    if (mm->epi & EPI_BIAS) {
        cudaDataType_t bt = CUDA_R_32F;
        GP_CUBLAS(cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                 sizeof bt));
    }
    /* cuBLASLt's A = gpipe's B: n x k column-major, or k x n transposed */
    GP_CUBLAS(cublasLtMatrixLayoutCreate(&mm->la, tab, (uint64_t)(mm->tb ? mm->k : mm->n),
                                         (uint64_t)(mm->tb ? mm->n : mm->k), mm->ldb));
    /* cuBLASLt's B = gpipe's A: k x m, or m x k transposed */
    GP_CUBLAS(cublasLtMatrixLayoutCreate(&mm->lb, tab, (uint64_t)(mm->ta ? mm->m : mm->k),
                                         (uint64_t)(mm->ta ? mm->k : mm->m), mm->lda));
    GP_CUBLAS(cublasLtMatrixLayoutCreate(&mm->lc, tc, (uint64_t)mm->n, (uint64_t)mm->m,
                                         mm->ldc));
    return GP_OK;
}

static cublasStatus_t mm_run(gp_cuda_ctx *ctx, const cuda_mm *mm, const cublasLtMatmulAlgo_t *algo,
                             float alpha, const void *a, const void *b, float beta, void *c,
                             const float *bias, const void *aux, void *ws, size_t ws_bytes)
{
    if (mm->epi & EPI_BIAS) {
        cublasStatus_t s = cublasLtMatmulDescSetAttribute(
            mm->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    if (mm->epi & EPI_AUX) {
        cublasStatus_t s = cublasLtMatmulDescSetAttribute(
            mm->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return cublasLtMatmul(ctx->lt, mm->op, &alpha, b, mm->la, a, mm->lb, &beta, c, mm->lc, c,
                          mm->lc, algo, ws, ws_bytes, ctx->compute);
}

/* A CUDA error a failed call left behind, cleared, so that the next
 * kernel's launch check does not report it; a sticky one (the context is
 * lost) is returned as the failure of `what`. */
static gp_status clear_error(gp_cuda_ctx *ctx, const char *what)
{
    cudaError_t ce = cudaGetLastError();
    if (ce == cudaSuccess || ce == cudaErrorNotReady) return GP_OK;
    cudaError_t sticky = cudaStreamSynchronize(ctx->compute);
    if (sticky == cudaSuccess) (void)cudaGetLastError();
    if (sticky != cudaSuccess)
        return gp_cuda_fail("CUDA", (int)sticky, cudaGetErrorString(sticky), what, __func__,
                            __FILE__, __LINE__);
    GP_DEBUG("cuBLASLt: %s: %s (cleared)", what, cudaGetErrorString(ce));
    return GP_OK;
}

/* The workspace cuBLASLt may use: LT_WS_MAX, less where the device's
 * workspace limit says so. */
static size_t lt_ws_max(gp_device *dev)
{
    size_t lim = gp_cuda_ws_limit(dev);
    return LT_WS_MAX < lim ? LT_WS_MAX : lim;
}

/* Choose mm's algorithm (mm->ok false where none).  A measured search
 * borrows its workspace (the most the device gives, down to 1 MiB) and
 * gives it back, as a convolution's search does; the chosen algorithm's
 * own workspace is reserved when it runs.  Unmeasured, nothing is
 * allocated. */
static gp_status mm_choose(gp_device *dev, cuda_mm *mm, float alpha, const void *a,
                           const void *b, float beta, void *c, const float *bias, const void *aux)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    bool measure = gp_cuda_may_measure(ctx);
    void *ws = NULL;
    size_t ws_bytes = lt_ws_max(dev);
    if (measure) /* counted below, once the candidates are known to differ */
        gp_cuda_search_ws(dev, ws_bytes, &ws, &ws_bytes, false);
    size_t ws_held = ws ? ws_bytes : 0;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
    int got = 0;
    gp_status st = GP_OK;
    void *sc = NULL; /* a product that adds into C is timed into a scratch C */
    const size_t ces = mm->io == GP_LT_ABC16 ? sizeof(uint16_t) : sizeof(float);
    size_t sc_bytes = mm->acc ? (size_t)((mm->m - 1) * mm->ldc + mm->n) * ces : 0;
    cudaEvent_t e0 = NULL, e1 = NULL;
    char log[768] = "";
    int at = 0;
    uint64_t wsmax = ws_bytes;
    uint32_t al = (uint32_t)mm->align;
    /* the heuristics read the bias pointer's alignment from the descriptor.
     * A refusal here, as of the descriptors (gp_cuda_lt_gemm), leaves the
     * shape without a plan: cublasSgemm takes it, the step goes on */
    cublasStatus_t ps = CUBLAS_STATUS_SUCCESS;
    if (mm->epi & EPI_BIAS)
        ps = cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof bias);
    if (ps == CUBLAS_STATUS_SUCCESS && (mm->epi & EPI_AUX))
        ps = cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                            &aux, sizeof aux);
    if (ps == CUBLAS_STATUS_SUCCESS) ps = cublasLtMatmulPreferenceCreate(&pref);
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *value;
        size_t size;
    } prefs[] = {{CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax, sizeof wsmax},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al}};
    for (size_t q = 0; q < sizeof prefs / sizeof prefs[0] && ps == CUBLAS_STATUS_SUCCESS; q++)
        ps = cublasLtMatmulPreferenceSetAttribute(pref, prefs[q].attr, prefs[q].value,
                                                  prefs[q].size);
    if (ps != CUBLAS_STATUS_SUCCESS) {
        GP_WARN("device %s: cuBLASLt preferences for a product (m=%lld n=%lld k=%lld): %s; "
                "cublasSgemm takes it", dev->name, (long long)mm->m, (long long)mm->n,
                (long long)mm->k, cublasGetStatusString(ps));
        st = clear_error(ctx, "cuBLASLt preferences");
        goto fail;
    }
    {
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(ctx->lt, mm->op, mm->la, mm->lb,
                                                           mm->lc, mm->lc, pref, LT_CANDIDATES,
                                                           res, &got);
        if (hs != CUBLAS_STATUS_SUCCESS) got = 0; /* NOT_SUPPORTED: no algorithm */
    }
    gp_algo_cand cand[LT_CANDIDATES];
    for (int i = 0; i < got; i++)
        cand[i] = (gp_algo_cand){.algo = i,
                                 .ok = res[i].state == CUBLAS_STATUS_SUCCESS &&
                                       res[i].workspaceSize <= ws_bytes,
                                 .time_ms = -1.0f,
                                 .memory = res[i].workspaceSize,
                                 .deterministic = true};
    measure = measure && got > 1;
    if (measure && mm->acc) {
        if (gp_dev_alloc(dev, sc_bytes, GP_MEM_WORKSPACE, &sc) != GP_OK) {
            gp_error_clear();
            sc = NULL;
            measure = false;
        } else if (cudaMemsetAsync(sc, 0, sc_bytes, ctx->compute) != cudaSuccess) {
            measure = false;
        }
    }
    if (measure && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess))
        measure = false;
    st = clear_error(ctx, "a cuBLASLt algorithm search");
    if (st != GP_OK) goto fail;
    if (measure) {
        dev->algo_searches++;
        void *out = sc ? sc : c;
        for (int i = 0; i < got; i++) {
            if (!cand[i].ok) continue;
            float ms = -1.0f;
            cublasStatus_t s = mm_run(ctx, mm, &res[i].algo, alpha, a, b, beta, out, bias, aux,
                                      ws, ws_bytes);
            if (s == CUBLAS_STATUS_SUCCESS && cudaEventRecord(e0, ctx->compute) == cudaSuccess) {
                for (int r = 0; r < LT_RUNS && s == CUBLAS_STATUS_SUCCESS; r++)
                    s = mm_run(ctx, mm, &res[i].algo, alpha, a, b, beta, out, bias, aux, ws,
                               ws_bytes);
                if (s == CUBLAS_STATUS_SUCCESS &&
                    cudaEventRecord(e1, ctx->compute) == cudaSuccess &&
                    cudaEventSynchronize(e1) == cudaSuccess &&
                    cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
                    ms /= LT_RUNS;
                else
                    ms = -1.0f;
            }
            /* a launch failure is this candidate's unless the context is
             * lost (sticky), which ends the search */
            st = clear_error(ctx, "a cuBLASLt algorithm search");
            if (st != GP_OK) goto fail;
            if (ms < 0) cand[i].ok = false;
            cand[i].time_ms = ms;
            if (at < (int)sizeof log - 40)
                at += snprintf(log + at, sizeof log - (size_t)at, " %d:%.3fms/%zuKiB", i,
                               (double)ms, res[i].workspaceSize >> 10);
        }
    }
    int pick = gp_algo_pick(cand, got, ws_bytes, false);
    GP_DEBUG("device %s: gemm%s %c%c m=%lld n=%lld k=%lld align %d%s%s%s (%d candidates%s):%s -> %d",
             dev->name, mm->io == GP_LT_F32 ? "" : " bf16",
             mm->ta ? 'T' : 'N', mm->tb ? 'T' : 'N', (long long)mm->m,
             (long long)mm->n, (long long)mm->k, mm->align, mm->acc ? " accumulate" : "",
             mm->epi & EPI_BIAS ? " +bias" : "", mm->epi & EPI_RELU ? " relu" : "", got,
             measure ? ", measured" : ", heuristics", log, pick);
    if (pick >= 0) {
        mm->algo = res[pick].algo;
        mm->ws = res[pick].workspaceSize;
        mm->ok = true;
    }
fail:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (sc) gp_dev_free(dev, sc, sc_bytes, GP_MEM_WORKSPACE);
    if (ws) gp_dev_free(dev, ws, ws_held, GP_MEM_WORKSPACE);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

static cuda_mm *mm_find(gp_cuda_ctx *ctx, const cuda_mm *key)
{
    for (cuda_mm *mm = ctx->mms; mm; mm = mm->next)
        if (mm->io == key->io && mm->ta == key->ta && mm->tb == key->tb && mm->epi == key->epi &&
            mm->align == key->align && mm->balign == key->balign && mm->acc == key->acc &&
            mm->m == key->m &&
            mm->n == key->n && mm->k == key->k && mm->lda == key->lda && mm->ldb == key->ldb &&
            mm->ldc == key->ldc)
            return mm;
    return NULL;
}

gp_status gp_cuda_lt_gemm(gp_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k,
                          float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                          float beta, float *c, int64_t ldc, const float *bias, bool relu,
                          bool *done)
{
    return gp_cuda_lt_gemm_io(dev, GP_LT_F32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                              ldc, bias, relu, done);
}

static gp_status lt_gemm(gp_device *dev, gp_lt_io io, int ta, int tb, int64_t m, int64_t n,
                         int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                         int64_t ldb, float beta, void *c, int64_t ldc, const float *bias, int epi,
                         const void *aux, bool *done)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    *done = false;
    if (ctx->lt_off || !ctx->lt || m <= 0 || n <= 0 || k <= 0) return GP_OK;
    if ((epi & EPI_AUX) && alignment(aux, aux, aux, NULL) < 16) return GP_OK;
    cuda_mm key = {.io = io, .ta = ta, .tb = tb,
                   .epi = (bias ? EPI_BIAS : 0) | epi,
                   .align = alignment(a, b, c, bias), .balign = bias_alignment(bias),
                   .acc = beta != 0.0f, .m = m, .n = n,
                   .k = k, .lda = lda, .ldb = ldb, .ldc = ldc};
    cuda_mm *mm = mm_find(ctx, &key);
    if (!mm) {
        mm = malloc(sizeof *mm);
        if (!mm) return gp_error_set(GP_ERR_OOM, "out of host memory");
        *mm = key;
        gp_status st = mm_describe(ctx, mm);
        if (st != GP_OK) { /* no plan: the classic call takes the shape */
            GP_WARN("device %s: cuBLASLt descriptors for a product (m=%lld n=%lld k=%lld): %s; "
                    "cublasSgemm takes it", dev->name, (long long)m, (long long)n, (long long)k,
                    gp_last_error());
            gp_error_clear();
            mm->ok = false;
        } else {
            st = mm_choose(dev, mm, alpha, a, b, beta, c, bias, aux);
            if (st != GP_OK) { /* the device's failure (a lost context) */
                mm_free(mm);
                return st;
            }
        }
        mm->next = ctx->mms;
        ctx->mms = mm;
    }
    if (!mm->ok) return GP_OK;
    void *ws = NULL;
    if (mm->ws && gp_cuda_ws_reserve(dev, mm->ws, &ws) != GP_OK) {
        /* no room for its workspace now: the classic call, this time */
        gp_error_clear();
        return GP_OK;
    }
    gp_cuda_nvtx_push("gemm");
    cublasStatus_t s = mm_run(ctx, mm, &mm->algo, alpha, a, b, beta, c, bias, aux, ws, mm->ws);
    gp_cuda_nvtx_pop();
    if (s != CUBLAS_STATUS_SUCCESS) {
        /* the classic call takes the shape from now on; a launch error
         * cuBLASLt left behind is cleared first, or the next kernel's
         * check would report it */
        GP_TRY(clear_error(ctx, "a cuBLASLt product"));
        GP_WARN("device %s: cuBLASLt product (m=%lld n=%lld k=%lld) failed: %s; cublasSgemm "
                "takes it", dev->name, (long long)m, (long long)n, (long long)k,
                cublasGetStatusString(s));
        mm->ok = false;
        return GP_OK;
    }
    *done = true;
    return GP_OK;
}

gp_status gp_cuda_lt_gemm_io(gp_device *dev, gp_lt_io io, int ta, int tb, int64_t m, int64_t n,
                             int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                             int64_t ldb, float beta, void *c, int64_t ldc, const float *bias,
                             bool relu, bool *done)
{
    return lt_gemm(dev, io, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias,
                   relu ? EPI_RELU : 0, NULL, done);
}

gp_status gp_cuda_lt_gemm_gelu(gp_device *dev, gp_lt_io io, bool backward, int ta, int tb,
                               int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                               const void *b, int64_t ldb, void *c, int64_t ldc,
                               const float *bias, const void *aux, bool *done)
{
    return lt_gemm(dev, io, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc,
                   backward ? NULL : bias, backward ? EPI_DGELU : EPI_GELU_AUX, aux, done);
}
