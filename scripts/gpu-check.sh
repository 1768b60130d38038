#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and PyTorch: records a real PyTorch workload (allocations of
# known sizes, bf16 matmuls, expandable segments, torch.compile) with the CUDA profiles, and prints
# the profiles' totals beside torch.cuda.memory_reserved() and the launches the workload made; on
# two GPUs or more, a torchrun all-reduce job's collectives per rank beside what torch measured.
#
#   sudo scripts/gpu-check.sh [OUTDIR]          (GPUFLAME=path/to/gpuflame to skip the build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
exe=${GPUFLAME:-}
if [ -z "$exe" ]; then
	cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame
	exe="$root/target/release/gpuflame"
fi
python=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

total() { awk '{ s += $NF } END { print s + 0 }' "$1"; }
under() { grep -F -- "$2" "$1" | awk '{ s += $NF } END { print s + 0 }'; }

for mode in default expandable compile; do
	conf=""
	[ "$mode" = expandable ] && conf="expandable_segments:True"
	start=$(date +%s.%N)
	"$exe" record -v --profiles hbm-alloc,hbm-inuse,gpu-launches,cuda-api --cuda-exact -o "$out/$mode.folded" -- \
		env PYTORCH_CUDA_ALLOC_CONF="$conf" "$python" "$root/scripts/gpu_workload.py" "$mode" >"$out/$mode.out" 2>"$out/$mode.err"
	end=$(date +%s.%N)
	reserved=$(sed -n 's/^memory_reserved=//p' "$out/$mode.out")
	echo "== $mode (PYTORCH_CUDA_ALLOC_CONF=$conf), $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
	echo "  torch.cuda.memory_reserved() at the end: $reserved bytes"
	echo "  hbm-inuse total at exit:                 $(total "$out/$mode.hbm-inuse.folded") bytes"
	echo "    of which cudaMalloc $(under "$out/$mode.hbm-inuse.folded" ';cudaMalloc ')," \
		"cuMemCreate $(under "$out/$mode.hbm-inuse.folded" ';cuMemCreate ')," \
		"cuMemAlloc_v2 $(under "$out/$mode.hbm-inuse.folded" ';cuMemAlloc_v2 ')"
	echo "  hbm-alloc total:                         $(total "$out/$mode.hbm-alloc.folded") bytes"
	echo "  allocate_tensors in hbm-alloc:           $(under "$out/$mode.hbm-alloc.folded" 'allocate_tensors (gpu_workload.py') bytes (asked: $((1366 << 20)))"
	echo "  launches: cuLaunchKernelEx $(under "$out/$mode.gpu-launches.folded" ';cuLaunchKernelEx;')" \
		"(50 matmuls asked), cuLaunchKernel $(under "$out/$mode.gpu-launches.folded" ';cuLaunchKernel;')," \
		"cudaLaunchKernel $(under "$out/$mode.gpu-launches.folded" ';cudaLaunchKernel;'), total $(total "$out/$mode.gpu-launches.folded")"
	echo "  matmuls (gpu_workload.py) launches:      $(under "$out/$mode.gpu-launches.folded" 'matmuls (gpu_workload.py')"
	echo "  cuda-api total:                          $(total "$out/$mode.cuda-api.folded") ns"
	grep -E "CUDA found and hooked|CUDA files_hooked" "$out/$mode.err" | sed 's/^/  /' || true
