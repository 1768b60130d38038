#!/usr/bin/env bash
# What profiling a real service costs it, measured as a new user would: Python's http.server (a
# thread per request: it waits in accept, recv and thread joins) serving a 4 KiB file to
# ApacheBench, both CPUs saturated (server on CPU 0, ab on CPU 1), each tool attached with -p at
# 99 Hz for the whole load, one round of every mode after another, ROUNDS rounds:
#   bare, gpuflame record (cpu), gpuflame record --profiles off-cpu,wall, perf record -g,
#   perf record --call-graph dwarf, py-spy record.
# Prints each run's requests/s, then per mode the median against bare; for off-cpu,wall also the
# share of off-CPU time left unattributed (`[off-cpu: waits not unwound]`) and gpuflame's own CPU.
#
#   sudo benches/service_overhead.sh [ROUNDS] [REQUESTS]   (defaults 5 20000)
#   GPUFLAME_BIN=… to use a built binary; MODES="bare cpu offcpu" for a subset.
# Needs ab (apache2-utils), perf (linux-perf) and py-spy (pip install py-spy).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-5}
requests=${2:-20000}
port=${PORT:-18764}
python=${PYTHON:-/usr/bin/python3}
modes=${MODES:-bare cpu offcpu perf-g perf-dwarf py-spy}
exe=${GPUFLAME_BIN:-}
if [ -z "$exe" ]; then
	cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame
	exe="$root/target/release/gpuflame"
fi
for tool in ab perf py-spy; do
	command -v "$tool" >/dev/null || { echo "service_overhead: $tool is needed" >&2; exit 1; }
done
dir=$(mktemp -d)
server=
trap 'kill $server 2>/dev/null; rm -rf "$dir"' EXIT
mkdir "$dir/www"
head -c 4096 /dev/urandom >"$dir/www/page"
taskset -c 0 "$python" -m http.server --bind 127.0.0.1 --directory "$dir/www" "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
	curl -sf "http://127.0.0.1:$port/page" >/dev/null && break
	sleep 0.1
done

load() { taskset -c 1 ab -q -n "$requests" -c 8 "http://127.0.0.1:$port/page" 2>/dev/null | awk '/Requests per second/ { print $4 }'; }

# Starts a tool on the server; returns once it samples.
start() { # mode
	case $1 in
	cpu | offcpu)
		local profiles=cpu
		[ "$1" = offcpu ] && profiles=off-cpu,wall
		/usr/bin/time -f '%U %S' -o "$dir/cpu_s" "$exe" -v record -F 99 --profiles "$profiles" -p "$server" -o "$dir/$1.folded" 2>"$dir/err" &
		tool=$!
		for _ in $(seq 300); do grep -q "unwind tables loaded" "$dir/err" && break; sleep 0.1; done
		;;
	perf-g) perf record -q -F 99 -g -p "$server" -o "$dir/perf.data" 2>/dev/null & tool=$!; sleep 1 ;;
	perf-dwarf) perf record -q -F 99 --call-graph dwarf -p "$server" -o "$dir/perf.data" 2>/dev/null & tool=$!; sleep 1 ;;
	py-spy) py-spy record -r 99 -p "$server" -o "$dir/py-spy.svg" >/dev/null 2>&1 & tool=$!; sleep 1 ;;
	esac
}

stop() { # mode
	case $1 in
	cpu | offcpu) pkill -INT -P "$tool" gpuflame || true ;;  # time(1) ignores SIGINT itself
	*) kill -INT "$tool" 2>/dev/null || true ;;
	esac
	wait "$tool" 2>/dev/null || true
}

for r in $(seq "$rounds"); do
	for mode in $modes; do
		[ "$mode" = bare ] || start "$mode"
		rps=$(load)
		[ "$mode" = bare ] || stop "$mode"
		line="round $r $mode: $rps requests/s"
		if [ "$mode" = offcpu ]; then
			off="$dir/offcpu.off-cpu.folded"
			share=$(awk '{ t += $NF } /\[off-cpu: waits not unwound\]/ { u += $NF } END { if (t) printf "%.1f", u * 100 / t }' "$off")
			line="$line, unattributed off-CPU ${share}%, gpuflame CPU $(awk '{ printf "%.2f s", $1 + $2 }' "$dir/cpu_s")"
		elif [ "$mode" = cpu ]; then
			line="$line, gpuflame CPU $(awk '{ printf "%.2f s", $1 + $2 }' "$dir/cpu_s")"
		fi
		echo "$line"
		echo "$mode $rps" >>"$dir/results"
	done
done
median() { awk -v m="$1" '$1 == m { print $2 }' "$dir/results" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
bare=$(median bare)
for mode in $modes; do
	awk -v m="$mode" -v v="$(median "$mode")" -v b="$bare" 'BEGIN { printf "median %-10s %8.0f requests/s  %.3f of bare\n", m, v, v / b }'
done
