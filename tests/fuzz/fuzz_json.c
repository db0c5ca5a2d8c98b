/* fuzz_json.c — the JSON reader and writer (core/json.h): whatever parses
 * is written back (compact and pretty) and must parse again to the same
 * tree; whatever fails must say why, at an offset inside the input. */
#include "fuzz_util.h"
#include "core/json.h"

static void write_tree(gp_json_writer *w, const char *key, const gp_json_value *v)
{
    switch (v->kind) {
    case GP_JSON_NULL: gp_json_put_null(w, key); break;
    case GP_JSON_FALSE: gp_json_put_bool(w, key, false); break;
    case GP_JSON_TRUE: gp_json_put_bool(w, key, true); break;
    case GP_JSON_NUMBER: gp_json_put_num(w, key, v->num); break;
    case GP_JSON_STRING: gp_json_put_str(w, key, v->str); break;
    case GP_JSON_ARRAY:
    case GP_JSON_OBJECT:
        if (v->kind == GP_JSON_ARRAY) gp_json_open_array(w, key);
        else gp_json_open_object(w, key);
        for (int i = 0; i < v->n; i++)
            write_tree(w, v->kind == GP_JSON_OBJECT ? v->keys[i] : NULL, &v->items[i]);
        gp_json_close(w);
        break;
    case GP_JSON_NONE: abort();
    }
}

static bool same(const gp_json_value *a, const gp_json_value *b)
{
    if (a->kind != b->kind || a->n != b->n) return false;
    if (a->kind == GP_JSON_NUMBER && a->num != b->num) return false;
    if (a->kind == GP_JSON_STRING && strcmp(a->str, b->str)) return false;
    for (int i = 0; i < a->n; i++) {
        if (a->kind == GP_JSON_OBJECT && strcmp(a->keys[i], b->keys[i])) return false;
        if (!same(&a->items[i], &b->items[i])) return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gp_json_reader r;
    gp_json_value *v = gp_json_parse((const char *)data, size, &r);
    if (!v) {
        if (!r.err[0] || r.err_at > size) abort();
        int line, column;
        gp_json_where(&r, r.err_at, &line, &column);
        if (line < 1 || column < 1) abort();
        return 0;
    }
    for (int pretty = 0; pretty <= 3; pretty += 3) {
        gp_json_writer w = {.pretty = pretty};
        write_tree(&w, NULL, v);
        if (w.oom || w.depth != 0) abort();
        gp_json_reader r2;
        gp_json_value *back = gp_json_parse(w.text, w.len, &r2);
        if (!back || !same(v, back)) abort();
        gp_json_value_free(back);
        gp_json_writer_free(&w);
    }
    gp_json_value_free(v);
    return 0;
}
