"""The workload of scripts/gpu-check.sh: phases of known CUDA work under named functions, each with
what PyTorch itself says about it, so that gpuflame's profiles of the same program can be set
beside PyTorch's figures function by function.

    python3 gpu_check.py PHASE[,PHASE...] [--torch-profiler]

Phases:
  hbm          tensors allocated in weights(), kv_cache(), activations(), small(): the growth of
               torch.cuda.memory_reserved() in each, and the snapshot's segments at the end
  launches     add_loop() (one elementwise kernel per call) and mm_loop() (cuBLAS matmuls)
  graph        graph_replay(): a CUDA graph of 10 matmuls replayed 20 times
  sync         sync_point(): big matmuls, then torch.cuda.synchronize(), timed here
  launchbound  launch_bound(): 600,000 tiny launches (about 4 s), the time per launch
  train        train_step(): an MLP trained 150 steps with AdamW, the median step time
  oom          induce_oom(): a 300 GiB tensor, which fails

With --torch-profiler, each function of the launch phases runs under its own torch.profiler and
its kernels are counted and timed (do not combine with gpuflame's gpu-time: both are CUPTI
subscribers). Prints key=value lines."""
import statistics
import sys
import time

import torch

MiB = 1 << 20
HELD = []


def reserved():
    torch.cuda.synchronize()
    return torch.cuda.memory_reserved()


def weights():
    return [torch.empty(64 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]


def kv_cache():
    return [torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")]


def activations():
    return [torch.empty(5 * MiB, dtype=torch.uint8, device="cuda") for _ in range(30)]


def small():
    return [torch.empty(4096, dtype=torch.uint8, device="cuda") for _ in range(100)]


def phase_hbm():
    for f in (weights, kv_cache, activations, small):
        before = reserved()
        HELD.append(f())
        print(f"reserved_growth.{f.__name__}={reserved() - before}")
    segments = torch.cuda.memory._snapshot()["segments"]
    print(f"snapshot_segments={len(segments)} snapshot_bytes={sum(s['total_size'] for s in segments)}")
    print(f"memory_reserved={torch.cuda.memory_reserved()}")


def add_loop(n=2000):
    x = torch.zeros(1024, device="cuda")
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()


def mm_loop(n=200):
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    for _ in range(n):
        c = a @ b
    torch.cuda.synchronize()
    return c


def graph_replay():
    a = torch.randn(2048, 2048, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            b = a @ a  # warm-up outside the graph, as PyTorch asks
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        b = a
        for _ in range(10):
            b = b @ a
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    return b


def sync_point():
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    for _ in range(200):
        b = a @ a
    start = time.perf_counter_ns()
    torch.cuda.synchronize()
    print(f"sync_ns={time.perf_counter_ns() - start}")
    return b


def launch_bound(n=600000):
    x = torch.zeros(1024, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    print(f"launchbound_us_per_launch={(time.perf_counter() - start) * 1e6 / n:.3f}")
    print(f"launchbound_launches={n}")


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def train(steps=150):
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(4096, 4096), torch.nn.GELU())]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, 4096, device="cuda")
    y = torch.randn(512, 4096, device="cuda")
    times = []
    for i in range(steps):
        start = time.perf_counter()
        train_step(model, opt, x, y)
        torch.cuda.synchronize()
        if i >= 10:
            times.append(time.perf_counter() - start)
    print(f"train_step_ms_median={statistics.median(times) * 1e3:.3f}")


def induce_oom():
    try:
        HELD.append(torch.empty(300 << 30, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        print("oom_raised=1")


def profiled(f):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        f()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]
    print(f"torch_kernels.{f.__name__}={len(kernels)}")
    print(f"torch_kernel_ns.{f.__name__}={int(sum(e.time_range.elapsed_us() for e in kernels) * 1000)}")


def main():
    phases = sys.argv[1].split(",")
    with_profiler = "--torch-profiler" in sys.argv
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    time.sleep(0.3)
    for phase in phases:
        start = time.perf_counter()
        if phase == "hbm":
            phase_hbm()
        elif phase in ("launches", "graph", "sync"):
            funcs = {"launches": (add_loop, mm_loop), "graph": (graph_replay,), "sync": (sync_point,)}[phase]
            for f in funcs:
                profiled(f) if with_profiler else f()
        elif phase == "launchbound":
            launch_bound()
        elif phase == "train":
            train()
        elif phase == "oom":
            induce_oom()
        else:
            sys.exit(f"unknown phase {phase}")
        print(f"phase_seconds.{phase}={time.perf_counter() - start:.3f}", flush=True)


if __name__ == "__main__":
    main()
