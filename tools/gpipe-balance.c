/*
 * gpipe-balance — profile a config's model layer by layer, print the exact
 * min-max balance for n devices, optionally simulate the pipeline for every
 * chunk count and checkpoint mode, and write the config back with the
 * balance filled in.  A thin layer over src/balance and gp_model_profile.
 */
#include "balance/balance.h"
#include "train/train.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* (the text below states them) */
_Static_assert(GP_MAX_DEVICES == 64 && GP_MAX_CHUNKS == 1024, "update gpipe-balance --help");

static void usage(FILE *f)
{
    fputs("usage: gpipe-balance CONFIG.yaml [options]\n"
          "\n"
          "Profile every layer of CONFIG.yaml's model at the configured micro-batch size\n"
          "(train.batch_size / pipeline.replicas / pipeline.chunks) on the kind of device\n"
          "stage 0 uses, and print the best balance: the exact min-max split of the time\n"
          "each stage adds to the pipeline (forward, backward, recompute when\n"
          "checkpointed, boundary copies), with every device's memory capacity as a\n"
          "constraint.\n"
          "An option's VALUE may also follow an '=' (--set=KEY=VALUE).\n"
          "\n"
          "options:\n"
          "  --devices N        balance for N devices, 1 to 64 (default: the config's\n"
          "                     devices; a different N means cpu:0 .. cpu:N-1)\n"
          "  --chunks M         micro-batches per mini-batch (pipeline.chunks), 1 to 1024\n"
          "                     (not with --plan, which picks them)\n"
          "  --by time|size|both  time: balance profiled time (default); size: balance\n"
          "                     memory (parameters, optimizer state, activations; no\n"
          "                     timing, fast); both: time, and also show the size split\n"
          "  --simulate         predict step time, bubble, throughput and peak memory for\n"
          "                     every schedule (gpipe, 1f1b, zb-h1, zb-v, dualpipe-v,\n"
          "                     v-half, v-min, interleaved with 2 stages per device,\n"
          "                     and with the config's pipeline.virtual if that is\n"
          "                     more), checkpoint mode and m in 1,2,4,..32,\n"
          "                     and recommend the one with the least peak memory within\n"
          "                     5% of the best throughput that fits every device\n"
          "  --write OUT.yaml   write the config with pipeline.balance (one entry per stage:\n"
          "                     devices x virtual when interleaved) and the rest of the\n"
          "                     pipeline section (devices, chunks, checkpoint, lockstep,\n"
          "                     schedule)\n"
          "                     filled in, and the other --set overrides written in;\n"
          "                     checked by loading it\n"
          "  --write-schedule F\n"
          "                     write the schedule as PyTorch's per-rank action CSV\n"
          "                     (torch.distributed.pipelining's _dump_csv: 0F1, 1I0, 1W0,\n"
          "                     0SEND_F1, ...): --simulate's recommendation, else the\n"
          "                     config's schedule; pipeline.schedule: {file: F} runs it\n"
          "  --plan N           lay out N devices: every split into a pipeline of n\n"
          "                     devices x N/n data-parallel replicas, schedule, m and\n"
          "                     checkpoint mode (also keeping the layers of\n"
          "                     pipeline.checkpoint.keep, or the products and attention:\n"
          "                     +keep), balanced, simulated (the replicas'\n"
          "                     reduction and split optimizer state counted), and the\n"
          "                     fastest that fit listed with step, bubble, samples or\n"
          "                     tokens/s, MFU and peak memory, and what was ruled out;\n"
          "                     --write writes the first.  CPU devices of this machine\n"
          "                     (profiled), or with --gpu the roofline's floor\n"
          "  --gpu h100|h200    with --plan: GPUs of that kind, timed by the roofline, no\n"
          "                     GPU needed; each holds 80e9 or 141e9 bytes (74.5 or\n"
          "                     131.3 GiB, decimal as GPUs are sold) unless --memory or\n"
          "                     the config says\n"
          "  --memory SIZE      with --plan: each device's memory, binary as every size\n"
          "                     gpipe reads (80GB = 80 GiB; default: the least the\n"
          "                     config gives its devices, pipeline.memory)\n"
          "  --top K            with --plan: list K layouts (default 10)\n"
          "  --pick K           with --plan and --write: write layout K of the list\n"
          "                     instead of the first (bench/plan_check.py runs each)\n"
          "  --profile-out F    save the profile as JSON\n"
          "  --profile-in F     use a saved profile instead of profiling\n"
          "  --reps R           timed runs per measurement, median taken (default 5;\n"
          "                     at most 4096; --plan --gpu times nothing)\n"
          "  --set KEY=VALUE    override a config value (as gpipe-train; repeatable)\n"
          "  -q, --quiet        print the balance and errors only (no progress notes\n"
          "                     or warnings)\n"
          "  --version          print the version\n"
          "  (an option's value may also follow an '=': --devices=4, --set=K=V)\n"
          "  -h, --help         this text\n"
          "\n"
          "environment: GPIPE_LOG=debug|info|warn|error|quiet sets log verbosity\n"
          "(default info; --quiet is error).\n"
          "\n"
          "exit status: 0 success; 2 bad command line, config or infeasible balance;\n"
          "3 file error; 4 failure while profiling.\n",
          f);
}


static const char *mb(double bytes, char *buf, size_t len)
{
    return gp_format_bytes(bytes > 0 ? (size_t)bytes : 0, buf, len);
}

/* The activation bytes a layer keeps at micro-batch mbs, "*" after them
 * when its output is not among them (in place, or unkept). */
static const char *inplace_kept(const gp_layer_mem *mm, int64_t mbs, char *buf, size_t len)
{
    char b[24];
    mb(mm->keep_per_sample * (double)mbs, b, sizeof b);
    snprintf(buf, len, "%s%s", b, mm->inplace || mm->unkept ? "*" : "");
    return buf;
}

/* The config with its --set overrides written in (gp_config_text_applied),
 * without its top-level `pipeline:` block, then a fresh pipeline block from
 * cfg with `balance`: a balance computed for `--set train.batch_size=256`
 * is written with that batch size. */
/* A byte count as the config reads it: 56MiB rather than 58720256 where it
 * is a whole number of MiB or GiB. */
static const char *yaml_size(size_t b, char *buf, size_t len)
{
    if (b % ((size_t)1 << 30) == 0) snprintf(buf, len, "%zuGiB", b >> 30);
    else if (b % ((size_t)1 << 20) == 0) snprintf(buf, len, "%zuMiB", b >> 20);
    else snprintf(buf, len, "%zu", b);
    return buf;
}

/* Device j's capacity and threads: its own, else the pipeline's. */
static size_t dev_memory(const gp_pipeline_config *pc, int j)
{
    return pc->devices[j].memory ? pc->devices[j].memory : pc->memory;
}
static int dev_threads(const gp_pipeline_config *pc, int j)
{
    return pc->devices[j].threads ? pc->devices[j].threads : pc->threads;
}

