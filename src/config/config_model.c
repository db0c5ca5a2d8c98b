/*
 * config_model.c — the model section: model.input, model.layers (each a
 * type with its options, checked against what that type takes), loss and
 * init_from.
 */
#include "config/config_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Option keys each layer type takes (`stash` and `name` too): each has its
 * row, model.layers.#.<key>, in config_keys.c's table. */
int gp_cfg_layer_keys(gp_layer_type t, const char **keys)
{
    int n = 0;
    switch (t) {
    case GP_LAYER_LINEAR:
        keys[n++] = "in"; keys[n++] = "out"; keys[n++] = "bias";
        keys[n++] = "tie"; /* the layer whose weight it shares */
        keys[n++] = "init"; keys[n++] = "std";
        break;
    case GP_LAYER_CONV2D:
        keys[n++] = "in"; keys[n++] = "out"; keys[n++] = "kernel";
        keys[n++] = "stride"; keys[n++] = "padding"; keys[n++] = "bias";
        keys[n++] = "init"; keys[n++] = "std";
        break;
    case GP_LAYER_BATCHNORM:
        keys[n++] = "momentum"; keys[n++] = "eps"; keys[n++] = "sync";
        break;
    case GP_LAYER_MAXPOOL2D:
        keys[n++] = "kernel"; keys[n++] = "stride"; keys[n++] = "padding";
        break;
    case GP_LAYER_AVGPOOL2D:
        keys[n++] = "kernel"; keys[n++] = "stride"; keys[n++] = "padding";
        keys[n++] = "count_include_pad";
        break;
    case GP_LAYER_DROPOUT:
    case GP_LAYER_DROPOUT2D:
        keys[n++] = "p";
        break;
    case GP_LAYER_LEAKY_RELU:
        keys[n++] = "slope";
        break;
    case GP_LAYER_INSTANCE_NORM:
    case GP_LAYER_LAYER_NORM:
    case GP_LAYER_RMS_NORM:
        keys[n++] = "eps";
        break;
    case GP_LAYER_UPSAMPLE:
        keys[n++] = "scale";
        break;
    case GP_LAYER_ATTENTION:
        keys[n++] = "heads"; keys[n++] = "kv_heads";
        break;
    case GP_LAYER_ROPE: /* Hugging Face's rope_theta and rope_scaling (llama3) */
        keys[n++] = "heads"; keys[n++] = "kv_heads"; keys[n++] = "theta";
        keys[n++] = "scaling"; keys[n++] = "factor"; keys[n++] = "low_freq_factor";
        keys[n++] = "high_freq_factor"; keys[n++] = "original_positions";
        break;
    case GP_LAYER_EMBEDDING:
        keys[n++] = "vocab"; keys[n++] = "dim"; keys[n++] = "positions";
        break;
    case GP_LAYER_RESIDUAL: /* momentum, eps, sync: of its batch norms; init: its convs */
        keys[n++] = "out"; keys[n++] = "stride";
        keys[n++] = "momentum"; keys[n++] = "eps"; keys[n++] = "sync"; keys[n++] = "init";
        break;
    case GP_LAYER_ADD: /* out, stride: the projection shortcut; its conv's and norm's options */
        keys[n++] = "pop"; keys[n++] = "out"; keys[n++] = "stride";
        keys[n++] = "momentum"; keys[n++] = "eps"; keys[n++] = "sync"; keys[n++] = "init";
        break;
    case GP_LAYER_FACTORIZED_REDUCE: /* momentum, eps, sync: of its norm; init: its convs */
        keys[n++] = "out";
        keys[n++] = "momentum"; keys[n++] = "eps"; keys[n++] = "sync"; keys[n++] = "init";
        break;
    case GP_LAYER_CONCAT:
        keys[n++] = "pop";
        break;
    case GP_LAYER_AMOEBA_CELL: /* momentum, eps, sync: of its batch norms */
        keys[n++] = "pop"; keys[n++] = "out"; keys[n++] = "reduction";
        keys[n++] = "momentum"; keys[n++] = "eps"; keys[n++] = "sync";
        break;
    default:
        break;
    }
    keys[n++] = "stash";
    keys[n++] = "name";
    return n;
}

