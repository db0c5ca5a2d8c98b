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
    if (worst_k >= 0)
        return gp_error_set(GP_ERR_OOM,
                            "%s alone needs %s on a device but the best device holds %s: over "
                            "by %s; raise pipeline.memory or pipeline.chunks (smaller "
                            "micro-batches), or checkpoint",
                            name_of(pb, worst_k, nb, sizeof nb),
                            gp_format_bytes((size_t)worst_need, b1, sizeof b1),
                            gp_format_bytes((size_t)worst_cap, b2, sizeof b2),
                            gp_format_bytes((size_t)worst_over, b3, sizeof b3));
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
                                "closest one still needs %s on stage %d (%s .. %s) whose device "
                                "holds %s: over by %s; raise pipeline.memory, add devices, or "
                                "checkpoint", L, n, gp_format_bytes((size_t)need, b1, sizeof b1),
                                j, nb, nb2, gp_format_bytes((size_t)cap, b2, sizeof b2),
                                gp_format_bytes((size_t)(need - cap), b3, sizeof b3));
        }
        first += bal[j];
    }
    return gp_error_set(GP_ERR_OOM, "no split of %d layers into %d stages fits device memory",
                        L, n);
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
