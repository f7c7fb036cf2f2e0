#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine or an existing
# checkout (idempotent: installs only missing packages, configures a build
# directory only once, rebuilds only what changed):
#   1. installs the Debian packages (scripts/install-deps.sh),
#   2. builds and runs `meson test` in build/: unit, transport, comm and the
#      multi-rank mpi suites (mpiexec -n 1..8, declared nodes, CCLZ_CHECK,
#      fault scenarios),
#   3. builds the multi-rank tests again with AddressSanitizer and
#      UndefinedBehaviorSanitizer in build-asan/ and runs the 'mpi-core'
#      suite there (N = 1..4, three declared nodes, CCLZ_CHECK, faults),
#      and where they are built the 'nccl-asan' suite (libcclz_nccl's C
#      test) and the 'trainers-mpi' suite (cclz-train on real ranks).
# Exits non-zero if anything failed; prints the time of each step.
#
# Environment: CCLZ_BUILD_DIR (default build), CCLZ_ASAN_BUILD_DIR (default
# build-asan), CCLZ_JOBS (parallel compile jobs, default: number of cores),
# CCLZ_SKIP_ASAN=1 to leave out step 3.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${CCLZ_BUILD_DIR:-build}
asan=${CCLZ_ASAN_BUILD_DIR:-build-asan}
jobs=${CCLZ_JOBS:-$(nproc)}
timings=()
step() { timings+=("$(printf '%-28s %4ds  %s' "$1" "$2" "$3")"); }

t=$SECONDS
bash scripts/install-deps.sh
step "install packages" $((SECONDS - t)) ok

# ---- 2. the normal build and every suite ------------------------------------
t=$SECONDS
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build"
fi
ninja -C "$build" -j "$jobs"
step "build ($build)" $((SECONDS - t)) ok

t=$SECONDS
main_rc=0
meson test -C "$build" --no-rebuild --print-errorlogs || main_rc=$?
step "meson test ($build)" $((SECONDS - t)) "$([[ $main_rc -eq 0 ]] && echo ok || echo FAILED)"

# ---- 3. sanitizer build, multi-rank suites ----------------------------------
# ASan/UBSan in a build of its own (b_lundef=false: the sanitizer runtimes
# resolve symbols at load time), at -O1 with line tables only (-g1): the
# reports still name file and line, and the build takes about half the time
# of -O2 -g (250 against about 530 s on 2 cores) for suites about 10%
# slower. Only the multi-rank binaries are built: the point is cclz's code under real processes, UCX and MPICH, and with ranks
# as threads of one process (the unit and communicator suites: the engine's
# worker, requests, the C API). The options:
#   halt_on_error=1   any ASan/UBSan report ends the process, so the test fails
#   detect_leaks=1    with tests/mpi/lsan.supp, which suppresses leaks by
#                     library name for UCX, MPICH and hwloc only (they keep
#                     process-lifetime caches); never for cclz code.
#   UCX memory hooks  off: UCX patches mmap/munmap/brk and malloc to track
#                     registered memory (needed for RDMA registration caches,
#                     not for shared memory or TCP); ASan intercepts the same
#                     functions and the two fight over them.
# The tests' oracle (tests/support/coll_desc.cpp), which generates every
# input and expected element, is built there at -O2 without instrumentation
# (bench/meson.build): instrumented, it took most of the suites' time.
# The meson test definitions set these options (tests/meson.build), so
# running `meson test -C build-asan --suite mpi-core` by hand behaves alike.
asan_rc=0
if [[ ${CCLZ_SKIP_ASAN:-0} != 1 ]]; then
  t=$SECONDS
  if [[ ! -f $asan/build.ninja ]]; then
    meson setup "$asan" -Db_sanitize=address,undefined -Db_lundef=false -Doptimization=1 -Ddebug=false \
      -Dcpp_args=-g1 -Dc_args=-g1 -Dbenchmarks=disabled
  fi
  asan_targets=(tests/mpi/cclz-mpi-tests tests/mpi/cclz-fault tests/cclz-unit tests/comm/cclz-comm-test
    tests/comm/cclz-c-header-test)
  asan_suites=(--suite mpi-core --suite unit --suite comm)
  # libcclz_nccl through its C test, and cclz-train on real ranks, when built.
  # The target list is read whole first: `ninja ... | grep -q` under
  # pipefail fails whenever grep exits before ninja has written everything
  # (SIGPIPE), which silently dropped a suite from some runs.
  asan_all_targets=$(ninja -C "$asan" -t targets all 2>/dev/null || true)
  if grep -q '^tests/nccl/cclz-nccl-test:' <<<"$asan_all_targets"; then
    asan_targets+=(tests/nccl/cclz-nccl-test tests/nccl/cclz-nccl-fallback-test tests/nccl/standin/libstandin_nccl.so)
    asan_suites+=(--suite nccl-asan)
  fi
  if grep -q '^tests/comm/cclz-comm-from-mpi:' <<<"$asan_all_targets"; then
    asan_targets+=(tests/comm/cclz-comm-from-mpi)
  fi
  if grep -q '^trainers/cclz-train:' <<<"$asan_all_targets"; then
    asan_targets+=(trainers/cclz-train trainers/cclz-train-local)
    asan_suites+=(--suite trainers-mpi)
  fi
  ninja -C "$asan" -j "$jobs" "${asan_targets[@]}"
  step "build ($asan)" $((SECONDS - t)) ok

  t=$SECONDS
  UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none \
    meson test -C "$asan" --no-rebuild --print-errorlogs "${asan_suites[@]}" --timeout-multiplier 3 || asan_rc=$?
  step "meson test ${asan_suites[*]//--suite /} ($asan)" $((SECONDS - t)) "$([[ $asan_rc -eq 0 ]] && echo ok || echo FAILED)"
fi

echo
echo "==== scripts/test.sh summary ===="
printf '%s\n' "${timings[@]}"
echo "total $SECONDS s"
if [[ $main_rc -ne 0 || $asan_rc -ne 0 ]]; then
  echo "FAILED (see the test logs above and $build/meson-logs/testlog.txt, $asan/meson-logs/testlog.txt)"
  exit 1
fi
echo "all passed"
