/*
 * replicas.c — data parallelism: R replicas of the pipelined model, one
 * gp_pipeline each (with its own workers), stepped together by the calling
 * thread through gp_pipeline_step_begin / _end.
 *
 * Communicators: one per stage j over the R devices that run stage j
 * (rank = replica), made once on the first step and handed to each
 * replica's pipeline (gp_pipeline_join), whose schedule then has the
 * reductions, the replicas' barrier and the sharded update as instructions
 * (schedule.h).  SyncBN layers use the communicators through gp_fwd_ctx.
 *
 * This file builds on model.c (a gp_model is one replica) and model.c knows
 * nothing of it: gp_model_free and gp_model_pipeline_step, the entry points
 * that see every replica, live here.
 *
 * Failure: the first failing worker of any replica calls group_fail, which
 * cancels every replica's step and aborts every communicator: ranks blocked
 * in a collective return GP_ERR_CANCELLED, and the caller gets the first
 * real error.  Nobody reaches the optimizer unless every stage of every
 * replica got through its backward: worker j passes its own replica's
 * barrier, then a barrier over stage j's replicas (gp_dev_barrier), before
 * it commits statistics or updates.  A failure after that point (the
 * update itself failing) can leave the update partly applied.
 *
 * Consistency: all replicas start from replica 0's state (copied when the
 * group is made, so a snapshot loaded into replica 0 reaches all), reduce
 * the same gradients bitwise identically (cpu_comm.c sums in rank order and
 * every rank copies the owner's chunk), and apply the same update, so they
 * stay bitwise identical; debug builds check it every 100 steps.
 *
 * Sharded update (when the backend has reduce_scatter / all_gather, as the
 * CPU and NCCL do): the gradients are reduce-scattered, replica r updates
 * chunk r of every parameter (and of its momentum), and the parameters are
 * all-gathered (on stage 0 the three are one collective, the fused UPDATE).
 * Each replica thus reads and writes 1/R of the optimizer's memory
 * traffic, and its momentum is current only in its own chunk:
 * gp_model_gather_momentum assembles the whole in replica 0 before a
 * snapshot reads it.
 *
 * Shared state: group->failed is guarded by group->lock; the rest is
 * written by the caller thread between steps.
 */
#include "train/train.h"

#include <stdlib.h>
#include <string.h>

typedef struct gp_replica_group {
    int R, n;
    gp_comm *comms[GP_MAX_DEVICES];   /* per stage, rank = replica */
    gp_pipeline **pipes;              /* [R], not owned (each model's pipe) */
    pthread_mutex_t lock;
    bool failed;                      /* a replica failed this step */
} gp_replica_group;

static gp_model *replica(gp_model *m, int r) { return r == 0 ? m : &m->replicas[r - 1]; }
static const gp_model *replica_c(const gp_model *m, int r)
{
    return r == 0 ? m : &m->replicas[r - 1];
}

gp_status gp_model_build_replicated(const gp_config *cfg, gp_device *const *devs, int R,
                                    int n, const int *balance, gp_model *out)
{
    GP_TRY(gp_model_build_replica(cfg, devs, n, balance, 0, R, out));
    if (R <= 1) return GP_OK;
    out->replicas = calloc((size_t)(R - 1), sizeof *out->replicas);
    if (!out->replicas) {
        gp_model_free(out);
        return gp_error_set(GP_ERR_OOM, "out of host memory building replicas");
    }
    out->n_replicas = 1;
    for (int r = 1; r < R; r++) {
        /* Parameters are drawn from (seed, layer index): every replica
         * starts identical without a copy. */
        gp_status s = gp_model_build_replica(cfg, devs + (size_t)r * (size_t)n, n, balance, r,
                                             R, &out->replicas[r - 1]);
        if (s != GP_OK) {
            gp_error_wrap(s, "replica %d", r);
            gp_model_free(out);
            return s;
        }
        out->n_replicas = r + 1;
    }
    return GP_OK;
}

