#!/usr/bin/env bash
# gpu_bars.sh — issue 14's bars on one GPU, in one call, for a session that
# is lent a GPU machine (its device time goes further when nothing is typed
# there by hand):
#
#   bash .device/build.sh && . /tmp/gpu-env && bash bench/gpu_bars.sh
#
# For ResNet-18 (bench/resnet18-32.yaml) at batch 2048 and 256, and
# bench/convnet.yaml at batch 8192 and 1024, on cuda:0: the median step at
# m = 1 and m = 8 and their ratio (bar: m = 8 within 1.05x of m = 1 at the
# large batches), and host waits per device per step (bar: 1).  Then
# ResNet-18 batch 2048 on two stages of one GPU ([cuda:0, cuda:0], m = 8)
# against one stage at m = 1 (bar: within 1.10x), with a trace of it for
# the copies' overlap (scripts/timeline.py summary), and free-running
# (lockstep: false) beside it with the two timelines compared.  Steps 3.. of 12 are
# timed (the first ones pick algorithms and warm the caching allocator).
# Prints a Markdown table; traces and metrics go to $OUT (the device tool's
# folder that comes back) or /tmp/gpu-bars.  BIN=build DEV=cpu:0 SCALE=32
# STEPS=4 runs the same on a CPU with batches / 32, to check the script
# itself; PARTS=precision runs only issue 15's part below; PARTS=bf16 only
# issue 50's table (just below).
# Last, issue 15's fp32 against tf32 on the five configs of its table, and
# fp32 with train.deterministic (cuDNN's heuristic choice, as at 82fd00b)
# against the default measured choice; the mlp's products on cuBLASLt
# against cublasSgemm (GPIPE_CUBLASLT=0); then PyTorch on the same GPU
# (bench/bench_gpu_peer.py: fp32, tf32, bf16 autocast) with gpipe's times
# beside it.
set -euo pipefail
if [ $# -gt 0 ]; then sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; fi
cd "$(dirname "$0")/.."
BIN=${BIN:-/tmp/gpu-build}
OUT=${OUT:-/tmp/gpu-bars}
STEPS=${STEPS:-12}
DEV=${DEV:-cuda:0}
SCALE=${SCALE:-1}
[ -x "$BIN/gpipe-train" ] ||
  { echo "gpu_bars: no $BIN/gpipe-train: set BIN to a build folder (on a CPU: BIN=build)"; exit 2; }
[ "$STEPS" -ge 3 ] || { echo "gpu_bars: STEPS=$STEPS: at least 3 (steps 3.. are timed)"; exit 2; }
mkdir -p "$OUT"
PY=$(command -v python3) # the tables need only the standard library
# the peer needs PyTorch: the GPU machine's python3 has it, Debian's
# /usr/bin/python3 has its own where python3-torch is installed
PEER_PY=
for p in python3 /usr/bin/python3; do
  if "$p" -c "import torch" 2>/dev/null; then PEER_PY=$p; break; fi
done
train() { # name config batch devices chunks [extra --set ...]
  local name=$1 cfg=$2 batch=$(($3 / SCALE)) devs=${4//cuda:0/$DEV} m=$5 masks=
  shift 5
  # a segmentation config's synthetic data keeps its per-pixel masks
  grep -q "masks: true" "$cfg" && masks=", masks: true"
  "$BIN/gpipe-train" "$cfg" --quiet --set "train.steps=$STEPS" --set "train.batch_size=$batch" \
    --set "pipeline.devices=$devs" --set "pipeline.chunks=$m" \
    --set data.dataset=synthetic --set "data.synthetic={train: $((batch * STEPS)), test: 256$masks}" \
    --metrics "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1 ||
    { echo "gpu_bars: $name failed:"; tail -5 "$OUT/$name.log"; return 1; }
}
median() { # metrics file -> "median_step_ms max_host_waits peak_bytes later_peak_bytes" (the
  # last: steps after the first, whose algorithm searches borrow workspace); a failure ends
  # the script
  "$PY" - "$1" <<'EOF'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step_seconds"' in l]
t = [s["step_seconds"] for s in steps[2:]]
w = [d.get("host_waits", -1) for s in steps[2:] for d in s["devices"]]
p = [d.get("peak_bytes", 0) for s in steps for d in s["devices"]]
q = [d.get("peak_bytes", 0) for s in steps[1:] for d in s["devices"]]
print("%.2f %d %d %d" % (statistics.median(t) * 1e3, max(w), max(p), max(q)))
EOF
}
ratio() { "$PY" -c "print('%.2f' % ($1 / $2))"; }
echo "gpu_bars: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
if [ "${PARTS:-all}" = bf16 ]; then
# Issue 50's table: the seeds' models (and three small ones) at the
# issue's batches, one stage, m = 1: TF32, bf16 (activations stored in
# bf16, train.activations: bf16, what `auto` gives on GPUs, its chains
# channels-last) and the same bf16 with GPIPE_CUDA_NHWC=0 (every map plain
# NCHW: issue 67's A/B), each with its peak device memory; BF16_VARIANTS
# picks the columns (default "tf32 bf16 bf16nchw"; bf16chains is bf16 with
# GPIPE_CUDA_NHWC=chains, channels-last only inside chains; bf16a32 is bf16
# with FP32 activations, the contract before issue 50), and
# PyTorch's TF32 and bf16 autocast beside them with theirs, in NCHW and in
# channels_last (the ratio takes the faster: issue 67), and torch.compile's
# where PEER_COMPILE=1 (a column, not a bar; its compiles take minutes).
echo "gpu_bars bf16: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
variants=(${BF16_VARIANTS:-tf32 bf16 bf16nchw})
echo "| model, batch | $(printf '%s ms | ' "${variants[@]}")peak GB $(IFS=/; echo "${variants[*]}") | the same after step 1 |"
echo "|---|$(printf -- '---|%.0s' "${variants[@]}")---|---|"
rm -f "$OUT/gpipe-times.txt"
peer_runs=
for spec in ${BF16_RUNS:-configs/resnet101.yaml:128 configs/unet.yaml:32 configs/amoebanet-d.yaml:64 bench/resnet18-32.yaml:256 bench/convnet.yaml:1024 bench/mlp.yaml:2048}; do
  cfg=${spec%:*}; batch=${spec#*:}; model=$(basename "$cfg" .yaml)
  t=(); p=(); pq=()
  for v in "${variants[@]}"; do
    nhwc=1 # (channels-last everywhere; GPIPE_CUDA_NHWC takes 0, 1 or chains, and
           # refused the "all" this once said, so no tf32 or bf16 column ran)
    case $v in
      tf32) sets=(--set train.precision=tf32) ;;
      bf16) sets=(--set train.precision=bf16 --set train.activations=bf16) ;;
      bf16nchw) sets=(--set train.precision=bf16 --set train.activations=bf16); nhwc=0 ;;
      bf16chains) sets=(--set train.precision=bf16 --set train.activations=bf16); nhwc=chains ;;
      bf16a32) sets=(--set train.precision=bf16 --set train.activations=fp32) ;;
      *) echo "gpu_bars: unknown BF16_VARIANTS entry $v"; exit 2 ;;
    esac
    if GPIPE_CUDA_NHWC=$nhwc train "$model-$batch-$v" "$cfg" "$batch" "[cuda:0]" 1 --set pipeline.balance=auto "${sets[@]}"; then
      read -r ms _ pk pl <<< "$(median "$OUT/$model-$batch-$v.jsonl")"
    else
      ms=-; pk=0; pl=0
    fi
    t+=("$ms"); p+=("$pk"); pq+=("$pl")
  done
  gb() { "$PY" -c "import sys; print(' / '.join('%.2f' % (int(x) / 1e9) for x in sys.argv[1:]))" "$@"; }
  echo "| $model, $batch | $(printf '%s | ' "${t[@]}")$(gb "${p[@]}") | $(gb "${pq[@]}") |"
  b=$((batch / SCALE))
  for i in "${!variants[@]}"; do # the PyTorch table's gpipe column: tf32 and bf16
    case ${variants[$i]} in tf32|bf16) [ "${t[$i]}" = - ] ||
      echo "$cfg $b ${variants[$i]} ${t[$i]} ${p[$i]}" >> "$OUT/gpipe-times.txt" ;; esac
  done
  peer_runs="$peer_runs $cfg:$b"
