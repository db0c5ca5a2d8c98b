/*
 * test_data.c — datasets and the prefetching loader.
 *
 * Readers: small IDX files (gzip and raw) and CIFAR-10 batches written into
 * a temporary directory are read back byte for byte; each kind of damage
 * (bad magic, truncation, count mismatch, label range, absurd header,
 * corrupt gzip, missing file) gives its own message.  Synthetic: a pure
 * function of the seed, and learnable (nearest class mean beats 90%).
 * Loader: pixels encode sample ids, so each batch is checked against an
 * independent expectation: a permutation per epoch, file order without
 * shuffle, short and dropped last batches, resume, exact normalisation,
 * crops and flips against a naive re-implementation, errors raised in the
 * producer thread, and destroy at any point.  If the real Fashion-MNIST is
 * installed its splits are checked (10000 / 60000 samples, balanced).
 * Default normalisation: each real dataset's default mean and std equal
 * the moments of its installed training pixels, computed here.
 */
#include "data/data.h"
#include "backend/backend.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "test_util.h"

static char tmpdir[256];

/* ------------------------------------------------------------------------ */
/* writing test files                                                        */

static void put_be32(uint8_t *b, uint32_t v)
{
    b[0] = (uint8_t)(v >> 24);
    b[1] = (uint8_t)(v >> 16);
    b[2] = (uint8_t)(v >> 8);
    b[3] = (uint8_t)v;
}

/* Write len bytes, gzip-compressed if gz. */
static void write_bytes(const char *path, const uint8_t *b, size_t len, bool gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (!f) {
            fprintf(stderr, "cannot write %s\n", path);
            exit(1);
        }
        if (len) gzwrite(f, b, (unsigned)len);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        if (!f) {
            fprintf(stderr, "cannot write %s\n", path);
            exit(1);
        }
        fwrite(b, 1, len, f);
        fclose(f);
    }
}

static uint8_t pixel_of(int64_t i, int64_t p) { return (uint8_t)((i * 7 + p * 3 + 1) % 256); }

/* An IDX images file of n samples h x w with pixel_of; `keep` < 0 = all. */
static void write_idx_images(const char *path, bool gz, uint32_t magic, int64_t n, int64_t h,
                             int64_t w, long keep)
{
    size_t len = 16 + (size_t)(n * h * w);
    uint8_t *b = calloc(len, 1);
    put_be32(b, magic);
    put_be32(b + 4, (uint32_t)n);
    put_be32(b + 8, (uint32_t)h);
    put_be32(b + 12, (uint32_t)w);
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < h * w; p++) b[16 + i * h * w + p] = pixel_of(i, p);
    write_bytes(path, b, keep >= 0 ? (size_t)keep : len, gz);
    free(b);
}

/* Labels i % mod, except label `bad` at index bad_at (if bad_at >= 0). */
static void write_idx_labels(const char *path, bool gz, uint32_t magic, int64_t n, int mod,
                             long keep, int64_t bad_at, int bad)
{
    size_t len = 8 + (size_t)n;
    uint8_t *b = calloc(len, 1);
    put_be32(b, magic);
    put_be32(b + 4, (uint32_t)n);
    for (int64_t i = 0; i < n; i++) b[8 + i] = (uint8_t)(i % mod);
    if (bad_at >= 0) b[8 + bad_at] = (uint8_t)bad;
    write_bytes(path, b, keep >= 0 ? (size_t)keep : len, gz);
    free(b);
}

static char *tpath(const char *name)
{
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static void mkdir_p(const char *p) { mkdir(p, 0700); }

/* ------------------------------------------------------------------------ */
/* IDX                                                                       */

static bool idx_matches_images(const gp_dataset *ds, int64_t n, int64_t h, int64_t w)
{
    if (ds->n != n || ds->c != 1 || ds->h != h || ds->w != w) return false;
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < h * w; p++)
            if (ds->images[i * h * w + p] != pixel_of(i, p)) return false;
    return true;
}

static bool idx_matches(const gp_dataset *ds, int64_t n, int64_t h, int64_t w, int mod)
{
    if (!idx_matches_images(ds, n, h, w)) return false;
    for (int64_t i = 0; i < n; i++)
        if (ds->labels[i] != i % mod) return false;
    return true;
}

static void test_idx_roundtrip(void)
{
    for (int gz = 0; gz < 2; gz++) {
        const char *ip = tpath(gz ? "rt-images.gz" : "rt-images");
        const char *lp = tpath(gz ? "rt-labels.gz" : "rt-labels");
        write_idx_images(ip, gz, 0x803, 37, 5, 3, -1);
        write_idx_labels(lp, gz, 0x801, 37, 4, -1, -1, 0);
        gp_dataset ds = {0};
        CHECK_OK(gp_idx_read_images(ip, &ds));
        CHECK_OK(gp_idx_read_labels(lp, &ds));
        CHECK_MSG(idx_matches(&ds, 37, 5, 3, 4), "gz=%d", gz);
        CHECK(ds.classes == 4); /* from the largest label when not preset */
        CHECK(strstr(ds.source, "rt-images") != NULL);
        gp_dataset_free(&ds);
        CHECK(ds.images == NULL && ds.n == 0);
    }
    /* labels 0, 1, 2, ...: each one past the count the labels before it
     * give (label 2 after 0 and 1), the count grows with every one */
    write_idx_labels(tpath("rt3-labels"), false, 0x801, 37, 3, -1, -1, 0);
    gp_dataset ds3 = {0};
    CHECK_OK(gp_idx_read_labels(tpath("rt3-labels"), &ds3));
    CHECK(ds3.classes == 3 && ds3.n == 37 && ds3.labels && ds3.labels[35] == 2);
    gp_dataset_free(&ds3);
    gp_dataset_free(NULL);
}

