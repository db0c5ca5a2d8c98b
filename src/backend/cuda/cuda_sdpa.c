/*
 * cuda_sdpa.c — causal self-attention through cuDNN's fused
 * scaled-dot-product attention (the flash-attention algorithm: tiles of
 * queries and keys, an online softmax, the T x T scores never in memory),
 * forward and backward, built with cuDNN's graph API (issue 53).
 *
 * cuDNN has no single "attention" call before 9.21 for a causal mask: its
 * fused attention engines are found by matching an operation graph of
 * matrix products, pointwise operations and reductions against the
 * pattern they implement.  The graphs below are the ones cudnn-frontend
 * (1.x) lowers its sdpa() and sdpa_backward() nodes to for this case (no
 * bias, no dropout, no padding, a top-left causal mask, MHA), written with
 * the backend descriptors directly, as cuda_graph.c does for convolutions:
 *
 *   forward:  S = Q K^T * scale; S = causal(S) (row >= col, else -inf);
 *             M = rowmax S; E = exp(S - M); Z = rowsum E;
 *             Stats = M + log Z; P = E / Z (bf16); O = P V
 *   backward: D = rowsum(dO * O); S = Q K^T * scale - Stats; P = exp(causal(S));
 *             dV = P^T dO; dS = (dO V^T - D) * P * scale;
 *             dK = dS^T Q; dQ = dS K
 *
 * Stats is backend.h's lse (b, heads, t): the log-sum-exp of each row's
 * scaled scores, the saved state of both paths (but the fused forward's
 * is of bf16 q and k, so a shape takes both fused directions or none).
 * dQ is written by its product directly (cudnn-frontend's "dP workspace"
 * form, which it forces for a deterministic backward on Hopper) rather
 * than summed with atomics into an FP32 accumulator, so the backward
 * repeats bit for bit.
 *
 * When.  Precision bf16 only: cuDNN's fused attention takes FP16 or BF16
 * operands, and bf16 is the precision whose contract (operands rounded to
 * bfloat16, FP32 sums: backend.h) it keeps — the probabilities P are
 * rounded to bf16 before the second product, as every flash-attention
 * kernel does.  Hopper only (sm_90: the deterministic backward form
 * above is the frontend's for Hopper; Blackwell's needs engine knobs),
 * head size d a multiple of 8 up to 128, c a multiple of 8 (16-byte
 * aligned operands).  Otherwise, where a shape's graphs do not build (both
 * directions then go to the own kernels, so that a backward reads the
 * log-sum-exp of its own kind), its plan fails, or with GPIPE_CUDNN_SDPA=0
 * (an A/B), cuda_kernels.cu's own kernels compute it, in FP32.
 *
 * Layout.  x (b, t, 3c) holds q, k, v side by side; its bf16 copy is Q,
 * K, V at offsets 0, c, 2c, as 4-D (b, heads, t, d) tensors with strides
 * (3ct, d, 3c, 1) — no transposes copied.  O, dO are (b, t, c) the same
 * way; dQ, dK, dV are written into a (b, t, 3c) bf16 buffer that is then
 * widened into dx.  The FP32 operands are rounded into gp_cuda_bf16_reserve's
 * buffer first and the results widened after (one pass each), as
 * convolutions under bf16 do (cuda_dnn.c).
 *
 * Plans are built once per (b, t, heads, c) and direction and kept on the
 * context: the heuristics' first engine configuration that finalizes with
 * a workspace under gp_cuda_ws_limit (no timed search: the fused engines
 * are few, and the first is cuDNN's pick).  dev->attn_fused counts the
 * calls a fused plan ran.
 *
 * Compiled, not run: written in a session without a GPU (test_cuda's
 * test_bf16_ops checks it against the CPU's FP32 attention, that it ran,
 * and that the backward repeats bit for bit).
 */
#include "backend/cuda/cuda_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A graph's descriptors: tensors, operation-level descriptors (pointwise,
 * matmul, reduction) and operations, each destroyed with the graph (the
 * backward makes 69: 30 tensors, 18 operations of two descriptors and 3
 * reshapes). */
#define SG_MAX 128

typedef struct sdpa_graph {
    cudnnBackendDescriptor_t d[SG_MAX]; /* every descriptor made, in order */
    int nd;
    cudnnBackendDescriptor_t op[SG_MAX / 2]; /* the operations, in order */
    int nop;
    int64_t next_uid;  /* virtual tensors' ids */
    cudnnStatus_t s;   /* the first failure (later calls do nothing) */
    const char *what;  /* which call failed */
} sdpa_graph;

