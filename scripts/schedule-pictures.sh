#!/bin/sh
# schedule-pictures.sh — the schedule pictures of docs/pipelines.md
# ("Schedules"): one step of each built-in schedule on 2 CPU devices of one thread
# (configs/default.yaml, synthetic data, batch 256, 4 micro-batches,
# checkpoint never, free-running), recorded by gpipe-train --trace and drawn
# by scripts/timeline.py gantt, so every picture comes from the instruction
# lists the executor ran.  The V schedules get 4 stages (2 per device).
#
#   scripts/schedule-pictures.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, docs)
#
# Needs /usr/bin/python3 with matplotlib (Debian's python3-matplotlib).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
out=${2:-$here/docs}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for s in gpipe 1f1b zb-h1 interleaved zb-v dualpipe-v v-half v-min; do
    "$build/gpipe-train" "$here/configs/default.yaml" -q --set data.dataset=synthetic \
        --set 'pipeline.devices=[cpu:0, cpu:1]' --set pipeline.threads=1 \
        --set train.batch_size=256 --set pipeline.chunks=4 --set pipeline.checkpoint=never \
        --set pipeline.lockstep=false --set pipeline.schedule=$s --set train.steps=3 \
        --set train.epochs=null --set train.snapshot.every_steps=0 --trace "$tmp/$s.json"
    /usr/bin/python3 "$here/scripts/timeline.py" gantt "$tmp/$s.json" --steps 2 \
        -o "$out/schedule-$s.png"
done
