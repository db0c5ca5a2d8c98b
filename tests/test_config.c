/*
 * test_config.c — the YAML config: a full file into the expected structs,
 * defaults and the list of defaults applied, every kind of error with its
 * file:line:column and hint, `--set` overrides, loading from disk, the
 * example configs in configs/, and a fuzz loop (random and mutated inputs
 * must return a status, never crash or leak; run under ASan/LSan in CI).
 */
#include "config/config.h"
#include "test.h"
#include <sys/stat.h>

#include <stdint.h>
#include <dirent.h>
#include <unistd.h>

#define NAME "t.yaml"

static gp_status parse_set(const char *text, const char *const *sets, int n, gp_config *c)
{
    return gp_config_parse(NAME, text, strlen(text), sets, n, c);
}

static gp_status parse(const char *text, gp_config *c) { return parse_set(text, NULL, 0, c); }

/* Parse, expect failure, free (a failed parse leaves nothing to free, but
 * gp_config_free must be harmless on it). */
static gp_status parse_bad(const char *text, const char *const *sets, int n)
{
    gp_config c;
    gp_status s = parse_set(text, sets, n, &c);
    gp_config_free(&c);
    return s;
}

/* A kernel, stride or padding of (h, w). */
static bool hw_is(gp_hw v, int64_t h, int64_t w) { return v.h == h && v.w == w; }

/* base + extra in a static buffer. */
static const char *cat(const char *a, const char *b)
{
    static char buf[8192];
    snprintf(buf, sizeof buf, "%s%s", a, b);
    return buf;
}

/* Eight lines: the model section of most tests. */
static const char *const k_base =
    "model:\n"                                     /* 1 */
    "  input: [1, 28, 28]\n"                       /* 2 */
    "  layers:\n"                                  /* 3 */
    "    - conv2d: {out: 8, kernel: 3, padding: 1}\n" /* 4 */
    "    - batchnorm\n"                            /* 5 */
    "    - relu\n"                                 /* 6 */
    "    - flatten\n"                              /* 7 */
    "    - linear: {out: 10}\n";                   /* 8 */

static const char *const k_full =
    "model:\n"                                                 /* 1 */
    "  input: [3, 32, 32]\n"                                   /* 2 */
    "  layers:\n"                                              /* 3 */
    "    - conv2d: {out: 32, kernel: 3, padding: 1, bias: false, name: c1}\n" /* 4 */
    "    - batchnorm: {momentum: 0.2, eps: 0.001, sync: true}\n" /* 5 */
    "    - relu\n"                                             /* 6 */
    "    - maxpool2d: {kernel: 2}\n"                           /* 7 */
    "    - residual: {out: 64, stride: 2}\n"                   /* 8 */
    "    - avgpool2d: {kernel: 3, stride: 1, padding: 1}\n"    /* 9 */
    "    - global_avgpool\n"                                   /* 10 */
    "    - flatten\n"                                          /* 11 */
    "    - dropout: {p: 0.25}\n"                               /* 12 */
    "    - linear: {in: 64, out: 10, bias: true}\n"            /* 13 */
    "  loss: cross_entropy\n"                                  /* 14 */
    "  init_from: weights.safetensors\n"                       /* 15 */
    "  label_smoothing: 0.1\n"                                 /* 16 */
    "pipeline:\n"                                              /* 17 */
    "  devices:\n"                                             /* 18 */
    "    - cpu:0\n"                                            /* 19 */
    "    - {name: cpu:1, memory: 1GiB, threads: 2}\n"          /* 20 */
    "  balance: [4, 6]\n"                                      /* 21 */
    "  chunks: 4\n"                                            /* 22 */
    "  checkpoint: always\n"                                   /* 23 */
    "  lockstep: false\n"                                      /* 24 */
    "  threads: 1\n"                                           /* 25 */
    "  memory: 512MiB\n"                                       /* 26 */
    "  replicas: 2\n"                                          /* 27 */
    "  schedule: 1f1b\n"                                       /* 28 */
    "  virtual: 1\n"                                           /* 29 */
    "  copy_precision: fp32\n"                                /* 30 */
    "  peer_timeout: 300\n"                                   /* 31 */
    "data:\n"
    "  dataset: cifar10\n"
    "  path: /data/cifar\n"
    "  shuffle: false\n"
    "  normalize: true\n"
    "  mean: [0.49, 0.48, 0.45]\n"
    "  std: [0.25, 0.24, 0.26]\n"
    "  augment: {crop_padding: 4, hflip: true}\n"
    "  prefetch: 3\n"
    "  train_limit: 5000\n"
    "  test_limit: 1000\n"
    "  synthetic: {train: 100, test: 50, classes: 5, shape: [3, 8, 8]}\n"
    "train:\n"
    "  epochs: 5\n"
    "  steps: 0\n"
    "  batch_size: 128\n"
    "  seed: 18446744073709551615\n"
    "  precision: bf16\n"
    "  deterministic: true\n"
    "  optimizer: {type: sgd, lr: 0.1, momentum: 0.8, nesterov: true, weight_decay: 0.0005,"
    " decay_bias_and_norm: true}\n"
    "  schedule: {type: step, warmup_steps: 100, warmup_start: 0.1, step_size: 500, gamma: 0.5,"
    " min_lr: 0.001}\n"
    "  lr_scaling: linear\n"
    "  base_batch: 256\n"
    "  log_every: 10\n"
    "  eval_each_epoch: false\n"
    "  eval_batch_size: 500\n"
    "  clip_grad_norm: 2.0\n"
    "  activations: bf16\n";

static void test_full(void)
{
    gp_config c;
    CHECK_OK(parse(k_full, &c));
    CHECK(!strcmp(c.path, NAME));
    CHECK(c.model.input[0] == 3 && c.model.input[1] == 32 && c.model.input[2] == 32);
    CHECK(c.model.n_layers == 10);
    if (c.model.n_layers == 10) {
        const gp_layer_spec *l = c.model.layers;
        CHECK(l[0].type == GP_LAYER_CONV2D && l[0].out == 32 && hw_is(l[0].kernel, 3, 3) &&
              hw_is(l[0].padding, 1, 1) && hw_is(l[0].stride, 1, 1) && !l[0].bias && l[0].in == 0);
        CHECK(!strcmp(l[0].name, "c1") && !strcmp(l[0].file, NAME));
        CHECK(l[0].line == 4 && l[0].column == 7);
        CHECK(l[1].type == GP_LAYER_BATCHNORM && l[1].sync);
        CHECK_NEAR(l[1].momentum, 0.2, 1e-7, 0);
        CHECK_NEAR(l[1].eps, 0.001, 1e-9, 0);
        CHECK(l[2].type == GP_LAYER_RELU && l[2].line == 6 && l[2].column == 7);
        CHECK(l[3].type == GP_LAYER_MAXPOOL2D && hw_is(l[3].kernel, 2, 2) &&
              hw_is(l[3].stride, 0, 0));
        CHECK(l[4].type == GP_LAYER_RESIDUAL && l[4].out == 64 && hw_is(l[4].stride, 2, 2));
        CHECK(l[5].type == GP_LAYER_AVGPOOL2D && hw_is(l[5].kernel, 3, 3) &&
              hw_is(l[5].stride, 1, 1) && hw_is(l[5].padding, 1, 1) && l[5].count_include_pad);
        CHECK(l[6].type == GP_LAYER_GLOBAL_AVGPOOL && l[7].type == GP_LAYER_FLATTEN);
        CHECK(l[8].type == GP_LAYER_DROPOUT);
        CHECK_NEAR(l[8].p, 0.25, 1e-7, 0);
        CHECK(l[9].type == GP_LAYER_LINEAR && l[9].in == 64 && l[9].out == 10 && l[9].bias);
        CHECK(l[9].line == 13);
    }
    CHECK(c.model.loss == GP_LOSS_CROSS_ENTROPY);
    CHECK(!strcmp(c.model.init_from, "weights.safetensors"));

    const gp_pipeline_config *p = &c.pipeline;
    CHECK(p->n_devices == 2);
    CHECK(!strcmp(p->devices[0].name, "cpu:0") && !strcmp(p->devices[1].name, "cpu:1"));
    CHECK(p->devices[0].memory == ((size_t)512 << 20) && p->devices[0].threads == 1);
    CHECK(p->devices[1].memory == ((size_t)1 << 30) && p->devices[1].threads == 2);
    CHECK(p->n_balance == 2 && p->balance[0] == 4 && p->balance[1] == 6);
    CHECK(p->chunks == 4 && p->checkpoint == GP_CKPT_ALWAYS && !p->lockstep);
    CHECK(p->schedule == GP_SCHEDULE_1F1B);
    CHECK(p->threads == 1 && p->memory == ((size_t)512 << 20) && p->replicas == 2);
    /* fp32 copies asked for: precision bf16 would otherwise make them bf16 */
    CHECK(p->copy_precision == GP_COPY_FP32 && !gp_config_bf16_copies(&c));
    CHECK(p->peer_timeout == 300);

    const gp_data_config *d = &c.data;
    CHECK(d->dataset == GP_DATASET_CIFAR10 && !strcmp(d->path, "/data/cifar"));
    CHECK(!d->shuffle && d->normalize && d->n_mean == 3);
    CHECK_NEAR(d->mean[2], 0.45, 1e-7, 0);
    CHECK_NEAR(d->std[1], 0.24, 1e-7, 0);
    CHECK(d->crop_padding == 4 && d->hflip && d->prefetch == 3);
    CHECK(d->train_limit == 5000 && d->test_limit == 1000);
    CHECK(d->synthetic_train == 100 && d->synthetic_test == 50 && d->synthetic_classes == 5);
    CHECK(d->synthetic_shape[0] == 3 && d->synthetic_shape[1] == 8 && d->synthetic_shape[2] == 8);

    const gp_train_config *t = &c.train;
    CHECK(t->epochs == 5 && t->steps == 0 && t->batch_size == 128);
    CHECK(t->seed == UINT64_MAX);
    CHECK(t->precision == 2); /* bf16 (gp_precision, backend.h) */
    CHECK(t->deterministic);
    CHECK(!strcmp(t->optim.type, "sgd"));
    CHECK_NEAR(t->optim.lr, 0.1, 1e-7, 0);
    CHECK_NEAR(t->optim.momentum, 0.8, 1e-7, 0);
    CHECK(t->optim.nesterov && t->optim.decay_bias_and_norm);
    CHECK_NEAR(t->optim.weight_decay, 0.0005, 1e-9, 0);
    CHECK(t->sched.kind == GP_SCHED_STEP && t->sched.warmup_steps == 100 &&
          t->sched.step_size == 500);
    CHECK_NEAR(t->sched.warmup_start, 0.1, 1e-7, 0);
    CHECK_NEAR(t->sched.gamma, 0.5, 1e-7, 0);
    CHECK_NEAR(t->sched.min_lr, 0.001, 1e-9, 0);
    CHECK(t->lr_scaling == GP_LR_SCALING_LINEAR && t->base_batch == 256);
    CHECK(t->log_every == 10 && !t->eval_each_epoch && t->eval_batch_size == 500);
    CHECK_NEAR(t->clip_grad_norm, 2.0, 1e-7, 0);
    CHECK(t->activations == GP_ACT_BF16 && gp_config_act_dtype(&c) == GP_BF16);
    CHECK_NEAR(c.model.label_smoothing, 0.1, 1e-7, 0);
    /* everything was given (only the layer fields and synthetic defaults are
     * not), so no top-level default was applied */
    CHECK(c.defaults_applied && !strstr(c.defaults_applied, "(default)"));
    gp_config_free(&c);
    gp_config_free(&c); /* twice is harmless */
    CHECK(c.model.layers == NULL && c.defaults_applied == NULL);
}

