#!/usr/bin/python3
"""cclz-perf and scripts/perf_tables.py end to end, on real ranks.

  check_perf.py MPIEXEC CCLZ_PERF PERF_TABLES BUILD_DIR

1. Every collective on 2 and 3 ranks, with exact inputs (-c 1), two types
   and two ops given as lists, odd and zero sizes, the MPI baseline on: the
   exit status is 0, the CSV holds one row per (type, op, size) as asked,
   no element is wrong out of place or in place, and MPI's columns are
   filled. These runs skip the copy-bandwidth measurement (--no-roofline,
   about 3 s each), and the header says so.
2. Bad command lines end with status 2 and say what is wrong, before any
   collective runs.
3. Buffers from cclz::mem_alloc and heap buffers registered with
   cclz::register_buffer (-R 1, -R 2), at sizes of the direct path: exact.
4. --touch (buffers touched between calls): said in the header and the
   JSON, and the timed calls' output is exact.
5. --per-call: the median and 99th percentile of the slowest rank's time
   per call, in the table, the JSON and the CSV, calls back to back and
   with --touch. With one timed call both
   are that call, which is also the mean: all three must be equal; with
   more calls p50 <= p99, and p99 (the slowest call, under 100 calls) is
   at least the mean of the slowest rank. Without it the fields are
   empty.
6. The %roof column beyond the all-reduce: an all-gather and an all-to-all
   on 3 ranks with the copy bandwidth measured print it, and the JSON's
   roofline busbw is the collective's busbw factor times the measured
   bandwidth over its least traffic ((n+1) and 2n times the size).
7. perf_tables.py --plot: the markdown tables (headed by the copy
   bandwidth cclz-perf measured) and a PNG of the curves, from its own runs
   and from a CSV of step 1 (--from-csv, as scripts/main.sh); from a CSV of
   step 5, the median call's columns.
Every command is bounded in time; every failure is reported, then the test
exits 1 if there was any.
"""
import csv
import json
import os
import subprocess
import sys
import tempfile

MPIEXEC, PERF, TABLES, BUILD = sys.argv[1:5]
TIMEOUT = 120
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, flush=True)


def run(cmd):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT)
    return res.returncode, res.stdout, res.stderr


REDUCING = {"all_reduce", "reduce_scatter", "reduce"}
NO_IN_PLACE = {"all_to_all", "all_to_allv"}  # cclz-perf measures these out of place only
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce"]


