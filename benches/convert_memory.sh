#!/usr/bin/env bash
# Peak memory and time of `convert` and `diff` on a profile of N distinct stacks (issue #26: a
# million stacks took `convert` to 1.3 GB). benches/convert_stacks.py writes the folded stacks of
# a made-up training job (20 to 40 frames a stack, Python and native frames, shared prefixes,
# heavy-tailed counts); `convert` makes a pprof of them once; then each mode runs under
# `/usr/bin/time -v`, which reports its peak RSS ("Maximum resident set size") and wall time:
#   convert folded → svg, folded → pprof, pprof → svg, pprof → folded, diff pprof pprof → svg.
# The input sizes are printed first: the size of the data the peaks are measured against.
#
#   benches/convert_memory.sh [N] [DIR]        (default 1000000, a new temporary directory)
#   GPUFLAME_BIN=/path/to/gpuflame to measure another build (default: `cargo build --release
#   -p gpuflame` here). The input is kept in DIR and reused when it is there for the same N.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-1000000}
dir=${2:-$(mktemp -d)}
mkdir -p "$dir"
if [ -n "${GPUFLAME_BIN:-}" ]; then
    exe=$GPUFLAME_BIN
else
    cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame
    exe=${CARGO_TARGET_DIR:-$root/target}/release/gpuflame
fi
[ -x "$exe" ] || { echo "convert_memory: no gpuflame at $exe" >&2; exit 1; }

folded=$dir/stacks-$n.folded
pb=$dir/stacks-$n.pb.gz
if [ ! -s "$folded" ] || [ ! -s "$pb" ]; then
    python3 "$root/benches/convert_stacks.py" "$n" "$folded"
    "$exe" convert "$folded" -o "$pb" 2>/dev/null
fi
echo "input: $n distinct stacks"
echo "  folded:          $(stat -c %s "$folded") bytes"
echo "  pprof (.pb.gz):  $(stat -c %s "$pb") bytes, $(gzip -dc "$pb" | wc -c) bytes of protobuf"
echo

# One mode: its peak RSS and wall time, and the size of what it wrote.
measure() {
    local name=$1 out=$2
    shift 2
    /usr/bin/time -v "$exe" "$@" -o "$out" > /dev/null 2> "$dir/time.txt" || { cat "$dir/time.txt" >&2; exit 1; }
    local rss wall
    rss=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$dir/time.txt")
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ { print $2 }' "$dir/time.txt")
    printf '| %s | %.1f MiB | %s | %d |\n' "$name" "$(echo "$rss / 1024" | bc -l)" "$wall" "$(stat -c %s "$out")"
    rm -f "$out"
}
echo "| mode | peak RSS | wall time | bytes out |"
echo "|---|---|---|---|"
measure "convert folded → svg" "$dir/out.svg" convert "$folded"
measure "convert folded → pprof" "$dir/out.pb.gz" convert "$folded"
measure "convert pprof → svg" "$dir/out.svg" convert "$pb"
measure "convert pprof → folded" "$dir/out.folded" convert "$pb"
measure "diff pprof pprof → svg" "$dir/out.svg" diff "$pb" "$pb"
