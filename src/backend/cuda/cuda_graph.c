/*
 * cuda_graph.c — convolutions through cuDNN's graph API (backend
 * descriptors), the API cuDNN 9 keeps developing: its engines include the
 * Hopper (sm90) implicit-GEMM kernels that the legacy algorithm enum of
 * cudnnFind*AlgorithmEx never reaches.  PyTorch's convolutions run on the
 * same engines (through cudnn-frontend).
 *
 * Per convolution shape, direction and pointer alignment (16 bytes, or
 * only 4 where an operand is a slice at an odd offset), the first call
 * builds the operation graph of that one convolution and its candidates:
 * cuDNN's heuristics (mode A, then the fallback list), less those whose
 * numerical notes the precision forbids (FP32: no tensor cores; never
 * inputs converted down; bf16: no reduced-precision sums, FFT or Winograd)
 * and those that compile at run time (seconds of a
 * first step for a kernel the precompiled ones match).  By default each
 * candidate whose workspace fits ws_limit runs on the call's own operands,
 * timed on the compute stream (one warm-up, then GRAPH_RUNS back to back),
 * and the fastest plan is kept where it beats the legacy API's measured
 * choice (cuda_dnn.c searches first): on an H100 the graph's engines win
 * in TF32 (sm90 tensor-core kernels), while in FP32 the legacy FFT and
 * Winograd algorithms, which its heuristics do not offer, often win.
 * Later calls only execute the kept plan (no cuDNN query in a warm step).
 * train.deterministic keeps the legacy heuristics' choice (a choice
 * between the two would rest on timings, which vary run to run), as does a
 * shape no candidate builds for; GPIPE_CUDNN_LEGACY=1 sends every
 * convolution there and GPIPE_CUDNN_GRAPH=force keeps the graph's plan
 * wherever one builds (A/Bs; test_cuda runs the forced one).  A plan that
 * fails when it runs is dropped for the legacy algorithm with a warning;
 * with channels to other processes open a shape not yet searched takes
 * the legacy algorithm (a timed search synchronizes the compute stream).
 *
 * Operands keep gpipe's layout (NCHW, KCRS for weights), in FP32, or
 * under precision bf16 as the bf16 copies cuda_dnn.c makes (tensor cores
 * allowed).  Tensor ids: 1 = x or dx, 2 = w or dw, 3 = y or dy.  Forward
 * and backward-data write (beta 0); backward-filter adds (beta 1), and its
 * search runs into a scratch dw (bf16: it writes the bf16 part, beta 0).
 */
#include "backend/cuda/cuda_impl.h"

#include <stdlib.h>
#include <string.h>

/* Candidates a search times at most (cuDNN's ranking puts the good ones
 * first; the tail is slow fallbacks). */
#define GRAPH_CANDIDATES 24

/* Set by gp_cuda_conv_graph_check alone: its test loads the plugin with
 * none of gpipe's functions to call, the debug log's included. */
static bool hook_quiet;

/* A descriptor call that must succeed: its failure is the shape's, and
 * sends it to the legacy path with the reason in the debug log. */
#define BK(call)                                                                      \
    do {                                                                              \
        cudnnStatus_t s_ = (call);                                                    \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                             \
            if (!hook_quiet)                                                          \
                GP_DEBUG("cuDNN graph: %s failed: %s", #call, cudnnGetErrorString(s_)); \
            return s_;                                                                \
        }                                                                             \
    } while (0)

static void destroy(cudnnBackendDescriptor_t *d)
{
    if (*d) cudnnBackendDestroyDescriptor(*d);
    *d = NULL;
}

/* (n, c, h, w) in NCHW strides, or channels-last (cl: NHWC, and KRSC for
 * weights) as cuda_conv.nhwc says. */
