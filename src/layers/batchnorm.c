/*
 * batchnorm.c — batch normalisation: per channel over (N, H, W) of a 4-D
 * input, or per feature over N of a 2-D input.
 *
 * Parameters "weight" (gamma, init 1) and "bias" (beta, init 0), both
 * no_decay; buffers "running_mean" (0) and "running_var" (1).
 *
 * Training forward normalises with the micro-batch's own statistics (the
 * pipeline cannot wait for the whole mini-batch) and saves them for
 * backward.  Unless it is a recompute, it keeps the micro-batch's (count,
 * mean, M2) for the step: the statistics are computed into the next of the
 * layer's slots (one per micro-batch of the step, ctx->step_micro, on the
 * device; the saved mean and var are views of it) and the count on the
 * host.  commit() merges the slots into the step's accumulator in forward
 * order (Chan's parallel merge, in double) and folds the mini-batch into
 * the running statistics, in one launch for all of a stage's norms
 * (gp_dev_bn_commit_slots, held by gp_layers_commit: bn_commit_multi), so
 * the step never waits for the statistics on the host and launches
 * nothing per norm and micro-batch for them.  A forward with no slot left
 * (ctx->step_micro 0 or passed) merges the kept slots and its own
 * statistics at once, one launch each (gp_dev_bn_merge), and so do the
 * step's later forwards: the same arithmetic in the same order, so the
 * same bits either way.  PyTorch's running statistics:
 *   running_mean = (1 - m) running_mean + m mean
 *   running_var  = (1 - m) running_var  + m M2 / (count - 1)   (unbiased)
 * so m micro-batches give the same running statistics as the whole batch.
 * Eval forward normalises with the running statistics.
 *
 * gp_saved: t[0] = batch mean (C), t[1] = biased batch var (C).
 * The backend's bn_bwd yields dx, dgamma and dbeta at once, so
 * backward_data does the weight work too and flags it in gp_saved.
 *
 * SyncBN (`sync: true`, training, ctx->comm over R > 1 replicas): forward
 * computes the local per-channel mean and biased variance (bn_stats), the
 * ranks exchange (samples, mean, var) with one all-reduce over a buffer of
 * R slots in which each rank fills only its own (an all-gather: adding
 * zeros is exact), and every rank merges the R slots with Chan's formula in
 * double, in rank order — so all ranks get bitwise the same statistics of
 * the R micro-batches together, with no E[x^2] - E[x]^2 cancellation (the
 * only rounding is that of each rank's mean and var to float).  It
 * normalises with them (bn_fwd_infer), merges them into the step's
 * accumulator (identical on every replica), and keeps them by the
 * micro-batch's sample_offset until commit, so a recompute reuses them: no
 * second all-reduce, no second accumulation.  (The exchange is a host
 * wait per layer and micro-batch: SyncBN's statistics are read on the
 * host.)  Backward all-reduces the
 * per-channel sums (sum dy, sum dy (x - mean)) — float sums of each rank's
 * double sums, in rank order — and applies the batch-norm backward with
 * the global sums and count; dgamma and dbeta get only this rank's share,
 * since the gradient all-reduce adds the replicas' up.
 *
 * Without sync, data-parallel replicas still commit the same running
 * statistics: allreduce_stats merges the replicas' accumulators (the same
 * all-gather, through the host: one wait per layer per step) before
 * commit.
 */
#include "layers/layers_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t c;              /* channels / features */
    int64_t acc_count;      /* values per channel merged this step */
    /* On the device, 2C doubles: the running mean of this step's
     * micro-batches (C), then the sum of squared deviations from it (C). */
    double *acc;
    /* This step's micro-batch statistics not merged yet: slots (cap_slots,
     * 2C) on the device, n_slots filled in forward order, each a mean (C)
     * and a biased var (C) of slot_nb[i] values per channel. */
    gp_tensor slots;
    int cap_slots, n_slots;
    double *slot_nb;
    int64_t *slot_off;      /* [cap_slots] the micro-batch's sample_offset */
    /* A forward found no slot left this step: the kept ones were merged,
     * and no slot is taken again until the commit (the merged slots'
     * views may still be saved). */
    bool slots_closed;
    double *h_acc;          /* (2C) host scratch: the data-parallel merge */
    float *h_mean, *h_var;  /* (C) host scratch for it */
    int64_t batches_tracked; /* commits so far (PyTorch num_batches_tracked) */
    /* SyncBN: this step's merged statistics per micro-batch, for recompute
     * and backward; cleared by commit. */
    int n_sync, cap_sync;
    int64_t *sync_off;      /* [cap] sample_offset of the micro-batch */
    uint64_t *sync_step;    /* [cap] ctx->step it belongs to */
    double *sync_count;     /* [cap] values per channel over all replicas */
    float *sync_stats;      /* [cap][2C]: mean(C), biased var(C) */
    float *h_gather;        /* host scratch of the all-gather, R (1 + 2C) */
    int64_t cap_gather;
} bn_state;

