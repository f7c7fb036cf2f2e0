#!/usr/bin/env bash
# Compressed all-reduce over a slow link: every rank of cclz-perf runs inside
# a network namespace made for the run, whose loopback is shaped by
#   tc qdisc add dev lo root tbf rate RATE burst 64kb latency 50ms
# (RATE 1gbit, then 10gbit), with UCX forced onto TCP over that loopback
# (UCX_TLS=tcp,self, UCX_NET_DEVICES=lo; loopback's MTU set to 9000, see
# below) and cclz's node-local shared-memory
# window off (CCLZ_SHM=0), so every byte between ranks crosses the shaped
# link. The ranks share the one shaped loopback, as ranks behind one NIC
# share its bandwidth. For each rate cclz-perf --compressor prints the dense
# all-reduce and the compressed ones (ef+topk:ratio=0.01, and
# powersgd:rank=4 where this tree has PowerSGD) at SIZE: time, effective
# bandwidth (dense bytes / time), speed-up over dense, compression ratio.
#
# Usage: bench/slow_link.sh [BUILD_DIR]     (default: build)
# Environment: RANKS (4), SIZE (64M), RATES ("1gbit 10gbit"), ITERS (3),
#   WARMUP (2), SPECS (space-separated, replaces the default list),
#   REQUANT (sra), TIME_LIMIT (seconds per rate, 900), FINALIZE_GRACE (20:
#   seconds allowed after the table before the ranks are stopped),
#   OPENBLAS_NUM_THREADS (1: one BLAS thread per rank).
# Needs root (ip netns, tc) and an MPI cclz-perf. The namespace is named
# cclz-slow-<pid>-<random> and removed on exit, error or interrupt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build}"
perf="$build/bench/cclz-perf"
ranks="${RANKS:-4}"
size="${SIZE:-64M}"
rates="${RATES:-1gbit 10gbit}"
iters="${ITERS:-3}"
warmup="${WARMUP:-2}"
requant="${REQUANT:-sra}"
limit="${TIME_LIMIT:-900}"
# One BLAS thread per rank (PowerSGD's sgemm): the ranks already fill the cores.
blas_threads="${OPENBLAS_NUM_THREADS:-1}"

die() { echo "slow_link.sh: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "needs root for 'ip netns' and 'tc' (run it with sudo)"
command -v ip >/dev/null || die "'ip' (iproute2) not found"
command -v tc >/dev/null || die "'tc' (iproute2) not found"
[[ -x "$perf" ]] || die "$perf not found: build cclz-perf first (meson setup $build && ninja -C $build)"
mpiexec="$(command -v mpiexec.mpich || command -v mpiexec || true)"
[[ -n "$mpiexec" ]] || die "mpiexec not found"

if [[ -n "${SPECS:-}" ]]; then
  read -r -a specs <<<"$SPECS"
else
  specs=("ef+topk:ratio=0.01")
  [[ -f "$root/compressors/powersgd.cpp" ]] && specs+=("powersgd:rank=4")
fi
args=()
for s in "${specs[@]}"; do args+=(--compressor "$s"); done

ns="cclz-slow-$$-$RANDOM"
job=""
log=""
cleanup() {
  [[ -n "$job" ]] && kill -KILL -- "-$job" 2>/dev/null
  [[ -n "$log" ]] && rm -f "$log"
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add "$ns"
# A packet longer than tbf's burst is dropped, not delayed: with loopback's
# 64 KiB MTU TCP would stall on every full-size segment. 9000 (jumbo frames,
# as on data-centre links) keeps every packet well inside the 64 KiB burst.
ip netns exec "$ns" ip link set lo mtu 9000 up

status=0
for rate in $rates; do
  ip netns exec "$ns" tc qdisc replace dev lo root tbf rate "$rate" burst 64kb latency 50ms
  echo "# slow link: namespace $ns, lo shaped by 'tbf rate $rate burst 64kb latency 50ms'," \
    "mtu 9000, $ranks ranks, UCX_TLS=tcp,self UCX_NET_DEVICES=lo CCLZ_SHM=0 OPENBLAS_NUM_THREADS=$blas_threads"
  ip netns exec "$ns" tc qdisc show dev lo | sed 's/^/# /'
  # cclz-perf in the background (its own process group), its output copied
  # to the terminal as it comes. MPICH's MPI_Finalize (its UCX netmod, on the
  # same TCP-only UCX settings) was seen to spin forever after a complete 64 MB
  # table at both rates; once the table's last line is out, the run gets
  # FINALIZE_GRACE seconds, then it is stopped and that is said.
  log="$(mktemp)"
  setsid timeout --kill-after=30 "$limit" ip netns exec "$ns" \
    env UCX_TLS=tcp,self UCX_NET_DEVICES=lo CCLZ_SHM=0 OPENBLAS_NUM_THREADS="$blas_threads" \
    "$mpiexec" -n "$ranks" "$perf" all_reduce -b "$size" -e "$size" -n "$iters" -w "$warmup" \
    --no-mpi --requant "$requant" "${args[@]}" >"$log" 2>&1 &
  job=$!
  shown=0
  table_done_at=0
  stopped=0
  while kill -0 "$job" 2>/dev/null; do
    sleep 1
    n=$(wc -l <"$log")
    if (( n > shown )); then sed -n "$((shown + 1)),${n}p" "$log"; shown=$n; fi
    if (( table_done_at == 0 )) && grep -q '^# Out of bounds values' "$log"; then table_done_at=$SECONDS; fi
    if (( table_done_at > 0 && SECONDS - table_done_at > ${FINALIZE_GRACE:-20} )); then
      kill -TERM -- "-$job" 2>/dev/null || true
      stopped=1
      break
    fi
  done
  rc=0
  wait "$job" || rc=$?
  sed -n "$((shown + 1)),\$p" "$log"
  rm -f "$log"
  job=""
  log=""
  if (( stopped )); then
    echo "# slow_link.sh: the table above is complete; the ranks did not leave MPI_Finalize within" \
      "${FINALIZE_GRACE:-20} s and were stopped"
  elif [[ $rc -ne 0 ]]; then
    echo "slow_link.sh: cclz-perf at $rate ended with status $rc (124: the $limit s limit)" >&2
    status=1
  fi
done
exit "$status"
