/* The records of the CUDA hooks, PyTorch's allocator probes and the CUPTI transport: the header of
 * the current thread, and a call's record with the caller's user stack (sent as every record is,
 * records.h). */
#ifndef GPUFLAME_CUDA_RECORDS_H
#define GPUFLAME_CUDA_RECORDS_H

#include "cuda_api.h"
#include "cuda_classes.h"
#include "live_allocations.h"
#include "maps.h"
#include "native_unwind.h"
#include "records.h"

/* PyTorch's mangled kernel names run past 256 bytes, and a name cut short cannot be demangled. */
#define CUDA_NAME_MAX 1024

/* The header of a record of the current thread; its stack zeroed, for the kinds that have none
 * (those that have one unwind into it). */
static __always_inline void cuda_header(struct event_record *e, __u32 kind, __u64 id)
{
	record_header(e, kind, id >> 32, (__u32)id, NULL);
}

/* Whether the call's record is of an allocation the live set keeps: a tensor, or a segment that
 * is an address (cuMemCreate's physical memory is user space's to follow). */
static __always_inline bool is_live_allocation(struct cuda_call_payload *c, __u32 cls)
{
	if (!c->addr)
		return false;
	return cls == CUDA_CLASS_TENSOR_ALLOC || (cls == CUDA_CLASS_ALLOC && c->result == 0 && c->api != CU_MEM_CREATE);
}

/* A call's record, its payload filled in: the caller's user stack unwound into it, then sent.
 * `t0`: when the sending program started; `enter_ns`: what its entry took. */
static __always_inline void send_call_with_stack(struct event_record *e, __u32 slot, __u32 tid, __u32 api, __u64 t0, __u64 enter_ns)
{
	struct cuda_call_payload *c = &e->payload.cuda_call;
	__u32 cls = cuda_class_of(api);
	enum record_wake wake;

	unwind_user_stack(e, slot);
	if (!record_still_ours(e, tid, EVENT_CUDA_CALL))
		return;
	if (c->api != api) {
		count(COUNTER_CUDA_RACE);
		return;
	}
	/* Segment calls are rare, and user space must name their Python frames while the process
	 * lives (and hear of an out-of-memory at once): they wake it. A tensor's stack is new only
	 * once, and waits for the ring to fill like the rest. */
	wake = cls <= CUDA_CLASS_MAP || cls == CUDA_CLASS_TENSOR_OOM ? WAKE_AT_ONCE : WAKE_WHEN_FILLING;
	if (is_live_allocation(c, cls)) {
		send_allocation(e, cls != CUDA_CLASS_TENSOR_ALLOC, wake, t0, enter_ns);
		return;
	}
	c->hook_ns = bpf_ktime_get_ns() - t0 + enter_ns;
	if (cls == CUDA_CLASS_TENSOR_OOM || (cls == CUDA_CLASS_ALLOC && c->result == 2)) {
		send_oom_record(e, record_bytes_with_frames(e), COUNTER_CUDA_LOST);
		return;
	}
	send_record(e, record_bytes_with_frames(e), wake, COUNTER_CUDA_LOST);
}

#endif
