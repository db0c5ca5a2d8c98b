/*
 * test_schedule.c — exhaustive checks of GPipe's schedule for n in 1..8
 * stages, m in 1..32 micro-batches and every checkpoint mode: every (i, j)
 * forward and backward appears exactly once on device j; clocks equal the
 * earliest start of each computation in GPipe's dependency graph (an oracle
 * that never uses the schedule's formulas); dependencies are respected
 * along each device's list and across devices (by clock); copies sit where
 * data crosses devices; recompute precedes exactly the checkpointed
 * backwards.  Only the five kinds below are checked: others a schedule may
 * list (per-stage steps with i = -1) are ignored here.
 */
#include "pipeline/schedule.h"
#include "test.h"

enum { MAX_N = 8, MAX_M = 32 };

/* The kinds this test knows. */
static bool known_kind(gp_instr_kind k)
{
    switch (k) {
    case GP_INSTR_RECV_ACT:
    case GP_INSTR_FORWARD:
    case GP_INSTR_RECV_GRAD:
    case GP_INSTR_RECOMPUTE:
    case GP_INSTR_BACKWARD: return true;
    default: return false;
    }
}

/* The zero-bubble halves too (check_kind, run_lists). */
static bool known_split(gp_instr_kind k)
{
    return known_kind(k) || k == GP_INSTR_BACKWARD_DATA || k == GP_INSTR_BACKWARD_WEIGHTS;
}
static bool is_backward(gp_instr_kind k)
{
    return k == GP_INSTR_BACKWARD || k == GP_INSTR_BACKWARD_DATA;
}

/* The oracle: GPipe's dependency graph, from the paper's figure 2(c), and
 * the earliest clock of each computation in it, by longest path.  Each
 * computation takes one clock and may start one clock after everything it
 * depends on:
 *   forward (i, j)  needs forward (i, j-1) (its input) and forward
 *                   (i-1, j) (device j runs micro-batches in order);
 *   backward (i, j) needs its own forward (i, j), backward (i, j+1) (its
 *                   output's gradient) and backward (i+1, j) (device j
 *                   runs backwards in reverse micro-batch order).
 * A copy runs at the clock of the computation it feeds, a recompute at
 * its backward's.  Memoised in clock[phase][i][j], -1 = not yet known. */
typedef struct {
    int n, m;
    int clock[2][MAX_M][MAX_N];
} oracle;

enum { FWD = 0, BWD = 1 };

static int imax(int a, int b) { return a > b ? a : b; }

static int earliest(oracle *o, int phase, int i, int j)
{
    int *k = &o->clock[phase][i][j];
    if (*k >= 0) return *k;
    int start = 0;
    if (phase == FWD) {
        if (j > 0) start = imax(start, earliest(o, FWD, i, j - 1) + 1);
        if (i > 0) start = imax(start, earliest(o, FWD, i - 1, j) + 1);
    } else {
        start = earliest(o, FWD, i, j) + 1;
        if (j < o->n - 1) start = imax(start, earliest(o, BWD, i, j + 1) + 1);
        if (i < o->m - 1) start = imax(start, earliest(o, BWD, i + 1, j) + 1);
    }
    return *k = start;
}

static void oracle_init(oracle *o, int n, int m)
{
    o->n = n;
    o->m = m;
    memset(o->clock, 0xff, sizeof o->clock);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) earliest(o, BWD, i, j);
}

/* The clock the oracle gives an instruction of a known kind. */
static int oracle_clock(const oracle *o, const gp_instr *in)
{
    bool fwd = in->kind == GP_INSTR_RECV_ACT || in->kind == GP_INSTR_FORWARD;
    return o->clock[fwd ? FWD : BWD][in->i][in->j];
}

/* The checkpointing policy's question, answered from a device's list: is
 * the next computation after (i, j)'s forward its own backward (or its
 * data half)?  Copies and the recompute in between are not computations
 * of another micro-batch. */
static bool backward_next(const gp_schedule *s, int i, int j)
{
    int d = s->dev_of[j];
    for (int c = 0; c < s->count[d]; c++) {
        const gp_instr *in = &s->list[d][c];
        if (in->kind != GP_INSTR_FORWARD || in->i != i || in->j != j) continue;
        for (int c2 = c + 1; c2 < s->count[d]; c2++) {
            const gp_instr *nx = &s->list[d][c2];
            if (nx->kind == GP_INSTR_BACKWARD || nx->kind == GP_INSTR_BACKWARD_DATA)
                return nx->i == i && nx->j == j;
            if (nx->kind == GP_INSTR_FORWARD || nx->kind == GP_INSTR_BACKWARD_WEIGHTS) return false;
        }
        return false;
    }
    return false;
}

/* Whether (i, j) recomputes, from the mode and the list alone. */
static bool want_ck(gp_checkpoint_mode ck, const gp_schedule *s, int i, int j)
{
    return ck == GP_CKPT_ALWAYS || (ck == GP_CKPT_EXCEPT_LAST && !backward_next(s, i, j));
}

