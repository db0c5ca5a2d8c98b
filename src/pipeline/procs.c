/*
 * procs.c — MPI behind procs.h; stubs when built without it.
 */
#include "pipeline/procs.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPIPE_PROCS_STAGE, read once by gp_procs_init (before any worker runs). */
static bool g_stage_all;

static void read_stage_env(void)
{
    const char *e = getenv("GPIPE_PROCS_STAGE");
    g_stage_all = e && *e && strcmp(e, "0");
}

/* Whether dev's data goes through a host copy. */
static bool staged(const gp_device *dev) { return dev->kind != GP_DEV_CPU || g_stage_all; }

/* The n floats at buf as host memory in *h: buf itself, or (staged) a new
 * host buffer holding them (download) or not yet (for a receive). */
static gp_status host_in(gp_device *dev, const float *buf, int64_t n, bool download, float **h)
{
    *h = (float *)buf; /* written only through host_out, by callers that own buf */
    if (!staged(dev)) return GP_OK;
    *h = malloc((size_t)(n > 0 ? n : 1) * sizeof **h);
    if (!*h) return gp_error_set(GP_ERR_OOM, "out of host memory staging %lld floats", (long long)n);
    gp_status s = download ? gp_dev_download(dev, *h, buf, n) : GP_OK;
    if (s == GP_OK && download) s = gp_dev_synchronize(dev);
    if (s != GP_OK) free(*h);
    return s;
}

/* After host_in and the work s on *h: a staged buffer's floats back into
 * buf (when s is GP_OK), and the buffer freed. */
static gp_status host_out(gp_device *dev, float *buf, int64_t n, float *h, gp_status s)
{
    if (h == buf) return s;
    if (s == GP_OK) s = gp_dev_upload(dev, buf, h, n);
    if (s == GP_OK) s = gp_dev_synchronize(dev);
    free(h);
    return s;
}

gp_status gp_procs_isend_dev(gp_device *dev, const float *data, int64_t n, int to, int tag,
                             gp_procs_req *req)
{
    float *h;
    GP_TRY(host_in(dev, data, n, true, &h));
    gp_status s = gp_procs_isend(h, n, to, tag, req);
    if (h != data) {
        if (s == GP_OK) req->host = h; /* freed when the send completes */
        else free(h);
    }
    return s;
}

gp_status gp_procs_recv_dev(gp_device *dev, float *data, int64_t n, int from, int tag)
{
    gp_dev_weights_written(dev, data, (size_t)n * sizeof(float)); /* (a tied weight's) */
    float *h;
    GP_TRY(host_in(dev, data, n, false, &h));
    return host_out(dev, data, n, h, gp_procs_recv(h, n, from, tag));
}

bool gp_procs_launched(void)
{
    /* Open MPI's mpirun; PMIx (Open MPI 5, Slurm); PMI-1/2 (Slurm, MPICH) */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
    for (size_t q = 0; q < sizeof vars / sizeof *vars; q++)
        if (getenv(vars[q])) return true;
    return false;
}

bool gp_procs_launched_many(void)
{
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                        "SLURM_STEP_NUM_TASKS"};
    for (size_t q = 0; q < sizeof sizes / sizeof *sizes; q++) {
        const char *v = getenv(sizes[q]);
        if (v) return atoi(v) > 1;
    }
    const char *rank = getenv("PMIX_RANK");
    return rank && atoi(rank) != 0;
}

#ifdef GPIPE_HAVE_MPI
#include <mpi.h>

static bool g_active;
static int g_rank, g_size = 1;
static double g_offset;
static MPI_Comm g_chan_comm = MPI_COMM_NULL; /* the channels' messages (their tags) */

double gp_procs_clock_offset(void) { return g_offset; }

/* Rank 0 against each other rank in turn: t0 (rank 0 sends), tr (the
 * other's clock when it answers), t1 (rank 0 receives): offset = tr -
 * (t0 + t1) / 2 from the exchange with the least t1 - t0. */
