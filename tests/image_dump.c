/*
 * image_dump.c — decode one JPEG or PNG with gpipe's decoder and write its
 * pixels, for tests/test_image_ref.py to compare with Pillow's decode of
 * the same file.
 *   image_dump FILE CHANNELS DENOM OUT   (OUT: "w h c\n" then h*w*c bytes)
 * Exits 77 when gpipe was built without image decoding, 1 on a decode
 * error (printed).
 */
#include "data/data.h"

#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: image_dump FILE CHANNELS DENOM OUT\n");
        return 2;
    }
    if (!gp_image_supported()) return 77;
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) return 1;
    fclose(f);
    gp_image_codec *cd = NULL;
    gp_image im = {0};
    if (gp_image_codec_create(&cd) != GP_OK ||
        gp_image_decode(cd, buf, (size_t)n, argv[1], atoi(argv[2]), atoi(argv[3]), &im) != GP_OK) {
        fprintf(stderr, "%s\n", gp_error_message());
        return 1;
    }
    FILE *o = fopen(argv[4], "wb");
    if (!o) return 1;
    fprintf(o, "%d %d %d\n", im.w, im.h, im.c);
    fwrite(im.px, 1, (size_t)im.w * (size_t)im.h * (size_t)im.c, o);
    int rc = fclose(o) == 0 ? 0 : 1;
    gp_image_free(&im);
    gp_image_codec_destroy(cd);
    free(buf);
    return rc;
}
