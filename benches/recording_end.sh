#!/bin/sh
# How long after its duration a whole-machine recording ends: the figures that the tests used to
# hold against a stopwatch (issue #25: a 6 s recording within 13 s, a silent debuginfod adding at
# most a second). For each case, RUNS recordings of `record -d SECONDS`, each timed from start to
# exit; prints the time past SECONDS. Cases: no debuginfod, a debuginfod that is down (connection
# refused), and one that never answers (connections accepted by the kernel, no byte back).
# Usage: benches/recording_end.sh [GPUFLAME] [RUNS] [SECONDS]
# Compare a release build (target/release/gpuflame) with the tests' debug build
# (target/debug/gpuflame), which symbolizes its own 158 MB of DWARF at the end.
set -eu
GPUFLAME=${1:-target/release/gpuflame}
RUNS=${2:-3}
SECONDS_=${3:-3}
dir=$(mktemp -d)
silent=
trap 'kill $silent 2> /dev/null; rm -rf "$dir"' EXIT

# A listener that never accepts; its port on stdout.
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)
print(s.getsockname()[1], flush=True); time.sleep(3600)' > "$dir/port" &
silent=$!
for _ in $(seq 50); do [ -s "$dir/port" ] && break; sleep 0.1; done
silent_port=$(cat "$dir/port")
down_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

now() { date +%s.%N; }
for case in none down silent; do
  case $case in
    none) urls= ;;
    down) urls=http://127.0.0.1:$down_port ;;
    silent) urls=http://127.0.0.1:$silent_port ;;
  esac
  for run in $(seq "$RUNS"); do
    cache="$dir/cache-$case-$run"
    start=$(now)
    DEBUGINFOD_URLS=$urls XDG_CACHE_HOME=$cache "$GPUFLAME" record -d "$SECONDS_" -o "$dir/out.folded" 2> "$dir/err"
    end=$(now)
    awk -v a="$start" -v b="$end" -v d="$SECONDS_" -v c="$case" -v r="$run" \
      'BEGIN { printf "%-6s run %d: ended %.2f s after its %d s\n", c, r, b - a - d, d }'
  done
done
