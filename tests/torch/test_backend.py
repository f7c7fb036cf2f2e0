"""torch.distributed backend "cclz" against gloo, on N local processes.

    PYTHONPATH=<builddir>/src/torch/python /usr/bin/python3 test_backend.py N

Each process joins the default group with backend="cclz" and a second group
over the same ranks with backend="gloo", then checks, in one launch (torch's
import is slow):
  * every collective of the backend on every dtype and op against gloo's
    result for the same inputs (small integers: exact in any order); where
    gloo does not support a dtype or op, against the sum computed locally
    from every rank's known input;
  * async Work objects (is_completed, wait, get_future) and errors
    (unsupported dtype and op, cclz's own for a bad peer);
  * DDP of a small MLP, 20 SGD steps, cclz against gloo: same parameters
    within 1e-5 relative;
  * DDP with cclz.torch.hook("powersgd:rank=4"): the loss falls; a
    collective issued while a hook all-reduce is queued runs after it;
  * a bad spec raises ValueError naming the spec;
  * cclz.torch.share_memory_: an existing tensor's storage moves into
    shared memory with its bytes, views following, and goes direct;
  * tensors from cclz.torch.empty (shared memory): zeroed and page-aligned,
    freed with their storage; collectives on them, views included, match
    the local reference and take the direct path (cclz.torch.direct_calls
    counts them), and do not when one rank's tensor is heap memory;
  * cclz.torch.use_shared_memory: large tensors come from the pool and go
    back to it, and DDP's buckets go direct with the same parameters as
    gloo's DDP.
"""
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int32, torch.int64, torch.int8, torch.uint8]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def rank_input(rank, n, dtype):
    # 1..3 so that products over 4 ranks stay small and uint8/int8 are exact.
    return ((torch.arange(n, dtype=torch.int64) * 7 + rank * 3) % 3 + 1).to(dtype)


def reference_reduce(inputs, op, n_ranks):
    acc = torch.stack([t.to(torch.float64) for t in inputs])
    if op == "sum":
        r = acc.sum(0)
    elif op == "product":
        r = acc.prod(0)
    elif op == "min":
        r = acc.min(0).values
    elif op == "max":
        r = acc.max(0).values
    else:
        r = acc.sum(0) / n_ranks
        if not inputs[0].is_floating_point():
            r = torch.trunc(r)
    return r.to(inputs[0].dtype)


class Checker:
    def __init__(self, rank, world, gloo):
        self.rank, self.world, self.gloo = rank, world, gloo
        self.compared_gloo = 0
        self.compared_ref = 0

    def same(self, what, got, want):
        if got.shape != want.shape or got.dtype != want.dtype:
            raise AssertionError(f"rank {self.rank}: {what}: cclz {got.dtype} {tuple(got.shape)}, "
                                 f"expected {want.dtype} {tuple(want.shape)}")
        if not torch.equal(got, want):
            # A few elements only: the message travels through a pipe that
            # the parent reads once every rank has ended.
            bad = (got != want).reshape(-1).nonzero().reshape(-1)
            first = [(int(i), got.reshape(-1)[i].item(), want.reshape(-1)[i].item()) for i in bad[:5]]
            raise AssertionError(f"rank {self.rank}: {what}: {bad.numel()} of {got.numel()} elements differ; "
                                 f"(index, cclz, expected): {first}")

    def against_gloo(self, what, run, reference):
        """run(group) returns the result tensor; compare cclz with gloo, or
        with reference() where gloo cannot do it."""
        got = run(None)
        try:
            want = run(self.gloo)
            self.compared_gloo += 1
        except RuntimeError:
            want = reference()
            self.compared_ref += 1
        self.same(what, got, want)


