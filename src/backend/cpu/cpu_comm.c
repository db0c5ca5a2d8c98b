/*
 * cpu_comm.c — collectives between CPU devices: all-reduce and broadcast
 * among the devices' worker threads, over the ranks' own buffers.
 *
 * Every rank calls from its own thread with its own buffer (backend.h).
 * All-reduce is a reduce-scatter followed by an all-gather, with no
 * gathering thread: the buffer is cut into n chunks (sizes differ by at
 * most one element, so any length works), rank r sums chunk r over all
 * ranks' buffers into its own buffer, in rank order 0, 1, ..., n-1, then
 * every rank copies every other chunk from its owner.  Each element is
 * therefore added in the same fixed order whatever the thread timing, and
 * every rank ends with bitwise the same result.  Work and memory traffic
 * are spread evenly: each rank reads n chunks and writes one in the first
 * phase, and copies n - 1 chunks in the second.  reduce_scatter and
 * all_gather are the two phases on their own (each between two barriers),
 * for the sharded optimizer update that runs between them.  sharded_sgd
 * fuses all three for one parameter: rank r walks its chunk once, and for
 * every element sums the ranks' gradients, updates its w and momentum and
 * streams the new w into every peer's buffer (2R + 3 passes over the
 * chunk's memory instead of 3R + 4, 7 instead of 10 for R = 2; see
 * sharded_sgd_span).
 *
 *     enter: publish buffer ─ barrier ─ reduce own chunk ─ barrier ─
 *            copy the others' chunks ─ barrier ─ return
 *
 * The barriers are one mutex + condition variable with a generation count.
 * The first makes every buffer ready before anyone reads it; the last keeps
 * every buffer alive and unchanged until nobody reads it any more.
 *
 * Cancellation.  abort() (from any thread, e.g. a failing replica) wakes
 * every rank blocked in a barrier and makes it, and any rank that enters
 * later, return GP_ERR_CANCELLED.  A rank released that way must not let
 * its caller free a buffer that a peer is still reading in the middle of a
 * phase, so `readers` counts the ranks inside a reading phase (set for all
 * ranks at once by the rank completing the barrier, cleared by each at its
 * next barrier) and a cancelled rank returns only when it is zero.  Phases
 * never block, so that wait is short.  reset() re-arms the comm between
 * steps.
 *
 * Shared state: everything in cpu_comm is guarded by `lock`, except the
 * buffers' contents, which are ordered by the barriers.
 */
#include "backend/cpu/cpu_impl.h"

#include "backend/elementwise.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

typedef struct cpu_comm {
    pthread_mutex_t lock;
    pthread_cond_t cond;      /* a barrier completed, readers changed or abort */
    int arrived;              /* ranks waiting at the current barrier */
    uint64_t generation;      /* barriers completed so far */
    int readers;              /* ranks inside a phase that reads peers' buffers */
    bool aborted;
    float **bufs;             /* (n) each rank's buffer in the current collective */
    float **bufs2;            /* (n) sharded_sgd: each rank's parameter buffer */
    int64_t *counts;          /* (n) each rank's element count, checked equal */
} cpu_comm;

static void comm_destroy(gp_comm *comm)
{
    cpu_comm *cc = comm->ctx;
    if (cc) {
        pthread_mutex_destroy(&cc->lock);
        pthread_cond_destroy(&cc->cond);
        free(cc->bufs);
        free(cc->bufs2);
        free(cc->counts);
        free(cc);
    }
    free(comm->devs);
    free(comm);
}

static void comm_abort(gp_comm *comm)
{
    cpu_comm *cc = comm->ctx;
    pthread_mutex_lock(&cc->lock);
    cc->aborted = true;
    pthread_cond_broadcast(&cc->cond);
    pthread_mutex_unlock(&cc->lock);
}

static void comm_reset(gp_comm *comm)
{
    cpu_comm *cc = comm->ctx;
    pthread_mutex_lock(&cc->lock);
    cc->aborted = false;
    cc->arrived = 0;
    cc->readers = 0;
    pthread_mutex_unlock(&cc->lock);
}

