/*
 * pipeline.c — the executor: one worker thread per device running its
 * instruction list (schedule.h) as a plain loop, copies between devices,
 * and clean cancellation.  What each instruction does to a stage's layers
 * is the checkpoint module's (forward, recompute, backward, the stash) and
 * the optimizer's (update); the executor moves data and waits.
 *
 * Ownership.  mb[i][j] (micro-batch i on stage j) is written only by worker
 * j.  Other workers read two of its tensors: the worker of the stage after
 * it copies the stage output (stash.out) and the one before it copies
 * `grad_in` (the gradient of the stage input); and for a skip that crosses
 * stages, the popping stage copies stash.skip_out[t] from the stashing one,
 * which copies the gradient stash.skip_din[t] back.  A reader may touch them only
 * after the producer published them (fwd_done / bwd_done set under the
 * lock), and the producer frees them only after the reader said it has
 * copied them (act_copied / grad_copied under the lock): in lockstep at
 * fixed places in its list, so that its memory peak does not depend on
 * when the reader's thread ran (await_sent); free-running as soon as it
 * sees the flag (sweep).  That lock is the only shared mutable state of a
 * step.
 *
 * Per micro-batch memory on stage j: the stash's input (category
 * ACTIVATIONS on stage 0, COPIES elsewhere) lives from its arrival to the
 * end of backward (with bf16 copies, between a checkpointed forward and its
 * recompute, in its packed form only: "copies in bfloat16"); a
 * checkpointed forward keeps nothing else (its output is
 * freed as soon as the next stage has copied it); a non-checkpointed
 * forward, or a recompute, keeps every layer output and gp_saved until
 * backward (checkpoint.h), except a stage output no backward of its
 * stage reads (gp_stash_hand_out: a linear's), freed once copied.
 */
#include "pipeline/pipeline.h"
#include "pipeline/nvtx.h"
#include "pipeline/procs.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct mb_state {
    gp_stash stash;      /* in, what forward keeps, out */
    gp_tensor grad_out;  /* dL/d out, owned */
    gp_tensor grad_in;   /* dL/d in (stages > 0), owned until copied */
    gp_tensor labels;    /* last stage: the targets, (b) class ids or the
                            output's shape (b, ...) */
    bool sent;           /* stage 0: its input uploaded this step */
    bool labels_sent;    /* last stage: its targets uploaded this step */
    bool whole;          /* its backward-data ran the whole backward, its
                            weights half next on the list (run_instr) */
    double loss_sum;     /* last stage: read from the device at the step's end */
    int64_t correct, count;
} mb_state;

typedef struct worker {
    gp_pipeline *p;
    int j;
    pthread_t thread;
    gp_event_rec *events; /* this step's, capacity = 2 x schedule count */
    int n_events;
    int cap_events;
    double busy;
    double comm_seconds;  /* this step's collectives and waits for the other replicas */
    /* What the step leaves on the device for the host to read at its end,
     * in one read: the NaN check's flag (a float, padded to 8 bytes), then
     * (on the last stage's device) one gp_loss_result per micro-batch.
     * res_dev on the device, res_host its copy; allocated by the worker. */
    void *res_dev, *res_host;
    size_t res_bytes;
    int bad_loss;         /* the first micro-batch whose loss is not finite, or -1 */
    bool flagged;         /* a parameter of its stages is not finite */
    float clip;           /* this step's clipping factor for its UPDATEs (0: none), set by
                             its CLIP, which every step with clipping runs first */
    /* Lockstep (await_sent): the copies the workers make of this device's
     * tensors, in the order it waits for them (made with the schedule);
     * sent_next, the first this step has not waited for.  Its own. */
    struct sent_copy {
        int level;          /* sent_level: clock, and what it feeds */
        gp_instr_kind kind; /* its RECV_* */
        int i, from, to;    /* micro-batch, the stage it reads, the one it writes */
        int skip;           /* RECV_SKIP(_GRAD): the skip */
    } *sent;
    int n_sent, sent_next;
} worker;

struct gp_pipeline {
    int n;                     /* devices: workers and schedule lists */
    int S;                     /* stages: n, or n x v interleaved, or 2n zb-v */
    int dev_of[GP_MAX_DEVICES]; /* stage j's device (worker): j % n, or zb-v's V
                                  (gp_schedule_device_of) */
    int L;
    gp_layer *layers;
    int first_trainable;       /* gp_layers_first_trainable of the model */
    gp_shape input;            /* (1, C, H, W) */
    int64_t targets;           /* per sample (gp_loss_targets_per_sample) */
    gp_device *devs[GP_MAX_DEVICES];   /* stage j's device (repeats when interleaved) */
    int first[GP_MAX_DEVICES], count[GP_MAX_DEVICES]; /* stage j's layers */
    gp_pipeline_opts opts;
    worker workers[GP_MAX_DEVICES];
    /* Data parallelism (gp_pipeline_join; set between steps, read-only
     * during a step): stage j's communicator over the replicas, this
     * replica's rank in them, and who to tell when this pipeline fails. */
    gp_comm *comms[GP_MAX_DEVICES];
    int rank, replicas;
    bool shard[GP_MAX_DEVICES]; /* stage j's replicas shard its update */
    bool sched_stale;          /* the schedule must be made again */
    /* zb-h1, v-half and v-min without replicas: the order is made again from
     * the stages' measured forward, backward-data and backward-weights times after
     * each of the first ZB_TUNE_STEPS steps (the accumulation order, and so
     * the result, stays the same). */
    double durations[3 * GP_MAX_DEVICES];
    int tuned;                 /* steps measured so far */
    /* Gradient clipping (opts.clip_norm > 0; made by the first step): the
     * squared norm of every trainable tensor's gradient this step, layer
     * c's from clip_at[c] on, each written by its stage's worker (zeroed
     * by the step's start); grad_norm the global norm CLIP found. */
    double *clip_sq;
    int *clip_at;              /* [L + 1] */
    /* the gradient (this replica's chunk) and length behind each clip_sq
     * entry, for one gp_dev_sumsq_multi per stage over its slice */
    const float **clip_xs;
    int64_t *clip_ns;
    double grad_norm;
    bool mutated;              /* a COMMIT, UPDATE or GATHER of this step began:
                                  the model is no longer the step's start (a
                                  failure now may leave it in between); under
                                  lock, cleared when a step begins */
    void *clip_buf[GP_MAX_DEVICES]; /* replicas: stage j's entries on its device */
    bool update_checked[GP_MAX_DEVICES]; /* stage j's last UPDATE checked the parameters it
                                            wrote (so its CHECK reads only the rest); its
                                            worker's only */
    size_t clip_buf_size[GP_MAX_DEVICES]; /* its bytes, kept: clip_buf_bytes asks the
                                             communicator, which may be gone when it is freed */
    void (*on_fail)(void *arg);
    void *fail_arg;
    /* The skips that cross stages (stashed on one, popped on a later one). */
    gp_skip_edge *edges;
    int n_edges;
    int K;                     /* the model's skips (flag rows) */
    int local;                 /* processes: the device this process runs; -1: all */
    int rank_base;             /* processes: the rank that runs device 0 */
    int n_run;                 /* workers this process runs: n, or 1 */

    /* --- guarded by lock --- */
    pthread_mutex_t lock;
    pthread_cond_t cond;       /* any flag below changed */
    uint64_t generation;       /* bumped to start a step */
    bool shutdown;
    int finished;              /* workers done with this step */
    int lists_ok;              /* workers at their BARRIER without error */
    int clip_in;               /* workers whose clip_sq entries are written */
    int results_read;          /* workers that have read their step's results */
    int drained;               /* workers done freeing this step */
    bool cancelled;
    gp_status status;          /* first error */
    char message[2048];
    bool *fwd_done, *bwd_done, *act_copied, *grad_copied; /* [i * n + j] */
    bool *skip_copied, *skipg_copied; /* [i * skips + t]: skip t of micro-batch i
                                         (its gradient) copied by its consumer */
    int *clock_done, *clock_expected;                       /* [k] */
    /* Events (backend.h), created by the worker of their device on first
     * use, kept across steps: per (i, j) EV_PER of them, [(i * S + j) *
     * EV_PER + e]: the forward's and the backward's (recorded before their
     * fwd_done / bwd_done, so a reader that saw the flag sees the event),
     * the uploads' of the input (stage 0) and targets (last stage), then
     * one per tensor copied into (i, j) (EV_COPY + slot, see
     * copy_slot), recorded by the copy; copy_pending[(i * S + j) * slots +
     * slot] says a copy's event is still to be waited for, and is worker
     * j's alone. */
    void **events;
    bool *copy_pending;
    /* Copies in bfloat16 (opts.bf16_copies; NULL without), both
     * [(i * S + j) * COPY_SLOTS + slot]: packed, what cell (i, j) sends
     * through the receiver's copy slot `slot`, packed by its producer
     * (worker j's, freed once copied); staged, what cell (i, j) received
     * through `slot`, still packed until the instruction that reads it
     * unpacks it (worker j's). */
    gp_tensor *packed, *staged;
    int clock_front;           /* clocks 0 .. clock_front - 1 all computed */

    /* --- the step's inputs: written by the caller before the generation
     * bump, read-only for workers during the step --- */
    gp_schedule sched;
    int m;
    int64_t sizes[GP_MAX_CHUNKS], offsets[GP_MAX_CHUNKS];
    int64_t batch;             /* samples of this pipeline's share (x, y) */
    int64_t sample_base;       /* x's first sample in the global mini-batch */
    int64_t batch_total;       /* samples of the global mini-batch */
    const float *x, *y;
    uint64_t seed, step;
    double lr;
    mb_state *mb;              /* [i * n + j] */
    /* Processes: the sends in flight of this process's one worker (only it
     * touches them), each with the flag that says its tensor may go. */
    struct pending_send {
        gp_procs_req req;
        bool *flag;
        bool chan;         /* a channel's send: ev is its `done`, on dev (req unused) */
        void *ev;
        gp_device *dev;
    } *pend;
    int n_pend, cap_pend;
    /* Processes: the channels of this process's flows (see "Channels"),
     * [to * COPY_SLOTS + slot] (NULL: staged over MPI, or not this
     * process's), and the host transport's arguments of CPU channels. */
    void **chans;
    struct chan_peer {
        int peer, tag;
        int from, to, what;        /* the flow: stages, k_what's index */
        /* the micro-batches of the transfers enqueued on it, in order: the
         * worker appends (chan_next), the channel's thread takes each as
         * its transfer starts, to name it if the peer stops answering; a
         * step queues at most GP_MAX_CHUNKS on a flow */
        int mb[GP_MAX_CHUNKS];
        _Atomic unsigned long long queued; /* written by the worker only */
        unsigned long long taken;          /* the channel's thread's own */
    } *chan_peers;
    int n_chans;
    double t_begin;            /* gp_now() at gp_pipeline_step_begin */
    bool device_time;          /* gp_pipeline_set_device_time; read-only in a step */
    void **mark_at[GP_MAX_DEVICES]; /* device time: where stage j's current
                                       instruction keeps its start marker */
    void **end_at[GP_MAX_DEVICES];  /* and its end marker, taken by
                                       record_done (both its worker's alone) */
    bool running;              /* between a successful begin and its end;
                                  written by the caller under lock */
    /* Tied weights (layers.h; "tied weights" below): one entry per tied
     * replica, in layer order; made at create, read-only after. */
    struct tie {
        int c, q;              /* the replica: layers[c].params[q] */
        int oc, oq;            /* its owner */
        int js, jo;            /* their stages */
        void *grad_ev;         /* replica's device: its gradient final (BARRIER) */
        void *got_ev;          /* owner's device: that gradient copied into tmp */
        void *upd_ev;          /* owner's device: the owner updated (its list's end) */
        void *back_ev;         /* replica's device: the value copied back */
        gp_tensor tmp;         /* owner's device: the replica's gradient, brought
                                  over (category GRADS; kept across steps) */
    } *ties;
    int n_ties;
    bool *tie_updated;         /* [n_ties]: its owner is updated this step;
                                  guarded by lock, cleared at the step's begin */
};

#define MB(p, i, j) (&(p)->mb[(size_t)(i) * (size_t)(p)->S + (size_t)(j)])
#define FLAG(p, arr, i, j) ((p)->arr[(size_t)(i) * (size_t)(p)->S + (size_t)(j)])
/* The stages j of device d. */
/* The stages of device d, in order (j % n == d, or zb-v's two). */
#define EACH_STAGE(p, j, d)                  \
    for (int j = 0; j < (p)->S; j++)         \
        if ((p)->dev_of[j] != (d)) {         \
        } else

/* ---- errors and waiting ------------------------------------------------ */

/* Record the first failure with its place and cancel the step everywhere.
 * GP_ERR_CANCELLED is not a failure of its own, but it may come from a
 * collective aborted by another replica before this pipeline heard of it:
 * then it cancels this pipeline too. */
static gp_status fail(gp_pipeline *p, gp_status s, int j, int i, int layer)
{
    if (s == GP_ERR_CANCELLED) {
        pthread_mutex_lock(&p->lock);
        if (!p->cancelled) {
            p->cancelled = true;
            p->status = s;
            snprintf(p->message, sizeof p->message, "cancelled: another replica failed");
        }
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        return s;
    }
    char ctx[256];
    int off = snprintf(ctx, sizeof ctx, "device %s, stage %d", p->devs[j]->name, j);
    if (i >= 0) off += snprintf(ctx + off, sizeof ctx - (size_t)off, ", micro-batch %d", i);
    if (layer >= 0) {
        char d[160];
        gp_layer_describe(&p->layers[layer], d, sizeof d);
        /* (not twice: a layer's own error starts with it already) */
        if (strncmp(gp_error_message(), d, strlen(d)))
            snprintf(ctx + off, sizeof ctx - (size_t)off, ", %s", d);
    }
    pthread_mutex_lock(&p->lock);
    bool first = !p->cancelled;
    if (first) {
        p->cancelled = true;
        p->status = s;
        snprintf(p->message, sizeof p->message, "%s: %s", ctx, gp_error_message());
    }
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    /* Outside the lock: it cancels the other replicas and aborts the
     * communicators. */
    if (first && p->on_fail) p->on_fail(p->fail_arg);
    return s;
}

/* Wait until pred(p, a, b) holds or the step is cancelled. Lock not held. */
typedef bool (*pred_fn)(gp_pipeline *p, int a, int b);

static gp_status wait_for(gp_pipeline *p, pred_fn pred, int a, int b)
{
    pthread_mutex_lock(&p->lock);
    while (!p->cancelled && !pred(p, a, b)) pthread_cond_wait(&p->cond, &p->lock);
    bool c = p->cancelled;
    pthread_mutex_unlock(&p->lock);
    return c ? gp_error_set(GP_ERR_CANCELLED, "cancelled") : GP_OK;
}

/* Lockstep: every computation of clocks 0 .. k done.  (For GPipe, clock k
 * done implies the earlier ones; for other orders, 1F1B's, it does not, and
 * a copy must not start before its source's clock.) */
static bool pred_clock(gp_pipeline *p, int k, int unused)
{
    (void)unused;
    return k < p->clock_front;
}
static bool pred_fwd(gp_pipeline *p, int i, int j) { return FLAG(p, fwd_done, i, j); }
static bool pred_bwd(gp_pipeline *p, int i, int j) { return FLAG(p, bwd_done, i, j); }
static bool pred_act_copied(gp_pipeline *p, int i, int j) { return FLAG(p, act_copied, i, j); }
static bool pred_grad_copied(gp_pipeline *p, int i, int j) { return FLAG(p, grad_copied, i, j); }
#define SKIP_FLAG(p, arr, i, t) ((p)->arr[(size_t)(i) * (size_t)(p)->K + (size_t)(t)])
static bool pred_skip_copied(gp_pipeline *p, int i, int t) { return SKIP_FLAG(p, skip_copied, i, t); }
static bool pred_skipg_copied(gp_pipeline *p, int i, int t)
{
    return SKIP_FLAG(p, skipg_copied, i, t);
}
static bool pred_lists_ok(gp_pipeline *p, int a, int b)
{
    (void)a;
    (void)b;
    return p->lists_ok >= p->n_run;
}

static bool pred_clip_in(gp_pipeline *p, int a, int b)
{
    (void)a;
    (void)b;
    return p->clip_in >= p->n_run;
}

static bool pred_tie_updated(gp_pipeline *p, int t, int b)
{
    (void)b;
    return p->tie_updated[t];
}

static bool pred_results_read(gp_pipeline *p, int a, int b)
{
    (void)a;
    (void)b;
    return p->results_read >= p->n_run;
}

/* Move clock_front past every fully computed clock.  Lock held. */
static void advance_clocks(gp_pipeline *p)
{
    while (p->clock_front < p->sched.clocks &&
           p->clock_done[p->clock_front] == p->clock_expected[p->clock_front])
        p->clock_front++;
}

