/*
 * test_json.c — the JSON reader and writer (core/json.h), and the metrics
 * record that goes through them.
 *
 * Checks:
 *   - writer: escapes (quote, backslash, every control character), UTF-8
 *     passed through, keys escaped too, exact compact and pretty text,
 *     numbers (shortest round trip, fixed decimals, NaN/Inf as null, the
 *     int64/uint64 extremes), several top-level values (JSON Lines);
 *   - reader: decoding (escapes, \u with surrogate pairs to UTF-8), the
 *     tree (nesting, kinds, offsets, first of duplicate keys), the pull
 *     reader walking a known shape, numbers (grammar, range, exact u64);
 *   - errors: each with its message and line:column, nesting limit;
 *   - round trips: every string of a set, and random trees written and
 *     read back equal (oracle: the tree that was written);
 *   - a metrics line whose device name holds a quote and a backslash
 *     parses back to the same name.
 */
#include "core/json.h"
#include "backend/backend.h"
#include "train/train.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------------ */

static gp_json_value *parse_str(const char *text, gp_json_reader *r)
{
    return gp_json_parse(text, strlen(text), r);
}

/* s written as a JSON string and read back. */
static char *round_trip_str(const char *s, char *written, size_t cap)
{
    gp_json_writer w = {0};
    gp_json_put_str(&w, NULL, s);
    snprintf(written, cap, "%s", w.text);
    gp_json_reader r;
    gp_json_reader_init(&r, w.text, w.len);
    char *back = NULL;
    bool ok = gp_json_read_string(&r, &back) && gp_json_at_end(&r);
    gp_json_writer_free(&w);
    if (!ok) {
        free(back);
        return NULL;
    }
    return back;
}

/* ---- the writer ----------------------------------------------------------------- */

static void test_escapes(void)
{
    char out[512];
    char *b = round_trip_str("a\"b\\c/d\n\t\r\b\f", out, sizeof out);
    CHECK_MSG(!strcmp(out, "\"a\\\"b\\\\c/d\\n\\t\\r\\b\\f\""), "%s", out);
    CHECK(b && !strcmp(b, "a\"b\\c/d\n\t\r\b\f"));
    free(b);

    /* every control character, alone and between text */
    for (int c = 1; c < 0x20; c++) {
        char s[4] = {'x', (char)c, 'y', 0};
        b = round_trip_str(s, out, sizeof out);
        CHECK_MSG(b && !strcmp(b, s), "control 0x%02x: written %s", c, out);
        bool raw = false;
        for (const char *p = out; *p; p++) raw = raw || (unsigned char)*p < 0x20;
        CHECK_MSG(!raw, "control 0x%02x written raw", c);
        free(b);
    }
    b = round_trip_str("\x01", out, sizeof out);
    CHECK_MSG(!strcmp(out, "\"\\u0001\""), "%s", out);
    free(b);

    /* UTF-8 kept byte for byte, DEL too */
    const char *utf8 = "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 \x7f";
    b = round_trip_str(utf8, out, sizeof out);
    CHECK(b && !strcmp(b, utf8));
    CHECK_MSG(!strcmp(out + 1, "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 \x7f\""),
              "%s", out);
    free(b);
    /* bytes that are no UTF-8 (a name a fixed buffer cut inside a
     * character, a lone continuation, an overlong form) are written as
     * U+FFFD, so that the reader, which refuses them, reads what was
     * written (a profile of a config at a non-ASCII path did not load) */
    static const struct {
        const char *in, *back;
    } bad[] = {{"a\xc3", "a\xef\xbf\xbd"},
               {"\x80x\xc3\xa9", "\xef\xbf\xbdx\xc3\xa9"},
               {"\xe6\x97", "\xef\xbf\xbd\xef\xbf\xbd"},
               {"\xc0\xafz", "\xef\xbf\xbd\xef\xbf\xbdz"}};
    for (size_t q = 0; q < sizeof bad / sizeof bad[0]; q++) {
        b = round_trip_str(bad[q].in, out, sizeof out);
        CHECK_MSG(b && !strcmp(b, bad[q].back), "bad UTF-8 %zu: written %s, read %s", q, out,
                  b ? b : "(refused)");
        free(b);
    }
    b = round_trip_str("", out, sizeof out);
    CHECK(b && !b[0] && !strcmp(out, "\"\""));
    free(b);

    /* keys are escaped too */
    gp_json_writer w = {0};
    gp_json_open_object(&w, NULL);
    gp_json_put_str(&w, "k\"\\", "v");
    gp_json_put_str(&w, "null", NULL);
    gp_json_close(&w);
    CHECK_MSG(!strcmp(w.text, "{\"k\\\"\\\\\":\"v\",\"null\":null}"), "%s", w.text);
    gp_json_writer_free(&w);
}

