#!/usr/bin/env bash
# gpu_session.sh — everything a session lent a GPU machine should run, in
# parts that each fit one `run` call (at most 10 minutes each, 30 in all):
#
#   here, once:   ../shared/gpu/prepare.sh && bash bench/gpu_loader.sh --stage
#   there, one `run` per part, with carry: [".device"]:
#     bash .device/build.sh && . /tmp/gpu-env && bash bench/gpu_session.sh tests
#     bash .device/build.sh && . /tmp/gpu-env && bash bench/gpu_session.sh bars
#     bash .device/build.sh && . /tmp/gpu-env && bash bench/gpu_session.sh loader
#     bash .device/build.sh && . /tmp/gpu-env && bash bench/gpu_session.sh accuracy
#
# tests:  `ctest -L gpu` (test_cuda; test_cuda_2gpu skips with one GPU), then
#         test_cuda under compute-sanitizer memcheck (leaks too), then
#         configs/default.yaml on cuda:0 for one epoch (accuracy).
# bars:   bench/gpu_bars.sh (issue 14's bars; issue 15's fp32 / measured /
#         tf32 table).
# loader: bench/gpu_loader.sh (issue 23's GPU bar).
# accuracy: bench/precision_accuracy.py on cuda:0 (issue 15 item 6:
#         configs/default.yaml, 3 epochs, fp32 / bf16 / fp32 with
#         train.deterministic as the yardstick).
# The device tool's copy of the tree reported the session's first commit
# on 2026-11-24, not the one it ran: put COMMIT=$(git rev-parse --short
# HEAD), taken here, in front of the command there, and the scripts print
# that instead.
# Logs go to $OUT (what the device tool brings back) or /tmp/gpu-session;
# the last lines of each part are a summary to paste into bench/README.md
# with the commit.
set -uo pipefail
part=${1:-}
BIN=${BIN:-/tmp/gpu-build}
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
echo "gpu_session $part: commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
case "$part" in
  tests)
    (cd "$BIN" && ctest -L gpu --output-on-failure) > "$OUT/ctest-gpu.log" 2>&1
    echo "ctest -L gpu: exit $?"; grep -E "tests passed|Failed|Skipped|\*\*\*" "$OUT/ctest-gpu.log" | tail -5
    grep -E "^test_cuda: [0-9]+ passed" "$OUT/ctest-gpu.log" || grep -E "passed, [0-9]+ failed" "$OUT/ctest-gpu.log" | tail -2
    CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
    if [ -n "$CS" ]; then
      timeout 400 "$CS" --tool memcheck --leak-check full "$BIN/tests/test_cuda" \
        > "$OUT/memcheck.log" 2>&1
      echo "memcheck: exit $?"; grep -E "ERROR SUMMARY|LEAK SUMMARY|passed, [0-9]+ failed" "$OUT/memcheck.log" | tail -3
    else
      echo "memcheck: compute-sanitizer not found"
    fi
    timeout 150 "$BIN/gpipe-train" configs/default.yaml --quiet --set train.epochs=1 \
      --set 'pipeline.devices=[cuda:0]' --set "train.snapshot.dir=/tmp/gpu-session-snapshots" \
      --metrics "$OUT/default.jsonl" > "$OUT/default.log" 2>&1
    echo "default.yaml, 1 epoch on cuda:0: exit $?"; grep -o '"test_accuracy":[0-9.]*' "$OUT/default.jsonl" | tail -1
    ;;
  bars)
    OUT="$OUT/bars" BIN="$BIN" bash bench/gpu_bars.sh 2>&1 | tee "$OUT/bars.md"
    ;;
  loader)
    OUT="$OUT/loader" BIN="$BIN" bash bench/gpu_loader.sh 2>&1 | tee "$OUT/loader.md"
    ;;
  accuracy)
    timeout 560 python3 bench/precision_accuracy.py --bin "$BIN" --device cuda:0 \
      --out "$OUT/accuracy" 2>&1 | tee "$OUT/accuracy.md"
    ;;
  *)
    echo "usage: gpu_session.sh tests|bars|loader|accuracy"; exit 2 ;;
esac
