#!/usr/bin/env python3
"""precision_accuracy.py - does train.precision: bf16 train as well as FP32?
Issue 15, item 6: configs/default.yaml in bf16 reaches at least 91% test
accuracy in 3 epochs, and its per-step losses stay within a stated
tolerance of the FP32 run's.

  python3 bench/precision_accuracy.py [--bin build] [--device cuda:0]
                                      [--config configs/default.yaml]
                                      [--out DIR] [--set KEY=VALUE ...]

Trains the config three times on one device, the same seed, data order and
schedule: in FP32, in bf16, and in FP32 once more with the sums in another
order (--reorder: pipeline.threads=1 on a CPU device, whose kernels then
split their sums differently; train.deterministic=true on a GPU, whose
convolutions then run other cuDNN algorithms).  SGD with dropout is
chaotic: a difference in the last bit of one gradient grows until, some
hundred steps in, the two runs' per-step losses differ by tens of percent
whatever the precision.  So the reordered FP32 run is the yardstick, and
the tolerances are:

  - final test accuracy: bf16 at least --min-accuracy (91%);
  - the first --early steps (25), before the difference has grown: each
    step's loss within --early-tol (1%) of the FP32 run's;
  - the whole run in windows of --window steps (100): the largest
    relative difference of a window's mean loss from the FP32 run's at
    most twice the reordered FP32 run's largest (and never above
    --window-floor, 2%, where that one is smaller).

Prints a Markdown table and exits 1 where a tolerance or the accuracy bar
is missed.  Needs only the standard library (any python3).  On CPU devices
bf16 runs only where the processor has bf16 instructions (avx512_bf16 or
AMX); elsewhere gpipe refuses it and the run fails saying so.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def run(args, name, sets):
    metrics = os.path.join(args.out, "%s.jsonl" % name)
    log = os.path.join(args.out, "%s.log" % name)
    cmd = [os.path.join(args.bin, "gpipe-train"), args.config, "--quiet",
           "--set", "pipeline.devices=[%s]" % args.device, "--metrics", metrics]
    for s in sets + args.set:
        cmd += ["--set", s]
    t0 = time.time()
    try:
        with open(log, "w") as f:
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    except OSError as e:
        sys.exit("precision_accuracy: cannot run %s: %s (--bin names the build folder)"
                 % (cmd[0], e.strerror))
    if rc != 0:
        sys.stderr.write("precision_accuracy: the %s run failed (exit %d):\n%s" %
                         (name, rc, "".join(open(log).readlines()[-5:])))
        sys.exit(2)
    steps, acc = [], None
    for line in open(metrics):
        r = json.loads(line)
        if r.get("eval"):
            if r.get("final"):
                acc = r["test_accuracy"]
        elif "loss" in r:
            steps.append(r["loss"])
    if acc is None:
        sys.exit("precision_accuracy: the %s run wrote no final evaluation to %s" % (name, metrics))
    return steps, acc, time.time() - t0


def early_diff(ref, other, n):
    return max(abs(b - f) / abs(f) for f, b in zip(ref[:n], other[:n]))


def window_diff(ref, other, w):
    worst = 0.0
    for w0 in range(0, len(ref), w):
        mf = sum(ref[w0:w0 + w]) / len(ref[w0:w0 + w])
        mb = sum(other[w0:w0 + w]) / len(other[w0:w0 + w])
        worst = max(worst, abs(mb - mf) / abs(mf))
    return worst


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"), help="where gpipe-train is")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "default.yaml"))
    ap.add_argument("--out", default="/tmp/precision-accuracy")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--min-accuracy", type=float, default=0.91)
    ap.add_argument("--reorder", help="the FP32 run with sums in another order (default: "
                    "pipeline.threads=1 on cpu:N, train.deterministic=true on cuda:N)")
    ap.add_argument("--early", type=int, default=25)
    ap.add_argument("--early-tol", type=float, default=0.01)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--window-floor", type=float, default=0.02)
    args = ap.parse_args()
    reorder = args.reorder or ("pipeline.threads=1" if args.device.startswith("cpu")
                               else "train.deterministic=true")
    os.makedirs(args.out, exist_ok=True)
    fp, acc_fp, t_fp = run(args, "fp32", ["train.precision=fp32"])
    bf, acc_bf, t_bf = run(args, "bf16", ["train.precision=bf16"])
    ro, acc_ro, t_ro = run(args, "fp32-reordered", ["train.precision=fp32", reorder])
    if not fp or len(bf) != len(fp) or len(ro) != len(fp):
        sys.exit("precision_accuracy: %d, %d and %d steps" % (len(fp), len(bf), len(ro)))
    e_bf, e_ro = early_diff(fp, bf, args.early), early_diff(fp, ro, args.early)
    w_bf, w_ro = window_diff(fp, bf, args.window), window_diff(fp, ro, args.window)
    e100_bf, e100_ro = early_diff(fp, bf, 100), early_diff(fp, ro, 100)
    w_tol = max(2 * w_ro, args.window_floor)
    same = sum(f == b for f, b in zip(fp, bf))
    print("precision_accuracy: %s on %s (%s), %d steps each; the reordered FP32 run: %s" %
          (args.config, args.device, cpu_model() if args.device.startswith("cpu") else "GPU",
           len(fp), reorder))
    print()
    print("| | fp32 | bf16 | fp32 reordered | bar |")
    print("|---|---|---|---|---|")
    print("| final test accuracy | %.2f%% | %.2f%% | %.2f%% | bf16 >= %.0f%% |" %
          (100 * acc_fp, 100 * acc_bf, 100 * acc_ro, 100 * args.min_accuracy))
    print("| wall time, s | %.1f | %.1f | %.1f | |" % (t_fp, t_bf, t_ro))
    print("| first %d steps: largest per-step loss difference from fp32 | | %.2f%% | %.2f%% | "
          "bf16 <= %.0f%% |" % (args.early, 100 * e_bf, 100 * e_ro, 100 * args.early_tol))
    print("| first 100 steps: the same (no bar) | | %.2f%% | %.2f%% | |" %
          (100 * e100_bf, 100 * e100_ro))
    print("| %d-step windows: largest mean-loss difference from fp32 | | %.2f%% | %.2f%% | "
          "bf16 <= %.2f%% |" % (args.window, 100 * w_bf, 100 * w_ro, 100 * w_tol))
    print("| steps whose loss equals fp32's | | %d of %d | %d | bf16: not all |" %
          (same, len(fp), sum(f == r for f, r in zip(fp, ro))))
    ok = (acc_bf >= args.min_accuracy and e_bf <= args.early_tol and w_bf <= w_tol and
          same < len(fp))
    print()
    print("precision_accuracy: %s" % ("within every bar" if ok else "MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
