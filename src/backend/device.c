/*
 * device.c — device names, opening devices, and the wrappers layers call
 * (accounting, fallbacks for optional interface slots).
 *
 * Backend registration: the CUDA backend is built only when CMake found
 * the toolkit, cuDNN and NCCL (cmake/cuda.cmake), which then defines
 * GPIPE_CUDA for this file alone.  It is a plugin, libgpipe-cuda.so, that
 * this file loads (dlopen) when a cuda: device is first opened: the CUDA
 * libraries it links (about 1 GB of address space, cuBLASLt alone 540 MB)
 * are then mapped only by runs that use a GPU, so a CPU run starts under
 * a `ulimit -v` of a few hundred MB.  The plugin calls back into the
 * program's gpipe (the library's INTERFACE link option --export-dynamic).
 */
#include "backend/backend.h"
#include "backend/elementwise.h"

#include <stdlib.h>
#include <string.h>
#ifdef GPIPE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#endif

gp_status gp_device_parse(const char *spec, gp_device_kind *kind, int *index)
{
    const char *rest;
    if (!strncmp(spec, "cpu", 3)) {
        *kind = GP_DEV_CPU;
        rest = spec + 3;
    } else if (!strncmp(spec, "cuda", 4)) {
        *kind = GP_DEV_CUDA;
        rest = spec + 4;
    } else {
        return gp_error_set(GP_ERR_INVALID,
                            "unknown device '%s': devices are named cpu:N or cuda:N", spec);
    }
    if (*rest == '\0') {
        *index = 0;
        return GP_OK;
    }
    if (*rest != ':' || rest[1] == '\0')
        return gp_error_set(GP_ERR_INVALID, "malformed device '%s': expected %s:N",
                            spec, *kind == GP_DEV_CPU ? "cpu" : "cuda");
    char *end;
    long v = strtol(rest + 1, &end, 10);
    if (*end != '\0' || v < 0 || v > 4095)
        return gp_error_set(GP_ERR_INVALID,
                            "malformed device '%s': the index after ':' must be 0..4095", spec);
    *index = (int)v;
    return GP_OK;
}

void gp_device_format(gp_device_kind kind, int index, char *out, size_t len)
{
    snprintf(out, len, "%s:%d", kind == GP_DEV_CPU ? "cpu" : "cuda", index);
}

#ifdef GPIPE_CUDA
/* The CUDA plugin, loaded once (`once`) by the first cuda: device or
 * communicator: its two entry points, or why it did not load.  Never
 * unloaded (the CUDA libraries do not support it). */
static struct {
    pthread_once_t once;
    gp_status (*device_create)(int, const gp_device_opts *, gp_device **);
    gp_status (*comm_create)(gp_device **, int, gp_comm **);
    char why[2048];
} cuda_plugin = {.once = PTHREAD_ONCE_INIT};

/* dlopen one candidate path; false with its error appended to why. */
static bool cuda_try(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const char *err = NULL;
    if (h) {
        /* (a function pointer from dlsym's void *, as POSIX allows) */
        void *create = dlsym(h, "gp_cuda_device_create"), *comm = dlsym(h, "gp_cuda_comm_create");
        memcpy(&cuda_plugin.device_create, &create, sizeof create);
        memcpy(&cuda_plugin.comm_create, &comm, sizeof comm);
        if (create && comm) return true;
        err = "it lacks gp_cuda_device_create or gp_cuda_comm_create";
    } else {
        err = dlerror();
    }
    size_t n = strlen(cuda_plugin.why);
    snprintf(cuda_plugin.why + n, sizeof cuda_plugin.why - n, "%s%s: %s", n ? "; " : "", path,
             err ? err : "cannot be loaded");
    cuda_plugin.device_create = NULL;
    cuda_plugin.comm_create = NULL;
    return false;
}

/* $GPIPE_CUDA_PLUGIN when set; else the first that exists of: beside the
 * program (the build's tools), one folder up (the build's tests/), in
 * <libdir>/gpipe beside the program's bin/ (an install moved elsewhere),
 * and where it was to be installed. */
static void cuda_load(void)
{
    const char *env = getenv("GPIPE_CUDA_PLUGIN");
    if (env && *env) {
        (void)cuda_try(env);
        return;
    }
    char exe[PATH_MAX], p[PATH_MAX + 128];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = NULL;
    if (n > 0) {
        exe[n] = '\0';
        slash = strrchr(exe, '/');
    }
    if (slash) {
        *slash = '\0';
        static const char *const near[] = {"/", "/../", "/../" GPIPE_CUDA_PLUGIN_LIBDIR "/gpipe/"};
        for (size_t i = 0; i < sizeof near / sizeof *near; i++) {
            snprintf(p, sizeof p, "%s%s" GPIPE_CUDA_PLUGIN_NAME, exe, near[i]);
            if (access(p, F_OK) == 0) {
                (void)cuda_try(p);
                return;
            }
        }
    }
    (void)cuda_try(GPIPE_CUDA_PLUGIN_INSTALLED);
}

/* The plugin's entry points, or an error for device `spec`. */
static gp_status cuda_plugin_ready(const char *spec)
{
    pthread_once(&cuda_plugin.once, cuda_load);
    if (cuda_plugin.device_create) return GP_OK;
    return gp_error_set(GP_ERR_UNSUPPORTED,
                        "device '%s': cannot load the CUDA backend (%s); a cuda: device needs "
                        "the CUDA libraries, which take about 1 GB of address space (check "
                        "`ulimit -v`), and the plugin where it was built or installed (or "
                        "named by GPIPE_CUDA_PLUGIN); cpu:N devices need neither",
                        spec, cuda_plugin.why);
}
#endif

gp_status gp_device_open(const char *spec, const gp_device_opts *opts, gp_device **out)
{
    gp_device_kind kind = GP_DEV_CPU;
    int index = 0;
    GP_TRY(gp_device_parse(spec, &kind, &index));
    gp_device_opts def = {0};
    if (!opts) opts = &def;
    if (kind == GP_DEV_CPU) return gp_cpu_device_create(index, opts, out);
#ifdef GPIPE_CUDA
    *out = NULL;
    GP_TRY(cuda_plugin_ready(spec));
    return cuda_plugin.device_create(index, opts, out);
#else
    return gp_error_set(GP_ERR_UNSUPPORTED,
                        "device '%s': this gpipe was built without the CUDA backend; "
                        "use cpu:N devices or rebuild with -DGPIPE_CUDA=ON on a machine "
                        "with the CUDA toolkit", spec);
#endif
}

gp_status gp_device_new(const gp_device_iface *iface, gp_device_kind kind, int index,
                        const gp_device_opts *opts, gp_device **out)
{
    *out = NULL;
    char name[32];
    gp_device_format(kind, index, name, sizeof name);
    if (iface->version != GP_DEVICE_IFACE_VERSION)
        return gp_error_set(GP_ERR_UNSUPPORTED,
                            "device %s: the %s backend implements device interface version "
                            "%d, but this gpipe needs version %d; rebuild the backend "
                            "against this gpipe's src/backend/backend.h",
                            name, iface->backend_name ? iface->backend_name : "(unnamed)",
                            iface->version, GP_DEVICE_IFACE_VERSION);
    gp_device *dev = calloc(1, sizeof *dev);
    if (!dev) return gp_error_set(GP_ERR_OOM, "out of host memory creating device %s", name);
    dev->iface = iface;
    dev->kind = kind;
    dev->index = index;
    snprintf(dev->name, sizeof dev->name, "%s", name);
    dev->threads = 1;
    gp_allocator_init(&dev->alloc, dev->name, opts ? opts->capacity : 0);
    pthread_mutex_init(&dev->mirrors_lock, NULL);
    const char *logl = getenv("GPIPE_LOG_LAUNCHES");
    dev->log_launches = logl && *logl && strcmp(logl, "0") != 0;
    const char *check = getenv("GPIPE_CHECK_MIRRORS");
    dev->check_mirrors = check && *check && strcmp(check, "0") != 0;
    *out = dev;
    return GP_OK;
}

void gp_device_close(gp_device *dev)
{
    if (!dev) return;
    gp_dev_mirrors_drop(dev, NULL, 0); /* the backend frees their memory */
    dev->iface->destroy(dev);
    free(dev->mirrors);
    pthread_mutex_destroy(&dev->mirrors_lock);
    free(dev->bn_held);
    if (dev->alloc.live_blocks != 0)
        GP_DEBUG("device %s closed with %lld allocations still live", dev->name,
                 (long long)dev->alloc.live_blocks);
    gp_allocator_destroy(&dev->alloc);
    free(dev);
}

void gp_device_bind_thread(gp_device *dev)
{
    if (dev->iface->bind_thread) dev->iface->bind_thread(dev);
}

void gp_dev_log_launch(gp_device *dev, const char *slot)
{
    fprintf(stderr, "launch %s %s\n", dev->name, slot);
}

gp_status gp_dev_freeze_weights(gp_device *dev, bool frozen)
{
    if (dev->weights_frozen == frozen) return GP_OK;
    dev->weights_frozen = frozen;
    dev->weights_epoch++;
    if (!frozen && dev->on_weights_thaw) return dev->on_weights_thaw(dev);
    return GP_OK;
}

gp_status gp_dev_alloc(gp_device *dev, size_t bytes, gp_mem_category cat, void **out)
{
    *out = NULL;
    GP_TRY(gp_allocator_reserve(&dev->alloc, bytes, cat));
    gp_status s = dev->iface->alloc(dev, bytes, cat, out);
    if (s != GP_OK) {
        gp_allocator_release(&dev->alloc, bytes, cat);
        return s;
    }
    gp_allocator_commit(&dev->alloc, cat);
    return GP_OK;
}

