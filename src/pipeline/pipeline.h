/*
 * pipeline.h — a sequential model split into stages on several devices,
 * driven by one worker thread per device on a schedule.
 *
 * Placement: stage j holds layers [first_j, first_j + count_j) on device
 * dev_j.  Where the device changes, data crosses by copy instructions (the
 * copy layers of the design): the receiving device copies the activation
 * into its own allocator's memory in forward (category COPIES), and the
 * gradient back in backward.  No layer knows its stage.
 *
 * Executor: workers are created once in gp_pipeline_create and reused every
 * step.  A step hands each worker its instruction list (schedule.h), the
 * whole step: forwards, recomputes, backwards, copies, and the end of the
 * step (reductions over replicas, the barrier, batch-norm commit, the
 * optimizer's update, the all-gather).  A worker runs it in order, waiting
 * only in copies (in lockstep mode, the default, until every computation of
 * the previous clock has finished, as torchgpipe; otherwise until the
 * copy's source is ready) and at the barrier.  Each worker touches only its
 * own device's memory; cross-thread state is a table of completion flags
 * guarded by one mutex.
 *
 * Owns: the workers, the step's per-micro-batch state, the schedule it
 * runs.  May call: core, backend, layers, checkpoint (what an instruction
 * does to a stage's layers), optim (UPDATE).  Knows nothing of configs,
 * datasets or the training loop.
 *
 * Failure: the first error in any worker cancels the step on all workers;
 * every worker frees what the step allocated on its device; the caller gets
 * that one error, naming device, stage, micro-batch and layer.
 *
 * Data parallelism: R pipelines, one per replica, each on its own devices,
 * joined into a group (gp_pipeline_join) and stepped together with
 * gp_pipeline_step_begin / _end; see the functions' comments.
 *
 * Thread safety: one caller thread drives a gp_pipeline; gp_pipeline_cancel
 * may be called from any thread.
 */
#ifndef GP_PIPELINE_H
#define GP_PIPELINE_H

#include "optim/optim.h"
#include "pipeline/schedule.h"

typedef struct gp_pipeline gp_pipeline;

/* One executed instruction, for timelines. */
typedef struct gp_event_rec {
    gp_instr_kind kind;
    int i, j, k;
    int from;               /* copies: the source stage */
    int skip;               /* skip copies: the model's skip number */
    bool shard, fused;      /* as the instruction's */
    int layer_first, layer_count;
    size_t bytes;           /* copies: bytes moved */
    bool is_wait;           /* time a copy spent waiting for its source or
                               the lockstep barrier (precedes the copy) */
    double t0, t1;          /* gp_now() seconds: on the host, or with device
                               time when the device's streams ran it */
    bool device_time;       /* t0, t1 are device time (markers resolved) */
    double h0, h1;          /* device time: the host's t0, t1 (the launch) */
    void *m0, *m1;          /* device time: the markers (gp_dev_mark) */
    size_t mem_after;       /* device bytes allocated when it ended */
    bool whole;             /* BACKWARD_DATA: ran the whole backward, its
                               weights half next on the list then empty
                               (gp_instr_whole_backward) */
} gp_event_rec;

