#!/usr/bin/python3
"""selective_recompute.py — what pipeline.checkpoint.keep saves and costs
(issue 79, item 2): one config trained a few steps under each checkpoint
setting below, in one run so the ratios share the machine's state.

For each setting: the median step of the steps after the first (seconds),
each device's measured activation peak (the allocator's ACTIVATIONS
category, --metrics), and what --dry-run predicts: each device's peak
("memory at a step's peak") and, per stage, the bytes a checkpointed
micro-batch keeps and the MFLOP its recompute runs.  Ratios are against
`never` (keep everything, recompute nothing).

usage: bench/selective_recompute.py [CONFIG] [--build DIR] [--steps N]
(default bench/llama-recompute.yaml, build/, 8 steps).  Record the
processor with the numbers (bench/README.md, "Selective recompute").
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = [
    ("never", "never"),
    ("always", "always"),
    ("always, keep linear+attention", "{mode: always, keep: [linear, attention]}"),
    ("always, keep attention", "{mode: always, keep: [attention]}"),
    ("always, keep linear", "{mode: always, keep: [linear]}"),
]


def run(build, cfg, steps, ck, tmp):
    sets = ["--set", "pipeline.checkpoint=" + ck, "--set", "train.steps=%d" % steps]
    dry = subprocess.run([os.path.join(build, "gpipe-train"), cfg, "--dry-run"] + sets,
                         capture_output=True, text=True)
    if dry.returncode != 0:
        sys.exit("selective_recompute: --dry-run with %s failed: %s" % (ck, dry.stderr[-400:]))
    peak = re.search(r"memory at a step's peak .*?: (.*)$", dry.stdout, re.M)
    keeps = re.findall(r"checkpointed, it keeps (.*?) of the .*? and recomputes ([\d.]+) of",
                       dry.stdout)
    metrics = os.path.join(tmp, "m.jsonl")
    r = subprocess.run([os.path.join(build, "gpipe-train"), cfg, "-q", "--metrics", metrics]
                       + sets, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("selective_recompute: training with %s failed: %s" % (ck, r.stderr[-400:]))
    rows = [json.loads(x) for x in open(metrics) if '"step_seconds"' in x]
    step = statistics.median(x["step_seconds"] for x in rows[1:])
    acts = [max(x["devices"][d]["peak_activations"] for x in rows)
            for d in range(len(rows[0]["devices"]))]
    return step, acts, peak.group(1) if peak else "?", keeps


def main():
    args = sys.argv[1:]
    cfg = os.path.join(SRC, "bench", "llama-recompute.yaml")
    build, steps = os.path.join(SRC, "build"), 8
    while args:
        a = args.pop(0)
        if a == "--build":
            build = args.pop(0)
        elif a == "--steps":
            steps = int(args.pop(0))
        else:
            cfg = a
    tmp = tempfile.mkdtemp(prefix="gpipe_recompute_")
    res = [(name,) + run(build, cfg, steps, ck, tmp) for name, ck in SETTINGS]
    base_step, base_acts = res[0][1], res[0][2]
    print("%s, %d steps; activations: each device's measured peak (MiB)" % (cfg, steps))
    print("%-32s %9s %6s  %-22s %-22s %s" % ("checkpoint", "step s", "ratio", "activations MiB",
                                             "of never's", "recompute MFLOP per stage"))
    for name, step, acts, peak, keeps in res:
        print("%-32s %9.3f %6.2f  %-22s %-22s %s" % (
            name, step, step / base_step, " / ".join("%.1f" % (a / 2**20) for a in acts),
            " / ".join("%.2f" % (a / b) for a, b in zip(acts, base_acts)),
            " / ".join(r for _, r in keeps) or "-"))
    print("predicted device peaks (--dry-run):")
    for name, _, _, peak, keeps in res:
        print("  %-30s %s%s" % (name, peak, "; kept per checkpointed batch: " +
                                " / ".join(k for k, _ in keeps) if keeps else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
