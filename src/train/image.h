/*
 * image.h — JPEG and PNG files to 8-bit pixels, and the transforms of the
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
#ifndef GP_IMAGE_H
#define GP_IMAGE_H

#include "core/core.h"

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
 * of the region rounded outwards.  A PNG, or a CMYK JPEG, is decoded whole
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

#endif /* GP_IMAGE_H */