static void publish(gp_pipeline *p, bool *flag, int clock)
{
    pthread_mutex_lock(&p->lock);
    if (flag) *flag = true;
    if (clock >= 0) p->clock_done[clock]++;
    advance_clocks(p);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

/* ---- events: copies ordered on the devices, not on the host ------------- */

enum { EV_FWD, EV_BWD, EV_UP_X, EV_UP_Y, EV_COPY };
#define COPY_SLOTS(p) (2 + 2 * (p)->K)
#define EV_PER(p) (EV_COPY + COPY_SLOTS(p))

/* The copy slots of a cell: its input, its output's gradient, then each
 * skip's tensor and gradient (as msg_tag's). */
static int copy_slot(int kind, int skip)
{
    switch (kind) {
    case GP_INSTR_RECV_ACT: return 0;
    case GP_INSTR_RECV_GRAD: return 1;
    case GP_INSTR_RECV_SKIP: return 2 + 2 * skip;
    default: return 3 + 2 * skip; /* GP_INSTR_RECV_SKIP_GRAD */
    }
}

/* The EV_PER events of cell (i, j), and its COPY_SLOTS pending flags. */
static void **cell_events(const gp_pipeline *p, int i, int j)
{
    return &p->events[((size_t)i * (size_t)p->S + (size_t)j) * (size_t)EV_PER(p)];
}
static bool *cell_pending(const gp_pipeline *p, int i, int j)
{
    return &p->copy_pending[((size_t)i * (size_t)p->S + (size_t)j) * (size_t)COPY_SLOTS(p)];
}

/* Event e of (i, j), created on stage j's device by its worker (the only
 * one that records it) the first time.  NULL on a synchronous device. */
static gp_status cell_event(gp_pipeline *p, int i, int j, int e, void **out)
{
    void **slot = &cell_events(p, i, j)[e];
    if (!*slot) GP_TRY(gp_dev_event_create(p->devs[j], slot));
    *out = *slot;
    return GP_OK;
}

/* ---- copies in bfloat16 ---------------------------------------------------
 *
 * With opts.bf16_copies every tensor that crosses a stage boundary (an
 * activation, its gradient, a skip and its gradient) travels as bfloat16:
 * the producer packs it (gp_dev_bf16_pack, on its compute stream, before
 * the event the copy waits for), the copy or message moves the packed
 * half-size tensor, and the receiver unpacks it into FP32 just before the
 * instruction that reads it (await_copies).  What the receiver computes
 * with is the sent tensor rounded to bfloat16, to nearest even, whatever
 * the transport (a copy between devices, a channel, an MPI message), so a
 * run gives the same bits whether its stages are threads or processes;
 * the sequential run with the same rounding at the same boundaries is the
 * oracle (tests/test_pipeline.c).  Nothing else changes precision:
 * parameters, gradients inside a stage and the update stay FP32. */

static gp_tensor *packed_of(const gp_pipeline *p, int i, int j, int slot)
{
    return &p->packed[((size_t)i * (size_t)p->S + (size_t)j) * (size_t)COPY_SLOTS(p) +
                      (size_t)slot];
}
static gp_tensor *staged_of(const gp_pipeline *p, int i, int j, int slot)
{
    return &p->staged[((size_t)i * (size_t)p->S + (size_t)j) * (size_t)COPY_SLOTS(p) +
                      (size_t)slot];
}

/* The tensor of cell (i, j) that its copy slot `slot` fills. */
static gp_tensor *slot_tensor(gp_pipeline *p, int i, int j, int slot)
{
    mb_state *s = MB(p, i, j);
    if (slot == 0) return &s->stash.in;
    if (slot == 1) return &s->grad_out;
    int t = (slot - 2) / 2;
    return slot % 2 == 0 ? &s->stash.skip_in[t] : &s->stash.skip_dout[t];
}

/* The shape of what cell (i, j) receives through `slot` (both ends know
 * it): the stage's input, its output's gradient, or a skip's tensor (and
 * gradient), of micro-batch i's size. */
static gp_shape slot_shape(const gp_pipeline *p, int i, int j, int slot)
{
    const gp_shape *one = slot == 0   ? &p->layers[p->first[j]].in_shape
                          : slot == 1 ? &p->layers[p->first[j] + p->count[j] - 1].out_shape
                                      : &p->layers[p->opts.skips->skips[(slot - 2) / 2].from]
                                             .out_shape;
    return gp_shape_with_batch(one, p->sizes[i]);
}

/* The element type of what cell (i, j) receives through `slot`: that of
 * the layer output it is (or whose gradient it is): the previous stage's
 * last layer's, the stage's own last layer's, or the stashing layer's
 * (train.activations). */
static gp_dtype slot_dtype(const gp_pipeline *p, int j, int slot)
{
    int k = slot == 0   ? p->first[j] - 1
            : slot == 1 ? p->first[j] + p->count[j] - 1
                        : p->opts.skips->skips[(slot - 2) / 2].from;
    return k >= 0 ? p->layers[k].out_dtype : GP_F32;
}

/* A tensor of n values packed: ceil(n / 2) floats' bytes, which every
 * transport moves as floats. */
static gp_shape packed_shape(int64_t n) { return (gp_shape){1, {(n + 1) / 2}}; }

/* Cell (i, j)'s tensor t, bound for the stage that receives it through
 * `slot`, packed (packed_of).  An owned t that only waited to be copied
 * goes now (`drop`): the packed tensor is what travels. */
static gp_status pack_one(gp_pipeline *p, int i, int j, int slot, gp_tensor *t, bool drop)
{
    gp_tensor *pk = packed_of(p, i, j, slot);
    int64_t n = gp_tensor_numel(t);
    gp_shape sh = packed_shape(n);
    GP_ASSERT(!gp_tensor_mem(pk) && gp_tensor_mem(t));
    GP_TRY(gp_tensor_alloc(pk, p->devs[j], &sh, GP_MEM_COPIES));
    /* an odd count leaves half a float unwritten: zeros, so the bytes that
     * travel are the same every run */
    if (n % 2) GP_TRY(gp_dev_fill(p->devs[j], gp_f32(pk) + n / 2, 0.0f, 1));
    GP_TRY(gp_dev_bf16_pack(p->devs[j], (uint16_t *)gp_tensor_mem(pk), gp_f32(t), n));
    if (drop && t->owned) gp_tensor_free(t);
    return GP_OK;
}

/* After (i, j)'s forward (fwd) or the backward that makes its input's
 * gradient: every tensor it sends to another stage, packed. */
static gp_status pack_sends(gp_pipeline *p, int i, int j, bool fwd)
{
    if (!p->opts.bf16_copies) return GP_OK;
    mb_state *s = MB(p, i, j);
    if (fwd && j + 1 < p->S) GP_TRY(pack_one(p, i, j, 0, &s->stash.out, true));
    if (!fwd && j > 0) GP_TRY(pack_one(p, i, j, 1, &s->grad_in, true));
    for (int e = 0; e < p->n_edges; e++) {
        const gp_skip_edge *k = &p->edges[e];
        if (fwd && k->from == j) /* owned only where the forward kept nothing */
            GP_TRY(pack_one(p, i, j, copy_slot(GP_INSTR_RECV_SKIP, k->id),
                            &s->stash.skip_out[k->id], true));
        if (!fwd && k->to == j)
            GP_TRY(pack_one(p, i, j, copy_slot(GP_INSTR_RECV_SKIP_GRAD, k->id),
                            &s->stash.skip_din[k->id], true));
    }
    return GP_OK;
}

/* Where (i, j)'s copy through `slot` lands: the slot's tensor itself, or
 * with bf16 copies a packed staging tensor on the device that
 * unpack_staged turns into it. */
static gp_status recv_target(gp_pipeline *p, int i, int j, int slot, gp_tensor **dst)
{
    gp_shape sh = slot_shape(p, i, j, slot);
    *dst = slot_tensor(p, i, j, slot);
    if (p->opts.bf16_copies) {
        *dst = staged_of(p, i, j, slot);
        sh = packed_shape(gp_shape_numel(&sh));
        return gp_tensor_alloc(*dst, p->devs[j], &sh, GP_MEM_COPIES);
    }
    return gp_tensor_alloc_as(*dst, p->devs[j], &sh, slot_dtype(p, j, slot), GP_MEM_COPIES);
}

/* bf16 copies: what arrived through `slot` of (i, j), unpacked into the
 * slot's tensor on the compute stream (after the copy's event).  `keep`:
 * the packed form stays as well (held_slot). */
static gp_status unpack_staged(gp_pipeline *p, int i, int j, int slot, bool keep)
{
    gp_tensor *sg = staged_of(p, i, j, slot), *dst = slot_tensor(p, i, j, slot);
    gp_shape sh = slot_shape(p, i, j, slot);
    GP_TRY(gp_tensor_alloc(dst, p->devs[j], &sh, GP_MEM_COPIES));
    GP_TRY(gp_dev_bf16_unpack(p->devs[j], gp_f32(dst), (const uint16_t *)gp_tensor_mem(sg),
                              gp_shape_numel(&sh)));
    if (!keep) gp_tensor_free(sg); /* the device keeps the block until the unpack has read it */
    return GP_OK;
}

/* Held in bfloat16 (bf16 copies): what a checkpointed forward keeps for
 * its recompute, the stage input (slot 0) and the skips that arrive (the
 * RECV_SKIP slots), waits between the forward and the recompute as it
 * arrived, packed, half the bytes of the FP32 tensor the layers read.  The
 * forward unpacks it and keeps the packed form (await_copies with hold),
 * then frees the FP32 one (drop_held); the recompute unpacks it again
 * (unhold).  Lossless: the FP32 tensor is the packed one widened, so the
 * recompute reads the bits the forward read. */
static bool held_slot(int slot) { return slot == 0 || (slot >= 2 && slot % 2 == 0); }

static void drop_held(gp_pipeline *p, int i, int j)
{
    for (int q = 0; p->staged && q < COPY_SLOTS(p); q++)
        if (held_slot(q) && gp_tensor_mem(staged_of(p, i, j, q))) gp_tensor_free(slot_tensor(p, i, j, q));
}

static gp_status unhold(gp_pipeline *p, int i, int j)
{
    for (int q = 0; p->staged && q < COPY_SLOTS(p); q++)
        if (held_slot(q) && gp_tensor_mem(staged_of(p, i, j, q))) GP_TRY(unpack_staged(p, i, j, q, false));
    return GP_OK;
}

/* Before the forward or backward of (i, j) reads its inputs: the device
 * waits for the copies into them (the host does not, on a GPU), and with
 * bf16 copies unpacks what they brought (`hold`: a checkpointed forward,
 * whose inputs stay packed as well, held_slot). */
static gp_status await_copies(gp_pipeline *p, int i, int j, bool hold)
{
    bool *pend = cell_pending(p, i, j), waited = false;
    for (int q = 0; q < COPY_SLOTS(p); q++) {
        if (!pend[q]) continue;
        void *ev;
        GP_TRY(cell_event(p, i, j, EV_COPY + q, &ev));
        GP_TRY(gp_dev_event_wait(p->devs[j], ev));
        pend[q] = false;
        waited = true;
    }
    /* device time: the instruction starts once its inputs are there (an
     * unpack is the instruction's work) */
    if (waited && p->device_time && p->mark_at[j])
        GP_TRY(gp_dev_mark(p->devs[j], false, p->mark_at[j]));
    for (int q = 0; p->staged && q < COPY_SLOTS(p); q++)
        if (gp_tensor_mem(staged_of(p, i, j, q))) GP_TRY(unpack_staged(p, i, j, q, hold && held_slot(q)));
    return GP_OK;
}

/* ---- processes (procs.h) ------------------------------------------------ */

/* Whether stage j runs in another process. */
static bool remote(const gp_pipeline *p, int j) { return p->local >= 0 && p->dev_of[j] != p->local; }

enum { MSG_ACT, MSG_GRAD, MSG_SKIP, MSG_SKIP_GRAD };

/* The tag of a message: one per (micro-batch, receiving stage, what, skip)
 * in a step, so no two messages between two processes share one. */
static int msg_tag(const gp_pipeline *p, int i, int to, int what, int skip)
{
    int slots = 2 + 2 * p->K;
    int slot = what < MSG_SKIP ? what : 2 + 2 * skip + (what - MSG_SKIP);
    return (i * p->S + to) * slots + slot;
}

/* ---- channels: device-to-device transfers between processes ----------------
 *
 * Where both ends of a flow can (backend.h, chan_open: NCCL between two
 * GPUs; CPU devices with GPIPE_CPU_STREAMS=threads and
 * GPIPE_PROCS_CHANNELS=1, the tests' stand-in), each flow between two
 * processes is a channel of its own: stage j's activations to stage j + 1,
 * the gradients back, and each crossing skip's tensor and gradient.  A
 * send is enqueued behind the producer's event and a receive ahead of the
 * consumer's wait, with no host wait and no message tags.  One channel per
 * flow, each with its own stream, is what keeps every schedule free of
 * deadlock with rendezvous sends (NCCL's): a flow's sends and receives are
 * issued in one order on both sides (forwards in micro-batch order,
 * backwards in the schedule's backward order, the same on every stage),
 * and no flow waits behind another's rendezvous, which with one stream per
 * device the interleaved schedule would (device 0 sending stage 0's output
 * while device 1 sends stage 1's back to it).  The channels are opened
 * once, every process walking the flows in one order (this order: stage
 * by stage of the receiver, slot by slot), so the two ends of each meet.
 * Flows whose ends cannot both take a channel (a CPU stage beside a GPU
 * one; two processes on one GPU, which NCCL refuses) are staged through
 * host memory over MPI as before. */

/* What a process tells the others about its device (all-gathered once). */
typedef struct {
    int32_t wants;      /* takes channels: the backend has them and the switch allows */
    int32_t kind;       /* gp_device_kind */
    char host[64];      /* gethostname */
    char dev[64];       /* the device's uid (a GPU's PCI bus id), else its name */
} chan_card;

/* Whether this process's device takes channels: GPIPE_PROCS_CHANNELS=0
 * never, =1 wherever the backend has them (the tests' CPU devices), unset
 * on GPUs. */
static bool chan_wanted(gp_device *dev)
{
    const char *e = getenv("GPIPE_PROCS_CHANNELS");
    if (!gp_dev_has_chans(dev)) return false;
    if (e && *e) return strcmp(e, "0") != 0;
    return dev->kind == GP_DEV_CUDA;
}

/* Whether a flow between the devices of two cards goes over a channel:
 * both take them, the same backend, and not one GPU (NCCL puts no two ranks
 * of a communicator on one device): one host and one PCI bus id. */
static bool chan_between(const chan_card *a, const chan_card *b)
{
    if (!a->wants || !b->wants || a->kind != b->kind) return false;
    return a->kind != GP_DEV_CUDA || strcmp(a->host, b->host) || strcmp(a->dev, b->dev);
}

/* The sending stage of the flow into stage `to` through copy slot `slot`
 * (copy_slot's numbering), or -1 if there is none. */
static int flow_from(const gp_pipeline *p, int to, int slot)
{
    if (slot == 0) return to > 0 ? to - 1 : -1;
    if (slot == 1) return to + 1 < p->S ? to + 1 : -1;
    int t = (slot - 2) / 2;
    for (int e = 0; e < p->n_edges; e++) {
        const gp_skip_edge *k = &p->edges[e];
        if (k->id != t) continue;
        if (slot % 2 == 0 && k->to == to) return k->from;   /* the skip */
        if (slot % 2 == 1 && k->from == to) return k->to;   /* its gradient */
    }
    return -1;
}

/* What a flow carries, by its slot's kind (MSG_*), in the watchdog's
 * words. */
static const char *const k_what[] = {"output", "input's gradient", "skip", "skip's gradient"};

/* The micro-batch of the transfer a CPU channel's thread starts now (the
 * one chan_next queued first and no transfer took yet); -1 if unknown. */
static int chan_take(struct chan_peer *c)
{
    unsigned long long q = atomic_load_explicit(&c->queued, memory_order_acquire);
    if (c->taken >= q) return -1;
    int i = q - c->taken <= GP_MAX_CHUNKS ? c->mb[c->taken % GP_MAX_CHUNKS] : -1;
    c->taken++;
    return i;
}

/* The host transport of CPU channels, on the channel's thread; the wait is
 * named for the watchdog as receive_remote names a message's. */
static gp_status chan_host_send(void *arg, const void *buf, size_t bytes, const _Atomic int *cancel)
{
    struct chan_peer *c = arg;
    int i = chan_take(c);
    if (i >= 0)
        gp_procs_wait_for("the receive by stage %d of stage %d's %s for micro-batch %d", c->to,
                          c->from, k_what[c->what], i);
    return gp_procs_chan_send(buf, bytes, c->peer, c->tag, cancel);
}

static gp_status chan_host_recv(void *arg, void *buf, size_t bytes, const _Atomic int *cancel)
{
    struct chan_peer *c = arg;
    int i = chan_take(c);
    if (i >= 0)
        gp_procs_wait_for("stage %d's %s for micro-batch %d of stage %d", c->from,
                          k_what[c->what], i, c->to);
    return gp_procs_chan_recv(buf, bytes, c->peer, c->tag, cancel);
}

/* abort (after a failure): without waiting for what is queued; a transfer
 * under way gives up (the CPU's host transport polls the channel's cancel
 * flag; NCCL's communicator is aborted), so each channel is done with its
 * transport argument when its close returns. */
static void close_chans(gp_pipeline *p, bool abort)
{
    if (!p->chans) return;
    gp_device *dev = p->devs[p->local];
    for (int q = 0; q < p->n_chans; q++) gp_dev_chan_close(dev, p->chans[q], abort);
    free(p->chans);
    free(p->chan_peers);
    p->chans = NULL;
    p->chan_peers = NULL;
}

/* Every process: the cards all-gathered, then this process's channels
 * opened in the one order. */
static gp_status open_chans(gp_pipeline *p)
{
    gp_device *dev = p->devs[p->local];
    int size = gp_procs_size(), slots = COPY_SLOTS(p);
    chan_card mine = {.wants = chan_wanted(dev), .kind = (int32_t)dev->kind};
    if (gethostname(mine.host, sizeof mine.host - 1) != 0) mine.host[0] = 0;
    if (!dev->iface->uid || dev->iface->uid(dev, mine.dev, sizeof mine.dev) != GP_OK) {
        gp_error_clear(); /* its name: a shared GPU is staged, not refused */
        snprintf(mine.dev, sizeof mine.dev, "%s", dev->name);
    }
    chan_card *cards = calloc((size_t)size, sizeof *cards);
    if (!cards) return gp_error_set(GP_ERR_OOM, "out of host memory");
    gp_status st = gp_procs_allgather_bytes(&mine, cards, sizeof mine);
    int n_flows = p->S * slots, opened = 0;
    if (st == GP_OK && mine.wants) {
        p->chans = calloc((size_t)n_flows, sizeof *p->chans);
        p->chan_peers = calloc((size_t)n_flows, sizeof *p->chan_peers);
        p->n_chans = n_flows;
        if (!p->chans || !p->chan_peers) st = gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    for (int q = 0; st == GP_OK && p->chans && q < n_flows; q++) {
        int to = q / slots, slot = q % slots, from = flow_from(p, to, slot);
        if (from < 0) continue;
        bool send = p->dev_of[from] == p->local, recv = p->dev_of[to] == p->local;
        if (send == recv) continue; /* in this process, or none of its business */
        int peer = p->rank_base + p->dev_of[send ? to : from];
        if (peer < 0 || peer >= size || !chan_between(&mine, &cards[peer])) continue;
        gp_chan_desc d = {.sender = send, .host_send = chan_host_send,
                          .host_recv = chan_host_recv, .arg = &p->chan_peers[q]};
        p->chan_peers[q] = (struct chan_peer){.peer = peer, .tag = q, .from = from, .to = to,
                                              .what = slot < 2 ? slot : 2 + slot % 2};
        static const char *const what[] = {"activations", "gradients"};
        if (slot < 2) snprintf(d.name, sizeof d.name, "%s of stage %d -> %d", what[slot], from, to);
        else snprintf(d.name, sizeof d.name, "skip %d%s of stage %d -> %d", (slot - 2) / 2,
                      slot % 2 ? "'s gradient" : "", from, to);
        if (dev->iface->chan_id) { /* the sender makes the id, the receiver takes it */
            struct {
                uint64_t bytes;
                unsigned char id[GP_CHAN_ID_BYTES];
            } msg = {0};
            size_t b = 0;
            if (send) st = gp_dev_chan_id(dev, msg.id, &b);
            msg.bytes = b;
            /* on the channels' communicator, under a tag past every
             * channel's own */
            if (st == GP_OK)
                st = send ? gp_procs_chan_send(&msg, sizeof msg, peer, n_flows, NULL)
                          : gp_procs_chan_recv(&msg, sizeof msg, peer, n_flows, NULL);
            if (st == GP_OK && msg.bytes > sizeof d.id)
                st = gp_error_set(GP_ERR_RUNTIME, "rank %d sent a channel id of %llu bytes",
                                  peer, (unsigned long long)msg.bytes);
            if (st == GP_OK) {
                memcpy(d.id, msg.id, sizeof d.id);
                d.id_bytes = (size_t)msg.bytes;
            }
        }
        if (st == GP_OK) st = gp_dev_chan_open(dev, &d, &p->chans[q]);
        if (st == GP_OK) GP_DEBUG("rank %d: channel %s to rank %d", gp_procs_rank(), d.name, peer);
        if (st == GP_OK) opened++;
    }
    if (st == GP_OK && opened)
        GP_INFO("rank %d (%s): %d flows to other processes over channels (%s), device to "
                "device", gp_procs_rank(), dev->name, opened,
                dev->kind == GP_DEV_CUDA ? "NCCL" : "CPU streams");
    free(cards);
    if (st != GP_OK) close_chans(p, true);
    return st;
}

/* The channel of the flow into stage `to` through `slot`, or NULL; a
 * channel's next transfer, about to be enqueued, is micro-batch i's (its
 * thread names it: chan_take). */
static void *chan_next(gp_pipeline *p, int to, int slot, int i)
{
    int q = to * COPY_SLOTS(p) + slot;
    void *ch = p->chans ? p->chans[q] : NULL;
    if (ch) {
        struct chan_peer *c = &p->chan_peers[q];
        unsigned long long n = atomic_load_explicit(&c->queued, memory_order_relaxed);
        c->mb[n % GP_MAX_CHUNKS] = i;
        atomic_store_explicit(&c->queued, n + 1, memory_order_release);
    }
    return ch;
}

static gp_status send_tensor(gp_pipeline *p, const gp_tensor *t, int to, int tag, bool *flag,
                             void *ch, void *after)
{
    if (p->n_pend == p->cap_pend) {
        int cap = p->cap_pend ? 2 * p->cap_pend : 16;
        struct pending_send *q = realloc(p->pend, (size_t)cap * sizeof *q);
        if (!q) return gp_error_set(GP_ERR_OOM, "out of host memory");
        p->pend = q;
        p->cap_pend = cap;
    }
    struct pending_send *ps = &p->pend[p->n_pend];
    *ps = (struct pending_send){.flag = flag};
    if (ch) {
        /* behind the producer's event, no host wait; t stays until the
         * send's `done` (backend.h, chan_send: a block freed earlier could
         * make a receive wait for the peer) */
        GP_TRY(gp_dev_event_create(t->dev, &ps->ev));
        ps->chan = true;
        ps->dev = t->dev;
        gp_status st = gp_dev_chan_send(t->dev, ch, (float *)gp_tensor_mem(t), gp_tensor_words(t),
                                        after, ps->ev);
        if (st != GP_OK) {
            gp_dev_event_destroy(t->dev, ps->ev);
            return st;
        }
        p->n_pend++;
        return GP_OK;
    }
    GP_TRY(gp_dev_synchronize(t->dev)); /* the data is written */
    GP_TRY(gp_procs_isend_dev(t->dev, (float *)gp_tensor_mem(t), gp_tensor_words(t),
                              p->rank_base + p->dev_of[to], tag,
                              &ps->req));
    ps->flag = flag;
    p->n_pend++;
    return GP_OK;
}

/* After stage j's forward (fwd) or its backward that makes the input's
 * gradient, of micro-batch i: send what the other processes' stages
 * receive from it.  Each tensor stays until its send completes
 * (progress_sends sets the flag sweep frees it by). */
static gp_status post_sends(gp_pipeline *p, int i, int j, bool fwd)
{
    if (p->local < 0) return GP_OK;
    mb_state *s = MB(p, i, j);
    /* the event record_done recorded just before (channels wait for it) */
    void *after = cell_events(p, i, j)[fwd ? EV_FWD : EV_BWD];
    /* what travels through `slot`: t, or with bf16 copies its packed form */
#define OUTGOING(slot, t) (p->opts.bf16_copies ? packed_of(p, i, j, (slot)) : (t))
    if (fwd && j + 1 < p->S && remote(p, j + 1))
        GP_TRY(send_tensor(p, OUTGOING(0, &s->stash.out), j + 1,
                           msg_tag(p, i, j + 1, MSG_ACT, 0), &FLAG(p, act_copied, i, j + 1),
                           chan_next(p, j + 1, 0, i), after));
    if (!fwd && j > 0 && remote(p, j - 1))
        GP_TRY(send_tensor(p, OUTGOING(1, &s->grad_in), j - 1,
                           msg_tag(p, i, j - 1, MSG_GRAD, 0), &FLAG(p, grad_copied, i, j - 1),
                           chan_next(p, j - 1, 1, i), after));
    for (int e = 0; e < p->n_edges; e++) {
        const gp_skip_edge *k = &p->edges[e];
        int ks = copy_slot(GP_INSTR_RECV_SKIP, k->id), kg = copy_slot(GP_INSTR_RECV_SKIP_GRAD, k->id);
        if (fwd && k->from == j && remote(p, k->to))
            GP_TRY(send_tensor(p, OUTGOING(ks, &s->stash.skip_out[k->id]), k->to,
                               msg_tag(p, i, k->to, MSG_SKIP, k->id),
                               &SKIP_FLAG(p, skip_copied, i, k->id), chan_next(p, k->to, ks, i),
                               after));
        if (!fwd && k->to == j && remote(p, k->from))
            GP_TRY(send_tensor(p, OUTGOING(kg, &s->stash.skip_din[k->id]), k->from,
                               msg_tag(p, i, k->from, MSG_SKIP_GRAD, k->id),
                               &SKIP_FLAG(p, skipg_copied, i, k->id), chan_next(p, k->from, kg, i),
                               after));
    }
#undef OUTGOING
    return GP_OK;
}

/* The sends that completed set their flags (their tensors may go); with
 * `wait`, all of them. */
static gp_status progress_sends(gp_pipeline *p, bool wait)
{
    int keep = 0;
    gp_status st = GP_OK;
    for (int q = 0; q < p->n_pend; q++) {
        struct pending_send *ps = &p->pend[q];
        bool done = false;
        if (st == GP_OK && ps->chan) {
            if (wait) {
                st = gp_dev_event_sync(ps->dev, ps->ev);
                done = st == GP_OK;
            } else {
                st = gp_dev_event_query(ps->dev, ps->ev, &done);
            }
            if (done) {
                gp_dev_event_destroy(ps->dev, ps->ev);
                ps->ev = NULL;
            }
        } else if (st == GP_OK) {
            if (wait) {
                st = gp_procs_wait(&ps->req);
                done = st == GP_OK;
            } else {
                st = gp_procs_test(&ps->req, &done);
            }
        }
        if (done) publish(p, ps->flag, -1);
        else p->pend[keep++] = *ps;
    }
    p->n_pend = keep;
    return st;
}

/* A copy instruction whose source stage is in another process: the
 * message, into a new tensor of the shape both sides know (the receiving
 * stage's input, its output's gradient, or the stashing layer's output).
 * ev->t1 marks the message's arrival: the wait before it, the copy
 * after. */
static gp_status receive_remote(gp_pipeline *p, const gp_instr *in, gp_event_rec *ev, int what)
{
    int i = in->i, j = in->j;
    int slot = copy_slot(in->kind, in->skip);
    void *ch = chan_next(p, j, slot, i);
    gp_tensor *dst;
    if (ch) { /* enqueued; the reader waits for `done` (await_copies) */
        void *done = NULL;
        GP_TRY(cell_event(p, i, j, EV_COPY + slot, &done));
        GP_TRY(recv_target(p, i, j, slot, &dst));
        ev->t1 = gp_now();
        ev->bytes = gp_tensor_bytes(dst);
        GP_TRY(gp_dev_chan_recv(p->devs[j], ch, (float *)gp_tensor_mem(dst), gp_tensor_words(dst),
                                done));
        cell_pending(p, i, j)[slot] = done != NULL;
        return GP_OK;
    }
    int from = p->rank_base + p->dev_of[in->from], tag = msg_tag(p, i, j, what, in->skip);
    gp_procs_wait_for("stage %d's %s for micro-batch %d of stage %d", in->from, k_what[what], i,
                      j);
    gp_status st = gp_procs_probe(from, tag);
    ev->t1 = gp_now();
    if (st == GP_OK) st = recv_target(p, i, j, slot, &dst);
    if (st != GP_OK) return st;
    ev->bytes = gp_tensor_bytes(dst);
    return gp_procs_recv_dev(p->devs[j], (float *)gp_tensor_mem(dst), gp_tensor_words(dst), from,
                             tag);
}

/* ---- the work of one instruction --------------------------------------- */

/* The context every forward, recompute and backward of (i, j) runs with:
 * the same each time, which is what makes a recompute replay dropout. */
static gp_fwd_ctx mb_ctx(const gp_pipeline *p, int i, int j)
{
    return (gp_fwd_ctx){.training = true, .seed = p->seed, .step = p->step,
                        .sample_offset = p->sample_base + p->offsets[i],
                        .batch_total = p->batch_total, .step_micro = p->m,
                        .comm = p->comms[j], .rank = p->rank};
}

/* ---- uploads and the step's results: no host wait inside a step ---------- */

enum { RES_LOSS = 8 }; /* where the loss results start in a worker's res_dev */

static size_t res_bytes_for(int m) { return RES_LOSS + (size_t)m * sizeof(gp_loss_result); }

/* Micro-batch i's loss results on the last stage's device. */
static gp_loss_result *loss_slot(gp_pipeline *p, int i)
{
    return (gp_loss_result *)((char *)p->workers[p->dev_of[p->S - 1]].res_dev + RES_LOSS) + i;
}

/* Stage 0's input of micro-batch i (what = EV_UP_X) or the last stage's
 * targets (EV_UP_Y), once a step: enqueued on the device's copy stream
 * behind nothing (the batch is host memory the caller keeps until the
 * step's end), its event recorded behind it.  The forward or the loss that
 * reads it waits for that event; the host waits for nothing. */
static gp_status upload(gp_pipeline *p, int i, int what)
{
    int j = what == EV_UP_X ? 0 : p->S - 1;
    mb_state *s = MB(p, i, j);
    bool *sent = what == EV_UP_X ? &s->sent : &s->labels_sent;
    if (*sent) return GP_OK;
    gp_device *dev = p->devs[j];
    int64_t b = p->sizes[i];
    gp_tensor *t;
    gp_shape sh;
    const float *src;
    if (what == EV_UP_X) {
        t = &s->stash.in;
        sh = gp_shape_with_batch(&p->input, b);
        src = p->x + p->offsets[i] * gp_shape_numel(&p->input);
    } else {
        t = &s->labels;
        sh = gp_loss_targets_shape(p->opts.loss, &p->layers[p->L - 1].out_shape, b);
        GP_ASSERT(gp_shape_numel(&sh) == b * p->targets);
        src = p->y + p->offsets[i] * p->targets;
    }
    void *ev;
    GP_TRY(cell_event(p, i, j, what, &ev));
    GP_TRY(gp_tensor_alloc(t, dev, &sh, GP_MEM_ACTIVATIONS));
    GP_TRY(gp_dev_upload_async(dev, gp_f32(t), src, gp_shape_numel(&sh), ev));
    *sent = true;
    return GP_OK;
}

/* Micro-batch i's upload `what` enqueued (if it was not yet) and the next
 * one's too, so that its copy overlaps this micro-batch's compute (every
 * schedule runs a stage's forwards in micro-batch order); then the device
 * waits for i's. */
static gp_status await_upload(gp_pipeline *p, int i, int what)
{
    int j = what == EV_UP_X ? 0 : p->S - 1;
    GP_TRY(upload(p, i, what));
    if (i + 1 < p->m) GP_TRY(upload(p, i + 1, what));
    void *ev;
    GP_TRY(cell_event(p, i, j, what, &ev));
    GP_TRY(gp_dev_event_wait(p->devs[j], ev));
    /* device time: a forward of stage 0 starts once its input is there */
    if (what == EV_UP_X && p->device_time && p->mark_at[j])
        GP_TRY(gp_dev_mark(p->devs[j], false, p->mark_at[j]));
    return GP_OK;
}

static gp_status do_forward(gp_pipeline *p, int i, int j, bool ckpt, int *bad_layer)
{
    mb_state *s = MB(p, i, j);
    gp_device *dev = p->devs[j];
    int64_t b = p->sizes[i];
    bool last = j == p->S - 1;
    if (last) {
        /* The targets, checked on the host before anything of micro-batch
         * i is computed (the device's loss would only flag them at the
         * step's end), and on their way to the device during the forward. */
        gp_shape os = gp_shape_with_batch(&p->layers[p->L - 1].out_shape, b);
        bool ids = os.ndim == 2 || os.ndim == 3; /* else the loss says */
        if (p->opts.loss != GP_LOSS_CROSS_ENTROPY || ids)
            GP_TRY(gp_loss_check_targets(p->opts.loss, p->opts.classes,
                                         p->y + p->offsets[i] * p->targets, &os,
                                         p->sample_base + p->offsets[i])); /* the caller's row */
        GP_TRY(upload(p, i, EV_UP_Y));
    }
    if (j == 0) GP_TRY(await_upload(p, i, EV_UP_X));
    gp_fwd_ctx ctx = mb_ctx(p, i, j);
    gp_status st = gp_ckpt_forward(p->layers + p->first[j], &ctx,
                                  ckpt ? GP_FWD_INPUT : GP_FWD_KEEP, &s->stash, bad_layer);
    if (st != GP_OK) {
        *bad_layer += p->first[j];
        return st;
    }
    /* an output only the next stage reads goes once copied (sweep), or
     * packed (pack_sends), not at this stage's backward */
    if (!ckpt && !last) gp_stash_hand_out(&s->stash, p->layers + p->first[j]);
    if (last) {
        /* The loss: dlogits become this stage's incoming gradient; its
         * results stay on the device until the step's end (read_results). */
        GP_TRY(await_upload(p, i, EV_UP_Y));
        /* 1 / the global batch's targets: the replicas' gradients then sum
         * to the gradient of the global mean loss. */
        /* the gradient over the logits where the model's last layer does
         * not read its output in its backward and did not write it in
         * place (its own memory, which no earlier layer's backward reads) */
        int lc = p->L - 1 - p->first[j];
        bool over = gp_layer_spec_ignores_y(&p->layers[p->L - 1].spec) &&
                    !s->stash.inplace[lc] && gp_layers_logits_over_on();
        st = gp_ckpt_loss_dev(dev, p->opts.loss, p->opts.label_smoothing, p->opts.classes,
                              &s->stash.out, &s->labels,
                              (float)(1.0 / ((double)p->batch_total * (double)p->targets)),
                              &s->grad_out, over, loss_slot(p, i));
        gp_tensor_free(&s->labels);
        GP_TRY(st);
        if (ckpt) gp_tensor_free(&s->stash.out); /* logits are not needed again */
    }
    return GP_OK;
}

static gp_status do_backward(gp_pipeline *p, int i, int j, int *bad_layer)
{
    mb_state *s = MB(p, i, j);
    gp_fwd_ctx ctx = mb_ctx(p, i, j);
    /* Stage 0 passes no gradient on, so the layers before the model's
     * first trainable one skip their backward. */
    gp_status st = gp_ckpt_backward(p->layers + p->first[j], &ctx, &s->stash, &s->grad_out,
                                    p->first_trainable, j > 0 ? &s->grad_in : NULL, bad_layer);
    if (st != GP_OK) *bad_layer += p->first[j];
    return st;
}

/* What copy `kind` (skip t) of micro-batch i reads on stage j, and its
 * packed form (copies in bf16), freed: the copy is made.  A stage output a
 * kept forward still holds (not owned) stays for its backward; a skip's
 * view (of a kept forward) is only forgotten. */
static void free_sent(gp_pipeline *p, gp_instr_kind kind, int i, int j, int t)
{
    mb_state *s = MB(p, i, j);
    gp_tensor *x = kind == GP_INSTR_RECV_ACT    ? &s->stash.out
                   : kind == GP_INSTR_RECV_GRAD ? &s->grad_in
                   : kind == GP_INSTR_RECV_SKIP ? &s->stash.skip_out[t]
                                                : &s->stash.skip_din[t];
    bool skip = kind == GP_INSTR_RECV_SKIP || kind == GP_INSTR_RECV_SKIP_GRAD;
    if (skip ? gp_tensor_mem(x) != NULL : x->owned) gp_tensor_free(x);
    gp_tensor *pk = p->packed ? packed_of(p, i, j, copy_slot(kind, t)) : NULL;
    if (pk && gp_tensor_mem(pk)) gp_tensor_free(pk); /* (its source may be a view) */
}

/* Free outputs / input gradients that the neighbours have copied, on the
 * stages of device d (free-running: whenever they are; lockstep frees them
 * at fixed places instead, await_sent). */
static void sweep(gp_pipeline *p, int d)
{
    int m = p->m, S = p->S;
    EACH_STAGE(p, j, d)
        for (int i = 0; i < m; i++) {
            pthread_mutex_lock(&p->lock);
            bool out = j + 1 < S && FLAG(p, act_copied, i, j + 1);
            bool gin = j > 0 && FLAG(p, grad_copied, i, j - 1);
            pthread_mutex_unlock(&p->lock);
            if (out) free_sent(p, GP_INSTR_RECV_ACT, i, j, 0);
            if (gin) free_sent(p, GP_INSTR_RECV_GRAD, i, j, 0);
            for (int e = 0; e < p->n_edges; e++) {
                const gp_skip_edge *k = &p->edges[e];
                if (k->from != j && k->to != j) continue;
                pthread_mutex_lock(&p->lock);
                bool done = k->from == j ? SKIP_FLAG(p, skip_copied, i, k->id)
                                         : SKIP_FLAG(p, skipg_copied, i, k->id);
                pthread_mutex_unlock(&p->lock);
                if (done)
                    free_sent(p, k->from == j ? GP_INSTR_RECV_SKIP : GP_INSTR_RECV_SKIP_GRAD, i,
                              j, k->id);
            }
        }
}

/* Which copies of clock k come first (see await_sent): those that feed a
 * forward (an activation, a skip) before those that feed a backward. */
static int sent_level(gp_instr_kind kind, int k)
{
    return 2 * k + (kind == GP_INSTR_RECV_GRAD || kind == GP_INSTR_RECV_SKIP_GRAD);
}

/* Lockstep: what other stages copy from a device is freed at fixed places
 * in the device's list, not whenever the readers' threads got to copy it,
 * so that the device's peak is the schedule's whatever the timing.  Before
 * an instruction of clock k its worker waits until every copy of its
 * tensors of a clock before k has been made, and before a copy of clock k
 * that feeds a backward, also those of clock k that feed a forward; then
 * it frees what they read (nothing else does in lockstep: run_step's sweep
 * is free-running's).  Each such copy may start already (the clock before
 * it is done, this device's part too, lists being in clock order), so the
 * wait is for the reader's thread only.  Until 2026-12-01 these tensors
 * went at the first sweep after their copy: with the reader's thread late,
 * 1F1B's stage 0 took its backward's gradient (clock k) and ran that
 * backward beside the next micro-batch's output, copied at clock k too,
 * one tensor over the plan (sim.c frees an output after its stage's next
 * computation, here the recompute before that backward), and GPipe's
 * stage 0 ran its forwards beside every output not copied yet.  No cycle:
 * a wait is for copies of a lower level (sent_level) than its own
 * instruction's (2k; 2k + 1 for a copy that feeds a backward), and making
 * a copy takes the computations of the clocks before its own and the
 * instructions ahead of it in its reader's list: of lower clocks, a
 * recompute, or copies of the same clock and kind (a device's copies of
 * one clock feed its one computation of that clock; sent_tables checks). */
static gp_status await_sent(worker *w, const gp_instr *in)
{
    gp_pipeline *p = w->p;
    bool bwd_copy = in->kind == GP_INSTR_RECV_GRAD || in->kind == GP_INSTR_RECV_SKIP_GRAD;
    int upto = 2 * in->k - (bwd_copy ? 0 : 1); /* the highest level waited for */
    for (; w->sent_next < w->n_sent && w->sent[w->sent_next].level <= upto; w->sent_next++) {
        const struct sent_copy *e = &w->sent[w->sent_next];
        bool skip = e->kind == GP_INSTR_RECV_SKIP || e->kind == GP_INSTR_RECV_SKIP_GRAD;
        pred_fn done = e->kind == GP_INSTR_RECV_ACT    ? pred_act_copied
                       : e->kind == GP_INSTR_RECV_GRAD ? pred_grad_copied
                       : e->kind == GP_INSTR_RECV_SKIP ? pred_skip_copied
                                                       : pred_skipg_copied;
        GP_TRY(wait_for(p, done, e->i, skip ? e->skip : e->to));
        free_sent(p, e->kind, e->i, e->from, e->skip);
    }
    return GP_OK;
}

static int sent_order(const void *a, const void *b)
{
    const struct sent_copy *x = a, *y = b;
    return (x->level > y->level) - (x->level < y->level);
}

/* Each worker's `sent` for the schedule just made: every copy instruction
 * of any list whose source stage is on the worker's device. */
static gp_status sent_tables(gp_pipeline *p)
{
    for (int d = 0; d < p->n; d++) {
        worker *w = &p->workers[d];
        w->n_sent = 0;
        if (!p->opts.lockstep) continue;
        for (int e = 0; e < p->n; e++)
            for (int c = 0; c < p->sched.count[e]; c++) {
                const gp_instr *in = &p->sched.list[e][c];
                /* (await_sent's argument that no wait is circular rests on
                 * these: lists in clock order, and the copies of one clock
                 * all feed forwards or all backwards) */
                const gp_instr *pr = c > 0 ? &p->sched.list[e][c - 1] : NULL;
                GP_ASSERT(!pr || in->k >= pr->k);
                GP_ASSERT(!pr || pr->k != in->k || !gp_instr_copies(pr->kind) ||
                          !gp_instr_copies(in->kind) ||
                          sent_level(pr->kind, pr->k) == sent_level(in->kind, in->k));
                if (!gp_instr_copies(in->kind) || p->dev_of[in->from] != d) continue;
                if (w->n_sent % 64 == 0) {
                    void *g = realloc(w->sent, (size_t)(w->n_sent + 64) * sizeof *w->sent);
                    if (!g) return gp_error_set(GP_ERR_OOM, "out of host memory");
                    w->sent = g;
                }
                w->sent[w->n_sent++] = (struct sent_copy){.level = sent_level(in->kind, in->k),
                                                          .kind = in->kind,
                                                          .i = in->i, .from = in->from,
                                                          .to = in->j, .skip = in->skip};
            }
        if (w->n_sent > 1) /* (a device nobody copies from: sent NULL, UBSan's no) */
            qsort(w->sent, (size_t)w->n_sent, sizeof *w->sent, sent_order);
    }
    return GP_OK;
}

/* Free everything device d's worker allocated for the step. */
static void drain(gp_pipeline *p, int d)
{
    EACH_STAGE(p, j, d)
        for (int i = 0; i < p->m; i++) {
            mb_state *s = MB(p, i, j);
            gp_stash_release(&s->stash);
            gp_tensor_free(&s->grad_out);
            gp_tensor_free(&s->grad_in);
            gp_tensor_free(&s->labels);
            for (int q = 0; p->packed && q < COPY_SLOTS(p); q++) {
                gp_tensor_free(packed_of(p, i, j, q));
                gp_tensor_free(staged_of(p, i, j, q));
            }
        }
}

/* Every layer's gradients of stage j final: the layers that got no
 * backward this step (frozen ones on stage 0) hold zeros, not last step's. */
static gp_status grads_final(gp_pipeline *p, int j, int *bad_layer)
{
    for (int c = p->first[j]; c < p->first[j] + p->count[j]; c++) {
        gp_status st = gp_layer_grads_finish(&p->layers[c]);
        if (st != GP_OK) {
            *bad_layer = c;
            return st;
        }
    }
    return GP_OK;
}

/* REDUCE_GRADS: stage j's parameter gradients summed over the replicas
 * (each replica's loss is already scaled by 1 / global batch, so the sum is
 * the gradient of the global mean): in full, or only this replica's chunk
 * of each when sharded.  Every replica's stage j does the same collectives
 * in the same order. */
typedef enum { COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_ALL_GATHER } coll_op;

/* One collective over stage j's communicator for each trainable parameter
 * of the stage, in layer order: the gradients summed (all-reduce, or
 * reduce-scatter when sharded), or the values gathered after a sharded
 * update. */
static gp_status stage_collective(gp_pipeline *p, int j, coll_op op)
{
    for (int c = p->first[j]; c < p->first[j] + p->count[j]; c++) {
        gp_layer *l = &p->layers[c];
        for (int q = 0; q < l->n_params; q++) {
            gp_param *pr = &l->params[q];
            if (pr->is_buffer || !gp_tensor_mem(&pr->grad)) continue;
            gp_device *dev = p->devs[j];
            gp_comm *comm = p->comms[j];
            int64_t n = gp_tensor_numel(&pr->value);
            GP_TRY(op == COLL_ALLREDUCE        ? gp_dev_allreduce(dev, comm, gp_f32(&pr->grad), n)
                   : op == COLL_REDUCE_SCATTER ? gp_dev_reduce_scatter(dev, comm, gp_f32(&pr->grad), n)
                                               : gp_dev_all_gather(dev, comm, gp_f32(&pr->value), n));
        }
    }
    return GP_OK;
}

static gp_status reduce_grads(gp_pipeline *p, int j, bool shard, int *bad_layer)
{
    GP_TRY(grads_final(p, j, bad_layer));
    return stage_collective(p, j, shard ? COLL_REDUCE_SCATTER : COLL_ALLREDUCE);
}

/* ---- tied weights ----------------------------------------------------------
 *
 * A tied replica (gp_param.tied) lives on its layer's stage, the owner on
 * its own; both have a gradient.  Each step:
 *
 *   BARRIER, replica's device: its gradient final (after the replicas'
 *            all-reduce, REDUCE_GRADS): grad_ev recorded, or, under
 *            mpirun with the owner on another rank, the gradient sent.
 *   BARRIER, owner's device, once every worker (and replica) is through:
 *            owner.grad += replica.grad for each tie in layer order, the
 *            replica's gradient brought over behind grad_ev into tmp
 *            (copy stream, got_ev), or received; the same operation on the
 *            same values wherever the two stages are, so every placement
 *            sums the same bits as the one-device step (gp_layers_tie_grads).
 *   CLIP, UPDATE see the owner only (the replica is not trained).
 *   the list's end, owner's device: upd_ev recorded, tie_updated set (or
 *            the value sent); replica's device: the owner's value copied
 *            into the replica behind upd_ev (back_ev, which the replica's
 *            stream waits for before anything of the next step reads it).
 *
 * No event of a tie is waited on by the host: the replica's next step
 * writes its gradient only after back_ev, which comes after the owner's
 * update, which came after the copy of that gradient (got_ev), so nothing
 * is overwritten before it is read.  Sharded updates are off with ties
 * (gp_pipeline_join): a fused stage's gradient is not summed before its
 * update, so the replica's could not be added. */

/* The message tags of tie t (gradient, value), past the step's messages'
 * (msg_tag; prepare checks the MPI's limit for both). */
static int tie_tag(const gp_pipeline *p, int t, int value)
{
    return p->m * p->S * (2 + 2 * p->K) + 2 * t + value;
}

static gp_status tie_event(gp_device *dev, void **ev)
{
    return *ev ? GP_OK : gp_dev_event_create(dev, ev);
}

/* Under mpirun: tensor t's floats sent to the rank of stage `to` (waited
 * for), or received from the rank of stage `from`. */
static gp_status tie_send(gp_pipeline *p, const gp_tensor *t, int to, int tag)
{
    gp_procs_req req;
    GP_TRY(gp_dev_synchronize(t->dev)); /* the data is written */
    GP_TRY(gp_procs_isend_dev(t->dev, (float *)gp_tensor_mem(t), gp_tensor_numel(t),
                              p->rank_base + p->dev_of[to], tag, &req));
    return gp_procs_wait(&req);
}

static gp_status tie_recv(gp_pipeline *p, gp_tensor *t, int from, int tag)
{
    return gp_procs_recv_dev(t->dev, gp_f32(t), gp_tensor_numel(t), p->rank_base + p->dev_of[from],
                             tag);
}

/* BARRIER, before this worker says its list is through: the replicas of
 * device d's stages have their final gradients. */
static gp_status tie_grads_ready(gp_pipeline *p, int d)
{
    for (int t = 0; t < p->n_ties; t++) {
        struct tie *e = &p->ties[t];
        if (p->dev_of[e->js] != d || p->dev_of[e->jo] == d) continue; /* (same device: in order) */
        gp_param *r = &p->layers[e->c].params[e->q];
        if (remote(p, e->jo)) {
            GP_TRY(tie_send(p, &r->grad, e->jo, tie_tag(p, t, 0)));
            continue;
        }
        GP_TRY(tie_event(p->devs[e->js], &e->grad_ev));
        if (e->grad_ev) GP_TRY(gp_dev_event_record(p->devs[e->js], e->grad_ev));
    }
    return GP_OK;
}

/* BARRIER, every worker through: device d's owners' gradients += their
 * replicas', in layer order. */
static gp_status tie_grads_sum(gp_pipeline *p, int d)
{
    for (int t = 0; t < p->n_ties; t++) {
        struct tie *e = &p->ties[t];
        if (p->dev_of[e->jo] != d) continue;
        gp_device *dev = p->devs[e->jo];
        gp_param *o = &p->layers[e->oc].params[e->oq], *r = &p->layers[e->c].params[e->q];
        int64_t n = gp_tensor_numel(&o->value);
        const float *g = NULL;
        if (p->dev_of[e->js] == d) {
            g = gp_f32(&r->grad); /* the same device and stream */
        } else {
            if (!gp_tensor_mem(&e->tmp)) {
                gp_shape sh = gp_tensor_shape(&o->value);
                GP_TRY(gp_tensor_alloc(&e->tmp, dev, &sh, GP_MEM_GRADS));
            }
            if (remote(p, e->js)) {
                GP_TRY(tie_recv(p, &e->tmp, e->js, tie_tag(p, t, 0)));
            } else {
                GP_TRY(tie_event(dev, &e->got_ev));
                GP_TRY(gp_dev_copy_async(dev, gp_tensor_mem(&e->tmp), r->grad.dev,
                                         gp_tensor_mem(&r->grad), gp_tensor_bytes(&e->tmp),
                                         e->grad_ev, e->got_ev));
                if (e->got_ev) GP_TRY(gp_dev_event_wait(dev, e->got_ev));
            }
            g = gp_f32(&e->tmp);
        }
        GP_TRY(gp_dev_add(dev, gp_f32(&o->grad), g, gp_f32(&o->grad), n));
    }
    return GP_OK;
}

/* The end of device d's list: its owners' values handed on (updated, or
 * as they were without an update), and its replicas set from them. */
static gp_status tie_values(gp_pipeline *p, int d)
{
    for (int t = 0; t < p->n_ties; t++) { /* owners first: no worker waits on itself */
        struct tie *e = &p->ties[t];
        if (p->dev_of[e->jo] != d) continue;
        gp_param *o = &p->layers[e->oc].params[e->oq];
        if (remote(p, e->js)) {
            GP_TRY(tie_send(p, &o->value, e->js, tie_tag(p, t, 1)));
            continue;
        }
        GP_TRY(tie_event(p->devs[e->jo], &e->upd_ev));
        if (e->upd_ev) GP_TRY(gp_dev_event_record(p->devs[e->jo], e->upd_ev));
        publish(p, &p->tie_updated[t], -1);
    }
    for (int t = 0; t < p->n_ties; t++) {
        struct tie *e = &p->ties[t];
        if (p->dev_of[e->js] != d) continue;
        gp_device *dev = p->devs[e->js];
        gp_param *o = &p->layers[e->oc].params[e->oq], *r = &p->layers[e->c].params[e->q];
        if (remote(p, e->jo)) {
            GP_TRY(tie_recv(p, &r->value, e->jo, tie_tag(p, t, 1)));
            continue;
        }
        /* (the same device: published above; its copy stream still waits
         * for the update on its compute stream) */
        GP_TRY(wait_for(p, pred_tie_updated, t, 0));
        GP_TRY(tie_event(dev, &e->back_ev));
        GP_TRY(gp_dev_copy_async(dev, gp_tensor_mem(&r->value), o->value.dev,
                                 gp_tensor_mem(&o->value), gp_tensor_bytes(&r->value), e->upd_ev,
                                 e->back_ev));
        if (e->back_ev) GP_TRY(gp_dev_event_wait(dev, e->back_ev));
    }
    return GP_OK;
}

/* The ties among the pipeline's layers (layers' tie_layer set by
 * gp_layers_tie), in layer order. */
static gp_status tie_table(gp_pipeline *p)
{
    int n = 0;
    for (int c = 0; c < p->L; c++)
        for (int q = 0; q < p->layers[c].n_params; q++) n += p->layers[c].params[q].tied;
    if (n == 0) return GP_OK;
    p->ties = calloc((size_t)n, sizeof *p->ties);
    p->tie_updated = calloc((size_t)n, sizeof *p->tie_updated);
    if (!p->ties || !p->tie_updated) return gp_error_set(GP_ERR_OOM, "out of host memory");
    for (int c = 0; c < p->L; c++)
        for (int q = 0; q < p->layers[c].n_params; q++) {
            const gp_param *r = &p->layers[c].params[q];
            if (!r->tied) continue;
            struct tie *e = &p->ties[p->n_ties++];
            e->c = c;
            e->q = q;
            e->oc = r->tie_layer;
            e->oq = r->tie_param;
            for (int j = 0; j < p->S; j++) {
                if (c >= p->first[j] && c < p->first[j] + p->count[j]) e->js = j;
                if (e->oc >= p->first[j] && e->oc < p->first[j] + p->count[j]) e->jo = j;
            }
        }
    return GP_OK;
}

static void tie_free(gp_pipeline *p)
{
    for (int t = 0; t < p->n_ties; t++) {
        struct tie *e = &p->ties[t];
        gp_device *ds = p->devs[e->js], *dw = p->devs[e->jo];
        if (e->grad_ev) gp_dev_event_destroy(ds, e->grad_ev);
        if (e->back_ev) gp_dev_event_destroy(ds, e->back_ev);
        if (e->got_ev) gp_dev_event_destroy(dw, e->got_ev);
        if (e->upd_ev) gp_dev_event_destroy(dw, e->upd_ev);
        gp_tensor_free(&e->tmp);
    }
    free(p->ties);
    free(p->tie_updated);
}

/* BARRIER: the step's data flow is over on stage j (outgoing tensors
 * copied, everything freed), every stage of this pipeline got through its
 * list, and, over the replicas, every replica's stage j did too.  Worker j
 * of each replica arrives at the replicas' barrier only after its own
 * replica's, so once all have, nothing of any replica can fail before the
 * update.  A failure elsewhere aborts the communicator and the barrier
 * returns GP_ERR_CANCELLED. */
static gp_status barrier(worker *w, const gp_instr *in, int *bad_layer)
{
    gp_pipeline *p = w->p;
    int d = w->j, j = in->j; /* j: the device's first stage (= d) */
    if (p->local >= 0) GP_TRY(progress_sends(p, true)); /* the other processes have it all */
    EACH_STAGE(p, q, d) {
        GP_TRY(grads_final(p, q, bad_layer));
        for (int i = 0; i < p->m; i++) { /* outgoing data must be copied before it is freed */
            if (q > 0) GP_TRY(wait_for(p, pred_grad_copied, i, q - 1));
            if (q + 1 < p->S) GP_TRY(wait_for(p, pred_act_copied, i, q + 1));
            for (int e = 0; e < p->n_edges; e++) {
                if (p->edges[e].from == q)
                    GP_TRY(wait_for(p, pred_skip_copied, i, p->edges[e].id));
                if (p->edges[e].to == q)
                    GP_TRY(wait_for(p, pred_skipg_copied, i, p->edges[e].id));
            }
        }
    }
    drain(p, d);
    GP_TRY(tie_grads_ready(p, d));
    pthread_mutex_lock(&p->lock);
    p->lists_ok++;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    GP_TRY(wait_for(p, pred_lists_ok, 0, 0));
    if (in->replicas) {
        double t0 = gp_now();
        gp_status st = gp_dev_barrier(p->devs[j], p->comms[j]);
        w->comm_seconds += gp_now() - t0;
        GP_TRY(st);
    }
    return tie_grads_sum(p, d); /* every backward of every replica is through */
}

/* Whether stage q's replicas exchange their clip entries in one
 * all-gather (the backend or the comm has one) rather than R broadcasts. */
static bool clip_gathers(const gp_pipeline *p, int q)
{
    const gp_comm *c = p->comms[q];
    return (c && c->ops && c->ops->all_gather) || gp_dev_can_shard(p->devs[q]);
}

/* The bytes of stage q's clip buffer: its entries' doubles, for every
 * replica where they are all-gathered. */
static size_t clip_buf_bytes(const gp_pipeline *p, int q)
{
    size_t k = (size_t)(p->clip_at[p->first[q] + p->count[q]] - p->clip_at[p->first[q]]);
    return k * sizeof(double) * (clip_gathers(p, q) ? (size_t)p->replicas : 1);
}

/* Stage q's clip_sq entries summed over the replicas of this process, in
 * replica order and in double, as gp_procs_sum_doubles sums the ranks'
 * under mpirun (the other ranks' zeros add exactly), so threads and
 * processes clip by the same factor.  The entries travel as bytes (a
 * copy, exact) through a buffer kept for the next steps: one all-gather
 * of every replica's, read back at once (three host waits whatever R),
 * or, on a backend without one, a broadcast from each replica in turn
 * (2R + 1). */
static gp_status clip_replicas(gp_pipeline *p, int q)
{
    int t0 = p->clip_at[p->first[q]], t1 = p->clip_at[p->first[q] + p->count[q]], k = t1 - t0;
    if (k <= 0) return GP_OK; /* the same on every replica: none takes part */
    gp_device *dev = p->devs[q];
    int R = p->replicas;
    bool gather = clip_gathers(p, q);
    size_t bytes = (size_t)k * sizeof(double);
    if (!p->clip_buf[q]) {
        p->clip_buf_size[q] = clip_buf_bytes(p, q);
        GP_TRY(gp_dev_alloc(dev, p->clip_buf_size[q], GP_MEM_WORKSPACE, &p->clip_buf[q]));
    }
    float *buf = p->clip_buf[q];
    int64_t nf = (int64_t)(bytes / sizeof(float)); /* the doubles' bytes, as floats */
    /* own, then what arrives: every replica's (gather) or one at a time */
    double *own = malloc((gather ? (size_t)R + 1 : 2) * bytes), *got = own ? own + k : NULL;
    if (!own) return gp_error_set(GP_ERR_OOM, "out of host memory");
    memcpy(own, p->clip_sq + t0, bytes);
    gp_status st = GP_OK;
    if (gather) {
        /* chunk r of the R nf floats (gp_comm_chunk) is replica r's */
        st = gp_dev_upload(dev, buf + (int64_t)p->rank * nf, (const float *)own, nf);
        if (st == GP_OK) st = gp_dev_all_gather(dev, p->comms[q], buf, (int64_t)R * nf);
        if (st == GP_OK) st = gp_dev_download(dev, (float *)got, buf, (int64_t)R * nf);
        if (st == GP_OK) st = gp_dev_synchronize(dev);
        for (int r = 0; r < R && st == GP_OK; r++)
            for (int t = 0; t < k; t++)
                p->clip_sq[t0 + t] =
                    r == 0 ? got[t] : p->clip_sq[t0 + t] + got[(size_t)r * (size_t)k + (size_t)t];
    } else {
        for (int r = 0; r < R && st == GP_OK; r++) {
            if (r == p->rank) st = gp_dev_upload(dev, buf, (const float *)own, nf);
            if (st == GP_OK) st = gp_dev_broadcast(dev, p->comms[q], buf, nf, r);
            if (st == GP_OK) st = gp_dev_download(dev, (float *)got, buf, nf);
            if (st == GP_OK) st = gp_dev_synchronize(dev);
            for (int t = 0; t < k && st == GP_OK; t++)
                p->clip_sq[t0 + t] = r == 0 ? got[t] : p->clip_sq[t0 + t] + got[t];
        }
    }
    free(own);
    return st;
}

/* CLIP (after the barrier: every gradient final and summed over the
 * replicas): the global L2 norm of every trainable gradient of the model,
 * and where it exceeds opts.clip_norm, device d's gradients scaled by
 * clip_norm / (norm + 1e-6), as PyTorch's clip_grad_norm_: the factor is
 * kept in w->clip and applied by the UPDATE in its own pass (a step with
 * clipping never has a fused update, schedule.c), not by a scale per
 * tensor here.  The norm is
 * the sum, in layer order and in double, of each tensor's squared norm
 * (sumsq), as gp_clip_grad_norm sums it on one device, so a pipeline clips by
 * the same factor bit for bit.  A sharded stage's replicas each hold the
 * sum in their own chunk: each counts its chunk; an unsharded stage's are
 * counted by replica 0 alone.  Over the replicas the entries are summed
 * in double in replica order (clip_replicas; processes: every rank's,
 * gp_procs_sum_doubles), the same either way. */
static gp_status clip(worker *w, int *bad_layer)
{
    gp_pipeline *p = w->p;
    int d = w->j;
    EACH_STAGE(p, q, d) {
        bool shard = p->replicas > 1 && p->shard[q];
        bool counts = shard || p->rank == 0; /* unsharded: replica 0 counts it (rank 0 alone) */
        /* the stage's slice of clip_sq in one call (one host wait per
         * stage, not per tensor); a tensor without a gradient, or an empty
         * chunk, sums nothing: 0 */
        int t0 = p->clip_at[p->first[q]], t1 = p->clip_at[p->first[q] + p->count[q]];
        for (int c = p->first[q]; c < p->first[q] + p->count[q] && counts; c++) {
            gp_layer *l = &p->layers[c];
            for (int a = 0, t = p->clip_at[c]; a < l->n_params; a++) {
                gp_param *pr = &l->params[a];
                if (!gp_param_trained(pr)) continue; /* (clip_at counts these) */
                int64_t lo = 0, hi = gp_tensor_numel(&pr->value);
                if (shard) gp_comm_chunk(hi, p->replicas, p->rank, &lo, &hi);
                bool some = gp_tensor_mem(&pr->grad) && hi > lo;
                p->clip_xs[t] = some ? gp_f32(&pr->grad) + lo : NULL;
                p->clip_ns[t++] = some ? hi - lo : 0;
            }
        }
        if (counts) {
            gp_status sst = gp_dev_sumsq_multi(p->devs[q], p->clip_xs + t0, p->clip_ns + t0,
                                               t1 - t0, p->clip_sq + t0);
            if (sst != GP_OK) {
                *bad_layer = p->first[q];
                return sst;
            }
        }
        if (p->replicas > 1 && p->local < 0) GP_TRY(clip_replicas(p, q));
    }
    int total = p->clip_at[p->L];
    if (p->local >= 0) { /* every rank's entries (zero where another's) */
        GP_TRY(gp_procs_sum_doubles(p->clip_sq, total));
    } else {
        pthread_mutex_lock(&p->lock);
        p->clip_in++;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        GP_TRY(wait_for(p, pred_clip_in, 0, 0));
    }
    double sum = 0;
    for (int t = 0; t < total; t++) sum += p->clip_sq[t];
    double norm = sqrt(sum), coef = (double)p->opts.clip_norm / (norm + 1e-6);
    if (d == (p->local >= 0 ? p->local : 0)) p->grad_norm = norm;
    /* Not finite: every worker sees the same table and fails here, before
     * any commit or update, naming the same tensor; the step's failure
     * then leaves the model as it was (a free check: CLIP has waited
     * anyway). */
    if (!isfinite(norm)) return gp_clip_nonfinite(p->layers, p->L, p->clip_sq, norm, bad_layer);
    w->clip = 0.0f;
    if (!(coef < 1.0)) return GP_OK; /* within the limit */
    if (p->opts.optim) { /* the UPDATEs that follow apply it */
        w->clip = (float)coef;
        return GP_OK;
    }
    EACH_STAGE(p, q, d) { /* no optimizer: the gradients are the step's result */
        bool shard = p->replicas > 1 && p->shard[q];
        for (int c = p->first[q]; c < p->first[q] + p->count[q]; c++)
            for (int a = 0; a < p->layers[c].n_params; a++) {
                gp_param *pr = &p->layers[c].params[a];
                if (!gp_param_trained(pr) || !gp_tensor_mem(&pr->grad)) continue;
                int64_t lo = 0, hi = gp_tensor_numel(&pr->value);
                if (shard) gp_comm_chunk(hi, p->replicas, p->rank, &lo, &hi);
                if (hi <= lo) continue;
                gp_status st = gp_dev_scale(p->devs[q], gp_f32(&pr->grad) + lo, (float)coef, hi - lo);
                if (st != GP_OK) {
                    *bad_layer = c;
                    return st;
                }
            }
    }
    return GP_OK;
}

/* A copy instruction: wait for its source (lockstep: every computation of
 * the previous clock; otherwise `ready` of the source (i, from), its
 * forward or its backward), copy src (the other worker's, published) into
 * dst on this device, and say so in *copied.  ev->t1 marks the end of the
 * wait. */
static gp_status receive(gp_pipeline *p, const gp_instr *in, gp_event_rec *ev, pred_fn ready,
                         const gp_tensor *src, bool *copied)
{
    gp_status st = p->opts.lockstep ? wait_for(p, pred_clock, in->k - 1, 0)
                                    : wait_for(p, ready, in->i, in->from);
    if (st == GP_OK && p->opts.late_ms > 0 && p->dev_of[in->j] == p->opts.late_device)
        nanosleep(&(struct timespec){p->opts.late_ms / 1000, (p->opts.late_ms % 1000) * 1000000L},
                  NULL);
    ev->t1 = gp_now();
    if (st != GP_OK) return st;
    /* Enqueued on this device's copy stream behind the producer's event;
     * the forward or backward that reads dst waits for `done`
     * (await_copies).  Published as copied once enqueued: the producer's
     * free of src is held back by its device until the copy has read it. */
    gp_device *dev = p->devs[in->j];
    int slot = copy_slot(in->kind, in->skip);
    bool bwd = in->kind == GP_INSTR_RECV_GRAD || in->kind == GP_INSTR_RECV_SKIP_GRAD;
    /* the producer made its event before it published `ready` */
    void *after = cell_events(p, in->i, in->from)[bwd ? EV_BWD : EV_FWD], *done = NULL;
    if (p->opts.bf16_copies) src = packed_of(p, in->i, in->from, slot); /* what travels */
    gp_tensor *dst;
    st = cell_event(p, in->i, in->j, EV_COPY + slot, &done);
    if (st == GP_OK) st = recv_target(p, in->i, in->j, slot, &dst);
    if (st != GP_OK) return st;
    if (gp_tensor_bytes(dst) != gp_tensor_bytes(src))
        return gp_error_set(GP_ERR_RUNTIME, "a copy into stage %d of %zu bytes from a tensor of "
                            "%zu (a layer's shape and its output disagree)", in->j,
                            gp_tensor_bytes(dst), gp_tensor_bytes(src));
    ev->bytes = gp_tensor_bytes(src);
    if (p->device_time) GP_TRY(gp_dev_mark(dev, true, &ev->m0)); /* the copy stream got here */
    /* Device time: the copy's end marker goes on the copy stream ahead of
     * `done`, which a zero-byte upload_async then records there (backend.h),
     * so the reader that waits for `done` starts after the marker.  Marked
     * after `done` (run_step's marker), the reader could start before the
     * copy stream reached the marker: test_pipeline_streams' device_time
     * saw a consumer start before its copy ended in about 1 run in 5. */
    st = gp_dev_copy_async(dev, gp_tensor_mem(dst), src->dev, gp_tensor_mem(src), gp_tensor_bytes(src),
                           after, p->device_time ? NULL : done);
    if (st == GP_OK && p->device_time) {
        st = gp_dev_mark(dev, true, &ev->m1);
        if (st == GP_OK && done) st = gp_dev_upload_async(dev, NULL, NULL, 0, done);
    }
    if (st != GP_OK) return st;
    cell_pending(p, in->i, in->j)[slot] = done != NULL;
    publish(p, copied, -1);
    return GP_OK;
}

/* After the forward (EV_FWD) or a backward (EV_BWD) of (i, j) is issued:
 * its event, recorded before the flag that lets readers copy. */
static gp_status record_done(gp_pipeline *p, int i, int j, int e)
{
    void *ev;
    GP_TRY(cell_event(p, i, j, e, &ev));
    /* device time: the producer ends here, before any reader may copy */
    if (p->device_time && p->end_at[j]) {
        GP_TRY(gp_dev_mark(p->devs[j], false, p->end_at[j]));
        p->end_at[j] = NULL;
    }
    return ev ? gp_dev_event_record(p->devs[j], ev) : GP_OK;
}

static gp_status run_instr(worker *w, const gp_instr *in, const gp_instr *next,
                           gp_event_rec *ev, int *bad_layer)
{
    gp_pipeline *p = w->p;
    int i = in->i, j = in->j, first = p->first[j], count = p->count[j];
    gp_status st = GP_OK;
    if (in->kind == GP_INSTR_COMMIT || in->kind == GP_INSTR_UPDATE ||
        in->kind == GP_INSTR_GATHER) { /* (before its fault: a fault there counts as begun) */
        pthread_mutex_lock(&p->lock);
        p->mutated = true;
        pthread_mutex_unlock(&p->lock);
        gp_gate_wait(p->opts.state_gate); /* a snapshot's copy of the state */
    }
    if (p->opts.fault_j == j && p->opts.fault_i == i && p->opts.fault_kind == in->kind) {
        if (p->opts.fault_delay_ms > 0)
            nanosleep(&(struct timespec){p->opts.fault_delay_ms / 1000,
                                         (p->opts.fault_delay_ms % 1000) * 1000000L},
                      NULL);
        *bad_layer = i >= 0 ? first : -1; /* the end of the step: the stage */
        return gp_error_set(GP_ERR_RUNTIME, "injected fault in %s", gp_instr_kind_name(in->kind));
    }
    double t0 = gp_now();
    switch (in->kind) {
    case GP_INSTR_RECV_ACT:
        if (remote(p, in->from)) return receive_remote(p, in, ev, MSG_ACT);
        return receive(p, in, ev, pred_fwd, &MB(p, i, in->from)->stash.out,
                       &FLAG(p, act_copied, i, j));
    case GP_INSTR_RECV_GRAD:
        if (remote(p, in->from)) return receive_remote(p, in, ev, MSG_GRAD);
        return receive(p, in, ev, pred_bwd, &MB(p, i, in->from)->grad_in,
                       &FLAG(p, grad_copied, i, j));
    case GP_INSTR_RECV_SKIP:
        if (remote(p, in->from)) return receive_remote(p, in, ev, MSG_SKIP);
        return receive(p, in, ev, pred_fwd, &MB(p, i, in->from)->stash.skip_out[in->skip],
                       &SKIP_FLAG(p, skip_copied, i, in->skip));
    case GP_INSTR_RECV_SKIP_GRAD:
        if (remote(p, in->from)) return receive_remote(p, in, ev, MSG_SKIP_GRAD);
        return receive(p, in, ev, pred_bwd, &MB(p, i, in->from)->stash.skip_din[in->skip],
                       &SKIP_FLAG(p, skipg_copied, i, in->skip));
    case GP_INSTR_FORWARD:
        st = await_copies(p, i, j, in->checkpointed);
        if (st == GP_OK) st = do_forward(p, i, j, in->checkpointed, bad_layer);
        if (st == GP_OK && in->checkpointed) drop_held(p, i, j);
        if (st == GP_OK) st = pack_sends(p, i, j, true);
        if (st == GP_OK) st = record_done(p, i, j, EV_FWD);
        if (st == GP_OK) publish(p, &FLAG(p, fwd_done, i, j), in->k);
        if (st == GP_OK) st = post_sends(p, i, j, true);
        return st;
    case GP_INSTR_RECOMPUTE: {
        gp_fwd_ctx ctx = mb_ctx(p, i, j);
        st = unhold(p, i, j); /* the inputs held in bf16, widened again */
        if (st != GP_OK) {
            *bad_layer = first;
            return st;
        }
        st = gp_ckpt_recompute(p->layers + first, &ctx, &MB(p, i, j)->stash, bad_layer);
        if (st != GP_OK) *bad_layer += first;
        return st;
    }
    case GP_INSTR_BACKWARD:
        st = await_copies(p, i, j, false);
        if (st == GP_OK) st = do_backward(p, i, j, bad_layer);
        if (st == GP_OK) st = pack_sends(p, i, j, false);
        if (st == GP_OK) st = record_done(p, i, j, EV_BWD);
        if (st == GP_OK) publish(p, &FLAG(p, bwd_done, i, j), in->k);
        if (st == GP_OK) st = post_sends(p, i, j, false);
        return st;
    case GP_INSTR_BACKWARD_DATA: {
        gp_fwd_ctx ctx = mb_ctx(p, i, j);
        mb_state *s = MB(p, i, j);
        st = await_copies(p, i, j, false);
        if (st != GP_OK) return st;
        if (gp_instr_whole_backward(in, next)) { /* (schedule.h) */
            st = do_backward(p, i, j, bad_layer);
            s->whole = ev->whole = st == GP_OK;
        } else {
            st = gp_ckpt_backward_data(p->layers + first, &ctx, &s->stash, &s->grad_out,
                                       p->first_trainable, j > 0 ? &s->grad_in : NULL,
                                       bad_layer);
            if (st != GP_OK) *bad_layer += first;
        }
        if (st == GP_OK) st = pack_sends(p, i, j, false);
        if (st == GP_OK) st = record_done(p, i, j, EV_BWD);
        if (st == GP_OK) publish(p, &FLAG(p, bwd_done, i, j), in->k);
        if (st == GP_OK) st = post_sends(p, i, j, false);
        return st;
    }
    case GP_INSTR_BACKWARD_WEIGHTS: {
        gp_fwd_ctx ctx = mb_ctx(p, i, j);
        if (MB(p, i, j)->whole) { /* done by its backward-data */
            MB(p, i, j)->whole = false;
            publish(p, NULL, in->k);
            return GP_OK;
        }
        st = gp_ckpt_backward_weights(p->layers + first, &ctx, &MB(p, i, j)->stash,
                                      p->first_trainable, j > 0, bad_layer);
        if (st != GP_OK) *bad_layer += first;
        else publish(p, NULL, in->k);
        return st;
    }
    case GP_INSTR_REDUCE_GRADS:
        st = reduce_grads(p, j, in->shard, bad_layer);
        break;
    case GP_INSTR_REDUCE_STATS:
        /* the pending batch-norm statistics merged over the replicas */
        for (int c = first; c < first + count && st == GP_OK; c++)
            if (p->layers[c].ops->allreduce_stats) {
                st = p->layers[c].ops->allreduce_stats(&p->layers[c], p->comms[j]);
                if (st != GP_OK) *bad_layer = c;
            }
        break;
    case GP_INSTR_BARRIER:
        return barrier(w, in, bad_layer);
    case GP_INSTR_CLIP:
        st = clip(w, bad_layer);
        break; /* counted as communication, as a collective */
    case GP_INSTR_COMMIT: { /* the stage's norms in one launch (gp_layers_commit) */
        int bad = -1;
        st = gp_layers_commit(p->layers + first, count, p->devs[j], &bad);
        if (st != GP_OK && bad >= 0) *bad_layer = first + bad;
        return st;
    }
    case GP_INSTR_UPDATE: {
        p->update_checked[j] = false; /* (set below where this update checks) */
        if (!p->opts.optim) return GP_OK;
        if (in->fused) {
            st = gp_optim_update_fused(p->opts.optim, first, count, p->lr, (int64_t)p->step,
                                       p->comms[j]);
            break; /* a collective: counted as communication */
        }
        /* the step's check of what it writes in the same pass (a chunk's
         * update would check only its chunk: CHECK reads those all) */
        bool check = !p->opts.no_check && !in->shard;
        p->update_checked[j] = check;
        return gp_optim_update(p->opts.optim, first, count, p->lr, (int64_t)p->step,
                               in->shard ? p->rank : 0, in->shard ? p->replicas : 1,
                               p->devs[j], check ? (float *)w->res_dev : NULL,
                               p->opts.clip_norm > 0 ? w->clip : 0.0f);
    }
    case GP_INSTR_GATHER:
        /* after a sharded update: every replica's parameters of stage j
         * from their owners' chunks */
        st = stage_collective(p, j, COLL_ALL_GATHER);
        break;
    case GP_INSTR_CHECK:
        /* into the flag the step's end reads (read_results) */
        return gp_layers_flag_nonfinite(p->layers + first, count, p->devs[j],
                                        (float *)w->res_dev, p->update_checked[j]);
    default:
        GP_ASSERT(!"unknown instruction");
    }
    w->comm_seconds += gp_now() - t0; /* the collectives */
    return st;
}


/* The worker's result buffer, large enough for this step, and its NaN
 * flag cleared (enqueued). */
static gp_status results_begin(worker *w)
{
    gp_pipeline *p = w->p;
    gp_device *dev = p->devs[w->j];
    size_t need = res_bytes_for(p->m);
    if (w->res_bytes < need) {
        gp_dev_free(dev, w->res_dev, w->res_bytes, GP_MEM_WORKSPACE);
        free(w->res_host);
        w->res_dev = w->res_host = NULL;
        w->res_bytes = 0;
        w->res_host = malloc(need);
        if (!w->res_host) return gp_error_set(GP_ERR_OOM, "out of host memory");
        GP_TRY(gp_dev_alloc(dev, need, GP_MEM_WORKSPACE, &w->res_dev));
        w->res_bytes = need;
    }
    return gp_dev_fill(dev, (float *)w->res_dev, 0.0f, 1);
}

/* The step's end on device j: its one host wait.  The results the step
 * left on the device (the NaN flag; the losses, on the last stage's device)
 * come back in one read, which also waits for everything queued; a device
 * with nothing to read is synchronized (the uploads read the caller's
 * batch until then).  Then the errors they hold, once every worker has
 * read its own, reported by one worker so the message does not depend on
 * which got there first: the cause before its consequences, i.e. a loss
 * that is not finite (micro-batch i's forward, before the update), else
 * the first device whose parameters are not (its stages' CHECK). */
static gp_status read_results(worker *w)
{
    gp_pipeline *p = w->p;
    int j = w->j;
    gp_device *dev = p->devs[j];
    bool losses = p->dev_of[p->S - 1] == j, check = !p->opts.no_check;
    w->bad_loss = -1;
    w->flagged = false;
    gp_status st;
    if (!losses && !check) st = gp_dev_synchronize(dev);
    else st = gp_dev_download(dev, w->res_host, w->res_dev,
                              (int64_t)((losses ? res_bytes_for(p->m) : RES_LOSS) / sizeof(float)));
    if (st != GP_OK) return fail(p, st, j, -1, -1);
    const gp_loss_result *r = (const gp_loss_result *)((char *)w->res_host + RES_LOSS);
    for (int i = 0; losses && i < p->m; i++) {
        mb_state *s = MB(p, i, p->S - 1);
        /* r[i].bad: the host checked the targets, so never; but a device
         * that disagrees must not pass for a good step */
        if ((r[i].bad >= 0 || !isfinite(r[i].loss_sum)) && w->bad_loss < 0) w->bad_loss = i;
        s->loss_sum = r[i].loss_sum;
        s->correct = r[i].correct;
        s->count = p->sizes[i] * p->targets;
    }
    w->flagged = check && *(const float *)w->res_host != 0.0f;
    bool first_flag = w->flagged, loss_elsewhere = false;
    if (p->local < 0) { /* in one process: the workers compare */
        pthread_mutex_lock(&p->lock);
        p->results_read++;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        st = wait_for(p, pred_results_read, 0, 0);
        if (st != GP_OK) return fail(p, st, j, -1, -1);
        for (int d = 0; d < p->n; d++) {
            loss_elsewhere = loss_elsewhere || (d != j && p->workers[d].bad_loss >= 0);
            first_flag = first_flag && !(d < j && p->workers[d].flagged);
        }
    }
    if (w->bad_loss >= 0) {
        int i = w->bad_loss;
        if (r[i].bad >= 0)
            st = gp_error_set(GP_ERR_RUNTIME, "the device found target %lld bad, which the "
                              "host's check of the same targets passed", (long long)r[i].bad);
        else
            st = gp_ckpt_loss_finite(r[i].loss_sum);
        return fail(p, st, p->S - 1, i, -1);
    }
    if (loss_elsewhere || !first_flag) return GP_OK; /* another worker reports the step's error */
    EACH_STAGE(p, q, j) {
        st = gp_layers_name_nonfinite(p->layers + p->first[q], p->count[q], "after the step");
        if (st != GP_OK) return fail(p, st, q, -1, -1); /* the message names the layer */
    }
    return fail(p, gp_error_set(GP_ERR_NUMERIC, "a parameter is NaN or Inf after the step, but "
                                "no tensor read one by one is: the device's check and the "
                                "host's disagree"), j, -1, -1);
}

static gp_status run_step(worker *w)
{
    gp_pipeline *p = w->p;
    int j = w->j; /* the device */
    gp_status rs = results_begin(w);
    if (rs != GP_OK) return fail(p, rs, j, -1, -1);
    /* No zeroing pass for the layers whose first backward overwrites their
     * gradients; the others' (norms, the embedding, ...) zeroed together,
     * one launch a stage instead of a fill a tensor. */
    EACH_STAGE(p, q, j) {
        for (int c = p->first[q]; c < p->first[q] + p->count[q]; c++)
            gp_layer_grads_begin(&p->layers[c]);
        rs = gp_layers_zero_stale(p->layers + p->first[q], p->count[q]);
        if (rs != GP_OK) return fail(p, rs, q, -1, p->first[q]); /* (stage q, of device j) */
    }
    const gp_instr *list = p->sched.list[j];
    if (p->device_time) gp_dev_mark_reset(p->devs[j]); /* the last step's are read */
    w->n_events = 0;
    w->busy = 0;
    w->comm_seconds = 0;
    w->sent_next = 0;
    /* The forwards and backwards of the micro-batches read the weights and
     * never write them, and nothing reads the weight gradients until the
     * step's end: the backend may keep its converted weights and hold the
     * gradients it sums across them (gp_dev_freeze_weights).  The step's
     * end (reductions, the update, the gather) thaws first, and so does
     * every way out. */
    gp_device *dev = p->devs[j];
    gp_dev_freeze_weights(dev, true);
    for (int c = 0; c < p->sched.count[j]; c++) {
        const gp_instr *in = &list[c];
        if (!gp_instr_per_micro_batch(in->kind) && dev->weights_frozen) {
            /* the gradients the backend held are added in here */
            gp_status ts = gp_dev_freeze_weights(dev, false);
            if (ts != GP_OK) return fail(p, ts, j, -1, -1);
        }
        pthread_mutex_lock(&p->lock);
        bool cancelled = p->cancelled;
        pthread_mutex_unlock(&p->lock);
        /* (a wait of its own: before the instruction's record) */
        if (!cancelled && gp_instr_per_micro_batch(in->kind) && w->n_sent > 0)
            cancelled = await_sent(w, in) != GP_OK;
        if (cancelled) {
            gp_dev_freeze_weights(dev, false);
            return gp_error_set(GP_ERR_CANCELLED, "cancelled");
        }
        gp_event_rec *ev = &w->events[w->n_events++];
        *ev = (gp_event_rec){.kind = in->kind, .i = in->i, .j = in->j, .k = in->k,
                             .from = in->from, .skip = in->skip, .shard = in->shard, .fused = in->fused,
                             .layer_first = p->first[in->j], .layer_count = p->count[in->j]};
        ev->t0 = gp_now();
        ev->t1 = ev->t0;
        bool copies = gp_instr_copies(in->kind);
        if (p->device_time && !copies) { /* (a copy marks its start in receive) */
            gp_status ms = gp_dev_mark(dev, false, &ev->m0);
            if (ms != GP_OK) {
                gp_dev_freeze_weights(dev, false);
                return fail(p, ms, in->j, in->i, -1);
            }
            p->mark_at[in->j] = &ev->m0;
            p->end_at[in->j] = &ev->m1;
        }
        int bad_layer = -1;
        if (GP_NVTX_ENABLED) { /* Nsight Systems: the trace's slice name */
            char name[64];
            gp_instr_name(in, name, sizeof name);
            gp_nvtx_push(name);
        }
        gp_status st = run_instr(w, in, c + 1 < p->sched.count[j] ? &list[c + 1] : NULL, ev,
                                 &bad_layer);
        gp_nvtx_pop();
        p->mark_at[in->j] = p->end_at[in->j] = NULL;
        if (st == GP_OK && p->device_time && !ev->m1) st = gp_dev_mark(dev, copies, &ev->m1);
        /* For copies t1 marked the end of the wait; keep it as a separate
         * point: busy time counts from there. */
        double tw = ev->t1;
        ev->t1 = gp_now();
        ev->mem_after = gp_allocator_current(&p->devs[j]->alloc);
        if (gp_instr_per_micro_batch(in->kind))
            w->busy += ev->t1 - (gp_instr_copies(in->kind) ? tw : ev->t0);
        if (gp_instr_copies(in->kind) && w->n_events < w->cap_events) {
            /* Split the record: the wait, then the copy. */
            gp_event_rec *cp = &w->events[w->n_events++];
            *cp = *ev;
            cp->t0 = tw;
            ev->t1 = tw;
            ev->bytes = 0;
            ev->is_wait = true;
        }
        if (st != GP_OK) {
            gp_dev_freeze_weights(dev, false);
            /* CLIP's error names a layer of any device (its message says
             * which): report it with that layer's stage, so every worker's
             * report reads the same */
            int fj = in->j, fl = bad_layer;
            /* CLIP runs for every stage of the device: the failing layer's
             * (any error, not only a norm that is not finite) */
            if (in->kind == GP_INSTR_CLIP && bad_layer >= 0) {
                for (int q = 0; q < p->S; q++)
                    if (bad_layer >= p->first[q] && bad_layer < p->first[q] + p->count[q]) fj = q;
                if (st == GP_ERR_NUMERIC) fl = -1;
            }
            return fail(p, st, fj, in->i, fl);
        }
        if (gp_instr_per_micro_batch(in->kind)) {
            if (p->n_pend > 0) {
                st = progress_sends(p, false);
                if (st != GP_OK) {
                    gp_dev_freeze_weights(dev, false);
                    return fail(p, st, in->j, in->i, -1);
                }
            }
            if (!p->opts.lockstep) sweep(p, j);
        }
    }
    gp_status st = gp_dev_freeze_weights(dev, false);
    if (st == GP_OK && p->n_ties) st = tie_values(p, j); /* tied weights: after the update */
    if (st != GP_OK) return fail(p, st, j, -1, -1);
    return read_results(w);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    gp_pipeline *p = w->p;
    gp_device_bind_thread(p->devs[w->j]);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (!p->shutdown && p->generation == seen) pthread_cond_wait(&p->cond, &p->lock);
        if (p->shutdown) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        seen = p->generation;
        pthread_mutex_unlock(&p->lock);

        gp_status st = run_step(w);
        pthread_mutex_lock(&p->lock);
        p->finished++;
        pthread_cond_broadcast(&p->cond);
        if (st != GP_OK) {
            /* Nobody may be reading our buffers when we free them: wait
             * until every worker has stopped. */
            while (p->finished < p->n_run) pthread_cond_wait(&p->cond, &p->lock);
            pthread_mutex_unlock(&p->lock);
            /* channels first (processes: this is the process's one
             * worker): a transfer waiting for a peer must not hold the
             * buffers freed below (NCCL: aborted; CPU: what is queued is
             * dropped), and the run ends across processes anyway */
            if (p->chans) close_chans(p, true);
            /* the step ended early: uploads may still read the caller's
             * batch (a failed device reports its failure again here) */
            (void)gp_dev_synchronize(p->devs[w->j]);
            drain(p, w->j);
            /* its batch-norm statistics too: the model stays as it was */
            EACH_STAGE(p, j, w->j)
                gp_layers_discard(p->layers + p->first[j], p->count[j]);
            pthread_mutex_lock(&p->lock);
        }
        p->drained++;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
    }
}

/* ---- public ------------------------------------------------------------- */

gp_status gp_pipeline_create(gp_layer *layers, int n_layers, const gp_shape *input, int S,
                             gp_device *const *devs, const int *balance,
                             const gp_pipeline_opts *opts, gp_pipeline **out)
{
    *out = NULL;
    if (S < 1 || S > GP_MAX_DEVICES)
        return gp_error_set(GP_ERR_INVALID, "a pipeline needs 1..%d stages, got %d",
                            GP_MAX_DEVICES, S);
    int v = gp_schedule_stages_per_device(opts->schedule, opts->virtual_stages);
    if (v < 1 || S % v)
        return gp_error_set(GP_ERR_INVALID, "%d stages cannot be %d per device; give "
                            "pipeline.balance one entry per stage, devices x %s",
                            S, v, gp_schedule_v_shape(opts->schedule) ? "2 (in a V)"
                                                                       : "pipeline.virtual");
    int n = S / v;
    for (int j = n; j < S; j++) {
        int d = gp_schedule_device_of(opts->schedule, n, j);
        if (devs[j] != devs[d])
            return gp_error_set(GP_ERR_INVALID, "stage %d must be on device %s (%s), not %s", j,
                                devs[d]->name, gp_schedule_v_shape(opts->schedule)
                                    ? "in a V: stage j >= n on device 2n - 1 - j"
                                    : "interleaved: stage j on device j mod n",
                                devs[j]->name);
    }
    int64_t sum = 0; /* no wrap, whatever the entries */
    for (int j = 0; j < S; j++) {
        if (balance[j] < 1)
            return gp_error_set(GP_ERR_INVALID,
                                "pipeline.balance[%d] = %d: every stage needs at least one layer",
                                j, balance[j]);
        sum += balance[j];
    }
    if (sum != n_layers)
        return gp_error_set(GP_ERR_INVALID,
                            "pipeline.balance sums to %lld layers but the model has %d; make the "
                            "entries add up to %d (or use balance: auto)", (long long)sum,
                            n_layers, n_layers);
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (devs[a] == devs[b])
                return gp_error_set(GP_ERR_INVALID, "one handle of device %s is given for "
                                    "stages %d and %d; open the device once per stage "
                                    "(each gp_device_open is its own worker, streams and memory "
                                    "accounting, so several stages can share one GPU)",
                                    devs[a]->name, a, b);
    gp_pipeline *p = calloc(1, sizeof *p);
    if (!p) return gp_error_set(GP_ERR_OOM, "out of host memory");
    p->n = n;
    p->S = S;
    for (int j = 0; j < S; j++) p->dev_of[j] = gp_schedule_device_of(opts->schedule, n, j);
    p->L = n_layers;
    p->layers = layers;
    p->first_trainable = gp_layers_first_trainable(layers, n_layers);
    p->input = *input;
    p->targets = gp_loss_targets_per_sample(opts->loss, &layers[n_layers - 1].out_shape);
    p->opts = *opts;
    p->replicas = 1;
    if (opts->processes && (opts->local_device < 0 || opts->local_device >= n)) {
        free(p);
        return gp_error_set(GP_ERR_INVALID, "process %d of a run on %d devices: start as many "
                            "processes as pipeline.devices lists (mpirun -np %d)",
                            opts->local_device, n, n);
    }
    p->local = opts->processes ? opts->local_device : -1;
    p->rank_base = opts->processes ? opts->rank_base : 0;
    /* no shared clock across processes: free-running (a stage's clock would
     * wait for counts only other processes can publish) */
    if (p->local >= 0) p->opts.lockstep = false;
    p->n_run = p->local >= 0 ? 1 : n;
    int f = 0;
    for (int j = 0; j < S; j++) {
        p->devs[j] = devs[j];
        p->first[j] = f;
        p->count[j] = balance[j];
        f += balance[j];
    }
    gp_status ts = tie_table(p); /* tied weights */
    if (ts != GP_OK) {
        tie_free(p);
        free(p);
        return ts;
    }
    const gp_skip_map *sk = opts->skips;
    if (sk && sk->n > 0) {
        GP_ASSERT(sk->n_layers == n_layers);
        p->K = sk->n;
        p->edges = calloc((size_t)sk->n, sizeof *p->edges);
        if (!p->edges) {
            tie_free(p);
            free(p);
            return gp_error_set(GP_ERR_OOM, "out of host memory");
        }
        for (int t = 0; t < sk->n; t++) {
            int a = 0, b = 0;
            while (p->first[a] + p->count[a] <= sk->skips[t].from) a++;
            while (p->first[b] + p->count[b] <= sk->skips[t].to) b++;
            if (a != b) p->edges[p->n_edges++] = (gp_skip_edge){.id = t, .from = a, .to = b};
        }
    }
    if (p->local >= 0) { /* every process, together */
        gp_status cs = open_chans(p);
        if (cs != GP_OK) {
            free(p->edges);
            tie_free(p);
            free(p);
            return cs;
        }
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    for (int j = 0; j < n; j++) {
        p->workers[j].p = p;
        p->workers[j].j = j;
        if (p->local >= 0 && j != p->local) continue; /* another process runs it */
        int e = pthread_create(&p->workers[j].thread, NULL, worker_main, &p->workers[j]);
        if (e != 0) {
            pthread_mutex_lock(&p->lock);
            p->shutdown = true;
            pthread_cond_broadcast(&p->cond);
            pthread_mutex_unlock(&p->lock);
            for (int q = 0; q < j; q++)
                if (p->local < 0 || q == p->local) pthread_join(p->workers[q].thread, NULL);
            pthread_mutex_destroy(&p->lock);
            pthread_cond_destroy(&p->cond);
            close_chans(p, true);
            free(p->edges);
            tie_free(p);
            free(p);
            char why[300];
            return gp_error_set(GP_ERR_RUNTIME, "could not start the worker thread of device %d: "
                                "%s", j, gp_thread_error(e, why, sizeof why));
        }
    }
    *out = p;
    return GP_OK;
}

/* clip_at and clip_sq (made once), clip_sq zeroed for a step. */
static gp_status clip_tables(gp_pipeline *p)
{
    if (!p->clip_at) {
        int *at = malloc((size_t)(p->L + 1) * sizeof *at), t = 0;
        if (!at) return gp_error_set(GP_ERR_OOM, "out of host memory");
        for (int c = 0; c < p->L; c++) {
            at[c] = t;
            t += gp_layer_tensor_count(&p->layers[c]);
        }
        at[p->L] = t;
        size_t k = (size_t)(t ? t : 1);
        p->clip_sq = calloc(k, sizeof *p->clip_sq);
        p->clip_xs = malloc(k * sizeof *p->clip_xs);
        p->clip_ns = malloc(k * sizeof *p->clip_ns);
        if (!p->clip_sq || !p->clip_xs || !p->clip_ns) {
            free(at);
            free(p->clip_sq);
            free(p->clip_xs);
            free(p->clip_ns);
            p->clip_sq = NULL, p->clip_xs = NULL, p->clip_ns = NULL;
            return gp_error_set(GP_ERR_OOM, "out of host memory");
        }
        p->clip_at = at;
    }
    memset(p->clip_sq, 0, (size_t)(p->clip_at[p->L] ? p->clip_at[p->L] : 1) * sizeof *p->clip_sq);
    return GP_OK;
}

static void free_step_tables(gp_pipeline *p)
{
    gp_schedule_free(&p->sched);
    free(p->fwd_done);
    free(p->bwd_done);
    free(p->act_copied);
    free(p->grad_copied);
    free(p->skip_copied);
    free(p->skipg_copied);
    free(p->clock_done);
    free(p->clock_expected);
    if (p->events) /* the workers are idle: the main thread destroys them */
        for (size_t q = 0; q < (size_t)p->m * (size_t)p->S * (size_t)EV_PER(p); q++)
            gp_dev_event_destroy(p->devs[(q / (size_t)EV_PER(p)) % (size_t)p->S], p->events[q]);
    free(p->events);
    free(p->copy_pending);
    free(p->packed); /* their tensors went with the last step's drain */
    free(p->staged);
    p->events = NULL;
    p->copy_pending = NULL;
    p->packed = p->staged = NULL;
    if (p->mb)
        for (size_t q = 0; q < (size_t)p->m * (size_t)p->S; q++) gp_stash_destroy(&p->mb[q].stash);
    free(p->mb);
    for (int j = 0; j < p->n; j++) {
        free(p->workers[j].events);
        p->workers[j].events = NULL;
        free(p->workers[j].sent);
        p->workers[j].sent = NULL;
        p->workers[j].n_sent = 0;
        p->workers[j].n_events = 0; /* (gp_pipeline_events: none, not a stale count) */
        p->workers[j].cap_events = 0;
    }
    p->fwd_done = p->bwd_done = p->act_copied = p->grad_copied = NULL;
    p->skip_copied = p->skipg_copied = NULL;
    p->clock_done = p->clock_expected = NULL;
    p->mb = NULL;
    p->m = 0;
}

/* (Re)build the per-step tables when the chunk count or the replicas
 * change. */
static gp_status prepare(gp_pipeline *p, int m)
{
    if (p->m == m && p->mb && !p->sched_stale) {
        size_t cells = (size_t)m * (size_t)p->S;
        memset(p->fwd_done, 0, cells);
        memset(p->bwd_done, 0, cells);
        memset(p->act_copied, 0, cells);
        memset(p->grad_copied, 0, cells);
        memset(p->skip_copied, 0, (size_t)m * (size_t)p->K + 1);
        memset(p->skipg_copied, 0, (size_t)m * (size_t)p->K + 1);
        memset(p->clock_done, 0, (size_t)p->sched.clocks * sizeof *p->clock_done);
        /* a failed step may have left copies nobody waited for: their
         * tensors are gone, and so is the need */
        memset(p->copy_pending, 0, cells * (size_t)COPY_SLOTS(p));
        return GP_OK;
    }
    free_step_tables(p);
    if (p->local >= 0 &&
        (double)m * p->S * (2 + 2 * p->K) + 2 * p->n_ties > (double)gp_procs_tag_ub())
        return gp_error_set(GP_ERR_INVALID, "%d micro-batches x %d stages x %d skips need "
                            "message tags up to %.0f, over this MPI's limit %d; use fewer "
                            "micro-batches (pipeline.chunks)", m, p->S, p->K,
                            (double)m * p->S * (2 + 2 * p->K) + 2 * p->n_ties,
                            gp_procs_tag_ub());
    gp_schedule_opts so = {.kind = p->opts.schedule, .n = p->n, .m = m,
                           .durations = p->tuned > 0 ? p->durations : NULL,
                           .virtual_stages = p->S / p->n,
                           .checkpoint = p->opts.checkpoint,
                           .replicas = p->replicas, .update = p->opts.optim != NULL,
                           .check = !p->opts.no_check, .clip = p->opts.clip_norm > 0,
                           .skips = p->edges, .n_skips = p->n_edges,
                           .file = p->opts.schedule_file};
    memcpy(so.shard, p->shard, sizeof so.shard);
    GP_TRY(gp_schedule_make(&so, &p->sched));
    p->sched_stale = false;
    p->m = m;
    size_t cells = (size_t)m * (size_t)p->S;
    p->fwd_done = calloc(cells, 1);
    p->bwd_done = calloc(cells, 1);
    p->act_copied = calloc(cells, 1);
    p->grad_copied = calloc(cells, 1);
    p->skip_copied = calloc((size_t)m * (size_t)p->K + 1, 1);
    p->skipg_copied = calloc((size_t)m * (size_t)p->K + 1, 1);
    p->clock_done = calloc((size_t)p->sched.clocks, sizeof *p->clock_done);
    p->clock_expected = calloc((size_t)p->sched.clocks, sizeof *p->clock_expected);
    p->mb = calloc(cells, sizeof *p->mb);
    p->events = calloc(cells * (size_t)EV_PER(p), sizeof *p->events);
    p->copy_pending = calloc(cells * (size_t)COPY_SLOTS(p), 1);
    if (p->opts.bf16_copies) {
        p->packed = calloc(cells * (size_t)COPY_SLOTS(p), sizeof *p->packed);
        p->staged = calloc(cells * (size_t)COPY_SLOTS(p), sizeof *p->staged);
    }
    bool ok = p->fwd_done && p->bwd_done && p->act_copied && p->grad_copied && p->skip_copied &&
              p->skipg_copied && p->clock_done &&
              p->clock_expected && p->mb && p->events && p->copy_pending &&
              (!p->opts.bf16_copies || (p->packed && p->staged));
    for (size_t q = 0; ok && q < cells; q++) {
        ok = gp_stash_init(&p->mb[q].stash, p->count[q % (size_t)p->S], p->opts.skips,
                           p->first[q % (size_t)p->S]) == GP_OK;
        p->mb[q].stash.keep = p->opts.ckpt_keep;
    }
    if (ok && sent_tables(p) != GP_OK) ok = false;
    for (int j = 0; ok && j < p->n; j++) {
        /* a copy records two events (wait, copy) */
        p->workers[j].cap_events = 2 * p->sched.count[j];
        p->workers[j].events = calloc((size_t)p->workers[j].cap_events, sizeof(gp_event_rec));
        ok = p->workers[j].events != NULL;
        for (int c = 0; ok && c < p->sched.count[j]; c++) {
            gp_instr_kind kd = p->sched.list[j][c].kind;
            if (gp_instr_clocked(kd))
                p->clock_expected[p->sched.list[j][c].k]++;
        }
    }
    if (!ok) {
        free_step_tables(p);
        return gp_error_set(GP_ERR_OOM, "out of host memory for the step tables");
    }
    return GP_OK;
}

gp_status gp_pipeline_step(gp_pipeline *p, const float *x, const float *y, int64_t n,
                           uint64_t seed, uint64_t step, double lr, gp_pipeline_out *out)
{
    GP_TRY(gp_pipeline_step_begin(p, x, y, n, 0, n, seed, step, lr));
    return gp_pipeline_step_end(p, out);
}

gp_status gp_pipeline_step_begin(gp_pipeline *p, const float *x, const float *y, int64_t n,
                                 int64_t sample_base, int64_t batch_total, uint64_t seed,
                                 uint64_t step, double lr)
{
    GP_ASSERT(!p->running);
    pthread_mutex_lock(&p->lock); /* (the workers are idle) */
    p->mutated = false;           /* even if this step fails before it runs */
    pthread_mutex_unlock(&p->lock);
    p->t_begin = gp_now();
    int m = p->opts.chunks;
    GP_TRY(gp_microbatch_split(n, m, p->sizes));
    GP_TRY(prepare(p, m));
    int64_t off = 0;
    for (int i = 0; i < m; i++) {
        p->offsets[i] = off;
        off += p->sizes[i];
    }
    p->batch = n;
    p->sample_base = sample_base;
    p->batch_total = batch_total;
    p->x = x;
    p->y = y;
    p->seed = seed;
    p->step = step;
    p->lr = lr;
    for (size_t q = 0; q < (size_t)m * (size_t)p->S; q++) {
        p->mb[q].loss_sum = 0;
        p->mb[q].correct = 0;
        p->mb[q].count = 0;
        p->mb[q].sent = p->mb[q].labels_sent = p->mb[q].whole = false;
    }

    if (p->opts.clip_norm > 0) GP_TRY(clip_tables(p));
    p->grad_norm = NAN;
    pthread_mutex_lock(&p->lock);
    p->finished = 0;
    p->lists_ok = 0;
    p->clip_in = 0;
    p->results_read = 0;
    p->drained = 0;
    if (p->n_ties) memset(p->tie_updated, 0, (size_t)p->n_ties * sizeof *p->tie_updated);
    p->cancelled = false;
    p->status = GP_OK;
    p->message[0] = '\0';
    p->clock_front = 0;
    advance_clocks(p);
    p->generation++;
    p->running = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return GP_OK;
}

const gp_event_rec *gp_pipeline_producer(const gp_pipeline *p, const gp_event_rec *c)
{
    int d = p->dev_of[c->from]; /* the source stage's device */
    bool act = c->kind == GP_INSTR_RECV_ACT || c->kind == GP_INSTR_RECV_SKIP;
    const worker *w = &p->workers[d];
    for (int e = 0; e < w->n_events; e++) {
        const gp_event_rec *r = &w->events[e];
        if ((act ? r->kind == GP_INSTR_FORWARD : gp_instr_gives_grad(r->kind)) && r->i == c->i &&
            r->j == c->from && !r->is_wait)
            return r;
    }
    return NULL;
}

void gp_pipeline_set_device_time(gp_pipeline *p, bool on)
{
    GP_ASSERT(!p->running);
    p->device_time = on;
}

/* After a step with device time: every record's markers into t0 and t1
 * (the host's kept in h0, h1).  Then each local copy starts no earlier
 * than its producer ended (the copy stream waited for the producer's event
 * inside the copy, past its start marker), and the wait record before it
 * becomes the copy's whole wait for its producer: from when the device could
 * take the copy (the host reached it, or the stream did if that was later,
 * and not before the copy track's previous record ended) to the copy's
 * start.  The host's part counts: the stream's start marker comes after
 * the host waited for the producer (on CPU devices, for its end; under
 * mpirun, for the message), so the stream alone shows no wait there.
 * Called once every worker is done. */
static gp_status resolve_device_time(gp_pipeline *p)
{
    for (int d = 0; d < p->n; d++) {
        worker *w = &p->workers[d];
        for (int e = 0; e < w->n_events; e++) {
            gp_event_rec *r = &w->events[e];
            if (r->is_wait || !r->m1) continue;
            gp_device *dev = p->devs[r->j];
            double a = r->t0, b;
            if (r->m0) GP_TRY(gp_dev_mark_time(dev, r->m0, &a));
            GP_TRY(gp_dev_mark_time(dev, r->m1, &b));
            r->h0 = r->t0;
            r->h1 = r->t1;
            r->t0 = a;
            r->t1 = b > a ? b : a;
            r->device_time = true;
        }
    }
    for (int d = 0; d < p->n; d++) {
        worker *w = &p->workers[d];
        for (int e = 0; e < w->n_events; e++) {
            gp_event_rec *r = &w->events[e];
            if (!r->device_time || !gp_instr_copies(r->kind)) continue;
            const gp_event_rec *src = gp_pipeline_producer(p, r);
            double ready = r->t0; /* the copy stream reached the copy */
            if (src && src->device_time && src->t1 > r->t0)
                r->t0 = src->t1 < r->t1 ? src->t1 : r->t1;
            if (e > 0 && w->events[e - 1].is_wait && w->events[e - 1].i == r->i &&
                w->events[e - 1].kind == r->kind) {
                gp_event_rec *wr = &w->events[e - 1];
                double from = wr->t0 < ready ? wr->t0 : ready, floor = -1e300;
                for (int q = e - 2; q >= 0; q--) /* (resolved: the loop goes forward) */
                    if (gp_instr_copies(w->events[q].kind)) {
                        floor = w->events[q].t1;
                        break;
                    }
                if (from < floor) from = floor;
                wr->h0 = wr->t0;
                wr->h1 = wr->t1;
                wr->t0 = from < r->t0 ? from : r->t0;
                wr->t1 = r->t0;
                wr->device_time = true;
            }
        }
    }
    return GP_OK;
}

enum { ZB_TUNE_STEPS = 3 };

/* After a step: zb-h1's order from this step's measured times.  Not with
 * replicas: their orders must stay the same (SyncBN's collectives run in
 * forward and backward-data, in the order of each replica's list), and
 * each replica would measure its own times. */
static void tune_order(gp_pipeline *p)
{
    gp_schedule_kind k = p->opts.schedule;
    if ((k != GP_SCHEDULE_ZB_H1 && k != GP_SCHEDULE_V_HALF && k != GP_SCHEDULE_V_MIN) ||
        p->replicas > 1 || p->tuned >= ZB_TUNE_STEPS)
        return;
    double sum[3 * GP_MAX_DEVICES] = {0};
    int cnt[3 * GP_MAX_DEVICES] = {0};
    for (int d = 0; d < p->n; d++)
        for (int e = 0; e < p->workers[d].n_events; e++) {
            const gp_event_rec *ev = &p->workers[d].events[e];
            int q = ev->kind == GP_INSTR_FORWARD ? 0 : ev->kind == GP_INSTR_BACKWARD_DATA ? 1
                    : ev->kind == GP_INSTR_BACKWARD_WEIGHTS ? 2 : -1;
            if (q < 0 || ev->is_wait) continue;
            sum[3 * ev->j + q] += ev->t1 - ev->t0;
            cnt[3 * ev->j + q]++;
        }
    for (int q = 0; q < 3 * p->S; q++)
        p->durations[q] = cnt[q] ? fmax(sum[q] / cnt[q], 1e-9) : 1e-9;
    /* processes: each measured its own stages; every rank must make its
     * list from the same times (the lists of one schedule), so take each
     * stage's from the rank that ran it */
    if (p->local >= 0 && gp_procs_max_doubles(p->durations, 3 * p->S) != GP_OK) return;
    p->tuned++;
    p->sched_stale = true;
}

/* The step's busy time per device and its window (gp_pipeline_out):
 * from the workers' event records. */
static gp_status step_busy(gp_pipeline *p, double *busy, double *window)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int d = 0; d < p->n; d++) {
        const worker *w = &p->workers[d];
        for (int e = 0; e < w->n_events; e++) {
            const gp_event_rec *ev = &w->events[e];
            if (ev->t0 < lo) lo = ev->t0;
            if (ev->t1 > hi) hi = ev->t1;
            if (!ev->is_wait && ev->kind != GP_INSTR_BARRIER) busy[d] += ev->t1 - ev->t0;
        }
    }
    *window = hi > lo ? hi - lo : 0;
    if (p->local >= 0) { /* this rank's device only: the others' from their ranks */
        int ranks = gp_procs_size(), reps = ranks >= p->n ? ranks / p->n : 1;
        GP_TRY(gp_procs_sum_doubles(busy, p->n));
        for (int d = 0; d < p->n; d++) busy[d] /= reps;
        GP_TRY(gp_procs_max_doubles(window, 1));
    }
    return GP_OK;
}