/* pop: NAME, or [NAME, NAME] */
static gp_status parse_pops(gp_cfg_walk *w, const gp_ynode *opts, const char *sect,
                           gp_layer_spec *spec)
{
    const gp_ynode *p = gp_ymap_get(opts, "pop");
    if (gp_cfg_absent(p)) return GP_OK;
    char name[96], got[96];
    snprintf(name, sizeof name, "%s.pop", sect);
    const gp_ynode *one = p;
    int n = 1;
    if (p->kind == GP_YNODE_SEQ) {
        if (p->n < 1)
            return gp_cfg_bad(w, p, "%s lists no name; give the name of a stash, like pop: "
                              "skip1 (or leave pop out)", name);
        if (p->n > GP_MAX_POPS)
            return gp_cfg_bad(w, p, "%s lists %d names; a layer pops at most %d", name, p->n,
                              GP_MAX_POPS);
        n = p->n;
    }
    for (int q = 0; q < n; q++) {
        if (p->kind == GP_YNODE_SEQ) one = p->items[q];
        if (gp_cfg_absent(one) || one->kind != GP_YNODE_SCALAR || !one->text[0])
            return gp_cfg_bad(w, one ? one : p, "%s must be the name of a stash (or a list of "
                              "them), got %s", name, gp_cfg_describe(one, got, sizeof got));
        if (strlen(one->text) >= GP_SKIP_NAME)
            return gp_cfg_bad(w, one, "%s: the name is too long (at most %d characters)", name,
                              GP_SKIP_NAME - 1);
        snprintf(spec->pop[q], sizeof spec->pop[q], "%s", one->text);
    }
    spec->n_pop = n;
    return GP_OK;
}

/* kernel, stride, padding of the window layers: an integer n for (n, n),
 * or a list [h, w]; each value in [lo, hi].  A bad value is named with its
 * place in the file (the list's, or the element's). */
static gp_status get_hw(gp_cfg_walk *w, const gp_ynode *opts, const char *sect, const char *key,
                        int64_t lo, int64_t hi, gp_hw *out)
{
    char name[128], got[96];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_OTHER, 0, NULL, (double)lo, (double)hi, 0, NULL, 0);
    const gp_ynode *n = gp_ymap_get(opts, key);
    if (gp_cfg_absent(n)) return GP_OK; /* the spec's default stays */
    int64_t v[2];
    const gp_ynode *at[2] = {n, n};
    if (n->kind == GP_YNODE_SCALAR) {
        GP_TRY(gp_cfg_parse_int(w, n, name, &v[0]));
        v[1] = v[0];
    } else if (n->kind == GP_YNODE_SEQ && n->n == 2) {
        for (int q = 0; q < 2; q++) {
            char el[160];
            snprintf(el, sizeof el, "%s.%d", name, q);
            at[q] = n->items[q];
            if (gp_cfg_absent(at[q]) || at[q]->kind != GP_YNODE_SCALAR)
                return gp_cfg_bad(w, at[q] ? at[q] : n, "expected an integer for %s (the %s), "
                                  "got %s", el, q ? "width" : "height",
                                  gp_cfg_describe(at[q], got, sizeof got));
            GP_TRY(gp_cfg_parse_int(w, at[q], el, &v[q]));
        }
    } else if (n->kind == GP_YNODE_SEQ) {
        return gp_cfg_bad(w, n, "%s must be an integer or a list [height, width] of two, got a "
                          "list of %d", name, n->n);
    } else {
        return gp_cfg_bad(w, n, "expected an integer or a list [height, width] for %s, got %s",
                          name, gp_cfg_describe(n, got, sizeof got));
    }
    for (int q = 0; q < 2; q++) {
        const char *axis = n->kind == GP_YNODE_SEQ ? (q ? " (width)" : " (height)") : "";
        if (v[q] < lo)
            return gp_cfg_bad(w, at[q], "%s%s must be >= %lld, got %lld", name, axis,
                              (long long)lo, (long long)v[q]);
        if (v[q] > hi)
            return gp_cfg_bad(w, at[q], "%s%s must be <= %lld, got %lld", name, axis,
                              (long long)hi, (long long)v[q]);
    }
    *out = (gp_hw){v[0], v[1]};
    return GP_OK;
}

