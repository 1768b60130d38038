#!/usr/bin/env bash
# What the CPU sampler's program costs a sample of a deep Python stack: Debian's python3.11 runs a
# recursion 27 Python frames deep (rec(25) calling a loop); `gpuflame record -F 999 -p PID -d 6`
# follows it; the kernel's count (kernel.bpf_stats_enabled=1, read 5.5 s in) gives on_cpu_sample's
# run time over its runs. Each build given, alternating, ROUNDS times. SHAPE (below) picks the
# Python frames.
#
#   sudo benches/python_sampler_cost.sh ROUNDS BIN [BIN...]
#   PY=path/to/python to use another interpreter.
set -euo pipefail
rounds=${1:?rounds}
shift
py=${PY:-/usr/bin/python3.11}
tmp=$(mktemp -d)
before=$(sysctl -n kernel.bpf_stats_enabled)
trap 'sysctl -qw kernel.bpf_stats_enabled=$before; kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
sysctl -qw kernel.bpf_stats_enabled=1
# SHAPE: the Python frames over the loop, 27 or 28. recursion: rec() 25 deep, one code object;
# distinct: 26 functions, each its own code object; modules: 9 nested "modules", each entered
# through the same two methods (as nn.Module's __call__ and _call_impl) into a forward of its own.
case ${SHAPE:-recursion} in
  recursion) chain='def rec(d):
    if d == 0:
        return leaf(d)
    return rec(d - 1) + 1
top = lambda: rec(25)' ;;
  distinct) chain=$(for i in $(seq 0 25); do printf 'def f%d(d):\n    return %s + 1\n' "$i" "$([ "$i" = 25 ] && echo 'leaf(d)' || echo "f$((i + 1))(d)")"; done; echo 'top = lambda: f0(0)') ;;
  modules) chain=$(printf 'class M:\n    def __init__(s, inner): s.inner = inner\n    def __call__(s, x): return s._call_impl(x)\n    def _call_impl(s, x): return s.forward(x)\n'; for i in $(seq 0 8); do printf 'class M%d(M):\n    def forward(s, x):\n        return leaf(x) if s.inner is None else s.inner(x) + 1\n' "$i"; done; printf 'm = None\nfor i in range(8, -1, -1):\n    m = globals()["M%%d" %% i](m)\ntop = lambda: m(0)\n') ;;
  *) echo "SHAPE: recursion, distinct or modules" >&2; exit 1 ;;
esac
cat >"$tmp/spin.py" <<PY
import sys, time
def leaf(n):
    s = 0
    for i in range(200):
        s += i * n
    return s
$chain
end = time.time() + float(sys.argv[1])
while time.time() < end:
    top()
PY
for round in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    "$py" "$tmp/spin.py" 8 &
    app=$!
    sleep 0.5
    (sleep 5.5; bpftool -j prog show >"$tmp/progs.json") &
    reader=$!
    "$bin" record -F 999 -p "$app" -d 6 -o "$tmp/s.folded" 2>"$tmp/rec.log"
    wait "$reader" "$app"
    python3 - "$tmp/progs.json" "$bin" <<'PY'
import json, sys
p = [x for x in json.load(open(sys.argv[1])) if x.get("name") == "on_cpu_sample"][-1]
print(f"{sys.argv[2]}: on_cpu_sample {p['run_cnt']} runs, {p['run_time_ns'] / max(p['run_cnt'], 1):.0f} ns a run")
PY
    tail -1 "$tmp/rec.log"
  done
done
