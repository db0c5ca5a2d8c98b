/*
 * config_walk.c — what every section of the walk uses (config_impl.h):
 * messages at a node's file:line:column, the defaults list, unknown keys
 * against the keys' table (config_keys.c) with the best "did you mean" we
 * can find, and the typed getters that know a default and a range (each
 * checked against the table's row: gp_cfg_key_agrees).
 */
#include "config/config_impl.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The keys the unknown-key check knows are config_keys.c's table, less
 * the rows of list items ('#': layer options and device maps, which are
 * checked against their own lists).  At most this many. */
#define MAX_SCHEMA 512

/* The dotted paths of the table's rows outside list items; their count. */
static int schema_keys(const char **out)
{
    int nk, n = 0;
    const gp_cfg_key *k = gp_cfg_keys(&nk);
    for (int i = 0; i < nk && n < MAX_SCHEMA; i++)
        if (!strchr(k[i].key, '#')) out[n++] = k[i].key;
    return n;
}

/* An example value per key, for messages that ask for one ("--set
 * train.steps=: empty value; give a value, e.g. --set train.steps=100").
 * In a pattern, '#' stands for a list index and '*' for any one part; the
 * first match wins. */
static const char *const k_examples[][2] = {
    {"model", "{input: [1, 28, 28], layers: [flatten, {linear: {out: 10}}]}"},
    {"model.input", "[1,28,28]"}, {"model.input.#", "28"},
    {"model.layers", "[flatten, {linear: {out: 10}}]"}, {"model.layers.#", "{linear: {out: 10}}"},
    {"model.layers.#.in", "64"}, {"model.layers.#.out", "64"}, {"model.layers.#.kernel", "3"},
    {"model.layers.#.stride", "1"}, {"model.layers.#.padding", "1"},
    {"model.layers.#.bias", "false"}, {"model.layers.#.momentum", "0.1"},
    {"model.layers.#.eps", "1e-5"}, {"model.layers.#.sync", "true"},
    {"model.layers.#.p", "0.5"}, {"model.layers.#.name", "fc1"},
    {"model.layers.#.count_include_pad", "false"},
    {"model.layers.#.init", "kaiming_normal_fan_out"}, {"model.layers.#.std", "0.02"},
    {"model.layers.#.reduction", "true"},
    {"model.layers.#.*", "{out: 64}"}, {"model.layers.#.*.*", "64"},
    {"model.loss", "cross_entropy"}, {"model.label_smoothing", "0.1"},
    {"model.init_from", "weights.safetensors"},
    {"model.resnet", "{depth: 101, classes: 1000}"}, {"model.resnet.depth", "101"},
    {"model.resnet.classes", "1000"},
    {"model.amoebanet", "{layers: 18, filters: 256, classes: 1000}"},
    {"model.amoebanet.layers", "18"}, {"model.amoebanet.filters", "256"},
    {"model.amoebanet.classes", "1000"},
    {"model.unet", "{depth: 5, num_convs: 5, base: 64}"}, {"model.unet.depth", "5"},
    {"model.unet.num_convs", "5"}, {"model.unet.base", "64"}, {"model.unet.in_channels", "3"},
    {"model.unet.out_channels", "1"},
    {"model.gpt", "{layers: 12, heads: 12, width: 768}"}, {"model.gpt.layers", "24"},
    {"model.gpt.heads", "16"}, {"model.gpt.width", "1024"}, {"model.gpt.positions", "1024"},
    {"model.gpt.vocab", "50257"}, {"model.gpt.vocab_pad", "128"}, {"model.gpt.dropout", "0.1"},
    {"model.gpt.tie", "false"},
    {"model.llama", "{layers: 16, heads: 32, kv_heads: 8, width: 2048, intermediate: 8192}"},
    {"model.llama.layers", "16"}, {"model.llama.heads", "32"}, {"model.llama.kv_heads", "8"},
    {"model.llama.width", "2048"}, {"model.llama.intermediate", "8192"},
    {"model.llama.vocab", "128256"}, {"model.llama.positions", "131072"},
    {"model.llama.rope_theta", "500000"},
    {"model.llama.rope_scaling", "{factor: 32, low_freq_factor: 1, high_freq_factor: 4, "
                                 "original_positions: 8192}"},
    {"model.llama.rope_scaling.factor", "32"}, {"model.llama.rope_scaling.low_freq_factor", "1"},
    {"model.llama.rope_scaling.high_freq_factor", "4"},
    {"model.llama.rope_scaling.original_positions", "8192"}, {"model.llama.rms_eps", "1e-5"},
    {"model.llama.tie", "true"}, {"model.llama.qkv_bias", "true"}, {"model.llama.std", "0.02"},
    {"pipeline", "{devices: [cpu:0, cpu:1], chunks: 4}"},
    {"pipeline.devices", "[cpu:0,cpu:1]"}, {"pipeline.devices.#", "cpu:0"},
    {"pipeline.devices.#.name", "cpu:0"}, {"pipeline.devices.#.memory", "512MiB"},
    {"pipeline.devices.#.threads", "2"}, {"pipeline.devices.#.#", "cpu:0"},
    {"pipeline.balance", "auto"}, {"pipeline.balance.#", "3"}, {"pipeline.chunks", "4"},
    {"pipeline.checkpoint", "except_last"}, {"pipeline.lockstep", "true"},
    {"pipeline.schedule.file", "zb-v.csv"},
    {"pipeline.threads", "2"}, {"pipeline.memory", "512MiB"}, {"pipeline.replicas", "2"},
    {"pipeline.copy_precision", "bf16"}, {"pipeline.peer_timeout", "600"},
    {"data", "{dataset: synthetic}"}, {"data.dataset", "fashion-mnist"},
    {"data.path", "/usr/share/datasets/fashion-mnist"}, {"data.shuffle", "true"},
    {"data.normalize", "true"}, {"data.mean", "[0.5]"}, {"data.std", "[0.25]"},
    {"data.augment", "{hflip: true}"}, {"data.augment.crop_padding", "4"},
    {"data.augment.hflip", "true"}, {"data.prefetch", "2"}, {"data.train_limit", "1000"},
    {"data.test_limit", "1000"}, {"data.synthetic", "{train: 1024}"},
    {"data.synthetic.train", "1024"}, {"data.synthetic.test", "256"},
    {"data.synthetic.classes", "10"}, {"data.synthetic.shape", "[1,28,28]"},
    {"data.synthetic.masks", "true"},
    {"data.layout", "segmentation"}, {"data.masks", "binary"}, {"data.workers", "2"},
    {"data.on_bad_file", "skip"}, {"data.cache_dir", "/tmp/gpipe-cache"},
    {"data.augment.random_resized_crop", "{scale: [0.08, 1.0]}"},
    {"data.augment.random_resized_crop.scale", "[0.08, 1.0]"},
    {"data.augment.random_resized_crop.ratio", "[0.75, 1.3333]"},
    {"data.augment.resize", "256"},
    {"train", "{epochs: 1}"}, {"train.epochs", "3"}, {"train.steps", "100"},
    {"train.batch_size", "64"}, {"train.seed", "1"}, {"train.optimizer", "{lr: 0.05}"},
    {"train.optimizer.type", "sgd"}, {"train.optimizer.lr", "0.05"},
    {"train.optimizer.momentum", "0.9"}, {"train.optimizer.nesterov", "true"},
    {"train.optimizer.betas", "[0.9, 0.999]"}, {"train.optimizer.eps", "1e-8"},
    {"train.optimizer.weight_decay", "0.0005"}, {"train.optimizer.decay_bias_and_norm", "true"},
    {"train.schedule", "cosine"}, {"train.schedule.type", "cosine"},
    {"train.schedule.warmup_steps", "200"}, {"train.schedule.warmup_start", "0.1"},
    {"train.schedule.step_size", "1000"}, {"train.schedule.gamma", "0.1"},
    {"train.schedule.min_lr", "0.001"}, {"train.lr_scaling", "linear"},
    {"train.base_batch", "256"}, {"train.log_every", "50"}, {"train.eval_each_epoch", "true"},
    {"train.eval_batch_size", "1000"}, {"train.clip_grad_norm", "1.0"},
    {"train.precision", "bf16"},
    {"train.activations", "bf16"},
    {"train.deterministic", "true"},
    {"train.snapshot", "{every_steps: 500}"},
    {"train.snapshot.every_steps", "500"}, {"train.snapshot.every_minutes", "10"},
    {"train.snapshot.keep", "3"}, {"train.snapshot.dir", "snapshots"},
    {"train.tensorboard", "runs/exp1"},
};

