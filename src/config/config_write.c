/*
 * config_write.c — a config's YAML with its `--set` overrides written in,
 * for tools that write a config back (gpipe-balance --write): what they
 * write must train as the run they were given, overrides included.
 *
 * The top-level sections no override touches are copied as written
 * (comments and layout kept); each touched section is written again from
 * the overridden tree, after them, in block style (maps and sequences
 * nested in a sequence in flow style); a section the caller drops (the one
 * it writes itself) is left out.  A scalar is written plain where plain
 * YAML reads it back as the same text, else double-quoted, and always
 * quoted where it was quoted.
 */
#include "config/config_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A character at p (UTF-8) that YAML does not take as it is inside a
 * double-quoted scalar: the line breaks NEL, LS and PS, which a reader
 * folds, and the C1 controls, the BOM and U+FFFE / U+FFFF, which it
 * refuses as unprintable.  Its escape into esc, and its length in bytes;
 * 0 for any other character. */
static int special(const unsigned char *p, char esc[8])
{
    if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
        if (p[1] == 0x85) snprintf(esc, 8, "\\N");
        else snprintf(esc, 8, "\\x%02x", p[1]);
        return 2;
    }
    if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
        snprintf(esc, 8, p[2] == 0xa8 ? "\\L" : "\\P");
        return 3;
    }
    if (p[0] == 0xef && ((p[1] == 0xbb && p[2] == 0xbf) || (p[1] == 0xbf && p[2] >= 0xbe))) {
        snprintf(esc, 8, "\\u%s", p[1] == 0xbb ? "FEFF" : p[2] == 0xbe ? "FFFE" : "FFFF");
        return 3;
    }
    return 0;
}

/* Whether t reads back as the same plain scalar (in a flow collection when
 * `flow`). */
static bool plain_ok(const char *t, bool flow)
{
    size_t n = strlen(t);
    if (n == 0 || t[0] == ' ' || t[n - 1] == ' ' || t[n - 1] == ':') return false;
    if (strchr("?:-", t[0]) && (t[1] == ' ' || t[1] == '\0')) return false;
    if (strchr(",[]{}#&*!|>'\"%@`", t[0])) return false;
    if (strstr(t, ": ") || strstr(t, " #")) return false;
    char esc[8];
    for (const char *p = t; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f || special((const unsigned char *)p, esc))
            return false;
        if (flow && strchr(",[]{}", *p)) return false;
    }
    return true;
}

static void put_scalar(FILE *o, const gp_ynode *n, bool flow)
{
    if (n->kind == GP_YNODE_NULL) {
        fputs("null", o);
        return;
    }
    const char *t = n->text ? n->text : "";
    if (!n->quoted && plain_ok(t, flow)) {
        fputs(t, o);
        return;
    }
    fputc('"', o);
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) {
        char esc[8];
        int k = special(p, esc);
        if (k) {
            fputs(esc, o);
            p += k - 1;
            continue;
        }
        if (*p == '"' || *p == '\\') fprintf(o, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", o);
        else if (*p == '\t') fputs("\\t", o);
        else if (*p < 0x20 || *p == 0x7f) fprintf(o, "\\x%02x", *p);
        else fputc(*p, o);
    }
    fputc('"', o);
}

static void put_flow(FILE *o, const gp_ynode *n)
{
    if (n->kind == GP_YNODE_MAP) {
        fputc('{', o);
        for (int i = 0; i < n->n; i++) {
            if (i) fputs(", ", o);
            put_scalar(o, n->keys[i], true);
            fputs(": ", o);
            put_flow(o, n->items[i]);
        }
        fputc('}', o);
    } else if (n->kind == GP_YNODE_SEQ) {
        fputc('[', o);
        for (int i = 0; i < n->n; i++) {
            if (i) fputs(", ", o);
            put_flow(o, n->items[i]);
        }
        fputc(']', o);
    } else {
        put_scalar(o, n, true);
    }
}

