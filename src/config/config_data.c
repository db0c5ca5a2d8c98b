/*
 * config_data.c — the data section: the dataset and where it lives,
 * shuffling, normalisation statistics, augmentation, prefetching, limits
 * and the synthetic dataset's shape and masks.
 */
#include "config/config_impl.h"

#include <math.h>
#include <string.h>

static const char *const k_dataset_names[] = {"synthetic", "mnist", "fashion-mnist",
                                              "cifar10", "image_folder", "tokens"};
static const char *const k_layouts[] = {"classification", "segmentation"};
static const char *const k_mask_kinds[] = {"binary", "index"};
static const char *const k_bad_file[] = {"error", "skip"};

const char *gp_dataset_name(gp_dataset_kind k)
{
    return (unsigned)k < (unsigned)GP_COUNT(k_dataset_names) ? k_dataset_names[k] : "?";
}

static const char *default_path(gp_dataset_kind k)
{
    switch (k) {
    case GP_DATASET_FASHION_MNIST: return "/usr/share/datasets/fashion-mnist";
    case GP_DATASET_MNIST: return "/usr/share/datasets/mnist";
    case GP_DATASET_CIFAR10: return "data/cifar-10-batches-bin";
    case GP_DATASET_SYNTHETIC: return "";
    case GP_DATASET_IMAGE_FOLDER: return "";
    case GP_DATASET_TOKENS: return "";
    }
    return "";
}

/* A scalar or a list of 1..GP_MAX_CHANNELS numbers. */
static gp_status get_channels(const gp_cfg_walk *w, const gp_ynode *n, const char *name,
                              float *out, int *count, bool positive)
{
    int cnt = n->kind == GP_YNODE_SEQ ? n->n : 1;
    if (n->kind == GP_YNODE_MAP)
        return gp_cfg_bad(w, n, "expected a number or a list of per-channel numbers for %s, got "
                          "a map", name);
    if (cnt < 1 || cnt > GP_MAX_CHANNELS)
        return gp_cfg_bad(w, n, "%s must have 1 to %d values (one per channel), got %d", name,
                          GP_MAX_CHANNELS, cnt);
    for (int i = 0; i < cnt; i++) {
        const gp_ynode *v = n->kind == GP_YNODE_SEQ ? n->items[i] : n;
        char nm[64];
        snprintf(nm, sizeof nm, n->kind == GP_YNODE_SEQ ? "%s.%d" : "%s", name, i);
        if (gp_cfg_absent(v))
            return gp_cfg_bad(w, v ? v : n, "expected a number for %s, got nothing", nm);
        double d;
        GP_TRY(gp_cfg_parse_float(w, v, nm, &d));
        /* as the float keeps it: a std of 1e-50 passed as positive and
         * became 0 (NaN inputs from the first step) */
        GP_TRY(gp_cfg_to_float(w, v, nm, d, positive ? 0 : -INFINITY, INFINITY,
                               positive ? GP_CFG_LO_OPEN : 0, &out[i]));
    }
    *count = cnt;
    return GP_OK;
}

/* A pair [lo, hi] with 0 < lo <= hi (<= max when max > 0). */
static gp_status get_range(const gp_cfg_walk *w, const gp_ynode *map, const char *sect,
                           const char *key, float lo_def, float hi_def, double max, float *out)
{
    char row[96];
    snprintf(row, sizeof row, "%s.%s", sect, key);
    gp_cfg_key_agrees(row, GP_CFG_OTHER, 0, NULL, 0, max > 0 ? max : INFINITY, GP_CFG_LO_OPEN,
                      NULL, 0);
    const gp_ynode *n = gp_ymap_get(map, key);
    out[0] = lo_def;
    out[1] = hi_def;
    if (gp_cfg_absent(n)) return GP_OK;
    if (n->kind != GP_YNODE_SEQ || n->n != 2)
        return gp_cfg_bad(w, n, "%s.%s must be a pair [low, high]", sect, key);
    for (int i = 0; i < 2; i++) {
        double d;
        char nm[96];
        snprintf(nm, sizeof nm, "%s.%s.%d", sect, key, i);
        GP_TRY(gp_cfg_parse_float(w, n->items[i], nm, &d));
        GP_TRY(gp_cfg_to_float(w, n->items[i], nm, d, 0, max > 0 ? max : INFINITY,
                               GP_CFG_LO_OPEN, &out[i]));
    }
    if (out[0] > out[1])
        return gp_cfg_bad(w, n, "%s.%s is [%g, %g]: the low end is above the high end", sect,
                          key, out[0], out[1]);
    return GP_OK;
}