static void test_idx_errors(void)
{
    gp_dataset ds = {0};
    write_idx_images(tpath("bm-images"), true, 0x802, 4, 2, 2, -1);
    CHECK_ERR(gp_idx_read_images(tpath("bm-images"), &ds), GP_ERR_DATA,
              "bad magic number 0x00000802, expected 0x00000803");
    CHECK_ERR(gp_idx_read_images(tpath("bm-images"), &ds), GP_ERR_DATA, "bm-images");
    write_idx_labels(tpath("bm-labels"), false, 0x803, 4, 2, -1, -1, 0);
    CHECK_ERR(gp_idx_read_labels(tpath("bm-labels"), &ds), GP_ERR_DATA,
              "bad magic number 0x00000803, expected 0x00000801");

    /* 16 + 10*4*5 = 216 bytes expected; 150 present (raw and gzip). */
    write_idx_images(tpath("tr-images"), false, 0x803, 10, 4, 5, 150);
    CHECK_ERR(gp_idx_read_images(tpath("tr-images"), &ds), GP_ERR_DATA,
              "expected 216 bytes (16-byte header + 10 x 4 x 5 pixels), its data ends after 150");
    write_idx_images(tpath("tr-images.gz"), true, 0x803, 10, 4, 5, 150);
    CHECK_ERR(gp_idx_read_images(tpath("tr-images.gz"), &ds), GP_ERR_DATA,
              "its data ends after 150");
    write_idx_images(tpath("tr-head"), false, 0x803, 10, 4, 5, 10);
    CHECK_ERR(gp_idx_read_images(tpath("tr-head"), &ds), GP_ERR_DATA, "truncated header");
    write_idx_labels(tpath("tr-labels"), true, 0x801, 10, 3, 12, -1, 0);
    CHECK_ERR(gp_idx_read_labels(tpath("tr-labels"), &ds), GP_ERR_DATA,
              "expected 18 bytes (8-byte header + 10 labels), its data ends after 12");

    /* A gzip file cut short inside its compressed stream. */
    {
        write_idx_images(tpath("cut.gz"), true, 0x803, 200, 28, 28, -1);
        struct stat st;
        stat(tpath("cut.gz"), &st);
        CHECK(truncate(tpath("cut.gz"), st.st_size / 2) == 0);
        gp_status s = gp_idx_read_images(tpath("cut.gz"), &ds);
        CHECK_MSG(s == GP_ERR_DATA && strstr(gp_last_error(), "cut.gz"), "%s",
                  gp_last_error());
        CHECK(ds.images == NULL);
    }
    /* A gzip file whose trailer checksum is wrong: every byte decompresses,
     * and the message says the checksum, and no byte (it would be where
     * the last read began, not where the damage is). */
    {
        write_idx_images(tpath("crc.gz"), true, 0x803, 50, 28, 28, -1);
        struct stat st;
        CHECK(stat(tpath("crc.gz"), &st) == 0);
        FILE *f = fopen(tpath("crc.gz"), "r+b");
        CHECK(f != NULL);
        if (f) {
            fseek(f, (long)st.st_size - 8, SEEK_SET);
            int c = fgetc(f);
            fseek(f, (long)st.st_size - 8, SEEK_SET);
            fputc(c ^ 0x5a, f);
            fclose(f);
        }
        CHECK_ERR(gp_idx_read_images(tpath("crc.gz"), &ds), GP_ERR_DATA,
                  "the data does not match the file's checksum");
        /* (no byte named: the count it gave was that of the last read's start) */
        CHECK_MSG(!strstr(gp_last_error(), "after byte"), "%s", gp_last_error());
        CHECK_ERR(gp_idx_read_images(tpath("crc.gz"), &ds), GP_ERR_DATA, "fetch or decompress");
        CHECK(ds.images == NULL);
    }
    /* More data than the header announces (a header saying 9 images over a
     * file of 10): an error, not 9 images read without a word. */
    for (int gz = 0; gz < 2; gz++) {
        const char *name = gz ? "long-images.gz" : "long-images";
        write_idx_images(tpath(name), gz, 0x803, 10, 4, 5, -1);
        uint8_t b[16 + 200];
        size_t n = 0;
        {
            gzFile g = gzopen(tpath(name), "rb");
            CHECK(g != NULL);
            if (g) {
                n = (size_t)gzread(g, b, sizeof b);
                gzclose(g);
            }
        }
        CHECK(n == sizeof b);
        put_be32(b + 4, 9);
        write_bytes(tpath(name), b, sizeof b, gz);
        CHECK_ERR(gp_idx_read_images(tpath(name), &ds), GP_ERR_DATA,
                  "goes on after the 196 bytes its header announces (16-byte header + 9 x 4 x 5 "
                  "pixels)");
        CHECK(ds.images == NULL);
        write_idx_labels(tpath("long-labels"), gz, 0x801, 10, 3, -1, -1, 0);
        uint8_t l[18] = {0};
        for (int i = 0; i < 18; i++) l[i] = (uint8_t)(i < 8 ? 0 : (i - 8) % 3);
        put_be32(l, 0x801);
        put_be32(l + 4, 9);
        write_bytes(tpath("long-labels"), l, sizeof l, gz);
        CHECK_ERR(gp_idx_read_labels(tpath("long-labels"), &ds), GP_ERR_DATA,
                  "goes on after the 17 bytes");
    }
    /* A gzip header followed by garbage. */
    {
        uint8_t junk[64] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
        for (int i = 10; i < 64; i++) junk[i] = (uint8_t)(i * 37);
        write_bytes(tpath("junk.gz"), junk, sizeof junk, false);
        CHECK_ERR(gp_idx_read_images(tpath("junk.gz"), &ds), GP_ERR_DATA, "junk.gz");
    }
    /* Concatenated gzip members (`gzip -c a b`, `cat a.gz b.gz`) are one
     * file's data; bytes after the last member that are not another one
     * (a padded download, a raw file appended) are an error naming the file
     * and where the gzip data ends, not skipped as zlib's gzread skips them. */
    {
        write_idx_images(tpath("two.gz"), true, 0x803, 10, 4, 5, -1);
        uint8_t b[16 + 200];
        gzFile g = gzopen(tpath("two.gz"), "rb");
        CHECK(g != NULL && gzread(g, b, sizeof b) == (int)sizeof b);
        if (g) gzclose(g);
        for (int split = 1; split < (int)sizeof b; split += 53) {
            write_bytes(tpath("two.gz"), b, (size_t)split, true);
            g = gzopen(tpath("two.gz"), "ab");
            CHECK(g != NULL && gzwrite(g, b + split, (unsigned)(sizeof b - split)) > 0);
            if (g) gzclose(g);
            gp_dataset two = {0};
            CHECK_OK(gp_idx_read_images(tpath("two.gz"), &two));
            CHECK_MSG(two.images && idx_matches_images(&two, 10, 4, 5), "split at %d", split);
            gp_dataset_free(&two);
        }
        static const char *const tails[] = {"\0", "\0\0\0\0\0\0\0\0", "junk\n", "\x1f"};
        static const size_t tail_len[] = {1, 8, 5, 1};
        for (int k = 0; k < 4; k++) {
            write_bytes(tpath("pad.gz"), b, sizeof b, true);
            FILE *f = fopen(tpath("pad.gz"), "ab");
            CHECK(f && fwrite(tails[k], 1, tail_len[k], f) == tail_len[k]);
            if (f) fclose(f);
            struct stat ps;
            CHECK(stat(tpath("pad.gz"), &ps) == 0);
            char want[160];
            snprintf(want, sizeof want, "pad.gz: %zu byte%s after its gzip data (which ends "
                     "at byte %lld of %lld)", tail_len[k], tail_len[k] == 1 ? "" : "s",
                     (long long)(ps.st_size - tail_len[k]), (long long)ps.st_size);
            CHECK_ERR(gp_idx_read_images(tpath("pad.gz"), &ds), GP_ERR_DATA, want);
            CHECK(ds.images == NULL);
        }
        /* Every byte there but the file ends inside gzip data: its trailer
         * (the checksum) cut by 4 or 8 bytes, or a member's magic bytes
         * alone after the last: cut short, not read as whole (gzread and
         * the first inflate reader took each without a word) */
        uint8_t whole[1024];
        write_bytes(tpath("cut.gz"), b, sizeof b, true);
        FILE *cf = fopen(tpath("cut.gz"), "rb");
        size_t wn = cf ? fread(whole, 1, sizeof whole, cf) : 0;
        if (cf) fclose(cf);
        CHECK(wn > 8 && wn < sizeof whole);
        for (int cut = 4; cut <= 8 && wn > 8; cut += 4) {
            write_bytes(tpath("cut.gz"), whole, wn - (size_t)cut, false);
            CHECK_ERR(gp_idx_read_images(tpath("cut.gz"), &ds), GP_ERR_DATA,
                      "cut.gz: the file ends inside its gzip data");
            CHECK(ds.images == NULL);
        }
        memcpy(whole + wn, "\x1f\x8b", 2);
        write_bytes(tpath("cut.gz"), whole, wn + 2, false);
        CHECK_ERR(gp_idx_read_images(tpath("cut.gz"), &ds), GP_ERR_DATA,
                  "cut.gz: the file ends inside its gzip data");
        write_bytes(tpath("cut.gz"), whole, wn, false); /* whole: read */
        CHECK_OK(gp_idx_read_images(tpath("cut.gz"), &ds));
        gp_dataset_free(&ds);
    }
    /* Absurd headers: never allocated. */
    {
        uint8_t h[16];
        put_be32(h, 0x803);
        put_be32(h + 4, 100000);
        put_be32(h + 8, 1000);
        put_be32(h + 12, 1000);
        write_bytes(tpath("huge"), h, 16, false);
        CHECK_ERR(gp_idx_read_images(tpath("huge"), &ds), GP_ERR_DATA,
                  "implausible dimensions 100000 images of 1000 x 1000");
        put_be32(h + 4, 0);
        put_be32(h + 8, 28);
        put_be32(h + 12, 28);
        write_bytes(tpath("huge"), h, 16, false);
        CHECK_ERR(gp_idx_read_images(tpath("huge"), &ds), GP_ERR_DATA, "implausible");
        /* Claims 2^31 - 1 bytes but holds 16: fails on the truncation, with
         * the buffer grown only as far as the data went. */
        put_be32(h + 4, 2147483647u);
        put_be32(h + 8, 1);
        put_be32(h + 12, 1);
        write_bytes(tpath("huge"), h, 16, false);
        CHECK_ERR(gp_idx_read_images(tpath("huge"), &ds), GP_ERR_DATA, "its data ends after 16");
    }

    /* Count mismatch and label range, against images read first. */
    write_idx_images(tpath("cm-images"), false, 0x803, 6, 2, 2, -1);
    write_idx_labels(tpath("cm-labels"), false, 0x801, 5, 2, -1, -1, 0);
    CHECK_OK(gp_idx_read_images(tpath("cm-images"), &ds));
    CHECK_ERR(gp_idx_read_labels(tpath("cm-labels"), &ds), GP_ERR_DATA,
              "5 labels but");
    CHECK_ERR(gp_idx_read_labels(tpath("cm-labels"), &ds), GP_ERR_DATA, "cm-images holds 6");
    write_idx_labels(tpath("lr-labels"), false, 0x801, 6, 2, -1, 4, 12);
    ds.classes = 10;
    CHECK_ERR(gp_idx_read_labels(tpath("lr-labels"), &ds), GP_ERR_DATA,
              "label 12 of sample 4 is out of range for 10 classes");
    CHECK(ds.labels == NULL); /* a failed read leaves the dataset unchanged */
    gp_dataset_free(&ds);

    CHECK_ERR(gp_idx_read_images(tpath("no-such-file"), &ds), GP_ERR_IO, "no-such-file");
}

