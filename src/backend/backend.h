/*
 * backend.h — the device interface.
 *
 * A gp_device is an interface table (gp_device_iface, function pointers) plus
 * a backend context pointer, a name ("cpu:0", "cuda:1") and an allocator
 * that accounts for every byte.  Layers call only the functions below (the
 * gp_dev_* wrappers, gp_tensor_*) and never test which backend they run on.
 *
 * Place in the design (modules, lowest first: core < backend < layers <
 * checkpoint < optim < pipeline < balance < trace < config < train;
 * scripts/check-includes.sh fails the tests on an include up that order).
 * backend owns: the interface table and its version; opening, naming and
 * closing devices; every byte of device memory (gp_dev_alloc/free, counted
 * in the device's gp_allocator) and so the storage of tensors
 * (gp_tensor_alloc/zeros/free/copy, backend/tensor.c); communicators and
 * collectives; the backends themselves (cpu/, cuda/).  It may call core and
 * nothing above it: it knows no layers, stages or schedules.  Modules above
 * may reach a device only through the gp_device_*, gp_dev_*, gp_tensor_* and
 * gp_comm_* functions here, never through dev->iface directly: the wrappers
 * are where optional slots get their fallbacks.  Only device.c
 * (registration) and cpu/, cuda/ know which backends exist.
 *
 * Execution model.  Each device has one in-order compute stream and a copy
 * stream.  On the CPU "a stream" is the device's worker thread: operations
 * run synchronously on the calling thread with the device's own thread count
 * (gp_device_bind_thread sets it), and an event is a completion flag.  On
 * CUDA the same calls are asynchronous on the device's stream and events are
 * cudaEvents.  Code that hands data between devices therefore records an
 * event after the producer and waits on it before the consumer — on the CPU
 * that is cheap and keeps the same program order as on GPUs.
 *
 * Copies between stages (copy_async) are the one place where the CPU can
 * be asynchronous too, so that the event logic above is exercised without
 * a GPU: with GPIPE_CPU_STREAMS=threads each CPU device's copy stream is a
 * queue run by a thread of its own, events are real (recorded, waited on),
 * and a copy that nobody waits for is still being written when its reader
 * runs (GPIPE_CPU_COPY_DELAY_US=N holds every copy back N us, so a missing
 * wait reads stale data instead of winning the race by luck).  The default,
 * GPIPE_CPU_STREAMS=sync, copies on the calling thread and its events are
 * NULL.  See cpu/cpu_streams.c.
 *
 * Memory conventions for the math:
 *   - all pointers are device memory of this device, float32, dense
 *     row-major; 4-D tensors are NCHW;
 *   - "_bwd_data" functions overwrite their output (dx =);
 *   - "_bwd_weights" functions ACCUMULATE into dw/db (dw +=), so gradients
 *     of several micro-batches add up without extra buffers.
 *
 * Optional slots: any iface slot marked "optional" may be NULL; the wrapper
 * then supplies a fallback (stated on the slot).  The table carries a version
 * number (GP_DEVICE_IFACE_VERSION) so that a backend built against another
 * layout is refused at registration: every backend's constructor goes
 * through gp_device_new, which checks it.
 *
 * Thread safety: a device is driven by one thread at a time (its worker);
 * the allocator alone may be read from any thread.
 */
#ifndef GP_BACKEND_H
#define GP_BACKEND_H

#include "backend/elementwise.h" /* gp_adam_step */
#include "core/core.h"

#include <pthread.h>

/* The layout of gp_device_iface.  Bump it whenever a slot is added, removed
 * or changes meaning; gp_device_new refuses a table of another version (a
 * backend compiled against another backend.h).  `version` and
 * `backend_name` stay the first two fields in every version, so the check
 * and its message can read them from any table.
 *   1  the original table: lifetime, memory, transfers, streams & events,
 *      elementwise, dense math, convolution, pooling, batch norm,
 *      activations, dropout
 *   2  allreduce, broadcast (collectives, for data parallelism)
 *   3  bn_stats, bn_bwd_sums, bn_bwd_apply (synchronised batch norm)
 *   4  reduce_scatter, all_gather (the sharded optimizer update)
 *   5  host_alloc, host_free (pinned upload buffers)
 *   6  sharded_sgd (the sharded SGD step as one collective)
 *   7  barrier (a host barrier over a communicator)
 *   8  copy_box (a strided 4-D copy: concatenation, padding, slices)
 *   9  leaky_relu_fwd, leaky_relu_bwd, mul_rows, upsample_fwd, upsample_bwd,
 *      bce_logits (torchgpipe's U-Net: its layers and loss)
 *  10  pool_fwd / pool_bwd take GP_POOL_AVG_INCLUDE_PAD (the average over the
 *      padded window, PyTorch's count_include_pad=True): no new slot, but a
 *      v9 backend would read the new kind as another one
 *  11  copy_async (a copy between devices on the receiver's copy stream,
 *      ordered by events, with no fence against either compute stream)
 *  12  nonfinite_or (the NaN check into a flag on the device: one read per
 *      stage per step instead of one per tensor)
 *  13  upload_async, bn_merge, bn_commit, xent_dev, bce_logits_dev (a
 *      training step with no host wait inside it: uploads on the copy
 *      stream, batch-norm statistics and the loss kept on the device)
 *  14  mark, mark_time, mark_reset (device-time markers: when a stream
 *      reached a point, for timelines of device time)
 *  15  chan_open, chan_send, chan_recv, chan_close, chan_id, event_query
 *      (channels to another process's device: NCCL point-to-point between
 *      GPU stages), gemm_wb (a gemm whose B is frozen weights), uid
 *  16  sgd_multi (a stage's whole update in one pass: one launch on a GPU),
 *      dropout_apply (dropout without a stored mask)
 *  17  bf16_pack, bf16_unpack (pipeline copies in bfloat16)
 *  18  act_block, and the channel-blocked layouts of gp_conv_desc.xblk /
 *      yblk, gp_pool_desc.blk / plain_out and gp_bn_desc.blk (activations
 *      kept in the convolutions' own layout between them; a block equal to
 *      the channels, channels-last, since 2026-11-28)
 *  19  copy_to_host (a copy into another backend's host memory that touches
 *      none of this device's stream state)
 *  20  gp_bn_desc.relu (batch norm's forward with the ReLU after it)
 *  21  gp_bn_desc.relu in the backward slots too (the relu's backward done
 *      by the norm's), which take beta (and bn_bwd_sums gamma and var) to
 *      know where the normalised value was positive
 *  22  gp_bn_desc.add (a residual added before the relu, in the forward)
 *  23  linear_fwd (a linear layer's product, bias and relu in one call: a
 *      cuBLASLt epilogue on a GPU)
 *  24  adam_multi (Adam and AdamW), gp_update_part.v2
 *  25  xent and xent_dev take the label smoothing
 *  26  sumsq_multi (gradient clipping's squared norms: one host wait per
 *      stage instead of one per tensor)
 *  27  norm_leaky_bwd (instance norm's backward from its output, or from
 *      the leaky relu's output in place over it: in-place activated norm)
 *  28  attn_fwd, attn_bwd (causal multi-head self-attention, the fused
 *      kernel of the attention layer)
 *  29  gelu_fwd, gelu_bwd (GPT-2's tanh GELU)
 *  30  layer_norm_fwd, layer_norm_bwd_data, layer_norm_bwd_weights
 *  31  embed_fwd, embed_bwd (token and position embeddings)
 *  32  xent and xent_dev take the rows' stride `ld` (>= cols): a padded
 *      vocabulary's logits (model.gpt.vocab_pad) are read in their first
 *      cols columns and the gradient's padding columns are zeroed
 *  33  act_bf16, act_bf16_kinds (relu, leaky relu and GELU on bf16 storage
 *      in one pass, without the storage adapter), attn_fwd_bf16,
 *      attn_bwd_bf16 (attention on bf16 storage)
 *  34  bn_fwd_train_bf16, bn_fwd_infer_bf16, bn_bwd_bf16, pool_fwd_bf16,
 *      pool_bwd_bf16, add_bf16, conv_fwd_bf16, conv_bwd_data_bf16,
 *      conv_bwd_weights_bf16, xent_bf16, layer_norm_fwd_bf16,
 *      layer_norm_bwd_data_bf16, layer_norm_bwd_weights_bf16 (batch norm,
 *      pooling, sums, convolutions, cross-entropy and layer norm on bf16
 *      storage), dropout_apply_bf16, mul_rows_bf16 (dropout and dropout2d
 *      on bf16 storage)
 *  35  copy_box takes the element size (4 or 2 bytes: FP32 or bf16 boxes,
 *      concatenations and their slices on bf16 storage)
 *  36  norm_leaky_bwd_bf16, upsample_fwd_bf16, upsample_bwd_bf16 (U-Net's
 *      instance norm and upsampling on bf16 storage)
 *  37  linear_fwd_bf16, linear_bwd_data_bf16, linear_bwd_weights_bf16
 *      (linear layers on bf16 storage under precision bf16)
 *  38  bn_commit_multi (a stage's batch-norm commits in one launch)
 *  39  gp_bn_desc.add16 (a residual block's sum and relu in its second
 *      norm's pass on bf16 storage)
 *  40  gp_update_part.w16 and .nonfinite (sgd_multi and adam_multi write
 *      a weight's bf16 mirror and check the new weights in the update's
 *      pass)
 *  41  gp_update_part.clip (gradient clipping's factor applied in the
 *      update's pass instead of a scale per tensor)
 *  42  embed_fwd / embed_bwd take the activations' element type (bf16
 *      storage without the adapter)
 *  43  zero_many (a stage's accumulated gradients zeroed in one launch)
 *  44  mem_total (a device's own memory, for the start-up fit check)
 *  45  linear_bwd_weights takes the element type (it was
 *      linear_bwd_weights_bf16): FP32 steps too take a linear layer's
 *      weight and bias gradients in one call, the bias's sums overwriting
 *      on a fresh step instead of a fill first; add_layer_norm_fwd and
 *      layer_norm_bwd_data_add (a residual add and the layer norm after
 *      it in one pass; the norm's data gradient added into its input's
 *      other gradient in the same pass); linear_gelu_fwd and
 *      linear_gelu_bwd_data (a product with GELU, or GELU's derivative, as
 *      its epilogue); embed_bwd takes the vocabulary's size; rms_norm_fwd,
 *      rms_norm_bwd_data, rms_norm_bwd_weights (Llama's RMSNorm);
 *      swiglu_fwd, swiglu_bwd (Llama's MLP activation)
 *  46  rope (rotary position embeddings over a fused q, k, v)
 *  47  attn_fwd, attn_bwd, attn_fwd_bf16, attn_bwd_bf16 take kv_heads
 *      (grouped-query attention: x (b, t, c + 2 kv_heads d))
 *  48  attn_cached (attention of new positions against a KV cache:
 *      sampling one token at a time)
 *  49  gp_bn_commit_part.pend (a step's micro-batch statistics merged by
 *      bn_commit_multi in the commit's launch, not one bn_merge each)
 *  50  alloc takes the block's gp_mem_category */
#define GP_DEVICE_IFACE_VERSION 50

typedef enum { GP_DEV_CPU = 0, GP_DEV_CUDA = 1 } gp_device_kind;

/* The activations act_bf16 computes (bit k of act_bf16_kinds: kind k). */
typedef enum { GP_ACT_RELU = 0, GP_ACT_LEAKY_RELU, GP_ACT_GELU, GP_ACT_COUNT } gp_act_kind;

/* The math a device's convolutions and matrix products run in
 * (train.precision).  FP32: exact single precision (the default, and what
 * the transparency tests compare bit for bit).  TF32: GPUs' tensor-core
 * math on FP32 data (10-bit mantissa products, FP32 sums); a CPU has none
 * and computes FP32.  BF16: the operands rounded to bfloat16 (8-bit
 * mantissa) on the way in, products summed in FP32, results and storage
 * FP32; on a CPU only where the processor has bf16 instructions
 * (avx512_bf16 or AMX), which oneDNN uses; on a GPU from sm_80 (bf16
 * tensor cores), where a convolution's result is rounded to bfloat16 too
 * (cuDNN writes bf16 for bf16 operands) before it is widened to FP32. */
typedef enum { GP_PRECISION_FP32 = 0, GP_PRECISION_TF32, GP_PRECISION_BF16 } gp_precision;
const char *gp_precision_name(gp_precision p); /* "fp32", "tf32", "bf16" */

/* Precision bf16: the matrix products that take bf16 operands, on every
 * backend (16 deep and 256 outputs up); smaller ones are not worth the
 * conversion and compute FP32. */
static inline bool gp_bf16_gemm_worth(int64_t m, int64_t n, int64_t k)
{
    return k >= 16 && m * n >= 256;
}

/* One algorithm a library offers for an operation (a cuDNN convolution
 * direction), as the backend's choice sees it: ranked by the library's
 * heuristics, or measured (time_ms >= 0). */
typedef struct gp_algo_cand {
    int algo;            /* the library's id */
    bool ok;             /* the library can run it (status success) */
    float time_ms;       /* measured time; < 0 where only ranked */
    size_t memory;       /* workspace bytes it needs */
    bool deterministic;  /* same bits every run */
} gp_algo_cand;

/* Which candidate a device runs (train.deterministic): among those that are
 * ok and need at most `limit` bytes, with `deterministic` the first
 * deterministic one in the given (heuristic) order, so that every run picks
 * the same algorithm and gets the same bits; without it, among the measured
 * ones within GP_ALGO_SLACK of the fastest time, the one that needs the
 * least workspace (ties: the faster, then the first), or the first where
 * none was measured.  The slack is below what a search's one timing of each
 * can tell apart, and the workspace is memory the whole step may hold (the
 * device's workspace grows to the largest of its picks: issue 67 measured
 * 0.71 GB of it held on ResNet-101): where the fastest needs hundreds of
 * MB for a time within the slack, one that needs none runs instead.  -1
 * when none qualifies. */
#define GP_ALGO_SLACK 0.02
int gp_algo_pick(const gp_algo_cand *c, int n, size_t limit, bool deterministic);

/* Layouts of activations.  Every tensor of the interface is plain (NCHW,
 * row-major) unless a descriptor's block field says otherwise: a block B > 0
 * means the channel-blocked layout nChw<B>c, (N, C / B, H, W, B) row-major,
 * channel c of pixel (n, h, w) at ((n * C/B + c / B) * H * W + h * W + w) * B
 * + c % B; C is a multiple of B and the tensor has as many elements as its
 * plain form.  B = C is channels-last, NHWC: (N, H, W, C), the layout a
 * GPU's tensor cores read (issue 67) and oneDNN's nhwc.  Only backends with
 * act_block take blocks (the CPU: oneDNN's direct convolutions compute in
 * nChw16c or nChw8c; a GPU: channels-last, for bf16 convolutions), and a
 * block never changes a result bit on the CPU: a layer given a blocked
 * tensor computes what it computes on the plain one, laid out the other way
 * (layers.h, gp_layers_blocked).  On a GPU the same holds for the
 * convolutions, batch norm on bf16 storage or maps of 64+ values, and
 * pooling on bf16 storage; on FP32 storage a narrow batch norm, an average
 * pool and a bias gradient sum in another order channels-last than plain
 * (cuda_dnn.c), within FP32 rounding. */

/* Whether blk is a layout a backend may be given for `channels` channels:
 * plain (0), a block of 8 or 16 that divides them, or channels-last (blk =
 * channels, a multiple of 8). */
static inline bool gp_blk_valid(int64_t blk, int64_t channels)
{
    return blk == 0 || ((blk == 8 || blk == 16) && channels % blk == 0) ||
           (blk == channels && channels % 8 == 0);
}

/* The channels a blocked loop takes together in layout blk (valid): 16 or
 * 8 of the pixel's blk consecutive values (1 plain).  A block of 8 or 16 is
 * one unit; channels-last holds C / unit of them side by side. */
static inline int64_t gp_blk_unit(int64_t blk)
{
    return blk == 0 ? 1 : blk % 16 == 0 ? 16 : 8;
}

/* Whether layout blk (valid) is channels-last in name: a block of 8 or 16
 * is nChw8c or nChw16c even where it is all the channels (the same bytes). */
static inline bool gp_blk_nhwc(int64_t blk)
{
    return blk && blk != 8 && blk != 16;
}

/* Descriptor of a 2-D convolution (also used for pooling windows). */
typedef struct gp_conv_desc {
    int64_t n, c, h, w;      /* input (N, C, H, W) */
    int64_t k;               /* output channels */
    int64_t kh, kw;          /* kernel */
    int64_t sh, sw;          /* stride */
    int64_t ph, pw;          /* zero padding, both sides */
    int64_t oh, ow;          /* output spatial size (computed by caller) */
    int has_bias;
    int64_t xblk, yblk;      /* layouts of x / dx and of y / dy: 0 plain, else
                                the channel block (above) */
} gp_conv_desc;

/* Precision bf16: the convolutions that take bf16 operands, on every
 * backend: those summing 16 products or more per output (c kh kw, the
 * depth gp_bf16_gemm_worth asks of a matrix product).  A first layer's 1
 * or 2 input channels under a 3x3 kernel stay FP32: oneDNN has no fast
 * bf16 kernel for them (on an AMX Xeon its backward-filter took 14x the
 * FP32 one's time, bench/README.md "Precision"), and they are a sliver of
 * the work. */
static inline bool gp_bf16_conv_worth(const gp_conv_desc *d)
{
    return d->c * d->kh * d->kw >= 16;
}

