"""A vLLM-like server on the stand-in caching allocator (libc10_cuda.so, env C10_CUDA), through
ctypes: tensors allocated from named Python functions, as torch does for vLLM.

No argument (or "oom"): load the model (64 MiB), a profile run (activations allocated and freed),
a KV cache of 16 layers of 8 MiB (128 MiB), then decode steps that each keep 1 MiB of prefix cache
and allocate and free 30 MiB of logits, until an allocation fails (run under FAKE_CUDA_BUDGET,
e.g. 300 MiB: the KV cache is then the largest holder; STEP_MS between steps). "steps N": N training-like steps, each
allocating activations in forward() and freeing them in backward(), with an optimizer state that
grows by 256 KiB a step, 20 ms a step. "serve-for SECONDS": the model and the KV cache, then a
batch a second (200 activations of 2 MiB allocated and freed, a prefix cache of 2 MiB entries
that keeps the newest 64), logging to QUIET_LOG each quiet time between batches with what the
tensors held then. Prints key=value lines, ends with allocated= and
reserved= (device 0), then sleeps LINGER_MS."""
import ctypes
import os
import sys
import time

MiB = 1 << 20
KiB = 1 << 10

c10 = ctypes.CDLL(os.environ["C10_CUDA"])
c10.gf_tensor_alloc.restype = ctypes.c_void_p
c10.gf_tensor_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
c10.gf_tensor_free.restype = None
c10.gf_tensor_free.argtypes = [ctypes.c_void_p]
c10.gf_memory_stats.restype = None
c10.gf_memory_stats.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulong), ctypes.POINTER(ctypes.c_ulong)]

# torch.empty(size, device="cuda:0") is C code: the Python line that calls it is the one that
# allocates. So is this: the pointer, or None at an out-of-memory.
empty = c10.gf_tensor_alloc
free = c10.gf_tensor_free
oom_requested = 0


def failed(size):
    global oom_requested
    oom_requested = oom_requested or size
    raise MemoryError(f"CUDA out of memory allocating {size} bytes")


def init_device():
    # As vLLM's worker does first (torch.cuda.set_device): initialises CUDA. The runtime is
    # libc10_cuda.so's dependency, found through its handle.
    if c10.cudaSetDevice(0) != 0:
        raise RuntimeError("cudaSetDevice failed")


def load_model():
    weights = []
    for _ in range(4):
        weights.append(empty(16 * MiB, 0) or failed(16 * MiB))
    return weights


def profile_run():
    activations = []
    for _ in range(2):
        activations.append(empty(24 * MiB, 0) or failed(24 * MiB))
    for a in activations:
        free(a)


def allocate_kv_cache():
    kv_cache = []
    for _layer in range(16):
        kv_cache.append(empty(8 * MiB, 0) or failed(8 * MiB))
    return kv_cache


def grow_prefix_cache(prefix_cache):
    p = empty(1 * MiB, 0)
    if not p:
        global oom_requested
        oom_requested = oom_requested or 1 * MiB
        return False
    prefix_cache.append(p)
    return True


def sample_logits():
    logits = empty(30 * MiB, 0)
    if not logits:
        global oom_requested
        oom_requested = oom_requested or 30 * MiB
        return False
    free(logits)
    return True


def decode_step(prefix_cache):
    return grow_prefix_cache(prefix_cache) and sample_logits()


def serve(prefix_cache):
    # STEP_MS: time between decode steps (a request's compute), for a timeline to look at.
    pause = float(os.environ.get("STEP_MS") or 0) / 1000
    steps = 0
    while decode_step(prefix_cache):
        steps += 1
        time.sleep(pause)
    return steps


def forward():
    activations = []
    for _ in range(4):
        activations.append(empty(2 * MiB, 0) or failed(2 * MiB))
    return activations


def backward(activations):
    for a in activations:
        free(a)


def optimizer_step(state):
    state.append(empty(256 * KiB, 0) or failed(256 * KiB))


def train(n):
    state = []
    for _ in range(n):
        activations = forward()
        backward(activations)
        optimizer_step(state)
        time.sleep(0.02)
    print(f"steps={n}")
    print(f"optimizer_state_bytes={len(state) * 256 * KiB}")
    return state


def allocated_now():
    allocated, reserved = ctypes.c_ulong(), ctypes.c_ulong()
    c10.gf_memory_stats(0, ctypes.byref(allocated), ctypes.byref(reserved))
    return allocated.value


def run_batch(prefix_cache):
    # The model's activations, allocated and freed as it runs; its requests' prefix cache,
    # whose oldest entries go once it holds 64. 2 MiB each: the agent's byte sampling draws all.
    activations = [empty(2 * MiB, 0) or failed(2 * MiB) for _ in range(200)]
    for a in activations:
        free(a)
    for _ in range(4):
        prefix_cache.append(empty(2 * MiB, 0) or failed(2 * MiB))
    while len(prefix_cache) > 64:
        free(prefix_cache.pop(0))


def serve_for(seconds, log_path):
    # A batch a second; between batches nothing is allocated or freed: each line of the log is
    # such a quiet time (wall-clock seconds from, to) and the bytes its tensors held then.
    prefix_cache = []
    end = time.time() + seconds
    with open(log_path, "w") as log:
        quiet_from = time.time()
        while time.time() < end:
            held = allocated_now()
            log.write(f"{quiet_from:.6f} {time.time():.6f} {held}\n")
            log.flush()
            run_batch(prefix_cache)
            quiet_from = time.time()
            time.sleep(1.0)
    return prefix_cache


def print_stats():
    allocated, reserved = ctypes.c_ulong(), ctypes.c_ulong()
    c10.gf_memory_stats(0, ctypes.byref(allocated), ctypes.byref(reserved))
    print(f"allocated={allocated.value}")
    print(f"reserved={reserved.value}")


def main():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from gate import gate

    gate()
    init_device()
    if len(sys.argv) > 1 and sys.argv[1] == "serve-for":
        weights = load_model()
        kv_cache = allocate_kv_cache()
        kept = (weights, kv_cache, serve_for(float(sys.argv[2]), os.environ["QUIET_LOG"]))
    elif len(sys.argv) > 1 and sys.argv[1] == "steps":
        kept = train(int(sys.argv[2]) if len(sys.argv) > 2 else 50)
    else:
        weights = load_model()
        profile_run()
        kv_cache = allocate_kv_cache()
        prefix_cache = []
        steps = serve(prefix_cache)
        print(f"steps={steps}")
        print(f"oom_requested={oom_requested}")
        print(f"kv_cache_bytes={len(kv_cache) * 8 * MiB}")
        print(f"weights_bytes={len(weights) * 16 * MiB}")
        print(f"prefix_cache_bytes={len(prefix_cache) * MiB}")
        kept = (weights, kv_cache, prefix_cache)
    print_stats()
    sys.stdout.flush()
    time.sleep(int(os.environ.get("LINGER_MS") or 0) / 1000)
    return kept


if __name__ == "__main__":
    main()