/* n as the value after "key:" at `indent` (its entries one level deeper). */
static void put_value(FILE *o, const gp_ynode *n, int indent)
{
    bool coll = n->kind == GP_YNODE_MAP || n->kind == GP_YNODE_SEQ, flat = true;
    for (int i = 0; coll && n->kind == GP_YNODE_SEQ && i < n->n; i++)
        flat &= n->items[i]->kind == GP_YNODE_SCALAR || n->items[i]->kind == GP_YNODE_NULL;
    if (!coll || n->n == 0 || (n->kind == GP_YNODE_SEQ && flat)) { /* [1, 28, 28] */
        fputc(' ', o);
        put_flow(o, n);
        fputc('\n', o);
        return;
    }
    fputc('\n', o);
    for (int i = 0; i < n->n; i++) {
        fprintf(o, "%*s", indent + 2, "");
        if (n->kind == GP_YNODE_SEQ) {
            fputs("- ", o);
            put_flow(o, n->items[i]);
            fputc('\n', o);
        } else {
            put_scalar(o, n->keys[i], false);
            fputc(':', o);
            put_value(o, n->items[i], indent + 2);
        }
    }
}

/* The top-level key an override "a.b=v" sets, into key. */
static void set_top(const char *set, char *key, size_t len)
{
    size_t k = strcspn(set, ".=");
    while (k > 0 && isspace((unsigned char)set[k - 1])) k--;
    const char *s = set;
    while (k > 0 && isspace((unsigned char)*s)) s++, k--;
    if (k >= len) k = len - 1;
    memcpy(key, s, k);
    key[k] = '\0';
}

#define MAX_TOUCHED 64

/* Whether the file's lines can be copied section by section: every
 * top-level key plain, at the start of its line and below the one before
 * (a section runs from its key's line to the next key's), lines that end
 * in LF (or CR LF) and no other line break, no alias (a section written
 * from the tree holds the anchored value's copy and no anchor, which a
 * copied one may name) and no "..." (the sections written after it would
 * be a second document): alias_or_end, as gp_ytree_parse saw the text.
 * Otherwise the config is written whole from the tree (its comments and
 * layout lost, its content kept). */
static bool layout_kept(const char *text, const gp_ynode *root, bool alias_or_end)
{
    if (root->kind != GP_YNODE_MAP) return root->kind == GP_YNODE_NULL;
    for (int i = 0; i < root->n; i++) {
        const gp_ynode *k = root->keys[i];
        if (k->column != 1 || k->quoted || !k->text || strchr(k->text, ':') ||
            (i > 0 && k->line <= root->keys[i - 1]->line))
            return false;
    }
    for (const char *p = text; *p; p++)
        if (*p == '\r' && p[1] != '\n') return false;
    /* NEL, LS and PS end a line for the parser, and would move its line
     * numbers off the text's LFs */
    if (strstr(text, "\xc2\x85") || strstr(text, "\xe2\x80\xa8") || strstr(text, "\xe2\x80\xa9"))
        return false;
    return !alias_or_end;
}

/* A top-level key of the file and the line it starts on, as the parser
 * placed it: the file's lines are copied section by section by these. */
typedef struct section {
    int line;
    char *key; /* owned */
} section;

static void sections_free(section *sec, int n)
{
    for (int i = 0; sec && i < n; i++) free(sec[i].key);
    free(sec);
}

/* The sections of the file's tree root (a map, or a null: none), taken
 * before the overrides change the tree (they add keys, and may replace the
 * root), so that the text is parsed once.  *out NULL where there are none. */
static gp_status sections_of(const gp_ynode *root, section **out, int *n)
{
    *out = NULL;
    *n = 0;
    if (root->kind != GP_YNODE_MAP || root->n == 0) return GP_OK;
    section *sec = calloc((size_t)root->n, sizeof *sec);
    if (!sec) return gp_error_set(GP_ERR_OOM, "out of memory writing a config");
    for (int i = 0; i < root->n; i++) {
        sec[i].line = root->keys[i]->line;
        sec[i].key = strdup(root->keys[i]->text); /* (a text: layout_kept) */
        if (!sec[i].key) {
            sections_free(sec, i);
            return gp_error_set(GP_ERR_OOM, "out of memory writing a config");
        }
    }
    *out = sec;
    *n = root->n;
    return GP_OK;
}

/* The top-level key whose section holds line `ln` (1-based; NULL before
 * the first: the file's opening comments). */
