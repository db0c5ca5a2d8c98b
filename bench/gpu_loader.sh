#!/usr/bin/env bash
# gpu_loader.sh — issue 23's GPU bar in one call, for a session lent a GPU
# machine: does the image loader keep a GPU fed?
#
#   here, once:  ../shared/gpu/prepare.sh && bash bench/gpu_loader.sh --stage
#   there:       bash .device/build.sh && . /tmp/gpu-env && bash bench/gpu_loader.sh
#
# --stage (run here, where Debian's registry is reachable) adds the image
# libraries that prepare.sh does not stage (libturbojpeg, libjpeg-turbo,
# libpng) to .device/debs, so the GPU build has image_folder.
#
# There: writes IMAGES JPEGs of ImageNet-like size and quality
# (scripts/make-image-folder.py, 500x375 +-25%, quality 90) in 8 classes,
# then measures
#   1. the loader alone (bench_loader: decode + RandomResizedCrop 224 +
#      flip + normalise, batches of 64) at 1, 4 and 16 workers, images/s;
#   2. ResNet-50 (configs/resnet50-imagenet.yaml, 8 classes) at batch 256
#      on one stage of DEV, m = 1: on synthetic data (the GPU's own rate)
#      and from the folder (the default data.workers), median step, images/s
#      and the median data_wait_seconds per step.
# The GPU keeps fed when (2)'s folder rate matches its synthetic rate and
# the data wait is small against the step.  Prints Markdown; logs and
# metrics go to $OUT (the device tool's folder that comes back) or
# /tmp/gpu-loader.  BIN=build DEV=cpu:0 BATCH=16 IMAGES=96 STEPS=3 runs the
# same on a CPU, to check the script.
set -euo pipefail
if [ $# -gt 1 ] || { [ $# = 1 ] && [ "$1" != --stage ]; }; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2
fi
cd "$(dirname "$0")/.."
if [ "${1:-}" = --stage ]; then
  root=$(pwd)
  [ -d "$root/.device/debs" ] || { echo "gpu_loader: run ../shared/gpu/prepare.sh first"; exit 1; }
  cd "$root/.device/debs"
  apt-get download libturbojpeg0 libturbojpeg0-dev libjpeg62-turbo libjpeg62-turbo-dev \
    libpng-dev libpng16-16 2>&1 | grep -v unsandboxed || true
  ls ./*jpeg* ./*png*
  exit 0
fi
BIN=${BIN:-/tmp/gpu-build}
OUT=${OUT:-/tmp/gpu-loader}
DEV=${DEV:-cuda:0}
BATCH=${BATCH:-256}
IMAGES=${IMAGES:-2048}
STEPS=${STEPS:-12}
DIR=${DIR:-/tmp/gpipe-imagenet-like-gpu}
[ "$STEPS" -ge 3 ] || { echo "gpu_loader: STEPS=$STEPS: at least 3 (steps 3.. are timed)"; exit 2; }
mkdir -p "$OUT"
# the final snapshots (ResNet-50's, hundreds of MB) stay out of $OUT
snaps=$(mktemp -d /tmp/gpu-loader-snapshots.XXXXXX)
trap 'rm -rf "$snaps"' EXIT
# an interpreter with Pillow and numpy (here Debian's; there PyTorch's)
PY=
for p in /usr/bin/python3 python3; do
  if "$p" -c "import numpy, PIL" 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { echo "gpu_loader: no python3 with Pillow and numpy"; exit 1; }
[ -x "$BIN/gpipe-train" ] ||
  { echo "gpu_loader: no $BIN/gpipe-train: set BIN to a build folder (on a CPU: BIN=build)"; exit 2; }
[ -x "$BIN/bench_loader" ] ||
  { echo "gpu_loader: no $BIN/bench_loader: build with the image libraries (on the GPU" \
         "machine: bash bench/gpu_loader.sh --stage here first)"; exit 1; }
if [ ! -d "$DIR/train" ]; then
  per=$((IMAGES / 8))
  "$PY" scripts/make-image-folder.py "$DIR" --classes 8 --train "$per" --val 4 \
    --size 500x375 --quality 90 --png 0 > "$OUT/make-folder.log" 2>&1 ||
    { echo "gpu_loader: writing the folder failed:"; tail -5 "$OUT/make-folder.log"; exit 1; }
fi
[ -n "$(find "$DIR/train" -name '*.jpg' -print -quit)" ] ||
  { echo "gpu_loader: no JPEGs under $DIR/train: remove the folder (or set DIR) to write them"; exit 1; }
echo "gpu_loader: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)," \
     "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), commit" \
     "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}, $(find "$DIR/train" -name '*.jpg' | wc -l) JPEGs"
echo
echo "| loader workers | images/s |"
echo "|---|---|"
for w in 1 4 16; do
  if ! "$BIN/bench_loader" "$DIR" --workers "$w" --batches 30 > "$OUT/loader-$w.log" 2>&1; then
    echo "gpu_loader: bench_loader --workers $w failed:"; tail -5 "$OUT/loader-$w.log"; exit 1
  fi
  rate=$(grep -o '[0-9.]* images/s' "$OUT/loader-$w.log" | tail -1 | cut -d' ' -f1 || true)
  echo "| $w | ${rate:-? (no rate in $OUT/loader-$w.log)} |"
done
train() { # name [--set ...]
  local name=$1
  shift
  "$BIN/gpipe-train" configs/resnet50-imagenet.yaml --quiet --set "train.steps=$STEPS" \
    --set "train.batch_size=$BATCH" --set "pipeline.devices=[$DEV]" --set pipeline.chunks=1 \
    --set pipeline.balance=auto --set model.resnet.classes=8 --set train.eval_each_epoch=false \
    --set "train.snapshot.dir=$snaps/$name" \
    --metrics "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1 ||
    { echo "gpu_loader: $name failed:"; tail -5 "$OUT/$name.log"; return 1; }
}
summary() { # metrics -> "median_step_ms images_per_s median_wait_ms"; a failure ends the script
  "$PY" - "$1" "$BATCH" <<'EOF'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step_seconds"' in l][2:]
t = statistics.median(s["step_seconds"] for s in steps)
w = statistics.median(s.get("data_wait_seconds", 0.0) for s in steps)
print("%.1f %.1f %.2f" % (t * 1e3, int(sys.argv[2]) / t, w * 1e3))
EOF
}
train resnet50-synthetic --set data.dataset=synthetic \
  --set "data.synthetic={train: $((BATCH * STEPS)), test: 16, classes: 8, shape: [3, 224, 224]}"
train resnet50-folder --set "data.path=$DIR"
sm=$(summary "$OUT/resnet50-synthetic.jsonl"); read -r ts rs _ <<< "$sm"
sm=$(summary "$OUT/resnet50-folder.jsonl"); read -r tf rf wf <<< "$sm"
echo
echo "| ResNet-50, batch $BATCH, $DEV, m = 1 | step ms | images/s | data wait ms per step |"
echo "|---|---|---|---|"
echo "| synthetic data (no loader) | $ts | $rs | |"
echo "| image folder (default data.workers) | $tf | $rf | $wf |"