/* Tensor ids of the variant packs. */
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_DSUM,
    U_SCALE = 20, U_NEGINF, U_ONE,
    U_VIRTUAL = 100
};

#define SG(g, call)                                                             \
    do {                                                                        \
        if ((g)->s == CUDNN_STATUS_SUCCESS) {                                   \
            (g)->s = (call);                                                    \
            if ((g)->s != CUDNN_STATUS_SUCCESS) (g)->what = #call;              \
        }                                                                       \
    } while (0)

static cudnnBackendDescriptor_t sg_new(sdpa_graph *g, cudnnBackendDescriptorType_t type)
{
    cudnnBackendDescriptor_t d = NULL;
    if (g->s != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->nd == SG_MAX) {
        g->s = CUDNN_STATUS_INTERNAL_ERROR;
        g->what = "too many descriptors";
        return NULL;
    }
    SG(g, cudnnBackendCreateDescriptor(type, &d));
    if (g->s != CUDNN_STATUS_SUCCESS) return NULL;
    g->d[g->nd++] = d;
    return d;
}

static void sg_free(sdpa_graph *g)
{
    for (int i = g->nd - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->d[i]);
    g->nd = g->nop = 0;
}

/* A 4-D tensor: uid 0 makes a virtual one with the next virtual id. */
static cudnnBackendDescriptor_t sg_tensor(sdpa_graph *g, int64_t uid, cudnnDataType_t dt,
                                          const int64_t dim[4], const int64_t str[4],
                                          bool by_value)
{
    cudnnBackendDescriptor_t t = sg_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bool virt = uid == 0;
    int64_t id = virt ? g->next_uid++ : uid, align = 16;
    SG(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    SG(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim));
    SG(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str));
    SG(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id));
    SG(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                   &align));
    SG(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt));
    if (by_value)
        SG(g, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1,
                                       &by_value));
    SG(g, cudnnBackendFinalize(t));
    return t;
}

/* d's descriptor attribute `attr` = v (an operand, the operation's own
 * descriptor). */
static void sg_link(sdpa_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                    cudnnBackendDescriptor_t v)
{
    SG(g, cudnnBackendSetAttribute(d, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v));
}

static void sg_op(sdpa_graph *g, cudnnBackendDescriptor_t op)
{
    SG(g, cudnnBackendFinalize(op));
    if (g->s != CUDNN_STATUS_SUCCESS) return;
    if (g->nop == SG_MAX / 2) {
        g->s = CUDNN_STATUS_INTERNAL_ERROR;
        g->what = "too many operations";
        return;
    }
    g->op[g->nop++] = op;
}

/* y = mode(x[, b[, t]]) computed in `prec`; axis for GEN_INDEX (else < 0). */
static void sg_pw(sdpa_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                  cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis)
{
    cudnnBackendDescriptor_t pw = sg_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    SG(g, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1,
                                   &mode));
    SG(g, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1,
                                   &prec));
    if (axis >= 0)
        SG(g, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    SG(g, cudnnBackendFinalize(pw));
    cudnnBackendDescriptor_t op = sg_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    sg_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    sg_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b)
        sg_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t)
        sg_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    sg_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    sg_op(g, op);
}

/* c = a b over the last two axes (batched over the first two), FP32 sums. */
static void sg_matmul(sdpa_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t c)
{
    cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = sg_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    SG(g, cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct));
    SG(g, cudnnBackendFinalize(mm));
    cudnnBackendDescriptor_t op = sg_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    sg_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    sg_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    sg_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    sg_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    sg_op(g, op);
}

/* y = reduce(x) over the axes where y has extent 1, in FP32. */
static void sg_reduce(sdpa_graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y)
{
    cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = sg_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    SG(g, cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_OPERATOR,
                                   CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
    SG(g, cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                   &ct));
    SG(g, cudnnBackendFinalize(rd));
    cudnnBackendDescriptor_t op = sg_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    sg_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    sg_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    sg_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    sg_op(g, op);
}

