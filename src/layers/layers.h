/*
 * layers.h — the layer interface and the layer catalogue.
 *
 * A layer is a vtable (gp_layer_ops) plus its spec, shapes, parameters and a
 * private state.  Layers know their device only as the gp_device they were
 * placed on; they never know which stage, worker or micro-batch they serve.
 *
 * Per-invocation memory.  forward() does not keep activations inside the
 * layer: whatever backward needs beyond the layer's input x and output y goes
 * into a caller-provided gp_saved, one per (layer, micro-batch).  The caller
 * keeps x, y and the gp_saved alive until backward is done and then calls
 * gp_saved_free().  This is what lets a pipeline hold many micro-batches in
 * flight, and lets checkpointing drop everything but a stage's input and
 * recompute it (forward with ctx->recompute set).
 *
 * Backward protocol, per (layer, micro-batch):
 *   backward_data  (dx =)   — only when the previous layer needs dx;
 *   backward_weights (dW +=) — always, after backward_data if that ran.
 * A layer whose natural kernel produces both at once (batch norm, the
 * residual block) may do its weight work in backward_data and note it in
 * gp_saved.flags, so backward_weights then only finishes what is left.
 *
 * Determinism: forward is a pure function of (parameters, x, ctx).  Dropout
 * draws its mask from the counter-based RNG keyed by (seed, step, layer
 * index) and indexed by the sample's position in the whole mini-batch
 * (ctx->sample_offset), so any split into micro-batches, and any
 * recomputation, draws the very same mask.
 *
 * Batch-norm running statistics are not touched in forward: training forward
 * (recompute excluded) keeps the micro-batch's (count, mean, M2) for the
 * step (ctx->step_micro of them; past that, or unknown, merged into a
 * per-step accumulator at once), and commit() merges them and folds the
 * whole mini-batch into the running statistics once per step.  With
 * `sync: true` and a communicator in the context, the micro-batch's
 * statistics are first merged over the replicas (SyncBN, batchnorm.c).
 *
 * Owns: the layer interface, every layer and its parameters, the losses.
 * May call: core and backend (through the gp_dev_* wrappers only).  Knows
 * nothing of stages, schedules, checkpointing or optimizers.
 *
 * Thread safety: a layer is used by its device's worker thread only.
 */
#ifndef GP_LAYERS_H
#define GP_LAYERS_H

#include "backend/backend.h"

typedef enum gp_layer_type {
    GP_LAYER_LINEAR = 0,
    GP_LAYER_CONV2D,
    GP_LAYER_BATCHNORM,
    GP_LAYER_RELU,
    GP_LAYER_MAXPOOL2D,
    GP_LAYER_AVGPOOL2D,
    GP_LAYER_GLOBAL_AVGPOOL,
    GP_LAYER_FLATTEN,
    GP_LAYER_DROPOUT,
    GP_LAYER_RESIDUAL,
    GP_LAYER_IDENTITY,
    GP_LAYER_ADD,
    GP_LAYER_CONCAT,
    GP_LAYER_LEAKY_RELU,
    GP_LAYER_DROPOUT2D,
    GP_LAYER_INSTANCE_NORM,
    GP_LAYER_UPSAMPLE,
    GP_LAYER_FACTORIZED_REDUCE,
    GP_LAYER_AMOEBA_CELL,
    GP_LAYER_ATTENTION,
    GP_LAYER_GELU,
    GP_LAYER_LAYER_NORM,
    GP_LAYER_EMBEDDING,
    GP_LAYER_RMS_NORM,
    GP_LAYER_SWIGLU,
    GP_LAYER_ROPE,
    GP_LAYER_TYPE_COUNT
} gp_layer_type;

/* Whether a layer type may run in place (gp_layer_ops.inplace). */
typedef enum gp_inplace {
    GP_INPLACE_NO = 0,
    GP_INPLACE_VALUES, /* overwrites its input with its output */
    GP_INPLACE_VIEW,   /* its output is its input, unchanged */
} gp_inplace;

/* "linear", "conv2d", ... (the names used in YAML). */
const char *gp_layer_type_name(gp_layer_type t);
/* Returns false if `name` is not a layer type. */
bool gp_layer_type_parse(const char *name, gp_layer_type *out);

/* Longest skip name (with its terminator), and the most skips one layer
 * pops. */
#define GP_SKIP_NAME 40
#define GP_MAX_POPS 2

/* A (height, width) pair: the kernel, stride and padding of the window
 * layers (conv2d, the pools), which may differ per axis (AmoebaNet's 1x7
 * and 7x1 convolutions).  YAML takes an integer n for {n, n} or [h, w]. */
typedef struct gp_hw {
    int64_t h, w;
} gp_hw;
static inline gp_hw gp_hw_square(int64_t v) { return (gp_hw){v, v}; }
static inline bool gp_hw_is_square(gp_hw v) { return v.h == v.w; }
/* "3" for a square pair, "[1, 7]" otherwise (YAML that reads back the
 * same).  Returns buf. */
const char *gp_hw_str(gp_hw v, char *buf, size_t len);

/* How conv2d and linear initialise their weight (the bias, if any, is
 * PyTorch's uniform(+-1/sqrt(fan_in)), but 0 under GP_INIT_NORMAL). */
typedef enum gp_conv_init {
    GP_INIT_DEFAULT = 0,          /* PyTorch's default: kaiming_uniform_(a = sqrt(5)),
                                     i.e. uniform(+-1/sqrt(C * KH * KW)) */
    GP_INIT_KAIMING_NORMAL_FAN_OUT, /* torchvision's ResNet: kaiming_normal_(mode =
                                     'fan_out', nonlinearity = 'relu'), i.e.
                                     normal(0, sqrt(2 / (K * KH * KW))) */
    GP_INIT_NORMAL,               /* GPT-2's (and llm.c's): weight normal(0, spec.std),
                                     bias 0 (linear, conv2d) */
    GP_INIT_COUNT
} gp_conv_init;
/* "default", "kaiming_normal_fan_out", "normal" (the names used in YAML). */
const char *gp_conv_init_name(gp_conv_init i);

/* What a config says about one layer.  Fields a type does not use are
 * ignored; 0 / -1 mean "not given" where stated. */