void gp_dev_free(gp_device *dev, void *ptr, size_t bytes, gp_mem_category cat)
{
    if (!ptr) return;
    if (cat == GP_MEM_PARAMS && __atomic_load_n(&dev->n_mirrors, __ATOMIC_ACQUIRE))
        gp_dev_mirrors_drop(dev, ptr, bytes); /* a later tensor there is another */
    dev->iface->free(dev, ptr, bytes);
    gp_allocator_release(&dev->alloc, bytes, cat);
}

/* ---- weight mirrors (gp_wmirror) ------------------------------------------- */

static bool overlaps(const gp_wmirror *m, const void *p, size_t bytes)
{
    const char *a = (const char *)m->w, *b = p;
    return !p || (b < a + (size_t)m->n * sizeof(float) && a < b + bytes);
}

void gp_dev_mirrors_drop(gp_device *dev, const void *p, size_t bytes)
{
    pthread_mutex_lock(&dev->mirrors_lock);
    int k = 0;
    for (int i = 0; i < dev->n_mirrors; i++) {
        gp_wmirror *m = &dev->mirrors[i];
        if (overlaps(m, p, bytes))
            gp_dev_free(dev, m->copy, (size_t)m->n * sizeof(uint16_t), GP_MEM_WORKSPACE);
        else
            dev->mirrors[k++] = *m;
    }
    __atomic_store_n(&dev->n_mirrors, k, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&dev->mirrors_lock);
}

void gp_dev_mirrors_stale(gp_device *dev, const void *p, size_t bytes)
{
    pthread_mutex_lock(&dev->mirrors_lock);
    for (int i = 0; i < dev->n_mirrors; i++)
        if (overlaps(&dev->mirrors[i], p, bytes)) dev->mirrors[i].epoch = GP_WMIRROR_STALE;
    pthread_mutex_unlock(&dev->mirrors_lock);
}

/* GPIPE_CHECK_MIRRORS: whether copy, the mirror of the n weights at w, is
 * their rounding now. */
static gp_status mirror_check(gp_device *dev, const float *w, int64_t n, const uint16_t *copy,
                              bool by_update)
{
    size_t bytes = (size_t)n * sizeof(uint16_t);
    void *fresh = NULL;
    uint16_t *a = malloc(bytes), *b = malloc(bytes);
    gp_status st = a && b ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory");
    if (st == GP_OK) st = gp_dev_alloc(dev, bytes, GP_MEM_WORKSPACE, &fresh);
    /* through the slots, not the counting wrappers: a check is not a step's */
    if (st == GP_OK) st = GP_LAUNCH(dev, bf16_pack)(dev, fresh, w, n);
    if (st == GP_OK) st = dev->iface->synchronize(dev); /* (the pack, and the update before) */
    if (st == GP_OK) st = dev->iface->copy_d2h(dev, a, fresh, bytes);
    if (st == GP_OK) st = dev->iface->copy_d2h(dev, b, copy, bytes);
    if (st == GP_OK) st = dev->iface->synchronize(dev);
    if (st == GP_OK && memcmp(a, b, bytes) != 0) {
        int64_t i = 0;
        while (a[i] == b[i]) i++;
        st = gp_error_set(GP_ERR_RUNTIME,
                          "device %s: the bf16 mirror of a weight tensor of %lld values (%s) "
                          "is not its FP32 master's rounding (value %lld: 0x%04x, master "
                          "rounds to 0x%04x): something wrote the weights without "
                          "gp_dev_weights_written (GPIPE_CHECK_MIRRORS)",
                          dev->name, (long long)n,
                          by_update ? "written by the update" : "made earlier in this freeze",
                          (long long)i, b[i], a[i]);
    }
    gp_dev_free(dev, fresh, bytes, GP_MEM_WORKSPACE);
    free(a);
    free(b);
    return st;
}

/* The index of the mirror of (w, n) in the table, kept sorted by (w, n),
 * or -1 - where it would go.  Under mirrors_lock. */
static int mirror_find(const gp_device *dev, const float *w, int64_t n)
{
    int lo = 0, hi = dev->n_mirrors;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        const gp_wmirror *m = &dev->mirrors[mid];
        if (m->w == w && m->n == n) return mid;
        if ((uintptr_t)m->w < (uintptr_t)w || (m->w == w && m->n < n)) lo = mid + 1;
        else hi = mid;
    }
    return -1 - lo;
}

/* A new mirror of (w, n) at index at (mirror_find's), stale; false where
 * there is no room for it (converted per call then).  Under mirrors_lock. */
static bool mirror_add(gp_device *dev, int at, const float *w, int64_t n)
{
    if (dev->n_mirrors == dev->cap_mirrors) {
        int cap = dev->cap_mirrors ? 2 * dev->cap_mirrors : 64;
        gp_wmirror *grown = realloc(dev->mirrors, (size_t)cap * sizeof *grown);
        if (!grown) return false;
        dev->mirrors = grown;
        dev->cap_mirrors = cap;
    }
    void *copy = NULL;
    if (gp_dev_alloc(dev, (size_t)n * sizeof(uint16_t), GP_MEM_WORKSPACE, &copy) != GP_OK) {
        gp_error_clear();
        return false;
    }
    memmove(&dev->mirrors[at + 1], &dev->mirrors[at],
            (size_t)(dev->n_mirrors - at) * sizeof *dev->mirrors);
    dev->mirrors[at] = (gp_wmirror){.w = w, .n = n, .copy = copy, .epoch = GP_WMIRROR_STALE};
    __atomic_store_n(&dev->n_mirrors, dev->n_mirrors + 1, __ATOMIC_RELEASE);
    return true;
}

gp_status gp_dev_mirror_get(gp_device *dev, const float *w, int64_t n, uint16_t **copy,
                            bool *current)
{
    *copy = NULL;
    *current = false;
    if (!dev->weights_frozen || dev->alloc.capacity != 0 || n <= 0 || !dev->iface->bf16_pack)
        return GP_OK;
    bool by_update = false;
    pthread_mutex_lock(&dev->mirrors_lock);
    int at = mirror_find(dev, w, n);
    if (at < 0 && mirror_add(dev, -1 - at, w, n)) at = -1 - at;
    if (at >= 0) {
        const gp_wmirror *m = &dev->mirrors[at];
        *copy = m->copy; /* (the buffer stays until w's free, whatever the table does) */
        *current = m->epoch == dev->weights_epoch;
        by_update = *current && m->by_update;
    }
    pthread_mutex_unlock(&dev->mirrors_lock);
    if (by_update) dev->mirrors_by_update++;
    if (*current && dev->check_mirrors) GP_TRY(mirror_check(dev, w, n, *copy, by_update));
    return GP_OK;
}

void gp_dev_mirror_made(gp_device *dev, const float *w, int64_t n)
{
    pthread_mutex_lock(&dev->mirrors_lock);
    int at = mirror_find(dev, w, n);
    if (at >= 0) {
        dev->mirrors[at].epoch = dev->weights_epoch;
        dev->mirrors[at].by_update = false;
    }
    pthread_mutex_unlock(&dev->mirrors_lock);
    dev->weights_kept++;
}

uint16_t *gp_dev_mirror_for_update(gp_device *dev, const float *w, int64_t n)
{
    if (!__atomic_load_n(&dev->n_mirrors, __ATOMIC_ACQUIRE)) return NULL;
    if (dev->weights_frozen) { /* (no executor updates frozen weights: stale, to be sure) */
        gp_dev_mirrors_stale(dev, w, (size_t)n * sizeof(float));
        return NULL;
    }
    uint16_t *copy = NULL;
    pthread_mutex_lock(&dev->mirrors_lock);
    int at = mirror_find(dev, w, n);
    if (at >= 0) {
        gp_wmirror *m = &dev->mirrors[at];
        m->epoch = dev->weights_epoch + 1; /* the next freeze's */
        m->by_update = true;
        copy = m->copy;
    }
    pthread_mutex_unlock(&dev->mirrors_lock);
    return copy;
}

gp_status gp_dev_upload(gp_device *dev, float *dst, const float *src, int64_t n)
{
    gp_dev_weights_written(dev, dst, (size_t)n * sizeof(float));
    gp_dev_count_wait(dev); /* returns once the host source has been read */
    return dev->iface->copy_h2d(dev, dst, src, (size_t)n * sizeof(float));
}

gp_status gp_dev_download(gp_device *dev, float *dst, const float *src, int64_t n)
{
    gp_dev_count_wait(dev);
    return dev->iface->copy_d2h(dev, dst, src, (size_t)n * sizeof(float));
}

gp_status gp_dev_nonfinite_or(gp_device *dev, const float *x, int64_t n, float *flag)
{
    if (n <= 0) return GP_OK;
    if (dev->iface->nonfinite_or) return GP_LAUNCH(dev, nonfinite_or)(dev, x, n, flag);
    int bad = 0;
    GP_TRY(gp_dev_nonfinite(dev, x, n, &bad));
    return bad ? gp_dev_fill(dev, flag, 1.0f, 1) : GP_OK;
}

