#!/usr/bin/env python3
"""test_safetensors_ref.py - gpipe's weight files read by the reference
safetensors library, and used outside gpipe.

1. gpipe-train trains an MLP with batch norm on a Fashion-MNIST subset and
   exports its weights (--export-weights); its --metrics give the final test
   accuracy.
2. safetensors.numpy.load_file (the reference implementation) reads the file:
   names, dtypes and shapes are those of PyTorch's state_dict() for the
   equivalent nn.Sequential (Flatten, Linear, BatchNorm1d, ReLU, Dropout,
   Linear), num_batches_tracked an int64 scalar equal to the step count.
3. A numpy forward pass of those weights (eval mode: running statistics, no
   dropout) over the same test samples reproduces gpipe's test accuracy.
4. A snapshot's extra momentum.* tensors and __metadata__ are readable too.

Needs numpy and safetensors: taken from the interpreter running this script
if it has them, else from a venv made under GPIPE_BINARY_DIR (Debian's numpy,
safetensors pinned, with pip from PyPI);
exits 77 (skipped) if neither works or Fashion-MNIST is not installed.  torch
is deliberately not used (too heavy for CI); the forward pass is 15 lines.
"""
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile

from gpt_util import SKIP, check, ensure_libs, finish

SRC = os.environ.get("GPIPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
DATA = "/usr/share/datasets/fashion-mnist"
SAFETENSORS = "safetensors==0.8.0"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        b = f.read()
    magic, n = struct.unpack(">II", b[:8])
    import numpy as np
    if magic == 0x803:
        h, w = struct.unpack(">II", b[8:16])
        return np.frombuffer(b, np.uint8, n * h * w, 16).reshape(n, h * w)
    return np.frombuffer(b, np.uint8, n, 8)


CONFIG = """
model:
  input: [1, 28, 28]
  layers:
    - flatten
    - linear: {out: 64}
    - batchnorm
    - relu
    - dropout: {p: 0.1}
    - linear: {out: 10}
pipeline: {devices: 2, chunks: 4}
data:
  dataset: fashion-mnist
  train_limit: 4096
  test_limit: 1000
  mean: 0.2860
  std: 0.3530
  prefetch: 1
train:
  steps: 60
  batch_size: 64
  seed: 3
  log_every: 0
  optimizer: {lr: 0.05, momentum: 0.9}
  snapshot: {every_steps: 60, dir: %s}
"""


def main():
    ensure_libs("test_safetensors_ref", ["numpy", "safetensors"], os.path.join(BIN, "st-venv"),
                # (Debian's numpy through the system's packages; only safetensors,
                # at the version this test was written against, from PyPI)
                [SAFETENSORS, "numpy"], "GPIPE_ST_REEXEC")
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file

    if not os.path.exists(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")):
        print("test_safetensors_ref: skipped: Fashion-MNIST is not installed in", DATA)
        return SKIP
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "mlp.yaml")
        with open(cfg, "w") as f:
            f.write(CONFIG % os.path.join(tmp, "snaps"))
        out = os.path.join(tmp, "w.safetensors")
        metrics = os.path.join(tmp, "m.jsonl")
        r = subprocess.run([os.path.join(BIN, "gpipe-train"), cfg, "--quiet", "--metrics", metrics,
                            "--export-weights", out], capture_output=True, text=True,
                           env=dict(os.environ, GPIPE_BALANCE="flops"))
        check(r.returncode == 0, "gpipe-train exit %d: %s" % (r.returncode, r.stderr[-500:]))
        if r.returncode != 0:
            return 1
        final = [json.loads(l) for l in open(metrics) if '"final"' in l][0]

        w = load_file(out)
        want = {"1.weight": ((64, 784), np.float32), "1.bias": ((64,), np.float32),
                "2.weight": ((64,), np.float32), "2.bias": ((64,), np.float32),
                "2.running_mean": ((64,), np.float32), "2.running_var": ((64,), np.float32),
                "2.num_batches_tracked": ((), np.int64),
                "5.weight": ((10, 64), np.float32), "5.bias": ((10,), np.float32)}
        check(sorted(w) == sorted(want), "names: %s" % sorted(w))
        for k, (shape, dt) in want.items():
            if k in w:
                check(w[k].shape == shape and w[k].dtype == dt,
                      "%s: %s %s" % (k, w[k].shape, w[k].dtype))
        check(int(w.get("2.num_batches_tracked", -1)) == 60, "num_batches_tracked")
        with safe_open(out, "np") as f:
            meta = f.metadata()
        check(meta.get("format") == "pt" and meta.get("gpipe.kind") == "weights", str(meta))

        # numpy forward, eval mode, PyTorch semantics
        x = read_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz"))[:1000].astype(np.float32)
        y = read_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz"))[:1000]
        x = (x / np.float32(255) - np.float32(0.2860)) / np.float32(0.3530)
        h = x @ w["1.weight"].T + w["1.bias"]
        h = (h - w["2.running_mean"]) / np.sqrt(w["2.running_var"] + np.float32(1e-5))
        h = h * w["2.weight"] + w["2.bias"]
        h = np.maximum(h, 0)
        logits = h @ w["5.weight"].T + w["5.bias"]
        acc = float((logits.argmax(1) == y).mean())
        print("gpipe test accuracy %.4f, numpy forward of the exported weights %.4f"
              % (final["test_accuracy"], acc))
        check(abs(acc - final["test_accuracy"]) <= 1.5e-3,
              "accuracy %.4f vs gpipe %.4f" % (acc, final["test_accuracy"]))
        check(acc > 0.6, "the model learned something (%.3f)" % acc)

        snap = os.path.join(tmp, "snaps", "snapshot-000000060.safetensors")
        s = load_file(snap)
        check(all(np.array_equal(s[k], w[k]) for k in w), "snapshot weights = exported weights")
        check(sorted(k for k in s if k.startswith("momentum.")) ==
              sorted("momentum." + k for k in w if "running" not in k and "num_" not in k),
              "momentum names")
        with safe_open(snap, "np") as f:
            meta = f.metadata()
        check(meta.get("gpipe.step") == "60" and "dropout" in meta.get("gpipe.config", ""),
              "snapshot metadata")
    return finish("test_safetensors_ref")


if __name__ == "__main__":
    sys.exit(main())
