# Recursion in pure Python: one eval-loop call runs all of these frames (3.11+), far more than
# a walker that looks only a few dozen frames ahead for the call's end would see.
import sys
import time


# CPU time, not wall time: the same samples on a loaded machine.
def spin(until):
    x = 0
    while time.process_time() < until:
        x += 1
    return x


def recurse(n, until):
    if n == 0:
        if announce:
            print("deep", flush=True)
        return spin(until)
    return recurse(n - 1, until) + 1


depth = int(sys.argv[1])
announce = len(sys.argv) > 3 and sys.argv[3] == "announce"  # says so once at the bottom
sys.setrecursionlimit(max(1000, depth + 100))
recurse(depth, time.process_time() + float(sys.argv[2]))
