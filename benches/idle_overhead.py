#!/usr/bin/env python3
"""The profiler's own CPU time per second of recording, whole machine, from getrusage.

    sudo benches/idle_overhead.py [SECONDS] [HZ]     (defaults: 30 s, 99 Hz)

Runs `gpuflame record` (the release build) for SECONDS and reports the user+system CPU seconds
it used (its own rusage, from wait4) divided by the wall time, and its peak RSS.
"""
import os
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
hz = int(sys.argv[2]) if len(sys.argv) > 2 else 99
exe = os.path.join(root, "target", "release", "gpuflame")
subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "gpuflame"], cwd=root, check=True)
with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "idle.pb.gz")
    start = time.monotonic()
    proc = subprocess.Popen([exe, "record", "-F", str(hz), "-d", str(seconds), "-o", out], stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)  # the rusage of gpuflame alone
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"gpuflame failed: {stderr}")
    utime, stime = ru.ru_utime, ru.ru_stime
    cpu = utime + stime
    print(f"recording {seconds:.0f} s at {hz} Hz, whole machine, {os.cpu_count()} CPUs")
    print(stderr.strip().splitlines()[-1])
    print(f"gpuflame CPU: user {utime:.3f} s + system {stime:.3f} s = {cpu:.3f} s over {wall:.1f} s wall")
    print(f"overhead: {1000 * cpu / wall:.2f} ms of CPU per second of recording ({100 * cpu / wall:.3f}% of one CPU)")
    print(f"peak RSS: {ru.ru_maxrss / 1024:.1f} MiB")