void gp_model_free(gp_model *m)
{
    if (!m) return;
    /* Workers first (they may use the communicators), then the group. */
    for (int r = 1; r < m->n_replicas; r++) gp_model_release(&m->replicas[r - 1]);
    gp_replica_group *g = m->group;
    if (g) {
        gp_pipeline_destroy(m->pipe);
        m->pipe = NULL;
        for (int j = 0; j < g->n; j++) gp_comm_destroy(g->comms[j]);
        pthread_mutex_destroy(&g->lock);
        free(g->pipes);
        free(g);
    }
    free(m->replicas);
    gp_comm *pc = m->proc_comm; /* (release clears the struct) */
    gp_model_release(m);        /* the pipeline first: its workers use proc_comm */
    gp_comm_destroy(pc);
}

/* From the failing worker, outside its pipeline's lock. */
static void group_fail(void *arg)
{
    gp_replica_group *g = arg;
    pthread_mutex_lock(&g->lock);
    g->failed = true;
    pthread_mutex_unlock(&g->lock);
    /* Cancel before aborting, so that a rank released by the abort finds
     * its own pipeline cancelled already. */
    for (int r = 0; r < g->R; r++) gp_pipeline_cancel(g->pipes[r]);
    for (int j = 0; j < g->n; j++) gp_comm_abort(g->comms[j]);
}

static gp_status copy_state(gp_model *dst, const gp_model *src)
{
    for (int k = 0; k < src->n_layers; k++)
        for (int p = 0; p < src->layers[k].n_params; p++)
            GP_TRY(gp_tensor_copy(&dst->layers[k].params[p].value,
                                  &src->layers[k].params[p].value));
    /* (sharded, ZeRO stage 1: each replica's own chunk, made or loaded so) */
    if (gp_optim_shards(src->optim, NULL) == 1) GP_TRY(gp_optim_copy(dst->optim, src->optim));
    dst->step = src->step;
    return GP_OK;
}

gp_status gp_model_sync_replicas(gp_model *m)
{
    /* (before the group is made there is nothing to do: making it copies) */
    if (!m->group) return GP_OK;
    for (int r = 1; r < m->n_replicas; r++) GP_TRY(copy_state(replica(m, r), m));
    return GP_OK;
}

