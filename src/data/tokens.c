/*
 * tokens.c — data.dataset: tokens, llm.c's token files: a header of 256
 * little-endian int32 (magic 20240520, version 1, token count), then the
 * tokens as little-endian uint16 (GPT-2's 50257 ids, or bytes); or llm.c's
 * Llama 3 files (magic 20240801, version 7) of little-endian uint32 tokens
 * (Llama 3's 128,256 ids).  scripts/tokenize_text.py writes both from
 * text.
 *
 * A split is read whole with stdio, as the other in-memory readers do: a
 * tiny corpus is a few MB and GPT-2's fineweb shards 200 MB, so the copy
 * costs little, and a file that changes under a run cannot change what it
 * trains on.  The header is checked against the file's size before the
 * tokens are allocated, so a corrupt count cannot ask for unbounded memory.
 *
 * Memory: the dataset owns its tokens (gp_dataset_free).  On failure the
 * output is left unchanged.
 */
#include "data/data.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TOKENS_WHAT "write it again with scripts/tokenize_text.py (or llm.c's data scripts)"

static int32_t le32(const unsigned char *b)
{
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24);
}

/* The header's checks, given the file's size in bytes: *count the tokens,
 * *width their bytes (2, or 4 for llm.c's Llama 3 files). */
static gp_status tokens_header(const char *path, const unsigned char *hdr, int64_t got,
                               int64_t size, int64_t seq_len, int64_t *count, int *width)
{
    const int64_t hb = 4 * GP_TOKENS_HEADER;
    if (got >= 4 && le32(hdr) != GP_TOKENS_MAGIC && le32(hdr) != GP_TOKENS_MAGIC32)
        return gp_error_set(GP_ERR_DATA, "%s: bad magic %d, expected %d (uint16 tokens) or %d "
                            "(uint32, llm.c's Llama 3 files): not an llm.c token file (a header "
                            "of 256 int32, then the tokens); %s", path, le32(hdr),
                            GP_TOKENS_MAGIC, GP_TOKENS_MAGIC32, TOKENS_WHAT);
    if (got < hb)
        return gp_error_set(GP_ERR_DATA, "%s: truncated header: %lld of %lld bytes; %s", path,
                            (long long)got, (long long)hb, TOKENS_WHAT);
    bool wide = le32(hdr) == GP_TOKENS_MAGIC32;
    int32_t version = le32(hdr + 4), n = le32(hdr + 8);
    int32_t want_version = wide ? GP_TOKENS_VERSION32 : GP_TOKENS_VERSION;
    if (version != want_version)
        return gp_error_set(GP_ERR_DATA, "%s: version %d, but magic %d files are version %d "
                            "(%s tokens); %s", path, version, le32(hdr), want_version,
                            wide ? "uint32" : "uint16", TOKENS_WHAT);
    if (n < 0)
        return gp_error_set(GP_ERR_DATA, "%s: the header's token count is %d, negative; the "
                            "file is damaged: %s", path, n, TOKENS_WHAT);
    *width = wide ? 4 : 2;
    int64_t want = hb + *width * (int64_t)n;
    if (size < want)
        return gp_error_set(GP_ERR_DATA, "%s: truncated: its header counts %d tokens (%lld "
                            "bytes with the header) but the file has %lld bytes; %s", path, n,
                            (long long)want, (long long)size, TOKENS_WHAT);
    if (size > want)
        return gp_error_set(GP_ERR_DATA, "%s: the file goes on after the %d tokens its header "
                            "counts (%lld bytes with the header, the file has %lld): the count "
                            "does not match the data; is the file damaged or two files joined? "
                            "%s", path, n, (long long)want, (long long)size, TOKENS_WHAT);
    if ((int64_t)n < seq_len + 1)
        return gp_error_set(GP_ERR_DATA, "%s: %d tokens, fewer than one window of model.input "
                            "+ 1 = %lld; give a shorter sequence (model.input: [T]) or more "
                            "text", path, n, (long long)(seq_len + 1));
    *count = n;
    return GP_OK;
}