static bool has_key(const char *const *keys, int n, const char *k)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(keys[i], k)) return true;
    return false;
}

/* gp_cfg_bad at a layer's type key, naming the override that made or
 * changed the layer where one did (spec->set): a missing option an
 * override took away is not the file's line alone (that line may have
 * it). */
static gp_status layer_bad(const gp_cfg_walk *w, const gp_ynode *tnode, const gp_layer_spec *spec,
                           const char *fmt, ...)
{
    char loc[640], msg[1280];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gp_yloc_within(w->file, tnode, spec->set[0] ? spec->set : NULL, loc, sizeof loc);
    return gp_error_set(GP_ERR_INVALID, "%s: %s", loc, msg);
}

static gp_status parse_layer(gp_cfg_walk *w, const gp_ynode *item, int index, gp_layer_spec *spec)
{
    char got[96];
    const gp_ynode *tnode = NULL, *opts = NULL;
    if (item->kind == GP_YNODE_SCALAR) {
        tnode = item;
    } else if (item->kind == GP_YNODE_MAP && item->n == 1) {
        tnode = item->keys[0];
        opts = item->items[0];
    } else if (item->kind == GP_YNODE_MAP && item->n == 0) {
        return gp_cfg_bad(w, item, "layer %d is an empty map; write its type, like `- relu` or "
                          "`- linear: {out: 10}`", index);
    } else if (item->kind == GP_YNODE_MAP) {
        return gp_cfg_bad(w, item, "layer %d has %d keys ('%.40s', '%.40s'%s); a layer is one key, "
                          "its type, with its options as a map under it, like "
                          "`- conv2d: {out: 32, kernel: 3}` (indent the options under the type)",
                          index, item->n, item->keys[0]->text, item->keys[1]->text,
                          item->n > 2 ? ", ..." : "");
    } else {
        return gp_cfg_bad(w, item, "expected a layer type or {type: {options}} for "
                          "model.layers.%d, got %s", index, gp_cfg_describe(item, got, sizeof got));
    }
    gp_layer_type t;
    if (!gp_layer_type_parse(tnode->text, &t)) {
        const char *names[GP_LAYER_TYPE_COUNT];
        for (int i = 0; i < GP_LAYER_TYPE_COUNT; i++)
            names[i] = gp_layer_type_name((gp_layer_type)i);
        char hint[160], list[512];
        gp_cfg_nearest(tnode->text, names, GP_LAYER_TYPE_COUNT, hint, sizeof hint);
        gp_cfg_non_ascii(tnode->text, hint, sizeof hint);
        gp_cfg_list_names(names, GP_LAYER_TYPE_COUNT, list, sizeof list);
        return gp_cfg_bad(w, tnode, "unknown layer type %s%s (layer types: %s)",
                          gp_cfg_describe(tnode, got, sizeof got), hint, list);
    }
    *spec = gp_layer_spec_default(t);
    if (!tnode->set) { /* a layer made by an override has no place in a file */
        spec->line = tnode->line;
        spec->column = tnode->column;
        gp_cfg_keep_tail(spec->file, sizeof spec->file, w->file);
    }
    /* the override that made or changed it, for the layer's messages */
    const char *by = gp_ynode_set_within(item);
    if (by) gp_cfg_copy_text(spec->set, sizeof spec->set, by);
    const char *tname = gp_layer_type_name(t);
    const char *keys[16];
    int nk = gp_cfg_layer_keys(t, keys);
    if (gp_cfg_absent(opts)) opts = NULL;
    if (opts && opts->kind != GP_YNODE_MAP) {
        /* `linear: 10` most likely meant its out */
        const char *key = keys[0];
        for (int q = 0; q < nk; q++)
            if (!strcmp(keys[q], "out")) key = "out";
        bool scalar = opts->kind == GP_YNODE_SCALAR && opts->text && opts->text[0];
        return gp_cfg_bad(w, opts, "options of layer %d (%s) must be a map, like {%s: %s}, got %s",
                          index, tname, key, scalar ? opts->text : "...",
                          gp_cfg_describe(opts, got, sizeof got));
    }
    char what[96], sect[64];
    snprintf(what, sizeof what, "layer %d (%s)", index, tname);
    snprintf(sect, sizeof sect, "model.layers.%d", index);
    GP_TRY(gp_cfg_check_keys_list(w, opts, what, keys, nk));

    const int64_t big = (int64_t)1 << 31;
    if (has_key(keys, nk, "in"))
        GP_TRY(gp_cfg_get_int(w, opts, sect, "in", spec->in, 0, big, &spec->in));
    if (has_key(keys, nk, "out"))
        GP_TRY(gp_cfg_get_int(w, opts, sect, "out", spec->out, 1, big, &spec->out));
    /* window layers take [h, w] pairs; residual and add one stride */
    bool window = has_key(keys, nk, "kernel");
    if (window) GP_TRY(get_hw(w, opts, sect, "kernel", 1, 1 << 16, &spec->kernel));
    if (window && has_key(keys, nk, "stride"))
        GP_TRY(get_hw(w, opts, sect, "stride", 1, 1 << 16, &spec->stride));
    if (!window && has_key(keys, nk, "stride")) {
        int64_t st = spec->stride.h;
        GP_TRY(gp_cfg_get_int(w, opts, sect, "stride", st, 1, 1 << 16, &st));
        spec->stride = gp_hw_square(st);
    }
    if (has_key(keys, nk, "padding"))
        GP_TRY(get_hw(w, opts, sect, "padding", 0, 1 << 16, &spec->padding));
    if (has_key(keys, nk, "bias"))
        GP_TRY(gp_cfg_get_bool(w, opts, sect, "bias", spec->bias, &spec->bias));
    if (has_key(keys, nk, "reduction"))
        GP_TRY(gp_cfg_get_bool(w, opts, sect, "reduction", spec->reduction, &spec->reduction));
    if (has_key(keys, nk, "count_include_pad"))
        GP_TRY(gp_cfg_get_bool(w, opts, sect, "count_include_pad", spec->count_include_pad,
                               &spec->count_include_pad));
    if (has_key(keys, nk, "init")) {
        const char *inits[GP_INIT_COUNT];
        for (int i = 0; i < GP_INIT_COUNT; i++) inits[i] = gp_conv_init_name((gp_conv_init)i);
        int v = (int)spec->init;
        GP_TRY(gp_cfg_get_enum(w, opts, sect, "init", inits, GP_INIT_COUNT, v, &v));
        spec->init = (gp_conv_init)v;
        if (t == GP_LAYER_LINEAR && v != GP_INIT_DEFAULT && v != GP_INIT_NORMAL)
            return gp_cfg_bad(w, gp_ymap_get(opts, "init"), "%s.init: a linear layer takes "
                              "default (PyTorch's nn.Linear) or normal (GPT-2's, with std), "
                              "not %s", sect, gp_conv_init_name(spec->init));
    }
    if (has_key(keys, nk, "std")) /* init: normal's */
        GP_TRY(gp_cfg_get_float(w, opts, sect, "std", spec->std, 0, INFINITY, GP_CFG_LO_OPEN,
                                &spec->std));
    if (has_key(keys, nk, "momentum"))
        GP_TRY(gp_cfg_get_float(w, opts, sect, "momentum", spec->momentum, 0, 1, 0,
                                &spec->momentum));
    if (has_key(keys, nk, "eps"))
        GP_TRY(gp_cfg_get_float(w, opts, sect, "eps", spec->eps, 0, INFINITY, GP_CFG_LO_OPEN,
                                &spec->eps));
    if (has_key(keys, nk, "sync"))
        GP_TRY(gp_cfg_get_bool(w, opts, sect, "sync", spec->sync, &spec->sync));
    if (has_key(keys, nk, "p"))
        GP_TRY(gp_cfg_get_float(w, opts, sect, "p", spec->p, 0, 1, GP_CFG_HI_OPEN, &spec->p));
    if (has_key(keys, nk, "slope"))
        GP_TRY(gp_cfg_get_float(w, opts, sect, "slope", spec->slope, 0, INFINITY, 0,
                                &spec->slope));
    if (has_key(keys, nk, "scale"))
        GP_TRY(gp_cfg_get_int(w, opts, sect, "scale", spec->scale, 1, 1 << 16, &spec->scale));
    if (has_key(keys, nk, "heads"))
        GP_TRY(gp_cfg_get_int(w, opts, sect, "heads", spec->heads, 1, 1 << 16, &spec->heads));
    if (has_key(keys, nk, "kv_heads"))
        GP_TRY(gp_cfg_get_int(w, opts, sect, "kv_heads", spec->kv_heads, 1, 1 << 16,
                              &spec->kv_heads));
    if (t == GP_LAYER_ROPE) {
        GP_TRY(gp_cfg_get_float(w, opts, sect, "theta", spec->rope_theta, 1, INFINITY,
                                GP_CFG_LO_OPEN, &spec->rope_theta));
        static const char *const scalings[] = {"none", "llama3"};
        int v = spec->rope_llama3;
        GP_TRY(gp_cfg_get_enum(w, opts, sect, "scaling", scalings, 2, v, &v));
        spec->rope_llama3 = v == 1;
        GP_TRY(gp_cfg_get_float(w, opts, sect, "factor", spec->rope_factor, 1, INFINITY, 0,
                                &spec->rope_factor));
        GP_TRY(gp_cfg_get_float(w, opts, sect, "low_freq_factor", spec->rope_low_freq, 0,
                                INFINITY, GP_CFG_LO_OPEN, &spec->rope_low_freq));
        GP_TRY(gp_cfg_get_float(w, opts, sect, "high_freq_factor", spec->rope_high_freq, 0,
                                INFINITY, GP_CFG_LO_OPEN, &spec->rope_high_freq));
        GP_TRY(gp_cfg_get_int(w, opts, sect, "original_positions", spec->rope_orig_positions, 1,
                              (int64_t)1 << 40, &spec->rope_orig_positions));
    }
    if (t == GP_LAYER_EMBEDDING) { /* token ids are floats: exact below 2^24 */
        const int64_t ids = (int64_t)1 << 24;
        GP_TRY(gp_cfg_get_int(w, opts, sect, "vocab", spec->vocab, 1, ids, &spec->vocab));
        GP_TRY(gp_cfg_get_int(w, opts, sect, "dim", spec->dim, 1, big, &spec->dim));
        /* positions: 0 is no position table (a Llama's rotary positions) */
        GP_TRY(gp_cfg_get_int(w, opts, sect, "positions", spec->positions, 0, ids,
                              &spec->positions));
        if (spec->vocab < 1 || spec->dim < 1 ||
            gp_cfg_absent(gp_ymap_get(opts, "positions")))
            return layer_bad(w, tnode, spec, "layer %d (embedding) needs 'vocab', 'dim' and "
                             "'positions', like `- embedding: {vocab: 256, dim: 64, positions: "
                             "128}` (positions: 0 for no position table, as a Llama with a "
                             "rope layer)", index);
    }
    GP_TRY(gp_cfg_get_str(w, opts, sect, "name", "", spec->name, sizeof spec->name));
    GP_TRY(gp_cfg_get_str(w, opts, sect, "stash", "", spec->stash, sizeof spec->stash));
    if (has_key(keys, nk, "tie"))
        GP_TRY(gp_cfg_get_str(w, opts, sect, "tie", "", spec->tie, sizeof spec->tie));
    const gp_ynode *sn = gp_ymap_get(opts, "stash");
    if (!gp_cfg_absent(sn) && !spec->stash[0]) /* as an empty pop is */
        return gp_cfg_bad(w, sn, "%s.stash is empty; give the stash a name, like stash: skip1 "
                          "(or leave stash out)", sect);
    if (has_key(keys, nk, "pop")) GP_TRY(parse_pops(w, opts, sect, spec));
    /* an AmoebaNet cell's pop is optional (the first cell has no cell
     * before the previous one: it takes its input twice) */
    if (has_key(keys, nk, "pop") && spec->n_pop == 0 && t != GP_LAYER_AMOEBA_CELL)
        return layer_bad(w, tnode, spec, "layer %d (%s) needs 'pop', the name of the stash it "
                         "takes, like `- %s: {pop: skip1}` after a layer with {stash: skip1}",
                         index, tname, tname);

    if (has_key(keys, nk, "out") && spec->out < 1 && t != GP_LAYER_ADD)
        return layer_bad(w, tnode, spec, "layer %d (%s) needs 'out', the number of output %s, "
                         "like `- %s: {out: 64}`", index, tname,
                         t == GP_LAYER_LINEAR ? "features" : "channels", tname);
    if (t == GP_LAYER_FACTORIZED_REDUCE && spec->out % 2 != 0)
        return gp_cfg_bad(w, gp_ymap_get(opts, "out"), "layer %d (%s): out = %lld must be even "
                          "(two convolutions of out / 2 channels each are concatenated)", index,
                          tname, (long long)spec->out);
    if (has_key(keys, nk, "kernel") && spec->kernel.h < 1)
        return layer_bad(w, tnode, spec, "layer %d (%s) needs 'kernel', like `- %s: {kernel: "
                         "3}`", index, tname, tname);
    return GP_OK;
}

