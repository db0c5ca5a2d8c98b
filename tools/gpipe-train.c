/*
 * gpipe-train — train the model a YAML run description describes.
 * A thin layer over the library: parse arguments, load the config, then
 * either print the model summary (--dry-run) or train.  While training,
 * SIGINT, SIGTERM and SIGHUP stop the run cleanly between steps: the
 * library does the stopping; this program takes the signals, on a thread
 * of its own, and only records them.
 */
#include "pipeline/procs.h"
#include "train/train.h"
#include "train/snapshot.h"
#include "trace/trace.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "cli.h"

static void usage(FILE *f)
{
    fputs("usage: gpipe-train CONFIG.yaml [options]\n"
          "       gpipe-train --resume SNAPSHOT [options]   (the config stored in it)\n"
          "\n"
          "Train the sequential model described by CONFIG.yaml (model, pipeline, data,\n"
          "train sections; see docs/config.md) and evaluate it on the test split.\n"
          "An option's VALUE may also follow an '=' (--set=KEY=VALUE).\n"
          "\n"
          "options:\n"
          "  --set KEY=VALUE    (or --set=KEY=VALUE)\n"
          "                     override a config value; VALUE is parsed as YAML, e.g.\n"
          "                     --set train.epochs=1 --set pipeline.devices=[cpu:0,cpu:1]\n"
          "                     (repeatable; one line each; list items by index:\n"
          "                     model.layers.0.out=32)\n"
          "  --dry-run          print the model summary (per layer: output shape,\n"
          "                     parameters, FLOPs, activation bytes; totals) and exit;\n"
          "                     it writes no file (no --metrics, --trace, --tensorboard,\n"
          "                     --export-weights) and with CONFIG reads no --resume\n"
          "  -v, --verbose      with --dry-run, also every default the config left to\n"
          "                     gpipe (key = value)\n"
          "  --gpu h100|h200    with --dry-run, also a roofline floor of the step on\n"
          "                     one such GPU (per layer type: launches, FLOPs, bytes,\n"
          "                     time), from the shapes alone\n"
          "  --metrics FILE     (or --metrics=FILE) write JSON Lines: one object per step\n"
          "                     (step, epoch, loss, accuracy, lr, samples_per_s,\n"
          "                     step_seconds, data_wait_seconds, bad_files (the run's\n"
          "                     total so far), grad_norm (with train.clip_grad_norm),\n"
          "                     devices[]: peak_bytes, its categories, current_bytes,\n"
          "                     host_waits, launches and adapter_bytes)\n"
          "                     and one per evaluation (test_loss,\n"
          "                     test_accuracy); docs/timelines-and-metrics.md says\n"
          "                     each;\n"
          "                     scripts/metrics.py plots, summarises and compares\n"
          "                     these files\n"
          "  --tensorboard DIR  (or --tensorboard=DIR; config: train.tensorboard) write\n"
          "                     TensorBoard event files into DIR as the run goes: every\n"
          "                     number of --metrics (train/loss, test/accuracy, lr,\n"
          "                     throughput/samples_per_s, memory/<device>/peak_bytes, ...);\n"
          "                     a run replaces DIR's event files, a resumed one goes on\n"
          "                     in them (docs/config.md, train.tensorboard)\n"
          "  --trace FILE.json  write a timeline of every device (Chrome trace format:\n"
          "                     open in Perfetto or chrome://tracing; scripts/timeline.py\n"
          "                     summarises and compares traces)\n"
          "  --trace-steps A:B  record only steps A..B (0-based; A:, :B and A work)\n"
          "  --resume PATH      go on from a snapshot (train.snapshot writes them);\n"
          "                     'latest' = the newest complete one in train.snapshot.dir.\n"
          "                     With the same devices, chunks and seed the result is bit\n"
          "                     for bit the uninterrupted run's; without CONFIG the\n"
          "                     snapshot's own config (+ --set) is used\n"
          "  --export-weights OUT.safetensors\n"
          "                     write the final weights, named as PyTorch's state_dict()\n"
          "                     of the equivalent nn.Sequential (docs/snapshots.md); with\n"
          "                     --resume and no steps left it just converts the snapshot\n"
          "  --convert          with --resume S --export-weights OUT: write S's weights to\n"
          "                     OUT (in --export-format) and stop: no step, no data read,\n"
          "                     on one CPU device whatever devices the config names\n"
          "  --export-format F  what --export-weights writes: gpipe (the default), hf\n"
          "                     (a folder that from_pretrained loads: config.json and\n"
          "                     model.safetensors, for a model.llama sharded past 5 GB;\n"
          "                     a GPT-2's OUT ending in .safetensors: that file alone),\n"
          "                     hf-bf16 (a Llama's folder in bf16: half the bytes)\n"
          "                     or llmc (llm.c's gpt2_124M.bin layout, FP32, the head\n"
          "                     tied to wte); hf and\n"
          "                     llmc need layers named as Hugging Face's (docs/config.md)\n"
          "  --progress         force the one-line progress bar (default on a terminal)\n"
          "  --no-progress      plain log lines every train.log_every steps\n"
          "  -q, --quiet        only errors\n"
          "  --version          print the version and exit\n"
          "  -h, --help         this text\n"
          "  --help-config      every config key with its type, default, range and\n"
          "                     meaning, from the table the parser checks against\n"
          "                     (--help-config=markdown: as Markdown tables)\n"
          "\n"
          "processes: mpirun -np N gpipe-train CONFIG.yaml runs one device per process\n"
          "(N = pipeline.devices x pipeline.replicas; rank r runs device r mod n of\n"
          "replica r div n); rank 0 prints and writes --metrics and --tensorboard; a\n"
          "snapshot is rank 0's file and the other ranks' parts beside it\n"
          "(snapshot-<step>.parts/rank<r>.safetensors), so train.snapshot.dir must be\n"
          "one directory every rank sees; each rank writes its\n"
          "own --trace (FILE.rank<r>.json; scripts/timeline.py merge joins them)\n"
          "\n"
          "environment: GPIPE_LOG=debug|info|warn|error|quiet sets log verbosity;\n"
          "GPIPE_BALANCE=flops makes balance: auto split by estimated FLOPs instead of\n"
          "a profile (the same split every run); GPIPE_PROFILE_CACHE=DIR or off: where\n"
          "balance: auto keeps its profiles for the next run of the same model, batch,\n"
          "device and build (default ~/.cache/gpipe/profiles); GPIPE_PROCS_CHANNELS=0\n"
          "sends GPU stages' data between processes through host copies instead of\n"
          "NCCL channels. docs/configs.md (\"Environment variables\") lists the rest:\n"
          "the processor switch, A/B switches for CPU and GPU paths, test hooks.\n"
          "\n"
          "signals: SIGINT (Ctrl-C), SIGTERM, SIGHUP or SIGUSR1 stops after the current\n"
          "step: a final snapshot when train.snapshot is on (else it says what was not\n"
          "saved), the metrics and trace closed as valid files.  A second signal 2 s or\n"
          "more after the first quits at once; signals within 2 s of the first are the\n"
          "same request (timeout, Slurm, mpirun and container runtimes signal the process\n"
          "and then its group).  Under mpirun send SIGUSR1 to mpirun (kill -USR1\n"
          "PID): Open MPI passes it on, but follows SIGINT and SIGTERM with SIGKILL\n"
          "1 s later.\n"
          "\n"
          "exit status: 0 success; 2 bad command line or config; 3 data or file\n"
          "error (every output path is checked before the first step); 4 failure\n"
          "during training (out of memory, NaN loss, backend error); 128 + the\n"
          "signal's number when a signal stopped it: 130 SIGINT, 143 SIGTERM,\n"
          "129 SIGHUP, 138 SIGUSR1.\n",
          f);
}

