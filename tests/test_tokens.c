/*
 * test_tokens.c — data.dataset: tokens (src/data/tokens.c): llm.c token
 * files written here byte by byte, their windows through the loader
 * (sequential and shuffled, resumed mid-epoch), the split files data.path
 * names, the config's checks, and every damaged file the reader refuses.
 *
 * The oracle for a window is the token array the test wrote: window k of
 * T + 1 tokens starts at k (T + 1), input its first T, targets the T after.
 */
#include "config/config.h"
#include "data/data.h"

#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "test_util.h"

static char tmpdir[256];

/* A token file: header words magic, version, count (as given), then `n`
 * tokens little-endian, then `extra` zero bytes. */
static void write_tokens(const char *path, const uint16_t *tok, int64_t n, int32_t magic,
                         int32_t version, int32_t count, int64_t extra)
{
    size_t len = 1024 + 2 * (size_t)n + (size_t)extra;
    unsigned char *b = calloc(1, len);
    int32_t words[3] = {magic, version, count};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++) b[4 * k + j] = (unsigned char)((uint32_t)words[k] >> (8 * j));
    for (int64_t i = 0; i < n; i++) {
        b[1024 + 2 * i] = (unsigned char)(tok[i] & 0xff);
        b[1024 + 2 * i + 1] = (unsigned char)(tok[i] >> 8);
    }
    gpt_write_file(path, b, len);
    free(b);
}

static uint16_t token_at(int64_t i) { return (uint16_t)((i * 7919 + 3) % 65536); }

static void make_stream(uint16_t *tok, int64_t n)
{
    for (int64_t i = 0; i < n; i++) tok[i] = token_at(i);
}

/* The window a batch row holds, from its first input token; -1 if the row
 * is not exactly a window of the stream (inputs and targets). */
static int64_t row_window(const float *x, const float *y, int64_t T, int64_t windows)
{
    for (int64_t k = 0; k < windows; k++) {
        if (x[0] != (float)token_at(k * (T + 1))) continue;
        for (int64_t t = 0; t < T; t++)
            if (x[t] != (float)token_at(k * (T + 1) + t) ||
                y[t] != (float)token_at(k * (T + 1) + t + 1))
                return -1;
        return k;
    }
    return -1;
}

static void path_in(char *out, size_t len, const char *sub)
{
    snprintf(out, len, "%s/%s", tmpdir, sub);
}

static void test_read_and_windows(void)
{
    const int64_t N = 23, T = 4; /* 4 windows of 5; 3 tokens left over */
    uint16_t tok[23];
    make_stream(tok, N);
    tok[7] = 65535; /* the largest id survives as a float */
    char p[512];
    path_in(p, sizeof p, "w_train.bin");
    write_tokens(p, tok, N, 20240520, 1, (int32_t)N, 0);
    gp_dataset ds = {0};
    CHECK_OK(gp_tokens_read(p, T, &ds));
    CHECK(ds.n == N / (T + 1));
    CHECK(ds.n_tokens == N);
    CHECK(ds.c == T && ds.h == 1 && ds.w == 1);
    CHECK(ds.classes == 65536);
    for (int64_t i = 0; i < N; i++) CHECK(ds.tokens[i] == tok[i]);
    float x[8], y[8];
    gp_data_assemble(&ds, 1, 2, true, NULL, NULL, false, x, y);
    bool ok = true;
    for (int64_t i = 0; i < 2; i++)
        for (int64_t t = 0; t < T; t++) {
            ok &= x[i * T + t] == (float)tok[(1 + i) * (T + 1) + t];
            ok &= y[i * T + t] == (float)tok[(1 + i) * (T + 1) + t + 1];
        }
    CHECK_MSG(ok, "windows 1 and 2 are not tokens 5..9 and 10..14");
    CHECK(y[1] == 65535.0f); /* tok[7] as window 1's target 1 */
    gp_dataset_free(&ds);
}

/* llm.c's Llama 3 files (issue 66): magic 20240801, version 7, uint32
 * tokens, written here byte by byte: ids past 65,535 (Llama 3's 128,256,
 * and one just below 2^24) read exactly and reach the batch as floats;
 * version 1 with that magic, a token past 2^24, and a cut file refused. */