/* y = x viewed with y's dimensions and strides (a transpose, no copy). */
static void sg_reshape(sdpa_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = sg_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    sg_link(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    sg_link(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    sg_op(g, op);
}

/* The shapes of one attention call: 4-D dimensions and strides. */
typedef struct sdpa_shape {
    int64_t qkv_dim[4], qkv_str[4]; /* Q, V, dQ, dK, dV in the (b, t, 3c) buffer */
    int64_t kt_dim[4], kt_str[4];   /* K^T (and V^T) in the same buffer */
    int64_t o_dim[4], o_str[4];     /* O, dO (b, t, c) */
    int64_t dd_str[4];              /* dO * O (virtual) */
    int64_t s_dim[4], s_str[4];     /* scores (b, heads, t, t) */
    int64_t st_str[4];              /* the scores transposed */
    int64_t r_dim[4], r_str[4];     /* per-row values (b, heads, t, 1): Stats, D, max, sum */
    int64_t one[4];                 /* a scalar's dimensions and strides */
} sdpa_shape;

static void shape_of(sdpa_shape *h, int64_t b, int64_t t, int64_t heads, int64_t c)
{
    int64_t d = c / heads;
    int64_t qd[4] = {b, heads, t, d}, qs[4] = {t * 3 * c, d, 3 * c, 1};
    int64_t kd[4] = {b, heads, d, t}, ks[4] = {t * 3 * c, d, 1, 3 * c};
    int64_t os[4] = {t * c, d, c, 1}, dds[4] = {heads * t * d, t * d, heads * d, 1};
    int64_t sd[4] = {b, heads, t, t}, ss[4] = {heads * t * t, t * t, t, 1};
    int64_t sts[4] = {heads * t * t, t * t, 1, t};
    int64_t rd[4] = {b, heads, t, 1}, rs[4] = {heads * t, t, 1, 1};
    for (int i = 0; i < 4; i++) {
        h->qkv_dim[i] = qd[i];
        h->qkv_str[i] = qs[i];
        h->kt_dim[i] = kd[i];
        h->kt_str[i] = ks[i];
        h->o_dim[i] = qd[i];
        h->o_str[i] = os[i];
        h->dd_str[i] = dds[i];
        h->s_dim[i] = sd[i];
        h->s_str[i] = ss[i];
        h->st_str[i] = sts[i];
        h->r_dim[i] = rd[i];
        h->r_str[i] = rs[i];
        h->one[i] = 1;
    }
}

#define F32 CUDNN_DATA_FLOAT
#define BF16 CUDNN_DATA_BFLOAT16

/* The causal mask on scores s: row >= col keeps, else -inf (the scalar
 * tensor neginf); returns the masked scores. */
static cudnnBackendDescriptor_t sg_causal(sdpa_graph *g, const sdpa_shape *h,
                                          cudnnBackendDescriptor_t s,
                                          cudnnBackendDescriptor_t neginf)
{
    cudnnBackendDescriptor_t row = sg_tensor(g, 0, CUDNN_DATA_INT32, h->s_dim, h->s_str, false);
    cudnnBackendDescriptor_t col = sg_tensor(g, 0, CUDNN_DATA_INT32, h->s_dim, h->s_str, false);
    cudnnBackendDescriptor_t keep = sg_tensor(g, 0, CUDNN_DATA_BOOLEAN, h->s_dim, h->s_str, false);
    cudnnBackendDescriptor_t out = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_GEN_INDEX, F32, s, NULL, NULL, row, 2);
    sg_pw(g, CUDNN_POINTWISE_GEN_INDEX, F32, s, NULL, NULL, col, 3);
    sg_pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    sg_pw(g, CUDNN_POINTWISE_BINARY_SELECT, F32, s, neginf, keep, out, -1);
    return out;
}

/* The forward graph (see the top of the file). */
static void build_fwd(sdpa_graph *g, const sdpa_shape *h)
{
    cudnnBackendDescriptor_t q = sg_tensor(g, U_Q, BF16, h->qkv_dim, h->qkv_str, false);
    cudnnBackendDescriptor_t kt = sg_tensor(g, U_K, BF16, h->kt_dim, h->kt_str, false);
    cudnnBackendDescriptor_t v = sg_tensor(g, U_V, BF16, h->qkv_dim, h->qkv_str, false);
    cudnnBackendDescriptor_t o = sg_tensor(g, U_O, BF16, h->o_dim, h->o_str, false);
    cudnnBackendDescriptor_t stats = sg_tensor(g, U_STATS, F32, h->r_dim, h->r_str, false);
    cudnnBackendDescriptor_t scale = sg_tensor(g, U_SCALE, F32, h->one, h->one, true);
    cudnnBackendDescriptor_t neginf = sg_tensor(g, U_NEGINF, F32, h->one, h->one, true);

    cudnnBackendDescriptor_t s0 = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_matmul(g, q, kt, s0);
    cudnnBackendDescriptor_t s1 = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_MUL, F32, s0, scale, NULL, s1, -1);
    cudnnBackendDescriptor_t s2 = sg_causal(g, h, s1, neginf);
    cudnnBackendDescriptor_t m = sg_tensor(g, 0, F32, h->r_dim, h->r_str, false);
    sg_reduce(g, CUDNN_REDUCE_TENSOR_MAX, s2, m);
    cudnnBackendDescriptor_t s3 = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_SUB, F32, s2, m, NULL, s3, -1);
    cudnnBackendDescriptor_t e = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_EXP, F32, s3, NULL, NULL, e, -1);
    cudnnBackendDescriptor_t z = sg_tensor(g, 0, F32, h->r_dim, h->r_str, false);
    sg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    cudnnBackendDescriptor_t lz = sg_tensor(g, 0, F32, h->r_dim, h->r_str, false);
    sg_pw(g, CUDNN_POINTWISE_LOG, F32, z, NULL, NULL, lz, -1);
    sg_pw(g, CUDNN_POINTWISE_ADD, F32, m, lz, NULL, stats, -1);
    /* the probabilities in the operands' type: the second product's A */
    cudnnBackendDescriptor_t p = sg_tensor(g, 0, BF16, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_DIV, F32, e, z, NULL, p, -1);
    sg_matmul(g, p, v, o);
}

