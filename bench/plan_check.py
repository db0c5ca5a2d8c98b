#!/usr/bin/python3
"""plan_check.py — issue 79's bar for gpipe-balance --plan on CPU devices:
every layout the plan prints runs, and its measured step is within 10% of
the step it predicts.

For k = 1 .. K: gpipe-balance CONFIG --plan N --top K --write k.yaml
--pick k (the plan is made again each time, from a fresh profile, so the
prediction compared is the one printed beside the layout written), then
gpipe-train k.yaml for S steps with --metrics; the measured step is the
median of step_seconds after the first two steps.  Prints one row per
layout: its shape, the predicted and measured step and their ratio, and
how many of the K are within 10%.

usage: bench/plan_check.py [CONFIG] [--devices N] [--top K] [--steps S]
       [--reps R] [--build DIR] [--set KEY=VALUE ...]
(default configs/default.yaml with data.dataset=synthetic, N 2, K 5, S
12, the plan's profile timed R = 5 times a layer).  Run it on a quiet machine and record the processor
(bench/README.md, "Planning a layout").
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = re.compile(r"^\s+(\d+)\s+(\d+)x(\d+)\s+(\S+)\s+(\d+)\s+(\S+)\s+([\d.]+)\s", re.M)


def main():
    args = sys.argv[1:]
    cfg = os.path.join(SRC, "configs", "default.yaml")
    build, n, top, steps, reps, sets = os.path.join(SRC, "build"), 2, 5, 12, 5, []
    while args:
        a = args.pop(0)
        if a == "--devices":
            n = int(args.pop(0))
        elif a == "--top":
            top = int(args.pop(0))
        elif a == "--steps":
            steps = int(args.pop(0))
        elif a == "--reps":
            reps = int(args.pop(0))
        elif a == "--build":
            build = args.pop(0)
        elif a == "--set":
            sets += ["--set", args.pop(0)]
        else:
            cfg = a
    if not sets and cfg.endswith("default.yaml"):
        sets = ["--set", "data.dataset=synthetic"]
    tmp = tempfile.mkdtemp(prefix="gpipe_plan_check_")
    print("%s on %d CPU devices, the top %d layouts, %d steps each" % (cfg, n, top, steps))
    print("%-4s %-6s %-12s %4s %-18s %10s %10s %6s" % ("rank", "stages", "schedule", "m",
                                                     "checkpoint", "plan ms", "measured", "ratio"))
    within = runs = 0
    for k in range(1, top + 1):
        out = os.path.join(tmp, "%d.yaml" % k)
        p = subprocess.run([os.path.join(build, "gpipe-balance"), cfg, "--plan", str(n), "--top",
                            str(top), "--reps", str(reps), "-q", "--write", out, "--pick", str(k)]
                           + sets,
                           capture_output=True, text=True)
        rows = {int(m.group(1)): m.groups() for m in ROW.finditer(p.stdout)}
        if p.returncode != 0 or k not in rows:
            print("%-4d plan failed (exit %d): %s" % (k, p.returncode, (p.stdout + p.stderr)[-300:]))
            continue
        _, dn, dr, sched, m, ck, ms = rows[k]
        metrics = os.path.join(tmp, "%d.jsonl" % k)
        t = subprocess.run([os.path.join(build, "gpipe-train"), out, "-q", "--metrics", metrics,
                            "--set", "train.steps=%d" % steps, "--set", "train.log_every=0",
                            # (no snapshot: a second layout would find the first's)
                            "--set", "train.snapshot.every_steps=0",
                            "--set", "train.snapshot.dir=" + os.path.join(tmp, "snaps%d" % k)]
                           + sets,
                           capture_output=True, text=True)
        runs += 1
        if t.returncode != 0:
            print("%-4d %sx%-4s %-12s %4s %-18s %10s  did not run (exit %d): %s" % (
                k, dn, dr, sched, m, ck, ms, t.returncode, t.stderr[-300:]))
            continue
        st = [json.loads(x)["step_seconds"] for x in open(metrics) if '"step_seconds"' in x]
        got = statistics.median(st[2:] if len(st) > 3 else st) * 1e3
        r = got / float(ms)
        within += abs(r - 1) <= 0.10
        print("%-4d %sx%-4s %-12s %4s %-18s %10.2f %10.2f %6.2f" % (k, dn, dr, sched, m, ck,
                                                                   float(ms), got, r))
    print("%d of %d layouts ran; %d within 10%% of the plan" % (runs, top, within))
    return 0


if __name__ == "__main__":
    sys.exit(main())