static gp_data_config base_cfg(gp_dataset_kind kind, const char *path)
{
    gp_data_config c;
    memset(&c, 0, sizeof c);
    c.dataset = kind;
    snprintf(c.path, sizeof c.path, "%s", path);
    c.shuffle = true;
    c.normalize = true;
    c.prefetch = 2;
    return c;
}

static void test_dataset_load_idx(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fm", tmpdir);
    mkdir_p(dir);
    char p[600];
    /* train: gzip; test: raw; a raw train file too, which the .gz shadows. */
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
    write_idx_images(p, true, 0x803, 30, 28, 28, -1);
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", dir);
    write_idx_labels(p, true, 0x801, 30, 10, -1, -1, 0);
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", dir);
    write_idx_images(p, false, 0x803, 3, 28, 28, -1);
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dir);
    write_idx_images(p, false, 0x803, 12, 28, 28, -1);
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", dir);
    write_idx_labels(p, false, 0x801, 12, 10, -1, -1, 0);

    gp_data_config cfg = base_cfg(GP_DATASET_FASHION_MNIST, dir);
    gp_dataset tr = {0}, te = {0};
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &tr));
    CHECK(idx_matches(&tr, 30, 28, 28, 10));
    CHECK(tr.classes == 10);
    CHECK_MSG(strstr(tr.source, "train-images-idx3-ubyte.gz") &&
              strstr(tr.source, "fashion-mnist train"), "%s", tr.source);
    CHECK_OK(gp_dataset_load(&cfg, false, 0, &te));
    CHECK(idx_matches(&te, 12, 28, 28, 10));
    gp_dataset_free(&tr);
    gp_dataset_free(&te);

    cfg.train_limit = 7;
    cfg.test_limit = 100; /* larger than the split: all of it */
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &tr));
    CHECK(idx_matches(&tr, 7, 28, 28, 10));
    CHECK_OK(gp_dataset_load(&cfg, false, 0, &te));
    CHECK(te.n == 12);
    gp_dataset_free(&tr);
    gp_dataset_free(&te);

    /* A label >= 10 in a real-format file. */
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", dir);
    write_idx_labels(p, false, 0x801, 12, 10, -1, 11, 10);
    CHECK_ERR(gp_dataset_load(&cfg, false, 0, &te), GP_ERR_DATA,
              "label 10 of sample 11 is out of range for 10 classes");
    /* Image/label count mismatch between the split's files. */
    write_idx_labels(p, false, 0x801, 11, 10, -1, -1, 0);
    CHECK_ERR(gp_dataset_load(&cfg, false, 0, &te), GP_ERR_DATA, "11 labels but");
    CHECK(te.images == NULL);

    /* Missing: the paths tried and the hint. */
    gp_data_config miss = base_cfg(GP_DATASET_FASHION_MNIST, "/nonexistent/fmnist");
    CHECK_ERR(gp_dataset_load(&miss, true, 0, &tr), GP_ERR_IO,
              "/nonexistent/fmnist/train-images-idx3-ubyte.gz and "
              "/nonexistent/fmnist/train-images-idx3-ubyte");
    CHECK_ERR(gp_dataset_load(&miss, true, 0, &tr), GP_ERR_IO,
              "apt-get install dataset-fashion-mnist");
    CHECK_ERR(gp_dataset_load(&miss, true, 0, &tr), GP_ERR_IO, "data.path");
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dir);
    CHECK(remove(p) == 0);
    CHECK_ERR(gp_dataset_load(&cfg, false, 0, &te), GP_ERR_IO, "t10k-images-idx3-ubyte");
    miss.dataset = GP_DATASET_MNIST;
    CHECK_ERR(gp_dataset_load(&miss, false, 0, &tr), GP_ERR_IO, "t10k-images-idx3-ubyte");
    miss.train_limit = -1;
    CHECK_ERR(gp_dataset_load(&miss, true, 0, &tr), GP_ERR_INVALID, "train_limit");
}

/* ------------------------------------------------------------------------ */
/* CIFAR-10                                                                  */

static uint8_t cifar_pixel(int64_t i, int64_t p) { return (uint8_t)((i * 13 + p) % 251); }

/* records first..first+n; truncate the last record to `last_len` bytes if
 * >= 0; label `bad` on record bad_at if >= 0. */
static void write_cifar(const char *path, int64_t first, int64_t n, long last_len,
                        int64_t bad_at, int bad)
{
    size_t len = (size_t)n * 3073;
    uint8_t *b = calloc(len, 1);
    for (int64_t r = 0; r < n; r++) {
        b[r * 3073] = (uint8_t)((first + r) % 10);
        if (r == bad_at) b[r * 3073] = (uint8_t)bad;
        for (int64_t p = 0; p < 3072; p++) b[r * 3073 + 1 + p] = cifar_pixel(first + r, p);
    }
    if (last_len >= 0) len = (size_t)(n - 1) * 3073 + (size_t)last_len;
    write_bytes(path, b, len, false);
    free(b);
}

static bool cifar_matches(const gp_dataset *ds, int64_t n)
{
    if (ds->n != n || ds->c != 3 || ds->h != 32 || ds->w != 32 || ds->classes != 10)
        return false;
    for (int64_t i = 0; i < n; i++) {
        if (ds->labels[i] != i % 10) return false;
        for (int64_t p = 0; p < 3072; p++)
            if (ds->images[i * 3072 + p] != cifar_pixel(i, p)) return false;
    }
    return true;
}

