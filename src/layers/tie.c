/*
 * tie.c — tied weights: a linear layer's weight that is an earlier layer's
 * parameter (layers.h, "tied weights").
 *
 * The owner keeps the parameter; the tying layer keeps a replica with its
 * own gradient (gp_param.tied).  This file resolves and checks the ties and
 * does the two host-driven halves that need no pipeline: the replicas set
 * from their owners, and (one device, no pipeline) the gradients summed.
 * The pipeline does the same sum and copy-back across its stages
 * (pipeline.c, "tied weights").
 */
#include "layers/layers_impl.h"

#include <stdlib.h>
#include <string.h>

/* The shape of the parameter layer k would share with a linear: an
 * embedding's wte.weight (vocab, dim), a linear's weight (out, in). */
static gp_shape shared_shape(const gp_layer_spec *s, const gp_shape *in)
{
    if (s->type == GP_LAYER_EMBEDDING) return gp_shape_2d(s->vocab, s->dim);
    return gp_shape_2d(s->out, in->ndim > 0 ? in->dims[in->ndim - 1] : 0);
}

gp_status gp_layer_specs_ties(const gp_layer_spec *specs, const gp_shape *in, int count,
                              int *owner)
{
    for (int k = 0; k < count; k++) {
        const gp_layer_spec *s = &specs[k];
        owner[k] = -1;
        if (!s->tie[0]) continue;
        char d[400], e[400];
        gp_layer_spec_describe(s, k, d, sizeof d);
        if (s->type != GP_LAYER_LINEAR)
            return gp_error_set(GP_ERR_INVALID, "%s: only a linear layer takes tie; remove "
                                "tie: %s", d, s->tie);
        int o = -1, later = -1;
        for (int q = 0; q < count; q++)
            if (!strcmp(specs[q].name, s->tie)) {
                if (q < k && o < 0) o = q;
                else if (q >= k && later < 0) later = q;
            }
        if (o < 0 && later >= 0) {
            gp_layer_spec_describe(&specs[later], later, e, sizeof e);
            return gp_error_set(GP_ERR_INVALID, "%s: tie: %s names %s, which %s; a layer ties "
                                "to an earlier one that owns the weight: move the tie to the "
                                "earlier layer of the two, or name another", d, s->tie, e,
                                later == k ? "is this layer itself" : "comes after it");
        }
        if (o < 0)
            return gp_error_set(GP_ERR_INVALID, "%s: tie: %s names no layer of the model; give "
                                "the name of an earlier embedding or linear layer (its name: "
                                "key)", d, s->tie);
        const gp_layer_spec *os = &specs[o];
        gp_layer_spec_describe(os, o, e, sizeof e);
        if (os->type != GP_LAYER_EMBEDDING && os->type != GP_LAYER_LINEAR)
            return gp_error_set(GP_ERR_INVALID, "%s: tie: %s names %s, which has no weight to "
                                "share; tie to an embedding (its wte.weight) or a linear layer "
                                "(its weight)", d, s->tie, e);
        if (os->tie[0])
            return gp_error_set(GP_ERR_INVALID, "%s: tie: %s names %s, which itself ties to "
                                "'%s'; tie to the layer that owns the weight: tie: %s", d,
                                s->tie, e, os->tie, os->tie);
        gp_shape want = shared_shape(os, &in[o]), have = shared_shape(s, &in[k]);
        if (want.dims[0] != have.dims[0] || want.dims[1] != have.dims[1])
            return gp_error_set(GP_ERR_INVALID, "%s: tie: %s names %s, whose %s is (%lld, %lld), "
                                "but this layer's weight is (out, in) = (%lld, %lld); make "
                                "them equal (out: %lld and an input %lld wide)", d, s->tie, e,
                                os->type == GP_LAYER_EMBEDDING ? "wte.weight (vocab, dim)"
                                                               : "weight (out, in)",
                                (long long)want.dims[0], (long long)want.dims[1],
                                (long long)have.dims[0], (long long)have.dims[1],
                                (long long)want.dims[0], (long long)want.dims[1]);
        owner[k] = o;
    }
    return GP_OK;
}

