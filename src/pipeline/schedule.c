/*
 * schedule.c — GPipe's clock-cycle schedule and the end of the step (see
 * schedule.h for the table).
 */
#include "pipeline/schedule.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

const char *gp_instr_kind_name(gp_instr_kind k)
{
    static const char *names[GP_INSTR_KIND_COUNT] = {
        "recv_act", "forward", "recv_grad", "recompute", "backward", "backward_data",
        "backward_weights", "recv_skip", "recv_skip_grad", "reduce_grads",
        "reduce_stats", "barrier", "commit", "update", "gather", "check", "clip"};
    return k >= 0 && k < GP_INSTR_KIND_COUNT ? names[k] : "?";
}

void gp_instr_name(const gp_instr *in, char *buf, size_t len)
{
    int i = in->i, j = in->j;
    switch (in->kind) {
    case GP_INSTR_FORWARD: snprintf(buf, len, "F%d s%d", i, j); break;
    case GP_INSTR_RECOMPUTE: snprintf(buf, len, "R%d s%d", i, j); break;
    case GP_INSTR_BACKWARD:
    case GP_INSTR_BACKWARD_DATA: snprintf(buf, len, "B%d s%d", i, j); break;
    case GP_INSTR_BACKWARD_WEIGHTS: snprintf(buf, len, "W%d s%d", i, j); break;
    case GP_INSTR_RECV_ACT: snprintf(buf, len, "copy a%d s%d->s%d", i, in->from, j); break;
    case GP_INSTR_RECV_GRAD: snprintf(buf, len, "copy g%d s%d->s%d", i, in->from, j); break;
    case GP_INSTR_RECV_SKIP: snprintf(buf, len, "copy k%d s%d->s%d", i, in->from, j); break;
    case GP_INSTR_RECV_SKIP_GRAD: snprintf(buf, len, "copy kg%d s%d->s%d", i, in->from, j); break;
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

/* The end of device d's step (schedule.h): for each of its stages j the
 * reductions, one barrier, the clip, then each stage's commit, update,
 * gather and check. */
static int end_of_step(const gp_schedule_opts *o, int d, int S, int k, const int *dev_of,
                       gp_instr *l)
{
    bool dp = o->replicas > 1, clip = o->clip && o->update;
    int c = 0;
    for (int j = 0; j < S; j++) {
        if (dev_of[j] != d) continue;
        bool shard = dp && o->shard[j] && o->update, fused = shard && j == 0 && !clip;
        gp_instr e = {.i = -1, .j = j, .k = k, .from = j};
        if (dp && !fused) {
            l[c] = e;
            l[c].kind = GP_INSTR_REDUCE_GRADS;
            l[c++].shard = shard;
        }
        if (dp) (l[c] = e, l[c++].kind = GP_INSTR_REDUCE_STATS);
    }
    l[c] = (gp_instr){.kind = GP_INSTR_BARRIER, .i = -1, .j = d, .k = k, .from = d,
                      .replicas = dp};
    c++;
    if (clip) {
        l[c] = (gp_instr){.kind = GP_INSTR_CLIP, .i = -1, .j = d, .k = k, .from = d};
        c++;
    }
    for (int j = 0; j < S; j++) {
        if (dev_of[j] != d) continue;
        bool shard = dp && o->shard[j] && o->update, fused = shard && j == 0 && !clip;
        gp_instr e = {.i = -1, .j = j, .k = k, .from = j};
        (l[c] = e, l[c++].kind = GP_INSTR_COMMIT);
        if (o->update) {
            l[c] = e;
            l[c].kind = GP_INSTR_UPDATE;
            l[c].shard = shard;
            l[c++].fused = fused;
            if (shard && !fused) (l[c] = e, l[c++].kind = GP_INSTR_GATHER);
        }
        if (o->check) (l[c] = e, l[c++].kind = GP_INSTR_CHECK);
    }
    return c;
}

/* One computation of a device's order. */
typedef struct {
    gp_instr_kind kind; /* FORWARD, BACKWARD, BACKWARD_DATA or BACKWARD_WEIGHTS */
    int i;              /* micro-batch */
    int j;              /* stage */
} op;

/* ZB-H1's orders for all stages (one per device): a greedy execution (see
 * schedule.h) in which stage j's forward, backward-data and
 * backward-weights take dur[3 j], dur[3 j + 1], dur[3 j + 2] (dur NULL: one
 * unit each).  Event-driven: the stage free earliest decides next, by what
 * has arrived by then; a stage with nothing to do waits for the next
 * arrival or decision elsewhere.  f_end / b_end: when a forward /
 * backward-data of (i, j) ends, < 0 before it is placed. */
static gp_status zb_h1_orders(int n, int m, const double *dur, op **ord, int *len)
{
    size_t cells = (size_t)m * (size_t)n;
    double *f_end = malloc(cells * sizeof *f_end), *b_end = malloc(cells * sizeof *b_end);
    int *wq = malloc(cells * sizeof *wq); /* per stage: pending W, oldest first */
    if (!f_end || !b_end || !wq) {
        free(f_end);
        free(b_end);
        free(wq);
        return gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
    }
    for (size_t q = 0; q < cells; q++) f_end[q] = b_end[q] = -1;
    int nf[GP_MAX_DEVICES] = {0}, nb[GP_MAX_DEVICES] = {0}, wh[GP_MAX_DEVICES] = {0},
        wt[GP_MAX_DEVICES] = {0};
    double t_free[GP_MAX_DEVICES] = {0};
    int left = 3 * m * n;
#define UNFINISHED(q) (nf[q] + nb[q] + wh[q] < 3 * m)
    while (left > 0) {
        int j = -1; /* the stage that decides next: free earliest (ties: lowest j) */
        for (int q = 0; q < n; q++)
            if (UNFINISHED(q) && (j < 0 || t_free[q] < t_free[j])) j = q;
        GP_ASSERT(j >= 0);
        double t = t_free[j];
        /* F: as 1F1B (in flight until the backward-data), and at most one
         * micro-batch more until the backward-weights */
        bool room = nf[j] - nb[j] < gp_schedule_in_flight_bound(GP_SCHEDULE_1F1B, j, n, m) &&
                    nf[j] - wh[j] < gp_schedule_in_flight_bound(GP_SCHEDULE_ZB_H1, j, n, m);
        int *W = wq + (size_t)j * (size_t)m;
        double b_dep = -1, f_dep = -1; /* when the next B's / F's input arrives, < 0 unknown */
        if (nb[j] < nf[j])
            b_dep = j == n - 1 ? f_end[nb[j] * n + j] : b_end[nb[j] * n + j + 1];
        if (nf[j] < m && room) f_dep = j == 0 ? 0 : f_end[nf[j] * n + j - 1];
        double dF = dur ? dur[3 * j] : 1, dB = dur ? dur[3 * j + 1] : 1, dW = dur ? dur[3 * j + 2] : 1;
        if (b_dep >= 0 && b_dep <= t) {
            b_end[nb[j] * n + j] = t + dB;
            t_free[j] = t + dB;
            ord[j][len[j]++] = (op){GP_INSTR_BACKWARD_DATA, nb[j], j};
            W[wt[j]++] = nb[j]++;
        } else if (f_dep >= 0 && f_dep <= t) {
            f_end[nf[j] * n + j] = t + dF;
            t_free[j] = t + dF;
            ord[j][len[j]++] = (op){GP_INSTR_FORWARD, nf[j]++, j};
        } else if (wh[j] < wt[j]) {
            t_free[j] = t + dW;
            ord[j][len[j]++] = (op){GP_INSTR_BACKWARD_WEIGHTS, W[wh[j]++], j};
        } else {
            /* nothing to do: wait for the next known arrival, or for the
             * next decision of another stage (which may place it) */
            double next = -1;
            if (b_dep > t) next = b_dep;
            if (f_dep > t && (next < 0 || f_dep < next)) next = f_dep;
            for (int q = 0; q < n; q++)
                if (q != j && UNFINISHED(q) && t_free[q] > t && (next < 0 || t_free[q] < next))
                    next = t_free[q];
            for (int q = 0; q < n && next < 0; q++) /* another stage decides at t too */
                if (q != j && UNFINISHED(q) && t_free[q] == t) next = t;
            GP_ASSERT(next >= 0); /* some stage can always go on */
            /* a tie at t: let the other stage decide first */
            t_free[j] = next > t ? next : nextafter(t, 1e300);
            continue;
        }
        left--;
    }
#undef UNFINISHED
    free(f_end);
    free(b_end);
    free(wq);
    return GP_OK;
}

/* Interleaved 1F1B (Narayanan et al. 2021; Megatron's virtual pipeline):
 * device d holds stages d, d + n, .., d + (v - 1) n.  Its k-th forward is
 * micro-batch (k / nv) n + k % n of stage-chunk (k % nv) / n, its k-th
 * backward the same micro-batch of chunk v - 1 - (k % nv) / n; it runs
 * (n - d - 1) 2 + (v - 1) n warm-up forwards (all of them when m = n),
 * then alternates, then drains. */
static void interleaved_order(int n, int v, int m, int d, op *ord, int *len)
{
    int total = m * v, nv = n * v;
    int warm = m == n ? total : (n - d - 1) * 2 + (v - 1) * n;
    if (warm > total) warm = total;
    int c = 0, kf = 0, kb = 0;
#define FWD(k) (op){GP_INSTR_FORWARD, ((k) / nv) * n + (k) % n, (((k) % nv) / n) * n + d}
#define BWD(k) (op){GP_INSTR_BACKWARD, ((k) / nv) * n + (k) % n, (v - 1 - ((k) % nv) / n) * n + d}
    for (; kf < warm; kf++) ord[c++] = FWD(kf);
    for (; kf < total; kf++, kb++) {
        ord[c++] = FWD(kf);
        ord[c++] = BWD(kb);
    }
    for (; kb < total; kb++) ord[c++] = BWD(kb);
#undef FWD
#undef BWD
    *len = c;
}

/* ZB-V's order on device d of n (schedule.h): chunk 0 is stage d, chunk 1
 * stage 2n - 1 - d.  Made for M = max(m, 2n - 1) micro-batches, as the
 * pattern needs that many to fill the V; those past m are left out. */
static void zb_v_order(int n, int m, int d, op *ord, int *len)
{
    int M = m > 2 * n - 1 ? m : 2 * n - 1, s0 = d, s1 = 2 * n - 1 - d;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0, w0, w1, c = 0;
#define PUT(kind, i, j)                                  \
    do {                                                 \
        int i_ = (i); /* (i is a counter's f0++ etc.) */ \
        if (i_ < m) ord[c++] = (op){(kind), i_, (j)};    \
    } while (0)
    for (int q = 0; q < 2 * (n - d) - 1; q++) PUT(GP_INSTR_FORWARD, f0++, s0);
    for (int q = 0; q < d; q++) {
        PUT(GP_INSTR_FORWARD, f1++, s1);
        PUT(GP_INSTR_FORWARD, f0++, s0);
    }
    for (int q = 0; q < n - d; q++) {
        PUT(GP_INSTR_FORWARD, f1++, s1);
        PUT(GP_INSTR_BACKWARD_DATA, b1, s1);
        PUT(GP_INSTR_BACKWARD_WEIGHTS, b1++, s1);
    }
    while (f1 < f0 || f0 < M) {
        if (f0 < M) PUT(GP_INSTR_FORWARD, f0++, s0);
        PUT(GP_INSTR_BACKWARD_DATA, b0, s0);
        PUT(GP_INSTR_BACKWARD_WEIGHTS, b0++, s0);
        PUT(GP_INSTR_FORWARD, f1++, s1);
        PUT(GP_INSTR_BACKWARD_DATA, b1, s1);
        PUT(GP_INSTR_BACKWARD_WEIGHTS, b1++, s1);
    }
    w0 = b0;
    w1 = b1;
    for (int q = 0; q < d; q++) {
        PUT(GP_INSTR_BACKWARD_DATA, b0++, s0);
        PUT(GP_INSTR_BACKWARD_DATA, b1++, s1);
    }
    for (int q = 0; q < n - d; q++) {
        PUT(GP_INSTR_BACKWARD_DATA, b0++, s0);
        PUT(GP_INSTR_BACKWARD_WEIGHTS, w0++, s0);
    }
    while (w1 < b1) PUT(GP_INSTR_BACKWARD_WEIGHTS, w1++, s1);
    while (w0 < b0) PUT(GP_INSTR_BACKWARD_WEIGHTS, w0++, s0);
#undef PUT
    GP_ASSERT(f0 == M && f1 == M && b0 == M && b1 == M && w0 == M && w1 == M);
    *len = c;
}

/* V-Half's and V-Min's orders: a greedy execution on the V as ZB-H1's, in
 * the stages' times (dur[3 j + 0, 1, 2]: forward, backward-data,
 * backward-weights of stage j of 2n; NULL: one unit each).  A device free
 * at t runs the backward-data whose gradient is there (the older
 * micro-batch first; chunk 1 on a tie), else a forward whose input is
 * there and whose chunk has room (at most ZB-V's bounds until the weights
 * pass, 2n - d micro-batches on chunk 0 and d + 1 on chunk 1, and `cap` on
 * the device, one place kept for chunk 1 as below; chunk 1 first), else
 * its oldest waiting W, else it waits for the next arrival or
 * another device's next decision.  Each stage runs its micro-batches in
 * order in every kind, so the gradients add up as on one device.  False
 * where it cannot place everything (never seen in test_schedule's
 * cases).  (ZB-V itself ordered so was slower than its pattern:
 * bench/README.md.) */
static bool zb_v_timed_orders(int n, int m, const double *dur, int cap, op **ord, int *len,
                              double *span)
{
    int S = 2 * n;
    size_t cells = (size_t)m * (size_t)S;
    double *f_end = malloc(cells * sizeof *f_end), *b_end = malloc(cells * sizeof *b_end);
    int *wq = malloc((size_t)n * 2 * (size_t)m * 2 * sizeof *wq); /* per device: (stage, mb) */
    bool ok = f_end && b_end && wq;
    for (size_t q = 0; ok && q < cells; q++) f_end[q] = b_end[q] = -1;
    int nf[GP_MAX_DEVICES] = {0}, nb[GP_MAX_DEVICES] = {0}, nw[GP_MAX_DEVICES] = {0};
    int wh[GP_MAX_DEVICES] = {0}, wt[GP_MAX_DEVICES] = {0};
    double t_free[GP_MAX_DEVICES] = {0};
    for (int d = 0; d < n; d++) len[d] = 0;
    int left = 3 * m * S;
#define ST(d, c) ((c) ? S - 1 - (d) : (d))
#define UNDONE(d) (nf[(d)] + nb[(d)] + nw[(d)] + nf[S - 1 - (d)] + nb[S - 1 - (d)] + \
                   nw[S - 1 - (d)] < 6 * m)
    int spins = 0;
    while (ok && left > 0) {
        int d = -1;
        for (int q = 0; q < n; q++)
            if (UNDONE(q) && (d < 0 || t_free[q] < t_free[d])) d = q;
        if (d < 0 || ++spins > 64 * (left + n + 8) + 100000) {
            ok = false;
            break;
        }
        double t = t_free[d], next = -1;
        int pick = -1, pc = 0; /* 0: B, 1: F, 2: W; pc: chunk */
        for (int c = 1; c >= 0; c--) { /* backward-data, the older first, chunk 1 on a tie */
            int j = ST(d, c), i = nb[j];
            if (i >= nf[j]) continue;
            double dep = j == S - 1 ? f_end[(size_t)i * S + j] : b_end[(size_t)i * S + j + 1];
            if (dep < 0) continue;
            if (dep > t) {
                if (next < 0 || dep < next) next = dep;
                continue;
            }
            if (pick < 0 || i < nb[ST(d, pc)]) pick = 0, pc = c;
        }
        /* in flight until the weights pass: chunk 0 at most 2n - d, chunk 1
         * d + 1, both together `cap`, one place kept for chunk 1 while it
         * has none (its backwards are what free chunk 0's) */
        int in0 = nf[ST(d, 0)] - nw[ST(d, 0)], in1 = nf[ST(d, 1)] - nw[ST(d, 1)];
        bool room[2] = {in0 + 1 <= 2 * n - d && in0 + 1 + (in1 > 0 ? in1 : 1) <= cap,
                        in1 + 1 <= d + 1 && in0 + in1 + 1 <= cap};
        for (int c = 1; c >= 0 && pick < 0; c--) { /* a forward with room, chunk 1 first */
            int j = ST(d, c), i = nf[j];
            if (i >= m || !room[c]) continue;
            double dep = j == 0 ? 0 : f_end[(size_t)i * S + j - 1];
            if (dep < 0) continue;
            if (dep > t) {
                if (next < 0 || dep < next) next = dep;
                continue;
            }
            pick = 1, pc = c;
        }
        if (pick < 0 && wh[d] < wt[d]) pick = 2;
        if (pick < 0) { /* wait: the next arrival, or another device's decision */
            for (int q = 0; q < n; q++)
                if (q != d && UNDONE(q) && t_free[q] > t && (next < 0 || t_free[q] < next))
                    next = t_free[q];
            for (int q = 0; q < n && next < 0; q++)
                if (q != d && UNDONE(q) && t_free[q] == t) next = t;
            if (next < 0) {
                ok = false;
                break;
            }
            t_free[d] = next > t ? next : nextafter(t, 1e300);
            continue;
        }
        int *W = wq + (size_t)d * 4 * (size_t)m;
        if (pick == 0) {
            int j = ST(d, pc), i = nb[j]++;
            b_end[(size_t)i * S + j] = t_free[d] = t + (dur ? dur[3 * j + 1] : 1);
            ord[d][len[d]++] = (op){GP_INSTR_BACKWARD_DATA, i, j};
            W[2 * wt[d]] = j, W[2 * wt[d]++ + 1] = i;
        } else if (pick == 1) {
            int j = ST(d, pc), i = nf[j]++;
            f_end[(size_t)i * S + j] = t_free[d] = t + (dur ? dur[3 * j] : 1);
            ord[d][len[d]++] = (op){GP_INSTR_FORWARD, i, j};
        } else {
            int j = W[2 * wh[d]], i = W[2 * wh[d]++ + 1];
            nw[j]++;
            t_free[d] = t + (dur ? dur[3 * j + 2] : 1);
            ord[d][len[d]++] = (op){GP_INSTR_BACKWARD_WEIGHTS, i, j};
        }
        left--;
    }
#undef ST
#undef UNDONE
    for (int d = 0; span && d < n; d++)
        if (d == 0 || t_free[d] > *span) *span = t_free[d];
    free(f_end);
    free(b_end);
    free(wq);
    return ok;
}

/* Whether the greedy with `cap` in unit times leaves a bubble that grows
 * with m: its step over 8n micro-batches longer than over 4n by more than
 * the 24n units of work added (and 2 of jitter), or not placed at all.
 * (Out of host memory: false, the cap as it is.) */
static bool v_cap_stalls(int n, int cap)
{
    op *ord[GP_MAX_DEVICES] = {NULL};
    int len[GP_MAX_DEVICES];
    double span[2] = {0, 0};
    bool mem = true, placed = true;
    for (int d = 0; d < n && mem; d++) mem = (ord[d] = malloc((size_t)(48 * n) * sizeof **ord));
    for (int q = 0; q < 2 && mem && placed; q++)
        placed = zb_v_timed_orders(n, 4 * n * (q + 1), NULL, cap, ord, len, &span[q]);
    for (int d = 0; d < n; d++) free(ord[d]);
    return mem && (!placed || span[1] - span[0] > 24.0 * n + 2.0);
}

/* gp_schedule_v_budget's caps, found once per kind and n (0: not yet) */
static _Atomic int v_caps[2][GP_MAX_DEVICES / 2 + 1];

/* DualPipeV's order on device d of n (schedule.h). */
static void dualpipe_v_order(int n, int m, int d, op *ord, int *len)
{
    const int st[2] = {d, 2 * n - 1 - d};
    int fwd[2] = {0, 0}, bwd[2] = {0, 0}, c = 0;
    int wq[2 * GP_MAX_CHUNKS][2], wh = 0, wt = 0; /* the W waiting: (chunk, micro-batch), FIFO */
    bool zb = false;
#define F(ch) (ord[c++] = (op){GP_INSTR_FORWARD, fwd[ch]++, st[ch]})
#define B(ch) (ord[c++] = (op){GP_INSTR_BACKWARD, bwd[ch]++, st[ch]})
#define I(ch)                                                      \
    do {                                                           \
        wq[wt][0] = (ch), wq[wt++][1] = bwd[ch];                   \
        ord[c++] = (op){GP_INSTR_BACKWARD_DATA, bwd[ch]++, st[ch]}; \
    } while (0)
#define W()                                                                           \
    do {                                                                              \
        if (wh < wt) {                                                                \
            ord[c++] = (op){GP_INSTR_BACKWARD_WEIGHTS, wq[wh][1], st[wq[wh][0]]};     \
            wh++;                                                                     \
        }                                                                             \
    } while (0)
    for (int q = 0; q < 2 * (n - d - 1); q++) F(0);
    for (int q = 0; q < d + 1; q++) F(0), F(1);
    for (int q = 0; q < n - d - 1; q++) {
        I(1);
        W();
        F(1);
    }
    for (int q = 0; q < m - 2 * n + d + 1; q++) F(0), B(1), F(1), B(0);
    for (int q = 0; q < n - d - 1; q++) B(1), F(1), B(0);
    for (int q = 0; q < d + 1; q++) {
        if (q == (d + 1) / 2 && d % 2 == 1) zb = true;
        if (zb) I(1);
        else B(1);
        if (q == (d + 1) / 2 && d % 2 == 0) zb = true;
        if (zb) I(0);
        else B(0);
    }
    for (int q = 0; q < n - d - 1; q++) {
        W();
        if (zb) I(0);
        else B(0);
    }
    while (wh < wt) W();
#undef F
#undef B
#undef I
#undef W
    GP_ASSERT(fwd[0] == m && fwd[1] == m && bwd[0] == m && bwd[1] == m);
    *len = c;
}

/* The order of computations on every device. */
static gp_status compute_orders(const gp_schedule_opts *o, int v, op **ord, int *len)
{
    int m = o->m, n = o->n;
    if (o->kind == GP_SCHEDULE_ZB_H1) return zb_h1_orders(n, m, o->durations, ord, len);
    if (o->kind == GP_SCHEDULE_FILE || o->kind == GP_SCHEDULE_FILE_V) {
        /* the file's computations, in its order (its sends and receives
         * are where gpipe puts its own: right before what reads them) */
        const gp_schedule_file *f = o->file;
        static const gp_instr_kind of[4] = {GP_INSTR_FORWARD, GP_INSTR_BACKWARD_DATA,
                                            GP_INSTR_BACKWARD_WEIGHTS, GP_INSTR_BACKWARD};
        for (int d = 0; d < n; d++) {
            len[d] = 0;
            for (int q = 0; q < f->len[d]; q++)
                if (f->acts[d][q].kind <= GP_SACT_B)
                    ord[d][len[d]++] = (op){of[f->acts[d][q].kind], f->acts[d][q].mb,
                                            f->acts[d][q].stage};
        }
        return GP_OK;
    }
    for (int j = 0; j < n; j++) {
        int c = 0;
        if (o->kind == GP_SCHEDULE_INTERLEAVED) {
            interleaved_order(n, v, m, j, ord[j], &len[j]);
            continue;
        }
        if (o->kind == GP_SCHEDULE_ZB_V) {
            /* the pattern, measured times or not: ordered greedily by the
             * times of configs/tiny-gpt.yaml's stages its step was 8%
             * longer, and bench/mlp.yaml's 2% (bench/README.md) */
            zb_v_order(n, m, j, ord[j], &len[j]);
            continue;
        }
        if (o->kind == GP_SCHEDULE_V_HALF || o->kind == GP_SCHEDULE_V_MIN) {
            /* the greedy in unit (or measured) times within a device's
             * budget of (micro-batch, stage) pairs */
            int cap = gp_schedule_v_budget(o->kind, n);
            if (!zb_v_timed_orders(n, m, o->durations, cap, ord, len, NULL))
                return gp_error_set(GP_ERR_INVALID, "schedule %s could not be placed for %d "
                                    "devices and %d micro-batches (a bug)",
                                    gp_schedule_kind_name(o->kind), n, m);
            break;
        }
        if (o->kind == GP_SCHEDULE_DUALPIPE_V) {
            dualpipe_v_order(n, m, j, ord[j], &len[j]);
            continue;
        }
        if (o->kind == GP_SCHEDULE_GPIPE) {
            for (int i = 0; i < m; i++) ord[j][c++] = (op){GP_INSTR_FORWARD, i, j};
            for (int i = m - 1; i >= 0; i--) ord[j][c++] = (op){GP_INSTR_BACKWARD, i, j};
        } else { /* 1F1B */
            int warm = n - 1 - j < m ? n - 1 - j : m;
            for (int i = 0; i < warm; i++) ord[j][c++] = (op){GP_INSTR_FORWARD, i, j};
            for (int i = warm; i < m; i++) {
                ord[j][c++] = (op){GP_INSTR_FORWARD, i, j};
                ord[j][c++] = (op){GP_INSTR_BACKWARD, i - warm, j};
            }
            for (int i = m - warm; i < m; i++) ord[j][c++] = (op){GP_INSTR_BACKWARD, i, j};
        }
        len[j] = c;
    }
    return GP_OK;
}

/* Clocks: each computation runs one clock after the later of the previous
 * computation on its device and the computation its input comes from
 * (forward (i, j - 1), or backward (i, j + 1)).  For GPipe that is the
 * table above; for any order it is a numbering in which every device's
 * list is sorted and lockstep (a copy of clock k waits for all clocks
 * before k) cannot deadlock.  fk / bk / wk: clocks of forward, backward
 * (or backward-data), backward-weights of (i, j), [i * S + j]. */
static gp_status assign_clocks(const gp_schedule_opts *o, int S, op *const *ord, const int *len,
                               int *fk, int *bk, int *wk)
{
    int n = o->n, m = o->m;
    int pos[GP_MAX_DEVICES] = {0}, last[GP_MAX_DEVICES];
    for (int d = 0; d < n; d++) last[d] = -1;
    for (int q = 0; q < m * S; q++) fk[q] = bk[q] = wk[q] = -1;
    int left = 0;
    for (int d = 0; d < n; d++) left += len[d];
    while (left > 0) {
        int progress = 0;
        for (int d = 0; d < n; d++)
            while (pos[d] < len[d]) {
                op e = ord[d][pos[d]];
                int i = e.i, j = e.j, dep = -1;
                int *clk = e.kind == GP_INSTR_FORWARD ? fk
                           : e.kind == GP_INSTR_BACKWARD_WEIGHTS ? wk : bk;
                if (e.kind == GP_INSTR_FORWARD && j > 0) {
                    dep = fk[i * S + j - 1];
                    if (dep < 0) break;
                } else if ((e.kind == GP_INSTR_BACKWARD || e.kind == GP_INSTR_BACKWARD_DATA) &&
                           j < S - 1) {
                    dep = bk[i * S + j + 1];
                    if (dep < 0) break;
                } else if (e.kind != GP_INSTR_FORWARD && j == S - 1 && e.kind != GP_INSTR_BACKWARD_WEIGHTS) {
                    dep = fk[i * S + j]; /* the last stage's own forward */
                    if (dep < 0) break;
                }
                int k = (last[d] > dep ? last[d] : dep) + 1;
                clk[i * S + j] = k;
                last[d] = k;
                pos[d]++;
                left--;
                progress = 1;
            }
        if (!progress)
            return gp_error_set(GP_ERR_INVALID, "schedule %s deadlocks at n = %d, m = %d (a bug)",
                                gp_schedule_kind_name(o->kind), n, m);
    }
    return GP_OK;
}

const char *gp_schedule_kind_name(gp_schedule_kind k)
{
    switch (k) {
    case GP_SCHEDULE_GPIPE: return "gpipe";
    case GP_SCHEDULE_1F1B: return "1f1b";
    case GP_SCHEDULE_ZB_H1: return "zb-h1";
    case GP_SCHEDULE_INTERLEAVED: return "interleaved";
    case GP_SCHEDULE_ZB_V: return "zb-v";
    case GP_SCHEDULE_DUALPIPE_V: return "dualpipe-v";
    case GP_SCHEDULE_V_HALF: return "v-half";
    case GP_SCHEDULE_V_MIN: return "v-min";
    case GP_SCHEDULE_FILE:
    case GP_SCHEDULE_FILE_V: return "file";
    }
    return "?";
}

bool gp_schedule_v_shape(gp_schedule_kind k)
{
    return k == GP_SCHEDULE_ZB_V || k == GP_SCHEDULE_DUALPIPE_V || k == GP_SCHEDULE_V_HALF ||
           k == GP_SCHEDULE_V_MIN || k == GP_SCHEDULE_FILE_V;
}

int gp_schedule_stages_per_device(gp_schedule_kind k, int virtual_stages)
{
    if (k == GP_SCHEDULE_INTERLEAVED || k == GP_SCHEDULE_FILE || k == GP_SCHEDULE_FILE_V)
        return virtual_stages > 0 ? virtual_stages : 1;
    return gp_schedule_v_shape(k) ? 2 : 1;
}

int gp_schedule_in_flight_bound(gp_schedule_kind k, int j, int n, int m)
{
    if (k == GP_SCHEDULE_1F1B) return n - j < m ? n - j : m;
    if (k == GP_SCHEDULE_ZB_H1) return n - j + 1 < m ? n - j + 1 : m;
    if (k == GP_SCHEDULE_ZB_V) return 2 * n - j < m ? 2 * n - j : m; /* n devices, 2n stages */
    if (k == GP_SCHEDULE_V_HALF || k == GP_SCHEDULE_V_MIN) {
        int cap = gp_schedule_v_budget(k, n), b = 2 * n - j;
        b = b < cap ? b : cap;
        return b < m ? b : m;
    }
    return m;
}

int gp_schedule_v_budget(gp_schedule_kind k, int n)
{
    if (k != GP_SCHEDULE_V_HALF && k != GP_SCHEDULE_V_MIN) return 2 * n;
    /* the paper's activation memory in 1F1B micro-batches, two pairs each */
    int b = k == GP_SCHEDULE_V_HALF ? 2 * ((n + 2) / 2) : 2 * ((n + 4) / 3);
    if (b >= 2 * n || n < 1 || n > GP_MAX_DEVICES / 2) return b < 2 * n ? b : 2 * n;
    /* raised a pair at a time where the greedy would stall every round (V-Min
     * at n = 6 and 7, ...: the paper's schedules are built from a repeating
     * block, not a greedy); any thread finds the same, so a race is harmless */
    _Atomic int *c = &v_caps[k == GP_SCHEDULE_V_MIN][n];
    int known = atomic_load_explicit(c, memory_order_relaxed);
    if (known > 0) return known;
    while (b < 2 * n && v_cap_stalls(n, b)) b++;
    atomic_store_explicit(c, b, memory_order_relaxed);
    return b;
}

bool gp_schedule_backward_ascending(gp_schedule_kind k) { return k != GP_SCHEDULE_GPIPE; }
bool gp_schedule_splits_backward(gp_schedule_kind k)
{
    return k == GP_SCHEDULE_ZB_H1 || k == GP_SCHEDULE_ZB_V || k == GP_SCHEDULE_DUALPIPE_V ||
           k == GP_SCHEDULE_V_HALF || k == GP_SCHEDULE_V_MIN;
}

int gp_schedule_interleaved_bound(int d, int n, int v, int m)
{
    int total = m * v, warm = m == n ? total : (n - d - 1) * 2 + (v - 1) * n + 1;
    return warm < total ? warm : total;
}

gp_status gp_schedule_make(const gp_schedule_opts *o, gp_schedule *out)
{
    int n = o->n, m = o->m;
    int v = gp_schedule_stages_per_device(o->kind, o->virtual_stages);
    int S = n * v;
    out->n = n;
    out->stages = S;
    out->m = m;
    out->kind = o->kind;
    out->clocks = 0;
    out->list = NULL;
    out->count = NULL;
    for (int e = 0; e < o->n_skips; e++)
        if (o->skips[e].from < 0 || o->skips[e].from >= o->skips[e].to || o->skips[e].to >= S)
            return gp_error_set(GP_ERR_INVALID, "skip %d goes from stage %d to stage %d; it must "
                                "go from an earlier stage to a later one of %d",
                                o->skips[e].id, o->skips[e].from, o->skips[e].to, S);
    if (n < 1 || m < 1 || n > GP_MAX_DEVICES || m > GP_MAX_CHUNKS)
        return gp_error_set(GP_ERR_INVALID, "a schedule needs 1..%d stages and 1..%d "
                            "micro-batches (got n = %d, m = %d)", GP_MAX_DEVICES,
                            GP_MAX_CHUNKS, n, m);
    if (o->kind == GP_SCHEDULE_INTERLEAVED) {
        if (v < 2 || S > GP_MAX_DEVICES)
            return gp_error_set(GP_ERR_INVALID, "the interleaved schedule needs "
                                "pipeline.virtual >= 2 stages per device and at most %d stages "
                                "in all (got %d x %d)", GP_MAX_DEVICES, n, v);
        if (n < 2 || m % n)
            return gp_error_set(GP_ERR_INVALID, "the interleaved schedule needs 2 or more devices "
                                "and micro-batches in multiples of the devices (got %d devices, "
                                "pipeline.chunks = %d): set chunks to a multiple of %d", n, m,
                                n > 1 ? n : 2);
    }
    if (S <= GP_MAX_DEVICES)
        for (int j = 0; j < S; j++) out->dev_of[j] = gp_schedule_device_of(o->kind, n, j);
    if (gp_schedule_v_shape(o->kind) && S > GP_MAX_DEVICES)
        return gp_error_set(GP_ERR_INVALID, "%s places 2 stages on each device: at most %d "
                            "devices (got %d)", gp_schedule_kind_name(o->kind),
                            GP_MAX_DEVICES / 2, n);
    if (o->kind == GP_SCHEDULE_DUALPIPE_V && m < 2 * n)
        return gp_error_set(GP_ERR_INVALID, "dualpipe-v needs at least as many micro-batches as "
                            "stages, 2 x %d devices (got pipeline.chunks = %d): set chunks to "
                            "%d or more, or use zb-v", n, m, 2 * n);
    if ((o->kind == GP_SCHEDULE_FILE || o->kind == GP_SCHEDULE_FILE_V) &&
        (!o->file || o->file->n != n || o->file->stages != S || o->file->m != m))
        return gp_error_set(GP_ERR_INVALID, "the schedule file %s is for %d devices, %d stages "
                            "and %d micro-batches; this pipeline has %d, %d and %d",
                            o->file ? o->file->path : "(none)", o->file ? o->file->n : 0,
                            o->file ? o->file->stages : 0, o->file ? o->file->m : 0, n, S, m);
    out->list = calloc((size_t)n, sizeof *out->list);
    out->count = calloc((size_t)n, sizeof *out->count);
    op *ord[GP_MAX_DEVICES] = {NULL};
    int len[GP_MAX_DEVICES] = {0};
    size_t cells = (size_t)m * (size_t)S;
    int *fk = malloc(cells * sizeof *fk), *bk = malloc(cells * sizeof *bk);
    int *wk = malloc(cells * sizeof *wk);
    gp_status st = out->list && out->count && fk && bk && wk
                       ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
    for (int d = 0; d < n && st == GP_OK; d++) {
        ord[d] = malloc((size_t)(3 * m * v) * sizeof **ord);
        if (!ord[d]) st = gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
    }
    if (st == GP_OK) st = compute_orders(o, v, ord, len);
    if (st == GP_OK) st = assign_clocks(o, S, ord, len, fk, bk, wk);
    /* the policy's question: is a forward's next computation on its
     * device its own backward (or backward's data half)? */
    bool *bnext = st == GP_OK ? calloc(cells, sizeof *bnext) : NULL;
    if (st == GP_OK && !bnext) st = gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
    for (int d = 0; d < n && st == GP_OK; d++)
        for (int q = 0; q + 1 < len[d]; q++) {
            op f = ord[d][q], b = ord[d][q + 1];
            if (f.kind == GP_INSTR_FORWARD && b.i == f.i && b.j == f.j &&
                (b.kind == GP_INSTR_BACKWARD || b.kind == GP_INSTR_BACKWARD_DATA))
                bnext[f.i * S + f.j] = true;
        }
    for (size_t q = 0; st == GP_OK && q < cells; q++) {
        int k = bk[q] > wk[q] ? bk[q] : wk[q];
        if (k + 1 > out->clocks) out->clocks = k + 1;
    }
    for (int d = 0; d < n && st == GP_OK; d++) {
        /* at most 2 per forward, 4 per backward, a copy per skip each; the
         * end: 6 per stage + the barrier and the clip */
        gp_instr *l = calloc((size_t)(6 * m * v + 6 * v + 2 + 2 * m * o->n_skips), sizeof *l);
        if (!l) {
            st = gp_error_set(GP_ERR_OOM, "out of host memory for the schedule");
            break;
        }
        out->list[d] = l;
        int c = 0;
        for (int q = 0; q < len[d]; q++) {
            op e = ord[d][q];
            int i = e.i, j = e.j;
            bool ck = gp_ckpt_checkpointed(o->checkpoint, bnext[i * S + j]);
            if (e.kind == GP_INSTR_FORWARD) {
                int k = fk[i * S + j];
                /* the activation arrives at the start of its forward's clock */
                if (j > 0) l[c++] = instr(GP_INSTR_RECV_ACT, i, j, k, j - 1, ck);
                for (int x = 0; x < o->n_skips; x++) /* the skips it pops, straight from their stash */
                    if (o->skips[x].to == j) {
                        l[c] = instr(GP_INSTR_RECV_SKIP, i, j, k, o->skips[x].from, ck);
                        l[c++].skip = o->skips[x].id;
                    }
                l[c++] = instr(GP_INSTR_FORWARD, i, j, k, j, ck);
            } else if (e.kind == GP_INSTR_BACKWARD_WEIGHTS) {
                l[c++] = instr(GP_INSTR_BACKWARD_WEIGHTS, i, j, wk[i * S + j], j, ck);
            } else {
                int k = bk[i * S + j];
                /* The recompute needs only the stashed input, so it is listed
                 * before the gradient's arrival and overlaps the next stage's
                 * backward of the previous clock. */
                if (ck) l[c++] = instr(GP_INSTR_RECOMPUTE, i, j, k, j, ck);
                if (j < S - 1) l[c++] = instr(GP_INSTR_RECV_GRAD, i, j, k, j + 1, ck);
                for (int x = 0; x < o->n_skips; x++) /* its stashes' gradients */
                    if (o->skips[x].from == j) {
                        l[c] = instr(GP_INSTR_RECV_SKIP_GRAD, i, j, k, o->skips[x].to, ck);
                        l[c++].skip = o->skips[x].id;
                    }
                l[c++] = instr(e.kind, i, j, k, j, ck);
            }
        }
        out->count[d] = c;
    }
    for (int d = 0; d < n && st == GP_OK; d++)
        out->count[d] += end_of_step(o, d, S, out->clocks, out->dev_of,
                                     out->list[d] + out->count[d]);
    for (int d = 0; d < n; d++) free(ord[d]);
    free(bnext);
    free(fk);
    free(bk);
    free(wk);
    if (st != GP_OK) gp_schedule_free(out);
    return st;
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
