/*
 * test_core.c — core: Philox known answers and RNG properties, memory
 * accounting and its out-of-memory message, byte-size parsing, shapes,
 * error messages, and the checks of output paths (each failure a message
 * naming the path; nothing left behind, pass or fail).
 */
#include "core/core.h"
#include "test.h"
#include <errno.h>

#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_philox(void)
{
    /* Known-answer vectors of Philox4x32-10 (Random123's kat_vectors). */
    gp_philox_out o = gp_philox4x32(0, 0, 0);
    CHECK(o.v[0] == 0x6627e8d5u && o.v[1] == 0xe169c58du && o.v[2] == 0xbc57ac4cu &&
          o.v[3] == 0x9b00dbd8u);
    o = gp_philox4x32(0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull);
    CHECK(o.v[0] == 0x408f276du && o.v[1] == 0x41c83b0eu && o.v[2] == 0xa20bc7c6u &&
          o.v[3] == 0x6d5451fdu);
    o = gp_philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
    CHECK(o.v[0] == 0xd16cfe09u && o.v[1] == 0x94fdccebu && o.v[2] == 0x5001e420u &&
          o.v[3] == 0x24126ea1u);
}

static void test_uniform(void)
{
    /* fill of any sub-range equals the element-wise values */
    float all[1001], part[300];
    gp_rng_uniform_fill(7, 11, 0, all, 1001);
    gp_rng_uniform_fill(7, 11, 333, part, 300);
    int same = 1;
    for (int i = 0; i < 300; i++) same &= part[i] == all[333 + i];
    CHECK(same);
    CHECK(all[5] == gp_rng_uniform(7, 11, 5));
    double mean = 0;
    int in_range = 1;
    for (int i = 0; i < 1001; i++) {
        mean += all[i];
        in_range &= all[i] >= 0.0f && all[i] < 1.0f;
    }
    CHECK(in_range);
    CHECK_NEAR(mean / 1001, 0.5, 0.03, 0);
    CHECK(gp_rng_uniform(7, 12, 5) != gp_rng_uniform(7, 11, 5));
    CHECK(gp_rng_uniform(8, 11, 5) != gp_rng_uniform(7, 11, 5));
    CHECK(gp_rng_stream(1, 2, 3) != gp_rng_stream(1, 3, 2));
    /* a fill large enough to run on every core (in chunks), from an index
     * that is not a Philox block's first: each value its own index's */
    enum { BIG = 200003 };
    float *big = malloc(BIG * sizeof *big);
    CHECK(big != NULL);
    if (!big) return;
    gp_rng_uniform_fill(7, 11, 5, big, BIG);
    int64_t bad = 0;
    for (int64_t i = 0; i < BIG; i++) bad += big[i] != gp_rng_uniform(7, 11, 5 + (uint64_t)i);
    CHECK_MSG(bad == 0, "a parallel uniform fill: %lld values differ from their index's",
              (long long)bad);
    gp_rng_normal_fill(7, 11, 3, big, BIG);
    bad = 0;
    for (int64_t i = 0; i < BIG; i++)
        bad += big[i] != (float)gp_rng_normal(7, 11, 3 + (uint64_t)i);
    CHECK_MSG(bad == 0, "a parallel normal fill: %lld values differ from their index's",
              (long long)bad);
    free(big);
}

/* gp_rng_normal: a pure function of (seed, stream, index) like the
 * uniforms; the moments of 2e5 draws within 5 standard errors of N(0, 1)'s
 * (mean 0, variance 1, 4th moment 3, P(|z| < 1) = 0.6827); neighbours
 * (which share a Philox block) uncorrelated. */
