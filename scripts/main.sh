#!/usr/bin/env bash
# The main job: installs what is missing, builds cclz (release) and prints
# cclz-perf's all-reduce table (nccl-tests' columns, with the MPI baseline
# measured in the same run) on 4 local ranks. Idempotent: a second run
# rebuilds nothing and just measures again.
#
# Environment: CCLZ_BUILD_DIR (default build), CCLZ_JOBS (compile jobs,
# default: number of cores), CCLZ_RANKS (default 4). Extra arguments go to
# cclz-perf (e.g. -b 8 -e 256M -f 2, -A all for every algorithm).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${CCLZ_BUILD_DIR:-build}
jobs=${CCLZ_JOBS:-$(nproc)}
ranks=${CCLZ_RANKS:-4}

bash scripts/install-deps.sh
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build"
fi
ninja -C "$build" -j "$jobs"

# The MPICH launcher by name (plain mpiexec may be Open MPI's where both are
# installed); all ranks on this machine.
launcher=$(command -v mpiexec.mpich || command -v mpiexec.hydra || command -v mpiexec)
# The collective defaults to all_reduce; a first argument that is not an
# option names another (e.g. `bash scripts/main.sh all_gather -A all`).
coll=all_reduce
if [[ $# -gt 0 && $1 != -* ]]; then
  coll=$1
  shift
fi
# One rank per core when they fit (as Open MPI does by default): unbound
# ranks may be stacked on one core by the scheduler for a while, which
# shows as a 3-5x slower run. With more ranks than cores, no binding.
bind=()
if (( ranks <= $(nproc) )) && [[ $launcher == *mpich* || $launcher == *hydra* ]]; then
  bind=(-bind-to core)
fi
exec "$launcher" "${bind[@]}" -n "$ranks" "$build/bench/cclz-perf" "$coll" "$@" </dev/null
