"""torch.distributed.all_reduce latency and bus bandwidth by size, for one backend, as
nccl-tests reports them: algbw = bytes / time, busbw = algbw * 2(n-1)/n. Each size is checked
once (every rank's result equals the sum of every rank's data) before it is timed.

    xla-spawn -n 2 -- python3 bench/python/torch_allreduce.py --backend xla_spawn --csv out.csv

Rank 0 writes one CSV row per size: backend,world,bytes,median_us,algbw_gbs,busbw_gbs.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import xla_spawn  # noqa: F401 (registers the "xla_spawn" backend)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="xla_spawn", choices=["xla_spawn", "gloo"])
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--budget-s", type=float, default=0.5, help="timing per size, about")
    parser.add_argument("--csv", default="")
    args = parser.parse_args()
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
        algbw = size / t / 1e9
        busbw = algbw * 2 * (world - 1) / world
        rows.append(f"{args.backend},{world},{size},{t * 1e6:.2f},{algbw:.4f},{busbw:.4f}")
        if rank == 0:
            print(f"{args.backend} N={world} {size:>10} B  {t * 1e6:10.1f} us  busbw {busbw:7.3f} GB/s",
                  flush=True)
        size *= 4
    if rank == 0 and args.csv:
        with open(args.csv, "a") as f:
            f.write("\n".join(rows) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
