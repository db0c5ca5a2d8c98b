/*
 * schedule_file.c — schedules as text (schedule.h, "Schedules as data"):
 * PyTorch's per-rank action CSV read, checked and turned into the orders
 * gp_schedule_make places, and any schedule written back as one.
 *
 * The format (torch.distributed.pipelining, _dump_csv / _load_csv): one
 * row per rank (device), comma-separated actions in the order the rank
 * runs them, an action being STAGE KIND [MICRO-BATCH]: `0F3` (forward of
 * micro-batch 3 on stage 0), `1I0` (backward-data), `1W0` (backward-
 * weights), `1B0` (the whole backward), `0SEND_F3` / `1RECV_F3` (stage 0's
 * output of micro-batch 3 sent to stage 1, and received there), `1SEND_B0`
 * / `0RECV_B0` (a gradient, the other way).  Empty cells are nothing.
 * FSDP's UNSHARD, RESHARD, REDUCE_GRAD and the WAIT_ actions mean nothing
 * to gpipe (its stages hold their whole weights) and are passed over.
 *
 * The check (gp_schedule_file_read) is the whole of what a schedule must
 * be before anything runs: every micro-batch's forward once on every
 * stage and before its backward, every backward once, whole (B) or split
 * (I, then W), every stage on one rank, placed in loops (stage j on rank
 * j mod n) or in a V, every send matched by one receive of the right rank
 * after the computation that makes its data and before the one that
 * reads it, and no deadlock: the lists run with unbounded time, and where
 * they stop, the cycle of waits is named.  Every error names the file,
 * the rank and its line, the column and the action.
 */
#include "pipeline/schedule.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_BYTES ((size_t)64 << 20)

static const struct {
    const char *word;
    int kind; /* gp_sact_kind, or -1: passed over */
} k_words[] = {
    /* longest first: SEND_F before F */
    {"WAIT_REDUCE_GRAD", -1}, {"WAIT_SEND_F", -1},        {"WAIT_SEND_B", -1},
    {"REDUCE_GRAD", -1},      {"UNSHARD", -1},            {"RESHARD", -1},
    {"SEND_F", GP_SACT_SEND_F}, {"RECV_F", GP_SACT_RECV_F}, {"SEND_B", GP_SACT_SEND_B},
    {"RECV_B", GP_SACT_RECV_B}, {"F", GP_SACT_F},           {"I", GP_SACT_I},
    {"W", GP_SACT_W},           {"B", GP_SACT_B},
};

static const char *kind_word(int k)
{
    for (size_t q = 0; q < sizeof k_words / sizeof k_words[0]; q++)
        if (k_words[q].kind == k) return k_words[q].word;
    return "?";
}

void gp_sact_name(const gp_sact *a, char *buf, size_t len)
{
    snprintf(buf, len, "%d%s%d", a->stage, kind_word(a->kind), a->mb);
}

void gp_schedule_file_free(gp_schedule_file *f)
{
    if (!f) return;
    for (int r = 0; r < GP_MAX_DEVICES; r++) free(f->acts[r]);
    memset(f, 0, sizeof *f);
}

/* "FILE:LINE:COL: rank R: 'ACT': " into buf. */
static const char *at(const gp_schedule_file *f, const gp_sact *a, char *buf, size_t len)
{
    char nm[48];
    gp_sact_name(a, nm, sizeof nm);
    snprintf(buf, len, "%.300s:%d:%d: rank %d, '%s'", f->path, a->line, a->col, a->rank, nm);
    return buf;
}

/* One cell, cell[0 .. n), into *a (false: not an action). */
static bool parse_action(const char *cell, size_t n, gp_sact *a, bool *skip)
{
    *skip = false;
    size_t p = 0;
    long st = 0, mb = -1;
    if (p >= n || cell[p] < '0' || cell[p] > '9') return false;
    while (p < n && cell[p] >= '0' && cell[p] <= '9' && st <= 1000000) st = st * 10 + (cell[p++] - '0');
    for (size_t q = 0; q < sizeof k_words / sizeof k_words[0]; q++) {
        size_t k = strlen(k_words[q].word);
        if (n - p < k || strncmp(cell + p, k_words[q].word, k)) continue;
        size_t e = p + k;
        if (e < n) {
            mb = 0;
            while (e < n && cell[e] >= '0' && cell[e] <= '9' && mb <= 1000000)
                mb = mb * 10 + (cell[e++] - '0');
            if (e != n) return false;
        }
        if (k_words[q].kind < 0) {
            *skip = true;
            return true;
        }
        if (mb < 0 || st > 1000000 || mb > 1000000) return false;
        a->kind = (uint8_t)k_words[q].kind;
        a->stage = (int)st;
        a->mb = (int)mb;
        return true;
    }
    return false;
}