/* The signal that asked the run to stop, 0 while none did: the only state
 * the handler touches.  A lock-free atomic, so storing it is
 * async-signal-safe and the training thread sees it whichever thread the
 * signal lands on. */
static _Atomic int stop_signal;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the signal flag needs a lock-free atomic int");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the first signal's time needs a lock-free atomic");

/* Whether this process says what a signal does (under mpirun rank 0 only,
 * where one signal reaches every rank). */
static volatile sig_atomic_t announce = 1;
/* Set once the run has failed and this rank waits for mpirun to end every
 * rank: the SIGTERM that ending brings is not a user's stop, and saying
 * "stopping after the current step" after the error misled. */
static volatile sig_atomic_t ending = 0;
/* Whether stderr is a terminal, where the message starts a line of its own
 * after the progress bar (set before the handlers are installed). */
static volatile sig_atomic_t on_terminal = 0;

static void say(const char *s)
{
    if (write(STDERR_FILENO, s, strlen(s)) < 0) {} /* nothing to do about it here */
}

/* When the first signal came (CLOCK_MONOTONIC, ns; 0 until the handler
 * has stored it) and whether the merge of a repeat was said. */
static _Atomic long long first_ns;
static volatile sig_atomic_t merge_said = 0;

/* Signals this close to the first are the same request: GNU timeout,
 * Slurm, mpirun and container runtimes send one to the process and then
 * to its group, so one stop arrives twice within microseconds. */