enum { P_WEIGHT = 0, P_BIAS, P_RMEAN, P_RVAR };

static gp_bn_desc bn_desc(const gp_layer *l, int64_t n)
{
    gp_bn_desc d = {0};
    d.n = n;
    d.c = l->in_shape.dims[1];
    d.s = l->in_shape.ndim == 4 ? l->in_shape.dims[2] * l->in_shape.dims[3] : 1;
    d.eps = l->spec.eps;
    d.blk = l->in_blk; /* gp_layers_blocked: only a 2-d norm inside a chain */
    d.relu = l->relu_after; /* the forward loop: the in-place relu after it */
    d.add = NULL;
    return d;
}

/* The forward's: with a residual block's sum and relu folded in where the
 * block asks (gp_layer.fwd_add). */
static gp_bn_desc bn_fwd_desc(const gp_layer *l, int64_t n)
{
    gp_bn_desc d = bn_desc(l, n);
    if (l->fwd_add) {
        d.add = l->fwd_add;
        d.relu = true;
    }
    if (l->fwd_add16) { /* on bf16 storage: the bf16 slots' (bn_takes_bf16) */
        d.add16 = l->fwd_add16;
        d.relu = true;
    }
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

static size_t acc_bytes(const bn_state *st) { return 2 * (size_t)st->c * sizeof(double); }

/* All-zero bits are 0.0 in double too. */
static gp_status zero_acc(gp_layer *l)
{
    bn_state *st = l->state;
    return gp_dev_fill(l->dev, (float *)st->acc, 0.0f, (int64_t)(acc_bytes(st) / sizeof(float)));
}

static gp_status bn_init(gp_layer *l, uint64_t seed)
{
    int64_t c = l->in_shape.dims[1];
    bn_state *st = calloc(1, sizeof *st);
    /* the merge's host scratch only where the layer runs: a shape-only
     * layer (--dry-run, the planner) allocates nothing of its size */
    if (st && !l->meta) {
        st->h_acc = calloc((size_t)(2 * c), sizeof(double));
        st->h_mean = calloc((size_t)c, sizeof(float));
        st->h_var = calloc((size_t)c, sizeof(float));
    }
    if (st) st->c = c;
    l->state = st;
    if (!st || (!l->meta && (!st->h_acc || !st->h_mean || !st->h_var)))
        return gp_error_set(GP_ERR_OOM, "out of host memory for batch-norm statistics");
    /* counted with the parameters: state of the layer for its lifetime, as
     * the running statistics are (and so in the balancer's profile) */
    if (!l->meta) {
        GP_TRY(gp_dev_alloc(l->dev, acc_bytes(st), GP_MEM_PARAMS, (void **)&st->acc));
        GP_TRY(zero_acc(l));
    }
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
    if (st->acc) gp_dev_free(l->dev, st->acc, acc_bytes(st), GP_MEM_PARAMS);
    gp_tensor_free(&st->slots);
    free(st->slot_nb);
    free(st->slot_off);
    free(st->h_acc);
    free(st->h_mean);
    free(st->h_var);
    free(st->sync_off);
    free(st->sync_step);
    free(st->sync_count);
    free(st->sync_stats);
    free(st->h_gather);
    free(st);
    l->state = NULL;
}

/* Merge nb values per channel (mean, biased var on the device) into the
 * step's accumulator, on the device. */
static gp_status merge_acc(gp_layer *l, int64_t nb, const float *mean, const float *var)
{
    bn_state *st = l->state;
    GP_TRY(gp_dev_bn_merge(l->dev, st->c, st->acc, st->acc + st->c, (double)st->acc_count,
                           (double)nb, mean, var));
    st->acc_count += nb;
    return GP_OK;
}

/* The slot for this forward's statistics (*slot; -1: none, merge at once,
 * or for a recompute, allocate).  At the step's first forward the slots
 * are sized to its micro-batches (they stay between steps; nothing views
 * them then).  A recompute takes its forward's slot (the micro-batch's
 * sample_offset), whose statistics it computes again, the same bits. */
static gp_status slot_take(gp_layer *l, const gp_fwd_ctx *ctx, int *slot)
{
    bn_state *st = l->state;
    *slot = -1;
    if (ctx->recompute) {
        for (int q = 0; q < st->n_slots; q++)
            if (st->slot_off[q] == ctx->sample_offset) *slot = q;
        return GP_OK;
    }
    if (st->slots_closed) return GP_OK;
    if (st->n_slots == 0 && ctx->step_micro > st->cap_slots) {
        gp_tensor_free(&st->slots);
        st->cap_slots = 0;
        double *nb = realloc(st->slot_nb, (size_t)ctx->step_micro * sizeof *nb);
        if (nb) st->slot_nb = nb;
        int64_t *off = realloc(st->slot_off, (size_t)ctx->step_micro * sizeof *off);
        if (off) st->slot_off = off;
        if (!nb || !off)
            return gp_error_set(GP_ERR_OOM, "out of host memory for batch-norm statistics");
        /* counted with the parameters, as the accumulator: the layer's
         * state between steps */
        gp_shape ss = {2, {ctx->step_micro, 2 * st->c, 0, 0}};
        GP_TRY(gp_tensor_alloc(&st->slots, l->dev, &ss, GP_MEM_PARAMS));
        st->cap_slots = ctx->step_micro;
    }
    if (st->n_slots < st->cap_slots && st->n_slots < ctx->step_micro) *slot = st->n_slots;
    return GP_OK;
}

/* Views of slot q: its mean (C) and biased var (C). */
static void slot_views(const bn_state *st, int q, gp_tensor *mean, gp_tensor *var)
{
    gp_shape cs = {1, {st->c, 0, 0, 0}}, two = {2, {2, st->c, 0, 0}};
    gp_tensor row = gp_tensor_slice(&st->slots, q, 1);
    gp_tensor pair = gp_tensor_reshape(&row, &two);
    gp_tensor m = gp_tensor_slice(&pair, 0, 1), v = gp_tensor_slice(&pair, 1, 1);
    *mean = gp_tensor_reshape(&m, &cs);
    *var = gp_tensor_reshape(&v, &cs);
}

/* The slots' statistics merged into the accumulator now, one launch each
 * (before the data-parallel exchange of the accumulators, or when a
 * forward finds no slot left). */
static gp_status slots_merge(gp_layer *l)
{
    bn_state *st = l->state;
    for (int q = 0; q < st->n_slots; q++) {
        gp_tensor mean, var;
        slot_views(st, q, &mean, &var);
        GP_TRY(merge_acc(l, (int64_t)st->slot_nb[q], gp_f32(&mean), gp_f32(&var)));
    }
    st->n_slots = 0;
    return GP_OK;
}

/* ---- SyncBN ---------------------------------------------------------------- */

static bool bn_synced(const gp_layer *l, const gp_fwd_ctx *ctx)
{
    return l->spec.sync && ctx->training && ctx->comm && ctx->comm->n > 1;
}

static gp_status gather_scratch(bn_state *st, int64_t n)
{
    if (n <= st->cap_gather) return GP_OK;
    float *p = realloc(st->h_gather, (size_t)n * sizeof *p);
    if (!p) return gp_error_set(GP_ERR_OOM, "out of host memory for batch-norm statistics");
    st->h_gather = p;
    st->cap_gather = n;
    return GP_OK;
}

/* All-gather R slots of (count, a(C), b(C)) over comm: this rank's slot is
 * filled from the device arrays a, b (or from host arrays ha, hb when a is
 * NULL); the result lands in st->h_gather. */
static gp_status gather_stats(gp_layer *l, gp_comm *comm, int rank, double count,
                              const float *a, const float *b, const float *ha,
                              const float *hb)
{
    gp_device *dev = l->dev;
    bn_state *st = l->state;
    int64_t C = st->c, K = 1 + 2 * C, R = comm->n;
    if (count > 16777216.0)
        return gp_layer_spec_error(l, "%.0f values per channel in one step are more than a "
                                      "float counts exactly (2^24); use smaller micro-batches",
                                   count);
    GP_TRY(gather_scratch(st, R * K));
    gp_tensor buf;
    gp_shape bs = {1, {R * K, 0, 0, 0}};
    GP_TRY(gp_tensor_alloc(&buf, dev, &bs, GP_MEM_WORKSPACE));
    float *slot = gp_f32(&buf) + rank * K;
    float cnt = (float)count;
    gp_status s = gp_dev_fill(dev, gp_f32(&buf), 0.0f, R * K);
    if (s == GP_OK) s = gp_dev_upload(dev, slot, &cnt, 1);
    if (s == GP_OK && a) s = gp_dev_copy_d2d(dev, slot + 1, a, (size_t)C * sizeof(float));
    if (s == GP_OK && a) s = gp_dev_copy_d2d(dev, slot + 1 + C, b, (size_t)C * sizeof(float));
    if (s == GP_OK && !a) s = gp_dev_upload(dev, slot + 1, ha, C);
    if (s == GP_OK && !a) s = gp_dev_upload(dev, slot + 1 + C, hb, C);
    if (s == GP_OK) s = gp_dev_allreduce(dev, comm, gp_f32(&buf), R * K);
    if (s == GP_OK) s = gp_dev_download(dev, st->h_gather, gp_f32(&buf), R * K);
    if (s == GP_OK) s = gp_dev_synchronize(dev);
    gp_tensor_free(&buf);
    return s;
}

/* Chan's merge of (nb, mean_b, m2_b) into (na, mean, m2), per channel. */
static void chan_merge(int64_t C, double *na, double *mean, double *m2, double nb,
                       const float *mean_b, const float *m2_b)
{
    double n = *na + nb;
    if (nb <= 0) return;
    for (int64_t c = 0; c < C; c++) {
        double delta = (double)mean_b[c] - mean[c];
        mean[c] += delta * nb / n;
        m2[c] += (double)m2_b[c] + delta * delta * *na * nb / n;
    }
    *na = n;
}

static float *sync_find(bn_state *st, uint64_t step, int64_t off, double *count)
{
    for (int q = 0; q < st->n_sync; q++)
        if (st->sync_off[q] == off && st->sync_step[q] == step) {
            if (count) *count = st->sync_count[q];
            return st->sync_stats + (size_t)q * 2 * (size_t)st->c;
        }
    return NULL;
}

/* The slot index for (step, off), reused if present. */
static gp_status sync_slot(bn_state *st, uint64_t step, int64_t off, int *out)
{
    for (int q = 0; q < st->n_sync; q++)
        if (st->sync_off[q] == off && st->sync_step[q] == step) {
            *out = q;
            return GP_OK;
        }
    if (st->n_sync == st->cap_sync) {
        int cap = st->cap_sync ? 2 * st->cap_sync : 8;
        int64_t *o = realloc(st->sync_off, (size_t)cap * sizeof *o);
        if (o) st->sync_off = o;
        uint64_t *sp = realloc(st->sync_step, (size_t)cap * sizeof *sp);
        if (sp) st->sync_step = sp;
        double *cn = realloc(st->sync_count, (size_t)cap * sizeof *cn);
        if (cn) st->sync_count = cn;
        float *f = realloc(st->sync_stats, (size_t)cap * 2 * (size_t)st->c * sizeof *f);
        if (f) st->sync_stats = f;
        if (!o || !sp || !cn || !f)
            return gp_error_set(GP_ERR_OOM, "out of host memory for batch-norm statistics");
        st->cap_sync = cap;
    }
    int q = st->n_sync++;
    st->sync_off[q] = off;
    st->sync_step[q] = step;
    *out = q;
    return GP_OK;
}

static gp_status bn_forward_sync(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                 gp_tensor *y, gp_saved *s)
{
    gp_device *dev = l->dev;
    bn_state *st = l->state;
    gp_bn_desc d = bn_desc(l, x->dims[0]), fd = bn_fwd_desc(l, x->dims[0]);
    int64_t C = d.c;
    gp_shape cs = {1, {C, 0, 0, 0}};
    GP_TRY(gp_layers_saved_alloc(s, 0, dev, &cs));
    GP_TRY(gp_layers_saved_alloc(s, 1, dev, &cs));
    float *merged = sync_find(st, ctx->step, ctx->sample_offset, NULL);
    int64_t fresh = 0; /* values per channel to merge into the accumulator */
    if (!ctx->recompute || !merged) {
        GP_ASSERT(!ctx->recompute); /* a recompute follows its forward in the same step */
        if (d.n > 0) GP_TRY(gp_dev_bn_stats(dev, &d, gp_f32(x), gp_f32(&s->t[0]), gp_f32(&s->t[1])));
        else {
            GP_TRY(gp_dev_fill(dev, gp_f32(&s->t[0]), 0.0f, C));
            GP_TRY(gp_dev_fill(dev, gp_f32(&s->t[1]), 0.0f, C));
        }
        GP_TRY(gather_stats(l, ctx->comm, ctx->rank, (double)(d.n * d.s), gp_f32(&s->t[0]),
                            gp_f32(&s->t[1]), NULL, NULL));
        /* Merge the ranks in rank order: var * count is each rank's M2. */
        int64_t K = 1 + 2 * C;
        double na = 0;
        double *mean = calloc((size_t)C, sizeof *mean), *m2 = calloc((size_t)C, sizeof *m2);
        if (!mean || !m2) {
            free(mean);
            free(m2);
            return gp_error_set(GP_ERR_OOM, "out of host memory for batch-norm statistics");
        }
        for (int r = 0; r < ctx->comm->n; r++) {
            float *g = st->h_gather + r * K;
            double nb = (double)g[0];
            for (int64_t c = 0; c < C; c++) g[1 + C + c] = (float)((double)g[1 + C + c] * nb);
            chan_merge(C, &na, mean, m2, nb, g + 1, g + 1 + C);
        }
        gp_status e = GP_OK;
        if (na < 2)
            e = gp_layer_spec_error(l, "synchronised batch norm needs more than one value per "
                                       "channel over all replicas, but this micro-batch has "
                                       "%.0f; use fewer pipeline.chunks or a larger batch", na);
        int q = 0;
        if (e == GP_OK) e = sync_slot(st, ctx->step, ctx->sample_offset, &q);
        if (e == GP_OK) {
            merged = st->sync_stats + (size_t)q * 2 * (size_t)C;
            for (int64_t c = 0; c < C; c++) {
                merged[c] = (float)mean[c];
                merged[C + c] = (float)(m2[c] / na);
            }
            st->sync_count[q] = na;
            fresh = (int64_t)na;
        }
        free(mean);
        free(m2);
        GP_TRY(e);
    }
    GP_TRY(gp_dev_upload(dev, gp_f32(&s->t[0]), merged, C));
    GP_TRY(gp_dev_upload(dev, gp_f32(&s->t[1]), merged + C, C));
    /* The step's accumulator gets the replicas' micro-batches together:
     * the same statistics, so the same accumulator on every replica. */
    if (fresh > 0) GP_TRY(merge_acc(l, fresh, gp_f32(&s->t[0]), gp_f32(&s->t[1])));
    if (d.n == 0) return GP_OK;
    const float *gamma = gp_f32(&l->params[P_WEIGHT].value), *beta = gp_f32(&l->params[P_BIAS].value);
    return gp_dev_bn_fwd_infer(dev, &fd, gp_f32(x), gamma, beta, gp_f32(&s->t[0]), gp_f32(&s->t[1]),
                               gp_f32(y));
}

/* dx (may be NULL) and this rank's dgamma/dbeta share, with the sums
 * reduced over the replicas. */
static gp_status bn_backward_sync(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  const gp_tensor *dy, float *dx, gp_saved *s)
{
    gp_device *dev = l->dev;
    bn_state *st = l->state;
    gp_bn_desc d = bn_desc(l, x->dims[0]);
    int64_t C = d.c;
    double count = 0;
    if (!sync_find(st, ctx->step, ctx->sample_offset, &count))
        return gp_layer_spec_error(l, "synchronised backward without its forward's statistics "
                                      "(step %llu, sample %lld)",
                                   (unsigned long long)ctx->step, (long long)ctx->sample_offset);
    gp_tensor sums;
    gp_shape ss = {1, {4 * C, 0, 0, 0}};
    GP_TRY(gp_tensor_alloc(&sums, dev, &ss, GP_MEM_WORKSPACE));
    float *local = gp_f32(&sums), *global = gp_f32(&sums) + 2 * C;
    gp_status e = GP_OK;
    const float *gamma = gp_f32(&l->params[P_WEIGHT].value), *beta = gp_f32(&l->params[P_BIAS].value);
    if (d.n > 0)
        e = gp_dev_bn_bwd_sums(dev, &d, gp_f32(x), gamma, beta, gp_f32(&s->t[0]), gp_f32(&s->t[1]),
                               gp_f32(dy), local);
    else e = gp_dev_fill(dev, local, 0.0f, 2 * C);
    if (e == GP_OK) e = gp_dev_copy_d2d(dev, global, local, (size_t)(2 * C) * sizeof(float));
    if (e == GP_OK) e = gp_dev_allreduce(dev, ctx->comm, global, 2 * C);
    if (e == GP_OK && d.n > 0)
        e = gp_dev_bn_bwd_apply(dev, &d, gp_f32(x), gamma, beta, gp_f32(&s->t[0]), gp_f32(&s->t[1]),
                                gp_f32(dy), global, count, dx, local,
                                gp_f32(&l->params[P_WEIGHT].grad), gp_f32(&l->params[P_BIAS].grad));
    gp_tensor_free(&sums);
    return e;
}

/* Batch norm on bf16 storage without the adapter: where the device has the
 * bf16 slots (gp_dev_bn_bf16_has), bit for bit the adapter's.  SyncBN's
 * pieces (bn_stats, bn_bwd_sums, bn_bwd_apply) have no bf16 form, so a
 * `sync: true` norm stays behind the adapter. */
static bool bn_takes_bf16(const gp_layer *l)
{
    return gp_dev_bn_bf16_has(l->dev) && !l->spec.sync && !l->fwd_add;
}

/* The slots on x's element type (y's and dx's are x's: bn_takes_bf16). */
static gp_status fwd_infer(gp_device *dev, const gp_bn_desc *d, const gp_tensor *x,
                           const float *gamma, const float *beta, const float *mean,
                           const float *var, gp_tensor *y)
{
    if (x->dtype == GP_BF16)
        return gp_dev_bn_fwd_infer_bf16(dev, d, gp_bf16(x), gamma, beta, mean, var, gp_bf16(y));
    return gp_dev_bn_fwd_infer(dev, d, gp_f32(x), gamma, beta, mean, var, gp_f32(y));
}

static gp_status fwd_train(gp_device *dev, const gp_bn_desc *d, const gp_tensor *x,
                           const float *gamma, const float *beta, gp_tensor *y, float *mean,
                           float *var)
{
    if (x->dtype == GP_BF16)
        return gp_dev_bn_fwd_train_bf16(dev, d, gp_bf16(x), gamma, beta, gp_bf16(y), mean, var);
    return gp_dev_bn_fwd_train(dev, d, gp_f32(x), gamma, beta, gp_f32(y), mean, var);
}

static gp_status bn_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                            gp_tensor *y, gp_saved *s)
{
    if (bn_synced(l, ctx)) return bn_forward_sync(l, ctx, x, y, s);
    gp_device *dev = l->dev;
    gp_bn_desc d = bn_fwd_desc(l, x->dims[0]);
    const float *gamma = gp_f32(&l->params[P_WEIGHT].value), *beta = gp_f32(&l->params[P_BIAS].value);
    if (!ctx->training) {
        s->flags |= GP_SAVED_EVAL;
        if (d.n == 0) return GP_OK;
        return fwd_infer(dev, &d, x, gamma, beta, gp_f32(&l->params[P_RMEAN].value),
                         gp_f32(&l->params[P_RVAR].value), y);
    }
    if (d.n * d.s < 2)
        return gp_layer_spec_error(l,
                                   "training batch norm needs more than one value per channel, "
                                   "but this micro-batch has %lld sample(s) of %lld value(s) per "
                                   "channel; use fewer pipeline.chunks or a larger batch",
                                   (long long)d.n, (long long)d.s);
    bn_state *st = l->state;
    int slot;
    GP_TRY(slot_take(l, ctx, &slot));
    if (slot >= 0) {
        slot_views(st, slot, &s->t[0], &s->t[1]);
    } else {
        gp_shape cs = {1, {d.c, 0, 0, 0}};
        GP_TRY(gp_layers_saved_alloc(s, 0, dev, &cs));
        GP_TRY(gp_layers_saved_alloc(s, 1, dev, &cs));
    }
    GP_TRY(fwd_train(dev, &d, x, gamma, beta, y, gp_f32(&s->t[0]), gp_f32(&s->t[1])));
    if (ctx->recompute) return GP_OK; /* the statistics were kept the first time */
    if (slot < 0) { /* after the kept ones, so in forward order */
        GP_TRY(slots_merge(l));
        st->slots_closed = true;
        return merge_acc(l, d.n * d.s, gp_f32(&s->t[0]), gp_f32(&s->t[1]));
    }
    st->slot_nb[slot] = (double)(d.n * d.s);
    st->slot_off[slot] = ctx->sample_offset;
    st->n_slots++;
    return GP_OK;
}

