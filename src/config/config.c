/*
 * config.c — the YAML tree (config_impl.h) walked into the structs of
 * config.h, with validation, defaults and messages that point at the file.
 *
 * Every section first checks its keys against one schema table (k_schema),
 * so an unknown key is an error with the best hint we can find: the same
 * key elsewhere in the schema ("did you mean 'optimizer.lr'?"), else the
 * nearest known key by edit distance, else the list of keys allowed there.
 * Then each option is read by a typed getter that knows its default and
 * range and, for top-level options, records "x.y = v (default)" in
 * cfg->defaults_applied when the key is absent (darknet's lesson: say what
 * you assumed).  Cross-field checks run last.
 *
 * A YAML null (`key:` with nothing, or `~`) means "not given": the default
 * applies, and for maps (layer options, sections) it is an empty map.
 *
 * Memory: the tree is freed before returning; on error *out is left zeroed
 * (gp_config_free on it is a no-op).
 */
#include "config/config.h"
#include "config/config_impl.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Every key a config may contain, as a dotted path.  Layer options and the
 * keys of a device map are checked against their own lists below. */
static const char *const k_schema[] = {
    "model", "pipeline", "data", "train",
    "model.input", "model.layers", "model.loss", "model.init_from",
    "pipeline.devices", "pipeline.balance", "pipeline.chunks", "pipeline.checkpoint",
    "pipeline.lockstep", "pipeline.threads", "pipeline.memory", "pipeline.replicas",
    "data.dataset", "data.path", "data.shuffle", "data.normalize", "data.mean",
    "data.std", "data.augment", "data.augment.crop_padding", "data.augment.hflip",
    "data.prefetch", "data.train_limit", "data.test_limit", "data.synthetic",
    "data.synthetic.train", "data.synthetic.test", "data.synthetic.classes",
    "data.synthetic.shape",
    "train.epochs", "train.steps", "train.batch_size", "train.seed", "train.optimizer",
    "train.optimizer.type", "train.optimizer.lr", "train.optimizer.momentum",
    "train.optimizer.nesterov", "train.optimizer.weight_decay",
    "train.optimizer.decay_bias_and_norm", "train.schedule", "train.schedule.type",
    "train.schedule.warmup_steps", "train.schedule.warmup_start",
    "train.schedule.step_size", "train.schedule.gamma", "train.schedule.min_lr",
    "train.lr_scaling", "train.base_batch", "train.log_every", "train.eval_each_epoch",
    "train.eval_batch_size", "train.snapshot", "train.snapshot.every_steps",
    "train.snapshot.every_minutes", "train.snapshot.keep", "train.snapshot.dir",
};
#define N_SCHEMA ((int)(sizeof k_schema / sizeof k_schema[0]))

static const char *const k_dataset_names[] = {"synthetic", "mnist", "fashion-mnist",
                                              "cifar10"};
