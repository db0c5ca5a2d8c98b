/*
 * test_replicas.c — data parallelism: the CPU collectives, replicas of a
 * pipeline against the single-device run, synchronised batch norm, failure
 * handling, the devices grid in the config, and the large-batch LR rule.
 *
 *   - all-reduce and broadcast between R in {1..4} device threads against
 *     a sequential sum in rank order, for many sizes (incl. 0 and sizes not
 *     divisible by R), bitwise; abort releases blocked ranks, reset re-arms;
 *   - R in {1, 2, 3} replicas x n in {1, 2} stages: parameters after 5 steps
 *     equal the single-device run over the global batch with R x chunks
 *     micro-batches within 1e-5 relative (an MLP with dropout, and a convnet
 *     whose batch norm is not synchronised: running statistics too), and
 *     the replicas stay bitwise identical;
 *   - SyncBN: R replicas' forward and backward equal one batch norm over the
 *     concatenated micro-batches, the backward agrees with finite
 *     differences, and unsynchronised BN gives different outputs; in a model
 *     (with recomputation) the replicas stay identical;
 *   - a fault in one replica cancels all of them promptly, names the
 *     replica, changes no parameter, and the next step works;
 *   - pipeline.devices as a grid, and replicas: R with a plain list;
 *   - lr_scaling: linear composes with warm-up.
 * Every device runs 1 math thread.  Runs under ThreadSanitizer (label
 * "threads").
 */
#include "pipeline/pipeline.h"
#include "test_util.h"
#include "layers/layers_impl.h"
#include "backend/elementwise.h"

#include <pthread.h>
#include <time.h>

enum { MAXR = 4 };

static gp_device *devs[8];

static void open_devs(void) { gpt_open_cpu_devices(devs, 8, 1); }

/* ---- collectives ------------------------------------------------------- */

typedef struct {
    gp_comm *comm;
    gp_device *dev;
    int rank, R;
    int64_t n;
    int kind;            /* COLL_* */
    int root;
    gp_status st;
    float *buf;          /* the rank's device buffer */
} coll_job;

enum { COLL_ALLREDUCE, COLL_BROADCAST, COLL_REDUCE_SCATTER, COLL_ALL_GATHER, COLL_RS_AG,
       COLL_KINDS };
static const char *const coll_names[COLL_KINDS] = {"all-reduce", "broadcast", "reduce-scatter",
                                                   "all-gather", "reduce-scatter + all-gather"};

static float value(int rank, int64_t n, int64_t e)
{
    return (float)(((e * 37 + rank * 11 + n) % 101) - 50) / 7.0f + (float)rank * 1e-3f;
}

/* The rank whose chunk (gp_comm_chunk) holds element e of n. */
static int chunk_owner(int64_t n, int R, int64_t e)
{
    for (int k = 0; k < R; k++) {
        int64_t lo, hi;
        gp_comm_chunk(n, R, k, &lo, &hi);
        if (e >= lo && e < hi) return k;
    }
    return -1;
}

static void *coll_thread(void *arg)
{
    coll_job *c = arg;
    gp_device_bind_thread(c->dev);
    for (int64_t e = 0; e < c->n; e++) c->buf[e] = value(c->rank, c->n, e);
    switch (c->kind) {
    case COLL_BROADCAST: c->st = gp_dev_broadcast(c->dev, c->comm, c->buf, c->n, c->root); break;
    case COLL_REDUCE_SCATTER: c->st = gp_dev_reduce_scatter(c->dev, c->comm, c->buf, c->n); break;
    case COLL_ALL_GATHER: c->st = gp_dev_all_gather(c->dev, c->comm, c->buf, c->n); break;
    case COLL_RS_AG:
        c->st = gp_dev_reduce_scatter(c->dev, c->comm, c->buf, c->n);
        if (c->st == GP_OK) c->st = gp_dev_all_gather(c->dev, c->comm, c->buf, c->n);
        break;
    default: c->st = gp_dev_allreduce(c->dev, c->comm, c->buf, c->n);
    }
    return NULL;
}

