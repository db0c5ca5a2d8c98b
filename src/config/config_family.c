/*
 * config_family.c — built-in model families: `model.resnet`,
 * `model.amoebanet`, `model.unet` (the models GPipe and torchgpipe are
 * measured on) and `model.gpt` (GPT-2, the model pipelines train today)
 * expands into the plain layer list a user could have written, with the
 * sizes as values `--set` changes (`--set model.resnet.depth=152`).
 *
 * The expansion follows torchgpipe's benchmark models layer for layer
 * (kakaobrain/torchgpipe benchmarks/models/resnet: torchvision's ResNet v1.5
 * flattened, each bottleneck 11 top-level layers), so gpipe's layer k is
 * torchgpipe's partition index k and a torchgpipe balance such as
 * [16, 27, 31, ...] means the same split here.  Layers are named as
 * torchgpipe's flattened modules ("layer3_5_conv2"); skips are named after
 * their block ("layer3_5").
 *
 * Initialisation as torchvision's ResNet (and torchgpipe's copy of it):
 * every convolution, the projection shortcuts' included, kaiming_normal_
 * (mode='fan_out', nonlinearity='relu') (init: kaiming_normal_fan_out);
 * batch norms weight 1 and bias 0 and the fc layer PyTorch's default, which
 * are gpipe's defaults already.
 */
#include "config/config_impl.h"
#include "core/hf_config.h"
#include "core/json.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    gp_layer_spec *specs;
    int n, cap;
    const char *file;
    int line, column;
    /* the --sets that changed the family's options ("" if none) */
    char set[sizeof ((gp_layer_spec *)0)->set];
} spec_list;

/* Every override inside the family's map, each once, joined by " and "
 * into buf ("model.amoebanet.layers=3 and model.amoebanet.filters=131072"):
 * any of them may be what a layer's error is about, so a message names
 * them all (naming the first alone blamed one for another's size).  buf
 * stays as it was when the map came from the file alone; where it would
 * not hold them all, the list ends in " and others" (room for which is
 * kept: OTHERS bytes). */
enum { OTHERS = sizeof " and others" };
static void family_sets(const gp_ynode *n, char *buf, size_t len)
{
    if (!n) return;
    if (n->set && !strstr(buf, n->set)) {
        size_t at = strlen(buf), add = strlen(n->set) + (at ? 5 : 0);
        if (at + add + OTHERS <= len)
            snprintf(buf + at, len - at, "%s%s", at ? " and " : "", n->set);
        else if (at && !strstr(buf, " and others"))
            snprintf(buf + at, len - at, " and others");
    }
    for (int i = 0; i < n->n; i++) family_sets(n->items[i], buf, len);
}

/* The expansion of the family given at `key` with options `map`: its
 * layers carry the key's place and the family's overrides. */
static void list_start(spec_list *l, const gp_cfg_walk *w, const gp_ynode *key,
                       const gp_ynode *map)
{
    *l = (spec_list){.file = w->file, .line = key->line, .column = key->column};
    family_sets(map, l->set, sizeof l->set);
}

/* The expanded layers are the model's; the family's name and where it was
 * given are kept for messages about the model as a whole (the classes the
 * data has). */
static gp_status expanded(const gp_cfg_walk *w, gp_model_config *mc, const spec_list *l,
                          const char *family, const gp_ynode *key, bool *found)
{
    mc->layers = l->specs;
    mc->n_layers = l->n;
    snprintf(mc->family, sizeof mc->family, "%s", family);
    gp_yloc(w->file, key, mc->family_at, sizeof mc->family_at);
    *found = true;
    return GP_OK;
}

static gp_layer_spec *push(spec_list *l, gp_layer_type t, const char *name)
{
    GP_ASSERT(l->n < l->cap);
    gp_layer_spec *s = &l->specs[l->n++];
    *s = gp_layer_spec_default(t);
    snprintf(s->name, sizeof s->name, "%s", name);
    gp_cfg_keep_tail(s->file, sizeof s->file, l->file);
    s->line = l->line;
    s->column = l->column;
    gp_cfg_copy_text(s->set, sizeof s->set, l->set);
    return s;
}

static gp_layer_spec *conv(spec_list *l, const char *name, int64_t out, int64_t k, int64_t s,
                           int64_t p)
{
    gp_layer_spec *c = push(l, GP_LAYER_CONV2D, name);
    c->out = out;
    c->kernel = gp_hw_square(k);
    c->stride = gp_hw_square(s);
    c->padding = gp_hw_square(p);
    c->bias = false;
    c->init = GP_INIT_KAIMING_NORMAL_FAN_OUT; /* torchvision's ResNet init */
    return c;
}

/* torchvision's ResNet-50/101/152 (bottleneck, stride on the 3x3). */
static gp_status resnet(spec_list *l, int depth, int64_t classes)
{
    static const int blocks50[4] = {3, 4, 6, 3}, blocks101[4] = {3, 4, 23, 3},
                     blocks152[4] = {3, 8, 36, 3};
    const int *blocks = depth == 50 ? blocks50 : depth == 101 ? blocks101 : blocks152;
    int total = 0;
    for (int q = 0; q < 4; q++) total += blocks[q];
    l->cap = 4 + 11 * total + 3;
    l->specs = calloc((size_t)l->cap, sizeof *l->specs);
    if (!l->specs) return gp_error_set(GP_ERR_OOM, "out of memory expanding model.resnet");
    conv(l, "conv1", 64, 7, 2, 3);
    push(l, GP_LAYER_BATCHNORM, "bn1");
    push(l, GP_LAYER_RELU, "relu");
    gp_layer_spec *mp = push(l, GP_LAYER_MAXPOOL2D, "maxpool");
    mp->kernel = gp_hw_square(3);
    mp->stride = gp_hw_square(2);
    mp->padding = gp_hw_square(1);
    int64_t inplanes = 64;
    for (int q = 0; q < 4; q++) {
        int64_t planes = (int64_t)64 << q;
        for (int b = 0; b < blocks[q]; b++) {
            int64_t stride = q > 0 && b == 0 ? 2 : 1;
            char pre[32], nm[64];
            snprintf(pre, sizeof pre, "layer%d_%d", q + 1, b);
#define NAME(x) (snprintf(nm, sizeof nm, "%s_%s", pre, x), nm)
            gp_layer_spec *id = push(l, GP_LAYER_IDENTITY, NAME("identity"));
            snprintf(id->stash, sizeof id->stash, "%s", pre);
            conv(l, NAME("conv1"), planes, 1, 1, 0);
            push(l, GP_LAYER_BATCHNORM, NAME("bn1"));
            push(l, GP_LAYER_RELU, NAME("relu1"));
            conv(l, NAME("conv2"), planes, 3, stride, 1);
            push(l, GP_LAYER_BATCHNORM, NAME("bn2"));
            push(l, GP_LAYER_RELU, NAME("relu2"));
            conv(l, NAME("conv3"), planes * 4, 1, 1, 0);
            push(l, GP_LAYER_BATCHNORM, NAME("bn3"));
            gp_layer_spec *res = push(l, GP_LAYER_ADD, NAME("residual"));
            snprintf(res->pop[0], sizeof res->pop[0], "%s", pre);
            res->n_pop = 1;
            if (stride != 1 || inplanes != planes * 4) { /* the projection shortcut */
                res->out = planes * 4;
                res->stride = gp_hw_square(stride);
                res->init = GP_INIT_KAIMING_NORMAL_FAN_OUT;
            }
            push(l, GP_LAYER_RELU, NAME("relu3"));
#undef NAME
            inplanes = planes * 4;
        }
    }
    push(l, GP_LAYER_GLOBAL_AVGPOOL, "avgpool");
    push(l, GP_LAYER_FLATTEN, "flat");
    push(l, GP_LAYER_LINEAR, "fc")->out = classes;
    GP_ASSERT(l->n == l->cap);
    return GP_OK;
}

