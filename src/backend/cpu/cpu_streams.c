/*
 * cpu_streams.c — a GPU's asynchrony on the CPU, for copies between
 * stages: with GPIPE_CPU_STREAMS=threads each CPU device's copy stream is a
 * FIFO queue run by a thread of its own, and events are real: recorded on
 * a stream, waited on by another.  The executor's event logic (record
 * after the producer, the copy behind that event on the receiver's copy
 * stream, the reader's wait for the copy, frees held back until the copy
 * is over) then runs here exactly as it will on a GPU, and a missing wait
 * is a wrong result, an AddressSanitizer report or a ThreadSanitizer race
 * in CI instead of a corruption on a GPU nobody has.  GPIPE_CPU_COPY_DELAY_US
 * holds every copy back that long, so that a reader that does not wait
 * reads the old contents rather than win the race.
 *
 * The compute stream stays the device's worker thread (the math runs on
 * the caller): an event recorded there is complete when recorded, and
 * "the device waits for an event" is the host waiting for it.
 *
 * Semantics follow CUDA's: cudaStreamWaitEvent and cudaEventSynchronize
 * wait for the event's most recent record at the time of the call (a
 * record's number, `target`), and a copy waits for `after`'s record at the
 * time it was enqueued.  Frees: cpu_free waits until no unfinished copy
 * reads or writes the block (the allocator's stream-ordered free on CUDA).
 *
 * One process-wide lock guards every queue and event: this is a test mode,
 * and one lock is what makes it easy to see correct.
 */
#include "backend/cpu/cpu_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct cpu_event {
    uint64_t recorded;  /* records so far */
    uint64_t completed; /* the highest record that has completed */
};

/* A device-time marker: t is gp_now() when its stream reached it; taken
 * once stamped (a copy-stream marker is stamped by the queue, under
 * g_lock). */
typedef struct cpu_mark {
    struct cpu_mark *next;
    double t;
    bool stamped;
} cpu_mark;

typedef struct copy_item {
    struct copy_item *prev, *next; /* g_items: every unfinished copy, in order */
    gp_device *dev;                /* whose copy stream runs it */
    bool started;
    void *dst;
    const void *src;
    size_t bytes;
    cpu_event *after;
    uint64_t after_target;
    cpu_event *done;
    uint64_t done_target;
    cpu_mark *mark;                /* a marker, not a copy: stamp it */
} copy_item;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER; /* anything below changed */
static copy_item *g_head, *g_tail;

bool gp_cpu_streams_from_env(long *delay_us)
{
    const char *e = getenv("GPIPE_CPU_STREAMS");
    const char *d = getenv("GPIPE_CPU_COPY_DELAY_US");
    *delay_us = 0;
    if (d && *d) {
        char *end = NULL;
        long v = strtol(d, &end, 10);
        if (*end || v < 0 || v > 1000000)
            GP_WARN("GPIPE_CPU_COPY_DELAY_US='%s' is not a number of microseconds in "
                    "[0, 1000000]; using 0", d);
        else *delay_us = v;
    }
    if (!e || !*e || !strcmp(e, "sync")) return false;
    if (!strcmp(e, "threads")) return true;
    GP_WARN("GPIPE_CPU_STREAMS='%s' is not sync or threads; using sync", e);
    return false;
}

static void unlink_item(copy_item *it)
{
    if (it->prev) it->prev->next = it->next;
    else g_head = it->next;
    if (it->next) it->next->prev = it->prev;
    else g_tail = it->prev;
}

/* it at the end of g_items, and the copy threads told (g_lock held). */
static void append_locked(copy_item *it)
{
    it->prev = g_tail;
    if (g_tail) g_tail->next = it;
    else g_head = it;
    g_tail = it;
    pthread_cond_broadcast(&g_cond);
}

static copy_item *next_for(const gp_device *dev)
{
    for (copy_item *it = g_head; it; it = it->next)
        if (it->dev == dev && !it->started) return it;
    return NULL;
}