static gp_status bn_backward_all(gp_layer *l, const gp_tensor *x, const gp_tensor *dy,
                                 gp_tensor *dx, gp_saved *s)
{
    if (s->flags & GP_SAVED_EVAL)
        return gp_layer_spec_error(l, "backward after an eval-mode forward: batch norm "
                                      "saved no batch statistics (run forward with training)");
    GP_ASSERT(gp_tensor_mem(&s->t[0]) && gp_tensor_mem(&s->t[1]));
    gp_bn_desc d = bn_desc(l, x->dims[0]);
    const float *gamma = gp_f32(&l->params[P_WEIGHT].value), *beta = gp_f32(&l->params[P_BIAS].value);
    const float *mean = gp_f32(&s->t[0]), *var = gp_f32(&s->t[1]);
    float *dgamma = gp_f32(&l->params[P_WEIGHT].grad), *dbeta = gp_f32(&l->params[P_BIAS].grad);
    if (x->dtype == GP_BF16)
        return gp_dev_bn_bwd_bf16(l->dev, &d, gp_bf16(x), gamma, beta, mean, var, gp_bf16(dy),
                                  gp_bf16(dx), dgamma, dbeta);
    return gp_dev_bn_bwd(l->dev, &d, gp_f32(x), gamma, beta, mean, var, gp_f32(dy), gp_f32(dx),
                         dgamma, dbeta);
}