gp_status gp_tokens_read(const char *path, int64_t seq_len, gp_dataset *ds)
{
    if (seq_len < 1)
        return gp_error_set(GP_ERR_INVALID, "%s: sequence length %lld must be >= 1", path,
                            (long long)seq_len);
    FILE *f = gp_fopen_regular(path);
    if (!f)
        return gp_error_set(GP_ERR_IO, "cannot open '%s': %s", path, gp_open_strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        gp_status s = gp_error_set(GP_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
        fclose(f);
        return s;
    }
    unsigned char hdr[4 * GP_TOKENS_HEADER];
    int64_t got = (int64_t)fread(hdr, 1, sizeof hdr, f);
    int64_t n = 0;
    int width = 2;
    gp_status s = tokens_header(path, hdr, got, (int64_t)st.st_size, seq_len, &n, &width);
    uint32_t *tok = NULL;
    if (s == GP_OK) {
        tok = malloc(sizeof *tok * (size_t)(n ? n : 1));
        if (!tok)
            s = gp_error_set(GP_ERR_OOM, "%s: cannot allocate %lld tokens", path, (long long)n);
    }
    if (s == GP_OK) { /* read into the array's top, widened downwards in place below */
        unsigned char *raw = (unsigned char *)tok + (size_t)n * (4 - (size_t)width);
        size_t r = fread(raw, (size_t)width, (size_t)n, f);
        if ((int64_t)r != n)
            s = gp_error_set(GP_ERR_DATA, "%s: truncated while reading: %zu of %lld tokens "
                             "(did the file change?); %s", path, r, (long long)n, TOKENS_WHAT);
    }
    fclose(f);
    uint32_t maxid = 0;
    int64_t big = -1;
    const unsigned char *raw = (const unsigned char *)tok + (size_t)n * (4 - (size_t)width);
    for (int64_t i = 0; s == GP_OK && i < n; i++) { /* little-endian on any host */
        const unsigned char *b = raw + (size_t)i * (size_t)width;
        uint32_t v = width == 2 ? (uint32_t)(b[0] | b[1] << 8)
                                : (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                                      (uint32_t)b[3] << 24;
        tok[i] = v; /* (i's bytes start at or after i's word: written after read) */
        if (v > maxid) maxid = v;
        if (v >= (1u << 24) && big < 0) big = i;
    }
    if (s == GP_OK && big >= 0)
        s = gp_error_set(GP_ERR_DATA, "%s: token %lld is id %u, past 2^24 (16,777,216): gpipe "
                         "carries ids as floats, exact below it; no tokenizer has so many ids, "
                         "so the file is damaged", path, (long long)big, tok[big]);
    if (s != GP_OK) {
        free(tok);
        return s;
    }
    free(ds->tokens);
    ds->tokens = tok;
    ds->n_tokens = n;
    ds->token_bytes = width;
    ds->n = n / (seq_len + 1);
    ds->c = seq_len;
    ds->h = ds->w = 1;
    ds->classes = (int)maxid + 1; /* (below 2^24: checked above) */
    snprintf(ds->source, sizeof ds->source, "%s", path);
    return GP_OK;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t ls = strlen(s), lf = strlen(suf);
    return ls >= lf && !strcmp(s + ls - lf, suf);
}

/* "train.bin" or "<name>_train.bin" (kind "train" or "val"). */
static bool split_name(const char *name, const char *kind)
{
    char bare[16], under[16];
    snprintf(bare, sizeof bare, "%s.bin", kind);
    snprintf(under, sizeof under, "_%s.bin", kind);
    return !strcmp(name, bare) || ends_with(name, under);
}

int gp_tokens_candidates(const char *path, char (*out)[1100], int max)
{
    struct stat st;
    int n = 0;
    if (max < 2 || stat(path, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) {
        snprintf(out[n++], 1100, "%.1000s", path);
        if (ends_with(path, "train.bin"))
            snprintf(out[n++], 1100, "%.*sval.bin", (int)(strlen(path) - strlen("train.bin")),
                     path);
        return n;
    }
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max)
        if (split_name(e->d_name, "train") || split_name(e->d_name, "val"))
            snprintf(out[n++], 1100, "%.800s/%.256s", path, e->d_name);
    closedir(d);
    return n;
}

gp_status gp_tokens_files(const char *path, char train[1024], char val[1024])
{
    struct stat st;
    if (stat(path, &st) != 0)
        return gp_error_set(GP_ERR_IO, "tokens: data.path '%s': %s; make the token files with "
                            "scripts/tokenize_text.py", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (!ends_with(path, "train.bin"))
            return gp_error_set(GP_ERR_IO, "tokens: data.path '%s' is a file but not a "
                                "<name>_train.bin; name the training split's file or its "
                                "folder", path);
        size_t stem = strlen(path) - strlen("train.bin");
        snprintf(train, 1024, "%s", path);
        snprintf(val, 1024, "%.*sval.bin", (int)stem, path);
        if (stat(val, &st) != 0 || !S_ISREG(st.st_mode))
            return gp_error_set(GP_ERR_IO, "tokens: the validation split %s beside %s is "
                                "missing; scripts/tokenize_text.py writes both", val, path);
        return GP_OK;
    }
    DIR *d = opendir(path);
    if (!d)
        return gp_error_set(GP_ERR_IO, "tokens: cannot list data.path '%s': %s", path,
                            strerror(errno));
    int nt = 0, nv = 0;
    char first[2][256] = {"", ""}, second[2][256] = {"", ""};
    struct dirent *e;
    while ((e = readdir(d))) {
        for (int k = 0; k < 2; k++) {
            if (!split_name(e->d_name, k ? "val" : "train")) continue;
            int *cnt = k ? &nv : &nt;
            snprintf(*cnt == 0 ? first[k] : second[k], 256, "%s", e->d_name);
            (*cnt)++;
        }
    }
    closedir(d);
    for (int k = 0; k < 2; k++) {
        int cnt = k ? nv : nt;
        const char *kind = k ? "val" : "train";
        if (cnt == 0)
            return gp_error_set(GP_ERR_IO, "tokens: no <name>_%s.bin (or %s.bin) in %s; write "
                                "the splits with scripts/tokenize_text.py", kind, kind, path);
        if (cnt > 1)
            return gp_error_set(GP_ERR_IO, "tokens: %d %s splits in %s (%s, %s%s): the reader "
                                "takes one; point data.path at one <name>_train.bin",
                                cnt, kind, path, first[k], second[k], cnt > 2 ? ", ..." : "");
        snprintf(k ? val : train, 1024, "%.700s/%.255s", path, first[k]);
    }
    return GP_OK;
}
