/*
 * cpu_upsample.c — nearest-neighbour upsampling by an integer factor and
 * its adjoint on plain NCHW, with OpenMP loops over the input rows.
 *
 * Why not oneDNN's resampling primitive (dnnl_resampling_nearest): on the
 * plain layout its backward is the generic reference kernel.  Measured for
 * (16, 64, 48, 48) upsampled by 2 on 2 cores (best of 7, a shared machine):
 * oneDNN 4.7-5.9 ms forward and 59-68 ms backward, these loops 1.6-3.4 ms
 * and 1.5-5.4 ms.  The loops read each input row once and write its
 * `scale` output rows (forward: the first built element by element, the
 * others copied), or read the block rows once and write one row
 * (backward), so the tensors cross memory once.
 *
 * Backward order, per input element: the sum of each of the `scale` block
 * rows (left to right), then those row sums top to bottom, in float; the
 * order is fixed, so results do not depend on the thread count.
 */
#include "backend/cpu/cpu_impl.h"

#include <omp.h>
#include <string.h>

/* Below this many output elements the loops run on the calling thread. */
#define CPU_UP_PAR_MIN 32768

/* Input row x (w) -> `s` output rows of ow = w * s at y, values of `es`
 * bytes (FP32 or bf16: bits copied). */
static inline __attribute__((always_inline)) void up_row_es(const void *xv, void *yv, int64_t w,
                                                            int64_t s, int64_t ow, size_t es)
{
    if (es == 4) {
        const float *x = xv;
        float *y = yv;
        if (s == 2) {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) {
                y[2 * j] = x[j];
                y[2 * j + 1] = x[j];
            }
        } else {
            for (int64_t j = 0; j < w; j++)
                for (int64_t b = 0; b < s; b++) y[j * s + b] = x[j];
        }
    } else {
        const uint16_t *x = xv;
        uint16_t *y = yv;
        for (int64_t j = 0; j < w; j++)
            for (int64_t b = 0; b < s; b++) y[j * s + b] = x[j];
    }
    for (int64_t a = 1; a < s; a++) memcpy((char *)yv + (size_t)(a * ow) * es, yv, (size_t)ow * es);
}

/* `s` rows of ow = w * s at dy -> one row dx (w) of block sums; one body
 * for both storage types (B16_LD, B16_ST: bf16 widened, the sum rounded
 * once). */
static inline __attribute__((always_inline)) void down_row_body(const void *dy, void *dx,
                                                                int64_t w, int64_t s, int64_t ow,
                                                                const bool b16)
{
    if (s == 2) { /* the general order below, unrolled: (a + b) + (c + d) */
#pragma omp simd
        for (int64_t j = 0; j < w; j++)
            B16_ST(dx, j, (B16_LD(dy, 2 * j) + B16_LD(dy, 2 * j + 1)) +
                              (B16_LD(dy, ow + 2 * j) + B16_LD(dy, ow + 2 * j + 1)));
        return;
    }
    for (int64_t j = 0; j < w; j++) {
        float acc = 0.0f;
        for (int64_t a = 0; a < s; a++) {
            float row = 0.0f;
            for (int64_t b = 0; b < s; b++) row += B16_LD(dy, a * ow + j * s + b);
            acc += row;
        }
        B16_ST(dx, j, acc);
    }
}

/* Every input row of `rows` (n c h) forward, or every output row backward,
 * split among the threads by row. */
static inline __attribute__((always_inline)) void up_rows(const void *x, void *y,
                                                          int64_t rows, int64_t w, int64_t s,
                                                          size_t es)
{
    const int64_t ow = w * s;
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++)
        up_row_es((const char *)x + (size_t)(r * w) * es, (char *)y + (size_t)(r * s * ow) * es,
                  w, s, ow, es);
}

static inline __attribute__((always_inline)) void down_rows(const void *dy, void *dx,
                                                            int64_t rows, int64_t w, int64_t s,
                                                            const bool b16)
{
    const int64_t ow = w * s;
    const size_t es = b16 ? sizeof(uint16_t) : sizeof(float);
#pragma omp for schedule(static) /* the team: the caller's GP_CPU_TEAM */
    for (int64_t r = 0; r < rows; r++)
        down_row_body((const char *)dy + (size_t)(r * s * ow) * es, (char *)dx + (size_t)(r * w) * es,
                      w, s, ow, b16);
}

GP_CPU_LOOPS
gp_status gp_cpu_upsample_fwd(gp_device *dev, const float *x, float *y, int64_t n, int64_t c,
                              int64_t h, int64_t w, int64_t scale)
{
    GP_CPU_TEAM(dev->threads, n * c * h * w * scale * scale >= CPU_UP_PAR_MIN)
    up_rows(x, y, n * c * h, w, scale, sizeof(float));
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_upsample_bwd(gp_device *dev, const float *dy, float *dx, int64_t n,
                              int64_t c, int64_t h, int64_t w, int64_t scale)
{
    GP_CPU_TEAM(dev->threads, n * c * h * w * scale * scale >= CPU_UP_PAR_MIN)
    down_rows(dy, dx, n * c * h, w, scale, false);
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_upsample_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale)
{
    GP_CPU_TEAM(dev->threads, n * c * h * w * scale * scale >= CPU_UP_PAR_MIN)
    up_rows(x, y, n * c * h, w, scale, sizeof(uint16_t));
    return GP_OK;
}

GP_CPU_LOOPS
gp_status gp_cpu_upsample_bwd_bf16(gp_device *dev, const uint16_t *dy, uint16_t *dx, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale)
{
    GP_CPU_TEAM(dev->threads, n * c * h * w * scale * scale >= CPU_UP_PAR_MIN)
    down_rows(dy, dx, n * c * h, w, scale, true);
    return GP_OK;
}
