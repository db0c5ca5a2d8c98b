/*
 * paths.c — checking, before any work, that an output can be written where
 * the user asked, so a run does not train for hours and then lose its
 * result to a typo in a path.
 *
 * The checks try what the writer will do (create a file in the directory,
 * make the directory) rather than ask access(2): access says yes to root
 * for /proc and read-only mounts, and does not know whether a directory
 * can still be made there.  Whatever a check creates it removes before it
 * returns, so a failed (or successful) check leaves nothing behind.
 */
#define _DEFAULT_SOURCE /* realpath */
#include "core/core.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_LEN 4096

/* Create and remove a file named `name` (O_EXCL: never an existing one). */
static int probe_create(const char *name)
{
    int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_NOCTTY, 0600);
    if (fd < 0) return errno;
    close(fd);
    unlink(name);
    return 0;
}

/* The directory part of path into dir ("." for a bare name, "/" for
 * "/name"). */
static void dir_of(const char *path, char *dir, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, len, ".");
    else if (slash == path) snprintf(dir, len, "/");
    else snprintf(dir, len, "%.*s", (int)(slash - path), path);
}

gp_status gp_check_writable_file(const char *path, const char *what, bool replaced)
{
    if (!path || !*path)
        return gp_error_set(GP_ERR_INVALID, "%s: the path is empty; give a file name", what);
    if (strlen(path) >= GP_PATH_MAX_OUT)
        return gp_error_set(GP_ERR_INVALID, "%s: path too long (%zu bytes; gpipe writes paths of "
                            "up to %d): '%.80s...'; give a shorter one", what, strlen(path),
                            GP_PATH_MAX_OUT - 1, path);
    char dir[PATH_LEN], probe[2 * PATH_LEN];
    dir_of(path, dir, sizeof dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return gp_error_set(GP_ERR_IO, "%s '%s' is a directory; give a file name (such as "
                                "'%s/out')", what, path, path);
        if (replaced) {
            /* Written beside it and renamed over it: the directory must
             * take a new file, and a device or pipe would be replaced. */
            if (!S_ISREG(sb.st_mode))
                return gp_error_set(GP_ERR_IO, "%s '%s' exists and is not a regular file (it "
                                    "would be replaced); give a file path", what, path);
            const char *base = strrchr(path, '/');
            snprintf(probe, sizeof probe, "%s/.%s.probe.%ld", dir, base ? base + 1 : path,
                     (long)getpid());
            int e = probe_create(probe);
            if (e)
                return gp_error_set(GP_ERR_IO, "%s '%s': cannot create a file in '%s': %s; give "
                                    "a path in a directory you can write", what, path, dir,
                                    strerror(e));
            return GP_OK;
        }
        /* Written in place: opening it for writing without O_TRUNC changes
         * nothing; a FIFO without a reader (ENXIO) will have one later. */
        int fd = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY);
        if (fd < 0 && errno != ENXIO)
            return gp_error_set(GP_ERR_IO, "%s '%s' cannot be written: %s; give a path you can "
                                "write", what, path, strerror(errno));
        if (fd >= 0) close(fd);
        return GP_OK;
    }
    int e = errno;
    if (e == ENOENT) {
        struct stat db;
        if (stat(dir, &db) != 0 || !S_ISDIR(db.st_mode))
            return gp_error_set(GP_ERR_IO, "%s '%s': the directory '%s' does not exist; create "
                                "it first, or give a path in an existing directory", what, path,
                                dir);
        e = probe_create(path);
        if (!e) return GP_OK;
    }
    return gp_error_set(GP_ERR_IO, "%s '%s' cannot be written: %s; give a path in a directory "
                        "you can write", what, path, strerror(e));
}

