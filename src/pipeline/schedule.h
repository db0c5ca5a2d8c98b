/*
 * schedule.h — pipeline schedules as pure functions.
 *
 * A schedule says, for every device (stage) j, the ordered list of
 * instructions its worker runs in one training step, each stamped with its
 * clock number.  GPipe's clock cycles, as in torchgpipe: in the forward phase
 * clock k runs micro-batch i on stage j for i + j = k,
 *
 *     k   (i,j) (i,j) (i,j)
 *     0   (0,0)
 *     1   (1,0) (0,1)
 *     2   (2,0) (1,1) (0,2)
 *     3         (2,1) (1,2)
 *     4               (2,2)
 *
 * and the backward phase runs the clocks in reverse: backward clock
 * k = (m - 1 - i) + (n - 1 - j), so on every stage micro-batch i runs before
 * i - 1, and stage j after stage j + 1.  Backward clocks are numbered after
 * the forward ones (k + m + n - 1) so one integer orders the whole step.
 *
 * 1F1B (PipeDream-flush; DeepSpeed's TrainSchedule, Megatron): stage j runs
 * w = min(n - 1 - j, m) forwards, then alternates one forward and one
 * backward, then the last w backwards, micro-batch 0 first.  At most
 * min(n - j, m) micro-batches are in flight on stage j (forwarded, not yet
 * backwarded) instead of GPipe's m, for the same bubble.  n = 3, m = 4,
 * Fi / Bi = forward / backward of micro-batch i, one unit each:
 *
 *     k    0   1   2   3   4   5   6   7   8   9  10  11
 *     j=0  F0  F1  F2          B0  F3  B1      B2      B3
 *     j=1      F0  F1      B0  F2  B1  F3  B2      B3
 *     j=2          F0  B0  F1  B1  F2  B2  F3  B3
 *
 * ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B
 * with each backward split into backward-data (B, what the previous stage
 * waits for) and backward-weights (W, which nothing waits for), and the W
 * passes moved into the bubbles.  The order is what a greedy unit-time
 * execution gives: each stage runs a B when its gradient is there, else a
 * F when its input is there, fewer than n - j micro-batches wait for their
 * B (1F1B's rule) and fewer than n - j + 1 for their W, else its oldest
 * pending W.  The paper keeps exactly 1F1B's memory by counting what B
 * frees; here a micro-batch's activations live until its W, so one more
 * micro-batch may be in flight than in 1F1B.  With the stages' measured
 * times (gp_schedule_opts.durations; the executor measures them in its
 * first steps) the same greedy runs in those times instead of units, which
 * only moves the W passes.  n = 3, m = 4, units:
 *
 *     k    0   1   2   3   4   5   6   7   8   9  10  11  12  13  14
 *     j=0  F0  F1  F2          B0  F3  B1  W0  W1  B2  W2      B3  W3
 *     j=1      F0  F1      B0  F2  B1  W0  F3  B2  W1  W2  B3  W3
 *     j=2          F0  B0  F1  B1  W0  F2  B2  W1  F3  B3  W2  W3
 *
 * Interleaved 1F1B (Narayanan et al. 2021, Megatron's virtual pipeline):
 * each of the n devices holds v stages, device d stages d, d + n, ...,
 * d + (v - 1) n, so S = n v stages in all and a micro-batch visits every
 * device v times.  Device d runs (n - d - 1) 2 + (v - 1) n warm-up forwards
 * (its k-th forward: micro-batch (k / nv) n + k % n of its chunk
 * (k % nv) / n), then alternates forward and backward (backwards take the
 * chunks in reverse), then drains.  The bubble falls by v, the copies grow
 * by v; m must be a multiple of n.  n = 2, v = 2, m = 2 (stage in
 * brackets; m = n, so every forward is warm-up):
 *
 *     k    0     1     2     3     4     5     6     7     8     9
 *     d=0  F0[0] F1[0] F0[2] F1[2]             B0[2] B1[2] B0[0] B1[0]
 *     d=1        F0[1] F1[1] F0[3] F1[3] B0[3] B1[3] B0[1] B1[1]
 *
 * ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", section 6;
 * PyTorch's ScheduleZBVZeroBubble): 2n stages placed in a V, device d
 * holding stage d (its chunk 0) and stage 2n - 1 - d (its chunk 1), so the
 * first and the last stage share device 0 and the turn (stages n - 1 and
 * n) is on device n - 1; every backward is split into backward-data (B)
 * and backward-weights (W).  Device d runs 2 (n - d) - 1 forwards of chunk
 * 0; d pairs (a forward of chunk 1, one of chunk 0); n - d triples (F, B,
 * W of chunk 1); then, while forwards are left, (F, B, W of chunk 0, then
 * of chunk 1); then d pairs (B of chunk 0, B of chunk 1), n - d pairs (B,
 * W of chunk 0) and the W passes left, chunk 1's first.  Built for
 * max(m, 2n - 1) micro-batches, the computations of those past m dropped
 * (what the paper's figure and PyTorch do for small m).  With equal
 * forward, backward-data and backward-weights times its bubble is about
 * zero; at most 2n (micro-batch, stage) pairs are in flight on a device,
 * each half a 1F1B stage: 1F1B's activation memory.  n = 2, m = 4 (stage
 * in brackets; clocks as below):
 *
 *     d=0  F0[0] F1[0] F2[0]             F0[3] B0[3] W0[3] F3[0] B0[0] ...
 *     d=1        F0[1]       F0[2] B0[2] W0[2] F1[2] B1[2] ...
 *
 * V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable
 * Memory", the zero-bubble paper's follow-up on V-shape schedules): ZB-V's
 * V and split backwards with a device's (micro-batch, stage) pairs in
 * flight capped at the paper's activation memory (gp_schedule_v_budget):
 * (n + 2) / 2 of 1F1B's n micro-batches for V-Half, (n + 4) / 3 for V-Min
 * (integer division; two pairs, each half a 1F1B stage, make one): about
 * half and a third of 1F1B's as n grows (3/4 and 1/2 on 4 devices, 5/8
 * and 1/2 on 8), all of it (ZB-V's) on 2.  The order is a greedy execution in unit (or measured)
 * times: a backward-data whose gradient is there, else a forward with
 * room, else the oldest weights pass, one place kept for chunk 1 while it
 * has none in flight.  Where that greedy would stall every round under
 * V-Min's cap (in unit times: n = 6, 7 and 7 more n up to 32), the cap is
 * raised a pair at a time until it does not, 4 pairs at most.  With equal
 * times the bubble is about the paper's, n / 2m and 2n / 3m of the step
 * against 1F1B's n / m, and does not grow with m (test_schedule).
 * Until 2026-12-01 the caps were n and (2n + 2) / 3 pairs, a 1F1B micro-
 * batch under the paper's, and the bubble grew with m: V-Min's on every
 * device count from 2 to 16 (44% of the step on 4 at any m), V-Half's on
 * 2, 3, 5, 6 and 9 (33% on 2).
 *
 * DualPipeV (DeepSeek-V3's DualPipe folded into a V, as its authors'
 * open code and PyTorch's ScheduleDualPipeV run it): the same V, and on
 * device d, chunks 0 and 1 as in ZB-V: 2 (n - d - 1) forwards of chunk 0;
 * d + 1 pairs (forward of chunk 0, of chunk 1); n - d - 1 triples (B of
 * chunk 1 split: I, the oldest W waiting, forward of chunk 1); m - 2n +
 * d + 1 rounds of (forward of 0, whole backward of 1, forward of 1, whole
 * backward of 0), the pairs DualPipe overlaps (here one after the other);
 * n - d - 1 rounds of (backward of 1, forward of 1, backward of 0); d + 1
 * pairs of backwards (1, then 0), whole for the first half, split (I) for
 * the rest; n - d - 1 of (the oldest W, a backward of 0); the W left.
 * It needs m >= 2n, as PyTorch's does.
 *
 * Clocks in general: a computation runs one clock after the later of the
 * previous computation on its device and the one its input comes from
 * (forward (i, j - 1), backward (i, j + 1)).  For GPipe that gives the
 * table above; for any schedule it sorts every device's list and keeps
 * lockstep free of deadlock.
 *
 * Copies: stage j + 1 receives micro-batch i's activation at the start of
 * clock i + j + 1 (the clock of its forward); stage j - 1 receives the
 * gradient at the start of its backward clock.  In lockstep mode a copy of
 * clock k starts only when every computation of clock k - 1 has finished.
 *
 * Checkpointing: a checkpointed (i, j) keeps only its stage input during
 * forward; its backward is preceded by a recompute of the stage's forward.
 * Which pairs are checkpointed is the checkpoint module's policy
 * (gp_ckpt_checkpointed); the schedule only places the recomputes.
 *
 * The end of the step is instructions too (i = -1, clock `clocks`), after
 * each stage's last backward, in this order:
 *
 *     REDUCE_GRADS  replicas: stage j's gradients summed over the replicas
 *                   (all-reduce; reduce-scatter when sharded), right after
 *                   its backward, overlapping the earlier stages' backward.
 *                   Not on a fused stage (UPDATE sums them).
 *     REDUCE_STATS  replicas: batch-norm statistics merged over them.
 *     BARRIER       every stage of this pipeline through its list (and the
 *                   step's data freed), then, with replicas, every
 *                   replica's stage j too: nothing updates unless every
 *                   backward of every replica succeeded.
 *     CLIP          with clip_grad_norm, once per device after the
 *                   barrier: the squared norms of its stages' gradients
 *                   summed with every other device's (and replica's)
 *                   into the global norm, and the gradients scaled down
 *                   to the limit where they exceed it.  No stage is fused
 *                   then (the norm needs every sum before any update).
 *     COMMIT        batch-norm running statistics of the mini-batch.
 *     UPDATE        the optimizer on stage j's layers: all of each tensor,
 *                   this replica's chunk (shard), or the fused sharded step
 *                   (sum, chunk update and all-gather as one collective).
 *     GATHER        sharded, not fused: the parameters all-gathered.
 *     CHECK         every parameter and buffer of the stage finite: a run
 *                   that diverged stops here, naming the tensor, instead
 *                   of training on (ReLU would hide a NaN from the loss).
 *                   Enqueued into a flag on the device; the executor reads
 *                   it with the step's losses in the device's one host
 *                   wait, after the list (pipeline.c, read_results).
 *
 * Stage 0 is fused when sharded: its backward ends last, so a reduce-
 * scatter right after it would overlap nothing.  The executor runs the
 * lists as they are and the simulator replays them, so what runs and what
 * is simulated are the same instructions.
 *
 * Owns: the schedules, pure functions of their options.  May call: core
 * and checkpoint (the policy: which micro-batches recompute).  The executor
 * (pipeline.c) and the simulator (balance) replay the lists.
 *
 * Memory: gp_schedule owns its lists; gp_schedule_free releases them.
 * Thread safety: pure functions; a schedule is read-only once made.
 */