static void collectives(void)
{
    const int64_t sizes[] = {0, 1, 2, 3, 5, 7, 64, 1000, 4097, 65537, 200003};
    int cases = 0, bad = 0;
    for (int R = 1; R <= MAXR; R++) {
        gp_comm *comm = NULL;
        CHECK_OK(gp_comm_create(devs, R, &comm));
        if (!comm) continue;
        for (size_t q = 0; q < sizeof sizes / sizeof *sizes; q++)
            for (int kind = 0; kind < COLL_KINDS; kind++) {
                int64_t n = sizes[q];
                coll_job job[MAXR];
                pthread_t th[MAXR];
                gp_tensor t[MAXR];
                for (int r = 0; r < R; r++) {
                    gp_shape sh = {1, {n > 0 ? n : 1, 0, 0, 0}};
                    CHECK_OK(gp_tensor_alloc(&t[r], devs[r], &sh, GP_MEM_WORKSPACE));
                    job[r] = (coll_job){comm, devs[r], r, R, n, kind, R - 1, GP_OK, gp_f32(&t[r])};
                    pthread_create(&th[r], NULL, coll_thread, &job[r]);
                }
                for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
                for (int r = 0; r < R; r++) {
                    CHECK_OK(job[r].st);
                    /* reduce-scatter defines only the rank's own chunk */
                    int64_t lo = 0, hi = n;
                    if (kind == COLL_REDUCE_SCATTER) gp_comm_chunk(n, R, r, &lo, &hi);
                    bool same = true;
                    for (int64_t e = lo; e < hi && same; e++) {
                        float want;
                        if (kind == COLL_BROADCAST) want = value(R - 1, n, e);
                        else if (kind == COLL_ALL_GATHER) {
                            want = value(chunk_owner(n, R, e), n, e);
                        } else {
                            want = value(0, n, e); /* rank order, as the owner sums */
                            for (int k = 1; k < R; k++) want += value(k, n, e);
                        }
                        same = job[r].buf[e] == want;
                    }
                    if (!same) {
                        if (bad < 5)
                            fprintf(stderr, "%s R=%d n=%lld rank %d differs\n", coll_names[kind],
                                    R, (long long)n, r);
                        bad++;
                    }
                    cases++;
                }
                for (int r = 0; r < R; r++) gp_tensor_free(&t[r]);
            }
        gp_comm_destroy(comm);
    }
    CHECK_MSG(bad == 0, "%d of %d rank results differ from the sequential sum", bad, cases);
    printf("test_replicas: collectives (all-reduce, broadcast, reduce-scatter, all-gather and "
           "the two chained): %d rank results, all bitwise equal to the sequential sum / root / "
           "owner\n", cases);

    /* Abort: ranks 0 and 1 wait for rank 2, which never comes. */
    gp_comm *comm = NULL;
    CHECK_OK(gp_comm_create(devs, 3, &comm));
    if (!comm) return;
    coll_job job[2];
    pthread_t th[2];
    float bufs[2][1000];
    for (int r = 0; r < 2; r++) {
        job[r] = (coll_job){comm, devs[r], r, 3, 1000, COLL_ALLREDUCE, 0, GP_OK, bufs[r]};
        pthread_create(&th[r], NULL, coll_thread, &job[r]);
    }
    nanosleep(&(struct timespec){0, 50000000}, NULL);
    double t0 = gp_now();
    gp_comm_abort(comm);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    CHECK_MSG(gp_now() - t0 < 5.0, "abort took %.1f s", gp_now() - t0);
    for (int r = 0; r < 2; r++) CHECK(job[r].st == GP_ERR_CANCELLED);
    /* and after a reset the group works again */
    gp_comm_reset(comm);
    coll_job j3[3];
    pthread_t t3[3];
    float b3[3][10];
    for (int r = 0; r < 3; r++) {
        j3[r] = (coll_job){comm, devs[r], r, 3, 10, COLL_ALLREDUCE, 0, GP_OK, b3[r]};
        pthread_create(&t3[r], NULL, coll_thread, &j3[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(t3[r], NULL);
    for (int r = 0; r < 3; r++) {
        CHECK_OK(j3[r].st);
        CHECK(b3[r][4] == value(0, 10, 4) + value(1, 10, 4) + value(2, 10, 4));
    }
    gp_comm_destroy(comm);
}

/* ---- the sharded SGD step as one collective ------------------------------ */

typedef struct {
    gp_device *dev;
    gp_comm *comm;
    float *w, *g, *v;
    int64_t n;
    float lr, mu, wd;
    int nesterov;
    gp_status st;
} sgd_job;

static void *sgd_thread(void *arg)
{
    sgd_job *c = arg;
    gp_device_bind_thread(c->dev);
    c->st = gp_dev_sharded_sgd(c->dev, c->comm, c->w, c->g, c->v, c->n, c->lr, c->mu, c->wd,
                               c->nesterov);
    return NULL;
}

static float w_init(int64_t n, int64_t e) { return (float)((e * 13 + n) % 17 - 8) / 9.0f; }
static float v_init(int rank, int64_t e) { return (float)((e * 7 + rank * 5) % 23 - 11) / 31.0f; }

/* One case: R ranks run gp_dev_sharded_sgd on devices ds (whose comm is
 * comm) and must all end with the w that the sequential rank-order sum and
 * gp_ew_sgd give, rank r with its momentum, which is chunk r alone (ZeRO
 * stage 1), updated the same way.  Returns the number of wrong ranks. */
static int sharded_case(gp_device **ds, gp_comm *comm, int R, int64_t n, float mu, float wd,
                        int nesterov, bool skew)
{
    bool stateless = mu == 0.0f && !nesterov; /* plain SGD: no momentum (v NULL) */
    /* skew: odd ranks' w one float off the others' alignment, so the pushes
     * into peers take the unaligned path too */
    float *w[MAXR], *g[MAXR], *v[MAXR], *wbase[MAXR];
    for (int r = 0; r < R; r++) {
        int64_t lo, hi;
        gp_comm_chunk(n, R, r, &lo, &hi);
        wbase[r] = malloc((size_t)(n + 1) * sizeof(float));
        w[r] = wbase[r] + (skew && r % 2);
        g[r] = malloc((size_t)n * sizeof(float));
        /* (malloc'd to its size exactly: AddressSanitizer sees a read past it) */
        v[r] = stateless ? NULL : malloc((size_t)(hi > lo ? hi - lo : 1) * sizeof(float));
        for (int64_t e = 0; e < n; e++) {
            w[r][e] = w_init(n, e);
            g[r][e] = value(r, n, e);
            if (v[r] && e >= lo && e < hi) v[r][e - lo] = v_init(r, e);
        }
    }
    sgd_job job[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < R; r++) {
        job[r] = (sgd_job){ds[r], comm, w[r], g[r], v[r], n, 0.05f, mu, wd, nesterov, GP_OK};
        pthread_create(&th[r], NULL, sgd_thread, &job[r]);
    }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
    int wrong = 0;
    for (int r = 0; r < R; r++) {
        CHECK_OK(job[r].st);
        int64_t lo, hi;
        gp_comm_chunk(n, R, r, &lo, &hi);
        bool same = true;
        for (int64_t e = 0; e < n && same; e++) {
            int owner = chunk_owner(n, R, e);
            float sum = value(0, n, e);
            for (int k = 1; k < R; k++) sum += value(k, n, e);
            float ww = w_init(n, e), vv = stateless ? 0.0f : v_init(owner, e);
            gp_ew_sgd(&ww, sum, &vv, 0.05f, mu, wd, nesterov);
            same = w[r][e] == ww && (stateless || e < lo || e >= hi || v[r][e - lo] == vv);
        }
        wrong += !same;
    }
    for (int r = 0; r < R; r++) {
        free(wbase[r]);
        free(g[r]);
        free(v[r]); /* (NULL: plain SGD) */
    }
    return wrong;
}

/* The first MAXR devices again, behind `iface` (a copy of theirs with an
 * optional slot cleared): the path a backend without that slot takes,
 * exercised on the CPU. */
static void devices_with(const gp_device_iface *iface, gp_device *copies, gp_device **cds)
{
    for (int r = 0; r < MAXR; r++) {
        copies[r] = *devs[r];
        copies[r].iface = iface;
        /* their own accounting (a copied mutex is not a mutex) */
        gp_allocator_init(&copies[r].alloc, devs[r]->name, 0);
        cds[r] = &copies[r];
    }
}

static void devices_release(gp_device *copies)
{
    for (int r = 0; r < MAXR; r++) gp_allocator_destroy(&copies[r].alloc);
}

static void sharded_sgd(void)
{
    const int64_t sizes[] = {1, 2, 3, 5, 1000, 1023, 1025, 4097, 65537, 200003};
    /* mu, wd, nesterov; the last plain SGD, which keeps no momentum */
    const float opt[3][3] = {{0.9f, 0.0f, 0}, {0.5f, 0.01f, 1}, {0.0f, 0.01f, 0}};
    /* The composition gp_dev_sharded_sgd falls back to (reduce-scatter,
     * sgd_update, all-gather) where a backend has no sharded_sgd, e.g. CUDA:
     * the same CPU devices behind an interface without the slot. */
    gp_device_iface plain = *devs[0]->iface;
    plain.sharded_sgd = NULL;
    gp_device copies[MAXR], *cds[MAXR];
    devices_with(&plain, copies, cds);
    int cases = 0, bad = 0;
    for (int path = 0; path < 2; path++)
        for (int R = 1; R <= MAXR; R++) {
            gp_device **ds = path ? cds : devs;
            gp_comm *comm = NULL;
            CHECK_OK(gp_comm_create(ds, R, &comm));
            if (!comm) continue;
            for (size_t q = 0; q < sizeof sizes / sizeof *sizes; q++)
                for (int o = 0; o < 6; o++) {
                    bool skew = o >= 3;
                    int wrong = sharded_case(ds, comm, R, sizes[q], opt[o % 3][0],
                                             opt[o % 3][1], (int)opt[o % 3][2], skew);
                    if (wrong && bad < 5)
                        fprintf(stderr, "sharded SGD (%s%s) R=%d n=%lld: %d rank(s) differ\n",
                                path ? "composed" : "fused", skew ? ", skewed w" : "", R,
                                (long long)sizes[q], wrong);
                    bad += wrong;
                    cases += R;
                }
            gp_comm_destroy(comm);
        }
    devices_release(copies);
    /* The CPU's loop split over OpenMP threads (devices with 2 math
     * threads); OpenMP's runtime is not instrumented for ThreadSanitizer, so
     * the sanitizer builds leave this case out. */
    const char *san = getenv("GPIPE_SANITIZED");
    if (!san || !*san) {
        gp_device_opts two = {.threads = 2};
        gp_device *t2[2];
        CHECK_OK(gp_device_open("cpu:0", &two, &t2[0]));
        CHECK_OK(gp_device_open("cpu:1", &two, &t2[1]));
        gp_comm *comm = NULL;
        CHECK_OK(gp_comm_create(t2, 2, &comm));
        if (comm) {
            for (int o = 0; o < 3; o++) {
                bad += sharded_case(t2, comm, 2, 200003, opt[o][0], opt[o][1], (int)opt[o][2],
                                    o == 1);
                cases += 2;
            }
            gp_comm_destroy(comm);
        }
        gp_device_close(t2[0]);
        gp_device_close(t2[1]);
    }
    CHECK_MSG(bad == 0, "%d of %d ranks differ from the sequential sum + update", bad, cases);
    printf("test_replicas: sharded SGD step (fused on the CPU, and composed of reduce-scatter, "
           "update and all-gather): %d rank results, all bitwise equal to the rank-order sum "
           "and gp_ew_sgd; each rank's momentum its chunk alone (ZeRO stage 1)\n", cases);
}

/* ---- the group barrier ---------------------------------------------------- */

typedef struct {
    gp_device *dev;
    gp_comm *comm;
    int rank, R;
    volatile int *arrived; /* each rank sets its slot before the barrier */
    int seen;              /* slots set when this rank left the barrier */
    gp_status st;
} bar_job;

static void *bar_thread(void *arg)
{
    bar_job *b = arg;
    gp_device_bind_thread(b->dev);
    /* ranks arrive at different times: the later ones sleep first */
    nanosleep(&(struct timespec){0, 20000000L * b->rank}, NULL);
    __atomic_store_n(&b->arrived[b->rank], 1, __ATOMIC_SEQ_CST);
    b->st = gp_dev_barrier(b->dev, b->comm);
    b->seen = 0;
    for (int q = 0; q < b->R; q++) b->seen += __atomic_load_n(&b->arrived[q], __ATOMIC_SEQ_CST);
    return NULL;
}

static void group_barrier(void)
{
    /* the CPU's slot, and the fallback (all-reduce + synchronize) that a
     * backend without the slot gets: the same devices without the slot */
    gp_device_iface plain = *devs[0]->iface;
    plain.barrier = NULL;
    gp_device copies[MAXR], *cds[MAXR];
    devices_with(&plain, copies, cds);
    for (int path = 0; path < 2; path++)
        for (int R = 1; R <= 3; R++) {
            gp_device **ds = path ? cds : devs;
            gp_comm *comm = NULL;
            CHECK_OK(gp_comm_create(ds, R, &comm));
            if (!comm) continue;
            int arrived[MAXR] = {0};
            bar_job job[MAXR];
            pthread_t th[MAXR];
            for (int r = 0; r < R; r++) {
                job[r] = (bar_job){ds[r], comm, r, R, arrived, 0, GP_OK};
                pthread_create(&th[r], NULL, bar_thread, &job[r]);
            }
            for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
            for (int r = 0; r < R; r++) {
                CHECK_OK(job[r].st);
                CHECK_MSG(job[r].seen == R, "%s barrier, R=%d: rank %d left it when %d of %d "
                          "had arrived", path ? "fallback" : "CPU", R, r, job[r].seen, R);
            }
            gp_comm_destroy(comm);
        }
    devices_release(copies);
    /* aborted: the ranks that came return GP_ERR_CANCELLED, nobody hangs */
    gp_comm *comm = NULL;
    CHECK_OK(gp_comm_create(devs, 3, &comm));
    if (!comm) return;
    int arrived[3] = {0};
    bar_job job[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        job[r] = (bar_job){devs[r], comm, r, 3, arrived, 0, GP_OK};
        pthread_create(&th[r], NULL, bar_thread, &job[r]);
    }
    nanosleep(&(struct timespec){0, 100000000L}, NULL);
    gp_comm_abort(comm);
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        CHECK(job[r].st == GP_ERR_CANCELLED);
    }
    gp_comm_destroy(comm);
    printf("test_replicas: group barrier (CPU slot and the all-reduce fallback, R = 1..3, "
           "and abort)\n");
}

/* ---- models ------------------------------------------------------------- */

enum { BATCH = 12 };
static gp_layer_spec specs[GPT_MAX_SPECS];

static gp_config make_cfg(bool convnet, bool sync)
{
    gp_config c = gpt_model_cfg(specs, convnet, sync, BATCH);
    c.pipeline.chunks = 2;
    c.pipeline.checkpoint = GP_CKPT_EXCEPT_LAST;
    return c;
}

static void make_batch(const gp_config *c, int step, float *x, float *y)
{
    gpt_make_batch(c, BATCH, step, x, y);
}

static float clip_norm; /* equivalence's train.clip_grad_norm; 0: off */
/* host waits of replica 0's first device in a clipped step, by R (the
 * mlp on gpipe's schedule; 0: not measured) */
static uint64_t clip_waits[8];

/* R replicas x n stages vs the single-device run with R x chunks, with
 * optimizer `opt` (Adam's states are sharded and gathered as momentum). */
static void equivalence(bool convnet, int R, int n, gp_schedule_kind kind, gp_optim_kind opt)
{
    gp_config c = make_cfg(convnet, false);
    c.train.clip_grad_norm = clip_norm;
    if (opt != GP_OPTIM_SGD) {
        gpt_set_adam(&c, opt);
        /* A convolution's bias before a batch norm has a gradient of 0
         * exactly and of rounding noise in floats, which Adam scales up to
         * a full step whose sign the summation order decides: such biases
         * differ between any two orders (PyTorch's too).  Models leave them
         * out (ResNet's convolutions have none); so does this one. */
        for (int k = 0; k + 1 < c.model.n_layers; k++)
            if (c.model.layers[k].type == GP_LAYER_CONV2D &&
                c.model.layers[k + 1].type == GP_LAYER_BATCHNORM)
                c.model.layers[k].bias = false;
    }
    int bal[4];
    gpt_set_schedule(&c, kind, n, bal); /* the reference accumulates in its order */
    if (kind == GP_SCHEDULE_DUALPIPE_V) c.pipeline.chunks = 2 * n; /* its least */
    gp_model ref, rep;
    if (gp_model_build(&c, devs[R * n], &ref) != GP_OK ||
        gp_model_build_replicated(&c, devs, R, n, bal, &rep) != GP_OK) {
        CHECK_MSG(0, "build: %s", gp_last_error());
        return;
    }
    float x[BATCH * 72], y[BATCH];
    double worst_loss = 0;
    bool ok = true;
    for (int step = 0; step < 5 && ok; step++) {
        make_batch(&c, step, x, y);
        gp_step_stats a, b;
        if (clip_norm > 0 && step == 2) {
            /* a NaN: every replica's CLIP refuses the step before any
             * update (the one-device run refuses its loss), and the steps
             * after it go on as if it had not been there */
            x[5] = NAN;
            gp_status s1 = gp_model_train_step(&ref, &c, x, y, BATCH, R * c.pipeline.chunks,
                                               0.05, &a);
            gp_status s2 = gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, &b);
            CHECK_MSG(s1 == GP_ERR_NUMERIC && s2 == GP_ERR_NUMERIC && rep.refused &&
                          strstr(gp_last_error(), "the update was skipped"),
                      "R=%d n=%d: a NaN step: %s (refused %d)", R, n, gp_last_error(),
                      rep.refused);
            continue;
        }
        gp_status s1 = gp_model_train_step(&ref, &c, x, y, BATCH, R * c.pipeline.chunks, 0.05, &a);
        uint64_t w0 = gp_dev_host_waits(devs[0]);
        gp_status s2 = gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, &b);
        if (clip_norm > 0 && step == 3 && !convnet && kind == GP_SCHEDULE_GPIPE &&
            opt == GP_OPTIM_SGD && R < 8)
            clip_waits[R] = gp_dev_host_waits(devs[0]) - w0;
        if (s1 != GP_OK || s2 != GP_OK) {
            CHECK_MSG(0, "step: %s", gp_last_error());
            ok = false;
            break;
        }
        worst_loss = fmax(worst_loss, fabs(a.loss - b.loss) / fmax(fabs(a.loss), 1e-6));
        if (clip_norm > 0) /* the norm over every replica's chunks, clipped (over the limit) */
            CHECK_MSG(fabs(a.grad_norm - b.grad_norm) <= 1e-5 * a.grad_norm &&
                      a.grad_norm > clip_norm,
                      "R=%d n=%d step %d: grad norm %.9g, one device %.9g (limit %g)", R, n, step,
                      b.grad_norm, a.grad_norm, clip_norm);
    }
    if (!ok) goto done;
    bool same_count;
    double worst = gpt_param_diff(&ref, &rep, &same_count);
    /* Adam's steps are lr-sized whatever the gradient's size, so the
     * rounding of another summation order moves a small parameter further
     * than SGD's lr * g does: 1e-4 relative (1e-6 absolute at the 1e-2
     * floor) for Adam, 1e-5 for SGD. */
    double tol = opt == GP_OPTIM_SGD ? 1e-5 : 1e-4;
    CHECK_MSG(same_count && worst <= tol && worst_loss <= 1e-5,
              "%s %s R=%d n=%d: parameters differ by %.3g relative, loss by %.3g",
              c.train.optim.type, convnet ? "convnet" : "mlp", R, n, worst, worst_loss);
    CHECK_OK(gp_model_check_replicas(&rep));
    /* The optimizer state too.  Updates are sharded (the CPU backend can
     * reduce-scatter), and so is the state (ZeRO stage 1): replica r holds
     * only chunk r of each state tensor (gp_comm_chunk's hi - lo elements,
     * so the R replicas hold it once between them), and the chunks put
     * together are the single-device run's state. */
    double worst_m = 0;
    int compared = 0, trainable = 0, whole_size = 0;
    int per = gp_optim_states_per_param(gp_optim_options(ref.optim));
    for (int k = 0; k < ref.n_layers; k++)
        for (int q = 0; q < ref.layers[k].n_params * per; q++) {
            gp_tensor *ma = gp_optim_state(ref.optim, k, q / per, q % per);
            trainable += !ref.layers[k].params[q / per].is_buffer;
            if (!ma) continue;
            int64_t cnt = gp_tensor_numel(ma);
            float *a = malloc((size_t)cnt * sizeof *a), *b = malloc((size_t)cnt * sizeof *b);
            gp_dev_download(ma->dev, a, gp_f32(ma), cnt);
            bool all = true;
            for (int r = 0; r < R; r++) {
                gp_model *mr = r ? &rep.replicas[r - 1] : &rep;
                gp_tensor *mb = gp_optim_state(mr->optim, k, q / per, q % per);
                int64_t lo, hi, want_lo, want_hi;
                bool part = mb && gp_optim_state_range(mr->optim, k, q / per, &lo, &hi);
                gp_comm_chunk(cnt, R, r, &want_lo, &want_hi);
                if (!mb || (R > 1 && (!part || lo != want_lo || hi != want_hi ||
                                      gp_tensor_numel(mb) != hi - lo))) {
                    whole_size += R > 1;
                    all = false;
                    continue;
                }
                gp_dev_download(mb->dev, b + lo, gp_f32(mb), hi - lo);
            }
            for (int64_t e = 0; all && e < cnt; e++)
                worst_m = fmax(worst_m, fabs((double)a[e] - b[e]) / fmax(fabs((double)a[e]), 1e-2));
            free(a);
            free(b);
            compared += all;
        }
    /* what the devices hold: the R x n replica devices' optimizer bytes
     * together are the one device's (each replica 1/R of them) */
    size_t opt_rep = 0, opt_one = devs[R * n]->alloc.cur_by[GP_MEM_OPTIMIZER];
    for (int d = 0; d < R * n; d++) opt_rep += devs[d]->alloc.cur_by[GP_MEM_OPTIMIZER];
    CHECK_MSG(opt_one > 0 && opt_rep == opt_one,
              "%s %s R=%d n=%d: the replicas hold %zu bytes of optimizer state, one device %zu",
              c.train.optim.type, convnet ? "convnet" : "mlp", R, n, opt_rep, opt_one);
    CHECK_MSG(whole_size == 0, "%s %s R=%d n=%d: %d replica states not their chunk alone",
              c.train.optim.type, convnet ? "convnet" : "mlp", R, n, whole_size);
    CHECK_MSG(compared == trainable && trainable > 0 && worst_m <= tol,
              "%s %s R=%d n=%d: the replicas' optimizer state put together differs by %.3g "
              "relative (%d of %d tensors compared)", c.train.optim.type,
              convnet ? "convnet" : "mlp", R, n, worst_m, compared, trainable);
done:
    gp_model_free(&ref);
    gp_model_free(&rep);
}

