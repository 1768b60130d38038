#!/usr/bin/env python3
"""Helper of benches/torch_stacks.sh: runs the profilers under measurement, and turns their outputs
into the stack-completeness table.

    torch_stacks.py timed --json OUT.json [--stdout F] [--stderr F | --pty F] [--watch-maps] -- CMD...
    torch_stacks.py analyze RESULTS_DIR
    torch_stacks.py pprof-threads PROFILE.pb.gz        (per-thread folded stacks, for a human)

`timed` runs CMD and writes a JSON record: wall start/end, exit code, the command's own rusage
(wait4: CPU and peak RSS; for a command with children, also theirs once reaped, so /proc samples
of the command alone are kept too), and with --pty its stderr read through a pseudo-terminal, so
that gpuflame draws its live status line ("recording 1.2s  34 samples …", every 250 ms): the first
time that line shows samples > 0 is the time to first sample. With --watch-maps it sums, every
0.5 s, the memlock of the BPF maps the command holds (/proc/PID/fdinfo), named by bpftool when it
is installed.

`analyze` reads what the driver left in RESULTS_DIR (see torch_stacks.sh for the file names),
and prints the markdown table, the command lines, the roots each tool printed, and the top 5
stacks of gpuflame's attach run. Stacks are root first. The main thread is told apart where the
output says which thread a sample is from: gpuflame's pprof (tid label), perf script (pid/tid),
py-spy --threads (thread name and id). Otherwise every sample of the process counts, and the table
says so.
"""
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter

# Where each thread starts: the main thread in _start (some tools stop at libc's start function,
# as perf does when it has no unwind information for _start), the others in clone/start_thread.
MAIN_ROOTS = {"_start", "__libc_start_main", "__libc_start_call_main", "__libc_start_main_impl"}
THREAD_ROOTS = {"clone", "clone3", "__clone", "__clone3", "start_thread"}
TRUNCATED = "[truncated]"
PYSPY_LIBC_ROOT = re.compile(r"^0x[0-9a-f]+ \(libc\.so\.6\)$")