static void *copy_thread(void *arg)
{
    gp_device *dev = arg;
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    pthread_mutex_lock(&g_lock);
    for (;;) {
        copy_item *it = next_for(dev);
        if (!it) {
            if (ctx->copy_stop) break;
            pthread_cond_wait(&g_cond, &g_lock);
            continue;
        }
        /* In order: the next copy of this stream starts when this one ends. */
        it->started = true;
        while (it->after && it->after->completed < it->after_target)
            pthread_cond_wait(&g_cond, &g_lock);
        if (it->mark) { /* the stream got here: everything before it is done */
            it->mark->t = gp_now();
            it->mark->stamped = true;
            unlink_item(it);
            free(it);
            pthread_cond_broadcast(&g_cond);
            continue;
        }
        pthread_mutex_unlock(&g_lock);
        if (ctx->copy_delay_us > 0) {
            struct timespec ts = {ctx->copy_delay_us / 1000000,
                                  (ctx->copy_delay_us % 1000000) * 1000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        }
        if (it->bytes && it->dst != it->src) memcpy(it->dst, it->src, it->bytes);
        pthread_mutex_lock(&g_lock);
        if (it->done && it->done->completed < it->done_target)
            it->done->completed = it->done_target;
        unlink_item(it);
        free(it);
        pthread_cond_broadcast(&g_cond);
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

gp_status gp_cpu_streams_start(gp_device *dev)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    int e = pthread_create(&ctx->copy_thread, NULL, copy_thread, dev);
    if (e != 0)
        return gp_error_set(GP_ERR_RUNTIME, "device %s: cannot start its copy stream's thread: "
                            "%s", dev->name, strerror(e));
    ctx->copy_running = true;
    return GP_OK;
}

void gp_cpu_streams_stop(gp_device *dev)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    if (!ctx->copy_running) return;
    pthread_mutex_lock(&g_lock);
    ctx->copy_stop = true; /* after what is queued */
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    pthread_join(ctx->copy_thread, NULL);
    ctx->copy_running = false;
}

/* Wait until no unfinished copy satisfies `uses` (evaluated under g_lock). */
typedef bool (*item_pred)(const copy_item *it, const void *arg);

static void wait_unused(item_pred uses, const void *arg)
{
    pthread_mutex_lock(&g_lock);
    for (;;) {
        bool busy = false;
        for (copy_item *it = g_head; it && !busy; it = it->next) busy = uses(it, arg);
        if (!busy) break;
        pthread_cond_wait(&g_cond, &g_lock);
    }
    pthread_mutex_unlock(&g_lock);
}

static bool overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    const char *x = a, *y = b;
    return an && bn && x < y + bn && y < x + an;
}

typedef struct {
    const void *ptr;
    size_t bytes;
} mem_range;

static bool touches(const copy_item *it, const void *arg)
{
    const mem_range *r = arg;
    return overlaps(r->ptr, r->bytes, it->dst, it->bytes) ||
           overlaps(r->ptr, r->bytes, it->src, it->bytes);
}
static bool runs_on(const copy_item *it, const void *dev) { return it->dev == dev; }
static bool records(const copy_item *it, const void *ev)
{
    return it->done == ev || it->after == ev;
}

void gp_cpu_streams_before_free(gp_device *dev, const void *ptr, size_t bytes)
{
    if (!gp_cpu_ctx_of(dev)->streams) return;
    wait_unused(touches, &(mem_range){ptr, bytes});
}

gp_status gp_cpu_synchronize(gp_device *dev)
{
    if (!gp_cpu_ctx_of(dev)->streams) return GP_OK; /* the work is done when a call returns */
    wait_unused(runs_on, dev);
    return GP_OK;
}

