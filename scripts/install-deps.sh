#!/usr/bin/env bash
# Install the Debian packages gpipe needs to build, test and train, if any
# are missing.  As root it runs apt-get; otherwise through sudo where sudo
# needs no password, else it prints the exact commands to run and fails, so
# nothing is half-installed silently.
#   scripts/install-deps.sh            build + train + test dependencies
#   scripts/install-deps.sh --ci       also what CI needs (sanitizer runtimes,
#                                      clang and its OpenMP for the fuzzers,
#                                      Debian's PyTorch for test_gpt_parity's
#                                      twin, QEMU's user mode for the other
#                                      processors' stage, tests/test_qemu.py)
#   scripts/install-deps.sh --bench    also the benchmarks' peers: Debian's
#                                      PyTorch and torchvision, and OpenBLAS
#                                      (without libopenblas0-pthread PyTorch's
#                                      linear layers run on the reference BLAS,
#                                      40x slower: no fair peer)
# The options combine (--ci --bench).  CI's CUDA stage needs the CUDA
# toolkit with cuBLAS, cuDNN and NCCL besides, which Debian 12 does not
# package: .ci/run says so before it starts.
set -euo pipefail
pkgs=(cmake make gcc g++ pkgconf libyaml-dev libprotobuf-c-dev protobuf-c-compiler zlib1g-dev libisal-dev libdnnl-dev libturbojpeg0-dev libjpeg62-turbo-dev
      libpng-dev openmpi-bin libopenmpi-dev
      python3-matplotlib python3-pil python3-numpy python3-venv groff-base
      dataset-fashion-mnist)
for arg in "$@"; do
  case "$arg" in
    --ci) pkgs+=(clang libclang-rt-14-dev libomp-14-dev python3-torch qemu-user) ;;
    --bench) pkgs+=(python3-torch python3-torchvision python3-yaml libopenblas0-pthread) ;;
    *) echo "usage: scripts/install-deps.sh [--ci] [--bench]" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "gpipe: missing packages: ${missing[*]}" >&2
# (wait for a package manager already at work, as on a VM that has just
# booted into unattended-upgrades, rather than fail on its lock)
apt=(apt-get -o DPkg::Lock::Timeout=600)
install=("${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}")
if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "gpipe: not root (and sudo asks a password); run these, then try again:" >&2
  echo "  sudo apt-get update" >&2
  echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "gpipe: installing them${sudo:+ with sudo}" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive "${apt[@]}" update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive "${install[@]}" >&2
