/*
 * test_llama.c — the `model.llama` family (src/config/config_family.c,
 * issue 66): Llama as gpipe's layers.
 *
 *   - the expansion: layer count, types, Hugging Face's module names
 *     (model.embed_tokens, model.layers.i.input_layernorm, self_attn.*,
 *     mlp.*, model.norm, lm_head), the residual skips, the sizes of the
 *     fused projections ((heads + 2 kv_heads) d; 2 intermediate), no
 *     biases but Qwen2's q, k, v ones where qkv_bias, the rope's and the
 *     attention's heads, rope_theta and Llama 3's scaling, the norms' eps,
 *     the embedding without a position table, the head's tie;
 *   - the parameter count against the closed form V C + L (C (H + 2 G) d +
 *     C^2 + 3 C I + 2 C) + C (+ V C untied, + (H + 2 G) d L with biases)
 *     written here, and Hugging Face's published counts for the shipped
 *     configs: Llama 3.2 1B 1,235,814,400 (3B by --set: 3,212,749,824) and
 *     Llama 3 8B 8,030,261,248;
 *   - `gpipe-train --dry-run` prints those counts;
 *   - bad options, each named by file:line:column with what to change.
 * That the model learns, and gives one device's bits on two stages, is
 * test_e2e_gpt's; the layers' gradients are test_layers' and
 * test_attention's.
 */
#include "config/config.h"
#include "train/train.h"
#include "test_util.h"

static gp_status llama_cfg(const char *opts, const char *input, const char *const *sets, int n,
                           gp_config *c)
{
    char text[1024];
    snprintf(text, sizeof text,
             "model:\n"
             "  input: %s\n"
             "  llama: %s\n"
             "data: {dataset: synthetic}\n"
             "train: {batch_size: 2, seed: 1}\n",
             input, opts);
    gp_config own;
    gp_status s = gp_config_parse("l.yaml", text, strlen(text), sets, n, c ? c : &own);
    if (!c && s == GP_OK) gp_config_free(&own); /* a check of the message alone */
    return s;
}