static gp_status read_text(const char *path, char **text, size_t *len)
{
    int r = gp_read_regular(path, MAX_BYTES, text, len);
    if (r > 0)
        return gp_error_set(GP_ERR_DATA, "the schedule '%s' is larger than %zu MiB: is it a "
                            "schedule?", path, MAX_BYTES >> 20);
    if (r < 0 && errno == ENOMEM)
        return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", path);
    if (r < 0) {
        int e = errno;
        char cwd[1024] = "";
        if (path[0] != '/' && e == ENOENT && getcwd(cwd, sizeof cwd))
            return gp_error_set(GP_ERR_IO, "cannot read the schedule '%s': %s (a relative path "
                                "is read from the working directory, %s, not the config's "
                                "folder)", path, gp_open_strerror(e), cwd);
        return gp_error_set(GP_ERR_IO, "cannot read the schedule '%s': %s", path,
                            gp_open_strerror(e));
    }
    return GP_OK;
}

/* A rank's row holds at most, for each of its stages (GP_MAX_DEVICES at
 * most) and micro-batches, F, I and W (or B) and the four sends and
 * receives. */
#define MAX_ROW (7 * GP_MAX_CHUNKS * GP_MAX_DEVICES)

static gp_status push(gp_schedule_file *f, int r, const gp_sact *a, int *cap)
{
    if (f->len[r] >= MAX_ROW)
        return gp_error_set(GP_ERR_DATA, "%s:%d:%d: rank %d: more than %d actions in one row "
                            "(%d micro-batches of %d stages with their sends and receives at "
                            "most): is it a schedule?", f->path, a->line, a->col, r, MAX_ROW,
                            GP_MAX_CHUNKS, GP_MAX_DEVICES);
    if (f->len[r] == cap[r]) {
        int nc = cap[r] ? 2 * cap[r] : 64;
        gp_sact *na = realloc(f->acts[r], (size_t)nc * sizeof *na);
        if (!na) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", f->path);
        f->acts[r] = na;
        cap[r] = nc;
    }
    f->acts[r][f->len[r]++] = *a;
    return GP_OK;
}

