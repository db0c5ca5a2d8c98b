/*
 * elementwise.h — the per-element (and per-row) arithmetic of the simple
 * device ops, as static inline functions over plain scalars and pointers.
 *
 * Every backend runs its own loop (OpenMP on the CPU, one thread per element
 * or per row in CUDA kernels) around these bodies, so all backends share the
 * exact same float arithmetic, operation for operation.  Nothing here may
 * touch a global, allocate, or call a library function other than <math.h>;
 * compiled by nvcc (__CUDACC__) GP_EW_FN becomes
 * `__host__ __device__ static inline`, so the CUDA kernels
 * (backend/cuda/cuda_kernels.cu) call these very functions, and
 * tests/test_elementwise.c checks their arithmetic on the CPU.
 *
 * Ownership: none; callers own every pointer passed in.
 */
#ifndef GP_ELEMENTWISE_H
#define GP_ELEMENTWISE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifndef GP_EW_FN
#ifdef __CUDACC__
#define GP_EW_FN __host__ __device__ static inline
#else
#define GP_EW_FN static inline
#endif
#endif

/* ---- activations and products ----------------------------------------- */

/* NaN stays NaN, as in PyTorch: a NaN must not hide behind a ReLU (x <= 0
 * is false for a NaN, so it passes).  One comparison selecting x or 0,
 * which vectorises; the earlier x > 0 || x != x ran scalar, branching. */
GP_EW_FN float gp_ew_relu(float x) { return x <= 0.0f ? 0.0f : x; }

/* dx = dy * (y > 0), y being relu's output. */
GP_EW_FN float gp_ew_relu_bwd(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

/* Leaky ReLU with slope >= 0.  A NaN stays NaN, as in relu: a NaN must not
 * hide behind an activation (it takes the slope * x side, NaN).  -inf gives
 * slope * -inf as the formula does: NaN for slope 0.  Both sides are
 * computed and one selected, without a branch, so the loops over it
 * vectorise (a branch on the sign of random activations also mispredicts
 * half the time: the branchy form ran at a quarter of memory speed). */
GP_EW_FN float gp_ew_leaky_relu(float x, float slope)
{
    /* = x > 0 ? x : slope * x exactly (but for the sign of a zero), as two
     * selects of x or 0, which compilers turn into masks, and a multiply
     * done on every element: no branch, nothing speculated */
    float pos = x > 0.0f ? x : 0.0f, neg = x > 0.0f ? 0.0f : x;
    return pos + slope * neg;
}

/* dx from leaky_relu's output y: with slope >= 0, y > 0 exactly where
 * x > 0, so y serves as relu's does (and backward needs no input).
 * Branch-free like the forward. */
GP_EW_FN float gp_ew_leaky_relu_bwd(float y, float dy, float slope)
{
    float pos = y > 0.0f ? dy : 0.0f, neg = y > 0.0f ? 0.0f : dy;
    return pos + slope * neg;
}

/* GELU in GPT-2's tanh form (PyTorch's approximate='tanh'):
 * y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).  A NaN stays NaN;
 * tanhf saturates at +-1, so large |x| gives x or -0. */
#define GP_EW_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GP_EW_GELU_C 0.044715f
GP_EW_FN float gp_ew_gelu(float x)
{
    float t = tanhf(GP_EW_GELU_K * (x + GP_EW_GELU_C * x * x * x));
    return 0.5f * x * (1.0f + t);
}

/* SwiGLU (Llama's MLP, issue 66): silu(a) b, silu(a) = a sigmoid(a) (as
 * PyTorch's F.silu), and its gradients from the inputs: da = dy b silu'(a),
 * silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a); db = dy silu(a). */
GP_EW_FN float gp_ew_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }
/* The same given s = sigmoid(a) (the CPU's comes from its vectorised exp,
 * cpu_math.c): one formula for every backend. */
GP_EW_FN float gp_ew_swiglu_s(float a, float b, float s) { return a * s * b; }
GP_EW_FN void gp_ew_swiglu_bwd_s(float a, float b, float dy, float s, float *da, float *db)
{
    *da = dy * b * (s * (1.0f + a * (1.0f - s)));
    *db = dy * (a * s);
}
GP_EW_FN float gp_ew_swiglu(float a, float b) { return gp_ew_swiglu_s(a, b, gp_ew_sigmoid(a)); }
GP_EW_FN void gp_ew_swiglu_bwd(float a, float b, float dy, float *da, float *db)
{
    gp_ew_swiglu_bwd_s(a, b, dy, gp_ew_sigmoid(a), da, db);
}