static void test_defaults(void)
{
    gp_config c;
    CHECK_OK(parse(k_base, &c));
    CHECK(c.model.n_layers == 5);
    CHECK(hw_is(c.model.layers[0].stride, 1, 1) && c.model.layers[0].bias);
    CHECK_NEAR(c.model.layers[1].momentum, 0.1, 1e-7, 0);
    CHECK_NEAR(c.model.layers[1].eps, 1e-5, 1e-9, 0);
    CHECK(c.model.layers[4].line == 8 && c.model.layers[4].column == 7);
    CHECK(c.model.loss == GP_LOSS_CROSS_ENTROPY && c.model.init_from[0] == '\0');
    CHECK(c.pipeline.n_devices == 1 && !strcmp(c.pipeline.devices[0].name, "cpu:0"));
    CHECK(c.pipeline.n_balance == 0 && c.pipeline.chunks == 1);
    CHECK(c.pipeline.checkpoint == GP_CKPT_EXCEPT_LAST && c.pipeline.lockstep);
    CHECK(c.pipeline.checkpoint_keep == 0);
    CHECK(c.pipeline.schedule == GP_SCHEDULE_GPIPE);
    CHECK(c.pipeline.threads == 0 && c.pipeline.memory == 0 && c.pipeline.replicas == 1);
    CHECK(c.data.dataset == GP_DATASET_FASHION_MNIST);
    CHECK(!strcmp(c.data.path, "/usr/share/datasets/fashion-mnist"));
    CHECK(c.data.shuffle && c.data.normalize && c.data.n_mean == 0);
    CHECK(c.data.crop_padding == 0 && !c.data.hflip && c.data.prefetch == 2);
    CHECK(c.data.train_limit == 0 && c.data.test_limit == 0);
    CHECK(c.data.synthetic_train == 1024 && c.data.synthetic_test == 256 &&
          c.data.synthetic_classes == 10);
    CHECK(c.data.synthetic_shape[0] == 1 && c.data.synthetic_shape[1] == 28);
    CHECK(c.train.epochs == 1 && c.train.steps == 0 && c.train.batch_size == 64);
    CHECK(c.train.seed == 0 && !strcmp(c.train.optim.type, "sgd"));
    CHECK(c.train.precision == 0 && !c.train.deterministic);
    CHECK(c.pipeline.copy_precision == GP_COPY_AUTO && !gp_config_bf16_copies(&c));
    CHECK(c.pipeline.peer_timeout == GP_PEER_TIMEOUT_DEFAULT);
    c.train.precision = GP_PRECISION_BF16; /* auto follows the precision (below) */
    CHECK(!gp_config_bf16_copies(&c));     /* bf16 storage travels as it is */
    c.train.precision = GP_PRECISION_TF32;
    CHECK(!gp_config_bf16_copies(&c));
    /* train.activations: auto follows the precision on every device kind
     * (bf16 storage under bf16, then nothing is packed to travel); fp32
     * keeps FP32 storage under bf16 (its copies then travel packed); bf16
     * stores bf16 under any precision */
    CHECK(c.train.activations == GP_ACT_AUTO && gp_config_act_dtype(&c) == GP_F32);
    c.train.precision = GP_PRECISION_BF16;
    CHECK(gp_config_act_dtype(&c) == GP_BF16 && !gp_config_bf16_copies(&c)); /* cpu:0 */
    c.train.activations = GP_ACT_FP32;
    CHECK(gp_config_act_dtype(&c) == GP_F32 && gp_config_bf16_copies(&c));
    c.train.activations = GP_ACT_AUTO;
    {
        gp_pipeline_config keep = c.pipeline;
        c.pipeline.n_devices = 2;
        snprintf(c.pipeline.devices[0].name, sizeof c.pipeline.devices[0].name, "cuda:0");
        snprintf(c.pipeline.devices[1].name, sizeof c.pipeline.devices[1].name, "cuda:1");
        CHECK(gp_config_act_dtype(&c) == GP_BF16 && !gp_config_bf16_copies(&c));
        c.train.precision = GP_PRECISION_TF32;
        CHECK(gp_config_act_dtype(&c) == GP_F32);
        c.train.precision = GP_PRECISION_BF16;
        c.train.activations = GP_ACT_FP32;
        CHECK(gp_config_act_dtype(&c) == GP_F32 && gp_config_bf16_copies(&c));
        c.train.activations = GP_ACT_AUTO;
        snprintf(c.pipeline.devices[1].name, sizeof c.pipeline.devices[1].name, "cpu:0");
        CHECK(gp_config_act_dtype(&c) == GP_BF16); /* a CPU among them too */
        c.pipeline = keep;
    }
    c.train.activations = GP_ACT_BF16;
    CHECK(gp_config_act_dtype(&c) == GP_BF16 && !gp_config_bf16_copies(&c));
    c.train.precision = 0;
    CHECK(gp_config_act_dtype(&c) == GP_BF16 && !gp_config_bf16_copies(&c));
    c.train.activations = GP_ACT_AUTO;
    c.train.precision = 0;
    CHECK_NEAR(c.train.optim.lr, 0.01, 1e-9, 0);
    CHECK_NEAR(c.train.optim.momentum, 0.9, 1e-7, 0);
    CHECK(!c.train.optim.nesterov && c.train.optim.weight_decay == 0.0f);
    CHECK(!c.train.optim.decay_bias_and_norm);
    CHECK(c.train.sched.kind == GP_SCHED_CONSTANT && c.train.sched.warmup_steps == 0);
    CHECK_NEAR(c.train.sched.gamma, 0.1, 1e-7, 0);
    CHECK(c.train.lr_scaling == GP_LR_SCALING_NONE && c.train.base_batch == 64);
    CHECK(c.train.log_every == 50 && c.train.eval_each_epoch && c.train.eval_batch_size == 0);
    const char *d = c.defaults_applied ? c.defaults_applied : "";
    CHECK(strstr(d, "train.batch_size = 64 (default)\n") != NULL);
    CHECK(strstr(d, "pipeline.chunks = 1 (default)\n") != NULL);
    CHECK(strstr(d, "pipeline.checkpoint = except_last (default)\n") != NULL);
    CHECK(strstr(d, "pipeline.devices = [cpu:0] (default)\n") != NULL);
    CHECK(strstr(d, "data.dataset = fashion-mnist (default)\n") != NULL);
    CHECK(strstr(d, "data.path = /usr/share/datasets/fashion-mnist (default)\n") != NULL);
    CHECK(strstr(d, "train.optimizer.lr = 0.01 (default)\n") != NULL);
    CHECK(strstr(d, "train.epochs = 1 (default)\n") != NULL);
    /* whether snapshots are on, and where the weights come from */
    CHECK(strstr(d, "train.snapshot: off (default; ") != NULL);
    CHECK(strstr(d, "model.init_from: none (default") != NULL);
    /* layer fields and options of unused features are not listed */
    CHECK(strstr(d, "layers") == NULL && strstr(d, "synthetic") == NULL);
    CHECK(strstr(d, "step_size") == NULL);
    gp_config_free(&c);

    /* per-dataset default paths; steps instead of epochs; null = default */
    CHECK_OK(parse(cat(k_base, "data: {dataset: mnist}\ntrain: {steps: 20, epochs: 2, "
                                "batch_size: ~}\npipeline:\n"), &c));
    CHECK(!strcmp(c.data.path, "/usr/share/datasets/mnist"));
    CHECK(c.train.steps == 20 && c.train.batch_size == 64);
    CHECK(c.defaults_applied && strstr(c.defaults_applied, "train.epochs = 2 is ignored"));
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "data: {dataset: cifar10}\n"), &c));
    CHECK(!strcmp(c.data.path, "data/cifar-10-batches-bin"));
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "data: {dataset: synthetic}\n"), &c));
    CHECK(c.data.path[0] == '\0');
    CHECK(c.defaults_applied && strstr(c.defaults_applied, "data.synthetic.classes = 10"));
    gp_config_free(&c);

    /* shorthands: a flat input, a device count, optimizer/schedule by name,
     * memory as bytes, a single mean/std, balance auto */
    const char *flat =
        "model:\n  input: 784\n  layers: [{linear: {out: 10}}, relu, {linear: {out: 10}}]\n"
        "pipeline: {devices: 3, memory: 4096, balance: auto}\n"
        "data: {mean: 0.5, std: 0.25}\n"
        "train: {optimizer: sgd, schedule: cosine, batch_size: 8}\n";
    CHECK_OK(parse(flat, &c));
    CHECK(c.model.input[0] == 784 && c.model.input[1] == 1 && c.model.input[2] == 1);
    CHECK(c.pipeline.n_devices == 3 && !strcmp(c.pipeline.devices[2].name, "cpu:2"));
    CHECK(c.pipeline.memory == 4096 && c.pipeline.devices[1].memory == 4096);
    CHECK(c.pipeline.n_balance == 0);
    CHECK(c.data.n_mean == 1 && c.data.mean[0] == 0.5f && c.data.std[0] == 0.25f);
    CHECK(c.train.sched.kind == GP_SCHED_COSINE);
    CHECK_MSG(c.warnings && !strstr(c.warnings, "0-255"), "warnings: %s", c.warnings);
    gp_config_free(&c);
    /* statistics on the 0-255 scale: valid, most likely a mistake (the
     * pixels are in [0, 1]): a warning with the value to give */
    const char *big = "model:\n  input: [3, 8, 8]\n  layers: [flatten, {linear: {out: 10}}]\n"
                      "data: {mean: [124, 116, 104], std: [0.2, 0.2, 0.2]}\n";
    CHECK_OK(parse(big, &c));
    CHECK_MSG(c.warnings && strstr(c.warnings, "data.mean has 124, which looks like the 0-255 "
                                               "scale") && strstr(c.warnings, "0.4863"),
              "warnings: %s", c.warnings);
    gp_config_free(&c);

    /* anchors and aliases */
    const char *alias =
        "model:\n  input: [4]\n  layers:\n    - linear: &l {out: 16}\n    - relu\n"
        "    - linear: *l\n";
    CHECK_OK(parse(alias, &c));
    CHECK(c.model.n_layers == 3 && c.model.layers[2].out == 16);
    gp_config_free(&c);

    CHECK(!strcmp(gp_checkpoint_mode_name(GP_CKPT_EXCEPT_LAST), "except_last"));
    CHECK(!strcmp(gp_dataset_name(GP_DATASET_FASHION_MNIST), "fashion-mnist"));
}

/* pipeline.lockstep's default follows the schedule (gp_lockstep_default):
 * lockstep for gpipe's fill-drain, free-running for every other schedule,
 * whose lists reorder work across clocks; written, it holds for any, and
 * written null (or empty) it is not written (it counted as set: every
 * schedule simulated in lockstep). */
static void test_lockstep_default(void)
{
    static const char *const names[] = {"gpipe", "1f1b", "zb-h1", "interleaved",
                                        "zb-v", "dualpipe-v", "v-half", "v-min"};
    _Static_assert(sizeof names / sizeof *names == GP_SCHEDULE_KINDS, "every schedule");
    for (int k = 0; k < GP_SCHEDULE_KINDS; k++)
        for (int given = 0; given < 3; given++) { /* unset, true, false */
            char sched[64];
            snprintf(sched, sizeof sched, "pipeline.schedule=%s", names[k]);
            const char *sets[] = {"pipeline.devices=[cpu:0, cpu:1]", "pipeline.chunks=4", sched,
                                  given == 1 ? "pipeline.lockstep=true"
                                             : "pipeline.lockstep=false"};
            gp_config c;
            CHECK_OK(parse_set(k_base, sets, given ? 4 : 3, &c));
            CHECK(c.pipeline.schedule == (gp_schedule_kind)k);
            bool want = given ? given == 1 : k == GP_SCHEDULE_GPIPE;
            if (c.pipeline.lockstep != want || c.pipeline.lockstep_given != (given != 0))
                fprintf(stderr, "  schedule %s, lockstep %s: got %d (given %d)\n", names[k],
                        given ? sets[3] : "unset", c.pipeline.lockstep,
                        c.pipeline.lockstep_given);
            CHECK(c.pipeline.lockstep == want);
            CHECK(c.pipeline.lockstep_given == (given != 0));
            gp_config_free(&c);
        }
    for (int k = 0; k < 2; k++) {
        const char *sets[] = {"pipeline.devices=[cpu:0, cpu:1]", "pipeline.schedule=zb-v",
                              k ? "pipeline.lockstep=~" : "pipeline.lockstep=null"};
        gp_config c;
        CHECK_OK(parse_set(k_base, sets, 3, &c));
        CHECK_MSG(!c.pipeline.lockstep_given && !c.pipeline.lockstep, "%s: given %d, %d",
                  sets[2], c.pipeline.lockstep_given, c.pipeline.lockstep);
        gp_config_free(&c);
    }
}

/* stash / pop in YAML: parsed into the specs, and every misuse an error at
 * file:line:column naming the layers */
