"""xla_spawn for Python: the replica's place in its job and the job's shared-memory collectives.

Run a script with the launcher, one process per replica::

    xla-spawn -n 4 -- python3 train.py

and in the script (or start the job from Python, as torch_xla's ``xmp.spawn``:
``xla_spawn.spawn(fn, args=(...), nprocs=4)`` runs ``fn(ordinal, *args)`` in each replica)::

    import numpy as np
    import xla_spawn as xs

    grads = np.ones(1024, np.float32)
    xs.all_reduce(grads, xs.REDUCE_MEAN)        # in place, on every replica
    if xs.is_master_ordinal():
        print("world size", xs.world_size())

Collectives work in place on any C-contiguous buffer (NumPy arrays, bytearray, memoryview,
``torch.Tensor.numpy()`` views) and copy nothing extra when the buffer comes from
``alloc_buffer``. Every replica must make the same calls in the same order with the same sizes;
a mismatch, a failed peer or a timeout raises ``PeerFailure`` or ``Timeout`` (both ``Error``, a
``RuntimeError``). A script started without the launcher is ordinal 0 of 1.

When PyTorch is installed, importing this module also registers the torch.distributed backend
``"xla_spawn"``: ``dist.init_process_group("xla_spawn")`` then runs DDP's collectives over
shared memory (set ``XLA_SPAWN_NO_TORCH=1`` to skip importing torch).
"""

import importlib.util
import os
import pickle

from xla_spawn._core import (
    Error,
    InternalError,
    InvalidArgument,
    IoError,
    PeerFailure,
    ReplicaContext,
    Timeout,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    context,
    init,
    reduce_scatter,
    rendezvous,
    shutdown,
)
from xla_spawn import _core
from xla_spawn._spawn import JobFailed, spawn

__all__ = [
    "Error", "InternalError", "InvalidArgument", "IoError", "JobFailed", "PeerFailure",
    "ReplicaContext", "Timeout", "REDUCE_SUM", "REDUCE_MEAN", "REDUCE_MAX", "REDUCE_MIN", "alloc_buffer",
    "all_gather", "all_reduce", "barrier", "broadcast", "context", "get_local_ordinal",
    "get_ordinal", "init", "is_master_ordinal", "local_world_size", "mesh_reduce",
    "reduce_scatter", "rendezvous", "shutdown", "spawn", "world_size",
]

# torch_xla.core.xla_model's names for the reduce ops.
REDUCE_SUM = "sum"
REDUCE_MEAN = "mean"
REDUCE_MAX = "max"
REDUCE_MIN = "min"


def get_ordinal():
    """This replica's global ordinal, 0..world_size()-1."""
    return context().ordinal


def get_local_ordinal():
    """This replica's ordinal on its host."""
    return context().local_ordinal


def world_size():
    """Replicas in the job."""
    return context().world_size


def local_world_size():
    """Replicas on this host."""
    return context().local_world_size


def is_master_ordinal(local=True):
    """Whether this is ordinal 0 of its host (local=True, torch_xla's default) or of the job."""
    return context().is_master(local=local)


def alloc_buffer(shape, dtype="float32"):
    """A NumPy array in the job's shared-memory arena (heap when the arena is full).

    Collectives on it reduce in place without staging copies. It stays valid until
    ``shutdown()``, which refuses while any such array is alive. NumPy has no bfloat16:
    ``dtype="bf16"`` gives uint16 elements holding bf16 bits, for the collectives'
    ``dtype="bf16"``.
    """
    import numpy as np

    if isinstance(shape, int):
        shape = (shape,)
    if isinstance(dtype, str) and dtype in ("bf16", "bfloat16"):
        dtype = np.uint16
    return _core.alloc_buffer(list(shape), np.dtype(dtype))


def mesh_reduce(tag, data, reduce_fn):
    """torch_xla's mesh_reduce: every replica gets ``reduce_fn([data of ordinal 0, 1, ...])``.

    ``data`` is any picklable value; ``tag`` must be the same on every replica.
    """
    payloads = rendezvous(tag, pickle.dumps(data))
    return reduce_fn([pickle.loads(p) for p in payloads])


def _register_torch_backend():
    if os.environ.get("XLA_SPAWN_NO_TORCH") == "1" or importlib.util.find_spec("torch") is None:
        return
    try:
        from xla_spawn import _c10d
    except ImportError:  # built without PyTorch's headers: the NumPy API still works
        return
    import torch.distributed as dist

    if "XLA_SPAWN" not in dist.Backend._plugins:
        dist.Backend.register_backend("xla_spawn", _c10d.create)


_register_torch_backend()
