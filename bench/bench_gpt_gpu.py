#!/usr/bin/env python3
"""bench_gpt_gpu.py — GPT-2 124M training on one GPU in bf16: gpipe beside
PyTorch eager, torch.compile and llm.c running the same model on the same
tokens (issue 53 point 8; its bar: gpipe at least 1.10x PyTorch eager and
1.0x llm.c in tokens per second).

    python3 bench/bench_gpt_gpu.py [--bin /tmp/gpu-build] [--device cuda:0]
        [--batch 16] [--seq 1024] [--steps 20] [--peers .device/peers]
        [--out DIR] [--no-compile] [--only gpipe,eager,compile,llmc]
    (--device cpu:0 --precision fp32 --only gpipe --seq 64 --batch 1 checks
    the script here without a GPU)

The model: configs/gpt2.yaml (12 layers, 12 heads, 768 wide, the
vocabulary padded to 50,304 rows as llm.c and nanoGPT pad it, the head
tied to the token embedding), AdamW (lr 6e-4, betas 0.9/0.95, weight decay
0.1), gradient clipping at 1.0, batch --batch sequences of --seq tokens
drawn at random (uniform over GPT-2's 50,257 ids) into llm.c token files
that every program reads.  Median step after 3 warm-up steps; tokens per
second = batch x seq / median; MFU = tokens per second x the model's FLOPs
per token (gpipe-train --dry-run's 6N + 12 L C T, the same number for
every column) / the GPU's dense bf16 peak (H100 / H200 SXM: 989 TFLOPS).

- gpipe: gpipe-train configs/gpt2.yaml on one device, train.precision bf16
  (activations as `auto` stores them: bf16 on a GPU since 2026-11-27,
  PyTorch autocast's memory), one micro-batch, no checkpointing (what the
  others do), its --metrics step_seconds and peak_bytes; and again with
  train.activations fp32 (the default before), a row of its own.
- PyTorch: tests/gpt_twin.py's GPT (Hugging Face's layout) with torch's
  fused scaled_dot_product_attention, torch.autocast(bfloat16), AdamW
  fused=True, TF32 allowed for what autocast leaves in FP32, the loss over
  the first 50,257 of the 50,304 logits (as gpipe and llm.c take it), read
  each step; peak = torch.cuda.max_memory_allocated.  torch.compile: the
  same model compiled (its compile time printed apart, not timed).
- llm.c: train_gpt2cu from --peers/llm.c, built here (make USE_CUDNN=1
  with --peers/cudnn-frontend/include: its flash attention through cuDNN,
  its fastest build; USE_CUDNN=0 where that build fails, and the table
  says so), run from random init (-e d12) on the same files with the same
  batch; its own "ms" per step.  bench/prepare_peers.sh puts both sources
  in .device/peers (the GPU machines reach no network).

Prints a markdown table; never fails a build.
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import tokenize_text  # noqa: E402  (the llm.c token files gpipe reads)

VOCAB, VOCAB_PAD, LAYERS, HEADS, WIDTH, POSITIONS = 50257, 50304, 12, 12, 768, 1024
WARM = 3


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return "unknown GPU"


def peak_flops(name):
    """Dense bf16 tensor-core peak of the GPUs lent here (0: unknown)."""
    if "H100" in name and "PCIe" in name:
        return 756e12
    if "H100" in name or "H200" in name:
        return 989.4e12
    if "A100" in name:
        return 312e12
    return 0.0


def write_tokens(path, n, seed):
    """n random GPT-2 ids in an llm.c token file (tokenize_text.py's writer)."""
    import random
    rng = random.Random(seed)
    tokenize_text.write_tokens(path, [rng.randrange(VOCAB) for _ in range(n)])


def flops_per_token(binary, seq):
    """gpipe-train --dry-run's FLOPs per token to train (the MFU numerator)."""
    r = subprocess.run([binary, os.path.join(ROOT, "configs", "gpt2.yaml"), "--dry-run",
                        "--set", "model.input=[%d]" % seq], capture_output=True, text=True,
                       cwd=ROOT)
    m = re.search(r"([0-9.]+) MFLOP per token to train", r.stdout + r.stderr)
    return float(m.group(1)) * 1e6 if m else 0.0


def gpipe_run(a, data, activations="auto"):
    tag = "gpipe" if activations == "auto" else "gpipe-" + activations
    m = os.path.join(a.out, tag + ".jsonl")
    cmd = [os.path.join(a.bin, "gpipe-train"), os.path.join(ROOT, "configs", "gpt2.yaml"),
           "--quiet", "--metrics", m,
           "--set", "pipeline.devices=[%s]" % a.device, "--set", "pipeline.chunks=1",
           "--set", "pipeline.checkpoint=never", "--set", "train.precision=%s" % a.precision,
           "--set", "train.batch_size=%d" % a.batch, "--set", "model.input=[%d]" % a.seq,
           "--set", "train.steps=%d" % (a.steps + WARM), "--set", "data.path=%s" % data,
           "--set", "data.shuffle=false", "--set", "train.eval_each_epoch=false",
           "--set", "train.activations=%s" % activations]
    with open(os.path.join(a.out, tag + ".log"), "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if r.returncode != 0:
        tail = open(os.path.join(a.out, tag + ".log")).read()[-1500:]
        return None, "gpipe-train exit %d: %s" % (r.returncode, tail)
    recs = [json.loads(line) for line in open(m) if '"step_seconds"' in line]
    ts = [x["step_seconds"] for x in recs][WARM:]
    peak = max((d.get("peak_bytes", 0) for x in recs for d in x.get("devices", [])), default=0)
    return {"ms": statistics.median(ts) * 1e3, "peak": peak}, ""


def torch_run(a, compiled):
    import torch
    import torch.nn.functional as F
    import gpt_twin
    gpt_twin.FUSED_ATTENTION = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(a.device)
    torch.manual_seed(1)
    model = gpt_twin.GPT(VOCAB_PAD, WIDTH, LAYERS, HEADS, POSITIONS, "tied").to(dev)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    run = torch.compile(model) if compiled else model
    batches = [torch.randint(0, VOCAB, (a.batch, a.seq + 1), device=dev) for _ in range(4)]
    ts, compile_s = [], 0.0
    torch.cuda.reset_peak_memory_stats(dev)
    for s in range(a.steps + WARM):
        data = batches[s % len(batches)]
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = run(data[:, :a.seq])
            # over the V real tokens' logits, as gpipe and llm.c take it
            loss = F.cross_entropy(logits[..., :VOCAB].float().reshape(-1, VOCAB),
                                   data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        dt = time.perf_counter() - t0
        if s == 0:
            compile_s = dt
        if s >= WARM:
            ts.append(dt)
    return {"ms": statistics.median(ts) * 1e3, "peak": torch.cuda.max_memory_allocated(dev),
            "first_s": compile_s}, ""


def link_paths(work):
    """(cuDNN's include dir, a dir of the .so names llm.c links with -l):
    libcudnn.so for the libcudnn.so.9 gpipe's build uses, and
    libnvidia-ml.so for the driver's libnvidia-ml.so.1 (or the toolkit's
    stub), which llm.c links for its GPU-utilisation log."""
    lib = tempfile.mkdtemp(prefix="llmc-lib-", dir=work)
    inc = ""
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        so = os.path.join(d, "libcudnn.so.9")
        if d and os.path.exists(so):
            os.symlink(so, os.path.join(lib, "libcudnn.so"))
            inc = os.path.join(os.path.dirname(d), "include")
            break
    nvml = [line.split("=>")[-1].strip() for line in subprocess.run(
        ["ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines()
        if "libnvidia-ml.so.1" in line]
    nvml += glob.glob("/usr/local/cuda*/lib64/stubs/libnvidia-ml.so") + glob.glob(
        "/usr/local/cuda*/targets/*/lib/stubs/libnvidia-ml.so")
    if nvml:
        os.symlink(nvml[0], os.path.join(lib, "libnvidia-ml.so"))
    return inc, lib


def cuda13_patch(path):
    """CUDA 13's cudaMemAdvise takes a cudaMemLocation where llm.c (2024)
    passes a device id, in its out-of-memory fallback to managed memory
    (never taken in this bench): the one line llm.c needs to compile on
    the GPU machines' CUDA 13.  Nothing else of it is changed."""
    src = open(path).read()
    old = "cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)"
    if old not in src:
        return
    loc = ("\n#if CUDART_VERSION >= 13000\n#define LLMC_CPU_LOCATION cudaMemLocation"
           "{cudaMemLocationTypeHost, 0}\n#else\n#define LLMC_CPU_LOCATION cudaCpuDeviceId\n"
           "#endif\n")
    head = "int cudaMallocConditionallyManaged("
    src = src.replace(head, loc + head, 1)
    src = src.replace(old, "cudaMemAdviseSetPreferredLocation, LLMC_CPU_LOCATION)")
    with open(path, "w") as f:
        f.write(src)


def llmc_run(a, train, val):
    src = os.path.join(a.peers, "llm.c")
    if not os.path.exists(os.path.join(src, "train_gpt2.cu")):
        return None, "no llm.c source in %s (bench/prepare_peers.sh)" % a.peers
    work = os.path.join(a.work, "llm.c")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    cuda13_patch(os.path.join(work, "llmc", "cuda_utils.cuh"))
    inc, lib = link_paths(a.work)
    env = dict(os.environ)
    env["CPATH"] = ":".join(x for x in (inc, env.get("CPATH", "")) if x)
    env["LIBRARY_PATH"] = ":".join(x for x in (lib, env.get("LIBRARY_PATH", "")) if x)
    # llm.c's Makefile looks for cudnn-frontend/include beside itself
    fe = os.path.join(work, "cudnn-frontend")
    if os.path.isdir(os.path.join(a.peers, "cudnn-frontend")):
        shutil.copytree(os.path.join(a.peers, "cudnn-frontend"), fe)
    note = "cuDNN flash attention"
    base = ["make", "-C", work, "train_gpt2cu", "NO_MULTI_GPU=1", "NO_USE_MPI=1"]
    with open(os.path.join(a.out, "llmc-build.log"), "w") as log:
        r = subprocess.run(base + ["USE_CUDNN=1", "CUDNN_FRONTEND_PATH=%s/include" % fe], env=env,
                           stdout=log, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            note = "its own attention (the USE_CUDNN=1 build failed: llmc-build.log)"
            r = subprocess.run(base + ["USE_CUDNN=0"], env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    if r.returncode != 0:
        return None, "llm.c did not build (llmc-build.log)"
    cmd = [os.path.join(work, "train_gpt2cu"), "-i", train, "-j", val, "-e", "d12",
           "-b", str(a.batch), "-t", str(a.seq), "-x", str(a.steps + WARM), "-h", "0",
           "-l", "6e-4", "-c", "0.1",
           # no evaluation or sampling between steps (0 would divide by 0 there)
           "-v", "1000000", "-s", "1000000", "-m", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env)
    with open(os.path.join(a.out, "llmc.log"), "w") as log:
        log.write(r.stdout + r.stderr)
    ms = [float(x) for x in re.findall(r"\| ([0-9.]+) ms \|", r.stdout)][WARM:]
    if r.returncode != 0 or not ms:
        return None, "train_gpt2cu exit %d (llmc.log)" % r.returncode
    return {"ms": statistics.median(ms), "peak": 0, "note": note}, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("BIN", "/tmp/gpu-build"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--peers", default=os.path.join(ROOT, ".device", "peers"))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "gpt"))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--precision", default="bf16",
                    help="gpipe's train.precision (fp32 checks the script on a CPU)")
    ap.add_argument("--only", default="gpipe,gpipe-fp32,eager,compile,llmc")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    only = set(a.only.split(","))
    if a.no_compile:
        only.discard("compile")
    name = gpu_name()
    peak = peak_flops(name)
    fpt = flops_per_token(os.path.join(a.bin, "gpipe-train"), a.seq)
    n = a.batch * (a.seq + 1) * (a.steps + WARM + 2) + 1
    # scratch (token files, llm.c's build) apart from --out, which keeps
    # only logs (the device tool brings back a few files of $OUT)
    a.work = tempfile.mkdtemp(prefix="bench-gpt-")
    train, val = os.path.join(a.work, "rand_train.bin"), os.path.join(a.work, "rand_val.bin")
    write_tokens(train, n, 1)
    write_tokens(val, a.batch * (a.seq + 1) + 1, 2)
    print("bench_gpt_gpu: %s, commit %s; GPT-2 124M (Vp %d, tied), batch %d x %d, bf16, %d "
          "steps after %d; %.1f MFLOP per token; peak %.0f TFLOPS" % (
              name, os.environ.get("COMMIT", "?"), VOCAB_PAD, a.batch, a.seq, a.steps, WARM,
              fpt / 1e6, peak / 1e12), flush=True)
    runs = [("gpipe", lambda: gpipe_run(a, train)),
            ("gpipe, fp32 activations", lambda: gpipe_run(a, train, "fp32")),
            ("PyTorch eager", lambda: torch_run(a, False)),
            ("torch.compile", lambda: torch_run(a, True)),
            ("llm.c", lambda: llmc_run(a, train, val))]
    keys = ["gpipe", "gpipe-fp32", "eager", "compile", "llmc"]
    # each row printed as its program finishes: a run cut short by a
    # timeout keeps the rows it finished
    print("\n| program | step ms | tokens/s | MFU | peak GB | gpipe / it |")
    print("|---|---|---|---|---|---|", flush=True)
    g = None
    for key, (label, fn) in zip(keys, runs):
        if key not in only:
            continue
        t0 = time.time()
        try:
            r, why = fn()
        except Exception as e:  # a peer's failure is a row, not the end of the table
            r, why = None, "%s: %s" % (type(e).__name__, e)
        if key == "gpipe":
            g = r
        if not r:
            print("| %s | failed: %s | | | | |" % (label, why.replace("\n", " ")[:200]),
                  flush=True)
            continue
        tps = a.batch * a.seq / (r["ms"] / 1e3)
        mfu = "%.1f%%" % (100 * tps * fpt / peak) if peak and fpt else "-"
        gb = "%.2f" % (r["peak"] / 1e9) if r["peak"] else "-"
        ratio = "%.2fx" % (r["ms"] / g["ms"]) if g and not key.startswith("gpipe") else ""
        extra = " (%s)" % r["note"] if "note" in r else ""
        extra += " (first step %.0f s)" % r["first_s"] if key == "compile" else ""
        print("| %s%s | %.1f | %.0f | %s | %s | %s | (%.0f s)" % (
            label, extra, r["ms"], tps, mfu, gb, ratio, time.time() - t0), flush=True)
    shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