static void test_skips(void)
{
    static const char *const k_skips =
        "model:\n"                                                /* 1 */
        "  input: [1, 8, 8]\n"                                    /* 2 */
        "  layers:\n"                                             /* 3 */
        "    - conv2d: {out: 4, kernel: 3, padding: 1, stash: a}\n" /* 4 */
        "    - relu: {stash: b}\n"                                /* 5 */
        "    - add: {pop: b}\n"                                   /* 6 */
        "    - add: {pop: a, out: 4, stride: 1}\n"                /* 7 */
        "    - identity: {stash: c}\n"                            /* 8 */
        "    - concat: {pop: [c]}\n"                              /* 9 */
        "    - flatten\n"                                         /* 10 */
        "    - linear: {out: 3}\n";                               /* 11 */
    gp_config c;
    CHECK_OK(parse_set(k_skips, NULL, 0, &c));
    CHECK(c.model.n_layers == 8);
    CHECK(!strcmp(c.model.layers[0].stash, "a") && c.model.layers[0].n_pop == 0);
    CHECK(c.model.layers[2].type == GP_LAYER_ADD && c.model.layers[2].n_pop == 1 &&
          !strcmp(c.model.layers[2].pop[0], "b") && c.model.layers[2].out == 0);
    CHECK(c.model.layers[3].out == 4 && !strcmp(c.model.layers[3].pop[0], "a"));
    CHECK(c.model.layers[5].type == GP_LAYER_CONCAT && !strcmp(c.model.layers[5].pop[0], "c"));
    gp_config_free(&c);
    const char *head = "model:\n  input: [1, 8, 8]\n  layers:\n";
    CHECK_ERR(parse_bad(cat(head, "    - relu\n    - add: {pop: x}\n    - flatten\n"), NULL, 0),
              GP_ERR_INVALID, "layer 1 (add) at t.yaml:5:7: pops 'x', but no layer stashes it");
    CHECK_ERR(parse_bad(cat(head, "    - add: {pop: x}\n    - relu: {stash: x}\n"), NULL, 0),
              GP_ERR_INVALID, "layer 0 (add) at t.yaml:4:7: pops 'x' before layer 1 (relu) at "
                              "t.yaml:5:7 stashes it");
    CHECK_ERR(parse_bad(cat(head, "    - relu: {stash: x}\n    - flatten\n"), NULL, 0),
              GP_ERR_INVALID, "layer 0 (relu) at t.yaml:4:7: stashes 'x', but no later layer "
                              "pops it");
    CHECK_ERR(parse_bad(cat(head, "    - relu: {pop: x}\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:14: unknown option 'pop' for layer 0 (relu) (it takes: stash, name)");
    CHECK_ERR(parse_bad(cat(head, "    - concat\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:7: layer 0 (concat) needs 'pop'");
    CHECK_ERR(parse_bad(cat(head, "    - concat: {pop: [a, b, c]}\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:21: model.layers.0.pop lists 3 names");
    CHECK_ERR(parse_bad(cat(head, "    - concat: {pop: {a: 1}}\n"), NULL, 0), GP_ERR_INVALID,
              "model.layers.0.pop must be the name of a stash");
}

static void test_errors(void)
{
    /* unknown keys, with the three kinds of hint */
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  lr: 0.1\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:3: unknown key 'lr' in train; did you mean 'optimizer.lr'?");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  epoch: 3\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:3: unknown key 'epoch' in train; did you mean 'epochs'?");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  chunks: 3\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:3: unknown key 'chunks' in train; did you mean 'pipeline.chunks'?");
    CHECK_ERR(parse_bad(cat(k_base, "trian:\n  epochs: 3\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:9:1: unknown key 'trian' at the top level; did you mean 'train'?");
    /* a key written as a path (Hydra's habit) is one name to YAML, which no
     * getter reads: it used to pass the key check (its joined path is in
     * the table) and be ignored, snapshots left off under every_steps */
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer.lr: 0.5\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:3: key 'optimizer.lr' in train is a path, which YAML "
              "reads as one name that nothing reads; write it nested, optimizer: {lr: ...}, or "
              "on the command line --set train.optimizer.lr=...");
    CHECK_ERR(parse_bad(cat(k_base, "train.snapshot.every_steps: 1\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:9:1: key 'train.snapshot.every_steps' at the top level "
              "is a path");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  snapshot: {dir.x: 1}\n"), NULL, 0),
              GP_ERR_INVALID, "key 'dir.x' in train.snapshot is a path");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  balance.0: 3\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:3: key 'balance.0' in pipeline is a path, which YAML reads as one name "
              "that nothing reads; a list item's key is set on the command line: --set "
              "pipeline.balance.0=...");
    /* a short word near no key of its section is no other section's key
     * ("nope" is one letter from pipeline's "mode"): the section's keys */
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  nope: 3\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:3: unknown key 'nope' in train; the keys in train are: epochs, steps");
    /* a look-alike letter from another alphabet, or an invisible one: the
     * name looks right, so the message says which character is not ASCII */
    CHECK_ERR(parse_bad(cat(k_base, "tr\xd0\xb0in:\n  epochs: 3\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:9:1: unknown key 'tr\xd0\xb0in' at the top level; did you mean 'train'? Its "
              "character 3 is U+0430 CYRILLIC SMALL LETTER A (looks like 'a'), not ASCII");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  epochs\xe2\x80\x8b: 3\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:3: unknown key 'epochs\xe2\x80\x8b' in train; did you "
              "mean 'epochs'? Its character 7 is U+200B ZERO WIDTH SPACE (looks like nothing), "
              "not ASCII");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: \xd0\xb0" "damw\n"), NULL, 0),
              GP_ERR_INVALID, "Its character 1 is U+0430 CYRILLIC SMALL LETTER A (looks like "
                              "'a'), not ASCII");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - r\xd0\xb5lu\n", NULL, 0),
              GP_ERR_INVALID, "Its character 2 is U+0435 CYRILLIC SMALL LETTER IE (looks like "
                              "'e'), not ASCII");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - relu: {st\xef\xbd\x81sh: x}\n",
                        NULL, 0),
              GP_ERR_INVALID, "character 3 is U+FF41 (a fullwidth 'a'), not ASCII");
    /* a name that differs only in case is the suggestion, before a typo of
     * another ("adam" is as near to "adamW" as "adamw" is) */
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: adamW\n"), NULL, 0), GP_ERR_INVALID,
              "did you mean 'adamw'?");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {type: sgd, lr: 1, mom: 0.9}\n"),
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:33: unknown key 'mom' in train.optimizer; did you "
                              "mean 'momentum'?");
    CHECK_ERR(parse_bad(cat(k_base, "learning_rate: 0.1\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:9:1: unknown key 'learning_rate' at the top level; did you mean "
              "'train.optimizer.lr'?");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline: {micro_batches: 4}\n"), NULL, 0),
              GP_ERR_INVALID, "unknown key 'micro_batches' in pipeline; did you mean 'chunks'?");
    CHECK_ERR(parse_bad(cat(k_base, "train: {optimizer: {wd: 0.1}}\n"), NULL, 0),
              GP_ERR_INVALID, "did you mean 'weight_decay'?");
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  zzzzzzzz: 1\n"), NULL, 0), GP_ERR_INVALID,
              "unknown key 'zzzzzzzz' in data; the keys in data are: dataset, path,");
    /* wrong types */
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  batch_size: abc\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:15: expected an integer for train.batch_size, got 'abc'");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  batch_size: [1, 2]\n"), NULL, 0),
              GP_ERR_INVALID, "expected an integer for train.batch_size, got a list");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {lr: fast}\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:19: expected a number for train.optimizer.lr, got 'fast'");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {lr: 1e999}\n"), NULL, 0),
              GP_ERR_INVALID, "train.optimizer.lr is 1e999, beyond the 32-bit float gpipe keeps "
                              "it in");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {lr: inf}\n"), NULL, 0),
              GP_ERR_INVALID, "expected a finite number for train.optimizer.lr");
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  shuffle: maybe\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:12: expected true or false for data.shuffle, got 'maybe'");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  seed: -1\n"), NULL, 0), GP_ERR_INVALID,
              "expected a non-negative integer for train.seed, got '-1'");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  batch_size: 99999999999999999999\n"), NULL, 0),
              GP_ERR_INVALID, "train.batch_size must be <= 16777216, got 99999999999999999999");
    {
        const char *dev_mem[] = {"pipeline.devices.0.memory=1MiB"};
        CHECK_ERR(parse_bad(cat(k_base, "pipeline: {devices: [cpu:0, cpu:1]}\n"), dev_mem, 1),
                  GP_ERR_INVALID, "--set 'pipeline.devices.0={name: cpu:0, memory: ...}'");
    }
    CHECK_ERR(parse_bad(cat(k_base, "pipeline: {schedule: ZB-H1}\n"), NULL, 0), GP_ERR_INVALID,
              "did you mean 'zb-h1'?"); /* only the case differs */
    CHECK_ERR(parse_bad(cat(k_base, "train: {<<: {steps: 3}}\n"), NULL, 0), GP_ERR_INVALID,
              "merge keys ('<<: *anchor') are not supported");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  steps: -99999999999999999999\n"), NULL, 0),
              GP_ERR_INVALID, "train.steps must be >= ");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline: [1]\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:9:11: expected a map for pipeline, like {devices: [cpu:0, cpu:1], "
              "chunks: 4}, got a list");
    /* out of range */
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  batch_size: 0\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:15: train.batch_size must be >= 1, got 0");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  chunks: 0\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:11: pipeline.chunks must be >= 1, got 0");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {momentum: 1.5}\n"), NULL, 0),
              GP_ERR_INVALID, "train.optimizer.momentum must be in [0, 1), got 1.5");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  chunks: 100\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:11: pipeline.chunks (100) must be <= train.batch_size (64)");
    /* the interleaved schedule's shape, named at its line before any step */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0, cpu:1, cpu:2]\n  schedule: "
                                    "interleaved\n  chunks: 4\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:12:11: pipeline.schedule: interleaved needs 2 or more devices "
                              "and pipeline.chunks a multiple of their number (got 3 devices, "
                              "chunks 4); set chunks to a multiple of the devices");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  schedule: interleaved\n"), NULL, 0),
              GP_ERR_INVALID, "(got 1 device, chunks 1); list more devices or use another "
                              "schedule");
    {
        gp_config c;
        CHECK_OK(parse(cat(k_base, "pipeline:\n  devices: [cpu:0, cpu:1]\n  schedule: "
                                   "interleaved\n  chunks: 4\n"), &c));
        gp_config_free(&c);
    }
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {momentum: 0, nesterov: true}\n"),
                        NULL, 0),
              GP_ERR_INVALID, "train.optimizer.nesterov needs momentum > 0");
    /* Adam and AdamW: PyTorch's defaults, their own keys, SGD's refused */
    {
        gp_config c;
        CHECK_OK(parse(cat(k_base, "train:\n  optimizer: adamw\n"), &c));
        CHECK(c.train.optim.kind == 2 && !strcmp(c.train.optim.type, "adamw"));
        CHECK_NEAR(c.train.optim.lr, 1e-3, 1e-10, 0);
        CHECK_NEAR(c.train.optim.weight_decay, 0.01, 1e-9, 0);
        CHECK_NEAR(c.train.optim.beta1, 0.9, 1e-7, 0);
        CHECK_NEAR(c.train.optim.beta2, 0.999, 1e-7, 0);
        CHECK_NEAR(c.train.optim.eps, 1e-8, 1e-15, 0);
        CHECK(c.train.optim.momentum == 0.0f && !c.train.optim.nesterov);
        const char *d = c.defaults_applied ? c.defaults_applied : "";
        CHECK(strstr(d, "train.optimizer.betas = [0.9, 0.999] (default)") != NULL);
        CHECK(strstr(d, "train.optimizer.momentum") == NULL);
        gp_config_free(&c);
        CHECK_OK(parse(cat(k_base, "train:\n  optimizer: {type: adam, lr: 0.0003, betas: [0.8, "
                                   "0.99], eps: 1e-6}\n"), &c));
        CHECK(c.train.optim.kind == 1 && c.train.optim.weight_decay == 0.0f);
        CHECK_NEAR(c.train.optim.beta1, 0.8, 1e-7, 0);
        CHECK_NEAR(c.train.optim.beta2, 0.99, 1e-7, 0);
        CHECK_NEAR(c.train.optim.eps, 1e-6, 1e-13, 0);
        d = c.defaults_applied ? c.defaults_applied : "";
        CHECK(strstr(d, "train.optimizer.betas") == NULL); /* given, not a default */
        gp_config_free(&c);
        CHECK_OK(parse(k_base, &c)); /* SGD records no Adam keys */
        d = c.defaults_applied ? c.defaults_applied : "";
        CHECK(strstr(d, "train.optimizer.betas") == NULL && strstr(d, "train.optimizer.eps") == NULL);
        gp_config_free(&c);
    }
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {type: adam, momentum: 0.9}\n"), NULL,
                        0),
              GP_ERR_INVALID, "t.yaml:10:37: train.optimizer.momentum is for sgd; type adam takes "
                              "betas: [b1, b2] and eps");
    {
        /* the type from --set over the file's momentum: both named */
        const char *to_adam[] = {"train.optimizer.type=adam"};
        CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {momentum: 0.9}\n"), to_adam, 1),
                  GP_ERR_INVALID, "train.optimizer.momentum is for sgd; type adam takes betas: "
                                  "[b1, b2] and eps (the type comes from --set "
                                  "train.optimizer.type=adam; to change the optimizer replace "
                                  "the whole map, e.g. --set 'train.optimizer={type: adam, lr: "
                                  "0.001}')");
    }
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {betas: [0.9, 0.99]}\n"), NULL, 0),
              GP_ERR_INVALID, "train.optimizer.betas is for adam and adamw; type sgd takes "
                              "momentum and nesterov");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {type: adamw, betas: [0.9, 1]}\n"), NULL,
                        0),
              GP_ERR_INVALID, "train.optimizer.betas.1");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {type: adamw, betas: 0.9}\n"), NULL, 0),
              GP_ERR_INVALID, "train.optimizer.betas must be a pair [b1, b2]");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {type: adamw, eps: 0}\n"), NULL, 0),
              GP_ERR_INVALID, "train.optimizer.eps");
    /* values within range as written that leave it as floats */
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {type: adamw, eps: 1e-50}\n"), NULL,
                        0),
              GP_ERR_INVALID, "train.optimizer.eps is 1e-50, below the smallest normal value of "
                              "the 32-bit float gpipe keeps it in (1.2e-38); give a value of at "
                              "least 1.2e-38");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {type: adamw, eps: 1e-44}\n"), NULL,
                        0),
              GP_ERR_INVALID, "train.optimizer.eps is 1e-44, below the smallest normal");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {type: adam, betas: [0.9, "
                                    "0.99999999]}\n"), NULL, 0),
              GP_ERR_INVALID, "train.optimizer.betas.1 is 0.99999999, which rounds to 1 in the "
                              "32-bit float");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: {momentum: 0.99999999}\n"), NULL, 0),
              GP_ERR_INVALID, "train.optimizer.momentum is 0.99999999, which rounds to 1");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  clip_grad_norm: 1e-50\n"), NULL, 0),
              GP_ERR_INVALID, "train.clip_grad_norm is 1e-50, below the smallest normal value "
                              "of the 32-bit float gpipe keeps it in (1.2e-38); give 0 or a value "
                              "of at least 1.2e-38");
    {
        /* pipeline.schedule is no typed map: no {type: ...} hint */
        const char *sch[] = {"pipeline.schedule=1f1b", "pipeline.schedule.virtual=2"};
        CHECK_ERR(parse_bad(k_base, sch, 2), GP_ERR_INVALID,
                  "'pipeline.schedule' is a single value ('1f1b'), not a map; cannot set "
                  "'virtual' inside it");
    }
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  optimizer: rmsprop\n"), NULL, 0),
              GP_ERR_INVALID, "(allowed: sgd, adam, adamw)");
    {
        gp_config c;
        CHECK_OK(parse(k_base, &c));
        CHECK(c.train.clip_grad_norm == 0.0f); /* off by default */
        gp_config_free(&c);
        CHECK_OK(parse(cat(k_base, "train:\n  clip_grad_norm: 1.5\n"), &c));
        CHECK_NEAR(c.train.clip_grad_norm, 1.5, 1e-7, 0);
        gp_config_free(&c);
    }
    {
        gp_config c;
        const char *ls[] = {"model.label_smoothing=0.1"};
        CHECK_OK(parse_set(k_base, ls, 1, &c));
        CHECK_NEAR(c.model.label_smoothing, 0.1, 1e-7, 0);
        gp_config_free(&c);
        CHECK_OK(parse(k_base, &c));
        CHECK(c.model.label_smoothing == 0.0f);
        gp_config_free(&c);
        const char *one[] = {"model.label_smoothing=1"};
        CHECK_ERR(parse_bad(k_base, one, 1), GP_ERR_INVALID, "model.label_smoothing");
        const char *bce[] = {"model.loss=bce_with_logits", "model.label_smoothing=0.1"};
        CHECK_ERR(parse_bad(k_base, bce, 2), GP_ERR_INVALID,
                  "model.label_smoothing is for model.loss: cross_entropy");
    }
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  clip_grad_norm: -1\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:19: train.clip_grad_norm");
    /* selective recompute: checkpoint: {mode, keep} */
    {
        gp_config c;
        CHECK_OK(parse(cat(k_base, "pipeline:\n  checkpoint: {mode: always, keep: [linear, "
                                   "attention, linear]}\n"), &c));
        CHECK(c.pipeline.checkpoint == GP_CKPT_ALWAYS &&
              c.pipeline.checkpoint_keep == (1u << GP_LAYER_LINEAR | 1u << GP_LAYER_ATTENTION));
        gp_config_free(&c);
        CHECK_OK(parse(cat(k_base, "pipeline:\n  checkpoint: {keep: [rms_norm]}\n"), &c));
        CHECK(c.pipeline.checkpoint == GP_CKPT_EXCEPT_LAST &&
              c.pipeline.checkpoint_keep == 1u << GP_LAYER_RMS_NORM);
        gp_config_free(&c);
        CHECK_OK(parse(cat(k_base, "pipeline:\n  checkpoint: {mode: never}\n"), &c));
        CHECK(c.pipeline.checkpoint == GP_CKPT_NEVER && c.pipeline.checkpoint_keep == 0);
        gp_config_free(&c);
    }
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  checkpoint: {mode: always, keep: [lineer]}\n"),
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:37: unknown value 'lineer' for "
                              "pipeline.checkpoint.keep.0 (allowed: linear, conv2d,");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  checkpoint: {mode: always, keep: [lineer]}\n"),
                        NULL, 0),
              GP_ERR_INVALID, "rope); did you mean 'linear'?");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  checkpoint: {mode: always, keeps: [add]}\n"),
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:30: unknown key 'keeps' in pipeline.checkpoint; did "
                              "you mean 'keep'?");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  checkpoint: {mode: always, keep: linear}\n"),
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:36: pipeline.checkpoint.keep: expected a list of layer "
                              "types");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  checkpoint: {mode: never, keep: [add]}\n"),
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:35: pipeline.checkpoint.keep applies to checkpointed "
                              "micro-batches, and mode never checkpoints none");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  checkpoint: {mode: sometimes}\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:22: unknown value 'sometimes' for "
                              "pipeline.checkpoint.mode (allowed: always, except_last, never)");
    /* unknown enum values list the allowed ones */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  checkpoint: sometimes\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:15: unknown value 'sometimes' for pipeline.checkpoint "
                              "(allowed: always, except_last, never)");
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  activations: fp16\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:16: unknown value 'fp16' for train.activations "
                              "(allowed: auto, fp32, bf16)");
    gp_config ca;
    CHECK_OK(parse(cat(k_base, "train:\n  activations: bf16\n"), &ca));
    CHECK(ca.train.activations == GP_ACT_BF16 && gp_config_act_dtype(&ca) == GP_BF16);
    gp_config_free(&ca);
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  copy_precision: fp16\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:19: unknown value 'fp16' for pipeline.copy_precision "
                              "(allowed: auto, fp32, bf16)");
    /* the watchdog's timeout (processes): seconds, > 0 */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  peer_timeout: 0\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:17: pipeline.peer_timeout");
    {
        gp_config c;
        CHECK_OK(parse(cat(k_base, "pipeline:\n  peer_timeout: 2.5\n"), &c));
        CHECK(c.pipeline.peer_timeout == 2.5);
        gp_config_free(&c);
    }
    CHECK_ERR(parse_bad(cat(k_base, "train:\n  schedule: {type: cosin}\n"), NULL, 0),
              GP_ERR_INVALID, "(allowed: constant, step, cosine); did you mean 'cosine'?");
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  dataset: fashion_mnist\n"), NULL, 0),
              GP_ERR_INVALID, "did you mean 'fashion-mnist'?");
    /* layers */
    CHECK_ERR(parse_bad("model:\n  input: [1, 2, 2]\n  layers:\n    - conv: {out: 3}\n", NULL,
                        0),
              GP_ERR_INVALID, "t.yaml:4:7: unknown layer type 'conv'; did you mean 'conv2d'?");
    CHECK_ERR(parse_bad("model:\n  input: [1, 2, 2]\n  layers:\n    - pool\n", NULL, 0),
              GP_ERR_INVALID, "unknown layer type 'pool'; did you mean 'maxpool2d'? (layer "
                              "types: linear, conv2d,");
    CHECK_ERR(parse_bad("model:\n  input: [1, 2, 2]\n  layers:\n    - rleu\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:4:7: unknown layer type 'rleu'; did you mean 'relu'?");
    CHECK_ERR(parse_bad("model:\n  input: [1, 2, 2]\n  layers:\n    - conv2d: {out: 3, "
                        "kernal: 3}\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:4:24: unknown option 'kernal' for layer 0 (conv2d); "
                              "did you mean 'kernel'?");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - linear: {out: 0}\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:4:21: model.layers.0.out must be >= 1, got 0");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - relu\n    - linear\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:5:7: layer 1 (linear) needs 'out'");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - conv2d: {out: 2}\n", NULL, 0),
              GP_ERR_INVALID, "layer 0 (conv2d) needs 'kernel'");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - dropout: {p: 1}\n", NULL, 0),
              GP_ERR_INVALID, "model.layers.0.p must be in [0, 1), got 1");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - linear:\n      out: 3\n", NULL,
                        0),
              GP_ERR_INVALID, "t.yaml:4:7: layer 0 has 2 keys ('linear', 'out')");
    /* an empty stash name is refused as an empty pop is */
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers: [{linear: {out: 4, stash: ''}}]\n",
                        NULL, 0),
              GP_ERR_INVALID, "model.layers.0.stash is empty; give the stash a name");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers: [{linear: {out: 4, stash: a}}, "
                        "{add: {pop: []}}]\n", NULL, 0),
              GP_ERR_INVALID, "model.layers.1.pop lists no name; give the name of a stash");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - linear: 3\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:4:15: options of layer 0 (linear) must be a map, like "
                              "{out: 3}, got '3'");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - [relu]\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:4:7: expected a layer type or {type: {options}}");
    CHECK_ERR(parse_bad("model:\n  input: [4]\n  layers:\n    - relu: {name: a}\n"
                        "    - relu: {name: a}\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:5:20: layer name 'a' is used by layers 0 and 1");
    /* YAML syntax, duplicate keys, missing sections */
    CHECK_ERR(parse_bad("model:\n  input: [1, 2\n  layers: []\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:3:9: YAML syntax error: did not find expected ',' or ']' (while parsing "
              "a flow sequence that starts at line 2, column 10)");
    CHECK_ERR(parse_bad("model:\n\tinput: [1]\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:2:1: YAML syntax error: found character that cannot start any token "
              "(while scanning for the next token that starts at line 2, column 1); YAML "
              "cannot indent with tabs, use spaces");
    CHECK_ERR(parse_bad("a: \xff\xfe\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:1:4: YAML syntax error: invalid leading UTF-8 octet");
    /* counted as libyaml counts the other messages' places: characters,
     * and \r, \r\n and NEL as line breaks (bytes and \n alone until
     * 2026-12-01: 1:10, 1:11, 1:13 and 1:11) */
    CHECK_ERR(parse_bad("a: \"\xc3\xa9\xc3\xa9\xff\"\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:1:7: YAML syntax error: invalid leading UTF-8 octet");
    CHECK_ERR(parse_bad("a: 1\rb: 2\rc: \xff\r", NULL, 0), GP_ERR_INVALID,
              "t.yaml:3:4: YAML syntax error: invalid leading UTF-8 octet");
    CHECK_ERR(parse_bad("a: 1\r\nb: 2\r\nc: \xff\r\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:3:4: YAML syntax error: invalid leading UTF-8 octet");
    CHECK_ERR(parse_bad("a: 1\xc2\x85" "b: \xff\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:2:4: YAML syntax error: invalid leading UTF-8 octet");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  chunks: 2\n  chunks: 4\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:11:3: duplicate key 'chunks' in pipeline (first given at "
                              "line 10, column 3)");
    CHECK_ERR(parse_bad(cat(k_base, "model: {}\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:9:1: duplicate key 'model' in the top level");
    CHECK_ERR(parse_bad("model:\n  input: [1, 28, 28]\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:1:1: missing model.layers");
    CHECK_ERR(parse_bad("model:\n  layers: [relu]\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:1:1: missing model.input");
    CHECK_ERR(parse_bad("train: {epochs: 1}\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:1:1: missing section 'model'");
    CHECK_ERR(parse_bad("model:\n  input: [1]\n  layers: []\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:3:11: model.layers is empty");
    CHECK_ERR(parse_bad("", NULL, 0), GP_ERR_INVALID, "t.yaml:1:1: the config is empty");
    /* with overrides too: the file is empty, not the last override wrong */
    {
        const char *steps[] = {"train.steps=3"}, *input[] = {"model.input=[4]"};
        CHECK_ERR(parse_bad("# only a comment\n", steps, 1), GP_ERR_INVALID,
                  "t.yaml:1:1: the config is empty; it needs at least model.input and "
                  "model.layers (no --set gives a model)");
        CHECK_ERR(parse_bad("", steps, 1), GP_ERR_INVALID, "t.yaml:1:1: the config is empty;");
        CHECK_ERR(parse_bad("\n# a\n\n", input, 1), GP_ERR_INVALID,
                  "t.yaml:1:1: the config is empty, and the --set values alone do not make "
                  "one: --set model.input=[4]: missing model.layers");
        /* overrides that make a whole config still do */
        const char *whole[] = {"model.input=[4]", "model.layers=[flatten]",
                               "data.dataset=synthetic"};
        gp_config c;
        CHECK_OK(parse_set("", whole, 3, &c));
        gp_config_free(&c);
    }
    CHECK_ERR(parse_bad("- 1\n", NULL, 0), GP_ERR_INVALID, "t.yaml:1:1: expected a map");
    CHECK_ERR(parse_bad("a: 1\n---\nb: 2\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:2:1: a config is one YAML document");
    CHECK_ERR(parse_bad("model:\n  input: [1, 2]\n  layers: [relu]\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:2:10: model.input must be [C, H, W] or [F]");
    CHECK_ERR(parse_bad("a: *nope\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:1:4: unknown alias '*nope'");
    CHECK_ERR(parse_bad("? [a]\n: 1\n", NULL, 0), GP_ERR_INVALID,
              "t.yaml:1:3: a map key must be a plain word, not a list");
    /* pipeline cross-field checks */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0, cpu:1]\n  balance: [2, 2, 1]\n"),
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:11:12: pipeline.balance has 3 entries but there are 2 "
                              "devices");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0, cpu:1]\n  balance: [4, 0]\n"),
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:11:16: pipeline.balance.1 must be >= 1");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  balance: manual\n"), NULL, 0), GP_ERR_INVALID,
              "expected auto or a list of layer counts");
    /* several stages on one device (issue 14): each entry its own stage,
     * in order; with replicas, refused with the reason */
    {
        gp_config c;
        CHECK_OK(parse(cat(k_base, "pipeline:\n  devices: [cpu:0, cpu:1, cpu:0]\n"), &c));
        CHECK(c.pipeline.n_devices == 3 && !strcmp(c.pipeline.devices[0].name, "cpu:0") &&
              !strcmp(c.pipeline.devices[1].name, "cpu:1") &&
              !strcmp(c.pipeline.devices[2].name, "cpu:0"));
        gp_config_free(&c);
        CHECK_OK(parse(cat(k_base, "pipeline:\n  devices: [cuda:0, cuda:0]\n"), &c));
        CHECK(c.pipeline.n_devices == 2 && !strcmp(c.pipeline.devices[1].name, "cuda:0"));
        gp_config_free(&c);
    }
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0, cpu:1, cpu:0]\n  "
                                    "replicas: 2\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:12: device 'cpu:0' is used by replica 0 stage 0 and by "
                              "replica 0 stage 2; with replicas every stage of every replica "
                              "needs its own device, as their all-reduce (NCCL) takes one rank "
                              "per GPU");
    /* chunks per replica: the batch splits into chunks x replicas, which
     * the config refuses beyond the limit (the step used to, naming a
     * chunks value the config never had) */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0]\n  replicas: 2\n"
                                    "  chunks: 600\n"), NULL, 0),
              GP_ERR_INVALID, "pipeline.chunks = 600 with 2 replicas splits each batch into 1200 "
                              "micro-batches, over the 1024 supported; lower chunks to 512");
    /* every replica's every micro-batch needs a sample (the run looped
     * forever skipping batches of 4 it could not split into 8) */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0]\n  replicas: 2\n"
                                    "  chunks: 4\ntrain:\n  batch_size: 4\n"), NULL, 0),
              GP_ERR_INVALID, "pipeline.chunks x pipeline.replicas (4 x 2 = 8) must be <= "
                              "train.batch_size (4)");
    /* too many replicas: said at the replicas key (or its --set), with the most that fit */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0, cpu:1]\n  replicas: 33\n"),
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:11:13: pipeline.replicas = 33 of 2 devices makes 66 "
                              "devices; at most 64 are supported in all: give at most 32 replicas "
                              "of 2 devices");
    {
        const char *sets[] = {"pipeline.replicas=40"};
        CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0, cpu:1]\n"), sets, 1),
                  GP_ERR_INVALID, "--set pipeline.replicas=40: pipeline.replicas = 40 of 2 devices");
    }
    /* a derived replica device past the last index names what derived it */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:4095]\n  replicas: 2\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:10:12: replica 1's copy of cpu:4095 would be device index "
                              "4096, past 4095");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [[cuda:0, cuda:1], [cuda:1, cuda:2]]\n"),
                        NULL, 0),
              GP_ERR_INVALID, "device 'cuda:1' is used by replica 0 stage 1 and by replica 1 "
                              "stage 0");
    /* a stage's replicas on one kind of device (their all-reduce takes one
     * backend): said from the config, not at the first step */
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [[cpu:0, cuda:0], [cpu:1, cpu:2]]\n"),
                        NULL, 0),
              GP_ERR_INVALID, "stage 1 is on cuda:0 in replica 0 but on cpu:2 in replica 1");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [gpu:0]\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:13: pipeline.devices.0: unknown device 'gpu:0'");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [{memory: 1GiB}]\n"), NULL, 0),
              GP_ERR_INVALID, "pipeline.devices.0 needs a name");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  devices: [{name: cpu:0, mem: 1GiB}]\n"), NULL,
                        0),
              GP_ERR_INVALID, "unknown option 'mem' for pipeline.devices.0; did you mean "
                              "'memory'?");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  memory: lots\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:11: expected a size like 512MiB, 1.5GB or a number of bytes for "
              "pipeline.memory, got 'lots'");
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  mean: [0.5]\n"), NULL, 0), GP_ERR_INVALID,
              "data.mean is given without data.std");
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  mean: [0.5, 0.5]\n  std: [0.5]\n"), NULL, 0),
              GP_ERR_INVALID, "data.std has 1 value but data.mean has 2");
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  mean: 0.5\n  std: 0\n"), NULL, 0), GP_ERR_INVALID,
              "data.std must be > 0, got 0");
    /* positive as written, 0 or subnormal in the float the loader divides
     * by (NaN inputs at the first step until 2026-12-01) */
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  mean: 0.5\n  std: 1e-50\n"), NULL, 0),
              GP_ERR_INVALID, "t.yaml:11:8: data.std is 1e-50, below the smallest normal value");
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  mean: 0.5\n  std: [1e-40]\n"), NULL, 0),
              GP_ERR_INVALID, "data.std.0 is 1e-40, below the smallest normal value");
    CHECK_ERR(parse_bad(cat(k_base, "data:\n  dataset: image_folder\n  path: /nonexistent\n"
                                    "  augment: {random_resized_crop: {ratio: [1e-50, 1]}}\n"),
                        NULL, 0),
              GP_ERR_INVALID, "data.augment.random_resized_crop.ratio.0 is 1e-50, below");
    /* an evaluation resize under the centre crop would leave a square image
     * smaller than the crop (until 2026-12-01 its edge pixels were
     * stretched over the rest): refused where resize is given, or at
     * model.input where its default is too small for a long side */
    {
        gp_config c;
        CHECK_ERR(parse_bad(cat(k_base, "data:\n  dataset: image_folder\n  path: /x\n"
                                        "  augment: {resize: 27}\n"), NULL, 0),
                  GP_ERR_INVALID, "t.yaml:12:21: data.augment.resize = 27 is smaller than the "
                  "centre crop, model.input's 28 x 28 (t.yaml:2:10)");
        const char *flat = "model:\n  input: [3, 16, 32]\n"
                           "  layers: [flatten, {linear: {out: 2}}]\n"
                           "data: {dataset: image_folder, path: /x";
        char text[512];
        snprintf(text, sizeof text, "%s}\n", flat);
        CHECK_ERR(parse_bad(text, NULL, 0), GP_ERR_INVALID,
                  "t.yaml:2:10: model.input's 16 x 32 is larger than data.augment.resize, "
                  "which is the crop's shorter side x 256 / 224 = 18 when left out");
        const char *keep[] = {"data.augment.resize=27"};
        CHECK_OK(parse_set(cat(k_base, "data: {dataset: image_folder, path: /x, augment: "
                                       "{resize: 28}}\n"), NULL, 0, &c));
        gp_config_free(&c);
        snprintf(text, sizeof text, "%s, augment: {resize: 32}}\n", flat);
        CHECK_OK(parse_set(text, NULL, 0, &c));
        gp_config_free(&c);
        CHECK_ERR(parse_bad(cat(k_base, "data: {dataset: image_folder, path: /x}\n"), keep, 1),
                  GP_ERR_INVALID, "--set data.augment.resize=27: data.augment.resize = 27 is "
                  "smaller");
    }
    /* an option an override took away: the file's line has it, so the
     * message names the override (until 2026-12-01 the line alone) */
    const char *drop_out[] = {"model.layers.4.linear={in: 64}"};
    CHECK_ERR(parse_bad(k_base, drop_out, 1), GP_ERR_INVALID,
              "t.yaml:8:7 (as --set model.layers.4.linear={in: 64} changed it): layer 4 "
              "(linear) needs 'out'");
    const char *whole[] = {"model.layers.4={linear: {in: 64}}"};
    CHECK_ERR(parse_bad(k_base, whole, 1), GP_ERR_INVALID,
              "--set model.layers.4={linear: {in: 64}}: layer 4 (linear) needs 'out'");
}