static void measure_offsets(void)
{
    enum { PINGS = 16, TAG = 32767 };
    for (int r = 1; r < g_size; r++) {
        if (g_rank == 0) {
            double best = 1e300, off = 0;
            for (int q = 0; q < PINGS; q++) {
                double t0 = gp_now(), tr = 0;
                MPI_Send(&t0, 1, MPI_DOUBLE, r, TAG, MPI_COMM_WORLD);
                MPI_Recv(&tr, 1, MPI_DOUBLE, r, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                double t1 = gp_now();
                if (t1 - t0 < best) {
                    best = t1 - t0;
                    off = tr - (t0 + t1) / 2;
                }
            }
            MPI_Send(&off, 1, MPI_DOUBLE, r, TAG, MPI_COMM_WORLD);
        } else if (g_rank == r) {
            for (int q = 0; q < PINGS; q++) {
                double t0;
                MPI_Recv(&t0, 1, MPI_DOUBLE, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                double tr = gp_now();
                MPI_Send(&tr, 1, MPI_DOUBLE, 0, TAG, MPI_COMM_WORLD);
            }
            MPI_Recv(&g_offset, 1, MPI_DOUBLE, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
    }
}

bool gp_procs_available(void) { return true; }
bool gp_procs_active(void) { return g_active; }
int gp_procs_rank(void) { return g_rank; }
int gp_procs_size(void) { return g_size; }

static gp_status mpi_error(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return gp_error_set(GP_ERR_RUNTIME, "rank %d: %s failed: %s", g_rank, what, msg);
}

/* ---- the watchdog: a peer that stops answering -------------------------- */

/* MPI notices a process that ends (mpirun then ends the run), not one that
 * stops (SIGSTOP, Ctrl-Z, a hung file system or GPU): the others would wait
 * for it for ever.  Every wait on other ranks (a receive, a probe, a
 * synchronous send, a collective) is therefore listed here while it lasts,
 * and a thread looks at the list: a wait longer than the timeout
 * (pipeline.peer_timeout, gp_procs_watch) says what it waited for and ends
 * every rank (MPI_Abort), as the failure of a rank does.  The list and the
 * texts are guarded by g_wd_mu; a wait's own text is its thread's. */
typedef struct wd_wait {
    struct wd_wait *next;
    double since;  /* gp_now() when it began */
    int peer;      /* the rank waited for; -1: every rank (a collective) */
    char what[400];
} wd_wait;

static pthread_mutex_t g_wd_mu = PTHREAD_MUTEX_INITIALIZER;
static wd_wait *g_wd_waits;
static double g_wd_timeout;           /* seconds; 0 until gp_procs_watch */
static int g_wd_devices, g_wd_stages; /* to name a rank's stages */
static gp_schedule_kind g_wd_schedule; /* (zb-v places them in a V) */
static char g_wd_phase[160], g_wd_note[1200];
static pthread_t g_wd_thread;
static bool g_wd_started;
static _Atomic int g_wd_quit;
static _Thread_local char tl_wait_for[200]; /* gp_procs_wait_for's text */

void gp_procs_wait_for(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_wait_for, sizeof tl_wait_for, fmt, ap);
    va_end(ap);
}

/* A wait on `peer` (-1: every rank) begins, for `what` ("a message") or
 * what gp_procs_wait_for said, in the MPI call `fmt` ("MPI_Probe, tag 5"):
 * "stage 1's output for micro-batch 2 of stage 2 (MPI_Probe, tag 5)". */
static void wait_begin(wd_wait *w, int peer, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void wait_begin(wd_wait *w, int peer, const char *what, const char *fmt, ...)
{
    char call[120];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call, sizeof call, fmt, ap);
    va_end(ap);
    w->since = gp_now();
    w->peer = peer;
    snprintf(w->what, sizeof w->what, "%s (%s)", *tl_wait_for ? tl_wait_for : what, call);
    tl_wait_for[0] = '\0'; /* (the text is for one wait) */
    pthread_mutex_lock(&g_wd_mu);
    w->next = g_wd_waits;
    g_wd_waits = w;
    pthread_mutex_unlock(&g_wd_mu);
}

static void wait_end(wd_wait *w)
{
    pthread_mutex_lock(&g_wd_mu);
    for (wd_wait **p = &g_wd_waits; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    pthread_mutex_unlock(&g_wd_mu);
}

/* "rank 1 (stage 1)", "rank 3 (replica 1, stages 1 and 3)" */
static void name_rank(int r, char *buf, size_t len)
{
    int n = g_wd_devices;
    if (n < 1) {
        snprintf(buf, len, "rank %d", r);
        return;
    }
    int d = r % n, stages = 0, used = snprintf(buf, len, "rank %d (", r);
    if (g_size > n && used < (int)len)
        used += snprintf(buf + used, len - (size_t)used, "replica %d, ", r / n);
    for (int j = 0; j < g_wd_stages; j++) stages += gp_schedule_device_of(g_wd_schedule, n, j) == d;
    for (int j = 0, q = 0; j < g_wd_stages && used < (int)len; j++) {
        if (gp_schedule_device_of(g_wd_schedule, n, j) != d) continue;
        used += snprintf(buf + used, len - (size_t)used, "%s%d",
                         q == 0 ? (stages > 1 ? "stages " : "stage ")
                                : (q == stages - 1 ? " and " : ", "), j);
        q++;
    }
    if (used < (int)len) snprintf(buf + used, len - (size_t)used, ")");
}

/* Heartbeats, on a communicator of their own: each rank's watchdog tells
 * every other, twice a second, that it runs and whether it is waiting on
 * others itself.  A rank whose beats stop is stopped as a whole (or its
 * machine is); one that beats but sends nothing is hung inside (a file
 * system, a device).  That names the rank a collective waits for, which
 * MPI does not say.  At most one beat is in flight to each rank. */
static MPI_Comm g_hb_comm = MPI_COMM_NULL;
static double *g_hb_heard;  /* per rank: gp_now() of its last beat */
static int *g_hb_waiting;   /* per rank: its last beat's "waiting on others" */
static int *g_hb_out;       /* per rank: the beat in flight to it */
static MPI_Request *g_hb_req;

static void heartbeats(double now, bool send)
{
    for (;;) { /* every beat that came */
        int there = 0, v = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, 0, g_hb_comm, &there, &st) != MPI_SUCCESS || !there) break;
        if (MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, 0, g_hb_comm, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS)
            break;
        g_hb_heard[st.MPI_SOURCE] = now;
        g_hb_waiting[st.MPI_SOURCE] = v;
    }
    for (int r = 0; r < g_size && send; r++) {
        int done = 1;
        if (r == g_rank) continue;
        if (g_hb_req[r] != MPI_REQUEST_NULL) MPI_Test(&g_hb_req[r], &done, MPI_STATUS_IGNORE);
        if (!done) continue;
        g_hb_out[r] = g_wd_waits != NULL;
        MPI_Isend(&g_hb_out[r], 1, MPI_INT, r, 0, g_hb_comm, &g_hb_req[r]);
    }
}

/* A collective waited too long: the rank whose beats stopped longest ago
 * (stopped as a whole), else the first that is not waiting on others
 * (hung inside), else -1. */
static int silent_rank(double now)
{
    int worst = -1;
    for (int r = 0; r < g_size; r++)
        if (r != g_rank && now - g_hb_heard[r] > 2 &&
            (worst < 0 || g_hb_heard[r] < g_hb_heard[worst]))
            worst = r;
    for (int r = 0; r < g_size && worst < 0; r++)
        if (r != g_rank && !g_hb_waiting[r]) worst = r;
    return worst;
}

static void *watchdog(void *arg)
{
    (void)arg;
    double last = gp_now(), beat = 0;
    while (!g_wd_quit) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_wd_mu);
        double now = gp_now();
        /* a sleep of 0.1 s that took seconds: this process was the one
         * stopped (and is now continued), so its waits, and what it heard,
         * start again */
        if (now - last > 2) {
            for (wd_wait *w = g_wd_waits; w; w = w->next) w->since = now;
            for (int r = 0; r < g_size; r++) g_hb_heard[r] = now;
        }
        last = now;
        heartbeats(now, now - beat >= 0.5);
        if (now - beat >= 0.5) beat = now;
        const wd_wait *old = NULL;
        for (const wd_wait *w = g_wd_waits; w; w = w->next)
            if (!old || w->since < old->since) old = w;
        if (!old || now - old->since < g_wd_timeout) {
            pthread_mutex_unlock(&g_wd_mu);
            continue;
        }
        char me[160], peer[160] = "", what[sizeof old->what], phase[sizeof g_wd_phase],
            note[sizeof g_wd_note];
        int who = old->peer >= 0 ? old->peer : silent_rank(now);
        bool gone = who >= 0 && now - g_hb_heard[who] > 2;
        name_rank(g_rank, me, sizeof me);
        if (who >= 0) name_rank(who, peer, sizeof peer);
        double waited = now - old->since;
        snprintf(what, sizeof what, "%s", old->what);
        snprintf(phase, sizeof phase, "%s", g_wd_phase);
        snprintf(note, sizeof note, "%s", g_wd_note);
        /* g_wd_mu stays held until the process ends: MPI_Abort does not
         * stop this process's other threads at once (mpirun continues a
         * stopped rank, then sends SIGTERM, then SIGKILL), and the run must
         * not go on past what the message says is saved.  Every wait on
         * another rank, a snapshot's agreement first among them, begins and
         * ends under the lock, so no thread gets past its next one. */
        fprintf(stderr, "gpipe-train: %s of %d: no word from %s for %.0f s, waiting for %s%s%s: "
                "%s %s; every rank is stopped.%s%s (pipeline.peer_timeout = %g s is how long a "
                "rank waits for another)\n",
                me, g_size, who >= 0 ? peer : "another rank", waited, what,
                *phase ? " during " : "", phase, who >= 0 ? peer : "a rank",
                gone ? "has stopped answering without ending (stopped by SIGSTOP or Ctrl-Z, or "
                       "its machine hung)"
                     : "runs but sends nothing (hung in a file system or a device, or waiting "
                       "for another rank)",
                *note ? " " : "", note, g_wd_timeout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, gp_status_exit_code(GP_ERR_RUNTIME));
        return NULL; /* (not reached: MPI_Abort ends the process) */
    }
    return NULL;
}