/* The average kinds differ in the divisor of a window that overlaps the
 * padding: AVG divides by its elements inside the image (PyTorch's
 * count_include_pad=False), AVG_INCLUDE_PAD by kh * kw (the padded window;
 * PyTorch's default).  Max pooling pads with -infinity. */
typedef enum {
    GP_POOL_MAX = 0,
    GP_POOL_AVG = 1,
    GP_POOL_AVG_INCLUDE_PAD = 2,
} gp_pool_kind;

/* Pooling windows.  Every axis may differ (kh != kw, sh != sw, ph != pw);
 * the backends require 0 <= ph < kh, 0 <= pw < kw, every window to overlap
 * the image, and (oh - 1) * sh + kh <= h + 2 ph (likewise w): no window
 * reaches past the padding, as with PyTorch's ceil_mode=False. */
typedef struct gp_pool_desc {
    int64_t n, c, h, w;      /* input */
    int64_t kh, kw, sh, sw, ph, pw;
    int64_t oh, ow;
    gp_pool_kind kind;
    int64_t blk;             /* layout of x and dx, and of y and dy unless
                                plain_out: 0 plain, else the channel block
                                (above) */
    bool plain_out;          /* with blk: y and dy plain, x and dx blocked (a
                                chain that ends in this pool) */
} gp_pool_desc;

/* Batch normalisation over channel c of (N, C, S) where S = H*W (S = 1 for
 * the 1-D case over features). */
typedef struct gp_bn_desc {
    int64_t n, c, s;
    float eps;
    int64_t blk;             /* layout of x, y, dx, dy: 0 plain (N, C, S), else
                                the channel block (above), (N, C / blk, S, blk) */
    bool relu;               /* bn_fwd_train, bn_fwd_infer: y = relu(the
                                normalised value), bit for bit what relu_fwd
                                gives on the output without it (gp_ew_relu);
                                bn_bwd, bn_bwd_sums, bn_bwd_apply: dy is the
                                gradient of that relu's output, masked here
                                where the normalised value was not positive,
                                bit for bit what relu_bwd gives (iface 21);
                                bn_stats ignores it */
    const float *add;        /* bn_fwd_train, bn_fwd_infer: where not NULL, y =
                                (the normalised value + add[i]), then relu
                                where relu: a residual block's sum and its
                                relu in the norm's pass, bit for bit the add
                                and relu_fwd after it (iface 22); add has y's
                                layout and overlaps neither x nor y; the
                                other slots
                                take NULL (their relu, if any, then means
                                the normalised value's own) */
    const uint16_t *add16;   /* bn_fwd_train_bf16, bn_fwd_infer_bf16: `add`
                                on bf16 storage, its values widened exactly,
                                y rounded once after the sum and relu (iface
                                39); every other slot takes NULL, as the
                                bf16 slots take a NULL add */
} gp_bn_desc;

typedef struct gp_device gp_device;
typedef struct gp_event gp_event;

/* A communicator: a group of devices that run collectives together (NCCL on
 * CUDA, one ncclComm_t per device, created once by gp_comm_create).  The
 * backend that made it fills `ctx` and `destroy`; `devs` is the group in
 * rank order (not owned: the devices outlive the communicator). */
struct gp_comm;
struct gp_chan_desc;
/* Collectives a communicator brings itself, instead of its devices'
 * backend: one across processes (pipeline/procs.h, MPI), whose ranks' buffers
 * are in other processes.  Same contracts as the device slots below
 * (sums in rank order); sharded_sgd is composed from reduce_scatter, the
 * update and all_gather. */
typedef struct gp_comm_ops {
    gp_status (*allreduce)(struct gp_comm *comm, gp_device *dev, float *buf, int64_t n);
    gp_status (*broadcast)(struct gp_comm *comm, gp_device *dev, float *buf, int64_t n, int root);
    gp_status (*reduce_scatter)(struct gp_comm *comm, gp_device *dev, float *buf, int64_t n);
    gp_status (*all_gather)(struct gp_comm *comm, gp_device *dev, float *buf, int64_t n);
    gp_status (*barrier)(struct gp_comm *comm, gp_device *dev);
} gp_comm_ops;

typedef struct gp_comm {
    int n;                 /* devices in the group */
    gp_device **devs;      /* (n) owned array of borrowed device pointers */
    void *ctx;             /* backend state (per-rank NCCL communicators) */
    void (*destroy)(struct gp_comm *comm);
    /* optional (NULL: no-op), appended for data parallelism.  abort: make
     * every rank blocked in, or later entering, a collective of this comm
     * return GP_ERR_CANCELLED (a failing replica releases its peers; safe
     * from any thread).  reset: make the comm usable again after an abort;
     * only while no rank is inside a collective (between steps). */
    void (*abort)(struct gp_comm *comm);
    void (*reset)(struct gp_comm *comm);
    /* optional (appended): the comm's own collectives; NULL: the devices'. */
    const gp_comm_ops *ops;
} gp_comm;

/* A loss's results on the device (xent_dev, bce_logits_dev); the same
 * layout as the CUDA kernels' result structs. */
typedef struct gp_loss_result {
    double loss_sum;
    int64_t correct;
    int64_t bad; /* first bad row (xent) or element (bce), else -1 */
} gp_loss_result;

/* One tensor of a multi-tensor update: w, its gradient g and its state,
 * n floats each, with its weight decay.  SGD: v the momentum (NULL: plain
 * SGD, as sgd_update), v2 unused.  Adam: v the first moment (exp_avg), v2
 * the second (exp_avg_sq).  w16 (NULL: none): w's bf16 mirror, which the
 * update writes in the same pass, w16[i] = gp_ew_bf16_bits(new w[i])
 * (gp_dev_mirror_for_update).  nonfinite (NULL: none): one float of the
 * device's memory set to 1 if a new w[i] is NaN or Inf, else left as it
 * is (the check after the step, in the same pass: nonfinite_or's flag);
 * the parts of one call that have one name the same.  clip (0: none): the
 * gradient is g[i] * clip, gradient clipping's factor in (0, 1) folded into
 * the update's pass (the bits of scaling g first: one FP32 product), so a
 * clipped step launches no scale per tensor; the slots do not write g
 * (gp_dev_sgd_multi's fallback without sgd_multi scales it first). */
typedef struct gp_update_part {
    float *w;
    const float *g;
    float *v;
    float *v2;
    int64_t n;
    float wd;
    uint16_t *w16;
    float *nonfinite;
    float clip;
} gp_update_part;

/* A weight tensor's bf16 mirror (precision bf16): the copy its products
 * read, in the tensor's own element order, copy[i] = gp_ew_bf16_bits(w[i]).
 * It is current for the freeze whose gp_device.weights_epoch it carries:
 * made on the first use in a freeze (gp_dev_mirror_get), or written by the
 * update that changed w (gp_dev_mirror_for_update: current for the next
 * freeze), so a step whose weights only the update changed converts none.
 * Every other write into a parameter (uploads, copies, fills, collectives,
 * a chunk's update, a parameter's free) marks the mirrors it overlaps
 * stale (gp_dev_weights_written), and GPIPE_CHECK_MIRRORS=1 checks at
 * each use of a current mirror that it is the rounding of its master (the
 * test suite runs with it). */
typedef struct gp_wmirror {
    const float *w;
    int64_t n;
    uint16_t *copy; /* 2 n bytes, GP_MEM_WORKSPACE */
    uint64_t epoch; /* current for this freeze; GP_WMIRROR_STALE: for none */
    bool by_update; /* the update wrote it (counted: mirrors_by_update) */
} gp_wmirror;
#define GP_WMIRROR_STALE UINT64_MAX

struct gp_bn_commit_part; /* below, with gp_dev_bn_commit_begin */

