#!/usr/bin/env bash
# Stack completeness on real PyTorch (issue #12): gpuflame against py-spy --native and
# perf --call-graph dwarf on a CPU training loop of the PyPI torch wheel, same run, same workload.
#
#   sudo benches/torch_stacks.sh [RESULTS_DIR]          (default /tmp/torch-stacks-results)
#
# Environment:
#   GPUFLAME_TORCH_VENV  venv with torch (default /opt/torch-venv; created with
#                        `python3 -m venv DIR && DIR/bin/pip install torch numpy` when it has none)
#   GPUFLAME_BIN         gpuflame to measure (default: `cargo build --release -p gpuflame` here)
#   GPUFLAME_TORCH_SECONDS  length of each attach recording (default 15)
#   GPUFLAME_TORCH_ROUNDS   rounds of the import-time comparison (default 2)
#   PYSPY, PERF          the tools (default: from PATH; skipped, and said so, when absent)
#
# What it runs (about 2.5 minutes on 2 CPUs, plus the build):
#   1. `import torch` time and steps/s: ROUNDS × (benches/torch_train.py alone, then under
#      `gpuflame record -o … -- python torch_train.py`), 6 s each, interleaved, page cache warm.
#   2. One long torch_train.py; once warm, a quiet window (no profiler, for steps/s), then one
#      after another on that process: `gpuflame record -p PID -d S` (stderr on a pseudo-terminal,
#      so that its live status line shows when the first samples came), `py-spy record --native
#      --threads -p PID -d S -f raw` (--threads: to tell the main thread apart), `perf record -e
#      cpu-clock --call-graph dwarf -F 99 -p PID -- sleep S` (cpu-clock: what perf falls back to
#      where there is no PMU, as in a VM) and `perf script`.
#   3. benches/torch_stacks.py analyze: the markdown table (stdout and RESULTS_DIR/table.md).
# Torch is installed only here, never in CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
results=${1:-/tmp/torch-stacks-results}
venv=${GPUFLAME_TORCH_VENV:-/opt/torch-venv}
secs=${GPUFLAME_TORCH_SECONDS:-15}
rounds=${GPUFLAME_TORCH_ROUNDS:-2}
helper="$root/benches/torch_stacks.py"
train="$root/benches/torch_train.py"

die() { echo "torch_stacks: $*" >&2; exit 1; }
log() { echo "[$(date +%T)] $*" >&2; }
[ "$(id -u)" = 0 ] || die "run as root (gpuflame and perf need it)"

# --- torch --------------------------------------------------------------------------------------
py="$venv/bin/python"
if ! [ -x "$py" ] || ! "$py" -c 'import torch' >/dev/null 2>&1; then
  if [ -z "${GPUFLAME_TORCH_VENV:-}" ] && [ -f /tmp/torch-install.log ] && ! tail -1 /tmp/torch-install.log | grep -q '^rc='; then
    die "a torch install into $venv is still running (/tmp/torch-install.log has no rc= line yet); try again later"
  fi
  log "installing torch into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch numpy
fi

# --- gpuflame and the other tools ---------------------------------------------------------------
if [ -n "${GPUFLAME_BIN:-}" ]; then
  exe=$GPUFLAME_BIN
else
  log "building gpuflame (release)"
  cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame
  exe="$root/target/release/gpuflame"
fi
[ -x "$exe" ] || die "no gpuflame at $exe"
pyspy=${PYSPY:-$(command -v py-spy || true)}
[ -n "$pyspy" ] || { [ -x /root/.pyenv/shims/py-spy ] && pyspy=/root/.pyenv/shims/py-spy; } || true
perf=${PERF:-$(command -v perf || true)}

if [ -d "$results" ] && [ -n "$(ls -A "$results")" ]; then
  [ -f "$results/commands.txt" ] || die "$results exists and is not an earlier results directory; give another"
  rm -rf "$results"
fi
mkdir -p "$results"
cd "$results"
skipped='{}'
skip() { skipped=$("$py" -c 'import json,sys; d=json.loads(sys.argv[1]); d[sys.argv[2]]=sys.argv[3]; print(json.dumps(d))' "$skipped" "$1" "$2"); log "skipping $1: $2"; }
[ -n "$pyspy" ] || skip py-spy "py-spy not found (pip install py-spy)"
[ -n "$perf" ] || skip perf "perf not found (apt-get install linux-perf)"

wl=
cleanup() { if [ -n "$wl" ]; then kill -TERM "$wl" 2>/dev/null || true; fi; }
trap cleanup EXIT
timed() { "$py" "$helper" timed "$@"; }
cmds="$results/commands.txt"
: >"$cmds"
note() { printf '%s\n' "$*" >>"$cmds"; }