#ifndef GP_SCHEDULE_H
#define GP_SCHEDULE_H

#include "checkpoint/checkpoint.h"

#define GP_MAX_DEVICES 64  /* stages (devices) in one pipeline */

typedef enum {
    GP_SCHEDULE_GPIPE = 0,
    GP_SCHEDULE_1F1B,
    GP_SCHEDULE_ZB_H1,
    GP_SCHEDULE_INTERLEAVED,
    GP_SCHEDULE_ZB_V,
    GP_SCHEDULE_DUALPIPE_V,
    GP_SCHEDULE_V_HALF,
    GP_SCHEDULE_V_MIN,
    /* a schedule read from a file (pipeline.schedule: {file: F}), its
     * stages placed in loops or in a V: not among the KINDS the planner
     * and the tests walk */
    GP_SCHEDULE_FILE,
    GP_SCHEDULE_FILE_V
} gp_schedule_kind;
#define GP_SCHEDULE_KINDS 8 /* the built-in ones, gpipe .. v-min */
/* "gpipe", "1f1b", "zb-h1", "interleaved", "zb-v", "dualpipe-v", "v-half",
 * "v-min" */
const char *gp_schedule_kind_name(gp_schedule_kind k);
/* Whether schedule k places its stages in a V (zb-v: 2n stages, device d
 * holding stages d and 2n - 1 - d) rather than in loops (stage j on device
 * j mod n: one stage each, or interleaved's v). */
