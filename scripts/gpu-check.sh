#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and PyTorch: records scripts/gpu_check.py (known CUDA work under
# named functions) with the CUDA profiles and prints gpuflame's figures beside PyTorch's own,
# function by function: HBM against memory_reserved() growth (both allocators), launches and GPU
# time against torch.profiler, synchronisation time against the program's clock, an induced OOM,
# the slowdown of a launch-bound loop at defaults and of a training step under --profiles all.
#
#   sudo scripts/gpu-check.sh [OUTDIR]     (GPUFLAME=path/to/gpuflame to skip the build;
#                                           GPU_CHECK_ROUNDS=N rounds of the cost at defaults, 3)
#
# Every step has its own time limit, so that one that hangs leaves the others their figures.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
exe=${GPUFLAME:-}
if [ -z "$exe" ]; then
	cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame || exit 1
	exe="$root/target/release/gpuflame"
fi
py=${PYTHON:-python3}
w="$root/scripts/gpu_check.py"
export PYTHONUNBUFFERED=1

echo "== machine: $(uname -r), $(nproc) CPUs; BTF $([ -e /sys/kernel/btf/vmlinux ] && echo yes || echo NO)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$py" -c 'import sys, torch; print("python", sys.version.split()[0], sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda)'
if ! timeout 60 "$exe" record -d 2 -o "$out/probe.folded" -- sleep 1 >"$out/probe.out" 2>&1; then
	echo "gpuflame cannot record here:"
	tail -5 "$out/probe.out"
	exit 1
fi

