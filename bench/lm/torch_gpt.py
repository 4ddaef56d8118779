#!/usr/bin/python3
"""The train_lm model, data and schedule in PyTorch eager, for side-by-side comparison.

Same as examples/train_lm: the KJV verses from Debian's bible-kjv (references stripped), the
last 10% of the text (whole verses) for validation, packed windows of --context characters,
a pre-LayerNorm GPT with separate q/k/v projections, exact GELU, no weight tying, GPT-2's
initialisation, AdamW decaying only matrices, warm-up then cosine decay to --min-lr-factor,
and gradient clipping at global norm --clip. Prints one CSV line:
    torch,<steps>,<tokens_per_s>,<final_val_loss>
(tokens/s of all replicas over the steps after the first five). --replicas N trains as N
processes under DistributedDataParallel with the gloo backend on 127.0.0.1, each on its
--batch-size rows of a global batch of N x --batch-size (as xla-spawn -n N train_lm does).

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/lm/torch_gpt.py --steps 200
    OMP_NUM_THREADS=1 /usr/bin/python3 bench/lm/torch_gpt.py --steps 200 --replicas 2
"""
import argparse
import math
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def kjv_documents():
    out = subprocess.run(["/usr/bin/bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True).stdout
    docs = []
    for line in out.decode("latin-1").split("\n"):
        line = line.rstrip("\r")
        _, _, text = line.partition(" ")
        if text:
            docs.append(text)
    return docs


def split(docs, fraction=0.1):
    total = sum(len(d) + 1 for d in docs)
    held, first = len(docs[-1]) + 1, len(docs) - 1
    while first > 1 and held < int(total * fraction):
        first -= 1
        held += len(docs[first]) + 1
    return docs[:first], docs[first:]


def stream(docs, ids):
    text = "\n" + "".join(d + "\n" for d in docs)
    return torch.tensor([ids[c] for c in text], dtype=torch.long)


class Block(nn.Module):
    def __init__(self, d, heads, layers):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        for lin in (self.q, self.k, self.v, self.fc):
            nn.init.normal_(lin.weight, 0, 0.02)
        for lin in (self.proj, self.out):
            nn.init.normal_(lin.weight, 0, 0.02 / math.sqrt(2 * layers))
        for lin in (self.q, self.k, self.v, self.proj, self.fc, self.out):
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, t, c = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(b, t, self.heads, c // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        y = F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, layers, d, heads, context):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d), nn.Embedding(context, d)
        nn.init.normal_(self.tokens.weight, 0, 0.02)
        nn.init.normal_(self.positions.weight, 0, 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, layers) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        nn.init.normal_(self.head.weight, 0, 0.02)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main():
    a = parse()
    if a.replicas == 1:
        train(0, a, None)
        return
    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(a, port), nprocs=a.replicas, join=True)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr-factor", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--eval-batches", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def train(rank, a, port):
    torch.set_num_threads(1)
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=a.replicas)
    torch.manual_seed(a.seed)
    docs = kjv_documents()
    ids = {c: i for i, c in enumerate(sorted(set("\n" + "".join(docs))))}
    train_docs, val_docs = split(docs)
    train, val = stream(train_docs, ids), stream(val_docs, ids)
    model = Gpt(len(ids), a.layers, a.d_model, a.heads, a.context)
    net = model if port is None else torch.nn.parallel.DistributedDataParallel(model)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    rest = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": rest, "weight_decay": 0}],
                            lr=a.lr, betas=(0.9, a.beta2), eps=1e-8)

    def factor(step):  # runtime/optim/lr_schedule.cpp: warmup(w, cosine_decay(steps - w, min))
        if step < a.warmup:
            return (step + 1) / (a.warmup + 1)
        frac = min(step - a.warmup, a.steps - a.warmup) / (a.steps - a.warmup)
        return a.min_lr_factor + (1 - a.min_lr_factor) * (1 + math.cos(math.pi * frac)) / 2

    ctx = a.context
    windows = (len(train) - 1) // ctx
    order, at, epoch = torch.randperm(windows), 0, 0
    start, timed_tokens = None, 0
    for step in range(a.steps):
        if step == 5:
            start = time.perf_counter()
        rows_per_step = a.batch_size * a.replicas  # this rank's rows follow the ranks before it
        if at + rows_per_step > windows:
            epoch += 1
            order, at = torch.randperm(windows), 0
        w = order[at + rank * a.batch_size:at + (rank + 1) * a.batch_size] * ctx
        at += rows_per_step
        rows = torch.stack([train[s:s + ctx + 1] for s in w.tolist()])
        for g in opt.param_groups:
            g["lr"] = a.lr * factor(step)
        logits = net(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        if step >= 5:
            timed_tokens += rows.shape[0] * ctx * a.replicas
        if rank == 0 and (step + 1) % max(1, a.steps // 10) == 0:
            print(f"torch step {step + 1}: loss {loss.item():.4f}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start if start else 0
    if rank != 0:
        dist.destroy_process_group()
        return
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        n_val = (len(val) - 1) // ctx
        batches = n_val // a.batch_size
        if a.eval_batches > 0:
            batches = min(batches, a.eval_batches)
        for b in range(batches):
            rows = torch.stack([val[(b * a.batch_size + r) * ctx:(b * a.batch_size + r) * ctx + ctx + 1]
                                for r in range(a.batch_size)])
            logits = model(rows[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                                     reduction="sum").item()
            count += rows.shape[0] * ctx
    print(f"torch,{a.steps},{timed_tokens / seconds if seconds else 0:.0f},{total / count:.4f}", flush=True)
    if port is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