bool gp_schedule_v_shape(gp_schedule_kind k);
/* pipeline.lockstep's default for schedule k: lockstep (a copy of clock k
 * waits for every computation of the clocks before it, torchgpipe's rule)
 * for gpipe's fill-drain only.  Every other schedule reorders a device's
 * work across clocks, so lockstep holds its copies behind work they do
 * not need: on 2 CPU devices (AVX2 EPYC, 2026-11-30, bench/README.md
 * "Lockstep by default") zb-v's bubble was 0.19 lockstep against
 * 0.03-0.04 free-running, interleaved's 0.17 against 0.06, and 1F1B's
 * the same either way.  The result is the same bits either way. */
static inline bool gp_lockstep_default(gp_schedule_kind k) { return k == GP_SCHEDULE_GPIPE; }
/* Stages per device: interleaved's v (virtual, >= 2), zb-v's 2, else 1. */
int gp_schedule_stages_per_device(gp_schedule_kind k, int virtual_stages);
/* The device of stage j of 2n placed in a V over n devices: d holds
 * stages d and 2n - 1 - d. */
static inline int gp_schedule_v_device(int n, int j) { return j < n ? j : 2 * n - 1 - j; }
/* The device of stage j (of n x stages per device) over n devices. */
static inline int gp_schedule_device_of(gp_schedule_kind k, int n, int j)
{
    if (k == GP_SCHEDULE_ZB_V || k == GP_SCHEDULE_DUALPIPE_V || k == GP_SCHEDULE_V_HALF ||
        k == GP_SCHEDULE_V_MIN || k == GP_SCHEDULE_FILE_V)
        return gp_schedule_v_device(n, j);
    return j % n;
}
/* The most micro-batches in flight on stage j (forwarded, their activations
 * not yet freed by the backward, or by backward-weights where it is split)
 * that schedule k allows: m for GPipe, min(n - j, m) for 1F1B,
 * min(n - j + 1, m) for ZB-H1. */