/* sect.key, where the config gives it, warned of as ignored, and why. */
static void warn_ignored(gp_cfg_walk *w, const gp_ynode *map, const char *sect, const char *key,
                         const char *why)
{
    const gp_ynode *n = gp_ymap_get(map, key);
    if (!gp_cfg_absent(n)) gp_cfg_warn(w, n, "%s.%s is ignored: %s", sect, key, why);
}

/* The image_folder keys: data.layout, masks, workers, on_bad_file,
 * cache_dir, and data.augment.random_resized_crop / resize.  Recorded in
 * the defaults only when the dataset is an image folder; given for
 * another, each is warned of (data.layout: segmentation trained
 * classification without a word until 2026-12-01), except where --set
 * chose the dataset (ds_set: trying another dataset with the same
 * config, as the synthetic section's warning allows). */
static gp_status parse_folder(gp_cfg_walk *w, const gp_ynode *m, const gp_ynode *aug,
                              bool folder, bool ds_set, gp_data_config *dc)
{
    if (!folder && !ds_set) {
        char why[128];
        snprintf(why, sizeof why, "data.dataset is %s, and it applies to image_folder",
                 k_dataset_names[dc->dataset]);
        static const char *const keys[] = {"layout", "masks", "workers", "on_bad_file",
                                           "cache_dir"};
        for (size_t q = 0; q < GP_COUNT(keys); q++) warn_ignored(w, m, "data", keys[q], why);
        warn_ignored(w, aug, "data.augment", "random_resized_crop", why);
        warn_ignored(w, aug, "data.augment", "resize", why);
    }
    bool rec = w->record;
    w->record = rec && folder;
    gp_status s = GP_OK;
    int v = 0;
    if (s == GP_OK) s = gp_cfg_get_enum(w, m, "data", "layout", k_layouts, 2, 0, &v);
    dc->layout = (gp_data_layout)v;
    if (s == GP_OK) s = gp_cfg_get_enum(w, m, "data", "masks", k_mask_kinds, 2, 0, &v);
    dc->masks_binary = v == 0;
    if (s == GP_OK) s = gp_cfg_get_int32(w, m, "data", "workers", 0, 0, 1024, &dc->workers);
    if (s == GP_OK) s = gp_cfg_get_enum(w, m, "data", "on_bad_file", k_bad_file, 2, 0, &v);
    dc->skip_bad_files = v == 1;
    if (s == GP_OK)
        s = gp_cfg_get_str(w, m, "data", "cache_dir", "", dc->cache_dir, sizeof dc->cache_dir);
    const gp_ynode *rrc = gp_ymap_get(aug, "random_resized_crop");
    dc->rrc = true;
    dc->rrc_scale[0] = 0.08f;
    dc->rrc_scale[1] = 1.0f;
    dc->rrc_ratio[0] = 3.0f / 4.0f;
    dc->rrc_ratio[1] = 4.0f / 3.0f;
    if (s == GP_OK && !gp_cfg_absent(rrc)) {
        if (rrc->kind == GP_YNODE_SCALAR) {
            s = gp_cfg_get_bool(w, aug, "data.augment", "random_resized_crop", true, &dc->rrc);
        } else {
            const char *rs = "data.augment.random_resized_crop";
            s = gp_cfg_check_keys(w, rrc, rs);
            if (s == GP_OK) s = get_range(w, rrc, rs, "scale", 0.08f, 1.0f, 1.0, dc->rrc_scale);
            if (s == GP_OK)
                s = get_range(w, rrc, rs, "ratio", 3.0f / 4.0f, 4.0f / 3.0f, 0, dc->rrc_ratio);
        }
    } else if (s == GP_OK && folder) {
        gp_cfg_note(w, "data.augment.random_resized_crop = {scale: [0.08, 1], ratio: [0.75, "
                       "1.333]} (default, torchvision's)");
    }
    if (s == GP_OK)
        s = gp_cfg_get_int32(w, aug, "data.augment", "resize", 0, 0, 65535, &dc->resize);
    w->record = rec;
    return s;
}