done
echo
if [ -z "$PEER_PY" ]; then
  echo "(no PyTorch peer: neither python3 nor /usr/bin/python3 imports torch)"
else
  "$PEER_PY" bench/bench_gpu_peer.py --device "$DEV" --steps "$STEPS" --precisions tf32,bf16 \
    ${PEER_COMPILE:+--compile} --gpipe "$OUT/gpipe-times.txt" $peer_runs 2>&1 ||
    echo "(no PyTorch peer: bench_gpu_peer.py failed)"
fi
exit 0
fi
if [ "${PARTS:-all}" != precision ]; then
echo
echo "| model, batch | m = 1 ms | m = 8 ms | m = 8 / m = 1 | host waits (max per device per step) |"
echo "|---|---|---|---|---|"
for spec in "resnet18 bench/resnet18-32.yaml 2048" "convnet bench/convnet.yaml 8192" \
            "resnet18 bench/resnet18-32.yaml 256" "convnet bench/convnet.yaml 1024"; do
  read -r model cfg batch <<< "$spec"
  train "$model-$batch-m1" "$cfg" "$batch" "[cuda:0]" 1
  train "$model-$batch-m8" "$cfg" "$batch" "[cuda:0]" 8
  mt=$(median "$OUT/$model-$batch-m1.jsonl"); read -r t1 w1 _ <<< "$mt"
  mt=$(median "$OUT/$model-$batch-m8.jsonl"); read -r t8 w8 _ <<< "$mt"
  echo "| $model, $batch | $t1 | $t8 | $(ratio "$t8" "$t1") | $w1, $w8 |"
