/*
 * config_keys.c — every key a config may contain, in one table: its type,
 * default, range and meaning (config_impl.h, "the keys").
 *
 * The unknown-key check (config_walk.c) takes its dotted paths from here;
 * `gpipe-train --help-config` prints it (gp_config_help); every typed getter
 * checks its call against its row (gp_cfg_key_agrees), so a default or a
 * range changed at a call site and not here, or a key read without a row,
 * fails the first test that parses a config (tests/test_config_keys.c
 * parses every config in configs/ and bench/ and every layer type);
 * tests/test_config_doc.py holds docs/config.md to the printed table in
 * both directions.
 *
 * Adding a key: one row below, in its section (a K_* line: key, default,
 * range where it has one, flags, meaning), the getter call that reads it,
 * and its line in docs/config.md.
 */
#include "config/config_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BIG (9223372036854775807.0) /* INT64_MAX: no upper end */
#define P2(k) ((double)((int64_t)1 << (k)))

/* One row per kind of key; `fl` is GP_CFG_VARIES where the default depends
 * on other keys (then `def` says how), else 0 (or a range's open ends). */
#define K_MAP(k, text) {k, GP_CFG_MAP, NULL, NULL, 0, 0, 0, text}
#define K_INT(k, def, lo, hi, fl, text) {k, GP_CFG_INT, NULL, def, lo, hi, fl, text}
#define K_NUM(k, def, lo, hi, fl, text) {k, GP_CFG_NUM, NULL, def, lo, hi, fl, text}
#define K_BOOL(k, def, fl, text) {k, GP_CFG_BOOL, NULL, def, 0, 0, fl, text}
#define K_STR(k, def, fl, text) {k, GP_CFG_STR, NULL, def, 0, 0, fl, text}
#define K_ENUM(k, names, def, fl, text) {k, GP_CFG_ENUM, names, def, 0, 0, fl, text}
#define K_SIZE(k, text) {k, GP_CFG_SIZE, NULL, NULL, 0, 0, 0, text}
#define K_OTHER(k, form, def, lo, hi, fl, text) {k, GP_CFG_OTHER, form, def, lo, hi, fl, text}