typedef struct gp_layer_spec {
    gp_layer_type type;
    char name[64];        /* optional user label; "" if none */
    char tie[64];         /* linear: the name of an earlier layer whose
                             (out, in) weight this layer's weight is
                             (GPT-2's LM head tied to the embedding's
                             wte.weight: `tie: transformer`); "" if none.
                             One parameter, wherever the two layers'
                             stages are (docs/language-models.md) */
    int line, column;     /* where the config defined it (0 if not from YAML) */
    char file[128];       /* config file it came from, for messages; "" if none */
    char set[96];         /* the --set that made or changed it ("model.layers.3.padding=2"),
                             for messages; "" if none */
    int64_t in;           /* linear in_features / conv in_channels; 0 = infer */
    int64_t out;          /* linear out_features / conv out_channels /
                             residual, factorized_reduce (even) out_channels /
                             amoeba_cell channels per state (multiple of 4);
                             0 = not given (error) */
    gp_hw kernel;         /* conv, pools: (KH, KW); {0, 0} = not given (error) */
    gp_hw stride;         /* conv, pools; default {1, 1} (pools: {0, 0} = the
                             kernel).  residual, add's projection and
                             factorized_reduce take a square one only */
    gp_hw padding;        /* conv, pools: zeros on both sides of each axis;
                             default {0, 0} */
    bool bias;            /* linear, conv; default true */
    bool count_include_pad; /* avgpool2d: the zero padding counts in the
                             divisor (PyTorch's default); default true */
    gp_conv_init init;    /* conv2d and the convolutions inside residual, add
                             (projection) and factorized_reduce; default
                             GP_INIT_DEFAULT; linear: default or normal */
    float std;            /* init: normal's standard deviation; default 0.02 */
    float momentum;       /* batchnorm (and the norms inside residual, add,
                             factorized_reduce); default 0.1 (PyTorch) */
    float eps;            /* batchnorm, instance_norm; default 1e-5 */
    bool sync;            /* batchnorm: synchronise across replicas */
    float p;              /* dropout, dropout2d probability; default 0.5 */
    float slope;          /* leaky_relu negative slope (>= 0); default 0.01 */
    float leaky_after;    /* instance_norm, derived (gp_layer_specs_link), never
                             from a config: the slope (> 0) of the leaky_relu
                             that follows it in the model, whose output its
                             backward reads (in place over its own output)
                             instead of its input; 0 = none */
    int64_t scale;        /* upsample factor (>= 1); default 2 */
    bool reduction;       /* amoeba_cell: a reduction cell (stride 2 on its
                             inputs' operations); default false */
    int64_t heads;        /* attention: heads (>= 1, dividing C); rope: q's
                             heads; default 1 */
    int64_t kv_heads;     /* attention, rope: k's and v's heads (dividing
                             heads; grouped-query attention below heads);
                             0 (default): heads */
    float rope_theta;     /* rope: the base of its frequencies; default 10000 */
    bool rope_llama3;     /* rope: Llama 3's frequency scaling (rope_scaling
                             {rope_type: llama3}) with the four below */
    float rope_factor;    /* default 8 */
    float rope_low_freq;  /* low_freq_factor; default 1 */
    float rope_high_freq; /* high_freq_factor; default 4 */
    int64_t rope_orig_positions; /* original_max_position_embeddings; 8192 */
    int64_t vocab;        /* embedding: token ids in [0, vocab); 0 = not given (error) */
    int64_t dim;          /* embedding: the width of its output; 0 = not given (error) */
    int64_t positions;    /* embedding: rows of its position table (>= T);
                             0 = not given (error) */
    int64_t valid_rows;   /* embedding, linear: of the weight's rows (vocab,
                             out), the real ones; those past them are padding
                             (model.gpt.vocab_pad: llm.c's Vp, a vocabulary
                             rounded up for the GPU's matmuls) that start at 0:
                             an embedding takes ids below valid_rows, and a
                             linear's outputs past it are logits no loss reads
                             (gp_loss's classes), so they get no gradient and
                             stay 0.  0 (default): every row is real */
    /* Skip connections (torchgpipe's stash / pop; docs/config.md): the
     * layer's output is also kept under the name `stash` ("" none) until
     * the one layer that pops it; a layer that pops takes the popped
     * tensors as its inputs 1 .. n_pop besides its main input 0. */
    char stash[GP_SKIP_NAME];
    char pop[GP_MAX_POPS][GP_SKIP_NAME];
    int n_pop;
} gp_layer_spec;

/* The real rows of an embedding's (vocab) or a linear's (out) weight:
 * spec.valid_rows, or all `rows` without padding. */
static inline int64_t gp_layer_spec_valid_rows(const gp_layer_spec *s, int64_t rows)
{
    return s->valid_rows > 0 && s->valid_rows < rows ? s->valid_rows : rows;
}

/* rope's frequencies for head size d (d / 2 of them): Hugging Face's
 * inv_freq, with Llama 3's scaling where the spec asks for it. */
void gp_rope_inv_freq(const gp_layer_spec *s, int64_t d, float *inv);

/* A spec of `type` with every default filled in. */
gp_layer_spec gp_layer_spec_default(gp_layer_type type);

/* The window and init options of a spec as YAML, for summaries
 * (--dry-run): "{kernel: [1, 7], stride: 1, padding: [0, 3]}" for conv2d
 * and the pools (the pools' stride resolved; count_include_pad: false and
 * a non-default init added where set), "{init: ...}" for the composite
 * layers with a non-default init, "{heads: H}" for attention, "" for
 * everything else.  Returns buf. */
const char *gp_layer_window_str(const gp_layer_spec *s, char *buf, size_t len);

/* A trainable parameter or a buffer (running statistics). */
typedef struct gp_param {
    char name[48];        /* PyTorch-style local name: "weight", "bn1.bias",
                             "running_mean", "downsample.0.weight" */
    gp_tensor value;      /* on the layer's device, category PARAMS */
    gp_tensor grad;       /* same shape, category GRADS; empty for buffers */
    bool no_decay;        /* biases and norm parameters */
    bool is_buffer;       /* not trained (running_mean, running_var) */
    /* A replica of an earlier layer's parameter (spec.tie: a linear's
     * weight tied to an embedding's wte.weight or a linear's weight): the
     * owner, params[tie_param] of layer tie_layer, is the parameter; this
     * one is its bit-identical copy on this layer's device with its own
     * gradient.  The trainer adds the gradient into the owner's each step,
     * updates the owner alone and copies it back (gp_layers_tie_*): no
     * optimizer state, no snapshot entry, not counted, clipped or decayed
     * (gp_param_trained is false). */
    bool tied;
    int tie_layer, tie_param; /* tied: the owner; set by gp_layers_tie */
} gp_param;

/* Whether the optimizer trains p: it has state, counts in the global norm
 * and in the parameter counts (not a buffer, not a tied replica). */
static inline bool gp_param_trained(const gp_param *p) { return !p->is_buffer && !p->tied; }