def check_sweep(tmp, coll, ranks):
    path = os.path.join(tmp, f"{coll}-{ranks}.csv")
    # -i 1000 from 0: sizes 0, 1000, 2000, 3000, so zero, odd element counts
    # (bf16: 500, 1000, 1500) and sizes that are no multiple of a line.
    cmd = [MPIEXEC, "-n", str(ranks), PERF, coll, "-c", "1", "-b", "0", "-e", "3000", "-i", "1000",
           "-n", "2", "-w", "1", "-d", "f32,bf16", "-o", "sum,max", "-r", str(ranks - 1), "--csv", path,
           "--no-roofline"]
    rc, out, err = run(cmd)
    if rc != 0:
        fail(f"{' '.join(cmd)}: exit {rc}\n{out[-2000:]}\n{err[-2000:]}")
    if "# copy bandwidth not measured (--no-roofline)" not in out or "%roof" in out:
        fail(f"{' '.join(cmd)}: the header does not say the copy bandwidth was left out, or a %roof column\n{out}")
    if not os.path.exists(path):
        return fail(f"{' '.join(cmd)}: no CSV written")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    ops = ["sum", "max"] if coll in REDUCING else ["none"]
    # A collective whose buffers split into per-rank blocks rounds each size
    # down to whole elements per rank: 1000 bytes of f32 on 3 ranks is 996.
    quantum = 4 * ranks
    for t in ("f32", "bf16"):
        for o in ops:
            got = sorted(int(r["bytes"]) for r in rows if (r["type"], r["redop"]) == (t, o))
            ok = len(got) == 4 and got[0] == 0 and all(w - quantum < b <= w for b, w in zip(got, (0, 1000, 2000, 3000)))
            if not ok:
                fail(f"{coll} on {ranks} ranks, {t} {o}: sizes {got}, want 0, 1000, 2000, 3000 (or each rounded down)")
    if len(rows) != 8 * len(ops):
        fail(f"{coll} on {ranks} ranks: {len(rows)} rows, want {8 * len(ops)}")
    # Every type and op at one size before the next size, in the order given
    # (each size rounded down to its type's whole elements per rank).
    want = [(t, o) for t in ("f32", "bf16") for o in ops]
    for i in range(0, len(rows), len(want)):
        at = rows[i:i + len(want)]
        sizes = [int(r["bytes"]) for r in at]
        if [(r["type"], r["redop"]) for r in at] != want or max(sizes) - min(sizes) >= quantum:
            fail(f"{coll} on {ranks} ranks: rows {i}-{i + len(want) - 1} are "
                 f"{[(r['type'], r['redop'], r['bytes']) for r in at]}, want {want} at one size")
            break
    for r in rows:
        where = f"{coll} on {ranks} ranks, {r['type']} {r['redop']} {r['bytes']} B"
        if r["oop_wrong"] != "0":
            fail(f"{where}: {r['oop_wrong'] or 'no count of'} wrong out of place")
        want_ip = "" if coll in NO_IN_PLACE else "0"
        if r["ip_wrong"] != want_ip:
            fail(f"{where}: in place wrong count {r['ip_wrong']!r}, want {want_ip!r}")
        if int(r["bytes"]) > 0 and (r["mpi_time_us"] == "" or float(r["mpi_time_us"]) <= 0):
            fail(f"{where}: no MPI baseline")
        if int(r["bytes"]) > 0 and float(r["oop_time_us"]) <= 0:
            fail(f"{where}: time {r['oop_time_us']}")


def check_buffer_kinds(tmp):
    """-R 1 and -R 2 (mem_alloc, registered heap buffers) through the direct
    path's sizes, exact inputs: no element wrong, the header names them."""
    for flag, name in (("1", "cclz::mem_alloc"), ("2", "cclz::register_buffer")):
        for coll in ("all_reduce", "all_gather"):
            path = os.path.join(tmp, f"{coll}-R{flag}.csv")
            cmd = [MPIEXEC, "-n", "3", PERF, coll, "-c", "1", "-b", "1000000", "-e", "4000000", "-f", "4", "-n", "2",
                   "-w", "1", "-R", flag, "--offset", "16", "--csv", path, "--no-roofline"]
            rc, out, err = run(cmd)
            if rc != 0 or name not in out:
                fail(f"{' '.join(cmd)}: exit {rc}, header without {name!r}\n{out[-2000:]}\n{err[-2000:]}")
                continue
            with open(path) as f:
                rows = list(csv.DictReader(f))
            if len(rows) != 2 or any(r["oop_wrong"] != "0" or r["ip_wrong"] != "0" for r in rows):
                fail(f"{' '.join(cmd)}: rows {rows}")


