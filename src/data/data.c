/*
 * data.c — datasets: the IDX (MNIST / Fashion-MNIST) and CIFAR-10 binary
 * readers, the synthetic learnable set, split loading with limits, and the
 * default normalisation statistics.
 *
 * Every reader validates a header before it allocates anything sized by it
 * (GP_DATA_MAX_BYTES / GP_DATA_MAX_SIDE) and grows its buffer only as bytes
 * actually arrive, so a corrupt header or a gzip bomb cannot make it ask for
 * unbounded memory.  All messages name the file and what was wrong.
 *
 * Memory: a gp_dataset owns its images and labels; gp_dataset_free releases
 * them.  On failure a reader leaves its output unchanged.
 */
#include "data/data.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u
#define CIFAR_PIXELS 3072 /* 3 x 32 x 32, CHW */
#define CIFAR_RECORD (1 + CIFAR_PIXELS)
#define CIFAR_CLASSES 10
#define MNIST_CLASSES 10

static const char *dataset_kind_name(gp_dataset_kind k)
{
    switch (k) {
    case GP_DATASET_SYNTHETIC: return "synthetic";
    case GP_DATASET_MNIST: return "mnist";
    case GP_DATASET_FASHION_MNIST: return "fashion-mnist";
    case GP_DATASET_CIFAR10: return "cifar10";
    case GP_DATASET_IMAGE_FOLDER: return "image_folder";
    case GP_DATASET_TOKENS: return "tokens";
    }
    return "unknown";
}

bool gp_dataset_has_masks(const gp_dataset *ds)
{
    return ds->masks || (ds->folder && gp_image_folder_segmentation(ds->folder));
}

void gp_dataset_free(gp_dataset *ds)
{
    if (!ds) return;
    gp_image_folder_free(ds->folder);
    free(ds->images);
    free(ds->labels);
    free(ds->masks);
    free(ds->tokens);
    memset(ds, 0, sizeof *ds);
}

/* ------------------------------------------------------------------------ */
/* IDX, raw or gzip: zlib's inflate, member by member.  (gzread reads both
 * too, but skips whatever follows the last member without a word: a padded
 * download or a raw file appended to a .gz would train as if absent.) */

