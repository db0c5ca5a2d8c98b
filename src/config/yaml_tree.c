/*
 * yaml_tree.c — YAML text -> gp_ynode tree with positions, with libyaml's
 * event API; and `--set` overrides applied to such a tree.
 *
 * The builder keeps an explicit stack of open maps and sequences, so depth
 * is bounded (GP_YAML_MAX_DEPTH) and hostile input cannot overflow the C
 * stack.  A map key is appended to its map at once with a NULL value slot
 * that the next node fills, so on any error the partial tree is still one
 * owned tree and one gp_ynode_free releases it.  Anchors and aliases work
 * (an alias is a deep copy of the anchored node, counted against
 * GP_YAML_MAX_NODES so "billion laughs" input fails politely); merge keys
 * ("<<") are not special and are reported as unknown keys later.
 */
#include "config/config_impl.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* ---- nodes ------------------------------------------------------------- */

void gp_ynode_free(gp_ynode *n)
{
    if (!n) return;
    for (int i = 0; i < n->n; i++) {
        if (n->keys) gp_ynode_free(n->keys[i]);
        gp_ynode_free(n->items[i]);
    }
    free(n->keys);
    free(n->items);
    free(n->text);
    free(n);
}

static gp_ynode *ynode_new(gp_ynode_kind kind, int line, int column, const char *set)
{
    gp_ynode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = line;
    n->column = column;
    n->set = set;
    return n;
}

static gp_ynode *ynode_scalar(const char *text, size_t len, int line, int column,
                              const char *set)
{
    gp_ynode *n = ynode_new(GP_YNODE_SCALAR, line, column, set);
    if (!n) return NULL;
    n->text = malloc(len + 1);
    if (!n->text) {
        free(n);
        return NULL;
    }
    memcpy(n->text, text, len);
    n->text[len] = '\0';
    return n;
}

/* Append a child (and, for maps, its key); false if out of memory. */
static bool ynode_push(gp_ynode *parent, gp_ynode *key, gp_ynode *item)
{
    if (parent->n == parent->cap) {
        int cap = parent->cap ? parent->cap * 2 : 4;
        gp_ynode **items = realloc(parent->items, (size_t)cap * sizeof *items);
        if (!items) return false;
        parent->items = items;
        if (parent->kind == GP_YNODE_MAP) {
            gp_ynode **keys = realloc(parent->keys, (size_t)cap * sizeof *keys);
            if (!keys) return false;
            parent->keys = keys;
        }
        parent->cap = cap;
    }
    if (parent->kind == GP_YNODE_MAP) parent->keys[parent->n] = key;
    parent->items[parent->n] = item;
    parent->n++;
    return true;
}

static gp_ynode *ynode_copy(const gp_ynode *src, long *budget)
{
    if (!src || --*budget < 0) return NULL;
    gp_ynode *n = ynode_new(src->kind, src->line, src->column, src->set);
    if (!n) return NULL;
    n->quoted = src->quoted;
    if (src->text && !(n->text = strdup(src->text))) goto fail;
    for (int i = 0; i < src->n; i++) {
        gp_ynode *k = NULL, *v = NULL;
        if (src->kind == GP_YNODE_MAP && !(k = ynode_copy(src->keys[i], budget))) goto fail;
        if (src->items[i] && !(v = ynode_copy(src->items[i], budget))) {
            gp_ynode_free(k);
            goto fail;
        }
        if (!ynode_push(n, k, v)) {
            gp_ynode_free(k);
            gp_ynode_free(v);
            goto fail;
        }
    }
    return n;
fail:
    gp_ynode_free(n);
    return NULL;
}

/* The index of `key` in map m; -1 if absent or m is not a map. */
static int ymap_find(const gp_ynode *m, const char *key)
{
    if (!m || m->kind != GP_YNODE_MAP) return -1;
    for (int i = 0; i < m->n; i++)
        if (m->keys[i] && m->keys[i]->text && !strcmp(m->keys[i]->text, key)) return i;
    return -1;
}

gp_ynode *gp_ymap_get(const gp_ynode *m, const char *key)
{
    int i = ymap_find(m, key);
    return i < 0 ? NULL : m->items[i];
}

gp_ynode *gp_ymap_key(const gp_ynode *m, const char *key)
{
    int i = ymap_find(m, key);
    return i < 0 ? NULL : m->keys[i];
}