def check_touch(tmp):
    """--touch: each call timed alone on touched buffers; the header and the
    JSON say so, the output of cclz's last timed call (on the touched
    inputs) is still exact, and MPI is timed the same way beside it."""
    for coll in ("all_reduce", "all_to_all"):
        path = os.path.join(tmp, f"{coll}-touch.json")
        cmd = [MPIEXEC, "-n", "3", PERF, coll, "-c", "1", "-b", "4K", "-e", "1M", "-f", "16", "-n", "3", "-w", "1",
               "--touch", "--json", path, "--no-roofline"]
        rc, out, err = run(cmd)
        if rc != 0 or "--touch: before each call every rank wrote its input" not in out:
            fail(f"{' '.join(cmd)}: exit {rc}, header without --touch\n{out[-2000:]}\n{err[-2000:]}")
            continue
        with open(path) as f:
            doc = json.load(f)
        rows = doc["rows"]
        if doc.get("touch") is not True or len(rows) != 3:
            fail(f"{' '.join(cmd)}: touch {doc.get('touch')!r}, {len(rows)} rows, want true and 3")
        if doc.get("copy_bw_n_gbs", 0) is not None:
            fail(f"{' '.join(cmd)}: copy_bw_n_gbs {doc.get('copy_bw_n_gbs')!r} in the JSON, want null (--no-roofline)")
        for r in rows:
            mpi = r["mpi"] or {}
            if r["out_of_place"]["wrong"] != 0 or not mpi.get("time_us"):
                fail(f"{' '.join(cmd)}: row {r}")


def check_per_call(tmp):
    """--per-call: p50/p99 columns, JSON and CSV fields, consistent with the
    mean; absent without it."""
    for coll, iters, touch in (("all_reduce", "1", []), ("all_to_all", "1", []), ("all_reduce", "12", []),
                               ("all_reduce", "1", ["--touch"])):
        path = os.path.join(tmp, f"{coll}-{iters}-{len(touch)}-per-call")
        cmd = [MPIEXEC, "-n", "3", PERF, coll, "-c", "1", "-b", "4K", "-e", "256K", "-f", "8", "-n", iters, "-w", "1",
               "--per-call", "--json", path + ".json", "--csv", path + ".csv", "--no-roofline"] + touch
        rc, out, err = run(cmd)
        if rc != 0 or "# --per-call: p50, p99 = median and 99th percentile" not in out:
            fail(f"{' '.join(cmd)}: exit {rc}, header without --per-call\n{out[-2000:]}\n{err[-2000:]}")
            continue
        head = [ln for ln in out.splitlines() if ln.startswith("#") and "size" in ln.split() and "p50" in ln]
        if len(head) != 1 or head[0].split()[-4:] != ["p50", "p99", "p50", "p99"]:
            fail(f"{' '.join(cmd)}: column heads {head}, want p50 p99 for cclz and MPI last")
        with open(path + ".json") as f:
            doc = json.load(f)
        if doc.get("per_call") is not True or len(doc["rows"]) != 3:
            fail(f"{' '.join(cmd)}: per_call {doc.get('per_call')!r}, {len(doc['rows'])} rows, want true and 3")
        measures = ("out_of_place", "mpi") if coll == "all_to_all" else ("out_of_place", "in_place", "mpi")
        for r in doc["rows"]:
            for name in measures:
                m = r[name] or {}
                mean, p50, p99 = m.get("time_us"), m.get("p50_us"), m.get("p99_us")
                if not mean or p50 is None or p99 is None:
                    fail(f"{' '.join(cmd)}: {name} of {r['bytes']} B: {m}")
                elif iters == "1" and not mean == p50 == p99:
                    fail(f"{' '.join(cmd)}: {name} of {r['bytes']} B, one call: mean {mean}, p50 {p50}, p99 {p99}, "
                         "want all equal")
                elif iters != "1" and not 0 < p50 <= p99 >= mean:
                    fail(f"{' '.join(cmd)}: {name} of {r['bytes']} B: mean {mean}, p50 {p50}, p99 {p99}")
        with open(path + ".csv") as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            if not (r["oop_p50_us"] and r["oop_p99_us"] and r["mpi_p50_us"] and r["mpi_p99_us"]):
                fail(f"{' '.join(cmd)}: CSV row without per-call figures: {r}")
    # Without --per-call: no columns, null and empty fields.
    path = os.path.join(tmp, "no-per-call")
    cmd = [MPIEXEC, "-n", "2", PERF, "all_reduce", "-b", "4K", "-e", "4K", "-n", "2", "-w", "1", "--json",
           path + ".json", "--csv", path + ".csv", "--no-roofline"]
    rc, out, err = run(cmd)
    if rc != 0 or "p50" in out:
        fail(f"{' '.join(cmd)}: exit {rc}, or p50 columns without --per-call\n{out[-2000:]}\n{err[-2000:]}")
    else:
        with open(path + ".json") as f:
            row = json.load(f)["rows"][0]
        with open(path + ".csv") as f:
            crow = list(csv.DictReader(f))[0]
        if row["out_of_place"]["p50_us"] is not None or crow["oop_p50_us"] != "":
            fail(f"{' '.join(cmd)}: per-call figures without --per-call: {row}, {crow}")