typedef struct gp_device_iface {
    int version; /* GP_DEVICE_IFACE_VERSION */
    const char *backend_name; /* "cpu", "cuda" */

    /* --- lifetime & memory (required) --- */
    /* Free the backend context (dev->ctx); gp_device_close frees the rest. */
    void (*destroy)(gp_device *dev);
    /* Raw allocation; accounting is done by the wrapper.  cat: what the
     * block holds (a backend may place weights otherwise: cpu_device.c) */
    gp_status (*alloc)(gp_device *dev, size_t bytes, gp_mem_category cat, void **out);
    void (*free)(gp_device *dev, void *ptr, size_t bytes);
    /* Bind the calling thread (thread counts, current GPU). optional: no-op */
    void (*bind_thread)(gp_device *dev);

    /* --- transfers, on the device's copy stream --- */
    gp_status (*copy_h2d)(gp_device *dev, void *dst, const void *src, size_t bytes);
    gp_status (*copy_d2h)(gp_device *dev, void *dst, const void *src, size_t bytes);
    /* Device-to-device on this device (dst and src both ours). */
    gp_status (*copy_d2d)(gp_device *dev, void *dst, const void *src, size_t bytes);
    /* Cross-device: dst on `dev`, src on `src_dev`.  optional: staged through
     * the host with copy_d2h + copy_h2d. */
    gp_status (*copy_peer)(gp_device *dev, void *dst, gp_device *src_dev,
                           const void *src, size_t bytes);

    /* --- streams & events --- */
    /* Wait until all work issued to this device has finished. */
    gp_status (*synchronize)(gp_device *dev);
    /* optional (NULL on synchronous backends, where work is done when the
     * call returns): gp_dev_event_create then gives a NULL event,
     * gp_dev_event_record synchronizes the device, and wait, sync and
     * destroy have nothing left to do. */
    gp_status (*event_create)(gp_device *dev, void **out);
    void (*event_destroy)(gp_device *dev, void *ev);
    gp_status (*event_record)(gp_device *dev, void *ev);
    gp_status (*event_wait)(gp_device *dev, void *ev); /* device waits */
    gp_status (*event_sync)(gp_device *dev, void *ev); /* host waits */

    /* --- elementwise (required) --- */
    gp_status (*fill)(gp_device *dev, float *x, float v, int64_t n);
    gp_status (*scale)(gp_device *dev, float *x, float a, int64_t n);      /* x *= a */
    gp_status (*axpy)(gp_device *dev, float a, const float *x, float *y, int64_t n); /* y += a x */
    gp_status (*add)(gp_device *dev, const float *a, const float *b, float *y, int64_t n); /* y = a + b */
    /* Sum of squares into *out (host float, double accumulation). */
    gp_status (*sumsq)(gp_device *dev, const float *x, int64_t n, double *out);
    /* Non-zero *out if any element is NaN or Inf. */
    gp_status (*nonfinite)(gp_device *dev, const float *x, int64_t n, int *out);
    /* SGD with momentum, in place, all vectors of length n:
     *   g' = g + wd * w;  v = mu * v + g';
     *   w -= lr * (nesterov ? g' + mu * v : v)                  (PyTorch)
     * v is NULL for plain SGD (mu = 0, no Nesterov: w -= lr * g'), which
     * keeps no state. */
    gp_status (*sgd_update)(gp_device *dev, float *w, const float *g, float *v,
                            int64_t n, float lr, float mu, float wd, int nesterov);

    /* --- dense math --- */
    /* Row-major C(M,N) = alpha * op(A) * op(B) + beta * C. */
    gp_status (*gemm)(gp_device *dev, int trans_a, int trans_b, int64_t m,
                      int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc);
    /* y(N,F) += bias(F) broadcast over rows (rows = N, cols = F). */
    gp_status (*add_bias_rows)(gp_device *dev, float *y, const float *bias,
                               int64_t rows, int64_t cols);
    /* db(F) += column sums of dy(N,F). */
    gp_status (*sum_rows)(gp_device *dev, const float *dy, float *db,
                          int64_t rows, int64_t cols);

    /* --- convolution --- y = conv(x, w) + b;  w is (K, C, KH, KW) */
    gp_status (*conv_fwd)(gp_device *dev, const gp_conv_desc *d, const float *x,
                          const float *w, const float *b, float *y);
    gp_status (*conv_bwd_data)(gp_device *dev, const gp_conv_desc *d,
                               const float *w, const float *dy, float *dx);
    /* dw += ..., db += ... (db may be NULL when !has_bias) */
    gp_status (*conv_bwd_weights)(gp_device *dev, const gp_conv_desc *d,
                                  const float *x, const float *dy, float *dw,
                                  float *db);

    /* --- pooling --- ws: backend workspace for max pooling, at least
     * pool_ws_bytes(d) bytes (may be 0); written by fwd, read by bwd.
     * pool_ws_bytes optional: 0 (the backend needs no workspace). */
    size_t (*pool_ws_bytes)(gp_device *dev, const gp_pool_desc *d);
    gp_status (*pool_fwd)(gp_device *dev, const gp_pool_desc *d, const float *x,
                          float *y, void *ws);
    /* pool_bwd: dx = (beta 0) the gradient of dy; average pooling reads
     * neither x nor y (either may be NULL: the layer keeps neither), max
     * pooling reads what its backend needs of x, y and ws. */
    gp_status (*pool_bwd)(gp_device *dev, const gp_pool_desc *d, const float *x,
                          const float *y, const float *dy, float *dx, const void *ws);

    /* --- batch normalisation ---
     * fwd_train: batch statistics; writes y, mean(C) and var(C) (biased, for
     * normalisation), all outputs overwritten.
     * fwd_infer: normalises with given mean/var.
     * bwd: dx =; dgamma +=, dbeta += (accumulate). mean/var are those of fwd.
     * gamma and beta may be NULL (1 and 0: no affine part), and so may
     * dgamma and dbeta (not computed): instance norm runs on these slots
     * without parameters (layers/unet.c). */
    gp_status (*bn_fwd_train)(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, float *y,
                              float *mean, float *var);
    gp_status (*bn_fwd_infer)(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta,
                              const float *mean, const float *var, float *y);
    gp_status (*bn_bwd)(gp_device *dev, const gp_bn_desc *d, const float *x,
                        const float *gamma, const float *beta, const float *mean,
                        const float *var, const float *dy, float *dx, float *dgamma,
                        float *dbeta);

    /* --- activations --- */
    gp_status (*relu_fwd)(gp_device *dev, const float *x, float *y, int64_t n);
    /* dx = dy * (y > 0); y is relu's output */
    gp_status (*relu_bwd)(gp_device *dev, const float *y, const float *dy,
                          float *dx, int64_t n);
    /* Row-wise log-softmax of x(rows, cols). */
    gp_status (*log_softmax)(gp_device *dev, const float *x, float *y,
                             int64_t rows, int64_t cols);
    /* Cross-entropy over rows of logits(rows, cols) against labels(rows)
     * (float class ids): *loss_sum = sum -log softmax[label] (double),
     * *correct = rows whose first argmax is the label; if dlogits is not NULL
     * it is set to (softmax - onehot) * scale.  With label smoothing eps
     * (smoothing > 0) the target is smoothed (gp_ew_xent_loss_ls,
     * gp_ew_xent_grad_ls); 0 is the plain loss, bit for bit.  A label
     * outside [0, cols) sets *bad_row to its row (else -1) and returns
     * GP_OK without output.  Rows are ld >= cols floats apart in logits
     * and dlogits: the columns [cols, ld) of logits take no part (no
     * probability, not an argmax) and those of dlogits are set to 0 (a
     * padded vocabulary, model.gpt.vocab_pad). */
    gp_status (*xent)(gp_device *dev, const float *logits, const float *labels,
                      int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                      float *dlogits, double *loss_sum, int64_t *correct, int64_t *bad_row);
    /* Dropout mask: mask[i] = (u >= p) ? 1 / (1 - p) : 0 with
     * u = gp_rng_uniform(seed, stream, first + i), so the mask of any
     * sub-range equals the same range of the whole (micro-batch splits and
     * recomputation draw identical masks).  The per-element formula lives in
     * backend/elementwise.h, shared with the CUDA kernels. */
    gp_status (*dropout_mask)(gp_device *dev, float *mask, int64_t n, float p,
                              uint64_t seed, uint64_t stream, uint64_t first);
    /* y = a * b elementwise (dropout applies its scaled mask with it) */
    gp_status (*mul)(gp_device *dev, const float *a, const float *b, float *y,
                     int64_t n);

    /* --- collectives (optional; appended last so older tables stay valid) ---
     * Called by every device of `comm`, each from its own worker thread, with
     * the same n: buf (this device's, n floats) becomes the elementwise sum
     * over the group (allreduce) or root's buffer (broadcast; root is a rank
     * of comm).  Asynchronous on the compute stream like the math.
     * NULL: gp_dev_allreduce / gp_dev_broadcast return GP_ERR_UNSUPPORTED.
     * CPU: backend/cpu/cpu_comm.c (reduce-scatter + all-gather between the
     * ranks' worker threads, sums in rank order 0..n-1, so every rank gets
     * bitwise the same result). */
    gp_status (*allreduce)(gp_device *dev, gp_comm *comm, float *buf, int64_t n);
    gp_status (*broadcast)(gp_device *dev, gp_comm *comm, float *buf, int64_t n,
                           int root);

    /* --- synchronised batch norm (optional; appended last) ---
     * The pieces of a batch norm whose statistics and gradient sums are
     * reduced across devices between the calls (layers/batchnorm.c, SyncBN).
     * bn_stats: mean(C) and biased var(C) of x, as bn_fwd_train computes
     * them, without normalising (normalise with bn_fwd_infer).
     * bn_bwd_sums: sums(2, C): sums[c] = sum dy, sums[C + c] =
     * sum dy (x - mean[c]) over this device's (N, S) values of channel c
     * (dy masked first where d->relu: gamma, beta, var say where).
     * bn_bwd_apply: with sums(2, C) over all devices, covering `count` values
     * per channel, dx = gamma inv (dy - sum dy / count - (x - mean) inv^2
     * sum dy (x - mean) / count)   (gp_ew_bn_bwd_coeffs; dx =); and if dgamma
     * is not NULL, from this device's own `local` sums(2, C):
     * dgamma += local dy (x - mean) inv, dbeta += local dy (accumulate).
     * CPU: cpu_bn.c; CUDA: per-channel kernels in cuda_kernels.cu.  NULL:
     * the gp_dev_bn_* wrappers return GP_ERR_UNSUPPORTED, so `sync: true`
     * fails with a message on such a backend. */
    gp_status (*bn_stats)(gp_device *dev, const gp_bn_desc *d, const float *x,
                          float *mean, float *var);
    gp_status (*bn_bwd_sums)(gp_device *dev, const gp_bn_desc *d, const float *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const float *dy, float *sums);
    gp_status (*bn_bwd_apply)(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const float *dy, const float *sums,
                              double count, float *dx, const float *local, float *dgamma,
                              float *dbeta);

    /* --- sharded collectives (optional; appended last) ---
     * For the sharded optimizer update of data parallelism: buf (n floats,
     * the same n on every rank) is cut into comm->n chunks by gp_comm_chunk.
     * reduce_scatter: afterwards chunk `rank` of this rank's buf holds the sum
     * over the ranks of their chunk `rank`; the other chunks are unspecified.
     * all_gather: afterwards chunk q of every rank's buf equals rank q's.
     * Together they are an all-reduce; between them each rank updates only
     * its own chunk, so the update's work and traffic are divided by n.
     * CPU: cpu_comm.c (sums in rank order, like allreduce); CUDA: NCCL
     * (grouped ncclReduce / ncclBroadcast per chunk, in place, so uneven
     * chunks work).  NULL: callers fall back to allreduce + full update. */
    gp_status (*reduce_scatter)(gp_device *dev, gp_comm *comm, float *buf, int64_t n);
    gp_status (*all_gather)(gp_device *dev, gp_comm *comm, float *buf, int64_t n);

    /* --- host buffers for uploads (optional; appended last) ---
     * Page-locked host memory that copy_h2d reads by DMA without staging
     * (CUDA: cudaHostAlloc, portable to every GPU; the data loader's batch
     * buffers).  NULL: gp_dev_host_alloc falls back to aligned malloc. */
    gp_status (*host_alloc)(gp_device *dev, size_t bytes, void **out);
    void (*host_free)(gp_device *dev, void *ptr);

    /* --- the sharded SGD step as one collective (optional; appended last) ---
     * For one parameter (w, g, v of n floats on every rank): chunk `rank`
     * of g summed over the ranks (in rank order), the SGD update of chunk
     * `rank` of w and v with that sum (sgd_update's formula), and the
     * updated chunk written into every rank's w.  The result is that of
     * reduce_scatter(g); sgd_update on chunk `rank`; all_gather(w) — bitwise
     * on the CPU — but the CPU does it in one pass, streaming the new w
     * into the peers' buffers: 2R + 3 passes over a chunk's memory instead
     * of 3R + 4, 7 instead of 10 for R = 2 (cpu_comm.c).  v is this
     * rank's chunk of the momentum alone (gp_comm_chunk's hi - lo floats,
     * v[0] for element lo: each rank keeps only its chunk, ZeRO stage 1;
     * NULL: as sgd_update); afterwards g is unspecified (the CPU
     * leaves it unchanged, the composition holds the sum in chunk `rank`).
     * NULL: gp_dev_sharded_sgd composes the three. */
    gp_status (*sharded_sgd)(gp_device *dev, gp_comm *comm, float *w, float *g, float *v,
                             int64_t n, float lr, float mu, float wd, int nesterov);

    /* --- a host barrier over the group (optional; appended last) ---
     * Returns once every rank has called it (GP_ERR_CANCELLED after
     * comm->abort).  NULL: gp_dev_barrier all-reduces one float and
     * synchronizes the device instead; the abort must then end the pending
     * all-reduce (NCCL: ncclCommAbort, cuda_device.c), or a rank would wait
     * forever for one that failed. */
    gp_status (*barrier)(gp_device *dev, gp_comm *comm);

    /* --- a strided 4-D copy on the compute stream (appended last) ---
     * dst[a ds0 + b ds1 + c ds2 + d ds3] = src[a ss0 + b ss1 + c ss2 + d ss3]
     * for every (a, b, c, d) < dims (strides and dims in elements of `es`
     * bytes, 4 or 2: FP32 or bf16, moved as bits; dst and src on this
     * device, not overlapping).  Concatenation along channels, zero padding
     * (after a fill) and their gradients' slices.  NULL: gp_dev_copy_box
     * returns GP_ERR_UNSUPPORTED. */
    gp_status (*copy_box)(gp_device *dev, void *dst, const int64_t dst_stride[4],
                          const void *src, const int64_t src_stride[4],
                          const int64_t dims[4], size_t es);
    /* --- U-Net layers and loss (optional; appended last) ---
     * leaky_relu_fwd: y = x > 0 ? x : slope x, slope >= 0; a NaN stays NaN
     * (gp_ew_leaky_relu).
     * leaky_relu_bwd: dx = y > 0 ? dy : slope dy, y being leaky_relu_fwd's
     * output: with slope >= 0, y > 0 exactly where x > 0.
     * mul_rows: y(r, j) = x(r, j) * s(r) for x, y (rows, cols), s (rows);
     * y may be x.  dropout2d applies its (N*C) mask to the H*W planes.
     * upsample_fwd: nearest-neighbour upsampling of x (n, c, h, w) by the
     * integer `scale` >= 1: y (n, c, h*scale, w*scale) with
     * y[., ., i, j] = x[., ., i / scale, j / scale] (PyTorch's
     * Upsample(scale_factor, 'nearest')).
     * upsample_bwd: its adjoint, dx (n, c, h, w) = (overwritten) the sum of
     * dy over each scale x scale block.
     * bce_logits: binary cross-entropy with logits, element by element, of
     * z (n) against targets t (n) in [0, 1]: *loss_sum = sum max(z, 0) - z t
     * + log(1 + exp(-|z|)) (double); *correct = elements with (z > 0) ==
     * (t > 0.5); if dz is not NULL it is set to (sigmoid(z) - t) * scale
     * (gp_ew_bce_*).  A target outside [0, 1] (or NaN) sets *bad to its
     * first index (else -1) and returns GP_OK without output, like xent.
     * CPU: cpu_math.c, cpu_upsample.c (loops: oneDNN's resampling backward
     * is ~10x slower there); CUDA: cuda_kernels.cu.  NULL: the gp_dev_* wrappers return
     * GP_ERR_UNSUPPORTED naming the device and the layer that needs it. */
    gp_status (*leaky_relu_fwd)(gp_device *dev, const float *x, float *y, int64_t n,
                                float slope);
    gp_status (*leaky_relu_bwd)(gp_device *dev, const float *y, const float *dy, float *dx,
                                int64_t n, float slope);
    gp_status (*mul_rows)(gp_device *dev, const float *x, const float *s, float *y,
                          int64_t rows, int64_t cols);
    gp_status (*upsample_fwd)(gp_device *dev, const float *x, float *y, int64_t n, int64_t c,
                              int64_t h, int64_t w, int64_t scale);
    gp_status (*upsample_bwd)(gp_device *dev, const float *dy, float *dx, int64_t n, int64_t c,
                              int64_t h, int64_t w, int64_t scale);
    gp_status (*bce_logits)(gp_device *dev, const float *z, const float *t, int64_t n,
                            float scale, float *dz, double *loss_sum, int64_t *correct,
                            int64_t *bad);
    /* --- stage-to-stage copies (optional; appended last) ---
     * Enqueue a copy of `bytes` from src (memory of src_dev, a device of
     * this backend, possibly this one) into dst (ours) on this device's copy
     * stream, behind `after` (an event of src_dev recorded after the work
     * that wrote src; NULL: nothing to wait for), and record `done` (an
     * event of ours; NULL: none) on the copy stream behind it.  Returns
     * without waiting.  Neither compute stream is fenced: the reader waits
     * for `done` (gp_dev_event_wait) before it reads dst, and a free of src
     * or dst on either device is held back until the copy has finished
     * (the allocator's stream-ordered frees; torchgpipe's record_stream).
     * GP_ERR_UNSUPPORTED for a source it cannot read (another backend's
     * memory): the wrapper then waits for `after` on the host and copies
     * synchronously.  NULL: gp_dev_copy_async does the same for every
     * copy. */
    gp_status (*copy_async)(gp_device *dev, void *dst, gp_device *src_dev, const void *src,
                            size_t bytes, void *after, void *done);
    /* --- the NaN check without a host wait (optional; appended last) ---
     * *flag (one float of this device's memory) = 1 if any x[i] is NaN or
     * Inf; left as it is otherwise, so one flag gathers many tensors and is
     * read once.  On the compute stream.  NULL: gp_dev_nonfinite_or uses
     * nonfinite (a host wait) and fills the flag. */
    gp_status (*nonfinite_or)(gp_device *dev, const float *x, int64_t n, float *flag);
    /* --- a step without host waits (optional; appended last) ---
     * upload_async: enqueue a copy of `bytes` of host memory src into dst
     * (ours) on the copy stream and record `done` (NULL: none) behind it;
     * the reader waits for `done` (gp_dev_event_wait).  src must stay
     * valid and unchanged until the device is synchronized (the step's
     * end).  bytes 0 copies nothing and records `done` on the copy stream
     * behind what is queued there (the executor puts a copy's `done` behind
     * its device-time end marker so).  NULL: gp_dev_upload_async uploads
     * synchronously (a host wait; none for 0 bytes) and records `done` on
     * the compute stream. */
    gp_status (*upload_async)(gp_device *dev, void *dst, const void *src, size_t bytes,
                              void *done);
    /* bn_merge: Chan's parallel merge of a micro-batch's per-channel
     * statistics (nb values per channel, mean(C) and biased var(C), float)
     * into a step's accumulator of na values so far, kept on the device in
     * double: mean_acc(C), m2_acc(C) (sum of squared deviations):
     *   delta = mean - mean_acc; mean_acc += delta nb / (na + nb);
     *   m2_acc += var nb + delta^2 na nb / (na + nb).
     * The counts are the host's (it knows them without reading anything).
     * bn_commit: the running statistics from the accumulator of `count`
     * values, PyTorch style, in double, then the accumulator zeroed:
     *   rmean = (1 - m) rmean + m mean_acc;
     *   rvar = (1 - m) rvar + m m2_acc / (count - 1).
     * Both on the compute stream.  NULL: the wrappers do the same on the
     * host (downloads and uploads: host waits). */
    gp_status (*bn_merge)(gp_device *dev, int64_t c, double *mean_acc, double *m2_acc,
                          double na, double nb, const float *mean, const float *var);
    gp_status (*bn_commit)(gp_device *dev, int64_t c, float *rmean, float *rvar,
                           double *mean_acc, double *m2_acc, double momentum, double count);
    /* xent_dev, bce_logits_dev: xent and bce_logits with their results
     * written to *out in this device's memory (gp_loss_result) instead of
     * returned to the host: enqueued, no host wait.  A bad label or target
     * sets out->bad (else -1) and leaves loss_sum and correct 0.  NULL: the
     * wrappers call xent / bce_logits (a host wait) and upload the result. */
    gp_status (*xent_dev)(gp_device *dev, const float *logits, const float *labels,
                          int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                          float *dlogits, gp_loss_result *out);
    gp_status (*bce_logits_dev)(gp_device *dev, const float *z, const float *t, int64_t n,
                                float scale, float *dz, gp_loss_result *out);
    /* --- device-time markers (optional; appended last) ---
     * mark: enqueue on the compute stream (copy false) or the copy stream
     * a marker that takes the time at which the stream reaches it (all
     * work enqueued before it on that stream done); *out is the backend's
     * handle, valid until mark_reset.  No host wait.
     * mark_time: a marker's time in gp_now() seconds (the host's clock, so
     * devices share one axis); only once the device has been synchronized
     * past it (after a step).  May wait on the host (CUDA: one event to
     * anchor the device's clock to the host's); such waits are not counted
     * in host_waits, which measures the step.
     * mark_reset: forget every marker (before a step that takes them).
     * NULL: gp_dev_mark gives NULL markers and timelines keep host times. */
    gp_status (*mark)(gp_device *dev, bool copy, void **out);
    gp_status (*mark_time)(gp_device *dev, void *mark, double *seconds);
    void (*mark_reset)(gp_device *dev);
    /* --- channels to another process's device (optional; appended last) ---
     * A channel carries one flow of a pipeline between two processes (one
     * stage's activations to the next, or gradients back, or one skip's
     * tensor or gradient), in one direction, in the order both sides issue
     * their operations: the k-th send matches the k-th receive, and the
     * data must have the same size.  Each end has a stream of its own, so
     * a receive that waits for its peer holds back nothing else on the
     * device (no other flow, no upload), and a flow's rendezvous cannot
     * wait on another flow's: that is what keeps any schedule free of
     * deadlock across processes (pipeline.c, "Channels").
     * chan_open: this process's end (d->sender: the sending one); blocks
     * until the peer opens its end (both open their channels in one
     * order).  chan_send: enqueue a send of n floats at buf behind `after`
     * (an event of ours recorded after the work that wrote buf; NULL: none)
     * and record `done` behind it, returning without waiting.  The caller
     * keeps buf until `done` has completed (event_query): a send ends only
     * when its peer's receive has run, and a block freed before that and
     * reused by a receive would make the receive wait for the peer, which
     * can wait for us: a deadlock through the allocator.  chan_recv:
     * enqueue a receive of n floats into buf (just allocated) behind the
     * compute stream's work so far and record `done` behind it; the reader
     * waits for done.  chan_close: the end closed (abort: without waiting
     * for what is queued, after a failure, and a transfer under way given
     * up; either way nothing of the channel runs once it returns).  CUDA: a 2-rank NCCL communicator and a
     * stream per channel (ncclSend / ncclRecv).  CPU (streams = threads
     * only): a thread per channel running d->host_send / d->host_recv, the
     * process transport's blocking rendezvous (procs.c).  NULL: the
     * executor stages through host memory over MPI instead (procs.h). */
    gp_status (*chan_open)(gp_device *dev, const struct gp_chan_desc *d, void **out);
    gp_status (*chan_send)(gp_device *dev, void *ch, const float *buf, int64_t n, void *after,
                           void *done);
    gp_status (*chan_recv)(gp_device *dev, void *ch, float *buf, int64_t n, void *done);
    void (*chan_close)(gp_device *dev, void *ch, bool abort);
    /* chan_id: the bytes (at most GP_CHAN_ID_BYTES) both ends of a new
     * channel open it with: made by the sender, passed to the receiver by
     * the caller (NCCL: ncclGetUniqueId).  NULL: none needed. */
    gp_status (*chan_id)(gp_device *dev, void *id, size_t *bytes);
    /* event_query: *done whether the event's latest record has completed,
     * without waiting (cudaEventQuery).  NULL: gp_dev_event_query waits
     * (event_sync) and says true. */
    gp_status (*event_query)(gp_device *dev, void *ev, bool *done);
    /* gemm_wb: the gemm slot where B is a layer's weights, which do not
     * change while the device's weights are frozen (gp_dev_freeze_weights),
     * so a backend may keep B converted across calls (CPU bf16: the bf16
     * copy, once per step instead of once per micro-batch).  NULL: gemm. */
    gp_status (*gemm_wb)(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                         int64_t ldb, float beta, float *c, int64_t ldc);
    /* uid: what tells this device from any other of its machine, whatever
     * CUDA_VISIBLE_DEVICES numbers it (CUDA: the PCI bus id), into buf (len
     * bytes).  NULL: its name. */
    gp_status (*uid)(gp_device *dev, char *buf, size_t len);
    /* sgd_multi: sgd_update on each of the n parts (a stage's parameters,
     * or their chunks under a sharded update), bitwise the same as n calls,
     * in one pass: one kernel launch per device per step on a GPU instead
     * of one per parameter (issue 15).  NULL: gp_dev_sgd_multi calls
     * sgd_update per part. */
    gp_status (*sgd_multi)(gp_device *dev, const gp_update_part *parts, int n, float lr,
                           float mu, int nesterov);
    /* dropout_apply: y[i] = x[i] * mask[i] with dropout_mask's mask drawn
     * on the fly, bitwise x times the stored mask; y may be x.  Forward
     * (x the input) and backward (x = dy) alike, so a dropout layer keeps
     * no mask: the counter-based draw replays it (issue 15: mask and
     * multiply in one pass).  NULL: gp_dev_dropout_apply draws the mask
     * into a temporary and multiplies. */
    gp_status (*dropout_apply)(gp_device *dev, const float *x, float *y, int64_t n, float p,
                               uint64_t seed, uint64_t stream, uint64_t first);
    /* bf16_pack: dst[i] = gp_ew_bf16_bits(src[i]) for n values, into n
     * 16-bit patterns (2 n bytes at dst); bf16_unpack: dst[i] =
     * gp_ew_bf16_value(src[i]), n patterns into n floats.  On the compute
     * stream; dst and src do not overlap.  What carries a pipeline copy in
     * bfloat16 (pipeline.copy_precision: bf16): the sender packs, half the
     * bytes travel, the receiver unpacks. */
    gp_status (*bf16_pack)(gp_device *dev, uint16_t *dst, const float *src, int64_t n);
    gp_status (*bf16_unpack)(gp_device *dev, float *dst, const uint16_t *src, int64_t n);
    /* act_block (optional; NULL: every layout plain): the channel block B
     * in which this device's convolution d computes its output (output:
     * y and dy) or its input (!output: x and dx), nChw<B>c, or 0 when it
     * computes that side in another layout or the plain one.  Independent
     * of d->n and of d's own xblk / yblk.  A block only spares the reorders around
     * the convolution: a conv, pool or batch norm given any block this
     * backend takes computes the same bits as on the plain layout (the
     * CPU's: the same kernels, and batch norm's sums in one order for every
     * layout, cpu_bn.c). */
    int64_t (*act_block)(gp_device *dev, const gp_conv_desc *d, bool output);
    /* copy_to_host (optional; NULL: staged through copy_d2h and a
     * synchronize): copy `bytes` of this device's memory src into host
     * memory dst once `after` (an event of this device; NULL: none) has
     * completed, and return when dst holds them.  Callable from any
     * thread while this device's own worker runs: it uses none of the
     * device's streams or staging buffers and waits for nothing else
     * queued there.  gp_dev_copy_async uses it for a copy from a GPU
     * stage into a CPU stage, on the receiving CPU worker. */
    gp_status (*copy_to_host)(gp_device *dev, void *dst, const void *src, size_t bytes,
                              void *after);
    /* linear_fwd (optional): a linear layer's forward, y(n, out) =
     * x(n, in) w(out, in)^T, plus bias(out) on every row unless bias is
     * NULL, then the relu unless !relu: gemm_wb (w the weights) followed
     * by add_bias_rows and relu_fwd in place (bit for bit on the CPU; on a
     * GPU within the product's rounding, as its algorithm may differ), in
     * one call: the
     * bias and relu in the product's epilogue (cuBLASLt) or in one pass
     * over y (CPU) instead of two (issue 15).  NULL: gp_dev_linear_fwd
     * makes those three calls. */
    gp_status (*linear_fwd)(gp_device *dev, int64_t n, int64_t out, int64_t in, const float *x,
                            const float *w, const float *bias, bool relu, float *y);
    /* adam_multi: Adam or AdamW (a->decoupled) on each of the n parts, one
     * gp_ew_adam per element, one pass (one launch on a GPU).  NULL: the
     * device cannot run Adam (gp_dev_adam_multi says so). */
    gp_status (*adam_multi)(gp_device *dev, const gp_update_part *parts, int n,
                            const gp_adam_step *a);
    /* sumsq_multi: out[t] (host) = sumsq of xs[t] (ns[t] values), t < n,
     * each the bits sumsq gives, read back together: one host wait for n
     * tensors.  ns[t] may be 0 (out[t] = 0; xs[t] is not read and may be
     * NULL).  NULL: gp_dev_sumsq_multi calls sumsq n times. */
    gp_status (*sumsq_multi)(gp_device *dev, const float *const *xs, const int64_t *ns, int n,
                             double *out);
    /* norm_leaky_bwd: the backward of a norm without affine parameters
     * (bn_fwd_train's with gamma and beta NULL; instance norm as d = {1,
     * N*C, H*W}, plain layout) whose output y went through a leaky relu of
     * `slope` > 0, from that relu's output z = gp_ew_leaky_relu(y, slope)
     * (from_z) or from y itself, never from the norm's input: with
     * y' = gp_ew_leaky_relu_inv(z, slope) (z recomputed from y first when
     * !from_z, so both give the same bits) and inv = 1 / sqrt(var + eps),
     *   dx = inv (dy - sum(dy) / S - y' sum(dy y') / S)   (dx =)
     * per channel of S values, dy the gradient at the norm's output (the
     * relu's backward done already).  var is bn_fwd_train's.  So the relu
     * may run in place over the norm's output and the norm's input need
     * not be kept (InPlace-ABN's trick; layers/unet.c).  Every backend
     * has it: the layer rules (gp_layer_specs_link) free the norm's input
     * whatever the device, so NULL fails that norm's backward with
     * GP_ERR_UNSUPPORTED naming the device. */
    gp_status (*norm_leaky_bwd)(gp_device *dev, const gp_bn_desc *d, const float *yz,
                                bool from_z, float slope, const float *var, const float *dy,
                                float *dx);
    /* --- the NaN check of many tensors at once (optional; appended last) ---
     * nonfinite_or over xs[i] (ns[i] values), i < count, into one flag: on a
     * GPU one launch for up to GP_NONFINITE_BATCH tensors instead of one
     * each (a step's check of every parameter was ~300 tiny launches on
     * ResNet-101).  NULL: gp_dev_nonfinite_or_many calls nonfinite_or per
     * tensor. */
    gp_status (*nonfinite_or_many)(gp_device *dev, const float *const *xs, const int64_t *ns,
                                   int count, float *flag);
    /* --- causal multi-head self-attention (optional; appended last) ---
     * attn_fwd: x (b, t, 3c) holds q, k, v side by side on its last axis
     * (GPT-2's c_attn output); head h's q is x[., ., h d .. (h + 1) d), its
     * k the same at c + h d, its v at 2c + h d, d = c / heads.  With
     * kv_heads < heads (grouped-query attention; kv_heads dividing heads)
     * x is (b, t, c + 2 kv_heads d): k's kv_heads heads at c, v's at
     * c + kv_heads d, query head h reading k and v head h / (heads /
     * kv_heads) in place; kv_heads == heads is the layout above.  Writes
     * y (b, t, c) = softmax(q k^T / sqrt(d), causal: key j <= query i) v
     * per head, heads side by side, and lse (b, heads, t), each row's
     * log-sum-exp of its scaled scores (NULL: not written, eval).  Never
     * holds a t x t matrix: tiles of queries and keys, online softmax.
     * attn_bwd: dx (x's shape) = (overwritten) dq, dk, dv (a shared k or
     * v head's the sum over its query heads, in order), from x, y, lse
     * (attn_fwd's) and dy (b, t, c); the probabilities recomputed tile by
     * tile.  Both are deterministic: each (batch row, head) is computed by
     * one thread in a fixed order, so any split of b and any thread count
     * give the same bits.  CPU: cpu_attention.c; CUDA: cuda_kernels.cu (a
     * thread per row, the same rule, not the CPU's bits).  NULL: the
     * gp_dev_attn_* wrappers return GP_ERR_UNSUPPORTED naming the device. */
    gp_status (*attn_fwd)(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                          int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
    gp_status (*attn_bwd)(gp_device *dev, const float *x, const float *y, const float *lse,
                          const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                          int64_t kv_heads, int64_t c);
    /* --- Transformer layers (optional; appended last) ---
     * gelu_fwd: y = gp_ew_gelu(x) (GPT-2's tanh form), element by element;
     * y may be x.  gelu_bwd: dx = gp_ew_gelu_bwd(x, dy), from the input x
     * (dx =).  CPU: gpipe's own loop in the sigmoid form x sigmoid(2u)
     * (cpu_math.c, vectorised through gp_cpu_exp; oneDNN's gelu_tanh from
     * 2026-11-26 to 11-30, a loop over elementwise.h's tanhf before): its
     * values differ from the tanh form's by an ulp or two, within what
     * test_layers and test_cuda allow; CUDA: cuda_kernels.cu.
     * NULL: the gp_dev_* wrappers return GP_ERR_UNSUPPORTED naming the
     * device and the layer. */
    gp_status (*gelu_fwd)(gp_device *dev, const float *x, float *y, int64_t n);
    gp_status (*gelu_bwd)(gp_device *dev, const float *x, const float *dy, float *dx, int64_t n);
    /* layer_norm_fwd: each of the `rows` rows of x (rows, c) normalised
     * over its c values (biased variance, the sums in double), then
     * y = (x - mean) * rstd * w + b, w and b (c); mean and rstd (rows) are
     * written in FP32 for the backward (rstd = gp_ew_ln_rstd).
     * layer_norm_bwd_data: dx (rows, c) = rstd (g - mean(g) - xhat
     * mean(g xhat)) per row, g = dy w, xhat = (x - mean) rstd (dx =).
     * layer_norm_bwd_weights: dw += sum over rows of dy xhat, db += sum of
     * dy (each column's sum in double, in row order: no atomics).  CPU:
     * cpu_math.c (loops, a row or a column per task); CUDA: cuda_kernels.cu
     * (a block per row; a thread per column for the weights).  NULL: the
     * gp_dev_* wrappers return GP_ERR_UNSUPPORTED naming the device. */
    gp_status (*layer_norm_fwd)(gp_device *dev, const float *x, const float *w, const float *b,
                                float *y, float *mean, float *rstd, int64_t rows, int64_t c,
                                float eps);
    gp_status (*layer_norm_bwd_data)(gp_device *dev, const float *x, const float *w,
                                     const float *mean, const float *rstd, const float *dy,
                                     float *dx, int64_t rows, int64_t c);
    gp_status (*layer_norm_bwd_weights)(gp_device *dev, const float *x, const float *mean,
                                        const float *rstd, const float *dy, float *dw,
                                        float *db, int64_t rows, int64_t c);
    /* embed_fwd: y (n, t, c) = wte[ids[r]] + wpe[r % t] for each of the
     * n*t rows r, ids (n, t) token ids stored as floats, wte (vocab, c),
     * wpe (>= t, c), or NULL: no position table (Llama's rotary
     * positions; embed_bwd's dwpe NULL then).  *bad (host) = the first r whose id is not a whole
     * number in [0, vocab) (NaN included), else -1; y is then not written.
     * A GPU waits for that flag (one host wait per call, as xent's).
     * embed_bwd: dwte[ids[r]] += dy[r], dwpe[r % t] += dy[r] (dW +=), each
     * element summed in row order (no atomics: the same bits every run;
     * dwte has vocab rows: a GPU gives each its own block);
     * the ids are those embed_fwd accepted.  y and dy are of element type
     * dt (GP_F32, or GP_BF16: y the FP32 sum rounded once, dy widened as
     * it is read; the storage adapter's bits without its passes), as a
     * slot learns its types (shared/DESIGN.md).  CPU: cpu_math.c; CUDA:
     * cuda_kernels.cu.  NULL: GP_ERR_UNSUPPORTED from the wrappers. */
    gp_status (*embed_fwd)(gp_device *dev, const float *ids, const float *wte, const float *wpe,
                           gp_dtype dt, void *y, int64_t n, int64_t t, int64_t c, int64_t vocab,
                           int64_t *bad);
    gp_status (*embed_bwd)(gp_device *dev, const float *ids, gp_dtype dt, const void *dy,
                           float *dwte, float *dwpe, int64_t n, int64_t t, int64_t c,
                           int64_t vocab);
    /* --- activations on bf16 storage (optional; appended last) ---
     * act_bf16: an activation of kind `kind` on bf16 values (16-bit
     * patterns: train.activations: bf16) in one pass, FP32 math on the
     * widened values and one rounding of each result, as elementwise.h's
     * gp_ew_* compute them:
     *   forward  (dy NULL):  out[i] = bits(f(value(xy[i])))
     *   backward:            out[i] = bits(f'(value(xy[i]), value(dy[i])))
     * with xy the output y for relu and leaky relu (their backward reads
     * it) and the input x for GELU; slope is the leaky relu's.  The bits
     * are the storage adapter's (widen, the FP32 slot, round once) without
     * its two extra passes and FP32 temporaries.  out may be xy.
     * act_bf16_kinds: bit k set where act_bf16 takes kind k; a kind left
     * out goes through the adapter (CPU: GELU, whose FP32 slot is oneDNN's
     * and rounds its own way).  NULL / 0: every kind through the adapter. */
    gp_status (*act_bf16)(gp_device *dev, gp_act_kind kind, const uint16_t *xy,
                          const uint16_t *dy, uint16_t *out, int64_t n, float slope);
    unsigned act_bf16_kinds;
    /* attn_fwd_bf16, attn_bwd_bf16: attn_fwd / attn_bwd with x, y, dy and
     * dx in bf16 (lse FP32), bit for bit the storage adapter's (x widened,
     * attn_fwd, y rounded; the same for the backward's dx), without its
     * passes where the kernel reads bf16 itself (CUDA: cuDNN's fused
     * attention, whose operands are bf16 anyway; elsewhere it widens and
     * rounds inside).  NULL: the attention layer goes through the adapter
     * on bf16 storage. */
    gp_status (*attn_fwd_bf16)(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                               int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
    gp_status (*attn_bwd_bf16)(gp_device *dev, const uint16_t *x, const uint16_t *y,
                               const float *lse, const uint16_t *dy, uint16_t *dx, int64_t b,
                               int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
    /* bn_fwd_train_bf16, bn_fwd_infer_bf16, bn_bwd_bf16: bn_fwd_train,
     * bn_fwd_infer and bn_bwd with x, y, dy and dx in bf16 (gamma, beta,
     * mean, var and the parameter gradients FP32), bit for bit the storage
     * adapter's (x and dy widened, the FP32 slot, y and dx rounded once),
     * relu (gp_bn_desc.relu) and the blocked layouts included; d->add must
     * be NULL (a residual sum on bf16 storage comes as d->add16, forward
     * only).  CPU: the FP32 slots' loops on the bf16 tensors, widening on
     * load and rounding on store (cpu_bn.c).  NULL: batch norm goes
     * through the adapter. */
    gp_status (*bn_fwd_train_bf16)(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, uint16_t *y,
                                   float *mean, float *var);
    gp_status (*bn_fwd_infer_bf16)(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, const float *mean,
                                   const float *var, uint16_t *y);
    gp_status (*bn_bwd_bf16)(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const uint16_t *dy, uint16_t *dx,
                             float *dgamma, float *dbeta);
    /* pool_fwd_bf16, pool_bwd_bf16: pool_fwd and pool_bwd with x, y, dy and
     * dx in bf16 and the same workspace (pool_ws_bytes), bit for bit the
     * storage adapter's, every kind and layout included.  CPU: each plane
     * widened into an FP32 tile of its thread's (cpu_pool.c).  NULL: the
     * pooling layers go through the adapter. */
    gp_status (*pool_fwd_bf16)(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               uint16_t *y, void *ws);
    gp_status (*pool_bwd_bf16)(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               const uint16_t *y, const uint16_t *dy, uint16_t *dx,
                               const void *ws);
    /* add_bf16: y[i] = bits(value(a[i]) + value(b[i])) for n bf16 values,
     * the FP32 sum rounded once (y may be a or b): the add layer's forward
     * and two gradients of one activation added (gp_layers_accumulate) on
     * bf16 storage in one pass.  NULL: both widen, add and round. */
    gp_status (*add_bf16)(gp_device *dev, const uint16_t *a, const uint16_t *b, uint16_t *y,
                          int64_t n);
    /* conv_fwd_bf16, conv_bwd_data_bf16, conv_bwd_weights_bf16: conv_fwd,
     * conv_bwd_data and conv_bwd_weights with x, y, dy and dx in bf16
     * (weights, bias and their gradients FP32), for a convolution the
     * device runs in bf16 (gp_dev_conv_bf16_takes): its operands are bf16
     * anyway, so they are read and written as they are, without the pack
     * and widen of either side, bit for bit the storage adapter's (CUDA:
     * cuDNN reads x and dy and writes y and dx in bf16; the bias is added
     * to y in one pass, rounded once; CPU: oneDNN's bf16 primitives on
     * bf16 user memory, plain or channel-blocked, y and dx rounded once
     * from the FP32 sums with the bias added in FP32).  NULL: the
     * adapter. */
    gp_status (*conv_fwd_bf16)(gp_device *dev, const gp_conv_desc *d, const uint16_t *x,
                               const float *w, const float *b, uint16_t *y);
    gp_status (*conv_bwd_data_bf16)(gp_device *dev, const gp_conv_desc *d, const float *w,
                                    const uint16_t *dy, uint16_t *dx);
    gp_status (*conv_bwd_weights_bf16)(gp_device *dev, const gp_conv_desc *d,
                                       const uint16_t *x, const uint16_t *dy, float *dw,
                                       float *db);
    /* xent_bf16: xent_dev on bf16 logits and dlogits (rows ld apart, the
     * padding's gradient 0), the results in this device's memory: the FP32
     * slot's loss, hits and gradient on the widened logits, the gradient
     * rounded once, without FP32 copies of the logits or their gradient
     * (a GPT's (B, T, vocab)).  NULL: the storage adapter. */
    gp_status (*xent_bf16)(gp_device *dev, const uint16_t *logits, const float *labels,
                           int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                           uint16_t *dlogits, gp_loss_result *out);
    /* layer_norm_*_bf16: the layer_norm_* slots with x, y, dy and dx in
     * bf16 (w, b, mean, rstd and the parameter gradients FP32), the FP32
     * slots' arithmetic on the widened values with y and dx rounded once:
     * the adapter's bits.  NULL: the adapter. */
    gp_status (*layer_norm_fwd_bf16)(gp_device *dev, const uint16_t *x, const float *w,
                                     const float *b, uint16_t *y, float *mean, float *rstd,
                                     int64_t rows, int64_t c, float eps);
    gp_status (*layer_norm_bwd_data_bf16)(gp_device *dev, const uint16_t *x, const float *w,
                                          const float *mean, const float *rstd,
                                          const uint16_t *dy, uint16_t *dx, int64_t rows,
                                          int64_t c);
    gp_status (*layer_norm_bwd_weights_bf16)(gp_device *dev, const uint16_t *x,
                                             const float *mean, const float *rstd,
                                             const uint16_t *dy, float *dw, float *db,
                                             int64_t rows, int64_t c);
    /* dropout_apply_bf16: dropout_apply on bf16 x and y (y[i] =
     * bits(value(x[i]) * mask[i]), the same mask); mul_rows_bf16:
     * mul_rows on bf16 x and y (dropout2d's channel mask).  One pass each,
     * the adapter's bits; y may be x.  NULL: the adapter. */
    gp_status (*dropout_apply_bf16)(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                    float p, uint64_t seed, uint64_t stream, uint64_t first);
    gp_status (*mul_rows_bf16)(gp_device *dev, const uint16_t *x, const float *s, uint16_t *y,
                               int64_t rows, int64_t cols);
    /* norm_leaky_bwd_bf16: norm_leaky_bwd with yz, dy and dx in bf16, dx
     * rounded once.  Without from_z the relu's output is recomputed from y
     * and rounded to bf16 as the leaky relu stores it
     * (gp_ew_norm_leaky_y_b16), so the norm's gradient is the same bits
     * whether the relu ran in place over its output or not (a stage
     * boundary between them).  upsample_fwd_bf16, upsample_bwd_bf16:
     * upsample_fwd (bits copied) and upsample_bwd (the FP32 block sums of
     * the widened dy in the FP32 slot's order, rounded once) on bf16.
     * NULL: the storage adapter (U-Net's layers, unet.c). */
    gp_status (*norm_leaky_bwd_bf16)(gp_device *dev, const gp_bn_desc *d, const uint16_t *yz,
                                     bool from_z, float slope, const float *var,
                                     const uint16_t *dy, uint16_t *dx);
    gp_status (*upsample_fwd_bf16)(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale);
    gp_status (*upsample_bwd_bf16)(gp_device *dev, const uint16_t *dy, uint16_t *dx, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale);
    /* linear_fwd_bf16: linear_fwd with x (n, in) and y (n, out) in bf16,
     * the product, bias and relu in FP32, y rounded once;
     * linear_bwd_data_bf16: dx (n, in) = dy (n, out) w (out, in), bf16 dy
     * and dx; linear_bwd_weights: dw (out, in) = (fresh) or += dy^T x
     * and db (out; NULL: no bias) likewise dy's column sums, from dy and x
     * of element type dt (FP32 or bf16), dw and db FP32: a linear layer's
     * whole weights half in one call on either storage (FP32: the product
     * then the column sums, overwriting on a fresh step; the bits of gemm,
     * fill and sum_rows).  For a device whose precision is bf16
     * (gp_dev_linear_bf16_has): the products take the bf16 activations as
     * they are (CUDA: cuBLASLt with bf16 A, B and, for y and dx, D, the
     * bias and relu as its epilogue; CPU: a oneDNN matmul likewise, the
     * weights' bf16 copy kept for the step).  Products not worth bf16
     * (gp_bf16_gemm_worth) run the FP32 way on widened copies: the
     * adapter's bits.  NULL: the storage adapter. */
    gp_status (*linear_fwd_bf16)(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                 const uint16_t *x, const float *w, const float *bias, bool relu,
                                 uint16_t *y);
    gp_status (*linear_bwd_data_bf16)(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                      const uint16_t *dy, const float *w, uint16_t *dx);
    gp_status (*linear_bwd_weights)(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                    int64_t in, const void *dy, const void *x, float *dw,
                                    float *db, bool fresh);
    /* bn_commit_multi: each of n parts (n >= 1; the parts' tensors do not
     * overlap) first merges its pending micro-batch statistics into its
     * accumulator (gp_ew_bn_fold: bn_merge of each slot in order, in
     * double) and then commits (bn_commit), in one launch on a GPU: a
     * stage's batch norms merge and commit their step's statistics
     * together (gp_dev_bn_commit_end).  NULL: bn_merge once per pending
     * slot and bn_commit once per part. */
    gp_status (*bn_commit_multi)(gp_device *dev, const struct gp_bn_commit_part *parts, int n);
    /* zero_many: xs[t][0 .. ns[t]) = 0 for t < count (count <=
     * GP_NONFINITE_BATCH, ns[t] >= 1, the tensors apart), in one launch on a
     * GPU: a stage's gradients that their layers sum into (+=) zeroed
     * together at its step's start (gp_layers_zero_stale) instead of a
     * fill each.  NULL: gp_dev_zero_many fills them one by one. */
    gp_status (*zero_many)(gp_device *dev, float *const *xs, const int64_t *ns, int count);
    /* mem_total: the device's own memory in bytes (a GPU's, as
     * cudaMemGetInfo gives its total), so that a model whose weights,
     * gradients and optimizer state alone exceed it is refused before it
     * is allocated.  NULL: the host's (a CPU device; the trainer checks
     * what its CPU devices hold together against the machine's RAM). */
    gp_status (*mem_total)(gp_device *dev, uint64_t *bytes);
    /* add_layer_norm_fwd: s = a + b (rows, c), then y = the layer norm of
     * s as layer_norm_fwd computes it (its weights w, bias, mean, rstd and
     * eps), in one pass (one launch on a GPU: llm.c's fused residual
     * forward): s, a, b and y of element type dt (FP32 or bf16: the sum
     * rounded once, as add_bf16, and the norm reads the rounded sum), the
     * bits of add (add_bf16) then layer_norm_fwd (_bf16).  A Transformer's
     * residual add and the norm after it (gp_layers_add_norm).
     * layer_norm_bwd_data_add: dx += the norm's data gradient, as
     * layer_norm_bwd_data (_bf16) computes it into a tensor of type dt
     * and then gp_layers_accumulate adds into dx (bf16: the gradient
     * rounded, the sum in FP32 rounded once): the norm's backward adds into
     * the residual stream's gradient in its own pass, no separate sum.
     * NULL: the layers run unfused. */
    gp_status (*add_layer_norm_fwd)(gp_device *dev, gp_dtype dt, const void *a, const void *b,
                                    void *s, const float *w, const float *bias, void *y,
                                    float *mean, float *rstd, int64_t rows, int64_t c, float eps);
    gp_status (*layer_norm_bwd_data_add)(gp_device *dev, gp_dtype dt, const void *x,
                                         const float *w, const float *mean, const float *rstd,
                                         const void *dy, void *dx, int64_t rows, int64_t c);
    /* linear_gelu_fwd: pre (n, out) = x w^T + bias (bias NULL: none) and
     * y = GELU(pre) (GPT-2's tanh form) in one call: on a GPU the product
     * with cuBLASLt's GELU_AUX_BIAS epilogue (pre its aux output), on a
     * CPU linear_fwd then gelu_fwd (their bits; bf16: linear_fwd_bf16 and
     * act_bf16's GELU).  linear_gelu_bwd_data: dx (n, in) = (dy w) times
     * GELU'(pre) (pre (n, in) the GELU's input): the product whose dx feeds
     * a GELU's backward with that backward as its epilogue (cuBLASLt's
     * DGELU; CPU: the product then gelu_bwd in place, their bits).  x, pre,
     * y, dy and dx of element type dt; w and bias FP32 (bf16: the weights'
     * bf16 copy, as linear_fwd_bf16).  A Transformer's MLP (gp_layers_pair:
     * mlp.c_fc with mlp.gelu, and mlp.gelu's backward in mlp.c_proj's).
     * NULL: the layers run unfused. */
    gp_status (*linear_gelu_fwd)(gp_device *dev, gp_dtype dt, int64_t n, int64_t out, int64_t in,
                                 const void *x, const float *w, const float *bias, void *pre,
                                 void *y);
    gp_status (*linear_gelu_bwd_data)(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                      int64_t in, const void *dy, const float *w,
                                      const void *pre, void *dx);
    /* RMSNorm as Hugging Face's LlamaRMSNorm (issue 66): each of the `rows`
     * rows of x (rows, c) times rstd = 1 / sqrt(mean(x^2) + eps) (the mean
     * of squares in double), then times w (c): rms_norm_fwd writes y and
     * rstd (rows, FP32); rms_norm_bwd_data dx = rstd (g - x rstd^2
     * mean(g x)), g = dy w; rms_norm_bwd_weights dw (c) += the sum over
     * rows of dy x rstd.  x, y, dy and dx of element type dt (FP32 or
     * bf16: widened as read, each result rounded once); w, rstd and dw
     * FP32.  NULL: the model refuses rms_norm on the device. */
    gp_status (*rms_norm_fwd)(gp_device *dev, gp_dtype dt, const void *x, const float *w,
                              void *y, float *rstd, int64_t rows, int64_t c, float eps);
    gp_status (*rms_norm_bwd_data)(gp_device *dev, gp_dtype dt, const void *x, const float *w,
                                   const float *rstd, const void *dy, void *dx, int64_t rows,
                                   int64_t c);
    gp_status (*rms_norm_bwd_weights)(gp_device *dev, gp_dtype dt, const void *x,
                                      const float *rstd, const void *dy, float *dw, int64_t rows,
                                      int64_t c);
    /* swiglu_fwd: y (rows, h) = silu(x[:, :h]) x[:, h:] for x (rows, 2 h),
     * gp_ew_swiglu (Llama's MLP: the gate's and the up projection's
     * outputs side by side); swiglu_bwd: dx (rows, 2 h) from x and dy
     * (rows, h), gp_ew_swiglu_bwd.  Of element type dt (bf16: widened,
     * each result rounded once).  NULL: the model refuses swiglu there. */
    gp_status (*swiglu_fwd)(gp_device *dev, gp_dtype dt, const void *x, void *y, int64_t rows,
                            int64_t h);
    gp_status (*swiglu_bwd)(gp_device *dev, gp_dtype dt, const void *x, const void *dy, void *dx,
                            int64_t rows, int64_t h);
    /* rope: rotary position embeddings (gp_rope_desc) from x to y (y == x
     * allowed), each rotated pair by gp_ew_rope_cs / gp_ew_rope (inverse:
     * the backward, dy to dx), the columns past heads d copied.  Of
     * element type dt (bf16: widened, each result rounded once).  NULL:
     * the model refuses rope there. */
    gp_status (*rope)(gp_device *dev, gp_dtype dt, const gp_rope_desc *d, bool inverse,
                      const void *x, void *y);
    /* attn_cached: causal attention of n new positions pos .. pos + n - 1
     * of each of b sequences against a KV cache (sampling with a cache,
     * gp_decoder).  x (b, n, c + 2 kv_heads d) is attn_fwd's input for the
     * new positions; kv (b, cap, 2 kv_heads d) holds each sequence's k
     * heads then v heads of positions 0 .. pos - 1 (pos + n <= cap).  The
     * call writes the new positions' k and v into rows pos .. pos + n - 1
     * as they are, then y (b, n, c) = attn_fwd's output for those
     * positions: query pos + i over keys 0 .. pos + i.  All of element
     * type dt (bf16: widened, the result rounded once).  The CPU's gives
     * attn_fwd's bits for every position (its key tiles sit at fixed
     * positions); CUDA's own rule, within rounding of them.  NULL: the
     * model samples without a cache there. */
    gp_status (*attn_cached)(gp_device *dev, gp_dtype dt, const void *x, void *kv, void *y,
                             int64_t b, int64_t n, int64_t pos, int64_t cap, int64_t heads,
                             int64_t kv_heads, int64_t c);
} gp_device_iface;

/* The most tensors one nonfinite_or_many launch takes (its table travels
 * in the kernel's parameters: 16 bytes a tensor). */
#define GP_NONFINITE_BATCH 64

#define GP_CHAN_ID_BYTES 256
/* How a channel's two ends find each other (chan_open). */
typedef struct gp_chan_desc {
    bool sender;
    unsigned char id[GP_CHAN_ID_BYTES]; /* chan_id's bytes (the sender's) */
    size_t id_bytes;
    /* the host transport, for a backend whose memory is host memory: a
     * blocking rendezvous send / exact receive of `bytes` on this channel,
     * which gives up (GP_ERR_CANCELLED) once *cancel (the channel's, set
     * when it is closed after a failure) is nonzero: a transfer whose peer
     * will never come must not hold the failing process back from ending
     * the run */
    gp_status (*host_send)(void *arg, const void *buf, size_t bytes, const _Atomic int *cancel);
    gp_status (*host_recv)(void *arg, void *buf, size_t bytes, const _Atomic int *cancel);
    void *arg;
    char name[96]; /* for messages: "activations of stage 1 -> 2" */
} gp_chan_desc;


struct gp_device {
    const gp_device_iface *iface;
    void *ctx;            /* backend context */
    gp_device_kind kind;
    int index;            /* N of cpu:N / cuda:N */
    char name[32];        /* "cpu:0" */
    int threads;          /* math threads (CPU) */
    gp_allocator alloc;   /* accounting for every byte on the device */
    /* Between gp_dev_freeze_weights(dev, true) and (dev, false) no one
     * writes any layer's weights on this device and no one reads the weight
     * gradients (the executor's forward and backward phase of a step), so a
     * backend may keep its own converted copy of a weight tensor across
     * calls and hold the gradients it accumulates until the thaw;
     * weights_epoch changes on every freeze and thaw, so nothing kept
     * survives one. */
    bool weights_frozen;
    uint64_t weights_epoch;
    /* Called on a thaw, on the device's thread (NULL = nothing kept): adds
     * held gradients into the tensors they belong to and frees what was
     * kept. */
    gp_status (*on_weights_thaw)(struct gp_device *dev);
    /* Host waits: calls through the wrappers that return only once the
     * device has finished work (synchronize, event_sync, download, upload,
     * and the slots with host outputs: sumsq, nonfinite, xent, bce_logits).
     * Counted the same on every backend, so the CPU shows how often a GPU
     * would stall its host (--metrics host_waits; issue 14's bar is one per
     * device per step).  Atomic: a copy's fallback may wait on another
     * worker's device; read with gp_dev_host_waits. */
    uint64_t host_waits;
    /* Whether this device opens channels (chan_open) now: set by the
     * backend (the CPU's only with GPIPE_CPU_STREAMS=threads). */
    bool chans;
    /* The precision its convolutions and matrix products run in (the
     * backend's answer to gp_device_opts.precision). */
    gp_precision precision;
    /* Algorithm searches the backend has run (CUDA: one cudnnFind per
     * convolution shape and direction, unless deterministic): what a step
     * costs once and never again; on the device's thread only. */
    uint64_t algo_searches;
    /* Convolution plans the backend runs through a graph API (CUDA:
     * cuDNN's backend descriptors where they beat the legacy algorithm,
     * cuda_graph.c); on the device's thread only. */
    uint64_t graph_plans;
    /* Attention calls (attn_fwd, attn_bwd) a fused library kernel ran
     * (CUDA: cuDNN's scaled-dot-product attention, cuda_sdpa.c); on the
     * device's thread only. */
    uint64_t attn_fused;
    /* Weight tensors a backend rounded into a copy kept while the weights
     * are frozen (CUDA under bf16: gp_cuda_weights_bf16, once a step per
     * weight whatever the calls and micro-batches); on the device's
     * thread only. */
    uint64_t weights_kept;
    /* The bf16 mirrors of its weight tensors (gp_wmirror), one per tensor,
     * kept across steps; freed with the parameter or the device.  n_mirrors
     * is read by every copy into the device (gp_dev_weights_written). */
    gp_wmirror *mirrors;
    int n_mirrors, cap_mirrors;
    pthread_mutex_t mirrors_lock; /* the table: a copy into this device may
                                     come from another device's thread */
    bool check_mirrors; /* GPIPE_CHECK_MIRRORS=1 */
    uint64_t mirrors_by_update; /* uses served by the update's writing (tests) */
    /* Conversion passes between FP32 and bf16 through gp_dev_bf16_pack /
     * gp_dev_bf16_unpack: the storage adapter's widening and rounding
     * (gp_tensor_as, gp_tensor_convert), bf16 copies' packing, snapshots'
     * conversions.  What a bf16 step of layers with bf16 kernels should
     * not spend (test_pipeline counts them per step); a backend's own
     * packing inside a slot is not counted.  Atomic. */
    uint64_t bf16_conversions;
    /* Batch-norm commits held between gp_dev_bn_commit_begin and _end (the
     * device's thread only), and the launches their flushes made (slot
     * calls: bn_commit_multi, or bn_commit without it). */
    struct gp_bn_commit_part *bn_held;
    int n_bn_held, cap_bn_held;
    bool bn_holding;
    uint64_t bn_commit_calls;
    /* A GPU's compute capability, major * 10 + minor (90: Hopper); 0 for
     * a CPU device. */
    int arch;
    /* Bytes moved by copies within the device (gp_dev_copy_d2d): what a
     * step spends on copies that compute nothing (a test's measure of the
     * gradients handed on without one, gp_layer_backward_take).  Atomic,
     * as host_waits; read with gp_dev_d2d_bytes. */
    uint64_t d2d_bytes;
    /* Launches: calls into the compute slots of the interface (the math,
     * fill, the copies within the device, the update, the checks) through
     * the gp_dev_* wrappers (GP_LAUNCH), each what a GPU runs as a kernel
     * (or a library call: a cuBLAS product, a cuDNN graph); transfers,
     * events, collectives and allocation are not launches.  Counted the
     * same on every backend, so a CPU run shows what a step would launch
     * on a GPU (--metrics launches; bench/README compares GPT-2's with
     * llm.c's).  A CUDA slot that runs more than one kernel counts once.
     * Atomic, as host_waits; read with gp_dev_launches.  GPIPE_LOG_LAUNCHES=1
     * (log_launches) prints each one's slot to stderr, with the device. */
    uint64_t launches;
    bool log_launches;
    /* FP32 bytes the storage adapter made on this device (layers.h: each
     * bf16 input widened into a copy, each FP32 result before it is
     * rounded), what a layer without bf16 kernels costs a bf16 run (0 where
     * every layer has them: --metrics adapter_bytes).  Atomic. */
    uint64_t adapter_bytes;
};

static inline void gp_dev_count_wait(struct gp_device *dev)
{
    __atomic_fetch_add(&dev->host_waits, 1, __ATOMIC_RELAXED);
}
static inline uint64_t gp_dev_host_waits(const struct gp_device *dev)
{
    return __atomic_load_n(&dev->host_waits, __ATOMIC_RELAXED);
}
void gp_dev_log_launch(struct gp_device *dev, const char *slot);
static inline void gp_dev_count_launch(struct gp_device *dev, const char *slot)
{
    __atomic_fetch_add(&dev->launches, 1, __ATOMIC_RELAXED);
    if (dev->log_launches) gp_dev_log_launch(dev, slot);
}
static inline uint64_t gp_dev_launches(const struct gp_device *dev)
{
    return __atomic_load_n(&dev->launches, __ATOMIC_RELAXED);
}
static inline void gp_dev_count_adapter(struct gp_device *dev, size_t bytes)
{
    if (dev) __atomic_fetch_add(&dev->adapter_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
}
static inline uint64_t gp_dev_adapter_bytes(const struct gp_device *dev)
{
    return __atomic_load_n(&dev->adapter_bytes, __ATOMIC_RELAXED);
}
/* The compute slot `slot` of dev's interface, counted as a launch:
 * GP_LAUNCH(dev, gemm)(dev, ...) where the wrapper would call
 * dev->iface->gemm(dev, ...). */
#define GP_LAUNCH(dev, slot) (gp_dev_count_launch(dev, #slot), (dev)->iface->slot)

/* Open (true) or close (false) a stretch in which the device's weights do
 * not change and its weight gradients are not read; idempotent.  The
 * executor opens it at a step's start and closes it before the first
 * instruction of the step's end (reductions, the update, the gather), and
 * on any failure.  Closing can fail (the held gradients' additions); the
 * stretch is closed either way. */
gp_status gp_dev_freeze_weights(struct gp_device *dev, bool frozen);

/* Weight mirrors (gp_wmirror).  gp_dev_mirror_get, while frozen: the copy
 * (2 n bytes) of w's mirror of n values, made if new (NULL where none can
 * be: a device with a memory capacity, or out of memory; the caller
 * converts per call as before).  Unless *current, the caller writes the
 * copy (gp_ew_bf16_bits of each value, on the device's queue) and calls
 * gp_dev_mirror_made(w, n).  Under GPIPE_CHECK_MIRRORS a current mirror
 * is compared with its master's rounding here, and a mismatch is an error
 * naming the stale copy.  The table is sorted by (w, n): a lookup is a
 * binary search, not a scan per product. */
gp_status gp_dev_mirror_get(struct gp_device *dev, const float *w, int64_t n, uint16_t **copy,
                            bool *current);
void gp_dev_mirror_made(struct gp_device *dev, const float *w, int64_t n);
/* The update about to write all n values of w (thawed): w's mirror to
 * write in the same pass, now current for the next freeze; NULL if w has
 * none (nothing to write; while frozen, which no executor does, the
 * mirror is marked stale). */
uint16_t *gp_dev_mirror_for_update(struct gp_device *dev, const float *w, int64_t n);
/* bytes at p on dev were written other than by the update: the mirrors of
 * the weights they overlap are stale.  The copy and upload wrappers call
 * it; so must any other way of writing a parameter. */
void gp_dev_mirrors_stale(struct gp_device *dev, const void *p, size_t bytes);
/* Free the mirrors of the weights overlapping bytes at p (p NULL: all):
 * gp_dev_free of a parameter, and the device's close. */
void gp_dev_mirrors_drop(struct gp_device *dev, const void *p, size_t bytes);
static inline void gp_dev_weights_written(struct gp_device *dev, const void *p, size_t bytes)
{
    if (__atomic_load_n(&dev->n_mirrors, __ATOMIC_ACQUIRE)) gp_dev_mirrors_stale(dev, p, bytes);
}


/* Options for opening a device. */
typedef struct gp_device_opts {
    int threads;          /* CPU math threads; 0 = all cores */
    size_t capacity;      /* bytes; 0 = unlimited */
    gp_precision precision; /* asked for; the device's own says what it runs */
    bool deterministic;   /* train.deterministic: algorithms that repeat bit
                             for bit, chosen the same way every run (CUDA:
                             cuDNN's heuristics, deterministic only) instead
                             of the fastest measured; CPU devices are
                             deterministic either way */
    bool plan;            /* opened to be asked (layouts, slots, workspaces:
                             --dry-run's summary), never to run: a precision
                             this processor cannot run (bf16 without bf16
                             instructions) is taken as asked, so the plan is
                             that of a processor that can, where an open to
                             run refuses it */
} gp_device_opts;

/* Parse "cpu:0", "cpu", "cuda:1" into kind and index. */
gp_status gp_device_parse(const char *spec, gp_device_kind *kind, int *index);
/* The inverse: "cpu:3" for (GP_DEV_CPU, 3) into out (len bytes). */
void gp_device_format(gp_device_kind kind, int index, char *out, size_t len);
/* Open a device by name ("cpu:0").  CUDA names fail with a clear message in
 * a build or on a machine without CUDA. */
gp_status gp_device_open(const char *spec, const gp_device_opts *opts,
                         gp_device **out);
void gp_device_close(gp_device *dev);
/* The calling thread's OpenMP thread count, and putting it back: a CPU
 * device sets it to its own threads on whichever thread runs its ops (its
 * worker, or the library's caller), which a program's own parallel loops
 * would then inherit; the public API restores the caller's. */
int gp_caller_threads(void);
void gp_caller_threads_restore(int threads);

/* For backends' constructors: the device-independent part of a new device,
 * and where a backend is admitted.  Refuses (GP_ERR_UNSUPPORTED, naming the
 * backend and both versions) an iface whose version is not
 * GP_DEVICE_IFACE_VERSION: its slots would be read at the wrong offsets.
 * Otherwise *out is a zeroed device with iface, kind, index, name ("cpu:3"),
 * threads = 1 and an allocator of opts->capacity (opts may be NULL); the
 * backend then sets ctx (and threads).  gp_device_close frees it, calling
 * iface->destroy, which must accept ctx == NULL. */
gp_status gp_device_new(const gp_device_iface *iface, gp_device_kind kind, int index,
                        const gp_device_opts *opts, gp_device **out);
/* The CPU backend's constructor (backend/cpu). */
/* The instruction set gpipe's own loops on CPU devices run in on this
 * processor (cpu/cpu_impl.h, GP_CPU_LOOPS): "AVX-512 (x86-64-v4)", "AVX2
 * (x86-64-v3)" or "x86-64 baseline". */
const char *gp_cpu_loops_isa(void);
/* The instruction set CPU devices compute in (cpu/cpu_isa.c): the
 * processor's as far as the one switch, GPIPE_CPU_ISA (or oneDNN's
 * ONEDNN_MAX_CPU_ISA), lets it: "SSE4.1", "AVX2", "AVX-512", "AVX-512 +
 * bf16", "AVX-512 + bf16 + AMX".  Every choice gpipe makes from the
 * processor (bf16, layouts, attention's width) follows it. */
const char *gp_cpu_isa_name(void);
/* "GPIPE_CPU_ISA" or "ONEDNN_MAX_CPU_ISA" where one of them caps the set,
 * else NULL. */
const char *gp_cpu_isa_switch(void);
gp_status gp_cpu_device_create(int index, const gp_device_opts *opts,
                               gp_device **out);
/* The CUDA backend's constructor (backend/cuda; only in builds with
 * GPIPE_CUDA, in the plugin libgpipe-cuda.so, which gp_device_open loads).
 * Fails with GP_ERR_UNSUPPORTED when device `index` does not exist (no GPU,
 * no driver). */
gp_status gp_cuda_device_create(int index, const gp_device_opts *opts,
                                gp_device **out);
/* NCCL communicator over CUDA devices (backend/cuda). */
gp_status gp_cuda_comm_create(gp_device **devs, int n, gp_comm **out);

/* oneDNN primitives (including reorders) the CPU device `dev` has created so
 * far: each shape's primitives are built once and cached, so repeated calls
 * with the same shapes leave this unchanged. */
int64_t gp_cpu_primitives_created(const gp_device *dev);

/* --- wrappers: what layers call --------------------------------------- */

void gp_device_bind_thread(gp_device *dev);
/* Allocate device memory with accounting (fails with GP_ERR_OOM over
 * capacity). */
gp_status gp_dev_alloc(gp_device *dev, size_t bytes, gp_mem_category cat,
                       void **out);
void gp_dev_free(gp_device *dev, void *ptr, size_t bytes, gp_mem_category cat);
gp_status gp_dev_upload(gp_device *dev, float *dst, const float *src, int64_t n);
gp_status gp_dev_download(gp_device *dev, float *dst, const float *src, int64_t n);
/* The copy_async slot with its fallback (see the slot): dst on dev, src on
 * src_dev (any backend), `after` an event of src_dev or NULL, `done` an
 * event of dev or NULL.  Between backends (a CPU stage beside a GPU one):
 * into a CPU device from a backend with copy_to_host, that slot (one host
 * wait, for the producer and the copy); otherwise the host waits for
 * `after` and dev's copy_async takes the copy where it reads host memory
 * (CUDA: staged on its copy stream), else a synchronous staged copy; then
 * `done` is recorded on dev. */
gp_status gp_dev_copy_async(gp_device *dev, void *dst, gp_device *src_dev, const void *src,
                            size_t bytes, void *after, void *done);
/* The nonfinite_or slot with its fallback. */
gp_status gp_dev_nonfinite_or(gp_device *dev, const float *x, int64_t n, float *flag);
/* The nonfinite_or_many slot, in batches of GP_NONFINITE_BATCH, with its
 * fallback (nonfinite_or per tensor); empty tensors (ns[i] == 0) skipped. */
gp_status gp_dev_zero_many(gp_device *dev, float *const *xs, const int64_t *ns, int count);
/* The mem_total slot: the device's own memory, 0 where it has none of its
 * own (a CPU device) or cannot say. */
uint64_t gp_dev_mem_total(gp_device *dev);
gp_status gp_dev_nonfinite_or_many(gp_device *dev, const float *const *xs, const int64_t *ns,
                                   int count, float *flag);
/* The slots of a step without host waits, with their fallbacks (see the
 * slots).  upload_async's n counts floats, like gp_dev_upload's. */
gp_status gp_dev_upload_async(gp_device *dev, float *dst, const float *src, int64_t n,
                              void *done);
/* The channel slots (see chan_open); GP_ERR_UNSUPPORTED where the backend
 * has none (or, on the CPU, without GPIPE_CPU_STREAMS=threads).
 * gp_dev_chan_id: *bytes 0 where the backend needs no id. */
bool gp_dev_has_chans(const gp_device *dev);
gp_status gp_dev_chan_id(gp_device *dev, void *id, size_t *bytes);
gp_status gp_dev_chan_open(gp_device *dev, const struct gp_chan_desc *d, void **out);
gp_status gp_dev_chan_send(gp_device *dev, void *ch, const float *buf, int64_t n, void *after,
                           void *done);
/* The event_query slot with its fallback; NULL events are complete. */
gp_status gp_dev_event_query(gp_device *dev, void *ev, bool *done);
gp_status gp_dev_chan_recv(gp_device *dev, void *ch, float *buf, int64_t n, void *done);
void gp_dev_chan_close(gp_device *dev, void *ch, bool abort);
gp_status gp_dev_bn_merge(gp_device *dev, int64_t c, double *mean_acc, double *m2_acc,
                          double na, double nb, const float *mean, const float *var);
gp_status gp_dev_bn_commit(gp_device *dev, int64_t c, float *rmean, float *rvar,
                           double *mean_acc, double *m2_acc, double momentum, double count);
/* One batch norm's commit: bn_commit's arguments, and the statistics of
 * the step's micro-batches not merged yet (n_pend >= 0 slots at pend, on
 * the device: slot i is 2c floats, the micro-batch's means and then its
 * biased variances, of nb_hi values per channel for i < n_hi and nb_lo
 * after), which the commit merges into the accumulator of na values
 * first, in slot order; count = na + the slots' values. */
typedef struct gp_bn_commit_part {
    int64_t c;
    float *rmean, *rvar;
    double *mean_acc, *m2_acc;
    double momentum, count;
    const float *pend;
    int n_pend, n_hi;
    double na, nb_hi, nb_lo;
} gp_bn_commit_part;
/* gp_dev_bn_commit of a part with pending slots (checked: counts that add
 * up, c > 0); gp_dev_bn_commit is this with none. */
gp_status gp_dev_bn_commit_part(gp_device *dev, const gp_bn_commit_part *p);
/* A layer's commit: p's c, rmean, rvar, mean_acc, m2_acc, momentum, na,
 * pend and n_pend, with slot i's values per channel nb[i] (host memory);
 * count and the runs (n_hi, nb_hi, nb_lo) are worked out here.  Counts
 * that are not two runs (a short micro-batch in the middle: 3 + 2 + 3) are
 * merged slot by slot (bn_merge, in slot order: the same bits) before the
 * commit, so a caller never encodes them. */
gp_status gp_dev_bn_commit_slots(gp_device *dev, gp_bn_commit_part p, const double *nb);
/* Between begin and end, gp_dev_bn_commit checks its arguments and holds
 * the commit; end issues the held ones together (bn_commit_multi: one
 * launch on a GPU, in the order they came; their tensors are distinct
 * norms', so the bits are those of one commit after another) and stops
 * holding.  Begin while holding is an error. */
gp_status gp_dev_bn_commit_begin(gp_device *dev);
gp_status gp_dev_bn_commit_end(gp_device *dev);
gp_status gp_dev_xent_dev_ld(gp_device *dev, const float *logits, const float *labels,
                             int64_t rows, int64_t cols, int64_t ld, float scale,
                             float smoothing, float *dlogits, gp_loss_result *out);
/* Rows of cols floats (no padding). */
static inline gp_status gp_dev_xent_dev(gp_device *dev, const float *logits, const float *labels,
                                        int64_t rows, int64_t cols, float scale,
                                        float smoothing, float *dlogits, gp_loss_result *out)
{
    return gp_dev_xent_dev_ld(dev, logits, labels, rows, cols, cols, scale, smoothing, dlogits,
                              out);
}
gp_status gp_dev_bce_logits_dev(gp_device *dev, const float *z, const float *t, int64_t n,
                                float scale, float *dz, gp_loss_result *out);

/* The slots themselves, one wrapper each, named gp_dev_<slot> with the
 * slot's parameters: see the slot's comment in gp_device_iface for what it
 * computes.  Required slots are forwarded as they are (static inline, so a
 * wrapper costs nothing over the indirect call); optional ones fall back as
 * their comment says. */
static inline gp_status gp_dev_copy_d2d(gp_device *dev, void *dst, const void *src,
                                        size_t bytes)
{
    gp_dev_weights_written(dev, dst, bytes);
    __atomic_fetch_add(&dev->d2d_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
    return GP_LAUNCH(dev, copy_d2d)(dev, dst, src, bytes);
}
static inline uint64_t gp_dev_d2d_bytes(const struct gp_device *dev)
{
    return __atomic_load_n(&dev->d2d_bytes, __ATOMIC_RELAXED);
}
static inline gp_status gp_dev_synchronize(gp_device *dev)
{
    gp_dev_count_wait(dev);
    return dev->iface->synchronize(dev);
}
static inline gp_status gp_dev_event_create(gp_device *dev, void **out)
{
    *out = NULL;
    return dev->iface->event_create ? dev->iface->event_create(dev, out) : GP_OK;
}
static inline void gp_dev_event_destroy(gp_device *dev, void *ev)
{
    if (ev && dev->iface->event_destroy) dev->iface->event_destroy(dev, ev);
}
static inline gp_status gp_dev_event_record(gp_device *dev, void *ev)
{
    if (!dev->iface->event_record) return dev->iface->synchronize(dev);
    return dev->iface->event_record(dev, ev);
}
/* Device-time markers (the iface's mark slots): NULL markers, and a time
 * of 0 for them, where the backend takes none. */
static inline gp_status gp_dev_mark(gp_device *dev, bool copy, void **out)
{
    *out = NULL;
    return dev->iface->mark ? dev->iface->mark(dev, copy, out) : GP_OK;
}
static inline gp_status gp_dev_mark_time(gp_device *dev, void *mark, double *seconds)
{
    *seconds = 0;
    return mark && dev->iface->mark_time ? dev->iface->mark_time(dev, mark, seconds) : GP_OK;
}
static inline void gp_dev_mark_reset(gp_device *dev)
{
    if (dev->iface->mark_reset) dev->iface->mark_reset(dev);
}
static inline gp_status gp_dev_event_wait(gp_device *dev, void *ev)
{
    return dev->iface->event_wait ? dev->iface->event_wait(dev, ev) : GP_OK;
}
static inline gp_status gp_dev_event_sync(gp_device *dev, void *ev)
{
    gp_dev_count_wait(dev);
    return dev->iface->event_sync ? dev->iface->event_sync(dev, ev) : GP_OK;
}
static inline gp_status gp_dev_fill(gp_device *dev, float *x, float v, int64_t n)
{
    gp_dev_weights_written(dev, x, (size_t)n * sizeof(float)); /* (a parameter's init) */
    return GP_LAUNCH(dev, fill)(dev, x, v, n);
}
static inline gp_status gp_dev_scale(gp_device *dev, float *x, float a, int64_t n)
{
    return GP_LAUNCH(dev, scale)(dev, x, a, n);
}
static inline gp_status gp_dev_axpy(gp_device *dev, float a, const float *x, float *y,
                                    int64_t n)
{
    return GP_LAUNCH(dev, axpy)(dev, a, x, y, n);
}
static inline gp_status gp_dev_add(gp_device *dev, const float *a, const float *b, float *y,
                                   int64_t n)
{
    return GP_LAUNCH(dev, add)(dev, a, b, y, n);
}
static inline gp_status gp_dev_sumsq(gp_device *dev, const float *x, int64_t n, double *out)
{
    gp_dev_count_wait(dev);
    return GP_LAUNCH(dev, sumsq)(dev, x, n, out);
}
static inline gp_status gp_dev_sumsq_multi(gp_device *dev, const float *const *xs,
                                           const int64_t *ns, int n, double *out)
{
    if (n <= 0) return GP_OK;
    if (!dev->iface->sumsq_multi) {
        for (int t = 0; t < n; t++) GP_TRY(gp_dev_sumsq(dev, xs[t], ns[t], &out[t]));
        return GP_OK;
    }
    gp_dev_count_wait(dev);
    return GP_LAUNCH(dev, sumsq_multi)(dev, xs, ns, n, out);
}
static inline gp_status gp_dev_nonfinite(gp_device *dev, const float *x, int64_t n, int *out)
{
    gp_dev_count_wait(dev);
    return GP_LAUNCH(dev, nonfinite)(dev, x, n, out);
}
static inline gp_status gp_dev_sgd_update(gp_device *dev, float *w, const float *g, float *v,
                                          int64_t n, float lr, float mu, float wd,
                                          int nesterov)
{
    return GP_LAUNCH(dev, sgd_update)(dev, w, g, v, n, lr, mu, wd, nesterov);
}
static inline gp_status gp_dev_gemm(gp_device *dev, int trans_a, int trans_b, int64_t m,
                                    int64_t n, int64_t k, float alpha, const float *a,
                                    int64_t lda, const float *b, int64_t ldb, float beta,
                                    float *c, int64_t ldc)
{
    return GP_LAUNCH(dev, gemm)(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                            ldc);
}
static inline gp_status gp_dev_sgd_multi(gp_device *dev, const gp_update_part *parts, int n,
                                         float lr, float mu, int nesterov)
{
    if (n <= 0) return GP_OK;
    if (dev->iface->sgd_multi) return GP_LAUNCH(dev, sgd_multi)(dev, parts, n, lr, mu, nesterov);
    for (int i = 0; i < n; i++) {
        if (parts[i].clip > 0.0f) /* the gradient scaled first: the same bits */
            GP_TRY(GP_LAUNCH(dev, scale)(dev, (float *)parts[i].g, parts[i].clip, parts[i].n));
        GP_TRY(GP_LAUNCH(dev, sgd_update)(dev, parts[i].w, parts[i].g, parts[i].v, parts[i].n, lr, mu,
                                      parts[i].wd, nesterov));
        gp_status st = GP_OK;
        if (parts[i].w16) /* (a mirror is made only where bf16_pack is) */
            st = GP_LAUNCH(dev, bf16_pack)(dev, parts[i].w16, parts[i].w, parts[i].n);
        if (st != GP_OK) { /* the update's stamp must not outlive a mirror it did not write */
            gp_dev_mirrors_stale(dev, parts[i].w, (size_t)parts[i].n * sizeof(float));
            return st;
        }
        if (parts[i].nonfinite)
            GP_TRY(gp_dev_nonfinite_or(dev, parts[i].w, parts[i].n, parts[i].nonfinite));
    }
    return GP_OK;
}
static inline gp_status gp_dev_adam_multi(gp_device *dev, const gp_update_part *parts, int n,
                                          const gp_adam_step *a)
{
    if (n <= 0) return GP_OK;
    if (!dev->iface->adam_multi)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s (%s backend) has no Adam update; "
                            "use train.optimizer.type: sgd there", dev->name,
                            dev->iface->backend_name);
    return GP_LAUNCH(dev, adam_multi)(dev, parts, n, a);
}
static inline gp_status gp_dev_gemm_wb(gp_device *dev, int trans_a, int trans_b, int64_t m,
                                       int64_t n, int64_t k, float alpha, const float *a,
                                       int64_t lda, const float *b, int64_t ldb, float beta,
                                       float *c, int64_t ldc)
{
    gp_dev_count_launch(dev, "gemm_wb"); /* a product like any other */
    return (dev->iface->gemm_wb ? dev->iface->gemm_wb : dev->iface->gemm)(
        dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
static inline gp_status gp_dev_add_bias_rows(gp_device *dev, float *y, const float *bias,
                                             int64_t rows, int64_t cols)
{
    return GP_LAUNCH(dev, add_bias_rows)(dev, y, bias, rows, cols);
}
static inline gp_status gp_dev_linear_fwd(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                          const float *x, const float *w, const float *bias,
                                          bool relu, float *y)
{
    if (n == 0 || out == 0) return GP_OK;
    if (dev->iface->linear_fwd) return GP_LAUNCH(dev, linear_fwd)(dev, n, out, in, x, w, bias, relu, y);
    GP_TRY(gp_dev_gemm_wb(dev, 0, 1, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out));
    if (bias) GP_TRY(GP_LAUNCH(dev, add_bias_rows)(dev, y, bias, n, out));
    return relu ? GP_LAUNCH(dev, relu_fwd)(dev, y, y, n * out) : GP_OK;
}
static inline gp_status gp_dev_sum_rows(gp_device *dev, const float *dy, float *db,
                                        int64_t rows, int64_t cols)
{
    return GP_LAUNCH(dev, sum_rows)(dev, dy, db, rows, cols);
}
/* A block on a backend without act_block: GP_ERR_INVALID (it would read
 * the bytes as plain). */
gp_status gp_dev_no_blocks(const gp_device *dev, const char *what);
static inline gp_status gp_dev_conv_fwd(gp_device *dev, const gp_conv_desc *d, const float *x,
                                        const float *w, const float *b, float *y)
{
    if ((d->xblk || d->yblk) && !dev->iface->act_block) return gp_dev_no_blocks(dev, "convolution");
    return GP_LAUNCH(dev, conv_fwd)(dev, d, x, w, b, y);
}
static inline gp_status gp_dev_conv_bwd_data(gp_device *dev, const gp_conv_desc *d,
                                             const float *w, const float *dy, float *dx)
{
    if ((d->xblk || d->yblk) && !dev->iface->act_block) return gp_dev_no_blocks(dev, "convolution");
    return GP_LAUNCH(dev, conv_bwd_data)(dev, d, w, dy, dx);
}
static inline gp_status gp_dev_conv_bwd_weights(gp_device *dev, const gp_conv_desc *d,
                                                const float *x, const float *dy, float *dw,
                                                float *db)
{
    if ((d->xblk || d->yblk) && !dev->iface->act_block) return gp_dev_no_blocks(dev, "convolution");
    return GP_LAUNCH(dev, conv_bwd_weights)(dev, d, x, dy, dw, db);
}
static inline size_t gp_dev_pool_ws_bytes(gp_device *dev, const gp_pool_desc *d)
{
    return dev->iface->pool_ws_bytes ? dev->iface->pool_ws_bytes(dev, d) : 0;
}
static inline gp_status gp_dev_pool_fwd(gp_device *dev, const gp_pool_desc *d, const float *x,
                                        float *y, void *ws)
{
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "pooling");
    return GP_LAUNCH(dev, pool_fwd)(dev, d, x, y, ws);
}
static inline gp_status gp_dev_pool_bwd(gp_device *dev, const gp_pool_desc *d, const float *x,
                                        const float *y, const float *dy, float *dx,
                                        const void *ws)
{
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "pooling");
    return GP_LAUNCH(dev, pool_bwd)(dev, d, x, y, dy, dx, ws);
}
static inline gp_status gp_dev_bn_fwd_train(gp_device *dev, const gp_bn_desc *d,
                                            const float *x, const float *gamma,
                                            const float *beta, float *y, float *mean,
                                            float *var)
{
    GP_ASSERT(!d->add16); /* a bf16 residual: the bf16 slots' */
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "batch norm");
    return GP_LAUNCH(dev, bn_fwd_train)(dev, d, x, gamma, beta, y, mean, var);
}
static inline gp_status gp_dev_bn_fwd_infer(gp_device *dev, const gp_bn_desc *d,
                                            const float *x, const float *gamma,
                                            const float *beta, const float *mean,
                                            const float *var, float *y)
{
    GP_ASSERT(!d->add16);
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "batch norm");
    return GP_LAUNCH(dev, bn_fwd_infer)(dev, d, x, gamma, beta, mean, var, y);
}
static inline gp_status gp_dev_bn_bwd(gp_device *dev, const gp_bn_desc *d, const float *x,
                                      const float *gamma, const float *beta, const float *mean,
                                      const float *var, const float *dy, float *dx,
                                      float *dgamma, float *dbeta)
{
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "batch norm");
    return GP_LAUNCH(dev, bn_bwd)(dev, d, x, gamma, beta, mean, var, dy, dx, dgamma, dbeta);
}
static inline gp_status gp_dev_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n)
{
    return GP_LAUNCH(dev, relu_fwd)(dev, x, y, n);
}
static inline gp_status gp_dev_relu_bwd(gp_device *dev, const float *y, const float *dy,
                                        float *dx, int64_t n)
{
    return GP_LAUNCH(dev, relu_bwd)(dev, y, dy, dx, n);
}
static inline gp_status gp_dev_log_softmax(gp_device *dev, const float *x, float *y,
                                           int64_t rows, int64_t cols)
{
    return GP_LAUNCH(dev, log_softmax)(dev, x, y, rows, cols);
}
static inline gp_status gp_dev_xent_ld(gp_device *dev, const float *logits,
                                       const float *labels, int64_t rows, int64_t cols,
                                       int64_t ld, float scale, float smoothing, float *dlogits,
                                       double *loss_sum, int64_t *correct, int64_t *bad_row)
{
    gp_dev_count_wait(dev);
    return GP_LAUNCH(dev, xent)(dev, logits, labels, rows, cols, ld, scale, smoothing, dlogits,
                            loss_sum, correct, bad_row);
}
/* Rows of cols floats (no padding). */
static inline gp_status gp_dev_xent(gp_device *dev, const float *logits, const float *labels,
                                    int64_t rows, int64_t cols, float scale, float smoothing,
                                    float *dlogits, double *loss_sum, int64_t *correct,
                                    int64_t *bad_row)
{
    return gp_dev_xent_ld(dev, logits, labels, rows, cols, cols, scale, smoothing, dlogits,
                          loss_sum, correct, bad_row);
}
static inline gp_status gp_dev_dropout_mask(gp_device *dev, float *mask, int64_t n, float p,
                                            uint64_t seed, uint64_t stream, uint64_t first)
{
    return GP_LAUNCH(dev, dropout_mask)(dev, mask, n, p, seed, stream, first);
}
/* act_block (0 where the backend has none). */
static inline int64_t gp_dev_act_block(gp_device *dev, const gp_conv_desc *d, bool output)
{
    return dev->iface->act_block ? GP_LAUNCH(dev, act_block)(dev, d, output) : 0;
}
/* bf16_pack / bf16_unpack (GP_ERR_UNSUPPORTED where the backend has none). */
gp_status gp_dev_bf16_pack(gp_device *dev, uint16_t *dst, const float *src, int64_t n);
gp_status gp_dev_bf16_unpack(gp_device *dev, float *dst, const uint16_t *src, int64_t n);
gp_status gp_dev_dropout_apply(gp_device *dev, const float *x, float *y, int64_t n, float p,
                               uint64_t seed, uint64_t stream, uint64_t first);
