/*
 * test_alloc_fail.c — every host allocation gpipe makes may fail: the call
 * that made it returns a status other than GP_OK with a message naming
 * memory (or the failure is absorbed and the call succeeds), nothing
 * crashes or hangs, every worker stops, nothing leaks (under ASan), and a
 * clean run in the same process works afterwards.
 *
 * This program is linked with -Wl,--wrap=malloc,calloc,realloc,strdup,
 * posix_memalign,aligned_alloc (tests/CMakeLists.txt): every such call in
 * gpipe's own objects (libgpipe is static) comes here, and may be failed on
 * demand; oneDNN, libyaml and zlib are shared libraries and are not
 * wrapped.  A call site is the wrapper's return address.
 *
 * The scenario (scenario(), below) drives the public API: parse a convnet
 * with batch norm and dropout on 2 CPU devices, 2 micro-batches, 1F1B,
 * checkpointing; prepare, 2 steps, evaluate, predict, save a snapshot,
 * export safetensors, summary; a second run from the export
 * (model.init_from) restores the snapshot, steps, then trains through
 * gp_run_train_ex with metrics, a trace, snapshots and an export, and again
 * resuming the latest snapshot; a fresh gp_run_train_ex into the folder
 * of those snapshots must then be refused.
 *
 * One child process counts the allocations of a clean run, per call site.
 * Then one child per injection point runs the scenario failing one call:
 * the first call of every site reached, and for a site called more than
 * once (loops) also its last call and, where worker threads make 4 calls
 * or more, the middle one.  Every child works in a process of its own (fork before any
 * run is prepared, as gpipe.h asks), so one crash hides nothing; a child
 * that takes longer than its alarm is a hang.  The output ends with the
 * sites reached and failed, and names every problem by its address
 * (addr2line turns it into file:line when installed).
 * GPIPE_ALLOC_FAIL_STRIDE=N (default 1) injects at every N-th point only;
 * GPIPE_ALLOC_FAIL_ALL=1 fails every call of every site instead (64 spread
 * over a site's calls where it makes more), one per child (thousands of
 * children: a search for new code's defects, not CI's);
 * GPIPE_ALLOC_FAIL_AT=+0x1234[:K] only the site a report names (its offset
 * in brackets) at its K-th call (all its points without :K): a reproducer.
 */
/* MAP_ANONYMOUS (not in POSIX 2008) */
#define _DEFAULT_SOURCE
#include "gpipe.h"
#include "test.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the wrappers ------------------------------------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t m, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t m, size_t n);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
int __wrap_posix_memalign(void **p, size_t align, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);

/* LeakSanitizer's check, where the program runs under it (weak: absent
 * otherwise). */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

enum { MAX_SITES = 4096, MAX_POINTS = 65536 };

typedef struct site {
    uintptr_t ra;  /* return address into gpipe's code; 0: free slot */
    long calls;    /* calls made while armed */
    int threaded;  /* some made on a thread other than the scenario's */
} site;

/* Shared with the parent (MAP_SHARED): the counting child fills `sites`,
 * an injecting child reports whether its injection happened. */
typedef struct shared {
    site sites[MAX_SITES];
    int n_sites;
    int overflow;
    int hit;          /* the injection failed a call ... */
    char hit_in[64];  /* ... during this API call */
    int wrong;        /* a call that must fail succeeded */
    char stage[64];   /* the API call that returned the error */
    char msg[512];    /* ... and its message */
} shared;

static shared *g_sh;
static atomic_int g_armed;         /* count (and fail) only inside API calls */
static const char *_Atomic g_call; /* the API call under way */
static uintptr_t g_target;         /* site to fail (0: none) ... */
static long g_target_k;            /* ... at its k-th call */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t g_main; /* the scenario's thread */

static bool should_fail(void *ra)
{
    if (!atomic_load(&g_armed) || !g_sh) return false;
    uintptr_t a = (uintptr_t)ra;
    bool fail = false;
    pthread_mutex_lock(&g_lock);
    size_t h = (size_t)((a >> 2) * 2654435761u) % MAX_SITES;
    for (int probe = 0; probe < MAX_SITES; probe++, h = (h + 1) % MAX_SITES) {
        site *s = &g_sh->sites[h];
        if (s->ra == 0) {
            if (g_sh->n_sites >= MAX_SITES / 2) {
                g_sh->overflow = 1;
                break;
            }
            s->ra = a;
            g_sh->n_sites++;
        }
        if (s->ra != a) continue;
        s->calls++;
        if (!pthread_equal(pthread_self(), g_main)) s->threaded = 1;
        if (a == g_target && s->calls == g_target_k && !g_sh->hit) {
            g_sh->hit = 1;
            fail = true;
            snprintf(g_sh->hit_in, sizeof g_sh->hit_in, "%s", atomic_load(&g_call));
        }
        break;
    }
    pthread_mutex_unlock(&g_lock);
    return fail;
}

