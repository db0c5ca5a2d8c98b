/*
 * safetensors.c — the safetensors format: a strict reader (it parses
 * outside input, and is fuzzed: tests/fuzz/fuzz_safetensors.c) and a writer
 * that replaces its target atomically.
 *
 * The reader takes nothing on trust: the header length against the file
 * size and GP_ST_MAX_HEADER, the JSON by a small recursive-descent parser
 * that knows the one shape a header has (no generic JSON tree), integers
 * without overflow, shapes against byte ranges, ranges inside the data
 * section and tiling it (as the reference library's validation does).
 * Every error path frees what it made (the fuzzer runs with LeakSanitizer).
 */
#include "train/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

/* ---- dtypes --------------------------------------------------------------- */

static const struct {
    const char *name;
    int size;
} k_dtypes[] = {
    {"F32", 4}, {"I64", 8}, {"F64", 8}, {"F16", 2}, {"BF16", 2}, {"I32", 4}, {"I16", 2},
    {"I8", 1},  {"U8", 1},  {"U16", 2}, {"U32", 4}, {"U64", 8},  {"BOOL", 1},
    {"F8_E4M3", 1}, {"F8_E5M2", 1},
};
#define N_DTYPES ((int)(sizeof k_dtypes / sizeof k_dtypes[0]))

static const char *dtype_name(gp_st_dtype d) { return d == GP_ST_I64 ? "I64" : "F32"; }

/* ---- CRC-32 over any length ------------------------------------------------ */

static uint32_t crc_all(const uint8_t *p, uint64_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}

/* ---- the JSON header parser -------------------------------------------------- */

typedef struct {
    const char *p, *end;
    const char *start;   /* for offsets in messages */
    const char *name;    /* file name for messages */
} jp;

static gp_status jerr(const jp *j, const char *what)
{
    return gp_error_set(GP_ERR_DATA,
                        "%s: not a safetensors file: bad JSON header at byte %lld: %s", j->name,
                        (long long)(8 + (j->p - j->start)), what);
}

static void jws(jp *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static bool jeat(jp *j, char c)
{
    jws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return true;
    }
    return false;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_u4(jp *j, unsigned *out)
{
    if (j->end - j->p < 4) return false;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(j->p[i]);
        if (h < 0) return false;
        v = v << 4 | (unsigned)h;
    }
    j->p += 4;
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

/* A JSON string into a malloc'd, NUL-terminated UTF-8 copy.  NUL bytes
 * (\u0000) are refused: names and metadata are C strings here. */
static gp_status jstring(jp *j, char **out)
{
    *out = NULL;
    if (!jeat(j, '"')) return jerr(j, "expected a string");
    const char *q = j->p;
    size_t raw = 0;
    while (q < j->end && *q != '"') {
        if (*q == '\\') q++;
        q++;
        raw++;
    }
    if (q >= j->end) return jerr(j, "unterminated string");
    char *s = malloc(raw * 4 + 1); /* an escape never grows past 4 bytes per source char */
    if (!s) return gp_error_set(GP_ERR_OOM, "%s: out of host memory", j->name);
    size_t n = 0;
    while (*j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20) {
            free(s);
            return jerr(j, "control character in a string");
        }
        if (c != '\\') {
            s[n++] = (char)c;
            continue;
        }
        char e = *j->p++;
        unsigned cp;
        switch (e) {
        case '"': s[n++] = '"'; break;
        case '\\': s[n++] = '\\'; break;
        case '/': s[n++] = '/'; break;
        case 'b': s[n++] = '\b'; break;
        case 'f': s[n++] = '\f'; break;
        case 'n': s[n++] = '\n'; break;
        case 'r': s[n++] = '\r'; break;
        case 't': s[n++] = '\t'; break;
        case 'u':
            if (!read_u4(j, &cp)) {
                free(s);
                return jerr(j, "bad \\u escape");
            }
            if (cp >= 0xd800 && cp < 0xdc00) {
                unsigned lo;
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') {
                    free(s);
                    return jerr(j, "unpaired surrogate in \\u escape");
                }
                j->p += 2;
                if (!read_u4(j, &lo) || lo < 0xdc00 || lo > 0xdfff) {
                    free(s);
                    return jerr(j, "unpaired surrogate in \\u escape");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                free(s);
                return jerr(j, "unpaired surrogate in \\u escape");
            }
            if (cp == 0) {
                free(s);
                return jerr(j, "\\u0000 in a string");
            }
            n += put_utf8(s + n, cp);
            break;
        default:
            free(s);
            return jerr(j, "bad escape in a string");
        }
        if (j->p > q) { /* an escape ran over the closing quote we found */
            free(s);
            return jerr(j, "unterminated string");
        }
    }
    j->p++; /* closing quote */
    s[n] = '\0';
    *out = s;
    return GP_OK;
}

