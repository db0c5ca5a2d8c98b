/*
 * test_balance — the balance module:
 *   - partitioner: the exact optimum (largest stage, then second largest)
 *     against brute force over every split, on thousands of random and
 *     adversarial cost vectors (near-uniform, one huge layer, heavy tails),
 *     with and without memory capacities; greedy filling and an equal-count
 *     spread are measurably worse on some of them; infeasible problems fail
 *     with messages naming the layer and the overflow;
 *   - V partitioner (zb-v: device d holds stages d and 2n-1-d): the optimum
 *     (largest, then second-largest device time) equals brute force over
 *     every composition into 2n stages, exactly, on about 3200 random
 *     problems (n 1..4, stage-dependent and non-monotone costs, per-device
 *     capacities, infeasible ones), plus cases by hand and its errors;
 *   - profiler: a layer with twice the FLOPs takes roughly twice the time
 *     (wide bounds), and its bytes equal what the allocator holds for the
 *     same layer built by the trainer; JSON save/load round trip;
 *   - simulator: on uniform stages written by hand, exactly GPipe's step
 *     (m + n - 1)(F + B) + update and bubble, for n 1..8 x m 1..16;
 *     predicted peak memory vs the allocator's over pipelined steps on 2
 *     CPU devices (1 thread each) for m in {1, 4, 8}, every checkpoint
 *     mode and bf16 copies, within 0.9-1.3x; the predicted step time is
 *     printed beside the measured one, not asserted (timing is
 *     bench/bench_balance's and bench_schedules' job).
 */
#include "balance/balance.h"
#include "balance/balance_impl.h"
#include "train/train.h"
#include "test.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- brute force ------------------------------------------------------------ */

typedef struct {
    const double *c, *mem, *cap;
    int L, n;
} prob;

static double stage_sum(const double *v, int first, int count)
{
    double s = 0;
    for (int k = first; k < first + count; k++) s += v[k];
    return s;
}

/* Stage cost through the same prefix sums the partitioner's additive path
 * uses, so equal splits compare exactly equal. */
static double pre_c[64], pre_m[64];
static void make_prefix(const prob *p)
{
    pre_c[0] = pre_m[0] = 0;
    for (int k = 0; k < p->L; k++) {
        pre_c[k + 1] = pre_c[k] + p->c[k];
        pre_m[k + 1] = pre_m[k] + (p->mem ? p->mem[k] : 0);
    }
}

/* Best (max, second) over every feasible split; false if none. */
static bool brute(const prob *p, double *bmax, double *bsec)
{
    int bal[16];
    bool found = false;
    *bmax = *bsec = INFINITY;
    /* enumerate cut positions: n-1 cuts among L-1 gaps */
    int cuts[16];
    for (int j = 0; j < p->n - 1; j++) cuts[j] = j + 1;
    for (;;) {
        int prev = 0;
        for (int j = 0; j < p->n; j++) {
            int c = j < p->n - 1 ? cuts[j] : p->L;
            bal[j] = c - prev;
            prev = c;
        }
        double m1 = -INFINITY, m2 = -INFINITY;
        bool ok = true;
        int first = 0;
        for (int j = 0; j < p->n; j++) {
            double v = pre_c[first + bal[j]] - pre_c[first];
            double mm = pre_m[first + bal[j]] - pre_m[first];
            if (p->mem && p->cap && p->cap[j] > 0 && mm > p->cap[j]) ok = false;
            if (v > m1) {
                m2 = m1;
                m1 = v;
            } else if (v > m2) {
                m2 = v;
            }
            first += bal[j];
        }
        if (p->n == 1) m2 = 0;
        if (ok && (m1 < *bmax || (m1 == *bmax && m2 < *bsec))) {
            *bmax = m1;
            *bsec = m2;
            found = true;
        }
        /* next combination */
        int j = p->n - 2;
        while (j >= 0 && cuts[j] == p->L - 1 - (p->n - 2 - j)) j--;
        if (j < 0) break;
        cuts[j]++;
        for (int q = j + 1; q < p->n - 1; q++) cuts[q] = cuts[q - 1] + 1;
    }
    return found;
}

static void eval_split(const prob *p, const int *bal, double *m1, double *m2)
{
    *m1 = *m2 = -INFINITY;
    int first = 0;
    for (int j = 0; j < p->n; j++) {
        double v = pre_c[first + bal[j]] - pre_c[first];
        if (v > *m1) {
            *m2 = *m1;
            *m1 = v;
        } else if (v > *m2) {
            *m2 = v;
        }
        first += bal[j];
    }
    if (p->n == 1) *m2 = 0;
}

/* Greedy: fill each stage until it would pass total / n. */
static double greedy(const prob *p)
{
    double total = stage_sum(p->c, 0, p->L), target = total / p->n, mx = 0, cur = 0;
    int stage = 0, in_stage = 0;
    for (int k = 0; k < p->L; k++) {
        int left_layers = p->L - k, left_stages = p->n - stage;
        if (in_stage > 0 && stage < p->n - 1 &&
            (cur + p->c[k] > target || left_layers < left_stages + 0)) {
            if (cur > mx) mx = cur;
            cur = 0;
            stage++;
            in_stage = 0;
        }
        if (p->L - k == p->n - stage && in_stage > 0 && stage < p->n - 1) {
            if (cur > mx) mx = cur;
            cur = 0;
            stage++;
            in_stage = 0;
        }
        cur += p->c[k];
        in_stage++;
    }
    if (cur > mx) mx = cur;
    return mx;
}

/* Equal layer counts per stage. */
static double spread(const prob *p)
{
    double mx = 0;
    int first = 0;
    for (int j = 0; j < p->n; j++) {
        int cnt = p->L / p->n + (j < p->L % p->n);
        double v = stage_sum(p->c, first, cnt);
        if (v > mx) mx = v;
        first += cnt;
    }
    return mx;
}

static uint64_t rng_state = 12345;
static double urand(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void gen(double *c, int L, int kind)
{
    for (int k = 0; k < L; k++) {
        switch (kind) {
        case 0: c[k] = 1.0 + urand(); break;                         /* uniform */
        case 1: c[k] = 10.0 + 0.01 * urand(); break;                 /* near-uniform */
        case 2: c[k] = 1.0 + urand(); break;                         /* one huge, below */
        case 3: c[k] = pow(urand() + 1e-3, -1.5); break;             /* heavy tail */
        case 4: c[k] = (double)(1 + (int)(urand() * 3)); break;      /* small integers: ties */
        default: c[k] = urand() < 0.2 ? 20 * urand() : urand(); break;
        }
    }
    if (kind == 2) c[(int)(urand() * L)] = 50.0 * (1 + urand());
}

static void test_partition_bruteforce(void)
{
    int cases = 0, mismatch = 0, greedy_worse = 0, spread_worse = 0, feas_mismatch = 0;
    double greedy_ratio = 1, spread_ratio = 1;
    double c[16], mem[16], cap[16];
    for (int it = 0; it < 6000; it++) {
        int L = 1 + (int)(urand() * 11);
        int n = 1 + (int)(urand() * (L < 5 ? L : 5));
        int kind = it % 6;
        gen(c, L, kind);
        bool with_mem = it % 3 == 2;
        if (with_mem) {
            double tot = 0;
            for (int k = 0; k < L; k++) tot += mem[k] = 1 + 9 * urand();
            for (int j = 0; j < n; j++) cap[j] = (urand() < 0.2 ? 0 : tot / n * (0.8 + urand()));
        }
        prob p = {c, with_mem ? mem : NULL, with_mem ? cap : NULL, L, n};
        make_prefix(&p);
        double bm, bs;
        bool bf = brute(&p, &bm, &bs);
        int bal[16];
        gp_status s = gp_partition_minmax_mem(c, with_mem ? mem : NULL, with_mem ? cap : NULL, L, n,
                                              bal);
        cases++;
        if (bf != (s == GP_OK)) {
            feas_mismatch++;
            continue;
        }
        if (!bf) continue;
        double m1, m2;
        eval_split(&p, bal, &m1, &m2);
        int sum = 0;
        bool each = true;
        for (int j = 0; j < n; j++) {
            sum += bal[j];
            each = each && bal[j] >= 1;
        }
        if (sum != L || !each || m1 != bm || m2 != bs) {
            if (mismatch++ < 5)
                fprintf(stderr, "mismatch L=%d n=%d kind=%d: dp (%g, %g) brute (%g, %g)\n", L, n,
                        kind, m1, m2, bm, bs);
        }
        if (!with_mem && n > 1) {
            double g = greedy(&p), sp = spread(&p);
            if (g > m1 * (1 + 1e-12)) greedy_worse++;
            if (sp > m1 * (1 + 1e-12)) spread_worse++;
            if (g / m1 > greedy_ratio) greedy_ratio = g / m1;
            if (sp / m1 > spread_ratio) spread_ratio = sp / m1;
            CHECK(g >= m1 * (1 - 1e-12) && sp >= m1 * (1 - 1e-12)); /* never better than exact */
        }
    }
    CHECK_MSG(mismatch == 0, "%d of %d cases differ from brute force", mismatch, cases);
    CHECK_MSG(feas_mismatch == 0, "%d cases disagree on feasibility", feas_mismatch);
    printf("test_balance: partitioner = brute force on %d cases; greedy worse on %d (up to "
           "%.2fx), equal-count spread worse on %d (up to %.2fx)\n",
           cases, greedy_worse, greedy_ratio, spread_worse, spread_ratio);
    CHECK(greedy_worse > 100 && greedy_ratio > 1.3);
    CHECK(spread_worse > 100 && spread_ratio > 1.5);

    /* A fixed case where both heuristics lose: one heavy layer in front. */
    double hv[8] = {8, 1, 1, 1, 1, 1, 1, 1};
    prob p = {hv, NULL, NULL, 8, 2};
    make_prefix(&p);
    int bal[2];
    CHECK_OK(gp_partition_minmax(hv, 8, 2, bal));
    CHECK(bal[0] == 1 && bal[1] == 7);
    CHECK(greedy(&p) >= 8 && spread(&p) == 11);
}

static void test_partition_tiebreak_and_errors(void)
{
    /* equal maxima: the split with the smaller second-largest stage wins */
    double c[5] = {4, 1, 1, 2, 4};
    int bal[3];
    CHECK_OK(gp_partition_minmax(c, 5, 3, bal));
    /* best max 4: [4][1 1 2][4] gives second 4; [4][1,1][2,4]? max 6. */
    CHECK(bal[0] == 1 && bal[1] == 3 && bal[2] == 1);
    /* deterministic: the same answer every time */
    int bal2[3];
    CHECK_OK(gp_partition_minmax(c, 5, 3, bal2));
    CHECK(!memcmp(bal, bal2, sizeof bal));

    CHECK_ERR(gp_partition_minmax(c, 5, 6, bal), GP_ERR_INVALID, "cannot split 5 layers into 6");
    double mem[4] = {10, 90, 10, 10}, cap[2] = {60, 60};
    double cc[4] = {1, 1, 1, 1};
    CHECK_ERR(gp_partition_minmax_mem(cc, mem, cap, 4, 2, bal), GP_ERR_OOM,
              "layer 1 alone needs");
    CHECK_ERR(gp_partition_minmax_mem(cc, mem, cap, 4, 2, bal), GP_ERR_OOM, "over by 30 B");
    /* each layer fits alone but no split does */
    double mem2[4] = {40, 40, 40, 40}, cap2[2] = {70, 100};
    CHECK_ERR(gp_partition_minmax_mem(cc, mem2, cap2, 4, 2, bal), GP_ERR_OOM, "over by");
    /* capacity moves the split away from the cost optimum */
    double c3[4] = {1, 1, 1, 1}, m3[4] = {50, 50, 50, 50}, cap3[2] = {60, 0};
    CHECK_OK(gp_partition_minmax_mem(c3, m3, cap3, 4, 2, bal));
    CHECK(bal[0] == 1 && bal[1] == 3);
}

/* ---- V placement -------------------------------------------------------------- */

/* A cost model for gp_partition_solve_v: stage j = [first, first + count)
 * costs scale[j] * (sum of c) + off[j] + edge[first + count - 1] (a term of
 * the stage's last layer, like a boundary copy: the cost is not monotone in
 * the stage's length when edge varies); its bytes are the sum of mem. */
typedef struct {
    int L, n;                  /* layers, devices */
    double c[48], edge[48], mem[48];
    double scale[16], off[16]; /* [2n] */
    double cap[8];             /* [n], per device; 0 = unlimited */
    bool with_mem;
    int calls;                 /* cost calls, to check they stay O(n L^2) */
} vprob;

static double v_cost(void *arg, int j, int first, int count)
{
    vprob *p = arg;
    p->calls++;
    GP_ASSERT(j >= 0 && j < 2 * p->n && first >= j && count >= 1);
    GP_ASSERT(first + count <= p->L - (2 * p->n - 1 - j)); /* room for the rest */
    return p->scale[j] * stage_sum(p->c, first, count) + p->off[j] +
           p->edge[first + count - 1];
}

static double v_mem(void *arg, int j, int first, int count)
{
    const vprob *p = arg;
    return stage_sum(p->mem, first, count);
}

static gp_partition_problem v_problem(vprob *p)
{
    return (gp_partition_problem){.L = p->L, .n = p->n, .cost = v_cost,
                                  .mem = p->with_mem ? v_mem : NULL,
                                  .capacity = p->with_mem ? p->cap : NULL, .arg = p};
}

/* (largest, second-largest) device time of a V split; false if a device is
 * over its capacity.  Device d sums stage d then stage 2n-1-d, as the
 * partitioner does, so equal splits compare exactly equal. */
static bool v_eval(vprob *p, const int *bal, double *m1, double *m2)
{
    int start[17], n = p->n;
    start[0] = 0;
    for (int j = 0; j < 2 * n; j++) start[j + 1] = start[j] + bal[j];
    *m1 = *m2 = -INFINITY;
    bool ok = true;
    for (int d = 0; d < n; d++) {
        int j2 = 2 * n - 1 - d;
        double t = v_cost(p, d, start[d], bal[d]) + v_cost(p, j2, start[j2], bal[j2]);
        if (p->with_mem && p->cap[d] > 0 &&
            v_mem(p, d, start[d], bal[d]) + v_mem(p, j2, start[j2], bal[j2]) > p->cap[d])
            ok = false;
        if (t > *m1) {
            *m2 = *m1;
            *m1 = t;
        } else if (t > *m2) {
            *m2 = t;
        }
    }
    if (n == 1) *m2 = 0;
    return ok;
}

/* Every composition of the layers into 2n positive parts (parts j.. of
 * `left` layers): the best (max, second) of those that fit, in *bmax,
 * *bsec; returns how many there are. */
static long v_brute(vprob *p, int *bal, int j, int left, double *bmax, double *bsec, bool *found)
{
    int P = 2 * p->n;
    if (j == P - 1) {
        bal[j] = left;
        double m1, m2;
        if (v_eval(p, bal, &m1, &m2) && (!*found || m1 < *bmax || (m1 == *bmax && m2 < *bsec))) {
            *bmax = m1;
            *bsec = m2;
            *found = true;
        }
        return 1;
    }
    long count = 0;
    for (int c = 1; c <= left - (P - 1 - j); c++) {
        bal[j] = c;
        count += v_brute(p, bal, j + 1, left - c, bmax, bsec, found);
    }
    return count;
}

/* Random problems: additive costs (kinds as gen's), stage-index dependent
 * scales and offsets, a boundary term that makes cost non-monotone in a
 * stage's length, per-device capacities from generous to impossible. */
static void v_random(vprob *p, uint64_t *rs, int it, int n, int L)
{
    uint64_t save = rng_state;
    rng_state = *rs;
    p->n = n;
    p->L = L;
    gen(p->c, L, it % 6);
    int model = (it / 6) % 3; /* 0 additive, 1 per-stage, 2 per-stage + edge */
    for (int j = 0; j < 2 * n; j++) {
        p->scale[j] = model == 0 ? 1 : 0.5 + urand();
        p->off[j] = model == 0 ? 0 : (double)(int)(urand() * 3);
    }
    for (int k = 0; k < L; k++) p->edge[k] = model == 2 ? 4 * urand() : 0;
    p->with_mem = (it / 18) % 2 == 1;
    double tot = 0;
    for (int k = 0; k < L; k++) tot += p->mem[k] = 1 + 9 * urand();
    for (int d = 0; d < n; d++) {
        double u = urand();
        /* 0: unlimited; else about a device's share, from 0.5x (often
         * infeasible) to 2x */
        p->cap[d] = u < 0.2 ? 0 : tot / n * (0.5 + 1.5 * urand());
    }
    p->calls = 0;
    *rs = rng_state;
    rng_state = save;
}

/* gp_partition_minmax_v (the FLOPs split of a V schedule): equal stages
 * where they cost the busiest device at most 2% more than the device
 * min-max, which otherwise left a stage of a lone ReLU on 8 equal
 * products; the device min-max where equal stages would cost more. */
static void test_minmax_v_stages(void)
{
    double c[18] = {0}; /* flatten, 8 x (product, relu), head */
    for (int k = 0; k < 8; k++) c[1 + 2 * k] = 1.0, c[2 + 2 * k] = 1e-4;
    c[17] = 0.005;
    int bal[4];
    CHECK_OK(gp_partition_minmax_v(c, 18, 2, bal));
    double st[4] = {0};
    for (int j = 0, f = 0; j < 4; f += bal[j++])
        for (int k = f; k < f + bal[j]; k++) st[j] += c[k];
    CHECK_MSG(st[0] >= 1.9 && st[1] >= 1.9 && st[2] >= 1.9 && st[3] >= 1.9,
              "8 equal products in a V: stages [%d, %d, %d, %d] cost %.3f %.3f %.3f %.3f", bal[0],
              bal[1], bal[2], bal[3], st[0], st[1], st[2], st[3]);
    /* equal stages would load device 0 with 6 of 8 units: the device split */
    double d[6] = {3, 1, 1, 1, 1, 1};
    CHECK_OK(gp_partition_minmax_v(d, 6, 2, bal));
    double dev0 = 0, dev1 = 0;
    for (int j = 0, f = 0; j < 4; f += bal[j++])
        for (int k = f; k < f + bal[j]; k++) *(j == 0 || j == 3 ? &dev0 : &dev1) += d[k];
    CHECK_MSG(fmax(dev0, dev1) <= 4.0 + 1e-9, "[3, 1, 1, 1, 1, 1] in a V: devices %.1f and %.1f",
              dev0, dev1);
}

static void test_partition_v(void)
{
    uint64_t rs = 777;
    int cases = 0, infeasible = 0, mismatch = 0, feas_mismatch = 0, bad_bal = 0, checked = 0;
    long splits = 0;
    /* small (n 1..3, L 2n..10), many times each; then a few larger ones */
    for (int round = 0; round < 2; round++)
        for (int n = 1; n <= (round ? 4 : 3); n++)
            for (int L = 2 * n; L <= (round ? (n == 1 ? 40 : n == 2 ? 24 : n == 3 ? 16 : 13)
                                          : 10);
                 L += round ? 3 : 1)
                for (int it = 0; it < (round ? 36 : 108); it++) {
                    vprob p;
                    v_random(&p, &rs, it, n, L);
                    gp_partition_problem pb = v_problem(&p);
                    int bal[16], tmp[16];
                    double bm = INFINITY, bs = INFINITY, got = -1;
                    bool bf = false;
                    splits += v_brute(&p, tmp, 0, L, &bm, &bs, &bf);
                    p.calls = 0;
                    gp_status s = gp_partition_solve_v(&pb, bal, &got);
                    cases++;
                    /* cost called once per (stage, first, count) at most */
                    if (p.calls > 2 * n * L * (L + 1) / 2) bad_bal++;
                    if (bf != (s == GP_OK) || (!bf && s != GP_ERR_OOM)) {
                        if (feas_mismatch++ < 5)
                            fprintf(stderr, "V feasibility L=%d n=%d it=%d: brute %d, %s: %s\n",
                                    L, n, it, bf, gp_status_name(s), gp_last_error());
                        continue;
                    }
                    if (!bf) {
                        infeasible++;
                        continue;
                    }
                    int sum = 0;
                    bool each = true;
                    for (int j = 0; j < 2 * n; j++) {
                        sum += bal[j];
                        each = each && bal[j] >= 1;
                    }
                    if (sum != L || !each) {
                        bad_bal++;
                        continue;
                    }
                    double m1, m2;
                    bool fits = v_eval(&p, bal, &m1, &m2);
                    checked++;
                    if (!fits || m1 != bm || m2 != bs || got != bm) {
                        if (mismatch++ < 5)
                            fprintf(stderr, "V mismatch L=%d n=%d it=%d: dp (%.17g, %.17g) "
                                    "fits %d, out_max %.17g; brute (%.17g, %.17g)\n", L, n, it,
                                    m1, m2, fits, got, bm, bs);
                    }
                    /* deterministic */
                    int bal2[16];
                    CHECK(gp_partition_solve_v(&pb, bal2, NULL) == GP_OK &&
                          !memcmp(bal, bal2, (size_t)(2 * n) * sizeof *bal));
                    /* the pruning changes nothing: the same split, ties
                     * included, and the same largest time */
                    double got2 = -1;
                    gp_partition_v_prune = false;
                    CHECK(gp_partition_solve_v(&pb, bal2, &got2) == GP_OK && got2 == got &&
                          !memcmp(bal, bal2, (size_t)(2 * n) * sizeof *bal));
                    gp_partition_v_prune = true;
                }
    /* larger, past what brute force enumerates: pruned against unpruned
     * (every cost model, ties from the integer ones, memory limits) */
    int pruned_cases = 0, pruned_differ = 0;
    for (int n = 2; n <= 5; n++)
        for (int L = 4 * n + 6; L <= 48; L += 10)
            for (int it = 0; it < 36; it += 1 + (n > 3)) {
                vprob p;
                v_random(&p, &rs, it, n, L);
                if (it % 4 == 3) /* some stages' costs below zero: no stage-cost cut */
                    for (int j = 0; j < 2 * n; j++) p.off[j] -= 6;
                gp_partition_problem pb = v_problem(&p);
                int b1[16], b2[16];
                double m1 = -1, m2 = -1;
                gp_status s1 = gp_partition_solve_v(&pb, b1, &m1);
                gp_error_clear();
                gp_partition_v_prune = false;
                gp_status s2 = gp_partition_solve_v(&pb, b2, &m2);
                gp_error_clear();
                gp_partition_v_prune = true;
                pruned_cases++;
                if (s1 != s2 || (s1 == GP_OK && (m1 != m2 ||
                                                 memcmp(b1, b2, (size_t)(2 * n) * sizeof *b1)))) {
                    if (pruned_differ++ < 5)
                        fprintf(stderr, "V pruning changed L=%d n=%d it=%d: %s / %s, max %.17g "
                                "/ %.17g\n", L, n, it, gp_status_name(s1), gp_status_name(s2),
                                m1, m2);
                }
            }
    CHECK_MSG(pruned_differ == 0, "%d of %d larger V cases differ with pruning off",
              pruned_differ, pruned_cases);
    printf("test_balance: V partitioner with pruning = without (split and value) on %d cases "
           "of 14-48 layers, as on every feasible case below\n", pruned_cases);
    CHECK_MSG(mismatch == 0, "%d of %d V cases differ from brute force", mismatch, checked);
    CHECK_MSG(feas_mismatch == 0, "%d V cases disagree on feasibility", feas_mismatch);
    CHECK_MSG(bad_bal == 0, "%d V balances malformed or cost called too often", bad_bal);
    CHECK(infeasible > 20 && checked > 1500); /* both sides exercised */
    printf("test_balance: V partitioner = brute force (max and second device time, exactly) "
           "on %d random cases (%d feasible, %d infeasible; %ld splits enumerated)\n", cases,
           checked, infeasible, splits);

    /* By hand. */
    vprob p = {.L = 8, .n = 2};
    for (int k = 0; k < 8; k++) p.c[k] = 1;
    for (int j = 0; j < 4; j++) p.scale[j] = 1;
    gp_partition_problem pb = v_problem(&p);
    int bal[16];
    double mx = 0;
    CHECK_OK(gp_partition_solve_v(&pb, bal, &mx));
    CHECK(mx == 4);
    CHECK(bal[0] + bal[3] == 4 && bal[1] + bal[2] == 4);
    /* one heavy layer first: device 0 takes it alone and one light layer
     * from the end; device 1 the six in the middle (9 vs 6 at best: 8 + 1) */
    p.c[0] = 8;
    CHECK_OK(gp_partition_solve_v(&pb, bal, &mx));
    CHECK(mx == 9 && bal[0] == 1 && bal[3] == 1 && bal[1] + bal[2] == 6);
    p.c[0] = 1;
    /* n = 1: both stages on one device, time = all layers */
    vprob p1 = {.L = 3, .n = 1, .c = {1, 2, 3}, .scale = {1, 1}};
    gp_partition_problem pb1 = v_problem(&p1);
    CHECK_OK(gp_partition_solve_v(&pb1, bal, &mx));
    CHECK(mx == 6 && bal[0] + bal[1] == 3 && bal[0] >= 1 && bal[1] >= 1);

    /* errors */
    p.L = 3;
    pb = v_problem(&p);
    CHECK_ERR(gp_partition_solve_v(&pb, bal, NULL), GP_ERR_INVALID,
              "cannot split 3 layers into 4 stages");
    p.L = 8;
    p.with_mem = true;
    for (int k = 0; k < 8; k++) p.mem[k] = 10;
    p.mem[5] = 90;
    p.cap[0] = 60;
    p.cap[1] = 60;
    pb = v_problem(&p);
    CHECK_ERR(gp_partition_solve_v(&pb, bal, NULL), GP_ERR_OOM, "layer 5 alone needs");
    CHECK_ERR(gp_partition_solve_v(&pb, bal, NULL), GP_ERR_OOM, "over by 30 B");
    /* each layer fits device 0, but device 1 holds 5 B, less than its two
     * stages' 20 B at least */
    p.mem[5] = 10;
    p.cap[1] = 5;
    pb = v_problem(&p);
    CHECK_ERR(gp_partition_solve_v(&pb, bal, NULL), GP_ERR_OOM,
              "closest one still needs 20 B on device 1");
    /* memory moves the optimum: device 1 (stages 1, 2) holds at most two
     * layers, so device 0 takes six (time 6 with unit costs, not 4) */
    p.cap[0] = 0;
    p.cap[1] = 20;
    pb = v_problem(&p);
    CHECK_OK(gp_partition_solve_v(&pb, bal, &mx));
    CHECK(mx == 6 && bal[1] == 1 && bal[2] == 1);
}

/* ---- profiler ---------------------------------------------------------------- */

/* A batch of b uniform inputs of per values each and class labels 0..9, the
 * classifier benches' (the caller frees both) */
static void class_batch(int64_t b, int64_t per, float **x, float **y)
{
    *x = malloc((size_t)(b * per) * sizeof **x);
    *y = malloc((size_t)b * sizeof **y);
    CHECK(*x && *y);
    gp_rng_uniform_fill(5, 6, 0, *x, b * per);
    for (int64_t i = 0; i < b; i++) (*y)[i] = (float)(i % 10);
}

static gp_profile_opts popts(int64_t b)
{
    gp_profile_opts o = {.device = "cpu:0", .threads = 1, .warmup = 2, .reps = 5,
                         .timed = true, .n_sizes = 1, .batch = b, .chunks = 1,
                         .optim_slots = 1, .seed = 1};
    o.sizes[0] = b;
    return o;
}

/* The text of every file (whole), with `from` replaced once by `to`, into
 * `path2`; false if `from` is not there. */
static bool rewrite(const char *path, const char *path2, const char *from, const char *to)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, from);
    if (!at) return false;
    f = fopen(path2, "wb");
    if (!f) return false;
    fwrite(text, 1, (size_t)(at - text), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    return true;
}

