/*
 * data.h — the data module's one header (src/data): datasets, the
 * prefetching loader, the image folders and the image codecs and
 * transforms below.
 *
 * A gp_dataset holds a whole split in host memory as uint8 pixels (N, C, H, W)
 * and int32 labels (and, for segmentation, a uint8 mask (N, H, W) of 0 / 1
 * per pixel); normalisation to float happens when a batch is assembled, so
 * a 60k-image split costs 47 MB, not 188 MB.
 *
 * Readers: MNIST / Fashion-MNIST IDX files (gzip through zlib, or raw: both
 * "x-idx3-ubyte" and "x-idx3-ubyte.gz" are tried), CIFAR-10 binary batches
 * (data_batch_1..5.bin, test_batch.bin), and a synthetic, learnable dataset
 * made from the seed, with learnable masks when asked (gp_data_make_masks),
 * and llm.c's token files (data.dataset: tokens, below).  A corrupt or truncated file gives GP_ERR_DATA with a
 * message naming the file and what was wrong (bad magic, wrong dimensions,
 * short read at byte N, label out of range); a missing one GP_ERR_IO with the
 * path tried and how to get the data.
 *
 * The loader owns one background thread that assembles batches into a
 * bounded queue (cfg->prefetch deep), so loading overlaps the training step.
 * Order: with shuffle, epoch e visits a permutation drawn from the
 * counter-based RNG keyed by (seed, e); without, file order.  Augmentation
 * (random crop with zero padding, horizontal flip) draws from the same RNG
 * keyed by the sample's position, so a run is reproducible whatever the
 * thread timing.
 *
 * Owns: datasets in host memory and the loader's thread.  May call: core,
 * config (the data section), backend (pinned host buffers).
 *
 * Thread safety: a loader is used by one consumer thread; its worker thread
 * is private.  Datasets are immutable after loading.
 */
#ifndef GP_DATA_H
#define GP_DATA_H

#include "config/config.h"

typedef struct gp_image_folder gp_image_folder; /* image_folder.c */

typedef struct gp_dataset {
    int64_t n;          /* samples */
    int64_t c, h, w;    /* per-sample shape */
    int classes;
    uint8_t *images;    /* (n, c, h, w), owned */
    int32_t *labels;    /* (n), owned (32-bit: ImageNet-sized class counts) */
    uint8_t *masks;     /* (n, h, w) per-pixel targets, 0 or 1, owned; NULL =
                           none (class labels only) */
    char source[512];   /* where it came from, for messages */
    /* data.dataset: image_folder: samples are decoded from files on demand
     * (images, labels and masks are NULL; c, h, w the crop's shape);
     * owned.  Its bad-file marks are the one mutable part of a dataset. */
    gp_image_folder *folder;
    /* data.dataset: tokens: the split's token stream (n_tokens), owned;
     * NULL otherwise.  Sample k is the window tokens[k (T + 1) ..
     * k (T + 1) + T] (T = c, h = w = 1): input its first T tokens, targets
     * the T after each; n = n_tokens / (T + 1) windows, so an epoch reads
     * every token once (the remainder of the last window, fewer than T + 1
     * tokens, never).  images and labels are NULL; classes is the largest
     * token id + 1. */
    uint32_t *tokens;
    int64_t n_tokens;
    int token_bytes;            /* the file's bytes a token: 2 (uint16), 4 (uint32) */
} gp_dataset;

/* Per-pixel targets: an in-memory mask array, or a segmentation folder. */
bool gp_dataset_has_masks(const gp_dataset *ds);

/* Load the train (train_split = true) or test split described by cfg,
 * applying cfg->train_limit / test_limit.  `seed` seeds the synthetic set. */
gp_status gp_dataset_load(const gp_data_config *cfg, bool train_split,
                          uint64_t seed, gp_dataset *out);
void gp_dataset_free(gp_dataset *ds);

/* Whether the files cfg's splits would be read from are there, without
 * reading them (--dry-run): GP_OK with `where` saying what was found, or
 * the error gp_dataset_load would stop with.  An image folder's train/ and
 * val/ are checked as folders, not listed. */
gp_status gp_dataset_locate(const gp_data_config *cfg, char *where, size_t len);