/* Rotary position embeddings (backend.h's rope, issue 66) over rows sequences of t
 * positions, each position `width` values: q's and k's heads of d values
 * (`heads` of them in all, first) and then the values no rope touches
 * (v's).  Position p of a sequence is pos0 + p.  In head h, value i < d/2
 * and value i + d/2 turn together by pos * inv_freq[i] (Hugging Face's
 * rotate_half layout). */
#define GP_ROPE_MAX_HALF 256
typedef struct gp_rope_desc {
    int64_t rows, t, pos0, width, heads, d;
    float inv_freq[GP_ROPE_MAX_HALF];
} gp_rope_desc;

/* Rotary position embeddings (issue 66), Hugging Face's rotate_half
 * layout: a head's values a = x[i] and b = x[i + d/2] turn by the angle
 * pos * inv_freq[i], computed in float as HF's outer product is, its
 * cosine and sine in double rounded to float (HF's float32 cos / sin);
 * the backward turns back (the rotation's transpose). */
GP_EW_FN void gp_ew_rope_cs(int64_t pos, float inv_freq, float *c, float *s)
{
    float a = (float)pos * inv_freq;
    *c = (float)cos((double)a);
    *s = (float)sin((double)a);
}
GP_EW_FN void gp_ew_rope(float a, float b, float c, float s, bool inverse, float *ya, float *yb)
{
    float sn = inverse ? -s : s;
    *ya = a * c - b * sn;
    *yb = b * c + a * sn;
}

/* dx = dy * gelu'(x), from the input x (the output does not determine it:
 * gelu is not monotonic below -0.75). */