gp_status gp_cfg_parse_shape(const gp_cfg_walk *w, const gp_ynode *in, const char *what,
                             int64_t dims[3])
{
    const int64_t max = (int64_t)1 << 24;
    gp_cfg_key_agrees(what, GP_CFG_OTHER, 0, NULL, 1, (double)max, 0, NULL, 0);
    dims[0] = dims[1] = dims[2] = 1;
    if (in->kind == GP_YNODE_SEQ) {
        if (in->n != 1 && in->n != 3)
            return gp_cfg_bad(w, in, "%s must be [C, H, W] or [F], got a list of %d", what, in->n);
        for (int i = 0; i < in->n; i++) {
            const gp_ynode *d = in->items[i];
            char name[64];
            snprintf(name, sizeof name, "%s.%d", what, i);
            if (gp_cfg_absent(d))
                return gp_cfg_bad(w, d ? d : in, "expected an integer for %s, got nothing",
                                  name);
            GP_TRY(gp_cfg_parse_int(w, d, name, &dims[i]));
            if (dims[i] < 1 || dims[i] > max)
                return gp_cfg_bad(w, d, "%s must be in [1, %lld], got %lld", name, (long long)max,
                                  (long long)dims[i]);
        }
        return GP_OK;
    }
    if (in->kind == GP_YNODE_SCALAR) {
        GP_TRY(gp_cfg_parse_int(w, in, what, &dims[0]));
        if (dims[0] < 1 || dims[0] > max)
            return gp_cfg_bad(w, in, "%s must be in [1, %lld], got %lld", what, (long long)max,
                              (long long)dims[0]);
        return GP_OK;
    }
    return gp_cfg_expected(w, in, "[C, H, W]", what);
}

