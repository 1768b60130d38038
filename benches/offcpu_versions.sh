#!/usr/bin/env bash
# Builds of gpuflame against each other on the service of service_overhead.sh (Python's
# http.server on CPU 0 saturated by ApacheBench on CPU 1): per round, a bare load, then one load
# per build with `record -F 99 --profiles ${PROFILES:-off-cpu,wall} -p`. Prints each run's
# requests/s, the share under [off-cpu: waits not unwound], gpuflame's CPU, the off-CPU counters
# (switches, drawn, unwound, waited_s: the time measured) and the profile's total (total_s), then
# each build's median.
#
#   sudo benches/offcpu_versions.sh ROUNDS REQUESTS NAME=BIN...
#   e.g. benches/offcpu_versions.sh 10 20000 before=/tmp/a/gpuflame after=target/release/gpuflame
# A BIN must be named gpuflame (it is stopped by name). Needs ab (apache2-utils).
set -euo pipefail
rounds=$1
requests=$2
shift 2
port=${PORT:-18764}
dir=$(mktemp -d)
server=
trap 'kill $server 2>/dev/null; rm -rf "$dir"' EXIT
mkdir "$dir/www"
head -c 4096 /dev/urandom >"$dir/www/page"
taskset -c 0 /usr/bin/python3 -m http.server --bind 127.0.0.1 --directory "$dir/www" "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/page" >/dev/null && break; sleep 0.1; done
load() { taskset -c 1 ab -q -n "$requests" -c 8 "http://127.0.0.1:$port/page" 2>/dev/null | awk '/Requests per second/ { print $4 }'; }
for r in $(seq "$rounds"); do
	echo "round $r bare $(load)"
	for v in "$@"; do
		name=${v%%=*}
		bin=${v#*=}
		/usr/bin/time -f '%U %S' -o "$dir/cpu_s" "$bin" -v record -F 99 --profiles "${PROFILES:-off-cpu,wall}" -p "$server" -o "$dir/o.folded" 2>"$dir/err" &
		tool=$!
		for _ in $(seq 300); do grep -q "unwind tables loaded" "$dir/err" && break; sleep 0.1; done
		rps=$(load)
		pkill -INT -P "$tool" gpuflame || true
		wait "$tool" || true
		off="$dir/o.off-cpu.folded"
		share=$(awk '{ t += $NF } /\[off-cpu: waits not unwound\]/ { u += $NF } END { if (t) printf "%.1f", u * 100 / t }' "$off" 2>/dev/null || true)
		counters=$(grep ' off-CPU ' "$dir/err" | grep -oE '(switches|drawn|unwound|waited_s)=[^ ]+' | tr '\n' ' ' || true)
		total=$(awk '{ t += $NF } END { printf "%.3f", t / 1e9 }' "$off" 2>/dev/null || true)
		echo "round $r $name $rps not_unwound=${share}% cpu=$(awk '{ printf "%.2f", $1 + $2 }' "$dir/cpu_s") ${counters}total_s=$total"
	done
done | tee "$dir/runs"
awk '{ v[$3] = v[$3] " " $4 } END { for (k in v) print k, v[k] }' "$dir/runs" | while read -r name vals; do
	echo "median $name $(echo $vals | tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }') requests/s"
done
