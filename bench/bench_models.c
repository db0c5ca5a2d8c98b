/*
 * bench_models — torchgpipe's benchmark suite (its docs/benchmarks.rst) on
 * the models it is measured on, at sizes this machine can run:
 *
 *   speed:  throughput of a model on one device without pipelining
 *           (baseline: m = 1, no checkpointing, the single-device step) and
 *           with pipeline-k, k in {1, 2, 4, 8}: k CPU devices x 1 thread,
 *           m = 8, except_last checkpointing, the balance `balance: auto`
 *           picks (profiled); then pipeline-1 and -2 without
 *           recomputation, and pipeline-2 free-running on each schedule
 *           (gpipe, 1f1b, zb-h1, interleaved with v = 2); speed-up against
 *           the baseline;
 *   memory: the largest model of a family that trains one step on k CPU
 *           devices of a fixed capacity each, k in {1, 2, 4, 8}, with the
 *           baseline (1 device, m = 1, no checkpointing) beside them:
 *           for each of the family's first sizes a binary search over the
 *           second, the largest by parameters kept; each size tried with the memory-only profile, the planner's balance
 *           under the capacities (`gpipe-balance --by size`), and one
 *           pipelined step (always checkpointing, m = 8); it fits if both
 *           succeed.
 *
 * usage: bench_models speed  [--model amoebanet|resnet|unet] [--steps N]
 *        bench_models memory [--model amoebanet|unet|gpt|llama] [--capacity MiB]
 *                            [--schedule gpipe|1f1b|zb-h1] [--copies fp32|bf16]
 *                            [--first LIST] [--pipelines LIST] (the grid's first
 *                            sizes, e.g. 1-12; the rows, e.g. 1,4; --help)
 *                            [--checkpoint always|except_last|never]
 *                            [--plan-only] (the planner's count alone: no step)
 * Prints markdown tables with the processor; never fails a build.  On this
 * 2-core machine k > 2 devices share the cores: the speed table says so.
 */
#include "balance/balance.h"
#include "config/config.h"
#include "pipeline/pipeline.h"
#include "train/train.h"

#include "bench_util.h"
#include <stdlib.h>
#include <string.h>

/* ---- models ------------------------------------------------------------------ */

enum { AGRID = 24 }; /* first sizes of the memory grid, at most */

typedef struct {
    const char *name;   /* --model */
    const char *label;  /* for tables */
    int64_t side;       /* input height = width (speed) */
    int64_t batch;      /* (speed) */
    int64_t mside, mbatch; /* the same for the memory benchmark */
    const char *model;  /* the model: section's family line, "%d" "%d" for its two sizes */
    int a, b;           /* the speed benchmark's sizes */
    const char *sizes;  /* what (a, b) are called: "(L, D)" */
    int agrid[AGRID];   /* the memory benchmark's a values (0 ends), */
    int b_lo, b_step, b_hi; /* and b values */
} family;

static const family k_families[] = {
    {"amoebanet", "AmoebaNet-D", 64, 64, 64, 16,
     "amoebanet: {layers: %d, filters: %d, classes: 10}", 6, 64,
     "(L, D)", {3, 6, 9, 12, 18, 24, 36, 48}, 16, 16, 256},
    {"resnet", "ResNet", 64, 32, 64, 8, "resnet: {depth: %d, classes: 10%.0d}", 50, 0,
     "(depth, -)", {0}, 0, 1, 0},
    /* U-Net (B, C): B convolutions per cell, C channels at the top level,
     * depth 5 as torchgpipe's; 64x64 leaves its bottleneck 4x4 */
    {"unet", "U-Net", 64, 32, 64, 8,
     "unet: {depth: 5, num_convs: %d, base: %d}\n  loss: bce_with_logits", 2, 16,
     "(B, C)", {1, 2, 3, 4, 5, 6, 8, 10, 12}, 8, 8, 128},
    /* GPT-2 (L, C): L blocks of width C (heads of 64, as GPT-2's), its
     * 50,257-token vocabulary and tied LM head; side is T, the tokens of a
     * sequence (128 here, GPT-2's 1024 with --side); the memory grid
     * searches depth at GPT-2 small's width */
    {"gpt", "GPT-2", 128, 8, 128, 8, "", 12, 768, "(L, C)",
     {1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192}, 768, 64, 768},
    /* Llama (L, C) (issue 66): L blocks of width C, heads of 64 with a
     * quarter as many k/v heads (Llama 3's 32 over 8), an MLP of 8/3 C
     * rounded up to 256 (Llama's rule), the 32,000-token vocabulary of
     * Llama 2 and TinyLlama, the head tied; T = 128 */
    {"llama", "Llama", 128, 8, 128, 8, "", 12, 768, "(L, C)",
     {1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192}, 768, 64, 768},
};