/* Does the dotted key match the pattern ('#' an index, '*' any part)? */
static bool key_matches(const char *key, const char *pat)
{
    for (;;) {
        size_t kl = strcspn(key, "."), pl = strcspn(pat, ".");
        if (pl == 1 && pat[0] == '#') {
            if (kl == 0 || strspn(key, "0123456789") != kl) return false;
        } else if (!(pl == 1 && pat[0] == '*' && kl > 0)) {
            if (kl != pl || strncmp(key, pat, kl)) return false;
        }
        if (!key[kl] || !pat[pl]) return !key[kl] && !pat[pl];
        key += kl + 1;
        pat += pl + 1;
    }
}

const char *gp_cfg_example(const char *key)
{
    for (int i = 0; i < GP_COUNT(k_examples); i++)
        if (key_matches(key, k_examples[i][0])) return k_examples[i][1];
    return NULL;
}

/* ---- messages ------------------------------------------------------------- */

gp_status gp_cfg_bad(const gp_cfg_walk *w, const gp_ynode *n, const char *fmt, ...)
{
    char loc[640], msg[1280];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gp_error_set(GP_ERR_INVALID, "%s: %s", gp_yloc(w->file, n, loc, sizeof loc), msg);
}

/* line + '\n' at the end of *buf (len, cap: its length and size). */
static void append_line(char **buf, size_t *len, size_t *cap, const char *line)
{
    size_t k = strlen(line);
    if (*len + k + 2 > *cap) {
        size_t c = *cap ? *cap * 2 : 1024;
        while (c < *len + k + 2) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return; /* both lists are informational; losing a line is harmless */
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, line, k);
    *len += k;
    (*buf)[(*len)++] = '\n';
    (*buf)[*len] = '\0';
}

