#!/usr/bin/python3
"""test_plans.py — `gpipe-train --dry-run` plans every config of configs/ and
bench/ on any x86-64 processor (issue 76: on one without bf16 instructions
a bf16 plan died of SIGSEGV, since nobody had planned there).

  (a) every config at every precision (fp32, bf16, tf32), alone and with
      --gpu h100 (and once with --gpu h200), on this processor and capped
      by the one switch (GPIPE_CPU_ISA=avx2: AVX2 without bf16, as an AMD Zen 3;
      =sse41: no AVX at all): exit 0, no signal, the whole summary (its
      model:, total: and processor: lines, the roofline's floor with
      --gpu); the model's figures (the total: and language model: lines)
      the same as this processor's;
  (b) where the instruction set has no bf16, a bf16 plan says that this
      machine cannot run it and that the plan is for one that can, naming
      fp32 as the way out; where it has bf16, no such note;
  (c) a GPU plan from a machine without the GPU (pipeline.devices
      cuda:0, cuda:1; it also crashed): exit 0, the devices named as not
      available here, the same figures;
  (d) a run (not a plan) in bf16 under the cap stops at start-up with that
      reason and a non-zero exit, not a signal;
  (e) the processor: line names the cap, and what the loops run.

With GPIPE_TEST_WRAP set (CI: "qemu-x86_64 -cpu Haswell", "-cpu
Nehalem"), the configs' plans at each precision also run under that
command, a processor whose cpuid has no AVX-512 (or no AVX), and are
compared with this processor's the same way.

Needs GPIPE_BINARY_DIR (set by CTest) and GPIPE_SOURCE_DIR.  Prints
"test_plans: N passed, N failed" last; exits non-zero on any failure.
"""
import glob
import os
import shlex
import subprocess
import sys

from gpt_util import check, finish

SRC = os.environ.get("GPIPE_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build")),
                   "gpipe-train")
WRAP = shlex.split(os.environ.get("GPIPE_TEST_WRAP", ""))


