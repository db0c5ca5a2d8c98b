#!/usr/bin/env bash
# prepare_peers.sh — the peers' sources bench/bench_gpt_gpu.py builds on a
# GPU machine, which reaches no network: llm.c (Makefile, train_gpt2.cu,
# llmc/) and cudnn-frontend's headers (llm.c's flash attention), put in
# .device/peers, which the device tool's `carry: [".device"]` takes along
# (about 4 MB).  Run here after ../shared/gpu/prepare.sh and after fetching
# github:karpathy/llm.c and github:NVIDIA/cudnn-frontend (the fetch tool
# puts their git directories under /work/.mirror); or name the two git
# directories:
#   bash bench/prepare_peers.sh [LLMC_GIT_DIR CUDNN_FRONTEND_GIT_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
llmc=${1:-/work/.mirror/karpathy+llm.c/repo}
fe=${2:-/work/.mirror/NVIDIA+cudnn-frontend/repo}
out="$here/.device/peers"
for g in "$llmc" "$fe"; do
  git --git-dir="$g" rev-parse HEAD >/dev/null 2>&1 ||
    { echo "prepare_peers: $g is not a git directory; fetch the repository first" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/llm.c" "$out/cudnn-frontend"
git --git-dir="$llmc" archive HEAD Makefile train_gpt2.cu llmc | tar -x -C "$out/llm.c"
git --git-dir="$fe" archive HEAD include | tar -x -C "$out/cudnn-frontend"
echo "prepare_peers: llm.c $(git --git-dir="$llmc" rev-parse --short HEAD), cudnn-frontend" \
  "$(git --git-dir="$fe" rev-parse --short HEAD) in $out ($(du -sh "$out" | cut -f1))"