/* The U-Net layers (torchgpipe's benchmarks/models/unet): their options,
 * defaults, and bad values named by file:line:column. */
static void test_unet_layers(void)
{
    static const char *const text =
        "model:\n"                                                    /* 1 */
        "  input: [3, 16, 16]\n"                                      /* 2 */
        "  layers:\n"                                                 /* 3 */
        "    - conv2d: {out: 8, kernel: 3, padding: 1, bias: false}\n" /* 4 */
        "    - instance_norm: {eps: 0.001}\n"                         /* 5 */
        "    - leaky_relu: {slope: 0.2}\n"                            /* 6 */
        "    - dropout2d: {p: 0.1}\n"                                 /* 7 */
        "    - upsample: {scale: 3}\n"                                /* 8 */
        "    - instance_norm\n"                                       /* 9 */
        "    - leaky_relu\n"                                          /* 10 */
        "    - dropout2d\n"                                           /* 11 */
        "    - upsample\n";                                           /* 12 */
    gp_config c;
    CHECK_OK(parse(text, &c));
    CHECK(c.model.n_layers == 9);
    if (c.model.n_layers == 9) {
        const gp_layer_spec *l = c.model.layers;
        CHECK(l[1].type == GP_LAYER_INSTANCE_NORM && l[1].line == 5 && l[1].column == 7);
        CHECK_NEAR(l[1].eps, 0.001, 1e-9, 0);
        CHECK(l[2].type == GP_LAYER_LEAKY_RELU);
        CHECK_NEAR(l[2].slope, 0.2, 1e-7, 0);
        CHECK(l[3].type == GP_LAYER_DROPOUT2D);
        CHECK_NEAR(l[3].p, 0.1, 1e-7, 0);
        CHECK(l[4].type == GP_LAYER_UPSAMPLE && l[4].scale == 3);
        /* defaults: PyTorch's InstanceNorm2d eps, LeakyReLU slope, Dropout2d
         * p; torchgpipe's U-Net upsamples by 2 */
        CHECK_NEAR(l[5].eps, 1e-5, 1e-10, 0);
        CHECK_NEAR(l[6].slope, 0.01, 1e-9, 0);
        CHECK_NEAR(l[7].p, 0.5, 0, 0);
        CHECK(l[8].scale == 2 && l[8].line == 12);
    }
    gp_config_free(&c);
    /* bad options: the message points at the value */
    static const char *const head = "model:\n  input: [3, 16, 16]\n  layers:\n";
    char buf[512];
    snprintf(buf, sizeof buf, "%s    - leaky_relu: {slope: -0.1}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:27: model.layers.0.slope must be >= 0, got -0.1");
    snprintf(buf, sizeof buf, "%s    - upsample: {scale: 0}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:25: model.layers.0.scale must be >= 1, got 0");
    snprintf(buf, sizeof buf, "%s    - upsample: {scale: 1.5}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:25: expected an integer for model.layers.0.scale, got '1.5'");
    snprintf(buf, sizeof buf, "%s    - relu\n    - dropout2d: {p: 1}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:5:22: model.layers.1.p must be in [0, 1), got 1");
    snprintf(buf, sizeof buf, "%s    - instance_norm: {eps: 0}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:28: model.layers.0.eps must be > 0, got 0");
    /* options of other types are refused, with a hint where one is near */
    snprintf(buf, sizeof buf, "%s    - leaky_relu: {negative_slope: 0.1}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:20: unknown option 'negative_slope' for layer 0 (leaky_relu) (it takes: "
              "slope, stash, name)");
    snprintf(buf, sizeof buf, "%s    - upsample: {scale_factor: 2}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "unknown option 'scale_factor' for layer 0 (upsample)");
    snprintf(buf, sizeof buf, "%s    - instance_norm: {momentum: 0.1}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "unknown option 'momentum' for layer 0 (instance_norm)");
    snprintf(buf, sizeof buf, "%s    - leaky_rel\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "unknown layer type 'leaky_rel'; did you mean 'leaky_relu'?");
}

/* The built-in models' config: a family named with no value (`resnet:`)
 * is an empty map, as any map-valued key's null is, every option its
 * default (it was "missing model.layers"); its layers carry every
 * override of the family; AmoebaNet's input size is checked at the
 * family; and a family with layers is two models. */
static void test_families(void)
{
    static const char *const fam[] = {"resnet", "amoebanet", "unet"};
    for (int q = 0; q < (int)(sizeof fam / sizeof fam[0]); q++) {
        char with_null[256], with_empty[256];
        snprintf(with_null, sizeof with_null, "model:\n  input: [3, 64, 64]\n  %s:\n%s",
                 fam[q], strcmp(fam[q], "unet") ? "" : "  loss: bce_with_logits\n");
        snprintf(with_empty, sizeof with_empty, "model:\n  input: [3, 64, 64]\n  %s: {}\n%s",
                 fam[q], strcmp(fam[q], "unet") ? "" : "  loss: bce_with_logits\n");
        gp_config a, b;
        gp_status sa = parse(with_null, &a), sb = parse(with_empty, &b);
        CHECK_MSG(sa == GP_OK && sb == GP_OK, "%s: with no value: %s", fam[q],
                  sa == GP_OK && sb != GP_OK ? "({} failed)" : gp_last_error());
        if (sa == GP_OK && sb == GP_OK) {
            CHECK_MSG(a.model.n_layers == b.model.n_layers && a.model.n_layers > 0,
                      "%s: %d layers with no value, %d with {}", fam[q], a.model.n_layers,
                      b.model.n_layers);
            gp_config_free(&a);
            gp_config_free(&b);
        } else {
            if (sa == GP_OK) gp_config_free(&a);
            if (sb == GP_OK) gp_config_free(&b);
        }
    }
    /* a built-in model's layers name every override of the family (any
     * may be what an error about one of them is about), and where it is */
    {
        const char *sets[] = {"model.amoebanet.layers=3", "model.amoebanet.filters=32"};
        gp_config c;
        gp_status s = parse_set("model:\n  input: [3, 32, 32]\n  amoebanet: {classes: 10}\n",
                                sets, 2, &c);
        CHECK_OK(s);
        if (s == GP_OK) {
            CHECK_MSG(c.model.n_layers > 0 &&
                          !strcmp(c.model.layers[c.model.n_layers - 1].set,
                                  "model.amoebanet.layers=3 and model.amoebanet.filters=32"),
                      "the family's layers say they were changed by '%s'",
                      c.model.n_layers ? c.model.layers[c.model.n_layers - 1].set : "");
            CHECK(!strcmp(c.model.family, "amoebanet") && !strcmp(c.model.family_at, "t.yaml:3:3"));
            gp_config_free(&c);
        }
    }
    /* AmoebaNet's input: each side a multiple of 32 (or one less), said at
     * the family with the nearest that works */
    CHECK_ERR(parse_bad("model:\n  input: [3, 28, 48]\n  amoebanet: {layers: 3, filters: 16}\n",
                        NULL, 0),
              GP_ERR_INVALID, "t.yaml:3:3: model.amoebanet needs model.input's height and width "
                              "to be multiples of 32 (its stem halves them and four reduction "
                              "cells halve them again, each an even size), but the input is 28 x "
                              "48; 32 x 64 is the nearest");
    for (int side = 31; side <= 32; side++) {
        char t[160];
        snprintf(t, sizeof t, "model:\n  input: [3, %d, 64]\n  amoebanet: {layers: 3, "
                 "filters: 16}\n", side);
        gp_config c;
        CHECK_OK(parse(t, &c));
        gp_config_free(&c);
    }
    /* and with layers too, it is still two models */
    CHECK_ERR(parse_bad("model:\n  input: [3, 64, 64]\n  layers: [flatten]\n  resnet:\n", NULL, 0),
              GP_ERR_INVALID, "t.yaml:4:3: model has both layers and resnet");
}

/* What AmoebaNet-D and torchvision's ResNet need (torchgpipe's
 * benchmarks/models): per-axis kernel, stride and padding as [h, w],
 * avgpool2d's count_include_pad, conv init, factorized_reduce; defaults;
 * bad values named by file:line:column, also through --set. */
static void test_amoebanet_layers(void)
{
    static const char *const text =
        "model:\n"                                                             /* 1 */
        "  input: [8, 14, 14]\n"                                               /* 2 */
        "  layers:\n"                                                          /* 3 */
        "    - conv2d: {out: 8, kernel: [1, 7], padding: [0, 3], bias: false}\n" /* 4 */
        "    - conv2d: {out: 8, kernel: [7, 1], stride: [2, 1], padding: [3, 0]}\n" /* 5 */
        "    - avgpool2d: {kernel: 3, stride: 1, padding: 1, count_include_pad: false}\n" /* 6 */
        "    - avgpool2d: {kernel: [3, 1], padding: [1, 0]}\n"                 /* 7 */
        "    - maxpool2d: {kernel: [1, 3], stride: [1, 2]}\n"                  /* 8 */
        "    - conv2d: {out: 16, kernel: 3, init: kaiming_normal_fan_out}\n"   /* 9 */
        "    - factorized_reduce: {out: 32, momentum: 0.2, eps: 0.001, sync: true, "
        "init: kaiming_normal_fan_out}\n"                                      /* 10 */
        "    - factorized_reduce: {out: 64}\n"                                 /* 11 */
        "    - residual: {out: 64, init: kaiming_normal_fan_out}\n";           /* 12 */
    gp_config c;
    CHECK_OK(parse(text, &c));
    CHECK(c.model.n_layers == 9);
    if (c.model.n_layers == 9) {
        const gp_layer_spec *l = c.model.layers;
        CHECK(hw_is(l[0].kernel, 1, 7) && hw_is(l[0].padding, 0, 3) && hw_is(l[0].stride, 1, 1));
        CHECK(l[0].init == GP_INIT_DEFAULT && !l[0].bias);
        CHECK(hw_is(l[1].kernel, 7, 1) && hw_is(l[1].stride, 2, 1) && hw_is(l[1].padding, 3, 0));
        CHECK(l[2].type == GP_LAYER_AVGPOOL2D && !l[2].count_include_pad);
        CHECK(hw_is(l[3].kernel, 3, 1) && hw_is(l[3].stride, 0, 0) && hw_is(l[3].padding, 1, 0));
        CHECK(l[3].count_include_pad); /* PyTorch's default */
        CHECK(l[4].type == GP_LAYER_MAXPOOL2D && hw_is(l[4].kernel, 1, 3) &&
              hw_is(l[4].stride, 1, 2));
        CHECK(l[5].init == GP_INIT_KAIMING_NORMAL_FAN_OUT);
        CHECK(l[6].type == GP_LAYER_FACTORIZED_REDUCE && l[6].out == 32 && l[6].sync &&
              l[6].init == GP_INIT_KAIMING_NORMAL_FAN_OUT && l[6].line == 10);
        CHECK_NEAR(l[6].momentum, 0.2, 1e-7, 0);
        CHECK_NEAR(l[6].eps, 0.001, 1e-9, 0);
        CHECK(l[7].out == 64 && !l[7].sync && l[7].init == GP_INIT_DEFAULT);
        CHECK_NEAR(l[7].momentum, 0.1, 1e-7, 0);
        CHECK(l[8].type == GP_LAYER_RESIDUAL && l[8].init == GP_INIT_KAIMING_NORMAL_FAN_OUT);
    }
    gp_config_free(&c);
    /* --set takes a pair too */
    const char *sets[] = {"model.layers.0.kernel=[1,5]", "model.layers.0.padding=[0, 2]",
                          "model.layers.2.count_include_pad=true"};
    CHECK_OK(parse_set(text, sets, 3, &c));
    if (c.model.n_layers == 9)
        CHECK(hw_is(c.model.layers[0].kernel, 1, 5) && hw_is(c.model.layers[0].padding, 0, 2) &&
              c.model.layers[2].count_include_pad);
    gp_config_free(&c);
    const char *bad_set[] = {"model.layers.0.kernel=[1,5,5]"};
    CHECK_ERR(parse_bad(text, bad_set, 1), GP_ERR_INVALID,
              "--set model.layers.0.kernel=[1,5,5]: model.layers.0.kernel must be an integer or "
              "a list [height, width] of two, got a list of 3");

    /* bad values: the message points at the value, or the element of it */
    static const char *const head = "model:\n  input: [3, 16, 16]\n  layers:\n";
    char buf[512];
    snprintf(buf, sizeof buf, "%s    - conv2d: {out: 8, kernel: [1, 7, 3]}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:32: model.layers.0.kernel must be an integer or a list [height, width] "
              "of two, got a list of 3");
    snprintf(buf, sizeof buf, "%s    - conv2d: {out: 8, kernel: [1, x]}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:36: expected an integer for model.layers.0.kernel.1, got 'x'");
    snprintf(buf, sizeof buf, "%s    - conv2d: {out: 8, kernel: [1, [7]]}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:36: expected an integer for model.layers.0.kernel.1 (the width), got a "
              "list");
    snprintf(buf, sizeof buf, "%s    - conv2d: {out: 8, kernel: [0, 7]}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:33: model.layers.0.kernel (height) must be >= 1, got 0");
    snprintf(buf, sizeof buf, "%s    - conv2d: {out: 8, kernel: 0}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:32: model.layers.0.kernel must be >= 1, got 0");
    snprintf(buf, sizeof buf, "%s    - maxpool2d: {kernel: 3, padding: [1, -1]}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:43: model.layers.0.padding (width) must be >= 0, got -1");
    snprintf(buf, sizeof buf, "%s    - maxpool2d: {kernel: 3, stride: [2, 0]}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:42: model.layers.0.stride (width) must be >= 1, got 0");
    snprintf(buf, sizeof buf, "%s    - conv2d: {out: 8, kernel: {h: 1, w: 7}}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:32: expected an integer or a list [height, width] for "
              "model.layers.0.kernel, got a map");
    snprintf(buf, sizeof buf, "%s    - conv2d: {out: 8, kernel: [1, 7], padding: []}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID, "got a list of 0");
    snprintf(buf, sizeof buf, "%s    - residual: {out: 8, stride: [2, 2]}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:34: expected an integer for model.layers.0.stride, got a list");
    snprintf(buf, sizeof buf, "%s    - avgpool2d: {kernel: 3, count_include_pad: maybe}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:49: expected true or false for model.layers.0.count_include_pad, got "
              "'maybe'");
    snprintf(buf, sizeof buf, "%s    - maxpool2d: {kernel: 3, count_include_pad: false}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "unknown option 'count_include_pad' for layer 0 (maxpool2d)");
    snprintf(buf, sizeof buf, "%s    - conv2d: {out: 8, kernel: 3, init: xavier}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:41: unknown value 'xavier' for model.layers.0.init (allowed: default, "
              "kaiming_normal_fan_out, normal)");
    snprintf(buf, sizeof buf, "%s    - linear: {out: 8, init: kaiming_normal_fan_out}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:30: model.layers.0.init: a linear layer takes default (PyTorch's "
              "nn.Linear) or normal (GPT-2's, with std), not kaiming_normal_fan_out");
    snprintf(buf, sizeof buf, "%s    - factorized_reduce: {out: 7}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:32: layer 0 (factorized_reduce): out = 7 must be even");
    snprintf(buf, sizeof buf, "%s    - factorized_reduce\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "t.yaml:4:7: layer 0 (factorized_reduce) needs 'out'");
    snprintf(buf, sizeof buf, "%s    - factorized_reduce: {out: 8, stride: 2}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID,
              "unknown option 'stride' for layer 0 (factorized_reduce) (it takes: out, momentum, "
              "eps, sync, init, stash, name)");
    snprintf(buf, sizeof buf, "%s    - factorized_reduc: {out: 8}\n", head);
    CHECK_ERR(parse_bad(buf, NULL, 0), GP_ERR_INVALID, "did you mean 'factorized_reduce'?");
}

/* Overrides of k_base: scalar, nested, list, created keys, layer options
 * by index (test_overrides, test_text_applied). */
enum { N_OVERRIDES = 10 };
static const char *const k_overrides[N_OVERRIDES] = {
    "train.batch_size=128",
    "train.optimizer.lr=0.1",
    "pipeline.devices=[cpu:0,cpu:1]",
    "pipeline.balance=[2, 4]",
    "data.augment.hflip=true",
    "model.layers.0.out=16",
    "model.layers.1.momentum=0.3",
    "model.layers.4.linear.bias=false",
    "model.layers.5={dropout: {p: 0.1}}",
    " train.seed = 7",
};

static void test_overrides(void)
{
    gp_config c;
    CHECK_OK(parse_set(k_base, k_overrides, N_OVERRIDES, &c));
    CHECK(c.train.batch_size == 128);
    CHECK_NEAR(c.train.optim.lr, 0.1, 1e-7, 0);
    CHECK(c.pipeline.n_devices == 2 && !strcmp(c.pipeline.devices[1].name, "cpu:1"));
    CHECK(c.pipeline.n_balance == 2 && c.pipeline.balance[1] == 4);
    CHECK(c.data.hflip);
    CHECK(c.model.n_layers == 6);
    if (c.model.n_layers == 6) {
        CHECK(c.model.layers[0].out == 16 && hw_is(c.model.layers[0].kernel, 3, 3));
        CHECK_NEAR(c.model.layers[1].momentum, 0.3, 1e-7, 0);
        CHECK(!c.model.layers[4].bias && c.model.layers[4].out == 10);
        CHECK(c.model.layers[5].type == GP_LAYER_DROPOUT && c.model.layers[5].line == 0);
        CHECK_NEAR(c.model.layers[5].p, 0.1, 1e-7, 0);
    }
    CHECK(c.train.seed == 7);
    CHECK(c.defaults_applied && !strstr(c.defaults_applied, "train.batch_size"));
    gp_config_free(&c);

    /* an override can build a whole config from nothing */
    const char *build[] = {"model.input=[4]", "model.layers=[flatten, {linear: {out: 2}}]"};
    CHECK_OK(parse_set("", build, 2, &c));
    CHECK(c.model.n_layers == 2 && c.model.layers[1].out == 2);
    gp_config_free(&c);
    /* a later override wins */
    const char *twice[] = {"train.epochs=2", "train.epochs=5"};
    CHECK_OK(parse_set(k_base, twice, 2, &c));
    CHECK(c.train.epochs == 5);
    gp_config_free(&c);

    /* errors name the override */
    const char *bad1[] = {"train.batch_size=abc"};
    CHECK_ERR(parse_bad(k_base, bad1, 1), GP_ERR_INVALID,
              "--set train.batch_size=abc: expected an integer for train.batch_size, got 'abc'");
    const char *bad2[] = {"train.lr=0.1"};
    CHECK_ERR(parse_bad(k_base, bad2, 1), GP_ERR_INVALID,
              "--set train.lr=0.1: unknown key 'lr' in train; did you mean 'optimizer.lr'?");
    const char *bad3[] = {"train.batch_size"};
    CHECK_ERR(parse_bad(k_base, bad3, 1), GP_ERR_INVALID,
              "--set train.batch_size: expected key=value");
    const char *bad4[] = {"pipeline.devices=[cpu:0,"};
    CHECK_ERR(parse_bad(k_base, bad4, 1), GP_ERR_INVALID,
              "--set pipeline.devices=[cpu:0,: YAML syntax error");
    const char *bad5[] = {"model.layers.9.out=3"};
    CHECK_ERR(parse_bad(k_base, bad5, 1), GP_ERR_INVALID,
              "--set model.layers.9.out=3: index 9 is past the end of 'model.layers', which "
              "has 5 items");
    const char *bad6[] = {"model.layers.x=3"};
    CHECK_ERR(parse_bad(k_base, bad6, 1), GP_ERR_INVALID,
              "--set model.layers.x=3: 'model.layers' is a list; address an item by its index");
    const char *bad6b[] = {"model.x=3"}; /* a file whose top level is a list */
    CHECK_ERR(parse_bad("- model\n- train\n", bad6b, 1), GP_ERR_INVALID,
              "--set model.x=3: the config's top level is a list, not a map with the sections");
    const char *bad7[] = {"model.input.0.x=3"};
    CHECK_ERR(parse_bad(k_base, bad7, 1), GP_ERR_INVALID,
              "--set model.input.0.x=3: 'model.input.0' is a single value ('1'), not a map");
    const char *bad7b[] = {"train.optimizer=adamw", "train.optimizer.lr=0.003"};
    CHECK_ERR(parse_bad(k_base, bad7b, 2), GP_ERR_INVALID,
              "--set train.optimizer.lr=0.003: 'train.optimizer' is a single value ('adamw', "
              "short for {type: adamw}), not a map; cannot set 'lr' inside it: give both as one "
              "map, --set 'train.optimizer={type: adamw, lr: ...}'");
    const char *bad8[] = {"train..epochs=3"};
    CHECK_ERR(parse_bad(k_base, bad8, 1), GP_ERR_INVALID, "--set train..epochs=3: empty part");
    const char *bad9[] = {"=3"};
    CHECK_ERR(parse_bad(k_base, bad9, 1), GP_ERR_INVALID, "--set =3: missing the key");
    const char *bad10[] = {"model.layers.2.kernel=3"};
    CHECK_ERR(parse_bad(k_base, bad10, 1), GP_ERR_INVALID,
              "--set model.layers.2.kernel=3: unknown option 'kernel' for layer 2 (relu)");
    /* a list one override wrote and a later one changed: both named (the
     * message blamed the first, whose list was right) */
    const char *bad13[] = {"pipeline.devices=[cpu:0, cpu:1]", "pipeline.balance=[2, 3]",
                           "pipeline.balance.0=1"};
    CHECK_ERR(parse_bad(k_base, bad13, 3), GP_ERR_INVALID,
              "--set pipeline.balance=[2, 3] (as --set pipeline.balance.0=1 changed it): "
              "pipeline.balance");
    const char *bad11[] = {"pipeline.chunks=0"};
    CHECK_ERR(parse_bad(k_base, bad11, 1), GP_ERR_INVALID,
              "--set pipeline.chunks=0: pipeline.chunks must be >= 1, got 0");
    /* one line: overrides are kept and written back one per line, so a
     * value with a line break loaded but could not be written back (what
     * the config fuzzer found: gp_config_text_applied failed on it) */
    const char *bad12[] = {"pipeline.chunks=2\n# a comment"};
    CHECK_ERR(parse_bad(k_base, bad12, 1), GP_ERR_INVALID,
              "a line break in the value; give it on one line");
}

/* gp_config_text_applied on what the config reviewer found: a line at
 * column 1 inside a flow map or a quoted scalar (taken for a section's
 * key, so a rewritten section left its tail in the file), an alias whose
 * anchor sat in a rewritten section, a line break YAML folds (NEL) written
 * raw inside quotes, and characters it refuses raw (C1 controls, the BOM;
 * the config fuzzer's).  Each reads back with its override, and its
 * values as given. */
static void text_applied_sections(void)
{
    static const struct {
        const char *text, *set;
        int out;           /* layer 1's out after the override */
        int64_t batch;     /* train.batch_size after it */
        const char *dir;   /* train.snapshot.dir, or NULL */
    } cases[] = {
        {"model: {\ninput: [4],\nlayers: [flatten, {linear: {out: 2}}]}\n"
         "train:\n  batch_size: 8\n", "model.layers.1.out=3", 3, 8, NULL},
        {"model:\n  input: [4]\n  layers: [flatten, {linear: {out: 2}}]\n"
         "train:\n  snapshot: {dir: \"runs/a\ndata: b\"}\n  batch_size: 8\n",
         "train.batch_size=16", 2, 16, "runs/a data: b"},
        {"model:\n  input: &shape [4]\n  layers: [flatten, {linear: {out: 2}}]\n"
         "data: {dataset: synthetic, synthetic: {shape: *shape}}\n",
         "model.layers.1.out=3", 3, 0, NULL},
        {"model:\n  input: [4]\n  layers: [flatten, {linear: {out: 2}}]\n"
         "train:\n  snapshot: {dir: \"p\\Nq\\Lr\"}\n",
         "train.batch_size=16", 2, 16, "p\xc2\x85q\xe2\x80\xa8r"},
        /* a document ended with "...": the rewritten section came after it */
        {"model:\n  input: [4]\n  layers: [flatten, {linear: {out: 2}}]\n"
         "train:\n  batch_size: 8\n...\n", "model.layers.1.out=3", 3, 8, NULL},
        /* a C1 control, the BOM and U+FFFF: a reader refuses them raw */
        {"model:\n  input: [4]\n  layers: [flatten, {linear: {out: 2}}]\n"
         "train:\n  snapshot: {dir: \"a\\u0084b\\uFEFFc\\uFFFFd\"}\n",
         "train.batch_size=16", 2, 16, "a\xc2\x84" "b\xef\xbb\xbf" "c\xef\xbf\xbf" "d"},
    };
    for (int q = 0; q < (int)(sizeof cases / sizeof cases[0]); q++) {
        gp_config c, w;
        const char *set[] = {cases[q].set};
        CHECK_OK(parse_set(cases[q].text, set, 1, &c));
        char *t = NULL;
        CHECK_OK(gp_config_text_applied(&c, NULL, &t));
        gp_status sw = t ? parse(t, &w) : GP_ERR_INVALID;
        bool ok = sw == GP_OK && w.model.n_layers == 2 && w.model.layers[1].out == cases[q].out &&
                  (!cases[q].batch || w.train.batch_size == cases[q].batch) &&
                  (!cases[q].dir || !strcmp(w.train.snapshot.dir, cases[q].dir));
        CHECK_MSG(ok, "case %d written as:\n%s\n(%s)", q, t ? t : "(none)",
                  sw == GP_OK ? "read back otherwise" : gp_last_error());
        if (sw == GP_OK) gp_config_free(&w);
        free(t);
        gp_config_free(&c);
    }
}

/* gp_config_text_applied: the text with the overrides written in loads,
 * without overrides, to the same config; untouched sections keep their
 * lines and comments; a dropped section is left out; a value that plain
 * YAML would misread is quoted. */
static void test_text_applied(void)
{
    const char *sets[N_OVERRIDES + 1];
    memcpy(sets, k_overrides, sizeof k_overrides);
    sets[N_OVERRIDES] = "train.snapshot.dir=\"/tmp/a: b #c, [d]\"";
    gp_config c, w;
    CHECK_OK(parse_set(k_base, sets, N_OVERRIDES + 1, &c));
    char *t = NULL;
    CHECK_OK(gp_config_text_applied(&c, NULL, &t));
    if (!t) {
        gp_config_free(&c);
        return;
    }
    CHECK_OK(parse(t, &w));
    CHECK(w.train.batch_size == 128 && w.train.seed == 7 && w.data.hflip);
    CHECK_NEAR(w.train.optim.lr, 0.1, 1e-7, 0);
    CHECK_MSG(!strcmp(w.train.snapshot.dir, "/tmp/a: b #c, [d]"), "dir %s", w.train.snapshot.dir);
    CHECK(w.pipeline.n_devices == 2 && !strcmp(w.pipeline.devices[1].name, "cpu:1"));
    CHECK(w.pipeline.n_balance == 2 && w.pipeline.balance[1] == 4);
    CHECK(w.model.n_layers == c.model.n_layers && w.model.n_layers == 6);
    for (int i = 0; i < w.model.n_layers && i < c.model.n_layers; i++) {
        const gp_layer_spec *a = &c.model.layers[i], *b = &w.model.layers[i];
        CHECK_MSG(a->type == b->type && a->out == b->out && a->bias == b->bias &&
                      a->momentum == b->momentum && a->p == b->p && hw_is(b->kernel, a->kernel.h,
                                                                           a->kernel.w),
                  "layer %d differs after writing", i);
    }
    gp_config_free(&w);
    free(t);
    /* dropping the pipeline section */
    CHECK_OK(gp_config_text_applied(&c, "pipeline", &t));
    CHECK(t && !strstr(t, "pipeline:") && strstr(t, "batch_size: 128"));
    free(t);
    gp_config_free(&c);

    /* untouched sections verbatim, comments included */
    const char *small = "# head\n"
                        "model:\n"
                        "  input: [4]  # keep\n"
                        "  layers: [flatten, {linear: {out: 2}}]\n"
                        "train:\n"
                        "  batch_size: 8  # replaced\n";
    const char *bs[] = {"train.batch_size=16"};
    CHECK_OK(parse_set(small, bs, 1, &c));
    CHECK_OK(gp_config_text_applied(&c, NULL, &t));
    CHECK_MSG(t && strstr(t, "# head\nmodel:\n  input: [4]  # keep\n") &&
                  !strstr(t, "# replaced") && strstr(t, "  batch_size: 16\n"),
              "written: %s", t ? t : "(none)");
    if (t) {
        CHECK_OK(parse(t, &w));
        CHECK(w.train.batch_size == 16 && w.model.n_layers == 2 && w.model.layers[1].out == 2);
        gp_config_free(&w);
    }
    free(t);
    gp_config_free(&c);

    /* layouts whose sections cannot be copied line by line (fuzz_config
     * found the first: an appended section at column 0 under an indented
     * root was a syntax error): the whole config written from the tree,
     * still what was given */
    static const char *const odd[] = {
        " model:\n  input: [4]\n  layers: [flatten, {linear: {out: 2}}]\n", /* root indented */
        "model:\r  input: [4]\r  layers: [flatten, {linear: {out: 2}}]\r",   /* lone CR */
        "{model: {input: [4], layers: [flatten, {linear: {out: 2}}]}}\n",     /* flow */
        "\"model\":\n  input: [4]\n  layers: [flatten, {linear: {out: 2}}]\n", /* quoted */
    };
    for (int q = 0; q < (int)(sizeof odd / sizeof odd[0]); q++) {
        CHECK_OK(parse_set(odd[q], bs, 1, &c));
        t = NULL;
        CHECK_OK(gp_config_text_applied(&c, NULL, &t));
        gp_status sw = t ? parse(t, &w) : GP_ERR_INVALID;
        CHECK_MSG(sw == GP_OK && w.train.batch_size == 16 && w.model.n_layers == 2 &&
                      w.model.layers[1].out == 2,
                  "layout %d written as:\n%s\n(%s)", q, t ? t : "(none)",
                  sw == GP_OK ? "read back otherwise" : gp_last_error());
        if (sw == GP_OK) gp_config_free(&w);
        free(t);
        gp_config_free(&c);
    }
    text_applied_sections();
}

static void test_load(void)
{
    gp_config c;
    const char *missing = "/nonexistent/dir/no-such-config.yaml";
    CHECK_ERR(gp_config_load(missing, NULL, 0, &c), GP_ERR_IO, missing);
    gp_config_free(&c);
    CHECK_ERR(gp_config_load("/", NULL, 0, &c), GP_ERR_IO,
              "/: cannot open the config: not a regular file (a folder, a FIFO or a device)");
    gp_config_free(&c);
    /* a FIFO: refused at once, not a blocked open (the fuzzer's hang) */
    char fifo[] = "/tmp/test_config_fifo_XXXXXX";
    int fd0 = mkstemp(fifo);
    if (fd0 >= 0) {
        close(fd0);
        remove(fifo);
        CHECK(mkfifo(fifo, 0600) == 0);
        CHECK_ERR(gp_config_load(fifo, NULL, 0, &c), GP_ERR_IO, "not a regular file");
        gp_config_free(&c);
        remove(fifo);
    }

    char path[] = "/tmp/test_config_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    fputs(k_base, f);
    fputs("train:\n  batch_size: x\n", f);
    fclose(f);
    char want[128];
    snprintf(want, sizeof want, "%s:10:15: expected an integer", path);
    CHECK_ERR(gp_config_load(path, NULL, 0, &c), GP_ERR_INVALID, want);
    const char *fix[] = {"train.batch_size=32"};
    CHECK_OK(gp_config_load(path, fix, 1, &c));
    CHECK(c.train.batch_size == 32 && !strcmp(c.path, path));
    CHECK(!strcmp(c.model.layers[0].file, path));
    gp_config_free(&c);
    unlink(path);

    /* every example config in configs/ loads (the files are part of the
     * docs: a key renamed in the parser must be renamed there too) */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/configs", GPIPE_SOURCE_DIR);
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot list %s", dir);
    int loaded = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".yaml")) continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        gp_status s = gp_config_load(p, NULL, 0, &c);
        CHECK_MSG(s == GP_OK, "%s: %s", p, gp_last_error());
        if (s != GP_OK) continue;
        CHECK(c.model.n_layers > 0);
        gp_config_free(&c);
        loaded++;
    }
    if (d) closedir(d);
    CHECK_MSG(loaded >= 8, "%d example configs loaded", loaded);
}

/* A layer keeps its config's path and the --set that made it for its
 * messages in fixed fields (128 and 96 bytes): a longer path of
 * multi-byte characters is cut between characters, to "..." and its tail,
 * the part that names the file (a layer of the file's and a family's
 * alike), and a longer override to its head; each cut at every offset of
 * the characters (3-byte ones in the path, 2-byte ones in the override). */
static void test_layer_places_utf8(void)
{
    const char *unet = "model:\n  input: [3, 64, 64]\n  unet: {}\n  loss: bce_with_logits\n";
    for (int shift = 0; shift < 3; shift++) {
        char path[256] = "/tmp/", set[160];
        for (int k = 0; k < shift; k++) strcat(path, "a");
        for (int k = 0; k < 60; k++) strcat(path, "\xe6\x97\xa5"); /* CJK */
        for (int k = 0; k < shift; k++) strcat(path, "a"); /* (the tail's cut moves too) */
        strcat(path, "/c.yaml");
        snprintf(set, sizeof set, "model.layers.4={linear: {out: 10, name: %s", shift ? "b" : "");
        for (int k = 0; k < 31; k++) strcat(set, "\xc3\xa9"); /* e acute */
        strcat(set, "}}");
        const char *sets[] = {set};
        char file[128] = "", by[96] = "", fam[128] = "";
        gp_config c;
        if (gp_config_parse(path, k_base, strlen(k_base), sets, 1, &c) == GP_OK) {
            memcpy(file, c.model.layers[0].file, sizeof file);
            memcpy(by, c.model.layers[4].set, sizeof by);
            gp_config_free(&c);
        }
        if (gp_config_parse(path, unet, strlen(unet), NULL, 0, &c) == GP_OK) {
            memcpy(fam, c.model.layers[0].file, sizeof fam);
            gp_config_free(&c);
        }
        size_t f = strlen(file), n = strlen(path), b = strlen(by);
        CHECK_MSG(gpt_utf8_valid(file) && f > sizeof file - 4 && !strncmp(file, "...", 3) &&
                  !strcmp(path + n - (f - 3), file + 3), "shift %d: '%s' for '%s'", shift, file,
                  path);
        CHECK_MSG(gpt_utf8_valid(fam) && !strcmp(fam, file), "shift %d: a family's '%s', a "
                  "layer's '%s' for '%s'", shift, fam, file, path);
        CHECK_MSG(gpt_utf8_valid(by) && b > sizeof by - 3 && !strncmp(set, by, b),
                  "shift %d: '%s' for '%s'", shift, by, set);
    }
}

/* The last error is exactly `want` (CHECK_ERR only looks for a part). */
#define CHECK_EXACT(expr, want)                                                   \
    do {                                                                          \
        gp_status s_ = (expr);                                                    \
        CHECK_MSG(s_ == GP_ERR_INVALID && !strcmp(gp_last_error(), (want)),       \
                  "got %s: \"%s\"\n  want \"%s\"", gp_status_name(s_), gp_last_error(), \
                  (want));                                                        \
    } while (0)

/* Sizes: under one byte is an error, not "no limit"; too large is too
 * large, not malformed; the units go up to E; per device the same. */
static void test_sizes(void)
{
    gp_config c;
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: 0.9\n"), NULL, 0),
                "t.yaml:10:11: pipeline.memory is 0.9 bytes; give at least 1 byte, e.g. 512MiB, "
                "or leave the key out for no limit");
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: 0\n"), NULL, 0),
                "t.yaml:10:11: pipeline.memory is 0 bytes; give at least 1 byte, e.g. 512MiB, "
                "or leave the key out for no limit");
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: 0.0005KiB\n"), NULL, 0),
                "t.yaml:10:11: pipeline.memory is 0.512 bytes; give at least 1 byte, e.g. "
                "512MiB, or leave the key out for no limit");
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: 16EiB\n"), NULL, 0),
                "t.yaml:10:11: pipeline.memory is too large: 16EiB is 1.845e+19 bytes, and sizes "
                "must be below 8EiB (2^63 bytes)");
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: 99999999999999999999\n"), NULL, 0),
                "t.yaml:10:11: pipeline.memory is too large: 99999999999999999999 is 1e+20 "
                "bytes, and sizes must be below 8EiB (2^63 bytes)");
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: -1GiB\n"), NULL, 0),
                "t.yaml:10:11: pipeline.memory is negative (-1GiB); give a size like 512MiB, or "
                "leave the key out for no limit");
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: 0x100\n"), NULL, 0),
                "t.yaml:10:11: expected a size like 512MiB, 1.5GB or a number of bytes for "
                "pipeline.memory, got '0x100'");
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: inf\n"), NULL, 0),
                "t.yaml:10:11: expected a size like 512MiB, 1.5GB or a number of bytes for "
                "pipeline.memory, got 'inf'");
    CHECK_ERR(parse_bad(cat(k_base, "pipeline:\n  memory: 12MiBs\n"), NULL, 0), GP_ERR_INVALID,
              "t.yaml:10:11: expected a size like 512MiB");
    /* per device, at the device's own key */
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  devices: [cpu:0, {name: cpu:1, memory: "
                                      "0.5}]\n"), NULL, 0),
                "t.yaml:10:42: pipeline.devices.1.memory is 0.5 bytes; give at least 1 byte, "
                "e.g. 512MiB, or leave the key out for no limit");
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  devices:\n    - {name: cpu:0, memory: "
                                      "16EiB}\n"), NULL, 0),
                "t.yaml:11:29: pipeline.devices.0.memory is too large: 16EiB is 1.845e+19 bytes, "
                "and sizes must be below 8EiB (2^63 bytes)");
    const char *set0[] = {"pipeline.memory=0.9"};
    CHECK_EXACT(parse_bad(k_base, set0, 1),
                "--set pipeline.memory=0.9: pipeline.memory is 0.9 bytes; give at least 1 byte, "
                "e.g. 512MiB, or leave the key out for no limit");
    /* what is allowed */
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 1\n"), &c));
    CHECK(c.pipeline.memory == 1 && c.pipeline.devices[0].memory == 1);
    gp_config_free(&c);
    /* the largest size there is, read exactly (a double rounds it to 2^63) */
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 9223372036854775807\n"), &c));
    CHECK(c.pipeline.memory == (size_t)INT64_MAX);
    gp_config_free(&c);
    CHECK_EXACT(parse_bad(cat(k_base, "pipeline:\n  memory: 9223372036854775808\n"), NULL, 0),
                "t.yaml:10:11: pipeline.memory is too large: 9223372036854775808 is 9.223e+18 "
                "bytes, and sizes must be below 8EiB (2^63 bytes)");
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 0.5KiB\n"), &c));
    CHECK(c.pipeline.memory == 512);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 1.5 GB\n"), &c));
    CHECK(c.pipeline.memory == (size_t)(1.5 * 1073741824.0));
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 2PiB\n"), &c));
    CHECK(c.pipeline.memory == (size_t)2 << 50);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 7EiB\n"), &c));
    CHECK(c.pipeline.memory == (size_t)7 << 60);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 1e3\n"), &c));
    CHECK(c.pipeline.memory == 1000);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 64 k\n"), &c));
    CHECK(c.pipeline.memory == 65536);
    gp_config_free(&c);
    /* units in either case, the trailing B too */
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 3mib\n"), &c));
    CHECK(c.pipeline.memory == (size_t)3 << 20);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "pipeline:\n  memory: 100b\n"), &c));
    CHECK(c.pipeline.memory == 100);
    gp_config_free(&c);
    CHECK_OK(parse(k_base, &c));
    CHECK(c.pipeline.memory == 0 && strstr(c.defaults_applied, "pipeline.memory = unlimited"));
    gp_config_free(&c);
}

