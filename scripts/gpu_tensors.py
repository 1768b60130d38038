"""A workload for scripts/gpu-check.sh's tensor check (issue #23): tensors allocated from named
functions, some freed, with torch's own record of them. Prints torch's figures as key=value lines
(requested and allocated bytes, reserved bytes, the top holders by Python function from
torch.cuda.memory._snapshot()), then prints `ready` and sleeps, so that a recording that ends
meanwhile sees these tensors live."""
import collections
import sys
import time

import torch

MiB = 1 << 20


def load_weights():
    return [torch.empty(64 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]


def allocate_kv_cache():
    return [torch.empty(32 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]


def activations():
    kept = []
    for i in range(20):
        t = torch.empty(3 * MiB + 4096 * i, dtype=torch.uint8, device="cuda")
        if i % 4 == 0:
            kept.append(t)
    return kept


def small_tensors():
    return [torch.empty(1000 + 512 * i, dtype=torch.uint8, device="cuda") for i in range(100)]


def main():
    torch.cuda.memory._record_memory_history(max_entries=100000)
    held = (load_weights(), allocate_kv_cache(), activations(), small_tensors())
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    print(f"requested_bytes={stats['requested_bytes.all.current']}")
    print(f"memory_allocated={torch.cuda.memory_allocated()}")
    print(f"memory_reserved={torch.cuda.memory_reserved()}")
    holders = collections.Counter()
    for segment in torch.cuda.memory._snapshot()["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames = [f for f in block.get("frames", []) if f["filename"].endswith("gpu_tensors.py")]
            name = frames[0]["name"] if frames else "?"
            holders[name] += block.get("requested_size", block["size"])
    for name, size in holders.most_common(5):
        print(f"torch_holder={name}:{size}")
    print("ready", flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 60)
    return held


if __name__ == "__main__":
    main()