void gp_procs_watch(double seconds, int n_devices, int n_stages, gp_schedule_kind schedule)
{
    if (!g_active || g_size < 2 || !(seconds > 0)) return;
    pthread_mutex_lock(&g_wd_mu);
    g_wd_timeout = seconds;
    g_wd_devices = n_devices;
    g_wd_stages = n_stages;
    g_wd_schedule = schedule;
    pthread_mutex_unlock(&g_wd_mu);
    if (g_wd_started || g_hb_comm == MPI_COMM_NULL) return;
    size_t N = (size_t)g_size;
    if (!g_hb_heard) {
        g_hb_heard = malloc(N * sizeof *g_hb_heard);
        g_hb_waiting = calloc(N, sizeof *g_hb_waiting);
        g_hb_out = calloc(N, sizeof *g_hb_out);
        g_hb_req = malloc(N * sizeof *g_hb_req);
        if (!g_hb_heard || !g_hb_waiting || !g_hb_out || !g_hb_req) return; /* (no watchdog) */
        for (size_t r = 0; r < N; r++) g_hb_req[r] = MPI_REQUEST_NULL;
    }
    double now = gp_now();
    for (size_t r = 0; r < N; r++) g_hb_heard[r] = now;
    g_wd_quit = 0;
    g_wd_started = pthread_create(&g_wd_thread, NULL, watchdog, NULL) == 0;
}