/* torchgpipe's AmoebaNet-D (benchmarks/models/amoebanet): a stem (relu,
 * 3x3 stride-2 conv, norm: torchgpipe's one module "stem1", three layers
 * here), two reduction cells (stem2, stem3), then L / 3 normal cells, a
 * reduction cell, L / 3 normal, a reduction, L / 3 normal, and the
 * classifier (torchgpipe's AvgPool2d(7) at 224x224 is the global average
 * pool; pool, flatten and fc are three layers here).  Channels per state
 * start at D / 4, doubling at each reduction cell.  Every cell but the
 * first also takes the output of the layer two before it: that layer
 * stashes it under its own name and the cell pops it (torchgpipe's (x,
 * skip) tuple). */
static gp_status amoebanet(spec_list *l, int layers, int64_t filters, int64_t classes)
{
    int r = layers / 3;
    int cells = 2 + 3 * r + 2;
    l->cap = 3 + cells + 3;
    l->specs = calloc((size_t)l->cap, sizeof *l->specs);
    if (!l->specs) return gp_error_set(GP_ERR_OOM, "out of memory expanding model.amoebanet");
    int64_t ch = filters / 4;
    push(l, GP_LAYER_RELU, "stem1.relu");
    gp_layer_spec *c = push(l, GP_LAYER_CONV2D, "stem1.conv");
    c->out = ch;
    c->kernel = gp_hw_square(3);
    c->stride = gp_hw_square(2);
    c->padding = gp_hw_square(1);
    c->bias = false;
    push(l, GP_LAYER_BATCHNORM, "stem1.bn");
    int first = l->n; /* the first cell's index */
    for (int k = 0; k < cells; k++) {
        /* stem2, stem3, normal x r, reduction, normal x r, reduction, normal x r */
        char nm[48];
        bool red;
        if (k < 2) {
            red = true;
            snprintf(nm, sizeof nm, "stem%d", k + 2);
        } else {
            int q = (k - 2) / (r + 1), i = (k - 2) % (r + 1);
            red = i == r;
            if (red) snprintf(nm, sizeof nm, "cell%d_reduction", 2 * q + 2);
            else snprintf(nm, sizeof nm, "cell%d_normal%d", 2 * q + 1, i + 1);
        }
        if (red) ch *= 2;
        gp_layer_spec *cell = push(l, GP_LAYER_AMOEBA_CELL, nm);
        cell->out = ch;
        cell->reduction = red;
        if (k >= 1) { /* pop what the layer two back stashed under its name */
            gp_layer_spec *from = &l->specs[first + k - 2];
            /* the names are this code's own ("cell3_normal6"), well under a
             * skip name's length; memcpy, as snprintf's truncation warning
             * cannot see that */
            size_t len = strlen(from->name) + 1;
            GP_ASSERT(len <= sizeof from->stash && len <= sizeof cell->pop[0]);
            memcpy(from->stash, from->name, len);
            memcpy(cell->pop[0], from->name, len);
            cell->n_pop = 1;
        }
    }
    push(l, GP_LAYER_GLOBAL_AVGPOOL, "classify.pool");
    push(l, GP_LAYER_FLATTEN, "classify.flat");
    push(l, GP_LAYER_LINEAR, "classify.fc")->out = classes;
    GP_ASSERT(l->n == l->cap);
    return GP_OK;
}

/* The multiple of 32 nearest to v, at least 32. */
static int64_t nearest32(int64_t v)
{
    int64_t r = (v + 16) / 32 * 32;
    return r < 32 ? 32 : r;
}

static gp_status parse_amoebanet(gp_cfg_walk *w, const gp_ynode *m, gp_model_config *mc,
                                 bool *found)
{
    /* given with no value (`amoebanet:`), as a map-valued key: an empty
     * map, every option its default */
    const gp_ynode *r = gp_ymap_get(m, "amoebanet"), *rkey = gp_ymap_key(m, "amoebanet");
    if (!rkey) return GP_OK;
    if (!gp_cfg_absent(gp_ymap_get(m, "layers")) || gp_ymap_key(m, "resnet"))
        return gp_cfg_bad(w, rkey, "model has amoebanet and %s; give one: amoebanet expands "
                          "into the layers",
                          gp_cfg_absent(gp_ymap_get(m, "layers")) ? "resnet" : "layers");
    if (!gp_cfg_absent(r) && r->kind != GP_YNODE_MAP)
        return gp_cfg_bad(w, r, "model.amoebanet must be a map, like {layers: 18, filters: "
                          "256, classes: 1000}");
    GP_TRY(gp_cfg_check_keys(w, r, "model.amoebanet"));
    int layers = 0;
    int64_t filters = 0, classes = 0;
    const char *sect = "model.amoebanet";
    GP_TRY(gp_cfg_get_int32(w, r, sect, "layers", 18, 3, 3000, &layers));
    GP_TRY(gp_cfg_get_int(w, r, sect, "filters", 256, 16, (int64_t)1 << 20, &filters));
    GP_TRY(gp_cfg_get_int(w, r, sect, "classes", 1000, 1, (int64_t)1 << 24, &classes));
    if (layers % 3 != 0)
        return gp_cfg_bad(w, gp_ymap_get(r, "layers"), "model.amoebanet.layers must be a "
                          "multiple of 3 (three groups of normal cells), got %d", layers);
    if (filters % 16 != 0)
        return gp_cfg_bad(w, gp_ymap_get(r, "filters"), "model.amoebanet.filters must be a "
                          "multiple of 16 (the first cells have filters / 2 channels, whose "
                          "branches narrow to a quarter), got %lld", (long long)filters);
    /* The stem's stride-2 convolution takes H to ceil(H / 2), and the four
     * reduction cells after it each halve an even size: H / 2 rounded up a
     * multiple of 16, i.e. H a multiple of 32 (or one less).  Said here,
     * at the family, rather than at the first cell whose size is odd. */
    int64_t h = mc->input[1], wd = mc->input[2];
    if ((h + 1) / 2 % 16 || (wd + 1) / 2 % 16)
        return gp_cfg_bad(w, rkey, "model.amoebanet needs model.input's height and width to be "
                          "multiples of 32 (its stem halves them and four reduction cells halve "
                          "them again, each an even size), but the input is %lld x %lld; %lld x "
                          "%lld is the nearest", (long long)h, (long long)wd,
                          (long long)nearest32(h), (long long)nearest32(wd));
    spec_list l;
    list_start(&l, w, rkey, r);
    GP_TRY(amoebanet(&l, layers, filters, classes));
    return expanded(w, mc, &l, "amoebanet", rkey, found);
}

/* ---- U-Net ------------------------------------------------------------------
 *
 * torchgpipe's simplified U-Net (benchmarks/models/unet, `unet(depth,
 * num_convs, base_channels, input_channels, output_channels)`), flattened as
 * its flatten_sequential does, so gpipe's layer k is torchgpipe's index k
 * and its balances ([30, 66, 84, 61] for U-Net (5, 64) on 4 devices) mean
 * the same split.  "U-Net (B, C)" in torchgpipe's tables is num_convs = B,
 * base = C, at depth 5.  The top-level layers, by torchgpipe's names:
 *
 *   encoder_i (i = 0 .. depth-1):   a cell of base x 2^i channels
 *       (encoder_i_encode_q_*), encoder_i_skip (identity, stashes
 *       "encoder_i"), encoder_i_down (maxpool 2)
 *   bottleneck: a cell of base x 2^depth channels, out base x 2^(depth-1)
 *       (bottleneck_0_q_*)
 *   decoder_d (d = 0 .. depth-1, level i = depth-1-d):  decoder_d_up
 *       (upsample 2), decoder_d_skip (concat, pops "encoder_i", pads its
 *       input right / bottom to the popped size), a cell of
 *       int(base x 2^(i-1)) channels (decoder_d_decode_q_*)
 *   segment: conv2d 1x1 to out_channels, no bias
 *
 * A cell is num_convs units conv_dropout_norm_relu (q = 0 .. num_convs-1),
 * each four top-level layers: _conv (3x3, padding 1, no bias), _dropout
 * (dropout2d 0.1), _norm (instance_norm), _relu (leaky_relu 0.01); every
 * unit but the last outputs the cell's middle width, the last its output
 * width.  So depth x (4 num_convs + 2) x 2 + 4 num_convs + 1 layers: 241
 * for U-Net (5, 64), with 232,687,328 parameters.  Initialisation is
 * PyTorch's default (gpipe's) for every convolution; instance norm has no
 * parameters (affine=False). */