int gp_box_collapse(const int64_t ds[4], const int64_t ss[4], const int64_t dims[4],
                    int64_t ods[4], int64_t oss[4], int64_t odims[4])
{
    for (int q = 0; q < 4; q++) {
        ods[q] = ds[q], oss[q] = ss[q], odims[q] = dims[q];
        if (dims[q] <= 0) return 0;
    }
    /* from the innermost axis out: (dim, dst stride, src stride) */
    int64_t cd[4], cs[4], cn[4];
    int k = 0;
    for (int q = 3; q >= 0; q--) {
        if (dims[q] == 1) continue;
        if (k > 0 && ds[q] == cd[k - 1] * cn[k - 1] && ss[q] == cs[k - 1] * cn[k - 1]) {
            cn[k - 1] *= dims[q];
            continue;
        }
        cd[k] = ds[q], cs[k] = ss[q], cn[k] = dims[q];
        k++;
    }
    if (k == 0) { /* one element */
        cd[0] = 1, cs[0] = 1, cn[0] = 1;
        k = 1;
    }
    for (int q = 0; q < 4; q++) {
        int from = 3 - q; /* slot q holds axis `from` counted from the inside */
        bool axis = from < k;
        odims[q] = axis ? cn[from] : 1;
        ods[q] = axis ? cd[from] : 0;
        oss[q] = axis ? cs[from] : 0;
    }
    return k;
}

uint64_t gp_dev_mem_total(gp_device *dev)
{
    uint64_t b = 0;
    if (!dev || !dev->iface->mem_total || dev->iface->mem_total(dev, &b) != GP_OK) return 0;
    return b;
}

/* zero_many in batches of GP_NONFINITE_BATCH (empty tensors skipped), or
 * a fill each without the slot; every tensor's mirrors marked, as a
 * fill's. */
gp_status gp_dev_zero_many(gp_device *dev, float *const *xs, const int64_t *ns, int count)
{
    float *bx[GP_NONFINITE_BATCH];
    int64_t bn[GP_NONFINITE_BATCH];
    int k = 0;
    for (int i = 0; i < count; i++) {
        if (ns[i] <= 0) continue;
        if (!dev->iface->zero_many) {
            GP_TRY(gp_dev_fill(dev, xs[i], 0.0f, ns[i]));
            continue;
        }
        gp_dev_weights_written(dev, xs[i], (size_t)ns[i] * sizeof(float));
        bx[k] = xs[i];
        bn[k++] = ns[i];
        if (k == GP_NONFINITE_BATCH) {
            GP_TRY(GP_LAUNCH(dev, zero_many)(dev, bx, bn, k));
            k = 0;
        }
    }
    return k ? GP_LAUNCH(dev, zero_many)(dev, bx, bn, k) : GP_OK;
}

gp_status gp_dev_nonfinite_or_many(gp_device *dev, const float *const *xs, const int64_t *ns,
                                   int count, float *flag)
{
    if (!dev->iface->nonfinite_or_many) {
        for (int i = 0; i < count; i++) GP_TRY(gp_dev_nonfinite_or(dev, xs[i], ns[i], flag));
        return GP_OK;
    }
    const float *bx[GP_NONFINITE_BATCH];
    int64_t bn[GP_NONFINITE_BATCH];
    int k = 0;
    for (int i = 0; i < count; i++) {
        if (ns[i] <= 0) continue;
        bx[k] = xs[i];
        bn[k++] = ns[i];
        if (k == GP_NONFINITE_BATCH) {
            GP_TRY(GP_LAUNCH(dev, nonfinite_or_many)(dev, bx, bn, k, flag));
            k = 0;
        }
    }
    return k ? GP_LAUNCH(dev, nonfinite_or_many)(dev, bx, bn, k, flag) : GP_OK;
}

gp_status gp_dev_upload_async(gp_device *dev, float *dst, const float *src, int64_t n,
                              void *done)
{
    gp_dev_weights_written(dev, dst, (size_t)n * sizeof(float));
    if (dev->iface->upload_async)
        return dev->iface->upload_async(dev, dst, src, (size_t)n * sizeof(float), done);
    if (n > 0) GP_TRY(gp_dev_upload(dev, dst, src, n));
    return done ? gp_dev_event_record(dev, done) : GP_OK;
}

const char *gp_precision_name(gp_precision p)
{
    static const char *const names[] = {"fp32", "tf32", "bf16"};
    return p >= 0 && p <= GP_PRECISION_BF16 ? names[p] : "?";
}

gp_status gp_dev_dropout_apply(gp_device *dev, const float *x, float *y, int64_t n, float p,
                               uint64_t seed, uint64_t stream, uint64_t first)
{
    if (n <= 0) return GP_OK;
    if (dev->iface->dropout_apply)
        return GP_LAUNCH(dev, dropout_apply)(dev, x, y, n, p, seed, stream, first);
    void *mask = NULL;
    size_t bytes = (size_t)n * sizeof(float);
    GP_TRY(gp_dev_alloc(dev, bytes, GP_MEM_WORKSPACE, &mask));
    gp_status s = gp_dev_dropout_mask(dev, mask, n, p, seed, stream, first);
    if (s == GP_OK) s = gp_dev_mul(dev, x, mask, y, n);
    gp_dev_free(dev, mask, bytes, GP_MEM_WORKSPACE);
    return s;
}

gp_status gp_dev_bf16_pack(gp_device *dev, uint16_t *dst, const float *src, int64_t n)
{
    if (n <= 0) return GP_OK;
    if (!dev->iface->bf16_pack)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s (%s backend) has no bf16 conversion",
                            dev->name, dev->iface->backend_name);
    __atomic_fetch_add(&dev->bf16_conversions, 1, __ATOMIC_RELAXED);
    return GP_LAUNCH(dev, bf16_pack)(dev, dst, src, n);
}

gp_status gp_dev_bf16_unpack(gp_device *dev, float *dst, const uint16_t *src, int64_t n)
{
    if (n <= 0) return GP_OK;
    gp_dev_weights_written(dev, dst, (size_t)n * sizeof(float));
    if (!dev->iface->bf16_unpack)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s (%s backend) has no bf16 conversion",
                            dev->name, dev->iface->backend_name);
    __atomic_fetch_add(&dev->bf16_conversions, 1, __ATOMIC_RELAXED);
    return GP_LAUNCH(dev, bf16_unpack)(dev, dst, src, n);
}

static bool algo_fits(const gp_algo_cand *c, size_t limit, bool deterministic)
{
    return c->ok && c->memory <= limit && (!deterministic || c->deterministic);
}

int gp_algo_pick(const gp_algo_cand *c, int n, size_t limit, bool deterministic)
{
    int first = -1, fastest = -1;
    for (int i = 0; i < n; i++) {
        if (!algo_fits(&c[i], limit, deterministic)) continue;
        if (first < 0) first = i;
        if (c[i].time_ms >= 0 && (fastest < 0 || c[i].time_ms < c[fastest].time_ms)) fastest = i;
    }
    if (deterministic || fastest < 0) return first;
    /* within the slack of the fastest, the least workspace (backend.h) */
    const double within = (double)c[fastest].time_ms * (1.0 + GP_ALGO_SLACK);
    int pick = fastest;
    for (int i = 0; i < n; i++) {
        if (!algo_fits(&c[i], limit, false) || c[i].time_ms < 0 || c[i].time_ms > within)
            continue;
        if (c[i].memory < c[pick].memory ||
            (c[i].memory == c[pick].memory && c[i].time_ms < c[pick].time_ms))
            pick = i;
    }
    return pick;
}

bool gp_dev_has_chans(const gp_device *dev)
{
    return dev->chans && dev->iface->chan_open && dev->iface->chan_send &&
           dev->iface->chan_recv && dev->iface->chan_close;
}

gp_status gp_dev_chan_id(gp_device *dev, void *id, size_t *bytes)
{
    *bytes = 0;
    return dev->iface->chan_id ? dev->iface->chan_id(dev, id, bytes) : GP_OK;
}

gp_status gp_dev_chan_open(gp_device *dev, const gp_chan_desc *d, void **out)
{
    *out = NULL;
    if (!gp_dev_has_chans(dev))
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s has no channels to other processes",
                            dev->name);
    return dev->iface->chan_open(dev, d, out);
}

gp_status gp_dev_chan_send(gp_device *dev, void *ch, const float *buf, int64_t n, void *after,
                           void *done)
{
    return dev->iface->chan_send(dev, ch, buf, n, after, done);
}

gp_status gp_dev_event_query(gp_device *dev, void *ev, bool *done)
{
    *done = true;
    if (!ev) return GP_OK;
    if (dev->iface->event_query) return dev->iface->event_query(dev, ev, done);
    return gp_dev_event_sync(dev, ev);
}

gp_status gp_dev_chan_recv(gp_device *dev, void *ch, float *buf, int64_t n, void *done)
{
    gp_dev_weights_written(dev, buf, (size_t)n * sizeof(float));
    return dev->iface->chan_recv(dev, ch, buf, n, done);
}

void gp_dev_chan_close(gp_device *dev, void *ch, bool abort)
{
    if (ch) dev->iface->chan_close(dev, ch, abort);
}

/* The fallbacks of bn_merge and bn_commit: the accumulator and the
 * statistics to the host and back (host waits, counted). */
typedef struct {
    double *mean_acc, *m2_acc;
    float *a, *b;
} bn_host;

static gp_status bn_host_get(gp_device *dev, int64_t c, const double *mean_acc,
                             const double *m2_acc, const float *a, const float *b, bn_host *h)
{
    size_t nd = (size_t)c * sizeof(double), nf = (size_t)c * sizeof(float);
    h->mean_acc = malloc(nd);
    h->m2_acc = malloc(nd);
    h->a = malloc(nf);
    h->b = malloc(nf);
    if (!h->mean_acc || !h->m2_acc || !h->a || !h->b)
        return gp_error_set(GP_ERR_OOM, "out of host memory for batch-norm statistics");
    gp_dev_count_wait(dev);
    GP_TRY(dev->iface->copy_d2h(dev, h->mean_acc, mean_acc, nd));
    GP_TRY(dev->iface->copy_d2h(dev, h->m2_acc, m2_acc, nd));
    GP_TRY(dev->iface->copy_d2h(dev, h->a, a, nf));
    return dev->iface->copy_d2h(dev, h->b, b, nf);
}