/* A profile belongs to the model it was taken of: the spec texts per type,
 * gp_profile_check_model's messages for each kind of difference, the sizes
 * measured, and the file's own checks (old version, edited hash or spec).
 * q is cfg's profile as loaded from `path`. */
static void test_profile_identity(const gp_config *cfg, const gp_profile *q, const char *path)
{
    char buf[GP_PROFILE_SPEC_LEN];
    gp_layer_spec sp = gp_layer_spec_default(GP_LAYER_LINEAR);
    sp.out = 10;
    sp.in = 64; /* fixed by the layers before: not part of the spec */
    snprintf(sp.name, sizeof sp.name, "fc");
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf), "linear {out: 10, bias: true}"));
    sp = gp_layer_spec_default(GP_LAYER_AVGPOOL2D);
    sp.kernel = gp_hw_square(3);
    sp.padding = gp_hw_square(1);
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf),
                  "avgpool2d {kernel: 3, stride: 3, padding: 1}"));
    /* a square window keeps its one number (profiles taken before [h, w]
     * existed still match); a per-axis one reads back as YAML */
    sp = gp_layer_spec_default(GP_LAYER_CONV2D);
    sp.out = 8;
    sp.kernel = (gp_hw){1, 7};
    sp.padding = (gp_hw){0, 3};
    sp.bias = false;
    sp.init = GP_INIT_KAIMING_NORMAL_FAN_OUT; /* no effect on cost */
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf),
                  "conv2d {out: 8, kernel: [1, 7], stride: 1, padding: [0, 3], bias: false}"));
    sp = gp_layer_spec_default(GP_LAYER_MAXPOOL2D);
    sp.kernel = (gp_hw){3, 1};
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf),
                  "maxpool2d {kernel: [3, 1], stride: [3, 1], padding: 0}"));
    sp = gp_layer_spec_default(GP_LAYER_FACTORIZED_REDUCE);
    sp.out = 64;
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf),
                  "factorized_reduce {out: 64, sync: false}"));
    sp = gp_layer_spec_default(GP_LAYER_BATCHNORM);
    sp.momentum = 0.5f; /* no effect on cost */
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf), "batchnorm {sync: false}"));
    sp = gp_layer_spec_default(GP_LAYER_RESIDUAL);
    sp.out = 64;
    sp.stride = gp_hw_square(2);
    sp.sync = true;
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf),
                  "residual {out: 64, stride: 2, sync: true}"));
    sp = gp_layer_spec_default(GP_LAYER_DROPOUT);
    sp.p = 0.25f;
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf), "dropout {p: 0.25}"));
    sp = gp_layer_spec_default(GP_LAYER_FLATTEN);
    CHECK(!strcmp(gp_profile_layer_spec(&sp, buf, sizeof buf), "flatten"));

    /* the same model passes; names and file positions do not matter */
    int L = cfg->model.n_layers;
    gp_layer_spec specs[16];
    memcpy(specs, cfg->model.layers, (size_t)L * sizeof *specs);
    snprintf(specs[0].name, sizeof specs[0].name, "renamed");
    specs[0].line = 99;
    CHECK_OK(gp_profile_check_model(q, "p.json", specs, L, cfg->model.input));
    const char *fix = "; profile this config again (gpipe-balance CONFIG.yaml --profile-out FILE)";
    char want[2048];
    /* a layer differs */
    specs[0].out = 16;
    snprintf(want, sizeof want, "profile 'p.json' was taken for a different model: layer 0 is "
             "conv2d {out: 8, kernel: 3, stride: 1, padding: 1, bias: true} there, conv2d {out: "
             "16, kernel: 3, stride: 1, padding: 1, bias: true} here%s", fix);
    CHECK_ERR(gp_profile_check_model(q, "p.json", specs, L, cfg->model.input), GP_ERR_INVALID,
              want);
    CHECK(!strcmp(gp_last_error(), want));
    specs[0].out = 8;
    /* as many layers, another type */
    specs[2] = gp_layer_spec_default(GP_LAYER_DROPOUT);
    CHECK_ERR(gp_profile_check_model(q, "p.json", specs, L, cfg->model.input), GP_ERR_INVALID,
              "layer 2 is relu there, dropout {p: 0.5} here;");
    specs[2] = cfg->model.layers[2];
    /* the input */
    int64_t in3[3] = {3, 12, 12};
    snprintf(want, sizeof want, "profile 'p.json' was taken for a different model: input [1, 12, "
             "12] there, [3, 12, 12] here%s", fix);
    CHECK_ERR(gp_profile_check_model(q, "p.json", specs, L, in3), GP_ERR_INVALID, want);
    CHECK(!strcmp(gp_last_error(), want));
    /* one layer more */
    specs[L] = gp_layer_spec_default(GP_LAYER_RELU);
    snprintf(want, sizeof want, "profile 'p.json' was taken for a different model: %d layers "
             "there, %d here%s", L, L + 1, fix);
    CHECK_ERR(gp_profile_check_model(q, "p.json", specs, L + 1, cfg->model.input),
              GP_ERR_INVALID, want);
    CHECK(!strcmp(gp_last_error(), want));
    /* one layer fewer and one changed: the first difference is named */
    specs[1] = gp_layer_spec_default(GP_LAYER_RELU);
    CHECK_ERR(gp_profile_check_model(q, "p.json", specs, L - 1, cfg->model.input),
              GP_ERR_INVALID, "layers there, 5 here (the first difference: layer 1 is batchnorm "
                              "{sync: false} there, relu here);");
    specs[1] = cfg->model.layers[1];
    /* a tie: the tied layer keeps no optimizer state of its own (a tied
     * GPT's profile was read for the untied model, its head's state a
     * third of what it is) */
    int linears = 0;
    for (int k = 0; k < L; k++)
        if (specs[k].type == GP_LAYER_LINEAR && !linears++) {
            snprintf(specs[k].tie, sizeof specs[k].tie, "stem");
            char t[160];
            snprintf(t, sizeof t, "layer %d is linear {out: %lld, bias: true} there, linear "
                     "{out: %lld, bias: true} (tie: stem) here;", k, (long long)specs[k].out,
                     (long long)specs[k].out);
            CHECK_ERR(gp_profile_check_model(q, "p.json", specs, L, cfg->model.input),
                      GP_ERR_INVALID, t);
            specs[k] = cfg->model.layers[k];
        }
    CHECK(linears > 0);
    /* the texts agree but the hash does not (a profile from elsewhere) */
    gp_profile h = *q;
    h.model_hash ^= 1;
    snprintf(want, sizeof want, "profile 'p.json' was taken for a different model (model hash "
             "%016llx there, %016llx here)%s", (unsigned long long)h.model_hash,
             (unsigned long long)q->model_hash, fix);
    CHECK_ERR(gp_profile_check_model(&h, "p.json", specs, L, cfg->model.input), GP_ERR_INVALID,
              want);

    /* the sizes measured */
    int64_t need[3] = {8, 16, 8}, missing[3];
    CHECK(q->n_sizes == 1 && q->sizes[0] == 16);
    CHECK(gp_profile_missing_sizes(q, need + 1, 1, missing) == 0);
    CHECK(gp_profile_missing_sizes(q, need, 3, missing) == 1 && missing[0] == 8);

    /* the file: an old version, an edited hash, an edited spec, no spec */
    char p2[560];
    snprintf(p2, sizeof p2, "%.512s.edited", path);
    gp_profile r;
    CHECK(rewrite(path, p2, "\"version\": 2", "\"version\": 1"));
    snprintf(want, sizeof want, "profile '%s' has version 1; this gpipe reads version 2, which "
             "records the model it was taken of: re-create it with gpipe-balance CONFIG.yaml "
             "--profile-out %s", p2, p2);
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, want);
    CHECK(!strcmp(gp_last_error(), want));
    char from[64], to[64];
    snprintf(from, sizeof from, "\"model_hash\": \"%016llx\"", (unsigned long long)q->model_hash);
    snprintf(to, sizeof to, "\"model_hash\": \"%016llx\"", (unsigned long long)(q->model_hash ^ 2));
    CHECK(rewrite(path, p2, from, to));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, "does not match its input and layer specs");
    CHECK(rewrite(path, p2, "\"spec\":\"relu\"", "\"spec\":\"relu {x: 1}\""));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, "does not match its input and layer specs");
    CHECK(rewrite(path, p2, "\"spec\":\"relu\"", "\"spek\":\"relu\""));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, "layers[2]: \"spec\" is missing");
    CHECK(rewrite(path, p2, "\"input\": [1,12,12]", "\"input\": [1,12]"));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, "\"input\" is missing or not a list");
    /* an amount out of range (it would be cast to size_t, or sum to inf) */
    CHECK(rewrite(path, p2, "\"keep_per_sample\":", "\"keep_per_sample\":-1e300,\"was\":"));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA,
              "layers[0]: \"keep_per_sample\" is -1e+300, not an amount (0 .. 1e18)");
    /* the run's facts out of range: cast to int and int64 (undefined) */
    CHECK(rewrite(path, p2, "\"batch\":", "\"contend\": 1e300, \"batch\":"));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, "\"contend\"");
    CHECK(rewrite(path, p2, "\"batch\":", "\"evict_bytes\": -5, \"batch\":"));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, "\"evict_bytes\"");
    /* and the lists' sizes and layer indices, checked before their casts */
    CHECK(rewrite(path, p2, "\"input\": [1,12,12]", "\"input\": [1e300,12,12]"));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA,
              "\"input\"[0] is 1e+300, not a whole number from 1 to");
    CHECK(rewrite(path, p2, "\"batch\":", "\"skips\": [[1e300, 2]], \"batch\":"));
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA,
              "\"skips\"[0] is 1e+300, not a whole number from 0 to");
    /* the whole messages of a count, of a count in a layer and of a list
     * item (one check makes all three: each says where, what and the fix) */
    const char *redo = "; re-create the profile with gpipe-balance --profile-out";
    CHECK(rewrite(path, p2, "\"batch\":", "\"contend\": 2.5, \"batch\":"));
    snprintf(want, sizeof want, "profile '%s': \"contend\" is 2.5, not a whole number from 0 "
             "to 65536%s", p2, redo);
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, want);
    CHECK(!strcmp(gp_last_error(), want));
    CHECK(rewrite(path, p2, "\"keep_per_sample\":", "\"x_chain_from\": 3, \"keep_per_sample\":"));
    snprintf(want, sizeof want, "profile '%s': layers[0]: \"x_chain_from\" is 3, not a whole "
             "number from 0 to -1%s", p2, redo);
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, want);
    CHECK(!strcmp(gp_last_error(), want));
    CHECK(rewrite(path, p2, "\"input\": [1,12,12]", "\"input\": [1,12,-7]"));
    snprintf(want, sizeof want, "profile '%s': \"input\"[2] is -7, not a whole number from 1 "
             "to 1099511627776%s", p2, redo);
    CHECK_ERR(gp_profile_load(p2, &r), GP_ERR_DATA, want);
    CHECK(!strcmp(gp_last_error(), want));
    remove(p2);
}

/* Identical layers are measured once (a GPT's blocks): flatten, then
 * linear 64 -> relu -> linear 64 -> relu three times over, with names,
 * then a last linear.  Each repeat takes its first's times and bytes (the
 * very values) under its own description; a layer of other width, the
 * first trainable one and the last are measured themselves. */
static void test_profile_twins(void)
{
    enum { L = 9 };
    gp_layer_spec s[L];
    s[0] = gp_layer_spec_default(GP_LAYER_FLATTEN);
    for (int k = 1; k <= 6; k++) {
        s[k] = gp_layer_spec_default(k % 2 ? GP_LAYER_LINEAR : GP_LAYER_RELU);
        s[k].out = 64;
        snprintf(s[k].name, sizeof s[k].name, "b%d", k);
    }
    s[7] = gp_layer_spec_default(GP_LAYER_LINEAR);
    s[7].out = 32; /* another width: its own measurement */
    s[8] = gp_layer_spec_default(GP_LAYER_LINEAR);
    s[8].out = 10;
    int64_t in[3] = {64, 1, 1};
    gp_profile_opts o = popts(32);
    o.warmup = 0;
    o.reps = 1;
    gp_profile p;
    CHECK_OK(gp_profile_run(s, L, in, &o, &p));
    if (p.L != L) return;
    /* layer 1 is the first trainable (no dx): 3 and 5 are layer 3's twins
     * not its; the relus 2, 4, 6 are 2's */
    const int twin[L] = {-1, -1, -1, -1, 2, 3, 4, -1, -1};
    for (int k = 0; k < L; k++) {
        int j = twin[k];
        if (j < 0) continue;
        CHECK_MSG(!memcmp(&p.t[k], &p.t[j], sizeof p.t[k]), "layer %d's times are not layer "
                  "%d's", k, j);
        CHECK_MSG(p.mem[k].keep_per_sample == p.mem[j].keep_per_sample &&
                      p.mem[k].param_bytes == p.mem[j].param_bytes &&
                      p.mem[k].workspace_bytes == p.mem[j].workspace_bytes,
                  "layer %d's bytes are not layer %d's", k, j);
        char name[8];
        snprintf(name, sizeof name, "'b%d'", k);
        CHECK_MSG(strstr(p.mem[k].desc, name) != NULL, "layer %d described as '%s'", k,
                  p.mem[k].desc);
    }
    /* the measured ones are measurements of their own (times > 0) */
    for (int k = 1; k < L; k++)
        CHECK_MSG(p.t[k].fwd > 0, "layer %d: forward %g s", k, p.t[k].fwd);
    CHECK(p.mem[7].param_bytes != p.mem[3].param_bytes);
    CHECK(p.first_trainable == 1);
    gp_profile_free(&p);
}

