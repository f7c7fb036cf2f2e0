#!/usr/bin/python3
"""torch.distributed.all_reduce (float32, sum) with backend "cclz" beside
"gloo" (and "mpi" when this torch has it), same processes, same tensors;
"cclz-shm" is cclz on a tensor from cclz.torch.empty (shared memory, the
direct path), the others run on a heap tensor.

    PYTHONPATH=<builddir>/src/torch/python /usr/bin/python3 bench/torch_allreduce.py \
        [--ranks 2] [--min-bytes 1K] [--max-bytes 256M] [--runs 5]

The default group is cclz; gloo (and mpi) are groups over the same ranks, so
the backends alternate size by size under the same machine load. Per size
and backend: `runs` timed runs of `iters` all-reduces each (after a warm-up),
the time of one all-reduce being the run's mean; the table gives the median
over runs. busbw = 2 (n-1)/n * bytes / time (nccl-tests' all-reduce factor).
Rank 0 prints; launch without mpiexec (the script spawns its ranks), except
that "mpi" is only measured when launched by mpiexec (then --ranks is ignored).
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B")
    return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)


def human(nbytes):
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= f:
            return f"{nbytes // f}{unit}"
    return str(nbytes)


def iters_for(nbytes):
    # About 64 MB moved per run, between 3 and 200 calls.
    return max(3, min(200, (64 << 20) // max(nbytes, 1)))


def time_backend(t, group, iters, runs):
    for _ in range(2):
        dist.all_reduce(t, group=group)
    samples = []
    for _ in range(runs):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        samples.append((time.perf_counter() - t0) / iters)
    # The slowest rank decides: agree on the max of each sample.
    s = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(s, op=dist.ReduceOp.MAX, group=group)
    return statistics.median(s.tolist())


def bench(rank, world, args, groups):
    import cclz.torch
    sizes = []
    n = parse_size(args.min_bytes)
    while n <= parse_size(args.max_bytes):
        sizes.append(n)
        n *= 4 if n >= (1 << 20) else 2
    names = ["cclz", "cclz-shm"] + [b for b in groups if b != "cclz"]
    if rank == 0:
        print(f"# torch.distributed.all_reduce float32 sum, {world} ranks, torch {torch.__version__}, "
              f"median of {args.runs} runs")
        head = f"{'size':>6} {'count':>10}"
        for b in names:
            head += f" {b + ' us':>12} {b + ' GB/s':>10}"
        if "cclz" in names and len(names) > 1:
            head += "".join(f" {'x ' + b:>10}" for b in names if b != "cclz")
        print(head, flush=True)
    factor = 2 * (world - 1) / world
    for nbytes in sizes:
        count = nbytes // 4
        heap = torch.ones(count, dtype=torch.float32)
        shm = cclz.torch.empty(count).fill_(1.0)
        times = {b: time_backend(shm if b == "cclz-shm" else heap, groups.get(b), iters_for(nbytes), args.runs)
                 for b in names}
        if rank == 0:
            line = f"{human(nbytes):>6} {count:>10}"
            for b in names:
                line += f" {times[b] * 1e6:>12.1f} {factor * nbytes / times[b] / 1e9:>10.3f}"
            if "cclz" in names and len(names) > 1:
                line += "".join(f" {times[b] / times['cclz']:>10.2f}" for b in names if b != "cclz")
            print(line, flush=True)


def worker(rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import cclz.torch  # noqa: F401  registers the backend
    torch.set_num_threads(1)
    dist.init_process_group("cclz", rank=rank, world_size=world)
    groups = {"cclz": None, "gloo": dist.new_group(backend="gloo")}
    if args.mpi:
        groups["mpi"] = dist.new_group(backend="mpi")
    bench(rank, world, args, groups)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--min-bytes", default="1K")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    under_mpiexec = "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ
    args.mpi = under_mpiexec and dist.is_mpi_available()
    if under_mpiexec:
        rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")))
        world = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE")))
        worker(rank, world, int(os.environ.get("MASTER_PORT", "29517")), args)
        return 0
    if not dist.is_mpi_available():
        print("# mpi: this torch was built without MPI; measured cclz and gloo only", flush=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(args.ranks, port, args), nprocs=args.ranks, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