int gp_schedule_in_flight_bound(gp_schedule_kind k, int j, int n, int m);
/* V-Half's and V-Min's cap on a device's (micro-batch, stage) pairs in
 * flight over n devices: 2 ((n + 2) / 2) and 2 ((n + 4) / 3), at most
 * ZB-V's 2n; 2n for the other V schedules. */
int gp_schedule_v_budget(gp_schedule_kind k, int n);
/* The order in which every stage of schedule k runs its micro-batches'
 * backwards: GPipe from the last micro-batch, the others from the first
 * (the order gradients add up in, which the single-device reference
 * follows); and whether k runs each backward as two halves. */
bool gp_schedule_backward_ascending(gp_schedule_kind k);
bool gp_schedule_splits_backward(gp_schedule_kind k);
/* Interleaved: the most (micro-batch, stage) pairs in flight on device d of
 * n with v stages each: its warm-up forwards plus one, at most m v. */
int gp_schedule_interleaved_bound(int d, int n, int v, int m);
#define GP_MAX_CHUNKS 1024 /* micro-batches in one step */

typedef enum gp_instr_kind {
    GP_INSTR_RECV_ACT = 0, /* copy activation of (i, from) onto this device */
    GP_INSTR_FORWARD,      /* forward of (i, j) (loss too on the last stage) */
    GP_INSTR_RECV_GRAD,    /* copy gradient of (i, from)'s input onto this device */
    GP_INSTR_RECOMPUTE,    /* re-run forward of (i, j) from its stashed input */
    GP_INSTR_BACKWARD,     /* backward-data and backward-weights of (i, j) */
    GP_INSTR_BACKWARD_DATA,    /* zero bubble: backward-data of (i, j) alone */
    GP_INSTR_BACKWARD_WEIGHTS, /* zero bubble: its backward-weights, later */
    GP_INSTR_RECV_SKIP,    /* copy skip `skip` of (i, from), the stage that stashed it,
                              onto this device, the stage that pops it */
    GP_INSTR_RECV_SKIP_GRAD, /* copy its gradient from (i, from), the popping stage,
                                back to the stashing one */
    GP_INSTR_REDUCE_GRADS, /* the end of the step: see the table above */
    GP_INSTR_REDUCE_STATS,
    GP_INSTR_BARRIER,
    GP_INSTR_COMMIT,
    GP_INSTR_UPDATE,
    GP_INSTR_GATHER,
    GP_INSTR_CHECK,
    GP_INSTR_CLIP,
    GP_INSTR_KIND_COUNT
} gp_instr_kind;