/* The backward graph (see the top of the file). */
static void build_bwd(sdpa_graph *g, const sdpa_shape *h)
{
    cudnnBackendDescriptor_t q = sg_tensor(g, U_Q, BF16, h->qkv_dim, h->qkv_str, false);
    cudnnBackendDescriptor_t kt = sg_tensor(g, U_K, BF16, h->kt_dim, h->kt_str, false);
    cudnnBackendDescriptor_t vt = sg_tensor(g, U_V, BF16, h->kt_dim, h->kt_str, false);
    cudnnBackendDescriptor_t o = sg_tensor(g, U_O, BF16, h->o_dim, h->o_str, false);
    cudnnBackendDescriptor_t dout = sg_tensor(g, U_DO, BF16, h->o_dim, h->o_str, false);
    cudnnBackendDescriptor_t stats = sg_tensor(g, U_STATS, F32, h->r_dim, h->r_str, false);
    cudnnBackendDescriptor_t dq = sg_tensor(g, U_DQ, BF16, h->qkv_dim, h->qkv_str, false);
    cudnnBackendDescriptor_t dk = sg_tensor(g, U_DK, BF16, h->qkv_dim, h->qkv_str, false);
    cudnnBackendDescriptor_t dv = sg_tensor(g, U_DV, BF16, h->qkv_dim, h->qkv_str, false);
    cudnnBackendDescriptor_t dsum = sg_tensor(g, U_DSUM, F32, h->r_dim, h->r_str, false);
    cudnnBackendDescriptor_t scale = sg_tensor(g, U_SCALE, F32, h->one, h->one, true);
    cudnnBackendDescriptor_t neginf = sg_tensor(g, U_NEGINF, F32, h->one, h->one, true);
    cudnnBackendDescriptor_t one = sg_tensor(g, U_ONE, F32, h->one, h->one, true);

    /* D = rowsum(dO * O), kept (non-virtual) for the kernel's passes; the
     * product's (virtual) strides are cudnn-frontend's */
    cudnnBackendDescriptor_t dd = sg_tensor(g, 0, F32, h->o_dim, h->dd_str, false);
    sg_pw(g, CUDNN_POINTWISE_MUL, F32, dout, o, NULL, dd, -1);
    cudnnBackendDescriptor_t dr = sg_tensor(g, 0, F32, h->r_dim, h->r_str, false);
    sg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dd, dr);
    sg_pw(g, CUDNN_POINTWISE_MUL, F32, dr, one, NULL, dsum, -1);
    /* P = exp(causal(Q K^T * scale - Stats)) */
    cudnnBackendDescriptor_t s0 = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_matmul(g, q, kt, s0);
    cudnnBackendDescriptor_t s1 = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_MUL, F32, s0, scale, NULL, s1, -1);
    cudnnBackendDescriptor_t s2 = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_SUB, F32, s1, stats, NULL, s2, -1);
    cudnnBackendDescriptor_t s3 = sg_causal(g, h, s2, neginf);
    cudnnBackendDescriptor_t p = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_EXP, F32, s3, NULL, NULL, p, -1);
    /* dV = P^T dO */
    cudnnBackendDescriptor_t pt = sg_tensor(g, 0, BF16, h->s_dim, h->st_str, false);
    sg_reshape(g, p, pt);
    sg_matmul(g, pt, dout, dv);
    /* dS = (dO V^T - D) * P * scale */
    cudnnBackendDescriptor_t dp = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_matmul(g, dout, vt, dp);
    cudnnBackendDescriptor_t d1 = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_SUB, F32, dp, dsum, NULL, d1, -1);
    cudnnBackendDescriptor_t d2 = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_MUL, F32, d1, p, NULL, d2, -1);
    cudnnBackendDescriptor_t ds = sg_tensor(g, 0, F32, h->s_dim, h->s_str, false);
    sg_pw(g, CUDNN_POINTWISE_MUL, F32, d2, scale, NULL, ds, -1);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = sg_tensor(g, 0, BF16, h->s_dim, h->st_str, false);
    sg_reshape(g, ds, dst);
    sg_matmul(g, dst, q, dk);
    /* dQ = dS K, written directly (the deterministic form) */
    cudnnBackendDescriptor_t k = sg_tensor(g, 0, BF16, h->qkv_dim, h->qkv_str, false);
    sg_reshape(g, kt, k);
    sg_matmul(g, ds, k, dq);
}

