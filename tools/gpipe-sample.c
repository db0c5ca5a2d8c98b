/*
 * gpipe-sample — text from a language model: the model of a config, with
 * the weights of a snapshot (--resume) or of a weights file (--weights:
 * gpipe's, Hugging Face's GPT-2 or llm.c's, as model.init_from reads
 * them), continues a prompt one token at a time, on the config's devices
 * and stages (gp_run_predict: a forward pass through the pipeline as
 * evaluation runs it).
 *
 * Each new token is drawn from the last position's logits divided by the
 * temperature, cut to the top k, through a softmax in double; temperature
 * 0 takes the most likely token (the lowest id among equals).  The draws
 * come from a splitmix64 stream seeded with --seed, so the same command
 * prints the same text.
 *
 * With a KV cache (the default, gp_decoder): the prompt's last T tokens
 * (model.input [T]) are fed once, then each new token is one position
 * through every layer, attending over the keys and values kept of the
 * positions before it.  Once the context fills T positions, the cache
 * starts again from the last T / 2 tokens (one prefill per T / 2 new
 * tokens).  --no-cache, and models a cache cannot run (not a Transformer
 * decoder), take the window: each token a forward pass over the last T
 * tokens, a shorter context padded after its end with id 0 (which causal
 * attention keeps from the positions before it).  Within T positions the
 * two give the same tokens (the logits agree to rounding); past T the
 * window slides a token at a time and the cache by halves, so they part.
 * A padded vocabulary (model.gpt.vocab_pad) draws among its real tokens
 * (gp_run_info.classes), never a padding logit.
 *
 * Tokens: byte-level (a vocabulary of 256: the prompt's bytes, the output
 * printed as bytes) by default there; otherwise --prompt-ids and ids out,
 * and --out writes the tokens (every sample's prompt and continuation, in
 * turn) as an llm.c token file for
 * scripts/tokenize_text.py decode (GPT-2's BPE where tiktoken's encoding
 * file is on the machine): uint16 ids, or llm.c's Llama 3 format (uint32)
 * for a vocabulary past 65,536.
 */
#include "core/core.h"
#include "gpipe.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define MAX_SETS 64

static void usage(FILE *f)
{
    fputs("usage: gpipe-sample CONFIG.yaml [options]\n"
          "\n"
          "Continue a prompt with the config's language model (model.input [T], an output\n"
          "(T, vocabulary)), through its pipeline.\n"
          "An option's VALUE may also follow an '=' (--set=KEY=VALUE).\n"
          "\n"
          "options:\n"
          "  --resume SNAPSHOT   the weights of a snapshot (train.snapshot writes them);\n"
          "                      'latest' = the newest complete one in train.snapshot.dir\n"
          "  --weights FILE      a weights file instead (model.init_from: gpipe's, Hugging\n"
          "                      Face's GPT-2 model.safetensors or Llama folder, or\n"
          "                      llm.c's gpt2_124M.bin)\n"
          "                      without either: the config's model.init_from, or fresh\n"
          "  --prompt TEXT       the prompt's bytes (byte-level models: vocabulary 256)\n"
          "  --prompt-ids I,J,..\n"
          "                      the prompt as token ids (any vocabulary)\n"
          "  --tokens N          tokens to generate (default 64)\n"
          "  --temperature X     >= 0 (default 1); 0 = always the most likely token\n"
          "  --top-k K           draw among the K most likely only (default 0: all)\n"
          "  --seed S            the draws' seed (default 1): the same seed, the same text\n"
          "  --samples N         continuations, side by side in one batch (default 1)\n"
          "  --no-cache          a forward over the whole window per token instead of the\n"
          "                      KV cache (the default, for Transformer decoders: a new\n"
          "                      token costs one position per layer)\n"
          "  --ids               print token ids, not bytes\n"
          "  --out FILE.bin      also write prompt + continuation as an llm.c token file\n"
          "                      (scripts/tokenize_text.py decode FILE.bin prints it),\n"
          "                      every sample's in turn with --samples N;\n"
          "                      checked before any work, never one of the inputs\n"
          "  --set KEY=VALUE     override a config value (repeatable)\n"
          "  -q, --quiet         only errors\n"
          "  -h, --help          this text\n"
          "  --version           print the version\n"
          "\n"
          "exit status: 0 success; 2 bad command line or config; 3 a file error (a\n"
          "weights file, --out); 4 a failure while generating.\n",
          f);
}