static bool is_gpt(const family *f) { return !strcmp(f->name, "gpt"); }
static bool is_llama(const family *f) { return !strcmp(f->name, "llama"); }

static const family *find_family(const char *name)
{
    for (size_t q = 0; q < sizeof k_families / sizeof *k_families; q++)
        if (!strcmp(k_families[q].name, name)) return &k_families[q];
    return NULL;
}

/* The memory benchmark's training setup: micro-batches and checkpointing
 * of the pipelines, and the optimizer.  Defaults: m = 8, `always`, SGD
 * with momentum 0.9; --as-torchgpipe: torchgpipe's unet-memory script
 * (m = 32, `except_last`, its GPipe default, and SGD without momentum). */
static struct {
    int chunks;
    gp_checkpoint_mode ckpt;
    double lr, momentum;
    bool bf16_copies; /* --copies bf16: pipeline.copy_precision */
    bool plan_only;   /* --plan-only: the planner's count decides, no step is run */
} g_mem = {8, GP_CKPT_ALWAYS, 0.01, 0.9, false, false};

static gp_status family_cfg(const family *f, int a, int b, bool mem, gp_config *c)
{
    int64_t side = mem ? f->mside : f->side, batch = mem ? f->mbatch : f->batch;
    double lr = mem ? g_mem.lr : 0.01, mu = mem ? g_mem.momentum : 0.9;
    char model[160], text[1024];
    if (is_gpt(f)) { /* token ids in, a class per position out */
        snprintf(text, sizeof text,
                 "model:\n  input: [%lld]\n"
                 "  gpt: {layers: %d, width: %d, heads: %d, positions: %lld, vocab: 50257}\n"
                 "data: {dataset: synthetic, synthetic: {train: %lld, test: 8, classes: 50257, "
                 "shape: [%lld]}}\n"
                 "train: {batch_size: %lld, seed: 1, optimizer: {lr: %g, momentum: %g}}\n",
                 (long long)side, a, b, b / 64 > 0 ? b / 64 : 1, (long long)side,
                 (long long)batch, (long long)side, (long long)batch, lr, mu);
        return gp_config_parse("bench_models.yaml", text, strlen(text), NULL, 0, c);
    }
    if (is_llama(f)) {
        int heads = b / 64 > 0 ? b / 64 : 1, kv = heads % 4 == 0 ? heads / 4 : heads;
        int inter = (8 * b / 3 + 255) / 256 * 256;
        snprintf(text, sizeof text,
                 "model:\n  input: [%lld]\n"
                 "  llama: {layers: %d, width: %d, heads: %d, kv_heads: %d, intermediate: %d, "
                 "vocab: 32000, positions: %lld, tie: true}\n"
                 "data: {dataset: synthetic, synthetic: {train: %lld, test: 8, classes: 32000, "
                 "shape: [%lld]}}\n"
                 "train: {batch_size: %lld, seed: 1, optimizer: {lr: %g, momentum: %g}}\n",
                 (long long)side, a, b, heads, kv, inter, (long long)side, (long long)batch,
                 (long long)side, (long long)batch, lr, mu);
        return gp_config_parse("bench_models.yaml", text, strlen(text), NULL, 0, c);
    }
    snprintf(model, sizeof model, f->model, a, b);
    snprintf(text, sizeof text,
             "model:\n  input: [3, %lld, %lld]\n  %s\n"
             "data: {dataset: synthetic, synthetic: {train: %lld, test: 8, classes: 10}}\n"
             "train: {batch_size: %lld, seed: 1, optimizer: {lr: %g, momentum: %g}}\n",
             (long long)side, (long long)side, model, (long long)batch, (long long)batch, lr, mu);
    return gp_config_parse("bench_models.yaml", text, strlen(text), NULL, 0, c);
}

