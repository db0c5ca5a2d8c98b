/*
 * image.c — decoding (TurboJPEG, libpng) and the crop / resize transforms
 * of the image_folder dataset.  See image.h.
 */
#include "data/data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef GPIPE_HAVE_IMAGES
#include <png.h>
#include <setjmp.h>
#include <turbojpeg.h>
/* after stdio.h (core.h): jpeglib.h needs FILE and size_t */
#include <jpeglib.h>
#include <jerror.h>
#endif

void gp_image_free(gp_image *im)
{
    free(im->px);
    *im = (gp_image){0};
}

static gp_status image_reserve(gp_image *im, int w, int h, int c, const char *path)
{
    if ((int64_t)w * h > GP_IMAGE_MAX_PIXELS || w < 1 || h < 1)
        return gp_error_set(GP_ERR_DATA, "%s: %d x %d pixels is outside gpipe's limit of 1 to "
                            "%lld pixels per image", path, w, h,
                            (long long)GP_IMAGE_MAX_PIXELS);
    size_t need = (size_t)w * (size_t)h * (size_t)c;
    if (need > im->cap) {
        uint8_t *p = realloc(im->px, need);
        if (!p)
            return gp_error_set(GP_ERR_OOM, "%s: out of host memory decoding a %d x %d image",
                                path, w, h);
        im->px = p;
        im->cap = need;
    }
    im->w = w;
    im->h = h;
    im->c = c;
    return GP_OK;
}

static bool is_png(const uint8_t *b, size_t len)
{
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    return len >= 8 && memcmp(b, sig, 8) == 0;
}


/* Pillow's CMYK -> RGB (Convert.c cmyk2rgb): each channel (255 - K) less
 * ink x (255 - K) / 255, rounded as its MULDIV255. */
