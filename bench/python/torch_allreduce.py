"""torch.distributed.all_reduce latency and bus bandwidth by size, for one backend, as
nccl-tests reports them: algbw = bytes / time, busbw = algbw * 2(n-1)/n. Each size is checked
once (every rank's result equals the sum of every rank's data) before it is timed.

    xla-spawn -n 2 -- python3 bench/python/torch_allreduce.py --backend xla_spawn --csv out.csv

Rank 0 writes one CSV row per size: backend,world,bytes,median_us,algbw_gbs,busbw_gbs.

--loop times the way bench/collectives' all_reduce_sweep does, for a side-by-side with the C++
calls: back-to-back calls in repetitions of about 20 ms, the median of 7 (options it does not
know, such as the sweep's --heap-buffers, are ignored, so one SWEEP_ARGS serves both).
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import xla_spawn  # noqa: F401 (registers the "xla_spawn" backend)


def row(backend, world, size, seconds):
    algbw = size / seconds / 1e9
    busbw = algbw * 2 * (world - 1) / world
    return f"{backend},{world},{size},{seconds * 1e6:.2f},{algbw:.4f},{busbw:.4f}"


def loop_seconds(data, repetitions):
    """Seconds per call as all_reduce_sweep measures it: warm up in doubling batches until one
    lasts 2 ms on rank 0 (every rank follows its verdict), then `repetitions` runs of about
    20 ms of back-to-back calls; the median."""
    data.zero_()
    batch = 2
    while True:
        start = time.perf_counter()
        for _ in range(batch):
            dist.all_reduce(data)
        per_call = (time.perf_counter() - start) / batch
        verdict = torch.tensor([1.0 if per_call * batch > 2e-3 or batch >= 1 << 16 else 0.0])
        dist.broadcast(verdict, 0)
        if verdict.item() == 1.0:
            break
        batch *= 2
    iterations = torch.tensor([float(min(max(int(20e-3 / per_call), 1), 100000))])
    dist.broadcast(iterations, 0)
    times = []
    for _ in range(repetitions):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(int(iterations.item())):
            dist.all_reduce(data)
        times.append((time.perf_counter() - start) / iterations.item())
    median = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.broadcast(median, 0)  # ordinal 0's, as the C++ sweep reports
    return median.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="xla_spawn", choices=["xla_spawn", "gloo"])
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--budget-s", type=float, default=0.5, help="timing per size, about")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--loop", action="store_true", help="time as all_reduce_sweep does")
    parser.add_argument("--csv", default="")
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    size = args.min_bytes
    while size <= args.max_bytes:
        n = size // 4
        data = torch.full((n,), float(rank + 1))
        dist.all_reduce(data)
        if not torch.all(data == world * (world + 1) / 2):
            raise SystemExit(f"rank {rank}: all_reduce of {size} bytes is wrong")
        if args.loop:
            t = loop_seconds(data, args.repetitions)
            rows.append(row(args.backend, world, size, t))
            if rank == 0:
                print(rows[-1], flush=True)
            size *= args.factor
            continue
        # The repetitions that fit the budget, agreed by all ranks (each must make the same
        # calls): from 3 timed calls, the slowest rank's estimate.
        start = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(data)
        reps = torch.tensor([args.budget_s / ((time.perf_counter() - start) / 3)])
        dist.all_reduce(reps, dist.ReduceOp.MIN)
        times = []
        for _ in range(int(min(max(reps.item(), 5), 2000))):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(data)
            times.append(time.perf_counter() - start)
        # Every rank's median, then the slowest: a collective ends when its last rank does.
        median = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(median, dist.ReduceOp.MAX)
        t = median.item()
        rows.append(row(args.backend, world, size, t))
        if rank == 0:
            busbw = size / t / 1e9 * 2 * (world - 1) / world
            print(f"{args.backend} N={world} {size:>10} B  {t * 1e6:10.1f} us  busbw {busbw:7.3f} GB/s",
                  flush=True)
        size *= args.factor
    if rank == 0 and args.csv:
        with open(args.csv, "a") as f:
            f.write("\n".join(rows) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
