/*
 * test_unet.c — torchgpipe's U-Net in gpipe: the built-in family, binary
 * cross-entropy through the whole pipeline, and the synthetic masks.
 *
 *   - family: U-Net (5, 64) and (6, 72) have torchgpipe's 241 / 285
 *     top-level layers and 232,687,328 / 362,157,516 parameters (counted by
 *     running torchgpipe's benchmarks/models/unet in PyTorch), from shape
 *     inference alone (no device memory); every size of a small grid has
 *     the parameters of torchgpipe's channel table, counted independently
 *     below; layer k has torchgpipe's name and module for the layers that
 *     mark its structure; shape-only counts equal a built model's for
 *     layers with children (residual, add's projection, factorized_reduce,
 *     AmoebaNet-D's cells);
 *   - config: a bottleneck too small for instance norm, unet beside layers,
 *     a wrong in_channels, an unknown unet key and an unknown loss are
 *     errors that say what to change; cross_entropy on the U-Net's 4-D
 *     output, bce_with_logits on a 10-way linear output, a 2-channel U-Net
 *     against 1-channel masks, and class ids outside [0, 1] as BCE targets
 *     fail clearly (the last with GP_ERR_DATA naming the element), while a
 *     linear {out: 1} trains on 0 / 1 class ids;
 *   - masks: each pixel's target is its 3x3 neighbourhood's mean against
 *     half the range (a double-precision reference), the same for the
 *     same seed, and the loader crops and flips a mask with its image;
 *   - transparency: U-Net (depth 2, 2 convs, base 8) at 32x32 with BCE on 1,
 *     2 and 3 stages whose boundaries the skips cross (one between an
 *     instance norm and its leaky relu), m in {1, 4}, every
 *     checkpoint mode (and 1F1B, ZB-H1): per-step losses, the first step's
 *     gradients and the parameters after 3 steps equal the single-device
 *     run's bit for bit; 2 replicas x 2 stages give its parameters within
 *     float rounding (their targets come from the right samples);
 *   - training: configs/unet.yaml, shrunk, learns its masks: the test loss
 *     ends far below that of the best constant prediction.
 * Runs under ThreadSanitizer in CI (label "threads").
 */
#include "backend/cpu/cpu_impl.h" /* gp_cpu_isa_has */
#include "config/config.h"
#include "test_util.h"

#include <math.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static gp_device *devs[4];

/* model.unet at (C, side, side) with `extra` YAML lines appended under
 * model (indented two spaces) and the rest of the config after. */
static gp_status unet_cfg(int depth, int convs, int64_t base, int64_t side, const char *extra,
                          const char *rest, gp_config *c)
{
    char text[2048];
    snprintf(text, sizeof text,
             "model:\n  input: [3, %lld, %lld]\n"
             "  unet: {depth: %d, num_convs: %d, base: %lld}\n%s"
             "data: {dataset: synthetic, synthetic: {train: 16, test: 8, masks: true}}\n"
             "train: {batch_size: 4, seed: 5}\n%s",
             (long long)side, (long long)side, depth, convs, (long long)base,
             extra ? extra : "  loss: bce_with_logits\n", rest ? rest : "");
    return gp_config_parse("u.yaml", text, strlen(text), NULL, 0, c);
}

/* ---- the family --------------------------------------------------------------------- */

/* Parameters of torchgpipe's unet(depth, num_convs, base_channels, 3, 1),
 * from its channel dictionaries: a cell (stacked_convs) of n convolutions
 * in -> mid -> ... -> mid -> out (one in -> out when n = 1), 3x3 without
 * bias; the decoder's int(base * 2 ** (i - 1)) in double as Python has it;
 * the 1x1 segment to one channel. */
static int64_t torch_unet_params(int depth, int n, int64_t base)
{
    int64_t total = 0;
    for (int part = 0; part < 3; part++) {
        int cells = part == 1 ? 1 : depth;
        for (int i = 0; i < cells; i++) {
            int64_t in, mid, out;
            if (part == 0) { /* encoder */
                in = i == 0 ? 3 : base * (int64_t)pow(2, i - 1);
                mid = out = base * (int64_t)pow(2, i);
            } else if (part == 1) { /* bottleneck */
                in = base * (int64_t)pow(2, depth - 1);
                mid = base * (int64_t)pow(2, depth);
                out = in;
            } else { /* decoder */
                in = base * (int64_t)pow(2, i + 1);
                mid = out = (int64_t)((double)base * pow(2.0, i - 1));
            }
            if (n == 1) {
                total += 9 * in * out;
                continue;
            }
            total += 9 * in * mid + 9 * (n - 2) * mid * mid + 9 * mid * out;
        }
    }
    return total + (int64_t)((double)base * 0.5); /* segment: int(base / 2) -> 1 */
}

