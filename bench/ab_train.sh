#!/usr/bin/env bash
# ab_train.sh — time two gpipe-train builds on one config, alternating, so
# the machine's drift falls on both alike (an A/B of a change: build the
# commit before it in a worktree, e.g. `git worktree add /tmp/before HEAD~`
# and `cmake -S /tmp/before -B /tmp/before/build -DCMAKE_BUILD_TYPE=Release`).
#
# usage: bench/ab_train.sh A/gpipe-train B/gpipe-train CONFIG.yaml ROUNDS STEPS [gpipe-train options]
#   e.g. bench/ab_train.sh /tmp/before/build/gpipe-train build/gpipe-train bench/convnet.yaml 3 12 \
#          --set pipeline.devices=2 --set pipeline.threads=1 --set pipeline.chunks=8 \
#          --set pipeline.schedule=1f1b --set pipeline.lockstep=false --set data.dataset=synthetic
# Prints, per round and build, the median step time over steps 3..STEPS
# (--metrics' step_seconds) and each device's peak memory; then the median
# of the rounds and B's speed-up over A.  Benchmarks print; they never fail
# a build.
set -uo pipefail
if [ $# -lt 5 ]; then sed -n 2,14p "$0"; exit 2; fi
a=$1 b=$2 cfg=$3 rounds=$4 steps=$5
shift 5
py=/usr/bin/python3 # Debian's: the stdlib is all this needs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nproc) cores;" \
     "flags: $(grep -m1 -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for r in $(seq 1 "$rounds"); do
  for side in A B; do
    bin=$a; [ $side = B ] && bin=$b
    if ! "$bin" "$cfg" --no-progress -q --set "train.steps=$steps" --set train.eval_each_epoch=false \
         --set train.log_every=0 "$@" --metrics "$tmp/$side.$r.jsonl" >"$tmp/$side.log" 2>&1; then
      echo "round $r $side: $bin failed:"; tail -3 "$tmp/$side.log"; exit 1
    fi
    "$py" - "$tmp/$side.$r.jsonl" "$r" "$side" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_seconds"' in l]
if not rows:
    sys.exit("round %s %s: no steps in %s" % (sys.argv[2], sys.argv[3], sys.argv[1]))
t = [x["step_seconds"] for x in rows][2:] or [x["step_seconds"] for x in rows]
peaks = [max(x["devices"][d]["peak_bytes"] for x in rows) / 2**20 for d in range(len(rows[0]["devices"]))]
print("round %s %s: %.1f ms a step; peak %s MiB" % (sys.argv[2], sys.argv[3], 1000 * statistics.median(t),
      " / ".join("%.1f" % p for p in peaks)))
PY
    [ $? = 0 ] || exit 1
  done
done | tee "$tmp/out"
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
"$py" - "$tmp/out" <<'PY'
import re, statistics, sys
ms = {"A": [], "B": []}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (A|B): ([\d.]+) ms", line)
    if m: ms[m.group(1)].append(float(m.group(2)))
a, b = statistics.median(ms["A"]), statistics.median(ms["B"])
print("median of rounds: A %.1f ms, B %.1f ms; B / A throughput %.3fx" % (a, b, a / b))
PY
