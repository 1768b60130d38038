#!/bin/sh
# Off-CPU profiling on a normal service: Python's http.server (a thread per connection, so it
# blocks in accept, recv and thread joins as a service does) serving a 4 KiB file to ApacheBench,
# alone and with `gpuflame record --profiles "$PROFILES" -p PID` attached, alternating, RUNS
# times. The server runs on CPU 0, the client on CPU 1. Prints requests/s of each run, the
# server's context switches/s (the recording's own count, at -v) and gpuflame's CPU time.
# Usage: benches/offcpu_service.sh [GPUFLAME] [RUNS] [REQUESTS]
# PROFILES=... records other profiles (default off-cpu,wall; cpu alone is the comparison).
# Needs ab (apt-get install apache2-utils) and python3.
set -eu
GPUFLAME=${1:-target/release/gpuflame}
RUNS=${2:-5}
REQUESTS=${3:-20000}
PORT=${PORT:-18763}
PYTHON=${PYTHON:-/usr/bin/python3}
PROFILES=${PROFILES:-off-cpu,wall}
command -v ab > /dev/null || { echo "offcpu_service: ab is needed (apt-get install apache2-utils)" >&2; exit 1; }
dir=$(mktemp -d)
server=
trap 'kill $server 2> /dev/null; rm -rf "$dir"' EXIT
mkdir "$dir/www"
head -c 4096 /dev/urandom > "$dir/www/page"

taskset -c 0 "$PYTHON" -m http.server --bind 127.0.0.1 --directory "$dir/www" "$PORT" > /dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
  curl -sf "http://127.0.0.1:$PORT/page" > /dev/null && break
  sleep 0.1
done

load() {
  taskset -c 1 ab -q -n "$REQUESTS" -c 8 "http://127.0.0.1:$PORT/page" 2> /dev/null | awk '/Requests per second/ {print "requests_per_s=" $4}'
}

for i in $(seq "$RUNS"); do
  echo "service bare:     $(load)"
  /usr/bin/time -f 'gpuflame_cpu_s=%U+%S' -o "$dir/time" "$GPUFLAME" -v record --profiles "$PROFILES" -p "$server" -o "$dir/o.folded" 2> "$dir/err" &
  gpuflame=$!
  # Sampling starts once the tables are in: the log says so.
  for _ in $(seq 100); do
    grep -q "unwind tables loaded" "$dir/err" && break
    sleep 0.1
  done
  started=$(date +%s.%N)
  result=$(load)
  ended=$(date +%s.%N)
  pkill -INT -P "$gpuflame" gpuflame  # time(1) itself ignores SIGINT
  wait "$gpuflame" || { cat "$dir/err"; exit 1; }
  switches=$(grep -o ' switches=[0-9]*' "$dir/err" | head -1 | cut -d= -f2)
  unwound=$(grep -o ' unwound=[0-9]*' "$dir/err" | head -1 | cut -d= -f2)
  rate=$(echo "${switches:-0} ${unwound:-0} $started $ended" | awk '{printf "server_switches_per_s=%.0f unwound_per_s=%.0f", $1 / ($4 - $3), $2 / ($4 - $3)}')
  echo "service $PROFILES: $result $rate $(cat "$dir/time")"
done
