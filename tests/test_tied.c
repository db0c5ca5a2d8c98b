/*
 * test_tied.c — tied weights across stages (layers.h "tied weights",
 * pipeline.c "tied weights"): a tiny GPT-shaped model whose LM head is the
 * embedding's wte.weight,
 *
 *     embedding 'transformer' -> layer_norm -> linear 32 -> gelu -> linear 16
 *     -> layer_norm -> linear 'lm_head' {out: 11, bias: false, tie: transformer}
 *
 * Checks:
 *   - one device: the owner's gradient is the untied model's wte gradient
 *     plus its head's (the untied twin started from the same values, its
 *     two gradients added on the host), the replica's gradient is the
 *     twin's head gradient, owner and replica stay bit for bit equal over
 *     Adam steps, the replica has no optimizer state, and the parameter
 *     count counts the tied weight once;
 *   - transparency: 1 to 4 stages, every schedule, every checkpoint mode,
 *     FP32 and bf16 activations: every step's loss, the first step's
 *     gradients and every parameter after the steps bit for bit the
 *     one-device step's (gp_model_train_step), the embedding on stage 0
 *     and the head on the last stage;
 *   - gradient clipping counts the tied weight once (bit for bit the
 *     one-device step), and data-parallel replicas keep it tied;
 *   - snapshots: the tied weight stored once, under the owner's name, and
 *     a resume (into a model that started from other values) continues
 *     bit for bit;
 *   - each config error names both layers and what to change.
 */
#include "test_util.h"
#include "train/snapshot.h"

#include <unistd.h>

enum { V = 11, T = 6, D = 16, BATCH = 12 };

static const char *k_cfg =
    "model:\n"
    "  input: [6]\n"
    "  layers:\n"
    "    - embedding: {name: transformer, vocab: 11, dim: 16, positions: 6}\n"
    "    - layer_norm\n"
    "    - linear: {out: 32}\n"
    "    - gelu\n"
    "    - linear: {out: 16}\n"
    "    - layer_norm: {eps: 1.0e-6}\n"
    "    - linear: {name: lm_head, out: 11, bias: false, tie: transformer}\n"
    "  loss: cross_entropy\n"
    "data:\n"
    "  dataset: synthetic\n"
    "  synthetic: {train: 64, test: 16, classes: 11, shape: [6]}\n"
    "pipeline: {devices: [cpu:0], chunks: 4}\n"
    "train:\n"
    "  batch_size: 12\n"
    "  steps: 4\n"
    "  seed: 5\n"
    "  log_every: 0\n"
    "  optimizer: {type: adam, lr: 0.01, weight_decay: 0.01}\n";

/* k_cfg with `from` replaced by `to` (once), in a static buffer. */
static const char *variant(const char *from, const char *to)
{
    static char buf[4096];
    const char *at = strstr(k_cfg, from);
    CHECK_MSG(at != NULL, "no '%s' in the config", from);
    if (!at) return k_cfg;
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - k_cfg), k_cfg, to, at + strlen(from));
    return buf;
}

static bool parse(const char *yaml, const char *const *sets, int n, gp_config *c)
{
    gp_status s = gp_config_parse("tied.yaml", yaml, strlen(yaml), sets, n, c);
    CHECK_MSG(s == GP_OK, "config: %s", gp_last_error());
    return s == GP_OK;
}

/* Token ids and next-token targets (a counting pattern). */
static void batch(int step, float *x, float *y)
{
    gpt_counting_tokens(100u + (unsigned)step, BATCH, T, V, x, y);
}

/* The LM head's index: 6 in k_cfg; test_gpt_transparency sets the GPT
 * family's */
static int g_head = 6;
static gp_param *owner_of(gp_model *m) { return &m->layers[0].params[0]; } /* wte.weight */
static gp_param *replica_of(gp_model *m) /* lm_head.weight */
{
    return &m->layers[g_head].params[0];
}

/* ---- one device: the gradient sum against the untied twin ---------------- */