/* The rows and their actions, parsed. */
static gp_status parse_rows(gp_schedule_file *f, const char *text, size_t len)
{
    int cap[GP_MAX_DEVICES] = {0}, line = 1;
    const char *p = text, *end = text + len;
    if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) p += 3; /* a spreadsheet's byte-order mark */
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (le > p && le[-1] == '\r') le--;
        bool blank = true;
        for (const char *q = p; q < le; q++) blank = blank && (*q == ' ' || *q == '\t');
        if (!blank) {
            int r = f->n;
            if (r >= GP_MAX_DEVICES)
                return gp_error_set(GP_ERR_DATA, "%s:%d: more than %d rows (ranks); gpipe "
                                    "pipelines hold at most %d devices", f->path, line,
                                    GP_MAX_DEVICES, GP_MAX_DEVICES);
            f->n++;
            f->row_line[r] = line;
            const char *c = p;
            while (c <= le) {
                const char *ce = memchr(c, ',', (size_t)(le - c));
                if (!ce) ce = le;
                const char *a0 = c, *a1 = ce;
                while (a0 < a1 && (*a0 == ' ' || *a0 == '\t' || *a0 == '"' || *a0 == '\r')) a0++;
                while (a1 > a0 && (a1[-1] == ' ' || a1[-1] == '\t' || a1[-1] == '"' ||
                                   a1[-1] == '\r'))
                    a1--;
                /* DualPipe's overlapped pair, "(0F3;3B1)OVERLAP_F_B": its
                 * actions one after the other */
                const char *ov = "OVERLAP_F_B";
                size_t ol = strlen(ov);
                if (a1 - a0 > (ptrdiff_t)ol + 2 && *a0 == '(' && a1[-(ptrdiff_t)ol - 1] == ')' &&
                    !strncmp(a1 - ol, ov, ol)) {
                    const char *sub = a0 + 1, *send = a1 - ol - 1;
                    while (sub < send) {
                        const char *se = memchr(sub, ';', (size_t)(send - sub));
                        if (!se) se = send;
                        gp_sact a = {.rank = r, .line = line, .col = (int)(sub - p) + 1};
                        bool skip;
                        char q[200];
                        if (!parse_action(sub, (size_t)(se - sub), &a, &skip) || skip)
                            return gp_error_set(GP_ERR_DATA, "%s:%d:%d: rank %d: '%s' in an "
                                                "OVERLAP_F_B is not a forward or backward",
                                                f->path, line, a.col, r,
                                                gp_error_quote(sub, (size_t)(se - sub), 40, q,
                                                               sizeof q));
                        GP_TRY(push(f, r, &a, cap));
                        sub = se + 1;
                    }
                    c = ce + 1;
                    continue;
                }
                if (a1 > a0) {
                    gp_sact a = {.rank = r, .line = line, .col = (int)(a0 - p) + 1};
                    bool skip;
                    char q[200];
                    if (!parse_action(a0, (size_t)(a1 - a0), &a, &skip))
                        return gp_error_set(GP_ERR_DATA, "%s:%d:%d: rank %d: '%s' is not an "
                                            "action: STAGE then F, I, W, B, SEND_F, RECV_F, "
                                            "SEND_B or RECV_B then the micro-batch (PyTorch's "
                                            "`2F0`, `1I3`, `0SEND_F1`)", f->path, line, a.col, r,
                                            gp_error_quote(a0, (size_t)(a1 - a0), 40, q,
                                                           sizeof q));
                    if (!skip) GP_TRY(push(f, r, &a, cap));
                }
                c = ce + 1;
            }
        }
        line++;
        p = nl ? nl + 1 : end;
    }
    if (f->n == 0)
        return gp_error_set(GP_ERR_DATA, "the schedule '%s' has no rows: one row of actions per "
                            "rank (device)", f->path);
    return GP_OK;
}

enum { F_ = 0, B_, I_, W_, N_KINDS }; /* the computations, per (i, j) */

/* Where each computation of (i, j) stands in its rank's row, -1 none. */
typedef struct {
    int *pos; /* [((i * S) + j) * N_KINDS + kind] */
    int S, m;
} placed;

static int *cell(placed *pl, int i, int j, int k) { return &pl->pos[((size_t)i * pl->S + j) * N_KINDS + k]; }

static int comp_of(int kind)
{
    switch (kind) {
    case GP_SACT_F: return F_;
    case GP_SACT_B: return B_;
    case GP_SACT_I: return I_;
    case GP_SACT_W: return W_;
    default: return -1;
    }
}

