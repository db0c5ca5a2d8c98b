/*
 * config_impl.h — inside the config module: a small generic YAML tree.
 *
 * yaml_tree.c turns YAML text into a tree of gp_ynode (null, scalar, map,
 * sequence), each node carrying the 1-based line and column where it
 * starts; `--set` overrides are applied to that tree (nodes they create
 * carry the override text in `set`); config.c then walks the tree into the
 * plain structs of config.h, one section per file (config_model.c,
 * config_pipeline.c, config_data.c, config_train.c) with the messages,
 * schema check and typed getters of config_walk.c.  No libyaml type
 * appears here, so the walker and the tests never see one.
 *
 * Memory: a tree owns all its nodes and strings; gp_ynode_free releases a
 * node and everything below it.  Map keys are scalar nodes, values live in
 * `items` at the same index.
 * Thread safety: pure functions over their arguments.
 */
#ifndef GP_CONFIG_IMPL_H
#define GP_CONFIG_IMPL_H

#include "config/config.h"
#include "core/core.h"

typedef enum gp_ynode_kind {
    GP_YNODE_NULL = 0, /* "", "~", "null" unquoted, or an empty value */
    GP_YNODE_SCALAR,
    GP_YNODE_MAP,
    GP_YNODE_SEQ
} gp_ynode_kind;

typedef struct gp_ynode gp_ynode;
struct gp_ynode {
    gp_ynode_kind kind;
    int line, column;   /* 1-based position of the node's first character */
    const char *set;    /* NULL if from the file; else the override
                           ("train.lr=0.1") that produced it (not owned) */
    char *text;         /* scalar and null: the text as written (owned) */
    bool quoted;        /* scalar was quoted or a block scalar */
    gp_ynode **keys;    /* map: key nodes (scalars), parallel to items */
    gp_ynode **items;   /* map values or sequence items (owned) */
    int n, cap;
};

/* Limits that keep hostile input cheap: nesting depth, nodes per tree
 * (after expanding aliases), entries per map. */
#define GP_YAML_MAX_DEPTH 64
#define GP_YAML_MAX_NODES 200000
#define GP_YAML_MAX_MAP 4096

/* Parse `text` (len bytes) into a tree.  Messages start with
 * "name:line:column: " or, when `set` is not NULL, with "--set <set>: ".
 * An empty document gives *out = a null node.  *alias_or_end (where not
 * NULL): whether the text uses an alias (*name) or ends its document with
 * "...": the tree holds an alias's copy, so a section copied as text may
 * name an anchor that a section written from the tree no longer defines;
 * and a section written after an explicit end would be a second document
 * (gp_config_text_applied). */
gp_status gp_ytree_parse(const char *name, const char *set, const char *text,
                         size_t len, gp_ynode **out, bool *alias_or_end);
void gp_ynode_free(gp_ynode *n);

/* Apply one override "a.b.c=value" to the tree rooted at *root (which may
 * be replaced).  An empty (or blank) value is an error that shows an
 * example; "~" or "null" is the way to ask for the default.  Map keys are created as needed; a sequence is indexed by a
 * number (index == length appends); under model.layers.<i> a key that is
 * not the layer's type addresses the layer's options, so
 * "model.layers.3.out=128" works for `- linear: {out: 64}` and for a bare
 * `- relu` alike. */
gp_status gp_ytree_override(gp_ynode **root, const char *set);

/* The value of `key` in map `m` (NULL if absent or m is not a map). */
gp_ynode *gp_ymap_get(const gp_ynode *m, const char *key);
/* The key node of `key` in map `m` (for positions), or NULL. */
gp_ynode *gp_ymap_key(const gp_ynode *m, const char *key);

/* An example value for the dotted key ("train.steps" -> "100",
 * "model.layers.3.out" -> "64"), or NULL if there is none (config_walk.c). */
const char *gp_cfg_example(const char *key);

/* "name:line:column" or "--set <set>" for messages; a list of the file
 * that an override changed an item of is "name:line:column (as --set
 * <set> changed it)", so that a message about it does not send the user
 * to a line that reads right. */