static inline gp_status gp_dev_mul(gp_device *dev, const float *a, const float *b, float *y,
                                   int64_t n)
{
    return GP_LAUNCH(dev, mul)(dev, a, b, y, n);
}

/* The same copy with as few axes as it has: axes of one element dropped,
 * and an axis merged into the next inner one wherever both sides are
 * contiguous across them, the result right-aligned in the 4 (leading axes
 * of size 1, stride 0).  A concatenation's slice of (N, C, H, W) becomes N
 * rows of C H W contiguous values.  Returns the axes left (0 for an empty
 * box, left as it was). */
int gp_box_collapse(const int64_t ds[4], const int64_t ss[4], const int64_t dims[4],
                    int64_t ods[4], int64_t oss[4], int64_t odims[4]);

/* The copy_box slot on the box gp_box_collapse makes, so that a backend
 * sees a concatenation's rows as rows (the CPU one memcpy a row, a GPU a
 * 2-D memcpy) rather than dividing per element. */
static inline gp_status gp_dev_copy_box_es(gp_device *dev, void *dst,
                                           const int64_t dst_stride[4], const void *src,
                                           const int64_t src_stride[4], const int64_t dims[4],
                                           size_t es)
{
    GP_ASSERT(es == 4 || es == 2);
    if (!dev->iface->copy_box)
        return gp_error_set(GP_ERR_UNSUPPORTED, "the %s backend cannot copy strided boxes",
                            dev->iface->backend_name);
    int64_t ds[4], ss[4], d[4];
    if (gp_box_collapse(dst_stride, src_stride, dims, ds, ss, d) == 0) return GP_OK;
    return GP_LAUNCH(dev, copy_box)(dev, dst, ds, src, ss, d, es);
}