/* An override that replaces a map an earlier one set a key in warns,
 * naming both; the other order, or unrelated keys, do not. */
static void test_shadowed_override(void)
{
    gp_config c;
    const char *lost[] = {"train.optimizer.lr=0.003", "train.optimizer=adamw"};
    CHECK_OK(parse_set(k_base, lost, 2, &c));
    CHECK_MSG(c.warnings && strstr(c.warnings, "--set train.optimizer=adamw: replaces "
                                               "'train.optimizer' and with it the earlier --set "
                                               "train.optimizer.lr=0.003; give that one after "
                                               "this, or both as one map\n"),
              "got \"%s\"", c.warnings);
    CHECK(c.train.optim.lr == 0.001); /* the later wins, as documented */
    gp_config_free(&c);
    const char *kept[] = {"train.optimizer={type: adamw}", "train.optimizer.lr=0.003"};
    CHECK_OK(parse_set(k_base, kept, 2, &c));
    CHECK_MSG(c.warnings && !c.warnings[0] && c.train.optim.lr == 0.003, "got \"%s\"",
              c.warnings);
    gp_config_free(&c);
    /* a key whose name begins with the later one's but is no key inside it
     * (vocab_pad, vocab): nothing lost, no warning */
    const char *prefix[] = {"model.gpt.vocab_pad=8", "model.gpt.vocab=12"};
    CHECK_OK(parse_set("model:\n  input: [6]\n  gpt: {layers: 1, heads: 2, width: 16, "
                       "positions: 6, vocab: 11}\n", prefix, 2, &c));
    CHECK_MSG(c.warnings && !c.warnings[0], "got \"%s\"", c.warnings);
    gp_config_free(&c);
}

