/*
 * safetensors.c — the safetensors format: a strict reader (it parses
 * outside input, and is fuzzed: tests/fuzz/fuzz_safetensors.c) and a writer
 * that replaces its target atomically.
 *
 * The reader takes nothing on trust: the header length against the file
 * size and GP_ST_MAX_HEADER, the JSON with the strict pull reader of
 * core/json.h walking the one shape a header has (no generic JSON tree, so
 * memory stays in proportion to the tensors), integers exact and without
 * overflow, shapes against byte ranges, ranges inside the data
 * section and tiling it (as the reference library's validation does).
 * Every error path frees what it made (the fuzzer runs with LeakSanitizer).
 *
 * The writer writes a large file (a snapshot) around the page cache, with
 * O_DIRECT, where the file system takes it: see write_direct.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include "weights/weights.h"
#include "core/json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#ifdef GPIPE_HAVE_ISAL
#include <isa-l/crc.h>
#endif

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

/* `crc` carried on over n more bytes (crc = 0 to start): zlib's CRC-32,
 * through ISA-L's carry-less multiplication where it was found at build
 * time (the same value, chained the same way; test_large_write_direct
 * checks a file's against a bitwise oracle). */
static uint32_t crc_more(uint32_t crc, const uint8_t *p, uint64_t n)
{
#ifdef GPIPE_HAVE_ISAL
    return crc32_gzip_refl(crc, p, n);
#else
    uLong c = crc;
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
#endif
}

uint32_t gp_st_crc(uint32_t crc, const void *p, uint64_t n) { return crc_more(crc, p, n); }

/* The little-endian 64-bit number at b: a file's header length. */
static uint64_t get_le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

/* ---- growable arrays ---------------------------------------------------------- */

/* Room for `need` elements of `size` bytes in the array that *arrp points
 * to, whose capacity *cap doubles as needed (8 at first). */
static bool grow(void *arrp, int *cap, int need, size_t size)
{
    if (need <= *cap) return true;
    int nc = *cap ? *cap : 8;
    while (nc < need) nc *= 2;
    void *old;
    memcpy(&old, arrp, sizeof old);
    void *p = realloc(old, (size_t)nc * size);
    if (!p) return false;
    memcpy(arrp, &p, sizeof p);
    *cap = nc;
    return true;
}

/* Takes k and v (freed on failure). */
static bool add_meta(char ***meta, int *n, int *cap, char *k, char *v)
{
    if (!grow(meta, cap, *n + 1, 2 * sizeof **meta)) {
        free(k);
        free(v);
        return false;
    }
    (*meta)[2 * *n] = k;
    (*meta)[2 * *n + 1] = v;
    (*n)++;
    return true;
}

/* ---- the header, through the JSON pull reader (core/json.h) -------------------- */

/* Every parse_* below returns false with the reason in r->err (at r->err_at,
 * a byte offset into the header). */

static bool reader_oom(gp_json_reader *r)
{
    r->oom = true;
    return gp_json_fail(r, "out of host memory");
}

/* [u, u, ...] with at most `max` entries. */
static bool parse_uint_list(gp_json_reader *r, uint64_t *v, int max, int *count)
{
    *count = 0;
    if (gp_json_peek(r) != GP_JSON_ARRAY) return gp_json_fail(r, "expected a list");
    if (!gp_json_enter_array(r)) return false;
    while (gp_json_next_item(r)) {
        if (*count >= max) return gp_json_fail(r, "list too long (at most %d entries)", max);
        if (!gp_json_read_uint(r, &v[(*count)++])) return false;
    }
    return !r->err[0];
}

static bool parse_dtype(gp_json_reader *r, gp_st_tensor *t)
{
    char *d;
    if (!gp_json_read_string(r, &d)) return false;
    int k = 0;
    while (k < N_DTYPES && strcmp(d, k_dtypes[k].name)) k++;
    if (k < N_DTYPES) {
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", d);
        t->dtype = k == 0 ? GP_ST_F32 : k == 1 ? GP_ST_I64 : GP_ST_OTHER;
    } else {
        gp_json_fail(r, "unknown dtype '%.20s'", d);
    }
    free(d);
    return k < N_DTYPES;
}

