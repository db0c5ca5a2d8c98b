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
 * Copies: stage j + 1 receives micro-batch i's activation at the start of
 * clock i + j + 1 (the clock of its forward); stage j - 1 receives the
 * gradient at the start of its backward clock.  In lockstep mode a copy of
 * clock k starts only when every computation of clock k - 1 has finished.
 *
 * Checkpointing: a checkpointed (i, j) keeps only its stage input during
 * forward; its backward is preceded by a recompute of the stage's forward.
 * except_last checkpoints every micro-batch but the last (i = m - 1), whose
 * backward follows right after its forward.
 *
 * Memory: gp_schedule owns its lists; gp_schedule_free releases them.
 * Thread safety: pure functions; a schedule is read-only once made.
 */
#ifndef GP_SCHEDULE_H
#define GP_SCHEDULE_H

#include "core/core.h"

#define GP_MAX_DEVICES 64 /* stages (devices) in one pipeline */

typedef enum { GP_CKPT_ALWAYS = 0, GP_CKPT_EXCEPT_LAST, GP_CKPT_NEVER } gp_checkpoint_mode;

typedef enum gp_instr_kind {
    GP_INSTR_RECV_ACT = 0, /* copy activation of (i, j-1) onto this device */
    GP_INSTR_FORWARD,      /* forward of (i, j) (loss too on the last stage) */
    GP_INSTR_RECV_GRAD,    /* copy gradient of (i, j+1)'s input onto this device */
    GP_INSTR_RECOMPUTE,    /* re-run forward of (i, j) from its stashed input */
    GP_INSTR_BACKWARD,     /* backward-data and backward-weights of (i, j) */
    GP_INSTR_KIND_COUNT
} gp_instr_kind;

const char *gp_instr_kind_name(gp_instr_kind k); /* "recv_act", "forward", ... */

typedef struct gp_instr {
    gp_instr_kind kind;
    int i;      /* micro-batch */
    int j;      /* stage (the device running it) */
    int k;      /* clock, forward 0..m+n-2, backward m+n-1..2(m+n-1)-1 */
    bool checkpointed; /* forward keeps only its input; backward recomputes */
} gp_instr;

typedef struct gp_schedule {
    int n;           /* stages */
    int m;           /* micro-batches */
    int clocks;      /* 2 (m + n - 1) */
    gp_instr **list; /* list[j][0..count[j]) */
    int *count;
} gp_schedule;

/* GPipe's schedule for n stages and m micro-batches. */
gp_status gp_schedule_gpipe(int n, int m, gp_checkpoint_mode ckpt, gp_schedule *out);
void gp_schedule_free(gp_schedule *s);

/* Whether (i, j) is checkpointed under `ckpt` with m micro-batches. */
bool gp_schedule_checkpointed(gp_checkpoint_mode ckpt, int i, int m);

/* Sizes of m micro-batches of a batch of n: the first n % m get one more
 * sample than the rest (n = 10, m = 4 -> 3, 3, 2, 2), so stages see nearly
 * equal work; m > n is an error. */
gp_status gp_microbatch_split(int64_t n, int m, int64_t *sizes);

#endif /* GP_SCHEDULE_H */