static void test_normal(void)
{
    enum { N = 200000 };
    float *all = malloc(N * sizeof *all), part[300];
    gp_rng_normal_fill(7, 11, 0, all, N);
    gp_rng_normal_fill(7, 11, 333, part, 300);
    int same = 1;
    for (int i = 0; i < 300; i++) same &= part[i] == all[333 + i];
    CHECK(same);
    CHECK(all[5] == (float)gp_rng_normal(7, 11, 5));
    CHECK(gp_rng_normal(7, 12, 5) != gp_rng_normal(7, 11, 5));
    double m1 = 0, m2 = 0, m4 = 0, lag = 0, maxabs = 0;
    int64_t within = 0;
    for (int i = 0; i < N; i++) {
        double z = all[i];
        m1 += z;
        m2 += z * z;
        m4 += z * z * z * z;
        if (i) lag += z * all[i - 1];
        within += fabs(z) < 1.0;
        maxabs = fmax(maxabs, fabs(z));
    }
    m1 /= N;
    m2 /= N;
    m4 /= N;
    lag /= N - 1;
    CHECK_NEAR(m1, 0.0, 5.0 / sqrt(N), 0);
    CHECK_NEAR(m2, 1.0, 5.0 * sqrt(2.0 / N), 0);
    CHECK_NEAR(m4, 3.0, 5.0 * sqrt(96.0 / N), 0);
    CHECK_NEAR(lag, 0.0, 5.0 / sqrt(N), 0);
    CHECK_NEAR((double)within / N, 0.682689, 5.0 * sqrt(0.6827 * 0.3173 / N), 0);
    CHECK(maxabs < 6.7 && maxabs > 3.5);
    free(all);
}

static void test_allocator(void)
{
    gp_allocator a;
    gp_allocator_init(&a, "cpu:3", 1000);
    CHECK_OK(gp_allocator_reserve(&a, 600, GP_MEM_PARAMS));
    gp_allocator_commit(&a, GP_MEM_PARAMS);
    /* reserved, then released without its memory (the backend could not
     * allocate it): the peaks never saw it */
    CHECK_OK(gp_allocator_reserve(&a, 350, GP_MEM_WORKSPACE));
    gp_allocator_release(&a, 350, GP_MEM_WORKSPACE);
    CHECK(a.peak == 600 && a.peak_by[GP_MEM_WORKSPACE] == 0 && a.live_blocks == 1);
    CHECK_OK(gp_allocator_reserve(&a, 300, GP_MEM_ACTIVATIONS));
    gp_allocator_commit(&a, GP_MEM_ACTIVATIONS);
    CHECK(a.current == 900 && a.peak == 900 && a.cur_by[GP_MEM_PARAMS] == 600);
    CHECK_ERR(gp_allocator_reserve(&a, 200, GP_MEM_ACTIVATIONS), GP_ERR_OOM, "device cpu:3");
    CHECK(strstr(gp_last_error(), "requested 200 B") != NULL);
    CHECK(strstr(gp_last_error(), "900 B in use") != NULL);
    CHECK(strstr(gp_last_error(), "capacity of 1000 B") != NULL);
    CHECK(a.current == 900); /* a refused request changes nothing */
    gp_allocator_release(&a, 300, GP_MEM_ACTIVATIONS);
    CHECK(a.current == 600 && a.peak == 900 && a.peak_by[GP_MEM_ACTIVATIONS] == 300);
    gp_allocator_reset_peak(&a);
    CHECK(a.peak == 600 && a.peak_by[GP_MEM_ACTIVATIONS] == 0);
    gp_allocator_release(&a, 600, GP_MEM_PARAMS);
    CHECK(a.current == 0 && a.live_blocks == 0);
    gp_allocator_destroy(&a);

    gp_allocator u;
    gp_allocator_init(&u, "cpu:0", 0); /* unlimited */
    CHECK_OK(gp_allocator_reserve(&u, (size_t)1 << 40, GP_MEM_WORKSPACE));
    gp_allocator_release(&u, (size_t)1 << 40, GP_MEM_WORKSPACE);
    gp_allocator_destroy(&u);
}

static void test_bytes(void)
{
    size_t b = 0;
    CHECK(gp_parse_bytes("512MiB", &b) && b == 512u * 1024 * 1024);
    CHECK(gp_parse_bytes("1.5GB", &b) && b == (size_t)(1.5 * 1073741824.0));
    CHECK(gp_parse_bytes("4096", &b) && b == 4096);
    CHECK(gp_parse_bytes("64 k", &b) && b == 65536);
    CHECK(!gp_parse_bytes("lots", &b));
    CHECK(!gp_parse_bytes("12MiBs", &b));
    CHECK(!gp_parse_bytes("-5", &b));
    char buf[32];
    CHECK(!strcmp(gp_format_bytes(1536, buf, sizeof buf), "1.5 KiB"));
    CHECK(!strcmp(gp_format_bytes(12, buf, sizeof buf), "12 B"));
}