GP_EW_FN float gp_ew_gelu_bwd(float x, float dy)
{
    float t = tanhf(GP_EW_GELU_K * (x + GP_EW_GELU_C * x * x * x));
    float du = GP_EW_GELU_K * (1.0f + 3.0f * GP_EW_GELU_C * x * x);
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

/* Layer norm's 1 / sqrt(var + eps) of a row, from its biased variance (in
 * double: the row's sums are), rounded once; mean and rstd are kept in FP32
 * for the backward (backend.h's layer_norm_*). */
GP_EW_FN float gp_ew_ln_rstd(double var, float eps)
{
    return (float)(1.0 / sqrt(var + (double)eps));
}

/* The normalised value y under leaky_relu's output z = gp_ew_leaky_relu(y,
 * slope), slope > 0: z where z > 0, else z / slope (in-place activated
 * instance norm, issue 22: the norm's backward reads z, which the relu
 * wrote over y, as InPlace-ABN does).  Within an ulp of y where y <= 0,
 * and a function of z alone, so a norm that still has y gets the same bits
 * by computing gp_ew_leaky_relu_inv(gp_ew_leaky_relu(y, slope), slope). */
GP_EW_FN float gp_ew_leaky_relu_inv(float z, float slope)
{
    float pos = z > 0.0f ? z : 0.0f, neg = z > 0.0f ? 0.0f : z;
    return pos + neg / slope;
}

GP_EW_FN int gp_ew_nonfinite(float x) { return !isfinite(x); }

/* ---- optimizer ---------------------------------------------------------- */

/* SGD with momentum, PyTorch's formulation (dampening 0):
 *   g' = g + wd * w;  v = mu * v + g';  w -= lr * (nesterov ? g' + mu * v : v)
 * With v = 0 on the first step this equals PyTorch's "buffer = g'" start. */
GP_EW_FN void gp_ew_sgd(float *w, float g, float *v, float lr, float mu,
                        float wd, int nesterov)
{
    float gg = g + wd * *w;
    float vv = mu * *v + gg;
    *v = vv;
    *w -= lr * (nesterov ? gg + mu * vv : vv);
}

/* One step of Adam or AdamW for every parameter of an update: what varies
 * only with the step, worked out once on the host (bias corrections in
 * double, rounded once). */
typedef struct gp_adam_step {
    float lr;        /* this step's learning rate */
    float beta1, beta2, eps;
    float step_size; /* lr / (1 - beta1^t), t the 1-based step */
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
    int decoupled;   /* AdamW: decay w by lr * wd; Adam: add wd * w to g */
} gp_adam_step;

/* Adam (Kingma & Ba) as PyTorch's torch.optim.Adam / AdamW compute it
 * (amsgrad off, the eps outside the square root's bias correction):
 *   AdamW: w *= 1 - lr * wd;   Adam: g' = g + wd * w
 *   m = b1 * m + (1 - b1) * g';  v = b2 * v + (1 - b2) * g'^2
 *   w -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
 * m and v start at 0. */
GP_EW_FN void gp_ew_adam(float *w, float g, float *m, float *v, const gp_adam_step *a,
                         float wd)
{
    float ww = *w;
    if (a->decoupled)
        ww *= 1.0f - a->lr * wd;
    else
        g += wd * ww;
    float mm = a->beta1 * *m + (1.0f - a->beta1) * g;
    float vv = a->beta2 * *v + (1.0f - a->beta2) * (g * g);
    *m = mm;
    *v = vv;
    *w = ww - a->step_size * (mm / (sqrtf(vv) / a->bc2_sqrt + a->eps));
}

/* ---- dropout ------------------------------------------------------------ */

/* Mask value for uniform u in [0, 1): kept elements are scaled by 1/(1-p) so
 * the expectation is unchanged; p >= 1 drops everything (u < 1 always). */
GP_EW_FN float gp_ew_dropout(float u, float p)
{
    return u >= p ? 1.0f / (1.0f - p) : 0.0f;
}

/* ---- batch normalisation ------------------------------------------------- */

/* Forward as one multiply-add per element: y = x * scale + shift with
 * scale = gamma / sqrt(var + eps), shift = beta - mean * scale (coefficients
 * in double, rounded once). */
GP_EW_FN void gp_ew_bn_coeffs(float mean, float var, float eps, float gamma,
                              float beta, float *scale, float *shift)
{
    double inv = 1.0 / sqrt((double)var + (double)eps);
    double sc = (double)gamma * inv;
    *scale = (float)sc;
    *shift = (float)((double)beta - (double)mean * sc);
}

GP_EW_FN float gp_ew_bn_apply(float x, float scale, float shift) { return x * scale + shift; }

/* Batch norm followed by a relu (gp_bn_desc.relu), backward: dy where the
 * forward's x scale + shift (before the relu) was positive, else 0: what
 * gp_ew_relu_bwd gives on the relu's output (NaN and -0 included). */
GP_EW_FN float gp_ew_bn_relu_dy(float dy, float x, float scale, float shift)
{
    /* dy's bits kept or cleared (+0.0f), without a branch: compilers
     * vectorise this inside a double accumulation, not the ?: form */
    union {
        float f;
        uint32_t u;
    } v;
    v.f = dy;
    v.u &= 0u - (uint32_t)(gp_ew_bn_apply(x, scale, shift) > 0.0f);
    return v.f;
}

/* Chan's parallel merge of one channel's micro-batch statistics (nb
 * values, mean, biased var) into a step's accumulator of na values
 * (mean_acc, m2_acc: the sum of squared deviations), in double
 * (backend.h's bn_merge). */
GP_EW_FN void gp_ew_bn_merge(double *mean_acc, double *m2_acc, double na, double nb, float mean,
                             float var)
{
    double n = na + nb, delta = (double)mean - *mean_acc;
    *mean_acc += delta * nb / n;
    *m2_acc += (double)var * nb + delta * delta * na * nb / n;
}

/* Channel k of a step's pending micro-batch statistics merged into its
 * accumulator of na values, in slot order, each slot as gp_ew_bn_merge
 * would (so the bits of one merge after another): slot i at pend + 2 c i
 * holds the micro-batch's means (c) and then its biased variances (c), of
 * nb_hi values per channel for i < n_hi and nb_lo after (backend.h's
 * gp_bn_commit_part.pend: the step's micro-batches in order, the larger
 * first, as gp_microbatch_split makes them). */
GP_EW_FN void gp_ew_bn_fold(double *mean_acc, double *m2_acc, const float *pend, int64_t c,
                            int64_t k, int n_pend, int n_hi, double na, double nb_hi,
                            double nb_lo)
{
    for (int i = 0; i < n_pend; i++) {
        const double nb = i < n_hi ? nb_hi : nb_lo;
        const float *slot = pend + 2 * c * (int64_t)i;
        gp_ew_bn_merge(mean_acc, m2_acc, na, nb, slot[k], slot[c + k]);
        na += nb;
    }
}

/* One channel's running statistics from a step's accumulator of `count`
 * values (PyTorch: momentum m weighs the new batch; the unbiased variance),
 * in double, rounded once; the accumulator is zeroed for the next step
 * (backend.h's bn_commit). */
GP_EW_FN void gp_ew_bn_commit(float *rmean, float *rvar, double *mean_acc, double *m2_acc,
                              double m, double count)
{
    *rmean = (float)((1.0 - m) * (double)*rmean + m * *mean_acc);
    *rvar = (float)((1.0 - m) * (double)*rvar + m * *m2_acc * (1.0 / (count - 1.0)));
    *mean_acc = 0.0;
    *m2_acc = 0.0;
}

/* Backward from the channel sums sdy = sum dy and sdyx = sum dy * (x - mean)
 * over cnt elements: with inv = 1 / sqrt(var + eps) and xhat = (x - mean) inv,
 *   dx = gamma inv (dy - sdy / cnt - xhat (sdyx inv) / cnt)
 *      = a dy + b (x - mean) + c,
 *   dgamma += sdyx inv,  dbeta += sdy. */
GP_EW_FN void gp_ew_bn_bwd_coeffs(float var, float eps, float gamma, double sdy,
                                  double sdyx, double cnt, float *a, float *b,
                                  float *c, double *dgamma, double *dbeta)
{
    double inv = 1.0 / sqrt((double)var + (double)eps);
    double g = (double)gamma;
    *a = (float)(g * inv);
    *b = (float)(-g * inv * inv * inv * sdyx / cnt);
    *c = (float)(-g * inv * sdy / cnt);
    *dgamma = sdyx * inv;
    *dbeta = sdy;
}

/* 1 / sqrt(var + eps) in double, rounded once: the "saved inverse standard
 * deviation" cuDNN's batch-norm backward takes, made from the interface's
 * biased variance (backend/cuda). */
GP_EW_FN float gp_ew_bn_invstd(float var, float eps)
{
    return (float)(1.0 / sqrt((double)var + (double)eps));
}

/* The biased variance (the interface's) from the unbiased one over cnt
 * elements (cuDNN's running-variance update with factor 1 leaves the
 * unbiased batch variance); one element has variance 0. */
GP_EW_FN float gp_ew_bn_biased_var(float unbiased, double cnt)
{
    return cnt > 1.0 ? (float)((double)unbiased * ((cnt - 1.0) / cnt)) : 0.0f;
}

/* norm_leaky_bwd's coefficients (backend.h) from a channel's sums
 * sdy = sum dy and sdyy = sum dy y' over cnt values: dx = a dy + b y' + c
 * with a = inv, b = -inv sdyy / cnt, c = -inv sdy / cnt. */
GP_EW_FN void gp_ew_norm_leaky_coeffs(float var, float eps, double sdy, double sdyy, double cnt,
                                      float *a, float *b, float *c)
{
    double inv = 1.0 / sqrt((double)var + (double)eps);
    *a = (float)inv;
    *b = (float)(-inv * sdyy / cnt);
    *c = (float)(-inv * sdy / cnt);
}

/* norm_leaky_bwd's y' from what it reads: the relu's output z, or the
 * norm's output y through the relu and back (the same bits as from z). */
GP_EW_FN float gp_ew_norm_leaky_y(float v, int from_z, float slope)
{
    return gp_ew_leaky_relu_inv(from_z ? v : gp_ew_leaky_relu(v, slope), slope);
}

/* dx = a dy + b (x - mean) + c.  On a GPU as two explicit fused
 * multiply-adds: nvcc contracts the plain expression as it sees fit at
 * each call site, and on an H100 (2026-11-27) the plane kernel's loop with
 * the relu folded in and its loop without contracted it differently, so
 * bn_bwd with the relu and relu_bwd then bn_bwd differed in the last bit. */
GP_EW_FN float gp_ew_bn_bwd_apply(float dy, float x, float mean, float a, float b,
                                  float c)
{
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, dy, __fmaf_rn(b, x - mean, c));
#else
    return a * dy + b * (x - mean) + c;
#endif
}