static void test_writer_layout(void)
{
    gp_json_writer w = {0};
    gp_json_open_object(&w, NULL);
    gp_json_put_int(&w, "a", 1);
    gp_json_open_array(&w, "b");
    gp_json_put_bool(&w, NULL, true);
    gp_json_put_bool(&w, NULL, false);
    gp_json_put_null(&w, NULL);
    gp_json_open_object(&w, NULL);
    gp_json_close(&w);
    gp_json_open_array(&w, NULL);
    gp_json_close(&w);
    gp_json_close(&w);
    gp_json_open_object(&w, "c");
    gp_json_put_str(&w, "d", "e");
    gp_json_close(&w);
    gp_json_close(&w);
    CHECK_MSG(!strcmp(w.text, "{\"a\":1,\"b\":[true,false,null,{},[]],\"c\":{\"d\":\"e\"}}"),
              "%s", w.text);
    CHECK(w.depth == 0 && !w.oom);
    /* JSON Lines: top-level values one after the other, the caller's "\n" */
    gp_json_put_raw(&w, "\n");
    gp_json_put_int(&w, NULL, 7);
    gp_json_put_raw(&w, "\n");
    gp_json_open_array(&w, NULL);
    gp_json_close(&w);
    CHECK_MSG(strstr(w.text, "}}\n7\n[]") != NULL, "%s", w.text);
    gp_json_writer_free(&w);
    CHECK(w.text == NULL && w.len == 0);

    /* pretty: objects' members and arrays of containers on lines, arrays
     * of scalars and anything deeper than `pretty` on one line */
    gp_json_writer p = {.pretty = 2};
    gp_json_open_object(&p, NULL);
    gp_json_put_str(&p, "f", "x");
    gp_json_open_array(&p, "s");
    gp_json_put_int(&p, NULL, 1);
    gp_json_put_int(&p, NULL, 2);
    gp_json_close(&p);
    gp_json_open_array(&p, "l");
    for (int i = 0; i < 2; i++) {
        gp_json_open_object(&p, NULL);
        gp_json_put_int(&p, "i", i);
        gp_json_open_array(&p, "t");
        gp_json_put_int(&p, NULL, i);
        gp_json_close(&p);
        gp_json_close(&p);
    }
    gp_json_close(&p);
    gp_json_open_object(&p, "e");
    gp_json_close(&p);
    gp_json_close(&p);
    const char *want = "{\n  \"f\": \"x\",\n  \"s\": [1,2],\n  \"l\": [\n"
                       "    {\"i\":0,\"t\":[0]},\n    {\"i\":1,\"t\":[1]}\n  ],\n  \"e\": {}\n}";
    CHECK_MSG(!strcmp(p.text, want), "got\n%s\nwant\n%s", p.text, want);
    gp_json_reader r;
    gp_json_value *v = parse_str(p.text, &r);
    CHECK_MSG(v && v->n == 4, "%s", r.err);
    gp_json_value_free(v);

    /* flush: the text so far to a file, the nesting goes on */
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (f) {
        gp_json_writer q = {0};
        gp_json_open_array(&q, NULL);
        gp_json_put_int(&q, NULL, 1);
        CHECK(gp_json_flush(&q, f) && q.len == 0);
        gp_json_put_int(&q, NULL, 2);
        gp_json_close(&q);
        CHECK(gp_json_flush(&q, f));
        gp_json_writer_free(&q);
        char buf[32] = {0};
        rewind(f);
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        CHECK_MSG(got == 5 && !strcmp(buf, "[1,2]"), "%s", buf);
        fclose(f);
    }
    gp_json_writer_free(&p);
}

