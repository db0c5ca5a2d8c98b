/*
 * sim.c — the stage model, planning from a profile, and the pipeline
 * simulator (balance.h).
 *
 * The simulator does not restate GPipe's order: it walks the instruction
 * lists gp_schedule_gpipe makes for the executor, the end of the step
 * included (barrier, commit, update), with the executor's rules for when a
 * copy may start and when the barrier lets go, so a change to the schedule
 * changes both.
 */
#include "balance/balance.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Whether a checkpointed forward of the stage [first, last] keeps layer k
 * (gp_ckpt_kept's rule on the profile's flags: a layer and the ones in
 * place after it go together; the stage's first layer runs out of place). */
static bool kept_at(const gp_profile *p, int first, int last, int k)
{
    int h = k, e = k;
    while (h > first && p->mem[h].inplace) h--;
    while (e < last && p->mem[e + 1].inplace) e++;
    for (int q = h; q <= e; q++)
        if (p->mem[q].ckpt_keep) return true;
    return false;
}

/* Layer k's part of stage [first, last] (j of a pipeline whose first
 * trainable layer is ft), added to st: the one body of gp_stage_times_of's
 * sum and of the planner's running sums (gp_stage_sums), which add the
 * same terms in the same order and so get the same bits. */
static void layer_term(const gp_profile *p, const gp_layer_times *lt, int j, int first, int last,
                       int k, gp_stage_times *st)
{
    int ft = p->first_trainable;
    if (p->mem[k].fused && k > first) return; /* its batch norm's work */
    /* a blocked chain this stage's edge cuts (gp_layer_mem.x_chain,
     * y_chain): a reorder of x or of y in each pass */
    const gp_layer_mem *mm = &p->mem[k];
    double cut = (mm->x_chain && first > mm->x_from ? lt[k - 1].copy : 0) +
                 (mm->y_chain && last < mm->y_to ? lt[k].copy : 0);
    st->F += lt[k].fwd + cut;
    if (!kept_at(p, first, last, k)) st->R += lt[k].recompute + cut;
    if (j > 0 || k > ft) {
        st->Bd += lt[k].bwd_data + cut;
        st->W += lt[k].bwd_weights + cut;
    } else if (k == ft) {
        st->W += (lt[k].bwd_alone > 0 ? lt[k].bwd_alone : lt[k].bwd_weights) + cut;
    }
    st->update += p->mem[k].update;
}

/* What follows the layers' sum: B, the ends' upload and loss, the copies
 * in.  `sums` (may be NULL) lists the skips that cross each boundary. */
static void stage_finish(const gp_profile *p, const gp_layer_times *lt, const gp_stage_sums *sums,
                         double loss, double upload, int j, int n, int first, int count,
                         gp_stage_times *st);

gp_stage_times gp_stage_times_of(const gp_profile *p, const gp_layer_times *lt, double loss,
                                 double upload, int j, int n, int first, int count)
{
    gp_stage_times st = {0};
    int last = first + count - 1;
    for (int k = first; k <= last; k++) layer_term(p, lt, j, first, last, k, &st);
    stage_finish(p, lt, NULL, loss, upload, j, n, first, count, &st);
    return st;
}

/* The planner asks for every stage [first, last] of every pipeline, n L^2
 * of them, and each sum was O(L): 69% of planning Llama 3 70B (883
 * layers) on 64 GPUs.  A layer's term depends on `last` only where the
 * stage's end cuts a blocked chain it belongs to (y_to > last) or its run
 * of in-place layers (kept_at): the layers from `dep[last]` on.  So for
 * each first (a row, made when first asked for) the running sums of the
 * terms as for last = L - 1 are kept, and a stage ending at `last` takes
 * the row's sum before dep[last] and adds the rest as gp_stage_times_of
 * does: the same terms in the same order, the same bits.  Stages of the
 * first pipeline stage (j = 0, its first trainable layer's backward alone)
 * take the plain sum: they all begin at layer 0. */
struct gp_stage_sums {
    const gp_profile *p;
    const gp_layer_times *lt;
    int L;
    int *dep;      /* [L]: the first layer whose term depends on the stage ending there */
    int *cross_at, *cross; /* [L + 2], [..]: the skips from < b <= to, in order, at
                              cross[cross_at[b] .. cross_at[b + 1]) */
    double **row;  /* [L]: NULL until asked; row[first][5 i ..]: F, R, Bd, W, update
                      after the layers first .. first + i - 1 */
};

enum { SUMS_MAX_BYTES = 256 << 20 };

gp_stage_sums *gp_stage_sums_new(const gp_profile *p, const gp_layer_times *lt)
{
    int L = p->L;
    if (L < 1 || (double)L * (double)(L + 1) / 2 * 5 * sizeof(double) > SUMS_MAX_BYTES)
        return NULL;
    gp_stage_sums *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = p;
    s->lt = lt;
    s->L = L;
    s->dep = malloc((size_t)L * sizeof *s->dep);
    s->row = calloc((size_t)L, sizeof *s->row);
    if (!s->dep || !s->row) {
        gp_stage_sums_free(s);
        return NULL;
    }
    size_t ncross = 0;
    for (int t = 0; t < p->n_skips; t++)
        if (p->skips[t].to > p->skips[t].from)
            ncross += (size_t)(p->skips[t].to - p->skips[t].from);
    s->cross_at = calloc((size_t)L + 2, sizeof *s->cross_at);
    s->cross = malloc((ncross ? ncross : 1) * sizeof *s->cross);
    if (!s->cross_at || !s->cross || ncross > (size_t)SUMS_MAX_BYTES / sizeof(int)) {
        gp_stage_sums_free(s);
        return NULL;
    }
    for (int b = 0, c = 0; b <= L; b++) { /* skips are few where L is large */
        s->cross_at[b] = c;
        for (int t = 0; t < p->n_skips && b < L; t++)
            if (p->skips[t].from < b && b <= p->skips[t].to) s->cross[c++] = t;
        if (b == L) s->cross_at[b + 1] = c;
    }
    /* dep in one pass each, not O(L) a stage end (plan_open makes one of
     * these a layout): the first of the run of in-place layers that
     * kept_at's walk from an earlier layer crosses `last` with ... */
    for (int last = 0, h = 0; last < L; last++) {
        if (last == 0 || !p->mem[last].inplace) h = last; /* (kept_at's walk back) */
        s->dep[last] = last < L - 1 && p->mem[last + 1].inplace ? h : last + 1;
    }
    /* ... or, earlier, the first layer whose output begins a blocked chain
     * past last (k ascending: the first such k stays) */
    for (int k = 0; k < L; k++)
        for (int last = k; p->mem[k].y_chain && last < p->mem[k].y_to && last < L; last++)
            if (s->dep[last] > k) s->dep[last] = k;
    return s;
}

void gp_stage_sums_free(gp_stage_sums *s)
{
    if (!s) return;
    if (s->row)
        for (int f = 0; f < s->L; f++) free(s->row[f]);
    free(s->row);
    free(s->dep);
    free(s->cross_at);
    free(s->cross);
    free(s);
}

gp_stage_times gp_stage_sums_times(gp_stage_sums *s, double loss, double upload, int j, int n,
                                   int first, int count)
{
    int last = first + count - 1;
    if (j == 0 || first < 0 || count < 1 || last >= s->L)
        return gp_stage_times_of(s->p, s->lt, loss, upload, j, n, first, count);
    if (!s->row[first]) {
        double *r = malloc((size_t)(s->L - first + 1) * 5 * sizeof *r);
        if (!r) return gp_stage_times_of(s->p, s->lt, loss, upload, j, n, first, count);
        gp_stage_times acc = {0}; /* (every j > 0 adds the same terms) */
        for (int i = 0;; i++) {
            r[5 * i] = acc.F, r[5 * i + 1] = acc.R, r[5 * i + 2] = acc.Bd;
            r[5 * i + 3] = acc.W, r[5 * i + 4] = acc.update;
            if (first + i == s->L) break;
            layer_term(s->p, s->lt, j, first, s->L - 1, first + i, &acc);
        }
        s->row[first] = r;
    }
    int k0 = s->dep[last] > first ? s->dep[last] : first;
    const double *r = s->row[first] + 5 * (k0 - first);
    gp_stage_times st = {.F = r[0], .R = r[1], .Bd = r[2], .W = r[3], .update = r[4]};
    for (int k = k0; k <= last; k++) layer_term(s->p, s->lt, j, first, last, k, &st);
    stage_finish(s->p, s->lt, s, loss, upload, j, n, first, count, &st);
    return st;
}

static void stage_finish(const gp_profile *p, const gp_layer_times *lt, const gp_stage_sums *sums,
                         double loss, double upload, int j, int n, int first, int count,
                         gp_stage_times *st)
{
    int last = first + count - 1;
    st->B = st->Bd + st->W;
    if (j == 0) st->F += upload;
    if (j == n - 1) st->F += loss;
    if (j > 0) st->copy_act = lt[first - 1].copy;
    if (j < n - 1) st->copy_grad = lt[last].copy;
    if (sums) { /* the same skips in the same order, from the boundaries' lists */
        for (int q = sums->cross_at[first]; q < sums->cross_at[first + 1]; q++) {
            const gp_profile_skip *k = &p->skips[sums->cross[q]];
            if (k->to <= last) st->copy_act += lt[k->from].copy; /* from < first <= to */
        }
        for (int q = sums->cross_at[last + 1]; q < sums->cross_at[last + 2]; q++) {
            const gp_profile_skip *k = &p->skips[sums->cross[q]];
            if (k->from >= first) st->copy_grad += lt[k->from].copy; /* from <= last < to */
        }
        return;
    }
    for (int t = 0; t < p->n_skips; t++) { /* the skips' own copies */
        const gp_profile_skip *k = &p->skips[t];
        bool from_in = k->from >= first && k->from <= last;
        bool to_in = k->to >= first && k->to <= last;
        if (to_in && k->from < first) st->copy_act += lt[k->from].copy;
        if (from_in && k->to > last) st->copy_grad += lt[k->from].copy;
    }
}

/* How many micro-batches a skip's tensor may be held for (the stages it
 * crosses, as far as known: min(a, b), at least 1, at most SIM_HOLD - 1). */
enum { SIM_HOLD = 64 };
static int hold_of(int a, int b)
{
    int d = a < b ? a : b;
    return d < 1 ? 1 : d >= SIM_HOLD ? SIM_HOLD - 1 : d;
}

/* Counts down one: frees what q[0] held (returns it), shifts the rest. */
static double hold_tick(double *q)
{
    double f = q[0];
    memmove(q, q + 1, (SIM_HOLD - 1) * sizeof *q);
    q[SIM_HOLD - 1] = 0;
    return f;
}

/* Layer k's activation sizes at the run's storage (p->act_dtype): every
 * layer output at its element's size, the model input (layer 0's input)
 * FP32, and what a layer keeps beside its output (gp_saved, measured with
 * it) as measured. */
typedef struct {
    double in, out, keep;
} stored_mem;

static stored_mem stored(const gp_profile *p, int k)
{
    const gp_layer_mem *m = &p->mem[k];
    double h = p->act_dtype == GP_BF16 ? 0.5 : 1.0;
    stored_mem s = {k == 0 ? m->in_per_sample : h * m->in_per_sample, h * m->out_per_sample,
                    m->keep_per_sample};
    if (!m->inplace && !m->unkept) s.keep = fmax(s.keep - (1 - h) * m->out_per_sample, 0.0);
    return s;
}

/* What layers [first, first + count) hold whatever runs: parameters,
 * gradients and their share of the optimizer's state (ZeRO stage 1: 1 /
 * optim_shards of it). */
static double stage_static_bytes(const gp_profile *p, int first, int count)
{
    double shards = p->optim_shards > 1 ? p->optim_shards : 1, b = 0;
    for (int k = first; k < first + count; k++)
        b += (double)(p->mem[k].param_bytes + p->mem[k].grad_bytes) +
             (double)p->mem[k].optim_bytes / shards;
    return b;
}

/* What a forward that keeps everything holds of layer k of the stage
 * [first, last] for its backward, per sample (its backward frees it). */
static double kept_bytes(const gp_profile *p, int first, int last, int k)
{
    const gp_layer_mem *mm = p->mem;
    stored_mem sk = stored(p, k);
    double kk = sk.keep;
    /* a stage's first layer runs out of place: its input is the stage's */
    if (k == first && mm[k].inplace) kk += sk.out;
    if (k == last) { /* the stage output is kept: the memory of the layer that made it */
        int o = k; /* through the in-place layers over it (the whole model's flags) */
        while (o > first && mm[o].inplace) o--;
        if (mm[o].unkept) kk += stored(p, o).out;
    }
    return kk;
}

/* One layer's term of bwd_rises: its gradients g and dx, the pops'
 * pending (fmax(pending, 0)) and held, less what the layers above freed
 * past `early`. */
static double rise_at(double g, double dx, double pend, double held, double freed, double early)
{
    return g + dx + pend + held - (freed > early ? freed - early : 0);
}

/* The most a backward of the stage [first, last] (stage j; its data half
 * alone, rise[2] below) holds over what it began with, per sample: layer c's
 * backward makes the gradients of its inputs (a skip's pop's too) while
 * its own incoming one is alive, beside the pops' gradients made above it
 * and not yet added in at their stash (or sent back: a skip from an
 * earlier stage), and, in a data half, the incoming gradients of the
 * layers above with parameters (gp_ckpt_backward_data keeps them for the
 * weights half).  A whole backward has freed what the layers above kept
 * (less `early`, what the forward freed of that already).  The stage's
 * incoming gradient, counted in what it began with, is gone below the
 * last layer (freed, or handed down as the gradient counted there), except
 * in a data half whose last layer has parameters.
 * Gradients at FP32 bytes.  gp_stage_peak_trace counted only the largest
 * input's gradient at the backward's start, and a 2-stage U-Net's stage 1
 * peaked 0.87 MiB over its plan (0.95x) where its decoder's concatenation
 * made both halves of its input's gradient beside that gradient.
 * All three a stage needs in one walk (rise[0]: a whole backward, less
 * `early`; rise[1]: a whole backward, early 0; rise[2]: a data half):
 * kk[c - first] is kept_bytes of layer c, and pop (2 count, zeroed) the
 * walk's scratch.  Until 2026-12-01 each took its own walk, calloc and
 * kept_bytes, a tenth of planning Llama 3 70B on 64 GPUs; the sums are
 * the same terms in the same order, so the same bits. */
static void bwd_rises(const gp_profile *p, int j, int first, int last, double early,
                      const double *kk, double *pop, double *rise)
{
    const gp_layer_mem *mm = p->mem;
    int count = last - first + 1;
    /* per layer c of the stage: the skips it pops (pop[c - first]) and
     * those that stash at c, popped inside the stage (stash[c - first]) */
    double *stash = pop + count;
    for (int t = 0; t < p->n_skips; t++) {
        const gp_profile_skip *k = &p->skips[t];
        if (k->to < first || k->to > last) continue;
        pop[k->to - first] += mm[k->from].out_per_sample;
        if (k->from >= first) stash[k->from - first] += mm[k->from].out_per_sample;
    }
    double freed = 0, held = 0, pending = 0; /* popped above c, stashed below */
    rise[0] = rise[1] = rise[2] = 0;
    int ft = j == 0 ? p->first_trainable : -1; /* stage 0: no dx at or below it */
    double last_out = stored(p, last).out;
    for (int c = last; c >= first; c--) {
        pending -= stash[c - first]; /* added into c's incoming gradient first */
        double dx = c > ft ? mm[c].in_per_sample + pop[c - first] : 0;
        /* (a data half keeps a layer's with parameters for its weights half) */
        bool gone_half = c < last && !(mm[last].param_bytes > 0);
        double g = c < last ? mm[c].out_per_sample - last_out : 0;
        double gh = c < last ? mm[c].out_per_sample - (gone_half ? last_out : 0) : 0;
        double pend = fmax(pending, 0);
        double r[3] = {rise_at(g, dx, pend, 0, freed, early), rise_at(g, dx, pend, 0, freed, 0),
                       rise_at(gh, dx, pend, held, 0, 0)};
        for (int q = 0; q < 3; q++)
            if (r[q] > rise[q]) rise[q] = r[q];
        pending += pop[c - first];
        if (c < last && mm[c].param_bytes > 0) held += mm[c].out_per_sample;
        freed += kk[c - first];
    }
}

/* The levels of one stage's sent copies (sent_levels), [m] each. */
typedef struct {
    int act[GP_MAX_CHUNKS], grad[GP_MAX_CHUNKS];
} sent_lvls;

/* Lockstep frees what another stage copies from this one at fixed places
 * of the device's list (pipeline.c, await_sent): before an instruction of
 * clock k, what copies of a level (2 k', + 1 for a copy that feeds a
 * backward) under 2 k read, and before a copy that feeds a backward, those
 * of level 2 k too.  lvl_act[i], lvl_grad[i]: the levels of the copies of
 * stage j's output and input gradient of micro-batch i (-1: none). */
static void sent_levels(const gp_schedule *sched, int j, int *lvl_act, int *lvl_grad)
{
    for (int i = 0; i < sched->m && i < GP_MAX_CHUNKS; i++) lvl_act[i] = lvl_grad[i] = -1;
    for (int q = 0; q < 2; q++) { /* the readers: stage j + 1's device, j - 1's */
        int r = j + (q == 0 ? 1 : -1), e = r >= 0 && r < sched->stages ? sched->dev_of[r] : -1;
        if (e < 0 || (q == 1 && j + 1 < sched->stages && e == sched->dev_of[j + 1])) continue;
        for (int c = 0; c < sched->count[e]; c++) {
            const gp_instr *in = &sched->list[e][c];
            if (in->from != j || in->i < 0 || in->i >= sched->m || in->i >= GP_MAX_CHUNKS)
                continue;
            if (in->kind == GP_INSTR_RECV_ACT) lvl_act[in->i] = 2 * in->k;
            if (in->kind == GP_INSTR_RECV_GRAD) lvl_grad[in->i] = 2 * in->k + 1;
        }
    }
}

/* Tensors of micro-batches [lo, hi) (the ones held: a few in flight)
 * awaiting their copies, each until lockstep frees it. */
typedef struct {
    const int *lvl; /* [m]: its copy's level, -1: none */
    double *bytes;  /* [m]: held, 0: none */
    int lo, hi;
    int min; /* the least level held in [lo, hi) at most (INT_MAX: none), so that the
                many instructions before which nothing is freed skip the scan */
} sent_held;

static void sent_hold(sent_held *q, int i, double b)
{
    if (q->lo == q->hi) q->lo = q->hi = i, q->min = INT_MAX;
    if (q->lvl[i] < q->min) q->min = q->lvl[i];
    if (i < q->lo) q->lo = i;
    if (i >= q->hi) q->hi = i + 1;
    q->bytes[i] += b;
}

/* What lockstep frees of q before instruction `in` of the stage's device:
 * the tensors whose copies' levels are at most what it waits for. */
static double sent_free(sent_held *q, const gp_instr *in)
{
    bool bwd_copy = in->kind == GP_INSTR_RECV_GRAD || in->kind == GP_INSTR_RECV_SKIP_GRAD;
    int upto = 2 * in->k - (bwd_copy ? 0 : 1);
    if (upto < q->min) return 0;
    double f = 0;
    int least = INT_MAX;
    for (int i = q->lo; i < q->hi; i++) {
        if (!(q->bytes[i] > 0)) continue;
        if (q->lvl[i] <= upto) f += q->bytes[i], q->bytes[i] = 0;
        else if (q->lvl[i] < least) least = q->lvl[i];
    }
    q->min = least;
    while (q->lo < q->hi && q->bytes[q->lo] == 0) q->lo++;
    while (q->hi > q->lo && q->bytes[q->hi - 1] == 0) q->hi--;
    return f;
}

/* sent_levels of each stage of sched ([sched->stages]), NULL where no
 * memory: they depend on the schedule alone, and the planner walks one
 * schedule for thousands of splits (each walk scanned the readers' lists
 * again until 2026-12-01). */
static sent_lvls *sent_levels_all(const gp_schedule *sched)
{
    sent_lvls *lv = malloc((size_t)sched->stages * sizeof *lv);
    for (int j = 0; lv && j < sched->stages; j++) sent_levels(sched, j, lv[j].act, lv[j].grad);
    return lv;
}

static double stage_trace(const gp_profile *p, const gp_schedule *sched, const int64_t *sizes,
                          int j, int first, int count, double *level, const sent_lvls *lv);
static double stage_walk(const gp_profile *p, const gp_schedule *sched, const int64_t *sizes,
                         int j, int first, int count, double *level, const sent_lvls *lv,
                         double *buf);

double gp_stage_peak_bytes(const gp_profile *p, const gp_schedule *sched, const int64_t *sizes,
                           int j, int first, int count)
{
    return stage_trace(p, sched, sizes, j, first, count, NULL, NULL);
}

static bool ck_of(const bool *fwd_ck, int i)
{
    return i >= 0 && i < GP_MAX_CHUNKS && fwd_ck[i];
}

double gp_stage_peak_trace(const gp_profile *p, const gp_schedule *sched, const int64_t *sizes,
                           int j, int first, int count, double *level)
{
    return stage_trace(p, sched, sizes, j, first, count, level, NULL);
}

/* Scratch of a stage's walk: its layers' kept_bytes, bwd_rises' two
 * arrays; on the stack up to this many layers (the planner's stages of
 * Llama 3 70B reach 883), beyond it allocated. */
enum { TRACE_STACK_LAYERS = 1024 };

/* gp_stage_peak_trace with lv (optional): sent_levels of the stage's
 * schedule, each stage's, made once (sent_levels_all). */
static double stage_trace(const gp_profile *p, const gp_schedule *sched, const int64_t *sizes,
                          int j, int first, int count, double *level, const sent_lvls *lv)
{
    double stack_buf[3 * TRACE_STACK_LAYERS];
    double *buf = count <= TRACE_STACK_LAYERS ? stack_buf
                                              : malloc(3 * (size_t)count * sizeof *buf);
    if (!buf) { /* (no plan says it fits) */
        for (int c = 0; level && c < sched->count[sched->dev_of[j]]; c++) level[c] = HUGE_VAL;
        return HUGE_VAL;
    }
    double peak = stage_walk(p, sched, sizes, j, first, count, level, lv, buf);
    if (buf != stack_buf) free(buf);
    return peak;
}

/* stage_trace's body; buf: 3 count doubles of scratch. */
static double stage_walk(const gp_profile *p, const gp_schedule *sched, const int64_t *sizes,
                         int j, int first, int count, double *level, const sent_lvls *lv,
                         double *buf)
{
    int n = sched->stages, last = first + count - 1;
    int d = sched->dev_of[j]; /* interleaved, zb-v: the device's list holds other stages too */
    const gp_layer_mem *mm = p->mem;
    double stat = stage_static_bytes(p, first, count), ws = 0, keep = 0, in_max = 0, ck_max = 0;
    double ck_keep = 0; /* what a checkpointed forward keeps of `keep` (and beyond it) */
    for (int k = first; k <= last; k++) {
        if ((double)mm[k].workspace_bytes > ws) ws = (double)mm[k].workspace_bytes;
        stored_mem sk = stored(p, k);
        double kk = kept_bytes(p, first, last, k);
        buf[k - first] = kk;
        keep += kk;
        if (kept_at(p, first, last, k)) {
            ck_keep += kk;
            /* the output no backward reads stays for the recompute of the
             * layer after its run in place, unless that one is kept too */
            int o = k;
            while (o > first && mm[o].inplace) o--;
            if (k < last && !mm[k + 1].inplace && mm[o].unkept && !kept_at(p, first, last, k + 1))
                ck_keep += stored(p, o).out;
        }
        /* (at FP32 bytes: a layer whose activations are stored in bf16
         * widens its input and gradients to FP32 while it runs) */
        if (mm[k].in_per_sample > in_max) in_max = mm[k].in_per_sample;
        /* a checkpointed forward holds the layer's input and what it makes */
        double t = sk.in + kk;
        if (t > ck_max) ck_max = t;
    }
    double in = stored(p, first).in, out = stored(p, last).out;
    /* skips from an earlier stage count as more input, to a later one as
     * more output: received, held and answered the same way, except how
     * long.  A skip to a stage d > 1 stages on is copied when that stage
     * runs the micro-batch's forward, d forwards of this stage later (the
     * micro-batches in flight between the two), so this stage holds d
     * micro-batches' of it; likewise a skip's gradient back to a stage d
     * before, d backwards.  d is bounded by the stages left and by the
     * layers between (each stage has one at least): the partitioner asks
     * for one stage at a time.  Until 2026-11-25 every skip was freed after
     * one computation, and a 4-stage U-Net (10, 28) that planned 247.3 MiB
     * on stage 0 needed 259.1 (its encoder skips go to stage 3). */
    double far_out[SIM_HOLD] = {0}, far_in[SIM_HOLD] = {0}, far_out_sum = 0, far_in_sum = 0;
    for (int t = 0; t < p->n_skips; t++) {
        const gp_profile_skip *k = &p->skips[t];
        double b = stored(p, k->from).out;
        if (k->from < first && k->to >= first && k->to <= last) {
            in += b;
            int dist = hold_of(j, first - k->from);
            if (dist > 1) far_in[dist] += b, far_in_sum += b;
        }
        if (k->from >= first && k->from <= last && k->to > last) {
            out += b;
            int dist = hold_of(n - 1 - j, k->to - last);
            if (dist > 1) far_out[dist] += b, far_out_sum += b;
        }
    }
    /* between a split backward's halves, the incoming gradients of the
     * layers with parameters (their weights halves read them; the others'
     * are freed as the data half goes: gp_ckpt_backward_data), less the
     * stage output's, which arrived already (counted in out until the
     * weights half, even where the last layer frees it sooner).  Until
     * 2026-11-25 every layer's was held, and this was estimated as what
     * the forward kept, which missed the in-place layers' gradients: ZB-H1
     * on a U-Net peaked 12-25% over its plan */
    /* the stage output no backward of the stage reads (end_unread, run
     * out of place): a forward that keeps hands it to the next stage's
     * copy and frees it then (gp_stash_hand_out), not at the backward;
     * `keep` counts it either way (unkept above, or keep_per_sample) */
    double end_free = j < n - 1 && mm[last].end_unread && (last == first || !mm[last].inplace)
                          ? stored(p, last).out
                          : 0;
    /* the stage input its first layer's backward does not read: a forward
     * that keeps frees it after that layer (checkpoint.c, drop_unread_input) */
    double in_free = mm[first].in_unread ? stored(p, first).in : 0;
    bool fwd_ck[GP_MAX_CHUNKS] = {0}; /* micro-batch i's forward checkpointed */
    /* stage 0: micro-batch i's input uploaded.  A forward of stage 0
     * uploads the next micro-batch's input too, so that its copy overlaps
     * the forward (pipeline.c, await_upload): held from then.  Until
     * 2026-12-01 each input counted from its own forward, and 1F1B's
     * stage 0, which runs a backward between two forwards, measured a
     * micro-batch's input over its plan (a run the start-up check let
     * through ran out of memory in its first step). */
    bool uploaded[GP_MAX_CHUNKS + 1] = {0};
    /* the last stage: micro-batch i's targets, uploaded by its forward (or
     * by the one before), and i + 1's too, during i's loss (await_upload);
     * i's freed after its loss.  Until 2026-12-01 not counted: a 2-stage
     * U-Net's stage 1 under 1F1B held two masks of targets over its plan */
    bool labeled[GP_MAX_CHUNKS + 1] = {0};
    double lab = j == n - 1 ? p->target_bytes : 0;
    bool whole_next = false; /* the weights half next ran with its data half */
    double grads = 0;
    for (int k = first; k < last; k++)
        if (mm[k].param_bytes > 0) grads += stored(p, k).out;
    /* bf16 copies (p->bf16_copies): what crosses a boundary is sent,
     * received and, between a checkpointed forward and its recompute, held
     * packed (h of its FP32 bytes), and widened while an instruction reads
     * it (pipeline.c, "copies in bfloat16") */
    bool pk = p->bf16_copies;
    double h = pk ? 0.5 : 1.0;
    /* The input gradient sent back: the previous stage copies it when it
     * reaches its receive, which may be as late as this stage's next
     * backward (1F1B: that stage's next forward comes first; on a loaded
     * machine it often finishes after this stage's next backward has
     * begun), so it is freed when the next one is made (bwd_hold[0]).
     * Until 2026-11-25 it was freed after the next computation: a 2-stage
     * U-Net's stage 1 then measured up to 1.23x its plan (test_balance) */
    double cur = stat + ws, peak = cur, pending = 0;
    /* fwd_hold[q] is freed when q + 1 more forwards have run, bwd_hold[q]
     * when q + 1 more backwards have made their input gradients */
    double fwd_hold[SIM_HOLD] = {0}, bwd_hold[SIM_HOLD] = {0};
    /* the output and input gradient each micro-batch's neighbour copies,
     * held until lockstep frees them (sent_free).  Until 2026-12-01 an
     * output went at this stage's next computation and a gradient at its
     * next backward, as free-running copies mostly were: where the reader
     * copies late in its list (the V schedules' devices hold two stages),
     * lockstep holds them longer, and v-half's device 0 on test_balance's
     * 4-device U-Net measured 8.04 MiB for a plan of 7.48 (0.93x) */
    sent_lvls own;
    if (!lv) sent_levels(sched, j, own.act, own.grad);
    const int *lvl_act = lv ? lv[j].act : own.act, *lvl_grad = lv ? lv[j].grad : own.grad;
    double act_b[GP_MAX_CHUNKS], grad_b[GP_MAX_CHUNKS];
    for (int i = 0; i < sched->m && i < GP_MAX_CHUNKS; i++) act_b[i] = grad_b[i] = 0;
    sent_held act_q = {lvl_act, act_b, 0, 0, INT_MAX}, grad_q = {lvl_grad, grad_b, 0, 0, INT_MAX};
    /* a backward's rise over its start (after a forward that kept all, or
     * checkpointed), a data half's: once a stage, not once a micro-batch */
    double rise[3];
    memset(buf + count, 0, 2 * (size_t)count * sizeof *buf);
    bwd_rises(p, j, first, last, end_free + in_free, buf, buf + count, rise);
    double rise_kept = fmax(in_max, rise[0]);
    double rise_ck = fmax(in_max, rise[1]);
    double rise_half = fmax(in_max, rise[2]);
    for (int c = 0; c < sched->count[d]; c++) {
        const gp_instr *in_ = &sched->list[d][c];
        /* (nothing held: nothing to free, the same bits as subtracting 0) */
        if (gp_instr_per_micro_batch(in_->kind) && (act_q.lo < act_q.hi || grad_q.lo < grad_q.hi))
            cur -= sent_free(&act_q, in_) + sent_free(&grad_q, in_);
        if (in_->j != j && gp_instr_per_micro_batch(in_->kind)) {
            if (level) level[c] = cur; /* another stage's: this one's bytes stay */
            continue;
        }
        double s = in_->i >= 0 ? (double)sizes[in_->i] : 0, t = cur; /* i < 0: the end */
        /* a packed send: the FP32 tensor and its packed form at once */
        double send_out = pk && j < n - 1 ? out * s : 0, send_in = pk && j > 0 ? in * s : 0;
        /* a backward-data run whole (gp_instr_whole_backward), and its
         * weights half then empty */
        gp_instr_kind kind = in_->kind;
        const gp_instr *nx = c + 1 < sched->count[d] ? &sched->list[d][c + 1] : NULL;
        if (gp_instr_whole_backward(in_, nx))
            kind = GP_INSTR_BACKWARD, whole_next = true;
        else if (kind == GP_INSTR_BACKWARD_WEIGHTS && whole_next)
            kind = GP_INSTR_KIND_COUNT, whole_next = false;
        /* what a forward that kept everything freed early, gone from what
         * its backward frees */
        bool kept_all = !ck_of(fwd_ck, in_->i);
        double early = kept_all ? end_free + in_free : 0;
        switch (kind) {
        case GP_INSTR_RECV_ACT: cur += h * in * s; break;
        case GP_INSTR_RECV_GRAD: cur += h * out * s; break;
        case GP_INSTR_FORWARD:
            if (j == 0 && in_->i >= 0 && in_->i < GP_MAX_CHUNKS) {
                for (int q = in_->i; q <= in_->i + 1 && q < sched->m; q++)
                    if (!uploaded[q]) cur += in * (double)sizes[q], uploaded[q] = true;
            } else if (j == 0) {
                cur += in * s;
            }
            /* widened; a forward that keeps frees the packed form first */
            else if (pk) cur += (in_->checkpointed ? 1 : 1 - h) * in * s;
            if (lab > 0 && in_->i >= 0 && in_->i < GP_MAX_CHUNKS && !labeled[in_->i])
                cur += lab * s, labeled[in_->i] = true;
            t = cur + ck_max * s;
            if (in_->checkpointed) {
                /* the output waits for the next stage's copy (packed: h of
                 * it); the last stage keeps only dlogits, in FP32 */
                cur += ck_keep * s;
                if (j < n - 1) pending += h * out * s;
                cur += (j < n - 1 ? h : 1) * out * s;
                if (pk && j > 0) cur -= in * s; /* held packed until the recompute */
                t = fmax(t, cur + send_out);
            } else {
                cur += keep * s + (j == n - 1 ? out * s : 0);
                if (pk && j < n - 1) { /* the packed copy of a kept output */
                    pending += h * out * s;
                    cur += h * out * s;
                }
                cur -= in_free * s;
                if (pk) { /* an unread output goes once packed (pack_sends) */
                    t = fmax(t, cur);
                    cur -= end_free * s;
                } else {
                    pending += end_free * s;
                }
            }
            if (in_->i >= 0 && in_->i < GP_MAX_CHUNKS) fwd_ck[in_->i] = in_->checkpointed;
            if (lab > 0 && in_->i >= 0 && in_->i + 1 < sched->m && in_->i + 1 < GP_MAX_CHUNKS &&
                !labeled[in_->i + 1]) {
                cur += lab * (double)sizes[in_->i + 1];
                labeled[in_->i + 1] = true;
                t = fmax(t, cur); /* the loss, both micro-batches' targets there */
            }
            if (j == n - 1 && in_->checkpointed) t = fmax(t, cur);
            cur -= lab * s;
            break;
        case GP_INSTR_RECOMPUTE:
            cur += (keep - ck_keep) * s;
            if (pk && j > 0) cur += (1 - h) * in * s; /* widened again */
            break;
        case GP_INSTR_BACKWARD:
            if (pk && j < n - 1) cur += (1 - h) * out * s; /* the gradient widened */
            t = cur + (kept_all ? rise_kept : rise_ck) * s;
            cur -= (keep + in + out - early) * s;
            if (j > 0) {
                cur += h * in * s; /* dL/d input waits for the previous stage's copy */
                t = fmax(t, cur + send_in);
            }
            break;
        case GP_INSTR_BACKWARD_DATA:
            if (pk && j < n - 1) cur += (1 - h) * out * s;
            /* every layer's incoming gradient stays for the weights half */
            t = cur + rise_half * s;
            cur += grads * s;
            if (j > 0) {
                cur += h * in * s;
                t = fmax(t, cur + send_in);
            }
            break;
        case GP_INSTR_BACKWARD_WEIGHTS:
            cur -= (keep + grads + in + out - early) * s;
            break;
        default: break;
        }
        if (t > peak) peak = t;
        if (cur > peak) peak = cur;
        if (level) level[c] = fmax(t, cur);
        if (gp_instr_computes(in_->kind)) {
            /* what the neighbours copied during this instruction is freed */
            double keep_pending = 0, far = 0;
            if (in_->kind == GP_INSTR_FORWARD && j < n - 1 && (in_->checkpointed || pk)) {
                far = h * far_out_sum * s; /* held longer: fwd_hold */
                keep_pending = h * out * s - far;
            } else if (in_->kind == GP_INSTR_FORWARD) {
                keep_pending = end_free * s; /* until the next stage's copy */
            }
            cur -= pending - keep_pending - far;
            pending = 0;
            int i = in_->i;
            bool mb = i >= 0 && i < sched->m && i < GP_MAX_CHUNKS;
            if (keep_pending > 0 && mb && lvl_act[i] >= 0) sent_hold(&act_q, i, keep_pending);
            else cur -= keep_pending; /* (no copy reads it) */
            if (in_->kind == GP_INSTR_FORWARD) {
                cur -= hold_tick(fwd_hold);
                if (far > 0)
                    for (int q = 2; q < SIM_HOLD; q++) fwd_hold[q - 1] += h * far_out[q] * s;
            }
            if (gp_instr_gives_grad(in_->kind) && j > 0) {
                cur -= hold_tick(bwd_hold);
                if (mb && lvl_grad[i] >= 0) sent_hold(&grad_q, i, h * (in - far_in_sum) * s);
                else bwd_hold[0] += h * (in - far_in_sum) * s;
                for (int q = 2; q < SIM_HOLD; q++) bwd_hold[q - 1] += h * far_in[q] * s;
            }
        }
    }
    return peak;
}

/* ---- planning --------------------------------------------------------------- */

typedef struct {
    const gp_profile *p;
    const gp_plan_opts *o;
    gp_layer_times *lt;     /* at the largest micro-batch size */
    gp_stage_sums *sums;    /* lt's stage sums, NULL where too many layers */
    double loss, upload;
    gp_schedule sched;
    sent_lvls *lv; /* sched's sent_levels (sent_levels_all), NULL: made each call */
    int64_t sizes[GP_MAX_CHUNKS];
    double rfrac[GP_MAX_DEVICES]; /* stage j: share of micro-batches that recompute */
} plan_ctx;

static double plan_mem(void *arg, int j, int first, int count)
{
    plan_ctx *c = arg;
    return stage_trace(c->p, &c->sched, c->sizes, j, first, count, NULL, c->lv);
}

static double plan_cost(void *arg, int j, int first, int count)
{
    plan_ctx *c = arg;
    if (c->o->by == GP_BALANCE_BY_SIZE || !c->p->timed) return plan_mem(arg, j, first, count);
    gp_stage_times st =
        c->sums ? gp_stage_sums_times(c->sums, c->loss, c->upload, j, c->o->n, first, count)
                : gp_stage_times_of(c->p, c->lt, c->loss, c->upload, j, c->o->n, first, count);
    return st.F + st.B + st.copy_act + st.copy_grad + c->rfrac[j] * st.R;
}

static const char *plan_name(void *arg, int k, char *buf, size_t len)
{
    plan_ctx *c = arg;
    snprintf(buf, len, "%s", c->p->mem[k].desc[0] ? c->p->mem[k].desc : "layer");
    if (!c->p->mem[k].desc[0]) snprintf(buf, len, "layer %d", k);
    return buf;
}

static gp_status plan_open(const gp_profile *p, const gp_plan_opts *o, plan_ctx *c)
{
    memset(c, 0, sizeof *c);
    c->p = p;
    c->o = o;
    if (o->m < 1 || o->m > GP_MAX_CHUNKS)
        return gp_error_set(GP_ERR_INVALID, "chunks = %d: use 1..%d micro-batches", o->m,
                            GP_MAX_CHUNKS);
    GP_TRY(gp_microbatch_split(p->batch, o->m, c->sizes));
    c->lt = calloc((size_t)p->L, sizeof *c->lt);
    if (!c->lt) return gp_error_set(GP_ERR_OOM, "out of host memory");
    if (p->timed) {
        gp_profile_times_at(p, c->sizes[0], c->lt, &c->loss, &c->upload);
        c->sums = gp_stage_sums_new(p, c->lt); /* NULL: the plain sums, slower */
    }
    gp_schedule_opts so = {.kind = o->schedule, .n = o->n, .m = o->m,
                           .checkpoint = o->checkpoint, .replicas = 1, .update = true,
                           .check = true};
    gp_status s = gp_schedule_make(&so, &c->sched);
    if (s != GP_OK) {
        gp_stage_sums_free(c->sums);
        free(c->lt);
        return s;
    }
    c->lv = sent_levels_all(&c->sched);
    /* the share of each stage's forwards that recompute, as the schedule's
     * instructions say (the checkpoint module decided them).  Interleaved
     * plans stand in with 1F1B over all n x v stages (gp_model_plan_opts),
     * and ZB-H1 with its untimed order: their own orders may keep a few
     * other micro-batches (interleaved with m = n keeps none), so the
     * recompute cost is an estimate there; memory follows the same
     * instructions, so it is not affected */
    for (int d = 0; d < c->sched.n; d++)
        for (int q = 0; q < c->sched.count[d]; q++) {
            const gp_instr *in = &c->sched.list[d][q];
            if (in->kind == GP_INSTR_FORWARD && in->checkpointed && in->j >= 0 &&
                in->j < GP_MAX_DEVICES)
                c->rfrac[in->j] += 1.0 / o->m;
        }
    return GP_OK;
}

static void plan_close(plan_ctx *c)
{
    gp_stage_sums_free(c->sums);
    free(c->lt);
    free(c->lv);
    gp_schedule_free(&c->sched);
}

/* Interleaved: the simulated step of `balance` (HUGE_VAL where a stage is
 * over its capacity, a device's simulated peak over `limit`, or the
 * simulation fails), lockstep or free-running; *peak (optional): each
 * device's simulated peak bytes.  Stages are checked against their
 * capacity with the planner's model (as the min-max split was) and each
 * device against the interleaved simulation's, which adds its stages'
 * lists together and can need more than the sum of their 1F1B peaks. */
static double refine_step(plan_ctx *c, const int *balance, bool lockstep, const double *limit,
                          double *peak)
{
    const gp_plan_opts *o = c->o;
    int first = 0, nd = o->n / o->virtual_stages;
    for (int j = 0; j < o->n; j++) {
        if (balance[j] < 1) return HUGE_VAL;
        if (o->capacity[j] > 0 && plan_mem(c, j, first, balance[j]) > o->capacity[j])
            return HUGE_VAL;
        first += balance[j];
    }
    gp_sim_result r;
    gp_schedule_kind k = o->sim_kind;
    if (k != GP_SCHEDULE_INTERLEAVED && !gp_schedule_v_shape(k))
        k = o->v_shape ? GP_SCHEDULE_ZB_V : GP_SCHEDULE_INTERLEAVED;
    gp_status s = gp_simulate_schedule(c->p, k, nd, o->virtual_stages, balance, o->m,
                                       o->checkpoint, lockstep, NULL, &r);
    if (s != GP_OK) {
        gp_error_clear();
        return HUGE_VAL;
    }
    for (int d = 0; d < nd; d++) {
        if (limit && r.peak_bytes[d] > limit[d]) return HUGE_VAL;
        if (peak) peak[d] = r.peak_bytes[d];
    }
    return r.step;
}

/* Refine `balance` (feasible, from the DP) by moving one stage boundary by
 * 1..3 layers while the simulated step falls by more than a millionth:
 * steepest descent, at most 64 moves.  The candidates are simulated
 * free-running (a lockstep simulation costs far more at large n and m);
 * under lockstep the refined split is kept only if its lockstep step is
 * not longer than the start's.  A device may hold what the devices'
 * capacities allow (each the sum of its stages', as gp_model_plan_opts
 * splits it), or, if the starting split already needs more, no more than
 * that.  The search stops once it has simulated about 2e7 (stage x
 * micro-batch) pairs: a few seconds, the same split every time. */
/* The unit (gp_profile_units) that begins at layer pos, or -1. */
static int unit_at(const int *ustart, int U, int pos)
{
    int lo = 0, hi = U;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ustart[mid] < pos) lo = mid + 1;
        else hi = mid;
    }
    return ustart[lo] == pos ? lo : -1;
}