static uint8_t cmyk_channel(int ink, int k)
{
    int nk = 255 - k, t = ink * nk + 128;
    t = ((t >> 8) + t) >> 8;
    int v = nk - t;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Colour to `channels`: 3 keeps it, 1 keeps the largest channel. */
static void rgb_to_mask(gp_image *im)
{
    size_t n = (size_t)im->w * (size_t)im->h;
    for (size_t i = 0; i < n; i++) {
        uint8_t r = im->px[3 * i], g = im->px[3 * i + 1], b = im->px[3 * i + 2];
        uint8_t m = r > g ? r : g;
        im->px[i] = m > b ? m : b;
    }
    im->c = 1;
}

#ifdef GPIPE_HAVE_IMAGES

struct gp_image_codec {
    tjhandle dec;
    gp_image cmyk; /* 4-channel staging for CMYK / YCCK JPEGs */
};

bool gp_image_supported(void) { return true; }

gp_status gp_image_codec_create(gp_image_codec **out)
{
    gp_image_codec *cd = calloc(1, sizeof *cd);
    if (!cd) return gp_error_set(GP_ERR_OOM, "out of host memory for an image decoder");
    cd->dec = tjInitDecompress();
    if (!cd->dec) {
        free(cd);
        return gp_error_set(GP_ERR_RUNTIME, "TurboJPEG: cannot create a decompressor: %s",
                            tjGetErrorStr2(NULL));
    }
    *out = cd;
    return GP_OK;
}

void gp_image_codec_destroy(gp_image_codec *cd)
{
    if (!cd) return;
    tjDestroy(cd->dec);
    gp_image_free(&cd->cmyk);
    free(cd);
}

/* A JPEG's size as its header declares it, refused past
 * GP_IMAGE_MAX_PIXELS before libjpeg allocates for it: a progressive (or
 * multi-scan) file makes libjpeg hold the whole image's DCT coefficients,
 * whatever scale it is decoded at, so checking the scaled output only lets
 * a 30000 x 30000 file of 3.5 MB take 2 GB in one decode thread. */
static gp_status jpeg_size_ok(int64_t w, int64_t h, const char *path)
{
    if (w >= 1 && h >= 1 && w <= 65535 && h <= 65535 && w * h <= GP_IMAGE_MAX_PIXELS)
        return GP_OK;
    return gp_error_set(GP_ERR_DATA, "%s: JPEG header gives %lld x %lld pixels, outside gpipe's "
                        "limit of 1 to %lld pixels per image (decoding it would hold the whole "
                        "image in memory); shrink or remove the file", path, (long long)w,
                        (long long)h, (long long)GP_IMAGE_MAX_PIXELS);
}

/* A TurboJPEG handle is not reliable after a failed call (libjpeg-turbo
 * 2.1 can then report a later file's header wrongly): a new one replaces
 * it after every failure. */
static gp_status tj_failed(gp_image_codec *cd, gp_status s)
{
    tjDestroy(cd->dec);
    cd->dec = tjInitDecompress();
    if (!cd->dec)
        return gp_error_set(GP_ERR_RUNTIME, "TurboJPEG: cannot create a decompressor: %s",
                            tjGetErrorStr2(NULL));
    return s;
}

/* Whether the JPEG carries Adobe's APP14 marker, whose CMYK convention is
 * inverted ink (Photoshop's, and Pillow's reading of it). */
static bool jpeg_has_adobe(const uint8_t *b, size_t len)
{
    size_t p = 2;
    while (p + 4 <= len && b[p] == 0xff) {
        uint8_t m = b[p + 1];
        if (m == 0xda || m == 0xd9) break; /* start of scan, end of image */
        size_t seg = (size_t)b[p + 2] << 8 | b[p + 3];
        if (m == 0xee && seg >= 7 && p + 4 + 5 <= len && memcmp(b + p + 4, "Adobe", 5) == 0)
            return true;
        p += 2 + seg;
    }
    return false;
}

/* ---- PNG through libpng, errors through setjmp ----------------------- */

typedef struct png_src {
    const uint8_t *buf;
    size_t len, pos;
    char why[256];
} png_src;

/* libpng's allocations, each refused past 64 MiB + 4x the file: libpng
 * allocates what a chunk's header declares before reading it, and a
 * 97-byte file declared 1.9 GB (fuzz_image, 2026-11-29).  The largest
 * it needs is a row or a chunk (the pixels are gpipe's own buffer),
 * neither more than the file or its inflated ancillary data; refused,
 * libpng stops with "out of memory", a bad file's error. */
static png_voidp png_malloc_capped(png_structp p, png_alloc_size_t size)
{
    const png_src *s = png_get_mem_ptr(p);
    size_t cap = ((size_t)64 << 20) + 4 * (s ? s->len : 0);
    return size > cap ? NULL : malloc(size);
}

static void png_free_fn(png_structp p, png_voidp ptr)
{
    (void)p;
    free(ptr);
}

static void png_read_mem(png_structp p, png_bytep out, size_t n)
{
    png_src *s = png_get_io_ptr(p);
    if (s->len - s->pos < n) png_error(p, "file ends early (truncated)");
    memcpy(out, s->buf + s->pos, n);
    s->pos += n;
}

static void png_on_error(png_structp p, png_const_charp msg)
{
    png_src *s = png_get_error_ptr(p);
    size_t n = strlen(msg);
    if (n >= sizeof s->why) n = sizeof s->why - 1;
    memcpy(s->why, msg, n);
    s->why[n] = '\0';
    png_longjmp(p, 1);
}

static void png_on_warning(png_structp p, png_const_charp msg) { (void)p, (void)msg; }

static gp_status decode_png(const uint8_t *buf, size_t len, const char *path, int channels,
                            gp_image *out)
{
    png_src src = {.buf = buf, .len = len};
    png_structp p = png_create_read_struct_2(PNG_LIBPNG_VER_STRING, &src, png_on_error,
                                             png_on_warning, &src, png_malloc_capped, png_free_fn);
    png_infop info = p ? png_create_info_struct(p) : NULL;
    if (!info) {
        png_destroy_read_struct(&p, NULL, NULL);
        return gp_error_set(GP_ERR_OOM, "%s: out of host memory for a PNG decoder", path);
    }
    /* volatile: read after a longjmp */
    png_bytep *volatile rows = NULL;
    if (setjmp(png_jmpbuf(p))) {
        free(rows);
        png_destroy_read_struct(&p, &info, NULL);
        return gp_error_set(GP_ERR_DATA, "%s: not a readable PNG: %s", path, src.why);
    }
    png_set_read_fn(p, &src, png_read_mem);
    png_read_info(p, info);
    int w = (int)png_get_image_width(p, info), h = (int)png_get_image_height(p, info);
    int ct = png_get_color_type(p, info), depth = png_get_bit_depth(p, info);
    /* To 8 bits per sample as Pillow reads: 16-bit keeps the high byte,
     * 1/2/4-bit gray is scaled up, a palette expands to its colours
     * (masks keep the index), alpha and transparency are dropped.  A
     * 16-bit gray mask keeps its values instead (clipped at 255, as
     * Pillow's I;16 to L): its high byte would make 0/1 masks all 0. */
    bool mask16 = depth == 16 && channels == 1 &&
                  (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA);
    if (depth == 16 && !mask16) png_set_strip_16(p);
    if (mask16) png_set_swap(p); /* (the samples little-endian, read as uint16) */
    bool palette_index = channels == 1 && ct == PNG_COLOR_TYPE_PALETTE;
    if (ct == PNG_COLOR_TYPE_PALETTE && !palette_index) png_set_palette_to_rgb(p);
    if (depth < 8 && !palette_index) png_set_expand_gray_1_2_4_to_8(p);
    if (depth < 8 && palette_index) png_set_packing(p);
    /* alpha, and a palette's transparency (tRNS), which the expansion to
     * RGB turns into alpha (pngquant and optipng write such files) */
    bool trns = png_get_valid(p, info, PNG_INFO_tRNS) != 0;
    if ((ct & PNG_COLOR_MASK_ALPHA) || (trns && ct == PNG_COLOR_TYPE_PALETTE && !palette_index))
        png_set_strip_alpha(p);
    bool gray = ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA;
    if (gray && channels == 3) png_set_gray_to_rgb(p);
    png_set_interlace_handling(p);
    png_read_update_info(p, info);
    int got = (int)png_get_channels(p, info);
    /* (a 16-bit mask: twice the bytes, as many samples) */
    gp_status rs = image_reserve(out, mask16 ? 2 * w : w, h, got, path);
    if (rs != GP_OK) {
        png_destroy_read_struct(&p, &info, NULL);
        return rs;
    }
    rows = malloc(sizeof(png_bytep) * (size_t)h);
    if (!rows) {
        png_destroy_read_struct(&p, &info, NULL);
        return gp_error_set(GP_ERR_OOM, "%s: out of host memory", path);
    }
    size_t row_bytes = (size_t)w * (size_t)got * (mask16 ? 2 : 1);
    for (int y = 0; y < h; y++) rows[y] = out->px + (size_t)y * row_bytes;
    png_read_image(p, rows);
    png_read_end(p, NULL);
    free(rows);
    png_destroy_read_struct(&p, &info, NULL);
    if (mask16) { /* in place, forwards: sample i's 2 bytes are at 2i >= i */
        size_t n = (size_t)w * (size_t)h * (size_t)got;
        for (size_t i = 0; i < n; i++) {
            unsigned v = (unsigned)out->px[2 * i] | (unsigned)out->px[2 * i + 1] << 8;
            out->px[i] = (uint8_t)(v > 255 ? 255 : v);
        }
        out->w = w;
    }
    if (got == 3 && channels == 1) rgb_to_mask(out);
    if (out->c != channels)
        return gp_error_set(GP_ERR_DATA, "%s: PNG with %d channels after conversion, expected %d",
                            path, out->c, channels);
    return GP_OK;
}

gp_status gp_image_probe(gp_image_codec *cd, const uint8_t *buf, size_t len, const char *path,
                         int *w, int *h)
{
    if (is_png(buf, len)) {
        if (len < 24 || memcmp(buf + 12, "IHDR", 4) != 0)
            return gp_error_set(GP_ERR_DATA, "%s: PNG without its IHDR header (truncated?)",
                                path);
        uint32_t pw = (uint32_t)buf[16] << 24 | (uint32_t)buf[17] << 16 |
                      (uint32_t)buf[18] << 8 | buf[19];
        uint32_t ph = (uint32_t)buf[20] << 24 | (uint32_t)buf[21] << 16 |
                      (uint32_t)buf[22] << 8 | buf[23];
        if (pw == 0 || ph == 0 || pw > 65535 || ph > 65535)
            return gp_error_set(GP_ERR_DATA, "%s: PNG of %u x %u pixels; gpipe reads 1 to 65535 "
                                "per side", path, pw, ph);
        *w = (int)pw;
        *h = (int)ph;
        return GP_OK;
    }
    if (!gp_image_is_jpeg(buf, len))
        return gp_error_set(GP_ERR_DATA, "%s: neither a JPEG nor a PNG (the first bytes are "
                            "not either signature)", path);
    int sub, cs;
    *w = *h = 0;
    if (tjDecompressHeader3(cd->dec, buf, (unsigned long)len, w, h, &sub, &cs) != 0)
        return tj_failed(cd, gp_error_set(GP_ERR_DATA, "%s: unreadable JPEG header: %s", path,
                                          tjGetErrorStr2(cd->dec)));
    gp_status s = jpeg_size_ok(*w, *h, path);
    return s == GP_OK ? s : tj_failed(cd, s);
}

/* A libjpeg warning that says the data ran out (JWRN_JPEG_EOF's "Premature
 * end of JPEG file", JWRN_HIT_MARKER's "premature end of data segment"). */
static bool jpeg_truncated(const char *msg)
{
    return strstr(msg, "remature end") != NULL;
}

gp_status gp_image_decode(gp_image_codec *cd, const uint8_t *buf, size_t len, const char *path,
                          int channels, int denom, gp_image *out)
{
    GP_ASSERT(channels == 1 || channels == 3);
    if (is_png(buf, len)) return decode_png(buf, len, path, channels, out);
    if (!gp_image_is_jpeg(buf, len))
        return gp_error_set(GP_ERR_DATA, "%s: neither a JPEG nor a PNG (the first bytes are "
                            "not either signature)", path);
    int w = 0, h = 0, sub, cs;
    if (tjDecompressHeader3(cd->dec, buf, (unsigned long)len, &w, &h, &sub, &cs) != 0)
        return tj_failed(cd, gp_error_set(GP_ERR_DATA, "%s: unreadable JPEG header: %s", path,
                                          tjGetErrorStr2(cd->dec)));
    GP_TRY(jpeg_size_ok(w, h, path));
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) denom = 1;
    int sw = gp_image_scaled(w, denom), sh = gp_image_scaled(h, denom);
    /* A truncated file is an error, as it is to Pillow: libjpeg pads it
     * gray with a warning ("Premature end of JPEG file", and "premature end
     * of data segment" after it).  Its other warnings are decoded through,
     * as Pillow and the region decode do (stopped on, a JPEG with stray
     * bytes before its end marker failed whole and trained as a crop). */
    int flags = 0;
    bool cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    gp_image *dst = cmyk ? &cd->cmyk : out;
    /* a colour JPEG read as a mask goes through RGB, so that it keeps its
     * largest channel as a colour PNG does */
    bool gray = channels == 1 && cs == TJCS_GRAY;
    int pf = cmyk ? TJPF_CMYK : gray ? TJPF_GRAY : TJPF_RGB;
    int pc = cmyk ? 4 : gray ? 1 : 3;
    GP_TRY(image_reserve(dst, sw, sh, pc, path));
    if (tjDecompress2(cd->dec, buf, (unsigned long)len, dst->px, sw, sw * pc, sh, pf, flags) != 0 &&
        (tjGetErrorCode(cd->dec) != TJERR_WARNING || jpeg_truncated(tjGetErrorStr2(cd->dec))))
        return tj_failed(cd, gp_error_set(GP_ERR_DATA, "%s: JPEG decode failed: %s", path,
                                          tjGetErrorStr2(cd->dec)));
    if (!cmyk) {
        if (channels == 1 && !gray) rgb_to_mask(out);
        return GP_OK;
    }
    /* Adobe's APP14 marker means inverted ink, as Photoshop (and Pillow,
     * writing) store it. */
    bool inverted = jpeg_has_adobe(buf, len);
    GP_TRY(image_reserve(out, sw, sh, 3, path));
    size_t n = (size_t)sw * (size_t)sh;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *q = cd->cmyk.px + 4 * i;
        int k = inverted ? 255 - q[3] : q[3];
        for (int c = 0; c < 3; c++)
            out->px[3 * i + (size_t)c] = cmyk_channel(inverted ? 255 - q[c] : q[c], k);
    }
    /* the CMYK scratch is kept for the next image, unless one huge image
     * grew it past 64 MiB, which a loader thread would then hold for good */
    if (cd->cmyk.cap > ((size_t)64 << 20)) gp_image_free(&cd->cmyk);
    if (channels == 1) rgb_to_mask(out);
    return GP_OK;
}


