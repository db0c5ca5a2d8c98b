/*
 * cpu_attention_w16.c — the attention kernels with 16-float vectors, for
 * processors with AVX-512 (zmm: 32 registers hold a block's 16 to 20
 * accumulators); cpu_attention.c picks them there.  Built where the
 * compiler makes AVX-512 clones (GP_ISA_CLONES 4); elsewhere the names
 * call the 8-wide kernels.
 */
#if defined(GP_ISA_CLONES) && GP_ISA_CLONES == 4
#define ATT_V 16
#define ATT_TV 4 /* a whole tile of 64 keys a pass */
#define ATT_RV 2
#define ATT_AV 4
#define ATT_NAME(x) x##_w16
#define ATT_TARGET __attribute__((target("arch=x86-64-v4")))
#include "backend/cpu/cpu_attention_body.h"
bool gp_cpu_att_w16_built(void) { return true; }
#else
/* No AVX-512 clones in this build: the names stand for the 8-wide kernels
 * (the same bits), which cpu_attention.c calls anyway. */
#include "backend/cpu/cpu_attention.h"

bool gp_cpu_att_w16_built(void) { return false; }

void gp_cpu_att_fwd_w16(const att_dims *a, const void *x, void *y, float *lse, int64_t bi,
                        int64_t h, float *buf, bool b16)
{
    gp_cpu_att_fwd_w8(a, x, y, lse, bi, h, buf, b16);
}

void gp_cpu_att_bwd_w16(const att_dims *a, const void *x, const void *y, const float *lse,
                        const void *dy, void *dx, int64_t bi, int64_t g, float *buf, bool b16)
{
    gp_cpu_att_bwd_w8(a, x, y, lse, dy, dx, bi, g, buf, b16);
}

void gp_cpu_att_cached_w16(const att_dims *a, const att_src *src, float *buf, bool b16)
{
    gp_cpu_att_cached_w8(a, src, buf, b16);
}
#endif
