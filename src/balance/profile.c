/*
 * profile.c — per-layer time and memory (balance.h).
 *
 * Each layer is built on a device of its own, opened for it and closed after
 * it, so every allocator counter (parameters, gradients, optimizer state,
 * activations, the backend's workspace arena) is that layer's alone.  Inputs
 * and incoming gradients are random: the kernels' cost does not depend on
 * the values (no sparsity shortcuts in the backends).
 *
 * Contention (opts->contend > 0, CPU devices): while layer k is timed,
 * `contend` helper threads, each on a device of its own with the same
 * thread count, run layer k's forward and backward at the same micro-batch
 * size in a loop.  Pipeline stages on CPU devices compute at the same time
 * and share the memory bus; a layer timed alone is faster than it runs
 * there when it is memory-bound (measured: the 2048 x 2048 linears of
 * bench/mlp.yaml at micro-batch 32 took 1.4x longer in the pipeline than
 * alone), and the simulator then predicted steps up to 32% short.
 */
#include "balance/balance.h"
#include "balance/balance_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

const char *gp_balance_by_name(gp_balance_by b)
{
    return b == GP_BALANCE_BY_SIZE ? "size" : b == GP_BALANCE_BY_BOTH ? "both" : "time";
}

bool gp_balance_by_parse(const char *s, gp_balance_by *out)
{
    if (!strcmp(s, "time")) *out = GP_BALANCE_BY_TIME;
    else if (!strcmp(s, "size")) *out = GP_BALANCE_BY_SIZE;
    else if (!strcmp(s, "both")) *out = GP_BALANCE_BY_BOTH;
    else return false;
    return true;
}

/* ---- which model ---------------------------------------------------------- */

const char *gp_profile_layer_spec(const gp_layer_spec *s, char *buf, size_t len)
{
    const char *t = gp_layer_type_name(s->type);
    const char *bias = s->bias ? "true" : "false", *sync = s->sync ? "true" : "false";
    char k[48], st[48], p[48];
    switch (s->type) {
    case GP_LAYER_LINEAR:
        snprintf(buf, len, "%s {out: %lld, bias: %s}", t, (long long)s->out, bias);
        break;
    case GP_LAYER_CONV2D: /* a square kernel, stride, padding as one number */
        snprintf(buf, len, "%s {out: %lld, kernel: %s, stride: %s, padding: %s, bias: %s}", t,
                 (long long)s->out, gp_hw_str(s->kernel, k, sizeof k),
                 gp_hw_str(s->stride, st, sizeof st), gp_hw_str(s->padding, p, sizeof p), bias);
        break;
    case GP_LAYER_MAXPOOL2D:
    case GP_LAYER_AVGPOOL2D: { /* stride 0 means the kernel size */
        gp_hw sd = s->stride.h || s->stride.w ? s->stride : s->kernel;
        snprintf(buf, len, "%s {kernel: %s, stride: %s, padding: %s}", t,
                 gp_hw_str(s->kernel, k, sizeof k), gp_hw_str(sd, st, sizeof st),
                 gp_hw_str(s->padding, p, sizeof p));
        break;
    }
    case GP_LAYER_BATCHNORM: /* sync adds a reduction per forward across replicas */
        snprintf(buf, len, "%s {sync: %s}", t, sync);
        break;
    case GP_LAYER_RESIDUAL:
        snprintf(buf, len, "%s {out: %lld, stride: %s, sync: %s}", t, (long long)s->out,
                 gp_hw_str(s->stride, st, sizeof st), sync);
        break;
    case GP_LAYER_FACTORIZED_REDUCE:
        snprintf(buf, len, "%s {out: %lld, sync: %s}", t, (long long)s->out, sync);
        break;
    case GP_LAYER_ADD: /* the projection shortcut, if any */
        if (s->out > 0)
            snprintf(buf, len, "%s {out: %lld, stride: %s, sync: %s}", t, (long long)s->out,
                     gp_hw_str(s->stride, st, sizeof st), sync);
        else
            snprintf(buf, len, "%s", t);
        break;
    case GP_LAYER_AMOEBA_CELL:
        snprintf(buf, len, "%s {out: %lld, reduction: %s, sync: %s}", t, (long long)s->out,
                 s->reduction ? "true" : "false", sync);
        break;
    case GP_LAYER_DROPOUT: /* p = 0 copies the input through */
    case GP_LAYER_DROPOUT2D:
        snprintf(buf, len, "%s {p: %g}", t, (double)s->p);
        break;
    case GP_LAYER_UPSAMPLE: /* the output size */
        snprintf(buf, len, "%s {scale: %lld}", t, (long long)s->scale);
        break;
    case GP_LAYER_ATTENTION: /* the work per head */
        snprintf(buf, len, "%s {heads: %lld}", t, (long long)s->heads);
        break;
    default:
        snprintf(buf, len, "%s", t);
        break;
    }
    /* a tied layer keeps no optimizer state of its own (not in a profile
     * taken before 2026-12-01, which read an untied model's as the same) */
    size_t n = strlen(buf);
    if (s->tie[0] && n < len) snprintf(buf + n, len - n, " (tie: %s)", s->tie);
    return buf;
}

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

/* The hash over the input, L spec texts (each from spec_of(k)) and the
 * skips. */
static uint64_t hash_texts(const int64_t input[3], int L,
                           const char *(*spec_of)(const void *arg, int k, char *buf, size_t len),
                           const void *arg, const gp_profile_skip *skips, int n_skips)
{
    char buf[GP_PROFILE_SPEC_LEN];
    snprintf(buf, sizeof buf, "input [%lld, %lld, %lld]\n", (long long)input[0],
             (long long)input[1], (long long)input[2]);
    uint64_t h = fnv1a(14695981039346656037ULL, buf);
    for (int k = 0; k < L; k++) {
        h = fnv1a(h, spec_of(arg, k, buf, sizeof buf));
        h = fnv1a(h, "\n");
    }
    for (int t = 0; t < n_skips; t++) {
        snprintf(buf, sizeof buf, "skip %d -> %d\n", skips[t].from, skips[t].to);
        h = fnv1a(h, buf);
    }
    return h;
}

static const char *spec_of_specs(const void *arg, int k, char *buf, size_t len)
{
    return gp_profile_layer_spec(&((const gp_layer_spec *)arg)[k], buf, len);
}

/* The skips of specs[0..L) as the profile records them (NULL, 0 if none
 * or the map does not build: the configuration reports that). */
static gp_profile_skip *skips_of_specs(const gp_layer_spec *specs, int L, int *n)
{
    gp_skip_map map;
    *n = 0;
    if (gp_skip_map_build(specs, L, &map) != GP_OK) {
        gp_error_clear();
        return NULL;
    }
    gp_profile_skip *v = map.n ? calloc((size_t)map.n, sizeof *v) : NULL;
    for (int t = 0; v && t < map.n; t++) v[t] = (gp_profile_skip){map.skips[t].from, map.skips[t].to};
    *n = v ? map.n : 0;
    gp_skip_map_free(&map);
    return v;
}

uint64_t gp_profile_model_hash(const gp_layer_spec *specs, int L, const int64_t input[3])
{
    int n;
    gp_profile_skip *sk = skips_of_specs(specs, L, &n);
    uint64_t h = hash_texts(input, L, spec_of_specs, specs, sk, n);
    free(sk);
    return h;
}

static const char *spec_of_profile(const void *arg, int k, char *buf, size_t len)
{
    snprintf(buf, len, "%s", ((const gp_profile *)arg)->mem[k].spec);
    return buf;
}

uint64_t gp_profile_stored_hash(const gp_profile *p)
{
    return hash_texts(p->input, p->L, spec_of_profile, p, p->skips, p->n_skips);
}

