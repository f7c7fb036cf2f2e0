#!/usr/bin/python3
"""Runs cclz-perf several times and prints markdown tables of the medians.

One host's bandwidth drifts from run to run (other tenants, placement of the
processes), so each published figure is the median over RUNS runs of
cclz-perf, and every ratio is taken inside one run (cclz and MPI measured
side by side) before the median is taken.

  scripts/perf_tables.py [--runs 3] [--ranks 2] [--build build] [--bind]
                         [--buffers heap,mem_alloc,registered] [--plot FILE.png]
                         [--mpiexec LAUNCHER] [--from-csv CSV]...
                         COLLECTIVE [cclz-perf options...]

--bind passes `-bind-to core` to mpiexec (one rank per core; use it when the
ranks fit on the cores). --buffers lists the buffer kinds to measure (heap:
cclz-perf -R 0, mem_alloc: -R 1, registered: heap buffers registered with
cclz::register_buffer, -R 2); with several, each run goes through all
of them in turn, so that a change in the host falls on all alike. Output:
one markdown table per (buffers, algorithm, type), with time, busbw,
in-place busbw, the MPI baseline, the ratio and the share of the memory
roofline (marked * where the working set fits in the last-level cache and
the roofline does not bind), and for runs made with cclz-perf --per-call
the median call's time of cclz and of MPI, headed by the range of the
two-copier bandwidth the runs measured.

--plot FILE.png also draws the bandwidth curves: bus bandwidth against size
(log scale), one panel per buffer kind, a line per series (algorithm, type
and op: -A all, -d f32,bf16,f16 and -o sum,avg give several), MPI's per
type and op, and the collective's memory roofline where it binds. A
single series is drawn out of place and in place. Lines are medians over
the runs; the shaded band around each cclz line spans the runs' lowest and
highest out-of-place busbw.

--from-csv CSV (once per run: --from-csv a.csv --from-csv b.csv) makes the
tables and plot from runs already made (cclz-perf --csv; --ranks and
--bind then only label them) instead of running cclz-perf: scripts/main.sh
plots its own run so.
"""
import argparse
import csv
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile


# cclz-perf's -R for each buffer kind.
BUFFER_FLAG = {"heap": "0", "mem_alloc": "1", "registered": "2"}