static void test_profiler(void)
{
    /* flatten + linear; the two models differ only in the linear's width */
    gp_layer_spec sa[2], sb[2];
    sa[0] = sb[0] = gp_layer_spec_default(GP_LAYER_FLATTEN);
    sa[1] = sb[1] = gp_layer_spec_default(GP_LAYER_LINEAR);
    sa[1].out = 384;
    sb[1].out = 768; /* same input, twice the outputs: twice the FLOPs */
    int64_t in[3] = {384, 1, 1};
    gp_profile_opts o = popts(256);
    gp_profile a, b;
    /* Twice the FLOPs must take clearly longer; a shared machine's drift
     * between the two profiles can blur one attempt, not three.  (Under
     * 7 busy processes on 2 cores one attempt measured 4.99: the upper
     * bound only catches a profiler that times something else.) */
    double r = 0;
    for (int attempt = 1; attempt <= 3; attempt++) {
        if (attempt > 1) {
            gp_profile_free(&a);
            gp_profile_free(&b);
        }
        CHECK_OK(gp_profile_run(sa, 2, in, &o, &a));
        CHECK_OK(gp_profile_run(sb, 2, in, &o, &b));
        if (a.L != 2 || b.L != 2) return;
        double ta = a.t[1].fwd + a.t[1].bwd_data + a.t[1].bwd_weights;
        double tb = b.t[1].fwd + b.t[1].bwd_data + b.t[1].bwd_weights;
        r = tb / ta;
        printf("test_balance: linear 384->768 / 384->384 time ratio %.2f (FLOPs ratio 2)\n", r);
        if (r > 1.2 && r < 6) break;
    }
    CHECK_MSG(r > 1.2 && r < 6, "time ratio %.2f", r);
    CHECK(fabs(b.mem[1].flops_per_sample / a.mem[1].flops_per_sample - 2.0) < 0.01);
    /* bytes: the layer's own tensors, as the allocator counted them */
    CHECK(b.mem[1].param_bytes == (size_t)(384 * 768 + 768) * sizeof(float));
    CHECK(b.mem[1].grad_bytes == b.mem[1].param_bytes);
    CHECK(b.mem[1].optim_bytes == b.mem[1].param_bytes);
    CHECK(b.mem[1].keep_per_sample >= b.mem[1].out_per_sample);
    CHECK(b.mem[0].param_bytes == 0 && b.first_trainable == 1);
    gp_profile_free(&a);
    gp_profile_free(&b);

    /* Timed as in a pipeline of 2 CPU devices: another device runs the
     * same layer meanwhile, and the cache is evicted before each timed op
     * for a model over 4 MiB (2048 x 1024 linear: 8 MiB of weights, 16 of
     * weights + gradients).  The memory columns stay the layer's own (the
     * load runs on devices of its own), and the settings are recorded. */
    gp_layer_spec sc[2];
    sc[0] = gp_layer_spec_default(GP_LAYER_FLATTEN);
    sc[1] = gp_layer_spec_default(GP_LAYER_LINEAR);
    sc[1].out = 1024;
    int64_t in2[3] = {2048, 1, 1};
    gp_profile_opts oc = popts(32);
    oc.reps = 3;
    gp_profile alone, loaded;
    CHECK_OK(gp_profile_run(sc, 2, in2, &oc, &alone));
    oc.contend = 1;
    CHECK_OK(gp_profile_run(sc, 2, in2, &oc, &loaded));
    if (alone.L == 2 && loaded.L == 2) {
        size_t want = (size_t)(2048 * 1024 + 1024) * sizeof(float);
        CHECK(alone.contend == 0 && loaded.contend == 1);
        CHECK_MSG(alone.evict_bytes == (int64_t)(2 * want) && loaded.evict_bytes == alone.evict_bytes,
                  "evict bytes %lld / %lld, want %zu", (long long)alone.evict_bytes,
                  (long long)loaded.evict_bytes, 2 * want);
        for (int k = 0; k < 2; k++) {
            CHECK(loaded.mem[k].param_bytes == alone.mem[k].param_bytes);
            CHECK(loaded.mem[k].grad_bytes == alone.mem[k].grad_bytes);
            CHECK(loaded.mem[k].keep_per_sample == alone.mem[k].keep_per_sample);
            CHECK(loaded.mem[k].workspace_bytes == alone.mem[k].workspace_bytes);
        }
        CHECK(loaded.mem[1].param_bytes == want);
        CHECK(loaded.t[1].fwd > 0 && loaded.t[1].bwd_data > 0 && loaded.t[1].bwd_weights > 0);
        /* and they survive a save / load */
        char path[] = "/tmp/gpipe_prof_XXXXXX";
        int fd = mkstemp(path);
        if (fd >= 0) close(fd);
        gp_profile back;
        CHECK_OK(gp_profile_save(&loaded, path));
        CHECK_OK(gp_profile_load(path, &back));
        CHECK(back.contend == 1 && back.evict_bytes == loaded.evict_bytes);
        gp_profile_free(&back);
        unlink(path);
    }
    gp_profile_free(&alone);
    gp_profile_free(&loaded);

    const char *yaml =
        "model:\n"
        "  input: [1, 12, 12]\n"
        "  layers:\n"
        "    - conv2d: {out: 8, kernel: 3, padding: 1}\n"
        "    - batchnorm\n"
        "    - relu\n"
        "    - maxpool2d: {kernel: 2}\n"
        "    - flatten\n"
        "    - linear: {out: 10}\n"
        "data: {dataset: synthetic}\n"
        "train: {batch_size: 16}\n";
    gp_config cfg;
    CHECK_OK(gp_config_parse("t.yaml", yaml, strlen(yaml), NULL, 0, &cfg));
    gp_model_profile_opts mo = {.warmup = 1, .reps = 3, .timed = true, .threads = 1};
    gp_profile p;
    CHECK_OK(gp_model_profile(&cfg, &mo, &p));
    gp_device *dev;
    gp_device_opts dopt = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:0", &dopt, &dev));
    gp_model model;
    CHECK_OK(gp_model_build(&cfg, dev, &model));
    size_t par = 0, gr = 0, op = 0;
    for (int k = 0; k < p.L; k++) {
        par += p.mem[k].param_bytes;
        gr += p.mem[k].grad_bytes;
        op += p.mem[k].optim_bytes;
    }
    CHECK(par == dev->alloc.cur_by[GP_MEM_PARAMS]);
    CHECK(gr == dev->alloc.cur_by[GP_MEM_GRADS]);
    CHECK(op == dev->alloc.cur_by[GP_MEM_OPTIMIZER]);
    CHECK(p.first_trainable == 0);
    {   /* AdamW's two moments: the profile counts (and times) what the model holds */
        gp_config ca = cfg;
        ca.train.optim.kind = GP_OPTIM_ADAMW;
        ca.train.optim.momentum = 0;
        gp_profile pa;
        gp_model ma;
        gp_device *da;
        CHECK_OK(gp_device_open("cpu:1", &dopt, &da));
        CHECK_OK(gp_model_profile(&ca, &mo, &pa));
        CHECK_OK(gp_model_build(&ca, da, &ma));
        size_t opa = 0;
        double upd = 0;
        for (int k = 0; k < pa.L; k++) {
            opa += pa.mem[k].optim_bytes;
            upd += pa.mem[k].update;
        }
        CHECK_MSG(opa == 2 * op && opa == da->alloc.cur_by[GP_MEM_OPTIMIZER] && upd > 0,
                  "AdamW: the profile counts %zu optimizer bytes, the model holds %zu, "
                  "momentum %zu; update %g s", opa, da->alloc.cur_by[GP_MEM_OPTIMIZER], op,
                  upd);
        gp_model_free(&ma);
        gp_device_close(da);
        gp_profile_free(&pa);
    }
    for (int k = 0; k < p.L; k++) CHECK(p.t[k].fwd > 0 && p.t[k].copy > 0);
    /* relu after batch norm and flatten after the pool run in place: their
     * outputs are not counted as kept (relu saves nothing else) */
    for (int k = 0; k < p.L; k++)
        CHECK_MSG(p.mem[k].inplace == (k == 2 || k == 4) && !p.mem[k].unkept,
                  "layer %d: in place %d, unkept %d", k, p.mem[k].inplace, p.mem[k].unkept);
    CHECK(p.mem[2].keep_per_sample == 0 && p.mem[4].keep_per_sample == 0);
    /* the relu after the batch norm is the norm's work (gp_layer_specs_relu_fused) */
    for (int k = 0; k < p.L; k++)
        CHECK_MSG(p.mem[k].fused == (k == 2), "layer %d: fused %d", k, p.mem[k].fused);
    CHECK(p.mem[1].keep_per_sample >= p.mem[1].out_per_sample);
    gp_model_free(&model);
    gp_device_close(dev);

    /* JSON round trip */
    char path[512];
    snprintf(path, sizeof path, "%s/test_balance_profile.json", GPIPE_BINARY_DIR);
    CHECK_OK(gp_profile_save(&p, path));
    gp_profile q;
    CHECK_OK(gp_profile_load(path, &q));
    CHECK(q.L == p.L && q.n_sizes == p.n_sizes && q.sizes[0] == p.sizes[0]);
    CHECK_MSG(q.optim_slots == p.optim_slots && p.optim_slots >= 0, "optim_slots %d, saved %d",
              p.optim_slots, q.optim_slots);
    bool same = true;
    for (int k = 0; k < p.L; k++) {
        same = same && q.t[k].fwd == p.t[k].fwd && q.t[k].copy == p.t[k].copy &&
               q.mem[k].param_bytes == p.mem[k].param_bytes &&
               q.mem[k].keep_per_sample == p.mem[k].keep_per_sample &&
               q.mem[k].inplace == p.mem[k].inplace && q.mem[k].unkept == p.mem[k].unkept &&
               q.mem[k].fused == p.mem[k].fused &&
               !strcmp(q.mem[k].desc, p.mem[k].desc);
    }
    CHECK(same);
    /* which model: the input, per layer the spec text, and their hash */
    CHECK(q.input[0] == 1 && q.input[1] == 12 && q.input[2] == 12);
    CHECK(q.model_hash == p.model_hash && p.model_hash == gp_profile_model_hash(
              cfg.model.layers, cfg.model.n_layers, cfg.model.input));
    CHECK_MSG(!strcmp(q.mem[0].spec, "conv2d {out: 8, kernel: 3, stride: 1, padding: 1, bias: "
                                     "true}") && !strcmp(q.mem[3].spec, "maxpool2d {kernel: 2, "
                                     "stride: 2, padding: 0}"), "%s / %s", q.mem[0].spec,
              q.mem[3].spec);
    test_profile_identity(&cfg, &q, path);
    gp_profile_free(&q);
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"gpipe-profile\", \"version\": 2, \"input\": [1, 2, 2], "
          "\"model_hash\": \"0123456789abcdef\", \"threads\": 1}", f);
    fclose(f);
    CHECK_ERR(gp_profile_load(path, &q), GP_ERR_DATA, "\"batch\" is missing");
    f = fopen(path, "w");
    fputs("{\"format\": \"gpipe-profile\", \"version\": [1,", f);
    fclose(f);
    CHECK_ERR(gp_profile_load(path, &q), GP_ERR_DATA,
              "not valid JSON: line 1, column 43: unexpected end of input");
    f = fopen(path, "w");
    fputs("{\"format\": \"gpipe-profile\", \"version\": 2, \"input\": [1, 2, 2], "
          "\"model_hash\": \"0123456789abcdef\", \"threads\": 1, \"batch\": 8,\n"
          " \"chunks\": 1, \"first_trainable\": 0, \"timed\": true, \"warmup\": 1, \"reps\": 1,\n"
          " \"sizes\": [8], \"loss\": [\"x\"], \"upload\": [0], \"layers\": []}", f);
    fclose(f);
    CHECK_ERR(gp_profile_load(path, &q), GP_ERR_DATA, "\"loss\"[0] is not a number");
    remove(path);

    /* interpolation between measured sizes */
    gp_profile two = p;
    gp_layer_times t2[12];
    two.n_sizes = 2;
    two.sizes[0] = 8;
    two.sizes[1] = 16;
    gp_layer_times both[12];
    memcpy(both, p.t, (size_t)p.L * sizeof *both);
    for (int k = 0; k < p.L; k++) {
        both[p.L + k] = p.t[k];
        both[k].fwd = p.t[k].fwd / 2;
    }
    two.t = both;
    gp_profile_times_at(&two, 12, t2, NULL, NULL);
    CHECK_NEAR(t2[0].fwd, 0.75 * p.t[0].fwd, 1e-12, 1e-9);
    /* off the middle: 10 is 3/4 size 8's and 1/4 size 16's */
    gp_profile_times_at(&two, 10, t2, NULL, NULL);
    CHECK_NEAR(t2[0].fwd, 0.75 * 0.5 * p.t[0].fwd + 0.25 * p.t[0].fwd, 1e-12, 1e-9);
    gp_profile_free(&p);
    gp_config_free(&cfg);
}

/* ---- simulator against GPipe's formula --------------------------------------- */

/* A profile written by hand: n layers, one per stage, each taking F to
 * forward and B to backward a micro-batch of size S, U to update, copies,
 * loss and upload free.  GPipe's step is then (m + n - 1) clocks of F plus
 * as many of B, every stage busy m (F + B) + U of it, so the bubble is
 * (n - 1)(F + B) / step (the paper's (n - 1) / (m + n - 1) when U = 0),
 * lockstep or not.  Exact in doubles: the times are small integers. */
/* A hand-written profile of n one-layer stages over mem, t (filled by the
 * caller), m micro-batches of S samples each, one stage per layer. */
static gp_profile unit_profile(int n, int m, int S, gp_layer_mem *mem, gp_layer_times *t,
                               int *bal)
{
    gp_profile p;
    memset(&p, 0, sizeof p);
    p.L = n;
    p.batch = (int64_t)m * S;
    p.chunks = m;
    p.timed = true;
    p.n_sizes = 1;
    p.sizes[0] = S;
    p.mem = mem;
    p.t = t;
    for (int j = 0; j < n; j++) bal[j] = 1;
    return p;
}

/* Stage 0's backward under the V schedules runs whole (its weights half
 * next on the list, no input gradient to send: gp_instr_whole_backward), so
 * the simulated step cannot depend on how that stage's time splits between
 * backward-data and backward-weights, lockstep or not.  Until 2026-11-30
 * the simulator timed the halves apart, and under lockstep a whole
 * backward's clock waited for only its data half: zb-v on
 * bench/mlp-v.yaml simulated at 8.2% bubble where it ran at 18.1%. */
static void test_simulator_whole_backward(void)
{
    enum { L = 5, S = 4 };
    bool ok = true;
    for (int m = 1; m <= 9; m += 2)
        for (int ls = 0; ls < 2; ls++) {
            double step[2];
            for (int q = 0; q < 2; q++) {
                gp_layer_mem mem[L];
                gp_layer_times t[L];
                memset(mem, 0, sizeof mem);
                memset(t, 0, sizeof t);
                for (int k = 0; k < L; k++) {
                    t[k].fwd = 1 + k % 3;
                    t[k].bwd_data = k ? 2 : 0; /* the first layer's has no use */
                    t[k].bwd_weights = 1.5;
                }
                /* stage 0's second layer: 2 + 3 or 5 + 0, the same whole */
                t[1].bwd_data = q ? 5 : 2;
                t[1].bwd_weights = q ? 0 : 3;
                int bal[L];
                gp_profile p = unit_profile(L, m, S, mem, t, bal);
                bal[0] = 2; /* [2, 1, 1, 1]: stages 0 and 3 on device 0 */
                gp_sim_result r;
                if (gp_simulate_schedule(&p, GP_SCHEDULE_ZB_V, 2, 2, bal, m, GP_CKPT_NEVER,
                                         ls == 1, NULL, &r) != GP_OK) {
                    CHECK_MSG(0, "simulate zb-v m=%d: %s", m, gp_last_error());
                    return;
                }
                step[q] = r.step;
            }
            if (step[0] != step[1]) {
                fprintf(stderr, "  zb-v m=%d %s: step %.3f with stage 0's backward split 2 + "
                        "3, %.3f split 5 + 0\n", m, ls ? "lockstep" : "free-running", step[0],
                        step[1]);
                ok = false;
            }
        }
    CHECK_MSG(ok, "stage 0's whole backward: its split does not change the simulated step");
}

/* The simulator keeps the last schedule it built (the balancer and the
 * planner simulate one schedule under hundreds of splits): every result is
 * the one a fresh simulation gives, whatever was simulated between, and a
 * simulation on another thread (its own cache, freed at its exit) too. */
typedef struct {
    const gp_profile *p;
    const int *bal;
    gp_sim_result r;
    gp_status s;
} sim_arg;

static void *sim_thread(void *a)
{
    sim_arg *x = a;
    x->s = gp_simulate_schedule(x->p, GP_SCHEDULE_ZB_V, 2, 2, x->bal, 6, GP_CKPT_NEVER, false,
                                NULL, &x->r);
    return NULL;
}

static void test_simulator_cache(void)
{
    enum { L = 6, S = 4 };
    gp_layer_mem mem[L];
    gp_layer_times t[L];
    memset(mem, 0, sizeof mem);
    memset(t, 0, sizeof t);
    for (int k = 0; k < L; k++) {
        t[k].fwd = 1 + k % 3;
        t[k].bwd_data = 2 + k % 2;
        t[k].bwd_weights = 1.5;
        mem[k].keep_per_sample = 100 + 10 * k;
        mem[k].out_per_sample = 50;
        mem[k].in_per_sample = 50;
        mem[k].param_bytes = 10;
    }
    int bal[L];
    gp_profile p = unit_profile(L, 6, S, mem, t, bal);
    int v[4] = {2, 1, 1, 2}, one[2] = {3, 3}, loop[4] = {1, 2, 2, 1};
    int six[6] = {1, 1, 1, 1, 1, 1}, three[3] = {2, 2, 2};
    const int *const splits[5] = {v, one, loop, six, three};
    static const struct {
        gp_schedule_kind k;
        int n, v, m;
        gp_checkpoint_mode ck;
        int which;
    } runs[] = {{GP_SCHEDULE_ZB_V, 2, 2, 6, GP_CKPT_NEVER, 0},
                {GP_SCHEDULE_ZB_V, 2, 2, 6, GP_CKPT_ALWAYS, 0},       /* checkpointing */
                {GP_SCHEDULE_ZB_V, 2, 2, 4, GP_CKPT_ALWAYS, 0},       /* m */
                {GP_SCHEDULE_INTERLEAVED, 2, 2, 4, GP_CKPT_ALWAYS, 2}, /* kind */
                {GP_SCHEDULE_INTERLEAVED, 2, 3, 4, GP_CKPT_ALWAYS, 3}, /* v */
                {GP_SCHEDULE_1F1B, 2, 1, 4, GP_CKPT_ALWAYS, 1},       /* kind and v */
                {GP_SCHEDULE_1F1B, 3, 1, 4, GP_CKPT_ALWAYS, 4},       /* n */
                {GP_SCHEDULE_ZB_V, 2, 2, 6, GP_CKPT_NEVER, 0}};
    /* each run's reference: built fresh (another schedule simulated just
     * before, so nothing of it is kept); then the runs back to back, each
     * after one that differs in one of the keys (kind, m, checkpointing):
     * a key the cache forgot gives the run before's schedule */
    gp_sim_result ref[8], r, first = {0};
    int flush[2] = {3, 3};
    for (int pass = 0; pass < 2; pass++)
        for (size_t q = 0; q < sizeof runs / sizeof runs[0]; q++) {
            const int *b = splits[runs[q].which];
            p.chunks = runs[q].m;
            p.batch = (int64_t)runs[q].m * S;
            if (pass == 0) { /* a schedule no run has */
                CHECK_OK(gp_simulate_schedule(&p, GP_SCHEDULE_GPIPE, 2, 1, flush, 1,
                                              GP_CKPT_EXCEPT_LAST, true, NULL, &r));
            }
            CHECK_OK(gp_simulate_schedule(&p, runs[q].k, runs[q].n, runs[q].v, b, runs[q].m,
                                          runs[q].ck, false, NULL, &r));
            if (pass == 0) {
                ref[q] = r;
                continue;
            }
            CHECK_MSG(r.step == ref[q].step && r.bubble == ref[q].bubble &&
                          r.peak_bytes[0] == ref[q].peak_bytes[0] &&
                          r.peak_bytes[1] == ref[q].peak_bytes[1],
                      "run %zu after run %zu: step %.17g, fresh %.17g; peak %.17g, fresh %.17g",
                      q, q - 1, r.step, ref[q].step, r.peak_bytes[0], ref[q].peak_bytes[0]);
            if (q == 0) first = r;
        }
    /* the keys' runs differ among themselves (else the check above is none) */
    for (int q = 1; q < 7; q++)
        CHECK_MSG(ref[q].step != ref[q - 1].step ||
                      ref[q].peak_bytes[0] != ref[q - 1].peak_bytes[0],
                  "runs %d and %d simulate alike: the cache's key %d is not checked", q - 1, q,
                  q);
    p.chunks = 6;
    p.batch = 6 * S;
    /* its split changed: another step (the schedule kept, the times not) */
    int v2[4] = {1, 2, 2, 1};
    gp_sim_result o;
    CHECK_OK(gp_simulate_schedule(&p, GP_SCHEDULE_ZB_V, 2, 2, v2, 6, GP_CKPT_NEVER, false, NULL,
                                  &o));
    CHECK(o.step != first.step || o.peak_bytes[0] != first.peak_bytes[0]);
    /* on another thread: the same */
    sim_arg x = {.p = &p, .bal = v};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, sim_thread, &x) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(x.s == GP_OK && x.r.step == first.step && x.r.peak_bytes[0] == first.peak_bytes[0]);
}