static void unet_unit(spec_list *l, const char *pre, int64_t out)
{
    char nm[64]; /* pre is at most 47 characters (unet_cell) */
    snprintf(nm, sizeof nm, "%.47s_conv", pre);
    gp_layer_spec *c = push(l, GP_LAYER_CONV2D, nm);
    c->out = out;
    c->kernel = gp_hw_square(3);
    c->padding = gp_hw_square(1);
    c->bias = false;
    snprintf(nm, sizeof nm, "%.47s_dropout", pre);
    push(l, GP_LAYER_DROPOUT2D, nm)->p = 0.1f;
    snprintf(nm, sizeof nm, "%.47s_norm", pre);
    push(l, GP_LAYER_INSTANCE_NORM, nm);
    snprintf(nm, sizeof nm, "%.47s_relu", pre);
    push(l, GP_LAYER_LEAKY_RELU, nm)->slope = 0.01f;
}

/* torchgpipe's stacked_convs: `convs` units, the last one to `out`. */
static void unet_cell(spec_list *l, const char *pre, int64_t mid, int64_t out, int convs)
{
    for (int q = 0; q < convs; q++) {
        char nm[48];
        snprintf(nm, sizeof nm, "%.32s_%d", pre, q);
        unet_unit(l, nm, q == convs - 1 ? out : mid);
    }
}

static gp_status unet(spec_list *l, int depth, int convs, int64_t base, int64_t out_channels)
{
    l->cap = 2 * depth * (4 * convs + 2) + 4 * convs + 1;
    l->specs = calloc((size_t)l->cap, sizeof *l->specs);
    if (!l->specs) return gp_error_set(GP_ERR_OOM, "out of memory expanding model.unet");
    char pre[64], nm[64];
    for (int i = 0; i < depth; i++) {
        snprintf(pre, sizeof pre, "encoder_%d_encode", i);
        unet_cell(l, pre, base << i, base << i, convs);
        snprintf(nm, sizeof nm, "encoder_%d_skip", i);
        snprintf(push(l, GP_LAYER_IDENTITY, nm)->stash, GP_SKIP_NAME, "encoder_%d", i);
        snprintf(nm, sizeof nm, "encoder_%d_down", i);
        gp_layer_spec *mp = push(l, GP_LAYER_MAXPOOL2D, nm);
        mp->kernel = gp_hw_square(2);
        mp->stride = gp_hw_square(2);
    }
    unet_cell(l, "bottleneck_0", base << depth, base << (depth - 1), convs);
    for (int d = 0; d < depth; d++) {
        int i = depth - 1 - d;
        int64_t width = i == 0 ? base / 2 : base << (i - 1); /* Python's int(base * 2 ** (i - 1)) */
        snprintf(nm, sizeof nm, "decoder_%d_up", d);
        push(l, GP_LAYER_UPSAMPLE, nm)->scale = 2;
        snprintf(nm, sizeof nm, "decoder_%d_skip", d);
        gp_layer_spec *cat = push(l, GP_LAYER_CONCAT, nm);
        snprintf(cat->pop[0], sizeof cat->pop[0], "encoder_%d", i);
        cat->n_pop = 1;
        snprintf(pre, sizeof pre, "decoder_%d_decode", d);
        unet_cell(l, pre, width, width, convs);
    }
    gp_layer_spec *seg = push(l, GP_LAYER_CONV2D, "segment");
    seg->out = out_channels;
    seg->kernel = gp_hw_square(1);
    seg->bias = false;
    GP_ASSERT(l->n == l->cap);
    return GP_OK;
}

/* model.unet: {depth, num_convs, base, in_channels, out_channels}. */
static gp_status parse_unet(gp_cfg_walk *w, const gp_ynode *m, gp_model_config *mc, bool *found)
{
    const gp_ynode *u = gp_ymap_get(m, "unet"), *ukey = gp_ymap_key(m, "unet");
    static const char *const others[] = {"layers", "resnet", "amoebanet"};
    for (int q = 0; q < GP_COUNT(others); q++)
        if (q ? gp_ymap_key(m, others[q]) != NULL : !gp_cfg_absent(gp_ymap_get(m, others[q])))
            return gp_cfg_bad(w, ukey, "model has both %s and unet; give one: unet expands into "
                              "the layers", others[q]);
    if (!gp_cfg_absent(u) && u->kind != GP_YNODE_MAP)
        return gp_cfg_bad(w, u, "model.unet must be a map, like {depth: 5, num_convs: 5, "
                          "base: 64}");
    GP_TRY(gp_cfg_check_keys(w, u, "model.unet"));
    const char *us = "model.unet";
    int depth = 0, convs = 0;
    int64_t base = 0, in_ch = 0, out_ch = 0;
    GP_TRY(gp_cfg_get_int32(w, u, us, "depth", 5, 1, 16, &depth));
    GP_TRY(gp_cfg_get_int32(w, u, us, "num_convs", 5, 1, 1000, &convs));
    GP_TRY(gp_cfg_get_int(w, u, us, "base", 64, 2, (int64_t)1 << 16, &base));
    GP_TRY(gp_cfg_get_int(w, u, us, "in_channels", mc->input[0], 1, (int64_t)1 << 24, &in_ch));
    GP_TRY(gp_cfg_get_int(w, u, us, "out_channels", 1, 1, (int64_t)1 << 24, &out_ch));
    if (base << depth > (int64_t)1 << 24)
        return gp_cfg_bad(w, gp_ymap_get(u, "base"), "model.unet: base %lld x 2^depth (%d) = "
                          "%lld channels at the bottleneck is too many (at most %lld)",
                          (long long)base, depth, (long long)(base << depth),
                          (long long)1 << 24);
    if (in_ch != mc->input[0])
        return gp_cfg_bad(w, gp_ymap_get(u, "in_channels"), "model.unet.in_channels = %lld but "
                          "model.input has %lld channel%s; make them agree (or leave "
                          "in_channels out: it defaults to model.input's)", (long long)in_ch,
                          (long long)mc->input[0], mc->input[0] == 1 ? "" : "s");
    /* depth max pools of 2: the bottleneck's instance norms need more than
     * one pixel to normalise over */
    int64_t bh = mc->input[1] >> depth, bw = mc->input[2] >> depth;
    if (bh * bw < 2)
        return gp_cfg_bad(w, gp_ymap_get(u, "depth") ? gp_ymap_get(u, "depth") : ukey,
                          "model.unet.depth = %d halves the input %d times: %lld x %lld becomes "
                          "%lld x %lld at the bottleneck, where instance_norm needs more than "
                          "one pixel; give a larger model.input or a smaller depth", depth,
                          depth, (long long)mc->input[1], (long long)mc->input[2],
                          (long long)bh, (long long)bw);
    spec_list l;
    list_start(&l, w, ukey, u);
    GP_TRY(unet(&l, depth, convs, base, out_ch));
    return expanded(w, mc, &l, "unet", ukey, found);
}

