#!/usr/bin/env python3
"""profile_types.py: where a step's time goes, by layer type, from a
gpipe-balance profile (--profile-out FILE): each type's forward, backward
(data + weights) and their sum over every layer of the model, in ms per
micro-batch, largest first, with its share of the whole.

    gpipe-balance CONFIG --devices 1 --profile-out prof.json [--set ...]
    python3 bench/profile_types.py prof.json [--top N]

Standard library only.  Set beside PyTorch's profiler table
(bench_gpu_peer.py --profile N) it says which kinds of layer a GPU run
loses time in; bench/gpu_session.sh profile prints both."""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=20, help="types shown (default 20)")
    a = ap.parse_args()
    try:
        with open(a.profile) as f:
            prof = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("profile_types: %s: %s" % (a.profile, e))
    layers = prof.get("layers")
    if not isinstance(layers, list) or not layers:
        sys.exit("profile_types: %s: no layers (not a gpipe-balance profile?)" % a.profile)
    by = {}
    for lay in layers:
        kind = str(lay.get("spec", "?")).split(" ", 1)[0]
        t = (lay.get("times") or [{}])[0]
        fwd = float(t.get("fwd", 0.0))
        bwd = float(t.get("bwd_data", 0.0)) + float(t.get("bwd_weights", 0.0))
        e = by.setdefault(kind, [0, 0.0, 0.0])
        e[0] += 1
        e[1] += fwd
        e[2] += bwd
    loss = prof.get("loss")  # the loss and its gradient, one time per micro-batch size
    if isinstance(loss, list) and loss and float(loss[0]) > 0:
        by["(loss)"] = [1, float(loss[0]), 0.0]
    total = sum(f + b for _, f, b in by.values()) or 1.0
    print("%s on %s, micro-batch %s, precision %s: %.2f ms forward + backward over %d layers"
          " and the loss (its row: forward and gradient together)"
          % (a.profile, prof.get("device", "?"), prof.get("batch", "?"),
             prof.get("precision", "?"), total * 1e3, len(layers)))
    print()
    print("| layer type | layers | forward ms | backward ms | total ms | share |")
    print("|---|---|---|---|---|---|")
    rows = sorted(by.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
    for kind, (n, f, b) in rows[:a.top]:
        print("| %s | %d | %.2f | %.2f | %.2f | %.1f%% |"
              % (kind, n, f * 1e3, b * 1e3, (f + b) * 1e3, 100.0 * (f + b) / total))


if __name__ == "__main__":
    main()
