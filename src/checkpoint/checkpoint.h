/*
 * checkpoint.h — activation checkpointing (torchgpipe's checkpoint.py):
 * which (micro-batch, stage) pairs keep only their stage input in forward,
 * the stash that holds what a forward keeps for its backward, running a
 * stage's layers forward, again (recompute) and backward, and the RNG
 * replay that makes the recompute exact.
 *
 * Owns: the policy (gp_ckpt_checkpointed: nothing else decides whether a
 * micro-batch is checkpointed), gp_stash and the device memory it holds,
 * and the one loop over a stage's layers that every caller runs (the
 * pipeline's workers, the single-device reference step and evaluation).
 * Knows nothing of schedules, devices' threads or data parallelism: the
 * schedules and the executor ask it, it never asks them.
 *
 * RNG replay: a layer's forward is a pure function of its parameters, its
 * input and the gp_fwd_ctx (seed, step, sample_offset: dropout's
 * counter-based RNG is keyed by them).  gp_ckpt_recompute runs the forward
 * again with the same context and ctx.recompute set, so dropout draws the
 * same mask and batch norm normalises with the same micro-batch statistics
 * without adding them to its running statistics twice.
 *
 * Memory: a stash owns the device tensors it holds (in, the layer outputs
 * and gp_saved, and `out` when it owns it) in their devices' allocators
 * (stage input: category ACTIVATIONS on stage 0, COPIES elsewhere; the rest
 * ACTIVATIONS), so every byte of it shows in the device's accounting.
 *
 * Skip connections (layers.h, gp_skip_map): a stage's stash also holds
 * the skips that touch the stage, indexed by the model's skip number t.  A
 * skip stashed and popped inside the stage is one of the stage's layer
 * outputs, kept until its pop (until backward when keeping); one stashed
 * here and popped on a later stage leaves in skip_out[t] (as `out` does);
 * one popped here and stashed earlier arrives in skip_in[t] (as `in`
 * does: kept for the recompute).  Backward adds the gradient of every
 * stash to that of the layer output it stashed: from the pop inside the
 * stage, or received in skip_dout[t] from a later stage; a pop of a skip
 * stashed earlier hands its gradient out in skip_din[t] (as *dx).
 *
 * Thread safety: a stash is used by one thread at a time (its stage's
 * worker); the functions keep no state of their own.
 */
#ifndef GP_CHECKPOINT_H
#define GP_CHECKPOINT_H

#include "layers/layers.h"

typedef enum { GP_CKPT_ALWAYS = 0, GP_CKPT_EXCEPT_LAST, GP_CKPT_NEVER } gp_checkpoint_mode;

/* The policy: whether a (micro-batch, stage) keeps only its stage input
 * in forward (and recomputes before its backward).  backward_next: on its
 * device the next computation after this forward is this micro-batch's
 * own backward (the schedule knows; gp_schedule_make asks with it), so
 * what the forward made is needed at once and no other micro-batch's
 * activations come between: a recompute would cost a forward and save no
 * memory.  except_last keeps exactly those.  On GPipe's schedule that is
 * the last micro-batch on every stage, GPipe's and torchgpipe's
 * except_last; on 1F1B, ZB-H1 and interleaved (m > devices) it is every
 * micro-batch of the last stage, whose backward follows each forward, and
 * none of the earlier stages', whose last forward is followed by an
 * earlier micro-batch's backward.  Until 2026-11-25 those schedules kept
 * i = m - 1 everywhere: the last stage recomputed m - 1 forwards it had
 * just run, and the others held two micro-batches' activations at once.
 * Which layers a checkpointed forward keeps besides its input is
 * gp_ckpt_kept's (pipeline.checkpoint.keep). */
bool gp_ckpt_checkpointed(gp_checkpoint_mode mode, bool backward_next);

/* Selective recompute (issue 79, pipeline.checkpoint: {mode, keep}): a
 * bit per gp_layer_type, 1 << GP_LAYER_LINEAR | ...: the layer types whose
 * outputs (and what their forwards save) a checkpointed forward keeps for
 * the backward, so that the recompute before it runs only the others
 * (Megatron-LM's and torchtitan's selective activation checkpointing:
 * keep the products, recompute the norms, activations and element-wise
 * work).  0: keep nothing but the stage input (torchgpipe's checkpoint). */