/* A non-negative integer without sign, fraction or exponent. */
static gp_status juint(jp *j, uint64_t *out)
{
    jws(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return jerr(j, "expected a non-negative integer");
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p - '0');
        if (v > (UINT64_MAX - d) / 10) return jerr(j, "integer out of range");
        v = v * 10 + d;
        j->p++;
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return jerr(j, "expected an integer, got a fraction");
    *out = v;
    return GP_OK;
}

/* [u, u, ...] with at most `max` entries. */
static gp_status juint_list(jp *j, uint64_t *v, int max, int *count)
{
    *count = 0;
    if (!jeat(j, '[')) return jerr(j, "expected a list");
    if (jeat(j, ']')) return GP_OK;
    for (;;) {
        if (*count >= max) return jerr(j, "list too long");
        GP_TRY(juint(j, &v[(*count)++]));
        if (jeat(j, ']')) return GP_OK;
        if (!jeat(j, ',')) return jerr(j, "expected ',' or ']' in a list");
    }
}

static gp_status parse_tensor(jp *j, gp_st_tensor *t)
{
    if (!jeat(j, '{')) return jerr(j, "expected a tensor description {dtype, shape, data_offsets}");
    bool have_d = false, have_s = false, have_o = false;
    if (!jeat(j, '}')) {
        for (;;) {
            char *key;
            GP_TRY(jstring(j, &key));
            if (!jeat(j, ':')) {
                free(key);
                return jerr(j, "expected ':'");
            }
            gp_status s = GP_OK;
            if (!strcmp(key, "dtype") && !have_d) {
                char *d;
                s = jstring(j, &d);
                if (s == GP_OK) {
                    int k = 0;
                    while (k < N_DTYPES && strcmp(d, k_dtypes[k].name)) k++;
                    if (k == N_DTYPES) s = jerr(j, "unknown dtype");
                    else {
                        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", d);
                        t->dtype = k == 0 ? GP_ST_F32 : k == 1 ? GP_ST_I64 : GP_ST_OTHER;
                    }
                    free(d);
                }
                have_d = true;
            } else if (!strcmp(key, "shape") && !have_s) {
                uint64_t v[GP_ST_MAX_DIMS];
                s = juint_list(j, v, GP_ST_MAX_DIMS, &t->ndim);
                for (int i = 0; s == GP_OK && i < t->ndim; i++) {
                    if (v[i] > (uint64_t)INT64_MAX) s = jerr(j, "dimension out of range");
                    t->dims[i] = (int64_t)v[i];
                }
                have_s = true;
            } else if (!strcmp(key, "data_offsets") && !have_o) {
                uint64_t v[2];
                int c;
                s = juint_list(j, v, 2, &c);
                if (s == GP_OK && c != 2) s = jerr(j, "data_offsets needs [begin, end]");
                if (s == GP_OK) {
                    t->begin = v[0];
                    t->end = v[1];
                }
                have_o = true;
            } else {
                s = jerr(j, "unknown or repeated key in a tensor description");
            }
            free(key);
            GP_TRY(s);
            if (jeat(j, '}')) break;
            if (!jeat(j, ',')) return jerr(j, "expected ',' or '}'");
        }
    }
    if (!have_d || !have_s || !have_o)
        return jerr(j, "a tensor description needs dtype, shape and data_offsets");
    return GP_OK;
}

static gp_status add_meta(char ***meta, int *n, int *cap, char *k, char *v)
{
    if (*n >= *cap) {
        int nc = *cap ? *cap * 2 : 8;
        char **nm = realloc(*meta, (size_t)nc * 2 * sizeof *nm);
        if (!nm) {
            free(k);
            free(v);
            return gp_error_set(GP_ERR_OOM, "out of host memory");
        }
        *meta = nm;
        *cap = nc;
    }
    (*meta)[2 * *n] = k;
    (*meta)[2 * *n + 1] = v;
    (*n)++;
    return GP_OK;
}

