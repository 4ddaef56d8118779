#!/usr/bin/env python3
"""Writes the fixed seed corpus for the fuzz targets:
fuzz/corpus/{idx,checkpoint,spawn_options,replica_env,rendezvous}/.

Files named ok-* must be accepted, bad-* rejected with a clear error (the CTest replay in
tests/replica/fuzz_corpus_test.cpp and tests/fuzz/cli_corpus_test.cpp check both). The checkpoint writer here is a second,
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


def nul_joined(*pieces):
    """argv pieces or environment values, as the command-line targets read them."""
    return "\0".join(pieces).encode()


def spawn_options_corpus():
    ok = {
        "ok-minimal": nul_joined("--", "true"),
        "ok-help": nul_joined("--help"),
        "ok-short-n": nul_joined("-n", "4", "--", "train", "--lr", "0.1"),
        "ok-np-mpirun": nul_joined("-np", "2", "hostname"),
        "ok-every-flag": nul_joined("--nprocs=8", "--no-prefix", "--timestamp", "--log-dir", "/tmp/l",
                                    "--show-ordinals", "0,2-3", "--grace-period", "0.5", "--timeout",
                                    "3600", "--bind-cores", "--max-restarts", "3", "--", "a", "-b"),
        "ok-command-without-dashes": nul_joined("--no-bind-cores", "-n", "1", "echo", "--nprocs", "9"),
        "ok-percent-in-value": nul_joined("--log-dir=/tmp/50%", "--", "x", "--%canonical_option%"),
    }
    bad = {
        "bad-empty": b"",
        "bad-no-command": nul_joined("-n", "4"),
        "bad-negative-n": nul_joined("-n", "-1", "--", "x"),
        "bad-huge-n": nul_joined("--nprocs", "1025", "--", "x"),
        "bad-n-not-number": nul_joined("--nprocs", "4x", "--", "x"),
        "bad-unknown-flag": nul_joined("--frobnicate", "--", "x"),
        "bad-timeout-nan": nul_joined("--timeout", "nan", "--", "x"),
        "bad-timeout-huge": nul_joined("--timeout", "1e308", "--", "x"),
        "bad-grace-negative": nul_joined("--grace-period", "-3", "--", "x"),
        "bad-ordinals-outside": nul_joined("-n", "2", "--show-ordinals", "0-5", "--", "x"),
        "bad-ordinals-reversed": nul_joined("-n", "4", "--show-ordinals", "3-1", "--", "x"),
        "bad-contradiction": nul_joined("--bind-cores", "--no-bind-cores", "--", "x"),
        "bad-restarts-huge": nul_joined("--max-restarts", "1001", "--", "x"),
        "bad-empty-log-dir": nul_joined("--log-dir=", "--", "x"),
        "bad-missing-value": nul_joined("--timeout"),
        # Boost.Program_options 1.74 looped forever formatting these errors (fuzzer finding).
        "bad-placeholder-option": nul_joined("--%canonical_option%3", "--", "x"),
        "bad-placeholder-unknown-value": nul_joined("--foo=%canonical_option%", "--", "x"),
        "bad-placeholder-as-value": nul_joined("--timeout", "--%canonical_option%", "--", "x"),
    }
    return {**ok, **bad}


# Order of fuzz/replica_env_target.h's kEnvVars.
ENV_VARS = ["XLA_SPAWN_WORLD_SIZE", "XLA_SPAWN_ORDINAL", "XLA_SPAWN_LOCAL_WORLD_SIZE",
            "XLA_SPAWN_LOCAL_ORDINAL", "XLA_SPAWN_ATTEMPT", "XLA_SPAWN_JOB_ID", "XLA_SPAWN_SEGMENT",
            "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "XLA_SPAWN_NODE",
            "XLA_SPAWN_NNODES", "XLA_SPAWN_NODE_SIZES", "XLA_SPAWN_MASTER_ADDR",
            "XLA_SPAWN_MASTER_PORT", "XLA_SPAWN_HOST_ADDR"]


def env(**values):
    """Values by variable name (unnamed: unset), NUL-joined in ENV_VARS order."""
    return nul_joined(*(values.get(name, "") for name in ENV_VARS))


def replica_env_corpus():
    full = dict(XLA_SPAWN_WORLD_SIZE="8", XLA_SPAWN_ORDINAL="3", XLA_SPAWN_LOCAL_WORLD_SIZE="8",
                XLA_SPAWN_LOCAL_ORDINAL="3", XLA_SPAWN_ATTEMPT="2", XLA_SPAWN_JOB_ID="xs-1-ab",
                XLA_SPAWN_SEGMENT="/xs-1-ab", WORLD_SIZE="8", RANK="3", LOCAL_WORLD_SIZE="8",
                LOCAL_RANK="3")
    # Ordinal 3 = local ordinal 1 of node 1 in a job of 2 nodes x 2.
    two_nodes = dict(XLA_SPAWN_WORLD_SIZE="4", XLA_SPAWN_ORDINAL="3", XLA_SPAWN_LOCAL_WORLD_SIZE="2",
                     XLA_SPAWN_LOCAL_ORDINAL="1", XLA_SPAWN_NODE="1", XLA_SPAWN_NNODES="2",
                     XLA_SPAWN_NODE_SIZES="2,2", XLA_SPAWN_MASTER_ADDR="198.18.0.1",
                     XLA_SPAWN_MASTER_PORT="29500", XLA_SPAWN_HOST_ADDR="198.18.0.2")
    ok = {
        "ok-standalone": env(),
        "ok-launcher": env(**full),
        "ok-torchrun-only": env(WORLD_SIZE="4", RANK="0"),
        "ok-max-world": env(XLA_SPAWN_WORLD_SIZE="1024", XLA_SPAWN_ORDINAL="1023"),
        "ok-attempt-bool-job": env(XLA_SPAWN_WORLD_SIZE="2", XLA_SPAWN_ORDINAL="1",
                                   XLA_SPAWN_JOB_ID="TRUE"),
        "ok-second-node": env(**{**two_nodes}),
    }
    bad = {
        "bad-ordinal-only": env(XLA_SPAWN_ORDINAL="0"),
        "bad-ordinal-too-big": env(XLA_SPAWN_WORLD_SIZE="4", XLA_SPAWN_ORDINAL="4"),
        "bad-world-zero": env(XLA_SPAWN_WORLD_SIZE="0", XLA_SPAWN_ORDINAL="0"),
        "bad-world-huge": env(XLA_SPAWN_WORLD_SIZE="1025", XLA_SPAWN_ORDINAL="0"),
        "bad-not-a-number": env(XLA_SPAWN_WORLD_SIZE="4 ", XLA_SPAWN_ORDINAL="0"),
        "bad-plus-sign": env(XLA_SPAWN_WORLD_SIZE="+4", XLA_SPAWN_ORDINAL="0"),
        "bad-overflow": env(XLA_SPAWN_WORLD_SIZE="99999999999999999999", XLA_SPAWN_ORDINAL="0"),
        "bad-torch-disagrees": env(**{**full, "RANK": "2"}),
        "bad-local-outside": env(XLA_SPAWN_WORLD_SIZE="4", XLA_SPAWN_ORDINAL="1",
                                 XLA_SPAWN_LOCAL_WORLD_SIZE="2", XLA_SPAWN_LOCAL_ORDINAL="2"),
        "bad-local-world-above-world": env(XLA_SPAWN_WORLD_SIZE="2", XLA_SPAWN_ORDINAL="1",
                                           XLA_SPAWN_LOCAL_WORLD_SIZE="3"),
        "bad-attempt-negative": env(XLA_SPAWN_WORLD_SIZE="2", XLA_SPAWN_ORDINAL="1",
                                    XLA_SPAWN_ATTEMPT="-1"),
        "bad-node-sizes-sum": env(**{**two_nodes, "XLA_SPAWN_NODE_SIZES": "2,3"}),
        "bad-node-sizes-place": env(**{**two_nodes, "XLA_SPAWN_NODE_SIZES": "1,3",
                                       "XLA_SPAWN_LOCAL_WORLD_SIZE": "3"}),
        "bad-node-outside": env(**{**two_nodes, "XLA_SPAWN_NODE": "2"}),
        "bad-node-sizes-text": env(**{**two_nodes, "XLA_SPAWN_NODE_SIZES": "2,,2"}),
        "bad-no-master": env(**{**two_nodes, "XLA_SPAWN_MASTER_ADDR": ""}),
        "bad-master-port": env(**{**two_nodes, "XLA_SPAWN_MASTER_PORT": "65536"}),
    }
    return {**ok, **bad}


# The rendezvous wire format (cluster/wire.h), written a second time: the type byte is the
# message's position in cluster::Message plus one; integers little-endian; strings and
# byte arrays as u32 length + bytes; lists as u32 count + items.
RDZV_TYPES = ["Hello", "Challenge", "Auth", "Welcome", "ErrorReply", "Register", "World",
              "Heartbeat", "Failed", "Stop", "AttemptDone", "Next", "End", "StoreSet",
              "StoreGet", "StoreWait", "StoreValue", "StoreOk"]


def u32(x):
    return struct.pack("<I", x)


def text(s):
    raw = s.encode() if isinstance(s, str) else s
    return u32(len(raw)) + raw


def frame(kind, body=b""):
    payload = bytes([RDZV_TYPES.index(kind) + 1]) + body
    return u32(len(payload)) + payload


def register(node, nnodes=3, nprocs=2, command="./train"):
    return frame("Register", u32(node) + u32(nnodes) + u32(nprocs) + struct.pack("<i", 100 + node) +
                 text(f"host{node}") + text(f"198.18.0.{node + 1}") + u32(5000) + text(command))


def failed(attempt, local, kind, code, wall, description, tail):
    return frame("Failed", u32(attempt) + struct.pack("<i", local) + bytes([kind]) +
                 struct.pack("<iq", code, wall) + text(description) + u32(len(tail)) +
                 b"".join(text(line) for line in tail))


def done(attempt, code):
    return frame("AttemptDone", u32(attempt) + struct.pack("<i", code))


def rendezvous_corpus():
    join = register(0) + register(1) + register(2)
    ok = {
        "ok-join": join,
        "ok-success": join + done(0, 0) + done(0, 0) + done(0, 0),
        "ok-restart-then-end": join + failed(0, 1, 2, 137, 5, "killed by signal 9", ["x"]) +
        done(0, 137) + done(0, 143) + done(0, 143) + failed(1, 0, 1, 3, 9, "exited with code 3", []) +
        done(1, 3) + done(1, 143) + done(1, 143),
        "ok-lost": join + frame("StoreOk") + done(0, 143) + done(0, 143),
        "ok-duplicate-rank": register(0) + register(0) + register(5) + register(1, nnodes=4),
        "ok-other-command": register(0) + register(1, command="sh -c 'job B'") + register(2) +
        done(0, 0) + done(0, 0) + done(0, 0),
        "ok-rendezvous-timeout": register(0) + frame("Heartbeat") * 8,
        # fuzz/run found it: a node's Failed with exit code 0 (a timeout: the root cause class
        # that outranks the rest) ended the job with status 0 and a failure summary.
        "ok-failure-claiming-exit-0": join + done(0, 137) + done(0, 143) + done(0, 143) +
        failed(1, 1, 3, 0, 9, "timed out", []) + done(1, 3) + done(1, 143) + done(1, 143),
        "ok-store": frame("StoreSet", text("rank_0") + text(b"\x00\x01")) +
        frame("StoreGet", text("rank_0") + u32(1000)) +
        frame("StoreWait", u32(2) + text("a") + text("") + u32(5)),
        "ok-handshake": frame("Hello", u32(0x5A525358) + u32(2) + bytes([1]) + bytes(16)) +
        frame("Challenge", u32(2) + bytes(16)) + frame("Auth", bytes(16)) +
        frame("Welcome", bytes(16)) + frame("ErrorReply", text("wrong job token")),
        "ok-orders": frame("World", text("xs-1-2") + u32(5) + u32(0) + u32(1) + u32(2) + text("a") +
                           text("b") + text("note")) + frame("Stop", u32(0) + text("why")) +
        frame("Next", u32(1) + text("xla-spawn: job xs-1-2 attempt 0 failed")) +
        frame("End", struct.pack("<i", 0) + text("")) +
        frame("StoreValue", text(b"v")),
    }
    bad = {
        "bad-empty-frame": u32(0),
        "bad-truncated": register(0)[:-3],
        "bad-unknown-type": u32(1) + bytes([99]),
        "bad-trailing-bytes": u32(2) + bytes([RDZV_TYPES.index("Heartbeat") + 1, 0]),
        "bad-role": frame("Hello", u32(0x5A525358) + u32(2) + bytes([7]) + bytes(16)),
        "bad-failure-kind-lost": failed(0, 0, 6, 1, 0, "", []),
        "bad-huge-string": frame("ErrorReply", u32(0xFFFFFFFF)),
        "bad-huge-list": frame("World", text("j") + u32(0) + u32(0) + u32(1 << 20)),
        "bad-oversized-frame": u32((1 << 21)) + b"x",
        "bad-http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    return {**ok, **bad}


def main():
    for sub, files in (("idx", idx_corpus()), ("checkpoint", checkpoint_corpus()),
                       ("spawn_options", spawn_options_corpus()),
                       ("replica_env", replica_env_corpus()),
                       ("rendezvous", rendezvous_corpus())):
        d = os.path.join(ROOT, sub)
        os.makedirs(d, exist_ok=True)
        for name in os.listdir(d):
            os.remove(os.path.join(d, name))
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