/* ---- cross-entropy, one row of logits (cols classes) -------------------- */

/* Row maximum and the first index that attains it. */
GP_EW_FN float gp_ew_row_max(const float *x, int64_t cols, int64_t *argmax)
{
    float m = x[0];
    int64_t a = 0;
    for (int64_t j = 1; j < cols; j++)
        if (x[j] > m) { m = x[j]; a = j; }
    *argmax = a;
    return m;
}

/* log(sum_j exp(x_j - max)) accumulated in double. */
GP_EW_FN double gp_ew_row_logsumexp(const float *x, int64_t cols, float max)
{
    double s = 0.0;
    for (int64_t j = 0; j < cols; j++) s += exp((double)(x[j] - max));
    return log(s);
}

/* -log softmax(x)[label] given the row's max and logsumexp. */
GP_EW_FN double gp_ew_xent_loss(const float *x, int64_t label, float max,
                                double lse)
{
    return lse - (double)(x[label] - max);
}

/* One element of the gradient: (softmax(x)_j - [j == label]) * scale, from
 * x_j, whether j is the label, the row's max and logsumexp. */
GP_EW_FN float gp_ew_xent_grad_one(float xj, int is_label, float max, double lse, float scale)
{
    double p = exp((double)(xj - max) - lse);
    return (float)((p - (is_label ? 1.0 : 0.0)) * (double)scale);
}