/* ---- a region of a JPEG, through libjpeg-turbo's libjpeg API ----------- */

/* TurboJPEG 2.1 decodes whole images only (its cropping region arrived in
 * 3.0); libjpeg-turbo's libjpeg API has jpeg_crop_scanline (inverse DCT,
 * upsampling and colour conversion only for the columns asked for) and
 * jpeg_skip_scanlines (no inverse DCT above the region), and stopping
 * after the region's last row skips everything below it. */
typedef struct jpeg_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_on_error(j_common_ptr c)
{
    jpeg_err *e = (jpeg_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* A truncated file's warnings stop the decode, as they fail a whole
 * image's; the others are decoded through (gp_image_decode). */
static void jpeg_on_message(j_common_ptr c, int level)
{
    if (level < 0 && (c->err->msg_code == JWRN_JPEG_EOF || c->err->msg_code == JWRN_HIT_MARKER))
        jpeg_on_error(c);
}

gp_status gp_image_decode_region(gp_image_codec *cd, const uint8_t *buf, size_t len,
                                 const char *path, int denom, int rx, int ry, int rw, int rh,
                                 gp_image *out, int *ox, int *oy, int *fw, int *fh)
{
    *ox = *oy = 0;
    if (!gp_image_is_jpeg(buf, len)) {
        GP_TRY(gp_image_decode(cd, buf, len, path, 3, denom, out));
        *fw = out->w;
        *fh = out->h;
        return GP_OK;
    }
    /* fixed before setjmp: nothing it reads after a longjmp changes */
    const int dn = denom == 2 || denom == 4 || denom == 8 ? denom : 1;
    struct jpeg_decompress_struct ci;
    jpeg_err err;
    ci.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_on_error;
    err.pub.emit_message = jpeg_on_message;
    jpeg_create_decompress(&ci);
    JSAMPROW rows[16];
    if (setjmp(err.jb)) {
        jpeg_destroy_decompress(&ci);
        return gp_error_set(GP_ERR_DATA, "%s: JPEG decode failed: %s", path, err.msg);
    }
    jpeg_mem_src(&ci, buf, (unsigned long)len);
    jpeg_read_header(&ci, TRUE);
    gp_status ss = jpeg_size_ok(ci.image_width, ci.image_height, path);
    if (ss != GP_OK) {
        jpeg_destroy_decompress(&ci);
        return ss;
    }
    if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
        /* rare: the whole image through the CMYK conversion */
        jpeg_destroy_decompress(&ci);
        GP_TRY(gp_image_decode(cd, buf, len, path, 3, denom, out));
        *fw = out->w;
        *fh = out->h;
        return GP_OK;
    }
    ci.out_color_space = JCS_RGB;
    ci.scale_num = 1;
    ci.scale_denom = (unsigned)dn;
    ci.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&ci);
    int sw = (int)ci.output_width, sh = (int)ci.output_height;
    /* the region in the scaled image's pixels, rounded outwards */
    int x0 = rx / dn, y0 = ry / dn;
    int x1 = (rx + rw + dn - 1) / dn, y1 = (ry + rh + dn - 1) / dn;
    x0 = x0 < 0 ? 0 : x0;
    y0 = y0 < 0 ? 0 : y0;
    x1 = x1 > sw ? sw : x1;
    y1 = y1 > sh ? sh : y1;
    if (x1 <= x0 || y1 <= y0) {
        jpeg_destroy_decompress(&ci);
        return gp_error_set(GP_ERR_INVALID, "%s: empty region %d,%d %dx%d of a %dx%d image",
                            path, rx, ry, rw, rh, sw * dn, sh * dn);
    }
    /* One scaled column more on each side: a subsampled JPEG's colour is
     * upsampled from the neighbouring samples, which a cropped decode lacks
     * at its edges (it repeats the edge sample there), so its first and
     * last columns differ from the whole image's; with a column beyond
     * the region on each side, those lie outside it.  (Rows are decoded
     * with their neighbours.) */
    int cx0 = x0 > 0 ? x0 - 1 : 0, cx1 = x1 < sw ? x1 + 1 : sw;
    JDIMENSION xoff = (JDIMENSION)cx0, cw = (JDIMENSION)(cx1 - cx0);
    /* widens the columns to whole iMCUs (xoff down, cw up) */
    if (cx0 > 0 || cx1 < sw) jpeg_crop_scanline(&ci, &xoff, &cw);
    if (y0 > 0) jpeg_skip_scanlines(&ci, (JDIMENSION)y0);
    int h = y1 - y0;
    gp_status rs = image_reserve(out, (int)cw, h, 3, path);
    if (rs != GP_OK) {
        jpeg_destroy_decompress(&ci);
        return rs;
    }
    size_t stride = (size_t)cw * 3;
    while ((int)ci.output_scanline < y1) {
        int k = y1 - (int)ci.output_scanline;
        k = k > 16 ? 16 : k;
        for (int i = 0; i < k; i++)
            rows[i] = out->px + (size_t)((int)ci.output_scanline - y0 + i) * stride;
        if (jpeg_read_scanlines(&ci, rows, (JDIMENSION)k) == 0) break;
    }
    /* the rows below are never decoded */
    jpeg_abort_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    *ox = (int)xoff;
    *oy = y0;
    *fw = sw;
    *fh = sh;
    return GP_OK;
}
#else /* !GPIPE_HAVE_IMAGES */