static void test_one_device(gp_device *dev)
{
    gp_config c, cu;
    if (!parse(variant(", tie: transformer", ""), NULL, 0, &cu) || !parse(k_cfg, NULL, 0, &c))
        return;
    CHECK(c.model.layers[6].tie[0] && !cu.model.layers[6].tie[0]);
    int64_t pt = 0, pu = 0;
    CHECK_OK(gp_model_count_params(&c, &pt));
    CHECK_OK(gp_model_count_params(&cu, &pu));
    CHECK_MSG(pu - pt == (int64_t)V * D, "parameters tied %lld, untied %lld: the tied weight "
              "counted once", (long long)pt, (long long)pu);
    gp_model m, u;
    CHECK_OK(gp_model_build(&c, dev, &m));
    CHECK_OK(gp_model_build(&cu, dev, &u));
    CHECK(gp_model_param_count(&m) == pt && gp_model_param_count(&u) == pu);
    gp_param *o = owner_of(&m), *r = replica_of(&m);
    CHECK(r->tied && r->tie_layer == 0 && r->tie_param == 0 && !o->tied);
    CHECK_MSG(gpt_same_tensor(&o->value, &r->value), "the replica starts as the owner");
    CHECK_MSG(gp_optim_state(m.optim, 6, 0, 0) == NULL && gp_optim_state(m.optim, 0, 0, 0),
              "the replica has no optimizer state, the owner has");
    /* the twin starts from the tied model's values, its head from wte */
    for (int k = 0; k < m.n_layers; k++)
        for (int q = 0; q < m.layers[k].n_params; q++)
            CHECK_OK(gp_tensor_copy(&u.layers[k].params[q].value, &m.layers[k].params[q].value));
    float x[BATCH * T], y[BATCH * T];
    batch(0, x, y);
    gp_step_stats a, b;
    /* lr 0: the step leaves its gradients and changes no value; a limit
     * no norm reaches: the norm is reported, nothing scaled */
    c.train.clip_grad_norm = 1e9f;
    CHECK_OK(gp_model_train_step(&m, &c, x, y, BATCH, 4, 0.0, &a));
    double sq = 0, sq_tied = 0; /* the trained tensors' squares; the replica's */
    for (int k = 0; k < m.n_layers; k++)
        for (int q = 0; q < m.layers[k].n_params; q++) {
            gp_param *pr = &m.layers[k].params[q];
            if (pr->is_buffer) continue;
            float *g = gpt_download(&pr->grad);
            for (int64_t e = 0; e < gp_tensor_numel(&pr->grad); e++)
                *(pr->tied ? &sq_tied : &sq) += (double)g[e] * g[e];
            free(g);
        }
    CHECK_MSG(fabs(a.grad_norm - sqrt(sq)) <= 1e-6 * sqrt(sq) &&
                  sqrt(sq + sq_tied) - sqrt(sq) > 1e-3 * sqrt(sq),
              "the global norm %.9g counts the tied weight once (%.9g; twice: %.9g)",
              a.grad_norm, sqrt(sq), sqrt(sq + sq_tied));
    CHECK_OK(gp_model_train_step(&u, &cu, x, y, BATCH, 4, 0.0, &b));
    CHECK_MSG(a.loss == b.loss, "equal weights, equal loss: %.9g %.9g", a.loss, b.loss);
    float *gw = gpt_download(&u.layers[0].params[0].grad),
          *gh = gpt_download(&u.layers[6].params[0].grad);
    float *go = gpt_download(&o->grad), *gr = gpt_download(&r->grad);
    int bad = 0, nonzero = 0;
    for (int q = 0; q < V * D; q++) {
        float want = gw[q] + gh[q]; /* the owner's += the replica's, in FP32 */
        bad += memcmp(&want, &go[q], sizeof want) != 0;
        bad += memcmp(&gh[q], &gr[q], sizeof want) != 0;
        nonzero += gh[q] != 0.0f && gw[q] != 0.0f;
    }
    CHECK_MSG(bad == 0, "%d gradient entries differ from the untied twin's sum", bad);
    CHECK_MSG(nonzero > V * D / 4, "both gradients take part (%d entries non-zero in both)",
              nonzero);
    free(gw);
    free(gh);
    free(go);
    free(gr);
    /* Adam steps: owner and replica stay one value; the update moved it */
    float *before = gpt_download(&o->value);
    for (int s = 1; s <= 3; s++) {
        batch(s, x, y);
        CHECK_OK(gp_model_train_step(&m, &c, x, y, BATCH, 4, 0.01, &a));
        CHECK_MSG(gpt_same_tensor(&o->value, &r->value), "step %d: replica equals owner", s);
    }
    float *after = gpt_download(&o->value);
    CHECK_MSG(memcmp(before, after, (size_t)V * D * sizeof *before) != 0, "the owner was updated");
    free(before);
    free(after);
    gp_model_free(&m);
    gp_model_free(&u);
    gp_config_free(&c);
    gp_config_free(&cu);
}