static void test_cifar(void)
{
    gp_dataset ds = {0};
    write_cifar(tpath("c1.bin"), 0, 3, -1, -1, 0);
    write_cifar(tpath("c2.bin"), 3, 2, -1, -1, 0);
    const char *both[2] = {tpath("c1.bin"), tpath("c2.bin")};
    CHECK_OK(gp_cifar10_read(both, 2, &ds));
    CHECK(cifar_matches(&ds, 5));
    gp_dataset_free(&ds);

    write_cifar(tpath("ct.bin"), 0, 4, 1000, -1, 0);
    const char *tr[2] = {tpath("c1.bin"), tpath("ct.bin")};
    CHECK_ERR(gp_cifar10_read(tr, 2, &ds), GP_ERR_DATA, "ct.bin: record 3 is truncated");
    write_cifar(tpath("cb.bin"), 0, 4, -1, 2, 10);
    const char *bl[1] = {tpath("cb.bin")};
    CHECK_ERR(gp_cifar10_read(bl, 1, &ds), GP_ERR_DATA, "cb.bin: record 2 has label 10");
    const char *none[1] = {tpath("nothere.bin")};
    CHECK_ERR(gp_cifar10_read(none, 1, &ds), GP_ERR_IO, "nothere.bin");
    CHECK(ds.images == NULL);

    /* Through gp_dataset_load, from the tarball's subdirectory. */
    char dir[512], sub[600], p[700];
    snprintf(dir, sizeof dir, "%s/cifar", tmpdir);
    snprintf(sub, sizeof sub, "%s/cifar-10-batches-bin", dir);
    mkdir_p(dir);
    mkdir_p(sub);
    for (int k = 1; k <= 5; k++) {
        snprintf(p, sizeof p, "%s/data_batch_%d.bin", sub, k);
        write_cifar(p, 2 * (k - 1), 2, -1, -1, 0);
    }
    snprintf(p, sizeof p, "%s/test_batch.bin", sub);
    write_cifar(p, 0, 3, -1, -1, 0);
    gp_data_config cfg = base_cfg(GP_DATASET_CIFAR10, dir);
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    CHECK(cifar_matches(&ds, 10));
    gp_dataset_free(&ds);
    cfg.test_limit = 2;
    CHECK_OK(gp_dataset_load(&cfg, false, 0, &ds));
    CHECK(cifar_matches(&ds, 2));
    gp_dataset_free(&ds);
    snprintf(p, sizeof p, "%s/data_batch_4.bin", sub);
    write_cifar(p, 6, 2, 3000, -1, 0);
    CHECK_ERR(gp_dataset_load(&cfg, true, 0, &ds), GP_ERR_DATA,
              "data_batch_4.bin: record 1 is truncated");
    remove(p);
    CHECK_ERR(gp_dataset_load(&cfg, true, 0, &ds), GP_ERR_IO, "data_batch_4.bin");
    gp_data_config miss = base_cfg(GP_DATASET_CIFAR10, "/nonexistent/cifar");
    CHECK_ERR(gp_dataset_load(&miss, true, 0, &ds), GP_ERR_IO, "cifar-10-binary.tar.gz");
}

/* ------------------------------------------------------------------------ */
/* synthetic                                                                 */

static void test_synthetic(void)
{
    gp_dataset a = {0}, b = {0}, c = {0};
    CHECK_OK(gp_synthetic_make(300, 10, 1, 28, 28, 42, &a));
    CHECK_OK(gp_synthetic_make(300, 10, 1, 28, 28, 42, &b));
    CHECK_OK(gp_synthetic_make(300, 10, 1, 28, 28, 43, &c));
    CHECK(a.n == 300 && a.c == 1 && a.h == 28 && a.w == 28 && a.classes == 10);
    CHECK(memcmp(a.images, b.images, 300 * 784) == 0 &&
          memcmp(a.labels, b.labels, 300 * sizeof *a.labels) == 0);
    CHECK(memcmp(a.images, c.images, 300 * 784) != 0);
    CHECK(memcmp(a.labels, c.labels, 300 * sizeof *a.labels) != 0);
    int count[10] = {0};
    bool in_range = true;
    for (int i = 0; i < 300; i++) {
        if (a.labels[i] < 10) count[a.labels[i]]++;
        else in_range = false;
    }
    CHECK(in_range);
    for (int k = 0; k < 10; k++) CHECK_MSG(count[k] >= 10, "class %d has %d samples", k, count[k]);
    double sum = 0, sq = 0;
    for (int64_t p = 0; p < 300 * 784; p++) {
        double v = a.images[p] / 255.0;
        sum += v;
        sq += v * v;
    }
    double mean = sum / (300 * 784), sd = sqrt(sq / (300 * 784) - mean * mean);
    float dm[1], ds[1];
    gp_dataset_default_norm(GP_DATASET_SYNTHETIC, 1, dm, ds);
    CHECK_NEAR(mean, dm[0], 0.03, 0);
    CHECK_NEAR(sd, ds[0], 0.03, 0);
    gp_dataset_free(&a);
    gp_dataset_free(&b);
    gp_dataset_free(&c);
    CHECK_ERR(gp_synthetic_make(0, 10, 1, 28, 28, 1, &a), GP_ERR_INVALID, "synthetic");
    CHECK_ERR(gp_synthetic_make(10, 0, 1, 28, 28, 1, &a), GP_ERR_INVALID, "synthetic");

    /* ImageNet's 1000 classes (configs/resnet101.yaml): labels past 255
     * (they were bytes once, and such a config could not train), and a
     * class's samples share its prototype: two of one class are nearer
     * than two of different classes. */
    enum { N1K = 4000, PER = 3 * 16 * 16 };
    CHECK_OK(gp_synthetic_make(N1K, 1000, 3, 16, 16, 7, &a));
    int top = 0;
    bool ok = true;
    for (int i = 0; i < N1K; i++) {
        ok = ok && a.labels[i] >= 0 && a.labels[i] < 1000;
        if (a.labels[i] > top) top = a.labels[i];
    }
    CHECK(ok && top >= 900);
    int first_of[1000], ref = -1, same = -1, other = -1;
    for (int k = 0; k < 1000; k++) first_of[k] = -1;
    for (int i = 0; i < N1K && same < 0; i++) { /* two samples of one class past 255 */
        int k = a.labels[i];
        if (k > 255 && first_of[k] >= 0) ref = first_of[k], same = i;
        first_of[k] = i;
    }
    for (int i = 0; i < N1K && other < 0 && ref >= 0; i++)
        if (a.labels[i] != a.labels[ref]) other = i;
    CHECK(same > 0 && other >= 0);
    if (same > 0 && other >= 0) {
        double d_same = 0, d_other = 0;
        for (int p = 0; p < PER; p++) {
            d_same += fabs((double)a.images[ref * PER + p] - a.images[same * PER + p]);
            d_other += fabs((double)a.images[ref * PER + p] - a.images[other * PER + p]);
        }
        CHECK_MSG(d_same < 0.8 * d_other, "class %d: %.0f apart, class %d vs %d: %.0f",
                  a.labels[ref], d_same, a.labels[ref], a.labels[other], d_other);
    }
    gp_dataset_free(&a);

    /* Through the config: split sizes, shape, and a test split of new
     * samples from the same classes.  Learnable: the nearest class mean of
     * the training split classifies the test split. */
    gp_data_config cfg = base_cfg(GP_DATASET_SYNTHETIC, "");
    cfg.synthetic_train = 400;
    cfg.synthetic_test = 200;
    cfg.synthetic_classes = 5;
    cfg.synthetic_shape[0] = 3;
    cfg.synthetic_shape[1] = 8;
    cfg.synthetic_shape[2] = 12;
    gp_dataset tr = {0}, te = {0};
    CHECK_OK(gp_dataset_load(&cfg, true, 9, &tr));
    CHECK_OK(gp_dataset_load(&cfg, false, 9, &te));
    CHECK(tr.n == 400 && te.n == 200 && tr.classes == 5 && te.classes == 5);
    CHECK(tr.c == 3 && tr.h == 8 && tr.w == 12 && te.c == 3);
    int64_t per = 3 * 8 * 12;
    CHECK(memcmp(tr.images, te.images, (size_t)(200 * per)) != 0);
    double *cm = calloc((size_t)(5 * per), sizeof(double));
    int cc[5] = {0};
    for (int64_t i = 0; i < tr.n; i++) {
        cc[tr.labels[i]]++;
        for (int64_t p = 0; p < per; p++) cm[tr.labels[i] * per + p] += tr.images[i * per + p];
    }
    for (int k = 0; k < 5; k++)
        for (int64_t p = 0; p < per; p++) cm[k * per + p] /= cc[k] ? cc[k] : 1;
    int right = 0;
    for (int64_t i = 0; i < te.n; i++) {
        int best = 0;
        double bd = 1e300;
        for (int k = 0; k < 5; k++) {
            double d = 0;
            for (int64_t p = 0; p < per; p++) {
                double e = te.images[i * per + p] - cm[k * per + p];
                d += e * e;
            }
            if (d < bd) {
                bd = d;
                best = k;
            }
        }
        right += best == te.labels[i];
    }
    CHECK_MSG(right >= 180, "nearest class mean: %d of 200 right", right);
    free(cm);
    gp_dataset_free(&tr);
    gp_dataset_free(&te);

    gp_data_config def = base_cfg(GP_DATASET_SYNTHETIC, "");
    def.train_limit = 100;
    CHECK_OK(gp_dataset_load(&def, true, 1, &tr));
    CHECK(tr.n == 100 && tr.c == 1 && tr.h == 28 && tr.w == 28 && tr.classes == 10);
    gp_dataset_free(&tr);
    CHECK_OK(gp_dataset_load(&def, false, 1, &te));
    CHECK(te.n == 256);
    gp_dataset_free(&te);
}