static gp_status write_config(const char *out_path, const gp_config *cfg, const int *balance)
{
    char *text = NULL;
    GP_TRY(gp_config_text_applied(cfg, "pipeline", &text));
    /* whole or not at all: a full disk leaves a config already there as it
     * was (it was written in place, and left a fragment) */
    gp_atomic_file a;
    gp_status s = gp_atomic_open(out_path, &a);
    if (s != GP_OK) {
        free(text);
        return gp_error_wrap(s, "--write");
    }
    FILE *o = a.f;
    fputs(text, o);
    free(text);
    const gp_pipeline_config *pc = &cfg->pipeline;
    /* with replicas, a row per replica: the devices each one was given,
     * unless replicas: R derives the same from the first row's (64 GPUs'
     * rows ran to a line of 1,000 characters) */
    int all = gp_pipeline_replicas(pc), rows = gp_pipeline_replicas_shifted(pc) ? 1 : all;
    fputs("\n# pipeline section written by gpipe-balance\npipeline:\n  devices: [", o);
    for (int r = 0; r < rows; r++) {
        if (rows > 1) fputs(r ? ", [" : "[", o);
        for (int j = 0; j < pc->n_devices; j++) {
            const gp_device_spec *d = &pc->devices[r * pc->n_devices + j];
            fprintf(o, "%s{name: \"%s\"", j ? ", " : "", d->name);
            /* a device's own value only where it is not the pipeline's
             * (each device takes that by default): one written on every
             * device would outlast a later --set pipeline.memory */
            char sz[32];
            if (d->memory && d->memory != pc->memory)
                fprintf(o, ", memory: %s", yaml_size(d->memory, sz, sizeof sz));
            if (d->threads && d->threads != pc->threads) fprintf(o, ", threads: %d", d->threads);
            fputc('}', o);
        }
        if (rows > 1) fputc(']', o);
    }
    int v = gp_model_virtual(cfg), stages = pc->n_devices * v;
    fputs("]\n  balance: [", o);
    for (int j = 0; j < stages; j++) fprintf(o, "%s%d", j ? ", " : "", balance[j]);
    bool file = pc->schedule == GP_SCHEDULE_FILE || pc->schedule == GP_SCHEDULE_FILE_V;
    fprintf(o, "]\n  chunks: %d\n", pc->chunks);
    if (pc->checkpoint_keep && pc->checkpoint != GP_CKPT_NEVER) {
        char keep[512];
        gp_ckpt_keep_str(pc->checkpoint_keep, keep, sizeof keep);
        fprintf(o, "  checkpoint: {mode: %s, keep: [%s]}\n",
                gp_checkpoint_mode_name(pc->checkpoint), keep);
    } else {
        fprintf(o, "  checkpoint: %s\n", gp_checkpoint_mode_name(pc->checkpoint));
    }
    /* only where the config set it or the plan chose other than the
     * schedule's default: a written default would read as set, and hold
     * for any schedule a later --set picks (lockstep zb-v: 19% bubble) */
    if (pc->lockstep_given || pc->lockstep != gp_lockstep_default(pc->schedule))
        fprintf(o, "  lockstep: %s\n", pc->lockstep ? "true" : "false");
    if (file) { /* a double-quoted scalar: its quotes, backslashes and controls escaped */
        fputs("  schedule: {file: \"", o);
        for (const unsigned char *c = (const unsigned char *)pc->schedule_path; *c; c++) {
            if (*c == '"' || *c == '\\') fprintf(o, "\\%c", *c);
            else if (*c < 0x20 || *c == 0x7f) fprintf(o, "\\x%02x", *c);
            else fputc(*c, o);
        }
        fputs("\"}\n", o);
    } else {
        fprintf(o, "  schedule: %s\n", gp_schedule_kind_name(pc->schedule));
    }
    if (v > 1 && pc->schedule == GP_SCHEDULE_INTERLEAVED) fprintf(o, "  virtual: %d\n", v);
    if (pc->threads) fprintf(o, "  threads: %d\n", pc->threads);
    char sz[32];
    if (pc->memory) fprintf(o, "  memory: %s\n", yaml_size(pc->memory, sz, sizeof sz));
    if (pc->replicas > 1) fprintf(o, "  replicas: %d\n", pc->replicas);
    /* the section is written whole: a key left out here is its default
     * in the file, silently (bf16 copies trained as fp32) */
    if (pc->copy_precision != GP_COPY_AUTO)
        fprintf(o, "  copy_precision: %s\n", pc->copy_precision == GP_COPY_BF16 ? "bf16" : "fp32");
    if (pc->peer_timeout != GP_PEER_TIMEOUT_DEFAULT)
        fprintf(o, "  peer_timeout: %.17g\n", pc->peer_timeout);
    /* read back before it takes out_path's place: a config that does not
     * load, or says other than it was given, leaves out_path as it was */
    if (fflush(o) != 0 || ferror(o))
        return gp_error_wrap(gp_atomic_commit(&a, errno ? errno : EIO), "--write");
    /* (read under out_path's name: the temporary's would be gone from the
     * message's file:line:column by the time it is read) */
    gp_config check;
    char *back = NULL;
    size_t blen = 0;
    s = gp_read_regular(a.tmp, GP_CONFIG_MAX_BYTES, &back, &blen) == 0
            ? gp_config_parse(out_path, back, blen, NULL, 0, &check)
            : gp_error_set(GP_ERR_IO, "%s: cannot read it back: %s", a.tmp, strerror(errno));
    free(back);
    if (s != GP_OK) {
        gp_atomic_abort(&a);
        return gp_error_wrap(s, "the config --write made for '%s' does not load (nothing "
                             "written)", out_path);
    }
    const gp_pipeline_config *cp = &check.pipeline;
    bool same = cp->n_balance == stages && cp->schedule == pc->schedule &&
                cp->replicas == pc->replicas && cp->chunks == pc->chunks &&
                cp->checkpoint == pc->checkpoint && cp->checkpoint_keep == pc->checkpoint_keep &&
                cp->lockstep == pc->lockstep && cp->threads == pc->threads &&
                cp->memory == pc->memory && cp->copy_precision == pc->copy_precision &&
                cp->peer_timeout == pc->peer_timeout && cp->virtual_stages == pc->virtual_stages;
    for (int j = 0; same && j < pc->n_devices * all; j++)
        same = !strcmp(cp->devices[j].name, pc->devices[j].name) &&
               dev_memory(cp, j) == dev_memory(pc, j) && dev_threads(cp, j) == dev_threads(pc, j);
    for (int j = 0; same && j < stages; j++) same = cp->balance[j] == balance[j];
    gp_config_free(&check);
    if (!same) {
        gp_atomic_abort(&a);
        return gp_error_set(GP_ERR_RUNTIME, "the config --write made for '%s' does not hold the "
                            "pipeline section it was given (balance, schedule, devices or "
                            "another key); nothing written", out_path);
    }
    s = gp_atomic_commit(&a, 0);
    return s == GP_OK ? GP_OK : gp_error_wrap(s, "--write");
}

/* A saved profile's times hold at the micro-batch sizes it measured: the
 * balance needs the config's (a replica's batch / chunks, rounded up: the
 * batch is train.batch_size over the replicas), --simulate those
 * of m = 1, 2, 4, .. 32 as well (what --profile-out --simulate measures).
 * Other sizes would be extrapolated from the ones measured, which is no
 * measurement; refuse, naming the sizes. */
static gp_status check_profile_sizes(const gp_profile *p, const char *path, int64_t batch,
                                     int m, int R, int simulate)
{
    /* what `batch` is: the config's, or with replicas one replica's share */
    const char *whose = R > 1 ? "a replica's batch" : "train.batch_size";
    int64_t need[8], missing[8];
    int n = 0;
    need[n++] = (batch + m - 1) / m;
    if (simulate)
        for (int q = 1; q <= 32 && q <= batch; q *= 2) need[n++] = (batch + q - 1) / q;
    int k = gp_profile_missing_sizes(p, need, n, missing);
    if (k == 0) return GP_OK;
    if (simulate && !p->timed) /* the sizes are not what is missing most */
        return gp_error_set(GP_ERR_INVALID, "'%s' holds no times (it was saved with --by size): "
                            "--simulate needs them; profile again without --by size "
                            "(gpipe-balance CONFIG.yaml --simulate --profile-out FILE)", path);
    char have[256], lack[256];
    int off = 0;
    for (int z = 0; z < p->n_sizes && off < (int)sizeof have - 24; z++)
        off += snprintf(have + off, sizeof have - (size_t)off, "%s%lld", z ? ", " : "",
                        (long long)p->sizes[z]);
    off = 0;
    for (int z = 0; z < k && off < (int)sizeof lack - 24; z++)
        off += snprintf(lack + off, sizeof lack - (size_t)off, "%s%lld", z ? ", " : "",
                        (long long)missing[z]);
    if (missing[0] == need[0])
        return gp_error_set(GP_ERR_INVALID, "profile '%s' was measured at micro-batch size%s %s, "
                            "but this config runs micro-batch %lld (%s %lld / "
                            "pipeline.chunks %d, rounded up); profile this config again "
                            "(gpipe-balance CONFIG.yaml%s --profile-out FILE)", path,
                            p->n_sizes == 1 ? "" : "s", have, (long long)need[0], whose,
                            (long long)batch, m, simulate ? " --simulate" : "");
    return gp_error_set(GP_ERR_INVALID, "profile '%s' was measured at micro-batch size%s %s, but "
                        "--simulate also needs size%s %s (%s %lld over m = 1, 2, "
                        "4, .. 32 micro-batches); profile with --simulate (gpipe-balance "
                        "CONFIG.yaml --simulate --profile-out FILE)", path,
                        p->n_sizes == 1 ? "" : "s", have, k == 1 ? "" : "s", lack, whose,
                        (long long)batch);
}

/* --write and --profile-out are checked before profiling (which takes
 * seconds to minutes), so a bad path fails at once; nothing is left behind.
 * Neither may replace what the run reads (the config, --profile-in, and
 * once the config is loaded, cfg given: its own inputs, gp_config_input_of)
 * nor name the other's file: one would be lost (as
 * gpipe-train refuses a --metrics or --trace that names its config; a
 * --write over the CSV a config ran replaced it, then failed to load). */