static void test_shapes_and_errors(void)
{
    gp_shape s = gp_shape_4d(8, 3, 5, 7);
    CHECK(gp_shape_numel(&s) == 8 * 3 * 5 * 7);
    gp_shape t = gp_shape_with_batch(&s, 2);
    CHECK(t.dims[0] == 2 && t.dims[3] == 7 && !gp_shape_equal(&s, &t));
    char buf[64];
    CHECK(!strcmp(gp_shape_str(&s, buf, sizeof buf), "(8, 3, 5, 7)"));
    gp_tensor x = {.mem = (gp_mem *)0x1000, .ndim = 4, .dims = {8, 3, 5, 7}};
    gp_tensor v = gp_tensor_slice(&x, 2, 3);
    CHECK(v.dims[0] == 3 && gp_f32(&v) == (float *)0x1000 + 2 * 105 && !v.owned);
    CHECK(v.dtype == GP_F32 && gp_tensor_bytes(&v) == 3 * 105 * sizeof(float));
    /* a bf16 tensor: half the bytes, its slices step by 2-byte values, its
     * views keep the element type */
    gp_tensor h = x;
    h.dtype = GP_BF16;
    CHECK(gp_tensor_bytes(&h) == 8 * 105 * 2 && gp_dtype_size(GP_BF16) == 2);
    gp_tensor hv = gp_tensor_slice(&h, 2, 3);
    CHECK(hv.dtype == GP_BF16 && gp_bf16(&hv) == (uint16_t *)0x1000 + 2 * 105);
    CHECK(gp_tensor_bytes(&hv) == 3 * 105 * 2);
    gp_shape flat = gp_shape_2d(8, 105);
    gp_tensor hr = gp_tensor_reshape(&h, &flat);
    CHECK(hr.dtype == GP_BF16 && hr.ndim == 2 && gp_tensor_mem(&hr) == gp_tensor_mem(&h));
    CHECK(!strcmp(gp_dtype_name(GP_BF16), "bf16") && !strcmp(gp_dtype_name(GP_F32), "fp32"));
    /* reading bf16 values as floats (or floats as bf16) stops at the call */
    for (int as_f32 = 0; as_f32 < 2; as_f32++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            (void)!freopen("/dev/null", "w", stderr);
            gp_tensor w = as_f32 ? h : x;
            volatile void *p = as_f32 ? (void *)gp_f32(&w) : (void *)gp_bf16(&w);
            (void)p;
            _exit(0);
        }
        int st = 0;
        CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
        CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "gp_%s on a %s tensor did not stop",
                  as_f32 ? "f32" : "bf16", as_f32 ? "bf16" : "fp32");
    }

    CHECK(gp_error_set(GP_ERR_DATA, "bad %d", 42) == GP_ERR_DATA);
    CHECK(!strcmp(gp_last_error(), "bad 42"));
    gp_error_wrap(GP_ERR_DATA, "layer %d", 3);
    CHECK(!strcmp(gp_last_error(), "layer 3: bad 42"));
    /* a message longer than the buffer (a deep path of multi-byte
     * characters) is cut between characters, at every alignment of the
     * cut, and so is a wrapped one's prefix and old message */
    for (int k = 0; k < 6; k++) {
        char big[3 * GP_ERRMSG_LEN];
        size_t o = (size_t)k;
        memset(big, 'a', o);
        for (; o + 3 < sizeof big / 2; o += k % 2 ? 2 : 3)
            memcpy(big + o, k % 2 ? "\xc3\xa9" : "\xe2\x82\xac", k % 2 ? 2 : 3);
        big[o] = '\0';
        gp_error_set(GP_ERR_DATA, "%s", big);
        const char *m = gp_last_error();
        size_t n = strlen(m);
        CHECK_MSG(gpt_utf8_valid(m) && n + 3 >= GP_ERRMSG_LEN - 1 && !strncmp(m, big, n),
                  "cut at alignment %d: %zu bytes, %s", k, n, gpt_utf8_valid(m) ? "UTF-8"
                  : "not UTF-8");
        gp_error_wrap(GP_ERR_DATA, "%s", big); /* the prefix fills the buffer */
        CHECK_MSG(gpt_utf8_valid(gp_last_error()), "a wrap's prefix cut at alignment %d", k);
        gp_error_set(GP_ERR_DATA, "%s", big);
        gp_error_wrap(GP_ERR_DATA, "layer %*d", 1 + k, 3); /* the old message cut */
        m = gp_last_error();
        CHECK_MSG(gpt_utf8_valid(m) && strlen(m) + 3 >= GP_ERRMSG_LEN - 1 &&
                      !strncmp(m, "layer", 5),
                  "a wrap's old message cut at alignment %d", k);
    }
    CHECK(!strcmp(gp_status_name(GP_ERR_OOM), "out-of-memory"));
    CHECK(!strcmp(gp_status_name(GP_ERR_STOPPED), "stopped"));
    /* under an address-space limit (a finite one far above what this
     * process maps, sanitizers' shadow included): host memory refused names
     * it once, however often the message is set again from itself (it was
     * said three times), and a thread that cannot start names it too */
    struct rlimit was, lim;
    CHECK(getrlimit(RLIMIT_AS, &was) == 0);
    lim = was;
    lim.rlim_cur = (rlim_t)1 << 62;
    if (was.rlim_cur == RLIM_INFINITY && (was.rlim_max == RLIM_INFINITY ||
                                          was.rlim_max >= lim.rlim_cur)) {
        CHECK(setrlimit(RLIMIT_AS, &lim) == 0);
        gp_error_set(GP_ERR_OOM, "out of host memory");
        char msg[GP_ERRMSG_LEN];
        for (int k = 0; k < 2; k++) {
            snprintf(msg, sizeof msg, "%s", gp_last_error());
            gp_error_set(GP_ERR_OOM, "%s; stopped", msg);
        }
        const char *m = gp_last_error(), *first = strstr(m, "(ulimit -v)");
        CHECK_MSG(first && !strstr(first + 1, "(ulimit -v)"), "the limit said once: %s", m);
        char why[300];
        CHECK_MSG(strstr(gp_thread_error(EAGAIN, why, sizeof why), strerror(EAGAIN)) &&
                      strstr(why, "(ulimit -v)") && strstr(why, "each thread's stack"),
                  "a thread that cannot start under the limit: %s", why);
        CHECK(setrlimit(RLIMIT_AS, &was) == 0);
        CHECK_MSG(!strstr(gp_thread_error(EAGAIN, why, sizeof why), "ulimit"),
                  "no limit, none named: %s", why);
        CHECK(!strcmp(gp_thread_error(EINVAL, why, sizeof why), strerror(EINVAL)));
    }
}

