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
 * Channels (chan_open, backend.h) are streams too: a queue of sends or
 * receives to another process, run by a thread of the channel's own, which
 * calls the transport's blocking rendezvous (host_send / host_recv: MPI's
 * synchronous send and receive, procs.c).  A send waits for its `after`
 * event first, a receive completes its `done` event; frees wait for them as
 * for copies.  A rendezvous is what NCCL's point-to-point does on a GPU (a
 * send ends only when its receive has started), so an order of channel
 * operations that would deadlock there deadlocks here, in CI.
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
    /* The last record, for the checker ("Allocation epochs"): the device
     * whose compute stream made it and that device's epoch then; NULL when
     * it was a copy stream's or a channel's (`done`), which it leaves
     * unchecked. */
    gp_device *rec_dev;
    uint64_t rec_epoch;
};

/* A live block of cpu_alloc's and its device's epoch when it was handed
 * out (gp_cpu_ctx.blocks). */
struct cpu_block {
    uintptr_t lo, hi; /* [lo, hi) */
    uint64_t epoch;
};

/* A device-time marker: t is gp_now() when its stream reached it; taken
 * once stamped (a copy-stream marker is stamped by the queue, under
 * g_lock). */
typedef struct cpu_mark {
    struct cpu_mark *next;
    double t;
    bool stamped;
} cpu_mark;

typedef struct cpu_chan cpu_chan;