/* Per-channel mean and (population) standard deviation of a split's
 * pixels scaled to [0, 1], summed in double. */
static void pixel_moments(const gp_dataset *ds, double *mean, double *sd)
{
    int64_t hw = ds->h * ds->w;
    for (int64_t k = 0; k < ds->c; k++) {
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < ds->n; i++) {
            const uint8_t *px = ds->images + (i * ds->c + k) * hw;
            for (int64_t p = 0; p < hw; p++) {
                double v = px[p] / 255.0;
                sum += v;
                sq += v * v;
            }
        }
        double cnt = (double)(ds->n * hw);
        mean[k] = sum / cnt;
        sd[k] = sqrt(fmax(sq / cnt - mean[k] * mean[k], 0.0));
    }
}

/* A real dataset's default normalisation is the per-channel mean and std
 * of its training split's pixels, published to 4 decimals.  Oracle: those
 * moments computed here from the raw training pixels, when the dataset is
 * installed; they agree within half a unit of the 4th decimal (plus float
 * representation).  Whatever is installed, the values are a mean and a std
 * of numbers in [0, 1] (0 < mean < 1, 0 < std <= 1/2), and nothing is
 * written past `channels`. */
static void test_default_norm(void)
{
    char cifar_dir[600];
    const char *src = getenv("GPIPE_SOURCE_DIR");
    snprintf(cifar_dir, sizeof cifar_dir, "%s/data/cifar-10-batches-bin", src ? src : GPIPE_SOURCE_DIR);
    const struct {
        gp_dataset_kind kind;
        const char *name, *dir;
        int64_t c;
    } real[] = {
        {GP_DATASET_FASHION_MNIST, "Fashion-MNIST", "/usr/share/datasets/fashion-mnist", 1},
        {GP_DATASET_MNIST, "MNIST", "/usr/share/datasets/mnist", 1},
        {GP_DATASET_CIFAR10, "CIFAR-10", cifar_dir, 3},
    };
    /* the oracle itself, on pixels whose moments are known: channel 0
     * alternates 0 and 255 (mean 1/2, std 1/2), channel 1 is 51 (0.2, 0) */
    uint8_t px[2 * 2 * 2 * 3];
    for (int i = 0; i < 2; i++)
        for (int p = 0; p < 6; p++) {
            px[(i * 2 + 0) * 6 + p] = (p + i) % 2 ? 255 : 0;
            px[(i * 2 + 1) * 6 + p] = 51;
        }
    gp_dataset tiny = {.n = 2, .c = 2, .h = 2, .w = 3, .images = px};
    double tm[2], ts[2];
    pixel_moments(&tiny, tm, ts);
    CHECK(fabs(tm[0] - 0.5) < 1e-12 && fabs(ts[0] - 0.5) < 1e-12);
    CHECK(fabs(tm[1] - 0.2) < 1e-12 && fabs(ts[1]) < 1e-6);
    for (int r = 0; r < 3; r++) {
        float m[GP_MAX_CHANNELS], s[GP_MAX_CHANNELS];
        for (int k = 0; k < GP_MAX_CHANNELS; k++) m[k] = s[k] = -1.0f;
        int64_t c = real[r].c;
        gp_dataset_default_norm(real[r].kind, c, m, s);
        bool sane = true, untouched = true;
        for (int64_t k = 0; k < c; k++) sane = sane && m[k] > 0 && m[k] < 1 && s[k] > 0 && s[k] <= 0.5f;
        for (int64_t k = c; k < GP_MAX_CHANNELS; k++) untouched = untouched && m[k] == -1.0f && s[k] == -1.0f;
        CHECK_MSG(sane, "%s: mean %g, std %g is no mean and std of [0, 1] pixels", real[r].name, m[0], s[0]);
        CHECK_MSG(untouched, "%s: wrote past %lld channels", real[r].name, (long long)c);
        struct stat st;
        if (stat(real[r].dir, &st) != 0) {
            printf("test_data: %s absent: its default normalisation NOT checked against its "
                   "pixels (not counted)\n", real[r].dir);
            continue;
        }
        gp_data_config cfg = base_cfg(real[r].kind, real[r].dir);
        gp_dataset ds = {0};
        CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
        if (ds.c != c) {
            CHECK_MSG(0, "%s: %lld channels loaded", real[r].name, (long long)ds.c);
            gp_dataset_free(&ds);
            continue;
        }
        double mean[GP_MAX_CHANNELS], sd[GP_MAX_CHANNELS];
        pixel_moments(&ds, mean, sd);
        for (int64_t k = 0; k < c; k++) {
            CHECK_NEAR(m[k], mean[k], 5.1e-5, 0);
            CHECK_NEAR(s[k], sd[k], 5.1e-5, 0);
        }
        printf("test_data: %s training pixels: mean %.5f, std %.5f (channel 0); default %.4f, %.4f\n",
               real[r].name, mean[0], sd[0], m[0], s[0]);
        gp_dataset_free(&ds);
    }
}

/* ------------------------------------------------------------------------ */
/* loader                                                                    */

/* n samples of 1 x h x w whose pixel 0 is the sample id (< 256), the rest a
 * pattern; labels id % classes. */
static void id_dataset(gp_dataset *ds, int64_t n, int64_t h, int64_t w, int classes)
{
    memset(ds, 0, sizeof *ds);
    ds->n = n;
    ds->c = 1;
    ds->h = h;
    ds->w = w;
    ds->classes = classes;
    ds->images = malloc((size_t)(n * h * w));
    ds->labels = malloc(sizeof *ds->labels * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        ds->images[i * h * w] = (uint8_t)i;
        for (int64_t p = 1; p < h * w; p++) ds->images[i * h * w + p] = pixel_of(i, p);
        ds->labels[i] = (int32_t)(i % classes);
    }
    snprintf(ds->source, sizeof ds->source, "ids");
}

static int64_t id_of(const gp_batch *b, int64_t i, int64_t per)
{
    return (int64_t)lrintf(b->x[i * per] * 255.0f);
}