/* The box of FP32 values. */
static inline gp_status gp_dev_copy_box(gp_device *dev, float *dst, const int64_t dst_stride[4],
                                        const float *src, const int64_t src_stride[4],
                                        const int64_t dims[4])
{
    return gp_dev_copy_box_es(dev, dst, dst_stride, src, src_stride, dims, sizeof(float));
}
/* The U-Net slots above; GP_ERR_UNSUPPORTED (naming the device, its
 * backend and the op) when a slot is NULL.  Nothing is called for zero
 * elements (bce_logits then reports 0 / 0 / -1); the upsample wrappers
 * refuse (GP_ERR_INVALID) a negative size or a scale below 1. */
gp_status gp_dev_leaky_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n,
                                float slope);
gp_status gp_dev_leaky_relu_bwd(gp_device *dev, const float *y, const float *dy, float *dx,
                                int64_t n, float slope);
gp_status gp_dev_mul_rows(gp_device *dev, const float *x, const float *s, float *y,
                          int64_t rows, int64_t cols);
/* backend.h's attn_fwd / attn_bwd; GP_ERR_UNSUPPORTED naming the device
 * where the backend has none, GP_ERR_INVALID for sizes that do not fit
 * (heads must divide c); nothing is called for b t = 0. */
gp_status gp_dev_attn_fwd(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                          int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
gp_status gp_dev_attn_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                          const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                          int64_t kv_heads, int64_t c);
/* The Transformer slots (gelu_*, layer_norm_*, embed_*); GP_ERR_UNSUPPORTED (naming the device,
 * its backend and the op) when a slot is NULL; nothing is called for zero
 * elements (rows or c 0). */
