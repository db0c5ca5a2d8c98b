/*
 * partition.c — the exact min-max contiguous partition (balance.h).
 *
 * Dynamic programme over prefixes: best[s][l] is the lexicographically
 * smallest (largest stage cost, second-largest stage cost) of splitting
 * layers [0, l) into s stages, each of >= 1 layer and within its capacity.
 * Extending a prefix by one stage is monotone in that order (if prefix A is
 * no worse than prefix B, A + stage is no worse than B + stage), so the
 * optimum of every prefix extends to the optimum of the whole: the result is
 * exact, not a heuristic.  Stage costs may depend on the stage index (stage
 * 0 skips some backward work, inner stages pay two copies), which a prefix
 * DP handles as well as additive costs.
 */
#include "balance/balance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool over_cap(const gp_partition_problem *pb, int j, int first, int count, double *need,
                     double *cap)
{
    *need = 0;
    *cap = 0;
    if (!pb->mem || !pb->capacity || pb->capacity[j] <= 0) return false;
    *need = pb->mem(pb->arg, j, first, count);
    *cap = pb->capacity[j];
    return *need > *cap;
}

/* Objective of a stage: its cost, or (overflow mode) how far its memory is
 * over capacity. */
static double stage_value(const gp_partition_problem *pb, bool overflow, int j, int first,
                          int count, bool *feasible)
{
    double need, cap;
    bool over = over_cap(pb, j, first, count, &need, &cap);
    if (overflow) {
        *feasible = true;
        return pb->capacity && pb->capacity[j] > 0 && pb->mem ? need - cap : -INFINITY;
    }
    *feasible = !over;
    return pb->cost(pb->arg, j, first, count);
}

/* Returns false if no split is feasible. */
static bool solve_dp(const gp_partition_problem *pb, bool overflow, int *balance, double *omax,
                     double *osecond, bool *oom)
{
    int L = pb->L, n = pb->n;
    size_t cells = (size_t)(n + 1) * (size_t)(L + 1);
    double *mx = malloc(cells * sizeof *mx), *mx2 = malloc(cells * sizeof *mx2);
    int *cut = malloc(cells * sizeof *cut);
    if (!mx || !mx2 || !cut) {
        free(mx);
        free(mx2);
        free(cut);
        *oom = true;
        return false;
    }
#define AT(a, s, l) a[(size_t)(s) * (size_t)(L + 1) + (size_t)(l)]
    for (size_t q = 0; q < cells; q++) {
        mx[q] = INFINITY;
        mx2[q] = INFINITY;
        cut[q] = -1;
    }
    AT(mx, 0, 0) = -INFINITY;
    AT(mx2, 0, 0) = -INFINITY;
    AT(cut, 0, 0) = 0;
    for (int s = 1; s <= n; s++)
        for (int l = s; l <= L - (n - s); l++)
            for (int c = s - 1; c < l; c++) {
                if (AT(cut, s - 1, c) < 0) continue;
                bool ok;
                double last = stage_value(pb, overflow, s - 1, c, l - c, &ok);
                if (!ok) continue;
                double a = AT(mx, s - 1, c), b = AT(mx2, s - 1, c);
                double m1 = last > a ? last : a;
                double m2 = last > a ? a : (last > b ? last : b);
                if (AT(cut, s, l) < 0 || m1 < AT(mx, s, l) ||
                    (m1 == AT(mx, s, l) && m2 < AT(mx2, s, l))) {
                    AT(mx, s, l) = m1;
                    AT(mx2, s, l) = m2;
                    AT(cut, s, l) = c;
                }
            }
    bool found = AT(cut, n, L) >= 0;
    if (found) {
        int l = L;
        for (int s = n; s >= 1; s--) {
            int c = AT(cut, s, l);
            GP_ASSERT(c >= 0 && c < l);
            balance[s - 1] = l - c;
            l = c;
        }
        if (omax) *omax = AT(mx, n, L);
        if (osecond) *osecond = n > 1 ? AT(mx2, n, L) : 0;
    }
#undef AT
    free(mx);
    free(mx2);
    free(cut);
    return found;
}

static const char *name_of(const gp_partition_problem *pb, int k, char *buf, size_t len)
{
    if (pb->layer_name) return pb->layer_name(pb->arg, k, buf, len);
    snprintf(buf, len, "layer %d", k);
    return buf;
}