def run_once(args, extra, csv_path):
    cmd = [args.mpiexec]
    if args.bind:
        cmd += ["-bind-to", "core"]
    cmd += ["-n", str(args.ranks), os.path.join(args.build, "bench", "cclz-perf"), args.collective]
    cmd += extra + ["--csv", csv_path]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=args.timeout)
    if res.returncode != 0:
        sys.exit(f"perf_tables: {' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    m = re.search(r"concurrent ([0-9.]+) GB/s", res.stdout)
    with open(csv_path) as f:
        return list(csv.DictReader(f)), float(m.group(1)) if m else None


def num(row, key):
    v = row.get(key, "")
    try:
        return float(v)
    except ValueError:
        return None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def same_collective(a, b):
    """Whether two spellings name one collective (cclz-perf also takes
    nccl-tests' allreduce, bcast, ...)."""
    a, b = ({"bcast": "broadcast"}.get(x, x).replace("_", "") for x in (a, b))
    return a == b


def runs_text(runs):
    return "1 run" if runs == 1 else f"{runs} runs"


def size_label(b):
    for unit, name in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if b >= unit and b % unit == 0:
            return f"{b // unit}{name}"
    return str(b)


def series_label(series, vary):
    """A series' legend text: the parts of (algorithm, type, op) that vary
    between the panel's series ("cclz" alone when none does)."""
    algo, dtype, op = series
    parts = []
    if vary[0]:
        parts.append("tuner" if algo == "tuner" else algo)
    if vary[1]:
        parts.append(dtype)
    if vary[2]:
        parts.append(op)
    return "cclz " + " ".join(parts) if parts else "cclz"


def plot(path, args, groups, order, bw_note):
    """Bus bandwidth against size: a panel per buffer kind, a line per
    series (algorithm, type, op), MPI's per type and op, and the roofline
    where it binds (see the module doc)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = []
    for key in order:
        if key[0] not in kinds:
            kinds.append(key[0])
    fig, axes = plt.subplots(len(kinds), 1, figsize=(9, 5.2 * len(kinds)), squeeze=False)
    for ax, kind in zip(axes[:, 0], kinds):
        keys = [k for k in order if k[0] == kind]
        series = []
        for k in keys:
            if k[1:4] not in series:
                series.append(k[1:4])
        vary = [len({x[i] for x in series}) > 1 for i in range(3)]
        sizes = sorted({k[4] for k in keys})
        for ser in series:
            xs, mid, lo, hi, ip = [], [], [], [], []
            for b in sizes:
                rows = groups.get((kind,) + ser + (b,), [])
                vals = [num(r, "oop_busbw_gbs") for r in rows if num(r, "oop_busbw_gbs") is not None]
                if not vals:
                    continue
                xs.append(b)
                mid.append(statistics.median(vals))
                lo.append(min(vals))
                hi.append(max(vals))
                ip.append(median([num(r, "ip_busbw_gbs") for r in rows]))
            if not xs:
                continue
            label = series_label(ser, vary)
            line, = ax.plot(xs, mid, marker="o", markersize=3,
                            label=label + ("" if len(series) > 1 else ", out of place"))
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
            if len(series) == 1 and any(v is not None for v in ip):
                ax.plot([x for x, v in zip(xs, ip) if v is not None], [v for v in ip if v is not None],
                        linestyle="--", color=line.get_color(), label=label + ", in place")
        # MPI's call does not depend on cclz's algorithm: one line per (type, op).
        mpi_series = []
        for ser in series:
            if ser[1:] not in mpi_series:
                mpi_series.append(ser[1:])
        styles = ["-", "--", "-.", ":"]
        for i, (dtype, op) in enumerate(mpi_series):
            mpi_x, mpi_y = [], []
            for b in sizes:
                m = median([num(r, "mpi_busbw_gbs") for k in keys if k[2:5] == (dtype, op, b) for r in groups[k]])
                if m is not None:
                    mpi_x.append(b)
                    mpi_y.append(m)
            if mpi_x:
                text = " ".join(x for x, v in ((dtype, vary[1]), (op, vary[2])) if v)
                ax.plot(mpi_x, mpi_y, marker="s", markersize=3, color="black", linestyle=styles[i % len(styles)],
                        label="MPI" + (f" {text}" if text else "") + (" (same run)" if args.runs == 1 else " (same runs)"))
        roof_x, roof_y = [], []
        for b in sizes:
            roof = median([num(r, "roof_busbw_gbs") for k in keys if k[4] == b for r in groups[k]
                           if r.get("roof_cached") != "1"])
            if roof is not None:
                roof_x.append(b)
                roof_y.append(roof)
        if roof_x:
            ax.plot(roof_x, roof_y, linestyle=":", marker="_", markersize=12, color="gray", linewidth=2,
                    label="memory roofline (working set beyond the LLC)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_label(b) for b in sizes], rotation=45 if len(sizes) > 12 else 0)
        ax.set_xlabel("size (bytes, as cclz-perf and nccl-tests count it)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        fixed = [x for x, v in ((series[0][1], vary[1]), (series[0][2], vary[2])) if not v and x != "none"]
        ax.set_title(f"{args.collective}, {args.ranks} ranks{' bound to cores' if args.bind else ''}, "
                     f"{', '.join(fixed) + ', ' if fixed else ''}{kind} buffers\n"
                     f"median of {runs_text(args.runs)}{bw_note}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--build", default="build")
    p.add_argument("--bind", action="store_true")
    # MPICH's launcher by its own name first: where Open MPI is installed too,
    # plain mpiexec may be its launcher, which cannot start MPICH programs.
    launchers = ("mpiexec.mpich", "mpiexec.hydra", "mpiexec")
    p.add_argument("--mpiexec", default=next(filter(None, map(shutil.which, launchers)), "mpiexec"),
                   help="the MPI launcher (default: MPICH's, as scripts/main.sh)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cclz-perf run")
    p.add_argument("--buffers", default="heap", help="comma-separated: heap, mem_alloc, registered")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the bandwidth curves into FILE.png")
    p.add_argument("--from-csv", action="append", metavar="CSV",
                   help="tables (and --plot) from this cclz-perf --csv file instead of running; once per run")
    p.add_argument("collective")
    args, extra = p.parse_known_args()
    if args.runs < 1:
        sys.exit("perf_tables: --runs must be at least 1")
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (fail before the runs, not after)
        except ImportError:
            sys.exit("perf_tables: --plot needs matplotlib (python3-matplotlib; scripts/install-deps.sh installs it)")

    kinds = [k.strip() for k in args.buffers.split(",") if k.strip()]
    for k in kinds:
        if k not in BUFFER_FLAG:
            sys.exit(f"perf_tables: unknown buffer kind {k!r} ({', '.join(BUFFER_FLAG)})")
    groups = {}  # (buffers, requested, type, op, bytes) -> list of rows
    order = []
    copy_bw = []

    def add(rows, kind):
        for row in rows:
            if row.get("supported") == "0":
                continue
            key = (kind, row["requested"], row["type"], row["redop"], int(row["bytes"]))
            if key not in groups:
                groups[key] = []
                order.append(key)
            groups[key].append(row)

    if args.from_csv and len(kinds) != 1:
        sys.exit("perf_tables: --from-csv takes one buffer kind (--buffers heap, mem_alloc or registered)")
    if args.from_csv and extra:
        sys.exit(f"perf_tables: --from-csv runs nothing, so cclz-perf options make no sense: {' '.join(extra)}")

    if args.from_csv:
        # Runs already made (cclz-perf --csv): one file per run, of the
        # buffer kind its rows were measured with.
        for path in args.from_csv:
            try:
                with open(path) as f:
                    rows = list(csv.DictReader(f))
            except OSError as e:
                sys.exit(f"perf_tables: {e}")
            if not rows or "oop_busbw_gbs" not in rows[0]:
                sys.exit(f"perf_tables: {path} has no cclz-perf rows")
            if any(not same_collective(r["collective"], args.collective) for r in rows):
                sys.exit(f"perf_tables: {path} is not a {args.collective} run")
            add(rows, kinds[0])
        args.runs = len(args.from_csv)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                for kind in kinds:
                    reg = ["-R", BUFFER_FLAG[kind]]
                    rows, bw = run_once(args, extra + reg, os.path.join(tmp, f"run{i}-{kind}.csv"))
                    if bw is not None:
                        copy_bw.append(bw)
                    add(rows, kind)

    tables = {}
    for key in order:
        tables.setdefault(key[:4], []).append(key)
    bw_note = f"; two copiers {min(copy_bw):.1f}-{max(copy_bw):.1f} GB/s" if copy_bw else ""
    for (kind, requested, dtype, op), keys in tables.items():
        op_text = "" if op == "none" else f" {op}"
        # Runs made with cclz-perf --per-call: the median call beside the mean.
        per_call = any(num(r, "oop_p50_us") is not None for k in keys for r in groups[k])
        print(f"\n**{args.collective}, {args.ranks} ranks, {dtype}{op_text}, algorithm: {requested}, {kind} buffers** "
              f"(median of {runs_text(args.runs)}{', ranks bound to cores' if args.bind else ''}{bw_note})\n")
        print("| size (B) | time (us) | busbw (GB/s) | in-place busbw | algo | MPI time (us) | MPI busbw | "
              "cclz/MPI | %roof |" + (" p50 (us) | MPI p50 (us) |" if per_call else ""))
        print("|---:|---:|---:|---:|---|---:|---:|---:|---:|" + ("---:|---:|" if per_call else ""))
        for key in keys:
            rows = groups[key]
            t = median([num(r, "oop_time_us") for r in rows])
            bw = median([num(r, "oop_busbw_gbs") for r in rows])
            ip = median([num(r, "ip_busbw_gbs") for r in rows])
            mt = median([num(r, "mpi_time_us") for r in rows])
            mbw = median([num(r, "mpi_busbw_gbs") for r in rows])
            ratios = [num(r, "oop_busbw_gbs") / num(r, "mpi_busbw_gbs") for r in rows
                      if num(r, "oop_busbw_gbs") and num(r, "mpi_busbw_gbs")]
            roofs = [100 * num(r, "oop_busbw_gbs") / num(r, "roof_busbw_gbs") for r in rows
                     if num(r, "oop_busbw_gbs") and num(r, "roof_busbw_gbs")]
            algo = rows[-1]["algo"]
            cached = "*" if rows[-1].get("roof_cached") == "1" else ""
            p50 = ""
            if per_call:
                p50 = (f" {fmt(median([num(r, 'oop_p50_us') for r in rows]), '.2f')} |"
                       f" {fmt(median([num(r, 'mpi_p50_us') for r in rows]), '.2f')} |")
            print(f"| {key[4]} | {fmt(t, '.2f')} | {fmt(bw, '.2f')} | {fmt(ip, '.2f')} | {algo} | "
                  f"{fmt(mt, '.2f')} | {fmt(mbw, '.2f')} | {fmt(median(ratios), '.2f')} | "
                  f"{fmt(median(roofs), '.0f') + '%' + cached if roofs else '-'} |{p50}")

    if args.plot:
        plot(args.plot, args, groups, order, bw_note)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
