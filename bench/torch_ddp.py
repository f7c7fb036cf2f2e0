#!/usr/bin/python3
"""DDP step time with backend "cclz", gradient buckets on the heap against
buckets in shared memory (cclz.torch.use_shared_memory), alternating.

    PYTHONPATH=<builddir>/src/torch/python /usr/bin/python3 bench/torch_ddp.py \\
        [--ranks 2] [--layers 8] [--width 1024] [--steps 20] [--rounds 2]

The model is `layers` Linear(width, width) layers (f32; 8 x 1024 x 1024 is
32 MiB of gradients, two DDP buckets), batch 16, SGD. Each round launches
the ranks twice, once per allocator (use_shared_memory applies to a whole
process), and times `steps` steps after 5 warm-up steps; rank 0 prints the
mean step time, the all-reduces per step that went direct and the loss
(the same in both: the reductions are the same sums).
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, port, args, shared):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import cclz.torch
    torch.set_num_threads(1)
    if shared:
        cclz.torch.use_shared_memory()
    dist.init_process_group("cclz", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, args.width, generator=g), torch.randn(16, args.width, generator=g)
    for step in range(5 + args.steps):
        if step == 5:
            t0, d0 = time.perf_counter(), cclz.torch.direct_calls()
        opt.zero_grad()
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    t = torch.tensor([(time.perf_counter() - t0) / args.steps])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"{'shared' if shared else 'heap':>6} {t.item() * 1e3:10.2f} "
              f"{(cclz.torch.direct_calls() - d0) / args.steps:10.1f} {loss.item():12.6f}", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    print(f"# DDP over cclz, {args.ranks} ranks, {args.layers} x Linear({args.width}, {args.width}), "
          f"torch {torch.__version__}")
    print(f"{'grads':>6} {'step ms':>10} {'direct/step':>10} {'loss':>12}", flush=True)
    for _ in range(args.rounds):
        for shared in (False, True):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.start_processes(worker, args=(args.ranks, port, args, shared), nprocs=args.ranks, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
