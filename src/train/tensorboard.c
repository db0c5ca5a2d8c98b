/*
 * tensorboard.c — TensorBoard event files from the metrics records
 * (tensorboard.h says what is written and under which names).
 */
#include "train/tensorboard.h"
#include "core/json.h"
#ifdef GPIPE_HAVE_TENSORBOARD
#include "tensorboard.pb-c.h" /* generated from tensorboard.proto by protoc-c */
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EVENTS_PREFIX "events.out.tfevents."

struct gp_tboard {
    int fd;             /* the event file this run writes (O_APPEND) */
    off_t size;         /* its length after the last whole record */
    char path[1200];
};

/* ---- TFRecord framing --------------------------------------------------- */

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven:
 * zlib has only the CRC32 of zip. */
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c(const uint8_t *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
    uint32_t c = 0xFFFFFFFFu;
    while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t gp_tboard_masked_crc(const void *data, size_t len)
{
    uint32_t c = crc32c(data, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

#ifndef GPIPE_HAVE_TENSORBOARD
/* Built without protobuf-c (GPIPE_TENSORBOARD, CMakeLists.txt): the rest
 * of gpipe is whole, and --tensorboard says what is missing. */
gp_status gp_tboard_open(const char *dir, const char *what, int64_t resume_step,
                         bool drop_evals, const char *lost, gp_tboard **out)
{
    (void)dir, (void)resume_step, (void)drop_evals, (void)lost;
    *out = NULL;
    return gp_error_set(GP_ERR_UNSUPPORTED,
                        "%s: this gpipe was built without TensorBoard event files (protobuf-c "
                        "was missing): install libprotobuf-c-dev and protobuf-c-compiler "
                        "(scripts/install-deps.sh) and build again, or leave %s out (--metrics "
                        "writes the same numbers)", what, what);
}

gp_status gp_tboard_record(gp_tboard *tb, const char *json, size_t len)
{
    (void)tb, (void)json, (void)len;
    return gp_error_set(GP_ERR_UNSUPPORTED, "no TensorBoard event file is open");
}

gp_status gp_tboard_close(gp_tboard *tb)
{
    (void)tb;
    return GP_OK;
}
#else

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The Event framed as one TFRecord, appended whole or cut back off. */
static gp_status write_event(gp_tboard *tb, const Tensorboard__Event *ev)
{
    size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *rec = malloc(n + 16);
    if (!rec) return gp_error_set(GP_ERR_OOM, "TensorBoard event file '%s': out of host memory",
                                  tb->path);
    put_le(rec, n, 8);
    put_le(rec + 8, gp_tboard_masked_crc(rec, 8), 4);
    tensorboard__event__pack(ev, rec + 12);
    put_le(rec + 12 + n, gp_tboard_masked_crc(rec + 12, n), 4);
    size_t done = 0;
    errno = 0;
    while (done < n + 16) {
        ssize_t k = write(tb->fd, rec + done, n + 16 - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        done += (size_t)k;
    }
    free(rec);
    if (done == n + 16) {
        tb->size += (off_t)done;
        return GP_OK;
    }
    int err = errno ? errno : EIO;
    bool cut = ftruncate(tb->fd, tb->size) == 0;
    return gp_error_set(GP_ERR_IO, "writing TensorBoard event file '%s' failed: %s%s", tb->path,
                        strerror(err), cut ? " (cut back to its last whole record)"
                                           : "; its last record is torn (a resumed run drops it)");
}

static double wall_time(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- metrics record -> scalars ------------------------------------------ */

typedef struct scalars {
    Tensorboard__Summary__Value *v; /* n of them, cap room */
    Tensorboard__Summary__Value **pv;
    int n, cap;
    bool oom;
} scalars;

static void add(scalars *s, const char *tag, const gp_json_value *x)
{
    if (x->kind != GP_JSON_NUMBER && x->kind != GP_JSON_NULL) return; /* names, flags */
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 32;
        Tensorboard__Summary__Value *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) {
            s->oom = true;
            return;
        }
        s->v = v;
        s->cap = cap;
    }
    char *t = strdup(tag);
    if (!t) {
        s->oom = true;
        return;
    }
    Tensorboard__Summary__Value *v = &s->v[s->n++];
    tensorboard__summary__value__init(v);
    v->tag = t;
    v->value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v->simple_value = x->kind == GP_JSON_NULL ? NAN : (float)x->num;
}

/* The tag of a top-level key (tensorboard.h's table). */
static void top_tag(const char *key, bool eval, char *tag, size_t cap)
{
    static const char *const names[][2] = {
        {"loss", "train/loss"}, {"accuracy", "train/accuracy"},
        {"grad_norm", "train/grad_norm"}, {"samples_per_s", "throughput/samples_per_s"},
        {"step_seconds", "time/step_seconds"}, {"data_wait_seconds", "time/data_wait_seconds"},
        {"allreduce_seconds", "time/allreduce_seconds"}, {"bad_files", "data/bad_files"},
        {"bubble", "pipeline/bubble"}, {"pipeline_seconds", "time/pipeline_seconds"}};
    if (eval) { /* an evaluation's every value is test/...: its epoch is not the step's */
        snprintf(tag, cap, "test/%s", strncmp(key, "test_", 5) ? key : key + 5);
        return;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(key, names[i][0])) {
            snprintf(tag, cap, "%s", names[i][1]);
            return;
        }
    snprintf(tag, cap, "%s", key);
}

static void device_scalars(scalars *s, const gp_json_value *devs)
{
    for (int j = 0; devs && devs->kind == GP_JSON_ARRAY && j < devs->n; j++) {
        const gp_json_value *d = &devs->items[j];
        const gp_json_value *nm = gp_json_get(d, "name");
        char name[256];
        snprintf(name, sizeof name, "%s", nm && nm->kind == GP_JSON_STRING ? nm->str : "device");
        for (int q = 0; q < j; q++) { /* two devices of one name: kept apart by index */
            const gp_json_value *o = gp_json_get(&devs->items[q], "name");
            if (o && o->kind == GP_JSON_STRING && !strcmp(o->str, name)) {
                snprintf(name, sizeof name, "%s_%d", nm->str, j);
                break;
            }
        }
        for (int k = 0; d->kind == GP_JSON_OBJECT && k < d->n; k++) {
            char tag[400];
            if (!strcmp(d->keys[k], "host_waits") || !strcmp(d->keys[k], "launches"))
                snprintf(tag, sizeof tag, "%s/%s", d->keys[k], name);
            else if (!strcmp(d->keys[k], "busy_seconds") || !strcmp(d->keys[k], "idle_seconds"))
                snprintf(tag, sizeof tag, "pipeline/%s/%s", name, d->keys[k]);
            else
                snprintf(tag, sizeof tag, "memory/%s/%s", name, d->keys[k]);
            add(s, tag, &d->items[k]);
        }
    }
}

gp_status gp_tboard_record(gp_tboard *tb, const char *json, size_t len)
{
    gp_json_reader r;
    gp_json_value *rec = gp_json_parse(json, len, &r);
    const gp_json_value *step = rec ? gp_json_get(rec, "step") : NULL;
    if (!rec || rec->kind != GP_JSON_OBJECT || !step || step->kind != GP_JSON_NUMBER) {
        gp_json_value_free(rec);
        return gp_error_set(GP_ERR_INVALID, "TensorBoard event file '%s': not a metrics record "
                            "(%s)", tb->path, r.err[0] ? r.err : "no step");
    }
    const gp_json_value *ev = gp_json_get(rec, "eval");
    bool eval = ev && ev->kind == GP_JSON_TRUE;
    scalars s = {0};
    for (int k = 0; k < rec->n; k++) {
        const char *key = rec->keys[k];
        if (!strcmp(key, "step")) continue;
        if (!strcmp(key, "devices")) {
            device_scalars(&s, &rec->items[k]);
            continue;
        }
        char tag[300];
        top_tag(key, eval, tag, sizeof tag);
        add(&s, tag, &rec->items[k]);
    }
    gp_status st = GP_OK;
    s.pv = s.oom ? NULL : malloc((size_t)(s.n ? s.n : 1) * sizeof *s.pv);
    if (!s.pv) {
        st = gp_error_set(GP_ERR_OOM, "TensorBoard event file '%s': out of host memory",
                          tb->path);
    } else {
        for (int i = 0; i < s.n; i++) s.pv[i] = &s.v[i];
        Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
        sum.n_value = (size_t)s.n;
        sum.value = s.pv;
        Tensorboard__Event e = TENSORBOARD__EVENT__INIT;
        e.wall_time = wall_time();
        e.step = (int64_t)step->num;
        e.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
        e.summary = &sum;
        st = write_event(tb, &e);
    }
    for (int i = 0; i < s.n; i++) free(s.v[i].tag);
    free(s.v);
    free(s.pv);
    gp_json_value_free(rec);
    return st;
}

/* ---- resuming: the files cut back to the snapshot's step ------------------ */

/* The record at f's position: true with its step, whether it holds a
 * summary and whether that is an evaluation's (its values are test/...);
 * false at the end, or at a record torn or damaged (a kill while it was
 * written).  *buf (cap bytes) grows to hold it. */
static bool read_record(FILE *f, uint8_t **buf, size_t *cap, int64_t *step, bool *summary,
                        bool *eval, size_t *len)
{
    uint8_t head[12], tail[4];
    if (fread(head, 1, 12, f) != 12 || get_le(head + 8, 4) != gp_tboard_masked_crc(head, 8))
        return false;
    uint64_t n = get_le(head, 8);
    if (n > (1u << 30)) return false; /* (no Event of ours is near that) */
    if (n > *cap) {
        uint8_t *b = realloc(*buf, (size_t)n);
        if (!b) return false;
        *buf = b;
        *cap = (size_t)n;
    }
    if (fread(*buf, 1, (size_t)n, f) != n || fread(tail, 1, 4, f) != 4 ||
        get_le(tail, 4) != gp_tboard_masked_crc(*buf, (size_t)n))
        return false;
    Tensorboard__Event *e = tensorboard__event__unpack(NULL, (size_t)n, *buf);
    if (!e) return false;
    *step = e->step;
    *summary = e->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY;
    *eval = *summary && e->summary->n_value > 0 &&
            !strncmp(e->summary->value[0]->tag, "test/", 5);
    tensorboard__event__free_unpacked(e, NULL);
    *len = (size_t)n + 16;
    return true;
}

/* One event file cut back (tensorboard.h); *has_step: it holds a step
 * record of `step`. */
static gp_status cut_back(const char *path, int64_t step, bool drop_evals, bool *has_step)
{
    FILE *f = gp_fopen_regular(path); /* (a FIFO there would block) */
    if (f) {
        uint8_t *buf = NULL;
        size_t cap = 0, len;
        off_t at = 0;
        int64_t st;
        bool summary, eval;
        while (read_record(f, &buf, &cap, &st, &summary, &eval, &len)) {
            if (summary && (st > step || (st == step && eval && drop_evals))) break;
            *has_step |= summary && !eval && st == step;
            at += (off_t)len;
        }
        free(buf);
        bool ok = !ferror(f);
        fclose(f);
        struct stat sb;
        errno = 0;
        if (ok && stat(path, &sb) == 0 && (sb.st_size == at || truncate(path, at) == 0))
            return GP_OK;
    }
    int err = errno ? errno : EIO;
    return gp_error_set(GP_ERR_IO, "TensorBoard event file '%s': cannot cut it back to the "
                        "snapshot's step %lld: %s; make it readable and writable, or move it "
                        "out of the directory", path, (long long)step, strerror(err));
}

/* Every event file in dir: removed (resume_step < 0) or cut back. */
static gp_status old_files(const char *dir, const char *what, int64_t resume_step,
                           bool drop_evals, bool *has_step)
{
    DIR *d = opendir(dir);
    if (!d)
        return gp_error_set(GP_ERR_IO, "%s %s: cannot list it: %s", what, dir, strerror(errno));
    gp_status s = GP_OK;
    struct dirent *e;
    while (s == GP_OK && (e = readdir(d))) {
        if (strncmp(e->d_name, EVENTS_PREFIX, strlen(EVENTS_PREFIX))) continue;
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (resume_step >= 0)
            s = cut_back(path, resume_step, drop_evals, has_step);
        else if (unlink(path) != 0)
            s = gp_error_set(GP_ERR_IO, "%s %s: cannot remove the earlier run's event file %s: "
                             "%s; remove it, or give another directory", what, dir, e->d_name,
                             strerror(errno));
    }
    closedir(d);
    return s;
}

gp_status gp_tboard_open(const char *dir, const char *what, int64_t resume_step,
                         bool drop_evals, const char *lost, gp_tboard **out)
{
    *out = NULL;
    GP_TRY(gp_make_dirs(dir, what));
    bool has_step = false;
    GP_TRY(old_files(dir, what, resume_step, drop_evals, &has_step));
    gp_tboard *tb = calloc(1, sizeof *tb);
    if (!tb) return gp_error_set(GP_ERR_OOM, "%s: out of host memory", what);
    /* TensorBoard reads a directory's files in the order of their names:
     * the time first, then a count that keeps this file after any other
     * made in the same second */
    char host[64] = "localhost";
    gethostname(host, sizeof host - 1);
    for (int k = 0; k < 1000; k++) {
        snprintf(tb->path, sizeof tb->path, "%s/" EVENTS_PREFIX "%010lld.%s.%d.%03d", dir,
                 (long long)time(NULL), host, (int)getpid(), k);
        tb->fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (tb->fd >= 0 || errno != EEXIST) break;
    }
    if (tb->fd < 0) {
        gp_status s = gp_error_set(GP_ERR_IO, "%s: cannot create TensorBoard event file %s: "
                                   "%s; check that %s is writable", what, tb->path,
                                   strerror(errno), dir);
        free(tb);
        return s;
    }
    Tensorboard__Event e = TENSORBOARD__EVENT__INIT;
    e.wall_time = wall_time();
    e.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    e.file_version = "brain.Event:2";
    gp_status s = write_event(tb, &e);
    /* the record of the snapshot's step that the metrics file or this
     * directory could not take, kept by the snapshot (its step only) */
    const char *ls = lost ? strstr(lost, "\"step\":") : NULL;
    if (s == GP_OK && ls && !has_step && resume_step >= 0 &&
        strtoll(ls + 7, NULL, 10) == resume_step)
        s = gp_tboard_record(tb, lost, strlen(lost));
    if (s != GP_OK) {
        (void)gp_tboard_close(tb);
        return s;
    }
    *out = tb;
    return GP_OK;
}

gp_status gp_tboard_close(gp_tboard *tb)
{
    if (!tb) return GP_OK;
    gp_status s = GP_OK;
    if (close(tb->fd) != 0)
        s = gp_error_set(GP_ERR_IO, "writing TensorBoard event file '%s' failed: %s", tb->path,
                         strerror(errno));
    free(tb);
    return s;
}
#endif /* GPIPE_HAVE_TENSORBOARD */
