/*
 * test_signals.c — nothing lost (issue 19): gpipe-train checks its outputs
 * before the first step, and stops cleanly on signals.
 *   - bad outputs (--export-weights under a file or in a missing directory,
 *     a --trace that cannot be written beside a metrics file that exists,
 *     train.snapshot.dir that is a file or cannot be made, gpipe-balance
 *     --write) fail with exit 3 and a message naming the path and its flag
 *     or key, before any step (the metrics file holds none), leaving
 *     nothing behind;
 *   - SIGINT at a random moment after stepping began (several trials):
 *     exit 130, a snapshot of the last step that finished (the last step
 *     in the metrics), every metrics line and the trace parse
 *     (core/json.h), no record says 0 samples/s; and --resume latest to
 *     the end exports weights byte-identical to an uninterrupted run's;
 *   - SIGTERM with snapshots off: exit 143 and the "nothing saved" message;
 *   - a second SIGINT while the stop writes its snapshot (made slow with
 *     GPIPE_SNAPSHOT_SLOW_WRITE_MS), 2 s after the first: exit 130 at once,
 *     no broken snapshot;
 *   - SIGTERM while a 300 M-parameter model is initialised stops it there
 *     (exit 143, said), and a model of 160 G parameters is refused before
 *     anything is allocated, naming what it needs and what there is;
 *   - SIGTERM three times within 0.5 s (GNU timeout, Slurm, mpirun signal
 *     the process and then its group): one request, exit 143 with the
 *     final snapshot;
 *   - the library: a stop asked for before gp_run_train (gp_run_stop)
 *     returns GP_ERR_STOPPED before the first step; one asked by another
 *     thread while it trains, between steps, with valid metrics; one
 *     asked during an epoch's evaluation, when it ends, before another
 *     step.
 * GPIPE_TEST_SEED repeats a run of the random trials.
 */
#include "core/core.h"
#include "core/json.h"
#include "train/snapshot.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256];
static char bin[512], balance_bin[512];

/* Two stages, two micro-batches, dropout and batch norm: a few ms a step,
 * so a run of 120 steps lasts long enough to be interrupted. */
static const char *k_cfg =
    "model:\n"
    "  input: [1, 32, 32]\n"
    "  layers:\n"
    "    - flatten\n"
    "    - linear: {out: 512}\n"
    "    - batchnorm\n"
    "    - relu\n"
    "    - dropout: {p: 0.1}\n"
    "    - linear: {out: 10}\n"
    "data:\n"
    "  dataset: synthetic\n"
    "  synthetic: {train: 640, test: 64, shape: [1, 32, 32]}\n"
    "  prefetch: 1\n"
    "pipeline: {devices: 2, chunks: 2}\n"
    "train:\n"
    "  steps: 120\n"
    "  batch_size: 128\n"
    "  seed: 5\n"
    "  log_every: 0\n"
    "  optimizer: {lr: 0.05, momentum: 0.9, weight_decay: 0.0001}\n"
    "  schedule: {type: cosine, warmup_steps: 3}\n";
enum { TOTAL_STEPS = 120 };

static char conf[300];

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void tmp_path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", tmpdir, name);
}

/* Start `program` with argv (NULL-terminated, argv[0] included), its
 * stdout and stderr into `log`; slow_ms: GPIPE_SNAPSHOT_SLOW_WRITE_MS. */
static pid_t spawn(const char *program, char *const *argv, const char *log, const char *slow_ms)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (slow_ms) setenv("GPIPE_SNAPSHOT_SLOW_WRITE_MS", slow_ms, 1);
        if (!freopen(log, "w", stdout) || dup2(fileno(stdout), STDERR_FILENO) < 0) _exit(126);
        execv(program, argv);
        _exit(127);
    }
    return pid;
}

/* The exit status of pid (-signal if a signal killed it), waiting at most
 * `limit` seconds (then it is killed: -1000). */