typedef struct sample_opts {
    const char *config, *resume, *weights, *prompt, *prompt_ids, *out;
    const char *sets[MAX_SETS + 1];
    int n_sets;
    int64_t tokens, top_k, samples;
    double temperature;
    uint64_t seed;
    int ids, quiet, no_cache;
} sample_opts;

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* An integer from "--opt VALUE" in [lo, hi]; false (said) otherwise: a
 * fraction is refused, not truncated ("--seed 1.9" gave seed 1's text). */
static bool parse_int(const char *opt, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "gpipe-sample: %s '%s': expected a whole number from %lld to %lld\n",
                opt, v, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

/* A number from "--opt VALUE" in [lo, hi]; false (said) otherwise. */
static bool parse_num(const char *opt, const char *v, double lo, double hi, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "gpipe-sample: %s '%s': expected a number in [%g, %g]\n", opt, v, lo,
                hi);
        return false;
    }
    *out = x;
    return true;
}

static int parse_args(int argc, char **argv, sample_opts *o)
{
    /* the options that take a value, as "--opt VALUE" or "--opt=VALUE" */
    static const char *const valued[] = {"--resume", "--weights", "--prompt", "--prompt-ids",
                                         "--out", "--set", "--tokens", "--top-k",
                                         "--samples", "--seed", "--temperature"};
    for (int i = 1; i < argc; i++) {
        char opt[32];
        const char *inline_v =
            cli_split_valued(argv[i], valued, sizeof valued / sizeof valued[0], opt, sizeof opt);
        const char *a = inline_v ? opt : argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return EXIT_OK + 100;
        }
        if (!strcmp(a, "--version")) {
            printf("gpipe-sample %s\n", gp_version());
            return EXIT_OK + 100;
        }
        if (!strcmp(a, "--ids")) { o->ids = 1; continue; }
        if (!strcmp(a, "--no-cache")) { o->no_cache = 1; continue; }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { o->quiet = 1; continue; }
        if (a[0] != '-') {
            if (o->config) {
                fprintf(stderr, "gpipe-sample: a second config '%s' (after '%s'); see --help\n",
                        a, o->config);
                return EXIT_USAGE;
            }
            o->config = a;
            continue;
        }
        bool known = false;
        for (size_t q = 0; q < sizeof valued / sizeof valued[0]; q++)
            known |= !strcmp(a, valued[q]);
        if (!known) {
            fprintf(stderr, "gpipe-sample: unknown option '%s'; see --help\n", a);
            return EXIT_USAGE;
        }
        if (!inline_v && i + 1 >= argc) {
            fprintf(stderr, "gpipe-sample: %s needs a value; see --help\n", a);
            return EXIT_USAGE;
        }
        const char *v = inline_v ? inline_v : argv[++i];
        double x = 0;
        long long k = 0;
        bool ok = true;
        if (!strcmp(a, "--resume")) o->resume = v;
        else if (!strcmp(a, "--weights")) o->weights = v;
        else if (!strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--set")) {
            if (o->n_sets == MAX_SETS) {
                fprintf(stderr, "gpipe-sample: more than %d --set\n", MAX_SETS);
                return EXIT_USAGE;
            }
            o->sets[o->n_sets++] = v;
        } else if (!strcmp(a, "--tokens")) {
            if ((ok = parse_int(a, v, 1, 10000000, &k))) o->tokens = k;
        } else if (!strcmp(a, "--top-k")) {
            if ((ok = parse_int(a, v, 0, 1000000000, &k))) o->top_k = k;
        } else if (!strcmp(a, "--samples")) {
            if ((ok = parse_int(a, v, 1, 4096, &k))) o->samples = k;
        } else if (!strcmp(a, "--seed")) {
            if ((ok = parse_int(a, v, 0, LLONG_MAX, &k))) o->seed = (uint64_t)k;
        } else if (!strcmp(a, "--temperature")) {
            if ((ok = parse_num(a, v, 0, 1e6, &x))) o->temperature = x;
        } else {
            fprintf(stderr, "gpipe-sample: unknown option '%s'; see --help\n", a);
            return EXIT_USAGE;
        }
        if (!ok) return EXIT_USAGE;
    }
    if (!o->config) {
        fputs("gpipe-sample: give the model's CONFIG.yaml; see --help\n", stderr);
        return EXIT_USAGE;
    }
    if (o->resume && o->weights) {
        fputs("gpipe-sample: --resume and --weights both give the weights: give one\n", stderr);
        return EXIT_USAGE;
    }
    if (!o->prompt == !o->prompt_ids) {
        fputs(o->prompt ? "gpipe-sample: --prompt and --prompt-ids both give the prompt: give "
                          "one\n"
                        : "gpipe-sample: give the prompt: --prompt TEXT or --prompt-ids I,J,...\n",
              stderr);
        return EXIT_USAGE;
    }
    return EXIT_OK;
}