/* A layer that fits no device even alone (need bytes where the best
 * device holds cap): the error of both partitioners. */
static gp_status layer_alone_error(const gp_partition_problem *pb, int k, double need, double cap,
                                   double over)
{
    char nb[160], b1[32], b2[32], b3[32];
    return gp_error_set(GP_ERR_OOM,
                        "%s alone needs %s on a device but the best device holds %s: over by %s; "
                        "raise pipeline.memory or pipeline.chunks (smaller micro-batches), or "
                        "checkpoint",
                        name_of(pb, k, nb, sizeof nb), gp_format_bytes((size_t)need, b1, sizeof b1),
                        gp_format_bytes((size_t)cap, b2, sizeof b2),
                        gp_format_bytes((size_t)over, b3, sizeof b3));
}

gp_status gp_partition_solve(const gp_partition_problem *pb, int *balance, double *out_max,
                             double *out_second)
{
    int L = pb->L, n = pb->n;
    if (n < 1 || n > GP_MAX_DEVICES)
        return gp_error_set(GP_ERR_INVALID, "cannot partition over %d stages: use 1..%d devices",
                            n, GP_MAX_DEVICES);
    if (L < n)
        return gp_error_set(GP_ERR_INVALID,
                            "cannot split %d layers into %d stages: every stage needs at least "
                            "one layer; use at most %d devices", L, n, L);
    /* The programme visits about n L^2 / 2 (prefix, last stage) pairs: past
     * 2^30 of them (n = 8 at 16000 layers) it would run for minutes, so it
     * says so instead of seeming to hang. */
    if ((double)n * (double)L * (double)L / 2 > (double)(1 << 30))
        return gp_error_set(GP_ERR_INVALID,
                            "balancing %d layers over %d stages exactly would take minutes (it "
                            "tries about %.2g splits); give pipeline.balance explicitly, one "
                            "layer count per stage", L, n, (double)n * (double)L * (double)L / 2);
    bool oom = false;
    if (solve_dp(pb, false, balance, out_max, out_second, &oom)) return GP_OK;
    if (oom) return gp_error_set(GP_ERR_OOM, "out of host memory partitioning");

    /* Infeasible.  A layer that fits no device on its own is the clearest
     * message; otherwise report the split that overflows least. */
    char nb[160], b1[32], b2[32], b3[32];
    int worst_k = -1;
    double worst_over = 0, worst_need = 0, worst_cap = 0;
    for (int k = 0; k < L; k++) {
        double best_over = INFINITY, bn = 0, bc = 0;
        for (int j = 0; j < n; j++) {
            double need, cap;
            if (!over_cap(pb, j, k, 1, &need, &cap)) {
                best_over = -1;
                break;
            }
            if (need - cap < best_over) {
                best_over = need - cap;
                bn = need;
                bc = cap;
            }
        }
        if (best_over > 0 && best_over > worst_over) {
            worst_over = best_over;
            worst_k = k;
            worst_need = bn;
            worst_cap = bc;
        }
    }
    if (worst_k >= 0) return layer_alone_error(pb, worst_k, worst_need, worst_cap, worst_over);
    int bal[GP_MAX_DEVICES];
    double over = 0;
    if (!solve_dp(pb, true, bal, &over, NULL, &oom))
        return gp_error_set(GP_ERR_OOM, "no split of %d layers into %d stages fits", L, n);
    int first = 0;
    for (int j = 0; j < n; j++) {
        double need, cap;
        if (over_cap(pb, j, first, bal[j], &need, &cap) && need - cap >= over) {
            char nb2[160];
            name_of(pb, first, nb, sizeof nb);
            name_of(pb, first + bal[j] - 1, nb2, sizeof nb2);
            return gp_error_set(GP_ERR_OOM,
                                "no split of %d layers into %d stages fits device memory: the "
                                "closest one still needs %s on stage %d (%s .. %s), which may hold "
                                "%s (its device's memory, or its share where stages share a "
                                "device): over by %s; raise pipeline.memory, add devices, or "
                                "checkpoint", L, n, gp_format_bytes((size_t)need, b1, sizeof b1),
                                j, nb, nb2, gp_format_bytes((size_t)cap, b2, sizeof b2),
                                gp_format_bytes((size_t)(need - cap), b3, sizeof b3));
        }
        first += bal[j];
    }
    return gp_error_set(GP_ERR_OOM, "no split of %d layers into %d stages fits device memory",
                        L, n);
}