static const gp_cfg_key k_keys[] = {
    /* the sections first: the unknown-key check suggests the first row whose
     * last part is the key ("train" misplaced: the section) */
    K_MAP("model", "the model: input, layers (or a built-in model), loss"),
    K_MAP("pipeline", "devices, balance, micro-batches, schedule, checkpointing, memory"),
    K_MAP("data", "the dataset, its normalization and augmentation"),
    K_MAP("train", "steps, batch, optimizer, schedule, precision, snapshots"),
    /* ---- model ---- */
    K_OTHER("model.input", "[C, H, W], [F] or F", NULL, 1, P2(24), 0,
            "shape of one sample (required); [T] token ids for a language model"),
    K_OTHER("model.layers", "a list of layers", NULL, 0, 0, 0,
            "the layers, each a bare type or {type: {options}} (required unless a built-in "
            "model is given)"),
    K_ENUM("model.loss", "cross_entropy, bce_with_logits", "cross_entropy", 0,
           "the loss: softmax cross-entropy against class ids, or BCEWithLogitsLoss against "
           "targets in [0, 1]"),
    K_NUM("model.label_smoothing", "0", 0, 1, GP_CFG_HI_OPEN,
          "cross_entropy's label smoothing, as PyTorch's CrossEntropyLoss(label_smoothing)"),
    K_STR("model.init_from", NULL, 0,
          "initial weights: a safetensors file, llm.c's .bin or a Hugging Face model folder"),
    K_MAP("model.resnet", "a torchvision bottleneck ResNet in place of model.layers"),
    K_INT("model.resnet.depth", "50", 1, 1000, 0, "50, 101 or 152"),
    K_INT("model.resnet.classes", "1000", 1, P2(24), 0, "outputs of fc"),
    K_MAP("model.amoebanet", "torchgpipe's AmoebaNet-D in place of model.layers"),
    K_INT("model.amoebanet.layers", "18", 3, 3000, 0, "L, the normal cells (a multiple of 3)"),
    K_INT("model.amoebanet.filters", "256", 16, P2(20), 0,
          "D, a multiple of 16: the cells have D / 2, D, 2D and 4D channels per state"),
    K_INT("model.amoebanet.classes", "1000", 1, P2(24), 0, "outputs of classify.fc"),
    K_MAP("model.unet", "torchgpipe's U-Net in place of model.layers"),
    K_INT("model.unet.depth", "5", 1, 16, 0, "levels: encoder and decoder cells"),
    K_INT("model.unet.num_convs", "5", 1, 1000, 0, "torchgpipe's B: conv units per cell"),
    K_INT("model.unet.base", "64", 2, P2(16), 0,
          "torchgpipe's C: channels of the first cell; level i has base x 2^i"),
    K_INT("model.unet.in_channels", "model.input's channels", 1, P2(24), GP_CFG_VARIES,
          "must equal model.input's channels"),
    K_INT("model.unet.out_channels", "1", 1, P2(24), 0, "channels of the output (segment)"),
    K_MAP("model.gpt", "a GPT-2 in place of model.layers"),
    K_INT("model.gpt.layers", "12", 1, 10000, 0, "L, the Transformer blocks"),
    K_INT("model.gpt.heads", "12", 1, P2(16), 0, "attention heads; must divide width"),
    K_INT("model.gpt.width", "768", 1, P2(20), 0, "C, the model width (the MLP is 4C wide)"),
    K_INT("model.gpt.positions", "1024", 1, P2(24), 0,
          "rows of the position table (n_positions); at least T"),
    K_INT("model.gpt.vocab", "50257", 1, P2(24), 0, "tokens (256 for byte-level files)"),
    K_INT("model.gpt.vocab_pad", "1", 1, P2(16), 0,
          "pads the vocabulary up to a multiple of this (llm.c: 128)"),
    K_NUM("model.gpt.dropout", "0", 0, 1, GP_CFG_HI_OPEN,
          "dropout after the embedding and each residual projection"),
    K_BOOL("model.gpt.tie", "true", 0, "the LM head's weight is the token embedding's"),
    K_MAP("model.llama", "a Llama (or Qwen2) in place of model.layers"),
    K_INT("model.llama.layers", "32", 1, 10000, 0, "L, the blocks (num_hidden_layers)"),
    K_INT("model.llama.heads", "32", 1, P2(16), 0, "query heads (num_attention_heads)"),
    K_INT("model.llama.kv_heads", "heads", 1, P2(16), GP_CFG_VARIES,
          "k and v heads (num_key_value_heads), dividing heads"),
    K_INT("model.llama.width", "4096", 1, P2(20), 0, "C (hidden_size)"),
    K_INT("model.llama.intermediate", "11008", 1, P2(24), 0,
          "I, the MLP's width (intermediate_size)"),
    K_INT("model.llama.vocab", "32000", 1, P2(24), 0, "tokens (vocab_size)"),
    K_INT("model.llama.positions", "2048", 1, P2(40), 0,
          "the longest sequence (max_position_embeddings); at least T"),
    K_NUM("model.llama.rope_theta", "10000", 1, INFINITY, GP_CFG_LO_OPEN,
          "rope's base (rope_theta)"),
    K_MAP("model.llama.rope_scaling",
          "Llama 3's rope scaling (rope_scaling, rope_type llama3); none when absent"),
    K_NUM("model.llama.rope_scaling.factor", "8 (or config.json's)", 1, INFINITY, GP_CFG_VARIES,
          "rope_scaling's factor"),
    K_NUM("model.llama.rope_scaling.low_freq_factor", "1 (or config.json's)", 0, INFINITY,
          GP_CFG_LO_OPEN | GP_CFG_VARIES, "rope_scaling's low_freq_factor"),
    K_NUM("model.llama.rope_scaling.high_freq_factor", "4 (or config.json's)", 0, INFINITY,
          GP_CFG_LO_OPEN | GP_CFG_VARIES,
          "rope_scaling's high_freq_factor, above low_freq_factor"),
    K_INT("model.llama.rope_scaling.original_positions", "8192 (or config.json's)", 1, P2(40),
          GP_CFG_VARIES, "rope_scaling's original_max_position_embeddings"),
    K_NUM("model.llama.rms_eps", "1e-6", 0, INFINITY, GP_CFG_LO_OPEN,
          "the norms' eps (rms_norm_eps)"),
    K_BOOL("model.llama.tie", "false", 0,
           "the LM head's weight is the token embedding's (tie_word_embeddings)"),
    K_BOOL("model.llama.qkv_bias", "false (true for a qwen2 folder)", GP_CFG_VARIES,
           "biases on q, k and v (Qwen2's)"),
    K_NUM("model.llama.std", "0.02", 0, INFINITY, GP_CFG_LO_OPEN,
          "the init's standard deviation (initializer_range)"),

    /* ---- layer options: model.layers.#.<option>; which layer types take
     * which is config_model.c's gp_cfg_layer_keys ---- */
    K_INT("model.layers.#.in", "0", 0, P2(31), 0, "input features or channels; 0 = inferred"),
    K_INT("model.layers.#.out", NULL, 1, P2(31), 0, "output features or channels"),
    K_OTHER("model.layers.#.kernel", "an integer or [height, width]", NULL, 1, P2(16), 0,
            "the window's size"),
    K_OTHER("model.layers.#.stride", "an integer or [height, width]", "1 (pools: the kernel)", 1,
            P2(16), GP_CFG_VARIES | GP_CFG_ALSO_INT, "the window's step"),
    K_OTHER("model.layers.#.padding", "an integer or [height, width]", "0", 0, P2(16), 0,
            "zeros added on each side (pools: at most half the kernel)"),
    K_BOOL("model.layers.#.bias", "true", 0, "the layer has a bias"),
    K_ENUM("model.layers.#.init", "default, kaiming_normal_fan_out, normal", "default", 0,
           "weight init: PyTorch's default, torchvision's kaiming_normal_ fan_out, or "
           "normal(0, std)"),
    K_NUM("model.layers.#.std", "0.02", 0, INFINITY, GP_CFG_LO_OPEN, "init: normal's deviation"),
    K_NUM("model.layers.#.momentum", "0.1", 0, 1, 0,
          "batch norm's running-statistics momentum (PyTorch's convention)"),
    K_NUM("model.layers.#.eps", "1e-5", 0, INFINITY, GP_CFG_LO_OPEN, "a norm's eps"),
    K_BOOL("model.layers.#.sync", "false", 0,
           "synchronise batch-norm statistics across data-parallel replicas"),
    K_NUM("model.layers.#.p", "0.5", 0, 1, GP_CFG_HI_OPEN, "drop probability"),
    K_NUM("model.layers.#.slope", "0.01", 0, INFINITY, 0, "leaky relu's negative slope"),
    K_INT("model.layers.#.scale", "2", 1, P2(16), 0, "upsampling factor"),
    K_INT("model.layers.#.heads", "1", 1, P2(16), 0, "attention (query) heads"),
    K_INT("model.layers.#.kv_heads", "heads", 1, P2(16), GP_CFG_VARIES,
          "k and v heads, dividing heads (grouped-query attention)"),
    K_NUM("model.layers.#.theta", "10000", 1, INFINITY, GP_CFG_LO_OPEN, "rope's base"),
    K_ENUM("model.layers.#.scaling", "none, llama3", "none", 0, "rope's frequency scaling"),
    K_NUM("model.layers.#.factor", "8", 1, INFINITY, 0, "llama3 scaling's factor"),
    K_NUM("model.layers.#.low_freq_factor", "1", 0, INFINITY, GP_CFG_LO_OPEN,
          "llama3 scaling's low_freq_factor"),
    K_NUM("model.layers.#.high_freq_factor", "4", 0, INFINITY, GP_CFG_LO_OPEN,
          "llama3 scaling's high_freq_factor"),
    K_INT("model.layers.#.original_positions", "8192", 1, P2(40), 0,
          "llama3 scaling's original_max_position_embeddings"),
    K_INT("model.layers.#.vocab", NULL, 1, P2(24), 0, "the embedding's tokens"),
    K_INT("model.layers.#.dim", NULL, 1, P2(31), 0, "the embedding's width"),
    K_INT("model.layers.#.positions", NULL, 0, P2(24), 0,
          "rows of the position table (0: none), at least T"),
    K_BOOL("model.layers.#.count_include_pad", "true", 0,
           "the padding counts in an average pool's divisor"),
    K_BOOL("model.layers.#.reduction", "false", 0, "an AmoebaNet reduction cell"),
    K_OTHER("model.layers.#.pop", "a stash's name, or a list of names", NULL, 0, 0, 0,
            "the stashed tensor(s) the layer takes"),
    K_STR("model.layers.#.stash", NULL, 0, "keep the layer's output under this name for a pop"),
    K_STR("model.layers.#.tie", NULL, 0,
          "the name of an earlier embedding or linear layer whose weight this one's is"),
    K_STR("model.layers.#.name", NULL, 0, "a label for messages and weight files (unique)"),

    /* ---- pipeline ---- */
    K_OTHER("pipeline.devices", "a list of names or maps, a name, a count, or a grid",
            "[cpu:0]", 0, 0, 0, "the devices of the stages (cpu:N, cuda:N), one row per replica "
            "in a grid"),
    K_STR("pipeline.devices.#.name", NULL, 0, "the device (cpu:N, cuda:N); required in a map"),
    K_SIZE("pipeline.devices.#.memory", "this device's capacity (default: pipeline.memory)"),
    K_INT("pipeline.devices.#.threads", "pipeline.threads", 0, 4096, GP_CFG_VARIES,
          "this CPU device's math threads"),
    K_OTHER("pipeline.balance", "auto or a list of layer counts", "auto", 0, 0, 0,
            "layers per stage; auto profiles and finds the exact min-max split"),
    K_INT("pipeline.chunks", "1", 1, GP_MAX_CHUNKS, 0,
          "micro-batches per mini-batch, at most train.batch_size"),
    K_ENUM("pipeline.checkpoint", "always, except_last, never", "except_last", 0,
           "activation recomputation, or {mode: MODE, keep: [TYPE, ...]}"),
    K_ENUM("pipeline.checkpoint.mode", "always, except_last, never", "except_last", 0,
           "with checkpoint: {mode, keep}: the mode, as checkpoint: MODE"),
    K_OTHER("pipeline.checkpoint.keep", "a list of layer types", NULL, 0, 0, 0,
            "layer types whose outputs a checkpointed forward keeps, so the recompute runs "
            "only the others (e.g. [linear, attention])"),
    K_BOOL("pipeline.lockstep", "true with schedule: gpipe, else false", GP_CFG_VARIES,
           "copies of clock k wait for every computation before k (false: free-running)"),
    K_ENUM("pipeline.schedule", "gpipe, 1f1b, zb-h1, interleaved, zb-v, dualpipe-v, v-half, v-min",
           "gpipe", 0, "the pipeline schedule, or {file: PATH}, a schedule as PyTorch's per-rank "
           "action CSV"),
    K_STR("pipeline.schedule.file", NULL, 0,
          "with schedule: {file: PATH}: the CSV of each device's actions"),
    K_INT("pipeline.virtual", "1 (2 with interleaved and the V schedules)", 1, GP_MAX_DEVICES,
          GP_CFG_VARIES, "stages per device"),
    K_INT("pipeline.threads", "0", 0, 4096, 0, "math threads per CPU device; 0 = cores / devices"),
    K_SIZE("pipeline.memory", "capacity per device, e.g. 512MiB; unlimited when absent"),
    K_INT("pipeline.replicas", "1", 1, 1024, 0, "data-parallel replicas of the pipeline"),
    K_ENUM("pipeline.copy_precision", "auto, fp32, bf16", "auto", 0,
           "what the copies between stages carry"),
    K_NUM("pipeline.peer_timeout", "600", 0, 1e7, GP_CFG_LO_OPEN,
          "seconds a rank waits for another under mpirun before every rank stops"),

    /* ---- data ---- */
    K_ENUM("data.dataset", "synthetic, mnist, fashion-mnist, cifar10, image_folder, tokens",
           "fashion-mnist", 0, "the dataset"),
    K_STR("data.path", "per dataset", GP_CFG_VARIES,
          "where the dataset is (required for image_folder and tokens)"),
    K_BOOL("data.shuffle", "true", 0, "shuffle the training set every epoch"),
    K_BOOL("data.normalize", "true", 0, "(x - mean) / std per channel"),
    K_OTHER("data.mean", "a number or one per channel", "the dataset's", 0, 0, 0,
            "per-channel mean (with data.std)"),
    K_OTHER("data.std", "a number > 0 or one per channel", "the dataset's", 0, 0, 0,
            "per-channel standard deviation (with data.mean)"),
    K_MAP("data.augment", "training-time augmentation"),
    K_INT("data.augment.crop_padding", "0", 0, 1024, 0,
          "random crop after zero padding by this many pixels; 0 = off"),
    K_BOOL("data.augment.hflip", "false (image_folder: true)", GP_CFG_VARIES,
           "random horizontal flips"),
    K_BOOL("data.augment.random_resized_crop", "true", 0,
           "image_folder: torchvision's RandomResizedCrop (false: the evaluation crop), or a "
           "map {scale, ratio}"),
    K_OTHER("data.augment.random_resized_crop.scale", "[low, high]", "[0.08, 1]", 0, 1,
            GP_CFG_LO_OPEN, "the crop's area fraction"),
    K_OTHER("data.augment.random_resized_crop.ratio", "[low, high]", "[0.75, 1.333]", 0,
            INFINITY, GP_CFG_LO_OPEN, "the crop's aspect ratio (log-uniform)"),
    K_INT("data.augment.resize", "0 (crop x 256 / 224)", 0, 65535, GP_CFG_VARIES,
          "evaluation: the shorter side is resized to this, then centre-cropped"),
    K_INT("data.prefetch", "2", 1, 1024, 0, "batches the loader thread prepares ahead"),
    K_INT("data.train_limit", "0", 0, BIG, 0, "use only the first N training samples; 0 = all"),
    K_INT("data.test_limit", "0", 0, BIG, 0, "use only the first N test samples; 0 = all"),
    K_MAP("data.synthetic", "dataset: synthetic's sizes"),
    K_INT("data.synthetic.train", "1024", 1, P2(40), 0, "training samples"),
    K_INT("data.synthetic.test", "256", 1, P2(40), 0, "test samples"),
    K_INT("data.synthetic.classes", "10", 2, P2(20), 0, "classes"),
    K_OTHER("data.synthetic.shape", "[C, H, W], [F] or F", "model.input", 1, P2(24), 0,
            "one sample's shape"),
    K_BOOL("data.synthetic.masks", "false", 0,
           "also a mask per sample (targets of bce_with_logits)"),
    K_ENUM("data.layout", "classification, segmentation", "classification", 0,
           "image_folder: class folders, or images with masks"),
    K_ENUM("data.masks", "binary, index", "binary", 0,
           "image_folder segmentation: what a mask's pixel values are"),
    K_INT("data.workers", "0", 0, 1024, 0,
          "image_folder decode threads; 0 = the cores the devices leave"),
    K_ENUM("data.on_bad_file", "error, skip", "error", 0,
           "an image that cannot be read: stop, or skip it with a warning"),
    K_STR("data.cache_dir", NULL, 0, "where the image folder's file index is cached"),

    /* ---- train ---- */
    K_INT("train.epochs", "1", 1, P2(40), 0, "passes over the training set (unless steps > 0)"),
    K_INT("train.steps", "0", 0, BIG, 0, "total optimizer steps; 0 = use epochs"),
    K_INT("train.batch_size", "64", 1, P2(24), 0, "mini-batch size"),
    K_INT("train.seed", "0", 0, 18446744073709551615.0, 0,
          "run seed: init, shuffling, dropout"),
    K_OTHER("train.optimizer", "sgd, adam, adamw, or a map", "sgd", 0, 0, 0,
            "the optimizer; a name is short for {type: name}"),
    K_ENUM("train.optimizer.type", "sgd, adam, adamw", "sgd", 0,
           "PyTorch's SGD, Adam or AdamW"),
    K_NUM("train.optimizer.lr", "0.01 (sgd), 0.001 (adam, adamw)", 0, INFINITY, GP_CFG_VARIES,
          "base learning rate"),
    K_NUM("train.optimizer.momentum", "0.9", 0, 1, GP_CFG_HI_OPEN, "sgd only; 0 is plain SGD"),
    K_OTHER("train.optimizer.betas", "[b1, b2]", "[0.9, 0.999]", 0, 1, GP_CFG_HI_OPEN,
            "adam, adamw only: the moments' decays"),
    K_NUM("train.optimizer.eps", "1e-8", 0, INFINITY, GP_CFG_LO_OPEN, "adam, adamw only"),
    K_BOOL("train.optimizer.nesterov", "false", 0, "sgd only; needs momentum > 0"),
    K_NUM("train.optimizer.weight_decay", "0 (adamw: 0.01)", 0, INFINITY, GP_CFG_VARIES,
          "L2 penalty (sgd, adam) or decoupled decay (adamw)"),
    K_BOOL("train.optimizer.decay_bias_and_norm", "false", 0,
           "also decay biases and norm parameters"),
    K_OTHER("train.schedule", "constant, step, cosine, or a map", "constant", 0, 0, 0,
            "the learning-rate schedule; a name is short for {type: name}"),
    K_ENUM("train.schedule.type", "constant, step, cosine", "constant", 0,
           "the schedule's shape"),
    K_INT("train.schedule.warmup_steps", "0", 0, BIG, 0,
          "linear warm-up from warmup_start x lr over this many steps"),
    K_NUM("train.schedule.warmup_start", "0", 0, 1, 0, "the warm-up's start, a fraction of lr"),
    K_INT("train.schedule.step_size", "1000", 1, BIG, 0, "step: decay every this many steps"),
    K_NUM("train.schedule.gamma", "0.1", 0, INFINITY, GP_CFG_LO_OPEN, "step: decay factor"),
    K_NUM("train.schedule.min_lr", "0", 0, INFINITY, 0, "cosine: the floor"),
    K_ENUM("train.lr_scaling", "none, linear", "none", 0,
           "linear: lr x batch_size / base_batch"),
    K_INT("train.base_batch", "batch_size", 1, P2(24), GP_CFG_VARIES,
          "reference batch for linear scaling"),
    K_INT("train.log_every", "50", 0, BIG, 0, "a log line every N steps; 0 = off"),
    K_BOOL("train.eval_each_epoch", "true", 0, "evaluate on the test split after every epoch"),
    K_INT("train.eval_batch_size", "batch_size", 1, P2(24), GP_CFG_VARIES,
          "samples per evaluation batch"),
    K_NUM("train.clip_grad_norm", "0", 0, INFINITY, 0,
          "> 0: clip the global gradient norm to this; 0 = off"),
    K_ENUM("train.precision", "fp32, tf32, bf16", "fp32", 0,
           "the math of convolutions and matrix products"),
    K_ENUM("train.activations", "auto, fp32, bf16", "auto", 0,
           "what activations, their gradients and stage copies are stored as"),
    K_BOOL("train.deterministic", "false", 0,
           "GPUs: deterministic convolution algorithms, the same every run"),
    K_MAP("train.snapshot", "periodic snapshots (save and resume)"),
    K_INT("train.snapshot.every_steps", "0", 0, BIG, 0, "a snapshot every N steps; 0 = off"),
    K_NUM("train.snapshot.every_minutes", "0", 0, INFINITY, 0,
          "... or when this many minutes passed; 0 = off"),
    K_INT("train.snapshot.keep", "3", 1, P2(20), 0, "newest snapshots kept"),
    K_STR("train.snapshot.dir", "snapshots", 0, "where snapshots go"),
    K_STR("train.tensorboard", NULL, 0, "a directory for TensorBoard event files"),
};