static void test_uint32(void)
{
    const int64_t N = 17, T = 3;
    uint32_t tok[17];
    for (int64_t i = 0; i < N; i++) tok[i] = (uint32_t)(i * 9973 % 128256);
    tok[5] = 128255, tok[6] = 65536, tok[9] = (1u << 24) - 1;
    unsigned char b[1024 + 4 * 17] = {0};
    int32_t words[3] = {20240801, 7, (int32_t)N};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++) b[4 * k + j] = (unsigned char)((uint32_t)words[k] >> (8 * j));
    for (int64_t i = 0; i < N; i++)
        for (int j = 0; j < 4; j++) b[1024 + 4 * i + j] = (unsigned char)(tok[i] >> (8 * j));
    char p[512];
    path_in(p, sizeof p, "u_train.bin");
    gpt_write_file(p, b, sizeof b);
    gp_dataset ds = {0};
    CHECK_OK(gp_tokens_read(p, T, &ds));
    CHECK(ds.n_tokens == N && ds.n == N / (T + 1) && ds.token_bytes == 4);
    CHECK(ds.classes == (1 << 24));
    bool same = true;
    for (int64_t i = 0; i < N && ds.tokens; i++) same &= ds.tokens[i] == tok[i];
    CHECK_MSG(same, "uint32 tokens read back differ");
    float x[6], y[6];
    gp_data_assemble(&ds, 1, 2, true, NULL, NULL, false, x, y);
    CHECK(x[1] == 128255.0f && x[2] == 65536.0f && y[3] == 16777215.0f);
    gp_dataset_free(&ds);
    /* the same ids in a version 1 (uint16) header: refused, the version named */
    b[4] = 1;
    gpt_write_file(p, b, sizeof b);
    CHECK_ERR(gp_tokens_read(p, T, &ds), GP_ERR_DATA, "version 1, but magic 20240801 files are "
              "version 7");
    b[4] = 7;
    /* an id past 2^24: no float holds it */
    b[1024 + 4 * 2 + 3] = 1;
    gpt_write_file(p, b, sizeof b);
    CHECK_ERR(gp_tokens_read(p, T, &ds), GP_ERR_DATA, "token 2 is id");
    /* 2^24 itself is refused too: ids stay below it, and the classes they
     * give (the largest id + 1) at most 2^24 */
    uint8_t t2[4];
    memcpy(t2, b + 1024 + 4 * 2, 4);
    b[1024 + 4 * 2] = b[1024 + 4 * 2 + 1] = b[1024 + 4 * 2 + 2] = 0;
    gpt_write_file(p, b, sizeof b);
    CHECK_ERR(gp_tokens_read(p, T, &ds), GP_ERR_DATA, "token 2 is id 16777216, past 2^24");
    memcpy(b + 1024 + 4 * 2, t2, 4);
    b[1024 + 4 * 2 + 3] = 0;
    /* two bytes short of the count's 4 a token */
    gpt_write_file(p, b, sizeof b - 2);
    CHECK_ERR(gp_tokens_read(p, T, &ds), GP_ERR_DATA, "truncated: its header counts 17 tokens");
}

/* All batches of `epochs` epochs: the window each row holds. */
static void loader_windows(const gp_dataset *ds, bool shuffle, uint64_t seed, int64_t bs,
                           int64_t start_epoch, int64_t start_batch, int64_t batches,
                           int64_t *out)
{
    gp_data_config cfg = {.normalize = true};
    gp_loader_opts o = {.batch_size = bs, .shuffle = shuffle, .prefetch = 3, .seed = seed,
                        .start_epoch = start_epoch, .start_batch = start_batch, .workers = 2};
    gp_loader *ld = NULL;
    CHECK_OK(gp_loader_create(ds, &cfg, &o, &ld));
    if (!ld) return;
    for (int64_t b = 0; b < batches; b++) {
        gp_batch bt;
        CHECK_OK(gp_loader_next(ld, &bt));
        for (int64_t i = 0; i < bs; i++)
            out[b * bs + i] = i < bt.n ? row_window(bt.x + i * ds->c, bt.y + i * ds->c, ds->c,
                                                    ds->n)
                                       : -2;
    }
    gp_loader_destroy(ld);
}