/* ---- V placement (zb-v) --------------------------------------------------- */

/* Device d holds stage d = [a_d, a_{d+1}) and stage 2n-1-d = [b_{d+1}, b_d),
 * peeled from the two ends of the layers at once (a_0 = 0, b_0 = L); device
 * n-1 takes the middle [a_{n-1}, b_{n-1}) as stages n-1 and n, cut at c.
 *
 * state (d, a, b): devices 0..d-1 placed, layers [0, a) and [b, L) used;
 * best[a][b] is the lexicographically smallest (largest, second-largest)
 * device time over those devices.  The pair is monotone under adding a
 * device (if A is no worse than B, A + t is no worse than B + t, for any t),
 * so the best pair of each state extends to the optimum of the whole, with
 * no assumption on the costs: a stage's cost may depend on its index and
 * need not grow with its length (a boundary copy can shrink as a stage
 * grows), and costs may be negative.  Per device it tries every (a, b) ->
 * (a', b'), about L^4 / 24 steps (from the one state of device 0, L^2 / 2);
 * the middle device every cut, L^3 / 6: O(n L^4) in all, O(n L^2) memory
 * (every level's tables at once: the bound below reads them).  What cannot
 * beat a feasible split found by local search first is skipped (solve_v):
 * the same result, 3x faster on GPT-2's plan of 8 GPUs.
 * Cost and mem are called once per (stage, first, count) that can occur,
 * O(n L^2), into tables.  In overflow mode a device's value is how far its
 * memory exceeds its capacity (-inf: unlimited) and every split is allowed,
 * as solve_dp's. */

typedef struct {
    double *pc, *sc, *pm, *sm; /* [W * W]: stage d = [a, a') at pc[a W + a'],
                                  stage 2n-1-d = [b', b) at sc[b' W + b];
                                  pm, sm their bytes */
    double *m1, *m2;           /* [W * W]: best pair of each state, this level */
    double *n1, *n2;           /* [W * W]: the same, next level */
    int *from;                 /* [(n - 1) W W]: level d+1's state (a', b') came
                                  from level d's from[...] = a W + b; -1: not
                                  reached */
} v_work;

static bool dev_limited(const gp_partition_problem *pb, int d)
{
    return pb->mem && pb->capacity && pb->capacity[d] > 0;
}

/* Device d's tables, at the positions its two stages can take (overflow
 * mode reads no cost). */
static void v_tables(const gp_partition_problem *pb, const v_work *w, bool overflow, int d)
{
    int L = pb->L, n = pb->n, W = L + 1, j2 = 2 * n - 1 - d;
    bool lim = dev_limited(pb, d);
    for (int a = d; a <= L - 2 * n + d; a++)
        for (int a2 = a + 1; a2 <= L - 2 * n + d + 1; a2++) {
            if (!overflow) w->pc[a * W + a2] = pb->cost(pb->arg, d, a, a2 - a);
            if (lim) w->pm[a * W + a2] = pb->mem(pb->arg, d, a, a2 - a);
        }
    for (int b = 2 * n - d; b <= L - d; b++)
        for (int b2 = 2 * n - d - 1; b2 < b; b2++) {
            if (!overflow) w->sc[b2 * W + b] = pb->cost(pb->arg, j2, b2, b - b2);
            if (lim) w->sm[b2 * W + b] = pb->mem(pb->arg, j2, b2, b - b2);
        }
}

/* Device d's value with stages [a, a2) and [b2, b); false if it overflows. */
static inline bool v_value(const gp_partition_problem *pb, const v_work *w, bool overflow, int d,
                           int a, int a2, int b2, int b, double *t)
{
    int W = pb->L + 1;
    bool lim = dev_limited(pb, d);
    if (overflow) {
        *t = lim ? w->pm[a * W + a2] + w->sm[b2 * W + b] - pb->capacity[d] : -INFINITY;
        return true;
    }
    if (lim && w->pm[a * W + a2] + w->sm[b2 * W + b] > pb->capacity[d]) return false;
    *t = w->pc[a * W + a2] + w->sc[b2 * W + b];
    return true;
}

