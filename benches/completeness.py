#!/usr/bin/env python3
"""Unwinding completeness and per-sample cost, gpuflame against perf --call-graph dwarf.

    sudo benches/completeness.py

Builds the unwinding test programs without frame pointers (profiler/tests/programs), runs them
all at once and records them in the same run with both `gpuflame record` and
`perf record --call-graph dwarf` (Debian's linux-perf). A sample is complete when its root frame
is the thread entry (_start, or clone3 for threads). Then, with kernel.bpf_stats_enabled=1,
measures the BPF sampling program's cost per sample for a shallow (8 frames), a deep (66 frames)
and a Python stack.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
progs = os.path.join(root, "profiler", "tests", "programs")
exe = os.path.join(root, "target", "release", "gpuflame")
SECONDS = 12
ENTRIES = {"_start", "clone3", "__clone3"}


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def build(d):
    out = {}
    flags = ["-O2", "-g", "-fomit-frame-pointer"]
    sh("cc", *flags, "-o", f"{d}/pie", f"{progs}/chain.c")
    sh("cc", *flags, "-static", "-o", f"{d}/static", f"{progs}/chain.c")
    sh("cc", *flags, "-o", f"{d}/stripped", f"{progs}/chain.c")
    sh("strip", "--strip-all", f"{d}/stripped")
    sh("cc", *flags, "-pthread", "-o", f"{d}/threads", f"{progs}/threads.c")
    sh("cc", "-O3", "-g", "-fomit-frame-pointer", "-o", f"{d}/recursion", f"{progs}/recursion.c")
    sh("c++", *flags, "-o", f"{d}/cpp", f"{progs}/chain.cpp")
    sh("cc", *flags, "-fPIC", "-shared", "-o", f"{d}/libchain.so", f"{progs}/chainlib.c")
    sh("cc", *flags, "-o", f"{d}/dlopen", f"{progs}/dlopener.c", "-ldl")
    for name in ["pie", "static", "stripped", "threads", "recursion", "cpp"]:
        out[name] = [f"{d}/{name}", str(SECONDS)]
    out["dlopen"] = [f"{d}/dlopen", f"{d}/libchain.so", str(SECONDS)]
    out["python3.11"] = ["/usr/bin/python3.11", "-c", f"import time\nend=time.time()+{SECONDS}\nx=0\nwhile time.time()<end:\n    x=(x*31+7)%1000003\n"]
    return out


def gpuflame_completeness(folded, comms):
    res = {c: [0, 0] for c in comms}
    for line in open(folded):
        stack, n = line.rstrip("\n").rsplit(" ", 1)
        frames = stack.split(";")
        comm, user = frames[0], [f for f in frames[1:] if not f.endswith("_[k]")]
        if comm not in res:
            continue
        res[comm][1] += int(n)
        stripped_root = comm == "stripped" and user and user[0].startswith("[unknown] (stripped+")
        if user and (user[0] in ENTRIES or stripped_root):
            res[comm][0] += int(n)
    return res


def perf_completeness(data, comms):
    res = {c: [0, 0] for c in comms}
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,ip,sym,dso"], capture_output=True, text=True).stdout
    for block in text.split("\n\n"):
        lines = [l for l in block.splitlines() if l.strip()]
        if not lines:
            continue
        comm = lines[0].split()[0]
        if comm not in res:
            continue
        res[comm][1] += 1
        frames = [l.split(None, 1)[1] if len(l.split(None, 1)) > 1 else "" for l in lines[1:]]
        user = [f for f in frames if "kernel.kallsyms" not in f]
        if not user:
            continue
        rootf = user[-1]
        sym = rootf.split(" (")[0]
        if sym in ENTRIES or (comm == "stripped" and "/stripped)" in rootf):
            res[comm][0] += 1
    return res


def cost(name, argv, d):
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    r = subprocess.run([exe, "-v", "record", "-F", "999", "-d", "3", "-p", str(p.pid), "-o", f"{d}/cost.folded"], capture_output=True, text=True)
    p.kill()
    p.wait()
    m = re.search(r"runs=(\d+) avg_ns=(\d+)", r.stderr)
    s = re.search(r"gpuflame: (\d+) samples", r.stderr)
    depth = 0
    for line in open(f"{d}/cost.folded"):
        stack, n = line.rsplit(" ", 1)
        depth = max(depth, len([f for f in stack.split(";")[1:] if not f.endswith("_[k]")]))
    if not (m and s):
        return f"| {name} | ? | ? | {r.stderr.strip()} |"
    runs, avg, samples = int(m.group(1)), int(m.group(2)), int(s.group(1))
    return f"| {name} | {depth} | {samples} | {runs * avg / max(samples, 1) / 1000:.1f} µs |"


def main():
    if os.geteuid() != 0:
        sys.exit("run as root")
    if not shutil.which("perf"):
        sys.exit("perf is needed (apt-get install linux-perf)")
    sh("cargo", "build", "--release", "--quiet", "-p", "gpuflame", cwd=root)
    with tempfile.TemporaryDirectory() as d:
        programs = build(d)
        procs = {n: subprocess.Popen(a, stdout=subprocess.DEVNULL) for n, a in programs.items()}
        time.sleep(1.0)
        pids = [str(p.pid) for p in procs.values()]
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "199", "--call-graph", "dwarf", "-o", f"{d}/perf.data", "-p", ",".join(pids), "--", "sleep", "5"], stderr=subprocess.DEVNULL)
        gf_args = [exe, "record", "-F", "199", "-d", "5", "-o", f"{d}/gf.folded"]
        for p in pids:
            gf_args += ["-p", p]
        subprocess.run(gf_args, check=True, capture_output=True)
        perf.wait()
        for p in procs.values():
            p.kill()
            p.wait()
        comms = {n: n[:15] for n in programs}
        g = gpuflame_completeness(f"{d}/gf.folded", comms.values())
        pf = perf_completeness(f"{d}/perf.data", comms.values())
        print(f"Completeness, same run: all programs at once, 5 s at 199 Hz each tool, {os.cpu_count()} CPUs\n")
        print("| program | gpuflame complete / samples | gpuflame % | perf --call-graph dwarf complete / samples | perf % |")
        print("|---|---|---|---|---|")
        for n, c in comms.items():
            (gc, gt), (pc, pt) = g[c], pf[c]
            print(f"| {n} | {gc} / {gt} | {100 * gc / max(gt, 1):.1f} | {pc} / {pt} | {100 * pc / max(pt, 1):.1f} |")

        print("\nPer-sample cost of the BPF sampling program (kernel.bpf_stats_enabled=1, 999 Hz, 3 s)\n")
        print("| stack | user frames | samples | BPF time per sample |")
        print("|---|---|---|---|")
        with open("/proc/sys/kernel/bpf_stats_enabled") as f:
            old = f.read().strip()
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write("1")
        try:
            print(cost("C chain (pie)", [f"{d}/pie", "6"], d))
            print(cost("C recursion, 60 levels", [f"{d}/recursion", "6"], d))
            print(cost("python3.11 loop", programs["python3.11"], d))
        finally:
            with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
                f.write(old)


main()