typedef struct copy_item {
    struct copy_item *prev, *next; /* g_items: every unfinished copy, in order */
    gp_device *dev;                /* whose copy (or channel) stream runs it */
    const void *stream;            /* the stream: dev's copy stream, or a cpu_chan */
    cpu_chan *chan;                /* a channel's send (src) or receive (dst) */
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

/* ---- allocation epochs: the missing-wait checker --------------------------
 *
 * The compute stream is the caller, so an event is complete when recorded
 * and a copy behind the WRONG compute event (an older one) still reads
 * what it should here, where on a GPU it would read a tensor the compute
 * stream has not finished writing.  What this mode can still see: each
 * device counts the events recorded on its compute stream (its epoch),
 * each event keeps the epoch of its last record, and each block cpu_alloc
 * hands out keeps the epoch at which it was handed out (fresh or from the
 * cache).  Nothing writes a block before it exists, so a block handed out
 * after event E was recorded is written after E: a copy or a channel's
 * send that reads it behind E (E recorded on the source's device) waits
 * for nothing that wrote it, and fails, naming the devices and the bytes.
 *
 * Not checked: `after` NULL (the caller ordered the source by a host wait:
 * tie.c synchronizes the source's device first, an upload reads host
 * memory, which this mode cannot tell apart from a device's); `after`
 * recorded last by a copy stream or on another device's compute stream
 * (ordered through other events, which epochs do not follow); and a block
 * handed out before E but written again after it (an in-place update, an
 * accumulation), which a wait on E misses on a GPU and passes here. */

/* The index of the first block of ctx whose end is past p (g_lock held). */
static int block_at(const gp_cpu_ctx *ctx, uintptr_t p)
{
    int lo = 0, hi = ctx->n_blocks;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (ctx->blocks[mid].hi <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

void gp_cpu_streams_allocated(gp_device *dev, const void *ptr, size_t bytes)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    if (!ctx->streams || !ptr) return;
    uintptr_t lo = (uintptr_t)ptr, hi = lo + (bytes ? bytes : 1);
    pthread_mutex_lock(&g_lock);
    if (ctx->n_blocks == ctx->cap_blocks) {
        int cap = ctx->cap_blocks ? 2 * ctx->cap_blocks : 256;
        struct cpu_block *nb = realloc(ctx->blocks, (size_t)cap * sizeof *nb);
        if (nb) {
            ctx->blocks = nb;
            ctx->cap_blocks = cap;
        }
    }
    if (ctx->n_blocks < ctx->cap_blocks) { /* (out of host memory: this block unchecked) */
        int k = block_at(ctx, lo);
        GP_ASSERT(k == ctx->n_blocks || ctx->blocks[k].lo >= hi); /* live blocks are apart */
        memmove(&ctx->blocks[k + 1], &ctx->blocks[k],
                (size_t)(ctx->n_blocks - k) * sizeof *ctx->blocks);
        ctx->blocks[k] = (struct cpu_block){lo, hi, ctx->epoch};
        ctx->n_blocks++;
    }
    pthread_mutex_unlock(&g_lock);
}

/* The block [ptr, ...) forgotten (g_lock held). */
static void block_forget(gp_cpu_ctx *ctx, const void *ptr)
{
    int k = block_at(ctx, (uintptr_t)ptr);
    if (k == ctx->n_blocks || ctx->blocks[k].lo != (uintptr_t)ptr) return;
    memmove(&ctx->blocks[k], &ctx->blocks[k + 1],
            (size_t)(ctx->n_blocks - k - 1) * sizeof *ctx->blocks);
    ctx->n_blocks--;
}

/* GP_OK, or the error of a copy or send from src (on t->dev's src_dev)
 * behind an event recorded before src's block was handed out (g_lock
 * held). */
static gp_status check_wait(const copy_item *t, gp_device *src_dev, const char *what)
{
    const cpu_event *e = t->after;
    if (!e || !e->recorded || e->rec_dev != src_dev || !t->src || !t->bytes) return GP_OK;
    const gp_cpu_ctx *ctx = gp_cpu_ctx_of(src_dev);
    uintptr_t p = (uintptr_t)t->src;
    int k = block_at(ctx, p);
    if (k == ctx->n_blocks || ctx->blocks[k].lo > p || ctx->blocks[k].epoch < e->rec_epoch)
        return GP_OK;
    char b[32];
    return gp_error_set(GP_ERR_RUNTIME,
                        "internal error: a %s from %s%s%s reads %s from byte %zu of a buffer "
                        "allocated after the event it waits on was recorded (record %llu of "
                        "%s's compute stream; the buffer came after record %llu): on a GPU it "
                        "could read the buffer before it is written; it must wait on the event "
                        "recorded after its producer (GPIPE_CPU_STREAMS's checker, "
                        "cpu_streams.c)",
                        what, src_dev->name, t->chan ? "" : " to ", t->chan ? "" : t->dev->name,
                        gp_format_bytes(t->bytes, b, sizeof b), (size_t)(p - ctx->blocks[k].lo),
                        (unsigned long long)e->rec_epoch, src_dev->name,
                        (unsigned long long)ctx->blocks[k].epoch);
}

/* A copy of item t (reading src_dev's memory) queued on its stream:
 * `after` waited for as recorded now, `done` recorded once more (CUDA's
 * semantics, the file's head), unless the checker finds the wait missing. */
static gp_status enqueue(const copy_item *t, gp_device *src_dev, const char *what)
{
    copy_item *it = calloc(1, sizeof *it);
    if (!it) return gp_error_set(GP_ERR_OOM, "out of host memory queueing a %s", what);
    *it = *t;
    pthread_mutex_lock(&g_lock);
    gp_status st = check_wait(it, src_dev, what);
    if (st != GP_OK) {
        pthread_mutex_unlock(&g_lock);
        free(it);
        return st;
    }
    if (it->after) it->after_target = it->after->recorded;
    if (it->done) {
        it->done_target = ++it->done->recorded;
        it->done->rec_dev = NULL; /* a copy stream's record: unchecked */
    }
    append_locked(it);
    pthread_mutex_unlock(&g_lock);
    return GP_OK;
}

static copy_item *next_for(const void *stream)
{
    for (copy_item *it = g_head; it; it = it->next)
        if (it->stream == stream && !it->started) return it;
    return NULL;
}

/* A channel: its end's queue (items with stream == the channel), run by
 * chan_thread. */
struct cpu_chan {
    gp_device *dev;
    gp_chan_desc d;
    pthread_t thread;
    bool stop;            /* under g_lock */
    gp_status failed;     /* the transport's first error (under g_lock) */
    char why[256];
    _Atomic int cancel;   /* closed after a failure: a transfer under way gives up */
};

/* The transfer of a channel item, outside g_lock. */
static gp_status chan_transfer(cpu_chan *ch, copy_item *it)
{
    return it->src ? ch->d.host_send(ch->d.arg, it->src, it->bytes, &ch->cancel)
                   : ch->d.host_recv(ch->d.arg, it->dst, it->bytes, &ch->cancel);
}

/* The loop of a stream's thread: a device's copy stream (ch NULL) or a
 * channel's. */
static void run_stream(gp_device *dev, cpu_chan *ch)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    const void *stream = ch ? (const void *)ch : (const void *)dev;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        copy_item *it = next_for(stream);
        if (!it) {
            if (ch ? ch->stop : ctx->copy_stop) break;
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
        /* (a zero-byte item only records `done`: it has nothing to hold back) */
        if (ctx->copy_delay_us > 0 && (ch || it->bytes)) {
            struct timespec ts = {ctx->copy_delay_us / 1000000,
                                  (ctx->copy_delay_us % 1000000) * 1000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        }
        gp_status st = GP_OK;
        if (ch) { /* (a close may have failed the channel while it waited) */
            pthread_mutex_lock(&g_lock);
            st = ch->failed;
            pthread_mutex_unlock(&g_lock);
            if (st == GP_OK) st = chan_transfer(ch, it);
        }
        else if (it->bytes && it->dst != it->src) memcpy(it->dst, it->src, it->bytes);
        char why[sizeof ch->why] = "";
        if (st != GP_OK) snprintf(why, sizeof why, "%s", gp_last_error());
        pthread_mutex_lock(&g_lock);
        if (st != GP_OK && ch->failed == GP_OK) { /* said by the next call on it */
            ch->failed = st;
            snprintf(ch->why, sizeof ch->why, "%s", why);
            if (ctx->chan_failed == GP_OK) { /* and by the step's synchronize */
                ctx->chan_failed = st;
                snprintf(ctx->chan_why, sizeof ctx->chan_why, "channel %s: %s", ch->d.name, why);
            }
        }
        if (it->done && it->done->completed < it->done_target)
            it->done->completed = it->done_target;
        unlink_item(it);
        free(it);
        pthread_cond_broadcast(&g_cond);
    }
    pthread_mutex_unlock(&g_lock);
}

static void *copy_thread(void *arg)
{
    run_stream(arg, NULL);
    return NULL;
}

gp_status gp_cpu_streams_start(gp_device *dev)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    int e = pthread_create(&ctx->copy_thread, NULL, copy_thread, dev);
    char why[300];
    if (e != 0)
        return gp_error_set(GP_ERR_RUNTIME, "device %s: cannot start its copy stream's thread: "
                            "%s", dev->name, gp_thread_error(e, why, sizeof why));
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
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    if (!ctx->streams) return;
    wait_unused(touches, &(mem_range){ptr, bytes});
    pthread_mutex_lock(&g_lock);
    block_forget(ctx, ptr);
    pthread_mutex_unlock(&g_lock);
}

gp_status gp_cpu_synchronize(gp_device *dev)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    if (!ctx->streams) return GP_OK; /* the work is done when a call returns */
    wait_unused(runs_on, dev);
    /* a channel's transfer that failed (its peer gone): the step failed */
    pthread_mutex_lock(&g_lock);
    gp_status st = ctx->chan_failed;
    char why[sizeof ctx->chan_why];
    memcpy(why, ctx->chan_why, sizeof why);
    pthread_mutex_unlock(&g_lock);
    return st == GP_OK ? GP_OK : gp_error_set(st, "device %s: %s", dev->name, why);
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
    return enqueue(&(copy_item){.dev = dev, .stream = dev, .dst = dst, .src = src,
                                .bytes = bytes, .after = after, .done = done},
                   src_dev, "copy");
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
    if (!ev) return GP_OK;
    cpu_event *e = ev;
    pthread_mutex_lock(&g_lock);
    e->completed = ++e->recorded;
    e->rec_dev = dev;
    e->rec_epoch = ++gp_cpu_ctx_of(dev)->epoch;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    return GP_OK;
}