static int wait_exit(pid_t pid, double limit)
{
    double t0 = gp_now();
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0) return -2000;
        if (gp_now() - t0 > limit) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1000;
        }
        sleep_ms(1);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -3000;
}

/* Complete lines (ending in '\n') of a file; 0 if it does not exist. */
static int count_lines(const char *path)
{
    char *t = gpt_read_file(path, NULL);
    int n = 0;
    for (char *p = t; p && *p; p++) n += *p == '\n';
    free(t);
    return n;
}

/* Wait until `path` has n complete lines or pid is gone. */
static bool wait_lines(const char *path, int n, pid_t pid)
{
    double t0 = gp_now();
    while (gp_now() - t0 < 120) {
        if (count_lines(path) >= n) return true;
        if (waitpid(pid, NULL, WNOHANG) == pid) return false; /* reaped: do not wait again */
        sleep_ms(0.5);
    }
    return false;
}

static bool log_has(const char *log, const char *needle)
{
    char *t = gpt_read_file(log, NULL);
    bool yes = t && strstr(t, needle);
    if (!yes) fprintf(stderr, "--- %s (looking for \"%s\") ---\n%s---\n", log, needle, t ? t : "");
    free(t);
    return yes;
}

/* Every line of a metrics file parses as one JSON object and the file
 * ends in a newline; returns the number of step records (-1 on a broken
 * line) and each step's samples_per_s is above 0. */
static int check_metrics(const char *path)
{
    size_t n = 0;
    char *t = gpt_read_file(path, &n);
    if (!t) return -1;
    int steps = 0, line = 0;
    bool ok = n == 0 || t[n - 1] == '\n';
    CHECK_MSG(ok, "%s does not end in a newline", path);
    for (char *p = t; ok && *p;) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        line++;
        gp_json_reader r;
        gp_json_value *v = gp_json_parse(p, len, &r);
        CHECK_MSG(v && v->kind == GP_JSON_OBJECT, "%s line %d: %s", path, line, r.err);
        if (!v) ok = false;
        if (v && !gp_json_get(v, "eval")) {
            const gp_json_value *step = gp_json_get(v, "step"), *sps = gp_json_get(v, "samples_per_s");
            CHECK_MSG(step && step->num == steps + 1, "%s line %d: step out of order", path, line);
            CHECK_MSG(sps && sps->kind == GP_JSON_NUMBER && sps->num > 0,
                      "%s line %d: samples_per_s %g", path, line, sps ? sps->num : -1.0);
            steps++;
        }
        gp_json_value_free(v);
        p = nl ? nl + 1 : p + len;
    }
    free(t);
    return ok ? steps : -1;
}

/* The trace is one JSON document with its traceEvents. */
static void check_trace(const char *path)
{
    size_t n = 0;
    char *t = gpt_read_file(path, &n);
    CHECK_MSG(t != NULL, "no trace %s", path);
    if (!t) return;
    gp_json_reader r;
    gp_json_value *v = gp_json_parse(t, n, &r);
    CHECK_MSG(v != NULL, "trace %s: %s at byte %zu", path, r.err, r.err_at);
    const gp_json_value *ev = v ? gp_json_get(v, "traceEvents") : NULL;
    CHECK_MSG(ev && ev->kind == GP_JSON_ARRAY && ev->n > 0, "trace %s has no events", path);
    gp_json_value_free(v);
    free(t);
}

static int run_train(const char *args, const char *log)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s --no-progress >%s 2>&1", bin, args, log);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- outputs checked before the first step ----------------------------------- */

