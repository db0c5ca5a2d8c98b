#!/usr/bin/env bash
# snapshot_step.sh — what a snapshot costs the step that takes it: two
# gpipe-train builds (before and after a change to snapshots) on a model
# with ResNet-101's parameter count (44.8 M parameters against its 44.5 M;
# with SGD momentum 358 MB of state, as configs/resnet101.yaml) but an MLP's
# cheap compute, on CPU devices.  Each run takes a snapshot every 4 steps;
# the wall-clock time from one step's --metrics record to the next is timed
# as the records arrive on a pipe, so an interval after a snapshot step
# holds the snapshot (what the run waits for) and the next step.
#
# usage: bench/snapshot_step.sh A/gpipe-train B/gpipe-train [ROUNDS] [BATCH] [STEPS]
#   e.g. bench/snapshot_step.sh /tmp/before/build/gpipe-train build/gpipe-train 2 64
# A batch of 1400 gives a step ResNet-101's multiply-adds at a batch of 8
# images of 224x224 (3 x 134 M per sample against 3 x 8 x 7.8 G), so the
# copy weighs on it as it would on configs/resnet101.yaml's step.
# Prints, per build, the median interval of a plain step, of the step that
# takes a snapshot (the first of a run, at step 4, apart: it allocates the
# host buffers the later ones reuse) and of the step after it (which
# shares the machine with a background writer), and the ratio snapshot /
# plain measured within the same runs; per run, the load average when it
# started and the CPU time it took (user + system, its own threads and the
# kernel's work for them: what the snapshots cost the machine, which the
# other jobs' load does not change the way it changes wall-clock steps).
# DEVICES (default "[cpu:0, cpu:1]") and THREADS (math threads per device,
# default 0: cores / devices) place the stages: "DEVICES=[cpu:0]" with one thread leaves a
# 2-core machine's other core to the writer, as a GPU host leaves the
# writer its idle cores.
# Benchmarks print; they never fail a build.
set -uo pipefail
if [ $# -lt 2 ]; then sed -n 2,28p "$0"; exit 2; fi
a=$1 b=$2 rounds=${3:-2} batch=${4:-64} steps=${5:-14}
devices=${DEVICES:-[cpu:0, cpu:1]} threads=${THREADS:-0}
py=/usr/bin/python3 # Debian's: the stdlib is all this needs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nproc) cores;" \
     "flags: $(grep -m1 -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
cat >"$tmp/m.yaml" <<EOF
# 4096 x 8192 + 8192 x 1376 + 1376 x 10 weights and their biases: 44.8 M
model:
  input: [1, 64, 64]
  layers: [flatten, {linear: {out: 8192}}, relu, {linear: {out: 1376}}, relu, {linear: {out: 10}}]
data:
  dataset: synthetic
  synthetic: {train: 2048, test: 16, classes: 10, shape: [1, 64, 64]}
train:
  batch_size: $batch
  steps: $steps
  eval_each_epoch: false
  log_every: 0
  optimizer: {lr: 0.01, momentum: 0.9}
  snapshot: {every_steps: 4, keep: 2}
pipeline:
  devices: $devices
  threads: $threads
  chunks: 4
EOF
"$py" - "$a" "$b" "$rounds" "$tmp" <<'PY'
import json, os, resource, statistics, subprocess, sys, time
a, b, rounds, tmp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
res = {"A": {"plain": [], "first": [], "snap": [], "after": []},
       "B": {"plain": [], "first": [], "snap": [], "after": []}}
cpu = {"A": [], "B": []}
for r in range(1, rounds + 1):
    for side, binary in (("A", a), ("B", b)):
        d = "%s/snaps-%s-%d" % (tmp, side, r)
        load = os.getloadavg()[0]
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.Popen([binary, tmp + "/m.yaml", "-q", "--no-progress", "--metrics",
                              "/dev/stdout", "--set", "train.snapshot.dir=" + d],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        at = {}
        for line in p.stdout:
            now = time.monotonic()
            if '"step_seconds"' in line:
                at[json.loads(line)["step"]] = now
        err = p.stderr.read()
        if p.wait() != 0:
            sys.exit("round %d %s: %s failed: %s" % (r, side, binary, err.strip()[-400:]))
        ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[side].append(ru2.ru_utime - ru.ru_utime + ru2.ru_stime - ru.ru_stime)
        # interval s: from step s's record to step s+1's; s % 4 == 0 took a snapshot
        iv = {s: at[s + 1] - at[s] for s in at if s + 1 in at and s >= 2}
        for s, t in iv.items():
            kind = ("first" if s == 4 else "snap") if s % 4 == 0 else "after" if s % 4 == 1 else "plain"
            res[side][kind].append(t)
        print("round %d %s (load %.1f): %.1f s CPU; plain %s ms; snapshot steps %s ms" % (r, side,
              load, cpu[side][-1],
              " ".join("%.0f" % (1000 * t) for s, t in sorted(iv.items()) if s % 4 in (2, 3)),
              " ".join("%.0f" % (1000 * t) for s, t in sorted(iv.items()) if s % 4 == 0)),
              flush=True)
for side, binary in (("A", a), ("B", b)):
    m = {k: statistics.median(v) for k, v in res[side].items()}
    print("%s (%s): plain step %.0f ms, step with a snapshot %.0f ms (%.2fx; +%.0f ms; the "
          "first of a run %.2fx), the step after it %.0f ms (%.2fx)" % (side, binary,
          1000 * m["plain"], 1000 * m["snap"], m["snap"] / m["plain"],
          1000 * (m["snap"] - m["plain"]), m["first"] / m["plain"], 1000 * m["after"],
          m["after"] / m["plain"]))
print("CPU per run (user + system, median): A %.1f s, B %.1f s" % (statistics.median(cpu["A"]),
      statistics.median(cpu["B"])))
PY
