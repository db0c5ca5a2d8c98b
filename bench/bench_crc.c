/*
 * bench_crc.c — the CRC-32 a snapshot's file carries (gpipe.crc32), as
 * gp_st_crc computes it (ISA-L's crc32_gzip_refl where the build found
 * libisal-dev, else zlib's crc32()) against zlib's crc32() itself, over
 * ResNet-101's snapshot state (358 MB), in one run: best of 5 each, and
 * the two values, which must be equal.  Usage: bench_crc [MB] (default
 * 358).  Never fails (a differing value is printed as such).
 */
#include "train/snapshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>

int main(int argc, char **argv)
{
    size_t mb = argc > 1 ? (size_t)atol(argv[1]) : 358;
    if (mb == 0) mb = 358;
    size_t n = mb << 20;
    unsigned char *b = malloc(n);
    if (!b) {
        printf("bench_crc: no %zu MB of host memory\n", mb);
        return 0;
    }
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)((i * 2654435761u) >> 13);
    double best[2] = {1e30, 1e30};
    unsigned long val[2] = {0, 0};
    for (int r = 0; r < 5; r++) {
        double t0 = gp_now();
        val[0] = gp_st_crc(0, b, n);
        double t1 = gp_now();
        uLong z = crc32(0L, Z_NULL, 0);
        for (size_t off = 0; off < n; off += (size_t)1 << 30) {
            size_t k = n - off < ((size_t)1 << 30) ? n - off : ((size_t)1 << 30);
            z = crc32(z, b + off, (uInt)k);
        }
        val[1] = z;
        double t2 = gp_now();
        if (t1 - t0 < best[0]) best[0] = t1 - t0;
        if (t2 - t1 < best[1]) best[1] = t2 - t1;
    }
    printf("CRC-32 of %zu MB, best of 5\n", mb);
    printf("gp_st_crc (%s): %.1f ms, %.2f GB/s\n",
#ifdef GPIPE_HAVE_ISAL
           "ISA-L",
#else
           "zlib",
#endif
           best[0] * 1e3, (double)n / best[0] / 1e9);
    printf("zlib crc32():      %.1f ms, %.2f GB/s\n", best[1] * 1e3, (double)n / best[1] / 1e9);
    printf("ratio zlib / gp_st_crc: %.2fx; values %08lx and %08lx (%s)\n", best[1] / best[0],
           val[0], val[1], val[0] == val[1] ? "equal" : "DIFFERENT");
    free(b);
    return 0;
}