/* ---- GPT-2 ----------------------------------------------------------------
 *
 * GPT-2 (Radford et al. 2019; Hugging Face's GPT2LMHeadModel, llm.c's
 * train_gpt2.c) as gpipe's own layers, each named as Hugging Face's module
 * so a parameter's name is its key in GPT-2's state_dict:
 *
 *   transformer                  embedding (wte.weight, wpe.weight)
 *   [transformer.drop            dropout, only when dropout > 0]
 *   per block i (transformer.h.i.):
 *     ln_1, attn.c_attn (linear 3C), attn (attention, no parameters),
 *     attn.c_proj (linear C), [attn.resid_dropout], attn.residual (add),
 *     ln_2, mlp.c_fc (linear 4C), mlp.gelu, mlp.c_proj (linear C),
 *     [mlp.dropout], mlp.residual (add)
 *   transformer.ln_f, lm_head (linear vocab, no bias, tie: transformer)
 *
 * vocab_pad > 1 pads the vocabulary as llm.c does (Vp: vocab rounded up to
 * a multiple of vocab_pad, 50257 -> 50304 with 64 or 128), where the GPU's
 * matmuls run faster on the rounder size: wte.weight and lm_head get Vp
 * rows, those past vocab start at 0 (spec.valid_rows), the model's output
 * is Vp logits a position of which the loss reads the first vocab
 * (gp_model.classes), and so the padding never gets a gradient.
 *
 * The adds are gpipe's and have no parameters (Hugging Face's block adds
 * inline).  Residuals are skips on the layers that already produce the
 * block's input: the embedding (or the dropout after it) stashes "h0.in",
 * block i's first add pops "hi.in" and stashes "hi.mid", its second pops
 * that and stashes "h(i+1).in" for the next block: no identity layers,
 * as an AmoebaNet cell pops one name and stashes another.  The attention
 * probabilities have no dropout here (attention is one fused layer).
 *
 * Init as GPT-2 and llm.c: linear weights normal(0, 0.02), the two
 * residual projections (attn.c_proj, mlp.c_proj) normal(0, 0.02 /
 * sqrt(2 * layers)), biases 0 (init: normal); layer norms 1 and 0 and the
 * embedding's own (wte 0.02, wpe 0.01) are the layers' defaults. */

static gp_layer_spec *gpt_linear(spec_list *l, const char *name, int64_t out, float std)
{
    gp_layer_spec *c = push(l, GP_LAYER_LINEAR, name);
    c->out = out;
    c->init = GP_INIT_NORMAL;
    c->std = std;
    return c;
}

/* An add that pops `pop` and (stash non-empty) stashes its sum as `stash`. */
static void gpt_residual(spec_list *l, const char *name, const char *pop, const char *stash)
{
    gp_layer_spec *a = push(l, GP_LAYER_ADD, name);
    snprintf(a->pop[0], sizeof a->pop[0], "%s", pop);
    a->n_pop = 1;
    snprintf(a->stash, sizeof a->stash, "%s", stash);
}

static gp_status gpt(spec_list *l, int layers, int64_t heads, int64_t width, int64_t positions,
                     int64_t vocab, int64_t vocab_pad, float dropout, bool tie)
{
    int64_t vp = (vocab + vocab_pad - 1) / vocab_pad * vocab_pad; /* llm.c's Vp */
    int drop = dropout > 0.0f;
    l->cap = 1 + drop + layers * (10 + 2 * drop) + 2;
    l->specs = calloc((size_t)l->cap, sizeof *l->specs);
    if (!l->specs) return gp_error_set(GP_ERR_OOM, "out of memory expanding model.gpt");
    float std = 0.02f, proj_std = (float)(0.02 / sqrt(2.0 * layers));
    gp_layer_spec *emb = push(l, GP_LAYER_EMBEDDING, "transformer");
    emb->vocab = vp;
    emb->valid_rows = vp > vocab ? vocab : 0;
    emb->dim = width;
    emb->positions = positions;
    gp_layer_spec *in = emb; /* the layer whose output is block 0's input */
    if (drop) {
        in = push(l, GP_LAYER_DROPOUT, "transformer.drop");
        in->p = dropout;
    }
    snprintf(in->stash, sizeof in->stash, "h0.in");
    for (int i = 0; i < layers; i++) {
        char pre[32], nm[64], s_in[GP_SKIP_NAME], s_mid[GP_SKIP_NAME], s_next[GP_SKIP_NAME];
        snprintf(pre, sizeof pre, "transformer.h.%d", i);
        snprintf(s_in, sizeof s_in, "h%d.in", i);
        snprintf(s_mid, sizeof s_mid, "h%d.mid", i);
        /* the last block's output goes to ln_f only */
        snprintf(s_next, sizeof s_next, "%s", "");
        if (i + 1 < layers) snprintf(s_next, sizeof s_next, "h%d.in", i + 1);
#define NAME(x) (snprintf(nm, sizeof nm, "%s.%s", pre, x), nm)
        push(l, GP_LAYER_LAYER_NORM, NAME("ln_1"));
        gpt_linear(l, NAME("attn.c_attn"), 3 * width, std);
        push(l, GP_LAYER_ATTENTION, NAME("attn"))->heads = heads;
        gpt_linear(l, NAME("attn.c_proj"), width, proj_std);
        if (drop) push(l, GP_LAYER_DROPOUT, NAME("attn.resid_dropout"))->p = dropout;
        gpt_residual(l, NAME("attn.residual"), s_in, s_mid);
        push(l, GP_LAYER_LAYER_NORM, NAME("ln_2"));
        gpt_linear(l, NAME("mlp.c_fc"), 4 * width, std);
        push(l, GP_LAYER_GELU, NAME("mlp.gelu"));
        gpt_linear(l, NAME("mlp.c_proj"), width, proj_std);
        if (drop) push(l, GP_LAYER_DROPOUT, NAME("mlp.dropout"))->p = dropout;
        gpt_residual(l, NAME("mlp.residual"), s_mid, s_next);
#undef NAME
    }
    push(l, GP_LAYER_LAYER_NORM, "transformer.ln_f");
    gp_layer_spec *head = gpt_linear(l, "lm_head", vp, std);
    head->valid_rows = emb->valid_rows;
    head->bias = false;
    if (tie) snprintf(head->tie, sizeof head->tie, "%s", emb->name);
    GP_ASSERT(l->n == l->cap);
    return GP_OK;
}

/* model.gpt: {layers, heads, width, positions, vocab, vocab_pad, dropout, tie}. */
static gp_status parse_gpt(gp_cfg_walk *w, const gp_ynode *m, gp_model_config *mc, bool *found)
{
    const gp_ynode *g = gp_ymap_get(m, "gpt"), *gkey = gp_ymap_key(m, "gpt");
    static const char *const others[] = {"layers", "resnet", "amoebanet", "unet", "llama"};
    for (int q = 0; q < GP_COUNT(others); q++)
        if (q ? gp_ymap_key(m, others[q]) != NULL : !gp_cfg_absent(gp_ymap_get(m, others[q])))
            return gp_cfg_bad(w, gkey, "model has both %s and gpt; give one: gpt expands into "
                              "the layers", others[q]);
    if (!gp_cfg_absent(g) && g->kind != GP_YNODE_MAP)
        return gp_cfg_bad(w, g, "model.gpt must be a map, like {layers: 12, heads: 12, width: "
                          "768}");
    GP_TRY(gp_cfg_check_keys(w, g, "model.gpt"));
    const char *gs = "model.gpt";
    int layers = 0;
    int64_t heads = 0, width = 0, positions = 0, vocab = 0, vocab_pad = 1;
    float dropout = 0.0f;
    bool tie = true;
    GP_TRY(gp_cfg_get_int32(w, g, gs, "layers", 12, 1, 10000, &layers));
    GP_TRY(gp_cfg_get_int(w, g, gs, "heads", 12, 1, 1 << 16, &heads));
    GP_TRY(gp_cfg_get_int(w, g, gs, "width", 768, 1, (int64_t)1 << 20, &width));
    GP_TRY(gp_cfg_get_int(w, g, gs, "positions", 1024, 1, (int64_t)1 << 24, &positions));
    /* token ids are floats in the pipeline: exact below 2^24 */
    GP_TRY(gp_cfg_get_int(w, g, gs, "vocab", 50257, 1, (int64_t)1 << 24, &vocab));
    GP_TRY(gp_cfg_get_int(w, g, gs, "vocab_pad", 1, 1, (int64_t)1 << 16, &vocab_pad));
    if ((vocab + vocab_pad - 1) / vocab_pad * vocab_pad > ((int64_t)1 << 24))
        return gp_cfg_bad(w, gp_ymap_get(g, "vocab_pad"), "model.gpt.vocab_pad = %lld rounds "
                          "model.gpt.vocab = %lld past 2^24 rows (token ids are floats); give "
                          "a smaller vocab_pad (llm.c pads GPT-2's 50257 to 50304 with 64 or "
                          "128)", (long long)vocab_pad, (long long)vocab);
    GP_TRY(gp_cfg_get_float(w, g, gs, "dropout", 0.0f, 0, 1, GP_CFG_HI_OPEN, &dropout));
    GP_TRY(gp_cfg_get_bool(w, g, gs, "tie", true, &tie));
    const gp_ynode *hn = gp_ymap_get(g, "heads"), *wn = gp_ymap_get(g, "width");
    if (width % heads != 0)
        return gp_cfg_bad(w, hn ? hn : wn ? wn : gkey, "model.gpt.heads = %lld does not divide "
                          "model.gpt.width = %lld: each head takes width / heads features; "
                          "give heads a divisor of width (GPT-2: 768 / 12, medium 1024 / 16, "
                          "large 1280 / 20, XL 1600 / 25)", (long long)heads, (long long)width);
    /* model.input is [T]: the sequence length, which the position table
     * must cover */
    int64_t T = mc->input[0];
    const gp_ynode *inn = gp_ymap_get(m, "input");
    if (mc->input[1] != 1 || mc->input[2] != 1)
        return gp_cfg_bad(w, inn ? inn : gkey, "model.gpt reads token ids: model.input must be [T], the "
                          "sequence length, like input: [1024], not %lld x %lld x %lld",
                          (long long)mc->input[0], (long long)mc->input[1],
                          (long long)mc->input[2]);
    if (T > positions)
        return gp_cfg_bad(w, gp_ymap_get(g, "positions") ? gp_ymap_get(g, "positions") : gkey,
                          "model.gpt.positions = %lld is shorter than the sequence, model.input "
                          "[%lld]; give positions >= %lld (or a shorter model.input)",
                          (long long)positions, (long long)T, (long long)T);
    spec_list l;
    list_start(&l, w, gkey, g);
    GP_TRY(gpt(&l, layers, heads, width, positions, vocab, vocab_pad, dropout, tie));
    return expanded(w, mc, &l, "gpt", gkey, found);
}