/* ---- SyncBN at the layer level --------------------------------------- */

enum { BN_C = 3, BN_HW = 4 };
static const int bn_n[MAXR] = {3, 2, 4, 1}; /* samples per replica */

typedef struct {
    gp_layer *l;
    gp_comm *comm;
    int rank;
    const float *x, *dy;  /* host (n, C, H, W) */
    float *y, *dx;        /* host out; dx NULL: forward only */
    gp_status st;
} bn_job;

static void *bn_thread(void *arg)
{
    bn_job *b = arg;
    gp_device *dev = b->l->dev;
    gp_device_bind_thread(dev);
    int n = bn_n[b->rank];
    gp_shape sh = gp_shape_4d(n, BN_C, 2, 2);
    int64_t cnt = gp_shape_numel(&sh);
    gp_tensor x = {0}, y = {0}, dy = {0}, dx = {0};
    gp_saved sv = {0};
    gp_fwd_ctx ctx = {.training = true, .step = 7, .sample_offset = 0, .batch_total = n,
                      .comm = b->comm, .rank = b->rank};
    gp_status s = gp_tensor_alloc(&x, dev, &sh, GP_MEM_ACTIVATIONS);
    if (s == GP_OK) s = gp_dev_upload(dev, gp_f32(&x), b->x, cnt);
    if (s == GP_OK) s = gp_layer_forward(b->l, &ctx, &x, &y, &sv);
    if (s == GP_OK) s = gp_dev_download(dev, b->y, gp_f32(&y), cnt);
    if (s == GP_OK && b->dx) {
        s = gp_tensor_alloc(&dy, dev, &sh, GP_MEM_ACTIVATIONS);
        if (s == GP_OK) s = gp_dev_upload(dev, gp_f32(&dy), b->dy, cnt);
        if (s == GP_OK) s = gp_layer_backward(b->l, &ctx, &x, &y, &dy, &dx, &sv);
        if (s == GP_OK) s = gp_dev_download(dev, b->dx, gp_f32(&dx), cnt);
    }
    gp_saved_free(&sv);
    gp_tensor_free(&x);
    gp_tensor_free(&y);
    gp_tensor_free(&dy);
    gp_tensor_free(&dx);
    b->st = s;
    return NULL;
}