static void check_one(int n, int m, gp_checkpoint_mode ck)
{
    gp_schedule s;
    CHECK_OK(gp_schedule_gpipe(n, m, ck, &s));
    oracle o;
    oracle_init(&o, n, m);
    /* s.clocks counts the clocks the computations and copies use, at least
     * the oracle's (the end of the step sits at clock s.clocks, after them:
     * end_of_step() checks it) */
    int last_oracle = 0, last_used = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) last_oracle = imax(last_oracle, o.clock[BWD][i][j]);
    for (int j = 0; j < n; j++)
        for (int c = 0; c < s.count[j]; c++)
            if (known_kind(s.list[j][c].kind)) last_used = imax(last_used, s.list[j][c].k);
    CHECK_MSG(s.clocks == last_used + 1 && s.clocks >= last_oracle + 1,
              "n=%d m=%d: %d clocks; instructions use %d, the oracle needs %d", n, m, s.clocks,
              last_used + 1, last_oracle + 1);
    int ok_once = 1, ok_clock = 1, ok_order = 1, ok_copy = 1, ok_ck = 1;
    for (int j = 0; j < n; j++) {
        int seen[GP_INSTR_KIND_COUNT][MAX_M] = {{0}};
        int last_k = -1;
        /* computations (forward or backward) per clock on this device */
        int busy[2 * (MAX_M + MAX_N)] = {0};
        for (int c = 0; c < s.count[j]; c++) {
            gp_instr *in = &s.list[j][c];
            if (!known_kind(in->kind)) continue; /* the end of the step: end_of_step() */
            if (in->j != j || in->i < 0 || in->i >= m) { ok_once = 0; continue; }
            seen[in->kind][in->i]++;
            /* clocks: the oracle's, and one computation per device per clock */
            if (in->k != oracle_clock(&o, in)) ok_clock = 0;
            if (in->kind == GP_INSTR_FORWARD || in->kind == GP_INSTR_BACKWARD) {
                if (in->k < 0 || in->k >= 2 * (MAX_M + MAX_N)) ok_clock = 0;
                else if (busy[in->k]++) ok_clock = 0;
            }
            /* a device's list never goes back in clock */
            if (in->k < last_k) ok_order = 0;
            last_k = in->k;
            /* inside one device: the forward of i needs its input first,
             * the backward of i its forward, its gradient and recompute */
            if (in->kind == GP_INSTR_FORWARD && j > 0 && !seen[GP_INSTR_RECV_ACT][in->i]) ok_order = 0;
            if (in->kind == GP_INSTR_BACKWARD) {
                if (!seen[GP_INSTR_FORWARD][in->i]) ok_order = 0;
                if (j < n - 1 && !seen[GP_INSTR_RECV_GRAD][in->i]) ok_order = 0;
                if (in->checkpointed != !!seen[GP_INSTR_RECOMPUTE][in->i]) ok_ck = 0;
                /* micro-batch i before i-1: all of i+1.. done already */
                for (int i2 = 0; i2 < in->i; i2++)
                    if (seen[GP_INSTR_BACKWARD][i2]) ok_order = 0;
            }
            /* GPipe's schedule: except_last keeps the last micro-batch (the
             * one whose backward follows its forward), on every stage */
            bool gpipe_ck = ck == GP_CKPT_ALWAYS || (ck == GP_CKPT_EXCEPT_LAST && in->i < m - 1);
            if (in->checkpointed != gpipe_ck || gpipe_ck != want_ck(ck, &s, in->i, j)) ok_ck = 0;
        }
        for (int i = 0; i < m; i++) {
            if (seen[GP_INSTR_FORWARD][i] != 1 || seen[GP_INSTR_BACKWARD][i] != 1) ok_once = 0;
            if (seen[GP_INSTR_RECV_ACT][i] != (j > 0)) ok_copy = 0;
            if (seen[GP_INSTR_RECV_GRAD][i] != (j < n - 1)) ok_copy = 0;
            if (seen[GP_INSTR_RECOMPUTE][i] !=
                (ck == GP_CKPT_ALWAYS || (ck == GP_CKPT_EXCEPT_LAST && i < m - 1)))
                ok_ck = 0;
        }
    }
    /* across devices: forward (i, j) is a clock after forward (i, j-1);
     * backward (i, j) a clock after backward (i, j+1). */
    for (int j = 1; j < n; j++)
        for (int c = 0; c < s.count[j]; c++) {
            gp_instr *in = &s.list[j][c];
            for (int c2 = 0; c2 < s.count[j - 1]; c2++) {
                gp_instr *p = &s.list[j - 1][c2];
                if (!known_kind(in->kind) || !known_kind(p->kind) || p->i != in->i) continue;
                if (in->kind == GP_INSTR_FORWARD && p->kind == GP_INSTR_FORWARD && p->k != in->k - 1)
                    ok_order = 0;
                if (in->kind == GP_INSTR_BACKWARD && p->kind == GP_INSTR_BACKWARD && p->k != in->k + 1)
                    ok_order = 0;
            }
        }
    CHECK_MSG(ok_once, "n=%d m=%d ck=%d: forward/backward not exactly once", n, m, ck);
    CHECK_MSG(ok_clock, "n=%d m=%d ck=%d: clocks", n, m, ck);
    CHECK_MSG(ok_order, "n=%d m=%d ck=%d: dependency order", n, m, ck);
    CHECK_MSG(ok_copy, "n=%d m=%d ck=%d: copies", n, m, ck);
    CHECK_MSG(ok_ck, "n=%d m=%d ck=%d: checkpointing", n, m, ck);
    gp_schedule_free(&s);
}

/* n = 3, m = 3 written out by hand from the GPipe paper's figure 2(c)
 * (torchgpipe's docs draw the same): row k is clock k, column j stage j;
 * Fi / Bi = forward / backward of micro-batch i, ".." idle. */
static const char *const table_3x3[10] = {
    "F0 .. ..",
    "F1 F0 ..",
    "F2 F1 F0",
    ".. F2 F1",
    ".. .. F2",
    ".. .. B2",
    ".. B2 B1",
    "B2 B1 B0",
    "B1 B0 ..",
    "B0 .. ..",
};

/* The cell of table_3x3 that (kind, i, j) should occupy at clock k. */
static bool in_table(char kind, int i, int j, int k)
{
    if (k < 0 || k >= 10) return false;
    const char *cell = table_3x3[k] + 3 * j;
    return cell[0] == kind && cell[1] == '0' + i;
}