gp_status gp_profile_check_model(const gp_profile *p, const char *path,
                                 const gp_layer_spec *specs, int L, const int64_t input[3])
{
    static const char fix[] = "profile this config again (gpipe-balance CONFIG.yaml "
                              "--profile-out FILE)";
    if (memcmp(p->input, input, sizeof p->input))
        return gp_error_set(GP_ERR_INVALID, "profile '%s' was taken for a different model: input "
                            "[%lld, %lld, %lld] there, [%lld, %lld, %lld] here; %s", path,
                            (long long)p->input[0], (long long)p->input[1],
                            (long long)p->input[2], (long long)input[0], (long long)input[1],
                            (long long)input[2], fix);
    char here[GP_PROFILE_SPEC_LEN], diff[2 * GP_PROFILE_SPEC_LEN + 64] = "";
    for (int k = 0; k < L && k < p->L; k++) {
        gp_profile_layer_spec(&specs[k], here, sizeof here);
        if (strcmp(here, p->mem[k].spec)) {
            snprintf(diff, sizeof diff, "layer %d is %s there, %s here", k, p->mem[k].spec, here);
            break;
        }
    }
    if (p->L != L)
        return gp_error_set(GP_ERR_INVALID, "profile '%s' was taken for a different model: %d "
                            "layer%s there, %d here%s%s%s; %s", path, p->L, p->L == 1 ? "" : "s",
                            L, diff[0] ? " (the first difference: " : "", diff,
                            diff[0] ? ")" : "", fix);
    if (diff[0])
        return gp_error_set(GP_ERR_INVALID, "profile '%s' was taken for a different model: %s; %s",
                            path, diff, fix);
    uint64_t h = gp_profile_model_hash(specs, L, input);
    if (h != p->model_hash)
        return gp_error_set(GP_ERR_INVALID, "profile '%s' was taken for a different model (model "
                            "hash %016llx there, %016llx here); %s", path,
                            (unsigned long long)p->model_hash, (unsigned long long)h, fix);
    return GP_OK;
}

int gp_profile_missing_sizes(const gp_profile *p, const int64_t *sizes, int n, int64_t *missing)
{
    int k = 0;
    for (int a = 0; a < n; a++) {
        bool have = false;
        for (int z = 0; z < p->n_sizes && !have; z++) have = p->sizes[z] == sizes[a];
        for (int b = 0; b < k && !have; b++) have = missing[b] == sizes[a]; /* once each */
        if (!have) missing[k++] = sizes[a];
    }
    return k;
}

void gp_profile_free(gp_profile *p)
{
    if (!p) return;
    free(p->mem);
    free(p->t);
    free(p->skips);
    p->mem = NULL;
    p->t = NULL;
    p->skips = NULL;
    p->n_skips = 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n < 1) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Random values in [-1, 1) on the device. */
static gp_status fill_random(gp_tensor *t, uint64_t seed, uint64_t stream, float *host)
{
    int64_t n = gp_tensor_numel(t);
    gp_rng_uniform_fill(seed, stream, 0, host, n);
    for (int64_t q = 0; q < n; q++) host[q] = 2.0f * host[q] - 1.0f;
    return gp_dev_upload(t->dev, gp_f32(t), host, n);
}

/* Input q of layer l: random values, or for an embedding's ids random
 * whole numbers in [0, vocab) (its forward refuses anything else). */
static gp_status fill_input(const gp_layer *l, int q, gp_tensor *t, uint64_t seed,
                            uint64_t stream, float *host)
{
    if (l->spec.type != GP_LAYER_EMBEDDING || q != 0) return fill_random(t, seed, stream, host);
    int64_t n = gp_tensor_numel(t);
    gp_rng_uniform_fill(seed, stream, 0, host, n);
    int64_t vocab = gp_layer_spec_valid_rows(&l->spec, l->spec.vocab); /* not the padding */
    for (int64_t i = 0; i < n; i++) {
        float v = floorf(host[i] * (float)vocab);
        host[i] = v < (float)(vocab - 1) ? v : (float)(vocab - 1);
    }
    return gp_dev_upload(t->dev, gp_f32(t), host, n);
}

static size_t act_bytes_now(gp_allocator *a)
{
    gp_allocator s;
    gp_allocator_snapshot(a, &s);
    size_t b = 0;
    for (int c = 0; c < GP_MEM_COUNT; c++)
        if (c != GP_MEM_WORKSPACE) b += s.cur_by[c];
    return b;
}

/* ---- cold caches --------------------------------------------------------- */

/* Between two uses of a layer's parameters, a pipeline step touches every
 * other layer's parameters and gradients (this stage's, and the other CPU
 * devices' sharing the last-level cache), so a layer whose model does not
 * fit in the cache finds its weights cold.  Timed alone and repeated, the
 * layer would find them warm: the 2048 x 2048 linear gemm at 32 rows ran
 * 140 GFLOP/s with one weight matrix reused and 87 with 128 MB of them in
 * rotation (one thread, this machine).  So before each timed operation the
 * profiler reads one byte per cache line of a buffer as large as the
 * model's parameters and gradients (CPU devices; nothing for a model under
 * 4 MiB). */
typedef struct {
    unsigned char *buf;
    size_t bytes;
} evictor;

static void evict(const evictor *e)
{
    if (!e || !e->buf) return;
    unsigned acc = 0;
    for (size_t i = 0; i < e->bytes; i += 64) acc += e->buf[i];
    volatile unsigned sink = acc; /* keep the reads */
    (void)sink;
}

/* ---- contention: other devices running the same layer -------------------- */

typedef struct contender {
    pthread_t th;
    char device[40];
    int threads;
    gp_precision precision;   /* the measured device's */
    const gp_layer_spec *spec;
    int index;
    gp_shape in[1 + GP_MAX_POPS]; /* the layer's inputs, batch 1 */
    uint64_t seed;
    pthread_mutex_t *lock;    /* guards size, stop and ready of every contender */
    pthread_cond_t *cond;
    int64_t *size;            /* micro-batch size to run (set by the profiler) */
    bool *stop;
    bool ready;               /* built and running */
    gp_status st;
    char msg[256];
} contender;

static void *contender_main(void *arg)
{
    contender *c = arg;
    gp_device *dev = NULL;
    gp_layer l;
    memset(&l, 0, sizeof l);
    gp_tensor x[1 + GP_MAX_POPS] = {{0}}, dy = {0};
    int64_t have = 0;
    gp_device_opts dopt = {.threads = c->threads, .precision = c->precision};
    gp_status s = gp_device_open(c->device, &dopt, &dev);
    if (s == GP_OK) {
        gp_device_bind_thread(dev);
        s = gp_layer_create(c->spec, c->index, c->in, dev, c->seed, &l);
    }
    pthread_mutex_lock(c->lock);
    c->ready = true;
    pthread_cond_broadcast(c->cond);
    pthread_mutex_unlock(c->lock);
    float *host = NULL;
    while (s == GP_OK) {
        pthread_mutex_lock(c->lock);
        bool stop = *c->stop;
        int64_t b = *c->size;
        pthread_mutex_unlock(c->lock);
        if (stop) break;
        if (b != have) {
            for (int q = 0; q < l.n_in; q++) gp_tensor_free(&x[q]);
            gp_tensor_free(&dy);
            gp_shape ys = gp_shape_with_batch(&l.out_shape, b);
            int64_t most = gp_shape_numel(&ys);
            for (int q = 0; q < l.n_in && s == GP_OK; q++) {
                gp_shape xs = gp_shape_with_batch(q ? &l.pop_shape[q - 1] : &l.in_shape, b);
                s = gp_tensor_alloc(&x[q], dev, &xs, GP_MEM_ACTIVATIONS);
                if (gp_shape_numel(&xs) > most) most = gp_shape_numel(&xs);
            }
            if (s == GP_OK) s = gp_tensor_alloc(&dy, dev, &ys, GP_MEM_ACTIVATIONS);
            free(host);
            host = malloc((size_t)most * sizeof *host);
            if (s == GP_OK && !host) s = gp_error_set(GP_ERR_OOM, "out of host memory");
            for (int q = 0; q < l.n_in && s == GP_OK; q++)
                s = fill_input(&l, q, &x[q], c->seed, 7001 + 17u * (uint64_t)q, host);
            if (s == GP_OK) s = fill_random(&dy, c->seed, 7002, host);
            have = b;
        }
        gp_fwd_ctx ctx = {.training = true, .seed = c->seed, .batch_total = b};
        gp_tensor y = {0}, dx[1 + GP_MAX_POPS] = {{0}};
        gp_saved sv = {0};
        if (s == GP_OK) s = gp_layer_forward(&l, &ctx, x, &y, &sv);
        /* as the stage runs it: a layer that hands dy on takes it (no
         * copy), and the next repetition gets it back */
        if (s == GP_OK) s = gp_layer_backward_take(&l, &ctx, x, &y, &dy, dx, false, false, &sv);
        if (s == GP_OK && !gp_tensor_mem(&dy) && gp_tensor_mem(&dx[0])) {
            gp_shape ys = gp_tensor_shape(&y);
            dy = gp_tensor_reshape(&dx[0], &ys);
            dy.owned = true;
            dx[0] = (gp_tensor){0};
        }
        if (s == GP_OK) s = gp_dev_synchronize(dev);
        gp_saved_free(&sv);
        gp_tensor_free(&y);
        for (int q = 0; q < l.n_in; q++) gp_tensor_free(&dx[q]);
    }
    c->st = s;
    if (s != GP_OK) snprintf(c->msg, sizeof c->msg, "%s", gp_error_message());
    free(host);
    for (int q = 0; q < 1 + GP_MAX_POPS; q++) gp_tensor_free(&x[q]);
    gp_tensor_free(&dy);
    if (l.ops) gp_layer_destroy(&l);
    if (dev) gp_device_close(dev);
    return NULL;
}