static void test_bad_outputs(void)
{
    char afile[300], log[300], met[300], a[4096], p[300];
    tmp_path(afile, sizeof afile, "afile");
    tmp_path(log, sizeof log, "bad.txt");
    tmp_path(met, sizeof met, "bad.jsonl");
    gpt_write_file(afile, "x", 1);
    static const struct {
        const char *args; /* %1$s: tmpdir */
        int rc;
        const char *says[2];
    } cases[] = {
        {"--export-weights %1$s/afile/w.st", 3, {"--export-weights '", "/afile/w.st'"}},
        {"--export-weights %1$s/nodir/w.st", 3, {"--export-weights '", "does not exist"}},
        {"--export-weights %1$s", 3, {"--export-weights '", "is a directory"}},
        {"--set train.snapshot.every_steps=5 --set train.snapshot.dir=%1$s/afile", 3,
         {"train.snapshot.dir '", "/afile' is a file"}},
        {"--set train.snapshot.every_minutes=1 --set train.snapshot.dir=/proc/nope", 3,
         {"train.snapshot.dir '/proc/nope'", "cannot create"}},
        /* the checks pass and leave nothing (fresh/ is made, probed and
         * removed); a later config error stops the run */
        {"--set train.snapshot.every_steps=5 --set train.snapshot.dir=%1$s/fresh/a/b "
         "--export-weights %1$s/w.st --set train.batch_size=100000", 2, {"exceeds", "samples"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        unlink(met);
        char extra[1024];
        snprintf(extra, sizeof extra, cases[i].args, tmpdir);
        snprintf(a, sizeof a, "%s --metrics %s %s", conf, met, extra);
        double t0 = gp_now();
        int rc = run_train(a, log);
        double dt = gp_now() - t0;
        CHECK_MSG(rc == cases[i].rc, "case %zu (%s): exit %d, expected %d", i, extra, rc,
                  cases[i].rc);
        for (int k = 0; k < 2; k++) CHECK(log_has(log, cases[i].says[k]));
        /* before any step: the metrics file was not even opened */
        CHECK_MSG(count_lines(met) == 0, "case %zu: %d metrics lines", i, count_lines(met));
        printf("bad output %zu: exit %d after %.2f s\n", i, rc, dt);
    }
    /* a metrics file that exists keeps its bytes when another output
     * (the trace) is refused: every output is checked before one is
     * opened */
    gpt_write_file(met, "{\"old\":1}\n", 10);
    snprintf(a, sizeof a, "%s --metrics %s --trace %s/nodir/t.json", conf, met, tmpdir);
    int rc_t = run_train(a, log);
    char *kept = gpt_read_file(met, NULL);
    CHECK_MSG(rc_t == 3 && log_has(log, "--trace '") && kept && !strcmp(kept, "{\"old\":1}\n"),
              "refused --trace: exit %d, metrics now '%s'", rc_t, kept ? kept : "(gone)");
    free(kept);
    unlink(met);
    tmp_path(p, sizeof p, "fresh");
    CHECK_MSG(access(p, F_OK) != 0, "%s was left behind", p);
    tmp_path(p, sizeof p, "w.st");
    CHECK_MSG(access(p, F_OK) != 0, "%s was left behind", p);
    tmp_path(p, sizeof p, "nodir");
    CHECK_MSG(access(p, F_OK) != 0, "%s was made", p);
    /* no probe file anywhere in the directory */
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        CHECK_MSG(!strstr(e->d_name, "probe"), "probe file %s left behind", e->d_name);
    if (d) closedir(d);

    /* gpipe-balance checks its outputs before profiling */
    snprintf(a, sizeof a, "%s %s --by size --write %s/afile/b.yaml >%s 2>&1", balance_bin, conf,
             tmpdir, log);
    int st = system(a);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 3, "gpipe-balance --write: status %d", st);
    CHECK(log_has(log, "--write '"));
    char *t = gpt_read_file(log, NULL);
    CHECK_MSG(t && !strstr(t, "profiling"), "gpipe-balance profiled before failing: %s", t);
    free(t);
    unlink(afile);
}

/* ---- SIGINT with snapshots on -------------------------------------------------- */

static void test_sigint(const char *ref, double ref_seconds, unsigned seed)
{
    int trials = 4, stopped = 0;
    for (int trial = 0; trial < trials; trial++) {
        char dir[300], met[300], trace[300], log[300], out[300], set_dir[400], a[4096];
        snprintf(dir, sizeof dir, "%s/si%d", tmpdir, trial);
        snprintf(met, sizeof met, "%s/si%d.jsonl", tmpdir, trial);
        snprintf(trace, sizeof trace, "%s/si%d.json", tmpdir, trial);
        snprintf(log, sizeof log, "%s/si%d.txt", tmpdir, trial);
        snprintf(out, sizeof out, "%s/si%d.st", tmpdir, trial);
        snprintf(set_dir, sizeof set_dir, "train.snapshot.dir=%s", dir);
        /* every 25 steps: the stop's snapshot is usually a new one, once in
         * a while the one just taken */
        char *argv[] = {bin, conf, "--no-progress", "--metrics", met, "--trace", trace,
                        "--set", "train.snapshot.every_steps=25", "--set", set_dir, NULL};
        pid_t pid = spawn(bin, argv, log, NULL);
        /* after 1-3 steps, then up to half the run's time */
        int lines = 1 + rand() % 3;
        double delay_ms = (double)(rand() % 1000) / 1000.0 * 500.0 * ref_seconds;
        bool stepping = wait_lines(met, lines, pid);
        CHECK_MSG(stepping, "trial %d: the run ended before step %d", trial, lines);
        if (!stepping) continue;
        sleep_ms(delay_ms);
        kill(pid, SIGINT);
        int rc = wait_exit(pid, 120);
        int steps = check_metrics(met);
        printf("SIGINT trial %d: %d step(s) + %.0f ms, exit %d at step %d\n", trial, lines,
               delay_ms, rc, steps);
        CHECK_MSG(rc == 130, "trial %d: exit %d, expected 130", trial, rc);
        check_trace(trace);
        CHECK_MSG(steps >= lines, "trial %d: %d step records", trial, steps);
        if (rc != 130 || steps < lines) continue;
        stopped++;
        CHECK(log_has(log, "by SIGINT"));
        /* the newest snapshot is of the last step that finished */
        char latest[1100];
        CHECK_OK(gp_snapshot_latest(dir, latest, sizeof latest));
        gp_st_file f;
        gp_snapshot_pos pos = {0};
        CHECK_OK(gp_snapshot_open(latest, &f, &pos));
        gp_st_free(&f);
        CHECK_MSG(pos.step == steps, "trial %d: snapshot of step %lld, %d steps in the metrics",
                  trial, (long long)pos.step, steps);
        if (steps < TOTAL_STEPS) {
            char said[64];
            snprintf(said, sizeof said, "stopped at step %d of %d by SIGINT", steps, TOTAL_STEPS);
            CHECK(log_has(log, said) && log_has(log, "--resume latest"));
        }
        /* to the end: the uninterrupted run's weights, byte for byte */
        snprintf(a, sizeof a, "%s --set %s --set train.snapshot.every_steps=25 --resume latest "
                 "--export-weights %s", conf, set_dir, out);
        rc = run_train(a, log);
        CHECK_MSG(rc == 0, "trial %d: resume exit %d", trial, rc);
        CHECK_MSG(gpt_same_files(ref, out), "trial %d (seed %u): resumed weights differ from the "
                  "uninterrupted run's", trial, seed);
    }
    CHECK(stopped == trials);
}

/* ---- SIGTERM with snapshots off ---------------------------------------------------- */

static void test_sigterm(double ref_seconds)
{
    char met[300], log[300], w[300];
    tmp_path(met, sizeof met, "st.jsonl");
    tmp_path(log, sizeof log, "st.txt");
    tmp_path(w, sizeof w, "st.safetensors");
    char *argv[] = {bin, conf, "--no-progress", "--metrics", met, "--export-weights", w, NULL};
    pid_t pid = spawn(bin, argv, log, NULL);
    bool stepping = wait_lines(met, 2, pid);
    CHECK(stepping);
    if (!stepping) return;
    sleep_ms(100.0 * ref_seconds);
    kill(pid, SIGTERM);
    int rc = wait_exit(pid, 120);
    int steps = check_metrics(met);
    printf("SIGTERM: exit %d at step %d\n", rc, steps);
    CHECK_MSG(rc == 143, "exit %d, expected 143", rc);
    char said[768];
    /* snapshots off: the weights it has go where --export-weights said,
     * rather than being lost, and it says of which step */
    snprintf(said, sizeof said, "stopped at step %d of %d by SIGTERM; snapshots are off, so the "
             "weights of step %d (not the %d the run was to train) are written to "
             "--export-weights '%s'", steps, TOTAL_STEPS, steps, TOTAL_STEPS, w);
    CHECK_MSG(log_has(log, said), "no \"%s\" in the log", said);
    gp_st_file f;
    CHECK_OK(gp_st_read(w, &f));
    gp_st_free(&f);
}

/* ---- a second signal while stopping --------------------------------------------------- */

static bool has_temporary(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool yes = false;
    struct dirent *e;
    while ((e = readdir(d))) yes |= strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return yes;
}

/* A run whose only snapshot before the end is a stop's, which pauses
 * slow_ms halfway, into dir, its metrics into met and its log into log
 * (tmpdir/<tag>, .jsonl, .txt), once it has taken 2 steps; -1 if it never
 * did. */
static pid_t start_slow_stop(const char *tag, const char *slow_ms, char dir[300],
                             char met[300], char log[300])
{
    char set_dir[400];
    snprintf(dir, 300, "%s/%.16s", tmpdir, tag);
    snprintf(met, 300, "%s/%.16s.jsonl", tmpdir, tag);
    snprintf(log, 300, "%s/%.16s.txt", tmpdir, tag);
    snprintf(set_dir, sizeof set_dir, "train.snapshot.dir=%s", dir);
    char *argv[] = {bin, conf, "--no-progress", "--metrics", met, "--set",
                    "train.snapshot.every_steps=1000", "--set", set_dir, NULL};
    pid_t pid = spawn(bin, argv, log, slow_ms);
    bool stepping = wait_lines(met, 2, pid);
    CHECK(stepping);
    return stepping ? pid : -1;
}

static void test_second_signal(void)
{
    char dir[300], met[300], log[300];
    pid_t pid = start_slow_stop("s2", "5000", dir, met, log); /* the write pauses 5 s */
    if (pid < 0) return;
    kill(pid, SIGINT);
    double t0 = gp_now();
    while (!has_temporary(dir) && gp_now() - t0 < 60) sleep_ms(1);
    CHECK_MSG(has_temporary(dir), "the stop's snapshot never started");
    /* within 2 s of the first it would be the same request
     * (test_group_signal); the write pauses 5 s */
    while (gp_now() - t0 < 2.3) sleep_ms(5);
    CHECK_MSG(has_temporary(dir), "the stop's snapshot ended within its 5 s pause");
    double t1 = gp_now();
    kill(pid, SIGINT);
    int rc = wait_exit(pid, 120);
    double dt = gp_now() - t1;
    printf("second SIGINT: exit %d %.3f s after it, the stop's snapshot %.3f s into it\n", rc, dt,
           t1 - t0);
    CHECK_MSG(rc == 130, "exit %d, expected 130", rc);
    CHECK_MSG(dt < 2.5, "took %.2f s to exit after the second signal (the write pauses 5 s)", dt);
    CHECK(log_has(log, "second signal: quitting at once"));
    /* the half-written snapshot is no snapshot (and is cleaned up) */
    CHECK(gp_snapshot_count(dir) == 0);
    CHECK(check_metrics(met) >= 2);
}

/* ---- one stop signalled twice (timeout, Slurm: the process, then its group) ---- */

static void test_group_signal(void)
{
    char dir[300], met[300], log[300];
    /* the stop's snapshot slowed so that the repeat lands while it is
     * written */
    pid_t pid = start_slow_stop("gs", "1500", dir, met, log);
    if (pid < 0) return;
    kill(pid, SIGTERM); /* as GNU timeout: the process ... */
    sleep_ms(0.05);
    kill(pid, SIGTERM); /* ... then its group */
    sleep_ms(400);
    kill(pid, SIGTERM); /* a third, still within 2 s, while the stop's snapshot is
                         * written (1.5 s): the same request (the second may
                         * have merged with the first while pending) */
    int rc = wait_exit(pid, 120);
    int steps = check_metrics(met);
    printf("SIGTERM x3 within 0.5 s: exit %d at step %d, %d snapshot(s)\n", rc, steps,
           gp_snapshot_count(dir));
    CHECK_MSG(rc == 143, "exit %d, expected 143", rc);
    CHECK_MSG(gp_snapshot_count(dir) == 1, "%d snapshots: the stop's final snapshot was lost",
              gp_snapshot_count(dir));
    CHECK(log_has(log, "the same stop (send it again later to quit at once)"));
    char said[96];
    snprintf(said, sizeof said, "stopped at step %d of %d by SIGTERM", steps, TOTAL_STEPS);
    if (steps < TOTAL_STEPS) CHECK(log_has(log, said));
    FILE *f = fopen(log, "r");
    char line[512];
    bool quit = false;
    while (f && fgets(line, sizeof line, f)) quit |= strstr(line, "quitting at once") != NULL;
    if (f) fclose(f);
    CHECK_MSG(!quit, "a repeat within 2 s quit at once");
}

/* ---- a signal while a large model is initialised; one too large ------------ */

/* An llm.c token file of n byte tokens (header of 256 int32, then uint16). */
static void write_token_file(const char *path, int n)
{
    FILE *f = fopen(path, "wb");
    int32_t hdr[256] = {20240520, 1, n};
    bool ok = f && fwrite(hdr, sizeof hdr, 1, f) == 1;
    for (int i = 0; ok && i < n; i++) {
        uint16_t t = (uint16_t)(97 + i % 26);
        ok = fwrite(&t, 2, 1, f) == 1;
    }
    if (f) fclose(f);
    CHECK_MSG(ok, "cannot write %s", path);
}

static void test_large_model(void)
{
    char data[300], cfg[300], log[300], path[400];
    tmp_path(data, sizeof data, "tok");
    mkdir(data, 0755);
    snprintf(path, sizeof path, "%s/t_train.bin", data);
    write_token_file(path, 4000);
    snprintf(path, sizeof path, "%s/t_val.bin", data);
    write_token_file(path, 400);
    tmp_path(cfg, sizeof cfg, "big.yaml");
    /* 300 M parameters: 4.8 GB of weights, gradients and Adam's moments,
     * seconds of initialisation (the first layers' in the first second) */
    char text[1024];
    snprintf(text, sizeof text,
             "model:\n  input: [16]\n"
             "  gpt: {layers: 24, heads: 16, width: 1024, positions: 16, vocab: 256}\n"
             "pipeline: {devices: [cpu:0], chunks: 1}\n"
             "data: {dataset: tokens, path: %s}\n"
             "train: {steps: 2, batch_size: 2, log_every: 0}\n", data);
    gpt_write_file(cfg, text, strlen(text));
    tmp_path(log, sizeof log, "big.txt");
    char *argv[] = {bin, cfg, "--no-progress", NULL};
    pid_t pid = spawn(bin, argv, log, NULL);
    sleep_ms(700);
    double t0 = gp_now();
    kill(pid, SIGTERM);
    int rc = wait_exit(pid, 120);
    printf("SIGTERM 0.7 s into a 300 M-parameter model: exit %d %.2f s after it\n", rc,
           gp_now() - t0);
    CHECK_MSG(rc == 143, "exit %d, expected 143", rc);
    CHECK(log_has(log, "stopped by a signal while initialising the model (at layer"));
    /* 160 G parameters: refused before anything is allocated or profiled,
     * with the need and the memory (it grew for a minute, deaf to signals) */
    double t1 = gp_now();
    char a[1024];
    snprintf(a, sizeof a, "%s --set model.gpt.width=8192 --set model.gpt.heads=8 --set "
             "model.gpt.layers=200 --set pipeline.devices=[cpu:0,cpu:1]", cfg);
    rc = run_train(a, log);
    CHECK_MSG(rc == 4, "160 G parameters: exit %d, expected 4", rc);
    CHECK_MSG(gp_now() - t1 < 30, "the refusal took %.1f s", gp_now() - t1);
    CHECK(log_has(log, "the model's 161084817408 parameters need 1.8 TiB for their weights, "
                       "gradients and momentum alone, more than"));
    CHECK(log_has(log, "which they share: make the model smaller"));
}

/* A signal during balance: auto's profile ends it before the next layer,
 * not after the whole profile (issue 77: ~10 s after it was acknowledged;
 * this model's profile takes ~15 s on two cores). */
static void test_profile_signal(void)
{
    char cfg[300], log[300];
    tmp_path(cfg, sizeof cfg, "prof.yaml");
    const char *text = "model:\n  input: [128]\n"
                       "  llama: {layers: 6, heads: 8, width: 512, intermediate: 1536, vocab: "
                       "4096, positions: 128}\n"
                       "pipeline: {devices: [cpu:0, cpu:1], chunks: 2}\n"
                       "data: {dataset: synthetic}\n"
                       "train: {steps: 2, batch_size: 16, log_every: 0}\n";
    gpt_write_file(cfg, text, strlen(text));
    tmp_path(log, sizeof log, "prof.txt");
    char *argv[] = {bin, cfg, "--no-progress", NULL};
    unsetenv("GPIPE_BALANCE"); /* (the other tests balance by FLOPs: main) */
    pid_t pid = spawn(bin, argv, log, NULL);
    setenv("GPIPE_BALANCE", "flops", 1);
    /* until the profile has begun */
    double t_start = gp_now();
    while (!log_has(log, "balance: profiling ") && gp_now() - t_start < 60) sleep_ms(50);
    CHECK_MSG(log_has(log, "balance: profiling "), "the run profiles its layers");
    sleep_ms(300);
    double t0 = gp_now();
    kill(pid, SIGINT);
    int rc = wait_exit(pid, 120);
    double took = gp_now() - t0;
    printf("SIGINT during balance: auto's profile: exit %d %.2f s after it\n", rc, took);
    CHECK_MSG(rc == 130, "exit %d, expected 130", rc);
    CHECK(log_has(log, "stopped by a signal while profiling the layers for balance: auto"));
    /* one layer's measurement at most (each well under 3 s here, more under the
     * sanitizers), not the
     * ~15 s of the rest of the profile */
    CHECK_MSG(took < 8, "the run stopped %.1f s after the signal", took);
}

/* ---- the library ------------------------------------------------------------------------- */

typedef struct {
    gp_run *run;
    const char *metrics;
    int lines; /* stop once the metrics file has this many */
} stopper_arg;

/* Another thread stops the run once its metrics have a->lines lines. */
static void *stopper(void *p)
{
    stopper_arg *a = p;
    double t0 = gp_now();
    while (count_lines(a->metrics) < a->lines && gp_now() - t0 < 60) sleep_ms(0.5);
    gp_run_stop(a->run, SIGINT);
    return NULL;
}

static void test_library(void)
{
    char met[300];
    tmp_path(met, sizeof met, "lib.jsonl");
    gp_run *run;
    /* asked before: stops before the first step */
    CHECK_OK(gp_run_parse("lib.yaml", k_cfg, NULL, 0, &run));
    if (!run) return;
    gp_run_stop(run, SIGTERM);
    gp_metrics m;
    CHECK_ERR(gp_run_train(run, met, &m), GP_ERR_STOPPED,
              "stopped by SIGTERM while loading the data, before the first step");
    CHECK(count_lines(met) == 0);
    gp_run_free(run);

    /* asked by another thread while it trains: stops between steps */
    CHECK_OK(gp_run_parse("lib.yaml", k_cfg, NULL, 0, &run));
    if (!run) return;
    stopper_arg a = {run, met, 3};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, stopper, &a) == 0);
    gp_status s = gp_run_train(run, met, &m);
    pthread_join(t, NULL);
    int steps = check_metrics(met);
    char said[128];
    snprintf(said, sizeof said, "stopped at step %d of %d by SIGINT; nothing saved since step 0",
             steps, TOTAL_STEPS);
    CHECK_ERR(s, GP_ERR_STOPPED, said);
    CHECK_MSG(steps >= 3 && steps < TOTAL_STEPS, "stopped after %d steps", steps);
    gp_run_free(run);

    /* asked while the first epoch's evaluation runs (a test set of 40000
     * makes it last): stops when it ends, not after one more step.  The
     * stopper asks once the epoch's 5th and last step is in the metrics,
     * which is just before the evaluation begins, or in it */
    char *slow = malloc(strlen(k_cfg) + 64);
    char *at = slow ? strstr(strcpy(slow, k_cfg), "test: 64") : NULL;
    CHECK(at != NULL);
    if (!at) {
        free(slow);
        return;
    }
    memcpy(at, "test: 40000", 11);
    strcpy(at + 11, strstr(k_cfg, "test: 64") + 8);
    remove(met);
    CHECK_OK(gp_run_parse("lib.yaml", slow, NULL, 0, &run));
    free(slow);
    if (!run) return;
    a = (stopper_arg){run, met, 5};
    CHECK(pthread_create(&t, NULL, stopper, &a) == 0);
    double t0 = gp_now();
    s = gp_run_train(run, met, &m);
    pthread_join(t, NULL);
    steps = check_metrics(met);
    printf("stop during the evaluation: %d steps, %.2f s\n", steps, gp_now() - t0);
    snprintf(said, sizeof said, "stopped at step 5 of %d by SIGINT", TOTAL_STEPS);
    CHECK_ERR(s, GP_ERR_STOPPED, said);
    CHECK_MSG(steps == 5, "an epoch of 5 steps, then %d", steps - 5);
    gp_run_free(run);
}