/* ---- Llama (issue 66) -----------------------------------------------------
 *
 * Llama (Touvron et al. 2023; Hugging Face's LlamaForCausalLM, the layout
 * of Llama 2 and 3, Mistral, Qwen2, SmolLM, TinyLlama) as gpipe's layers,
 * named as HF's modules:
 *
 *   model.embed_tokens             embedding (no position table: positions 0)
 *   per block i (model.layers.i.):
 *     input_layernorm (rms_norm), self_attn.qkv_proj (linear (H + 2 G) d:
 *     HF's q_proj, k_proj and v_proj stacked, no bias unless qkv_bias),
 *     self_attn.rotary (rope), self_attn (attention, G = kv_heads),
 *     self_attn.o_proj (linear C, no bias), self_attn.residual (add),
 *     post_attention_layernorm (rms_norm), mlp.gate_up_proj (linear 2 I:
 *     gate_proj and up_proj stacked), mlp.act (swiglu), mlp.down_proj
 *     (linear C), mlp.residual (add)
 *   model.norm (rms_norm), lm_head (linear vocab, no bias; tie: the
 *   embedding's weight, as Llama 3.2 1B and 3B)
 *
 * Residuals are skips as in model.gpt.  Init as HF's
 * LlamaPreTrainedModel: every linear weight and the embedding normal(0,
 * std), biases 0, norms 1. */

typedef struct llama_opts {
    int layers;
    int64_t heads, kv_heads, width, intermediate, vocab, positions;
    float rope_theta, rms_eps, std;
    bool llama3, tie, qkv_bias;
    float factor, low_freq, high_freq;
    int64_t orig_positions;
    const char *kv_default; /* the config class whose num_key_value_heads default kv_heads is
                               (config.json leaves it out); NULL: none's */
} llama_opts;

static gp_status llama(spec_list *l, const llama_opts *o)
{
    const int64_t d = o->width / o->heads;
    l->cap = 1 + o->layers * 11 + 2;
    l->specs = calloc((size_t)l->cap, sizeof *l->specs);
    if (!l->specs) return gp_error_set(GP_ERR_OOM, "out of memory expanding model.llama");
    gp_layer_spec *emb = push(l, GP_LAYER_EMBEDDING, "model.embed_tokens");
    emb->vocab = o->vocab;
    emb->dim = o->width;
    emb->positions = 0;
    snprintf(emb->stash, sizeof emb->stash, "h0.in");
    for (int i = 0; i < o->layers; i++) {
        char pre[32], nm[80], s_in[GP_SKIP_NAME], s_mid[GP_SKIP_NAME], s_next[GP_SKIP_NAME];
        snprintf(pre, sizeof pre, "model.layers.%d", i);
        snprintf(s_in, sizeof s_in, "h%d.in", i);
        snprintf(s_mid, sizeof s_mid, "h%d.mid", i);
        snprintf(s_next, sizeof s_next, "%s", "");
        if (i + 1 < o->layers) snprintf(s_next, sizeof s_next, "h%d.in", i + 1);
#define NAME(x) (snprintf(nm, sizeof nm, "%s.%s", pre, x), nm)
        push(l, GP_LAYER_RMS_NORM, NAME("input_layernorm"))->eps = o->rms_eps;
        gp_layer_spec *qkv =
            gpt_linear(l, NAME("self_attn.qkv_proj"), (o->heads + 2 * o->kv_heads) * d, o->std);
        qkv->bias = o->qkv_bias;
        gp_layer_spec *r = push(l, GP_LAYER_ROPE, NAME("self_attn.rotary"));
        r->heads = o->heads;
        r->kv_heads = o->kv_heads;
        r->rope_theta = o->rope_theta;
        r->rope_llama3 = o->llama3;
        r->rope_factor = o->factor;
        r->rope_low_freq = o->low_freq;
        r->rope_high_freq = o->high_freq;
        r->rope_orig_positions = o->orig_positions;
        r->positions = o->positions; /* (max_position_embeddings, for an export) */
        gp_layer_spec *a = push(l, GP_LAYER_ATTENTION, NAME("self_attn"));
        a->heads = o->heads;
        a->kv_heads = o->kv_heads;
        gpt_linear(l, NAME("self_attn.o_proj"), o->width, o->std)->bias = false;
        gpt_residual(l, NAME("self_attn.residual"), s_in, s_mid);
        push(l, GP_LAYER_RMS_NORM, NAME("post_attention_layernorm"))->eps = o->rms_eps;
        gpt_linear(l, NAME("mlp.gate_up_proj"), 2 * o->intermediate, o->std)->bias = false;
        push(l, GP_LAYER_SWIGLU, NAME("mlp.act"));
        gpt_linear(l, NAME("mlp.down_proj"), o->width, o->std)->bias = false;
        gpt_residual(l, NAME("mlp.residual"), s_mid, s_next);
#undef NAME
    }
    push(l, GP_LAYER_RMS_NORM, "model.norm")->eps = o->rms_eps;
    gp_layer_spec *head = gpt_linear(l, "lm_head", o->vocab, o->std);
    head->bias = false;
    if (o->tie) snprintf(head->tie, sizeof head->tie, "%s", emb->name);
    GP_ASSERT(l->n == l->cap);
    return GP_OK;
}

/* Where model.llama's sizes come from, in order: the YAML's key; the
 * config.json of model.init_from where that is a folder (issue 66: the
 * YAML may leave them out), read and checked by gp_hf_config_read and its
 * getters (issue 77: a value there of the wrong type or out of range is an
 * error naming the file, its line and column and the key, never a
 * default); else Hugging Face's LlamaConfig's own defaults (Llama 2 7B's
 * sizes).  A folder without config.json is an error where the YAML leaves
 * a size out. */