static void test_table(void)
{
    gp_schedule s;
    CHECK_OK(gp_schedule_gpipe(3, 3, GP_CKPT_NEVER, &s));
    CHECK(s.clocks == 10);
    /* every forward and backward where the table puts it, and the table's
     * 18 cells all filled (each instruction is checked to be in one, and
     * there are 18 of them) */
    int placed = 0, misplaced = 0, known[3] = {0};
    for (int j = 0; j < 3; j++)
        for (int c = 0; c < s.count[j]; c++) {
            gp_instr *in = &s.list[j][c];
            if (!known_kind(in->kind)) continue;
            known[j]++;
            if (in->kind != GP_INSTR_FORWARD && in->kind != GP_INSTR_BACKWARD) continue;
            placed++;
            if (!in_table(in->kind == GP_INSTR_FORWARD ? 'F' : 'B', in->i, j, in->k)) {
                misplaced++;
                fprintf(stderr, "%s (%d, %d) at clock %d\n", gp_instr_kind_name(in->kind), in->i,
                        j, in->k);
            }
        }
    CHECK_MSG(placed == 18 && misplaced == 0, "%d computations, %d not where the table says",
              placed, misplaced);
    /* the oracle draws the same table */
    oracle o;
    oracle_init(&o, 3, 3);
    bool same = true;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            same = same && in_table('F', i, j, o.clock[FWD][i][j]) &&
                   in_table('B', i, j, o.clock[BWD][i][j]);
    CHECK_MSG(same, "the oracle disagrees with the hand-written table");
    /* never: no recompute at all; stage 0 has 3 F + 3 B + 3 recv_grad, and
     * every stage ends with barrier, commit, update and check */
    CHECK(known[0] == 9 && known[1] == 12 && known[2] == 9);
    CHECK(s.count[0] == 13 && s.count[1] == 16 && s.count[2] == 13);
    gp_schedule_free(&s);
    CHECK_ERR(gp_schedule_gpipe(0, 3, GP_CKPT_NEVER, &s), GP_ERR_INVALID, "1..64 stages");
    CHECK_ERR(gp_schedule_gpipe(2, GP_MAX_CHUNKS + 1, GP_CKPT_NEVER, &s), GP_ERR_INVALID,
              "1..1024 micro-batches");
}

/* The end of the step, written out by hand for each case (schedule.h's
 * table): which instructions follow a stage's last backward, in order. */
static void end_of_step(void)
{
    enum { RG = GP_INSTR_REDUCE_GRADS, RS = GP_INSTR_REDUCE_STATS, BA = GP_INSTR_BARRIER,
           CO = GP_INSTR_COMMIT, UP = GP_INSTR_UPDATE, GA = GP_INSTR_GATHER,
           CH = GP_INSTR_CHECK, CL = GP_INSTR_CLIP };
    struct {
        int R;
        bool shard, update;
        int stage;     /* which stage's tail */
        int want[10];  /* kinds, -1 ends */
        int up_shard, up_fused, rg_shard;
        bool clip;
    } cases[] = {
        {1, false, true, 0, {BA, CO, UP, CH, -1}, 0, 0, 0, false},
        {1, true, true, 1, {BA, CO, UP, CH, -1}, 0, 0, 0, false},   /* one replica: nothing to shard */
        {1, false, false, 0, {BA, CO, CH, -1}, 0, 0, 0, false},
        {2, false, true, 0, {RG, RS, BA, CO, UP, CH, -1}, 0, 0, 0, false},
        {2, false, true, 2, {RG, RS, BA, CO, UP, CH, -1}, 0, 0, 0, false},
        {3, true, true, 0, {RS, BA, CO, UP, CH, -1}, 1, 1, 0, false},       /* stage 0 fused */
        {3, true, true, 1, {RG, RS, BA, CO, UP, GA, CH, -1}, 1, 0, 1, false},
        {2, true, false, 1, {RG, RS, BA, CO, CH, -1}, 0, 0, 0, false}, /* no update: sum in full */
        /* clipping: the clip after the barrier, and stage 0 not fused (the
         * norm needs every sum before any update) */
        {1, false, true, 0, {BA, CL, CO, UP, CH, -1}, 0, 0, 0, true},
        {3, true, true, 0, {RG, RS, BA, CL, CO, UP, GA, CH, -1}, 1, 0, 1, true},
        {2, true, false, 1, {RG, RS, BA, CO, CH, -1}, 0, 0, 0, true}, /* no update: no clip */
    };
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        gp_schedule_opts o = {.n = 3, .m = 4, .checkpoint = GP_CKPT_EXCEPT_LAST,
                              .replicas = cases[q].R, .update = cases[q].update, .check = true,
                              .clip = cases[q].clip};
        for (int j = 0; j < 3; j++) o.shard[j] = cases[q].shard;
        gp_schedule s;
        CHECK_OK(gp_schedule_make(&o, &s));
        int j = cases[q].stage, c = 0;
        while (c < s.count[j] && s.list[j][c].kind <= GP_INSTR_BACKWARD) c++;
        int ok = 1, w = 0;
        for (; c < s.count[j]; c++, w++) {
            const gp_instr *in = &s.list[j][c];
            if ((int)in->kind != cases[q].want[w] || in->i != -1 || in->j != j ||
                in->k != s.clocks)
                ok = 0;
            if (in->kind == GP_INSTR_UPDATE &&
                (in->shard != cases[q].up_shard || in->fused != cases[q].up_fused))
                ok = 0;
            if (in->kind == GP_INSTR_REDUCE_GRADS && in->shard != cases[q].rg_shard) ok = 0;
            if (in->kind == GP_INSTR_BARRIER && in->replicas != (cases[q].R > 1)) ok = 0;
        }
        CHECK_MSG(ok && cases[q].want[w] == -1,
                  "case %zu (R=%d shard=%d update=%d) stage %d: end of step differs", q,
                  cases[q].R, cases[q].shard, cases[q].update, j);
        gp_schedule_free(&s);
    }
}

/* Every schedule kind against the rules any schedule must keep, for
 * n in 1..8, m in 1..32, every checkpoint mode:
 *   - each forward and backward of (i, j) once on device j, a recompute
 *     exactly for the checkpointed ones, an activation copy on j > 0 and a
 *     gradient copy on j < n - 1, each before what uses it, the recompute
 *     after the forward and before the backward;
 *   - clocks never go back along a device's list; forward (i, j) after
 *     forward (i, j - 1), backward (i, j) after backward (i, j + 1);
 *   - micro-batches in flight (forwarded, not yet backwarded) on stage j
 *     never above the schedule's bound, which 1F1B reaches;
 *   - executed with the executor's rules for copies (lockstep: every
 *     computation of clocks < k done; free-running: the source done), every
 *     device gets to the end of its list: no deadlock. */