typedef struct contention {
    int n;
    contender c[GP_MAX_DEVICES];
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int64_t size;
    bool stop;
} contention;

static void contention_set_size(contention *ct, int64_t b)
{
    if (!ct || ct->n == 0) return;
    pthread_mutex_lock(&ct->lock);
    ct->size = b;
    pthread_mutex_unlock(&ct->lock);
}

/* Start n contenders on layer k (devices named after `device`, from index
 * idx + 2 on: idx + 1 is the profile's copy peer), wait until they run. */
static gp_status contention_start(contention *ct, int n, const gp_layer_spec *spec, int k,
                                  const gp_shape *in, gp_device_kind kind, int idx, int threads,
                                  gp_precision precision, uint64_t seed, int64_t size)
{
    memset(ct, 0, sizeof *ct);
    if (n <= 0) return GP_OK;
    if (n > GP_MAX_DEVICES) n = GP_MAX_DEVICES;
    pthread_mutex_init(&ct->lock, NULL);
    pthread_cond_init(&ct->cond, NULL);
    ct->size = size;
    for (int q = 0; q < n; q++) {
        contender *c = &ct->c[q];
        gp_device_format(kind, idx + 2 + q, c->device, sizeof c->device);
        c->threads = threads;
        c->precision = precision;
        c->spec = spec;
        c->index = k;
        memcpy(c->in, in, (size_t)(1 + spec->n_pop) * sizeof *in);
        c->seed = seed;
        c->lock = &ct->lock;
        c->cond = &ct->cond;
        c->size = &ct->size;
        c->stop = &ct->stop;
        c->st = GP_OK;
        int e = pthread_create(&c->th, NULL, contender_main, c);
        if (e != 0) {
            char why[300];
            gp_error_set(GP_ERR_RUNTIME, "profile: cannot start a contention thread: %s",
                         gp_thread_error(e, why, sizeof why));
            break;
        }
        ct->n = q + 1; /* started: joined by contention_stop */
    }
    pthread_mutex_lock(&ct->lock);
    for (int q = 0; q < ct->n; q++)
        while (!ct->c[q].ready) pthread_cond_wait(&ct->cond, &ct->lock);
    pthread_mutex_unlock(&ct->lock);
    return ct->n == n ? GP_OK : GP_ERR_RUNTIME; /* (said above) */
}

/* Stop and join; the first contender error (e.g. out of memory building the
 * layer again) if any. */
static gp_status contention_stop(contention *ct)
{
    if (ct->n == 0) return GP_OK;
    pthread_mutex_lock(&ct->lock);
    ct->stop = true;
    pthread_mutex_unlock(&ct->lock);
    gp_status s = GP_OK;
    for (int q = 0; q < ct->n; q++) {
        pthread_join(ct->c[q].th, NULL);
        if (s == GP_OK && ct->c[q].st != GP_OK)
            s = gp_error_set(ct->c[q].st, "the contention load on %s: %s", ct->c[q].device,
                             ct->c[q].msg);
    }
    pthread_mutex_destroy(&ct->lock);
    pthread_cond_destroy(&ct->cond);
    ct->n = 0;
    return s;
}

typedef struct {
    double *fwd, *bd, *bw, *ba, *rc, *cp;
} samples;

/* After a run that began with the device's peak reset and its search count
 * at `searched`: the run's workspace peak into *most, unless the run
 * searched for an algorithm (a borrowed workspace no step holds). */
static void workspace_seen(gp_device *dev, uint64_t searched, size_t *most)
{
    if (dev->algo_searches != searched) return;
    gp_allocator a;
    gp_allocator_snapshot(&dev->alloc, &a);
    if (a.peak_by[GP_MEM_WORKSPACE] > *most) *most = a.peak_by[GP_MEM_WORKSPACE];
}

/* The activation layouts a one-stage run of the whole model takes on
 * devices like `dev` (gp_layers_blocked), so that each layer is timed as it
 * runs in a stage: a convolution inside a blocked chain without the
 * reorders around it.  A chain a stage boundary cuts runs plain at the cut
 * (the profile does not know the partition): the convolutions at its ends
 * reorder there, which the simulator adds (profile_chains).  Where a layer
 * cannot be made here everything stays plain (the main pass names the
 * error). */
static void plan_blocks(const gp_layer_spec *specs, int L, const gp_skip_map *map,
                        const gp_shape *input, gp_device *dev, int64_t *in_blk,
                        int64_t *out_blk, int64_t *pop_blk)
{
    gp_layer *m = calloc((size_t)L, sizeof *m);
    gp_shape *outs = calloc((size_t)L, sizeof *outs);
    int made = 0;
    bool ok = m && outs;
    for (; ok && made < L; made++) {
        gp_shape in[1 + GP_MAX_POPS];
        gp_skip_map_inputs(map, made, input, outs, in);
        if (gp_layer_meta(&specs[made], made, in, &m[made]) != GP_OK) {
            gp_error_clear();
            ok = false;
            break;
        }
        outs[made] = m[made].out_shape;
        m[made].dev = dev;
    }
    if (ok) gp_layers_blocked(m, L);
    for (int k = 0; k < L; k++) {
        in_blk[k] = ok ? m[k].in_blk : 0;
        out_blk[k] = ok ? m[k].out_blk : 0;
        pop_blk[k] = ok ? m[k].pop_blk : 0;
    }
    for (int k = 0; m && k < made; k++) {
        m[k].dev = NULL;
        gp_layer_destroy(&m[k]);
    }
    free(m);
    free(outs);
}