static void test_writer_numbers(void)
{
    gp_json_writer w = {0};
    gp_json_open_array(&w, NULL);
    gp_json_put_num(&w, NULL, 0.1);
    gp_json_put_num(&w, NULL, -2.5);
    gp_json_put_num(&w, NULL, 1e300);
    gp_json_put_num(&w, NULL, NAN);
    gp_json_put_num(&w, NULL, INFINITY);
    gp_json_put_num(&w, NULL, -INFINITY);
    gp_json_put_fixed(&w, NULL, 2.5, 3);
    gp_json_put_fixed(&w, NULL, NAN, 3);
    gp_json_put_fixed(&w, NULL, 0.1234567, 0);
    gp_json_put_int(&w, NULL, INT64_MIN);
    gp_json_put_uint(&w, NULL, UINT64_MAX);
    gp_json_close(&w);
    const char *want = "[0.1,-2.5,1e+300,null,null,null,2.500,null,0,-9223372036854775808,"
                       "18446744073709551615]";
    CHECK_MSG(!strcmp(w.text, want), "got %s\nwant %s", w.text, want);
    gp_json_writer_free(&w);

    /* every double written reads back to itself */
    const double vals[] = {1.0 / 3, 2.0 / 3, 1e-310, -0.0, 5e-324, 1.7976931348623157e308,
                           123456789.123456789, 0.30000000000000004, 100, 1e21, 1e22};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        gp_json_writer x = {0};
        gp_json_put_num(&x, NULL, vals[i]);
        gp_json_reader r;
        gp_json_reader_init(&r, x.text, x.len);
        double back = 0;
        CHECK_MSG(gp_json_read_number(&r, &back) && back == vals[i] &&
                  signbit(back) == signbit(vals[i]), "%.17g written %s read %.17g",
                  vals[i], x.text, back);
        gp_json_writer_free(&x);
    }
}

/* ---- the reader -------------------------------------------------------------------- */

static void test_decode(void)
{
    gp_json_reader r;
    gp_json_value *v = parse_str(" \"a\\u00e9\\u65e5\\ud83d\\ude00\\/\\\"\\\\\\b\\f\\n\\r\\t\" ", &r);
    CHECK_MSG(v && v->kind == GP_JSON_STRING, "%s", r.err);
    if (v)
        CHECK(!strcmp(v->str, "a\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80/\"\\\b\f\n\r\t"));
    gp_json_value_free(v);
    v = parse_str("\"\\u00E9\\uFFFF\"", &r);
    CHECK(v && !strcmp(v->str, "\xc3\xa9\xef\xbf\xbf"));
    gp_json_value_free(v);
}