typedef uint32_t gp_ckpt_keep;
_Static_assert(GP_LAYER_TYPE_COUNT <= 32, "a bit per layer type in gp_ckpt_keep");
/* kept[c] for the `count` layers of a stage (inplace[c] as
 * gp_layers_inplace gives them; the first runs out of place whatever
 * inplace[0] says): on entry whether layer c's type is kept, on return
 * whether a checkpointed forward keeps layer c's output and saved
 * tensors: a kept layer keeps with it every layer of its run in place
 * over one memory (a layer and the ones in place after it), since one
 * tensor holds their outputs.  The simulator asks the same (balance/sim.c). */
void gp_ckpt_kept(const bool *inplace, int count, bool *kept);
/* "linear, attention": the types of `keep`, in gp_layer_type's order. */
void gp_ckpt_keep_str(gp_ckpt_keep keep, char *buf, size_t len);

/* What one (micro-batch, stage) holds between its forward and backward. */
typedef struct gp_stash {
    gp_tensor in;       /* (b, ...) stage input on the stage's device, owned */
    gp_tensor *acts;    /* [count + 1]: acts[0] a view of in, acts[c + 1] the
                           output of the stage's layer c (owned) */
    gp_saved *saved;    /* [count]: what layer c's forward keeps */
    gp_tensor out;      /* stage output: a view of acts[count] when the
                           forward kept everything, owned when it did not */
    gp_tensor *grads;   /* [count + 1]: between a split backward's halves,
                           grads[c + 1] = dL/d (output of layer c), owned */
    int count;          /* layers of the stage */
    bool live;          /* acts / saved hold a forward for backward */
    bool weights_due;   /* backward-data ran; backward-weights has not */
    /* Skips (gp_stash_init with a map; all NULL without one), [t] for the
     * model's skip t: */
    const gp_skip_map *skips;
    int first;          /* model index of the stage's first layer */
    gp_tensor *skip_in;   /* popped here, stashed earlier: received, owned */
    gp_tensor *skip_out;  /* stashed here, popped later: a view of acts, or
                             owned when the forward did not keep */
    gp_tensor *skip_dout; /* dL/d skip_out[t], received before backward */
    gp_tensor *skip_din;  /* dL/d the popped tensor: between a pop and its
                             stash inside the stage, or (popped here,
                             stashed earlier) handed out by backward */
    int *uses;          /* [count + 1] scratch of a forward that does not keep */
    bool *inplace;      /* [count]: layer c runs in place (gp_layers_inplace):
                           its output shares its input's memory.  A forward
                           that keeps makes acts[c + 1] a view of acts[c]
                           (the memory stays with the first layer that
                           allocated it, freed after that layer's backward);
                           one that does not moves the ownership on. */
    bool *fused;        /* [count]: layer c is a relu whose work the batch
                           norm before it does (gp_layers_relu_fused) */
    bool *unkept;       /* [count]: no backward reads layer c's output
                           (gp_layers_unkept): a kept forward frees it once
                           layer c + 1 has run, keeping its shape in
                           acts[c + 1] (data NULL) for the backwards */
    gp_ckpt_keep keep;  /* the layer types a checkpointed forward keeps
                           (set by the owner after gp_stash_init; 0: none) */
    bool *kept;         /* [count]: gp_ckpt_kept of the stage's layers, set
                           by each forward.  A checkpointed forward
                           (GP_FWD_INPUT) leaves acts[c + 1] and saved[c] of
                           a kept layer as a forward that keeps would (views
                           included), and the recompute runs only the
                           others: the same tensors, the same bits */
} gp_stash;

/* Host arrays for a stage of `count` layers; no device memory.  With
 * `skips` (NULL: the model has none), the stage is layers [first, first +
 * count) of the model they map. */
gp_status gp_stash_init(gp_stash *s, int count, const gp_skip_map *skips, int first);
/* Where skip t stands to the stash's stage. */
typedef enum { GP_SKIP_APART = 0, GP_SKIP_INSIDE, GP_SKIP_LEAVES, GP_SKIP_ARRIVES } gp_skip_role;
gp_skip_role gp_stash_skip_role(const gp_stash *s, int t);
/* Free every device tensor the stash holds (it can be used again),
 * skip_din included. */
void gp_stash_release(gp_stash *s);
/* gp_stash_release and the host arrays. */
void gp_stash_destroy(gp_stash *s);
/* Device bytes the stash holds now: the memory checkpointing trades. */
size_t gp_stash_bytes(const gp_stash *s);
/* After a forward that kept everything (GP_FWD_KEEP) on a stage that is
 * not the model's last: where no backward of the stage reads its output
 * (its last layer runs out of place and gp_layer_spec_end_unread), out
 * takes that memory over (owned) and acts keep its shape, so the pipeline
 * frees it once the next stage has its copy instead of at the backward.
 * Returns whether it did. */
