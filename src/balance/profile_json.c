/*
 * profile_json.c — a profile to and from JSON (balance.h).
 *
 * A tiny writer and a minimal reader for exactly the JSON this module
 * writes (objects, arrays, strings with \" \\ \n escapes, numbers, true,
 * false, null): no new dependency for one file format.  Unknown keys are
 * ignored so that later versions can add fields; missing required ones are
 * an error naming the key.
 */
#include "balance/balance.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PROFILE_FORMAT "gpipe-profile"
#define PROFILE_VERSION 1

/* ---- writer ---------------------------------------------------------------- */

static void jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if (*s == '\n') fputs("\\n", f);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static void jnum(FILE *f, double v) { fprintf(f, "%.17g", isfinite(v) ? v : 0.0); }

gp_status gp_profile_save(const gp_profile *p, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return gp_error_set(GP_ERR_IO, "cannot write profile '%s': %s; check the directory "
                            "exists and is writable", path, strerror(errno));
    fprintf(f, "{\n  \"format\": \"%s\", \"version\": %d,\n  \"device\": ", PROFILE_FORMAT,
            PROFILE_VERSION);
    jstr(f, p->device);
    fprintf(f, ", \"threads\": %d, \"contend\": %d, \"evict_bytes\": %lld, \"batch\": %lld, "
            "\"chunks\": %d,\n", p->threads, p->contend, (long long)p->evict_bytes,
            (long long)p->batch, p->chunks);
    fprintf(f, "  \"first_trainable\": %d, \"timed\": %s, \"warmup\": %d, \"reps\": %d,\n",
            p->first_trainable, p->timed ? "true" : "false", p->warmup, p->reps);
    fputs("  \"sizes\": [", f);
    for (int z = 0; z < p->n_sizes; z++) fprintf(f, "%s%lld", z ? ", " : "", (long long)p->sizes[z]);
    fputs("],\n  \"loss\": [", f);
    for (int z = 0; z < p->n_sizes; z++) {
        if (z) fputs(", ", f);
        jnum(f, p->loss[z]);
    }
    fputs("],\n  \"upload\": [", f);
    for (int z = 0; z < p->n_sizes; z++) {
        if (z) fputs(", ", f);
        jnum(f, p->upload[z]);
    }
    fputs("],\n  \"layers\": [\n", f);
    for (int k = 0; k < p->L; k++) {
        const gp_layer_mem *m = &p->mem[k];
        fputs("    {\"desc\": ", f);
        jstr(f, m->desc);
        fprintf(f, ", \"param_bytes\": %zu, \"grad_bytes\": %zu, \"optim_bytes\": %zu, "
                   "\"workspace_bytes\": %zu,\n     \"in_per_sample\": ",
                m->param_bytes, m->grad_bytes, m->optim_bytes, m->workspace_bytes);
        jnum(f, m->in_per_sample);
        fputs(", \"out_per_sample\": ", f);
        jnum(f, m->out_per_sample);
        fputs(", \"keep_per_sample\": ", f);
        jnum(f, m->keep_per_sample);
        fputs(", \"flops_per_sample\": ", f);
        jnum(f, m->flops_per_sample);
        fputs(", \"update\": ", f);
        jnum(f, m->update);
        fputs(",\n     \"times\": [", f);
        for (int z = 0; z < p->n_sizes; z++) {
            const gp_layer_times *t = &p->t[(size_t)z * (size_t)p->L + (size_t)k];
            double v[6] = {t->fwd, t->bwd_data, t->bwd_weights, t->bwd_alone, t->recompute,
                           t->copy};
            const char *nm[6] = {"fwd", "bwd_data", "bwd_weights", "bwd_alone", "recompute",
                                 "copy"};
            fputs(z ? ",\n               {" : "{", f);
            for (int q = 0; q < 6; q++) {
                fprintf(f, "%s\"%s\": ", q ? ", " : "", nm[q]);
                jnum(f, v[q]);
            }
            fputc('}', f);
        }
        fprintf(f, "]}%s\n", k + 1 < p->L ? "," : "");
    }
    fputs("  ]\n}\n", f);
    if (fclose(f) != 0)
        return gp_error_set(GP_ERR_IO, "writing profile '%s' failed: %s", path, strerror(errno));
    return GP_OK;
}

