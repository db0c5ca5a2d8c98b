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
 *     what to change.
 */
#include "config/config.h"
#include "train/train.h"
#include "test_util.h"

#include <math.h>

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

/* --dry-run's language-model line for configs/gpt2.yaml. */
static void dry_run(void)
{
    char bin[600], cmd[1400], out[1 << 16];
    gpt_binary_path(bin, sizeof bin, "gpipe-train");
    snprintf(cmd, sizeof cmd, "'%s' '%s/configs/gpt2.yaml' --dry-run", bin, GPIPE_SOURCE_DIR);
    int rc = gpt_run_cmd(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "--dry-run exited %d: %s", rc, out);
    /* 6N + 12 L H Q T: N = 124,439,808, L = 12, H Q = 768, T = 1024 */
    double flops = 6.0 * 124439808.0 + 12.0 * 12 * 768 * 1024;
    char want[160];
    snprintf(want, sizeof want, "language model: 124439808 parameters (a tied weight counted "
             "once); %.1f MFLOP per token to train", flops / 1e6);
    CHECK_MSG(strstr(out, want) != NULL, "no \"%s\" in:\n%s", want, out);
    CHECK(strstr(out, "of activations per sequence of 1024 tokens") != NULL);
    CHECK(strstr(out, "total: 124439808 parameters") != NULL);
    /* the head's row shows no weight of its own, and its tie */
    CHECK(strstr(out, "{init: normal, std: 0.02, tie: transformer}") != NULL);
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

int main(void)
{
    gp_log_set_level(GP_LOG_ERROR);
    gp_device *dev = NULL;
    gpt_open_cpu_devices(&dev, 1, 1);
    if (dev) {
        init_normal(dev);
        gp_device_close(dev);
    }
    expansion();
    names_and_counts();
    dry_run();
    errors();
    return gpt_finish("test_gpt");
}