/* The placement: each stage on one rank, in loops or a V. */
static gp_status check_placement(gp_schedule_file *f)
{
    int rank_of[GP_MAX_DEVICES];
    const gp_sact *first[GP_MAX_DEVICES] = {NULL};
    for (int j = 0; j < GP_MAX_DEVICES; j++) rank_of[j] = -1;
    int S = 0;
    for (int r = 0; r < f->n; r++)
        for (int q = 0; q < f->len[r]; q++) {
            const gp_sact *a = &f->acts[r][q];
            char w[400];
            if (a->stage >= GP_MAX_DEVICES)
                return gp_error_set(GP_ERR_DATA, "%s: stage %d; gpipe pipelines hold at most %d "
                                    "stages", at(f, a, w, sizeof w), a->stage, GP_MAX_DEVICES);
            if (comp_of(a->kind) < 0) continue;
            if (a->stage + 1 > S) S = a->stage + 1;
            if (rank_of[a->stage] < 0) {
                rank_of[a->stage] = r;
                first[a->stage] = a;
            } else if (rank_of[a->stage] != r) {
                char w2[400];
                return gp_error_set(GP_ERR_DATA, "%s: stage %d runs on rank %d here and on rank "
                                    "%d (%s): a stage lives on one rank",
                                    at(f, a, w, sizeof w), a->stage, r, rank_of[a->stage],
                                    at(f, first[a->stage], w2, sizeof w2));
            }
        }
    for (int j = 0; j < S; j++)
        if (rank_of[j] < 0) {
            char w[400];
            return gp_error_set(GP_ERR_DATA, "%s: stage %d, but no rank runs stage %d: every "
                                "stage 0 .. %d needs its forwards and backwards (is %d a stage "
                                "of this model?)", at(f, first[S - 1], w, sizeof w), S - 1, j,
                                S - 1, S - 1);
        }
    if (S == 0)
        return gp_error_set(GP_ERR_DATA, "%s: no computation (F, I, W or B) in any row",
                            f->path);
    if (S % f->n)
        return gp_error_set(GP_ERR_DATA, "%s: %d stages over %d ranks: each rank holds the same "
                            "number of stages", f->path, S, f->n);
    bool loop = true, v = S == 2 * f->n;
    for (int j = 0; j < S; j++) {
        loop = loop && rank_of[j] == j % f->n;
        v = v && rank_of[j] == gp_schedule_v_device(f->n, j);
    }
    if (!loop && !v) {
        int j = 0;
        while (j < S && rank_of[j] == j % f->n) j++;
        char w[400];
        return gp_error_set(GP_ERR_DATA, "%s: stage %d on rank %d: gpipe places stages in loops "
                            "(stage j on rank j mod %d, PyTorch's style \"loop\") or in a V "
                            "(2 per rank, rank d holding stages d and %d - d, style \"v\")",
                            at(f, first[j], w, sizeof w), j, rank_of[j], f->n, S - 1);
    }
    f->stages = S;
    f->v_shape = v && !loop;
    return GP_OK;
}

static int rank_at(const gp_schedule_file *f, int j)
{
    return f->v_shape ? gp_schedule_v_device(f->n, j) : j % f->n;
}

/* Each computation once, in order on its rank. */
static gp_status check_once(gp_schedule_file *f, placed *pl)
{
    int S = f->stages, m = 0;
    const gp_sact *last = NULL; /* the first computation naming the largest micro-batch */
    for (int r = 0; r < f->n; r++) /* (the computations': a send's is checked against it) */
        for (int q = 0; q < f->len[r]; q++)
            if (comp_of(f->acts[r][q].kind) >= 0 && f->acts[r][q].mb + 1 > m) {
                m = f->acts[r][q].mb + 1;
                last = &f->acts[r][q];
            }
    if (m > GP_MAX_CHUNKS)
        return gp_error_set(GP_ERR_DATA, "%s: micro-batch %d; at most %d micro-batches", f->path,
                            m - 1, GP_MAX_CHUNKS);
    f->m = m;
    pl->S = S;
    pl->m = m;
    pl->pos = malloc((size_t)m * S * N_KINDS * sizeof *pl->pos);
    if (!pl->pos) return gp_error_set(GP_ERR_OOM, "out of host memory checking '%s'", f->path);
    for (size_t q = 0; q < (size_t)m * S * N_KINDS; q++) pl->pos[q] = -1;
    for (int r = 0; r < f->n; r++)
        for (int q = 0; q < f->len[r]; q++) {
            const gp_sact *a = &f->acts[r][q];
            int k = comp_of(a->kind);
            if (k < 0) continue;
            int *c = cell(pl, a->mb, a->stage, k);
            char w[400], w2[400];
            if (*c >= 0)
                return gp_error_set(GP_ERR_DATA, "%s: a second time (the first: %s)",
                                    at(f, a, w, sizeof w), at(f, &f->acts[r][*c], w2, sizeof w2));
            *c = q;
            if (k == I_ || k == B_ || k == W_) {
                int fw = *cell(pl, a->mb, a->stage, F_);
                if (fw < 0)
                    return gp_error_set(GP_ERR_DATA, "%s: a backward before the forward of "
                                        "micro-batch %d on stage %d (a backward reads what its "
                                        "forward kept)", at(f, a, w, sizeof w), a->mb, a->stage);
            }
            if (k == W_ && *cell(pl, a->mb, a->stage, I_) < 0)
                return gp_error_set(GP_ERR_DATA, "%s: backward-weights before the backward-data "
                                    "of micro-batch %d on stage %d (%dI%d: W reads the gradient "
                                    "I makes)", at(f, a, w, sizeof w), a->mb, a->stage, a->stage,
                                    a->mb);
            if (k == B_ && *cell(pl, a->mb, a->stage, I_) >= 0)
                return gp_error_set(GP_ERR_DATA, "%s: a whole backward of micro-batch %d on "
                                    "stage %d, which also has a backward-data (I): give B, or I "
                                    "and W", at(f, a, w, sizeof w), a->mb, a->stage);
            if (k == I_ && *cell(pl, a->mb, a->stage, B_) >= 0)
                return gp_error_set(GP_ERR_DATA, "%s: a backward-data of micro-batch %d on "
                                    "stage %d, which also has a whole backward (B): give B, or "
                                    "I and W", at(f, a, w, sizeof w), a->mb, a->stage);
        }
    for (int i = 0; i < m; i++) {
        bool named = false; /* by any computation: numbering with a gap is a typo's mark */
        for (int j = 0; j < S; j++)
            for (int k = 0; k < N_KINDS; k++) named |= *cell(pl, i, j, k) >= 0;
        char w[400];
        if (!named)
            return gp_error_set(GP_ERR_DATA, "%s: micro-batch %d, where no computation names "
                                "micro-batch %d: micro-batches are numbered 0 .. m-1 with none "
                                "left out (a mistyped number?)", at(f, last, w, sizeof w),
                                last->mb, i);
        for (int j = 0; j < S; j++) {
            int fw = *cell(pl, i, j, F_), b = *cell(pl, i, j, B_), ii = *cell(pl, i, j, I_),
                ww = *cell(pl, i, j, W_);
            int r = rank_at(f, j); /* (placed: check_placement) */
            const char *what = fw < 0 ? "forward (F)"
                               : b < 0 && ii < 0 ? "backward (B, or I and W)"
                               : ii >= 0 && ww < 0 ? "backward-weights (W) after its I"
                                                   : NULL;
            if (what)
                return gp_error_set(GP_ERR_DATA, "%s:%d: rank %d has no %s of micro-batch %d on "
                                    "stage %d: every micro-batch 0 .. %d passes every stage",
                                    f->path, f->row_line[r], r, what, i, j, m - 1);
            if (ii >= 0) f->split = true;
        }
    }
    return GP_OK;
}

