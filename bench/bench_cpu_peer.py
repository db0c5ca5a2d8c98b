#!/usr/bin/python3
"""bench_cpu_peer.py - gpipe's training step on one CPU device against
PyTorch's on the same model, batch and thread count, in one run.

  bench/bench_cpu_peer.py [--isa native|avx2] [--threads 2] [--steps 15]
                          [--repeat 3] [--precision fp32|bf16] [--bin build]
                          [--activations auto|fp32|bf16]
                          [--optimizer config|sgd|adamw] [CONFIG.yaml ...]

For each config (default bench/convnet.yaml and bench/mlp.yaml; also
bench/resnet18-32.yaml, bench/resnet50-64.yaml, bench/unet-64.yaml):
  gpipe:   build/bench_step --steps-only (whole steps back to back on a
           random batch: forward, loss, backward, SGD momentum)
  PyTorch: the same model (bench_gpu_peer.py's twins: the layers as
           torch.nn.Sequential, relus in place, `residual` as torchvision's
           BasicBlock, `resnet` as torchvision's, `unet` as torchgpipe's
           U-Net; the same parameter counts),
           torch.set_num_threads(--threads), SGD momentum 0.9, a random
           batch, zero_grad(set_to_none=True), forward, loss, backward, step
--optimizer adamw: both sides train with AdamW (lr 0.001, PyTorch's
betas, eps and weight decay 0.01; gpipe gets a copy of the config with
train.optimizer replaced, PyTorch torch.optim.AdamW, foreach left to its
default); sgd: SGD momentum 0.9; config (default): the config's optimizer.
--precision bf16: gpipe's device in train.precision bf16 (convolutions on
bf16 operands, FP32 sums and tensors), PyTorch's forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (its bf16 mixed precision:
convolutions and linear layers in bf16, activations kept in bf16).
--activations: gpipe's train.activations (auto: its rule, bf16 under
precision bf16); fp32 keeps bf16 products on FP32 tensors.
Median step of --steps after 3 warm-ups; --repeat runs of each,
alternating, so drift on a shared machine hits both; the medians are
reported as samples/s with the ratio gpipe / PyTorch, and the processor.

--isa avx2 runs both sides as an AVX2-only processor would: oneDNN (both
gpipe's and PyTorch's mkldnn) limited by ONEDNN_MAX_CPU_ISA=AVX2, OpenBLAS
by OPENBLAS_CORETYPE=Haswell, MKL (PyPI torch's products) by
MKL_ENABLE_INSTRUCTIONS=AVX2, ATen's vectorised kernels by
ATEN_CPU_CAPABILITY=avx2, and gpipe's own loops (built in AVX-512, AVX2
and baseline versions, picked at load time) from a build that stops at
AVX2 (--bin of a build with -DGPIPE_ISA_CLONES=3; the script refuses a
build whose loops run AVX-512). This limits instruction sets,
not caches or memory bandwidth: the table says it was emulated. --isa
native gives OpenBLAS the AVX-512 kernel where its own detection misses
the processor (native_blas_core).

Debian's interpreter on purpose: torch is python3-torch. Its linear layers
need libopenblas0-pthread (scripts/install-deps.sh --bench installs it);
with the reference BLAS they run 40x slower and the comparison means
nothing, so the script refuses to run on it.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import bench_gpu_peer  # the PyTorch twins of the configs' layers
from bench_loader import cpu_flags, cpu_name  # the processor line every CPU table carries

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

AVX2_ENV = {"GPIPE_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
            "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2"}  # the last: PyPI torch's products are MKL's


def native_blas_core():
    """OpenBLAS's kernel for this processor, where its own detection falls
    short: Debian 12's OpenBLAS 0.3.21 does not know AMD's Zen 4 and 5 and
    runs its Haswell (AVX2) kernels on them, 1.5x slower on bench/mlp.yaml
    than its AVX-512 ones (measured on an EPYC with avx512_bf16: 340-440 ms
    a step against 233-246). A fair peer gets the kernel its processor can
    run, whatever OPENBLAS_CORETYPE the environment had (this project's
    machines export OPENBLAS_CORETYPE=Haswell; the banner shows both)."""
    _, flags = cpu_flags()
    if "avx512_bf16" in flags:
        return "Cooperlake"
    if "avx512f" in flags and "avx512vl" in flags:
        return "SkylakeX"
    return None


def blas_check():
    """The BLAS that torch's products run on, for the header line: "mkl"
    where the wheel carries MKL (PyPI's), else libblas.so.3's folder (e.g.
    "openblas-pthread"), whose reference build is refused."""
    import torch
    if torch.backends.mkl.is_available():
        return "mkl"
    try:
        real = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    except OSError:
        real = "?"
    if "openblas" not in real:
        sys.exit("bench_cpu_peer: libblas.so.3 is %s, not OpenBLAS: PyTorch's linear layers "
                 "would run on the reference BLAS (40x slower). Install libopenblas0-pthread "
                 "(scripts/install-deps.sh --bench)." % real)
    return os.path.basename(os.path.dirname(real))


def torch_step_ms(cfg, threads, steps, precision="fp32"):
    import contextlib
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(5)
    model, classes = bench_gpu_peer.torch_model(cfg)  # one twin for both peers
    batch = cfg["train"]["batch_size"]
    opt = cfg["train"].get("optimizer", {})
    if isinstance(opt, str):
        opt = {"type": opt}
    if opt.get("type", "sgd") == "adamw":
        sgd = torch.optim.AdamW(model.parameters(), lr=opt.get("lr", 0.001),
                                weight_decay=opt.get("weight_decay", 0.01))
    else:
        sgd = torch.optim.SGD(model.parameters(), lr=opt.get("lr", 0.01),
                              momentum=opt.get("momentum", 0.9))
    x = torch.rand([batch] + list(cfg["model"]["input"]))
    y, loss_fn = bench_gpu_peer.batch_targets(cfg, model, x, classes)
    ts = []
    for s in range(steps + 3):
        t0 = time.perf_counter()
        sgd.zero_grad(set_to_none=True)
        with (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
              else contextlib.nullcontext()):
            loss = loss_fn(model(x), y)
        loss.backward()
        sgd.step()
        loss.item()  # the loss is read each step, as gpipe reads it
        if s >= 3:
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def gpipe_step_ms(binary, path, threads, steps, env, precision="fp32", activations="auto"):
    out = subprocess.run([binary, "--steps-only", "--threads", str(threads), "--steps",
                          str(steps), "--precision", precision, "--activations", activations,
                          path],
                         capture_output=True, text=True, env=env)
    m = re.search(r"step: ([0-9.]+) ms median", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit("bench_cpu_peer: %s failed:\n%s%s" % (binary, out.stdout, out.stderr))
    if "ONEDNN_MAX_CPU_ISA" in env and "loops in AVX-512" in out.stdout:
        sys.exit("bench_cpu_peer: --isa avx2, but %s runs gpipe's own loops in AVX-512 here; "
                 "build them for AVX2 at most and pass that build:\n"
                 "  cmake -S . -B build-avx2 -DGPIPE_ISA_CLONES=3 && "
                 "cmake --build build-avx2 --target bench_step\n"
                 "  bench/bench_cpu_peer.py --isa avx2 --bin build-avx2" % binary)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="*")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"))
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--activations", choices=["auto", "fp32", "bf16"], default="auto")
    ap.add_argument("--optimizer", choices=["config", "sgd", "adamw"], default="config")
    ap.add_argument("--_torch", help=argparse.SUPPRESS)  # child: one PyTorch measurement
    args = ap.parse_args()
    if args.threads < 1 or args.steps < 1 or args.repeat < 1:
        ap.error("--threads, --steps and --repeat must be at least 1")
    import yaml
    if args._torch:
        with open(args._torch) as f:
            print("%.4f" % torch_step_ms(yaml.safe_load(f), args.threads, args.steps,
                                         args.precision))
        return
    configs = args.configs or [os.path.join(HERE, "convnet.yaml"), os.path.join(HERE, "mlp.yaml")]
    names = {c: os.path.relpath(c, ROOT) for c in configs}  # the table names the user's file
    if args.optimizer != "config":  # copies with train.optimizer replaced, for both sides
        import atexit
        import shutil
        import tempfile
        tmp = tempfile.mkdtemp(prefix="bench_cpu_peer_")
        atexit.register(shutil.rmtree, tmp, True)
        opt = ({"type": "adamw", "lr": 0.001} if args.optimizer == "adamw"
               else {"type": "sgd", "lr": 0.01, "momentum": 0.9})
        copies = []
        for c in configs:
            with open(c) as f:
                cfg = yaml.safe_load(f)
            cfg["train"]["optimizer"] = opt
            copies.append(os.path.join(tmp, "%d-%s" % (len(copies), os.path.basename(c))))
            names[copies[-1]] = names[c]
            with open(copies[-1], "w") as f:
                yaml.safe_dump(cfg, f)
        configs = copies
    env = dict(os.environ)
    core = None
    if args.isa == "avx2":
        env.update(AVX2_ENV)
    else:
        core = native_blas_core()
        if core:
            env["OPENBLAS_CORETYPE"] = core
    import torch
    blas = blas_check()
    print("%s; --isa %s%s; --precision %s; --activations %s; --optimizer %s; torch %s (%s%s); "
          "%d threads; median of %d steps, median of %d runs"
          % (cpu_name(), args.isa, " (emulated: %s)" % " ".join("%s=%s" % kv for kv in
                                                                AVX2_ENV.items())
             if args.isa == "avx2" else "", args.precision, args.activations, args.optimizer,
             torch.__version__, blas, ", OPENBLAS_CORETYPE=%s, the environment's: %s"
             % (core, os.environ.get("OPENBLAS_CORETYPE", "unset")) if core else "",
             args.threads, args.steps, args.repeat))
    print()
    print("| model, batch | gpipe step ms | gpipe samples/s | PyTorch step ms | "
          "PyTorch samples/s | gpipe / PyTorch |")
    print("|---|---|---|---|---|---|")
    binary = os.path.join(args.bin, "bench_step")
    for path in configs:
        with open(path) as f:
            cfg = yaml.safe_load(f)
        batch = cfg["train"]["batch_size"]
        gs, ts = [], []
        for _ in range(args.repeat):
            gs.append(gpipe_step_ms(binary, path, args.threads, args.steps, env, args.precision,
                                    args.activations))
            # PyTorch in a child, so the ISA variables apply before torch loads.
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--_torch", path,
                                  "--threads", str(args.threads), "--steps", str(args.steps),
                                  "--precision", args.precision],
                                 capture_output=True, text=True, env=env)
            if out.returncode != 0:
                sys.exit("bench_cpu_peer.py: the PyTorch run of %s failed (exit %d):\n%s"
                         % (path, out.returncode, out.stderr.strip()))
            ts.append(float(out.stdout.strip().splitlines()[-1]))
        g, t = statistics.median(gs), statistics.median(ts)
        print("| %s, %d | %.1f | %.1f | %.1f | %.1f | **%.2f** |"
              % (names[path], batch, g, batch / g * 1e3, t, batch / t * 1e3, t / g))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