static void family_counts(void)
{
    static const struct {
        int convs;
        int64_t base, side;
        int layers;
        int64_t params;
    } want[] = {{5, 64, 192, 241, 232687328}, {6, 72, 192, 285, 362157516}};
    for (int q = 0; q < 2; q++) {
        gp_config c;
        gp_status s = unet_cfg(5, want[q].convs, want[q].base, want[q].side, NULL, NULL, &c);
        CHECK_OK(s);
        if (s != GP_OK) continue;
        CHECK_MSG(c.model.n_layers == want[q].layers, "U-Net (%d, %lld): %d layers, want %d",
                  want[q].convs, (long long)want[q].base, c.model.n_layers, want[q].layers);
        int64_t params = -1;
        CHECK_OK(gp_model_count_params(&c, &params));
        CHECK_MSG(params == want[q].params, "U-Net (%d, %lld): %lld parameters, want %lld",
                  want[q].convs, (long long)want[q].base, (long long)params,
                  (long long)want[q].params);
        CHECK(params == torch_unet_params(5, want[q].convs, want[q].base));
        gp_config_free(&c);
    }

    /* U-Net (5, 64): torchgpipe's flattened module names and types at the
     * layers that mark its structure (a unit is conv, dropout, norm, relu) */
    gp_config c;
    CHECK_OK(unet_cfg(5, 5, 64, 192, NULL, NULL, &c));
    const gp_layer_spec *l = c.model.layers;
    static const struct {
        int k;
        gp_layer_type type;
        const char *name, *stash, *pop;
    } marks[] = {
        {0, GP_LAYER_CONV2D, "encoder_0_encode_0_conv", "", ""},
        {1, GP_LAYER_DROPOUT2D, "encoder_0_encode_0_dropout", "", ""},
        {2, GP_LAYER_INSTANCE_NORM, "encoder_0_encode_0_norm", "", ""},
        {3, GP_LAYER_LEAKY_RELU, "encoder_0_encode_0_relu", "", ""},
        {19, GP_LAYER_LEAKY_RELU, "encoder_0_encode_4_relu", "", ""},
        {20, GP_LAYER_IDENTITY, "encoder_0_skip", "encoder_0", ""},
        {21, GP_LAYER_MAXPOOL2D, "encoder_0_down", "", ""},
        {22, GP_LAYER_CONV2D, "encoder_1_encode_0_conv", "", ""},
        {108, GP_LAYER_IDENTITY, "encoder_4_skip", "encoder_4", ""},
        {110, GP_LAYER_CONV2D, "bottleneck_0_0_conv", "", ""},
        {129, GP_LAYER_LEAKY_RELU, "bottleneck_0_4_relu", "", ""},
        {130, GP_LAYER_UPSAMPLE, "decoder_0_up", "", ""},
        {131, GP_LAYER_CONCAT, "decoder_0_skip", "", "encoder_4"},
        {132, GP_LAYER_CONV2D, "decoder_0_decode_0_conv", "", ""},
        {219, GP_LAYER_CONCAT, "decoder_4_skip", "", "encoder_0"},
        {239, GP_LAYER_LEAKY_RELU, "decoder_4_decode_4_relu", "", ""},
        {240, GP_LAYER_CONV2D, "segment", "", ""},
    };
    for (int q = 0; q < COUNT(marks) && c.model.n_layers == 241; q++) {
        const gp_layer_spec *sp = &l[marks[q].k];
        CHECK_MSG(sp->type == marks[q].type && !strcmp(sp->name, marks[q].name) &&
                  !strcmp(sp->stash, marks[q].stash) &&
                  !strcmp(sp->n_pop ? sp->pop[0] : "", marks[q].pop),
                  "layer %d is %s '%s', want %s '%s'", marks[q].k, gp_layer_type_name(sp->type),
                  sp->name, gp_layer_type_name(marks[q].type), marks[q].name);
    }
    /* every unit's options as torchgpipe's conv_dropout_norm_relu */
    int convs = 0, units_ok = 0;
    for (int k = 0; k < c.model.n_layers; k++) {
        if (l[k].type != GP_LAYER_CONV2D) continue;
        convs++;
        if (k == c.model.n_layers - 1) {
            CHECK(l[k].out == 1 && l[k].kernel.h == 1 && l[k].kernel.w == 1 && !l[k].bias);
            continue;
        }
        units_ok += l[k].kernel.h == 3 && l[k].kernel.w == 3 && l[k].padding.h == 1 &&
                    l[k].padding.w == 1 && !l[k].bias && l[k].init == GP_INIT_DEFAULT &&
                    l[k + 1].type == GP_LAYER_DROPOUT2D && fabsf(l[k + 1].p - 0.1f) < 1e-7f &&
                    l[k + 2].type == GP_LAYER_INSTANCE_NORM &&
                    l[k + 3].type == GP_LAYER_LEAKY_RELU && fabsf(l[k + 3].slope - 0.01f) < 1e-7f;
    }
    CHECK_MSG(convs == 5 * 11 + 1 && units_ok == 5 * 11, "%d convolutions, %d units as "
              "torchgpipe's", convs, units_ok);
    gp_config_free(&c);

    /* a grid of sizes against torchgpipe's channel table (an odd base: the
     * decoder's last cell has int(base / 2) channels), and the output of
     * one channel at the input's size */
    for (int depth = 1; depth <= 4; depth++)
        for (int n = 1; n <= 3; n++)
            for (int64_t base = 5; base <= 8; base += 3) {
                gp_status s = unet_cfg(depth, n, base, 32, NULL, NULL, &c);
                CHECK_OK(s);
                if (s != GP_OK) continue;
                int64_t params = -1;
                CHECK_OK(gp_model_count_params(&c, &params));
                CHECK_MSG(params == torch_unet_params(depth, n, base) &&
                          c.model.n_layers == 2 * depth * (4 * n + 2) + 4 * n + 1,
                          "U-Net depth %d, %d convs, base %lld: %lld parameters (want %lld), "
                          "%d layers", depth, n, (long long)base, (long long)params,
                          (long long)torch_unet_params(depth, n, base), c.model.n_layers);
                gp_model m;
                if (depth == 3 && n == 2 && base == 5) { /* built: the shapes run */
                    CHECK_OK(gp_model_build(&c, devs[0], &m));
                    CHECK(gp_model_param_count(&m) == params);
                    CHECK(m.output.ndim == 4 && m.output.dims[1] == 1 && m.output.dims[2] == 32 &&
                          m.output.dims[3] == 32 && m.targets == 32 * 32);
                    gp_model_free(&m);
                }
                gp_config_free(&c);
            }
}