static uint32_t be32(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

typedef struct {
    int fd;
    bool gz;          /* the file begins with gzip's magic bytes */
    bool done;        /* no more data: raw, the end of the file; gzip, the last
                         member's end */
    int64_t in_at;    /* the file's offset of in[0] */
    int64_t trailing; /* gzip: bytes after the last member that are not another */
    bool in_member;   /* gzip: inside a member, its end (the trailer) not yet read */
    int read_errno;   /* the failed read's (zerr k_unread) */
    z_stream z;       /* next_in, avail_in: the unread bytes of in[] (raw too) */
    unsigned char in[1 << 16];
} idx_file;

/* The unread bytes moved to in[0], then as many more as fit: the count
 * read, 0 at the end of the file, -1 on a read error (errno). */
static ssize_t idx_fill(idx_file *f)
{
    size_t keep = f->z.avail_in, drop = (size_t)(f->z.next_in - f->in);
    if (keep) memmove(f->in, f->z.next_in, keep);
    f->in_at += (int64_t)drop;
    f->z.next_in = f->in;
    ssize_t r;
    do r = read(f->fd, f->in + keep, sizeof f->in - keep);
    while (r < 0 && errno == EINTR);
    if (r > 0) f->z.avail_in = (uInt)(keep + (size_t)r);
    return r;
}

static void idx_close(idx_file *f)
{
    if (!f) return;
    if (f->gz) inflateEnd(&f->z);
    close(f->fd);
    free(f);
}

static idx_file *idx_open(const char *path, gp_status *s)
{
    /* a regular file only: opening a FIFO would block, deaf to signals */
    int fd = gp_open_regular(path);
    if (fd < 0) {
        *s = gp_error_set(GP_ERR_IO, "cannot open '%s': %s", path, gp_open_strerror(errno));
        return NULL;
    }
    idx_file *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        *s = gp_error_set(GP_ERR_OOM, "cannot open '%s': out of host memory", path);
        return NULL;
    }
    f->fd = fd;
    f->z.next_in = f->in;
    while (f->z.avail_in < 2) {
        ssize_t r = idx_fill(f);
        if (r <= 0) {
            if (r < 0) {
                *s = gp_error_set(GP_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
                idx_close(f);
                return NULL;
            }
            break;
        }
    }
    f->gz = f->z.avail_in >= 2 && f->in[0] == 0x1f && f->in[1] == 0x8b;
    f->in_member = f->gz;
    if (f->gz && inflateInit2(&f->z, 16 + MAX_WBITS) != Z_OK) {
        f->gz = false;
        idx_close(f);
        *s = gp_error_set(GP_ERR_OOM, "cannot read '%s': out of host memory for zlib", path);
        return NULL;
    }
    return f;
}

/* zerr for bytes after the last gzip member that are not another one, and
 * for a read that failed (f->read_errno) */
static const char k_trailing[] = "trailing bytes", k_unread[] = "read error";

/* zlib's "incorrect data check" / "incorrect length check" come from the
 * gzip trailer: every byte decompressed, but not to what was written. */
static gp_status gz_corrupt(const idx_file *f, const char *path, int64_t at, const char *zerr)
{
    if (zerr == k_unread) /* the disk's or the network's, not the file's */
        return gp_error_set(GP_ERR_IO, "cannot read '%s': %s", path, strerror(f->read_errno));
    if (zerr == k_trailing) {
        int64_t end = f->in_at + (f->z.next_in - f->in);
        return gp_error_set(GP_ERR_DATA,
                            "%s: %lld byte%s after its gzip data (which ends at byte %lld of "
                            "%lld) %s not gzip data: the file is damaged (padded) or another "
                            "file was appended to it; fetch or decompress it again", path,
                            (long long)f->trailing, f->trailing == 1 ? "" : "s",
                            (long long)end, (long long)(end + f->trailing),
                            f->trailing == 1 ? "is" : "are");
    }
    /* a checksum found wrong says nothing of where the damage is */
    if (zerr && strstr(zerr, "check"))
        return gp_error_set(GP_ERR_DATA,
                            "%s: corrupt gzip data (zlib: %s): the data does not match the "
                            "file's checksum, so some byte of it is wrong; the file is damaged: "
                            "fetch or decompress it again", path, zerr);
    return gp_error_set(GP_ERR_DATA,
                        "%s: corrupt gzip data (zlib: %s) at or after byte %lld of the "
                        "uncompressed data; the file is damaged: fetch or decompress it again",
                        path, zerr, (long long)at);
}

/* After a gzip member's end: another member (its magic bytes), the end of
 * the file, or bytes that are not gzip (*zerr = k_trailing, f->trailing
 * their count).  Whether to go on inflating. */
static bool next_member(idx_file *f, const char **zerr)
{
    f->in_member = false;
    if (f->z.avail_in < 2 && idx_fill(f) < 0) {
        f->read_errno = errno;
        *zerr = k_unread;
        return false;
    }
    const unsigned char *p = f->z.next_in;
    if (f->z.avail_in >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
        inflateReset(&f->z);
        f->in_member = true; /* (one cut short before its end: idx_read_payload) */
        return true;
    }
    f->done = true;
    if (f->z.avail_in == 0) return false;
    struct stat st;
    int64_t end = f->in_at + (f->z.next_in - f->in);
    f->trailing = fstat(f->fd, &st) == 0 && st.st_size > end ? st.st_size - end
                                                              : (int64_t)f->z.avail_in;
    *zerr = k_trailing;
    return false;
}

/* Read up to `len` bytes into buf.  Returns the bytes read; sets *zerr to a
 * zlib message (or k_trailing, or a read error's) if the file is corrupt,
 * not merely short. */
static int64_t idx_read(idx_file *f, void *buf, int64_t len, const char **zerr)
{
    unsigned char *out = buf;
    int64_t got = 0;
    *zerr = NULL;
    while (got < len && !f->done) {
        if (f->z.avail_in == 0) {
            ssize_t r = idx_fill(f);
            if (r < 0) {
                f->read_errno = errno;
                *zerr = k_unread;
            }
            if (r <= 0) break; /* (gzip: cut inside a member, which is short) */
        }
        int64_t want = len - got < ((int64_t)1 << 30) ? len - got : ((int64_t)1 << 30);
        if (!f->gz) {
            size_t n = f->z.avail_in < (uint64_t)want ? f->z.avail_in : (size_t)want;
            memcpy(out + got, f->z.next_in, n);
            f->z.next_in += n;
            f->z.avail_in -= (uInt)n;
            got += (int64_t)n;
            continue;
        }
        f->z.next_out = out + got;
        f->z.avail_out = (uInt)want;
        int r = inflate(&f->z, Z_NO_FLUSH);
        got += want - (int64_t)f->z.avail_out;
        if (r == Z_STREAM_END) {
            if (!next_member(f, zerr)) break;
        } else if (r != Z_OK && r != Z_BUF_ERROR) { /* (BUF: more input wanted) */
            *zerr = f->z.msg ? f->z.msg : zError(r);
            break;
        }
    }
    return got;
}

/* Read exactly `len` payload bytes after a header of `hdr` bytes into a
 * buffer that grows as data arrives.  `what` is "pixels" or "labels". */
static gp_status idx_read_payload(idx_file *f, const char *path, int64_t hdr, int64_t len,
                                  const char *what, const char *shape, uint8_t **out)
{
    int64_t cap = len < ((int64_t)1 << 24) ? len : ((int64_t)1 << 24);
    uint8_t *buf = malloc((size_t)(cap > 0 ? cap : 1));
    if (!buf)
        return gp_error_set(GP_ERR_DATA, "%s: cannot allocate %lld bytes for %s", path,
                            (long long)cap, what);
    int64_t got = 0;
    const char *zerr = NULL;
    for (;;) {
        int64_t r = idx_read(f, buf + got, cap - got, &zerr);
        got += r;
        if (got < cap || zerr || got == len) break;
        int64_t ncap = cap * 2 < len ? cap * 2 : len;
        uint8_t *nb = realloc(buf, (size_t)ncap);
        if (!nb) {
            free(buf);
            return gp_error_set(GP_ERR_DATA, "%s: cannot allocate %lld bytes for %s", path,
                                (long long)ncap, what);
        }
        buf = nb;
        cap = ncap;
    }
    if (zerr) {
        free(buf);
        return gz_corrupt(f, path, hdr + got, zerr);
    }
    if (got < len) {
        free(buf);
        return gp_error_set(GP_ERR_DATA,
                            "%s: truncated: expected %lld bytes (%lld-byte header + %s %s), "
                            "its data ends after %lld (uncompressed, for a .gz)",
                            path, (long long)(hdr + len), (long long)hdr, shape, what,
                            (long long)(hdr + got));
    }
    /* More data than the header announces: the counts are wrong (a file
     * rewritten in place, two concatenated), and reading only the first
     * part would train on part of it without a word. */
    unsigned char extra;
    int64_t more = idx_read(f, &extra, 1, &zerr);
    if (zerr || more > 0) {
        free(buf);
        if (zerr) return gz_corrupt(f, path, hdr + len, zerr);
        return gp_error_set(GP_ERR_DATA,
                            "%s: the file goes on after the %lld bytes its header announces "
                            "(%lld-byte header + %s %s): the header's counts do not match "
                            "the data; is the file damaged or two files joined?",
                            path, (long long)(hdr + len), (long long)hdr, shape, what);
    }
    /* Every byte there, but the file ends inside a gzip member: its 8-byte
     * trailer (the checksum that says the bytes are right) cut off, or the
     * magic bytes of a member cut short after the last */
    if (f->in_member) {
        free(buf);
        return gp_error_set(GP_ERR_DATA,
                            "%s: the file ends inside its gzip data (a member's end and its "
                            "checksum missing), so whether its bytes are right is unknown: the "
                            "file is cut short; fetch or decompress it again", path);
    }
    *out = buf;
    return GP_OK;
}

static gp_status idx_header(idx_file *f, const char *path, uint32_t magic, int words,
                            uint32_t *v)
{
    unsigned char b[16];
    const char *zerr = NULL;
    int64_t need = 4 * (int64_t)words;
    int64_t got = idx_read(f, b, need, &zerr);
    if (zerr) return gz_corrupt(f, path, got, zerr);
    if (got >= 4 && be32(b) != magic)
        return gp_error_set(GP_ERR_DATA,
                            "%s: bad magic number 0x%08x, expected 0x%08x (IDX %s); is this "
                            "the right file?",
                            path, be32(b), magic, magic == IDX_MAGIC_IMAGES ? "images" : "labels");
    if (got < need)
        return gp_error_set(GP_ERR_DATA, "%s: truncated header: %lld of %lld bytes", path,
                            (long long)got, (long long)need);
    for (int i = 0; i < words; i++) v[i] = be32(b + 4 * i);
    return GP_OK;
}

gp_status gp_idx_read_images(const char *path, gp_dataset *ds)
{
    gp_status s = GP_OK;
    idx_file *f = idx_open(path, &s);
    if (!f) return s;
    uint32_t v[4] = {0};
    s = idx_header(f, path, IDX_MAGIC_IMAGES, 4, v);
    int64_t n = v[1], h = v[2], w = v[3];
    /* n < 2^32 and h * w < 2^32: compare by division, n * h * w can overflow
     * (found by tests/fuzz/fuzz_idx.c; the input is in tests/fuzz/idx/) */
    if (s == GP_OK && (n < 1 || h < 1 || w < 1 || h > GP_DATA_MAX_SIDE || w > GP_DATA_MAX_SIDE ||
                       n > GP_DATA_MAX_BYTES / (h * w)))
        s = gp_error_set(GP_ERR_DATA,
                         "%s: implausible dimensions %lld images of %lld x %lld (at least 1 "
                         "each, sides at most %d, at most %lld bytes in all)",
                         path, (long long)n, (long long)h, (long long)w, GP_DATA_MAX_SIDE,
                         (long long)GP_DATA_MAX_BYTES);
    uint8_t *px = NULL;
    char shape[96];
    snprintf(shape, sizeof shape, "%lld x %lld x %lld", (long long)n, (long long)h, (long long)w);
    if (s == GP_OK) s = idx_read_payload(f, path, 16, n * h * w, "pixels", shape, &px);
    idx_close(f);
    if (s != GP_OK) return s;
    free(ds->images);
    ds->images = px;
    ds->n = n;
    ds->c = 1;
    ds->h = h;
    ds->w = w;
    snprintf(ds->source, sizeof ds->source, "%s", path);
    return GP_OK;
}

gp_status gp_idx_read_labels(const char *path, gp_dataset *ds)
{
    gp_status s = GP_OK;
    idx_file *f = idx_open(path, &s);
    if (!f) return s;
    uint32_t v[2] = {0};
    s = idx_header(f, path, IDX_MAGIC_LABELS, 2, v);
    int64_t n = v[1];
    if (s == GP_OK && (n < 1 || n > GP_DATA_MAX_BYTES))
        s = gp_error_set(GP_ERR_DATA, "%s: implausible label count %lld", path, (long long)n);
    if (s == GP_OK && ds->images && n != ds->n)
        s = gp_error_set(GP_ERR_DATA, "%s: %lld labels but %s holds %lld images; the two files "
                                      "must come from the same split",
                         path, (long long)n, ds->source, (long long)ds->n);
    uint8_t *lb = NULL;
    char shape[48];
    snprintf(shape, sizeof shape, "%lld", (long long)n);
    if (s == GP_OK) s = idx_read_payload(f, path, 8, n, "labels", shape, &lb);
    idx_close(f);
    if (s != GP_OK) return s;
    int32_t *wide = malloc(sizeof *wide * (size_t)n); /* a dataset's labels are 32-bit */
    if (wide)
        for (int64_t i = 0; i < n; i++) wide[i] = lb[i];
    free(lb);
    if (!wide)
        return gp_error_set(GP_ERR_OOM, "%s: cannot allocate %lld labels", path, (long long)n);
    int classes = ds->classes;
    if (classes <= 0) {
        for (int64_t i = 0; i < n; i++)
            if (wide[i] >= classes) classes = wide[i] + 1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (wide[i] >= classes) {
            s = gp_error_set(GP_ERR_DATA, "%s: label %d of sample %lld is out of range for %d "
                                          "classes",
                             path, wide[i], (long long)i, classes);
            free(wide);
            return s;
        }
    }
    free(ds->labels);
    ds->labels = wide;
    ds->n = n;
    ds->classes = classes;
    return GP_OK;
}

/* ------------------------------------------------------------------------ */
/* CIFAR-10 binary batches                                                   */

gp_status gp_cifar10_read(const char *const *paths, int n_paths, gp_dataset *ds)
{
    int64_t total = 0;
    for (int k = 0; k < n_paths; k++) {
        struct stat st;
        if (stat(paths[k], &st) != 0)
            return gp_error_set(GP_ERR_IO, "cannot open '%s': %s", paths[k], strerror(errno));
        int64_t recs = (int64_t)st.st_size / CIFAR_RECORD;
        if ((int64_t)st.st_size % CIFAR_RECORD != 0)
            return gp_error_set(GP_ERR_DATA,
                                "%s: record %lld is truncated: %lld of %d bytes (a record is 1 "
                                "label byte + 3072 pixel bytes)",
                                paths[k], (long long)recs,
                                (long long)((int64_t)st.st_size % CIFAR_RECORD), CIFAR_RECORD);
        if (recs == 0)
            return gp_error_set(GP_ERR_DATA, "%s: empty file, expected records of %d bytes",
                                paths[k], CIFAR_RECORD);
        total += recs;
        if (total * CIFAR_PIXELS > GP_DATA_MAX_BYTES)
            return gp_error_set(GP_ERR_DATA, "%s: more than %lld bytes of pixels in all",
                                paths[k], (long long)GP_DATA_MAX_BYTES);
    }
    if (total == 0) return gp_error_set(GP_ERR_INVALID, "CIFAR-10: no files given");
    uint8_t *px = malloc((size_t)(total * CIFAR_PIXELS));
    int32_t *lb = malloc(sizeof *lb * (size_t)total);
    unsigned char *rec = malloc(CIFAR_RECORD);
    gp_status s = GP_OK;
    if (!px || !lb || !rec)
        s = gp_error_set(GP_ERR_DATA, "CIFAR-10: cannot allocate %lld samples",
                         (long long)total);
    int64_t i = 0;
    for (int k = 0; k < n_paths && s == GP_OK; k++) {
        FILE *f = gp_fopen_regular(paths[k]);
        if (!f) {
            s = gp_error_set(GP_ERR_IO, "cannot open '%s': %s", paths[k],
                             gp_open_strerror(errno));
            break;
        }
        /* Read to the end rather than trusting stat: the file may change. */
        for (int64_t r = 0; s == GP_OK; r++) {
            size_t got = fread(rec, 1, CIFAR_RECORD, f);
            if (got == 0 && feof(f)) break;
            if (got != CIFAR_RECORD || i >= total) {
                s = gp_error_set(GP_ERR_DATA, "%s: record %lld is truncated: %zu of %d bytes",
                                 paths[k], (long long)r, got, CIFAR_RECORD);
                break;
            }
            if (rec[0] >= CIFAR_CLASSES) {
                s = gp_error_set(GP_ERR_DATA, "%s: record %lld has label %d, out of range for "
                                              "%d classes",
                                 paths[k], (long long)r, rec[0], CIFAR_CLASSES);
                break;
            }
            lb[i] = rec[0];
            memcpy(px + i * CIFAR_PIXELS, rec + 1, CIFAR_PIXELS);
            i++;
        }
        if (s == GP_OK && ferror(f))
            s = gp_error_set(GP_ERR_IO, "reading '%s' failed", paths[k]);
        fclose(f);
    }
    if (s == GP_OK && i != total)
        s = gp_error_set(GP_ERR_DATA, "CIFAR-10: files changed while reading (%lld of %lld "
                                      "records)",
                         (long long)i, (long long)total);
    free(rec);
    if (s != GP_OK) {
        free(px);
        free(lb);
        return s;
    }
    free(ds->images);
    free(ds->labels);
    ds->images = px;
    ds->labels = lb;
    ds->n = total;
    ds->c = 3;
    ds->h = 32;
    ds->w = 32;
    ds->classes = CIFAR_CLASSES;
    snprintf(ds->source, sizeof ds->source, "%s%s", n_paths > 0 ? paths[0] : "",
             n_paths > 1 ? " and more" : "");
    return GP_OK;
}

/* ------------------------------------------------------------------------ */
/* synthetic                                                                 */

/* Each class k has a prototype: a random level per 4x4 block of each
 * channel, drawn from stream (seed, "prot", k).  A sample is
 * 0.65 * prototype + 0.35 * per-pixel noise, scaled to 0..255; block-wise
 * prototypes survive small crops and are far apart for any two classes, so
 * a linear model learns the set.  Sample `first + i` draws its label and
 * noise from streams keyed by its index, so a split is a pure function of
 * (seed, index range): the test split uses indices disjoint from the
 * training split's and the same prototypes. */
#define SYN_PROTO_TAG 0x70726f74u /* "prot" */
#define SYN_SAMPLE_TAG 0x73616d70u /* "samp" */
#define SYN_TEST_FIRST ((int64_t)1 << 40)
#define SYN_BLOCK 4
#define SYN_PROTO_WEIGHT 0.65f

static gp_status synthetic_fill(int64_t n, int classes, int64_t c, int64_t h, int64_t w,
                                uint64_t seed, int64_t first, gp_dataset *ds)
{
    if (n < 1 || classes < 1 || c < 1 || h < 1 || w < 1 || h > GP_DATA_MAX_SIDE ||
        w > GP_DATA_MAX_SIDE || c > GP_DATA_MAX_SIDE || n * c * h * w > GP_DATA_MAX_BYTES)
        return gp_error_set(GP_ERR_INVALID,
                            "synthetic dataset: %lld samples of %d classes, shape %lld x %lld x "
                            "%lld is out of range (n, classes, shape >= 1, at most %lld bytes)",
                            (long long)n, classes, (long long)c, (long long)h, (long long)w,
                            (long long)GP_DATA_MAX_BYTES);
    int64_t per = c * h * w;
    int64_t bw = (w + SYN_BLOCK - 1) / SYN_BLOCK, bh = (h + SYN_BLOCK - 1) / SYN_BLOCK;
    int64_t cells = c * bh * bw;
    /* A sample's prototype is drawn again from its class's stream (a 16th
     * of its noise draws) rather than kept for every class: 1000 classes
     * of 3x224x224 would be 38 MB of prototypes. */
    float *proto = malloc(sizeof(float) * (size_t)cells);
    uint8_t *px = malloc((size_t)(n * per));
    int32_t *lb = malloc(sizeof *lb * (size_t)n);
    float *noise = malloc(sizeof(float) * (size_t)per);
    if (!proto || !px || !lb || !noise) {
        free(proto);
        free(px);
        free(lb);
        free(noise);
        return gp_error_set(GP_ERR_INVALID, "synthetic dataset: cannot allocate %lld bytes",
                            (long long)(n * per));
    }
    for (int64_t i = 0; i < n; i++) {
        uint64_t stream = gp_rng_stream((uint64_t)(first + i), SYN_SAMPLE_TAG, 0);
        int k = (int)(gp_rng_uniform(seed, stream, 0) * (float)classes);
        if (k >= classes) k = classes - 1;
        lb[i] = k;
        gp_rng_uniform_fill(seed, gp_rng_stream((uint64_t)k, SYN_PROTO_TAG, 0), 0, proto, cells);
        gp_rng_uniform_fill(seed, stream, 1, noise, per);
        uint8_t *dst = px + i * per;
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t y = 0; y < h; y++)
                for (int64_t x = 0; x < w; x++) {
                    int64_t p = (ch * h + y) * w + x;
                    float level = proto[(ch * bh + y / SYN_BLOCK) * bw + x / SYN_BLOCK];
                    float v = SYN_PROTO_WEIGHT * level + (1.0f - SYN_PROTO_WEIGHT) * noise[p];
                    int q = (int)(v * 256.0f);
                    dst[p] = (uint8_t)(q > 255 ? 255 : q);
                }
    }
    free(proto);
    free(noise);
    free(ds->images);
    free(ds->labels);
    ds->images = px;
    ds->labels = lb;
    ds->n = n;
    ds->c = c;
    ds->h = h;
    ds->w = w;
    ds->classes = classes;
    snprintf(ds->source, sizeof ds->source, "synthetic (seed %llu, %d classes, samples %lld..%lld)",
             (unsigned long long)seed, classes, (long long)first, (long long)(first + n - 1));
    return GP_OK;
}

