#!/usr/bin/env bash
# What following PyTorch's caching allocator costs a program (issues #23, #37): the stand-in
# libc10_cuda.so (profiler/tests/programs/cuda) driven by tensor_app's loop, which allocates and
# frees one 64 KiB tensor RATE times a second, paced by a busy wait, and reports the time the
# allocator calls themselves took per iteration. Five ways, alternating, ROUNDS each: bare; under
# `gpuflame record --profiles tensor-inuse` (its defaults otherwise) on the library with PyTorch's
# USDT probes (pytorch:malloc, pytorch:free; followed through them), every stack taken; the same
# with the agent's byte sampling (`--tensor-sample-bytes 2097152`: a 64 KiB tensor's stack is
# taken with a chance of 3.1%); beside `gpuflame agent` at its defaults (whole machine, pushing
# to benches/push_sink.py); and on the library built without the notes (followed by hooks on its
# functions, as before the probes); and `traps`: the library with the notes under `perf stat`
# counting the two probes, no BPF program at all, which is what the two uprobe hits a tensor
# cost on this machine, the floor of any tool that follows tensors through them (perf from
# apt's linux-perf). Then the same from Python (ctypes, as torch's Python calls reach the
# allocator). The slowdown is the added time per iteration times RATE. Also checks that in-use
# bytes stayed exact: every tensor seen allocated was seen freed, and tensor-inuse ends empty.
#
#   sudo benches/tensors.sh [SECONDS] [RATE] [ROUNDS]        (default 5 10000 3)
#   GPUFLAME_BIN=path/to/gpuflame to measure another build; GPUFLAME_BIN_B=path/to/other to
#   measure a second build's probes, sampled and agent ways too, alternating with the first's.
#   BPF_STATS=1: also the kernel's count of each tensor program's runs and time in the record
#   ways (kernel.bpf_stats_enabled=1 for the run, which adds ~20 ns to every program's run).
#   WAYS="bare probes probes_b" (bare always among them) and LOOPS="py" narrow a run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-5}
rate=${2:-10000}
rounds=${3:-3}
exe=$("$root/benches/gpuflame-bin.sh")
src="$root/profiler/tests/programs/cuda"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
cc -O2 -g -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 "$src/fake_cuda.c" -lpthread -ldl
cc -O2 -g -shared -fPIC -Wl,-soname,libcudart.so.13 -o libcudart.so.13 "$src/fake_cudart.c" -L. -l:libcuda.so.1 '-Wl,-rpath,$ORIGIN' -ldl -lpthread
c++ -O2 -g -shared -fPIC -Wl,-soname,libc10.so -o libc10.so "$src/fake_c10.cpp"
# probes/ and hooks/: the library with and without its notes, each with a tensor_app of its own.
for way in probes hooks; do
  mkdir "$way"
  sdt=$([ "$way" = probes ] && echo -DGF_SDT || echo -UGF_SDT)
  c++ -O2 -g -shared -fPIC -fvisibility=hidden "$sdt" -Wl,-soname,libc10_cuda.so -o "$way/libc10_cuda.so" "$src/fake_c10_cuda.cpp" -L. -l:libcudart.so.13 -l:libc10.so "-Wl,-rpath,$tmp" -lpthread
  c++ -O2 -g -rdynamic -o "$way/tensor_app" "$src/tensor_app.cpp" -L"$way" -l:libc10_cuda.so "-Wl,-rpath,$tmp/$way:$tmp"
done
cat >pyloop.py <<'EOF'
import ctypes, os, sys, time
c10 = ctypes.CDLL(os.environ["C10_CUDA"])
c10.gf_tensor_alloc.restype = ctypes.c_void_p
c10.gf_tensor_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
c10.gf_tensor_free.argtypes = [ctypes.c_void_p]
empty, free = c10.gf_tensor_alloc, c10.gf_tensor_free
free(empty(65536, 0))
time.sleep(float(os.environ.get("WAIT", "0")))
secs, rate = float(sys.argv[1]), float(sys.argv[2])
n, spent, t0 = 0, 0.0, time.perf_counter()
while time.perf_counter() - t0 < secs:
    a = time.perf_counter()
    free(empty(65536, 0))
    b = time.perf_counter()
    spent += b - a
    n += 1
    while time.perf_counter() < t0 + n / rate:
        pass