/* Run R synchronised batch norms (one per thread) on xs; returns the loss
 * sum_r <y_r, dy_r> (double). */
static double bn_run(gp_layer *ls, gp_comm *comm, int R, float *const *xs, float *const *dys,
                     float **ys, float **dxs)
{
    bn_job job[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < R; r++) {
        job[r] = (bn_job){&ls[r], comm, r, xs[r], dys[r], ys[r], dxs ? dxs[r] : NULL, GP_OK};
        pthread_create(&th[r], NULL, bn_thread, &job[r]);
    }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
    double loss = 0;
    for (int r = 0; r < R; r++) {
        CHECK_OK(job[r].st);
        for (int e = 0; e < bn_n[r] * BN_C * BN_HW; e++) loss += (double)ys[r][e] * dys[r][e];
    }
    return loss;
}

static void sync_bn(int R)
{
    gp_layer_spec sp = gp_layer_spec_default(GP_LAYER_BATCHNORM);
    sp.sync = true;
    gp_shape in = gp_shape_4d(1, BN_C, 2, 2);
    gp_layer ls[MAXR], ref;
    gp_comm *comm = NULL;
    CHECK_OK(gp_comm_create(devs, R, &comm));
    for (int r = 0; r < R; r++) CHECK_OK(gp_layer_create(&sp, 0, &in, devs[r], 1, &ls[r]));
    CHECK_OK(gp_layer_create(&sp, 0, &in, devs[R], 1, &ref));
    /* gamma, beta not trivial */
    float gam[BN_C] = {1.5f, 0.7f, -1.1f}, bet[BN_C] = {0.1f, -0.2f, 0.3f};
    for (int r = 0; r <= R; r++) {
        gp_layer *l = r < R ? &ls[r] : &ref;
        gp_dev_upload(l->dev, gp_f32(&l->params[0].value), gam, BN_C);
        gp_dev_upload(l->dev, gp_f32(&l->params[1].value), bet, BN_C);
    }
    int total = 0, offs[MAXR + 1] = {0};
    for (int r = 0; r < R; r++) offs[r + 1] = offs[r] + bn_n[r] * BN_C * BN_HW, total += bn_n[r];
    float *X = malloc((size_t)offs[R] * sizeof *X), *DY = malloc((size_t)offs[R] * sizeof *DY);
    float *Y = malloc((size_t)offs[R] * sizeof *Y), *DX = malloc((size_t)offs[R] * sizeof *DX);
    float *Yr = malloc((size_t)offs[R] * sizeof *Yr), *DXr = malloc((size_t)offs[R] * sizeof *DXr);
    gp_rng_uniform_fill(5, (uint64_t)R, 0, X, offs[R]);
    gp_rng_uniform_fill(6, (uint64_t)R, 0, DY, offs[R]);
    for (int e = 0; e < offs[R]; e++) X[e] = X[e] * 4 - 1 + (float)(e % 3); /* per-replica shift */
    float *xs[MAXR], *dys[MAXR], *ys[MAXR], *dxs[MAXR];
    for (int r = 0; r < R; r++) {
        xs[r] = X + offs[r];
        dys[r] = DY + offs[r];
        ys[r] = Y + offs[r];
        dxs[r] = DX + offs[r];
    }
    bn_run(ls, comm, R, xs, dys, ys, dxs);
    /* the reference: one batch norm over the concatenation, no comm */
    {
        gp_device *dev = ref.dev;
        gp_shape sh = gp_shape_4d(total, BN_C, 2, 2);
        gp_tensor x = {0}, y = {0}, dy = {0}, dx = {0};
        gp_saved sv = {0};
        gp_fwd_ctx ctx = {.training = true, .batch_total = total};
        CHECK_OK(gp_tensor_alloc(&x, dev, &sh, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_tensor_alloc(&dy, dev, &sh, GP_MEM_ACTIVATIONS));
        gp_dev_upload(dev, gp_f32(&x), X, offs[R]);
        gp_dev_upload(dev, gp_f32(&dy), DY, offs[R]);
        CHECK_OK(gp_layer_forward(&ref, &ctx, &x, &y, &sv));
        CHECK_OK(gp_layer_backward(&ref, &ctx, &x, &y, &dy, &dx, &sv));
        gp_dev_download(dev, Yr, gp_f32(&y), offs[R]);
        gp_dev_download(dev, DXr, gp_f32(&dx), offs[R]);
        gp_saved_free(&sv);
        gp_tensor_free(&x); gp_tensor_free(&y); gp_tensor_free(&dy); gp_tensor_free(&dx);
    }
    double wy = 0, wdx = 0;
    for (int e = 0; e < offs[R]; e++) {
        wy = fmax(wy, fabs((double)Y[e] - Yr[e]));
        wdx = fmax(wdx, fabs((double)DX[e] - DXr[e]));
    }
    CHECK_MSG(wy <= 2e-5 && wdx <= 2e-5, "R=%d: SyncBN vs one BN: y differs by %.3g, dx by %.3g",
              R, wy, wdx);
    /* parameter gradients: the replicas' shares add up to the whole */
    float g[BN_C], b[BN_C], gs[BN_C] = {0}, bs[BN_C] = {0};
    for (int r = 0; r < R; r++) {
        gp_dev_download(ls[r].dev, g, gp_f32(&ls[r].params[0].grad), BN_C);
        gp_dev_download(ls[r].dev, b, gp_f32(&ls[r].params[1].grad), BN_C);
        for (int c = 0; c < BN_C; c++) gs[c] += g[c], bs[c] += b[c];
    }
    gp_dev_download(ref.dev, g, gp_f32(&ref.params[0].grad), BN_C);
    gp_dev_download(ref.dev, b, gp_f32(&ref.params[1].grad), BN_C);
    for (int c = 0; c < BN_C; c++) {
        CHECK_NEAR(gs[c], g[c], 1e-4, 1e-4);
        CHECK_NEAR(bs[c], b[c], 1e-4, 1e-4);
    }
    /* finite differences of L = sum_r <y_r, dy_r> through the synced forward */
    double worst = 0;
    const float h = 1e-2f;
    for (int probe = 0; probe < 6; probe++) {
        int r = probe % R, e = (probe * 7) % (bn_n[r] * BN_C * BN_HW);
        float keep = xs[r][e];
        float *ytmp[MAXR];
        float *Yt = malloc((size_t)offs[R] * sizeof *Yt);
        for (int q = 0; q < R; q++) ytmp[q] = Yt + offs[q];
        xs[r][e] = keep + h;
        double lp = bn_run(ls, comm, R, xs, dys, ytmp, NULL);
        xs[r][e] = keep - h;
        double lm = bn_run(ls, comm, R, xs, dys, ytmp, NULL);
        xs[r][e] = keep;
        free(Yt);
        double fd = (lp - lm) / (2.0 * h);
        worst = fmax(worst, fabs(fd - dxs[r][e]) / fmax(fabs(fd), 1.0));
    }
    CHECK_MSG(worst < 2e-3, "R=%d: SyncBN dx vs finite differences: %.3g", R, worst);
    /* without the communicator each replica normalises alone: different */
    if (R > 1) {
        float *Yl = malloc((size_t)offs[R] * sizeof *Yl);
        float *yl[MAXR];
        for (int q = 0; q < R; q++) yl[q] = Yl + offs[q];
        bn_run(ls, NULL, R, xs, dys, yl, NULL);
        double diff = 0;
        for (int e = 0; e < offs[R]; e++) diff = fmax(diff, fabs((double)Yl[e] - Y[e]));
        CHECK_MSG(diff > 1e-2, "R=%d: unsynchronised BN gives the same output (%.3g)", R, diff);
        free(Yl);
    }
    for (int r = 0; r < R; r++) gp_layer_destroy(&ls[r]);
    gp_layer_destroy(&ref);
    gp_comm_destroy(comm);
    free(X); free(DY); free(Y); free(DX); free(Yr); free(DXr);
}

/* SyncBN inside replicated pipelines, with recomputation. */
/* SyncBN over 2 replicas x 2 devices under every schedule: the replicas
 * stay identical, and every schedule trains to GPipe's parameters up to
 * the order the micro-batches' gradients are added in (1e-5 relative). */
static void sync_bn_schedules(void)
{
    float *ref = NULL;
    int64_t nref = 0;
    for (int k = 0; k < GP_SCHEDULE_KINDS; k++) {
        gp_config c = make_cfg(true, true);
        int bal[4];
        gpt_set_schedule(&c, (gp_schedule_kind)k, 2, bal);
        if (k == GP_SCHEDULE_DUALPIPE_V) continue; /* (its 4 micro-batches: another sum) */
        gp_model rep;
        CHECK_OK(gp_model_build_replicated(&c, devs, 2, 2, bal, &rep));
        float x[BATCH * 72], y[BATCH];
        for (int step = 0; step < 3; step++) {
            make_batch(&c, step, x, y);
            CHECK_OK(gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, NULL));
        }
        CHECK_OK(gp_model_check_replicas(&rep));
        int64_t na;
        float *pa = gpt_gather(&rep, GPT_VALUES, &na);
        if (k == 0) {
            ref = pa;
            nref = na;
        } else {
            double worst = 0;
            for (int64_t q = 0; q < na && na == nref; q++)
                worst = fmax(worst, fabs((double)pa[q] - ref[q]) / fmax(fabs((double)ref[q]), 1e-2));
            CHECK_MSG(na == nref && na > 0 && worst <= 1e-5,
                      "SyncBN %s: parameters differ from GPipe's by %.3g relative",
                      gp_schedule_kind_name((gp_schedule_kind)k), worst);
            free(pa);
        }
        gp_model_free(&rep);
    }
    free(ref);
}

