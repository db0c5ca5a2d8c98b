/*
 * test_schedule.c — exhaustive checks of GPipe's schedule for small n, m and
 * every checkpoint mode: every (i, j) forward and backward appears exactly
 * once on device j; clocks are as specified; dependencies are respected
 * along each device's list and across devices (by clock); copies sit where
 * data crosses devices; recompute precedes exactly the checkpointed
 * backwards.
 */
#include "pipeline/schedule.h"
#include "test.h"

static void check_one(int n, int m, gp_checkpoint_mode ck)
{
    gp_schedule s;
    CHECK_OK(gp_schedule_gpipe(n, m, ck, &s));
    CHECK(s.clocks == 2 * (m + n - 1));
    int F = (m + n - 1);
    int ok_once = 1, ok_clock = 1, ok_order = 1, ok_copy = 1, ok_ck = 1;
    for (int j = 0; j < n; j++) {
        int seen[GP_INSTR_KIND_COUNT][64] = {{0}};
        int last_k = -1;
        for (int c = 0; c < s.count[j]; c++) {
            gp_instr *in = &s.list[j][c];
            if (in->kind > GP_INSTR_BACKWARD) continue; /* the end of the step: below */
            if (in->j != j || in->i < 0 || in->i >= m) { ok_once = 0; continue; }
            seen[in->kind][in->i]++;
            /* clocks */
            int want = (in->kind == GP_INSTR_FORWARD || in->kind == GP_INSTR_RECV_ACT)
                           ? in->i + j
                           : F + (m - 1 - in->i) + (n - 1 - j);
            if (in->k != want) ok_clock = 0;
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
            if (in->checkpointed != gp_ckpt_checkpointed(ck, in->i, j, m, n)) ok_ck = 0;
        }
        for (int i = 0; i < m; i++) {
            if (seen[GP_INSTR_FORWARD][i] != 1 || seen[GP_INSTR_BACKWARD][i] != 1) ok_once = 0;
            if (seen[GP_INSTR_RECV_ACT][i] != (j > 0)) ok_copy = 0;
            if (seen[GP_INSTR_RECV_GRAD][i] != (j < n - 1)) ok_copy = 0;
            if (seen[GP_INSTR_RECOMPUTE][i] != (int)gp_ckpt_checkpointed(ck, i, j, m, n)) ok_ck = 0;
        }
    }
    /* across devices: forward (i, j) is a clock after forward (i, j-1);
     * backward (i, j) a clock after backward (i, j+1). */
    for (int j = 1; j < n; j++)
        for (int c = 0; c < s.count[j]; c++) {
            gp_instr *in = &s.list[j][c];
            for (int c2 = 0; c2 < s.count[j - 1]; c2++) {
                gp_instr *p = &s.list[j - 1][c2];
                if (p->i != in->i) continue;
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

static void test_table(void)
{
    /* The ASCII table of schedule.h, n = 3, m = 3: at forward clock 2 the
     * three stages run micro-batches 2, 1, 0. */
    gp_schedule s;
    CHECK_OK(gp_schedule_gpipe(3, 3, GP_CKPT_NEVER, &s));
    int at2[3] = {-1, -1, -1};
    for (int j = 0; j < 3; j++)
        for (int c = 0; c < s.count[j]; c++)
            if (s.list[j][c].kind == GP_INSTR_FORWARD && s.list[j][c].k == 2) at2[j] = s.list[j][c].i;
    CHECK(at2[0] == 2 && at2[1] == 1 && at2[2] == 0);
    /* never: no recompute at all; stage 0 has 3 F + 3 B + 3 recv_grad, and
     * every stage ends with barrier, commit and update */
    CHECK(s.count[0] == 12 && s.count[1] == 15 && s.count[2] == 12);
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
           CO = GP_INSTR_COMMIT, UP = GP_INSTR_UPDATE, GA = GP_INSTR_GATHER };
    struct {
        int R;
        bool shard, update;
        int stage;     /* which stage's tail */
        int want[8];   /* kinds, -1 ends */
        int up_shard, up_fused, rg_shard;
    } cases[] = {
        {1, false, true, 0, {BA, CO, UP, -1}, 0, 0, 0},
        {1, true, true, 1, {BA, CO, UP, -1}, 0, 0, 0},   /* one replica: nothing to shard */
        {1, false, false, 0, {BA, CO, -1}, 0, 0, 0},
        {2, false, true, 0, {RG, RS, BA, CO, UP, -1}, 0, 0, 0},
        {2, false, true, 2, {RG, RS, BA, CO, UP, -1}, 0, 0, 0},
        {3, true, true, 0, {RS, BA, CO, UP, -1}, 1, 1, 0},       /* stage 0 fused */
        {3, true, true, 1, {RG, RS, BA, CO, UP, GA, -1}, 1, 0, 1},
        {2, true, false, 1, {RG, RS, BA, CO, -1}, 0, 0, 0}, /* no update: sum in full */
    };
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        gp_schedule_opts o = {.n = 3, .m = 4, .checkpoint = GP_CKPT_EXCEPT_LAST,
                              .replicas = cases[q].R, .update = cases[q].update};
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

int main(void)
{
    for (int n = 1; n <= 6; n++)
        for (int m = 1; m <= 9; m++)
            for (int ck = 0; ck < 3; ck++) check_one(n, m, (gp_checkpoint_mode)ck);
    test_table();
    end_of_step();
    return gpt_finish("test_schedule");
}
