#!/usr/bin/env bash
# How long `gpuflame dump` takes: PROCS Python processes of THREADS threads (8 x 50 by default),
# each thread in a chain of three Python calls blocked on a lock, and with SPIN=1 one thread per
# process spinning (on a 2-CPU machine 8 spinners leave the dump a fifth of a CPU). Runs the dump
# RUNS times and prints each run's wall time and the dump's own first line.
#   sudo benches/dump_speed.sh [GPUFLAME] [PROCS] [THREADS] [RUNS]
set -euo pipefail
gpuflame=${1:-target/release/gpuflame}
procs=${2:-8}
threads=${3:-50}
runs=${4:-5}
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT
cat >"$dir/rank.py" <<'PY'
import sys, threading
lock = threading.Lock()
lock.acquire()
def spin():
    x = 0
    while True:
        x += 1
def wait_for_peer():
    lock.acquire()
def collective():
    wait_for_peer()
def worker():
    collective()
spinners = int(sys.argv[2])
for _ in range(spinners):
    threading.Thread(target=spin, daemon=True).start()
for _ in range(int(sys.argv[1]) - 1 - spinners):
    threading.Thread(target=worker, daemon=True).start()
print("ready", flush=True)
worker()
PY
for i in $(seq "$procs"); do
	/usr/bin/python3 "$dir/rank.py" "$threads" "${SPIN:-0}" >"$dir/out.$i" &
	pids+=($!)
done
for i in $(seq "$procs"); do
	for _ in $(seq 200); do grep -q ready "$dir/out.$i" 2>/dev/null && break; sleep 0.05; done
done
sleep 1
args=()
for p in "${pids[@]}"; do args+=(-p "$p"); done
for r in $(seq "$runs"); do
	start=$(date +%s.%N)
	/usr/bin/time -f 'gpuflame_cpu_s=%U+%S' -o "$dir/time" "$gpuflame" ${DUMP_FLAGS:-} dump "${args[@]}" >"$dir/dump.txt"
	end=$(date +%s.%N)
	echo "run $r: wall_s=$(echo "$start $end" | awk '{printf "%.3f", $2 - $1}') $(cat "$dir/time") $(head -1 "$dir/dump.txt")"
done
