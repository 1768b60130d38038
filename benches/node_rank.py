#!/usr/bin/env python3
"""One rank of a CPU stand-in for a GPU node's training job, for benches/node.sh: the PyPI torch
wheel imported whole, a small MLP trained in the main process, and a DataLoader whose W worker
processes make the batches (each a process of its own mapping all of torch, as on a real node).

    python node_rank.py WORKERS

Prints `warm pid=…` once the first batches have been trained on, then runs until killed.
"""
import os
import sys

import torch

torch.set_num_threads(1)


class Synthetic(torch.utils.data.Dataset):
    """Batches made with some CPU work, as a decoding and augmenting pipeline would."""

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(256, generator=g)
        for _ in range(20):
            x = torch.tanh(x * 1.01 + 0.1)
        return x, int(i % 10)


def train(workers):
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Synthetic(), batch_size=64, num_workers=workers, persistent_workers=workers > 0)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 3:
            print(f"warm pid={os.getpid()}", flush=True)


if __name__ == "__main__":
    train(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