const char *gp_yloc(const char *name, const gp_ynode *n, char *buf, size_t len);
/* The same with the override that changed n's part named by the caller
 * (NULL: none), where it is not inside n itself (a layer's type key, whose
 * options an override replaced). */
const char *gp_yloc_within(const char *name, const gp_ynode *n, const char *within, char *buf,
                           size_t len);

/* The first override (--set) that made n or a node inside it; NULL if none. */
const char *gp_ynode_set_within(const gp_ynode *n);

/* Restricted Damerau-Levenshtein distance (optimal string alignment),
 * capped at 99 for long strings. */
int gp_edit_distance(const char *a, const char *b);

/* ---- the walk (config_walk.c) ---------------------------------------------
 *
 * A getter reads option `key` of map m (NULL: an absent section) in section
 * `sect` ("train.optimizer"; "" = the top level).  Absent or null, it
 * stores the default and, while w->record, notes "sect.key = v (default)";
 * given, it checks the type and range and fails with GP_ERR_INVALID at the
 * node's file:line:column (gp_cfg_bad).  `name` arguments are the dotted
 * name used in messages. */

typedef struct gp_cfg_walk {
    const char *file;   /* name used in messages */
    char *defaults;     /* "x = v (default)\n" lines (owned until handed out) */
    size_t dlen, dcap;
    bool record;        /* record defaults (off inside layers and devices) */
    char *warnings;     /* "file:line:column: ...\n" lines (owned until handed
                           out); recorded whatever `record` says */
    size_t wlen, wcap;
    const gp_ynode *root;          /* the whole tree (overrides applied) */
    const gp_config_sources *src;  /* NULL: none beyond the files named */
} gp_cfg_walk;

#define GP_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Bounds of gp_cfg_check_range and gp_cfg_get_float that are strict. */
enum { GP_CFG_LO_OPEN = 1, GP_CFG_HI_OPEN = 2 };