const char *gp_ynode_set_within(const gp_ynode *n)
{
    if (!n) return NULL;
    if (n->set) return n->set;
    for (int i = 0; i < n->n; i++) {
        const char *s = gp_ynode_set_within(n->items[i]);
        if (s) return s;
    }
    return NULL;
}

/* The first override under n (its items, not n) other than `not`. */
static const char *set_inside(const gp_ynode *n, const char *not)
{
    for (int i = 0; n && i < n->n; i++) {
        const gp_ynode *c = n->items[i];
        if (c->set && strcmp(c->set, not)) return c->set;
        const char *s = set_inside(c, not);
        if (s) return s;
    }
    return NULL;
}

const char *gp_yloc(const char *name, const gp_ynode *n, char *buf, size_t len)
{
    /* a list an override wrote, and a later one changed a part of: both */
    const char *later = n && n->set && n->kind != GP_YNODE_MAP ? set_inside(n, n->set) : NULL;
    if (later) {
        const char *opt = gp_opt_name(GP_OPT_SET);
        snprintf(buf, len, "%s %s (as %s %s changed it)", opt, n->set, opt, later);
        return buf;
    }
    /* a list or scalar an override changed a part of (a balance entry);
     * not a map, whose messages (a section's, the document's) are seldom
     * about what an override inside it did */
    return gp_yloc_within(name, n, n && n->kind != GP_YNODE_MAP ? gp_ynode_set_within(n) : NULL,
                          buf, len);
}

const char *gp_yloc_within(const char *name, const gp_ynode *n, const char *within, char *buf,
                           size_t len)
{
    if (n && n->set)
        snprintf(buf, len, "%s %s", gp_opt_name(GP_OPT_SET), n->set);
    else if (within) /* the file's node, with a part an override replaced */
        snprintf(buf, len, "%s:%d:%d (as %s %s changed it)", name ? name : "<config>",
                 n->line, n->column, gp_opt_name(GP_OPT_SET), within);
    else
        snprintf(buf, len, "%s:%d:%d", name ? name : "<config>", n ? n->line : 1,
                 n ? n->column : 1);
    return buf;
}

