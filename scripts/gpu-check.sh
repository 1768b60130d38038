#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and PyTorch: records a real PyTorch workload (allocations of
# known sizes, bf16 matmuls, expandable segments, torch.compile) with the CUDA profiles, and prints
# the profiles' totals beside torch.cuda.memory_reserved() and the launches the workload made.
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
echo "profiles in $out"