print("iterations=%d" % n)
print("work_ns_per_iteration=%d" % (spent / n * 1e9))
EOF

# One run (HOW: bare, probes or hooks; WHAT: cpp or py); prints the ns per iteration the
# allocator calls took.
run() {
  local how=$1 what=$2 out lib=probes sample=0 exe=$exe
  if [ "${how%_b}" != "$how" ]; then
    exe=$GPUFLAME_BIN_B
    how=${how%_b}
  fi
  [ "$how" = hooks ] && lib=hooks
  case $what in
    cpp) cmd=("./$lib/tensor_app" loop "$secs" "$rate") ;;
    py) cmd=(env C10_CUDA="$tmp/$lib/libc10_cuda.so" WAIT=0.5 python3 pyloop.py "$secs" "$rate") ;;
  esac
  [ "$how" = sampled ] && sample=2097152
  if [ "$how" = bare ]; then
    out=$("${cmd[@]}")
  elif [ "$how" = traps ]; then
    out=$(perf stat -x, -o "$tmp/traps.txt" -e sdt_pytorch:malloc -e sdt_pytorch:free -- "${cmd[@]}")
    # Both probes hit once a tensor (the iterations and the untimed first), or this floor is none.
    local n=$(($(echo "$out" | sed -n 's/^iterations=//p') + 1))
    for probe in malloc free; do
      grep -q "^$n,,sdt_pytorch:$probe" "$tmp/traps.txt" || { echo "perf stat did not count $n hits of pytorch:$probe:" >&2; cat "$tmp/traps.txt" >&2; exit 1; }
    done
  elif [ "$how" = agent ]; then
    python3 "$root/benches/push_sink.py" 14061 >/dev/null 2>&1 &
    local sink=$!
    "$exe" agent -v --server http://127.0.0.1:14061 --window 5 >"$tmp/agent-$what.log" 2>&1 &
    local agent=$!
    sleep 3
    out=$("${cmd[@]}")
    kill -TERM $agent $sink
    wait $agent $sink 2>/dev/null || true
    grep -q "allocator followed through its USDT probes" "$tmp/agent-$what.log" || { echo "the agent did not follow the allocator:" >&2; cat "$tmp/agent-$what.log" >&2; exit 1; }
  else
    # The command waits at CUDA's first call for nothing here: WAIT gives the hooks time in
    # the Python run; the C++ loop's first allocation is untimed.
    local poll=
    if [ -n "${BPF_STATS:-}" ]; then
      # The programs go with gpuflame: the last reading before its end is kept.
      (while true; do bpftool -j prog show >"$tmp/progs.new" 2>/dev/null && mv "$tmp/progs.new" "$tmp/progs.json"; sleep 0.2; done) &
      poll=$!
    fi
    out=$("$exe" record --profiles tensor-inuse --tensor-sample-bytes $sample -o "$tmp/t-$what.folded" --memory-timeline none -- "${cmd[@]}" 2>"$tmp/rec-$what.log")
    if [ -n "$poll" ]; then
      kill $poll; wait $poll 2>/dev/null || true
      python3 - "$tmp/progs.json" "$1 $what" >&2 <<'EOF'