const char *gp_instr_kind_name(gp_instr_kind k); /* "recv_act", "forward", ... */
/* Whether k is a micro-batch's (i >= 0), not the end of the step's. */
static inline bool gp_instr_per_micro_batch(gp_instr_kind k)
{
    return k <= GP_INSTR_RECV_SKIP_GRAD;
}
/* Whether k copies data between stages (and waits for its source). */
static inline bool gp_instr_copies(gp_instr_kind k)
{
    return k == GP_INSTR_RECV_ACT || k == GP_INSTR_RECV_GRAD || k == GP_INSTR_RECV_SKIP ||
           k == GP_INSTR_RECV_SKIP_GRAD;
}
/* Whether k computes (forward, recompute, backward or a half of it). */
static inline bool gp_instr_computes(gp_instr_kind k)
{
    return k == GP_INSTR_FORWARD || k == GP_INSTR_RECOMPUTE || k == GP_INSTR_BACKWARD ||
           k == GP_INSTR_BACKWARD_DATA || k == GP_INSTR_BACKWARD_WEIGHTS;
}
/* Whether k counts for lockstep's clocks (every computation but a
 * recompute, which shares its backward's clock): the executor and the
 * simulator wait for these. */
static inline bool gp_instr_clocked(gp_instr_kind k)
{
    return gp_instr_computes(k) && k != GP_INSTR_RECOMPUTE;
}
/* Whether k is the backward that makes dL/d input, what the previous stage
 * waits for (the whole backward, or its data half). */
static inline bool gp_instr_gives_grad(gp_instr_kind k)
{
    return k == GP_INSTR_BACKWARD || k == GP_INSTR_BACKWARD_DATA;
}

typedef struct gp_instr {
    gp_instr_kind kind;
    int i;      /* micro-batch; -1 for the end-of-step kinds */
    int j;      /* stage (the device running it) */
    int k;      /* clock, forward 0..m+n-2, backward m+n-1..2(m+n-1)-1;
                   end-of-step kinds: 2(m+n-1) */
    int from;   /* copies: the stage the data comes from */
    int skip;   /* RECV_SKIP, RECV_SKIP_GRAD: the model's skip number */
    bool checkpointed; /* forward keeps only its input; backward recomputes */
    bool shard;        /* REDUCE_GRADS: reduce-scatter; UPDATE: own chunk */
    bool fused;        /* UPDATE: sum, update and gather in one collective */
    bool replicas;     /* BARRIER: over the replicas too */
} gp_instr;

/* A backward-data whose weights half follows it on the device's list
 * (next) and that sends no input gradient (the model's first stage):
 * nothing waits for its data half alone, so the executor runs it as the
 * whole backward, which frees each layer's output gradient as it goes
 * instead of holding them all for the weights half, and the weights half
 * is then empty (ZB-V's B and W of stage 0; the same bits: each layer's
 * weight gradient is the same product, added in the same micro-batch
 * order).  The simulator's memory model follows it. */
static inline bool gp_instr_whole_backward(const gp_instr *in, const gp_instr *next)
{
    return in->kind == GP_INSTR_BACKWARD_DATA && in->j == 0 && next &&
           next->kind == GP_INSTR_BACKWARD_WEIGHTS && next->i == in->i && next->j == in->j;
}

/* The name of an instruction for timelines and Nsight ranges: "F3 s1",
 * "R3 s1", "B3 s1", "copy a3 s0->s1", "copy g3 s2->s1", "copy k3 s0->s3"
 * and "copy kg3 s3->s0" (skips), "reduce s1",
 * "update s1", ...  Writes at most len bytes (64 suffice). */
void gp_instr_name(const gp_instr *in, char *buf, size_t len);

/* A skip connection between two stages (layers.h's gp_skip, placed): the
 * model's skip `id` is stashed on stage `from` and popped on stage `to`
 * (from < to).  Each micro-batch's stash is copied straight from `from` to
 * `to` right before `to`'s forward (RECV_SKIP), not through the stages in
 * between, and its gradient straight back right before `from`'s backward
 * (RECV_SKIP_GRAD), each at the clock of the computation it feeds, so
 * lockstep keeps its meaning: a copy of clock k starts when clock k - 1
 * is done, and the stash's forward (the pop's backward) ran at an earlier
 * clock. */
typedef struct gp_skip_edge {
    int id, from, to;
} gp_skip_edge;