static void sync_bn_model(void)
{
    float loss[2] = {0, 0};
    for (int sync = 0; sync < 2; sync++) {
        gp_config c = make_cfg(true, sync == 1);
        c.pipeline.checkpoint = GP_CKPT_ALWAYS;
        int bal[2];
        gpt_split_even(c.model.n_layers, 2, bal);
        gp_model rep;
        CHECK_OK(gp_model_build_replicated(&c, devs, 2, 2, bal, &rep));
        float x[BATCH * 72], y[BATCH];
        for (int step = 0; step < 3; step++) {
            make_batch(&c, step, x, y);
            gp_step_stats st;
            CHECK_OK(gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, &st));
            loss[sync] = (float)st.loss;
        }
        CHECK_OK(gp_model_check_replicas(&rep));
        CHECK(gp_batchnorm_batches_tracked(&rep.layers[1]) == 3);
        CHECK(gp_batchnorm_pending_count(&rep.layers[1]) == 0);
        gp_model_free(&rep);
    }
    CHECK_MSG(loss[0] != loss[1], "sync and plain BN trained to the same loss %g", loss[0]);
}

/* A residual block's inner norms: replicas commit the same running
 * statistics (merged before commit), so they stay identical. */
static void residual_model(void)
{
    gp_config c = make_cfg(true, false);
    int n = 0;
    specs[n] = gp_layer_spec_default(GP_LAYER_CONV2D);
    specs[n].out = 4; specs[n].kernel = gp_hw_square(3); specs[n].padding = gp_hw_square(1); n++;
    specs[n] = gp_layer_spec_default(GP_LAYER_RESIDUAL); specs[n].out = 6;
    specs[n].stride = gp_hw_square(2); n++;
    specs[n++] = gp_layer_spec_default(GP_LAYER_FLATTEN);
    specs[n] = gp_layer_spec_default(GP_LAYER_LINEAR); specs[n].out = 5; n++;
    c.model.n_layers = n;
    int bal[2] = {2, 2};
    gp_model rep;
    CHECK_OK(gp_model_build_replicated(&c, devs, 2, 2, bal, &rep));
    float x[BATCH * 72], y[BATCH];
    for (int step = 0; step < 2; step++) {
        make_batch(&c, step, x, y);
        CHECK_OK(gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, NULL));
    }
    CHECK_OK(gp_model_check_replicas(&rep));
    gp_model_free(&rep);
}