/* Test hook (tests/test_cuda_graphs.c, which needs no GPU): shape (b, t,
 * heads, c)'s graph of direction dir (0 forward, 1 backward) built and its
 * operation graph finalized without a handle, as far as cuDNN checks
 * without a device; *n_ops its operations, *n_desc its descriptors, and the
 * first failing call in why.  Returns the cudnnStatus_t (0: it built). */
int gp_cuda_sdpa_graph_check(int64_t b, int64_t t, int64_t heads, int64_t c, int dir,
                             int *n_ops, int *n_desc, char *why, size_t len)
{
    sdpa_graph g = {.next_uid = U_VIRTUAL};
    sdpa_shape h;
    shape_of(&h, b, t, heads, c);
    if (dir == 0)
        build_fwd(&g, &h);
    else
        build_bwd(&g, &h);
    *n_ops = g.nop;
    *n_desc = g.nd;
    cudnnBackendDescriptor_t graph = NULL;
    if (g.s == CUDNN_STATUS_SUCCESS) {
        cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
                                                       &graph);
        if (!s)
            s = cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nop, g.op);
        if (!s) s = cudnnBackendFinalize(graph);
        if (s) {
            g.s = s;
            g.what = "the operation graph";
        }
    }
    if (why && len) snprintf(why, len, "%s", g.s ? g.what : "");
    if (graph) cudnnBackendDestroyDescriptor(graph);
    sg_free(&g);
    return (int)g.s;
}

/* One direction's plan for one shape. */
typedef struct sdpa_plan {
    cudnnBackendDescriptor_t plan, graph, cfg; /* plan keeps graph and cfg alive */
    int64_t ws;
} sdpa_plan;

/* One shape's plans: both directions or neither (sdpa_find), so that the
 * log-sum-exp a forward saves is always read by a backward of the same
 * kind (the fused forward's comes from bf16 q and k). */
typedef struct cuda_sdpa {
    int64_t b, t, heads, c;
    sdpa_plan dir[2]; /* forward, backward */
    bool tried;       /* built, or failed to: not tried again */
    struct cuda_sdpa *next;
} cuda_sdpa;

static void plan_free(sdpa_plan *p)
{
    if (p->plan) cudnnBackendDestroyDescriptor(p->plan);
    if (p->cfg) cudnnBackendDestroyDescriptor(p->cfg);
    if (p->graph) cudnnBackendDestroyDescriptor(p->graph);
    p->plan = p->cfg = p->graph = NULL;
}