static gp_status make_group(gp_model *m, const gp_config *cfg)
{
    int R = m->n_replicas, n = m->n_stages;
    for (int r = 0; r < R; r++) {
        gp_model *mr = replica(m, r);
        if (r > 0) GP_TRY(copy_state(mr, m));
        gp_pipeline_opts po = gp_model_pipeline_opts(mr, cfg);
        if (!mr->pipe)
            GP_TRY(gp_pipeline_create(mr->layers, mr->n_layers, &mr->input, n, mr->devs,
                                      mr->balance, &po, &mr->pipe));
    }
    gp_replica_group *g = calloc(1, sizeof *g);
    if (!g) return gp_error_set(GP_ERR_OOM, "out of host memory");
    g->pipes = calloc((size_t)R, sizeof *g->pipes);
    if (!g->pipes) {
        free(g);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    g->R = R;
    g->n = n;
    for (int j = 0; j < n; j++) {
        gp_device *grp[GP_MAX_DEVICES];
        for (int r = 0; r < R; r++) grp[r] = replica(m, r)->devs[j];
        gp_status s = gp_comm_create(grp, R, &g->comms[j]);
        if (s != GP_OK) { /* no half-made group: the next step makes it again */
            for (int q = 0; q < j; q++) gp_comm_destroy(g->comms[q]);
            free(g->pipes);
            free(g);
            return gp_error_wrap(s, "communicator of stage %d", j);
        }
    }
    pthread_mutex_init(&g->lock, NULL);
    m->group = g;
    for (int r = 0; r < R; r++) {
        g->pipes[r] = replica(m, r)->pipe;
        gp_pipeline_join(g->pipes[r], g->comms, r, group_fail, g);
    }
    return GP_OK;
}

static gp_status replicated_step(gp_model *m, const gp_config *cfg, const float *x,
                                 const float *y, int64_t n, double lr, gp_step_stats *st);

/* Processes with replicas: this rank's replica r takes its shard of the
 * global batch (micro-batches r x chunks .. (r + 1) x chunks - 1 of R x
 * chunks, as replicated_step gives replica r), its pipeline joined to the
 * other replicas' ranks through proc_comm; the loss comes summed over the
 * replicas' last stages (gp_pipeline_step_end). */
static gp_status process_replica_step(gp_model *m, const gp_config *cfg, const float *x,
                                      const float *y, int64_t n, double lr, gp_step_stats *st)
{
    int R = m->proc_replicas, chunks = cfg->pipeline.chunks, nd = m->n_devices;
    int r = gp_procs_rank() / nd;
    if (n < (int64_t)R * chunks)
        return gp_error_set(GP_ERR_INVALID,
                            "a batch of %lld samples cannot feed %d replicas x %d micro-batches; "
                            "raise train.batch_size to at least %lld or lower pipeline.chunks",
                            (long long)n, R, chunks, (long long)R * chunks);
    if (!m->pipe) {
        gp_pipeline_opts po = gp_model_pipeline_opts(m, cfg);
        GP_TRY(gp_pipeline_create(m->layers, m->n_layers, &m->input, m->n_stages, m->devs,
                                  m->balance, &po, &m->pipe));
        gp_comm *comms[GP_MAX_DEVICES];
        for (int j = 0; j < m->n_stages; j++) comms[j] = m->proc_comm; /* only its own run */
        gp_pipeline_join(m->pipe, comms, r, NULL, NULL);
    }
    int64_t *sizes = malloc((size_t)R * (size_t)chunks * sizeof *sizes);
    if (!sizes) return gp_error_set(GP_ERR_OOM, "out of host memory");
    gp_status s = gp_microbatch_split(n, R * chunks, sizes);
    int64_t lo = 0, cnt = 0;
    for (int q = 0; q < R * chunks; q++) {
        if (q < r * chunks) lo += sizes[q];
        else if (q < (r + 1) * chunks) cnt += sizes[q];
    }
    free(sizes);
    GP_TRY(s);
    int64_t per = gp_shape_numel(&m->input);
    gp_pipeline_set_device_time(m->pipe, m->device_time);
    GP_TRY(gp_pipeline_step_begin(m->pipe, x + lo * per, y + lo * m->targets, cnt, lo, n,
                                  cfg->train.seed, (uint64_t)m->step, lr));
    gp_pipeline_out po;
    gp_status se = gp_pipeline_step_end(m->pipe, &po);
    m->refused = se != GP_OK && gp_pipeline_step_untouched(m->pipe);
    GP_TRY(se);
    m->step++;
    double comm = 0;
    for (int j = 0; j < m->n_stages; j++) {
        double c = gp_pipeline_comm_seconds(m->pipe, m->dev_of[j]);
        if (c > comm) comm = c;
    }
    if (st) {
        *st = gp_step_stats_of(po.loss_sum, po.correct, po.count, n, lr, po.seconds, comm);
        st->grad_norm = po.grad_norm;
        gp_step_stats_bubble(st, &po);
    }
    return GP_OK;
}

gp_status gp_model_pipeline_step(gp_model *m, const gp_config *cfg, const float *x,
                                 const float *y, int64_t n, double lr, gp_step_stats *st)
{
    m->refused = true; /* (an error before a step runs changes nothing) */
    if (m->n_replicas > 1) return replicated_step(m, cfg, x, y, n, lr, st);
    if (m->proc_replicas > 1) return process_replica_step(m, cfg, x, y, n, lr, st);
    return gp_model_pipeline_step_one(m, cfg, x, y, n, lr, st);
}

static gp_status replicated_step(gp_model *m, const gp_config *cfg, const float *x,
                                 const float *y, int64_t n, double lr, gp_step_stats *st)
{
    double t0 = gp_now();
    int R = m->n_replicas, chunks = cfg->pipeline.chunks;
    if (n < (int64_t)R * chunks)
        return gp_error_set(GP_ERR_INVALID,
                            "a batch of %lld samples cannot feed %d replicas x %d micro-batches; "
                            "raise train.batch_size to at least %lld or lower pipeline.chunks",
                            (long long)n, R, chunks, (long long)R * chunks);
    if (!m->group) GP_TRY(make_group(m, cfg));
    gp_replica_group *g = m->group;
    int64_t *sizes = malloc((size_t)R * (size_t)chunks * sizeof *sizes);
    int64_t *off = malloc((size_t)(R + 1) * sizeof *off);
    gp_status *res = malloc((size_t)R * sizeof *res);
    char (*msg)[1024] = malloc((size_t)R * sizeof *msg);
    gp_status s = sizes && off && res && msg ? GP_OK
                                                    : gp_error_set(GP_ERR_OOM, "out of host memory");
    if (s == GP_OK) s = gp_microbatch_split(n, R * chunks, sizes);
    if (s != GP_OK) goto out;
    off[0] = 0;
    for (int r = 0; r < R; r++) {
        off[r + 1] = off[r];
        for (int i = 0; i < chunks; i++) off[r + 1] += sizes[r * chunks + i];
    }
    int64_t per = gp_shape_numel(&m->input);
    for (int j = 0; j < g->n; j++) gp_comm_reset(g->comms[j]); /* nobody is inside */
    g->failed = false; /* no worker runs: no lock needed */
    int begun = 0;
    for (int r = 0; r < R; r++) /* every replica's is traced */
        gp_pipeline_set_device_time(g->pipes[r], m->device_time);
    for (int r = 0; r < R; r++) {
        res[r] = gp_pipeline_step_begin(g->pipes[r], x + off[r] * per, y + off[r] * m->targets,
                                        off[r + 1] - off[r], off[r], n, cfg->train.seed,
                                        (uint64_t)m->step, lr);
        if (res[r] != GP_OK) {
            snprintf(msg[r], sizeof msg[r], "%s", gp_error_message());
            break;
        }
        begun++;
    }
    /* A replica that failed before a later one began could not cancel it. */
    pthread_mutex_lock(&g->lock);
    bool failed = g->failed || begun < R;
    pthread_mutex_unlock(&g->lock);
    if (failed) group_fail(g);
    double loss = 0, comm = 0, norm = NAN;
    int64_t correct = 0, count = 0;
    for (int r = 0; r < begun; r++) {
        gp_pipeline_out po;
        res[r] = gp_pipeline_step_end(g->pipes[r], &po);
        if (res[r] != GP_OK) {
            snprintf(msg[r], sizeof msg[r], "%s", gp_error_message());
            continue;
        }
        if (r == 0) norm = po.grad_norm; /* every replica's is the same */
        loss += po.loss_sum;
        correct += po.correct;
        count += po.count;
        for (int j = 0; j < g->n; j++) {
            double c = gp_pipeline_comm_seconds(g->pipes[r], j);
            if (c > comm) comm = c;
        }
    }
    /* The first real error; cancellations are its echo in the others. */
    int bad = -1;
    for (int r = 0; r < (begun < R ? begun + 1 : R); r++)
        if (res[r] != GP_OK && (bad < 0 || (res[bad] == GP_ERR_CANCELLED &&
                                            res[r] != GP_ERR_CANCELLED)))
            bad = r;
    if (bad >= 0) {
        /* refused (the model as it was) only if no replica began its
         * update: a failure before the replicas' barrier (or at CLIP) stops
         * every replica before any commit */
        bool untouched = true;
        for (int r = 0; r < begun; r++)
            untouched = untouched && gp_pipeline_step_untouched(g->pipes[r]);
        m->refused = untouched;
        s = gp_error_set(res[bad], "replica %d: %s", bad, msg[bad]);
        goto out;
    }
    for (int r = 0; r < R; r++) replica(m, r)->step++;
    m->refused = false; /* updated: a failure from here on is past the update */
#ifndef NDEBUG
    if (m->step % 100 == 0) s = gp_model_check_replicas(m);
#endif
    if (st) {
        *st = gp_step_stats_of(loss, correct, count, n, lr, gp_now() - t0, comm);
        st->grad_norm = norm;
    }
out:
    free(sizes);
    free(off);
    free(res);
    free(msg);
    return s;
}

gp_status gp_model_gather_momentum(gp_model *m)
{
    /* each replica keeps its chunk alone (ZeRO stage 1): a snapshot
     * assembles the chunks as it writes them (snapshot.c) */
    if (gp_optim_shards(m->optim, NULL) > 1) return GP_OK;
    if (m->proc_comm) { /* processes: each replica's chunks from their ranks */
        for (int k = 0; k < m->n_layers; k++)
            for (int p = 0; p < m->layers[k].n_params; p++) {
                gp_tensor *v;
                for (int q = 0; (v = gp_optim_state(m->optim, k, p, q)); q++)
                    if (gp_tensor_mem(v))
                        GP_TRY(gp_dev_all_gather(v->dev, m->proc_comm, gp_f32(v),
                                                 gp_tensor_numel(v)));
            }
        return GP_OK;
    }
    int R = m->n_replicas;
    if (R <= 1 || !m->group) return GP_OK; /* no step yet: all are replica 0's copy */
    gp_optim *ranks[GP_MAX_DEVICES];
    for (int r = 0; r < R; r++) ranks[r] = replica(m, r)->optim;
    return gp_optim_gather_chunks(m->optim, ranks, R);
}

/* FNV-1a over the bytes of every parameter and buffer of layer k. */
static gp_status layer_hash(const gp_model *m, int k, uint64_t *out)
{
    uint64_t h = 1469598103934665603ull;
    const gp_layer *l = &m->layers[k];
    for (int p = 0; p < l->n_params; p++) {
        const gp_tensor *t = &l->params[p].value;
        int64_t c = gp_tensor_numel(t);
        float *buf = malloc((size_t)(c > 0 ? c : 1) * sizeof *buf);
        if (!buf) return gp_error_set(GP_ERR_OOM, "out of host memory");
        gp_status s = gp_dev_download(t->dev, buf, gp_f32(t), c);
        if (s == GP_OK) s = gp_dev_synchronize(t->dev);
        const unsigned char *b = (const unsigned char *)buf;
        for (size_t q = 0; s == GP_OK && q < (size_t)c * sizeof *buf; q++) {
            h ^= b[q];
            h *= 1099511628211ull;
        }
        free(buf);
        GP_TRY(s);
    }
    *out = h;
    return GP_OK;
}

gp_status gp_model_check_replicas(const gp_model *m)
{
    for (int k = 0; k < m->n_layers; k++) {
        uint64_t h0;
        GP_TRY(layer_hash(m, k, &h0));
        for (int r = 1; r < m->n_replicas; r++) {
            uint64_t h;
            GP_TRY(layer_hash(replica_c(m, r), k, &h));
            if (h != h0) {
                char d[160];
                return gp_error_set(GP_ERR_RUNTIME,
                                    "replica %d diverged from replica 0 at %s (checksums "
                                    "%016llx vs %016llx): a data-parallelism bug", r,
                                    gp_layer_describe(&m->layers[k], d, sizeof d),
                                    (unsigned long long)h, (unsigned long long)h0);
            }
        }
    }
    return GP_OK;
}