/* A split's sample shape and classes without reading its samples, for
 * --dry-run's check against the model: an IDX dataset's header (c 1, h, w,
 * n; classes 10, the least its labels give), CIFAR-10's fixed 3 x 32 x 32
 * and 10 classes (n from its files' sizes); *known false for the kinds only a read tells (image
 * folders, tokens, synthetic).  out holds no samples (nothing to free). */
gp_status gp_dataset_peek(const gp_data_config *cfg, bool train_split, gp_dataset *out,
                          bool *known);

/* Whether writing `out` would replace a file cfg's dataset reads, however
 * spelt: the four IDX files, CIFAR-10's batches, a token dataset's two
 * splits, or any existing file under an image folder's train/ and val/.
 * Other files beside the data (a metrics file written there before) are
 * not the dataset's; a synthetic dataset reads none, and where the files
 * are missing there is nothing to replace.  (gpipe-train and gpipe-balance
 * refuse such an output before anything runs.) */
bool gp_dataset_reads(const gp_data_config *cfg, const char *out);

/* The individual readers (also used by tests and fuzzers). */
gp_status gp_idx_read_images(const char *path, gp_dataset *ds);
gp_status gp_idx_read_labels(const char *path, gp_dataset *ds);
gp_status gp_cifar10_read(const char *const *paths, int n_paths, gp_dataset *ds);
/* An llm.c token file: a header of 256 little-endian int32 (magic
 * GP_TOKENS_MAGIC, version GP_TOKENS_VERSION, token count, the rest 0),
 * then that many little-endian uint16 tokens; or llm.c's Llama 3 file
 * (magic GP_TOKENS_MAGIC32, version GP_TOKENS_VERSION32) of uint32
 * tokens, for vocabularies past 65,535 (Llama 3's 128,256); read whole
 * into ds->tokens and cut into windows of seq_len + 1.  A bad magic or
 * version, a short header, a count that disagrees with the file's size
 * either way, an id of 2^24 or more (ids travel as floats), or fewer tokens
 * than one window is GP_ERR_DATA naming the file and what to do. */
#define GP_TOKENS_MAGIC 20240520
#define GP_TOKENS_VERSION 1
#define GP_TOKENS_MAGIC32 20240801
#define GP_TOKENS_VERSION32 7
#define GP_TOKENS_HEADER 256 /* int32 words */
gp_status gp_tokens_read(const char *path, int64_t seq_len, gp_dataset *ds);
/* The split files data.path names (data.dataset: tokens): a folder holding
 * exactly one <name>_train.bin (or train.bin) and one <name>_val.bin (or
 * val.bin), or a file <name>_train.bin whose <name>_val.bin lies beside it.
 * GP_ERR_IO naming what is missing or ambiguous. */
gp_status gp_tokens_files(const char *path, char train[1024], char val[1024]);
/* Every file a token dataset at `path` may read, into out[0..max): path
 * itself and its <stem>val.bin where path is a file, else every
 * <name>_train.bin / <name>_val.bin (or train.bin, val.bin) in the folder,
 * whether or not gp_tokens_files would accept them (one split missing, or
 * two of one).  Returns how many. */
int gp_tokens_candidates(const char *path, char (*out)[1100], int max);
gp_status gp_synthetic_make(int64_t n, int classes, int64_t c, int64_t h,
                            int64_t w, uint64_t seed, gp_dataset *ds);
/* Synthetic data for a model that reads token ids (gp_data_config.
 * token_vocab): n windows of t + 1 ids, as data.dataset: tokens cuts its
 * file (ds->tokens), the ids below min(vocab, GP_SYNTHETIC_TOKEN_IDS).  A
 * learnable language: each id is followed by its successor in a fixed
 * random permutation of them, nine times in ten, else by a random id, so
 * a model that learns the bigrams gets the loss down from log(ids) (5.5
 * nats for 256) towards the set's entropy (0.88 nats for 256).  Window
 * `first + i` draws from streams keyed by its index, as synthetic_fill's
 * samples do. */
gp_status gp_synthetic_tokens(int64_t n, int64_t t, int64_t vocab, uint64_t seed, int64_t first,
                              gp_dataset *ds);
