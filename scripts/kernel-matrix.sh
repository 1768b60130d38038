#!/usr/bin/env bash
# Boots Debian's kernels under qemu (TCG) from an initramfs that holds gpuflame and the programs it
# is checked on, runs a checklist of gpuflame commands in each (scripts/kernel-matrix/init.sh) and
# prints a table kernel x check: works / degraded (why) / refused (why).
#
#   scripts/kernel-matrix.sh [--markdown] [--require KERNELS] [KERNEL...]
#
#   KERNEL        5.10, 6.1, 6.12 or sid (default: 6.1 6.12 sid)
#   --markdown    print the table as Markdown (for README.md / BENCHMARKS.md)
#   --update-readme  also write that table into README.md's requirements, between its
#                 kernel-matrix markers, with the commit it was made at
#   --require K   comma list of kernels: exit non-zero unless every check on them works; the
#                 closing `N passed, N failed` line counts only their checks
#
# Environment: GPUFLAME_BIN (the binary to check; default target/release/gpuflame, built when
# missing or older than the sources), GPUFLAME_KERNELS (the kernels' cache, default
# /var/cache/gpuflame-kernels), GPUFLAME_MATRIX_LOGS (the guests' console logs, one per kernel,
# default target/kernel-matrix), GPUFLAME_MATRIX_TIMEOUT (seconds a kernel may take, default 600).
#
# As root on Debian; installs what is missing. Under TCG because a nested KVM guest hangs on the
# machines this runs on; one kernel takes a few minutes, and one qemu runs at a time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
here="$root/scripts/kernel-matrix"
cd "$root"

markdown=()
update_readme=
require=()
kernels=()
while [ $# -gt 0 ]; do
    case $1 in
        --markdown) markdown=(--markdown) ;;
        --update-readme) update_readme=1 ;;
        --require) require=(--require "$2"); shift ;;
        --require=*) require=(--require "${1#--require=}") ;;
        -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "kernel-matrix: unknown option $1" >&2; exit 2 ;;
        *) kernels+=("$1") ;;
    esac
    shift
done
[ ${#kernels[@]} -gt 0 ] || kernels=(6.1 6.12 sid)

# The Debian suite and package of each kernel, as ../shared/tools/get-kernel.sh takes them.
kernel_package() {
    case $1 in
        5.10) echo "bullseye ^linux-image-5\.10\.0-[0-9]+-cloud-amd64$" ;;
        6.1) echo "bookworm ^linux-image-6\.1\.0-[0-9]+-cloud-amd64$" ;;
        6.12) echo "bookworm ^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64$" ;;
        sid) echo "sid ^linux-binary-[0-9.]+\+deb14-cloud-amd64$" ;;
        *) return 1 ;;
    esac
}
for k in "${kernels[@]}"; do
    kernel_package "$k" >/dev/null || { echo "kernel-matrix: unknown kernel $k (5.10, 6.1, 6.12 or sid)" >&2; exit 2; }
done
get_kernel="$(cd "$root/.." && pwd)/shared/tools/get-kernel.sh"
if [ ! -f "$get_kernel" ]; then
    echo "kernel-matrix: $get_kernel is missing; it downloads the Debian kernels this script boots" >&2
    exit 1
fi

# What the guest and its programs are made of: qemu, a static busybox, cpio, compilers (the test
# programs and the CUDA stand-ins, whose USDT probes need sys/sdt.h) and Debian's Python 3.11,
# which the guest runs from the initramfs.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v strip >/dev/null || need+=(binutils)
[ -f /usr/include/x86_64-linux-gnu/sys/sdt.h ] || [ -f /usr/include/sys/sdt.h ] || need+=(systemtap-sdt-dev)
[ -x /usr/bin/python3.11 ] || need+=(python3.11)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
    echo "kernel-matrix: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The binary under test. A stale release build would report on code that is no longer there.
bin=${GPUFLAME_BIN:-}
if [ -z "$bin" ]; then
    bin=target/release/gpuflame
    if [ ! -x "$bin" ] || [ -n "$(find bpf profiler/src unwind symbolizer pyframes elfread server-upload Cargo.toml Cargo.lock profiler/Cargo.toml \
        -newer "$bin" \( -name '*.rs' -o -name '*.c' -o -name '*.h' -o -name 'Cargo.*' \) -print -quit 2>/dev/null)" ]; then
        echo "kernel-matrix: building $bin" >&2
        cargo build --release -p gpuflame
    fi
fi
[ -x "$bin" ] || { echo "kernel-matrix: no gpuflame binary at $bin" >&2; exit 1; }

