/*
 * test_image.c — data.dataset: image_folder.  Decoding (JPEG RGB, gray and
 * CMYK; PNG RGB, RGBA, 16-bit, gray, palette; DCT-scaled), the transforms
 * against reference implementations written here (Pillow's bilinear
 * resample as a direct double sum; torchvision's RandomResizedCrop and
 * Resize + CenterCrop geometry), the folder index and its cache, every
 * bad-input case, the loader's determinism across 1 and 4 threads and on
 * resume, masks that follow their image, and a training run resumed
 * mid-epoch bit for bit.  Pixel equality with Pillow's decode of the same
 * files is tests/test_image_ref.py.
 *
 * The folders are written here: JPEGs through TurboJPEG, PNGs through
 * libpng.  Skipped (77) when gpipe was built without image decoding.
 */
#include "test.h"
#include "test_util.h"
#include "data/data.h"
#include "train/train.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#ifdef GPIPE_HAVE_IMAGES
#include <png.h>
#include <turbojpeg.h>

static char tmpdir[256];

/* ---- writing test images ------------------------------------------------ */

/* A smooth, asymmetric test picture: every pixel different enough that a
 * wrong offset or a missing flip shows. */
static uint8_t *make_rgb(int w, int h, int seed)
{
    uint8_t *p = malloc((size_t)w * (size_t)h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *q = p + ((size_t)y * (size_t)w + (size_t)x) * 3;
            q[0] = (uint8_t)((x * 255) / (w > 1 ? w - 1 : 1));
            q[1] = (uint8_t)((y * 255) / (h > 1 ? h - 1 : 1));
            q[2] = (uint8_t)((x * 7 + y * 3 + seed * 40) & 255);
        }
    return p;
}

static void write_jpeg(const char *path, const uint8_t *px, int w, int h, int pf, int quality,
                       int subsamp)
{
    tjhandle t = tjInitCompress();
    unsigned char *out = NULL;
    unsigned long len = 0;
    int rc = tjCompress2(t, px, w, 0, h, pf, &out, &len, subsamp, quality, 0);
    CHECK_MSG(rc == 0, "tjCompress2 %s: %s", path, tjGetErrorStr2(t));
    if (rc == 0) gpt_write_file(path, out, len);
    tjFree(out);
    tjDestroy(t);
}

/* A PNG of color type ct and bit depth, rows given as raw bytes. */
static void write_png_trns(const char *path, const uint8_t *rows, int w, int h, int ct,
                           int depth, const png_color *palette, int n_palette,
                           const png_byte *trns, int n_trns);

static void write_png(const char *path, const uint8_t *rows, int w, int h, int ct, int depth,
                      const png_color *palette, int n_palette)
{
    write_png_trns(path, rows, w, h, ct, depth, palette, n_palette, NULL, 0);
}

/* With a palette's transparency (tRNS: one alpha per palette entry), as
 * pngquant and optipng write. */
static void write_png_trns(const char *path, const uint8_t *rows, int w, int h, int ct,
                           int depth, const png_color *palette, int n_palette,
                           const png_byte *trns, int n_trns)
{
    FILE *f = fopen(path, "wb");
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(p);
    if (setjmp(png_jmpbuf(p))) {
        CHECK_MSG(0, "libpng failed writing %s", path);
        png_destroy_write_struct(&p, &info);
        fclose(f);
        return;
    }
    png_init_io(p, f);
    png_set_IHDR(p, info, (png_uint_32)w, (png_uint_32)h, depth, ct, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (palette) png_set_PLTE(p, info, palette, n_palette);
    if (trns) png_set_tRNS(p, info, trns, n_trns, NULL);
    png_write_info(p, info);
    int ch = ct == PNG_COLOR_TYPE_RGB ? 3 : ct == PNG_COLOR_TYPE_RGBA ? 4
             : ct == PNG_COLOR_TYPE_GRAY_ALPHA ? 2 : 1;
    size_t stride = (size_t)w * (size_t)ch * (size_t)(depth == 16 ? 2 : 1);
    for (int y = 0; y < h; y++) png_write_row(p, rows + (size_t)y * stride);
    png_write_end(p, NULL);
    png_destroy_write_struct(&p, &info);
    fclose(f);
}

static uint8_t *slurp(const char *path, size_t *n) { return gpt_read_file(path, n); }

static void path_of(char *out, size_t len, const char *rel)
{
    snprintf(out, len, "%s/%s", tmpdir, rel);
}

static void mkdirs(const char *rel)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/%s", tmpdir, rel);
    CHECK(system(cmd) == 0);
}

/* Decode a file written above; returns false (and a failed check) if it
 * does not decode. */
static bool decode_file(gp_image_codec *cd, const char *rel, int channels, int denom,
                        gp_image *im)
{
    char p[600];
    path_of(p, sizeof p, rel);
    size_t n = 0;
    uint8_t *b = slurp(p, &n);
    CHECK_MSG(b != NULL, "cannot read %s", p);
    if (!b) return false;
    gp_status s = gp_image_decode(cd, b, n, p, channels, denom, im);
    CHECK_MSG(s == GP_OK, "%s: %s", rel, gp_last_error());
    free(b);
    return s == GP_OK;
}

static bool message_has(const char *needle)
{
    bool ok = strstr(gp_last_error(), needle) != NULL;
    if (!ok) fprintf(stderr, "message without '%s': %s\n", needle, gp_last_error());
    return ok;
}

/* ---- decoding ----------------------------------------------------------- */

static int max_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m) m = d;
    }
    return m;
}

/* A region decode's pixels inside the region are the whole decode's at
 * the same scale, bit for bit, for every chroma subsampling: a 4:2:0 or
 * 4:2:2 file's colour is upsampled from neighbouring samples, which a
 * cropped decode lacked at its edges (its first or last column was off
 * by up to 64 levels in 1 region of 4).  Regions at the image's edges, on
 * 16-pixel boundaries and just off them, odd and even widths. */
static void test_region_exact(void)
{
    gp_image_codec *cd = NULL;
    CHECK_OK(gp_image_codec_create(&cd));
    mkdirs("region");
    int w = 203, h = 157;
    uint8_t *rgb = make_rgb(w, h, 3);
    for (int i = 0; i < w * h; i++) /* colour that changes from one pixel to the next */
        rgb[3 * i + 2] = (uint8_t)((i * 37) ^ (i / w * 11));
    const int samps[] = {TJSAMP_420, TJSAMP_422, TJSAMP_440, TJSAMP_444};
    for (size_t k = 0; k < sizeof samps / sizeof *samps; k++) {
        char p[600], rel[64];
        snprintf(rel, sizeof rel, "region/s%d.jpg", samps[k]);
        path_of(p, sizeof p, rel);
        write_jpeg(p, rgb, w, h, TJPF_RGB, 90, samps[k]);
        size_t len = 0;
        uint8_t *b = slurp(p, &len);
        if (!b) continue;
        for (int dn = 1; dn <= 2; dn++) {
            gp_image full = {0}, im = {0};
            CHECK_OK(gp_image_decode(cd, b, len, p, 3, dn, &full));
            int bad = 0, worst = 0, first_bad[4] = {0};
            uint64_t seed = 12345;
            for (int r = 0; r < 60 && full.px; r++) {
                seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                int rx = (int)((seed >> 33) % (uint64_t)(w - 8)), ry = (int)((seed >> 17) % 97);
                int rw = 5 + (int)((seed >> 45) % (uint64_t)(w - rx - 4));
                int rh = 3 + (int)((seed >> 7) % (uint64_t)(h - ry - 2));
                if (r % 4 == 1) rx &= ~15; /* on a block boundary */
                if (r % 4 == 2) rx = (rx & ~15) + 1;
                if (r % 5 == 3) rw = w - rx; /* to the right edge */
                if (rw > w - rx) rw = w - rx;
                if (rh > h - ry) rh = h - ry;
                int ox, oy, fw, fh;
                if (gp_image_decode_region(cd, b, len, p, dn, rx, ry, rw, rh, &im, &ox, &oy, &fw,
                                           &fh) != GP_OK) {
                    CHECK_MSG(false, "region decode: %s", gp_last_error());
                    continue;
                }
                CHECK(fw == full.w && fh == full.h);
                int x0 = rx / dn, y0 = ry / dn, x1 = (rx + rw + dn - 1) / dn,
                    y1 = (ry + rh + dn - 1) / dn;
                x1 = x1 > fw ? fw : x1;
                y1 = y1 > fh ? fh : y1;
                CHECK(ox <= x0 && oy <= y0 && ox + im.w >= x1 && oy + im.h >= y1);
                int d = 0;
                for (int y = y0; y < y1; y++)
                    for (int x = x0; x < x1; x++)
                        for (int c = 0; c < 3; c++) {
                            int e = abs((int)full.px[((size_t)y * (size_t)fw + (size_t)x) * 3 + c] -
                                        (int)im.px[((size_t)(y - oy) * (size_t)im.w +
                                                    (size_t)(x - ox)) * 3 + c]);
                            d = e > d ? e : d;
                        }
                if (d && !bad) {
                    first_bad[0] = rx, first_bad[1] = ry, first_bad[2] = rw, first_bad[3] = rh;
                }
                bad += d != 0;
                worst = d > worst ? d : worst;
            }
            CHECK_MSG(bad == 0, "subsampling %d at 1/%d: %d of 60 regions differ from the whole "
                      "decode, by up to %d (first %d,%d %dx%d)", samps[k], dn, bad, worst,
                      first_bad[0], first_bad[1], first_bad[2], first_bad[3]);
            gp_image_free(&full);
            gp_image_free(&im);
        }
        free(b);
    }
    free(rgb);
    gp_image_codec_destroy(cd);
}