/* (x1, x2) = the two largest of {x1, x2, t}. */
static inline void top2_add(double *x1, double *x2, double t)
{
    if (t > *x1) {
        *x2 = *x1;
        *x1 = t;
    } else if (t > *x2) {
        *x2 = t;
    }
}

static inline bool pair_less(double x1, double x2, double y1, double y2)
{
    return x1 < y1 || (x1 == y1 && x2 < y2);
}

/* Pairs (a, b) -> (a', b') (and middle cuts) the programme tries: an upper
 * bound of its work, exact when no device overflows.  At level d >= 1 there
 * are L - 2d - s + 1 states of width s = b - a, each with g (g + 1) / 2
 * successors (g = s - 2 (n - d) + 1), or g cuts on the middle device; level
 * 0 is the one state (0, L). */
static double v_work_count(int L, int n)
{
    double work = 0;
    for (int d = 0; d < n; d++)
        for (int s = d == 0 ? L : 2 * (n - d); s <= L - 2 * d; s++) {
            double cnt = d == 0 ? 1 : L - 2 * d - s + 1, g = s - 2 * (n - d) + 1;
            work += cnt * (d < n - 1 ? g * (g + 1) / 2 : g);
        }
    return work;
}

bool gp_partition_v_prune = true;

/* Level d's tables in a buffer of every level's (solve_v). */
static void v_level(v_work *w, double *tables, size_t cells, int d)
{
    double *t = tables + (size_t)d * 4 * cells;
    w->pc = t;
    w->sc = t + cells;
    w->pm = t + 2 * cells;
    w->sm = t + 3 * cells;
}

/* Device d's value in the split cut[0..2n] (stage j = [cut[j], cut[j+1])),
 * from level d's tables as the programme reads them (v_value); false if it
 * overflows. */
static bool v_cut_value(const gp_partition_problem *pb, v_work *w, double *tables, size_t cells,
                        const int *cut, int d, double *t)
{
    int S = 2 * pb->n;
    v_level(w, tables, cells, d);
    return v_value(pb, w, false, d, cut[d], cut[d + 1], cut[S - 1 - d], cut[S - d], t);
}

/* An upper bound of the optimum's largest device time: a feasible split's,
 * found by local search (equal layer counts, then one cut moved a layer at
 * a time while (devices over memory, largest time, sum of squares) falls);
 * INFINITY where it finds none.  It reads the tables only: no cost call. */
static double v_bound(const gp_partition_problem *pb, v_work *w, double *tables, size_t cells)
{
    int L = pb->L, n = pb->n, S = 2 * n;
    int cut[2 * GP_MAX_DEVICES + 1];
    double t[GP_MAX_DEVICES];
    bool ok[GP_MAX_DEVICES];
    for (int j = 0; j <= S; j++) cut[j] = (int)((long long)L * j / S);
    for (int d = 0; d < n; d++) ok[d] = v_cut_value(pb, w, tables, cells, cut, d, &t[d]);
    double cur[3];
#define V_SCORE(o)                                                        \
    do {                                                                  \
        (o)[0] = 0, (o)[1] = -INFINITY, (o)[2] = 0;                       \
        for (int d_ = 0; d_ < n; d_++) {                                  \
            if (!ok[d_]) {                                                \
                (o)[0] += 1;                                              \
                continue;                                                 \
            }                                                             \
            (o)[1] = t[d_] > (o)[1] ? t[d_] : (o)[1];                     \
            (o)[2] += t[d_] * t[d_];                                      \
        }                                                                 \
    } while (0)
    V_SCORE(cur);
    bool moved = true;
    for (int sweep = 0; moved && sweep < 4 * L + 8; sweep++) {
        moved = false;
        for (int j = 1; j < S; j++)
            for (int dir = -1; dir <= 1; dir += 2) {
                int c = cut[j] + dir;
                if (c <= cut[j - 1] || c >= cut[j + 1]) continue;
                int da = j - 1 < n ? j - 1 : S - j, db = j < n ? j : S - 1 - j;
                double ta = t[da], tb = t[db], nw[3];
                bool oa = ok[da], ob = ok[db];
                int old = cut[j];
                cut[j] = c;
                ok[da] = v_cut_value(pb, w, tables, cells, cut, da, &t[da]);
                ok[db] = v_cut_value(pb, w, tables, cells, cut, db, &t[db]);
                V_SCORE(nw);
                if (nw[0] < cur[0] || (nw[0] == cur[0] && (nw[1] < cur[1] ||
                                                            (nw[1] == cur[1] && nw[2] < cur[2])))) {
                    memcpy(cur, nw, sizeof cur);
                    moved = true;
                } else {
                    cut[j] = old;
                    t[da] = ta, t[db] = tb, ok[da] = oa, ok[db] = ob;
                }
            }
    }
#undef V_SCORE
    return cur[0] == 0 ? cur[1] : INFINITY;
}