#define GP_SYNTHETIC_TOKEN_IDS 256
/* Segmentation targets made from the images (data.synthetic.masks): pixel
 * (y, x) of sample i is 1 where the mean of its 3 x 3 neighbourhood over
 * all channels (the part inside the image) is above half the pixel range,
 * 2 x sum > 255 x count in integers, else 0.  A pure function of the
 * pixels, so a convolutional net can learn it exactly.  Replaces ds->masks;
 * GP_ERR_OOM leaves ds unchanged. */
gp_status gp_data_make_masks(gp_dataset *ds);

/* Default per-channel mean/std of a dataset's pixels scaled to [0, 1]. */
void gp_dataset_default_norm(gp_dataset_kind kind, int64_t channels,
                             float *mean, float *std);

/* Size limits the readers enforce before allocating, so a corrupt header or
 * a gzip bomb cannot ask for unbounded memory. */
#define GP_DATA_MAX_BYTES ((int64_t)1 << 31)  /* pixels of one split */
#define GP_DATA_MAX_SIDE 65535                /* rows, cols */

/* The synthetic set's per-sample shape when cfg->synthetic_shape is unset. */
#define GP_SYNTHETIC_C 1
#define GP_SYNTHETIC_H 28
#define GP_SYNTHETIC_W 28

/* ---- image folders (image_folder.c) -------------------------------------- */

/* The index of <cfg->path>/<train|val> (layouts in image_folder.c), read
 * from its cache when every folder time and file size and time still
 * match, else listed and cached again (*cached says which).  Errors before
 * any training: an unreadable root, no class folders or an empty one, no
 * images, an image without a mask or a mask without an image, each naming
 * the path. */
gp_status gp_image_folder_open(const gp_data_config *cfg, bool train_split, int out_h,
                               int out_w, gp_image_folder **out, bool *cached);
void gp_image_folder_free(gp_image_folder *f);
/* Classification: give the evaluation split the training split's class
 * indices (torchvision numbers each folder's classes on its own, so a val/
 * that lacks a class would shift every label after it).  A val class that
 * train/ lacks is an error naming it.  Segmentation: nothing to do. */
gp_status gp_image_folder_align_classes(gp_image_folder *val, const gp_image_folder *train);
int64_t gp_image_folder_size(const gp_image_folder *f);
/* data.train_limit / test_limit on a folder: keep `keep` of its files
 * spread evenly over the sorted listing (file floor(i n / keep)), so every
 * class keeps its share; the first `keep` would be the first classes
 * alone.  keep <= 0 or >= the size: all. */
void gp_image_folder_keep(gp_image_folder *f, int64_t keep);
int gp_image_folder_classes(const gp_image_folder *f);
bool gp_image_folder_segmentation(const gp_image_folder *f);
const char *gp_image_folder_dir(const gp_image_folder *f);
int gp_image_folder_label(const gp_image_folder *f, int64_t i);
const char *gp_image_folder_file(const gp_image_folder *f, int64_t i); /* under dir */
/* data.on_bad_file: skip.  mark_bad is true the first time file i is
 * marked (the caller warns then); bad_files counts the files marked. */
bool gp_image_folder_is_bad(const gp_image_folder *f, int64_t i);
bool gp_image_folder_mark_bad(gp_image_folder *f, int64_t i);
int64_t gp_image_folder_bad_files(const gp_image_folder *f);

/* A decode thread's state (decoder, buffers). */
typedef struct gp_folder_worker gp_folder_worker;
gp_status gp_folder_worker_create(gp_folder_worker **out);
void gp_folder_worker_destroy(gp_folder_worker *w);
/* File i as sample `pos` of `epoch`: with train, the random resized crop
 * (or, with it off, the evaluation crop) and flip drawn from (seed, epoch,
 * pos) (gp_image_rrc_draw); else Resize + CenterCrop.  Writes (3, h, w)
 * floats, p / 255 or normalised by mean / std, to x, and the class id (1
 * float) or the mask (h x w floats, 0 / 1 or the index) to y.  A file that
 * cannot be read or decoded is GP_ERR_IO / GP_ERR_DATA naming it. */
gp_status gp_folder_sample(const gp_image_folder *f, gp_folder_worker *w, int64_t i, bool train,
                           uint64_t seed, int64_t epoch, int64_t pos, bool normalize,
                           const float *mean, const float *std, float *x, float *y);