done
echo "== tensors (tensor-inuse) against torch's allocator: requested bytes, reserved, top holders"
for mode in default expandable; do
	conf=""
	[ "$mode" = expandable ] && conf="expandable_segments:True"
	# The workload holds its tensors for 60 s after printing torch's figures; the recording ends
	# at 25 s with them live.
	"$exe" record -v -d 25 --profiles tensor-inuse,hbm-inuse -o "$out/tensors-$mode.folded" --memory-timeline "$out/tensors-$mode.svg" -- \
		env PYTORCH_CUDA_ALLOC_CONF="$conf" "$python" "$root/scripts/gpu_tensors.py" 60 >"$out/tensors-$mode.out" 2>"$out/tensors-$mode.err" || true
	pkill -f gpu_tensors.py || true
	echo "-- $mode (PYTORCH_CUDA_ALLOC_CONF=$conf)"
	echo "  torch requested_bytes (live tensors):  $(sed -n 's/^requested_bytes=//p' "$out/tensors-$mode.out") bytes"
	echo "  torch.cuda.memory_allocated():         $(sed -n 's/^memory_allocated=//p' "$out/tensors-$mode.out") bytes (block sizes, rounded)"
	echo "  gpuflame tensor-inuse total:           $(total "$out/tensors-$mode.tensor-inuse.folded") bytes"
	echo "  torch.cuda.memory_reserved():          $(sed -n 's/^memory_reserved=//p' "$out/tensors-$mode.out") bytes"
	echo "  gpuflame hbm-inuse total (segments):   $(total "$out/tensors-$mode.hbm-inuse.folded") bytes"
	for f in load_weights allocate_kv_cache activations small_tensors; do
		echo "  $f: torch $(sed -n "s/^torch_holder=$f://p" "$out/tensors-$mode.out") bytes, gpuflame $(under "$out/tensors-$mode.tensor-inuse.folded" "$f (gpu_tensors.py") bytes"
	done
	grep -E "HBM at the end|tensors|allocator" "$out/tensors-$mode.err" | sed 's/^/  /' || true
done
echo "== gpu-time against torch.profiler (separate runs: both are CUPTI subscribers)"
for mode in default compile; do
	"$python" "$root/scripts/gpu_workload.py" "$mode" >"$out/$mode.bare.out"
	"$python" "$root/scripts/gpu_workload.py" "$mode" --torch-profiler >"$out/$mode.torch.out"
	"$exe" record -v --profiles gpu-time -o "$out/$mode.gt.folded" -- "$python" "$root/scripts/gpu_workload.py" "$mode" >"$out/$mode.gt.out" 2>"$out/$mode.gt.err"
	torch_ns=$(sed -n 's/^torch_profiler_kernel_ns=//p' "$out/$mode.torch.out")
	ours=$(total "$out/$mode.gt.gpu-time.folded")
	bare=$(sed -n 's/^work_seconds=//p' "$out/$mode.bare.out")
	with=$(sed -n 's/^work_seconds=//p' "$out/$mode.gt.out")
	echo "-- $mode"
	echo "  torch.profiler kernel time: $torch_ns ns; gpuflame gpu-time total: $ours ns ($(awk -v a="$ours" -v b="$torch_ns" 'BEGIN { if (b > 0) printf "%+.1f%%", (a - b) * 100 / b }'))"
	echo "  work without / with gpuflame gpu-time: $bare s / $with s ($(awk -v a="$with" -v b="$bare" 'BEGIN { if (b > 0) printf "%+.1f%%", (a - b) * 100 / b }'))"
	grep -h "gpu time of\|no GPU time" "$out/$mode.gt.err" | sed 's/^/  /' || true
	echo "  top stacks:"
	sort -t' ' -k2 -nr "$out/$mode.gt.gpu-time.folded" | head -5 | awk '{ n = $NF; $NF = ""; printf "    %14d ns  %s\n", n, substr($0, length($0) > 240 ? length($0) - 240 : 1) }'
done
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
	echo "== NCCL: torchrun, 2 ranks, all-reduce of 64 MiB x 30 (the last rank slow)"
	"$exe" record -v --profiles cpu,collectives,collective-time --format pprof -o "$out/ddp.pb.gz" -- \
		"$python" -m torch.distributed.run --nproc-per-node 2 "$root/scripts/gpu_allreduce.py" 30 >"$out/ddp.out" 2>"$out/ddp.err"
	sed 's/^/  torch: /' "$out/ddp.out"
	for f in collectives collective-time; do
		"$exe" convert "$out/ddp.$f.pb.gz" -o "$out/ddp.$f.folded" 2>/dev/null
		echo "  $f under sync_gradients: $(under "$out/ddp.$f.folded" 'sync_gradients (gpu_allreduce.py')"
	done
	for r in 0 1; do
		"$exe" convert "$out/ddp.collective-time.pb.gz" --where "rank=$r" -o "$out/ddp.time.$r.folded" 2>/dev/null
		echo "  rank $r collective time: $(total "$out/ddp.time.$r.folded") ns (torch's events: wait_s above)"
	done
	grep -h "NCCL kernel records\|CUDA found and hooked" "$out/ddp.err" | sed 's/^/  /' || true
else
	echo "== NCCL: skipped, $gpus GPU(s) (the torchrun check needs two)"
fi
echo "profiles in $out"
