#!/bin/sh
# Complete user stacks of a machine whose shells start short commands (issue #26): two shells run
# `while :; do /bin/true; done` and `while :; do ls / > /dev/null; done`; a whole-machine
# `record -d 2 -F 999 -v` writes folded stacks; benches/short_lived_roots.py sorts the user stacks
# by why they end: complete, or the marker at their root and what it is about.
# Usage: sudo benches/short_lived.sh [GPUFLAME] [OUT.folded]
set -eu
GPUFLAME=${1:-target/debug/gpuflame}
OUT=${2:-/tmp/short_lived.folded}
here=$(dirname "$0")
bash -c 'while :; do /bin/true; done' &
a=$!
bash -c 'while :; do ls / > /dev/null; done' &
b=$!
trap 'kill $a $b 2> /dev/null' EXIT
sleep 0.5
"$GPUFLAME" record -d 2 -F 999 -v -o "$OUT" 2> "$OUT.log"
kill $a $b
grep 'of user stacks complete' "$OUT.log"
grep -o 'process_events_lost=[0-9]*' "$OUT.log" | head -1
python3 "$here/short_lived_roots.py" "$OUT"