struct gp_image_codec {
    int unused;
};

bool gp_image_supported(void) { return false; }

static gp_status unsupported(void)
{
    return gp_error_set(GP_ERR_INVALID, "this gpipe was built without image decoding: install "
                        "libturbojpeg0-dev, libjpeg62-turbo-dev and libpng-dev "
                        "(scripts/install-deps.sh), then "
                        "configure again (cmake -DGPIPE_IMAGES=ON) and rebuild");
}

gp_status gp_image_codec_create(gp_image_codec **out)
{
    *out = NULL;
    return unsupported();
}

void gp_image_codec_destroy(gp_image_codec *cd) { free(cd); }

gp_status gp_image_decode_region(gp_image_codec *cd, const uint8_t *buf, size_t len,
                                 const char *path, int denom, int rx, int ry, int rw, int rh,
                                 gp_image *out, int *ox, int *oy, int *fw, int *fh)
{
    (void)cd, (void)buf, (void)len, (void)path, (void)denom, (void)rx, (void)ry, (void)rw;
    (void)rh, (void)out, (void)ox, (void)oy, (void)fw, (void)fh;
    return unsupported();
}

gp_status gp_image_probe(gp_image_codec *cd, const uint8_t *buf, size_t len, const char *path,
                         int *w, int *h)
{
    (void)cd, (void)buf, (void)len, (void)path, (void)w, (void)h;
    return unsupported();
}