gp_status gp_layers_tie(gp_layer *layers, int count)
{
    gp_layer_spec *specs = malloc((size_t)(count ? count : 1) * sizeof *specs);
    gp_shape *in = malloc((size_t)(count ? count : 1) * sizeof *in);
    int *owner = malloc((size_t)(count ? count : 1) * sizeof *owner);
    gp_status s = specs && in && owner ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory");
    for (int k = 0; k < count && s == GP_OK; k++) {
        specs[k] = layers[k].spec;
        in[k] = layers[k].in_shape;
    }
    if (s == GP_OK) s = gp_layer_specs_ties(specs, in, count, owner);
    for (int k = 0; k < count && s == GP_OK; k++) {
        if (owner[k] < 0) continue;
        gp_layer *l = &layers[k], *o = &layers[owner[k]];
        GP_ASSERT(l->n_params > 0 && l->params[0].tied);
        /* the owner's weight: wte.weight (the embedding's first) or weight */
        l->params[0].tie_layer = owner[k];
        l->params[0].tie_param = 0;
        GP_ASSERT(o->n_params > 0 && !o->params[0].tied);
    }
    free(specs);
    free(in);
    free(owner);
    return s;
}

bool gp_layers_have_ties(const gp_layer *layers, int count)
{
    for (int k = 0; k < count; k++)
        for (int q = 0; q < layers[k].n_params; q++)
            if (layers[k].params[q].tied) return true;
    return false;
}

gp_status gp_layers_tie_sync(gp_layer *layers, int count)
{
    for (int k = 0; k < count; k++) {
        gp_layer *l = &layers[k];
        if (l->meta) continue;
        for (int q = 0; q < l->n_params; q++) {
            gp_param *r = &l->params[q];
            if (!r->tied) continue;
            gp_layer *o = &layers[r->tie_layer];
            if (o->meta) continue; /* another process's: the pipeline sends it */
            gp_tensor *src = &o->params[r->tie_param].value;
            GP_ASSERT(gp_tensor_bytes(src) == gp_tensor_bytes(&r->value));
            GP_TRY(gp_dev_synchronize(src->dev));
            GP_TRY(gp_dev_copy_async(l->dev, gp_tensor_mem(&r->value), src->dev,
                                     gp_tensor_mem(src), gp_tensor_bytes(src), NULL, NULL));
            GP_TRY(gp_dev_synchronize(l->dev));
        }
    }
    return GP_OK;
}

gp_status gp_layers_tie_grads(gp_layer *layers, int count)
{
    for (int k = 0; k < count; k++) {
        gp_layer *l = &layers[k];
        for (int q = 0; q < l->n_params; q++) {
            gp_param *r = &l->params[q];
            if (!r->tied) continue;
            gp_param *op = &layers[r->tie_layer].params[r->tie_param];
            gp_device *dev = op->value.dev;
            int64_t n = gp_tensor_numel(&op->value);
            if (r->grad.dev == dev) {
                GP_TRY(gp_dev_add(dev, gp_f32(&op->grad), gp_f32(&r->grad), gp_f32(&op->grad), n));
                continue;
            }
            gp_tensor tmp = {0};
            gp_shape sh = gp_tensor_shape(&op->value);
            GP_TRY(gp_tensor_alloc(&tmp, dev, &sh, GP_MEM_WORKSPACE));
            gp_status s = gp_dev_synchronize(r->grad.dev);
            if (s == GP_OK)
                s = gp_dev_copy_async(dev, gp_tensor_mem(&tmp), r->grad.dev, gp_tensor_mem(&r->grad),
                                      gp_tensor_bytes(&tmp), NULL, NULL);
            if (s == GP_OK) s = gp_dev_add(dev, gp_f32(&op->grad), gp_f32(&tmp), gp_f32(&op->grad), n);
            if (s == GP_OK) s = gp_dev_synchronize(dev);
            gp_tensor_free(&tmp);
            GP_TRY(s);
        }
    }
    return GP_OK;
}