typedef struct gp_schedule_opts {
    gp_schedule_kind kind;
    int n;                  /* devices: stages, except interleaved (n v stages)
                               and zb-v (2 n) */
    int virtual_stages;     /* interleaved: v >= 2 stages per device */
    int m;                  /* micro-batches */
    gp_checkpoint_mode checkpoint;
    int replicas;           /* R; > 1 adds the reductions and the replicas' barrier */
    bool shard[GP_MAX_DEVICES]; /* R > 1: stage j's replicas shard its update
                                   (their devices can: gp_dev_can_shard) */
    bool update;            /* emit UPDATE (an optimizer is attached) */
    bool check;             /* emit CHECK (the non-finite check) */
    bool clip;              /* emit CLIP (with update: gradient clipping) */
    /* zb-h1: the order from stage j's measured times, durations[3 j + 0, 1,
     * 2] = forward, backward-data, backward-weights (seconds; NULL: one unit
     * each).  Any times give a valid order: they only move the weights
     * passes. */
    const double *durations;
    /* The skips that cross stages (n_skips of them; others need no copy). */
    const gp_skip_edge *skips;
    int n_skips;
    /* kind GP_SCHEDULE_FILE / _FILE_V: the orders, n ranks, n x
     * virtual_stages stages, m micro-batches (checked by
     * gp_schedule_file_read) */
    const struct gp_schedule_file *file;
} gp_schedule_opts;

typedef struct gp_schedule {
    gp_schedule_kind kind;
    int n;           /* devices (lists); device of stage j: dev_of[j]
                        (gp_schedule_device_of) */
    int stages;      /* n, or n v interleaved */
    int m;           /* micro-batches */
    int clocks;      /* of the computations and copies: 2 (m + n - 1) for
                        GPipe; the end of the step runs at clock `clocks` */
    gp_instr **list; /* list[d][0..count[d]): device d's, every stage of it */
    int *count;
    int dev_of[GP_MAX_DEVICES]; /* stage j's device */
} gp_schedule;

/* ---- schedules as text (schedule_file.c) ----------------------------------
 * PyTorch's per-rank action CSV (torch.distributed.pipelining's _dump_csv
 * and _load_csv): a row per rank, actions STAGE KIND MICRO-BATCH (`2F0`,
 * `1I3`, `1W3`, `0B1`, `0SEND_F1`, `1RECV_F1`, `1SEND_B0`, `0RECV_B0`). */
typedef enum {
    GP_SACT_F = 0, GP_SACT_I, GP_SACT_W, GP_SACT_B,
    GP_SACT_SEND_F, GP_SACT_RECV_F, GP_SACT_SEND_B, GP_SACT_RECV_B
} gp_sact_kind;
typedef struct gp_sact {
    uint8_t kind;   /* gp_sact_kind */
    int stage, mb;
    int rank, line, col; /* where it is written */
} gp_sact;
typedef struct gp_schedule_file {
    char path[1024];
    int n, stages, m;   /* ranks (devices), stages, micro-batches */
    bool v_shape;       /* placed in a V (else in loops: stage j on rank j % n) */
    bool split;         /* some backward split into I and W */
    bool has_comms;     /* sends and receives given (checked; gpipe places its own) */
    int row_line[GP_MAX_DEVICES];
    int len[GP_MAX_DEVICES];
    gp_sact *acts[GP_MAX_DEVICES]; /* rank r's, in its order (FSDP's actions left out) */
} gp_schedule_file;
/* Read and check path (schedule_file.c's header says what): n_devices
 * rows.  Errors name the file, the rank, line and column, and the action. */
gp_status gp_schedule_file_read(const char *path, int n_devices, gp_schedule_file *out);
void gp_schedule_file_free(gp_schedule_file *f);
/* "2F0" */
void gp_sact_name(const gp_sact *a, char *buf, size_t len);
/* s as such a file (written whole or not at all): each device's
 * forwards, backwards (I and W where split) and, where data crosses to
 * another device, the sends and receives; gpipe's own recomputes, skips'
 * copies and end of the step are not in the format. */
gp_status gp_schedule_write_csv(const gp_schedule *s, const char *path);

/* The schedule o->kind with the end of the step. */
gp_status gp_schedule_make(const gp_schedule_opts *o, gp_schedule *out);
/* GPipe's schedule for n stages and m micro-batches, one replica, with the
 * optimizer's update and the check. */
gp_status gp_schedule_gpipe(int n, int m, gp_checkpoint_mode ckpt, gp_schedule *out);
void gp_schedule_free(gp_schedule *s);

/* Sizes of m micro-batches of a batch of n: the first n % m get one more
 * sample than the rest (n = 10, m = 4 -> 3, 3, 2, 2), so stages see nearly
 * equal work; m > n or m > GP_MAX_CHUNKS is an error. */
gp_status gp_microbatch_split(int64_t n, int m, int64_t *sizes);

#endif /* GP_SCHEDULE_H */
