/*
 * batchnorm.c — batch normalisation: per channel over (N, H, W) of a 4-D
 * input, or per feature over N of a 2-D input.
 *
 * Parameters "weight" (gamma, init 1) and "bias" (beta, init 0), both
 * no_decay; buffers "running_mean" (0) and "running_var" (1).
 *
 * Training forward normalises with the micro-batch's own statistics (the
 * pipeline cannot wait for the whole mini-batch) and saves them for
 * backward.  Unless it is a recompute, it also merges the micro-batch's
 * (count, mean, M2) into this step's accumulator (Chan's parallel merge, in
 * double, on the host).  commit() folds the accumulated mini-batch into the
 * running statistics once per step, PyTorch style:
 *   running_mean = (1 - m) running_mean + m mean
 *   running_var  = (1 - m) running_var  + m M2 / (count - 1)   (unbiased)
 * so m micro-batches give the same running statistics as the whole batch.
 * Eval forward normalises with the running statistics.
 *
 * gp_saved: t[0] = batch mean (C), t[1] = biased batch var (C).
 * The backend's bn_bwd yields dx, dgamma and dbeta at once, so
 * backward_data does the weight work too and flags it in gp_saved.
 */
#include "layers/layers_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t c;              /* channels / features */
    int64_t acc_count;      /* values per channel merged this step */
    double *acc_mean;       /* (C) running mean of this step's micro-batches */
    double *acc_m2;         /* (C) sum of squared deviations from acc_mean */
    float *h_mean, *h_var;  /* (C) host scratch for downloads */
    int64_t batches_tracked; /* commits so far (PyTorch num_batches_tracked) */
} bn_state;

enum { P_WEIGHT = 0, P_BIAS, P_RMEAN, P_RVAR };

static gp_bn_desc bn_desc(const gp_layer *l, int64_t n)
{
    gp_bn_desc d;
    d.n = n;
    d.c = l->in_shape.dims[1];
    d.s = l->in_shape.ndim == 4 ? l->in_shape.dims[2] * l->in_shape.dims[3] : 1;
    d.eps = l->spec.eps;
    return d;
}

static gp_status bn_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    char b[96];
    if (in->ndim != 4 && in->ndim != 2)
        return gp_layer_spec_error(l, "expected (N, C, H, W) or (N, features) input but got %s",
                                   gp_layers_shape_n(in, b, sizeof b));
    if (l->spec.in > 0 && l->spec.in != in->dims[1])
        return gp_layer_spec_error(l,
                                   "in = %lld but the input has %lld channels %s; remove 'in' "
                                   "(it is inferred)",
                                   (long long)l->spec.in, (long long)in->dims[1],
                                   gp_layers_shape_n(in, b, sizeof b));
    if (!(l->spec.momentum >= 0.0f && l->spec.momentum <= 1.0f))
        return gp_layer_spec_error(l, "momentum = %g must be in [0, 1] (PyTorch convention: "
                                      "the weight of the new batch, default 0.1)",
                                   (double)l->spec.momentum);
    if (!(l->spec.eps > 0.0f))
        return gp_layer_spec_error(l, "eps = %g must be positive (default 1e-5)",
                                   (double)l->spec.eps);
    *out = *in;
    return GP_OK;
}

static gp_status bn_init(gp_layer *l, uint64_t seed)
{
    int64_t c = l->in_shape.dims[1];
    bn_state *st = calloc(1, sizeof *st);
    if (st) {
        st->c = c;
        st->acc_mean = calloc((size_t)c, sizeof(double));
        st->acc_m2 = calloc((size_t)c, sizeof(double));
        st->h_mean = calloc((size_t)c, sizeof(float));
        st->h_var = calloc((size_t)c, sizeof(float));
    }
    l->state = st;
    if (!st || !st->acc_mean || !st->acc_m2 || !st->h_mean || !st->h_var)
        return gp_error_set(GP_ERR_OOM, "out of host memory for batch-norm statistics");
    gp_shape cs = {1, {c, 0, 0, 0}};
    GP_TRY(gp_layers_add_param(l, "weight", &cs, false, true));
    GP_TRY(gp_layers_add_param(l, "bias", &cs, false, true));
    GP_TRY(gp_layers_add_param(l, "running_mean", &cs, true, true));
    GP_TRY(gp_layers_add_param(l, "running_var", &cs, true, true));
    GP_TRY(gp_layers_fill_param(l, P_WEIGHT, 1.0f));
    GP_TRY(gp_layers_fill_param(l, P_BIAS, 0.0f));
    GP_TRY(gp_layers_fill_param(l, P_RMEAN, 0.0f));
    GP_TRY(gp_layers_fill_param(l, P_RVAR, 1.0f));
    return GP_OK;
}