gp_status gp_pipeline_step_end(gp_pipeline *p, gp_pipeline_out *out)
{
    GP_ASSERT(p->running);
    int m = p->m;
    pthread_mutex_lock(&p->lock);
    while (p->drained < p->n_run) pthread_cond_wait(&p->cond, &p->lock);
    p->running = false;
    gp_status st = p->status;
    pthread_mutex_unlock(&p->lock);
    if (st != GP_OK) return gp_error_set(st, "%s", p->message);

    if (p->device_time) GP_TRY(resolve_device_time(p));
    tune_order(p);
    double loss = 0;
    int64_t correct = 0, count = 0;
    for (int i = 0; i < m; i++) {
        loss += MB(p, i, p->S - 1)->loss_sum;
        correct += MB(p, i, p->S - 1)->correct;
        count += MB(p, i, p->S - 1)->count;
    }
    if (p->local >= 0) { /* the last stages' processes have the loss (0 elsewhere) */
        double v[3] = {loss, (double)correct, (double)count};
        GP_TRY(gp_procs_sum_doubles(v, 3));
        loss = v[0];
        correct = (int64_t)v[1];
        count = (int64_t)v[2];
    }
    double busy[GP_MAX_DEVICES] = {0}, window = 0;
    GP_TRY(step_busy(p, busy, &window));
    if (out) {
        out->loss_sum = loss;
        out->correct = correct;
        out->count = count;
        out->seconds = gp_now() - p->t_begin;
        out->grad_norm = p->grad_norm;
        out->n = p->n;
        out->window = window;
        double sum = 0;
        for (int d = 0; d < p->n; d++) sum += out->busy[d] = busy[d];
        out->bubble = window > 0 ? 1.0 - sum / ((double)p->n * window) : 0;
    }
    return GP_OK;
}

