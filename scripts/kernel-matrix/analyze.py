#!/usr/bin/env python3
"""Reads the guests' console logs of scripts/kernel-matrix.sh (LOGS/KERNEL.log, written by
init.sh's markers) and prints the table kernel x check, each check one of

    works                 gpuflame ran and the check's criterion held
    works (how)           the same, by an older way where this kernel lacks a newer one (a
                          stderr line of gpuflame's that says what it uses "instead")
    degraded (why)        it ran, but the criterion failed, or gpuflame said a profile "cannot
                          run" on this kernel
    refused (why)         gpuflame exited non-zero or never started (its last `error:` line)

then a closing line `N passed, N failed` (the checks of --require's kernels, or of all).

    analyze.py --logs DIR [--markdown] [--require 6.1,sid] KERNEL...

Exit status 1 when a check of a required kernel is not `works`. Standard library only: it runs
with the host's python3 before anything else is installed.
"""
import argparse
import json
import os
import re
import sys

MIB = 1 << 20
CHECKS = ["cpu", "python", "offcpu", "dump", "cuda", "agent"]
# The guest's steps that make up each check.
STEPS = {"cpu": ["cpu", "cpu-idle", "cpu-busy"], "python": ["python"], "offcpu": ["offcpu"], "dump": ["dump"], "cuda": ["cuda-hbm", "cuda-tensors", "cuda-tensor-hooks"], "agent": ["agent"]}
CHAIN = [f"f{i:02d}" for i in range(1, 41)]
# The first frame of a whole stack of the main thread: `_start` (here and in the guests:
# _start;__libc_start_main_impl;__libc_start_call_main;main;f01, glibc's internal names
# `[unknown] (libc.so.6+0x...)` in a guest, which has no libc6-dbg), or glibc's start function
# where a glibc's CFI ends the chain there.
ROOTS = {"_start", "__libc_start_main", "__libc_start_main_impl", "__libc_start_call_main"}
# profiler/tests/tensors.rs: 4 weights of 8 MiB, 10 activations of 1 MiB, 1 + 2 raw blocks (5 MiB),
# 1 freed directly (5 MiB), 3 on device 2 (12 MiB), the second owner's reused block (8 MiB): every
# tensor allocated, freed or not, 72 MiB, as a run on the host (6.18) has it. The program prints
# what is live at the end, not this.
TENSOR_ALLOC_BYTES = (32 + 10 + 5 + 5 + 12 + 8) * MIB

MARKER = re.compile(r"@@(INFO|STEP|CHECK|STDERR|STDOUT|FILE|END|DMESG|DONE|HOST)\b")


class Step:
    def __init__(self, name):
        self.name = name
        self.rc = None
        self.secs = None
        self.timeout = None
        self.stderr = []
        self.stdout = []
        self.files = {}


