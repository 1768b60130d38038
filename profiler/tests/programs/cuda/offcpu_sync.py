"""A training step that waits for the GPU: cudaStreamSynchronize on the CUDA stand-ins, which
blocks on a futex for FAKE_CUDA_SYNC_FUTEX_MS, called STEPS times from wait_for_gpu."""
import ctypes
import os
import sys

cudart = ctypes.CDLL(os.environ["CUDART"])


def wait_for_gpu():
    return cudart.cudaStreamSynchronize(None)


def train_step():
    return wait_for_gpu()


def main(steps):
    for _ in range(steps):
        if train_step() != 0:
            raise RuntimeError("cudaStreamSynchronize failed")


main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