void gp_procs_watch_phase(const char *fmt, ...)
{
    if (!g_wd_started) return;
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_wd_mu);
    vsnprintf(g_wd_phase, sizeof g_wd_phase, fmt, ap);
    pthread_mutex_unlock(&g_wd_mu);
    va_end(ap);
}

void gp_procs_watch_note(const char *fmt, ...)
{
    if (!g_wd_started) return;
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_wd_mu);
    vsnprintf(g_wd_note, sizeof g_wd_note, fmt, ap);
    pthread_mutex_unlock(&g_wd_mu);
    va_end(ap);
}

/* Before MPI_Finalize: the thread ends, a beat still in flight is left to
 * MPI (its buffer stays, as the process is about to end). */
static void watch_stop(void)
{
    if (g_wd_started) {
        g_wd_quit = 1;
        pthread_join(g_wd_thread, NULL);
        g_wd_started = false;
    }
    for (int r = 0; g_hb_req && r < g_size; r++)
        if (g_hb_req[r] != MPI_REQUEST_NULL) MPI_Request_free(&g_hb_req[r]);
    if (g_hb_comm != MPI_COMM_NULL) MPI_Comm_free(&g_hb_comm);
}

gp_status gp_procs_init(void)
{
    read_stage_env();
    if (g_active || !gp_procs_launched()) return GP_OK;
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return gp_error_set(GP_ERR_RUNTIME, "MPI_Init_thread failed (%d)", rc);
    /* errors come back as codes, which become gpipe errors naming the rank */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    g_active = true;
    measure_offsets();
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &g_chan_comm);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(g_chan_comm, MPI_ERRORS_RETURN);
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &g_hb_comm);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(g_hb_comm, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_MULTIPLE)
        return gp_error_set(GP_ERR_RUNTIME, "this MPI library gives thread level %d, not "
                            "MPI_THREAD_MULTIPLE, which gpipe's worker threads need; use Open "
                            "MPI (openmpi-bin) built with thread support", provided);
    return GP_OK;
}

void gp_procs_finalize(void)
{
    if (!g_active) return;
    watch_stop();
    if (g_chan_comm != MPI_COMM_NULL) MPI_Comm_free(&g_chan_comm);
    MPI_Finalize();
    g_active = false;
}

_Noreturn void gp_procs_abort(int code)
{
    if (g_active) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static gp_status count_of(int64_t n, int *out)
{
    if (n < 0 || n > INT_MAX)
        return gp_error_set(GP_ERR_INVALID, "a message of %lld floats is over MPI's %d per "
                            "message; use more micro-batches (pipeline.chunks)", (long long)n,
                            INT_MAX);
    *out = (int)n;
    return GP_OK;
}

gp_status gp_procs_isend(const float *data, int64_t n, int to, int tag, gp_procs_req *req)
{
    int cnt = 0;
    req->host = NULL;
    GP_TRY(count_of(n, &cnt));
    MPI_Request *r = malloc(sizeof *r);
    if (!r) return gp_error_set(GP_ERR_OOM, "out of host memory");
    int rc = MPI_Isend(data, cnt, MPI_FLOAT, to, tag, MPI_COMM_WORLD, r);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_error(rc, "MPI_Isend");
    }
    req->impl = r; /* req->host: the caller's (gp_procs_isend_dev) */
    req->peer = to;
    return GP_OK;
}

