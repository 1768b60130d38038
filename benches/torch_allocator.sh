#!/usr/bin/env bash
# PyTorch's caching allocator in the real wheel, without a GPU (issues #23, #37): in a CPU PyTorch
# process, gpuflame finds the allocator's methods in torch/lib/libc10_cuda.so (static symbols),
# the instructions its malloc's callers resume at, its USDT probes (pytorch:malloc,
# pytorch:free), and c10::reportOutOfMemoryToProfiler in libc10.so, and attaches (no call happens
# on CPU: finding and attaching are the check). The probes' semaphores, read from
# /proc/PID/mem, are printed before, while and after gpuflame is attached. Then the same with a
# copy of libc10_cuda.so whose symbols are stripped, preloaded in its place: one line says the
# tensors cannot be followed, and why.
#
#   sudo benches/torch_allocator.sh [VENV]      (default /opt/torch-venv: `pip install torch`)
#   GPUFLAME_BIN=path/to/gpuflame to measure another build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-/opt/torch-venv}
exe=$("$root/benches/gpuflame-bin.sh")
py="$venv/bin/python"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
lib="$site/torch/lib/libc10_cuda.so"
[ -f "$lib" ] || { echo "no $lib: pip install torch into $venv first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$py" -c 'import torch; print(torch.__version__)'

# Attaches to a Python that imported torch (given environment) and prints what was hooked.
attach() {
  env "$@" "$py" -c 'import torch, time, sys; print("ready", flush=True); time.sleep(60)' >"$tmp/py.out" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do grep -q ready "$tmp/py.out" && break; sleep 0.1; done
  semaphores "$pid" before
  "$exe" record -v -p "$pid" --profiles tensor-inuse -d 4 -o "$tmp/t.folded" >"$tmp/rec.log" 2>&1 &
  local rec=$!
  sleep 3
  semaphores "$pid" attached
  wait "$rec" || true
  semaphores "$pid" after
  grep -E "libc10|allocator|tensors not followed|tensors followed" "$tmp/rec.log" | sed 's/^ *//'
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

# The probes' semaphores (pytorch:malloc, pytorch:free) in process $1, from the notes of the
# libc10_cuda.so it maps and its memory.
semaphores() {
  python3 - "$1" "$2" <<'EOF'
import subprocess, sys
pid, when = int(sys.argv[1]), sys.argv[2]
maps = [l.split() for l in open(f"/proc/{pid}/maps")]
lib = next((m for m in maps if len(m) >= 6 and m[5].endswith("/libc10_cuda.so") and m[2] == "00000000"), None)
if lib is None:
    sys.exit(f"semaphores {when}: libc10_cuda.so not mapped")
notes = subprocess.run(["readelf", "-n", lib[5]], capture_output=True, text=True).stdout
sems, name = {}, None
for line in notes.splitlines():
    line = line.strip()
    if line.startswith("Name:"):
        name = line.split()[1]
    elif line.startswith("Location:") and name:
        sems[name] = int(line.split("Semaphore:")[1].strip(), 16)
if not sems:
    print(f"semaphores {when}: no USDT notes in {lib[5]}")
    sys.exit(0)
base = int(lib[0].split("-")[0], 16)
with open(f"/proc/{pid}/mem", "rb") as mem:
    values = {}
    for n, addr in sorted(sems.items()):
        mem.seek(base + addr)
        values[n] = int.from_bytes(mem.read(2), "little")
print(f"semaphores {when}: " + ", ".join(f"pytorch:{n}={v}" for n, v in values.items()))
EOF
}

echo "== the wheel as installed"
attach PYTHONUNBUFFERED=1
echo "== its libc10_cuda.so stripped (strip --strip-all), preloaded in its place"
cp "$lib" "$tmp/libc10_cuda.so"
strip --strip-all "$tmp/libc10_cuda.so"
attach LD_PRELOAD="$tmp/libc10_cuda.so" LD_LIBRARY_PATH="$site/torch/lib:$site/nvidia/cu13/lib"
