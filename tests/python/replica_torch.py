"""Run by test_torch_backend.py under `xla-spawn -n N`: torch.distributed's collectives through
the "xla_spawn" backend on CPU tensors of every supported dtype and op, contiguous or not,
checked against the reduction computed locally from every rank's data (derived from rank and
index); then the operations the backend lacks, each of which must raise an error naming it.
Prints "digest <sha256>" of the results every rank should share, last.

Usage: replica_torch.py
"""

import hashlib
import sys

import torch
import torch.distributed as dist

import xla_spawn  # noqa: F401 (registers the backend)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]
OPS = {
    dist.ReduceOp.SUM: lambda s: s.sum(0),
    dist.ReduceOp.MAX: lambda s: s.max(0).values,
    dist.ReduceOp.MIN: lambda s: s.min(0).values,
    dist.ReduceOp.AVG: lambda s: s.mean(0),
}


def data_of(rank, n, dtype):
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 7 + rank * 13) % 97 - 48).to(dtype)


def fail(what):
    print(f"rank {dist.get_rank()}: {what}", flush=True)
    sys.exit(1)


def expect_error(what, call, *needles):
    try:
        call()
    except RuntimeError as e:
        if not all(n in str(e) for n in needles):
            fail(f"{what}: error {str(e)!r} does not name {needles}")
        return
    fail(f"{what}: no error")


def main():
    dist.init_process_group("xla_spawn")
    rank, world = dist.get_rank(), dist.get_world_size()
    if dist.get_backend() != "xla_spawn":
        fail(f"backend {dist.get_backend()}")
    digest = hashlib.sha256()
    for dtype in DTYPES:
        for n in (0, 1, 7, 1000):
            everyone = torch.stack([data_of(k, n, dtype) for k in range(world)]).double()
            for op, reduce in OPS.items():
                if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                    continue
                t = data_of(rank, n, dtype)
                dist.all_reduce(t, op)
                if not torch.equal(t, reduce(everyone).to(dtype)):
                    fail(f"all_reduce {op} {dtype} n={n}")
                digest.update(t.view(torch.uint8).numpy().tobytes() if n else b"")
            # Non-contiguous: every other element of a 2n tensor.
            t = torch.zeros(2 * n, dtype=dtype)
            t[::2] = data_of(rank, n, dtype)
            dist.all_reduce(t[::2])
            if not torch.equal(t[::2], everyone.sum(0).to(dtype)) or t[1::2].any():
                fail(f"all_reduce of a strided view {dtype} n={n}")
            gathered = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(gathered, data_of(rank, n, dtype))
            flat = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, data_of(rank, n, dtype))
            for k in range(world):
                if not torch.equal(gathered[k], data_of(k, n, dtype)) or \
                        not torch.equal(flat[k * n:(k + 1) * n], data_of(k, n, dtype)):
                    fail(f"all_gather {dtype} n={n}")
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, [data_of(rank, n, dtype) + j for j in range(world)])
            want = torch.stack([data_of(k, n, dtype) + rank for k in range(world)]).double().sum(0)
            if not torch.equal(out, want.to(dtype)):
                fail(f"reduce_scatter {dtype} n={n}")
            out_base = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(
                out_base, torch.cat([data_of(rank, n, dtype) + j for j in range(world)]))
            if not torch.equal(out_base, out):
                fail(f"reduce_scatter_tensor {dtype} n={n}")
            t = data_of(rank, n, dtype)
            dist.broadcast(t, src=world - 1)
            if not torch.equal(t, data_of(world - 1, n, dtype)):
                fail(f"broadcast {dtype} n={n}")
    # Other dtypes move as bytes: all_gather_object pickles into uint8 tensors.
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    if objects != [{"rank": k} for k in range(world)]:
        fail(f"all_gather_object: {objects}")
    half = torch.full((5,), float(rank), dtype=torch.float16)
    dist.broadcast(half, src=0)
    if not torch.equal(half, torch.zeros(5, dtype=torch.float16)):
        fail(f"broadcast of float16: {half}")
    dist.barrier()
    t = torch.ones(4)
    expect_error("reduce", lambda: dist.reduce(t, dst=0), "does not support reduce")
    expect_error("PRODUCT", lambda: dist.all_reduce(t, dist.ReduceOp.PRODUCT),
                 "does not support reduce op")
    expect_error("float16", lambda: dist.all_reduce(torch.ones(4, dtype=torch.float16)),
                 "does not support dtype", "Half")
    expect_error("sparse", lambda: dist.all_reduce(torch.ones(4).to_sparse()), "sparse")
    work = dist.all_reduce(torch.full((3,), float(rank)), async_op=True)
    work.wait()
    got = work.result()
    if len(got) != 1 or not torch.equal(got[0], torch.full((3,), float(sum(range(world))))):
        fail(f"Work.result(): {got}")
    # In place: the input is this rank's chunk of the output.
    g = torch.zeros(4 * world)
    g[rank * 4:(rank + 1) * 4] = rank + 1
    dist.all_gather_into_tensor(g, g[rank * 4:(rank + 1) * 4])
    if not torch.equal(g, torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(4)):
        fail(f"in-place all_gather_into_tensor: {g}")
    if world > 1:
        # Any other overlap is refused (it gave wrong data), on every rank alike here.
        other = (rank + 1) % world
        expect_error("overlapping all_gather_into_tensor",
                     lambda: dist.all_gather_into_tensor(g, g[other * 4:(other + 1) * 4]), "overlap")
        expect_error("gather", lambda: dist.gather(t, [torch.ones(4)] * world if rank == 0 else None),
                     "does not support gather")
    dist.destroy_process_group()
    print(f"digest {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
