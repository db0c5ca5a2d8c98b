/*
 * data_loader.c — the prefetching loader: one background thread assembles
 * normalised (and, for training, augmented) batches into a bounded ring of
 * preallocated buffers while the consumer trains on the previous one.
 *
 * The ring has prefetch + 1 slots: the consumer holds at most one (the
 * batch it was last given, valid until its next call) and the producer may
 * run up to `prefetch` batches ahead.  Slots head .. head + count - 1 (mod
 * n_slots) are filled; the consumer's held slot, if any, is `head`.  The
 * producer writes slot head + count outside the lock: no one else touches
 * it until count is raised, under the lock.
 *
 * Every random decision (the epoch's permutation, each sample's crop and
 * flip) is a pure function of (seed, epoch, position) through the counter-
 * based RNG, so the batch sequence does not depend on thread timing.
 */
#include "train/data.h"
#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>

#define LOADER_ERRMSG 2048

typedef struct loader_slot {
    float *x;           /* (batch_size, c, h, w) */
    float *y;           /* (batch_size, targets) */
    int64_t n, epoch, index, first;
} loader_slot;

struct gp_loader {
    /* Read-only after create. */
    const gp_dataset *ds;
    gp_loader_opts opts;
    bool normalize;
    int crop_padding;
    bool hflip;
    float mean[GP_MAX_CHANNELS], std[GP_MAX_CHANNELS];
    int64_t per;            /* c * h * w */
    int64_t targets;        /* per sample in y: 1 class id, or h * w (masks) */
    int64_t batches;        /* per epoch */
    int n_slots;
    loader_slot *slots;     /* n_slots, buffers owned */

    /* Producer-private. */
    int64_t *perm;          /* (n) the current epoch's order */
    uint8_t *scratch;       /* (c, h, w) one augmented sample */
    uint8_t *mscratch;      /* (h, w) its augmented mask (opts.masks) */

    /* Shared; guarded by `lock`. */
    pthread_mutex_t lock;
    pthread_cond_t filled;  /* count rose, or the producer stopped */
    pthread_cond_t freed;   /* count fell, or stop was requested */
    int head, count;
    bool held;              /* the consumer holds slot head */
    bool stop;              /* destroy asked the producer to exit */
    bool finished;          /* the producer exited after an error */
    gp_status err;
    char errmsg[LOADER_ERRMSG];

    pthread_t thread;
    bool thread_started;
};