/* d[j] = (softmax(x)_j - [j == label]) * scale. */
GP_EW_FN void gp_ew_xent_grad_row(const float *x, int64_t cols, int64_t label,
                                  float max, double lse, float scale, float *d)
{
    for (int64_t j = 0; j < cols; j++) d[j] = gp_ew_xent_grad_one(x[j], j == label, max, lse, scale);
}

/* Label smoothing (PyTorch's CrossEntropyLoss(label_smoothing=eps)): the
 * target is 1 - eps + eps / cols on the label and eps / cols elsewhere, so
 * the loss is (1 - eps) (-log softmax[label]) + eps mean_j (-log softmax_j)
 * = (1 - eps) gp_ew_xent_loss + eps (lse - shift_sum / cols), shift_sum
 * the row's sum of x_j - max in double (gp_ew_row_shift_sum).  eps = 0:
 * gp_ew_xent_loss exactly. */
GP_EW_FN double gp_ew_xent_loss_ls(const float *x, int64_t label, float max, double lse,
                                   double shift_sum, int64_t cols, float eps)
{
    double base = gp_ew_xent_loss(x, label, max, lse);
    if (eps == 0.0f) return base;
    return (1.0 - (double)eps) * base + (double)eps * (lse - shift_sum / (double)cols);
}

/* sum_j (x_j - max), in double. */
GP_EW_FN double gp_ew_row_shift_sum(const float *x, int64_t cols, float max)
{
    double s = 0.0;
    for (int64_t j = 0; j < cols; j++) s += (double)(x[j] - max);
    return s;
}

/* The smoothed gradient's element: (softmax(x)_j - target_j) * scale;
 * eps = 0: gp_ew_xent_grad_one exactly. */
GP_EW_FN float gp_ew_xent_grad_ls(float xj, int is_label, float max, double lse, float scale,
                                  float eps, int64_t cols)
{
    if (eps == 0.0f) return gp_ew_xent_grad_one(xj, is_label, max, lse, scale);
    double p = exp((double)(xj - max) - lse);
    double q = (is_label ? 1.0 - (double)eps : 0.0) + (double)eps / (double)cols;
    return (float)((p - q) * (double)scale);
}

/* A float label is valid if it is an integer in [0, cols). */
GP_EW_FN int gp_ew_label_ok(float label, int64_t cols)
{
    return label >= 0.0f && label < (float)cols && label == floorf(label);
}

/* ---- binary cross-entropy with logits, one element ----------------------- */

/* A target must be a probability; NaN is not. */
GP_EW_FN int gp_ew_bce_target_ok(float t) { return t >= 0.0f && t <= 1.0f; }