def check_collectives(ck):
    rank, n = ck.rank, ck.world
    for dtype in DTYPES:
        for count in (0, 1, 5, 1000):
            for op_name, op in OPS.items():
                if op_name == "product" and count == 1000:
                    continue
                inputs = [rank_input(r, count, dtype) for r in range(n)]

                def run(group, op=op, dtype=dtype, count=count):
                    t = rank_input(rank, count, dtype)
                    dist.all_reduce(t, op=op, group=group)
                    return t
                ck.against_gloo(f"all_reduce {dtype} n={count} {op_name}", run,
                                lambda inputs=inputs, op_name=op_name: reference_reduce(inputs, op_name, n))
        count = 6
        inputs = [rank_input(r, count, dtype) for r in range(n)]
        total = reference_reduce(inputs, "sum", n)

        def bcast(group, dtype=dtype):
            t = rank_input(rank, count, dtype)
            dist.broadcast(t, src=n - 1, group=group)
            return t
        ck.against_gloo(f"broadcast {dtype}", bcast, lambda inputs=inputs: inputs[n - 1])

        def red(group, dtype=dtype):
            t = rank_input(rank, count, dtype)
            dist.reduce(t, dst=1, op=dist.ReduceOp.SUM, group=group)
            return t if rank == 1 else torch.zeros(0, dtype=dtype)
        ck.against_gloo(f"reduce {dtype}", red,
                        lambda total=total, inputs=inputs: total if rank == 1 else torch.zeros(0, dtype=dtype))

        def agather(group, dtype=dtype):
            outs = [torch.zeros(count, dtype=dtype) for _ in range(n)]
            dist.all_gather(outs, rank_input(rank, count, dtype), group=group)
            return torch.cat(outs)
        ck.against_gloo(f"all_gather {dtype}", agather, lambda inputs=inputs: torch.cat(inputs))

        def agather_base(group, dtype=dtype):
            out = torch.zeros(n * count, dtype=dtype)
            getattr(dist, "all_gather_into_tensor", getattr(dist, "_all_gather_base", None))(out, rank_input(rank, count, dtype), group=group)
            return out
        ck.against_gloo(f"all_gather_into_tensor {dtype}", agather_base, lambda inputs=inputs: torch.cat(inputs))

        def gath(group, dtype=dtype):
            root = n - 1
            outs = [torch.zeros(count, dtype=dtype) for _ in range(n)] if rank == root else None
            dist.gather(rank_input(rank, count, dtype), outs, dst=root, group=group)
            return torch.cat(outs) if rank == root else torch.zeros(0, dtype=dtype)
        ck.against_gloo(f"gather {dtype}", gath,
                        lambda inputs=inputs, dtype=dtype: torch.cat(inputs) if rank == n - 1
                        else torch.zeros(0, dtype=dtype))

        def scat(group, dtype=dtype):
            ins = [rank_input(0, count, dtype) + j for j in range(n)] if rank == 0 else None
            out = torch.zeros(count, dtype=dtype)
            dist.scatter(out, ins, src=0, group=group)
            return out
        ck.against_gloo(f"scatter {dtype}", scat, lambda dtype=dtype: (rank_input(0, count, dtype) + rank).to(dtype))

        def rscatter(group, dtype=dtype):
            ins = [rank_input(rank, count, dtype) + j for j in range(n)]
            out = torch.zeros(count, dtype=dtype)
            dist.reduce_scatter(out, ins, group=group)
            return out
        ck.against_gloo(f"reduce_scatter {dtype}", rscatter,
                        lambda total=total, dtype=dtype: (total + n * rank).to(dtype))

        def rscatter_base(group, dtype=dtype):
            inp = rank_input(rank, n * count, dtype)
            out = torch.zeros(count, dtype=dtype)
            getattr(dist, "reduce_scatter_tensor", getattr(dist, "_reduce_scatter_base", None))(out, inp, group=group)
            return out
        ins_big = [rank_input(r, n * count, dtype) for r in range(n)]
        ck.against_gloo(f"reduce_scatter_tensor {dtype}", rscatter_base,
                        lambda: reference_reduce(ins_big, "sum", n)[rank * count:(rank + 1) * count])

        def a2a_equal(group, dtype=dtype):
            inp = (torch.arange(n * 3) + 10 * rank).to(dtype)
            out = torch.zeros(n * 3, dtype=dtype)
            dist.all_to_all_single(out, inp, group=group)
            return out
        ck.against_gloo(f"all_to_all_single equal {dtype}", a2a_equal,
                        lambda dtype=dtype: torch.cat([(torch.arange(rank * 3, rank * 3 + 3) + 10 * r).to(dtype)
                                                       for r in range(n)]))

        # Uneven: rank r sends (r + j + 1) rows of 2 elements to rank j.
        def a2a_uneven(group, dtype=dtype):
            in_splits = [rank + j + 1 for j in range(n)]
            out_splits = [r + rank + 1 for r in range(n)]
            inp = (torch.arange(sum(in_splits) * 2).reshape(-1, 2) + 100 * rank).to(dtype)
            out = torch.zeros(sum(out_splits), 2, dtype=dtype)
            dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)
            return out

        def a2a_uneven_ref(dtype=dtype):
            parts = []
            for r in range(n):
                splits = [r + j + 1 for j in range(n)]
                off = sum(splits[:rank])
                full = torch.arange(sum(splits) * 2).reshape(-1, 2) + 100 * r
                parts.append(full[off:off + splits[rank]])
            return torch.cat(parts).to(dtype)
        ck.against_gloo(f"all_to_all_single uneven {dtype}", a2a_uneven, a2a_uneven_ref)

    # allreduce_coalesced, through the group object (no public wrapper in every version).
    ts = [rank_input(rank, 4, torch.float32), rank_input(rank, 3, torch.float32)]
    pg = dist.distributed_c10d._get_default_group()
    pg.allreduce_coalesced(ts).wait()
    for i, c in enumerate((4, 3)):
        ck.same(f"allreduce_coalesced[{i}]", ts[i],
                reference_reduce([rank_input(r, c, torch.float32) for r in range(n)], "sum", n))

    # Non-contiguous input: a transposed view is reduced in place.
    base = rank_input(rank, 12, torch.float32).reshape(3, 4)
    view = base.t()
    dist.all_reduce(view)
    ck.same("all_reduce non-contiguous", base,
            reference_reduce([rank_input(r, 12, torch.float32) for r in range(n)], "sum", n).reshape(3, 4))

    # send/recv around a ring, and barrier.
    t = torch.full((5,), float(rank))
    r = torch.zeros(5)
    if rank % 2 == 0:
        dist.send(t, (rank + 1) % n)
        dist.recv(r, (rank - 1) % n)
    else:
        dist.recv(r, (rank - 1) % n)
        dist.send(t, (rank + 1) % n)
    ck.same("send/recv", r, torch.full((5,), float((rank - 1) % n)))
    dist.barrier()

    # A cclz subgroup of the even ranks (its own store prefix, so its own
    # unique id); every rank calls new_group, only members construct it.
    evens = list(range(0, n, 2))
    sub = dist.new_group(evens, backend="cclz")
    if rank in evens:
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, group=sub)
        ck.same("all_reduce on an even-rank subgroup", t, torch.full((3,), float(sum(r + 1 for r in evens))))

    # Async Work: completes, wait() returns, result correct.
    t = rank_input(rank, 1 << 16, torch.float32)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    if not w.is_completed():
        raise AssertionError("Work.is_completed() false after wait()")
    ck.same("async all_reduce", t,
            reference_reduce([rank_input(r, 1 << 16, torch.float32) for r in range(n)], "sum", n))

    # The future path (what DDP's reducer uses): completed by the group's
    # completion thread without anyone calling wait().
    t = rank_input(rank, 1000, torch.float64)
    fut = dist.all_reduce(t, async_op=True).get_future()
    ck.same("all_reduce future", fut.wait()[0],
            reference_reduce([rank_input(r, 1000, torch.float64) for r in range(n)], "sum", n))
    # is_completed() polled alone reaches true.
    w = dist.all_reduce(torch.ones(10), async_op=True)
    while not w.is_completed():
        pass

    # Errors surface as exceptions with a clear message.
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.bool))
        raise AssertionError("all_reduce of a bool tensor did not raise")
    except RuntimeError as e:
        if "unsupported dtype" not in str(e):
            raise AssertionError(f"unexpected message for a bool tensor: {e}")
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND)
        raise AssertionError("all_reduce with BAND did not raise")
    except RuntimeError as e:
        if "unsupported reduce op" not in str(e):
            raise AssertionError(f"unexpected message for BAND: {e}")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def check_shared(ck):
    import cclz.torch
    rank, n = ck.rank, ck.world
    t = cclz.torch.empty(3, 5, dtype=torch.float64)
    if t.shape != (3, 5) or t.dtype != torch.float64 or t.data_ptr() % 4096 or t.any():
        raise AssertionError(f"cclz.torch.empty(3, 5): shape {tuple(t.shape)}, dtype {t.dtype}, "
                             f"address {t.data_ptr():#x}, nonzero {int(t.count_nonzero())}")
    if cclz.torch.empty((2, 0)).numel() != 0 or cclz.torch.empty(torch.Size([4])).shape != (4,):
        raise AssertionError("cclz.torch.empty: a tuple or torch.Size size")
    for bad, exc in (((-1,), ValueError), (("4",), TypeError), ((2.5,), TypeError)):
        try:
            cclz.torch.empty(*bad)
            raise AssertionError(f"cclz.torch.empty{bad} did not raise")
        except exc:
            pass
    try:
        cclz.torch.empty(4, dtype="float32")
        raise AssertionError("cclz.torch.empty with a str dtype did not raise")
    except TypeError as e:
        if "torch.dtype" not in str(e):
            raise AssertionError(f"unexpected message for a str dtype: {e}")

    # Each allocation holds a descriptor until its storage is freed.
    before = open_fds()
    for _ in range(20):
        v = cclz.torch.empty(1 << 18)[10:20]
        v.fill_(1.0)
    del v
    if open_fds() != before:
        raise AssertionError(f"cclz.torch.empty: {open_fds() - before} descriptors left after freeing 20 tensors")

    # share_memory_ moves an existing heap tensor's storage: views follow it
    # with the same bytes, the memory is freed with the storage, and the
    # collectives on it go direct.
    count = (1 << 20) + 3
    inputs = [rank_input(r, count, torch.float32) for r in range(n)]
    base = torch.zeros(count + 9)
    view = base[4:4 + count]
    view.copy_(inputs[rank])
    old = base.data_ptr()
    if cclz.torch.share_memory_(base) is not base:
        raise AssertionError("cclz.torch.share_memory_ did not return its tensor")
    if base.data_ptr() == old or base.data_ptr() % 4096 or view.data_ptr() != base.data_ptr() + 16:
        raise AssertionError(f"cclz.torch.share_memory_: storage at {base.data_ptr():#x} (was {old:#x}), "
                             f"view at {view.data_ptr():#x}")
    ck.same("a view after share_memory_", view, inputs[rank])
    before = cclz.torch.direct_calls()
    dist.all_reduce(view)
    ck.same("all_reduce of a view into a share_memory_ tensor", view, reference_reduce(inputs, "sum", n))
    ck.same("bytes around that view", torch.cat([base[:4], base[4 + count:]]), torch.zeros(9))
    if n > 1 and cclz.torch.direct_calls() != before + 1:
        raise AssertionError(f"rank {rank}: all_reduce of a share_memory_ tensor did not go direct")
    shared = cclz.torch.empty(1 << 10)
    where = shared.data_ptr()
    cclz.torch.share_memory_(shared)
    cclz.torch.share_memory_(base)
    if shared.data_ptr() != where or base.data_ptr() % 4096:
        raise AssertionError("cclz.torch.share_memory_ moved a tensor already in shared memory")
    cclz.torch.share_memory_(torch.empty(0))
    before = open_fds()
    for _ in range(20):
        cclz.torch.share_memory_(torch.ones(1 << 16)[1:]).add_(1)
    del base, view, shared  # each held one descriptor when `before` was taken
    if open_fds() != before - 2:
        raise AssertionError(f"cclz.torch.share_memory_: {open_fds() - before + 2} descriptors left "
                             "after freeing 22 tensors")
    for bad, exc in (([1.0], TypeError), (torch.empty(3, device="meta"), ValueError)):
        try:
            cclz.torch.share_memory_(bad)
            raise AssertionError(f"cclz.torch.share_memory_({bad!r}) did not raise")
        except exc as e:
            if "share_memory_" not in str(e):
                raise AssertionError(f"cclz.torch.share_memory_: unexpected message {e}")

    # From 1 MiB the direct path is taken on every call where all of the
    # node's ranks' buffers are shared (below it, it is tried while it pays).
    count = (1 << 20) + 3
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8):
        for op_name in ("sum", "max", "avg") if dtype == torch.float32 else ("sum", "max"):
            inputs = [rank_input(r, count, dtype) for r in range(n)]
            t = cclz.torch.empty(count, dtype=dtype)
            t.copy_(inputs[rank])
            before = cclz.torch.direct_calls()
            dist.all_reduce(t, op=OPS[op_name])
            ck.same(f"all_reduce of a shared {dtype} tensor, {op_name}", t, reference_reduce(inputs, op_name, n))
            if n > 1 and cclz.torch.direct_calls() != before + 1:
                raise AssertionError(f"rank {rank}: all_reduce of a shared {dtype} tensor did not go direct")

    # A view at an odd offset into a shared tensor, reduced in place.
    inputs = [rank_input(r, count, torch.float32) for r in range(n)]
    big = cclz.torch.empty(count + 7)
    view = big[5:5 + count]
    view.copy_(inputs[rank])
    dist.all_reduce(view)
    ck.same("all_reduce of a view into a shared tensor", view, reference_reduce(inputs, "sum", n))
    ck.same("bytes around the view", torch.cat([big[:5], big[5 + count:]]), torch.zeros(7))

    # Rank 0's tensor is heap memory: the ranks agree to stage, and the
    # result is the same. (Run with CCLZ_SHM_CMA=0: heap buffers would
    # otherwise go direct through cross-memory attach; tests/mpi checks that.)
    before = cclz.torch.direct_calls()
    t = rank_input(rank, count, torch.float32)
    if rank != 0:
        t = cclz.torch.empty(count).copy_(t)
    dist.all_reduce(t)
    ck.same("all_reduce with rank 0's tensor on the heap", t, reference_reduce(inputs, "sum", n))
    if cclz.torch.direct_calls() != before:
        raise AssertionError(f"rank {rank}: went direct although rank 0's tensor is heap memory")

    # The other collectives with a tensor interface, on shared tensors.
    per = (1 << 18) + 1
    ins = [rank_input(r, per, torch.float32) for r in range(n)]
    before = cclz.torch.direct_calls()
    src = cclz.torch.empty(per).copy_(ins[rank])
    out = cclz.torch.empty(n * per)
    getattr(dist, "all_gather_into_tensor", getattr(dist, "_all_gather_base", None))(out, src)
    ck.same("all_gather_into_tensor of shared tensors", out, torch.cat(ins))
    big_ins = [rank_input(r, n * per, torch.float32) for r in range(n)]
    src = cclz.torch.empty(n * per).copy_(big_ins[rank])
    out = cclz.torch.empty(per)
    getattr(dist, "reduce_scatter_tensor", getattr(dist, "_reduce_scatter_base", None))(out, src)
    ck.same("reduce_scatter_tensor of shared tensors", out,
            reference_reduce(big_ins, "sum", n)[rank * per:(rank + 1) * per])
    t = cclz.torch.empty(count).copy_(inputs[rank])
    dist.broadcast(t, src=n - 1)
    ck.same("broadcast of a shared tensor", t, inputs[n - 1])
    t = cclz.torch.empty(count).copy_(inputs[rank])
    dist.reduce(t, dst=n - 1)
    if rank == n - 1:
        ck.same("reduce of shared tensors", t, reference_reduce(inputs, "sum", n))
    src = cclz.torch.empty(n * per).copy_(big_ins[rank])
    out = cclz.torch.empty(n * per)
    dist.all_to_all_single(out, src)
    ck.same("all_to_all_single of shared tensors", out,
            torch.cat([big_ins[r][rank * per:(rank + 1) * per] for r in range(n)]))
    if n > 1 and cclz.torch.direct_calls() != before + 5:
        raise AssertionError(f"rank {rank}: {cclz.torch.direct_calls() - before} of all_gather_into_tensor, "
                             "reduce_scatter_tensor, broadcast, reduce and all_to_all_single on shared tensors "
                             "went direct, not 5")
    zero = cclz.torch.empty(0)
    dist.all_reduce(zero)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train(model, steps, rank, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1000 + rank)
    w_true = torch.linspace(-1, 1, 64).reshape(16, 4)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=g)
        y = x @ w_true
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_ddp(ck):
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank = ck.rank
    # bucket_cap_mb small so that the model spans several buckets.
    m_cclz = DDP(make_model(0), bucket_cap_mb=0.001)
    m_gloo = DDP(make_model(0), process_group=ck.gloo, bucket_cap_mb=0.001)
    train(m_cclz, 20, rank)
    train(m_gloo, 20, rank)
    worst = 0.0
    for (name, a), b in zip(m_cclz.module.named_parameters(), m_gloo.module.parameters()):
        rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
        worst = max(worst, rel)
        if rel > 1e-5:
            raise AssertionError(f"rank {rank}: DDP parameter {name} differs from gloo's by {rel:.3g} relative")
    return worst


