/*
 * optim.c — SGD with momentum, Adam and AdamW over a model's parameters
 * (optim.h).
 */
#include "optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct gp_optim {
    gp_layer *layers;      /* not owned */
    int n_layers;
    gp_optim_opts opts;
    gp_tensor *state;      /* [n_states]: the state of each trainable tensor, in
                              layer order, `per` a tensor (SGD's momentum;
                              Adam's exp_avg, exp_avg_sq), owned; none for
                              plain SGD */
    int n_states;
    int per;               /* states per trainable tensor */
    int *first;            /* [n_layers]: index of layer k's first state */
    int shard, shards;     /* gp_optim_create_sharded's (0 of 1: whole) */
    int64_t *lo;           /* [n_states]: the parameter's first element the
                              state holds (0: whole; a chunk: gp_comm_chunk's
                              lo, its numel hi - lo) */
    bool *part;            /* [n_states]: the state is chunk `shard` alone */
};

gp_status gp_optim_create(gp_layer *layers, int n_layers, const gp_optim_opts *o, gp_optim **out)
{
    return gp_optim_create_sharded(layers, n_layers, o, 0, 1, out);
}

bool gp_optim_shardable(const gp_layer *layers, int n_layers)
{
    for (int k = 0; k < n_layers; k++)
        for (int p = 0; p < layers[k].n_params; p++)
            if (layers[k].params[p].tied) return false;
    return true;
}

gp_status gp_optim_create_sharded(gp_layer *layers, int n_layers, const gp_optim_opts *o,
                                  int shard, int shards, gp_optim **out)
{
    *out = NULL;
    GP_ASSERT(shards >= 1 && shard >= 0 && shard < shards);
    /* as the pipeline shards its update (gp_pipeline_join): never with ties */
    if (!gp_optim_shardable(layers, n_layers)) shard = 0, shards = 1;
    gp_optim *op = calloc(1, sizeof *op);
    int n = 0;
    for (int k = 0; k < n_layers; k++) n += gp_layer_tensor_count(&layers[k]);
    if (op) {
        op->state = calloc((size_t)(n ? n : 1) * 2, sizeof *op->state);
        op->first = calloc((size_t)(n_layers ? n_layers : 1), sizeof *op->first);
        op->lo = calloc((size_t)(n ? n : 1) * 2, sizeof *op->lo);
        op->part = calloc((size_t)(n ? n : 1) * 2, sizeof *op->part);
    }
    if (!op || !op->state || !op->first || !op->lo || !op->part) {
        gp_optim_destroy(op);
        return gp_error_set(GP_ERR_OOM, "out of host memory for the optimizer");
    }
    op->layers = layers;
    op->n_layers = n_layers;
    op->opts = *o;
    op->shard = shard;
    op->shards = shards;
    /* Plain SGD (mu = 0) keeps no state, as PyTorch's does: v = g' every
     * step, so the update needs no buffer and a device holds 8 bytes per
     * parameter (value, gradient) instead of 12. */
    op->per = gp_optim_states_per_param(o);
    for (int k = 0; k < n_layers; k++) {
        op->first[k] = op->n_states;
        for (int p = 0; p < layers[k].n_params; p++) {
            gp_param *pr = &layers[k].params[p];
            if (!gp_param_trained(pr)) continue; /* (a tied replica: its owner's state) */
            gp_shape sh = gp_tensor_shape(&pr->value);
            /* ZeRO stage 1: with replicas whose updates are sharded, this
             * replica's chunk of the state alone (a tensor of hi - lo) */
            int64_t lo = 0, hi = 0;
            bool part = shards > 1 && pr->value.dev && gp_dev_can_shard(pr->value.dev);
            if (part) {
                gp_comm_chunk(gp_tensor_numel(&pr->value), shards, shard, &lo, &hi);
                sh = gp_shape_make(1, (int64_t[]){hi - lo});
            }
            for (int which = 0; which < op->per; which++) {
                gp_tensor *st = &op->state[op->n_states];
                op->lo[op->n_states] = lo;
                op->part[op->n_states] = part;
                if (!gp_tensor_mem(&pr->value)) { /* a layer of shapes only (gp_layer_meta): so is its state */
                    st->ndim = sh.ndim;
                    memcpy(st->dims, sh.dims, sizeof st->dims);
                } else {
                    gp_status s = gp_tensor_zeros(st, pr->value.dev, &sh, GP_MEM_OPTIMIZER);
                    if (s != GP_OK) {
                        gp_optim_destroy(op);
                        return s;
                    }
                }
                op->n_states++;
            }
        }
    }
    *out = op;
    return GP_OK;
}

