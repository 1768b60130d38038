"""A PyTorch workload of known allocations and launches, for scripts/gpu-check.sh.

    python3 gpu_workload.py default|expandable|compile

Prints key=value lines: what PyTorch says it reserved, and the launches it made on purpose."""
import sys
import time

import torch

MiB = 1 << 20


def allocate_tensors():
    # Sizes that the caching allocator rounds to whole segments: 2 MiB multiples.
    return [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (2, 4, 16, 64, 256, 1024)]


def matmuls(n):
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    for _ in range(n):
        c = a @ b
    torch.cuda.synchronize()
    return c


def compiled_step(x):
    return torch.nn.functional.gelu(x * 2 + 1).sum(dim=-1)


def run_compiled(n):
    f = torch.compile(compiled_step)
    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(n):
        y = f(x)
    torch.cuda.synchronize()
    return y


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "default"
    torch.cuda.init()
    time.sleep(0.5)  # not needed by gpuflame; keeps the start-up apart from the work in a CPU profile
    tensors = allocate_tensors()
    out = matmuls(50)
    if mode == "compile":
        run_compiled(100)
    del tensors
    torch.cuda.synchronize()
    print(f"mode={mode}")
    print(f"memory_reserved={torch.cuda.memory_reserved()}")
    print(f"max_memory_reserved={torch.cuda.max_memory_reserved()}")
    print("matmuls=50")
    return out


if __name__ == "__main__":
    main()