/* Sends and receives, where the file has them: one of each for every
 * micro-batch's crossing between two ranks, each where its data is made
 * and read. */
static gp_status check_comms(gp_schedule_file *f, placed *pl)
{
    int S = f->stages, m = f->m;
    int rank_of[GP_MAX_DEVICES];
    for (int j = 0; j < S; j++)
        rank_of[j] = f->v_shape ? gp_schedule_v_device(f->n, j) : j % f->n;
    size_t cells = (size_t)m * S * 4;
    int *cm = malloc(cells * sizeof *cm); /* [(i S + j) 4 + SEND_F/RECV_F/SEND_B/RECV_B] */
    if (!cm) return gp_error_set(GP_ERR_OOM, "out of host memory checking '%s'", f->path);
    for (size_t q = 0; q < cells; q++) cm[q] = -1;
    gp_status s = GP_OK;
    char w[400], w2[400];
    for (int r = 0; r < f->n && s == GP_OK; r++)
        for (int q = 0; q < f->len[r] && s == GP_OK; q++) {
            const gp_sact *a = &f->acts[r][q];
            if (comp_of(a->kind) >= 0) continue;
            f->has_comms = true;
            int j = a->stage, i = a->mb, k = a->kind - GP_SACT_SEND_F;
            bool fwd = a->kind == GP_SACT_SEND_F || a->kind == GP_SACT_RECV_F;
            bool send = a->kind == GP_SACT_SEND_F || a->kind == GP_SACT_SEND_B;
            int peer = fwd ? (send ? j + 1 : j - 1) : (send ? j - 1 : j + 1);
            if (j >= S) {
                s = gp_error_set(GP_ERR_DATA, "%s: no stage %d: the computations name stages 0 "
                                 ".. %d", at(f, a, w, sizeof w), j, S - 1);
                break;
            }
            if (i >= m) {
                s = gp_error_set(GP_ERR_DATA, "%s: no micro-batch %d: the computations name "
                                 "micro-batches 0 .. %d", at(f, a, w, sizeof w), i, m - 1);
                break;
            }
            if (peer < 0 || peer >= S) {
                s = gp_error_set(GP_ERR_DATA, "%s: no stage %d for it to %s",
                                 at(f, a, w, sizeof w), peer, send ? "go to" : "come from");
                break;
            }
            if (rank_of[j] != r) {
                s = gp_error_set(GP_ERR_DATA, "%s: stage %d runs on rank %d, not here",
                                 at(f, a, w, sizeof w), j, rank_of[j]);
                break;
            }
            if (rank_of[peer] == r) {
                s = gp_error_set(GP_ERR_DATA, "%s: stages %d and %d are both on rank %d: nothing "
                                 "to send between them", at(f, a, w, sizeof w), j, peer, r);
                break;
            }
            int *c = &cm[((size_t)i * S + j) * 4 + k];
            if (*c >= 0) {
                s = gp_error_set(GP_ERR_DATA, "%s: a second time (the first: %s)",
                                 at(f, a, w, sizeof w), at(f, &f->acts[r][*c], w2, sizeof w2));
                break;
            }
            *c = q;
            /* where: a send after what makes its data, a receive before what reads it */
            int mk = fwd ? *cell(pl, i, j, F_) : (*cell(pl, i, j, I_) >= 0 ? *cell(pl, i, j, I_)
                                                                         : *cell(pl, i, j, B_));
            if (send && (mk < 0 || mk > q))
                s = gp_error_set(GP_ERR_DATA, "%s: sent before the %s that makes it",
                                 at(f, a, w, sizeof w), fwd ? "forward" : "backward");
            if (!send && mk >= 0 && mk < q)
                s = gp_error_set(GP_ERR_DATA, "%s: received after the %s that reads it (%s)",
                                 at(f, a, w, sizeof w), fwd ? "forward" : "backward",
                                 at(f, &f->acts[r][mk], w2, sizeof w2));
        }
    for (int i = 0; i < m && s == GP_OK && f->has_comms; i++)
        for (int j = 0; j < S && s == GP_OK; j++) {
            /* forward j -> j + 1 and backward j + 1 -> j across ranks */
            if (j + 1 >= S || rank_of[j] == rank_of[j + 1]) continue;
            int sf = cm[((size_t)i * S + j) * 4 + 0], rf = cm[((size_t)i * S + j + 1) * 4 + 1];
            int sb = cm[((size_t)i * S + j + 1) * 4 + 2], rb = cm[((size_t)i * S + j) * 4 + 3];
            if (sf < 0 || rf < 0 || sb < 0 || rb < 0) {
                /* the first missing one's rank: SEND_F and RECV_B are stage
                 * j's, RECV_F and SEND_B stage j + 1's */
                int r = sf < 0 ? rank_of[j] : rf < 0 || sb < 0 ? rank_of[j + 1] : rank_of[j];
                s = gp_error_set(GP_ERR_DATA, "%s:%d: rank %d has no %s: micro-batch %d crosses "
                                 "from stage %d (rank %d) to stage %d (rank %d), so each rank "
                                 "needs its send and its receive, both ways (or leave every send "
                                 "and receive out: gpipe adds them)", f->path, f->row_line[r], r,
                                 sf < 0 ? "SEND_F" : rf < 0 ? "RECV_F" : sb < 0 ? "SEND_B"
                                                                             : "RECV_B",
                                 i, j, rank_of[j], j + 1, rank_of[j + 1]);
            }
        }
    free(cm);
    return s;
}

