/*
 * model.c — the sequential model on one device: build, one training step
 * over micro-batches (the single-device oracle every pipeline run is
 * checked against), the SGD update, evaluation.
 *
 * Step memory: activations of one micro-batch live from its forward to its
 * backward; gradients accumulate across micro-batches (dW +=) and are zeroed
 * once per step.
 */
#include "train/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

gp_status gp_model_build(const gp_config *cfg, gp_device *dev, gp_model *out)
{
    memset(out, 0, sizeof *out);
    const gp_model_config *mc = &cfg->model;
    if (mc->n_layers < 1)
        return gp_error_set(GP_ERR_INVALID, "%s: model.layers is empty; list at least one layer",
                            cfg->path);
    out->layers = calloc((size_t)mc->n_layers, sizeof *out->layers);
    if (!out->layers) return gp_error_set(GP_ERR_OOM, "out of host memory building the model");
    out->dev = dev;
    out->input = gp_shape_4d(1, mc->input[0], mc->input[1], mc->input[2]);
    gp_shape cur = out->input;
    for (int k = 0; k < mc->n_layers; k++) {
        gp_status s = gp_layer_create(&mc->layers[k], k, &cur, dev, cfg->train.seed,
                                      &out->layers[k]);
        if (s != GP_OK) {
            gp_model_free(out);
            return s;
        }
        out->n_layers = k + 1;
        cur = out->layers[k].out_shape;
    }
    out->output = cur;
    if (cur.ndim != 2) {
        char b[64];
        gp_model_free(out);
        return gp_error_set(GP_ERR_INVALID,
                            "%s: the model's output is %s per sample but cross_entropy needs "
                            "(N, classes); end the model with flatten and linear",
                            cfg->path, gp_shape_str(&cur, b, sizeof b));
    }
    /* Optimizer state: one momentum buffer per trainable parameter. */
    int n_mom = 0;
    for (int k = 0; k < out->n_layers; k++)
        for (int p = 0; p < out->layers[k].n_params; p++)
            if (!out->layers[k].params[p].is_buffer) n_mom++;
    out->momentum = calloc((size_t)(n_mom ? n_mom : 1), sizeof *out->momentum);
    if (!out->momentum) {
        gp_model_free(out);
        return gp_error_set(GP_ERR_OOM, "out of host memory building the model");
    }
    int j = 0;
    for (int k = 0; k < out->n_layers; k++)
        for (int p = 0; p < out->layers[k].n_params; p++) {
            gp_param *pr = &out->layers[k].params[p];
            if (pr->is_buffer) continue;
            gp_shape sh = gp_tensor_shape(&pr->value);
            gp_status s = gp_tensor_zeros(&out->momentum[j], pr->value.dev, &sh, GP_MEM_OPTIMIZER);
            if (s != GP_OK) {
                gp_model_free(out);
                return s;
            }
            out->n_momentum = ++j;
        }
    return GP_OK;
}