gp_status gp_image_decode(gp_image_codec *cd, const uint8_t *buf, size_t len, const char *path,
                          int channels, int denom, gp_image *out)
{
    (void)cd, (void)buf, (void)len, (void)path, (void)channels, (void)denom, (void)out;
    (void)is_png, (void)cmyk_channel, (void)rgb_to_mask, (void)image_reserve;
    return unsupported();
}

#endif /* GPIPE_HAVE_IMAGES */

/* ---- transforms -------------------------------------------------------- */

/* Uniform double in [0, 1) from a 32-bit draw. */
static double unit(uint32_t v) { return (double)v * (1.0 / 4294967296.0); }

void gp_image_rrc_draw(uint64_t seed, int64_t epoch, int64_t pos, int w, int h,
                       const float scale[2], const float ratio[2], bool hflip, gp_box *box,
                       bool *flip)
{
    uint64_t stream = gp_rng_stream((uint64_t)epoch, GP_IMAGE_CROP_TAG, (uint64_t)pos);
    double area = (double)w * (double)h;
    double lr0 = log((double)ratio[0]), lr1 = log((double)ratio[1]);
    *flip = hflip && (gp_philox4x32(seed, stream, 16).v[0] >> 31) != 0;
    for (int t = 0; t < 10; t++) {
        gp_philox_out o = gp_philox4x32(seed, stream, (uint64_t)t);
        double target = area * (scale[0] + unit(o.v[0]) * (scale[1] - scale[0]));
        double aspect = exp(lr0 + unit(o.v[1]) * (lr1 - lr0));
        /* Python's round(): halves to even, as nearbyint does */
        int cw = (int)nearbyint(sqrt(target * aspect));
        int ch = (int)nearbyint(sqrt(target / aspect));
        if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
            /* randint(0, h - ch) inclusive */
            int i = (int)(o.v[2] % (uint32_t)(h - ch + 1));
            int j = (int)(o.v[3] % (uint32_t)(w - cw + 1));
            *box = (gp_box){.x = j, .y = i, .w = cw, .h = ch};
            return;
        }
    }
    /* fallback: the whole image, cut to the nearest allowed ratio */
    double in_ratio = (double)w / (double)h;
    int cw = w, ch = h;
    if (in_ratio < ratio[0]) {
        ch = (int)nearbyint((double)cw / ratio[0]);
    } else if (in_ratio > ratio[1]) {
        cw = (int)nearbyint((double)ch * ratio[1]);
    }
    if (cw < 1) cw = 1;
    if (ch < 1) ch = 1;
    *box = (gp_box){.x = (w - cw) / 2, .y = (h - ch) / 2, .w = cw, .h = ch};
}