/* ---- transparency ------------------------------------------------------- */

/* One configuration of yaml on n devices against one device: three steps'
 * losses, the first step's gradients and the parameters after them bit
 * for bit, and the tied copy equal to its owner. */
static void transparency_one(gp_device **devs, const char *yaml, int n, gp_schedule_kind kind,
                             int ck, int bf, gp_ckpt_keep keep)
{
    gp_config c;
    const char *sets[1] = {bf ? "train.activations=bf16" : "train.activations=fp32"};
    if (!parse(yaml, sets, 1, &c)) return;
    int bal[GP_MAX_DEVICES];
    int S = gpt_set_schedule(&c, kind, n, bal);
    c.pipeline.checkpoint = (gp_checkpoint_mode)ck;
    c.pipeline.checkpoint_keep = keep;
    c.pipeline.chunks = n == 3 ? 6 : 4; /* interleaved: a multiple of n */
    gp_model ref, pip;
    CHECK_OK(gp_model_build(&c, devs[0], &ref));
    CHECK_OK(gp_model_build_placed(&c, devs, n, bal, &pip));
    CHECK(pip.n_stages == S);
    /* the embedding on stage 0, the head on the last */
    CHECK(pip.layers[0].dev == devs[0] && pip.layers[g_head].dev == devs[pip.dev_of[S - 1]]);
    float x[BATCH * T], y[BATCH * T];
    bool loss = true, grads = true, ok = true;
    for (int s = 0; s < 3 && ok; s++) {
        batch(s, x, y);
        gp_step_stats a, b;
        ok = gp_model_train_step(&ref, &c, x, y, BATCH, c.pipeline.chunks, 0.01, &a) == GP_OK &&
             gp_model_pipeline_step(&pip, &c, x, y, BATCH, 0.01, &b) == GP_OK;
        CHECK_MSG(ok, "%d stages %s checkpoint %d keep %#x bf16 %d: %s", S,
                  gp_schedule_kind_name(kind), ck, keep, bf, gp_last_error());
        if (!ok) break;
        loss = loss && a.loss == b.loss;
        if (s == 0) {
            int64_t na, nb;
            float *ga = gpt_gather(&ref, GPT_GRADS, &na);
            float *gb = gpt_gather(&pip, GPT_GRADS, &nb);
            grads = na == nb && !memcmp(ga, gb, (size_t)na * sizeof *ga);
            free(ga);
            free(gb);
        }
    }
    if (ok) {
        CHECK_MSG(loss && grads && gpt_same_values(&ref, &pip),
                  "%d stages on %d devices, %s, checkpoint %d keep %#x, bf16 activations %d: "
                  "losses %s, gradients %s, values %s", S, n, gp_schedule_kind_name(kind), ck,
                  keep, bf,
                  loss ? "equal" : "differ", grads ? "equal" : "differ",
                  gpt_same_values(&ref, &pip) ? "equal" : "differ");
        CHECK(gpt_same_tensor(&owner_of(&pip)->value, &replica_of(&pip)->value));
    }
    gp_model_free(&ref);
    gp_model_free(&pip);
    gp_config_free(&c);
}

static const gp_schedule_kind k_kinds[] = {GP_SCHEDULE_GPIPE,       GP_SCHEDULE_1F1B,
                                           GP_SCHEDULE_ZB_H1,       GP_SCHEDULE_INTERLEAVED,
                                           GP_SCHEDULE_ZB_V,        GP_SCHEDULE_DUALPIPE_V,
                                           GP_SCHEDULE_V_HALF,      GP_SCHEDULE_V_MIN};
enum { N_KINDS = sizeof k_kinds / sizeof k_kinds[0] };