/* Keys that the chosen schedule or lr_scaling does not read: a warning at
 * each (the run would silently train on a schedule the user did not
 * write), the values still parsed; none when every key is used. */
static void test_ignored_schedule_keys(void)
{
    gp_config c;
    CHECK_OK(parse(cat(k_base, "train:\n"                                          /* 9 */
                               "  schedule: {type: cosine, step_size: 5, gamma: 0.5,\n" /* 10 */
                               "             warmup_start: 0.1}\n"                 /* 11 */
                               "  base_batch: 64\n"),                              /* 12 */
                   &c));
    const char *want =
        "t.yaml:10:39: train.schedule.step_size is ignored: only type step uses it, and the "
        "schedule is cosine\n"
        "t.yaml:10:49: train.schedule.gamma is ignored: only type step uses it, and the "
        "schedule is cosine\n"
        "t.yaml:11:28: train.schedule.warmup_start is ignored: warmup_steps is 0, so there is "
        "no warmup; give warmup_steps too\n"
        "t.yaml:12:15: train.base_batch is ignored: it scales the learning rate only with "
        "train.lr_scaling: linear (lr_scaling is none)\n";
    CHECK_MSG(c.warnings && !strcmp(c.warnings, want), "got \"%s\"\n  want \"%s\"",
              c.warnings, want);
    CHECK(c.train.sched.kind == GP_SCHED_COSINE && c.train.sched.step_size == 5);
    gp_config_free(&c);
    /* min_lr on a step schedule; the type changed by --set names the --set */
    const char *set[] = {"train.schedule.type=step"};
    CHECK_OK(parse_set(cat(k_base, "train:\n  schedule: {type: cosine, min_lr: 0.001}\n"), set,
                       1, &c));
    CHECK_MSG(c.warnings && strstr(c.warnings, "t.yaml:10:36: train.schedule.min_lr is ignored: "
                                               "only type cosine uses it, and the schedule is "
                                               "step\n"),
              "got \"%s\"", c.warnings);
    gp_config_free(&c);
    /* every key used: no warning */
    CHECK_OK(parse(cat(k_base, "train:\n  schedule: {type: step, step_size: 5, gamma: 0.5, "
                               "warmup_steps: 3, warmup_start: 0.1}\n  lr_scaling: linear\n"
                               "  base_batch: 64\n"),
                   &c));
    CHECK_MSG(c.warnings && !c.warnings[0], "warnings: %s", c.warnings);
    gp_config_free(&c);
    /* cosine's floor above the rate it decays from (SGD's default 0.01):
     * it would rise to it; at or below it, or with the rate scaled up past
     * it, no word */
    CHECK_OK(parse(cat(k_base, "train:\n  schedule: {type: cosine, min_lr: 5}\n"), &c));
    CHECK_MSG(c.warnings && !strcmp(c.warnings, "t.yaml:10:36: train.schedule.min_lr = 5 is "
                                                "above the learning rate it decays from "
                                                "(0.01): the cosine schedule rises to it "
                                                "instead; give a min_lr below the rate\n"),
              "got \"%s\"", c.warnings);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "train:\n  schedule: {type: cosine, min_lr: 0.01}\n"), &c));
    CHECK_MSG(c.warnings && !c.warnings[0], "min_lr at the rate: %s", c.warnings);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "train:\n  schedule: {type: cosine, min_lr: 0.02}\n"
                               "  lr_scaling: linear\n  base_batch: 1\n"),
                   &c));
    CHECK_MSG(c.warnings && !c.warnings[0], "min_lr below the scaled rate: %s", c.warnings);
    gp_config_free(&c);
}