void gp_image_eval_box(int w, int h, int resize, int out_h, int out_w, gp_box *box)
{
    /* torchvision Resize(int): the shorter side to `resize`, the longer
     * int(resize * long / short) */
    int rw, rh;
    if (w <= h) {
        rw = resize;
        rh = (int)((int64_t)resize * h / w);
    } else {
        rh = resize;
        rw = (int)((int64_t)resize * w / h);
    }
    /* CenterCrop: int(round((size - crop) / 2)) */
    double top = nearbyint((rh - out_h) / 2.0), left = nearbyint((rw - out_w) / 2.0);
    double sx = (double)w / rw, sy = (double)h / rh;
    *box = (gp_box){.x = left * sx, .y = top * sy, .w = out_w * sx, .h = out_h * sy};
}

int gp_image_pick_denom(const gp_box *box, int out_h, int out_w)
{
    int d = 8;
    while (d > 1 && (box->w / d < out_w || box->h / d < out_h)) d /= 2;
    return d;
}

#define MAX_TAPS 256

/* Pillow's precompute_coeffs for one axis with the bilinear filter: output
 * pixel i reads taps [lo[i], lo[i] + cnt[i]) with weights k[i * ks ..]. */
static bool axis_taps(double in0, double in1, int clamp0, int clamp1, int size, int out,
                      int *lo, int *cnt, float *k, int ks)
{
    double scale = (in1 - in0) / out, fs = scale < 1.0 ? 1.0 : scale;
    double support = fs, ss = 1.0 / fs;
    /* Every window padded to exactly ks taps (zero weights outside [a, b),
     * the window moved left where it would leave the image), so the
     * horizontal pass can run a loop of constant length. */
    bool fixed = size >= ks;
    for (int i = 0; i < out; i++) {
        double center = in0 + (i + 0.5) * scale;
        int a = (int)floor(center - support + 0.5), b = (int)floor(center + support + 0.5);
        if (a < clamp0) a = clamp0;
        if (b > clamp1) b = clamp1;
        if (b - a > ks) b = a + ks;
        if (b <= a) {
            /* the box lies outside the clamp: the nearest edge pixel */
            a = center < clamp0 ? clamp0 : clamp1 - 1;
            b = a + 1;
        }
        double ww = 0, wt[MAX_TAPS];
        int n = b - a;
        for (int t = 0; t < n; t++) {
            double x = (t + a - center + 0.5) * ss;
            x = x < 0 ? -x : x;
            wt[t] = x < 1.0 ? 1.0 - x : 0.0;
            ww += wt[t];
        }
        int start = a;
        if (fixed && start + ks > size) start = size - ks;
        float *kk = k + (size_t)i * (size_t)ks;
        if (fixed)
            for (int t = 0; t < ks; t++) kk[t] = 0.0f;
        for (int t = 0; t < n; t++)
            kk[a - start + t] = (float)(ww != 0 ? wt[t] / ww : 1.0 / n);
        lo[i] = start;
        cnt[i] = fixed ? ks : n;
    }
    return fixed;
}