/* One host batch. */
typedef struct gp_batch {
    float *x;           /* (n, c, h, w) normalised, owned by the loader */
    float *y;           /* (n) class ids as floats, or with masks (n, h, w)
                           targets 0 / 1, or for tokens (n, T) the next
                           token of each position; owned by the loader */
    int64_t n;          /* samples in this batch (the last may be short) */
    int64_t epoch;      /* 0-based */
    int64_t index;      /* batch index within the epoch */
    int64_t first;      /* position of its first sample within the epoch */
    int64_t skipped;    /* bad files dropped from it (data.on_bad_file: skip) */
    int64_t skipped_first; /* the dataset index of the first of them; -1: none */
} gp_batch;

typedef struct gp_loader_opts {
    int64_t batch_size;
    bool shuffle;
    bool augment;       /* apply crop/flip from the data config */
    bool drop_last;     /* skip a short final batch */
    bool masks;         /* y holds each sample's mask (the dataset's, cropped
                           and flipped with its image) instead of its class */
    int prefetch;       /* queue depth >= 1 */
    uint64_t seed;
    int64_t start_epoch;/* resume position */
    int64_t start_batch;
    int workers;        /* threads filling batches; <= 0 = 1 (image
                           folders: the caller passes gp_data_workers) */
    /* Only the targets: an image folder's images are not read or decoded
     * (x is left as it is).  For a process under mpirun whose stages take
     * no inputs.  Classification folders only (a mask is cropped with its
     * image), and not with data.on_bad_file: skip (only decoding finds a
     * bad file, and every rank must skip the same ones). */
    bool labels_only;
    /* The device the batches are uploaded to (stage 0 of the first
     * replica), or NULL: the batch buffers come from its gp_dev_host_alloc,
     * pinned on GPUs so uploads are DMA without a staging copy. */
    struct gp_device *pin;
} gp_loader_opts;

typedef struct gp_loader gp_loader;

/* The dataset must outlive the loader.  cfg supplies normalisation and
 * augmentation parameters. */
gp_status gp_loader_create(const gp_dataset *ds, const gp_data_config *cfg,
                           const gp_loader_opts *opts, gp_loader **out);
/* Blocks until the next batch is ready.  Batches run on across epochs
 * forever; the caller stops.  The batch stays valid until the next
 * gp_loader_next or gp_loader_destroy. */
gp_status gp_loader_next(gp_loader *ld, gp_batch *out);
int64_t gp_loader_batches_per_epoch(const gp_loader *ld);
/* The batches an epoch of n samples makes in batches of batch_size, the
 * last partial one dropped or not: what a loader created so serves (for
 * a caller that needs the count before it creates one). */
int64_t gp_loader_batches(int64_t n, int64_t batch_size, bool drop_last);
/* Files skipped as bad so far (data.on_bad_file: skip); 0 otherwise. */
int64_t gp_loader_bad_files(const gp_loader *ld);
void gp_loader_destroy(gp_loader *ld);

/* The loader's random decisions as pure functions, so that tests and tools
 * can recompute exactly what a batch contains.
 *
 * gp_data_epoch_order: perm[0..n) = the samples epoch `epoch` visits, in
 * order: identity without shuffle, else Fisher-Yates on Philox keyed by
 * (seed, gp_rng_stream(epoch, 0x73687566, 0)).
 *
 * gp_data_augment_draw: for the sample at position `pos` of epoch `epoch`,
 * the crop offset (dy, dx in [-pad, pad]; output (y, x) reads input
 * (y + dy, x + dx), zero outside) and whether it is mirrored (only if
 * hflip; mirroring is applied after the crop: output (y, x) reads the
 * cropped (y, w - 1 - x)). */
#define GP_DATA_SHUFFLE_TAG 0x73687566u  /* "shuf" */
#define GP_DATA_AUGMENT_TAG 0x61756720u  /* "aug " */
void gp_data_epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch,
                         int64_t *perm);
void gp_data_augment_draw(uint64_t seed, int64_t epoch, int64_t pos, int pad,
                          bool hflip, int *dy, int *dx, bool *flip);