gp_status gp_synthetic_make(int64_t n, int classes, int64_t c, int64_t h, int64_t w,
                            uint64_t seed, gp_dataset *ds)
{
    return synthetic_fill(n, classes, c, h, w, seed, 0, ds);
}

#define SYN_TOKEN_TAG 0x746f6b6eu /* "tokn" */
#define SYN_TOKEN_FOLLOW 0.9f

gp_status gp_synthetic_tokens(int64_t n, int64_t t, int64_t vocab, uint64_t seed, int64_t first,
                              gp_dataset *ds)
{
    int64_t k = vocab < GP_SYNTHETIC_TOKEN_IDS ? vocab : GP_SYNTHETIC_TOKEN_IDS;
    if (n < 1 || t < 1 || k < 1 || n > GP_DATA_MAX_BYTES / 4 / (t + 1))
        return gp_error_set(GP_ERR_INVALID,
                            "synthetic tokens: %lld windows of %lld + 1 ids of a vocabulary of "
                            "%lld are out of range (at least 1 each, at most %lld bytes)",
                            (long long)n, (long long)t, (long long)vocab,
                            (long long)GP_DATA_MAX_BYTES);
    int64_t total = n * (t + 1);
    uint32_t *tok = malloc(sizeof *tok * (size_t)total), next[GP_SYNTHETIC_TOKEN_IDS];
    float *u = malloc(sizeof *u * (size_t)(2 * (t + 1)));
    if (!tok || !u) {
        free(tok);
        free(u);
        return gp_error_set(GP_ERR_OOM, "synthetic tokens: cannot allocate %lld bytes",
                            (long long)(total * 4));
    }
    /* the successor of each id: a permutation (Fisher-Yates) from the seed */
    for (int64_t i = 0; i < k; i++) next[i] = (uint32_t)i;
    uint64_t perm = gp_rng_stream(0, SYN_TOKEN_TAG, 1);
    for (int64_t i = k - 1; i > 0; i--) {
        int64_t j = (int64_t)(gp_rng_uniform(seed, perm, (uint64_t)i) * (float)(i + 1));
        if (j > i) j = i;
        uint32_t x = next[i];
        next[i] = next[j];
        next[j] = x;
    }
    for (int64_t w = 0; w < n; w++) {
        /* per position: a coin (follow or not) and a random id */
        gp_rng_uniform_fill(seed, gp_rng_stream((uint64_t)(first + w), SYN_TOKEN_TAG, 0), 0, u,
                            2 * (t + 1));
        uint32_t *o = tok + w * (t + 1);
        for (int64_t p = 0; p <= t; p++) {
            int64_t r = (int64_t)(u[2 * p + 1] * (float)k);
            uint32_t any = (uint32_t)(r < k ? r : k - 1);
            o[p] = p > 0 && u[2 * p] < SYN_TOKEN_FOLLOW ? next[o[p - 1]] : any;
        }
    }
    free(u);
    gp_dataset_free(ds);
    ds->tokens = tok;
    ds->n_tokens = total;
    ds->token_bytes = 4;
    ds->n = n;
    ds->c = t;
    ds->h = ds->w = 1;
    ds->classes = (int)k;
    snprintf(ds->source, sizeof ds->source,
             "synthetic tokens (seed %llu, ids 0..%lld, windows %lld..%lld of %lld + 1)",
             (unsigned long long)seed, (long long)(k - 1), (long long)first,
             (long long)(first + n - 1), (long long)t);
    return GP_OK;
}