typedef struct llama_src {
    gp_hf_config cfg;        /* cfg.json NULL: no config.json to read */
    const gp_ynode *from;    /* model.init_from, for messages */
    const gp_json_value *sc; /* its rope scaling (rope_scaling or rope_parameters) */
    bool llama3;             /* ... of rope_type llama3 */
} llama_src;

/* The error gp_hf_config_* left, placed at model.init_from's line. */
static gp_status llama_src_bad(gp_cfg_walk *w, const llama_src *s, const char *key)
{
    char msg[1400];
    snprintf(msg, sizeof msg, "%s", gp_last_error());
    if (key)
        return gp_cfg_bad(w, s->from, "model.init_from: %s (model.llama.%s is taken from it "
                          "where the YAML leaves it out: fix the file, or give model.llama.%s)",
                          msg, key, key);
    return gp_cfg_bad(w, s->from, "model.init_from: %s", msg);
}

static gp_status llama_src_open(gp_cfg_walk *w, const gp_ynode *m, const gp_ynode *g,
                                llama_src *s)
{
    memset(s, 0, sizeof *s);
    const gp_ynode *in = gp_ymap_get(m, "init_from");
    if (gp_cfg_absent(in) || in->kind != GP_YNODE_SCALAR || !in->text || !in->text[0])
        return GP_OK;
    s->from = in;
    struct stat st;
    static const char *const sizes[] = {"layers", "heads", "width", "intermediate", "vocab"};
    /* a path that is not there: the loader reports it, unless the sizes were
     * to come from it (issue 77: LlamaConfig's defaults, Llama 2 7B, were
     * built instead, and a snapshot of the run did not fit them) */
    const char *left_out = NULL; /* a size the YAML leaves to config.json */
    for (int i = 0; i < GP_COUNT(sizes) && !left_out; i++)
        if (gp_cfg_absent(gp_ymap_get(g, sizes[i]))) left_out = sizes[i];
    if (stat(in->text, &st) != 0) {
        int e = errno;
        if (!left_out) return GP_OK;
        /* resumed: the snapshot keeps the config.json the run was made with */
        char *kept = NULL, from[1200] = "";
        if (w->src && w->src->hf_config) {
            const gp_ynode *dn = gp_ymap_get(gp_ymap_get(gp_ymap_get(w->root, "train"),
                                                         "snapshot"), "dir");
            const char *dir = dn && dn->kind == GP_YNODE_SCALAR && dn->text ? dn->text
                                                                            : "snapshots";
            if (w->src->hf_config(w->src->ctx, in->text, dir, &kept, from, sizeof from) != GP_OK)
                return gp_cfg_bad(w, in, "model.init_from '%s' cannot be read (%s), and the "
                                  "snapshot that would stand for its config.json cannot either: "
                                  "%s", in->text, strerror(e), gp_last_error());
        }
        if (!kept)
            return gp_cfg_bad(w, in, "model.init_from '%s' cannot be read (%s), and "
                              "model.llama leaves %s out, which its config.json would give: "
                              "restore the folder, give model.llama's sizes in the YAML, or "
                              "resume from a snapshot of the run (--resume; gpipe-sample "
                              "--resume), which keeps that config.json", in->text, strerror(e),
                              left_out);
        char name[1400];
        snprintf(name, sizeof name, "%s/config.json (as %s keeps it)", in->text, from);
        gp_status ps = gp_hf_config_parse(name, kept, strlen(kept), &s->cfg);
        free(kept);
        if (ps != GP_OK) return llama_src_bad(w, s, NULL);
        GP_INFO("model.init_from '%s' is gone (%s): model.llama's sizes are its config.json's "
               "as %s keeps it", in->text, strerror(e), from);
    } else if (!S_ISDIR(st.st_mode)) {
        return GP_OK; /* a file (safetensors, llm.c's) has no config.json */
    } else if (gp_hf_config_read(in->text, &s->cfg) != GP_OK) {
        return llama_src_bad(w, s, NULL);
    }
    if (!s->cfg.json) {
        if (left_out)
            return gp_cfg_bad(w, in, "model.init_from '%s' has no config.json, and "
                              "model.llama leaves %s out: give model.llama's sizes (layers, "
                              "heads, kv_heads, width, intermediate, vocab) in the YAML, or "
                              "use a folder with its config.json (save_pretrained writes "
                              "one)", in->text, left_out);
        return GP_OK;
    }
    gp_cfg_note(w, "model.llama: what the YAML leaves out is %s's", s->cfg.path);
    /* rope_theta and rope_scaling; transformers 5 writes rope_parameters */
    const gp_json_value *rs = gp_json_get(s->cfg.json, "rope_scaling");
    const gp_json_value *rp = gp_json_get(s->cfg.json, "rope_parameters");
    s->sc = rs && rs->kind == GP_JSON_OBJECT   ? rs
            : rp && rp->kind == GP_JSON_OBJECT ? rp
                                               : NULL;
    const gp_json_value *ty = s->sc ? gp_json_get(s->sc, "rope_type") : NULL;
    if (!ty && s->sc) ty = gp_json_get(s->sc, "type");
    s->llama3 = ty && ty->kind == GP_JSON_STRING && !strcmp(ty->str, "llama3");
    return GP_OK;
}

/* model.llama.key: the YAML's, else config.json's jkey (NULL: none) in obj
 * (the file's object where NULL), else a default: def without config.json
 * (the key table's, LlamaConfig's), file_def where config.json leaves jkey
 * out (its model type's, as transformers takes it); in [lo, hi] either way. */
static gp_status llama_int(gp_cfg_walk *w, const gp_ynode *g, const llama_src *s,
                           const gp_json_value *obj, const char *key, const char *jkey,
                           int64_t def, int64_t file_def, int64_t lo, int64_t hi, int64_t *out)
{
    if (!gp_cfg_absent(gp_ymap_get(g, key)) || !s->cfg.json || !jkey)
        return gp_cfg_get_int(w, g, "model.llama", key, def, lo, hi, out);
    if (gp_hf_config_int(&s->cfg, obj, jkey, file_def, lo, hi, out) != GP_OK)
        return llama_src_bad(w, s, key);
    if (gp_json_get(obj ? obj : s->cfg.json, jkey))
        gp_cfg_note(w, "model.llama.%s = %lld (%s: %s)", key, (long long)*out, s->cfg.path,
                    jkey);
    else
        gp_cfg_note(w, "model.llama.%s = %lld (%s's default: %s has no %s)", key,
                    (long long)*out, gp_hf_llama_defaults_of(&s->cfg)->config_class,
                    s->cfg.path, jkey);
    return GP_OK;
}

/* The same for a float key above lo. */
static gp_status llama_float(gp_cfg_walk *w, const gp_ynode *g, const llama_src *s,
                             const gp_json_value *obj, const char *key, const char *jkey,
                             double def, double file_def, double lo, float *out)
{
    if (!gp_cfg_absent(gp_ymap_get(g, key)) || !s->cfg.json || !jkey)
        return gp_cfg_get_float(w, g, "model.llama", key, (float)def, lo, INFINITY,
                                GP_CFG_LO_OPEN, out);
    double v;
    if (gp_hf_config_num(&s->cfg, obj, jkey, file_def, lo, FLT_MAX, true, &v) != GP_OK)
        return llama_src_bad(w, s, key);
    *out = (float)v;
    bool in_file = gp_json_get(obj ? obj : s->cfg.json, jkey) != NULL;
    if (!(*out > (float)lo)) { /* rounds to lo as a 32-bit float */
        gp_error_set(GP_ERR_DATA, "%s: %s = %.17g rounds to %g as a 32-bit float, which is not "
                     "above %g", s->cfg.path, jkey, v, (double)*out, lo);
        return llama_src_bad(w, s, key);
    }
    if (in_file) gp_cfg_note(w, "model.llama.%s = %g (%s: %s)", key, (double)*out, s->cfg.path, jkey);
    else gp_cfg_note(w, "model.llama.%s = %g (%s's default: %s has no %s)", key, (double)*out,
                     gp_hf_llama_defaults_of(&s->cfg)->config_class, s->cfg.path, jkey);
    return GP_OK;
}

