"""A torchrun job for scripts/gpu-check.sh: each rank all-reduces a 64 MiB tensor STEPS times
from `sync_gradients`, the last rank after extra work in `straggle` (a slow rank). Prints one line
per rank: rank=, calls=, bytes= (what it asked NCCL for), wait_s= (its time in the collectives as
torch.cuda events measured it)."""
import os
import sys

import torch
import torch.distributed as dist

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
ELEMENTS = 16 << 20  # float32: 64 MiB


def straggle(x):
    for _ in range(20):
        x = x @ x
    return x


def sync_gradients(t):
    dist.all_reduce(t)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    t = torch.ones(ELEMENTS, device="cuda")
    m = torch.randn(2048, 2048, device="cuda")
    wait = 0.0
    for _ in range(STEPS):
        if rank == world - 1:
            straggle(m)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        sync_gradients(t)
        end.record()
        torch.cuda.synchronize()
        wait += start.elapsed_time(end) / 1000
    print(f"rank={rank} calls={STEPS} bytes={STEPS * ELEMENTS * 4} wait_s={wait:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