/* One output row of the horizontal pass for 3 channels with windows of a
 * constant KS taps (unrolled by the compiler), from the source row already
 * in floats (each byte converted once, not once per tap). */
#define HPASS_FIXED(KS)                                                                      \
    static void hpass3_##KS(const float *s, const int *lox, const float *kx, int dw,         \
                            float *o)                                                        \
    {                                                                                        \
        for (int x = 0; x < dw; x++) {                                                       \
            const float *k = kx + (size_t)x * KS;                                            \
            const float *p = s + (size_t)lox[x] * 3;                                         \
            float a = 0, b = 0, d = 0;                                                       \
            for (int t = 0; t < KS; t++) {                                                   \
                a += k[t] * p[3 * t];                                                        \
                b += k[t] * p[3 * t + 1];                                                    \
                d += k[t] * p[3 * t + 2];                                                    \
            }                                                                                \
            o[3 * x] = a;                                                                    \
            o[3 * x + 1] = b;                                                                \
            o[3 * x + 2] = d;                                                                \
        }                                                                                    \
    }
HPASS_FIXED(3)
HPASS_FIXED(5)
HPASS_FIXED(7)
HPASS_FIXED(9)

/* Taps per output pixel for a reduction of `scale`: ceil(support) * 2 + 1,
 * capped at MAX_TAPS (a reduction of 127x; a wider one loses its outer
 * taps, which carry weights near 0 anyway). */
static int taps_for(double in, int out)
{
    double scale = in / out, fs = scale < 1.0 ? 1.0 : scale;
    int ks = (int)ceil(fs) * 2 + 1;
    return ks > MAX_TAPS ? MAX_TAPS : ks;
}