/* o's slack for the memory pass (gp_plan_opts.mem_slack): -1 for none. */
static double mem_slack(const gp_plan_opts *o)
{
    return o->mem_slack < 0 ? -1 : o->mem_slack > 0 ? o->mem_slack : GP_REFINE_MEM_SLACK;
}

/* The largest of the simulated devices' peaks of `balance` at a step of at
 * most `top` (HUGE_VAL where longer, or where refine_step refuses it). */
static double refined_peak(plan_ctx *c, const int *balance, const double *limit, double top,
                           double *step)
{
    double pk[GP_MAX_DEVICES], mx = 0;
    *step = refine_step(c, balance, false, limit, pk);
    if (!(*step <= top)) return HUGE_VAL;
    for (int d = 0; d < c->o->n / c->o->virtual_stages; d++) mx = fmax(mx, pk[d]);
    return mx;
}

/* A layer's time in a step's pass over one micro-batch (planner's sizes). */
static double layer_time(const plan_ctx *c, int k)
{
    const gp_layer_times *t = &c->lt[k];
    return t->fwd + t->bwd_data + t->bwd_weights;
}

/* Then the least memory at that step: while moving a boundary past one
 * layer that costs next to nothing (at most GP_REFINE_MEM_LAYER of a
 * stage's mean time: a relu beside a product) lowers the largest device
 * peak and keeps the simulated step at most `top` (GP_REFINE_MEM_SLACK
 * over the refined one, and never over the min-max split's it began
 * from), the move that lowers it most (the shorter step on a tie).  Which
 * side of a relu a cut falls costs no time, but a stage that ends at the
 * relu keeps its output for the relu's backward while one that ends at
 * the product before it hands the product's output on: under zb-v,
 * bench/mlp-v.yaml's device 0 held 1.31x 1F1B's activations on [6, 3, 4,
 * 6] and 1.19x after this pass (bench/README.md).  Only such layers move:
 * a product moved between two stages of one device changes the device's
 * time by nothing the simulator sees, but the V's pattern, made for equal
 * stages, ran it with twice the bubble. */