static gp_status parse_meta(jp *j, gp_st_file *f, int *cap)
{
    if (f->meta) return jerr(j, "__metadata__ given twice");
    if (!jeat(j, '{')) return jerr(j, "__metadata__ must be a map of strings");
    if (jeat(j, '}')) return GP_OK;
    for (;;) {
        char *k, *v;
        GP_TRY(jstring(j, &k));
        if (!jeat(j, ':')) {
            free(k);
            return jerr(j, "expected ':'");
        }
        gp_status s = jstring(j, &v);
        if (s != GP_OK) {
            free(k);
            return jerr(j, "__metadata__ values must be strings");
        }
        GP_TRY(add_meta(&f->meta, &f->n_meta, cap, k, v));
        if (jeat(j, '}')) return GP_OK;
        if (!jeat(j, ',')) return jerr(j, "expected ',' or '}'");
    }
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp((*(const gp_st_tensor *const *)a)->name, (*(const gp_st_tensor *const *)b)->name);
}

static int cmp_begin(const void *a, const void *b)
{
    uint64_t x = (*(const gp_st_tensor *const *)a)->begin;
    uint64_t y = (*(const gp_st_tensor *const *)b)->begin;
    if (x != y) return x < y ? -1 : 1;
    uint64_t p = (*(const gp_st_tensor *const *)a)->end;
    uint64_t q = (*(const gp_st_tensor *const *)b)->end;
    return p < q ? -1 : p > q;
}

static int dtype_size(const char *name)
{
    for (int k = 0; k < N_DTYPES; k++)
        if (!strcmp(name, k_dtypes[k].name)) return k_dtypes[k].size;
    return 0;
}

/* Shapes against ranges, ranges tiling the data section, unique names. */
static gp_status check_layout(gp_st_file *f)
{
    if (f->n == 0) {
        if (f->data_len != 0)
            return gp_error_set(GP_ERR_DATA, "%s: %llu data bytes but no tensors", f->source,
                                (unsigned long long)f->data_len);
        return GP_OK;
    }
    gp_st_tensor **v = malloc((size_t)f->n * sizeof *v);
    if (!v) return gp_error_set(GP_ERR_OOM, "out of host memory");
    gp_status s = GP_OK;
    for (int i = 0; i < f->n && s == GP_OK; i++) {
        gp_st_tensor *t = &f->tensors[i];
        v[i] = t;
        uint64_t bytes = (uint64_t)dtype_size(t->dtype_name);
        for (int d = 0; d < t->ndim && s == GP_OK; d++) {
            uint64_t dim = (uint64_t)t->dims[d];
            if (dim && bytes > UINT64_MAX / dim)
                s = gp_error_set(GP_ERR_DATA, "%s: tensor '%s': shape too large", f->source,
                                 t->name);
            else bytes *= dim;
        }
        if (s == GP_OK && (t->end < t->begin || t->end - t->begin != bytes))
            s = gp_error_set(GP_ERR_DATA,
                             "%s: tensor '%s' (%s, %d dims) needs %llu bytes but data_offsets "
                             "[%llu, %llu] hold %lld", f->source, t->name, t->dtype_name, t->ndim,
                             (unsigned long long)bytes, (unsigned long long)t->begin,
                             (unsigned long long)t->end,
                             (long long)(t->end >= t->begin ? (int64_t)(t->end - t->begin) : -1));
    }
    if (s == GP_OK) {
        qsort(v, (size_t)f->n, sizeof *v, cmp_names);
        for (int i = 1; i < f->n && s == GP_OK; i++)
            if (!strcmp(v[i - 1]->name, v[i]->name))
                s = gp_error_set(GP_ERR_DATA, "%s: tensor '%s' is given twice", f->source,
                                 v[i]->name);
    }
    if (s == GP_OK) {
        qsort(v, (size_t)f->n, sizeof *v, cmp_begin);
        uint64_t at = 0;
        for (int i = 0; i < f->n && s == GP_OK; i++) {
            if (v[i]->begin != at)
                s = gp_error_set(GP_ERR_DATA,
                                 "%s: tensor '%s' starts at data byte %llu but the previous "
                                 "tensor ends at %llu (tensors must tile the data section)",
                                 f->source, v[i]->name, (unsigned long long)v[i]->begin,
                                 (unsigned long long)at);
            at = v[i]->end;
        }
        if (s == GP_OK && at != f->data_len)
            s = gp_error_set(GP_ERR_DATA,
                             "%s: the tensors cover %llu data bytes but the file holds %llu; "
                             "the file is truncated or has trailing bytes", f->source,
                             (unsigned long long)at, (unsigned long long)f->data_len);
    }
    for (int i = 0; i < f->n && s == GP_OK; i++) f->tensors[i].data = f->data + f->tensors[i].begin;
    free(v);
    return s;
}