/* Everything forward and backward may depend on besides the data. */
typedef struct gp_fwd_ctx {
    bool training;
    bool recompute;        /* re-running forward for checkpointing */
    uint64_t seed;         /* run seed */
    uint64_t step;         /* optimizer step (0-based) */
    int64_t sample_offset; /* first sample of this micro-batch in the batch */
    int64_t batch_total;   /* samples in the whole mini-batch */
    /* How many micro-batches this step runs forward (0: not known): batch
     * norm keeps that many micro-batches' statistics to merge them at the
     * commit, in one launch with it, instead of one merge launch each. */
    int step_micro;
    /* Data parallelism: the communicator over the devices that run this
     * same layer in the other replicas (NULL or n == 1: none), and this
     * device's rank in it.  Synchronised batch norm reduces its statistics
     * over it; every rank runs the same forwards and backwards in the same
     * order, so their collectives match up.  sample_offset and batch_total
     * then refer to the global mini-batch of all replicas. */
    gp_comm *comm;
    int rank;
    /* Set by gp_layer_backward only, for a layer whose ops declare
     * overwrites_grads, on its first backward of a step (gp_layer_grads_begin):
     * backward_weights then writes its gradients (dW =) instead of adding to
     * them, which saves zeroing them and reading them back. */
    bool grads_overwrite;
    /* Set by the stage's backward only (checkpoint.c), for a layer whose
     * ops->dx_adds says it can: the main input's gradient is this tensor's
     * memory, which holds another gradient of that input (its pop's, a
     * residual's), and backward_data adds into it (dx +=) instead of
     * writing a dx of its own that would be summed after. */
    const gp_tensor *dx_into;
    /* Set by the stage's backward only, for a linear layer right after a
     * GELU (gp_layers_gelu_linear): the GELU's input, whose derivative the
     * linear's backward_data applies to its dx (the product's epilogue on a
     * GPU), so that dx is the GELU's input's gradient and the GELU's own
     * backward is skipped. */
    const gp_tensor *gelu_in;
    /* Decoding with a KV cache (gp_decoder: sampling a token at a time),
     * evaluation forwards only: the input's T positions are positions
     * pos0 .. pos0 + T - 1 of each sequence (an embedding's position rows,
     * rope's angles; 0 everywhere else), and an attention layer given kv
     * attends over that cache ((N, cap, 2 kv_heads d), of its input's
     * element type: backend.h's attn_cached), which it extends by its
     * input's k and v, instead of over its input alone (NULL: no cache). */
    int64_t pos0;
    gp_tensor *kv;
} gp_fwd_ctx;

#define GP_SAVED_MAX 24
/* What one forward keeps for its backward.  Tensors are owned (allocated on
 * the layer's device, category ACTIVATIONS unless stated) and freed by
 * gp_saved_free. */
typedef struct gp_saved {
    gp_tensor t[GP_SAVED_MAX];
    void *ws;             /* raw workspace (pooling indices) */
    size_t ws_bytes;
    gp_device *ws_dev;
    unsigned flags;       /* layer-private */
    /* A composite layer whose children need more than t[] (the AmoebaNet
     * cell): an owned array of n_sub gp_saved, freed and counted with
     * this one. */
    struct gp_saved *sub;
    int n_sub;
} gp_saved;
void gp_saved_free(gp_saved *s);
/* Bytes held by a gp_saved. */
size_t gp_saved_bytes(const gp_saved *s);

typedef struct gp_layer gp_layer;

/* Inputs.  A layer takes its main input (the previous layer's output) and,
 * if its type takes any (ops.pops: add, concat), the tensors it pops
 * (spec.pop): every `in`, `x` and `dx` below is an array of l->n_in =
 * 1 + spec.n_pop, element 0 the main input, element 1 + q the tensor of
 * spec.pop[q].  A layer that takes no pops sees a pointer to one tensor. */
typedef struct gp_layer_ops {
    gp_layer_type type;
    /* Output shape for input shapes (any batch size).  Validates the spec
     * against the inputs (a message names the layer and what to change). */
    gp_status (*infer)(const gp_layer *l, const gp_shape *in, gp_shape *out);
    /* Allocate parameters on l->dev and initialise them like PyTorch's
     * defaults (Kaiming-uniform; convolutions as spec.init says), from the
     * counter-based RNG keyed by (seed, layer index, parameter), so the
     * values do not depend on placement.
     * Gradients are allocated and zeroed too. */
    gp_status (*init)(gp_layer *l, uint64_t seed);
    gp_status (*forward)(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                         gp_tensor *y, gp_saved *s);
    gp_status (*backward_data)(gp_layer *l, const gp_fwd_ctx *ctx,
                               const gp_tensor *x, const gp_tensor *y,
                               const gp_tensor *dy, gp_tensor *dx, gp_saved *s);
    /* backward_data's dx: an array of n_in gradients, one per input. */
    /* optional: NULL for layers without parameters */
    gp_status (*backward_weights)(gp_layer *l, const gp_fwd_ctx *ctx,
                                  const gp_tensor *x, const gp_tensor *y,
                                  const gp_tensor *dy, gp_saved *s);
    /* optional: fold this step's batch statistics into running statistics
     * (batch norm; the residual block forwards to its norms). */
    gp_status (*commit)(gp_layer *l);
    /* optional (with commit): forget the statistics this step gathered and
     * did not commit, because the step failed, so that the next step commits
     * its own alone.  No failure: it only resets state. */
    void (*discard)(gp_layer *l);
    /* Forward FLOPs for a batch of n (multiply-add = 2). */
    double (*flops)(const gp_layer *l, int64_t n);
    /* optional: bytes of gp_saved a forward of batch n keeps (beyond x, y).
     * NULL = 0. */
    size_t (*saved_bytes)(const gp_layer *l, int64_t n);
    /* optional: free parameters and state. NULL = only params freed. */
    void (*destroy)(gp_layer *l);
    /* optional (data parallelism): merge this step's pending statistics
     * with those of the same layer in the other replicas over `comm`
     * (collective: every rank calls it, before commit), so that every
     * replica commits the statistics of the global mini-batch.  NULL = no
     * statistics. */
    gp_status (*allreduce_stats)(gp_layer *l, gp_comm *comm);
    /* backward_weights honours ctx->grads_overwrite (and backward_data
     * writes no gradient).  false: gp_layer_backward zeroes the stale
     * gradients first and the layer accumulates as always. */
    bool overwrites_grads;
    /* How many popped tensors the type takes besides its main input (0 for
     * all but add, concat and amoeba_cell); spec.n_pop must equal it, or
     * with pops_optional be 0 or it. */
    int pops;
    bool pops_optional;
    /* optional: the layer's batch-norm step counters (gp_layer_counters).
     * NULL = none. */
    int (*counters)(gp_layer *l, const char **names, int64_t **values, int max);
    /* In-place execution (gp_layers_inplace).  GP_INPLACE_VALUES: forward
     * may write its output over its main input, element by element (the
     * same number of elements), and backward reads x's shape only, never
     * its values (relu and leaky_relu read y, the dropouts their mask).
     * GP_INPLACE_VIEW: the output is the input's values unchanged (identity,
     * flatten), so it may simply share the input's memory. */
    gp_inplace inplace;
    /* backward never reads y's values (only its shape, if that), so an
     * in-place layer after it may overwrite them. */
    bool bwd_ignores_y;
    /* backward (both halves) never reads the main input's values, only its
     * shape (concat, upsample, add, the element-wise layers): with
     * bwd_ignores_y on the layer before, nobody's backward needs that
     * layer's output (gp_layers_unkept). */
    bool bwd_ignores_x;
    /* backward_data's dx[0] is dy's values unchanged (identity, flatten,
     * add): gp_layer_backward_take hands dy itself on as dx[0], and
     * backward_data then finds dx[0] sharing dy's memory (gp_layers_copy of
     * a tensor onto itself is nothing). */
    bool dx_is_dy;
    /* (optional, with dx_is_dy) every input's gradient is dy unchanged
     * (the plain add): gp_layer_backward_take hands dy on as each dx[q],
     * the last input's owning the memory and the others viewing it, so no
     * device copy gives a residual's pop its gradient (issue 64: the add's
     * copy per block).  A caller frees every dx (a view's free is
     * nothing) and lets the owner outlive the views' reads. */
    bool (*dx_all_dy)(const gp_layer *l);
    /* (optional) backward_data can add its main input's gradient into a
     * tensor that holds another (ctx->dx_into) on this device and storage:
     * layer norm (layer_norm_bwd_data_add, issue 64). */
    bool (*dx_adds)(const gp_layer *l, gp_dtype dt);
    /* forward and backward move values without reading them (identity,
     * flatten): they run on tensors of any one element type as they are,
     * where the storage adapter (gp_layer's out_dtype) would widen and
     * round them for nothing. */
    bool any_dtype;
    /* Layers whose kernels take bf16 storage on some devices (relu, leaky
     * relu, GELU: gp_dev_act_bf16_has; batch norm, pooling, ...): true
     * where layer l's forward and backward take bf16 tensors as they are
     * on its device, bit for bit what the adapter would give, or within
     * rounding of it where a GPU library sums in its own order (linear
     * layers, cuBLASLt).  Composite layers (residual, amoeba_cell,
     * factorized_reduce) say true and keep their insides in bf16, each
     * child rounding its own output as the stand-alone layer would (not
     * the adapter's bits around the whole layer, by design).  The linked
     * instance norm rounds its relu's recomputed output (unet.c).  NULL:
     * any_dtype says. */
    bool (*takes_bf16)(const gp_layer *l);
    /* The main input is data that keeps its FP32 whatever the activations'
     * storage (an embedding's token ids, exact as floats up to 2^24 and
     * not in bf16): takes_bf16 then speaks of the output and its gradient
     * alone, and the adapter leaves the input as it is. */
    bool data_input;
} gp_layer_ops;