static const char *section_at(const section *sec, int n, int ln)
{
    const char *key = NULL;
    for (int i = 0; i < n; i++)
        if (sec[i].line <= ln) key = sec[i].key;
    return key;
}

gp_status gp_config_text_applied(const gp_config *c, const char *drop, char **out)
{
    *out = NULL;
    const char *text = c->text ? c->text : "";
    gp_ynode *root = NULL;
    bool alias_or_end;
    GP_TRY(gp_ytree_parse(c->path[0] ? c->path : "<config>", NULL, text, strlen(text), &root,
                          &alias_or_end));
    bool keep = layout_kept(text, root, alias_or_end); /* the file's tree, not overridden */
    section *sec = NULL;
    int n_sec = 0;
    gp_status s = keep ? sections_of(root, &sec, &n_sec) : GP_OK;
    char touched[MAX_TOUCHED][64];
    int nt = 0;
    char *ov = s == GP_OK && c->overrides ? strdup(c->overrides) : NULL;
    if (s == GP_OK && c->overrides && !ov)
        s = gp_error_set(GP_ERR_OOM, "out of memory writing a config");
    for (char *line = ov, *next; s == GP_OK && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (!*line) continue;
        s = gp_ytree_override(&root, line);
        char k[64];
        set_top(line, k, sizeof k);
        bool seen = false;
        for (int i = 0; i < nt; i++) seen |= !strcmp(touched[i], k);
        if (s == GP_OK && !seen && nt < MAX_TOUCHED) snprintf(touched[nt++], 64, "%s", k);
    }
    free(ov);
    if (s == GP_OK && root->kind != GP_YNODE_MAP && root->kind != GP_YNODE_NULL)
        s = gp_error_set(GP_ERR_INVALID, "%s: the config is not a mapping", c->path);
    char *buf = NULL;
    size_t blen = 0;
    FILE *o = s == GP_OK ? open_memstream(&buf, &blen) : NULL;
    if (s == GP_OK && !o) s = gp_error_set(GP_ERR_OOM, "out of memory writing a config");
    if (s != GP_OK) {
        gp_ynode_free(root);
        sections_free(sec, n_sec);
        return s;
    }
    if (!keep) {
        fprintf(o, "# written from %s with the overrides applied (its layout could not be kept: "
                   "a top-level key indented, quoted or in flow style, an alias, an explicit "
                   "document end, or line ends other than LF and CR LF)\n",
                c->path[0] ? c->path : "the config");
        for (int i = 0; root->kind == GP_YNODE_MAP && i < root->n; i++) {
            if (drop && !strcmp(root->keys[i]->text ? root->keys[i]->text : "", drop)) continue;
            put_scalar(o, root->keys[i], false);
            fputc(':', o);
            put_value(o, root->items[i], 0);
        }
        nt = 0; /* every section is written: none again below */
    }
    /* the file's lines, less the touched and dropped sections: each from
     * its key's line to the next key's, as the parser placed them (a line
     * at column 1 inside a flow map or a quoted scalar is no key) */
    int ln = 1;
    for (const char *p = text; keep && *p; ln++) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) + 1 : strlen(p);
        const char *key = section_at(sec, n_sec, ln);
        bool skipping = key && drop && !strcmp(key, drop);
        for (int i = 0; key && i < nt; i++) skipping |= !strcmp(key, touched[i]);
        if (!skipping) fwrite(p, 1, n, o);
        if (n && p[n - 1] != '\n' && !skipping) fputc('\n', o);
        p += n;
    }
    /* the touched sections from the overridden tree */
    for (int i = 0; i < nt; i++) {
        if (drop && !strcmp(touched[i], drop)) continue;
        const gp_ynode *v = root->kind == GP_YNODE_MAP ? gp_ymap_get(root, touched[i]) : NULL;
        if (!v) continue;
        fprintf(o, "\n# %s: written with the overrides applied\n", touched[i]);
        fputs(touched[i], o);
        fputc(':', o);
        put_value(o, v, 0);
    }
    gp_ynode_free(root);
    sections_free(sec, n_sec);
    if (fclose(o) != 0 || !buf) {
        free(buf);
        return gp_error_set(GP_ERR_OOM, "out of memory writing a config");
    }
    *out = buf;
    return GP_OK;
}