static void test_simulator_formula(void)
{
    enum { S = 4 };
    const double F = 1, B = 2, U = 3;
    gp_layer_mem mem[8];
    gp_layer_times t[8];
    bool ok = true;
    for (int n = 1; n <= 8; n++)
        for (int m = 1; m <= 16; m++)
            for (int ls = 0; ls < 2; ls++)
                for (int u = 0; u < 2; u++) {
                    memset(mem, 0, sizeof mem);
                    memset(t, 0, sizeof t);
                    for (int k = 0; k < n; k++) {
                        t[k].fwd = F;
                        t[k].bwd_weights = B; /* bwd_data 0: stage 0 runs the same */
                        mem[k].update = u ? U : 0;
                    }
                    int bal[8];
                    gp_profile p = unit_profile(n, m, S, mem, t, bal);
                    gp_sim_result r;
                    if (gp_simulate(&p, n, bal, m, GP_CKPT_NEVER, ls == 1, NULL, &r) != GP_OK) {
                        CHECK_MSG(0, "simulate n=%d m=%d: %s", n, m, gp_last_error());
                        return;
                    }
                    double upd = u ? U : 0, step = (m + n - 1) * (F + B) + upd;
                    double bubble = (n - 1) * (F + B) / step;
                    bool good = fabs(r.step - step) <= 1e-12 * step &&
                                fabs(r.bubble - bubble) <= 1e-12;
                    for (int j = 0; j < n; j++)
                        good = good && fabs(r.busy[j] - (m * (F + B) + upd)) <= 1e-12 * step;
                    if (!good) {
                        fprintf(stderr, "n=%d m=%d lockstep=%d U=%g: step %g (want %g), bubble "
                                "%g (want %g)\n", n, m, ls, upd, r.step, step, r.bubble, bubble);
                        ok = false;
                    }
                }
    CHECK_MSG(ok, "the simulator disagrees with GPipe's step and bubble on uniform stages");
}

/* Selective recompute's time (pipeline.checkpoint.keep): a stage's
 * recompute runs the layers a checkpointed forward does not keep, where a
 * layer in place over a kept one's output is kept with it and the stage's
 * first layer starts a run of its own (gp_ckpt_kept). */
static void test_keep_recompute_time(void)
{
    gp_layer_mem mem[5];
    gp_layer_times t[5];
    memset(mem, 0, sizeof mem);
    memset(t, 0, sizeof t);
    for (int k = 0; k < 5; k++) t[k].recompute = t[k].fwd = (double)(1 << k); /* 1 .. 16 */
    mem[2].inplace = mem[4].inplace = true; /* runs {0}, {1, 2}, {3, 4} */
    int bal[5];
    gp_profile p = unit_profile(5, 1, 1, mem, t, bal);
    static const struct {
        int keep[5], first, count;
        double R;
    } cases[] = {
        {{0, 0, 0, 0, 0}, 0, 5, 31}, /* nothing kept: the whole forward */
        {{0, 0, 1, 0, 0}, 0, 5, 25}, /* 2 keeps 1 with it */
        {{0, 1, 0, 0, 0}, 0, 5, 25},
        {{1, 0, 0, 0, 1}, 0, 5, 6},  /* 0 alone; 4 keeps 3 */
        {{0, 0, 1, 0, 0}, 2, 3, 24}, /* 2 first in its stage: its own run */
        {{1, 1, 1, 1, 1}, 0, 5, 0},
    };
    for (size_t q = 0; q < sizeof cases / sizeof *cases; q++) {
        for (int k = 0; k < 5; k++) mem[k].ckpt_keep = cases[q].keep[k];
        /* (stage 0 of 3 when it starts at layer 0: no copy in from layer -1) */
        int j = cases[q].first > 0;
        gp_stage_times st = gp_stage_times_of(&p, t, 0, 0, j, 3, cases[q].first, cases[q].count);
        CHECK_MSG(st.R == cases[q].R && st.F == (double)(((1 << cases[q].count) - 1)
                                                         << cases[q].first),
                  "case %zu: recompute %g (want %g), forward %g", q, st.R, cases[q].R, st.F);
    }
}

/* Every schedule on unit stages: one layer per stage whose forward,
 * backward-data and backward-weights each take 1 (so a whole backward 2),
 * copies and update free.  Free-running, 1F1B's step is then GPipe's,
 * (m + n - 1) x 3 (the same bubble), and ZB-H1's the makespan of its list
 * order with unit halves, which is its clock count (schedule.h), faster
 * than 1F1B once n > 1 and m > 1. */
static void test_simulator_schedules(void)
{
    enum { S = 4 };
    gp_layer_mem mem[8];
    gp_layer_times t[8];
    bool ok = true;
    for (int n = 1; n <= 8; n++)
        for (int m = 1; m <= 16; m++)
            for (int ls = 0; ls < 2; ls++) {
                memset(mem, 0, sizeof mem);
                memset(t, 0, sizeof t);
                for (int k = 0; k < n; k++) {
                    t[k].fwd = 1;
                    t[k].bwd_data = 1;
                    t[k].bwd_weights = 1;
                    t[k].bwd_alone = 1; /* stage 0 has no dx to compute */
                }
                int bal[8];
                gp_profile p = unit_profile(n, m, S, mem, t, bal);
                p.first_trainable = -1; /* every layer runs both halves */
                gp_sim_result r[GP_SCHEDULE_KINDS];
                for (int k = 0; k <= GP_SCHEDULE_ZB_H1; k++)
                    if (gp_simulate_schedule(&p, (gp_schedule_kind)k, n, 1, bal, m, GP_CKPT_NEVER,
                                             ls == 1, NULL, &r[k]) != GP_OK) {
                        CHECK_MSG(0, "simulate n=%d m=%d: %s", n, m, gp_last_error());
                        return;
                    }
                gp_schedule_opts so = {.kind = GP_SCHEDULE_ZB_H1, .n = n, .m = m,
                                       .checkpoint = GP_CKPT_NEVER, .replicas = 1};
                gp_schedule zs;
                CHECK_OK(gp_schedule_make(&so, &zs));
                /* Lockstep holds every copy of clock k until all of the
                 * clocks before k are computed: free for GPipe's phases,
                 * a cost for the others when a backward outlasts a
                 * forward (measured: bench_schedules), so only >= then. */
                double want = 3.0 * (m + n - 1);
                bool exact = ls == 0;
                bool good = r[GP_SCHEDULE_GPIPE].step == want &&
                            (exact ? r[GP_SCHEDULE_1F1B].step == want
                                   : r[GP_SCHEDULE_1F1B].step >= want) &&
                            (exact ? r[GP_SCHEDULE_ZB_H1].step == zs.clocks
                                   : r[GP_SCHEDULE_ZB_H1].step >= zs.clocks) &&
                            (!exact || r[GP_SCHEDULE_ZB_H1].step <= want) &&
                            (!exact || n == 1 || m == 1 || r[GP_SCHEDULE_ZB_H1].step < want);
                gp_schedule_free(&zs);
                if (!good) {
                    fprintf(stderr, "n=%d m=%d lockstep=%d: gpipe %g, 1f1b %g, zb-h1 %g (want %g, "
                            "%g, <= that)\n", n, m, ls, r[0].step, r[1].step, r[2].step, want,
                            want);
                    ok = false;
                }
            }
    CHECK_MSG(ok, "the simulator's schedules disagree with their unit-time steps");
}

/* The interleaved plan (gp_balance_plan with virtual_stages 2): on layer
 * costs shaped like bench/convnet.yaml's profile (three heavy convolutions
 * per half, light layers between), the min-max split of the 4 stages'
 * costs leaves one device with far more work than the other; the refined
 * plan must simulate a shorter step than that split, even the devices'
 * busy times out better, and keep every stage within its capacity (a
 * capacity that the refinement's best move would break keeps it). */
static void test_plan_interleaved(void)
{
    static const double c[] = {0.9, 1.2, 0.8, 19, 1.2, 0.8, 1.2, 8.5, 0.5, 0.4, 17, 0.5,
                               0.4, 0.6, 8.7, 0.3, 0.2, 18.5, 0.3, 0.2, 0.3, 0.03, 0.05};
    enum { L = sizeof c / sizeof c[0], M = 8 };
    gp_layer_mem mem[L];
    gp_layer_times t[L];
    memset(mem, 0, sizeof mem);
    memset(t, 0, sizeof t);
    for (int k = 0; k < L; k++) {
        t[k].fwd = t[k].bwd_data = t[k].bwd_weights = c[k] / 3;
        t[k].bwd_alone = 2 * c[k] / 3;
        mem[k].keep_per_sample = 1000; /* per sample: a capacity can bind */
        mem[k].param_bytes = 4096;
    }
    int unused[L];
    gp_profile p = unit_profile(L, M, 16, mem, t, unused);
    p.first_trainable = -1;
    gp_plan_opts po = {.schedule = GP_SCHEDULE_1F1B, .n = 4, .m = M,
                       .checkpoint = GP_CKPT_NEVER, .by = GP_BALANCE_BY_TIME,
                       .virtual_stages = 1, .lockstep = false};
    int dp[4], ref[4];
    CHECK_OK(gp_balance_plan(&p, &po, dp)); /* virtual_stages 1: the min-max split */
    po.virtual_stages = 2;
    CHECK_OK(gp_balance_plan(&p, &po, ref));
    gp_sim_result a, b;
    CHECK_OK(gp_simulate_schedule(&p, GP_SCHEDULE_INTERLEAVED, 2, 2, dp, M, GP_CKPT_NEVER, false,
                                  NULL, &a));
    CHECK_OK(gp_simulate_schedule(&p, GP_SCHEDULE_INTERLEAVED, 2, 2, ref, M, GP_CKPT_NEVER,
                                  false, NULL, &b));
    int sum = 0;
    for (int j = 0; j < 4; j++) sum += ref[j] >= 1 ? ref[j] : -1000;
    CHECK_MSG(sum == L, "refined balance [%d, %d, %d, %d] is not a split of %d layers", ref[0],
              ref[1], ref[2], ref[3], L);
    CHECK_MSG(b.step < 0.97 * a.step,
              "interleaved: min-max split [%d, %d, %d, %d] simulates %.2f, refined [%d, %d, %d, "
              "%d] %.2f (want 3%% shorter)", dp[0], dp[1], dp[2], dp[3], a.step, ref[0], ref[1],
              ref[2], ref[3], b.step);
    CHECK_MSG(fabs(b.busy[0] - b.busy[1]) < fabs(a.busy[0] - a.busy[1]),
              "interleaved: device busy %.2f / %.2f refined against %.2f / %.2f", b.busy[0],
              b.busy[1], a.busy[0], a.busy[1]);
    /* a capacity on stage 0 just above the min-max split's need: the
     * refinement may not grow stage 0 past it */
    gp_plan_opts pc = po;
    pc.virtual_stages = 1;
    double cost[4], peak[4];
    gp_balance_stage_costs(&p, &pc, dp, cost, peak);
    pc = po;
    pc.capacity[0] = peak[0] * 1.0001;
    int capd[4];
    CHECK_OK(gp_balance_plan(&p, &pc, capd));
    double cost2[4], peak2[4];
    gp_balance_stage_costs(&p, &pc, capd, cost2, peak2);
    CHECK_MSG(peak2[0] <= pc.capacity[0], "interleaved with a capacity: stage 0 needs %.0f of %.0f",
              peak2[0], pc.capacity[0]);
    gp_sim_result bc;
    CHECK_OK(gp_simulate_schedule(&p, GP_SCHEDULE_INTERLEAVED, 2, 2, capd, M, GP_CKPT_NEVER,
                                  false, NULL, &bc));
    CHECK_MSG(bc.step < a.step, "interleaved with a capacity: refined [%d, %d, %d, %d] simulates "
              "%.2f, no better than the min-max split's %.2f", capd[0], capd[1], capd[2], capd[3],
              bc.step, a.step);
    /* Every stage capped alike, as gp_model_plan_opts caps them (a device's
     * memory, 1/v to each of its stages), at what the min-max split's
     * largest stage needs: the refined split's devices, as the interleaved
     * simulation adds their stages up, stay within the sum of their
     * stages' capacities (or what the min-max split needed there, if
     * more); so for except_last, where that sum can exceed the stages' own
     * peaks most, and under lockstep, where the refined split must not
     * step slower. */
    for (int q = 0; q < 3; q++) {
        gp_plan_opts pd = po, p1;
        pd.checkpoint = q == 0 ? GP_CKPT_NEVER : GP_CKPT_EXCEPT_LAST;
        pd.lockstep = q == 2;
        p1 = pd;
        p1.virtual_stages = 1;
        double sc[4], sp[4], most = 0;
        gp_balance_stage_costs(&p, &p1, dp, sc, sp);
        for (int j = 0; j < 4; j++) most = fmax(most, sp[j] * 1.0001);
        for (int j = 0; j < 4; j++) pd.capacity[j] = p1.capacity[j] = most;
        int d0[4], cb[4];
        CHECK_OK(gp_balance_plan(&p, &p1, d0)); /* the min-max split under the capacities */
        CHECK_OK(gp_balance_plan(&p, &pd, cb));
        gp_sim_result s0, s1;
        CHECK_OK(gp_simulate_schedule(&p, GP_SCHEDULE_INTERLEAVED, 2, 2, d0, M, pd.checkpoint,
                                      pd.lockstep, NULL, &s0));
        CHECK_OK(gp_simulate_schedule(&p, GP_SCHEDULE_INTERLEAVED, 2, 2, cb, M, pd.checkpoint,
                                      pd.lockstep, NULL, &s1));
        for (int d = 0; d < 2; d++)
            CHECK_MSG(s1.peak_bytes[d] <= 2 * most || s1.peak_bytes[d] <= s0.peak_bytes[d],
                      "%s%s: refined [%d, %d, %d, %d] needs %.0f bytes on device %d of %.0f "
                      "(the min-max split %.0f)", gp_checkpoint_mode_name(pd.checkpoint),
                      pd.lockstep ? ", lockstep" : "", cb[0], cb[1], cb[2], cb[3],
                      s1.peak_bytes[d], d, 2 * most, s0.peak_bytes[d]);
        CHECK_MSG(s1.step <= s0.step, "%s%s: refined [%d, %d, %d, %d] steps %.2f against the "
                  "min-max split's [%d, %d, %d, %d] %.2f", gp_checkpoint_mode_name(pd.checkpoint),
                  pd.lockstep ? ", lockstep" : "", cb[0], cb[1], cb[2], cb[3], s1.step, d0[0],
                  d0[1], d0[2], d0[3], s0.step);
        printf("test_balance: interleaved, %s%s, every stage capped at %.0f: [%d, %d, %d, %d] "
               "-> [%d, %d, %d, %d], step %.2f -> %.2f, device peaks %.0f / %.0f\n",
               gp_checkpoint_mode_name(pd.checkpoint), pd.lockstep ? ", lockstep" : "", most,
               d0[0], d0[1], d0[2], d0[3], cb[0], cb[1], cb[2], cb[3], s0.step, s1.step,
               s1.peak_bytes[0], s1.peak_bytes[1]);
    }
    /* What gp_model_plan_opts hands the planner for an interleaved run */
    const char *yaml = "model:\n  input: [1, 4, 4]\n  layers: [flatten, {linear: {out: 8}}, relu,"
                       " {linear: {out: 8}}, relu, {linear: {out: 4}}]\n"
                       "pipeline: {devices: [cpu:0, cpu:1], memory: 1MiB, schedule: interleaved,"
                       " virtual: 2, chunks: 4, lockstep: false}\n"
                       "data: {dataset: synthetic}\ntrain: {batch_size: 8}\n";
    gp_config cfg;
    if (gp_config_parse("il.yaml", yaml, strlen(yaml), NULL, 0, &cfg) != GP_OK) {
        CHECK_MSG(0, "interleaved config: %s", gp_last_error());
        return;
    }
    gp_plan_opts mo;
    gp_model_plan_opts(&cfg, 4, &mo);
    CHECK_MSG(mo.virtual_stages == 2 && !mo.lockstep && mo.schedule == GP_SCHEDULE_1F1B &&
                  mo.capacity[0] == 512.0 * 1024 && mo.capacity[3] == 512.0 * 1024,
              "interleaved plan options: v %d, lockstep %d, capacity %.0f / %.0f",
              mo.virtual_stages, mo.lockstep, mo.capacity[0], mo.capacity[3]);
    gp_config_free(&cfg);
}

/* The interleaved refinement on 1500 random profiles (2-4 devices x 2-3
 * stages, every checkpoint mode, lockstep or not, half with capacities
 * just above the min-max split's stages): the refined split is a split,
 * the same twice, never simulates a longer step than the min-max split in
 * the run's own mode, keeps every stage within its capacity, and a device
 * that the min-max split fits (the interleaved simulation adding its
 * stages up, against the sum of their capacities) still fits.  Before the
 * device check, 4 of about 1500 capacity-bound cases broke the last. */
static void test_plan_interleaved_random(void)
{
    uint64_t x = 88172645463325252ULL;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (double)(x >> 11) / 9007199254740992.0)
    int runs = 0, bad = 0, bound = 0;
    for (int it = 0; it < 1500; it++) {
        int nd = 2 + (int)(RND() * 3), v = 2 + (int)(RND() * 2), S = nd * v;
        int L = S + (int)(RND() * 30), m = nd * (1 + (int)(RND() * 4));
        gp_layer_mem mem[64 + 30];
        gp_layer_times t[64 + 30];
        memset(mem, 0, sizeof mem);
        memset(t, 0, sizeof t);
        for (int k = 0; k < L; k++) {
            double c = RND() < 0.2 ? 5 + RND() * 20 : RND();
            t[k].fwd = t[k].bwd_data = t[k].recompute = c / 3;
            t[k].bwd_weights = c / 3 * RND();
            t[k].bwd_alone = c / 2;
            t[k].copy = RND() * 0.5;
            mem[k].keep_per_sample = RND() * 2000;
            mem[k].param_bytes = (size_t)(RND() * 100000);
            mem[k].in_per_sample = RND() * 800;
            mem[k].out_per_sample = RND() * 800;
            mem[k].update = RND() * 0.1;
        }
        int unused[64 + 30];
        gp_profile p = unit_profile(L, m, 4, mem, t, unused);
        p.first_trainable = (int)(RND() * 3) - 1;
        gp_checkpoint_mode md = (gp_checkpoint_mode)(int)(RND() * 3);
        bool ls = RND() < 0.5, capped = RND() < 0.5;
        gp_plan_opts po = {.schedule = GP_SCHEDULE_1F1B, .n = S, .m = m, .checkpoint = md,
                           .by = GP_BALANCE_BY_TIME, .virtual_stages = 1, .lockstep = ls};
        int dp[64], rf[64], rf2[64];
        if (gp_balance_plan(&p, &po, dp) != GP_OK) {
            gp_error_clear();
            continue;
        }
        double cost[64], pk[64];
        gp_balance_stage_costs(&p, &po, dp, cost, pk);
        double scale = 1 + RND() * 0.3;
        if (capped)
            for (int j = 0; j < S; j++) po.capacity[j] = pk[j] * scale;
        po.virtual_stages = v;
        if (gp_balance_plan(&p, &po, rf) != GP_OK || gp_balance_plan(&p, &po, rf2) != GP_OK) {
            bad++;
            continue;
        }
        runs++;
        bool ok = !memcmp(rf, rf2, (size_t)S * sizeof *rf);
        int sum = 0;
        for (int j = 0; j < S; j++) {
            ok = ok && rf[j] >= 1;
            sum += rf[j];
        }
        ok = ok && sum == L;
        double dc[64] = {0};
        for (int j = 0; j < S; j++) dc[j % nd] += po.capacity[j];
        gp_sim_result a, b;
        ok = ok && gp_simulate_schedule(&p, GP_SCHEDULE_INTERLEAVED, nd, v, dp, m, md, ls,
                                        capped ? dc : NULL, &a) == GP_OK &&
             gp_simulate_schedule(&p, GP_SCHEDULE_INTERLEAVED, nd, v, rf, m, md, ls,
                                  capped ? dc : NULL, &b) == GP_OK;
        ok = ok && b.step <= a.step * (1 + 1e-12) && (!a.fits || b.fits);
        bound += capped && a.fits;
        double c2[64], pk2[64];
        gp_balance_stage_costs(&p, &po, rf, c2, pk2);
        for (int j = 0; capped && j < S; j++) ok = ok && pk2[j] <= po.capacity[j];
        if (!ok && bad < 3) {
            printf("test_balance: interleaved at random, case %d (%d devices x %d, m %d, %s%s): "
                   "refined split wrong\n", it, nd, v, m, gp_checkpoint_mode_name(md),
                   ls ? ", lockstep" : "");
        }
        bad += !ok;
    }