/* model.llama's sizes, from the YAML, config.json or the defaults. */
static gp_status llama_sizes(gp_cfg_walk *w, const gp_ynode *g, const llama_src *s,
                             llama_opts *o)
{
    const char *gs = "model.llama";
    const gp_json_value *cj = s->cfg.json;
    /* what config.json leaves out: its model type's defaults, as
     * transformers takes them; what the YAML leaves out without a
     * config.json: LlamaConfig's (the key table's, config_keys.c) */
    const gp_hf_llama_defaults *d = gp_hf_llama_defaults_of(&s->cfg);
    const gp_hf_llama_defaults *L = gp_hf_llama_defaults_of(NULL);
    int64_t layers;
    GP_TRY(llama_int(w, g, s, NULL, "layers", "num_hidden_layers", L->layers, d->layers, 1,
                     10000, &layers));
    o->layers = (int)layers;
    GP_TRY(llama_int(w, g, s, NULL, "heads", "num_attention_heads", L->heads, d->heads, 1,
                     1 << 16, &o->heads));
    /* kv_heads: the YAML's; as many as the YAML's heads where it gives
     * heads; else config.json's num_key_value_heads (null: as many as its
     * heads; absent: the type's default, MistralConfig's 8, Qwen2Config's
     * 32, LlamaConfig's as many as the heads) */
    const gp_json_value *kv = cj ? gp_json_get(cj, "num_key_value_heads") : NULL;
    bool kv_file = cj && gp_cfg_absent(gp_ymap_get(g, "heads")) &&
                   !(kv && kv->kind == GP_JSON_NULL);
    bool kv_def = kv_file && !kv && d->kv_heads && gp_cfg_absent(gp_ymap_get(g, "kv_heads"));
    GP_TRY(llama_int(w, g, s, NULL, "kv_heads", kv_file ? "num_key_value_heads" : NULL,
                     o->heads, kv_def ? d->kv_heads : o->heads, 1, 1 << 16, &o->kv_heads));
    o->kv_default = kv_def ? d->config_class : NULL;
    GP_TRY(llama_int(w, g, s, NULL, "width", "hidden_size", L->width, d->width, 1,
                     (int64_t)1 << 20, &o->width));
    GP_TRY(llama_int(w, g, s, NULL, "intermediate", "intermediate_size", L->intermediate,
                     d->intermediate, 1, (int64_t)1 << 24, &o->intermediate));
    GP_TRY(llama_int(w, g, s, NULL, "vocab", "vocab_size", L->vocab, d->vocab, 1,
                     (int64_t)1 << 24, &o->vocab));
    GP_TRY(llama_int(w, g, s, NULL, "positions", "max_position_embeddings", L->positions,
                     d->positions, 1, (int64_t)1 << 40, &o->positions));
    /* rope_theta: config.json's, or its rope_parameters' (transformers 5) */
    const gp_json_value *rp = cj ? gp_json_get(cj, "rope_parameters") : NULL;
    bool theta_rp = cj && !gp_json_get(cj, "rope_theta") && rp && rp->kind == GP_JSON_OBJECT &&
                    gp_json_get(rp, "rope_theta");
    GP_TRY(llama_float(w, g, s, theta_rp ? rp : NULL, "rope_theta", "rope_theta", L->rope_theta,
                       d->rope_theta, 1, &o->rope_theta));
    GP_TRY(llama_float(w, g, s, NULL, "rms_eps", "rms_norm_eps", L->rms_eps, d->rms_eps, 0,
                       &o->rms_eps));
    GP_TRY(gp_cfg_get_float(w, g, gs, "std", 0.02f, 0, INFINITY, GP_CFG_LO_OPEN, &o->std));
    if (cj && gp_cfg_absent(gp_ymap_get(g, "tie"))) {
        /* (false where the file leaves it out: LlamaConfig's, MistralConfig's
         * and Qwen2Config's default, which transformers applies to these
         * folders; PretrainedConfig's true is for other models) */
        if (gp_hf_config_bool(&s->cfg, NULL, "tie_word_embeddings", d->tie, &o->tie) != GP_OK)
            return llama_src_bad(w, s, "tie");
        gp_cfg_note(w, "model.llama.tie = %s (%s: tie_word_embeddings)",
                    o->tie ? "true" : "false", s->cfg.path);
    } else {
        GP_TRY(gp_cfg_get_bool(w, g, gs, "tie", L->tie, &o->tie));
    }
    /* q, k and v biases: Qwen2's folders have them (model_type qwen2);
     * LlamaConfig's attention_bias puts one on o_proj too, and mlp_bias on
     * the MLP, which model.llama has no place for */
    bool qkv_bias = false;
    if (cj && gp_cfg_absent(gp_ymap_get(g, "qkv_bias"))) {
        const gp_json_value *mt = gp_json_get(cj, "model_type");
        bool qwen2 = mt && mt->kind == GP_JSON_STRING && !strcmp(mt->str, "qwen2");
        bool ab = false, mb = false;
        if (gp_hf_config_bool(&s->cfg, NULL, "attention_bias", false, &ab) != GP_OK ||
            gp_hf_config_bool(&s->cfg, NULL, "mlp_bias", false, &mb) != GP_OK)
            return llama_src_bad(w, s, "qkv_bias");
        if ((ab && !qwen2) || mb) {
            gp_error_set(GP_ERR_UNSUPPORTED, "%s: %s is true (biases on %s), which model.llama "
                         "has no place for: it has q, k and v biases only (qkv_bias, Qwen2's)",
                         s->cfg.path, mb ? "mlp_bias" : "attention_bias",
                         mb ? "the MLP's products" : "q, k, v and o_proj");
            return llama_src_bad(w, s, NULL);
        }
        qkv_bias = qwen2;
        if (qwen2)
            gp_cfg_note(w, "model.llama.qkv_bias = true (%s: model_type qwen2)", s->cfg.path);
    }
    GP_TRY(gp_cfg_get_bool(w, g, gs, "qkv_bias", qkv_bias, &o->qkv_bias));
    /* rope_scaling: the YAML's map, its keys' defaults config.json's llama3
     * scaling where it has one (else Llama 3's); without the YAML's map,
     * config.json's llama3 scaling, checked as the YAML's would be */
    double factor = 8, low = 1, high = 4;
    int64_t orig = 8192;
    if (s->llama3 &&
        (gp_hf_config_num(&s->cfg, s->sc, "factor", factor, 1, FLT_MAX, false, &factor) != GP_OK ||
         gp_hf_config_num(&s->cfg, s->sc, "low_freq_factor", low, 0, FLT_MAX, true, &low) !=
             GP_OK ||
         gp_hf_config_num(&s->cfg, s->sc, "high_freq_factor", high, 0, FLT_MAX, true, &high) !=
             GP_OK ||
         gp_hf_config_int(&s->cfg, s->sc, "original_max_position_embeddings", orig, 1,
                          (int64_t)1 << 40, &orig) != GP_OK))
        return llama_src_bad(w, s, "rope_scaling");
    const gp_ynode *rs = gp_ymap_get(g, "rope_scaling");
    o->factor = (float)factor, o->low_freq = (float)low, o->high_freq = (float)high;
    o->orig_positions = orig;
    o->llama3 = s->llama3 && gp_cfg_absent(rs);
    if (o->llama3) {
        if (!(o->high_freq > o->low_freq)) {
            gp_error_set(GP_ERR_DATA, "%s: rope_scaling's high_freq_factor (%g) must be above "
                         "its low_freq_factor (%g) (Llama 3: 4 and 1)", s->cfg.path, high, low);
            return llama_src_bad(w, s, "rope_scaling");
        }
        gp_cfg_note(w, "model.llama.rope_scaling = {factor: %g, low_freq_factor: %g, "
                    "high_freq_factor: %g, original_positions: %lld} (%s: rope_scaling, llama3)",
                    factor, low, high, (long long)orig, s->cfg.path);
    }
    if (cj && !s->llama3 && gp_cfg_absent(rs))
        gp_cfg_note(w, "model.llama.rope_scaling = none (%s: %s)", s->cfg.path,
                    s->sc ? "rope_scaling of another rope_type" : "rope_scaling null or absent");
    if (!gp_cfg_absent(rs)) { /* Llama 3's: {factor, low_freq_factor, high_freq_factor,
                                 original_positions} */
        if (rs->kind != GP_YNODE_MAP)
            return gp_cfg_bad(w, rs, "model.llama.rope_scaling must be a map, Llama 3's "
                              "{factor: 32, low_freq_factor: 1, high_freq_factor: 4, "
                              "original_positions: 8192} (leave it out for none)");
        const char *rss = "model.llama.rope_scaling";
        GP_TRY(gp_cfg_check_keys(w, rs, rss));
        o->llama3 = true;
        GP_TRY(gp_cfg_get_float(w, rs, rss, "factor", (float)factor, 1, INFINITY, 0,
                                &o->factor));
        GP_TRY(gp_cfg_get_float(w, rs, rss, "low_freq_factor", (float)low, 0, INFINITY,
                                GP_CFG_LO_OPEN, &o->low_freq));
        GP_TRY(gp_cfg_get_float(w, rs, rss, "high_freq_factor", (float)high, 0, INFINITY,
                                GP_CFG_LO_OPEN, &o->high_freq));
        GP_TRY(gp_cfg_get_int(w, rs, rss, "original_positions", orig, 1, (int64_t)1 << 40,
                              &o->orig_positions));
        if (!(o->high_freq > o->low_freq))
            return gp_cfg_bad(w, rs, "model.llama.rope_scaling: high_freq_factor (%g) must be "
                              "above low_freq_factor (%g) (Llama 3: 4 and 1)",
                              (double)o->high_freq, (double)o->low_freq);
    }
    return GP_OK;
}

