/*
 * gpipe-sample — generate text from a trained language model (issue 53,
 * point 5).  A thin layer over the library: load the config, put the
 * weights of a snapshot (or a weights file, as model.init_from) into the
 * run's model, then repeat: the last T tokens through the pipeline's stages
 * on their devices (gp_run_predict, evaluation mode), the next token drawn
 * from the last position's logits with temperature and top-k, appended.
 *
 * The model's input is T token positions ([T]).  A context shorter than T
 * is padded on the right with token 0: attention is causal, so the padding
 * after position k changes nothing at or before it, and the logits read
 * are those of the last real position.  No key-value cache: each token
 * costs a forward of T positions, which a model of the size gpipe-train
 * trains on two cores does in milliseconds.
 *
 * Byte-level models (vocabulary 256) read the prompt as UTF-8 bytes and
 * print bytes.  Other vocabularies (GPT-2's BPE) take --prompt-ids and
 * print token ids: this program does not carry a BPE table, and tiktoken's
 * is not on this machine (scripts/tokenize_text.py makes token files with
 * it where it is).
 */
#include "core/core.h"
#include "train/snapshot.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static void usage(FILE *f)
{
    fputs("usage: gpipe-sample CONFIG.yaml (--snapshot PATH | --weights FILE) [options]\n"
          "\n"
          "Generate tokens from the language model CONFIG.yaml describes (an embedding\n"
          "first, model.input [T], logits (N, T, vocab) last: configs/tiny-gpt.yaml,\n"
          "configs/gpt2.yaml), with the weights of a snapshot or a weights file, through\n"
          "the config's pipeline (pipeline.devices: the stages on their devices).\n"
          "\n"
          "options:\n"
          "  --snapshot PATH    a snapshot gpipe-train wrote (train.snapshot), or a\n"
          "                     directory of them: its newest complete one\n"
          "  --weights FILE     a weights file (--export-weights, or any safetensors\n"
          "                     file model.init_from reads)\n"
          "  --prompt TEXT      the text to continue (byte-level models); without one\n"
          "                     the first token is drawn after token 0\n"
          "  --prompt-ids IDS   the prompt as token ids, blank- or comma-separated\n"
          "  --tokens N         tokens to generate (default 200)\n"
          "  --temperature T    logits divided by T before the softmax (default 0.8;\n"
          "                     0 = always the most likely token)\n"
          "  --top-k K          draw among the K most likely tokens only (default 40;\n"
          "                     0 = all)\n"
          "  --seed S           the draw's seed (default 1): the same seed, weights and\n"
          "                     prompt give the same text\n"
          "  --ids              print token ids (one line) instead of bytes\n"
          "  --set KEY=VALUE    override a config value, as gpipe-train's --set\n"
          "  -q, --quiet        only errors\n"
          "  -h, --help         this text\n"
          "\n"
          "exit codes: 0 done, 2 bad command line or config, 3 missing or corrupt file,\n"
          "4 failure while running\n",
          f);
}

typedef struct {
    const char *config, *snapshot, *weights, *prompt, *prompt_ids;
    const char *sets[64];
    int n_sets;
    long tokens, top_k;
    double temperature;
    unsigned long long seed;
    int ids, quiet;
} sample_args;

static int bad_usage(const char *fmt, const char *a)
{
    fprintf(stderr, "gpipe-sample: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, " (gpipe-sample --help)\n");
    return EXIT_USAGE;
}

static int number(const char *opt, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !(d >= lo && d <= hi)) {
        fprintf(stderr, "gpipe-sample: %s takes a number in [%g, %g], not '%s' (gpipe-sample "
                "--help)\n", opt, lo, hi, v);
        return EXIT_USAGE;
    }
    *out = d;
    return EXIT_OK;
}