void gp_cfg_note(gp_cfg_walk *w, const char *fmt, ...)
{
    if (!w->record) return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    append_line(&w->defaults, &w->dlen, &w->dcap, line);
}

void gp_cfg_warn(gp_cfg_walk *w, const gp_ynode *n, const char *fmt, ...)
{
    char loc[640], msg[1024], line[1700];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    snprintf(line, sizeof line, "%s: %s", gp_yloc(w->file, n, loc, sizeof loc), msg);
    append_line(&w->warnings, &w->wlen, &w->wcap, line);
}

/* "'abc'", "a list", "a map" or "nothing", for "got ..." */
const char *gp_cfg_describe(const gp_ynode *n, char *buf, size_t len)
{
    if (!n || n->kind == GP_YNODE_NULL) return "nothing";
    if (n->kind == GP_YNODE_MAP) return "a map";
    if (n->kind == GP_YNODE_SEQ) return "a list";
    if (strlen(n->text) > 60)
        snprintf(buf, len, "'%.57s...'", n->text);
    else
        snprintf(buf, len, "'%s'", n->text);
    return buf;
}

gp_status gp_cfg_expected(const gp_cfg_walk *w, const gp_ynode *n, const char *what,
                          const char *name)
{
    char got[96];
    return gp_cfg_bad(w, n, "expected %s for %s, got %s", what, name,
                      gp_cfg_describe(n, got, sizeof got));
}

void gp_cfg_join(char *buf, size_t len, const char *sect, const char *key)
{
    if (sect && sect[0])
        snprintf(buf, len, "%s.%s", sect, key);
    else
        snprintf(buf, len, "%s", key);
}

/* The index of the first of names[0..n) nearest to `word` by edit
 * distance, if it is near enough to be a typo of it (1 edit for words of up
 * to 3 characters, 2 up to 6, 3 beyond); else -1. */
static int closest(const char *word, const char *const *names, int n)
{
    int best = -1, bestd = 99;
    for (int i = 0; i < n; i++) {
        int d = gp_edit_distance(word, names[i]);
        if (d < bestd) {
            bestd = d;
            best = i;
        }
    }
    size_t wl = strlen(word);
    int thr = wl <= 3 ? 1 : wl <= 6 ? 2 : 3;
    return bestd <= thr ? best : -1;
}

/* " did you mean 'x'?" for the nearest of names[] to `word`, or "". */
void gp_cfg_nearest(const char *word, const char *const *names, int n, char *buf,
                    size_t len)
{
    size_t wl = strlen(word);
    int best = -1;
    buf[0] = '\0';
    /* only the case differs ("ZB-H1", "adamW"): that name, before any typo
     * of another ("adam" is 1 edit from "adamW", as "adamw" is) */
    for (int i = 0; i < n && best < 0; i++)
        if (!strcasecmp(names[i], word)) best = i;
    if (best < 0) best = closest(word, names, n);
    if (best >= 0) {
        snprintf(buf, len, "; did you mean '%s'?", names[best]);
        return;
    }
    /* an abbreviation ("mom" for "momentum"), else a part ("pool") */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n && wl >= 3; i++) {
            if (pass == 0 ? !strncmp(names[i], word, wl) : strstr(names[i], word) != NULL) {
                snprintf(buf, len, "; did you mean '%s'?", names[i]);
                return;
            }
        }
    }
}

