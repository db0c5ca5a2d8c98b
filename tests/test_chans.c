/*
 * test_chans.c — channels to another process's device (backend.h,
 * chan_open) on the CPU backend, in one process: a "wire" in this file
 * plays the process transport with the rendezvous NCCL's point-to-point
 * has (a send returns only once its receive has taken the data), so every
 * property below would fail if the channel code did not hold it:
 *
 *   - data arrives whole and in order, one channel per flow, two flows
 *     in opposite directions at once (the interleaved schedule's case);
 *   - a send waits for its `after` event: behind a delayed copy into its
 *     buffer, it sends the copied data, not what was there before;
 *   - a send's `done` completes only once the peer has received; a
 *     receive's `done` is what the reader waits for;
 *   - a free of a buffer waits for the channel transfer that reads or
 *     writes it, and synchronize waits for the device's channels;
 *   - a transport failure is reported by the device's synchronize and by
 *     the next call on the channel, naming the channel, not a hang;
 *   - a channel closed after a failure cancels the receive under way, so
 *     synchronize and the free of its buffer return (they waited forever
 *     for a peer that would never send);
 *   - a device without streams run by threads has no channels.
 *
 * The pipeline's use of channels across processes (bit-equal losses on
 * every schedule) is tests/test_procs.py's; this runs under
 * ThreadSanitizer in CI (label "threads").
 */
#include "backend/backend.h"
#include "test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One direction of one flow: the sender parks its buffer, the receiver
 * copies it out and releases the sender. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    const void *buf;
    size_t bytes;
    bool full, taken;
    int sends, recvs;
    bool fail_next; /* the next send fails (a peer gone) */
} wire;

static void wire_init(wire *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
}

static void wire_destroy(wire *w)
{
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
}

/* A wait on the wire that gives up once the channel is cancelled (as the
 * process transport's polling does): 1 ms at a time.  True: cancelled. */
static bool wire_wait(wire *w, const _Atomic int *cancel)
{
    if (cancel && *cancel) return true;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&w->cond, &w->lock, &ts);
    return false;
}

static gp_status wire_send(void *arg, const void *buf, size_t bytes, const _Atomic int *cancel)
{
    wire *w = arg;
    pthread_mutex_lock(&w->lock);
    if (w->fail_next) {
        w->fail_next = false;
        pthread_mutex_unlock(&w->lock);
        return gp_error_set(GP_ERR_RUNTIME, "the wire is cut");
    }
    while (w->full)
        if (wire_wait(w, cancel)) {
            pthread_mutex_unlock(&w->lock);
            return gp_error_set(GP_ERR_CANCELLED, "the send was cancelled");
        }
    w->buf = buf;
    w->bytes = bytes;
    w->full = true;
    w->taken = false;
    pthread_cond_broadcast(&w->cond);
    while (!w->taken) pthread_cond_wait(&w->cond, &w->lock); /* the rendezvous (the
                                                                  test's peers all come) */
    w->full = false;
    w->sends++;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    return GP_OK;
}

static gp_status wire_recv(void *arg, void *buf, size_t bytes, const _Atomic int *cancel)
{
    wire *w = arg;
    pthread_mutex_lock(&w->lock);
    while (!w->full || w->taken)
        if (wire_wait(w, cancel)) {
            pthread_mutex_unlock(&w->lock);
            return gp_error_set(GP_ERR_CANCELLED, "the receive was cancelled");
        }
    gp_status st = GP_OK;
    if (w->bytes != bytes) st = gp_error_set(GP_ERR_RUNTIME, "%zu bytes, want %zu", w->bytes, bytes);
    else memcpy(buf, w->buf, bytes);
    w->taken = true;
    w->recvs++;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    return st;
}

static int wire_count(wire *w, bool sends)
{
    pthread_mutex_lock(&w->lock);
    int n = sends ? w->sends : w->recvs;
    pthread_mutex_unlock(&w->lock);
    return n;
}

