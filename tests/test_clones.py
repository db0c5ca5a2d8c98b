#!/usr/bin/python3
"""test_clones.py — every OpenMP parallel region of gpipe's CPU loops is
built for the instruction sets GP_CPU_LOOPS names (issue 76).

GCC outlines a `#pragma omp parallel` region into a function of its own
(NAME._omp_fn.N) before it makes a GP_CPU_LOOPS function's clones, so a
region written in a static always_inline helper is outlined once, for the
baseline (SSE2), and every clone calls that: until d34cf17 the layer and
RMS norms, RoPE, embeddings, bias sums, dropout and upsampling ran so on
every processor.  The regions are opened with GP_CPU_TEAM in the cloned
function since (cpu_impl.h).  This test reads libgpipe.a's symbols with
nm and fails, naming it, on any outlined region that has no clones
(NAME._omp_fn.N without NAME._omp_fn.N.default beside it), except those
listed below with the reason their work is cloned elsewhere.

Skips (exit 77) in a build without clones (GPIPE_ISA_CLONES=0, the
sanitizer and fuzz builds, another compiler): nothing to check there.
Needs GPIPE_BINARY_DIR (set by CTest).  Prints "test_clones: N passed, N
failed" last.
"""
import os
import re
import subprocess
import sys

from gpt_util import check, finish

# Outlined regions that run no arithmetic of their own, each with where
# their arithmetic is (a GP_CPU_LOOPS function they call per unit).
UNCLONED_OK = {
    "gp_cpu_attn_fwd": "calls gp_cpu_att_fwd_w8 / _w16 (clones and an explicit width)",
    "gp_cpu_attn_fwd_bf16": "the same kernels",
    "gp_cpu_attn_bwd": "calls gp_cpu_att_bwd_w8 / _w16",
    "gp_cpu_attn_bwd_bf16": "the same kernels",
    "gp_cpu_attn_cached": "calls gp_cpu_att_cached_w8 / _w16",
    "gp_cpu_bn_fwd_train": "per-channel bodies are GP_CPU_LOOPS (cpu_bn.c)",
    "gp_cpu_bn_fwd_train_bf16": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_bn_fwd_infer": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_bn_fwd_infer_bf16": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_bn_bwd": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_bn_bwd_bf16": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_bn_bwd_sums": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_bn_bwd_apply": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_bn_stats": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_norm_leaky_bwd": "per-channel bodies are GP_CPU_LOOPS",
    "gp_cpu_norm_leaky_bwd_bf16": "per-channel bodies are GP_CPU_LOOPS",
    "pool_planes_run": "per-plane bodies are GP_CPU_LOOPS (cpu_pool.c)",
    "pool_bf16": "per-plane bodies are GP_CPU_LOOPS",
    "swiglu_run": "per-row-range bodies are GP_CPU_LOOPS (swiglu_rows)",
    "gelu_run": "per-range bodies are GP_CPU_LOOPS (gelu_span)",
    "gp_cpu_zero_many": "memset per tensor",
    "reduce_own_chunk": "the collectives' sums: memory-bound, one add a load (cpu_comm.c)",
    "gp_cpu_sharded_sgd": "the replicas' fused update: memory-bound (cpu_comm.c)",
    "gp_rng_uniform_fill": "the counter-based generator (src/core), not a CPU loop",
    "gp_rng_normal_fill": "the counter-based generator (src/core)",
}


def main():
    lib = os.path.join(os.environ["GPIPE_BINARY_DIR"], "libgpipe.a")
    out = subprocess.run(["nm", "--defined-only", lib], capture_output=True, text=True)
    check(out.returncode == 0, "nm %s: %s" % (lib, out.stderr.strip()))
    syms = set(line.split()[-1] for line in out.stdout.splitlines() if len(line.split()) >= 3)
    if not any(s.endswith(".resolver") for s in syms):
        print("test_clones: skipped: this build makes no clones (GPIPE_ISA_CLONES 0, a "
              "sanitizer or fuzz build, or not GCC on x86-64)")
        sys.exit(77)
    regions = sorted(s for s in syms if re.fullmatch(r"[A-Za-z_0-9]+\._omp_fn\.[0-9]+", s))
    check(len(regions) > 50, "only %d outlined regions in %s" % (len(regions), lib))
    cloned = 0
    for r in regions:
        fn = r.split("._omp_fn.")[0]
        if r + ".default" in syms:
            cloned += 1
            check(True, r)
        else:
            check(fn in UNCLONED_OK,
                  "%s: a parallel region built for the baseline only (SSE2) on every processor; "
                  "open it with GP_CPU_TEAM in the GP_CPU_LOOPS function (cpu_impl.h)" % r)
    # the helpers fixed in d34cf17, by name: their regions are now their callers'
    for helper in ("ln_fwd", "add_ln_fwd", "ln_bwd_data", "ln_bwd_weights", "rms_fwd",
                   "rms_bwd_data", "rms_bwd_weights", "rope_rows", "embed_fwd", "embed_bwd",
                   "sum_rows_to", "dropout_apply", "mul_rows", "up_rows", "down_rows"):
        check(not any(r.startswith(helper + "._omp_fn.") for r in regions),
              "%s has a parallel region of its own again (outlined before the clones)" % helper)
    for name in UNCLONED_OK:
        check(not any(r.startswith(name + "._omp_fn.") and r + ".default" in syms
                      for r in regions), "%s is cloned now: take it off UNCLONED_OK" % name)
    print("test_clones: %d regions, %d cloned" % (len(regions), cloned))
    sys.exit(finish("test_clones"))


if __name__ == "__main__":
    main()