static gp_status bn_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                  gp_saved *s)
{
    if (bn_synced(l, ctx) && !(s->flags & GP_SAVED_EVAL))
        GP_TRY(bn_backward_sync(l, ctx, x, dy, gp_f32(dx), s));
    else
        GP_TRY(bn_backward_all(l, x, dy, dx, s));
    s->flags |= GP_SAVED_WEIGHTS_DONE;
    return GP_OK;
}

static gp_status bn_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                     const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    if (gp_saved_take_weights_done(s)) return GP_OK;
    if (bn_synced(l, ctx) && !(s->flags & GP_SAVED_EVAL))
        return bn_backward_sync(l, ctx, x, dy, NULL, s); /* no dx, no scratch */
    /* No one needs dx (first layer of the model): scratch for the kernel. */
    gp_tensor scratch;
    gp_shape xs = gp_tensor_shape(x);
    GP_TRY(gp_tensor_alloc_as(&scratch, l->dev, &xs, x->dtype, GP_MEM_WORKSPACE));
    gp_status st = bn_backward_all(l, x, dy, &scratch, s);
    gp_tensor_free(&scratch);
    return st;
}

static gp_status bn_commit(gp_layer *l)
{
    bn_state *st = l->state;
    if (st->acc_count == 0 && st->n_slots == 0) return GP_OK; /* no training forward */
    /* on the device: the slots merged, the running statistics, and the
     * accumulator zeroed */
    gp_bn_commit_part p = {.c = st->c, .rmean = gp_f32(&l->params[P_RMEAN].value),
                           .rvar = gp_f32(&l->params[P_RVAR].value), .mean_acc = st->acc,
                           .m2_acc = st->acc + st->c, .momentum = (double)l->spec.momentum,
                           .pend = st->n_slots ? gp_f32(&st->slots) : NULL,
                           .n_pend = st->n_slots, .na = (double)st->acc_count};
    GP_TRY(gp_dev_bn_commit_slots(l->dev, p, st->slot_nb));
    st->batches_tracked++;
    st->n_sync = 0;
    st->acc_count = 0;
    st->n_slots = 0;
    st->slots_closed = false;
    return GP_OK;
}