void gp_model_free(gp_model *m)
{
    if (!m) return;
    for (int j = 0; j < m->n_momentum; j++) gp_tensor_free(&m->momentum[j]);
    free(m->momentum);
    for (int k = 0; k < m->n_layers; k++) gp_layer_destroy(&m->layers[k]);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

int64_t gp_model_param_count(const gp_model *m)
{
    int64_t n = 0;
    for (int k = 0; k < m->n_layers; k++) n += gp_layer_param_count(&m->layers[k]);
    return n;
}

static gp_status zero_grads(gp_model *m)
{
    for (int k = 0; k < m->n_layers; k++) GP_TRY(gp_layer_zero_grad(&m->layers[k]));
    return GP_OK;
}

static gp_status sgd_update(gp_model *m, const gp_optim_config *o, double lr)
{
    int j = 0;
    for (int k = 0; k < m->n_layers; k++) {
        gp_layer *l = &m->layers[k];
        for (int p = 0; p < l->n_params; p++) {
            gp_param *pr = &l->params[p];
            if (pr->is_buffer) continue;
            float wd = (pr->no_decay && !o->decay_bias_and_norm) ? 0.0f : o->weight_decay;
            gp_device *dev = pr->value.dev;
            GP_TRY(dev->iface->sgd_update(dev, pr->value.data, pr->grad.data,
                                          m->momentum[j].data, gp_tensor_numel(&pr->value),
                                          (float)lr, o->momentum, wd, o->nesterov));
            j++;
        }
    }
    return GP_OK;
}

/* Upload rows [first, first+n) of a host batch to device tensors. */
static gp_status upload_chunk(gp_model *m, const float *x, const float *y, int64_t first,
                              int64_t n, gp_tensor *xt, gp_tensor *yt)
{
    gp_shape xs = gp_shape_with_batch(&m->input, n);
    gp_shape ys = gp_shape_2d(n, 1);
    ys.ndim = 1;
    int64_t per = gp_shape_numel(&m->input);
    GP_TRY(gp_tensor_alloc(xt, m->dev, &xs, GP_MEM_ACTIVATIONS));
    gp_status s = gp_tensor_alloc(yt, m->dev, &ys, GP_MEM_ACTIVATIONS);
    if (s == GP_OK) s = gp_dev_upload(m->dev, xt->data, x + first * per, n * per);
    if (s == GP_OK) s = gp_dev_upload(m->dev, yt->data, y + first, n);
    if (s != GP_OK) {
        gp_tensor_free(xt);
        gp_tensor_free(yt);
    }
    return s;
}

/* Forward and backward of one micro-batch; gradients accumulate. */
static gp_status run_microbatch(gp_model *m, const gp_fwd_ctx *ctx, gp_tensor *acts,
                                gp_saved *saved, const gp_tensor *labels,
                                gp_loss_out *lo, int chunk)
{
    int L = m->n_layers;
    gp_status s = GP_OK;
    int done = 0; /* layers whose forward ran */
    for (int k = 0; k < L && s == GP_OK; k++) {
        s = gp_layer_forward(&m->layers[k], ctx, &acts[k], &acts[k + 1], &saved[k]);
        if (s == GP_OK) done = k + 1;
    }
    gp_tensor dy = {0};
    if (s == GP_OK) {
        gp_shape ls = gp_tensor_shape(&acts[L]);
        s = gp_tensor_alloc(&dy, m->dev, &ls, GP_MEM_ACTIVATIONS);
    }
    if (s == GP_OK)
        s = gp_cross_entropy(m->dev, &acts[L], labels, (float)(1.0 / (double)ctx->batch_total),
                             &dy, lo);
    if (s == GP_OK && !isfinite(lo->loss_sum))
        s = gp_error_set(GP_ERR_NUMERIC,
                         "loss is %g at step %llu, micro-batch %d; lower train.optimizer.lr, "
                         "add warm-up, or check the data normalisation",
                         lo->loss_sum, (unsigned long long)ctx->step, chunk);
    for (int k = L - 1; k >= 0; k--) {
        gp_tensor dx = {0};
        if (s == GP_OK)
            s = gp_layer_backward(&m->layers[k], ctx, &acts[k], &acts[k + 1], &dy,
                                  k > 0 ? &dx : NULL, &saved[k]);
        gp_tensor_free(&dy);
        dy = dx;
        if (k < done) {
            gp_tensor_free(&acts[k + 1]);
            gp_saved_free(&saved[k]);
        }
    }
    gp_tensor_free(&dy);
    return s;
}

gp_status gp_model_train_step(gp_model *m, const gp_config *cfg, const float *x,
                              const float *y, int64_t n, int chunks, double lr,
                              gp_step_stats *st)
{
    double t0 = gp_now();
    int64_t sizes[1024];
    if (chunks > 1024)
        return gp_error_set(GP_ERR_INVALID, "pipeline.chunks = %d exceeds 1024", chunks);
    GP_TRY(gp_microbatch_split(n, chunks, sizes));
    GP_TRY(zero_grads(m));
    int L = m->n_layers;
    gp_tensor *acts = calloc((size_t)L + 1, sizeof *acts);
    gp_saved *saved = calloc((size_t)L, sizeof *saved);
    if (!acts || !saved) {
        free(acts);
        free(saved);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    gp_status s = GP_OK;
    double loss_sum = 0;
    int64_t correct = 0, first = 0;
    for (int i = 0; i < chunks && s == GP_OK; i++) {
        gp_tensor labels = {0};
        s = upload_chunk(m, x, y, first, sizes[i], &acts[0], &labels);
        if (s != GP_OK) break;
        gp_fwd_ctx ctx = {.training = true, .recompute = false, .seed = cfg->train.seed,
                          .step = (uint64_t)m->step, .sample_offset = first,
                          .batch_total = n};
        gp_loss_out lo = {0};
        s = run_microbatch(m, &ctx, acts, saved, &labels, &lo, i);
        gp_tensor_free(&acts[0]);
        gp_tensor_free(&labels);
        loss_sum += lo.loss_sum;
        correct += lo.correct;
        first += sizes[i];
    }
    free(acts);
    free(saved);
    if (s == GP_OK)
        for (int k = 0; k < L && s == GP_OK; k++)
            if (m->layers[k].ops->commit) s = m->layers[k].ops->commit(&m->layers[k]);
    if (s == GP_OK) s = sgd_update(m, &cfg->train.optim, lr);
    if (s == GP_OK) s = m->dev->iface->synchronize(m->dev);
    if (s != GP_OK) return s;
    m->step++;
    if (st) {
        st->loss = loss_sum / (double)n;
        st->accuracy = (double)correct / (double)n;
        st->samples = n;
        st->lr = lr;
        st->seconds = gp_now() - t0;
    }
    return GP_OK;
}

gp_status gp_model_evaluate(gp_model *m, const gp_config *cfg, const gp_dataset *ds,
                            double *loss, double *accuracy)
{
    int64_t bs = cfg->train.eval_batch_size > 0 ? cfg->train.eval_batch_size : 1000;
    int64_t per = ds->c * ds->h * ds->w;
    float *x = malloc((size_t)(bs * per) * sizeof *x);
    float *y = malloc((size_t)bs * sizeof *y);
    float mean[GP_MAX_CHANNELS], std[GP_MAX_CHANNELS];
    if (!x || !y) {
        free(x);
        free(y);
        return gp_error_set(GP_ERR_OOM, "out of host memory for evaluation batches");
    }
    gp_data_norm(&cfg->data, ds->c, mean, std);
    int L = m->n_layers;
    double loss_sum = 0;
    int64_t correct = 0;
    gp_status s = GP_OK;
    for (int64_t b0 = 0; b0 < ds->n && s == GP_OK; b0 += bs) {
        int64_t n = ds->n - b0 < bs ? ds->n - b0 : bs;
        gp_data_assemble(ds, b0, n, cfg->data.normalize, mean, std, x, y);
        gp_tensor cur = {0}, labels = {0};
        s = upload_chunk(m, x, y, 0, n, &cur, &labels);
        gp_fwd_ctx ctx = {.training = false, .seed = cfg->train.seed, .step = (uint64_t)m->step,
                          .sample_offset = 0, .batch_total = n};
        for (int k = 0; k < L && s == GP_OK; k++) {
            gp_tensor next = {0};
            gp_saved sv = {0};
            s = gp_layer_forward(&m->layers[k], &ctx, &cur, &next, &sv);
            gp_saved_free(&sv);
            gp_tensor_free(&cur);
            cur = next;
        }
        gp_loss_out lo = {0};
        if (s == GP_OK) s = gp_cross_entropy(m->dev, &cur, &labels, 1.0f, NULL, &lo);
        loss_sum += lo.loss_sum;
        correct += lo.correct;
        gp_tensor_free(&cur);
        gp_tensor_free(&labels);
    }
    free(x);
    free(y);
    if (s != GP_OK) return s;
    *loss = loss_sum / (double)(ds->n ? ds->n : 1);
    *accuracy = (double)correct / (double)(ds->n ? ds->n : 1);
    return GP_OK;
}