/* ---- reader ---------------------------------------------------------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jkind;

typedef struct jnode {
    jkind kind;
    double num;
    char *str;             /* J_STR value; key in the parent object */
    char *key;
    struct jnode **items;  /* J_ARR / J_OBJ */
    int n;
} jnode;

typedef struct {
    const char *s, *end, *path;
    int line;
    char err[160];
} jparser;

static void jfree(jnode *n)
{
    if (!n) return;
    for (int q = 0; q < n->n; q++) jfree(n->items[q]);
    free(n->items);
    free(n->str);
    free(n->key);
    free(n);
}

static void skip_ws(jparser *p)
{
    while (p->s < p->end && isspace((unsigned char)*p->s)) {
        if (*p->s == '\n') p->line++;
        p->s++;
    }
}

static jnode *jfail(jparser *p, const char *what)
{
    if (!p->err[0]) snprintf(p->err, sizeof p->err, "line %d: %s", p->line, what);
    return NULL;
}

static char *parse_string(jparser *p)
{
    if (p->s >= p->end || *p->s != '"') return jfail(p, "expected a string"), NULL;
    p->s++;
    size_t cap = 32, len = 0;
    char *out = malloc(cap);
    while (out && p->s < p->end && *p->s != '"') {
        char c = *p->s++;
        if (c == '\\' && p->s < p->end) {
            char e = *p->s++;
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e;
            if (e == 'u') { /* only what the writer emits: control chars */
                unsigned v = 0;
                for (int q = 0; q < 4 && p->s < p->end; q++, p->s++)
                    v = v * 16 + (unsigned)(isdigit((unsigned char)*p->s) ? *p->s - '0'
                                                                          : (tolower(*p->s) - 'a' + 10));
                c = (char)v;
            }
        }
        if (len + 2 > cap) {
            char *o2 = realloc(out, cap *= 2);
            if (!o2) {
                free(out);
                return NULL;
            }
            out = o2;
        }
        out[len++] = c;
    }
    if (!out) return NULL;
    if (p->s >= p->end) {
        free(out);
        return jfail(p, "unterminated string"), NULL;
    }
    p->s++;
    out[len] = '\0';
    return out;
}

static jnode *parse_value(jparser *p, int depth);

static bool push(jnode *n, jnode *c)
{
    jnode **it = realloc(n->items, (size_t)(n->n + 1) * sizeof *it);
    if (!it) return false;
    n->items = it;
    n->items[n->n++] = c;
    return true;
}

static jnode *parse_value(jparser *p, int depth)
{
    skip_ws(p);
    if (depth > 32) return jfail(p, "nested too deeply");
    if (p->s >= p->end) return jfail(p, "unexpected end of file");
    jnode *n = calloc(1, sizeof *n);
    if (!n) return jfail(p, "out of memory");
    char c = *p->s;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        n->kind = obj ? J_OBJ : J_ARR;
        p->s++;
        skip_ws(p);
        if (p->s < p->end && *p->s == (obj ? '}' : ']')) {
            p->s++;
            return n;
        }
        for (;;) {
            char *key = NULL;
            if (obj) {
                skip_ws(p);
                key = parse_string(p);
                skip_ws(p);
                if (!key || p->s >= p->end || *p->s != ':') {
                    free(key);
                    jfree(n);
                    return jfail(p, "expected \"key\": value");
                }
                p->s++;
            }
            jnode *v = parse_value(p, depth + 1);
            if (!v) {
                free(key);
                jfree(n);
                return NULL;
            }
            v->key = key;
            if (!push(n, v)) {
                jfree(v);
                jfree(n);
                return jfail(p, "out of memory");
            }
            skip_ws(p);
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                continue;
            }
            if (p->s < p->end && *p->s == (obj ? '}' : ']')) {
                p->s++;
                return n;
            }
            jfree(n);
            return jfail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    if (c == '"') {
        n->kind = J_STR;
        n->str = parse_string(p);
        if (!n->str) {
            jfree(n);
            return NULL;
        }
        return n;
    }
    if (!strncmp(p->s, "true", 4) || !strncmp(p->s, "false", 5)) {
        n->kind = J_BOOL;
        n->num = c == 't';
        p->s += c == 't' ? 4 : 5;
        return n;
    }
    if (!strncmp(p->s, "null", 4)) {
        p->s += 4;
        return n;
    }
    char *e;
    n->kind = J_NUM;
    n->num = strtod(p->s, &e);
    if (e == p->s) {
        jfree(n);
        return jfail(p, "expected a value");
    }
    p->s = e;
    return n;
}

