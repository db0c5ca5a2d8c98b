/*
 * test_gpt.c — the `model.gpt` family (src/config/config_family.c): GPT-2
 * as gpipe's layers.
 *
 *   - init: normal on linear and conv2d layers: normal(0, std) weights
 *     (sample mean and deviation), zero biases;
 *   - the expansion: layer count, types, Hugging Face's module names,
 *     the residual skips (each add pops the block's input or middle and
 *     stashes the next), GPT-2's init (normal 0.02, the residual
 *     projections 0.02 / sqrt(2 L), biases 0), the LM head's tie and its
 *     missing bias, dropout layers only where dropout > 0;
 *   - the parameter names of the built model (shapes only) are exactly the
 *     keys of Hugging Face's GPT2LMHeadModel state_dict, in its order;
 *   - the parameter count: configs/gpt2.yaml is 124,439,808 (the tied
 *     weight once), and GPT-2's sizes by --set against the closed form
 *     V C + P C + L (12 C^2 + 13 C) + 2 C (+ V C untied) written here;
 *   - `gpipe-train --dry-run` prints that count, the FLOPs per token as
 *     6N + 12 L H Q T computed here, and the activations per sequence;
 *   - bad options, each named by file:line:column (or its --set) with
 *     what to change;
 *   - vocab_pad (llm.c's Vp): wte.weight and lm_head get Vp rows whose
 *     first V start as the unpadded model's and the rest at 0; 20 steps'
 *     losses equal the unpadded model's (tied and untied, AdamW and SGD
 *     with momentum, both with weight decay; 1 device and 3 stages) and
 *     the padded rows stay exactly 0; ids past V are errors as without
 *     padding; a snapshot holds Vp rows and resumes bit for bit; Hugging
 *     Face, llm.c and gpipe exports of a padded model load into the unpadded one
 *     and the other way round, and a larger vocabulary's file whose rows
 *     number the padded model's is refused; evaluation and
 *     gp_run_describe read V; gpipe-sample never draws a padding id; the
 *     parameter count is the unpadded one, the padding said apart;
 *   - launches: a step's launches (gp_dev_launches) on 1 stage pinned to a
 *     closed form in blocks and micro-batches, 2 stages' to it plus 4,
 *     GPT-2 124M's within 1.5x llm.c's (launch_counts, below);
 *   - no FP32 activations in a bf16 step: the storage adapter makes no
 *     FP32 copy under precision bf16 (1 and 2 stages; where the processor
 *     has bf16 instructions), and --dry-run says so for configs/gpt2.yaml.
 */
#include "backend/cpu/cpu_impl.h" /* gp_cpu_isa_has */
#include "config/config.h"
#include "train/snapshot.h"
#include "train/train.h"
#include "test_util.h"

#include <math.h>
#include <unistd.h>

static gp_status gpt_cfg(const char *opts, const char *input, const char *const *sets, int n,
                         gp_config *c)
{
    char text[1024];
    snprintf(text, sizeof text,
             "model:\n"
             "  input: %s\n"
             "  gpt: %s\n"
             "data: {dataset: synthetic}\n"
             "train: {batch_size: 2, seed: 1}\n",
             input, opts);
    gp_config own;
    gp_status s = gp_config_parse("g.yaml", text, strlen(text), sets, n, c ? c : &own);
    if (!c && s == GP_OK) gp_config_free(&own); /* a check of the message alone */
    return s;
}

/* GPT-2's parameters from its sizes (Hugging Face's GPT2LMHeadModel). */
static int64_t gpt2_params(int64_t L, int64_t C, int64_t V, int64_t P, bool tie)
{
    int64_t block = 2 * 2 * C                  /* ln_1, ln_2 */
                    + C * 3 * C + 3 * C        /* attn.c_attn */
                    + C * C + C                /* attn.c_proj */
                    + C * 4 * C + 4 * C        /* mlp.c_fc */
                    + 4 * C * C + C;           /* mlp.c_proj */
    return V * C + P * C + L * block + 2 * C + (tie ? 0 : V * C);
}

static const gp_layer_spec *find(const gp_config *c, const char *name)
{
    for (int k = 0; k < c->model.n_layers; k++)
        if (!strcmp(c->model.layers[k].name, name)) return &c->model.layers[k];
    return NULL;
}

static void expansion(void)
{
    gp_config c;
    gp_status s = gpt_cfg("{layers: 3, heads: 2, width: 16, positions: 12, vocab: 40}", "[8]",
                          NULL, 0, &c);
    CHECK_OK(s);
    if (s != GP_OK) return;
    /* the embedding, 10 layers a block, ln_f, lm_head */
    CHECK_MSG(c.model.n_layers == 1 + 3 * 10 + 2, "%d layers", c.model.n_layers);
    CHECK(!strcmp(c.model.family, "gpt") && !strcmp(c.model.family_at, "g.yaml:3:3"));
    static const struct {
        const char *name;
        gp_layer_type type;
        const char *stash, *pop;
    } block1[] = {
        {"transformer.h.1.ln_1", GP_LAYER_LAYER_NORM, "", ""},
        {"transformer.h.1.attn.c_attn", GP_LAYER_LINEAR, "", ""},
        {"transformer.h.1.attn", GP_LAYER_ATTENTION, "", ""},
        {"transformer.h.1.attn.c_proj", GP_LAYER_LINEAR, "", ""},
        {"transformer.h.1.attn.residual", GP_LAYER_ADD, "h1.mid", "h1.in"},
        {"transformer.h.1.ln_2", GP_LAYER_LAYER_NORM, "", ""},
        {"transformer.h.1.mlp.c_fc", GP_LAYER_LINEAR, "", ""},
        {"transformer.h.1.mlp.gelu", GP_LAYER_GELU, "", ""},
        {"transformer.h.1.mlp.c_proj", GP_LAYER_LINEAR, "", ""},
        {"transformer.h.1.mlp.residual", GP_LAYER_ADD, "h2.in", "h1.mid"},
    };
    const gp_layer_spec *l = c.model.layers;
    CHECK(l[0].type == GP_LAYER_EMBEDDING && !strcmp(l[0].name, "transformer") &&
          l[0].vocab == 40 && l[0].dim == 16 && l[0].positions == 12 &&
          !strcmp(l[0].stash, "h0.in"));
    for (int q = 0; q < (int)(sizeof block1 / sizeof block1[0]); q++) {
        const gp_layer_spec *b = &l[11 + q];
        CHECK_MSG(b->type == block1[q].type && !strcmp(b->name, block1[q].name) &&
                      !strcmp(b->stash, block1[q].stash) &&
                      (block1[q].pop[0] ? b->n_pop == 1 && !strcmp(b->pop[0], block1[q].pop)
                                        : b->n_pop == 0),
                  "layer %d is %s %s (stash '%s', %d pops), want %s %s", 11 + q,
                  gp_layer_type_name(b->type), b->name, b->stash, b->n_pop,
                  gp_layer_type_name(block1[q].type), block1[q].name);
    }
    /* the last block's second add feeds ln_f only */
    const gp_layer_spec *last = find(&c, "transformer.h.2.mlp.residual");
    CHECK(last && !last->stash[0] && !strcmp(last->pop[0], "h2.mid"));
    CHECK(l[31].type == GP_LAYER_LAYER_NORM && !strcmp(l[31].name, "transformer.ln_f"));
    const gp_layer_spec *head = &l[32];
    CHECK(head->type == GP_LAYER_LINEAR && !strcmp(head->name, "lm_head") && head->out == 40 &&
          !head->bias && !strcmp(head->tie, "transformer"));
    /* sizes and init: GPT-2's (llm.c's) */
    const gp_layer_spec *qkv = find(&c, "transformer.h.0.attn.c_attn"),
                        *fc = find(&c, "transformer.h.2.mlp.c_fc"),
                        *ap = find(&c, "transformer.h.0.attn.c_proj"),
                        *mp = find(&c, "transformer.h.2.mlp.c_proj"),
                        *at = find(&c, "transformer.h.1.attn");
    CHECK(qkv && qkv->out == 48 && fc && fc->out == 64 && ap && ap->out == 16 && mp &&
          mp->out == 16 && at && at->heads == 2);
    if (qkv && fc && ap && mp) {
        CHECK(qkv->init == GP_INIT_NORMAL && fc->init == GP_INIT_NORMAL && qkv->bias);
        CHECK_NEAR(qkv->std, 0.02, 1e-9, 0);
        CHECK_NEAR(ap->std, 0.02 / sqrt(6.0), 1e-8, 0);
        CHECK_NEAR(mp->std, 0.02 / sqrt(6.0), 1e-8, 0);
        CHECK(ap->init == GP_INIT_NORMAL && mp->init == GP_INIT_NORMAL);
    }
    CHECK(head->init == GP_INIT_NORMAL);
    CHECK_NEAR(head->std, 0.02, 1e-9, 0);
    for (int k = 0; k < c.model.n_layers; k++) CHECK(l[k].type != GP_LAYER_DROPOUT);
    gp_config_free(&c);

    /* dropout > 0: after the embedding and each residual projection, and
     * the first skip moves to the dropout after the embedding */
    const char *sets[] = {"model.gpt.dropout=0.1", "model.gpt.tie=false"};
    s = gpt_cfg("{layers: 2, heads: 2, width: 16, positions: 8, vocab: 40}", "[8]", sets, 2,
                &c);
    CHECK_OK(s);
    if (s != GP_OK) return;
    CHECK_MSG(c.model.n_layers == 2 + 2 * 12 + 2, "%d layers with dropout", c.model.n_layers);
    const gp_layer_spec *drop = find(&c, "transformer.drop"),
                        *rd = find(&c, "transformer.h.1.attn.resid_dropout"),
                        *md = find(&c, "transformer.h.0.mlp.dropout");
    CHECK(drop && drop->type == GP_LAYER_DROPOUT && !strcmp(drop->stash, "h0.in") &&
          !c.model.layers[0].stash[0]);
    CHECK(rd && rd->type == GP_LAYER_DROPOUT && rd[1].type == GP_LAYER_ADD);
    CHECK(md && md->type == GP_LAYER_DROPOUT && md[-1].type == GP_LAYER_LINEAR);
    if (drop && rd && md) CHECK_NEAR(md->p, 0.1, 1e-7, 0);
    CHECK(!c.model.layers[c.model.n_layers - 1].tie[0]);
    gp_config_free(&c);
}