enum { SF = 0, SB = 1 };
static bool run_lists(const gp_schedule *s, bool lockstep)
{
    int n = s->n, pc[MAX_N] = {0};
    GP_ASSERT(s->clocks <= 3 * MAX_M * MAX_N);
    static bool done[2][MAX_M][MAX_N];
    static int left_at[3 * MAX_M * MAX_N + 8]; /* clocks <= the computations */
    memset(done, 0, sizeof done);
    memset(left_at, 0, sizeof left_at);
    for (int j = 0; j < n; j++)
        for (int c = 0; c < s->count[j]; c++) {
            const gp_instr *in = &s->list[j][c];
            if (in->kind == GP_INSTR_FORWARD || is_backward(in->kind) ||
                in->kind == GP_INSTR_BACKWARD_WEIGHTS)
                left_at[in->k]++;
        }
    for (bool moved = true; moved;) {
        moved = false;
        for (int j = 0; j < n; j++)
            while (pc[j] < s->count[j]) {
                const gp_instr *in = &s->list[j][pc[j]];
                if (!known_split(in->kind)) {
                    pc[j]++;
                    continue;
                }
                bool copy = in->kind == GP_INSTR_RECV_ACT || in->kind == GP_INSTR_RECV_GRAD;
                if (copy) {
                    int front = 0; /* every computation of clocks < front done */
                    while (front < s->clocks && left_at[front] == 0) front++;
                    bool ready = lockstep ? in->k <= front
                                          : done[in->kind == GP_INSTR_RECV_ACT ? SF : SB][in->i]
                                                [in->from];
                    if (!ready) break;
                }
                if (in->kind == GP_INSTR_FORWARD || is_backward(in->kind)) {
                    done[in->kind == GP_INSTR_FORWARD ? SF : SB][in->i][j] = true;
                    left_at[in->k]--;
                }
                if (in->kind == GP_INSTR_BACKWARD_WEIGHTS) left_at[in->k]--;
                pc[j]++;
                moved = true;
            }
    }
    for (int j = 0; j < n; j++)
        if (pc[j] < s->count[j]) return false;
    return true;
}

/* Every computation and copy of s within its s->clocks clocks, and the
 * end of each device's step at clock s->clocks: the executor sizes its
 * per-clock tables by s->clocks (pipeline.c, prepare), so a clock past it
 * (a backward-weights after every backward, zb-h1 and the V schedules) is
 * written outside them. */
static bool clocks_cover(const gp_schedule *s)
{
    for (int d = 0; d < s->n; d++)
        for (int c = 0; c < s->count[d]; c++) {
            const gp_instr *in = &s->list[d][c];
            if (gp_instr_per_micro_batch(in->kind) ? in->k < 0 || in->k >= s->clocks
                                                   : in->k != s->clocks)
                return false;
        }
    return true;
}

/* dur: zb-h1's stage times (NULL: units); with times the bound need not
 * be reached. */
static void check_kind_dur(gp_schedule_kind kind, int n, int m, gp_checkpoint_mode ck,
                           const double *dur)
{
    gp_schedule_opts o = {.kind = kind, .n = n, .m = m, .checkpoint = ck, .replicas = 1,
                          .update = true, .check = true, .durations = dur};
    gp_schedule s;
    CHECK_OK(gp_schedule_make(&o, &s));
    static int at[GP_INSTR_KIND_COUNT][MAX_M][MAX_N], clk[2][MAX_M][MAX_N];
    memset(at, -1, sizeof at);
    int ok_once = 1, ok_order = 1, ok_clock = 1, ok_flight = 1, reached = 1;
    for (int j = 0; j < n; j++) {
        int last_k = -1, flight = 0, peak = 0;
        for (int c = 0; c < s.count[j]; c++) {
            const gp_instr *in = &s.list[j][c];
            if (!known_split(in->kind)) continue;
            if (in->i < 0 || in->i >= m || in->j != j || at[in->kind][in->i][j] >= 0) {
                ok_once = 0;
                continue;
            }
            at[in->kind][in->i][j] = c;
            if (in->k < last_k) ok_clock = 0;
            last_k = in->k;
            if (in->kind == GP_INSTR_FORWARD) clk[SF][in->i][j] = in->k, flight++;
            if (is_backward(in->kind)) clk[SB][in->i][j] = in->k;
            /* activations are freed by the backward, or its weights half */
            if (in->kind == GP_INSTR_BACKWARD || in->kind == GP_INSTR_BACKWARD_WEIGHTS) flight--;
            if (flight > peak) peak = flight;
        }
        int bound = gp_schedule_in_flight_bound(kind, j, n, m);
        if (peak > bound) ok_flight = 0;
        if (peak != bound) reached = 0;
        for (int i = 0; i < m; i++) {
            bool split = kind == GP_SCHEDULE_ZB_H1;
            int f = at[GP_INSTR_FORWARD][i][j];
            int b = at[split ? GP_INSTR_BACKWARD_DATA : GP_INSTR_BACKWARD][i][j];
            int w = at[GP_INSTR_BACKWARD_WEIGHTS][i][j];
            int r = at[GP_INSTR_RECOMPUTE][i][j], ra = at[GP_INSTR_RECV_ACT][i][j];
            int rg = at[GP_INSTR_RECV_GRAD][i][j];
            bool want_r = want_ck(ck, &s, i, j);
            /* 1F1B and ZB-H1: the last stage runs each backward right after
             * its forward, so except_last recomputes nothing there */
            if (kind != GP_SCHEDULE_GPIPE && ck == GP_CKPT_EXCEPT_LAST && j == n - 1 && want_r)
                ok_once = 0;
            if (f < 0 || b < 0 || (r >= 0) != want_r || (ra >= 0) != (j > 0) ||
                (rg >= 0) != (j < n - 1) || (w >= 0) != split ||
                at[split ? GP_INSTR_BACKWARD : GP_INSTR_BACKWARD_DATA][i][j] >= 0)
                ok_once = 0;
            if (split && w < b) ok_order = 0;
            if (b < f || (want_r && (r < f || r > b)) || (j > 0 && ra > f) ||
                (j < n - 1 && rg > b))
                ok_order = 0;
        }
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            if (j > 0 && clk[SF][i][j] <= clk[SF][i][j - 1]) ok_clock = 0;
            if (j < n - 1 && clk[SB][i][j] <= clk[SB][i][j + 1]) ok_clock = 0;
        }
    const char *kn = gp_schedule_kind_name(kind);
    CHECK_MSG(ok_once, "%s n=%d m=%d ck=%d: not each instruction once", kn, n, m, ck);
    CHECK_MSG(ok_order, "%s n=%d m=%d ck=%d: a use before its input", kn, n, m, ck);
    CHECK_MSG(ok_clock, "%s n=%d m=%d ck=%d: clocks", kn, n, m, ck);
    CHECK_MSG(ok_flight && (reached || dur), "%s n=%d m=%d ck=%d: in flight above (or never at) "
              "the bound", kn, n, m, ck);
    CHECK_MSG(run_lists(&s, true) && run_lists(&s, false), "%s n=%d m=%d ck=%d: deadlock", kn, n,
              m, ck);
    CHECK_MSG(clocks_cover(&s), "%s n=%d m=%d ck=%d: an instruction past the step's %d clocks",
              kn, n, m, ck, s.clocks);
    gp_schedule_free(&s);
}