/* The accumulator back to the device, and a and b where they are not
 * NULL (the running statistics). */
static gp_status bn_host_put(gp_device *dev, int64_t c, const bn_host *h, double *mean_acc,
                             double *m2_acc, float *a, float *b)
{
    size_t nd = (size_t)c * sizeof(double), nf = (size_t)c * sizeof(float);
    gp_dev_count_wait(dev);
    gp_status s = a ? dev->iface->copy_h2d(dev, a, h->a, nf) : GP_OK;
    if (s == GP_OK && b) s = dev->iface->copy_h2d(dev, b, h->b, nf);
    if (s == GP_OK) s = dev->iface->copy_h2d(dev, mean_acc, h->mean_acc, nd);
    if (s == GP_OK) s = dev->iface->copy_h2d(dev, m2_acc, h->m2_acc, nd);
    return s;
}

static void bn_host_free(bn_host *h)
{
    free(h->mean_acc);
    free(h->m2_acc);
    free(h->a);
    free(h->b);
}

gp_status gp_dev_bn_merge(gp_device *dev, int64_t c, double *mean_acc, double *m2_acc,
                          double na, double nb, const float *mean, const float *var)
{
    if (c <= 0 || nb <= 0) return GP_OK;
    if (dev->iface->bn_merge)
        return GP_LAUNCH(dev, bn_merge)(dev, c, mean_acc, m2_acc, na, nb, mean, var);
    bn_host h;
    gp_status s = bn_host_get(dev, c, mean_acc, m2_acc, mean, var, &h);
    if (s == GP_OK) {
        for (int64_t k = 0; k < c; k++)
            gp_ew_bn_merge(&h.mean_acc[k], &h.m2_acc[k], na, nb, h.a[k], h.b[k]);
        s = bn_host_put(dev, c, &h, mean_acc, m2_acc, NULL, NULL);
    }
    bn_host_free(&h);
    return s;
}

/* One commit as the device's slots run it (or on the host without them):
 * its pending slots merged and the running statistics updated, in one
 * bn_commit_multi call where the backend has one, else a bn_merge per
 * slot and a bn_commit. */
/* p's pending slots merged into its accumulator one bn_merge each, in
 * slot order, slot q of nb[q] values (nb NULL: of p's runs); *na from p's
 * na to the total. */
static gp_status merge_pending(gp_device *dev, const gp_bn_commit_part *p, const double *nb,
                               double *na)
{
    *na = p->na;
    for (int q = 0; q < p->n_pend; q++) {
        const float *slot = p->pend + 2 * p->c * (int64_t)q;
        double b = nb ? nb[q] : q < p->n_hi ? p->nb_hi : p->nb_lo;
        GP_TRY(gp_dev_bn_merge(dev, p->c, p->mean_acc, p->m2_acc, *na, b, slot, slot + p->c));
        *na += b;
    }
    return GP_OK;
}

static gp_status bn_commit_now(gp_device *dev, const gp_bn_commit_part *p)
{
    if (p->n_pend > 0 && dev->iface->bn_commit_multi) {
        dev->bn_commit_calls++;
        return GP_LAUNCH(dev, bn_commit_multi)(dev, p, 1);
    }
    double na;
    GP_TRY(merge_pending(dev, p, NULL, &na));
    dev->bn_commit_calls++;
    if (dev->iface->bn_commit)
        return GP_LAUNCH(dev, bn_commit)(dev, p->c, p->rmean, p->rvar, p->mean_acc, p->m2_acc,
                                         p->momentum, p->count);
    bn_host h;
    gp_status s = bn_host_get(dev, p->c, p->mean_acc, p->m2_acc, p->rmean, p->rvar, &h);
    if (s == GP_OK) {
        for (int64_t k = 0; k < p->c; k++)
            gp_ew_bn_commit(&h.a[k], &h.b[k], &h.mean_acc[k], &h.m2_acc[k], p->momentum,
                            p->count);
        s = bn_host_put(dev, p->c, &h, p->mean_acc, p->m2_acc, p->rmean, p->rvar);
    }
    bn_host_free(&h);
    return s;
}

gp_status gp_dev_bn_commit_part(gp_device *dev, const gp_bn_commit_part *p)
{
    if (p->c <= 0) return GP_OK;
    if (p->count < 2)
        return gp_error_set(GP_ERR_INVALID, "device %s: batch-norm statistics of %g value(s) "
                            "per channel have no unbiased variance", dev->name, p->count);
    int n_lo = p->n_pend - p->n_hi;
    if (p->n_pend < 0 || p->n_hi < 0 || n_lo < 0 || (p->n_pend > 0 && !p->pend) ||
        p->na + p->n_hi * p->nb_hi + n_lo * p->nb_lo != p->count)
        return gp_error_set(GP_ERR_INVALID, "device %s: a batch-norm commit of %g values per "
                            "channel whose %d pending micro-batch(es) (%d of %g, %d of %g) and "
                            "%g merged values do not add up to it", dev->name, p->count,
                            p->n_pend, p->n_hi, p->nb_hi, n_lo, p->nb_lo, p->na);
    if (!dev->bn_holding) return bn_commit_now(dev, p);
    if (dev->n_bn_held == dev->cap_bn_held) {
        int cap = dev->cap_bn_held ? 2 * dev->cap_bn_held : 64;
        gp_bn_commit_part *grown = realloc(dev->bn_held, (size_t)cap * sizeof *grown);
        if (!grown) return gp_error_set(GP_ERR_OOM, "out of host memory for batch-norm commits");
        dev->bn_held = grown;
        dev->cap_bn_held = cap;
    }
    dev->bn_held[dev->n_bn_held++] = *p;
    return GP_OK;
}

/* Slot counts nb[0..n) as runs: n_hi of nb_hi, then the rest of nb_lo;
 * false where they are not two runs. */
static bool nb_runs(const double *nb, int n, int *n_hi, double *nb_hi, double *nb_lo)
{
    int k = 0;
    *nb_hi = n ? nb[0] : 0;
    while (k < n && nb[k] == *nb_hi) k++;
    *n_hi = k;
    *nb_lo = k < n ? nb[k] : 0;
    for (int q = k; q < n; q++)
        if (nb[q] != *nb_lo) return false;
    return true;
}

gp_status gp_dev_bn_commit_slots(gp_device *dev, gp_bn_commit_part p, const double *nb)
{
    double kept = 0;
    for (int q = 0; q < p.n_pend; q++) kept += nb[q];
    p.count = p.na + kept;
    if (nb_runs(nb, p.n_pend, &p.n_hi, &p.nb_hi, &p.nb_lo)) return gp_dev_bn_commit_part(dev, &p);
    GP_TRY(merge_pending(dev, &p, nb, &p.na));
    p.pend = NULL;
    p.n_pend = p.n_hi = 0;
    p.nb_hi = p.nb_lo = 0;
    return gp_dev_bn_commit_part(dev, &p);
}

gp_status gp_dev_bn_commit(gp_device *dev, int64_t c, float *rmean, float *rvar,
                           double *mean_acc, double *m2_acc, double momentum, double count)
{
    gp_bn_commit_part p = {.c = c, .rmean = rmean, .rvar = rvar, .mean_acc = mean_acc,
                           .m2_acc = m2_acc, .momentum = momentum, .count = count, .na = count};
    return gp_dev_bn_commit_part(dev, &p);
}

gp_status gp_dev_bn_commit_begin(gp_device *dev)
{
    if (dev->bn_holding)
        return gp_error_set(GP_ERR_INVALID, "device %s: batch-norm commits already held "
                            "(gp_dev_bn_commit_begin twice)", dev->name);
    dev->bn_holding = true;
    dev->n_bn_held = 0;
    return GP_OK;
}

gp_status gp_dev_bn_commit_end(gp_device *dev)
{
    int n = dev->n_bn_held;
    dev->bn_holding = false;
    dev->n_bn_held = 0;
    if (n == 0) return GP_OK;
    if (dev->iface->bn_commit_multi) {
        dev->bn_commit_calls++;
        return GP_LAUNCH(dev, bn_commit_multi)(dev, dev->bn_held, n);
    }
    for (int i = 0; i < n; i++) GP_TRY(bn_commit_now(dev, &dev->bn_held[i]));
    return GP_OK;
}

/* The fallback of xent_dev and bce_logits_dev: the host-returning slot,
 * then the result uploaded. */
static gp_status loss_result_up(gp_device *dev, gp_loss_result *out, double loss, int64_t correct,
                                int64_t bad)
{
    gp_loss_result r = {.loss_sum = bad >= 0 ? 0.0 : loss, .correct = bad >= 0 ? 0 : correct,
                        .bad = bad};
    gp_dev_count_wait(dev);
    return dev->iface->copy_h2d(dev, out, &r, sizeof r);
}

gp_status gp_dev_xent_dev_ld(gp_device *dev, const float *logits, const float *labels,
                             int64_t rows, int64_t cols, int64_t ld, float scale,
                             float smoothing, float *dlogits, gp_loss_result *out)
{
    if (dev->iface->xent_dev && rows > 0)
        return GP_LAUNCH(dev, xent_dev)(dev, logits, labels, rows, cols, ld, scale, smoothing,
                                    dlogits, out);
    double loss = 0.0;
    int64_t correct = 0, bad = -1;
    if (rows > 0)
        GP_TRY(gp_dev_xent_ld(dev, logits, labels, rows, cols, ld, scale, smoothing, dlogits,
                              &loss, &correct, &bad));
    return loss_result_up(dev, out, loss, correct, bad);
}