def check_shared_allocator(ck):
    """cclz.torch.use_shared_memory: large tensors torch allocates itself are
    shared, DDP's buckets go direct and train as gloo's do. Last: it changes
    where every later tensor of this process lives."""
    import cclz.torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, n = ck.rank, ck.world
    for bad, exc in ((0, ValueError), ("1", TypeError)):
        try:
            cclz.torch.use_shared_memory(bad)
            raise AssertionError(f"use_shared_memory({bad!r}) did not raise")
        except exc:
            pass
    cclz.torch.use_shared_memory(1 << 16)
    live = cclz.torch.shared_memory_stats()["live_blocks"]
    small = torch.zeros(100)
    big = torch.empty(1 << 18)
    if cclz.torch.shared_memory_stats()["live_blocks"] != live + 1 or big.data_ptr() % 4096:
        raise AssertionError(f"use_shared_memory: a 1 MiB tensor was not served from the pool "
                             f"({cclz.torch.shared_memory_stats()}, address {big.data_ptr():#x})")
    inputs = [rank_input(r, 1 << 18, torch.float32) for r in range(n)]
    big.copy_(inputs[rank])
    before = cclz.torch.direct_calls()
    dist.all_reduce(big)
    ck.same("all_reduce of a pool tensor", big, reference_reduce(inputs, "sum", n))
    if n > 1 and cclz.torch.direct_calls() != before + 1:
        raise AssertionError(f"rank {rank}: all_reduce of a pool tensor did not go direct")
    del big, small, inputs
    if cclz.torch.shared_memory_stats()["live_blocks"] != live:
        raise AssertionError(f"use_shared_memory: a freed tensor's block was not returned "
                             f"({cclz.torch.shared_memory_stats()})")
    # A forked child (a DataLoader worker) must not hand out the shared
    # arenas' blocks, which its parent hands out too.
    pid = os.fork()
    if pid == 0:
        t = torch.ones(1 << 18)
        os._exit(0 if cclz.torch.shared_memory_stats()["live_blocks"] == live and t.sum() == (1 << 18) else 1)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise AssertionError("use_shared_memory: a forked child allocated from the shared arenas")

    # Two 512x512 layers: 1 MiB weights, buckets of about 1 MiB.
    def wide(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512),
                                   torch.nn.Tanh(), torch.nn.Linear(512, 4))

    def fit(model, steps):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(2000 + rank)
        for _ in range(steps):
            x = torch.randn(32, 16, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), x[:, :4])
            opt.zero_grad()
            loss.backward()
            opt.step()

    before = cclz.torch.direct_calls()
    m_cclz = DDP(wide(0), bucket_cap_mb=1)
    fit(m_cclz, 5)
    direct = cclz.torch.direct_calls() - before
    m_gloo = DDP(wide(0), process_group=ck.gloo, bucket_cap_mb=1)
    fit(m_gloo, 5)
    for (name, a), b in zip(m_cclz.module.named_parameters(), m_gloo.module.parameters()):
        rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
        if rel > 1e-5:
            raise AssertionError(f"rank {rank}: DDP on pool tensors: {name} differs from gloo's by {rel:.3g}")
    if n > 1 and direct < 5:
        raise AssertionError(f"rank {rank}: DDP on pool tensors: {direct} bucket all-reduces went direct in 5 steps")
    return direct