static void test_loader(void)
{
    const int64_t T = 6, W = 40, N = W * (T + 1) + 5, bs = 4, per_epoch = W / bs;
    uint16_t *tok = malloc(sizeof *tok * (size_t)N);
    make_stream(tok, N);
    char p[512];
    path_in(p, sizeof p, "l_train.bin");
    write_tokens(p, tok, N, 20240520, 1, (int32_t)N, 0);
    free(tok);
    gp_dataset ds = {0};
    CHECK_OK(gp_tokens_read(p, T, &ds));
    CHECK(ds.n == W);

    /* sequential: window k is sample k, in order, epoch after epoch */
    int64_t seq[2 * 40];
    loader_windows(&ds, false, 1, bs, 0, 0, 2 * per_epoch, seq);
    bool inorder = true;
    for (int64_t k = 0; k < 2 * W; k++) inorder &= seq[k] == k % W;
    CHECK_MSG(inorder, "sequential windows out of order");

    /* shuffled: each epoch visits every window once, not in file order,
     * in another order the next epoch; the same again for the same seed */
    int64_t a[3 * 40], b[3 * 40], c[3 * 40];
    loader_windows(&ds, true, 7, bs, 0, 0, 3 * per_epoch, a);
    loader_windows(&ds, true, 7, bs, 0, 0, 3 * per_epoch, b);
    loader_windows(&ds, true, 8, bs, 0, 0, 3 * per_epoch, c);
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(memcmp(a, c, sizeof a) != 0);
    for (int e = 0; e < 3; e++) {
        int seen[40] = {0};
        bool perm = true;
        for (int64_t k = 0; k < W; k++) {
            int64_t w = a[e * W + k];
            perm &= w >= 0 && w < W && !seen[w]++;
        }
        CHECK_MSG(perm, "epoch %d does not visit each window once", e);
    }
    CHECK(memcmp(a, seq, sizeof(int64_t) * (size_t)W) != 0);
    CHECK(memcmp(a, a + W, sizeof(int64_t) * (size_t)W) != 0);

    /* resumed at epoch 1, batch 3 (where a snapshot records the loader):
     * exactly the batches the uninterrupted run had from there */
    int64_t r[2 * 40];
    int64_t from = per_epoch + 3, left = 2 * per_epoch - 3;
    loader_windows(&ds, true, 7, bs, 1, 3, left, r);
    CHECK_MSG(!memcmp(r, a + from * bs, sizeof(int64_t) * (size_t)(left * bs)),
              "the resumed loader's windows differ from the run it resumes");

    /* masks are not the targets of tokens */
    gp_data_config cfg = {0};
    gp_loader_opts o = {.batch_size = 2, .masks = true, .prefetch = 1};
    gp_loader *ld = NULL;
    CHECK_ERR(gp_loader_create(&ds, &cfg, &o, &ld), GP_ERR_INVALID, "next tokens");
    gp_dataset_free(&ds);
}

static void test_errors(void)
{
    uint16_t tok[40];
    make_stream(tok, 40);
    char p[512];
    gp_dataset ds = {0};
    path_in(p, sizeof p, "bad.bin");

    write_tokens(p, tok, 40, 20240521, 1, 40, 0);
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, "bad magic 20240521, expected 20240520 "
              "(uint16 tokens) or 20240801");
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, p);
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, "scripts/tokenize_text.py");
    write_tokens(p, tok, 40, 20240520, 2, 40, 0);
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, "version 2");
    /* the header cut short */
    write_tokens(p, tok, 0, 20240520, 1, 0, 0);
    if (truncate(p, 600) != 0) perror("truncate");
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, "truncated header: 600 of 1024");
    /* fewer tokens than counted: the file was cut */
    write_tokens(p, tok, 39, 20240520, 1, 40, 0);
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, "truncated: its header counts 40 tokens");
    /* an odd byte short */
    write_tokens(p, tok, 40, 20240520, 1, 40, 0);
    if (truncate(p, 1024 + 79) != 0) perror("truncate");
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, "truncated");
    /* more than counted */
    write_tokens(p, tok, 40, 20240520, 1, 38, 0);
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, "goes on after the 38 tokens");
    write_tokens(p, tok, 40, 20240520, 1, -3, 0);
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_DATA, "negative");
    /* not one window */
    write_tokens(p, tok, 10, 20240520, 1, 10, 0);
    CHECK_ERR(gp_tokens_read(p, 10, &ds), GP_ERR_DATA, "fewer than one window");
    CHECK_OK(gp_tokens_read(p, 9, &ds)); /* exactly one */
    CHECK(ds.n == 1);
    gp_dataset_free(&ds);
    path_in(p, sizeof p, "none.bin");
    CHECK_ERR(gp_tokens_read(p, 4, &ds), GP_ERR_IO, "none.bin");
    CHECK(ds.tokens == NULL); /* failures leave the output as it was */
}

