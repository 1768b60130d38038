/* How the CUDA hooks, PyTorch's allocator probes and the CUPTI transport send a record: the
 * header of the current thread, and a call's record with the caller's user stack. */
#ifndef GPUFLAME_CUDA_RECORDS_H
#define GPUFLAME_CUDA_RECORDS_H

#include "cuda_api.h"
#include "cuda_classes.h"
#include "maps.h"
#include "native_unwind.h"

/* PyTorch's mangled kernel names run past 256 bytes, and a name cut short cannot be demangled. */
#define CUDA_NAME_MAX 1024

/* The header of a record of the current thread; its stack zeroed, for the kinds that have none
 * (those that have one unwind into it). */
static __always_inline void cuda_header(struct event_record *e, __u32 kind, __u64 id)
{
	e->header.kind = kind;
	e->header.pid = id >> 32;
	e->header.tid = (__u32)id;
	e->header.cpu = bpf_get_smp_processor_id();
	e->header.timestamp_ns = bpf_ktime_get_boot_ns();
	bpf_get_current_comm(e->header.comm, sizeof(e->header.comm));
	__builtin_memset(&e->stack, 0, sizeof(e->stack));
}

/* A call's record, its payload filled in: the caller's user stack unwound into it, then sent.
 * `t0`: when the sending program started; `enter_ns`: what its entry took. */
static __always_inline void send_call_with_stack(struct event_record *e, __u32 slot, __u32 tid, __u32 api, __u64 t0, __u64 enter_ns)
{
	struct cuda_call_payload *c = &e->payload.cuda_call;
	__u64 size, flags;
	__u32 frames;

	unwind_user_stack(e, slot);
	/* A hook on another thread of this CPU may have taken the scratch entry meanwhile (uprobe
	 * programs can be preempted): such a record is dropped, and counted. */
	if (e->header.tid != tid || e->header.kind != EVENT_CUDA_CALL || c->api != api) {
		count(COUNTER_CUDA_RACE);
		return;
	}
	c->hook_ns = bpf_ktime_get_ns() - t0 + enter_ns;
	frames = e->stack.user_frames;
	if (frames > MAX_USER_FRAMES)
		frames = MAX_USER_FRAMES;
	size = EVENT_FIXED_BYTES + (__u64)frames * sizeof(__u64);
	/* Memory calls are rare, and user space must name their Python frames while the process
	 * lives (and hear of an out-of-memory at once): they wake it. */
	flags = cuda_class_of(api) <= CUDA_CLASS_MAP || cuda_class_of(api) == CUDA_CLASS_TENSOR_OOM ? BPF_RB_FORCE_WAKEUP : wake_when_filling();
	if (bpf_ringbuf_output(&samples, e, size, flags))
		count(COUNTER_CUDA_LOST);
}

#endif