static void refine_memory(plan_ctx *c, int *balance, const int *ustart, int U,
                          const double *limit, double top, double *work)
{
    int S = c->o->n;
    double step, per = (double)S * (double)c->o->m, total = 0;
    for (int k = 0; k < c->p->L; k++) total += layer_time(c, k);
    double cheap = GP_REFINE_MEM_LAYER * total / S;
    double cur = refined_peak(c, balance, limit, top, &step);
    for (int it = 0; it < 16 && *work < 2e7 && isfinite(cur); it++) {
        int bj = -1, bd = 0;
        double bmem = cur * (1 - 1e-9), bstep = HUGE_VAL;
        for (int j = 0, pos = 0; j + 1 < S; j++) {
            pos += balance[j];
            for (int d = -1; d <= 1; d += 2) { /* the layer before the boundary, or after */
                if (U > 0 && unit_at(ustart, U, pos + d) < 0) continue; /* (at units) */
                if (balance[j] + d < 1 || balance[j + 1] - d < 1) continue;
                if (layer_time(c, d < 0 ? pos - 1 : pos) > cheap) continue;
                balance[j] += d;
                balance[j + 1] -= d;
                double mem = refined_peak(c, balance, limit, top, &step);
                *work += per;
                balance[j] -= d;
                balance[j + 1] += d;
                if (mem < bmem || (mem == bmem && bj >= 0 && step < bstep)) {
                    bmem = mem;
                    bstep = step;
                    bj = j;
                    bd = d;
                }
            }
        }
        if (bj < 0) break;
        balance[bj] += bd;
        balance[bj + 1] -= bd;
        cur = bmem;
    }
}