static void test_files_and_config(void)
{
    uint16_t tok[64];
    make_stream(tok, 64);
    char d[512], p[700], t[1024], v[1024];
    path_in(d, sizeof d, "corpus");
    mkdir(d, 0700);
    CHECK_ERR(gp_tokens_files(d, t, v), GP_ERR_IO, "no <name>_train.bin");
    snprintf(p, sizeof p, "%s/shake_train.bin", d);
    write_tokens(p, tok, 64, 20240520, 1, 64, 0);
    CHECK_ERR(gp_tokens_files(d, t, v), GP_ERR_IO, "no <name>_val.bin");
    CHECK_ERR(gp_tokens_files(p, t, v), GP_ERR_IO, "shake_val.bin");
    snprintf(p, sizeof p, "%s/shake_val.bin", d);
    write_tokens(p, tok, 20, 20240520, 1, 20, 0);
    CHECK_OK(gp_tokens_files(d, t, v));
    CHECK(strstr(t, "/corpus/shake_train.bin") && strstr(v, "/corpus/shake_val.bin"));
    CHECK_ERR(gp_tokens_files(p, t, v), GP_ERR_IO, "not a <name>_train.bin");
    snprintf(p, sizeof p, "%s/shake_train.bin", d);
    CHECK_OK(gp_tokens_files(p, t, v));
    CHECK(strstr(v, "/corpus/shake_val.bin") != NULL);

    /* through the config: model.input [T] is the window */
    char yaml[1400];
    snprintf(yaml, sizeof yaml,
             "model: {input: [7], layers: [flatten, {linear: {out: 4}}]}\n"
             "data: {dataset: tokens, path: '%s'}\n", d);
    gp_config cfg;
    CHECK_OK(gp_config_parse("tok.yaml", yaml, strlen(yaml), NULL, 0, &cfg));
    gp_dataset tr = {0}, va = {0};
    CHECK_OK(gp_dataset_load(&cfg.data, true, 1, &tr));
    CHECK_OK(gp_dataset_load(&cfg.data, false, 1, &va));
    CHECK(tr.n == 64 / 8 && tr.c == 7 && va.n == 20 / 8);
    CHECK(strstr(va.source, "validation") && strstr(va.source, "shake_val.bin"));
    char where[2048];
    CHECK_OK(gp_dataset_locate(&cfg.data, where, sizeof where));
    CHECK(strstr(where, "shake_train.bin") != NULL);
    gp_dataset_free(&tr);
    gp_dataset_free(&va);
    cfg.data.train_limit = 3;
    CHECK_OK(gp_dataset_load(&cfg.data, true, 1, &tr));
    CHECK(tr.n == 3);
    gp_dataset_free(&tr);
    gp_config_free(&cfg);

    const char *img = "model: {input: [1, 7, 7], layers: [flatten, {linear: {out: 4}}]}\n"
                      "data: {dataset: tokens, path: /nonexistent}\n";
    CHECK_ERR(gp_config_parse("img.yaml", img, strlen(img), NULL, 0, &cfg), GP_ERR_INVALID,
              "model.input must be [T]");
    CHECK_ERR(gp_config_parse("img.yaml", img, strlen(img), NULL, 0, &cfg), GP_ERR_INVALID,
              "img.yaml:1:");
    const char *nopath = "model: {input: [7], layers: [flatten, {linear: {out: 4}}]}\n"
                         "data: {dataset: tokens}\n";
    CHECK_ERR(gp_config_parse("np.yaml", nopath, strlen(nopath), NULL, 0, &cfg), GP_ERR_INVALID,
              "needs data.path");
    /* two training splits in one folder: which one is not guessed */
    snprintf(p, sizeof p, "%s/other_train.bin", d);
    write_tokens(p, tok, 64, 20240520, 1, 64, 0);
    CHECK_ERR(gp_tokens_files(d, t, v), GP_ERR_IO, "2 train splits");
}

/* data.dataset: synthetic for a model that reads token ids: windows of
 * T + 1 ids below min(vocab, 256) that follow a fixed permutation nine
 * times in ten (counted against a bound a random stream would miss),
 * the same for the same seed, another for another seed or the test split;
 * through the config for a model whose first layer is an embedding, and
 * images still for one whose is not. */