gp_status gp_dev_bce_logits_dev(gp_device *dev, const float *z, const float *t, int64_t n,
                                float scale, float *dz, gp_loss_result *out)
{
    if (dev->iface->bce_logits_dev && n > 0)
        return GP_LAUNCH(dev, bce_logits_dev)(dev, z, t, n, scale, dz, out);
    double loss = 0.0;
    int64_t correct = 0, bad = -1;
    GP_TRY(gp_dev_bce_logits(dev, z, t, n, scale, dz, &loss, &correct, &bad));
    return loss_result_up(dev, out, loss, correct, bad);
}

gp_status gp_comm_create(gp_device **devs, int n, gp_comm **out)
{
    *out = NULL;
    if (n <= 0) return gp_error_set(GP_ERR_INVALID, "a communicator needs at least one device");
    for (int r = 1; r < n; r++)
        if (devs[r]->kind != devs[0]->kind)
            return gp_error_set(GP_ERR_UNSUPPORTED,
                                "communicator over %s and %s: every device of a group must "
                                "use the same backend", devs[0]->name, devs[r]->name);
#ifdef GPIPE_CUDA
    if (devs[0]->kind == GP_DEV_CUDA) { /* (a cuda device exists: the plugin is loaded) */
        GP_TRY(cuda_plugin_ready(devs[0]->name));
        return cuda_plugin.comm_create(devs, n, out);
    }
#endif
    if (devs[0]->kind == GP_DEV_CPU) return gp_cpu_comm_create(devs, n, out);
    return gp_error_set(GP_ERR_UNSUPPORTED,
                        "device %s: the %s backend has no collectives (all-reduce, "
                        "broadcast)",
                        devs[0]->name, devs[0]->iface->backend_name);
}

void gp_comm_destroy(gp_comm *comm)
{
    if (comm) comm->destroy(comm);
}

/* The error of a collective whose optional slot the backend leaves NULL. */
static gp_status no_collective(const gp_device *dev, const char *what)
{
    return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: the %s backend has no %s yet", dev->name,
                        dev->iface->backend_name, what);
}

gp_status gp_dev_allreduce(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    gp_dev_weights_written(dev, buf, (size_t)n * sizeof(float));
    if (comm && comm->ops) return comm->ops->allreduce(comm, dev, buf, n);
    if (!dev->iface->allreduce) return no_collective(dev, "all-reduce");
    return dev->iface->allreduce(dev, comm, buf, n);
}

gp_status gp_dev_broadcast(gp_device *dev, gp_comm *comm, float *buf, int64_t n, int root)
{
    gp_dev_weights_written(dev, buf, (size_t)n * sizeof(float));
    if (comm && comm->ops) return comm->ops->broadcast(comm, dev, buf, n, root);
    if (!dev->iface->broadcast) return no_collective(dev, "broadcast");
    return dev->iface->broadcast(dev, comm, buf, n, root);
}

bool gp_dev_can_shard(const gp_device *dev)
{
    return dev->iface->reduce_scatter && dev->iface->all_gather;
}

gp_status gp_dev_reduce_scatter(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    gp_dev_weights_written(dev, buf, (size_t)n * sizeof(float));
    if (comm && comm->ops) return comm->ops->reduce_scatter(comm, dev, buf, n);
    if (!dev->iface->reduce_scatter) return no_collective(dev, "reduce-scatter");
    return dev->iface->reduce_scatter(dev, comm, buf, n);
}

gp_status gp_dev_all_gather(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    gp_dev_weights_written(dev, buf, (size_t)n * sizeof(float));
    if (comm && comm->ops) return comm->ops->all_gather(comm, dev, buf, n);
    if (!dev->iface->all_gather) return no_collective(dev, "all-gather");
    return dev->iface->all_gather(dev, comm, buf, n);
}

/* A composed sharded update's first half: g summed over the replicas with
 * this rank's chunk [lo, hi) left in place (the update of that chunk and
 * the all-gather of w follow). */
static gp_status shard_grads(gp_device *dev, gp_comm *comm, float *g, int64_t n, int64_t *lo,
                             int64_t *hi)
{
    int rank = gp_comm_rank(comm, dev);
    if (rank < 0)
        return gp_error_set(GP_ERR_INVALID, "device %s is not in this communicator", dev->name);
    GP_TRY(gp_dev_reduce_scatter(dev, comm, g, n));
    gp_comm_chunk(n, comm->n, rank, lo, hi);
    return GP_OK;
}

gp_status gp_dev_sharded_sgd(gp_device *dev, gp_comm *comm, float *w, float *g, float *v,
                             int64_t n, float lr, float mu, float wd, int nesterov)
{
    gp_dev_weights_written(dev, w, (size_t)n * sizeof(float)); /* (the update leaves no mirror) */
    if (dev->iface->sharded_sgd && !(comm && comm->ops))
        return dev->iface->sharded_sgd(dev, comm, w, g, v, n, lr, mu, wd, nesterov);
    int64_t lo = 0, hi = 0;
    GP_TRY(shard_grads(dev, comm, g, n, &lo, &hi));
    if (hi > lo)
        GP_TRY(gp_dev_sgd_update(dev, w + lo, g + lo, v, hi - lo, lr, mu, wd, nesterov));
    return gp_dev_all_gather(dev, comm, w, n);
}

gp_status gp_dev_sharded_adam(gp_device *dev, gp_comm *comm, float *w, float *g, float *m,
                              float *v, int64_t n, float wd, const gp_adam_step *a)
{
    gp_dev_weights_written(dev, w, (size_t)n * sizeof(float));
    int64_t lo = 0, hi = 0;
    GP_TRY(shard_grads(dev, comm, g, n, &lo, &hi));
    if (hi > lo) {
        gp_update_part part = {.w = w + lo, .g = g + lo, .v = m, .v2 = v,
                               .n = hi - lo, .wd = wd};
        GP_TRY(gp_dev_adam_multi(dev, &part, 1, a));
    }
    return gp_dev_all_gather(dev, comm, w, n);
}

gp_status gp_dev_barrier(gp_device *dev, gp_comm *comm)
{
    if (comm && comm->ops) return comm->ops->barrier(comm, dev);
    if (dev->iface->barrier) return dev->iface->barrier(dev, comm);
    /* A collective every rank must join, then waited for on the host. */
    float *one;
    GP_TRY(gp_dev_alloc(dev, sizeof *one, GP_MEM_WORKSPACE, (void **)&one));
    gp_status st = gp_dev_fill(dev, one, 0.0f, 1);
    if (st == GP_OK) st = gp_dev_allreduce(dev, comm, one, 1);
    if (st == GP_OK) st = gp_dev_synchronize(dev);
    gp_dev_free(dev, one, sizeof *one, GP_MEM_WORKSPACE);
    return st;
}

gp_status gp_dev_host_alloc(gp_device *dev, size_t bytes, void **out)
{
    *out = NULL;
    if (dev && dev->iface->host_alloc) return dev->iface->host_alloc(dev, bytes, out);
    size_t rounded = (bytes + 63) / 64 * 64;
    *out = aligned_alloc(64, rounded ? rounded : 64);
    if (!*out)
        return gp_error_set(GP_ERR_OOM, "out of host memory allocating %zu bytes for %s uploads",
                            bytes, dev ? dev->name : "device");
    return GP_OK;
}

void gp_dev_host_free(gp_device *dev, void *ptr)
{
    if (!ptr) return;
    if (dev && dev->iface->host_free) dev->iface->host_free(dev, ptr);
    else free(ptr);
}

void gp_comm_abort(gp_comm *comm)
{
    if (comm && comm->abort) comm->abort(comm);
}

void gp_comm_reset(gp_comm *comm)
{
    if (comm && comm->reset) comm->reset(comm);
}

int gp_comm_rank(const gp_comm *comm, const gp_device *dev)
{
    for (int r = 0; comm && r < comm->n; r++)
        if (comm->devs[r] == dev) return r;
    return -1;
}

static gp_status no_sync_bn(gp_device *dev, const char *what)
{
    return gp_error_set(GP_ERR_UNSUPPORTED,
                        "device %s: the %s backend has no %s for synchronised batch norm "
                        "yet; use batchnorm without sync: true on it", dev->name,
                        dev->iface->backend_name, what);
}

gp_status gp_dev_no_blocks(const gp_device *dev, const char *what)
{
    return gp_error_set(GP_ERR_INVALID,
                        "device %s: a %s on a channel-blocked layout, which the %s backend "
                        "does not take (no act_block); pass plain tensors", dev->name, what,
                        dev->iface->backend_name);
}

gp_status gp_bn_desc_check(const gp_device *dev, const gp_bn_desc *d)
{
    if (d->n <= 0 || d->c <= 0 || d->s <= 0 || !(d->eps >= 0.0f))
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: invalid batch norm (n=%lld c=%lld s=%lld eps=%g)",
                            dev->name, (long long)d->n, (long long)d->c, (long long)d->s,
                            (double)d->eps);
    if (!gp_blk_valid(d->blk, d->c) || (d->blk && !dev->iface->act_block))
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: batch norm over %lld channels in blocks of %lld: the "
                            "%s backend takes no such layout", dev->name, (long long)d->c,
                            (long long)d->blk, dev->iface->backend_name);
    return GP_OK;
}