/* ---- speed -------------------------------------------------------------------- */

/* Median samples per second over `steps` steps after one warm-up; k = 0:
 * the baseline (one device, the single-device step, m = 1). */
static gp_status throughput(const gp_config *base, int k, gp_checkpoint_mode ck,
                            gp_schedule_kind sched, bool lockstep, int steps, double *out)
{
    gp_config cfg = *base;
    int n = k ? k : 1;
    gp_bench_cpu_devices(&cfg, n);
    cfg.pipeline.chunks = k ? 8 : 1;
    cfg.pipeline.checkpoint = k ? ck : GP_CKPT_NEVER;
    cfg.pipeline.n_balance = 0;
    cfg.pipeline.schedule = sched;
    cfg.pipeline.lockstep = lockstep;
    if (sched == GP_SCHEDULE_INTERLEAVED) cfg.pipeline.virtual_stages = 2;
    gp_device *devs[GP_MAX_DEVICES];
    gp_model model;
    GP_TRY(gp_train_open(&cfg, devs, &model, true));
    int64_t b = cfg.train.batch_size;
    float *x, *y;
    gp_bench_model_batch(&model, b, &x, &y);
    double *ts = malloc((size_t)(steps + 1) * sizeof *ts);
    gp_status s = GP_OK;
    for (int it = 0; it <= steps && s == GP_OK; it++) {
        gp_step_stats st;
        double t0 = gp_now();
        s = k ? gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, &st)
              : gp_model_train_step(&model, &cfg, x, y, b, 1, 0.001, &st);
        if (it) ts[it - 1] = gp_now() - t0;
    }
    if (s == GP_OK) *out = (double)b / gp_bench_median(ts, steps);
    free(ts);
    free(x);
    free(y);
    gp_model_free(&model);
    for (int j = 0; j < n; j++) gp_device_close(devs[j]);
    return s;
}

static int speed(const family *f, int steps)
{
    gp_config c;
    if (family_cfg(f, f->a, f->b, false, &c) != GP_OK) {
        fprintf(stderr, "bench_models: %s\n", gp_last_error());
        return 1;
    }
    char cpu[256];
    gp_bench_cpu_name(cpu, sizeof cpu);
    char size[48];
    if (f->b) snprintf(size, sizeof size, " (%d, %d)", f->a, f->b);
    else snprintf(size, sizeof size, "-%d", f->a);
    printf("%s%s, %lldx%lld, batch %lld; %s; median of %d steps\n\n", f->label, size,
           (long long)f->side, (long long)f->side, (long long)f->batch, cpu, steps);
    printf("| experiment | devices x threads | m | checkpoint | schedule | samples/s | speed-up |\n"
           "|---|---|---|---|---|---|---|\n");
    double base = 0;
    /* torchgpipe's rows (except_last, GPipe's fill-drain), then pipeline-1
     * and -2 without recomputation, then pipeline-2 on the later schedules
     * (issue 16), which shrink the bubble fill-drain leaves; "free" is
     * lockstep: false */
    static const struct {
        int k;
        gp_checkpoint_mode ck;
        gp_schedule_kind sched;
        bool lockstep;
    } rows[] = {{0, GP_CKPT_NEVER, GP_SCHEDULE_GPIPE, true},
                {1, GP_CKPT_EXCEPT_LAST, GP_SCHEDULE_GPIPE, true},
                {2, GP_CKPT_EXCEPT_LAST, GP_SCHEDULE_GPIPE, true},
                {4, GP_CKPT_EXCEPT_LAST, GP_SCHEDULE_GPIPE, true},
                {8, GP_CKPT_EXCEPT_LAST, GP_SCHEDULE_GPIPE, true},
                {1, GP_CKPT_NEVER, GP_SCHEDULE_GPIPE, true},
                {2, GP_CKPT_NEVER, GP_SCHEDULE_GPIPE, true},
                {2, GP_CKPT_NEVER, GP_SCHEDULE_GPIPE, false},
                {2, GP_CKPT_NEVER, GP_SCHEDULE_1F1B, false},
                {2, GP_CKPT_NEVER, GP_SCHEDULE_ZB_H1, false},
                {2, GP_CKPT_NEVER, GP_SCHEDULE_INTERLEAVED, false}};
    static const char *const ck_names[] = {"always", "except_last", "never"};
    for (size_t q = 0; q < sizeof rows / sizeof *rows; q++) {
        int k = rows[q].k;
        double r = 0;
        gp_status s = throughput(&c, k, rows[q].ck, rows[q].sched, rows[q].lockstep, steps, &r);
        if (k == 0) base = r;
        char name[32];
        if (k) snprintf(name, sizeof name, "pipeline-%d", k);
        else snprintf(name, sizeof name, "baseline");
        char sched[48] = "-";
        if (k) snprintf(sched, sizeof sched, "%s%s%s", gp_schedule_kind_name(rows[q].sched),
                        rows[q].sched == GP_SCHEDULE_INTERLEAVED ? " (v = 2)" : "",
                        rows[q].lockstep ? "" : ", free");
        if (s != GP_OK) printf("| %s | %d x 1 | %d | %s | %s | failed: %s | |\n", name,
                               k ? k : 1, k ? 8 : 1, ck_names[rows[q].ck], sched, gp_last_error());
        else printf("| %s | %d x 1%s | %d | %s | %s | %.2f | %.3fx |\n", name, k ? k : 1,
                    k > 2 ? " (on 2 cores)" : "", k ? 8 : 1, k ? ck_names[rows[q].ck] : "-",
                    sched, r, base > 0 ? r / base : 0);
        fflush(stdout);
    }
    gp_config_free(&c);
    return 0;
}