/* The masks of the segmentation variant.  Over a 3 x 3 window the target
 * depends on more than one pixel, so a net must look at neighbours (as
 * the prototypes' 4 x 4 blocks do), yet it stays an exact function of the
 * input that a few convolutions represent. */
gp_status gp_data_make_masks(gp_dataset *ds)
{
    int64_t c = ds->c, h = ds->h, w = ds->w, hw = h * w;
    uint8_t *mk = malloc((size_t)(ds->n * hw > 0 ? ds->n * hw : 1));
    uint32_t *rows = malloc((size_t)(hw > 0 ? hw : 1) * sizeof *rows);
    if (!mk || !rows) {
        free(mk);
        free(rows);
        return gp_error_set(GP_ERR_OOM, "%s: cannot allocate %lld bytes of masks", ds->source,
                            (long long)(ds->n * hw));
    }
    for (int64_t i = 0; i < ds->n; i++) {
        const uint8_t *px = ds->images + i * c * hw;
        /* rows[y, x] = the channels' and the row window's sum at (y, x) */
        for (int64_t y = 0; y < h; y++)
            for (int64_t x = 0; x < w; x++) {
                uint32_t sum = 0;
                for (int64_t ch = 0; ch < c; ch++)
                    for (int64_t yy = y - 1; yy <= y + 1; yy++)
                        if (yy >= 0 && yy < h) sum += px[(ch * h + yy) * w + x];
                rows[y * w + x] = sum;
            }
        for (int64_t y = 0; y < h; y++) {
            int64_t ny = (y > 0) + 1 + (y < h - 1);
            for (int64_t x = 0; x < w; x++) {
                int64_t nx = (x > 0) + 1 + (x < w - 1);
                uint64_t sum = rows[y * w + x];
                if (x > 0) sum += rows[y * w + x - 1];
                if (x < w - 1) sum += rows[y * w + x + 1];
                mk[i * hw + y * w + x] = 2 * sum > (uint64_t)(255 * c * ny * nx);
            }
        }
    }
    free(rows);
    free(ds->masks);
    ds->masks = mk;
    return GP_OK;
}