static void bn_destroy(gp_layer *l)
{
    bn_state *st = l->state;
    if (!st) return;
    free(st->acc_mean);
    free(st->acc_m2);
    free(st->h_mean);
    free(st->h_var);
    free(st);
    l->state = NULL;
}

/* Chan et al.: merge (nb, mean_b, var_b * nb) into the accumulator. */
static void merge_stats(bn_state *st, int64_t nb, const float *mean, const float *var)
{
    double na = (double)st->acc_count, n2 = (double)nb, n = na + n2;
    for (int64_t c = 0; c < st->c; c++) {
        double delta = (double)mean[c] - st->acc_mean[c];
        st->acc_mean[c] += delta * n2 / n;
        st->acc_m2[c] += (double)var[c] * n2 + delta * delta * na * n2 / n;
    }
    st->acc_count += nb;
}

static gp_status bn_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                            gp_tensor *y, gp_saved *s)
{
    gp_device *dev = l->dev;
    bn_state *st = l->state;
    gp_bn_desc d = bn_desc(l, x->dims[0]);
    const float *gamma = l->params[P_WEIGHT].value.data, *beta = l->params[P_BIAS].value.data;
    if (!ctx->training) {
        s->flags |= GP_SAVED_EVAL;
        if (d.n == 0) return GP_OK;
        return dev->iface->bn_fwd_infer(dev, &d, x->data, gamma, beta,
                                        l->params[P_RMEAN].value.data,
                                        l->params[P_RVAR].value.data, y->data);
    }
    if (d.n * d.s < 2)
        return gp_layer_spec_error(l,
                                   "training batch norm needs more than one value per channel, "
                                   "but this micro-batch has %lld sample(s) of %lld value(s) per "
                                   "channel; use fewer pipeline.chunks or a larger batch",
                                   (long long)d.n, (long long)d.s);
    gp_shape cs = {1, {d.c, 0, 0, 0}};
    GP_TRY(gp_layers_saved_alloc(s, 0, dev, &cs));
    GP_TRY(gp_layers_saved_alloc(s, 1, dev, &cs));
    GP_TRY(dev->iface->bn_fwd_train(dev, &d, x->data, gamma, beta, y->data, s->t[0].data,
                                    s->t[1].data));
    if (ctx->recompute) return GP_OK; /* statistics were merged the first time */
    GP_TRY(gp_dev_download(dev, st->h_mean, s->t[0].data, d.c));
    GP_TRY(gp_dev_download(dev, st->h_var, s->t[1].data, d.c));
    GP_TRY(dev->iface->synchronize(dev));
    merge_stats(st, d.n * d.s, st->h_mean, st->h_var);
    return GP_OK;
}

static gp_status bn_backward_all(gp_layer *l, const gp_tensor *x, const gp_tensor *dy,
                                 float *dx, gp_saved *s)
{
    if (s->flags & GP_SAVED_EVAL)
        return gp_layer_spec_error(l, "backward after an eval-mode forward: batch norm "
                                      "saved no batch statistics (run forward with training)");
    GP_ASSERT(s->t[0].data && s->t[1].data);
    gp_bn_desc d = bn_desc(l, x->dims[0]);
    return l->dev->iface->bn_bwd(l->dev, &d, x->data, l->params[P_WEIGHT].value.data,
                                 s->t[0].data, s->t[1].data, dy->data, dx,
                                 l->params[P_WEIGHT].grad.data, l->params[P_BIAS].grad.data);
}