static cudnnStatus_t tensor(cudnnBackendDescriptor_t *t, int64_t uid, cudnnDataType_t dt,
                            int64_t n, int64_t c, int64_t h, int64_t w, int64_t align, bool cl)
{
    int64_t dims[4] = {n, c, h, w}, str[4] = {c * h * w, h * w, w, 1};
    if (cl) {
        str[1] = 1;
        str[2] = w * c;
        str[3] = c;
    }
    BK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, t));
    BK(cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    BK(cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    BK(cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str));
    BK(cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    BK(cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                &align));
    BK(cudnnBackendFinalize(*t));
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t conv_desc(cudnnBackendDescriptor_t *cd, const gp_conv_desc *d)
{
    int64_t nd = 2, pad[2] = {d->ph, d->pw}, str[2] = {d->sh, d->sw}, dil[2] = {1, 1};
    cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    BK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, cd));
    BK(cudnnBackendSetAttribute(*cd, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1,
                                &nd));
    BK(cudnnBackendSetAttribute(*cd, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                &ct));
    BK(cudnnBackendSetAttribute(*cd, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    BK(cudnnBackendSetAttribute(*cd, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, nd,
                                pad));
    BK(cudnnBackendSetAttribute(*cd, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, nd,
                                pad));
    BK(cudnnBackendSetAttribute(*cd, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, nd, dil));
    BK(cudnnBackendSetAttribute(*cd, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, nd,
                                str));
    BK(cudnnBackendFinalize(*cd));
    return CUDNN_STATUS_SUCCESS;
}

/* The operation of direction dir over tensors 1, 2, 3 and the convolution. */
static cudnnStatus_t operation(cudnnBackendDescriptor_t *op, int dir, bool accumulate,
                               cudnnBackendDescriptor_t t1, cudnnBackendDescriptor_t t2,
                               cudnnBackendDescriptor_t t3, cudnnBackendDescriptor_t cd)
{
    static const cudnnBackendDescriptorType_t type[3] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
    /* attributes in the order: tensor 1, 2, 3, convolution, alpha, beta */
    static const cudnnBackendAttributeName_t attr[3][6] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cudnnBackendDescriptor_t t[4] = {t1, t2, t3, cd};
    BK(cudnnBackendCreateDescriptor(type[dir], op));
    for (int i = 0; i < 4; i++)
        BK(cudnnBackendSetAttribute(*op, attr[dir][i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t[i]));
    BK(cudnnBackendSetAttribute(*op, attr[dir][4], CUDNN_TYPE_FLOAT, 1, &alpha));
    BK(cudnnBackendSetAttribute(*op, attr[dir][5], CUDNN_TYPE_FLOAT, 1, &beta));
    BK(cudnnBackendFinalize(*op));
    return CUDNN_STATUS_SUCCESS;
}

/* The one-operation graph of direction dir at alignment align. */
static cudnnStatus_t op_graph(cudnnHandle_t dnn, const cuda_conv *cv, int dir, int64_t align,
                              cudnnBackendDescriptor_t *graph)
{
    cudnnBackendDescriptor_t t1 = NULL, t2 = NULL, t3 = NULL, cd = NULL, op = NULL;
    /* bf16: the operands' bf16 copies, and backward-filter writes the
     * gradient's bf16 part (beta 0) that cuda_dnn.c adds in FP32 */
    const gp_conv_desc *d = &cv->d;
    cudnnDataType_t dt = cv->bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    cudnnStatus_t s = tensor(&t1, 1, dt, d->n, d->c, d->h, d->w, align, cv->nhwc);
    if (!s) s = tensor(&t2, 2, dt, d->k, d->c, d->kh, d->kw, align, cv->nhwc);
    if (!s) s = tensor(&t3, 3, dt, d->n, d->k, d->oh, d->ow, align, cv->nhwc);
    if (!s) s = conv_desc(&cd, d);
    if (!s) s = operation(&op, dir, dir == GP_CUDA_BWD_FILTER && !cv->bf16, t1, t2, t3, cd);
    if (!s) s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph);
    if (!s)
        s = cudnnBackendSetAttribute(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
    if (!s && dnn) /* (none: gp_cuda_conv_graph_check's, without a device) */
        s = cudnnBackendSetAttribute(*graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE,
                                     1, &dnn);
    if (!s) s = cudnnBackendFinalize(*graph);
    if (s) {
        if (!hook_quiet)
            GP_DEBUG("cuDNN graph: the operation graph did not build: %s",
                     cudnnGetErrorString(s));
        destroy(graph);
    }
    destroy(&op);
    destroy(&cd);
    destroy(&t3);
    destroy(&t2);
    destroy(&t1);
    return s;
}

void gp_cuda_graph_heuristics(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                              cudnnBackendDescriptor_t *cfg, int *n, int cap)
{
    cudnnBackendDescriptor_t heur = NULL;
    int64_t count = 0, got = 0;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) ||
        cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) ||
        cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
                                 &mode) ||
        cudnnBackendFinalize(heur) ||
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL)) {
        destroy(&heur);
        return;
    }
    if (count > cap - *n) count = cap - *n;
    for (int64_t i = 0; i < count; i++)
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[*n + i])) {
            for (int64_t j = 0; j < i; j++) destroy(&cfg[*n + j]);
            destroy(&heur);
            return;
        }
    if (count > 0 &&
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, &cfg[*n]))
        got = 0;
    for (int64_t j = got; j < count; j++) destroy(&cfg[*n + j]);
    *n += (int)got;
    destroy(&heur);
}