static gp_status check_outputs(const char *write_path, const char *prof_out, const char *config,
                               const char *prof_in, const char *sched_out, const gp_config *cfg)
{
    const struct {
        const char *path, *opt;
    } outs[3] = {{write_path, "--write"}, {prof_out, "--profile-out"},
                 {sched_out, "--write-schedule"}};
    for (int q = 0; q < 3; q++) {
        const char *o = outs[q].path;
        if (!o) continue;
        if (gp_same_file(o, config))
            return gp_error_set(GP_ERR_INVALID, "%s %s is the config it reads: give the output "
                                "another name", outs[q].opt, o);
        if (prof_in && gp_same_file(o, prof_in))
            return gp_error_set(GP_ERR_INVALID, "%s %s is the --profile-in it reads: give the "
                                "output another name", outs[q].opt, o);
        static const char *const reads[] = {
            [GP_CONFIG_READS_INIT_FROM] = "the weights the config reads (model.init_from)",
            [GP_CONFIG_READS_SCHEDULE] = "the schedule file the config reads "
                                         "(pipeline.schedule.file)",
            [GP_CONFIG_READS_DATASET] = "a file of the config's dataset (data.path)"};
        gp_config_reads in = cfg ? gp_config_input_of(cfg, o) : GP_CONFIG_READS_NONE;
        if (in != GP_CONFIG_READS_NONE)
            return gp_error_set(GP_ERR_INVALID, "%s %s is %s: give the output another name",
                                outs[q].opt, o, reads[in]);
    }
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            if (outs[a].path && outs[b].path && gp_same_file(outs[a].path, outs[b].path))
                return gp_error_set(GP_ERR_INVALID, "%s and %s name the same file (%s): give "
                                    "each its own", outs[a].opt, outs[b].opt, outs[a].path);
    /* (all written beside and renamed over) */
    for (int q = 0; q < 3; q++)
        if (outs[q].path) GP_TRY(gp_check_writable_file(outs[q].path, outs[q].opt, true));
    return GP_OK;
}

/* A row group of --simulate's table: a schedule, its stages a device, and
 * its split under each checkpoint mode of modes[] (NULL: none planned). */
typedef struct sim_run {
    gp_schedule_kind kind;
    int v;
    const int *bal[3];
} sim_run;

/* kind's run into runs[*n]: under each of the 3 modes the split balance:
 * auto gives it (into store[c]), or where none plans fallback[c] (NULL:
 * none); added where one mode has a split.  Returns its splits, or NULL
 * where it was not added. */
static const int *const *add_planned(sim_run *runs, int *n, const gp_config *cfg,
                                     const gp_profile *prof, gp_schedule_kind kind, int v,
                                     const gp_checkpoint_mode *modes,
                                     int (*store)[GP_MAX_DEVICES], const int *const *fallback)
{
    sim_run *r = &runs[*n];
    bool any = false;
    for (int c = 0; c < 3; c++) {
        bool ok = gp_model_plan_placement(cfg, prof, kind, v, modes[c], store[c]) == GP_OK;
        gp_error_clear();
        r->bal[c] = ok ? store[c] : fallback ? fallback[c] : NULL;
        any = any || r->bal[c];
    }
    if (!any) return NULL;
    r->kind = kind;
    r->v = v;
    (*n)++;
    return r->bal;
}

/* --write-schedule: schedule `kind` (v stages per device) for n devices and
 * m micro-batches as PyTorch's per-rank action CSV (gp_schedule_write_csv),
 * which pipeline.schedule: {file: PATH} runs and PyTorch's _load_csv
 * reads. */
static gp_status write_schedule(const char *path, const gp_config *cfg, gp_schedule_kind kind,
                                int n, int v, int m, gp_checkpoint_mode ck)
{
    gp_schedule_opts so = {.kind = kind, .n = n, .m = m, .virtual_stages = v, .checkpoint = ck,
                           .replicas = 1, .update = true, .check = true,
                           .file = cfg->pipeline.schedule_file};
    gp_schedule sc;
    GP_TRY(gp_schedule_make(&so, &sc));
    gp_status s = gp_schedule_write_csv(&sc, path);
    gp_schedule_free(&sc);
    if (s == GP_OK)
        printf("\nwrote %s: schedule %s, %d devices x %d stage%s, %d micro-batches (pipeline."
               "schedule: {file: %s} runs it on %d devices with pipeline.chunks: %d)\n", path,
               gp_schedule_kind_name(kind), n, v, v == 1 ? "" : "s", m, path, n, m);
    return s;
}

/* One shell word, quoted where the shell would split or expand it. */
static void print_word(const char *w)
{
    if (*w && strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+@%-") ==
                  strlen(w)) {
        printf(" %s", w);
        return;
    }
    printf(" '");
    for (const char *c = w; *c; c++) *c == '\'' ? printf("'\\''") : putchar(*c);
    putchar('\'');
}

/* A checkpoint mode as --simulate's table names it: "always+keep" where
 * the config keeps layer types (pipeline.checkpoint.keep) and the mode
 * checkpoints. */
static const char *ckpt_label(gp_checkpoint_mode m, gp_ckpt_keep keep, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s", gp_checkpoint_mode_name(m),
             keep && m != GP_CKPT_NEVER ? "+keep" : "");
    return buf;
}

/* The options that take a value, as "--opt VALUE" or "--opt=VALUE". */
static const char *const k_valued[] = {"--devices", "--chunks", "--by", "--write",
                                       "--profile-out", "--profile-in", "--set", "--reps",
                                       "--write-schedule", "--plan", "--gpu", "--memory",
                                       "--top", "--pick"};

/* Argument a as an option taking a value: its name into opt ("--devices"),
 * and its value when written "--devices=4" (else NULL: the next argument,
 * or not an option that takes one, opt then a's own text). */
static const char *split_valued(const char *a, char *opt, size_t len)
{
    return cli_split_valued(a, k_valued, sizeof k_valued / sizeof k_valued[0], opt, len);
}

/* --simulate's advice as a command: the user's own arguments (config,
 * --set overrides, --profile-in, --reps, --by, -q) with the recommended
 * devices, chunks, schedule and checkpoint mode in place of theirs, so it
 * balances the model that was simulated. */
static void print_hint(int argc, char **argv, int n, int m, const char *sched, int virt,
                       int cfg_virt, gp_checkpoint_mode ck, gp_ckpt_keep keep, bool lockstep)
{
    printf("  to use it: gpipe-balance");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--simulate")) continue;
        char opt[32];
        const char *v = split_valued(a, opt, sizeof opt);
        int skip = v ? 0 : 1; /* "--opt VALUE" spans two arguments */
        if (!v && i + 1 < argc) v = argv[i + 1];
        /* replaced below, or not wanted twice; and the user's schedule,
         * checkpoint and virtual: ours replace them (a virtual left over
         * from an interleaved config would refuse the schedule recommended) */
        if (!strcmp(opt, "--devices") || !strcmp(opt, "--chunks") || !strcmp(opt, "--write") ||
            !strcmp(opt, "--profile-out") || !strcmp(opt, "--write-schedule") ||
            (!strcmp(opt, "--set") && v &&
             (!strncmp(v, "pipeline.schedule=", 18) || !strncmp(v, "pipeline.virtual=", 17) ||
              !strncmp(v, "pipeline.checkpoint=", 20)))) {
            i += skip;
            continue;
        }
        print_word(a);
    }
    char vset[48] = "";
    if (virt > 1 || cfg_virt > 1)
        snprintf(vset, sizeof vset, " --set pipeline.virtual=%d", virt > 1 ? virt : 1);
    /* (the config's keep, as a map, where the mode checkpoints) */
    char ckset[600], ks[512];
    gp_ckpt_keep_str(keep, ks, sizeof ks);
    if (keep && ck != GP_CKPT_NEVER)
        snprintf(ckset, sizeof ckset, "pipeline.checkpoint={mode: %s, keep: [%s]}",
                 gp_checkpoint_mode_name(ck), ks);
    else
        snprintf(ckset, sizeof ckset, "pipeline.checkpoint=%s", gp_checkpoint_mode_name(ck));
    printf(" --devices %d --chunks %d --set pipeline.schedule=%s%s --set", n, m, sched, vset);
    print_word(ckset);
    printf(" --write OUT.yaml\n");
    if (lockstep && strcmp(sched, "gpipe"))
        printf("  (simulated lockstep, as the config sets it; %s often runs faster free-running: "
               "add --set pipeline.lockstep=false to simulate that)\n", sched);
}

/* The balance for o with no capacity: time alone, for --simulate where
 * no split fits at the config's own m (its rows say what fits). */
static gp_status plan_time_alone(const gp_profile *p, const gp_plan_opts *o, int *balance)
{
    gp_plan_opts u = *o;
    for (int j = 0; j < GP_MAX_DEVICES; j++) u.capacity[j] = 0;
    gp_error_clear();
    return gp_balance_plan(p, &u, balance);
}

