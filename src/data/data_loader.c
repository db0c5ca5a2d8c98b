/*
 * data_loader.c — the prefetching loader: worker threads assemble
 * normalised (and, for training, augmented) batches into a bounded ring of
 * preallocated buffers while the consumer trains on the previous one.
 *
 * The ring has prefetch + 1 slots: the consumer holds at most one (the
 * batch it was last given, valid until its next call) and the workers may
 * run up to `prefetch` batches ahead.  Slots head .. head + open - 1 (mod
 * n_slots) hold batches in order; the consumer's held slot, if any, is
 * `head`.  A worker opens the next batch in a free slot, or claims the
 * next sample of the oldest open batch, under the lock; it fills that
 * sample's rows outside it (no one else writes them), and the last sample
 * done makes the batch ready.  With several workers (data.workers, for
 * image folders) the samples of a batch decode in parallel; which worker
 * fills a row never changes what the row holds.
 *
 * Every random decision (the epoch's permutation, each sample's crop and
 * flip) is a pure function of (seed, epoch, position) through the counter-
 * based RNG, so the batch sequence does not depend on thread timing.
 */
#include "data/data.h"
#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOADER_ERRMSG 2048

typedef struct loader_slot {
    float *x;           /* (batch_size, c, h, w) */
    float *y;           /* (batch_size, targets) */
    int64_t *src;       /* (batch_size) the dataset index of each sample */
    unsigned char *bad; /* (batch_size) skipped as a bad file */
    int64_t n, epoch, index, first;
    int64_t skipped, skipped_first; /* gp_batch's, set when it closes */
    /* guarded by the loader's lock */
    int64_t claimed, done;
    bool ready;
    gp_status err;      /* the first failed sample's, in batch order */
    int64_t err_at;
    char errmsg[LOADER_ERRMSG];
} loader_slot;

typedef struct loader_worker {
    struct gp_loader *ld;
    uint8_t *scratch;   /* (c, h, w) one augmented sample */
    uint8_t *mscratch;  /* (h, w) its augmented mask (opts.masks) */
    gp_folder_worker *fw; /* image folders: decoder and buffers */
    pthread_t thread;
    bool started;
} loader_worker;

struct gp_loader {
    /* Read-only after create. */
    const gp_dataset *ds;
    gp_loader_opts opts;
    bool normalize;
    int crop_padding;
    bool hflip;
    bool skip_bad;          /* data.on_bad_file: skip */
    float mean[GP_MAX_CHANNELS], std[GP_MAX_CHANNELS];
    int64_t per;            /* c * h * w */
    int64_t targets;        /* per sample in y: 1 class id, or h * w (masks) */
    int64_t batches;        /* per epoch */
    int n_slots;
    loader_slot *slots;     /* n_slots, buffers owned */
    int n_workers;
    loader_worker *workers;

