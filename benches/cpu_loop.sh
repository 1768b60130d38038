#!/bin/sh
# A CPU-bound loop alone and with `gpuflame record -p PID` attached for its whole life (CPU
# profile, -F HZ), alternating, RUNS times: the loop's own time, and gpuflame's CPU time for the
# recording (BPF load, tables, every sample through the sources, symbolization, the file).
# Usage: sudo benches/cpu_loop.sh [GPUFLAME] [RUNS] [HZ]
# Prints every run, then the medians.
set -eu
GPUFLAME=${1:-target/release/gpuflame}
RUNS=${2:-5}
HZ=${3:-999}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/spin.c" <<'C'
#include <stdio.h>
#include <time.h>
#include <unistd.h>
__attribute__((noinline)) unsigned long inner(unsigned long i) { return i * 7 + 1; }
__attribute__((noinline)) unsigned long outer(unsigned long n) { volatile unsigned long x = 0; for (unsigned long i = 0; i < n; i++) x += inner(i); return x; }
int main(int argc, char **argv) { struct timespec a, b;
  if (argc > 1) sleep(1); /* time for the profiler to attach */
  clock_gettime(CLOCK_MONOTONIC, &a);
  outer(1500000000UL);
  clock_gettime(CLOCK_MONOTONIC, &b); printf("seconds=%.3f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9); return 0; }
C
cc -O1 -o "$dir/spin" "$dir/spin.c"

for i in $(seq "$RUNS"); do
  echo "bare: $("$dir/spin" 1)"
  "$dir/spin" 1 > "$dir/out" &
  pid=$!
  /usr/bin/time -f 'gpuflame_cpu_s=%U+%S' -o "$dir/time" "$GPUFLAME" record -F "$HZ" -p "$pid" -o "$dir/o.folded" 2> "$dir/err" || { cat "$dir/err"; exit 1; }
  wait "$pid"
  echo "with: $(cat "$dir/out") $(cat "$dir/time") samples=$(awk '{ n += $NF } END { print n }' "$dir/o.folded")"
done | tee "$dir/runs"
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "median bare: $(sed -n 's/^bare: seconds=\([0-9.]*\).*/\1/p' "$dir/runs" | median) s"
echo "median with: $(sed -n 's/^with: seconds=\([0-9.]*\).*/\1/p' "$dir/runs" | median) s"
echo "median gpuflame CPU: $(sed -n 's/.*gpuflame_cpu_s=\([0-9.]*\)+\([0-9.]*\).*/\1 \2/p' "$dir/runs" | awk '{ print $1 + $2 }' | median) s"
