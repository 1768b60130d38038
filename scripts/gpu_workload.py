"""A PyTorch workload of known allocations and launches, for scripts/gpu-check.sh.

    python3 gpu_workload.py default|expandable|compile [--torch-profiler]

Prints key=value lines: what PyTorch says it reserved, the launches it made on purpose, the
wall time of the work, and with --torch-profiler the kernel time torch.profiler measured."""
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


def work(mode):
    tensors = allocate_tensors()
    out = matmuls(50)
    if mode == "compile":
        run_compiled(100)
    del tensors
    torch.cuda.synchronize()
    return out


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "default"
    torch.cuda.init()
    time.sleep(0.5)  # not needed by gpuflame; keeps the start-up apart from the work in a CPU profile
    if mode == "compile":
        run_compiled(1)  # compile outside the timed work
    start = time.time()
    if "--torch-profiler" in sys.argv:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = work(mode)
        kernel_us = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
        print(f"torch_profiler_kernel_ns={int(kernel_us * 1000)}")
    else:
        out = work(mode)
    print(f"work_seconds={time.time() - start:.3f}")
    print(f"mode={mode}")
    print(f"memory_reserved={torch.cuda.memory_reserved()}")
    print(f"max_memory_reserved={torch.cuda.max_memory_reserved()}")
    print("matmuls=50")
    return out


if __name__ == "__main__":
    main()