#define SAME_REQUEST_NS 2000000000LL

static long long monotonic_ns(void)
{
    struct timespec ts; /* clock_gettime is async-signal-safe (POSIX.1-2008) */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The first signal asks to stop after the current step; a second request
 * (the stop itself taking too long: a large snapshot) ends the process at
 * once.  A signal within SAME_REQUEST_NS of the first is not a second
 * request (1 in 3 `timeout` runs lost their final snapshot to its group
 * signal).  Only async-signal-safe calls: atomics, clock_gettime,
 * strlen, write, _exit. */
static void on_stop_signal(int signo)
{
    if (ending) _exit(128 + signo);
    long long now = monotonic_ns();
    int none = 0;
    if (!atomic_compare_exchange_strong(&stop_signal, &none, signo)) {
        long long t0 = atomic_load(&first_ns);
        if (t0 == 0 || now - t0 < SAME_REQUEST_NS) { /* the same request again */
            if (announce && !merge_said) {
                merge_said = 1;
                say(on_terminal ? "\ngpipe-train: a repeat within 2 s of the first signal: the "
                                  "same stop (send it again later to quit at once)\n"
                                : "gpipe-train: a repeat within 2 s of the first signal: the "
                                  "same stop (send it again later to quit at once)\n");
            }
            return;
        }
        if (announce)
            say(on_terminal ? "\ngpipe-train: second signal: quitting at once\n"
                            : "gpipe-train: second signal: quitting at once\n");
        _exit(128 + signo);
    }
    atomic_store(&first_ns, now > 0 ? now : 1);
    if (!announce) return;
    /* one write (ranks and threads do not interleave within it), built
     * with memcpy and strlen, which are async-signal-safe */
    const char *parts[] = {on_terminal ? "\ngpipe-train: " : "gpipe-train: ",
                           signo == SIGINT    ? "SIGINT"
                           : signo == SIGTERM ? "SIGTERM"
                           : signo == SIGUSR1 ? "SIGUSR1"
                                              : "SIGHUP",
                           ": stopping after the current step (send it again 2 s or more later to "
                           "quit at once, without the final snapshot)\n"};
    char line[256];
    size_t n = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t k = strlen(parts[i]);
        if (k > sizeof line - 1 - n) k = sizeof line - 1 - n; /* (never: the parts fit) */
        memcpy(line + n, parts[i], k);
        n += k;
    }
    line[n] = '\0';
    say(line);
}

/* The thread that takes the stop signals (sigwait), so that no signal
 * ever interrupts a thread that computes.  Not only tidiness: on the
 * machine this was written on (AVX-512 in a VM), signals handled on the
 * computing threads corrupted memory about once in 80 stops (crashes in
 * the evaluation under way; gdb finds the core's AVX-512 register section
 * smaller than it expects, so the kernel's signal frame is the suspect),
 * and none in 300 with the signals taken here. */
static void *signal_thread(void *arg)
{
    const sigset_t *set = arg;
    for (;;) {
        int signo;
        if (sigwait(set, &signo) == 0) on_stop_signal(signo);
    }
    return NULL;
}

