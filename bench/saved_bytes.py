#!/usr/bin/env python3
"""saved_bytes.py: what PyTorch's autograd keeps for backward, per sample,
for a gpipe config's model (bench_gpu_peer.py's twin of it), beside what
gpipe's --dry-run says it keeps ("MiB of activations per batch").

    /usr/bin/python3 bench/saved_bytes.py configs/amoebanet-d.yaml [--fp32]

Every tensor autograd saves during one training forward is counted once
by its storage (a relu's output that the next convolution saves as its
input is one tensor), under torch.autocast(bfloat16) unless --fp32; the
forward runs at batch 1 and 2 and the difference is the per-sample bytes,
so the bf16 copies of the weights that autocast saves, the same at any
batch, drop out.  Runs on the CPU (Debian's PyTorch: /usr/bin/python3);
a family model built from torchvision (the ResNets) needs torchvision.
Prints the total and, for AmoebaNet-D, the stem and each cell."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu_peer as peer  # noqa: E402


def saved(cfg, batch, bf16):
    import torch
    torch.manual_seed(0)
    model = peer.torch_model(cfg)
    model = model[0] if isinstance(model, tuple) else model
    model.train()
    seen = {}

    def pack(t):
        st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        nb = st.nbytes() if hasattr(st, "nbytes") else st.size() * t.element_size()
        seen[(st.data_ptr(), nb)] = nb
        return t

    parts, start = [], {}
    mods = ([("stem", model.stem)] + [("cell%d" % i, c) for i, c in enumerate(model.cells)]
            if hasattr(model, "cells") else [])
    for name, m in mods:
        m.register_forward_pre_hook(
            lambda mod, inp, name=name: start.__setitem__(name, sum(seen.values())))
        m.register_forward_hook(
            lambda mod, inp, out, name=name: parts.append((name, sum(seen.values()) - start[name])))
    x = torch.randn(batch, *cfg["model"]["input"])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(x)
    return sum(seen.values()), parts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--fp32", action="store_true", help="no autocast")
    a = ap.parse_args()
    cfg = peer.read_config(a.config)
    (t1, p1), (t2, p2) = saved(cfg, 1, not a.fp32), saved(cfg, 2, not a.fp32)
    mib = 1 << 20
    print("%s, %s: PyTorch keeps %.1f MiB a sample for backward" %
          (a.config, "fp32" if a.fp32 else "bf16 autocast", (t2 - t1) / mib))
    for (name, b1), (_, b2) in zip(p1, p2):
        print("  %-7s %.2f MiB a sample" % (name, (b2 - b1) / mib))


if __name__ == "__main__":
    main()