/* Everything measured about layer k, on its own device `dev`. */
static gp_status profile_layer(gp_profile *p, const gp_profile_opts *o, gp_layer *l,
                               gp_device *dev, gp_device *peer, int k, bool first_trainable,
                               bool last, samples *sm, float *host, contention *ct,
                               const evictor *ev)
{
    gp_layer_mem *mm = &p->mem[k];
    int reps = p->timed ? o->reps : 0, warm = p->timed ? o->warmup : 0;
    gp_status s = GP_OK;
    size_t ws_peak = 0; /* the largest workspace of a run without a search */
    /* sizes descending: memory is read at the largest */
    for (int z = p->n_sizes - 1; z >= 0 && s == GP_OK; z--) {
        int64_t b = p->sizes[z];
        contention_set_size(ct, b); /* the warm-up runs let the load settle */
        gp_shape xs = gp_shape_with_batch(&l->in_shape, b), ys = gp_shape_with_batch(&l->out_shape, b);
        /* the main input and the popped ones (skips), with their gradients */
        gp_tensor x[1 + GP_MAX_POPS] = {{0}}, dx[1 + GP_MAX_POPS] = {{0}}, dy = {0}, cp = {0};
        for (int q = 0; q < l->n_in && s == GP_OK; q++) {
            gp_shape qs = q ? gp_shape_with_batch(&l->pop_shape[q - 1], b) : xs;
            s = gp_tensor_alloc(&x[q], dev, &qs, GP_MEM_ACTIVATIONS);
            if (s == GP_OK) s = gp_tensor_alloc(&dx[q], dev, &qs, GP_MEM_ACTIVATIONS);
            if (s == GP_OK)
                s = fill_input(l, q, &x[q], o->seed, (uint64_t)k * 2 + 7919u * (uint64_t)q, host);
        }
        if (s == GP_OK) s = gp_tensor_alloc(&dy, dev, &ys, GP_MEM_ACTIVATIONS);
        if (s == GP_OK) s = gp_tensor_alloc(&cp, peer, &ys, GP_MEM_COPIES);
        if (s == GP_OK) s = fill_random(&dy, o->seed, (uint64_t)k * 2 + 1, host);
        gp_fwd_ctx ctx = {.training = true, .seed = o->seed, .step = 0, .sample_offset = 0,
                          .batch_total = b};
        gp_fwd_ctx rctx = ctx;
        rctx.recompute = true;
        int nt = 0;
        bool repeated = false;
        for (int r = 0; r < warm + reps + 1 && s == GP_OK; r++) {
            bool timed = r >= warm && r < warm + reps;
            bool memrun = r == warm + reps; /* last: memory, untimed */
            if (memrun && z != p->n_sizes - 1) break;
            gp_tensor y = {0};
            gp_saved sv = {0};
            size_t before = act_bytes_now(&dev->alloc);
            uint64_t searched = dev->algo_searches;
            double t0, t1, t2, t3;
            if ((s = gp_dev_synchronize(dev)) != GP_OK) break;
            /* the workspace a step needs: each run's own peak, at every
             * size (a smaller micro-batch may take more: a linear layer
             * goes through the arena only below some rows), the largest
             * over the runs that did not search for an algorithm */
            gp_allocator_reset_peak(&dev->alloc);
            evict(ev);
            t0 = gp_now();
            s = gp_layer_forward(l, &ctx, x, &y, &sv);
            if (s == GP_OK) s = gp_dev_synchronize(dev);
            t1 = gp_now();
            if (s == GP_OK && memrun) {
                mm->keep_per_sample = (double)(act_bytes_now(&dev->alloc) - before) / (double)b;
            }
            /* backward-data and -weights run back to back in a step, after
             * the other micro-batches' work: cold before the pair */
            evict(ev);
            double tb = gp_now();
            if (s == GP_OK) s = l->ops->backward_data(l, &ctx, x, &y, &dy, dx, &sv);
            if (s == GP_OK) s = gp_dev_synchronize(dev);
            t2 = gp_now();
            if (s == GP_OK && l->ops->backward_weights)
                s = l->ops->backward_weights(l, &ctx, x, &y, &dy, &sv);
            if (s == GP_OK) s = gp_dev_synchronize(dev);
            t3 = gp_now();
            gp_saved_free(&sv);
            if (s == GP_OK && memrun && dev->algo_searches != searched && !repeated) {
                /* a first call searched for its algorithm (a measured
                 * cuDNN choice) in a borrowed workspace that no step
                 * holds: measure again, the choice now cached */
                repeated = true;
                gp_tensor_free(&y);
                r--;
                continue;
            }
            if (timed) {
                sm->fwd[nt] = t1 - t0;
                sm->bd[nt] = t2 - tb;
                sm->bw[nt] = t3 - t2;
            }
            /* recompute: forward again as checkpointing replays it */
            if (s == GP_OK && timed) {
                gp_tensor y2 = {0};
                gp_saved sv2 = {0};
                evict(ev);
                double r0 = gp_now();
                s = gp_layer_forward(l, &rctx, x, &y2, &sv2);
                if (s == GP_OK) s = gp_dev_synchronize(dev);
                sm->rc[nt] = gp_now() - r0;
                sm->ba[nt] = 0;
                /* the first trainable layer on stage 0 runs weights only */
                if (s == GP_OK && first_trainable && l->ops->backward_weights) {
                    evict(ev);
                    double b0 = gp_now();
                    s = l->ops->backward_weights(l, &ctx, x, &y2, &dy, &sv2);
                    if (s == GP_OK) s = gp_dev_synchronize(dev);
                    sm->ba[nt] = gp_now() - b0;
                }
                gp_saved_free(&sv2);
                gp_tensor_free(&y2);
                /* the boundary copy of this output to another device */
                double c0 = gp_now();
                if (s == GP_OK) s = gp_tensor_copy(&cp, &y);
                if (s == GP_OK) s = gp_dev_synchronize(peer);
                sm->cp[nt] = gp_now() - c0;
                nt++;
            }
            if (s == GP_OK) workspace_seen(dev, searched, &ws_peak);
            gp_tensor_free(&y);
        }
        if (s == GP_OK && p->timed) {
            gp_layer_times *t = &p->t[(size_t)z * (size_t)p->L + (size_t)k];
            t->fwd = median(sm->fwd, nt);
            t->bwd_data = median(sm->bd, nt);
            t->bwd_weights = median(sm->bw, nt);
            t->recompute = median(sm->rc, nt);
            t->bwd_alone = first_trainable ? median(sm->ba, nt) : 0;
            t->copy = median(sm->cp, nt);
        }
        /* the loss on the model's output, and the input upload (the loss's
         * workspace is the last stage's too) */
        uint64_t searched = dev->algo_searches;
        gp_allocator_reset_peak(&dev->alloc);
        if (s == GP_OK && p->timed && (last || k == 0)) {
            double *v = sm->fwd;
            int64_t per = gp_shape_numel(last ? &l->out_shape : &l->in_shape);
            for (int r = 0; r < warm + reps && s == GP_OK; r++) {
                double t0 = gp_now();
                if (last) {
                    /* the model's loss: class ids (one per position of an
                     * (N, T, classes) output), or a 0 / 1 target per logit */
                    bool ce = o->loss == GP_LOSS_CROSS_ENTROPY;
                    gp_shape ls = gp_loss_targets_shape(o->loss, &l->out_shape, b);
                    int64_t nl = gp_shape_numel(&ls);
                    int64_t cls = l->out_shape.dims[l->out_shape.ndim - 1];
                    gp_tensor lab = {0}, yl = {0}, dl = {0};
                    gp_loss_out lo;
                    for (int64_t q = 0; q < nl; q++) host[q] = (float)(q % (ce ? cls : 2));
                    s = gp_tensor_alloc(&lab, dev, &ls, GP_MEM_ACTIVATIONS);
                    if (s == GP_OK) s = gp_tensor_alloc(&yl, dev, &ys, GP_MEM_ACTIVATIONS);
                    if (s == GP_OK) s = gp_tensor_alloc(&dl, dev, &ys, GP_MEM_ACTIVATIONS);
                    if (s == GP_OK) s = gp_dev_upload(dev, gp_f32(&lab), host, nl);
                    if (s == GP_OK) s = fill_random(&yl, o->seed, 99, host);
                    if (s == GP_OK) s = gp_dev_synchronize(dev);
                    t0 = gp_now();
                    if (s == GP_OK)
                        s = gp_loss(dev, o->loss, o->label_smoothing, 0, &yl, &lab,
                                    1.0f / (float)nl, &dl, &lo);
                    if (s == GP_OK) s = gp_dev_synchronize(dev);
                    gp_tensor_free(&lab);
                    gp_tensor_free(&yl);
                    gp_tensor_free(&dl);
                } else {
                    s = gp_dev_upload(dev, gp_f32(&x[0]), host, b * per);
                    if (s == GP_OK) s = gp_dev_upload(dev, gp_f32(&dx[0]), host, b);
                    if (s == GP_OK) s = gp_dev_synchronize(dev);
                }
                if (r >= warm) v[r - warm] = gp_now() - t0;
            }
            if (s == GP_OK) {
                if (last) p->loss[z] = median(v, reps);
                if (k == 0) p->upload[z] = median(v, reps);
            }
        }
        if (s == GP_OK) workspace_seen(dev, searched, &ws_peak);
        for (int q = 0; q < l->n_in; q++) {
            gp_tensor_free(&x[q]);
            gp_tensor_free(&dx[q]);
        }
        gp_tensor_free(&dy);
        gp_tensor_free(&cp);
    }
    if (s == GP_OK) mm->workspace_bytes = ws_peak;
    return s;
}

