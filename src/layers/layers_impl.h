/*
 * layers_impl.h — declarations shared inside src/layers: the ops table of
 * each layer type, the common helpers for parameters, saved tensors and
 * spec errors, and the construction path that composite layers (residual)
 * reuse for their child layers.
 *
 * Memory: parameters are owned by the layer that allocated them; a composite
 * layer takes over its children's parameters (the child keeps non-owning
 * views, re-pointed at every call, see residual.c).  Nothing here is
 * thread-safe beyond what layers.h promises (one worker per layer).
 */
#ifndef GP_LAYERS_IMPL_H
#define GP_LAYERS_IMPL_H

#include "layers/layers.h"

/* gp_saved.flags: backward_data already accumulated the weight gradients
 * (layers whose kernel produces dx and dW together: batch norm, residual). */
#define GP_SAVED_WEIGHTS_DONE 0x1u
/* gp_saved.flags: forward ran in eval mode (no batch statistics saved). */
#define GP_SAVED_EVAL 0x2u

/* The backward_weights of a layer whose backward_data already made the
 * weight gradients (GP_SAVED_WEIGHTS_DONE): true once per backward_data,
 * clearing the flag so that a second backward pass accumulates again;
 * false when backward_data did not run (no dx needed) and the weights
 * are still to do. */
static inline bool gp_saved_take_weights_done(gp_saved *s)
{
    if (!(s->flags & GP_SAVED_WEIGHTS_DONE)) return false;
    s->flags &= ~GP_SAVED_WEIGHTS_DONE;
    return true;
}

/* Stream tags of the counter-based RNG ("init", "drop", "dr2d"). */
#define GP_RNG_TAG_INIT 0x696e6974ull
#define GP_RNG_TAG_DROPOUT 0x64726f70ull
#define GP_RNG_TAG_DROPOUT2D 0x64723264ull

/* The ops tables (immutable; one per type). */
extern const gp_layer_ops gp_linear_ops;
extern const gp_layer_ops gp_conv2d_ops;
extern const gp_layer_ops gp_batchnorm_ops;
extern const gp_layer_ops gp_relu_ops;
extern const gp_layer_ops gp_maxpool2d_ops;
extern const gp_layer_ops gp_avgpool2d_ops;
extern const gp_layer_ops gp_global_avgpool_ops;
extern const gp_layer_ops gp_flatten_ops;
extern const gp_layer_ops gp_dropout_ops;
extern const gp_layer_ops gp_residual_ops;
extern const gp_layer_ops gp_identity_ops;
extern const gp_layer_ops gp_add_ops;
extern const gp_layer_ops gp_concat_ops;
extern const gp_layer_ops gp_leaky_relu_ops;     /* unet.c */
extern const gp_layer_ops gp_dropout2d_ops;      /* unet.c */
extern const gp_layer_ops gp_instance_norm_ops;  /* unet.c */
extern const gp_layer_ops gp_upsample_ops;       /* unet.c */
extern const gp_layer_ops gp_factorized_reduce_ops; /* factorized_reduce.c */
extern const gp_layer_ops gp_amoeba_cell_ops;       /* amoeba.c */
extern const gp_layer_ops gp_attention_ops;         /* attention.c */
extern const gp_layer_ops gp_gelu_ops;              /* simple.c */
extern const gp_layer_ops gp_layer_norm_ops;        /* transformer.c */
extern const gp_layer_ops gp_rms_norm_ops;          /* transformer.c */
extern const gp_layer_ops gp_swiglu_ops;
extern const gp_layer_ops gp_rope_ops;            /* transformer.c */
/* A residual add's sum and layer norm l over it in one call (layer.c's
 * gp_layer_add_norm_forward; transformer.c). */
gp_status gp_layers_norm_forward_add(gp_layer *l, const gp_tensor *a, const gp_tensor *b,
                                     gp_tensor *sum, gp_tensor *y, gp_saved *s);
/* A linear layer l's forward into pre with the GELU after it into y, in
 * one call (layer.c's gp_layer_linear_gelu_forward; linear.c). */
gp_status gp_layers_linear_forward_gelu(gp_layer *l, const gp_tensor *x, gp_tensor *pre,
                                        gp_tensor *y);
extern const gp_layer_ops gp_embedding_ops;         /* transformer.c */

/* gp_layer_create without the error prefix, with the RNG numbering of the
 * first parameter given (composite layers build children with it).  `in`
 * may have any batch size.  dev == NULL: shapes only, no parameters.
 * Under gp_layer_meta, init runs with l->meta set: gp_layers_add_param then
 * records shapes only and the init / fill helpers do nothing, so a layer's
 * init needs no case of its own (it must touch its parameters only through
 * them). */
gp_status gp_layer_setup(const gp_layer_spec *spec, int index, int param_base,
                         const gp_shape *in, gp_device *dev, uint64_t seed,
                         gp_layer *out);

/* Composite layers (residual, add's projection shortcut, factorized_reduce)
 * are built from child layers, so their math is the stand-alone layers'
 * code.  gp_layers_child_setup makes `child` from `spec` on the parent's
 * device, its RNG numbering continuing the parent's; the parent takes over
 * its parameters (named "<prefix>.<name>", from *first on) and the child
 * keeps views of them.  gp_layers_child_view re-points those views at the
 * parent's tensors: call it before every use of the child, so whoever
 * replaces a parent's tensor is safe.  Destroying the child frees nothing
 * of the parent's. */
