/*
 * optim.h — the optimizer: its state and its update of a range of layers.
 *
 * Owns: the optimizer state of a model's trainable parameters, on each
 * parameter's device, category OPTIMIZER: SGD's momentum (one tensor per
 * trainable tensor; none for plain SGD, momentum 0), or Adam's two moments
 * (two per trainable tensor); and the update rules.  Callers see only
 * gp_optim and gp_optim_state.
 * May call: core, backend (the device's sgd_multi, adam_multi and
 * sharded_sgd slots through their wrappers), layers (the parameter lists).
 * Knows nothing of stages, schedules or replicas: the pipeline's UPDATE
 * instructions say which layers and which chunk.
 *
 * The updates, as PyTorch's torch.optim.SGD, Adam and AdamW:
 *   sgd:   g' = g + wd * w; v = mu * v + g';
 *          w -= lr * (nesterov ? g' + mu * v : v)
 *   adam:  g' = g + wd * w; m = b1 m + (1 - b1) g'; v = b2 v + (1 - b2) g'^2;
 *          w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   adamw: as adam with g' = g, after w *= 1 - lr * wd (decoupled decay)
 * t is the 1-based number of the step (the steps before it + 1, so a
 * resumed run continues the bias correction where it stopped).  wd is 0
 * for biases and norm parameters unless decay_bias_and_norm.
 *
 * Thread safety: different layer ranges may be updated from different
 * threads at once (each stage's worker updates its own layers).
 */
#ifndef GP_OPTIM_H
#define GP_OPTIM_H

#include "layers/layers.h"

typedef enum gp_optim_kind { GP_OPTIM_SGD, GP_OPTIM_ADAM, GP_OPTIM_ADAMW } gp_optim_kind;

typedef struct gp_optim_opts {
    gp_optim_kind kind;        /* 0: SGD */
    float momentum;            /* SGD: mu, in [0, 1) */
    bool nesterov;             /* SGD */
    float beta1, beta2, eps;   /* Adam and AdamW */
    float weight_decay;        /* wd */
    bool decay_bias_and_norm;  /* decay biases and norm parameters too */
} gp_optim_opts;

/* How many state tensors the update keeps per trainable parameter, each as
 * large as the parameter: plain SGD (mu = 0, no Nesterov) none, as
 * PyTorch's (8 bytes a parameter on its device with value and gradient);
 * SGD with momentum 1 (12 bytes); Adam and AdamW 2 (16 bytes). */
static inline int gp_optim_states_per_param(const gp_optim_opts *o)
{
    if (o->kind != GP_OPTIM_SGD) return 2;
    return o->momentum != 0.0f || o->nesterov ? 1 : 0;
}

/* The name of state `which` as PyTorch's optimizer state calls it
 * ("momentum_buffer" is written "momentum" in gpipe's snapshots):
 * "momentum"; "exp_avg", "exp_avg_sq". */
const char *gp_optim_state_name(const gp_optim_opts *o, int which);

typedef struct gp_optim gp_optim;

/* State for every trainable parameter of layers[0 .. n_layers), zeroed, on
 * each parameter's device.  The layers must outlive the optimizer. */
gp_status gp_optim_create(gp_layer *layers, int n_layers, const gp_optim_opts *o,
                          gp_optim **out);
void gp_optim_destroy(gp_optim *o); /* NULL is fine */
/* The same for replica `shard` of `shards` whose updates are sharded (the
 * pipeline's UPDATE of chunk `shard`, gp_pipeline_join): ZeRO stage 1,
 * each trainable parameter on a device that shards (gp_dev_can_shard)
 * gets only its chunk of the state (gp_comm_chunk: elements [lo, hi), a
 * 1-D tensor of hi - lo), so R replicas hold the state once between them.
 * Every update of such a parameter must then be of chunk `shard` of
 * `shards`.  A model with tied weights, whose updates are not sharded,
 * keeps whole states (gp_optim_shardable). */
gp_status gp_optim_create_sharded(gp_layer *layers, int n_layers, const gp_optim_opts *o,
                                  int shard, int shards, gp_optim **out);
/* Whether an optimizer over these layers may shard (no tied weights). */
bool gp_optim_shardable(const gp_layer *layers, int n_layers);
/* The elements [lo, hi) of parameter p of layer k that its states hold:
 * true for a chunk, false for the whole tensor (0, numel) or no state. */
