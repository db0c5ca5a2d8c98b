#!/usr/bin/env bash
# torch_venv.sh — PyPI's current torch (the CPU peer users have: MKL and
# oneDNN inside the wheel) in a virtual environment of Debian's Python, for
# bench/bench_gpt_cpu.py and bench/bench_cpu_peer.py (and transformers, the
# Llama peer of bench_gpt_cpu.py's model.llama configs):
#   bash bench/torch_venv.sh [DIR]          # default /opt/gpipe-torch
#   /opt/gpipe-torch/bin/python bench/bench_gpt_cpu.py --precision bf16
# PyPI's Linux wheel depends on NVIDIA's CUDA wheels (about 3 GB with them);
# they are installed too, as pip resolves them: torch does not import
# without them.  Needs python3-venv (scripts/install-deps.sh installs it)
# and PyPI.  TORCH=torch==2.x.y pins a version.  Never run by CI.
set -euo pipefail
dir=${1:-/opt/gpipe-torch}
if [ ! -x "$dir/bin/python" ]; then
  /usr/bin/python3 -m venv "$dir"
fi
"$dir/bin/pip" install -q --upgrade pip
"$dir/bin/pip" install -q "${TORCH:-torch}" numpy pyyaml transformers
"$dir/bin/python" -c 'import torch; print("torch", torch.__version__, "in", "'"$dir"'",
      "MKL" if torch.backends.mkl.is_available() else "no MKL",
      "oneDNN" if torch.backends.mkldnn.is_available() else "no oneDNN")'
