/*
 * schedule.c — GPipe's clock-cycle schedule (see schedule.h for the table).
 */
#include "pipeline/schedule.h"

#include <stdlib.h>

const char *gp_instr_kind_name(gp_instr_kind k)
{
    static const char *names[GP_INSTR_KIND_COUNT] = {"recv_act", "forward", "recv_grad",
                                                      "recompute", "backward"};
    return k >= 0 && k < GP_INSTR_KIND_COUNT ? names[k] : "?";
}

bool gp_schedule_checkpointed(gp_checkpoint_mode ckpt, int i, int m)
{
    switch (ckpt) {
    case GP_CKPT_ALWAYS: return true;
    case GP_CKPT_EXCEPT_LAST: return i < m - 1;
    case GP_CKPT_NEVER: return false;
    }
    return false;
}

gp_status gp_schedule_gpipe(int n, int m, gp_checkpoint_mode ckpt, gp_schedule *out)
{
    out->n = n;
    out->m = m;
    out->clocks = 2 * (m + n - 1);
    out->list = NULL;
    out->count = NULL;
    if (n < 1 || m < 1)
        return gp_error_set(GP_ERR_INVALID, "a schedule needs n >= 1 stages and m >= 1 "
                                            "micro-batches (got n = %d, m = %d)", n, m);
    out->list = calloc((size_t)n, sizeof *out->list);
    out->count = calloc((size_t)n, sizeof *out->count);
    if (!out->list || !out->count) {
        gp_schedule_free(out);
        return gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
    }
    int fwd_clocks = m + n - 1;
    for (int j = 0; j < n; j++) {
        /* at most 2 per micro-batch forward, 3 backward */
        gp_instr *l = calloc((size_t)(5 * m), sizeof *l);
        if (!l) {
            gp_schedule_free(out);
            return gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
        }
        out->list[j] = l;
        int c = 0;
        for (int i = 0; i < m; i++) {
            bool ck = gp_schedule_checkpointed(ckpt, i, m);
            if (j > 0) l[c++] = (gp_instr){GP_INSTR_RECV_ACT, i, j, i + j, ck};
            l[c++] = (gp_instr){GP_INSTR_FORWARD, i, j, i + j, ck};
        }
        for (int i = m - 1; i >= 0; i--) {
            bool ck = gp_schedule_checkpointed(ckpt, i, m);
            int kb = fwd_clocks + (m - 1 - i) + (n - 1 - j);
            /* The recompute needs only the stashed input, so it is listed
             * before the gradient's arrival and overlaps the next stage's
             * backward of the previous clock. */
            if (ck) l[c++] = (gp_instr){GP_INSTR_RECOMPUTE, i, j, kb, ck};
            if (j < n - 1) l[c++] = (gp_instr){GP_INSTR_RECV_GRAD, i, j, kb, ck};
            l[c++] = (gp_instr){GP_INSTR_BACKWARD, i, j, kb, ck};
        }
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
    if (m < 1)
        return gp_error_set(GP_ERR_INVALID, "pipeline.chunks must be >= 1, got %d", m);
    if (m > n)
        return gp_error_set(GP_ERR_INVALID,
                            "pipeline.chunks = %d is larger than the batch of %lld samples; "
                            "use chunks <= batch size",
                            m, (long long)n);
    for (int i = 0; i < m; i++) sizes[i] = n / m + (i < n % m ? 1 : 0);
    return GP_OK;
}