void gp_cfg_copy_text(char *dst, size_t len, const char *src)
{
    size_t n = strlen(src);
    if (n >= len) n = gp_utf8_cut(src, len - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

void gp_cfg_keep_tail(char *dst, size_t len, const char *path)
{
    size_t n = strlen(path), room = len - 1;
    if (n <= room) {
        memcpy(dst, path, n + 1);
        return;
    }
    /* from a character's first byte (a continuation byte is half of one) */
    const char *tail = path + (n - room + 3);
    while (((unsigned char)*tail & 0xC0) == 0x80) tail++;
    snprintf(dst, len, "...%s", tail);
}

void gp_cfg_non_ascii(const char *word, char *buf, size_t len)
{
    const unsigned char *p = (const unsigned char *)word;
    int chr = 1; /* 1-based, as a reader counts */
    while (*p && *p < 0x80) p++, chr++;
    if (!*p) return;
    /* decode one UTF-8 sequence (libyaml has checked a file's; an override
     * comes from the shell as it is) */
    unsigned cp = 0;
    int more = *p >= 0xF0 ? 3 : *p >= 0xE0 ? 2 : *p >= 0xC0 ? 1 : -1;
    if (more > 0) {
        cp = *p & (0x3Fu >> more);
        for (int i = 1; i <= more; i++) {
            if ((p[i] & 0xC0) != 0x80) {
                more = -1;
                break;
            }
            cp = cp << 6 | (p[i] & 0x3Fu);
        }
    }
    size_t used = strlen(buf);
    if (used >= len) return;
    if (more < 0) {
        snprintf(buf + used, len - used, "%s byte %d (0x%02X) is not ASCII, nor UTF-8",
                 used && buf[used - 1] == '?' ? " Its" : "; its",
                 (int)(p - (const unsigned char *)word) + 1, *p);
        return;
    }
    /* the characters that pass for ASCII ones in a key or a name */
    static const struct {
        unsigned cp;
        const char *name, *like;
    } alike[] = {
        {0x00A0, "NO-BREAK SPACE", "a space"},
        {0x00AD, "SOFT HYPHEN", "nothing"},
        {0x0131, "LATIN SMALL LETTER DOTLESS I", "'i'"},
        {0x03B1, "GREEK SMALL LETTER ALPHA", "'a'"},
        {0x03B9, "GREEK SMALL LETTER IOTA", "'i'"},
        {0x03BD, "GREEK SMALL LETTER NU", "'v'"},
        {0x03BF, "GREEK SMALL LETTER OMICRON", "'o'"},
        {0x03C1, "GREEK SMALL LETTER RHO", "'p'"},
        {0x0430, "CYRILLIC SMALL LETTER A", "'a'"},
        {0x0435, "CYRILLIC SMALL LETTER IE", "'e'"},
        {0x043E, "CYRILLIC SMALL LETTER O", "'o'"},
        {0x0440, "CYRILLIC SMALL LETTER ER", "'p'"},
        {0x0441, "CYRILLIC SMALL LETTER ES", "'c'"},
        {0x0443, "CYRILLIC SMALL LETTER U", "'y'"},
        {0x0445, "CYRILLIC SMALL LETTER HA", "'x'"},
        {0x0455, "CYRILLIC SMALL LETTER DZE", "'s'"},
        {0x0456, "CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I", "'i'"},
        {0x0458, "CYRILLIC SMALL LETTER JE", "'j'"},
        {0x200B, "ZERO WIDTH SPACE", "nothing"},
        {0x200C, "ZERO WIDTH NON-JOINER", "nothing"},
        {0x200D, "ZERO WIDTH JOINER", "nothing"},
        {0x2010, "HYPHEN", "'-'"},
        {0x2011, "NON-BREAKING HYPHEN", "'-'"},
        {0x2013, "EN DASH", "'-'"},
        {0x2212, "MINUS SIGN", "'-'"},
        {0xFEFF, "ZERO WIDTH NO-BREAK SPACE", "nothing"},
    };
    char name[96] = "";
    for (int i = 0; i < GP_COUNT(alike); i++)
        if (alike[i].cp == cp)
            snprintf(name, sizeof name, " %s (looks like %s)", alike[i].name, alike[i].like);
    if (!name[0] && cp >= 0xFF01 && cp <= 0xFF5E) /* FULLWIDTH ... */
        snprintf(name, sizeof name, " (a fullwidth '%c')", (char)(cp - 0xFF01 + 0x21));
    snprintf(buf + used, len - used, "%s character %d is U+%04X%s, not ASCII",
             used && buf[used - 1] == '?' ? " Its" : "; its", chr, cp, name);
}

void gp_cfg_list_names(const char *const *names, int n, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used + 1 < len; i++) {
        int k = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
        if (k < 0) break;
        used += (size_t)k;
    }
}

/* ---- unknown keys -------------------------------------------------------- */

static bool in_schema(const char *path)
{
    return !strchr(path, '#') && gp_cfg_key_find(path) != NULL;
}

/* The direct children of `sect` in the schema ("" = the top level). */
static int schema_children(const char *sect, const char **out, int cap)
{
    size_t sl = strlen(sect);
    int n = 0;
    const char *schema[MAX_SCHEMA];
    int ns = schema_keys(schema);
    for (int i = 0; i < ns && n < cap; i++) {
        const char *e = schema[i];
        const char *rest;
        if (sl == 0) {
            rest = e;
        } else {
            if (strncmp(e, sect, sl) || e[sl] != '.') continue;
            rest = e + sl + 1;
        }
        if (!strchr(rest, '.')) out[n++] = rest;
    }
    return n;
}

static gp_status unknown_key(const gp_cfg_walk *w, const gp_ynode *key, const char *sect)
{
    const char *k = key->text;
    char where[96], hint[720];
    if (sect[0])
        snprintf(where, sizeof where, "in %s", sect);
    else
        snprintf(where, sizeof where, "at the top level");
    hint[0] = '\0';
    /* 1. the same key elsewhere: a misplaced option */
    size_t sl = strlen(sect);
    const char *same = NULL;
    const char *schema[MAX_SCHEMA];
    int ns = schema_keys(schema);
    for (int i = 0; i < ns; i++) {
        const char *e = schema[i];
        const char *last = strrchr(e, '.');
        last = last ? last + 1 : e;
        if (strcmp(last, k)) continue;
        if (sl && !strncmp(e, sect, sl) && e[sl] == '.') {
            same = e + sl + 1;
            break;
        }
        if (!same) same = e;
    }
    /* common names from other frameworks */
    static const char *const aliases[][2] = {
        {"learning_rate", "train.optimizer.lr"}, {"wd", "train.optimizer.weight_decay"},
        {"micro_batches", "pipeline.chunks"}, {"microbatches", "pipeline.chunks"},
        {"num_microbatches", "pipeline.chunks"}, {"batch", "train.batch_size"},
        {"bs", "train.batch_size"}, {"gpus", "pipeline.devices"},
        {"partition", "pipeline.balance"}, {"lr_schedule", "train.schedule"},
        {"scheduler", "train.schedule"}, {"optim", "train.optimizer"},
    };
    for (int i = 0; !same && i < GP_COUNT(aliases); i++) {
        if (strcmp(aliases[i][0], k)) continue;
        same = aliases[i][1];
        if (sl && !strncmp(same, sect, sl) && same[sl] == '.') same += sl + 1;
    }
    if (same) {
        snprintf(hint, sizeof hint, "; did you mean '%s'?", same);
    } else {
        /* 2. a near miss among the keys allowed here */
        const char *kids[64];
        int nk = schema_children(sect, kids, 64);
        gp_cfg_nearest(k, kids, nk, hint, sizeof hint);
        if (!hint[0] && strlen(k) >= 5) {
            /* 3. a near miss anywhere (a misplaced, misspelt option); not
             * for a short word, which is near too many keys of the schema
             * to mean one ("nope" under train is not pipeline's "mode") */
            const char *lasts[MAX_SCHEMA];
            for (int i = 0; i < ns; i++) {
                const char *last = strrchr(schema[i], '.');
                lasts[i] = last ? last + 1 : schema[i];
            }
            int best = closest(k, lasts, ns);
            if (best >= 0) snprintf(hint, sizeof hint, "; did you mean '%s'?", schema[best]);
        }
        if (!hint[0]) {
            char names[512];
            gp_cfg_list_names(kids, nk, names, sizeof names);
            snprintf(hint, sizeof hint, "; the keys %s are: %s", where, names);
        }
    }
    gp_cfg_non_ascii(k, hint, sizeof hint);
    return gp_cfg_bad(w, key, "unknown key '%.80s' %s%s", k, where, hint);
}

/* A key written as a path ("optimizer.lr: 0.5" under train, Hydra's
 * habit): YAML reads it as one name, which no getter asks for, so it would
 * be ignored; refused with the nested form (or the --set) to write instead. */
static gp_status dotted_key(const gp_cfg_walk *w, const gp_ynode *key, const char *sect)
{
    const char *k = key->text;
    char nested[200];
    size_t used = 0;
    int depth = 0;
    bool index = false; /* a part that is a list index: only --set says that */
    for (const char *p = k; *p && used + 8 < sizeof nested; p++) {
        if (*p == '.') {
            used += (size_t)snprintf(nested + used, sizeof nested - used, ": {");
            depth++;
            index = index || (p[1] >= '0' && p[1] <= '9');
        } else {
            nested[used++] = *p;
        }
    }
    nested[used] = '\0';
    size_t tail = strlen(nested);
    snprintf(nested + tail, sizeof nested - tail, ": ...%.*s", depth, "}}}}}}}}}}}}}}}}");
    const char *where = sect[0] ? "in " : "at the top level", *dot = sect[0] ? "." : "";
    if (index)
        return gp_cfg_bad(w, key, "key '%.80s' %s%s is a path, which YAML reads as one name "
                          "that nothing reads; a list item's key is set on the command line: "
                          "--set %s%s%.80s=...", k, where, sect, sect, dot, k);
    return gp_cfg_bad(w, key, "key '%.80s' %s%s is a path, which YAML reads as one name that "
                      "nothing reads; write it nested, %.120s, or on the command line --set "
                      "%s%s%.80s=...", k, where, sect, nested, sect, dot, k);
}

gp_status gp_cfg_check_keys(const gp_cfg_walk *w, const gp_ynode *m, const char *sect)
{
    if (!m || m->kind != GP_YNODE_MAP) return GP_OK;
    for (int i = 0; i < m->n; i++) {
        if (m->keys[i]->text && strchr(m->keys[i]->text, '.'))
            return dotted_key(w, m->keys[i], sect);
        char path[256];
        gp_cfg_join(path, sizeof path, sect, m->keys[i]->text);
        if (!in_schema(path)) return unknown_key(w, m->keys[i], sect);
    }
    return GP_OK;
}

/* Keys of a map checked against a local list; `what` names the map in the
 * message ("layer 3 (conv2d)"). */
gp_status gp_cfg_check_keys_list(const gp_cfg_walk *w, const gp_ynode *m, const char *what,
                                 const char *const *keys, int n)
{
    if (!m || m->kind != GP_YNODE_MAP) return GP_OK;
    for (int i = 0; i < m->n; i++) {
        const char *k = m->keys[i]->text;
        bool ok = false;
        for (int j = 0; j < n && !ok; j++) ok = !strcmp(k, keys[j]);
        if (ok) continue;
        char hint[160], names[512];
        gp_cfg_nearest(k, keys, n, hint, sizeof hint);
        gp_cfg_non_ascii(k, hint, sizeof hint);
        gp_cfg_list_names(keys, n, names, sizeof names);
        return gp_cfg_bad(w, m->keys[i], "unknown option '%.80s' for %s%s (it takes: %s)", k, what,
                          hint, names);
    }
    return GP_OK;
}

/* ---- typed getters -------------------------------------------------------- */

/* A scalar strtoll and friends may read whole: not empty, no leading blank
 * (which they would skip). */
static bool number_text(const gp_ynode *n)
{
    return n->kind == GP_YNODE_SCALAR && n->text[0] && n->text[0] != ' ';
}

static gp_status out_of_range(const gp_cfg_walk *w, const gp_ynode *n, const char *name)
{
    char got[96];
    return gp_cfg_bad(w, n, "%s is out of range, got %s", name,
                      gp_cfg_describe(n, got, sizeof got));
}

/* An integer scalar; past 64 bits, *overflow (when given) is set and *out
 * is the nearer end, else it is the "out of range" error. */
static gp_status parse_ll(const gp_cfg_walk *w, const gp_ynode *n, const char *name,
                          int64_t *out, bool *overflow)
{
    if (!number_text(n)) return gp_cfg_expected(w, n, "an integer", name);
    errno = 0;
    char *end;
    long long v = strtoll(n->text, &end, 10);
    if (*end != '\0') return gp_cfg_expected(w, n, "an integer", name);
    if (errno == ERANGE && !overflow) return out_of_range(w, n, name);
    if (overflow) *overflow = errno == ERANGE;
    *out = (int64_t)v;
    return GP_OK;
}

gp_status gp_cfg_parse_int(const gp_cfg_walk *w, const gp_ynode *n, const char *name, int64_t *out)
{
    return parse_ll(w, n, name, out, NULL);
}

gp_status gp_cfg_get_int(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                         int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    char name[256];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_INT, (double)def, NULL, (double)lo, (double)hi, 0, NULL, 0);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (gp_cfg_absent(n)) {
        *out = def;
        gp_cfg_note(w, "%s = %lld (default)", name, (long long)def);
        return GP_OK;
    }
    int64_t v = 0;
    bool overflow = false;
    GP_TRY(parse_ll(w, n, name, &v, &overflow));
    if (overflow) /* past 64 bits: the range, as for any value outside it */
        return gp_cfg_bad(w, n, "%s must be %s %lld, got %.40s", name, v > 0 ? "<=" : ">=",
                          (long long)(v > 0 ? hi : lo), n->text);
    if (v < lo) return gp_cfg_bad(w, n, "%s must be >= %lld, got %lld", name, (long long)lo,
                                  (long long)v);
    if (v > hi) return gp_cfg_bad(w, n, "%s must be <= %lld, got %lld", name, (long long)hi,
                                  (long long)v);
    *out = v;
    return GP_OK;
}