/* Data settings that do nothing or do harm, said at their keys: a crop
 * padding most of the sample's side (a crop of it is mostly zeros), mean
 * and std with normalisation off, a synthetic section for another dataset;
 * prefetch 0 (it became 2) is an error. */
static void test_data_warnings(void)
{
    gp_config c;
    CHECK_OK(parse(cat(k_base, "data:\n  augment: {crop_padding: 14}\n"), &c)); /* line 10 */
    const char *want = "t.yaml:10:27: data.augment.crop_padding = 14 on 28 x 28 samples: a crop "
                       "shifted that far is up to 75% zeros; a few pixels are usual (4 on "
                       "CIFAR's 32 x 32)\n";
    CHECK_MSG(c.warnings && !strcmp(c.warnings, want), "got \"%s\"\n  want \"%s\"",
              c.warnings, want);
    CHECK(c.data.crop_padding == 14); /* a warning: the value stands */
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "data:\n  augment: {crop_padding: 8}\n"), &c));
    CHECK_MSG(c.warnings && strstr(c.warnings, "up to 49% zeros"), "got \"%s\"", c.warnings);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "data:\n  augment: {crop_padding: 4}\n"), &c));
    CHECK_MSG(c.warnings && !c.warnings[0], "crop_padding 4 of 28: \"%s\"", c.warnings);
    gp_config_free(&c);
    /* an image folder's keys for another dataset, each warned of (none
     * was: data.layout: segmentation trained classification), but where
     * --set chose the dataset (the folder's config tried on other data) */
    const char *fk = "data:\n  layout: segmentation\n  workers: 4\n  augment: {resize: 16}\n";
    CHECK_OK(parse(cat(k_base, fk), &c));
    want = "t.yaml:10:11: data.layout is ignored: data.dataset is fashion-mnist, and it applies "
           "to image_folder\nt.yaml:11:12: data.workers is ignored: data.dataset is "
           "fashion-mnist, and it applies to image_folder\nt.yaml:12:21: data.augment.resize "
           "is ignored: data.dataset is fashion-mnist, and it applies to image_folder\n";
    CHECK_MSG(c.warnings && !strcmp(c.warnings, want), "got \"%s\"\n  want \"%s\"",
              c.warnings, want);
    gp_config_free(&c);
    const char *syn[] = {"data.dataset=synthetic"};
    CHECK_OK(parse_set(cat(k_base, fk), syn, 1, &c));
    CHECK_MSG(c.warnings && !strstr(c.warnings, "ignored"), "--set dataset: \"%s\"", c.warnings);
    gp_config_free(&c);
    /* tokens: no pixels to crop, flip or normalise */
    CHECK_OK(parse("model:\n  input: [16]\n  layers: [{embedding: {vocab: 64, dim: 8, positions: "
                   "16}}, {linear: {out: 64}}]\ndata:\n  dataset: tokens\n  path: /t\n  augment: "
                   "{hflip: true}\n  mean: 0.5\n  std: 0.2\n", &c));
    CHECK_MSG(c.warnings && strstr(c.warnings, "t.yaml:7:20: data.augment.hflip is ignored: "
                                               "data.dataset is tokens") &&
                  strstr(c.warnings, "t.yaml:8:9: data.mean and data.std are ignored: "
                                     "data.dataset is tokens"),
              "tokens: \"%s\"", c.warnings);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "data: {normalize: false, mean: 0.5, std: 0.25}\n"), &c));
    CHECK_MSG(c.warnings && !strcmp(c.warnings, "t.yaml:9:32: data.mean and data.std are "
                                                "ignored: data.normalize is false\n"),
              "got \"%s\"", c.warnings);
    gp_config_free(&c);
    CHECK_OK(parse(cat(k_base, "data: {dataset: mnist, synthetic: {train: 10}}\n"), &c));
    CHECK_MSG(c.warnings && strstr(c.warnings, "data.synthetic is ignored: data.dataset is "
                                               "mnist\n"),
              "got \"%s\"", c.warnings);
    gp_config_free(&c);
    /* the dataset changed by --set: the config's synthetic section is as meant */
    const char *real[] = {"data.dataset=mnist"};
    CHECK_OK(parse_set(cat(k_base, "data: {synthetic: {train: 10}}\n"), real, 1, &c));
    CHECK_MSG(c.warnings && !c.warnings[0], "got \"%s\"", c.warnings);
    gp_config_free(&c);
    CHECK_ERR(parse(cat(k_base, "data: {prefetch: 0}\n"), &c), GP_ERR_INVALID,
              "data.prefetch must be >= 1, got 0");
}

/* threads far above the cores: a warning at the key (an error would stop a
 * config written for a larger machine), in cfg.warnings. */
