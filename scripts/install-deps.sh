#!/usr/bin/env bash
# Install the Debian packages gpipe needs to build, test and train, if any
# are missing.  As root it runs apt-get; otherwise it prints the exact
# command to run and fails, so nothing is half-installed silently.
#   scripts/install-deps.sh            build + train + test dependencies
#   scripts/install-deps.sh --ci       also what CI needs (sanitizer runtimes)
#   scripts/install-deps.sh --bench    also the benchmarks' peers: Debian's
#                                      PyTorch and torchvision, and OpenBLAS
#                                      (without libopenblas0-pthread PyTorch's
#                                      linear layers run on the reference BLAS,
#                                      40x slower: no fair peer)
set -euo pipefail
pkgs=(cmake make gcc g++ pkgconf libyaml-dev zlib1g-dev libdnnl-dev libturbojpeg0-dev libjpeg62-turbo-dev
      libpng-dev openmpi-bin libopenmpi-dev
      python3-matplotlib python3-pil
      dataset-fashion-mnist)
if [[ "${1:-}" == "--ci" ]]; then
  pkgs+=(clang libclang-rt-14-dev valgrind)
elif [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(python3-torch python3-torchvision python3-yaml libopenblas0-pthread)
elif [[ -n "${1:-}" ]]; then
  echo "usage: scripts/install-deps.sh [--ci | --bench]" >&2
  exit 2
fi
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "gpipe: installing missing packages: ${missing[*]}" >&2
if [[ $(id -u) -eq 0 ]]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
else
  echo "gpipe: not root; run this, then try again:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