static int parse(int argc, char **argv, sample_args *a)
{
    *a = (sample_args){.tokens = 200, .top_k = 40, .temperature = 0.8, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            exit(EXIT_OK);
        }
        if (!strcmp(o, "--ids")) { a->ids = 1; continue; }
        if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) { a->quiet = 1; continue; }
        if (o[0] != '-') {
            if (a->config) return bad_usage("a second config '%s': give one", o);
            a->config = o;
            continue;
        }
        /* every other option takes a value: --opt V or --opt=V */
        const char *eq = strchr(o, '='), *v;
        char name[32];
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - o) : (int)strlen(o), o);
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else return bad_usage("%s needs a value", name);
        double d;
        int rc = EXIT_OK;
        if (!strcmp(name, "--snapshot")) a->snapshot = v;
        else if (!strcmp(name, "--weights")) a->weights = v;
        else if (!strcmp(name, "--prompt")) a->prompt = v;
        else if (!strcmp(name, "--prompt-ids")) a->prompt_ids = v;
        else if (!strcmp(name, "--set")) {
            if (a->n_sets == 64) return bad_usage("more than %s --set options", "64");
            a->sets[a->n_sets++] = v;
        } else if (!strcmp(name, "--tokens")) {
            if (!(rc = number(name, v, 0, 1e9, &d))) a->tokens = (long)d;
        } else if (!strcmp(name, "--top-k")) {
            if (!(rc = number(name, v, 0, 1 << 24, &d))) a->top_k = (long)d;
        } else if (!strcmp(name, "--temperature")) {
            if (!(rc = number(name, v, 0, 1e6, &d))) a->temperature = d;
        } else if (!strcmp(name, "--seed")) {
            if (!(rc = number(name, v, 0, 9007199254740992.0, &d))) a->seed = (unsigned long long)d;
        } else {
            return bad_usage("unknown option '%s'", o);
        }
        if (rc) return rc;
    }
    if (!a->config) return bad_usage("%s", "give the model's config: gpipe-sample CONFIG.yaml");
    if (!a->snapshot == !a->weights)
        return bad_usage("%s", "give the weights: either --snapshot PATH or --weights FILE");
    if (a->prompt && a->prompt_ids)
        return bad_usage("%s", "give --prompt or --prompt-ids, not both");
    return EXIT_OK;
}

/* The prompt as token ids into ctx (at most cap), checked against vocab. */
static int prompt_tokens(const sample_args *a, int64_t vocab, int64_t *ctx, int64_t cap,
                         int64_t *n)
{
    *n = 0;
    if (a->prompt) {
        if (vocab != 256) {
            fprintf(stderr, "gpipe-sample: --prompt is read as bytes, which needs a byte-level "
                    "model (vocabulary 256); this one has %lld tokens: give the prompt as "
                    "token ids with --prompt-ids\n", (long long)vocab);
            return EXIT_USAGE;
        }
        for (const unsigned char *p = (const unsigned char *)a->prompt; *p && *n < cap; p++)
            ctx[(*n)++] = *p;
        return EXIT_OK;
    }
    if (!a->prompt_ids) return EXIT_OK;
    const char *p = a->prompt_ids;
    while (*p) {
        if (*p == ' ' || *p == ',' || *p == '\t') { p++; continue; }
        char *end;
        errno = 0;
        long long id = strtoll(p, &end, 10);
        if (errno || end == p || id < 0 || id >= vocab) {
            fprintf(stderr, "gpipe-sample: --prompt-ids: '%.20s' is not a token id in [0, %lld)\n",
                    p, (long long)vocab);
            return EXIT_USAGE;
        }
        if (*n == cap) {
            fprintf(stderr, "gpipe-sample: --prompt-ids has more than %lld ids\n", (long long)cap);
            return EXIT_USAGE;
        }
        ctx[(*n)++] = id;
        p = end;
    }
    return EXIT_OK;
}

/* A token drawn from logits (vocab of them): the most likely at
 * temperature 0, else softmax(logits / temperature) over the top_k most
 * likely (all if 0), with the uniform u in [0, 1).  Ties go to the lower id. */
static int64_t draw(const float *logits, int64_t vocab, double temperature, long top_k, double u,
                    double *p, int64_t *order)
{
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature == 0) return best;
    int64_t k = top_k > 0 && top_k < vocab ? top_k : vocab;
    /* the k most likely, by selection (k is small, or every token) */
    for (int64_t v = 0; v < vocab; v++) order[v] = v;
    if (k < vocab)
        for (int64_t i = 0; i < k; i++) {
            int64_t m = i;
            for (int64_t j = i + 1; j < vocab; j++)
                if (logits[order[j]] > logits[order[m]]) m = j;
            int64_t t = order[i];
            order[i] = order[m];
            order[m] = t;
        }
    double sum = 0;
    for (int64_t i = 0; i < k; i++) {
        p[i] = exp(((double)logits[order[i]] - (double)logits[best]) / temperature);
        sum += p[i];
    }
    double r = u * sum;
    for (int64_t i = 0; i < k; i++) {
        r -= p[i];
        if (r < 0) return order[i];
    }
    return order[k - 1];
}