/* Returns false if no split is feasible (*oom: out of host memory). */
static bool solve_v(const gp_partition_problem *pb, bool overflow, int *balance, double *omax,
                    bool *oom)
{
    int L = pb->L, n = pb->n, W = L + 1;
    size_t cells = (size_t)W * (size_t)W;
    v_work w = {0};
    /* every level's four tables (filled first, for the bound), the states'
     * pairs, and per b the b2 a transition can take (the pruned lists) */
    double *buf = malloc(((size_t)4 * (size_t)n + 4) * cells * sizeof *buf);
    double *tables = buf;
    w.from = malloc((n > 1 ? (size_t)(n - 1) : 1) * cells * sizeof *w.from);
    int *b2s = malloc(cells * sizeof *b2s), *nb2 = malloc((size_t)W * sizeof *nb2);
    if (!buf || !w.from || !b2s || !nb2) {
        free(buf);
        free(w.from);
        free(b2s);
        free(nb2);
        *oom = true;
        return false;
    }
    double *pairs = buf + (size_t)4 * (size_t)n * cells;
    w.m1 = pairs;
    w.m2 = pairs + cells;
    w.n1 = pairs + 2 * cells;
    w.n2 = pairs + 3 * cells;
    for (size_t q = 0; q < cells; q++) w.m1[q] = w.m2[q] = INFINITY;
    w.m1[L] = w.m2[L] = -INFINITY; /* (0, L): nothing placed */
    for (int d = 0; d < n; d++) {
        v_level(&w, tables, cells, d);
        v_tables(pb, &w, overflow, d);
    }
    /* Pruning, exact: the optimum's largest device time is at most U, a
     * feasible split's (v_bound), and the largest so far never falls along
     * a path, so a state or a transition whose largest exceeds U cannot
     * lead to it; neither can it tie with what can, so every state that
     * can keeps the pair and `from` it had without pruning, and the split
     * returned is the same, ties included (tests/test_balance.c compares
     * with gp_partition_v_prune off).  Where a level's costs are all >= 0
     * a transition is at least its first stage's cost, and at least its
     * second's: stages dearer than U are skipped whole. */
    double U = overflow || !gp_partition_v_prune ? INFINITY : v_bound(pb, &w, tables, cells);
    bool prune = U < INFINITY;

    /* devices 0..n-2: level d -> d + 1 */
    for (int d = 0; d < n - 1; d++) {
        int rem = 2 * (n - d - 1); /* stages left after device d */
        int *from = w.from + (size_t)d * cells;
        for (size_t q = 0; q < cells; q++) {
            w.n1[q] = w.n2[q] = INFINITY;
            from[q] = -1;
        }
        v_level(&w, tables, cells, d);
        /* this level's costs all >= 0 (then a stage dearer than U ends a
         * transition), and per b its b2 from b - 1 down, those dearer than
         * U left out where that holds */
        bool nonneg = prune;
        for (int a = d; nonneg && a <= L - 2 * n + d; a++)
            for (int a2 = a + 1; nonneg && a2 <= L - 2 * n + d + 1; a2++)
                nonneg = w.pc[a * W + a2] >= 0;
        for (int b = 2 * n - d; b <= L - d; b++) {
            nb2[b] = 0;
            for (int b2 = b - 1; b2 >= 2 * n - d - 1; b2--) {
                if (nonneg && !(w.sc[b2 * W + b] >= 0)) nonneg = false;
                b2s[(size_t)b * W + (size_t)nb2[b]++] = b2;
            }
        }
        if (nonneg)
            for (int b = 2 * n - d; b <= L - d; b++) {
                int k = 0;
                for (int q = 0; q < nb2[b]; q++) {
                    int b2 = b2s[(size_t)b * W + (size_t)q];
                    if (!(w.sc[b2 * W + b] > U)) b2s[(size_t)b * W + (size_t)k++] = b2;
                }
                nb2[b] = k;
            }
        for (int a = d; a <= L; a++)
            for (int b = L - d; b - a >= 2 * (n - d); b--) {
                double f1 = w.m1[a * W + b], f2 = w.m2[a * W + b];
                if (f1 == INFINITY || (prune && f1 > U)) continue;
                const int *bl = b2s + (size_t)b * W;
                for (int a2 = a + 1; a2 + rem <= b - 1; a2++) {
                    if (nonneg && w.pc[a * W + a2] > U) continue;
                    for (int q = 0; q < nb2[b]; q++) {
                        int b2 = bl[q];
                        if (b2 < a2 + rem) break; /* (the list descends) */
                        double t;
                        if (!v_value(pb, &w, overflow, d, a, a2, b2, b, &t)) continue;
                        if (prune && t > U) continue;
                        double x1 = f1, x2 = f2;
                        top2_add(&x1, &x2, t);
                        size_t s2 = (size_t)a2 * W + (size_t)b2;
                        if (from[s2] < 0 || pair_less(x1, x2, w.n1[s2], w.n2[s2])) {
                            w.n1[s2] = x1;
                            w.n2[s2] = x2;
                            from[s2] = a * W + b;
                        }
                    }
                }
            }
        double *t1 = w.m1, *t2 = w.m2;
        w.m1 = w.n1;
        w.m2 = w.n2;
        w.n1 = t1;
        w.n2 = t2;
    }

    /* device n-1: the middle [a, b), cut at c; the cut with the smallest
     * time is the best for every state (monotone again) */
    v_level(&w, tables, cells, n - 1);
    int ba = -1, bb = -1, bc = -1;
    double b1 = INFINITY, b2v = INFINITY;
    for (int a = n - 1; a <= L; a++)
        for (int b = L - (n - 1); b - a >= 2; b--) {
            double f1 = w.m1[a * W + b], f2 = w.m2[a * W + b];
            if (f1 == INFINITY || (prune && f1 > U)) continue;
            int cbest = -1;
            double tbest = INFINITY;
            for (int c = a + 1; c < b; c++) {
                double t;
                if (!v_value(pb, &w, overflow, n - 1, a, c, c, b, &t)) continue;
                if (cbest < 0 || t < tbest) {
                    cbest = c;
                    tbest = t;
                }
            }
            if (cbest < 0) continue;
            top2_add(&f1, &f2, tbest);
            if (ba < 0 || pair_less(f1, f2, b1, b2v)) {
                ba = a;
                bb = b;
                bc = cbest;
                b1 = f1;
                b2v = f2;
            }
        }
    bool found = ba >= 0;
    if (found) {
        balance[n - 1] = bc - ba;
        balance[n] = bb - bc;
        int a = ba, b = bb;
        for (int d = n - 2; d >= 0; d--) {
            int p = w.from[(size_t)d * cells + (size_t)a * W + (size_t)b];
            GP_ASSERT(p >= 0);
            int pa = p / W, pbv = p % W;
            GP_ASSERT(pa < a && b < pbv);
            balance[d] = a - pa;
            balance[2 * n - 1 - d] = pbv - b;
            a = pa;
            b = pbv;
        }
        GP_ASSERT(a == 0 && b == L);
        if (omax) *omax = b1;
    }
    free(buf);
    free(w.from);
    free(b2s);
    free(nb2);
    return found;
}

