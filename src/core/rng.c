/*
 * rng.c — Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11): a counter-based generator, so a random value is a pure
 * function of (key, counter) and never of thread timing or call order.
 */
#include "core/core.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

gp_philox_out gp_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo)
{
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32);
    uint32_t c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    gp_philox_out o = {{c0, c1, c2, c3}};
    return o;
}

/* 24 high bits -> float in [0, 1): exact, never 1.0. */
static inline float u32_to_unit(uint32_t v) { return (float)(v >> 8) * (1.0f / 16777216.0f); }

float gp_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    gp_philox_out o = gp_philox4x32(seed, stream, index >> 2);
    return u32_to_unit(o.v[index & 3]);
}

void gp_rng_uniform_fill(uint64_t seed, uint64_t stream, uint64_t first,
                         float *out, int64_t n)
{
    int64_t i = 0;
    while (i < n) {
        uint64_t idx = first + (uint64_t)i;
        gp_philox_out o = gp_philox4x32(seed, stream, idx >> 2);
        for (unsigned lane = (unsigned)(idx & 3); lane < 4 && i < n; lane++, i++)
            out[i] = u32_to_unit(o.v[lane]);
    }
}

static inline uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t gp_rng_stream(uint64_t a, uint64_t b, uint64_t c)
{
    return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}