gp_status gp_dev_bn_stats(gp_device *dev, const gp_bn_desc *d, const float *x, float *mean,
                          float *var)
{
    if (!dev->iface->bn_stats) return no_sync_bn(dev, "bn_stats");
    GP_TRY(gp_bn_desc_check(dev, d));
    return GP_LAUNCH(dev, bn_stats)(dev, d, x, mean, var);
}

gp_status gp_dev_bn_bwd_sums(gp_device *dev, const gp_bn_desc *d, const float *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const float *dy, float *sums)
{
    if (!dev->iface->bn_bwd_sums) return no_sync_bn(dev, "bn_bwd_sums");
    GP_TRY(gp_bn_desc_check(dev, d));
    return GP_LAUNCH(dev, bn_bwd_sums)(dev, d, x, gamma, beta, mean, var, dy, sums);
}

gp_status gp_dev_bn_bwd_apply(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const float *dy, const float *sums,
                              double count, float *dx, const float *local, float *dgamma,
                              float *dbeta)
{
    if (!dev->iface->bn_bwd_apply) return no_sync_bn(dev, "bn_bwd_apply");
    GP_TRY(gp_bn_desc_check(dev, d));
    if (!(count >= 1.0))
        return gp_error_set(GP_ERR_INVALID, "device %s: batch-norm backward over %g values",
                            dev->name, count);
    return GP_LAUNCH(dev, bn_bwd_apply)(dev, d, x, gamma, beta, mean, var, dy, sums, count, dx,
                                    local, dgamma, dbeta);
}

/* ---- the U-Net slots ------------------------------------------------------ */

static gp_status no_unet_op(gp_device *dev, const char *op, const char *layer)
{
    return gp_error_set(GP_ERR_UNSUPPORTED,
                        "device %s: the %s backend has no %s, which %s needs; run that layer "
                        "on another device", dev->name, dev->iface->backend_name, op, layer);
}

gp_status gp_dev_leaky_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n,
                                float slope)
{
    if (!dev->iface->leaky_relu_fwd) return no_unet_op(dev, "leaky_relu_fwd", "leaky_relu");
    return n > 0 ? GP_LAUNCH(dev, leaky_relu_fwd)(dev, x, y, n, slope) : GP_OK;
}

gp_status gp_dev_leaky_relu_bwd(gp_device *dev, const float *y, const float *dy, float *dx,
                                int64_t n, float slope)
{
    if (!dev->iface->leaky_relu_bwd) return no_unet_op(dev, "leaky_relu_bwd", "leaky_relu");
    return n > 0 ? GP_LAUNCH(dev, leaky_relu_bwd)(dev, y, dy, dx, n, slope) : GP_OK;
}

static gp_status attn_check(gp_device *dev, const char *op, int64_t b, int64_t t,
                            int64_t heads, int64_t kv_heads, int64_t c)
{
    if (!(dev->iface->attn_fwd && dev->iface->attn_bwd))
        return gp_error_set(GP_ERR_UNSUPPORTED,
                            "device %s: the %s backend has no causal attention kernel (%s), "
                            "which the attention layer needs; place the attention layers on a "
                            "CPU device for now", dev->name, dev->iface->backend_name, op);
    if (b < 0 || t < 0 || heads < 1 || c < 1 || c % heads || kv_heads < 1 || heads % kv_heads)
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: %s takes b, t >= 0, heads >= 1 dividing c and kv_heads "
                            ">= 1 dividing heads (got b %lld, t %lld, heads %lld, kv_heads %lld, "
                            "c %lld)", dev->name, op, (long long)b, (long long)t,
                            (long long)heads, (long long)kv_heads, (long long)c);
    return GP_OK;
}

gp_status gp_dev_attn_fwd(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                          int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    GP_TRY(attn_check(dev, "attn_fwd", b, t, heads, kv_heads, c));
    return b * t > 0 ? GP_LAUNCH(dev, attn_fwd)(dev, x, y, lse, b, t, heads, kv_heads, c) : GP_OK;
}

gp_status gp_dev_attn_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                          const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                          int64_t kv_heads, int64_t c)
{
    GP_TRY(attn_check(dev, "attn_bwd", b, t, heads, kv_heads, c));
    return b * t > 0 ? GP_LAUNCH(dev, attn_bwd)(dev, x, y, lse, dy, dx, b, t, heads, kv_heads, c) : GP_OK;
}

/* The error of a bf16 slot the backend lacks (the layer's takes_bf16 hook keeps such calls
 * on the storage adapter, so reaching this is a bug in the caller). */
static gp_status no_bf16_slot(gp_device *dev, const char *what)
{
    return gp_error_set(GP_ERR_UNSUPPORTED, "device %s (%s backend) has no bf16 %s; the storage "
                        "adapter runs it", dev->name, dev->iface->backend_name, what);
}

gp_status gp_dev_attn_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                               int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    GP_TRY(attn_check(dev, "attn_fwd", b, t, heads, kv_heads, c));
    if (!gp_dev_attn_bf16_has(dev)) return no_bf16_slot(dev, "attention");
    return b * t > 0 ? GP_LAUNCH(dev, attn_fwd_bf16)(dev, x, y, lse, b, t, heads, kv_heads, c) : GP_OK;
}

gp_status gp_dev_attn_bwd_bf16(gp_device *dev, const uint16_t *x, const uint16_t *y,
                               const float *lse, const uint16_t *dy, uint16_t *dx, int64_t b,
                               int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    GP_TRY(attn_check(dev, "attn_bwd", b, t, heads, kv_heads, c));
    if (!gp_dev_attn_bf16_has(dev)) return no_bf16_slot(dev, "attention");
    return b * t > 0 ? GP_LAUNCH(dev, attn_bwd_bf16)(dev, x, y, lse, dy, dx, b, t, heads, kv_heads, c) : GP_OK;
}

gp_status gp_dev_bn_fwd_train_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, uint16_t *y,
                                   float *mean, float *var)
{
    if (!gp_dev_bn_bf16_has(dev)) return no_bf16_slot(dev, "batch norm");
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "batch norm");
    return GP_LAUNCH(dev, bn_fwd_train_bf16)(dev, d, x, gamma, beta, y, mean, var);
}

gp_status gp_dev_bn_fwd_infer_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, const float *mean,
                                   const float *var, uint16_t *y)
{
    if (!gp_dev_bn_bf16_has(dev)) return no_bf16_slot(dev, "batch norm");
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "batch norm");
    return GP_LAUNCH(dev, bn_fwd_infer_bf16)(dev, d, x, gamma, beta, mean, var, y);
}

gp_status gp_dev_bn_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const uint16_t *dy, uint16_t *dx, float *dgamma,
                             float *dbeta)
{
    if (!gp_dev_bn_bf16_has(dev)) return no_bf16_slot(dev, "batch norm");
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "batch norm");
    return GP_LAUNCH(dev, bn_bwd_bf16)(dev, d, x, gamma, beta, mean, var, dy, dx, dgamma, dbeta);
}

gp_status gp_dev_xent_bf16(gp_device *dev, const uint16_t *logits, const float *labels,
                           int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                           uint16_t *dlogits, gp_loss_result *out)
{
    if (!dev->iface->xent_bf16) return no_bf16_slot(dev, "cross-entropy");
    if (rows <= 0) return loss_result_up(dev, out, 0.0, 0, -1);
    return GP_LAUNCH(dev, xent_bf16)(dev, logits, labels, rows, cols, ld, scale, smoothing, dlogits,
                                 out);
}

gp_status gp_dev_dropout_apply_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                    float p, uint64_t seed, uint64_t stream, uint64_t first)
{
    if (!dev->iface->dropout_apply_bf16) return no_bf16_slot(dev, "dropout");
    return n > 0 ? GP_LAUNCH(dev, dropout_apply_bf16)(dev, x, y, n, p, seed, stream, first) : GP_OK;
}

gp_status gp_dev_mul_rows_bf16(gp_device *dev, const uint16_t *x, const float *s, uint16_t *y,
                               int64_t rows, int64_t cols)
{
    if (!dev->iface->mul_rows_bf16) return no_bf16_slot(dev, "dropout2d");
    return rows * cols > 0 ? GP_LAUNCH(dev, mul_rows_bf16)(dev, x, s, y, rows, cols) : GP_OK;
}

gp_status gp_dev_layer_norm_fwd_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                     const float *b, uint16_t *y, float *mean, float *rstd,
                                     int64_t rows, int64_t c, float eps)
{
    if (!gp_dev_layer_norm_bf16_has(dev)) return no_bf16_slot(dev, "layer norm");
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, layer_norm_fwd_bf16)(dev, x, w, b, y, mean, rstd, rows, c, eps);
}

gp_status gp_dev_layer_norm_bwd_data_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                          const float *mean, const float *rstd,
                                          const uint16_t *dy, uint16_t *dx, int64_t rows,
                                          int64_t c)
{
    if (!gp_dev_layer_norm_bf16_has(dev)) return no_bf16_slot(dev, "layer norm");
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, layer_norm_bwd_data_bf16)(dev, x, w, mean, rstd, dy, dx, rows, c);
}

gp_status gp_dev_layer_norm_bwd_weights_bf16(gp_device *dev, const uint16_t *x,
                                             const float *mean, const float *rstd,
                                             const uint16_t *dy, float *dw, float *db,
                                             int64_t rows, int64_t c)
{
    if (!gp_dev_layer_norm_bf16_has(dev)) return no_bf16_slot(dev, "layer norm");
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, layer_norm_bwd_weights_bf16)(dev, x, mean, rstd, dy, dw, db, rows, c);
}