static gp_status parse_header(jp *j, gp_st_file *f)
{
    int cap = 0, mcap = 0;
    if (!jeat(j, '{')) return jerr(j, "the header must be a JSON object");
    if (jeat(j, '}')) goto tail;
    for (;;) {
        char *key;
        GP_TRY(jstring(j, &key));
        if (!jeat(j, ':')) {
            free(key);
            return jerr(j, "expected ':'");
        }
        if (!strcmp(key, "__metadata__")) {
            free(key);
            GP_TRY(parse_meta(j, f, &mcap));
        } else {
            if (f->n >= cap) {
                int nc = cap ? cap * 2 : 16;
                gp_st_tensor *nt = realloc(f->tensors, (size_t)nc * sizeof *nt);
                if (!nt) {
                    free(key);
                    return gp_error_set(GP_ERR_OOM, "out of host memory");
                }
                f->tensors = nt;
                cap = nc;
            }
            gp_st_tensor *t = &f->tensors[f->n++];
            memset(t, 0, sizeof *t);
            t->name = key;
            GP_TRY(parse_tensor(j, t));
        }
        if (jeat(j, '}')) break;
        if (!jeat(j, ',')) return jerr(j, "expected ',' or '}' between entries");
    }
tail:
    jws(j);
    if (j->p != j->end) return jerr(j, "trailing bytes after the header object");
    return GP_OK;
}

