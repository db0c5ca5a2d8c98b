/*
 * cpu_isa.c — the one switch for the instruction set CPU devices use.
 *
 * Every choice gpipe makes from the processor reads gp_cpu_isa_has, which
 * asks oneDNN's effective instruction set (its cpuid, capped): whether bf16
 * can run (avx512_bf16 or AMX), the blocked layout convolutions keep
 * (nChw16c with AVX-512, nChw8c with AVX2), the attention kernels' width
 * (16 floats with AVX-512, else 8), the transposed short wide products
 * (cpu_math.c's wide_nt_worth) and the AMX products' plain weights.
 * Nothing else in the library asks cpuid, so one cap moves all of them
 * with oneDNN's own kernels:
 *
 *   GPIPE_CPU_ISA=sse41|avx2|avx512|avx512_bf16|amx|native
 *
 * at most that set (never more than the processor has); unset or native:
 * the processor's, capped by oneDNN's own ONEDNN_MAX_CPU_ISA where that is
 * set.  It is applied once, before the library's first oneDNN call (the
 * first CPU device opened, or the first question asked here): oneDNN fixes
 * its set at its first kernel.  A bad value is warned about and ignored.
 *
 * The one choice it cannot move is the compiler's: gpipe's own loops
 * (GP_CPU_LOOPS, cpu_impl.h) are target clones that the dynamic loader
 * picks by cpuid when the library loads.  Every clone gives the same bits
 * (no contraction, fixed reduction orders), so only speed differs; a build
 * with -DGPIPE_ISA_CLONES=3 has no AVX-512 clones (what CI's AVX2 pass
 * builds), and gp_cpu_loops_isa says which clones run.
 */
#include "backend/cpu/cpu_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    dnnl_cpu_isa_t isa;
    const char *label;
} k_isas[] = {
    {"sse41", dnnl_cpu_isa_sse41, "SSE4.1"},
    {"avx2", dnnl_cpu_isa_avx2, "AVX2"},
    {"avx512", dnnl_cpu_isa_avx512_core, "AVX-512"},
    {"avx512_bf16", dnnl_cpu_isa_avx512_core_bf16, "AVX-512 + bf16"},
    {"amx", dnnl_cpu_isa_avx512_core_amx, "AVX-512 + bf16 + AMX"},
};
#define N_ISAS ((int)(sizeof k_isas / sizeof *k_isas))

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static int isa_cap = -1; /* index into k_isas asked by GPIPE_CPU_ISA, -1: none */

static void isa_apply(void)
{
    const char *e = getenv("GPIPE_CPU_ISA");
    if (!e || !*e || !strcmp(e, "native")) return;
    for (int q = 0; q < N_ISAS; q++) {
        if (strcmp(e, k_isas[q].name)) continue;
        isa_cap = q;
        if (dnnl_set_max_cpu_isa(k_isas[q].isa) != dnnl_success)
            GP_WARN("GPIPE_CPU_ISA=%s: oneDNN had already chosen its instruction set (another "
                    "part of this program called it first); its kernels keep that set, "
                    "gpipe's own choices follow %s", e, k_isas[q].label);
        return;
    }
    GP_WARN("GPIPE_CPU_ISA='%s' is not one of sse41, avx2, avx512, avx512_bf16, amx or "
            "native; using the processor's instruction set", e);
}

void gp_cpu_isa_init(void) { pthread_once(&isa_once, isa_apply); }

bool gp_cpu_isa_has(dnnl_cpu_isa_t want)
{
    gp_cpu_isa_init();
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    if (isa_cap >= 0) isa &= (unsigned)k_isas[isa_cap].isa; /* where oneDNN refused the cap */
    return (isa & (unsigned)want) == (unsigned)want;
}

const char *gp_cpu_isa_name(void)
{
    const char *name = "x86-64 baseline (below SSE4.1)";
    for (int q = 0; q < N_ISAS; q++)
        if (gp_cpu_isa_has(k_isas[q].isa)) name = k_isas[q].label;
    return name;
}

const char *gp_cpu_isa_switch(void)
{
    gp_cpu_isa_init();
    if (isa_cap >= 0) return "GPIPE_CPU_ISA";
    const char *o = getenv("ONEDNN_MAX_CPU_ISA");
    if (!o || !*o) o = getenv("DNNL_MAX_CPU_ISA");
    return o && *o && strcasecmp(o, "ALL") ? "ONEDNN_MAX_CPU_ISA" : NULL;
}
