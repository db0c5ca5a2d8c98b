/*
 * rng.c — Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11): a counter-based generator, so a random value is a pure
 * function of (key, counter) and never of thread timing or call order.
 * The rounds live in core/philox.h, shared with the CUDA dropout kernel.
 */
#include "core/core.h"
#include "core/philox.h"

#include <math.h>
#include <omp.h>

/* Fills of at least this many values run on OpenMP's threads (every core,
 * or OMP_NUM_THREADS): each value is a function of its index alone, so any
 * split gives the same values (a Llama 3 8B's fresh weights are 8e9
 * normals: minutes on one core).  Under ThreadSanitizer one thread:
 * libgomp is not instrumented, so its barriers are invisible there and
 * the fill reads as a race with the caller's reads after it (CI's
 * ThreadSanitizer stage reported exactly that). */
#define RNG_PAR_MIN ((int64_t)1 << 16)
#define RNG_CHUNK ((int64_t)1 << 14)

static int rng_threads(int64_t n)
{
#if defined(__SANITIZE_THREAD__)
    (void)n;
    return 1;
#else
    if (n < RNG_PAR_MIN) return 1;
    int c = omp_get_max_threads();
    return c > 1 ? c : 1;
#endif
}

gp_philox_out gp_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo)
{
    gp_philox_out o;
    gp_philox4x32_block(key, ctr_hi, ctr_lo, o.v);
    return o;
}

float gp_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return gp_philox_uniform(seed, stream, index);
}

/* out[0 .. n) = values first .. first + n - 1 of the stream. */
static void uniform_run(uint64_t seed, uint64_t stream, uint64_t first, float *out, int64_t n)
{
    int64_t i = 0;
    while (i < n) {
        uint64_t idx = first + (uint64_t)i;
        uint32_t o[4];
        gp_philox4x32_block(seed, stream, idx >> 2, o);
        for (unsigned lane = (unsigned)(idx & 3); lane < 4 && i < n; lane++, i++)
            out[i] = gp_philox_unit(o[lane]);
    }
}

void gp_rng_uniform_fill(uint64_t seed, uint64_t stream, uint64_t first,
                         float *out, int64_t n)
{
    int nt = rng_threads(n);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t c = 0; c < n; c += RNG_CHUNK)
        uniform_run(seed, stream, first + (uint64_t)c, out + c,
                    n - c < RNG_CHUNK ? n - c : RNG_CHUNK);
}

double gp_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint32_t o[4];
    gp_philox4x32_block(seed, stream, index >> 1, o);
    unsigned lane = (unsigned)(index & 1) * 2;
    /* u1 in (0, 1]: log never sees 0; u2 in [0, 1) */
    double u1 = ((double)o[lane] + 1.0) * (1.0 / 4294967296.0);
    double u2 = (double)o[lane + 1] * (1.0 / 4294967296.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

void gp_rng_normal_fill(uint64_t seed, uint64_t stream, uint64_t first, float *out, int64_t n)
{
    int nt = rng_threads(n);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)gp_rng_normal(seed, stream, first + (uint64_t)i);
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