/* ------------------------------------------------------------------------ */
/* normalisation defaults                                                    */

void gp_dataset_default_norm(gp_dataset_kind kind, int64_t channels, float *mean, float *std)
{
    static const float cifar_mean[3] = {0.4914f, 0.4822f, 0.4465f};
    static const float cifar_std[3] = {0.2470f, 0.2435f, 0.2616f};
    for (int64_t c = 0; c < channels && c < GP_MAX_CHANNELS; c++) {
        switch (kind) {
        case GP_DATASET_MNIST:
            mean[c] = 0.1307f;
            std[c] = 0.3081f;
            break;
        case GP_DATASET_FASHION_MNIST:
            mean[c] = 0.2860f;
            std[c] = 0.3530f;
            break;
        case GP_DATASET_CIFAR10:
            mean[c] = cifar_mean[c < 3 ? c : 2];
            std[c] = cifar_std[c < 3 ? c : 2];
            break;
        case GP_DATASET_IMAGE_FOLDER:
            /* ImageNet's, as torchvision's recipes use */
            mean[c] = (const float[]){0.485f, 0.456f, 0.406f}[c < 3 ? c : 2];
            std[c] = (const float[]){0.229f, 0.224f, 0.225f}[c < 3 ? c : 2];
            break;
        case GP_DATASET_SYNTHETIC:
        default:
            /* 0.65 U + 0.35 U' with independent uniforms: mean 1/2, std
             * sqrt((0.65^2 + 0.35^2) / 12) = 0.2131. */
            mean[c] = 0.5f;
            std[c] = 0.2131f;
            break;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* loading a split                                                           */

static const char *default_dir(gp_dataset_kind k)
{
    switch (k) {
    case GP_DATASET_MNIST: return "/usr/share/datasets/mnist";
    case GP_DATASET_FASHION_MNIST: return "/usr/share/datasets/fashion-mnist";
    case GP_DATASET_CIFAR10: return "data/cifar-10-batches-bin"; /* as config.c */
    default: return ".";
    }
}

static const char *missing_hint(gp_dataset_kind k)
{
    switch (k) {
    case GP_DATASET_FASHION_MNIST:
        return "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) "
               "or set data.path";
    case GP_DATASET_MNIST:
        return "put the four MNIST IDX files (train-images-idx3-ubyte[.gz], ...) from "
               "https://yann.lecun.com/exdb/mnist/ in that directory or set data.path";
    case GP_DATASET_CIFAR10:
        return "download and unpack https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz "
               "and set data.path to its cifar-10-batches-bin directory";
    default: return "set data.path";
    }
}

static bool file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* "<dir>/<name>.gz", else "<dir>/<name>"; GP_ERR_IO naming both if neither. */
static gp_status find_idx(const gp_data_config *cfg, const char *dir, const char *name,
                          char *out, size_t len)
{
    char gz[1024], raw[1024];
    snprintf(gz, sizeof gz, "%s/%s.gz", dir, name);
    snprintf(raw, sizeof raw, "%s/%s", dir, name);
    if (file_exists(gz)) {
        snprintf(out, len, "%s", gz);
        return GP_OK;
    }
    if (file_exists(raw)) {
        snprintf(out, len, "%s", raw);
        return GP_OK;
    }
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) /* data.path names a file */
        return gp_error_set(GP_ERR_IO, "%s: data.path '%s' is a file, not the directory of the "
                            "dataset's files; %s", dataset_kind_name(cfg->dataset), dir,
                            missing_hint(cfg->dataset));
    if (stat(gz, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(raw, sizeof raw, "%s", gz); /* name the directory in the way */
    if (stat(raw, &st) == 0 && S_ISDIR(st.st_mode))
        return gp_error_set(GP_ERR_IO, "%s: '%s' is a directory, not the dataset file %s; %s",
                            dataset_kind_name(cfg->dataset), raw, name,
                            missing_hint(cfg->dataset));
    return gp_error_set(GP_ERR_IO, "%s: cannot find %s: tried %s and %s; %s",
                        dataset_kind_name(cfg->dataset), name, gz, raw,
                        missing_hint(cfg->dataset));
}

/* A split's IDX file's name, without .gz: its images or its labels. */
static const char *idx_name(bool train, bool labels, char buf[64])
{
    snprintf(buf, 64, "%s-%s", train ? "train" : "t10k",
             labels ? "labels-idx1-ubyte" : "images-idx3-ubyte");
    return buf;
}

/* A split's images and labels file (find_idx each). */
static gp_status idx_files(const gp_data_config *cfg, const char *dir, bool train,
                           char ipath[1024], char lpath[1024])
{
    char iname[64], lname[64];
    GP_TRY(find_idx(cfg, dir, idx_name(train, false, iname), ipath, 1024));
    return find_idx(cfg, dir, idx_name(train, true, lname), lpath, 1024);
}

static gp_status load_idx(const gp_data_config *cfg, const char *dir, bool train,
                          gp_dataset *ds)
{
    char ipath[1024], lpath[1024];
    GP_TRY(idx_files(cfg, dir, train, ipath, lpath));
    ds->classes = MNIST_CLASSES;
    GP_TRY(gp_idx_read_images(ipath, ds));
    return gp_idx_read_labels(lpath, ds);
}

/* CIFAR-10's batch file k of a split: data_batch_<k+1>.bin in training
 * (k 0 .. 4), test_batch.bin in the test split. */
static const char *cifar_name(bool train, int k, char buf[32])
{
    if (train) snprintf(buf, 32, "data_batch_%d.bin", k + 1);
    else snprintf(buf, 32, "test_batch.bin");
    return buf;
}

/* The split's batch files: names[0..*n) under base; GP_ERR_IO naming what
 * is missing. */
static gp_status cifar_files(const gp_data_config *cfg, const char *dir, bool train,
                             char base[1024], char names[5][1100], int *n)
{
    /* The tarball unpacks into cifar-10-batches-bin/; accept the directory
     * itself or its parent. */
    char probe[1100], first[32];
    cifar_name(train, 0, first);
    snprintf(base, 1024, "%s", dir);
    snprintf(probe, sizeof probe, "%s/%s", base, first);
    if (!file_exists(probe)) {
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/cifar-10-batches-bin", dir);
        snprintf(probe, sizeof probe, "%s/%s", sub, first);
        if (!file_exists(probe))
            return gp_error_set(GP_ERR_IO, "cifar10: cannot find %s in %s or %s; %s", first,
                                dir, sub, missing_hint(cfg->dataset));
        snprintf(base, 1024, "%s", sub);
    }
    *n = train ? 5 : 1;
    for (int k = 0; k < *n; k++) {
        char nm[32];
        snprintf(names[k], 1100, "%s/%s", base, cifar_name(train, k, nm));
        if (!file_exists(names[k]))
            return gp_error_set(GP_ERR_IO, "cifar10: cannot find %s; %s", names[k],
                                missing_hint(cfg->dataset));
    }
    return GP_OK;
}

static gp_status load_cifar(const gp_data_config *cfg, const char *dir, bool train,
                            gp_dataset *ds)
{
    char base[1024], names[5][1100];
    const char *paths[5];
    int n;
    GP_TRY(cifar_files(cfg, dir, train, base, names, &n));
    for (int k = 0; k < n; k++) paths[k] = names[k];
    GP_TRY(gp_cifar10_read(paths, n, ds));
    snprintf(ds->source, sizeof ds->source, "%.400s/%s", base,
             train ? "data_batch_{1..5}.bin" : "test_batch.bin");
    return GP_OK;
}

gp_status gp_dataset_locate(const gp_data_config *cfg, char *where, size_t len)
{
    const char *dir = cfg->path[0] ? cfg->path : default_dir(cfg->dataset);
    const char *kind = dataset_kind_name(cfg->dataset);
    switch (cfg->dataset) {
    case GP_DATASET_SYNTHETIC:
        snprintf(where, len, "synthetic, made from the seed");
        return GP_OK;
    case GP_DATASET_MNIST:
    case GP_DATASET_FASHION_MNIST: {
        char path[4][1024];
        int gz = 0;
        GP_TRY(idx_files(cfg, dir, true, path[0], path[1]));
        GP_TRY(idx_files(cfg, dir, false, path[2], path[3]));
        for (int k = 0; k < 4; k++)
            gz += strlen(path[k]) > 3 && !strcmp(path[k] + strlen(path[k]) - 3, ".gz");
        snprintf(where, len, "%s, the 4 IDX files%s in %.900s", kind,
                 gz == 4 ? " (gzip)" : gz ? " (some gzip)" : "", dir);
        return GP_OK;
    }
    case GP_DATASET_CIFAR10: {
        char base[1024], names[5][1100];
        int n;
        GP_TRY(cifar_files(cfg, dir, true, base, names, &n));
        GP_TRY(cifar_files(cfg, dir, false, base, names, &n));
        snprintf(where, len, "cifar10, data_batch_{1..5}.bin and test_batch.bin in %.900s", base);
        return GP_OK;
    }
    case GP_DATASET_IMAGE_FOLDER: {
        if (!gp_image_supported()) {
            gp_image_codec *cd;
            return gp_image_codec_create(&cd); /* the "built without" message */
        }
        struct stat st;
        for (int k = 0; k < 2; k++) {
            char sub[1100];
            snprintf(sub, sizeof sub, "%s/%s", cfg->path, k ? "val" : "train");
            int e = stat(sub, &st) == 0 ? 0 : errno;
            if (e || !S_ISDIR(st.st_mode))
                return gp_error_set(GP_ERR_IO, "image_folder: %s: %s; it reads train/ and val/ "
                                    "under data.path", sub, e ? strerror(e) : "not a folder");
        }
        snprintf(where, len, "image_folder, %.900s/train and val (listed when a run starts)",
                 cfg->path);
        return GP_OK;
    }
    case GP_DATASET_TOKENS: {
        char train[1024], val[1024];
        GP_TRY(gp_tokens_files(cfg->path, train, val));
        snprintf(where, len, "tokens, %.500s and %.500s", train, val);
        return GP_OK;
    }
    }
    return gp_error_set(GP_ERR_INVALID, "unknown dataset kind %d", (int)cfg->dataset);
}

gp_status gp_dataset_peek(const gp_data_config *cfg, bool train_split, gp_dataset *out,
                          bool *known)
{
    memset(out, 0, sizeof *out);
    *known = false;
    const char *dir = cfg->path[0] ? cfg->path : default_dir(cfg->dataset);
    switch (cfg->dataset) {
    case GP_DATASET_MNIST:
    case GP_DATASET_FASHION_MNIST: { /* the images' header: n, rows, columns */
        char ipath[1024], lpath[1024];
        GP_TRY(idx_files(cfg, dir, train_split, ipath, lpath));
        gp_status s = GP_OK;
        idx_file *f = idx_open(ipath, &s);
        if (!f) return s;
        uint32_t v[4] = {0};
        s = idx_header(f, ipath, IDX_MAGIC_IMAGES, 4, v);
        idx_close(f);
        GP_TRY(s);
        out->n = v[1];
        out->c = 1;
        out->h = v[2];
        out->w = v[3];
        out->classes = MNIST_CLASSES; /* (at least: the labels may name more) */
        snprintf(out->source, sizeof out->source, "%s %s split (%.400s)",
                 gp_dataset_name(cfg->dataset), train_split ? "train" : "test", ipath);
        *known = true;
        return GP_OK;
    }
    case GP_DATASET_CIFAR10: {
        char base[1024], names[5][1100];
        int n = 0;
        GP_TRY(cifar_files(cfg, dir, train_split, base, names, &n));
        for (int k = 0; k < n; k++) { /* its records, from the files' sizes */
            struct stat st;
            if (stat(names[k], &st) == 0) out->n += (int64_t)st.st_size / CIFAR_RECORD;
        }
        out->c = 3;
        out->h = out->w = 32;
        out->classes = CIFAR_CLASSES;
        snprintf(out->source, sizeof out->source, "cifar10 %s split (%.400s)",
                 train_split ? "train" : "test", base);
        *known = true;
        return GP_OK;
    }
    default: return GP_OK; /* known once read: the run checks them */
    }
}

/* Whether out is one of the n files in `files`, however spelt (a file not
 * there is none of them). */
static bool one_of(const char *out, char (*files)[1100], int n)
{
    for (int k = 0; k < n; k++)
        if (file_exists(files[k]) && gp_same_file(out, files[k])) return true;
    return false;
}

/* Every file the dataset may read, each split on its own: where one split
 * (or one of its files) is missing, the other's files are still the
 * dataset's, and an output over them would be lost data (a CIFAR folder
 * without test_batch.bin once let --write replace data_batch_1.bin). */
bool gp_dataset_reads(const gp_data_config *cfg, const char *out)
{
    if (!out || !out[0]) return false;
    const char *dir = cfg->path[0] ? cfg->path : default_dir(cfg->dataset);
    char f[16][1100];
    int n = 0;
    switch (cfg->dataset) {
    case GP_DATASET_SYNTHETIC: return false;
    case GP_DATASET_MNIST:
    case GP_DATASET_FASHION_MNIST: /* the four files, gzip or not (either read) */
        for (int k = 0; k < 4; k++) {
            char name[64];
            idx_name(k < 2, k % 2, name);
            snprintf(f[n++], sizeof f[0], "%.1000s/%s.gz", dir, name);
            snprintf(f[n++], sizeof f[0], "%.1000s/%s", dir, name);
        }
        break;
    case GP_DATASET_CIFAR10: /* the folder itself or the tarball's folder in it */
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < 6; k++) {
                char name[32];
                snprintf(f[n++], sizeof f[0], "%.900s%s/%s", dir,
                         b ? "/cifar-10-batches-bin" : "", cifar_name(k < 5, k % 5, name));
            }
        break;
    case GP_DATASET_IMAGE_FOLDER: /* anything under train/ and val/ */
        for (int k = 0; k < 2; k++) {
            snprintf(f[k], sizeof f[k], "%.1000s/%s", dir, k ? "val" : "train");
            if (gp_path_below(out, f[k])) return true;
        }
        return false;
    case GP_DATASET_TOKENS:
        n = gp_tokens_candidates(dir, f, 16);
        break;
    }
    return one_of(out, f, n);
}

gp_status gp_dataset_load(const gp_data_config *cfg, bool train_split, uint64_t seed,
                          gp_dataset *out)
{
    gp_dataset ds = {0};
    gp_status s = GP_OK;
    int64_t limit = train_split ? cfg->train_limit : cfg->test_limit;
    if (limit < 0)
        return gp_error_set(GP_ERR_INVALID, "data.%s_limit = %lld must be >= 0 (0 = all)",
                            train_split ? "train" : "test", (long long)limit);
    const char *dir = cfg->path[0] ? cfg->path : default_dir(cfg->dataset);
    switch (cfg->dataset) {
    case GP_DATASET_SYNTHETIC: {
        int64_t n = train_split ? cfg->synthetic_train : cfg->synthetic_test;
        if (n <= 0) n = train_split ? 1024 : 256;
        bool limited = limit > 0 && limit < n;
        if (limited) n = limit;
        if (cfg->token_vocab > 0) { /* a language model's: token windows */
            s = gp_synthetic_tokens(n, cfg->image_shape[0], cfg->token_vocab, seed,
                                    train_split ? 0 : SYN_TEST_FIRST, &ds);
            break;
        }
        int classes = cfg->synthetic_classes > 0 ? cfg->synthetic_classes : 10;
        const int64_t *sh = cfg->synthetic_shape;
        bool given = sh[0] > 0 || sh[1] > 0 || sh[2] > 0;
        /* too big for a split: named by the keys that made it (the
         * shape is model.input's unless data.synthetic.shape is given) */
        if (given && sh[0] > 0 && sh[1] > 0 && sh[2] > 0 &&
            (sh[0] > GP_DATA_MAX_SIDE || sh[1] > GP_DATA_MAX_SIDE || sh[2] > GP_DATA_MAX_SIDE ||
             sh[0] * sh[1] * sh[2] > GP_DATA_MAX_BYTES / n)) {
            bool model = !memcmp(sh, cfg->image_shape, 3 * sizeof *sh);
            s = gp_error_set(GP_ERR_INVALID, "%s = %lld samples of %s [%lld, %lld, %lld]%s are "
                             "more than a split may hold (%lld bytes, sides up to %d); give a "
                             "smaller %s or fewer samples",
                             limited ? (train_split ? "data.train_limit" : "data.test_limit")
                             : train_split ? "data.synthetic.train" : "data.synthetic.test",
                             (long long)n, model ? "model.input" : "data.synthetic.shape",
                             (long long)sh[0], (long long)sh[1], (long long)sh[2],
                             model ? " (data.synthetic.shape follows it unless given)" : "",
                             (long long)GP_DATA_MAX_BYTES, GP_DATA_MAX_SIDE,
                             model ? "model.input (or a data.synthetic.shape)"
                                   : "data.synthetic.shape");
            break;
        }
        s = synthetic_fill(n, classes, given ? sh[0] : GP_SYNTHETIC_C,
                           given ? sh[1] : GP_SYNTHETIC_H, given ? sh[2] : GP_SYNTHETIC_W, seed,
                           train_split ? 0 : SYN_TEST_FIRST, &ds);
        if (s == GP_OK && cfg->synthetic_masks) s = gp_data_make_masks(&ds);
        break;
    }
    case GP_DATASET_MNIST:
    case GP_DATASET_FASHION_MNIST:
        s = load_idx(cfg, dir, train_split, &ds);
        break;
    case GP_DATASET_CIFAR10:
        s = load_cifar(cfg, dir, train_split, &ds);
        break;
    case GP_DATASET_IMAGE_FOLDER: {
        const int64_t *sh = cfg->image_shape;
        if (sh[0] != 3) {
            s = gp_error_set(GP_ERR_INVALID, "image_folder decodes 3-channel (RGB) images but "
                             "model.input has %lld channels; set model.input to [3, height, "
                             "width]", (long long)sh[0]);
            break;
        }
        bool cached = false;
        s = gp_image_folder_open(cfg, train_split, (int)sh[1], (int)sh[2], &ds.folder, &cached);
        if (s != GP_OK) break;
        gp_image_folder_keep(ds.folder, limit); /* (spread over the classes) */
        ds.n = gp_image_folder_size(ds.folder);
        ds.c = 3;
        ds.h = sh[1];
        ds.w = sh[2];
        ds.classes = gp_image_folder_classes(ds.folder);
        snprintf(ds.source, sizeof ds.source, "%.480s", gp_image_folder_dir(ds.folder));
        GP_DEBUG("%s: %lld images, %d classes (index %s)", ds.source, (long long)ds.n,
                 ds.classes, cached ? "from its cache" : "listed and cached");
        *out = ds;
        return GP_OK;
    }
    case GP_DATASET_TOKENS: {
        /* model.input is [T] (config_data.c checks it); windows of T + 1 */
        char paths[2][1024];
        s = gp_tokens_files(cfg->path, paths[0], paths[1]);
        if (s == GP_OK) s = gp_tokens_read(paths[train_split ? 0 : 1], cfg->image_shape[0], &ds);
        if (s == GP_OK && limit > 0 && limit < ds.n) ds.n = limit; /* the first windows */
        if (s != GP_OK) break;
        char src[sizeof ds.source];
        memcpy(src, ds.source, sizeof src);
        snprintf(ds.source, sizeof ds.source, "tokens %s split (%.400s)",
                 train_split ? "train" : "validation", src);
        *out = ds;
        return GP_OK;
    }
    default:
        s = gp_error_set(GP_ERR_INVALID, "unknown dataset kind %d", (int)cfg->dataset);
    }
    if (s != GP_OK) {
        gp_dataset_free(&ds);
        return s;
    }
    if (limit > 0 && limit < ds.n) {
        int64_t per = ds.c * ds.h * ds.w;
        uint8_t *px = realloc(ds.images, (size_t)(limit * per));
        int32_t *lb = realloc(ds.labels, sizeof *lb * (size_t)limit);
        uint8_t *mk = ds.masks ? realloc(ds.masks, (size_t)(limit * ds.h * ds.w)) : NULL;
        if (px) ds.images = px; /* shrinking cannot really fail; keep the old block if it does */
        if (lb) ds.labels = lb;
        if (mk) ds.masks = mk;
        ds.n = limit;
    }
    if (cfg->dataset != GP_DATASET_SYNTHETIC) {
        char src[sizeof ds.source];
        memcpy(src, ds.source, sizeof src);
        snprintf(ds.source, sizeof ds.source, "%s %s split (%.400s)",
                 dataset_kind_name(cfg->dataset), train_split ? "train" : "test", src);
    }
    *out = ds;
    return GP_OK;
}