static gp_loader_opts lopts(int64_t bs, bool shuffle, uint64_t seed)
{
    gp_loader_opts o;
    memset(&o, 0, sizeof o);
    o.batch_size = bs;
    o.shuffle = shuffle;
    o.prefetch = 2;
    o.seed = seed;
    return o;
}

/* The ids of `epochs` epochs, in delivery order, into ids[epochs * n]. */
static bool run_ids(const gp_dataset *ds, const gp_data_config *cfg, const gp_loader_opts *o,
                    int epochs, int64_t *ids)
{
    gp_loader *ld = NULL;
    if (gp_loader_create(ds, cfg, o, &ld) != GP_OK) return false;
    int64_t per = ds->c * ds->h * ds->w, k = 0, want_first = 0, want_index = 0, want_epoch = 0;
    bool ok = true;
    int64_t bpe = gp_loader_batches_per_epoch(ld);
    for (int64_t b = 0; b < (int64_t)epochs * bpe; b++) {
        gp_batch bt;
        if (gp_loader_next(ld, &bt) != GP_OK) {
            ok = false;
            break;
        }
        if (bt.epoch != want_epoch || bt.index != want_index || bt.first != want_first) ok = false;
        for (int64_t i = 0; i < bt.n; i++) {
            ids[k++] = id_of(&bt, i, per);
            if ((int64_t)bt.y[i] != ids[k - 1] % ds->classes || bt.y[i] != floorf(bt.y[i]))
                ok = false;
        }
        want_first += bt.n;
        if (++want_index == bpe) {
            want_index = 0;
            want_first = 0;
            want_epoch++;
        }
    }
    gp_loader_destroy(ld);
    return ok;
}

static void test_loader_order(void)
{
    gp_dataset ds;
    id_dataset(&ds, 23, 4, 4, 3);
    gp_data_config cfg = base_cfg(GP_DATASET_SYNTHETIC, "");
    cfg.normalize = false;
    int64_t a[4 * 23], b[4 * 23], c[4 * 23];

    /* Shuffle: a permutation per epoch, different each epoch, the same for
     * the same seed whatever the prefetch depth; matches the exported order. */
    gp_loader_opts o = lopts(5, true, 77);
    CHECK(run_ids(&ds, &cfg, &o, 4, a));
    o.prefetch = 1;
    CHECK(run_ids(&ds, &cfg, &o, 4, b));
    o.prefetch = 6;
    o.seed = 78;
    CHECK(run_ids(&ds, &cfg, &o, 4, c));
    for (int e = 0; e < 4; e++) {
        int seen[23] = {0};
        bool perm = true;
        for (int i = 0; i < 23; i++) {
            int64_t v = a[e * 23 + i];
            if (v < 0 || v >= 23 || seen[v]++) perm = false;
        }
        CHECK_MSG(perm, "epoch %d is not a permutation", e);
        int64_t ref[23];
        gp_data_epoch_order(23, true, 77, e, ref);
        CHECK(memcmp(ref, a + e * 23, sizeof ref) == 0);
        if (e > 0) CHECK_MSG(memcmp(a, a + e * 23, sizeof ref) != 0, "epoch %d = epoch 0", e);
    }
    bool identity = true;
    for (int i = 0; i < 23; i++) identity = identity && a[i] == i;
    CHECK(!identity);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);

    /* No shuffle: file order every epoch. */
    o = lopts(5, false, 77);
    CHECK(run_ids(&ds, &cfg, &o, 3, a));
    bool file_order = true;
    for (int i = 0; i < 3 * 23; i++) file_order = file_order && a[i] == i % 23;
    CHECK(file_order);

    /* Every position of a shuffled order over many seeds: roughly uniform
     * (a biased Fisher-Yates would show). */
    int hist[8][8] = {{0}};
    int64_t perm8[8];
    for (int e = 0; e < 4000; e++) {
        gp_data_epoch_order(8, true, 5, e, perm8);
        for (int i = 0; i < 8; i++) hist[i][perm8[i]]++;
    }
    bool uniform = true;
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) uniform = uniform && hist[i][j] > 400 && hist[i][j] < 600;
    CHECK_MSG(uniform, "positions of a shuffled order are not uniform");
    gp_dataset_free(&ds);
}

/* ---- batch buffers from the device's host allocator ------------------------ */

static int n_host_alloc, n_host_free;
static gp_status counting_host_alloc(gp_device *dev, size_t bytes, void **out)
{
    (void)dev;
    n_host_alloc++;
    *out = malloc(bytes ? bytes : 1);
    return *out ? GP_OK : gp_error_set(GP_ERR_OOM, "test: out of memory");
}
static void counting_host_free(gp_device *dev, void *ptr)
{
    (void)dev;
    n_host_free++;
    free(ptr);
}

/* opts.pin: the slots come from the device's host_alloc (pinned memory on
 * a GPU) and go back through its host_free; the batches are the same. */
static void test_loader_pinned(void)
{
    gp_dataset ds;
    id_dataset(&ds, 23, 4, 4, 3);
    gp_data_config cfg = base_cfg(GP_DATASET_SYNTHETIC, "");
    cfg.normalize = false;
    gp_device *dev = NULL;
    gp_device_opts dopt = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:0", &dopt, &dev));
    if (!dev) return;
    gp_device_iface mock = *dev->iface;
    mock.host_alloc = counting_host_alloc;
    mock.host_free = counting_host_free;
    const gp_device_iface *real = dev->iface;
    dev->iface = &mock;
    gp_loader_opts o = lopts(5, true, 1);
    int64_t plain[4 * 23];
    CHECK(run_ids(&ds, &cfg, &o, 4, plain));
    o.pin = dev;
    int64_t pinned[4 * 23];
    CHECK(run_ids(&ds, &cfg, &o, 4, pinned));
    CHECK(!memcmp(plain, pinned, sizeof plain));
    int slots = o.prefetch + 1;
    CHECK_MSG(n_host_alloc == 2 * slots && n_host_free == n_host_alloc,
              "host_alloc %d, host_free %d, want %d each", n_host_alloc, n_host_free, 2 * slots);
    dev->iface = real;
    /* a CPU device has no host_alloc: aligned malloc, the same batches */
    CHECK(!real->host_alloc);
    CHECK(run_ids(&ds, &cfg, &o, 4, pinned));
    CHECK(!memcmp(plain, pinned, sizeof plain));
    gp_device_close(dev);
    gp_dataset_free(&ds);
}