int gp_edit_distance(const char *a, const char *b)
{
    enum { MAXL = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= MAXL || lb >= MAXL) return 99;
    int d[MAXL + 1][MAXL + 1];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

/* ---- the builder ------------------------------------------------------- */

typedef struct anchor {
    char *name;
    const gp_ynode *node; /* inside the tree being built */
} anchor;

typedef struct builder {
    const char *name;       /* for messages */
    const char *set;        /* override text, or NULL */
    const char *text;       /* the input, for hints */
    size_t len;
    gp_ynode *root;
    gp_ynode *stack[GP_YAML_MAX_DEPTH];
    char *stack_anchor[GP_YAML_MAX_DEPTH]; /* anchor of each open node (owned) */
    int depth;
    anchor *anchors;
    int n_anchors, cap_anchors;
    long budget;            /* nodes still allowed */
    int documents;
    bool alias_or_end;      /* an alias seen, or an explicit document end */
} builder;

/* "name:line:column: " or "--set <set>: " prefix for position (line, col). */
static gp_status build_err(const builder *b, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static gp_status build_err(const builder *b, int line, int col, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (b->set)
        return gp_error_set(GP_ERR_INVALID, "%s %s: %s (at column %d of the value)",
                            gp_opt_name(GP_OPT_SET), b->set, msg, col);
    return gp_error_set(GP_ERR_INVALID, "%s:%d:%d: %s", b->name, line, col, msg);
}

/* The dotted path of the innermost open node, for messages ("pipeline"). */
static void build_path(const builder *b, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int f = 0; f + 1 < b->depth; f++) {
        const gp_ynode *p = b->stack[f];
        char part[96];
        if (p->n == 0) break;
        if (p->kind == GP_YNODE_MAP)
            snprintf(part, sizeof part, "%s%.80s", used ? "." : "",
                     p->keys[p->n - 1]->text ? p->keys[p->n - 1]->text : "");
        else
            snprintf(part, sizeof part, "%s%d", used ? "." : "", p->n - 1);
        size_t pl = strlen(part);
        if (used + pl + 1 > len) break;
        memcpy(buf + used, part, pl + 1);
        used += pl;
    }
}

/* Place a finished or just-opened node into its parent (or as the root).
 * Takes ownership of `node` in every case. */
static gp_status attach(builder *b, gp_ynode *node)
{
    if (b->depth == 0) {
        if (b->root) {
            int line = node->line, col = node->column; /* (read before the free) */
            gp_ynode_free(node);
            return build_err(b, line, col, "unexpected second root node");
        }
        b->root = node;
        return GP_OK;
    }
    gp_ynode *top = b->stack[b->depth - 1];
    if (top->kind == GP_YNODE_SEQ) {
        if (!ynode_push(top, NULL, node)) {
            gp_ynode_free(node);
            return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
        }
        return GP_OK;
    }
    /* A map: either the value slot of the last key is open, or this is a key. */
    if (top->n > 0 && top->items[top->n - 1] == NULL) {
        top->items[top->n - 1] = node;
        return GP_OK;
    }
    int line = node->line, col = node->column;
    if (node->kind != GP_YNODE_SCALAR && node->kind != GP_YNODE_NULL) {
        const char *what = node->kind == GP_YNODE_MAP ? "map" : "list";
        gp_ynode_free(node);
        return build_err(b, line, col, "a map key must be a plain word, not a %s", what);
    }
    if (node->kind == GP_YNODE_NULL && node->text[0] == '\0') {
        gp_ynode_free(node);
        return build_err(b, line, col, "empty map key");
    }
    if (top->n >= GP_YAML_MAX_MAP) {
        gp_ynode_free(node);
        return build_err(b, line, col, "more than %d keys in one map", GP_YAML_MAX_MAP);
    }
    if (!node->quoted && !strcmp(node->text, "<<")) { /* YAML 1.1's merge key */
        gp_ynode_free(node);
        return build_err(b, line, col, "merge keys ('<<: *anchor') are not supported: write the "
                         "keys out, or repeat a whole value with an alias (*anchor)");
    }
    for (int i = 0; i < top->n; i++) {
        if (!strcmp(top->keys[i]->text, node->text)) {
            char path[256];
            build_path(b, path, sizeof path);
            int fl = top->keys[i]->line, fc = top->keys[i]->column;
            gp_status s = build_err(b, line, col,
                                    "duplicate key '%.80s' in %s (first given at line %d, "
                                    "column %d); remove one of them",
                                    node->text, path[0] ? path : "the top level", fl, fc);
            gp_ynode_free(node);
            return s;
        }
    }
    /* keys are always scalars, even `null: 1` */
    node->kind = GP_YNODE_SCALAR;
    if (!ynode_push(top, node, NULL)) {
        gp_ynode_free(node);
        return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
    }
    return GP_OK;
}

static gp_status add_anchor(builder *b, const char *name, const gp_ynode *node)
{
    if (b->n_anchors == b->cap_anchors) {
        int cap = b->cap_anchors ? b->cap_anchors * 2 : 8;
        anchor *a = realloc(b->anchors, (size_t)cap * sizeof *a);
        if (!a) return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
        b->anchors = a;
        b->cap_anchors = cap;
    }
    char *copy = strdup(name);
    if (!copy) return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
    b->anchors[b->n_anchors].name = copy;
    b->anchors[b->n_anchors].node = node;
    b->n_anchors++;
    return GP_OK;
}

static const gp_ynode *find_anchor(const builder *b, const char *name)
{
    for (int i = b->n_anchors - 1; i >= 0; i--) /* the latest definition wins */
        if (!strcmp(b->anchors[i].name, name)) return b->anchors[i].node;
    return NULL;
}

static bool is_null_text(const char *s, size_t len)
{
    return len == 0 || (len == 1 && s[0] == '~') ||
           (len == 4 && (!memcmp(s, "null", 4) || !memcmp(s, "Null", 4) ||
                         !memcmp(s, "NULL", 4)));
}

/* Line and column (1-based) of byte `offset` of the input, counted as
 * libyaml counts its marks (every other message's): columns in
 * characters (a UTF-8 continuation byte adds none), and a line break at
 * \n, \r, \r\n (one), NEL, LS and PS.  Until 2026-12-01 bytes and \n
 * alone: "ééé\xff" was column 16 for character 13, and a file of \r
 * lines was all line 1. */
static void offset_pos(const builder *b, size_t offset, int *line, int *col)
{
    const unsigned char *t = (const unsigned char *)b->text;
    size_t end = offset < b->len ? offset : b->len;
    int l = 1, c = 1;
    for (size_t i = 0; i < end; i++) {
        size_t brk = 0; /* the break's bytes from i */
        if (t[i] == '\n') brk = 1;
        else if (t[i] == '\r') brk = i + 1 < b->len && t[i + 1] == '\n' ? 2 : 1;
        else if (t[i] == 0xC2 && i + 1 < b->len && t[i + 1] == 0x85) brk = 2; /* NEL */
        else if (t[i] == 0xE2 && i + 2 < b->len && t[i + 1] == 0x80 &&
                 (t[i + 2] == 0xA8 || t[i + 2] == 0xA9)) /* LS, PS */
            brk = 3;
        if (brk) {
            if (i + brk > end) break; /* the offset is inside the break */
            l++;
            c = 1;
            i += brk - 1;
        } else if ((t[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static gp_status parser_error(const builder *b, const yaml_parser_t *p)
{
    const char *problem = p->problem ? p->problem : "malformed YAML";
    if (p->error == YAML_MEMORY_ERROR)
        return gp_error_set(GP_ERR_INVALID, "%s: out of memory while reading the config",
                            b->set ? b->set : b->name);
    if (p->error == YAML_READER_ERROR) {
        int line, col;
        offset_pos(b, p->problem_offset, &line, &col);
        if (p->problem_value != -1)
            return build_err(b, line, col, "YAML syntax error: %s (byte #x%X); a config "
                             "must be UTF-8 text", problem, (unsigned)p->problem_value);
        return build_err(b, line, col, "YAML syntax error: %s", problem);
    }
    int line = (int)p->problem_mark.line + 1, col = (int)p->problem_mark.column + 1;
    const char *hint = "";
    if (p->problem_mark.index < b->len && b->text[p->problem_mark.index] == '\t')
        hint = "; YAML cannot indent with tabs, use spaces";
    if (p->context)
        return build_err(b, line, col, "YAML syntax error: %s (%s that starts at line %d, "
                         "column %d)%s", problem, p->context,
                         (int)p->context_mark.line + 1, (int)p->context_mark.column + 1, hint);
    return build_err(b, line, col, "YAML syntax error: %s%s", problem, hint);
}

static gp_status handle_event(builder *b, const yaml_event_t *e, bool *done)
{
    int line = (int)e->start_mark.line + 1, col = (int)e->start_mark.column + 1;
    switch (e->type) {
    case YAML_DOCUMENT_END_EVENT:
        b->alias_or_end |= !e->data.document_end.implicit; /* "..." */
        return GP_OK;
    case YAML_STREAM_START_EVENT:
    case YAML_NO_EVENT:
        return GP_OK;
    case YAML_STREAM_END_EVENT:
        *done = true;
        return GP_OK;
    case YAML_DOCUMENT_START_EVENT:
        if (++b->documents > 1)
            return build_err(b, line, col, "a config is one YAML document; remove the "
                             "second '---' and what follows, or merge them");
        return GP_OK;
    case YAML_ALIAS_EVENT: {
        b->alias_or_end = true;
        const gp_ynode *target = find_anchor(b, (const char *)e->data.alias.anchor);
        if (!target)
            return build_err(b, line, col, "unknown alias '*%.80s' (anchors must be "
                             "defined, and complete, before use)",
                             (const char *)e->data.alias.anchor);
        gp_ynode *copy = ynode_copy(target, &b->budget);
        if (!copy)
            return build_err(b, line, col, "the config expands to more than %d nodes "
                             "(aliases nested too deeply?)", GP_YAML_MAX_NODES);
        copy->line = line; /* report positions of the alias use */
        copy->column = col;
        return attach(b, copy);
    }
    case YAML_SCALAR_EVENT: {
        if (--b->budget < 0)
            return build_err(b, line, col, "the config has more than %d nodes",
                             GP_YAML_MAX_NODES);
        const char *v = (const char *)e->data.scalar.value;
        size_t len = e->data.scalar.length;
        if (memchr(v, '\0', len))
            return build_err(b, line, col, "a value contains a NUL character");
        gp_ynode *n = ynode_scalar(v, len, line, col, b->set);
        if (!n) return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
        n->quoted = e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE &&
                    e->data.scalar.style != YAML_ANY_SCALAR_STYLE;
        if (!n->quoted && is_null_text(v, len)) n->kind = GP_YNODE_NULL;
        const char *anchor_name = (const char *)e->data.scalar.anchor;
        GP_TRY(attach(b, n));
        if (anchor_name) GP_TRY(add_anchor(b, anchor_name, n));
        return GP_OK;
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        if (--b->budget < 0)
            return build_err(b, line, col, "the config has more than %d nodes",
                             GP_YAML_MAX_NODES);
        if (b->depth >= GP_YAML_MAX_DEPTH)
            return build_err(b, line, col, "nested deeper than %d levels",
                             GP_YAML_MAX_DEPTH);
        bool is_map = e->type == YAML_MAPPING_START_EVENT;
        gp_ynode *n = ynode_new(is_map ? GP_YNODE_MAP : GP_YNODE_SEQ, line, col, b->set);
        if (!n) return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
        const yaml_char_t *an = is_map ? e->data.mapping_start.anchor
                                       : e->data.sequence_start.anchor;
        char *anchor_copy = NULL;
        if (an && !(anchor_copy = strdup((const char *)an))) {
            gp_ynode_free(n);
            return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
        }
        gp_status s = attach(b, n);
        if (s != GP_OK) {
            free(anchor_copy);
            return s;
        }
        b->stack_anchor[b->depth] = anchor_copy;
        b->stack[b->depth++] = n;
        return GP_OK;
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT: {
        if (b->depth == 0) return build_err(b, line, col, "unbalanced end of a map or list");
        b->depth--;
        char *an = b->stack_anchor[b->depth];
        b->stack_anchor[b->depth] = NULL;
        gp_status s = GP_OK;
        if (an) s = add_anchor(b, an, b->stack[b->depth]);
        free(an);
        return s;
    }
    }
    return GP_OK;
}

gp_status gp_ytree_parse(const char *name, const char *set, const char *text,
                         size_t len, gp_ynode **out, bool *alias_or_end)
{
    *out = NULL;
    if (alias_or_end) *alias_or_end = false;
    builder b = {.name = name, .set = set, .text = text, .len = len,
                 .budget = GP_YAML_MAX_NODES};
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    gp_status s = GP_OK;
    bool done = false;
    while (!done && s == GP_OK) {
        yaml_event_t e;
        if (!yaml_parser_parse(&p, &e)) {
            s = parser_error(&b, &p);
            break;
        }
        s = handle_event(&b, &e, &done);
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&p);
    for (int i = 0; i < b.n_anchors; i++) free(b.anchors[i].name);
    free(b.anchors);
    for (int i = 0; i < GP_YAML_MAX_DEPTH; i++) free(b.stack_anchor[i]);
    if (s != GP_OK) {
        gp_ynode_free(b.root);
        return s;
    }
    if (!b.root) {
        b.root = ynode_scalar("", 0, 1, 1, set);
        if (!b.root) return gp_error_set(GP_ERR_INVALID, "out of memory while reading the config");
        b.root->kind = GP_YNODE_NULL;
    }
    *out = b.root;
    if (alias_or_end) *alias_or_end = b.alias_or_end;
    return GP_OK;
}

/* ---- overrides ---------------------------------------------------------- */

static gp_status set_err(const char *set, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static gp_status set_err(const char *set, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gp_error_set(GP_ERR_INVALID, "%s %s: %s", gp_opt_name(GP_OPT_SET), set, msg);
}

static bool parse_index(const char *s, int *out)
{
    if (!*s || strlen(s) > 9) return false;
    for (const char *c = s; *c; c++)
        if (*c < '0' || *c > '9') return false;
    *out = atoi(s);
    return true;
}

/* An empty map node made by override `set`, at the override's "position". */
static gp_ynode *set_map(const char *set)
{
    return ynode_new(GP_YNODE_MAP, 1, 1, set);
}

/* Walk/create the path comps[0..nc) from *root; store `val` at the end.
 * Takes ownership of val. */
static gp_status override_apply(gp_ynode **root, const char *set, char **comps, int nc,
                                gp_ynode *val)
{
    gp_ynode **slot = root;
    char path[512] = "";
    for (int i = 0; i < nc; i++) {
        const char *c = comps[i];
        bool last = i == nc - 1;
        /* Under model.layers.<i>, keys other than the type address the
         * layer's options: `- relu` becomes `- relu: {...}`. */
        if (i == 3 && !strcmp(comps[0], "model") && !strcmp(comps[1], "layers")) {
            gp_ynode *item = *slot;
            if (item->kind == GP_YNODE_SCALAR) {
                gp_ynode *m = set_map(set), *opts = set_map(set);
                if (!m || !opts || !ynode_push(m, item, opts)) {
                    gp_ynode_free(m);
                    gp_ynode_free(opts);
                    gp_ynode_free(val);
                    return gp_error_set(GP_ERR_INVALID, "out of memory");
                }
                m->line = item->line;
                m->column = item->column;
                *slot = m;
                slot = &m->items[0];
            } else if (item->kind == GP_YNODE_MAP && item->n == 1 &&
                       strcmp(item->keys[0]->text, c) != 0) {
                slot = &item->items[0];
            }
        }
        gp_ynode *node = *slot;
        if (node->kind == GP_YNODE_NULL) {
            gp_ynode *m = set_map(set);
            if (!m) {
                gp_ynode_free(val);
                return gp_error_set(GP_ERR_INVALID, "out of memory");
            }
            m->line = node->line;
            m->column = node->column;
            gp_ynode_free(node);
            *slot = node = m;
        }
        if (node->kind == GP_YNODE_MAP) {
            int idx = -1;
            for (int k = 0; k < node->n; k++)
                if (!strcmp(node->keys[k]->text, c)) idx = k;
            if (idx < 0) {
                gp_ynode *key = ynode_scalar(c, strlen(c), 1, 1, set);
                gp_ynode *v = last ? val : set_map(set);
                if (!key || !v || !ynode_push(node, key, v)) {
                    gp_ynode_free(key);
                    if (v != val) gp_ynode_free(v);
                    gp_ynode_free(val);
                    return gp_error_set(GP_ERR_INVALID, "out of memory");
                }
                if (last) return GP_OK;
                idx = node->n - 1;
            }
            slot = &node->items[idx];
        } else if (node->kind == GP_YNODE_SEQ) {
            int idx;
            if (!parse_index(c, &idx)) {
                gp_ynode_free(val);
                if (!path[0]) /* the file's top level: no override can mend that */
                    return set_err(set, "the config's top level is a list, not a map with the "
                                   "sections model, pipeline, data and train");
                return set_err(set, "'%s' is a list; address an item by its index, "
                               "like %s.0", path, path);
            }
            if (idx == node->n && last) {
                if (!ynode_push(node, NULL, val)) {
                    gp_ynode_free(val);
                    return gp_error_set(GP_ERR_INVALID, "out of memory");
                }
                return GP_OK;
            }
            if (idx >= node->n) {
                gp_ynode_free(val);
                return set_err(set, "index %d is past the end of '%s', which has %d "
                               "item%s (index %d appends one)", idx, path, node->n,
                               node->n == 1 ? "" : "s", node->n);
            }
            slot = &node->items[idx];
        } else {
            gp_ynode_free(val);
            /* the typed shorthands (optimizer: adamw, schedule: cosine) are
             * {type: ...}: say how to give both */
            bool typed = node->text && (!strcmp(path, "train.optimizer") ||
                                        !strcmp(path, "train.schedule"));
            char v[300], ex[340];
            if (typed) {
                snprintf(v, sizeof v, "%s={type: %.60s, %s: ...}", path, node->text, c);
                return set_err(set, "'%s' is a single value ('%.60s', short for {type: %.60s}), "
                               "not a map; cannot set '%s' inside it: give both as one map, "
                               "%s", path, node->text, node->text, c,
                               gp_opt_value(GP_OPT_SET, v, ex, sizeof ex));
            }
            /* a device given by its name alone: {name: ..., memory: ...} */
            if (node->text && !strncmp(path, "pipeline.devices.", 17) &&
                !strchr(path + 17, '.')) {
                snprintf(v, sizeof v, "%s={name: %.60s, %s: ...}", path, node->text, c);
                return set_err(set, "'%s' is a device given by its name alone ('%.60s'), not a "
                               "map; cannot set '%s' inside it: give it as a map, %s", path,
                               node->text, c, gp_opt_value(GP_OPT_SET, v, ex, sizeof ex));
            }
            return set_err(set, "'%s' is a single value ('%.60s'), not a map; cannot "
                           "set '%s' inside it", path[0] ? path : "the config", node->text ? node->text : "", c);
        }
        size_t pl = strlen(path);
        snprintf(path + pl, sizeof path - pl, "%s%s", pl ? "." : "", c);
    }
    gp_ynode_free(*slot);
    *slot = val;
    return GP_OK;
}

gp_status gp_ytree_override(gp_ynode **root, const char *set)
{
    /* one line: the overrides are kept, written into snapshots and back
     * into configs one per line (gpipe.overrides, gp_config_text_applied) */
    if (strpbrk(set, "\r\n"))
        return set_err(set, "a line break in the value; give it on one line, in YAML's flow "
                       "style (e.g. [a, b] or {k: v})");
    const char *eq = strchr(set, '=');
    if (!eq)
        return set_err(set, "expected key=value, like train.batch_size=128");
    size_t klen = (size_t)(eq - set);
    while (klen > 0 && (set[klen - 1] == ' ' || set[klen - 1] == '\t')) klen--;
    const char *k0 = set;
    while (klen > 0 && (*k0 == ' ' || *k0 == '\t')) {
        k0++;
        klen--;
    }
    if (klen == 0)
        return set_err(set, "missing the key before '=', like train.batch_size=128");
    char *key = malloc(klen + 1);
    if (!key) return gp_error_set(GP_ERR_INVALID, "out of memory");
    memcpy(key, k0, klen);
    key[klen] = '\0';
    /* "train.steps=" would parse as YAML null, "not given", and quietly
     * mean the default: a value was forgotten. */
    /* so would "---" or "..." (YAML's document markers, no value at all) */
    const char *v0 = eq + 1 + strspn(eq + 1, " \t\r\n");
    bool marker = (!strncmp(v0, "---", 3) || !strncmp(v0, "...", 3)) &&
                  v0[3 + strspn(v0 + 3, " \t\r\n")] == '\0';
    if (*v0 == '\0' || marker) {
        const char *ex = gp_cfg_example(key);
        const char *o = gp_opt_name(GP_OPT_SET);
        /* a text key (its example a word: a path, a name) is cleared with
         * an empty string, which the shell needs quoted */
        bool text = ex && ((ex[0] >= 'a' && ex[0] <= 'z') || (ex[0] >= 'A' && ex[0] <= 'Z'));
        char clear[600] = "";
        if (text)
            snprintf(clear, sizeof clear, "; to clear the value the config gives, set an empty "
                     "string: %s '%s=\"\"'", o, key);
        gp_status s = ex ? set_err(set, "empty value; give a value, e.g. %s %s=%s, or leave "
                                   "the %s out for the default%s", o, key, ex, o, clear)
                         : set_err(set, "empty value; give a value after '=', or leave the "
                                   "%s out for the default", o);
        free(key);
        return s;
    }
    char *comps[GP_YAML_MAX_DEPTH];
    int nc = 0;
    gp_status s = GP_OK;
    for (char *p = key;;) {
        char *dot = strchr(p, '.');
        if (dot) *dot = '\0';
        if (!*p) {
            s = set_err(set, "empty part in the key '%.*s' (two dots in a row, or a "
                        "leading or trailing dot)", (int)klen, k0);
            break;
        }
        if (nc == GP_YAML_MAX_DEPTH) {
            s = set_err(set, "the key has more than %d parts", GP_YAML_MAX_DEPTH);
            break;
        }
        comps[nc++] = p;
        if (!dot) break;
        p = dot + 1;
    }
    gp_ynode *val = NULL;
    if (s == GP_OK)
        s = gp_ytree_parse(gp_opt_name(GP_OPT_SET), set, eq + 1, strlen(eq + 1), &val, NULL);
    if (s == GP_OK) {
        if (!*root) {
            *root = set_map(set);
            if (!*root) s = gp_error_set(GP_ERR_INVALID, "out of memory");
        }
    }
    if (s == GP_OK) {
        s = override_apply(root, set, comps, nc, val);
        val = NULL;
    }
    gp_ynode_free(val);
    free(key);
    return s;
}