/* One gp_profile_run: the options as run, the device profiled and its
 * peer, the model's plan (shapes, skips, what runs in place, layouts) and
 * the buffers every layer's measurement shares.  Each layer then goes
 * through profile_one_layer: its device opened, the layer built, its
 * memory counted (profile_layer_memory), its optimizer state allocated
 * and its update timed (profile_update), forward and backward timed
 * (profile_layer), and its notes (in place, not kept, fused) recorded. */
typedef struct profile_run {
    const gp_layer_spec *specs;
    int L;
    const gp_profile_opts *o;
    gp_profile_opts oo;         /* o with the warm-up and repetitions as run */
    gp_profile *out;
    gp_device_opts dopt;        /* how each layer's device is opened */
    gp_device_kind kind;        /* the device profiled (out->device) */
    int idx;
    gp_device *peer;            /* the next device: it receives the boundary copies */
    gp_shape input_shape;       /* the model's input, per sample */
    gp_skip_map map;
    gp_shape *outs;             /* (L) each layer's output shape, as built */
    bool *inplace, *unkept, *fused; /* (L) each: what its stage makes of it */
    int64_t *blk;               /* (3L) each layer's input, then output, then popped
                                   inputs' block (0: plain) */
    double *pool;               /* the samples' one allocation */
    samples sm;                 /* the timings of one measurement */
    float *host;                /* inputs on the host, as large as the largest layer's yet */
    evictor ev;                 /* cold caches between timings */
    bool seen_trainable;        /* a layer with parameters was profiled */
} profile_run;

/* The options checked and written into out, the micro-batch sizes
 * ascending and unique, and out's tables allocated. */
static gp_status profile_begin(const gp_layer_spec *specs, int L, const int64_t input[3],
                               const gp_profile_opts *o, gp_profile *out)
{
    if (L < 1) return gp_error_set(GP_ERR_INVALID, "nothing to profile: the model has no layers");
    if (o->n_sizes < 1 || o->n_sizes > GP_PROFILE_MAX_SIZES)
        return gp_error_set(GP_ERR_INVALID, "profile: give 1..%d micro-batch sizes",
                            GP_PROFILE_MAX_SIZES);
    out->L = L;
    memcpy(out->input, input, sizeof out->input);
    out->model_hash = gp_profile_model_hash(specs, L, input);
    out->skips = skips_of_specs(specs, L, &out->n_skips);
    snprintf(out->device, sizeof out->device, "%s", o->device ? o->device : "cpu:0");
    out->batch = o->batch;
    out->chunks = o->chunks;
    out->timed = o->timed;
    out->precision = o->precision;
    out->optim_slots = o->optim_slots < 0 ? 0 : o->optim_slots < 2 ? o->optim_slots : 2;
    out->contend = o->timed && o->contend > 0 ? o->contend : 0;
    out->warmup = o->warmup < 0 ? 0 : o->warmup;
    out->reps = o->reps < 1 ? 1 : o->reps;
    /* sizes ascending, unique */
    int64_t sz[GP_PROFILE_MAX_SIZES];
    int nz = 0;
    for (int a = 0; a < o->n_sizes; a++) {
        if (o->sizes[a] < 1)
            return gp_error_set(GP_ERR_INVALID, "profile: micro-batch size %lld must be >= 1",
                                (long long)o->sizes[a]);
        bool dup = false;
        for (int b = 0; b < nz; b++) dup = dup || sz[b] == o->sizes[a];
        if (!dup) sz[nz++] = o->sizes[a];
    }
    for (int a = 1; a < nz; a++)
        for (int b = a; b > 0 && sz[b - 1] > sz[b]; b--) {
            int64_t t = sz[b];
            sz[b] = sz[b - 1];
            sz[b - 1] = t;
        }
    out->n_sizes = nz;
    memcpy(out->sizes, sz, (size_t)nz * sizeof *sz);
    out->mem = calloc((size_t)L, sizeof *out->mem);
    out->t = calloc((size_t)L * (size_t)nz, sizeof *out->t);
    if (!out->mem || !out->t) {
        gp_profile_free(out);
        return gp_error_set(GP_ERR_OOM, "out of host memory for the profile");
    }
    return GP_OK;
}

/* A second device receives the boundary copies: the next one of the
 * profiled kind, or another of the same where there is none. */
static gp_status profile_open_peer(profile_run *r)
{
    char peer_name[40];
    gp_device_format(r->kind, r->idx + 1, peer_name, sizeof peer_name);
    if (gp_device_open(peer_name, &r->dopt, &r->peer) == GP_OK) return GP_OK;
    gp_error_clear();
    r->peer = NULL;
    return gp_device_open(r->out->device, &r->dopt, &r->peer);
}

/* The model's plan before any layer is measured: which layer reads which
 * (skips), what runs in place, is not kept or is fused, and the layouts
 * the stages would choose; and the buffers the measurements share. */
static gp_status profile_plan(profile_run *r)
{
    const gp_layer_spec *specs = r->specs;
    int L = r->L;
    size_t reps = (size_t)r->out->reps + (size_t)r->out->warmup + 1;
    double *pool = r->pool = calloc(6 * reps, sizeof *pool);
    r->sm = (samples){pool, pool + reps, pool + 2 * reps, pool + 3 * reps, pool + 4 * reps,
                      pool + 5 * reps};
    r->outs = malloc((size_t)L * sizeof *r->outs);
    r->inplace = calloc((size_t)L, sizeof *r->inplace);
    r->unkept = calloc((size_t)L, sizeof *r->unkept);
    r->fused = calloc((size_t)L, sizeof *r->fused);
    r->blk = calloc(3 * (size_t)L, sizeof *r->blk);
    gp_status s = GP_OK;
    if (!pool || !r->outs || !r->inplace || !r->unkept || !r->fused || !r->blk)
        s = gp_error_set(GP_ERR_OOM, "out of host memory");
    if (s == GP_OK) s = gp_skip_map_build(specs, L, &r->map);
    if (s == GP_OK) gp_layer_specs_inplace(specs, L, r->inplace);
    if (s == GP_OK) gp_layer_specs_unkept(specs, L, r->inplace, r->unkept);
    if (s == GP_OK) gp_layer_specs_relu_fused(specs, L, r->inplace, r->fused);
    if (s == GP_OK)
        plan_blocks(specs, L, &r->map, &r->input_shape, r->peer, r->blk, r->blk + L,
                    r->blk + 2 * L);
    return s;
}

/* gp_layer_mem's x_chain / y_chain from the one-stage layouts (r->blk):
 * a convolution with a blocked side ends a chain there.  Not a residual
 * block: a cut beside one turns the run of identity blocks after (or
 * before) it plain too (gp_layers_blocked bars each in turn), more than
 * one pass over one tensor, which is not modelled. */
static void profile_chains(profile_run *r)
{
    const int L = r->L;
    const int64_t *in_blk = r->blk, *out_blk = r->blk + L;
#define REORDERS(k) (r->specs[k].type == GP_LAYER_CONV2D)
#define POOL(k)                                                                               \
    (r->specs[k].type == GP_LAYER_MAXPOOL2D || r->specs[k].type == GP_LAYER_AVGPOOL2D ||      \
     r->specs[k].type == GP_LAYER_GLOBAL_AVGPOOL)
    for (int k = 0; k < L; k++) {
        gp_layer_mem *mm = &r->out->mem[k];
        mm->x_chain = mm->y_chain = false;
        if (!REORDERS(k)) continue;
        if (in_blk[k] && k > 0) { /* the chain's start: the convolution before */
            int a = k - 1;
            while (a > 0 && !REORDERS(a)) a--;
            mm->x_chain = REORDERS(a) && out_blk[a];
            mm->x_from = a;
        }
        if (out_blk[k]) { /* its first pool, or the convolution that reads it */
            int b = k + 1;
            while (b < L && in_blk[b] && !POOL(b) && !REORDERS(b)) b++;
            mm->y_chain = b < L && in_blk[b];
            mm->y_to = b;
        }
    }
#undef POOL
#undef REORDERS
}

