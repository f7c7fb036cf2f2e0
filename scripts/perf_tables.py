#!/usr/bin/env python3
"""Runs cclz-perf several times and prints markdown tables of the medians.

One host's bandwidth drifts from run to run (other tenants, placement of the
processes), so each published figure is the median over RUNS runs of
cclz-perf, and every ratio is taken inside one run (cclz and MPI measured
side by side) before the median is taken.

  scripts/perf_tables.py [--runs 3] [--ranks 2] [--build build] [--bind]
                         [--buffers heap,mem_alloc]
                         COLLECTIVE [cclz-perf options...]

--bind passes `-bind-to core` to mpiexec (one rank per core; use it when the
ranks fit on the cores). --buffers lists the buffer kinds to measure (heap:
cclz-perf -R 0, mem_alloc: -R 1); with several, each run goes through all
of them in turn, so that a change in the host falls on all alike. Output:
one markdown table per (buffers, algorithm, type), with time, busbw,
in-place busbw, the MPI baseline, the ratio and the share of the memory
roofline (marked * where the working set fits in the last-level cache and
the roofline does not bind), headed by the range of the two-copier
bandwidth the runs measured.
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile


def run_once(args, extra, csv_path):
    cmd = ["mpiexec"]
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--build", default="build")
    p.add_argument("--bind", action="store_true")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cclz-perf run")
    p.add_argument("--buffers", default="heap", help="comma-separated: heap, mem_alloc")
    p.add_argument("collective")
    args, extra = p.parse_known_args()
    if args.runs < 1:
        sys.exit("perf_tables: --runs must be at least 1")

    kinds = [k.strip() for k in args.buffers.split(",") if k.strip()]
    for k in kinds:
        if k not in ("heap", "mem_alloc"):
            sys.exit(f"perf_tables: unknown buffer kind {k!r} (heap, mem_alloc)")
    groups = {}  # (buffers, requested, type, bytes) -> list of rows
    order = []
    copy_bw = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for kind in kinds:
                reg = ["-R", "1" if kind == "mem_alloc" else "0"]
                rows, bw = run_once(args, extra + reg, os.path.join(tmp, f"run{i}-{kind}.csv"))
                if bw is not None:
                    copy_bw.append(bw)
                for row in rows:
                    if row.get("supported") == "0":
                        continue
                    key = (kind, row["requested"], row["type"], int(row["bytes"]))
                    if key not in groups:
                        groups[key] = []
                        order.append(key)
                    groups[key].append(row)

    tables = {}
    for key in order:
        tables.setdefault(key[:3], []).append(key)
    bw_note = f"; two copiers {min(copy_bw):.1f}-{max(copy_bw):.1f} GB/s" if copy_bw else ""
    for (kind, requested, dtype), keys in tables.items():
        print(f"\n**{args.collective}, {args.ranks} ranks, {dtype}, algorithm: {requested}, {kind} buffers** "
              f"(median of {args.runs} runs{', ranks bound to cores' if args.bind else ''}{bw_note})\n")
        print("| size (B) | time (us) | busbw (GB/s) | in-place busbw | algo | MPI time (us) | MPI busbw | "
              "cclz/MPI | %roof |")
        print("|---:|---:|---:|---:|---|---:|---:|---:|---:|")
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
            print(f"| {key[3]} | {fmt(t, '.2f')} | {fmt(bw, '.2f')} | {fmt(ip, '.2f')} | {algo} | "
                  f"{fmt(mt, '.2f')} | {fmt(mbw, '.2f')} | {fmt(median(ratios), '.2f')} | "
                  f"{fmt(median(roofs), '.0f') + '%' + cached if roofs else '-'} |")


if __name__ == "__main__":
    main()