/* GP_ERR_INVALID with "file:line:column: " (or "--set ...: ") of n first. */
gp_status gp_cfg_bad(const gp_cfg_walk *w, const gp_ynode *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One line for cfg->defaults_applied, while w->record. */
void gp_cfg_note(gp_cfg_walk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One line for cfg->warnings: "file:line:column: " (or "--set ...: ") of n,
 * then the text.  For a value that is valid but most likely a mistake. */
void gp_cfg_warn(gp_cfg_walk *w, const gp_ynode *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "'abc'", "a list", "a map" or "nothing", for "got ..." */
const char *gp_cfg_describe(const gp_ynode *n, char *buf, size_t len);
/* "expected <what> for <name>, got <n described>" at n. */
gp_status gp_cfg_expected(const gp_cfg_walk *w, const gp_ynode *n, const char *what,
                          const char *name);
/* "sect.key", or "key" at the top level. */
void gp_cfg_join(char *buf, size_t len, const char *sect, const char *key);
/* "; did you mean 'x'?" for the name of names[0..n) nearest to `word`
 * (a typo, an abbreviation, a part), or "". */
void gp_cfg_nearest(const char *word, const char *const *names, int n, char *buf, size_t len);
/* Appends to buf, where `word` has a character outside ASCII, "; its
 * character 3 is U+0430 CYRILLIC SMALL LETTER A (looks like 'a'), not
 * ASCII" (" Its ..." after a "did you mean 'x'?"): a look-alike letter
 * that makes a right-looking name unknown. */
void gp_cfg_non_ascii(const char *word, char *buf, size_t len);
/* "a, b, c" */
void gp_cfg_list_names(const char *const *names, int n, char *buf, size_t len);
/* src into dst (len > 0 bytes), cut where it does not fit before the
 * character the cut would split (gp_utf8_cut): a layer's path or --set
 * kept for its messages. */
void gp_cfg_copy_text(char *dst, size_t len, const char *src);
/* path into dst (len > 3 bytes): a path longer than dst keeps its end,
 * where the file's name is ("...ng/dir/model.yaml"), from a character's
 * first byte; every layer keeps its config's path so, a family's too. */
void gp_cfg_keep_tail(char *dst, size_t len, const char *path);

/* Every key of map m against the schema of section `sect`; an unknown one
 * is an error with the best hint (the key elsewhere, a near miss, the keys
 * allowed there). */
gp_status gp_cfg_check_keys(const gp_cfg_walk *w, const gp_ynode *m, const char *sect);
/* Keys of a map against a local list; `what` names the map in the message
 * ("layer 3 (conv2d)"). */
gp_status gp_cfg_check_keys_list(const gp_cfg_walk *w, const gp_ynode *m, const char *what,
                                 const char *const *keys, int n);

static inline bool gp_cfg_absent(const gp_ynode *n) { return !n || n->kind == GP_YNODE_NULL; }

gp_status gp_cfg_parse_int(const gp_cfg_walk *w, const gp_ynode *n, const char *name,
                           int64_t *out);
gp_status gp_cfg_get_int(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                         int64_t def, int64_t lo, int64_t hi, int64_t *out);
gp_status gp_cfg_get_int32(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                           int def, int lo, int hi, int *out);
gp_status gp_cfg_get_u64(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                         uint64_t def, uint64_t *out);
/* A finite number within float range. */
gp_status gp_cfg_parse_float(const gp_cfg_walk *w, const gp_ynode *n, const char *name,
                             double *out);
/* lo <= v <= hi (strict per flags); hi = INFINITY for one-sided. */
gp_status gp_cfg_check_range(const gp_cfg_walk *w, const gp_ynode *n, const char *name, double v,
                             double lo, double hi, int flags);
/* v into *out as a float, within the range both as written and as the
 * float holds it (a nonzero v that becomes 0, or 0.99999999 that becomes 1
 * against a bound open at 1, is an error). */
gp_status gp_cfg_to_float(const gp_cfg_walk *w, const gp_ynode *n, const char *name, double v,
                          double lo, double hi, int flags, float *out);
gp_status gp_cfg_get_float(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                           float def, double lo, double hi, int flags, float *out);
/* The same checks (the value must survive as a 32-bit float, which the
 * kernels take), the value kept as written, in double: a learning rate of
 * 0.1 is 0.1 in the schedule's arithmetic and the metrics, as in PyTorch,
 * not 0.10000000149. */
gp_status gp_cfg_get_double(gp_cfg_walk *w, const gp_ynode *m, const char *sect,
                            const char *key, double def, double lo, double hi, int flags,
                            double *out);
/* true/yes/on, false/no/off, in any case. */
gp_status gp_cfg_get_bool(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                          bool def, bool *out);
/* Into buf (cap bytes); longer is an error. */
gp_status gp_cfg_get_str(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                         const char *def, char *buf, size_t cap);
/* An index into names[0..count); the message lists the allowed ones. */
gp_status gp_cfg_parse_enum(const gp_cfg_walk *w, const gp_ynode *n, const char *name,
                            const char *const *names, int count, int *out);
gp_status gp_cfg_get_enum(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                          const char *const *names, int count, int def, int *out);
/* "512MiB", "1.5GB", "2EiB" or bytes (units are binary multiples); given,
 * it must come to at least 1 byte (under one byte is an error, not "no
 * limit") and below 8 EiB; absent = 0, unlimited. */
gp_status gp_cfg_parse_bytes(const gp_cfg_walk *w, const gp_ynode *n, const char *name,
                             size_t *out);
gp_status gp_cfg_get_bytes(gp_cfg_walk *w, const gp_ynode *m, const char *sect, const char *key,
                           size_t *out);
/* A sub-map: *out = NULL if absent or null; not a map is an error showing
 * `example`. */
gp_status gp_cfg_get_map(const gp_cfg_walk *w, const gp_ynode *m, const char *sect,
                         const char *key, const char *example, const gp_ynode **out);

/* ---- the keys (config_keys.c) ---------------------------------------------
 *
 * One table holds every key a config may contain: its type, default, range
 * and meaning.  The unknown-key check reads its dotted paths, gpipe-train
 * --help-config prints it, tests/test_config_doc.py holds docs/config.md
 * to it, and every typed getter checks its call against its row
 * (gp_cfg_key_agrees): a getter whose default, range or type differs from
 * the row, or a key without a row, is a bug that aborts naming the key (as
 * GP_ASSERT does), so the table cannot drift from what the parser does.  Keys inside list items are
 * written with '#' for the index (model.layers.#.out, pipeline.devices.#.memory). */

typedef enum gp_cfg_type {
    GP_CFG_MAP = 0, /* a section or sub-map */
    GP_CFG_INT,     /* an integer (gp_cfg_get_int, _int32, _u64) */
    GP_CFG_NUM,     /* a number (gp_cfg_get_float, _double) */
    GP_CFG_BOOL,
    GP_CFG_STR,
    GP_CFG_ENUM,    /* one of `form`'s names */
    GP_CFG_SIZE,    /* bytes: 512MiB (gp_cfg_get_bytes) */
    GP_CFG_OTHER    /* parsed by its own code; `form` says what it takes */
} gp_cfg_type;

/* Row flags besides GP_CFG_LO_OPEN and GP_CFG_HI_OPEN. */
enum {
    GP_CFG_VARIES = 4,  /* the default depends on other keys (def says how): not compared */
    GP_CFG_ALSO_INT = 8 /* an OTHER key some call sites read as one integer (stride) */
};

typedef struct gp_cfg_key {
    const char *key;     /* dotted path */
    gp_cfg_type type;
    const char *form;    /* ENUM: its names, "a, b, c" in the parser's order; OTHER: the
                            forms it takes, in words; else NULL */
    const char *def;     /* the default as written in a config ("0.9", "true", "sgd");
                            NULL: none (required, or off when absent) */
    double lo, hi;       /* INT, NUM (and OTHER's numbers): the range; lo == hi == 0: none */
    int flags;           /* GP_CFG_LO_OPEN, GP_CFG_HI_OPEN, GP_CFG_VARIES */
    const char *meaning; /* one sentence; docs/config.md says the rest */
} gp_cfg_key;

/* The table, *n rows, sections before their keys. */
const gp_cfg_key *gp_cfg_keys(int *n);
/* The row of a dotted key, any all-digit part read as '#'
 * (model.layers.3.out -> model.layers.#.out); NULL if there is none. */
const gp_cfg_key *gp_cfg_key_find(const char *key);
/* The last parts of the rows directly under `sect` ("pipeline.devices.#"),
 * at most cap of them; their count. */
int gp_cfg_key_children(const char *sect, const char **out, int cap);
/* A getter's call against the row of `name` (a bug where they differ, or
 * where there is no row): its type, range and flags (for INT and NUM) and
 * its default, as a number (`num`, for INT and NUM) or as text (`text`, for
 * BOOL, STR and ENUM; NULL: none); for ENUM also the names. */
void gp_cfg_key_agrees(const char *name, gp_cfg_type type, double num, const char *text,
                       double lo, double hi, int flags, const char *const *names, int count);
/* The option keys a layer type takes, `name` and `stash` included
 * (config_model.c); their count.  keys has room for 16. */
int gp_cfg_layer_keys(gp_layer_type t, const char **keys);

/* ---- the sections ----------------------------------------------------------- */

/* A built-in model family under model (model.resnet): its layers into mc
 * and *found set; nothing when the config has none. */
gp_status gp_cfg_parse_family(gp_cfg_walk *w, const gp_ynode *m, gp_model_config *mc, bool *found);

/* [C, H, W], or [F] / F for flat samples as (F, 1, 1) (config_model.c;
 * data.synthetic.shape too). */
gp_status gp_cfg_parse_shape(const gp_cfg_walk *w, const gp_ynode *in, const char *what,
                             int64_t dims[3]);
gp_status gp_cfg_parse_model(gp_cfg_walk *w, const gp_ynode *root, gp_model_config *mc);
gp_status gp_cfg_parse_pipeline(gp_cfg_walk *w, const gp_ynode *root, gp_pipeline_config *pc);
/* After the model: the synthetic samples default to model.input. */
gp_status gp_cfg_parse_data(gp_cfg_walk *w, const gp_ynode *root, const gp_model_config *mc,
                            gp_data_config *dc);
gp_status gp_cfg_parse_train(gp_cfg_walk *w, const gp_ynode *root, gp_train_config *tc);

#endif /* GP_CONFIG_IMPL_H */