static void test_tree(void)
{
    const char *doc = "{\"a\": [1, {\"b\": [true, false, null]}, \"s\", []],\n"
                      " \"c\": {}, \"a\": 2, \"d\": -0.5e1}";
    gp_json_reader r;
    gp_json_value *v = parse_str(doc, &r);
    CHECK_MSG(v != NULL, "%s", r.err);
    if (!v) return;
    CHECK(v->kind == GP_JSON_OBJECT && v->n == 4 && v->offset == 0);
    /* a key given twice: the last "a", as Python's json takes it (issue 77) */
    const gp_json_value *last = gp_json_get(v, "a");
    CHECK(last && last->kind == GP_JSON_NUMBER && last->num == 2);
    const gp_json_value *a = &v->items[0]; /* the first "a", in document order */
    CHECK(!strcmp(v->keys[0], "a") && v->keys[2] && !strcmp(v->keys[2], "a"));
    CHECK(a && a->kind == GP_JSON_ARRAY && a->n == 4);
    CHECK(a && a->offset == 6);
    if (a && a->n == 4) {
        CHECK(a->items[0].kind == GP_JSON_NUMBER && a->items[0].num == 1);
        const gp_json_value *b = gp_json_get(&a->items[1], "b");
        CHECK(b && b->n == 3 && b->items[0].kind == GP_JSON_TRUE &&
              b->items[1].kind == GP_JSON_FALSE && b->items[2].kind == GP_JSON_NULL);
        CHECK(a->items[2].kind == GP_JSON_STRING && !strcmp(a->items[2].str, "s"));
        CHECK(a->items[3].kind == GP_JSON_ARRAY && a->items[3].n == 0);
    }
    const gp_json_value *c = gp_json_get(v, "c");
    CHECK(c && c->kind == GP_JSON_OBJECT && c->n == 0);
    const gp_json_value *d = gp_json_get(v, "d");
    CHECK(d && d->num == -5);
    CHECK(gp_json_get(v, "zz") == NULL && gp_json_get(a, "a") == NULL);
    CHECK(gp_json_get(NULL, "a") == NULL);
    gp_json_value_free(v);
    gp_json_value_free(NULL);

    /* nesting to the limit, and one more */
    char deep[2 * GP_JSON_MAX_DEPTH + 8];
    int n = 0;
    for (int i = 0; i < GP_JSON_MAX_DEPTH; i++) deep[n++] = '[';
    for (int i = 0; i < GP_JSON_MAX_DEPTH; i++) deep[n++] = ']';
    v = gp_json_parse(deep, (size_t)n, &r);
    CHECK_MSG(v != NULL, "%s", r.err);
    gp_json_value_free(v);
    memmove(deep + 1, deep, (size_t)n);
    deep[0] = '[';
    deep[n + 1] = ']';
    v = gp_json_parse(deep, (size_t)n + 2, &r);
    CHECK(v == NULL && strstr(r.err, "nested more than 64 deep") && r.err_at == 64);

    /* text that is not NUL-terminated is read only up to len */
    v = gp_json_parse("[1, 2]xyz", 6, &r);
    CHECK(v && v->n == 2);
    gp_json_value_free(v);
}