static const jnode *jget(const jnode *o, const char *key)
{
    if (!o || o->kind != J_OBJ) return NULL;
    for (int q = 0; q < o->n; q++)
        if (o->items[q]->key && !strcmp(o->items[q]->key, key)) return o->items[q];
    return NULL;
}

typedef struct {
    const char *path;
    gp_status st;
} jctx;

static double jnum_req(jctx *c, const jnode *o, const char *key, const char *where)
{
    const jnode *v = jget(o, key);
    if (c->st != GP_OK) return 0;
    if (!v || (v->kind != J_NUM && v->kind != J_BOOL)) {
        c->st = gp_error_set(GP_ERR_DATA, "profile '%s': %s%s\"%s\" is missing or not a number; "
                             "re-create the profile with gpipe-balance --profile-out",
                             c->path, where, where[0] ? ": " : "", key);
        return 0;
    }
    return v->num;
}

static const jnode *jarr_req(jctx *c, const jnode *o, const char *key, int n, const char *where)
{
    const jnode *v = jget(o, key);
    if (c->st != GP_OK) return NULL;
    if (!v || v->kind != J_ARR || (n >= 0 && v->n != n)) {
        c->st = gp_error_set(GP_ERR_DATA, "profile '%s': %s%s\"%s\" is missing or not a list%s",
                             c->path, where, where[0] ? ": " : "", key,
                             n >= 0 ? " of the right length" : "");
        return NULL;
    }
    return v;
}