/* The index of rank r's action (kind, stage j, micro-batch i), or -1. */
static int find_act(const gp_schedule_file *f, int r, int kind, int j, int i)
{
    for (int q = 0; r >= 0 && q < f->len[r]; q++)
        if (f->acts[r][q].kind == kind && f->acts[r][q].stage == j && f->acts[r][q].mb == i)
            return q;
    return -1;
}

/* The rows run with unbounded time: each computation once its input is
 * there (a forward the previous stage's forward, a backward the next
 * stage's, or the loss's forward on the last stage; a receive its send).
 * Where none can go on, the cycle of waits. */
static gp_status check_deadlock(gp_schedule_file *f, placed *pl)
{
    int S = f->stages, n = f->n, pc[GP_MAX_DEVICES] = {0};
    bool *fin[GP_MAX_DEVICES] = {NULL}; /* per rank, per action: run */
    gp_status s = GP_OK;
    for (int r = 0; r < n; r++) {
        fin[r] = calloc((size_t)f->len[r] + 1, 1);
        if (!fin[r]) s = gp_error_set(GP_ERR_OOM, "out of host memory checking '%s'", f->path);
    }
    /* where (rank, index) the action a waits for is, or -1: none */
#define DEP(a, rr, qq)                                                                      \
    do {                                                                                    \
        rr = qq = -1;                                                                       \
        int k_ = comp_of((a)->kind), j_ = (a)->stage, i_ = (a)->mb;                         \
        if (k_ == F_ && j_ > 0) {                                                           \
            qq = *cell(pl, i_, j_ - 1, F_);                                                 \
            rr = rank_at(f, j_ - 1);                                                        \
        } else if ((k_ == B_ || k_ == I_) && j_ < S - 1) {                                    \
            qq = *cell(pl, i_, j_ + 1, I_) >= 0 ? *cell(pl, i_, j_ + 1, I_)                 \
                                                : *cell(pl, i_, j_ + 1, B_);                \
            rr = rank_at(f, j_ + 1);                                                        \
        } else if ((a)->kind == GP_SACT_RECV_F || (a)->kind == GP_SACT_RECV_B) {            \
            bool fw_ = (a)->kind == GP_SACT_RECV_F;                                         \
            int pj_ = fw_ ? j_ - 1 : j_ + 1;                                                \
            rr = rank_at(f, pj_);                                                           \
            qq = find_act(f, rr, fw_ ? GP_SACT_SEND_F : GP_SACT_SEND_B, pj_, i_);           \
        }                                                                                   \
    } while (0)
    int left = 0;
    for (int r = 0; r < n; r++) left += f->len[r];
    while (s == GP_OK && left > 0) {
        bool moved = false;
        for (int r = 0; r < n; r++)
            while (pc[r] < f->len[r]) {
                const gp_sact *a = &f->acts[r][pc[r]];
                int rr, qq;
                DEP(a, rr, qq);
                if (rr >= 0 && qq >= 0 && !fin[rr][qq]) break;
                fin[r][pc[r]++] = true;
                left--;
                moved = true;
            }
        if (moved) continue;
        /* stuck: follow the waits from rank 0's (or the first stuck) */
        int r = 0;
        while (pc[r] >= f->len[r]) r++;
        int seen[GP_MAX_DEVICES], order[GP_MAX_DEVICES], n_order = 0;
        for (int q = 0; q < n; q++) seen[q] = -1;
        while (seen[r] < 0) {
            seen[r] = n_order;
            order[n_order++] = r;
            const gp_sact *a = &f->acts[r][pc[r]];
            int rr, qq;
            DEP(a, rr, qq);
            r = rr;
        }
        char msg[1800];
        int off = 0;
        for (int k = seen[r]; k < n_order && off < (int)sizeof msg - 400; k++) {
            int q = order[k], nq = order[k + 1 < n_order ? k + 1 : seen[r]];
            const gp_sact *a = &f->acts[q][pc[q]];
            int rr, qq;
            DEP(a, rr, qq);
            char w[400], nm[48], bl[48];
            gp_sact_name(&f->acts[rr][qq], nm, sizeof nm);
            gp_sact_name(&f->acts[nq][pc[nq]], bl, sizeof bl);
            off += snprintf(msg + off, sizeof msg - (size_t)off, "%s%s waits for '%s' on rank %d, "
                            "which is held up before it at '%s' (column %d)", k > seen[r] ? "; " : "",
                            at(f, a, w, sizeof w), nm, rr, bl, f->acts[nq][pc[nq]].col);
        }
        s = gp_error_set(GP_ERR_DATA, "the schedule deadlocks: %s", msg);
    }
#undef DEP
    for (int r = 0; r < n; r++) free(fin[r]);
    return s;
}