/* ---- memory ------------------------------------------------------------------- */

typedef struct {
    int a, b;
    int64_t params;
} candidate;

/* Whether the model trains one step on k devices of `cap` bytes each (k =
 * 0: the baseline on one), the pipelines on schedule `sched`.  With
 * --plan-only the planner's count alone decides, for one device too (a
 * stage of the whole model; the baseline as one stage at m = 1 without
 * checkpointing): no weights are allocated and no step is run, so a fine
 * grid takes minutes instead of hours.  The planner's peaks are within 2%
 * of a real step's either way on U-Net at 192x192 (bench/README.md), so a
 * size it admits within that of the capacity may still fail a step: the
 * real run decides what the tables record. */
static bool fits(const gp_config *base, int k, size_t cap, gp_schedule_kind sched)
{
    gp_config cfg = *base;
    int n = k ? k : 1;
    gp_bench_cpu_devices(&cfg, n);
    for (int j = 0; j < n; j++) cfg.pipeline.devices[j].memory = cap;
    cfg.pipeline.chunks = k ? g_mem.chunks : 1;
    cfg.pipeline.checkpoint = k ? g_mem.ckpt : GP_CKPT_NEVER;
    cfg.pipeline.schedule = k ? sched : GP_SCHEDULE_GPIPE;
    cfg.pipeline.copy_precision = g_mem.bf16_copies ? GP_COPY_BF16 : GP_COPY_FP32;
    cfg.pipeline.n_balance = 1;
    cfg.pipeline.balance[0] = cfg.model.n_layers;
    if (n > 1 || g_mem.plan_only) { /* the planner's memory balance under the capacities */
        gp_profile p;
        gp_model_profile_opts po = {.timed = false, .threads = 1};
        if (gp_model_profile(&cfg, &po, &p) != GP_OK) return false;
        gp_plan_opts o;
        gp_model_plan_opts(&cfg, n, &o);
        o.by = GP_BALANCE_BY_SIZE;
        gp_status s = gp_balance_plan(&p, &o, cfg.pipeline.balance);
        gp_profile_free(&p);
        if (s != GP_OK) return false;
        cfg.pipeline.n_balance = n;
        if (g_mem.plan_only) return true;
    }
    gp_device *devs[GP_MAX_DEVICES];
    gp_model model;
    gp_status so = gp_train_open(&cfg, devs, &model, true);
    if (so != GP_OK) {
        if (so != GP_ERR_OOM) fprintf(stderr, "bench_models: %s\n", gp_last_error());
        return false;
    }
    int64_t b = cfg.train.batch_size;
    float *x, *y;
    gp_bench_model_batch(&model, b, &x, &y);
    gp_status s = k ? gp_model_pipeline_step(&model, &cfg, x, y, b, 0.001, NULL)
                    : gp_model_train_step(&model, &cfg, x, y, b, 1, 0.001, NULL);
    if (s != GP_OK && s != GP_ERR_OOM) /* not a matter of size: say so */
        fprintf(stderr, "bench_models: %s\n", gp_last_error());
    free(x);
    free(y);
    gp_model_free(&model);
    for (int j = 0; j < n; j++) gp_device_close(devs[j]);
    return s == GP_OK;
}

