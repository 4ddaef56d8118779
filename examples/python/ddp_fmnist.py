"""A PyTorch DDP script as people write it, trained with either torch.distributed backend:
gloo (TCP over loopback) or xla_spawn (the job's shared-memory collectives). The MLP
784-512-512-10 on Fashion-MNIST, each rank on its own shard of every epoch, one thread each.

    xla-spawn -n 2 -- python3 examples/python/ddp_fmnist.py --backend xla_spawn
    xla-spawn -n 2 -- python3 examples/python/ddp_fmnist.py --backend gloo

Rank 0 prints one line per epoch (train loss, test accuracy, samples/s over all ranks) and a
final "result backend=... accuracy=... samples_per_s=..." line. The data is Debian's
dataset-fashion-mnist (/usr/share/datasets/fashion-mnist, or --data-dir / XLA_SPAWN_DATA_DIR).
"""

import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import xla_spawn  # noqa: F401 (registers the "xla_spawn" backend)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(f">{magic & 0xFF}I", f.read(4 * (magic & 0xFF)))
        return np.frombuffer(f.read(), np.uint8).reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return (x - 0.2860) / 0.3530, torch.from_numpy(labels.astype(np.int64))  # the training set's mean, std


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="xla_spawn", choices=["xla_spawn", "gloo"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--train-samples", type=int, default=60000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=os.environ.get("XLA_SPAWN_DATA_DIR",
                                                             "/usr/share/datasets/fashion-mnist"))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    x_train, y_train = load(args.data_dir, "train")
    x_train, y_train = x_train[:args.train_samples], y_train[:args.train_samples]
    x_test, y_test = load(args.data_dir, "test")

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    steps = len(x_train) // (args.batch_size * world)
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        mine = order[rank::world]
        ddp.train()
        start = time.perf_counter()
        total_loss = torch.zeros(1)
        for step in range(steps):
            batch = mine[step * args.batch_size:(step + 1) * args.batch_size]
            loss = torch.nn.functional.cross_entropy(ddp(x_train[batch]), y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.detach()
        seconds = time.perf_counter() - start
        dist.all_reduce(total_loss)
        ddp.eval()
        with torch.no_grad():  # every rank scores its share of the test set
            shard = slice(rank * len(x_test) // world, (rank + 1) * len(x_test) // world)
            correct = (model(x_test[shard]).argmax(1) == y_test[shard]).sum().reshape(1)
        dist.all_reduce(correct)
        accuracy = correct.item() / len(x_test)
        samples_per_s = steps * args.batch_size * world / seconds
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {total_loss.item() / (steps * world):.4f}, "
                  f"test accuracy {accuracy:.4f}, {samples_per_s:.0f} samples/s", flush=True)
    if rank == 0:
        print(f"result backend={args.backend} world={world} accuracy={accuracy:.4f} "
              f"samples_per_s={samples_per_s:.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
