#!/usr/bin/env bash
# What the CUDA launch hooks cost a launch-bound loop, on the test stand-ins for libcuda.so.1 and
# libcudart.so.13 (profiler/tests/programs/cuda): cost per hooked call, the slowdown of a loop of
# N cuLaunchKernel calls without gpuflame, with gpuflame at its defaults (duty-cycled hooks) and
# with exact counting, in the same run with rounds interleaved; and how close the sampled launch
# count comes to the true count. Then GPU time: the loop with gpuflame's CUPTI library loaded
# by hand against the stand-in libcupti (CUPTI's own cost, no gpuflame), and under
# `gpuflame record --profiles gpu-time`. MODES=... picks among none default exact cupti gputime and
# default-probes exact-probes (the hooks as kernels before uprobe sessions take them).
#
#   sudo benches/cuda_overhead.sh [N] [LAUNCH_NS] [ROUNDS]   (defaults 1000000 5000 3)
#
# LAUNCH_NS is the CPU time one launch takes without any probe; a real cuLaunchKernel takes
# 7-9 us in PyTorch on an H200 (shared/notes/cuda-on-h200.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-1000000}
launch_ns=${2:-5000}
rounds=${3:-3}
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame
exe="$root/target/release/gpuflame"
src="$root/profiler/tests/programs/cuda"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
cc -O2 -g -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 "$src/fake_cuda.c" -lpthread -ldl
cc -O2 -g -shared -fPIC -Wl,-soname,libcudart.so.13 -o libcudart.so.13 "$src/fake_cudart.c" -L. -l:libcuda.so.1 '-Wl,-rpath,$ORIGIN' -ldl -lpthread
cc -O2 -g -shared -fPIC -Wl,-soname,libcupti.so.13 -o libcupti.so.13 "$src/fake_cupti.c" -lpthread
"$exe" cupti-library "$tmp/libgpuflame_cupti.so" >/dev/null
cc -O2 -g -rdynamic -o cuda_app "$src/cuda_app.c" -L. -l:libcudart.so.13 -l:libcuda.so.1 "-Wl,-rpath,$tmp"

field() { sed -n "s/^$1=//p" "$2"; }
run() { # mode out
	case $1 in
	none) FAKE_CUDA_LAUNCH_NS=$launch_ns ./cuda_app bench "$n" >"$2" ;;
	default) "$exe" record --profiles gpu-launches -o "$2.folded" -- env FAKE_CUDA_LAUNCH_NS=$launch_ns ./cuda_app bench "$n" >"$2" 2>"$2.err" ;;
	exact) "$exe" record --profiles gpu-launches --cuda-exact -o "$2.folded" -- env FAKE_CUDA_LAUNCH_NS=$launch_ns ./cuda_app bench "$n" >"$2" 2>"$2.err" ;;
	# As on kernels before uprobe sessions (6.13): an entry and a return uprobe a function.
	default-probes) GPUFLAME_PRETEND_KERNEL_LACKS=sessions "$exe" record --profiles gpu-launches -o "$2.folded" -- env FAKE_CUDA_LAUNCH_NS=$launch_ns ./cuda_app bench "$n" >"$2" 2>"$2.err" ;;
	exact-probes) GPUFLAME_PRETEND_KERNEL_LACKS=sessions "$exe" record --profiles gpu-launches --cuda-exact -o "$2.folded" -- env FAKE_CUDA_LAUNCH_NS=$launch_ns ./cuda_app bench "$n" >"$2" 2>"$2.err" ;;
	cupti) CUDA_INJECTION64_PATH="$tmp/libgpuflame_cupti.so" GPUFLAME_CUPTI_PATH="$tmp/libcupti.so.13" FAKE_CUDA_LAUNCH_NS=$launch_ns ./cuda_app bench "$n" >"$2" 2>/dev/null ;;
	gputime) "$exe" record --profiles gpu-time -o "$2.gt.folded" -- env GPUFLAME_CUPTI_PATH="$tmp/libcupti.so.13" FAKE_CUDA_LAUNCH_NS=$launch_ns ./cuda_app bench "$n" >"$2" 2>"$2.err" ;;
	esac
}

echo "cost per hooked call (LAUNCH_NS=0, 200000 calls):"
FAKE_CUDA_LAUNCH_NS=0 ./cuda_app bench 200000 >bare0
"$exe" record --profiles gpu-launches --cuda-exact -o hooked0.folded -- env FAKE_CUDA_LAUNCH_NS=0 ./cuda_app bench 200000 >hooked0 2>/dev/null
awk -v a="$(field ns_per_launch bare0)" -v b="$(field ns_per_launch hooked0)" 'BEGIN { printf "  unprobed %.1f ns, hooked (entry + return, stack unwound) %.0f ns, cost %.0f ns per call\n", a, b, b - a }'
GPUFLAME_PRETEND_KERNEL_LACKS=sessions "$exe" record --profiles gpu-launches --cuda-exact -o probes0.folded -- env FAKE_CUDA_LAUNCH_NS=0 ./cuda_app bench 200000 >probes0 2>/dev/null
awk -v a="$(field ns_per_launch bare0)" -v b="$(field ns_per_launch probes0)" 'BEGIN { printf "  the same without uprobe sessions (an entry and a return uprobe, as before 6.13) %.0f ns, cost %.0f ns per call\n", b, b - a }'

modes=${MODES:-none default exact cupti gputime}
echo "loop of $n launches of $launch_ns ns each, $rounds rounds interleaved:"
for r in $(seq "$rounds"); do
	for mode in $modes; do
		run $mode "$mode.$r"
		s=$(field seconds "$mode.$r")
		line="  round $r $mode: ${s} s"
		if [ -f "$mode.$r.folded" ]; then
			counted=$(awk '{ s += $NF } END { print s + 0 }' "$mode.$r.folded")
			line="$line, launches counted $counted of $n ($(awk -v c="$counted" -v n="$n" 'BEGIN { printf "%+.1f%%", (c - n) * 100 / n }'))"
		fi
		echo "$line"
	done
done
for mode in $modes; do
	printf '%s ' "$mode"; for r in $(seq "$rounds"); do field seconds "$mode.$r"; done | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
done >medians
base=$(awk '$1 == "none" { print $2 }' medians)
awk -v base="$base" '{ printf "  median %-7s %.3f s (%+.2f%%)\n", $1, $2, ($2 - base) * 100 / base }' medians