done
echo
train resnet18-2048-2stages bench/resnet18-32.yaml 2048 "[cuda:0, cuda:0]" 8 \
  --trace "$OUT/resnet18-2048-2stages.json" --trace-steps "$((STEPS / 2)):$((STEPS / 2 + 1))"
mt=$(median "$OUT/resnet18-2048-2stages.jsonl"); read -r t2 w2 _ <<< "$mt"
mt=$(median "$OUT/resnet18-2048-m1.jsonl"); read -r t1 _ _ <<< "$mt"
echo "2 stages on one GPU, ResNet-18 batch 2048, m = 8: $t2 ms against 1 stage at m = 1 $t1 ms:" \
     "$(ratio "$t2" "$t1")x (bar: <= 1.10); host waits $w2"
"$PY" scripts/timeline.py summary "$OUT/resnet18-2048-2stages.json" || true
# issue 14 item 2: lockstep keeps its meaning; the same 2 stages free-running
train resnet18-2048-2stages-free bench/resnet18-32.yaml 2048 "[cuda:0, cuda:0]" 8 \
  --set pipeline.lockstep=false \
  --trace "$OUT/resnet18-2048-2stages-free.json" --trace-steps "$((STEPS / 2)):$((STEPS / 2 + 1))"
mt=$(median "$OUT/resnet18-2048-2stages-free.jsonl"); read -r tfree wfree _ <<< "$mt"
echo "the same, free-running (lockstep: false): $tfree ms against lockstep $t2 ms; host waits $wfree"
"$PY" scripts/timeline.py summary "$OUT/resnet18-2048-2stages-free.json" || true
# the picture side by side, where matplotlib is there
"$PY" scripts/timeline.py compare -o "$OUT/lockstep-vs-free.png" "$OUT/resnet18-2048-2stages.json" \
  "$OUT/resnet18-2048-2stages-free.json" > /dev/null 2>&1 || echo "(no picture: no matplotlib)"
