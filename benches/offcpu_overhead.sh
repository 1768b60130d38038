#!/bin/sh
# Off-CPU profiling overhead: a pipe ping-pong between two threads pinned to one CPU (every pass a
# context switch) and a CPU-bound loop, each run alone and with `gpuflame record --profiles off-cpu
# -p PID` attached for its whole life, alternating, RUNS times. Prints every run and gpuflame's own
# CPU time (gpuflame is not the workload's parent, so its time is its own).
# Usage: benches/offcpu_overhead.sh [GPUFLAME] [RUNS]
# PINGPONG_WORK=N: busy-work iterations before each pass (default 0: as many switches as the
# machine can make; ~5000 brings a 2-vCPU VM down to ~250k switches/s).
set -eu
GPUFLAME=${1:-target/release/gpuflame}
RUNS=${2:-5}
WORK=${PINGPONG_WORK:-0}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cc -O2 -pthread -o "$dir/pingpong" "$(dirname "$0")/offcpu_pingpong.c"
cat > "$dir/spin.c" <<'C'
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) { struct timespec a, b; volatile unsigned long x = 0;
  if (argc > 1) sleep(1); /* time for the profiler to attach */
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (unsigned long i = 0; i < 1500000000UL; i++) x += i;
  clock_gettime(CLOCK_MONOTONIC, &b); printf("seconds=%.3f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9); return 0; }
C
cc -O1 -o "$dir/spin" "$dir/spin.c"

# attached NAME COMMAND...: runs COMMAND (which waits 1 s before its timed part) with gpuflame
# attached; prints the command's output and gpuflame's CPU time.
attached() {
  "$@" > "$dir/out" &
  pid=$!
  /usr/bin/time -f 'gpuflame_cpu_s=%U+%S' -o "$dir/time" "$GPUFLAME" record --profiles off-cpu -p "$pid" -o "$dir/o.folded" 2> "$dir/err" || { cat "$dir/err"; exit 1; }
  wait "$pid"
  echo "$(cat "$dir/out") $(cat "$dir/time")"
}

for i in $(seq "$RUNS"); do
  echo "pingpong bare:    $(taskset -c 0 "$dir/pingpong" 600000 1 "$WORK")"
  echo "pingpong off-cpu: $(attached taskset -c 0 "$dir/pingpong" 600000 1 "$WORK")"
  echo "spin bare:        $("$dir/spin" 1)"
  echo "spin off-cpu:     $(attached "$dir/spin" 1)"
done
