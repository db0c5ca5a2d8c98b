/*
 * test_decode.c — sampling with a KV cache (gpipe.h's gp_decoder,
 * src/train/decode.c; issue 66, point 6), against the oracle it must
 * equal: gp_run_predict's forward over the whole window.
 *
 * For a GPT-2-shaped model (a position table, layer norm, MHA, GELU,
 * dropout) and a Llama-shaped one (rope with Llama 3's scaling, RMSNorm,
 * grouped-query attention, SwiGLU, no position table), each with fresh
 * weights and random token ids in 3 sequences:
 *   - every position's logits, fed as a prompt (all), then one position at
 *     a time (the last only), then two at a time, equal the window's at
 *     that position: within 2e-6 of the logits' scale on FP32 storage
 *     (the products may sum a row in another order), within bf16's
 *     rounding on bf16 storage;
 *   - the same on 2 stages of 2 CPU devices, and with
 *     pipeline.copy_precision bf16 (what crosses a stage rounded, as the
 *     window's evaluation rounds it: within bf16's rounding);
 *   - rewinding to a length and feeding the rest again gives those
 *     positions' logits again;
 *   - a model whose last layer pops a skip, and models whose last layer
 *     mixes or knows positions (attention, rope, an embedding alone): a
 *     feed of the last positions only gives each sequence's last, equal to
 *     the window's and to the same feed's with all, and leaves every row
 *     fed in the cache (the positions fed after it equal the window's);
 *   - a feed past T, a feed after a step, a model with a convolution, bad
 *     ids: refused with what to do.  (Every layer type that takes (N, T,
 *     C) is one the decoder runs, so its refusal of other layers by name
 *     is not reachable from a config.)
 * The CPU kernel's own bits (attn_cached against attn_fwd, exactly) are
 * test_attention's; the tokens gpipe-sample draws with and without the
 * cache are test_sample.py's.
 */
#include "gpipe.h"
#include "test.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

#define T 16
#define S 3

static const char *k_gpt =
    "model:\n"
    "  input: [16]\n"
    "  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab: 50, dim: 32, positions: 24, stash: x}\n"
    "    - layer_norm\n"
    "    - linear: {out: 96}\n"
    "    - attention: {heads: 2}\n"
    "    - linear: {out: 32}\n"
    "    - dropout: {p: 0.1}\n"
    "    - add: {pop: x, stash: x}\n"
    "    - layer_norm\n"
    "    - linear: {out: 128}\n"
    "    - gelu\n"
    "    - linear: {out: 32}\n"
    "    - add: {pop: x}\n"
    "    - layer_norm\n"
    "    - linear: {out: 50, bias: false}\n"
    "data: {dataset: synthetic}\n"
    "train: {batch_size: 4, seed: 3}\n";

static const char *k_llama =
    "model:\n"
    "  input: [16]\n"
    "  llama: {layers: 2, heads: 4, kv_heads: 2, width: 32, intermediate: 48, vocab: 50,\n"
    "          positions: 16, rope_theta: 500000, rope_scaling: {factor: 8,\n"
    "          low_freq_factor: 1, high_freq_factor: 4, original_positions: 8},\n"
    "          tie: false}\n"
    "  loss: cross_entropy\n"
    "data: {dataset: synthetic}\n"
    "train: {batch_size: 4, seed: 3}\n";

/* A last layer that pops a skip: it runs on every position fed (its skip
 * input holds them all), and a feed of the last positions only must still
 * give each sequence's last */
static const char *k_pop_last =
    "model:\n"
    "  input: [16]\n"
    "  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab: 50, dim: 24, positions: 16, stash: x}\n"
    "    - layer_norm\n"
    "    - linear: {out: 72}\n"
    "    - attention: {heads: 2}\n"
    "    - linear: {out: 24}\n"
    "    - add: {pop: x}\n"
    "data: {dataset: synthetic}\n"
    "train: {batch_size: 4, seed: 3}\n";

/* Last layers that mix positions or know them (attention over the cache,
 * rope's angles, the embedding's position rows): a feed of the last
 * positions only must run them on every position fed, so that each row
 * sits at its own position and every row's keys and values reach the
 * cache, and give each sequence's last row then */
static const char *k_attn_last =
    "model:\n"
    "  input: [16]\n"
    "  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab: 50, dim: 24, positions: 16}\n"
    "    - linear: {out: 72}\n"
    "    - attention: {heads: 2}\n"
    "data: {dataset: synthetic}\n"
    "train: {batch_size: 4, seed: 3}\n";

static const char *k_rope_last =
    "model:\n"
    "  input: [16]\n"
    "  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab: 50, dim: 24, positions: 0}\n"
    "    - linear: {out: 72}\n"
    "    - rope: {heads: 2}\n"
    "data: {dataset: synthetic}\n"
    "train: {batch_size: 4, seed: 3}\n";