static int fail(gp_status s, const char *what)
{
    fprintf(stderr, "gpipe-sample: %s: %s\n", what, gp_last_error());
    return gp_status_exit_code(s);
}

/* The weights: a weights file through model.init_from (a --set after the
 * user's), a snapshot (or a directory's newest) through gp_run_restore. */
static int load_run(const sample_args *a, gp_run **run)
{
    const char *sets[65];
    int n = 0;
    for (int i = 0; i < a->n_sets; i++) sets[n++] = a->sets[i];
    char init[4200];
    if (a->weights) {
        snprintf(init, sizeof init, "model.init_from=\"%s\"", a->weights);
        sets[n++] = init;
    }
    sets[n] = NULL;
    gp_status s = gp_run_load(a->config, sets, n, run);
    if (s != GP_OK) return fail(s, a->config);
    if ((s = gp_run_prepare(*run)) != GP_OK) return fail(s, "preparing the model");
    if (!a->snapshot) return EXIT_OK;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s", a->snapshot);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) &&
        (s = gp_snapshot_latest(a->snapshot, path, sizeof path)) != GP_OK)
        return fail(s, a->snapshot);
    if ((s = gp_run_restore(*run, path)) != GP_OK) return fail(s, path);
    return EXIT_OK;
}

int main(int argc, char **argv)
{
    sample_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    gp_set_log_level(a.quiet ? "error" : "warn");
    gp_run *run = NULL;
    if ((rc = load_run(&a, &run))) {
        gp_run_free(run);
        return rc;
    }
    gp_run_info info;
    gp_status s = gp_run_describe(run, &info);
    if (s != GP_OK) {
        rc = fail(s, "describing the model");
        gp_run_free(run);
        return rc;
    }
    /* a language model: [T] token ids in, (T, vocab) logits out */
    int64_t T = info.input_numel, vocab = T > 0 ? info.output_numel / T : 0;
    if (T < 1 || info.target_numel != T || vocab * T != info.output_numel) {
        fprintf(stderr, "gpipe-sample: %s is not a language model: it takes %lld input values "
                "per sample and gives %lld outputs; sampling needs model.input [T] (token ids) "
                "and an (N, T, vocab) output, as configs/tiny-gpt.yaml\n", a.config,
                (long long)info.input_numel, (long long)info.output_numel);
        gp_run_free(run);
        return EXIT_USAGE;
    }
    int64_t cap = a.tokens + 1 + (a.prompt ? (int64_t)strlen(a.prompt) : 0) +
                  (a.prompt_ids ? (int64_t)strlen(a.prompt_ids) : 0),
            n = 0;
    int64_t *ctx = malloc((size_t)cap * sizeof *ctx), *order = malloc((size_t)vocab * sizeof *order);
    float *x = malloc((size_t)T * sizeof *x), *logits = malloc((size_t)(T * vocab) * sizeof *logits);
    double *p = malloc((size_t)vocab * sizeof *p);
    if (!ctx || !order || !x || !logits || !p) {
        fprintf(stderr, "gpipe-sample: out of host memory\n");
        rc = EXIT_RUNTIME;
        goto done;
    }
    if ((rc = prompt_tokens(&a, vocab, ctx, cap, &n))) goto done;
    if (!a.ids && a.prompt) fputs(a.prompt, stdout);
    for (long g = 0; g < a.tokens; g++) {
        /* the last T tokens of the context, padded on the right with 0s;
         * an empty context is one token 0 */
        int64_t from = n > T ? n - T : 0, len = n - from;
        for (int64_t t = 0; t < T; t++) x[t] = t < len ? (float)ctx[from + t] : 0.0f;
        if ((s = gp_run_predict(run, x, 1, logits)) != GP_OK) {
            rc = fail(s, "the forward");
            goto done;
        }
        int64_t at = len > 0 ? len - 1 : 0;
        double u = gp_rng_uniform(a.seed, 0x5a4d, (uint64_t)g);
        int64_t tok = draw(logits + at * vocab, vocab, a.temperature, a.top_k, u, p, order);
        ctx[n++] = tok;
        if (a.ids) printf("%s%lld", g ? " " : "", (long long)tok);
        else if (vocab == 256) putchar((int)tok);
        else printf("%s%lld", g ? " " : "", (long long)tok);
        fflush(stdout);
    }
    putchar('\n');
done:
    free(ctx);
    free(order);
    free(x);
    free(logits);
    free(p);
    gp_run_free(run);
    return rc;
}