static void test_loader_batches(void)
{
    gp_dataset ds;
    id_dataset(&ds, 23, 4, 4, 3);
    gp_data_config cfg = base_cfg(GP_DATASET_SYNTHETIC, "");
    cfg.normalize = false;
    gp_loader *ld = NULL;

    /* 23 = 4 x 5 + 3: the short batch is delivered, then epoch 1 begins. */
    gp_loader_opts o = lopts(5, true, 1);
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    CHECK(gp_loader_batches_per_epoch(ld) == 5);
    int64_t sizes[7];
    gp_batch b;
    for (int k = 0; k < 7; k++) {
        CHECK_OK(gp_loader_next(ld, &b));
        sizes[k] = b.n;
    }
    CHECK(sizes[0] == 5 && sizes[3] == 5 && sizes[4] == 3 && sizes[5] == 5);
    CHECK(b.epoch == 1 && b.index == 1 && b.first == 5);
    gp_loader_destroy(ld);

    /* drop_last: four full batches per epoch, and no sample of the tail. */
    o.drop_last = true;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    CHECK(gp_loader_batches_per_epoch(ld) == 4);
    bool full = true;
    for (int k = 0; k < 12; k++) {
        CHECK_OK(gp_loader_next(ld, &b));
        full = full && b.n == 5 && b.index == k % 4 && b.epoch == k / 4;
    }
    CHECK(full);
    gp_loader_destroy(ld);

    /* Resume at epoch 2, batch 3: the same batches a fresh run gives there. */
    int64_t all[4 * 23];
    o = lopts(5, true, 3);
    CHECK(run_ids(&ds, &cfg, &o, 4, all));
    o.start_epoch = 2;
    o.start_batch = 3;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    CHECK_OK(gp_loader_next(ld, &b));
    CHECK(b.epoch == 2 && b.index == 3 && b.first == 15 && b.n == 5);
    CHECK(id_of(&b, 0, 16) == all[2 * 23 + 15] && id_of(&b, 4, 16) == all[2 * 23 + 19]);
    CHECK_OK(gp_loader_next(ld, &b));
    CHECK(b.epoch == 2 && b.index == 4 && b.n == 3 && id_of(&b, 2, 16) == all[2 * 23 + 22]);
    CHECK_OK(gp_loader_next(ld, &b));
    CHECK(b.epoch == 3 && b.index == 0 && id_of(&b, 0, 16) == all[3 * 23]);
    gp_loader_destroy(ld);

    /* Invalid options. */
    o = lopts(0, true, 1);
    CHECK_ERR(gp_loader_create(&ds, &cfg, &o, &ld), GP_ERR_INVALID, "batch size");
    o = lopts(24, true, 1);
    o.drop_last = true;
    CHECK_ERR(gp_loader_create(&ds, &cfg, &o, &ld), GP_ERR_INVALID, "drop_last");
    o = lopts(5, true, 1);
    o.start_batch = 5;
    CHECK_ERR(gp_loader_create(&ds, &cfg, &o, &ld), GP_ERR_INVALID, "resume position");
    CHECK(ld == NULL);

    /* 20 = 4 x 5: four full batches an epoch with drop_last or without it,
     * and no empty fifth one before epoch 1 */
    CHECK(gp_loader_batches(20, 5, false) == 4 && gp_loader_batches(20, 5, true) == 4);
    CHECK(gp_loader_batches(21, 5, false) == 5 && gp_loader_batches(21, 5, true) == 4);
    gp_dataset ds20;
    id_dataset(&ds20, 20, 4, 4, 3);
    for (int dl = 0; dl < 2; dl++) {
        o = lopts(5, false, 1);
        o.drop_last = dl;
        CHECK_OK(gp_loader_create(&ds20, &cfg, &o, &ld));
        bool four = gp_loader_batches_per_epoch(ld) == 4, whole = four;
        CHECK(four);
        for (int k = 0; k < 8 && four; k++) { /* (an empty fifth would never fill) */
            CHECK_OK(gp_loader_next(ld, &b));
            whole = whole && b.n == 5 && b.index == k % 4 && b.epoch == k / 4 &&
                    id_of(&b, 0, 16) == 5 * (k % 4);
        }
        CHECK_MSG(whole, "drop_last %d: 20 samples in batches of 5", dl);
        gp_loader_destroy(ld);
    }
    gp_dataset_free(&ds20);

    /* One batch of everything, bigger than the set without drop_last. */
    o = lopts(100, false, 1);
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    CHECK_OK(gp_loader_next(ld, &b));
    CHECK(b.n == 23 && gp_loader_batches_per_epoch(ld) == 1);
    CHECK_OK(gp_loader_next(ld, &b));
    CHECK(b.n == 23 && b.epoch == 1);
    gp_loader_destroy(ld);
    gp_dataset_free(&ds);
}

static void test_loader_normalise(void)
{
    gp_dataset ds;
    id_dataset(&ds, 9, 3, 5, 4);
    gp_data_config cfg = base_cfg(GP_DATASET_FASHION_MNIST, "");
    gp_loader *ld = NULL;
    gp_loader_opts o = lopts(4, false, 1);
    /* mode 0: no mean given, the dataset's default (whose values
     * test_default_norm checks against the real pixels) */
    float dm[1], dsd[1];
    gp_dataset_default_norm(GP_DATASET_FASHION_MNIST, 1, dm, dsd);
    for (int mode = 0; mode < 3; mode++) {
        double mean = dm[0], sd = dsd[0];
        cfg.normalize = mode != 2;
        cfg.n_mean = 0;
        if (mode == 1) {
            cfg.n_mean = 1;
            cfg.mean[0] = 0.25f;
            cfg.std[0] = 0.5f;
            mean = 0.25;
            sd = 0.5;
        }
        CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
        double worst = 0;
        for (int k = 0; k < 3; k++) {
            gp_batch b;
            CHECK_OK(gp_loader_next(ld, &b));
            for (int64_t i = 0; i < b.n; i++)
                for (int64_t p = 0; p < 15; p++) {
                    double px = ds.images[(b.first + i) * 15 + p];
                    double want = mode == 2 ? px / 255.0 : (px / 255.0 - mean) / sd;
                    double err = fabs(b.x[i * 15 + p] - want);
                    if (err > worst) worst = err;
                }
        }
        CHECK_MSG(worst < 1e-6, "mode %d: worst error %g", mode, worst);
        gp_loader_destroy(ld);
    }
    gp_dataset_free(&ds);
    /* several channels: channel c takes entry c of data.mean and data.std,
     * and one entry serves every channel */
    gp_data_config pc = base_cfg(GP_DATASET_SYNTHETIC, "");
    const float m3[3] = {0.1f, 0.2f, 0.3f}, s3[3] = {0.4f, 0.5f, 0.6f};
    memcpy(pc.mean, m3, sizeof m3);
    memcpy(pc.std, s3, sizeof s3);
    float gm[3], gs[3];
    for (int n = 3; n >= 1; n -= 2) {
        pc.n_mean = n;
        gp_data_norm(&pc, 3, gm, gs);
        bool ok = true;
        for (int c = 0, e; c < 3; c++) {
            e = n == 3 ? c : 0;
            ok = ok && gm[c] == m3[e] && gs[c] == s3[e];
        }
        CHECK_MSG(ok, "%d entries for 3 channels: mean %g %g %g, std %g %g %g", n, gm[0], gm[1],
                  gm[2], gs[0], gs[1], gs[2]);
    }
}

/* Naive crop-then-flip, written independently of the library's. */
static uint8_t naive_aug(const uint8_t *img, int h, int w, int y, int x, int dy, int dx,
                         bool flip)
{
    int cx = flip ? w - 1 - x : x; /* position in the cropped image */
    int sy = y + dy, sx = cx + dx; /* in the zero-padded original */
    if (sy < 0 || sy >= h || sx < 0 || sx >= w) return 0;
    return img[sy * w + sx];
}