gp_status gp_image_resample(const uint8_t *src, int sw, int sh, int c, const gp_box *box,
                            int cx0, int cy0, int cx1, int cy1, uint8_t *dst, int dw, int dh,
                            gp_fbuf *tmp)
{
    if (cx0 < 0) cx0 = 0;
    if (cy0 < 0) cy0 = 0;
    if (cx1 > sw) cx1 = sw;
    if (cy1 > sh) cy1 = sh;
    int ksx = taps_for(box->w, dw), ksy = taps_for(box->h, dh);
    size_t rl = (size_t)dw * (size_t)c;
    /* weights, then 4 int arrays (stored in float slots), the rows of the
     * horizontal pass, one accumulator row */
    size_t need = (size_t)dw * (size_t)ksx + (size_t)dh * (size_t)ksy + 2 * (size_t)(dw + dh) +
                  (size_t)sh * rl + rl + (size_t)sw * (size_t)c;
    if (need > tmp->cap) {
        float *p = realloc(tmp->p, need * sizeof *p);
        if (!p) return gp_error_set(GP_ERR_OOM, "out of host memory resampling an image");
        tmp->p = p;
        tmp->cap = need;
    }
    float *kx = tmp->p, *ky = kx + (size_t)dw * (size_t)ksx;
    int *lox = (int *)(void *)(ky + (size_t)dh * (size_t)ksy), *cntx = lox + dw;
    int *loy = cntx + dw, *cnty = loy + dh;
    float *rows = (float *)(void *)(cnty + dh), *acc = rows + (size_t)sh * rl;
    float *srow = acc + rl; /* one source row as floats */
    bool fixed = axis_taps(box->x, box->x + box->w, cx0, cx1, sw, dw, lox, cntx, kx, ksx);
    axis_taps(box->y, box->y + box->h, cy0, cy1, sh, dh, loy, cnty, ky, ksy);
    /* the source rows the vertical pass reads */
    int r0 = loy[0], r1 = loy[0] + cnty[0];
    for (int i = 1; i < dh; i++) {
        if (loy[i] < r0) r0 = loy[i];
        if (loy[i] + cnty[i] > r1) r1 = loy[i] + cnty[i];
    }
    /* horizontal pass: rows r0..r1 of the source to dw columns, in float */
    for (int y = r0; y < r1; y++) {
        const uint8_t *s = src + (size_t)y * (size_t)sw * (size_t)c;
        float *o = rows + (size_t)(y - r0) * rl;
        if (fixed && c == 3 && (ksx == 3 || ksx == 5 || ksx == 7 || ksx == 9)) {
            /* the columns the windows read: lox[0] .. lox[dw - 1] + ksx */
            int a = lox[0], b = lox[dw - 1] + ksx;
            for (int i = 3 * a; i < 3 * b; i++) srow[i] = (float)s[i];
            if (ksx == 3) hpass3_3(srow, lox, kx, dw, o);
            else if (ksx == 5) hpass3_5(srow, lox, kx, dw, o);
            else if (ksx == 7) hpass3_7(srow, lox, kx, dw, o);
            else hpass3_9(srow, lox, kx, dw, o);
            continue;
        }
        for (int x = 0; x < dw; x++) {
            const float *k = kx + (size_t)x * (size_t)ksx;
            const uint8_t *p = s + (size_t)lox[x] * (size_t)c;
            if (c == 3) {
                float a = 0, b = 0, d = 0;
                for (int t = 0; t < cntx[x]; t++) {
                    a += k[t] * p[3 * t];
                    b += k[t] * p[3 * t + 1];
                    d += k[t] * p[3 * t + 2];
                }
                o[3 * x] = a;
                o[3 * x + 1] = b;
                o[3 * x + 2] = d;
            } else {
                for (int ch = 0; ch < c; ch++) {
                    float a = 0;
                    for (int t = 0; t < cntx[x]; t++) a += k[t] * p[t * c + ch];
                    o[x * c + ch] = a;
                }
            }
        }
    }
    /* vertical pass, row by row (vectorises over the row), rounded to 8
     * bits */
    for (int y = 0; y < dh; y++) {
        const float *k = ky + (size_t)y * (size_t)ksy;
        const float *base = rows + (size_t)(loy[y] - r0) * rl;
        for (size_t e = 0; e < rl; e++) acc[e] = 0.5f;
        for (int t = 0; t < cnty[y]; t++) {
            const float *r = base + (size_t)t * rl;
            float kt = k[t];
            for (size_t e = 0; e < rl; e++) acc[e] += kt * r[e];
        }
        uint8_t *o = dst + (size_t)y * rl;
        for (size_t e = 0; e < rl; e++) {
            float a = acc[e];
            o[e] = (uint8_t)(a < 0 ? 0 : a >= 255 ? 255 : (int)a);
        }
    }
    return GP_OK;
}

void gp_image_resample_nearest(const uint8_t *src, int sw, int sh, int c, const gp_box *box,
                               uint8_t *dst, int dw, int dh)
{
    for (int y = 0; y < dh; y++) {
        int sy = (int)floor(box->y + (y + 0.5) * box->h / dh);
        sy = sy < 0 ? 0 : sy >= sh ? sh - 1 : sy;
        for (int x = 0; x < dw; x++) {
            int sx = (int)floor(box->x + (x + 0.5) * box->w / dw);
            sx = sx < 0 ? 0 : sx >= sw ? sw - 1 : sx;
            memcpy(dst + ((size_t)y * (size_t)dw + (size_t)x) * (size_t)c,
                   src + ((size_t)sy * (size_t)sw + (size_t)sx) * (size_t)c, (size_t)c);
        }
    }
}