gp_status gp_schedule_file_read(const char *path, int n_devices, gp_schedule_file *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    char *text = NULL;
    size_t len = 0;
    GP_TRY(read_text(path, &text, &len));
    placed pl = {0};
    gp_status s = parse_rows(out, text, len);
    free(text);
    if (s == GP_OK && out->n != n_devices)
        s = gp_error_set(GP_ERR_DATA, "the schedule '%s' has %d row%s (ranks) but "
                         "pipeline.devices lists %d device%s: one row per device", path, out->n,
                         out->n == 1 ? "" : "s", n_devices, n_devices == 1 ? "" : "s");
    if (s == GP_OK) s = check_placement(out);
    if (s == GP_OK) s = check_once(out, &pl);
    if (s == GP_OK) s = check_comms(out, &pl);
    if (s == GP_OK) s = check_deadlock(out, &pl);
    free(pl.pos);
    if (s != GP_OK) gp_schedule_file_free(out);
    if (s == GP_OK) snprintf(out->path, sizeof out->path, "%s", path);
    return s;
}

/* A receive or send of the file's format: stage j's, micro-batch i. */
static void put(FILE *fp, bool *first, int j, const char *kind, int i)
{
    fprintf(fp, "%s%d%s%d", *first ? "" : ",", j, kind, i);
    *first = false;
}