gp_status gp_partition_solve_v(const gp_partition_problem *pb, int *balance, double *out_max)
{
    int L = pb->L, n = pb->n;
    if (n < 1 || n > GP_MAX_DEVICES)
        return gp_error_set(GP_ERR_INVALID,
                            "cannot place a V over %d devices: use 1..%d devices", n,
                            GP_MAX_DEVICES);
    if (L < 2 * n)
        return gp_error_set(GP_ERR_INVALID,
                            "cannot split %d layers into %d stages (V placement, two per device "
                            "on %d devices): every stage needs at least one layer; use at most "
                            "%d devices", L, 2 * n, n, L / 2);
    /* About (n - 2) L^4 / 24 steps (L^3 / 6 for n = 2) at a few ns each:
     * 2^33 is about 15 s (n = 8 at 400 layers, n = 3 at 600); past it, or
     * past 512 MiB of tables (n = 2 at about 2200 layers), it says so
     * instead of seeming to hang. */
    double work = v_work_count(L, n);
    if (work > 8589934592.0)
        return gp_error_set(GP_ERR_INVALID,
                            "balancing %d layers over %d devices in a V (%d stages) exactly "
                            "would take too long (it tries about %.2g splits, over 2^33); give "
                            "pipeline.balance explicitly, one layer count per stage",
                            L, n, 2 * n, work);
    /* per pair (a, b): four doubles per device (its tables) and four more,
     * per device but the last an int, and one more int */
    double bytes = (double)(L + 1) * (L + 1) *
                   ((4 * (size_t)n + 4) * sizeof(double) + (size_t)n * sizeof(int));
    if (bytes > 536870912.0) {
        char s1[32];
        return gp_error_set(GP_ERR_INVALID,
                            "balancing %d layers over %d devices in a V exactly would need %s "
                            "of host memory; give pipeline.balance explicitly, one layer count "
                            "per stage", L, n, gp_format_bytes((size_t)bytes, s1, sizeof s1));
    }
    bool oom = false;
    if (solve_v(pb, false, balance, out_max, &oom)) return GP_OK;
    if (oom) return gp_error_set(GP_ERR_OOM, "out of host memory partitioning");

    /* Infeasible: as gp_partition_solve, a layer that fits no device on its
     * own, else the device that overflows in the split that overflows
     * least. */
    char nb[160], nb2[160], nb3[160], nb4[160], s1[32], s2[32], s3[32];
    int worst_k = -1;
    double worst_over = 0, worst_need = 0, worst_cap = 0;
    for (int k = 0; k < L; k++) {
        double best_over = INFINITY, bn = 0, bc = 0;
        for (int j = 0; j < 2 * n; j++) {
            if (k < j || L - 1 - k < 2 * n - 1 - j) continue; /* no room around it */
            int d = j < n ? j : 2 * n - 1 - j;
            if (!dev_limited(pb, d)) {
                best_over = -1;
                break;
            }
            double need = pb->mem(pb->arg, j, k, 1), cap = pb->capacity[d];
            if (need <= cap) {
                best_over = -1;
                break;
            }
            if (need - cap < best_over) {
                best_over = need - cap;
                bn = need;
                bc = cap;
            }
        }
        if (best_over > 0 && best_over > worst_over) {
            worst_over = best_over;
            worst_k = k;
            worst_need = bn;
            worst_cap = bc;
        }
    }
    if (worst_k >= 0) return layer_alone_error(pb, worst_k, worst_need, worst_cap, worst_over);
    int bal[2 * GP_MAX_DEVICES];
    double over = 0;
    if (!solve_v(pb, true, bal, &over, &oom))
        return gp_error_set(GP_ERR_OOM, "no V split of %d layers into %d stages fits", L, 2 * n);
    int start[2 * GP_MAX_DEVICES + 1];
    start[0] = 0;
    for (int j = 0; j < 2 * n; j++) start[j + 1] = start[j] + bal[j];
    for (int d = 0; d < n; d++) {
        if (!dev_limited(pb, d)) continue;
        int j2 = 2 * n - 1 - d;
        double need = pb->mem(pb->arg, d, start[d], bal[d]) +
                      pb->mem(pb->arg, j2, start[j2], bal[j2]);
        double cap = pb->capacity[d];
        if (need > cap && need - cap >= over)
            return gp_error_set(
                GP_ERR_OOM,
                "no V split of %d layers into %d stages over %d devices fits device memory: "
                "the closest one still needs %s on device %d (stage %d: %s .. %s, stage %d: "
                "%s .. %s) which holds %s: over by %s; raise pipeline.memory, add devices, or "
                "checkpoint", L, 2 * n, n, gp_format_bytes((size_t)need, s1, sizeof s1), d, d,
                name_of(pb, start[d], nb, sizeof nb),
                name_of(pb, start[d + 1] - 1, nb2, sizeof nb2), j2,
                name_of(pb, start[j2], nb3, sizeof nb3),
                name_of(pb, start[j2 + 1] - 1, nb4, sizeof nb4),
                gp_format_bytes((size_t)cap, s2, sizeof s2),
                gp_format_bytes((size_t)(need - cap), s3, sizeof s3));
    }
    return gp_error_set(GP_ERR_OOM,
                        "no V split of %d layers into %d stages over %d devices fits device "
                        "memory", L, 2 * n, n);
}