fi # PARTS
# Issue 15's precision columns: the five configs of its table, one stage,
# m = 1, in FP32, with train.precision: tf32 (TF32 tensor cores in cuBLAS
# and cuDNN; a CPU device computes FP32 under tf32, so DEV=cpu:0 only
# checks the script) and with train.precision: bf16 (bf16 tensor cores;
# on DEV=cpu:0 only where the processor has bf16 instructions).
echo
rm -f "$OUT/gpipe-times.txt"
peer_runs=
echo "| model, batch | fp32 deterministic ms | fp32 ms (measured algorithms) | measured / deterministic | tf32 ms | tf32 / fp32 | bf16 ms | bf16 / fp32 |"
echo "|---|---|---|---|---|---|---|---|"
for spec in "mlp bench/mlp.yaml 256" "mlp bench/mlp.yaml 2048" "convnet bench/convnet.yaml 128" \
            "convnet bench/convnet.yaml 1024" "resnet18 bench/resnet18-32.yaml 256"; do
  read -r model cfg batch <<< "$spec"
  train "$model-$batch-det" "$cfg" "$batch" "[cuda:0]" 1 --set train.deterministic=true
  train "$model-$batch-fp32" "$cfg" "$batch" "[cuda:0]" 1
  train "$model-$batch-tf32" "$cfg" "$batch" "[cuda:0]" 1 --set train.precision=tf32
  # bf16 where the device has it (a CPU without bf16 instructions refuses)
  tb=-
  if train "$model-$batch-bf16" "$cfg" "$batch" "[cuda:0]" 1 --set train.precision=bf16; then
    mt=$(median "$OUT/$model-$batch-bf16.jsonl"); read -r tb _ _ <<< "$mt"
  fi
  mt=$(median "$OUT/$model-$batch-det.jsonl"); read -r td _ _ <<< "$mt"
  mt=$(median "$OUT/$model-$batch-fp32.jsonl"); read -r tf _ _ <<< "$mt"
  mt=$(median "$OUT/$model-$batch-tf32.jsonl"); read -r tt _ _ <<< "$mt"
  echo "| $model, $batch | $td | $tf | $(ratio "$tf" "$td") | $tt | $(ratio "$tt" "$tf") | $tb |" \
       "$([ "$tb" = - ] && echo - || ratio "$tb" "$tf") |"
  b=$((batch / SCALE))
  printf "%s %d fp32 %s\n%s %d tf32 %s\n" "$cfg" "$b" "$tf" "$cfg" "$b" "$tt" >> "$OUT/gpipe-times.txt"
  [ "$tb" = - ] || printf "%s %d bf16 %s\n" "$cfg" "$b" "$tb" >> "$OUT/gpipe-times.txt"
  peer_runs="$peer_runs $cfg:$b"
done
# The products on cuBLASLt (measured algorithm per shape, bias and relu in
# the epilogue; cuda_blas.c) against cublasSgemm and gpipe's own bias and
# relu kernels (GPIPE_CUBLASLT=0), where the products are the step: the mlp.
echo
echo "| model, batch | fp32 classic ms | fp32 cuBLASLt ms | Lt / classic | tf32 classic ms | tf32 cuBLASLt ms | Lt / classic |"
echo "|---|---|---|---|---|---|---|"
for batch in 256 2048; do
  GPIPE_CUBLASLT=0 train "mlp-$batch-fp32-classic" bench/mlp.yaml "$batch" "[cuda:0]" 1
  GPIPE_CUBLASLT=0 train "mlp-$batch-tf32-classic" bench/mlp.yaml "$batch" "[cuda:0]" 1 \
    --set train.precision=tf32
  mt=$(median "$OUT/mlp-$batch-fp32-classic.jsonl"); read -r fc _ _ <<< "$mt"
  mt=$(median "$OUT/mlp-$batch-fp32.jsonl"); read -r fl _ _ <<< "$mt"
  mt=$(median "$OUT/mlp-$batch-tf32-classic.jsonl"); read -r tc _ _ <<< "$mt"
  mt=$(median "$OUT/mlp-$batch-tf32.jsonl"); read -r tl _ _ <<< "$mt"
  echo "| mlp, $batch | $fc | $fl | $(ratio "$fl" "$fc") | $tc | $tl | $(ratio "$tl" "$tc") |"
done
# PyTorch on the same GPU, the same five configs, fp32 / tf32 / bf16
# autocast, beside gpipe's (issue 15's bars: PyTorch / gpipe >= 1.10)
echo
if [ -z "$PEER_PY" ]; then
  echo "(no PyTorch peer: neither python3 nor /usr/bin/python3 imports torch)"
else
  "$PEER_PY" bench/bench_gpu_peer.py --device "$DEV" --steps "$STEPS" --gpipe "$OUT/gpipe-times.txt" \
    $peer_runs 2>&1 || echo "(no PyTorch peer: bench_gpu_peer.py failed)"
fi