/* Shape-only counts (gp_layer_meta) against a built model where layers
 * make children: residual, add with its projection, factorized_reduce,
 * AmoebaNet's cells. */
static void meta_counts(const char *text)
{
    gp_config c;
    CHECK_OK(gp_config_parse("m.yaml", text, strlen(text), NULL, 0, &c));
    int64_t meta = -1;
    CHECK_OK(gp_model_count_params(&c, &meta));
    gp_model m;
    CHECK_OK(gp_model_build(&c, devs[0], &m));
    CHECK_MSG(meta == gp_model_param_count(&m) && meta > 0, "shape-only count %lld, built %lld",
              (long long)meta, (long long)gp_model_param_count(&m));
    /* and the same parameters, by name and shape, layer by layer */
    gp_shape in = m.input, outs[32];
    GP_ASSERT(m.n_layers <= 32);
    bool same = true;
    for (int k = 0; k < m.n_layers; k++) {
        gp_layer l;
        gp_shape ins[1 + GP_MAX_POPS];
        gp_skip_map_inputs(&m.skips, k, &in, outs, ins);
        CHECK_OK(gp_layer_meta(&c.model.layers[k], k, ins, &l));
        outs[k] = l.out_shape;
        same = same && l.n_params == m.layers[k].n_params;
        for (int p = 0; same && p < l.n_params; p++) {
            const gp_param *a = &l.params[p], *b = &m.layers[k].params[p];
            same = !strcmp(a->name, b->name) && a->is_buffer == b->is_buffer &&
                   gp_tensor_mem(&a->value) == NULL && gp_tensor_numel(&a->value) ==
                   gp_tensor_numel(&b->value);
        }
        gp_layer_destroy(&l);
    }
    CHECK_MSG(same, "a shape-only layer's parameters differ from the built one's");
    gp_model_free(&m);
    gp_config_free(&c);
}

/* ---- config errors ------------------------------------------------------------------ */