logs=${GPUFLAME_MATRIX_LOGS:-target/kernel-matrix}
mkdir -p "$logs"
cache=${GPUFLAME_KERNELS:-/var/cache/gpuflame-kernels}
work=$(mktemp -d "${TMPDIR:-/tmp}/kernel-matrix.XXXXXX")
trap 'rm -rf "$work"' EXIT

# ---- the initramfs -------------------------------------------------------------------------
stage=$work/root
mkdir -p "$stage"
# The host's merged-/usr links (/lib -> usr/lib, ...), so that every path ldd and the ELF
# interpreter name resolves in the guest as it does here.
for d in bin sbin lib lib64; do
    if [ -L "/$d" ]; then
        target=$(readlink "/$d")
        mkdir -p "$stage/${target#/}"
        ln -s "$target" "$stage/$d"
    fi
done
mkdir -p "$stage"/{bin,dev,proc,sys,tmp,root,etc,out,m/cuda,m/cuda-hooks,usr/bin,usr/lib}

# copy_file PATH: PATH into the stage at the same path, under the name ldd gave it (a library's
# soname link is copied as the file it points to).
copy_file() {
    local dir
    dir=$(readlink -f "$(dirname "$1")")
    mkdir -p "$stage$dir"
    [ -e "$stage$dir/$(basename "$1")" ] || cp -L "$1" "$stage$dir/$(basename "$1")"
}
# copy_libs ELF...: the shared libraries and the dynamic loader each needs.
copy_libs() {
    local lib
    # ldd's lines "name => /path (addr)" and "/path/of/the/loader (addr)"; not the headers
    # "file:" it prints for several files.
    for lib in $(ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u); do
        copy_file "$lib"
    done
}

copy_file /bin/busybox
copy_libs /bin/busybox # nothing for busybox-static; the dynamic build works as well
mknod "$stage/dev/console" c 5 1 2>/dev/null || true # else init takes it from devtmpfs

strip --strip-debug -o "$stage/m/gpuflame" "$bin"
copy_libs "$bin"

