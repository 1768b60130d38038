# Generated functions, each run in a thread named after it and then dropped, so that the next
# one's code object is likely allocated where the last one's was freed: a frame must never carry
# another function's name (the thread name says which function runs). Each spins for its
# thread's CPU time, and there are TOTAL / EACH of them: the same work on a loaded machine.
import ctypes
import sys
import threading
import time

libc = ctypes.CDLL(None)
PR_SET_NAME = 15
SOURCE = """
def {name}(until):
    x = 0
    while time.thread_time() < until:
        x += 1
    return x
"""


def run_generated(i, seconds):
    name = f"gen_{i}"
    scope = {"time": time}
    exec(compile(SOURCE.format(name=name), "<generated>", "exec"), scope)
    fn = scope.pop(name)

    def body():
        libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
        fn(time.thread_time() + seconds)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    del fn, scope


def main(total, each):
    for i in range(round(total / each)):
        run_generated(i, each)


main(float(sys.argv[1]), float(sys.argv[2]))