static void config_errors(void)
{
    gp_config c;
    CHECK_ERR(unet_cfg(5, 2, 8, 32, NULL, NULL, &c), GP_ERR_INVALID,
              "32 x 32 becomes 1 x 1 at the bottleneck, where instance_norm needs more than one");
    CHECK_ERR(unet_cfg(2, 2, 8, 32, "  layers: [relu]\n", NULL, &c), GP_ERR_INVALID,
              "model has both layers and unet");
    CHECK_ERR(unet_cfg(2, 2, 8, 32, "  loss: bce_with_logits\n", NULL, &c), GP_OK, "");
    gp_config_free(&c);
    const char *bad_in = "model:\n  input: [3, 32, 32]\n  unet: {depth: 2, in_channels: 1}\n";
    CHECK_ERR(gp_config_parse("u.yaml", bad_in, strlen(bad_in), NULL, 0, &c), GP_ERR_INVALID,
              "u.yaml:3:33: model.unet.in_channels = 1 but model.input has 3 channels");
    const char *bad_key = "model:\n  input: [3, 32, 32]\n  unet: {depth: 2, num_conv: 1}\n";
    CHECK_ERR(gp_config_parse("u.yaml", bad_key, strlen(bad_key), NULL, 0, &c), GP_ERR_INVALID,
              "num_convs");
    CHECK_ERR(unet_cfg(2, 2, 8, 32, "  loss: mse\n", NULL, &c), GP_ERR_INVALID,
              "cross_entropy, bce_with_logits");

    /* cross-entropy on the U-Net's (N, 1, H, W): the build says what to do */
    CHECK_OK(unet_cfg(2, 2, 8, 32, "  loss: cross_entropy\n", NULL, &c));
    gp_model m;
    CHECK_ERR(gp_model_build(&c, devs[0], &m), GP_ERR_INVALID,
              "cross_entropy needs (N, classes) or (N, T, classes); end the model with flatten "
              "and linear, or for one target per output element (masks) set model.loss: "
              "bce_with_logits");
    gp_config_free(&c);
}

/* gp_train_run on YAML text, quietly. */
static gp_status train_text(const char *text, gp_train_result *res)
{
    gp_config c;
    GP_TRY(gp_config_parse("t.yaml", text, strlen(text), NULL, 0, &c));
    gp_train_opts o = {.progress = 0, .quiet = true};
    gp_status s = gp_train_run(&c, &o, res);
    gp_config_free(&c);
    return s;
}

static void loss_target_errors(void)
{
    gp_train_result r;
    char text[1024];
    const char *linear = "model:\n  input: [3, 8, 8]\n  layers: [flatten, {linear: {out: %d}}]\n"
                         "  loss: bce_with_logits\n"
                         "data: {dataset: synthetic, synthetic: {train: 16, test: 8, "
                         "classes: %d%s}}\ntrain: {batch_size: 4, steps: 2}\n";
    /* ten logits per sample, one class id */
    snprintf(text, sizeof text, linear, 10, 2, "");
    CHECK_ERR(train_text(text, &r), GP_ERR_INVALID,
              "bce_with_logits takes one target per output element, but the model's output is "
              "(1, 10) per sample (10 elements)");
    /* one logit against a mask of 64 pixels */
    snprintf(text, sizeof text, linear, 1, 2, ", masks: true");
    CHECK_ERR(train_text(text, &r), GP_ERR_INVALID, "a mask (1, 1, 8, 8)");
    /* said from the shapes, before the model is placed: devices far too
     * small for it (an out-of-memory if placement came first), and
     * cross-entropy with fewer outputs than classes */
    snprintf(text, sizeof text, "%spipeline: {devices: 2, memory: 1KiB}\n", linear);
    char text2[1024];
    snprintf(text2, sizeof text2, text, 10, 2, ", masks: true");
    CHECK_ERR(train_text(text2, &r), GP_ERR_INVALID, "compares the output with the masks");
    snprintf(text2, sizeof text2,
             "model:\n  input: [3, 8, 8]\n  layers: [flatten, {linear: {out: 3}}]\n"
             "data: {dataset: synthetic, synthetic: {train: 16, test: 8, classes: 5}}\n"
             "train: {batch_size: 4, steps: 2}\npipeline: {devices: 2, memory: 1KiB}\n");
    CHECK_ERR(train_text(text2, &r), GP_ERR_INVALID,
              "layer 1 (linear) at t.yaml:3:22: the model has 3 outputs but the data has 5 "
              "classes; make this layer's out 5");
    /* a built-in model is told by its classes option, at its key */
    snprintf(text2, sizeof text2,
             "model:\n  input: [3, 32, 32]\n  amoebanet: {layers: 3, filters: 16, classes: 3}\n"
             "data: {dataset: synthetic, synthetic: {train: 16, test: 8, classes: 5, "
             "shape: [3, 32, 32]}}\ntrain: {batch_size: 4, steps: 2}\n");
    CHECK_ERR(train_text(text2, &r), GP_ERR_INVALID,
              "t.yaml:3:3: model.amoebanet has 3 classes but the data has 5; set "
              "model.amoebanet.classes: 5");
    /* class ids 0..9 are not a yes / no: said from the data's classes before
     * training (it was the loss's "target 5 is not in [0, 1]" at the first
     * batch, which suggested rescaling the targets); the loss's own check of
     * each element is test_layers' */
    snprintf(text, sizeof text, linear, 1, 10, "");
    CHECK_ERR(train_text(text, &r), GP_ERR_INVALID,
              "model.loss bce_with_logits with one output takes class ids 0 and 1, but "
              "synthetic");
    CHECK_MSG(strstr(gp_last_error(), "has 10 classes; for 10 classes use model.loss: "
                                      "cross_entropy with a last linear layer of out 10"),
              "%s", gp_last_error());
    /* ids 0 / 1: binary classification with one logit trains */
    snprintf(text, sizeof text, linear, 1, 2, "");
    CHECK_OK(train_text(text, &r));
    CHECK(r.steps == 2 && isfinite(r.final_loss) && r.test_accuracy >= 0 &&
          r.test_accuracy <= 1);

    /* a U-Net of two output channels against 1-channel masks */
    const char *two = "model:\n  input: [3, 16, 16]\n"
                      "  unet: {depth: 1, num_convs: 1, base: 4, out_channels: 2}\n"
                      "  loss: bce_with_logits\n"
                      "data: {dataset: synthetic, synthetic: {train: 8, test: 4, masks: true}}\n"
                      "train: {batch_size: 4, steps: 1}\n";
    CHECK_ERR(train_text(two, &r), GP_ERR_INVALID,
              "output is (1, 2, 16, 16) per sample and a mask (1, 1, 16, 16)");
}