bool gp_optim_state_range(const gp_optim *o, int k, int p, int64_t *lo, int64_t *hi);
/* The shards it was made for (1: whole), and *shard (optional) which. */
int gp_optim_shards(const gp_optim *o, int *shard);

/* The update of layers [first, first + count) with learning rate lr, as
 * step `step` (the steps done before it: 0 for the first), on chunk
 * `shard` of `shards` of every parameter (gp_comm_chunk; 0 of 1: the
 * whole tensor).  Gradients must be final (summed over micro-batches and,
 * with replicas, over the replicas in that chunk).  nonfinite (NULL: none;
 * whole tensors only, shards 1): one float of check_dev's memory set to 1
 * if an updated parameter on check_dev is NaN or Inf
 * (gp_update_part.nonfinite: the check after the step in the update's own
 * pass, so that check need read only the parameters the optimizer does
 * not update, gp_layers_flag_nonfinite's skip_trained).  Each whole
 * parameter's bf16 mirror, where its device keeps one, is written in the
 * same pass.  clip (0: none): every gradient read as g * clip, gradient
 * clipping's factor (gp_clip_grad_factor) applied in the update's pass,
 * the gradients themselves left as they are. */
gp_status gp_optim_update(gp_optim *o, int first, int count, double lr, int64_t step, int shard,
                          int shards, gp_device *check_dev, float *nonfinite, float clip);
/* The sharded update with the gradient sum in it: for each parameter, the
 * sum of its gradients over comm's ranks, the update of this rank's chunk
 * and the all-gather of the parameter, as one collective
 * (gp_dev_sharded_sgd; Adam: gp_dev_sharded_adam).  Every rank calls it
 * with the same layers. */
gp_status gp_optim_update_fused(gp_optim *o, int first, int count, double lr, int64_t step,
                                gp_comm *comm);

/* Gradient clipping on one device, PyTorch's clip_grad_norm_: the global
 * L2 norm of every trainable gradient of layers[0 .. n_layers) (each
 * tensor's squared norm, summed in layer order in double) into *norm, and
 * where it exceeds max_norm every gradient scaled by max_norm / (norm +
 * 1e-6).  The pipeline's CLIP instruction sums the same way, so both clip
 * by the same factor.  A norm that is not finite (a NaN or Inf gradient)
 * is gp_clip_nonfinite's error, before anything is scaled: the caller
 * then skips the update, so the model stays as it was (PyTorch's
 * error_if_nonfinite=True). */
gp_status gp_clip_grad_norm(gp_layer *layers, int n_layers, float max_norm, double *norm);
/* The same norm and checks, the gradients left as they are: *factor is
 * max_norm / (norm + 1e-6) where that is below 1, else 0 (no clipping),
 * for gp_optim_update's clip, which applies it in the update's own pass
 * (the bits of the scaled gradients: one FP32 product each). */
gp_status gp_clip_grad_factor(gp_layer *layers, int n_layers, float max_norm, double *norm,
                              float *factor);

/* The error for a global gradient norm that is not finite: sq[t] the
 * squared norms of the trainable tensors of layers[0 .. n_layers) in
 * order (the first that is not finite is named, with its layer in
 * *bad_layer; -1 if none is), norm the global norm.  GP_ERR_NUMERIC. */
gp_status gp_clip_nonfinite(const gp_layer *layers, int n_layers, const double *sq, double norm,
                            int *bad_layer);

/* State tensor `which` (0 .. gp_optim_states_per_param - 1: SGD's
 * momentum; Adam's exp_avg, exp_avg_sq) of parameter p of layer k; NULL
 * for buffers and when the optimizer keeps no such state. */
gp_tensor *gp_optim_state(gp_optim *o, int k, int p, int which);
/* The options it was made with. */
const gp_optim_opts *gp_optim_options(const gp_optim *o);
/* Whether the optimizer keeps any state (false for plain SGD). */
bool gp_optim_has_state(const gp_optim *o);
/* dst's state = src's (same model shape; any devices; neither sharded). */
gp_status gp_optim_copy(gp_optim *dst, const gp_optim *src);
/* After sharded updates over R ranks of whole states (optimizers not made
 * sharded), rank r's state is current only in chunk r of each tensor: copy
 * chunk r of ranks[r]'s state into dst (ranks[0] may be dst) for r = 1 ..
 * R-1, so dst holds the whole state. */
gp_status gp_optim_gather_chunks(gp_optim *dst, gp_optim *const *ranks, int R);

#endif /* GP_OPTIM_H */