/* Cold caches: the model's parameter and gradient bytes, from a pass that
 * builds each layer once (CPU devices, timed profiles). */
static gp_status profile_eviction(profile_run *r)
{
    gp_status s = GP_OK;
    if (!r->out->timed || r->kind != GP_DEV_CPU) return GP_OK;
    size_t total = 0;
    for (int k = 0; k < r->L && s == GP_OK; k++) {
        gp_layer l;
        memset(&l, 0, sizeof l);
        gp_shape in[1 + GP_MAX_POPS];
        gp_skip_map_inputs(&r->map, k, &r->input_shape, r->outs, in);
        s = gp_layer_create(&r->specs[k], k, in, r->peer, r->o->seed, &l);
        if (s != GP_OK) break;
        total += 2 * (size_t)gp_layer_param_count(&l) * sizeof(float);
        r->outs[k] = l.out_shape;
        gp_layer_destroy(&l);
    }
    if (s == GP_OK && total >= ((size_t)4 << 20)) {
        r->ev.bytes = total;
        r->ev.buf = malloc(total);
        if (!r->ev.buf) s = gp_error_set(GP_ERR_OOM, "out of host memory (%zu bytes) for the "
                                         "profile's cache eviction", total);
        else memset(r->ev.buf, 1, total);
    }
    /* errors here name the layer in the main pass below */
    if (s != GP_OK && s != GP_ERR_OOM) {
        gp_error_clear();
        s = GP_OK;
    }
    return s;
}

/* Layer k's description and spec, and the bytes its parameters and
 * gradients took on its device (a0: the device's counters before it was
 * built). */
static void profile_layer_memory(profile_run *r, gp_layer *l, gp_device *dev, int k,
                                 const gp_allocator *a0)
{
    gp_layer_mem *mm = &r->out->mem[k];
    /* a profile names layers by place, not by the --set that changed them
     * (which would crowd the 96 characters out; saved profiles outlive the
     * run's overrides) */
    char set_note[sizeof l->spec.set];
    memcpy(set_note, l->spec.set, sizeof set_note);
    l->spec.set[0] = '\0';
    gp_layer_describe(l, mm->desc, sizeof mm->desc);
    memcpy(l->spec.set, set_note, sizeof set_note);
    gp_profile_layer_spec(&r->specs[k], mm->spec, sizeof mm->spec);
    gp_allocator a1;
    gp_allocator_snapshot(&dev->alloc, &a1);
    mm->param_bytes = a1.cur_by[GP_MEM_PARAMS] - a0->cur_by[GP_MEM_PARAMS];
    mm->grad_bytes = a1.cur_by[GP_MEM_GRADS] - a0->cur_by[GP_MEM_GRADS];
    mm->in_per_sample = (double)gp_shape_numel(&l->in_shape) * sizeof(float);
    mm->out_per_sample = (double)gp_shape_numel(&l->out_shape) * sizeof(float);
    mm->flops_per_sample = l->ops->flops(l, 1);
}

/* Zero grads + the update (SGD; Adam with two slots), the per-step work
 * of the optimizer, timed over layer l's parameters with its state opt. */
static gp_status profile_update(profile_run *r, gp_layer *l, gp_device *dev, gp_tensor *opt,
                                gp_layer_mem *mm)
{
    gp_profile *out = r->out;
    gp_status s = GP_OK;
    int slots = r->o->optim_slots < 2 ? r->o->optim_slots : 2;
    gp_adam_step adam = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                         .step_size = 0.0f, .bc2_sqrt = 1.0f};
    for (int q = 0; q < out->warmup + out->reps && s == GP_OK; q++) {
        double t0 = gp_now();
        s = gp_layer_zero_grad(l);
        for (int p = 0, oq = 0; p < l->n_params && s == GP_OK; p++) {
            gp_param *pr = &l->params[p];
            if (!gp_param_trained(pr)) continue; /* (a tied replica: its owner's update) */
            int64_t np = gp_tensor_numel(&pr->value);
            if (slots == 2) {
                gp_update_part part = {.w = gp_f32(&pr->value), .g = gp_f32(&pr->grad),
                                       .v = gp_f32(&opt[oq]), .v2 = gp_f32(&opt[oq + 1]),
                                       .n = np};
                s = gp_dev_adam_multi(dev, &part, 1, &adam);
            } else {
                s = gp_dev_sgd_update(dev, gp_f32(&pr->value), gp_f32(&pr->grad),
                                      slots ? gp_f32(&opt[oq]) : NULL, np, 0.0f,
                                      slots ? 0.9f : 0.0f, 0.0f, 0);
            }
            oq += slots;
        }
        if (s == GP_OK) s = gp_dev_synchronize(dev);
        if (q >= out->warmup) r->sm.fwd[q - out->warmup] = gp_now() - t0;
    }
    if (s == GP_OK) mm->update = median(r->sm.fwd, out->reps);
    return s;
}

/* The host buffer as large as layer l's largest input, output or popped
 * skip at the largest micro-batch. */
static gp_status profile_host_buffer(profile_run *r, const gp_layer *l)
{
    int64_t maxb = r->out->sizes[r->out->n_sizes - 1];
    int64_t need = gp_shape_numel(&l->in_shape);
    int64_t n2 = gp_shape_numel(&l->out_shape);
    if (n2 > need) need = n2;
    for (int q = 0; q < l->n_in - 1; q++)
        if (gp_shape_numel(&l->pop_shape[q]) > need) need = gp_shape_numel(&l->pop_shape[q]);
    free(r->host);
    r->host = malloc((size_t)(need * maxb + maxb) * sizeof *r->host);
    if (!r->host) return gp_error_set(GP_ERR_OOM, "out of host memory");
    return GP_OK;
}

/* What a stage's ends free early where layer k is one (gp_layer_mem's
 * end_unread and in_unread): from its spec alone, its twins' too. */
static void mem_ends(gp_layer_mem *mm, const gp_layer_spec *spec)
{
    mm->end_unread = gp_layer_spec_end_unread(spec);
    mm->in_unread = gp_layer_spec_ignores_x(spec);
}

/* Layer k measured on a device of its own, built on the device, opened
 * for it and closed after it, so every allocator counter is its alone. */