bool gp_pipeline_step_untouched(gp_pipeline *p)
{
    pthread_mutex_lock(&p->lock);
    bool r = !p->mutated;
    pthread_mutex_unlock(&p->lock);
    return r;
}

void gp_pipeline_destroy(gp_pipeline *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->shutdown = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    for (int j = 0; j < p->n; j++)
        if (p->local < 0 || j == p->local) pthread_join(p->workers[j].thread, NULL);
    for (int j = 0; j < p->n; j++) { /* the workers are gone: the main thread frees */
        worker *w = &p->workers[j];
        if (w->res_dev) gp_dev_free(p->devs[j], w->res_dev, w->res_bytes, GP_MEM_WORKSPACE);
        free(w->res_host);
    }
    /* a failed step may leave transfers whose peer never comes: their
     * events and channels are left to the process's end */
    bool abort = p->status != GP_OK;
    for (int q = 0; q < p->n_pend && !abort; q++)
        if (p->pend[q].chan) gp_dev_event_destroy(p->pend[q].dev, p->pend[q].ev);
    close_chans(p, abort);
    free_step_tables(p);
    free(p->pend);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    for (int j = 0; j < p->S; j++)
        if (p->clip_buf[j])
            gp_dev_free(p->devs[j], p->clip_buf[j], p->clip_buf_size[j], GP_MEM_WORKSPACE);
    free(p->clip_sq);
    free(p->clip_at);
    free(p->clip_xs);
    free(p->clip_ns);
    free(p->edges);
    tie_free(p);
    free(p);
}

