"""A vLLM-like start-up on the CUDA stand-ins, through ctypes: load the weights, a profile run to
measure peak activation memory, a KV cache sized from what the memory budget leaves, then decode
steps. Prints what it allocated as key=value lines."""
import ctypes
import os

MiB = 1 << 20
cudart = ctypes.CDLL(os.environ["CUDART"])


def malloc(n):
    p = ctypes.c_void_p()
    rc = cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))
    if rc != 0:
        raise MemoryError(f"cudaMalloc({n}) failed with {rc}")
    return p


def init_device():
    # As vLLM's worker does first (torch.cuda.set_device): initialises CUDA.
    if cudart.cudaSetDevice(0) != 0:
        raise RuntimeError("cudaSetDevice failed")


def load_weights():
    return [malloc(32 * MiB) for _ in range(4)]


def profile_run():
    activations = [malloc(24 * MiB) for _ in range(2)]
    for a in activations:
        cudart.cudaFree(a)
    return 48 * MiB


def allocate_kv_cache(budget, used, peak):
    kv_bytes = int(budget * 0.9) - used - peak
    return malloc(kv_bytes), kv_bytes


def decode_step():
    cudart.cudaDeviceSynchronize()


def main():
    budget = int(os.environ["FAKE_CUDA_BUDGET"])
    init_device()
    weights = load_weights()
    peak = profile_run()
    kv, kv_bytes = allocate_kv_cache(budget, 128 * MiB, peak)
    for _ in range(20):
        decode_step()
    print(f"weights_bytes={128 * MiB}")
    print(f"kv_cache_bytes={kv_bytes}")
    return weights, kv


if __name__ == "__main__":
    main()