/* The pull reader over the shape a caller knows: {"name": [u, ...], ...}. */
static void test_pull(void)
{
    const char *doc = "{\"x\": [0, 18446744073709551615], \"y\": [], \"z\": [7]}";
    gp_json_reader r;
    gp_json_reader_init(&r, doc, strlen(doc));
    CHECK(gp_json_peek(&r) == GP_JSON_OBJECT && gp_json_enter_object(&r));
    char *key;
    int members = 0;
    uint64_t sum_hi = 0, count = 0;
    while (gp_json_next_member(&r, &key)) {
        members++;
        CHECK(gp_json_enter_array(&r));
        while (gp_json_next_item(&r)) {
            uint64_t u;
            CHECK(gp_json_read_uint(&r, &u));
            if (!strcmp(key, "x") && count == 1) sum_hi = u;
            count++;
        }
        free(key);
    }
    CHECK_MSG(!r.err[0], "%s", r.err);
    CHECK(members == 3 && count == 3 && sum_hi == UINT64_MAX && r.depth == 0);
    CHECK(gp_json_at_end(&r));

    /* exact u64 bounds and what is not an unsigned integer */
    static const struct {
        const char *text, *err;
    } bad[] = {
        {"18446744073709551616", "integer out of range"},
        {"-1", "expected a non-negative integer"},
        {"1.5", "got a fraction"},
        {"1e3", "got a fraction"},
        {"007", "leading zero"},
        {"\"1\"", "expected a non-negative integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint64_t u;
        gp_json_reader_init(&r, bad[i].text, strlen(bad[i].text));
        CHECK_MSG(!gp_json_read_uint(&r, &u) && strstr(r.err, bad[i].err), "%s: %s",
                  bad[i].text, r.err);
    }
    /* the caller's own error sticks, and later calls fail */
    gp_json_reader_init(&r, "  [1]", 5);
    CHECK(!gp_json_fail(&r, "not what %s wants", "this format"));
    CHECK(!strcmp(r.err, "not what this format wants") && r.err_at == 2);
    CHECK(!gp_json_fail(&r, "a second error") && strstr(r.err, "this format"));
    CHECK(!gp_json_enter_array(&r) && gp_json_peek(&r) == GP_JSON_NONE);
    bool bv;
    gp_json_reader_init(&r, "false", 5);
    CHECK(gp_json_read_bool(&r, &bv) && !bv);
    gp_json_reader_init(&r, "nul", 3);
    CHECK(!gp_json_read_null(&r) && strstr(r.err, "expected null"));
}

static void test_numbers(void)
{
    static const struct {
        const char *text;
        double want;
    } good[] = {
        {"0", 0}, {"-0", -0.0}, {"1.5e3", 1500}, {"-2.5E-3", -0.0025}, {"1e+2", 100},
        {"1e-400", 0}, {"123456789012345678", 123456789012345678.0},
        {"0.1", 0.1}, {"1.7976931348623157e308", 1.7976931348623157e308},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        gp_json_reader r;
        gp_json_value *v = parse_str(good[i].text, &r);
        CHECK_MSG(v && v->kind == GP_JSON_NUMBER && v->num == good[i].want, "%s: %s",
                  good[i].text, r.err);
        gp_json_value_free(v);
    }
}

/* Each broken document with its message and position (line, column). */
static void test_errors(void)
{
    static const struct {
        const char *text, *err;
        int line, column;
    } bad[] = {
        {"", "unexpected end of input, expected a value", 1, 1},
        {"   ", "unexpected end of input, expected a value", 1, 4},
        {"{\"a\":1,}", "expected a string key", 1, 8},
        {"{\"a\" 1}", "expected ':' after a key", 1, 6},
        {"{1:2}", "expected a string key", 1, 2},
        {"[1 2]", "expected ',' or ']'", 1, 4},
        {"[1,]", "expected a value", 1, 4},
        {"[,1]", "expected a value", 1, 2},
        {"{\"a\":1 \"b\":2}", "expected ',' or '}'", 1, 8},
        {"[1, 2", "unexpected end of input, expected ',' or ']'", 1, 6},
        {"\"abc", "unterminated string", 1, 1},
        {"\"a\\qb\"", "bad escape '\\q'", 1, 4},
        {"\"\\ud800\"", "unpaired surrogate", 1, 8},
        {"\"\\ud800\\u0041\"", "unpaired surrogate", 1, 14},
        {"\"\\udc00\"", "unpaired surrogate", 1, 8},
        {"\"\\u12G4\"", "bad \\u escape", 1, 4},
        {"\"\\u0000\"", "\\u0000 in a string", 1, 8},
        {"\"a\tb\"", "control character 0x09", 1, 3},
        /* JSON text is UTF-8: a stray continuation byte, a lead byte cut
         * short, an overlong '/', a surrogate, past U+10FFFF, in a key */
        {"\"a\xff\"", "byte 0xff in a string is not UTF-8", 1, 3},
        {"\"\x80\"", "byte 0x80 in a string is not UTF-8", 1, 2},
        {"\"\xc3\"", "byte 0xc3 in a string is not UTF-8", 1, 2},
        {"\"\xc3(\"", "byte 0xc3 in a string is not UTF-8", 1, 2},
        {"\"\xc0\xaf\"", "byte 0xc0 in a string is not UTF-8", 1, 2},
        {"\"\xe0\x80\xaf\"", "byte 0xe0 in a string is not UTF-8", 1, 2},
        {"\"\xed\xa0\x80\"", "byte 0xed in a string is not UTF-8", 1, 2},
        {"\"\xf4\x90\x80\x80\"", "byte 0xf4 in a string is not UTF-8", 1, 2},
        {"{\"k\xfe\":1}", "byte 0xfe in a string is not UTF-8", 1, 4},
        {"01", "leading zero", 1, 2},
        {"1.", "a digit after '.'", 1, 3},
        {"1e", "a digit in the exponent", 1, 3},
        {"-", "expected a number", 1, 1},
        {"- 1", "expected a number", 1, 1},
        {"1e999", "out of range", 1, 1},
        {"NaN", "expected a value", 1, 1},
        {"tru", "expected true", 1, 1},
        {"nul", "expected null", 1, 1},
        {"[1,2]x", "more after the end", 1, 6},
        {"{\n  \"a\": [1,\n   2,,3]}", "expected a value", 3, 6},
        {"[1]\n\n  ]", "more after the end", 3, 3},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gp_json_reader r;
        gp_json_value *v = parse_str(bad[i].text, &r);
        int line = 0, column = 0;
        gp_json_where(&r, r.err_at, &line, &column);
        CHECK_MSG(!v && strstr(r.err, bad[i].err) && line == bad[i].line &&
                  column == bad[i].column, "'%s': got %d:%d: %s; want %d:%d: %s", bad[i].text,
                  line, column, r.err, bad[i].line, bad[i].column, bad[i].err);
        gp_json_value_free(v);
    }
}

/* ---- random trees: written, read back, compared ------------------------------------ */

typedef struct {
    uint64_t s;
} rng;

static uint32_t next_u32(rng *g)
{
    g->s = g->s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(g->s >> 33);
}

static void random_string(rng *g, char *buf, size_t cap)
{
    static const char *const pieces[] = {"a", "\"", "\\", "\n", "\x01", "\x1f", "\xc3\xa9",
                                         "\xf0\x9f\x98\x80", "/", " ", "key", "\t", "\x7f"};
    size_t n = 0;
    int k = (int)(next_u32(g) % 6);
    buf[0] = '\0';
    for (int i = 0; i < k; i++) {
        const char *p = pieces[next_u32(g) % (sizeof pieces / sizeof *pieces)];
        if (n + strlen(p) + 1 > cap) break;
        memcpy(buf + n, p, strlen(p) + 1);
        n += strlen(p);
    }
}

/* A random value nested at most `depth` deep; check_random replays the
 * same draws against what was read back. */
static void write_random(rng *g, gp_json_writer *w, const char *key, int depth)
{
    char s[64];
    int kind = (int)(next_u32(g) % (depth > 0 ? 7 : 5));
    switch (kind) {
    case 0: gp_json_put_null(w, key); break;
    case 1: gp_json_put_bool(w, key, next_u32(g) & 1); break;
    case 2: gp_json_put_num(w, key, ((double)next_u32(g) - 2e9) / ((double)next_u32(g) + 1)); break;
    case 3: gp_json_put_int(w, key, (int64_t)next_u32(g) * (int64_t)next_u32(g) - (1LL << 62)); break;
    case 4: random_string(g, s, sizeof s); gp_json_put_str(w, key, s); break;
    default: {
        int n = (int)(next_u32(g) % 4);
        if (kind == 5) gp_json_open_array(w, key);
        else gp_json_open_object(w, key);
        for (int i = 0; i < n; i++) {
            random_string(g, s, sizeof s);
            write_random(g, w, kind == 5 ? NULL : s, depth - 1);
        }
        gp_json_close(w);
    }
    }
}

/* The same sequence of draws as write_random, checked against the tree. */
static bool check_random(rng *g, const gp_json_value *v, int depth)
{
    char s[64];
    int kind = (int)(next_u32(g) % (depth > 0 ? 7 : 5));
    switch (kind) {
    case 0: return v->kind == GP_JSON_NULL;
    case 1: return v->kind == ((next_u32(g) & 1) ? GP_JSON_TRUE : GP_JSON_FALSE);
    case 2: {
        double want = ((double)next_u32(g) - 2e9) / ((double)next_u32(g) + 1);
        return v->kind == GP_JSON_NUMBER && v->num == want;
    }
    case 3: {
        int64_t want = (int64_t)next_u32(g) * (int64_t)next_u32(g) - (1LL << 62);
        return v->kind == GP_JSON_NUMBER && v->num == (double)want;
    }
    case 4: random_string(g, s, sizeof s); return v->kind == GP_JSON_STRING && !strcmp(v->str, s);
    default: {
        int n = (int)(next_u32(g) % 4);
        if (v->kind != (kind == 5 ? GP_JSON_ARRAY : GP_JSON_OBJECT) || v->n != n) return false;
        for (int i = 0; i < n; i++) {
            random_string(g, s, sizeof s);
            if (kind == 6 && strcmp(v->keys[i], s)) return false;
            if (!check_random(g, &v->items[i], depth - 1)) return false;
        }
        return true;
    }
    }
}

static void test_random_round_trip(void)
{
    int good = 0;
    for (int seed = 1; seed <= 300; seed++) {
        for (int pretty = 0; pretty <= 2; pretty += 2) {
            gp_json_writer w = {.pretty = pretty};
            rng g = {(uint64_t)seed};
            write_random(&g, &w, NULL, 5);
            gp_json_reader r;
            gp_json_value *v = gp_json_parse(w.text, w.len, &r);
            rng h = {(uint64_t)seed};
            bool same = v && check_random(&h, v, 5);
            if (same) good++;
            else fprintf(stderr, "seed %d: %s\n%s\n", seed, r.err, w.text);
            gp_json_value_free(v);
            gp_json_writer_free(&w);
        }
    }
    CHECK_MSG(good == 600, "%d of 600 random documents read back the same", good);
}

/* ---- a metrics record ---------------------------------------------------------------- */

static void test_metrics_line(void)
{
    gp_device *dev;
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    /* no backend makes such a name today; the record must not care */
    const char *odd = "cpu\"0\\ \xc3\xa9\n";
    snprintf(dev->name, sizeof dev->name, "%s", odd);
    gp_step_stats st = {.loss = 2.5, .accuracy = NAN, .seconds = 0.25,
                        .allreduce_seconds = 0.125};
    gp_json_writer w = {0};
    gp_device *devs[1] = {dev};
    const gp_step_counts counts[1] = {{.host_waits = 4, .launches = 123, .adapter_bytes = 0}};
    gp_train_metrics_step(&w, 3, 1, 0.1, 1234.56, &st, true, devs, 1, counts);
    gp_json_reader r;
    gp_json_value *v = gp_json_parse(w.text, w.len, &r);
    CHECK_MSG(v != NULL, "%s in %s", r.err, w.text);
    CHECK(!strchr(w.text, '\n')); /* one JSON Lines record */
    if (v) {
        const gp_json_value *d = gp_json_get(v, "devices");
        CHECK(d && d->kind == GP_JSON_ARRAY && d->n == 1);
        const gp_json_value *name = d && d->n == 1 ? gp_json_get(&d->items[0], "name") : NULL;
        CHECK(name && name->kind == GP_JSON_STRING && !strcmp(name->str, odd));
        CHECK(d && d->n == 1 && gp_json_get(&d->items[0], "peak_bytes") &&
              gp_json_get(&d->items[0], "peak_activations"));
        const gp_json_value *step = gp_json_get(v, "step"), *loss = gp_json_get(v, "loss");
        CHECK(step && step->num == 3 && loss && loss->num == 2.5);
        const gp_json_value *acc = gp_json_get(v, "accuracy"); /* NaN: null */
        CHECK(acc && acc->kind == GP_JSON_NULL);
        const gp_json_value *sps = gp_json_get(v, "samples_per_s");
        CHECK(sps && sps->num == 1234.6);
        CHECK(gp_json_get(v, "allreduce_seconds") != NULL);
        const gp_json_value *hw = d && d->n == 1 ? gp_json_get(&d->items[0], "host_waits") : NULL;
        const gp_json_value *la = d && d->n == 1 ? gp_json_get(&d->items[0], "launches") : NULL;
        const gp_json_value *ab =
            d && d->n == 1 ? gp_json_get(&d->items[0], "adapter_bytes") : NULL;
        CHECK(hw && hw->num == 4 && la && la->num == 123 && ab && ab->num == 0);
    }
    CHECK_MSG(strstr(w.text, "\"step_seconds\":0.250000,") != NULL, "%s", w.text);
    gp_json_value_free(v);
    gp_json_writer_free(&w);
    gp_device_close(dev);
}

int main(void)
{
    test_escapes();
    test_writer_layout();
    test_writer_numbers();
    test_decode();
    test_tree();
    test_pull();
    test_numbers();
    test_errors();
    test_random_round_trip();
    test_metrics_line();
    return gpt_finish("test_json");
}