/* Called before any other thread exists: every thread made later (the
 * pipeline's workers, the loader, OpenMP's) inherits the blocked mask. */
static void install_stop_handlers(void)
{
    on_terminal = isatty(STDERR_FILENO);
    static sigset_t set;
    sigemptyset(&set);
    /* SIGUSR1 too: Open MPI's mpirun passes it on to every rank as it is,
     * where it turns SIGINT and SIGTERM into a kill 1 s later */
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
    enum { N_SIGS = sizeof sigs / sizeof sigs[0] };
    for (int i = 0; i < N_SIGS; i++) sigaddset(&set, sigs[i]);
    /* The handler too, for a thread that unblocks them anyway (a library's):
     * the same function, async-signal-safe; interrupted reads and writes
     * restart, as the loop only polls the flag between steps. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sa.sa_mask = set;
    for (int i = 0; i < N_SIGS; i++) sigaction(sigs[i], &sa, NULL);
    /* A log reader that went away (`... 2>&1 | tee log` whose tee a hangup
     * ended first, `| head`) or a file-size limit (ulimit -f) would end the
     * process by SIGPIPE or SIGXFSZ at its next write, before the final
     * snapshot.  Ignored, the write fails instead (EPIPE: that log line is
     * lost; EFBIG: the snapshot's writer says so and keeps the last one) */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    pthread_t t;
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) == 0 &&
        pthread_create(&t, NULL, signal_thread, &set) == 0)
        pthread_detach(t);
    else
        pthread_sigmask(SIG_UNBLOCK, &set, NULL); /* no thread: the handler takes them */
}


/* This process's rank as its launcher set it before MPI starts (Open MPI,
 * PMIx, MPICH's PMI, Slurm's srun), 0 when none did. */
static int launched_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                       "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

/* Under mpirun, before anything else is collective: every rank must have
 * loaded its config, and the same one (the YAML text and the --set
 * options; a rank that differs would hang, overflow a message or train
 * silently wrong later).  `loaded` is this rank's load; the ranks exchange
 * it and a checksum, so each learns the same outcome and none is left
 * waiting.  *own: the error is this rank's own load's (to be said with its
 * rank where not every rank failed), else it is said by rank 0.  `run`
 * describes the options that decide what the ranks do together
 * (--dry-run, --resume, --export-weights): one rank given --dry-run or
 * --export-weights alone, or another snapshot to resume, waited forever
 * for the others. */
static gp_status agree_on_config(gp_status loaded, gp_config *cfg, const char *run, bool *own)
{
    int N = gp_procs_size(), me = gp_procs_rank();
    uint32_t mine[3] = {loaded != GP_OK, 0, (uint32_t)crc32(0L, (const Bytef *)run,
                                                             (uInt)strlen(run))};
    if (loaded == GP_OK) {
        uLong c = crc32(0L, Z_NULL, 0);
        c = crc32(c, (const Bytef *)cfg->text, (uInt)strlen(cfg->text));
        c = crc32(c, (const Bytef *)"\n--set\n", 7);
        c = crc32(c, (const Bytef *)cfg->overrides, (uInt)strlen(cfg->overrides));
        mine[1] = (uint32_t)c;
    }
    uint32_t *all = calloc((size_t)N * 3, sizeof *all);
    gp_status s = all ? gp_procs_allgather_bytes(mine, all, sizeof mine)
                      : gp_error_set(GP_ERR_OOM, "out of host memory");
    if (s != GP_OK) { /* the exchange itself failed: nothing can be agreed */
        fprintf(stderr, "gpipe-train: rank %d of %d: %s\n", me, N, gp_last_error());
        gp_procs_abort(gp_status_exit_code(s));
    }
    int failed = 0, first_bad = -1, differs = -1, runs_differ = -1;
    for (int r = 0; r < N; r++) {
        failed += (int)all[3 * r];
        if (all[3 * r] && first_bad < 0) first_bad = r;
        if (!all[3 * r] && !all[0] && all[3 * r + 1] != all[1] && differs < 0) differs = r;
        if (all[3 * r + 2] != all[2] && runs_differ < 0) runs_differ = r;
    }
    free(all);
    *own = loaded != GP_OK && failed < N; /* (alike everywhere: rank 0 says it once) */
    if (loaded != GP_OK) return loaded;
    if (failed)
        s = gp_error_set(GP_ERR_INVALID, "%d of %d ranks could not load the config (rank %d's "
                         "message says why); start every rank with the same config file and "
                         "--set options", failed, N, first_bad);
    else if (differs >= 0)
        s = gp_error_set(GP_ERR_INVALID, "rank %d's config is not rank 0's (the YAML text or "
                         "the --set options differ; this rank read %s): start every rank with "
                         "the same config file and --set options", differs, cfg->path);
    else if (runs_differ >= 0)
        s = gp_error_set(GP_ERR_INVALID, "rank %d's --dry-run, --resume or --export-weights is "
                         "not rank 0's (rank 0 has %s): start every rank with the same options",
                         runs_differ, run);
    if (s != GP_OK) gp_config_free(cfg);
    return s;
}