void *__wrap_malloc(size_t n)
{
    if (should_fail(__builtin_return_address(0))) return errno = ENOMEM, NULL;
    return __real_malloc(n);
}

void *__wrap_calloc(size_t m, size_t n)
{
    if (should_fail(__builtin_return_address(0))) return errno = ENOMEM, NULL;
    return __real_calloc(m, n);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (should_fail(__builtin_return_address(0))) return errno = ENOMEM, NULL;
    return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
    if (should_fail(__builtin_return_address(0))) return errno = ENOMEM, NULL;
    return __real_strdup(s);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    if (should_fail(__builtin_return_address(0))) return ENOMEM;
    return __real_posix_memalign(p, align, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    if (should_fail(__builtin_return_address(0))) return errno = ENOMEM, NULL;
    return __real_aligned_alloc(align, n);
}

/* ---- the scenario ------------------------------------------------------- */

static const char *k_yaml =
    "model:\n"
    "  input: [1, 8, 8]\n"
    "  layers:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n"
    "    - batchnorm\n"
    "    - relu\n"
    "    - maxpool2d: {kernel: 2}\n"
    "    - flatten\n"
    "    - linear: {out: 16}\n"
    "    - relu\n"
    "    - dropout: {p: 0.2}\n"
    "    - linear: {out: 4}\n"
    "data:\n"
    "  dataset: synthetic\n"
    "  synthetic: {train: 32, test: 16, classes: 4, shape: [1, 8, 8]}\n"
    "pipeline: {devices: [cpu:0, cpu:1], chunks: 2, schedule: 1f1b, checkpoint: always,\n"
    "           balance: [4, 5], threads: 1}\n"
    "train:\n"
    "  batch_size: 8\n"
    "  steps: 2\n"
    "  seed: 1\n"
    "  log_every: 0\n"
    "  optimizer: {type: adamw, lr: 0.01}\n"
    "  snapshot: {every_steps: 1, keep: 2}\n";

enum { N = 8, PIX = 64 };

/* One API call, armed: on an error it records which call and its message
 * and the scenario stops there. */
#define STEP(name, expr)                                                                \
    do {                                                                                \
        atomic_store(&g_call, name);                                                    \
        atomic_store(&g_armed, 1);                                                      \
        gp_status st_ = (expr);                                                         \
        atomic_store(&g_armed, 0);                                                      \
        if (st_ != GP_OK) {                                                             \
            snprintf(g_sh->stage, sizeof g_sh->stage, "%s (%s)", name,                  \
                     gp_status_name(st_));                                              \
            snprintf(g_sh->msg, sizeof g_sh->msg, "%s", gp_last_error());               \
            s = st_;                                                                    \
            goto out;                                                                   \
        }                                                                               \
    } while (0)

/* A call that must fail with `code`: another error is the injected one's
 * (as STEP's); success sets g_sh->wrong. */
#define STEP_REFUSED(name, expr, code)                                                  \
    do {                                                                                \
        atomic_store(&g_call, name);                                                    \
        atomic_store(&g_armed, 1);                                                      \
        gp_status st_ = (expr);                                                         \
        atomic_store(&g_armed, 0);                                                      \
        if (st_ != (code)) {                                                            \
            snprintf(g_sh->stage, sizeof g_sh->stage, "%s (%s)", name,                  \
                     gp_status_name(st_));                                              \
            snprintf(g_sh->msg, sizeof g_sh->msg, "%s",                                 \
                     st_ == GP_OK ? "succeeded, where it must be refused" : gp_last_error()); \
            g_sh->wrong = st_ == GP_OK;                                                 \
            s = st_ == GP_OK ? GP_ERR_INVALID : st_;                                    \
            goto out;                                                                   \
        }                                                                               \
    } while (0)

/* The scenario in `dir`: GP_OK, or the first error (g_sh->stage, msg). */
static gp_status scenario(const char *dir)
{
    gp_status s = GP_OK;
    gp_run *a = NULL, *b = NULL;
    FILE *devnull = fopen("/dev/null", "w");
    float x[N * PIX], y[N], logits[N * 4];
    for (int i = 0; i < N; i++) {
        y[i] = (float)(i % 4);
        for (int p = 0; p < PIX; p++) x[i * PIX + p] = (float)((i * 7 + p * 3) % 11) / 11.f;
    }
    char snap_dir[300], snap[320], wts[320], wts2[320], trace[320], metrics[320];
    char set_dir[340], set_init[340];
    snprintf(snap_dir, sizeof snap_dir, "%s/snaps", dir);
    snprintf(snap, sizeof snap, "%s/own.safetensors", dir);
    snprintf(wts, sizeof wts, "%s/w.safetensors", dir);
    snprintf(wts2, sizeof wts2, "%s/w2.safetensors", dir);
    snprintf(trace, sizeof trace, "%s/trace.json", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    snprintf(set_dir, sizeof set_dir, "train.snapshot.dir=%s", snap_dir);
    snprintf(set_init, sizeof set_init, "model.init_from=%s", wts);
    const char *sets_a[] = {set_dir};
    const char *sets_b[] = {set_dir, set_init};
    gp_run_info info;
    double loss, acc;

    STEP("gp_run_parse", gp_run_parse("alloc.yaml", k_yaml, sets_a, 1, &a));
    STEP("gp_run_describe", gp_run_describe(a, &info));
    STEP("gp_run_prepare", gp_run_prepare(a));
    STEP("gp_run_step", gp_run_step(a, x, y, N, 0, NULL));
    STEP("gp_run_step", gp_run_step(a, x, y, N, 0, NULL));
    STEP("gp_run_evaluate", gp_run_evaluate(a, x, y, N, &loss, &acc));
    STEP("gp_run_predict", gp_run_predict(a, x, N, logits));
    STEP("gp_run_save", gp_run_save(a, snap));
    STEP("gp_run_export_weights", gp_run_export_weights(a, wts));
    STEP("gp_run_summary", gp_run_summary(a, devnull));
    gp_run_free(a);
    a = NULL;

    STEP("gp_run_parse (init_from)", gp_run_parse("alloc.yaml", k_yaml, sets_b, 2, &b));
    STEP("gp_run_prepare (init_from)", gp_run_prepare(b));
    STEP("gp_run_restore", gp_run_restore(b, snap));
    STEP("gp_run_step (restored)", gp_run_step(b, x, y, N, 0, NULL));
    gp_train_options o = GP_TRAIN_OPTIONS_INIT;
    o.metrics_path = metrics;
    o.trace_path = trace;
    o.export_weights = wts2;
    o.quiet = 1;
    STEP("gp_run_train_ex", gp_run_train_ex(b, &o, NULL));
    gp_train_options r = GP_TRAIN_OPTIONS_INIT;
    r.resume = "latest";
    r.quiet = 1;
    STEP("gp_run_train_ex (resume)", gp_run_train_ex(b, &r, NULL));
    /* a fresh run into the folder of those snapshots is refused (its
     * pruning would delete them) */
    gp_train_options fresh = GP_TRAIN_OPTIONS_INIT;
    fresh.quiet = 1;
    STEP_REFUSED("gp_run_train_ex (fresh, same folder)", gp_run_train_ex(b, &fresh, NULL),
                 GP_ERR_INVALID);
out:
    gp_run_free(a);
    gp_run_free(b);
    if (devnull) fclose(devnull);
    return s;
}

/* ---- the children ------------------------------------------------------- */

enum {
    CHILD_OK = 0,        /* the injected failure came back as an error naming memory */
    CHILD_ABSORBED = 20, /* ... was absorbed: every call succeeded */
    CHILD_NOT_HIT = 21,  /* the site's k-th call did not happen in this run */
    CHILD_BAD_MSG = 22,  /* an error without a message naming memory */
    CHILD_RERUN = 24,    /* a clean run afterwards, in the same process, failed */
    CHILD_LEAK = 25,     /* LeakSanitizer found a leak */
    CHILD_COUNT_FAILED = 26,
    CHILD_WRONG = 27,    /* a call that must be refused succeeded */
};

static bool names_memory(const char *m)
{
    char low[512];
    size_t i = 0;
    for (; m[i] && i + 1 < sizeof low; i++)
        low[i] = (char)(m[i] >= 'A' && m[i] <= 'Z' ? m[i] + 32 : m[i]);
    low[i] = '\0';
    return strstr(low, "memory") || strstr(low, "alloc");
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_alloc_fail: could not remove %s\n", dir);
}

/* In the child: the scenario failing `target`'s k-th call (target 0:
 * counting), then a clean run, then the leak check. */
static int child(uintptr_t target, long k, const char *dir)
{
    g_target = target;
    g_target_k = k;
    char d1[300], d2[300];
    snprintf(d1, sizeof d1, "%s/1", dir);
    snprintf(d2, sizeof d2, "%s/2", dir);
    if (mkdir(d1, 0700) || mkdir(d2, 0700)) return CHILD_COUNT_FAILED;
    gp_status s = scenario(d1);
    int code = CHILD_OK;
    if (g_sh->wrong) {
        code = CHILD_WRONG;
    } else if (target == 0) {
        if (s != GP_OK) {
            fprintf(stderr, "clean run: %s: %s\n", g_sh->stage, g_sh->msg);
            return CHILD_COUNT_FAILED;
        }
    } else if (!g_sh->hit) {
        code = CHILD_NOT_HIT;
    } else if (s == GP_OK) {
        code = CHILD_ABSORBED;
    } else if (!g_sh->msg[0] || !names_memory(g_sh->msg)) {
        code = CHILD_BAD_MSG;
    }
    if (target != 0) { /* a clean run in the same process */
        g_target = 0;
        char stage[64], msg[512];
        memcpy(stage, g_sh->stage, sizeof stage);
        memcpy(msg, g_sh->msg, sizeof msg);
        if (scenario(d2) != GP_OK) {
            fprintf(stderr, "clean run after the injection: %s: %s\n", g_sh->stage, g_sh->msg);
            code = CHILD_RERUN;
        }
        memcpy(g_sh->stage, stage, sizeof stage);
        memcpy(g_sh->msg, msg, sizeof msg);
    }
    if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check())
        code = CHILD_LEAK;
    return code;
}

/* ---- the parent --------------------------------------------------------- */

static uintptr_t g_base; /* where the executable is mapped (for addr2line) */
static char g_exe[512];

static void find_base(void)
{
    ssize_t n = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
    if (n <= 0) return;
    g_exe[n] = '\0';
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, off;
        if (sscanf(line, "%lx-%*x %*s %lx", &lo, &off) == 2 && off == 0 && strstr(line, g_exe)) {
            g_base = (uintptr_t)lo;
            break;
        }
    }
    if (f) fclose(f);
}

