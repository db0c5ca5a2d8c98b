/*
 * json.c — the JSON reader and writer of json.h.
 *
 * The reader never reads past text + len and never trusts a length it has
 * not checked: it parses files from outside (safetensors headers, fuzzed
 * through tests/fuzz/fuzz_safetensors.c; profiles).
 */
#include "core/json.h"
#include "core/core.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- reader: bytes ---------------------------------------------------------- */

void gp_json_reader_init(gp_json_reader *r, const char *text, size_t len)
{
    memset(r, 0, sizeof *r);
    r->text = text;
    r->len = len;
}

static void skip_ws(gp_json_reader *r)
{
    while (r->pos < r->len) {
        char c = r->text[r->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        r->pos++;
    }
}

/* The next byte, or 0 at the end (a NUL inside the text is never valid
 * where this is asked, so it may stand for both). */
static char next_byte(const gp_json_reader *r) { return r->pos < r->len ? r->text[r->pos] : 0; }

static bool fail_v(gp_json_reader *r, const char *fmt, va_list ap)
{
    if (r->err[0]) return false;
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    if (!r->err[0]) snprintf(r->err, sizeof r->err, "error");
    r->err_at = r->pos;
    return false;
}

bool gp_json_fail(gp_json_reader *r, const char *fmt, ...)
{
    if (r->err[0]) return false;
    skip_ws(r);
    va_list ap;
    va_start(ap, fmt);
    fail_v(r, fmt, ap);
    va_end(ap);
    return false;
}

/* Internal errors: at r->pos as it stands. */
static bool fail(gp_json_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(gp_json_reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(r, fmt, ap);
    va_end(ap);
    return false;
}

/* "expected X" or, at the end, "unexpected end of input, expected X". */
static bool expected(gp_json_reader *r, const char *what)
{
    if (r->pos >= r->len) return fail(r, "unexpected end of input, expected %s", what);
    return fail(r, "expected %s", what);
}

void gp_json_where(const gp_json_reader *r, size_t offset, int *line, int *column)
{
    int l = 1, c = 1;
    for (size_t i = 0; i < offset && i < r->len; i++) {
        if (r->text[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *column = c;
}

gp_json_kind gp_json_peek(gp_json_reader *r)
{
    if (r->err[0]) return GP_JSON_NONE;
    skip_ws(r);
    char c = next_byte(r);
    switch (c) {
    case '{': return GP_JSON_OBJECT;
    case '[': return GP_JSON_ARRAY;
    case '"': return GP_JSON_STRING;
    case 't': return GP_JSON_TRUE;
    case 'f': return GP_JSON_FALSE;
    case 'n': return GP_JSON_NULL;
    default: return c == '-' || (c >= '0' && c <= '9') ? GP_JSON_NUMBER : GP_JSON_NONE;
    }
}

bool gp_json_at_end(gp_json_reader *r)
{
    if (r->err[0]) return false;
    skip_ws(r);
    return r->pos == r->len;
}

/* ---- reader: containers ------------------------------------------------------ */

static bool enter(gp_json_reader *r, char open, const char *what)
{
    if (r->err[0]) return false;
    skip_ws(r);
    if (next_byte(r) != open) return expected(r, what);
    if (r->depth >= GP_JSON_MAX_DEPTH)
        return fail(r, "nested more than %d deep", GP_JSON_MAX_DEPTH);
    r->pos++;
    r->depth++;
    r->first = true;
    return true;
}

bool gp_json_enter_object(gp_json_reader *r) { return enter(r, '{', "an object"); }
bool gp_json_enter_array(gp_json_reader *r) { return enter(r, '[', "a list"); }

/* Before the next item of a container closed by `close`: true if one
 * follows, false at the close (consumed) or on an error.  After a ',' the
 * close is an error (no trailing commas). */
static bool next(gp_json_reader *r, char close)
{
    if (r->err[0]) return false;
    GP_ASSERT(r->depth > 0); /* asked for an item outside any container */
    skip_ws(r);
    char c = next_byte(r);
    if (c == close) {
        r->pos++;
        r->depth--;
        r->first = false; /* the container is a finished item of its parent */
        return false;
    }
    if (!r->first) {
        if (c != ',') return expected(r, close == '}' ? "',' or '}'" : "',' or ']'");
        r->pos++;
    }
    r->first = false;
    return true;
}

bool gp_json_next_member(gp_json_reader *r, char **key)
{
    *key = NULL;
    if (!next(r, '}')) return false;
    skip_ws(r);
    if (next_byte(r) != '"') return expected(r, "a string key");
    if (!gp_json_read_string(r, key)) return false;
    skip_ws(r);
    if (next_byte(r) != ':') {
        free(*key);
        *key = NULL;
        return expected(r, "':' after a key");
    }
    r->pos++;
    return true;
}

bool gp_json_next_item(gp_json_reader *r) { return next(r, ']'); }

/* ---- reader: scalars ----------------------------------------------------------- */

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Four hex digits at r->pos (bounded by `end`). */
static bool read_hex4(gp_json_reader *r, size_t end, unsigned *out)
{
    if (end - r->pos < 4) return false;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_digit(r->text[r->pos + (size_t)i]);
        if (h < 0) return false;
        v = v << 4 | (unsigned)h;
    }
    r->pos += 4;
    *out = v;
    return true;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* One escape after its '\' (r->pos at the letter), decoded to o + *n;
 * the string's closing quote is at `end`. */
static bool read_escape(gp_json_reader *r, size_t end, char *o, size_t *n)
{
    char e = r->text[r->pos++];
    char c = 0;
    switch (e) {
    case '"': case '\\': case '/': c = e; break;
    case 'b': c = '\b'; break;
    case 'f': c = '\f'; break;
    case 'n': c = '\n'; break;
    case 'r': c = '\r'; break;
    case 't': c = '\t'; break;
    case 'u': break;
    default:
        r->pos--;
        if (e > ' ' && e < 0x7f) return fail(r, "bad escape '\\%c' in a string", e);
        return fail(r, "bad escape in a string");
    }
    if (c) {
        o[(*n)++] = c;
        return true;
    }
    unsigned cp, lo;
    if (!read_hex4(r, end, &cp)) return fail(r, "bad \\u escape (it needs four hex digits)");
    if (cp >= 0xdc00 && cp < 0xe000) return fail(r, "unpaired surrogate in \\u escape");
    if (cp >= 0xd800 && cp < 0xdc00) {
        if (end - r->pos < 6 || r->text[r->pos] != '\\' || r->text[r->pos + 1] != 'u')
            return fail(r, "unpaired surrogate in \\u escape");
        r->pos += 2;
        if (!read_hex4(r, end, &lo) || lo < 0xdc00 || lo > 0xdfff)
            return fail(r, "unpaired surrogate in \\u escape");
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    if (cp == 0) return fail(r, "\\u0000 in a string (strings here are C strings)");
    *n += put_utf8(o + *n, cp);
    return true;
}

/* The length of the UTF-8 sequence at t[0..n) (n >= 1, t[0] >= 0x80), or
 * 0 where it is not one: a stray continuation byte, a lead byte without
 * its continuations, an overlong form, a surrogate or past U+10FFFF
 * (RFC 3629's table, which Python's and Rust's decoders follow). */
static size_t utf8_len(const unsigned char *t, size_t n)
{
    unsigned char c = t[0];
    size_t k = c >= 0xc2 && c <= 0xdf   ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
    if (k == 0 || n < k) return 0;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (c == 0xe0) lo = 0xa0;           /* (overlong) */
    else if (c == 0xed) hi = 0x9f;      /* (surrogates) */
    else if (c == 0xf0) lo = 0x90;      /* (overlong) */
    else if (c == 0xf4) hi = 0x8f;      /* (past U+10FFFF) */
    if (t[1] < lo || t[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if (t[i] < 0x80 || t[i] > 0xbf) return 0;
    return k;
}

bool gp_json_read_string(gp_json_reader *r, char **out)
{
    *out = NULL;
    if (r->err[0]) return false;
    skip_ws(r);
    if (next_byte(r) != '"') return expected(r, "a string");
    /* Find the closing quote first: an escape takes the byte after its
     * '\', so an escaped quote does not end the string.  Decoding never
     * grows the text (6 bytes of \uXXXX give at most 3, 12 of a surrogate
     * pair 4), so the raw length bounds the copy. */
    size_t begin = r->pos + 1, end = begin;
    while (end < r->len && r->text[end] != '"') end += r->text[end] == '\\' ? 2 : 1;
    if (end >= r->len) return fail(r, "unterminated string");
    char *s = malloc(end - begin + 1);
    if (!s) {
        r->oom = true;
        return fail(r, "out of memory reading a string of %zu bytes", end - begin);
    }
    size_t n = 0;
    r->pos = begin;
    while (r->pos < end) {
        unsigned char c = (unsigned char)r->text[r->pos];
        if (c < 0x20) {
            free(s);
            return fail(r, "control character 0x%02x in a string (write it as an escape)", c);
        }
        if (c >= 0x80) { /* JSON text is UTF-8 (RFC 8259, 8.1) */
            size_t k = utf8_len((const unsigned char *)r->text + r->pos, end - r->pos);
            if (!k) {
                free(s);
                return fail(r, "byte 0x%02x in a string is not UTF-8 (JSON text is UTF-8)", c);
            }
            memcpy(s + n, r->text + r->pos, k);
            n += k;
            r->pos += k;
            continue;
        }
        r->pos++;
        if (c != '\\') {
            s[n++] = (char)c;
            continue;
        }
        if (!read_escape(r, end, s, &n)) {
            free(s);
            return false;
        }
    }
    GP_ASSERT(r->pos == end && n <= end - begin);
    r->pos = end + 1;
    s[n] = '\0';
    *out = s;
    return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool gp_json_read_number(gp_json_reader *r, double *out)
{
    if (r->err[0]) return false;
    skip_ws(r);
    size_t begin = r->pos;
    if (next_byte(r) == '-') r->pos++;
    if (!is_digit(next_byte(r))) {
        r->pos = begin;
        return expected(r, "a number");
    }
    if (next_byte(r) == '0') {
        r->pos++;
        if (is_digit(next_byte(r))) return fail(r, "leading zero in a number");
    } else {
        while (is_digit(next_byte(r))) r->pos++;
    }
    if (next_byte(r) == '.') {
        r->pos++;
        if (!is_digit(next_byte(r))) return expected(r, "a digit after '.'");
        while (is_digit(next_byte(r))) r->pos++;
    }
    if (next_byte(r) == 'e' || next_byte(r) == 'E') {
        r->pos++;
        if (next_byte(r) == '+' || next_byte(r) == '-') r->pos++;
        if (!is_digit(next_byte(r))) return expected(r, "a digit in the exponent");
        while (is_digit(next_byte(r))) r->pos++;
    }
    /* strtod needs a NUL-terminated copy; no double needs more digits than
     * this to be read exactly enough. */
    char buf[128];
    size_t n = r->pos - begin;
    if (n >= sizeof buf) {
        r->pos = begin;
        return fail(r, "number of %zu characters is too long (at most %zu)", n, sizeof buf - 1);
    }
    memcpy(buf, r->text + begin, n);
    buf[n] = '\0';
    double v = strtod(buf, NULL);
    if (isinf(v)) {
        r->pos = begin;
        return fail(r, "number %s is out of range", buf);
    }
    *out = v;
    return true;
}

bool gp_json_read_uint(gp_json_reader *r, uint64_t *out)
{
    if (r->err[0]) return false;
    skip_ws(r);
    if (!is_digit(next_byte(r))) return expected(r, "a non-negative integer");
    size_t begin = r->pos;
    uint64_t v = 0;
    while (is_digit(next_byte(r))) {
        unsigned d = (unsigned)(r->text[r->pos] - '0');
        if (v > (UINT64_MAX - d) / 10) {
            r->pos = begin;
            return fail(r, "integer out of range (more than 2^64 - 1)");
        }
        v = v * 10 + d;
        r->pos++;
    }
    if (r->pos - begin > 1 && r->text[begin] == '0') {
        r->pos = begin;
        return fail(r, "leading zero in a number");
    }
    char c = next_byte(r);
    if (c == '.' || c == 'e' || c == 'E') return fail(r, "expected an integer, got a fraction");
    *out = v;
    return true;
}

/* The literal `word` (true, false, null). */
static bool literal(gp_json_reader *r, const char *word)
{
    if (r->err[0]) return false;
    skip_ws(r);
    size_t n = strlen(word);
    if (r->len - r->pos < n || memcmp(r->text + r->pos, word, n)) return expected(r, word);
    r->pos += n;
    return true;
}

bool gp_json_read_bool(gp_json_reader *r, bool *out)
{
    gp_json_kind k = gp_json_peek(r);
    if (k != GP_JSON_TRUE && k != GP_JSON_FALSE)
        return r->err[0] ? false : expected(r, "true or false");
    if (!literal(r, k == GP_JSON_TRUE ? "true" : "false")) return false;
    *out = k == GP_JSON_TRUE;
    return true;
}

bool gp_json_read_null(gp_json_reader *r) { return literal(r, "null"); }

/* ---- the tree ------------------------------------------------------------------- */

static void clear_value(gp_json_value *v)
{
    for (int i = 0; i < v->n; i++) {
        clear_value(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

void gp_json_value_free(gp_json_value *v)
{
    if (!v) return;
    clear_value(v);
    free(v);
}

/* Room for item n of a container (and its key in an object): the arrays
 * double whenever n reaches a power of two. */
static bool make_room(gp_json_reader *r, gp_json_value *v, bool with_key)
{
    int n = v->n;
    if (n > 0 && (n & (n - 1))) return true;
    if (n >= INT32_MAX / 2) return fail(r, "more than %d items in one container", INT32_MAX / 2);
    size_t cap = n ? 2 * (size_t)n : 1;
    gp_json_value *items = realloc(v->items, cap * sizeof *items);
    if (items) v->items = items;
    if (items && with_key) {
        char **keys = realloc(v->keys, cap * sizeof *keys);
        if (keys) v->keys = keys;
        else items = NULL;
    }
    if (!items) {
        r->oom = true;
        return fail(r, "out of memory");
    }
    return true;
}

/* Depth is bounded by gp_json_enter_*, which refuse to go past
 * GP_JSON_MAX_DEPTH, so the recursion is too. */
static bool read_into(gp_json_reader *r, gp_json_value *v)
{
    memset(v, 0, sizeof *v);
    v->kind = gp_json_peek(r);
    v->offset = r->pos;
    bool b;
    switch (v->kind) {
    case GP_JSON_NONE: return r->err[0] ? false : expected(r, "a value");
    case GP_JSON_NULL: return gp_json_read_null(r);
    case GP_JSON_TRUE:
    case GP_JSON_FALSE:
        if (!gp_json_read_bool(r, &b)) return false;
        v->kind = b ? GP_JSON_TRUE : GP_JSON_FALSE;
        return true;
    case GP_JSON_NUMBER: return gp_json_read_number(r, &v->num);
    case GP_JSON_STRING: return gp_json_read_string(r, &v->str);
    case GP_JSON_ARRAY:
        if (!gp_json_enter_array(r)) return false;
        while (gp_json_next_item(r)) {
            if (!make_room(r, v, false)) return false;
            /* counted before it is read, so a half-read item is freed too */
            if (!read_into(r, &v->items[v->n++])) return false;
        }
        return !r->err[0];
    case GP_JSON_OBJECT: {
        if (!gp_json_enter_object(r)) return false;
        char *key;
        while (gp_json_next_member(r, &key)) {
            if (!make_room(r, v, true)) {
                free(key);
                return false;
            }
            v->keys[v->n] = key;
            if (!read_into(r, &v->items[v->n++])) return false;
        }
        return !r->err[0];
    }
    }
    return false;
}

gp_json_value *gp_json_read_value(gp_json_reader *r)
{
    if (r->err[0]) return NULL;
    gp_json_value *v = malloc(sizeof *v);
    if (!v) {
        r->oom = true;
        fail(r, "out of memory");
        return NULL;
    }
    if (!read_into(r, v)) {
        gp_json_value_free(v);
        return NULL;
    }
    return v;
}

gp_json_value *gp_json_parse(const char *text, size_t len, gp_json_reader *r)
{
    gp_json_reader_init(r, text, len);
    gp_json_value *v = gp_json_read_value(r);
    if (v && !gp_json_at_end(r)) {
        if (!r->err[0]) fail(r, "more after the end of the JSON value");
        gp_json_value_free(v);
        return NULL;
    }
    return v;
}

const gp_json_value *gp_json_get(const gp_json_value *o, const char *key)
{
    if (!o || o->kind != GP_JSON_OBJECT) return NULL;
    for (int i = o->n - 1; i >= 0; i--) /* the last, as Python's json and serde_json take it */
        if (!strcmp(o->keys[i], key)) return &o->items[i];
    return NULL;
}

/* ---- the writer -------------------------------------------------------------------- */

static void put(gp_json_writer *w, const char *p, size_t n)
{
    if (w->oom) return;
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n + 1) cap *= 2;
        char *t = realloc(w->text, cap);
        if (!t) {
            w->oom = true;
            return;
        }
        w->text = t;
        w->cap = cap;
    }
    memcpy(w->text + w->len, p, n);
    w->len += n;
    w->text[w->len] = '\0';
}

static void put_s(gp_json_writer *w, const char *s) { put(w, s, strlen(s)); }

static void put_indent(gp_json_writer *w, int level)
{
    put(w, "\n", 1);
    for (int i = 0; i < level; i++) put(w, "  ", 2);
}

static void put_escaped(gp_json_writer *w, const char *s)
{
    put(w, "\"", 1);
    const char *run = s; /* bytes that need no escape are copied in runs */
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x80) {
            /* a whole UTF-8 character goes as it is; a byte that is none
             * (a name cut inside one by a fixed buffer) as U+FFFD, so
             * that what gpipe writes its own reader (and Python's) reads */
            size_t k = utf8_len((const unsigned char *)s, strnlen(s, 4));
            if (k) {
                s += k - 1;
                continue;
            }
            put(w, run, (size_t)(s - run));
            run = s + 1;
            put(w, "\xef\xbf\xbd", 3);
            continue;
        }
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(w, run, (size_t)(s - run));
        run = s + 1;
        char e[8];
        switch (c) {
        case '"': put(w, "\\\"", 2); break;
        case '\\': put(w, "\\\\", 2); break;
        case '\b': put(w, "\\b", 2); break;
        case '\f': put(w, "\\f", 2); break;
        case '\n': put(w, "\\n", 2); break;
        case '\r': put(w, "\\r", 2); break;
        case '\t': put(w, "\\t", 2); break;
        default:
            snprintf(e, sizeof e, "\\u%04x", c);
            put(w, e, 6);
        }
    }
    put(w, run, (size_t)(s - run));
    put(w, "\"", 1);
}

/* Separator, line break and key before a value (`container`: an object or
 * array).  Values at the top level are separated by nothing (the caller
 * writes what goes between). */
static void before(gp_json_writer *w, const char *key, bool container)
{
    int d = w->depth;
    bool in_object = d > 0 && !w->array[d - 1];
    GP_ASSERT(in_object == (key != NULL)); /* keys in objects, and only there */
    if (d == 0) return;
    if (w->comma) put(w, ",", 1);
    /* within `pretty`, an object's members go on lines of their own, and
     * an array's items if they are containers: [1, 2, 3] stays on one */
    else w->lines[d - 1] = d <= w->pretty && (in_object || container);
    if (w->lines[d - 1]) put_indent(w, d);
    if (key) {
        put_escaped(w, key);
        put_s(w, w->lines[d - 1] ? ": " : ":");
    }
}

static void open_container(gp_json_writer *w, const char *key, bool array)
{
    GP_ASSERT(w->depth < GP_JSON_MAX_DEPTH);
    before(w, key, true);
    put(w, array ? "[" : "{", 1);
    w->array[w->depth] = array;
    w->lines[w->depth] = false;
    w->depth++;
    w->comma = false;
}

void gp_json_open_object(gp_json_writer *w, const char *key) { open_container(w, key, false); }
void gp_json_open_array(gp_json_writer *w, const char *key) { open_container(w, key, true); }

void gp_json_close(gp_json_writer *w)
{
    GP_ASSERT(w->depth > 0);
    bool array = w->array[w->depth - 1];
    if (w->comma && w->lines[w->depth - 1]) put_indent(w, w->depth - 1);
    w->depth--;
    put(w, array ? "]" : "}", 1);
    w->comma = true;
}

/* A value already formatted. */
static void put_value(gp_json_writer *w, const char *key, const char *text)
{
    before(w, key, false);
    put_s(w, text);
    w->comma = true;
}

void gp_json_put_str(gp_json_writer *w, const char *key, const char *s)
{
    if (!s) {
        put_value(w, key, "null");
        return;
    }
    before(w, key, false);
    put_escaped(w, s);
    w->comma = true;
}

void gp_json_put_num(gp_json_writer *w, const char *key, double v)
{
    if (!isfinite(v)) {
        put_value(w, key, "null");
        return;
    }
    /* %.17g always reads back exactly; fewer digits do for most values
     * (0.1, not 0.10000000000000001). */
    char buf[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    put_value(w, key, buf);
}

void gp_json_put_fixed(gp_json_writer *w, const char *key, double v, int decimals)
{
    if (!isfinite(v)) {
        put_value(w, key, "null");
        return;
    }
    if (decimals < 0) decimals = 0;
    if (decimals > 17) decimals = 17;
    char buf[340]; /* DBL_MAX has 309 integer digits */
    snprintf(buf, sizeof buf, "%.*f", decimals, v);
    put_value(w, key, buf);
}

void gp_json_put_int(gp_json_writer *w, const char *key, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    put_value(w, key, buf);
}

void gp_json_put_uint(gp_json_writer *w, const char *key, uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    put_value(w, key, buf);
}

void gp_json_put_bool(gp_json_writer *w, const char *key, bool v)
{
    put_value(w, key, v ? "true" : "false");
}

void gp_json_put_null(gp_json_writer *w, const char *key) { put_value(w, key, "null"); }

void gp_json_put_raw(gp_json_writer *w, const char *text) { put_s(w, text); }

bool gp_json_flush(gp_json_writer *w, FILE *f)
{
    if (w->oom) return false;
    bool ok = w->len == 0 || fwrite(w->text, 1, w->len, f) == w->len;
    w->len = 0;
    if (w->text) w->text[0] = '\0';
    return ok && !ferror(f);
}

void gp_json_writer_free(gp_json_writer *w)
{
    if (!w) return;
    free(w->text);
    memset(w, 0, sizeof *w);
}

void gp_json_put_float(gp_json_writer *w, const char *key, double v)
{
    float f = (float)v;
    if ((double)f == v)
        for (int p = 1; p <= 9; p++) {
            char b[32];
            snprintf(b, sizeof b, "%.*g", p, v);
            if ((float)strtod(b, NULL) == f) {
                v = strtod(b, NULL);
                break;
            }
        }
    if (v == floor(v) && fabs(v) < 1e15) gp_json_put_fixed(w, key, v, 1);
    else gp_json_put_num(w, key, v);
}