gp_status gp_cfg_get_int32(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                           int def, int lo, int hi, int *out)
{
    int64_t v;
    GP_TRY(gp_cfg_get_int(w, m, sect, key, def, lo, hi, &v));
    *out = (int)v;
    return GP_OK;
}

gp_status gp_cfg_get_u64(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                         uint64_t def, uint64_t *out)
{
    char name[256];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_INT, (double)def, NULL, 0, (double)UINT64_MAX, 0, NULL, 0);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (gp_cfg_absent(n)) {
        *out = def;
        gp_cfg_note(w, "%s = %llu (default)", name, (unsigned long long)def);
        return GP_OK;
    }
    /* strtoull would take "-1" as 2^64 - 1 */
    if (!number_text(n) || strchr(n->text, '-'))
        return gp_cfg_expected(w, n, "a non-negative integer", name);
    errno = 0;
    char *end;
    unsigned long long v = strtoull(n->text, &end, 10);
    if (*end != '\0') return gp_cfg_expected(w, n, "a non-negative integer", name);
    if (errno == ERANGE) return out_of_range(w, n, name);
    *out = (uint64_t)v;
    return GP_OK;
}

gp_status gp_cfg_parse_float(const gp_cfg_walk *w, const gp_ynode *n, const char *name, double *out)
{
    if (!number_text(n)) return gp_cfg_expected(w, n, "a number", name);
    char *end;
    double v = strtod(n->text, &end);
    if (*end != '\0') return gp_cfg_expected(w, n, "a number", name);
    /* written as digits (1e300): too large; else inf, .inf, nan */
    bool digits = isdigit((unsigned char)n->text[strspn(n->text, "+-.")]);
    if (!isfinite(v) && !digits) return gp_cfg_expected(w, n, "a finite number", name);
    if (!isfinite(v) || fabs(v) > FLT_MAX)
        return gp_cfg_bad(w, n, "%s is %s, beyond the 32-bit float gpipe keeps it in (at most "
                          "3.4e38 in size); give a smaller value", name, n->text);
    *out = v;
    return GP_OK;
}