# --- 1. import time, with and without gpuflame --------------------------------------------------
log "warming the page cache (one import torch)"
"$py" -c 'import torch' >/dev/null
note "# import time: $rounds rounds, interleaved"
note "$py benches/torch_train.py --seconds 6"
note "$exe record -o gfcmd-N.pb.gz -- $py benches/torch_train.py --seconds 6"
for r in $(seq 1 "$rounds"); do
  log "round $r/$rounds: without a profiler"
  "$py" "$train" --seconds 6 >"baseline-$r.out" 2>&1
  log "round $r/$rounds: under gpuflame record -- CMD"
  rc=0
  timed --json "gfcmd-$r.json" --stdout "gfcmd-$r.out" --pty "gfcmd-$r.pty.log" --watch-maps -- \
    "$exe" record -o "gfcmd-$r.pb.gz" -- "$py" "$train" --seconds 6 || rc=$?
  [ "$rc" = 0 ] || die "gpuflame record -- CMD exited with $rc (see $results/gfcmd-$r.pty.log)"
  tail -1 "gfcmd-$r.out" >&2
done

# --- 2. one long workload, the profilers one after another -------------------------------------
log "starting the long workload"
"$py" "$train" >long.out 2>&1 &
wl=$!
for _ in $(seq 1 600); do
  grep -q '^warm ' long.out && break
  kill -0 "$wl" 2>/dev/null || die "the workload exited: $(tail -5 long.out)"
  sleep 0.2
done
grep -q '^warm ' long.out || die "the workload did not warm up in 120 s"
sleep 1
q0=$(date +%s.%N)
sleep 8
q1=$(date +%s.%N)

log "gpuflame record -p $wl -d $secs"
note "# on one long-running workload (PID), one after another"
note "$exe record -p PID -d $secs -o gf-attach.pb.gz        # stderr on a pty, for the live status line"
rc=0
timed --json gf-attach.json --pty gf-attach.pty.log --watch-maps -- \
  "$exe" record -p "$wl" -d "$secs" -o gf-attach.pb.gz || rc=$?
[ "$rc" = 0 ] || die "gpuflame record -p exited with $rc (see $results/gf-attach.pty.log)"
"$exe" convert gf-attach.pb.gz -o gf-attach.folded 2>convert.err || die "gpuflame convert failed: $(cat convert.err)"
note "$exe convert gf-attach.pb.gz -o gf-attach.folded"
tr '\r' '\n' <gf-attach.pty.log | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' | grep '^gpuflame:' >&2 || true

if [ -n "$pyspy" ]; then
  log "py-spy record --native -p $wl -d $secs"
  note "$pyspy record --native --threads -p PID -d $secs -f raw -o pyspy.txt"
  rc=0
  timed --json pyspy.json --stdout pyspy.log --stderr pyspy.err -- \
    "$pyspy" record --native --threads -p "$wl" -d "$secs" -f raw -o pyspy.txt || rc=$?
  [ "$rc" = 0 ] || skip py-spy "py-spy exited with $rc: $(tail -2 pyspy.err pyspy.log | tr '\n' ' ')"
fi

if [ -n "$perf" ]; then
  log "perf record --call-graph dwarf -F 99 -p $wl -- sleep $secs"
  note "$perf record -e cpu-clock --call-graph dwarf -F 99 -p PID -o perf.data -- sleep $secs"
  rc=0
  timed --json perf.json --stdout perf.log --stderr perf.err -- \
    "$perf" record -q -e cpu-clock --call-graph dwarf -F 99 -p "$wl" -o perf.data -- sleep "$secs" || rc=$?
  [ "$rc" = 0 ] || skip perf "perf record exited with $rc: $(tail -2 perf.err | tr '\n' ' ')"
fi

kill -TERM "$wl"
wait "$wl" || true
wl_pid=$wl
wl=
tail -1 long.out >&2

if [ -n "$perf" ] && [ -f perf.data ]; then
  log "perf script"
  note "$perf script -i perf.data -F comm,pid,tid,ip,sym,dso --no-inline > perf.txt"
  rc=0
  timed --json perf-script.json --stdout perf.txt --stderr perf-script.err -- \
    "$perf" script -i perf.data -F comm,pid,tid,ip,sym,dso --no-inline || rc=$?
  [ "$rc" = 0 ] || skip perf "perf script exited with $rc: $(tail -2 perf-script.err | tr '\n' ' ')"
  log "perf script took $("$py" -c 'import json; print(round(json.load(open("perf-script.json"))["wall_s"], 1))') s"
fi

"$py" - "$wl_pid" "$rounds" "$secs" "$q0" "$q1" "$skipped" "$exe" >meta.json <<'PY'
import json, os, re, sys
pid, rounds, secs, q0, q1, skipped, exe = sys.argv[1:]
cfg = {}
for line in open("long.out"):
    if line.startswith("torch="):
        cfg = dict(p.split("=", 1) for p in line.split())
print(json.dumps({"workload_pid": int(pid), "rounds": int(rounds), "seconds": float(secs),
                  "quiet_window": [float(q0), float(q1)], "skipped": json.loads(skipped), "gpuflame": exe,
                  "torch": cfg.get("torch"), "threads": cfg.get("threads"), "cpus": os.cpu_count()}, indent=1))
PY

# --- 3. the table ------------------------------------------------------------------------------
log "analysis"
"$py" "$helper" analyze "$results"
echo
echo "(files in $results; the table is also in $results/table.md)"