int gp_data_config_resize(const gp_data_config *dc, int64_t out_h, int64_t out_w)
{
    return dc->resize > 0 ? dc->resize
                          : (int)lround((double)(out_h < out_w ? out_h : out_w) * 256.0 / 224.0);
}

/* image_folder's evaluation crop (and training's without
 * random_resized_crop): the shorter side resized to data.augment.resize,
 * then model.input's height and width cut from the centre.  A resize under
 * the crop's larger side leaves a square image smaller than the crop, which
 * torchvision's CenterCrop pads with zeros and the resampler would fill
 * with stretched edge pixels: refused here, before any image is read. */
static gp_status check_resize(const gp_cfg_walk *w, const gp_ynode *aug,
                              const gp_model_config *mc, const gp_data_config *dc)
{
    int64_t h = mc->input[1], wd = mc->input[2];
    if (dc->dataset != GP_DATASET_IMAGE_FOLDER || h < 1 || wd < 1) return GP_OK;
    int64_t big = h > wd ? h : wd;
    int64_t r = gp_data_config_resize(dc, h, wd);
    if (r >= big) return GP_OK;
    const gp_ynode *rn = gp_ymap_get(aug, "resize");
    if (dc->resize > 0)
        return gp_cfg_bad(w, rn, "data.augment.resize = %lld is smaller than the centre crop, "
                          "model.input's %lld x %lld (%s): an image's shorter side is resized "
                          "to %lld and the crop would reach past it; give data.augment.resize "
                          "at least %lld", (long long)r, (long long)h, (long long)wd,
                          mc->input_at, (long long)r, (long long)big);
    return gp_error_set(GP_ERR_INVALID, "%s: model.input's %lld x %lld is larger than "
                        "data.augment.resize, which is the crop's shorter side x 256 / 224 = "
                        "%lld when left out: an image's shorter side is resized to %lld and "
                        "the centre crop would reach past it; give data.augment.resize at "
                        "least %lld", mc->input_at, (long long)h, (long long)wd, (long long)r,
                        (long long)r, (long long)big);
}