gp_status gp_cpu_comm_create(gp_device **devs, int n, gp_comm **out)
{
    *out = NULL;
    for (int a = 0; a < n; a++) {
        if (devs[a]->kind != GP_DEV_CPU)
            return gp_error_set(GP_ERR_INVALID, "CPU communicator: %s is not a CPU device",
                                devs[a]->name);
        for (int b = 0; b < a; b++)
            if (devs[a] == devs[b])
                return gp_error_set(GP_ERR_INVALID, "CPU communicator: %s appears twice; a "
                                    "group needs distinct devices", devs[a]->name);
    }
    gp_comm *comm = calloc(1, sizeof *comm);
    cpu_comm *cc = calloc(1, sizeof *cc);
    if (comm) {
        comm->devs = calloc((size_t)n, sizeof *comm->devs);
        comm->destroy = comm_destroy;
        comm->abort = comm_abort;
        comm->reset = comm_reset;
        comm->n = n;
    }
    if (cc) {
        cc->bufs = calloc((size_t)n, sizeof *cc->bufs);
        cc->bufs2 = calloc((size_t)n, sizeof *cc->bufs2);
        cc->counts = calloc((size_t)n, sizeof *cc->counts);
    }
    if (!comm || !cc || !comm->devs || !cc->bufs || !cc->bufs2 || !cc->counts) {
        if (cc) {
            free(cc->bufs);
            free(cc->bufs2);
            free(cc->counts);
            free(cc);
        }
        if (comm) free(comm->devs);
        free(comm);
        return gp_error_set(GP_ERR_OOM, "out of host memory creating a communicator");
    }
    pthread_mutex_init(&cc->lock, NULL);
    pthread_cond_init(&cc->cond, NULL);
    for (int r = 0; r < n; r++) comm->devs[r] = devs[r];
    comm->ctx = cc;
    *out = comm;
    return GP_OK;
}

/* Wait until all n ranks have arrived.  reading: whether this rank was in a
 * reading phase before (it leaves it now); read_after: whether the ranks
 * read peers' buffers after this barrier. */
static gp_status barrier(cpu_comm *cc, int n, bool reading, bool read_after)
{
    pthread_mutex_lock(&cc->lock);
    if (reading) {
        cc->readers--;
        pthread_cond_broadcast(&cc->cond);
    }
    if (!cc->aborted) {
        uint64_t gen = cc->generation;
        if (++cc->arrived == n) {
            cc->arrived = 0;
            cc->generation++;
            if (read_after) cc->readers += n;
            pthread_cond_broadcast(&cc->cond);
        } else {
            while (!cc->aborted && cc->generation == gen) pthread_cond_wait(&cc->cond, &cc->lock);
        }
        if (cc->generation != gen) { /* completed, even if an abort followed */
            pthread_mutex_unlock(&cc->lock);
            return GP_OK;
        }
    }
    /* Aborted: return only when no peer still reads a buffer (ours may be
     * freed by our caller as soon as we return). */
    while (cc->readers > 0) pthread_cond_wait(&cc->cond, &cc->lock);
    pthread_mutex_unlock(&cc->lock);
    return gp_error_set(GP_ERR_CANCELLED, "collective cancelled: another rank failed");
}

static gp_status enter(gp_device *dev, gp_comm *comm, float *buf, float *buf2, int64_t n,
                       int *rank)
{
    *rank = gp_comm_rank(comm, dev);
    if (!comm || *rank < 0 || comm->destroy != comm_destroy)
        return gp_error_set(GP_ERR_INVALID, "device %s is not in this CPU communicator",
                            dev->name);
    cpu_comm *cc = comm->ctx;
    /* Only this rank writes its slots; peers read them after the barrier. */
    pthread_mutex_lock(&cc->lock);
    cc->bufs[*rank] = buf;
    cc->bufs2[*rank] = buf2;
    cc->counts[*rank] = n;
    pthread_mutex_unlock(&cc->lock);
    return GP_OK;
}

/* Chunk `me` of buf = the sum of chunk `me` over the ranks' buffers, in rank
 * order (after a barrier that published every buffer). */
static void reduce_own_chunk(gp_device *dev, cpu_comm *cc, int R, int me, float *buf,
                             int64_t n)
{
    float *const *b = cc->bufs;
    int64_t lo, hi;
    gp_comm_chunk(n, R, me, &lo, &hi);
    int nt = dev->threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && hi - lo >= 65536)
    for (int64_t e = lo; e < hi; e++) {
        float s = b[0][e];
        for (int q = 1; q < R; q++) s += b[q][e];
        buf[e] = s;
    }
}