/* `sync: true` on a residual block reaches its inner norms: 2 replicas with
 * one micro-batch each normalise over the whole global batch, so they train
 * like one device with the global batch as a single micro-batch; without
 * sync they do not. */
static void residual_sync(void)
{
    double worst[2] = {0, 0};
    for (int sync = 0; sync < 2; sync++) {
        gp_config c = make_cfg(true, false);
        int n = 0;
        specs[n] = gp_layer_spec_default(GP_LAYER_CONV2D);
        specs[n].out = 4; specs[n].kernel = gp_hw_square(3);
        specs[n].padding = gp_hw_square(1); n++;
        specs[n] = gp_layer_spec_default(GP_LAYER_RESIDUAL);
        specs[n].out = 6; specs[n].stride = gp_hw_square(2); specs[n].sync = sync == 1; n++;
        specs[n++] = gp_layer_spec_default(GP_LAYER_FLATTEN);
        specs[n] = gp_layer_spec_default(GP_LAYER_LINEAR); specs[n].out = 5; n++;
        c.model.n_layers = n;
        c.pipeline.chunks = 1;
        int bal = n;
        gp_model ref, rep;
        CHECK_OK(gp_model_build(&c, devs[2], &ref));
        CHECK_OK(gp_model_build_replicated(&c, devs, 2, 1, &bal, &rep));
        float x[BATCH * 72], y[BATCH];
        for (int step = 0; step < 3; step++) {
            make_batch(&c, step, x, y);
            CHECK_OK(gp_model_train_step(&ref, &c, x, y, BATCH, 1, 0.05, NULL));
            CHECK_OK(gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, NULL));
        }
        bool same_count;
        worst[sync] = fmax(worst[sync], gpt_param_diff(&ref, &rep, &same_count));
        CHECK(same_count);
        CHECK_OK(gp_model_check_replicas(&rep));
        gp_model_free(&ref);
        gp_model_free(&rep);
    }
    CHECK_MSG(worst[1] <= 1e-4, "residual sync: 2 replicas differ from the global-batch run "
              "by %.3g relative", worst[1]);
    CHECK_MSG(worst[0] > 1e-3, "residual without sync matches the global-batch run (%.3g): the "
              "test cannot tell sync from no sync", worst[0]);
}