static void test_transparency(gp_device **devs)
{
    int runs = 0;
    for (int bf = 0; bf < 2; bf++)
        for (int n = 1; n <= 4; n++)
            for (int sk = 0; sk < N_KINDS; sk++)
                for (int ck = 0; ck < 3; ck++) {
                    gp_schedule_kind kind = k_kinds[sk];
                    if (n == 1 && kind != GP_SCHEDULE_GPIPE) continue;
                    /* a layer a stage; the V schedules put the tied embedding
                     * and head (stages 0 and 2n - 1) on one device */
                    if ((kind == GP_SCHEDULE_INTERLEAVED || gp_schedule_v_shape(kind)) && 2 * n > 7)
                        continue;
                    /* (dualpipe-v: chunks >= 2n, and transparency_one gives 4) */
                    if (kind == GP_SCHEDULE_DUALPIPE_V && 2 * n > 4) continue;
                    transparency_one(devs, k_cfg, n, kind, ck, bf, 0);
                    runs++;
                }
    CHECK(runs > 50);
}

/* The run around k_gpt's and k_llama's models: their loss, synthetic
 * tokens, 4 micro-batches, AdamW. */
#define K_LM_RUN                                                                                   \
    "  loss: cross_entropy\n"                                                                      \
    "data:\n"                                                                                      \
    "  dataset: synthetic\n"                                                                       \
    "  synthetic: {train: 64, test: 16, classes: 11, shape: [6]}\n"                                \
    "pipeline: {devices: [cpu:0], chunks: 4}\n"                                                    \
    "train:\n"                                                                                     \
    "  batch_size: 12\n"                                                                           \
    "  seed: 5\n"                                                                                  \
    "  log_every: 0\n"                                                                             \
    "  optimizer: {type: adamw, lr: 0.01, weight_decay: 0.1}\n"

/* GPT-2 itself (model.gpt, two blocks: attention, the residual skips that
 * cross stages, the tied head on the last stage) on 2 to 4 devices, every
 * schedule and checkpoint mode, FP32 and bf16 activations: issue 53's
 * transparency bar.  Under a sanitizer FP32 only. */
static const char *k_gpt =
    "model:\n"
    "  input: [6]\n"
    "  gpt: {layers: 2, heads: 2, width: 16, positions: 6, vocab: 11}\n" K_LM_RUN;

static void test_gpt_transparency(gp_device **devs)
{
    gp_config c;
    if (!parse(k_gpt, NULL, 0, &c)) return;
    g_head = c.model.n_layers - 1;
    CHECK(g_head == 22 && !strcmp(c.model.layers[g_head].name, "lm_head") &&
          !strcmp(c.model.layers[g_head].tie, "transformer"));
    gp_config_free(&c);
    bool san = gpt_sanitizer() != GPT_SAN_NONE;
    int runs = 0;
    for (int bf = 0; bf < (san ? 1 : 2); bf++)
        for (int n = 2; n <= 4; n++)
            for (int sk = 0; sk < 4; sk++)
                for (int ck = 0; ck < 3; ck++) {
                    transparency_one(devs, k_gpt, n, k_kinds[sk], ck, bf, 0);
                    runs++;
                }
    CHECK(runs == (san ? 36 : 72));
    g_head = 6;
}

/* Llama's blocks (RMSNorm, the fused QKV product with RoPE in place over
 * it, grouped-query attention, SwiGLU) with a tied head, as k_gpt. */
static const char *k_llama =
    "model:\n"
    "  input: [6]\n"
    "  llama: {layers: 2, heads: 2, kv_heads: 1, width: 16, intermediate: 24, vocab: 11,\n"
    "          positions: 6, tie: true}\n" K_LM_RUN;

#define KEEP(t) (1u << (t))

/* Selective recompute (pipeline.checkpoint.keep, issue 79) through the
 * pipeline: GPT-2's and Llama's blocks on 2 and 3 stages (the residual
 * skips across stages, the add + norm and linear + GELU pairs split where
 * one of them is kept, RoPE in place over a kept or recomputed product,
 * the tied head), checkpoint always and except_last, on GPipe, 1F1B, ZB-H1
 * and ZB-V, keeping the products and attention (Megatron-LM's choice), the
 * cheap layers instead, or every type, and on 2 stages with activations
 * stored in bf16 too: every step's loss, the first step's gradients and
 * the parameters after three steps bit for bit one device's.  Under a
 * sanitizer fewer combinations. */
