#!/usr/bin/env bash
# Installs the Debian 12 packages cclz is built and tested with, if any is
# missing. Idempotent: when everything is installed it does nothing (no
# apt-get update, no network). Uses sudo only when not already root.
set -euo pipefail

packages=(
  meson ninja-build pkg-config g++          # build
  libucx-dev                                # host transport
  mpich libmpich-dev                        # mpiexec-launched tests, cclz-perf baseline
  libgtest-dev libgmock-dev                 # tests
  libbenchmark-dev                          # kernel micro-benchmarks
  libopenblas-dev                           # PowerSGD (libcclz), reference trainers
  python3-matplotlib                        # cclz-compare's plots
  python3-torch python3-dev                 # the torch.distributed backend and its tests
  libtorch-dev pybind11-dev                 # headers of the torch.distributed backend (c10d, pybind11)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