/* ---- failures --------------------------------------------------------------- */

/* R replicas of a 2-stage model (MLP or convnet), the group made by one
 * step on the batch x, y (BATCH x up to 72 inputs). */
static void two_stage_group(bool convnet, int R, gp_config *c, gp_model *rep, float *x,
                            float *y)
{
    *c = make_cfg(convnet, false);
    int bal[2];
    gpt_split_even(c->model.n_layers, 2, bal);
    if (convnet) { /* stage 0 = the first convolution; the batch norms in stage 1 */
        bal[0] = 1;
        bal[1] = c->model.n_layers - 1;
    }
    CHECK_OK(gp_model_build_replicated(c, devs, R, 2, bal, rep));
    make_batch(c, 0, x, y);
    CHECK_OK(gp_model_pipeline_step(rep, c, x, y, BATCH, 0.05, NULL)); /* makes the group */
}

static void faults(void)
{
    gp_config c;
    gp_model rep;
    float x[BATCH * 72], y[BATCH];
    two_stage_group(false, 3, &c, &rep, x, y);
    /* every instruction before the update: micro-batch 0's, and the end of
     * the step's up to the barrier (i = -1) */
    gp_instr_kind kinds[] = {GP_INSTR_FORWARD, GP_INSTR_BACKWARD, GP_INSTR_RECOMPUTE,
                             GP_INSTR_REDUCE_GRADS, GP_INSTR_REDUCE_STATS, GP_INSTR_BARRIER};
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 2; j++)
            for (int q = 0; q < 6; q++) {
                /* the CPU shards: stage 0's gradients are summed inside its
                 * fused update, so it has no REDUCE_GRADS */
                if (j == 0 && kinds[q] == GP_INSTR_REDUCE_GRADS) continue;
                gp_model *mr = r == 0 ? &rep : &rep.replicas[r - 1];
                gp_pipeline_set_fault(mr->pipe, kinds[q] >= GP_INSTR_REDUCE_GRADS ? -1 : 0, j,
                                      kinds[q]);
                int64_t n0;
                float *before = gpt_gather(&rep, GPT_VALUES, &n0);
                int64_t step0 = rep.step;
                double t0 = gp_now();
                gp_status s = gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, NULL);
                double dt = gp_now() - t0;
                char want[32];
                snprintf(want, sizeof want, "replica %d:", r);
                CHECK_MSG(s == GP_ERR_RUNTIME && strstr(gp_last_error(), want) &&
                              strstr(gp_last_error(), "injected fault"),
                          "fault %s in replica %d stage %d: %s '%s'", gp_instr_kind_name(kinds[q]),
                          r, j, gp_status_name(s), gp_last_error());
                CHECK_MSG(dt < 10.0, "a failed step took %.1f s", dt);
                int64_t n1;
                float *after = gpt_gather(&rep, GPT_VALUES, &n1);
                CHECK_MSG(n0 == n1 && !memcmp(before, after, (size_t)n0 * sizeof *before),
                          "a failed step changed the parameters");
                /* and says so: no replica began its update (gp_run_step goes
                 * on, the trainer snapshots this model) */
                CHECK_MSG(rep.refused, "fault %s in replica %d stage %d: not refused",
                          gp_instr_kind_name(kinds[q]), r, j);
                CHECK(rep.step == step0);
                free(before);
                free(after);
                gp_pipeline_set_fault(mr->pipe, 0, -1, GP_INSTR_FORWARD);
            }
    CHECK_OK(gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, NULL));
    CHECK_OK(gp_model_check_replicas(&rep));
    /* a batch too small for replicas x chunks */
    CHECK_ERR(gp_model_pipeline_step(&rep, &c, x, y, 5, 0.05, NULL), GP_ERR_INVALID,
              "3 replicas x 2 micro-batches");
    gp_model_free(&rep);
}

/* ---- config and LR ---------------------------------------------------------- */

#define MODEL "model:\n  input: [1, 4, 4]\n  layers: [flatten, {linear: {out: 5}}]\n"

/* A replica that fails late — its stage 0 still in its last backward when
 * the other replicas and its own later stages are through theirs — must
 * leave every replica's parameters and batch-norm statistics unchanged: the
 * later stages' updates wait for every replica (gp_dev_barrier).  Stage 0
 * holds no batch norm: its statistics all-reduce would otherwise make the
 * others wait for the late replica anyway and hide a missing barrier. */
static void late_fault(bool convnet)
{
    gp_config c;
    gp_model rep;
    float x[BATCH * 72], y[BATCH];
    two_stage_group(convnet, 2, &c, &rep, x, y);
    gp_model *late = &rep.replicas[0];
    gp_pipeline_set_fault(late->pipe, 0, 0, GP_INSTR_BACKWARD);
    gp_pipeline_set_fault_delay(late->pipe, 300);
    int64_t n0, n1, m0, m1;
    float *before = gpt_gather(&rep, GPT_VALUES, &n0), *before1 = gpt_gather(late, GPT_VALUES, &m0);
    gp_status s = gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, NULL);
    CHECK_MSG(s == GP_ERR_RUNTIME && strstr(gp_last_error(), "replica 1:"),
              "late fault: %s '%s'", gp_status_name(s), gp_last_error());
    float *after = gpt_gather(&rep, GPT_VALUES, &n1), *after1 = gpt_gather(late, GPT_VALUES, &m1);
    CHECK_MSG(n0 == n1 && !memcmp(before, after, (size_t)n0 * sizeof *before),
              "%s: a replica that failed late let replica 0 change its model",
              convnet ? "convnet" : "mlp");
    CHECK_MSG(m0 == m1 && !memcmp(before1, after1, (size_t)m0 * sizeof *before1),
              "%s: a replica that failed late changed its own model", convnet ? "convnet" : "mlp");
    free(before);
    free(after);
    free(before1);
    free(after1);
    gp_pipeline_set_fault_delay(late->pipe, 0);
    gp_pipeline_set_fault(late->pipe, 0, -1, GP_INSTR_FORWARD);
    CHECK_OK(gp_model_pipeline_step(&rep, &c, x, y, BATCH, 0.05, NULL));
    CHECK_OK(gp_model_check_replicas(&rep));
    gp_model_free(&rep);
}