void gp_cuda_sdpa_destroy(gp_cuda_ctx *ctx)
{
    while (ctx->sdpas) {
        cuda_sdpa *a = ctx->sdpas;
        ctx->sdpas = a->next;
        plan_free(&a->dir[0]);
        plan_free(&a->dir[1]);
        free(a);
    }
}

static const char *const dir_name[2] = {"forward", "backward"};

#define SDPA_CANDIDATES 8

/* Build direction dir's plan for shape a into a->dir[dir] (left NULL
 * where none builds; the reason in the debug log, once). */
static void sdpa_build(gp_device *dev, cuda_sdpa *a, int dir)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    sdpa_plan *p = &a->dir[dir];
    sdpa_graph g = {.next_uid = U_VIRTUAL};
    sdpa_shape h;
    shape_of(&h, a->b, a->t, a->heads, a->c);
    if (dir == 0)
        build_fwd(&g, &h);
    else
        build_bwd(&g, &h);
    cudnnBackendDescriptor_t graph = NULL, cfg[2 * SDPA_CANDIDATES];
    int n = 0;
    if (g.s == CUDNN_STATUS_SUCCESS) {
        cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
                                                       &graph);
        if (!s)
            s = cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nop, g.op);
        if (!s)
            s = cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                         CUDNN_TYPE_HANDLE, 1, &ctx->dnn);
        if (!s) s = cudnnBackendFinalize(graph);
        if (s) {
            g.s = s;
            g.what = "the operation graph";
        }
    }
    if (g.s == CUDNN_STATUS_SUCCESS) {
        gp_cuda_graph_heuristics(graph, CUDNN_HEUR_MODE_A, cfg, &n, SDPA_CANDIDATES);
        gp_cuda_graph_heuristics(graph, CUDNN_HEUR_MODE_FALLBACK, cfg, &n, 2 * SDPA_CANDIDATES);
    }
    size_t limit = gp_cuda_ws_limit(dev);
    int chosen = -1;
    for (int i = 0; i < n && chosen < 0; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        int64_t ws = 0;
        if (gp_cuda_graph_plan(ctx, cfg[i], &plan, &ws) != CUDNN_STATUS_SUCCESS) continue;
        if ((uint64_t)ws <= limit) {
            p->plan = plan;
            p->ws = ws;
            chosen = i;
        } else {
            cudnnBackendDestroyDescriptor(plan);
        }
    }
    for (int i = 0; i < n; i++)
        if (i != chosen) cudnnBackendDestroyDescriptor(cfg[i]);
    sg_free(&g); /* the finalized graph holds what it needs of them */
    if (chosen >= 0) {
        p->graph = graph;
        p->cfg = cfg[chosen];
        GP_DEBUG("device %s: attention %s b=%lld t=%lld heads=%lld c=%lld: cuDNN fused SDPA, "
                 "workspace %lld MiB", dev->name, dir_name[dir], (long long)a->b,
                 (long long)a->t, (long long)a->heads, (long long)a->c,
                 (long long)(p->ws >> 20));
    } else {
        if (graph) cudnnBackendDestroyDescriptor(graph);
        GP_WARN("device %s: cuDNN's fused attention (%s, b=%lld t=%lld heads=%lld c=%lld) did "
                "not build (%s%s%s; %d engine configurations); gpipe's own kernels take this "
                "shape, both directions",
                dev->name, dir_name[dir], (long long)a->b, (long long)a->t,
                (long long)a->heads, (long long)a->c,
                g.s ? cudnnGetErrorString(g.s) : "no plan within the workspace limit",
                g.s ? " at " : "", g.s ? g.what : "", n);
    }
}

/* Whether the fused path may take (t, heads, c) on this device: Hopper
 * only (sm_90), where cudnn-frontend's deterministic backward is the dQ
 * form built here; on Blackwell it needs engine knobs this file does not
 * set, so a repeatable backward is not known there. */
static bool sdpa_allowed(gp_cuda_ctx *ctx, int64_t heads, int64_t c)
{
    if (!ctx->bf16 || ctx->sdpa_off || ctx->sm / 10 != 9 || heads <= 0 || c % heads)
        return false;
    int64_t d = c / heads;
    return d % 8 == 0 && d <= 128 && c % 8 == 0;
}

/* Scratch the fused path needs and cannot get (`call` failed): the own
 * kernel, which needs none, takes this call (*done stays false). */
