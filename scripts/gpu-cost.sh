#!/usr/bin/env bash
# What gpuflame costs a CUDA program, for issue "The GPU half on the H200" (BENCHMARKS.md, "CUDA on
# a real H200"), on a machine with an NVIDIA GPU and PyTorch:
#   launch  the launch-bound loop at defaults (gpu-launches,cuda-api), in ONE process, pinned to a
#           CPU, with gpuflame attached (-p) in every other window: AB_PAIRS pairs of WINDOW_S
#           windows, the slowdown's median and its 95% interval (scripts/ab_windows.py)
#   train   the same for a training step, at defaults and with --profiles all
#   decode  a small transformer's decode loop (batch 1 and 32, eager and CUDA graph): tokens/s
#           bare, with the CUPTI library alone (CUDA_INJECTION64_PATH, no gpuflame), under
#           `record --profiles gpu-time`, and beside the agent at its defaults; DECODE_ROUNDS
#           rounds, the order rotated each round
#   agent   the agent at its defaults for AGENT_S beside the training step, pushing to a local
#           receiver that decodes every series (scripts/series_sink.py): its CPU and RSS
#
#   sudo scripts/gpu-cost.sh [SECTIONS] [OUTDIR]     SECTIONS: launch,train,decode,agent (all)
#
# Why one process for A/B: from one process to the next the same loop ran at 6.7 to 9.7 us a
# launch, more than the 2% being measured; inside one process, each attached window is set
# against the bare windows on either side. 12 pairs: with the spread of pairs seen on this kind of
# loop (a few tenths of a point), the median's 95% interval comes out under 1 point; the script
# prints the interval's width, and more pairs (AB_PAIRS) narrow it where it does not.
# Time on an H200 with a prebuilt gpuflame (GPUFLAME=…): launch ~2 min, train ~4 min, decode
# ~3 min, agent AGENT_S + 20 s. DEVICE=cpu runs it all on the CPU, to try the script without a GPU.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sections=${1:-launch,train,decode,agent}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
exe=${GPUFLAME:-}
if [ -z "$exe" ]; then
	cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame || exit 1
	exe="$root/target/release/gpuflame"
fi
py=${PYTHON:-python3}
dev=${DEVICE:-cuda}
w="$root/scripts/gpu_cost.py"
pairs=${AB_PAIRS:-12}
win=${WINDOW_S:-4}
settle=${SETTLE_S:-2}
ncpu=$(nproc)
work_cpu=$((ncpu > 2 ? 2 : 0))
tool_cpus=$([ "$ncpu" -gt 4 ] && echo "4-$((ncpu - 1))" || echo "0-$((ncpu - 1))")
export PYTHONUNBUFFERED=1
has() { [[ ",$sections," == *",$1,"* ]]; }
val() { sed -n "s/^$2=//p" "$1" | head -1; }
now() { date +%s%N; }
# Stops a Python program by its command line: "$py" may be a shim (pyenv) whose pid is not the
# interpreter's, and a kill of the shim leaves the program running.
stop_py() { pkill -TERM -f "$1" 2>/dev/null; sleep 0.5; pkill -KILL -f "$1" 2>/dev/null; true; }
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }

echo "== $(uname -r), $ncpu CPUs; workload on CPU $work_cpu, gpuflame on $tool_cpus; device $dev; $(date -u +%FT%TZ)"
[ "$dev" = cuda ] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'