class Guest:
    """What one kernel's console log says."""

    def __init__(self, path):
        self.info = {}
        self.steps = {}
        self.host = {}
        self.done = False
        self.tail = []
        self.dmesg = []
        self.started = set()
        self.missing = not os.path.exists(path)
        if not self.missing:
            self._parse(path)

    def _parse(self, path):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [l.rstrip("\r\n").replace("\r", "") for l in f]
        # The guest's last words, for a guest that ended early (a panic, a hang).
        self.tail = [l for l in lines if l.strip() and not l.startswith(("@@HOST", "qemu-system"))][-15:]
        step, into = None, None
        for line in lines:
            # A marker may follow what was on the console before it (the firmware's escape
            # codes before the first line).
            m = MARKER.search(line)
            if m:
                word, _, rest = line[m.start() + 2:].partition(" ")
                if word == "STEP":
                    self.started.add(rest.split()[0] if rest.split() else "")
                elif word == "INFO":
                    key, _, value = rest.partition("=")
                    self.info[key] = value
                elif word == "CHECK":
                    name, _, fields = rest.partition(" ")
                    step = self.steps[name] = Step(name)
                    kv = dict(f.split("=", 1) for f in fields.split() if "=" in f)
                    step.rc, step.secs, step.timeout = int(kv.get("rc", -1)), int(kv.get("secs", 0)), int(kv.get("timeout", 0))
                    into = None
                elif word == "STDERR" and step:
                    into = step.stderr
                elif word == "STDOUT" and step:
                    into = step.stdout
                elif word == "FILE" and step:
                    into = step.files.setdefault(rest.strip(), [])
                elif word == "DMESG":
                    step, into = None, self.dmesg
                elif word == "END":
                    step, into = None, None
                elif word == "DONE":
                    self.done = True
                elif word == "HOST":
                    self.host = dict(f.split("=", 1) for f in rest.split() if "=" in f)
                continue
            if into is not None:
                into.append(line)

    def label(self, short):
        # `uname -v` of a Debian kernel ends with its package version: "... Debian 6.1.158-1 (date)".
        m = re.search(r"Debian (\S+)", self.info.get("uname_v", ""))
        return f"{short} ({m.group(1)})" if m else short

    def ending(self):
        """How a guest that did not get to the end ended."""
        if self.missing:
            return "no console log"
        rc = self.host.get("qemu_rc", "?")
        how = f"the host's timeout stopped the guest after {self.host.get('seconds', '?')} s" if rc == "124" else f"the guest ended (qemu rc={rc})"
        last = self.tail[-1].strip()[:120] if self.tail else "nothing on the console"
        return f"{how}; its last line: {last}"

    def notes(self):
        """What the kernel lacks that gpuflame may need, and how the boot ended."""
        out = []
        for key in ("btf", "tracefs_events", "uprobe_events"):
            if self.info.get(key, "yes") != "yes":
                out.append(f"{key} {self.info[key]}")
        for key, value in self.info.items():
            if key.startswith("mount_") and value != "ok":
                out.append(f"{key[6:]}: {value}")
        if self.missing:
            out.append("no console log")
        elif not self.done:
            out.append(f"did not get to the end: {self.ending()}")
        return out


def parse_folded(lines):
    stacks = []
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def total(stacks):
    return sum(c for _, c in stacks)


def user(frames):
    """The frames after the command name that are not the kernel's."""
    return [f for f in frames[1:] if not f.endswith("_[k]")]


def key_values(lines):
    return dict((k.strip(), v.strip()) for k, _, v in (l.partition("=") for l in lines) if _)


def mib(n):
    return f"{n / MIB:.1f} MiB"


def has_run(frames, run):
    n = len(run)
    return any(frames[i:i + n] == run for i in range(len(frames) - n + 1))


# Each criterion takes the check's steps and returns None when it holds, else why not.

def cpu_criterion(steps):
    stacks = [(user(f), c) for f, c in parse_folded(steps["cpu"].files.get("deep.folded", [])) if f[0] == "deep"]
    # Judged: the samples in the chain (any of f01..f40) and those gpuflame marked as cut
    # (`[native: unknown code]`, `[native: unwind table not loaded yet]`...). The others are the
    # program outside the chain: the dynamic loader at its start (under TCG a few samples; its
    # frames are `[unknown] (ld-linux-x86-64.so.2+0x...)`, as the guest has no libc6-dbg),
    # exit, or only kernel frames (execve).
    judged = [(u, c) for u, c in stacks if any(x in CHAIN or x.startswith("[native:") for x in u)]
    n = total(judged)
    whole = sum(c for u, c in judged if u and u[0] in ROOTS and has_run(u, CHAIN))
    if n < 50:
        return f"cpu {n} samples of deep (want >= 50)"
    if whole < 0.99 * n:
        return f"cpu {100 * whole / n:.0f}% whole ({whole}/{n})"
    # A first recording of an idle machine says so; a busy one does not.
    idle = "the machine was nearly idle"
    if idle not in "\n".join(steps["cpu-idle"].stderr):
        return "cpu: an idle whole-machine recording gave no hint"
    if idle in "\n".join(steps["cpu-busy"].stderr):
        return "cpu: a busy whole-machine recording said the machine was idle"
    return None


def python_criterion(steps):
    stacks = parse_folded(steps["python"].files.get("py.folded", []))
    names = ["spin_outer", "spin_middle", "spin_leaf"]

    def spliced(frames):
        # A Python frame is `function (file)`, or `function (file:line)` with --lines.
        fn = [f.split(" ", 1)[0] for f in user(frames)]
        at = [fn.index(n) if n in fn else -1 for n in names]
        return -1 not in at and at == sorted(at)

    if not any(spliced(f) for f, _ in stacks):
        return "python: no stack with spin_outer > spin_middle > spin_leaf"
    return None