/* A child's spec: type t's defaults, named `name`, at the parent's place in
 * the config (file, line, column, and the --set that changed it), so its
 * messages point where the parent's do. */
gp_layer_spec gp_layers_child_spec(const gp_layer *parent, gp_layer_type t, const char *name);
gp_status gp_layers_child_setup(gp_layer *parent, const gp_layer_spec *spec, const char *prefix,
                                const gp_shape *in, uint64_t seed, gp_layer *child, int *first);
void gp_layers_child_view(const gp_layer *parent, gp_layer *child, int first);
/* A child's forward into y, which the parent allocated in the child's
 * out_dtype (the parent's tensors' element type: a parent on bf16 storage
 * keeps its children's outputs in bf16), and its backward (both halves;
 * dx NULL: the weights half alone) into the parent's dx of x's type.  Each
 * runs through the storage adapter where the child cannot take its
 * tensors as they are (gp_layer.out_dtype): widened, its FP32 kernels run,
 * the result rounded once into y or dx.  y may be NULL in backward for a
 * child that does not read it. */
gp_status gp_layers_child_forward(gp_layer *c, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  gp_tensor *y, gp_saved *s);
gp_status gp_layers_child_backward(gp_layer *c, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                   gp_saved *s);

/* Set GP_ERR_INVALID with "<layer description>: <message>". */
gp_status gp_layer_spec_error(const gp_layer *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A shape with the batch dimension written as N: "(N, 64, 28, 28)". */
const char *gp_layers_shape_n(const gp_shape *s, char *buf, size_t len);

/* Append a parameter (value in PARAMS; for trainable ones a zeroed grad in
 * GRADS).  Values are left uninitialised. */
gp_status gp_layers_add_param(gp_layer *l, const char *name, const gp_shape *shape,
                              bool is_buffer, bool no_decay);
/* params[p] = uniform(-bound, bound) from (seed, stream(index, param_base + p,
 * "init")), drawn on the host and uploaded: independent of placement. */
gp_status gp_layers_init_uniform(gp_layer *l, int p, uint64_t seed, float bound);
/* params[p] = normal(0, std) from the same stream as init_uniform (Box-
 * Muller over the counter-based RNG, gp_rng_normal_fill), on the host:
 * independent of placement. */
gp_status gp_layers_init_normal(gp_layer *l, int p, uint64_t seed, float std);
/* params[p] = v everywhere. */
gp_status gp_layers_fill_param(gp_layer *l, int p, float v);
/* params[p]'s rows (of its first dimension) from `first` on set to 0: a
 * padded vocabulary's rows (spec.valid_rows).  Nothing when first is
 * every row. */
gp_status gp_layers_zero_rows(gp_layer *l, int p, int64_t first);

/* Channels [d0, d0 + c) of dst (N, C, H, W) = channels [s0, s0 + c) of src
 * (N, C', H', W' with H' W' = H W), of one element type (FP32 or bf16,
 * moved as bits), one strided copy: concatenation along channels and the
 * slices of its gradient. */
gp_status gp_layers_copy_channels(gp_device *dev, gp_tensor *dst, int64_t d0,
                                  const gp_tensor *src, int64_t s0, int64_t c);

/* dst = src's values, as many bytes as src holds (any element type): the identity layers'
 * forward (identity, flatten, the dropouts in eval) and their backward.
 * dst at src's own memory (a layer run in place) is nothing to do. */
gp_status gp_layers_copy(gp_device *dev, void *dst, const gp_tensor *src);

/* Allocate s->t[slot] on dev (category ACTIVATIONS), FP32 or of type dt. */
gp_status gp_layers_saved_alloc(gp_saved *s, int slot, gp_device *dev,
                                const gp_shape *shape);
gp_status gp_layers_saved_alloc_as(gp_saved *s, int slot, gp_device *dev,
                                   const gp_shape *shape, gp_dtype dt);

/* The backend descriptor of a conv2d layer (or a residual's child conv) for
 * a batch of n. */
gp_conv_desc gp_conv2d_desc(const gp_layer *l, int64_t n);
/* A residual block's convolutions (its children's gp_conv2d_desc for a
 * batch of 1, plain): conv1, conv2 and with a downsample its 1x1 conv;
 * returns how many (3 with a downsample, 2 without, 0 for a block not
 * set up). */
int gp_residual_convs(const gp_layer *l, gp_conv_desc conv[3]);
/* Output spatial size of a window op, 0 if the kernel does not fit. */
int64_t gp_layers_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad);
/* Both axes of it: out.h from in_h, out.w from in_w. */
gp_hw gp_layers_out_hw(int64_t in_h, int64_t in_w, gp_hw kernel, gp_hw stride, gp_hw pad);

/* Batch-norm inspection (tests, snapshots): batches committed so far, and
 * the micro-batch samples (count per channel) waiting in the accumulator. */
int64_t gp_batchnorm_batches_tracked(const gp_layer *l);
int64_t gp_batchnorm_pending_count(const gp_layer *l);
/* Where a batch norm keeps its commit count (snapshots set it on resume). */
int64_t *gp_batchnorm_counter(gp_layer *l);

#endif /* GP_LAYERS_IMPL_H */