/* The prompt's ids into ids (room for cap), *n of them; vocab checks them. */
static int prompt_tokens(const sample_opts *o, int64_t vocab, int64_t *ids, int64_t cap,
                         int64_t *n)
{
    *n = 0;
    if (o->prompt) {
        if (vocab != 256) {
            fprintf(stderr, "gpipe-sample: --prompt gives bytes, for a byte-level model "
                    "(vocabulary 256); this model's vocabulary is %lld: give --prompt-ids "
                    "(scripts/tokenize_text.py ids --tokenizer tokenizer.json 'TEXT', or "
                    "--encoding gpt2, prints them)\n", (long long)vocab);
            return EXIT_USAGE;
        }
        for (const unsigned char *p = (const unsigned char *)o->prompt; *p && *n < cap; p++)
            ids[(*n)++] = *p;
    } else {
        for (const char *p = o->prompt_ids; *p && *n < cap;) {
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p || v < 0 || v >= vocab || (*end && *end != ',')) {
                fprintf(stderr, "gpipe-sample: --prompt-ids '%s': expected ids in [0, %lld) "
                        "separated by commas\n", o->prompt_ids, (long long)vocab);
                return EXIT_USAGE;
            }
            ids[(*n)++] = v;
            p = *end ? end + 1 : end;
        }
    }
    if (*n == 0) {
        fputs("gpipe-sample: the prompt is empty; give at least one token\n", stderr);
        return EXIT_USAGE;
    }
    return EXIT_OK;
}

/* Whether id a ranks before id b: the larger logit, on a tie the lower id. */
static bool ranks_before(const float *l, int64_t a, int64_t b)
{
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

/* h[i] moved down the heap h[0..n) whose root ranks last. */
static void sift_down(const float *l, int64_t *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t w = i, c = 2 * i + 1;
        if (c < n && ranks_before(l, h[w], h[c])) w = c;
        if (c + 1 < n && ranks_before(l, h[w], h[c + 1])) w = c + 1;
        if (w == i) return;
        int64_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k ids of the largest logits into idx[0..k), best first (ties in id
 * order): a heap of the k kept, then sorted, O(V log k).  It was a
 * selection sort, V k steps: with top-k off (k = V) GPT-2's vocabulary
 * took 0.5 s a token, Llama 3's 3 s. */
static void top_k_ids(const float *l, int64_t V, int64_t k, int64_t *idx)
{
    for (int64_t v = 0; v < k; v++) idx[v] = v;
    for (int64_t i = k / 2; i-- > 0;) sift_down(l, idx, k, i);
    for (int64_t v = k; v < V; v++)
        if (ranks_before(l, v, idx[0])) {
            idx[0] = v;
            sift_down(l, idx, k, 0);
        }
    for (int64_t n = k; n > 1; n--) { /* the last-ranked to the end, in turn */
        int64_t t = idx[0];
        idx[0] = idx[n - 1];
        idx[n - 1] = t;
        sift_down(l, idx, n - 1, 0);
    }
}

/* One token from logits (V) by temperature and top-k; idx is scratch (V). */
static int64_t draw(const float *logits, int64_t V, const sample_opts *o, uint64_t *rng,
                    int64_t *idx, double *p)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (o->temperature == 0 || o->top_k == 1) return best;
    int64_t k = o->top_k > 0 && o->top_k < V ? o->top_k : V, n = 0;
    top_k_ids(logits, V, k, idx);
    double mx = logits[best], sum = 0;
    for (n = 0; n < k; n++) sum += p[n] = exp(((double)logits[idx[n]] - mx) / o->temperature);
    double u = (double)(splitmix64(rng) >> 11) * 0x1.0p-53 * sum, c = 0;
    for (int64_t i = 0; i < k; i++) {
        c += p[i];
        if (u < c) return idx[i];
    }
    return idx[k - 1];
}

/* Written beside `path` and renamed over it: a failed write (a full disk,
 * ulimit -f) leaves whatever was at path as it was. */
static int write_tokens(const char *path, const int64_t *ids, int64_t n, int64_t vocab)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    /* llm.c's uint16 files, or its Llama 3 files (uint32) past 65,536 ids */
    bool wide = vocab > 65536;
    int32_t hdr[256] = {wide ? 20240801 : 20240520, wide ? 7 : 1, (int32_t)n};
    bool ok = f && fwrite(hdr, sizeof hdr, 1, f) == 1;
    for (int64_t i = 0; ok && i < n; i++) {
        uint16_t t16 = (uint16_t)ids[i];
        uint32_t t32 = (uint32_t)ids[i];
        ok = wide ? fwrite(&t32, 4, 1, f) == 1 : fwrite(&t16, 2, 1, f) == 1;
    }
    int e = ok ? 0 : errno;
    if (f && fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        if (f) unlink(tmp);
        fprintf(stderr, "gpipe-sample: --out '%s': cannot write it: %s; the tokens were "
                "printed above; give a path with room in a directory you can write\n", path,
                strerror(e ? e : EIO));
    }
    return ok ? EXIT_OK : EXIT_DATA;
}