/* Words quoted for a shell: what /bin/sh reads back is the word, and plain
 * words stay plain (the run-end suggestion's command is run as printed). */
static void test_shell_words(void)
{
    static const char *const words[] = {
        "plain.yaml", "pipeline.devices=[cpu:0, cpu:1]", "model.name=it's", "a b\tc",
        "$HOME", "x=`id`", "'", "''a'", "back\\slash", "semi;colon", "{a: 1}", "~", "",
    };
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++) {
        char q[256], cmd[400], got[256] = "";
        gp_shell_word(words[k], q, sizeof q);
        snprintf(cmd, sizeof cmd, "printf '%%s' %s", q);
        FILE *f = popen(cmd, "r");
        CHECK(f != NULL);
        size_t n = f ? fread(got, 1, sizeof got - 1, f) : 0;
        got[n] = '\0';
        if (f) CHECK(pclose(f) == 0);
        CHECK_MSG(!strcmp(got, words[k]), "'%s' quoted as %s reads back as '%s'", words[k], q,
                  got);
    }
    char q[64];
    CHECK(!strcmp(gp_shell_word("configs/tiny-gpt.yaml", q, sizeof q), "configs/tiny-gpt.yaml"));
    CHECK(!strcmp(gp_shell_word("it's", q, sizeof q), "'it'\\''s'"));
    /* cut to fit, still a string */
    CHECK(strlen(gp_shell_word("a b c d e f g h i j k l", q, 8)) < 8);
}

