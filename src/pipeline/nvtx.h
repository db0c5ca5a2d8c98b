/*
 * nvtx.h — NVTX ranges for Nsight Systems, header-only.
 *
 * With GPIPE_CUDA defined, gp_nvtx_push/gp_nvtx_pop are NVTX 3 push/pop
 * ranges on the calling thread (<nvtx3/nvToolsExt.h> from the CUDA toolkit,
 * header-only: nothing to link; the calls cost a branch until a tool such
 * as `nsys profile` injects itself).  Without it they are empty inline
 * functions and GP_NVTX_ENABLED is 0, so callers can skip building names.
 *
 * The executor pushes one range per instruction on each worker thread,
 * named as the trace slices (gp_instr_name: "F3 s1", "B3 s1",
 * "R3 s1", "copy a3 s0->s1", "copy g3 s2->s1"); a copy's range includes the
 * time it waited for its source.  scripts/timeline.py reads them back from
 * `nsys export --type sqlite`.
 *
 * Thread safety: NVTX ranges are per thread; any thread may call these.
 */
#ifndef GP_PIPELINE_NVTX_H
#define GP_PIPELINE_NVTX_H

#ifdef GPIPE_CUDA
#include <nvtx3/nvToolsExt.h>

#define GP_NVTX_ENABLED 1

static inline void gp_nvtx_push(const char *name) { nvtxRangePushA(name); }
static inline void gp_nvtx_pop(void) { nvtxRangePop(); }

#else

#define GP_NVTX_ENABLED 0

static inline void gp_nvtx_push(const char *name) { (void)name; }
static inline void gp_nvtx_pop(void) {}

#endif /* GPIPE_CUDA */

#endif /* GP_PIPELINE_NVTX_H */