gp_status gp_cpu_copy_async(gp_device *dev, void *dst, gp_device *src_dev, const void *src,
                            size_t bytes, void *after, void *done)
{
    if (src_dev->kind != GP_DEV_CPU)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no direct copy from %s", dev->name,
                            src_dev->name);
    if (!gp_cpu_ctx_of(dev)->streams) {
        /* Synchronous: the caller's thread is both streams; events are NULL. */
        if (bytes && dst != src) memcpy(dst, src, bytes);
        return GP_OK;
    }
    copy_item *it = calloc(1, sizeof *it);
    if (!it) return gp_error_set(GP_ERR_OOM, "out of host memory queueing a copy");
    *it = (copy_item){.dev = dev, .dst = dst, .src = src, .bytes = bytes, .after = after,
                      .done = done};
    pthread_mutex_lock(&g_lock);
    if (it->after) it->after_target = it->after->recorded;
    if (it->done) it->done_target = ++it->done->recorded;
    append_locked(it);
    pthread_mutex_unlock(&g_lock);
    return GP_OK;
}

gp_status gp_cpu_upload_async(gp_device *dev, void *dst, const void *src, size_t bytes,
                              void *done)
{
    return gp_cpu_copy_async(dev, dst, dev, src, bytes, NULL, done);
}

/* ---- events ----------------------------------------------------------------- */

gp_status gp_cpu_event_create(gp_device *dev, void **out)
{
    *out = NULL;
    if (!gp_cpu_ctx_of(dev)->streams) return GP_OK; /* synchronous: nothing to wait for */
    cpu_event *e = calloc(1, sizeof *e);
    if (!e) return gp_error_set(GP_ERR_OOM, "out of host memory for an event");
    *out = e;
    return GP_OK;
}

void gp_cpu_event_destroy(gp_device *dev, void *ev)
{
    (void)dev;
    if (!ev) return;
    /* A copy that records it or waits for it may still be queued (a failed
     * step): wait. */
    wait_unused(records, ev);
    free(ev);
}

/* On the compute stream, the caller's thread: complete when recorded. */
gp_status gp_cpu_event_record(gp_device *dev, void *ev)
{
    (void)dev;
    if (!ev) return GP_OK;
    cpu_event *e = ev;
    pthread_mutex_lock(&g_lock);
    e->completed = ++e->recorded;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    return GP_OK;
}

/* The compute stream is the caller: the device waits = the host waits. */
gp_status gp_cpu_event_sync(gp_device *dev, void *ev)
{
    (void)dev;
    if (!ev) return GP_OK;
    cpu_event *e = ev;
    pthread_mutex_lock(&g_lock);
    uint64_t target = e->recorded;
    while (e->completed < target) pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);
    return GP_OK;
}

/* ---- device-time markers ------------------------------------------------ */

gp_status gp_cpu_mark(gp_device *dev, bool copy, void **out)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    *out = NULL;
    cpu_mark *m = calloc(1, sizeof *m);
    copy_item *it = copy && ctx->streams ? calloc(1, sizeof *it) : NULL;
    if (!m || (copy && ctx->streams && !it)) {
        free(m);
        free(it);
        return gp_error_set(GP_ERR_OOM, "out of host memory for a device-time marker");
    }
    m->next = ctx->marks;
    ctx->marks = m;
    *out = m;
    if (!it) { /* the compute stream, or synchronous copies: now */
        m->t = gp_now();
        m->stamped = true;
        return GP_OK;
    }
    it->dev = dev;
    it->mark = m;
    pthread_mutex_lock(&g_lock);
    append_locked(it);
    pthread_mutex_unlock(&g_lock);
    return GP_OK;
}

gp_status gp_cpu_mark_time(gp_device *dev, void *mark, double *seconds)
{
    (void)dev;
    cpu_mark *m = mark;
    pthread_mutex_lock(&g_lock); /* a copy-stream marker may still be queued */
    while (!m->stamped) pthread_cond_wait(&g_cond, &g_lock);
    *seconds = m->t;
    pthread_mutex_unlock(&g_lock);
    return GP_OK;
}

void gp_cpu_mark_reset(gp_device *dev)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    if (ctx->marks && ctx->streams) wait_unused(runs_on, dev); /* none left in the queue */
    while (ctx->marks) {
        cpu_mark *m = ctx->marks;
        ctx->marks = m->next;
        free(m);
    }
}
