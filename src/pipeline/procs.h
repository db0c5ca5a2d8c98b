/*
 * procs.h — the processes of a run started by mpirun: who this process is
 * and the host transport between processes (MPI point-to-point and
 * broadcast).  `mpirun -np N gpipe-train config.yaml` runs one device of
 * the pipeline per process: rank r runs device r (stage r; with interleaved
 * stages, stages r, r + N, ...), N = the config's devices.
 *
 * Without mpirun nothing here is used: gp_procs_init finds no launcher in
 * the environment and leaves the process alone (no MPI_Init), so a
 * single-process run is what it always was.  Built without MPI
 * (GPIPE_MPI=OFF, or no MPI installed), a run under mpirun is a clear error
 * on every rank.
 *
 * Messages: tensors of floats, addressed by (peer rank, tag).  The executor
 * builds the tags (pipeline.c: micro-batch, receiving stage, what it is),
 * and both sides know each tensor's shape from the config, so no shape is
 * ever sent.
 *
 * Owns: the MPI library's init and finalize.  May call: core.
 * Thread safety: MPI is initialised with MPI_THREAD_MULTIPLE (the worker
 * thread sends and receives while the main thread may broadcast); a
 * library that cannot is refused at init.
 */
#ifndef GP_PROCS_H
#define GP_PROCS_H

#include "backend/backend.h"
#include "pipeline/schedule.h" /* GP_MAX_DEVICES */

/* Whether a launcher (Open MPI's mpirun, or a PMI/PMIx one such as Slurm's
 * srun) started this process as one of several. */
bool gp_procs_launched(void);
/* Launched as one of several processes: the launcher's size variable says
 * more than one (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS), or,
 * where only a rank is given (PMIX_RANK), this is not rank 0. */
bool gp_procs_launched_many(void);
/* Whether this build can run under mpirun. */
bool gp_procs_available(void);
/* MPI_Init_thread when launched (else nothing, rank 0 of 1).  Idempotent. */
gp_status gp_procs_init(void);
/* MPI_Finalize if gp_procs_init initialised MPI. */
void gp_procs_finalize(void);
/* Whether MPI is running (gp_procs_init succeeded under a launcher). */
bool gp_procs_active(void);
int gp_procs_rank(void);  /* 0 when not active */
int gp_procs_size(void);  /* 1 when not active */
/* Kill every process of the run (MPI_Abort): after one of them failed and
 * said why, so that none is left blocked waiting for the one that died. */
_Noreturn void gp_procs_abort(int code);
/* This process's gp_now() minus rank 0's at the same instant, seconds
 * (measured at init: the ping-pong of least round trip, of 16 with each
 * rank); 0 on rank 0 and without processes.  Traces record it so that
 * scripts/timeline.py merge puts every rank on rank 0's time axis. */
double gp_procs_clock_offset(void);

/* A send in flight. */
typedef struct gp_procs_req {
    void *impl;  /* MPI_Request, allocated */
    float *host; /* gp_procs_isend_dev's host copy, freed with the request */
    int peer;    /* the rank it goes to (the watchdog names it) */
} gp_procs_req;

/* Send n floats to `to` with `tag` without waiting; *req completes it. */
gp_status gp_procs_isend(const float *data, int64_t n, int to, int tag, gp_procs_req *req);
/* Whether *req has completed (then it is released); *done false otherwise. */
gp_status gp_procs_test(gp_procs_req *req, bool *done);
/* Wait for *req and release it. */
gp_status gp_procs_wait(gp_procs_req *req);
/* Wait until a message from `from` with `tag` has arrived (MPI_Probe). */
gp_status gp_procs_probe(int from, int tag);
/* Receive exactly n floats from `from` with `tag` into data (blocking). */
gp_status gp_procs_recv(float *data, int64_t n, int from, int tag);
/* The same for n floats in memory of device dev: sent from where they are
 * on a CPU device, through a host copy (gp_dev_download / gp_dev_upload)
 * on any other (a GPU: no CUDA-aware MPI or NCCL needed, at the cost of
 * the copies).  GPIPE_PROCS_STAGE=1 stages CPU devices too, which is how
 * the tests run the GPU path's logic without a GPU.  Between two GPUs the
 * executor uses channels instead (backend.h, chan_open: NCCL), and this
 * only where a flow cannot take one (pipeline.c, "Channels"). */
gp_status gp_procs_isend_dev(gp_device *dev, const float *data, int64_t n, int to, int tag,
                             gp_procs_req *req);
gp_status gp_procs_recv_dev(gp_device *dev, float *data, int64_t n, int from, int tag);
/* Send / receive `bytes` bytes with `tag`, blocking (snapshots and
 * evaluation, between steps). */