static void config_grid(void)
{
    const char *grid = "model:\n  input: [1, 4, 4]\n  layers: [flatten, {linear: {out: 5}}]\n"
                       "pipeline:\n  devices: [[cpu:0, cpu:1], [cpu:2, cpu:3], [cpu:4, cpu:5]]\n"
                       "  balance: [1, 1]\n";
    gp_config c;
    CHECK_OK(gp_config_parse("grid.yaml", grid, strlen(grid), NULL, 0, &c));
    CHECK(c.pipeline.replicas == 3 && c.pipeline.n_devices == 2);
    CHECK(gp_pipeline_devices_total(&c.pipeline) == 6);
    CHECK(!strcmp(c.pipeline.devices[3].name, "cpu:3") && !strcmp(c.pipeline.devices[4].name, "cpu:4"));
    gp_config_free(&c);

    const char *flat = "model:\n  input: [1, 4, 4]\n  layers: [flatten, {linear: {out: 5}}]\n"
                       "pipeline: {devices: [cpu:0, cpu:1], replicas: 2}\n";
    CHECK_OK(gp_config_parse("flat.yaml", flat, strlen(flat), NULL, 0, &c));
    CHECK(c.pipeline.replicas == 2 && c.pipeline.n_devices == 2);
    CHECK(!strcmp(c.pipeline.devices[2].name, "cpu:2") && !strcmp(c.pipeline.devices[3].name, "cpu:3"));
    gp_config_free(&c);

    const char *bad_rows = MODEL "pipeline: {devices: [[cpu:0, cpu:1], [cpu:2]]}\n";
    CHECK_ERR(gp_config_parse("r.yaml", bad_rows, strlen(bad_rows), NULL, 0, &c), GP_ERR_INVALID,
              "pipeline.devices.1 must be a list of 2 devices");
    const char *clash = MODEL "pipeline: {devices: [[cpu:0], [cpu:1]], replicas: 3}\n";
    CHECK_ERR(gp_config_parse("c.yaml", clash, strlen(clash), NULL, 0, &c), GP_ERR_INVALID,
              "replicas = 3 but pipeline.devices has 2 rows");
    const char *dup = MODEL "pipeline: {devices: [cpu:2, cpu:0], replicas: 2}\n";
    CHECK_ERR(gp_config_parse("d.yaml", dup, strlen(dup), NULL, 0, &c), GP_ERR_INVALID,
              "needs its own device");
}

static void lr_rule(void)
{
    gp_train_config t;
    memset(&t, 0, sizeof t);
    t.optim.lr = 0.1f;
    t.batch_size = 1024;
    t.base_batch = 256;
    t.lr_scaling = GP_LR_SCALING_LINEAR;
    t.sched.kind = GP_SCHED_COSINE;
    t.sched.warmup_steps = 10;
    t.sched.warmup_start = 0.25f;
    double peak = 0.1 * 1024 / 256; /* Goyal et al.: k x the base rate */
    /* (step k of the warm-up at (k + 1) / 10 of the way) */
    CHECK_NEAR(gp_lr_at(&t, 0, 110), 0.25 * peak + 0.1 * 0.75 * peak, 1e-7, 1e-6);
    CHECK_NEAR(gp_lr_at(&t, 4, 110), 0.25 * peak + 0.5 * 0.75 * peak, 1e-7, 1e-6);
    CHECK_NEAR(gp_lr_at(&t, 9, 110), peak, 1e-7, 1e-6);
    CHECK_NEAR(gp_lr_at(&t, 10, 110), peak, 1e-7, 1e-6);
    CHECK_NEAR(gp_lr_at(&t, 60, 110), peak / 2, 1e-7, 1e-6); /* cosine half-way */
    CHECK(gp_lr_at(&t, 109, 110) < 0.01 * peak);
    t.lr_scaling = GP_LR_SCALING_NONE;
    CHECK_NEAR(gp_lr_at(&t, 10, 110), 0.1, 1e-7, 1e-6);
}

int main(void)
{
    open_devs();
    collectives();
    sharded_sgd();
    group_barrier();
    for (int R = 1; R <= 3; R++)
        for (int n = 1; n <= 2; n++) {
            equivalence(false, R, n, GP_SCHEDULE_GPIPE, GP_OPTIM_SGD);
            equivalence(true, R, n, GP_SCHEDULE_GPIPE, GP_OPTIM_SGD);
        }
    /* every other schedule, 2 replicas x 2 devices */
    for (int k = GP_SCHEDULE_1F1B; k < GP_SCHEDULE_KINDS; k++) {
        equivalence(false, 2, 2, (gp_schedule_kind)k, GP_OPTIM_SGD);
        equivalence(true, 2, 2, (gp_schedule_kind)k, GP_OPTIM_SGD);
    }
    /* Adam and AdamW, sharded (stage 0's update fused, composed of
     * reduce-scatter, Adam and all-gather; the others' chunked) */
    for (int o = GP_OPTIM_ADAM; o <= GP_OPTIM_ADAMW; o++)
        for (int R = 2; R <= 3; R++) {
            equivalence(false, R, 2, GP_SCHEDULE_GPIPE, (gp_optim_kind)o);
            equivalence(true, R, 2, GP_SCHEDULE_1F1B, (gp_optim_kind)o);
        }
    /* gradient clipping: the global norm over every stage and replica
     * (sharded chunks each counted once, stage 0 no longer fused) */
    clip_norm = 0.01f;
    for (int R = 2; R <= 3; R++) {
        equivalence(false, R, 2, GP_SCHEDULE_GPIPE, GP_OPTIM_SGD);
        equivalence(true, R, 2, GP_SCHEDULE_1F1B, GP_OPTIM_SGD);
    }
    equivalence(true, 2, 2, GP_SCHEDULE_GPIPE, GP_OPTIM_ADAMW);
    clip_norm = 0;
    /* the replicas exchange their squared norms in one all-gather: a
     * clipped step's host waits do not grow with the replicas (they were
     * 2R + 3 with a broadcast from each) */
    CHECK_MSG(clip_waits[2] > 0 && clip_waits[3] == clip_waits[2],
              "host waits of a clipped step: %llu with 2 replicas, %llu with 3",
              (unsigned long long)clip_waits[2], (unsigned long long)clip_waits[3]);
    for (int R = 1; R <= MAXR; R++) sync_bn(R);
    sync_bn_model();
    sync_bn_schedules();
    residual_model();
    residual_sync();
    faults();
    late_fault(false);
    late_fault(true);
    config_grid();
    lr_rule();
    for (int j = 0; j < 8; j++) gp_device_close(devs[j]);
    return gpt_finish("test_replicas");
}