static void test_selective_transparency(gp_device **devs)
{
    const gp_ckpt_keep keeps[] = {
        KEEP(GP_LAYER_LINEAR) | KEEP(GP_LAYER_ATTENTION),
        KEEP(GP_LAYER_LAYER_NORM) | KEEP(GP_LAYER_RMS_NORM) | KEEP(GP_LAYER_ADD) |
            KEEP(GP_LAYER_GELU) | KEEP(GP_LAYER_SWIGLU) | KEEP(GP_LAYER_EMBEDDING),
        (gp_ckpt_keep)((1ull << GP_LAYER_TYPE_COUNT) - 1)};
    const gp_schedule_kind kinds[] = {GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B, GP_SCHEDULE_ZB_H1,
                                      GP_SCHEDULE_ZB_V};
    const char *models[] = {k_gpt, k_llama};
    bool san = gpt_sanitizer() != GPT_SAN_NONE;
    int runs = 0;
    for (int mo = 0; mo < 2; mo++) {
        gp_config c;
        if (!parse(models[mo], NULL, 0, &c)) return;
        g_head = c.model.n_layers - 1;
        CHECK(!strcmp(c.model.layers[g_head].name, "lm_head") && c.model.layers[g_head].tie[0]);
        gp_config_free(&c);
        for (int n = 2; n <= 3; n++)
            for (size_t sk = 0; sk < sizeof kinds / sizeof *kinds; sk++)
                for (size_t q = 0; q < sizeof keeps / sizeof *keeps; q++)
                    for (int ck = 0; ck < 2; ck++)
                        for (int bf = 0; bf < 2; bf++) { /* bf16 activations: 2 stages, always */
                            if ((san && (n == 3 || ck == 1)) || (bf && (n == 3 || ck == 1)))
                                continue;
                            transparency_one(devs, models[mo], n, kinds[sk], ck, bf, keeps[q]);
                            runs++;
                        }
    }
    CHECK(runs == (san ? 48 : 120));
    g_head = 6;
}

/* ---- gradient clipping and data parallelism ----------------------------- */

/* The tied weight counts once in the global norm (clipping on, at a limit
 * every step exceeds): a pipeline equals the one-device step bit for bit;
 * and two data-parallel replicas of a 2-stage pipeline (their gradients,
 * the replica's and the owner's, all-reduced, then summed) match the
 * one-device step over their micro-batches to rounding (another summation
 * order), every replica equal to replica 0 bit for bit and each replica's
 * tied copy equal to its owner. */
static void test_clip_replicas(gp_device **devs)
{
    const char *sets[1] = {"train.clip_grad_norm=0.05"};
    gp_config c;
    if (!parse(k_cfg, sets, 1, &c)) return;
    int bal[GP_MAX_DEVICES];
    gpt_set_schedule(&c, GP_SCHEDULE_1F1B, 3, bal);
    gp_model ref, pip;
    CHECK_OK(gp_model_build(&c, devs[0], &ref));
    CHECK_OK(gp_model_build_placed(&c, devs, 3, bal, &pip));
    float x[BATCH * T], y[BATCH * T];
    for (int s = 0; s < 3; s++) {
        batch(s, x, y);
        gp_step_stats a, b;
        CHECK_OK(gp_model_train_step(&ref, &c, x, y, BATCH, c.pipeline.chunks, 0.01, &a));
        CHECK_OK(gp_model_pipeline_step(&pip, &c, x, y, BATCH, 0.01, &b));
        CHECK_MSG(a.grad_norm == b.grad_norm && a.grad_norm > 0.05 && a.loss == b.loss,
                  "step %d: norm %.9g on one device, %.9g on 3 stages (limit 0.05)", s,
                  a.grad_norm, b.grad_norm);
    }
    CHECK_MSG(gpt_same_values(&ref, &pip), "clipped: 3 stages equal one device");
    gp_model_free(&ref);
    gp_model_free(&pip);

    gpt_set_schedule(&c, GP_SCHEDULE_GPIPE, 2, bal);
    gp_model rep;
    CHECK_OK(gp_model_build(&c, devs[4], &ref));
    CHECK_OK(gp_model_build_replicated(&c, devs, 2, 2, bal, &rep));
    double worst_loss = 0;
    for (int s = 0; s < 3; s++) {
        batch(s, x, y);
        gp_step_stats a, b;
        CHECK_OK(gp_model_train_step(&ref, &c, x, y, BATCH, 2 * c.pipeline.chunks, 0.01, &a));
        CHECK_OK(gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.01, &b));
        worst_loss = fmax(worst_loss, fabs(a.loss - b.loss) / a.loss);
    }
    bool same_count;
    double worst = gpt_param_diff(&ref, &rep, &same_count);
    CHECK_MSG(same_count && worst <= 1e-4 && worst_loss <= 1e-5,
              "2 replicas x 2 stages: parameters differ by %.3g relative, loss by %.3g", worst,
              worst_loss);
    CHECK_OK(gp_model_check_replicas(&rep));
    CHECK(gpt_same_tensor(&owner_of(&rep)->value, &replica_of(&rep)->value));
    CHECK(gpt_same_tensor(&owner_of(&rep.replicas[0])->value,
                          &replica_of(&rep.replicas[0])->value));
    gp_model_free(&ref);
    gp_model_free(&rep);
    gp_config_free(&c);
}

