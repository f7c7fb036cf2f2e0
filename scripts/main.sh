#!/usr/bin/env bash
# The main job, a short tour on local defaults: installs what is missing,
# builds cclz (release), then
#   1. prints cclz-perf's all-reduce table (nccl-tests' columns, with the MPI
#      baseline measured in the same run) on 4 local ranks, and draws its
#      bandwidth curves into results/main-<date>/all_reduce.png;
#   2. runs a quick compressor convergence comparison (scripts/cclz-compare
#      --compressors quick: none, bf16, ef+topk, int8, powersgd:rank=4; one
#      seed, 300 steps of the reference GPT on 2 ranks) and prints its table
#      and where its plots are (results/main-<date>/).
# Idempotent: a second run rebuilds nothing and just measures again.
#
# Environment: CCLZ_BUILD_DIR (default build), CCLZ_JOBS (compile jobs,
# default: number of cores), CCLZ_RANKS (cclz-perf's ranks, default 4),
# CCLZ_COMPARE=0 to skip step 2, CCLZ_COMPARE_STEPS (300). Extra arguments
# go to cclz-perf (e.g. -b 8 -e 256M -f 2, -A all for every algorithm).
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
# The run's rows also go to results/<run>/, and its bandwidth curves (cclz
# beside MPI and the roofline) are drawn from them there. Arguments given
# to this script come after ours, so a --csv of the caller's wins (then no
# plot).
run=main-$(date +%Y%m%d-%H%M%S)
results=results/$run
mkdir -p "$results"
# Each call's time too (--per-call: the median and 99th percentile beside
# the mean): with more ranks than cores a few calls that wait a scheduler
# slice move a mean of 20 calls, and the median shows the typical call.
# --compressor prints tables of its own instead, with no rows to save or
# draw.
table_args=(--per-call --csv "$results/$coll.csv")
[[ " $* " == *" --compressor"* ]] && table_args=()
"$launcher" "${bind[@]}" -n "$ranks" "$build/bench/cclz-perf" "$coll" "${table_args[@]}" "$@" </dev/null
if [[ -s $results/$coll.csv ]]; then
  bind_flag=()
  (( ${#bind[@]} > 0 )) && bind_flag=(--bind)
  if /usr/bin/python3 scripts/perf_tables.py --from-csv "$results/$coll.csv" --ranks "$ranks" "${bind_flag[@]}" \
      --plot "$results/$coll.png" "$coll" > "$results/$coll.md"; then
    echo "# bandwidth curves: $results/$coll.png (table: $results/$coll.md)"
  fi
fi

if [[ ${CCLZ_COMPARE:-1} != 0 ]]; then
  echo
  echo "# quick compressor comparison: scripts/cclz-compare --compressors quick (2 ranks, 1 seed)"
  /usr/bin/python3 scripts/cclz-compare --build "$build" --compressors quick --seeds 1 \
    --steps "${CCLZ_COMPARE_STEPS:-300}" --run "$run" </dev/null
fi