#define SCRATCH(call)                                                            \
    do {                                                                         \
        if ((call) != GP_OK) {                                                   \
            GP_DEBUG("cuDNN fused attention: no room for its scratch (%s); the own " \
                     "kernel takes this call", gp_last_error());                 \
            gp_error_clear();                                                    \
            return GP_OK;                                                        \
        }                                                                        \
    } while (0)

/* Shape (b, t, heads, c)'s plans, built on its first call in either
 * direction: NULL unless both build. */
static cuda_sdpa *sdpa_find(gp_device *dev, int64_t b, int64_t t, int64_t heads, int64_t c)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    cuda_sdpa *a = ctx->sdpas;
    while (a && !(a->b == b && a->t == t && a->heads == heads && a->c == c)) a = a->next;
    if (!a) {
        a = calloc(1, sizeof *a);
        if (!a) return NULL; /* no memory for a cache entry: the own kernel */
        a->b = b;
        a->t = t;
        a->heads = heads;
        a->c = c;
        a->next = ctx->sdpas;
        ctx->sdpas = a;
    }
    if (!a->tried) {
        a->tried = true;
        sdpa_build(dev, a, 0);
        if (a->dir[0].plan) sdpa_build(dev, a, 1);
        if (!a->dir[1].plan) plan_free(&a->dir[0]);
    }
    return a->dir[0].plan && a->dir[1].plan ? a : NULL;
}

/* Run plan with the (uid, pointer) pairs; a failure drops both of the
 * shape's plans (the own kernels take it from then on; a backward that
 * fails after a fused forward is the one call that mixes them) and says
 * *done false. */
static gp_status sdpa_run(gp_device *dev, cuda_sdpa *a, int dir, const int64_t *uid,
                          void *const *ptr, int n, bool *done)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    sdpa_plan *p = &a->dir[dir];
    void *ws = NULL;
    if (p->ws) SCRATCH(gp_cuda_ws_reserve(dev, (size_t)p->ws, &ws));
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (!s)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                     CUDNN_TYPE_VOID_PTR, n, ptr);
    if (!s)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                     uid);
    if (!s)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                     1, &ws);
    if (!s) s = cudnnBackendFinalize(vp);
    gp_cuda_nvtx_push(dir == 0 ? "sdpa forward" : "sdpa backward");
    if (!s) s = cudnnBackendExecute(ctx->dnn, p->plan, vp);
    gp_cuda_nvtx_pop();
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (s != CUDNN_STATUS_SUCCESS) {
        GP_WARN("device %s: cuDNN's fused attention (%s, b=%lld t=%lld) failed: %s; gpipe's own "
                "kernels take this shape", dev->name, dir_name[dir], (long long)a->b,
                (long long)a->t, cudnnGetErrorString(s));
        plan_free(&a->dir[0]);
        plan_free(&a->dir[1]);
        (void)cudaGetLastError(); /* a failed launch's error is this call's, not the next's */
        *done = false;
        return GP_OK;
    }
    dev->attn_fused++;
    *done = true;
    return GP_OK;
}

/* The forward on bf16 operands: xb (b, t, 3c) -> ob (b, t, c) and stats. */
static gp_status fwd_run(gp_device *dev, cuda_sdpa *a, const uint16_t *xb, uint16_t *ob,
                         float *stats, int64_t heads, int64_t c, bool *done)
{
    float scale = 1.0f / sqrtf((float)(c / heads)), neginf = -INFINITY;
    int64_t uid[7] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF};
    void *ptr[7] = {(void *)xb, (void *)(xb + c), (void *)(xb + 2 * c), ob, stats, &scale,
                    &neginf};
    return sdpa_run(dev, a, 0, uid, ptr, 7, done);
}

/* The backward on bf16 operands into dxb (b, t, 3c); dsum: b heads t
 * floats of scratch. */
static gp_status bwd_run(gp_device *dev, cuda_sdpa *a, const uint16_t *xb, const uint16_t *ob,
                         const float *lse, const uint16_t *dob, uint16_t *dxb, float *dsum,
                         int64_t heads, int64_t c, bool *done)
{
    float scale = 1.0f / sqrtf((float)(c / heads)), neginf = -INFINITY, one = 1.0f;
    int64_t uid[13] = {U_Q, U_K, U_V, U_O, U_DO, U_STATS, U_DQ, U_DK, U_DV, U_DSUM,
                       U_SCALE, U_NEGINF, U_ONE};
    void *ptr[13] = {(void *)xb, (void *)(xb + c), (void *)(xb + 2 * c), (void *)ob,
                     (void *)dob, (void *)lse, dxb, dxb + c, dxb + 2 * c, dsum, &scale, &neginf,
                     &one};
    return sdpa_run(dev, a, 1, uid, ptr, 13, done);
}