struct gp_layer {
    const gp_layer_ops *ops;
    gp_layer_spec spec;
    int index;              /* position in the model, 0-based */
    gp_device *dev;         /* where parameters live and math runs */
    gp_shape in_shape;      /* main input, for batch 1 */
    gp_shape out_shape;     /* for batch 1 */
    int n_in;               /* inputs: 1 + spec.n_pop */
    gp_shape pop_shape[GP_MAX_POPS]; /* the popped inputs, for batch 1 */
    gp_param *params;       /* [n_params] (capacity cap_params), owned */
    int n_params, cap_params;
    void *state;            /* layer-private, owned by the layer */
    int param_base;         /* RNG stream number of params[0]: 0, except for
                               the child layers inside a composite layer
                               (residual), whose params continue the
                               parent's numbering */
    bool grads_stale;       /* gradients hold an earlier step's values: the
                               next backward replaces them (grads_begin) */
    bool meta;              /* made by gp_layer_meta: parameters are shapes
                               only (value.data NULL, no grad) */
    int64_t in_blk, out_blk; /* layouts of the main input (and dx) and of the
                               output (and dy): 0 plain, else the channel
                               block (backend.h); set by gp_layers_blocked,
                               0 from gp_layer_create */
    int64_t pop_blk;        /* the popped inputs' layout (gp_layers_blocked:
                               their stash's out_blk): in_blk's for a residual
                               sum, the projection's input block for one
                               with a projection (channels-last: its input
                               channels) */
    /* batch norm followed by relu (gp_layers_relu_fused): the norm's
     * forward applies the relu and its backward masks the gradient where
     * the normalised value was not positive (relu_after, on the norm:
     * gp_bn_desc.relu), and the relu, in place on the norm's output, then
     * has nothing left to do either way (relu_done, on the relu: its
     * forward checks that its output is its input; the stage's backward
     * loop, gp_ckpt_backward, hands its gradient past it to the norm, and
     * so does the split backward of zero-bubble schedules,
     * gp_ckpt_backward_data).  Values stay bit for bit the
     * unfused ones (relu is idempotent; the mask is relu_bwd's rule on the
     * same value).  relu_skipped and relu_bwd_skipped count the relu's
     * skipped forwards and backwards.  After a linear layer relu_after and
     * relu_done mean the forward only (linear.c): the relu's backward runs
     * and is not handed past. */
    bool relu_after, relu_done;
    /* instance_norm with spec.leaky_after, in a stage whose forward ran the
     * leaky relu after it in place over its output (gp_layers_inplace;
     * set by gp_layers_norm_leaky each forward): its output's memory holds
     * the relu's output, which its backward reads as such */
    bool leaky_inplace;
    uint64_t relu_skipped, relu_bwd_skipped;
    /* a batch norm's next forward only: add this (the output's shape and
     * layout) to the normalised value and apply a relu, in the norm's own
     * pass (gp_bn_desc.add): a residual block's sum and final relu, set by
     * the block around its second norm's forward (residual.c) */
    const float *fwd_add;
    const uint16_t *fwd_add16; /* the same on bf16 storage (gp_bn_desc.add16) */
    /* The element type of the layer's output, its dy and, where its input
     * has it, its dx (activation storage, train.activations; GP_F32 from
     * gp_layer_create).  A layer whose output or any input is bf16 runs
     * through the storage adapter of the gp_layer_* wrappers unless its
     * ops are any_dtype or takes_bf16 says so: its bf16 inputs (x, y,
     * dy) widened to FP32, its FP32 kernels run, its output rounded once
     * to out_dtype and each
     * input's gradient rounded to that input's type.  What backward needs
     * beyond x and y (gp_saved) stays FP32 where the layer runs behind
     * the adapter; the composite layers (residual, amoeba_cell,
     * factorized_reduce) take bf16 and keep their children's maps in it
     * (gp_layers_child_forward, or the children's own wrappers).  The
     * values are those of FP32 math with one rounding at each layer output
     * and each gradient a layer hands back (PyTorch autocast's contract for
     * the layers it leaves in FP32). */
    gp_dtype out_dtype;
};

/* The element type layer l's forward kernels see for a main input of type
 * dt (a layer of one input): dt, or FP32 where the storage adapter widens
 * it (gp_layer.out_dtype). */
gp_dtype gp_layer_kernel_dtype(const gp_layer *l, gp_dtype dt);

/* Whether the layers this thread creates draw their random initial
 * parameters (the default) or leave them at zero, for a model whose every
 * parameter is loaded right after (model.init_from, --resume: a Llama 3.2
 * 1B spent 40 of its 61 seconds of start-up drawing values the load then
 * replaced).  Constant fills (a norm's scale of 1) are made either way.
 * Returns the setting before. */
bool gp_layers_draw_init(bool draw);
/* Whether the layers this thread builds get gradients (true: the default;
 * false: an inference-only model, gpipe-sample's, whose parameters hold
 * their values alone); returns the previous setting. */
bool gp_layers_with_grads(bool grads);

/* Make a layer of spec->type with `index`, infer shapes from `in` (batch
 * dim ignored; an array of 1 + spec->n_pop: the main input, then the
 * popped ones), place it on `dev` and initialise parameters.  On failure
 * the message names the layer ("layer 3 (conv2d) at model.yaml:12:7: ..."). */