/* --pipelines: which of the memory table's rows to run, bit k for
 * pipeline-k (bit 0: the baseline); all by default. */
static unsigned g_rows = ~0u;

/* A list like "1-12" or "0,1,4" into out (at most max values, each in
 * [lo, hi]); its length, or -1 if it is not one. */
static int parse_list(const char *s, int *out, int max, int lo, int hi)
{
    int n = 0;
    while (*s) {
        char *e;
        long a = strtol(s, &e, 10), b = a;
        if (e == s) return -1;
        if (*e == '-') {
            const char *t = e + 1;
            b = strtol(t, &e, 10);
            if (e == t) return -1;
        }
        if (a < lo || b > hi || b < a) return -1;
        for (long v = a; v <= b; v++) {
            if (n == max) return -1;
            out[n++] = (int)v;
        }
        if (*e == ',') e++;
        else if (*e) return -1;
        s = e;
    }
    return n;
}

static int memory(const family *f, size_t cap, gp_schedule_kind sched)
{
    enum { MAX_CAND = 1024 };
    candidate cand[MAX_CAND];
    int want = 0; /* the grid's size: a grid beyond MAX_CAND is refused, not cut */
    for (int i = 0; i < AGRID && f->agrid[i]; i++) want += (f->b_hi - f->b_lo) / f->b_step + 1;
    if (want > MAX_CAND) {
        fprintf(stderr, "bench_models: %d sizes of %s to try, at most %d: raise --step\n", want,
                f->label, MAX_CAND);
        return 2;
    }
    int nc = 0;
    for (int i = 0; i < AGRID && f->agrid[i]; i++)
        for (int d = f->b_lo; d <= f->b_hi && nc < MAX_CAND; d += f->b_step) {
            gp_config c;
            if (family_cfg(f, f->agrid[i], d, true, &c) != GP_OK) continue;
            int64_t np; /* from the shapes: no memory needed */
            if (gp_model_count_params(&c, &np) == GP_OK) cand[nc++] = (candidate){f->agrid[i], d, np};
            gp_error_clear();
            gp_config_free(&c);
        }
    if (nc == 0) {
        fprintf(stderr, "bench_models: no sizes of %s to try\n", f->label);
        return 1;
    }
    char cpu[256];
    gp_bench_cpu_name(cpu, sizeof cpu);
    printf("%s memory: the largest of %d sizes that trains a step; %lldx%lld, batch %lld; each "
           "device %zu MiB; pipelines on the %s schedule, m = %d, checkpoint %s, %s copies; "
           "SGD%s; %s%s\n\n",
           f->label, nc, (long long)f->mside, (long long)f->mside, (long long)f->mbatch,
           cap >> 20, gp_schedule_kind_name(sched), g_mem.chunks,
           g_mem.ckpt == GP_CKPT_ALWAYS ? "always" : g_mem.ckpt == GP_CKPT_NEVER ? "never"
                                                                             : "except_last",
           g_mem.bf16_copies ? "bf16" : "fp32", g_mem.momentum > 0 ? " with momentum" : " without momentum", cpu,
           g_mem.plan_only ? "; --plan-only: fits = the planner finds a split under the "
                             "capacity (no step run)" : "");
    printf("| experiment | %s | parameters | vs pipeline-1 |\n|---|---|---|---|\n", f->sizes);
    int64_t p1 = 0;
    for (int k = 0; k <= 8; k = k ? 2 * k : 1) {
        if (!(g_rows & (1u << k))) continue;
        /* per a, the largest b that fits (a binary search: for a fixed a a
         * model grows with b), then the one with the most parameters */
        int lo = -1;
        for (int g0 = 0; g0 < nc;) {
            int g1 = g0;
            while (g1 < nc && cand[g1].a == cand[g0].a) g1++;
            int glo = g0 - 1, ghi = g1; /* cand[glo] fits (or none), cand[ghi] does not */
            while (ghi - glo > 1) {
                int mid = (glo + ghi) / 2;
                gp_config c;
                bool ok = family_cfg(f, cand[mid].a, cand[mid].b, true, &c) == GP_OK &&
                          fits(&c, k, cap, sched);
                gp_error_clear();
                gp_config_free(&c);
                if (ok) glo = mid;
                else ghi = mid;
            }
            if (glo >= g0 && (lo < 0 || cand[glo].params > cand[lo].params)) lo = glo;
            g0 = g1;
        }
        char name[32];
        if (k) snprintf(name, sizeof name, "pipeline-%d", k);
        else snprintf(name, sizeof name, "baseline");
        if (lo < 0) {
            printf("| %s | none fits | | |\n", name);
        } else {
            if (k == 1) p1 = cand[lo].params;
            char ratio[32] = "";
            if (k >= 1 && p1) snprintf(ratio, sizeof ratio, "%.2fx", (double)cand[lo].params / (double)p1);
            printf("| %s | (%d, %d) | %.2fM | %s |\n", name, cand[lo].a, cand[lo].b,
                   (double)cand[lo].params / 1e6, ratio);
        }
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    const char *model = "amoebanet";
    int steps = 3;
    size_t cap = (size_t)256 << 20;
    gp_schedule_kind sched = GP_SCHEDULE_GPIPE;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--capacity") && i + 1 < argc)
            cap = (size_t)atoll(argv[++i]) << 20;
        else if (!strcmp(argv[i], "--schedule") && i + 1 < argc) {
            const char *name = argv[++i];
            if (!strcmp(name, "gpipe")) sched = GP_SCHEDULE_GPIPE;
            else if (!strcmp(name, "1f1b")) sched = GP_SCHEDULE_1F1B;
            else if (!strcmp(name, "zb-h1")) sched = GP_SCHEDULE_ZB_H1;
            else {
                fprintf(stderr, "bench_models: --schedule takes gpipe, 1f1b or zb-h1\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--copies") && i + 1 < argc) {
            const char *name = argv[++i];
            if (strcmp(name, "fp32") && strcmp(name, "bf16")) {
                fprintf(stderr, "bench_models: --copies takes fp32 or bf16\n");
                return 2;
            }
            g_mem.bf16_copies = !strcmp(name, "bf16");
        } else if (!strcmp(argv[i], "--plan-only")) {
            g_mem.plan_only = true;
        }
    }
    const family *found = find_family(model);
    family fam = found ? *found : (family){0};
    const family *f = found ? &fam : NULL;
    for (int i = 2; f && i < argc; i++)
        if (!strcmp(argv[i], "--as-torchgpipe")) { /* its benchmarks/unet-memory/main.py */
            g_mem.chunks = 32;
            g_mem.ckpt = GP_CKPT_EXCEPT_LAST;
            g_mem.lr = 0.1;
            g_mem.momentum = 0;
            fam.mside = 192;
            fam.mbatch = 32;
        }
    /* other sizes than the table's (after the preset: they win); a run is
     * speed or memory, so each sets both benchmarks' fields */
    for (int i = 2; f && i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 2 < argc) {
            fam.a = atoi(argv[i + 1]);
            fam.b = atoi(argv[i + 2]);
        } else if (!strcmp(argv[i], "--batch")) {
            fam.batch = fam.mbatch = atoll(argv[i + 1]);
        } else if (!strcmp(argv[i], "--side")) {
            fam.side = fam.mside = atoll(argv[i + 1]);
        } else if (!strcmp(argv[i], "--step") && atoi(argv[i + 1]) > 0) { /* the grid of b */
            fam.b_step = atoi(argv[i + 1]);
            fam.b_lo = fam.b_step * ((fam.b_lo + fam.b_step - 1) / fam.b_step);
        } else if (!strcmp(argv[i], "--checkpoint")) { /* the pipelines' mode */
            const char *name = argv[i + 1];
            if (!strcmp(name, "always")) g_mem.ckpt = GP_CKPT_ALWAYS;
            else if (!strcmp(name, "except_last")) g_mem.ckpt = GP_CKPT_EXCEPT_LAST;
            else if (!strcmp(name, "never")) g_mem.ckpt = GP_CKPT_NEVER;
            else {
                fprintf(stderr, "bench_models: --checkpoint takes always, except_last or "
                        "never, not '%s'\n", name);
                return 2;
            }
        } else if (!strcmp(argv[i], "--first")) { /* the grid of a */
            int got = parse_list(argv[i + 1], fam.agrid, AGRID - 1, 1, 1000);
            if (got < 1) {
                fprintf(stderr, "bench_models: --first takes first sizes like 1-12 or 3,6,9 "
                        "(at most %d), not '%s'\n", AGRID - 1, argv[i + 1]);
                return 2;
            }
            fam.agrid[got] = 0;
        } else if (!strcmp(argv[i], "--pipelines")) { /* the rows */
            int ks[8], got = parse_list(argv[i + 1], ks, 8, 0, 8);
            g_rows = 0;
            for (int q = 0; q < got; q++) g_rows |= 1u << ks[q];
            if (got < 1 || (g_rows & ~((1u << 0) | (1u << 1) | (1u << 2) | (1u << 4) | (1u << 8)))) {
                fprintf(stderr, "bench_models: --pipelines takes rows among 0 (the baseline), "
                        "1, 2, 4 and 8, like 1,4, not '%s'\n", argv[i + 1]);
                return 2;
            }
        }
    }
    if (strcmp(what, "speed") && strcmp(what, "memory")) {
        puts("usage: bench_models speed  [--model amoebanet|resnet|unet|gpt|llama] [--steps N]\n"
             "                           [--size A B] [--batch N] [--side PIXELS]\n"
             "       bench_models memory [--model amoebanet|unet|gpt|llama] [--capacity MiB]\n"
             "                           [--schedule gpipe|1f1b|zb-h1] [--side PIXELS]\n"
             "                           [--batch N] [--step N] [--as-torchgpipe]\n"
             "                           [--copies fp32|bf16] [--first LIST]\n"
             "                           [--pipelines LIST] [--checkpoint MODE]\n"
             "                           [--plan-only]\n"
             "  --copies bf16: the pipelines' copies in bfloat16 (pipeline.copy_precision),\n"
             "  held packed while a checkpointed stage waits for its recompute;\n"
             "  --as-torchgpipe: torchgpipe's U-Net memory setup (192x192, batch 32,\n"
             "  m = 32, except_last, SGD lr 0.1 without momentum); --step: the grid of\n"
             "  the second size (U-Net's C, AmoebaNet's D); --first: the first sizes to\n"
             "  search (U-Net's B, AmoebaNet's L), e.g. 1-12; --pipelines: the rows to run,\n"
             "  among 0 (the baseline), 1, 2, 4 and 8, e.g. 1,4; --checkpoint: the\n"
             "  pipelines' mode, always, except_last or never (after --as-torchgpipe, wins);\n"
             "  --plan-only: a size fits when the planner (gpipe-balance --by size) finds a\n"
             "  split under the capacity, for every row; no step is run (fast, fine grids)");
        return strcmp(what, "-h") && strcmp(what, "--help") ? 2 : 0;
    }
    if (!f) {
        fprintf(stderr, "bench_models: unknown model '%s'\n", model);
        return 2;
    }
    gp_log_set_level(GP_LOG_WARN);
    if (steps < 1) steps = 1;
    return !strcmp(what, "speed") ? speed(f, steps) : memory(f, cap, sched);
}
