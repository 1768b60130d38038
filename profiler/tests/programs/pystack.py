# The Python workload of the profiler's tests: a known chain of functions on the main thread and
# on a second thread, a pure-Python hot loop and a call into native code (zlib).
import sys
import threading
import time
import zlib


def hot_loop(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x


def compress_it(data):
    return zlib.compress(data, 9)


def step(data):
    hot_loop(200000)
    compress_it(data)


def worker(seconds):
    data = bytes(range(256)) * 4000
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        step(data)

__import__("gate").gate()  # on a line of its own: the lines the tests expect stay put
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
t = threading.Thread(target=worker, args=(seconds,))
t.start()
worker(seconds)
t.join()