gp_status gp_layer_create(const gp_layer_spec *spec, int index,
                          const gp_shape *in, gp_device *dev, uint64_t seed,
                          gp_layer *out);
void gp_layer_destroy(gp_layer *l);
/* gp_layer_create without a device: the spec checked against its inputs
 * and the shapes, ops, index and inputs of `out` filled in, nothing
 * allocated (no gp_layer_destroy needed), for costs and summaries. */
gp_status gp_layer_shapes(const gp_layer_spec *spec, int index, const gp_shape *in,
                          gp_layer *out);
/* gp_layer_shapes plus the parameters as they would be made, each a shape
 * without storage (value.data NULL, no gradient), so gp_layer_param_count
 * and the parameters' names work without a device or any device memory (a
 * 362M-parameter U-Net counted in milliseconds).  Nothing may run on it;
 * gp_layer_destroy frees the host state it may hold. */
gp_status gp_layer_meta(const gp_layer_spec *spec, int index, const gp_shape *in,
                        gp_layer *out);

/* Which layers of a stage's run of `count` layers run in place (inplace[c]
 * true: layer c's output shares the memory of its input, layer c - 1's
 * output).  Layer c does when its type may (ops->inplace), it takes one
 * input, and for every earlier layer whose output shares that memory (c - 1
 * and, through a chain of in-place layers before it, the layer that
 * allocated it): its backward does not read the values layer c overwrites
 * (ops->bwd_ignores_y; not needed when c only views them) and no skip
 * stashes its output (its pop reads it later).  Layer 0 never does: its
 * input is the stage input, kept for recomputation.  This is what PyTorch's
 * `inplace=True` gives torchgpipe's U-Net and ResNets: a conv -> dropout2d
 * -> instance norm -> leaky relu block keeps 2 maps instead of 4.  The
 * results are bit for bit those of the out-of-place run (the kernels are
 * element-wise, and no backward reads what was overwritten). */
void gp_layers_inplace(const gp_layer *layers, int count, bool *inplace);
/* Which activations of a stage's run of `count` layers stay in the
 * convolutions' own channel-blocked layout (backend.h, act_block): a
 * convolution's output, the layers after it and the next convolution's
 * input, when every layer between the two convolutions is a 2-d batch norm,
 * relu, leaky_relu, maxpool2d, avgpool2d, global_avgpool, identity or add
 * (each of which computes the same bits on either layout) and both
 * convolutions take the same block on their device; a skip inside a chain
 * holds where every pop of it is in the run and reads the stashed layout (a
 * residual sum in a chain of the same block, or one whose projection's
 * convolution reads the popped block: pop_blk), else the stash stays plain
 * and ends its chain, and a popping layer whose popped tensor is in
 * another layout joins none (planned again until nothing changes).  The
 * first convolution may take a plain input (a first layer's 1 or 2
 * channels, backend.h's act_block per side).  A residual block (residual.c)
 * counts as a convolution: it reads the block its conv1 and downsample
 * read, writes the one its convolutions write, and runs its children in
 * them; one with an identity shortcut needs both alike, else it runs plain
 * (planned again).  A batch norm in a chain
 * has at least as many units of channels (gp_blk_unit) as its device has
 * threads (its loops run a unit per task).  Without a convolution to end
 * it, a chain may end in its last pool, which reads the block and writes
 * plain (conv -> bn -> relu -> max pool -> flatten).  Sets every layer's
 * in_blk / out_blk / pop_blk
 * (0 elsewhere); the run's input and output stay plain, so what crosses a
 * stage boundary is plain and the stages' results equal the one-device
 * run's, whatever the partition.  What it spares: the reorders from plain
 * into the block and back around each such convolution, 2 of its 6 per
 * micro-batch (forward, backward-data, backward-weights) at each end. */
void gp_layers_blocked(gp_layer *layers, int count);
/* Which relu layers of a stage's run of `count` layers a batch norm before
 * them does the work of (fused[c] true: layer c is a relu that runs in
 * place, inplace[c], on the output of layer c - 1, a batch norm of one
 * input whose output no skip stashes, so nothing else reads the norm's
 * output before the relu), and the layers' relu_after / relu_done set to
 * match for every layer of the run.  One pass over memory fewer per pair
 * in every forward and recompute (issue 15: batch norm with its ReLU).
 * A relu in place after a linear layer of one input whose output no skip
 * stashes is done by the linear's forward too (relu_after on the linear,
 * relu_done on the relu: bias and relu in the product's epilogue, issue
 * 15), but not marked in fused[]: its backward still runs, on its output,
 * since a linear's backward reads no output to mask with. */
void gp_layers_relu_fused(gp_layer *layers, int count, const bool *inplace, bool *fused);
/* Set layers[c].leaky_inplace for a stage's forward, from its
 * gp_layers_inplace. */
void gp_layers_norm_leaky(gp_layer *layers, int count, const bool *inplace);
/* The same rule on a whole model's specs (inplace from
 * gp_layer_specs_inplace): which relus cost nothing inside a stage, for the
 * balancer's profile (a stage's first layer is never fused). */
/* In-place activated instance norm (issue 22; InPlace-ABN's trick): an
 * instance_norm followed in the model by a leaky_relu of slope > 0 gets
 * spec.leaky_after = that slope, and from then on its backward reads its
 * output, or the relu's output in place over it, instead of its input
 * (backend.h's norm_leaky_bwd, the same bits either way).  So the relu runs
 * in place over the norm's output (gp_layers_inplace) and the norm's input
 * is kept by nobody (gp_layers_unkept): in torchgpipe's U-Net unit conv,
 * dropout2d, instance_norm, leaky_relu a recompute keeps one tensor where
 * it kept two.  A model-wide property, decided before partitioning, so a
 * stage boundary between the two changes which tensor the norm reads, not
 * a bit of the result.  The config loader calls it on every model; sets
 * or clears the field on every instance_norm. */
void gp_layer_specs_link(gp_layer_spec *specs, int count);

void gp_layer_specs_relu_fused(const gp_layer_spec *specs, int count, const bool *inplace,
                               bool *fused);
/* A residual block's own fusions (residual.c: bn1 with its relu, bn2 with
 * the shortcut's sum and the final relu) on or off; on unless
 * GPIPE_FUSE_RELU=0.  For tests and A/Bs: the values do not change. */
void gp_residual_fuse(gp_layer *l, bool on);
/* Whether batch norm and relu fuse at all: false under GPIPE_FUSE_RELU=0
 * (an A/B; read once). */
bool gp_layers_fuse_relu_on(void);
/* ops->discard on every layer that has it: a failed step's pending
 * statistics forgotten (the executor and the single-device step call it on
 * failure, so a failed step leaves the model as it was). */
