#!/usr/bin/env bash
# The work at a window's end for threads that wait: PROCS Python processes of THREADS threads each,
# every thread blocked on a lock since before the attach (10 x 1000 = 10,000 by default), recorded
# with `record --profiles off-cpu,wall -d SECONDS`. Each pass of the task iterator is logged (-vv):
# the threads reported, the iterator's time, the stacks read from user space and their time, and
# the pass's whole time; the pass at the start reads what its budget (250 ms) allows, the one at
# the end the rest. Prints those lines and the run's totals.
#   sudo benches/waiting_threads.sh [GPUFLAME] [PROCS] [THREADS] [SECONDS]
set -euo pipefail
gpuflame=${1:-target/release/gpuflame}
procs=${2:-10}
threads=${3:-1000}
seconds=${4:-5}
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT
cat >"$dir/waiters.py" <<'PY'
import sys, threading
threading.stack_size(64 * 1024)
lock = threading.Lock()
lock.acquire()
def wait_for_peer():
    lock.acquire()
for _ in range(int(sys.argv[1]) - 1):
    threading.Thread(target=wait_for_peer, daemon=True).start()
print("ready", flush=True)
wait_for_peer()
PY
for _ in $(seq "$procs"); do
	/usr/bin/python3 "$dir/waiters.py" "$threads" >"$dir/out.$_" &
	pids+=($!)
done
for p in "${pids[@]}"; do
	for _ in $(seq 200); do grep -q ready "$dir/out.$_" 2>/dev/null && break; sleep 0.05; done
done
sleep 1
args=()
for p in "${pids[@]}"; do args+=(-p "$p"); done
start=$(date +%s.%N)
/usr/bin/time -f 'gpuflame_cpu_s=%U+%S' "$gpuflame" -vv record --profiles off-cpu,wall "${args[@]}" -d "$seconds" -o "$dir/o.folded" 2>"$dir/err" || { tail -20 "$dir/err"; exit 1; }
end=$(date +%s.%N)
grep -E "targets' threads reported|threads waiting at the windows|gpuflame_cpu_s" "$dir/err" | sed 's/^.*DEBUG [^ ]* //; s/^.*INFO [^ ]* //'
echo "threads=$((procs * threads)) wall_s=$(echo "$start $end" | awk '{printf "%.2f", $2 - $1}') off_cpu_total_s=$(awk '{s += $NF} END {printf "%.1f", s / 1e9}' "$dir/o.off-cpu.folded")"