gp_status gp_profile_load(const char *path, gp_profile *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return gp_error_set(GP_ERR_IO, "cannot read profile '%s': %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        fclose(f);
        return gp_error_set(GP_ERR_IO, "cannot read profile '%s'", path);
    }
    fclose(f);
    jparser jp = {.s = buf, .end = buf + len, .path = path, .line = 1};
    jnode *root = parse_value(&jp, 0);
    free(buf);
    if (!root)
        return gp_error_set(GP_ERR_DATA, "profile '%s': not valid JSON: %s", path, jp.err);
    jctx c = {path, GP_OK};
    const jnode *fmt = jget(root, "format");
    if (!fmt || fmt->kind != J_STR || strcmp(fmt->str, PROFILE_FORMAT)) {
        jfree(root);
        return gp_error_set(GP_ERR_DATA, "profile '%s': not a gpipe profile (no \"format\": "
                            "\"%s\")", path, PROFILE_FORMAT);
    }
    int version = (int)jnum_req(&c, root, "version", "");
    if (c.st == GP_OK && version != PROFILE_VERSION)
        c.st = gp_error_set(GP_ERR_DATA, "profile '%s' has version %d; this gpipe reads version "
                            "%d: re-create it", path, version, PROFILE_VERSION);
    const jnode *dv = jget(root, "device");
    if (dv && dv->kind == J_STR) snprintf(out->device, sizeof out->device, "%s", dv->str);
    out->threads = (int)jnum_req(&c, root, "threads", "");
    const jnode *cd = jget(root, "contend"); /* absent in files of before 2026-11-22: 0 */
    out->contend = cd && cd->kind == J_NUM ? (int)cd->num : 0;
    const jnode *eb = jget(root, "evict_bytes");
    out->evict_bytes = eb && eb->kind == J_NUM ? (int64_t)eb->num : 0;
    out->batch = (int64_t)jnum_req(&c, root, "batch", "");
    out->chunks = (int)jnum_req(&c, root, "chunks", "");
    out->first_trainable = (int)jnum_req(&c, root, "first_trainable", "");
    out->timed = jnum_req(&c, root, "timed", "") != 0;
    out->warmup = (int)jnum_req(&c, root, "warmup", "");
    out->reps = (int)jnum_req(&c, root, "reps", "");
    const jnode *sizes = jarr_req(&c, root, "sizes", -1, "");
    if (c.st == GP_OK && (sizes->n < 1 || sizes->n > GP_PROFILE_MAX_SIZES))
        c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"sizes\" needs 1..%d entries", path,
                            GP_PROFILE_MAX_SIZES);
    const jnode *loss = NULL, *upload = NULL, *layers = NULL;
    if (c.st == GP_OK) {
        out->n_sizes = sizes->n;
        loss = jarr_req(&c, root, "loss", sizes->n, "");
        upload = jarr_req(&c, root, "upload", sizes->n, "");
        layers = jarr_req(&c, root, "layers", -1, "");
    }
    for (int z = 0; c.st == GP_OK && z < out->n_sizes; z++) {
        out->sizes[z] = (int64_t)sizes->items[z]->num;
        out->loss[z] = loss->items[z]->num;
        out->upload[z] = upload->items[z]->num;
        if (out->sizes[z] < 1 || (z > 0 && out->sizes[z] <= out->sizes[z - 1]))
            c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"sizes\" must be ascending and >= 1",
                                path);
    }
    if (c.st == GP_OK) {
        out->L = layers->n;
        out->mem = calloc((size_t)(out->L ? out->L : 1), sizeof *out->mem);
        out->t = calloc((size_t)(out->L ? out->L : 1) * (size_t)out->n_sizes, sizeof *out->t);
        if (!out->mem || !out->t) c.st = gp_error_set(GP_ERR_OOM, "out of host memory");
        if (out->L < 1) c.st = gp_error_set(GP_ERR_DATA, "profile '%s' has no layers", path);
    }
    for (int k = 0; c.st == GP_OK && k < out->L; k++) {
        char where[32];
        snprintf(where, sizeof where, "layers[%d]", k);
        const jnode *o = layers->items[k];
        gp_layer_mem *m = &out->mem[k];
        const jnode *d = jget(o, "desc");
        if (d && d->kind == J_STR) snprintf(m->desc, sizeof m->desc, "%s", d->str);
        m->param_bytes = (size_t)jnum_req(&c, o, "param_bytes", where);
        m->grad_bytes = (size_t)jnum_req(&c, o, "grad_bytes", where);
        m->optim_bytes = (size_t)jnum_req(&c, o, "optim_bytes", where);
        m->workspace_bytes = (size_t)jnum_req(&c, o, "workspace_bytes", where);
        m->in_per_sample = jnum_req(&c, o, "in_per_sample", where);
        m->out_per_sample = jnum_req(&c, o, "out_per_sample", where);
        m->keep_per_sample = jnum_req(&c, o, "keep_per_sample", where);
        m->flops_per_sample = jnum_req(&c, o, "flops_per_sample", where);
        m->update = jnum_req(&c, o, "update", where);
        const jnode *ts = jarr_req(&c, o, "times", out->n_sizes, where);
        for (int z = 0; c.st == GP_OK && z < out->n_sizes; z++) {
            gp_layer_times *t = &out->t[(size_t)z * (size_t)out->L + (size_t)k];
            const jnode *e = ts->items[z];
            t->fwd = jnum_req(&c, e, "fwd", where);
            t->bwd_data = jnum_req(&c, e, "bwd_data", where);
            t->bwd_weights = jnum_req(&c, e, "bwd_weights", where);
            t->bwd_alone = jnum_req(&c, e, "bwd_alone", where);
            t->recompute = jnum_req(&c, e, "recompute", where);
            t->copy = jnum_req(&c, e, "copy", where);
        }
    }
    jfree(root);
    if (c.st != GP_OK) gp_profile_free(out);
    return c.st;
}