gp_status gp_procs_send_bytes(const void *data, size_t bytes, int to, int tag);
gp_status gp_procs_recv_bytes(void *data, size_t bytes, int from, int tag);
/* A communicator over processes for data parallelism: the ranks that call
 * it with the same `color` (the pipeline device they run) form one group,
 * ordered by `key` (their replica); devs[0 .. n) are the group's devices as
 * this process knows them (its own at index key, stand-ins elsewhere), for
 * gp_comm_rank.  Its collectives (gp_comm.ops) are MPI's, with the CPU
 * communicator's sums in rank order, so results are bitwise those of the
 * same replicas as threads of one process.  A collective over every rank:
 * all call it.  gp_comm_destroy frees it. */
gp_status gp_procs_comm_create(gp_device *const *devs, int n, int color, int key, gp_comm **out);
/* Every rank's v[0 .. n), summed in rank order into v on every rank. */
gp_status gp_procs_sum_doubles(double *v, int n);
/* Broadcast bytes from root to every rank. */
gp_status gp_procs_bcast(void *data, size_t bytes, int root);
/* The largest of every rank's *x, on every rank (decisions every rank
 * must take together: stop, snapshot now). */
gp_status gp_procs_max_int(int *x);
/* The same, element-wise, for v[0 .. n). */
gp_status gp_procs_max_doubles(double *v, int n);
/* Channels' host transport (backend.h, chan_open: CPU devices with
 * GPIPE_CPU_STREAMS=threads): `bytes` bytes to or from rank `peer` on a
 * communicator of the channels' own, `tag` naming the channel.  The send
 * is synchronous (MPI_Ssend: it ends only once the receive has started),
 * the rendezvous NCCL's point-to-point has on a GPU, so a channel order
 * that would deadlock there deadlocks in the tests; the receive wants
 * exactly `bytes`. */
/* cancel (may be NULL): polled while the transfer waits; once nonzero it
 * gives up with GP_ERR_CANCELLED (a receive is cancelled, a send left to
 * MPI: the process is about to end the run). */
gp_status gp_procs_chan_send(const void *buf, size_t bytes, int peer, int tag,
                             const _Atomic int *cancel);
gp_status gp_procs_chan_recv(void *buf, size_t bytes, int peer, int tag,
                             const _Atomic int *cancel);
/* Every rank's `bytes` bytes at mine, in rank order, into all (size x
 * bytes); a collective over every rank. */
gp_status gp_procs_allgather_bytes(const void *mine, void *all, size_t bytes);
/* A phase's outcome, agreed (a collective over every rank: each calls it
 * after the phase, whatever its status s).  A rank whose own failure it is
 * (s neither GP_OK nor GP_ERR_CANCELLED) gets s back.  Where another rank
 * failed on its own, a rank that did not gets GP_ERR_CANCELLED, "rank r of
 * N failed <during> (its message says why)" naming the lowest such rank
 * (a rank already cancelled keeps its message), and *other_failed = true.
 * Every rank failing on its own sets *all_failed (flags may be NULL).
 * Afterwards every rank's status is GP_OK or none is, so the collectives
 * after it are reached by every rank or by none.  One process: s. */
gp_status gp_procs_agree(gp_status s, const char *during, bool *other_failed, bool *all_failed);
/* The watchdog.  MPI ends the run when a process ends, not when one stops
 * answering (SIGSTOP, a hung file system or device): every wait on other
 * ranks here (receives, probes, synchronous sends, collectives) is watched,
 * and one longer than `seconds` (pipeline.peer_timeout) says which rank and
 * stages it waited for, and for what, and ends every rank (MPI_Abort, exit
 * status 4).  gp_procs_watch starts it (MPI builds, several ranks; again:
 * new values); n_devices and n_stages name each rank's stages (rank r runs
 * device r mod n_devices of replica r div n_devices).  Thread-safe. */
void gp_procs_watch(double seconds, int n_devices, int n_stages, gp_schedule_kind schedule);
/* What the ranks are doing ("step 12 of 400"), said with a wait that
 * lasts. */
void gp_procs_watch_phase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* What is saved and how to go on, said last with a wait that lasts. */
void gp_procs_watch_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* What the calling thread's next wait is for, in words ("stage 1's
 * gradient of micro-batch 3"); the text serves that one wait. */
void gp_procs_wait_for(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The largest message tag this MPI allows (MPI_TAG_UB; at least 32767). */
int gp_procs_tag_ub(void);
/* For a failure this rank meets alone where the others cannot be told (they
 * wait for its messages): say it, naming the rank, and end every rank with
 * gpipe-train's exit status for s (2 config, 3 data or file, 4 run). */
_Noreturn void gp_procs_fail(gp_status s);

#endif
