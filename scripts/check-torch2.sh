#!/usr/bin/env bash
# Checks the PyTorch 2.x branch of the torch.distributed backend
# (src/torch/process_group.cpp, docs/torch.md) by hand. CI builds and tests
# only the 1.13 branch, against Debian 12's PyTorch; this script builds the
# working tree against the PyTorch 2.x of Debian unstable (sid) and runs its
# torch suite there:
#   1. makes a sid chroot with debootstrap in DIR (default
#      /var/tmp/cclz-torch2-sid), or reuses the one a previous run made,
#   2. installs in it the packages the build and the torch suite need
#      (python3-torch, libtorch-dev, pybind11-dev, g++, meson, UCX, MPICH...),
#   3. bind-mounts this working tree read-only at /src/cclz inside it,
#      configures /src/build there, builds only what the torch suite needs,
#   4. runs `meson test --suite torch` (2 and 4 ranks against gloo), then a
#      short check of its own under TORCH_DISTRIBUTED_DEBUG=DETAIL, where 2.x
#      wraps the backend in a ProcessGroupWrapper (cclz only; why is said
#      at step 4 below).
# Prints the torch, Python and GCC versions used and the time of each step;
# exits non-zero if anything failed.
#
# When: after changing src/torch/ (the `#if TORCH_VERSION_MAJOR >= 2` code
# above all). Not part of CI: too big and slow.
#
# Needs: root (debootstrap, chroot, mount) on Debian 12 (debootstrap is
# installed with apt-get if missing), network access to the Debian mirror
# this machine's apt already uses (taken from /etc/apt/sources.list or
# /etc/apt/sources.list.d/ at run time; CCLZ_SID_MIRROR=<url> overrides),
# about 3 GB of disk in DIR. The first run takes a few minutes on a fast
# mirror (3 on a 2-core machine: debootstrap, about 400 MB of packages, the
# build), longer on a slow link; later runs reuse the chroot, install nothing
# and rebuild only what changed (a minute or two, mostly the tests). The
# packages are not upgraded on a later run: remove DIR to start over from
# the current sid (check with `findmnt | grep DIR` that nothing is mounted
# there first; the script unmounts everything it mounted when it exits).
#
#   bash scripts/check-torch2.sh [DIR]
#   nice -n 19 bash scripts/check-torch2.sh     # on a machine others share
#
# Environment: CCLZ_JOBS (parallel compile jobs, default: number of cores),
# CCLZ_SID_MIRROR (Debian archive URL for debootstrap, default: this
# machine's), CCLZ_SKIP_DETAIL=1 to leave out the TORCH_DISTRIBUTED_DEBUG=DETAIL
# check. Each step is bounded with timeout(1): debootstrap 30 min, packages
# 80 min, build 70 min, the suite 20 min, the DETAIL check 5 min a run.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD

root=${1:-/var/tmp/cclz-torch2-sid}
jobs=${CCLZ_JOBS:-$(nproc)}
log=$root.log  # debootstrap's and apt's output, beside the chroot (not in it)

# What the build and `meson test --suite torch` need in sid (the torch part
# of scripts/install-deps.sh, plus the rest of a -Dtests=enabled build).
# Recorded in the chroot once installed: a different list installs again.
packages=(
  meson ninja-build pkg-config g++          # build
  libucx-dev                                # host transport
  mpich libmpich-dev                        # MPI (found by meson; unused by the torch suite)
  libgtest-dev libgmock-dev                 # -Dtests=enabled requires them
  libopenblas-dev                           # PowerSGD (libcclz)
  python3-torch python3-dev                 # the backend's Python side and its tests
  libtorch-dev pybind11-dev                 # c10d and pybind11 headers
)
marker=$root/.cclz-check-torch2  # written once the packages are installed