/* cfg's engine: its global index, and whether the precision and
 * determinism allow it. */
static bool engine_ok(gp_cuda_ctx *ctx, const cuda_conv *cv, cudnnBackendDescriptor_t cfg,
                      int64_t *index)
{
    cudnnBackendDescriptor_t eng = NULL;
    int64_t got = 0, nn = 0, nb = 0;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t behav[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    *index = -1;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) ||
        cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &got, &eng) ||
        cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn,
                                 notes) ||
        cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                 CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &nb, behav)) {
        destroy(&eng);
        return false;
    }
    (void)cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                   index);
    destroy(&eng);
    for (int64_t i = 0; i < nn && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) {
        if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
        /* bf16 promises FP32 sums of the rounded operands (cuda_dnn.c,
         * bf16_algo_ok): no reduced-precision sums, no FFT or Winograd
         * tiles that may be kept in bf16 */
        if (cv->bf16 && (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION ||
                         notes[i] == CUDNN_NUMERICAL_NOTE_FFT ||
                         notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD ||
                         notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4 ||
                         notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6 ||
                         notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13))
            return false;
        if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && !gp_cuda_conv_tensor_math(ctx, cv))
            return false;
    }
    for (int64_t i = 0; i < nb && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++)
        if (behav[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) return false;
    return true;
}

cudnnStatus_t gp_cuda_graph_plan(gp_cuda_ctx *ctx, cudnnBackendDescriptor_t cfg,
                                 cudnnBackendDescriptor_t *plan, int64_t *ws)
{
    int64_t got = 0;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan);
    if (!s)
        s = cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                     &ctx->dnn);
    if (!s)
        s = cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (!s) s = cudnnBackendFinalize(*plan);
    if (!s)
        s = cudnnBackendGetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &got, ws);
    if (s) destroy(plan);
    return s;
}

/* The variant pack of tensors 1, 2, 3 and workspace ws. */
static cudnnStatus_t varpack(const void *p1, const void *p2, const void *p3, void *ws,
                             cudnnBackendDescriptor_t *vp)
{
    void *ptr[3] = {(void *)p1, (void *)p2, (void *)p3};
    int64_t uid[3] = {1, 2, 3};
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, vp);
    if (!s)
        s = cudnnBackendSetAttribute(*vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                     CUDNN_TYPE_VOID_PTR, 3, ptr);
    if (!s)
        s = cudnnBackendSetAttribute(*vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3,
                                     uid);
    if (!s)
        s = cudnnBackendSetAttribute(*vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                     1, &ws);
    if (!s) s = cudnnBackendFinalize(*vp);
    if (s) destroy(vp);
    return s;
}

/* Run plan on tensors 1, 2, 3 with workspace ws (on the compute stream). */
static cudnnStatus_t execute(gp_cuda_ctx *ctx, cudnnBackendDescriptor_t plan, const void *p1,
                             const void *p2, const void *p3, void *ws)
{
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t s = varpack(p1, p2, p3, ws, &vp);
    if (!s) s = cudnnBackendExecute(ctx->dnn, plan, vp);
    destroy(&vp);
    return s;
}