gp_status gp_cpu_event_query(gp_device *dev, void *ev, bool *done)
{
    (void)dev;
    *done = true;
    if (!ev) return GP_OK;
    cpu_event *e = ev;
    pthread_mutex_lock(&g_lock);
    *done = e->completed >= e->recorded;
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
    it->stream = dev;
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

/* ---- channels to other processes ------------------------------------------- */

static void *chan_thread(void *arg)
{
    cpu_chan *ch = arg;
    run_stream(ch->dev, ch);
    return NULL;
}

gp_status gp_cpu_chan_open(gp_device *dev, const gp_chan_desc *d, void **out)
{
    *out = NULL;
    if (!gp_cpu_ctx_of(dev)->streams)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: channels to other processes need "
                            "GPIPE_CPU_STREAMS=threads", dev->name);
    if (!d->host_send || !d->host_recv)
        return gp_error_set(GP_ERR_INVALID, "device %s: channel %s has no host transport",
                            dev->name, d->name);
    cpu_chan *ch = calloc(1, sizeof *ch);
    if (!ch) return gp_error_set(GP_ERR_OOM, "out of host memory for a channel");
    ch->dev = dev;
    ch->d = *d;
    int e = pthread_create(&ch->thread, NULL, chan_thread, ch);
    if (e != 0) {
        free(ch);
        char why[300];
        return gp_error_set(GP_ERR_RUNTIME, "device %s: cannot start the thread of channel %s: "
                            "%s", dev->name, d->name, gp_thread_error(e, why, sizeof why));
    }
    *out = ch;
    return GP_OK;
}

