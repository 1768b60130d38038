#!/bin/busybox sh
# /init of the kernel-matrix initramfs (scripts/kernel-matrix.sh builds it): runs each check of
# gpuflame on the booted kernel and prints everything the host needs on the console, between
# markers that scripts/kernel-matrix/analyze.py reads:
#
#   @@INFO key=value               what this kernel offers (BTF, tracefs, ...)
#   @@STEP step started            a step began (a guest that dies in it says which)
#   @@CHECK step rc=N secs=N timeout=N
#   @@STDERR / @@STDOUT / @@FILE name   gpuflame's stderr, the program's stdout, each output file
#   @@END step
#   @@DMESG ... @@END dmesg        the kernel's log, kept off the console while the checks run
#   @@DONE                         the guest got to the end (its absence: a crash or a hang)
#
# (The host adds `@@HOST kernel=K qemu_rc=N seconds=N` once qemu has exited.)
#
# The verdicts are the host's: the guest only runs and reports, so that a criterion can be
# changed without rebuilding or rebooting anything.

export PATH=/bin:/usr/bin HOME=/root TMPDIR=/tmp LANG=C.UTF-8
M=/m
G=$M/gpuflame

# The agent check, run as `/init __agent` so that the step's timeout covers the receiver and the
# workload as well: one window of the whole machine, with a program spinning in it, pushed to the
# receiver on 127.0.0.1.
if [ "$1" = __agent ]; then
	rm -f /tmp/receiver.ready
	/usr/bin/python3.11 $M/receiver.py 4040 /tmp/receiver.ready >receiver.log 2>&1 &
	receiver=$!
	n=0
	while [ ! -e /tmp/receiver.ready ] && [ $n -lt 600 ]; do
		sleep 0.1
		n=$((n + 1))
	done
	$M/deep 60 &
	workload=$!
	$G agent --server http://127.0.0.1:4040 --once --window 3 -F 99
	rc=$?
	kill $workload $receiver
	wait $workload $receiver 2>/dev/null
	exit $rc
fi

/bin/busybox --install -s /bin

mount -t devtmpfs devtmpfs /dev 2>/dev/null
# The kernel found no /dev/console in the initramfs if it could not be made there (the host
# build ran as a user who may not mknod): take the console now that devtmpfs has it.
exec 0</dev/console 1>/dev/console 2>&1

info() { echo "@@INFO $*"; }
echo # ends the line the firmware left on the console

# Each mount is reported rather than assumed: an old kernel without tracefs is a finding.
try_mount() { # TYPE DIR
	mkdir -p "$2"
	if mount -t "$1" "$1" "$2" 2>/tmp/mount.err; then
		info "mount_$1=ok"
	else
		info "mount_$1=failed $(cat /tmp/mount.err)"
	fi
}
try_mount proc /proc
try_mount sysfs /sys
try_mount tracefs /sys/kernel/tracing
try_mount debugfs /sys/kernel/debug
try_mount bpf /sys/fs/bpf
try_mount cgroup2 /sys/fs/cgroup
mkdir -p /tmp /run /dev/shm /dev/pts
mount -t tmpfs tmpfs /dev/shm
ip link set lo up
hostname kernel-matrix

# Kernel messages (a verifier splat, a warning) would land in the middle of a folded line on the
# console: keep them off it, and print the whole log at the end instead.
echo 1 >/proc/sys/kernel/printk

info "uname_r=$(uname -r)"
info "uname_v=$(uname -v)"
info "btf=$([ -e /sys/kernel/btf/vmlinux ] && echo yes || echo missing)"
info "tracefs_events=$([ -d /sys/kernel/tracing/events ] && echo yes || echo missing)"
info "uprobe_events=$([ -e /sys/kernel/tracing/uprobe_events ] && echo yes || echo missing)"
info "cpus=$(grep -c ^processor /proc/cpuinfo)"
info "mem_kb=$(awk '/MemTotal/ {print $2}' /proc/meminfo)"
info "memlock=$(ulimit -l)"

# Per step: a step takes 7-25 s under TCG, where gpuflame verifies its BPF programs and builds
# unwind tables many times slower than on hardware; past a minute more than that, it hangs.
STEP_TIMEOUT=${STEP_TIMEOUT:-90}