/* ---- snapshots ---------------------------------------------------------- */

static void test_snapshot(gp_device **devs)
{
    char dir[256], path[512];
    if (!gpt_make_tmpdir(dir, sizeof dir, "gpipe-tied")) {
        CHECK_MSG(0, "no scratch directory");
        return;
    }
    snprintf(path, sizeof path, "%s/tied.safetensors", dir);
    gp_config c, c2;
    const char *other[1] = {"train.seed=9"}; /* other initial values */
    if (!parse(k_cfg, NULL, 0, &c) || !parse(k_cfg, other, 1, &c2)) return;
    int bal[2] = {3, 4};
    gp_model a, b;
    CHECK_OK(gp_model_build_placed(&c, devs, 2, bal, &a));
    CHECK_OK(gp_model_build_placed(&c2, devs, 2, bal, &b));
    CHECK_MSG(!gpt_same_tensor(&owner_of(&a)->value, &owner_of(&b)->value),
              "other seeds, other values");
    float x[BATCH * T], y[BATCH * T];
    for (int s = 0; s < 2; s++) {
        batch(s, x, y);
        CHECK_OK(gp_model_pipeline_step(&a, &c, x, y, BATCH, 0.01, NULL));
    }
    CHECK_OK(gp_snapshot_save_file(&a, &c, path));
    gp_st_file f;
    CHECK_OK(gp_st_read(path, &f));
    /* (named by layer index: not every layer has a name) */
    CHECK_MSG(gp_st_find(&f, "0.wte.weight") != NULL, "the owner's entry");
    CHECK_MSG(gp_st_find(&f, "exp_avg.0.wte.weight") != NULL, "its optimizer state");
    int head = 0;
    for (int i = 0; i < f.n; i++) head += strstr(f.tensors[i].name, "6.weight") != NULL;
    CHECK_MSG(head == 0, "%d entries named 6.weight (lm_head): the tied weight is stored once", head);
    gp_st_free(&f);
    gp_snapshot_pos pos;
    CHECK_OK(gp_snapshot_restore(&b, &c, path, true, &pos, NULL));
    CHECK_MSG(gpt_same_tensor(&owner_of(&b)->value, &replica_of(&b)->value),
              "the resumed replica is the resumed owner");
    CHECK(gpt_same_values(&a, &b));
    gp_step_stats sa, sb;
    for (int s = 2; s < 5; s++) {
        batch(s, x, y);
        CHECK_OK(gp_model_pipeline_step(&a, &c, x, y, BATCH, 0.01, &sa));
        CHECK_OK(gp_model_pipeline_step(&b, &c, x, y, BATCH, 0.01, &sb));
        CHECK_MSG(sa.loss == sb.loss, "step %d after the resume: %.9g %.9g", s, sa.loss, sb.loss);
    }
    CHECK_MSG(gpt_same_values(&a, &b), "the resumed run continues bit for bit");
    /* an untied model's weights (lm_head of its own) into the tied model:
     * the message names the tie and how to load them (issue 65) */
    gp_config cu;
    gp_model u;
    if (parse(variant(", tie: transformer", ""), NULL, 0, &cu)) {
        CHECK_OK(gp_model_build_placed(&cu, devs, 2, bal, &u));
        CHECK_OK(gp_snapshot_export(&u, &cu, path));
        gp_status s = gp_snapshot_init_from(&b, path);
        const char *msg = gp_last_error();
        CHECK_MSG(s == GP_ERR_INVALID && strstr(msg, "not in the model: 6.weight") &&
                      strstr(msg, "6.weight is tied to transformer.wte.weight in this model") &&
                      strstr(msg, "model.gpt.tie: false"),
                  "untied weights into a tied model: %s", msg);
        gp_model_free(&u);
        gp_config_free(&cu);
    }
    gp_model_free(&a);
    gp_model_free(&b);
    gp_config_free(&c);
    gp_config_free(&c2);
    remove(path);
    rmdir(dir);
}