static bool parse_tensor(gp_json_reader *r, gp_st_tensor *t)
{
    if (gp_json_peek(r) != GP_JSON_OBJECT)
        return gp_json_fail(r, "expected a tensor description {dtype, shape, data_offsets}");
    if (!gp_json_enter_object(r)) return false;
    bool have_d = false, have_s = false, have_o = false;
    char *key;
    while (gp_json_next_member(r, &key)) {
        bool ok;
        if (!strcmp(key, "dtype") && !have_d) {
            ok = parse_dtype(r, t);
            have_d = true;
        } else if (!strcmp(key, "shape") && !have_s) {
            uint64_t v[GP_ST_MAX_DIMS];
            ok = parse_uint_list(r, v, GP_ST_MAX_DIMS, &t->ndim);
            for (int i = 0; ok && i < t->ndim; i++) {
                if (v[i] > (uint64_t)INT64_MAX) ok = gp_json_fail(r, "dimension out of range");
                t->dims[i] = (int64_t)v[i];
            }
            have_s = true;
        } else if (!strcmp(key, "data_offsets") && !have_o) {
            uint64_t v[2];
            int c;
            ok = parse_uint_list(r, v, 2, &c);
            if (ok && c != 2) ok = gp_json_fail(r, "data_offsets needs [begin, end]");
            if (ok) {
                t->begin = v[0];
                t->end = v[1];
            }
            have_o = true;
        } else {
            ok = gp_json_fail(r, "unknown or repeated key '%.40s' in a tensor description",
                              key);
        }
        free(key);
        if (!ok) return false;
    }
    if (r->err[0]) return false;
    if (!have_d || !have_s || !have_o)
        return gp_json_fail(r, "a tensor description needs dtype, shape and data_offsets");
    return true;
}

static bool parse_meta(gp_json_reader *r, gp_st_file *f, int *cap)
{
    if (gp_json_peek(r) != GP_JSON_OBJECT)
        return gp_json_fail(r, "__metadata__ must be a map of strings");
    if (!gp_json_enter_object(r)) return false;
    char *k, *v;
    while (gp_json_next_member(r, &k)) {
        if (gp_json_peek(r) != GP_JSON_STRING) {
            free(k);
            return gp_json_fail(r, "__metadata__ values must be strings");
        }
        if (!gp_json_read_string(r, &v)) {
            free(k);
            return false;
        }
        if (!add_meta(&f->meta, &f->n_meta, cap, k, v)) return reader_oom(r);
    }
    return !r->err[0];
}

static bool parse_header(gp_json_reader *r, gp_st_file *f)
{
    int cap = 0, mcap = 0;
    bool have_meta = false;
    if (gp_json_peek(r) != GP_JSON_OBJECT) return gp_json_fail(r, "the header must be a JSON object");
    if (!gp_json_enter_object(r)) return false;
    char *key;
    while (gp_json_next_member(r, &key)) {
        if (!strcmp(key, "__metadata__")) {
            free(key);
            if (have_meta) return gp_json_fail(r, "__metadata__ given twice");
            have_meta = true;
            if (!parse_meta(r, f, &mcap)) return false;
            continue;
        }
        if (!grow(&f->tensors, &cap, f->n + 1, sizeof *f->tensors)) {
            free(key);
            return reader_oom(r);
        }
        gp_st_tensor *t = &f->tensors[f->n++];
        memset(t, 0, sizeof *t);
        t->name = key;
        if (!parse_tensor(r, t)) return false;
    }
    if (r->err[0]) return false;
    if (!gp_json_at_end(r)) return gp_json_fail(r, "trailing bytes after the header object");
    return true;
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
    for (int i = 0; i < f->n && s == GP_OK; i++) {
        f->tensors[i].data = f->data ? f->data + f->tensors[i].begin : NULL; /* header only */
        f->tensors[i].part = -1;
    }
    free(v);
    return s;
}

/* gp_st_parse, or with file_len > len the header alone: buf holds the
 * file's first len bytes (the length and the header), the data section
 * is file_len - 8 - header bytes and not read (tensors' data NULL). */
static gp_status parse_buf(const char *name, const uint8_t *buf, uint8_t *own, size_t len,
                           size_t file_len, gp_st_file *out);

static gp_status parse(const char *name, const uint8_t *buf, size_t len, size_t file_len,
                       gp_st_file *out)
{
    return parse_buf(name, buf, NULL, len, file_len, out);
}

/* What a file that is no safetensors looks like from its first 8 bytes,
 * for the message: llm.c's model file (its header's magic), or text (a
 * config given where weights go); "" otherwise. */
static const char *other_kind(const uint8_t *b)
{
    uint32_t magic = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24;
    if (magic == 20240326u)
        return "; it is llm.c's GPT-2 model file (its magic number), which model.init_from reads";
    if (magic == 20240520u || magic == 20240801u)
        return "; it is an llm.c token file (its magic number), which data.path reads";
    int text = 0;
    for (int k = 0; k < 8; k++)
        text += (b[k] >= 0x20 && b[k] < 0x7f) || b[k] == '\n' || b[k] == '\t' || b[k] == '\r';
    return text == 8 ? "; it begins as text (a config or a script?), not as weights" : "";
}

/* The error for a file of len bytes whose first 8 (buf) give header
 * length hl, more than the format allows or than the file holds (it said
 * "header length N but the file has N bytes" of a file 8 + N - 1 long). */