/* Check lo <= v <= hi (or strict, per flags); hi = INFINITY for one-sided. */
gp_status gp_cfg_check_range(const gp_cfg_walk *w, const gp_ynode *n, const char *name, double v,
                             double lo, double hi, int flags)
{
    bool lo_bad = (flags & GP_CFG_LO_OPEN) ? !(v > lo) : !(v >= lo);
    bool hi_bad = (flags & GP_CFG_HI_OPEN) ? !(v < hi) : !(v <= hi);
    if (!lo_bad && !hi_bad) return GP_OK;
    if (isinf(hi))
        return gp_cfg_bad(w, n, "%s must be %s %g, got %g", name,
                          (flags & GP_CFG_LO_OPEN) ? ">" : ">=", lo, v);
    return gp_cfg_bad(w, n, "%s must be in %c%g, %g%c, got %g", name,
                      (flags & GP_CFG_LO_OPEN) ? '(' : '[', lo, hi,
                      (flags & GP_CFG_HI_OPEN) ? ')' : ']', v);
}

gp_status gp_cfg_to_float(const gp_cfg_walk *w, const gp_ynode *n, const char *name, double v,
                          double lo, double hi, int flags, float *out)
{
    GP_TRY(gp_cfg_check_range(w, n, name, v, lo, hi, flags));
    /* the value as it is kept, not only as written: eps 1e-50 or a beta
     * of 0.99999999 would pass in double and become 0 or 1 */
    float f = (float)v;
    if (v != 0 && fabsf(f) < FLT_MIN) /* 0, or subnormal: a few bits of precision */
        return gp_cfg_bad(w, n, "%s is %g, below the smallest normal value of the 32-bit float "
                          "gpipe keeps it in (1.2e-38); give %sa value of at least 1.2e-38",
                          name, v, lo == 0 && !(flags & GP_CFG_LO_OPEN) ? "0 or " : "");
    if (gp_cfg_check_range(w, n, name, f, lo, hi, flags) != GP_OK)
        return gp_cfg_bad(w, n, "%s is %.9g, which rounds to %.9g in the 32-bit float gpipe "
                          "keeps it in, outside its range; give a value further inside it",
                          name, v, (double)f);
    *out = f;
    return GP_OK;
}