/* A send whose wait is still to be written: forward (SEND_F) or not. */
typedef struct {
    bool fwd;
    int j, i;
} send_wait;

/* The wait of each send, where PyTorch's _add_wait_send puts it (its
 * compute_comms reader refuses a send without one): a forward's send after
 * the rank's backward of the same stage and micro-batch, the others at the
 * row's end, in the order sent. */
static void put_wait(FILE *fp, bool *first, send_wait *w, int *n, bool fwd, int j, int i)
{
    for (int q = 0; q < *n; q++)
        if (w[q].fwd == fwd && w[q].j == j && w[q].i == i) {
            put(fp, first, j, fwd ? "WAIT_SEND_F" : "WAIT_SEND_B", i);
            memmove(w + q, w + q + 1, (size_t)(*n - q - 1) * sizeof *w);
            (*n)--;
            return;
        }
}

gp_status gp_schedule_write_csv(const gp_schedule *s, const char *path)
{
    gp_atomic_file a;
    GP_TRY(gp_atomic_open(path, &a));
    FILE *fp = a.f;
    int most = 1;
    for (int d = 0; d < s->n; d++) most = s->count[d] > most ? s->count[d] : most;
    send_wait *w = malloc((size_t)most * sizeof *w);
    if (!w) {
        gp_atomic_abort(&a);
        return gp_error_set(GP_ERR_OOM, "out of host memory writing the schedule");
    }
    for (int d = 0; d < s->n; d++) {
        bool first = true;
        int nw = 0;
        for (int c = 0; c < s->count[d]; c++) {
            const gp_instr *in = &s->list[d][c];
            int i = in->i, j = in->j;
            bool other_prev = j > 0 && s->dev_of[j - 1] != d;
            bool other_next = j + 1 < s->stages && s->dev_of[j + 1] != d;
            switch (in->kind) {
            case GP_INSTR_RECV_ACT:
                if (s->dev_of[in->from] != d) put(fp, &first, j, "RECV_F", i);
                break;
            case GP_INSTR_RECV_GRAD:
                if (s->dev_of[in->from] != d) put(fp, &first, j, "RECV_B", i);
                break;
            case GP_INSTR_FORWARD:
                put(fp, &first, j, "F", i);
                if (other_next) {
                    put(fp, &first, j, "SEND_F", i);
                    w[nw++] = (send_wait){true, j, i};
                }
                break;
            case GP_INSTR_BACKWARD:
            case GP_INSTR_BACKWARD_DATA:
                put(fp, &first, j, in->kind == GP_INSTR_BACKWARD ? "B" : "I", i);
                put_wait(fp, &first, w, &nw, true, j, i);
                if (other_prev) {
                    put(fp, &first, j, "SEND_B", i);
                    w[nw++] = (send_wait){false, j, i};
                }
                break;
            case GP_INSTR_BACKWARD_WEIGHTS: put(fp, &first, j, "W", i); break;
            default: break; /* recomputes, skips' copies, the end of the step: gpipe's own */
            }
        }
        while (nw > 0) put_wait(fp, &first, w, &nw, w[0].fwd, w[0].j, w[0].i);
        fputc('\n', fp);
    }
    free(w);
    gp_status st = gp_atomic_commit(&a, ferror(fp) ? (errno ? errno : EIO) : 0);
    if (st != GP_OK) gp_error_wrap(st, "writing the schedule");
    return st;
}
