#!/usr/bin/env bash
# PyTorch's caching allocator in the real wheel, without a GPU (issue #23): in a CPU PyTorch
# process, gpuflame finds the allocator's methods in torch/lib/libc10_cuda.so (static symbols),
# the instructions its malloc's callers resume at, and c10::reportOutOfMemoryToProfiler in
# libc10.so, and attaches its hooks (no call happens on CPU: finding and attaching are the
# check). Then the same with a copy of libc10_cuda.so whose symbols are stripped, preloaded in
# its place: one line says the tensors cannot be followed, and why.
#
#   sudo benches/torch_allocator.sh [VENV]      (default /opt/torch-venv: `pip install torch`)
#   GPUFLAME_BIN=path/to/gpuflame to measure another build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-/opt/torch-venv}
if [ -n "${GPUFLAME_BIN:-}" ]; then
  exe=$GPUFLAME_BIN
else
  cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame
  exe="$root/target/release/gpuflame"
fi
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
  "$exe" record -v -p "$pid" --profiles tensor-inuse -d 2 -o "$tmp/t.folded" 2>&1 |
    grep -E "libc10|allocator|tensors not followed" | sed 's/^ *//'
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

echo "== the wheel as installed"
attach PYTHONUNBUFFERED=1
echo "== its libc10_cuda.so stripped (strip --strip-all), preloaded in its place"
cp "$lib" "$tmp/libc10_cuda.so"
strip --strip-all "$tmp/libc10_cuda.so"
attach LD_PRELOAD="$tmp/libc10_cuda.so" LD_LIBRARY_PATH="$site/torch/lib:$site/nvidia/cu13/lib"