/* --out checked before any work: not an input (the config, the weights,
 * model.init_from, the snapshot read), and a place that takes a file. */
static gp_status check_out(const gp_run *run, const sample_opts *o)
{
    if (!o->out) return GP_OK;
    if (o->resume && (!strcmp(o->out, o->resume) || gp_same_file(o->out, o->resume)))
        return gp_error_set(GP_ERR_INVALID, "--out %s is the snapshot --resume reads: writing "
                            "it would replace it; give the output another name", o->out);
    return gp_run_check_output(run, o->out, "--out");
}

typedef struct sampler {
    gp_run *run;
    int64_t T, V, S;
    int64_t Vp; /* the logits' row: V and (model.gpt.vocab_pad) padding past it */
    int64_t *ids; /* (S, len + tokens) */
    int64_t len, cap;
    float *x, *y; /* (S, T) inputs, (S, T, Vp) logits */
    int64_t *idx;
    double *p;
    gp_decoder *dec; /* the KV cache, or NULL: the window */
} sampler;

/* Sample q's logits for position pos, checked before a token is drawn
 * from them: a NaN or an infinity (weights that overflow, a diverged
 * run's snapshot) has no largest value, and drawing from it printed one
 * token over and over with exit 0 (issue 77).  A failure while
 * generating (exit 4), as gpipe-train's NaN loss is, not a file error. */
static gp_status logits_finite(const float *l, int64_t V, int64_t q, int64_t pos)
{
    for (int64_t v = 0; v < V; v++)
        if (!isfinite(l[v]))
            return gp_error_set(GP_ERR_NUMERIC, "the logits of sample %lld at position %lld are "
                                "not finite (token %lld's is %g): the model's output overflows "
                                "or is NaN with these weights; check them (a run that diverged, "
                                "or weights of another scale), nothing was sampled from them",
                                (long long)q, (long long)pos, (long long)v, (double)l[v]);
    return GP_OK;
}

/* Tokens len .. cap-1 of every sample with the cache: the context's last
 * positions fed (all of them first, the last T / 2 again whenever the
 * cache is full), then one position per token. */
static gp_status generate_cached(sampler *s, const sample_opts *o)
{
    uint64_t rng = o->seed;
    int64_t T = gp_decoder_capacity(s->dec);
    for (; s->len < s->cap; s->len++) {
        int64_t fed = gp_decoder_length(s->dec), w0, n;
        if (fed == 0 || fed == T) { /* (re)fill: the context's last positions */
            int64_t keep = fed == 0 ? T : T / 2 > 0 ? T / 2 : 1;
            w0 = s->len > keep ? s->len - keep : 0;
            GP_TRY(gp_decoder_rewind(s->dec, 0));
        } else {
            w0 = s->len - 1; /* the token drawn last */
        }
        n = s->len - w0;
        for (int64_t q = 0; q < s->S; q++)
            for (int64_t t = 0; t < n; t++) s->x[q * n + t] = (float)s->ids[q * s->cap + w0 + t];
        GP_TRY(gp_decoder_feed(s->dec, s->x, n, 0, s->y));
        for (int64_t q = 0; q < s->S; q++) {
            GP_TRY(logits_finite(s->y + q * s->Vp, s->V, q, s->len));
            s->ids[q * s->cap + s->len] = draw(s->y + q * s->Vp, s->V, o, &rng, s->idx, s->p);
        }
    }
    return GP_OK;
}