bool gp_stash_hand_out(gp_stash *s, const gp_layer *layers);
/* Free only the layer outputs and saved tensors (a backward's leftovers
 * after a failure); keeps in and out. */
void gp_stash_drop_acts(gp_stash *s);

/* What a forward keeps. */
typedef enum {
    GP_FWD_KEEP = 0,   /* every output and gp_saved, for backward; s->out is a
                          view of the last output */
    GP_FWD_INPUT,      /* checkpointed: only s->in (for the recompute),
                          s->out (owned, or a view of a kept output) and
                          what the stash's kept layers keep; each other
                          intermediate output is freed once the layers
                          that read it have run */
    GP_FWD_NOTHING     /* evaluation: s->in too is freed once consumed; only
                          s->out (owned) remains */
} gp_fwd_keep;

/* Forward of layers[0 .. s->count) on s->in (and the skips that arrive,
 * s->skip_in), keeping what `keep` says; the skips that leave end in
 * s->skip_out.
 * On failure *bad is the index (0-based in layers) of the failing layer and
 * nothing but s->in remains (if it was kept). */
gp_status gp_ckpt_forward(gp_layer *layers, const gp_fwd_ctx *ctx, gp_fwd_keep keep,
                          gp_stash *s, int *bad);
/* The forward of a checkpointed micro-batch again, from s->in, with ctx
 * (the same as its forward's) marked recompute: keeps everything for
 * backward, leaves s->out alone (it was handed on already).  The layers
 * the forward kept (s->kept) do not run again. */
gp_status gp_ckpt_recompute(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s, int *bad);
/* Backward of a live stash, consuming dy (dL/d out, freed) and the
 * gradients of the skips that leave (s->skip_dout): every layer's
 * backward-data and backward-weights (dW +=) from the last to the first.
 * The gradients of the skips that arrive stay in s->skip_din for the
 * caller (gp_stash_release frees them); everything else is freed.
 * Layers before `first_trainable` (0-based in layers; -1: none) get no
 * backward, and that layer computes no dx, when dx is NULL (the model's
 * first stage); otherwise *dx = dL/d in.  Frees the stash's tensors. */
gp_status gp_ckpt_backward(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s, gp_tensor *dy,
                           int first_trainable, gp_tensor *dx, int *bad);

/* The same backward in two halves (zero-bubble schedules).
 * gp_ckpt_backward_data: backward-data of every layer, last to first,
 * consuming dy; *dx as gp_ckpt_backward's; each layer's incoming gradient
 * stays in s->grads for the second half, and nothing else is freed.
 * gp_ckpt_backward_weights: every layer's backward-weights (dW +=) from
 * what the first half kept; then the stash is freed as after
 * gp_ckpt_backward.  Gradients equal gp_ckpt_backward's bit for bit when
 * every layer's first call of the step goes through the same halves. */
gp_status gp_ckpt_backward_data(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s,
                                gp_tensor *dy, int first_trainable, gp_tensor *dx, int *bad);
gp_status gp_ckpt_backward_weights(gp_layer *layers, const gp_fwd_ctx *ctx, gp_stash *s,
                                   int first_trainable, bool has_dx, int *bad);

/* The loss at the end of the last stage: loss `k` (gp_loss) of logits
 * against the targets (both on dev: class ids, or one target per logit),
 * with dlogits (allocated here, category ACTIVATIONS; NULL: none) scaled by
 * grad_scale.  A non-finite loss is GP_ERR_NUMERIC saying what to try; the
 * caller adds where it happened. */
gp_status gp_ckpt_loss(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                       const gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                       gp_tensor *dlogits, gp_loss_out *lo);
/* The same with the results left on the device (gp_loss_dev): no host
 * wait; the caller checks that the loss is finite when it reads them,
 * with gp_ckpt_loss_finite.  over: the logits are read by nobody after
 * the loss (the last layer's backward does not read its output), so the
 * gradient is written over them in place where the loss's kernels allow
 * it (cross-entropy on FP32 or bf16 logits; issue 64: no second tensor of
 * (B, T, vocab)): *dlogits then views the logits' memory, and owns it
 * where *logits did (which is then left empty). */
gp_status gp_ckpt_loss_dev(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                           gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                           gp_tensor *dlogits, bool over, gp_loss_result *out);
/* GP_OK, or the GP_ERR_NUMERIC of a loss that is not finite, saying what
 * to try (the caller adds where it happened). */
gp_status gp_ckpt_loss_finite(double loss_sum);

#endif /* GP_CHECKPOINT_H */