die() { echo "check-torch2: $*" >&2; exit 1; }
say() { echo "check-torch2: $*"; }
timings=()
step() { timings+=("$(printf '%-34s %4ds  %s' "$1" "$2" "$3")"); }

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot, mount): sudo bash $0 ${1:-}"
[[ $root == /* && $root != *[[:space:]]* && $root != / ]] ||
  die "DIR must be an absolute path without spaces: '$root'"
command -v dpkg >/dev/null || die "needs a Debian host (dpkg, apt-get)"

# A command in the chroot, in a clean environment: nothing of the host's
# PATH, PYTHONPATH or locale leaks into the build or the tests.
in_chroot=(chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}"
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)

# Bounds a step. --foreground: Ctrl-C still reaches the step (it runs in the
# script's process group); what a step leaves behind in the chroot when it
# times out, cleanup ends.
bounded() {  # bounded LIMIT CMD...
  local limit=$1
  shift
  timeout --foreground -k 60 "$limit" "$@"
}

# Lists what is mounted at or under $1, deepest first (to unmount in order).
mounts_under() {
  findmnt -rn -o TARGET | awk -v p="$1" '$0 == p || index($0, p "/") == 1' | sort -r
}

# ---- the mirror ---------------------------------------------------------------
# No mirror is written in this file: debootstrap gets the Debian archive this
# machine installs from, i.e. the first `deb` entry apt reads whose suite is
# the host's codename (bookworm on Debian 12), from one-line .list files or
# deb822 .sources files.
apt_entries() {  # prints "URI SUITE" for every enabled deb entry
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -r $f ]] || continue
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && NF >= 3 { print $2, $3 }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    awk 'function flush(  n, m, i, j, u, s) {
           if (types ~ /(^| )deb( |$)/ && tolower(enabled) != "no") {
             n = split(uris, u, " "); m = split(suites, s, " ")
             for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) print u[i], s[j]
           }
           types = uris = suites = ""; enabled = "yes"
         }
         BEGIN { enabled = "yes" }
         /^[[:space:]]*#/ { next }
         /^[[:space:]]*$/ { flush(); next }
         { key = tolower($1); $1 = "" }
         key == "types:" { types = $0 }
         key == "uris:" { uris = $0 }
         key == "suites:" { suites = $0 }
         key == "enabled:" { enabled = $2 }
         END { flush() }' "$f"
  done
}

host_mirror() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ -n $codename ]] || return 0
  apt_entries | awk -v c="$codename" '$2 == c && $1 ~ /^(https?|file):/ { sub(/\/+$/, "", $1); print $1; exit }'
}

# ---- one run at a time per DIR; clean up whatever a killed run left ------------
# The steps inherit the lock's descriptor: after a SIGKILL it stays held
# until what the killed run left running in the chroot has ended.
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock -n 9 || die "another check-torch2 run holds $root.lock"

mounted=()  # what this run mounted, in order
cleanup() {
  local rc=$? i p r
  set +e
  # Processes a timed-out step left inside the chroot (test ranks, MPI
  # helpers, dpkg) would keep the mounts busy: they are this run's, end them.
  for p in /proc/[0-9]*; do
    r=$(readlink "$p/root" 2>/dev/null)
    [[ $r == "$root" || $r == "$root.new" ]] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" ||
      echo "check-torch2: could not unmount ${mounted[i]}" >&2
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# A run killed with SIGKILL (or a debootstrap killed by its timeout) can
# leave mounts behind; with the lock held they are nobody's.
for d in "$root" "$root.new"; do
  for m in $(mounts_under "$d"); do
    say "unmounting $m (left by an earlier run)"
    umount "$m" 2>/dev/null || umount -l "$m"
  done
done

logged() {  # LIMIT CMD...: output appended to $log
  local limit=$1
  shift
  echo "==== $(date -u '+%F %T') $*" >>"$log"
  bounded "$limit" "$@" >>"$log" 2>&1 </dev/null
}
run_logged() {  # NAME LIMIT CMD...: logged, or the log's tail and exit
  local name=$1 limit=$2 rc=0
  shift 2
  logged "$limit" "$@" || rc=$?
  if ((rc != 0)); then
    tail -n 40 "$log" >&2
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "check-torch2: $name ran past $limit" >&2; fi
    die "$name failed (exit $rc); the whole output is in $log"
  fi
}

# ---- 1. the chroot ---------------------------------------------------------------
t=$SECONDS
if [[ -e $root ]] && ! [[ -f $root/etc/debian_version && -x $root/usr/bin/apt-get && ! -d $root/debootstrap ]]; then
  [[ -z $(ls -A "$root") ]] || die "$root exists but is not a chroot this script made; remove it or choose another DIR"
  rmdir "$root"
fi
if [[ ! -e $root ]]; then
  if [[ -n ${CCLZ_SID_MIRROR:-} ]]; then
    mirror=$CCLZ_SID_MIRROR
  else
    mirror=$(host_mirror)
    [[ -n $mirror ]] || die "found no Debian mirror in this machine's apt configuration (an enabled 'deb' entry for suite $(. /etc/os-release && echo "${VERSION_CODENAME:-?}") in /etc/apt/sources.list or /etc/apt/sources.list.d/*.list|*.sources); set CCLZ_SID_MIRROR=<Debian archive URL>"
  fi
  avail_kb=$(df -Pk "$(dirname "$root")" | awk 'NR == 2 { print $4 }')
  ((avail_kb > 3 * 1024 * 1024)) || die "less than 3 GB free in $(dirname "$root") (the chroot takes about 2.5 GB)"
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    run_logged "apt-get install debootstrap" 10m \
      env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
  fi
  # Into DIR.new, renamed when complete: an interrupted debootstrap never
  # looks like a chroot, and the next run starts it over.
  if [[ -e $root.new ]]; then
    [[ -z $(mounts_under "$root.new") ]] || die "$root.new still has mounts; unmount them first"
    rm -rf --one-file-system "$root.new"
  fi
  say "debootstrap sid into $root from $mirror (log: $log)"
  # minbase: apt and dpkg only, the packages below pull in the rest;
  # ca-certificates in case the mirror is https.
  run_logged debootstrap 30m \
    debootstrap --variant=minbase --include=ca-certificates --components=main sid "$root.new" "$mirror"
  mv "$root.new" "$root"
  step "debootstrap sid" $((SECONDS - t)) ok
else
  say "reusing the chroot in $root"
fi

# The mounts the build and tests need, undone by cleanup: /proc (Python,
# MPI, UCX), /sys read-only (hwloc's and UCX's topology), /dev (null,
# urandom), a /dev/shm of its own (cclz's shared-memory window between the
# ranks; its segments go with it), and the working tree read-only.
mnt() {  # mnt TARGET MOUNT-ARGS...
  local target=$1
  shift
  mkdir -p "$target"
  mount "$@" "$target"
  mounted+=("$target")
}
mnt "$root/proc" -t proc proc
mnt "$root/sys" -t sysfs -o ro sysfs
mnt "$root/dev" --bind /dev
mnt "$root/dev/shm" -t tmpfs -o mode=1777,nosuid,nodev shm
mnt "$root/src/cclz" --bind "$src"
mount -o remount,bind,ro "$root/src/cclz"

# ---- 2. the packages -------------------------------------------------------------
t=$SECONDS
if [[ -f $marker && $(cat "$marker") == "${packages[*]}" ]]; then
  say "packages already installed"
else
  say "installing ${packages[*]} (log: $log)"
  # Name resolution for apt (replaced: the chroot's copy may be a symlink
  # that points outside it), and no daemon started by a postinst.
  rm -f "$root/etc/resolv.conf"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  if ! logged 20m "${in_chroot[@]}" apt-get update -q; then
    # A sid Release file past its Valid-Until: a mirror that stopped
    # syncing, or a clock ahead of it. Its signature is still checked; say so
    # and go on without the date check rather than fail.
    if ! tail -n 5 "$log" | grep -q 'is expired'; then
      tail -n 40 "$log" >&2
      die "apt-get update failed; the whole output is in $log"
    fi
    say "WARNING: the mirror's sid Release file has expired (stale mirror or clock ahead); apt-get update again without Acquire::Check-Valid-Until"
    run_logged "apt-get update" 20m "${in_chroot[@]}" apt-get update -q -o Acquire::Check-Valid-Until=false
  fi
  run_logged "apt-get install" 60m \
    "${in_chroot[@]}" DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}"
  echo "${packages[*]}" >"$marker"
  step "install packages" $((SECONDS - t)) ok
fi

versions=$("${in_chroot[@]}" /usr/bin/python3 -c '
import platform, torch
print("torch", torch.__version__, "| Python", platform.python_version(), end="")') ||
  die "python3 in the chroot cannot import torch"
versions+=" | $("${in_chroot[@]}" g++ --version | head -n 1)"
say "$versions"

# ---- 3. configure and build --------------------------------------------------------
# The build directory lives in the chroot (/src/build), so the host's build/
# is never touched. Configured once; ninja reconfigures when meson.build
# files change. Only the targets the torch suite depends on are built
# (libcclz, the extension cclz._C, the package's Python files): the rest of
# the tree under a newer GCC is not what this checks.
t=$SECONDS
# Another checkout's build (a second worktree run on the same DIR) starts
# over: ninja goes by mtimes, and older files would look up to date.
if [[ $(cat "$root/src/build.source" 2>/dev/null) != "$src" ]]; then
  rm -rf "$root/src/build"
fi
if [[ ! -f $root/src/build/build.ninja ]]; then
  rm -rf "$root/src/build"
  echo "$src" >"$root/src/build.source"
  bounded 10m "${in_chroot[@]}" meson setup /src/build /src/cclz \
    -Dtests=enabled -Dbenchmarks=disabled -Dcuda=disabled -Ducx=enabled -Dmpi=enabled
fi
grep -q "building against torch" "$root/src/build/meson-logs/meson-log.txt" ||
  die "meson setup skipped the torch backend; see $root/src/build/meson-logs/meson-log.txt"
targets=$("${in_chroot[@]}" /usr/bin/python3 -c '
import json, os
info = "/src/build/meson-info"
tests = json.load(open(os.path.join(info, "intro-tests.json")))
files = {t["id"]: t["filename"] for t in json.load(open(os.path.join(info, "intro-targets.json")))}
deps = {d for t in tests if "cclz:torch" in t["suite"] or "torch" in t["suite"] for d in t["depends"]}
print(" ".join(sorted(os.path.relpath(f, "/src/build") for d in deps for f in files[d])))')
[[ -n $targets ]] || die "no torch tests in /src/build (meson setup did not enable them)"
# shellcheck disable=SC2086  # the target list is space-separated on purpose
bounded 60m "${in_chroot[@]}" ninja -C /src/build -j "$jobs" $targets
step "build (torch targets)" $((SECONDS - t)) ok

# ---- 4. the torch suite -------------------------------------------------------------
rc=0
t=$SECONDS
bounded 20m "${in_chroot[@]}" meson test -C /src/build --no-rebuild --print-errorlogs --suite torch || rc=$?
step "meson test --suite torch" $((SECONDS - t)) "$([[ $rc -eq 0 ]] && echo ok || echo FAILED)"

# The suite under TORCH_DISTRIBUTED_DEBUG=DETAIL, where 2.x wraps the
# backend in a ProcessGroupWrapper (desync checks that read sequence numbers;
# the hook has to unwrap it), cannot run whole: with Debian's 2.14.1, DDP on
# a gloo group segfaults in c10d::Logger::set_env_variables under DETAIL,
# cclz or not, and the suite compares against gloo's DDP. So a check of its
# own: cclz only, the backend wrapped, DDP with the PowerSGD hook, all_reduce.
detail_rc=0
if [[ ${CCLZ_SKIP_DETAIL:-0} != 1 ]]; then
  t=$SECONDS
  cat >"$root/tmp/cclz-check-detail.py" <<'PY'
import os, socket, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, n, port):
    import cclz.torch
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("cclz", rank=rank, world_size=n)
    name = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    assert "Wrapper" in name, f"rank {rank}: backend not wrapped under DETAIL ({name})"
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)))
    model.register_comm_hook(None, cclz.torch.hook("powersgd:rank=2"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(8, 32, generator=g)).square().mean().backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    assert torch.equal(lo, hi), f"rank {rank}: parameters differ between ranks"
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [float(n)] * 3, f"rank {rank}: all_reduce gave {t.tolist()}"
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(n, port), nprocs=n)
    print(f"TORCH_DISTRIBUTED_DEBUG=DETAIL, {n} ranks: ok (backend wrapped, DDP with the powersgd hook, all_reduce)")
PY
  for n in 2 4; do
    bounded 5m "${in_chroot[@]}" TORCH_DISTRIBUTED_DEBUG=DETAIL USE_LIBUV=0 OMP_NUM_THREADS=1 \
      PYTHONPATH=/src/build/src/torch/python /usr/bin/python3 /tmp/cclz-check-detail.py "$n" 2>&1 |
      grep -v 'gloo/transport/tcp/context.cc' || detail_rc=1
  done
  step "DETAIL check (2, 4 ranks)" $((SECONDS - t)) "$([[ $detail_rc -eq 0 ]] && echo ok || echo FAILED)"
fi

echo
echo "==== scripts/check-torch2.sh summary ===="
echo "$versions"
printf '%s\n' "${timings[@]}"
echo "total $SECONDS s"
if [[ $rc -ne 0 || $detail_rc -ne 0 ]]; then
  echo "FAILED (the suite's log: $root/src/build/meson-logs/testlog.txt; the DETAIL check's output is above)"
  exit 1
fi
echo "all passed"