/* max(z, 0) - z t + log(1 + exp(-|z|)) in double: the stable form of
 * -(t log sigmoid(z) + (1 - t) log(1 - sigmoid(z))), no overflow for any z. */
GP_EW_FN double gp_ew_bce_loss(float z, float t)
{
    double zd = (double)z, td = (double)t;
    return (zd > 0.0 ? zd : 0.0) - zd * td + log1p(exp(-fabs(zd)));
}

/* (sigmoid(z) - t) * scale; sigmoid from exp(-|z|), which cannot overflow. */
GP_EW_FN float gp_ew_bce_grad(float z, float t, float scale)
{
    double e = exp(-fabs((double)z));
    double sig = z >= 0.0f ? 1.0 / (1.0 + e) : e / (1.0 + e);
    return (float)((sig - (double)t) * (double)scale);
}

/* The prediction (z > 0, i.e. sigmoid(z) > 0.5) agrees with the target
 * rounded at 0.5. */
GP_EW_FN int gp_ew_bce_hit(float z, float t) { return (z > 0.0f) == (t > 0.5f); }

/* ---- bfloat16 ------------------------------------------------------------ */

/* x rounded to bfloat16 (the top 16 bits of its FP32 pattern: 8-bit
 * exponent, 7-bit mantissa), to nearest, ties to even, as PyTorch's and
 * oneDNN's conversions round.  Every NaN becomes the one quiet NaN 0x7fc0,
 * as PyTorch's conversion gives: a NaN's payload and sign are the
 * processor's own (a GPU's arithmetic and its max give its canonical NaN,
 * x86 keeps the operand's), so only a canonical NaN lets a GPU's bf16
 * output equal a CPU's bit for bit (on an H100, 2026-11-27, relu and
 * leaky relu on NaN inputs did not).  Infinities and
 * zeros keep their sign; a finite value past bfloat16's largest rounds to
 * infinity, as the same rule does in FP32.  What a pipeline copy in bf16
 * carries (pipeline.copy_precision). */
GP_EW_FN uint16_t gp_ew_bf16_bits(float x)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.f = x;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u; /* NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

/* relu on bf16 patterns, in 16-bit integer operations that vectorise:
 * the bits of gp_ew_bf16_bits(gp_ew_relu(value(x))), which keeps a
 * positive x (1 .. 0x7f80, +inf included) and a NaN (as 0x7fc0) and gives
 * 0 for the rest; and of gp_ew_bf16_bits(gp_ew_relu_bwd(value(y),
 * value(dy))), dy where y is positive (a NaN dy as 0x7fc0), else 0
 * (test_backend compares both with the float forms over every pattern). */
GP_EW_FN uint16_t gp_ew_bf16_relu_fwd_bits(uint16_t x)
{
    uint16_t pos = (uint16_t)(x - 1u) < 0x7f80u ? 0xffffu : 0u;
    uint16_t nan = (x & 0x7fffu) > 0x7f80u ? 0xffffu : 0u;
    return (uint16_t)((pos & x) | (nan & 0x7fc0u));
}

GP_EW_FN uint16_t gp_ew_bf16_relu_bwd_bits(uint16_t y, uint16_t dy)
{
    uint16_t pos = (uint16_t)(y - 1u) < 0x7f80u ? 0xffffu : 0u;
    uint16_t nan = (dy & 0x7fffu) > 0x7f80u ? 0xffffu : 0u;
    return (uint16_t)(pos & ((nan & 0x7fc0u) | (~nan & dy)));
}

/* The FP32 value of a bfloat16 pattern: exact (its low 16 bits zero). */
GP_EW_FN float gp_ew_bf16_value(uint16_t b)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.u = (uint32_t)b << 16;
    return v.f;
}

/* gp_ew_norm_leaky_y on bf16 storage (norm_leaky_bwd_bf16): from y, the
 * relu's output is rounded to bf16 as the leaky relu stores it, so y'
 * is the same whether it came from that stored z or from y. */
GP_EW_FN float gp_ew_norm_leaky_y_b16(float v, int from_z, float slope)
{
    float z = from_z ? v : gp_ew_bf16_value(gp_ew_bf16_bits(gp_ew_leaky_relu(v, slope)));
    return gp_ew_leaky_relu_inv(z, slope);
}

#endif /* GP_ELEMENTWISE_H */