def offcpu_criterion(steps):
    files = steps["offcpu"].files
    empty = [p for p in ("off-cpu", "wall") if total(parse_folded(files.get(f"off.{p}.folded", []))) == 0]
    return f"{' and '.join(empty)} empty" if empty else None


def dump_criterion(steps):
    try:
        dump = json.loads("\n".join(steps["dump"].stdout))
    except ValueError:
        return "dump: its output is not JSON"
    frames = [{f["function"] for f in g["frames"]} for g in dump.get("groups", [])]
    missing = [w for w in ("block_sleep", "block_wait", "block_read") if not any(w in f for f in frames)]
    waiting = [t for t in dump.get("threads", []) if t.get("state") == "sleeping" and t.get("group")]
    if missing:
        return f"dump: no stack through {', '.join(missing)}"
    if len(waiting) < 3:
        return f"dump: {len(waiting)} sleeping threads with a stack, not 3"
    return None


def cuda_criterion(steps):
    why = []
    hbm = steps["cuda-hbm"]
    kv = key_values(hbm.stdout)
    alloc = total(parse_folded(hbm.files.get("mem.hbm-alloc.folded", [])))
    inuse = total(parse_folded(hbm.files.get("mem.hbm-inuse.folded", [])))
    # profiler/tests/cuda.rs: the program's own figures (336 and 212 MiB), exact.
    if str(alloc) != kv.get("alloc_bytes"):
        why.append(f"hbm-alloc {mib(alloc)} of {mib(int(kv.get('alloc_bytes', 0)))}")
    if str(inuse) != kv.get("inuse_bytes"):
        why.append(f"hbm-inuse {mib(inuse)} of {mib(int(kv.get('inuse_bytes', 0)))}")
    # The allocator with PyTorch's USDT notes, and without them (followed by hooks): the line
    # gpuflame says tells which way it took.
    for name, way, said in [("cuda-tensors", "probes", "through its USDT probes"), ("cuda-tensor-hooks", "hooks", "by hooks on its functions")]:
        why += [f"{way}: {w}" for w in tensor_whys(steps[name])]
        if not any(said in l for l in steps[name].stderr):
            why.append(f"{way}: no 'tensors followed in ... {said}'")
    return "; ".join(why) or None


def tensor_whys(t):
    """What is not exact in one run of tensor_app exact (profiler/tests/tensors.rs,
    tensor_stacks_are_exact)."""
    why = []
    kv = key_values(t.stdout)
    num = lambda k: int(kv.get(k, 0))  # noqa: E731
    files = t.files
    inuse = total(parse_folded(files.get("t.tensor-inuse.folded", [])))
    alloc = total(parse_folded(files.get("t.tensor-alloc.folded", [])))
    reserved = total(parse_folded(files.get("t.hbm-inuse.folded", [])))
    want = num("expected_allocated") + num("expected_allocated_dev2")
    if inuse != want or not want:
        why.append(f"tensor-inuse {mib(inuse)} of {mib(want)}")
    if alloc != TENSOR_ALLOC_BYTES:
        why.append(f"tensor-alloc {mib(alloc)} of {mib(TENSOR_ALLOC_BYTES)}")
    want = num("reserved") + num("reserved_dev2")
    if reserved != want or not want:
        why.append(f"tensors' hbm-inuse {mib(reserved)} of {mib(want)}")
    if not any("tensors: 21 allocated, 9 freed" in l for l in t.stderr):
        why.append("no 'tensors: 21 allocated, 9 freed'")
    return why


def agent_criterion(steps):
    pushes = [l for l in steps["agent"].files.get("receiver.log", []) if l.startswith("push ")]
    return None if pushes else "the receiver got no push"


CRITERIA = {"cpu": cpu_criterion, "python": python_criterion, "offcpu": offcpu_criterion, "dump": dump_criterion, "cuda": cuda_criterion, "agent": agent_criterion}