gp_status gp_st_parse(const char *name, const uint8_t *buf, size_t len, gp_st_file *out)
{
    memset(out, 0, sizeof *out);
    if (!name) name = "<safetensors>";
    snprintf(out->source, sizeof out->source, "%s", name);
    if (len < 8)
        return gp_error_set(GP_ERR_DATA, "%s: not a safetensors file: %zu bytes, shorter than "
                                         "the 8-byte header length", name, len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | buf[i];
    if (hl > GP_ST_MAX_HEADER || hl > len - 8)
        return gp_error_set(GP_ERR_DATA, "%s: not a safetensors file (or truncated): header "
                                         "length %llu but the file has %zu bytes", name,
                            (unsigned long long)hl, len);
    if (hl < 2 || buf[8] != '{')
        return gp_error_set(GP_ERR_DATA, "%s: not a safetensors file: the header does not "
                                         "start with '{'", name);
    out->image = malloc(len);
    if (!out->image) return gp_error_set(GP_ERR_OOM, "%s: out of host memory (%zu bytes)", name, len);
    memcpy(out->image, buf, len);
    out->data = out->image + 8 + hl;
    out->data_len = len - 8 - hl;
    jp j = {.p = (const char *)out->image + 8, .end = (const char *)out->image + 8 + hl,
            .start = (const char *)out->image + 8, .name = name};
    gp_status s = parse_header(&j, out);
    if (s == GP_OK) s = check_layout(out);
    if (s != GP_OK) gp_st_free(out);
    return s;
}

gp_status gp_st_read(const char *path, gp_st_file *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return gp_error_set(GP_ERR_IO, "cannot open '%s': %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return gp_error_set(GP_ERR_IO, "'%s' is not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        fclose(f);
        return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s' (%zu bytes)", path, len);
    }
    size_t got = fread(buf, 1, len, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != len) {
        free(buf);
        return gp_error_set(GP_ERR_IO, "cannot read '%s' (%zu of %zu bytes)", path, got, len);
    }
    gp_status s = gp_st_parse(path, buf, len, out);
    free(buf);
    return s;
}

void gp_st_free(gp_st_file *f)
{
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
    free(f->meta);
    free(f->image);
    memset(f, 0, sizeof *f);
}

const gp_st_tensor *gp_st_find(const gp_st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *gp_st_meta(const gp_st_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

gp_status gp_st_verify(const gp_st_file *f, bool required)
{
    const char *c = gp_st_meta(f, "gpipe.crc32");
    if (!c) {
        if (required)
            return gp_error_set(GP_ERR_DATA, "%s: no checksum (gpipe.crc32) in the metadata; "
                                             "not a gpipe snapshot", f->source);
        return GP_OK;
    }
    char *e;
    errno = 0;
    unsigned long want = strtoul(c, &e, 16);
    if (errno || *e || e == c || want > 0xffffffffUL)
        return gp_error_set(GP_ERR_DATA, "%s: malformed checksum '%.20s'", f->source, c);
    uint32_t got = crc_all(f->data, f->data_len);
    if (got != (uint32_t)want)
        return gp_error_set(GP_ERR_DATA,
                            "%s: checksum mismatch (CRC-32 of the data is %08x, the header says "
                            "%08lx): the file is corrupted; use an older snapshot", f->source,
                            got, want);
    return GP_OK;
}

/* ---- the writer ----------------------------------------------------------- */

gp_status gp_st_writer_add(gp_st_writer *w, const char *name, gp_st_dtype dtype, int ndim,
                           const int64_t *dims, const void *data, size_t bytes)
{
    GP_ASSERT(ndim >= 0 && ndim <= GP_ST_MAX_DIMS && dtype != GP_ST_OTHER);
    if (w->n >= w->cap) {
        int nc = w->cap ? w->cap * 2 : 32;
        gp_st_tensor *nt = realloc(w->tensors, (size_t)nc * sizeof *nt);
        if (!nt) return gp_error_set(GP_ERR_OOM, "out of host memory");
        w->tensors = nt;
        w->cap = nc;
    }
    gp_st_tensor *t = &w->tensors[w->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    uint8_t *copy = malloc(bytes ? bytes : 1);
    if (!t->name || !copy) {
        free(t->name);
        free(copy);
        return gp_error_set(GP_ERR_OOM, "out of host memory gathering '%s'", name);
    }
    memcpy(copy, data, bytes);
    t->data = copy;
    t->dtype = dtype;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dtype_name(dtype));
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->dims[d] = dims[d];
    t->begin = w->data_len;
    t->end = w->data_len + bytes;
    w->data_len = t->end;
    w->n++;
    return GP_OK;
}

gp_status gp_st_writer_meta(gp_st_writer *w, const char *key, const char *value)
{
    for (int i = 0; i < w->n_meta; i++) {
        if (!strcmp(w->meta[2 * i], key)) {
            char *v = strdup(value);
            if (!v) return gp_error_set(GP_ERR_OOM, "out of host memory");
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return GP_OK;
        }
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    return add_meta(&w->meta, &w->n_meta, &w->meta_cap, k, v);
}

void gp_st_writer_free(gp_st_writer *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->tensors[i].name);
        free((void *)w->tensors[i].data);
    }
    free(w->tensors);
    for (int i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->meta);
    memset(w, 0, sizeof *w);
}

/* A growable string. */
typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *p, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 1024;
        while (nc < b->n + n + 1) nc *= 2;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            sb_put(b, e, 2);
        } else if (c == '\n') {
            sb_put(b, "\\n", 2);
        } else if (c == '\t') {
            sb_put(b, "\\t", 2);
        } else if (c == '\r') {
            sb_put(b, "\\r", 2);
        } else if (c < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", c);
            sb_put(b, e, 6);
        } else {
            sb_put(b, (const char *)s, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* The header JSON padded with spaces to a multiple of 8, after the CRC of
 * the data went into the metadata. */
static gp_status build_header(gp_st_writer *w, sbuf *h)
{
    uLong c = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < w->n; i++) {
        const uint8_t *p = w->tensors[i].data;
        uint64_t n = w->tensors[i].end - w->tensors[i].begin;
        while (n > 0) {
            uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
            c = crc32(c, p, chunk);
            p += chunk;
            n -= chunk;
        }
    }
    char crc[16];
    snprintf(crc, sizeof crc, "%08lx", (unsigned long)(c & 0xffffffffUL));
    GP_TRY(gp_st_writer_meta(w, "gpipe.crc32", crc));
    sb_str(h, "{");
    if (w->n_meta) {
        sb_str(h, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) sb_str(h, ",");
            sb_json(h, w->meta[2 * i]);
            sb_str(h, ":");
            sb_json(h, w->meta[2 * i + 1]);
        }
        sb_str(h, "}");
    }
    for (int i = 0; i < w->n; i++) {
        const gp_st_tensor *t = &w->tensors[i];
        char num[64];
        if (i || w->n_meta) sb_str(h, ",");
        sb_json(h, t->name);
        sb_str(h, ":{\"dtype\":\"");
        sb_str(h, t->dtype_name);
        sb_str(h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->dims[d]);
            sb_str(h, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}",
                 (unsigned long long)t->begin, (unsigned long long)t->end);
        sb_str(h, num);
    }
    sb_str(h, "}");
    while (!h->oom && (h->n % 8) != 0) sb_str(h, " ");
    if (h->oom) {
        free(h->s);
        h->s = NULL;
        return gp_error_set(GP_ERR_OOM, "out of host memory building a safetensors header");
    }
    return GP_OK;
}