/* (ustart, U: a boundary moves by units, not layers, where U > 0) */
static void refine_interleaved(plan_ctx *c, int *balance, const int *ustart, int U)
{
    const gp_plan_opts *o = c->o;
    int S = o->n, nd = S / o->virtual_stages;
    double limit[GP_MAX_DEVICES], start_peak[GP_MAX_DEVICES];
    int start[GP_MAX_DEVICES];
    memcpy(start, balance, (size_t)S * sizeof *balance);
    double best = refine_step(c, balance, false, NULL, start_peak), first = best;
    if (!isfinite(best)) return;
    for (int d = 0; d < nd; d++) {
        double cap = 0;
        bool bound = true;
        for (int j = 0; j < S; j++) {
            if (gp_schedule_device_of(o->v_shape ? GP_SCHEDULE_ZB_V : GP_SCHEDULE_INTERLEAVED,
                                      nd, j) != d)
                continue;
            cap += o->capacity[j];
            bound = bound && o->capacity[j] > 0;
        }
        limit[d] = bound ? fmax(cap, start_peak[d]) : HUGE_VAL;
    }
    double work = 0, per = (double)S * (double)o->m;
    for (int it = 0; it < 64 && work < 2e7; it++) {
        int bj = -1, bd = 0;
        double bstep = best * (1 - 1e-6);
        for (int j = 0, pos = 0; j + 1 < S; j++) { /* the boundary between j and j + 1 */
            pos += balance[j];
            int ui = U > 0 ? unit_at(ustart, U, pos) : -1;
            for (int e = -3; e <= 3; e++) {
                int d = e;
                if (U > 0) {
                    if (ui < 0 || ui + e < 0 || ui + e > U) continue;
                    d = ustart[ui + e] - pos;
                }
                if (!d || balance[j] + d < 1 || balance[j + 1] - d < 1) continue;
                balance[j] += d;
                balance[j + 1] -= d;
                double t = refine_step(c, balance, false, limit, NULL);
                work += per;
                balance[j] -= d;
                balance[j + 1] += d;
                if (t < bstep) {
                    bstep = t;
                    bj = j;
                    bd = d;
                }
            }
        }
        if (bj < 0) break;
        balance[bj] += bd;
        balance[bj + 1] -= bd;
        best = bstep;
    }
    if (mem_slack(o) >= 0)
        refine_memory(c, balance, ustart, U, limit, fmin(best * (1 + mem_slack(o)), first), &work);
    if (o->lockstep && memcmp(start, balance, (size_t)S * sizeof *balance) &&
        refine_step(c, balance, true, limit, NULL) > refine_step(c, start, true, NULL, NULL))
        memcpy(balance, start, (size_t)S * sizeof *balance);
}

