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
	__u32 slot = SCRATCH_HOOKED;
	struct event_record *e;

	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return;
	record_header(e, EVENT_HOOKED_STACK, id >> 32, (__u32)id, NULL);
	e->payload.hooked_stack.origin = bpf_get_attach_cookie(ctx);
	e->payload.hooked_stack.value = value;
	unwind_user_stack(e, slot);
	if (!record_still_ours(e, (__u32)id, EVENT_HOOKED_STACK))
		return;
	send_record(e, record_kernel_stack_after_user(ctx, e), WAKE_WHEN_FILLING, COUNTER_LOST);
}

#endif