/* ---- masks ------------------------------------------------------------------------ */

static void masks(void)
{
    gp_data_config dc;
    memset(&dc, 0, sizeof dc);
    dc.dataset = GP_DATASET_SYNTHETIC;
    dc.synthetic_train = 24;
    dc.synthetic_test = 8;
    dc.synthetic_classes = 10;
    dc.synthetic_masks = true;
    dc.synthetic_shape[0] = 3;
    dc.synthetic_shape[1] = 9;
    dc.synthetic_shape[2] = 7;
    gp_dataset a = {0}, b = {0}, t = {0};
    CHECK_OK(gp_dataset_load(&dc, true, 4, &a));
    CHECK_OK(gp_dataset_load(&dc, true, 4, &b));
    CHECK_OK(gp_dataset_load(&dc, false, 4, &t));
    int64_t hw = 9 * 7;
    CHECK(a.masks && b.masks && t.masks && !memcmp(a.masks, b.masks, (size_t)(24 * hw)));
    CHECK(memcmp(a.masks, t.masks, (size_t)(8 * hw)) != 0);
    /* the reference: mean of the 3x3 window inside the image, over the
     * channels, in double, against 1/2 */
    int64_t wrong = 0, ones = 0;
    for (int64_t i = 0; i < a.n; i++)
        for (int64_t y = 0; y < a.h; y++)
            for (int64_t x = 0; x < a.w; x++) {
                double sum = 0;
                int cnt = 0;
                for (int64_t ch = 0; ch < a.c; ch++)
                    for (int64_t yy = y - 1; yy <= y + 1; yy++)
                        for (int64_t xx = x - 1; xx <= x + 1; xx++) {
                            if (yy < 0 || yy >= a.h || xx < 0 || xx >= a.w) continue;
                            sum += a.images[((i * a.c + ch) * a.h + yy) * a.w + xx] / 255.0;
                            cnt++;
                        }
                int want = sum / cnt > 0.5;
                wrong += a.masks[i * hw + y * a.w + x] != want;
                ones += want;
            }
    CHECK_MSG(wrong == 0, "%lld mask pixels differ from the reference", (long long)wrong);
    CHECK_MSG(ones > a.n * hw / 5 && ones < a.n * hw * 4 / 5, "%lld of %lld pixels are 1",
              (long long)ones, (long long)(a.n * hw));
    /* a limit keeps the first masks */
    dc.train_limit = 5;
    gp_dataset lim = {0};
    CHECK_OK(gp_dataset_load(&dc, true, 4, &lim));
    CHECK(lim.n == 5 && !memcmp(lim.masks, a.masks, (size_t)(5 * hw)));
    gp_dataset_free(&lim);

    /* the loader: y is each sample's mask, cropped and flipped as its image */
    dc.train_limit = 0;
    dc.crop_padding = 2;
    dc.hflip = true;
    dc.normalize = false;
    gp_loader_opts lo = {.batch_size = 6, .shuffle = true, .augment = true, .prefetch = 1,
                         .seed = 9, .masks = true};
    gp_loader *ld = NULL;
    CHECK_OK(gp_loader_create(&a, &dc, &lo, &ld));
    int64_t order[24];
    gp_data_epoch_order(a.n, true, 9, 0, order);
    uint8_t img[3 * 63], mk[63];
    int64_t bad_x = 0, bad_y = 0;
    for (int bi = 0; ld && bi < 2; bi++) {
        gp_batch bt;
        CHECK_OK(gp_loader_next(ld, &bt));
        for (int64_t i = 0; i < bt.n; i++) {
            int64_t pos = bt.first + i, src = order[pos];
            int dy, dx;
            bool flip;
            gp_data_augment_draw(9, 0, pos, 2, true, &dy, &dx, &flip);
            gp_data_augment_apply(a.images + src * 3 * hw, 3, 9, 7, dy, dx, flip, img);
            gp_data_augment_apply(a.masks + src * hw, 1, 9, 7, dy, dx, flip, mk);
            for (int64_t p = 0; p < 3 * hw; p++)
                bad_x += bt.x[i * 3 * hw + p] != (float)img[p] * (1.0f / 255.0f);
            for (int64_t p = 0; p < hw; p++) bad_y += bt.y[i * hw + p] != (float)mk[p];
        }
    }
    CHECK_MSG(bad_x == 0 && bad_y == 0, "%lld pixels and %lld targets differ", (long long)bad_x,
              (long long)bad_y);
    gp_loader_destroy(ld);
    /* masks asked of a dataset without them */
    gp_dataset none = {0};
    CHECK_OK(gp_synthetic_make(4, 2, 1, 4, 4, 1, &none));
    ld = NULL;
    CHECK_ERR(gp_loader_create(&none, &dc, &lo, &ld), GP_ERR_INVALID, "has none");
    gp_dataset_free(&none);
    gp_dataset_free(&a);
    gp_dataset_free(&b);
    gp_dataset_free(&t);
}