gp_status gp_procs_test(gp_procs_req *req, bool *done)
{
    int flag = 0;
    int rc = MPI_Test(req->impl, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Test");
    *done = flag != 0;
    if (*done) {
        free(req->impl);
        req->impl = NULL;
        free(req->host);
        req->host = NULL;
    }
    return GP_OK;
}

gp_status gp_procs_wait(gp_procs_req *req)
{
    wd_wait w;
    wait_begin(&w, req->peer, "the receive of a message sent", "MPI_Wait");
    int rc = MPI_Wait(req->impl, MPI_STATUS_IGNORE);
    wait_end(&w);
    free(req->impl);
    req->impl = NULL;
    free(req->host);
    req->host = NULL;
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Wait");
}

gp_status gp_procs_probe(int from, int tag)
{
    wd_wait w;
    wait_begin(&w, from, "a message", "MPI_Probe, tag %d", tag);
    int rc = MPI_Probe(from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    wait_end(&w);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Probe");
}

/* A channel transfer that gives up: the step failed here, and the peer
 * may never come (it waits for what this process dropped). */
static gp_status cancelled(int peer, int tag)
{
    return gp_error_set(GP_ERR_CANCELLED, "rank %d: the transfer with rank %d on channel %d "
                        "was cancelled after a failure", g_rank, peer, tag);
}

/* Between polls of a cancel flag: short enough not to slow a transfer
 * much, long enough not to take a core from the computing threads. */
static void poll_pause(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* MPI_Probe, or with a cancel flag MPI_Iprobe until a message is there or
 * the flag is set. */
static gp_status probe(int peer, int tag, MPI_Comm comm, const _Atomic int *cancel,
                       MPI_Status *stt)
{
    wd_wait w;
    wait_begin(&w, peer, "a message", "%s, tag %d", cancel ? "MPI_Iprobe" : "MPI_Probe", tag);
    gp_status s = GP_OK;
    if (!cancel) {
        int rc = MPI_Probe(peer, tag, comm, stt);
        if (rc != MPI_SUCCESS) s = mpi_error(rc, "MPI_Probe");
    } else {
        for (;;) {
            int there = 0, rc = MPI_Iprobe(peer, tag, comm, &there, stt);
            if (rc != MPI_SUCCESS) s = mpi_error(rc, "MPI_Iprobe");
            if (rc != MPI_SUCCESS || there) break;
            if (*cancel) {
                s = cancelled(peer, tag);
                break;
            }
            poll_pause();
        }
    }
    wait_end(&w);
    return s;
}

/* The next message from `peer` with `tag` on comm, before it is received:
 * its count of `type` must be `want`.  A longer message would not fit the
 * buffer, and Open MPI's shared-memory path writes past the buffer rather
 * than failing with MPI_ERR_TRUNCATE; a shorter one leaves part of it
 * stale.  Either means the ranks disagree on the model or the batch. */
static gp_status expect_count(int peer, int tag, MPI_Comm comm, MPI_Datatype type, int want,
                              const char *unit, const char *what, const _Atomic int *cancel)
{
    MPI_Status stt;
    int got = 0;
    GP_TRY(probe(peer, tag, comm, cancel, &stt));
    MPI_Get_count(&stt, type, &got);
    if (got != want)
        return gp_error_set(GP_ERR_RUNTIME, "rank %d: rank %d sent %d %s (%s %d), this rank "
                            "expects %d: the processes disagree on the model or the batch; "
                            "start every rank with the same config and data", g_rank, peer, got,
                            unit, what, tag, want);
    return GP_OK;
}

gp_status gp_procs_recv(float *data, int64_t n, int from, int tag)
{
    int cnt = 0;
    GP_TRY(count_of(n, &cnt));
    GP_TRY(expect_count(from, tag, MPI_COMM_WORLD, MPI_FLOAT, cnt, "floats", "tag", NULL));
    wd_wait w;
    wait_begin(&w, from, "the rest of a message", "MPI_Recv, tag %d", tag);
    int rc = MPI_Recv(data, cnt, MPI_FLOAT, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    wait_end(&w);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Recv");
}

/* A synchronous send that gives up once *cancel is set: MPI_Issend, then
 * MPI_Test until it is received.  Given up, the request is left to MPI
 * (MPI_Request_free): the process is about to end the run, and a
 * cancelled send is deprecated in MPI 4. */
static gp_status ssend_or_cancel(const void *b, int n, int peer, int tag, MPI_Comm comm,
                                 const _Atomic int *cancel)
{
    MPI_Request req;
    int rc = MPI_Issend(b, n, MPI_BYTE, peer, tag, comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Issend");
    wd_wait w;
    wait_begin(&w, peer, "the receive of a message sent", "MPI_Issend, channel %d", tag);
    gp_status s = GP_OK;
    for (;;) {
        int done = 0;
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) s = mpi_error(rc, "MPI_Test");
        if (rc != MPI_SUCCESS || done) break;
        if (*cancel) {
            MPI_Request_free(&req);
            s = cancelled(peer, tag);
            break;
        }
        poll_pause();
    }
    wait_end(&w);
    return s;
}

/* `bytes` bytes to `peer` on comm, in pieces under MPI's int count, in
 * order (same source and tag); sync: MPI_Ssend (ends once received), which
 * gives up once *cancel is set (cancel non-NULL). */
static gp_status send_pieces(const void *data, size_t bytes, int peer, int tag, MPI_Comm comm,
                             bool sync, const _Atomic int *cancel)
{
    const unsigned char *b = data;
    do {
        int piece = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        if (sync && cancel) {
            GP_TRY(ssend_or_cancel(b, piece, peer, tag, comm, cancel));
        } else {
            wd_wait w;
            wait_begin(&w, peer, "the receive of a message sent", "%s, tag %d",
                       sync ? "MPI_Ssend" : "MPI_Send", tag);
            int rc = sync ? MPI_Ssend(b, piece, MPI_BYTE, peer, tag, comm)
                          : MPI_Send(b, piece, MPI_BYTE, peer, tag, comm);
            wait_end(&w);
            if (rc != MPI_SUCCESS) return mpi_error(rc, sync ? "MPI_Ssend" : "MPI_Send");
        }
        b += piece;
        bytes -= (size_t)piece;
    } while (bytes > 0);
    return GP_OK;
}

/* Exactly `bytes` bytes from `peer` on comm, as send_pieces sent them;
 * `what` names the tag in the message ("tag", "channel").  With cancel, it
 * waits for each piece by polling, and gives up once *cancel is set (a
 * piece that has arrived is then received at once). */
static gp_status recv_pieces(void *data, size_t bytes, int peer, int tag, MPI_Comm comm,
                             const char *what, const _Atomic int *cancel)
{
    unsigned char *b = data;
    do {
        int piece = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        GP_TRY(expect_count(peer, tag, comm, MPI_BYTE, piece, "bytes", what, cancel));
        wd_wait w;
        wait_begin(&w, peer, "the rest of a message", "MPI_Recv, %s %d", what, tag);
        int rc = MPI_Recv(b, piece, MPI_BYTE, peer, tag, comm, MPI_STATUS_IGNORE);
        wait_end(&w);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Recv");
        b += piece;
        bytes -= (size_t)piece;
    } while (bytes > 0);
    return GP_OK;
}

gp_status gp_procs_send_bytes(const void *data, size_t bytes, int to, int tag)
{
    return send_pieces(data, bytes, to, tag, MPI_COMM_WORLD, false, NULL);
}

gp_status gp_procs_recv_bytes(void *data, size_t bytes, int from, int tag)
{
    return recv_pieces(data, bytes, from, tag, MPI_COMM_WORLD, "tag", NULL);
}

gp_status gp_procs_chan_send(const void *buf, size_t bytes, int peer, int tag,
                             const _Atomic int *cancel)
{
    return send_pieces(buf, bytes, peer, tag, g_chan_comm, true, cancel);
}

gp_status gp_procs_chan_recv(void *buf, size_t bytes, int peer, int tag,
                             const _Atomic int *cancel)
{
    return recv_pieces(buf, bytes, peer, tag, g_chan_comm, "channel", cancel);
}

gp_status gp_procs_allgather_bytes(const void *mine, void *all, size_t bytes)
{
    if (bytes > INT_MAX)
        return gp_error_set(GP_ERR_INVALID, "an all-gather of %zu bytes per rank", bytes);
    wd_wait w;
    wait_begin(&w, -1, "every rank", "MPI_Allgather");
    int rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE,
                           MPI_COMM_WORLD);
    wait_end(&w);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Allgather");
}

gp_status gp_procs_bcast(void *data, size_t bytes, int root)
{
    unsigned char *b = data;
    while (bytes > 0) { /* in pieces under MPI's int count */
        int piece = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        wd_wait w;
        wait_begin(&w, root, "a broadcast", "MPI_Bcast from rank %d", root);
        int rc = MPI_Bcast(b, piece, MPI_BYTE, root, MPI_COMM_WORLD);
        wait_end(&w);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Bcast");
        b += piece;
        bytes -= (size_t)piece;
    }
    return GP_OK;
}

gp_status gp_procs_max_doubles(double *v, int n)
{
    wd_wait w;
    wait_begin(&w, -1, "every rank", "MPI_Allreduce");
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    wait_end(&w);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Allreduce");
}

int gp_procs_tag_ub(void)
{
    if (!g_active) return INT_MAX;
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    return flag && ub ? *ub : 32767;
}

_Noreturn void gp_procs_fail(gp_status s)
{
    fprintf(stderr, "gpipe-train: rank %d of %d: %s\n", g_rank, g_size, gp_error_message());
    fflush(stderr);
    gp_procs_abort(gp_status_exit_code(s));
}

gp_status gp_procs_max_int(int *x)
{
    wd_wait w;
    wait_begin(&w, -1, "every rank", "MPI_Allreduce");
    int rc = MPI_Allreduce(MPI_IN_PLACE, x, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    wait_end(&w);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Allreduce");
}

/* ---- communicators over processes ---------------------------------------- */

typedef struct {
    MPI_Comm comm;
    int me, R;
} mpi_group;

static gp_status chunk_counts(const mpi_group *g, int64_t n, int *cnt, int *dsp)
{
    if (n > INT_MAX)
        return gp_error_set(GP_ERR_INVALID, "a tensor of %lld floats is over MPI's %d per "
                            "collective", (long long)n, INT_MAX);
    for (int q = 0; q < g->R; q++) {
        int64_t lo, hi;
        gp_comm_chunk(n, g->R, q, &lo, &hi);
        cnt[q] = (int)(hi - lo);
        dsp[q] = (int)lo;
    }
    return GP_OK;
}

/* chunk `me` of h = the sum of chunk `me` over the ranks, in rank order */
static gp_status rs_host(mpi_group *g, float *h, int64_t n)
{
    int R = g->R, scnt[GP_MAX_DEVICES] = {0}, sdsp[GP_MAX_DEVICES] = {0}, rcnt[GP_MAX_DEVICES],
        rdsp[GP_MAX_DEVICES];
    GP_TRY(chunk_counts(g, n, scnt, sdsp));
    int mine = scnt[g->me], lo = sdsp[g->me];
    for (int q = 0; q < R; q++) {
        rcnt[q] = mine;
        rdsp[q] = q * mine;
    }
    float *t = malloc((size_t)(R * mine > 0 ? R * mine : 1) * sizeof *t);
    if (!t) return gp_error_set(GP_ERR_OOM, "out of host memory for a reduce-scatter");
    wd_wait w;
    wait_begin(&w, -1, "every rank", "a reduce-scatter, MPI_Alltoallv");
    int rc = MPI_Alltoallv(h, scnt, sdsp, MPI_FLOAT, t, rcnt, rdsp, MPI_FLOAT, g->comm);
    wait_end(&w);
    if (rc == MPI_SUCCESS)
        for (int e = 0; e < mine; e++) {
            float x = t[e];
            for (int q = 1; q < R; q++) x += t[q * mine + e];
            h[lo + e] = x;
        }
    free(t);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Alltoallv");
}

static gp_status ag_host(mpi_group *g, float *h, int64_t n)
{
    int cnt[GP_MAX_DEVICES], dsp[GP_MAX_DEVICES];
    GP_TRY(chunk_counts(g, n, cnt, dsp));
    wd_wait w;
    wait_begin(&w, -1, "every rank", "an all-gather, MPI_Allgatherv");
    int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h, cnt, dsp, MPI_FLOAT, g->comm);
    wait_end(&w);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Allgatherv");
}

static gp_status op_reduce_scatter(gp_comm *c, gp_device *dev, float *buf, int64_t n)
{
    float *h;
    GP_TRY(host_in(dev, buf, n, true, &h));
    return host_out(dev, buf, n, h, rs_host(c->ctx, h, n));
}

static gp_status op_all_gather(gp_comm *c, gp_device *dev, float *buf, int64_t n)
{
    float *h;
    GP_TRY(host_in(dev, buf, n, true, &h));
    return host_out(dev, buf, n, h, ag_host(c->ctx, h, n));
}

static gp_status op_allreduce(gp_comm *c, gp_device *dev, float *buf, int64_t n)
{
    float *h;
    GP_TRY(host_in(dev, buf, n, true, &h));
    gp_status s = rs_host(c->ctx, h, n);
    if (s == GP_OK) s = ag_host(c->ctx, h, n);
    return host_out(dev, buf, n, h, s);
}

static gp_status op_broadcast(gp_comm *c, gp_device *dev, float *buf, int64_t n, int root)
{
    mpi_group *g = c->ctx;
    float *h;
    if (n > INT_MAX) return gp_error_set(GP_ERR_INVALID, "a broadcast of %lld floats is over "
                                         "MPI's %d", (long long)n, INT_MAX);
    GP_TRY(host_in(dev, buf, n, true, &h));
    wd_wait w;
    wait_begin(&w, -1, "every rank", "a broadcast, MPI_Bcast");
    int rc = MPI_Bcast(h, (int)n, MPI_FLOAT, root, g->comm);
    wait_end(&w);
    return host_out(dev, buf, n, h, rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Bcast"));
}

static gp_status op_barrier(gp_comm *c, gp_device *dev)
{
    mpi_group *g = c->ctx;
    GP_TRY(gp_dev_synchronize(dev));
    wd_wait w;
    wait_begin(&w, -1, "every rank", "MPI_Barrier");
    int rc = MPI_Barrier(g->comm);
    wait_end(&w);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Barrier");
}

static const gp_comm_ops k_mpi_ops = {.allreduce = op_allreduce, .broadcast = op_broadcast,
                                      .reduce_scatter = op_reduce_scatter,
                                      .all_gather = op_all_gather, .barrier = op_barrier};

static void mpi_comm_destroy(gp_comm *c)
{
    if (!c) return;
    mpi_group *g = c->ctx;
    if (g) {
        if (g_active) MPI_Comm_free(&g->comm);
        free(g);
    }
    free(c->devs);
    free(c);
}

gp_status gp_procs_comm_create(gp_device *const *devs, int n, int color, int key, gp_comm **out)
{
    *out = NULL;
    if (n < 1 || n > GP_MAX_DEVICES || key < 0 || key >= n)
        return gp_error_set(GP_ERR_INVALID, "a communicator of %d processes (this one %d)", n, key);
    gp_comm *c = calloc(1, sizeof *c);
    mpi_group *g = calloc(1, sizeof *g);
    gp_device **d = calloc((size_t)n, sizeof *d);
    if (!c || !g || !d) {
        free(c);
        free(g);
        free(d);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    wd_wait w;
    wait_begin(&w, -1, "every rank", "MPI_Comm_split");
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->comm);
    wait_end(&w);
    if (rc != MPI_SUCCESS) {
        free(c);
        free(g);
        free(d);
        return mpi_error(rc, "MPI_Comm_split");
    }
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    int size = 0;
    MPI_Comm_rank(g->comm, &g->me);
    MPI_Comm_size(g->comm, &size);
    g->R = n;
    memcpy(d, devs, (size_t)n * sizeof *d);
    c->n = n;
    c->devs = d;
    c->ctx = g;
    c->destroy = mpi_comm_destroy;
    c->ops = &k_mpi_ops;
    if (size != n || g->me != key) {
        mpi_comm_destroy(c);
        return gp_error_set(GP_ERR_INVALID, "rank %d: %d processes run this device's stage, "
                            "not %d: start mpirun with devices x replicas processes", g_rank,
                            size, n);
    }
    *out = c;
    return GP_OK;
}

gp_status gp_procs_sum_doubles(double *v, int n)
{
    double *all = malloc((size_t)n * (size_t)g_size * sizeof *all);
    if (!all) return gp_error_set(GP_ERR_OOM, "out of host memory");
    wd_wait w;
    wait_begin(&w, -1, "every rank", "MPI_Allgather");
    int rc = MPI_Allgather(v, n, MPI_DOUBLE, all, n, MPI_DOUBLE, MPI_COMM_WORLD);
    wait_end(&w);
    if (rc == MPI_SUCCESS)
        for (int k = 0; k < n; k++) {
            double x = all[k];
            for (int r = 1; r < g_size; r++) x += all[(size_t)r * (size_t)n + (size_t)k];
            v[k] = x;
        }
    free(all);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Allgather");
}

#else /* built without MPI */

bool gp_procs_available(void) { return false; }
double gp_procs_clock_offset(void) { return 0; }
bool gp_procs_active(void) { return false; }
int gp_procs_rank(void) { return 0; }
int gp_procs_size(void) { return 1; }

gp_status gp_procs_init(void)
{
    read_stage_env();
    if (!gp_procs_launched()) return GP_OK;
    return gp_error_set(GP_ERR_INVALID, "started by mpirun, but this gpipe was built without "
                        "MPI: install openmpi-bin and libopenmpi-dev "
                        "(scripts/install-deps.sh) and build again (cmake -DGPIPE_MPI=ON)");
}

void gp_procs_finalize(void) {}
_Noreturn void gp_procs_abort(int code) { exit(code); }

static gp_status none(void)
{
    return gp_error_set(GP_ERR_INVALID, "built without MPI: no processes to talk to");
}
gp_status gp_procs_isend(const float *data, int64_t n, int to, int tag, gp_procs_req *req)
{
    (void)data, (void)n, (void)to, (void)tag, (void)req;
    return none();
}
gp_status gp_procs_test(gp_procs_req *req, bool *done)
{
    (void)req;
    *done = true;
    return none();
}
gp_status gp_procs_wait(gp_procs_req *req)
{
    (void)req;
    return none();
}
gp_status gp_procs_probe(int from, int tag)
{
    (void)from, (void)tag;
    return none();
}
gp_status gp_procs_recv(float *data, int64_t n, int from, int tag)
{
    (void)data, (void)n, (void)from, (void)tag;
    return none();
}
gp_status gp_procs_bcast(void *data, size_t bytes, int root)
{
    (void)data, (void)bytes, (void)root;
    return none();
}
gp_status gp_procs_chan_send(const void *buf, size_t bytes, int peer, int tag,
                             const _Atomic int *cancel)
{
    (void)buf, (void)bytes, (void)peer, (void)tag, (void)cancel;
    return none();
}
gp_status gp_procs_chan_recv(void *buf, size_t bytes, int peer, int tag,
                             const _Atomic int *cancel)
{
    (void)buf, (void)bytes, (void)peer, (void)tag, (void)cancel;
    return none();
}
gp_status gp_procs_allgather_bytes(const void *mine, void *all, size_t bytes)
{
    (void)mine, (void)all, (void)bytes;
    return none();
}
gp_status gp_procs_send_bytes(const void *data, size_t bytes, int to, int tag)
{
    (void)data, (void)bytes, (void)to, (void)tag;
    return none();
}
gp_status gp_procs_recv_bytes(void *data, size_t bytes, int from, int tag)
{
    (void)data, (void)bytes, (void)from, (void)tag;
    return none();
}
gp_status gp_procs_max_int(int *x)
{
    (void)x;
    return none();
}
gp_status gp_procs_max_doubles(double *v, int n)
{
    (void)v, (void)n;
    return none();
}
int gp_procs_tag_ub(void) { return INT_MAX; }
void gp_procs_watch(double seconds, int n_devices, int n_stages, gp_schedule_kind schedule)
{
    (void)seconds, (void)n_devices, (void)n_stages, (void)schedule;
}
void gp_procs_watch_phase(const char *fmt, ...) { (void)fmt; }
void gp_procs_watch_note(const char *fmt, ...) { (void)fmt; }
void gp_procs_wait_for(const char *fmt, ...) { (void)fmt; }
_Noreturn void gp_procs_fail(gp_status s)
{
    fprintf(stderr, "gpipe-train: %s\n", gp_error_message());
    exit(gp_status_exit_code(s));
}
gp_status gp_procs_comm_create(gp_device *const *devs, int n, int color, int key, gp_comm **out)
{
    (void)devs, (void)n, (void)color, (void)key;
    *out = NULL;
    return none();
}
gp_status gp_procs_sum_doubles(double *v, int n)
{
    (void)v, (void)n;
    return none();
}
#endif

/* ---- agreeing on a phase's outcome (either build) ---------------------- */

gp_status gp_procs_agree(gp_status s, const char *during, bool *other_failed, bool *all_failed)
{
    int N = gp_procs_size();
    if (N <= 1) return s;
    int own = s != GP_OK && s != GP_ERR_CANCELLED;
    int *all = calloc((size_t)N, sizeof *all);
    if (!all) gp_procs_fail(gp_error_set(GP_ERR_OOM, "out of host memory"));
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", gp_error_message()); /* the exchange may set its own */
    gp_status x = gp_procs_allgather_bytes(&own, all, sizeof own);
    if (x != GP_OK) { /* nothing can be agreed: end the run, saying both */
        free(all);
        gp_procs_fail(gp_error_wrap(x, "agreeing on how every rank fared %s%s%s", during,
                                    s != GP_OK ? ", after its own error: " : "",
                                    s != GP_OK ? msg : ""));
    }
    int first = -1, n_own = 0;
    for (int r = 0; r < N; r++)
        if (all[r]) {
            n_own++;
            if (first < 0) first = r;
        }
    free(all);
    if (n_own == N && all_failed) *all_failed = true;
    if (own || n_own == 0) return s;
    if (other_failed) *other_failed = true;
    if (s == GP_ERR_CANCELLED) return s; /* its own words for the same */
    return gp_error_set(GP_ERR_CANCELLED, "rank %d of %d failed %s (its message says why)", first,
                        N, during);
}
