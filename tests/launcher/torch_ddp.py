# A PyTorch DDP script as people write it for torchrun, run unchanged under xla-spawn:
# init_process_group("gloo", init_method="env://") reads RANK, WORLD_SIZE, MASTER_ADDR and
# MASTER_PORT from the launcher. Each rank trains a small MLP on its own data for a few steps,
# then every rank checks that all ranks hold the same parameters (DDP averaged the gradients)
# and that they moved from where they started.
# Usage: torch_ddp.py [BACKEND]: gloo by default; "xla_spawn" imports the xla_spawn module,
# which registers that backend (the module's tests run it so).
# Prints "rank R of W: STEPS steps, loss L, parameters agree" on success; exits 1 otherwise.
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 5


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
    if backend == "xla_spawn":
        import xla_spawn  # noqa: F401 (registers the backend)
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != int(os.environ["XLA_SPAWN_ORDINAL"]) or world != int(os.environ["XLA_SPAWN_WORLD_SIZE"]):
        print(f"rank {rank} of {world} disagrees with xla-spawn's ordinal and world size", flush=True)
        return 1
    torch.manual_seed(0)  # the same initial model everywhere; DDP also broadcasts rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    start = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for _ in range(STEPS):
        x = torch.randn(8, 16, generator=data)
        y = torch.randint(0, 4, (8,), generator=data)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(gathered, params)
    if not all(torch.equal(g, gathered[0]) for g in gathered):
        print(f"rank {rank}: parameters differ between ranks", flush=True)
        return 1
    if torch.equal(params, start):
        print(f"rank {rank}: parameters did not change", flush=True)
        return 1
    print(f"rank {rank} of {world}: {STEPS} steps, loss {loss.item():.4f}, parameters agree", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