/* The parameters, shapes only: their names are Hugging Face's state_dict
 * keys, in its order, and the count is GPT-2's. */
static void names_and_counts(void)
{
    gp_config c;
    gp_status s = gpt_cfg("{layers: 2, heads: 2, width: 16, positions: 8, vocab: 40}", "[8]",
                          NULL, 0, &c);
    CHECK_OK(s);
    if (s != GP_OK) return;
    static const char *const per_block[] = {
        "ln_1.weight",      "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",      "ln_2.bias",
        "mlp.c_fc.weight",  "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    char want[40][64];
    int nw = 0;
    snprintf(want[nw++], 64, "transformer.wte.weight");
    snprintf(want[nw++], 64, "transformer.wpe.weight");
    for (int i = 0; i < 2; i++)
        for (int q = 0; q < 12; q++) snprintf(want[nw++], 64, "transformer.h.%d.%s", i, per_block[q]);
    snprintf(want[nw++], 64, "transformer.ln_f.weight");
    snprintf(want[nw++], 64, "transformer.ln_f.bias");
    snprintf(want[nw++], 64, "lm_head.weight");
    int balance[1] = {c.model.n_layers};
    gp_model m = {0};
    s = gp_model_build_meta(&c, balance, &m);
    CHECK_OK(s);
    if (s == GP_OK) {
        int got = 0;
        for (int k = 0; k < m.n_layers; k++)
            for (int p = 0; p < m.layers[k].n_params; p++, got++) {
                char name[160];
                snprintf(name, sizeof name, "%s.%s", m.layers[k].spec.name,
                         m.layers[k].params[p].name);
                CHECK_MSG(got < nw && !strcmp(name, want[got]), "parameter %d is %s, want %s",
                          got, name, got < nw ? want[got] : "none");
            }
        CHECK_MSG(got == nw, "%d parameters named, want %d", got, nw);
        gp_model_free(&m);
    }
    int64_t n = -1;
    CHECK_OK(gp_model_count_params(&c, &n));
    CHECK_MSG(n == gpt2_params(2, 16, 40, 8, true), "%lld parameters", (long long)n);
    gp_config_free(&c);

    /* configs/gpt2.yaml: GPT-2 124M, 124,439,808 with the head tied */
    static const char *const base = GPIPE_SOURCE_DIR "/configs/gpt2.yaml";
    s = gp_config_load(base, NULL, 0, &c);
    CHECK_OK(s);
    if (s == GP_OK) {
        CHECK_OK(gp_model_count_params(&c, &n));
        CHECK_MSG(n == 124439808, "configs/gpt2.yaml has %lld parameters", (long long)n);
        CHECK(n == gpt2_params(12, 768, 50257, 1024, true));
        gp_config_free(&c);
    }
    /* the other sizes, as configs/gpt2.yaml's comment gives them */
    static const struct {
        const char *sets[3];
        int64_t L, C;
    } sizes[] = {
        {{"model.gpt.layers=24", "model.gpt.heads=16", "model.gpt.width=1024"}, 24, 1024},
        {{"model.gpt.layers=36", "model.gpt.heads=20", "model.gpt.width=1280"}, 36, 1280},
        {{"model.gpt.layers=48", "model.gpt.heads=25", "model.gpt.width=1600"}, 48, 1600},
    };
    for (int q = 0; q < 3; q++) {
        s = gp_config_load(base, sizes[q].sets, 3, &c);
        CHECK_OK(s);
        if (s != GP_OK) continue;
        CHECK_OK(gp_model_count_params(&c, &n));
        CHECK_MSG(n == gpt2_params(sizes[q].L, sizes[q].C, 50257, 1024, true),
                  "%s: %lld parameters", sizes[q].sets[0], (long long)n);
        gp_config_free(&c);
    }
    /* untied: the head's own weight counts */
    const char *untie[] = {"model.gpt.tie=false"};
    s = gp_config_load(base, untie, 1, &c);
    CHECK_OK(s);
    if (s == GP_OK) {
        CHECK_OK(gp_model_count_params(&c, &n));
        CHECK(n == 124439808 + (int64_t)50257 * 768);
        gp_config_free(&c);
    }
}

/* --dry-run's language-model line for configs/gpt2.yaml, unpadded (its
 * vocab_pad: 128 set back to 1; pad_dry_run has it padded). */
static void dry_run(void)
{
    char bin[600], cmd[1400], out[1 << 16];
    gpt_binary_path(bin, sizeof bin, "gpipe-train");
    snprintf(cmd, sizeof cmd, "'%s' '%s/configs/gpt2.yaml' --dry-run --set model.gpt.vocab_pad=1",
             bin, GPIPE_SOURCE_DIR);
    int rc = gpt_run_cmd(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "--dry-run exited %d: %s", rc, out);
    /* 6N + 12 L H Q T: N = 124,439,808, L = 12, H Q = 768, T = 1024 */
    double flops = 6.0 * 124439808.0 + 12.0 * 12 * 768 * 1024;
    char want[160];
    snprintf(want, sizeof want, "language model: 124439808 parameters (a tied weight counted "
             "once); %.1f MFLOP per token to train", flops / 1e6);
    CHECK_MSG(strstr(out, want) != NULL, "no \"%s\" in:\n%s", want, out);
    CHECK(strstr(out, "of activations per sequence of 1024 tokens") != NULL);
    CHECK(strstr(out, "total: 124439808 parameters (") != NULL);
    CHECK(strstr(out, "padded") == NULL);
    /* the head's row shows no weight of its own, and its tie */
    CHECK(strstr(out, "{init: normal, std: 0.02, tie: transformer}") != NULL);
    /* under precision bf16 no layer of GPT-2 runs on FP32 copies (issue 64,
     * item 1); a processor without bf16 instructions plans it as one with
     * them, and says so (issue 76: it crashed there) */
    snprintf(cmd, sizeof cmd, "'%s' '%s/configs/gpt2.yaml' --dry-run --set train.precision=bf16",
             bin, GPIPE_SOURCE_DIR);
    rc = gpt_run_cmd(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "--dry-run in bf16 exited %d: %s", rc, out);
    if (!gp_cpu_isa_has(dnnl_cpu_isa_avx512_core_bf16)) {
        CHECK_MSG(strstr(out, "cannot run this config on this machine (device cpu:0: precision "
                              "bf16 needs a processor with bf16 instructions") &&
                      strstr(out, "the plan below is for a processor that can"),
                  "no word on the processor in:\n%s", out);
        printf("dry_run: no bf16 instructions here: planned as a processor with them\n");
    }
    CHECK_MSG(strstr(out, "bf16 activations: no FP32 activation bytes, every layer reads and "
                          "writes bf16 with its own kernels\n"),
              "GPT-2 in bf16 has FP32 activations:\n%s", out);
    /* --gpu: the roofline floor (roofline.c), from the shapes on any
     * machine: one micro-batch's launches counted as it counts them (the
     * embedding 2, no input gradient; a block's 4 linear layers 3 each, its
     * 2 norms' backward 2 each, attention 2, each add with the norm after it
     * 1 (its backward none), GELU none (in the products' epilogues); block
     * 0's first norm's forward 1; the final norm's backward 2 (its forward
     * the last add's); the tied head 3, its weight's gradient too; the
     * update 1), the step's FLOPs at least the summary's forward and
     * backward (the tied head's backward-weights product, a tenth of them,
     * was left out), the step's time at least its FLOPs over the peak and
     * its bytes over the bandwidth */
    snprintf(cmd, sizeof cmd, "'%s' '%s/configs/gpt2.yaml' --dry-run --gpu h100 --set "
             "train.precision=bf16 --set pipeline.chunks=1", bin, GPIPE_SOURCE_DIR);
    rc = gpt_run_cmd(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "--dry-run --gpu exited %d: %s", rc, out);
    CHECK(strstr(out, "roofline on one h100 (989 TFLOP/s bf16, 3.35 TB/s)") != NULL);
    const char *st = strstr(out, "\n  step ");
    long long launches = 0;
    double gflop = 0, gb = 0, ms = 0;
    CHECK_MSG(st && sscanf(st, " step %lld %lf %lf %lf", &launches, &gflop, &gb, &ms) == 4,
              "no step row in:\n%s", out);
    CHECK_MSG(launches == 2 + 12 * (4 * 3 + 2 * 2 + 2 + 2) + 1 + 2 + 3 + 1,
              "roofline launches %lld", launches);
    const char *em = strstr(out, "\n  embedding "), *tot = strstr(out, " MFLOP forward per batch (");
    long long em_launches = 0;
    double step_mflop = 0;
    CHECK_MSG(em && sscanf(em, " embedding %lld", &em_launches) == 1 && em_launches == 2,
              "the embedding's launches: %lld (no input gradient)", em_launches);
    CHECK_MSG(tot && sscanf(tot, " MFLOP forward per batch (%lf", &step_mflop) == 1 &&
                  gflop >= step_mflop / 1e3 * 0.999,
              "the roofline's step %.1f GFLOP, under the summary's %.1f", gflop, step_mflop / 1e3);
    CHECK_MSG(ms >= gflop / 989e3 * 1e3 * 0.999 && ms >= gb / 3.35e3 * 1e3 * 0.999 && ms > 0,
              "the floor %.3f ms is under a bound (%.2f GFLOP, %.3f GB)", ms, gflop, gb);
    snprintf(cmd, sizeof cmd, "'%s' '%s/configs/gpt2.yaml' --dry-run --gpu a100", bin,
             GPIPE_SOURCE_DIR);
    rc = gpt_run_cmd(cmd, out, sizeof out);
    CHECK_MSG(rc != 0 && strstr(out, "--gpu a100: the roofline knows h100 and h200"),
              "an unknown --gpu: exit %d, %s", rc, out);
}

static void errors(void)
{
    CHECK_ERR(gpt_cfg("{heads: 5}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "g.yaml:3:16: model.gpt.heads = 5 does not divide model.gpt.width = 768");
    const char *sets[] = {"model.gpt.width=100"};
    CHECK_ERR(gpt_cfg("{heads: 12}", "[64]", sets, 1, NULL), GP_ERR_INVALID,
              "model.gpt.heads = 12 does not divide model.gpt.width = 100");
    CHECK_ERR(gpt_cfg("{positions: 32}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "g.yaml:3:20: model.gpt.positions = 32 is shorter than the sequence, model.input "
              "[64]; give positions >= 64");
    CHECK_ERR(gpt_cfg("{}", "[3, 8, 8]", NULL, 0, NULL), GP_ERR_INVALID,
              "g.yaml:2:10: model.gpt reads token ids: model.input must be [T]");
    CHECK_ERR(gpt_cfg("{layer: 2}", "[64]", NULL, 0, NULL), GP_ERR_INVALID, "g.yaml:3:");
    CHECK_ERR(gpt_cfg("{layer: 2}", "[64]", NULL, 0, NULL), GP_ERR_INVALID, "layers");
    CHECK_ERR(gpt_cfg("{layers: 0}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "g.yaml:3:17: model.gpt.layers must be >= 1, got 0");
    CHECK_ERR(gpt_cfg("{dropout: 1}", "[64]", NULL, 0, NULL), GP_ERR_INVALID, "g.yaml:3:18:");
    CHECK_ERR(gpt_cfg("{tie: maybe}", "[64]", NULL, 0, NULL), GP_ERR_INVALID, "g.yaml:3:14:");
    CHECK_ERR(gpt_cfg("7", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "g.yaml:3:8: model.gpt must be a map");
    const char *text = "model:\n  input: [64]\n  layers: [flatten]\n  gpt: {}\n";
    gp_config c;
    CHECK_ERR(gp_config_parse("g.yaml", text, strlen(text), NULL, 0, &c), GP_ERR_INVALID,
              "g.yaml:4:3: model has both layers and gpt");
    const char *two = "model:\n  input: [64]\n  gpt: {}\n  resnet: {}\n";
    CHECK_ERR(gp_config_parse("g.yaml", two, strlen(two), NULL, 0, &c), GP_ERR_INVALID,
              "g.yaml:3:3: model has both resnet and gpt");
    /* a linear's init: normal and std, as GPT-2's layers have them */
    const char *lin = "model:\n  input: [8]\n  layers:\n    - linear: {out: 4, init: normal, "
                      "std: -1}\n";
    CHECK_ERR(gp_config_parse("g.yaml", lin, strlen(lin), NULL, 0, &c), GP_ERR_INVALID,
              "g.yaml:4:43: model.layers.0.std must be > 0, got -1");
}

/* init: normal on a linear layer (the family's): the weight's sample
 * mean and standard deviation those of normal(0, std), the bias 0; on
 * conv2d the same. */
static void init_normal(gp_device *dev)
{
    enum { IN = 128, OUT = 256 };
    for (int conv = 0; conv < 2; conv++) {
        gp_layer_spec sp = gp_layer_spec_default(conv ? GP_LAYER_CONV2D : GP_LAYER_LINEAR);
        sp.out = OUT;
        sp.init = GP_INIT_NORMAL;
        sp.std = 0.005f;
        if (conv) sp.kernel = gp_hw_square(1);
        gp_shape in = conv ? gp_shape_4d(2, IN, 3, 3) : gp_shape_2d(2, IN);
        gp_layer l;
        gp_status s = gp_layer_create(&sp, 0, &in, dev, 7, &l);
        CHECK_OK(s);
        if (s != GP_OK) continue;
        float *w = gpt_download(&l.params[0].value), *b = gpt_download(&l.params[1].value);
        double m = 0, v = 0, bmax = 0;
        for (int i = 0; i < IN * OUT; i++) m += w[i];
        m /= IN * OUT;
        for (int i = 0; i < IN * OUT; i++) v += (w[i] - m) * (w[i] - m);
        for (int i = 0; i < OUT; i++) bmax = fmax(bmax, fabs(b[i]));
        /* 32768 samples: the mean within 4 standard errors, the deviation
         * within 2% */
        CHECK_MSG(fabs(m) < 4 * 0.005 / sqrt(IN * OUT), "%s: mean %g", conv ? "conv" : "linear",
                  m);
        CHECK_NEAR(sqrt(v / (IN * OUT - 1)), 0.005, 0, 0.02);
        CHECK(bmax == 0.0);
        free(w);
        free(b);
        gp_layer_destroy(&l);
    }
}

/* ---- model.gpt.vocab_pad ---------------------------------------------------
 *
 * A small GPT-2 of vocabulary PV = 11 padded to a multiple of 8 (Vp = 16:
 * 5 padding rows), against the same model unpadded. */
enum { PV = 11, PVP = 16, PC = 16, PT = 6, PB = 12, PSTEPS = 20 };

/* The config: tie "true" or "false", optimizer adamw or sgd (with
 * momentum), both with weight decay, and vocab_pad given or not. */
static bool pad_cfg(bool tie, bool adam, bool pad, gp_config *c)
{
    char text[1024];
    snprintf(text, sizeof text,
             "model:\n"
             "  input: [6]\n"
             "  gpt: {layers: 2, heads: 2, width: 16, positions: 6, vocab: 11, tie: %s%s}\n"
             "data:\n"
             "  dataset: synthetic\n"
             "  synthetic: {train: 64, test: 16, classes: 11, shape: [6]}\n"
             "pipeline: {devices: [cpu:0], chunks: 3}\n"
             "train:\n"
             "  batch_size: 12\n"
             "  seed: 5\n"
             "  log_every: 0\n"
             "  optimizer: {type: %s, lr: 0.01, weight_decay: 0.1}\n",
             tie ? "true" : "false", pad ? ", vocab_pad: 8" : "",
             adam ? "adamw" : "sgd, momentum: 0.9");
    gp_status s = gp_config_parse("pad.yaml", text, strlen(text), NULL, 0, c);
    CHECK_MSG(s == GP_OK, "config: %s", gp_last_error());
    return s == GP_OK;
}

/* Token ids and next-token targets below PV (a counting pattern). */
static void pad_batch(int step, float *x, float *y)
{
    gpt_counting_tokens(300u + (unsigned)step, PB, PT, PV, x, y);
}

/* c's model on 1 device or over 3 stages (devs[0..2]). */
static gp_status pad_build(gp_config *c, gp_device **devs, int n, gp_model *m)
{
    if (n == 1) return gp_model_build(c, devs[0], m);
    int bal[GP_MAX_DEVICES];
    gpt_set_schedule(c, GP_SCHEDULE_GPIPE, n, bal);
    return gp_model_build_placed(c, devs, n, bal, m);
}

static gp_status pad_step(gp_model *m, gp_config *c, int n, int step, double lr,
                          gp_step_stats *st)
{
    float x[PB * PT], y[PB * PT];
    pad_batch(step, x, y);
    if (n == 1) return gp_model_train_step(m, c, x, y, PB, c->pipeline.chunks, lr, st);
    return gp_model_pipeline_step(m, c, x, y, PB, lr, st);
}

/* The vocabulary tensors of a GPT model: wte.weight, and an untied
 * lm_head's weight (NULL when tied). */
static gp_tensor *pad_wte(gp_model *m) { return &m->layers[0].params[0].value; }
static gp_tensor *pad_head(gp_model *m)
{
    gp_param *p = &m->layers[m->n_layers - 1].params[0];
    return p->tied ? NULL : &p->value;
}

/* Whether t's rows from `from` on are all exactly 0. */
static bool rows_zero(const gp_tensor *t, int64_t from)
{
    float *h = gpt_download(t);
    int64_t per = gp_tensor_numel(t) / t->dims[0];
    bool zero = true;
    for (int64_t i = from * per; i < gp_tensor_numel(t); i++) zero = zero && h[i] == 0.0f;
    free(h);
    return zero;
}

/* Whether a's first `rows` rows are b's first, bit for bit. */
static bool rows_same(const gp_tensor *a, const gp_tensor *b, int64_t rows)
{
    float *ha = gpt_download(a), *hb = gpt_download(b);
    bool same = a->dims[1] == b->dims[1] &&
                !memcmp(ha, hb, (size_t)(rows * a->dims[1]) * sizeof *ha);
    free(ha);
    free(hb);
    return same;
}

/* Every parameter of p (padded) equal to u's (unpadded), the vocabulary
 * tensors in their first PV rows, bit for bit. */
static bool pad_same_params(gp_model *p, gp_model *u)
{
    bool same = p->n_layers == u->n_layers;
    for (int k = 0; same && k < p->n_layers; k++)
        for (int q = 0; same && q < p->layers[k].n_params; q++) {
            gp_tensor *a = &p->layers[k].params[q].value, *b = &u->layers[k].params[q].value;
            bool vocab = (k == 0 && q == 0) || k == p->n_layers - 1;
            same = vocab ? rows_same(a, b, PV) : gpt_same_tensor(a, b);
        }
    return same;
}

/* Padded against unpadded: the same first rows at init and the padding at
 * 0, then PSTEPS steps whose losses agree to 1e-5 relative (*bitwise
 * says whether every one was equal bit for bit), the padding still
 * exactly 0. */
static void pad_parity_one(gp_device **devs, bool tie, bool adam, int n, bool *bitwise)
{
    gp_config cp, cu;
    if (!pad_cfg(tie, adam, true, &cp) || !pad_cfg(tie, adam, false, &cu)) return;
    gp_model p, u;
    gp_status s1 = pad_build(&cp, devs, n, &p), s2 = pad_build(&cu, devs, n, &u);
    CHECK_OK(s1);
    CHECK_OK(s2);
    if (s1 != GP_OK || s2 != GP_OK) return;
    const char *what = tie ? "tied" : "untied";
    const char *opt = adam ? "adamw" : "sgd";
    CHECK_MSG(pad_wte(&p)->dims[0] == PVP && pad_wte(&u)->dims[0] == PV &&
                  p.output.dims[p.output.ndim - 1] == PVP && p.classes == PV && u.classes == 0,
              "%s: wte %lld rows (want %d), logits %lld wide, classes %lld", what,
              (long long)pad_wte(&p)->dims[0], PVP,
              (long long)p.output.dims[p.output.ndim - 1], (long long)p.classes);
    CHECK_MSG(pad_same_params(&p, &u), "%s, %d stage(s): the padded model starts as the unpadded "
              "one in its first %d rows", what, n, PV);
    CHECK_MSG(rows_zero(pad_wte(&p), PV) && (tie || rows_zero(pad_head(&p), PV)),
              "%s: the padding rows start at 0", what);
    CHECK(gp_model_param_count(&p) == gp_model_param_count(&u));
    double worst = 0;
    bool ok = true;
    for (int step = 0; step < PSTEPS && ok; step++) {
        gp_step_stats a, b;
        ok = pad_step(&p, &cp, n, step, 0.01, &a) == GP_OK &&
             pad_step(&u, &cu, n, step, 0.01, &b) == GP_OK;
        CHECK_MSG(ok, "%s %s, %d stage(s), step %d: %s", what, opt, n, step, gp_last_error());
        if (!ok) break;
        worst = fmax(worst, fabs(a.loss - b.loss) / fabs(b.loss));
        *bitwise = *bitwise && a.loss == b.loss;
    }
    CHECK_MSG(ok && worst <= 1e-5, "%s %s, %d stage(s): per-step losses differ by %.3g relative "
              "(the bar: 1e-5)", what, opt, n, worst);
    CHECK_MSG(rows_zero(pad_wte(&p), PV) && (tie || rows_zero(pad_head(&p), PV)),
              "%s %s, %d stage(s): the padding rows stay exactly 0 over %d steps", what, opt, n,
              PSTEPS);
    /* the padding's gradients, the last step's, are 0 too */
    gp_param *wp = &p.layers[0].params[0];
    CHECK_MSG(rows_zero(&wp->grad, PV), "%s %s: wte's padding rows get no gradient", what, opt);
    gp_model_free(&p);
    gp_model_free(&u);
    gp_config_free(&cp);
    gp_config_free(&cu);
}

static void pad_parity(gp_device **devs)
{
    bool bitwise = true;
    int runs = 0;
    for (int tie = 0; tie < 2; tie++)
        for (int adam = 0; adam < 2; adam++)
            for (int n = 1; n <= 3; n += 2, runs++) pad_parity_one(devs, tie, adam, n, &bitwise);
    CHECK(runs == 8);
    printf("vocab_pad: %d runs of %d steps, the losses %s\n", runs, PSTEPS,
           bitwise ? "bit for bit the unpadded model's" : "within 1e-5 of the unpadded model's");
}

/* An id past V is an error with padding as without: as an input (the
 * embedding's) and as a target (the loss's), each naming V. */
static void pad_bad_ids(gp_device *dev)
{
    gp_config c;
    if (!pad_cfg(true, true, true, &c)) return;
    gp_model m;
    gp_status s = gp_model_build(&c, dev, &m);
    CHECK_OK(s);
    if (s != GP_OK) return;
    float x[PB * PT], y[PB * PT];
    pad_batch(0, x, y);
    x[7] = 12; /* below Vp = 16, past V = 11 */
    s = gp_model_train_step(&m, &c, x, y, PB, 3, 0.01, NULL);
    CHECK_MSG(s != GP_OK && strstr(gp_last_error(), "token id 12") &&
                  strstr(gp_last_error(), "[0, 11)"),
              "an input id past V: %d '%s'", (int)s, gp_last_error());
    pad_batch(0, x, y);
    y[7] = 13;
    s = gp_model_train_step(&m, &c, x, y, PB, 3, 0.01, NULL);
    CHECK_MSG(s == GP_ERR_DATA && strstr(gp_last_error(), "label 13") &&
                  strstr(gp_last_error(), "[0, 11)"),
              "a target id past V: %d '%s'", (int)s, gp_last_error());
    gp_model_free(&m);
    gp_config_free(&c);
}

/* Evaluation (gp_run_evaluate: the loss and accuracy over V) and
 * gp_run_describe (classes V of Vp logits) of a padded run against the
 * unpadded one, after the same steps. */
static void pad_evaluate(void)
{
    static const char *const yaml[2] = {
        "model:\n  input: [6]\n  gpt: {layers: 2, heads: 2, width: 16, positions: 6, "
        "vocab: 11}\npipeline: {devices: [cpu:0, cpu:1], chunks: 2}\n"
        "train: {batch_size: 12, seed: 5, optimizer: {type: adamw, lr: 0.01}}\n",
        "model:\n  input: [6]\n  gpt: {layers: 2, heads: 2, width: 16, positions: 6, "
        "vocab: 11, vocab_pad: 8}\npipeline: {devices: [cpu:0, cpu:1], chunks: 2}\n"
        "train: {batch_size: 12, seed: 5, optimizer: {type: adamw, lr: 0.01}}\n"};
    double loss[2] = {0}, acc[2] = {0};
    gp_run_info info[2] = {0};
    float x[PB * PT], y[PB * PT];
    for (int q = 0; q < 2; q++) {
        gp_run *run = NULL;
        gp_status s = gp_run_parse("pad.yaml", yaml[q], NULL, 0, &run);
        for (int step = 0; step < 3 && s == GP_OK; step++) {
            pad_batch(step, x, y);
            s = gp_run_step(run, x, y, PB, 0, NULL);
        }
        pad_batch(7, x, y);
        if (s == GP_OK) s = gp_run_evaluate(run, x, y, PB, &loss[q], &acc[q]);
        if (s == GP_OK) s = gp_run_describe(run, &info[q]);
        CHECK_MSG(s == GP_OK, "run %d: %s", q, gp_last_error());
        gp_run_free(run);
    }
    CHECK_MSG(fabs(loss[1] - loss[0]) <= 1e-5 * loss[0] && acc[1] == acc[0],
              "evaluation: padded loss %.9g accuracy %g, unpadded %.9g %g", loss[1], acc[1],
              loss[0], acc[0]);
    CHECK_MSG(info[0].classes == PV && info[1].classes == PV &&
                  info[1].output_numel == PT * PVP && info[1].parameters == info[0].parameters,
              "describe: classes %lld and %lld, output %lld", (long long)info[0].classes,
              (long long)info[1].classes, (long long)info[1].output_numel);
}

/* A snapshot of a padded model holds the Vp rows, and resuming from it
 * (into a model that started from other values) goes on bit for bit. */
static void pad_snapshot(gp_device **devs, const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/pad.snapshot", dir);
    gp_config c, c2;
    if (!pad_cfg(false, true, true, &c) || !pad_cfg(false, true, true, &c2)) return;
    c2.train.seed = 9;
    gp_model a, b;
    CHECK_OK(pad_build(&c, devs, 3, &a));
    CHECK_OK(pad_build(&c2, devs, 3, &b));
    for (int step = 0; step < 3; step++) CHECK_OK(pad_step(&a, &c, 3, step, 0.01, NULL));
    CHECK_OK(gp_snapshot_save_file(&a, &c, path));
    gp_st_file f;
    CHECK_OK(gp_st_read(path, &f));
    const gp_st_tensor *t = gp_st_find(&f, "transformer.wte.weight");
    CHECK_MSG(t && t->ndim == 2 && t->dims[0] == PVP, "the snapshot's wte has %lld rows, want %d",
              t ? (long long)t->dims[0] : -1LL, PVP);
    gp_st_free(&f);
    gp_snapshot_pos pos;
    CHECK_OK(gp_snapshot_restore(&b, &c, path, true, &pos, NULL));
    /* the same snapshot (Vp rows) as model.init_from of the unpadded
     * model: the restored model's weights, its first PV rows */
    gp_config cu;
    if (pad_cfg(false, true, false, &cu)) {
        gp_model u;
        CHECK_OK(pad_build(&cu, devs, 3, &u));
        gp_status s = gp_snapshot_init_from(&u, path);
        CHECK_MSG(s == GP_OK, "the padded snapshot into the unpadded model: %s", gp_last_error());
        CHECK_MSG(s != GP_OK || pad_same_params(&b, &u),
                  "the padded snapshot's weights went across");
        gp_model_free(&u);
        gp_config_free(&cu);
    }
    bool same = true;
    for (int step = 3; step < 6; step++) {
        gp_step_stats sa, sb;
        CHECK_OK(pad_step(&a, &c, 3, step, 0.01, &sa));
        CHECK_OK(pad_step(&b, &c, 3, step, 0.01, &sb));
        same = same && sa.loss == sb.loss;
    }
    CHECK_MSG(same && gpt_same_values(&a, &b), "the resumed padded run goes on bit for bit");
    gp_model_free(&a);
    gp_model_free(&b);
    gp_config_free(&c);
    gp_config_free(&c2);
    remove(path);
}

/* from's weights exported in fmt, loaded (model.init_from) into `to`:
 * every parameter equal in the first PV rows, `to`'s padding 0. */
static void pad_round_trip(gp_device *dev, bool tie, gp_weights_format fmt, bool from_padded,
                           const char *dir)
{
    static const char *const names[] = {"gpipe", "hf", "llmc"};
    char path[600]; /* (hf: a file, not a folder) */
    snprintf(path, sizeof path, "%s/w.%s%s", dir, names[fmt],
             fmt == GP_WEIGHTS_HF ? ".safetensors" : "");
    gp_config cf, ct;
    if (!pad_cfg(tie, true, from_padded, &cf) || !pad_cfg(tie, true, !from_padded, &ct)) return;
    ct.train.seed = 9; /* other initial values, all overwritten */
    gp_model f, t;
    CHECK_OK(gp_model_build(&cf, dev, &f));
    CHECK_OK(gp_model_build(&ct, dev, &t));
    for (int step = 0; step < 2; step++) CHECK_OK(pad_step(&f, &cf, 1, step, 0.01, NULL));
    gp_status s = gp_gpt_export(&f, &cf, path, fmt);
    CHECK_MSG(s == GP_OK, "%s export: %s", names[fmt], gp_last_error());
    if (s == GP_OK && fmt == GP_WEIGHTS_HF) { /* GPT-2's V rows, padded or not */
        gp_st_file h;
        CHECK_OK(gp_st_read(path, &h));
        const gp_st_tensor *w = gp_st_find(&h, "transformer.wte.weight");
        const gp_st_tensor *hd = gp_st_find(&h, "lm_head.weight");
        CHECK_MSG(w && w->dims[0] == PV && (tie ? !hd : hd && hd->dims[0] == PV),
                  "the hf file's wte has %lld rows, want %d", w ? (long long)w->dims[0] : -1LL,
                  PV);
        gp_st_free(&h);
    }
    if (s == GP_OK && fmt == GP_WEIGHTS_LLMC) { /* header: V 11, llm.c's Vp 128 */
        size_t len = 0;
        uint8_t *b = gpt_read_file(path, &len);
        int32_t hdr[8] = {0};
        if (b && len >= sizeof hdr) memcpy(hdr, b, sizeof hdr);
        CHECK_MSG(hdr[3] == PV && hdr[7] == 128, "the llm.c header says V %d, Vp %d", hdr[3],
                  hdr[7]);
        free(b);
    }
    if (s == GP_OK && fmt != GP_WEIGHTS_GPIPE) {
        /* read lazily (issue 65, 12): the converted file holds no tensor's
         * data, each is read and converted as the model takes it */
        gp_st_file g;
        bool conv = false;
        gp_wmodel tv = gp_model_weights(&t);
        CHECK_OK(gp_gpt_read(&tv, path, &g, &conv));
        bool none = conv && g.fetch && !g.image && g.n > 0;
        for (int i = 0; i < g.n && none; i++) none = !g.tensors[i].data;
        CHECK_MSG(none, "%s: the converted file holds its tensors (%d of them, image %s)",
                  names[fmt], g.n, g.image ? "held" : "none");
        gp_st_free(&g);
    }
    if (s == GP_OK) {
        s = gp_snapshot_init_from(&t, path);
        CHECK_MSG(s == GP_OK, "%s, %s: the %s model's export into the %s model: %s", names[fmt],
                  tie ? "tied" : "untied", from_padded ? "padded" : "unpadded",
                  from_padded ? "unpadded" : "padded", gp_last_error());
    }
    if (s == GP_OK) {
        CHECK_MSG(from_padded ? pad_same_params(&f, &t) : pad_same_params(&t, &f),
                  "%s, %s: the weights went across", names[fmt], tie ? "tied" : "untied");
        gp_model *pm = from_padded ? &f : &t;
        CHECK_MSG(rows_zero(pad_wte(pm), PV) && (tie || rows_zero(pad_head(pm), PV)),
                  "%s: the padding rows are 0", names[fmt]);
        /* the same loss on a batch (one step at lr 0) */
        gp_step_stats a, b;
        CHECK_OK(pad_step(&f, &cf, 1, 5, 0.0, &a));
        CHECK_OK(pad_step(&t, &ct, 1, 5, 0.0, &b));
        CHECK_MSG(fabs(a.loss - b.loss) <= 1e-5 * fabs(a.loss), "%s: losses %.9g and %.9g",
                  names[fmt], a.loss, b.loss);
    }
    gp_model_free(&f);
    gp_model_free(&t);
    gp_config_free(&cf);
    gp_config_free(&ct);
    remove(path);
}

/* A file of a larger vocabulary whose rows happen to number the padded
 * model's Vp (16 tokens into 11 padded to 16) is refused, naming the
 * tensor and what to set, not taken as the padding; so is gpipe's own
 * file of a single token more (12 rows: only row 11, the first past the
 * model's, is not 0). */
static void pad_larger_vocab(gp_device *dev, const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/v16.hf.safetensors", dir);
    static const int vocab[2] = {16, 12};
    static const gp_weights_format fmt[2] = {GP_WEIGHTS_HF, GP_WEIGHTS_GPIPE};
    for (int q = 0; q < 2; q++) {
        char text[300], want[300];
        snprintf(text, sizeof text, "model:\n  input: [6]\n  gpt: {layers: 2, heads: 2, width: "
                 "16, positions: 6, vocab: %d}\ntrain: {batch_size: 12, seed: 5}\n", vocab[q]);
        gp_config c16, cp;
        CHECK_OK(gp_config_parse("v16.yaml", text, strlen(text), NULL, 0, &c16));
        if (!pad_cfg(true, true, true, &cp)) return;
        gp_model a, b;
        CHECK_OK(gp_model_build(&c16, dev, &a));
        CHECK_OK(gp_model_build(&cp, dev, &b));
        CHECK_OK(gp_gpt_export(&a, &c16, path, fmt[q]));
        snprintf(want, sizeof want, "tensor 'transformer.wte.weight' has %d rows, and those past "
                 "this model's vocabulary of 11 are not 0: the file's vocabulary is larger; set "
                 "model.gpt.vocab to the file's", vocab[q]);
        CHECK_ERR(gp_snapshot_init_from(&b, path), GP_ERR_INVALID, want);
        gp_model_free(&a);
        gp_model_free(&b);
        gp_config_free(&c16);
        gp_config_free(&cp);
        remove(path);
    }
}

/* gpipe-sample on a padded model draws among the V real tokens only: a
 * fresh model's logits are near 0, and the padding's are exactly 0, so a
 * draw over all Vp would take a padding id about a third of the time. */
static void pad_sample(gp_device *dev, const char *dir)
{
    char yaml[600], w[600], bin[600], cmd[2400], out[1 << 15];
    snprintf(yaml, sizeof yaml, "%s/pad.yaml", dir);
    snprintf(w, sizeof w, "%s/pad.safetensors", dir);
    gp_config c;
    if (!pad_cfg(true, true, true, &c)) return;
    gp_model m;
    CHECK_OK(gp_model_build(&c, dev, &m));
    CHECK_OK(gp_gpt_export(&m, &c, w, GP_WEIGHTS_GPIPE));
    gp_model_free(&m);
    gp_config_free(&c);
    const char *text = "model:\n  input: [6]\n  gpt: {layers: 2, heads: 2, width: 16, "
                       "positions: 6, vocab: 11, vocab_pad: 8}\n"
                       "pipeline: {devices: [cpu:0]}\ntrain: {batch_size: 4, seed: 5}\n";
    gpt_write_file(yaml, text, strlen(text));
    gpt_binary_path(bin, sizeof bin, "gpipe-sample");
    snprintf(cmd, sizeof cmd, "'%s' '%s' --weights '%s' --prompt-ids 1,2 --tokens 40 "
             "--samples 4 --temperature 1 --ids -q", bin, yaml, w);
    int rc = gpt_run_cmd(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "gpipe-sample exited %d: %s", rc, out);
    int ids = 0, past = 0;
    for (char *p = out; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        ids++;
        past += v >= PV;
        p = end;
    }
    CHECK_MSG(ids >= 4 * 42 && past == 0, "%d of %d sampled ids are padding (>= %d): %s", past,
              ids, PV, out);
    /* every option with a value takes --opt=VALUE too: the same draws */
    static char again[1 << 15];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --weights='%s' --prompt-ids=1,2 --tokens=40 "
             "--samples=4 --temperature=1 --ids -q", bin, yaml, w);
    rc = gpt_run_cmd(cmd, again, sizeof again);
    CHECK_MSG(rc == 0 && !strcmp(out, again), "--opt=VALUE (exit %d): %s", rc, again);
    /* weights given: no note; none: said, to stderr, before the tokens */
    snprintf(cmd, sizeof cmd, "'%s' '%s' --weights '%s' --prompt-ids 1 --tokens 2 --ids",
             bin, yaml, w);
    rc = gpt_run_cmd(cmd, again, sizeof again);
    CHECK_MSG(rc == 0 && !strstr(again, "fresh, untrained"), "exit %d: %s", rc, again);
    snprintf(cmd, sizeof cmd, "'%s' '%s' --prompt-ids 1 --tokens 2 --ids", bin, yaml);
    rc = gpt_run_cmd(cmd, again, sizeof again);
    CHECK_MSG(rc == 0 && strstr(again, "no weights given (--resume, --weights or the config's "
                                       "model.init_from): sampling from the fresh, untrained "
                                       "weights"), "exit %d: %s", rc, again);
    snprintf(cmd, sizeof cmd, "'%s' --version", bin);
    rc = gpt_run_cmd(cmd, again, sizeof again);
    CHECK_MSG(rc == 0 && !strncmp(again, "gpipe-sample ", 13), "--version: %s", again);
    remove(yaml);
    remove(w);
}

/* --dry-run of configs/gpt2.yaml as it is (vocab_pad: 128): the
 * parameters as unpadded, the padding said apart, the FLOPs at Vp. */
static void pad_dry_run(void)
{
    char bin[600], cmd[1400], out[1 << 16];
    gpt_binary_path(bin, sizeof bin, "gpipe-train");
    snprintf(cmd, sizeof cmd, "'%s' '%s/configs/gpt2.yaml' --dry-run", bin, GPIPE_SOURCE_DIR);
    int rc = gpt_run_cmd(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "--dry-run exited %d: %s", rc, out);
    double flops = 6.0 * (124439808.0 + 47.0 * 768) + 12.0 * 12 * 768 * 1024;
    char want[200];
    snprintf(want, sizeof want, "language model: 124439808 parameters (a tied weight counted "
             "once) + 36096 in 47 padded vocabulary rows; %.1f MFLOP per token", flops / 1e6);
    CHECK_MSG(strstr(out, want) != NULL, "no \"%s\" in:\n%s", want, out);
    CHECK(strstr(out, "total: 124439808 parameters + 36096 padded") != NULL);
    CHECK(strstr(out, "(1, 1024, 50304)") != NULL && strstr(out, "+ 47 padded rows") != NULL);
}

/* An llm.c header whose sizes make 2^64 + 1024 bytes, written as its 1024
 * bytes alone, is refused as damaged (the sizes' products overflowed
 * int64 and wrapped to the file's length: it was taken, and its arrays'
 * sizes drove allocations without bound). */
static void llmc_overflow(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/wrap.bin", dir);
    int32_t hdr[256] = {20240326, 5, 2147483645, 1, 330382100, 4, 1 << 30, 2147483645};
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(hdr, sizeof hdr, 1, f) == 1);
    if (f) fclose(f);
    gp_wmodel none = {0};
    gp_st_file g;
    bool conv = false;
    CHECK_ERR(gp_gpt_read(&none, path, &g, &conv), GP_ERR_DATA,
              "maxT 2147483645, BF16) makes more than the file's 1024 bytes: the file is cut "
              "short or damaged");
    gp_st_free(&g);
    remove(path);
}

static void vocab_pad(gp_device **devs)
{
    pad_parity(devs);
    pad_bad_ids(devs[0]);
    pad_evaluate();
    char dir[256];
    if (!gpt_make_tmpdir(dir, sizeof dir, "gpipe-vpad")) {
        CHECK_MSG(0, "no scratch directory");
        return;
    }
    pad_snapshot(devs, dir);
    for (int from_padded = 0; from_padded < 2; from_padded++)
        for (int tie = 0; tie < 2; tie++) {
            pad_round_trip(devs[0], tie, GP_WEIGHTS_HF, from_padded, dir);
            pad_round_trip(devs[0], tie, GP_WEIGHTS_GPIPE, from_padded, dir);
            if (tie) pad_round_trip(devs[0], tie, GP_WEIGHTS_LLMC, from_padded, dir);
        }
    pad_larger_vocab(devs[0], dir);
    pad_sample(devs[0], dir);
    llmc_overflow(dir);
    rmdir(dir);
    pad_dry_run();
    CHECK_ERR(gpt_cfg("{vocab_pad: 0}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "g.yaml:3:20: model.gpt.vocab_pad must be >= 1, got 0");
}

/* A small GPT of `opts` (batch 4, T 8) with `sets`, built over n stages of
 * devs into *m (c its config); false, with a failed check saying why,
 * where it could not be. */
static bool small_gpt(gp_device **devs, int n, const char *opts, const char *const *sets,
                      int n_sets, gp_config *c, gp_model *m)
{
    if (gpt_cfg(opts, "[8]", sets, n_sets, c) != GP_OK) {
        CHECK_MSG(false, "a small GPT's config: %s", gp_last_error());
        return false;
    }
    c->train.batch_size = 4;
    int bal[GP_MAX_DEVICES];
    gpt_set_schedule(c, GP_SCHEDULE_GPIPE, n, bal);
    gp_status s = gp_model_build_placed(c, devs, n, bal, m);
    CHECK_OK(s);
    if (s != GP_OK) gp_config_free(c);
    return s == GP_OK;
}

/* ---- launches ---------------------------------------------------------------
 * A GPT step's launches (gp_dev_launches: the compute slots called, what a
 * GPU runs as kernels) on the CPU backend in FP32, one stage (the pipeline
 * that gpipe-train drives on one device), AdamW with clipping active,
 * checkpoint never, pinned to the closed form
 *     6 + m (9 + 20 L)     (L blocks, m micro-batches)
 * so that a change that adds launches fails here and must say why:
 *   - per block and micro-batch 20: the forward's 7 (4 products with
 *     their biases, mlp.c_fc's with GELU as its epilogue
 *     (linear_gelu_fwd); attention; each residual add with the layer norm
 *     after it in one pass, 2 (add_layer_norm_fwd: the next block's ln_1
 *     or ln_f is the second add's)) and the backward's 13 (each product's
 *     data product, mlp.c_proj's with GELU's derivative as its epilogue
 *     (linear_gelu_bwd_data), and its weights half with the bias gradient
 *     in the weight product's call, 8; attention; each norm's data pass,
 *     which adds into the residual stream's gradient
 *     (layer_norm_bwd_data_add), and its weight pass, 4; the adds hand dy
 *     itself to both inputs, no copy and no sum);
 *   - per micro-batch 9: the embedding's forward and backward, block 0's
 *     first norm's forward (no add before it), the final norm's 2 backward
 *     passes (its forward is the last add's), the head's product, its data
 *     and weight products, the loss;
 *   - per step 6: one launch zeroing every gradient that is summed into
 *     (the norms', the embedding's: gp_layers_zero_stale), the clip's one
 *     sum over every gradient, AdamW over every parameter in one launch
 *     with the clip folded in, the check of what the update wrote, the
 *     step's flags.
 * 2 stages add 4 + m: the second stage's own zeroing, update, clip sum and
 * flag, and a copy per micro-batch for the add whose pop's stash is on
 * the first stage (a gradient that leaves its stage is its own tensor).
 * Until issue 64's third round the form read 6 + 4 L + m (8 + 28 L), and
 * was 4 L + m (1 + 4 L) short: the products' data halves (gemm_wb) went
 * uncounted.  llm.c's train_gpt2.cu launches 31 L + 33 a step
 * (bench/README.md, "Launches"): GPT-2 124M's 12 blocks at m = 1 are 255
 * here against 405, inside issue 64's 1.5x. */
static int64_t launch_form(int L, int m) { return 6 + m * (9 + 20 * L); }

static int64_t launches_of_step(gp_device **devs, int n, int L, int m)
{
    char layers[16], chunks[32];
    snprintf(layers, sizeof layers, "%d", L);
    snprintf(chunks, sizeof chunks, "pipeline.chunks=%d", m);
    const char *sets[] = {"train.optimizer={type: adamw}", "train.clip_grad_norm=1e-4",
                          "pipeline.checkpoint=never", chunks};
    char opts[128];
    snprintf(opts, sizeof opts, "{layers: %s, heads: 2, width: 16, positions: 8, vocab: 32}",
             layers);
    gp_config c;
    gp_model mdl;
    if (!small_gpt(devs, n, opts, sets, 4, &c, &mdl)) return -1;
    gp_status s = GP_OK;
    int64_t got = -1;
    float x[4 * 8], y[4 * 8];
    for (int step = 0; step < 2 && s == GP_OK; step++) { /* the second: nothing first-time */
        gpt_counting_tokens(40u + (unsigned)step, 4, 8, 32, x, y);
        uint64_t before = 0, after = 0;
        for (int j = 0; j < n; j++) before += gp_dev_launches(devs[j]);
        gp_step_stats st;
        s = gp_model_pipeline_step(&mdl, &c, x, y, 4, 0.01, &st);
        CHECK_MSG(s == GP_OK, "launches: L %d m %d: %s", L, m, gp_last_error());
        CHECK_MSG(s != GP_OK || st.grad_norm > 1e-4, "launches: clipping did not run");
        for (int j = 0; j < n; j++) after += gp_dev_launches(devs[j]);
        got = (int64_t)(after - before);
    }
    gp_model_free(&mdl);
    gp_config_free(&c);
    return got;
}

static void launch_counts(gp_device **devs)
{
    for (int L = 1; L <= 3; L += 2)
        for (int m = 1; m <= 2; m++) {
            int64_t got = launches_of_step(devs, 1, L, m);
            CHECK_MSG(got == launch_form(L, m), "launches of a GPT step, %d block(s), %d "
                      "micro-batch(es): %lld, the closed form says %lld (a change of the "
                      "step's launches: update the form and its account above)", L, m,
                      (long long)got, (long long)launch_form(L, m));
            if (m == 2 && devs[1]) {
                int64_t two = launches_of_step(devs, 2, L, m);
                CHECK_MSG(two == got + 4 + m, "launches over 2 stages, %d block(s): %lld, one "
                          "stage's %lld + 4 + m (the second stage's zeroing, update, clip sum "
                          "and flag; the crossing add's copy)", L, (long long)two,
                          (long long)got);
            }
        }
    CHECK(launch_form(12, 1) * 2 <= 3 * (31 * 12 + 33)); /* GPT-2 124M within 1.5x llm.c's */
    printf("launches: a GPT step launches %lld at 12 blocks, m = 1 (llm.c: %d)\n",
           (long long)launch_form(12, 1), 31 * 12 + 33);
}

/* A bf16 GPT step's FP32 activation bytes (issue 64, item 1): under
 * precision bf16 every layer has bf16 kernels, so the storage adapter
 * makes no FP32 copy (gp_dev_adapter_bytes stays put over a step, 1 and 2
 * stages); with bf16 storage alone (precision FP32) the linear layers run
 * on FP32 copies and the counter sees them.  Where the processor has no
 * bf16 instructions the first half says it did not run. */
static int64_t adapter_bytes_of_step(gp_device **devs, int n, const char *precision)
{
    const char *sets[] = {"train.activations=bf16", precision};
    gp_config c;
    gp_model mdl;
    if (!small_gpt(devs, n, "{layers: 2, heads: 2, width: 32, positions: 8, vocab: 32}", sets, 2,
                   &c, &mdl))
        return -1;
    float x[4 * 8], y[4 * 8];
    gpt_counting_tokens(7u, 4, 8, 32, x, y);
    uint64_t before = 0, after = 0;
    for (int j = 0; j < n; j++) before += gp_dev_adapter_bytes(devs[j]);
    gp_step_stats st;
    gp_status s = gp_model_pipeline_step(&mdl, &c, x, y, 4, 0.01, &st);
    CHECK_MSG(s == GP_OK, "adapter bytes, %s: %s", precision, gp_last_error());
    for (int j = 0; j < n; j++) after += gp_dev_adapter_bytes(devs[j]);
    gp_model_free(&mdl);
    gp_config_free(&c);
    return (int64_t)(after - before);
}

static void bf16_adapter(gp_device **f32)
{
    gp_device *b[2] = {0};
    gp_device_opts o = {.threads = 1, .precision = GP_PRECISION_BF16};
    bool have = gp_device_open("cpu:0", &o, &b[0]) == GP_OK &&
                gp_device_open("cpu:1", &o, &b[1]) == GP_OK;
    gp_error_clear();
    if (have) {
        for (int n = 1; n <= 2; n++) {
            int64_t got = adapter_bytes_of_step(b, n, "train.precision=bf16");
            CHECK_MSG(got == 0, "a bf16 GPT step on %d stage(s) made %lld FP32 activation bytes",
                      n, (long long)got);
        }
    } else {
        printf("adapter bytes: no bf16 instructions here: the precision-bf16 step not run\n");
    }
    for (int j = 0; j < 2; j++)
        if (b[j]) gp_device_close(b[j]);
    int64_t storage = adapter_bytes_of_step(f32, 1, "train.precision=fp32");
    CHECK_MSG(storage > 0, "bf16 storage under precision FP32: the linear layers' FP32 copies "
              "were not counted (%lld bytes)", (long long)storage);
}

int main(void)
{
    gp_log_set_level(GP_LOG_ERROR);
    gp_device *devs[3] = {0};
    gpt_open_cpu_devices(devs, 3, 1);
    if (devs[0]) {
        init_normal(devs[0]);
        vocab_pad(devs);
        launch_counts(devs);
        bf16_adapter(devs);
    }
    for (int j = 0; j < 3; j++)
        if (devs[j]) gp_device_close(devs[j]);
    expansion();
    names_and_counts();
    dry_run();
    errors();
    return gpt_finish("test_gpt");
}