typedef struct gp_pipeline_opts {
    int chunks;                 /* micro-batches per step (m) */
    gp_checkpoint_mode checkpoint;
    gp_ckpt_keep ckpt_keep;     /* the layer types a checkpointed forward
                                   keeps (gp_ckpt_kept; 0: its input only) */
    gp_schedule_kind schedule;  /* GPipe's fill-drain (default), 1F1B, ZB-H1,
                                   interleaved */
    int virtual_stages;         /* interleaved: stages per device (v >= 2) */
    const struct gp_schedule_file *schedule_file; /* schedule GP_SCHEDULE_FILE(_V):
                                                     its orders (the config's) */
    bool lockstep;
    /* Test hook: fail the instruction of `fault_kind` at (fault_i, fault_j)
     * with GP_ERR_RUNTIME "injected fault".  fault_j < 0 = off. */
    int fault_i, fault_j;
    gp_instr_kind fault_kind;
    int fault_delay_ms;         /* the fault first sleeps this long (tests: a late failure) */
    /* Test hook: device late_device's worker sleeps late_ms before each
     * copy it makes, once the copy may start (a reader whose thread gets
     * the CPU late).  late_ms 0 = off. */
    int late_device, late_ms;
    gp_optim *optim;            /* the update of the model's layers; NULL: the
                                   step ends with the gradients (no UPDATE) */
    bool no_check;              /* leave out CHECK (benchmarks of its cost) */
    const gp_skip_map *skips;   /* the model's skip connections (NULL: none);
                                   borrowed, must outlive the pipeline */
    /* Processes (procs.h, mpirun): with `processes`, this process runs
     * only device local_device, which is its rank (device d runs on rank
     * d); otherwise (the default) every device, as worker threads of this
     * process.  Copies to and from the other processes' stages are MPI
     * messages; the step is free-running across processes (lockstep has
     * nothing to hold: no two neighbouring stages share a process); the
     * loss is the sum over the last stages' ranks (every replica's). */
    bool processes;
    int local_device;
    int rank_base;              /* processes: the rank of device 0 (replica r of
                                   n devices: r x n) */
    /* Copies between stages in bfloat16 (pipeline.copy_precision: bf16):
     * every tensor that crosses a stage boundary, forward and backward,
     * arrives rounded to bfloat16, to nearest even, and moves half the
     * bytes (pipeline.c, "copies in bfloat16"). */
    bool bf16_copies;
    /* The model's gate (gp_model.gate; NULL: none): COMMIT, UPDATE and
     * GATHER, which write the state a snapshot holds, wait at it while a
     * snapshot copies that state in the background. */
    gp_gate *state_gate;
    float clip_norm;            /* > 0: CLIP finds the factor that makes the
                                   gradients' global L2 norm at most this
                                   (train.clip_grad_norm) and the UPDATE reads
                                   them times it, in its own pass (the
                                   gradients are left unscaled); only with an
                                   optim (no UPDATE, no CLIP: grad_norm stays
                                   NaN) */
    float label_smoothing;      /* cross-entropy's (model.label_smoothing); 0: none */
    int64_t classes;            /* cross-entropy's: the logits it reads of a padded
                                   vocabulary (gp_loss); 0: all */
    gp_loss_kind loss;          /* the last stage's loss (default cross-entropy:
                                   y holds one class id per sample; binary
                                   cross-entropy: one target per element of
                                   the model's output, gp_loss_targets_per_sample) */
} gp_pipeline_opts;

/* The slice name of an executed instruction (gp_instr_name), or "wait". */
void gp_event_name(const gp_event_rec *e, char *buf, size_t len);

typedef struct gp_pipeline_out {
    double loss_sum;            /* over all targets of the batch */
    int64_t correct;            /* targets predicted right */
    int64_t count;              /* targets: samples (cross-entropy) or
                                   output elements (binary cross-entropy) */
    double seconds;             /* wall time of the step */
    double grad_norm;           /* with clip_norm: the gradients' global L2 norm
                                   before clipping; NaN without */
    /* The bubble, as scripts/timeline.py measures it: window, the step's
     * wall time from the first start of work on any device to the last
     * end (end-of-step work included); busy[d], the time device d worked
     * in it (computing, copying, reducing, updating; not waiting for a
     * copy's source nor at the barrier); bubble = 1 - sum busy / (n
     * window).  Under mpirun each rank's own window, the longest taken,
     * and its device's busy time summed over the ranks (replicas: their
     * mean). */
    int n;                      /* devices */
    double window;
    double busy[GP_MAX_DEVICES];
    double bubble;
} gp_pipeline_out;

/* Stage j runs layers[first_j .. first_j + balance[j]) on devs[j], for n
 * stages; the layers must already live on their stage's device.  Without
 * interleaving every stage has its own device; interleaved
 * (opts->virtual_stages = v) stage j runs on device j % (n / v), which
 * devs[] must repeat.  `input` is the per-sample input shape (1, C, H, W).
 * Starts one worker thread per device. */
gp_status gp_pipeline_create(gp_layer *layers, int n_layers, const gp_shape *input,
                             int n, gp_device *const *devs, const int *balance,
                             const gp_pipeline_opts *opts, gp_pipeline **out);
/* Stops and joins the workers. */
void gp_pipeline_destroy(gp_pipeline *p);
/* Whether the last step (begun with gp_pipeline_step or _begin, finished
 * or failed) changed nothing of the model: no COMMIT, UPDATE or GATHER of
 * it began, so its layers (parameters, batch-norm statistics) and the
 * optimizer's state are as they were before it.  True of a step that
 * failed before its barrier (out of memory, a bad label, a device error
 * in a forward or backward, a copy) or at its CLIP (gradients not
 * finite); false once the update has begun, where a failure (on one stage,
 * one replica) can leave the model in between. */
bool gp_pipeline_step_untouched(gp_pipeline *p);

/* One step on a host batch x (n, C, H, W), y (n, T) with T targets per
 * sample (opts.loss: 1 class id, or one target per output element): the
 * schedule over chunks micro-batches, from the forwards to the optimizer's
 * update with learning rate lr (opts.optim).  The loss gradient is that of
 * the mean over all n x T targets.  Gradients, running statistics and the
 * updated parameters equal those of the single-device run that
 * accumulates the same micro-batches. */