gp_status gp_cfg_parse_model(gp_cfg_walk *w, const gp_ynode *root, gp_model_config *mc)
{
    char got[96];
    const gp_ynode *mkey = gp_ymap_key(root, "model");
    const gp_ynode *m = gp_ymap_get(root, "model");
    if (gp_cfg_absent(m))
        return gp_cfg_bad(w, m && m->set ? m : mkey ? mkey : root, "missing section 'model'; a "
                          "config needs at least "
                          "model.input (the shape of one sample) and model.layers");
    if (m->kind != GP_YNODE_MAP)
        return gp_cfg_bad(w, m, "expected a map for model, with input and layers, got %s",
                          gp_cfg_describe(m, got, sizeof got));
    GP_TRY(gp_cfg_check_keys(w, m, "model"));

    /* input: [C, H, W], or [F] / F for flat samples */
    const gp_ynode *in = gp_ymap_get(m, "input");
    if (in) gp_yloc(w->file, in, mc->input_at, sizeof mc->input_at);
    if (gp_cfg_absent(in))
        return gp_cfg_bad(w, in ? in : mkey, "missing model.input: the shape of one sample, like "
                          "input: [1, 28, 28] (C, H, W) or input: [784]");
    GP_TRY(gp_cfg_parse_shape(w, in, "model.input", mc->input));

    bool family = false;
    GP_TRY(gp_cfg_parse_family(w, m, mc, &family));
    const gp_ynode *ls = gp_ymap_get(m, "layers");
    if (!family) {
        if (gp_cfg_absent(ls))
            return gp_cfg_bad(w, ls ? ls : mkey, "missing model.layers: a list of layers, like "
                              "layers: [flatten, {linear: {out: 10}}] (or a built-in model: "
                              "resnet: {depth: 101}, amoebanet: {layers: 18, filters: 256}, "
                              "unet: {depth: 5, base: 64}, gpt: {layers: 12} or llama: "
                              "{layers: 16, ...})");
        if (ls->kind != GP_YNODE_SEQ)
            return gp_cfg_bad(w, ls, "expected a list for model.layers, got %s",
                              gp_cfg_describe(ls, got, sizeof got));
        if (ls->n == 0) return gp_cfg_bad(w, ls, "model.layers is empty; give at least one layer");
        mc->layers = calloc((size_t)ls->n, sizeof *mc->layers);
        if (!mc->layers) return gp_error_set(GP_ERR_INVALID, "out of memory reading the config");
        mc->n_layers = ls->n;
        bool rec = w->record;
        w->record = false;
        gp_status s = GP_OK;
        for (int i = 0; i < ls->n && s == GP_OK; i++)
            s = parse_layer(w, ls->items[i], i, &mc->layers[i]);
        w->record = rec;
        GP_TRY(s);
    }
    /* Every pop has its stash before it, and every stash its pop. */
    gp_skip_map map;
    GP_TRY(gp_skip_map_build(mc->layers, mc->n_layers, &map));
    gp_skip_map_free(&map);
    gp_layer_specs_link(mc->layers, mc->n_layers); /* in-place activated instance norm */
    for (int i = 0; i < mc->n_layers && !family; i++) {
        if (!mc->layers[i].name[0]) continue;
        for (int j = 0; j < i; j++) {
            if (!strcmp(mc->layers[i].name, mc->layers[j].name)) {
                const gp_ynode *item = ls->items[i];
                return gp_cfg_bad(w, gp_ymap_get(item->items ? item->items[0] : NULL, "name"),
                                  "layer name '%s' is used by layers %d and %d; names must be "
                                  "unique", mc->layers[i].name, j, i);
            }
        }
    }

    const char *losses[GP_LOSS_COUNT];
    for (int i = 0; i < GP_LOSS_COUNT; i++) losses[i] = gp_loss_name((gp_loss_kind)i);
    int loss = GP_LOSS_CROSS_ENTROPY;
    GP_TRY(gp_cfg_get_enum(w, m, "model", "loss", losses, GP_LOSS_COUNT, loss, &loss));
    mc->loss = (gp_loss_kind)loss;
    const gp_ynode *ln = gp_ymap_get(m, "loss");
    if (!gp_cfg_absent(ln)) gp_yloc(w->file, ln, mc->loss_at, sizeof mc->loss_at);
    /* listed among the defaults (--dry-run -v) where it applies, as
     * train.clip_grad_norm is: a user of a recipe with smoothing sees that
     * this config has none */
    bool rec = w->record;
    w->record = rec && mc->loss == GP_LOSS_CROSS_ENTROPY;
    gp_status s = gp_cfg_get_float(w, m, "model", "label_smoothing", 0, 0, 1, GP_CFG_HI_OPEN,
                                   &mc->label_smoothing);
    w->record = rec;
    GP_TRY(s);
    if (mc->label_smoothing > 0 && mc->loss != GP_LOSS_CROSS_ENTROPY)
        return gp_cfg_bad(w, gp_ymap_get(m, "label_smoothing"),
                          "model.label_smoothing is for model.loss: cross_entropy (class ids); "
                          "this model's loss is %s", gp_loss_name(mc->loss));
    GP_TRY(gp_cfg_get_str(w, m, "model", "init_from", "", mc->init_from, sizeof mc->init_from));
    if (!mc->init_from[0]) gp_cfg_note(w, "model.init_from: none (default: initialised afresh)");
    return GP_OK;
}