/* Interleaved 1F1B, n devices x v stages each, m a multiple of n: every
 * forward and backward of (i, s) once, on device s % n, with the copies;
 * dependencies in clock order; (micro-batch, stage) pairs in flight on
 * device d within gp_schedule_interleaved_bound and reaching it; lockstep
 * and free-running execution finish.  m not a multiple of n, v < 2 and
 * one device are refused. */
static bool run_interleaved(const gp_schedule *s, bool lockstep)
{
    int n = s->n, S = s->stages, pc[MAX_N] = {0};
    static bool done[2][MAX_M][64];
    static int left_at[8 * (MAX_M + 64)];
    GP_ASSERT(s->clocks <= 8 * (MAX_M + 64));
    memset(done, 0, sizeof done);
    memset(left_at, 0, sizeof left_at);
    (void)S;
    for (int d = 0; d < n; d++)
        for (int c = 0; c < s->count[d]; c++)
            if (s->list[d][c].kind == GP_INSTR_FORWARD || s->list[d][c].kind == GP_INSTR_BACKWARD)
                left_at[s->list[d][c].k]++;
    for (bool moved = true; moved;) {
        moved = false;
        for (int d = 0; d < n; d++)
            while (pc[d] < s->count[d]) {
                const gp_instr *in = &s->list[d][pc[d]];
                if (in->kind == GP_INSTR_RECV_ACT || in->kind == GP_INSTR_RECV_GRAD) {
                    int front = 0;
                    while (front < s->clocks && left_at[front] == 0) front++;
                    bool ready = lockstep ? in->k <= front
                                          : done[in->kind == GP_INSTR_RECV_ACT ? SF : SB][in->i]
                                                [in->from];
                    if (!ready) break;
                }
                if (in->kind == GP_INSTR_FORWARD || in->kind == GP_INSTR_BACKWARD) {
                    done[in->kind == GP_INSTR_FORWARD ? SF : SB][in->i][in->j] = true;
                    left_at[in->k]--;
                }
                pc[d]++;
                moved = true;
            }
    }
    for (int d = 0; d < n; d++)
        if (pc[d] < s->count[d]) return false;
    return true;
}

static void check_interleaved(void)
{
    int cases = 0, bad = 0;
    for (int n = 2; n <= MAX_N; n++)
        for (int v = 2; v <= 4 && n * v <= 64; v++)
            for (int m = n; m <= MAX_M; m += n)
                for (int ck = 0; ck < 3; ck++) {
                    gp_schedule_opts o = {.kind = GP_SCHEDULE_INTERLEAVED, .n = n, .m = m,
                                          .virtual_stages = v, .checkpoint = (gp_checkpoint_mode)ck,
                                          .replicas = 1, .update = true, .check = true};
                    gp_schedule s;
                    if (gp_schedule_make(&o, &s) != GP_OK) {
                        CHECK_MSG(0, "interleaved n=%d v=%d m=%d: %s", n, v, m, gp_last_error());
                        continue;
                    }
                    int S = n * v;
                    static int fk[MAX_M][64], bk[MAX_M][64], seen[2][MAX_M][64], kept[MAX_M][64];
                    memset(seen, 0, sizeof seen);
                    memset(kept, 0, sizeof kept); /* +1 per checkpointed forward, -1 per recompute */
                    bool ok = s.stages == S;
                    for (int d = 0; d < n; d++) {
                        int flight = 0, peak = 0, last = -1;
                        for (int c = 0; c < s.count[d]; c++) {
                            const gp_instr *in = &s.list[d][c];
                            if (!gp_instr_per_micro_batch(in->kind)) continue;
                            if (in->j % n != d || in->k < last) ok = false;
                            last = in->k;
                            if ((in->kind == GP_INSTR_FORWARD || in->kind == GP_INSTR_BACKWARD) &&
                                in->checkpointed != want_ck((gp_checkpoint_mode)ck, &s, in->i, in->j))
                                ok = false;
                            if (in->kind == GP_INSTR_RECOMPUTE) {
                                if (!want_ck((gp_checkpoint_mode)ck, &s, in->i, in->j)) ok = false;
                                kept[in->i][in->j]--;
                            }
                            if (in->kind == GP_INSTR_FORWARD) {
                                kept[in->i][in->j] += want_ck((gp_checkpoint_mode)ck, &s, in->i, in->j);
                                seen[SF][in->i][in->j]++;
                                fk[in->i][in->j] = in->k;
                                flight++;
                            } else if (in->kind == GP_INSTR_BACKWARD) {
                                seen[SB][in->i][in->j]++;
                                bk[in->i][in->j] = in->k;
                                if (!seen[SF][in->i][in->j]) ok = false;
                                flight--;
                            } else if (in->kind == GP_INSTR_RECV_ACT) {
                                if (in->j == 0 || in->from != in->j - 1) ok = false;
                            } else if (in->kind == GP_INSTR_RECV_GRAD) {
                                if (in->j == S - 1 || in->from != in->j + 1) ok = false;
                            }
                            if (flight > peak) peak = flight;
                        }
                        int bound = gp_schedule_interleaved_bound(d, n, v, m);
                        if (peak != bound) ok = false;
                    }
                    if (!clocks_cover(&s)) ok = false;
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < S; j++) {
                            if (seen[SF][i][j] != 1 || seen[SB][i][j] != 1 || kept[i][j]) ok = false;
                            if (j > 0 && fk[i][j] <= fk[i][j - 1]) ok = false;
                            if (j < S - 1 && bk[i][j] <= bk[i][j + 1]) ok = false;
                        }
                    ok = ok && run_interleaved(&s, true) && run_interleaved(&s, false);
                    cases++;
                    if (!ok) {
                        bad++;
                        fprintf(stderr, "interleaved n=%d v=%d m=%d ck=%d: wrong\n", n, v, m, ck);
                    }
                    gp_schedule_free(&s);
                }
    CHECK_MSG(bad == 0 && cases > 100, "interleaved: %d of %d cases wrong", bad, cases);
    gp_schedule_opts o = {.kind = GP_SCHEDULE_INTERLEAVED, .n = 2, .m = 3, .virtual_stages = 2,
                          .replicas = 1};
    gp_schedule s;
    CHECK_ERR(gp_schedule_make(&o, &s), GP_ERR_INVALID, "multiple of 2");
    o.m = 4;
    o.virtual_stages = 1;
    CHECK_ERR(gp_schedule_make(&o, &s), GP_ERR_INVALID, "pipeline.virtual >= 2");
    o.virtual_stages = 2;
    o.n = 1;
    o.m = 2;
    CHECK_ERR(gp_schedule_make(&o, &s), GP_ERR_INVALID, "2 or more devices");
}