/* One sample (c, h, w) of uint8 pixels through that crop and flip. */
void gp_data_augment_apply(const uint8_t *src, int64_t c, int64_t h, int64_t w,
                           int dy, int dx, bool flip, uint8_t *dst);


/* ---- batch assembly shared by the loader and evaluation (batch.c) ------ */

/* The per-channel mean/std to use: the config's if given, else the
 * dataset's defaults (channels beyond those given repeat the last). */
void gp_data_norm(const gp_data_config *cfg, int64_t channels, float *mean, float *std);
/* Pixel p of channel c becomes p * a + b: a = 1 / (255 std[c]) and
 * b = -mean[c] / std[c] when normalizing, else 1 / 255 and 0.  The one
 * formula of every path that turns bytes into inputs (gp_data_assemble,
 * the image folders), so they agree bit for bit. */
void gp_data_norm_affine(bool normalize, const float *mean, const float *std, int c, float *a,
                         float *b);
/* Samples first..first+n of ds in file order into x (n, c, h, w) as
 * (p / 255 - mean[c]) / std[c] (or p / 255 when !normalize) and y: (n)
 * class ids, or with `masks` (n, h, w) the masks' 0 / 1 (ds->masks must
 * exist). */
void gp_data_assemble(const gp_dataset *ds, int64_t first, int64_t n, bool normalize,
                      const float *mean, const float *std, bool masks, float *x, float *y);

/* ---- images (image.c) ---------------------------------------------------
 *
 * JPEG and PNG files to 8-bit pixels, and the transforms of the
 * image_folder dataset (torchvision's RandomResizedCrop, Resize +
 * CenterCrop, horizontal flip, normalisation), as pure functions.
 *
 * Decoding: JPEG through libjpeg-turbo's TurboJPEG API, PNG through libpng,
 * both found by CMake (GPIPE_IMAGES=AUTO|ON|OFF); without them
 * gp_image_supported() is false and every decode names the packages to
 * install.  Output is interleaved rows (h, w, c): c = 3 for images (RGB;
 * grayscale is replicated, CMYK converted as Pillow converts it, alpha
 * dropped, 16-bit samples keep their high byte, as Pillow does) and c = 1
 * for masks (gray value or palette index; colour masks keep their largest
 * channel, so "any channel non-zero" survives).  A JPEG can be decoded at
 * 1/2, 1/4 or 1/8 scale in the DCT domain (`denom`), which is how a small
 * crop of a large photo costs a fraction of a full decode.
 *
 * Transforms: the crop box is drawn in source pixels, the image resampled
 * from it with Pillow's bilinear filter (a triangle whose support widens
 * with the reduction, so downscaling averages instead of aliasing), the
 * filter clamped to `clamp` (the crop for a random resized crop, as
 * torchvision crops before it resizes; the whole image for evaluation,
 * where resize-then-centre-crop is exactly one resample of the centre box).
 *
 * Thread safety: a gp_image_codec belongs to one thread; everything else
 * is a pure function.
 */


/* Decoded pixels, (h, w, c) rows; px grows as needed and is owned. */
typedef struct gp_image {
    uint8_t *px;
    size_t cap;
    int w, h, c;
} gp_image;
void gp_image_free(gp_image *im);

/* The largest image decoded (a hostile header cannot ask for more memory):
 * 100 megapixels, 300 MB as RGB, as the header declares them, whatever the
 * scale a JPEG would be decoded at (a progressive JPEG's decoder holds the
 * whole image's coefficients even for a 1/8 decode). */
#define GP_IMAGE_MAX_PIXELS ((int64_t)100 * 1000 * 1000)

/* True when gpipe was built with libturbojpeg and libpng. */
bool gp_image_supported(void);

typedef struct gp_image_codec gp_image_codec; /* per thread: decoder handles */
gp_status gp_image_codec_create(gp_image_codec **out);
void gp_image_codec_destroy(gp_image_codec *cd);

/* Width and height of the JPEG or PNG in buf (len bytes), from its header.
 * `path` names the file in errors (GP_ERR_DATA: not a JPEG or PNG, a
 * corrupt header, or a JPEG past GP_IMAGE_MAX_PIXELS). */
gp_status gp_image_probe(gp_image_codec *cd, const uint8_t *buf, size_t len, const char *path,
                         int *w, int *h);