gp_status gp_cfg_parse_data(gp_cfg_walk *w, const gp_ynode *root, const gp_model_config *mc,
                            gp_data_config *dc)
{
    const gp_ynode *m;
    GP_TRY(gp_cfg_get_map(w, root, "", "data", "{dataset: fashion-mnist}", &m));
    GP_TRY(gp_cfg_check_keys(w, m, "data"));
    int ds = 0;
    GP_TRY(gp_cfg_get_enum(w, m, "data", "dataset", k_dataset_names, GP_COUNT(k_dataset_names),
                           GP_DATASET_FASHION_MNIST, &ds));
    dc->dataset = (gp_dataset_kind)ds;
    GP_TRY(gp_cfg_get_str(w, m, "data", "path", default_path(dc->dataset), dc->path,
                          sizeof dc->path));
    bool folder = dc->dataset == GP_DATASET_IMAGE_FOLDER;
    if (folder && !dc->path[0])
        return gp_cfg_bad(w, m, "data.dataset image_folder needs data.path: the folder that "
                          "holds train/ and val/");
    if (dc->dataset == GP_DATASET_TOKENS && !dc->path[0])
        return gp_cfg_bad(w, m, "data.dataset tokens needs data.path: the folder that holds "
                          "<name>_train.bin and <name>_val.bin (scripts/tokenize_text.py writes "
                          "them), or the _train.bin file itself");
    if (dc->dataset == GP_DATASET_TOKENS && (mc->input[1] != 1 || mc->input[2] != 1))
        return gp_cfg_bad(w, gp_ymap_get(gp_ymap_get(root, "model"), "input"),
                          "data.dataset tokens serves windows of T tokens: model.input must "
                          "be [T] (the sequence length), got [%lld, %lld, %lld]",
                          (long long)mc->input[0], (long long)mc->input[1],
                          (long long)mc->input[2]);
    GP_TRY(gp_cfg_get_bool(w, m, "data", "shuffle", true, &dc->shuffle));
    GP_TRY(gp_cfg_get_bool(w, m, "data", "normalize", true, &dc->normalize));

    const gp_ynode *mean = gp_ymap_get(m, "mean"), *sd = gp_ymap_get(m, "std");
    if (gp_cfg_absent(mean) && gp_cfg_absent(sd)) {
        dc->n_mean = 0;
        if (dc->normalize && dc->dataset != GP_DATASET_TOKENS) /* (tokens are ids) */
            gp_cfg_note(w, "data.mean, data.std = statistics of %s (default)",
                        gp_dataset_name(dc->dataset));
    } else if (gp_cfg_absent(mean) || gp_cfg_absent(sd)) {
        const gp_ynode *given = gp_cfg_absent(mean) ? sd : mean;
        return gp_cfg_bad(w, given, "data.%s is given without data.%s; give both (one value per "
                          "channel) or neither", gp_cfg_absent(mean) ? "std" : "mean",
                          gp_cfg_absent(mean) ? "mean" : "std");
    } else {
        int nm = 0, ns = 0;
        GP_TRY(get_channels(w, mean, "data.mean", dc->mean, &nm, false));
        GP_TRY(get_channels(w, sd, "data.std", dc->std, &ns, true));
        if (nm != ns)
            return gp_cfg_bad(w, sd, "data.std has %d value%s but data.mean has %d; give one per "
                              "channel for both", ns, ns == 1 ? "" : "s", nm);
        dc->n_mean = nm;
        gp_yloc(w->file, !mean->set && sd->set ? sd : mean, dc->mean_at, sizeof dc->mean_at);
        /* pixels are scaled to [0, 1] before they are normalised: statistics
         * on the 0-255 scale (as some recipes write them) would leave every
         * input near -mean/std, and the model learns nothing */
        for (int c = 0; c < nm; c++)
            if (dc->mean[c] > 1 || dc->std[c] > 1) {
                bool m_big = dc->mean[c] > 1;
                double v = m_big ? dc->mean[c] : dc->std[c];
                gp_cfg_warn(w, m_big ? mean : sd, "data.%s has %g, which looks like the 0-255 "
                            "scale: gpipe scales pixels to [0, 1] before normalising, so give "
                            "data.mean and data.std on that scale (%g / 255 = %.4g)",
                            m_big ? "mean" : "std", v, v, v / 255);
                break;
            }
        if (!dc->normalize)
            gp_cfg_warn(w, mean, "data.mean and data.std are ignored: data.normalize is false");
    }

    const gp_ynode *aug;
    GP_TRY(gp_cfg_get_map(w, m, "data", "augment", "{crop_padding: 4, hflip: true}", &aug));
    GP_TRY(gp_cfg_check_keys(w, aug, "data.augment"));
    const char *as = "data.augment";
    GP_TRY(gp_cfg_get_int32(w, aug, as, "crop_padding", 0, 0, 1024, &dc->crop_padding));
    if (folder && dc->crop_padding > 0)
        return gp_cfg_bad(w, gp_ymap_get(aug, "crop_padding"), "data.augment.crop_padding pads "
                          "the in-memory datasets; image_folder crops with "
                          "data.augment.random_resized_crop instead");
    /* torchvision's ImageNet recipe flips; the small in-memory sets do not
     * unless asked */
    /* a shift of up to p pixels each way leaves up to 1 - (H-p)(W-p)/HW of
     * a sample zeros: at a quarter of the side, over 40%; at the side, all
     * of it (the recipes pad 4 of CIFAR's 32) */
    int64_t side = mc->input[1] < mc->input[2] ? mc->input[1] : mc->input[2];
    if (dc->crop_padding > 0 && mc->input[1] > 1 && mc->input[2] > 1 &&
        4 * (int64_t)dc->crop_padding > side) {
        int64_t p = dc->crop_padding, h = mc->input[1], wd = mc->input[2];
        double blank =
            p >= side ? 1.0 : 1.0 - (double)(h - p) * (double)(wd - p) / (double)(h * wd);
        gp_cfg_warn(w, gp_ymap_get(aug, "crop_padding"), "data.augment.crop_padding = %lld "
                    "on %lld x %lld samples: a crop shifted that far is up to %.0f%% zeros; "
                    "a few pixels are usual (4 on CIFAR's 32 x 32)", (long long)p,
                    (long long)h, (long long)wd, 100 * blank);
    }
    GP_TRY(gp_cfg_get_bool(w, aug, as, "hflip", folder, &dc->hflip));
    const gp_ynode *dsn = gp_ymap_get(m, "dataset");
    bool ds_set = dsn && dsn->set;
    if (dc->dataset == GP_DATASET_TOKENS && !ds_set) { /* windows of ids, not pixels */
        const char *why = "data.dataset is tokens, whose samples are token ids";
        warn_ignored(w, aug, "data.augment", "crop_padding", why);
        warn_ignored(w, aug, "data.augment", "hflip", why);
        if (dc->n_mean > 0) gp_cfg_warn(w, mean, "data.mean and data.std are ignored: %s", why);
    }
    GP_TRY(parse_folder(w, m, aug, folder, ds_set, dc));
    GP_TRY(check_resize(w, aug, mc, dc));
    GP_TRY(gp_cfg_get_int32(w, m, "data", "prefetch", 2, 1, 1024, &dc->prefetch));
    GP_TRY(gp_cfg_get_int(w, m, "data", "train_limit", 0, 0, INT64_MAX, &dc->train_limit));
    GP_TRY(gp_cfg_get_int(w, m, "data", "test_limit", 0, 0, INT64_MAX, &dc->test_limit));

    const gp_ynode *syn;
    GP_TRY(gp_cfg_get_map(w, m, "data", "synthetic", "{train: 1024, test: 256, classes: 10}",
                          &syn));
    GP_TRY(gp_cfg_check_keys(w, syn, "data.synthetic"));
    /* (not where --set changed the dataset: a config's synthetic section
     * for trying it out, then real data, is as meant) */
    if (syn && dc->dataset != GP_DATASET_SYNTHETIC && !ds_set)
        gp_cfg_warn(w, syn, "data.synthetic is ignored: data.dataset is %s",
                    k_dataset_names[dc->dataset]);
    bool rec = w->record;
    w->record = rec && dc->dataset == GP_DATASET_SYNTHETIC;
    const char *ss = "data.synthetic";
    gp_status s = gp_cfg_get_int(w, syn, ss, "train", 1024, 1, (int64_t)1 << 40,
                                 &dc->synthetic_train);
    if (s == GP_OK)
        s = gp_cfg_get_int(w, syn, ss, "test", 256, 1, (int64_t)1 << 40, &dc->synthetic_test);
    if (s == GP_OK)
        s = gp_cfg_get_int32(w, syn, ss, "classes", 10, 2, 1 << 20, &dc->synthetic_classes);
    if (s == GP_OK) s = gp_cfg_get_bool(w, syn, ss, "masks", false, &dc->synthetic_masks);
    w->record = rec;
    GP_TRY(s);
    memcpy(dc->image_shape, mc->input, sizeof dc->image_shape);
    const gp_layer_spec *first = mc->n_layers > 0 ? &mc->layers[0] : NULL;
    dc->token_vocab = first && first->type == GP_LAYER_EMBEDDING
                          ? (first->valid_rows > 0 ? first->valid_rows : first->vocab)
                          : 0;
    /* the synthetic samples match the model unless told otherwise */
    const gp_ynode *shape = gp_ymap_get(syn, "shape");
    if (gp_cfg_absent(shape)) {
        memcpy(dc->synthetic_shape, mc->input, sizeof dc->synthetic_shape);
        if (dc->dataset == GP_DATASET_SYNTHETIC)
            gp_cfg_note(w, "data.synthetic.shape = model.input (default)");
        return GP_OK;
    }
    return gp_cfg_parse_shape(w, shape, "data.synthetic.shape", dc->synthetic_shape);
}