/* A failed step: its micro-batches' (count, mean, M2) and SyncBN's merged
 * statistics go, and the accumulator is zero again (merge_acc relies on
 * it).  The fill is queued like any work of the device; if the device has
 * failed, the next step fails there first. */
static void bn_discard(gp_layer *l)
{
    bn_state *st = l->state;
    if (!st || (st->acc_count == 0 && st->n_sync == 0 && st->n_slots == 0)) return;
    if (zero_acc(l) != GP_OK) gp_error_clear();
    st->acc_count = 0;
    st->n_sync = 0;
    st->n_slots = 0;
    st->slots_closed = false;
}

/* Data parallelism without sync: every replica merges all replicas'
 * pending (count, mean, M2) in rank order, so all commit the statistics of
 * the global mini-batch.  SyncBN accumulators are global already.  The
 * accumulator comes to the host for it and goes back. */
static gp_status bn_allreduce_stats(gp_layer *l, gp_comm *comm)
{
    bn_state *st = l->state;
    int rank = gp_comm_rank(comm, l->dev);
    if (l->spec.sync || !comm || comm->n < 2) return GP_OK;
    GP_ASSERT(rank >= 0);
    GP_TRY(slots_merge(l)); /* the exchange reads the accumulator */
    gp_device *dev = l->dev;
    int64_t C = st->c, K = 1 + 2 * C, nf = (int64_t)(acc_bytes(st) / sizeof(float));
    double *mean = st->h_acc, *m2 = st->h_acc + C;
    GP_TRY(gp_dev_download(dev, (float *)st->h_acc, (const float *)st->acc, nf));
    GP_TRY(gp_dev_synchronize(dev));
    for (int64_t c = 0; c < C; c++) {
        st->h_mean[c] = (float)mean[c];
        st->h_var[c] = (float)m2[c];
    }
    GP_TRY(gather_stats(l, comm, rank, (double)st->acc_count, NULL, NULL, st->h_mean,
                        st->h_var));
    double na = 0;
    memset(st->h_acc, 0, acc_bytes(st));
    for (int r = 0; r < comm->n; r++) {
        const float *g = st->h_gather + r * K;
        chan_merge(C, &na, mean, m2, (double)g[0], g + 1, g + 1 + C);
    }
    st->acc_count = (int64_t)na;
    GP_TRY(gp_dev_upload(dev, (float *)st->acc, (const float *)st->h_acc, nf));
    return gp_dev_synchronize(dev); /* the host scratch is reused */
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
    const bn_state *st = l->state;
    double kept = 0;
    for (int q = 0; q < st->n_slots; q++) kept += st->slot_nb[q];
    return st->acc_count + (int64_t)kept;
}