/* Decode to `channels` (3 or 1) at 1/denom scale (1, 2, 4 or 8; a PNG is
 * always decoded whole, denom ignored).  A truncated or corrupt file is
 * GP_ERR_DATA naming the path and the decoder's reason. */
gp_status gp_image_decode(gp_image_codec *cd, const uint8_t *buf, size_t len, const char *path,
                          int channels, int denom, gp_image *out);
/* The region (rx, ry, rw, rh) of the full-size image, decoded at 1/denom
 * (3 channels): only that region's rows and (whole-iMCU) columns go
 * through the inverse DCT, upsampling and colour conversion, and nothing
 * below it is decoded at all.  out holds scaled pixels [ox, ox + out->w)
 * x [oy, oy + out->h) of the 1/denom image (fw x fh pixels), a superset
 * of the region rounded outwards, whose pixels inside the region are the
 * whole image's decode at that scale.  A PNG, or a CMYK JPEG, is decoded whole
 * (ox = oy = 0; a PNG at full size). */
gp_status gp_image_decode_region(gp_image_codec *cd, const uint8_t *buf, size_t len,
                                 const char *path, int denom, int rx, int ry, int rw, int rh,
                                 gp_image *out, int *ox, int *oy, int *fw, int *fh);
/* Pixels of a scaled decode: ceil(size / denom), as libjpeg computes. */
/* Whether the bytes start as a JPEG does (SOI and a marker). */
static inline bool gp_image_is_jpeg(const uint8_t *b, size_t len)
{
    return len >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff;
}
static inline int gp_image_scaled(int size, int denom) { return (size + denom - 1) / denom; }

/* ---- transforms -------------------------------------------------------- */

/* An axis-aligned box in source pixels. */
typedef struct gp_box {
    double x, y, w, h;
} gp_box;

/* torchvision.transforms.RandomResizedCrop.get_params for a w x h image:
 * up to 10 tries of an area fraction in [scale[0], scale[1]] and an aspect
 * ratio log-uniform in [ratio[0], ratio[1]] (sides rounded; kept if they
 * fit), placed uniformly; else the centre crop at the nearest allowed
 * ratio.  Draws from Philox keyed by (seed, gp_rng_stream(epoch,
 * GP_IMAGE_CROP_TAG, pos)), counter = try; the flip (if hflip) from
 * counter 16.  The box has integer corners. */
#define GP_IMAGE_CROP_TAG 0x72726363u /* "rrcc" */
void gp_image_rrc_draw(uint64_t seed, int64_t epoch, int64_t pos, int w, int h,
                       const float scale[2], const float ratio[2], bool hflip, gp_box *box,
                       bool *flip);
/* torchvision's Resize(resize) then CenterCrop((out_h, out_w)) as a box in
 * source pixels: the shorter side scaled to `resize` (the longer truncated,
 * as torchvision does), the crop's offsets rounded. */
void gp_image_eval_box(int w, int h, int resize, int out_h, int out_w, gp_box *box);
/* The JPEG DCT scale for a crop: the largest denom in {1, 2, 4, 8} that
 * leaves the box at least out_w x out_h pixels (so decoding never loses
 * resolution the output needs). */
int gp_image_pick_denom(const gp_box *box, int out_h, int out_w);

/* A growable float scratch buffer (p owned, cap floats). */
typedef struct gp_fbuf {
    float *p;
    size_t cap;
} gp_fbuf;

/* Resample box of src (sw x sh, c channels) to dst (dh x dw x c) with
 * Pillow's bilinear filter, the filter's taps clamped to
 * [cx0, cx1) x [cy0, cy1); tmp grows as needed (GP_ERR_OOM if it cannot).
 * nearest: each output pixel takes the source pixel under its centre
 * (masks: class ids must not be blended). */
gp_status gp_image_resample(const uint8_t *src, int sw, int sh, int c, const gp_box *box,
                            int cx0, int cy0, int cx1, int cy1, uint8_t *dst, int dw, int dh,
                            gp_fbuf *tmp);
void gp_image_resample_nearest(const uint8_t *src, int sw, int sh, int c, const gp_box *box,
                               uint8_t *dst, int dw, int dh);

#endif /* GP_DATA_H */