/* Runs a search times per candidate, back to back between two events,
 * after one warm-up run. */
#define GRAPH_RUNS 3

/* The time of one run of plan, in ms (-1 where it fails): the variant
 * pack built once, so the events enclose only the executions.  A CUDA
 * error the device keeps (the stream still failing once synchronized) is
 * *sticky; a launch that failed alone only fails this candidate. */
static float time_plan(gp_cuda_ctx *ctx, cudnnBackendDescriptor_t plan, const void *p1,
                       const void *p2, const void *p3, void *ws, cudaEvent_t e0, cudaEvent_t e1,
                       cudaError_t *sticky)
{
    cudnnBackendDescriptor_t vp = NULL;
    float t = -1.0f;
    *sticky = cudaSuccess;
    cudnnStatus_t s = varpack(p1, p2, p3, ws, &vp);
    if (!s) s = cudnnBackendExecute(ctx->dnn, plan, vp);
    if (!s && cudaEventRecord(e0, ctx->compute) == cudaSuccess) {
        for (int r = 0; r < GRAPH_RUNS && !s; r++) s = cudnnBackendExecute(ctx->dnn, plan, vp);
        if (!s && cudaEventRecord(e1, ctx->compute) == cudaSuccess &&
            cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&t, e0, e1) == cudaSuccess)
            t /= GRAPH_RUNS;
        else
            t = -1.0f;
    }
    destroy(&vp);
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess && ce != cudaErrorNotReady) {
        t = -1.0f;
        *sticky = cudaStreamSynchronize(ctx->compute);
        if (*sticky == cudaSuccess) GP_DEBUG("cuDNN graph: a candidate failed: %s",
                                             cudaGetErrorString(ce));
    }
    return s ? -1.0f : t;
}

static int64_t alignment(const void *a, const void *b, const void *c)
{
    uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return u % 16 == 0 ? 16 : 4;
}

static const char *const dir_name[3] = {"forward", "backward-data", "backward-filter"};

/* Choose cv's plan for (dir, alignment ai): *plan stays NULL where none
 * builds.  p1..p3 are the call's operands; a backward-filter search adds
 * into a scratch dw instead of p2 (bf16: p2 is the gradient's bf16 part,
 * written with beta 0, scratch already). */