int main(void)
{
    gpt_binary_path(bin, sizeof bin, "gpipe-train");
    gpt_binary_path(balance_bin, sizeof balance_bin, "gpipe-balance");
    if (!gpt_make_tmpdir(tmpdir, sizeof tmpdir, "gpipe_signals_")) return 1;
    /* auto balance by estimated FLOPs: instant and the same in every run */
    setenv("GPIPE_BALANCE", "flops", 1);
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    const char *env = getenv("GPIPE_TEST_SEED");
    if (env) seed = (unsigned)strtoul(env, NULL, 10);
    srand(seed);
    double t0 = gp_now();
    tmp_path(conf, sizeof conf, "s.yaml");
    gpt_write_file(conf, k_cfg, strlen(k_cfg));
    if (access(bin, X_OK) == 0 && access(balance_bin, X_OK) == 0) {
        test_bad_outputs();
        char ref[300], log[300], a[1024];
        tmp_path(ref, sizeof ref, "ref.st");
        tmp_path(log, sizeof log, "ref.txt");
        snprintf(a, sizeof a, "%s --export-weights %s", conf, ref);
        double r0 = gp_now();
        CHECK(run_train(a, log) == 0);
        double ref_seconds = gp_now() - r0;
        printf("uninterrupted run: %.2f s (seed %u)\n", ref_seconds, seed);
        test_sigint(ref, ref_seconds, seed);
        test_sigterm(ref_seconds);
        test_second_signal();
        test_group_signal();
        test_large_model();
    test_profile_signal();
    } else {
        CHECK_MSG(false, "%s or %s not built", bin, balance_bin);
    }
    /* in this process, after the forks: its threads are not forked with them */
    test_library();
    printf("(%.1f s)\n", gp_now() - t0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (!gpt_failed && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return gpt_finish("test_signals");
}
