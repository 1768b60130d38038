#!/usr/bin/env bash
# The agent at a high sampling rate never dies of a signal (issue #11: `agent -F 5000` died with
# SIGBUS in 4 of ~6 runs): RUNS runs of SECONDS each against a local push sink, while a busy
# workload runs; prints each run's exit status and how it ended.
#
#   sudo benches/agent_high_rate.sh [RUNS] [SECONDS] [RATE]      (default 10 60 5000)
#   GPUFLAME_BIN=target/release/gpuflame to measure another build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-10}
secs=${2:-60}
rate=${3:-5000}
exe=${GPUFLAME_BIN:-$root/target/release/gpuflame}
[ -x "$exe" ] || { cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame; exe=$root/target/release/gpuflame; }
port=$((20000 + RANDOM % 20000))
python3 "$root/benches/push_sink.py" "$port" >/dev/null &
sink=$!
# Work to sample: Python and a shell loop, both in their own processes.
python3 -c 'import time
end = time.time() + 10**6
while time.time() < end:
    sum(i * i for i in range(1000))' &
busy=$!
trap 'kill $sink $busy 2>/dev/null || true' EXIT
sleep 0.5
died=0
for i in $(seq 1 "$runs"); do
    set +e
    timeout --preserve-status --signal=TERM --kill-after=30 "$secs" "$exe" agent --server "http://127.0.0.1:$port" -F "$rate" --window 5 >/tmp/agent-high-rate-$i.log 2>&1
    rc=$?
    set -e
    # The agent's own status: 0 after its SIGTERM at the end; 128+N is death by signal N.
    case $rc in
        0) how="ran $secs s, stopped by SIGTERM, exited cleanly" ;;
        *) how="exit status $rc"; died=$((died + 1)) ;;
    esac
    echo "run $i: $how; $(grep -E '^gpuflame agent: .* windows' /tmp/agent-high-rate-$i.log | tail -1)"
done
echo "agent -F $rate for $secs s: $died of $runs runs did not exit cleanly"
[ "$died" -eq 0 ]