/* Whether act_bf16 takes `kind` on dev (else the storage adapter runs it). */
static inline bool gp_dev_act_bf16_has(const gp_device *dev, gp_act_kind kind)
{
    return dev->iface->act_bf16 && (dev->iface->act_bf16_kinds >> kind & 1u);
}
/* act_bf16 (backend.h); GP_ERR_UNSUPPORTED where gp_dev_act_bf16_has is false. */
gp_status gp_dev_act_bf16(gp_device *dev, gp_act_kind kind, const uint16_t *xy,
                          const uint16_t *dy, uint16_t *out, int64_t n, float slope);
/* attn_fwd_bf16 / attn_bwd_bf16 (backend.h); GP_ERR_UNSUPPORTED naming the
 * device where the backend has none (gp_dev_attn_bf16_has says). */
static inline bool gp_dev_attn_bf16_has(const gp_device *dev)
{
    return dev->iface->attn_fwd_bf16 && dev->iface->attn_bwd_bf16;
}
/* Whether layer norm takes bf16 storage on dev (layer_norm_*_bf16). */
static inline bool gp_dev_layer_norm_bf16_has(const gp_device *dev)
{
    return dev->iface->layer_norm_fwd_bf16 && dev->iface->layer_norm_bwd_data_bf16 &&
           dev->iface->layer_norm_bwd_weights_bf16;
}
/* Whether dev runs add_layer_norm_fwd and layer_norm_bwd_data_add on
 * element type dt (bf16: with the layer norm's other bf16 slots). */
