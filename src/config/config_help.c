/*
 * config_help.c — the keys' reference, printed from config_keys.c's table
 * (the one the parser checks keys and getters against): `gpipe-train
 * --help-config` as plain text, one key per entry, or as Markdown tables.
 * tests/test_config_doc.py holds docs/config.md to it.
 */
#include "config/config_impl.h"

#include <math.h>
#include <string.h>

/* An integer bound: 2^k for the round powers of two the ranges use, else
 * the digits. */
static void int_text(double v, char *buf, size_t cap)
{
    int e;
    double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
    if (v >= 65536 && m == 0.5) snprintf(buf, cap, "2^%d", e - 1);
    else snprintf(buf, cap, "%.0f", v);
}

static void bound_text(const gp_cfg_key *k, double v, char *buf, size_t cap)
{
    if (k->type == GP_CFG_NUM || (k->type == GP_CFG_OTHER && v != floor(v))) {
        char g[32];
        snprintf(g, sizeof g, "%g", v);
        char *e = strchr(g, 'e'); /* 1e+07 as a config writes it: 1e7 */
        if (e) {
            const char *exp = e + 1 + (e[1] == '+');
            bool neg = *exp == '-';
            exp += neg;
            while (*exp == '0' && exp[1]) exp++;
            snprintf(buf, cap, "%.*se%s%s", (int)(e - g), g, neg ? "-" : "", exp);
        } else {
            snprintf(buf, cap, "%s", g);
        }
    } else {
        int_text(v, buf, cap);
    }
}

/* "[1, 1024]", "(0, 1)", ">= 0", "> 0", "0 .. 2^64-1"; "" for none. */
static void range_text(const gp_cfg_key *k, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (k->lo == 0 && k->hi == 0) return;
    char lo[32], hi[32];
    bound_text(k, k->lo, lo, sizeof lo);
    bool lo_open = k->flags & GP_CFG_LO_OPEN, hi_open = k->flags & GP_CFG_HI_OPEN;
    if (!isinf(k->hi) && k->hi >= 18446744073709551615.0) {
        snprintf(buf, cap, "%s .. 2^64-1", lo);
    } else if (isinf(k->hi) || k->hi >= 9223372036854775807.0) {
        snprintf(buf, cap, "%s %s", lo_open ? ">" : ">=", lo);
    } else {
        bound_text(k, k->hi, hi, sizeof hi);
        snprintf(buf, cap, "%c%s, %s%c", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    }
}

static const char *type_text(const gp_cfg_key *k, char *buf, size_t cap)
{
    switch (k->type) {
    case GP_CFG_MAP: return "map";
    case GP_CFG_INT: return "integer";
    case GP_CFG_NUM: return "number";
    case GP_CFG_BOOL: return "true or false";
    case GP_CFG_STR: return "string";
    case GP_CFG_SIZE: return "size (512MiB, 1.5GB, bytes)";
    case GP_CFG_ENUM: snprintf(buf, cap, "one of %s", k->form); return buf;
    case GP_CFG_OTHER: return k->form;
    }
    return "?";
}

/* The layer types that take option `opt` ("every layer" for all). */
static void layer_types_text(const char *opt, char *buf, size_t cap)
{
    size_t used = 0;
    int n = 0;
    buf[0] = '\0';
    for (int t = 0; t < GP_LAYER_TYPE_COUNT; t++) {
        const char *keys[16];
        int nk = gp_cfg_layer_keys((gp_layer_type)t, keys);
        bool takes = false;
        for (int i = 0; i < nk && !takes; i++) takes = !strcmp(keys[i], opt);
        if (!takes) continue;
        n++;
        int w = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "",
                         gp_layer_type_name((gp_layer_type)t));
        if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
    }
    if (n == GP_LAYER_TYPE_COUNT) snprintf(buf, cap, "every layer");
}

/* The parts of the reference, in order: a title and the rows whose key
 * starts with `prefix` (and, when `inner` is false, has no '#'). */
static const struct {
    const char *title, *prefix;
    bool inner;
} k_parts[] = {
    {"model", "model", false},
    {"layer options (model.layers.#: the options of one layer; 'layers' lists the types "
     "that take each)", "model.layers.#.", true},
    {"pipeline", "pipeline", false},
    {"device options (pipeline.devices.#: a device given as a map)", "pipeline.devices.#.", true},
    {"data", "data", false},
    {"train", "train", false},
};

static bool in_part(const gp_cfg_key *k, int p)
{
    size_t pl = strlen(k_parts[p].prefix);
    if (strncmp(k->key, k_parts[p].prefix, pl)) return false;
    if (!k_parts[p].inner && k->key[pl] && k->key[pl] != '.') return false;
    return k_parts[p].inner == (strchr(k->key, '#') != NULL);
}

static void print_entry(FILE *f, const gp_cfg_key *k, bool markdown, bool layer)
{
    char range[96], type[512], layers[512] = "";
    range_text(k, range, sizeof range);
    const char *ty = type_text(k, type, sizeof type);
    if (layer) layer_types_text(strrchr(k->key, '.') + 1, layers, sizeof layers);
    if (markdown) {
        fprintf(f, "| `%s` | %s | %s | %s | %s%s%s |\n", k->key, ty, k->def ? k->def : "",
                range, k->meaning, layer ? ". Layers: " : "", layers);
        return;
    }
    fprintf(f, "%s%s%s  (%s%s%s)\n    %s\n", k->key, k->def ? " = " : "", k->def ? k->def : "",
            ty, range[0] ? "; " : "", range, k->meaning);
    if (layer) fprintf(f, "    layers: %s\n", layers);
}

void gp_config_help(FILE *f, bool markdown)
{
    int n;
    const gp_cfg_key *keys = gp_cfg_keys(&n);
    if (markdown)
        fputs("Every key of a gpipe config, from the table the parser checks keys and "
              "defaults against (`gpipe-train --help-config=markdown`).\n", f);
    else
        fputs("Every key of a gpipe config, from the table the parser checks keys and\n"
              "defaults against; docs/config.md is the whole reference.  Each entry:\n"
              "KEY = DEFAULT  (TYPE; RANGE), then what it is.  A '#' is a list index.\n", f);
    for (int p = 0; p < GP_COUNT(k_parts); p++) {
        if (markdown)
            fprintf(f, "\n### %s\n", k_parts[p].title);
        else
            fprintf(f, "\n[%s]\n", k_parts[p].title);
        bool layer = !strcmp(k_parts[p].prefix, "model.layers.#.");
        if (layer) {
            fputs(markdown ? "\nLayer types: " : "    layer types: ", f);
            for (int t = 0; t < GP_LAYER_TYPE_COUNT; t++)
                fprintf(f, markdown ? "%s`%s`" : "%s%s", t ? ", " : "",
                        gp_layer_type_name((gp_layer_type)t));
            fputs(markdown ? ".\n" : "\n", f);
        }
        if (markdown) fputs("\n| key | type | default | range | meaning |\n|---|---|---|---|---|\n", f);
        for (int i = 0; i < n; i++)
            if (in_part(&keys[i], p)) print_entry(f, &keys[i], markdown, layer);
    }
}