void gp_optim_destroy(gp_optim *o)
{
    if (!o) return;
    for (int q = 0; o->state && q < o->n_states; q++) gp_tensor_free(&o->state[q]);
    free(o->state);
    free(o->first);
    free(o->lo);
    free(o->part);
    free(o);
}

gp_tensor *gp_optim_state(gp_optim *o, int k, int p, int which)
{
    GP_ASSERT(k >= 0 && k < o->n_layers && p >= 0 && p < o->layers[k].n_params);
    if (!gp_param_trained(&o->layers[k].params[p]) || which < 0 || which >= o->per) return NULL;
    int q = o->first[k];
    for (int a = 0; a < p; a++) q += gp_param_trained(&o->layers[k].params[a]) ? o->per : 0;
    return &o->state[q + which];
}

bool gp_optim_state_range(const gp_optim *o, int k, int p, int64_t *lo, int64_t *hi)
{
    gp_tensor *st = gp_optim_state((gp_optim *)o, k, p, 0);
    int64_t n = gp_tensor_numel(&o->layers[k].params[p].value);
    *lo = 0;
    *hi = n;
    if (!st) return false;
    int q = (int)(st - o->state);
    if (!o->part[q]) return false;
    *lo = o->lo[q];
    *hi = o->lo[q] + gp_tensor_numel(st);
    return true;
}

int gp_optim_shards(const gp_optim *o, int *shard)
{
    if (shard) *shard = o->shard;
    return o->shards;
}

bool gp_optim_has_state(const gp_optim *o) { return o->n_states > 0; }

const gp_optim_opts *gp_optim_options(const gp_optim *o) { return &o->opts; }

const char *gp_optim_state_name(const gp_optim_opts *o, int which)
{
    if (o->kind == GP_OPTIM_SGD) return which == 0 ? "momentum" : NULL;
    return which == 0 ? "exp_avg" : which == 1 ? "exp_avg_sq" : NULL;
}

static float decay_of(const gp_optim *o, const gp_param *pr)
{
    return pr->no_decay && !o->opts.decay_bias_and_norm ? 0.0f : o->opts.weight_decay;
}

/* fn on every trainable parameter of layers [first, first + count) with its
 * states (NULL: none). */
typedef gp_status (*param_fn)(gp_optim *o, gp_param *pr, gp_tensor *state, const void *arg);

static gp_status each_param(gp_optim *o, int first, int count, param_fn fn, const void *arg)
{
    for (int k = first; k < first + count; k++) {
        gp_layer *l = &o->layers[k];
        int q = o->first[k];
        for (int p = 0; p < l->n_params; p++)
            if (gp_param_trained(&l->params[p])) {
                GP_TRY(fn(o, &l->params[p], o->per ? &o->state[q] : NULL, arg));
                q += o->per;
            }
    }
    return GP_OK;
}

/* The parts of an update gathered for one gp_dev_sgd_multi or
 * gp_dev_adam_multi call (a whole stage's update in one pass, one launch
 * on a GPU): flushed when full or when the device changes.  On the
 * caller's stack: stages update concurrently through one optimizer. */
#define UPDATE_BATCH 64
typedef struct {
    gp_device *dev;
    int n;
    gp_update_part parts[UPDATE_BATCH];
} update_batch;

typedef struct {
    double lr;
    gp_adam_step adam; /* Adam's step constants (kind adam, adamw) */
    int shard, shards;
    gp_comm *comm;
    update_batch *batch;
    gp_device *check_dev; /* gp_optim_update's */
    float *nonfinite;
    float clip; /* the gradients' factor (0: none) */
} update_arg;

/* Adam's constants for 1-based step t. */
static gp_adam_step adam_step(const gp_optim_opts *o, double lr, int64_t t)
{
    double bc1 = 1.0 - pow((double)o->beta1, (double)t);
    double bc2 = 1.0 - pow((double)o->beta2, (double)t);
    return (gp_adam_step){.lr = (float)lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                          .step_size = (float)(lr / bc1), .bc2_sqrt = (float)sqrt(bc2),
                          .decoupled = o->kind == GP_OPTIM_ADAMW};
}

static gp_status flush_batch(gp_optim *o, const update_arg *a)
{
    update_batch *b = a->batch;
    int n = b->n;
    b->n = 0;
    if (o->opts.kind != GP_OPTIM_SGD) return gp_dev_adam_multi(b->dev, b->parts, n, &a->adam);
    return gp_dev_sgd_multi(b->dev, b->parts, n, (float)a->lr, o->opts.momentum,
                            o->opts.nesterov);
}