void gp_data_epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch, int64_t *perm)
{
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    if (!shuffle) return;
    uint64_t stream = gp_rng_stream((uint64_t)epoch, GP_DATA_SHUFFLE_TAG, 0);
    for (int64_t i = n - 1; i > 0; i--) {
        /* 64 random bits per swap: the modulo bias is below n / 2^64. */
        gp_philox_out o = gp_philox4x32(seed, stream, (uint64_t)i);
        uint64_t r = (uint64_t)o.v[0] << 32 | o.v[1];
        int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void gp_data_augment_draw(uint64_t seed, int64_t epoch, int64_t pos, int pad, bool hflip,
                          int *dy, int *dx, bool *flip)
{
    uint64_t stream = gp_rng_stream((uint64_t)epoch, GP_DATA_AUGMENT_TAG, (uint64_t)pos);
    gp_philox_out o = gp_philox4x32(seed, stream, 0);
    uint32_t span = 2u * (uint32_t)(pad > 0 ? pad : 0) + 1u;
    *dy = (int)(o.v[0] % span) - (pad > 0 ? pad : 0);
    *dx = (int)(o.v[1] % span) - (pad > 0 ? pad : 0);
    *flip = hflip && (o.v[2] >> 31) != 0;
}

void gp_data_augment_apply(const uint8_t *src, int64_t c, int64_t h, int64_t w, int dy, int dx,
                           bool flip, uint8_t *dst)
{
    for (int64_t ch = 0; ch < c; ch++) {
        const uint8_t *s = src + ch * h * w;
        uint8_t *d = dst + ch * h * w;
        for (int64_t y = 0; y < h; y++) {
            int64_t sy = y + dy;
            for (int64_t x = 0; x < w; x++) {
                int64_t sx = (flip ? w - 1 - x : x) + dx;
                d[y * w + x] = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? s[sy * w + sx] : 0;
            }
        }
    }
}

/* Fill one slot with batch `index` of `epoch`; ld->perm holds its order.
 * The only failure is a label outside the dataset's classes (a dataset
 * built through the C API is not validated by a reader), which would
 * otherwise index past the model's outputs.  Masks are checked by the loss
 * (binary cross-entropy names an element outside [0, 1]). */
static gp_status assemble(gp_loader *ld, loader_slot *sl, int64_t epoch, int64_t index)
{
    const gp_dataset *ds = ld->ds;
    int64_t bs = ld->opts.batch_size;
    int64_t first = index * bs;
    int64_t n = ds->n - first < bs ? ds->n - first : bs;
    bool augment = ld->opts.augment && (ld->crop_padding > 0 || ld->hflip);
    bool masks = ld->opts.masks;
    int64_t hw = ds->h * ds->w, t = ld->targets;
    for (int64_t i = 0; i < n; i++) {
        int64_t src = ld->perm[first + i];
        if (!masks && ds->labels[src] >= ds->classes)
            return gp_error_set(GP_ERR_DATA, "%s: sample %lld has label %d, out of range for "
                                             "%d classes (epoch %lld, batch %lld)",
                                ds->source, (long long)src, ds->labels[src], ds->classes,
                                (long long)epoch, (long long)index);
        float *x = sl->x + i * ld->per;
        if (!augment) {
            gp_data_assemble(ds, src, 1, ld->normalize, ld->mean, ld->std, masks, x,
                             sl->y + i * t);
            continue;
        }
        int dy, dx;
        bool flip;
        gp_data_augment_draw(ld->opts.seed, epoch, first + i, ld->crop_padding, ld->hflip, &dy,
                             &dx, &flip);
        gp_data_augment_apply(ds->images + src * ld->per, ds->c, ds->h, ds->w, dy, dx, flip,
                              ld->scratch);
        /* a mask moves with its image */
        if (masks)
            gp_data_augment_apply(ds->masks + src * hw, 1, ds->h, ds->w, dy, dx, flip,
                                  ld->mscratch);
        /* Through the shared assembler, so augmented and plain samples are
         * normalised by the very same arithmetic. */
        gp_dataset one = {.n = 1, .c = ds->c, .h = ds->h, .w = ds->w, .classes = ds->classes,
                          .images = ld->scratch, .labels = ds->labels + src,
                          .masks = masks ? ld->mscratch : NULL};
        gp_data_assemble(&one, 0, 1, ld->normalize, ld->mean, ld->std, masks, x, sl->y + i * t);
    }
    sl->n = n;
    sl->epoch = epoch;
    sl->index = index;
    sl->first = first;
    return GP_OK;
}

static void *producer(void *arg)
{
    gp_loader *ld = arg;
    int64_t epoch = ld->opts.start_epoch, index = ld->opts.start_batch;
    gp_data_epoch_order(ld->ds->n, ld->opts.shuffle, ld->opts.seed, epoch, ld->perm);
    for (;;) {
        pthread_mutex_lock(&ld->lock);
        while (ld->count == ld->n_slots && !ld->stop) pthread_cond_wait(&ld->freed, &ld->lock);
        if (ld->stop) {
            pthread_mutex_unlock(&ld->lock);
            break;
        }
        loader_slot *sl = &ld->slots[(ld->head + ld->count) % ld->n_slots];
        pthread_mutex_unlock(&ld->lock);

        gp_status s = assemble(ld, sl, epoch, index);

        pthread_mutex_lock(&ld->lock);
        if (s != GP_OK) {
            /* The message is in this thread's buffer: copy it out for the
             * consumer, who reports it after the batches queued before. */
            ld->err = s;
            snprintf(ld->errmsg, sizeof ld->errmsg, "%s", gp_error_message());
            ld->finished = true;
            pthread_cond_broadcast(&ld->filled);
            pthread_mutex_unlock(&ld->lock);
            break;
        }
        ld->count++;
        pthread_cond_signal(&ld->filled);
        pthread_mutex_unlock(&ld->lock);

        if (++index == ld->batches) {
            index = 0;
            epoch++;
            gp_data_epoch_order(ld->ds->n, ld->opts.shuffle, ld->opts.seed, epoch, ld->perm);
        }
    }
    return NULL;
}

int64_t gp_loader_batches_per_epoch(const gp_loader *ld) { return ld->batches; }

gp_status gp_loader_create(const gp_dataset *ds, const gp_data_config *cfg,
                           const gp_loader_opts *opts, gp_loader **out)
{
    *out = NULL;
    if (!ds || !ds->images || !ds->labels || ds->n < 1)
        return gp_error_set(GP_ERR_INVALID, "loader: the dataset is empty");
    if (opts->batch_size < 1)
        return gp_error_set(GP_ERR_INVALID, "loader: batch size %lld must be >= 1",
                            (long long)opts->batch_size);
    int64_t bs = opts->batch_size;
    int64_t batches = opts->drop_last ? ds->n / bs : (ds->n + bs - 1) / bs;
    if (batches < 1)
        return gp_error_set(GP_ERR_INVALID, "loader: batch size %lld exceeds the %lld samples "
                                            "of %s and drop_last leaves no batch",
                            (long long)bs, (long long)ds->n, ds->source);
    if (opts->start_epoch < 0 || opts->start_batch < 0 || opts->start_batch >= batches)
        return gp_error_set(GP_ERR_INVALID, "loader: resume position epoch %lld batch %lld is "
                                            "out of range (%lld batches per epoch)",
                            (long long)opts->start_epoch, (long long)opts->start_batch,
                            (long long)batches);
    if (opts->masks && !ds->masks)
        return gp_error_set(GP_ERR_INVALID, "loader: masks are asked for but %s has none "
                            "(data.synthetic.masks: true makes them)", ds->source);
    if (ds->c > GP_MAX_CHANNELS && cfg && cfg->normalize)
        return gp_error_set(GP_ERR_INVALID, "loader: %s has %lld channels; normalisation "
                                            "supports at most %d",
                            ds->source, (long long)ds->c, GP_MAX_CHANNELS);

    gp_loader *ld = calloc(1, sizeof *ld);
    if (!ld) return gp_error_set(GP_ERR_INVALID, "loader: out of host memory");
    pthread_mutex_init(&ld->lock, NULL);
    pthread_cond_init(&ld->filled, NULL);
    pthread_cond_init(&ld->freed, NULL);
    ld->ds = ds;
    ld->opts = *opts;
    if (ld->opts.prefetch < 1) ld->opts.prefetch = cfg && cfg->prefetch > 0 ? cfg->prefetch : 2;
    ld->normalize = cfg ? cfg->normalize : false;
    ld->crop_padding = cfg && cfg->crop_padding > 0 ? cfg->crop_padding : 0;
    ld->hflip = cfg ? cfg->hflip : false;
    if (ld->normalize) gp_data_norm(cfg, ds->c, ld->mean, ld->std);
    ld->per = ds->c * ds->h * ds->w;
    ld->targets = opts->masks ? ds->h * ds->w : 1;
    ld->batches = batches;
    ld->n_slots = ld->opts.prefetch + 1;
    ld->slots = calloc((size_t)ld->n_slots, sizeof *ld->slots);
    ld->perm = malloc(sizeof(int64_t) * (size_t)ds->n);
    ld->scratch = malloc((size_t)ld->per);
    ld->mscratch = opts->masks ? malloc((size_t)(ds->h * ds->w)) : NULL;
    bool ok = ld->slots && ld->perm && ld->scratch && (!opts->masks || ld->mscratch);
    for (int k = 0; ok && k < ld->n_slots; k++) {
        void *xb = NULL, *yb = NULL;
        size_t ybytes = sizeof(float) * (size_t)(bs * ld->targets);
        ok = gp_dev_host_alloc(opts->pin, sizeof(float) * (size_t)(bs * ld->per), &xb) == GP_OK &&
             gp_dev_host_alloc(opts->pin, ybytes, &yb) == GP_OK;
        ld->slots[k].x = xb;
        ld->slots[k].y = yb;
    }
    if (!ok) {
        int n_slots = ld->n_slots;
        char why[512];
        snprintf(why, sizeof why, "%s", gp_error_message());
        gp_loader_destroy(ld);
        return gp_error_set(GP_ERR_OOM, "loader: cannot allocate %d batches of %lld samples "
                            "(%s); lower data.prefetch or train.batch_size", n_slots,
                            (long long)bs, why);
    }
    int rc = pthread_create(&ld->thread, NULL, producer, ld);
    if (rc != 0) {
        gp_loader_destroy(ld);
        return gp_error_set(GP_ERR_RUNTIME, "loader: cannot start its thread: %s",
                            strerror(rc));
    }
    ld->thread_started = true;
    *out = ld;
    return GP_OK;
}

gp_status gp_loader_next(gp_loader *ld, gp_batch *out)
{
    pthread_mutex_lock(&ld->lock);
    if (ld->held) {
        ld->head = (ld->head + 1) % ld->n_slots;
        ld->count--;
        ld->held = false;
        pthread_cond_signal(&ld->freed);
    }
    while (ld->count == 0 && !ld->finished) pthread_cond_wait(&ld->filled, &ld->lock);
    if (ld->count == 0) {
        /* The producer stopped after an error: every good batch before it
         * has been delivered; now the error is. */
        gp_status s = ld->err;
        gp_error_set(s, "%s", ld->errmsg);
        pthread_mutex_unlock(&ld->lock);
        return s;
    }
    loader_slot *sl = &ld->slots[ld->head];
    ld->held = true;
    pthread_mutex_unlock(&ld->lock);
    out->x = sl->x;
    out->y = sl->y;
    out->n = sl->n;
    out->epoch = sl->epoch;
    out->index = sl->index;
    out->first = sl->first;
    return GP_OK;
}

void gp_loader_destroy(gp_loader *ld)
{
    if (!ld) return;
    if (ld->thread_started) {
        pthread_mutex_lock(&ld->lock);
        ld->stop = true;
        pthread_cond_broadcast(&ld->freed);
        pthread_mutex_unlock(&ld->lock);
        pthread_join(ld->thread, NULL);
    }
    pthread_mutex_destroy(&ld->lock);
    pthread_cond_destroy(&ld->filled);
    pthread_cond_destroy(&ld->freed);
    for (int k = 0; ld->slots && k < ld->n_slots; k++) {
        gp_dev_host_free(ld->opts.pin, ld->slots[k].x);
        gp_dev_host_free(ld->opts.pin, ld->slots[k].y);
    }
    free(ld->slots);
    free(ld->perm);
    free(ld->scratch);
    free(ld->mscratch);
    free(ld);
}
