"""Run by test_collectives.py under `xla-spawn -n N`: every collective of the xla_spawn module on
NumPy arrays, every dtype and op, at awkward element counts, with data derived from (ordinal,
index) so a misplaced element is caught. Each result is checked against NumPy's own reduction
of every ordinal's data; those every replica should share (all_reduce, all_gather) are hashed,
and the last line is "digest <sha256>", which must be the same on every replica
(bit-identical results).

Usage: replica_collectives.py
Exits 1 on the first wrong result, naming it.
"""

import hashlib
import sys

import numpy as np

import xla_spawn as xs

COUNTS = [0, 1, 7, 64, 1000, 65537]
DTYPES = [np.float32, np.float64, np.int32, np.int64]
OPS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def data_of(ordinal, n, dtype):
    """Small exact values (sums of up to 8 of them are exact in float32)."""
    i = np.arange(n, dtype=np.int64)
    return ((i * 7 + ordinal * 13) % 97 - 48).astype(dtype)


def expected_reduction(op, n, dtype, world):
    stacked = np.stack([data_of(k, n, dtype) for k in range(world)]).astype(np.float64)
    want = OPS[op](stacked, axis=0)
    if op == "mean" and np.issubdtype(dtype, np.integer):
        return None  # integer mean rounds as the C++ side documents; checked for agreement only
    return want.astype(dtype)


def fail(what):
    print(f"ordinal {xs.get_ordinal()}: {what}", flush=True)
    sys.exit(1)


def main():
    me, world = xs.get_ordinal(), xs.world_size()
    digest = hashlib.sha256()
    for dtype in DTYPES:
        for n in COUNTS:
            for op in OPS:
                for use_arena in (False, True):
                    data = xs.alloc_buffer(n, dtype) if use_arena else np.empty(n, dtype)
                    data[:] = data_of(me, n, dtype)
                    xs.all_reduce(data, op)
                    want = expected_reduction(op, n, dtype, world)
                    if want is not None and not np.array_equal(data, want):
                        fail(f"all_reduce {op} {np.dtype(dtype).name} n={n} arena={use_arena}")
                    digest.update(data.tobytes())
                    del data
            out = np.empty(world * n, dtype)
            xs.all_gather(data_of(me, n, dtype), out)
            if not np.array_equal(out, np.concatenate([data_of(k, n, dtype) for k in range(world)])):
                fail(f"all_gather {np.dtype(dtype).name} n={n}")
            digest.update(out.tobytes())
            for op in ("sum", "max", "min"):
                chunk = np.empty(n, dtype)
                whole = np.concatenate([data_of(me, n, dtype) + j for j in range(world)]).astype(dtype)
                xs.reduce_scatter(whole, chunk, op)
                everyone = np.stack([data_of(k, n, dtype) + me for k in range(world)])
                if not np.array_equal(chunk, OPS[op](everyone.astype(np.float64), axis=0).astype(dtype)):
                    fail(f"reduce_scatter {op} {np.dtype(dtype).name} n={n}")
            for root in {0, world - 1}:
                data = data_of(me, n, dtype)
                xs.broadcast(data, root)
                if not np.array_equal(data, data_of(root, n, dtype)):
                    fail(f"broadcast root {root} {np.dtype(dtype).name} n={n}")
    # bf16 travels as 2-byte elements: 1.0 is 0x3f80; the sum over the world is exact.
    bf16 = np.full(33, 0x3F80, np.uint16)
    xs.all_reduce(bf16, "sum", dtype="bf16")
    want = (np.array([float(world)], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if not np.all(bf16 == want[0]):
        fail(f"bf16 all_reduce sum: {bf16[0]:#x}, want {want[0]:#x}")
    digest.update(bf16.tobytes())
    # Bytes of any element type move through broadcast and all_gather.
    raw = bytearray(f"ordinal {me:04d}".encode())
    gathered = bytearray(len(raw) * world)
    xs.all_gather(raw, gathered)
    if bytes(gathered) != b"".join(f"ordinal {k:04d}".encode() for k in range(world)):
        fail(f"all_gather of bytes: {bytes(gathered)!r}")
    payloads = xs.rendezvous("replica_collectives", f"hello from {me}".encode())
    if payloads != [f"hello from {k}".encode() for k in range(world)]:
        fail(f"rendezvous: {payloads!r}")
    total = xs.mesh_reduce("ordinals", me, sum)
    if total != world * (world - 1) // 2:
        fail(f"mesh_reduce: {total}")
    xs.barrier()
    xs.shutdown()
    print(f"digest {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
