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

__all__ = ["hook", "empty", "share_memory_", "use_shared_memory", "shared_memory_stats", "direct_calls", "BACKEND"]

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


def share_memory_(tensor):
    """Moves the storage of an existing CPU tensor into memory that the
    node's other ranks can map (cclz::mem_alloc), with the same bytes, and
    returns the tensor: what cclz.torch.empty gives a new tensor, for one
    that exists already (parameters, a flat gradient buffer built before
    use_shared_memory). Every view of the storage follows it; the old memory
    is freed. A storage in such memory already (cclz.torch.empty, the
    use_shared_memory pool) stays where it is. As with torch's own
    Tensor.share_memory_, memory the tensor shared with something outside
    torch (a NumPy array from torch.from_numpy) is no longer shared, and no
    other thread may use the tensor during the call.

    Raises TypeError for anything but a torch.Tensor, ValueError for a
    tensor that is not on the CPU, RuntimeError when the memory cannot be
    had (the tensor is unchanged then)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"cclz.torch.share_memory_: expected a torch.Tensor, got {type(tensor).__name__}")
    return _C.share_memory_(tensor)


def use_shared_memory(min_bytes=1 << 20):
    """From this call on, torch allocates CPU tensors of at least `min_bytes`
    in shared memory that the node's other ranks can map: tensors torch makes
    itself (DDP's gradient buckets, outputs, parameters created afterwards)
    then take the direct path that cclz.torch.empty gives one tensor. Call it
    before building the model and DDP; tensors allocated earlier stay where
    they are. Smaller tensors, and any when shared memory runs out, come from
    the allocator torch had. Calling it again changes `min_bytes`.

    The blocks come from 32 MiB arenas that are kept for reuse, never given
    back to the system (peak use stays reserved); their pages are shared with
    processes forked afterwards, not copied on write, and such a child (a
    DataLoader worker) allocates its own tensors from the old allocator (see
    docs/torch.md)."""
    min_bytes = operator.index(min_bytes)
    if min_bytes < 1:
        raise ValueError(f"cclz.torch.use_shared_memory: min_bytes must be at least 1, got {min_bytes}")
    _C.use_shared_memory(min_bytes)


def shared_memory_stats():
    """The use_shared_memory allocator's state: a dict with `arenas`,
    `arena_bytes` (mapped by them), `live_bytes` and `live_blocks` (handed out
    and not yet freed); zeros before use_shared_memory."""
    return _C.shared_memory_stats()


def direct_calls(group=None):
    """How many collectives of this rank on `group` (a cclz process group,
    None for the default one) read and wrote its node's peers' tensors in
    place: the direct path that tensors from cclz.torch.empty take."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return _C.direct_calls(pg)