gp_status gp_cfg_get_double(gp_cfg_walk *w, const gp_ynode *m, const char *sect,
                            const char *key, double def, double lo, double hi, int flags,
                            double *out)
{
    char name[256];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_NUM, def, NULL, lo, hi, flags, NULL, 0);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (gp_cfg_absent(n)) {
        *out = def;
        gp_cfg_note(w, "%s = %g (default)", name, def);
        return GP_OK;
    }
    double v;
    float f;
    GP_TRY(gp_cfg_parse_float(w, n, name, &v));
    GP_TRY(gp_cfg_to_float(w, n, name, v, lo, hi, flags, &f)); /* (what the kernels get) */
    *out = v;
    return GP_OK;
}

gp_status gp_cfg_get_float(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                           float def, double lo, double hi, int flags, float *out)
{
    /* (gp_cfg_get_double checks the value as this float; it is that value) */
    double v;
    GP_TRY(gp_cfg_get_double(w, m, sect, key, def, lo, hi, flags, &v));
    *out = (float)v;
    return GP_OK;
}

gp_status gp_cfg_get_bool(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                          bool def, bool *out)
{
    char name[256];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_BOOL, 0, def ? "true" : "false", 0, 0, 0, NULL, 0);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (gp_cfg_absent(n)) {
        *out = def;
        gp_cfg_note(w, "%s = %s (default)", name, def ? "true" : "false");
        return GP_OK;
    }
    if (n->kind == GP_YNODE_SCALAR) {
        static const char *const yes[] = {"true", "yes", "on"};
        static const char *const no[] = {"false", "no", "off"};
        for (int i = 0; i < 3; i++) {
            if (!strcasecmp(n->text, yes[i])) {
                *out = true;
                return GP_OK;
            }
            if (!strcasecmp(n->text, no[i])) {
                *out = false;
                return GP_OK;
            }
        }
    }
    return gp_cfg_expected(w, n, "true or false", name);
}

gp_status gp_cfg_get_str(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                         const char *def, char *buf, size_t cap)
{
    char name[256];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_STR, 0, def, 0, 0, 0, NULL, 0);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (gp_cfg_absent(n)) {
        snprintf(buf, cap, "%s", def);
        if (def[0]) gp_cfg_note(w, "%s = %s (default)", name, def);
        return GP_OK;
    }
    if (n->kind != GP_YNODE_SCALAR)
        return gp_cfg_expected(w, n, "a string", name);
    size_t len = strlen(n->text);
    if (len >= cap)
        return gp_cfg_bad(w, n, "%s is too long (%zu characters; at most %zu)", name, len, cap - 1);
    memcpy(buf, n->text, len + 1);
    return GP_OK;
}

/* An enum value from names[0..n); reports the allowed ones. */
gp_status gp_cfg_parse_enum(const gp_cfg_walk *w, const gp_ynode *n, const char *name,
                            const char *const *names, int count, int *out)
{
    char got[96];
    if (n->kind == GP_YNODE_SCALAR) {
        for (int i = 0; i < count; i++) {
            if (!strcmp(n->text, names[i])) {
                *out = i;
                return GP_OK;
            }
        }
    }
    char list[512], hint[160] = "";
    gp_cfg_list_names(names, count, list, sizeof list);
    if (n->kind == GP_YNODE_SCALAR) {
        gp_cfg_nearest(n->text, names, count, hint, sizeof hint);
        gp_cfg_non_ascii(n->text, hint, sizeof hint);
    }
    if (n->kind != GP_YNODE_SCALAR)
        return gp_cfg_bad(w, n, "expected one of %s for %s, got %s", list, name,
                          gp_cfg_describe(n, got, sizeof got));
    return gp_cfg_bad(w, n, "unknown value %s for %s (allowed: %s)%s",
                      gp_cfg_describe(n, got, sizeof got), name, list, hint);
}