# step NAME CMD...: runs CMD in a fresh directory /out/NAME, then prints its rc, stderr, stdout
# and every file it wrote there but SVGs.
step() {
	name=$1
	shift
	dir=/out/$name
	mkdir -p "$dir"
	cd "$dir" || return
	echo "@@STEP $name started" # progress on the console, for a human watching
	t0=$(date +%s)
	timeout "$STEP_TIMEOUT" "$@" >stdout 2>stderr
	rc=$?
	t1=$(date +%s)
	echo "@@CHECK $name rc=$rc secs=$((t1 - t0)) timeout=$STEP_TIMEOUT"
	echo "@@STDERR"
	cat stderr
	echo "@@STDOUT"
	cat stdout
	for f in *; do
		# The memory timeline (SVG) is not judged, and would be most of the log.
		case $f in stdout | stderr | *.svg | '*') continue ;; esac
		echo "@@FILE $f"
		cat "$f"
	done
	echo "@@END $name"
	cd /
}

# cpu: the 40-deep chain built without frame pointers, 3 s of CPU.
step cpu $G record -F 99 -o deep.folded -- $M/deep 3

# cpu, the first impression: the whole machine for 2 s while the guest is idle must say so and
# what to try; the same while deep spins must not. deep spins longer than the recording can take
# to start under TCG on a loaded host, and is stopped after it.
step cpu-idle $G record -d 2 -o idle.folded
step cpu-busy sh -c "$M/deep 120 & d=\$!; $G record -d 2 -o busy.folded; rc=\$?; kill \$d; exit \$rc"

# python: Debian's python3.11, spinning under three named functions.
step python $G record -F 99 -o py.folded -- /usr/bin/python3.11 $M/spin.py 3

# offcpu: two profiles, whose outputs are named off.off-cpu.folded and off.wall.folded.
step offcpu $G record --profiles off-cpu,wall -o off.folded -- $M/blocker 2

# dump: blocker's threads, waiting since before the dump, read where they lie (the task iterator,
# their registers and kernel stacks).
$M/blocker 30 &
blocker=$!
sleep 1
step dump $G dump -p $blocker --format json
kill $blocker 2>/dev/null

# cuda: the stand-ins of profiler/tests/cuda.rs (HBM) and tensors.rs (PyTorch's allocator), with
# the same commands and the totals the tests hold exact.
step cuda-hbm $G record --profiles hbm-alloc,hbm-inuse -o mem.folded -- $M/cuda/cuda_app memory
# tensor_app allocates within milliseconds of its start, before a recording has read its maps
# and hooked its allocator under TCG: it waits at the tests' gate (profiler/tests/programs/gate.h)
# until gpuflame says its tables are in, as the tests hold it (profiler/tests/common/mod.rs).
gate_open() { # NAME STDERR
	gate=/tmp/gate.$1
	n=0
	while [ $n -lt 600 ]; do
		for arrived in $gate.*; do
			[ -e "$arrived" ] || continue
			pid=${arrived##*.}
			maps=$(awk '$2 ~ /^..x/' /proc/$pid/maps | wc -l)
			if grep -q "unwind tables ready pid=$pid mappings=$maps\$" "$2" 2>/dev/null; then
				touch $gate
				return
			fi
		done
		sleep 0.1
		n=$((n + 1))
	done
	touch $gate # never said: the program goes on, and the check says what was missed
}
gated_step() { # NAME CMD...
	gate_open "$1" "/out/$1/stderr" &
	name=$1
	shift
	step "$name" env GPUFLAME_TEST_GATE=/tmp/gate.$name RUST_LOG=warn,gpuflame::ready=debug "$@"
}
gated_step cuda-tensors $G record --profiles tensor-inuse,tensor-alloc,hbm-inuse -o t.folded -- $M/cuda/tensor_app exact
# The allocator without USDT notes, followed by hooks on its functions.
gated_step cuda-tensor-hooks $G record --profiles tensor-inuse,tensor-alloc,hbm-inuse -o t.folded -- $M/cuda-hooks/tensor_app exact

# agent: see __agent at the top.
step agent /bin/sh /init __agent

echo "@@DMESG"
dmesg
echo "@@END dmesg"
echo "@@DONE"
sync
poweroff -f