/* Hugging Face's LlamaForCausalLM parameter count, written out. */
static int64_t llama_params(int64_t L, int64_t C, int64_t H, int64_t G, int64_t I, int64_t V,
                            bool tie, bool qkv_bias)
{
    int64_t d = C / H, qkv = (H + 2 * G) * d;
    int64_t block = C * qkv + (qkv_bias ? qkv : 0) + C * C + 3 * C * I + 2 * C;
    return V * C + L * block + C + (tie ? 0 : V * C);
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
    gp_status s = llama_cfg("{layers: 3, heads: 4, kv_heads: 2, width: 32, intermediate: 40, "
                            "vocab: 50, positions: 64, rope_theta: 500000, rms_eps: 1e-5, "
                            "tie: true, rope_scaling: {factor: 32, original_positions: 16}}",
                            "[12]", NULL, 0, &c);
    CHECK_OK(s);
    if (s != GP_OK) return;
    CHECK_MSG(c.model.n_layers == 1 + 3 * 11 + 2, "%d layers", c.model.n_layers);
    CHECK(!strcmp(c.model.family, "llama") && !strcmp(c.model.family_at, "l.yaml:3:3"));
    static const struct {
        const char *name;
        gp_layer_type type;
        const char *stash, *pop;
    } block1[] = {
        {"model.layers.1.input_layernorm", GP_LAYER_RMS_NORM, "", ""},
        {"model.layers.1.self_attn.qkv_proj", GP_LAYER_LINEAR, "", ""},
        {"model.layers.1.self_attn.rotary", GP_LAYER_ROPE, "", ""},
        {"model.layers.1.self_attn", GP_LAYER_ATTENTION, "", ""},
        {"model.layers.1.self_attn.o_proj", GP_LAYER_LINEAR, "", ""},
        {"model.layers.1.self_attn.residual", GP_LAYER_ADD, "h1.mid", "h1.in"},
        {"model.layers.1.post_attention_layernorm", GP_LAYER_RMS_NORM, "", ""},
        {"model.layers.1.mlp.gate_up_proj", GP_LAYER_LINEAR, "", ""},
        {"model.layers.1.mlp.act", GP_LAYER_SWIGLU, "", ""},
        {"model.layers.1.mlp.down_proj", GP_LAYER_LINEAR, "", ""},
        {"model.layers.1.mlp.residual", GP_LAYER_ADD, "h2.in", "h1.mid"},
    };
    const gp_layer_spec *l = c.model.layers;
    CHECK(l[0].type == GP_LAYER_EMBEDDING && !strcmp(l[0].name, "model.embed_tokens") &&
          l[0].vocab == 50 && l[0].dim == 32 && l[0].positions == 0 &&
          !strcmp(l[0].stash, "h0.in"));
    for (int q = 0; q < (int)(sizeof block1 / sizeof block1[0]); q++) {
        const gp_layer_spec *b = &l[12 + q];
        CHECK_MSG(b->type == block1[q].type && !strcmp(b->name, block1[q].name) &&
                      !strcmp(b->stash, block1[q].stash) &&
                      (block1[q].pop[0] ? b->n_pop == 1 && !strcmp(b->pop[0], block1[q].pop)
                                        : b->n_pop == 0),
                  "layer %d is %s %s (stash '%s', %d pops), want %s %s", 12 + q,
                  gp_layer_type_name(b->type), b->name, b->stash, b->n_pop,
                  gp_layer_type_name(block1[q].type), block1[q].name);
    }
    const gp_layer_spec *last = find(&c, "model.layers.2.mlp.residual");
    CHECK(last && !last->stash[0] && !strcmp(last->pop[0], "h2.mid"));
    CHECK(l[34].type == GP_LAYER_RMS_NORM && !strcmp(l[34].name, "model.norm") &&
          l[34].eps == 1e-5f);
    const gp_layer_spec *head = &l[35];
    CHECK(head->type == GP_LAYER_LINEAR && !strcmp(head->name, "lm_head") && head->out == 50 &&
          !head->bias && !strcmp(head->tie, "model.embed_tokens"));
    const gp_layer_spec *qkv = find(&c, "model.layers.0.self_attn.qkv_proj"),
                        *rope = find(&c, "model.layers.0.self_attn.rotary"),
                        *att = find(&c, "model.layers.0.self_attn"),
                        *o = find(&c, "model.layers.0.self_attn.o_proj"),
                        *gu = find(&c, "model.layers.0.mlp.gate_up_proj"),
                        *dn = find(&c, "model.layers.0.mlp.down_proj"),
                        *n1 = find(&c, "model.layers.0.input_layernorm");
    CHECK(qkv && qkv->out == (4 + 2 * 2) * 8 && !qkv->bias && qkv->init == GP_INIT_NORMAL &&
          qkv->std == 0.02f);
    CHECK(rope && rope->heads == 4 && rope->kv_heads == 2 && rope->rope_theta == 500000.0f &&
          rope->rope_llama3 && rope->rope_factor == 32.0f && rope->rope_low_freq == 1.0f &&
          rope->rope_high_freq == 4.0f && rope->rope_orig_positions == 16);
    CHECK(att && att->heads == 4 && att->kv_heads == 2);
    CHECK(o && o->out == 32 && !o->bias && gu && gu->out == 80 && !gu->bias && dn &&
          dn->out == 32 && !dn->bias);
    CHECK(n1 && n1->eps == 1e-5f);
    int64_t n = -1;
    CHECK_OK(gp_model_count_params(&c, &n));
    CHECK_MSG(n == llama_params(3, 32, 4, 2, 40, 50, true, false), "%lld parameters",
              (long long)n);
    gp_config_free(&c);

    /* the defaults: HF's LlamaConfig (no scaling, eps 1e-6, untied, kv_heads
     * = heads); Qwen2's q, k, v biases */
    s = llama_cfg("{layers: 2, heads: 2, width: 16, intermediate: 24, vocab: 30, "
                  "qkv_bias: true}", "[8]", NULL, 0, &c);
    CHECK_OK(s);
    if (s != GP_OK) return;
    rope = find(&c, "model.layers.0.self_attn.rotary");
    qkv = find(&c, "model.layers.0.self_attn.qkv_proj");
    CHECK(rope && !rope->rope_llama3 && rope->rope_theta == 10000.0f && rope->kv_heads == 2);
    CHECK(qkv && qkv->bias && qkv->out == 48);
    CHECK(find(&c, "model.norm")->eps == 1e-6f && !c.model.layers[c.model.n_layers - 1].tie[0]);
    CHECK_OK(gp_model_count_params(&c, &n));
    CHECK_MSG(n == llama_params(2, 16, 2, 2, 24, 30, false, true), "%lld parameters",
              (long long)n);
    gp_config_free(&c);
}

/* The shipped configs' counts, Hugging Face's (num_parameters() of
 * LlamaForCausalLM, a tied weight once). */
static void counts(void)
{
    static const struct {
        const char *file, *sets[4];
        int n_sets;
        int64_t want;
    } cfgs[] = {
        {"llama3.2-1b.yaml", {NULL}, 0, 1235814400},
        {"llama3.2-1b.yaml",
         {"model.llama.layers=28", "model.llama.heads=24", "model.llama.width=3072",
          "model.llama.intermediate=8192"}, 4, 3212749824},
        {"llama3-8b.yaml", {NULL}, 0, 8030261248},
        {"llama3-70b.yaml", {NULL}, 0, 70553706496},
    };
    for (size_t q = 0; q < sizeof cfgs / sizeof *cfgs; q++) {
        char path[600];
        snprintf(path, sizeof path, "%s/configs/%s", GPIPE_SOURCE_DIR, cfgs[q].file);
        gp_config c;
        gp_status s = gp_config_load(path, cfgs[q].sets, cfgs[q].n_sets, &c);
        CHECK_MSG(s == GP_OK, "%s: %s", cfgs[q].file, gp_last_error());
        if (s != GP_OK) continue;
        int64_t n = -1;
        CHECK_OK(gp_model_count_params(&c, &n));
        CHECK_MSG(n == cfgs[q].want, "%s (%d sets): %lld parameters, want %lld", cfgs[q].file,
                  cfgs[q].n_sets, (long long)n, (long long)cfgs[q].want);
        gp_config_free(&c);
    }
    CHECK(llama_params(16, 2048, 32, 8, 8192, 128256, true, false) == 1235814400);
    CHECK(llama_params(32, 4096, 32, 8, 14336, 128256, false, false) == 8030261248);
    CHECK(llama_params(80, 8192, 64, 8, 28672, 128256, false, false) == 70553706496);
}