int gp_profile_units(const gp_profile *p, int *start)
{
    int L = p->L;
    if (L <= GP_UNIT_MIN_LAYERS) return 0;
    for (int P = 2; P <= L / 8; P++) {
        /* the longest run of k with spec[k] == spec[k + P] */
        int best_s = -1, best_len = 0;
        for (int k = 0; k + P < L;) {
            if (strcmp(p->mem[k].spec, p->mem[k + P].spec)) {
                k++;
                continue;
            }
            int e = k;
            while (e + P < L && !strcmp(p->mem[e].spec, p->mem[e + P].spec)) e++;
            if (e - k > best_len) {
                best_len = e - k;
                best_s = k;
            }
            k = e;
        }
        int blocks = (best_len + P) / P; /* the region [s, s + len + P) */
        if (best_s < 0 || blocks < 2 || (double)blocks * P < 0.5 * L) continue;
        int U = 0;
        for (int k = 0; k < best_s; k++) start[U++] = k;
        for (int b = 0; b < blocks; b++) start[U++] = best_s + b * P;
        for (int k = best_s + blocks * P; k < L; k++) start[U++] = k;
        start[U] = L;
        return U;
    }
    return 0;
}

/* The partition problem over units of layers (gp_profile_units). */
typedef struct {
    const gp_partition_problem *pb;
    const int *start;
} unit_problem;