static gp_status profile_one_layer(profile_run *r, int k)
{
    gp_profile *out = r->out;
    const gp_profile_opts *o = r->o;
    gp_device *dev = NULL;
    GP_TRY(gp_device_open(out->device, &r->dopt, &dev));
    out->threads = dev->threads;
    out->precision = (int)dev->precision; /* what it runs: a CPU's tf32 is fp32 */
    gp_device_bind_thread(dev);
    gp_allocator a0;
    gp_allocator_snapshot(&dev->alloc, &a0);
    gp_layer l;
    memset(&l, 0, sizeof l);
    gp_shape in[1 + GP_MAX_POPS];
    gp_skip_map_inputs(&r->map, k, &r->input_shape, r->outs, in);
    gp_status s = gp_layer_create(&r->specs[k], k, in, dev, o->seed, &l);
    if (s != GP_OK) {
        gp_device_close(dev);
        return s;
    }
    l.in_blk = r->blk[k];
    l.out_blk = r->blk[r->L + k];
    l.pop_blk = r->blk[2 * r->L + k];
    gp_layer_mem *mm = &out->mem[k];
    profile_layer_memory(r, &l, dev, k, &a0);
    bool ft = false;
    if (!r->seen_trainable && gp_layer_param_count(&l) > 0) {
        r->seen_trainable = ft = true;
        out->first_trainable = k;
    }
    /* optimizer state as the trainer keeps it */
    gp_tensor *opt = calloc((size_t)(2 * l.n_params + 1), sizeof *opt);
    int n_opt = 0;
    if (!opt) s = gp_error_set(GP_ERR_OOM, "out of host memory profiling layer %d", k);
    for (int q = 0; q < l.n_params && s == GP_OK; q++) {
        if (!gp_param_trained(&l.params[q])) continue; /* no state for a tied replica */
        gp_shape ps = gp_tensor_shape(&l.params[q].value);
        for (int p = 0; p < o->optim_slots && p < 2 && s == GP_OK; p++)
            s = gp_tensor_zeros(&opt[n_opt++], dev, &ps, GP_MEM_OPTIMIZER);
    }
    gp_allocator a2;
    gp_allocator_snapshot(&dev->alloc, &a2);
    mm->optim_bytes = a2.cur_by[GP_MEM_OPTIMIZER] - a0.cur_by[GP_MEM_OPTIMIZER];
    /* the other devices' load while this layer is timed */
    contention ct;
    memset(&ct, 0, sizeof ct);
    if (s == GP_OK && out->contend > 0) {
        s = contention_start(&ct, out->contend, &r->specs[k], k, in, r->kind, r->idx,
                             dev->threads, dev->precision, o->seed,
                             out->sizes[out->n_sizes - 1]);
    }
    if (s == GP_OK && out->timed) s = profile_update(r, &l, dev, opt, mm);
    if (s == GP_OK) s = profile_host_buffer(r, &l);
    if (s == GP_OK)
        s = profile_layer(out, &r->oo, &l, dev, r->peer, k, ft, k == r->L - 1, &r->sm, r->host,
                          &ct, &r->ev);
    gp_status cs = contention_stop(&ct);
    if (s == GP_OK) s = cs;
    if (s == GP_OK) mm->fused = r->fused[k];
    if (s == GP_OK) mem_ends(mm, &r->specs[k]);
    if (s == GP_OK && (r->inplace[k] || r->unkept[k])) {
        /* measured alone, the output counted: in place it is no extra,
         * unkept a backward does not keep it */
        mm->inplace = r->inplace[k];
        mm->unkept = r->unkept[k];
        mm->keep_per_sample = fmax(mm->keep_per_sample - mm->out_per_sample, 0.0);
    }
    if (s != GP_OK) {
        char d[160];
        s = gp_error_wrap(s, "profiling %s on %s", gp_layer_describe(&l, d, sizeof d),
                          dev->name);
    }
    for (int q = 0; q < n_opt; q++) gp_tensor_free(&opt[q]);
    free(opt);
    r->outs[k] = l.out_shape;
    gp_layer_destroy(&l);
    gp_device_close(dev);
    return s;
}

/* The spec without what names or places it (its label, where the config
 * wrote it, the skips' names): two layers whose such specs are equal do the
 * same work on the same shapes. */
static void cost_spec(const gp_layer_spec *s, gp_layer_spec *out)
{
    memcpy(out, s, sizeof *out); /* (memcpy: the padding as the source's) */
    memset(out->name, 0, sizeof out->name);
    memset(out->file, 0, sizeof out->file);
    memset(out->set, 0, sizeof out->set);
    memset(out->stash, 0, sizeof out->stash);
    memset(out->pop, 0, sizeof out->pop);
    out->line = out->column = 0;
}

/* An earlier layer j < k measured as layer k would be: the same work
 * (cost_spec), inputs, plan (in place, not kept, fused, layouts), neither
 * the first trainable layer (its backward computes no dx) nor the last
 * (the loss is timed with it); -1 if none.  A GPT's twelve blocks are
 * measured once (balance: auto profiled GPT-2 124M for 4.5 minutes). */
static int same_as_earlier(const profile_run *r, int k)
{
    if (k == r->L - 1) return -1;
    gp_layer_spec a, b;
    cost_spec(&r->specs[k], &a);
    gp_shape ink[1 + GP_MAX_POPS], inj[1 + GP_MAX_POPS];
    gp_skip_map_inputs(&r->map, k, &r->input_shape, r->outs, ink);
    for (int j = k - 1; j >= 0; j--) {
        if (r->specs[j].type != r->specs[k].type || j == r->out->first_trainable ||
            r->inplace[j] != r->inplace[k] || r->unkept[j] != r->unkept[k] ||
            r->fused[j] != r->fused[k] || r->blk[j] != r->blk[k] ||
            r->blk[r->L + j] != r->blk[r->L + k] ||
            r->blk[2 * r->L + j] != r->blk[2 * r->L + k])
            continue;
        cost_spec(&r->specs[j], &b);
        if (memcmp(&a, &b, sizeof a)) continue;
        gp_skip_map_inputs(&r->map, j, &r->input_shape, r->outs, inj);
        bool same = true;
        for (int q = 0; q <= a.n_pop && same; q++)
            same = gp_shape_equal(&ink[q], &inj[q]);
        if (same) return j;
    }
    return -1;
}

/* Layer k as layer j measured it: its own description and output shape
 * (from a shapes-only build), j's times and bytes. */
static gp_status copy_measured(profile_run *r, int j, int k)
{
    gp_profile *out = r->out;
    gp_shape in[1 + GP_MAX_POPS];
    gp_skip_map_inputs(&r->map, k, &r->input_shape, r->outs, in);
    gp_layer l;
    memset(&l, 0, sizeof l);
    GP_TRY(gp_layer_meta(&r->specs[k], k, in, &l));
    char desc[sizeof out->mem[k].desc], set_note[sizeof l.spec.set];
    memcpy(set_note, l.spec.set, sizeof set_note);
    l.spec.set[0] = '\0'; /* (as profile_layer_memory names it) */
    gp_layer_describe(&l, desc, sizeof desc);
    r->outs[k] = l.out_shape;
    gp_layer_destroy(&l); /* (its parameters' table) */
    out->mem[k] = out->mem[j];
    memcpy(out->mem[k].desc, desc, sizeof desc);
    mem_ends(&out->mem[k], &r->specs[k]); /* (its own stash) */
    for (int z = 0; z < out->n_sizes; z++)
        out->t[(size_t)z * (size_t)out->L + (size_t)k] =
            out->t[(size_t)z * (size_t)out->L + (size_t)j];
    return GP_OK;
}

/* Each layer measured, or copied from an identical one measured before;
 * what it is doing said at the start and, on a long profile, every 10 s
 * with the time left. */