static void print_balance(const char *title, const gp_profile *p, const gp_plan_opts *po,
                          const int *balance)
{
    double cost[GP_MAX_DEVICES], peak[GP_MAX_DEVICES];
    gp_balance_stage_costs(p, po, balance, cost, peak);
    int n = po->n;
    printf("%s: [", title);
    for (int j = 0; j < n; j++) printf("%s%d", j ? ", " : "", balance[j]);
    printf("]\n");
    bool size = po->by == GP_BALANCE_BY_SIZE || !p->timed;
    /* several stages a device: a stage's column is its share of the device
     * (1 / v), and the device's own peak and memory follow the table (the
     * share read as "capacity" showed a split that fits as over it) */
    int v = po->virtual_stages > 1 ? po->virtual_stages : 1;
    printf("  %5s %8s %12s %12s %12s\n", "stage", "layers", size ? "cost" : "cost ms", "peak mem",
           v > 1 ? "share of dev" : "capacity");
    double mx = 0, sum = 0;
    int first = 0;
    for (int j = 0; j < n; j++) {
        char b1[32], b2[32], b3[32];
        printf("  %5d %3d..%-4d %12s %12s %12s\n", j, first, first + balance[j] - 1,
               size ? mb(cost[j], b3, sizeof b3) : (snprintf(b3, sizeof b3, "%.2f", cost[j] * 1e3), b3),
               mb(peak[j], b1, sizeof b1),
               po->capacity[j] > 0 ? mb(po->capacity[j], b2, sizeof b2) : "unlimited");
        if (cost[j] > mx) mx = cost[j];
        sum += cost[j];
        first += balance[j];
    }
    printf("  imbalance (max / mean stage cost): %.3f\n", sum > 0 ? mx / (sum / n) : 1.0);
    double dpeak[GP_MAX_DEVICES];
    if (v > 1 && gp_simulate_memory(p, po->sim_kind, n / v, v, NULL, balance, po->m,
                                    po->checkpoint, dpeak, NULL) == GP_OK) {
        printf("  each device's peak, its %d stages together:", v);
        for (int d = 0; d < n / v; d++) {
            char b1[32], b2[32]; /* (stage d is on device d, in loops and in a V) */
            printf("%s device %d %s of %s", d ? "," : "", d, mb(dpeak[d], b1, sizeof b1),
                   po->capacity[d] > 0 ? mb(po->capacity[d] * v, b2, sizeof b2) : "unlimited");
        }
        printf("\n");
    } else if (v > 1) {
        gp_error_clear();
    }
}

/* --plan N: every layout of N devices, ranked (gp_plan_layouts); the best
 * `top` printed with what was ruled out and why; --write the first. */
static int run_plan(gp_config *cfg, int N, const char *gpu, double memory, int top, int pick,
                    int reps, const char *write_path, bool say)
{
    gp_plan_request rq = {.devices = N, .gpu = gpu, .memory = memory, .reps = reps, .say = say};
    gp_plan_result r;
    gp_status s = gp_plan_layouts(cfg, &rq, &r);
    if (s != GP_OK) {
        fprintf(stderr, "gpipe-balance: %s\n", gp_last_error());
        return gp_status_exit_code(s);
    }
    char cb[32];
    bool lm = cfg->model.n_layers > 0 && cfg->model.layers[0].type == GP_LAYER_EMBEDDING;
    double per = lm ? (double)cfg->model.input[0] : 1.0; /* tokens a sample */
    printf("layouts of %d %s%s (%s each%s), batch %lld: %d considered, %d fit\n", N,
           gpu ? gpu : "CPU device", N == 1 ? "" : "s",
           r.capacity > 0 ? mb(r.capacity, cb, sizeof cb) : "unlimited memory",
           r.capacity_smallest ? ", the least of the config's devices" : "",
           (long long)cfg->train.batch_size, r.considered, r.n_layouts);
    printf("  %-4s %-9s %-14s %5s %-16s %10s %7s %12s %6s %12s\n", "rank", "stages", "schedule",
           "m", "checkpoint", "step ms", "bubble", lm ? "tokens/s" : "samples/s", "MFU",
           "peak/device");
    gp_ckpt_keep kept = 0;
    for (int i = 0; i < r.n_layouts && i < top; i++) {
        const gp_layout *l = &r.layouts[i];
        char lay[32], sch[32], pk[32], mfu[16], ck[32];
        snprintf(ck, sizeof ck, "%s%s", gp_checkpoint_mode_name(l->checkpoint),
                 l->keep ? "+keep" : "");
        if (l->keep) kept = l->keep;
        snprintf(lay, sizeof lay, "%dx%d", l->devices, l->replicas);
        snprintf(sch, sizeof sch, "%s", gp_schedule_kind_name(l->schedule));
        if (isnan(l->mfu)) snprintf(mfu, sizeof mfu, "-");
        else snprintf(mfu, sizeof mfu, "%.0f%%", 100 * l->mfu);
        printf("  %-4d %-9s %-14s %5d %-16s %10.2f %7.3f %12.0f %6s %12s\n", i + 1, lay, sch,
               l->m, ck, l->step * 1e3, l->bubble,
               l->samples_per_s * per, mfu, mb(l->peak, pk, sizeof pk));
    }
    if (kept) {
        char ks[512];
        gp_ckpt_keep_str(kept, ks, sizeof ks);
        printf("  (+keep: a checkpointed micro-batch keeps the outputs of %s and recomputes the "
               "rest: pipeline.checkpoint.keep)\n", ks);
    }
    printf("  (stages: a pipeline's devices x its replicas; the replicas' gradient reduction "
           "is in the step%s)\nruled out: %d with more replicas x micro-batches than samples "
           "(or than %d), %d that no schedule makes (more stages than layers, interleaved's m), %d over the "
           "devices' memory\n", gpu ? "; times are the roofline's floor: measured steps "
           "run slower, and MFU lower" : "", r.no_batch, GP_MAX_CHUNKS, r.no_schedule,
           r.no_memory);
    if (r.n_layouts == 0) {
        printf("no layout fits: more devices, more memory (--memory), or a smaller batch\n");
        gp_plan_result_free(&r);
        return EXIT_USAGE; /* (2: as an infeasible balance, --help) */
    }
    int rc = EXIT_OK;
    if (write_path && pick > r.n_layouts) {
        fprintf(stderr, "gpipe-balance: --pick %d: the plan has %d layout%s; pick 1 to %d\n",
                pick, r.n_layouts, r.n_layouts == 1 ? "" : "s", r.n_layouts);
        gp_plan_result_free(&r);
        return EXIT_USAGE;
    }
    if (write_path) { /* the best (or --pick's) as a config */
        const gp_layout *b = &r.layouts[pick > 0 ? pick - 1 : 0];
        gp_pipeline_config *pc = &cfg->pipeline;
        pc->n_devices = b->devices;
        pc->replicas = b->replicas;
        for (int d = 0; d < N; d++) {
            snprintf(pc->devices[d].name, sizeof pc->devices[d].name, "%s:%d",
                     gpu ? "cuda" : "cpu", d);
            pc->devices[d].memory = 0;
            pc->devices[d].threads = gpu ? 0 : 1;
        }
        pc->chunks = b->m;
        pc->checkpoint = b->checkpoint;
        pc->checkpoint_keep = b->keep;
        pc->schedule = b->schedule;
        pc->virtual_stages = b->virtual_stages;
        pc->lockstep = false;
        pc->threads = gpu ? 0 : 1;
        /* the memory the plan fitted the layouts in (--memory, a GPU's
         * own, or the config's), so that the run checks the same */
        if (r.capacity > 0) pc->memory = (size_t)r.capacity;
        gp_status ws = write_config(write_path, cfg, b->balance);
        if (ws != GP_OK) {
            fprintf(stderr, "gpipe-balance: %s\n", gp_last_error());
            rc = gp_status_exit_code(ws);
        } else {
            printf("wrote %s: layout %d\n", write_path, pick > 0 ? pick : 1);
        }
    }
    gp_plan_result_free(&r);
    return rc;
}