static void test_synthetic(void)
{
    const int64_t T = 16, n = 200;
    gp_dataset a = {0}, b = {0}, c = {0}, v = {0};
    CHECK_OK(gp_synthetic_tokens(n, T, 50257, 5, 0, &a));
    CHECK_OK(gp_synthetic_tokens(n, T, 50257, 5, 0, &b));
    CHECK_OK(gp_synthetic_tokens(n, T, 50257, 6, 0, &c));
    CHECK_OK(gp_synthetic_tokens(n, T, 50257, 5, (int64_t)1 << 40, &v));
    CHECK(a.tokens && a.n == n && a.c == T && a.h == 1 && a.w == 1 && a.n_tokens == n * (T + 1));
    CHECK(a.classes == 256 && !a.images && !a.labels);
    CHECK(!memcmp(a.tokens, b.tokens, sizeof *a.tokens * (size_t)a.n_tokens));
    CHECK(memcmp(a.tokens, c.tokens, sizeof *a.tokens * (size_t)a.n_tokens) != 0);
    CHECK(memcmp(a.tokens, v.tokens, sizeof *a.tokens * (size_t)a.n_tokens) != 0);
    /* the successor table, read back as each id's most frequent follower */
    static int64_t pair[256][256];
    memset(pair, 0, sizeof pair);
    bool below = true;
    for (int64_t w = 0; w < n; w++)
        for (int64_t p = 0; p <= T; p++) {
            uint32_t id = a.tokens[w * (T + 1) + p];
            below &= id < 256;
            if (p > 0 && below) pair[a.tokens[w * (T + 1) + p - 1]][id]++;
        }
    CHECK_MSG(below, "a synthetic token id at or past 256");
    int64_t follow = 0, all = 0;
    for (int i = 0; i < 256; i++) {
        int64_t best = 0;
        for (int j = 0; j < 256; j++) {
            best = pair[i][j] > best ? pair[i][j] : best;
            all += pair[i][j];
        }
        follow += best;
    }
    CHECK_MSG(follow * 10 > all * 8 && follow * 100 < all * 96,
              "%lld of %lld ids follow their id's usual successor: not about 9 in 10",
              (long long)follow, (long long)all);
    /* a small vocabulary: every id below it */
    gp_dataset s = {0};
    CHECK_OK(gp_synthetic_tokens(4, 8, 20, 1, 0, &s));
    CHECK(s.classes == 20);
    bool small = true;
    for (int64_t i = 0; i < s.n_tokens; i++) small &= s.tokens[i] < 20;
    CHECK(small);
    CHECK_ERR(gp_synthetic_tokens(0, 8, 20, 1, 0, &s), GP_ERR_INVALID, "synthetic tokens");
    gp_dataset *all4[] = {&a, &b, &c, &v, &s};
    for (int i = 0; i < 5; i++) gp_dataset_free(all4[i]);

    /* the config: an embedding first makes token windows of model.input */
    const char *lm = "model: {input: [12], layers: [{embedding: {vocab: 100, dim: 8, "
                     "positions: 12}}, {linear: {out: 100}}]}\n"
                     "data: {dataset: synthetic, synthetic: {train: 30, test: 10}}\n";
    gp_config cfg;
    CHECK_OK(gp_config_parse("lm.yaml", lm, strlen(lm), NULL, 0, &cfg));
    CHECK(cfg.data.token_vocab == 100);
    gp_dataset tr = {0}, te = {0};
    CHECK_OK(gp_dataset_load(&cfg.data, true, 3, &tr));
    CHECK_OK(gp_dataset_load(&cfg.data, false, 3, &te));
    CHECK(tr.tokens && tr.n == 30 && tr.c == 12 && te.tokens && te.n == 10);
    CHECK(strstr(tr.source, "synthetic tokens") != NULL);
    gp_dataset_free(&tr);
    gp_dataset_free(&te);
    gp_config_free(&cfg);
    const char *im = "model: {input: [1, 8, 8], layers: [flatten, {linear: {out: 10}}]}\n"
                     "data: {dataset: synthetic, synthetic: {train: 30, test: 10}}\n";
    CHECK_OK(gp_config_parse("im.yaml", im, strlen(im), NULL, 0, &cfg));
    CHECK(cfg.data.token_vocab == 0);
    CHECK_OK(gp_dataset_load(&cfg.data, true, 3, &tr));
    CHECK(!tr.tokens && tr.images && tr.n == 30);
    gp_dataset_free(&tr);
    gp_config_free(&cfg);
}

int main(void)
{
    if (!gpt_make_tmpdir(tmpdir, sizeof tmpdir, "gp_test_tokens_")) return 1;
    test_read_and_windows();
    test_uint32();
    test_loader();
    test_errors();
    test_files_and_config();
    test_synthetic();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return gpt_finish("test_tokens");
}
