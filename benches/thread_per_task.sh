#!/usr/bin/env bash
# gpuflame's own CPU attached to a Python that starts a thread per unit of work (the shape of
# http.server under load, without the load generator's spread): two builds side by side,
# alternating, ROUNDS each, `record -p PID -d 8`, user + sys time from /usr/bin/time.
#
#   sudo GPUFLAME_BIN=before GPUFLAME_BIN_B=after benches/thread_per_task.sh [ROUNDS]   (default 6)
#   PROFILES=off-cpu,wall for other profiles (default cpu).
set -euo pipefail
rounds=${1:-6}
a=${GPUFLAME_BIN:?the first build}
b=${GPUFLAME_BIN_B:?the second build}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
cat >"$tmp/threads.py" <<'PY'
import sys, threading, time
def work():
    s = 0
    for i in range(2000):
        s += i * i
end = time.time() + float(sys.argv[1])
while time.time() < end:
    t = threading.Thread(target=work)
    t.start()
    t.join()
PY
for r in $(seq "$rounds"); do
  for which in a b; do
    exe=$a; [ "$which" = b ] && exe=$b
    taskset -c 0 python3 "$tmp/threads.py" 12 &
    py=$!
    sleep 0.5
    /usr/bin/time -f "%U %S" -o "$tmp/time" "$exe" record -p "$py" -d 8 --profiles "${PROFILES:-cpu}" -o "$tmp/out.folded" 2>/dev/null
    wait "$py"
    read -r user sys <"$tmp/time"
    echo "round $r $which: $(awk "BEGIN { print $user + $sys }") s (user $user, sys $sys)"
  done
done