void gp_layers_discard(gp_layer *layers, int count);
/* Every layer's commit (ops->commit: batch norms, and the composite layers'
 * inner ones), the batch norms on `dev` held and issued together at the end
 * (gp_dev_bn_commit_begin: one launch on a GPU for a stage's norms).  On a
 * failure *bad (when not NULL) is the layer that failed, or the last one
 * where issuing the held commits did; the commits before a failed one are
 * issued all the same, as one at a time would have been. */
gp_status gp_layers_commit(gp_layer *layers, int count, gp_device *dev, int *bad);
/* The same from the specs alone (the profile's whole-model view). */
void gp_layer_specs_inplace(const gp_layer_spec *specs, int count, bool *inplace);
/* Whether a layer's backward never reads the values of its output y / of
 * its main input x (only their shapes): its type's bwd_ignores_y /
 * bwd_ignores_x, but for the linked instance norm, which reads its output
 * and not its input.  The rule gp_layers_unkept and the storage adapter
 * apply, and amoeba_cell between its children. */
bool gp_layer_spec_ignores_y(const gp_layer_spec *s);
bool gp_layer_spec_ignores_x(const gp_layer_spec *s);
/* Whether a layer's output, where the layer is a stage's last and runs out
 * of place, is read by no backward of its own stage: its backward ignores
 * y and it stashes nothing for a skip.  The next stage reads its own copy,
 * so a forward that keeps frees the stage output once that copy is made
 * (gp_stash_hand_out; gp_layer_mem.end_unread for the planner). */
bool gp_layer_spec_end_unread(const gp_layer_spec *s);
/* Which layer outputs of a stage's run no backward reads, so a forward
 * that keeps for backward frees them (keeping their shape) once the next
 * layer has run: unkept[c] when layer c's backward ignores y, layer c + 1's
 * ignores x, no skip stashes the output, and neither layer runs in place
 * (inplace from gp_layers_inplace; the memory is then the output's own).
 * The stage's last layer's output is the stage output: never.  A
 * convolution or upsample before a concat, a batch norm before an add:
 * ResNet's bottleneck keeps one map fewer, U-Net's decoder its upsampled
 * maps. */
void gp_layers_unkept(const gp_layer *layers, int count, const bool *inplace, bool *unkept);
void gp_layer_specs_unkept(const gp_layer_spec *specs, int count, const bool *inplace,
                           bool *unkept);

/* Convenience wrappers over the ops (allocate y / dx with the right shape).
 * x and dx are arrays of l->n_in (see gp_layer_ops). */
gp_status gp_layer_forward(gp_layer *l, const gp_fwd_ctx *ctx,
                           const gp_tensor *x, gp_tensor *y, gp_saved *s);
/* Forward in place (gp_layers_inplace said it may): *y becomes a view
 * (owned false) of x[0]'s memory with the output's shape, written over.
 * The caller moves the ownership where it wants it. */
gp_status gp_layer_forward_inplace(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   gp_tensor *y, gp_saved *s);
gp_status gp_layer_backward(gp_layer *l, const gp_fwd_ctx *ctx,
                            const gp_tensor *x, const gp_tensor *y,
                            const gp_tensor *dy, gp_tensor *dx /* NULL: skip */,
                            gp_saved *s);
/* The two halves of gp_layer_backward, for schedules that run a
 * micro-batch's backward-weights later than its backward-data (zero
 * bubble): backward-data (dx =; dx NULL: none) now, backward-weights
 * (dW +=) any time before the step's end with the same x, y, dy and s.
 * Both accumulate into gradients zeroed at the layer's first call of the
 * step, so halves of different micro-batches may interleave. */
gp_status gp_layer_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                 const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                 gp_saved *s);
gp_status gp_layer_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_saved *s);
/* gp_layer_backward (data_only: gp_layer_backward_data) for a caller that
 * owns dy and will not read it again: where the layer hands dy on
 * unchanged (ops->dx_is_dy) and dy owns its memory, dx[0] becomes dy
 * itself, shaped as x, and *dy is left empty, so no device copy moves the
 * gradient; otherwise as the plain call, *dy untouched.  views (whole
 * backward only) and ops->dx_all_dy: every dx[q] is dy's memory, the last
 * input's owning it and the others views of it, which the caller must read
 * before it frees the owner.  On error *dy is untouched and dx empty. */
/* A residual add and the layer norm after it in one pass (issue 64,
 * llm.c's fused residual forward): whether layers[c] is an add without
 * projection and layers[c + 1] a layer norm that reads its sum alone
 * (no pops, not in place), on one device whose add_layer_norm_fwd takes
 * their element type.  GPIPE_FUSE_ADD_NORM=0 turns it off.  Layers of a
 * model built as shapes (gp_model_build_meta, --dry-run) may have no
 * device (dev NULL: one that cannot be opened here): no fusion then, as
 * with every layout question (gp_layers_blocked). */
bool gp_layers_add_norm(const gp_layer *layers, int count, int c, const bool *inplace);
/* The pair's forward: y = the add of x (its main input and its pop), y2
 * = the norm of y with s2 the norm's saved statistics, as the two layers'
 * forwards give them (the same bits), in one device call.  *done false
 * (nothing allocated) where these inputs do not take the fused path (an
 * element type the layers adapt, no rows): the caller runs the two. */
gp_status gp_layer_add_norm_forward(gp_layer *add, gp_layer *norm, const gp_fwd_ctx *ctx,
                                    const gp_tensor *x, gp_tensor *y, gp_tensor *y2,
                                    gp_saved *s2, bool *done);
/* A linear layer and the GELU after it as one product with GELU in its
 * epilogue (issue 64, GPT-2's mlp.c_fc and mlp.gelu): whether layers[c]
 * is a linear layer (no stash, no pops) and layers[c + 1] a GELU reading
 * its output alone, on one device whose linear_gelu_fwd takes their
 * element type.  GPIPE_FUSE_GELU=0 turns it off (both directions).  No
 * device (dev NULL, gp_layers_add_norm): no fusion. */
bool gp_layers_linear_gelu(const gp_layer *layers, int count, int c, const bool *inplace);
/* The pair's forward: y = the linear's output (GELU's input), y2 = the
 * GELU of it, in one device call; *done as gp_layer_add_norm_forward's. */
gp_status gp_layer_linear_gelu_forward(gp_layer *lin, gp_layer *gelu, const gp_fwd_ctx *ctx,
                                       const gp_tensor *x, gp_tensor *y, gp_tensor *y2,
                                       bool *done);
/* Whether layers[c] is a GELU (no stash) whose gradient the linear layer
 * after it (no pops) can give in its own backward_data, GELU's derivative
 * as the product's epilogue (ctx->gelu_in = x, the GELU's input), on one
 * device with linear_gelu_bwd_data for x's element type. */
bool gp_layers_gelu_linear(const gp_layer *layers, int count, int c, const gp_tensor *x);
/* Whether the loss may write its gradient over the logits (checkpoint.c
 * gp_ckpt_loss_dev's `over`): GPIPE_FUSE_LOSS=0 says no. */
bool gp_layers_logits_over_on(void);
/* Whether layer l's backward_data can add into a gradient `into` of its
 * main input x (ctx->dx_into, ops->dx_adds). */
