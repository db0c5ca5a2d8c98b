/*
 * config_impl.h — inside the config module: a small generic YAML tree.
 *
 * yaml_tree.c turns YAML text into a tree of gp_ynode (null, scalar, map,
 * sequence), each node carrying the 1-based line and column where it
 * starts; `--set` overrides are applied to that tree (nodes they create
 * carry the override text in `set`); config.c then walks the tree into the
 * plain structs of config.h.  No libyaml type appears here, so the walker
 * and the tests never see one.
 *
 * Memory: a tree owns all its nodes and strings; gp_ynode_free releases a
 * node and everything below it.  Map keys are scalar nodes, values live in
 * `items` at the same index.
 * Thread safety: pure functions over their arguments.
 */
#ifndef GP_CONFIG_IMPL_H
#define GP_CONFIG_IMPL_H

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
 * An empty document gives *out = a null node. */
gp_status gp_ytree_parse(const char *name, const char *set, const char *text,
                         size_t len, gp_ynode **out);
void gp_ynode_free(gp_ynode *n);

/* Apply one override "a.b.c=value" to the tree rooted at *root (which may
 * be replaced).  Map keys are created as needed; a sequence is indexed by a
 * number (index == length appends); under model.layers.<i> a key that is
 * not the layer's type addresses the layer's options, so
 * "model.layers.3.out=128" works for `- linear: {out: 64}` and for a bare
 * `- relu` alike. */
gp_status gp_ytree_override(gp_ynode **root, const char *set);

/* The value of `key` in map `m` (NULL if absent or m is not a map). */
gp_ynode *gp_ymap_get(const gp_ynode *m, const char *key);
/* The key node of `key` in map `m` (for positions), or NULL. */
gp_ynode *gp_ymap_key(const gp_ynode *m, const char *key);

/* "name:line:column" or "--set <set>" for messages. */
const char *gp_yloc(const char *name, const gp_ynode *n, char *buf, size_t len);

/* Restricted Damerau-Levenshtein distance (optimal string alignment),
 * capped at 99 for long strings. */
int gp_edit_distance(const char *a, const char *b);

#endif /* GP_CONFIG_IMPL_H */