static void test_decode(void)
{
    gp_image_codec *cd = NULL;
    CHECK_OK(gp_image_codec_create(&cd));
    gp_image im = {0};
    mkdirs("dec");
    char p[600];
    int w = 97, h = 61;
    size_t n = (size_t)w * (size_t)h;
    uint8_t *rgb = make_rgb(w, h, 1);

    /* JPEG RGB, quality 100, 4:4:4: the picture up to JPEG's rounding */
    path_of(p, sizeof p, "dec/rgb.jpg");
    write_jpeg(p, rgb, w, h, TJPF_RGB, 100, TJSAMP_444);
    if (decode_file(cd, "dec/rgb.jpg", 3, 1, &im)) {
        CHECK(im.w == w && im.h == h && im.c == 3);
        int d = max_diff(im.px, rgb, n * 3);
        CHECK_MSG(d <= 6, "JPEG q100 decode differs by %d", d);
    }
    int pw = 0, ph = 0;
    {
        size_t len = 0;
        uint8_t *b = slurp(p, &len);
        CHECK_OK(gp_image_probe(cd, b, len, p, &pw, &ph));
        CHECK(pw == w && ph == h);
        /* DCT scaling: ceil(size / denom) pixels, close to a box average
         * of the full decode */
        for (int denom = 2; denom <= 8; denom *= 2) {
            gp_image full = {0};
            CHECK_OK(gp_image_decode(cd, b, len, p, 3, 1, &full));
            CHECK_OK(gp_image_decode(cd, b, len, p, 3, denom, &im));
            CHECK(im.w == (w + denom - 1) / denom && im.h == (h + denom - 1) / denom);
            int worst = 0;
            for (int y = 0; y + 1 < im.h; y++)
                for (int x = 0; x + 1 < im.w; x++)
                    for (int c = 0; c < 3; c++) {
                        double s = 0;
                        for (int dy = 0; dy < denom; dy++)
                            for (int dx = 0; dx < denom; dx++)
                                s += full.px[((size_t)(y * denom + dy) * (size_t)w +
                                              (size_t)(x * denom + dx)) * 3 + (size_t)c];
                        int d = abs((int)lround(s / (denom * denom)) -
                                    im.px[((size_t)y * (size_t)im.w + (size_t)x) * 3 + (size_t)c]);
                        if (d > worst) worst = d;
                    }
            CHECK_MSG(worst <= 8, "1/%d decode differs from the box average by %d", denom, worst);
            gp_image_free(&full);
        }
        free(b);
    }

    /* grayscale JPEG: three equal channels; as a mask, one */
    uint8_t *gray = malloc(n);
    for (size_t i = 0; i < n; i++) gray[i] = rgb[3 * i];
    path_of(p, sizeof p, "dec/gray.jpg");
    write_jpeg(p, gray, w, h, TJPF_GRAY, 100, TJSAMP_GRAY);
    if (decode_file(cd, "dec/gray.jpg", 3, 1, &im)) {
        bool same = im.c == 3;
        int d = 0;
        for (size_t i = 0; same && i < n; i++) {
            same = im.px[3 * i] == im.px[3 * i + 1] && im.px[3 * i] == im.px[3 * i + 2];
            int e = abs((int)im.px[3 * i] - gray[i]);
            d = e > d ? e : d;
        }
        CHECK_MSG(same && d <= 4, "gray JPEG: channels equal %d, differs by %d", same, d);
    }
    if (decode_file(cd, "dec/gray.jpg", 1, 1, &im)) CHECK(im.c == 1 && max_diff(im.px, gray, n) <= 4);

    /* CMYK JPEG in Adobe's inverted convention (as Photoshop and Pillow
     * write it): RGB by Pillow's formula of the ink */
    uint8_t *cmyk = malloc(n * 4), *want = malloc(n * 3);
    for (size_t i = 0; i < n; i++) {
        int ink[4] = {rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], (int)(i % 97) * 2};
        for (int c = 0; c < 4; c++) cmyk[4 * i + (size_t)c] = (uint8_t)(255 - ink[c]);
        for (int c = 0; c < 3; c++) {
            int nk = 255 - ink[3], t = ink[c] * nk + 128;
            t = ((t >> 8) + t) >> 8;
            want[3 * i + (size_t)c] = (uint8_t)(nk - t);
        }
    }
    path_of(p, sizeof p, "dec/cmyk.jpg");
    write_jpeg(p, cmyk, w, h, TJPF_CMYK, 100, TJSAMP_444);
    if (decode_file(cd, "dec/cmyk.jpg", 3, 1, &im)) {
        int d = max_diff(im.px, want, n * 3);
        CHECK_MSG(im.c == 3 && d <= 8, "CMYK JPEG differs from Pillow's conversion by %d", d);
    }

    /* PNG: lossless, so exact.  RGB; RGBA (alpha dropped); 16-bit (high
     * byte); gray (replicated); palette (colours; as a mask, the index) */
    path_of(p, sizeof p, "dec/rgb.png");
    write_png(p, rgb, w, h, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
    if (decode_file(cd, "dec/rgb.png", 3, 1, &im)) CHECK(max_diff(im.px, rgb, n * 3) == 0);
    uint8_t *rgba = malloc(n * 4), *rgb16 = malloc(n * 6), *pal = malloc(n);
    for (size_t i = 0; i < n; i++) {
        for (int c = 0; c < 3; c++) {
            rgba[4 * i + (size_t)c] = rgb[3 * i + (size_t)c];
            rgb16[6 * i + 2 * (size_t)c] = rgb[3 * i + (size_t)c];         /* big-endian high */
            rgb16[6 * i + 2 * (size_t)c + 1] = (uint8_t)(i * 13 + (size_t)c); /* low: noise */
        }
        rgba[4 * i + 3] = (uint8_t)(i * 7);
        pal[i] = (uint8_t)(i % 5);
    }
    path_of(p, sizeof p, "dec/rgba.png");
    write_png(p, rgba, w, h, PNG_COLOR_TYPE_RGBA, 8, NULL, 0);
    if (decode_file(cd, "dec/rgba.png", 3, 1, &im)) CHECK(max_diff(im.px, rgb, n * 3) == 0);
    path_of(p, sizeof p, "dec/rgb16.png");
    write_png(p, rgb16, w, h, PNG_COLOR_TYPE_RGB, 16, NULL, 0);
    if (decode_file(cd, "dec/rgb16.png", 3, 1, &im)) CHECK(max_diff(im.px, rgb, n * 3) == 0);
    path_of(p, sizeof p, "dec/gray.png");
    write_png(p, gray, w, h, PNG_COLOR_TYPE_GRAY, 8, NULL, 0);
    if (decode_file(cd, "dec/gray.png", 3, 1, &im)) {
        bool ok = true;
        for (size_t i = 0; i < n && ok; i++)
            ok = im.px[3 * i] == gray[i] && im.px[3 * i + 1] == gray[i] && im.px[3 * i + 2] == gray[i];
        CHECK(ok);
    }
    png_color colours[5] = {{0, 0, 0}, {255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {9, 8, 7}};
    path_of(p, sizeof p, "dec/pal.png");
    write_png(p, pal, w, h, PNG_COLOR_TYPE_PALETTE, 8, colours, 5);
    if (decode_file(cd, "dec/pal.png", 3, 1, &im)) {
        bool ok = true;
        for (size_t i = 0; i < n && ok; i++)
            ok = im.px[3 * i] == colours[pal[i]].red && im.px[3 * i + 1] == colours[pal[i]].green &&
                 im.px[3 * i + 2] == colours[pal[i]].blue;
        CHECK(ok);
    }
    if (decode_file(cd, "dec/pal.png", 1, 1, &im)) CHECK(im.c == 1 && max_diff(im.px, pal, n) == 0);
    /* a palette with transparency: its colours, the alpha dropped (it was
     * refused: "4 channels after conversion"); as a mask, the index */
    png_byte alphas[5] = {0, 128, 255, 64, 32};
    path_of(p, sizeof p, "dec/pal_trns.png");
    write_png_trns(p, pal, w, h, PNG_COLOR_TYPE_PALETTE, 8, colours, 5, alphas, 5);
    if (decode_file(cd, "dec/pal_trns.png", 3, 1, &im)) {
        bool ok = im.c == 3;
        for (size_t i = 0; i < n && ok; i++)
            ok = im.px[3 * i] == colours[pal[i]].red && im.px[3 * i + 1] == colours[pal[i]].green &&
                 im.px[3 * i + 2] == colours[pal[i]].blue;
        CHECK_MSG(ok, "a palette PNG with tRNS decoded to other colours");
    }
    if (decode_file(cd, "dec/pal_trns.png", 1, 1, &im))
        CHECK(im.c == 1 && max_diff(im.px, pal, n) == 0);
    /* a 16-bit gray mask keeps its values (0, 1, 2 .. clipped at 255), where
     * the high byte made a 0/1 mask all 0; as an image, the high byte */
    uint8_t *g16 = malloc(n * 2), *want16 = malloc(n), *hi16 = malloc(n);
    for (size_t i = 0; i < n; i++) {
        unsigned v = (unsigned)(i % 4 == 3 ? 300 + i : i % 4); /* 0, 1, 2, then >= 300 */
        g16[2 * i] = (uint8_t)(v >> 8);                      /* big-endian */
        g16[2 * i + 1] = (uint8_t)v;
        want16[i] = (uint8_t)(v > 255 ? 255 : v);
        hi16[i] = (uint8_t)(v >> 8);
    }
    path_of(p, sizeof p, "dec/gray16.png");
    write_png(p, g16, w, h, PNG_COLOR_TYPE_GRAY, 16, NULL, 0);
    if (decode_file(cd, "dec/gray16.png", 1, 1, &im))
        CHECK_MSG(im.c == 1 && im.w == w && max_diff(im.px, want16, n) == 0,
                  "a 16-bit mask: %d channel(s), %d wide, off by up to %d", im.c, im.w,
                  max_diff(im.px, want16, n));
    if (decode_file(cd, "dec/gray16.png", 3, 1, &im)) {
        bool ok = im.c == 3;
        for (size_t i = 0; i < n && ok; i++) ok = im.px[3 * i] == hi16[i];
        CHECK(ok);
    }
    free(g16);
    free(want16);
    free(hi16);

    /* bad files: truncated JPEG and PNG, not an image at all, empty */
    const char *bad[][2] = {{"dec/rgb.jpg", "dec/trunc.jpg"}, {"dec/rgb.png", "dec/trunc.png"}};
    for (int k = 0; k < 2; k++) {
        char src[600], dst[600];
        path_of(src, sizeof src, bad[k][0]);
        path_of(dst, sizeof dst, bad[k][1]);
        size_t len = 0;
        uint8_t *b = slurp(src, &len);
        gpt_write_file(dst, b, len * 2 / 3);
        gp_status s = gp_image_decode(cd, b, len * 2 / 3, dst, 3, 1, &im);
        CHECK_MSG(s == GP_ERR_DATA && strstr(gp_last_error(), dst), "%s: %s", dst,
                  gp_last_error());
        free(b);
    }
    /* stray bytes before the end marker (libjpeg's warning "N extraneous
     * bytes before marker 0xd9", in some photo collections): decoded as
     * Pillow decodes it, the clean file's pixels, whole and as a region
     * (the whole decode stopped on the warning and failed, where a crop,
     * which stops before the end, trained on it); a truncated one is still
     * refused both ways */
    {
        char src[600], dst[600];
        path_of(src, sizeof src, "dec/rgb.jpg");
        path_of(dst, sizeof dst, "dec/extra.jpg");
        size_t len = 0;
        uint8_t *b = slurp(src, &len);
        uint8_t *x = calloc(len + 20, 1);
        if (b && x && len > 2 && b[len - 2] == 0xff && b[len - 1] == 0xd9) {
            memcpy(x, b, len - 2);
            x[len + 18] = 0xff, x[len + 19] = 0xd9;
            gp_image clean = {0}, ext = {0};
            CHECK_OK(gp_image_decode(cd, b, len, src, 3, 1, &clean));
            CHECK_OK(gp_image_decode(cd, x, len + 20, dst, 3, 1, &ext));
            CHECK_MSG(ext.w == clean.w && ext.h == clean.h &&
                          !memcmp(ext.px, clean.px, (size_t)clean.w * (size_t)clean.h * 3),
                      "stray bytes before the end marker changed the pixels");
            int ox, oy, fw, fh;
            CHECK_OK(gp_image_decode_region(cd, x, len + 20, dst, 1, 0, 0, w, h, &ext, &ox, &oy,
                                            &fw, &fh));
            CHECK(gp_image_decode_region(cd, b, len * 2 / 3, dst, 1, 0, 0, w, h, &ext, &ox, &oy,
                                         &fw, &fh) == GP_ERR_DATA &&
                  message_has("remature end"));
            gp_image_free(&clean);
            gp_image_free(&ext);
        } else {
            CHECK_MSG(false, "%s does not end with the end marker", src);
        }
        free(x);
        free(b);
    }
    /* a failed decode does not spoil the next header: a JPEG cut before
     * its scan, then a good one, on the same decoder (libjpeg-turbo 2.1's
     * handle reported 0 x 40 for the good one until gpipe replaced it) */
    {
        char good[600], cut[600];
        path_of(good, sizeof good, "dec/rgb.jpg");
        path_of(cut, sizeof cut, "dec/cut.jpg");
        size_t len = 0;
        uint8_t *b = slurp(good, &len);
        size_t sos = 0;
        for (size_t q = 2; q + 1 < len && !sos; q++)
            if (b[q] == 0xff && b[q + 1] == 0xda) sos = q;
        CHECK(sos > 0);
        int cw = -1, ch = -1, gw = 0, gh = 0;
        CHECK(gp_image_probe(cd, b, sos, cut, &cw, &ch) == GP_ERR_DATA &&
              message_has("missing SOS"));
        CHECK_OK(gp_image_probe(cd, b, len, good, &gw, &gh));
        CHECK_MSG(gw == w && gh == h, "after a failed header: %d x %d, want %d x %d", gw, gh,
                  w, h);
        CHECK(gp_image_decode(cd, b, sos, cut, 3, 1, &im) == GP_ERR_DATA);
        CHECK_OK(gp_image_decode(cd, b, len, good, 3, 2, &im));
        CHECK(im.w == (w + 1) / 2 && im.h == (h + 1) / 2);
        free(b);
    }
    const char *junk = "GIF89a not really";
    gp_status s = gp_image_decode(cd, (const uint8_t *)junk, strlen(junk), "x.gif", 3, 1, &im);
    CHECK(s == GP_ERR_DATA && strstr(gp_last_error(), "x.gif") &&
          strstr(gp_last_error(), "neither a JPEG nor a PNG"));
    free(rgb);
    free(gray);
    free(cmyk);
    free(want);
    free(rgba);
    free(rgb16);
    free(pal);
    gp_image_free(&im);
    gp_image_codec_destroy(cd);
}

/* ---- transforms against references written here ------------------------- */

/* Pillow's bilinear resample of a box, as one direct double sum over the
 * separable weights (no intermediate rounding), clamped to the clamp box. */
static double ref_weight(double center, double scale, int t)
{
    double fs = scale < 1 ? 1 : scale, x = fabs((t - center + 0.5) / fs);
    return x < 1 ? 1 - x : 0;
}

static void ref_taps(double in0, double scale, int i, int lo, int hi, int *a, int *b,
                     double *wsum)
{
    double fs = scale < 1 ? 1 : scale, center = in0 + (i + 0.5) * scale;
    *a = (int)floor(center - fs + 0.5);
    *b = (int)floor(center + fs + 0.5);
    if (*a < lo) *a = lo;
    if (*b > hi) *b = hi;
    *wsum = 0;
    for (int t = *a; t < *b; t++) *wsum += ref_weight(center, scale, t);
}

static uint8_t ref_pixel(const uint8_t *src, int sw, int c, const gp_box *bx, int cx0, int cy0,
                         int cx1, int cy1, int dw, int dh, int ox, int oy, int ch)
{
    double sx = bx->w / dw, sy = bx->h / dh;
    int xa, xb, ya, yb;
    double wx, wy;
    ref_taps(bx->x, sx, ox, cx0, cx1, &xa, &xb, &wx);
    ref_taps(bx->y, sy, oy, cy0, cy1, &ya, &yb, &wy);
    double cxn = bx->x + (ox + 0.5) * sx, cyn = bx->y + (oy + 0.5) * sy, acc = 0;
    for (int y = ya; y < yb; y++)
        for (int x = xa; x < xb; x++)
            acc += ref_weight(cyn, sy, y) / wy * ref_weight(cxn, sx, x) / wx *
                   src[((size_t)y * (size_t)sw + (size_t)x) * (size_t)c + (size_t)ch];
    long v = lround(acc);
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

static void test_resample(void)
{
    int sw = 83, sh = 57;
    uint8_t *src = make_rgb(sw, sh, 3);
    gp_fbuf tmp = {0};
    struct {
        gp_box box;
        int dw, dh;
        bool clamp_box;
    } cases[] = {
        {{0, 0, 83, 57}, 83, 57, false},       /* identity */
        {{0, 0, 83, 57}, 24, 16, false},       /* downscale ~3.5x */
        {{10, 5, 40, 30}, 32, 32, true},       /* a crop, reduced */
        {{20.5, 7.25, 9.5, 6.75}, 31, 19, false}, /* upscale a fractional box */
        {{3, 40, 60, 17}, 17, 40, true},       /* aspect change */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const gp_box *b = &cases[k].box;
        int dw = cases[k].dw, dh = cases[k].dh;
        int cx0 = 0, cy0 = 0, cx1 = sw, cy1 = sh;
        if (cases[k].clamp_box) {
            cx0 = (int)b->x;
            cy0 = (int)b->y;
            cx1 = (int)(b->x + b->w);
            cy1 = (int)(b->y + b->h);
        }
        uint8_t *dst = malloc((size_t)dw * (size_t)dh * 3);
        CHECK_OK(gp_image_resample(src, sw, sh, 3, b, cx0, cy0, cx1, cy1, dst, dw, dh, &tmp));
        int worst = 0;
        for (int y = 0; y < dh; y++)
            for (int x = 0; x < dw; x++)
                for (int c = 0; c < 3; c++) {
                    int d = abs((int)dst[((size_t)y * (size_t)dw + (size_t)x) * 3 + (size_t)c] -
                                ref_pixel(src, sw, 3, b, cx0, cy0, cx1, cy1, dw, dh, x, y, c));
                    if (d > worst) worst = d;
                }
        /* float against double, each rounded once: at most 1 apart */
        CHECK_MSG(worst <= 1, "resample case %zu differs from the reference by %d", k, worst);
        if (k == 0) CHECK(max_diff(dst, src, (size_t)sw * (size_t)sh * 3) == 0);
        free(dst);
    }
    free(tmp.p);
    free(src);
}

/* torchvision's RandomResizedCrop.get_params, written again from its
 * source, on the same Philox draws. */
static void ref_rrc(uint64_t seed, int64_t epoch, int64_t pos, int w, int h, const float *scale,
                    const float *ratio, int box[4])
{
    uint64_t stream = gp_rng_stream((uint64_t)epoch, GP_IMAGE_CROP_TAG, (uint64_t)pos);
    double area = (double)w * h;
    for (int t = 0; t < 10; t++) {
        gp_philox_out o = gp_philox4x32(seed, stream, (uint64_t)t);
        double u0 = o.v[0] / 4294967296.0, u1 = o.v[1] / 4294967296.0;
        double target = area * (scale[0] + u0 * (scale[1] - scale[0]));
        double ar = exp(log(ratio[0]) + u1 * (log(ratio[1]) - log(ratio[0])));
        int cw = (int)nearbyint(sqrt(target * ar)), ch = (int)nearbyint(sqrt(target / ar));
        if (0 < cw && cw <= w && 0 < ch && ch <= h) {
            box[0] = (int)(o.v[3] % (uint32_t)(w - cw + 1));
            box[1] = (int)(o.v[2] % (uint32_t)(h - ch + 1));
            box[2] = cw;
            box[3] = ch;
            return;
        }
    }
    double in_ratio = (double)w / h;
    int cw, ch;
    if (in_ratio < ratio[0]) {
        cw = w;
        ch = (int)nearbyint(cw / ratio[0]);
    } else if (in_ratio > ratio[1]) {
        ch = h;
        cw = (int)nearbyint(ch * ratio[1]);
    } else {
        cw = w;
        ch = h;
    }
    box[0] = (w - cw) / 2;
    box[1] = (h - ch) / 2;
    box[2] = cw;
    box[3] = ch;
}

static void test_crop_geometry(void)
{
    const float scale[2] = {0.08f, 1.0f}, ratio[2] = {3.0f / 4, 4.0f / 3};
    const float tight[2] = {0.9f, 1.0f}, wide[2] = {3.0f, 4.0f}; /* forces the fallback */
    int same = 0, inside = 0, total = 0, flips = 0, fallback_ok = 0;
    double area_sum = 0;
    for (int64_t pos = 0; pos < 2000; pos++) {
        int w = 200 + (int)(pos % 300), h = 150 + (int)(pos % 217);
        const float *sc = pos % 7 == 0 ? tight : scale, *ra = pos % 11 == 0 ? wide : ratio;
        gp_box b;
        bool flip;
        gp_image_rrc_draw(5, 2, pos, w, h, sc, ra, true, &b, &flip);
        int r[4];
        ref_rrc(5, 2, pos, w, h, sc, ra, r);
        same += b.x == r[0] && b.y == r[1] && b.w == r[2] && b.h == r[3];
        inside += b.x >= 0 && b.y >= 0 && b.x + b.w <= w && b.y + b.h <= h && b.w >= 1 && b.h >= 1;
        flips += flip;
        total++;
        /* a draw at ratio [3, 4] fits only when small; else the fallback
         * cuts the whole image to ratio 3: either way about 3 to 4 */
        if (ra == wide) fallback_ok += b.w / b.h > 3 * 0.97 && b.w / b.h < 4 * 1.03;
        if (sc == scale && ra == ratio) area_sum += b.w * b.h / ((double)w * h);
        /* the same draw again: a pure function */
        gp_box b2;
        bool f2;
        gp_image_rrc_draw(5, 2, pos, w, h, sc, ra, true, &b2, &f2);
        CHECK(b2.x == b.x && b2.y == b.y && b2.w == b.w && b2.h == b.h && f2 == flip);
    }
    CHECK_MSG(same == total, "%d of %d crops equal torchvision's algorithm", same, total);
    CHECK(inside == total);
    CHECK_MSG(flips > total * 4 / 10 && flips < total * 6 / 10, "%d flips of %d", flips, total);
    CHECK(fallback_ok == (2000 + 10) / 11);
    /* with scale [0.08, 1] the kept area averages a little under 0.54
     * (large draws that do not fit are redrawn) */
    int n_plain = 0;
    for (int64_t pos = 0; pos < 2000; pos++) n_plain += pos % 7 != 0 && pos % 11 != 0;
    double mean_area = area_sum / n_plain;
    CHECK_MSG(mean_area > 0.35 && mean_area < 0.6, "mean crop area %.3f", mean_area);

    /* Resize(256) + CenterCrop(224) as one box: torchvision's arithmetic */
    int sizes[][2] = {{500, 375}, {375, 500}, {224, 224}, {640, 427}, {300, 1000}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int w = sizes[k][0], h = sizes[k][1];
        gp_box b;
        gp_image_eval_box(w, h, 256, 224, 224, &b);
        int rw = w <= h ? 256 : (int)(256L * w / h), rh = w <= h ? (int)(256L * h / w) : 256;
        /* Python's round(): halves to even (79.5 -> 80, 58.5 -> 58) */
        double top = (rh - 224) / 2.0, left = (rw - 224) / 2.0;
        top = floor(top) + (top - floor(top) > 0.5 || (top - floor(top) == 0.5 && fmod(floor(top), 2) != 0));
        left = floor(left) + (left - floor(left) > 0.5 || (left - floor(left) == 0.5 && fmod(floor(left), 2) != 0));
        CHECK_NEAR(b.x, left * w / rw, 1e-9, 0);
        CHECK_NEAR(b.y, top * h / rh, 1e-9, 0);
        CHECK_NEAR(b.w, 224.0 * w / rw, 1e-9, 0);
        CHECK_NEAR(b.h, 224.0 * h / rh, 1e-9, 0);
    }
    /* the DCT scale never leaves fewer pixels than the output needs */
    gp_box big = {0, 0, 1000, 900}, small = {0, 0, 300, 250}, mid = {0, 0, 460, 450};
    CHECK(gp_image_pick_denom(&big, 224, 224) == 4);
    CHECK(gp_image_pick_denom(&small, 224, 224) == 1);
    CHECK(gp_image_pick_denom(&mid, 224, 224) == 2);
}

/* ---- folders ----------------------------------------------------------- */

/* root/<split>/<class>/ with `per` images each, sizes varying, every third
 * a PNG; the picture's blue channel carries the class. */
static void make_class_folder(const char *root, const char *split, const char *const *classes,
                              int n_classes, int per)
{
    for (int c = 0; c < n_classes; c++) {
        char rel[300];
        snprintf(rel, sizeof rel, "%s/%s/%s", root, split, classes[c]);
        mkdirs(rel);
        for (int i = 0; i < per; i++) {
            int w = 40 + 7 * i + 3 * c, h = 30 + 5 * ((i + c) % 4);
            uint8_t *px = make_rgb(w, h, c);
            char p[700];
            snprintf(p, sizeof p, "%s/%s/img%02d.%s", tmpdir, rel, i, i % 3 == 2 ? "png" : "jpg");
            if (i % 3 == 2) write_png(p, px, w, h, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
            else write_jpeg(p, px, w, h, TJPF_RGB, 90, TJSAMP_420);
            free(px);
        }
    }
}

static gp_data_config folder_cfg(const char *root, int side)
{
    gp_data_config c = {.dataset = GP_DATASET_IMAGE_FOLDER, .normalize = true, .shuffle = true,
                        .hflip = true, .rrc = true, .rrc_scale = {0.08f, 1.0f},
                        .rrc_ratio = {0.75f, 4.0f / 3.0f}, .masks_binary = true,
                        .image_shape = {3, side, side}};
    snprintf(c.path, sizeof c.path, "%s/%s", tmpdir, root);
    return c;
}

/* A class's files in torchvision's ImageFolder order (sorted(os.walk()):
 * by folder path, then name): z.jpg, a/1.jpg, a-b/1.jpg, a/x/1.jpg, where
 * the depth-first walk put a/x/1.jpg before a-b/1.jpg ('-' sorts before
 * '/'); which files train_limit keeps and the sample indices follow it. */
static void test_folder_order(void)
{
    const char *rels[] = {"ord/train/c/z.jpg", "ord/train/c/a/1.jpg", "ord/train/c/a/x/1.jpg",
                          "ord/train/c/a-b/1.jpg", "ord/train/c/a/x/0.jpg"};
    mkdirs("ord/train/c/a/x");
    mkdirs("ord/train/c/a-b");
    uint8_t *px = make_rgb(20, 20, 0);
    for (size_t k = 0; k < sizeof rels / sizeof *rels; k++) {
        char p[700];
        path_of(p, sizeof p, rels[k]);
        write_jpeg(p, px, 20, 20, TJPF_RGB, 90, TJSAMP_444);
    }
    free(px);
    gp_data_config cfg = folder_cfg("ord", 16);
    gp_image_folder *f = NULL;
    bool cached = true;
    CHECK_OK(gp_image_folder_open(&cfg, true, 16, 16, &f, &cached));
    if (!f) return;
    const char *want[] = {"c/z.jpg", "c/a/1.jpg", "c/a-b/1.jpg", "c/a/x/0.jpg", "c/a/x/1.jpg"};
    CHECK(gp_image_folder_size(f) == 5);
    for (int64_t i = 0; i < gp_image_folder_size(f) && i < 5; i++)
        CHECK_MSG(!strcmp(gp_image_folder_file(f, i), want[i]), "file %lld: %s, want %s",
                  (long long)i, gp_image_folder_file(f, i), want[i]);
    gp_image_folder_free(f);
}

static void test_index_and_cache(void)
{
    const char *classes[] = {"zebra", "ant", "moth"};
    make_class_folder("cls", "train", classes, 3, 5);
    make_class_folder("cls", "val", classes, 3, 2);
    /* files that are not images are ignored, hidden ones too */
    char p[700];
    snprintf(p, sizeof p, "%s/cls/train/ant/notes.txt", tmpdir);
    gpt_write_file(p, "x", 1);
    gp_data_config cfg = folder_cfg("cls", 32);
    gp_image_folder *f = NULL;
    bool cached = true;
    CHECK_OK(gp_image_folder_open(&cfg, true, 32, 32, &f, &cached));
    if (!f) return;
    CHECK(!cached);
    CHECK(gp_image_folder_size(f) == 15 && gp_image_folder_classes(f) == 3);
    /* classes in sorted order, files sorted under each: ant, moth, zebra */
    CHECK(!strcmp(gp_image_folder_file(f, 0), "ant/img00.jpg"));
    CHECK(!strcmp(gp_image_folder_file(f, 2), "ant/img02.png"));
    CHECK(gp_image_folder_label(f, 4) == 0 && gp_image_folder_label(f, 5) == 1 &&
          gp_image_folder_label(f, 14) == 2);
    CHECK(!strcmp(gp_image_folder_file(f, 10), "zebra/img00.jpg"));
    gp_image_folder_free(f);
    snprintf(p, sizeof p, "%s/cls/.gpipe-index-train", tmpdir);
    CHECK_MSG(access(p, R_OK) == 0, "no index cache at %s", p);
    /* data.train_limit: 3 of the 15 spread over the listing, one of each
     * class (the first 3 were all ants), and 6: two of each */
    for (int keep = 3; keep <= 6; keep += 3) {
        gp_data_config lc = cfg;
        lc.train_limit = keep;
        gp_dataset ds = {0};
        CHECK_OK(gp_dataset_load(&lc, true, 0, &ds));
        int per_class[3] = {0};
        for (int64_t i = 0; ds.folder && i < ds.n; i++)
            per_class[gp_image_folder_label(ds.folder, i)]++;
        CHECK_MSG(ds.n == keep && per_class[0] == keep / 3 && per_class[1] == keep / 3 &&
                      per_class[2] == keep / 3,
                  "train_limit %d: %lld files, per class %d %d %d", keep, (long long)ds.n,
                  per_class[0], per_class[1], per_class[2]);
        gp_dataset_free(&ds);
    }
    /* again: from the cache, the same index */
    CHECK_OK(gp_image_folder_open(&cfg, true, 32, 32, &f, &cached));
    CHECK(cached && f && gp_image_folder_size(f) == 15 &&
          !strcmp(gp_image_folder_file(f, 10), "zebra/img00.jpg"));
    gp_image_folder_free(f);
    /* a cache whose label is no class (edited, damaged): stale, listed
     * again, not a label past the classes (the fuzzer's heap overflow) */
    for (int q = 0; q < 3; q++) {
        static const char *const bad[] = {"7", "-1", "x"};
        snprintf(p, sizeof p, "sed -i '0,/^F\t[0-9]*\t/s//F\t%s\t/' %s/cls/.gpipe-index-train",
                 bad[q], tmpdir);
        CHECK(system(p) == 0);
        CHECK_OK(gp_image_folder_open(&cfg, true, 32, 32, &f, &cached));
        CHECK_MSG(!cached && f && gp_image_folder_size(f) == 15 &&
                      gp_image_folder_label(f, 0) == 0,
                  "cache with label %s: cached %d", bad[q], cached);
        gp_image_folder_free(f);
    }
    /* a link back to a folder already listed: its files once, no loop */
    snprintf(p, sizeof p, "ln -s . %s/cls/train/ant/loop && ln -s .. %s/cls/train/moth/up",
             tmpdir, tmpdir);
    CHECK(system(p) == 0);
    CHECK_OK(gp_image_folder_open(&cfg, true, 32, 32, &f, &cached));
    CHECK_MSG(f && gp_image_folder_size(f) == 15, "with looping links: %lld files",
              f ? (long long)gp_image_folder_size(f) : -1LL);
    gp_image_folder_free(f);
    snprintf(p, sizeof p, "rm %s/cls/train/ant/loop %s/cls/train/moth/up", tmpdir, tmpdir);
    CHECK(system(p) == 0);
    /* a file rewritten (its size changes): listed again */
    snprintf(p, sizeof p, "%s/cls/train/moth/img01.jpg", tmpdir);
    uint8_t *px = make_rgb(64, 64, 1);
    write_jpeg(p, px, 64, 64, TJPF_RGB, 95, TJSAMP_444);
    free(px);
    CHECK_OK(gp_image_folder_open(&cfg, true, 32, 32, &f, &cached));
    CHECK(!cached);
    gp_image_folder_free(f);
    /* a file added: listed again, one more sample */
    snprintf(p, sizeof p, "cp %s/cls/train/moth/img01.jpg %s/cls/train/moth/img99.jpg", tmpdir,
             tmpdir);
    CHECK(system(p) == 0);
    CHECK_OK(gp_image_folder_open(&cfg, true, 32, 32, &f, &cached));
    CHECK(!cached && f && gp_image_folder_size(f) == 16);
    gp_image_folder_free(f);
    snprintf(p, sizeof p, "rm %s/cls/train/moth/img99.jpg", tmpdir);
    CHECK(system(p) == 0);
    /* data.cache_dir: the index goes there */
    snprintf(cfg.cache_dir, sizeof cfg.cache_dir, "%s/cachedir", tmpdir);
    CHECK_OK(gp_image_folder_open(&cfg, false, 32, 32, &f, &cached));
    CHECK(!cached && f && gp_image_folder_size(f) == 6);
    gp_image_folder_free(f);
    snprintf(p, sizeof p, "ls %s/cachedir/gpipe-index-* >/dev/null 2>&1", tmpdir);
    CHECK(system(p) == 0);

    /* the dataset as the trainer loads it */
    gp_dataset ds = {0};
    cfg.cache_dir[0] = '\0';
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    CHECK(ds.folder && ds.n == 15 && ds.c == 3 && ds.h == 32 && ds.w == 32 && ds.classes == 3);
    gp_dataset_free(&ds);
    cfg.train_limit = 4;
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    CHECK(ds.n == 4);
    gp_dataset_free(&ds);
}

/* Runs gp_image_folder_open with stderr (gpipe's log) into log, up to
 * logcap bytes, '\0'-terminated. */
static gp_status open_logged(const gp_data_config *cfg, gp_image_folder **f, bool *cached,
                             char *log, size_t logcap)
{
    char p[700];
    snprintf(p, sizeof p, "%s/open.log", tmpdir);
    fflush(stderr);
    int saved = dup(2), fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    gp_status s = gp_image_folder_open(cfg, true, 32, 32, f, cached);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t n = 0;
    char *t = gpt_read_file(p, &n);
    snprintf(log, logcap, "%s", t ? t : "");
    free(t);
    return s;
}

/* Replace the cache's last line (count and CRC-32) by one that matches the
 * lines before it, as a cache edited with care would have. */
static char *resum_cache(const char *text)
{
    size_t n = strlen(text);
    char *out = malloc(n + 64);
    const char *e = strstr(text, "\nE\t");
    size_t body = e ? (size_t)(e - text) + 1 : n;
    memcpy(out, text, body);
    long long files = 0;
    for (const char *q = text; q < text + body; q = strchr(q, '\n') + 1)
        files += q[0] == 'F';
    uLong crc = crc32(crc32(0, NULL, 0), (const Bytef *)text, (uInt)body);
    snprintf(out + body, 64, "E\t%lld\t%08lx\n", files, (unsigned long)crc);
    return out;
}

/* A damaged index cache is stale: listed again (and said so, once), never
 * trained from.  Each damage as found in the wild (the cache cut at a line
 * boundary, a label changed by one digit, a line twice, a class line
 * added), and the last three again with the end line re-summed, so that
 * the labels derived from the class folders, the order and uniqueness of
 * the files and every class having files are what catch them. */
static void test_cache_damage(void)
{
    const char *classes[] = {"ant", "moth"};
    make_class_folder("dmg", "train", classes, 2, 3);
    gp_data_config cfg = folder_cfg("dmg", 32);
    gp_image_folder *f = NULL;
    bool cached = true;
    CHECK_OK(gp_image_folder_open(&cfg, true, 32, 32, &f, &cached));
    gp_image_folder_free(f);
    char cpath[700];
    snprintf(cpath, sizeof cpath, "%s/dmg/.gpipe-index-train", tmpdir);
    char *good = gpt_read_file(cpath, NULL);
    CHECK(good && strstr(good, "\nE\t6\t"));
    if (!good) return;
    CHECK_OK(gp_image_folder_open(&cfg, true, 32, 32, &f, &cached));
    CHECK(cached && f && gp_image_folder_size(f) == 6);
    gp_image_folder_free(f);
    enum { CUT, LABEL, TWICE, CLASS, N_DAMAGE };
    static const char *const what[] = {"cut at a line boundary", "a label changed",
                                       "a line twice", "a class line added"};
    const char *moth = strstr(good, "\nF\t1\t") + 1; /* moth's first file */
    size_t n = strlen(good);
    for (int resum = 0; resum < 2; resum++)
        for (int d = resum ? LABEL : CUT; d < N_DAMAGE; d++) {
            char *bad = calloc(1, n + 64);
            if (d == CUT) { /* the end line and moth's last two files gone */
                const char *cut = good + n - 1;
                for (int k = 0; k < 3; k++)
                    while (*--cut != '\n') {}
                memcpy(bad, good, (size_t)(cut - good) + 1);
            } else if (d == LABEL) { /* moth's first file labelled ant */
                memcpy(bad, good, n);
                bad[moth - good + 2] = '0';
            } else if (d == TWICE) { /* moth's first file twice */
                size_t at = (size_t)(moth - good), ln = strcspn(moth, "\n") + 1;
                memcpy(bad, good, at + ln);
                memcpy(bad + at + ln, moth, n - at);
            } else { /* a third class, after moth */
                const char *c = strstr(good, "C\tmoth\n") + strlen("C\tmoth\n");
                size_t at = (size_t)(c - good);
                memcpy(bad, good, at);
                memcpy(bad + at, "C\tzebra\n", strlen("C\tzebra\n"));
                memcpy(bad + at + strlen("C\tzebra\n"), c, n - at);
            }
            if (resum) {
                char *r = resum_cache(bad);
                free(bad);
                bad = r;
            }
            gpt_write_file(cpath, bad, strlen(bad));
            free(bad);
            char log[4096];
            f = NULL;
            CHECK_OK(open_logged(&cfg, &f, &cached, log, sizeof log));
            int64_t size = f ? gp_image_folder_size(f) : -1;
            int classes_n = f ? gp_image_folder_classes(f) : -1;
            bool labels = f != NULL;
            for (int64_t i = 0; f && i < size; i++)
                labels = labels && gp_image_folder_label(f, i) ==
                                       (strncmp(gp_image_folder_file(f, i), "ant/", 4) ? 1 : 0);
            CHECK_MSG(!cached && size == 6 && classes_n == 2 && labels,
                      "cache %s%s: cached %d, %lld files in %d classes, labels %s", what[d],
                      resum ? " (re-summed)" : "", cached, (long long)size, classes_n,
                      labels ? "right" : "wrong");
            const char *said = strstr(log, "the index cache is damaged");
            CHECK_MSG(said && strstr(log, cpath) && !strstr(said + 1, "the index cache is damaged"),
                      "cache %s%s: the log says: %s", what[d], resum ? " (re-summed)" : "", log);
            gp_image_folder_free(f);
            /* rewritten whole */
            char *again = gpt_read_file(cpath, NULL);
            CHECK_MSG(again && !strcmp(again, good), "cache %s: not rewritten as it was",
                      what[d]);
            free(again);
        }
    free(good);
}

/* The evaluation split takes the training split's class indices. */
static void test_class_alignment(void)
{
    const char *all[] = {"ant", "moth", "zebra"}, *two[] = {"ant", "zebra"},
               *odd[] = {"ant", "wasp"};
    make_class_folder("al", "train", all, 3, 2);
    make_class_folder("al", "val", two, 2, 2);
    gp_data_config cfg = folder_cfg("al", 16);
    gp_image_folder *tr = NULL, *va = NULL;
    CHECK_OK(gp_image_folder_open(&cfg, true, 16, 16, &tr, NULL));
    CHECK_OK(gp_image_folder_open(&cfg, false, 16, 16, &va, NULL));
    if (tr && va) {
        /* on its own, val numbers zebra 1; against train, 2 */
        CHECK(gp_image_folder_label(va, 2) == 1);
        CHECK_OK(gp_image_folder_align_classes(va, tr));
        CHECK(gp_image_folder_label(va, 0) == 0 && gp_image_folder_label(va, 2) == 2 &&
              gp_image_folder_classes(va) == 3);
    }
    gp_image_folder_free(va);
    make_class_folder("al2", "train", two, 2, 2);
    make_class_folder("al2", "val", odd, 2, 2);
    gp_data_config c2 = folder_cfg("al2", 16);
    gp_image_folder *t2 = NULL, *v2 = NULL;
    CHECK_OK(gp_image_folder_open(&c2, true, 16, 16, &t2, NULL));
    CHECK_OK(gp_image_folder_open(&c2, false, 16, 16, &v2, NULL));
    if (t2 && v2)
        CHECK(gp_image_folder_align_classes(v2, t2) == GP_ERR_DATA &&
              message_has("al2/val/wasp") && message_has("does not have"));
    gp_image_folder_free(tr);
    gp_image_folder_free(t2);
    gp_image_folder_free(v2);
}

static void test_bad_folders(void)
{
    gp_image_folder *f = NULL;
    char p[700];
    /* no such root */
    gp_data_config cfg = folder_cfg("nope", 32);
    CHECK(gp_image_folder_open(&cfg, true, 32, 32, &f, NULL) == GP_ERR_IO && !f &&
          message_has(cfg.path));
    /* a root without class folders */
    mkdirs("flat/train");
    snprintf(p, sizeof p, "%s/flat/train/a.jpg", tmpdir);
    uint8_t *px = make_rgb(20, 20, 0);
    write_jpeg(p, px, 20, 20, TJPF_RGB, 90, TJSAMP_444);
    cfg = folder_cfg("flat", 32);
    CHECK(gp_image_folder_open(&cfg, true, 32, 32, &f, NULL) == GP_ERR_DATA &&
          message_has("no class folders"));
    /* an empty class */
    const char *one[] = {"cat"};
    make_class_folder("empty", "train", one, 1, 2);
    mkdirs("empty/train/dog");
    cfg = folder_cfg("empty", 32);
    CHECK(gp_image_folder_open(&cfg, true, 32, 32, &f, NULL) == GP_ERR_DATA &&
          message_has("empty/train/dog") && message_has("no images"));
    /* no val split */
    CHECK(gp_image_folder_open(&cfg, false, 32, 32, &f, NULL) == GP_ERR_IO &&
          message_has("empty/val"));
    /* a class folder that is another class's through a link: refused as
     * that, naming the link, whichever of the two sorts first (not "a
     * class folder with no images") */
    const char *two[] = {"cat", "dog"};
    make_class_folder("alias", "train", two, 2, 2);
    snprintf(p, sizeof p, "ln -s cat %s/alias/train/kitty", tmpdir);
    CHECK(system(p) == 0);
    cfg = folder_cfg("alias", 32);
    CHECK(gp_image_folder_open(&cfg, true, 32, 32, &f, NULL) == GP_ERR_DATA && !f &&
          message_has("alias/train/kitty: class folder 'kitty' is a link to ") &&
          message_has("alias/train/cat (class 'cat')") && message_has("same images") &&
          !strstr(gp_last_error(), "no images"));
    snprintf(p, sizeof p, "rm %s/alias/train/kitty && ln -s dog %s/alias/train/bear", tmpdir,
             tmpdir);
    CHECK(system(p) == 0);
    CHECK(gp_image_folder_open(&cfg, true, 32, 32, &f, NULL) == GP_ERR_DATA && !f &&
          message_has("alias/train/dog: class folder 'dog' is the folder linked to by ") &&
          message_has("alias/train/bear (class 'bear')") && !strstr(gp_last_error(), "no images"));
    /* a link inside a class to another class: the same */
    snprintf(p, sizeof p, "rm %s/alias/train/bear && ln -s ../dog %s/alias/train/cat/more", tmpdir,
             tmpdir);
    CHECK(system(p) == 0);
    CHECK(gp_image_folder_open(&cfg, true, 32, 32, &f, NULL) == GP_ERR_DATA && !f &&
          message_has("'dog' is the folder linked to by ") &&
          message_has("alias/train/cat/more (class 'cat')"));
    /* segmentation: an image without its mask, a mask without its image */
    mkdirs("seg1/train/images");
    mkdirs("seg1/train/masks");
    snprintf(p, sizeof p, "%s/seg1/train/images/a.jpg", tmpdir);
    write_jpeg(p, px, 20, 20, TJPF_RGB, 90, TJSAMP_444);
    snprintf(p, sizeof p, "%s/seg1/train/images/b.jpg", tmpdir);
    write_jpeg(p, px, 20, 20, TJPF_RGB, 90, TJSAMP_444);
    uint8_t m[400] = {0};
    snprintf(p, sizeof p, "%s/seg1/train/masks/a.png", tmpdir);
    write_png(p, m, 20, 20, PNG_COLOR_TYPE_GRAY, 8, NULL, 0);
    cfg = folder_cfg("seg1", 32);
    cfg.layout = GP_LAYOUT_SEGMENTATION;
    CHECK(gp_image_folder_open(&cfg, true, 32, 32, &f, NULL) == GP_ERR_DATA &&
          message_has("images/b.jpg has no mask") && message_has("masks/b.png"));
    snprintf(p, sizeof p, "mv %s/seg1/train/images/b.jpg %s/seg1/train/b.jpg", tmpdir, tmpdir);
    CHECK(system(p) == 0);
    snprintf(p, sizeof p, "%s/seg1/train/masks/c.png", tmpdir);
    write_png(p, m, 20, 20, PNG_COLOR_TYPE_GRAY, 8, NULL, 0);
    CHECK(gp_image_folder_open(&cfg, true, 32, 32, &f, NULL) == GP_ERR_DATA &&
          message_has("masks/c.png has no image"));
    free(px);
    /* model.input must be 3 channels */
    cfg = folder_cfg("cls", 32);
    cfg.image_shape[0] = 1;
    gp_dataset ds = {0};
    CHECK(gp_dataset_load(&cfg, true, 0, &ds) == GP_ERR_INVALID && message_has("[3, height"));
}

/* Every batch of two epochs from a loader over ds. */
static float *all_batches(const gp_dataset *ds, const gp_data_config *cfg, int workers,
                          int64_t bs, int64_t start_epoch, int64_t start_batch, int count,
                          bool masks, int64_t *ns)
{
    gp_loader_opts o = {.batch_size = bs, .shuffle = true, .augment = true, .masks = masks,
                        .prefetch = 2, .seed = 11, .workers = workers,
                        .start_epoch = start_epoch, .start_batch = start_batch};
    gp_loader *ld = NULL;
    CHECK_OK(gp_loader_create(ds, cfg, &o, &ld));
    if (!ld) return NULL;
    int64_t per = ds->c * ds->h * ds->w, t = masks ? ds->h * ds->w : 1, row = per + t;
    float *out = calloc((size_t)(count * bs * row), sizeof(float));
    for (int k = 0; k < count; k++) {
        gp_batch b;
        gp_status s = gp_loader_next(ld, &b);
        CHECK_OK(s);
        if (s != GP_OK) break;
        ns[k] = b.n;
        float *dst = out + k * bs * row;
        memcpy(dst, b.x, sizeof(float) * (size_t)(b.n * per));
        memcpy(dst + bs * per, b.y, sizeof(float) * (size_t)(b.n * t));
    }
    gp_loader_destroy(ld);
    return out;
}

static void test_loader_threads_and_resume(void)
{
    gp_data_config cfg = folder_cfg("cls", 24);
    gp_dataset ds = {0};
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    if (!ds.folder) return;
    int64_t bs = 4, per_epoch = (ds.n + bs - 1) / bs; /* 15 samples: 4 batches, the last 3 */
    int count = (int)(2 * per_epoch);
    int64_t n1[16], n4[16], nr[16];
    float *a = all_batches(&ds, &cfg, 1, bs, 0, 0, count, false, n1);
    float *b = all_batches(&ds, &cfg, 4, bs, 0, 0, count, false, n4);
    size_t bytes = sizeof(float) * (size_t)(count * bs * (ds.c * ds.h * ds.w + 1));
    CHECK_MSG(a && b && !memcmp(a, b, bytes), "batches differ between 1 and 4 loader threads");
    CHECK(!memcmp(n1, n4, sizeof(int64_t) * (size_t)count) && n1[per_epoch - 1] == 3);
    /* resumed at epoch 0 batch 2: the same batches from there on */
    float *r = all_batches(&ds, &cfg, 3, bs, 0, 2, count - 2, false, nr);
    size_t row = (size_t)(bs * (ds.c * ds.h * ds.w + 1));
    CHECK_MSG(r && !memcmp(r, a + 2 * row, sizeof(float) * row * (size_t)(count - 2)),
              "a resumed loader gives other batches");
    /* the two epochs differ (a new permutation and new crops), and the
     * labels are the files' classes */
    CHECK(memcmp(a, a + per_epoch * row, sizeof(float) * row) != 0);
    free(a);
    free(b);
    free(r);

    /* without augmentation (evaluation): the centre crop of file order,
     * the same in both epochs, equal to decoding + resampling here */
    gp_loader_opts o = {.batch_size = 15, .shuffle = false, .augment = false, .prefetch = 1,
                        .workers = 2};
    gp_loader *ld = NULL;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    gp_batch bt;
    CHECK_OK(gp_loader_next(ld, &bt));
    gp_image_codec *cd = NULL;
    CHECK_OK(gp_image_codec_create(&cd));
    gp_image im = {0};
    gp_fbuf tmp = {0};
    float mean[3], sd[3];
    gp_data_norm(&cfg, 3, mean, sd);
    int worst = 0, scaled = 0;
    for (int64_t i = 0; i < 15; i++) {
        char rel[300];
        snprintf(rel, sizeof rel, "cls/train/%s", gp_image_folder_file(ds.folder, i));
        CHECK(bt.y[i] == (float)gp_image_folder_label(ds.folder, i));
        /* the full size, then the DCT scale the box allows, the box in
         * that decode's pixels */
        if (!decode_file(cd, rel, 3, 1, &im)) continue;
        int fw = im.w, fh = im.h;
        gp_box box;
        gp_image_eval_box(fw, fh, (int)lround(24 * 256.0 / 224.0), 24, 24, &box);
        int denom = gp_image_pick_denom(&box, 24, 24);
        uint8_t full[24 * 24 * 3], out[24 * 24 * 3];
        CHECK_OK(gp_image_resample(im.px, im.w, im.h, 3, &box, 0, 0, im.w, im.h, full, 24, 24,
                                   &tmp));
        if (denom > 1) {
            scaled++;
            if (!decode_file(cd, rel, 3, denom, &im)) continue;
            double sx = (double)im.w / fw, sy = (double)im.h / fh;
            box = (gp_box){box.x * sx, box.y * sy, box.w * sx, box.h * sy};
        }
        CHECK_OK(gp_image_resample(im.px, im.w, im.h, 3, &box, 0, 0, im.w, im.h, out, 24, 24,
                                   &tmp));
        /* a DCT-scaled decode is close to the full one, resampled */
        double mad = 0;
        for (int q = 0; q < 24 * 24 * 3; q++) mad += abs((int)out[q] - (int)full[q]);
        mad /= 24 * 24 * 3;
        CHECK_MSG(mad < 3.0, "%s: 1/%d decode differs from the full one by %.2f levels on "
                  "average", rel, denom, mad);
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < 24 * 24; p++) {
                float want = ((float)out[p * 3 + c] / 255.0f - mean[c]) / sd[c];
                float got = bt.x[i * 3 * 576 + c * 576 + p];
                int d = (int)lround(fabs(want - got) * sd[c] * 255.0);
                if (d > worst) worst = d;
            }
    }
    CHECK_MSG(scaled >= 1, "no sample took the DCT-scaled path");
    CHECK_MSG(worst == 0, "evaluation crops differ from decode + resample by %d levels", worst);
    gp_loader_destroy(ld);
    gp_image_free(&im);
    free(tmp.p);
    gp_image_codec_destroy(cd);
    gp_dataset_free(&ds);
}

/* Masks follow their image through crop and flip: the image is white
 * where the mask is 1 and black elsewhere (big blocks, so only the
 * pixels at block edges can differ between bilinear and nearest). */
static void test_segmentation_masks(void)
{
    mkdirs("seg/train/images");
    mkdirs("seg/train/masks");
    for (int i = 0; i < 6; i++) {
        int w = 80 + 10 * i, h = 60 + 8 * i;
        uint8_t *px = malloc((size_t)w * (size_t)h * 3), *mk = malloc((size_t)w * (size_t)h);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                /* asymmetric: a block at the left, a band at the top */
                bool on = (x < w / 3 && y > h / 4) || (y < h / 6 && x > w / 2);
                mk[y * w + x] = on ? (uint8_t)(i % 2 ? 255 : 1) : 0;
                memset(px + ((size_t)y * (size_t)w + (size_t)x) * 3, on ? 255 : 0, 3);
            }
        char p[700];
        snprintf(p, sizeof p, "%s/seg/train/images/s%d.png", tmpdir, i);
        write_png(p, px, w, h, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
        snprintf(p, sizeof p, "%s/seg/train/masks/s%d.png", tmpdir, i);
        write_png(p, mk, w, h, PNG_COLOR_TYPE_GRAY, 8, NULL, 0);
        free(px);
        free(mk);
    }
    gp_data_config cfg = folder_cfg("seg", 32);
    cfg.layout = GP_LAYOUT_SEGMENTATION;
    cfg.normalize = false;
    cfg.rrc_scale[0] = 0.3f;
    gp_dataset ds = {0};
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    if (!ds.folder) return;
    CHECK(gp_dataset_has_masks(&ds) && ds.n == 6);
    int64_t ns[8];
    float *a = all_batches(&ds, &cfg, 2, 3, 0, 0, 4, true, ns);
    int64_t per = 3 * 32 * 32, hw = 32 * 32;
    int64_t agree = 0, total = 0, ones = 0, flipped_ok = 0;
    for (int k = 0; a && k < 4; k++)
        for (int64_t i = 0; i < ns[k]; i++) {
            const float *x = a + (size_t)(k * 3 * (per + hw)) + (size_t)(i * per);
            const float *y = a + (size_t)(k * 3 * (per + hw)) + (size_t)(3 * per) + (size_t)(i * hw);
            for (int64_t p = 0; p < hw; p++) {
                agree += (x[p] > 0.5f) == (y[p] > 0.5f);
                ones += y[p] == 1.0f;
                total++;
                CHECK(y[p] == 0.0f || y[p] == 1.0f); /* binary: 255 and 1 both -> 1 */
            }
            flipped_ok++;
        }
    CHECK_MSG(total > 0 && agree >= total * 95 / 100, "mask agrees with its image on %lld of "
              "%lld pixels", (long long)agree, (long long)total);
    CHECK(ones > total / 20 && ones < total * 95 / 100);
    CHECK(flipped_ok == 12);
    free(a);
    gp_dataset_free(&ds);
    /* data.masks: index keeps the values */
    cfg.masks_binary = false;
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    float *b = all_batches(&ds, &cfg, 1, 6, 0, 0, 1, true, ns);
    bool saw255 = false;
    for (int64_t p = 0; b && p < 6 * hw; p++) saw255 |= b[6 * per + p] == 255.0f;
    CHECK(saw255);
    free(b);
    gp_dataset_free(&ds);

    /* the same masks as JPEGs (0/255, quality 75: faint values around every
     * edge): binary takes 128 and up for 1, so they agree with their
     * images as the PNGs do (any value but 0 made the edges' ringing 1) */
    mkdirs("segj/train/images");
    mkdirs("segj/train/masks");
    for (int i = 0; i < 6; i++) {
        int w = 80 + 10 * i, h = 60 + 8 * i;
        uint8_t *px = malloc((size_t)w * (size_t)h * 3), *mk = malloc((size_t)w * (size_t)h);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                bool on = (x / 4 + y / 4) % 2 == 0; /* fine checks: edges everywhere */
                mk[y * w + x] = on ? 255 : 0;
                memset(px + ((size_t)y * (size_t)w + (size_t)x) * 3, on ? 255 : 0, 3);
            }
        char p[700];
        snprintf(p, sizeof p, "%s/segj/train/images/s%d.png", tmpdir, i);
        write_png(p, px, w, h, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
        snprintf(p, sizeof p, "%s/segj/train/masks/s%d.jpg", tmpdir, i);
        write_jpeg(p, mk, w, h, TJPF_GRAY, 75, TJSAMP_GRAY);
        free(px);
        free(mk);
    }
    cfg = folder_cfg("segj", 32);
    cfg.layout = GP_LAYOUT_SEGMENTATION;
    cfg.normalize = false;
    cfg.rrc = false; /* the whole picture: resized, the checks still have edges */
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    float *j = ds.folder ? all_batches(&ds, &cfg, 2, 3, 0, 0, 2, true, ns) : NULL;
    agree = total = 0;
    for (int k = 0; j && k < 2; k++)
        for (int64_t i = 0; i < ns[k]; i++) {
            const float *x = j + (size_t)(k * 3 * (per + hw)) + (size_t)(i * per);
            const float *y = j + (size_t)(k * 3 * (per + hw)) + (size_t)(3 * per) + (size_t)(i * hw);
            for (int64_t p = 0; p < hw; p++, total++) agree += (x[p] > 0.5f) == (y[p] > 0.5f);
        }
    CHECK_MSG(total > 0 && agree >= total * 95 / 100, "JPEG masks agree with their images on "
              "%lld of %lld pixels", (long long)agree, (long long)total);
    free(j);
    gp_dataset_free(&ds);

    /* two images of one stem would share its mask: refused, naming both */
    char p2[700], q2[1600];
    snprintf(p2, sizeof p2, "%s/seg/train/images/s0.png", tmpdir);
    snprintf(q2, sizeof q2, "cp %s %s/seg/train/images/s0.jpg", p2, tmpdir);
    CHECK(system(q2) == 0);
    cfg = folder_cfg("seg", 32);
    cfg.layout = GP_LAYOUT_SEGMENTATION;
    CHECK_ERR(gp_dataset_load(&cfg, true, 0, &ds), GP_ERR_DATA,
              "images/s0.jpg and images/s0.png have the same name");
    gp_dataset_free(&ds);
    snprintf(q2, sizeof q2, "rm %s/seg/train/images/s0.jpg", tmpdir);
    CHECK(system(q2) == 0);
}

static void test_bad_files_in_loader(void)
{
    const char *classes[] = {"a", "b"};
    make_class_folder("badf", "train", classes, 2, 4);
    char src[700], dst[700];
    snprintf(src, sizeof src, "%s/badf/train/b/img01.jpg", tmpdir);
    size_t len = 0;
    uint8_t *bytes = slurp(src, &len);
    gpt_write_file(src, bytes, len / 2); /* truncated in place */
    free(bytes);
    snprintf(dst, sizeof dst, "%s/badf/train/a/img03.jpg", tmpdir);
    gpt_write_file(dst, "not an image", 12);
    gp_data_config cfg = folder_cfg("badf", 16);
    gp_dataset ds = {0};
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    if (!ds.folder) return;
    /* on_bad_file: error: the batch holding a bad file fails, naming it */
    gp_loader_opts o = {.batch_size = 8, .shuffle = false, .augment = true, .prefetch = 1,
                        .workers = 3};
    gp_loader *ld = NULL;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    gp_batch b;
    gp_status s = gp_loader_next(ld, &b);
    CHECK(s == GP_ERR_DATA && message_has("badf/train/a/img03.jpg"));
    /* and again: the error stays */
    CHECK(gp_loader_next(ld, &b) == GP_ERR_DATA);
    gp_loader_destroy(ld);
    /* on_bad_file: skip: 6 of 8 samples, two files counted, each warned
     * once, in every epoch the same */
    cfg.skip_bad_files = true;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    for (int e = 0; e < 3 && ld; e++) {
        CHECK_OK(gp_loader_next(ld, &b));
        CHECK_MSG(b.n == 6, "epoch %d: %lld samples", e, (long long)b.n);
        /* labels of the good files in order: a a a b b b */
        CHECK(b.y[0] == 0 && b.y[2] == 0 && b.y[3] == 1 && b.y[5] == 1);
    }
    CHECK(gp_loader_bad_files(ld) == 2);
    gp_loader_destroy(ld);
    gp_dataset_free(&ds);
}

/* A progressive JPEG whose header declares w x h pixels: a 64 x 64 picture
 * written progressive, its SOF2 segment's size patched (the scans carry far
 * fewer pixels, but libjpeg sizes its whole-image coefficient buffers from
 * the header alone). */
static void write_declared_progressive(const char *path, int w, int h)
{
    uint8_t *px = make_rgb(64, 64, 2);
    tjhandle t = tjInitCompress();
    unsigned char *out = NULL;
    unsigned long len = 0;
    int rc = tjCompress2(t, px, 64, 0, 64, TJPF_RGB, &out, &len, TJSAMP_444, 90,
                         TJFLAG_PROGRESSIVE);
    CHECK_MSG(rc == 0, "tjCompress2 progressive: %s", tjGetErrorStr2(t));
    bool patched = false;
    for (unsigned long p = 2; rc == 0 && p + 9 <= len && out[p] == 0xff;) {
        if (out[p + 1] == 0xc2) { /* FF C2 len(2) precision(1) height(2) width(2) */
            out[p + 5] = (uint8_t)(h >> 8);
            out[p + 6] = (uint8_t)h;
            out[p + 7] = (uint8_t)(w >> 8);
            out[p + 8] = (uint8_t)w;
            patched = true;
            break;
        }
        p += 2 + ((unsigned long)out[p + 2] << 8 | out[p + 3]);
    }
    CHECK_MSG(patched, "no SOF2 marker in the progressive JPEG written for %s", path);
    if (patched) gpt_write_file(path, out, len);
    tjFree(out);
    tjDestroy(t);
    free(px);
}

/* A progressive JPEG's header past GP_IMAGE_MAX_PIXELS is a bad file at
 * every entry (probe, whole and DCT-scaled decode, region decode), before
 * libjpeg allocates for it, and the loader treats it as one: an error
 * naming it, or a counted skip. */
static void test_declared_size_limit(void)
{
    const char *classes[] = {"a", "b"};
    make_class_folder("huge", "train", classes, 2, 3);
    char p[700];
    snprintf(p, sizeof p, "%s/huge/train/b/img01.jpg", tmpdir);
    /* 10240 x 10240: 105 megapixels declared, 1280 x 1280 at 1/8 */
    write_declared_progressive(p, 10240, 10240);
    size_t len = 0;
    uint8_t *b = slurp(p, &len);
    gp_image_codec *cd = NULL;
    CHECK_OK(gp_image_codec_create(&cd));
    gp_image im = {0};
    int w = 0, h = 0, ox, oy, fw, fh;
    if (b && cd) {
        CHECK(gp_image_probe(cd, b, len, p, &w, &h) == GP_ERR_DATA && message_has(p) &&
              message_has("10240 x 10240") && message_has("100000000"));
        for (int denom = 1; denom <= 8; denom *= 2)
            CHECK_MSG(gp_image_decode(cd, b, len, p, 3, denom, &im) == GP_ERR_DATA &&
                          message_has("10240 x 10240"),
                      "decode at 1/%d", denom);
        CHECK(gp_image_decode_region(cd, b, len, p, 8, 0, 0, 64, 64, &im, &ox, &oy, &fw, &fh) ==
                  GP_ERR_DATA &&
              message_has("10240 x 10240"));
    }
    free(b);
    /* a progressive JPEG of an honest size still decodes */
    snprintf(p, sizeof p, "%s/huge/progressive-ok.jpg", tmpdir);
    write_declared_progressive(p, 64, 64);
    b = slurp(p, &len);
    if (b && cd) {
        CHECK_OK(gp_image_probe(cd, b, len, p, &w, &h));
        CHECK_OK(gp_image_decode(cd, b, len, p, 3, 1, &im));
        CHECK(im.w == 64 && im.h == 64);
    }
    free(b);
    gp_image_free(&im);
    gp_image_codec_destroy(cd);

    gp_data_config cfg = folder_cfg("huge", 16);
    gp_dataset ds = {0};
    CHECK_OK(gp_dataset_load(&cfg, true, 0, &ds));
    if (!ds.folder) return;
    gp_loader_opts o = {.batch_size = 6, .shuffle = false, .augment = true, .prefetch = 1,
                        .workers = 2};
    gp_loader *ld = NULL;
    gp_batch bt;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    CHECK(ld && gp_loader_next(ld, &bt) == GP_ERR_DATA && message_has("huge/train/b/img01.jpg") &&
          message_has("limit"));
    gp_loader_destroy(ld);
    cfg.skip_bad_files = true;
    ld = NULL;
    CHECK_OK(gp_loader_create(&ds, &cfg, &o, &ld));
    if (ld) {
        CHECK_OK(gp_loader_next(ld, &bt));
        CHECK_MSG(bt.n == 5, "on_bad_file: skip: %lld samples of 6", (long long)bt.n);
        CHECK(gp_loader_bad_files(ld) == 1);
    }
    gp_loader_destroy(ld);
    gp_dataset_free(&ds);
}

/* Training on an image folder through the library: a run resumed from a
 * mid-epoch snapshot gives the same losses, bit for bit, as the run that
 * went on; and a bad file met mid-run saves a snapshot first. */
static int64_t read_losses(const char *path, char losses[][40], int max)
{
    char *t = gpt_read_file(path, NULL);
    int64_t n = 0;
    for (char *p = t; p && (p = strstr(p, "{\"step\":")) && n < max; p++) {
        char *l = strstr(p, "\"loss\":");
        if (!l) break;
        int step = atoi(p + 8);
        if (step >= 1 && step <= max) {
            snprintf(losses[step - 1], 40, "%.*s", (int)strcspn(l + 7, ","), l + 7);
            if (step > n) n = step;
        }
    }
    free(t);
    return n;
}

static gp_status run_yaml(const char *yaml, const char *resume, const char *metrics)
{
    gp_config cfg;
    gp_status s = gp_config_parse("img.yaml", yaml, strlen(yaml), NULL, 0, &cfg);
    CHECK_OK(s);
    if (s != GP_OK) return s;
    gp_train_opts o = {.metrics_path = metrics, .quiet = true, .resume_path = resume};
    gp_train_result r;
    s = gp_train_run(&cfg, &o, &r);
    gp_config_free(&cfg);
    return s;
}

/* The data keys of an image folder: defaults, and errors that name the
 * key. */
static void test_config_keys(void)
{
    const char *base = "model: {input: [3, 32, 32], layers: [flatten, {linear: {out: 2}}]}\n";
    struct {
        const char *data;
        const char *error; /* NULL = valid */
    } cases[] = {
        {"data: {dataset: image_folder, path: /x}", NULL},
        {"data: {dataset: image_folder}", "needs data.path"},
        {"data: {dataset: image_folder, path: /x, augment: {crop_padding: 4}}",
         "random_resized_crop"},
        {"data: {dataset: image_folder, path: /x, augment: {random_resized_crop: "
         "{scale: [0.9, 0.2]}}}", "low end is above the high end"},
        {"data: {dataset: image_folder, path: /x, augment: {random_resized_crop: "
         "{scale: [0.1, 1.5]}}}", "must be in (0, 1]"},
        {"data: {dataset: image_folder, path: /x, augment: {random_resized_crop: "
         "{sclae: [0.1, 1]}}}", "sclae"},
        {"data: {dataset: image_folder, path: /x, on_bad_file: ignore}", "on_bad_file"},
        {"data: {dataset: image_folder, path: /x, layout: detection}", "layout"},
        {"data: {dataset: image_folder, path: /x, workers: -1}", "workers"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml, "%s%s\n", base, cases[k].data);
        gp_config cfg;
        gp_status s = gp_config_parse("k.yaml", yaml, strlen(yaml), NULL, 0, &cfg);
        if (!cases[k].error) {
            CHECK_OK(s);
            if (s != GP_OK) continue;
            const gp_data_config *d = &cfg.data;
            CHECK(d->dataset == GP_DATASET_IMAGE_FOLDER && d->hflip && d->rrc &&
                  d->rrc_scale[0] == 0.08f && d->rrc_scale[1] == 1.0f &&
                  fabsf(d->rrc_ratio[1] - 4.0f / 3.0f) < 1e-6f && !d->skip_bad_files &&
                  d->workers == 0 && d->masks_binary && d->layout == GP_LAYOUT_CLASSIFICATION &&
                  d->image_shape[1] == 32);
            gp_config_free(&cfg);
        } else {
            CHECK_MSG(s != GP_OK && strstr(gp_last_error(), cases[k].error) &&
                      strstr(gp_last_error(), "k.yaml:"), "case %zu: %s", k, gp_last_error());
        }
    }
    /* data.workers: as given, else the cores the devices' threads leave
     * (at least 1) */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *wk[] = {
        "model: {input: [3, 8, 8], layers: [flatten, {linear: {out: 2}}]}\n"
        "pipeline: {devices: [{name: cpu:0, threads: 1}]}\n"
        "data: {dataset: image_folder, path: /x}\n",
        "model: {input: [3, 8, 8], layers: [flatten, {linear: {out: 2}}]}\n"
        "pipeline: {devices: [{name: cpu:0, threads: 1}]}\n"
        "data: {dataset: image_folder, path: /x, workers: 3}\n"};
    for (int k = 0; k < 2; k++) {
        gp_config wc;
        CHECK_OK(gp_config_parse("w.yaml", wk[k], strlen(wk[k]), NULL, 0, &wc));
        int want = k ? 3 : (cores - 1 < 1 ? 1 : (int)cores - 1);
        CHECK_MSG(gp_data_workers(&wc) == want, "workers %d, want %d", gp_data_workers(&wc),
                  want);
        gp_config_free(&wc);
    }
    /* the in-memory datasets keep their defaults */
    const char *fm = "model: {input: [1, 28, 28], layers: [flatten, {linear: {out: 10}}]}\n";
    gp_config cfg;
    CHECK_OK(gp_config_parse("f.yaml", fm, strlen(fm), NULL, 0, &cfg));
    CHECK(!cfg.data.hflip);
    gp_config_free(&cfg);
}

static void test_train_resume(void)
{
    char yaml[2048], m1[600], m2[600], snap[600];
    snprintf(yaml, sizeof yaml,
             "model:\n  input: [3, 16, 16]\n  layers:\n"
             "    - conv2d: {out: 4, kernel: 3, padding: 1}\n    - batchnorm\n    - relu\n"
             "    - global_avgpool\n    - flatten\n    - linear: {out: 3}\n"
             "pipeline: {devices: [cpu:0, cpu:1], chunks: 2}\n"
             "data: {dataset: image_folder, path: %s/cls, workers: 3}\n"
             "train: {epochs: 2, batch_size: 4, eval_each_epoch: false,\n"
             "        snapshot: {every_steps: 3, keep: 9, dir: %s/snaps}}\n",
             tmpdir, tmpdir);
    snprintf(m1, sizeof m1, "%s/m1.jsonl", tmpdir);
    snprintf(m2, sizeof m2, "%s/m2.jsonl", tmpdir);
    CHECK_OK(run_yaml(yaml, NULL, m1));
    /* step 3 of 4 per epoch: mid-epoch */
    snprintf(snap, sizeof snap, "%s/snaps/snapshot-000000003.safetensors", tmpdir);
    CHECK_OK(run_yaml(yaml, snap, m2));
    char a[8][40] = {{0}}, b[8][40] = {{0}};
    int64_t na = read_losses(m1, a, 8), nb = read_losses(m2, b, 8);
    CHECK_MSG(na == 8 && nb == 8, "%lld and %lld steps", (long long)na, (long long)nb);
    int same = 0;
    for (int k = 3; k < 8; k++) same += a[k][0] && !strcmp(a[k], b[k]);
    CHECK_MSG(same == 5, "%d of 5 resumed losses equal the continuous run's", same);
    char *mt = gpt_read_file(m1, NULL);
    CHECK(mt && strstr(mt, "\"data_wait_seconds\":"));
    free(mt);

    /* a bad file met at step 4 (the last batch of epoch 0): the step since
     * the last snapshot (2) is saved before the error, which names the
     * file */
    char p[1200];
    snprintf(p, sizeof p, "cp -r %s/cls %s/cls2", tmpdir, tmpdir);
    CHECK(system(p) == 0);
    snprintf(p, sizeof p, "rm -f %s/cls2/.gpipe-index-*; rm -rf %s/snaps", tmpdir, tmpdir);
    CHECK(system(p) == 0);
    /* which file is the first sample of epoch 0's last batch? */
    gp_data_config dc = folder_cfg("cls2", 16);
    gp_dataset ds = {0};
    CHECK_OK(gp_dataset_load(&dc, true, 0, &ds));
    int64_t perm[64];
    gp_data_epoch_order(ds.n, true, 0, 0, perm);
    snprintf(p, sizeof p, "%s/cls2/train/%s", tmpdir, gp_image_folder_file(ds.folder, perm[12]));
    gpt_write_file(p, "broken", 6); /* same index: the cache is rewritten */
    gp_dataset_free(&ds);
    snprintf(yaml, sizeof yaml,
             "model:\n  input: [3, 16, 16]\n  layers:\n"
             "    - conv2d: {out: 4, kernel: 3, padding: 1}\n    - relu\n"
             "    - global_avgpool\n    - flatten\n    - linear: {out: 3}\n"
             "data: {dataset: image_folder, path: %s/cls2, workers: 2, prefetch: 1}\n"
             "train: {epochs: 2, batch_size: 4, eval_each_epoch: false,\n"
             "        snapshot: {every_steps: 2, keep: 9, dir: %s/snaps}}\n",
             tmpdir, tmpdir);
    gp_status s = run_yaml(yaml, NULL, NULL);
    CHECK(s == GP_ERR_DATA && message_has(p) && message_has("snapshot") &&
          message_has("data.on_bad_file: skip"));
    char want[700];
    snprintf(want, sizeof want, "%s/snaps/snapshot-000000003.safetensors", tmpdir);
    CHECK_MSG(access(want, R_OK) == 0, "no snapshot of step 3 after the bad file: %s",
              gp_last_error());
}

/* A bad file met by the final evaluation is reported as training's and
 * an epoch's evaluation's are: where the run stopped, the snapshot that
 * holds it, and on_bad_file: skip; once the file is fixed, the run resumed
 * from that snapshot evaluates and ends well. */
static void test_final_eval_bad_file(void)
{
    char p[2000];
    snprintf(p, sizeof p, "cp -r %s/cls %s/cls3 && rm -f %s/cls3/.gpipe-index-*", tmpdir, tmpdir,
             tmpdir);
    CHECK(system(p) == 0);
    char bad[700], saved[700];
    snprintf(bad, sizeof bad, "%s/cls3/val/moth/img01.jpg", tmpdir);
    snprintf(saved, sizeof saved, "%s/cls3/img01.jpg.good", tmpdir);
    snprintf(p, sizeof p, "cp %s %s", bad, saved);
    CHECK(system(p) == 0);
    gpt_write_file(bad, "broken", 6);
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "model:\n  input: [3, 16, 16]\n  layers:\n"
             "    - conv2d: {out: 4, kernel: 3, padding: 1}\n    - relu\n"
             "    - global_avgpool\n    - flatten\n    - linear: {out: 3}\n"
             "data: {dataset: image_folder, path: %s/cls3, workers: 2}\n"
             "train: {steps: 3, batch_size: 4, eval_each_epoch: false,\n"
             "        snapshot: {every_steps: 2, keep: 9, dir: %s/snaps3}}\n",
             tmpdir, tmpdir);
    char snap[700];
    snprintf(snap, sizeof snap, "%s/snaps3/snapshot-000000003.safetensors", tmpdir);
    gp_status s = run_yaml(yaml, NULL, NULL);
    CHECK(s == GP_ERR_DATA && message_has(bad) && message_has("stopped at step 3") &&
          message_has(snap) && message_has("data.on_bad_file: skip"));
    CHECK_MSG(access(snap, R_OK) == 0, "no snapshot of step 3 after the final evaluation's bad "
              "file: %s", gp_last_error());
    /* snapshots off: what is lost, and the skip, are said */
    char off[2048];
    snprintf(off, sizeof off, "%.*s", (int)(strstr(yaml, ",\n        snapshot") - yaml), yaml);
    strcat(off, "}\n");
    s = run_yaml(off, NULL, NULL);
    CHECK(s == GP_ERR_DATA && message_has(bad) && message_has("stopped at step 3") &&
          message_has("snapshots are off") && message_has("data.on_bad_file: skip"));
    /* fixed: the resumed run has nothing left to train and evaluates */
    snprintf(p, sizeof p, "cp %s %s", saved, bad);
    CHECK(system(p) == 0);
    CHECK_OK(run_yaml(yaml, snap, NULL));
}

int main(void)
{
    if (!gpt_make_tmpdir(tmpdir, sizeof tmpdir, "gpipe-image")) return 1;
    test_decode();
    test_region_exact();
    test_resample();
    test_crop_geometry();
    test_folder_order();
    test_index_and_cache();
    test_cache_damage();
    test_bad_folders();
    test_class_alignment();
    test_loader_threads_and_resume();
    test_segmentation_masks();
    test_bad_files_in_loader();
    test_declared_size_limit();
    test_config_keys();
    test_train_resume();
    test_final_eval_bad_file();
    if (!gpt_failed) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    printf("test_image: %d passed, %d failed\n", gpt_passed, gpt_failed);
    return gpt_failed ? 1 : 0;
}

#else
int main(void)
{
    printf("test_image: built without image decoding (GPIPE_IMAGES): skipped\n");
    return 77;
}
#endif