#undef RND
    printf("test_balance: interleaved refinement at random: %d of %d plans wrong (%d bound by "
           "device memory)\n", bad, runs, bound);
    CHECK_MSG(runs > 1000 && bound > 300 && bad == 0, "interleaved at random: %d of %d wrong",
              bad, runs);
}

/* The refinement's memory pass (gp_plan_opts.mem_slack), on random
 * interleaved and zb-v problems whose layers keep and hand on random bytes:
 * against the same plan without it, the split's step is within the slack
 * and, interleaved, never over the min-max split's, with a largest
 * simulated device peak never higher (zb-v's shorter of two candidates may
 * be the other one); and a tenth of the plans at least hold less.  Without the pass (0 hold less) or with a slack of 5% (39
 * steps too long) this fails. */
static double max_peak(const gp_sim_result *r, int nd)
{
    double mx = 0;
    for (int d = 0; d < nd; d++) mx = fmax(mx, r->peak_bytes[d]);
    return mx;
}

static void test_refine_memory(void)
{
    uint64_t x = 2463534242ULL;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (double)(x >> 11) / 9007199254740992.0)
    int runs = 0, bad = 0, less = 0;
    const double slack = GP_REFINE_MEM_SLACK;
    for (int it = 0; it < 300; it++) {
        bool vs = it % 2;
        int nd = 2 + (int)(RND() * 2), v = vs ? 2 : 2 + (int)(RND() * 2), S = nd * v;
        int L = S + 2 + (int)(RND() * 20), m = nd * (1 + (int)(RND() * 3));
        gp_layer_mem mem[64];
        gp_layer_times t[64];
        memset(mem, 0, sizeof mem);
        memset(t, 0, sizeof t);
        for (int k = 0; k < L; k++) { /* products, and cheap layers beside them */
            bool cheap = RND() < 0.5;
            double c = cheap ? 0.01 * RND() : 1 + RND();
            t[k].fwd = t[k].bwd_data = t[k].recompute = c / 3;
            t[k].bwd_weights = cheap ? 0 : c / 3;
            t[k].bwd_alone = c / 2;
            t[k].copy = 0.01 * RND();
            mem[k].in_per_sample = mem[k].out_per_sample = 1000;
            mem[k].keep_per_sample = RND() < 0.5 ? 1000 * RND() : 0;
            mem[k].inplace = cheap && RND() < 0.5;
            mem[k].unkept = !cheap && RND() < 0.5;
            mem[k].end_unread = mem[k].unkept;
            mem[k].param_bytes = cheap ? 0 : 4096;
        }
        int unused[64];
        gp_profile p = unit_profile(L, m, 4, mem, t, unused);
        p.first_trainable = 0;
        gp_schedule_kind kind = vs ? GP_SCHEDULE_ZB_V : GP_SCHEDULE_INTERLEAVED;
        gp_plan_opts po = {.schedule = GP_SCHEDULE_1F1B, .n = S, .m = m,
                           .checkpoint = GP_CKPT_NEVER, .by = GP_BALANCE_BY_TIME,
                           .virtual_stages = 1, .lockstep = false};
        int dp[64], on[64], off[64];
        if (gp_balance_plan(&p, &po, dp) != GP_OK) {
            gp_error_clear();
            continue;
        }
        po.virtual_stages = v;
        po.v_shape = vs;
        po.sim_kind = kind;
        po.mem_slack = -1;
        bool ok = gp_balance_plan(&p, &po, off) == GP_OK;
        po.mem_slack = 0;
        ok = ok && gp_balance_plan(&p, &po, on) == GP_OK;
        gp_sim_result a, b, c;
        ok = ok && gp_simulate_schedule(&p, kind, nd, v, on, m, GP_CKPT_NEVER, false, NULL, &a) ==
                       GP_OK &&
             gp_simulate_schedule(&p, kind, nd, v, off, m, GP_CKPT_NEVER, false, NULL, &b) ==
                 GP_OK;
        if (!vs) /* (a V split of dp's is another split: not compared) */
            ok = ok && gp_simulate_schedule(&p, kind, nd, v, dp, m, GP_CKPT_NEVER, false, NULL,
                                            &c) == GP_OK &&
                 a.step <= c.step * (1 + 1e-12);
        ok = ok && a.step <= b.step * (1 + slack) * (1 + 1e-12);
        if (!vs) ok = ok && max_peak(&a, nd) <= max_peak(&b, nd) * (1 + 1e-12);
        if (!ok && bad < 3)
            printf("test_balance: memory pass, case %d (%s, %d devices x %d, m %d): on [%d, %d, "
                   "..] step %.4f peak %.0f, off [%d, %d, ..] step %.4f peak %.0f\n", it,
                   vs ? "zb-v" : "interleaved", nd, v, m, on[0], on[1], a.step,
                   max_peak(&a, nd), off[0], off[1], b.step, max_peak(&b, nd));
        bad += !ok;
        runs++;
        less += ok && max_peak(&a, nd) < max_peak(&b, nd) * (1 - 1e-9);
    }
#undef RND
    printf("test_balance: memory pass at random: %d of %d plans wrong, %d hold less\n", bad, runs,
           less);
    CHECK_MSG(runs > 250 && bad == 0 && less >= runs / 10,
              "memory pass: %d of %d plans wrong, %d hold less (want a tenth at least)", bad, runs,
              less);
}

/* The recommendation across schedules: the least memory within 5% of the
 * best throughput among the runs that fit, written out by hand. */
static void test_recommend_memory(void)
{
    gp_sim_result r[5];
    memset(r, 0, sizeof r);
    double thr[5] = {100, 97, 96, 80, 120}, peak[5] = {50, 40, 30, 10, 5};
    bool fits[5] = {true, true, true, true, false};
    for (int q = 0; q < 5; q++) {
        r[q].n = 2;
        r[q].throughput = thr[q];
        r[q].peak_bytes[0] = peak[q];
        r[q].peak_bytes[1] = peak[q] / 2;
        r[q].fits = fits[q];
    }
    /* best that fits: 100; within 5%: 100, 97, 96; least memory of those: 30 */
    CHECK(gp_sim_recommend_memory(r, 5) == 2);
    CHECK(gp_sim_peak(&r[2]) == 30);
    r[2].throughput = 94; /* now outside 5% */
    CHECK(gp_sim_recommend_memory(r, 5) == 1);
    for (int q = 0; q < 5; q++) r[q].fits = false;
    CHECK(gp_sim_recommend_memory(r, 5) == -1);
}

/* ---- simulator vs a measured step -------------------------------------------- */

/* One profile + five measured (m, checkpoint) runs.  Everything is checked
 * every attempt except the step times, which a shared machine's drift
 * between the profile and the runs can push out of bounds: those are
 * checked on the last attempt, and an attempt with all of them in bounds
 * ends the test.  Returns whether they were in bounds. */
static bool simulator_attempt(bool last)
{
    bool within = true;
    const char *yaml =
        "model:\n"
        "  input: [1, 28, 28]\n"
        "  layers:\n"
        "    - flatten\n"
        "    - linear: {out: 512}\n"
        "    - relu\n"
        "    - linear: {out: 512}\n"
        "    - relu\n"
        "    - linear: {out: 512}\n"
        "    - relu\n"
        "    - linear: {out: 10}\n"
        "pipeline: {devices: [cpu:0, cpu:1], threads: 1}\n"
        "data: {dataset: synthetic}\n"
        "train: {batch_size: 128}\n";
    gp_config cfg;
    CHECK_OK(gp_config_parse("sim.yaml", yaml, strlen(yaml), NULL, 0, &cfg));
    gp_model_profile_opts mo = {.warmup = 2, .reps = 5, .timed = true, .threads = 1,
                                .n_sizes = 3, .sizes = {128, 32, 16}};
    gp_profile p;
    CHECK_OK(gp_model_profile(&cfg, &mo, &p));
    gp_plan_opts po;
    gp_model_plan_opts(&cfg, 2, &po);
    int bal[2];
    CHECK_OK(gp_balance_plan(&p, &po, bal));
    cfg.pipeline.n_balance = 2;
    cfg.pipeline.balance[0] = bal[0];
    cfg.pipeline.balance[1] = bal[1];
    /* 5 and 6 with copies in bf16: held and in flight at half size; 7 and
     * 8 with activations stored in bf16 (train.activations: every layer
     * output at half size, the input and the FP32 widened while a layer
     * runs as they are) */
    int ms[9] = {1, 4, 8, 4, 4, 8, 4, 8, 4};
    gp_checkpoint_mode modes[9] = {GP_CKPT_EXCEPT_LAST, GP_CKPT_EXCEPT_LAST, GP_CKPT_EXCEPT_LAST,
                                   GP_CKPT_ALWAYS,      GP_CKPT_NEVER,       GP_CKPT_ALWAYS,
                                   GP_CKPT_NEVER,       GP_CKPT_NEVER,       GP_CKPT_ALWAYS};
    for (int q = 0; q < 9; q++) {
        bool bf16 = q == 5 || q == 6, act = q >= 7;
        cfg.pipeline.chunks = ms[q];
        cfg.pipeline.checkpoint = modes[q];
        cfg.pipeline.copy_precision = bf16 ? GP_COPY_BF16 : GP_COPY_FP32;
        cfg.train.activations = act ? GP_ACT_BF16 : GP_ACT_FP32;
        p.bf16_copies = bf16;
        p.act_dtype = act ? GP_BF16 : GP_F32;
        gp_sim_result r;
        CHECK_OK(gp_simulate(&p, 2, bal, ms[q], cfg.pipeline.checkpoint, true, NULL, &r));
        if (bf16 && modes[q] == GP_CKPT_ALWAYS) {
            /* against fp32 copies: device 1 holds its 8 inputs at half
             * size, less the one widened at a time (3 / 8 of them saved) */
            gp_sim_result r1;
            p.bf16_copies = false;
            CHECK_OK(gp_simulate(&p, 2, bal, ms[q], modes[q], true, NULL, &r1));
            p.bf16_copies = true;
            double saved = r1.peak_bytes[1] - r.peak_bytes[1];
            double held = (double)ms[q] * (128.0 / ms[q]) * p.mem[bal[0]].in_per_sample;
            printf("test_balance: bf16 copies: device 1's simulated peak %.0f bytes under fp32 "
                   "copies' (its held inputs: %.0f)\n", saved, held);
            CHECK_MSG(held > 0 && saved >= 0.3 * held, "bf16 copies: device 1's simulated peak "
                      "%.0f bytes under fp32's, of %.0f held", saved, held);
        }
        gp_device *devs[GP_MAX_DEVICES];
        gp_model model;
        CHECK_OK(gp_train_open(&cfg, devs, &model, true));
        int64_t b = 128;
        float *x, *y;
        class_batch(b, 784, &x, &y);
        double t[5];
        for (int it = 0; it < 7; it++) {
            gp_step_stats st;
            if (it == 2)
                for (int j = 0; j < 2; j++) gp_allocator_reset_peak(&devs[j]->alloc);
            CHECK_OK(gp_model_pipeline_step(&model, &cfg, x, y, b, 0.0, &st));
            if (it >= 2) t[it - 2] = st.seconds;
        }
        /* The predicted peak memory of each device against the allocator's
         * peak over five steps. */
        for (int j = 0; j < 2; j++) {
            double got = (double)devs[j]->alloc.peak, want = r.peak_bytes[j];
            printf("test_balance: m = %d, %s%s, device %d: simulated peak %.2f MiB, measured %.2f "
                   "MiB (ratio %.3f)\n", ms[q], gp_checkpoint_mode_name(modes[q]),
                   bf16 ? ", bf16 copies" : act ? ", bf16 activations" : "", j, want / 1048576.0,
                   got / 1048576.0, want / got);
            /* a little conservative is the safe side (fits = really fits).
             * The measured peak counts the copies in flight, which depend
             * on the two threads' timing: a loaded machine can hold more,
             * so like the times this is asserted on the last attempt */
            bool mem_ok = want / got > 0.9 && want / got < 1.3;
            if (last)
                CHECK_MSG(mem_ok, "m = %d %s device %d: simulated peak %.0f vs measured %.0f "
                          "bytes", ms[q], gp_checkpoint_mode_name(modes[q]), j, want, got);
            within = within && mem_ok;
        }
        for (int a = 0; a < 5; a++)
            for (int c = a + 1; c < 5; c++)
                if (t[c] < t[a]) {
                    double tmp = t[a];
                    t[a] = t[c];
                    t[c] = tmp;
                }
        double ratio = r.step / t[2];
        printf("test_balance: m = %d: simulated %.2f ms, measured %.2f ms (ratio %.2f), "
               "bubble %.0f%%\n", ms[q], r.step * 1e3, t[2] * 1e3, ratio, 100 * r.bubble);
        /* Reported, not asserted: a step time measured in a unit test
         * follows the load on the machine (under `ctest -j` beside other
         * work it measured 0.19-0.25 of the simulation); the simulator's
         * step time is held to its 10% in bench_schedules and bench_balance
         * on an idle machine (bench/README.md). */
        (void)ratio;
        CHECK(r.bubble >= 0 && r.bubble < 1 && r.fits);
        free(x);
        free(y);
        gp_model_free(&model);
        for (int j = 0; j < 2; j++) gp_device_close(devs[j]);
    }
    /* the schedule's shape: more micro-batches, smaller bubble */
    gp_sim_result r1, r8;
    CHECK_OK(gp_simulate(&p, 2, bal, 1, GP_CKPT_NEVER, true, NULL, &r1));
    CHECK_OK(gp_simulate(&p, 2, bal, 8, GP_CKPT_NEVER, true, NULL, &r8));
    CHECK(r8.bubble < r1.bubble);
    /* n = 2, m = 1: the stages run one after the other, so half of the
     * compute time is idle whatever the split; the update runs on both
     * devices at once and lowers that, the more the slower memory is
     * against compute (under ThreadSanitizer the profile saw 0.38) */
    CHECK_MSG(r1.bubble > 0.25 && r1.bubble < 0.55, "m = 1 bubble %.3f", r1.bubble);
    /* a capacity below the peak: not recommended */
    double cap[2] = {1, 1};
    gp_sim_result rr[2];
    CHECK_OK(gp_simulate(&p, 2, bal, 1, GP_CKPT_NEVER, true, cap, &rr[0]));
    CHECK_OK(gp_simulate(&p, 2, bal, 8, GP_CKPT_NEVER, true, NULL, &rr[1]));
    CHECK(!rr[0].fits && gp_sim_recommend(rr, 2) == 1);
    gp_profile_free(&p);
    gp_config_free(&cfg);
    return within;
}

static void test_simulator(void)
{
    for (int attempt = 1; attempt <= 3; attempt++) {
        if (simulator_attempt(attempt == 3)) return;
        printf("test_balance: simulated vs measured peak memory out of bounds in attempt %d "
               "(the copies in flight follow the threads' timing); measuring again\n", attempt);
    }
}

/* Two layers of unit times, 1000 bytes of parameters and 300 kept a
 * sample each, of layer spec `spec`; their in/out bytes left to the test. */
static void two_layers(gp_layer_mem mem[2], gp_layer_times t[2], const char *spec)
{
    memset(mem, 0, 2 * sizeof *mem);
    memset(t, 0, 2 * sizeof *t);
    for (int k = 0; k < 2; k++) {
        t[k].fwd = t[k].bwd_data = t[k].bwd_weights = 1;
        mem[k].param_bytes = 1000;
        mem[k].keep_per_sample = 300;
        snprintf(mem[k].spec, sizeof mem[k].spec, "%s", spec);
    }
}

/* bf16 copies in the memory model: on one device nothing is copied, so
 * the peak is FP32's exactly.  On two stages whose last makes large
 * dlogits (which never cross a boundary, so stay FP32: counted packed, the
 * last stage's peak would fall by far more than what crosses), a stage
 * saves at most half of what crosses it for all M micro-batches, adds at
 * most one packed send beside its FP32 tensor, and GPipe's last stage,
 * which holds all M checkpointed inputs at once, saves a quarter of the
 * most at least. */
static void test_bf16_copy_memory(void)
{
    enum { M = 4, S = 2 };
    gp_layer_mem mem[2];
    gp_layer_times t[2];
    two_layers(mem, t, "relu");
    mem[0].in_per_sample = 50;
    mem[0].out_per_sample = mem[1].in_per_sample = 200;
    mem[1].out_per_sample = 5000; /* dlogits */
    int64_t sizes[M] = {S, S, S, S};
    int bad = 0;
    for (int kd = 0; kd <= GP_SCHEDULE_ZB_H1; kd++)
        for (int ck = 0; ck < 3; ck++)
            for (int n = 1; n <= 2; n++) {
                int bal[2];
                gp_profile p = unit_profile(2, M, S, mem, t, bal);
                gp_schedule sched;
                gp_schedule_opts so = {.kind = (gp_schedule_kind)kd, .n = n, .m = M,
                                       .checkpoint = (gp_checkpoint_mode)ck, .replicas = 1,
                                       .update = true, .check = true};
                CHECK_OK(gp_schedule_make(&so, &sched));
                for (int j = 0; j < n; j++) {
                    int first = n == 1 ? 0 : j, count = n == 1 ? 2 : 1;
                    p.bf16_copies = false;
                    double f = gp_stage_peak_bytes(&p, &sched, sizes, j, first, count);
                    p.bf16_copies = true;
                    double b = gp_stage_peak_bytes(&p, &sched, sizes, j, first, count);
                    /* what crosses: stage 1's inputs, stage 0's outputs */
                    double x = j ? mem[1].in_per_sample : mem[0].out_per_sample;
                    double most = n == 1 ? 0 : 0.5 * M * S * x;
                    /* a packed send beside its FP32 tensor, for a moment */
                    double extra = n == 1 ? 0 : 0.5 * S * x;
                    /* GPipe's last stage holds all M inputs at once */
                    bool held = n == 2 && j == 1 && ck != GP_CKPT_NEVER &&
                                kd == GP_SCHEDULE_GPIPE;
                    bool ok = b - f <= extra && f - b <= most && (!held || f - b >= 0.25 * most);
                    if (!ok) bad++;
                    CHECK_MSG(ok, "%s, %s, %d stage%s, stage %d: bf16 copies peak %.0f against "
                              "fp32's %.0f (may save at most %.0f%s, add at most %.0f)",
                              gp_schedule_kind_name((gp_schedule_kind)kd),
                              gp_checkpoint_mode_name((gp_checkpoint_mode)ck), n, n > 1 ? "s" : "",
                              j, b, f, most, held ? ", and a quarter of it at least" : "", extra);
                }
                gp_schedule_free(&sched);
            }
    printf("test_balance: bf16 copies in the memory model: %d of 18 cases wrong\n", bad);
}

/* The model's input stays FP32 where activations are stored in bf16 (the
 * memory model's stored(): layer 0's input, which gpipe uploads as it is):
 * stage 0's peak grows by the same bytes for 200 more bytes a sample of
 * it, in bf16 as in FP32. */
static void test_bf16_input_memory(void)
{
    enum { M = 4, S = 2 };
    gp_layer_mem mem[2];
    gp_layer_times t[2];
    two_layers(mem, t, "linear {out: 4}");
    mem[0].out_per_sample = mem[1].in_per_sample = 200;
    mem[1].out_per_sample = 500;
    gp_schedule sched;
    gp_schedule_opts so = {.kind = GP_SCHEDULE_GPIPE, .n = 2, .m = M,
                           .checkpoint = GP_CKPT_NEVER, .replicas = 1, .update = true,
                           .check = true};
    CHECK_OK(gp_schedule_make(&so, &sched));
    int64_t sizes[M] = {S, S, S, S};
    double grow[2];
    for (int b = 0; b < 2; b++) {
        double pk[2];
        for (int q = 0; q < 2; q++) {
            mem[0].in_per_sample = q ? 300 : 100;
            int bal[2];
            gp_profile p = unit_profile(2, M, S, mem, t, bal);
            p.act_dtype = b ? GP_BF16 : GP_F32;
            pk[q] = gp_stage_peak_bytes(&p, &sched, sizes, 0, 0, 1);
        }
        grow[b] = pk[1] - pk[0];
    }
    gp_schedule_free(&sched);
    CHECK_MSG(grow[0] > 0 && grow[1] == grow[0], "200 more input bytes a sample: stage 0's peak "
              "%.0f more in FP32, %.0f in bf16", grow[0], grow[1]);
}

/* A blocked chain a stage's edge cuts (gp_layer_mem.x_chain, y_chain): on
 * configs/default.yaml's convnet the profile marks the first convolution's
 * output blocked to its pool and the second's input blocked from the
 * first, kept by a saved profile, and a stage that cuts either adds a
 * pass over that tensor (its copy time) to each of the convolution's
 * passes, and nothing where the chain is whole. */