/* ---- additive problems ---------------------------------------------------- */

typedef struct {
    const double *pre, *mpre; /* prefix sums, [L + 1] */
} additive;

static double add_cost(void *arg, int j, int first, int count)
{
    (void)j;
    const additive *a = arg;
    return a->pre[first + count] - a->pre[first];
}

static double add_mem(void *arg, int j, int first, int count)
{
    (void)j;
    const additive *a = arg;
    return a->mpre[first + count] - a->mpre[first];
}

gp_status gp_partition_minmax_mem(const double *costs, const double *mem, const double *capacity,
                                  int L, int n, int *balance)
{
    if (L < 1) return gp_error_set(GP_ERR_INVALID, "nothing to partition: the model has no layers");
    double *pre = malloc((size_t)(L + 1) * 2 * sizeof *pre);
    if (!pre) return gp_error_set(GP_ERR_OOM, "out of host memory partitioning");
    double *mpre = pre + L + 1;
    pre[0] = mpre[0] = 0;
    for (int l = 0; l < L; l++) {
        pre[l + 1] = pre[l] + costs[l];
        mpre[l + 1] = mpre[l] + (mem ? mem[l] : 0);
    }
    additive a = {pre, mpre};
    gp_partition_problem pb = {.L = L, .n = n, .cost = add_cost, .mem = mem ? add_mem : NULL,
                               .capacity = capacity, .arg = &a};
    gp_status s = gp_partition_solve(&pb, balance, NULL, NULL);
    free(pre);
    return s;
}