def check_hook(ck):
    import cclz.torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    try:
        cclz.torch.hook("nosuch:rank=4")
        raise AssertionError("a bad spec did not raise")
    except ValueError as e:
        if "nosuch:rank=4" not in str(e):
            raise AssertionError(f"the error does not name the spec: {e}")
    try:
        cclz.torch.hook("powersgd:rank=-3")
        raise AssertionError("powersgd:rank=-3 did not raise")
    except ValueError as e:
        if "powersgd:rank=-3" not in str(e):
            raise AssertionError(f"the error does not name the spec: {e}")
    from cclz import _C
    pg = dist.distributed_c10d._get_default_group()
    try:
        _C.compressed_allreduce_async(ck.gloo, torch.ones(4), "powersgd:rank=4", 0, torch.futures.Future())
        raise AssertionError("the hook's all-reduce on a gloo group did not raise")
    except ValueError as e:
        if "not a cclz one" not in str(e):
            raise AssertionError(f"unexpected message for a gloo group: {e}")
    # A dense collective issued while a hook all-reduce is queued runs after
    # it on every rank (else the ranks' Comm orders would differ).
    g = rank_input(ck.rank, 4096, torch.float32)
    fut = torch.futures.Future()
    _C.compressed_allreduce_async(pg, g, "powersgd:rank=2", 1000, fut)
    x = rank_input(ck.rank, 7, torch.float32)
    dist.all_reduce(x)
    if not fut.done():
        raise AssertionError("a collective was issued before the queued hook all-reduce finished")
    ck.same("all_reduce after a queued hook", x,
            reference_reduce([rank_input(r, 7, torch.float32) for r in range(ck.world)], "sum", ck.world))
    if fut.wait().data_ptr() != g.data_ptr():
        raise AssertionError("the hook's future does not hold the bucket")

    model = DDP(make_model(1), bucket_cap_mb=0.001)
    model.register_comm_hook(None, cclz.torch.hook("powersgd:rank=4"))
    losses = train(model, 60, ck.rank, lr=0.05)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if not last < 0.5 * first:
        raise AssertionError(f"rank {ck.rank}: powersgd hook: loss {first:.4f} -> {last:.4f}, did not fall by half")
    # Parameters stay identical across ranks (every rank applies the same mean).
    flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(ck.world)]
    dist.all_gather(gathered, flat)
    for r, other in enumerate(gathered):
        ck.same(f"powersgd parameters of rank {r}", other, flat)
    return first, last


