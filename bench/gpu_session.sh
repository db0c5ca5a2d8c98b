#!/usr/bin/env bash
# gpu_session.sh — everything a session lent a GPU machine should run.
#
# A drawn session now has 15 minutes of device time in all (starting the
# machine, the build, idle waits included; at most 10 minutes a call), so
# the first call does the most in one go:
#
#   here, once:   ../shared/gpu/prepare.sh; fetch github:karpathy/llm.c and
#                 github:NVIDIA/cudnn-frontend; bash bench/prepare_peers.sh
#   there, with carry: [".device"], timeout_s 600:
#     bash .device/build.sh && . /tmp/gpu-env &&
#     COMMIT=<short hash here> bash bench/gpu_session.sh first
#   (COMMIT before this script: before build.sh, which does not read it,
#   it reached no later command)
#
# first:  in priority order, each part only while enough of BUDGET seconds
#         (default 420, counted from the part's start, so after the build)
#         is left, and a line for each part skipped: `ctest -L gpu`; issue
#         50's table's four quicker rows with PyTorch beside them (the
#         `bf16` part; the U-Net and AmoebaNet-D rows are `bf16-big`'s
#         call); the `profile` part (where gpipe's bf16 step goes, by
#         layer type, beside PyTorch's profiler); issue 53's GPT-2 bar
#         (bench_gpt_gpu.py: gpipe, PyTorch eager and llm.c, built there in
#         a minute or two; torch.compile and FP32 activations in the `gpt`
#         part's own call); test_cuda under compute-sanitizer memcheck.
#         Its summary ends with the seconds each part took, for planning
#         the next call.  (2026-11-27 on an H100: the build 21-26 s, test_cuda
#         8 s, the bf16 part 190 s, bf16-big 190 s, GPT-2's gpipe and eager
#         columns 34 s; a machine started in about 35 s.)
#
# The parts alone, one `run` each where time allows:
# tests:  `ctest -L gpu` (test_cuda; test_cuda_2gpu skips with one GPU), then
#         test_cuda under compute-sanitizer memcheck (leaks too), then
#         configs/default.yaml on cuda:0 for one epoch (accuracy).
# gpt:    bench/bench_gpt_gpu.py, every column, llm.c's build included
#         (issue 53's GPT-2 speed bar; rows print as they finish).
# bars:   bench/gpu_bars.sh (issue 14's bars; issue 15's fp32 / measured /
#         tf32 / bf16 table).
# loader: bench/gpu_loader.sh (issue 23's GPU bar; run
#         `bash bench/gpu_loader.sh --stage` here first).
# bf16:   issue 50's table (gpu_bars.sh PARTS=bf16: TF32, bf16 with bf16
#         activations, bf16 with FP32 activations, PyTorch beside them)
#         on ResNet-101 at 128, ResNet-18 at 256, the convnet and the mlp
#         (BF16_RUNS overrides): the bf16 kernels' first measure.
# bf16-big: the same for the U-Net (5, 64) at 32 and AmoebaNet-D (18, 256)
#         at 64, the issue's other two rows (a call of their own: each
#         takes minutes with PyTorch beside it).
# profile: where the time goes, by layer type: gpipe-balance's per-layer
#         profile (one device, m = 1, bf16 with bf16 activations) of
#         ResNet-101 at 128 and GPT-2 124M at 16 x 1024, summed by
#         bench/profile_types.py, and PyTorch's profiler table for
#         ResNet-101 beside it (bench_gpu_peer.py --profile): what the next
#         change to the bf16 step should go after.  PROFILE_RUNS overrides
#         the "config:batch" list, PROFILE_PRECISION the precision (bf16;
#         on a CPU without bf16 instructions, fp32 checks the part: the
#         activations stay bf16).
# accuracy: bench/precision_accuracy.py on cuda:0 (issue 15 item 6:
#         configs/default.yaml, 3 epochs, fp32 / bf16 / fp32 with
#         train.deterministic as the yardstick).
# The device tool's copy of the tree reported the session's first commit
# on 2026-11-24, not the one it ran: put COMMIT=$(git rev-parse --short
# HEAD), taken here, in front of this script there (as above), and the
# scripts print that instead.
# Logs go to $OUT (what the device tool brings back) or /tmp/gpu-session;
# the last lines of each part are a summary to paste into bench/README.md
# with the commit.  BIN=build DEV=cpu:0 SCALE=32 STEPS=4 bash
# bench/gpu_session.sh first checks the script on a CPU (the GPU tests
# skip there and say so).
set -uo pipefail
part=${1:-}
BIN=${BIN:-/tmp/gpu-build}
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
echo "gpu_session $part: commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
DEV=${DEV:-cuda:0}
since() { echo $((SECONDS - $1)); }
gpu_tests() {
  (cd "$BIN" && ctest -L gpu --output-on-failure) > "$OUT/ctest-gpu.log" 2>&1
  echo "ctest -L gpu: exit $?"; grep -E "tests passed|Failed|Skipped|\*\*\*" "$OUT/ctest-gpu.log" | tail -5
  # (the tests' own counts: --output-on-failure shows a passing test's
  # output nowhere but ctest's own log)
  grep -hE "^test_cuda(_graphs)?: [0-9]+ passed" "$BIN/Testing/Temporary/LastTest.log" ||
    grep -E "passed, [0-9]+ failed" "$OUT/ctest-gpu.log" | tail -2
}
memcheck() { # seconds
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -z "$cs" ]; then echo "memcheck: compute-sanitizer not found"; return; fi
  timeout "$1" "$cs" --tool memcheck --leak-check full "$BIN/tests/test_cuda" > "$OUT/memcheck.log" 2>&1
  local rc=$?
  echo "memcheck: exit $rc$([ $rc = 124 ] && echo " (stopped after $1 s: not a verdict)")"
  grep -E "ERROR SUMMARY|LEAK SUMMARY|passed, [0-9]+ failed" "$OUT/memcheck.log" | tail -3
}
case "$part" in
  first)
    budget=${BUDGET:-420}
    start=$SECONDS
    timings=
    left() { echo $((budget - (SECONDS - start))); }
    part() { # name seconds-it-needs command...: run while that much of the budget is left
      local name=$1 need=$2 t=$SECONDS
      shift 2
      if [ "$(left)" -lt "$need" ]; then echo "$name: skipped, $(left) s of $budget left"; return; fi
      "$@"
      timings="$timings $name $(since $t) s;"
    }
    gpt_table() { # the bar's columns; torch.compile and FP32 activations: `gpu_session.sh gpt`
      timeout "$(($(left) - 20))" python3 bench/bench_gpt_gpu.py --bin "$BIN" --device "$DEV" \
        --only gpipe,eager,llmc --out "$OUT/gpt" 2>&1 | tee "$OUT/gpt.md"
      echo "gpt table: exit ${PIPESTATUS[0]}"
    }
    bf16_table() { # issue 50's four quicker rows, PyTorch beside them
      BF16_RUNS=${BF16_RUNS:-configs/resnet101.yaml:128 bench/resnet18-32.yaml:256 bench/convnet.yaml:1024 bench/mlp.yaml:2048} \
        PARTS=bf16 OUT="$OUT/bars" BIN="$BIN" DEV="$DEV" timeout "$(($(left) - 10))" \
        bash bench/gpu_bars.sh 2>&1 | tee "$OUT/bf16.md"
      echo "bf16 table: exit ${PIPESTATUS[0]}"
    }
    profile() {
      timeout "$(($(left) - 10))" bash "$0" profile 2>&1 | tee "$OUT/profile.md"
    }
    part tests 0 gpu_tests
    part "bf16 table" 200 bf16_table
    part profile 120 profile
    part "gpt table" 200 gpt_table
    part memcheck 60 memcheck "$(($(left) - 10))"
    echo "first: took$timings $((SECONDS - start)) s in all of a budget of $budget"
    ;;
  tests)
    gpu_tests
    memcheck 400
    snaps=$(mktemp -d /tmp/gpu-session-snapshots.XXXXXX)
    timeout 150 "$BIN/gpipe-train" configs/default.yaml --quiet --set train.epochs=1 \
      --set "pipeline.devices=[$DEV]" --set "train.snapshot.dir=$snaps" \
      --metrics "$OUT/default.jsonl" > "$OUT/default.log" 2>&1
    echo "default.yaml, 1 epoch on $DEV: exit $?"; grep -o '"test_accuracy":[0-9.]*' "$OUT/default.jsonl" | tail -1
    rm -rf "$snaps"
    ;;
  gpt)
    timeout 560 python3 bench/bench_gpt_gpu.py --bin "$BIN" --device "$DEV" --out "$OUT/gpt" 2>&1 |
      tee "$OUT/gpt.md"
    ;;
  bars)
    OUT="$OUT/bars" BIN="$BIN" bash bench/gpu_bars.sh 2>&1 | tee "$OUT/bars.md"
    ;;
  loader)
    OUT="$OUT/loader" BIN="$BIN" bash bench/gpu_loader.sh 2>&1 | tee "$OUT/loader.md"
    ;;
  bf16)
    BF16_RUNS=${BF16_RUNS:-configs/resnet101.yaml:128 bench/resnet18-32.yaml:256 bench/convnet.yaml:1024 bench/mlp.yaml:2048} \
      PARTS=bf16 OUT="$OUT/bars" BIN="$BIN" DEV="$DEV" timeout 560 bash bench/gpu_bars.sh 2>&1 |
      tee "$OUT/bf16.md"
    ;;
  bf16-big)
    BF16_RUNS=${BF16_RUNS:-configs/unet.yaml:32 configs/amoebanet-d.yaml:64} \
      PARTS=bf16 OUT="$OUT/bars" BIN="$BIN" DEV="$DEV" timeout 560 bash bench/gpu_bars.sh 2>&1 |
      tee "$OUT/bf16-big.md"
    ;;
  profile)
    for spec in ${PROFILE_RUNS:-configs/resnet101.yaml:128 configs/gpt2.yaml:16}; do
      cfg=${spec%:*}; batch=${spec#*:}; name=$(basename "$cfg" .yaml)
      if ! timeout 240 "$BIN/gpipe-balance" "$cfg" --devices 1 --chunks 1 --reps 3 -q \
          --set "pipeline.devices=[$DEV]" --set "train.batch_size=$batch" \
          --set "train.precision=${PROFILE_PRECISION:-bf16}" --set train.activations=bf16 \
          --profile-out "$OUT/$name-$batch-profile.json" > "$OUT/$name-$batch-balance.log" 2>&1; then
        echo "profile $name at $batch: gpipe-balance failed:"; tail -3 "$OUT/$name-$batch-balance.log"
        continue
      fi
      python3 bench/profile_types.py "$OUT/$name-$batch-profile.json"
      echo
    done
    peer=
    for p in python3 /usr/bin/python3; do "$p" -c "import torch" 2>/dev/null && { peer=$p; break; }; done
    if [ -n "$peer" ]; then
      timeout 200 "$peer" bench/bench_gpu_peer.py --device "$DEV" --steps 6 --precisions bf16 \
        --profile 3 configs/resnet101.yaml:128 2>&1 | tail -45
    else
      echo "(no PyTorch profile: neither python3 nor /usr/bin/python3 imports torch)"
    fi
    ;;
  accuracy)
    timeout 560 python3 bench/precision_accuracy.py --bin "$BIN" --device "$DEV" \
      --out "$OUT/accuracy" 2>&1 | tee "$OUT/accuracy.md"
    ;;
  *)
    echo "usage: gpu_session.sh first|tests|gpt|bars|bf16|bf16-big|profile|loader|accuracy"; exit 2 ;;
esac