class Missing(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# timed


def _proc_sample(pid, ticks):
    """utime+stime seconds and VmHWM KiB of pid alone, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        hwm = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
        return cpu, hwm
    except (OSError, ValueError, IndexError):
        return None


_map_names = {}


def _map_name(map_id):
    if map_id in _map_names:
        return _map_names[map_id]
    name = None
    bpftool = shutil.which("bpftool")
    if bpftool:
        try:
            r = subprocess.run([bpftool, "-j", "map", "show", "id", str(map_id)], capture_output=True, text=True, timeout=5)
            name = json.loads(r.stdout).get("name") if r.returncode == 0 else None
        except (OSError, ValueError, subprocess.TimeoutExpired):
            name = None
    _map_names[map_id] = name
    return name


def _bpf_maps(pid):
    """{map_id: (name, memlock bytes)} of the BPF maps pid holds open."""
    maps = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return maps
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-map":
                continue
            info = {}
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    info[k.strip()] = v.strip()
            map_id = int(info["map_id"])
            maps[map_id] = (_map_name(map_id), int(info.get("memlock", "0")))
        except (OSError, KeyError, ValueError):
            continue
    return maps


def cmd_timed(argv):
    opts, cmd = {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            cmd = argv[i + 1:]
            break
        if a == "--watch-maps":
            opts["watch_maps"] = True
        elif a in ("--json", "--stdout", "--stderr", "--pty"):
            opts[a[2:]] = argv[i + 1]
            i += 1
        else:
            sys.exit(f"timed: unknown option {a}")
        i += 1
    if not cmd or "json" not in opts:
        sys.exit("usage: torch_stacks.py timed --json OUT [--stdout F] [--stderr F | --pty F] [--watch-maps] -- CMD...")
    ticks = os.sysconf("SC_CLK_TCK")
    stdout = open(opts["stdout"], "wb") if "stdout" in opts else subprocess.DEVNULL
    status_times = []  # (seconds since exec, elapsed gpuflame shows, samples)
    reader = None
    if "pty" in opts:
        import pty

        master, slave = pty.openpty()
        stderr = slave
    elif "stderr" in opts:
        stderr = open(opts["stderr"], "wb")
    else:
        stderr = subprocess.DEVNULL
    t0 = time.monotonic()
    wall0 = time.time()
    try:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
    except OSError as e:
        sys.exit(f"timed: cannot run {cmd[0]}: {e}")
    if "pty" in opts:
        os.close(slave)
        log = open(opts["pty"], "wb")
        status_re = re.compile(rb"recording ([0-9.]+)s\s+(\d+) samples\s+\d+ lost")

        def read():
            buf = b""  # what came since the last whole status line: a read may split one
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO once the last writer is gone
                    break
                if not chunk:
                    break
                now = time.monotonic() - t0
                log.write(chunk)
                buf += chunk
                end = 0
                for m in status_re.finditer(buf):
                    status_times.append((now, float(m.group(1)), int(m.group(2))))
                    end = m.end()
                buf = buf[end:][-4096:]
            log.close()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
    last_proc, maps_peak, maps_seen = None, 0, {}
    next_maps = 0.0
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        s = _proc_sample(proc.pid, ticks)
        if s:  # both only grow; a zombie's status has no VmHWM any more
            last_proc = (max(s[0], last_proc[0]), max(s[1], last_proc[1])) if last_proc else s
        if opts.get("watch_maps") and time.monotonic() >= next_maps:
            next_maps = time.monotonic() + 0.5
            maps = _bpf_maps(proc.pid)
            total = sum(m[1] for m in maps.values())
            if total > maps_peak:
                maps_peak, maps_seen = total, maps
        time.sleep(0.1)
    t1 = time.monotonic()
    if reader:
        reader.join(timeout=5)
    first = next((s for s in status_times if s[2] > 0), None)
    rec = {
        "cmd": cmd,
        "start": wall0,
        "end": wall0 + (t1 - t0),
        "wall_s": t1 - t0,
        "exit_code": os.waitstatus_to_exitcode(status),
        "rusage_user_s": ru.ru_utime,
        "rusage_sys_s": ru.ru_stime,
        "rusage_maxrss_kib": ru.ru_maxrss,
        "proc_cpu_s": last_proc[0] if last_proc else None,
        "proc_hwm_kib": last_proc[1] if last_proc else None,
        "status_lines": len(status_times),
        "first_status_s": status_times[0][0] if status_times else None,
        "first_sample_s": first[0] if first else None,
        "first_sample_recording_s": first[1] if first else None,
        "bpf_maps": {str(k): {"name": v[0], "memlock": v[1]} for k, v in maps_seen.items()},
        "bpf_memlock_peak": maps_peak if opts.get("watch_maps") else None,
        "bpftool": shutil.which("bpftool"),
    }
    with open(opts["json"], "w") as f:
        json.dump(rec, f, indent=1)
    sys.exit(rec["exit_code"] if rec["exit_code"] >= 0 else 128 - rec["exit_code"])


# ---------------------------------------------------------------------------------------------
# parsers: each returns a list of (thread, frames root first, count); thread is
# ("main" | "other" | None, tid or name) — None when the output cannot tell threads apart.


def _varint(b, i):
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        if c < 0x80:
            return r, i
        s += 7


def _fields(b):
    i, n = 0, len(b)
    while i < n:
        key, i = _varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 2:
            ln, i = _varint(b, i)
            v = b[i:i + ln]
            i += ln
        elif wt == 1:
            v = int.from_bytes(b[i:i + 8], "little")
            i += 8
        elif wt == 5:
            v = int.from_bytes(b[i:i + 4], "little")
            i += 4
        else:
            raise ValueError(f"protobuf wire type {wt}")
        yield f, wt, v


def push_series(body):
    """The series of a Pyroscope push request (PushRequest.series): (labels, raw profiles) each,
    the labels as a dict, the profiles as sent (gzipped pprof)."""
    for number, _, series in _fields(body):
        if number != 1:
            continue
        labels, raws = {}, []
        for n, _, v in _fields(series):
            if n == 1:
                pair = {k: val for k, _, val in _fields(v)}
                labels[pair.get(1, b"").decode()] = pair.get(2, b"").decode()
            elif n == 2:
                raws += [r for m, _, r in _fields(v) if m == 1]
        yield labels, raws


def _ints(wt, v):
    """A repeated integer field's values, packed or not."""
    if wt == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = _varint(v, i)
        out.append(x)
    return out


def _signed(x):
    return x - (1 << 64) if x >= 1 << 63 else x


def read_pprof(path):
    """gpuflame's pprof → [(pid, tid, comm, frames root first, count)], frames named as its folded
    output names them (Python frames `f (file.py:N)`, kernel frames suffixed `_[k]`)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    strings, mappings, locations, functions, raw_samples, sample_types = [], {}, {}, {}, [], []
    period = 0
    for f, wt, v in _fields(data):
        if f == 6:
            strings.append(v.decode("utf-8", "replace"))
        elif f == 1:
            sample_types.append(dict((ff, vv) for ff, _, vv in _fields(v)))
        elif f == 2:
            raw_samples.append(v)
        elif f == 3:
            m = dict((ff, vv) for ff, _, vv in _fields(v))
            mappings[m.get(1, 0)] = m.get(5, 0)
        elif f == 4:
            loc = {"mapping": 0, "lines": []}
            for ff, wtt, vv in _fields(v):
                if ff == 1:
                    loc["id"] = vv
                elif ff == 2:
                    loc["mapping"] = vv
                elif ff == 4:
                    ln = dict((a, b) for a, _, b in _fields(vv))
                    loc["lines"].append((ln.get(1, 0), _signed(ln.get(2, 0))))
            locations[loc["id"]] = loc
        elif f == 5:
            fn = dict((ff, vv) for ff, _, vv in _fields(v))
            functions[fn.get(1, 0)] = (fn.get(2, 0), fn.get(4, 0))
        elif f == 12:
            period = _signed(v)
    nanos = bool(sample_types) and strings[sample_types[0].get(2, 0)] == "nanoseconds"

    def sanitize(s):
        return s.replace(";", ":").replace("\n", ":")

    names = {}
    for lid, loc in locations.items():
        mapping = strings[mappings.get(loc["mapping"], 0)] if loc["mapping"] else ""
        out = []
        for fid, line in reversed(loc["lines"]):  # pprof: innermost first; folded: caller first
            name_i, file_i = functions.get(fid, (0, 0))
            name = strings[name_i]
            if mapping == "[python]":
                base = strings[file_i].rsplit("/", 1)[-1]
                name = f"{name} ({base}:{line})" if line else f"{name} ({base})"
            name = sanitize(name)
            if mapping == "[kernel.kallsyms]":
                name += "_[k]"
            out.append(name)
        names[lid] = out
    samples = []
    for raw in raw_samples:
        locs, values, labels = [], [], {}
        for f, wt, v in _fields(raw):
            if f == 1:
                locs += _ints(wt, v)
            elif f == 2:
                values += [_signed(x) for x in _ints(wt, v)]
            elif f == 3:
                lab = dict((a, b) for a, _, b in _fields(v))
                key = strings[lab.get(1, 0)]
                labels[key] = strings[lab[2]] if lab.get(2) else _signed(lab.get(3, 0))
        frames = [n for lid in reversed(locs) for n in names[lid]]
        value = values[0] if values else 0
        count = value // period if nanos and period > 1 else value
        if count > 0:
            samples.append((labels.get("pid"), labels.get("tid"), labels.get("comm", "[unknown]"), frames, count))
    return samples


def parse_gpuflame(path):
    if path.endswith(".pb.gz") or path.endswith(".pprof"):
        out = []
        for pid, tid, _comm, frames, count in read_pprof(path):
            kind = None if tid is None or pid is None else ("main" if tid == pid else "other")
            out.append(((kind, tid), frames, count))
        return out
    return [((None, None), frames[1:], count) for frames, count in _read_folded(path)]


def _read_folded(path):
    out = []
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                raise ValueError(f"{path}:{n}: not a folded line: {line[:80]!r}")
            out.append((stack.split(";"), int(count)))
    return out


PYSPY_THREAD = re.compile(r"^thread \((0x[0-9a-fA-F]+|\d+)\)(?::\s*(.*))?$")


def parse_pyspy(path, pid=None):
    out = []
    for frames, count in _read_folded(path):
        thread = (None, None)
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if frames:
            m = PYSPY_THREAD.match(frames[0])
            if m:
                ident, name = m.group(1), (m.group(2) or "")
                tid = int(ident, 16) if ident.startswith("0x") else int(ident)
                main = name == "MainThread" or (pid is not None and tid == pid)
                thread = ("main" if main else "other", tid)
                frames = frames[1:]
        out.append((thread, frames, count))
    return out


PERF_HEAD = re.compile(r"(\d+)/(\d+)\s*$")
PERF_FRAME = re.compile(r"^\s*([0-9a-fA-F]+)\s+(.*?)\s+\((.*)\)\s*$")


def parse_perf(path):
    """perf script -F comm,pid,tid,ip,sym,dso: a header line per sample, then its frames leaf
    first, a blank line after each."""
    out = []
    with open(path, errors="replace") as f:
        text = f.read()
    for block in text.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        m = PERF_HEAD.search(lines[0])
        if not m:
            continue
        pid, tid = int(m.group(1)), int(m.group(2))
        frames = []
        for ln in lines[1:]:
            fm = PERF_FRAME.match(ln)
            if not fm:
                frames.append(ln.strip())
                continue
            sym, dso = fm.group(2), fm.group(3)
            if sym == "[unknown]":
                sym = f"[unknown] ({dso.rsplit('/', 1)[-1]})"
            if dso.startswith("[kernel"):
                sym += "_[k]"
            frames.append(sym)
        out.append((("main" if pid == tid else "other", tid), frames[::-1], 1))
    return out


# ---------------------------------------------------------------------------------------------
# metrics


def _bare(frame):
    """`__libc_start_main@@GLIBC_2.34+0x80` → `__libc_start_main`."""
    return frame.split("@@")[0].split("+0x")[0].strip()


def user_frames(frames):
    return [f for f in frames if not f.endswith("_[k]") and f != TRUNCATED]


def is_complete(frames, kind, tool):
    user = user_frames(frames)
    if not user or (frames and frames[0] == TRUNCATED):
        return False
    root = _bare(user[0])
    if tool == "py-spy" and PYSPY_LIBC_ROOT.match(user[0]):
        # py-spy --native prints __libc_start_call_main as an address in libc and stops there.
        return kind != "other"
    if kind == "main":
        return root in MAIN_ROOTS
    if kind == "other":
        return root in THREAD_ROOTS
    return root in MAIN_ROOTS or root in THREAD_ROOTS


def metrics(samples, tool):
    told = any(kind is not None for (kind, _), _, _ in samples)
    total_all = sum(c for _, _, c in samples)
    chosen = [(k, fr, c) for (k, _), fr, c in samples if not told or k == "main"]
    n = sum(c for _, _, c in chosen)
    if n == 0:
        return {"threads_told": told, "samples": 0, "samples_all": total_all}

    def share(pred):
        return sum(c for k, fr, c in chosen if pred(k, fr)) / n

    roots = Counter()
    depths = []
    for k, fr, c in chosen:
        user = user_frames(fr)
        root = TRUNCATED if fr and fr[0] == TRUNCATED else (user[0] if user else "(kernel only)")
        roots[root] += c
        depths += [len(user)] * c
    return {
        "threads_told": told,
        "samples": n,
        "samples_all": total_all,
        "train_step": share(lambda k, fr: any(f == "train_step" or f.startswith("train_step (") for f in fr)),
        # Any frame of the script itself: during `import torch` that is `<module> (torch_train.py:N)`.
        "script": share(lambda k, fr: any("(torch_train.py:" in f for f in fr)),
        "complete": share(lambda k, fr: is_complete(fr, k, tool)),
        "truncated": share(lambda k, fr: bool(fr) and fr[0] == TRUNCATED),
        "one_frame": share(lambda k, fr: len(user_frames(fr)) <= 1),
        "median_depth": statistics.median(depths),
        "roots": roots.most_common(4),
    }


# ---------------------------------------------------------------------------------------------
# analyze


def _need(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        raise Missing(p)
    return p


def _json(d, name):
    with open(_need(d, name)) as f:
        return json.load(f)


def _kv_lines(path):
    """The workload's `key=value` output as a list of (tag, dict)."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            tag = parts[0] if "=" not in parts[0] else ""
            kv = dict(p.split("=", 1) for p in parts if "=" in p)
            out.append((tag, kv))
    return out


def import_time(path):
    for _, kv in _kv_lines(path):
        if "import_torch_s" in kv:
            return float(kv["import_torch_s"])
    raise ValueError(f"{path}: no import_torch_s line (did the workload start?)")


def steps_per_s(progress, start, end):
    """Steps/s of the workload between wall times start and end, from its progress lines."""
    inside = [(t, s) for t, s in progress if start <= t <= end]
    if len(inside) < 2:
        return None
    (t0, s0), (t1, s1) = inside[0], inside[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def _pct(x):
    return "—" if x is None else f"{100 * x:.1f}%"


def analyze(d):
    errors = []
    meta = _json(d, "meta.json")
    wl_pid = meta.get("workload_pid")

    tools = []  # (column, tool, parser thunk, timed json name, note)
    tools.append(("gpuflame `record -p` (attach)", "gpuflame", lambda: parse_gpuflame(_need(d, "gf-attach.pb.gz")), "gf-attach.json"))
    tools.append(("py-spy `--native`", "py-spy", lambda: parse_pyspy(_need(d, "pyspy.txt"), wl_pid), "pyspy.json"))
    tools.append(("perf `--call-graph dwarf`", "perf", lambda: parse_perf(_need(d, "perf.txt")), "perf.json"))
    tools.append(("gpuflame `record -- CMD`", "gpuflame", lambda: parse_gpuflame(_need(d, f"gfcmd-{meta['rounds']}.pb.gz")), f"gfcmd-{meta['rounds']}.json"))

    progress = []
    try:
        for tag, kv in _kv_lines(_need(d, "long.out")):
            if tag in ("progress", "warm") and "t" in kv:
                progress.append((float(kv["t"]), int(kv["steps"])))
    except Missing as e:
        errors.append(f"missing {e}")

    cols = []
    for column, tool, parse, timed_name in tools:
        col = {"column": column, "tool": tool}
        if tool in meta.get("skipped", {}):
            col["error"] = f"not run: {meta['skipped'][tool]}"
            cols.append(col)
            continue
        try:
            col["m"] = metrics(parse(), tool)
            col["t"] = _json(d, timed_name)
        except Missing as e:
            col["error"] = f"missing {e}"
            errors.append(f"{column}: missing file {e}")
        except (ValueError, IndexError, KeyError, UnicodeDecodeError) as e:
            col["error"] = f"unreadable: {e}"
            errors.append(f"{column}: {e}")
        cols.append(col)

    # import time, with and without gpuflame
    base, under = [], []
    for r in range(1, meta["rounds"] + 1):
        try:
            base.append(import_time(_need(d, f"baseline-{r}.out")))
            under.append(import_time(_need(d, f"gfcmd-{r}.out")))
        except (Missing, ValueError) as e:
            errors.append(f"import time, round {r}: {e}")

    def row(label, fn):
        cells = []
        for c in cols:
            if "error" in c:
                cells.append(c["error"] if label == "samples (main thread)" else "")
                continue
            try:
                v = fn(c)
            except (KeyError, TypeError, ZeroDivisionError):
                v = None
            cells.append("—" if v is None else v)
        return f"| {label} | " + " | ".join(cells) + " |"

    def m(c, k):
        return c["m"].get(k)

    def samples_cell(c):
        mm = c["m"]
        if not mm["threads_told"]:
            return f"{mm['samples']} (all threads: cannot tell them apart)"
        return f"{mm['samples']} of {mm['samples_all']}"

    def window_rate(c):
        t = c["t"]
        if c["column"].startswith("gpuflame `record --"):
            return None
        r = steps_per_s(progress, t["start"], t["end"])
        return None if r is None else f"{r:.2f}"

    def cpu_cell(c):
        t = c["t"]
        if c["column"].startswith("gpuflame `record --"):
            # wait4 would include the workload it started; /proc sampled until just before exit
            return None if t.get("proc_cpu_s") is None else f"≥ {t['proc_cpu_s']:.2f} s (/proc, before exit)"
        return f"{t['rusage_user_s'] + t['rusage_sys_s']:.2f} s (user {t['rusage_user_s']:.2f} + sys {t['rusage_sys_s']:.2f}) in {t['wall_s']:.1f} s"

    def rss_cell(c):
        t = c["t"]
        if c["column"].startswith("gpuflame `record --"):
            return None if t.get("proc_hwm_kib") is None else f"≥ {t['proc_hwm_kib'] / 1024:.1f} MiB"
        return f"{t['rusage_maxrss_kib'] / 1024:.1f} MiB"

    def first_sample_cell(c):
        t = c["t"]
        if c["tool"] != "gpuflame":
            return None
        if t.get("first_sample_s") is None:
            return "no status line with samples" if t.get("status_lines") is not None else None
        return f"{t['first_sample_s']:.2f} s (of which {t['first_sample_s'] - t['first_sample_recording_s']:.2f} s before recording began)"

    def maps_cell(c):
        t = c["t"]
        if c["tool"] != "gpuflame" or t.get("bpf_memlock_peak") is None:
            return None
        maps = t["bpf_maps"].values()
        total = t["bpf_memlock_peak"] / 2**20
        if not t.get("bpftool"):
            return f"{total:.1f} MiB all maps (bpftool absent: unwind tables not told apart)"
        unwind = sum(m["memlock"] for m in maps if (m["name"] or "").startswith("unwind_")) / 2**20
        return f"{unwind:.1f} MiB unwind tables, {total:.1f} MiB all maps"

    def import_cell(c):
        if not c["column"].startswith("gpuflame `record --") or not base or not under:
            return None
        b, u = statistics.median(base), statistics.median(under)
        return f"{u:.2f} s vs {b:.2f} s without (×{u / b:.2f}, median of {len(under)})"

    lines = []
    lines.append(f"Workload: benches/torch_train.py, torch {meta.get('torch', '?')}, {meta.get('threads', '?')} intra-op threads, "
                 f"{meta.get('cpus', '?')} CPUs; attach runs {meta.get('seconds')} s each, one after another on the same process.")
    lines.append("")
    lines.append("| | " + " | ".join(c["column"] for c in cols) + " |")
    lines.append("|---|" + "---|" * len(cols))
    lines.append(row("samples (main thread)", samples_cell))
    lines.append(row("with the script's Python frames (`train_step`)", lambda c: _pct(m(c, "train_step"))))
    lines.append(row("with any frame of the script (`torch_train.py`)", lambda c: _pct(m(c, "script"))))
    lines.append(row("complete to the thread root", lambda c: _pct(m(c, "complete"))))
    lines.append(row("`[truncated]` root", lambda c: _pct(m(c, "truncated")) if c["tool"] == "gpuflame" else None))
    lines.append(row("one user frame or none", lambda c: _pct(m(c, "one_frame"))))
    lines.append(row("median user frames", lambda c: f"{m(c, 'median_depth'):g}"))
    lines.append(row("time to first sample", first_sample_cell))
    lines.append(row("`import torch` under the profiler", import_cell))
    lines.append(row("profiler CPU", cpu_cell))
    lines.append(row("profiler peak RSS", rss_cell))
    lines.append(row("BPF map memory (memlock)", maps_cell))
    none_rate = None
    if meta.get("quiet_window"):
        qs, qe = meta["quiet_window"]
        none_rate = steps_per_s(progress, qs, qe)
    lines.append(row("workload steps/s meanwhile" + (f" (none: {none_rate:.2f})" if none_rate else ""), window_rate))
    lines.append("")
    lines.append("Roots seen (main thread, share of its samples):")
    lines.append("")
    for c in cols:
        if "m" in c and c["m"].get("roots"):
            n = c["m"]["samples"]
            lines.append(f"- {c['column']}: " + "; ".join(f"`{r}` {100 * k / n:.0f}%" for r, k in c["m"]["roots"]))
    lines.append("")
    lines.append("gpuflame's own summary lines:")
    lines.append("")
    for name in ("gf-attach.pty.log", f"gfcmd-{meta['rounds']}.pty.log"):
        try:
            with open(_need(d, name), "rb") as f:
                text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", f.read().decode("utf-8", "replace")).replace("\r", "\n")
            summary = [ln for ln in text.split("\n") if ln.startswith("gpuflame: ") and " samples from " in ln]
            lines.append(f"- {name}: `{summary[-1].strip()}`" if summary else f"- {name}: (no summary line)")
        except Missing as e:
            errors.append(f"missing {e}")
    lines.append("")
    lines.append("Notes: samples are counted per thread where the output says which thread (gpuflame's pprof "
                 "tid label, perf script's pid/tid, py-spy --threads); the main thread is tid = pid. "
                 "py-spy samples Python threads only, by wall clock (idle samples dropped), and ends its "
                 "native stacks at __libc_start_call_main printed as an address in libc.so.6: that root "
                 "counts as complete. perf sees no Python frames (CPython 3.11 has no perf trampoline). "
                 "The `record -- CMD` column covers the whole run, `import torch` included. "
                 "CPU and peak RSS: wait4 rusage of the profiler process (perf record's includes its `sleep`).")
    table = "\n".join(lines)

    out = [table, ""]
    try:
        with open(_need(d, "commands.txt")) as f:
            out.append("Commands:\n\n```\n" + f.read().rstrip() + "\n```")
    except Missing as e:
        errors.append(f"missing {e}")
    out.append("")
    out.append("Top 5 stacks of gpuflame's attach run (all threads, its folded output):")
    try:
        folded = _read_folded(_need(d, "gf-attach.folded"))
        total = sum(c for _, c in folded) or 1
        for frames, count in sorted(folded, key=lambda x: -x[1])[:5]:
            out.append(f"  {count:5d} ({100 * count / total:4.1f}%) {len(frames) - 1:3d} frames: " + ";".join(frames))
    except (Missing, ValueError) as e:
        out.append(f"  (unavailable: {e})")
        errors.append(str(e))
    text = "\n".join(out)
    print(text)
    with open(os.path.join(d, "table.md"), "w") as f:
        f.write(text + "\n")
    if errors:
        print("\nproblems:\n" + "\n".join(f"  - {e}" for e in errors), file=sys.stderr)
        return 1
    return 0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "timed":
        cmd_timed(args)
    elif cmd == "analyze":
        if len(args) != 1:
            sys.exit("usage: torch_stacks.py analyze RESULTS_DIR")
        if not os.path.isdir(args[0]):
            sys.exit(f"analyze: {args[0]} is not a directory (run benches/torch_stacks.sh first)")
        try:
            sys.exit(analyze(args[0]))
        except Missing as e:
            sys.exit(f"analyze: missing {e} (did the benchmark run to the end?)")
    elif cmd == "pprof-threads":
        for pid, tid, comm, frames, count in read_pprof(args[0]):
            print(f"{comm}/{pid}/{tid};" + ";".join(frames) + f" {count}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