def worker(rank, world, port, errors):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        import cclz.torch  # noqa: F401  registers the backend
        dist.init_process_group("cclz", rank=rank, world_size=world)
        gloo = dist.new_group(backend="gloo")
        ck = Checker(rank, world, gloo)
        check_collectives(ck)
        check_shared(ck)
        worst = check_ddp(ck)
        first, last = check_hook(ck)
        pool_direct = check_shared_allocator(ck)
        # A cclz error (a peer that is not in the group) comes out of wait()
        # as a RuntimeError with cclz's message. Last: it may end the group.
        try:
            dist.distributed_c10d._get_default_group().send([torch.ones(3)], world + 5, 0).wait()
            raise AssertionError("send to a rank outside the group did not raise")
        except RuntimeError as e:
            if "cclz backend: send:" not in str(e) or "not a rank of this communicator" not in str(e):
                raise AssertionError(f"unexpected message for a bad peer: {e}")
        if rank == 0:
            print(f"{world} ranks: collectives ok ({ck.compared_gloo} compared with gloo, "
                  f"{ck.compared_ref} with the local reference where gloo lacks the dtype/op); "
                  f"DDP 20 steps: max relative difference from gloo {worst:.3g}; "
                  f"powersgd:rank=4 hook: loss {first:.4f} -> {last:.4f}; bad spec raises; "
                  f"shared tensors ok, {cclz.torch.direct_calls()} calls went direct; use_shared_memory: "
                  f"DDP as gloo's, {pool_direct} bucket all-reduces direct in 5 steps", flush=True)
        dist.barrier(group=gloo)
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        raise


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    try:
        mp.start_processes(worker, args=(world, free_port(), errors), nprocs=world, start_method="spawn")
    except Exception as e:
        while not errors.empty():
            print(errors.get(), file=sys.stderr)
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