def check_errors():
    cases = [
        (["all_reduce", "-d", "f32,f33"], "unknown data type: f33"),
        (["all_reduce", "-d", "f32,,bf16"], "empty name in the data type list"),
        (["all_reduce", "-d", "bf16,bfloat16"], "data type bfloat16 given twice"),
        (["all_reduce", "-o", "sum,mean"], "unknown reduction op: mean"),
        (["all_reduce", "-b", "64K", "-e", "4K"], "-b is larger than -e"),
        (["all_gather", "-f", "1"], "bad step factor"),
        (["all_reduce", "-A", "no-such-algorithm"], "no algorithm 'no-such-algorithm' for all_reduce"),
        (["reduce", "-r", "2"], "root 2 is not a rank of 2"),
        (["no_such_collective"], "unknown collective: no_such_collective"),
        (["all_reduce", "--bogus"], "unknown option: --bogus"),
        (["all_reduce", "-R", "3"], "bad value for -R (0, 1 or 2): 3"),
        (["all_reduce", "--per-call", "--compressor", "bf16"], "--per-call times the tables' calls"),
    ]
    for args, text in cases:
        rc, out, err = run([MPIEXEC, "-n", "2", PERF] + args + ["--no-mpi"])
        if rc != 2 or text not in err:
            fail(f"cclz-perf {' '.join(args)}: exit {rc}, want 2 and '{text}' in stderr:\n{err[-1000:]}")
        if "#wrong" in out:
            fail(f"cclz-perf {' '.join(args)}: printed a table after a bad command line")


def check_png(path, what):
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as e:
        return fail(f"{what}: {e}")
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:8] != b"\x89PNG\r\n\x1a\n" or width < 300 or height < 200:
        fail(f"{what}: {path} is not a PNG of the curves ({head[:8]!r}, {width}x{height})")


def check_roofline(tmp):
    for coll, traffic in (("all_gather", 4), ("all_to_all", 6)):
        path = os.path.join(tmp, f"{coll}-roof.json")
        cmd = [MPIEXEC, "-n", "3", PERF, coll, "-b", "1M", "-e", "1M", "-n", "1", "-w", "1", "--no-mpi",
               "--json", path]
        rc, out, err = run(cmd)
        if rc != 0 or "%roof" not in out or f"roofline time = {'2*n*size' if traffic == 6 else '(n+1)*size'}" not in out:
            fail(f"{' '.join(cmd)}: exit {rc}, no %roof column or formula in the header\n{out[-2000:]}\n{err[-2000:]}")
            continue
        with open(path) as f:
            doc = json.load(f)
        bw, rows = doc.get("copy_bw_n_gbs"), doc["rows"]
        if not bw or len(rows) != 1 or rows[0]["roof_busbw_gbs"] is None:
            fail(f"{' '.join(cmd)}: copy bandwidth {bw!r}, rows {rows}")
            continue
        want = (2 / 3) * bw / traffic
        got = rows[0]["roof_busbw_gbs"]
        if abs(got - want) > 1e-3 * want:
            fail(f"{' '.join(cmd)}: roofline busbw {got} GB/s, want {want} (2/3 of {bw} GB/s over {traffic})")
        if rows[0]["roof_cached"] != (traffic * rows[0]["bytes"] <= doc["llc_bytes"]):
            fail(f"{' '.join(cmd)}: roof_cached {rows[0]['roof_cached']} for {traffic} x {rows[0]['bytes']} bytes "
                 f"against a {doc['llc_bytes']}-byte last level")