/* ---- transparency ----------------------------------------------------------------- */

enum { BATCH = 8 };

/* U-Net depth 2, 2 convs per cell, base 8, at 3x32x32: 49 layers; the
 * skips are encoder_0 (layer 8 -> 39) and encoder_1 (18 -> 29). */
static gp_act_storage act; /* train.activations of transparency(): auto (FP32), or bf16 */

static void transparency(int n, int m, gp_checkpoint_mode ck, gp_schedule_kind kind, int *failed)
{
    gp_config c;
    if (unet_cfg(2, 2, 8, 32, NULL, NULL, &c) != GP_OK) {
        CHECK_MSG(0, "config: %s", gp_last_error());
        return;
    }
    c.train.activations = act;
    /* 2 stages: both skips cross the boundary after layer 24 (a
     * convolution, before its dropout2d); 3 stages: encoder_0 crosses both
     * (after 9 and 26), encoder_1 the second, which falls between an
     * instance norm and its leaky relu (the norm reads its own output
     * there, the relu's in place over it elsewhere: the same bits) */
    static const int b1[1] = {49}, b2[2] = {25, 24}, b3[3] = {10, 17, 22};
    /* zb-v on 2 devices: 4 stages, the first and last on device 0, the
     * skips crossing the V's turn and ending on the device they left */
    static const int b4[4] = {10, 15, 12, 12};
    CHECK(c.model.layers[26].type == GP_LAYER_INSTANCE_NORM &&
          c.model.layers[26].leaky_after == 0.01f && c.model.layers[27].leaky_after == 0.0f);
    const int *bal = kind == GP_SCHEDULE_ZB_V ? b4 : n == 1 ? b1 : n == 2 ? b2 : b3;
    if (kind == GP_SCHEDULE_ZB_V) c.pipeline.virtual_stages = 2;
    c.pipeline.chunks = m;
    c.pipeline.checkpoint = ck;
    c.pipeline.schedule = kind;
    gp_model ref, pip;
    CHECK_OK(gp_model_build(&c, devs[0], &ref));
    CHECK_OK(gp_model_build_placed(&c, devs, n, bal, &pip));
    bool same[3] = {false, false, false};
    gpt_compare_steps(&c, &ref, &pip, BATCH, 3, same);
    if (!(same[0] && same[1] && same[2])) (*failed)++;
    CHECK_MSG(same[0] && same[1] && same[2], "U-Net%s %s n=%d m=%d ckpt=%s: loss %s, grads %s, "
              "params %s", act == GP_ACT_BF16 ? " in bf16" : "", gp_schedule_kind_name(kind), n,
              m, gp_checkpoint_mode_name(ck),
              same[0] ? "same" : "DIFFER", same[1] ? "same" : "DIFFER",
              same[2] ? "same" : "DIFFER");
    gp_model_free(&ref);
    gp_model_free(&pip);
    gp_config_free(&c);
}

