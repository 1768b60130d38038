#!/usr/bin/env bash
# The kernel memory of the live set of device memory (live_allocations.h, issue #55) with N
# tensors live, under `gpuflame record --profiles tensor-inuse`: the map's memory as the kernel
# counts it (bpftool's memlock: its buckets, allocated with it, and its elements, as they come),
# and the tensor-inuse profile's total, which must be N x 512 (every entry read back at the
# window's end). Up to 100,000 the tensors are the stand-in allocator's (profiler/tests/programs/
# cuda, tensor_app hold N: 512-byte tensors through pytorch:malloc; its own bookkeeping is
# quadratic, 15 s for 100,000); past that, a program puts N entries of 512 bytes into the map
# itself, by the bpf system call, as the programs would (the same elements, of a process whose
# stacks were never sent: `[stack not read]`).
#
#   sudo benches/live_set_memory.sh [N...]        (default 100000 1000000)
#   GPUFLAME_BIN=path/to/gpuflame to measure another build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
counts=("${@:-100000 1000000}")
read -ra counts <<<"${counts[*]}"
exe=$("$root/benches/gpuflame-bin.sh")
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
cat >fill.c <<'EOF'
#include <linux/bpf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
/* fill MAP_ID N: N tensors of 512 bytes into the live set, as this process's; then waits on stdin. */
struct key { uint32_t pid, tensor; uint64_t addr; };
struct value { uint64_t size, stack, t_ns, stream, freed_ns; uint32_t tid; uint16_t api; uint8_t device, flags; };
int main(int argc, char **argv)
{
	union bpf_attr a;
	memset(&a, 0, sizeof(a));
	a.map_id = atoi(argv[1]);
	int fd = syscall(SYS_bpf, BPF_MAP_GET_FD_BY_ID, &a, sizeof(a));
	if (fd < 0) { perror("map"); return 1; }
	long n = atol(argv[2]);
	struct value v = { .size = 512, .api = 58 /* C10_MALLOC */ };
	for (long i = 0; i < n; i++) {
		struct key k = { .pid = getpid(), .tensor = 1, .addr = 0x7f0000000000ULL + i * 512 };
		memset(&a, 0, sizeof(a));
		a.map_fd = fd; a.key = (uint64_t)&k; a.value = (uint64_t)&v; a.flags = BPF_NOEXIST;
		if (syscall(SYS_bpf, BPF_MAP_UPDATE_ELEM, &a, sizeof(a))) { perror("update"); return 1; }
	}
	printf("held=%ld\n", n);
	fflush(stdout);
	getchar();
	return 0;
}
EOF
cc -O2 -o fill fill.c
printf '%-10s %-16s %-12s %-10s %s\n' tensors "kernel memory" "per tensor" "read (ms)" "tensor-inuse total"
for n in "${counts[@]}"; do
  rm -f out.txt in.folded
  if [ "$n" -le 100000 ]; then
    LINGER_MS=4000 "$exe" -v record --profiles tensor-inuse --memory-timeline none -o in.folded -- ./tensor_app hold "$n" >out.txt 2>rec.log &
    rec=$!
    for _ in $(seq 600); do grep -q '^held=' out.txt 2>/dev/null && break; sleep 0.1; done
  else
    "$exe" -v record --profiles tensor-inuse --memory-timeline none -o in.folded -d 20 2>rec.log &
    rec=$!
    sleep 5
    id=$(bpftool map show name live_allocation | sed -n 's/^\([0-9]*\): .*/\1/p' | head -1)
    rm -f hold.fifo
    mkfifo hold.fifo
    ./fill "$id" "$n" <hold.fifo >out.txt &
    fill=$!
    exec 9>hold.fifo
    for _ in $(seq 1200); do grep -q '^held=' out.txt 2>/dev/null && break; sleep 0.1; done
  fi
  sleep 0.5
  # The map's name, as the kernel keeps it: 15 characters.
  memlock=$(bpftool map show name live_allocation | sed -n 's/.*memlock \([0-9]*\)B.*/\1/p' | head -1)
  wait $rec
  if [ "$n" -gt 100000 ]; then
    exec 9>&-
    wait $fill
  fi
  grep -E "a full ring lost|were not kept" rec.log >&2 || true
  read_ms=$(grep "live set of device memory read" rec.log | tail -1 | sed -n 's/.* ms=\([0-9.]*\).*/\1/p')
  total=$(awk '{s += $NF} END {print s + 0}' in.folded)
  printf '%-10s %-16s %-12s %-10s %s\n' "$n" "$memlock B" "$((memlock / n)) B" "${read_ms%.*}" "$total (expected $((n * 512)), $((total / 512)) tensors)"
done