/* Tokens len .. cap-1 of every sample, one forward pass each. */
static gp_status generate(sampler *s, const sample_opts *o)
{
    if (s->dec) return generate_cached(s, o);
    uint64_t rng = o->seed;
    for (; s->len < s->cap; s->len++) {
        int64_t w0 = s->len > s->T ? s->len - s->T : 0, w = s->len - w0;
        for (int64_t q = 0; q < s->S; q++)
            for (int64_t t = 0; t < s->T; t++)
                s->x[q * s->T + t] = t < w ? (float)s->ids[q * s->cap + w0 + t] : 0.0f;
        GP_TRY(gp_run_predict(s->run, s->x, s->S, s->y));
        for (int64_t q = 0; q < s->S; q++) {
            const float *l = s->y + (q * s->T + w - 1) * s->Vp;
            GP_TRY(logits_finite(l, s->V, q, s->len));
            s->ids[q * s->cap + s->len] = draw(l, s->V, o, &rng, s->idx, s->p);
        }
    }
    return GP_OK;
}

static void print_samples(const sampler *s, const sample_opts *o, int64_t n_prompt)
{
    for (int64_t q = 0; q < s->S; q++) {
        if (s->S > 1) printf("%s--- sample %lld ---\n", q ? "\n" : "", (long long)q);
        for (int64_t i = 0; i < s->cap; i++) {
            int64_t t = s->ids[q * s->cap + i];
            if (o->ids || s->V != 256) printf("%s%lld", i ? (i == n_prompt ? " | " : " ") : "",
                                             (long long)t);
            else putchar((int)t);
        }
        putchar('\n');
    }
}