static const char *k_embedding_only =
    "model:\n"
    "  input: [16]\n"
    "  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab: 50, dim: 50, positions: 16}\n"
    "data: {dataset: synthetic}\n"
    "train: {batch_size: 4, seed: 3}\n";

static gp_run *load(const char *name, const char *yaml, const char *const *sets, int n)
{
    char path[400];
    snprintf(path, sizeof path, "%s/%s.yaml", tmpdir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return NULL;
    fputs(yaml, f);
    fclose(f);
    gp_run *run = NULL;
    CHECK_OK(gp_run_load(path, sets, n, &run));
    if (run) CHECK_OK(gp_run_prepare(run));
    return run;
}

/* The largest |a - b| over n values, and the largest |b|. */
static double max_diff(const float *a, const float *b, int64_t n, double *scale)
{
    double m = 0;
    *scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= m)) m = e; /* a NaN counts as the largest */
        if (fabs(b[i]) > *scale) *scale = fabs(b[i]);
    }
    return m;
}

/* Logits of positions p0 .. p0 + n - 1 of every sequence, as fed (all:
 * (S, n, V)) or the last (S, V), against the window's ref (S, T, V). */
static void check_rows(const char *what, const float *got, const float *ref, int64_t V,
                       int64_t p0, int64_t n, bool all, double tol)
{
    double worst = 0, scale = 0;
    for (int64_t q = 0; q < S; q++)
        for (int64_t i = all ? 0 : n - 1; i < n; i++) {
            const float *g = got + (all ? (q * n + i) * V : q * V);
            double sc, e = max_diff(g, ref + (q * T + p0 + i) * V, V, &sc);
            if (!(e <= worst)) worst = e;
            if (sc > scale) scale = sc;
        }
    CHECK_MSG(worst <= tol * scale && scale > 0,
              "%s: positions %lld..%lld: the cache's logits %g from the window's (scale %g, "
              "tolerance %g)", what, (long long)p0, (long long)(p0 + n - 1), worst, scale,
              tol * scale);
}

/* A sampler's feeds: a prompt of 5 and then 4 more, the last position
 * only, then the rest, all of them, on a cache whose rows hold other
 * tokens' keys and values.  Each last row equals the window's and that of
 * the same feed with all (on a second decoder): a last layer that mixes or
 * knows positions ran on every row fed, each at its own position.  The
 * rest equal the window's: every row of the last-only feeds reached the
 * cache (an attention layer's row left unwritten, or written at another
 * position, would change them). */
static void last_only(const char *what, gp_run *run, const float *ids, const float *ref,
                      int64_t V, double tol)
{
    float *got = malloc((size_t)(S * T * V) * sizeof *got);
    float *every = malloc((size_t)(S * T * V) * sizeof *every), feed[S * T];
    gp_decoder *d = NULL, *e = NULL;
    CHECK(got && every);
    if (got && every) CHECK_OK(gp_decoder_open(run, S, &d));
    if (d) CHECK_OK(gp_decoder_open(run, S, &e));
    if (!d || !e) goto out;
    for (int i = 0; i < S * T; i++) feed[i] = (float)(((int)ids[i] + 17) % 50);
    CHECK_OK(gp_decoder_feed(d, feed, T, 1, got));
    CHECK_OK(gp_decoder_rewind(d, 0));
    int64_t plan[] = {5, 4, 7};
    int64_t p = 0;
    for (size_t k = 0; k < sizeof plan / sizeof *plan; k++) {
        int64_t n = plan[k];
        bool all = k == 2;
        for (int64_t q = 0; q < S; q++)
            for (int64_t i = 0; i < n; i++) feed[q * n + i] = ids[q * T + p + i];
        CHECK_OK(gp_decoder_feed(d, feed, n, all, got));
        check_rows(what, got, ref, V, p, n, all, tol);
        CHECK_OK(gp_decoder_feed(e, feed, n, 1, every));
        if (!all) {
            double worst = 0, scale = 0;
            for (int64_t q = 0; q < S; q++) {
                double sc, x = max_diff(got + q * V, every + (q * n + n - 1) * V, V, &sc);
                if (!(x <= worst)) worst = x;
                if (sc > scale) scale = sc;
            }
            CHECK_MSG(worst <= tol * scale && scale > 0, "%s: positions %lld..%lld: the last "
                      "row %g from all's (scale %g)", what, (long long)p,
                      (long long)(p + n - 1), worst, scale);
        }
        p += n;
    }
    CHECK(p == T && gp_decoder_length(d) == T);
out:
    gp_decoder_free(d);
    gp_decoder_free(e);
    free(got);
    free(every);
}