static void test_chain_cuts(void)
{
    const char *yaml =
        "model:\n"
        "  input: [1, 28, 28]\n"
        "  layers:\n"
        "    - conv2d: {out: 32, kernel: 3, padding: 1}\n"
        "    - batchnorm\n"
        "    - relu\n"
        "    - maxpool2d: {kernel: 2}\n"
        "    - conv2d: {out: 64, kernel: 3, padding: 1}\n"
        "    - batchnorm\n"
        "    - relu\n"
        "    - maxpool2d: {kernel: 2}\n"
        "    - flatten\n"
        "    - linear: {out: 256}\n"
        "    - relu\n"
        "    - linear: {out: 10}\n"
        "pipeline: {devices: [cpu:0, cpu:1], threads: 1}\n"
        "data: {dataset: synthetic}\n"
        "train: {batch_size: 16}\n";
    gp_config cfg;
    CHECK_OK(gp_config_parse("chains.yaml", yaml, strlen(yaml), NULL, 0, &cfg));
    gp_model_profile_opts mo = {.timed = false, .threads = 1};
    gp_profile p;
    CHECK_OK(gp_model_profile(&cfg, &mo, &p));
    /* whether this processor's CPU device keeps the chain blocked */
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_conv_desc c2 = {1, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 14, 14, 1, 0, 0};
    bool blocks = gp_dev_act_block(dev, &c2, false) && gp_dev_act_block(dev, &c2, true);
    gp_device_close(dev);
    char path[] = "/tmp/gpipe_chains_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(gp_profile_save(&p, path));
    gp_profile q;
    CHECK_OK(gp_profile_load(path, &q));
    unlink(path);
    for (int r = 0; r < 2; r++) {
        const gp_profile *pr = r ? &q : &p;
        for (int k = 0; k < pr->L; k++) {
            const gp_layer_mem *m = &pr->mem[k];
            bool x = blocks && k == 4, y = blocks && (k == 0 || k == 4);
            CHECK_MSG(m->x_chain == x && m->y_chain == y, "%s layer %d: chain ends x %d y %d, "
                      "want %d %d (blocks %d)", r ? "loaded" : "profiled", k, m->x_chain,
                      m->y_chain, x, y, blocks);
            if (m->x_chain) CHECK(m->x_from == 0);
            if (m->y_chain) CHECK_MSG(m->y_to == (k == 0 ? 3 : 7), "layer %d: y_to %d", k, m->y_to);
        }
    }
    gp_profile_free(&q);
    printf("test_balance: chain ends %s on this processor's CPU device\n",
           blocks ? "marked (blocked layouts)" : "absent (plain layouts)");
    /* the stage times, on made-up layer times: a copy of 100 (k + 1) */
    p.mem[0].y_chain = p.mem[4].x_chain = p.mem[4].y_chain = true;
    p.mem[0].y_to = 3, p.mem[4].x_from = 0, p.mem[4].y_to = 7;
    gp_layer_times lt[12];
    for (int k = 0; k < 12; k++) lt[k] = (gp_layer_times){1, 2, 4, 0, 8, 100.0 * (k + 1)};
    struct { int j, n, first, count; double cut; } cases[] = {
        {1, 3, 4, 1, 400 + 500}, /* the second convolution alone: both sides */
        {0, 2, 0, 4, 0},         /* up to the first pool: the chain ends there */
        {0, 2, 0, 3, 100},       /* before the pool: the first's output */
        {1, 2, 1, 4, 400 + 500}, /* from the norm: no start, and no pool */
        {1, 2, 3, 5, 400},       /* from the pool to the second pool */
        {0, 2, 0, 8, 0},         /* both chains whole */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gp_stage_times whole = {0}, got = gp_stage_times_of(&p, lt, 0, 0, cases[c].j, cases[c].n,
                                                            cases[c].first, cases[c].count);
        for (int k = 0; k < 12; k++) p.mem[k].x_chain = p.mem[k].y_chain = false;
        whole = gp_stage_times_of(&p, lt, 0, 0, cases[c].j, cases[c].n, cases[c].first,
                                  cases[c].count);
        p.mem[0].y_chain = p.mem[4].x_chain = p.mem[4].y_chain = true;
        double conv = cases[c].cut;
        CHECK_MSG(got.F == whole.F + conv && got.R == whole.R + conv &&
                  got.W == whole.W + conv && got.Bd == whole.Bd + (cases[c].j ? conv : 0),
                  "stage %d of layers %d..%d: F %g R %g Bd %g W %g over the unchained %g %g %g "
                  "%g, want %g more each", cases[c].j, cases[c].first,
                  cases[c].first + cases[c].count - 1, got.F, got.R, got.Bd, got.W, whole.F,
                  whole.R, whole.Bd, whole.W, conv);
    }
    gp_profile_free(&p);
    gp_config_free(&cfg);
}

/* Every stage j of n (1..4), first layer and length of p: gp_stage_sums_times
 * the bits of gp_stage_times_of; false (reported) at the first that is not. */
static bool sums_match(const gp_profile *p, const gp_layer_times *lt, gp_stage_sums *s, int trial,
                       int *checked)
{
    double loss = urand(), upload = urand();
    for (int n = 1; n <= 4; n++)
        for (int j = 0; j < n; j++)
            for (int first = j ? 1 : 0; first < (j ? p->L : 1); first++) /* stage 0 begins at 0 */
                for (int count = 1; first + count <= p->L; count++) {
                    gp_stage_times a = gp_stage_times_of(p, lt, loss, upload, j, n, first, count);
                    gp_stage_times b = gp_stage_sums_times(s, loss, upload, j, n, first, count);
                    ++*checked;
                    CHECK_MSG(!memcmp(&a, &b, sizeof a),
                              "trial %d: stage %d of %d, layers %d..%d: sums F %.17g R %.17g Bd "
                              "%.17g W %.17g up %.17g act %.17g grad %.17g, plain %.17g %.17g "
                              "%.17g %.17g %.17g %.17g %.17g", trial, j, n, first,
                              first + count - 1, b.F, b.R, b.Bd, b.W, b.update, b.copy_act,
                              b.copy_grad, a.F, a.R, a.Bd, a.W, a.update, a.copy_act, a.copy_grad);
                    if (memcmp(&a, &b, sizeof a)) return false;
                }
    return true;
}

/* The planner's stage sums (gp_stage_sums) against gp_stage_times_of, every
 * field's bits, for every stage j of n, first layer and length, on random
 * profiles with everything a stage's edges change: runs of in-place layers
 * with kept types among them, fused relus, blocked chains cut at either
 * end (short, as profiled, and long, as a loaded profile may say), skips
 * short and long, and a first trainable layer past 0.  Layer times are
 * random doubles, so a sum taken in another order differs in its last
 * bits: W taken as a difference of sums from layer 0 failed at the 37th. */
static void test_stage_sums(void)
{
    int checked = 0;
    for (int trial = 0; trial < 60; trial++) {
        int L = 2 + (int)(urand() * 40);
        gp_profile p = {0};
        p.L = L;
        p.timed = true;
        p.first_trainable = (int)(urand() * 3) % L;
        p.mem = calloc((size_t)L, sizeof *p.mem);
        gp_layer_times *lt = calloc((size_t)L, sizeof *lt);
        int nsk = (int)(urand() * 6);
        p.skips = calloc((size_t)nsk + 1, sizeof *p.skips);
        CHECK(p.mem && lt && p.skips);
        for (int k = 0; k < L; k++) {
            gp_layer_mem *m = &p.mem[k];
            m->inplace = urand() < (trial % 3 == 0 ? 0.8 : 0.35);
            m->ckpt_keep = urand() < 0.25;
            m->fused = k > 0 && urand() < 0.15;
            m->update = urand() * 1e-3;
            if (k > 0 && urand() < 0.25) {
                m->x_chain = true;
                m->x_from = (int)(urand() * k); /* 0 .. k - 1 */
            }
            if (k < L - 1 && urand() < 0.25) {
                m->y_chain = true;
                m->y_to = k + 1 + (int)(urand() * (L - 1 - k)); /* k + 1 .. L - 1 */
            }
            lt[k] = (gp_layer_times){urand(), urand(), urand(), urand() < 0.5 ? urand() : 0,
                                     urand(), urand() * 0.1};
        }
        for (int t = 0; t < nsk; t++) { /* ordered by from, as a profile's */
            int a = (int)(urand() * (L - 1)), b = a + 1 + (int)(urand() * (L - 1 - a));
            p.skips[t] = (gp_profile_skip){a, b};
        }
        for (int t = 1; t < nsk; t++)
            for (int u = t; u > 0 && p.skips[u].from < p.skips[u - 1].from; u--) {
                gp_profile_skip x = p.skips[u];
                p.skips[u] = p.skips[u - 1];
                p.skips[u - 1] = x;
            }
        p.n_skips = nsk;
        gp_stage_sums *s = gp_stage_sums_new(&p, lt);
        CHECK(s != NULL);
        if (!s) break;
        bool same = sums_match(&p, lt, s, trial, &checked);
        gp_stage_sums_free(s);
        free(lt);
        free(p.mem);
        free(p.skips);
        if (!same) break; /* one report */
    }
    printf("test_balance: stage sums = the plain sums, bit for bit, on %d stages\n", checked);
}

/* Skips in the cost model: on four one-layer stages (layer k's output copy
 * takes 10 (k + 1), holds 100 (k + 1) bytes per sample), a skip from layer 0
 * to layer 3 adds its copy to stage 3's receive and its gradient's to stage
 * 0's, nothing to stages 1 and 2 (it is not routed through them), and
 * raises the peak bytes of stages 0 and 3 only; a profile keeps its skips
 * through JSON, and they change its model hash. */
static void test_skip_costs(void)
{
    enum { N = 4, M = 4, S = 2 };
    gp_layer_mem mem[N];
    gp_layer_times t[N];
    memset(mem, 0, sizeof mem);
    memset(t, 0, sizeof t);
    for (int k = 0; k < N; k++) {
        t[k].fwd = 1;
        t[k].bwd_data = t[k].bwd_weights = 1;
        t[k].copy = 10.0 * (k + 1);
        mem[k].in_per_sample = k ? 100.0 * k : 50.0;
        mem[k].out_per_sample = 100.0 * (k + 1);
        mem[k].keep_per_sample = 100.0 * (k + 1);
        snprintf(mem[k].spec, sizeof mem[k].spec, "relu");
    }
    int bal[N];
    gp_profile p = unit_profile(N, M, S, mem, t, bal);
    gp_profile_skip sk = {0, 3};
    gp_stage_times a[N], b[N];
    double pa[N], pb[N];
    gp_schedule sched;
    gp_schedule_opts so = {.kind = GP_SCHEDULE_GPIPE, .n = N, .m = M,
                           .checkpoint = GP_CKPT_EXCEPT_LAST, .replicas = 1, .update = true,
                           .check = true};
    CHECK_OK(gp_schedule_make(&so, &sched));
    int64_t sizes[M] = {S, S, S, S};
    for (int with = 0; with < 2; with++) {
        p.skips = with ? &sk : NULL;
        p.n_skips = with;
        for (int j = 0; j < N; j++) {
            (with ? b : a)[j] = gp_stage_times_of(&p, t, 0, 0, j, N, j, 1);
            (with ? pb : pa)[j] = gp_stage_peak_bytes(&p, &sched, sizes, j, j, 1);
        }
    }
    gp_schedule_free(&sched);
    CHECK_MSG(b[3].copy_act == a[3].copy_act + t[0].copy && b[0].copy_grad == a[0].copy_grad +
              t[0].copy, "skip copies: stage 3 receives %g (was %g), stage 0 %g (was %g)",
              b[3].copy_act, a[3].copy_act, b[0].copy_grad, a[0].copy_grad);
    for (int j = 1; j < 3; j++)
        CHECK_MSG(b[j].copy_act == a[j].copy_act && b[j].copy_grad == a[j].copy_grad &&
                  pb[j] == pa[j], "stage %d pays for a skip that passes it by", j);
    /* without it: a stage receives the output of the layer before it, and
     * sends back the gradient of its own last layer's */
    for (int j = 0; j < N; j++)
        CHECK_MSG(a[j].copy_act == (j > 0 ? t[j - 1].copy : 0) &&
                  a[j].copy_grad == (j < N - 1 ? t[j].copy : 0),
                  "stage %d receives %g, sends back %g", j, a[j].copy_act, a[j].copy_grad);
    CHECK_MSG(pb[3] >= pa[3] + mem[0].out_per_sample * S && pb[0] > pa[0],
              "skip memory: stage 3 %g (was %g), stage 0 %g (was %g)", pb[3], pa[3], pb[0], pa[0]);
    /* through JSON, and into the hash */
    p.skips = &sk;
    p.n_skips = 1;
    p.input[0] = 1;
    p.input[1] = p.input[2] = 4;
    p.model_hash = gp_profile_stored_hash(&p);
    gp_profile q = p;
    q.n_skips = 0;
    CHECK(gp_profile_stored_hash(&q) != p.model_hash);
    char path[64];
    snprintf(path, sizeof path, "/tmp/gpipe_skip_profile_%d.json", (int)getpid());
    CHECK_OK(gp_profile_save(&p, path));
    gp_profile r;
    CHECK_OK(gp_profile_load(path, &r));
    CHECK(r.n_skips == 1 && r.skips && r.skips[0].from == 0 && r.skips[0].to == 3);
    gp_profile_free(&r);
    unlink(path);
}

/* In-place layers in the memory model: layer 1 runs in place (its output
 * not in its keep).  On a stage that starts at it, it cannot (its input is
 * the stage's), so the stage's peak is that of the same layer counted out
 * of place; on a stage that holds layers 0 and 1 the peak is lower.  The
 * same for an unkept output (layer 0's), which a stage that ends at its
 * layer keeps: it is the stage output. */
static void test_inplace_costs(void)
{
    enum { N = 2, M = 4, S = 2 };
    gp_layer_mem mem[N], mo[N];
    gp_layer_times t[N];
    memset(mem, 0, sizeof mem);
    memset(t, 0, sizeof t);
    for (int k = 0; k < N; k++) {
        t[k].fwd = t[k].bwd_data = t[k].bwd_weights = 1;
        mem[k].in_per_sample = mem[k].out_per_sample = 100.0;
        mem[k].keep_per_sample = 100.0 + 10.0 * k;
        snprintf(mem[k].spec, sizeof mem[k].spec, "relu");
    }
    memcpy(mo, mem, sizeof mo);
    mem[1].inplace = true;
    mem[1].keep_per_sample -= mem[1].out_per_sample;
    mem[0].unkept = true;
    mem[0].keep_per_sample -= mem[0].out_per_sample;
    int bal[N];
    gp_profile p = unit_profile(N, M, S, mem, t, bal), q = unit_profile(N, M, S, mo, t, bal);
    int64_t sizes[M] = {S, S, S, S};
    for (int ck = 0; ck < 3; ck++) {
        gp_schedule sched;
        gp_schedule_opts so = {.kind = GP_SCHEDULE_GPIPE, .n = 2, .m = M,
                               .checkpoint = (gp_checkpoint_mode)ck, .replicas = 1,
                               .update = true, .check = true};
        CHECK_OK(gp_schedule_make(&so, &sched));
        double first = gp_stage_peak_bytes(&p, &sched, sizes, 1, 1, 1);
        double out_of_place = gp_stage_peak_bytes(&q, &sched, sizes, 1, 1, 1);
        CHECK_MSG(first == out_of_place, "checkpoint %d: a stage starting at an in-place layer "
                  "holds %g, counted out of place %g", ck, first, out_of_place);
        double last = gp_stage_peak_bytes(&p, &sched, sizes, 0, 0, 1);
        double kept = gp_stage_peak_bytes(&q, &sched, sizes, 0, 0, 1);
        CHECK_MSG(last == kept, "checkpoint %d: a stage ending at an unkept output holds %g, "
                  "counted kept %g", ck, last, kept);
        gp_schedule_free(&sched);
        so.n = 1;
        CHECK_OK(gp_schedule_make(&so, &sched));
        double both = gp_stage_peak_bytes(&p, &sched, sizes, 0, 0, 2);
        double both_out = gp_stage_peak_bytes(&q, &sched, sizes, 0, 0, 2);
        CHECK_MSG(both < both_out, "checkpoint %d: in place %g, out of place %g", ck, both,
                  both_out);
        gp_schedule_free(&sched);
    }
    {
        /* an unkept output overwritten in place (0 unkept, 1 in place over
         * it, 2 reads neither: conv, dropout2d, a linked instance norm): a
         * stage that ends at the in-place layer keeps that memory as its
         * output, as if 0 were kept.  Until 2026-11-25 (found by review)
         * it was counted as freed */
        gp_layer_mem m3[3], m3k[3];
        gp_layer_times t3[3];
        memset(m3, 0, sizeof m3);
        memset(t3, 0, sizeof t3);
        for (int k = 0; k < 3; k++) {
            t3[k].fwd = t3[k].bwd_data = t3[k].bwd_weights = 1;
            m3[k].in_per_sample = m3[k].out_per_sample = 100.0;
            m3[k].keep_per_sample = 100.0;
            snprintf(m3[k].spec, sizeof m3[k].spec, "relu");
        }
        m3[1].inplace = true;
        m3[1].keep_per_sample = 0;
        memcpy(m3k, m3, sizeof m3k);
        m3[0].unkept = true;
        m3[0].keep_per_sample = 0;
        int b3[3];
        gp_profile p3 = unit_profile(3, M, S, m3, t3, b3), p3k = unit_profile(3, M, S, m3k, t3, b3);
        for (int ck = 0; ck < 3; ck++) {
            gp_schedule sched;
            gp_schedule_opts so = {.kind = GP_SCHEDULE_1F1B, .n = 2, .m = M,
                                   .checkpoint = (gp_checkpoint_mode)ck, .replicas = 1,
                                   .update = true, .check = true};
            CHECK_OK(gp_schedule_make(&so, &sched));
            double got = gp_stage_peak_bytes(&p3, &sched, sizes, 0, 0, 2);
            double want = gp_stage_peak_bytes(&p3k, &sched, sizes, 0, 0, 2);
            CHECK_MSG(got == want, "checkpoint %d: a stage ending in place over an unkept "
                      "output holds %g, counted kept %g", ck, got, want);
            gp_schedule_free(&sched);
        }
    }
    /* a fused relu (layer 1): nothing inside a stage, its own times as a
     * stage's first layer (its batch norm is on the stage before) */
    p.mem[1].fused = true;
    t[1].recompute = 1;
    gp_stage_times in = gp_stage_times_of(&p, t, 0, 0, 0, 1, 0, 2);
    gp_stage_times first = gp_stage_times_of(&p, t, 0, 0, 1, 2, 1, 1);
    CHECK_MSG(in.F == t[0].fwd && in.Bd + in.W <= t[0].bwd_data + t[0].bwd_weights &&
                  in.R == t[0].recompute,
              "a fused relu inside a stage costs F %g B %g R %g", in.F, in.B, in.R);
    CHECK_MSG(first.F == t[1].fwd && first.R == t[1].recompute &&
                  first.Bd == t[1].bwd_data,
              "a fused relu as a stage's first layer: F %g R %g Bd %g", first.F, first.R,
              first.Bd);
}

/* A GPU's first call of each convolution shape searches for its algorithm
 * in a borrowed workspace (cudnnFind, 256 MiB) that no step holds; the
 * profile must not take it for the layer's workspace, or every stage with
 * a convolution would plan 256 MiB it never uses.  GPIPE_CPU_FAKE_SEARCH
 * plays that search on the CPU: each layer's workspace is the same with it
 * as without it, timed or memory-only, and the searches did happen. */
/* The profile of the model in a config's text; false (the failure
 * checked and reported) where the config or the profile fails. */
static bool profile_text(const char *name, const char *yaml, const gp_model_profile_opts *o,
                         gp_profile *out)
{
    gp_config c;
    gp_status s = gp_config_parse(name, yaml, strlen(yaml), NULL, 0, &c);
    CHECK_OK(s);
    if (s != GP_OK) return false;
    s = gp_model_profile(&c, o, out);
    CHECK_OK(s);
    gp_config_free(&c);
    return s == GP_OK;
}