/* The loss is the mean over every pixel, the accuracy per pixel: with the
 * targets flipped the same logits (same model, same dropout, lr 0) get the
 * other pixels right, and the two losses add up to the mean of softplus(z)
 * + softplus(-z) = |z| + 2 log(1 + exp(-|z|)) >= 2 log 2 per pixel: a
 * per-sample sum would be 1024 times that. */
static void loss_is_per_pixel(void)
{
    gp_config c;
    CHECK_OK(unet_cfg(2, 2, 8, 32, NULL, NULL, &c));
    gp_model m[2];
    gp_step_stats st[2];
    int64_t per = 3 * 32 * 32, t = 32 * 32;
    float *x = malloc((size_t)(BATCH * per) * sizeof *x);
    float *y = malloc((size_t)(BATCH * t) * sizeof *y);
    gpt_make_batch(&c, BATCH, 0, x, y);
    gpt_make_masks(BATCH * t, 0, y);
    for (int q = 0; q < 2; q++) {
        CHECK_OK(gp_model_build(&c, devs[0], &m[q]));
        CHECK(m[q].targets == t && m[q].loss == GP_LOSS_BCE_WITH_LOGITS);
        CHECK_OK(gp_model_train_step(&m[q], &c, x, y, BATCH, 2, 0.0, &st[q]));
        for (int64_t k = 0; k < BATCH * t; k++) y[k] = 1.0f - y[k];
        gp_model_free(&m[q]);
    }
    CHECK_NEAR(st[0].accuracy + st[1].accuracy, 1.0, 1e-12, 0);
    double two_log2 = 2 * log(2.0), sum = st[0].loss + st[1].loss;
    CHECK_MSG(sum >= two_log2 - 1e-6 && sum < two_log2 + 2, "losses %g + %g", st[0].loss,
              st[1].loss);
    CHECK(st[0].samples == BATCH);
    free(x);
    free(y);
    gp_config_free(&c);
}

/* 2 replicas x 2 stages against one device running their 2 x m
 * micro-batches: replica 1's targets must be those of its own samples.
 * The replicas' gradients are summed in another order, so the parameters
 * agree to rounding, not bit for bit: 2e-7 (relative, floor 1e-2) where
 * oneDNN's direct convolutions compute the weights' gradients (AVX2,
 * AVX-512); below AVX2 (GPIPE_CPU_ISA=sse41) it takes its im2col and sgemm
 * path ("x64:gemm:jit"), whose sums move more with where the tensors lie:
 * 5.7e-5, the conv weights of 0.001-0.007 off by 3e-7 to 6e-7, the losses
 * still within 3e-9. */
static void replicas(void)
{
    gp_config c;
    CHECK_OK(unet_cfg(2, 2, 8, 32, NULL, NULL, &c));
    c.pipeline.chunks = 2;
    c.pipeline.replicas = 2;
    int bal[2] = {25, 24};
    gp_model ref, rep;
    CHECK_OK(gp_model_build(&c, devs[0], &ref));
    CHECK_OK(gp_model_build_replicated(&c, devs, 2, 2, bal, &rep));
    int64_t t = ref.targets, per = 3 * 32 * 32;
    float *x = malloc((size_t)(BATCH * per) * sizeof *x);
    float *y = malloc((size_t)(BATCH * t) * sizeof *y);
    double worst_loss = 0;
    for (int step = 0; step < 3; step++) {
        gpt_make_batch(&c, BATCH, step, x, y);
        gpt_make_masks(BATCH * t, step, y);
        gp_step_stats a, b;
        CHECK_OK(gp_model_train_step(&ref, &c, x, y, BATCH, 4, 0.05, &a));
        CHECK_OK(gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, &b));
        worst_loss = fmax(worst_loss, fabs(a.loss - b.loss) / fabs(a.loss));
        CHECK(a.accuracy == b.accuracy);
    }
    bool same_count;
    double worst = gpt_param_diff(&ref, &rep, &same_count);
    double tol = gp_cpu_isa_has(dnnl_cpu_isa_avx2) ? 1e-5 : 2e-4;
    CHECK_MSG(same_count && worst <= tol && worst_loss <= 1e-6,
              "U-Net on 2 replicas: parameters differ by %.3g relative, loss by %.3g", worst,
              worst_loss);
    CHECK_OK(gp_model_check_replicas(&rep));
    free(x);
    free(y);
    gp_model_free(&ref);
    gp_model_free(&rep);
    gp_config_free(&c);
}