bool gp_layer_dx_adds(const gp_layer *l, const gp_tensor *x, const gp_tensor *into);
gp_status gp_layer_backward_take(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                 const gp_tensor *y, gp_tensor *dy, gp_tensor *dx,
                                 bool data_only, bool views, gp_saved *s);
/* *g += *sg, two gradients of one activation (a stashed output's: the
 * next layer's and its pop's), of one element type: FP32 adds in place;
 * bf16 widens both, adds in FP32 and rounds the sum once into g. */
gp_status gp_layers_accumulate(gp_device *dev, gp_tensor *g, const gp_tensor *sg);
gp_status gp_layer_zero_grad(gp_layer *l);
/* The gradients of layers[0 .. n) that hold an earlier step's values
 * (grads_begin) and that their backward sums into rather than overwrites
 * (no ops->overwrites_grads), zeroed now, as their first backward would,
 * in one gp_dev_zero_many per device instead of a fill each; those layers
 * are then no longer stale.  A stage's start calls it (pipeline.c). */
gp_status gp_layers_zero_stale(gp_layer *layers, int n);
/* GP_ERR_NUMERIC naming the tensor and the first element if any parameter
 * or buffer (running statistics) of l holds a NaN or an infinity; `when`
 * says at what point ("after the update").  One device reduction per
 * tensor; the slow path (finding the element) only on failure. */
gp_status gp_layer_check_finite(const gp_layer *l, const char *when);
/* The same for layers ls[0 .. count) of one device with no host wait, for
 * a caller that reads the flag with the step's other results (the
 * pipeline): flag_nonfinite enqueues the check of every parameter on dev
 * into *flag (one float of dev's memory, set to 1 if any is NaN or Inf,
 * else left as it is; layers on other devices are not its to check), of
 * those the optimizer does not update only when skip_trained (the update
 * checked the rest in its own pass: gp_optim_update's nonfinite);
 * name_nonfinite, once a flag was found set, reads the tensors one by one
 * and returns gp_layer_check_finite's error for the first bad one (GP_OK
 * if none is). */
gp_status gp_layers_flag_nonfinite(const gp_layer *ls, int count, gp_device *dev, float *flag,
                                   bool skip_trained);
gp_status gp_layers_name_nonfinite(const gp_layer *ls, int count, const char *when);
/* Gradient zeroing for a step without the zeroing pass: grads_begin marks
 * the gradients stale (O(1)); the layer's first backward then overwrites
 * them (or zeroes them first if its ops cannot overwrite), later backwards
 * accumulate.  grads_finish, once the step's backwards are done, zeroes
 * them if no backward ran, so the optimizer never sees stale values.  The
 * gradients equal zero_grad + the same backwards, bit for bit. */
void gp_layer_grads_begin(gp_layer *l);
gp_status gp_layer_grads_finish(gp_layer *l);
/* Elements with a gradient (every parameter but the buffers, tied replicas
 * included: they take a value and a gradient on the layer's device and
 * need its backward); gp_layer_tied_count of them are tied replicas, which
 * parameter counts leave out (their owners count them). */
int64_t gp_layer_param_count(const gp_layer *l);
int64_t gp_layer_tied_count(const gp_layer *l);
/* Tensors the optimizer trains (gp_param_trained: not buffers, not tied
 * replicas): the optimizer's and the global norm's tables. */
int gp_layer_tensor_count(const gp_layer *l);
int64_t gp_layer_buffer_count(const gp_layer *l); /* buffers' elements (batch-norm statistics) */
/* Index of the first layer with trainable parameters (n if none).  Layers
 * before it need no backward at all, and it needs no dx: the gradient would
 * only flow into parameter-free layers and the input. */
int gp_layers_first_trainable(const gp_layer *layers, int n);
/* The batch-norm step counters of a layer (PyTorch's num_batches_tracked):
 * one named "num_batches_tracked" for batchnorm, one per inner norm for a
 * residual block ("bn1.num_batches_tracked", "downsample.1.num_..."), none
 * for other layers.  Fills up to `max` names (static strings) and pointers
 * into the layer's state, which snapshots read and set between steps.
 * Returns how many the layer has. */
int gp_layer_counters(gp_layer *l, const char **names, int64_t **values, int max);
/* "layer 3 (conv2d 'c1') at f.yaml:12:7" for messages. */
const char *gp_layer_describe(const gp_layer *l, char *buf, size_t len);
/* The same for layer `index` of a config, before it is built. */
const char *gp_layer_spec_describe(const gp_layer_spec *s, int index, char *buf, size_t len);

/* The ops table of each type (layers/<type>.c). */
const gp_layer_ops *gp_layer_ops_for(gp_layer_type t);

/* ---- tied weights (tie.c) ---------------------------------------------------
 *
 * A linear layer with spec.tie names an earlier layer whose weight its own
 * weight is: an embedding (its wte.weight, (vocab, dim)) or a linear (its
 * weight, (out, in)) of the linear's (out, in) shape.  The earlier layer
 * owns the parameter (master value, optimizer state, snapshot entry); the
 * tying layer's weight is a replica (gp_param.tied) on its own device with
 * its own gradient.  A step sums the replicas' gradients into the owner's
 * (in the order of the tying layers, after the replicas' all-reduce),
 * updates the owner alone and copies it back into every replica, so every
 * copy stays bit for bit the owner whatever the stages' placement. */

/* Check every spec's tie against the specs before it (in[k]: layer k's main
 * input shape, for batch 1) and set owner[k] to the index of the layer
 * layer k ties to, -1 for none.  GP_ERR_INVALID naming both layers
 * (file:line:column) and what to change: an unknown name, a later layer or
 * itself, an owner that is neither an embedding nor a linear, an owner that
 * itself ties, or shapes that differ. */
gp_status gp_layer_specs_ties(const gp_layer_spec *specs, const gp_shape *in, int count,
                              int *owner);
/* gp_layer_specs_ties over built (or meta) layers, and each replica's
 * tie_layer / tie_param set to its owner's. */
gp_status gp_layers_tie(gp_layer *layers, int count);
/* Whether any layer holds a tied replica. */
bool gp_layers_have_ties(const gp_layer *layers, int count);
/* Every replica's value := its owner's (device copies; waits for them):
 * after the owners were initialised, loaded (model.init_from, --resume)
 * or updated outside a pipeline step.  Replicas or owners of meta layers
 * (another process's) are skipped. */
gp_status gp_layers_tie_sync(gp_layer *layers, int count);
/* One device, no pipeline: every owner's gradient += its replicas'
 * gradients, in the order of the tying layers (the order a pipeline sums
 * them in).  Layers may sit on different devices (copied through a
 * workspace on the owner's). */
gp_status gp_layers_tie_grads(gp_layer *layers, int count);

/* ---- skip connections ------------------------------------------------- */

/* One skip of a model: layer `from` stashes its output under `name`, layer
 * `to` (> from) pops it as its input `slot` (1 + its place in spec.pop). */
typedef struct gp_skip {
    char name[GP_SKIP_NAME];
    int from, to, slot;
} gp_skip;