int main(int argc, char **argv)
{
    const char *config = NULL, *metrics = NULL, *trace = NULL, *resume = NULL, *export = NULL;
    const char *gpu = NULL; /* --gpu: the roofline estimate's GPU */
    const char *tensorboard = NULL;
    int64_t trace_first = 0, trace_last = -1;
    const char **sets = calloc((size_t)argc, sizeof *sets);
    int n_sets = 0, dry = 0, progress = -1, quiet = 0, verbose = 0, export_format = 0;
    int convert = 0;
    int set_value_at = -1; /* argv index of the last --set's value */
    gp_names_use_flags(); /* messages name --set, --resume, ... */
    if (!sets) return EXIT_RUNTIME;
    /* the options that take a value, as "--opt VALUE" or "--opt=VALUE" */
    static const char *const valued[] = {"--set", "--metrics", "--trace", "--trace-steps",
                                         "--resume", "--export-weights", "--tensorboard",
                                         "--export-format", "--gpu"};
    for (int i = 1; i < argc; i++) {
        char opt[32];
        const char *inline_v =
            cli_split_valued(argv[i], valued, sizeof valued / sizeof valued[0], opt, sizeof opt);
        const char *a = inline_v ? opt : argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (launched_rank() == 0) usage(stdout); /* under mpirun: once */
            free(sets);
            return EXIT_OK;
        } else if (!strcmp(a, "--version")) {
            if (launched_rank() == 0) printf("gpipe-train %s\n", gp_version());
            free(sets);
            return EXIT_OK;
        } else if (!strcmp(a, "--help-config") || !strcmp(a, "--help-config=markdown") ||
                   !strcmp(a, "--help-config=text")) {
            if (launched_rank() == 0) gp_config_help(stdout, !strcmp(a + 13, "=markdown"));
            free(sets);
            return EXIT_OK;
        } else if (!strcmp(a, "--set") || !strcmp(a, "--metrics") || !strcmp(a, "--trace") ||
                   !strcmp(a, "--trace-steps") || !strcmp(a, "--resume") ||
                   !strcmp(a, "--export-weights") || !strcmp(a, "--tensorboard") ||
                   !strcmp(a, "--export-format")) {
            if (!inline_v && i + 1 >= argc) {
                fprintf(stderr, "gpipe-train: %s needs a value; see --help\n", a);
                free(sets);
                return EXIT_USAGE;
            }
            const char *v = inline_v ? inline_v : argv[++i];
            if (!inline_v && !strncmp(v, "--", 2) && v[2]) { /* "--metrics --quiet": forgotten */
                fprintf(stderr, "gpipe-train: %s needs a value, and '%s' is an option%s; see "
                        "--help\n", a, v, strcmp(a, "--set") ? " (for a file of that name "
                        "write ./ before it)" : "");
                free(sets);
                return EXIT_USAGE;
            }
            set_value_at = !strcmp(a, "--set") ? i : -1; /* its value is argv[i], either form */
            if (!strcmp(a, "--set")) sets[n_sets++] = v;
            else if (!strcmp(a, "--metrics")) metrics = v;
            else if (!strcmp(a, "--trace")) trace = v;
            else if (!strcmp(a, "--resume")) resume = v;
            else if (!strcmp(a, "--export-weights")) export = v;
            else if (!strcmp(a, "--tensorboard")) tensorboard = v;
            else if (!strcmp(a, "--export-format")) {
                export_format = !strcmp(v, "gpipe") ? 0 : !strcmp(v, "hf") ? 1
                              : !strcmp(v, "llmc") ? 2 : !strcmp(v, "hf-bf16") ? 3 : -1;
                if (export_format < 0) {
                    fprintf(stderr, "gpipe-train: --export-format '%s': expected gpipe, hf, "
                            "hf-bf16 or llmc\n", v);
                    free(sets);
                    return EXIT_USAGE;
                }
            }
            else if (!gp_trace_parse_range(v, &trace_first, &trace_last)) {
                fprintf(stderr, "gpipe-train: --trace-steps '%s': expected A:B with 0 <= A <= B "
                                "(or A:, :B, A)\n", v);
                free(sets);
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--dry-run")) {
            dry = 1;
        } else if (!strcmp(a, "--convert")) {
            convert = 1;
        } else if (!strcmp(a, "--gpu")) {
            if (inline_v) {
                gpu = inline_v;
            } else if (i + 1 < argc) {
                gpu = argv[++i];
            } else {
                fputs("gpipe-train: --gpu needs a GPU: h100 or h200\n", stderr);
                free(sets);
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--progress")) {
            progress = 1;
        } else if (!strcmp(a, "--no-progress")) {
            progress = 0;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            quiet = 1;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            verbose = 1;
        } else if (a[0] == '-') {
            fprintf(stderr, "gpipe-train: unknown option '%s'; see --help\n", a);
            free(sets);
            return EXIT_USAGE;
        } else if (!config) {
            config = a;
        } else {
            fprintf(stderr, "gpipe-train: more than one config given ('%s' and '%s')%s\n",
                    config, a, set_value_at == i - 1 ? SET_SPLIT_HINT : "");
            free(sets);
            return EXIT_USAGE;
        }
    }
    if (!trace && (trace_first != 0 || trace_last != -1)) {
        fputs("gpipe-train: --trace-steps chooses the steps --trace records; give --trace "
              "FILE.json too\n", stderr);
        free(sets);
        return EXIT_USAGE;
    }
    if (convert && (!resume || !export || dry || metrics || trace || tensorboard)) {
        fputs(!resume || !export
                  ? "gpipe-train: --convert writes a snapshot's weights: give --resume SNAPSHOT "
                    "(or latest) and --export-weights OUT\n"
                  : "gpipe-train: --convert trains nothing, so it writes no --metrics, --trace "
                    "or --tensorboard and has no --dry-run; leave them out\n",
              stderr);
        free(sets);
        return EXIT_USAGE;
    }
    if (dry && !convert && (metrics || trace || tensorboard || export || (config && resume))) {
        /* (they were accepted and nothing was written, or the snapshot not
         * even opened) */
        const char *opt = metrics ? "--metrics" : trace ? "--trace" : tensorboard ? "--tensorboard"
                          : export ? "--export-weights" : "--resume";
        if (config && resume && opt[2] == 'r')
            fputs("gpipe-train: --dry-run plans CONFIG as it is and does not read --resume's "
                  "snapshot; leave one out (--dry-run --resume SNAPSHOT without CONFIG "
                  "describes the snapshot's run)\n", stderr);
        else
            fprintf(stderr, "gpipe-train: --dry-run trains nothing and writes no file, so it "
                    "takes no %s; leave it out\n", opt);
        free(sets);
        return EXIT_USAGE;
    }
    if (!export && export_format) {
        fputs("gpipe-train: --export-format chooses what --export-weights writes; give "
              "--export-weights OUT too\n", stderr);
        free(sets);
        return EXIT_USAGE;
    }
    if (gpu && strcmp(gpu, "h100") && strcmp(gpu, "h200")) {
        fprintf(stderr, "gpipe-train: --gpu %s: the roofline knows h100 and h200\n", gpu);
        free(sets);
        return EXIT_USAGE;
    }
    if (gpu && !dry) {
        fputs("gpipe-train: --gpu estimates a step with --dry-run's summary; give --dry-run "
              "too\n", stderr);
        free(sets);
        return EXIT_USAGE;
    }
    if (verbose && !dry) { /* rather than a whole run the user did not mean */
        fputs("gpipe-train: -v (--verbose) lists the defaults in --dry-run's summary; give "
              "--dry-run too (a run's own log needs no flag; -q quiets it)\n", stderr);
        free(sets);
        return EXIT_USAGE;
    }
    if (!config && resume && !strcmp(resume, "latest")) {
        fputs("gpipe-train: --resume latest needs the config (it names train.snapshot.dir); "
              "give CONFIG.yaml, or a snapshot's path\n", stderr);
        free(sets);
        return EXIT_USAGE;
    }
    if (!config && !resume) {
        fputs("gpipe-train: no config given\n\n", stderr);
        usage(stderr);
        free(sets);
        return EXIT_USAGE;
    }
    if (quiet) gp_log_set_level(GP_LOG_ERROR);

    /* under mpirun: MPI up first, so that an error every rank meets
     * (the config's) is said once, by rank 0 */
    gp_status s = gp_procs_init();
    if (s != GP_OK) {
        fprintf(stderr, "gpipe-train: %s\n", gp_last_error());
        free(sets);
        return gp_status_exit_code(s);
    }
    gp_config cfg;
    gp_config_sources src = {.hf_config = gp_snapshot_hf_config, .ctx = (void *)resume};
    s = config ? gp_config_load_with(config, sets, n_sets, &src, &cfg)
                : gp_snapshot_resume_check(resume, "");
    if (!config && s == GP_OK) s = gp_snapshot_read_config(resume, sets, n_sets, &cfg);
    free(sets);
    bool own = true;
    if (gp_procs_size() > 1) {
        char run[2200];
        snprintf(run, sizeof run, "--dry-run %s, --resume %.1000s, --export-weights %s",
                 dry ? "given" : "not given", resume ? resume : "not given",
                 export ? "given" : "not given");
        s = agree_on_config(s, &cfg, run, &own);
    }
    if (s != GP_OK) {
        if (own && gp_procs_size() > 1) /* this rank's own file or options */
            fprintf(stderr, "gpipe-train: rank %d of %d: %s\n", gp_procs_rank(),
                    gp_procs_size(), gp_last_error());
        else if (gp_procs_rank() == 0)
            fprintf(stderr, "gpipe-train: %s\n", gp_last_error());
        gp_procs_finalize();
        return gp_status_exit_code(s);
    }
    int code = EXIT_OK;
    bool failed_alike = false, other_failed = false;
    /* mpirun -np N: one device per process (rank r runs device r); rank 0
     * prints, writes the metrics, the snapshots and the export; every rank
     * writes its own trace (CONFIG's --trace path, ".rank<r>" before the
     * extension for r > 0). */
    s = gp_train_check_processes(&cfg);
    int rank = gp_procs_rank();
    if (s != GP_OK) { /* the same on every rank: rank 0 says it */
        if (rank == 0) fprintf(stderr, "gpipe-train: %s\n", gp_last_error());
        gp_config_free(&cfg);
        gp_procs_finalize();
        return gp_status_exit_code(s);
    }
    char rank_trace[1100];
    if (rank > 0) {
        announce = 0;
        quiet = 1;
        progress = 0;
        metrics = NULL;
        gp_log_set_level(GP_LOG_ERROR);
        if (trace) {
            const char *dot = strrchr(trace, '.'), *slash = strrchr(trace, '/');
            int stem = dot && (!slash || dot > slash) ? (int)(dot - trace) : (int)strlen(trace);
            snprintf(rank_trace, sizeof rank_trace, "%.*s.rank%d%s", stem, trace, rank,
                     trace + stem);
            trace = rank_trace;
        }
    }
    if (convert && gp_procs_size() > 1) {
        if (rank == 0)
            fputs("gpipe-train: --convert runs in one process: run it without mpirun\n", stderr);
        gp_config_free(&cfg);
        gp_procs_finalize();
        return EXIT_USAGE;
    }
    if (convert) {
        gp_train_opts o = {.quiet = quiet, .resume_path = resume, .export_path = export,
                           .export_format = export_format};
        s = gp_train_convert(&cfg, &o);
        if (s != GP_OK) fprintf(stderr, "gpipe-train: %s\n", gp_last_error());
        gp_config_free(&cfg);
        gp_procs_finalize();
        return gp_status_exit_code(s);
    }
    if (dry && gp_procs_size() > 1) {
        if (rank == 0)
            fputs("gpipe-train: --dry-run describes the model and its placement, the same for "
                  "any number of processes: run it without mpirun\n", stderr);
        gp_config_free(&cfg);
        gp_procs_finalize();
        return EXIT_USAGE;
    }
    if (dry) {
        s = gp_model_summary(&cfg, stdout);
        char where[1200];
        if (s == GP_OK && gp_dataset_locate(&cfg.data, where, sizeof where) == GP_OK) {
            printf("data: %s\n", where);
            /* the model against it, as a run would: said, not failed (a
             * config planned before its data is chosen keeps the default) */
            if (gp_train_check_data(&cfg) != GP_OK) {
                printf("note: data: %s (a run would stop there)\n", gp_last_error());
                gp_error_clear();
            }
        } else if (s == GP_OK) { /* a summary of the model all the same */
            printf("note: data: %s (a run would stop there)\n", gp_last_error());
            gp_error_clear();
        }
        if (s == GP_OK && gpu) s = gp_model_roofline(&cfg, gpu, stdout);
        if (s == GP_OK && verbose)
            printf("defaults applied (keys the config left out):\n%s",
                   cfg.defaults_applied && cfg.defaults_applied[0] ? cfg.defaults_applied
                                                                   : "  none\n");
        /* the summary out before an error on stderr: through `2>&1 | tail`
         * the error is the last line, as on a terminal */
        fflush(stdout);
    } else {
        gp_train_opts o = {.metrics_path = metrics, .trace_path = trace,
                           .trace_first = trace_first, .trace_last = trace_last,
                           .progress = progress, .quiet = quiet,
                           .resume_path = resume, .export_path = export,
                           .export_format = export_format,
                           .tensorboard_dir = tensorboard,
                           .stop = &stop_signal};
        gp_train_result r;
        install_stop_handlers();
        s = gp_train_run(&cfg, &o, &r);
        if (s == GP_ERR_STOPPED) code = 128 + r.stop_signal; /* as the shell reports a kill */
        failed_alike = r.failed_alike;
        other_failed = r.other_failed;
    }
    if (s != GP_OK && s != GP_ERR_STOPPED && gp_procs_size() > 1 &&
        ((failed_alike && rank != 0) || other_failed)) {
        /* every rank failed alike (a step they all refused): rank 0 says
         * it once and ends the run; or another rank failed (it says why and
         * ends the run): this rank waits for that, and says its own only if
         * the end does not come */
        ending = 1;
        for (double until = gp_now() + 20; gp_now() < until;)
            sleep(1); /* on the clock, whatever a signal does to one sleep */
        fprintf(stderr, "gpipe-train: rank %d of %d: %s\n", rank, gp_procs_size(),
                gp_last_error());
        gp_procs_abort(gp_status_exit_code(s));
    } else if (s != GP_OK && s != GP_ERR_STOPPED && gp_procs_size() > 1) {
        /* a failed rank: say which, then end every rank (the others may
         * be waiting for its messages) */
        ending = 1;
        if (failed_alike)
            fprintf(stderr, "gpipe-train: every rank of %d: %s\n", gp_procs_size(),
                    gp_last_error());
        else
            fprintf(stderr, "gpipe-train: rank %d of %d: %s\n", rank, gp_procs_size(),
                    gp_last_error());
        gp_procs_abort(gp_status_exit_code(s));
    } else if (s != GP_OK && rank == 0) { /* a stop: every rank stopped at the same step */
        fprintf(stderr, "gpipe-train: %s\n", gp_last_error());
    }
    gp_config_free(&cfg);
    gp_procs_finalize();
    return s == GP_ERR_STOPPED ? code : gp_status_exit_code(s);
}