static void test_threads_warning(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1 || cores > 1000) {
        printf("test_config: %ld cores: the threads warning is NOT checked\n", cores);
        gpt_failed++; /* visible: a machine the test cannot judge */
        return;
    }
    const char *s = cores == 1 ? "" : "s";
    char want[1024], text[1024];
    gp_config c;
    /* one value: pipeline.threads */
    CHECK_OK(parse(cat(k_base, "pipeline:\n  threads: 4096\n"), &c));
    snprintf(want, sizeof want, "t.yaml:10:12: pipeline.threads is 4096, far above this "
             "machine's %ld core%s (more than 4x): math threads beyond the cores take turns on "
             "them and slow each other down; 0 (the default) splits the cores among the "
             "devices\n", cores, s);
    CHECK_MSG(c.warnings && !strcmp(c.warnings, want), "got \"%s\"\n  want \"%s\"", c.warnings,
              want);
    CHECK(c.pipeline.threads == 4096); /* a warning: the value stands */
    gp_config_free(&c);
    /* 4x the cores is not "far above" */
    snprintf(text, sizeof text, "%spipeline:\n  threads: %ld\n", k_base, 4 * cores);
    CHECK_OK(parse(text, &c));
    CHECK_MSG(c.warnings && !c.warnings[0], "warnings: %s", c.warnings);
    gp_config_free(&c);
    CHECK_OK(parse(k_base, &c));
    CHECK(c.warnings && !c.warnings[0]);
    gp_config_free(&c);
    /* one device's threads, at its key */
    CHECK_OK(parse(cat(k_base, "pipeline:\n  devices: [cpu:0, {name: cpu:1, threads: 4096}]\n"),
                   &c));
    snprintf(want, sizeof want, "t.yaml:10:43: pipeline.devices.1.threads is 4096, far above "
             "this machine's %ld core%s (more than 4x): math threads beyond the cores take "
             "turns on them and slow each other down\n", cores, s);
    CHECK_MSG(c.warnings && !strcmp(c.warnings, want), "got \"%s\"\n  want \"%s\"", c.warnings,
              want);
    gp_config_free(&c);
    /* in a grid, named by row and column */
    CHECK_OK(parse(cat(k_base, "pipeline:\n  devices: [[cpu:0], [{name: cpu:1, threads: "
                               "4096}]]\n"), &c));
    CHECK_MSG(c.warnings && strstr(c.warnings, "t.yaml:10:46: pipeline.devices.1.0.threads is "
                                               "4096, far above"), "got \"%s\"", c.warnings);
    gp_config_free(&c);
    /* together: 2 replicas x 2 devices x 4 x cores threads is 16x the cores */
    snprintf(text, sizeof text, "%spipeline:\n  devices: [cpu:0, cpu:1]\n  replicas: 2\n"
             "  threads: %ld\n", k_base, 4 * cores);
    CHECK_OK(parse(text, &c));
    snprintf(want, sizeof want, "t.yaml:12:12: the 4 CPU devices run %ld math threads in all, "
             "far above this machine's %ld core%s (more than 4x): threads beyond the cores take "
             "turns on them and slow each other down; lower pipeline.threads or the devices' "
             "threads\n", 16 * cores, cores, s);
    CHECK_MSG(c.warnings && !strcmp(c.warnings, want), "got \"%s\"\n  want \"%s\"", c.warnings,
              want);
    gp_config_free(&c);
    /* an override is named as such */
    const char *set[] = {"pipeline.threads=4096"};
    CHECK_OK(parse_set(k_base, set, 1, &c));
    const char *head = "--set pipeline.threads=4096: pipeline.threads is 4096, far above";
    CHECK_MSG(c.warnings && !strncmp(c.warnings, head, strlen(head)), "got \"%s\"", c.warnings);
    gp_config_free(&c);
    /* no CPU device: pipeline.threads is not used */
    CHECK_OK(parse(cat(k_base, "pipeline:\n  devices: [cuda:0]\n  threads: 4096\n"), &c));
    CHECK(c.warnings && !c.warnings[0]);
    gp_config_free(&c);
}

/* An empty --set value is an error with an example, never the default. */
static void test_empty_override(void)
{
    const char *e1[] = {"train.steps="};
    CHECK_EXACT(parse_bad(k_base, e1, 1),
                "--set train.steps=: empty value; give a value, e.g. --set train.steps=100, or "
                "leave the --set out for the default");
    const char *e2[] = {"train.optimizer.lr=  "};
    CHECK_EXACT(parse_bad(k_base, e2, 1),
                "--set train.optimizer.lr=  : empty value; give a value, e.g. --set "
                "train.optimizer.lr=0.05, or leave the --set out for the default");
    const char *e3[] = {"model.layers.4.out="};
    CHECK_EXACT(parse_bad(k_base, e3, 1),
                "--set model.layers.4.out=: empty value; give a value, e.g. --set "
                "model.layers.4.out=64, or leave the --set out for the default");
    /* a YAML document marker is no value either (it meant the default) */
    const char *e5[] = {"train.steps=---"};
    CHECK_EXACT(parse_bad(k_base, e5, 1),
                "--set train.steps=---: empty value; give a value, e.g. --set train.steps=100, or "
                "leave the --set out for the default");
    const char *e4[] = {"no.such.key="};
    CHECK_EXACT(parse_bad(k_base, e4, 1),
                "--set no.such.key=: empty value; give a value after '=', or leave the --set "
                "out for the default");
    /* a text key: the message shows how to clear it, and that form works
     * (issue 65: "model.init_from=" was refused without it) */
    const char *e6[] = {"model.init_from="};
    CHECK_EXACT(parse_bad(k_base, e6, 1),
                "--set model.init_from=: empty value; give a value, e.g. --set "
                "model.init_from=weights.safetensors, or leave the --set out for the default; to "
                "clear the value the config gives, set an empty string: --set "
                "'model.init_from=\"\"'");
    gp_config c;
    const char *clear[] = {"model.init_from=w.safetensors", "model.init_from=\"\""};
    CHECK_OK(parse_set(k_base, clear, 2, &c));
    CHECK(c.model.init_from[0] == '\0');
    gp_config_free(&c);
    /* an explicit null still asks for the default */
    const char *nul[] = {"train.steps=~", "train.batch_size=null"};
    CHECK_OK(parse_set(k_base, nul, 2, &c));
    CHECK(c.train.steps == 0 && c.train.batch_size == 64);
    gp_config_free(&c);
    /* every example the message shows is a value the key takes */
    static const char *const keys[] = {
        "model", "model.input", "model.input.0", "model.layers", "model.layers.3",
        "model.layers.0.out", "model.layers.0.kernel", "model.layers.0.stride",
        "model.layers.0.padding", "model.layers.0.bias", "model.layers.0.name",
        "model.layers.0.init", "model.layers.5.count_include_pad",
        "model.layers.1.momentum", "model.layers.1.eps", "model.layers.1.sync",
        "model.layers.8.p", "model.layers.9.in", "model.layers.9.linear", "model.loss",
        "model.init_from", "pipeline", "pipeline.devices", "pipeline.devices.0",
        "pipeline.devices.1.memory", "pipeline.devices.1.threads",
        "pipeline.balance", "pipeline.balance.0", "pipeline.chunks", "pipeline.checkpoint",
        "pipeline.lockstep", "pipeline.threads", "pipeline.memory", "pipeline.replicas", "data",
        "data.dataset", "data.path", "data.shuffle", "data.normalize", "data.augment",
        "data.augment.crop_padding", "data.augment.hflip", "data.prefetch", "data.train_limit",
        "data.test_limit", "data.synthetic", "data.synthetic.train", "data.synthetic.test",
        "data.synthetic.classes", "data.synthetic.shape", "train", "train.epochs",
        "train.steps", "train.batch_size", "train.seed", "train.optimizer",
        "train.optimizer.type", "train.optimizer.lr", "train.optimizer.momentum",
        "train.optimizer.nesterov", "train.optimizer.weight_decay",
        "train.optimizer.decay_bias_and_norm", "train.schedule", "train.schedule.type",
        "train.schedule.warmup_steps", "train.schedule.warmup_start", "train.schedule.step_size",
        "train.schedule.gamma", "train.schedule.min_lr", "train.lr_scaling", "train.base_batch",
        "train.log_every", "train.eval_each_epoch", "train.eval_batch_size", "train.snapshot",
        "train.snapshot.every_steps", "train.snapshot.every_minutes", "train.snapshot.keep",
        "train.snapshot.dir",
    };
    for (int i = 0; i < (int)(sizeof keys / sizeof keys[0]); i++) {
        char set[256], pre[160];
        snprintf(set, sizeof set, "%s=", keys[i]);
        const char *sets[] = {set};
        CHECK_MSG(parse_bad(k_full, sets, 1) == GP_ERR_INVALID, "%s", set);
        snprintf(pre, sizeof pre, "e.g. --set %s=", keys[i]);
        const char *m = strstr(gp_last_error(), pre);
        const char *end = m ? strstr(m, ", or leave the --set out") : NULL;
        CHECK_MSG(m && end, "%s: %s", set, gp_last_error());
        if (!m || !end) continue;
        m += strlen(pre);
        snprintf(set, sizeof set, "%s=%.*s", keys[i], (int)(end - m), m);
        /* k_full's explicit balance fits its own layers: a model example
         * loads with balance: auto, and an entry's example is one count,
         * which the others need not add up with (said, file:line) */
        const char *sets2[] = {set, "pipeline.balance=auto"};
        bool model_key = !strncmp(keys[i], "model", 5);
        gp_config c2;
        gp_status st = parse_set(k_full, sets2, model_key ? 2 : 1, &c2);
        if (!strcmp(keys[i], "pipeline.balance.0") && st != GP_OK)
            CHECK_MSG(strstr(gp_last_error(), "pipeline.balance sums to"), "%s", gp_last_error());
        else
            CHECK_MSG(st == GP_OK, "the example --set %s does not load: %s", set,
                      gp_last_error());
        if (st == GP_OK) gp_config_free(&c2);
    }
    const char *ms[] = {"data.mean=", "data.std="};
    for (int i = 0; i < 2; i++) CHECK(parse_bad(k_full, ms + i, 1) == GP_ERR_INVALID);
    const char *pair[] = {"data.mean=[0.5]", "data.std=[0.25]"}; /* the two examples */
    CHECK_OK(parse_set(k_full, pair, 2, &c));
    gp_config_free(&c);
}

/* xorshift64*, so the fuzz inputs are the same every run */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

static void test_fuzz(void)
{
    static const char alphabet[] = " \n:-[]{},#&*!|>'\"?%@`\t0123456789.abcdefghijklmnopqrstuvwxyz_=~";
    uint64_t seed = 0x9E3779B97F4A7C15ULL;
    size_t base_len = strlen(k_full);
    char buf[4096];
    int ok = 0, failed = 0, bad_status = 0, bad_msg = 0, write_bad = 0;
    /* GPIPE_CONFIG_FUZZ_ITERS=1000000 for a longer soak */
    const char *env = getenv("GPIPE_CONFIG_FUZZ_ITERS");
    int iters = env && atoi(env) > 0 ? atoi(env) : 6000;
    for (int it = 0; it < iters; it++) {
        size_t len;
        int mode = it % 4;
        if (mode == 0) { /* random bytes */
            len = (size_t)(rng_next(&seed) % 200);
            for (size_t i = 0; i < len; i++) buf[i] = (char)(rng_next(&seed) & 0xff);
        } else if (mode == 1) { /* random YAML-ish characters */
            len = (size_t)(rng_next(&seed) % 300);
            for (size_t i = 0; i < len; i++)
                buf[i] = alphabet[rng_next(&seed) % (sizeof alphabet - 1)];
        } else { /* mutations of a valid config */
            memcpy(buf, k_full, base_len);
            len = base_len;
            int edits = 1 + (int)(rng_next(&seed) % 4);
            for (int e = 0; e < edits; e++) {
                size_t pos = (size_t)(rng_next(&seed) % (len ? len : 1));
                int op = (int)(rng_next(&seed) % 4);
                char ch = mode == 2 ? alphabet[rng_next(&seed) % (sizeof alphabet - 1)]
                                    : (char)(rng_next(&seed) & 0xff);
                if (op == 0 && len) {
                    buf[pos] = ch;
                } else if (op == 1 && len + 1 < sizeof buf) {
                    memmove(buf + pos + 1, buf + pos, len - pos);
                    buf[pos] = ch;
                    len++;
                } else if (op == 2 && len) {
                    memmove(buf + pos, buf + pos + 1, len - pos - 1);
                    len--;
                } else if (len) { /* truncate */
                    len = pos;
                }
            }
        }
        /* a random override on some inputs */
        char setbuf[64];
        const char *sets[1] = {setbuf};
        int nsets = 0;
        if (it % 7 == 0) {
            size_t sl = (size_t)(rng_next(&seed) % 40);
            for (size_t i = 0; i < sl; i++)
                setbuf[i] = alphabet[rng_next(&seed) % (sizeof alphabet - 1)];
            setbuf[sl] = '\0';
            nsets = 1;
        }
        gp_config c;
        gp_error_clear();
        gp_status s = gp_config_parse("fuzz.yaml", buf, len, sets, nsets, &c);
        if (s == GP_OK) {
            ok++;
            /* what loaded writes back (overrides in) to what loads */
            char *t = NULL;
            if (!memchr(buf, 0, len)) {
                gp_status ws = gp_config_text_applied(&c, NULL, &t);
                gp_config w;
                gp_status rs = ws == GP_OK ? parse(t, &w) : ws;
                if (rs == GP_OK) gp_config_free(&w);
                if (rs != GP_OK && !write_bad++)
                    fprintf(stderr, "fuzz: written back, it does not load (%s):\n%.*s\n--- "
                            "as:\n%s\n", gp_last_error(), (int)len, buf, t ? t : "");
                free(t);
            }
        } else {
            failed++;
            if (s != GP_ERR_INVALID) bad_status++;
            const char *m = gp_last_error();
            if (strncmp(m, "fuzz.yaml:", 10) && strncmp(m, "--set ", 6)) {
                if (!bad_msg) fprintf(stderr, "fuzz: unexpected message: %s\n", m);
                bad_msg++;
            }
        }
        gp_config_free(&c);
    }
    CHECK(bad_status == 0);
    CHECK_MSG(bad_msg == 0, "%d messages without a position", bad_msg);
    CHECK_MSG(write_bad == 0, "%d configs that do not load once written back", write_bad);
    CHECK(ok + failed == iters);
    CHECK(ok > 0 && failed > 0);
    printf("fuzz: %d parsed, %d rejected\n", ok, failed);

    /* hostile shapes: deep nesting and alias bombs fail politely */
    char deep[2000];
    memset(deep, '[', 1000);
    deep[1000] = '\0';
    CHECK_ERR(parse_bad(deep, NULL, 0), GP_ERR_INVALID, "nested deeper than 64 levels");
    const char *bomb =
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
        "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
        "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n";
    CHECK_ERR(parse_bad(bomb, NULL, 0), GP_ERR_INVALID, "more than 200000 nodes");
    char longset[400];
    memset(longset, 0, sizeof longset);
    for (int i = 0; i < 100; i++) memcpy(longset + 2 * i, "a.", 2);
    memcpy(longset + 200, "b=1", 3);
    const char *ls[] = {longset};
    CHECK_ERR(parse_bad(k_base, ls, 1), GP_ERR_INVALID, "the key has more than 64 parts");
}

/* The library's callers give overrides, not --set: its messages say so
 * until a tool calls gp_names_use_flags(), as gpipe-train does first
 * (the tests below then check the tools' wording). */
static void test_override_names(void)
{
    gp_config c;
    const char *empty[] = {"train.steps="};
    CHECK_ERR(parse_set(k_base, empty, 1, &c), GP_ERR_INVALID,
              "override train.steps=: empty value; give a value, e.g. override "
              "train.steps=100, or leave the override out for the default");
    gp_names_use_flags();
    CHECK_ERR(parse_set(k_base, empty, 1, &c), GP_ERR_INVALID,
              "--set train.steps=: empty value; give a value, e.g. --set train.steps=100, or "
              "leave the --set out for the default");
}

int main(void)
{
    gp_log_set_level(GP_LOG_ERROR); /* warnings are checked in gp_config.warnings */
    test_override_names(); /* (first: it switches to the tools' names) */
    test_full();
    test_defaults();
    test_lockstep_default();
    test_skips();
    test_errors();
    test_unet_layers();
    test_amoebanet_layers();
    test_families();
    test_overrides();
    test_sizes();
    test_threads_warning();
    test_shadowed_override();
    test_ignored_schedule_keys();
    test_data_warnings();
    test_empty_override();
    test_text_applied();
    test_load();
    test_layer_places_utf8();
    test_fuzz();
    return gpt_finish("test_config");
}