static gp_status update_chunk(gp_optim *o, gp_param *pr, gp_tensor *st, const void *arg)
{
    const update_arg *a = arg;
    update_batch *b = a->batch;
    int64_t lo, hi;
    gp_comm_chunk(gp_tensor_numel(&pr->value), a->shards, a->shard, &lo, &hi);
    if (hi <= lo) return GP_OK;
    if (b->n == UPDATE_BATCH || (b->n > 0 && b->dev != pr->value.dev)) GP_TRY(flush_batch(o, a));
    b->dev = pr->value.dev;
    float *w = gp_f32(&pr->value);
    int64_t n = gp_tensor_numel(&pr->value);
    /* the whole tensor: its bf16 mirror, if it has one, written in the same
     * pass (a chunk's update marks the mirror stale; the gather writes the
     * rest) */
    uint16_t *w16 = NULL;
    if (hi - lo == n) w16 = gp_dev_mirror_for_update(b->dev, w, n);
    else gp_dev_weights_written(b->dev, w + lo, (size_t)(hi - lo) * sizeof(float));
    /* a state that is this replica's chunk alone starts at lo */
    int64_t off = lo;
    if (st && o->part[st - o->state]) {
        GP_ASSERT(a->shards == o->shards && a->shard == o->shard);
        off = 0;
    }
    b->parts[b->n++] = (gp_update_part){.w = w + lo, .g = gp_f32(&pr->grad) + lo,
                                        .v = st ? gp_f32(&st[0]) + off : NULL,
                                        .v2 = o->per > 1 ? gp_f32(&st[1]) + off : NULL,
                                        .n = hi - lo, .wd = decay_of(o, pr), .w16 = w16,
                                        .nonfinite = b->dev == a->check_dev ? a->nonfinite : NULL,
                                        .clip = a->clip};
    return GP_OK;
}

static gp_status update_fused(gp_optim *o, gp_param *pr, gp_tensor *st, const void *arg)
{
    const update_arg *a = arg;
    /* the collectives take this rank's chunk of the state: a whole state's
     * from its chunk's first element */
    int64_t lo = 0, hi = 0;
    if (st && !o->part[st - o->state]) {
        int rank = gp_comm_rank(a->comm, pr->value.dev);
        if (rank >= 0) gp_comm_chunk(gp_tensor_numel(&pr->value), a->comm->n, rank, &lo, &hi);
    }
    if (o->opts.kind != GP_OPTIM_SGD)
        return gp_dev_sharded_adam(pr->value.dev, a->comm, gp_f32(&pr->value), gp_f32(&pr->grad),
                                   gp_f32(&st[0]) + lo, gp_f32(&st[1]) + lo,
                                   gp_tensor_numel(&pr->value), decay_of(o, pr), &a->adam);
    return gp_dev_sharded_sgd(pr->value.dev, a->comm, gp_f32(&pr->value), gp_f32(&pr->grad),
                              st ? gp_f32(st) + lo : NULL,
                              gp_tensor_numel(&pr->value), (float)a->lr, o->opts.momentum,
                              decay_of(o, pr), o->opts.nesterov);
}

gp_status gp_optim_update(gp_optim *o, int first, int count, double lr, int64_t step, int shard,
                          int shards, gp_device *check_dev, float *nonfinite, float clip)
{
    GP_ASSERT(!nonfinite || shards == 1); /* a chunk's check would not be the tensor's */
    update_batch b = {.n = 0};
    update_arg a = {.lr = lr, .adam = adam_step(&o->opts, lr, step + 1), .shard = shard,
                    .shards = shards, .batch = &b, .check_dev = check_dev,
                    .nonfinite = nonfinite, .clip = clip};
    GP_TRY(each_param(o, first, count, update_chunk, &a));
    return flush_batch(o, &a);
}

gp_status gp_optim_update_fused(gp_optim *o, int first, int count, double lr, int64_t step,
                                gp_comm *comm)
{
    update_arg a = {.lr = lr, .adam = adam_step(&o->opts, lr, step + 1), .comm = comm};
    return each_param(o, first, count, update_fused, &a);
}

gp_status gp_optim_copy(gp_optim *dst, const gp_optim *src)
{
    GP_ASSERT(dst->n_states == src->n_states && dst->shards == 1 && src->shards == 1);
    for (int q = 0; q < src->n_states; q++) GP_TRY(gp_tensor_copy(&dst->state[q], &src->state[q]));
    return GP_OK;
}