int main(int argc, char **argv)
{
    const char *config = NULL, *write_path = NULL, *prof_out = NULL, *prof_in = NULL;
    const char *sched_out = NULL;
    int devices = 0, chunks = 0, simulate = 0, reps = 5, plan = 0, top = 10, plan_pick = 0;
    bool top_given = false, reps_given = false; /* (their defaults said nothing) */
    const char *gpu = NULL;
    double plan_memory = 0;
    gp_balance_by by = GP_BALANCE_BY_TIME;
    const char **sets = calloc((size_t)argc + 4, sizeof *sets);
    int n_sets = 0, set_value_at = -1, quiet = 0;
    gp_names_use_flags(); /* messages name --set */
    /* a file-size limit (ulimit -f) makes a write that passes it fail, said
     * with its reason, instead of killing the process */
    signal(SIGXFSZ, SIG_IGN);
    if (!sets) return EXIT_RUNTIME;
    for (int i = 1; i < argc; i++) {
        /* --opt=VALUE, as gpipe-train takes --set=K=V */
        char opt[32];
        const char *inline_v = split_valued(argv[i], opt, sizeof opt);
        const char *a = inline_v ? opt : argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(sets);
            return EXIT_OK;
        } else if (!strcmp(a, "--version")) {
            printf("gpipe-balance %s\n", gp_version());
            free(sets);
            return EXIT_OK;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            quiet = 1;
        } else if (!strcmp(a, "--simulate")) {
            simulate = 1;
        } else if (!strcmp(a, "--devices") || !strcmp(a, "--chunks") || !strcmp(a, "--by") ||
                   !strcmp(a, "--write") || !strcmp(a, "--profile-out") ||
                   !strcmp(a, "--profile-in") || !strcmp(a, "--set") || !strcmp(a, "--reps") ||
                   !strcmp(a, "--write-schedule") || !strcmp(a, "--plan") ||
                   !strcmp(a, "--gpu") || !strcmp(a, "--memory") || !strcmp(a, "--top") ||
                   !strcmp(a, "--pick")) {
            if (!inline_v && i + 1 >= argc) {
                fprintf(stderr, "gpipe-balance: %s needs a value; see --help\n", a);
                free(sets);
                return EXIT_USAGE;
            }
            const char *v = inline_v ? inline_v : argv[++i];
            if (!inline_v && !strncmp(v, "--", 2) && v[2]) { /* "--write --simulate": forgotten */
                fprintf(stderr, "gpipe-balance: %s needs a value, and '%s' is an option; see "
                        "--help\n", a, v);
                free(sets);
                return EXIT_USAGE;
            }
            set_value_at = !strcmp(a, "--set") && !inline_v ? i : -1;
            char *end = NULL;
            if (!strcmp(a, "--devices") || !strcmp(a, "--chunks") || !strcmp(a, "--reps") ||
                !strcmp(a, "--plan") || !strcmp(a, "--top") || !strcmp(a, "--pick")) {
                /* the most devices in a pipeline, micro-batches in a step,
                 * timed runs (more would take hours for nothing) */
                long most = !strcmp(a, "--devices") || !strcmp(a, "--plan") ? GP_MAX_DEVICES
                            : !strcmp(a, "--chunks") ? GP_MAX_CHUNKS : 4096;
                const char *what = !strcmp(a, "--devices") ? "the most devices a pipeline has"
                                   : !strcmp(a, "--plan")      ? "the most devices a run has"
                                   : !strcmp(a, "--chunks") ? "the most micro-batches a step has"
                                   : !strcmp(a, "--top") || !strcmp(a, "--pick")
                                       ? "the most layouts listed"
                                                            : "the most timed runs per measurement";
                errno = 0;
                long x = strtol(v, &end, 10);
                if (end == v || *end || errno || x < 1 || x > most) {
                    fprintf(stderr, "gpipe-balance: %s '%s': expected an integer from 1 to %ld "
                            "(%ld is %s)\n", a, v, most, most, what);
                    free(sets);
                    return EXIT_USAGE;
                }
                if (!strcmp(a, "--devices")) devices = (int)x;
                else if (!strcmp(a, "--chunks")) chunks = (int)x;
                else if (!strcmp(a, "--plan")) plan = (int)x;
                else if (!strcmp(a, "--top")) top = (int)x, top_given = true;
                else if (!strcmp(a, "--pick")) plan_pick = (int)x;
                else reps = (int)x, reps_given = true;
            } else if (!strcmp(a, "--by")) {
                if (!gp_balance_by_parse(v, &by)) {
                    fprintf(stderr, "gpipe-balance: --by '%s': expected time, size or both\n", v);
                    free(sets);
                    return EXIT_USAGE;
                }
            } else if (!strcmp(a, "--gpu")) {
                if (strcmp(v, "h100") && strcmp(v, "h200")) {
                    fprintf(stderr, "gpipe-balance: --gpu '%s': expected h100 or h200\n", v);
                    free(sets);
                    return EXIT_USAGE;
                }
                gpu = v;
            } else if (!strcmp(a, "--memory")) {
                size_t b = 0;
                if (!gp_parse_bytes(v, &b) || b < 1) {
                    fprintf(stderr, "gpipe-balance: --memory '%s': expected a size such as "
                            "80GB or 512MiB\n", v);
                    free(sets);
                    return EXIT_USAGE;
                }
                plan_memory = (double)b;
            } else if (!strcmp(a, "--write")) write_path = v;
            else if (!strcmp(a, "--write-schedule")) sched_out = v;
            else if (!strcmp(a, "--profile-out")) prof_out = v;
            else if (!strcmp(a, "--profile-in")) prof_in = v;
            else sets[n_sets++] = v;
        } else if (a[0] == '-') {
            fprintf(stderr, "gpipe-balance: unknown option '%s'; see --help\n", a);
            free(sets);
            return EXIT_USAGE;
        } else if (!config) {
            config = a;
        } else {
            fprintf(stderr, "gpipe-balance: more than one config given ('%s' and '%s')%s\n",
                    config, a,
                    set_value_at == i - 1 ? SET_SPLIT_HINT : "");
            free(sets);
            return EXIT_USAGE;
        }
    }
    if (!config) {
        fputs("gpipe-balance: no config given\n\n", stderr);
        usage(stderr);
        free(sets);
        return EXIT_USAGE;
    }
    if (simulate && by == GP_BALANCE_BY_SIZE) {
        fprintf(stderr, "gpipe-balance: --simulate predicts step times and --by size profiles "
                "none: drop --by size (--by both balances memory too)\n");
        free(sets);
        return EXIT_USAGE;
    }
    if ((gpu || plan_memory > 0) && !plan) {
        fprintf(stderr, "gpipe-balance: --gpu and --memory plan a run: give --plan N (the "
                "devices to lay out)\n");
        free(sets);
        return EXIT_USAGE;
    }
    if (plan_pick && (!plan || !write_path)) {
        fprintf(stderr, "gpipe-balance: --pick K writes the K-th layout of a plan: give --plan N "
                "and --write OUT.yaml\n");
        free(sets);
        return EXIT_USAGE;
    }
    if (top_given && !plan) { /* (it was accepted and did nothing) */
        fprintf(stderr, "gpipe-balance: --top K lists a plan's best K layouts: give --plan N "
                "too\n");
        free(sets);
        return EXIT_USAGE;
    }
    if (plan && (simulate || devices || chunks || prof_in || prof_out || sched_out ||
                 by != GP_BALANCE_BY_TIME)) {
        fprintf(stderr, "gpipe-balance: --plan lays out its own devices, micro-batches, schedule "
                "and profile: drop --simulate, --devices, --chunks, --by, --profile-in/-out and "
                "--write-schedule\n");
        free(sets);
        return EXIT_USAGE;
    }
    if (gpu && reps_given) {
        fprintf(stderr, "gpipe-balance: --plan --gpu times nothing (the roofline's floor, from "
                "the shapes): drop --reps\n");
        free(sets);
        return EXIT_USAGE;
    }
    if (quiet) gp_log_set_level(GP_LOG_ERROR);
    /* its own notes and warnings on stderr follow GPIPE_LOG as the
     * library's do (-q: neither) */
    const bool notes = gp_log_enabled(GP_LOG_INFO), warns = gp_log_enabled(GP_LOG_WARN);
    gp_status cs = config ? check_outputs(write_path, prof_out, config, prof_in, sched_out, NULL)
                          : GP_OK;
    if (cs != GP_OK) {
        fprintf(stderr, "gpipe-balance: %s\n", gp_last_error());
        free(sets);
        return gp_status_exit_code(cs);
    }
    /* The balance is what we compute: whatever list the config has is replaced. */
    char set_dev[64] = "", set_chunks[64] = "";
    int n_user = n_sets; /* the user's own --set overrides come first */
    sets[n_sets++] = "pipeline.balance=auto";
    if (chunks) {
        snprintf(set_chunks, sizeof set_chunks, "pipeline.chunks=%d", chunks);
        sets[n_sets++] = set_chunks;
    }
    gp_config cfg;
    gp_status s = gp_config_load(config, sets, n_sets, &cfg);
    /* --devices N replaces a list of another length; and a config that
     * holds only with N devices (an interleaved schedule needs 2 or more:
     * it loads on the GPipe schedule) is read again with them.  Any other
     * error stands: the device list it may be about is not replaced. */
    bool retry = s == GP_OK && devices && devices != cfg.pipeline.n_devices;
    if (s != GP_OK && devices) {
        char first[1024];
        snprintf(first, sizeof first, "%s", gp_last_error());
        gp_config probe;
        sets[n_sets] = "pipeline.schedule=gpipe";
        sets[n_sets + 1] = "pipeline.virtual=1"; /* an interleaved config's virtual too */
        retry = gp_config_load(config, sets, n_sets + 2, &probe) == GP_OK;
        if (retry) gp_config_free(&probe);
        else gp_error_set(s, "%s", first);
    }
    if (retry) {
        if (s == GP_OK) gp_config_free(&cfg);
        gp_error_clear();
        snprintf(set_dev, sizeof set_dev, "pipeline.devices=%d", devices);
        sets[n_sets++] = set_dev;
        s = gp_config_load(config, sets, n_sets, &cfg);
    }
    if (s != GP_OK) {
        /* an error of the config itself (empty, a list, a missing model)
         * surfaces at the first override applied, here one of ours: read
         * it again with the user's alone for the error they would get */
        gp_config probe;
        char ours[1024];
        snprintf(ours, sizeof ours, "%s", gp_last_error());
        if (gp_config_load(config, sets, n_user, &probe) == GP_OK) {
            gp_config_free(&probe);
            gp_error_set(s, "%s", ours);
        }
    }
    if (s != GP_OK) {
        /* --devices / --chunks reach the config as overrides: name the
         * option the user typed, not the override it became */
        const char *e = gp_last_error(), *opt = NULL;
        char head[96];
        size_t hl = 0;
        if (devices) {
            hl = (size_t)snprintf(head, sizeof head, "--set %s: ", set_dev);
            if (!strncmp(e, head, hl)) opt = "--devices";
        }
        if (!opt && chunks) {
            hl = (size_t)snprintf(head, sizeof head, "--set %s: ", set_chunks);
            if (!strncmp(e, head, hl)) opt = "--chunks";
        }
        if (opt)
            fprintf(stderr, "gpipe-balance: %s %d: %s\n", opt,
                    !strcmp(opt, "--devices") ? devices : chunks, e + hl);
        else
            fprintf(stderr, "gpipe-balance: %s\n", e);
        free(sets);
        return gp_status_exit_code(s);
    }
    if ((s = check_outputs(write_path, prof_out, config, prof_in, sched_out, &cfg)) != GP_OK) {
        fprintf(stderr, "gpipe-balance: %s\n", gp_last_error());
        gp_config_free(&cfg);
        free(sets);
        return gp_status_exit_code(s);
    }
    if (plan) {
        int rc = run_plan(&cfg, plan, gpu, plan_memory, top, plan_pick, reps, write_path,
                          !quiet && notes);
        gp_config_free(&cfg);
        free(sets);
        return rc;
    }
    int n = cfg.pipeline.n_devices, m = cfg.pipeline.chunks;
    int R = gp_pipeline_replicas(&cfg.pipeline);
    /* one replica's pipeline is what is balanced and simulated */
    int64_t batch = gp_config_replica_batch(&cfg), mbs = (batch + m - 1) / m;
    char per_replica[96] = "";
    if (R > 1)
        snprintf(per_replica, sizeof per_replica, " (train.batch_size %lld over %d replicas)",
                 (long long)cfg.train.batch_size, R);

    gp_profile prof = {0};
    if (prof_in) {
        s = gp_profile_load(prof_in, &prof);
        if (s == GP_OK)
            s = gp_profile_check_model(&prof, prof_in, cfg.model.layers, cfg.model.n_layers,
                                       cfg.model.input);
        /* the optimizer's state is in each layer's bytes and update time:
         * one taken under SGD planned an AdamW run's memory short by a
         * third (no check until 2026-12-01) */
        int slots = gp_model_optim_slots(&cfg);
        static const char *const slot_names[3] = {"plain SGD", "SGD with momentum",
                                                  "Adam or AdamW"};
        if (s == GP_OK && prof.optim_slots >= 0 && prof.optim_slots != slots)
            s = gp_error_set(GP_ERR_INVALID, "profile '%s' was taken for %s (%d state "
                             "tensor%s a parameter); this config's train.optimizer is %s (%d): "
                             "each layer's optimizer state and update time differ; profile this "
                             "config again (gpipe-balance CONFIG.yaml --profile-out FILE)",
                             prof_in, slot_names[prof.optim_slots], prof.optim_slots,
                             prof.optim_slots == 1 ? "" : "s", slot_names[slots], slots);
        if (s == GP_OK) s = check_profile_sizes(&prof, prof_in, batch, m, R, simulate);
        if (s != GP_OK) gp_profile_free(&prof);
        /* facts of this run, not of the profile (balance.h) */
        gp_model_profile_facts(&cfg, &prof);
        /* the same model on other hardware: its times are a guess, not a lie */
        int threads = gp_model_device_threads(&cfg.pipeline, 0);
        gp_device_kind k1 = GP_DEV_CPU, k2 = GP_DEV_CPU;
        int i1, i2;
        bool k2_ok = gp_device_parse(cfg.pipeline.devices[0].name, &k2, &i2) == GP_OK;
        if (s == GP_OK && k2_ok && gp_device_parse(prof.device, &k1, &i1) == GP_OK &&
            (k1 != k2 || (k1 == GP_DEV_CPU && prof.threads != threads)))
            if (warns) fprintf(stderr, "gpipe-balance: warning: '%s' was timed on %s with %d thread%s; "
                    "this config's stage 0 is %s with %d: the times may not hold\n", prof_in,
                    prof.device, prof.threads, prof.threads == 1 ? "" : "s",
                    cfg.pipeline.devices[0].name, threads);
        /* a CPU device computes FP32 under tf32 (README "Precision") */
        int want_prec = cfg.train.precision == GP_PRECISION_TF32 && k2 == GP_DEV_CPU
                            ? GP_PRECISION_FP32 : cfg.train.precision;
        if (s == GP_OK && prof.timed && prof.precision >= 0 && prof.precision != want_prec)
            if (warns) fprintf(stderr, "gpipe-balance: warning: '%s' was timed in %s; this config trains "
                    "in %s (train.precision), whose layers take other times: re-profile with "
                    "--profile-out for a split that fits\n", prof_in,
                    gp_precision_name((gp_precision)prof.precision),
                    gp_precision_name((gp_precision)want_prec));
        if (s == GP_OK) gp_error_clear(); /* a device name that did not parse */
        if (s == GP_OK) {
            prof.batch = batch; /* the config's batch decides the micro-batch sizes */
            prof.chunks = m;
            prof.bf16_copies = gp_config_bf16_copies(&cfg); /* the run's, not saved */
        }
    } else {
        gp_model_profile_opts mo = {.warmup = 2, .reps = reps, .timed = by != GP_BALANCE_BY_SIZE};
        mo.sizes[mo.n_sizes++] = mbs;
        if (simulate) {
            for (int q = 1; q <= 32; q *= 2)
                if (q <= batch) mo.sizes[mo.n_sizes++] = (batch + q - 1) / q;
        }
        if (notes)
            fprintf(stderr, "gpipe-balance: %s %d layers on %s at micro-batch %s%lld...\n",
                    mo.timed ? "profiling" : "measuring the memory of", cfg.model.n_layers,
                    cfg.pipeline.devices[0].name, simulate ? "sizes up to " : "",
                    (long long)(simulate ? batch : mbs));
        s = gp_model_profile(&cfg, &mo, &prof);
        if (s == GP_OK && prof.contend > 0)
            if (notes) fprintf(stderr, "gpipe-balance: each layer was timed while %d other CPU device%s ran "
                    "it too, as the pipeline's stages share the memory bus\n", prof.contend,
                    prof.contend > 1 ? "s" : "");
    }
    if (s == GP_OK && prof_out) s = gp_profile_save(&prof, prof_out);
    if (s != GP_OK) {
        fprintf(stderr, "gpipe-balance: %s\n", gp_last_error());
        gp_profile_free(&prof); /* a save that failed leaves the profile whole */
        gp_config_free(&cfg);
        free(sets);
        return gp_status_exit_code(s);
    }
    if (by != GP_BALANCE_BY_SIZE && !prof.timed) {
        /* a --profile-in saved with --by size: no times in it */
        if (simulate) {
            fprintf(stderr, "gpipe-balance: '%s' holds no times (it was saved with --by size): "
                    "--simulate needs them; profile again without --by size\n", prof_in);
            gp_profile_free(&prof);
            gp_config_free(&cfg);
            free(sets);
            return EXIT_USAGE;
        }
        if (warns)
            fprintf(stderr, "gpipe-balance: warning: '%s' holds no times (it was saved with --by "
                    "size): balancing by size; profile again without --by size to balance by "
                    "time\n", prof_in);
        by = GP_BALANCE_BY_SIZE;
    }

    /* ---- the per-layer table ---- */
    int L = prof.L;
    gp_layer_times *lt = calloc((size_t)L, sizeof *lt);
    double loss = 0, upload = 0, total = 0, total_mem = 0;
    if (prof.timed) gp_profile_times_at(&prof, mbs, lt, &loss, &upload);
    for (int k = 0; k < L; k++) {
        total += lt[k].fwd + lt[k].bwd_data + lt[k].bwd_weights;
        total_mem += (double)(prof.mem[k].param_bytes + prof.mem[k].grad_bytes +
                              prof.mem[k].optim_bytes) + prof.mem[k].keep_per_sample * (double)mbs;
    }
    if (!quiet) { /* -q: the balance and errors only */
        printf("%s: %d layers, batch %lld%s, %d chunk%s (micro-batch %lld), on %s x %d thread%s, "
               "%s checkpointing\n\n", config, L, (long long)batch, per_replica, m, m == 1 ? "" : "s",
               (long long)mbs, prof.device, prof.threads, prof.threads == 1 ? "" : "s",
               gp_checkpoint_mode_name(cfg.pipeline.checkpoint));
        printf("%3s %-28s %8s %8s %8s %8s %8s %6s %10s %10s %10s %10s %6s\n", "#", "layer", "fwd ms",
               "bwd-d ms", "bwd-w ms", "recmp ms", "copy ms", "time%", "params", "grad+opt",
               "act kept", "workspace", "mem%");
        for (int k = 0; k < L; k++) {
            const gp_layer_mem *mm = &prof.mem[k];
            char b1[32], b2[32], b3[32], b4[32], name[29];
            const char *d = mm->desc;
            if (!strncmp(d, "layer ", 6)) { /* "layer 3 (conv2d) at f.yaml:1:2" -> "conv2d" */
                const char *o = strchr(d, '(');
                d = o ? o + 1 : d;
            }
            size_t nl = strlen(d) < sizeof name - 1 ? strlen(d) : sizeof name - 1;
            memcpy(name, d, nl);
            name[nl] = '\0';
            char *cl = strchr(name, ')');
            if (cl) *cl = '\0';
            if (mm->fused) snprintf(name, sizeof name, "relu (fused)");
            double mem = (double)(mm->param_bytes + mm->grad_bytes + mm->optim_bytes) +
                         mm->keep_per_sample * (double)mbs;
            char times[64] = "";
            if (prof.timed)
                snprintf(times, sizeof times, "%8.3f %8.3f %8.3f %8.3f %8.3f %5.1f%%",
                         lt[k].fwd * 1e3, lt[k].bwd_data * 1e3, lt[k].bwd_weights * 1e3,
                         lt[k].recompute * 1e3, lt[k].copy * 1e3,
                         total > 0 ? 100 * (lt[k].fwd + lt[k].bwd_data + lt[k].bwd_weights) /
                                         total : 0);
            else /* --by size: nothing was timed */
                snprintf(times, sizeof times, "%8s %8s %8s %8s %8s %6s", "-", "-", "-", "-", "-",
                         "-");
            printf("%3d %-28s %s %10s %10s %10s %10s %5.1f%%\n", k, name, times,
                   mb((double)mm->param_bytes, b1, sizeof b1),
                   mb((double)(mm->grad_bytes + mm->optim_bytes), b2, sizeof b2),
                   inplace_kept(mm, mbs, b3, sizeof b3),
                   mb((double)mm->workspace_bytes, b4, sizeof b4),
                   total_mem > 0 ? 100 * mem / total_mem : 0);
        }
        for (int k = 0; k < L; k++)
            if (prof.mem[k].inplace || prof.mem[k].unkept) {
                printf("    *: its output is not kept for backward: it runs in place, in its "
                       "input's memory (not as a stage's first layer), or no backward reads it "
                       "(not as a stage's last)\n");
                break;
            }
        for (int k = 0; k < L; k++)
            if (prof.mem[k].fused) {
                printf("    relu (fused): the batch norm before it does its forward and backward, "
                       "so its times (measured alone) count only as a stage's first layer\n");
                break;
            }
        if (prof.timed)
            printf("    loss %.3f ms, input upload %.3f ms; fwd+bwd total %.2f ms per micro-batch\n",
                   loss * 1e3, upload * 1e3, total * 1e3);
        printf("\n");
    }

    /* ---- the balance ---- */
    gp_plan_opts po;
    /* one entry per stage: devices x pipeline.virtual for the interleaved
     * schedule */
    int v = gp_model_virtual(&cfg);
    gp_model_plan_opts(&cfg, n * v, &po);
    po.by = by == GP_BALANCE_BY_SIZE ? GP_BALANCE_BY_SIZE : GP_BALANCE_BY_TIME;
    /* the simulator checks each device's whole peak against its capacity;
     * the plan's capacities are per stage (a device's over its v stages) */
    gp_config c1 = cfg;
    if (v > 1) {
        c1.pipeline.schedule = GP_SCHEDULE_GPIPE;
        c1.pipeline.virtual_stages = 1;
    }
    gp_plan_opts pd;
    gp_model_plan_opts(&c1, n, &pd);
    pd.by = po.by;
    int balance[GP_MAX_DEVICES];
    s = gp_balance_plan(&prof, &po, balance);
    /* --simulate is where a config that fits nowhere at its own m learns
     * which m, schedule and checkpointing do fit: simulate on the split
     * that balances time alone (each row says whether it fits) rather
     * than stop here */
    bool own_fits = s == GP_OK;
    if (s == GP_ERR_OOM && simulate && prof.timed) {
        printf("at the config's m = %d: %s\nthe rows below are simulated on the split that "
               "balances time alone; each says whether it fits\n\n", m, gp_last_error());
        s = plan_time_alone(&prof, &po, balance);
    }
    if (s == GP_OK && own_fits) {
        char title[96];
        if (gp_schedule_v_shape(cfg.pipeline.schedule))
            snprintf(title, sizeof title, "balance for %d devices x 2 stages (%s: device d "
                     "holds stages d and %d - d), by %s", n,
                     gp_schedule_kind_name(cfg.pipeline.schedule), 2 * n - 1,
                     gp_balance_by_name(po.by));
        else if (v > 1)
            snprintf(title, sizeof title, "balance for %d devices x %d stages (interleaved), by %s",
                     n, v, gp_balance_by_name(po.by));
        else
            snprintf(title, sizeof title, "balance for %d device%s, by %s", n,
                     n == 1 ? "" : "s", gp_balance_by_name(po.by));
        print_balance(title, &prof, &po, balance);
        if (by == GP_BALANCE_BY_BOTH) {
            gp_plan_opts ps = po;
            ps.by = GP_BALANCE_BY_SIZE;
            int bs[GP_MAX_DEVICES];
            if (gp_balance_plan(&prof, &ps, bs) == GP_OK) {
                printf("\n");
                print_balance("for comparison, by size", &prof, &ps, bs);
                gp_sim_result a, b;
                gp_schedule_kind sk = cfg.pipeline.schedule;
                /* (a schedule read from a file simulates as the file's lists) */
                const struct gp_schedule_file *sf = cfg.pipeline.schedule_file;
                if (gp_simulate_schedule_file(&prof, sk, n, v, sf, balance, m, po.checkpoint,
                                              cfg.pipeline.lockstep, pd.capacity, &a) == GP_OK &&
                    gp_simulate_schedule_file(&prof, sk, n, v, sf, bs, m, po.checkpoint,
                                              cfg.pipeline.lockstep, pd.capacity, &b) == GP_OK)
                    printf("  predicted step: by time %.2f ms, by size %.2f ms\n", a.step * 1e3,
                           b.step * 1e3);
            }
        }
    }

    /* ---- the simulator ---- */
    struct sim_pick {
        int kind, v, m;
        gp_checkpoint_mode ck;
    } sim_pick = {-1, 1, 1, GP_CKPT_NEVER}; /* what --write-schedule writes, if any */
    if (s == GP_OK && simulate && prof.timed) {
        /* each schedule under its own default lockstep (gpipe in lockstep,
         * the others free-running), unless the config says which */
        bool ls_given = cfg.pipeline.lockstep_given;
        printf("\nsimulated steps with this balance (%s%s):\n",
               !ls_given ? "gpipe in lockstep, the others free-running"
               : cfg.pipeline.lockstep ? "lockstep" : "free-running",
               R > 1 ? "; one replica's pipeline and samples/s, without the replicas' "
                       "exchanges" : "");
        printf("%-8s %-16s %4s %10s %8s %12s %12s %5s\n", "schedule", "checkpoint", "m",
               "step ms", "bubble", "samples/s", "peak mem", "fits");
        gp_checkpoint_mode modes[3] = {GP_CKPT_ALWAYS, GP_CKPT_EXCEPT_LAST, GP_CKPT_NEVER};
        /* what is simulated: each schedule on one stage per device (an
         * interleaved config's own balance has n x v entries, so they get
         * theirs), and interleaved with v = 2 and with the config's own v
         * where that is more (until 2026-11-25 only 2: a virtual: 3 config
         * saw none of its own), each balanced over v n stages the same way
         * (each with its share of its device's memory), m multiples of n;
         * those and the V schedules each on the split balance: auto gives it
         * under each checkpoint mode (a mode moves the split: zb-v's under
         * except_last gives its last stage, which never recomputes, most of
         * the layers; simulated never on it, it read 21% bubble for 2%) */
        int bal1[GP_MAX_DEVICES], balv[2][3][GP_MAX_DEVICES], balz[4][3][GP_MAX_DEVICES];
        const int *one = balance;
        if (v > 1) {
            /* (planned under GPipe's memory, all m micro-batches held: where
             * that fits nowhere while the config's own split fits, time
             * alone too, its rows saying what fits; until 2026-12-01 the
             * error ended --simulate with an empty table and no --write) */
            s = gp_balance_plan(&prof, &pd, bal1);
            if (s == GP_ERR_OOM) s = plan_time_alone(&prof, &pd, bal1);
            one = bal1;
        }
        sim_run runs[GP_SCHEDULE_KINDS + 1];
        int n_runs = 0;
        for (int k = 0; k < GP_SCHEDULE_KINDS; k++)
            if (k != GP_SCHEDULE_INTERLEAVED && !gp_schedule_v_shape((gp_schedule_kind)k)) {
                runs[n_runs].kind = (gp_schedule_kind)k;
                runs[n_runs].v = 1;
                for (int c = 0; c < 3; c++) runs[n_runs].bal[c] = one;
                n_runs++;
            }
        const int vs[2] = {2, v};
        for (int q = 0; q < (v > 2 ? 2 : 1) && s == GP_OK; q++) {
            if (n < 2 || vs[q] * n > GP_MAX_DEVICES || vs[q] * n > prof.L) continue;
            add_planned(runs, &n_runs, &cfg, &prof, GP_SCHEDULE_INTERLEAVED, vs[q], modes, balv[q],
                        NULL);
        }
        /* the V schedules: 2n stages in a V, each split as a run of it splits
         * (gp_partition_solve_v over the devices, refined against its own
         * simulated step) */
        if (s == GP_OK && n >= 2 && 2 * n <= GP_MAX_DEVICES && 2 * n <= prof.L) {
            static const gp_schedule_kind vk[4] = {GP_SCHEDULE_ZB_V, GP_SCHEDULE_DUALPIPE_V,
                                                   GP_SCHEDULE_V_HALF, GP_SCHEDULE_V_MIN};
            /* one the config's m cannot plan (dualpipe-v below 2n
             * micro-batches) is simulated on zb-v's split, the same V */
            const int *const *zb = add_planned(runs, &n_runs, &cfg, &prof, vk[0], 2, modes,
                                               balz[0], NULL);
            for (int q = 1; q < 4; q++)
                add_planned(runs, &n_runs, &cfg, &prof, vk[q], 2, modes, balz[q], zb);
        }
        gp_sim_result r[(GP_SCHEDULE_KINDS + 1) * 3 * 6];
        int cnt = 0;
        for (int u = 0; u < n_runs && s == GP_OK; u++) {
            bool ik = runs[u].kind == GP_SCHEDULE_INTERLEAVED;
            for (int c = 0; c < 3 && s == GP_OK; c++)
                for (int q = 1; q <= 32 && s == GP_OK && runs[u].bal[c]; q *= 2) {
                    if (q > batch) break;
                    if (ik && q % n) continue;
                    if (runs[u].kind == GP_SCHEDULE_DUALPIPE_V && q < 2 * n) continue;
                    bool ls = gp_config_lockstep_for(&cfg.pipeline, runs[u].kind);
                    s = gp_simulate_schedule(&prof, runs[u].kind, n, runs[u].v, runs[u].bal[c],
                                             q, modes[c], ls, pd.capacity, &r[cnt]);
                    if (s != GP_OK) break;
                    char b1[32], name[16], cl[32];
                    snprintf(name, sizeof name, "interl.%d", r[cnt].v);
                    printf("%-8s %-16s %4d %10.2f %7.1f%% %12.1f %12s %5s\n",
                           ik ? name : gp_schedule_kind_name(runs[u].kind),
                           ckpt_label(modes[c], cfg.pipeline.checkpoint_keep, cl, sizeof cl), q,
                           r[cnt].step * 1e3,
                           100 * r[cnt].bubble, r[cnt].throughput,
                           mb(gp_sim_peak(&r[cnt]), b1, sizeof b1), r[cnt].fits ? "yes" : "NO");
                    cnt++;
                }
        }
        int pick = s == GP_OK ? gp_sim_recommend_memory(r, cnt) : -1;
        if (pick >= 0)
            sim_pick = (struct sim_pick){r[pick].schedule, r[pick].v, r[pick].m,
                                         r[pick].checkpoint};
        char b1[32];
        if (pick >= 0) {
            bool ik = r[pick].schedule == GP_SCHEDULE_INTERLEAVED;
            char with[32] = "";
            if (ik) snprintf(with, sizeof with, " with virtual: %d", r[pick].v);
            char cl[32];
            printf("recommended: schedule %s%s, checkpoint %s, m = %d (%.1f samples/s, peak %s): "
                   "the least memory within 5%% of the best throughput that fits\n",
                   gp_schedule_kind_name(r[pick].schedule), with,
                   ckpt_label(r[pick].checkpoint, cfg.pipeline.checkpoint_keep, cl, sizeof cl),
                   r[pick].m, r[pick].throughput,
                   mb(gp_sim_peak(&r[pick]), b1, sizeof b1));
            /* advice: --write keeps the config's own choices; say how to
             * take this one instead */
            bool same = r[pick].schedule == cfg.pipeline.schedule &&
                        r[pick].checkpoint == cfg.pipeline.checkpoint &&
                        r[pick].m == cfg.pipeline.chunks &&
                        (!ik || cfg.pipeline.virtual_stages == r[pick].v);
            if (!same)
                print_hint(argc, argv, n, r[pick].m, gp_schedule_kind_name(r[pick].schedule),
                           r[pick].v, v, r[pick].checkpoint, cfg.pipeline.checkpoint_keep,
                           ls_given && cfg.pipeline.lockstep);
        }
        else if (s == GP_OK && !own_fits) /* the config fits nowhere, nor does anything else */
            s = gp_error_set(GP_ERR_INVALID, "no schedule, checkpoint mode and m fits device "
                             "memory either; raise pipeline.memory or add devices");
        else if (s == GP_OK)
            printf("no schedule, checkpoint mode and m fits device memory\n");
    }
    if (s == GP_OK && sched_out) {
        if (sim_pick.kind >= 0)
            s = write_schedule(sched_out, &cfg, (gp_schedule_kind)sim_pick.kind, n, sim_pick.v,
                               sim_pick.m, sim_pick.ck);
        else
            s = write_schedule(sched_out, &cfg, cfg.pipeline.schedule, n, v, m,
                               cfg.pipeline.checkpoint);
    }
    if (s == GP_OK && write_path && !own_fits)
        s = gp_error_set(GP_ERR_INVALID, "not writing %s: no split fits device memory at the "
                         "config's own m = %d (above); write the recommended setup instead",
                         write_path, m);
    if (s == GP_OK && write_path) {
        s = write_config(write_path, &cfg, balance);
        if (s == GP_OK) printf("\nwrote %s\n", write_path);
    }
    if (s != GP_OK) fprintf(stderr, "gpipe-balance: %s\n", gp_last_error());
    free(lt);
    gp_profile_free(&prof);
    gp_config_free(&cfg);
    free(sets);
    /* Past the profile, an out-of-memory is the planner's: no split fits
     * the capacities.  That is the config's to change (an infeasible
     * balance, 2), not a failure of this run (4, as the library's
     * GP_ERR_OOM maps) */
    return s == GP_ERR_OOM ? 2 : gp_status_exit_code(s);
}