static gp_status bn_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                  gp_saved *s)
{
    GP_TRY(bn_backward_all(l, x, dy, dx->data, s));
    s->flags |= GP_SAVED_WEIGHTS_DONE;
    return GP_OK;
}

static gp_status bn_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                     const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    if (s->flags & GP_SAVED_WEIGHTS_DONE) {
        s->flags &= ~GP_SAVED_WEIGHTS_DONE; /* a second backward pass accumulates again */
        return GP_OK;
    }
    /* No one needs dx (first layer of the model): scratch for the kernel. */
    gp_tensor scratch;
    gp_shape xs = gp_tensor_shape(x);
    GP_TRY(gp_tensor_alloc(&scratch, l->dev, &xs, GP_MEM_WORKSPACE));
    gp_status st = bn_backward_all(l, x, dy, scratch.data, s);
    gp_tensor_free(&scratch);
    return st;
}

static gp_status bn_commit(gp_layer *l)
{
    bn_state *st = l->state;
    if (st->acc_count == 0) return GP_OK; /* no training forward this step */
    GP_ASSERT(st->acc_count >= 2);
    gp_device *dev = l->dev;
    int64_t c = st->c;
    double m = (double)l->spec.momentum;
    GP_TRY(gp_dev_download(dev, st->h_mean, l->params[P_RMEAN].value.data, c));
    GP_TRY(gp_dev_download(dev, st->h_var, l->params[P_RVAR].value.data, c));
    GP_TRY(dev->iface->synchronize(dev));
    double unbias = 1.0 / (double)(st->acc_count - 1);
    for (int64_t k = 0; k < c; k++) {
        st->h_mean[k] = (float)((1.0 - m) * st->h_mean[k] + m * st->acc_mean[k]);
        st->h_var[k] = (float)((1.0 - m) * st->h_var[k] + m * st->acc_m2[k] * unbias);
    }
    GP_TRY(gp_dev_upload(dev, l->params[P_RMEAN].value.data, st->h_mean, c));
    GP_TRY(gp_dev_upload(dev, l->params[P_RVAR].value.data, st->h_var, c));
    GP_TRY(dev->iface->synchronize(dev)); /* the host scratch is reused */
    st->batches_tracked++;
    st->acc_count = 0;
    memset(st->acc_mean, 0, (size_t)c * sizeof(double));
    memset(st->acc_m2, 0, (size_t)c * sizeof(double));
    return GP_OK;
}

int64_t gp_batchnorm_batches_tracked(const gp_layer *l)
{
    GP_ASSERT(l->spec.type == GP_LAYER_BATCHNORM && l->state);
    return ((const bn_state *)l->state)->batches_tracked;
}

int64_t *gp_batchnorm_counter(gp_layer *l)
{
    GP_ASSERT(l->spec.type == GP_LAYER_BATCHNORM && l->state);
    return &((bn_state *)l->state)->batches_tracked;
}

int64_t gp_batchnorm_pending_count(const gp_layer *l)
{
    GP_ASSERT(l->spec.type == GP_LAYER_BATCHNORM && l->state);
    return ((const bn_state *)l->state)->acc_count;
}

static double bn_flops(const gp_layer *l, int64_t n)
{
    /* statistics (2 per element) and the affine normalisation (2 per element) */
    return 4.0 * (double)n * (double)gp_shape_numel(&l->in_shape);
}

static size_t bn_saved_bytes(const gp_layer *l, int64_t n)
{
    return 2 * (size_t)l->in_shape.dims[1] * sizeof(float);
}

const gp_layer_ops gp_batchnorm_ops = {
    .type = GP_LAYER_BATCHNORM,
    .infer = bn_infer,
    .init = bn_init,
    .forward = bn_forward,
    .backward_data = bn_backward_data,
    .backward_weights = bn_backward_weights,
    .commit = bn_commit,
    .flops = bn_flops,
    .saved_bytes = bn_saved_bytes,
    .destroy = bn_destroy,
};