/* A channel's first failure, as the error of the call that finds it. */
static gp_status chan_failed(cpu_chan *ch)
{
    pthread_mutex_lock(&g_lock);
    gp_status st = ch->failed;
    char why[sizeof ch->why];
    memcpy(why, ch->why, sizeof why);
    pthread_mutex_unlock(&g_lock);
    return st == GP_OK ? GP_OK
                       : gp_error_set(st, "device %s, channel %s: %s", ch->dev->name,
                                      ch->d.name, why);
}

static gp_status chan_enqueue(gp_device *dev, cpu_chan *ch, const float *src, float *dst,
                              int64_t n, void *after, void *done)
{
    GP_TRY(chan_failed(ch));
    return enqueue(&(copy_item){.dev = dev, .stream = ch, .chan = ch, .dst = dst, .src = src,
                                .bytes = (size_t)(n > 0 ? n : 0) * sizeof(float),
                                .after = after, .done = done},
                   dev, src ? "send" : "receive");
}

gp_status gp_cpu_chan_send(gp_device *dev, void *ch, const float *buf, int64_t n, void *after,
                           void *done)
{
    return chan_enqueue(dev, ch, buf, NULL, n, after, done);
}

gp_status gp_cpu_chan_recv(gp_device *dev, void *ch, float *buf, int64_t n, void *done)
{
    return chan_enqueue(dev, ch, NULL, buf, n, NULL, done);
}

void gp_cpu_chan_close(gp_device *dev, void *chp, bool abort)
{
    (void)dev;
    cpu_chan *ch = chp;
    pthread_mutex_lock(&g_lock);
    ch->stop = true; /* after what is queued */
    if (abort && ch->failed == GP_OK) { /* what is queued completes untransferred */
        ch->failed = GP_ERR_CANCELLED;
        snprintf(ch->why, sizeof ch->why, "closed after a failure");
    }
    /* and a transfer under way gives up: its peer may never come (it waits
     * for what was queued here), and the step's cleanup waits for it */
    if (abort) ch->cancel = 1;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    /* (a transfer under way gives up on the cancel: the host transports
     * poll it, so the thread ends whether or not its peer ever comes) */
    pthread_join(ch->thread, NULL);
    free(ch);
}