# Debian's Python 3.11 and the part of its standard library that runs programs (no tests, IDLE,
# Tk, pip bootstrap, 2to3, bytecode caches or site-packages): 14 MB of the 54 MB initramfs.
copy_file /usr/bin/python3.11
copy_libs /usr/bin/python3.11 /usr/lib/python3.11/lib-dynload/*.so
tar -C /usr/lib -cf - --exclude=python3.11/test --exclude=python3.11/idlelib --exclude=python3.11/tkinter \
    --exclude=python3.11/ensurepip --exclude=python3.11/lib2to3 --exclude=__pycache__ --exclude=python3.11/pydoc_data \
    --exclude=python3.11/site-packages --exclude=python3.11/config-3.11-x86_64-linux-gnu python3.11 | tar -C "$stage/usr/lib" -xf -

# The programs the checks run. deep is built without frame pointers: the unwinder must use
# .eh_frame. The CUDA stand-ins as profiler/tests/common/cuda.rs builds them, with $ORIGIN in
# place of the test's build directory in the programs' rpath.
cc -O2 -fomit-frame-pointer -fno-ipa-icf -o "$stage/m/deep" "$here/deep.c"
cc -O2 -g -pthread -o "$stage/m/blocker" "$here/blocker.c"
cp "$here/spin.py" "$here/receiver.py" "$stage/m/"
src=$root/profiler/tests/programs/cuda
(
    cd "$stage/m/cuda"
    cc -O2 -g -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 "$src/fake_cuda.c" -lpthread -ldl
    cc -O2 -g -shared -fPIC -Wl,-soname,libcudart.so.13 -o libcudart.so.13 "$src/fake_cudart.c" -L. -l:libcuda.so.1 '-Wl,-rpath,$ORIGIN' -ldl -lpthread
    cc -O2 -g -shared -fPIC -Wl,-soname,libcupti.so.13 -o libcupti.so.13 "$src/fake_cupti.c" -lpthread
    cc -O2 -g -rdynamic -o cuda_app "$src/cuda_app.c" -L. -l:libcudart.so.13 -l:libcuda.so.1 '-Wl,-rpath,$ORIGIN'
    c++ -O2 -g -shared -fPIC -Wl,-soname,libc10.so -o libc10.so "$src/fake_c10.cpp"
    c++ -O2 -g -shared -fPIC -fvisibility=hidden -DGF_SDT -Wl,-soname,libc10_cuda.so -o libc10_cuda.so "$src/fake_c10_cuda.cpp" \
        -L. -l:libcudart.so.13 -l:libc10.so '-Wl,-rpath,$ORIGIN' -lpthread
    c++ -O2 -g -rdynamic -o tensor_app "$src/tensor_app.cpp" -L. -l:libc10_cuda.so '-Wl,-rpath,$ORIGIN'
    # The allocator without USDT notes (PyTorch before 2.15), which gpuflame follows by hooks on
    # its functions and at the instructions after its calls.
    mkdir -p ../cuda-hooks
    cp libcuda.so.1 libcudart.so.13 libc10.so tensor_app ../cuda-hooks/
    c++ -O2 -g -shared -fPIC -fvisibility=hidden -Wl,-soname,libc10_cuda.so -o ../cuda-hooks/libc10_cuda.so "$src/fake_c10_cuda.cpp" \
        -L. -l:libcudart.so.13 -l:libc10.so '-Wl,-rpath,$ORIGIN' -lpthread
)
copy_libs "$stage/m/blocker" "$stage/m/deep" "$stage/m/cuda/cuda_app" "$stage/m/cuda/tensor_app" "$stage"/m/cuda/*.so*

echo 'root:x:0:0:root:/root:/bin/sh' >"$stage/etc/passwd"
echo 'root:x:0:' >"$stage/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$stage/etc/hosts"
install -m 0755 "$here/init.sh" "$stage/init"

# Uncompressed: the guest unpacks it faster than it would gunzip it under TCG.
(cd "$stage" && find . | cpio -o -H newc -R 0:0 --quiet) >"$work/initrd.cpio"
echo "kernel-matrix: initramfs $(du -m "$work/initrd.cpio" | cut -f1) MB, gpuflame from $bin" >&2

# ---- one boot per kernel -------------------------------------------------------------------
for k in "${kernels[@]}"; do
    log="$logs/$k.log"
    # A kernel that cannot be fetched (the mirror is down) is a row of failures, not the end of
    # the run: the other kernels are still worth their table.
    # shellcheck disable=SC2046 # suite and pattern, two words
    if ! vmlinuz=$(bash "$get_kernel" $(kernel_package "$k") "$cache" | tail -n 1) || [ ! -f "$vmlinuz" ]; then
        echo "kernel-matrix: $get_kernel could not fetch kernel $k ($(kernel_package "$k"))" | tee "$log" >&2
        echo "@@HOST kernel=$k qemu_rc=not-run seconds=0" >>"$log"
        continue
    fi
    echo "kernel-matrix: booting $k ($vmlinuz), console in $log" >&2
    start=$(date +%s.%N)
    rc=0
    # Under a hard timeout: a guest that hangs (a BPF program that wedges the kernel) must not
    # hang CI. stdin from /dev/null: -nographic would otherwise take the terminal.
    timeout "${GPUFLAME_MATRIX_TIMEOUT:-600}" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 2048 -smp 2 \
        -kernel "$vmlinuz" -initrd "$work/initrd.cpio" -append "console=ttyS0 panic=-1 quiet" \
        -nographic -no-reboot </dev/null >"$log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    echo "@@HOST kernel=$k qemu_rc=$rc seconds=$(echo "$start $end" | awk '{printf "%.0f", $2 - $1}') vmlinuz=$vmlinuz" >>"$log"
done

status=0
python3 "$here/analyze.py" --logs "$logs" "${markdown[@]}" "${require[@]}" "${kernels[@]}" || status=$?
if [ -n "$update_readme" ]; then
    table=$work/table.md
    python3 "$here/analyze.py" --logs "$logs" --markdown "${kernels[@]}" | grep -v '^[0-9]* passed, [0-9]* failed$' >"$table" || true
    made="*Made by \`scripts/kernel-matrix.sh --update-readme ${kernels[*]}\` at $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+changes'), $(date -u +%Y-%m-%d); Debian's kernels under qemu (TCG).*"
    python3 - "$root/README.md" "$table" "$made" <<'PY'
import sys
readme, table, made = sys.argv[1], open(sys.argv[2]).read().rstrip("\n"), sys.argv[3]
begin, end = "<!-- kernel-matrix:begin -->", "<!-- kernel-matrix:end -->"
text = open(readme).read()
if begin not in text or end not in text:
    sys.exit(f"kernel-matrix: README.md has no {begin} ... {end} section to update")
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open(readme, "w").write(f"{head}{begin}\n{table}\n\n{made}\n{end}{tail}")
PY
    echo "kernel-matrix: README.md's table updated" >&2
fi
exit "$status"