def check_tables(tmp):
    png = os.path.join(tmp, "curves.png")
    cmd = [TABLES, "--runs", "2", "--ranks", "2", "--build", BUILD, "--mpiexec", MPIEXEC, "--plot", png, "all_reduce",
           "-d", "f32,bf16", "-b", "4K", "-e", "16K", "-n", "2", "-w", "1"]
    rc, out, err = run(cmd)
    if rc != 0:
        return fail(f"{' '.join(cmd)}: exit {rc}\n{out[-2000:]}\n{err[-2000:]}")
    for dtype in ("f32", "bf16"):
        head = f"**all_reduce, 2 ranks, {dtype} sum, algorithm: tuner, heap buffers** (median of 2 runs"
        if head not in out:
            fail(f"perf_tables: no table headed {head!r} in:\n{out}")
    # Without --no-roofline cclz-perf measures the copy bandwidth, which
    # perf_tables reads from its header.
    if "; two copiers " not in out:
        fail(f"perf_tables: no copy bandwidth from cclz-perf's header in:\n{out}")
    table_rows = [ln for ln in out.splitlines() if ln.startswith("| 4096 |") or ln.startswith("| 16384 |")]
    if len(table_rows) != 4:
        fail(f"perf_tables: {len(table_rows)} rows for 4096 and 16384 bytes, want 4:\n{out}")
    check_png(png, "perf_tables --plot")

    # From step 1's CSV: a table per (type, op), no run of its own.
    png = os.path.join(tmp, "from-csv.png")
    cmd = [TABLES, "--from-csv", os.path.join(tmp, "reduce-3.csv"), "--ranks", "3", "--plot", png, "reduce"]
    rc, out, err = run(cmd)
    if rc != 0:
        return fail(f"{' '.join(cmd)}: exit {rc}\n{out[-2000:]}\n{err[-2000:]}")
    for t in ("f32", "bf16"):
        for o in ("sum", "max"):
            head = f"**reduce, 3 ranks, {t} {o}, algorithm: tuner, heap buffers** (median of 1 run"
            if head not in out:
                fail(f"perf_tables --from-csv: no table headed {head!r} in:\n{out}")
    check_png(png, "perf_tables --from-csv --plot")
    # A --per-call run's CSV (check_per_call): the median call's columns too.
    cmd = [TABLES, "--from-csv", os.path.join(tmp, "all_reduce-12-0-per-call.csv"), "--ranks", "3", "all_reduce"]
    rc, out, err = run(cmd)
    rows = [ln.split("|") for ln in out.splitlines() if ln.startswith("| 4096 |")]
    if rc != 0 or "| p50 (us) | MPI p50 (us) |" not in out or len(rows) != 1 or not all(
            float(c) > 0 for c in rows[0][-3:-1]):
        fail(f"{' '.join(cmd)}: exit {rc}, want p50 columns with figures:\n{out}\n{err[-500:]}")
    rc, out, err = run([TABLES, "--from-csv", os.path.join(tmp, "reduce-3.csv"), "all_gather"])
    if rc == 0 or "is not a all_gather run" not in err:
        fail(f"perf_tables --from-csv of a reduce run as all_gather: exit {rc}, stderr {err[-500:]!r}")


with tempfile.TemporaryDirectory() as tmp:
    check_errors()
    for coll in COLLECTIVES:
        for ranks in (2, 3):
            check_sweep(tmp, coll, ranks)
    check_buffer_kinds(tmp)
    check_touch(tmp)
    check_per_call(tmp)
    check_roofline(tmp)
    check_tables(tmp)

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all cclz-perf checks passed")