gp_status gp_dev_add_layer_norm_fwd(gp_device *dev, gp_dtype dt, const void *a, const void *b,
                                    void *s, const float *w, const float *bias, void *y,
                                    float *mean, float *rstd, int64_t rows, int64_t c, float eps)
{
    if (!gp_dev_add_norm_has(dev, dt))
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no fused residual add and layer "
                            "norm on %s storage", dev->name, gp_dtype_name(dt));
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, add_layer_norm_fwd)(dev, dt, a, b, s, w, bias, y, mean, rstd, rows, c,
                                              eps);
}

gp_status gp_dev_layer_norm_bwd_data_add(gp_device *dev, gp_dtype dt, const void *x,
                                         const float *w, const float *mean, const float *rstd,
                                         const void *dy, void *dx, int64_t rows, int64_t c)
{
    if (!gp_dev_add_norm_has(dev, dt))
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no layer norm backward adding into "
                            "its gradient on %s storage", dev->name, gp_dtype_name(dt));
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, layer_norm_bwd_data_add)(dev, dt, x, w, mean, rstd, dy, dx, rows, c);
}

gp_status gp_dev_rope(gp_device *dev, gp_dtype dt, const gp_rope_desc *d, bool inverse,
                      const void *x, void *y)
{
    if (!dev->iface->rope)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no rope kernel", dev->name);
    GP_ASSERT(d->d > 0 && d->d % 2 == 0 && d->d / 2 <= GP_ROPE_MAX_HALF &&
              d->heads * d->d <= d->width);
    if (d->rows <= 0 || d->t <= 0) return GP_OK;
    return GP_LAUNCH(dev, rope)(dev, dt, d, inverse, x, y);
}

gp_status gp_dev_attn_cached(gp_device *dev, gp_dtype dt, const void *x, void *kv, void *y,
                             int64_t b, int64_t n, int64_t pos, int64_t cap, int64_t heads,
                             int64_t kv_heads, int64_t c)
{
    if (!dev->iface->attn_cached)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: the %s backend has no cached "
                            "attention kernel (attn_cached)", dev->name,
                            dev->iface->backend_name);
    GP_TRY(attn_check(dev, "attn_cached", b, n, heads, kv_heads, c));
    if (pos < 0 || pos + n > cap)
        return gp_error_set(GP_ERR_INVALID, "device %s: attn_cached: positions %lld .. %lld "
                            "past the cache's %lld", dev->name, (long long)pos,
                            (long long)(pos + n - 1), (long long)cap);
    if (b * n == 0) return GP_OK;
    return GP_LAUNCH(dev, attn_cached)(dev, dt, x, kv, y, b, n, pos, cap, heads, kv_heads, c);
}

gp_status gp_dev_swiglu_fwd(gp_device *dev, gp_dtype dt, const void *x, void *y, int64_t rows,
                            int64_t h)
{
    if (!dev->iface->swiglu_fwd)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no swiglu kernels", dev->name);
    if (rows <= 0 || h <= 0) return GP_OK;
    return GP_LAUNCH(dev, swiglu_fwd)(dev, dt, x, y, rows, h);
}

gp_status gp_dev_swiglu_bwd(gp_device *dev, gp_dtype dt, const void *x, const void *dy, void *dx,
                            int64_t rows, int64_t h)
{
    if (!dev->iface->swiglu_bwd)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no swiglu kernels", dev->name);
    if (rows <= 0 || h <= 0) return GP_OK;
    return GP_LAUNCH(dev, swiglu_bwd)(dev, dt, x, dy, dx, rows, h);
}

static gp_status no_rms(gp_device *dev)
{
    return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no rms_norm kernels; run the model's "
                        "rms_norm layers on another device", dev->name);
}

gp_status gp_dev_rms_norm_fwd(gp_device *dev, gp_dtype dt, const void *x, const float *w, void *y,
                              float *rstd, int64_t rows, int64_t c, float eps)
{
    if (!dev->iface->rms_norm_fwd) return no_rms(dev);
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, rms_norm_fwd)(dev, dt, x, w, y, rstd, rows, c, eps);
}

gp_status gp_dev_rms_norm_bwd_data(gp_device *dev, gp_dtype dt, const void *x, const float *w,
                                   const float *rstd, const void *dy, void *dx, int64_t rows,
                                   int64_t c)
{
    if (!dev->iface->rms_norm_bwd_data) return no_rms(dev);
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, rms_norm_bwd_data)(dev, dt, x, w, rstd, dy, dx, rows, c);
}

gp_status gp_dev_rms_norm_bwd_weights(gp_device *dev, gp_dtype dt, const void *x,
                                      const float *rstd, const void *dy, float *dw, int64_t rows,
                                      int64_t c)
{
    if (!dev->iface->rms_norm_bwd_weights) return no_rms(dev);
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, rms_norm_bwd_weights)(dev, dt, x, rstd, dy, dw, rows, c);
}

gp_status gp_dev_linear_gelu_fwd(gp_device *dev, gp_dtype dt, int64_t n, int64_t out, int64_t in,
                                 const void *x, const float *w, const float *bias, void *pre,
                                 void *y)
{
    if (!gp_dev_linear_gelu_has(dev, dt))
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no product with a GELU epilogue on "
                            "%s storage", dev->name, gp_dtype_name(dt));
    if (n <= 0 || out <= 0) return GP_OK;
    return GP_LAUNCH(dev, linear_gelu_fwd)(dev, dt, n, out, in, x, w, bias, pre, y);
}

gp_status gp_dev_linear_gelu_bwd_data(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                      int64_t in, const void *dy, const float *w,
                                      const void *pre, void *dx)
{
    if (!gp_dev_linear_gelu_has(dev, dt))
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no product with GELU's derivative "
                            "as its epilogue on %s storage", dev->name, gp_dtype_name(dt));
    if (n <= 0 || in <= 0) return GP_OK;
    return GP_LAUNCH(dev, linear_gelu_bwd_data)(dev, dt, n, out, in, dy, w, pre, dx);
}

static gp_status no_conv_bf16(gp_device *dev)
{
    return gp_error_set(GP_ERR_UNSUPPORTED, "device %s (%s backend, precision %s) has no bf16 "
                        "convolution for this shape; the storage adapter runs it", dev->name,
                        dev->iface->backend_name, gp_precision_name(dev->precision));
}

gp_status gp_dev_conv_fwd_bf16(gp_device *dev, const gp_conv_desc *d, const uint16_t *x,
                               const float *w, const float *b, uint16_t *y)
{
    if (!gp_dev_conv_bf16_takes(dev, d)) return no_conv_bf16(dev);
    return GP_LAUNCH(dev, conv_fwd_bf16)(dev, d, x, w, b, y);
}

gp_status gp_dev_conv_bwd_data_bf16(gp_device *dev, const gp_conv_desc *d, const float *w,
                                    const uint16_t *dy, uint16_t *dx)
{
    if (!gp_dev_conv_bf16_takes(dev, d)) return no_conv_bf16(dev);
    return GP_LAUNCH(dev, conv_bwd_data_bf16)(dev, d, w, dy, dx);
}

gp_status gp_dev_conv_bwd_weights_bf16(gp_device *dev, const gp_conv_desc *d,
                                       const uint16_t *x, const uint16_t *dy, float *dw,
                                       float *db)
{
    if (!gp_dev_conv_bf16_takes(dev, d)) return no_conv_bf16(dev);
    return GP_LAUNCH(dev, conv_bwd_weights_bf16)(dev, d, x, dy, dw, db);
}

gp_status gp_dev_add_bf16(gp_device *dev, const uint16_t *a, const uint16_t *b, uint16_t *y,
                          int64_t n)
{
    if (!dev->iface->add_bf16) return no_bf16_slot(dev, "sum");
    return n > 0 ? GP_LAUNCH(dev, add_bf16)(dev, a, b, y, n) : GP_OK;
}

gp_status gp_dev_pool_fwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               uint16_t *y, void *ws)
{
    if (!gp_dev_pool_bf16_has(dev)) return no_bf16_slot(dev, "pooling");
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "pooling");
    return GP_LAUNCH(dev, pool_fwd_bf16)(dev, d, x, y, ws);
}

gp_status gp_dev_pool_bwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               const uint16_t *y, const uint16_t *dy, uint16_t *dx,
                               const void *ws)
{
    if (!gp_dev_pool_bf16_has(dev)) return no_bf16_slot(dev, "pooling");
    if (d->blk && !dev->iface->act_block) return gp_dev_no_blocks(dev, "pooling");
    return GP_LAUNCH(dev, pool_bwd_bf16)(dev, d, x, y, dy, dx, ws);
}

/* ---- the Transformer slots ------------------------------------------------ */

gp_status gp_dev_act_bf16(gp_device *dev, gp_act_kind kind, const uint16_t *xy,
                          const uint16_t *dy, uint16_t *out, int64_t n, float slope)
{
    static const char *const names[GP_ACT_COUNT] = {"relu", "leaky_relu", "gelu"};
    if (!gp_dev_act_bf16_has(dev, kind))
        return no_bf16_slot(dev, (unsigned)kind < GP_ACT_COUNT ? names[kind] : "activation");
    return n > 0 ? GP_LAUNCH(dev, act_bf16)(dev, kind, xy, dy, out, n, slope) : GP_OK;
}

gp_status gp_dev_gelu_fwd(gp_device *dev, const float *x, float *y, int64_t n)
{
    if (!dev->iface->gelu_fwd) return no_unet_op(dev, "gelu_fwd", "gelu");
    return n > 0 ? GP_LAUNCH(dev, gelu_fwd)(dev, x, y, n) : GP_OK;
}