static gp_status header_length_error(const char *name, uint64_t hl, size_t len,
                                     const uint8_t *buf)
{
    if (hl > GP_ST_MAX_HEADER)
        return gp_error_set(GP_ERR_DATA, "%s: not a safetensors file: its first 8 bytes give a "
                            "header length of %llu, more than the format's %llu%s", name,
                            (unsigned long long)hl, (unsigned long long)GP_ST_MAX_HEADER,
                            other_kind(buf));
    return gp_error_set(GP_ERR_DATA, "%s: not a safetensors file (or truncated): its header "
                        "needs 8 + %llu = %llu bytes, but the file has %zu%s", name,
                        (unsigned long long)hl, (unsigned long long)hl + 8, len,
                        other_kind(buf));
}

/* parse, the image being `own` (malloc'd: taken, freed on failure) where
 * given, else a copy of buf. */
static gp_status parse_buf(const char *name, const uint8_t *buf, uint8_t *own, size_t len,
                           size_t file_len, gp_st_file *out)
{
    memset(out, 0, sizeof *out);
    if (own) buf = own;
    gp_status s0 = GP_OK;
    if (!name) name = "<safetensors>";
    snprintf(out->source, sizeof out->source, "%s", name);
    uint64_t hl = len >= 8 ? get_le64(buf) : 0;
    bool header_only = file_len > len;
    if (len < 8)
        s0 = gp_error_set(GP_ERR_DATA, "%s: not a safetensors file: %zu bytes, shorter than "
                                       "the 8-byte header length", name, len);
    else if (hl > GP_ST_MAX_HEADER || hl > len - 8)
        s0 = header_length_error(name, hl, len, buf);
    else if (hl < 2 || buf[8] != '{')
        s0 = gp_error_set(GP_ERR_DATA, "%s: not a safetensors file: the header does not "
                                       "start with '{'", name);
    if (s0 != GP_OK) {
        free(own);
        return s0;
    }
    out->image = own ? own : malloc(len);
    if (!out->image) return gp_error_set(GP_ERR_OOM, "%s: out of host memory (%zu bytes)", name, len);
    if (!own) memcpy(out->image, buf, len);
    out->data = header_only ? NULL : out->image + 8 + hl;
    out->data_len = file_len - 8 - hl;
    gp_json_reader r;
    gp_json_reader_init(&r, (const char *)out->image + 8, hl);
    gp_status s = GP_OK;
    if (!parse_header(&r, out)) {
        if (r.oom) s = gp_error_set(GP_ERR_OOM, "%s: out of host memory reading the header", name);
        else s = gp_error_set(GP_ERR_DATA, "%s: not a safetensors file: bad JSON header at byte "
                              "%llu: %s", name, (unsigned long long)(8 + r.err_at), r.err);
    }
    if (s == GP_OK) s = check_layout(out);
    if (s != GP_OK) gp_st_free(out);
    return s;
}

gp_status gp_st_parse(const char *name, const uint8_t *buf, size_t len, gp_st_file *out)
{
    return parse(name, buf, len, len, out);
}

/* path opened for reading, a regular file of *len bytes. */
static gp_status open_regular(const char *path, FILE **out, size_t *len)
{
    FILE *f = gp_fopen_regular(path);
    if (!f) {
        int e = errno;
        return gp_error_set(GP_ERR_IO, "cannot open '%s': %s", path, gp_open_strerror(e));
    }
    struct stat st; /* a regular file (gp_fopen_regular): its size */
    if (fstat(fileno(f), &st) != 0) {
        int e = errno;
        fclose(f);
        return gp_error_set(GP_ERR_IO, "cannot read '%s': %s", path, strerror(e));
    }
    *out = f;
    *len = (size_t)st.st_size;
    return GP_OK;
}