const gp_cfg_key *gp_cfg_keys(int *n)
{
    *n = GP_COUNT(k_keys);
    return k_keys;
}

/* `key` with its all-digit parts as '#', into buf. */
static void key_pattern(const char *key, char *buf, size_t cap)
{
    size_t o = 0;
    for (const char *p = key; *p && o + 1 < cap;) {
        size_t n = strcspn(p, ".");
        bool digits = n > 0 && strspn(p, "0123456789") == n;
        if (digits) buf[o++] = '#';
        for (size_t i = 0; !digits && i < n && o + 1 < cap; i++) buf[o++] = p[i];
        p += n;
        if (*p == '.' && o + 1 < cap) buf[o++] = *p++;
    }
    buf[o] = '\0';
}

const gp_cfg_key *gp_cfg_key_find(const char *key)
{
    char pat[256];
    key_pattern(key, pat, sizeof pat);
    for (int i = 0; i < GP_COUNT(k_keys); i++)
        if (!strcmp(k_keys[i].key, pat)) return &k_keys[i];
    return NULL;
}

int gp_cfg_key_children(const char *sect, const char **out, int cap)
{
    size_t sl = strlen(sect);
    int n = 0;
    for (int i = 0; i < GP_COUNT(k_keys) && n < cap; i++) {
        const char *k = k_keys[i].key;
        if (!strncmp(k, sect, sl) && k[sl] == '.' && !strchr(k + sl + 1, '.')) out[n++] = k + sl + 1;
    }
    return n;
}

