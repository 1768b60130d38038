#!/usr/bin/env bash
# The agent's CPU per short-lived process (issue #26): the agent at its defaults (whole machine,
# 19 Hz, 15 s windows) pushing to a local stand-in for Pyroscope, a Python CPU loop running, and
# CHURN shell loops that each start `sleep 0.005` over and over. The agent's CPU comes from
# /proc/PID/stat, the processes started from /proc/stat's `processes`, both between 2 s after
# the agent started and the end; a run without the loops gives the base to subtract.
#
#   sudo benches/churn.sh [SECONDS] [CHURN]        (default 60 2)
#   GPUFLAME_BIN=path/to/gpuflame to measure another build; PERF=1 records the agent with
#   `perf record -g` over the churn run (into PERF_DATA if set) and prints where its time went.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
churn=${2:-2}
exe=$("$root/benches/gpuflame-bin.sh")
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
port=$((20000 + RANDOM % 20000))
python3 "$root/benches/push_sink.py" "$port" >"$tmp/sink.log" 2>&1 &
python3 -c "
import time
end = time.time() + 10**6
while time.time() < end:
    sum(i * i for i in range(100000))
" &
ticks=$(getconf CLK_TCK)

# One run: the agent for $secs s with $1 churning loops; prints "cpu_s processes".
run() {
  local loops=$1 pids=() agent c0 c1 p0 p1
  "$exe" agent --server "http://127.0.0.1:$port" >"$tmp/agent-$loops.log" 2>&1 &
  agent=$!
  for _ in $(seq 1 "$loops"); do
    sh -c 'while :; do sleep 0.005; done' &
    pids+=($!)
  done
  sleep 2
  c0=$(awk '{print $14 + $15}' "/proc/$agent/stat")
  p0=$(awk '/^processes/ {print $2}' /proc/stat)
  if [ "${PERF:-0}" = 1 ] && [ "$loops" -gt 0 ]; then
    perf record -q -g -o "${PERF_DATA:-$tmp/perf.data}" -p "$agent" -- sleep "$secs" 2>/dev/null
  else
    sleep "$secs"
  fi
  c1=$(awk '{print $14 + $15}' "/proc/$agent/stat")
  p1=$(awk '/^processes/ {print $2}' /proc/stat)
  kill "${pids[@]}" 2>/dev/null || true
  kill -TERM "$agent"
  wait "$agent" || true
  echo "$(( c1 - c0 )) $(( p1 - p0 ))"
}
read -r base_ticks base_procs < <(run 0)
read -r churn_ticks churn_procs < <(run "$churn")
python3 - "$base_ticks" "$base_procs" "$churn_ticks" "$churn_procs" "$ticks" "$secs" <<'PY'
import sys
bt, bp, ct, cp, hz, secs = map(float, sys.argv[1:])
base, busy = bt / hz, ct / hz
extra = (busy - base) / max(cp - bp, 1)
print(f"without churn: agent CPU {base:.2f} s in {secs:.0f} s ({100 * base / secs:.2f}% of one CPU), {bp:.0f} processes started")
print(f"with churn:    agent CPU {busy:.2f} s in {secs:.0f} s ({100 * busy / secs:.2f}% of one CPU), {cp:.0f} processes started ({cp / secs:.0f}/s)")
print(f"per extra process: {1000 * extra:.3f} ms of agent CPU")
PY
if [ "${PERF:-0}" = 1 ]; then
  perf report -i "${PERF_DATA:-$tmp/perf.data}" --no-children --sort symbol --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -40
fi
