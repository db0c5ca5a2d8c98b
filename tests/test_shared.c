/*
 * test_shared.c — the code the CUDA backend shares with the CPU, checked on
 * the CPU (the CUDA kernels compile the very same static inline functions,
 * so this is the only place their arithmetic runs here):
 *   - core/philox.h: the inline Philox equals core/rng.c's API element by
 *     element, on both sides of every 4-word block boundary;
 *   - backend/elementwise.h: the batch-norm conversions the CUDA backend
 *     adds (biased from unbiased variance, inverse standard deviation)
 *     against double-precision formulas, and that they agree with the CPU
 *     backend's own statistics;
 *   - the interface's fallbacks for the optional collective slots: on the
 *     CPU (no all-reduce until data parallelism) they fail with
 *     GP_ERR_UNSUPPORTED and say so.
 */
#include "backend/backend.h"
#include "backend/elementwise.h"
#include "core/philox.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

static void test_philox(void)
{
    int same = 1;
    for (uint64_t first = 0; first < 9; first++) {
        float fill[23];
        gp_rng_uniform_fill(42, 7, first, fill, 23);
        for (uint64_t i = 0; i < 23; i++) {
            float u = gp_philox_uniform(42, 7, first + i);
            same &= u == fill[i] && u == gp_rng_uniform(42, 7, first + i);
            same &= u >= 0.0f && u < 1.0f;
        }
    }
    CHECK_MSG(same, "gp_philox_uniform differs from gp_rng_uniform / gp_rng_uniform_fill");
    uint32_t o[4];
    gp_philox4x32_block(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull, o);
    gp_philox_out r = gp_philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull,
                                    0x85a308d3243f6a88ull);
    CHECK(o[0] == r.v[0] && o[1] == r.v[1] && o[2] == r.v[2] && o[3] == r.v[3]);
    /* Random123's known answer for Philox4x32-10, pi digits (kat_vectors). */
    CHECK(o[0] == 0xd16cfe09u && o[1] == 0x94fdccebu && o[2] == 0x5001e420u &&
          o[3] == 0x24126ea1u);
    /* the dropout mask of one element, as the CUDA kernel computes it */
    float u = gp_philox_uniform(5, 6, 1001);
    CHECK(gp_ew_dropout(u, 0.25f) == (u >= 0.25f ? 1.0f / 0.75f : 0.0f));
}

static void test_bn_conversions(void)
{
    /* biased = unbiased * (cnt - 1) / cnt, cnt 1 -> 0 */
    const double cnts[] = {1, 2, 3, 7, 64, 1000, 1e6};
    for (size_t i = 0; i < sizeof cnts / sizeof cnts[0]; i++)
        for (float v = 0.0f; v < 50.0f; v = v * 3.0f + 0.37f) {
            double ref = cnts[i] > 1 ? (double)v * (cnts[i] - 1) / cnts[i] : 0.0;
            CHECK_NEAR(gp_ew_bn_biased_var(v, cnts[i]), ref, 0, 1e-7);
        }
    for (float var = 0.0f; var < 1e4f; var = var * 5.0f + 1e-3f) {
        const float eps[] = {1e-5f, 1e-3f, 0.1f};
        for (int e = 0; e < 3; e++)
            CHECK_NEAR(gp_ew_bn_invstd(var, eps[e]), 1.0 / sqrt((double)var + (double)eps[e]), 0,
                       1e-7);
    }
    /* The coefficients from the inverse std equal gp_ew_bn_coeffs'. */
    float scale, shift;
    gp_ew_bn_coeffs(0.25f, 2.0f, 1e-5f, 1.5f, -0.5f, &scale, &shift);
    CHECK_NEAR(scale, 1.5 * gp_ew_bn_invstd(2.0f, 1e-5f), 0, 1e-7);

    /* On a real batch: the CPU backend's biased variance, made unbiased the
     * way cuDNN reports it, round-trips through gp_ew_bn_biased_var. */
    gp_device *dev = NULL;
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    if (!dev) return;
    const int64_t n = 5, c = 3, s = 7;
    const double cnt = (double)(n * s);
    float *x = malloc(sizeof(float) * (size_t)(n * c * s)), *y = malloc(sizeof(float) * (size_t)(n * c * s));
    float mean[3], var[3];
    for (int64_t i = 0; i < n * c * s; i++) x[i] = (float)((i * 37) % 11) * 0.3f - 1.0f;
    gp_bn_desc d = {n, c, s, 1e-5f, 0, false, NULL, NULL};
    CHECK_OK(gp_dev_bn_fwd_train(dev, &d, x, NULL, NULL, y, mean, var));
    for (int64_t ch = 0; ch < c; ch++) {
        double m, ss;
        gpt_bn_moments(x, n, c, s, ch, &m, &ss);
        float unbiased = (float)(ss / (cnt - 1));
        CHECK_NEAR(gp_ew_bn_biased_var(unbiased, cnt), var[ch], 0, 1e-6);
    }
    free(x);
    free(y);
    gp_device_close(dev);
}

static void test_collective_fallbacks(void)
{
    gp_device *a = NULL, *b = NULL;
    gp_device_opts o = {.threads = 1};
    CHECK_OK(gp_device_open("cpu:0", &o, &a));
    CHECK_OK(gp_device_open("cpu:1", &o, &b));
    if (!a || !b) return;
    gp_device *devs[2] = {a, b};
    gp_comm *comm = (gp_comm *)1;
    /* The CPU backend has collectives (cpu_comm.c, tested in test_replicas). */
    CHECK_OK(gp_comm_create(devs, 2, &comm));
    CHECK(comm != NULL && comm != (gp_comm *)1);
    if (comm != (gp_comm *)1) gp_comm_destroy(comm);
    CHECK_ERR(gp_comm_create(devs, 0, &comm), GP_ERR_INVALID, "at least one device");
    /* A backend without the optional slots: the wrappers refuse. */
    gp_device_iface bare = *a->iface;
    bare.allreduce = NULL;
    bare.broadcast = NULL;
    bare.bn_stats = NULL;
    gp_device fake = {.iface = &bare, .kind = GP_DEV_CPU};
    snprintf(fake.name, sizeof fake.name, "fake:0");
    float v = 1.0f;
    CHECK_ERR(gp_dev_allreduce(&fake, NULL, &v, 1), GP_ERR_UNSUPPORTED, "no all-reduce");
    CHECK_ERR(gp_dev_broadcast(&fake, NULL, &v, 1, 0), GP_ERR_UNSUPPORTED, "no broadcast");
    gp_bn_desc bd = {1, 1, 1, 1e-5f, 0, false, NULL, NULL};
    CHECK_ERR(gp_dev_bn_stats(&fake, &bd, &v, &v, &v), GP_ERR_UNSUPPORTED, "synchronised");
    gp_device_close(a);
    gp_device_close(b);
}

int main(void)
{
    test_philox();
    test_bn_conversions();
    test_collective_fallbacks();
    return gpt_finish("test_shared");
}