/* Entries in dir, "." and ".." left out. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void test_output_paths(void)
{
    char dir[] = "/tmp/gpipe_core_XXXXXX", p[256], q[256];
    if (!mkdtemp(dir)) {
        CHECK_MSG(false, "mkdtemp failed");
        return;
    }
    snprintf(p, sizeof p, "%s/afile", dir);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) fclose(f);

    /* files: a new one, an existing one (either writer), the null device
     * written in place but not replaced, a directory, a missing directory,
     * a file where a directory should be */
    /* one file, spelled otherwise: existing (same inode), or not yet
     * written (the same name in the same resolved directory) */
    char r1[300], r2[300];
    snprintf(r1, sizeof r1, "%s/./afile", dir);
    CHECK(gp_same_file(p, r1));
    snprintf(r1, sizeof r1, "%s/later.json", dir);
    snprintf(r2, sizeof r2, "%s/../%s/later.json", dir, strrchr(dir, '/') + 1);
    CHECK(gp_same_file(r1, r2));
    snprintf(r2, sizeof r2, "%s/other.json", dir);
    CHECK(!gp_same_file(r1, r2));
    CHECK(!gp_same_file(p, r1));                       /* one exists */
    CHECK(!gp_same_file("/nonexistent/a", "/nonexistent/a/."));
    CHECK(!gp_same_file(dir, r1));
    /* a dangling symbolic link names the file writing it would create:
     * relative and absolute targets, through two links */
    char l1[300], l2[300];
    snprintf(l1, sizeof l1, "%s/link1", dir);
    snprintf(l2, sizeof l2, "%s/link2", dir);
    CHECK(symlink("later.json", l1) == 0);
    CHECK(gp_same_file(l1, r1));
    CHECK(!gp_same_file(l1, r2));
    CHECK(symlink(l1, l2) == 0);
    CHECK(gp_same_file(l2, r1) && gp_same_file(l2, l1));
    unlink(l2);
    CHECK(symlink(r2, l2) == 0); /* absolute, to other.json */
    CHECK(gp_same_file(l2, r2) && !gp_same_file(l2, l1));
    unlink(l1);
    unlink(l2);
    snprintf(q, sizeof q, "%s/new.st", dir);
    CHECK_OK(gp_check_writable_file(q, "--out", true));
    CHECK_OK(gp_check_writable_file(q, "--out", false));
    CHECK_OK(gp_check_writable_file(p, "--out", true));
    CHECK_OK(gp_check_writable_file(p, "--out", false));
    CHECK_OK(gp_check_writable_file("/dev/null", "--out", false));
    CHECK_ERR(gp_check_writable_file("/dev/null", "--out", true), GP_ERR_IO,
              "--out '/dev/null' exists and is not a regular file");
    CHECK_ERR(gp_check_writable_file(dir, "--out", true), GP_ERR_IO, "is a directory");
    snprintf(q, sizeof q, "%s/nodir/w.st", dir);
    CHECK_ERR(gp_check_writable_file(q, "--out", false), GP_ERR_IO, "does not exist");
    snprintf(q, sizeof q, "%s/afile/w.st", dir);
    CHECK_ERR(gp_check_writable_file(q, "--out", true), GP_ERR_IO, "Not a directory");
    CHECK_ERR(gp_check_writable_file("/proc/gpipe-nope.st", "--out", true), GP_ERR_IO,
              "--out '/proc/gpipe-nope.st'");
    CHECK_ERR(gp_check_writable_file("", "--out", true), GP_ERR_INVALID, "empty");
    /* a path the writers cannot hold is refused here, not at the end of the
     * run (gp_atomic_open refused 1024 bytes and more, the checks 4032):
     * a real directory of a 1000-byte path */
    {
        char deep[1200];
        int len = snprintf(deep, sizeof deep, "%s", dir);
        while (len < 1000) {
            len += snprintf(deep + len, sizeof deep - (size_t)len, "/%.60s",
                            "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd");
            CHECK(mkdir(deep, 0755) == 0 || errno == EEXIST);
        }
        char fp[1300];
        snprintf(fp, sizeof fp, "%s/w.st", deep);
        CHECK_ERR(gp_check_writable_file(fp, "--out", true), GP_ERR_INVALID,
                  "path too long (");
        CHECK_ERR(gp_check_writable_dir(deep, "--dir"), GP_ERR_INVALID, "gpipe writes paths of "
                  "up to 899");
        /* a path under the limit passes both */
        deep[GP_PATH_MAX_OUT - 80] = '\0';
        char *cut = strrchr(deep, '/');
        if (cut) *cut = '\0';
        snprintf(fp, sizeof fp, "%s/w.st", deep);
        CHECK_OK(gp_check_writable_file(fp, "--out", true));
        CHECK_OK(gp_check_writable_dir(deep, "--dir"));
        char rm[1400];
        snprintf(rm, sizeof rm, "rm -rf '%s/dddddddddddddddddddddddddddddddddddddddddddddddddddddd"
                 "dddddd'", dir);
        CHECK(system(rm) == 0);
    }

    /* directories: existing, to be made (two levels, made and removed
     * again), a file, under a file, where none can be made */
    CHECK_OK(gp_check_writable_dir(dir, "train.snapshot.dir"));
    snprintf(q, sizeof q, "%s/a/b/", dir);
    CHECK_OK(gp_check_writable_dir(q, "train.snapshot.dir"));
    snprintf(q, sizeof q, "%s/a", dir);
    CHECK_MSG(access(q, F_OK) != 0, "%s was left behind", q);
    CHECK_ERR(gp_check_writable_dir(p, "train.snapshot.dir"), GP_ERR_IO,
              "is a file, not a directory");
    snprintf(q, sizeof q, "%s/afile/x/y", dir);
    CHECK_ERR(gp_check_writable_dir(q, "train.snapshot.dir"), GP_ERR_IO, "Not a directory");
    CHECK_ERR(gp_check_writable_dir("/proc/nope", "train.snapshot.dir"), GP_ERR_IO,
              "train.snapshot.dir '/proc/nope': cannot create '/proc/nope'");
    snprintf(q, sizeof q, "%s/c/d", dir);
    CHECK_OK(gp_check_writable_dir(q, "train.snapshot.dir"));

    /* the folder a path is in, the same folder however spelt; inputs open
     * only as regular files (a folder or device: EINVAL at once) */
    snprintf(q, sizeof q, "%s/./snapshot-1.st", dir);
    CHECK(gp_path_in_dir(q, dir) && gp_path_in_dir(p, dir));
    CHECK(!gp_path_in_dir(q, "/") && !gp_path_in_dir("/nope/x/y", dir));
    CHECK(gp_path_in_dir("bare-name", "."));
    /* an existing file anywhere below a folder (a dataset's): not a new
     * name, not the folder itself, not a sibling folder whose name starts
     * with the folder's */
    snprintf(q, sizeof q, "%s/../%s/./afile", dir, strrchr(dir, '/') + 1);
    CHECK(gp_path_below(p, dir) && gp_path_below(q, dir) && gp_path_below(p, "/"));
    CHECK(gp_path_below(p, p)); /* a data.path that names the file */
    snprintf(q, sizeof q, "%s/not-yet", dir);
    CHECK(!gp_path_below(q, dir) && !gp_path_below(dir, dir) && !gp_path_below(p, "/proc"));
    char sib[300], sibf[320];
    snprintf(sib, sizeof sib, "%s-sib", dir);
    snprintf(sibf, sizeof sibf, "%s/f", sib);
    CHECK(mkdir(sib, 0700) == 0);
    FILE *sf = fopen(sibf, "w");
    CHECK(sf != NULL);
    if (sf) fclose(sf);
    CHECK(gp_path_below(sibf, sib) && !gp_path_below(sibf, dir));
    unlink(sibf);
    rmdir(sib);
    int fd = gp_open_regular(p);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    errno = 0;
    CHECK(gp_open_regular(dir) < 0 && errno == EINVAL);
    CHECK(gp_open_regular("/dev/null") < 0 && errno == EINVAL);
    CHECK(gp_open_regular("/nope/x") < 0 && errno == ENOENT);

    /* nothing but the one file made above is left */
    CHECK_MSG(entries(dir) == 1, "%d entries in %s, expected only afile", entries(dir), dir);
    unlink(p);
    rmdir(dir);
}

int main(void)
{
    test_philox();
    test_uniform();
    test_normal();
    test_allocator();
    test_bytes();
    test_shapes_and_errors();
    test_output_paths();
    test_shell_words();
    return gpt_finish("test_core");
}