/* Every chunk but `me` of buf from its owner's buffer. */
static void gather_chunks(cpu_comm *cc, int R, int me, float *buf, int64_t n)
{
    for (int q = 0; q < R; q++) {
        if (q == me) continue;
        int64_t qlo, qhi;
        gp_comm_chunk(n, R, q, &qlo, &qhi);
        if (qhi > qlo) memcpy(buf + qlo, cc->bufs[q] + qlo, (size_t)(qhi - qlo) * sizeof *buf);
    }
}

/* enter + the first barrier of every collective; *R == 1: nothing to do. */
static gp_status start(gp_device *dev, gp_comm *comm, float *buf, float *buf2, int64_t n,
                       int *me, int *R)
{
    gp_cpu_enter(dev);
    GP_TRY(enter(dev, comm, buf, buf2, n, me));
    *R = comm->n;
    if (*R == 1) return GP_OK;
    cpu_comm *cc = comm->ctx;
    GP_TRY(barrier(cc, *R, false, true));
    for (int q = 0; q < *R; q++) GP_ASSERT(cc->counts[q] == n); /* same n everywhere */
    return GP_OK;
}

gp_status gp_cpu_allreduce(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    int me, R;
    GP_TRY(start(dev, comm, buf, NULL, n, &me, &R));
    if (R == 1) return GP_OK;
    cpu_comm *cc = comm->ctx;
    reduce_own_chunk(dev, cc, R, me, buf, n);
    GP_TRY(barrier(cc, R, true, true));
    gather_chunks(cc, R, me, buf, n);
    return barrier(cc, R, true, false);
}

/* reduce_scatter and all_gather: one phase between two barriers (the last
 * one: nobody changes a buffer while a peer still reads its chunk). */
static gp_status one_phase(gp_device *dev, gp_comm *comm, float *buf, int64_t n, bool reduce)
{
    int me, R;
    GP_TRY(start(dev, comm, buf, NULL, n, &me, &R));
    if (R == 1) return GP_OK;
    cpu_comm *cc = comm->ctx;
    if (reduce) reduce_own_chunk(dev, cc, R, me, buf, n);
    else gather_chunks(cc, R, me, buf, n);
    return barrier(cc, R, true, false);
}

gp_status gp_cpu_reduce_scatter(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    return one_phase(dev, comm, buf, n, true);
}

gp_status gp_cpu_all_gather(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    return one_phase(dev, comm, buf, n, false);
}

/* The fused sharded SGD step over elements [e0, e1) of rank me's chunk, in
 * one pass: per element the gradient sum over the R ranks' gs (rank order,
 * as reduce_own_chunk), gp_ew_sgd's update of w and v with it, and the new
 * w stored into every peer's ws[q].  On x86-64 the loop runs four floats at
 * a time with SSE (part of the base ISA) in the same operation order as
 * gp_ew_sgd, so the results are bitwise those of the scalar code, and the
 * peers' copies are written with non-temporal stores: they bypass this
 * core's cache, so the push costs one pass over the chunk instead of a
 * read-for-ownership plus a write-back.  A single pass with streaming
 * stores measured 22 ms against 31 ms for the same step done block-wise
 * (sum, update, memcpy) on one rank's 54 MB chunk (bench/README.md). */
/* Element e of sharded_sgd_span, scalar: the head and tail around the
 * vector loop, and all of it without SSE. */
static inline void sharded_sgd_elem(float *const *gs, float *const *ws, int R, int me, float *w,
                                    float *v, int64_t lo, int64_t e, float lr, float mu,
                                    float wd, int nesterov)
{
    float sum = gs[0][e], t = 0.0f; /* t: v's place for plain SGD (v NULL) */
    for (int q = 1; q < R; q++) sum += gs[q][e];
    gp_ew_sgd(&w[e], sum, v ? &v[e - lo] : &t, lr, mu, wd, nesterov);
    for (int q = 0; q < R; q++)
        if (q != me) ws[q][e] = w[e];
}