def run(args, env_extra=None, wrap=()):
    env = dict(os.environ)  # CI's AVX2 pass sets GPIPE_CPU_ISA for every test
    env.update(env_extra or {})
    r = subprocess.run(list(wrap) + [BIN] + args, cwd=SRC, env=env, capture_output=True,
                       text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def lines(out, prefix):
    return [l for l in out.splitlines() if l.startswith(prefix)]


def figures(out):
    """The model's figures, which no processor may change."""
    return lines(out, "total:") + lines(out, "language model:")


def params_flops(out):
    """The parameters and FLOPs of the total: line (its activation bytes
    count the device's own pooling workspaces: another backend's differ)."""
    return [l.split(" MFLOP forward per batch")[0] for l in lines(out, "total:")]


def plan(cfg, prec, gpu, env_extra=None, wrap=(), extra=()):
    args = [cfg, "--dry-run", "--set", "train.precision=" + prec] + list(extra)
    if gpu:
        args += ["--gpu", gpu]
    return run(args, env_extra, wrap)


def isa_of(out):
    """The instruction set the processor: line says CPU devices compute in."""
    p = lines(out, "processor: CPU devices compute in ")
    return p[0][len("processor: CPU devices compute in "):].split(";")[0].split(" (")[0] \
        if p else None


def check_plan(name, rc, out, prec, gpu, native_out):
    if not check(rc == 0, "%s: exit %d (a signal if negative):\n%s" % (name, rc, out[-2000:])):
        return
    check(lines(out, "model:") and lines(out, "total:"), "%s: no model:/total: line" % name)
    if gpu:
        check(("roofline on one %s" % gpu) in out and lines(out, "  step "),
              "%s: no roofline floor with --gpu %s" % (name, gpu))
    if native_out is not None:
        check(figures(out) == figures(native_out),
              "%s: figures differ from this processor's:\n  %s\n  %s"
              % (name, figures(out), figures(native_out)))
    isa = isa_of(out)
    note = "cannot run this config on this machine"
    if isa is None:  # no CPU device in the config (cuda:N): nothing to say
        check(not lines(out, "processor:"), "%s: a processor: line it cannot parse" % name)
        return
    if prec == "bf16" and "bf16" not in isa:
        check(note in out and "the plan below is for a processor that can" in out
              and "use train.precision: fp32" in out,
              "%s: a bf16 plan on %s says nothing of it:\n%s" % (name, isa, out[:1500]))
    else:
        check(note not in out, "%s: a note that %s can run on %s:\n%s"
              % (name, prec, isa, out[:1500]))


def main():
    configs = sorted(glob.glob(os.path.join(SRC, "configs", "*.yaml")) +
                     glob.glob(os.path.join(SRC, "bench", "*.yaml")))
    check(len(configs) >= 15, "%d configs found in configs/ and bench/" % len(configs))
    # Wrapped (CI's QEMU stage), the native matrix has already run in the
    # suite: only the plans to compare with.  h200 is h100's code with other
    # peaks: once, uncapped.
    caps = [None] if WRAP else [None, "avx2", "sse41"]
    plans = 0
    for cfg in configs:
        rel = os.path.relpath(cfg, SRC)
        for prec in ("fp32", "bf16", "tf32"):
            native = None
            for gpu in (None,) if WRAP else (None, "h100", "h200"):
                for cap in caps if gpu != "h200" else [None]:
                    env = {"GPIPE_CPU_ISA": cap} if cap else None
                    rc, out = plan(rel, prec, gpu, env)
                    plans += 1
                    name = "%s %s%s%s" % (rel, prec, " --gpu " + gpu if gpu else "",
                                          " GPIPE_CPU_ISA=" + cap if cap else "")
                    check_plan(name, rc, out, prec, gpu, native)
                    if cap is None and gpu is None:
                        native = out
                    if cap and rc == 0 and isa_of(out):
                        want = {"avx2": "AVX2", "sse41": "SSE4.1"}[cap]
                        check(isa_of(out) == want and "(GPIPE_CPU_ISA caps it)" in out,
                              "%s: processor line %r, want %s capped" % (name, isa_of(out), want))
            if WRAP:
                rc, out = plan(rel, prec, None, wrap=WRAP)
                plans += 1
                check_plan("%s %s under %s" % (rel, prec, " ".join(WRAP)), rc, out, prec, None,
                           native)
    if WRAP:
        print("test_plans: %d plans made" % plans)
        return finish("test_plans")
    # (c) GPU devices that this machine does not have
    for rel in ("configs/gpt2.yaml", "configs/tiny-gpt.yaml", "configs/default.yaml",
                "configs/llama-tiny.yaml"):
        for prec in ("fp32", "bf16"):
            _, native = plan(rel, prec, None, extra=("--set", "pipeline.devices=[cpu:0, cpu:1]",
                                                     "--set", "pipeline.balance=null"))
            rc, out = plan(rel, prec, "h100", extra=("--set", "pipeline.devices=[cuda:0, cuda:1]",
                                                     "--set", "pipeline.balance=null"))
            plans += 1
            name = "%s %s on cuda:0, cuda:1" % (rel, prec)
            if check(rc == 0, "%s: exit %d:\n%s" % (name, rc, out[-2000:])):
                check("cuda:0, cuda:1 are not available here" in out,
                      "%s: the GPUs not named as missing:\n%s" % (name, out[:1500]))
                check(params_flops(out) and params_flops(out) == params_flops(native),
                      "%s: figures differ: %s, %s" % (name, params_flops(out),
                                                     params_flops(native)))
    # (d) a bf16 run where the cap has no bf16: refused at start-up
    rc, out = run(["configs/default.yaml", "--set", "train.precision=bf16", "--set",
                   "train.steps=1"], {"GPIPE_CPU_ISA": "avx2"})
    check(rc > 0 and "precision bf16 needs a processor with bf16 instructions" in out
          and "CPU devices run AVX2 here (GPIPE_CPU_ISA caps it)" in out
          and "use train.precision: fp32" in out,
          "a bf16 run under GPIPE_CPU_ISA=avx2: exit %d:\n%s" % (rc, out[-1500:]))
    # (e) a bad switch is refused, naming the words it takes (it was warned
    # of and the processor's set used: a benchmark "capped" by a typo ran
    # on every instruction the processor has)
    rc, out = plan("configs/default.yaml", "fp32", None, {"GPIPE_CPU_ISA": "avx3"})
    check(rc == 2 and "environment variable GPIPE_CPU_ISA='avx3': not one of sse41, avx2, "
          "avx512, avx512_bf16, amx, native" in out,
          "GPIPE_CPU_ISA=avx3: exit %d:\n%s" % (rc, out[-1500:]))
    print("test_plans: %d plans made" % plans)
    return finish("test_plans")


if __name__ == "__main__":
    sys.exit(main())