import json, sys
progs = {p["name"]: p for p in json.load(open(sys.argv[1])) if p.get("name") in ("on_torch_malloc", "on_torch_free", "on_cuda_call")}
print(sys.argv[2] + ": " + ", ".join(f"{n} {p.get('run_cnt', 0)} runs {p.get('run_time_ns', 0) / max(p.get('run_cnt', 0), 1):.0f} ns" for n, p in sorted(progs.items())))
EOF
    fi
    way=$([ "$how" = hooks ] && echo "by hooks" || echo "through its USDT probes")
    grep -q "tensors followed in .* $way" "$tmp/rec-$what.log" || { echo "not followed $way:" >&2; cat "$tmp/rec-$what.log" >&2; exit 1; }
    if [ -s "$tmp/t-$what.folded" ]; then
      echo "in-use not exact: tensor-inuse is not empty at the end" >&2
      cat "$tmp/t-$what.folded" >&2
      exit 1
    fi
    grep -q "tensors: .* allocated" "$tmp/rec-$what.log" || { cat "$tmp/rec-$what.log" >&2; exit 1; }
    grep "tensors:" "$tmp/rec-$what.log" | sed "s/^/$how $what: /" >&2
  fi
  echo "$out" | sed -n 's/^work_ns_per_iteration=//p'
}

ways=(bare probes sampled agent hooks traps)
[ -n "${GPUFLAME_BIN_B:-}" ] && ways+=(probes_b sampled_b agent_b)
if [ -n "${WAYS:-}" ]; then
  read -ra ways <<<"$WAYS"
  [[ " $WAYS " == *" bare "* ]] || { echo "WAYS must include bare: the added cost is against it" >&2; exit 1; }
fi
cleanup=('rm -rf "$tmp"')
trap 'for c in "${cleanup[@]}"; do eval "$c"; done' EXIT
if [ -n "${BPF_STATS:-}" ]; then
  command -v bpftool >/dev/null || { echo "BPF_STATS=1 reads the programs' counts with bpftool: apt-get install bpftool" >&2; exit 1; }
  stats_before=$(sysctl -n kernel.bpf_stats_enabled)
  sysctl -qw kernel.bpf_stats_enabled=1
  cleanup+=('sysctl -qw kernel.bpf_stats_enabled=$stats_before')
fi
if [[ " ${ways[*]} " == *" traps "* ]]; then
  command -v perf >/dev/null || { echo "the traps way counts the probes with perf stat: apt-get install linux-perf (or WAYS without traps)" >&2; exit 1; }
  # perf names the events after the notes; a user's own would be taken over and then deleted.
  if perf probe -l 2>/dev/null | grep -q 'sdt_pytorch:'; then
    echo "perf probe events sdt_pytorch:* exist already (perf probe -l): delete them, or WAYS without traps" >&2
    exit 1
  fi
  # The notes go through perf's cache of builds: one of its own, not the user's ~/.debug.
  perf --buildid-dir "$tmp/perf-buildids" buildid-cache --add "$tmp/probes/libc10_cuda.so"
  cleanup=('perf probe -q -d "sdt_pytorch:*" || true' "${cleanup[@]}")
  perf --buildid-dir "$tmp/perf-buildids" probe -q -x "$tmp/probes/libc10_cuda.so" -a sdt_pytorch:malloc -a sdt_pytorch:free
fi
for what in ${LOOPS:-cpp py}; do
  declare -A runs=()
  for r in $(seq 1 "$rounds"); do
    for way in "${ways[@]}"; do
      runs[$way]+="$(run "$way" $what) "
    done
  done
  args=()
  for way in "${ways[@]}"; do args+=("$way=${runs[$way]}"); done
  python3 - "$what" "$rate" "${args[@]}" <<'EOF'
import statistics, sys
what, rate = sys.argv[1], float(sys.argv[2])
runs = {}
for arg in sys.argv[3:]:
    way, values = arg.split("=", 1)
    runs[way] = [float(x) for x in values.split()]
b = statistics.median(runs["bare"])
print(f"{what}: allocator calls per tensor (alloc+free), bare {b:.0f} ns {runs['bare']}")
for way, values in runs.items():
    if way == "bare":
        continue
    h = statistics.median(values)
    print(f"{what}:   {way}: {h:.0f} ns {values}; added {h - b:.0f} ns per tensor; "
          f"at {rate:.0f} tensors/s the program slows down {(h - b) * rate / 1e9 * 100:.1f}%")
EOF
  unset runs
done