/* "function at file:line" of the call before return address ra. */
static const char *where(uintptr_t ra, char *buf, size_t len)
{
    char cmd[800], out[600] = "";
    snprintf(cmd, sizeof cmd, "addr2line -f -s -e '%s' 0x%lx 2>/dev/null", g_exe,
             (unsigned long)(ra - 1 - g_base));
    FILE *p = popen(cmd, "r");
    char fn[256] = "?", fl[256] = "?";
    if (p && fgets(fn, sizeof fn, p) && fgets(fl, sizeof fl, p)) {
        fn[strcspn(fn, "\n")] = fl[strcspn(fl, "\n")] = '\0';
        snprintf(out, sizeof out, "%s at %s", fn, fl);
    }
    if (p) pclose(p);
    snprintf(buf, len, "%s [+0x%lx]", out[0] ? out : "?", (unsigned long)(ra - g_base));
    return buf;
}

/* Fork a child that runs child(target, k); its outcome: a CHILD_* code,
 * or 128 + the signal that ended it (SIGALRM: it hung). */
static int run_child(uintptr_t target, long k, unsigned alarm_s)
{
    char dir[] = "/tmp/gp_allocfail_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
    memset(g_sh, 0, sizeof *g_sh);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(alarm_s);
        _exit(child(target, k, dir));
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    rm_rf(dir);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

typedef struct point {
    uintptr_t ra;
    long k, calls;
    int threaded;
} point;

static int by_ra(const void *a, const void *b)
{
    uintptr_t x = ((const point *)a)->ra, y = ((const point *)b)->ra;
    return x < y ? -1 : x > y;
}

int main(void)
{
    g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_sh == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    find_base();
    g_main = pthread_self();
    gp_set_log_level("quiet");
    const char *stride_env = getenv("GPIPE_ALLOC_FAIL_STRIDE");
    int stride = stride_env ? atoi(stride_env) : 1;
    if (stride < 1) stride = 1;
    unsigned alarm_s = getenv("GPIPE_SANITIZED") ? 120 : 60;

    /* the clean run: which sites, how many calls each */
    int c = run_child(0, 0, alarm_s);
    CHECK_MSG(c == CHILD_OK, "the clean run ended with %d", c);
    CHECK_MSG(!g_sh->overflow, "more than %d call sites", MAX_SITES / 2);
    if (c != CHILD_OK) {
        printf("test_alloc_fail: %d passed, %d failed\n", gpt_passed, gpt_failed);
        return 1;
    }
    /* GPIPE_ALLOC_FAIL_ALL=1: every call of every site, 64 spread over its
     * calls where it makes more (a search: many minutes) */
    bool all = getenv("GPIPE_ALLOC_FAIL_ALL") && !strcmp(getenv("GPIPE_ALLOC_FAIL_ALL"), "1");
    static point pts[MAX_POINTS];
    int n_pts = 0, n_sites = 0;
    long total = 0;
    static point sites[MAX_SITES];
    for (int h = 0; h < MAX_SITES; h++)
        if (g_sh->sites[h].ra)
            sites[n_sites++] = (point){g_sh->sites[h].ra, 1, g_sh->sites[h].calls,
                                       g_sh->sites[h].threaded};
    qsort(sites, (size_t)n_sites, sizeof *sites, by_ra);
    for (int i = 0; i < n_sites; i++) {
        point p = sites[i];
        total += p.calls;
        if (n_pts + 64 > MAX_POINTS) break; /* (GPIPE_ALLOC_FAIL_ALL's search only) */
        pts[n_pts++] = p;
        for (long q = 2, most = p.calls < 64 ? p.calls : 64; all && q <= most; q++)
            pts[n_pts++] = (point){p.ra, 1 + (q - 1) * (p.calls - 1) / (most - 1), p.calls,
                                   p.threaded};
        if (all) continue;
        if (p.calls >= 4 && p.threaded) pts[n_pts++] = (point){p.ra, p.calls / 2, p.calls, 1};
        if (p.calls >= 2) pts[n_pts++] = (point){p.ra, p.calls, p.calls, p.threaded};
    }
    printf("test_alloc_fail: a clean run makes %ld allocations from %d call sites; "
           "%d injection points, every %d%s\n", total, n_sites, n_pts, stride,
           stride == 1 ? "" : " (GPIPE_ALLOC_FAIL_STRIDE)");

    int n_err = 0, n_absorbed = 0, n_not_hit = 0, n_bad = 0;
    static bool failed_site[MAX_SITES];
    /* GPIPE_ALLOC_FAIL_AT=+0xOFFSET[:K]: that site's points only (a
     * reproducer: the offset a report printed, in brackets) */
    const char *at = getenv("GPIPE_ALLOC_FAIL_AT");
    unsigned long at_off = 0;
    long at_k = 0;
    if (at && sscanf(at, "+%lx:%ld", &at_off, &at_k) < 1) at = NULL;
    for (int i = 0; i < n_pts; i += stride) {
        point p = pts[i];
        if (at && (p.ra - g_base != at_off || (at_k > 0 && p.k != at_k))) continue;
        c = run_child(p.ra, p.k, alarm_s);
        char w[700];
        int si = 0;
        while (sites[si].ra != p.ra) si++;
        if (c != CHILD_NOT_HIT) failed_site[si] = true;
        switch (c) {
        case CHILD_OK: n_err++; break;
        case CHILD_NOT_HIT: n_not_hit++; break;
        case CHILD_ABSORBED:
            n_absorbed++;
            printf("absorbed: call %ld of %ld at %s, in %s: every call succeeded\n", p.k,
                   p.calls, where(p.ra, w, sizeof w), g_sh->hit_in);
            break;
        default: {
            n_bad++;
            const char *what = c == CHILD_BAD_MSG ? "error without a message naming memory"
                             : c == CHILD_WRONG ? "a call that must be refused succeeded"
                             : c == CHILD_RERUN ? "a clean run afterwards failed"
                             : c == CHILD_LEAK ? "leak"
                             : c == 128 + SIGALRM ? "hang"
                             : c > 128 ? strsignal(c - 128) : "sanitizer error or exit";
            CHECK_MSG(0, "call %ld of %ld at %s, in %s: %s (child status %d); %s: \"%s\"",
                      p.k, p.calls, where(p.ra, w, sizeof w), g_sh->hit_in, what, c,
                      g_sh->stage[0] ? g_sh->stage : "no call failed", g_sh->msg);
        }
        }
        if (c == CHILD_OK || c == CHILD_ABSORBED || c == CHILD_NOT_HIT) gpt_passed++;
    }
    int n_failed_sites = 0;
    for (int i = 0; i < n_sites; i++) n_failed_sites += failed_site[i];
    printf("test_alloc_fail: sites reached %d, sites failed %d; injections %d: %d errors "
           "naming memory, %d absorbed, %d not reached again, %d problems\n", n_sites,
           n_failed_sites, (n_pts + stride - 1) / stride, n_err, n_absorbed, n_not_hit, n_bad);
    printf("test_alloc_fail: %d passed, %d failed\n", gpt_passed, gpt_failed);
    return gpt_failed != 0;
}
