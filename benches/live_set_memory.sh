#!/usr/bin/env bash
# The kernel memory of the live set of device memory (live_allocations.h, issue #55) with N
# tensors live: the stand-in allocator (profiler/tests/programs/cuda) holds N tensors of 512 bytes
# under `gpuflame record --profiles tensor-inuse`; once they are held, the map's memory as the
# kernel counts it (bpftool's memlock: what its elements take, the map being allocated as it
# fills) and its entries; then the tensor-inuse profile's total, which must be N x 512.
#
#   sudo benches/live_set_memory.sh [N...]        (default 100000 1000000)
#   GPUFLAME_BIN=path/to/gpuflame to measure another build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
counts=("${@:-100000 1000000}")
read -ra counts <<<"${counts[*]}"
if [ -n "${GPUFLAME_BIN:-}" ]; then
  exe=$GPUFLAME_BIN
else
  cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame
  exe="$root/target/release/gpuflame"
fi
command -v bpftool >/dev/null || { echo "bpftool is needed (apt install bpftool)" >&2; exit 1; }
src="$root/profiler/tests/programs/cuda"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
cc -O2 -g -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 "$src/fake_cuda.c" -lpthread -ldl
cc -O2 -g -shared -fPIC -Wl,-soname,libcudart.so.13 -o libcudart.so.13 "$src/fake_cudart.c" -L. -l:libcuda.so.1 '-Wl,-rpath,$ORIGIN' -ldl -lpthread
c++ -O2 -g -shared -fPIC -Wl,-soname,libc10.so -o libc10.so "$src/fake_c10.cpp"
c++ -O2 -g -shared -fPIC -fvisibility=hidden -DGF_SDT -Wl,-soname,libc10_cuda.so -o libc10_cuda.so "$src/fake_c10_cuda.cpp" -L. -l:libcudart.so.13 -l:libc10.so "-Wl,-rpath,$tmp" -lpthread
c++ -O2 -g -rdynamic -o tensor_app "$src/tensor_app.cpp" -L. -l:libc10_cuda.so "-Wl,-rpath,$tmp"
printf '%-10s %-16s %-12s %s\n' tensors "kernel memory" "per tensor" "tensor-inuse total"
for n in "${counts[@]}"; do
  rm -f out.txt in.folded
  LINGER_MS=4000 "$exe" record --profiles tensor-inuse --memory-timeline none -o in.folded -- ./tensor_app hold "$n" >out.txt 2>rec.log &
  rec=$!
  for _ in $(seq 600); do grep -q '^held=' out.txt 2>/dev/null && break; sleep 0.1; done
  sleep 0.5
  # The map's name, as the kernel keeps it: 15 characters.
  memlock=$(bpftool map show name live_allocatio | sed -n 's/.*memlock \([0-9]*\)B.*/\1/p' | head -1)
  wait $rec
  total=$(awk '{s += $NF} END {print s + 0}' in.folded)
  printf '%-10s %-16s %-12s %s\n' "$n" "$memlock B" "$((memlock / n)) B" "$total (expected $((n * 512)), $((total / 512)) tensors)"
done