gp_status gp_pipeline_step(gp_pipeline *p, const float *x, const float *y, int64_t n,
                           uint64_t seed, uint64_t step, double lr, gp_pipeline_out *out);

/* The same step in two halves, so one thread can drive several pipelines
 * at once (data-parallel replicas): begin hands the step to the workers and
 * returns; end waits for it and returns what gp_pipeline_step would.  Every
 * successful begin must be followed by exactly one end.  x, y (n samples)
 * are this pipeline's share of a global mini-batch of batch_total samples
 * starting at sample_base: dropout masks are indexed by the global
 * position and the loss gradient is scaled by 1 / (batch_total x T).  x
 * and y must stay valid until end. */
gp_status gp_pipeline_step_begin(gp_pipeline *p, const float *x, const float *y, int64_t n,
                                 int64_t sample_base, int64_t batch_total, uint64_t seed,
                                 uint64_t step, double lr);
gp_status gp_pipeline_step_end(gp_pipeline *p, gp_pipeline_out *out);

/* Data parallelism: make this pipeline replica `rank` of a group.  comms[j]
 * is stage j's communicator over the replicas' stage-j devices (comms NULL:
 * leave the group).  From the next step on the schedule has the replicas'
 * instructions (schedule.h): stage j's gradients reduced over comms[j] right
 * after its last backward, while the earlier stages still run theirs (on
 * stage 0, when sharded, inside its fused update instead), batch-norm
 * statistics merged, a barrier over comms[j] after the replica's own, so
 * the update starts only when every stage of every replica got through its
 * backward, and the update sharded where the devices can
 * (gp_dev_can_shard).
 * Layers see (comms[j], rank) in their gp_fwd_ctx (SyncBN).  The first
 * failure of a step calls on_fail(arg) from the failing worker, outside any
 * lock: the group then cancels the other replicas (gp_pipeline_cancel) and
 * aborts the communicators, so nothing waits forever and no replica updates
 * its model.  Only between steps. */
void gp_pipeline_join(gp_pipeline *p, gp_comm *const *comms, int rank,
                      void (*on_fail)(void *arg), void *arg);
/* Cancel the running step (if any) with GP_ERR_CANCELLED; any thread. */
void gp_pipeline_cancel(gp_pipeline *p);
/* Seconds worker j spent in collectives (gradient reduction, statistics,
 * fused update, gather) and waiting for the other replicas in the last
 * step. */
double gp_pipeline_comm_seconds(const gp_pipeline *p, int j);

/* Test hook: make the instruction `kind` of (i, j) fail from the next step
 * on (j < 0 turns it off). */
void gp_pipeline_set_fault(gp_pipeline *p, int i, int j, gp_instr_kind kind);
/* Test hook: the injected fault sleeps `ms` before it fails (a replica that
 * fails late, after the others got through their backward). */
void gp_pipeline_set_fault_delay(gp_pipeline *p, int ms);
/* Test hook: device d's worker sleeps `ms` before each copy it makes from
 * the next step on (opts.late_device); ms 0 turns it off. */
void gp_pipeline_set_late_copies(gp_pipeline *p, int d, int ms);

/* Events of the last step for device j (valid until the next step). */
const gp_event_rec *gp_pipeline_events(const gp_pipeline *p, int j, int *count);
/* Device time for the next steps (on) or host time (off, the default).
 * On: every instruction takes device-time markers on the stream it runs
 * on (gp_dev_mark: no host wait) and the step's end reads them, so the
 * events' t0 and t1 say when a device ran the instruction, not when the
 * host issued it (on a GPU, asynchronously, often much earlier).  A
 * copy's event starts when both its stream was free and its producer had
 * finished; the wait before it is the time its stream waited for the
 * producer.  Where a backend takes no markers (or a copy comes from
 * another process), host times stay.  The read after the step may wait
 * on the host (not counted in host_waits). */
void gp_pipeline_set_device_time(gp_pipeline *p, bool on);
/* The event of the slice that produced what copy event c copied (the
 * forward or the backward of (c->i, c->from)); NULL if none was recorded
 * (another process ran it). */
const gp_event_rec *gp_pipeline_producer(const gp_pipeline *p, const gp_event_rec *c);
/* Busy seconds of worker j in the last step (sum of its instructions). */
double gp_pipeline_busy(const gp_pipeline *p, int j);
/* Stages, and devices (workers, event lists): equal except interleaved,
 * where stage j runs on device j % devices, and zb-v (2 per device, in a
 * V); gp_pipeline_device_of: stage j's device. */
int gp_pipeline_stages(const gp_pipeline *p);
int gp_pipeline_devices(const gp_pipeline *p);
int gp_pipeline_device_of(const gp_pipeline *p, int j);

#endif /* GP_PIPELINE_H */