/* The lists of s run with each computation one unit and copies free:
 * lockstep (a copy of clock k once every computation of clocks < k is
 * done) or free-running (once its source is done); false on a deadlock.
 * *span: the free-running step in units (NULL: not wanted). */
enum { RUN_M = 256 }; /* run_split's micro-batches: 8n on 32 devices */
static bool run_split(const gp_schedule *s, bool lockstep, int *span)
{
    int n = s->n, pc[64] = {0}, t[64] = {0};
    static int fin[2][RUN_M][64]; /* when the forward / backward(-data) of (i, j) ended, -1 */
    static int left_at[16 * (RUN_M + 64)];
    GP_ASSERT(s->m <= RUN_M && s->clocks <= 16 * (RUN_M + 64));
    memset(fin, -1, sizeof fin);
    memset(left_at, 0, sizeof left_at);
    for (int d = 0; d < n; d++)
        for (int c = 0; c < s->count[d]; c++)
            if (gp_instr_clocked(s->list[d][c].kind)) left_at[s->list[d][c].k]++;
    for (bool moved = true; moved;) {
        moved = false;
        for (int d = 0; d < n; d++)
            while (pc[d] < s->count[d]) {
                const gp_instr *in = &s->list[d][pc[d]];
                if (!gp_instr_per_micro_batch(in->kind)) {
                    pc[d]++;
                    continue;
                }
                if (in->kind == GP_INSTR_RECV_ACT || in->kind == GP_INSTR_RECV_GRAD) {
                    int front = 0;
                    while (front < s->clocks && left_at[front] == 0) front++;
                    int f = fin[in->kind == GP_INSTR_RECV_ACT ? SF : SB][in->i][in->from];
                    if (lockstep ? in->k > front : f < 0) break;
                    if (f > t[d]) t[d] = f;
                }
                if (gp_instr_clocked(in->kind)) {
                    t[d]++;
                    if (in->kind == GP_INSTR_FORWARD) fin[SF][in->i][in->j] = t[d];
                    if (gp_instr_gives_grad(in->kind)) fin[SB][in->i][in->j] = t[d];
                    left_at[in->k]--;
                }
                pc[d]++;
                moved = true;
            }
    }
    int end = 0;
    for (int d = 0; d < n; d++) {
        if (pc[d] < s->count[d]) return false;
        if (t[d] > end) end = t[d];
    }
    if (span) *span = end;
    return true;
}

/* ZB-V, n devices, 2n stages in a V, every m and checkpoint mode: every
 * forward, backward-data and backward-weights of (i, s) once, on device s
 * (s < n) or 2n - 1 - s, backward-weights after backward-data after the
 * forward, micro-batches in order on every stage (the order gradients add
 * up in, as on one device), the copies where they belong, the recomputes
 * exactly before the checkpointed backwards; clocks rising along every
 * list and along every micro-batch's path; at most 2n (micro-batch,
 * stage) pairs in flight on a device (1F1B's activation memory: each
 * stage is half a 1F1B stage) and at most the bound on each stage; both
 * executions finish; with unit times and m >= 2n the step is the device's
 * 6m units of work plus at most one F, B and W per stage of the path's
 * fill (the paper's near-zero bubble), where 1F1B over n stages of twice
 * the work takes 6m + 6(n - 1). */
/* check_v's measured times (zb-v's greedy order), NULL: units. */
static const double *v_durations;