gp_status gp_check_writable_dir(const char *dir, const char *what)
{
    if (!dir || !*dir)
        return gp_error_set(GP_ERR_INVALID, "%s: the path is empty; give a directory", what);
    char p[PATH_LEN], probe[PATH_LEN + 64];
    size_t n = strlen(dir);
    if (n >= GP_PATH_MAX_OUT)
        return gp_error_set(GP_ERR_INVALID, "%s: path too long (%zu bytes; gpipe writes paths of "
                            "up to %d): '%.80s...'; give a shorter one", what, n,
                            GP_PATH_MAX_OUT - 1, dir);
    memcpy(p, dir, n + 1);
    while (n > 1 && p[n - 1] == '/') p[--n] = '\0';

    /* The directories made here (their lengths in p), removed at the end. */
    size_t made[64];
    int n_made = 0;
    gp_status s = GP_OK;
    struct stat sb;
    if (stat(p, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return gp_error_set(GP_ERR_IO, "%s '%s' is a file, not a directory; give a "
                                "directory (it is made if missing)", what, dir);
    } else if (errno != ENOENT) {
        return gp_error_set(GP_ERR_IO, "%s '%s' cannot be used: %s; give a directory you can "
                            "write", what, dir, strerror(errno));
    } else {
        /* Make each missing component, as the writer will (mkdir -p). */
        for (size_t i = 1; i <= n && s == GP_OK; i++) {
            if (p[i] != '/' && p[i] != '\0') continue;
            char c = p[i];
            p[i] = '\0';
            if (n_made == (int)(sizeof made / sizeof *made)) {
                s = gp_error_set(GP_ERR_INVALID, "%s '%s': more than %d directories to make",
                                 what, dir, n_made);
            } else if (mkdir(p, 0755) == 0) {
                made[n_made++] = i;
            } else if (errno != EEXIST) {
                s = gp_error_set(GP_ERR_IO, "%s '%s': cannot create '%s': %s; give a directory "
                                 "you can write", what, dir, p, strerror(errno));
            } else if (stat(p, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
                s = gp_error_set(GP_ERR_IO, "%s '%s': '%s' is a file, not a directory; give "
                                 "another directory", what, dir, p);
            }
            p[i] = c;
        }
    }
    if (s == GP_OK) {
        snprintf(probe, sizeof probe, "%s/.gpipe-probe.%ld", p, (long)getpid());
        int e = probe_create(probe);
        if (e)
            s = gp_error_set(GP_ERR_IO, "%s '%s': cannot create a file in it: %s; give a "
                             "directory you can write", what, dir, strerror(e));
    }
    /* Innermost first; the run makes them again when it writes there. */
    for (int k = n_made - 1; k >= 0; k--) {
        char c = p[made[k]];
        p[made[k]] = '\0';
        rmdir(p);
        p[made[k]] = c;
    }
    return s;
}

gp_status gp_make_dirs(const char *dir, const char *what)
{
    char p[PATH_LEN];
    if (strlen(dir) >= sizeof p)
        return gp_error_set(GP_ERR_INVALID, "%s: path too long: '%.80s'", what, dir);
    snprintf(p, sizeof p, "%s", dir);
    for (char *q = p + 1; *q; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) break;
        *q = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        return gp_error_set(GP_ERR_IO, "cannot create the %s '%s': %s", what, dir, strerror(e));
    }
    return GP_OK;
}

int gp_open_regular(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

FILE *gp_fopen_regular(const char *path)
{
    int fd = gp_open_regular(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

int gp_read_regular(const char *path, size_t max, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    int fd = gp_open_regular(path);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if ((uint64_t)st.st_size > (uint64_t)max) {
        close(fd);
        return 1;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *b = malloc(cap);
    if (!b) {
        close(fd);
        errno = ENOMEM;
        return -1;
    }
    while (n + 1 < cap) { /* a file that grows while read stops at its size */
        ssize_t got = read(fd, b + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int e = errno;
            close(fd);
            free(b);
            errno = e;
            return -1;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    b[n] = '\0';
    *text = b;
    *len = n;
    return 0;
}

static gp_status env_value(const char *name, bool bytes, int64_t def, int64_t lo, int64_t hi,
                           int64_t *out)
{
    const char *v = getenv(name);
    *out = def;
    if (!v || !*v) return GP_OK;
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    bool ok = end != v && errno == 0 && (*v == '-' || (*v >= '0' && *v <= '9'));
    int64_t unit = 1;
    if (ok && bytes && *end) {
        static const struct { const char *s; int64_t u; } units[] = {
            {"B", 1}, {"kB", 1000}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000},
            {"KiB", 1024}, {"MiB", 1 << 20}, {"GiB", 1 << 30}};
        unit = 0;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (!strcmp(end, units[i].s)) unit = units[i].u;
        ok = unit > 0;
        end += strlen(end);
    }
    if (ok && *end) ok = false;
    if (ok && unit > 1 && (n > INT64_MAX / unit || n < INT64_MIN / unit)) ok = false;
    if (ok) n *= unit;
    if (!ok || n < lo || n > hi)
        return gp_error_set(GP_ERR_INVALID, "environment variable %s='%s': not %s from %lld to "
                            "%lld; unset it, or give one%s", name, v,
                            bytes ? "a number of bytes" : "a whole number", (long long)lo,
                            (long long)hi, bytes ? " (a unit may follow: kB, MB, GB, KiB, MiB, "
                                                   "GiB)" : "");
    *out = n;
    return GP_OK;
}

gp_status gp_env_int(const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    return env_value(name, false, def, lo, hi, out);
}

gp_status gp_env_bytes(const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    return env_value(name, true, def, lo, hi, out);
}

/* The GPIPE_* variables whose values are words (lo > hi: `words` lists
 * them, "|" between) or numbers in [lo, hi] (bytes: a unit may follow),
 * each where its feature is documented (docs/configs.md, "Environment variables"). */
static const struct env_rule {
    const char *name, *words;
    int64_t lo, hi;
    bool bytes;
} env_rules[] = {
    {"GPIPE_LOG", "debug|info|warn|error|quiet", 1, 0, false},
    {"GPIPE_BALANCE", "flops|time", 1, 0, false},
    {"GPIPE_MEMORY_CHECK", "0|1", 1, 0, false},
    {"GPIPE_CPU_CONV", "auto|plain|blocked", 1, 0, false},
    {"GPIPE_CPU_ISA", "sse41|avx2|avx512|avx512_bf16|amx|native", 1, 0, false},
    {"GPIPE_CPU_STREAMS", "sync|threads", 1, 0, false},
    {"GPIPE_CPU_KEEP_WEIGHTS", "0|1", 1, 0, false},
    {"GPIPE_CPU_KEEP_BLOCKS", "0|1|nhwc", 1, 0, false},
    {"GPIPE_ATTN_WIDTH", "8|16", 1, 0, false},
    {"GPIPE_CHECK_MIRRORS", "0|1", 1, 0, false},
    {"GPIPE_LOG_LAUNCHES", "0|1", 1, 0, false},
    {"GPIPE_FUSE_RELU", "0|1", 1, 0, false},
    {"GPIPE_FUSE_ADD_NORM", "0|1", 1, 0, false},
    {"GPIPE_FUSE_GELU", "0|1", 1, 0, false},
    {"GPIPE_FUSE_LOSS", "0|1", 1, 0, false},
    {"GPIPE_CUBLASLT", "0|1", 1, 0, false},
    {"GPIPE_CUDNN_LEGACY", "0|1", 1, 0, false},
    {"GPIPE_CUDNN_GRAPH", "auto|force", 1, 0, false},
    {"GPIPE_CUDNN_SDPA", "0|1", 1, 0, false},
    {"GPIPE_CUDA_NHWC", "0|1|chains", 1, 0, false},
    {"GPIPE_PROCS_CHANNELS", "0|1", 1, 0, false},
    {"GPIPE_PROCS_STAGE", "0|1", 1, 0, false},
    {"GPIPE_CPU_COPY_DELAY_US", NULL, 0, 1000000, false},
    {"GPIPE_CPU_FAKE_SEARCH", NULL, 0, 1 << 20, false},
    {"GPIPE_TEST_FAIL_STEP", NULL, -1, INT64_MAX, false},
    {"GPIPE_SNAPSHOT_SLOW_WRITE_MS", NULL, 0, 3600000, false},
    {"GPIPE_SNAPSHOT_SLOW_COPY_MS", NULL, 0, 3600000, false},
    {"GPIPE_HF_SHARD_BYTES", NULL, 1, (int64_t)1 << 50, true},
};

gp_status gp_env_check(void)
{
    for (size_t i = 0; i < sizeof env_rules / sizeof env_rules[0]; i++) {
        const struct env_rule *r = &env_rules[i];
        const char *v = getenv(r->name);
        if (!v || !*v) continue;
        if (!r->words) {
            int64_t x;
            GP_TRY(env_value(r->name, r->bytes, 0, r->lo, r->hi, &x));
            continue;
        }
        bool ok = false;
        for (const char *w = r->words; *w && !ok;) {
            size_t n = strcspn(w, "|");
            ok = strlen(v) == n && !strncmp(v, w, n);
            w += n + (w[n] == '|');
        }
        if (!ok) {
            char list[160];
            size_t at = 0;
            for (const char *c = r->words; *c && at + 3 < sizeof list; c++) {
                if (*c == '|') list[at++] = ',', list[at++] = ' ';
                else list[at++] = *c;
            }
            list[at] = '\0';
            return gp_error_set(GP_ERR_INVALID, "environment variable %s='%s': not one of %s; "
                                "unset it, or give one of them (docs/configs.md, \"Environment "
                                "variables\")", r->name, v, list);
        }
    }
    return GP_OK;
}

const char *gp_open_strerror(int e)
{
    return e == EINVAL ? "not a regular file (a folder, a FIFO or a device)" : strerror(e);
}

bool gp_path_in_dir(const char *path, const char *dir)
{
    char d[PATH_LEN];
    dir_of(path, d, sizeof d);
    struct stat a, b;
    return stat(d, &a) == 0 && stat(dir, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* path as its directory's resolved name and its last component: the same
 * for every spelling of a file that need not exist ("run.jsonl",
 * "./run.jsonl", "d/../run.jsonl"); false when the directory does not
 * exist or the last component is not a file name. */
static bool resolved_name(const char *path, char *out, size_t len)
{
    char dir[PATH_LEN], real[PATH_MAX], link[PATH_LEN], next[2 * PATH_LEN];
    if (strlen(path) >= PATH_LEN) return false;
    /* a dangling symbolic link: writing it creates its target, so the
     * name is the target's (relative to the link's directory), followed
     * as far as the kernel would (40 links) */
    for (int hops = 0; hops < 40; hops++) {
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) break;
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k <= 0) return false;
        link[k] = '\0';
        if (link[0] == '/') {
            snprintf(next, sizeof next, "%s", link);
        } else {
            dir_of(path, dir, sizeof dir);
            snprintf(next, sizeof next, "%s/%s", dir, link);
        }
        if (strlen(next) >= PATH_LEN) return false;
        path = next; /* (read above before next was written: dir and link are copies) */
    }
    dir_of(path, dir, sizeof dir);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, "..") || !realpath(dir, real))
        return false;
    snprintf(out, len, "%s/%s", strcmp(real, "/") ? real : "", base);
    return true;
}

/* A file a model folder is made of, by its name. */
static bool folder_member(const char *path)
{
    const char *slash = strrchr(path, '/'), *b = slash ? slash + 1 : path;
    size_t n = strlen(b);
    static const char *const tails[] = {".safetensors", ".index.json"};
    if (!strcmp(b, "config.json") || !strcmp(b, "generation_config.json")) return true;
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        size_t t = strlen(tails[i]);
        if (n > t && !strcmp(b + n - t, tails[i])) return true;
    }
    return false;
}

static bool is_dir_path(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Whether the existing file `f` is (a hard link of) a member of folder dir. */
static bool linked_member(const char *f, const char *dir)
{
    struct stat fs;
    if (stat(f, &fs) != 0 || !S_ISREG(fs.st_mode)) return false;
    DIR *d = opendir(dir);
    if (!d) return false;
    bool hit = false;
    struct dirent *e;
    while (!hit && (e = readdir(d)) != NULL) {
        char p[PATH_LEN];
        if (!folder_member(e->d_name) ||
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p)
            continue;
        struct stat ms;
        hit = stat(p, &ms) == 0 && ms.st_dev == fs.st_dev && ms.st_ino == fs.st_ino;
    }
    closedir(d);
    return hit;
}

/* A file a Hugging Face export writes or removes in its folder, by name
 * (hf_llama.c's export_file): config.json, generation_config.json, the
 * index, model.safetensors or a model-NNNNN-of-NNNNN shard.  Other files
 * in an output folder (snapshots beside a TensorBoard log, say) are never
 * touched. */
bool gp_hf_export_name(const char *path)
{
    const char *slash = strrchr(path, '/'), *b = slash ? slash + 1 : path;
    int x, y;
    char tail[32];
    return !strcmp(b, "config.json") || !strcmp(b, "generation_config.json") ||
           !strcmp(b, "model.safetensors") || !strcmp(b, "model.safetensors.index.json") ||
           (sscanf(b, "model-%5d-of-%5d%31s", &x, &y, tail) == 3 &&
            !strcmp(tail, ".safetensors"));
}

bool gp_path_overlaps(const char *out, const char *in)
{
    if (!out || !in || !out[0] || !in[0]) return false;
    if (!strcmp(out, in) || gp_same_file(out, in)) return true;
    if (is_dir_path(in) &&
        ((folder_member(out) && gp_path_in_dir(out, in)) || linked_member(out, in)))
        return true;
    if (is_dir_path(out) && gp_hf_export_name(in) && gp_path_in_dir(in, out)) return true;
    return false;
}

bool gp_path_below(const char *path, const char *dir)
{
    char rp[PATH_MAX], rd[PATH_MAX];
    struct stat st;
    if (!path || !dir || !path[0] || !dir[0] || stat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
        !realpath(path, rp) || !realpath(dir, rd))
        return false;
    size_t n = strlen(rd);
    if (!strcmp(rp, rd)) return true; /* dir names the file itself */
    if (n == 1) return true;          /* "/": everything is below it */
    return !strncmp(rp, rd, n) && rp[n] == '/';
}

bool gp_same_file(const char *a, const char *b)
{
    if (!a || !b || !a[0] || !b[0]) return false;
    struct stat x, y;
    bool ea = stat(a, &x) == 0, eb = stat(b, &y) == 0;
    if (ea && eb) return x.st_dev == y.st_dev && x.st_ino == y.st_ino;
    if (ea != eb) return false; /* one exists, the other does not */
    char ra[PATH_LEN + PATH_MAX], rb[PATH_LEN + PATH_MAX];
    return resolved_name(a, ra, sizeof ra) && resolved_name(b, rb, sizeof rb) && !strcmp(ra, rb);
}

/* ---- files written whole or not at all (gp_atomic_*) ---------------------- */

const char *gp_write_advice(int e, char *buf, size_t len)
{
    struct rlimit rl;
    switch (e) {
    case ENOSPC:
    case EDQUOT:
        snprintf(buf, len, ": the disk or the quota is full; free space there, or write "
                 "elsewhere");
        break;
    case EFBIG:
        snprintf(buf, len, ": the file is larger than this process may write (a file-size "
                 "limit: ulimit -f)");
        break;
    case EMFILE:
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
            snprintf(buf, len, ": this process has open all the %llu files it may (ulimit -n); "
                     "raise that limit", (unsigned long long)rl.rlim_cur);
        else
            snprintf(buf, len, ": this process has open all the files it may (ulimit -n); "
                     "raise that limit");
        break;
    case ENFILE:
        snprintf(buf, len, ": the system has open all the files it may (fs.file-max); close "
                 "other programs' files or raise that limit");
        break;
    case EROFS: snprintf(buf, len, ": a read-only file system; write elsewhere"); break;
    case EACCES:
    case EPERM:
    case ENOENT:
    case ENOTDIR:
        snprintf(buf, len, "; check that the directory exists and is writable");
        break;
    default: buf[0] = '\0';
    }
    return buf;
}

gp_status gp_atomic_open(const char *path, gp_atomic_file *a)
{
    memset(a, 0, sizeof *a);
    const char *slash = strrchr(path, '/');
    if (strlen(path) >= sizeof a->path)
        return gp_error_set(GP_ERR_INVALID, "path too long: '%.80s...'", path);
    snprintf(a->path, sizeof a->path, "%s", path);
    if (slash) {
        snprintf(a->dir, sizeof a->dir, "%.*s", (int)(slash - path) + (slash == path), path);
        snprintf(a->tmp, sizeof a->tmp, "%.*s/.%s.tmp.%ld", (int)(slash - path), path,
                 slash + 1, (long)getpid());
    } else {
        snprintf(a->dir, sizeof a->dir, ".");
        snprintf(a->tmp, sizeof a->tmp, ".%s.tmp.%ld", path, (long)getpid());
    }
    int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0 && !(a->f = fdopen(fd, "wb"))) {
        a->err = errno;
        close(fd);
        unlink(a->tmp);
    } else if (fd < 0) {
        a->err = errno;
    }
    if (a->f) return GP_OK;
    char why[200];
    gp_status s = gp_error_set(GP_ERR_IO, "cannot create '%s' (to be renamed '%s'): %s%s",
                               a->tmp, path, strerror(a->err),
                               gp_write_advice(a->err, why, sizeof why));
    errno = a->err;
    return s;
}

void gp_atomic_abort(gp_atomic_file *a)
{
    if (!a->f) return;
    fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
}

gp_status gp_atomic_commit(gp_atomic_file *a, int err)
{
    GP_ASSERT(a->f);
    int e = err;
    if (!e && ferror(a->f)) e = EIO;
    if (!e && fflush(a->f) != 0) e = errno;
    if (!e && fsync(fileno(a->f)) != 0) e = errno;
    if (fclose(a->f) != 0 && !e) e = errno;
    a->f = NULL;
    if (!e && rename(a->tmp, a->path) != 0) {
        e = errno;
        unlink(a->tmp);
        char why[200];
        gp_status s = gp_error_set(GP_ERR_IO, "cannot rename '%s' to '%s': %s%s", a->tmp,
                                   a->path, strerror(e), gp_write_advice(e, why, sizeof why));
        a->err = errno = e;
        return s;
    }
    if (e) {
        unlink(a->tmp);
        bool existed = access(a->path, F_OK) == 0;
        char why[200];
        gp_status s = gp_error_set(GP_ERR_IO, "writing '%s' failed: %s; %s '%s'%s", a->tmp,
                                   strerror(e), existed ? "nothing replaced" : "no file written as",
                                   a->path, gp_write_advice(e, why, sizeof why));
        a->err = errno = e;
        return s;
    }
    int dfd = open(a->dir, O_RDONLY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd); /* the rename itself is durable from here */
        close(dfd);
    }
    return GP_OK;
}