total() { awk '{ s += $NF } END { print s + 0 }' "$1" 2>/dev/null || echo 0; }
# under FILE PATTERN [PATTERN2]: the sum of the stacks that hold PATTERN (and PATTERN2)
under() { grep -F -- "$2" "$1" 2>/dev/null | grep -F -- "${3:-}" | awk '{ s += $NF } END { print s + 0 }'; }
val() { sed -n "s/^$2=//p" "$1" | head -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.4f", a / b; else print "n/a" }'; }
step() { # step NAME LIMIT CMD...: runs CMD with its stdout and stderr in $out/NAME.{out,err}
	local name=$1 limit=$2
	shift 2
	local start=$(date +%s.%N)
	timeout "$limit" "$@" >"$out/$name.out" 2>"$out/$name.err"
	local rc=$?
	echo "-- step $name: rc=$rc, $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
	[ $rc -eq 0 ] || tail -3 "$out/$name.err" | sed 's/^/   | /'
}
rec() { # rec NAME LIMIT PROFILES [OPTIONS...] -- CMD...
	local name=$1 limit=$2 profiles=$3
	shift 3
	step "$name" "$limit" "$exe" record -v --profiles "$profiles" -o "$out/$name.folded" "$@"
}

echo "== torch's own figures (torch.profiler per function; no gpuflame)"
step torch 120 "$py" "$w" hbm,launches,graph,sync --torch-profiler
t="$out/torch.out"

echo "== HBM, launches, synchronisation: gpuflame --cuda-exact"
rec exact 150 hbm-alloc,hbm-inuse,gpu-launches,cuda-api --cuda-exact -- "$py" "$w" hbm,launches,graph,sync,oom
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True rec expandable 120 hbm-alloc,hbm-inuse -- "$py" "$w" hbm,oom
for mode in exact expandable; do
	o="$out/$mode.out"
	echo "-- hbm-inuse per function against memory_reserved() growth ($mode)"
	for f in weights kv_cache activations small; do
		g=$(val "$o" "reserved_growth.$f")
		h=$(under "$out/$mode.hbm-inuse.folded" "$f (gpu_check.py")
		echo "   $f: torch $g, gpuflame $h (ratio $(ratio "$h" "$g"))"
	done
	echo "   whole: memory_reserved $(val "$o" memory_reserved), gpuflame hbm-inuse $(total "$out/$mode.hbm-inuse.folded"), hbm-alloc $(total "$out/$mode.hbm-alloc.folded"); $(grep -h '^snapshot_' "$o")"
	echo "   OOM: $(val "$o" oom_raised) raised; gpuflame: $(grep -h 'out of memory' "$out/$mode.err" | head -2 | cut -c1-600)"
	ls "$out"/"$mode".oom-*.svg 2>/dev/null | sed 's/^/   snapshot file: /'
done
echo "-- launches per function, --cuda-exact, against torch.profiler's kernels"
for f in add_loop mm_loop graph_replay sync_point; do
	echo "   $f: torch $(val "$t" "torch_kernels.$f") kernels, gpuflame $(under "$out/exact.gpu-launches.folded" "$f (gpu_check.py") launches"
done
echo "   leaves: $(sed 's/.*;//' "$out/exact.gpu-launches.folded" | awk '{ n = $NF; $NF = ""; s[$0] += n } END { for (k in s) printf "%s=%d; ", k, s[k] }' | cut -c1-800)"
echo "-- synchronisation: cuda-api under sync_point's synchronize against the program's clock"
echo "   program $(val "$out/exact.out" sync_ns) ns, gpuflame $(under "$out/exact.cuda-api.folded" "sync_point (gpu_check.py" Synchronize) ns"
grep -h "CUDA found and hooked\|sampled\|unknown" "$out/exact.err" | head -8 | cut -c1-300 | sed 's/^/   /'

echo "== GPU time: gpuflame gpu-time against torch.profiler's kernel time"
rec gputime 150 gpu-time -- "$py" "$w" launches,graph,sync
for f in add_loop mm_loop graph_replay sync_point; do
	a=$(val "$t" "torch_kernel_ns.$f")
	b=$(under "$out/gputime.gpu-time.folded" "$f (gpu_check.py")
	echo "   $f: torch $a ns, gpuflame $b ns (ratio $(ratio "$b" "$a"))"
done
grep -h "gpu time\|CUPTI\|records" "$out/gputime.err" | head -6 | cut -c1-300 | sed 's/^/   /'

rounds=${GPU_CHECK_ROUNDS:-3}
echo "== cost: a launch-bound loop and a training step at defaults ($rounds rounds), the step under --profiles all (2)"
for round in $(seq "$rounds"); do
	step "bare$round" 120 "$py" "$w" launchbound,train
	rec "defaults$round" 150 gpu-launches,cuda-api -- "$py" "$w" launchbound,train
	b="$out/bare$round.out" d="$out/defaults$round.out"
	for k in launchbound_us_per_launch train_step_ms_median; do
		echo "   round $round $k: bare $(val "$b" $k), defaults $(val "$d" $k) ($(ratio "$(val "$d" $k)" "$(val "$b" $k)"))"
	done
	echo "   round $round launches under launch_bound at defaults: $(under "$out/defaults$round.gpu-launches.folded" "launch_bound (gpu_check.py") (made: $(val "$d" launchbound_launches))"
done
for round in 1 2; do
	step "trainbare$round" 120 "$py" "$w" train
	rec "all$round" 200 all -- "$py" "$w" train
	k=train_step_ms_median
	echo "   round $round $k: bare $(val "$out/trainbare$round.out" $k), all $(val "$out/all$round.out" $k) ($(ratio "$(val "$out/all$round.out" $k)" "$(val "$out/trainbare$round.out" $k)"))"
	grep -h "gpu time of" "$out/all$round.err" | cut -c1-300 | sed 's/^/   /'
done

# Through PyTorch's USDT probes where the wheel has them (2.15 on; the line "tensors followed in
# … through its USDT probes" says so), by the hooks otherwise; both allocator settings.
for conf in default expandable; do
	name=tensors$([ $conf = expandable ] && echo -exp)
	echo "== tensors (tensor-inuse) against torch's allocator ($conf segments), the recording ending with them live"
	if [ $conf = expandable ]; then
		PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True rec "$name" 45 tensor-inuse,hbm-inuse -d 20 -- "$py" "$root/scripts/gpu_tensors.py" 30
	else
		rec "$name" 45 tensor-inuse,hbm-inuse -d 20 -- "$py" "$root/scripts/gpu_tensors.py" 30
	fi
	pkill -f gpu_tensors.py || true
	o="$out/$name.out"
	echo "   torch requested_bytes $(val "$o" requested_bytes), gpuflame tensor-inuse $(total "$out/$name.tensor-inuse.folded");" \
		"torch memory_reserved $(val "$o" memory_reserved), gpuflame hbm-inuse $(total "$out/$name.hbm-inuse.folded")"
	for f in load_weights allocate_kv_cache activations small_tensors; do
		echo "   $f: torch $(sed -n "s/^torch_holder=$f://p" "$o"), gpuflame $(under "$out/$name.tensor-inuse.folded" "$f (gpu_tensors.py")"
	done
	grep -h "tensors\|allocator" "$out/$name.err" | head -4 | cut -c1-300 | sed 's/^/   /'
done
echo "== a training step's tensors: bare against tensor-inuse"
for round in 1 2; do
	step "tensorbare$round" 120 "$py" "$w" train
	rec "tensortrain$round" 200 tensor-inuse -- "$py" "$w" train
	k=train_step_ms_median
	echo "   round $round $k: bare $(val "$out/tensorbare$round.out" $k), tensor-inuse $(val "$out/tensortrain$round.out" $k) ($(ratio "$(val "$out/tensortrain$round.out" $k)" "$(val "$out/tensorbare$round.out" $k)"))"
	grep -h "tensors: \|tensors followed" "$out/tensortrain$round.err" | cut -c1-300 | sed 's/^/   /'
done
echo "profiles in $out"
