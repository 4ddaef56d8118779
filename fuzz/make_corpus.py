#!/usr/bin/env python3
"""Writes the fixed seed corpus for the fuzz targets: fuzz/corpus/{idx,checkpoint}/.

Files named ok-* must be accepted, bad-* rejected with a clear error (the CTest replay in
tests/replica/fuzz_corpus_test.cpp checks both). The checkpoint writer here is a second,
independent implementation of the layout in replica/detail/checkpoint_format.h, so the
replay also checks that the documented format is the one the C++ code reads.
Usage: fuzz/make_corpus.py   (rewrites the corpus in place; deterministic)
"""
import gzip
import os
import struct
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def idx(type_byte, dims, data):
    return bytes([0, 0, type_byte, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


def gz(raw):
    return gzip.compress(raw, compresslevel=9, mtime=0)


DTYPES = {"f32": (0, 4), "f64": (1, 8), "bf16": (2, 2), "i32": (3, 4), "i64": (4, 8), "bool": (5, 1)}


def checkpoint(tensors, metadata, version=1):
    """tensors: [(name, dtype, shape, bytes)], metadata: {key: int | str}."""
    index = b""
    for name, dtype, shape, _ in tensors:
        index += struct.pack("<I", len(name)) + name.encode()
        index += struct.pack("<BB", DTYPES[dtype][0], len(shape))
        index += b"".join(struct.pack("<q", d) for d in shape)
        index += b"OFFSET__" + b"SIZE____"  # patched below
    for key, value in sorted(metadata.items()):
        index += struct.pack("<I", len(key)) + key.encode()
        if isinstance(value, int):
            index += struct.pack("<Bq", 1, value)
        else:
            index += struct.pack("<BI", 2, len(value)) + value.encode()
    index_end = 40 + len(index)
    at, offsets = index_end, []
    for _, _, _, data in tensors:
        at = (at + 63) // 64 * 64
        offsets.append(at)
        at += len(data)
    file_size = at + 4
    for off, (_, _, _, data) in zip(offsets, tensors):
        index = index.replace(b"OFFSET__" + b"SIZE____", struct.pack("<QQ", off, len(data)), 1)
    body = b"XSCKPT\r\n" + struct.pack("<IIQQII", version, 0, file_size, index_end, len(tensors),
                                       len(metadata)) + index
    for off, (_, _, _, data) in zip(offsets, tensors):
        body += b"\0" * (off - len(body)) + data
    return body + struct.pack("<I", zlib.crc32(body))


def pattern(n, seed):
    return bytes((seed + 31 * i) & 0xFF for i in range(n))


def idx_corpus():
    labels = bytes(i % 10 for i in range(20))
    images = pattern(3 * 28 * 28, 7)
    ok = {
        "ok-labels.idx": idx(0x08, [20], labels),
        "ok-labels.idx.gz": gz(idx(0x08, [20], labels)),
        "ok-images.idx.gz": gz(idx(0x08, [3, 28, 28], images)),
        "ok-i32.idx": idx(0x0C, [2, 2], pattern(16, 1)),
        "ok-f64.idx": idx(0x0E, [1], struct.pack(">d", 1.5)),
        "ok-empty-dim.idx": idx(0x08, [0, 28, 28], b""),
        "ok-two-members.gz": gz(idx(0x08, [20], labels)[:10]) + gz(idx(0x08, [20], labels)[10:]),
    }
    bad = {
        "bad-empty": b"",
        "bad-magic.idx": b"\x01" + idx(0x08, [20], labels)[1:],
        "bad-type.idx": idx(0x07, [20], labels),
        "bad-rank0.idx": idx(0x08, [], b"\x01"),
        "bad-truncated.idx": idx(0x08, [3, 28, 28], images)[:-5],
        "bad-trailing.idx": idx(0x08, [20], labels) + b"\0",
        "bad-truncated.gz": gz(idx(0x08, [3, 28, 28], images))[:200],
        "bad-huge-dims.idx": idx(0x0E, [0xFFFFFFFF] * 4, b""),
        "bad-bomb-behind-header.gz": gz(idx(0x08, [16], b"\0" * (32 << 20))),
    }
    return {**ok, **bad}


def checkpoint_corpus():
    w = ("fc1.weight", "f32", [4, 3], pattern(48, 1))
    b = ("fc1.bias", "f32", [4], pattern(16, 2))
    meta = {"epoch": 3, "step": 120, "model": "mlp"}
    every = [(f"t.{name}", name, [2, 3], pattern(6 * size, code)) for name, (code, size) in DTYPES.items()]
    good = checkpoint([w, b], meta)
    ok = {
        "ok-mlp.xsckpt": good,
        "ok-every-dtype.xsckpt": checkpoint(every + [("scalar", "f64", [], pattern(8, 9)),
                                                     ("empty", "i64", [0, 5], b"")], {}),
        "ok-no-tensors.xsckpt": checkpoint([], {"seed": -1}),
    }
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x40
    bad = {
        "bad-truncated.xsckpt": good[:-10],
        "bad-flipped.xsckpt": bytes(flipped),
        "bad-version.xsckpt": checkpoint([w, b], meta, version=2),
        "bad-magic.xsckpt": b"NOTCKPT!" + good[8:],
        "bad-tiny.xsckpt": good[:20],
    }
    return {**ok, **bad}


def main():
    for sub, files in (("idx", idx_corpus()), ("checkpoint", checkpoint_corpus())):
        d = os.path.join(ROOT, sub)
        os.makedirs(d, exist_ok=True)
        for name in os.listdir(d):
            os.remove(os.path.join(d, name))
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
