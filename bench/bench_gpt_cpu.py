#!/usr/bin/python3
"""bench_gpt_cpu.py — a GPT's or a Llama's training tokens per second on
CPU devices, gpipe against PyTorch eager on the same cores (issue 64's CPU
bar: configs/tiny-gpt.yaml at least 1.2x PyTorch 2.x, FP32 and bf16; issue
66's: configs/llama-tiny.yaml the same against transformers' Llama).

    <python> bench/bench_gpt_cpu.py [--config configs/tiny-gpt.yaml]
        [--steps 20] [--threads 2] [--rounds 2] [--precision fp32|bf16]
        [--attention fused|plain] [--isa native|avx2]

The peer is whatever torch the interpreter that runs this script imports:
PyPI's current torch (MKL, oneDNN) in a venv is the one users have, made by
bench/torch_venv.sh (`/opt/gpipe-torch/bin/python bench/bench_gpt_cpu.py`);
Debian's python3-torch 1.13 (/usr/bin/python3) is older and slower and
needs libopenblas0-pthread (scripts/install-deps.sh --bench), which this
script checks for that torch only.

PyTorch: tests/gpt_twin.py's GPT (Hugging Face's GPT-2 layout: Conv1D
projections, pre-norm blocks) with --attention fused (the default:
F.scaled_dot_product_attention, is_causal, what a PyTorch 2 user's model
calls) or plain (the scores written out, nanoGPT's and HF's eager path),
built from the config's model.gpt sizes, torch.set_num_threads(--threads),
AdamW with the config's betas, weight decay and lr, gradient clipping
where the config clips, random tokens (B, T + 1) each step, the loss read
each step; --precision bf16 runs the forward and the loss under
torch.autocast("cpu", torch.bfloat16).  gpipe: gpipe-train on the same
config with train.steps = --steps and train.precision = --precision, its
--metrics step_seconds, on the config's devices and on one device with
all --threads and one micro-batch (pipeline.chunks 1: a single device has
nothing to overlap; whichever layout is faster is what a user would
pick), the token files of scripts/tokenize_text.py (byte-level, made in a
temporary directory from /usr/share/common-licenses when the model's
vocabulary is 256; otherwise data.path as the config has it).  Median step
after 3 warm-up steps; tokens per second = batch x T / median; rounds
alternate the programs, and the ratio is taken within each round.  The
first lines name the processor, its ISA, torch's version and its BLAS.
Prints; never fails a build.

A config with model.llama (configs/llama-tiny.yaml): the peer is Hugging
Face transformers' LlamaForCausalLM (LlamaConfig from the config's sizes,
rope_theta, rope_scaling, rms_eps and tie; attn_implementation "sdpa", what
a transformers user gets), HF's init, the same loop; bench/torch_venv.sh
installs transformers beside torch.  --attention does not apply to it.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from bench_cpu_peer import AVX2_ENV, blas_check  # noqa: E402  (refuses the reference BLAS)
from bench_loader import cpu_flags, cpu_name  # noqa: E402


def load_cfg(path):
    import yaml
    with open(path) as f:
        cfg = yaml.safe_load(f)
    t = cfg["model"]["input"][0]
    opt = cfg["train"].get("optimizer", {})
    common = {"T": t, "batch": cfg["train"]["batch_size"], "lr": opt.get("lr", 0.001),
              "betas": tuple(opt.get("betas", (0.9, 0.999))),
              "eps": float(opt.get("eps", 1e-8)), "wd": opt.get("weight_decay", 0.01),
              "clip": cfg["train"].get("clip_grad_norm", 0.0),
              "devices": cfg.get("pipeline", {}).get("devices", ["cpu:0"])}
    if "llama" in cfg["model"]:
        g = cfg["model"]["llama"]
        heads = g.get("heads", 32)
        return dict(common, family="llama", layers=g.get("layers", 32), heads=heads,
                    kv_heads=g.get("kv_heads", heads), width=g.get("width", 4096),
                    intermediate=g.get("intermediate", 11008), vocab=g.get("vocab", 32000),
                    positions=g.get("positions", 2048),
                    rope_theta=float(g.get("rope_theta", 10000.0)),  # (YAML 1.1: '1e-5' is text)
                    rope_scaling=g.get("rope_scaling"), rms_eps=float(g.get("rms_eps", 1e-6)),
                    tie=g.get("tie", False))
    g = cfg["model"]["gpt"]
    return {"family": "gpt", "layers": g.get("layers", 12), "heads": g.get("heads", 12),
            "width": g.get("width", 768), "positions": g.get("positions", 1024),
            "vocab": g.get("vocab", 50257), "tie": g.get("tie", True), "T": t,
            "batch": cfg["train"]["batch_size"], "lr": opt.get("lr", 0.001),
            "betas": tuple(opt.get("betas", (0.9, 0.999))), "eps": opt.get("eps", 1e-8),
            "wd": opt.get("weight_decay", 0.01),
            "clip": cfg["train"].get("clip_grad_norm", 0.0),
            "devices": cfg.get("pipeline", {}).get("devices", ["cpu:0"])}


def llama_model(c):
    """transformers' LlamaForCausalLM of the config's sizes, SDPA attention."""
    import transformers
    rs = c["rope_scaling"]
    scaling = None if not rs else {
        "rope_type": "llama3", "factor": rs.get("factor", 8.0),
        "low_freq_factor": rs.get("low_freq_factor", 1.0),
        "high_freq_factor": rs.get("high_freq_factor", 4.0),
        "original_max_position_embeddings": rs.get("original_positions", 8192)}
    cfg = transformers.LlamaConfig(
        vocab_size=c["vocab"], hidden_size=c["width"], intermediate_size=c["intermediate"],
        num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"], max_position_embeddings=c["positions"],
        rms_norm_eps=c["rms_eps"], rope_theta=c["rope_theta"], rope_scaling=scaling,
        tie_word_embeddings=c["tie"], attn_implementation="sdpa")
    m = transformers.LlamaForCausalLM(cfg)
    return lambda ids: m(input_ids=ids).logits, m


def torch_tokens_per_s(c, threads, steps, precision, attention):
    import contextlib
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    if c["family"] == "llama":
        forward, model = llama_model(c)  # HF's init
    else:
        import gpt_twin
        gpt_twin.FUSED_ATTENTION = attention == "fused"
        model = gpt_twin.GPT(c["vocab"], c["width"], c["layers"], c["heads"], c["positions"],
                             "tied" if c["tie"] else "own")
        forward = model
        with torch.no_grad():  # GPT-2's init; layer norms stay 1 and 0
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                elif not name.split(".")[-2].startswith("ln"):
                    p.zero_()
    opt = torch.optim.AdamW(model.parameters(), lr=c["lr"], betas=c["betas"], eps=c["eps"],
                            weight_decay=c["wd"])
    b, t, times = c["batch"], c["T"], []
    for s in range(steps + 3):
        data = torch.randint(0, c["vocab"], (b, t + 1))
        t0 = time.perf_counter()
        amp = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
               else contextlib.nullcontext())
        with amp:
            logits = forward(data[:, :t])
            loss = F.cross_entropy(logits.reshape(-1, c["vocab"]).float(),
                                   data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if c["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip"])
        opt.step()
        loss.item()
        if s >= 3:
            times.append(time.perf_counter() - t0)
    return b * t / statistics.median(times)


def token_files(c, tmp):
    """data.path for the run: byte-level files made here for vocabulary 256."""
    if c["vocab"] != 256:
        return None
    out = os.path.join(tmp, "tok")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "tokenize_text.py"), "encode",
                    "-o", out, "--name", "licenses"] + sorted(glob.glob(
                        "/usr/share/common-licenses/*")), check=True, capture_output=True)
    return out


def gpipe_tokens_per_s(binary, config, c, steps, sets, tmp, precision):
    m = os.path.join(tmp, "m.jsonl")
    cmd = [binary, config, "--metrics", m, "--no-progress", "-q",
           "--set", "train.steps=%d" % (steps + 3), "--set", "train.eval_each_epoch=false",
           "--set", "train.precision=%s" % precision,
           "--set", "train.schedule={type: constant}",
           # a timed run keeps nothing (the config's snapshots would make
           # the next run refuse to start over them, and cost time)
           "--set", "train.snapshot.every_steps=0",
           "--set", "train.snapshot.dir=%s" % os.path.join(tmp, "snapshots")] + \
        sum((["--set", s] for s in sets), [])
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit("bench_gpt_cpu: %s failed:\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    recs = [json.loads(line) for line in open(m) if line.strip()]
    times = [x["step_seconds"] for x in recs if "step_seconds" in x][3:]
    return c["batch"] * c["T"] / statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny-gpt.yaml"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "gpipe-train"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--attention", choices=("fused", "plain"), default="fused")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="avx2: both sides as an AVX2-only processor runs them (bench_cpu_peer.py's "
                         "AVX2_ENV: gpipe's GPIPE_CPU_ISA, PyTorch's oneDNN, MKL and ATen capped; "
                         "pass --binary of a -DGPIPE_ISA_CLONES=3 build)")
    a = ap.parse_args()
    if a.isa == "avx2":
        os.environ.update(AVX2_ENV)  # before torch loads MKL and oneDNN; gpipe-train inherits it
    import torch
    debian = torch.__version__.startswith("1.")
    blas = blas_check() if debian else "bundled (%s)" % (
        "MKL" if torch.backends.mkl.is_available() else "no MKL")
    c = load_cfg(a.config)
    isa, flags = cpu_flags()
    if a.precision == "bf16" and "avx512_bf16" not in flags and "amx_bf16" not in flags:
        print("note: this processor has no bf16 instructions; gpipe refuses precision bf16 "
              "here, and PyTorch's autocast emulates it")
    print("%s (%s); %d threads; torch %s (%s), BLAS %s; OPENBLAS_CORETYPE=%s%s" % (
        cpu_name(), isa, a.threads, torch.__version__, sys.executable, blas,
        os.environ.get("OPENBLAS_CORETYPE", "-"),
        "; capped at AVX2 (%s)" % " ".join("%s=%s" % kv for kv in sorted(AVX2_ENV.items()))
        if a.isa == "avx2" else ""))
    if c["family"] == "llama":
        import transformers
        print("Llama: %d layers, %d heads over %d k/v heads, width %d, MLP %d, T %d, vocabulary "
              "%d, %s head; batch %d; %s, AdamW; PyTorch: transformers %s LlamaForCausalLM, "
              "sdpa" % (c["layers"], c["heads"], c["kv_heads"], c["width"], c["intermediate"],
                        c["T"], c["vocab"], "tied" if c["tie"] else "untied", c["batch"],
                        a.precision.upper(), transformers.__version__))
    else:
        print("GPT: %d layers, %d heads, width %d, T %d, vocabulary %d, %s head; batch %d; %s, "
              "AdamW; PyTorch attention %s" % (c["layers"], c["heads"], c["width"], c["T"],
                                               c["vocab"], "tied" if c["tie"] else "untied",
                                               c["batch"], a.precision.upper(), a.attention))
    with tempfile.TemporaryDirectory() as tmp:
        data = token_files(c, tmp)
        base = ["data.path=%s" % data] if data else []
        n = len(c["devices"]) if isinstance(c["devices"], list) else int(c["devices"])
        per = max(1, a.threads // n)
        layouts = [("%d devices x %d thread%s" % (n, per, "s" if per > 1 else ""),
                    base + ["pipeline.threads=%d" % per]),
                   ("1 device x %d threads" % a.threads,
                    base + ["pipeline.devices=[cpu:0]", "pipeline.threads=%d" % a.threads,
                            "pipeline.balance=auto", "pipeline.chunks=1"])]
        print("\n| round | PyTorch tokens/s | " + " | ".join(
            "gpipe %s | ratio" % name for name, _ in layouts) + " |")
        print("|---|---|" + "---|---|" * len(layouts))
        for r in range(1, a.rounds + 1):
            pt = torch_tokens_per_s(c, a.threads, a.steps, a.precision, a.attention)
            row = "| %d | %.0f |" % (r, pt)
            for _, sets in layouts:
                g = gpipe_tokens_per_s(a.binary, a.config, c, a.steps, sets, tmp, a.precision)
                row += " %.0f | %.2fx |" % (g, g / pt)
            print(row, flush=True)


if __name__ == "__main__":
    main()