const gp_event_rec *gp_pipeline_events(const gp_pipeline *p, int j, int *count)
{
    *count = p->workers[j].n_events;
    return p->workers[j].events;
}

void gp_pipeline_set_fault_delay(gp_pipeline *p, int ms) { p->opts.fault_delay_ms = ms; }

void gp_pipeline_set_late_copies(gp_pipeline *p, int d, int ms)
{
    p->opts.late_device = d;
    p->opts.late_ms = ms;
}

void gp_pipeline_set_fault(gp_pipeline *p, int i, int j, gp_instr_kind kind)
{
    p->opts.fault_i = i;
    p->opts.fault_j = j;
    p->opts.fault_kind = kind;
}

double gp_pipeline_busy(const gp_pipeline *p, int j) { return p->workers[j].busy; }
double gp_pipeline_comm_seconds(const gp_pipeline *p, int j) { return p->workers[j].comm_seconds; }

void gp_pipeline_join(gp_pipeline *p, gp_comm *const *comms, int rank,
                      void (*on_fail)(void *arg), void *arg)
{
    GP_ASSERT(!p->running);
    for (int j = 0; j < p->S; j++) p->comms[j] = comms ? comms[j] : NULL;
    p->rank = rank;
    p->replicas = comms && comms[0] ? comms[0]->n : 1;
    /* Shard the update where every stage's device can (gp_dev_can_shard). */
    for (int j = 0; j < p->S; j++)
        p->shard[j] = p->replicas > 1 && gp_dev_can_shard(p->devs[j]) && !p->n_ties;
    p->sched_stale = true;
    p->on_fail = on_fail;
    p->fail_arg = arg;
}

void gp_pipeline_cancel(gp_pipeline *p)
{
    pthread_mutex_lock(&p->lock);
    if (p->running && !p->cancelled) {
        p->cancelled = true;
        p->status = GP_ERR_CANCELLED;
        snprintf(p->message, sizeof p->message, "cancelled: another replica failed");
    }
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}
int gp_pipeline_stages(const gp_pipeline *p) { return p->S; }
int gp_pipeline_devices(const gp_pipeline *p) { return p->n; }
int gp_pipeline_device_of(const gp_pipeline *p, int j) { return p->dev_of[j]; }

void gp_event_name(const gp_event_rec *e, char *buf, size_t len)
{
    if (e->is_wait) {
        snprintf(buf, len, "wait");
        return;
    }
    gp_instr in = {.kind = e->kind, .i = e->i, .j = e->j, .k = e->k, .from = e->from,
                   .shard = e->shard, .fused = e->fused};
    gp_instr_name(&in, buf, len);
}