static double unit_cost(void *arg, int j, int first, int count)
{
    const unit_problem *u = arg;
    return u->pb->cost(u->pb->arg, j, u->start[first], u->start[first + count] - u->start[first]);
}

static double unit_mem(void *arg, int j, int first, int count)
{
    const unit_problem *u = arg;
    return u->pb->mem(u->pb->arg, j, u->start[first], u->start[first + count] - u->start[first]);
}

static const char *unit_name(void *arg, int k, char *buf, size_t len)
{
    const unit_problem *u = arg;
    return u->pb->layer_name(u->pb->arg, u->start[k], buf, len);
}

/* gp_partition_solve or _v (v) over the units, the balance back in layers. */
static gp_status solve_units(const gp_partition_problem *pb, const int *start, int U, bool v,
                             int *balance)
{
    unit_problem u = {pb, start};
    gp_partition_problem q = *pb;
    q.L = U;
    q.cost = unit_cost;
    q.mem = unit_mem;
    q.arg = &u;
    q.layer_name = pb->layer_name ? unit_name : NULL;
    int ub[GP_MAX_DEVICES];
    gp_status s = v ? gp_partition_solve_v(&q, ub, NULL) : gp_partition_solve(&q, ub, NULL, NULL);
    if (s != GP_OK) return s;
    int S = v ? 2 * pb->n : pb->n;
    for (int j = 0, f = 0; j < S; f += ub[j++]) balance[j] = start[f + ub[j]] - start[f];
    return GP_OK;
}

static gp_status solve_plan(const gp_partition_problem *pb, const int *start, int U, bool v,
                            int *balance)
{
    if (U >= (v ? 2 * pb->n : pb->n)) return solve_units(pb, start, U, v, balance);
    return v ? gp_partition_solve_v(pb, balance, NULL)
             : gp_partition_solve(pb, balance, NULL, NULL);
}

gp_status gp_balance_plan(const gp_profile *p, const gp_plan_opts *o, int *balance)
{
    plan_ctx c;
    GP_TRY(plan_open(p, o, &c));
    gp_partition_problem pb = {.L = p->L, .n = o->n, .cost = plan_cost, .mem = plan_mem,
                               .capacity = o->capacity, .arg = &c, .layer_name = plan_name};
    int *start = malloc(((size_t)p->L + 1) * sizeof *start);
    if (!start) {
        plan_close(&c);
        return gp_error_set(GP_ERR_OOM, "out of host memory planning");
    }
    int U = gp_profile_units(p, start);
    gp_status s;
    int v = o->virtual_stages;
    bool refine = v > 1 && o->n % v == 0 && o->by != GP_BALANCE_BY_SIZE && p->timed;
    if (o->v_shape && o->n % 2 == 0) {
        /* zb-v, two candidates, each refined against the simulated step,
         * the shorter kept: the exact min-max over the devices
         * (gp_partition_solve_v: each device runs its two stages and holds
         * what both hold within its whole memory), and the min-max over the
         * 2n stages (each within half its device's memory).  The first
         * alone can leave a device's time in one of its stages (bench/
         * mlp.yaml on 2 devices: [2, 1, 6, 7], devices even, stages 0.4
         * to 3 linear layers each), which the schedule's pattern, made
         * for stages of equal time, runs with a bubble; the second evens
         * the stages but not the devices' sums. */
        int nd = o->n / 2, alt[GP_MAX_DEVICES];
        double dcap[GP_MAX_DEVICES];
        for (int d = 0; d < nd; d++)
            dcap[d] = o->capacity[d] > 0 && o->capacity[o->n - 1 - d] > 0
                          ? o->capacity[d] + o->capacity[o->n - 1 - d] : 0;
        gp_partition_problem pv = pb;
        pv.n = nd;
        pv.capacity = dcap;
        s = solve_plan(&pv, start, U, true, balance);
        gp_status s2 = solve_plan(&pb, start, U, false, alt);
        if (s != GP_OK && s2 == GP_OK) { /* (stage capacities are the stricter) */
            gp_error_clear();
            memcpy(balance, alt, (size_t)o->n * sizeof *balance);
            s = GP_OK;
        } else if (s == GP_OK && s2 == GP_OK && refine) {
            refine_interleaved(&c, balance, start, U);
            refine_interleaved(&c, alt, start, U);
            /* the shorter (not the one that holds less within the memory
             * pass's slack: the two can differ by whole products between a
             * device's stages, which the V's pattern runs unlike the
             * simulator where stages are uneven; refine_memory) */
            if (refine_step(&c, alt, false, NULL, NULL) < refine_step(&c, balance, false, NULL,
                                                                      NULL))
                memcpy(balance, alt, (size_t)o->n * sizeof *balance);
            refine = false;
        }
        if (s == GP_OK) gp_error_clear(); /* (a candidate that did not fit) */
    } else {
        s = solve_plan(&pb, start, U, false, balance);
    }
    if (s == GP_OK && refine) refine_interleaved(&c, balance, start, U);
    free(start);
    plan_close(&c);
    return s;
}

