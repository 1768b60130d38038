#!/usr/bin/env bash
# Whole stacks through MKL's `nocopy` sgemm kernels, which have no CFI (issue #56), on any x86-64
# CPU with AVX2. MKL picks its kernels by CPU, and the `nocopy` ones only on Intel's: the library
# benches/mkl_intel_cpu.c, LD_PRELOADed into the PyPI wheel's torch, says the CPU is Intel's, so
# an AMD host runs the kernels of an Intel host of its instruction set (AVX2 here; AVX-512 where
# the CPU has it). benches/torch_train.py runs; once warm, `gpuflame record -p PID -d SECONDS` at
# its defaults, ROUNDS times each way, alternating: with GPUFLAME_NO_PROLOGUE_ROWS=1 (before: no
# rows from prologues) and without (after). For each recording: the share of samples whose stack
# is whole to its thread's root, those cut at `[native: no unwind info]`, and the MKL kernels at
# the leaf with their samples. MODEL=conv runs the loop's convolutions instead (oneDNN's JIT
# kernels, anonymous executable memory: `[native: unknown code]`). TRAIN_ARGS go to the loop
# (default `--threads 1`: with two threads this AVX2 host's MKL splits the loop's sgemms into
# shapes it gives its packing kernels, with one the `nocopy` ones, as the issue's Intel host did).
#
#   sudo benches/mkl_nocopy.sh [SECONDS] [ROUNDS]        (default 12 2)
#
# GPUFLAME_TORCH_VENV: a venv with torch (default /opt/torch-venv, as benches/torch_stacks.sh
# makes it); GPUFLAME_BIN: the gpuflame to measure (default: a release build here).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-12}
rounds=${2:-2}
venv=${GPUFLAME_TORCH_VENV:-/opt/torch-venv}
py="$venv/bin/python"
die() { echo "mkl_nocopy: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (gpuflame needs it)"
"$py" -c 'import torch' 2>/dev/null || die "no torch in $venv: benches/torch_stacks.sh installs it, or set GPUFLAME_TORCH_VENV"
grep -qw avx2 /proc/cpuinfo || die "this CPU has no AVX2: MKL's Intel kernels would not run"
exe=$("$root/benches/gpuflame-bin.sh")
tmp=$(mktemp -d)
wl=
trap '[ -n "$wl" ] && kill -TERM "$wl" 2>/dev/null; rm -rf "$tmp"' EXIT
cc -O2 -shared -fPIC -o "$tmp/libmkl_intel_cpu.so" "$root/benches/mkl_intel_cpu.c"

LD_PRELOAD="$tmp/libmkl_intel_cpu.so" "$py" "$root/benches/torch_train.py" --model "${MODEL:-mlp}" ${TRAIN_ARGS---threads 1} >"$tmp/train.out" 2>&1 &
wl=$!
for _ in $(seq 1 600); do
  grep -q '^warm ' "$tmp/train.out" && break
  kill -0 "$wl" 2>/dev/null || die "the workload exited: $(tail -5 "$tmp/train.out")"
  sleep 0.2
done
grep -q '^warm ' "$tmp/train.out" || die "the workload did not warm up in 120 s"
head -2 "$tmp/train.out" >&2

for r in $(seq 1 "$rounds"); do
  for way in before after; do
    echo "round $r: $way" >&2
    if [ "$way" = before ]; then
      GPUFLAME_NO_PROLOGUE_ROWS=1 "$exe" record -p "$wl" -d "$secs" -o "$tmp/$way-$r.folded" 2>"$tmp/$way-$r.log"
    else
      "$exe" record -p "$wl" -d "$secs" -o "$tmp/$way-$r.folded" 2>"$tmp/$way-$r.log"
    fi
  done
done

"$py" - "$tmp" "$rounds" <<'EOF'
import collections, os, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
ROOTS = {"_start", "clone", "clone3", "__clone", "__clone3", "start_thread"}
def leaf_kernel(frames):
    # The innermost MKL function (a kernel is called by MKL's drivers, all named mkl_*).
    for f in reversed(frames):
        if f.startswith("mkl_"):
            return f
    return None
cut = collections.Counter()
print("| round | way | samples | whole to the thread's root | cut at `[native: no unwind info]` | at `[native: unknown code]` | MKL kernels at the leaf (samples) |")
print("|---|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    for way in ("before", "after"):
        total = whole = no_info = unknown = 0
        kernels = collections.Counter()
        for line in open(f"{tmp}/{way}-{r}.folded"):
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames, n = stack.split(";"), int(count)
            user = [f for f in frames[1:] if not f.endswith("_[k]")]
            total += n
            whole += n if user and user[0] in ROOTS else 0
            no_info += n if "[native: no unwind info]" in frames else 0
            unknown += n if "[native: unknown code]" in frames else 0
            k = leaf_kernel(frames)
            if k and "kernel" in k:
                kernels[k] += n
            if not (user and user[0] in ROOTS):
                cut[(way, ";".join(frames[1:4]) + " ... " + ";".join(frames[-2:]))] += n
        top = ", ".join(f"`{k}` {n}" for k, n in kernels.most_common(4))
        print(f"| {r} | {way} | {total} | {100 * whole / max(total, 1):.1f}% | {no_info} | {unknown} | {top} |")
print("\nstacks not whole, all rounds (root side ... leaf side):")
for (way, stack), n in cut.most_common(12):
    print(f"  {way}: {n} {stack[:300]}")
EOF