/* The decoder against the window for the run's model. */
static void against_window(const char *what, gp_run *run, double tol)
{
    gp_run_info info;
    CHECK_OK(gp_run_describe(run, &info));
    int64_t V = info.output_numel / T;
    float ids[S * T], *ref = malloc((size_t)(S * T * V) * sizeof *ref);
    float *got = malloc((size_t)(S * T * V) * sizeof *got), feed[S * T];
    CHECK(ref && got);
    if (!ref || !got) goto out;
    uint64_t z = 12345;
    for (int i = 0; i < S * T; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (float)((z >> 33) % 50);
    }
    CHECK_OK(gp_run_predict(run, ids, S, ref));
    gp_decoder *d = NULL;
    CHECK_OK(gp_decoder_open(run, S, &d));
    if (!d) goto out;
    CHECK(gp_decoder_capacity(d) == T && gp_decoder_length(d) == 0);
    /* a prompt of 5, all its positions; then one at a time; then pairs */
    int64_t plan[] = {5, 1, 1, 1, 1, 1, 2, 2, 2};
    int64_t p = 0;
    for (size_t k = 0; k < sizeof plan / sizeof *plan; k++) {
        int64_t n = plan[k];
        bool all = k == 0 || n == 2;
        for (int64_t q = 0; q < S; q++)
            for (int64_t i = 0; i < n; i++) feed[q * n + i] = ids[q * T + p + i];
        CHECK_OK(gp_decoder_feed(d, feed, n, all, got));
        check_rows(what, got, ref, V, p, n, all, tol);
        p += n;
    }
    CHECK(p == T && gp_decoder_length(d) == T);
    /* full: the next is refused, and the cache is as it was */
    CHECK_ERR(gp_decoder_feed(d, feed, 1, 0, got), GP_ERR_INVALID, "rewind");
    CHECK(gp_decoder_length(d) == T);
    /* back to 9 and the rest again, in one feed of 7 (the last only) */
    CHECK_OK(gp_decoder_rewind(d, 9));
    for (int64_t q = 0; q < S; q++)
        for (int64_t i = 0; i < 7; i++) feed[q * 7 + i] = ids[q * T + 9 + i];
    CHECK_OK(gp_decoder_feed(d, feed, 7, 0, got));
    check_rows(what, got, ref, V, 9, 7, false, tol);
    CHECK_ERR(gp_decoder_rewind(d, T + 1), GP_ERR_INVALID, "not in [0, 16]");
    /* a bad id, refused before any work */
    feed[0] = 2.5f;
    CHECK_OK(gp_decoder_rewind(d, 0));
    CHECK_ERR(gp_decoder_feed(d, feed, 1, 0, got), GP_ERR_DATA, "not a token id");
    /* each missing argument named, not a list of what the call needs */
    CHECK_ERR(gp_decoder_feed(NULL, feed, 1, 0, got), GP_ERR_INVALID, "the decoder is NULL");
    CHECK_ERR(gp_decoder_feed(d, NULL, 1, 0, got), GP_ERR_INVALID, "ids is NULL");
    CHECK_ERR(gp_decoder_feed(d, feed, 1, 0, NULL), GP_ERR_INVALID, "out is NULL");
    CHECK_ERR(gp_decoder_feed(d, feed, 0, 0, got), GP_ERR_INVALID,
              "at least one id per sequence (n = 0)");
    CHECK(gp_decoder_length(d) == 0);
    gp_decoder_free(d);
    last_only(what, run, ids, ref, V, tol);
out:
    free(ref);
    free(got);
}

static void test_models(void)
{
    static const char *two[] = {"pipeline.devices=[cpu:0, cpu:1]", "pipeline.chunks=2",
                                "pipeline.balance=[7, 7]", "pipeline.copy_precision=fp32"};
    static const char *two_b16[] = {"pipeline.devices=[cpu:0, cpu:1]", "pipeline.chunks=2",
                                    "pipeline.balance=[7, 7]", "pipeline.copy_precision=bf16"};
    static const char *two_llama[] = {"pipeline.devices=[cpu:0, cpu:1]", "pipeline.chunks=2",
                                      "pipeline.balance=[11, 14]",
                                      "pipeline.copy_precision=fp32"};
    static const char *b16[] = {"train.activations=bf16"};
    /* bf16 storage, or bf16 copies: a value 1 ulp off in FP32 may round to
     * the other bf16 neighbour */
    struct {
        const char *name, *yaml;
        const char *const *sets;
        int n;
        double tol;
    } runs[] = {
        {"gpt", k_gpt, NULL, 0, 2e-6},
        {"gpt_2stages", k_gpt, two, 4, 2e-6},
        {"gpt_2stages_bf16_copies", k_gpt, two_b16, 4, 2e-2},
        {"gpt_bf16", k_gpt, b16, 1, 2e-2},
        {"llama", k_llama, NULL, 0, 2e-6},
        {"llama_2stages", k_llama, two_llama, 4, 2e-6},
        {"llama_bf16", k_llama, b16, 1, 2e-2},
        {"pop_last", k_pop_last, NULL, 0, 2e-6},
        {"attention_last", k_attn_last, NULL, 0, 2e-6},
        {"rope_last", k_rope_last, NULL, 0, 2e-6},
        {"embedding_only", k_embedding_only, NULL, 0, 2e-6},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        gp_run *run = load(runs[i].name, runs[i].yaml, runs[i].sets, runs[i].n);
        if (!run) continue;
        against_window(runs[i].name, run, runs[i].tol);
        gp_run_free(run);
    }
}