/* ---- config errors ------------------------------------------------------ */

static void expect_error(const char *what, const char *yaml, const char *want1,
                         const char *want2)
{
    gp_config c;
    if (!parse(yaml, NULL, 0, &c)) return;
    int64_t count;
    gp_status s = gp_model_count_params(&c, &count);
    const char *msg = gp_last_error();
    CHECK_MSG(s == GP_ERR_INVALID && strstr(msg, want1) && strstr(msg, want2),
              "%s: got %d '%s', wanted '%s' and '%s'", what, (int)s, msg, want1, want2);
    gp_config_free(&c);
}

static void test_errors(void)
{
    const char *head = "layer 6 (linear 'lm_head') at tied.yaml:10:7";
    expect_error("unknown", variant("tie: transformer", "tie: wte"), head,
                 "names no layer of the model");
    expect_error("itself", variant("tie: transformer", "tie: lm_head"), head,
                 "is this layer itself");
    expect_error("later", variant("- linear: {out: 32}", "- linear: {out: 32, tie: lm_head}"),
                 "layer 2 (linear) at tied.yaml:6:7", "names layer 6 (linear 'lm_head') at "
                 "tied.yaml:10:7, which comes after it");
    expect_error("type", variant("- layer_norm: {eps: 1.0e-6}\n    - linear: {name: lm_head, "
                                 "out: 11, bias: false, tie: transformer}",
                                 "- layer_norm: {name: ln, eps: 1.0e-6}\n    - linear: {name: "
                                 "lm_head, out: 11, bias: false, tie: ln}"),
                 head, "names layer 5 (layer_norm 'ln') at tied.yaml:9:7, which has no weight "
                 "to share");
    expect_error("shape", variant("out: 11, bias: false", "out: 12, bias: false"), head,
                 "whose wte.weight (vocab, dim) is (11, 16), but this layer's weight is (out, "
                 "in) = (12, 16)");
    /* the head ties to a linear that itself ties to the embedding */
    expect_error("chain", variant("- linear: {out: 16}\n    - layer_norm: {eps: 1.0e-6}\n"
                                  "    - linear: {name: lm_head, out: 11, bias: false, tie: "
                                  "transformer}",
                                  "- linear: {out: 16}\n    - linear: {name: a, out: 11, tie: "
                                  "transformer}\n    - linear: {name: lm_head, out: 11, bias: "
                                  "false, tie: a}"),
                 "layer 6 (linear 'lm_head') at tied.yaml:10:7", "names layer 5 (linear 'a') at "
                 "tied.yaml:9:7, which itself ties to 'transformer'; tie to the layer that owns "
                 "the weight: tie: transformer");
}

int main(void)
{
    gp_device *devs[5];
    gpt_open_cpu_devices(devs, 5, 1);
    test_errors();
    test_one_device(devs[0]);
    test_transparency(devs);
    test_gpt_transparency(devs);
    test_selective_transparency(devs);
    test_clip_replicas(devs);
    test_snapshot(devs);
    for (int j = 0; j < 5; j++) gp_device_close(devs[j]);
    return gpt_finish("test_tied");
}
