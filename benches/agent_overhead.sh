#!/usr/bin/env bash
# The agent's CPU and memory over a long run at its default settings (whole machine, 19 Hz, 15 s
# windows), with a Python CPU workload running, measured from outside through /proc.
#
#   sudo benches/agent_overhead.sh [SECONDS]        (default 600)
#
# A local stand-in for Pyroscope (benches/push_sink.py) accepts the pushes. GPUFLAME_BIN: the
# gpuflame to measure (default: `cargo build --release -p gpuflame` here), to compare builds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-600}
exe=$("$root/benches/gpuflame-bin.sh")
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

python3 "$root/benches/push_sink.py" 14040 >"$tmp/sink.log" 2>&1 &
python3 -c "
import time
def work(n):
    return sum(i * i for i in range(n))
end = time.time() + $secs + 30
while time.time() < end:
    work(100000)
" &
sleep 1
"$exe" agent --server http://127.0.0.1:14040 >"$tmp/agent.log" 2>&1 &
agent=$!
sleep 2
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$agent/stat"; }
start_cpu=$(cpu)
start=$(date +%s.%N)
sleep "$secs"
end_cpu=$(cpu)
end=$(date +%s.%N)
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent/status")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status")
kill -TERM "$agent"
wait "$agent" || true
python3 - "$start_cpu" "$end_cpu" "$start" "$end" "$ticks" "$hwm" "$rss" <<'PY'
import sys
c0, c1, t0, t1, hz, hwm, rss = map(float, sys.argv[1:])
cpu = (c1 - c0) / hz
wall = t1 - t0
print(f"agent over {wall:.0f} s: CPU {cpu:.2f} s = {100 * cpu / wall:.3f}% of one CPU; RSS {rss / 1024:.1f} MiB (peak {hwm / 1024:.1f} MiB)")
PY
tail -1 "$tmp/agent.log"
echo "pushes received by the sink: $(grep -c 'push' "$tmp/sink.log" || true)"