void gp_balance_stage_costs(const gp_profile *p, const gp_plan_opts *o, const int *balance,
                            double *cost, double *peak_bytes)
{
    plan_ctx c;
    if (plan_open(p, o, &c) != GP_OK) {
        for (int j = 0; j < o->n; j++) cost[j] = peak_bytes[j] = NAN;
        return;
    }
    int first = 0;
    for (int j = 0; j < o->n; j++) {
        cost[j] = plan_cost(&c, j, first, balance[j]);
        peak_bytes[j] = plan_mem(&c, j, first, balance[j]);
        first += balance[j];
    }
    plan_close(&c);
}

/* ---- simulator -------------------------------------------------------------- */

gp_status gp_simulate(const gp_profile *p, int n, const int *balance, int m,
                      gp_checkpoint_mode ckpt, bool lockstep, const double *capacity,
                      gp_sim_result *out)
{
    return gp_simulate_schedule(p, GP_SCHEDULE_GPIPE, n, 1, balance, m, ckpt, lockstep,
                                capacity, out);
}

gp_status gp_simulate_schedule(const gp_profile *p, gp_schedule_kind kind, int n, int v,
                               const int *balance, int m, gp_checkpoint_mode ckpt, bool lockstep,
                               const double *capacity, gp_sim_result *out)
{
    return gp_simulate_schedule_file(p, kind, n, v, NULL, balance, m, ckpt, lockstep, capacity,
                                     out);
}

/* The last built-in schedule this thread simulated, kept for the next
 * simulation of the same kind, devices, stages a device, micro-batches and
 * checkpointing: the balancer's refinements and gpipe-balance --plan
 * simulate one schedule under hundreds of splits, and building its lists
 * took a quarter of planning Llama 3 70B on 64 GPUs.  A simulation borrows
 * it (a shallow copy: sim_end leaves it); simulations do not nest, so
 * nothing replaces it while borrowed.  Freed at the thread's exit. */
typedef struct sched_cache {
    bool ok;
    gp_schedule_kind kind;
    int n, v, m;
    gp_checkpoint_mode ckpt;
    gp_schedule sc;
    sent_lvls *lv; /* sc's sent_levels, made at its first simulation; NULL: not yet */
} sched_cache;

static _Thread_local sched_cache *tl_sched; /* (reachable from here: no leak reported) */
static pthread_key_t sched_key;
static pthread_once_t sched_once = PTHREAD_ONCE_INIT;

static void sched_cache_free(void *c)
{
    sched_cache *sc = c;
    if (sc && sc->ok) gp_schedule_free(&sc->sc);
    if (sc) free(sc->lv);
    free(sc);
}

static void sched_key_make(void) { (void)pthread_key_create(&sched_key, sched_cache_free); }

/* The schedule of so (no file) into *sc, borrowed from the thread's cache
 * (built there when it holds another); without a cache (no memory for
 * one), built into *sc, which sim_end frees. */
static gp_status sched_borrow(const gp_schedule_opts *so, gp_schedule *sc)
{
    if (!tl_sched) {
        (void)pthread_once(&sched_once, sched_key_make);
        tl_sched = calloc(1, sizeof *tl_sched);
        if (!tl_sched) return gp_schedule_make(so, sc);
        (void)pthread_setspecific(sched_key, tl_sched);
    }
    sched_cache *c = tl_sched;
    if (!(c->ok && c->kind == so->kind && c->n == so->n && c->v == so->virtual_stages &&
          c->m == so->m && c->ckpt == so->checkpoint)) {
        gp_schedule fresh;
        GP_TRY(gp_schedule_make(so, &fresh));
        if (c->ok) gp_schedule_free(&c->sc);
        free(c->lv);
        *c = (sched_cache){.ok = true, .kind = so->kind, .n = so->n, .v = so->virtual_stages,
                           .m = so->m, .ckpt = so->checkpoint, .sc = fresh};
    }
    *sc = c->sc;
    return GP_OK;
}

/* sc's sent_levels where sc is the thread's borrowed schedule (made at
 * the first call), else NULL (each stage's walk makes its own). */
static const sent_lvls *sched_levels(const gp_schedule *sc)
{
    sched_cache *c = tl_sched;
    if (!(c && c->ok && sc->list == c->sc.list)) return NULL;
    if (!c->lv) c->lv = sent_levels_all(sc);
    return c->lv;
}

/* The end of a simulation: its schedule freed unless borrowed. */
static void sim_end(gp_schedule *sc)
{
    if (!(tl_sched && tl_sched->ok && sc->list == tl_sched->sc.list)) gp_schedule_free(sc);
}

/* What simulating a split takes: the stages' first layers, the
 * micro-batch sizes and the schedule itself (sc: ended by the caller with
 * sim_end on GP_OK), balance checked against the profile. */
static gp_status sim_begin(const gp_profile *p, gp_schedule_kind kind, int n, int v,
                           const struct gp_schedule_file *file, const int *balance, int m,
                           gp_checkpoint_mode ckpt, int *first, int64_t *sizes, gp_schedule *sc)
{
    int S = n * v; /* stages; stage j on device sc->dev_of[j] */
    if (n < 1 || S > GP_MAX_DEVICES || m < 1 || m > GP_MAX_CHUNKS)
        return gp_error_set(GP_ERR_INVALID, "simulate: n = %d, v = %d, m = %d out of range", n,
                            v, m);
    int sum = 0;
    for (int j = 0; j < S; j++) {
        if (balance[j] < 1)
            return gp_error_set(GP_ERR_INVALID, "simulate: stage %d has no layers", j);
        if (balance[j] > p->L - sum) /* also keeps sum from wrapping */
            return gp_error_set(GP_ERR_INVALID, "simulate: balance sums to more than the "
                                "profile's %d layers", p->L);
        first[j] = sum;
        sum += balance[j];
    }
    if (sum != p->L)
        return gp_error_set(GP_ERR_INVALID, "simulate: balance sums to %d layers but the profile "
                            "has %d", sum, p->L);
    GP_TRY(gp_microbatch_split(p->batch, m, sizes));
    gp_schedule_opts so = {.kind = kind, .n = n, .m = m, .virtual_stages = v, .checkpoint = ckpt,
                           .replicas = 1, .update = true, .check = true, .file = file};
    return file ? gp_schedule_make(&so, sc) : sched_borrow(&so, sc);
}

/* A device's peak: where it holds several stages (interleaved, the V
 * schedules), the most their bytes add up to at any one instruction of
 * its list, with one workspace (the device's arena) among them.  Until
 * 2026-11-29 it was the sum of the stages' own peaks, which need not
 * coincide, each with its workspace: on test_balance's 2-device U-Net,
 * v-half's device 0 planned 19.06 MiB (now 16.99) for a measured 13.24,
 * zb-v's device 1 16.11 (now 15.05) for 11.55.  It still errs high there. */
static gp_status sim_peaks(const gp_profile *p, const gp_schedule *sc, const int64_t *sizes,
                           const int *first, const int *balance, double *peak, double *floor_)
{
    const sent_lvls *lv = sched_levels(sc);
    for (int d = 0; d < sc->n; d++) peak[d] = 0;
    if (sc->stages == sc->n) { /* one stage a device */
        for (int j = 0; j < sc->stages; j++)
            peak[sc->dev_of[j]] = stage_trace(p, sc, sizes, j, first[j], balance[j], NULL, lv);
        if (floor_) memcpy(floor_, peak, (size_t)sc->n * sizeof *peak);
        return GP_OK;
    }
    /* floor_: what the device holds at least, each stage's own peak while
     * the others hold their weights, gradients and state (the model errs
     * high where stages share a device; this bound does not) */
    if (floor_) {
        double stat[GP_MAX_DEVICES], sum[GP_MAX_DEVICES] = {0};
        for (int j = 0; j < sc->stages; j++) {
            stat[j] = stage_static_bytes(p, first[j], balance[j]);
            sum[sc->dev_of[j]] += stat[j];
        }
        for (int d = 0; d < sc->n; d++) floor_[d] = 0;
        for (int j = 0; j < sc->stages; j++) {
            int d = sc->dev_of[j];
            double own = stage_trace(p, sc, sizes, j, first[j], balance[j], NULL, lv);
            floor_[d] = fmax(floor_[d], own + sum[d] - stat[j]);
        }
    }
    int most = 0;
    for (int d = 0; d < sc->n; d++)
        if (sc->count[d] > most) most = sc->count[d];
    double *sum = malloc((size_t)(2 * most + 1) * sizeof *sum), *level = sum + most;
    if (!sum) return gp_error_set(GP_ERR_OOM, "out of host memory simulating");
    for (int d = 0; d < sc->n; d++) {
        /* one workspace a device (its arena), not one a stage */
        double ws_most = 0;
        for (int c = 0; c < sc->count[d]; c++) sum[c] = 0;
        for (int j = 0; j < sc->stages; j++) {
            if (sc->dev_of[j] != d) continue;
            double ws = 0;
            for (int k = first[j]; k < first[j] + balance[j]; k++)
                ws = fmax(ws, (double)p->mem[k].workspace_bytes);
            ws_most = fmax(ws_most, ws);
            stage_trace(p, sc, sizes, j, first[j], balance[j], level, lv);
            for (int c = 0; c < sc->count[d]; c++) sum[c] += level[c] - ws;
        }
        for (int c = 0; c < sc->count[d]; c++)
            if (sum[c] + ws_most > peak[d]) peak[d] = sum[c] + ws_most;
    }
    free(sum);
    return GP_OK;
}