# ab NAME KIND PROFILES...: the workload KIND in one process, gpuflame attached with PROFILES in
# every other window.
ab() {
	local name=$1 kind=$2
	shift 2
	local ticks="$out/$name.ticks" marks="$out/$name.marks"
	: >"$marks"
	taskset -c "$work_cpu" "$py" "$w" ticks "$kind" 3600 --device "$dev" >"$ticks" 2>"$out/$name.err" &
	local pid=$!
	local deadline=$((SECONDS + 120))
	until grep -q '^tick' "$ticks" 2>/dev/null; do
		if ! kill -0 $pid 2>/dev/null || [ $SECONDS -gt $deadline ]; then echo "   $name: the workload did not start"; tail -3 "$out/$name.err"; return; fi
		sleep 0.2
	done
	sleep "$win" # warm-up, not measured
	for i in $(seq "$pairs"); do
		local s=$(now)
		sleep "$win"
		echo "bare $s $(now)" >>"$marks"
		s=$(now)
		taskset -c "$tool_cpus" "$exe" record -p "$pid" -d "$win" "$@" -o "$out/$name.$i.folded" 2>"$out/$name.$i.err" >/dev/null
		echo "attached $s $(now)" >>"$marks"
	done
	local s=$(now)
	sleep "$win"
	echo "bare $s $(now)" >>"$marks"
	stop_py "gpu_cost.py ticks $kind"
	wait $pid 2>/dev/null
	"$py" "$root/scripts/ab_windows.py" "$ticks" "$marks" "$settle" >"$out/$name.ab"
	echo "   $name ($*): slowdown median $(val "$out/$name.ab" slowdown_pct_median)%, 95% interval $(val "$out/$name.ab" slowdown_pct_ci95) (width $(val "$out/$name.ab" ci95_width_points) points), $(val "$out/$name.ab" pairs) pairs"
	grep -h "gpuflame:" "$out/$name.1.err" | head -3 | cut -c1-300 | sed 's/^/   | /'
}

if has launch; then
	echo "== launch-bound loop, one process, defaults attached in every other ${win}s window"
	ab launch launches --profiles gpu-launches,cuda-api
	# Launch counts at defaults against the launches made in the same windows.
	"$py" - "$out" "$pairs" "$settle" <<'PY'
import glob, os, sys
out, pairs = sys.argv[1], int(sys.argv[2])
ticks = [(int(f[1]), int(f[2])) for f in (l.split() for l in open(f"{out}/launch.ticks")) if len(f) == 3 and f[0] == "tick"]
marks = [l.split() for l in open(f"{out}/launch.marks")]
attached = [(int(s), int(e)) for k, s, e in marks if k == "attached"]
for i, (s, e) in enumerate(attached, 1):
    path = f"{out}/launch.gpu-launches.{i}.folded"  # what `record -o launch.I.folded` names that profile
    counted = sum(int(l.rsplit(" ", 1)[1]) for l in open(path) if l.strip()) if os.path.exists(path) else 0
    inside = [d for t, d in ticks if s <= t <= e]
    made = inside[-1] - inside[0] if len(inside) > 1 else 0
    print(f"   window {i}: gpu-launches {counted}, launches made while attached at most {made} ({counted / made if made else 0:.3f})")
PY
fi

if has train; then
	echo "== training step, one process: defaults, then --profiles all, attached in every other ${win}s window"
	ab train train --profiles gpu-launches,cuda-api
	ab trainall train --profiles all
fi

if has decode; then
	echo "== decode loop: tokens/s bare, CUPTI library alone, record --profiles gpu-time, beside the agent"
	lib="$out/libgpuflame_cupti.so"
	"$exe" cupti-library "$lib" >/dev/null 2>&1 || echo "   (no CUPTI library: $exe cupti-library failed)"
	secs=${DECODE_S:-2}
	timeout 120 "$py" "$w" decode "$secs" --device "$dev" --kernels >"$out/decode.kernels" 2>&1
	grep -h "^decode_kernels" "$out/decode.kernels" | sed 's/^/   /'
	conds=(bare cupti gputime agent)
	for round in $(seq "${DECODE_ROUNDS:-3}"); do
		for k in 0 1 2 3; do
			c=${conds[$(((k + round) % 4))]}
			o="$out/decode.$c.$round.out"
			case $c in
			bare) taskset -c "$work_cpu" "$py" "$w" decode "$secs" --device "$dev" >"$o" 2>&1 ;;
			cupti) CUDA_INJECTION64_PATH="$lib" taskset -c "$work_cpu" "$py" "$w" decode "$secs" --device "$dev" >"$o" 2>&1 ;;
			gputime) taskset -c "$tool_cpus" "$exe" record --profiles gpu-time -o "$out/decode.$round.folded" -- taskset -c "$work_cpu" "$py" "$w" decode "$secs" --device "$dev" >"$o" 2>"$out/decode.gputime.$round.err" ;;
			agent)
				"$py" "$root/benches/push_sink.py" 14051 >/dev/null 2>&1 &
				sink=$!
				taskset -c "$tool_cpus" "$exe" agent --server http://127.0.0.1:14051 >"$out/decode.agent.$round.err" 2>&1 &
				agent=$!
				sleep 3
				taskset -c "$work_cpu" "$py" "$w" decode "$secs" --device "$dev" >"$o" 2>&1
				kill -TERM $agent 2>/dev/null
				wait $agent 2>/dev/null
				stop_py "push_sink.py 14051"
				wait $sink 2>/dev/null
				;;
			esac
		done
	done
	"$py" - "$out" "${DECODE_ROUNDS:-3}" <<'PY'