/* The names joined as the table writes them: "a, b, c". */
static bool names_agree(const char *form, const char *const *names, int count)
{
    char list[512];
    gp_cfg_list_names(names, count, list, sizeof list);
    return form && !strcmp(form, list);
}

static _Noreturn void drift(const char *name, const char *what)
{
    fprintf(stderr, "config key %s: %s (src/config/config_keys.c's row and the getter's call "
            "must agree)\n", name, what);
    abort();
}

void gp_cfg_key_agrees(const char *name, gp_cfg_type type, double num, const char *text,
                       double lo, double hi, int flags, const char *const *names, int count)
{
    const gp_cfg_key *k = gp_cfg_key_find(name);
    if (!k) drift(name, "read by a getter but not in the table");
    bool also_int = type == GP_CFG_INT && (k->flags & GP_CFG_ALSO_INT);
    if (type != GP_CFG_MAP && k->type != type && !also_int) drift(name, "of another type");
    if (type == GP_CFG_INT || type == GP_CFG_NUM || type == GP_CFG_OTHER) {
        int open = GP_CFG_LO_OPEN | GP_CFG_HI_OPEN;
        if (k->lo != lo || k->hi != hi || (k->flags & open) != (flags & open))
            drift(name, "its range differs");
    }
    if (type == GP_CFG_ENUM && !names_agree(k->form, names, count))
        drift(name, "its names differ");
    if (k->flags & GP_CFG_VARIES) return;
    if (type == GP_CFG_INT && k->def && strtod(k->def, NULL) != num)
        drift(name, "its default differs");
    /* compared as the 32-bit float the value is kept in, for float keys and
     * double keys alike (0.9f and 0.9 are the same default) */
    if (type == GP_CFG_NUM && k->def && (float)strtod(k->def, NULL) != (float)num)
        drift(name, "its default differs");
    if ((type == GP_CFG_BOOL || type == GP_CFG_STR || type == GP_CFG_ENUM) &&
        strcmp(k->def ? k->def : "", text ? text : ""))
        drift(name, "its default differs");
}