/* A step changes the weights under a filled cache: refused until a rewind
 * to 0; a restore is refused while a decoder is open; a model with a
 * convolution has no cache. */
static void test_refusals(void)
{
    gp_run *run = load("step", k_gpt, NULL, 0);
    if (!run) return;
    gp_decoder *d = NULL;
    float ids[S * 2] = {1, 2, 3, 4, 5, 6}, y[S * T], out[S * 50];
    for (int i = 0; i < S * T; i++) y[i] = (float)(i % 50);
    CHECK_OK(gp_decoder_open(run, S, &d));
    if (d) {
        CHECK_OK(gp_decoder_feed(d, ids, 2, 0, out));
        float x[S * T];
        for (int i = 0; i < S * T; i++) x[i] = (float)((i * 7) % 50);
        gp_metrics m;
        CHECK_OK(gp_run_step(run, x, y, S, 0, &m));
        CHECK_ERR(gp_decoder_feed(d, ids, 1, 0, out), GP_ERR_INVALID, "took 1 step");
        CHECK_OK(gp_decoder_rewind(d, 0));
        CHECK_OK(gp_decoder_feed(d, ids, 2, 0, out));
        /* a restore puts other weights under the cache, and one of the same
         * step would pass the feed's step check: refused while it is open */
        char snap[400];
        snprintf(snap, sizeof snap, "%s/step1.safetensors", tmpdir);
        CHECK_OK(gp_run_save(run, snap));
        CHECK_ERR(gp_run_restore(run, snap), GP_ERR_INVALID, "1 decoder of this run is open");
        gp_decoder_free(d);
        CHECK_OK(gp_run_restore(run, snap));
    }
    CHECK_ERR(gp_decoder_open(run, 0, &d), GP_ERR_INVALID, "at least 1");
    gp_run_free(run);
    /* training replaces the run's model and devices, which hold the
     * caches: refused while a decoder is open (a feed after it read freed
     * memory), and trains once they are freed */
    static const char *one_step[] = {"train.steps=1"};
    run = load("train", k_gpt, one_step, 1);
    if (!run) return;
    gp_decoder *d2 = NULL;
    CHECK_OK(gp_decoder_open(run, S, &d));
    CHECK_OK(gp_decoder_open(run, 1, &d2));
    gp_metrics m;
    CHECK_ERR(gp_run_train(run, NULL, &m), GP_ERR_INVALID, "2 decoders of this run are open");
    gp_decoder_free(d2);
    CHECK_ERR(gp_run_train(run, NULL, &m), GP_ERR_INVALID, "1 decoder of this run is open");
    if (d) CHECK_OK(gp_decoder_feed(d, ids, 2, 0, out)); /* refused, nothing changed */
    gp_decoder_free(d);
    CHECK_OK(gp_run_train(run, NULL, &m));
    CHECK_MSG(m.step == 1, "trained %lld steps", (long long)m.step);
    d = NULL;
    CHECK_OK(gp_decoder_open(run, S, &d));
    if (d) CHECK_OK(gp_decoder_feed(d, ids, 2, 0, out));
    gp_decoder_free(d);
    gp_run_free(run);
    static const char *conv =
        "model:\n"
        "  input: [1, 4, 4]\n"
        "  layers: [{conv2d: {out: 4, kernel: 1}}, flatten, {linear: {out: 3}}]\n"
        "data: {dataset: synthetic, synthetic: {train: 8, test: 8, classes: 3, "
        "shape: [1, 4, 4]}}\n"
        "train: {batch_size: 4}\n";
    run = load("conv", conv, NULL, 0);
    if (!run) return;
    CHECK_ERR(gp_decoder_open(run, 1, &d), GP_ERR_UNSUPPORTED, "takes a language model");
    gp_run_free(run);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gpipe-test-decode-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    gp_set_log_level("warn");
    test_models();
    test_refusals();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return gpt_finish("test_decode");
}