static double bn_flops(const gp_layer *l, int64_t n)
{
    /* statistics (2 per element) and the affine normalisation (2 per element) */
    return 4.0 * (double)n * (double)gp_shape_numel(&l->in_shape);
}

/* 2C floats a micro-batch: a direct call's gp_saved, or in a step the
 * micro-batch's slot (GP_MEM_PARAMS, slot_take): the same bytes, one slot
 * per micro-batch of the step, as every micro-batch's gp_saved would be. */
static size_t bn_saved_bytes(const gp_layer *l, int64_t n)
{
    return 2 * (size_t)l->in_shape.dims[1] * sizeof(float);
}

static int bn_counters(gp_layer *l, const char **names, int64_t **values, int max)
{
    if (max > 0) {
        names[0] = "num_batches_tracked";
        values[0] = gp_batchnorm_counter(l);
    }
    return 1;
}

const gp_layer_ops gp_batchnorm_ops = {
    .type = GP_LAYER_BATCHNORM,
    .counters = bn_counters,
    .infer = bn_infer,
    .init = bn_init,
    .forward = bn_forward,
    .backward_data = bn_backward_data,
    .backward_weights = bn_backward_weights,
    .commit = bn_commit,
    .discard = bn_discard,
    .flops = bn_flops,
    .saved_bytes = bn_saved_bytes,
    .destroy = bn_destroy,
    .allreduce_stats = bn_allreduce_stats,
    .bwd_ignores_y = true, /* reads x, dy and what it saved */
    .takes_bf16 = bn_takes_bf16,
};