static gp_status choose(gp_device *dev, cuda_conv *cv, int dir, int ai, int64_t align,
                        const void *p1, const void *p2, const void *p3)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    cudnnBackendDescriptor_t graph = NULL, cfg[2 * GRAPH_CANDIDATES];
    int n = 0;
    if (op_graph(ctx->dnn, cv, dir, align, &graph)) return GP_OK;
    gp_cuda_graph_heuristics(graph, CUDNN_HEUR_MODE_A, cfg, &n, GRAPH_CANDIDATES);
    gp_cuda_graph_heuristics(graph, CUDNN_HEUR_MODE_FALLBACK, cfg, &n, 2 * GRAPH_CANDIDATES);
    size_t limit = gp_cuda_ws_limit(dev);
    /* every candidate's plan first, for the workspace the search borrows:
     * the most any plan within the limit needs (at least 1 MiB), not the
     * limit (as the legacy search, cuda_dnn.c's SEARCH_ROOM) */
    cudnnBackendDescriptor_t plans[2 * GRAPH_CANDIDATES] = {NULL};
    int64_t engs[2 * GRAPH_CANDIDATES] = {0}, wss[2 * GRAPH_CANDIDATES] = {0};
    size_t room = (size_t)1 << 20;
    for (int i = 0; i < n; i++) {
        if (!engine_ok(ctx, cv, cfg[i], &engs[i]) ||
            gp_cuda_graph_plan(ctx, cfg[i], &plans[i], &wss[i]))
            continue;
        if ((uint64_t)wss[i] > limit) destroy(&plans[i]);
        else if ((size_t)wss[i] > room) room = (size_t)wss[i];
    }
    if (room > limit) room = limit;
    /* timed, unless there is no room for a scratch dw or no events (never
     * deterministic: gp_cuda_graph_conv keeps the legacy choice then) */
    bool measure = true;
    void *sws = NULL, *sdw = NULL;
    size_t dw_bytes = (size_t)(cv->d.k * cv->d.c * cv->d.kh * cv->d.kw) * sizeof(float);
    cudaEvent_t e0 = NULL, e1 = NULL;
    gp_cuda_search_ws(dev, room, &sws, &limit, false); /* the legacy search counted it */
    /* bf16: p2 is already scratch (the gradient's bf16 part, beta 0) */
    if (dir == GP_CUDA_BWD_FILTER && !cv->bf16 &&
        gp_dev_alloc(dev, dw_bytes, GP_MEM_WORKSPACE, &sdw)) {
        gp_error_clear();
        measure = false;
    }
    if (measure && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)) {
        (void)cudaGetLastError();
        measure = false;
    }
    const void *q2 = dir == GP_CUDA_BWD_FILTER && sdw ? sdw : p2;
    cudnnBackendDescriptor_t best = NULL;
    int best_cfg = -1;
    int64_t best_ws = 0;
    float best_ms = 0;
    char log[1536];
    int at = 0;
    gp_status st = GP_OK;
    for (int i = 0; i < n; i++) {
        int64_t eng = engs[i], ws = wss[i];
        cudnnBackendDescriptor_t plan = plans[i];
        plans[i] = NULL; /* this iteration keeps or destroys it */
        if (!plan) continue;
        if ((uint64_t)ws > limit || (measure && ws > 0 && !sws)) {
            destroy(&plan);
            continue;
        }
        if (!measure) { /* no room to time them: the heuristics' first */
            best = plan;
            best_cfg = i;
            best_ws = ws;
            at += snprintf(log + at, sizeof log - (size_t)at, " engine %lld", (long long)eng);
            break;
        }
        cudaError_t sticky;
        float ms = time_plan(ctx, plan, p1, q2, p3, sws, e0, e1, &sticky);
        if (sticky != cudaSuccess) { /* the device's error, not this candidate's */
            destroy(&plan);
            st = gp_cuda_fail("CUDA", (int)sticky, cudaGetErrorString(sticky),
                              "a cuDNN graph search", __func__, __FILE__, __LINE__);
            break;
        }
        if (at < (int)sizeof log - 48)
            at += snprintf(log + at, sizeof log - (size_t)at, " %lld:%.3fms/%lldMiB",
                           (long long)eng, (double)ms, (long long)(ws >> 20));
        if (ms < 0) {
            destroy(&plan);
            continue;
        }
        if (!best || ms < best_ms) {
            destroy(&best);
            best = plan;
            best_cfg = i;
            best_ws = ws;
            best_ms = ms;
        } else {
            destroy(&plan);
        }
    }
    for (int i = 0; i < n; i++) destroy(&plans[i]); /* those after a break */
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (sws) gp_dev_free(dev, sws, limit, GP_MEM_WORKSPACE);
    if (sdw) gp_dev_free(dev, sdw, dw_bytes, GP_MEM_WORKSPACE);
    if (st != GP_OK) destroy(&best);
    if (!best) best_cfg = -1;
    for (int i = 0; i < n; i++)
        if (i != best_cfg) destroy(&cfg[i]);
    if (st != GP_OK) {
        destroy(&graph);
        return st;
    }
    const gp_conv_desc *d = &cv->d;
    float lms = cv->lms[dir];
    bool legacy_wins = best && !ctx->graph_force && lms >= 0 && (!measure || lms < best_ms);
    GP_DEBUG("device %s: conv %s n=%lld c=%lld %lldx%lld k=%lld %lldx%lld align %lld, graph API "
             "(%d candidates):%s -> %s %.3f ms (legacy algorithm %.3f ms)",
             dev->name, dir_name[dir], (long long)d->n, (long long)d->c, (long long)d->h,
             (long long)d->w, (long long)d->k, (long long)d->kh, (long long)d->kw,
             (long long)align, n, log, !best ? "none, legacy API" : legacy_wins ? "legacy API"
                                                                               : "kept",
             (double)best_ms, (double)lms);
    if (legacy_wins) destroy(&best);
    if (best) {
        /* the plan's graph and engine configuration live as long as it
         * does (cudnn-frontend keeps them so too) */
        cv->gplan[dir][ai] = best;
        cv->gkeep[dir][ai][0] = graph;
        cv->gkeep[dir][ai][1] = cfg[best_cfg];
        cv->gws[dir][ai] = (size_t)best_ws;
        dev->graph_plans++;
    } else {
        if (best_cfg >= 0) destroy(&cfg[best_cfg]);
        destroy(&graph);
    }
    return GP_OK;
}

