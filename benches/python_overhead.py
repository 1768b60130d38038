#!/usr/bin/env python3
"""Overhead on a Python CPU benchmark: gpuflame at 99 Hz against py-spy at 100 Hz, same run.

    sudo benches/python_overhead.py [ROUNDS] [PYTHON]     (defaults: 5, /usr/bin/python3.11)

The workload (pure-Python loops and zlib) waits 1 s for the profiler to attach, then times a fixed
amount of work. Rounds interleave: no profiler, `gpuflame record -F 99 -p`, `py-spy record -r 100
-p` (py-spy's default mode, which pauses the process to read it). With kernel.bpf_stats_enabled=1
during the gpuflame rounds, the BPF program's run time per sample gives the cost of a sample of
this Python process, the Python walk included.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
python = sys.argv[2] if len(sys.argv) > 2 else "/usr/bin/python3.11"
exe = os.path.join(root, "target", "release", "gpuflame")
WORKLOAD = r"""
import sys, time, zlib
def hot_loop(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x
def step(data):
    hot_loop(200000)
    zlib.compress(data, 6)
def main():
    data = bytes(range(256)) * 2000
    time.sleep(1.0)
    t = time.perf_counter()
    for _ in range(200):
        step(data)
    print(time.perf_counter() - t, flush=True)
main()
"""


def py_spy():
    found = shutil.which("py-spy") or "/root/.pyenv/shims/py-spy"
    if not os.path.exists(found):
        sys.exit("py-spy is needed (pip install py-spy)")
    return found


def run(mode, d):
    w = subprocess.Popen([python, "-c", WORKLOAD], stdout=subprocess.PIPE, text=True)
    prof = None
    if mode == "gpuflame":
        prof = subprocess.Popen([exe, "-v", "record", "-F", "99", "-p", str(w.pid), "-o", f"{d}/g.folded"], stderr=subprocess.PIPE, text=True)
    elif mode == "py-spy":
        prof = subprocess.Popen([py_spy(), "record", "-r", "100", "-p", str(w.pid), "-f", "raw", "-o", f"{d}/s.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    secs = float(w.stdout.readline())
    w.wait()
    err = ""
    if prof:
        _, err = prof.communicate()
    return secs, err or ""


def main():
    if os.geteuid() != 0:
        sys.exit("run as root")
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "gpuflame"], cwd=root, check=True)
    times = {"none": [], "gpuflame": [], "py-spy": []}
    costs = []
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        old = f.read().strip()
    with tempfile.TemporaryDirectory() as d:
        try:
            with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
                f.write("1")
            for _ in range(rounds):
                for mode in times:
                    secs, err = run(mode, d)
                    times[mode].append(secs)
                    m = re.search(r"runs=(\d+) avg_ns=(\d+)", err)
                    s = re.search(r"gpuflame: (\d+) samples", err)
                    if m and s and int(s.group(1)) > 0:
                        costs.append(int(m.group(1)) * int(m.group(2)) / int(s.group(1)))
        finally:
            with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
                f.write(old)
    base = statistics.median(times["none"])
    print(f"{python}, {rounds} interleaved rounds, median of the workload's own timing")
    print("| profiler | median s | slowdown |")
    print("|---|---|---|")
    for mode, ts in times.items():
        med = statistics.median(ts)
        print(f"| {mode} | {med:.3f} | {100 * (med - base) / base:+.1f}% |")
    if costs:
        print(f"\nBPF sampling program per sample of this process (Python walk included): {statistics.median(costs) / 1000:.1f} µs (median of {len(costs)} rounds)")


main()
