#!/usr/bin/env bash
# A node that looks like a GPU node, on CPUs (issue #26): K training ranks of the PyPI torch wheel,
# each with W DataLoader worker processes (K × (W + 1) processes mapping all of torch), then
#   1. `gpuflame record -d SECONDS` of the whole machine at its defaults: user stacks complete,
#      peak RSS and CPU (/usr/bin/time), BPF kernel memory for tables (-v);
#   2. `gpuflame agent --window 3` for SECONDS against benches/node_sink.py, which keeps each
#      window's CPU profiles: user stacks complete window by window (so after the first 3 s),
#      peak RSS, CPU, and the memory of its BPF maps (memlock of its map descriptors).
#
#   sudo benches/node.sh [K] [W] [SECONDS]        (default 4 2 15)
#   GPUFLAME_BIN: the gpuflame to measure (default: `cargo build --release` here);
#   GPUFLAME_TORCH_VENV: a venv with torch (default /opt/torch-venv). Never run in CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
k=${1:-4}
w=${2:-2}
secs=${3:-15}
venv=${GPUFLAME_TORCH_VENV:-/opt/torch-venv}
exe=$("$root/benches/gpuflame-bin.sh")
"$venv/bin/python" -c 'import torch' || { echo "no torch in $venv (python3 -m venv $venv && $venv/bin/pip install torch)"; exit 1; }
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

for i in $(seq 1 "$k"); do
  "$venv/bin/python" "$root/benches/node_rank.py" "$w" >"$tmp/rank-$i.out" 2>&1 &
done
for _ in $(seq 1 600); do
  [ "$(cat "$tmp"/rank-*.out | grep -c '^warm')" -ge "$k" ] && break
  sleep 0.5
done
echo "node: $k ranks × $w workers warm ($(pgrep -fc node_rank.py) processes)"

# Share of user stacks with no marker (where unwinding stopped), in folded files.
complete() {
  python3 - "$@" <<'PY'
import collections
import sys
total = whole = 0
why = collections.Counter()
for path in sys.argv[1:]:
    for line in open(path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        user = [f for f in frames[1:] if not f.endswith("_[k]") and not f.startswith("thread:")]
        if user:
            total += int(count)
            # A Python process's frames are spliced above the native ones: where native
            # unwinding stopped, the marker is under them, not at the root.
            marker = next((f for f in user if f.startswith("[native") or f == "[truncated]"), None)
            if marker:
                why[f"{frames[0]} {marker}"] += int(count)
            else:
                whole += int(count)
incomplete = ", ".join(f"{what} {100 * n / max(total, 1):.1f}%" for what, n in why.most_common(4))
print(f"{100 * whole / max(total, 1):.1f}% of {total} user stacks complete" + (f"; incomplete: {incomplete}" if why else ""))
PY
}

echo "== record -d $secs (whole machine, defaults)"
/usr/bin/time -f "time: rss_kib=%M user_s=%U sys_s=%S" "$exe" record -d "$secs" -v -o "$tmp/node.folded" 2>"$tmp/record.log" || true
grep -E "^gpuflame: |^time: " "$tmp/record.log"
grep -oE "kernel_bytes=[0-9]+|rows_in_use=[0-9]+" "$tmp/record.log" | tr '\n' ' '; echo
echo -n "all processes: "; complete "$tmp/node.folded"

echo "== agent --window 3 for $secs s"
port=$((20000 + RANDOM % 20000))
python3 "$root/benches/node_sink.py" "$port" "$tmp/pushed" &
sleep 0.5
"$exe" agent --server "http://127.0.0.1:$port" --window 3 >"$tmp/agent.log" 2>&1 &
agent=$!
sleep "$secs"
maps=0
for fd in /proc/$agent/fdinfo/*; do
  m=$(awk '/^memlock:/ {print $2}' "$fd" 2>/dev/null || true)
  maps=$((maps + ${m:-0}))
done
ticks=$(getconf CLK_TCK)
cpu=$(awk -v t="$ticks" '{printf "%.2f", ($14 + $15) / t}' "/proc/$agent/stat")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent/status")
# Where its RSS is at the end, by mapping: anonymous memory (the heap), the symbol copies'
# memfds, its own binary, the ring buffers, libraries.
rss_by=$(awk '/^[0-9a-f]+-[0-9a-f]+ / { name = ($6 == "") ? "[anonymous]" : $6; if (name ~ /^\/memfd:/) name = "memfd:" substr($6, 8); if (name ~ /gpuflame$/) name = "gpuflame (binary)"; next }
  /^Rss:/ { rss[name] += $2 } END { for (n in rss) if (rss[n] >= 512) printf "%.1f MiB %s\n", rss[n] / 1024, n }' "/proc/$agent/smaps" | sort -rn | head -6 | paste -sd';' | sed 's/;/; /g')
kill -TERM "$agent"; wait "$agent" || true
echo "agent: peak RSS $((hwm / 1024)) MiB; BPF maps $((maps / 1048576)) MiB (memlock of its map descriptors); CPU ${cpu} s in ${secs} s"
echo "agent RSS at the end, by mapping: $rss_by"
# The pushes of one window arrive together: grouped by the second they came in, 3 s apart.
start=$(head -1 "$tmp/pushed/pushes.txt" | awk '{print $2}')
for window in $(awk -v s="$start" '{print int(($2 - s + 1.5) / 3)}' "$tmp/pushed/pushes.txt" | sort -un); do
  folded=()
  for push in $(awk -v s="$start" -v w="$window" 'int(($2 - s + 1.5) / 3) == w {print $1}' "$tmp/pushed/pushes.txt"); do
    for f in "$tmp/pushed/$(printf %04d "$push")"-*.pb.gz; do
      [ -e "$f" ] && "$exe" convert "$f" -o "$f.folded" 2>/dev/null && folded+=("$f.folded")
    done
  done
  [ "${#folded[@]}" -gt 0 ] || continue
  echo -n "window pushed at +$((window * 3)) s: "; complete "${folded[@]}"
done