static void drop(cuda_conv *cv, int dir, int ai)
{
    destroy(&cv->gplan[dir][ai]);
    destroy(&cv->gkeep[dir][ai][1]);
    destroy(&cv->gkeep[dir][ai][0]);
    cv->gws[dir][ai] = 0;
}

gp_status gp_cuda_graph_conv(gp_device *dev, cuda_conv *cv, int dir, const void *p1,
                             const void *p2, const void *p3, bool *done)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    *done = false;
    /* deterministic: the legacy heuristics' choice, which a run repeats (a
     * choice between the two APIs would rest on timings) */
    if (ctx->legacy_conv || ctx->deterministic) return GP_OK;
    int64_t align = alignment(p1, p2, p3);
    int ai = align == 16 ? 0 : 1;
    if (!cv->gtried[dir][ai]) {
        cv->gtried[dir][ai] = 1;
        /* A timed search synchronizes the compute stream, whose queue may
         * hold a channel's receive that waits for another process (the
         * allocator avoids the same wait): the legacy choice then. */
        if (ctx->chans_open > 0) {
            GP_DEBUG("device %s: conv %s: channels open, the legacy algorithm", dev->name,
                     dir_name[dir]);
            return GP_OK;
        }
        GP_TRY(choose(dev, cv, dir, ai, align, p1, p2, p3));
    }
    if (!cv->gplan[dir][ai]) return GP_OK;
    void *ws = NULL;
    if (cv->gws[dir][ai]) GP_TRY(gp_cuda_ws_reserve(dev, cv->gws[dir][ai], &ws));
    gp_cuda_nvtx_push(dir_name[dir]);
    cudnnStatus_t s = execute(ctx, cv->gplan[dir][ai], p1, p2, p3, ws);
    gp_cuda_nvtx_pop();
    if (s != CUDNN_STATUS_SUCCESS) {
        /* Nothing was launched: the legacy algorithm, chosen before this
         * plan, takes the shape from now on. */
        GP_WARN("device %s: cuDNN graph convolution (%s, n=%lld c=%lld %lldx%lld k=%lld) "
                "failed: %s; the legacy API takes it", dev->name, dir_name[dir],
                (long long)cv->d.n, (long long)cv->d.c, (long long)cv->d.h, (long long)cv->d.w,
                (long long)cv->d.k, cudnnGetErrorString(s));
        drop(cv, dir, ai);
        dev->graph_plans--;
        return GP_OK;
    }
    *done = true;
    return GP_OK;
}

void gp_cuda_graph_free(cuda_conv *cv)
{
    for (int dir = 0; dir < 3; dir++)
        for (int ai = 0; ai < 2; ai++) drop(cv, dir, ai);
}

/* Test hook (tests/test_cuda_graphs.c, which needs no GPU): convolution
 * d's one-operation graph of direction dir (GP_CUDA_FWD ..) on bf16 or
 * FP32 operands, channels-last (nhwc) or not, built and finalized without
 * a handle, as far as cuDNN checks descriptors without a device.  Returns
 * the cudnnStatus_t (0: it built). */
int gp_cuda_conv_graph_check(const gp_conv_desc *d, int bf16, int nhwc, int dir)
{
    cuda_conv cv = {.d = *d, .bf16 = bf16 != 0, .nhwc = nhwc != 0};
    cudnnBackendDescriptor_t graph = NULL;
    hook_quiet = true;
    cudnnStatus_t s = op_graph(NULL, &cv, dir, 16, &graph);
    destroy(&graph);
    return (int)s;
}