static void test_profile_search(void)
{
    const char *yaml =
        "model:\n"
        "  input: [3, 12, 12]\n"
        "  layers:\n"
        "    - conv2d: {out: 16, kernel: 3, padding: 1}\n"
        "    - relu\n"
        "    - conv2d: {out: 16, kernel: 3, padding: 1}\n"
        "    - flatten\n"
        "    - linear: {out: 10}\n"
        "data: {dataset: synthetic}\n"
        "train: {batch_size: 16}\n";
    for (int timed = 0; timed < 2; timed++) {
        gp_model_profile_opts mo = {.warmup = 1, .reps = 2, .timed = timed, .threads = 1};
        gp_profile plain, searched;
        if (!profile_text("search.yaml", yaml, &mo, &plain)) continue;
        setenv("GPIPE_CPU_FAKE_SEARCH", "64", 1);
        bool ok = profile_text("search.yaml", yaml, &mo, &searched);
        unsetenv("GPIPE_CPU_FAKE_SEARCH");
        if (!ok) {
            gp_profile_free(&plain);
            continue;
        }
        for (int k = 0; k < plain.L && k < searched.L; k++)
            CHECK_MSG(searched.mem[k].workspace_bytes == plain.mem[k].workspace_bytes &&
                          searched.mem[k].workspace_bytes < ((size_t)64 << 20),
                      "%s profile, layer %d: workspace %zu with searches, %zu without",
                      timed ? "timed" : "memory-only", k, searched.mem[k].workspace_bytes,
                      plain.mem[k].workspace_bytes);
        gp_profile_free(&plain);
        gp_profile_free(&searched);
    }
    /* every size and pass counts: a linear layer takes the arena only at
     * the smaller micro-batch (16 rows, at most half its outputs and under
     * 32: transposed on every instruction set, cpu_math.c wide_nt_worth),
     * so a two-size profile holds at least the smaller size's own workspace;
     * a batch norm that is stage 0's first trainable layer runs a
     * weights-only backward whose scratch is its input's size */
    const char *lin =
        "model:\n"
        "  input: [1, 16, 16]\n"
        "  layers:\n"
        "    - flatten\n"
        "    - linear: {out: 256}\n"
        "    - relu\n"
        "    - linear: {out: 10}\n"
        "data: {dataset: synthetic}\n"
        "train: {batch_size: 256}\n";
    gp_model_profile_opts two = {.warmup = 1, .reps = 1, .timed = true, .threads = 1,
                                 .n_sizes = 2, .sizes = {256, 16}};
    gp_model_profile_opts one = {.warmup = 1, .reps = 1, .timed = true, .threads = 1,
                                 .n_sizes = 1, .sizes = {16}};
    gp_profile p2, p1;
    bool ok2 = profile_text("lin.yaml", lin, &two, &p2);
    bool ok1 = profile_text("lin.yaml", lin, &one, &p1);
    if (ok1 && ok2)
        CHECK_MSG(p1.mem[1].workspace_bytes > 0 &&
                      p2.mem[1].workspace_bytes >= p1.mem[1].workspace_bytes,
                  "linear 256 -> 256: workspace %zu profiled at sizes 256 and 16, %zu at 16 "
                  "alone", p2.mem[1].workspace_bytes, p1.mem[1].workspace_bytes);
    if (ok2) gp_profile_free(&p2);
    if (ok1) gp_profile_free(&p1);
    const char *bnf =
        "model:\n"
        "  input: [8, 12, 12]\n"
        "  layers:\n"
        "    - batchnorm\n"
        "    - conv2d: {out: 8, kernel: 3, padding: 1}\n"
        "    - flatten\n"
        "    - linear: {out: 10}\n"
        "data: {dataset: synthetic}\n"
        "train: {batch_size: 16}\n";
    gp_model_profile_opts bo = {.warmup = 1, .reps = 1, .timed = true, .threads = 1};
    gp_profile pb;
    if (profile_text("bnf.yaml", bnf, &bo, &pb)) {
        CHECK_MSG(pb.first_trainable == 0 &&
                      pb.mem[0].workspace_bytes >= (size_t)16 * 8 * 12 * 12 * sizeof(float),
                  "batch norm as the first trainable layer: workspace %zu, its input %zu bytes",
                  pb.mem[0].workspace_bytes, (size_t)16 * 8 * 12 * 12 * sizeof(float));
        gp_profile_free(&pb);
    }

    /* the hook does what it says: a search per shape and direction, with
     * its workspace */
    setenv("GPIPE_CPU_FAKE_SEARCH", "8", 1);
    gp_device *dev = NULL;
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    unsetenv("GPIPE_CPU_FAKE_SEARCH");
    if (dev) {
        gp_device_bind_thread(dev);
        gp_conv_desc d = {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 8, 8, 1, 0, 0};
        float *x, *w, *b, *y;
        size_t nx = 2 * 3 * 8 * 8, nw = 4 * 3 * 3 * 3, ny = 2 * 4 * 8 * 8;
        CHECK_OK(gp_dev_alloc(dev, nx * 4, GP_MEM_ACTIVATIONS, (void **)&x));
        CHECK_OK(gp_dev_alloc(dev, nw * 4, GP_MEM_ACTIVATIONS, (void **)&w));
        CHECK_OK(gp_dev_alloc(dev, 16, GP_MEM_ACTIVATIONS, (void **)&b));
        CHECK_OK(gp_dev_alloc(dev, ny * 4, GP_MEM_ACTIVATIONS, (void **)&y));
        memset(x, 0, nx * 4); memset(w, 0, nw * 4); memset(b, 0, 16);
        for (int r = 0; r < 2; r++) CHECK_OK(gp_dev_conv_fwd(dev, &d, x, w, b, y));
        CHECK(dev->algo_searches == 1 && dev->alloc.peak_by[GP_MEM_WORKSPACE] >= ((size_t)8 << 20));
        gp_dev_free(dev, x, nx * 4, GP_MEM_ACTIVATIONS);
        gp_dev_free(dev, w, nw * 4, GP_MEM_ACTIVATIONS);
        gp_dev_free(dev, b, 16, GP_MEM_ACTIVATIONS);
        gp_dev_free(dev, y, ny * 4, GP_MEM_ACTIVATIONS);
        gp_device_close(dev);
    }
}

/* The planner's peak for every schedule against a step's measured peak on
 * a model with skips and in-place layers (a small U-Net: dropout2d and
 * leaky ReLU in place, instance norm, concatenations), on capped devices
 * as the planner plans for (a capped CPU device keeps no reordered
 * weights).  Under-planning is the side that hurts (a split said to fit
 * runs out of memory), so the plan must be an upper bound: every run here
 * is lockstep, whose frees are at fixed places (pipeline.c, await_sent),
 * so planned >= measured, less PEAK_SLACK; over-planning only to 2x
 * (zb-h1's stage 0 plans up to 1.9x here: the planner walks ZB-H1's
 * untimed order, which holds two data halves' gradients where the order
 * the executor tuned holds one).  v-half and v-min order their lists by
 * the first step's times, so, as in test_simulator, up to 3 attempts and
 * the bounds asserted on the last.  Until 2026-12-01 the bound was 0.85x,
 * and GPipe's last stage planned 0.94-0.95x what it measured (its
 * decoder's concatenation makes both halves of its input's gradient
 * beside that gradient, in the backward: sim.c, bwd_rise), 1F1B's 1.00x
 * only by a margin the targets uploaded a micro-batch ahead took, and the
 * V schedules' devices down to 0.90x (lockstep holds what a stage on a
 * later clock copies until then: sim.c, sent_free).  Until 2026-11-25 zb-h1
 * held every layer's incoming gradient between its backward's halves
 * while the model counted what the forward kept: stage 1 here measured
 * 43.5-45.3 MiB against 33.95 planned (0.75-0.78); now 26.4.  On 4
 * stages the skip from stage 0 to stage 3 is held for 3 micro-batches;
 * until 2026-11-25 the planner counted one and stage 0 measured up to
 * 1.43x its plan (0.70). */
/* The computations the executor ran in its last step, device by device in
 * its order, as a schedule file of n ranks and S stages placed in a V (or
 * one a rank, S = n). */
static void executed_file(const gp_model *model, int n, int S, int m, gp_schedule_file *f)
{
    memset(f, 0, sizeof *f);
    f->n = n;
    f->stages = S;
    f->m = m;
    f->v_shape = S > n;
    f->split = true;
    for (int d = 0; d < n; d++) {
        int cnt = 0;
        const gp_event_rec *ev = gp_pipeline_events(model->pipe, d, &cnt);
        f->acts[d] = calloc((size_t)cnt + 1, sizeof *f->acts[d]);
        for (int e = 0; e < cnt; e++) {
            gp_instr_kind k = ev[e].kind;
            int q = k == GP_INSTR_FORWARD ? GP_SACT_F : k == GP_INSTR_BACKWARD_DATA ? GP_SACT_I
                    : k == GP_INSTR_BACKWARD_WEIGHTS ? GP_SACT_W
                    : k == GP_INSTR_BACKWARD ? GP_SACT_B : -1;
            if (q < 0 || ev[e].is_wait) continue;
            f->acts[d][f->len[d]++] = (gp_sact){.kind = (uint8_t)q, .stage = ev[e].j,
                                                .mb = ev[e].i, .rank = d};
        }
    }
}

/* want[] again, simulated on the lists the executor ran (resim: the
 * profile): zb-h1, v-half and v-min order a device's list by the stages'
 * times the first steps measured (pipeline.c, tune_order), which a
 * simulation in unit times does not know (a loaded machine's times
 * ordered v-min's device 0 to hold 9.35 MiB for a plan of 6.98, CI
 * 2026-11-29; zb-h1's stage 0 of 4 here 13.47 MiB for a plan of 10.85 in
 * about one run in 10, 2026-12-01). */
static void resimulate(const gp_model *model, const gp_config *cfg, const gp_profile *resim,
                       int nd, double *want)
{
    gp_schedule_file f;
    int S = cfg->pipeline.n_balance;
    executed_file(model, nd, S, cfg->pipeline.chunks, &f);
    CHECK_OK(gp_simulate_memory(resim, S > nd ? GP_SCHEDULE_FILE_V : GP_SCHEDULE_FILE, nd,
                                S / nd, &f, cfg->pipeline.balance, cfg->pipeline.chunks,
                                cfg->pipeline.checkpoint, want, NULL));
    for (int d = 0; d < nd; d++) free(f.acts[d]);
}

/* Two pipelined steps of cfg's U-Net on its nd devices (the first
 * allocates the caches), then each device's allocator peak of the second
 * against want[] (the planner's or the simulator's, `what`; with resim, simulated again on the lists it ran): the number of
 * devices measured over want[] + PEAK_SLACK or planned over twice what
 * they measured, each printed on the last attempt (and with
 * GPIPE_TEST_VERBOSE). */
/* What a measured peak may be over its plan: the device's arena rounds
 * the workspace its layers asked for up (about 2 KiB here) and the step's
 * loss results take 8 bytes and 24 a micro-batch (pipeline.c, RES_LOSS),
 * which no layer's profile holds. */
enum { PEAK_SLACK = 8 << 10 };

static int peaks_bad(gp_config *cfg, int nd, double *want, const char *unit,
                     const char *what, bool last, const gp_profile *resim)
{
    gp_device *devs[GP_MAX_DEVICES];
    gp_model model;
    CHECK_OK(gp_train_open(cfg, devs, &model, true));
    int64_t b = 16, per = 3 * 64 * 64, t = model.targets;
    float *x = malloc((size_t)(b * per) * sizeof *x), *y = malloc((size_t)(b * t) * sizeof *y);
    gp_rng_uniform_fill(5, 6, 0, x, b * per);
    for (int64_t i = 0; i < b * t; i++) y[i] = x[i % (b * per)] > 0.5f;
    /* the second step's peak: the first allocates the caches */
    for (int it = 0; it < 2; it++) {
        if (it == 1)
            for (int j = 0; j < nd; j++) gp_allocator_reset_peak(&devs[j]->alloc);
        CHECK_OK(gp_model_pipeline_step(&model, cfg, x, y, b, 0.0, NULL));
    }
    if (resim) resimulate(&model, cfg, resim, nd, want);
    int bad = 0;
    for (int j = 0; j < nd; j++) {
        double got = (double)devs[j]->alloc.peak, r = want[j] / got;
        bool ok = want[j] + PEAK_SLACK >= got && r < 2.0;
        if ((!ok && last) || getenv("GPIPE_TEST_VERBOSE"))
            printf("test_balance: %d %s, %s, %s, device %d: %s peak %.2f MiB, measured %.2f MiB "
                   "(ratio %.3f)\n", nd, unit, gp_schedule_kind_name(cfg->pipeline.schedule),
                   gp_checkpoint_mode_name(cfg->pipeline.checkpoint), j, what,
                   want[j] / 1048576.0, got / 1048576.0, r);
        bad += !ok;
    }
    free(x);
    free(y);
    gp_model_free(&model);
    for (int j = 0; j < nd; j++) gp_device_close(devs[j]);
    return bad;
}

/* Selective recompute (pipeline.checkpoint.keep) on 1F1B, checkpoint
 * always, keeping the norms (with the leaky relus in place over their
 * outputs), and keeping the convolutions (with the dropouts in place over
 * them): the planned peaks against the measured ones, as for the modes,
 * and each plans at least what keeping nothing plans on every stage, more
 * on one.  (In a U-Net neither is worth it: no backward reads a
 * convolution's output, so a kept one is held only for the recompute of
 * its norm, which a forward that keeps everything frees at once, and the
 * norms are most of what such a forward keeps: both measured 13.7 and 15.4
 * MiB on the first of 4 stages, never checkpointing 14.4, 2026-11-29.)
 * Returns the devices out of bounds. */
static int keep_peaks(gp_config *cfg, gp_profile *p, int nd, const int *bal, bool last)
{
    cfg->pipeline.schedule = GP_SCHEDULE_1F1B;
    double peak[4][4], cost[4];
    const gp_ckpt_keep keep[4] = {0, 0, 1u << GP_LAYER_INSTANCE_NORM, 1u << GP_LAYER_CONV2D};
    for (int q = 0; q < 4; q++) { /* always; never; always keeping norms; convolutions */
        cfg->pipeline.checkpoint = q == 1 ? GP_CKPT_NEVER : GP_CKPT_ALWAYS;
        cfg->pipeline.checkpoint_keep = keep[q];
        gp_model_profile_facts(cfg, p);
        gp_plan_opts po;
        gp_model_plan_opts(cfg, nd, &po);
        po.by = GP_BALANCE_BY_SIZE;
        gp_balance_stage_costs(p, &po, bal, cost, peak[q]);
    }
    bool above[2] = {false, false};
    for (int j = 0; j < nd; j++)
        for (int q = 2; q < 4; q++) {
            CHECK_MSG(peak[q][j] >= peak[0][j], "stage %d: keeping %s plans %.2f MiB, under "
                      "keeping nothing's %.2f", j, q == 2 ? "norms" : "convolutions",
                      peak[q][j] / 1048576.0, peak[0][j] / 1048576.0);
            above[q - 2] = above[q - 2] || peak[q][j] > peak[0][j];
        }
    CHECK_MSG(above[0] && above[1], "keeping norms or convolutions plans what keeping nothing "
              "does on every stage");
    cfg->pipeline.checkpoint_keep = keep[2];
    int bad = peaks_bad(cfg, nd, peak[2], "stages", "planned, keeping the norms", last, NULL);
    cfg->pipeline.checkpoint_keep = keep[3];
    bad += peaks_bad(cfg, nd, peak[3], "stages", "planned, keeping the convolutions", last, NULL);
    cfg->pipeline.checkpoint_keep = 0;
    gp_model_profile_facts(cfg, p);
    return bad;
}

/* The loss's targets the planner counts on the last stage
 * (gp_model_profile_facts' target_bytes): cross-entropy's one class id a
 * row, T a sample for an (N, T, classes) output, whatever the last layer
 * is: a dropout over the head counted one (4 bytes) until 2026-12-01. */
static void test_target_bytes(void)
{
    for (int drop = 0; drop < 2; drop++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml,
                 "model:\n"
                 "  input: [6]\n"
                 "  layers:\n"
                 "    - embedding: {vocab: 10, dim: 8, positions: 6}\n"
                 "    - linear: {out: 10}\n"
                 "%s"
                 "  loss: cross_entropy\n"
                 "data: {dataset: synthetic}\n"
                 "train: {batch_size: 4}\n", drop ? "    - dropout: {p: 0.1}\n" : "");
        gp_config cfg;
        CHECK_OK(gp_config_parse("targets.yaml", yaml, strlen(yaml), NULL, 0, &cfg));
        gp_layer_mem mem[3];
        memset(mem, 0, sizeof mem);
        for (int k = 1; k < 3; k++) mem[k].out_per_sample = 6 * 10 * sizeof(float);
        gp_profile p;
        memset(&p, 0, sizeof p);
        p.mem = mem;
        p.L = 2 + drop;
        gp_model_profile_facts(&cfg, &p);
        CHECK_MSG(p.target_bytes == 6 * sizeof(float), "%s last: %.0f target bytes a sample, "
                  "want 24 (6 positions)", drop ? "a dropout" : "a linear", p.target_bytes);
        gp_config_free(&cfg);
    }
}

static int schedule_memory_attempt(bool last, int nd, bool sample)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model:\n"
             "  input: [3, 64, 64]\n"
             "  unet: {depth: 2, num_convs: 2, base: 16}\n"
             "  loss: bce_with_logits\n"
             "pipeline: {devices: [{name: cpu:0, memory: 512MiB}, {name: cpu:1, memory: 512MiB}"
             "%s], threads: 1, chunks: 4, lockstep: true}\n"
             "data: {dataset: synthetic, synthetic: {masks: true}}\n"
             "train: {batch_size: 16}\n",
             nd == 4 ? ", {name: cpu:2, memory: 512MiB}, {name: cpu:3, memory: 512MiB}" : "");
    gp_config cfg;
    CHECK_OK(gp_config_parse("simmem.yaml", yaml, strlen(yaml), NULL, 0, &cfg));
    gp_model_profile_opts mo = {.timed = false, .threads = 1};
    gp_profile p;
    CHECK_OK(gp_model_profile(&cfg, &mo, &p));
    /* 4 stages: [10, 17, 10, 12] (49 layers), so the skip encoder_0
     * (layer 8 -> 39) goes from stage 0 to stage 3 and encoder_1 (18 ->
     * 29) from stage 1 to stage 2 */
    int L = cfg.model.n_layers, bal[4] = {L / 2, L - L / 2, 0, 0};
    if (nd == 4) bal[0] = 10, bal[1] = 17, bal[2] = 10, bal[3] = L - 37;
    cfg.pipeline.n_balance = nd;
    for (int j = 0; j < nd; j++) cfg.pipeline.balance[j] = bal[j];
    int bad = 0;
    for (int kind = GP_SCHEDULE_GPIPE; kind <= GP_SCHEDULE_ZB_H1; kind++)
        for (int ck = 0; ck < 3; ck++) {
            if (sample && ck != kind) continue; /* (see test_schedule_memory) */
            cfg.pipeline.schedule = (gp_schedule_kind)kind;
            cfg.pipeline.checkpoint = (gp_checkpoint_mode)ck;
            /* the planner's peaks (gpipe-balance --by size: no times needed) */
            gp_plan_opts po;
            gp_model_plan_opts(&cfg, nd, &po);
            po.by = GP_BALANCE_BY_SIZE;
            double cost[4], peak[4];
            gp_balance_stage_costs(&p, &po, bal, cost, peak);
            /* (zb-h1: planned for its untimed order; simulated again on
             * the order the executor tuned, resimulate) */
            bool zb = kind == GP_SCHEDULE_ZB_H1;
            bad += peaks_bad(&cfg, nd, peak, "stages", zb ? "simulated" : "planned", last,
                             zb ? &p : NULL);
        }
    bad += keep_peaks(&cfg, &p, nd, bal, last);
    /* the V schedules (two stages a device) and interleaved (2 a device),
     * each with one checkpoint mode: the simulator's device peaks
     * (gp_simulate_memory, the stages' bytes added instruction by
     * instruction) against the allocator's */
    for (int kind = GP_SCHEDULE_INTERLEAVED; kind < GP_SCHEDULE_KINDS; kind++) {
        if (sample && kind != GP_SCHEDULE_ZB_V) continue;
        int ck = kind % 3, S = 2 * nd, vb[GP_MAX_DEVICES];
        for (int j = 0; j < S; j++) vb[j] = L / S + (j < L % S);
        cfg.pipeline.schedule = (gp_schedule_kind)kind;
        cfg.pipeline.virtual_stages = 2;
        cfg.pipeline.checkpoint = (gp_checkpoint_mode)ck;
        cfg.pipeline.n_balance = S;
        for (int j = 0; j < S; j++) cfg.pipeline.balance[j] = vb[j];
        /* (dualpipe-v feeds both ends: 2n micro-batches at least) */
        cfg.pipeline.chunks = kind == GP_SCHEDULE_DUALPIPE_V ? 2 * nd : 4;
        double peak[GP_MAX_DEVICES];
        CHECK_OK(gp_simulate_memory(&p, (gp_schedule_kind)kind, nd, 2, NULL, vb,
                                    cfg.pipeline.chunks, (gp_checkpoint_mode)ck, peak, NULL));
        /* several stages a device: the model errs high (up to 1.53x
         * measured here, 2026-11-29), within the same bounds; v-half and
         * v-min simulated again on the lists the executor ran */
        bool timed = kind == GP_SCHEDULE_V_HALF || kind == GP_SCHEDULE_V_MIN;
        bad += peaks_bad(&cfg, nd, peak, "devices", "simulated", last, timed ? &p : NULL);
    }
    gp_profile_free(&p);
    gp_config_free(&cfg);
    return bad;
}