gp_status gp_simulate_memory(const gp_profile *p, gp_schedule_kind kind, int n, int v,
                             const struct gp_schedule_file *file, const int *balance, int m,
                             gp_checkpoint_mode ckpt, double *peak, double *floor_)
{
    v = gp_schedule_stages_per_device(kind, v);
    int first[GP_MAX_DEVICES];
    int64_t sizes[GP_MAX_CHUNKS];
    gp_schedule sc;
    GP_TRY(sim_begin(p, kind, n, v, file, balance, m, ckpt, first, sizes, &sc));
    gp_status st = sim_peaks(p, &sc, sizes, first, balance, peak, floor_);
    sim_end(&sc);
    return st;
}

gp_status gp_simulate_schedule_file(const gp_profile *p, gp_schedule_kind kind, int n, int v,
                                    const struct gp_schedule_file *file, const int *balance,
                                    int m, gp_checkpoint_mode ckpt, bool lockstep,
                                    const double *capacity, gp_sim_result *out)
{
    memset(out, 0, sizeof *out);
    out->schedule = kind;
    v = gp_schedule_stages_per_device(kind, v);
    int S = n * v; /* stages; stage j on device sc.dev_of[j] */
    out->n = n;
    out->v = v;
    out->m = m;
    out->checkpoint = ckpt;
    if (!p->timed)
        return gp_error_set(GP_ERR_INVALID, "the profile has no times (taken with --by size); "
                            "profile with --by time or both to simulate");
    int first[GP_MAX_DEVICES];
    int64_t sizes[GP_MAX_CHUNKS];
    gp_schedule sc;
    GP_TRY(sim_begin(p, kind, n, v, file, balance, m, ckpt, first, sizes, &sc));

    /* stage times at the (at most two) micro-batch sizes of this split */
    gp_layer_times *lt = calloc((size_t)p->L * 2, sizeof *lt);
    size_t cells = (size_t)m * (size_t)S;
    double *fwd_fin = malloc(cells * sizeof *fwd_fin), *bwd_fin = malloc(cells * sizeof *bwd_fin);
    double *clock_fin = calloc((size_t)sc.clocks, sizeof *clock_fin);
    int *clock_left = calloc((size_t)sc.clocks, sizeof *clock_left);
    gp_stage_times *st = calloc((size_t)S * 2, sizeof *st);
    if (!lt || !fwd_fin || !bwd_fin || !clock_fin || !clock_left || !st) {
        free(lt); free(fwd_fin); free(bwd_fin); free(clock_fin); free(clock_left); free(st);
        sim_end(&sc);
        return gp_error_set(GP_ERR_OOM, "out of host memory simulating");
    }
    int64_t big = sizes[0], small = sizes[m - 1];
    for (int z = 0; z < 2; z++) { /* z: the micro-batch size (big, small) */
        double loss, upload;
        gp_layer_times *l = lt + (size_t)z * (size_t)p->L;
        gp_profile_times_at(p, z == 0 ? big : small, l, &loss, &upload);
        for (int j = 0; j < S; j++)
            st[z * S + j] = gp_stage_times_of(p, l, loss, upload, j, S, first[j], balance[j]);
    }
    for (size_t q = 0; q < cells; q++) fwd_fin[q] = bwd_fin[q] = -1;
    for (int j = 0; j < n; j++)
        for (int c = 0; c < sc.count[j]; c++) {
            gp_instr_kind kd = sc.list[j][c].kind;
            if (gp_instr_clocked(kd)) clock_left[sc.list[j][c].k]++; /* the executor's */
        }
    int pc[GP_MAX_DEVICES] = {0}, arrived = 0;
    double t[GP_MAX_DEVICES] = {0}, barrier_t = 0;
    bool at_barrier[GP_MAX_DEVICES] = {false};
    int done = 0, total = 0;
    for (int j = 0; j < n; j++) total += sc.count[j];
    while (done < total) {
        bool progress = false;
        for (int j = 0; j < n; j++) {
            while (pc[j] < sc.count[j]) {
                const gp_instr *in = &sc.list[j][pc[j]];
                const gp_stage_times *s =
                    &st[(in->i < 0 || sizes[in->i] == big ? 0 : 1) * S + in->j];
                double dep = 0, dur = 0;
                bool ready = true;
                if (in->kind == GP_INSTR_RECV_ACT || in->kind == GP_INSTR_RECV_GRAD) {
                    if (lockstep) { /* every computation of clocks < k done */
                        for (int q = 0; q < in->k && ready; q++) {
                            ready = clock_left[q] == 0;
                            if (clock_fin[q] > dep) dep = clock_fin[q];
                        }
                    } else {
                        int jj = in->from;
                        double f = in->kind == GP_INSTR_RECV_ACT
                                       ? fwd_fin[(size_t)in->i * (size_t)S + (size_t)jj]
                                       : bwd_fin[(size_t)in->i * (size_t)S + (size_t)jj];
                        ready = f >= 0;
                        dep = f;
                    }
                    dur = in->kind == GP_INSTR_RECV_ACT ? s->copy_act : s->copy_grad;
                } else if (in->kind == GP_INSTR_FORWARD) {
                    dur = s->F;
                } else if (in->kind == GP_INSTR_RECOMPUTE) {
                    dur = s->R;
                } else if (in->kind == GP_INSTR_BACKWARD) {
                    dur = s->B;
                } else if (in->kind == GP_INSTR_BACKWARD_DATA) {
                    /* run whole where nothing waits for its data half
                     * (gp_instr_whole_backward), as the executor runs it,
                     * its weights half then empty: under lockstep the
                     * whole backward's clock is the one that waits (zb-v
                     * on bench/mlp-v.yaml: 8.2% simulated against 18.1%
                     * measured while this counted the halves apart) */
                    const gp_instr *nx = pc[j] + 1 < sc.count[j] ? in + 1 : NULL;
                    dur = gp_instr_whole_backward(in, nx) ? s->B : s->Bd;
                } else if (in->kind == GP_INSTR_BACKWARD_WEIGHTS) {
                    bool empty = pc[j] > 0 && gp_instr_whole_backward(in - 1, in);
                    dur = empty ? 0 : s->W;
                } else if (in->kind == GP_INSTR_BARRIER) {
                    /* every stage's list got here: it starts with the last */
                    if (!at_barrier[j]) {
                        at_barrier[j] = true;
                        arrived++;
                        if (t[j] > barrier_t) barrier_t = t[j];
                    }
                    ready = arrived == n;
                    dep = barrier_t;
                } else if (in->kind == GP_INSTR_UPDATE) {
                    dur = s->update;
                } /* reductions, commit, gather: no model of their cost yet */
                if (!ready) break;
                double t0 = t[j] > dep ? t[j] : dep;
                t[j] = t0 + dur;
                out->busy[j] += dur;
                if (gp_instr_clocked(in->kind)) {
                    size_t q = (size_t)in->i * (size_t)S + (size_t)in->j;
                    if (in->kind == GP_INSTR_FORWARD) fwd_fin[q] = t[j];
                    if (gp_instr_gives_grad(in->kind)) bwd_fin[q] = t[j];
                    clock_left[in->k]--;
                    if (t[j] > clock_fin[in->k]) clock_fin[in->k] = t[j];
                }
                pc[j]++;
                done++;
                progress = true;
            }
        }
        GP_ASSERT(progress); /* the executor's schedule never deadlocks */
    }
    double end = 0;
    for (int j = 0; j < n; j++)
        if (t[j] > end) end = t[j];
    out->step = end;
    double busy = 0;
    for (int j = 0; j < n; j++) busy += out->busy[j];
    out->bubble = out->step > 0 ? 1.0 - busy / ((double)n * out->step) : 0;
    out->throughput = out->step > 0 ? (double)p->batch / out->step : 0;
    out->fits = true;
    gp_status ps = sim_peaks(p, &sc, sizes, first, balance, out->peak_bytes, NULL);
    for (int j = 0; j < n; j++) {
        if (capacity && capacity[j] > 0 && out->peak_bytes[j] > capacity[j]) out->fits = false;
    }
    free(lt); free(fwd_fin); free(bwd_fin); free(clock_fin); free(clock_left); free(st);
    sim_end(&sc);
    return ps;
}

int gp_sim_recommend(const gp_sim_result *r, int count)
{
    double best = 0;
    for (int q = 0; q < count; q++)
        if (r[q].fits && r[q].throughput > best) best = r[q].throughput;
    int pick = -1;
    for (int q = 0; q < count; q++)
        if (r[q].fits && r[q].throughput >= 0.95 * best && (pick < 0 || r[q].m < r[pick].m))
            pick = q;
    return pick;
}

double gp_sim_peak(const gp_sim_result *r)
{
    double pk = 0;
    for (int j = 0; j < r->n; j++)
        if (r->peak_bytes[j] > pk) pk = r->peak_bytes[j];
    return pk;
}

int gp_sim_recommend_memory(const gp_sim_result *r, int count)
{
    double best = 0;
    for (int q = 0; q < count; q++)
        if (r[q].fits && r[q].throughput > best) best = r[q].throughput;
    int pick = -1;
    for (int q = 0; q < count; q++) {
        if (!r[q].fits || r[q].throughput < 0.95 * best) continue;
        if (pick < 0 || gp_sim_peak(&r[q]) < gp_sim_peak(&r[pick]) ||
            (gp_sim_peak(&r[q]) == gp_sim_peak(&r[pick]) && r[q].throughput > r[pick].throughput))
            pick = q;
    }
    return pick;
}