gp_status gp_st_pread(int fd, const char *path, uint64_t off, uint8_t *buf, size_t bytes)
{
    size_t got = 0;
    while (got < bytes) {
        ssize_t r = pread(fd, buf + got, bytes - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return gp_error_set(GP_ERR_IO, "cannot read %zu bytes at %llu of '%s': %s", bytes,
                                (unsigned long long)off, path,
                                r < 0 ? strerror(errno) : "the file is shorter");
        got += (size_t)r;
    }
    return GP_OK;
}

gp_st_wide gp_st_wide_of(const gp_st_tensor *t)
{
    if (t->dtype == GP_ST_F32) return GP_ST_WIDE_F32;
    if (!strcmp(t->dtype_name, "BF16")) return GP_ST_WIDE_BF16;
    if (!strcmp(t->dtype_name, "F16")) return GP_ST_WIDE_F16;
    return GP_ST_WIDE_NONE;
}

float gp_st_widen(const uint8_t *data, gp_st_wide k, int64_t i)
{
    float v;
    if (k == GP_ST_WIDE_F32) {
        memcpy(&v, data + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, data + 2 * i, 2);
    if (k == GP_ST_WIDE_BF16) {
        uint32_t u = (uint32_t)h << 16;
        memcpy(&v, &u, 4);
        return v;
    }
    int e = (h >> 10) & 31, m = h & 1023; /* F16 */
    v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                               : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

gp_status gp_st_read_header(const char *path, gp_st_file *out)
{
    memset(out, 0, sizeof *out);
    FILE *f;
    size_t file_len;
    GP_TRY(open_regular(path, &f, &file_len));
    uint8_t lb[8];
    if (fread(lb, 1, 8, f) != 8) {
        fclose(f);
        return gp_error_set(GP_ERR_IO, "'%s' is not a readable safetensors file", path);
    }
    uint64_t hl = get_le64(lb);
    if (hl > GP_ST_MAX_HEADER || hl > file_len - 8) {
        fclose(f);
        return header_length_error(path, hl, file_len, lb);
    }
    uint8_t *buf = malloc(8 + hl);
    if (!buf) {
        fclose(f);
        return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", path);
    }
    memcpy(buf, lb, 8);
    size_t got = fread(buf + 8, 1, hl, f);
    fclose(f);
    if (got != hl) {
        free(buf);
        return gp_error_set(GP_ERR_IO, "cannot read the header of '%s'", path);
    }
    /* (a file of header only is a whole file: parse it as one) */
    gp_status s = parse(path, buf, 8 + hl, file_len, out);
    free(buf);
    return s;
}

gp_status gp_st_read(const char *path, gp_st_file *out)
{
    memset(out, 0, sizeof *out);
    FILE *f;
    size_t len;
    GP_TRY(open_regular(path, &f, &len));
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
    return parse_buf(path, NULL, buf, len, len, out); /* the image is buf: one copy */
}

void gp_st_free(gp_st_file *f)
{
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
    free(f->meta);
    free(f->image);
    for (int q = 0; q < f->n_parts; q++) {
        gp_st_free(&f->parts[q]);
        free(f->part_paths ? f->part_paths[q] : NULL);
    }
    free(f->parts);
    free(f->part_paths);
    if (f->fetch_free) f->fetch_free(f->fetch_ctx);
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

/* The header's own checksum, gpipe.header_crc32 (gpipe.crc32 covers the
 * data only): every metadata pair but those two, and every tensor's name,
 * dtype, shape and offsets, each item's CRC-32 summed, so the order the
 * parser keeps them in does not matter and one flipped bit anywhere in
 * them changes it.  own_only: a read file's tensors from other parts
 * (part >= 0) are not its header's. */
static uint32_t header_crc(char *const *meta, int n_meta, const gp_st_tensor *t, int n,
                           bool own_only)
{
    uint32_t sum = 0;
    for (int i = 0; i < n_meta; i++) {
        /* itself, and the data's checksum (which the data checks) */
        if (!strcmp(meta[2 * i], "gpipe.header_crc32") || !strcmp(meta[2 * i], "gpipe.crc32"))
            continue;
        uint32_t c = crc_more(0, (const uint8_t *)meta[2 * i], strlen(meta[2 * i]) + 1);
        sum += crc_more(c, (const uint8_t *)meta[2 * i + 1], strlen(meta[2 * i + 1]));
    }
    for (int k = 0; k < n; k++) {
        if (own_only && t[k].part >= 0) continue;
        char b[256];
        int len = snprintf(b, sizeof b, "|%s|%d", t[k].dtype_name, t[k].ndim);
        for (int d = 0; d < t[k].ndim && len > 0 && (size_t)len < sizeof b; d++)
            len += snprintf(b + len, sizeof b - (size_t)len, "|%lld", (long long)t[k].dims[d]);
        if (len > 0 && (size_t)len < sizeof b)
            len += snprintf(b + len, sizeof b - (size_t)len, "|%llu|%llu",
                            (unsigned long long)t[k].begin, (unsigned long long)t[k].end);
        if (len < 0 || (size_t)len >= sizeof b) len = (int)strlen(b);
        uint32_t c = crc_more(0, (const uint8_t *)t[k].name, strlen(t[k].name));
        sum += crc_more(c, (const uint8_t *)b, (uint64_t)len);
    }
    return sum;
}

/* A header with gpipe.header_crc32 must match it (files from before it
 * have none and are taken as they are). */
static gp_status check_header_crc(const gp_st_file *f)
{
    const char *c = gp_st_meta(f, "gpipe.header_crc32");
    if (!c) return GP_OK;
    char *e;
    errno = 0;
    unsigned long want = strtoul(c, &e, 16);
    if (errno || *e || e == c || want > 0xffffffffUL)
        return gp_error_set(GP_ERR_DATA, "%s: malformed header checksum '%.20s'", f->source, c);
    uint32_t got = header_crc(f->meta, f->n_meta, f->tensors, f->n, true);
    if (got == (uint32_t)want) return GP_OK;
    return gp_error_set(GP_ERR_DATA, "%s: header checksum mismatch (CRC-32 sum of the metadata "
                        "and tensor entries is %08x, the header says %08lx): the header is "
                        "corrupted or was edited; use an older snapshot", f->source, got, want);
}

/* The checksum gpipe.crc32 of f in *want (*has false, GP_OK, if there is
 * none and none is required). */
static gp_status crc_of_meta(const gp_st_file *f, bool required, bool *has, unsigned long *want)
{
    *has = false;
    const char *c = gp_st_meta(f, "gpipe.crc32");
    if (!c) {
        if (required)
            return gp_error_set(GP_ERR_DATA, "%s: no checksum (gpipe.crc32) in the metadata; "
                                             "not a gpipe snapshot", f->source);
        return GP_OK;
    }
    char *e;
    errno = 0;
    *want = strtoul(c, &e, 16);
    if (errno || *e || e == c || *want > 0xffffffffUL)
        return gp_error_set(GP_ERR_DATA, "%s: malformed checksum '%.20s'", f->source, c);
    *has = true;
    return GP_OK;
}

static gp_status crc_compare(const char *source, uint32_t got, unsigned long want)
{
    if (got == (uint32_t)want) return GP_OK;
    return gp_error_set(GP_ERR_DATA,
                        "%s: checksum mismatch (CRC-32 of the data is %08x, the header says "
                        "%08lx): the file is corrupted; use an older snapshot", source, got,
                        want);
}

gp_status gp_st_verify_file(const gp_st_file *hdr, const char *path)
{
    bool has;
    unsigned long want = 0;
    GP_TRY(check_header_crc(hdr));
    GP_TRY(crc_of_meta(hdr, true, &has, &want));
    FILE *f;
    size_t len;
    GP_TRY(open_regular(path, &f, &len));
    uint8_t lb[8];
    bool ok = fread(lb, 1, 8, f) == 8 && fseeko(f, (off_t)(8 + get_le64(lb)), SEEK_SET) == 0;
    uint8_t *buf = ok ? malloc(1 << 20) : NULL;
    uint32_t got = 0;
    uint64_t total = 0;
    size_t n;
    while (buf && (n = fread(buf, 1, 1 << 20, f)) > 0) {
        got = crc_more(got, buf, n);
        total += n;
    }
    ok = buf && !ferror(f);
    free(buf);
    fclose(f);
    if (!ok) return gp_error_set(GP_ERR_IO, "cannot read '%s'", path);
    if (total != hdr->data_len)
        return gp_error_set(GP_ERR_DATA, "%s: %llu data bytes, the header says %llu: the file is "
                            "truncated", path, (unsigned long long)total,
                            (unsigned long long)hdr->data_len);
    return crc_compare(path, got, want);
}

gp_status gp_st_verify(const gp_st_file *f, bool required)
{
    bool has;
    unsigned long want = 0;
    GP_TRY(check_header_crc(f));
    GP_TRY(crc_of_meta(f, required, &has, &want));
    return has ? crc_compare(f->source, crc_more(0, f->data, f->data_len), want) : GP_OK;
}

/* ---- the writer ----------------------------------------------------------- */

/* Files of DIRECT_MIN of data or more are written with O_DIRECT (below),
 * which wants buffer, file offset and length aligned to DIRECT_ALIGN: such
 * a file's header is padded so that its data section starts at a multiple
 * of DIRECT_ALIGN, and a tensor of SLOT_ALIGNED_MIN bytes or more gets a
 * buffer that lies as its offset in the data section does (data ==
 * offset, modulo DIRECT_ALIGN), so that its whole aligned middle goes
 * from its buffer to the disk with no copy into the bounce buffer (358 MB
 * of memory traffic less per snapshot of ResNet-101's state). */
#define DIRECT_MIN ((uint64_t)8 << 20)
#define DIRECT_CHUNK ((size_t)8 << 20) /* the bounce buffer: a multiple of DIRECT_ALIGN */
#define DIRECT_ALIGN 4096              /* the largest logical block size in use */
#define SLOT_ALIGNED_MIN ((size_t)64 << 10)

/* A buffer of `bytes` for a tensor at offset `begin` of the data section. */
static uint8_t *slot_alloc(size_t bytes, uint64_t begin)
{
    if (bytes < SLOT_ALIGNED_MIN) return malloc(bytes ? bytes : 1);
    size_t lead = (size_t)(begin % DIRECT_ALIGN);
    size_t size = (lead + bytes + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    uint8_t *block = aligned_alloc(DIRECT_ALIGN, size);
    return block ? block + lead : NULL;
}

static void slot_free(const gp_st_tensor *t)
{
    size_t bytes = (size_t)(t->end - t->begin);
    uint8_t *p = (uint8_t *)t->data;
    free(p && bytes >= SLOT_ALIGNED_MIN ? p - (uintptr_t)p % DIRECT_ALIGN : p);
}

gp_status gp_st_writer_slot(gp_st_writer *w, const char *name, gp_st_dtype dtype, int ndim,
                            const int64_t *dims, size_t bytes, void **data)
{
    GP_ASSERT(ndim >= 0 && ndim <= GP_ST_MAX_DIMS && dtype != GP_ST_OTHER);
    if (!grow(&w->tensors, &w->cap, w->n + 1, sizeof *w->tensors))
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    gp_st_tensor *t = &w->tensors[w->n];
    w->crc_known = false;
    char *nm = NULL;
    uint8_t *buf = NULL;
    if (w->n < w->n_kept) { /* the last write's tensor here: its buffer, if it fits */
        if (t->end - t->begin == bytes && !strcmp(t->name, name) &&
            t->begin % DIRECT_ALIGN == w->data_len % DIRECT_ALIGN) {
            nm = t->name;
            buf = (uint8_t *)t->data;
        } else {
            free(t->name);
            slot_free(t);
        }
    }
    uint64_t begin = w->data_len;
    memset(t, 0, sizeof *t);
    if (!nm) nm = strdup(name);
    if (!buf) buf = slot_alloc(bytes, begin);
    t->begin = begin; /* (slot_free's) */
    t->end = begin + bytes;
    if (!nm || !buf) {
        free(nm);
        t->data = buf;
        slot_free(t);
        t->data = NULL;
        return gp_error_set(GP_ERR_OOM, "out of host memory gathering '%s'", name);
    }
    t->name = nm;
    t->data = buf;
    t->dtype = dtype;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dtype_name(dtype));
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->dims[d] = dims[d];
    w->data_len = t->end;
    w->n++;
    *data = buf;
    return GP_OK;
}

gp_status gp_st_writer_add(gp_st_writer *w, const char *name, gp_st_dtype dtype, int ndim,
                           const int64_t *dims, const void *data, size_t bytes)
{
    void *dst;
    GP_TRY(gp_st_writer_slot(w, name, dtype, ndim, dims, bytes, &dst));
    memcpy(dst, data, bytes);
    return GP_OK;
}

void gp_st_writer_reuse(gp_st_writer *w)
{
    if (w->n > w->n_kept) w->n_kept = w->n;
    w->n = 0;
    w->data_len = 0;
    w->crc_known = false;
    for (int i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    w->n_meta = 0;
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
    if (!add_meta(&w->meta, &w->n_meta, &w->meta_cap, k, v))
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    return GP_OK;
}

void gp_st_writer_free(gp_st_writer *w)
{
    if (!w) return;
    for (int i = 0; i < (w->n > w->n_kept ? w->n : w->n_kept); i++) {
        free(w->tensors[i].name);
        slot_free(&w->tensors[i]);
    }
    free(w->tensors);
    for (int i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->meta);
    memset(w, 0, sizeof *w);
}

/* The header JSON padded with spaces to a multiple of 8, after the CRC of
 * the data went into the metadata. */
static gp_status build_header(gp_st_writer *w, gp_json_writer *h)
{
    uint32_t crc = w->crc_known ? w->crc : 0;
    for (int i = 0; i < w->n && !w->crc_known; i++)
        crc = crc_more(crc, w->tensors[i].data, w->tensors[i].end - w->tensors[i].begin);
    char hex[16];
    snprintf(hex, sizeof hex, "%08lx", (unsigned long)crc);
    GP_TRY(gp_st_writer_meta(w, "gpipe.crc32", hex));
    snprintf(hex, sizeof hex, "%08lx",
             (unsigned long)header_crc(w->meta, w->n_meta, w->tensors, w->n, false));
    GP_TRY(gp_st_writer_meta(w, "gpipe.header_crc32", hex));
    gp_json_open_object(h, NULL);
    if (w->n_meta) {
        gp_json_open_object(h, "__metadata__");
        for (int i = 0; i < w->n_meta; i++) gp_json_put_str(h, w->meta[2 * i], w->meta[2 * i + 1]);
        gp_json_close(h);
    }
    for (int i = 0; i < w->n; i++) {
        const gp_st_tensor *t = &w->tensors[i];
        gp_json_open_object(h, t->name);
        gp_json_put_str(h, "dtype", t->dtype_name);
        gp_json_open_array(h, "shape");
        for (int d = 0; d < t->ndim; d++) gp_json_put_int(h, NULL, t->dims[d]);
        gp_json_close(h);
        gp_json_open_array(h, "data_offsets");
        gp_json_put_uint(h, NULL, t->begin);
        gp_json_put_uint(h, NULL, t->end);
        gp_json_close(h);
        gp_json_close(h);
    }
    gp_json_close(h);
    /* a file written with O_DIRECT: its data section page-aligned (above) */
    size_t align = w->data_len >= DIRECT_MIN ? DIRECT_ALIGN : 8;
    while (!h->oom && (8 + h->len) % align != 0) gp_json_put_raw(h, " ");
    if (h->oom) {
        gp_json_writer_free(h);
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
    gp_json_writer h = {0};
    GP_TRY(build_header(w, &h));
    size_t total = 8 + h.len + (size_t)w->data_len;
    uint8_t *b = malloc(total);
    if (!b) {
        gp_json_writer_free(&h);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    le64(b, h.len);
    memcpy(b + 8, h.text, h.len);
    for (int i = 0; i < w->n; i++)
        memcpy(b + 8 + h.len + w->tensors[i].begin, w->tensors[i].data,
               (size_t)(w->tensors[i].end - w->tensors[i].begin));
    gp_json_writer_free(&h);
    *out = b;
    *len = total;
    return GP_OK;
}

gp_status gp_st_writer_to_file(gp_st_writer *w, const char *source, gp_st_file *out)
{
    memset(out, 0, sizeof *out);
    gp_json_writer h = {0};
    GP_TRY(build_header(w, &h));
    size_t total = 8 + h.len + (size_t)w->data_len;
    uint8_t *b = malloc(total); /* (large: mapped pages, resident once written) */
    if (!b) {
        gp_json_writer_free(&h);
        return gp_error_set(GP_ERR_OOM, "out of host memory (%zu bytes) for %s", total, source);
    }
    le64(b, h.len);
    memcpy(b + 8, h.text, h.len);
    /* each tensor's buffer freed once copied: the two never hold all of
     * it twice */
    for (int i = 0; i < w->n; i++) {
        gp_st_tensor *t = &w->tensors[i];
        memcpy(b + 8 + h.len + t->begin, t->data, (size_t)(t->end - t->begin));
        slot_free(t);
        t->data = NULL;
    }
    gp_json_writer_free(&h);
    return parse_buf(source, NULL, b, total, total, out);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---- large files around the page cache ---------------------------------------- */

/* A file with DIRECT_MIN of data or more is written with O_DIRECT: from
 * the writer's buffers to the disk, without first copying it into
 * page-cache pages the kernel has to find (a snapshot's hundreds of
 * megabytes every few steps; where a virtual machine's host takes freed
 * pages back, as on the machine bench/snapshot_step.sh ran on, finding them
 * cost 1 to 1.6 s of CPU per 358 MB against 0.07 s this way).  Smaller
 * files (weights of small models, the tests' snapshots) go through stdio
 * as before.  (DIRECT_MIN, DIRECT_CHUNK and DIRECT_ALIGN are with the writer, above.) */

/* The file as aligned chunks: bytes gathered in buf, written at `off`
 * once DIRECT_CHUNK are there (O_DIRECT wants buffer, offset and length
 * aligned; the tensors' buffers and offsets in the file are not). */
typedef struct {
    int fd;
    uint8_t *buf;               /* DIRECT_CHUNK bytes, DIRECT_ALIGN-aligned */
    size_t fill;                /* bytes gathered in buf */
    off_t off;                  /* where buf[0] goes in the file */
    int err;                    /* errno of the failure */
} direct_out;

/* len bytes of src at d->off (all three aligned), d->off moved past them. */
static bool direct_write(direct_out *d, const uint8_t *src, size_t len)
{
    size_t done = 0;
    while (done < len) { /* (a short write leaves an unaligned rest: EINVAL next) */
        ssize_t k = pwrite(d->fd, src + done, len - done, d->off + (off_t)done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            d->err = k < 0 ? errno : EIO;
            return false;
        }
        done += (size_t)k;
    }
    d->off += (off_t)len;
    return true;
}

static bool direct_flush(direct_out *d, size_t len)
{
    if (!direct_write(d, d->buf, len)) return false;
    d->fill = 0;
    return true;
}

/* n bytes of p next in the file: through the bounce buffer, except where p
 * lies as its place in the file does (p == d->off + d->fill, modulo
 * DIRECT_ALIGN: slot_alloc's buffers in a file whose data section is
 * aligned), whose aligned middle goes straight from p. */
static bool direct_put(direct_out *d, const uint8_t *p, size_t n)
{
    while (n > 0) {
        bool lined_up = ((uintptr_t)p - d->fill) % DIRECT_ALIGN == 0; /* (d->off is aligned) */
        if (lined_up && d->fill % DIRECT_ALIGN == 0 && n >= DIRECT_ALIGN) {
            if (d->fill > 0 && !direct_flush(d, d->fill)) return false;
            size_t k = n - n % DIRECT_ALIGN;
            if (!direct_write(d, p, k)) return false;
            p += k;
            n -= k;
            continue;
        }
        size_t k = DIRECT_CHUNK - d->fill < n ? DIRECT_CHUNK - d->fill : n;
        if (lined_up && n >= DIRECT_ALIGN) /* up to where p is aligned, then straight */
            k = DIRECT_ALIGN - d->fill % DIRECT_ALIGN;
        memcpy(d->buf + d->fill, p, k);
        d->fill += k;
        p += k;
        n -= k;
        if (d->fill == DIRECT_CHUNK && !direct_flush(d, DIRECT_CHUNK)) return false;
    }
    return true;
}

/* The file (8-byte length, header, data) into f's descriptor with
 * O_DIRECT: the last chunk padded to DIRECT_ALIGN with zeros, then cut back
 * to the file's length.  0, or the errno it failed with; EINVAL when the
 * file system takes no O_DIRECT write (or no bounce buffer could be had),
 * and the caller writes it through the page cache instead.  The same fsync
 * (gp_atomic_commit's) makes it durable. */
static int write_direct(gp_st_writer *w, FILE *f, const uint8_t lb[8], const gp_json_writer *h,
                        long slow)
{
    int fd = fileno(f);
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) return EINVAL;
    direct_out d = {.fd = fd, .buf = aligned_alloc(DIRECT_ALIGN, DIRECT_CHUNK)};
    bool ok = d.buf != NULL;
    if (!ok) d.err = EINVAL;
    if (ok) ok = direct_put(&d, lb, 8) && direct_put(&d, (const uint8_t *)h->text, h->len);
    for (int i = 0; i < w->n && ok; i++) {
        ok = direct_put(&d, w->tensors[i].data, (size_t)(w->tensors[i].end - w->tensors[i].begin));
        if (slow > 0 && i == w->n / 2) sleep_ms(slow);
    }
    off_t len = d.off + (off_t)d.fill;
    if (ok && d.fill > 0) {
        size_t pad = (DIRECT_ALIGN - d.fill % DIRECT_ALIGN) % DIRECT_ALIGN;
        memset(d.buf + d.fill, 0, pad);
        ok = direct_flush(&d, d.fill + pad);
    }
    if (ok && ftruncate(fd, len) != 0) {
        ok = false;
        d.err = errno;
    }
    free(d.buf);
    fcntl(fd, F_SETFL, flags);
    return ok ? 0 : d.err;
}

gp_status gp_st_write_atomic(gp_st_writer *w, const char *path)
{
    gp_json_writer h = {0};
    GP_TRY(build_header(w, &h));
    int64_t slow = 0; /* a test hook (test_snapshot.c) */
    gp_status es = gp_env_int("GPIPE_SNAPSHOT_SLOW_WRITE_MS", 0, 0, 3600000, &slow);
    if (es != GP_OK) {
        gp_json_writer_free(&h);
        return es;
    }
    gp_atomic_file a;
    gp_status s = gp_atomic_open(path, &a);
    if (s != GP_OK) {
        gp_json_writer_free(&h);
        return s;
    }
    FILE *f = a.f;
    uint8_t lb[8];
    le64(lb, h.len);
    int err = -1; /* not written yet */
    if (w->data_len >= DIRECT_MIN) {
        err = write_direct(w, f, lb, &h, slow);
        if (err == EINVAL) err = ftruncate(fileno(f), 0) != 0 ? errno : -1; /* from the start */
    }
    if (err < 0) { /* through the page cache */
        bool ok = fwrite(lb, 1, 8, f) == 8 && fwrite(h.text, 1, h.len, f) == h.len;
        for (int i = 0; i < w->n && ok; i++) {
            size_t bytes = (size_t)(w->tensors[i].end - w->tensors[i].begin);
            ok = fwrite(w->tensors[i].data, 1, bytes, f) == bytes;
            if (slow > 0 && i == w->n / 2) {
                fflush(f);
                sleep_ms(slow);
            }
        }
        err = ok ? 0 : errno ? errno : EIO;
    }
    gp_json_writer_free(&h);
    return gp_atomic_commit(&a, err);
}

/* ---- gpipe's tensor names ----------------------------------------------- */

bool gp_weights_by_name(const gp_layer *layers, int n_layers)
{
    for (int k = 0; k < n_layers; k++)
        if (!layers[k].spec.name[0]) return false;
    return n_layers > 0;
}

const char *gp_weights_tensor_name(char *buf, size_t len, const char *prefix,
                                   const gp_layer *layers, int k, bool by_name,
                                   const char *what)
{
    if (by_name) snprintf(buf, len, "%s%s.%s", prefix, layers[k].spec.name, what);
    else snprintf(buf, len, "%s%d.%s", prefix, k, what);
    return buf;
}

bool gp_weights_has(const gp_wmodel *m, const char *name, int *ndim, int64_t *dims)
{
    char tn[256];
    const bool by_name = gp_weights_by_name(m->layers, m->n_layers);
    for (int k = 0; k < m->n_layers; k++) {
        const gp_layer *l = &m->layers[k];
        for (int p = 0; p < l->n_params; p++) {
            if (l->params[p].tied) continue; /* its owner's tensor, named as the owner's */
            if (strcmp(gp_weights_tensor_name(tn, sizeof tn, "", m->layers, k, by_name,
                                              l->params[p].name),
                       name))
                continue;
            const gp_tensor *t = &l->params[p].value;
            if (ndim) *ndim = t->ndim;
            if (dims) memcpy(dims, t->dims, (size_t)t->ndim * sizeof *dims);
            return true;
        }
    }
    return false;
}

gp_status gp_weights_write_json(gp_json_writer *w, const char *path)
{
    gp_json_put_raw(w, "\n");
    gp_status s = w->oom ? gp_error_set(GP_ERR_OOM, "out of host memory writing %s", path) : GP_OK;
    gp_atomic_file af;
    if (s == GP_OK) s = gp_atomic_open(path, &af);
    if (s == GP_OK)
        s = gp_atomic_commit(&af, fwrite(w->text, 1, w->len, af.f) == w->len ? 0 : EIO);
    gp_json_writer_free(w);
    return s;
}