static void sharded_sgd_span(float *const *gs, float *const *ws, int R, int me, float *w,
                             float *v, int64_t lo, int64_t e0, int64_t e1, float lr, float mu,
                             float wd, int nesterov)
{
    int64_t e = e0;
#if defined(__SSE2__)
    for (; e < e1 && ((uintptr_t)(w + e) & 15); e++) /* scalar up to w's alignment */
        sharded_sgd_elem(gs, ws, R, me, w, v, lo, e, lr, mu, wd, nesterov);
    const __m128 vlr = _mm_set1_ps(lr), vmu = _mm_set1_ps(mu), vwd = _mm_set1_ps(wd);
    for (; e + 4 <= e1; e += 4) {
        __m128 g = _mm_loadu_ps(gs[0] + e);
        for (int q = 1; q < R; q++) g = _mm_add_ps(g, _mm_loadu_ps(gs[q] + e));
        __m128 wv = _mm_load_ps(w + e);
        __m128 gg = _mm_add_ps(g, _mm_mul_ps(vwd, wv));         /* g + wd w */
        __m128 vo = v ? _mm_loadu_ps(v + (e - lo)) : _mm_setzero_ps();
        __m128 vv = _mm_add_ps(_mm_mul_ps(vmu, vo), gg); /* mu v + g' */
        if (v) _mm_storeu_ps(v + (e - lo), vv);
        __m128 step = nesterov ? _mm_add_ps(gg, _mm_mul_ps(vmu, vv)) : vv;
        wv = _mm_sub_ps(wv, _mm_mul_ps(vlr, step));
        _mm_store_ps(w + e, wv);
        for (int q = 0; q < R; q++) {
            if (q == me) continue;
            float *d = ws[q] + e;
            if ((uintptr_t)d & 15) _mm_storeu_ps(d, wv);
            else _mm_stream_ps(d, wv);
        }
    }
    _mm_sfence(); /* the streamed stores are visible before the closing barrier */
#endif
    for (; e < e1; e++) sharded_sgd_elem(gs, ws, R, me, w, v, lo, e, lr, mu, wd, nesterov);
}

gp_status gp_cpu_sharded_sgd(gp_device *dev, gp_comm *comm, float *w, float *g, float *v,
                             int64_t n, float lr, float mu, float wd, int nesterov)
{
    int me, R;
    GP_TRY(start(dev, comm, g, w, n, &me, &R));
    if (R == 1) return gp_cpu_sgd_update(dev, w, g, v, n, lr, mu, wd, nesterov);
    cpu_comm *cc = comm->ctx;
    int64_t lo, hi;
    gp_comm_chunk(n, R, me, &lo, &hi);
    int nt = dev->threads;
    if (nt < 1 || hi - lo < 65536) nt = 1;
    /* Each math thread one contiguous span (its streamed stores fenced by
     * itself). */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int t = 0; t < nt; t++)
        sharded_sgd_span(cc->bufs, cc->bufs2, R, me, w, v, lo, lo + (hi - lo) * t / nt,
                         lo + (hi - lo) * (t + 1) / nt, lr, mu, wd, nesterov);
    return barrier(cc, R, true, false);
}

gp_status gp_cpu_barrier(gp_device *dev, gp_comm *comm)
{
    int me;
    gp_cpu_enter(dev);
    GP_TRY(enter(dev, comm, NULL, NULL, 0, &me));
    if (comm->n == 1) return GP_OK;
    return barrier(comm->ctx, comm->n, false, false);
}

gp_status gp_cpu_broadcast(gp_device *dev, gp_comm *comm, float *buf, int64_t n, int root)
{
    gp_cpu_enter(dev);
    int me;
    GP_TRY(enter(dev, comm, buf, NULL, n, &me));
    int R = comm->n;
    if (root < 0 || root >= R)
        return gp_error_set(GP_ERR_INVALID, "broadcast root %d is not a rank of a group of %d",
                            root, R);
    if (R == 1) return GP_OK;
    cpu_comm *cc = comm->ctx;
    GP_TRY(barrier(cc, R, false, true));
    GP_ASSERT(cc->counts[root] == n);
    if (me != root && n > 0) memcpy(buf, cc->bufs[root], (size_t)n * sizeof *buf);
    return barrier(cc, R, true, false);
}