static void check_v(gp_schedule_kind kind)
{
    bool dp = kind == GP_SCHEDULE_DUALPIPE_V; /* whole backwards too; m >= 2n */
    bool capped = kind == GP_SCHEDULE_V_HALF || kind == GP_SCHEDULE_V_MIN;
    const char *kn = gp_schedule_kind_name(kind);
    int cases = 0, bad = 0, want_cases = 0;
    for (int n = 1; n <= MAX_N; n++)
        for (int m = 1; m <= MAX_M; m++)
            for (int ck = 0; ck < 3; ck++) {
                if (dp && m < 2 * n) {
                    gp_schedule_opts o = {.kind = kind, .n = n, .m = m, .replicas = 1};
                    gp_schedule s;
                    if (ck == 0)
                        CHECK_ERR(gp_schedule_make(&o, &s), GP_ERR_INVALID,
                                  "at least as many micro-batches as stages");
                    continue;
                }
                want_cases++;
                gp_schedule_opts o = {.kind = kind, .n = n, .m = m,
                                      .checkpoint = (gp_checkpoint_mode)ck, .replicas = 1,
                                      .update = true, .check = true, .durations = v_durations};
                gp_schedule s;
                if (gp_schedule_make(&o, &s) != GP_OK) {
                    CHECK_MSG(0, "%s n=%d m=%d: %s", kn, n, m, gp_last_error());
                    continue;
                }
                int S = 2 * n;
                static int fk[MAX_M][64], bk[MAX_M][64], seen[3][MAX_M][64], kept[MAX_M][64];
                memset(seen, 0, sizeof seen);
                memset(kept, 0, sizeof kept);
                bool ok = s.stages == S;
                const char *why = "";
                for (int j = 0; j < S; j++)
                    if (s.dev_of[j] != (j < n ? j : S - 1 - j)) ok = false, why = "placement";
                for (int d = 0; d < n; d++) {
                    int flight = 0, peak = 0, last = -1, sflight[64] = {0};
                    int next[3][64] = {{0}}; /* the micro-batch each stage runs next, per kind */
                    for (int c = 0; c < s.count[d]; c++) {
                        const gp_instr *in = &s.list[d][c];
                        if (!gp_instr_per_micro_batch(in->kind)) continue;
                        int i = in->i, j = in->j;
                        if (s.dev_of[j] != d || in->k < last) ok = false, why = "device/clock";
                        last = in->k;
                        bool want = want_ck((gp_checkpoint_mode)ck, &s, i, j);
                        if ((in->kind == GP_INSTR_FORWARD || in->kind == GP_INSTR_BACKWARD_DATA ||
                             in->kind == GP_INSTR_BACKWARD) &&
                            in->checkpointed != want)
                            ok = false, why = "checkpointed";
                        switch (in->kind) {
                        case GP_INSTR_FORWARD:
                            if (next[0][j]++ != i) ok = false, why = "forward order";
                            kept[i][j] += want;
                            seen[0][i][j]++;
                            fk[i][j] = in->k;
                            flight++;
                            sflight[j]++;
                            if (!dp && sflight[j] > gp_schedule_in_flight_bound(kind, j, n, m))
                                ok = false, why = "stage in flight";
                            break;
                        case GP_INSTR_RECOMPUTE:
                            if (!want) ok = false, why = "recompute";
                            kept[i][j]--;
                            break;
                        case GP_INSTR_BACKWARD_DATA:
                            if (next[1][j]++ != i || !seen[0][i][j]) ok = false, why = "B order";
                            seen[1][i][j]++;
                            bk[i][j] = in->k;
                            break;
                        case GP_INSTR_BACKWARD_WEIGHTS:
                            if (next[2][j]++ != i || !seen[1][i][j]) ok = false, why = "W order";
                            seen[2][i][j]++;
                            flight--;
                            sflight[j]--;
                            break;
                        case GP_INSTR_BACKWARD: /* dualpipe-v: both halves at once */
                            if (!dp || next[1][j]++ != i || next[2][j]++ != i || !seen[0][i][j])
                                ok = false, why = "B order";
                            seen[1][i][j]++;
                            seen[2][i][j]++;
                            bk[i][j] = in->k;
                            flight--;
                            sflight[j]--;
                            break;
                        case GP_INSTR_RECV_ACT:
                            if (j == 0 || in->from != j - 1) ok = false, why = "recv act";
                            break;
                        case GP_INSTR_RECV_GRAD:
                            if (j == S - 1 || in->from != j + 1) ok = false, why = "recv grad";
                            break;
                        default: ok = false, why = "kind";
                        }
                        if (flight > peak) peak = flight;
                    }
                    /* dualpipe-v holds more: 2n on device 0, up to 3n at the turn;
                     * v-half and v-min their budgets (check_v_budgets) */
                    int budget = gp_schedule_v_budget(kind, n);
                    if (peak > (dp ? 3 * n : capped ? budget : S < 2 * m ? S : 2 * m))
                        ok = false, why = "device in flight";
                }
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < S; j++) {
                        if (seen[0][i][j] != 1 || seen[1][i][j] != 1 || seen[2][i][j] != 1 ||
                            kept[i][j])
                            ok = false, why = "once";
                        if (j > 0 && fk[i][j] <= fk[i][j - 1]) ok = false, why = "F clocks";
                        if (j < S - 1 && bk[i][j] <= bk[i][j + 1]) ok = false, why = "B clocks";
                    }
                if (ok && !clocks_cover(&s)) ok = false, why = "clocks past s.clocks";
                int span = 0;
                ok = ok && run_split(&s, true, NULL) && run_split(&s, false, &span);
                /* (a whole backward is one unit here, for two halves' work) */
                if (ok && !dp && !capped && !v_durations && m >= S && ck == 0 &&
                    span > 6 * m + 3 * S)
                    ok = false, why = "bubble";
                /* v-half and v-min: shorter than 1F1B over n stages of the
                 * same work, as the paper's n / 2m and 2n / 3m are */
                if (ok && capped && !v_durations && n > 1 && m >= S && ck == 0 &&
                    span >= 6 * m + 6 * (n - 1))
                    ok = false, why = "bubble";
                cases++;
                if (!ok) {
                    bad++;
                    fprintf(stderr, "%s n=%d m=%d ck=%d: wrong (%s; span %d)\n", kn, n, m, ck,
                            why, span);
                }
                gp_schedule_free(&s);
            }
    CHECK_MSG(bad == 0 && cases == want_cases && cases > 300, "%s: %d of %d cases wrong", kn,
              bad, cases);
    /* the bubble, against 1F1B's over n stages of the same (doubled) work */
    for (int n = 2; n <= 4 && !dp && !capped && !v_durations; n++) {
        gp_schedule_opts o = {.kind = kind, .n = n, .m = 4 * n, .replicas = 1};
        gp_schedule s;
        int span = 0;
        CHECK_OK(gp_schedule_make(&o, &s));
        CHECK(run_split(&s, false, &span));
        printf("%s n=%d m=%d: %d units for %d of work on each device (1F1B: %d)\n", kn, n,
               4 * n, span, 6 * 4 * n, 6 * 4 * n + 6 * (n - 1));
        CHECK_MSG(span < 6 * 4 * n + 6 * (n - 1), "%s n=%d: %d units, no shorter than 1F1B", kn,
                  n, span);
        gp_schedule_free(&s);
    }
}

