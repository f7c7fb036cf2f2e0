"""torch.distributed backend "cclz" and the compressed DDP communication hook.

    import cclz.torch
    torch.distributed.init_process_group(backend="cclz")
    ddp.register_comm_hook(None, cclz.torch.hook("powersgd:rank=4"))

Importing this module registers the backend. See docs/torch.md.
"""
import operator

import torch
import torch.distributed as dist

from cclz import _C

__all__ = ["hook", "empty", "direct_calls", "BACKEND"]

BACKEND = "cclz"


def _register():
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}) or hasattr(dist.Backend, BACKEND.upper()):
        return  # already registered (the module was reloaded)
    if int(torch.__version__.split(".")[0]) >= 2:
        # 2.x wraps backends per device in a ProcessGroup; cclz serves CPU tensors.
        dist.Backend.register_backend(BACKEND, _C.create_process_group, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, _C.create_process_group)


_register()


def hook(spec):
    """A DDP communication hook that all-reduces each gradient bucket with
    cclz's compressed all-reduce under the compressor `spec` (e.g.
    "powersgd:rank=4", "ef+topk:ratio=0.01"), averaged over ranks. The
    compressor state (error-feedback residual, PowerSGD's Q) is kept in C++
    per bucket index. Register it with `ddp.register_comm_hook(pg, hook(spec))`,
    `pg` a cclz process group or None for the default group.

    Raises ValueError naming the spec when it is not a valid compressor spec."""
    if not isinstance(spec, str):
        raise TypeError(f"cclz.torch.hook: spec must be a str, got {type(spec).__name__}")
    _C.check_spec(spec)

    def cclz_compressed_hook(state, bucket):
        pg = state if state is not None else dist.distributed_c10d._get_default_group()
        # Runs on the group's hook thread, so backward goes on meanwhile.
        fut = torch.futures.Future()
        _C.compressed_allreduce_async(pg, bucket.buffer(), spec, bucket.index(), fut)
        return fut

    cclz_compressed_hook.spec = spec
    return cclz_compressed_hook


def empty(*size, dtype=torch.float32):
    """A CPU tensor of `size` (ints, or one tuple, list or torch.Size) and
    `dtype` whose memory the node's other ranks can map (cclz::mem_alloc):
    zeroed, page-aligned, freed with the tensor's storage. A collective whose
    tensors on every rank of a node are such memory (views into it included)
    reads and writes them in place, with no staging copy (from 32-128 KB,
    depending on the collective): a 1 MB all-reduce on 2 ranks took a
    quarter to a third of a heap tensor's time here (docs/torch.md). Use it
    for the buffers a loop reduces again and again (flat gradient buffers,
    ZeRO shards).

    Raises ValueError for a negative dimension, TypeError for a dtype that
    is not a torch.dtype, RuntimeError when the memory cannot be had."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return _C.empty([operator.index(s) for s in size], dtype)


def direct_calls(group=None):
    """How many collectives of this rank on `group` (a cclz process group,
    None for the default one) read and wrote its node's peers' tensors in
    place: the direct path that tensors from cclz.torch.empty take."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return _C.direct_calls(pg)