import glob, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rates(cond):
    got = {}
    for r in range(1, rounds + 1):
        for line in open(f"{out}/decode.{cond}.{r}.out", errors="replace"):
            if line.startswith("decode_tokens_per_s."):
                key, value = line.strip().split("=")
                got.setdefault(key.split(".", 1)[1], []).append(float(value))
    return got
bare = rates("bare")
for cond in ("cupti", "gputime", "agent"):
    other = rates(cond)
    for key, values in sorted(bare.items()):
        b, o = statistics.median(values), statistics.median(other.get(key, [float("nan")]))
        print(f"   {key}: bare {b:.1f} tok/s (runs {', '.join(f'{v:.0f}' for v in values)}), {cond} {o:.1f} ({100 * (b / o - 1):+.2f}% slower; runs {', '.join(f'{v:.0f}' for v in other.get(key, []))})")
PY
fi

if has agent; then
	secs=${AGENT_S:-120}
	echo "== the agent at its defaults for ${secs}s beside the training step, pushing to a decoding receiver"
	"$py" "$root/scripts/series_sink.py" 14052 >"$out/sink.out" 2>&1 &
	sink=$!
	taskset -c "$work_cpu" "$py" "$w" ticks train $((secs + 60)) --device "$dev" >"$out/agent.ticks" 2>"$out/agent.train.err" &
	work=$!
	sleep 10
	taskset -c "$tool_cpus" "$exe" agent --server http://127.0.0.1:14052 >"$out/agent.err" 2>&1 &
	agent=$!
	sleep 2
	c0=$(cpu_s $agent)
	t0=$(now)
	sleep "$secs"
	c1=$(cpu_s $agent)
	t1=$(now)
	rss=$(awk '/VmRSS/ { print $2 }' "/proc/$agent/status")
	hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$agent/status")
	kill -TERM $agent
	wait $agent
	stop_py "gpu_cost.py ticks train"
	wait $work 2>/dev/null
	# SIGTERM makes the receiver print what it decoded; no KILL after it until it has.
	pkill -TERM -f "series_sink.py 14052"
	for _ in $(seq 20); do grep -q '^pushes=' "$out/sink.out" && break; sleep 0.2; done
	stop_py "series_sink.py 14052"
	wait $sink 2>/dev/null
	awk -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v rss="$rss" -v hwm="$hwm" 'BEGIN {
		w = (t1 - t0) / 1e9; printf "   agent: CPU %.2f s over %.0f s = %.2f%% of one CPU; RSS %.1f MiB (peak %.1f MiB)\n", c1 - c0, w, 100 * (c1 - c0) / w, rss / 1024, hwm / 1024 }'
	sed 's/^/   /' "$out/sink.out"
	grep -h "WARN\|ERROR" "$out/agent.err" | sort | uniq -c | head -5 | cut -c1-300 | sed 's/^/   | /'
fi
echo "figures in $out"