static gp_status profile_layers(profile_run *r)
{
    int L = r->L, distinct = 0, done = 0;
    int *twin = malloc((size_t)L * sizeof *twin);
    bool *params = calloc((size_t)L, sizeof *params);
    if (!twin || !params) {
        free(twin);
        free(params);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    gp_status s = GP_OK;
    /* the plan's shapes first (a layer's twin is found from its inputs) */
    for (int k = 0; k < L && s == GP_OK; k++) {
        gp_shape in[1 + GP_MAX_POPS];
        gp_skip_map_inputs(&r->map, k, &r->input_shape, r->outs, in);
        gp_layer l;
        memset(&l, 0, sizeof l);
        s = gp_layer_meta(&r->specs[k], k, in, &l); /* (shapes only) */
        if (s == GP_OK) {
            r->outs[k] = l.out_shape;
            params[k] = gp_layer_param_count(&l) > 0;
        }
        gp_layer_destroy(&l); /* (its parameters' table) */
    }
    int first_trainable = L; /* (as the measurements will find it) */
    for (int k = 0; k < L && s == GP_OK; k++) {
        if (first_trainable == L && params[k]) first_trainable = k;
        r->out->first_trainable = first_trainable;
        twin[k] = same_as_earlier(r, k);
        distinct += twin[k] < 0;
    }
    r->out->first_trainable = L;
    if (s == GP_OK && r->o->say)
        GP_INFO("balance: profiling %d distinct layer%s of %d on %s at micro-batch %lld "
                "(identical ones measured once; pipeline.balance: [...] or GPIPE_BALANCE=flops "
                "skips this)", distinct, distinct == 1 ? "" : "s", L, r->out->device,
                (long long)r->out->sizes[r->out->n_sizes - 1]);
    double t0 = gp_now(), said = t0;
    for (int k = 0; k < L && s == GP_OK; k++) {
        /* a signal ends the profile before the next layer, not after all
         * of them (issue 77: ~10 s after it was acknowledged) */
        if (r->o->stop && atomic_load(r->o->stop)) {
            s = gp_error_set(GP_ERR_STOPPED, "stopped by a signal while profiling the layers "
                             "for balance: auto (%d of %d distinct layers measured), before the "
                             "first step; nothing was trained", done, distinct);
            break;
        }
        if (twin[k] >= 0) {
            s = copy_measured(r, twin[k], k);
            continue;
        }
        s = profile_one_layer(r, k);
        done++;
        double now = gp_now();
        if (s == GP_OK && r->o->say && now - said >= 10 && done < distinct) {
            said = now;
            GP_INFO("balance: profiled %d of %d distinct layers in %.0f s; about %.0f s left",
                    done, distinct, now - t0, (now - t0) / done * (distinct - done));
        }
    }
    free(twin);
    free(params);
    return s;
}

gp_status gp_profile_run(const gp_layer_spec *specs, int L, const int64_t input[3],
                         const gp_profile_opts *o, gp_profile *out)
{
    memset(out, 0, sizeof *out);
    GP_TRY(profile_begin(specs, L, input, o, out));
    profile_run r = {.specs = specs, .L = L, .o = o, .oo = *o, .out = out,
                     .input_shape = gp_shape_4d(1, input[0], input[1], input[2])};
    r.oo.warmup = out->warmup;
    r.oo.reps = out->reps;
    r.dopt = (gp_device_opts){.threads = o->threads, .capacity = 0,
                              .precision = (gp_precision)o->precision,
                              .deterministic = o->deterministic};
    GP_TRY(gp_device_parse(out->device, &r.kind, &r.idx));
    gp_status s = profile_open_peer(&r);
    if (s != GP_OK) {
        gp_profile_free(out);
        return s;
    }
    s = profile_plan(&r);
    if (s == GP_OK) s = profile_eviction(&r);
    out->evict_bytes = (int64_t)r.ev.bytes;
    out->first_trainable = L;
    if (s == GP_OK) s = profile_layers(&r);
    if (s == GP_OK) profile_chains(&r);
    free(r.host);
    free(r.pool);
    free(r.outs);
    free(r.inplace);
    free(r.unkept);
    free(r.fused);
    free(r.blk);
    gp_skip_map_free(&r.map);
    free(r.ev.buf);
    gp_device_close(r.peer);
    if (s != GP_OK) gp_profile_free(out);
    return s;
}

void gp_profile_times_at(const gp_profile *p, int64_t s, gp_layer_times *out, double *loss,
                         double *upload)
{
    int L = p->L, nz = p->n_sizes;
    int a = 0, b = 0; /* interpolate between sizes a and b */
    double w = 1.0;   /* weight of a */
    double scale = 1.0;
    if (nz == 1) {
        scale = (double)s / (double)p->sizes[0];
    } else {
        int z = 0;
        while (z < nz - 1 && p->sizes[z + 1] < s) z++;
        if (z >= nz - 1) z = nz - 2;
        a = z;
        b = z + 1;
        /* exact hit */
        for (int q = 0; q < nz; q++)
            if (p->sizes[q] == s) a = b = q;
        if (a != b)
            w = (double)(p->sizes[b] - s) / (double)(p->sizes[b] - p->sizes[a]);
    }
#define LERP(x, y) fmax(0.0, scale * (w * (x) + (1.0 - w) * (y)))
    for (int k = 0; k < L; k++) {
        const gp_layer_times *ta = &p->t[(size_t)a * (size_t)L + (size_t)k];
        const gp_layer_times *tb = &p->t[(size_t)b * (size_t)L + (size_t)k];
        out[k].fwd = LERP(ta->fwd, tb->fwd);
        out[k].bwd_data = LERP(ta->bwd_data, tb->bwd_data);
        out[k].bwd_weights = LERP(ta->bwd_weights, tb->bwd_weights);
        out[k].bwd_alone = LERP(ta->bwd_alone, tb->bwd_alone);
        out[k].recompute = LERP(ta->recompute, tb->recompute);
        out[k].copy = LERP(ta->copy, tb->copy);
    }
    if (loss) *loss = LERP(p->loss[a], p->loss[b]);
    if (upload) *upload = LERP(p->upload[a], p->upload[b]);
#undef LERP
}

/* ---- a profile from shapes alone ---------------------------------------------
 *
 * The memory columns of a profile, from each layer's shapes and what it
 * says it saves (ops->saved_bytes, the --dry-run table's activation
 * column): nothing is allocated or run, so any model's is instant.  No
 * times (timed false; the simulator's memory walk, gp_stage_peak_bytes,
 * needs none), no workspace (unknown without running: the estimate errs
 * low by it).  dev (optional) answers what the backend keeps (a pooling's
 * indices); without one those count nothing.  What a run checks its memory against before the first step
 * where no measured profile of the model is cached. */
gp_status gp_profile_estimate(const gp_layer_spec *specs, int L, const int64_t input[3],
                              const gp_profile_opts *o, gp_device *dev, gp_profile *out)
{
    memset(out, 0, sizeof *out);
    gp_profile_opts oo = *o;
    oo.timed = false;
    GP_TRY(profile_begin(specs, L, input, &oo, out));
    gp_skip_map map;
    gp_shape *outs = malloc((size_t)L * sizeof *outs);
    bool *flags = calloc(3 * (size_t)L, sizeof *flags);
    gp_status s = outs && flags ? gp_skip_map_build(specs, L, &map)
                                : gp_error_set(GP_ERR_OOM, "out of host memory");
    if (s != GP_OK) {
        free(outs);
        free(flags);
        gp_profile_free(out);
        return s;
    }
    bool *inplace = flags, *unkept = flags + L, *fused = flags + 2 * L;
    gp_layer_specs_inplace(specs, L, inplace);
    gp_layer_specs_unkept(specs, L, inplace, unkept);
    gp_layer_specs_relu_fused(specs, L, inplace, fused);
    gp_shape in_shape = gp_shape_4d(1, input[0], input[1], input[2]);
    int slots = o->optim_slots < 2 ? o->optim_slots : 2;
    out->first_trainable = L;
    for (int k = 0; k < L && s == GP_OK; k++) {
        gp_shape in[1 + GP_MAX_POPS];
        gp_skip_map_inputs(&map, k, &in_shape, outs, in);
        gp_layer l;
        memset(&l, 0, sizeof l);
        s = gp_layer_meta(&specs[k], k, in, &l);
        if (s != GP_OK) break;
        outs[k] = l.out_shape;
        l.dev = dev; /* (asked, not used: what a pooling keeps is its backend's) */
        gp_layer_mem *mm = &out->mem[k];
        char set_note[sizeof l.spec.set];
        memcpy(set_note, l.spec.set, sizeof set_note);
        l.spec.set[0] = '\0'; /* (as profile_layer_memory names it) */
        gp_layer_describe(&l, mm->desc, sizeof mm->desc);
        gp_profile_layer_spec(&specs[k], mm->spec, sizeof mm->spec);
        int64_t np = gp_layer_param_count(&l), tied = gp_layer_tied_count(&l);
        if (np > 0 && out->first_trainable == L) out->first_trainable = k;
        /* values and gradients (a tied replica too), buffers' values, and
         * the optimizer's slots for what this layer itself updates */
        mm->param_bytes = (size_t)(np + gp_layer_buffer_count(&l)) * sizeof(float);
        mm->grad_bytes = (size_t)np * sizeof(float);
        mm->optim_bytes = (size_t)(np - tied) * (size_t)slots * sizeof(float);
        mm->in_per_sample = (double)gp_shape_numel(&l.in_shape) * sizeof(float);
        mm->out_per_sample = (double)gp_shape_numel(&l.out_shape) * sizeof(float);
        /* per sample at the largest micro-batch, as measured (a batch
         * norm's saved statistics are per micro-batch) */
        int64_t b = out->sizes[out->n_sizes - 1];
        mm->keep_per_sample =
            (inplace[k] || unkept[k] ? 0.0 : mm->out_per_sample) +
            (l.ops->saved_bytes ? (double)l.ops->saved_bytes(&l, b) / (double)b : 0.0);
        mm->inplace = inplace[k];
        mm->unkept = unkept[k];
        mm->fused = fused[k];
        mem_ends(mm, &specs[k]);
        mm->flops_per_sample = l.ops->flops(&l, 1);
        gp_layer_destroy(&l); /* (its parameters' table) */
    }
    gp_skip_map_free(&map);
    free(outs);
    free(flags);
    if (s != GP_OK) gp_profile_free(out);
    return s;
}
