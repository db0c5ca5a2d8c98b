#!/usr/bin/python3
"""bench_procs.py — training throughput with the stages in two processes
(mpirun -np 2) against the same two CPU devices as worker threads of one
process (issue 17's bar: at least 0.95x).

  bench/bench_procs.py [--steps N] [--rounds R] [--copies fp32|bf16|both] [CONFIG.yaml]

bench/convnet.yaml by default, devices [cpu:0, cpu:1] x 1 thread, m = 8,
the config's checkpointing, free-running in both (across processes the
step is free-running by construction).  Each round runs one process, then
two, for N steps; the median step time over the rounds' steps after the
first 3 of each run.  Prints a markdown table with the processor.
--copies both adds the same two layouts with pipeline.copy_precision: bf16
(every tensor across the boundary packed to bfloat16, half the bytes),
alternating with FP32 copies in each round.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_loader import cpu_name  # the processor line every CPU table carries

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "gpipe-train")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def steps_of(cmd, metrics):
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if p.returncode:
        sys.exit("bench_procs: %s failed:\n%s" % (" ".join(cmd), p.stdout + p.stderr))
    with open(metrics) as f:
        recs = [json.loads(line) for line in f]
    return [r["step_seconds"] for r in recs if "step_seconds" in r][3:]


def main():
    args = sys.argv[1:]
    steps, rounds, cfg = 20, 3, os.path.join(ROOT, "bench", "convnet.yaml")
    copies = ["fp32"]
    def value(flag):
        if not args:
            sys.exit("bench_procs: %s needs a value (--help lists the options)" % flag)
        return args.pop(0)

    def count(flag, least):
        v = value(flag)
        if not v.isdigit() or int(v) < least:
            sys.exit("bench_procs: %s %s: a whole number, at least %d" % (flag, v, least))
        return int(v)

    while args:
        a = args.pop(0)
        if a == "--steps":
            steps = count(a, 4)  # each run's first 3 are left out
        elif a == "--rounds":
            rounds = count(a, 1)
        elif a == "--copies":
            c = value(a)
            if c not in ("fp32", "bf16", "both"):
                sys.exit("bench_procs: --copies %s: fp32, bf16 or both" % c)
            copies = ["fp32", "bf16"] if c == "both" else [c]
        elif a in ("-h", "--help"):
            print(__doc__)
            return
        elif a.startswith("-"):
            sys.exit("bench_procs: unknown option %s (--help lists them)" % a)
        elif not os.path.isfile(a):
            sys.exit("bench_procs: no config file %s" % a)
        else:
            cfg = a
    sets = ["--set", "pipeline.devices=[cpu:0, cpu:1]", "--set", "pipeline.threads=1",
            "--set", "pipeline.chunks=8", "--set", "pipeline.lockstep=false",
            "--set", "train.steps=%d" % steps, "--set", "train.eval_each_epoch=false",
            "--set", "data.test_limit=128", "--quiet"]
    one = {c: [] for c in copies}
    two = {c: [] for c in copies}
    with tempfile.TemporaryDirectory() as tmp:
        m = os.path.join(tmp, "m.jsonl")
        for _ in range(rounds):
            for c in copies:
                cs = sets + ["--set", "pipeline.copy_precision=" + c]
                one[c] += steps_of([BIN, cfg, "--metrics", m] + cs, m)
                two[c] += steps_of(["mpirun", "-np", "2", BIN, cfg, "--metrics", m] + cs, m)
    t1 = statistics.median(one[copies[0]])
    print("%s; %s; %d rounds x %d steps, medians after each run's first 3\n"
          % (cpu_name(), os.path.relpath(cfg, ROOT), rounds, steps))
    print("| layout | copies | step ms | throughput vs one process, %s copies |\n|---|---|---|---|"
          % copies[0])
    for c in copies:
        a, b = statistics.median(one[c]), statistics.median(two[c])
        print("| one process, 2 CPU devices x 1 thread (worker threads) | %s | %.1f | %.3fx |"
              % (c, a * 1e3, t1 / a))
        print("| 2 processes (mpirun -np 2), 1 device x 1 thread each | %s | %.1f | %.3fx |"
              % (c, b * 1e3, t1 / b))


if __name__ == "__main__":
    main()