static void test_loader_augment(void)
{
    /* Pixels 1..36 by position (0 is the padding), sample id in the label. */
    const int n = 50, h = 6, w = 6;
    gp_dataset ds;
    id_dataset(&ds, n, h, w, 50);
    for (int i = 0; i < n; i++)
        for (int p = 0; p < h * w; p++) ds.images[i * h * w + p] = (uint8_t)(1 + p + (i % 3));
    gp_data_config cfg = base_cfg(GP_DATASET_SYNTHETIC, "");
    cfg.normalize = false;
    cfg.crop_padding = 2;
    cfg.hflip = true;
    gp_loader_opts o = lopts(7, true, 11);
    o.augment = true;
    gp_loader *ld = NULL;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    int flips = 0, total = 0, mismatch = 0, shifts[5][5] = {{0}};
    for (int k = 0; k < 8 * gp_loader_batches_per_epoch(ld); k++) {
        gp_batch b;
        CHECK_OK(gp_loader_next(ld, &b));
        for (int64_t i = 0; i < b.n; i++) {
            int id = (int)b.y[i];
            int dy, dx;
            bool flip;
            gp_data_augment_draw(11, b.epoch, b.first + i, 2, true, &dy, &dx, &flip);
            if (dy < -2 || dy > 2 || dx < -2 || dx > 2) {
                mismatch++;
                continue;
            }
            shifts[dy + 2][dx + 2]++;
            flips += flip;
            total++;
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++) {
                    uint8_t want = naive_aug(ds.images + id * h * w, h, w, y, x, dy, dx, flip);
                    if (lrintf(b.x[i * h * w + y * w + x] * 255.0f) != want) mismatch++;
                }
        }
    }
    gp_loader_destroy(ld);
    CHECK_MSG(mismatch == 0, "%d augmented pixels differ from the naive crop/flip", mismatch);
    CHECK(total == 8 * n);
    CHECK_MSG(flips > total * 0.4 && flips < total * 0.6, "%d of %d flipped", flips, total);
    bool all_shifts = true;
    for (int a = 0; a < 5; a++)
        for (int c = 0; c < 5; c++) all_shifts = all_shifts && shifts[a][c] > 0;
    CHECK(all_shifts);

    /* Flip only: each image is its own mirror or itself, and the pixel
     * multiset is unchanged. */
    cfg.crop_padding = 0;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    int mirrored = 0, same = 0, other = 0;
    for (int k = 0; k < 2 * gp_loader_batches_per_epoch(ld); k++) {
        gp_batch b;
        CHECK_OK(gp_loader_next(ld, &b));
        for (int64_t i = 0; i < b.n; i++) {
            const uint8_t *img = ds.images + (int)b.y[i] * h * w;
            bool is_same = true, is_mirror = true;
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++) {
                    long v = lrintf(b.x[i * h * w + y * w + x] * 255.0f);
                    is_same = is_same && v == img[y * w + x];
                    is_mirror = is_mirror && v == img[y * w + (w - 1 - x)];
                }
            mirrored += is_mirror;
            same += is_same;
            other += !is_mirror && !is_same;
        }
    }
    gp_loader_destroy(ld);
    CHECK(other == 0 && mirrored > 20 && same > 20);

    /* augment off (evaluation): no crop or flip whatever the config says. */
    cfg.crop_padding = 2;
    o.augment = false;
    o.shuffle = false;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    bool plain = true;
    for (int k = 0; k < gp_loader_batches_per_epoch(ld); k++) {
        gp_batch b;
        CHECK_OK(gp_loader_next(ld, &b));
        for (int64_t i = 0; i < b.n * h * w; i++)
            plain = plain && lrintf(b.x[i] * 255.0f) == ds.images[b.first * h * w + i];
    }
    CHECK(plain);
    gp_loader_destroy(ld);

    /* Same seed: identical augmented batches. */
    o.augment = true;
    o.shuffle = true;
    gp_loader *l2 = NULL;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    o.prefetch = 1;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &l2));
    bool equal = true;
    for (int k = 0; k < 20; k++) {
        gp_batch b1, b2;
        CHECK_OK(gp_loader_next(ld, &b1));
        CHECK_OK(gp_loader_next(l2, &b2));
        equal = equal && b1.n == b2.n &&
                memcmp(b1.x, b2.x, sizeof(float) * (size_t)(b1.n * h * w)) == 0 &&
                memcmp(b1.y, b2.y, sizeof(float) * (size_t)b1.n) == 0;
    }
    CHECK(equal);
    gp_loader_destroy(ld);
    gp_loader_destroy(l2);
    gp_dataset_free(&ds);
}

static void test_loader_errors_and_shutdown(void)
{
    gp_dataset ds;
    id_dataset(&ds, 23, 4, 4, 3);
    gp_data_config cfg = base_cfg(GP_DATASET_SYNTHETIC, "");
    gp_loader *ld = NULL;

    /* An error in the producer arrives after the good batches before it. */
    ds.labels[12] = 7;
    gp_loader_opts o = lopts(5, false, 1);
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    gp_batch b;
    CHECK_OK(gp_loader_next(ld, &b));
    CHECK_OK(gp_loader_next(ld, &b));
    CHECK(b.index == 1);
    CHECK_ERR(gp_loader_next(ld, &b), GP_ERR_DATA, "sample 12 has label 7, out of range");
    CHECK_ERR(gp_loader_next(ld, &b), GP_ERR_DATA, "epoch 0, batch 2");
    gp_loader_destroy(ld);
    ds.labels[12] = 0;

    /* Destroy at every point: before any batch, mid-epoch with a full
     * queue, right after a batch.  Must neither hang nor leak. */
    double t0 = gp_now();
    for (int r = 0; r < 200; r++) {
        o = lopts(1 + r % 5, r % 2 == 0, (uint64_t)r);
        o.prefetch = 1 + r % 3;
        CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
        for (int k = 0; k < r % 4; k++) CHECK_OK(gp_loader_next(ld, &b));
        if (r % 7 == 0) { /* let the producer fill the queue */
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        gp_loader_destroy(ld);
    }
    CHECK_MSG(gp_now() - t0 < 10, "200 create/destroy took %.1f s", gp_now() - t0);
    gp_loader_destroy(NULL);
    gp_dataset_free(&ds);
}

/* ------------------------------------------------------------------------ */
/* the real Fashion-MNIST                                                    */

static void check_real_split(const gp_data_config *cfg, bool train, int64_t n)
{
    gp_dataset ds = {0};
    double t0 = gp_now();
    CHECK_OK(gp_dataset_load(cfg, train, 0, &ds));
    CHECK(ds.n == n && ds.c == 1 && ds.h == 28 && ds.w == 28 && ds.classes == 10);
    int64_t count[10] = {0};
    bool in_range = true;
    for (int64_t i = 0; i < ds.n; i++) {
        if (ds.labels[i] < 10) count[ds.labels[i]]++;
        else in_range = false;
    }
    CHECK(in_range);
    bool balanced = true;
    for (int k = 0; k < 10; k++) balanced = balanced && count[k] == n / 10;
    CHECK_MSG(balanced, "class counts %lld %lld ... not %lld each", (long long)count[0],
              (long long)count[1], (long long)(n / 10));
    /* The published mean pixel of the training set, 0.2860. */
    double sum = 0;
    for (int64_t p = 0; p < ds.n * 784; p++) sum += ds.images[p];
    double mean = ds.n ? sum / (double)(ds.n * 784) / 255.0 : 0;
    CHECK_NEAR(mean, 0.2860, 0.003, 0);
    printf("test_data: Fashion-MNIST %s split: %lld samples, mean pixel %.4f, read in %.2f s\n",
           train ? "train" : "test", (long long)ds.n, mean, gp_now() - t0);
    gp_dataset_free(&ds);
}

static void test_real_fashion_mnist(void)
{
    const char *dir = "/usr/share/datasets/fashion-mnist";
    struct stat st;
    if (stat(dir, &st) != 0) {
        printf("test_data: %s absent: real-data check NOT run (not counted)\n", dir);
        return;
    }
    gp_data_config cfg = base_cfg(GP_DATASET_FASHION_MNIST, dir);
    check_real_split(&cfg, false, 10000);
    check_real_split(&cfg, true, 60000);
    /* The default directory when data.path is empty. */
    cfg.path[0] = '\0';
    cfg.test_limit = 10;
    gp_dataset ds = {0};
    CHECK_OK(gp_dataset_load(&cfg, false, 0, &ds));
    CHECK(ds.n == 10 && strstr(ds.source, dir) != NULL);
    gp_dataset_free(&ds);
}

/* ------------------------------------------------------------------------ */

static void rm_tree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void)
{
    if (!gpt_make_tmpdir(tmpdir, sizeof tmpdir, "gp_test_data_")) return 1;
    test_idx_roundtrip();
    test_idx_errors();
    test_dataset_load_idx();
    test_cifar();
    test_synthetic();
    test_default_norm();
    test_loader_order();
    test_loader_batches();
    test_loader_pinned();
    test_loader_normalise();
    test_loader_augment();
    test_loader_errors_and_shutdown();
    test_real_fashion_mnist();
    rm_tree(tmpdir);
    return gpt_finish("test_data");
}