gp_status gp_optim_gather_chunks(gp_optim *dst, gp_optim *const *ranks, int R)
{
    GP_ASSERT(dst->shards == 1); /* (a sharded one is gathered as it is written) */
    for (int q = 0; q < dst->n_states; q++) {
        gp_tensor *d = &dst->state[q];
        if (!gp_dev_can_shard(d->dev)) continue; /* updated in full on every rank */
        int64_t n = gp_tensor_numel(d);
        gp_shape flat = gp_shape_make(1, &n);
        gp_tensor d1 = gp_tensor_reshape(d, &flat);
        for (int r = 1; r < R; r++) {
            if (ranks[r] == dst) continue;
            GP_ASSERT(ranks[r]->n_states == dst->n_states);
            int64_t lo, hi;
            gp_comm_chunk(n, R, r, &lo, &hi);
            if (hi <= lo) continue;
            gp_tensor s1 = gp_tensor_reshape(&ranks[r]->state[q], &flat);
            gp_tensor a = gp_tensor_slice(&d1, lo, hi - lo), b = gp_tensor_slice(&s1, lo, hi - lo);
            GP_TRY(gp_tensor_copy(&a, &b));
        }
    }
    return GP_OK;
}

gp_status gp_clip_nonfinite(const gp_layer *layers, int n_layers, const double *sq, double norm,
                            int *bad_layer)
{
    *bad_layer = -1;
    const char *param = NULL;
    for (int k = 0, t = 0; k < n_layers && !param; k++)
        for (int a = 0; a < layers[k].n_params && !param; a++) {
            if (!gp_param_trained(&layers[k].params[a])) continue;
            if (!isfinite(sq[t++])) {
                *bad_layer = k;
                param = layers[k].params[a].name;
            }
        }
    char d[160] = "";
    if (param) gp_layer_describe(&layers[*bad_layer], d, sizeof d);
    return gp_error_set(GP_ERR_NUMERIC,
                        "the gradients are not finite (global norm %s%s%s%s%s): the update was "
                        "skipped, so the parameters, the optimizer's state and the batch-norm "
                        "statistics are as they were before this step; lower "
                        "train.optimizer.lr, add warm-up, or check the data",
                        isnan(norm) ? "NaN" : "Inf", param ? ", first in the " : "",
                        param ? param : "", param ? " of " : "", d);
}

gp_status gp_clip_grad_norm(gp_layer *layers, int n_layers, float max_norm, double *norm)
{
    float factor;
    GP_TRY(gp_clip_grad_factor(layers, n_layers, max_norm, norm, &factor));
    for (int k = 0; k < n_layers && factor > 0.0f; k++)
        for (int a = 0; a < layers[k].n_params; a++) {
            gp_param *pr = &layers[k].params[a];
            if (!gp_param_trained(pr) || !gp_tensor_mem(&pr->grad)) continue;
            GP_TRY(gp_dev_scale(pr->value.dev, gp_f32(&pr->grad), factor,
                                gp_tensor_numel(&pr->value)));
        }
    return GP_OK;
}

gp_status gp_clip_grad_factor(gp_layer *layers, int n_layers, float max_norm, double *norm,
                              float *factor)
{
    *factor = 0.0f;
    int total = 0;
    for (int k = 0; k < n_layers; k++) total += gp_layer_tensor_count(&layers[k]);
    size_t cap = (size_t)(total ? total : 1);
    double *sq = calloc(cap, sizeof *sq), sum = 0;
    const float **xs = malloc(cap * sizeof *xs);
    int64_t *ns = malloc(cap * sizeof *ns);
    gp_status s = sq && xs && ns ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory");
    /* each device's run of tensors [t0, t) in one gp_dev_sumsq_multi (one
     * host wait each), the same bits as one at a time; a tensor without
     * a gradient sums nothing */
    gp_device *dev = NULL;
    int t0 = 0, t = 0;
    for (int k = 0; k < n_layers && s == GP_OK; k++)
        for (int a = 0; a < layers[k].n_params && s == GP_OK; a++) {
            gp_param *pr = &layers[k].params[a];
            if (!gp_param_trained(pr)) continue;
            if (t > t0 && pr->value.dev != dev) {
                s = gp_dev_sumsq_multi(dev, xs + t0, ns + t0, t - t0, sq + t0);
                t0 = t;
            }
            dev = pr->value.dev;
            xs[t] = gp_f32(&pr->grad);
            ns[t++] = gp_tensor_mem(&pr->grad) ? gp_tensor_numel(&pr->value) : 0;
        }
    if (s == GP_OK && t > t0) s = gp_dev_sumsq_multi(dev, xs + t0, ns + t0, t - t0, sq + t0);
    for (int q = 0; q < total && s == GP_OK; q++) sum += sq[q];
    free(xs);
    free(ns);
    *norm = sqrt(sum);
    if (s == GP_OK && !isfinite(*norm)) {
        int bad;
        s = gp_clip_nonfinite(layers, n_layers, sq, *norm, &bad);
    }
    free(sq);
    GP_TRY(s);
    double coef = (double)max_norm / (*norm + 1e-6);
    if (coef < 1.0) *factor = (float)coef;
    return GP_OK;
}
