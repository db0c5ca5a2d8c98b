/*
 * philox.h — Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11) as static inline functions over plain integers, shared
 * by the host (core/rng.c) and the CUDA dropout kernel, so both draw the
 * very same bits for the same (key, counter).
 *
 * Nothing here touches a global or calls a library; compiled by nvcc the
 * functions are `__host__ __device__`, by a C compiler plain `static inline`.
 * The host copy is what tests/test_core.c checks against the published
 * known-answer vectors.
 */
#ifndef GP_PHILOX_H
#define GP_PHILOX_H

#include <stdint.h>

#ifndef GP_PHILOX_FN
#ifdef __CUDACC__
#define GP_PHILOX_FN __host__ __device__ static inline
#else
#define GP_PHILOX_FN static inline
#endif
#endif

#define GP_PHILOX_M0 0xD2511F53u
#define GP_PHILOX_M1 0xCD9E8D57u
#define GP_PHILOX_W0 0x9E3779B9u
#define GP_PHILOX_W1 0xBB67AE85u

/* The four output words of one block: out[0..3]. */
GP_PHILOX_FN void gp_philox4x32_block(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo,
                                      uint32_t out[4])
{
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32);
    uint32_t c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)GP_PHILOX_M0 * (uint64_t)c0;
        uint64_t p1 = (uint64_t)GP_PHILOX_M1 * (uint64_t)c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += GP_PHILOX_W0;
        k1 += GP_PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* 24 high bits -> float in [0, 1): exact, never 1.0. */
GP_PHILOX_FN float gp_philox_unit(uint32_t v) { return (float)(v >> 8) * (1.0f / 16777216.0f); }

/* Uniform float in [0, 1) for element `index` of stream (seed, stream):
 * word index & 3 of the block at counter (stream, index >> 2). */
GP_PHILOX_FN float gp_philox_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint32_t o[4];
    gp_philox4x32_block(seed, stream, index >> 2, o);
    return gp_philox_unit(o[index & 3]);
}

#endif /* GP_PHILOX_H */
