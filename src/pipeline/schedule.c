/*
 * schedule.c — GPipe's clock-cycle schedule and the end of the step (see
 * schedule.h for the table).
 */
#include "pipeline/schedule.h"

#include <stdio.h>
#include <stdlib.h>

const char *gp_instr_kind_name(gp_instr_kind k)
{
    static const char *names[GP_INSTR_KIND_COUNT] = {
        "recv_act", "forward", "recv_grad", "recompute", "backward", "reduce_grads",
        "reduce_stats", "barrier", "commit", "update", "gather", "check"};
    return k >= 0 && k < GP_INSTR_KIND_COUNT ? names[k] : "?";
}

void gp_instr_name(const gp_instr *in, char *buf, size_t len)
{
    int i = in->i, j = in->j;
    switch (in->kind) {
    case GP_INSTR_FORWARD: snprintf(buf, len, "F%d s%d", i, j); break;
    case GP_INSTR_RECOMPUTE: snprintf(buf, len, "R%d s%d", i, j); break;
    case GP_INSTR_BACKWARD: snprintf(buf, len, "B%d s%d", i, j); break;
    case GP_INSTR_RECV_ACT: snprintf(buf, len, "copy a%d s%d->s%d", i, in->from, j); break;
    case GP_INSTR_RECV_GRAD: snprintf(buf, len, "copy g%d s%d->s%d", i, in->from, j); break;
    case GP_INSTR_REDUCE_GRADS:
        snprintf(buf, len, "%s s%d", in->shard ? "reduce-scatter" : "all-reduce", j);
        break;
    case GP_INSTR_UPDATE:
        snprintf(buf, len, "update%s s%d", in->fused ? " (fused)" : in->shard ? " (shard)" : "",
                 j);
        break;
    default: snprintf(buf, len, "%s s%d", gp_instr_kind_name(in->kind), j); break;
    }
}

gp_status gp_schedule_gpipe(int n, int m, gp_checkpoint_mode ckpt, gp_schedule *out)
{
    gp_schedule_opts o = {.n = n, .m = m, .checkpoint = ckpt, .replicas = 1, .update = true,
                          .check = true};
    return gp_schedule_make(&o, out);
}

static gp_instr instr(gp_instr_kind kind, int i, int j, int k, int from, bool ck)
{
    return (gp_instr){.kind = kind, .i = i, .j = j, .k = k, .from = from, .checkpointed = ck};
}

/* The end of stage j's step (schedule.h). */
static int end_of_step(const gp_schedule_opts *o, int j, int k, gp_instr *l)
{
    bool dp = o->replicas > 1, shard = dp && o->shard[j] && o->update;
    bool fused = shard && o->update && j == 0;
    int c = 0;
    gp_instr e = {.i = -1, .j = j, .k = k, .from = j};
    if (dp && !fused) {
        l[c] = e;
        l[c].kind = GP_INSTR_REDUCE_GRADS;
        l[c++].shard = shard;
    }
    if (dp) (l[c] = e, l[c++].kind = GP_INSTR_REDUCE_STATS);
    l[c] = e;
    l[c].kind = GP_INSTR_BARRIER;
    l[c++].replicas = dp;
    (l[c] = e, l[c++].kind = GP_INSTR_COMMIT);
    if (o->update) {
        l[c] = e;
        l[c].kind = GP_INSTR_UPDATE;
        l[c].shard = shard;
        l[c++].fused = fused;
        if (shard && !fused) (l[c] = e, l[c++].kind = GP_INSTR_GATHER);
    }
    if (o->check) (l[c] = e, l[c++].kind = GP_INSTR_CHECK);
    return c;
}

gp_status gp_schedule_make(const gp_schedule_opts *o, gp_schedule *out)
{
    int n = o->n, m = o->m;
    out->n = n;
    out->m = m;
    out->clocks = 2 * (m + n - 1);
    out->list = NULL;
    out->count = NULL;
    if (n < 1 || m < 1 || n > GP_MAX_DEVICES || m > GP_MAX_CHUNKS)
        return gp_error_set(GP_ERR_INVALID, "a schedule needs 1..%d stages and 1..%d "
                            "micro-batches (got n = %d, m = %d)", GP_MAX_DEVICES,
                            GP_MAX_CHUNKS, n, m);
    out->list = calloc((size_t)n, sizeof *out->list);
    out->count = calloc((size_t)n, sizeof *out->count);
    if (!out->list || !out->count) {
        gp_schedule_free(out);
        return gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
    }
    int fwd_clocks = m + n - 1;
    for (int j = 0; j < n; j++) {
        /* at most 2 per micro-batch forward, 3 backward; 7 at the end */
        gp_instr *l = calloc((size_t)(5 * m + 7), sizeof *l);
        if (!l) {
            gp_schedule_free(out);
            return gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
        }
        out->list[j] = l;
        int c = 0;
        for (int i = 0; i < m; i++) {
            bool ck = gp_ckpt_checkpointed(o->checkpoint, i, j, m, n);
            if (j > 0) l[c++] = instr(GP_INSTR_RECV_ACT, i, j, i + j, j - 1, ck);
            l[c++] = instr(GP_INSTR_FORWARD, i, j, i + j, j, ck);
        }
        for (int i = m - 1; i >= 0; i--) {
            bool ck = gp_ckpt_checkpointed(o->checkpoint, i, j, m, n);
            int kb = fwd_clocks + (m - 1 - i) + (n - 1 - j);
            /* The recompute needs only the stashed input, so it is listed
             * before the gradient's arrival and overlaps the next stage's
             * backward of the previous clock. */
            if (ck) l[c++] = instr(GP_INSTR_RECOMPUTE, i, j, kb, j, ck);
            if (j < n - 1) l[c++] = instr(GP_INSTR_RECV_GRAD, i, j, kb, j + 1, ck);
            l[c++] = instr(GP_INSTR_BACKWARD, i, j, kb, j, ck);
        }
        c += end_of_step(o, j, out->clocks, l + c);
        out->count[j] = c;
    }
    return GP_OK;
}

void gp_schedule_free(gp_schedule *s)
{
    if (!s) return;
    if (s->list)
        for (int j = 0; j < s->n; j++) free(s->list[j]);
    free(s->list);
    free(s->count);
    s->list = NULL;
    s->count = NULL;
}

gp_status gp_microbatch_split(int64_t n, int m, int64_t *sizes)
{
    if (m < 1 || m > GP_MAX_CHUNKS)
        return gp_error_set(GP_ERR_INVALID, "pipeline.chunks must be in 1..%d, got %d",
                            GP_MAX_CHUNKS, m);
    if (m > n)
        return gp_error_set(GP_ERR_INVALID,
                            "pipeline.chunks = %d is larger than the batch of %lld samples; "
                            "use chunks <= batch size",
                            m, (long long)n);
    for (int i = 0; i < m; i++) sizes[i] = n / m + (i < n % m ? 1 : 0);
    return GP_OK;
}