/* The skips of a model of n layers, resolved from the specs' names. */
typedef struct gp_skip_map {
    int n_layers;
    int n;              /* skips */
    gp_skip *skips;     /* [n], ordered by `from` */
    int *stashes;       /* [n_layers]: the skip layer k stashes, or -1 */
    int *pops;          /* [n_layers * GP_MAX_POPS]: the skip of layer k's pop q */
} gp_skip_map;

/* Resolve the stash / pop names of specs[0 .. n).  A name is stashed by one
 * layer and popped by exactly one later layer before it may be stashed
 * again.  A pop without a stash, a pop before its stash, a second pop and
 * a stash never popped are GP_ERR_INVALID naming the layers involved and
 * where the config defines them. */
gp_status gp_skip_map_build(const gp_layer_spec *specs, int n, gp_skip_map *map);
void gp_skip_map_free(gp_skip_map *map);
/* The input shapes of layer k: in[0] the previous layer's output (input
 * for k = 0), in[1 + q] the output of the layer that stashed its pop q;
 * outs[0 .. k) are the earlier layers' output shapes.  Returns 1 + pops. */
int gp_skip_map_inputs(const gp_skip_map *map, int k, const gp_shape *input, const gp_shape *outs,
                       gp_shape *in);
/* Whether skip s crosses the boundary after layer k (from <= k < to). */
static inline bool gp_skip_crosses(const gp_skip *s, int k) { return s->from <= k && k < s->to; }

/* ---- the losses -------------------------------------------------------- */

/* What a loss reports for one batch; the fields' meaning depends on the
 * loss (cross-entropy: per row; binary cross-entropy: per element). */
typedef struct gp_loss_out {
    double loss_sum;   /* sum of the per-row (per-element) losses */
    int64_t correct;   /* rows whose argmax equals the label (elements whose
                          prediction agrees with the target) */
    int64_t count;     /* rows (elements) */
} gp_loss_out;

/* Cross-entropy (log-softmax + NLL) of logits (N, K) against labels (N)
 * (float class indices on the device), or of logits (N, T, K) against
 * labels (N, T): every position a row (count N*T; a language model's next
 * token).  If dlogits is non-NULL it is set to
 * (softmax - onehot) * grad_scale (use 1 / batch_total so that micro-batch
 * gradients add up to the mean over the whole mini-batch).  smoothing > 0:
 * label smoothing as PyTorch's CrossEntropyLoss(label_smoothing=...): the
 * one-hot target becomes (1 - smoothing) onehot + smoothing / K, in the
 * loss and the gradient (0: the plain loss, bit for bit).  Labels outside
 * [0, K) are an error naming the row. */
gp_status gp_cross_entropy(gp_device *dev, const gp_tensor *logits,
                           const gp_tensor *labels, float smoothing, float grad_scale,
                           gp_tensor *dlogits, gp_loss_out *out);

/* Binary cross-entropy with logits (PyTorch's BCEWithLogitsLoss with
 * reduction 'sum'), element by element, of logits z of any shape against
 * targets t in [0, 1] with the same number of elements (a U-Net's (N, 1,
 * H, W) mask):
 *   loss_sum = sum max(z, 0) - z t + log(1 + exp(-|z|))  (the stable form,
 *              accumulated in double);
 *   count    = the number of elements (divide loss_sum by it for the mean);
 *   correct  = elements where (z > 0) == (t > 0.5): the prediction
 *              sigmoid(z) > 0.5 agrees with the target rounded at 0.5 (pixel
 *              accuracy).
 * If dlogits is non-NULL it is set to (sigmoid(z) - t) * grad_scale (use
 * 1 / the elements of the whole mini-batch for the mean).  A target outside
 * [0, 1] (or NaN) is GP_ERR_DATA naming the element; nothing is written
 * then. */
gp_status gp_bce_with_logits(gp_device *dev, const gp_tensor *logits,
                             const gp_tensor *targets, float grad_scale,
                             gp_tensor *dlogits, gp_loss_out *out);

/* The loss a model ends in (model.loss), for the code that runs whichever
 * the config names: the pipeline's last stage, the single-device step,
 * evaluation and the profiler. */
typedef enum gp_loss_kind {
    GP_LOSS_CROSS_ENTROPY = 0, /* gp_cross_entropy: logits (N, classes), one
                                  class id per sample (the default) */
    GP_LOSS_BCE_WITH_LOGITS,   /* gp_bce_with_logits: logits of any shape, one
                                  target in [0, 1] per logit (masks) */
    GP_LOSS_COUNT
} gp_loss_kind;
/* "cross_entropy", "bce_with_logits" (the names used in YAML). */
const char *gp_loss_name(gp_loss_kind k);
/* Target floats per sample for a model whose output for one sample has
 * shape `out` (with its batch dimension): 1 (the class id) for cross-entropy
 * on (N, classes), T for cross-entropy on (N, T, classes) (a class id per
 * position, every position a row of the loss), every output element for
 * binary cross-entropy.  A batch of n samples has n times as many, sample
 * after sample; the mean loss divides loss_sum by them all, and the
 * gradient of that mean over a mini-batch of batch_total samples takes
 * grad_scale = 1 / (batch_total x this). */
int64_t gp_loss_targets_per_sample(gp_loss_kind k, const gp_shape *out);
/* The targets' shape for n samples of that output: (n) class ids, (n, T)
 * for an (N, T, classes) output, or the output's own shape for n
 * (bce_with_logits). */
gp_shape gp_loss_targets_shape(gp_loss_kind k, const gp_shape *out, int64_t n);
/* gp_cross_entropy (with label smoothing `smoothing`) or
 * gp_bce_with_logits (smoothing must be 0), as k says.  classes > 0 (cross-
 * entropy only): the logits' last dimension is a padded vocabulary
 * (model.gpt.vocab_pad) of which the loss reads the first `classes`: the
 * softmax, the argmax and the labels' range are over them, and dlogits is 0
 * in the columns past them; 0: every column. */
gp_status gp_loss(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                  const gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                  gp_tensor *dlogits, gp_loss_out *out);
/* The same loss with its results left in device memory (*out, one
 * gp_loss_result of dev): enqueued, no host wait; the caller reads them
 * later (the pipeline, once per step).  A bad label or target sets
 * out->bad; check the targets on the host first (gp_loss_check_targets)
 * for an error that names them before anything is computed. */
gp_status gp_loss_dev(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                      const gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                      gp_tensor *dlogits, gp_loss_result *out);
/* GP_ERR_DATA, worded as gp_cross_entropy's and gp_bce_with_logits', when
 * a target in host memory t is not one loss k takes; out is the shape of
 * the logits they go with ((N, classes) or (N, T, classes), whose row
 * r * T + p the message counts) or of the targets themselves; t's
 * first row is row row0 of the batch (a micro-batch's offset), which the
 * message counts from; classes > 0: the class ids' range (gp_loss's). */
gp_status gp_loss_check_targets(gp_loss_kind k, int64_t classes, const float *t,
                                const gp_shape *out, int64_t row0);

#endif /* GP_LAYERS_H */
