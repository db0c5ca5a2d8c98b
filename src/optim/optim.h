/*
 * optim.h — the optimizer: its state and its update of a range of layers.
 *
 * Owns: the optimizer state of a model's trainable parameters (SGD's
 * momentum today: one buffer per trainable tensor, on the parameter's
 * device, category OPTIMIZER; none for plain SGD, momentum 0), and the update rule.  Other rules (Adam's
 * two moments, say) add state beside the momentum; callers see only
 * gp_optim and gp_optim_state.
 * May call: core, backend (the device's sgd_update and sharded_sgd slots
 * through their wrappers), layers (the parameter lists).  Knows nothing of
 * stages, schedules or replicas: the pipeline's UPDATE instructions say
 * which layers and which chunk.
 *
 * The update (PyTorch's SGD): g' = g + wd * w; v = mu * v + g';
 * w -= lr * (nesterov ? g' + mu * v : v); wd is 0 for biases and norm
 * parameters unless decay_bias_and_norm.
 *
 * Thread safety: different layer ranges may be updated from different
 * threads at once (each stage's worker updates its own layers).
 */
#ifndef GP_OPTIM_H
#define GP_OPTIM_H

#include "layers/layers.h"

typedef struct gp_sgd_opts {
    float momentum;            /* mu, in [0, 1) */
    float weight_decay;        /* wd */
    bool nesterov;
    bool decay_bias_and_norm;  /* decay biases and norm parameters too */
} gp_sgd_opts;

/* Whether the update keeps a momentum buffer per parameter (12 bytes a
 * parameter on its device with value and gradient, else 8): plain SGD
 * (mu = 0, no Nesterov) keeps none, as PyTorch's. */
static inline bool gp_sgd_has_state(const gp_sgd_opts *o)
{
    return o->momentum != 0.0f || o->nesterov;
}

typedef struct gp_optim gp_optim;

/* State for every trainable parameter of layers[0 .. n_layers), zeroed, on
 * each parameter's device.  The layers must outlive the optimizer. */
gp_status gp_optim_create(gp_layer *layers, int n_layers, const gp_sgd_opts *o,
                          gp_optim **out);
void gp_optim_destroy(gp_optim *o); /* NULL is fine */

/* The update of layers [first, first + count) with learning rate lr, on
 * chunk `shard` of `shards` of every parameter (gp_comm_chunk; 0 of 1: the
 * whole tensor).  Gradients must be final (summed over micro-batches and,
 * with replicas, over the replicas in that chunk). */
gp_status gp_optim_update(gp_optim *o, int first, int count, double lr, int shard, int shards);
/* The sharded update with the gradient sum in it: for each parameter, the
 * sum of its gradients over comm's ranks, the update of this rank's chunk
 * and the all-gather of the parameter, as one collective
 * (gp_dev_sharded_sgd).  Every rank calls it with the same layers. */
gp_status gp_optim_update_fused(gp_optim *o, int first, int count, double lr, gp_comm *comm);

/* The state tensor (momentum) of parameter p of layer k; NULL for buffers
 * and when the optimizer keeps no state (momentum 0). */
gp_tensor *gp_optim_state(gp_optim *o, int k, int p);
/* Whether the optimizer keeps any state (false for plain SGD). */
bool gp_optim_has_state(const gp_optim *o);
/* dst's state = src's (same model shape; any devices). */
gp_status gp_optim_copy(gp_optim *dst, const gp_optim *src);
/* After sharded updates over R ranks, rank r's state is current only in
 * chunk r of each tensor: copy chunk r of ranks[r]'s state into dst
 * (ranks[0] may be dst) for r = 1 .. R-1, so dst holds the whole state. */
gp_status gp_optim_gather_chunks(gp_optim *dst, gp_optim *const *ranks, int R);

#endif /* GP_OPTIM_H */