static inline bool gp_dev_add_norm_has(const gp_device *dev, gp_dtype dt)
{
    return dev->iface->add_layer_norm_fwd && dev->iface->layer_norm_bwd_data_add &&
           (dt == GP_F32 || (dt == GP_BF16 && gp_dev_layer_norm_bf16_has(dev) &&
                             dev->iface->add_bf16));
}
/* rope (backend.h); GP_ERR_UNSUPPORTED where the backend has none; no
 * rows or positions: nothing. */
gp_status gp_dev_rope(gp_device *dev, gp_dtype dt, const gp_rope_desc *d, bool inverse,
                      const void *x, void *y);
/* attn_cached (backend.h); GP_ERR_UNSUPPORTED where the backend has none;
 * b or n 0: nothing. */
gp_status gp_dev_attn_cached(gp_device *dev, gp_dtype dt, const void *x, void *kv, void *y,
                             int64_t b, int64_t n, int64_t pos, int64_t cap, int64_t heads,
                             int64_t kv_heads, int64_t c);
/* swiglu_* (backend.h); GP_ERR_UNSUPPORTED where the backend has none. */
gp_status gp_dev_swiglu_fwd(gp_device *dev, gp_dtype dt, const void *x, void *y, int64_t rows,
                            int64_t h);
gp_status gp_dev_swiglu_bwd(gp_device *dev, gp_dtype dt, const void *x, const void *dy, void *dx,
                            int64_t rows, int64_t h);
/* rms_norm_* (backend.h); GP_ERR_UNSUPPORTED where the backend has none;
 * rows or c 0: nothing. */