gp_status gp_cuda_sdpa_fwd(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                           int64_t t, int64_t heads, int64_t c, bool *done)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    *done = false;
    if (!sdpa_allowed(ctx, heads, c)) return GP_OK;
    cuda_sdpa *a = sdpa_find(dev, b, t, heads, c);
    if (!a) return GP_OK;
    /* parts: x's bf16 copy, O, and Stats where the caller keeps none
     * (evaluation: 2 halves per float) */
    int64_t cnt[3] = {b * t * 3 * c, b * t * c, lse ? 1 : 2 * b * heads * t};
    uint16_t *part[3];
    SCRATCH(gp_cuda_bf16_reserve(dev, cnt, 3, part));
    GP_CUDA(gp_cuk_bf16_pack(ctx->compute, part[0], x, cnt[0]));
    GP_TRY(fwd_run(dev, a, part[0], part[1], lse ? lse : (float *)part[2], heads, c, done));
    if (*done) GP_CUDA(gp_cuk_bf16_unpack(ctx->compute, y, part[1], cnt[1]));
    return GP_OK;
}

gp_status gp_cuda_sdpa_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                           const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                           int64_t c, bool *done)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    *done = false;
    if (!sdpa_allowed(ctx, heads, c)) return GP_OK;
    cuda_sdpa *a = sdpa_find(dev, b, t, heads, c);
    if (!a) return GP_OK;
    /* parts: x, O, dO in bf16, dQ dK dV in bf16, and D (FP32) */
    int64_t cnt[5] = {b * t * 3 * c, b * t * c, b * t * c, b * t * 3 * c, 2 * b * heads * t};
    uint16_t *part[5];
    SCRATCH(gp_cuda_bf16_reserve(dev, cnt, 5, part));
    GP_CUDA(gp_cuk_bf16_pack(ctx->compute, part[0], x, cnt[0]));
    GP_CUDA(gp_cuk_bf16_pack(ctx->compute, part[1], y, cnt[1]));
    GP_CUDA(gp_cuk_bf16_pack(ctx->compute, part[2], dy, cnt[2]));
    GP_TRY(bwd_run(dev, a, part[0], part[1], lse, part[2], part[3], (float *)part[4], heads, c,
                   done));
    if (*done) GP_CUDA(gp_cuk_bf16_unpack(ctx->compute, dx, part[3], cnt[3]));
    return GP_OK;
}

gp_status gp_cuda_sdpa_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                                int64_t b, int64_t t, int64_t heads, int64_t c, bool *done)
{
    *done = false;
    if (!sdpa_allowed(gp_cuda_ctx_of(dev), heads, c)) return GP_OK;
    cuda_sdpa *a = sdpa_find(dev, b, t, heads, c);
    if (!a) return GP_OK;
    uint16_t *stats = NULL; /* where the caller keeps none (evaluation) */
    int64_t cnt = 2 * b * heads * t;
    if (!lse) SCRATCH(gp_cuda_bf16_reserve(dev, &cnt, 1, &stats));
    return fwd_run(dev, a, x, y, lse ? lse : (float *)stats, heads, c, done);
}

gp_status gp_cuda_sdpa_bwd_bf16(gp_device *dev, const uint16_t *x, const uint16_t *y,
                                const float *lse, const uint16_t *dy, uint16_t *dx, int64_t b,
                                int64_t t, int64_t heads, int64_t c, bool *done)
{
    *done = false;
    if (!sdpa_allowed(gp_cuda_ctx_of(dev), heads, c)) return GP_OK;
    cuda_sdpa *a = sdpa_find(dev, b, t, heads, c);
    if (!a) return GP_OK;
    uint16_t *dsum;
    int64_t cnt = 2 * b * heads * t;
    SCRATCH(gp_cuda_bf16_reserve(dev, &cnt, 1, &dsum));
    return bwd_run(dev, a, x, y, lse, dy, dx, (float *)dsum, heads, c, done);
}
