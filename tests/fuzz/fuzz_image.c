/* fuzz_image.c — the JPEG and PNG decoders (gp_image_probe, whole and
 * DCT-scaled decodes, region decodes).  The first byte picks the channels
 * (bit 0), the scale (bits 1-2: 1/1, 1/2, 1/4, 1/8) and a region decode
 * (bit 3) of the middle of the image; the rest is the file. */
#include "fuzz_util.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || !gp_image_supported()) return 0;
    static gp_image_codec *cd;
    if (!cd && gp_image_codec_create(&cd) != GP_OK) abort();
    const uint8_t *buf = data + 1;
    size_t len = size - 1;
    int channels = data[0] & 1 ? 1 : 3, denom = 1 << ((data[0] >> 1) & 3);
    gp_image im = {0};
    int w = 0, h = 0;
    gp_status s = gp_image_probe(cd, buf, len, "fuzz", &w, &h);
    /* Images between 16 M pixels and gpipe's limit (GP_IMAGE_MAX_PIXELS,
     * 100 M) decode into buffers of 64-400 MB: a few of those live at once
     * under ASan's quarantine pass libFuzzer's 2 GB RSS limit (CI found
     * one, 2026-11-24) without exercising more of the parsers; above the
     * limit the probe refuses a JPEG by its header, and a PNG's decode is
     * still tried, and refused before it allocates. */
    if (s == GP_OK && (int64_t)w * h > ((int64_t)16 << 20) &&
        (int64_t)w * h <= GP_IMAGE_MAX_PIXELS)
        return 0;
    if (s == GP_OK && (data[0] & 8) && w > 1 && h > 1) {
        int ox, oy, fw, fh;
        s = gp_image_decode_region(cd, buf, len, "fuzz", denom, w / 4, h / 4, w / 2 + 1,
                                   h / 2 + 1, &im, &ox, &oy, &fw, &fh);
        if (s == GP_OK && (ox < 0 || oy < 0 || ox + im.w > fw || oy + im.h > fh)) abort();
    } else if (s == GP_OK) {
        s = gp_image_decode(cd, buf, len, "fuzz", channels, denom, &im);
        if (s == GP_OK && (im.c != channels || im.w < 1 || im.h < 1)) abort();
    }
    if (s != GP_OK && !gp_last_error()[0]) abort();
    gp_image_free(&im);
    return 0;
}