gp_status gp_dev_rms_norm_fwd(gp_device *dev, gp_dtype dt, const void *x, const float *w, void *y,
                              float *rstd, int64_t rows, int64_t c, float eps);
gp_status gp_dev_rms_norm_bwd_data(gp_device *dev, gp_dtype dt, const void *x, const float *w,
                                   const float *rstd, const void *dy, void *dx, int64_t rows,
                                   int64_t c);
gp_status gp_dev_rms_norm_bwd_weights(gp_device *dev, gp_dtype dt, const void *x,
                                      const float *rstd, const void *dy, float *dw, int64_t rows,
                                      int64_t c);
/* add_layer_norm_fwd, layer_norm_bwd_data_add (backend.h);
 * GP_ERR_UNSUPPORTED where gp_dev_add_norm_has is false; rows or c 0:
 * nothing. */
gp_status gp_dev_add_layer_norm_fwd(gp_device *dev, gp_dtype dt, const void *a, const void *b,
                                    void *s, const float *w, const float *bias, void *y,
                                    float *mean, float *rstd, int64_t rows, int64_t c, float eps);
gp_status gp_dev_layer_norm_bwd_data_add(gp_device *dev, gp_dtype dt, const void *x,
                                         const float *w, const float *mean, const float *rstd,
                                         const void *dy, void *dx, int64_t rows, int64_t c);
/* layer_norm_*_bf16 (backend.h); GP_ERR_UNSUPPORTED where
 * gp_dev_layer_norm_bf16_has is false; rows or c 0: nothing. */
gp_status gp_dev_layer_norm_fwd_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                     const float *b, uint16_t *y, float *mean, float *rstd,
                                     int64_t rows, int64_t c, float eps);
gp_status gp_dev_layer_norm_bwd_data_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                          const float *mean, const float *rstd,
                                          const uint16_t *dy, uint16_t *dx, int64_t rows,
                                          int64_t c);
gp_status gp_dev_layer_norm_bwd_weights_bf16(gp_device *dev, const uint16_t *x,
                                             const float *mean, const float *rstd,
                                             const uint16_t *dy, float *dw, float *db,
                                             int64_t rows, int64_t c);
/* dropout_apply_bf16, mul_rows_bf16 (backend.h); GP_ERR_UNSUPPORTED where
 * the backend has none; empty calls do nothing. */
gp_status gp_dev_dropout_apply_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                    float p, uint64_t seed, uint64_t stream, uint64_t first);
gp_status gp_dev_mul_rows_bf16(gp_device *dev, const uint16_t *x, const float *s, uint16_t *y,
                               int64_t rows, int64_t cols);
/* Whether a linear layer on dev takes bf16 storage as it is: the
 * linear_*_bf16 slots, under precision bf16 (else the storage adapter's
 * FP32 math on the widened values, the storage-only contract). */
static inline bool gp_dev_linear_bf16_has(const gp_device *dev)
{
    return dev->iface->linear_fwd_bf16 && dev->iface->linear_bwd_data_bf16 &&
           dev->iface->linear_bwd_weights && dev->precision == GP_PRECISION_BF16;
}
/* linear_*_bf16 (backend.h); GP_ERR_UNSUPPORTED where gp_dev_linear_bf16_has
 * is false. */
gp_status gp_dev_linear_fwd_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                 const uint16_t *x, const float *w, const float *bias, bool relu,
                                 uint16_t *y);
gp_status gp_dev_linear_bwd_data_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                      const uint16_t *dy, const float *w, uint16_t *dx);
/* linear_bwd_weights on dy and x of element type dt: bf16 as the other
 * linear_*_bf16 slots; FP32 the slot where the backend has it, else gemm,
 * fill and sum_rows (three launches). */
gp_status gp_dev_linear_bwd_weights(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                    int64_t in, const void *dy, const void *x, float *dw,
                                    float *db, bool fresh);
/* Whether dev runs linear_gelu_fwd and linear_gelu_bwd_data on element
 * type dt (bf16: with the linear layer's and GELU's bf16 slots). */
static inline bool gp_dev_linear_gelu_has(const gp_device *dev, gp_dtype dt)
{
    return dev->iface->linear_gelu_fwd && dev->iface->linear_gelu_bwd_data &&
           (dt == GP_F32 || (dt == GP_BF16 && gp_dev_linear_bf16_has(dev) &&
                             gp_dev_act_bf16_has(dev, GP_ACT_GELU)));
}
/* linear_gelu_fwd, linear_gelu_bwd_data (backend.h); GP_ERR_UNSUPPORTED
 * where gp_dev_linear_gelu_has is false; an empty product: nothing. */
gp_status gp_dev_linear_gelu_fwd(gp_device *dev, gp_dtype dt, int64_t n, int64_t out, int64_t in,
                                 const void *x, const float *w, const float *bias, void *pre,
                                 void *y);
gp_status gp_dev_linear_gelu_bwd_data(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                      int64_t in, const void *dy, const float *w,
                                      const void *pre, void *dx);
/* norm_leaky_bwd_bf16, upsample_*_bf16 (backend.h), checked as their FP32
 * slots are; GP_ERR_UNSUPPORTED where the backend has none. */
gp_status gp_dev_norm_leaky_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *yz,
                                     bool from_z, float slope, const float *var,
                                     const uint16_t *dy, uint16_t *dx);
gp_status gp_dev_upsample_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale);
gp_status gp_dev_upsample_bwd_bf16(gp_device *dev, const uint16_t *dy, uint16_t *dx, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale);
/* xent_bf16 (backend.h); GP_ERR_UNSUPPORTED where the backend has none. */
gp_status gp_dev_xent_bf16(gp_device *dev, const uint16_t *logits, const float *labels,
                           int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                           uint16_t *dlogits, gp_loss_result *out);
/* Whether convolution d takes bf16 storage on dev: the device has the
 * conv_*_bf16 slots and runs d in bf16 (precision bf16 and
 * gp_bf16_conv_worth); else the storage adapter runs it.  Its activations
 * may be channel-blocked (d->xblk, d->yblk) where the device says so
 * (gp_dev_act_block: a CPU's oneDNN block, a GPU's channels-last). */
static inline bool gp_dev_conv_bf16_takes(const gp_device *dev, const gp_conv_desc *d)
{
    return dev->iface->conv_fwd_bf16 && dev->iface->conv_bwd_data_bf16 &&
           dev->iface->conv_bwd_weights_bf16 && dev->precision == GP_PRECISION_BF16 &&
           gp_bf16_conv_worth(d);
}
/* conv_*_bf16 (backend.h); GP_ERR_UNSUPPORTED where gp_dev_conv_bf16_takes
 * is false. */
gp_status gp_dev_conv_fwd_bf16(gp_device *dev, const gp_conv_desc *d, const uint16_t *x,
                               const float *w, const float *b, uint16_t *y);
gp_status gp_dev_conv_bwd_data_bf16(gp_device *dev, const gp_conv_desc *d, const float *w,
                                    const uint16_t *dy, uint16_t *dx);
gp_status gp_dev_conv_bwd_weights_bf16(gp_device *dev, const gp_conv_desc *d,
                                       const uint16_t *x, const uint16_t *dy, float *dw,
                                       float *db);
/* add_bf16 (backend.h); GP_ERR_UNSUPPORTED where the backend has none. */
gp_status gp_dev_add_bf16(gp_device *dev, const uint16_t *a, const uint16_t *b, uint16_t *y,
                          int64_t n);
/* Whether pooling takes bf16 storage on dev (pool_*_bf16; else the
 * storage adapter runs it). */
static inline bool gp_dev_pool_bf16_has(const gp_device *dev)
{
    return dev->iface->pool_fwd_bf16 && dev->iface->pool_bwd_bf16;
}
/* pool_*_bf16 (backend.h); GP_ERR_UNSUPPORTED where gp_dev_pool_bf16_has is
 * false. */
gp_status gp_dev_pool_fwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               uint16_t *y, void *ws);
gp_status gp_dev_pool_bwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               const uint16_t *y, const uint16_t *dy, uint16_t *dx,
                               const void *ws);
/* Whether batch norm takes bf16 storage on dev (bn_*_bf16; else the
 * storage adapter runs it). */
static inline bool gp_dev_bn_bf16_has(const gp_device *dev)
{
    return dev->iface->bn_fwd_train_bf16 && dev->iface->bn_fwd_infer_bf16 &&
           dev->iface->bn_bwd_bf16;
}
/* bn_*_bf16 (backend.h); GP_ERR_UNSUPPORTED where gp_dev_bn_bf16_has is
 * false. */
gp_status gp_dev_bn_fwd_train_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, uint16_t *y,
                                   float *mean, float *var);
gp_status gp_dev_bn_fwd_infer_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, const float *mean,
                                   const float *var, uint16_t *y);
gp_status gp_dev_bn_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const uint16_t *dy, uint16_t *dx, float *dgamma,
                             float *dbeta);
gp_status gp_dev_attn_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                               int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
gp_status gp_dev_attn_bwd_bf16(gp_device *dev, const uint16_t *x, const uint16_t *y,
                               const float *lse, const uint16_t *dy, uint16_t *dx, int64_t b,
                               int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
gp_status gp_dev_gelu_fwd(gp_device *dev, const float *x, float *y, int64_t n);
gp_status gp_dev_gelu_bwd(gp_device *dev, const float *x, const float *dy, float *dx, int64_t n);
gp_status gp_dev_layer_norm_fwd(gp_device *dev, const float *x, const float *w, const float *b,
                                float *y, float *mean, float *rstd, int64_t rows, int64_t c,
                                float eps);
gp_status gp_dev_layer_norm_bwd_data(gp_device *dev, const float *x, const float *w,
                                     const float *mean, const float *rstd, const float *dy,
                                     float *dx, int64_t rows, int64_t c);
gp_status gp_dev_layer_norm_bwd_weights(gp_device *dev, const float *x, const float *mean,
                                        const float *rstd, const float *dy, float *dw, float *db,
                                        int64_t rows, int64_t c);
gp_status gp_dev_embed_fwd(gp_device *dev, const float *ids, const float *wte, const float *wpe,
                           gp_dtype dt, void *y, int64_t n, int64_t t, int64_t c, int64_t vocab,
                           int64_t *bad);
gp_status gp_dev_embed_bwd(gp_device *dev, const float *ids, gp_dtype dt, const void *dy,
                           float *dwte, float *dwpe, int64_t n, int64_t t, int64_t c,
                           int64_t vocab);
/* backend.h's norm_leaky_bwd; GP_ERR_UNSUPPORTED where the backend has
 * none. */
gp_status gp_dev_norm_leaky_bwd(gp_device *dev, const gp_bn_desc *d, const float *yz, bool from_z,
                                float slope, const float *var, const float *dy, float *dx);
gp_status gp_dev_upsample_fwd(gp_device *dev, const float *x, float *y, int64_t n, int64_t c,
                              int64_t h, int64_t w, int64_t scale);
gp_status gp_dev_upsample_bwd(gp_device *dev, const float *dy, float *dx, int64_t n, int64_t c,
                              int64_t h, int64_t w, int64_t scale);
gp_status gp_dev_bce_logits(gp_device *dev, const float *z, const float *t, int64_t n,
                            float scale, float *dz, double *loss_sum, int64_t *correct,
                            int64_t *bad);

/* --- tensors on a device (backend/tensor.c) -----------------------------
 * The half of gp_tensor that needs a device: memory through gp_dev_alloc,
 * so every byte is accounted.  Shapes, views and sizes are in core. */

/* Allocate an uninitialised tensor of floats on `dev`. */
gp_status gp_tensor_alloc(gp_tensor *t, gp_device *dev, const gp_shape *shape,
                          gp_mem_category cat);
/* Allocate an uninitialised tensor of element type `dtype` on `dev`: its
 * gp_tensor_bytes, accounted under `cat`. */
gp_status gp_tensor_alloc_as(gp_tensor *t, gp_device *dev, const gp_shape *shape,
                             gp_dtype dtype, gp_mem_category cat);
/* Allocate and zero (floats). */
gp_status gp_tensor_zeros(gp_tensor *t, gp_device *dev, const gp_shape *shape,
                          gp_mem_category cat);
/* Free if owned; always leaves t empty.  NULL and empty tensors are fine. */
void gp_tensor_free(gp_tensor *t);
/* Free if owned, keeping t's shape, element type and device: values no
 * backward reads, dropped after a forward (an unkept layer output). */
void gp_tensor_drop(gp_tensor *t);
/* Copy between tensors on any devices (same numel and element type): peer
 * copy where the backend has one, else staged through host memory. */
gp_status gp_tensor_copy(gp_tensor *dst, const gp_tensor *src);
/* dst = src converted to dst's element type, on their one device's compute
 * stream (bf16_pack rounds to nearest even, bf16_unpack widens exactly; the
 * same type is a device copy).  Same numel; an empty src converts to
 * nothing. */
gp_status gp_tensor_convert(gp_tensor *dst, const gp_tensor *src);
/* *out = src as element type `dtype` (category `cat`): src itself, a view
 * (owned false), when it already is; else a new tensor converted from it,
 * or, where src has no memory (a shape kept without its values), a view
 * with the shape alone.  What gp_layer's storage adapter and the losses
 * widen bf16 activations into. */
gp_status gp_tensor_as(gp_tensor *out, const gp_tensor *src, gp_dtype dtype, gp_mem_category cat);

/* A communicator over n devices of one backend, created once per group
 * (ncclCommInitAll on CUDA, cpu_comm.c on the CPU).  GP_ERR_UNSUPPORTED for
 * mixed groups. */
gp_status gp_comm_create(gp_device **devs, int n, gp_comm **out);
void gp_comm_destroy(gp_comm *comm);
/* The collectives above; GP_ERR_UNSUPPORTED when the slot is NULL. */
gp_status gp_dev_allreduce(gp_device *dev, gp_comm *comm, float *buf, int64_t n);
gp_status gp_dev_broadcast(gp_device *dev, gp_comm *comm, float *buf, int64_t n,
                           int root);
/* Elements [*lo, *hi) of chunk r when n elements are cut into `ranks`
 * chunks (sizes differ by at most one; any n works). */
static inline void gp_comm_chunk(int64_t n, int ranks, int r, int64_t *lo, int64_t *hi)
{
    *lo = n * r / ranks;
    *hi = n * (r + 1) / ranks;
}
/* Whether dev's backend has both sharded collectives, i.e. whether data
 * parallelism shards the optimizer update on it (pipeline.c, replicas.c). */
bool gp_dev_can_shard(const gp_device *dev);
/* The sharded collectives above; GP_ERR_UNSUPPORTED when a slot is NULL. */
gp_status gp_dev_reduce_scatter(gp_device *dev, gp_comm *comm, float *buf, int64_t n);
gp_status gp_dev_all_gather(gp_device *dev, gp_comm *comm, float *buf, int64_t n);
/* The sharded_sgd slot, or reduce_scatter + sgd_update + all_gather where
 * it is NULL.  Needs gp_dev_can_shard(dev).  v (and Adam's m and v below):
 * this rank's chunk of the state alone, gp_comm_chunk's hi - lo floats. */
gp_status gp_dev_sharded_sgd(gp_device *dev, gp_comm *comm, float *w, float *g, float *v,
                             int64_t n, float lr, float mu, float wd, int nesterov);
/* Adam's sharded step, composed: reduce_scatter(g), Adam on this rank's
 * chunk of w, m (first moment) and v (second), all_gather(w). */
gp_status gp_dev_sharded_adam(gp_device *dev, gp_comm *comm, float *w, float *g, float *m,
                              float *v, int64_t n, float wd, const gp_adam_step *a);
/* Every rank of comm calls it from its own thread; it returns when all have
 * (the barrier slot, or an all-reduce of one float + synchronize). */
gp_status gp_dev_barrier(gp_device *dev, gp_comm *comm);
/* Host memory for data that will be uploaded to dev: pinned where the
 * backend has host_alloc, else 64-byte aligned malloc (also when dev is
 * NULL).  Free with gp_dev_host_free and the same dev. */
gp_status gp_dev_host_alloc(gp_device *dev, size_t bytes, void **out);
void gp_dev_host_free(gp_device *dev, void *ptr);
/* comm->abort / comm->reset (no-ops when NULL). */
void gp_comm_abort(gp_comm *comm);
void gp_comm_reset(gp_comm *comm);
/* The rank of dev in comm, or -1. */
int gp_comm_rank(const gp_comm *comm, const gp_device *dev);
/* The CPU backend's communicator (backend/cpu/cpu_comm.c): collectives
 * between the devices' worker threads over their own buffers. */
gp_status gp_cpu_comm_create(gp_device **devs, int n, gp_comm **out);

/* GP_ERR_INVALID naming dev unless d has positive sizes and eps >= 0 (the
 * CPU backend's batch norm and the SyncBN wrappers below check with it). */
gp_status gp_bn_desc_check(const gp_device *dev, const gp_bn_desc *d);
/* The SyncBN slots above; GP_ERR_UNSUPPORTED when a slot is NULL; the
 * descriptor (and bn_bwd_apply's count >= 1) checked for every backend. */
gp_status gp_dev_bn_stats(gp_device *dev, const gp_bn_desc *d, const float *x, float *mean,
                          float *var);
gp_status gp_dev_bn_bwd_sums(gp_device *dev, const gp_bn_desc *d, const float *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const float *dy, float *sums);
gp_status gp_dev_bn_bwd_apply(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const float *dy, const float *sums,
                              double count, float *dx, const float *local, float *dgamma,
                              float *dbeta);

#endif /* GP_BACKEND_H */