gp_status gp_dev_gelu_bwd(gp_device *dev, const float *x, const float *dy, float *dx, int64_t n)
{
    if (!dev->iface->gelu_bwd) return no_unet_op(dev, "gelu_bwd", "gelu");
    return n > 0 ? GP_LAUNCH(dev, gelu_bwd)(dev, x, dy, dx, n) : GP_OK;
}

gp_status gp_dev_layer_norm_fwd(gp_device *dev, const float *x, const float *w, const float *b,
                                float *y, float *mean, float *rstd, int64_t rows, int64_t c,
                                float eps)
{
    if (!dev->iface->layer_norm_fwd) return no_unet_op(dev, "layer_norm_fwd", "layer_norm");
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, layer_norm_fwd)(dev, x, w, b, y, mean, rstd, rows, c, eps);
}

gp_status gp_dev_layer_norm_bwd_data(gp_device *dev, const float *x, const float *w,
                                     const float *mean, const float *rstd, const float *dy,
                                     float *dx, int64_t rows, int64_t c)
{
    if (!dev->iface->layer_norm_bwd_data)
        return no_unet_op(dev, "layer_norm_bwd_data", "layer_norm");
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, layer_norm_bwd_data)(dev, x, w, mean, rstd, dy, dx, rows, c);
}

gp_status gp_dev_layer_norm_bwd_weights(gp_device *dev, const float *x, const float *mean,
                                        const float *rstd, const float *dy, float *dw, float *db,
                                        int64_t rows, int64_t c)
{
    if (!dev->iface->layer_norm_bwd_weights)
        return no_unet_op(dev, "layer_norm_bwd_weights", "layer_norm");
    if (rows <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, layer_norm_bwd_weights)(dev, x, mean, rstd, dy, dw, db, rows, c);
}

gp_status gp_dev_embed_fwd(gp_device *dev, const float *ids, const float *wte, const float *wpe,
                           gp_dtype dt, void *y, int64_t n, int64_t t, int64_t c, int64_t vocab,
                           int64_t *bad)
{
    *bad = -1;
    if (!dev->iface->embed_fwd) return no_unet_op(dev, "embed_fwd", "embedding");
    if (n <= 0 || t <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, embed_fwd)(dev, ids, wte, wpe, dt, y, n, t, c, vocab, bad);
}

gp_status gp_dev_embed_bwd(gp_device *dev, const float *ids, gp_dtype dt, const void *dy,
                           float *dwte, float *dwpe, int64_t n, int64_t t, int64_t c,
                           int64_t vocab)
{
    if (!dev->iface->embed_bwd) return no_unet_op(dev, "embed_bwd", "embedding");
    if (n <= 0 || t <= 0 || c <= 0) return GP_OK;
    return GP_LAUNCH(dev, embed_bwd)(dev, ids, dt, dy, dwte, dwpe, n, t, c, vocab);
}

static gp_status norm_leaky_check(gp_device *dev, const gp_bn_desc *d, float slope)
{
    if (!(slope > 0.0f) || d->blk || d->relu || d->add)
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: norm_leaky_bwd takes a plain norm without relu or add "
                            "and a slope > 0 (got slope %g)", dev->name, (double)slope);
    return GP_OK;
}

gp_status gp_dev_norm_leaky_bwd(gp_device *dev, const gp_bn_desc *d, const float *yz, bool from_z,
                                float slope, const float *var, const float *dy, float *dx)
{
    if (!dev->iface->norm_leaky_bwd) return no_unet_op(dev, "norm_leaky_bwd", "instance_norm");
    GP_TRY(norm_leaky_check(dev, d, slope));
    return d->n * d->c * d->s > 0
               ? GP_LAUNCH(dev, norm_leaky_bwd)(dev, d, yz, from_z, slope, var, dy, dx)
               : GP_OK;
}

gp_status gp_dev_norm_leaky_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *yz,
                                     bool from_z, float slope, const float *var,
                                     const uint16_t *dy, uint16_t *dx)
{
    if (!dev->iface->norm_leaky_bwd_bf16) return no_bf16_slot(dev, "instance norm backward");
    GP_TRY(norm_leaky_check(dev, d, slope));
    return d->n * d->c * d->s > 0
               ? GP_LAUNCH(dev, norm_leaky_bwd_bf16)(dev, d, yz, from_z, slope, var, dy, dx)
               : GP_OK;
}

gp_status gp_dev_mul_rows(gp_device *dev, const float *x, const float *s, float *y,
                          int64_t rows, int64_t cols)
{
    if (!dev->iface->mul_rows) return no_unet_op(dev, "mul_rows", "dropout2d");
    return rows > 0 && cols > 0 ? GP_LAUNCH(dev, mul_rows)(dev, x, s, y, rows, cols) : GP_OK;
}

static gp_status upsample_check(gp_device *dev, int64_t n, int64_t c, int64_t h, int64_t w,
                                int64_t scale)
{
    if (n < 0 || c < 0 || h < 0 || w < 0 || scale < 1)
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: invalid upsampling of (%lld, %lld, %lld, %lld) by %lld",
                            dev->name, (long long)n, (long long)c, (long long)h, (long long)w,
                            (long long)scale);
    return GP_OK;
}

gp_status gp_dev_upsample_fwd(gp_device *dev, const float *x, float *y, int64_t n, int64_t c,
                              int64_t h, int64_t w, int64_t scale)
{
    if (!dev->iface->upsample_fwd) return no_unet_op(dev, "upsample_fwd", "upsample");
    GP_TRY(upsample_check(dev, n, c, h, w, scale));
    if (n * c * h * w == 0) return GP_OK;
    return GP_LAUNCH(dev, upsample_fwd)(dev, x, y, n, c, h, w, scale);
}

gp_status gp_dev_upsample_bwd(gp_device *dev, const float *dy, float *dx, int64_t n, int64_t c,
                              int64_t h, int64_t w, int64_t scale)
{
    if (!dev->iface->upsample_bwd) return no_unet_op(dev, "upsample_bwd", "upsample");
    GP_TRY(upsample_check(dev, n, c, h, w, scale));
    if (n * c * h * w == 0) return GP_OK;
    return GP_LAUNCH(dev, upsample_bwd)(dev, dy, dx, n, c, h, w, scale);
}

gp_status gp_dev_linear_fwd_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                 const uint16_t *x, const float *w, const float *bias, bool relu,
                                 uint16_t *y)
{
    if (!gp_dev_linear_bf16_has(dev)) return no_bf16_slot(dev, "linear layer");
    return n > 0 && out > 0 ? GP_LAUNCH(dev, linear_fwd_bf16)(dev, n, out, in, x, w, bias, relu, y)
                            : GP_OK;
}

gp_status gp_dev_linear_bwd_data_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                      const uint16_t *dy, const float *w, uint16_t *dx)
{
    if (!gp_dev_linear_bf16_has(dev)) return no_bf16_slot(dev, "linear layer");
    return n > 0 && in > 0 ? GP_LAUNCH(dev, linear_bwd_data_bf16)(dev, n, out, in, dy, w, dx) : GP_OK;
}

gp_status gp_dev_linear_bwd_weights(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                    int64_t in, const void *dy, const void *x, float *dw,
                                    float *db, bool fresh)
{
    if (dt == GP_BF16 && !gp_dev_linear_bf16_has(dev)) return no_bf16_slot(dev, "linear layer");
    GP_ASSERT(dt == GP_BF16 || dt == GP_F32);
    if (dt == GP_F32 && !dev->iface->linear_bwd_weights) { /* the three calls it stands for */
        GP_TRY(gp_dev_gemm(dev, 1, 0, out, in, n, 1.0f, dy, out, x, in, fresh ? 0.0f : 1.0f, dw,
                           in));
        if (!db) return GP_OK;
        if (fresh) GP_TRY(gp_dev_fill(dev, db, 0.0f, out));
        return n > 0 ? gp_dev_sum_rows(dev, dy, db, n, out) : GP_OK;
    }
    return GP_LAUNCH(dev, linear_bwd_weights)(dev, dt, n, out, in, dy, x, dw, db, fresh);
}

gp_status gp_dev_upsample_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale)
{
    if (!dev->iface->upsample_fwd_bf16) return no_bf16_slot(dev, "upsample");
    GP_TRY(upsample_check(dev, n, c, h, w, scale));
    if (n * c * h * w == 0) return GP_OK;
    return GP_LAUNCH(dev, upsample_fwd_bf16)(dev, x, y, n, c, h, w, scale);
}

gp_status gp_dev_upsample_bwd_bf16(gp_device *dev, const uint16_t *dy, uint16_t *dx, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale)
{
    if (!dev->iface->upsample_bwd_bf16) return no_bf16_slot(dev, "upsample");
    GP_TRY(upsample_check(dev, n, c, h, w, scale));
    if (n * c * h * w == 0) return GP_OK;
    return GP_LAUNCH(dev, upsample_bwd_bf16)(dev, dy, dx, n, c, h, w, scale);
}

gp_status gp_dev_bce_logits(gp_device *dev, const float *z, const float *t, int64_t n,
                            float scale, float *dz, double *loss_sum, int64_t *correct,
                            int64_t *bad)
{
    gp_dev_count_wait(dev);
    *loss_sum = 0.0;
    *correct = 0;
    *bad = -1;
    if (!dev->iface->bce_logits)
        return no_unet_op(dev, "bce_logits", "the binary cross-entropy loss");
    return n > 0 ? GP_LAUNCH(dev, bce_logits)(dev, z, t, n, scale, dz, loss_sum, correct, bad)
                 : GP_OK;
}
