/* How every program sends a record of the `samples` ring (struct event_record, events.h): its
 * header filled in, its stack section zeroed for the programs that unwind into it, its size cut
 * after what its kind uses with the user frames clamped to the array, the wake rule applied, and
 * a record the full ring turned away counted. The sampler, the switch program, the CUDA hooks,
 * PyTorch's probes and the CUPTI transport all go through here. */
#ifndef GPUFLAME_RECORDS_H
#define GPUFLAME_RECORDS_H

#include "counters.h"
#include "events.h"
#include "maps.h"

/* When user space is woken for a record. */
enum record_wake {
	/* Once the ring fills past SAMPLES_WAKEUP_BYTES (maps.h): most records. */
	WAKE_WHEN_FILLING = 0,
	/* At once: a record user space must act on while the process lives (memory calls, whose
	 * Python frames are named from its memory; an out-of-memory). */
	WAKE_AT_ONCE = 1,
	/* Never by itself: the switch program's, thousands a second, read at the next drain. */
	WAKE_NEVER = 2,
	/* The kernel's own rule (wake when the reader has caught up): the CUPTI transport's. */
	WAKE_ADAPTIVE = 3,
};

/* The header of a record of thread `tid` of process `pid`, named as `task` is (NULL: the current
 * thread), taken now on this CPU; its stack section zeroed. */
static __always_inline void record_header(struct event_record *e, __u32 kind, __u32 pid, __u32 tid, struct task_struct *task)
{
	e->header.kind = kind;
	e->header.pid = pid;
	e->header.tid = tid;
	e->header.cpu = bpf_get_smp_processor_id();
	e->header.timestamp_ns = bpf_ktime_get_boot_ns();
	if (task)
		__builtin_memcpy(e->header.comm, task->comm, sizeof(e->header.comm));
	else
		bpf_get_current_comm(e->header.comm, sizeof(e->header.comm));
	__builtin_memset(&e->stack, 0, sizeof(e->stack));
}

/* The user frames the record carries, clamped to its array. */
static __always_inline __u32 record_user_frames(struct event_record *e)
{
	__u32 frames = e->stack.user_frames;

	return frames > MAX_USER_FRAMES ? MAX_USER_FRAMES : frames;
}

/* Whether the per-CPU scratch entry still holds this thread's record of `kind` after unwinding:
 * a uprobe program can be preempted, and a hook on another thread of this CPU take the entry
 * meanwhile. Such a record is dropped, and counted. */
static __always_inline bool record_still_ours(struct event_record *e, __u32 tid, __u32 kind)
{
	if (e->header.tid == tid && e->header.kind == kind)
		return true;
	count(COUNTER_CUDA_RACE);
	return false;
}

/* Sends the record's first `bytes` (its fixed part and what its kind adds, at most the whole
 * record) into `ring` with the ring's `flags`. False, and `lost` counted, when the ring is full. */
static __always_inline bool send_record_to(void *ring, struct event_record *e, __u64 bytes, __u64 flags, enum counter lost)
{
	if (bytes > sizeof(*e))
		bytes = sizeof(*e);
	if (bpf_ringbuf_output(ring, e, bytes, flags)) {
		count(lost);
		return false;
	}
	return true;
}

/* The same into the `samples` ring, woken by the `wake` rule. */
static __always_inline bool send_record(struct event_record *e, __u64 bytes, enum record_wake wake, enum counter lost)
{
	__u64 flags;

	switch (wake) {
	case WAKE_AT_ONCE:
		flags = BPF_RB_FORCE_WAKEUP;
		break;
	case WAKE_NEVER:
		flags = BPF_RB_NO_WAKEUP;
		break;
	case WAKE_ADAPTIVE:
		flags = 0;
		break;
	default:
		flags = wake_when_filling();
		break;
	}
	return send_record_to(&samples, e, bytes, flags, lost);
}

/* The same for an out-of-memory's record, through its own ring (maps.h), waking the reader. */
static __always_inline bool send_oom_record(struct event_record *e, __u64 bytes, enum counter lost)
{
	return send_record_to(&oom_records, e, bytes, BPF_RB_FORCE_WAKEUP, lost);
}

/* The kernel stack, right after the user frames (user_stack and kernel_stack are one array, so
 * no room is sent for a user stack shorter than the most); the record's bytes with both. */
static __always_inline __u64 record_kernel_stack_after_user(void *ctx, struct event_record *e)
{
	__u32 frames = record_user_frames(e);
	long kbytes = bpf_get_stack(ctx, &e->user_stack[frames], MAX_KERNEL_FRAMES * 8, 0);

	if (kbytes < 0) {
		count(COUNTER_KSTACK_FAILED);
		kbytes = 0;
	}
	e->stack.kernel_stack_bytes = kbytes;
	return EVENT_FIXED_BYTES + (__u64)frames * 8 + (kbytes & 0x3ff);
}

/* The fixed part and the user frames. */
static __always_inline __u64 record_bytes_with_frames(struct event_record *e)
{
	return EVENT_FIXED_BYTES + (__u64)record_user_frames(e) * sizeof(__u64);
}

#endif