static gp_chan_desc desc(bool sender, wire *w, const char *name)
{
    gp_chan_desc d = {.sender = sender, .host_send = wire_send, .host_recv = wire_recv,
                      .arg = w};
    snprintf(d.name, sizeof d.name, "%s", name);
    return d;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void fill(float *x, int n, float base)
{
    for (int i = 0; i < n; i++) x[i] = base + (float)i;
}

static bool is(const float *x, int n, float base)
{
    for (int i = 0; i < n; i++)
        if (x[i] != base + (float)i) return false;
    return true;
}

enum { N = 4096, K = 4 };

/* Two devices, a flow each way, K transfers per flow. */
static void test_flows(gp_device *a, gp_device *b)
{
    wire ab, ba;
    wire_init(&ab);
    wire_init(&ba);
    gp_chan_desc d1 = desc(true, &ab, "a -> b"), d2 = desc(false, &ab, "a -> b");
    gp_chan_desc d3 = desc(true, &ba, "b -> a"), d4 = desc(false, &ba, "b -> a");
    void *a_out = NULL, *b_in = NULL, *b_out = NULL, *a_in = NULL;
    CHECK_OK(gp_dev_chan_open(a, &d1, &a_out));
    CHECK_OK(gp_dev_chan_open(b, &d2, &b_in));
    CHECK_OK(gp_dev_chan_open(b, &d3, &b_out));
    CHECK_OK(gp_dev_chan_open(a, &d4, &a_in));
    if (!a_out || !b_in || !b_out || !a_in) goto out;
    size_t bytes = N * sizeof(float);
    void *src[K], *dst[K], *bsrc[K], *adst[K], *sent[K], *got[K], *bsent[K], *agot[K];
    for (int k = 0; k < K; k++) {
        CHECK_OK(gp_dev_alloc(a, bytes, GP_MEM_ACTIVATIONS, &src[k]));
        CHECK_OK(gp_dev_alloc(b, bytes, GP_MEM_COPIES, &dst[k]));
        CHECK_OK(gp_dev_alloc(b, bytes, GP_MEM_ACTIVATIONS, &bsrc[k]));
        CHECK_OK(gp_dev_alloc(a, bytes, GP_MEM_COPIES, &adst[k]));
        CHECK_OK(gp_dev_event_create(a, &sent[k]));
        CHECK_OK(gp_dev_event_create(b, &got[k]));
        CHECK_OK(gp_dev_event_create(b, &bsent[k]));
        CHECK_OK(gp_dev_event_create(a, &agot[k]));
        fill(src[k], N, 1000.0f * (float)k);
        fill(bsrc[k], N, -1000.0f * (float)(k + 1));
        memset(dst[k], 0, bytes);
        memset(adst[k], 0, bytes);
    }
    /* both directions' sends first, as two stages of an interleaved
     * schedule do: with one stream per device they would wait for each
     * other's receives; with a channel per flow they do not */
    for (int k = 0; k < K; k++) {
        CHECK_OK(gp_dev_chan_send(a, a_out, src[k], N, NULL, sent[k]));
        CHECK_OK(gp_dev_chan_send(b, b_out, bsrc[k], N, NULL, bsent[k]));
    }
    /* no receive yet: a rendezvous send has not completed */
    sleep_ms(20);
    bool done = true;
    CHECK_OK(gp_dev_event_query(a, sent[0], &done));
    CHECK(!done);
    CHECK(wire_count(&ab, true) == 0);
    for (int k = 0; k < K; k++) {
        CHECK_OK(gp_dev_chan_recv(b, b_in, dst[k], N, got[k]));
        CHECK_OK(gp_dev_chan_recv(a, a_in, adst[k], N, agot[k]));
    }
    for (int k = 0; k < K; k++) {
        CHECK_OK(gp_dev_event_wait(b, got[k]));
        CHECK_MSG(is(dst[k], N, 1000.0f * (float)k), "a -> b transfer %d", k);
        CHECK_OK(gp_dev_event_wait(a, agot[k]));
        CHECK_MSG(is(adst[k], N, -1000.0f * (float)(k + 1)), "b -> a transfer %d", k);
        CHECK_OK(gp_dev_event_sync(a, sent[k]));
        CHECK_OK(gp_dev_event_query(a, sent[k], &done));
        CHECK(done);
        /* a send ends after its receive: its count only once it is done */
        CHECK_OK(gp_dev_event_sync(b, bsent[k]));
    }
    CHECK(wire_count(&ab, true) == K && wire_count(&ab, false) == K);
    CHECK(wire_count(&ba, true) == K && wire_count(&ba, false) == K);

    /* `after`: a copy on a's copy stream (held back by the delay) writes
     * src[0]; a send behind its event sends the copy's data */
    fill(src[1], N, 77.0f);
    fill(src[0], N, 5.0f);
    CHECK_OK(gp_dev_copy_async(a, src[0], a, src[1], bytes, NULL, sent[1]));
    CHECK_OK(gp_dev_chan_send(a, a_out, src[0], N, sent[1], sent[0]));
    CHECK_OK(gp_dev_chan_recv(b, b_in, dst[0], N, got[0]));
    CHECK_OK(gp_dev_event_wait(b, got[0]));
    CHECK_MSG(is(dst[0], N, 77.0f), "the send did not wait for its `after` copy");

    /* a free of a buffer under a send waits for the send (which waits for
     * its receive, posted 30 ms later from another thread's view: here,
     * the receive is queued first on b, the free then must wait) */
    fill(src[2], N, 9.0f);
    CHECK_OK(gp_dev_chan_recv(b, b_in, dst[2], N, got[2]));
    CHECK_OK(gp_dev_chan_send(a, a_out, src[2], N, NULL, NULL));
    gp_dev_free(a, src[2], bytes, GP_MEM_ACTIVATIONS); /* waits for the send */
    src[2] = NULL;
    CHECK_OK(gp_dev_alloc(a, bytes, GP_MEM_ACTIVATIONS, &src[2])); /* the same block back */
    if (src[2]) fill(src[2], N, -9.0f);
    CHECK_OK(gp_dev_synchronize(b));
    CHECK_MSG(is(dst[2], N, 9.0f), "a buffer freed under its send was overwritten first");
    CHECK_OK(gp_dev_synchronize(a));
    CHECK_OK(gp_dev_synchronize(b));

    /* a transport failure: reported, with the channel's name, by the
     * device's synchronize and by the next call on that channel */
    pthread_mutex_lock(&ab.lock);
    ab.fail_next = true;
    pthread_mutex_unlock(&ab.lock);
    CHECK_OK(gp_dev_chan_send(a, a_out, src[3], N, NULL, sent[3]));
    gp_status st = gp_dev_synchronize(a);
    CHECK(st == GP_ERR_RUNTIME);
    CHECK_MSG(strstr(gp_last_error(), "a -> b") && strstr(gp_last_error(), "wire is cut"),
              "%s", gp_last_error());
    st = gp_dev_chan_send(a, a_out, src[3], N, NULL, NULL);
    CHECK(st == GP_ERR_RUNTIME);
    gp_error_clear();
    for (int k = 0; k < K; k++) {
        gp_dev_free(a, src[k], bytes, GP_MEM_ACTIVATIONS);
        gp_dev_free(b, dst[k], bytes, GP_MEM_COPIES);
        gp_dev_free(b, bsrc[k], bytes, GP_MEM_ACTIVATIONS);
        gp_dev_free(a, adst[k], bytes, GP_MEM_COPIES);
        gp_dev_event_destroy(a, sent[k]);
        gp_dev_event_destroy(b, got[k]);
        gp_dev_event_destroy(b, bsent[k]);
        gp_dev_event_destroy(a, agot[k]);
    }
out:
    gp_dev_chan_close(a, a_out, false);
    gp_dev_chan_close(b, b_in, false);
    gp_dev_chan_close(b, b_out, false);
    gp_dev_chan_close(a, a_in, false);
    wire_destroy(&ab);
    wire_destroy(&ba);
}

/* A failure while a receive waits for a peer that will never send (it
 * waits in turn for something this side dropped): closing the channel with
 * abort cancels the receive under way, so the device's synchronize and the
 * free of the receive's buffer return instead of waiting for it forever
 * (the failing process must get on to ending the run). */
static void test_abort_under_way(gp_device *b)
{
    wire w;
    wire_init(&w);
    gp_chan_desc d = desc(false, &w, "activations of stage 0 -> 1");
    void *in = NULL;
    CHECK_OK(gp_dev_chan_open(b, &d, &in));
    if (!in) return;
    enum { M = 64 };
    size_t bytes = M * sizeof(float);
    void *dst = NULL, *got = NULL;
    CHECK_OK(gp_dev_alloc(b, bytes, GP_MEM_COPIES, &dst));
    CHECK_OK(gp_dev_event_create(b, &got));
    CHECK_OK(gp_dev_chan_recv(b, in, dst, M, got));
    struct timespec nap = {0, 20000000}; /* the copy delay, then its transfer waits */
    nanosleep(&nap, NULL);
    double t0 = gp_now();
    gp_dev_chan_close(b, in, true);
    /* (the abort is the failure's echo, said already: synchronize need
     * not say it again; before, each of these three waited forever) */
    (void)gp_dev_synchronize(b);
    gp_dev_event_destroy(b, got);
    gp_dev_free(b, dst, bytes, GP_MEM_COPIES);
    double dt = gp_now() - t0;
    CHECK_MSG(dt < 5.0, "an aborted channel's receive held the device for %.1f s", dt);
    CHECK(b->alloc.cur_by[GP_MEM_COPIES] == 0);
    gp_error_clear();
    wire_destroy(&w);
}

int main(void)
{
    gp_log_set_level(GP_LOG_WARN);
    gp_device_opts o = {.threads = 1};
    gp_device *sync_dev = NULL, *a = NULL, *b = NULL;
    CHECK_OK(gp_device_open("cpu:0", &o, &sync_dev));
    if (sync_dev) { /* the default, synchronous CPU device: no channels */
        CHECK(!gp_dev_has_chans(sync_dev));
        wire w;
        wire_init(&w);
        gp_chan_desc d = desc(true, &w, "none");
        void *ch = &ch;
        CHECK(gp_dev_chan_open(sync_dev, &d, &ch) == GP_ERR_UNSUPPORTED);
        CHECK(ch == NULL);
        gp_error_clear();
        wire_destroy(&w);
    }
    setenv("GPIPE_CPU_STREAMS", "threads", 1);
    setenv("GPIPE_CPU_COPY_DELAY_US", "5000", 1);
    CHECK_OK(gp_device_open("cpu:1", &o, &a));
    CHECK_OK(gp_device_open("cpu:2", &o, &b));
    unsetenv("GPIPE_CPU_STREAMS");
    unsetenv("GPIPE_CPU_COPY_DELAY_US");
    if (a && b) {
        CHECK(gp_dev_has_chans(a) && gp_dev_has_chans(b));
        test_flows(a, b);
        CHECK(a->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0 && b->alloc.cur_by[GP_MEM_COPIES] == 0);
        test_abort_under_way(b);
    }
    gp_device_close(a);
    gp_device_close(b);
    gp_device_close(sync_dev);
    return gpt_finish("test_chans");
}
