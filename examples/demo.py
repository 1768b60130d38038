"""gpuflame's demo: a small program whose stacks show what gpuflame sees.

    scripts/gpuflame record -o flame.svg -- python3 examples/demo.py

Its main thread runs Python that calls into native code (zlib's deflate) and into the kernel
(getrandom, through os.urandom), beside a pure-Python loop; a second thread waits on an event,
which `--profiles cpu,off-cpu` shows apart. It stops by itself after SECONDS (default 5).
Nothing but Python's standard library.
"""
import os
import sys
import threading
import time
import zlib


def checksum(data):
    # Pure Python: the interpreter's own frames, under this line.
    total = 0
    for byte in data[:40000]:
        total = (total * 31 + byte) & 0xFFFFFFFF
    return total


def compress_batch(batch):
    # Python over native code: zlib's deflate in libz.
    return zlib.compress(batch, 9)


def fresh_batch(size):
    # Python over the kernel: the getrandom system call fills the buffer.
    return os.urandom(size)


def train_step():
    batch = fresh_batch(1 << 20)
    packed = compress_batch(batch[: 1 << 16] * 4)
    return checksum(packed)


def wait_for_work(stop):
    # A thread that waits, as a data loader's does: off-CPU, not on the CPU graph.
    while not stop.wait(0.25):
        pass


def main(seconds):
    stop = threading.Event()
    waiter = threading.Thread(target=wait_for_work, args=(stop,), name="loader")
    waiter.start()
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        train_step()
        steps += 1
    stop.set()
    waiter.join()
    print(f"demo: {steps} steps in {seconds:g} s", file=sys.stderr)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