gp_status gp_partition_minmax(const double *costs, int L, int n, int *balance)
{
    return gp_partition_minmax_mem(costs, NULL, NULL, L, n, balance);
}

gp_status gp_partition_minmax_v(const double *costs, int L, int n, int *balance)
{
    if (L < 1) return gp_error_set(GP_ERR_INVALID, "nothing to partition: the model has no layers");
    double *pre = malloc((size_t)(L + 1) * sizeof *pre);
    if (!pre) return gp_error_set(GP_ERR_OOM, "out of host memory partitioning");
    pre[0] = 0;
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + costs[l];
    additive a = {pre, NULL};
    gp_partition_problem pb = {.L = L, .n = n, .cost = add_cost, .arg = &a};
    gp_status s = gp_partition_solve_v(&pb, balance, NULL);
    /* Equal stages where they cost the busiest device at most 2% more:
     * the V schedules' patterns assume alike stages, and the exact
     * device min-max may leave a stage nearly empty.  8 equal products and
     * their ReLUs: [2, 2, 2, 2] products (the min-max over the 2n stages)
     * rather than [1, 0, 4, 3] (a stage of a lone ReLU), which spared
     * device 0 two ReLUs' time.  (balance: auto's profile picks between
     * the two by simulating both, gp_plan.) */
    int st[GP_MAX_DEVICES];
    if (s == GP_OK && 2 * n <= GP_MAX_DEVICES && 2 * n <= L &&
        gp_partition_minmax(costs, L, 2 * n, st) == GP_OK) {
        double dv = 0, ds = 0;
        int fv[GP_MAX_DEVICES + 1] = {0}, fs[GP_MAX_DEVICES + 1] = {0};
        for (int j = 0; j < 2 * n; j++) {
            fv[j + 1] = fv[j] + balance[j];
            fs[j + 1] = fs[j] + st[j];
        }
        for (int d = 0; d < n; d++) {
            int e = 2 * n - 1 - d;
            dv = fmax(dv, pre[fv[d + 1]] - pre[fv[d]] + pre[fv[e + 1]] - pre[fv[e]]);
            ds = fmax(ds, pre[fs[d + 1]] - pre[fs[d]] + pre[fs[e + 1]] - pre[fs[e]]);
        }
        if (ds <= dv * 1.02) memcpy(balance, st, (size_t)(2 * n) * sizeof *st);
    }
    gp_error_clear();
    free(pre);
    return s;
}
