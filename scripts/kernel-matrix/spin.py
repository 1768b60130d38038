"""Spins for argv[1] seconds of CPU time (default 3) under three named Python functions,
spin_outer -> spin_middle -> spin_leaf, that the profile must show among the interpreter's native
frames. CPU time, not wall time: under qemu's TCG the interpreter runs far slower."""
import sys
import time


def spin_leaf(seconds):
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        for i in range(2000):
            x += i
    return x


def spin_middle(seconds):
    return spin_leaf(seconds) + 1


def spin_outer(seconds):
    return spin_middle(seconds) + 1


spin_outer(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