/* Stage 0's forward uploads the next micro-batch's input too, so that its
 * copy overlaps the forward (pipeline.c, await_upload), and the simulator
 * holds it from then.  It held each input from its own forward, and 1F1B's
 * stage 0 on an MLP, which runs a backward between two forwards, planned
 * 3.26 MiB where a step measured 3.51 (0.93x): `gpipe-train --dry-run`
 * said the device fit 3.4 MiB, and the run ran out of memory in its first
 * step.  The estimate from shapes (what the start-up check uses) against
 * the second step's peak, threads 1, lockstep.  With late_ms, device 1's
 * worker makes each copy of that step late_ms after it may start (a thread
 * that gets the CPU late): device 0's peak must not move (see
 * test_late_reader). */
static int upload_ahead_attempt(bool last, gp_schedule_kind kind, int late_ms)
{
    static const char *yaml =
        "model:\n  input: [1, 16, 16]\n  layers: [flatten, {linear: {out: 256}}, relu,\n"
        "    {linear: {out: 256}}, relu, {linear: {out: 256}}, relu, {linear: {out: 256}},\n"
        "    relu, {linear: {out: 10}}]\n"
        "pipeline: {devices: [cpu:0, cpu:1], threads: 1, chunks: 4, lockstep: true,\n"
        "           schedule: 1f1b, checkpoint: always, balance: [5, 5]}\n"
        "data: {dataset: synthetic}\n"
        "train: {batch_size: 1024}\n";
    gp_config cfg;
    CHECK_OK(gp_config_parse("upload.yaml", yaml, strlen(yaml), NULL, 0, &cfg));
    cfg.pipeline.schedule = kind;
    gp_profile p;
    CHECK_OK(gp_model_profile_estimate(&cfg, NULL, &p));
    double want[2] = {0, 0};
    CHECK_OK(gp_simulate_memory(&p, kind, 2, 1, NULL, cfg.pipeline.balance, 4,
                                GP_CKPT_ALWAYS, want, NULL));
    gp_profile_free(&p);
    gp_device *devs[GP_MAX_DEVICES];
    gp_model model;
    CHECK_OK(gp_train_open(&cfg, devs, &model, true));
    int64_t b = 1024;
    float *x, *y;
    class_batch(b, 256, &x, &y);
    for (int it = 0; it < 2; it++) {
        if (it == 1) gp_allocator_reset_peak(&devs[0]->alloc);
        if (it == 1 && late_ms > 0) gp_pipeline_set_late_copies(model.pipe, 1, late_ms);
        CHECK_OK(gp_model_pipeline_step(&model, &cfg, x, y, b, 0.0, NULL));
    }
    /* (the workspace the estimate leaves out: a few bytes here) */
    double got = (double)devs[0]->alloc.peak,
           ws = (double)devs[0]->alloc.peak_by[GP_MEM_WORKSPACE], r = (want[0] + ws) / got;
    bool ok = r >= 0.97 && r <= 1.1;
    if ((!ok && last) || getenv("GPIPE_TEST_VERBOSE"))
        printf("test_balance: %s, always, stage 0 of an MLP%s: planned %.3f MiB, measured %.3f "
               "(ratio %.3f)\n", gp_schedule_kind_name(kind),
               late_ms > 0 ? ", device 1's copies late" : "", want[0] / 1048576.0,
               got / 1048576.0, r);
    free(x);
    free(y);
    gp_model_free(&model);
    for (int j = 0; j < 2; j++) gp_device_close(devs[j]);
    gp_config_free(&cfg);
    return !ok;
}

static void test_upload_ahead(void)
{
    CHECK_MSG(upload_ahead_attempt(true, GP_SCHEDULE_1F1B, 0) == 0,
              "1F1B's stage 0 planned outside 0.97-1.1x its measured peak");
}

/* A device's peak is the schedule's, not the threads' timing: in lockstep
 * the copies that read a device's tensors are made before it computes past
 * their clock (pipeline.c, await_sent).  Until 2026-12-01 a tensor was freed
 * whenever its reader's copy happened to be done, and with that reader's
 * thread late (here device 1's copies, 20 ms each), 1F1B's stage 0 ran its
 * backward with the next micro-batch's output still there (3.756 MiB
 * against the 3.506 planned, what a loaded machine measured every time)
 * and GPipe's stage 0 ran every forward with all their outputs there. */
static void test_late_reader(void)
{
    CHECK_MSG(upload_ahead_attempt(true, GP_SCHEDULE_1F1B, 20) == 0,
              "1F1B's stage 0 with device 1 late: planned outside 0.97-1.1x its measured peak");
    CHECK_MSG(upload_ahead_attempt(true, GP_SCHEDULE_GPIPE, 20) == 0,
              "GPipe's stage 0 with device 1 late: planned outside 0.97-1.1x its measured peak");
}

/* sample: each schedule with one checkpoint mode (gpipe never, 1f1b
 * except_last, zb-h1 always), so every schedule and every mode once on
 * each stage count.  What ThreadSanitizer runs: there the 18 measured
 * steps were most of test_balance's time (300 s of 390 on a loaded 2-core
 * machine), and the other 12 run the same executor threads with another
 * pairing; the unsanitized and AddressSanitizer runs measure all 18. */
static void test_schedule_memory(bool sample)
{
    for (int nd = 2; nd <= 4; nd += 2) {
        int bad = 0;
        for (int a = 0; a < 3; a++)
            if ((bad = schedule_memory_attempt(a == 2, nd, sample)) == 0) break;
        CHECK_MSG(bad == 0, "%d devices: planned peaks under (or over 2x) the measured ones "
                  "in %d of %d (schedule, checkpoint, device) cases", nd, bad,
                  (sample ? 4 : 14) * nd);
    }
    if (sample)
        printf("test_balance: ThreadSanitizer: planned vs measured peaks for 3 of the 9 "
               "(schedule, checkpoint) pairs per stage count\n");
}

/* With data-parallel replicas the planner sizes one replica's pipeline:
 * the step splits train.batch_size R x chunks ways (replicas.c), so a
 * replica's batch is batch / R and its micro-batch batch / (R chunks).
 * Sized by the whole batch, balance: auto and gpipe-balance counted R
 * times the activations and refused configs that fit. */
static void test_replica_batch(void)
{
    static const char *yaml =
        "model:\n  input: [1, 8, 8]\n  layers: [flatten, {linear: {out: 16}}, relu,\n"
        "                              {linear: {out: 10}}]\n"
        "pipeline: {devices: [cpu:0, cpu:1], replicas: 3, chunks: 2, threads: 1}\n"
        "data: {dataset: synthetic}\n"
        "train: {batch_size: 61}\n";
    gp_config cfg;
    CHECK_OK(gp_config_parse("r.yaml", yaml, strlen(yaml), NULL, 0, &cfg));
    CHECK(gp_config_replica_batch(&cfg) == 21); /* 61 over 3, rounded up */
    gp_model_profile_opts mo = {.warmup = 0, .reps = 1, .timed = false, .threads = 1};
    gp_profile p;
    CHECK_OK(gp_model_profile(&cfg, &mo, &p));
    /* the largest micro-batch a step makes: 61 in 6 -> 11, 10, 10, 10, 10, 10 */
    int64_t sizes[6];
    CHECK_OK(gp_microbatch_split(61, 6, sizes));
    CHECK_MSG(p.batch == 21 && p.chunks == 2 && p.n_sizes == 1 && p.sizes[0] == sizes[0],
              "profile batch %lld, chunks %d, %d sizes, first %lld; want 21, 2, 1, %lld",
              (long long)p.batch, p.chunks, p.n_sizes, (long long)p.sizes[0],
              (long long)sizes[0]);
    gp_profile_free(&p);
    gp_config_free(&cfg);
}

/* gp_profile_estimate (shapes alone) against the memory-only profile
 * (every layer built and run, the allocator's counters) of the same model:
 * inputs, outputs and the layout flags equal; parameters, gradients and
 * optimizer state within 5% or 4 KiB (a batch norm's statistics
 * accumulators are its own, not counted); what each layer keeps for
 * backward within 2% or 256 bytes a sample; each device's peak under every
 * built-in schedule at most the measured profile's (which adds the measured
 * workspace the estimate cannot know, so a run is never refused on an
 * estimate its measurement would pass) and, with that workspace left out
 * of both, within 3% of it. */
static void test_profile_estimate(void)
{
    const char *files[][3] = {
        {"configs/default.yaml", "pipeline.chunks=4", NULL},
        {"bench/mlp.yaml", "pipeline.chunks=8", NULL},
        {"bench/convnet.yaml", "pipeline.chunks=4", "train.batch_size=32"},
        {"configs/tiny-gpt.yaml", "train.batch_size=8", NULL},
        {"configs/llama-tiny.yaml", "train.batch_size=8", NULL},
        {"configs/unet.yaml", "train.batch_size=4", "pipeline.chunks=2"},
        {"configs/amoebanet-d.yaml", "train.batch_size=4", "pipeline.chunks=2"},
    };
    int nf = (int)(sizeof files / sizeof files[0]);
    if (gpt_sanitizer() != GPT_SAN_NONE) nf = 3; /* (the small ones: each runs every layer) */
    for (int f = 0; f < nf; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", GPIPE_SOURCE_DIR, files[f][0]);
        const char *ov[2];
        int no = 0;
        for (int q = 1; q < 3; q++)
            if (files[f][q]) ov[no++] = files[f][q];
        gp_config cfg;
        if (gp_config_load(path, ov, no, &cfg) != GP_OK) {
            CHECK_MSG(false, "%s: %s", files[f][0], gp_error_message());
            continue;
        }
        gp_profile e, m;
        gp_model_profile_opts mo = {.timed = false, .warmup = 0, .reps = 1};
        gp_device *dev = NULL;
        gp_device_opts dop = {.threads = 1};
        CHECK_OK(gp_device_open("cpu:0", &dop, &dev));
        bool ok = gp_model_profile_estimate(&cfg, dev, &e) == GP_OK;
        gp_device_close(dev);
        CHECK_MSG(ok, "%s: estimate: %s", files[f][0], gp_error_message());
        if (ok && gp_model_profile(&cfg, &mo, &m) != GP_OK) {
            CHECK_MSG(false, "%s: profile: %s", files[f][0], gp_error_message());
            gp_profile_free(&e);
            ok = false;
        }
        if (!ok) {
            gp_config_free(&cfg);
            continue;
        }
        CHECK(e.L == m.L && e.n_skips == m.n_skips && e.model_hash == m.model_hash &&
              e.first_trainable == m.first_trainable);
        int bad = 0;
        for (int k = 0; k < e.L && k < m.L; k++) {
            const gp_layer_mem *a = &e.mem[k], *b = &m.mem[k];
#define NEAR(x, y) (fabs((double)(x) - (double)(y)) <= fmax(0.05 * (double)(y), 4096.0))
            bool same = NEAR(a->param_bytes, b->param_bytes) &&
                        NEAR(a->grad_bytes, b->grad_bytes) &&
                        NEAR(a->optim_bytes, b->optim_bytes) &&
                        a->in_per_sample == b->in_per_sample &&
                        a->out_per_sample == b->out_per_sample && a->inplace == b->inplace &&
                        a->unkept == b->unkept && a->fused == b->fused &&
                        fabs(a->keep_per_sample - b->keep_per_sample) <=
                            fmax(0.02 * b->keep_per_sample, 256.0);
            if (!same && bad++ < 4)
                printf("test_balance: %s layer %d %s: params %zu/%zu grads %zu/%zu optim "
                       "%zu/%zu keep %.0f/%.0f in %.0f/%.0f out %.0f/%.0f flags %d%d%d/%d%d%d "
                       "(estimated/measured)\n", files[f][0], k, b->desc, a->param_bytes,
                       b->param_bytes, a->grad_bytes, b->grad_bytes, a->optim_bytes,
                       b->optim_bytes, a->keep_per_sample, b->keep_per_sample, a->in_per_sample,
                       b->in_per_sample, a->out_per_sample, b->out_per_sample, a->inplace,
                       a->unkept, a->fused, b->inplace, b->unkept, b->fused);
        }
#undef NEAR
        CHECK_MSG(bad == 0, "%s: %d layers estimated otherwise than measured", files[f][0], bad);
        gp_profile m0 = m; /* the measured profile without its workspace */
        gp_layer_mem *mem0 = malloc((size_t)m.L * sizeof *mem0);
        if (!mem0) {
            CHECK_MSG(false, "out of memory");
            gp_profile_free(&e);
            gp_profile_free(&m);
            gp_config_free(&cfg);
            continue;
        }
        memcpy(mem0, m.mem, (size_t)m.L * sizeof *mem0);
        for (int k = 0; k < m.L; k++) mem0[k].workspace_bytes = 0;
        m0.mem = mem0;
        /* each device's peak, 2 devices, every built-in schedule */
        for (int kind = 0; kind < GP_SCHEDULE_KINDS && e.L >= 4; kind++) {
            int n = 2, v = gp_schedule_stages_per_device((gp_schedule_kind)kind,
                                                         kind == GP_SCHEDULE_INTERLEAVED ? 2 : 1);
            int S = n * v, bal[GP_MAX_DEVICES];
            for (int j = 0; j < S; j++) bal[j] = e.L / S + (j < e.L % S);
            int mm = cfg.pipeline.chunks < 2 * n ? 2 * n : cfg.pipeline.chunks;
            double pe[GP_MAX_DEVICES], pm[GP_MAX_DEVICES], p0[GP_MAX_DEVICES];
            if (gp_simulate_memory(&e, (gp_schedule_kind)kind, n, v, NULL, bal, mm,
                                   GP_CKPT_EXCEPT_LAST, pe, NULL) != GP_OK ||
                gp_simulate_memory(&m, (gp_schedule_kind)kind, n, v, NULL, bal, mm,
                                   GP_CKPT_EXCEPT_LAST, pm, NULL) != GP_OK ||
                gp_simulate_memory(&m0, (gp_schedule_kind)kind, n, v, NULL, bal, mm,
                                   GP_CKPT_EXCEPT_LAST, p0, NULL) != GP_OK) {
                CHECK_MSG(false, "%s %s: %s", files[f][0],
                          gp_schedule_kind_name((gp_schedule_kind)kind), gp_error_message());
                continue;
            }
            for (int d = 0; d < n; d++)
                CHECK_MSG(pe[d] <= pm[d] && fabs(pe[d] - p0[d]) <= 0.03 * p0[d],
                          "%s %s device %d: estimated peak %.0f, measured profile's %.0f (%.0f "
                          "without its workspace)", files[f][0],
                          gp_schedule_kind_name((gp_schedule_kind)kind), d, pe[d], pm[d], p0[d]);
        }
        free(mem0);
        gp_profile_free(&e);
        gp_profile_free(&m);
        gp_config_free(&cfg);
    }
}

/* A model of more than GP_UNIT_MIN_LAYERS layers is split at its repeated
 * blocks (gp_profile_units): an embedding, 60 blocks of 7 layers (specs a
 * .. g, the last of each 10 times the others, so that the min-max over
 * every layer boundary would cut inside blocks), a norm and a head.  The
 * units are the 3 single layers and the 60 blocks; the plan's stages, in a
 * line and in a V, begin only at a unit; a model of 400 layers is not
 * split so. */
static void test_plan_units(void)
{
    enum { NB = 60, P = 7, L = 1 + NB * P + 2, M = 8 };
    gp_layer_mem *mem = calloc(L, sizeof *mem);
    gp_layer_times *t = calloc(L, sizeof *t);
    int *start = malloc((L + 1) * sizeof *start), unused[L];
    if (!mem || !t || !start) {
        CHECK_MSG(false, "out of memory");
        return;
    }
    for (int k = 0; k < L; k++) {
        int q = k >= 1 && k <= NB * P ? (k - 1) % P : -1;
        snprintf(mem[k].spec, sizeof mem[k].spec, "%s",
                 k == 0 ? "embedding" : k == L - 2 ? "norm" : k == L - 1 ? "head"
                                                               : (const char *[]){"a", "b", "c", "d", "e", "f", "g"}[q]);
        double c = q == P - 1 ? 10 : 1;
        t[k].fwd = t[k].bwd_data = t[k].bwd_weights = c / 3;
        mem[k].keep_per_sample = 100;
        mem[k].param_bytes = 64;
    }
    gp_profile p = unit_profile(L, M, 4, mem, t, unused);
    int U = gp_profile_units(&p, start);
    bool ok = U == NB + 3 && start[0] == 0 && start[U] == L && start[U - 1] == L - 1 &&
              start[U - 2] == L - 2;
    for (int b = 0; ok && b < NB; b++) ok = start[1 + b] == 1 + b * P;
    CHECK_MSG(ok, "units of the blocked model: %d (want %d), starts %d %d %d .. %d %d %d", U,
              NB + 3, start[0], start[1], start[2], U > 2 ? start[U - 2] : -1,
              U > 1 ? start[U - 1] : -1, start[U]);
    bool is_start[L + 1];
    memset(is_start, 0, sizeof is_start);
    for (int u = 0; u <= U && U > 0; u++) is_start[start[u]] = true;
    for (int v = 0; v < 2; v++) {
        gp_plan_opts po = {.schedule = v ? GP_SCHEDULE_ZB_V : GP_SCHEDULE_1F1B, .n = 4, .m = M,
                           .checkpoint = GP_CKPT_NEVER, .by = GP_BALANCE_BY_TIME,
                           .virtual_stages = v ? 2 : 1, .v_shape = v, .lockstep = false,
                           .sim_kind = v ? GP_SCHEDULE_ZB_V : GP_SCHEDULE_1F1B};
        int bal[4] = {0};
        CHECK_OK(gp_balance_plan(&p, &po, bal));
        bool at = true;
        int sum = 0;
        for (int j = 0; j < 4; j++) {
            at = at && bal[j] > 0 && is_start[sum];
            sum += bal[j];
        }
        CHECK_MSG(at && sum == L, "%s's split [%d, %d, %d, %d] begins a stage inside a block",
                  v ? "zb-v" : "1f1b", bal[0], bal[1], bal[2], bal[3]);
    }
    p.L = 400; /* not long enough: every boundary a candidate */
    CHECK(gp_profile_units(&p, start) == 0);
    free(mem);
    free(t);
    free(start);
}

/* Two parts, two ctest entries (tests/CMakeLists.txt): "memory" compares
 * the planner's peaks with a step's measured ones, which move with the
 * threads' timing and need the machine to itself (RUN_SERIAL,
 * test_balance_memory); "rest" is everything else, single-threaded or
 * short, beside other tests (under ASan the random interleaved plans alone
 * were 22 s that kept the other core idle).  No argument: both. */
int main(int argc, char **argv)
{
    bool memory = argc < 2 || !strcmp(argv[1], "memory");
    bool rest = argc < 2 || !strcmp(argv[1], "rest");
    if (!memory && !rest) {
        fprintf(stderr, "usage: test_balance [memory|rest]\n");
        return 2;
    }
    gp_log_set_level(GP_LOG_WARN);
    if (memory) {
        test_schedule_memory(gpt_sanitizer() == GPT_SAN_THREAD);
        test_upload_ahead();
        test_late_reader();
    }
    if (!rest) return gpt_finish("test_balance");
    test_replica_batch();
    test_profile_search();
    test_profiler();
    test_profile_twins();
    /* The partitioner, planner and simulator checks run on one thread and
     * touch no device: ThreadSanitizer has nothing to check in them, and
     * under it they took most of test_balance's time (146 s of CI's TSan
     * stage, 2/3 of it the random interleaved plans).  The unsanitized and
     * AddressSanitizer stages run them; the TSan stage leaves them out. */
    if (gpt_sanitizer() != GPT_SAN_THREAD) {
        /* (its profiles run each layer on the devices' OpenMP threads,
         * which ThreadSanitizer cannot see synchronise: libgomp is not
         * instrumented) */
        test_profile_estimate();
        test_partition_bruteforce();
        test_partition_tiebreak_and_errors();
        test_partition_v();
        test_minmax_v_stages();
        test_simulator_formula();
        test_target_bytes();
        test_simulator_whole_backward();
        test_simulator_cache();
        test_keep_recompute_time();
        test_simulator_schedules();
        test_plan_interleaved();
        test_plan_interleaved_random();
        test_refine_memory();
        test_plan_units();
        test_skip_costs();
        test_stage_sums();
        test_chain_cuts();
        test_bf16_copy_memory();
        test_bf16_input_memory();
        test_inplace_costs();
        test_recommend_memory();
    } else {
        printf("test_balance: ThreadSanitizer: the partitioner, planner and simulator checks "
               "(one thread, no device) left to the unsanitized and AddressSanitizer runs\n");
    }
    test_simulator();
    return gpt_finish("test_balance");
}