/* ---- training --------------------------------------------------------------------- */

/* configs/unet.yaml at a size that trains in a second: the test loss must
 * end well below that of the best constant prediction (the masks' own
 * entropy) and the pixel accuracy above the majority's. */
static void trains(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/unet.yaml", GPIPE_SOURCE_DIR);
    const char *sets[] = {"model.unet.depth=2", "model.unet.num_convs=2", "model.unet.base=8",
                          "model.input=[3,32,32]", "data.synthetic.train=96",
                          "data.synthetic.test=32", "train.steps=36", "train.eval_each_epoch=false",
                          "pipeline.balance=[25,24]", "pipeline.chunks=2", "pipeline.threads=1"};
    gp_config c;
    gp_status s = gp_config_load(path, sets, COUNT(sets), &c);
    CHECK_OK(s);
    if (s != GP_OK) return;
    CHECK(c.model.loss == GP_LOSS_BCE_WITH_LOGITS && c.data.synthetic_masks);
    gp_dataset test = {0};
    CHECK_OK(gp_dataset_load(&c.data, false, c.train.seed, &test));
    int64_t ones = 0, all = test.n * test.h * test.w;
    for (int64_t q = 0; q < all; q++) ones += test.masks[q];
    double p = (double)ones / (double)all;
    double entropy = -(p * log(p) + (1 - p) * log(1 - p)), majority = fmax(p, 1 - p);
    gp_dataset_free(&test);
    gp_train_opts o = {.progress = 0, .quiet = true};
    gp_train_result r;
    CHECK_OK(gp_train_run(&c, &o, &r));
    CHECK_MSG(r.test_loss < 0.7 * entropy && r.test_accuracy > majority + 0.1,
              "after %lld steps: test loss %.4f (constant prediction %.4f), pixel accuracy "
              "%.3f (majority %.3f)", (long long)r.steps, r.test_loss, entropy,
              r.test_accuracy, majority);
    gp_config_free(&c);
}

int main(void)
{
    gpt_open_cpu_devices(devs, 4, 1);
    family_counts();
    meta_counts("model:\n  input: [3, 16, 16]\n  layers:\n"
                "    - conv2d: {out: 8, kernel: 3, padding: 1}\n    - batchnorm\n"
                "    - residual: {out: 12, stride: 2}\n    - identity: {stash: a}\n"
                "    - conv2d: {out: 16, kernel: 3, padding: 1, stride: 2}\n"
                "    - add: {pop: a, out: 16, stride: 2}\n    - factorized_reduce: {out: 20}\n"
                "    - global_avgpool\n    - flatten\n    - linear: {out: 10}\n");
    meta_counts("model:\n  input: [3, 32, 32]\n"
                "  amoebanet: {layers: 3, filters: 16, classes: 10}\n");
    config_errors();
    loss_target_errors();
    masks();
    loss_is_per_pixel();
    int failed = 0;
    for (int n = 1; n <= 3; n++)
        for (int m = 1; m <= 4; m += 3)
            for (int ck = 0; ck < 3; ck++)
                transparency(n, m, (gp_checkpoint_mode)ck, GP_SCHEDULE_GPIPE, &failed);
    transparency(3, 4, GP_CKPT_EXCEPT_LAST, GP_SCHEDULE_1F1B, &failed);
    transparency(3, 4, GP_CKPT_NEVER, GP_SCHEDULE_ZB_H1, &failed);
    transparency(2, 4, GP_CKPT_ALWAYS, GP_SCHEDULE_ZB_V, &failed);
    transparency(2, 4, GP_CKPT_EXCEPT_LAST, GP_SCHEDULE_ZB_V, &failed);
    /* on bf16 storage (every U-Net layer with bf16 kernels of its own: the
     * norm before the third stage's boundary rounds its relu's output as
     * the relu in place stores it), 3 stages, m = 4, every checkpoint mode */
    act = GP_ACT_BF16;
    for (int ck = 0; ck < 3; ck++) transparency(3, 4, (gp_checkpoint_mode)ck, GP_SCHEDULE_GPIPE, &failed);
    act = GP_ACT_AUTO;
    CHECK_MSG(failed == 0, "%d transparency runs differ", failed);
    replicas();
    trains();
    for (int j = 0; j < 4; j++) gp_device_close(devs[j]);
    return gpt_finish("test_unet");
}