static void le64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

gp_status gp_st_serialize(gp_st_writer *w, uint8_t **out, size_t *len)
{
    sbuf h = {0};
    GP_TRY(build_header(w, &h));
    size_t total = 8 + h.n + (size_t)w->data_len;
    uint8_t *b = malloc(total);
    if (!b) {
        free(h.s);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    le64(b, h.n);
    memcpy(b + 8, h.s, h.n);
    for (int i = 0; i < w->n; i++)
        memcpy(b + 8 + h.n + w->tensors[i].begin, w->tensors[i].data,
               (size_t)(w->tensors[i].end - w->tensors[i].begin));
    free(h.s);
    *out = b;
    *len = total;
    return GP_OK;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

gp_status gp_st_write_atomic(gp_st_writer *w, const char *path)
{
    char dir[1024], tmp[1200];
    const char *slash = strrchr(path, '/');
    if (strlen(path) >= sizeof dir)
        return gp_error_set(GP_ERR_INVALID, "path too long: '%.80s...'", path);
    if (slash) {
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) + (slash == path), path);
        snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld", dir, slash + 1, (long)getpid());
    } else {
        snprintf(dir, sizeof dir, ".");
        snprintf(tmp, sizeof tmp, ".%s.tmp.%ld", path, (long)getpid());
    }
    sbuf h = {0};
    GP_TRY(build_header(w, &h));
    long slow = 0;
    const char *env = getenv("GPIPE_SNAPSHOT_SLOW_WRITE_MS");
    if (env) slow = strtol(env, NULL, 10);

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        int e = errno;
        free(h.s);
        return gp_error_set(GP_ERR_IO, "cannot create '%s': %s; check that the directory "
                                       "exists and is writable", tmp, strerror(e));
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        free(h.s);
        return gp_error_set(GP_ERR_IO, "cannot write '%s'", tmp);
    }
    uint8_t lb[8];
    le64(lb, h.n);
    bool ok = fwrite(lb, 1, 8, f) == 8 && fwrite(h.s, 1, h.n, f) == h.n;
    free(h.s);
    for (int i = 0; i < w->n && ok; i++) {
        size_t bytes = (size_t)(w->tensors[i].end - w->tensors[i].begin);
        ok = fwrite(w->tensors[i].data, 1, bytes, f) == bytes;
        if (slow > 0 && i == w->n / 2) {
            fflush(f);
            sleep_ms(slow);
        }
    }
    int e = errno;
    ok = ok && fflush(f) == 0;
    ok = ok && fsync(fileno(f)) == 0;
    if (!ok) e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        unlink(tmp);
        return gp_error_set(GP_ERR_IO, "writing '%s' failed: %s (disk full?); '%s' is "
                                       "unchanged", tmp, strerror(e), path);
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return gp_error_set(GP_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(e));
    }
    int dfd = open(dir, O_RDONLY);
    if (dfd >= 0) {
        fsync(dfd); /* the rename itself is durable from here */
        close(dfd);
    }
    return GP_OK;
}
