/*
 * procs.c — MPI behind procs.h; stubs when built without it.
 */
#include "pipeline/procs.h"

#include <limits.h>
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
    if (provided < MPI_THREAD_MULTIPLE)
        return gp_error_set(GP_ERR_RUNTIME, "this MPI library gives thread level %d, not "
                            "MPI_THREAD_MULTIPLE, which gpipe's worker threads need; use Open "
                            "MPI (openmpi-bin) built with thread support", provided);
    return GP_OK;
}

void gp_procs_finalize(void)
{
    if (!g_active) return;
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
    int rc = MPI_Wait(req->impl, MPI_STATUS_IGNORE);
    free(req->impl);
    req->impl = NULL;
    free(req->host);
    req->host = NULL;
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Wait");
}

gp_status gp_procs_probe(int from, int tag)
{
    int rc = MPI_Probe(from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
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
    if (!cancel) {
        int rc = MPI_Probe(peer, tag, comm, stt);
        return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Probe");
    }
    for (;;) {
        int there = 0, rc = MPI_Iprobe(peer, tag, comm, &there, stt);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Iprobe");
        if (there) return GP_OK;
        if (*cancel) return cancelled(peer, tag);
        poll_pause();
    }
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
    int rc = MPI_Recv(data, cnt, MPI_FLOAT, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
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
    for (;;) {
        int done = 0;
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Test");
        if (done) return GP_OK;
        if (*cancel) {
            MPI_Request_free(&req);
            return cancelled(peer, tag);
        }
        poll_pause();
    }
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
            int rc = sync ? MPI_Ssend(b, piece, MPI_BYTE, peer, tag, comm)
                          : MPI_Send(b, piece, MPI_BYTE, peer, tag, comm);
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
        int rc = MPI_Recv(b, piece, MPI_BYTE, peer, tag, comm, MPI_STATUS_IGNORE);
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
    int rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE,
                           MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Allgather");
}

gp_status gp_procs_bcast(void *data, size_t bytes, int root)
{
    unsigned char *b = data;
    while (bytes > 0) { /* in pieces under MPI's int count */
        int piece = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        int rc = MPI_Bcast(b, piece, MPI_BYTE, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Bcast");
        b += piece;
        bytes -= (size_t)piece;
    }
    return GP_OK;
}

gp_status gp_procs_max_doubles(double *v, int n)
{
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
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
    int rc = MPI_Allreduce(MPI_IN_PLACE, x, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
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
    int rc = MPI_Alltoallv(h, scnt, sdsp, MPI_FLOAT, t, rcnt, rdsp, MPI_FLOAT, g->comm);
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
    int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h, cnt, dsp, MPI_FLOAT, g->comm);
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
    int rc = MPI_Bcast(h, (int)n, MPI_FLOAT, root, g->comm);
    return host_out(dev, buf, n, h, rc == MPI_SUCCESS ? GP_OK : mpi_error(rc, "MPI_Bcast"));
}

static gp_status op_barrier(gp_comm *c, gp_device *dev)
{
    mpi_group *g = c->ctx;
    GP_TRY(gp_dev_synchronize(dev));
    int rc = MPI_Barrier(g->comm);
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
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->comm);
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
    int rc = MPI_Allgather(v, n, MPI_DOUBLE, all, n, MPI_DOUBLE, MPI_COMM_WORLD);
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