    /* Shared; guarded by `lock`. */
    pthread_mutex_t lock;
    pthread_cond_t filled;  /* a slot became ready */
    pthread_cond_t work;    /* a slot was freed, or stop was requested */
    int head;               /* the oldest open slot (the consumer's next) */
    int open;               /* slots head .. head + open - 1 hold batches */
    bool held;              /* the consumer holds slot head */
    bool stop;              /* destroy asked the workers to exit */
    bool failed;            /* a batch failed: open no more */
    int64_t next_epoch, next_index; /* the next batch to open */
    int64_t perm_epoch;     /* the epoch `perm` holds */
    int64_t *perm;          /* (n) that epoch's order */
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

/* One sample: dataset index src as position `pos` (= first + i) of
 * `epoch`, into row i of the slot.  The only failures: a label outside the
 * dataset's classes (a dataset built through the C API is not validated by
 * a reader), which would index past the model's outputs, and a file of an
 * image folder that cannot be read or decoded.  Masks are checked by the
 * loss (binary cross-entropy names an element outside [0, 1]). */
static gp_status fill_sample(gp_loader *ld, loader_worker *wk, loader_slot *sl, int64_t i)
{
    const gp_dataset *ds = ld->ds;
    int64_t src = sl->src[i], pos = sl->first + i, epoch = sl->epoch;
    float *x = sl->x + i * ld->per, *y = sl->y + i * ld->targets;
    bool masks = ld->opts.masks;
    if (ds->tokens) { /* no normalisation or augmentation: ids as floats */
        gp_data_assemble(ds, src, 1, false, NULL, NULL, false, x, y);
        return GP_OK;
    }
    if (ds->folder && ld->opts.labels_only && !gp_image_folder_segmentation(ds->folder)) {
        y[0] = (float)gp_image_folder_label(ds->folder, src);
        return GP_OK;
    }
    if (ds->folder)
        return gp_folder_sample(ds->folder, wk->fw, src, ld->opts.augment, ld->opts.seed, epoch,
                                pos, ld->normalize, ld->mean, ld->std, x, y);
    if (!masks && (ds->labels[src] < 0 || ds->labels[src] >= ds->classes))
        return gp_error_set(GP_ERR_DATA, "%s: sample %lld has label %d, out of range for "
                                         "%d classes (epoch %lld, batch %lld)",
                            ds->source, (long long)src, ds->labels[src], ds->classes,
                            (long long)epoch, (long long)sl->index);
    bool augment = ld->opts.augment && (ld->crop_padding > 0 || ld->hflip);
    if (!augment) {
        gp_data_assemble(ds, src, 1, ld->normalize, ld->mean, ld->std, masks, x, y);
        return GP_OK;
    }
    int64_t hw = ds->h * ds->w;
    int dy, dx;
    bool flip;
    gp_data_augment_draw(ld->opts.seed, epoch, pos, ld->crop_padding, ld->hflip, &dy, &dx,
                         &flip);
    gp_data_augment_apply(ds->images + src * ld->per, ds->c, ds->h, ds->w, dy, dx, flip,
                          wk->scratch);
    /* a mask moves with its image */
    if (masks)
        gp_data_augment_apply(ds->masks + src * hw, 1, ds->h, ds->w, dy, dx, flip,
                              wk->mscratch);
    /* Through the shared assembler, so augmented and plain samples are
     * normalised by the very same arithmetic. */
    gp_dataset one = {.n = 1, .c = ds->c, .h = ds->h, .w = ds->w, .classes = ds->classes,
                      .images = wk->scratch, .labels = ds->labels + src,
                      .masks = masks ? wk->mscratch : NULL};
    gp_data_assemble(&one, 0, 1, ld->normalize, ld->mean, ld->std, masks, x, y);
    return GP_OK;
}

/* Open the next batch in slot head + open (lock held): its samples' order
 * and position. */
static void open_batch(gp_loader *ld)
{
    loader_slot *sl = &ld->slots[(ld->head + ld->open) % ld->n_slots];
    int64_t epoch = ld->next_epoch, index = ld->next_index;
    if (ld->perm_epoch != epoch) {
        gp_data_epoch_order(ld->ds->n, ld->opts.shuffle, ld->opts.seed, epoch, ld->perm);
        ld->perm_epoch = epoch;
    }
    int64_t bs = ld->opts.batch_size, first = index * bs;
    int64_t n = ld->ds->n - first < bs ? ld->ds->n - first : bs;
    for (int64_t i = 0; i < n; i++) sl->src[i] = ld->perm[first + i];
    memset(sl->bad, 0, (size_t)n);
    sl->n = n;
    sl->epoch = epoch;
    sl->index = index;
    sl->first = first;
    sl->claimed = sl->done = 0;
    sl->ready = false;
    sl->err = GP_OK;
    sl->err_at = n;
    ld->open++;
    if (++ld->next_index == ld->batches) {
        ld->next_index = 0;
        ld->next_epoch++;
    }
}

/* Every sample of the slot is done (lock held): drop the skipped bad
 * files, keeping the others in order. */
static void close_batch(gp_loader *ld, loader_slot *sl)
{
    sl->skipped = 0;
    sl->skipped_first = -1;
    if (sl->err == GP_OK) {
        int64_t k = 0;
        for (int64_t i = 0; i < sl->n; i++) {
            if (sl->bad[i]) {
                if (sl->skipped++ == 0) sl->skipped_first = sl->src[i];
                continue;
            }
            if (k != i) {
                memmove(sl->x + k * ld->per, sl->x + i * ld->per, sizeof(float) * (size_t)ld->per);
                memmove(sl->y + k * ld->targets, sl->y + i * ld->targets,
                        sizeof(float) * (size_t)ld->targets);
            }
            k++;
        }
        if (k == 0) {
            sl->err = GP_ERR_DATA;
            snprintf(sl->errmsg, sizeof sl->errmsg, "%s: every sample of batch %lld of epoch "
                     "%lld is a bad file (data.on_bad_file: skip); check the data",
                     ld->ds->source, (long long)sl->index, (long long)sl->epoch + 1);
        }
        sl->n = k;
    }
    if (sl->err != GP_OK) ld->failed = true;
    sl->ready = true;
    pthread_cond_broadcast(&ld->filled);
}

static void *worker_main(void *arg)
{
    loader_worker *wk = arg;
    gp_loader *ld = wk->ld;
    gp_image_folder *folder = ld->ds->folder;
    pthread_mutex_lock(&ld->lock);
    for (;;) {
        if (ld->stop) break;
        /* the oldest open batch with a sample nobody has claimed */
        loader_slot *sl = NULL;
        for (int k = 0; k < ld->open && !sl; k++) {
            loader_slot *c = &ld->slots[(ld->head + k) % ld->n_slots];
            if (c->claimed < c->n && !c->ready) sl = c;
        }
        if (!sl && ld->open < ld->n_slots && !ld->failed) {
            open_batch(ld);
            continue;
        }
        if (!sl) {
            pthread_cond_wait(&ld->work, &ld->lock);
            continue;
        }
        int64_t i = sl->claimed++;
        int64_t src = sl->src[i];
        pthread_mutex_unlock(&ld->lock);

        gp_status s = GP_OK;
        bool skip = false;
        if (folder && gp_image_folder_is_bad(folder, src)) {
            skip = true; /* found bad before, and warned about */
        } else {
            s = fill_sample(ld, wk, sl, i);
            if (s != GP_OK && folder && s != GP_ERR_OOM &&
                ld->skip_bad) {
                if (gp_image_folder_mark_bad(folder, src))
                    GP_WARN("skipping a bad file (data.on_bad_file: skip): %s",
                            gp_error_message());
                skip = true;
                s = GP_OK;
            }
        }

        pthread_mutex_lock(&ld->lock);
        sl->bad[i] = skip;
        if (s != GP_OK && i < sl->err_at) {
            /* The message is in this thread's buffer: copy it out for the
             * consumer, who reports it after the batches before. */
            sl->err = s;
            sl->err_at = i;
            snprintf(sl->errmsg, sizeof sl->errmsg, "%s", gp_error_message());
        }
        if (++sl->done == sl->n) close_batch(ld, sl);
    }
    pthread_mutex_unlock(&ld->lock);
    return NULL;
}

int64_t gp_loader_bad_files(const gp_loader *ld)
{
    return ld->ds->folder ? gp_image_folder_bad_files(ld->ds->folder) : 0;
}

int64_t gp_loader_batches_per_epoch(const gp_loader *ld) { return ld->batches; }

int64_t gp_loader_batches(int64_t n, int64_t batch_size, bool drop_last)
{
    return drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
}

/* The dataset, the options and the config checked before anything is
 * allocated; *batches_out: the batches in an epoch. */
static gp_status loader_check(const gp_dataset *ds, const gp_data_config *cfg,
                              const gp_loader_opts *opts, int64_t *batches_out)
{
    if (!ds || (!ds->folder && !ds->tokens && (!ds->images || !ds->labels)) || ds->n < 1)
        return gp_error_set(GP_ERR_INVALID, "loader: the dataset is empty");
    if (opts->batch_size < 1)
        return gp_error_set(GP_ERR_INVALID, "loader: batch size %lld must be >= 1",
                            (long long)opts->batch_size);
    int64_t bs = opts->batch_size;
    int64_t batches = *batches_out = gp_loader_batches(ds->n, bs, opts->drop_last);
    if (batches < 1)
        return gp_error_set(GP_ERR_INVALID, "loader: batch size %lld exceeds the %lld samples "
                                            "of %s and drop_last leaves no batch",
                            (long long)bs, (long long)ds->n, ds->source);
    if (opts->start_epoch < 0 || opts->start_batch < 0 || opts->start_batch >= batches)
        return gp_error_set(GP_ERR_INVALID, "loader: resume position epoch %lld batch %lld is "
                                            "out of range (%lld batches per epoch)",
                            (long long)opts->start_epoch, (long long)opts->start_batch,
                            (long long)batches);
    if (opts->masks && ds->tokens)
        return gp_error_set(GP_ERR_INVALID, "loader: %s holds tokens, whose targets are the "
                            "next tokens, not masks", ds->source);
    if (opts->masks && !gp_dataset_has_masks(ds))
        return gp_error_set(GP_ERR_INVALID, "loader: masks are asked for but %s has none "
                            "(an image folder has them with data.layout: segmentation, "
                            "synthetic data with data.synthetic.masks: true)", ds->source);
    if (ds->folder && gp_image_folder_segmentation(ds->folder) && !opts->masks)
        return gp_error_set(GP_ERR_INVALID, "%s holds segmentation masks, the targets of "
                            "model.loss: bce_with_logits; set it", ds->source);
    /* more channels than a per-channel list can hold (a flat input is F
     * channels of 1 x 1): one mean and std for all of them, or none */
    if (ds->c > GP_MAX_CHANNELS && !ds->tokens && cfg && cfg->normalize && cfg->n_mean > 1)
        return gp_error_set(GP_ERR_INVALID, "%s has %lld channels, more than data.mean and "
                            "data.std can list (%d); give one value of each for all channels, "
                            "or data.normalize: false", ds->source, (long long)ds->c,
                            GP_MAX_CHANNELS);
    return GP_OK;
}

gp_status gp_loader_create(const gp_dataset *ds, const gp_data_config *cfg,
                           const gp_loader_opts *opts, gp_loader **out)
{
    *out = NULL;
    int64_t bs = opts->batch_size, batches = 0;
    GP_TRY(loader_check(ds, cfg, opts, &batches));
    gp_loader *ld = calloc(1, sizeof *ld);
    if (!ld) return gp_error_set(GP_ERR_INVALID, "loader: out of host memory");
    pthread_mutex_init(&ld->lock, NULL);
    pthread_cond_init(&ld->filled, NULL);
    pthread_cond_init(&ld->work, NULL);
    ld->ds = ds;
    ld->opts = *opts;
    if (ld->opts.prefetch < 1) ld->opts.prefetch = cfg && cfg->prefetch > 0 ? cfg->prefetch : 2;
    ld->normalize = cfg && !ds->tokens ? cfg->normalize : false;
    ld->crop_padding = cfg && cfg->crop_padding > 0 ? cfg->crop_padding : 0;
    ld->hflip = cfg ? cfg->hflip : false;
    ld->skip_bad = cfg ? cfg->skip_bad_files : false;
    if (ld->normalize) gp_data_norm(cfg, ds->c, ld->mean, ld->std);
    ld->per = ds->c * ds->h * ds->w;
    /* tokens: the next token of each of the T positions */
    ld->targets = ds->tokens ? ds->c : opts->masks ? ds->h * ds->w : 1;
    ld->batches = batches;
    ld->next_epoch = opts->start_epoch;
    ld->next_index = opts->start_batch;
    ld->perm_epoch = -1;
    ld->n_slots = ld->opts.prefetch + 1;
    /* The slots are host memory the kernel promises and may not have
     * (overcommit): more than the machine holds ends the run later, by the
     * OOM killer, with no word; half of it is likely to. */
    double slot_bytes = 4.0 * (double)bs * (double)(ld->per + ld->targets);
    double want = slot_bytes * ld->n_slots;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double ram = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    if (ram > 0 && want > ram / 2) {
        char b1[32], b2[32];
        gp_format_bytes((size_t)want, b1, sizeof b1);
        gp_format_bytes((size_t)ram, b2, sizeof b2);
        if (want > ram) {
            gp_status e = gp_error_set(GP_ERR_INVALID, "data.prefetch = %d keeps %d batches of %lld "
                                       "samples in host memory, %s, more than this machine's "
                                       "%s; lower data.prefetch (or train.batch_size)",
                                       ld->opts.prefetch, ld->n_slots, (long long)bs, b1, b2);
            pthread_cond_destroy(&ld->work);
            pthread_cond_destroy(&ld->filled);
            pthread_mutex_destroy(&ld->lock);
            free(ld);
            return e;
        }
        GP_WARN("data.prefetch = %d keeps %d batches of %lld samples in host memory, %s, over "
                "half of this machine's %s; lower data.prefetch if the run is killed for "
                "memory", ld->opts.prefetch, ld->n_slots, (long long)bs, b1, b2);
    }
    ld->n_workers = opts->workers > 0 ? opts->workers : 1;
    ld->slots = calloc((size_t)ld->n_slots, sizeof *ld->slots);
    ld->workers = calloc((size_t)ld->n_workers, sizeof *ld->workers);
    ld->perm = malloc(sizeof(int64_t) * (size_t)ds->n);
    bool ok = ld->slots && ld->workers && ld->perm;
    for (int k = 0; ok && k < ld->n_slots; k++) {
        void *xb = NULL, *yb = NULL;
        size_t ybytes = sizeof(float) * (size_t)(bs * ld->targets);
        ok = gp_dev_host_alloc(opts->pin, sizeof(float) * (size_t)(bs * ld->per), &xb) == GP_OK &&
             gp_dev_host_alloc(opts->pin, ybytes, &yb) == GP_OK;
        ld->slots[k].x = xb;
        ld->slots[k].y = yb;
        ld->slots[k].src = malloc(sizeof(int64_t) * (size_t)bs);
        ld->slots[k].bad = malloc((size_t)bs);
        ok = ok && ld->slots[k].src && ld->slots[k].bad;
    }
    gp_status ws = GP_OK;
    for (int k = 0; ok && k < ld->n_workers; k++) {
        loader_worker *wk = &ld->workers[k];
        wk->ld = ld;
        if (ds->folder) {
            ws = gp_folder_worker_create(&wk->fw);
            ok = ws == GP_OK;
        } else {
            wk->scratch = malloc((size_t)ld->per);
            wk->mscratch = opts->masks ? malloc((size_t)(ds->h * ds->w)) : NULL;
            ok = wk->scratch && (!opts->masks || wk->mscratch);
        }
    }
    if (!ok) {
        int n_slots = ld->n_slots;
        char why[512];
        snprintf(why, sizeof why, "%s", gp_error_message());
        gp_loader_destroy(ld);
        if (ws != GP_OK) return gp_error_set(ws, "%s", why);
        return gp_error_set(GP_ERR_OOM, "loader: cannot allocate %d batches of %lld samples "
                            "(%s); lower data.prefetch or train.batch_size", n_slots,
                            (long long)bs, why);
    }
    for (int k = 0; k < ld->n_workers; k++) {
        loader_worker *wk = &ld->workers[k];
        int rc = pthread_create(&wk->thread, NULL, worker_main, wk);
        if (rc != 0) {
            gp_loader_destroy(ld);
            char why[300];
            return gp_error_set(GP_ERR_RUNTIME, "loader: cannot start its thread %d: %s", k,
                                gp_thread_error(rc, why, sizeof why));
        }
        wk->started = true;
    }
    *out = ld;
    return GP_OK;
}

gp_status gp_loader_next(gp_loader *ld, gp_batch *out)
{
    pthread_mutex_lock(&ld->lock);
    if (ld->held) {
        ld->head = (ld->head + 1) % ld->n_slots;
        ld->open--;
        ld->held = false;
        pthread_cond_broadcast(&ld->work);
    }
    /* the workers always open batches while a slot is free, so the head
     * slot is open or about to be */
    while (ld->open == 0 || !ld->slots[ld->head].ready) pthread_cond_wait(&ld->filled, &ld->lock);
    loader_slot *sl = &ld->slots[ld->head];
    if (sl->err != GP_OK) {
        /* Every good batch before this one has been delivered; now its
         * error is (again on every later call). */
        gp_status s = sl->err;
        gp_error_set(s, "%s", sl->errmsg);
        pthread_mutex_unlock(&ld->lock);
        return s;
    }
    ld->held = true;
    pthread_mutex_unlock(&ld->lock);
    out->x = sl->x;
    out->y = sl->y;
    out->n = sl->n;
    out->epoch = sl->epoch;
    out->index = sl->index;
    out->first = sl->first;
    out->skipped = sl->skipped;
    out->skipped_first = sl->skipped_first;
    return GP_OK;
}

void gp_loader_destroy(gp_loader *ld)
{
    if (!ld) return;
    pthread_mutex_lock(&ld->lock);
    ld->stop = true;
    pthread_cond_broadcast(&ld->work);
    pthread_mutex_unlock(&ld->lock);
    for (int k = 0; ld->workers && k < ld->n_workers; k++) {
        loader_worker *wk = &ld->workers[k];
        if (wk->started) pthread_join(wk->thread, NULL);
        free(wk->scratch);
        free(wk->mscratch);
        gp_folder_worker_destroy(wk->fw);
    }
    pthread_mutex_destroy(&ld->lock);
    pthread_cond_destroy(&ld->filled);
    pthread_cond_destroy(&ld->work);
    for (int k = 0; ld->slots && k < ld->n_slots; k++) {
        gp_dev_host_free(ld->opts.pin, ld->slots[k].x);
        gp_dev_host_free(ld->opts.pin, ld->slots[k].y);
        free(ld->slots[k].src);
        free(ld->slots[k].bad);
    }
    free(ld->slots);
    free(ld->workers);
    free(ld->perm);
    free(ld);
}
