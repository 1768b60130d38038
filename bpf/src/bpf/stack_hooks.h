/* The one entry for a profile's own hook: a program on a tracepoint (or any hook that has an
 * attach cookie) calls send_hooked_stack with what its event weighs, and the stack of the current
 * thread, kernel and user, goes to user space as an EVENT_HOOKED_STACK record. The attach cookie,
 * which user space sets when it attaches the program for a profile, says which profile: a new
 * profile needs its program and its descriptor, and nothing in between. */
#ifndef GPUFLAME_STACK_HOOKS_H
#define GPUFLAME_STACK_HOOKS_H

#include "native_unwind.h"
#include "records.h"
#include "targets.h"

/* Sends the current thread's stack, weighing `value`, for the profile whose hook `ctx` is. */
static __always_inline void send_hooked_stack(void *ctx, __u64 value)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 slot = SCRATCH_HOOKED, frames;
	struct event_record *e;
	long kbytes;

	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return;
	record_header(e, EVENT_HOOKED_STACK, id >> 32, (__u32)id, NULL);
	e->payload.hooked_stack.origin = bpf_get_attach_cookie(ctx);
	e->payload.hooked_stack.value = value;
	unwind_user_stack(e, slot);
	if (!record_still_ours(e, (__u32)id, EVENT_HOOKED_STACK))
		return;
	frames = record_user_frames(e);
	/* user_stack and kernel_stack are one array: the kernel frames go right after the user ones. */
	kbytes = bpf_get_stack(ctx, &e->user_stack[frames], MAX_KERNEL_FRAMES * 8, 0);
	if (kbytes < 0) {
		count(COUNTER_KSTACK_FAILED);
		kbytes = 0;
	}
	e->stack.kernel_stack_bytes = kbytes;
	send_record(e, EVENT_FIXED_BYTES + (__u64)frames * 8 + (kbytes & 0x3ff), WAKE_WHEN_FILLING, COUNTER_LOST);
}

#endif