gp_status gp_cfg_get_enum(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                          const char *const *names, int count, int def, int *out)
{
    char name[256];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_ENUM, 0, names[def], 0, 0, 0, names, count);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (gp_cfg_absent(n)) {
        *out = def;
        gp_cfg_note(w, "%s = %s (default)", name, names[def]);
        return GP_OK;
    }
    return gp_cfg_parse_enum(w, n, name, names, count, out);
}

/* Sizes must stay below 2^63 bytes (8 EiB), so that a byte count fits an
 * int64_t wherever it is added or compared. */
#define GP_CFG_MAX_BYTES 9223372036854775808.0

/* "512MiB", "1.5GB", "64 k", "4096": a decimal number (no sign, no hex, no
 * inf or nan), optional blanks, an optional unit B, K, M, G, T, P or E
 * (binary multiples, with or without 'i' and a trailing 'B'); blanks
 * around it.  *bytes is
 * the exact product, unbounded: the caller checks the range. */
static bool size_text(const char *s, double *bytes)
{
    while (*s == ' ') s++;
    if (!((*s >= '0' && *s <= '9') || *s == '.')) return false;
    char *end;
    double v = strtod(s, &end);
    for (const char *q = s; q < end; q++)
        if (!strchr("0123456789.eE+-", *q)) return false; /* hex floats */
    if (end == s || !isfinite(v)) return false;
    while (*end == ' ') end++;
    static const char units[] = "KMGTPE";
    const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    double mul = 1;
    if (u) {
        for (const char *q = units; q <= u; q++) mul *= 1024.0;
        end++;
        if (*end == 'i') end++;
        if (toupper((unsigned char)*end) == 'B') end++;
    } else if (toupper((unsigned char)*end) == 'B') {
        end++;
    }
    while (*end == ' ') end++;
    if (*end) return false;
    *bytes = v * mul;
    return true;
}

gp_status gp_cfg_parse_bytes(const gp_cfg_walk *w, const gp_ynode *n, const char *name, size_t *out)
{
    double bytes = 0;
    const char *t = n->kind == GP_YNODE_SCALAR ? n->text + strspn(n->text, " ") : "";
    if (t[0] == '-' && size_text(t + 1, &bytes))
        return gp_cfg_bad(w, n, "%s is negative (%s); give a size like 512MiB, or leave the key "
                          "out for no limit", name, n->text);
    if (n->kind != GP_YNODE_SCALAR || !size_text(n->text, &bytes))
        return gp_cfg_expected(w, n, "a size like 512MiB, 1.5GB or a number of bytes", name);
    if (bytes < 1)
        return gp_cfg_bad(w, n, "%s is %g bytes; give at least 1 byte, e.g. 512MiB, or leave "
                          "the key out for no limit", name, bytes);
    /* A plain count of bytes is read exactly: a double rounds 2^63 - 1 up
     * to 2^63, which would refuse the largest size there is. */
    size_t digits = strspn(t, "0123456789"), tail = digits + strspn(t + digits, " ");
    if (digits > 0 && digits <= 19 && !t[tail]) {
        errno = 0;
        unsigned long long exact = strtoull(t, NULL, 10);
        if (errno == 0 && exact <= (unsigned long long)INT64_MAX) {
            *out = (size_t)exact;
            return GP_OK;
        }
    }
    if (!(bytes < GP_CFG_MAX_BYTES))
        return gp_cfg_bad(w, n, "%s is too large: %s is %.4g bytes, and sizes must be below "
                          "8EiB (2^63 bytes)", name, n->text, bytes);
    *out = (size_t)bytes;
    return GP_OK;
}

gp_status gp_cfg_get_bytes(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                           size_t *out)
{
    char name[256];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_SIZE, 0, NULL, 0, 0, 0, NULL, 0);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (gp_cfg_absent(n)) {
        *out = 0;
        gp_cfg_note(w, "%s = unlimited (default)", name);
        return GP_OK;
    }
    return gp_cfg_parse_bytes(w, n, name, out);
}

/* A sub-map: NULL if absent or null; an error if not a map. */
gp_status gp_cfg_get_map(const gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                         const char *example, const gp_ynode **out)
{
    char name[256], got[96];
    gp_cfg_join(name, sizeof name, sect, key);
    gp_cfg_key_agrees(name, GP_CFG_MAP, 0, NULL, 0, 0, 0, NULL, 0);
    const gp_ynode *n = gp_ymap_get(m, key);
    *out = NULL;
    if (gp_cfg_absent(n)) return GP_OK;
    if (n->kind != GP_YNODE_MAP)
        return gp_cfg_bad(w, n, "expected a map for %s, like %s, got %s", name, example,
                          gp_cfg_describe(n, got, sizeof got));
    *out = n;
    return GP_OK;
}
