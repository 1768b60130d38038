#!/usr/bin/env python3
"""Folded stacks of a made-up training job with N distinct stacks, for benches/convert_memory.sh.

    benches/convert_stacks.py N OUT.folded [SEED]

The stacks look like a real Python profile's: a thread's fixed native root (`_start`,
`__libc_start_main`, CPython's entry), then Python frames (`step (train.py:41)`), then native
code the Python called (a few with kernel frames, `_[k]`), 20 to 40 frames in all. Each frame's
callees are drawn from a call graph over about two thousand names, the first callees far more often
than the last, so that stacks share long prefixes as real ones do. Counts are heavy-tailed: most
stacks were seen once, a few thousands of times.

Names are kept short (8 bytes a frame on average) so that the folded text of a million stacks
stays under the 256 MiB that gpuflame reads (MAX_PROFILE_BYTES): real names are two to three
times longer, and a real million-stack profile is read as pprof.
"""

import random
import sys

COMMS = ["python3", "pt_main_thread", "pt_autograd_0", "dataloader_0", "dataloader_1", "nccl_proxy"]
NATIVE_ROOT = ["_start", "__libc_start_main", "main", "Py_BytesMain", "Py_RunMain", "PyRun_File"]
THREAD_ROOT = ["clone3", "start_thread", "pythread"]
VERBS = ["get", "run", "step", "fwd", "bwd", "call", "load", "init", "pack", "sync", "norm", "send", "read", "map", "cat", "add"]
NOUNS = ["", "x", "kv", "qk", "lr", "io", "op", "mlp", "emb", "tok", "opt", "grad", "loss", "attn", "head", "item"]
FILES = ["nn.py", "io.py", "opt.py", "amp.py", "data.py", "dist.py", "train.py", "model.py"]
C_PARTS = ["mm", "add", "mul", "cpy", "gemm", "conv", "relu", "cat", "sum", "view", "fill", "sort", "scan", "pool", "send", "recv", "bmm", "abs", "exp", "log"]
KERNEL = ["ksys_read", "vfs_read", "futex_wait", "schedule", "__schedule", "ep_poll", "do_futex", "sys_read"]


def names(rng):
    """About a thousand Python functions (name, file and line) and a thousand native ones."""
    python = []
    for verb in VERBS:
        for noun in NOUNS:
            name = f"{verb}_{noun}" if noun else verb
            for file in rng.sample(FILES, 4):
                python.append(f"{name} ({file}:{rng.randint(1, 400)})")
    native = [f"{a}{i}" for a in C_PARTS for i in range(50)]
    return python, native


def callees(rng, pool, fanout):
    """Each function's callees, most likely first."""
    return {f: rng.sample(pool, fanout) for f in pool}


def pick(rng, options, depth):
    """Zipf-like: near the root the first callee is taken about two times in three, deep down two
    times in five, so that stacks share their root side and differ towards their leaves."""
    alpha = max(0.75, 2.0 - depth / 16)
    i = min(int(rng.paretovariate(alpha)) - 1, len(options) - 1)
    return options[i]


def main():
    n = int(sys.argv[1])
    out = sys.argv[2]
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 26)
    python, native = names(rng)
    py_calls = callees(rng, python, 12)
    c_calls = callees(rng, native, 12)
    seen = set()
    written = tried = 0
    frames_total = 0
    with open(out, "w") as f:
        while written < n:
            comm = rng.choice(COMMS)
            depth = rng.randint(20, 40)
            stack = list(NATIVE_ROOT if comm == "python3" else THREAD_ROOT)
            py_depth = rng.randint(2, 5)
            frame = python[(int(rng.paretovariate(1.5)) - 1) % len(python)]
            for _ in range(py_depth):
                stack.append(frame)
                frame = pick(rng, py_calls[frame], len(stack))
            frame = native[(int(rng.paretovariate(1.5)) - 1) % len(native)]
            kernel = rng.random() < 0.1
            while len(stack) < depth - (3 if kernel else 0):
                stack.append(frame)
                frame = pick(rng, c_calls[frame], len(stack))
            if kernel:
                stack += [k + "_[k]" for k in rng.sample(KERNEL, 3)]
            line = comm + ";" + ";".join(stack)
            tried += 1
            key = hash(line)
            if key in seen:
                continue
            seen.add(key)
            count = min(int(rng.paretovariate(1.2)), 100_000)
            f.write(f"{line} {count}\n")
            written += 1
            frames_total += len(stack)
    print(f"{written} stacks, {frames_total / written:.1f} frames each on average, {tried - written} duplicates drawn again", file=sys.stderr)


if __name__ == "__main__":
    main()