static const char *const k_ckpt_names[] = {"always", "except_last", "never"};
static const char *const k_sched_names[] = {"constant", "step", "cosine"};
static const char *const k_scaling_names[] = {"none", "linear"};
static const char *const k_optim_names[] = {"sgd"};
static const char *const k_loss_names[] = {"cross_entropy"};
static const char *const k_device_keys[] = {"name", "memory", "threads"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

const char *gp_checkpoint_mode_name(gp_checkpoint_mode m)
{
    return (unsigned)m < (unsigned)COUNT(k_ckpt_names) ? k_ckpt_names[m] : "?";
}

const char *gp_dataset_name(gp_dataset_kind k)
{
    return (unsigned)k < (unsigned)COUNT(k_dataset_names) ? k_dataset_names[k] : "?";
}

/* ---- the walk: messages, defaults -------------------------------------- */

typedef struct walk {
    const char *file;   /* name used in messages */
    char *defaults;     /* "x = v (default)\n" lines (owned until handed out) */
    size_t dlen, dcap;
    bool record;        /* record defaults (off inside layers and devices) */
} walk;

static gp_status bad(const walk *w, const gp_ynode *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static gp_status bad(const walk *w, const gp_ynode *n, const char *fmt, ...)
{
    char loc[640], msg[1280];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gp_error_set(GP_ERR_INVALID, "%s: %s", gp_yloc(w->file, n, loc, sizeof loc), msg);
}

static void note(walk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(walk *w, const char *fmt, ...)
{
    if (!w->record) return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    size_t len = strlen(line);
    if (w->dlen + len + 2 > w->dcap) {
        size_t cap = w->dcap ? w->dcap * 2 : 1024;
        while (cap < w->dlen + len + 2) cap *= 2;
        char *d = realloc(w->defaults, cap);
        if (!d) return; /* the list is informational; losing it is harmless */
        w->defaults = d;
        w->dcap = cap;
    }
    memcpy(w->defaults + w->dlen, line, len);
    w->dlen += len;
    w->defaults[w->dlen++] = '\n';
    w->defaults[w->dlen] = '\0';
}

/* "'abc'", "a list", "a map" or "nothing", for "got ..." */
static const char *describe(const gp_ynode *n, char *buf, size_t len)
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

static void join(char *buf, size_t len, const char *sect, const char *key)
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
static void nearest(const char *word, const char *const *names, int n, char *buf,
                    size_t len)
{
    size_t wl = strlen(word);
    int best = closest(word, names, n);
    buf[0] = '\0';
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

static void list_names(const char *const *names, int n, char *buf, size_t len)
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
    for (int i = 0; i < N_SCHEMA; i++)
        if (!strcmp(k_schema[i], path)) return true;
    return false;
}

/* The direct children of `sect` in the schema ("" = the top level). */
static int schema_children(const char *sect, const char **out, int cap)
{
    size_t sl = strlen(sect);
    int n = 0;
    for (int i = 0; i < N_SCHEMA && n < cap; i++) {
        const char *e = k_schema[i];
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

static gp_status unknown_key(const walk *w, const gp_ynode *key, const char *sect)
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
    for (int i = 0; i < N_SCHEMA; i++) {
        const char *e = k_schema[i];
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
    for (int i = 0; !same && i < COUNT(aliases); i++) {
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
        nearest(k, kids, nk, hint, sizeof hint);
        if (!hint[0]) {
            /* 3. a near miss anywhere (a misplaced, misspelt option) */
            const char *lasts[N_SCHEMA];
            for (int i = 0; i < N_SCHEMA; i++) {
                const char *last = strrchr(k_schema[i], '.');
                lasts[i] = last ? last + 1 : k_schema[i];
            }
            int best = closest(k, lasts, N_SCHEMA);
            if (best >= 0) snprintf(hint, sizeof hint, "; did you mean '%s'?", k_schema[best]);
        }
        if (!hint[0]) {
            char names[512];
            list_names(kids, nk, names, sizeof names);
            snprintf(hint, sizeof hint, "; the keys %s are: %s", where, names);
        }
    }
    return bad(w, key, "unknown key '%.80s' %s%s", k, where, hint);
}

static gp_status check_keys(const walk *w, const gp_ynode *m, const char *sect)
{
    if (!m || m->kind != GP_YNODE_MAP) return GP_OK;
    for (int i = 0; i < m->n; i++) {
        char path[256];
        join(path, sizeof path, sect, m->keys[i]->text);
        if (!in_schema(path)) return unknown_key(w, m->keys[i], sect);
    }
    return GP_OK;
}

/* Keys of a map checked against a local list; `what` names the map in the
 * message ("layer 3 (conv2d)"). */
static gp_status check_keys_list(const walk *w, const gp_ynode *m, const char *what,
                                 const char *const *keys, int n)
{
    if (!m || m->kind != GP_YNODE_MAP) return GP_OK;
    for (int i = 0; i < m->n; i++) {
        const char *k = m->keys[i]->text;
        bool ok = false;
        for (int j = 0; j < n && !ok; j++) ok = !strcmp(k, keys[j]);
        if (ok) continue;
        char hint[160], names[512];
        nearest(k, keys, n, hint, sizeof hint);
        list_names(keys, n, names, sizeof names);
        return bad(w, m->keys[i], "unknown option '%.80s' for %s%s (it takes: %s)", k, what,
                   hint, names);
    }
    return GP_OK;
}

/* ---- typed getters -------------------------------------------------------- */

static bool absent(const gp_ynode *n) { return !n || n->kind == GP_YNODE_NULL; }

static gp_status parse_int(const walk *w, const gp_ynode *n, const char *name, int64_t *out)
{
    char got[96];
    if (n->kind != GP_YNODE_SCALAR || !n->text[0] || n->text[0] == ' ')
        return bad(w, n, "expected an integer for %s, got %s", name,
                   describe(n, got, sizeof got));
    errno = 0;
    char *end;
    long long v = strtoll(n->text, &end, 10);
    if (*end != '\0')
        return bad(w, n, "expected an integer for %s, got %s", name,
                   describe(n, got, sizeof got));
    if (errno == ERANGE)
        return bad(w, n, "%s is out of range, got %s", name, describe(n, got, sizeof got));
    *out = (int64_t)v;
    return GP_OK;
}

static gp_status get_int(walk *w, const gp_ynode *m, const char *sect, const char *key,
                         int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    char name[256];
    join(name, sizeof name, sect, key);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (absent(n)) {
        *out = def;
        note(w, "%s = %lld (default)", name, (long long)def);
        return GP_OK;
    }
    int64_t v;
    GP_TRY(parse_int(w, n, name, &v));
    if (v < lo) return bad(w, n, "%s must be >= %lld, got %lld", name, (long long)lo, (long long)v);
    if (v > hi) return bad(w, n, "%s must be <= %lld, got %lld", name, (long long)hi, (long long)v);
    *out = v;
    return GP_OK;
}

static gp_status get_int32(walk *w, const gp_ynode *m, const char *sect, const char *key,
                           int def, int lo, int hi, int *out)
{
    int64_t v;
    GP_TRY(get_int(w, m, sect, key, def, lo, hi, &v));
    *out = (int)v;
    return GP_OK;
}

static gp_status get_u64(walk *w, const gp_ynode *m, const char *sect, const char *key,
                         uint64_t def, uint64_t *out)
{
    char name[256], got[96];
    join(name, sizeof name, sect, key);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (absent(n)) {
        *out = def;
        note(w, "%s = %llu (default)", name, (unsigned long long)def);
        return GP_OK;
    }
    if (n->kind != GP_YNODE_SCALAR || !n->text[0] || strchr(n->text, '-') ||
        n->text[0] == ' ')
        return bad(w, n, "expected a non-negative integer for %s, got %s", name,
                   describe(n, got, sizeof got));
    errno = 0;
    char *end;
    unsigned long long v = strtoull(n->text, &end, 10);
    if (*end != '\0')
        return bad(w, n, "expected a non-negative integer for %s, got %s", name,
                   describe(n, got, sizeof got));
    if (errno == ERANGE)
        return bad(w, n, "%s is out of range, got %s", name, describe(n, got, sizeof got));
    *out = (uint64_t)v;
    return GP_OK;
}

enum { LO_OPEN = 1, HI_OPEN = 2 };

static gp_status parse_float(const walk *w, const gp_ynode *n, const char *name, double *out)
{
    char got[96];
    if (n->kind != GP_YNODE_SCALAR || !n->text[0] || n->text[0] == ' ')
        return bad(w, n, "expected a number for %s, got %s", name,
                   describe(n, got, sizeof got));
    char *end;
    double v = strtod(n->text, &end);
    if (*end != '\0')
        return bad(w, n, "expected a number for %s, got %s", name,
                   describe(n, got, sizeof got));
    if (!isfinite(v) || fabs(v) > FLT_MAX)
        return bad(w, n, "expected a finite number for %s, got %s", name,
                   describe(n, got, sizeof got));
    *out = v;
    return GP_OK;
}

/* Check lo <= v <= hi (or strict, per flags); hi = INFINITY for one-sided. */
static gp_status check_range(const walk *w, const gp_ynode *n, const char *name, double v,
                             double lo, double hi, int flags)
{
    bool lo_bad = (flags & LO_OPEN) ? !(v > lo) : !(v >= lo);
    bool hi_bad = (flags & HI_OPEN) ? !(v < hi) : !(v <= hi);
    if (!lo_bad && !hi_bad) return GP_OK;
    if (isinf(hi))
        return bad(w, n, "%s must be %s %g, got %g", name, (flags & LO_OPEN) ? ">" : ">=",
                   lo, v);
    return bad(w, n, "%s must be in %c%g, %g%c, got %g", name, (flags & LO_OPEN) ? '(' : '[',
               lo, hi, (flags & HI_OPEN) ? ')' : ']', v);
}

static gp_status get_float(walk *w, const gp_ynode *m, const char *sect, const char *key,
                           float def, double lo, double hi, int flags, float *out)
{
    char name[256];
    join(name, sizeof name, sect, key);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (absent(n)) {
        *out = def;
        note(w, "%s = %g (default)", name, (double)def);
        return GP_OK;
    }
    double v;
    GP_TRY(parse_float(w, n, name, &v));
    GP_TRY(check_range(w, n, name, v, lo, hi, flags));
    *out = (float)v;
    return GP_OK;
}

static gp_status get_bool(walk *w, const gp_ynode *m, const char *sect, const char *key,
                          bool def, bool *out)
{
    char name[256], got[96];
    join(name, sizeof name, sect, key);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (absent(n)) {
        *out = def;
        note(w, "%s = %s (default)", name, def ? "true" : "false");
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
    return bad(w, n, "expected true or false for %s, got %s", name,
               describe(n, got, sizeof got));
}

static gp_status get_str(walk *w, const gp_ynode *m, const char *sect, const char *key,
                         const char *def, char *buf, size_t cap)
{
    char name[256], got[96];
    join(name, sizeof name, sect, key);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (absent(n)) {
        snprintf(buf, cap, "%s", def);
        if (def[0]) note(w, "%s = %s (default)", name, def);
        return GP_OK;
    }
    if (n->kind != GP_YNODE_SCALAR)
        return bad(w, n, "expected a string for %s, got %s", name, describe(n, got, sizeof got));
    size_t len = strlen(n->text);
    if (len >= cap)
        return bad(w, n, "%s is too long (%zu characters; at most %zu)", name, len, cap - 1);
    memcpy(buf, n->text, len + 1);
    return GP_OK;
}

/* An enum value from names[0..n); reports the allowed ones. */
static gp_status parse_enum(const walk *w, const gp_ynode *n, const char *name,
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
    char list[256], hint[160] = "";
    list_names(names, count, list, sizeof list);
    if (n->kind == GP_YNODE_SCALAR) nearest(n->text, names, count, hint, sizeof hint);
    if (n->kind != GP_YNODE_SCALAR)
        return bad(w, n, "expected one of %s for %s, got %s", list, name,
                   describe(n, got, sizeof got));
    return bad(w, n, "unknown value %s for %s (allowed: %s)%s", describe(n, got, sizeof got),
               name, list, hint);
}

static gp_status get_enum(walk *w, const gp_ynode *m, const char *sect, const char *key,
                          const char *const *names, int count, int def, int *out)
{
    char name[256];
    join(name, sizeof name, sect, key);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (absent(n)) {
        *out = def;
        note(w, "%s = %s (default)", name, names[def]);
        return GP_OK;
    }
    return parse_enum(w, n, name, names, count, out);
}

static gp_status parse_bytes(const walk *w, const gp_ynode *n, const char *name, size_t *out)
{
    char got[96];
    if (n->kind != GP_YNODE_SCALAR || !gp_parse_bytes(n->text, out))
        return bad(w, n, "expected a size like 512MiB, 1.5GB or a number of bytes for %s, "
                   "got %s", name, describe(n, got, sizeof got));
    return GP_OK;
}

static gp_status get_bytes(walk *w, const gp_ynode *m, const char *sect, const char *key,
                           size_t *out)
{
    char name[256];
    join(name, sizeof name, sect, key);
    const gp_ynode *n = gp_ymap_get(m, key);
    if (absent(n)) {
        *out = 0;
        note(w, "%s = unlimited (default)", name);
        return GP_OK;
    }
    return parse_bytes(w, n, name, out);
}

/* A sub-map: NULL if absent or null; an error if not a map. */
static gp_status get_map(const walk *w, const gp_ynode *m, const char *sect, const char *key,
                         const char *example, const gp_ynode **out)
{
    char name[256], got[96];
    join(name, sizeof name, sect, key);
    const gp_ynode *n = gp_ymap_get(m, key);
    *out = NULL;
    if (absent(n)) return GP_OK;
    if (n->kind != GP_YNODE_MAP)
        return bad(w, n, "expected a map for %s, like %s, got %s", name, example,
                   describe(n, got, sizeof got));
    *out = n;
    return GP_OK;
}

/* ---- model ---------------------------------------------------------------- */

/* Option keys each layer type takes (besides `name`). */
static int layer_keys(gp_layer_type t, const char **keys)
{
    int n = 0;
    switch (t) {
    case GP_LAYER_LINEAR:
        keys[n++] = "in"; keys[n++] = "out"; keys[n++] = "bias";
        break;
    case GP_LAYER_CONV2D:
        keys[n++] = "in"; keys[n++] = "out"; keys[n++] = "kernel";
        keys[n++] = "stride"; keys[n++] = "padding"; keys[n++] = "bias";
        break;
    case GP_LAYER_BATCHNORM:
        keys[n++] = "momentum"; keys[n++] = "eps"; keys[n++] = "sync";
        break;
    case GP_LAYER_MAXPOOL2D:
    case GP_LAYER_AVGPOOL2D:
        keys[n++] = "kernel"; keys[n++] = "stride"; keys[n++] = "padding";
        break;
    case GP_LAYER_DROPOUT:
        keys[n++] = "p";
        break;
    case GP_LAYER_RESIDUAL: /* momentum, eps, sync: of its batch norms */
        keys[n++] = "out"; keys[n++] = "stride";
        keys[n++] = "momentum"; keys[n++] = "eps"; keys[n++] = "sync";
        break;
    default:
        break;
    }
    keys[n++] = "name";
    return n;
}

static bool has_key(const char *const *keys, int n, const char *k)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(keys[i], k)) return true;
    return false;
}

static gp_status parse_layer(walk *w, const gp_ynode *item, int index, gp_layer_spec *spec)
{
    char got[96];
    const gp_ynode *tnode = NULL, *opts = NULL;
    if (item->kind == GP_YNODE_SCALAR) {
        tnode = item;
    } else if (item->kind == GP_YNODE_MAP && item->n == 1) {
        tnode = item->keys[0];
        opts = item->items[0];
    } else if (item->kind == GP_YNODE_MAP && item->n == 0) {
        return bad(w, item, "layer %d is an empty map; write its type, like `- relu` or "
                   "`- linear: {out: 10}`", index);
    } else if (item->kind == GP_YNODE_MAP) {
        return bad(w, item, "layer %d has %d keys ('%.40s', '%.40s'%s); a layer is one key, "
                   "its type, with its options as a map under it, like "
                   "`- conv2d: {out: 32, kernel: 3}` (indent the options under the type)",
                   index, item->n, item->keys[0]->text, item->keys[1]->text,
                   item->n > 2 ? ", ..." : "");
    } else {
        return bad(w, item, "expected a layer type or {type: {options}} for model.layers.%d, "
                   "got %s", index, describe(item, got, sizeof got));
    }
    gp_layer_type t;
    if (!gp_layer_type_parse(tnode->text, &t)) {
        const char *names[GP_LAYER_TYPE_COUNT];
        for (int i = 0; i < GP_LAYER_TYPE_COUNT; i++)
            names[i] = gp_layer_type_name((gp_layer_type)i);
        char hint[160], list[512];
        nearest(tnode->text, names, GP_LAYER_TYPE_COUNT, hint, sizeof hint);
        list_names(names, GP_LAYER_TYPE_COUNT, list, sizeof list);
        return bad(w, tnode, "unknown layer type %s%s (layer types: %s)",
                   describe(tnode, got, sizeof got), hint, list);
    }
    *spec = gp_layer_spec_default(t);
    if (!tnode->set) { /* a layer made by an override has no place in a file */
        spec->line = tnode->line;
        spec->column = tnode->column;
        snprintf(spec->file, sizeof spec->file, "%s", w->file);
    }
    const char *tname = gp_layer_type_name(t);
    const char *keys[8];
    int nk = layer_keys(t, keys);
    if (absent(opts)) opts = NULL;
    if (opts && opts->kind != GP_YNODE_MAP)
        return bad(w, opts, "options of layer %d (%s) must be a map, like {%s: ...}, got %s",
                   index, tname, keys[0], describe(opts, got, sizeof got));
    char what[96], sect[64];
    snprintf(what, sizeof what, "layer %d (%s)", index, tname);
    snprintf(sect, sizeof sect, "model.layers.%d", index);
    GP_TRY(check_keys_list(w, opts, what, keys, nk));

    const int64_t big = (int64_t)1 << 31;
    if (has_key(keys, nk, "in")) GP_TRY(get_int(w, opts, sect, "in", spec->in, 0, big, &spec->in));
    if (has_key(keys, nk, "out"))
        GP_TRY(get_int(w, opts, sect, "out", spec->out, 1, big, &spec->out));
    if (has_key(keys, nk, "kernel"))
        GP_TRY(get_int(w, opts, sect, "kernel", spec->kernel, 1, 1 << 16, &spec->kernel));
    if (has_key(keys, nk, "stride"))
        GP_TRY(get_int(w, opts, sect, "stride", spec->stride, 1, 1 << 16, &spec->stride));
    if (has_key(keys, nk, "padding"))
        GP_TRY(get_int(w, opts, sect, "padding", spec->padding, 0, 1 << 16, &spec->padding));
    if (has_key(keys, nk, "bias")) GP_TRY(get_bool(w, opts, sect, "bias", spec->bias, &spec->bias));
    if (has_key(keys, nk, "momentum"))
        GP_TRY(get_float(w, opts, sect, "momentum", spec->momentum, 0, 1, 0, &spec->momentum));
    if (has_key(keys, nk, "eps"))
        GP_TRY(get_float(w, opts, sect, "eps", spec->eps, 0, INFINITY, LO_OPEN, &spec->eps));
    if (has_key(keys, nk, "sync")) GP_TRY(get_bool(w, opts, sect, "sync", spec->sync, &spec->sync));
    if (has_key(keys, nk, "p"))
        GP_TRY(get_float(w, opts, sect, "p", spec->p, 0, 1, HI_OPEN, &spec->p));
    GP_TRY(get_str(w, opts, sect, "name", "", spec->name, sizeof spec->name));

    if (has_key(keys, nk, "out") && spec->out < 1)
        return bad(w, tnode, "layer %d (%s) needs 'out', the number of output %s, like "
                   "`- %s: {out: 64}`", index, tname,
                   t == GP_LAYER_LINEAR ? "features" : "channels", tname);
    if (has_key(keys, nk, "kernel") && spec->kernel < 1)
        return bad(w, tnode, "layer %d (%s) needs 'kernel', like `- %s: {kernel: 3}`", index,
                   tname, tname);
    return GP_OK;
}

/* [C, H, W], or [F] / F for flat samples as (F, 1, 1). */
static gp_status parse_shape(const walk *w, const gp_ynode *in, const char *what,
                             int64_t dims[3])
{
    char got[96];
    const int64_t max = (int64_t)1 << 24;
    dims[0] = dims[1] = dims[2] = 1;
    if (in->kind == GP_YNODE_SEQ) {
        if (in->n != 1 && in->n != 3)
            return bad(w, in, "%s must be [C, H, W] or [F], got a list of %d", what, in->n);
        for (int i = 0; i < in->n; i++) {
            const gp_ynode *d = in->items[i];
            char name[64];
            snprintf(name, sizeof name, "%s.%d", what, i);
            if (absent(d)) return bad(w, d ? d : in, "expected an integer for %s, got nothing", name);
            GP_TRY(parse_int(w, d, name, &dims[i]));
            if (dims[i] < 1 || dims[i] > max)
                return bad(w, d, "%s must be in [1, %lld], got %lld", name, (long long)max,
                           (long long)dims[i]);
        }
        return GP_OK;
    }
    if (in->kind == GP_YNODE_SCALAR) {
        GP_TRY(parse_int(w, in, what, &dims[0]));
        if (dims[0] < 1 || dims[0] > max)
            return bad(w, in, "%s must be in [1, %lld], got %lld", what, (long long)max,
                       (long long)dims[0]);
        return GP_OK;
    }
    return bad(w, in, "expected [C, H, W] for %s, got %s", what, describe(in, got, sizeof got));
}

static gp_status parse_model(walk *w, const gp_ynode *root, gp_model_config *mc)
{
    char got[96];
    const gp_ynode *mkey = gp_ymap_key(root, "model");
    const gp_ynode *m = gp_ymap_get(root, "model");
    if (absent(m))
        return bad(w, mkey ? mkey : root, "missing section 'model'; a config needs at least "
                   "model.input (the shape of one sample) and model.layers");
    if (m->kind != GP_YNODE_MAP)
        return bad(w, m, "expected a map for model, with input and layers, got %s",
                   describe(m, got, sizeof got));
    GP_TRY(check_keys(w, m, "model"));

    /* input: [C, H, W], or [F] / F for flat samples */
    const gp_ynode *in = gp_ymap_get(m, "input");
    if (absent(in))
        return bad(w, in ? in : mkey, "missing model.input: the shape of one sample, like "
                   "input: [1, 28, 28] (C, H, W) or input: [784]");
    GP_TRY(parse_shape(w, in, "model.input", mc->input));

    const gp_ynode *ls = gp_ymap_get(m, "layers");
    if (absent(ls))
        return bad(w, ls ? ls : mkey, "missing model.layers: a list of layers, like "
                   "layers: [flatten, {linear: {out: 10}}]");
    if (ls->kind != GP_YNODE_SEQ)
        return bad(w, ls, "expected a list for model.layers, got %s",
                   describe(ls, got, sizeof got));
    if (ls->n == 0) return bad(w, ls, "model.layers is empty; give at least one layer");
    mc->layers = calloc((size_t)ls->n, sizeof *mc->layers);
    if (!mc->layers) return gp_error_set(GP_ERR_INVALID, "out of memory reading the config");
    mc->n_layers = ls->n;
    bool rec = w->record;
    w->record = false;
    gp_status s = GP_OK;
    for (int i = 0; i < ls->n && s == GP_OK; i++) s = parse_layer(w, ls->items[i], i, &mc->layers[i]);
    w->record = rec;
    GP_TRY(s);
    for (int i = 0; i < mc->n_layers; i++) {
        if (!mc->layers[i].name[0]) continue;
        for (int j = 0; j < i; j++) {
            if (!strcmp(mc->layers[i].name, mc->layers[j].name))
                return bad(w, gp_ymap_get(ls->items[i]->items ? ls->items[i]->items[0] : NULL,
                                          "name"),
                           "layer name '%s' is used by layers %d and %d; names must be unique",
                           mc->layers[i].name, j, i);
        }
    }

    int loss = 0;
    GP_TRY(get_enum(w, m, "model", "loss", k_loss_names, COUNT(k_loss_names), 0, &loss));
    snprintf(mc->loss, sizeof mc->loss, "%s", k_loss_names[loss]);
    GP_TRY(get_str(w, m, "model", "init_from", "", mc->init_from, sizeof mc->init_from));
    return GP_OK;
}

/* ---- pipeline ------------------------------------------------------------- */

static gp_status parse_device(walk *w, const gp_ynode *item, int index, gp_pipeline_config *pc,
                              gp_device_kind *kind, int *dev_index)
{
    char got[96], sect[48];
    snprintf(sect, sizeof sect, "pipeline.devices.%d", index);
    gp_device_spec *d = &pc->devices[index];
    const gp_ynode *name_node = item;
    d->memory = pc->memory;
    d->threads = pc->threads;
    if (item->kind == GP_YNODE_MAP) {
        GP_TRY(check_keys_list(w, item, sect, k_device_keys, COUNT(k_device_keys)));
        name_node = gp_ymap_get(item, "name");
        if (absent(name_node))
            return bad(w, item, "%s needs a name, like {name: cpu:0, memory: 512MiB}", sect);
        const gp_ynode *mem = gp_ymap_get(item, "memory");
        if (!absent(mem)) {
            char nm[64];
            snprintf(nm, sizeof nm, "%s.memory", sect);
            GP_TRY(parse_bytes(w, mem, nm, &d->memory));
        }
        int threads;
        GP_TRY(get_int32(w, item, sect, "threads", pc->threads, 0, 4096, &threads));
        d->threads = threads;
    }
    if (name_node->kind != GP_YNODE_SCALAR)
        return bad(w, name_node, "expected a device name like cpu:0 for %s, got %s", sect,
                   describe(name_node, got, sizeof got));
    if (strlen(name_node->text) >= sizeof d->name)
        return bad(w, name_node, "device name %s is too long",
                   describe(name_node, got, sizeof got));
    if (gp_device_parse(name_node->text, kind, dev_index) != GP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", gp_error_message());
        return bad(w, name_node, "%s: %s", sect, why);
    }
    snprintf(d->name, sizeof d->name, "%s", name_node->text);
    return GP_OK;
}

/* Every device of every replica distinct. */
static gp_status check_all_distinct(const walk *w, const gp_ynode *at, const gp_pipeline_config *pc)
{
    int total = pc->n_devices * pc->replicas;
    gp_device_kind kinds[GP_MAX_DEVICES];
    int idx[GP_MAX_DEVICES];
    for (int a = 0; a < total; a++) {
        if (gp_device_parse(pc->devices[a].name, &kinds[a], &idx[a]) != GP_OK)
            return bad(w, at, "pipeline.devices: %s", gp_error_message());
        for (int b = 0; b < a; b++)
            if (kinds[a] == kinds[b] && idx[a] == idx[b])
                return bad(w, at, "device '%s' is used by replica %d stage %d and by replica %d "
                           "stage %d; every stage of every replica needs its own device (list "
                           "them as a grid, one row per replica: [[cpu:0, cpu:1], [cpu:2, "
                           "cpu:3]])", pc->devices[a].name, b / pc->n_devices,
                           b % pc->n_devices, a / pc->n_devices, a % pc->n_devices);
    }
    return GP_OK;
}

/* devices: [[a, b], [c, d]]: one row per replica, stages along the row. */
static gp_status parse_device_grid(walk *w, const gp_ynode *dv, const gp_ynode *rep_node,
                                   gp_pipeline_config *pc)
{
    int rows = dv->n, cols = dv->items[0]->n;
    if (cols == 0) return bad(w, dv->items[0], "pipeline.devices.0 is an empty row; give each "
                              "replica's stage devices, like [[cpu:0, cpu:1], [cpu:2, cpu:3]]");
    if ((int64_t)rows * cols > GP_MAX_DEVICES)
        return bad(w, dv, "pipeline.devices has %d x %d devices; at most %d are supported", rows,
                   cols, GP_MAX_DEVICES);
    if (!absent(rep_node)) {
        int64_t r;
        GP_TRY(parse_int(w, rep_node, "pipeline.replicas", &r));
        if (r != rows)
            return bad(w, rep_node, "pipeline.replicas = %lld but pipeline.devices has %d rows "
                       "(one per replica); drop replicas or make them agree", (long long)r,
                       rows);
    }
    pc->replicas = rows;
    pc->n_devices = cols;
    for (int r = 0; r < rows; r++) {
        const gp_ynode *row = dv->items[r];
        if (absent(row) || row->kind != GP_YNODE_SEQ || row->n != cols)
            return bad(w, absent(row) ? dv : row, "pipeline.devices.%d must be a list of %d "
                       "devices like row 0 (every replica has the same stages)", r, cols);
        for (int j = 0; j < cols; j++) {
            if (absent(row->items[j]))
                return bad(w, row, "pipeline.devices.%d.%d is empty; give a device name", r, j);
            gp_device_kind kind;
            int index;
            GP_TRY(parse_device(w, row->items[j], r * cols + j, pc, &kind, &index));
        }
    }
    return check_all_distinct(w, dv, pc);
}

/* replicas: R with a plain device list: replica r runs on the listed
 * devices with their indices shifted by r x (devices listed), so
 * [cpu:0, cpu:1] with replicas: 2 adds [cpu:2, cpu:3]. */
static gp_status derive_replicas(walk *w, const gp_ynode *at, gp_pipeline_config *pc)
{
    int n = pc->n_devices;
    if ((int64_t)n * pc->replicas > GP_MAX_DEVICES)
        return bad(w, at, "%d replicas of %d devices are %d devices; at most %d are supported",
                   pc->replicas, n, n * pc->replicas, GP_MAX_DEVICES);
    for (int r = 1; r < pc->replicas; r++)
        for (int j = 0; j < n; j++) {
            gp_device_kind kind;
            int index;
            if (gp_device_parse(pc->devices[j].name, &kind, &index) != GP_OK)
                return bad(w, at, "pipeline.devices: %s", gp_error_message());
            gp_device_spec *d = &pc->devices[r * n + j];
            *d = pc->devices[j];
            gp_device_format(kind, index + r * n, d->name, sizeof d->name);
        }
    note(w, "pipeline.devices of replicas 1..%d: the listed devices shifted by %d per replica",
         pc->replicas - 1, n);
    return check_all_distinct(w, at, pc);
}

static gp_status parse_pipeline(walk *w, const gp_ynode *root, gp_pipeline_config *pc)
{
    char got[96];
    const gp_ynode *m;
    GP_TRY(get_map(w, root, "", "pipeline", "{devices: [cpu:0, cpu:1], chunks: 4}", &m));
    GP_TRY(check_keys(w, m, "pipeline"));
    GP_TRY(get_int32(w, m, "pipeline", "threads", 0, 0, 4096, &pc->threads));
    GP_TRY(get_bytes(w, m, "pipeline", "memory", &pc->memory));

    /* devices: [names or maps], a single name, a count of CPU devices, or a
     * grid with one row of names per data-parallel replica */
    const gp_ynode *dv = gp_ymap_get(m, "devices");
    const gp_ynode *dev_nodes[GP_MAX_DEVICES];
    gp_device_kind kinds[GP_MAX_DEVICES];
    int idx[GP_MAX_DEVICES];
    const gp_ynode *rep_node = gp_ymap_get(m, "replicas");
    bool grid = !absent(dv) && dv->kind == GP_YNODE_SEQ && dv->n > 0 && !absent(dv->items[0]) &&
                dv->items[0]->kind == GP_YNODE_SEQ;
    if (!grid) GP_TRY(get_int32(w, m, "pipeline", "replicas", 1, 1, 1024, &pc->replicas));
    if (grid) {
        GP_TRY(parse_device_grid(w, dv, rep_node, pc));
    } else if (absent(dv)) {
        pc->n_devices = 1;
        snprintf(pc->devices[0].name, sizeof pc->devices[0].name, "cpu:0");
        pc->devices[0].memory = pc->memory;
        pc->devices[0].threads = pc->threads;
        note(w, "pipeline.devices = [cpu:0] (default)");
    } else if (dv->kind == GP_YNODE_SCALAR && dv->text[0] >= '0' && dv->text[0] <= '9') {
        int64_t count;
        GP_TRY(parse_int(w, dv, "pipeline.devices", &count));
        if (count < 1 || count > GP_MAX_DEVICES)
            return bad(w, dv, "pipeline.devices must be in [1, %d] when it is a count, got %lld",
                       GP_MAX_DEVICES, (long long)count);
        pc->n_devices = (int)count;
        for (int j = 0; j < pc->n_devices; j++) {
            snprintf(pc->devices[j].name, sizeof pc->devices[j].name, "cpu:%d", j);
            pc->devices[j].memory = pc->memory;
            pc->devices[j].threads = pc->threads;
        }
    } else if (dv->kind == GP_YNODE_SCALAR || dv->kind == GP_YNODE_MAP) {
        pc->n_devices = 1;
        dev_nodes[0] = dv;
        GP_TRY(parse_device(w, dv, 0, pc, &kinds[0], &idx[0]));
    } else {
        if (dv->n == 0) return bad(w, dv, "pipeline.devices is empty; give at least one device");
        if (dv->n > GP_MAX_DEVICES)
            return bad(w, dv, "pipeline.devices lists %d devices; at most %d are supported",
                       dv->n, GP_MAX_DEVICES);
        pc->n_devices = dv->n;
        for (int j = 0; j < dv->n; j++) {
            dev_nodes[j] = dv->items[j];
            if (absent(dev_nodes[j]))
                return bad(w, dev_nodes[j], "pipeline.devices.%d is empty; give a device name "
                           "like cpu:%d", j, j);
            GP_TRY(parse_device(w, dev_nodes[j], j, pc, &kinds[j], &idx[j]));
            for (int k = 0; k < j; k++) {
                if (kinds[k] == kinds[j] && idx[k] == idx[j])
                    return bad(w, dev_nodes[j], "duplicate device '%s' in pipeline.devices "
                               "(also item %d, '%s'); each stage needs its own device",
                               pc->devices[j].name, k, pc->devices[k].name);
            }
        }
    }
    if (!grid && pc->replicas > 1) GP_TRY(derive_replicas(w, dv ? dv : m, pc));

    /* balance: auto or one layer count per device */
    const gp_ynode *bal = gp_ymap_get(m, "balance");
    if (absent(bal) || (bal->kind == GP_YNODE_SCALAR && !strcmp(bal->text, "auto"))) {
        pc->n_balance = 0;
        if (absent(bal)) note(w, "pipeline.balance = auto (default)");
    } else if (bal->kind != GP_YNODE_SEQ) {
        return bad(w, bal, "expected auto or a list of layer counts, one per device, for "
                   "pipeline.balance, got %s", describe(bal, got, sizeof got));
    } else {
        if (bal->n != pc->n_devices)
            return bad(w, bal, "pipeline.balance has %d entr%s but there %s %d device%s; give "
                       "one layer count per device (or balance: auto)", bal->n,
                       bal->n == 1 ? "y" : "ies", pc->n_devices == 1 ? "is" : "are",
                       pc->n_devices, pc->n_devices == 1 ? "" : "s");
        for (int j = 0; j < bal->n; j++) {
            char name[48];
            snprintf(name, sizeof name, "pipeline.balance.%d", j);
            const gp_ynode *b = bal->items[j];
            if (absent(b)) return bad(w, b, "expected an integer for %s, got nothing", name);
            int64_t v;
            GP_TRY(parse_int(w, b, name, &v));
            if (v < 1)
                return bad(w, b, "%s must be >= 1 (every stage needs a layer), got %lld", name,
                           (long long)v);
            if (v > INT_MAX) return bad(w, b, "%s is too large, got %lld", name, (long long)v);
            pc->balance[j] = (int)v;
        }
        pc->n_balance = bal->n;
    }
    GP_TRY(get_int32(w, m, "pipeline", "chunks", 1, 1, 1 << 20, &pc->chunks));
    int ck = 0;
    GP_TRY(get_enum(w, m, "pipeline", "checkpoint", k_ckpt_names, COUNT(k_ckpt_names),
                    GP_CKPT_EXCEPT_LAST, &ck));
    pc->checkpoint = (gp_checkpoint_mode)ck;
    GP_TRY(get_bool(w, m, "pipeline", "lockstep", true, &pc->lockstep));
    return GP_OK;
}

/* ---- data ----------------------------------------------------------------- */

static const char *default_path(gp_dataset_kind k)
{
    switch (k) {
    case GP_DATASET_FASHION_MNIST: return "/usr/share/datasets/fashion-mnist";
    case GP_DATASET_MNIST: return "/usr/share/datasets/mnist";
    case GP_DATASET_CIFAR10: return "data/cifar-10-batches-bin";
    case GP_DATASET_SYNTHETIC: return "";
    }
    return "";
}

/* A scalar or a list of 1..GP_MAX_CHANNELS numbers. */
static gp_status get_channels(const walk *w, const gp_ynode *n, const char *name, float *out,
                              int *count, bool positive)
{
    int cnt = n->kind == GP_YNODE_SEQ ? n->n : 1;
    if (n->kind == GP_YNODE_MAP)
        return bad(w, n, "expected a number or a list of per-channel numbers for %s, got a map",
                   name);
    if (cnt < 1 || cnt > GP_MAX_CHANNELS)
        return bad(w, n, "%s must have 1 to %d values (one per channel), got %d", name,
                   GP_MAX_CHANNELS, cnt);
    for (int i = 0; i < cnt; i++) {
        const gp_ynode *v = n->kind == GP_YNODE_SEQ ? n->items[i] : n;
        char nm[64];
        snprintf(nm, sizeof nm, n->kind == GP_YNODE_SEQ ? "%s.%d" : "%s", name, i);
        if (absent(v)) return bad(w, v ? v : n, "expected a number for %s, got nothing", nm);
        double d;
        GP_TRY(parse_float(w, v, nm, &d));
        if (positive) GP_TRY(check_range(w, v, nm, d, 0, INFINITY, LO_OPEN));
        out[i] = (float)d;
    }
    *count = cnt;
    return GP_OK;
}

static gp_status parse_data(walk *w, const gp_ynode *root, const gp_model_config *mc,
                            gp_data_config *dc)
{
    const gp_ynode *m;
    GP_TRY(get_map(w, root, "", "data", "{dataset: fashion-mnist}", &m));
    GP_TRY(check_keys(w, m, "data"));
    int ds = 0;
    GP_TRY(get_enum(w, m, "data", "dataset", k_dataset_names, COUNT(k_dataset_names),
                    GP_DATASET_FASHION_MNIST, &ds));
    dc->dataset = (gp_dataset_kind)ds;
    GP_TRY(get_str(w, m, "data", "path", default_path(dc->dataset), dc->path, sizeof dc->path));
    GP_TRY(get_bool(w, m, "data", "shuffle", true, &dc->shuffle));
    GP_TRY(get_bool(w, m, "data", "normalize", true, &dc->normalize));

    const gp_ynode *mean = gp_ymap_get(m, "mean"), *sd = gp_ymap_get(m, "std");
    if (absent(mean) && absent(sd)) {
        dc->n_mean = 0;
        if (dc->normalize) note(w, "data.mean, data.std = statistics of %s (default)",
                                gp_dataset_name(dc->dataset));
    } else if (absent(mean) || absent(sd)) {
        const gp_ynode *given = absent(mean) ? sd : mean;
        return bad(w, given, "data.%s is given without data.%s; give both (one value per "
                   "channel) or neither", absent(mean) ? "std" : "mean",
                   absent(mean) ? "mean" : "std");
    } else {
        int nm = 0, ns = 0;
        GP_TRY(get_channels(w, mean, "data.mean", dc->mean, &nm, false));
        GP_TRY(get_channels(w, sd, "data.std", dc->std, &ns, true));
        if (nm != ns)
            return bad(w, sd, "data.std has %d value%s but data.mean has %d; give one per "
                       "channel for both", ns, ns == 1 ? "" : "s", nm);
        dc->n_mean = nm;
    }

    const gp_ynode *aug;
    GP_TRY(get_map(w, m, "data", "augment", "{crop_padding: 4, hflip: true}", &aug));
    GP_TRY(check_keys(w, aug, "data.augment"));
    GP_TRY(get_int32(w, aug, "data.augment", "crop_padding", 0, 0, 1024, &dc->crop_padding));
    GP_TRY(get_bool(w, aug, "data.augment", "hflip", false, &dc->hflip));
    GP_TRY(get_int32(w, m, "data", "prefetch", 2, 0, 1024, &dc->prefetch));
    GP_TRY(get_int(w, m, "data", "train_limit", 0, 0, INT64_MAX, &dc->train_limit));
    GP_TRY(get_int(w, m, "data", "test_limit", 0, 0, INT64_MAX, &dc->test_limit));

    const gp_ynode *syn;
    GP_TRY(get_map(w, m, "data", "synthetic", "{train: 1024, test: 256, classes: 10}", &syn));
    GP_TRY(check_keys(w, syn, "data.synthetic"));
    bool rec = w->record;
    w->record = rec && dc->dataset == GP_DATASET_SYNTHETIC;
    gp_status s = get_int(w, syn, "data.synthetic", "train", 1024, 1, (int64_t)1 << 40,
                          &dc->synthetic_train);
    if (s == GP_OK)
        s = get_int(w, syn, "data.synthetic", "test", 256, 1, (int64_t)1 << 40,
                    &dc->synthetic_test);
    if (s == GP_OK)
        s = get_int32(w, syn, "data.synthetic", "classes", 10, 2, 1 << 20,
                      &dc->synthetic_classes);
    w->record = rec;
    GP_TRY(s);
    /* the synthetic samples match the model unless told otherwise */
    const gp_ynode *shape = gp_ymap_get(syn, "shape");
    if (absent(shape)) {
        memcpy(dc->synthetic_shape, mc->input, sizeof dc->synthetic_shape);
        if (dc->dataset == GP_DATASET_SYNTHETIC)
            note(w, "data.synthetic.shape = model.input (default)");
        return GP_OK;
    }
    return parse_shape(w, shape, "data.synthetic.shape", dc->synthetic_shape);
}

/* ---- train ---------------------------------------------------------------- */

/* `key: name` is shorthand for `key: {type: name}`. */
static gp_status get_typed_map(walk *w, const gp_ynode *m, const char *key, const char *example,
                               const gp_ynode **map, const gp_ynode **type_scalar)
{
    const gp_ynode *n = gp_ymap_get(m, key);
    *map = NULL;
    *type_scalar = NULL;
    if (n && n->kind == GP_YNODE_SCALAR) {
        *type_scalar = n;
        return GP_OK;
    }
    GP_TRY(get_map(w, m, "train", key, example, map));
    char sect[64];
    join(sect, sizeof sect, "train", key);
    return check_keys(w, *map, sect);
}

static gp_status parse_train(walk *w, const gp_ynode *root, gp_train_config *tc)
{
    const gp_ynode *m;
    GP_TRY(get_map(w, root, "", "train", "{epochs: 3, batch_size: 64}", &m));
    GP_TRY(check_keys(w, m, "train"));
    GP_TRY(get_int(w, m, "train", "steps", 0, 0, INT64_MAX, &tc->steps));
    bool rec = w->record;
    w->record = rec && tc->steps == 0;
    gp_status s = get_int(w, m, "train", "epochs", 1, 1, (int64_t)1 << 40, &tc->epochs);
    w->record = rec;
    GP_TRY(s);
    if (tc->steps > 0 && !absent(gp_ymap_get(m, "epochs")))
        note(w, "train.epochs = %lld is ignored: train.steps = %lld is given",
             (long long)tc->epochs, (long long)tc->steps);
    GP_TRY(get_int(w, m, "train", "batch_size", 64, 1, 1 << 24, &tc->batch_size));
    GP_TRY(get_u64(w, m, "train", "seed", 0, &tc->seed));

    const gp_ynode *om, *ot;
    GP_TRY(get_typed_map(w, m, "optimizer", "{type: sgd, lr: 0.1}", &om, &ot));
    int k = 0;
    if (ot)
        GP_TRY(parse_enum(w, ot, "train.optimizer", k_optim_names, COUNT(k_optim_names), &k));
    else
        GP_TRY(get_enum(w, om, "train.optimizer", "type", k_optim_names, COUNT(k_optim_names),
                        0, &k));
    snprintf(tc->optim.type, sizeof tc->optim.type, "%s", k_optim_names[k]);
    const char *os = "train.optimizer";
    GP_TRY(get_float(w, om, os, "lr", 0.01f, 0, INFINITY, 0, &tc->optim.lr));
    GP_TRY(get_float(w, om, os, "momentum", 0.9f, 0, 1, HI_OPEN, &tc->optim.momentum));
    GP_TRY(get_bool(w, om, os, "nesterov", false, &tc->optim.nesterov));
    GP_TRY(get_float(w, om, os, "weight_decay", 0, 0, INFINITY, 0, &tc->optim.weight_decay));
    GP_TRY(get_bool(w, om, os, "decay_bias_and_norm", false, &tc->optim.decay_bias_and_norm));
    if (tc->optim.nesterov && tc->optim.momentum <= 0)
        return bad(w, gp_ymap_get(om, "nesterov"), "train.optimizer.nesterov needs momentum "
                   "> 0 (Nesterov momentum with no momentum is plain SGD)");

    const gp_ynode *sm, *st;
    GP_TRY(get_typed_map(w, m, "schedule", "{type: cosine, warmup_steps: 100}", &sm, &st));
    if (st)
        GP_TRY(parse_enum(w, st, "train.schedule", k_sched_names, COUNT(k_sched_names), &k));
    else
        GP_TRY(get_enum(w, sm, "train.schedule", "type", k_sched_names, COUNT(k_sched_names),
                        GP_SCHED_CONSTANT, &k));
    tc->sched.kind = (gp_sched_kind)k;
    const char *ss = "train.schedule";
    GP_TRY(get_int(w, sm, ss, "warmup_steps", 0, 0, INT64_MAX, &tc->sched.warmup_steps));
    GP_TRY(get_float(w, sm, ss, "warmup_start", 0, 0, 1, 0, &tc->sched.warmup_start));
    rec = w->record;
    w->record = rec && tc->sched.kind == GP_SCHED_STEP;
    s = get_int(w, sm, ss, "step_size", 1000, 1, INT64_MAX, &tc->sched.step_size);
    if (s == GP_OK)
        s = get_float(w, sm, ss, "gamma", 0.1f, 0, INFINITY, LO_OPEN, &tc->sched.gamma);
    w->record = rec && tc->sched.kind == GP_SCHED_COSINE;
    if (s == GP_OK) s = get_float(w, sm, ss, "min_lr", 0, 0, INFINITY, 0, &tc->sched.min_lr);
    w->record = rec;
    GP_TRY(s);

    GP_TRY(get_enum(w, m, "train", "lr_scaling", k_scaling_names, COUNT(k_scaling_names),
                    GP_LR_SCALING_NONE, &k));
    tc->lr_scaling = (gp_lr_scaling)k;
    rec = w->record;
    w->record = false;
    s = get_int(w, m, "train", "base_batch", tc->batch_size, 1, 1 << 24, &tc->base_batch);
    w->record = rec;
    GP_TRY(s);
    if (absent(gp_ymap_get(m, "base_batch")) && tc->lr_scaling == GP_LR_SCALING_LINEAR)
        note(w, "train.base_batch = %lld (default: train.batch_size)", (long long)tc->base_batch);
    GP_TRY(get_int(w, m, "train", "log_every", 50, 0, INT64_MAX, &tc->log_every));
    GP_TRY(get_bool(w, m, "train", "eval_each_epoch", true, &tc->eval_each_epoch));
    GP_TRY(get_int(w, m, "train", "eval_batch_size", 1000, 1, 1 << 24, &tc->eval_batch_size));

    const gp_ynode *snm;
    GP_TRY(get_map(w, m, "train", "snapshot", "{every_steps: 1000, keep: 3, dir: snapshots}",
                   &snm));
    GP_TRY(check_keys(w, snm, "train.snapshot"));
    const char *sn = "train.snapshot";
    rec = w->record;
    w->record = rec && snm;
    s = get_int(w, snm, sn, "every_steps", 0, 0, INT64_MAX, &tc->snapshot.every_steps);
    if (s == GP_OK)
        s = get_float(w, snm, sn, "every_minutes", 0, 0, INFINITY, 0, &tc->snapshot.every_minutes);
    if (s == GP_OK) s = get_int(w, snm, sn, "keep", 3, 1, 1 << 20, &tc->snapshot.keep);
    if (s == GP_OK)
        s = get_str(w, snm, sn, "dir", "snapshots", tc->snapshot.dir, sizeof tc->snapshot.dir);
    w->record = rec;
    GP_TRY(s);
    if (snm && tc->snapshot.dir[0] == '\0')
        return bad(w, gp_ymap_get(snm, "dir"), "train.snapshot.dir is empty; give a directory");
    return GP_OK;
}

/* ---- the whole config ----------------------------------------------------- */

static gp_status walk_root(walk *w, const gp_ynode *root, gp_config *c)
{
    char got[96];
    if (root->kind == GP_YNODE_NULL)
        return bad(w, root, "the config is empty; it needs at least model.input and "
                   "model.layers");
    if (root->kind != GP_YNODE_MAP)
        return bad(w, root, "expected a map with the sections model, pipeline, data and "
                   "train at the top of the config, got %s", describe(root, got, sizeof got));
    GP_TRY(check_keys(w, root, ""));
    GP_TRY(parse_model(w, root, &c->model));
    GP_TRY(parse_pipeline(w, root, &c->pipeline));
    GP_TRY(parse_data(w, root, &c->model, &c->data));
    GP_TRY(parse_train(w, root, &c->train));

    /* cross-field checks */
    if (c->pipeline.chunks > c->train.batch_size) {
        const gp_ynode *pm = gp_ymap_get(root, "pipeline");
        const gp_ynode *n = gp_ymap_get(pm, "chunks");
        if (!n) n = gp_ymap_get(gp_ymap_get(root, "train"), "batch_size");
        return bad(w, n, "pipeline.chunks (%d) must be <= train.batch_size (%lld): every "
                   "micro-batch needs at least one sample", c->pipeline.chunks,
                   (long long)c->train.batch_size);
    }
    return GP_OK;
}

gp_status gp_config_parse(const char *name, const char *text, size_t len,
                          const char *const *overrides, int n_overrides, gp_config *out)
{
    memset(out, 0, sizeof *out);
    if (!name) name = "<config>";
    if (!text && len) return gp_error_set(GP_ERR_INVALID, "%s: no config text given", name);
    if (strlen(name) >= sizeof out->path)
        return gp_error_set(GP_ERR_INVALID, "%.80s...: the config's path is too long (at "
                            "most %zu characters)", name, sizeof out->path - 1);
    gp_ynode *root = NULL;
    GP_TRY(gp_ytree_parse(name, NULL, text ? text : "", len, &root));
    for (int i = 0; i < n_overrides; i++) {
        if (!overrides || !overrides[i]) continue;
        gp_status s = gp_ytree_override(&root, overrides[i]);
        if (s != GP_OK) {
            gp_ynode_free(root);
            return s;
        }
    }
    walk w = {.file = name, .record = true};
    gp_status s = walk_root(&w, root, out);
    gp_ynode_free(root);
    if (s != GP_OK) {
        free(w.defaults);
        gp_config_free(out);
        return s;
    }
    snprintf(out->path, sizeof out->path, "%s", name);
    size_t olen = 1;
    for (int i = 0; i < n_overrides; i++)
        if (overrides && overrides[i]) olen += strlen(overrides[i]) + 1;
    out->text = malloc(len + 1);
    out->overrides = malloc(olen);
    if (out->text) {
        if (len) memcpy(out->text, text, len);
        out->text[len] = '\0';
    }
    if (out->overrides) {
        size_t at = 0;
        for (int i = 0; i < n_overrides; i++) {
            if (!overrides || !overrides[i]) continue;
            size_t k = strlen(overrides[i]);
            memcpy(out->overrides + at, overrides[i], k);
            at += k;
            out->overrides[at++] = '\n';
        }
        out->overrides[at] = '\0';
    }
    if (!out->text || !out->overrides) {
        free(w.defaults);
        gp_config_free(out);
        return gp_error_set(GP_ERR_INVALID, "out of memory reading the config");
    }
    out->defaults_applied = w.defaults ? w.defaults : calloc(1, 1);
    if (!out->defaults_applied) {
        gp_config_free(out);
        return gp_error_set(GP_ERR_INVALID, "out of memory reading the config");
    }
    return GP_OK;
}

#define GP_CONFIG_MAX_BYTES ((size_t)16 << 20)

gp_status gp_config_load(const char *path, const char *const *overrides, int n_overrides,
                         gp_config *out)
{
    memset(out, 0, sizeof *out);
    if (!path) return gp_error_set(GP_ERR_INVALID, "no config path given");
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return gp_error_set(GP_ERR_IO, "%s: cannot open the config: %s", path, strerror(e));
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    gp_status s = GP_OK;
    while (buf) {
        if (len == cap) {
            if (cap >= GP_CONFIG_MAX_BYTES) {
                s = gp_error_set(GP_ERR_INVALID, "%s: larger than %zu MiB; is this a config?",
                                 path, GP_CONFIG_MAX_BYTES >> 20);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                int e = errno;
                s = gp_error_set(GP_ERR_IO, "%s: cannot read the config: %s", path,
                                 strerror(e));
            }
            break;
        }
    }
    fclose(f);
    if (!buf) return gp_error_set(GP_ERR_IO, "%s: out of memory reading the config", path);
    if (s == GP_OK) s = gp_config_parse(path, buf, len, overrides, n_overrides, out);
    free(buf);
    return s;
}

void gp_config_free(gp_config *c)
{
    if (!c) return;
    free(c->model.layers);
    free(c->defaults_applied);
    free(c->text);
    free(c->overrides);
    memset(c, 0, sizeof *c);
}