def error_line(step):
    errors = [l.strip() for l in step.stderr if "error:" in l]
    lines = [l.strip() for l in step.stderr if l.strip()]
    line = errors[-1] if errors else lines[-1] if lines else "no error line"
    # A verifier's refusal: its reason is the line before "processed N insns" in the log libbpf
    # printed, which says more than gpuflame's own line can.
    for i, l in enumerate(lines):
        if l.startswith("processed ") and " insns " in l and i > 0:
            line += f" [verifier: {lines[i - 1]}]"
            break
    return line


def verdict(guest, check):
    """(result, why): result is works, degraded or refused."""
    steps = {}
    for name in STEPS[check]:
        if name not in guest.steps:
            return "refused", f"{name} {'did not finish' if name in guest.started else 'did not run'}: {guest.ending()}"
        steps[name] = guest.steps[name]
    for s in steps.values():
        # The guest's timeout sends SIGTERM, which gpuflame takes as the end of a recording: it
        # may write its outputs and exit 0, so the clock says it, not the exit status.
        if s.timeout and s.secs >= s.timeout:
            return "refused", f"{s.name}: timed out after {s.secs} s, rc={s.rc} ({error_line(s)})"
        if s.rc != 0:
            return "refused", f"{s.name} rc={s.rc}: {error_line(s)}"
    said = [l.strip() for s in steps.values() for l in s.stderr if "cannot run" in l]
    why = CRITERIA[check](steps)
    reasons = [r for r in [why] + said if r]
    if reasons:
        return "degraded", "; ".join(dict.fromkeys(reasons))
    instead = [l.strip().removeprefix("gpuflame: ") for s in steps.values() for l in s.stderr if "instead" in l]
    return "works", "; ".join(dict.fromkeys(instead))


def cell(result, why):
    return f"{result} ({why})" if why else result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", required=True)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--require", default="")
    ap.add_argument("kernels", nargs="+")
    args = ap.parse_args()
    required = [k for k in args.require.split(",") if k]
    unknown = [k for k in required if k not in args.kernels]
    if unknown:
        print(f"analyze: --require names kernels that were not run: {', '.join(unknown)}", file=sys.stderr)
        return 2

    rows = []
    for k in args.kernels:
        g = Guest(os.path.join(args.logs, f"{k}.log"))
        results = {c: verdict(g, c) for c in CHECKS}
        secs = g.host.get("seconds", "?")
        rows.append((k, g, results, secs))

    if args.markdown:
        # A why is said once, under the table, and each cell that has it points to it: most
        # cells of a row share one.
        notes = []

        def md_cell(result, why):
            if not why:
                return result
            why = re.sub(r"^[\w-]+ rc=\d+: gpuflame: error: ", "", why)
            if why not in notes:
                notes.append(why)
            return f"{result} [{notes.index(why) + 1}]"

        print("| kernel | " + " | ".join(CHECKS) + " | boot + checks |")
        print("| --- " * (len(CHECKS) + 2) + "|")
        for k, g, results, secs in rows:
            cells = [md_cell(*results[c]).replace("|", "\\|") for c in CHECKS]
            print(f"| {g.label(k)} | " + " | ".join(cells) + f" | {secs} s |")
        if notes:
            print()
            for i, n in enumerate(notes, 1):
                print(f"[{i}] {n}" + ("  " if i < len(notes) else ""))
    else:
        head = ["kernel"] + CHECKS + ["time"]
        table = [[g.label(k)] + [results[c][0] for c in CHECKS] + [f"{secs} s"] for k, g, results, secs in rows]
        widths = [max(len(r[i]) for r in [head] + table) for i in range(len(head))]
        for r in [head] + table:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
        details = [f"{k} {c}: {r} ({why})" for k, g, results, _ in rows for c in CHECKS for r, why in [results[c]] if why]
        if details:
            print()
            print("\n".join(details))
    notes = [f"{k}: {n}" for k, g, _, _ in rows for n in g.notes()]
    if notes:
        print()
        print("\n".join(notes))

    counted = [r for r in rows if not required or r[0] in required]
    passed = sum(1 for _, _, results, _ in counted for c in CHECKS if results[c][0] == "works")
    failed = len(counted) * len(CHECKS) - passed
    print(f"{passed} passed, {failed} failed")
    return 1 if required and failed else 0


if __name__ == "__main__":
    sys.exit(main())