/* V-Half's and V-Min's budgets against the paper's activation memory
 * (Qi et al., "Pipeline Parallelism with Controllable Memory", table 1: (n
 * + 2) / 2 and (n + 4) / 3 of 1F1B's n micro-batches, two (micro-batch,
 * stage) pairs each), on every n a V can have: V-Half's is the paper's,
 * V-Min's the paper's or up to 2 micro-batches more where the greedy
 * order would stall; and with unit times neither has a bubble that grows
 * with m (8n micro-batches take 24n units more than 4n, give or take 2).
 * Until 2026-12-01 the caps were n and (2n + 2) / 3: V-Min on 4 devices
 * had 44% bubble at every m. */
static void check_v_budgets(void)
{
    for (int n = 1; n <= 32; n++)
        for (int q = 0; q < 2; q++) {
            gp_schedule_kind kind = q ? GP_SCHEDULE_V_MIN : GP_SCHEDULE_V_HALF;
            int paper = q ? 2 * ((n + 4) / 3) : 2 * ((n + 2) / 2);
            if (paper > 2 * n) paper = 2 * n;
            int b = gp_schedule_v_budget(kind, n);
            CHECK_MSG(q ? b >= paper && b <= paper + 4 && b <= 2 * n : b == paper,
                      "%s n=%d: budget %d pairs, the paper's %d", gp_schedule_kind_name(kind), n,
                      b, paper);
            int span[2] = {0, 0};
            for (int r = 0; r < 2; r++) {
                gp_schedule_opts o = {.kind = kind, .n = n, .m = 4 * n * (r + 1), .replicas = 1};
                gp_schedule s;
                CHECK_OK(gp_schedule_make(&o, &s));
                CHECK(run_split(&s, false, &span[r]));
                gp_schedule_free(&s);
            }
            CHECK_MSG(abs(span[1] - span[0] - 24 * n) <= 2, "%s n=%d: %d units at m=%d, %d at "
                      "m=%d: a bubble that grows with m", gp_schedule_kind_name(kind), n, span[0],
                      4 * n, span[1], 8 * n);
        }
    CHECK(gp_schedule_v_budget(GP_SCHEDULE_ZB_V, 5) == 10);
}

/* The in-flight bounds as schedule.h and schedule.c write them, for every
 * n, stage and m: min(n - j, m) for 1F1B, min(n - j + 1, m) for ZB-H1
 * (one micro-batch more until its backward-weights), min(2n - j, m) for
 * ZB-V's stage j of 2n, m for GPipe.  check_kind_dur and check_v measure
 * each schedule against gp_schedule_in_flight_bound, which zb_h1_orders
 * also places by: a bound one too high moves the schedule with it, and
 * only these numbers catch it (each zb-h1 stage then held one more
 * micro-batch's activations than the planner's memory model counts). */
static void check_bounds(void)
{
    int bad = 0;
    for (int n = 1; n <= MAX_N; n++)
        for (int m = 1; m <= MAX_M; m++)
            for (int j = 0; j < 2 * n; j++) {
                int want_v = 2 * n - j < m ? 2 * n - j : m;
                bad += gp_schedule_in_flight_bound(GP_SCHEDULE_ZB_V, j, n, m) != want_v;
                if (j >= n) continue;
                int want_1 = n - j < m ? n - j : m, want_h = n - j + 1 < m ? n - j + 1 : m;
                bad += gp_schedule_in_flight_bound(GP_SCHEDULE_GPIPE, j, n, m) != m;
                bad += gp_schedule_in_flight_bound(GP_SCHEDULE_1F1B, j, n, m) != want_1;
                bad += gp_schedule_in_flight_bound(GP_SCHEDULE_ZB_H1, j, n, m) != want_h;
            }
    CHECK_MSG(bad == 0, "%d in-flight bounds differ from schedule.h's formulas", bad);
}

static void check_kind(gp_schedule_kind kind, int n, int m, gp_checkpoint_mode ck)
{
    check_kind_dur(kind, n, m, ck, NULL);
}

/* ZB-H1 ordered by measured times: any times give a valid schedule. */
static void zb_h1_timed(void)
{
    uint64_t r = 12345;
    double dur[3 * MAX_N];
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + (int)(trial % MAX_N), m = 1 + (int)((trial * 7) % MAX_M);
        for (int q = 0; q < 3 * n; q++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            dur[q] = 0.05 + (double)(r >> 40) / (double)(1ull << 24) * 3.0; /* 0.05 .. 3.05 */
        }
        check_kind_dur(GP_SCHEDULE_ZB_H1, n, m, (gp_checkpoint_mode)(trial % 3), dur);
    }
}

int main(void)
{
    zb_h1_timed();
    check_interleaved();
    check_v(GP_SCHEDULE_ZB_V);
    check_v(GP_SCHEDULE_DUALPIPE_V);
    check_v(GP_SCHEDULE_V_HALF);
    check_v(GP_SCHEDULE_V_MIN);
    check_v_budgets();
    check_bounds();
    /* v-half and v-min ordered by measured times (the executor's, after
     * its first steps): any times give a valid order, every check above
     * holding */
    static double dur[3 * 64];
    uint64_t rs = 99;
    for (int trial = 0; trial < 4; trial++) {
        for (int q = 0; q < 3 * 64; q++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            dur[q] = 0.05 + (double)(rs >> 40) / (double)(1ull << 24) * 3.0;
        }
        v_durations = dur;
        check_v(trial % 2 ? GP_SCHEDULE_V_HALF : GP_SCHEDULE_V_MIN);
    }
    v_durations = NULL;
    for (int kind = 0; kind <= GP_SCHEDULE_ZB_H1; kind++) /* interleaved: its own checks */
        for (int n = 1; n <= MAX_N; n++)
            for (int m = 1; m <= MAX_M; m++)
                for (int ck = 0; ck < 3; ck++)
                    check_kind((gp_schedule_kind)kind, n, m, (gp_checkpoint_mode)ck);
    for (int n = 1; n <= MAX_N; n++)
        for (int m = 1; m <= MAX_M; m++)
            for (int ck = 0; ck < 3; ck++) check_one(n, m, (gp_checkpoint_mode)ck);
    test_table();
    end_of_step();
    return gpt_finish("test_schedule");
}
