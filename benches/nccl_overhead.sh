#!/usr/bin/env bash
# What hooking NCCL's collectives costs: a loop of ncclAllReduce calls on a one-rank communicator
# of the stand-in libnccl.so.2 (profiler/tests/programs/cuda/fake_nccl.c, which launches one
# kernel per call through the stand-in driver), bare and under `gpuflame record --profiles
# collectives` (every call hooked: entry and return traps, the caller's stack unwound), rounds
# interleaved; the difference per call is the cost of one hooked collective. The stand-in cuInit
# takes 300 ms, as a real one takes hundreds: the hooks are in before the loop starts.
#
#   sudo benches/nccl_overhead.sh [N] [ROUNDS]   (defaults 100000 5)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-100000}
rounds=${2:-5}
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame
exe="${GPUFLAME_BIN:-$root/target/release/gpuflame}"
src="$root/profiler/tests/programs/cuda"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
cc -O2 -g -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 "$src/fake_cuda.c" -lpthread -ldl
cc -O2 -g -shared -fPIC -Wl,-soname,libnccl.so.2 -o libnccl.so.2 "$src/fake_nccl.c" -L. -l:libcuda.so.1 '-Wl,-rpath,$ORIGIN' -ldl -lpthread -lrt
cc -O2 -g -o nccl_loop "$root/benches/nccl_loop.c" -L. -l:libnccl.so.2 -l:libcuda.so.1 "-Wl,-rpath,$tmp"

field() { sed -n "s/^$1=//p" "$2"; }
echo "loop of $n ncclAllReduce calls, $rounds rounds interleaved (ns per call):"
for r in $(seq "$rounds"); do
	./nccl_loop "$n" >"bare.$r"
	"$exe" record --profiles collectives -o "hooked.$r.folded" -- env ./nccl_loop "$n" >"hooked.$r" 2>"hooked.$r.err"
	counted=$(awk '{ s += $NF } END { print s + 0 }' "hooked.$r.folded")
	echo "  round $r: bare $(field ns_per_call "bare.$r"), hooked $(field ns_per_call "hooked.$r"), calls counted $counted of $n"
done
median() { for r in $(seq "$rounds"); do field ns_per_call "$1.$r"; done | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
awk -v a="$(median bare)" -v b="$(median hooked)" 'BEGIN { printf "  median: bare %.0f ns, hooked %.0f ns: %.1f us per hooked collective\n", a, b, (b - a) / 1000 }'