static int run_sampler(const sample_opts *o)
{
    const char *sets[MAX_SETS + 2];
    char init[1100];
    int n = 0;
    for (int i = 0; i < o->n_sets; i++) sets[n++] = o->sets[i];
    if (o->weights) {
        snprintf(init, sizeof init, "model.init_from=%s", o->weights);
        sets[n++] = init;
    }
    if (o->quiet) gp_set_log_level("error"); /* (--help: only errors, as the other tools) */
    sampler s = {0};
    gp_status st = gp_run_load_resume(o->config, sets, n, o->resume, &s.run);
    /* sampling holds the weights alone: no gradients, no optimizer state,
     * and the memory check asks for that (issue 77) */
    if (st == GP_OK) st = gp_run_inference_only(s.run);
    gp_run_info info;
    if (st == GP_OK) st = check_out(s.run, o);
    /* restored before anything prepares the run: its build draws no
     * random values the snapshot replaces */
    bool restoring = false;
    if (st == GP_OK && o->resume) {
        restoring = true;
        st = gp_run_restore(s.run, o->resume);
    }
    if (st == GP_OK) {
        restoring = false;
        st = gp_run_prepare(s.run);
    }
    if (st == GP_OK) st = gp_run_describe(s.run, &info);
    if (st != GP_OK) {
        /* the library's name for the call is this tool's --resume */
        const char *msg = gp_last_error(), *lib = "gp_run_restore: ";
        const char *latest = "gp_run_restore(\"latest\"): ";
        if (restoring && !strncmp(msg, lib, strlen(lib)))
            fprintf(stderr, "gpipe-sample: --resume: %s\n", msg + strlen(lib));
        else if (restoring && !strncmp(msg, latest, strlen(latest)))
            fprintf(stderr, "gpipe-sample: --resume latest: %s\n", msg + strlen(latest));
        else
            fprintf(stderr, "gpipe-sample: %s\n", msg);
        gp_run_free(s.run);
        return gp_status_exit_code(st);
    }
    s.T = info.input_numel;
    s.Vp = info.target_numel == s.T && s.T > 0 ? info.output_numel / s.T : 0;
    /* a padded vocabulary's logits past V are no tokens: drawn among V */
    s.V = info.classes > 0 && info.classes < s.Vp ? info.classes : s.Vp;
    if (info.input[1] != 1 || info.input[2] != 1 || s.V < 1 ||
        info.output_numel != s.T * s.Vp) {
        fprintf(stderr, "gpipe-sample: %s is not a language model: it needs model.input [T] "
                "and an output (T, vocabulary) with a target per position\n", o->config);
        gp_run_free(s.run);
        return EXIT_USAGE;
    }
    if (info.fresh && !o->quiet)
        fputs("gpipe-sample: note: no weights given (--resume, --weights or the config's "
              "model.init_from): sampling from the fresh, untrained weights\n", stderr);
    s.S = o->samples;
    int64_t room = (int64_t)strlen(o->prompt ? o->prompt : o->prompt_ids) + 1, np = 0;
    int64_t *prompt = malloc((size_t)room * sizeof *prompt);
    int code = prompt ? prompt_tokens(o, s.V, prompt, room, &np) : EXIT_RUNTIME;
    s.len = np;
    s.cap = np + o->tokens;
    s.ids = calloc((size_t)(s.S * s.cap), sizeof *s.ids);
    s.x = malloc((size_t)(s.S * s.T) * sizeof *s.x);
    s.y = malloc((size_t)(s.S * s.T * s.Vp) * sizeof *s.y);
    s.idx = malloc((size_t)s.V * sizeof *s.idx);
    s.p = malloc((size_t)s.V * sizeof *s.p);
    if (code == EXIT_OK && !(s.ids && s.x && s.y && s.idx && s.p)) {
        fputs("gpipe-sample: out of host memory\n", stderr);
        code = EXIT_RUNTIME;
    }
    if (code == EXIT_OK && !o->no_cache) {
        st = gp_decoder_open(s.run, s.S, &s.dec);
        if (st == GP_ERR_UNSUPPORTED) { /* not a Transformer decoder: the window */
            if (!o->quiet)
                fprintf(stderr, "gpipe-sample: no KV cache (%s); each token is a forward "
                        "over the window\n", gp_last_error());
            gp_error_clear();
            st = GP_OK;
        }
        if (st != GP_OK) {
            fprintf(stderr, "gpipe-sample: %s\n", gp_last_error());
            code = gp_status_exit_code(st);
        }
    }
    if (code == EXIT_OK) {
        for (int64_t q = 0; q < s.S; q++)
            memcpy(s.ids + q * s.cap, prompt, (size_t)np * sizeof *s.ids);
        st = generate(&s, o);
        if (st != GP_OK) {
            fprintf(stderr, "gpipe-sample: %s\n", gp_last_error());
            code = gp_status_exit_code(st);
        }
    }
    free(prompt);
    if (code == EXIT_OK) print_samples(&s, o, np);
    if (code == EXIT_OK && s.V != 256 && !o->out && !o->quiet && !o->ids)
        fprintf(stderr, "gpipe-sample: these are token ids (a vocabulary of %lld, not bytes): "
                "--out FILE.bin writes them for scripts/tokenize_text.py decode, which decodes "
                "GPT-2's BPE where tiktoken's encoding file is on this machine\n",
                (long long)s.V);
    /* every sample, one after the other (each its prompt and continuation) */
    if (code == EXIT_OK && o->out) code = write_tokens(o->out, s.ids, s.S * s.cap, s.V);
    free(s.ids);
    free(s.x);
    free(s.y);
    free(s.idx);
    free(s.p);
    gp_decoder_free(s.dec);
    gp_run_free(s.run);
    return code;
}

int main(int argc, char **argv)
{
    sample_opts o = {.tokens = 64, .temperature = 1.0, .seed = 1, .samples = 1};
    int code = parse_args(argc, argv, &o);
    if (code == EXIT_OK + 100) return EXIT_OK;
    if (code != EXIT_OK) return code;
    /* messages name this tool's flags: --set, --resume, and --weights where
     * the library reads it as model.init_from */
    gp_names_use_flags();
    if (o.weights) gp_opt_rename(GP_OPT_INIT_FROM, "--weights");
    /* a file-size limit or a closed pipe fails the write, which says so,
     * instead of killing the process silently (SIGXFSZ, SIGPIPE) */
    signal(SIGXFSZ, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    return run_sampler(&o);
}