/* model.llama: {layers, heads, kv_heads, width, intermediate, vocab,
 * positions, rope_theta, rope_scaling, rms_eps, tie, qkv_bias, std}. */
static gp_status parse_llama(gp_cfg_walk *w, const gp_ynode *m, gp_model_config *mc, bool *found)
{
    const gp_ynode *g = gp_ymap_get(m, "llama"), *gkey = gp_ymap_key(m, "llama");
    static const char *const others[] = {"layers", "resnet", "amoebanet", "unet", "gpt"};
    for (int q = 0; q < GP_COUNT(others); q++)
        if (q ? gp_ymap_key(m, others[q]) != NULL : !gp_cfg_absent(gp_ymap_get(m, others[q])))
            return gp_cfg_bad(w, gkey, "model has both %s and llama; give one: llama expands "
                              "into the layers", others[q]);
    if (!gp_cfg_absent(g) && g->kind != GP_YNODE_MAP)
        return gp_cfg_bad(w, g, "model.llama must be a map, like {layers: 16, heads: 32, "
                          "kv_heads: 8, width: 2048, intermediate: 8192}");
    GP_TRY(gp_cfg_check_keys(w, g, "model.llama"));
    llama_opts o = {0};
    llama_src src;
    gp_status st = llama_src_open(w, m, g, &src);
    if (st == GP_OK) st = llama_sizes(w, g, &src, &o);
    /* what the sizes do not say: another family, activation, head width
     * or a sliding window, refused before the model is built */
    if (st == GP_OK && src.cfg.json && gp_hf_llama_supported(&src.cfg, mc->input[0]) != GP_OK)
        st = llama_src_bad(w, &src, NULL);
    if (st == GP_OK && src.cfg.json) { /* for snapshots (gp_model_config.hf_config) */
        free(mc->hf_config);
        mc->hf_config = src.cfg.text;
        src.cfg.text = NULL;
    }
    gp_hf_config_free(&src.cfg);
    GP_TRY(st);
    const gp_ynode *hn = gp_ymap_get(g, "heads"), *wn = gp_ymap_get(g, "width");
    const gp_ynode *kn = gp_ymap_get(g, "kv_heads");
    if (o.width % o.heads != 0 || (o.width / o.heads) % 2 != 0 ||
        o.width / o.heads > 512)
        return gp_cfg_bad(w, hn ? hn : wn ? wn : gkey, "model.llama.heads = %lld does not split "
                          "model.llama.width = %lld into heads of an even size up to 512 "
                          "(rope turns pairs): Llama 3.2 1B is 2048 / 32, 8B 4096 / 32",
                          (long long)o.heads, (long long)o.width);
    if (o.heads % o.kv_heads != 0) {
        char why[200] = "";
        if (o.kv_default)
            snprintf(why, sizeof why, " (%s's default num_key_value_heads: model.init_from's "
                     "config.json leaves it out; give it there or as model.llama.kv_heads)",
                     o.kv_default);
        return gp_cfg_bad(w, kn ? kn : gkey, "model.llama.kv_heads = %lld%s does not divide "
                          "model.llama.heads = %lld: each k and v head serves heads / kv_heads "
                          "query heads (Llama 3: 8 of 32)", (long long)o.kv_heads, why,
                          (long long)o.heads);
    }
    int64_t T = mc->input[0];
    const gp_ynode *inn = gp_ymap_get(m, "input");
    if (mc->input[1] != 1 || mc->input[2] != 1)
        return gp_cfg_bad(w, inn ? inn : gkey, "model.llama reads token ids: model.input must be "
                          "[T], the sequence length, like input: [2048], not %lld x %lld x %lld",
                          (long long)mc->input[0], (long long)mc->input[1],
                          (long long)mc->input[2]);
    if (T > o.positions)
        return gp_cfg_bad(w, gp_ymap_get(g, "positions") ? gp_ymap_get(g, "positions") : gkey,
                          "model.llama.positions = %lld (max_position_embeddings) is shorter "
                          "than the sequence, model.input [%lld]; give positions >= %lld",
                          (long long)o.positions, (long long)T, (long long)T);
    spec_list l;
    list_start(&l, w, gkey, g);
    GP_TRY(llama(&l, &o));
    return expanded(w, mc, &l, "llama", gkey, found);
}

gp_status gp_cfg_parse_family(gp_cfg_walk *w, const gp_ynode *m, gp_model_config *mc, bool *found)
{
    *found = false;
    /* a family given with no value (`resnet:`) is an empty map, as every
     * map-valued key's null is: all its options take their defaults */
    if (gp_ymap_key(m, "gpt")) return parse_gpt(w, m, mc, found);
    if (gp_ymap_key(m, "llama")) return parse_llama(w, m, mc, found);
    if (gp_ymap_key(m, "unet")) return parse_unet(w, m, mc, found);
    GP_TRY(parse_amoebanet(w, m, mc, found));
    if (*found) return GP_OK;
    const gp_ynode *r = gp_ymap_get(m, "resnet"), *rkey = gp_ymap_key(m, "resnet");
    if (!rkey) return GP_OK;
    if (!gp_cfg_absent(gp_ymap_get(m, "layers")))
        return gp_cfg_bad(w, rkey, "model has both layers and resnet; give one: resnet expands "
                          "into the layers");
    if (!gp_cfg_absent(r) && r->kind != GP_YNODE_MAP)
        return gp_cfg_bad(w, r, "model.resnet must be a map, like {depth: 101, classes: 1000}");
    GP_TRY(gp_cfg_check_keys(w, r, "model.resnet"));
    int depth = 0;
    int64_t classes = 0;
    GP_TRY(gp_cfg_get_int32(w, r, "model.resnet", "depth", 50, 1, 1000, &depth));
    GP_TRY(gp_cfg_get_int(w, r, "model.resnet", "classes", 1000, 1, (int64_t)1 << 24, &classes));
    if (depth != 50 && depth != 101 && depth != 152)
        return gp_cfg_bad(w, gp_ymap_get(r, "depth"), "model.resnet.depth must be 50, 101 or "
                          "152 (the bottleneck ResNets), got %d", depth);
    spec_list l;
    list_start(&l, w, rkey, r);
    GP_TRY(resnet(&l, depth, classes));
    return expanded(w, mc, &l, "resnet", rkey, found);
}