static void dry_run(void)
{
    static const struct {
        const char *file, *want, *heads;
    } runs[] = {
        {"llama3.2-1b.yaml", "language model: 1235814400 parameters", "{heads: 32, kv_heads: 8}"},
        {"llama3-8b.yaml", "language model: 8030261248 parameters", "{heads: 32, kv_heads: 8}"},
        /* the planner's layout for 64 H100s (gpipe-balance --plan 64 --gpu h100) */
        {"llama3-70b.yaml", "language model: 70553706496 parameters", "{heads: 64, kv_heads: 8}"},
    };
    char bin[600], cmd[1400];
    static char out[1 << 18];
    gpt_binary_path(bin, sizeof bin, "gpipe-train");
    for (size_t q = 0; q < sizeof runs / sizeof *runs; q++) {
        snprintf(cmd, sizeof cmd, "'%s' '%s/configs/%s' --dry-run", bin, GPIPE_SOURCE_DIR,
                 runs[q].file);
        int rc = gpt_run_cmd(cmd, out, sizeof out);
        CHECK_MSG(rc == 0, "%s --dry-run exited %d: %s", runs[q].file, rc, out);
        CHECK_MSG(strstr(out, runs[q].want) != NULL, "no \"%s\" in %s's --dry-run", runs[q].want,
                  runs[q].file);
        CHECK(strstr(out, runs[q].heads) != NULL);
        /* every device's estimate within its 80 GB (74.5 GiB), where the
         * config gives the memory: each "cuda:N X GiB" of the peak line */
        const char *pk = strstr(out, "memory at a step's peak");
        if (strstr(runs[q].file, "70b")) {
            int devs = 0;
            double most = 0;
            for (const char *c = pk ? strstr(pk, "): ") : NULL; c && (c = strstr(c, "cuda:"));) {
                int d;
                double g;
                if (sscanf(c, "cuda:%d %lf GiB", &d, &g) == 2) {
                    devs++;
                    most = fmax(most, g);
                }
                c += 5;
            }
            CHECK_MSG(devs == 16 && most > 10 && most < 80e9 / 1073741824.0,
                      "%s: %d devices' peaks, the largest %.1f GiB (80 GB = 74.5 GiB): %s",
                      runs[q].file, devs, most, pk ? pk : out);
        }
    }
}

static void errors(void)
{
    CHECK_ERR(llama_cfg("{heads: 32, kv_heads: 5}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "l.yaml:3:32: model.llama.kv_heads = 5 does not divide model.llama.heads = 32");
    CHECK_ERR(llama_cfg("{heads: 3, width: 99}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "l.yaml:3:18: model.llama.heads = 3 does not split model.llama.width = 99 into "
              "heads of an even size");
    CHECK_ERR(llama_cfg("{positions: 32}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "l.yaml:3:22: model.llama.positions = 32 (max_position_embeddings) is shorter "
              "than the sequence");
    CHECK_ERR(llama_cfg("{}", "[3, 8, 8]", NULL, 0, NULL), GP_ERR_INVALID,
              "l.yaml:2:10: model.llama reads token ids: model.input must be [T]");
    CHECK_ERR(llama_cfg("{rope_scaling: 8}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "l.yaml:3:25: model.llama.rope_scaling must be a map");
    CHECK_ERR(llama_cfg("{rope_scaling: {low_freq_factor: 4, high_freq_factor: 2}}", "[64]", NULL,
                        0, NULL),
              GP_ERR_INVALID, "high_freq_factor (2) must be above low_freq_factor (4)");
    CHECK_ERR(llama_cfg("{rope_scaling: {factr: 8}}", "[64]", NULL, 0, NULL), GP_ERR_INVALID,
              "l.yaml:3:26: unknown key 'factr'");
    CHECK_ERR(llama_cfg("{layer: 2}", "[64]", NULL, 0, NULL), GP_ERR_INVALID, "l.yaml:3:");
    const char *both = "model:\n  input: [8]\n  gpt: {}\n  llama: {}\n";
    gp_config c;
    CHECK_ERR(gp_config_parse("b.yaml", both, strlen(both), NULL, 0, &c), GP_ERR_INVALID,
              "model has both");
}

int main(void)
{
    gp_log_set_level(GP_LOG_ERROR);
    expansion();
    counts();
    dry_run();
    errors();
    return gpt_finish("test_llama");
}
