/* The CUPTI injection library's calls into gpuflame (launch correlations, kernel batches, names,
 * its status): hooked like the CUDA functions, sent at entry from their arguments. */
#ifndef GPUFLAME_CUPTI_TRANSPORT_H
#define GPUFLAME_CUPTI_TRANSPORT_H

#include "cuda_records.h"

/* An EVENT_CUPTI_KERNELS record: the fixed part of an event_record, then the records, which are
 * too many for the scratch entry's stack. */
struct cupti_kernels_event {
	__u8 fixed[EVENT_FIXED_BYTES];
	__u8 records[CUPTI_BATCH_MASK + 1];
};

/* The injection library's calls: everything is in their arguments, so they are sent at entry. */
static __always_inline void cupti_enter(struct pt_regs *ctx, __u64 id, __u32 api)
{
	__u32 slot = SCRATCH_CUDA, n, bytes;
	struct event_record *e = bpf_map_lookup_elem(&sample_scratch, &slot);
	__u64 size = EVENT_FIXED_BYTES;
	long len;

	if (!e)
		return;
	switch (api) {
	case CUPTI_LAUNCH:
		cuda_header(e, EVENT_CUPTI_LAUNCH, id);
		e->payload.cupti_launch.correlation = PT_REGS_PARM1(ctx);
		e->payload.cupti_launch.callback = PT_REGS_PARM2(ctx);
		unwind_user_stack(e, slot);
		if (!record_still_ours(e, (__u32)id, EVENT_CUPTI_LAUNCH))
			return;
		size = record_bytes_with_frames(e);
		break;
	case CUPTI_KERNELS: {
		struct cupti_kernels_event *r;

		n = PT_REGS_PARM2(ctx);
		if (n > CUPTI_BATCH)
			n = CUPTI_BATCH;
		if (n == 0)
			return;
		/* The mask changes nothing (682 records are 32736 bytes) but shows the verifier a bound. */
		bytes = (n * sizeof(struct cupti_kernel)) & CUPTI_BATCH_MASK;
		r = bpf_ringbuf_reserve(&samples, sizeof(*r), 0);
		if (!r) {
			count(COUNTER_CUDA_LOST);
			return;
		}
		cuda_header(e, EVENT_CUPTI_KERNELS, id);
		e->payload.cupti_kernels.count = n;
		e->payload.cupti_kernels._pad = 0;
		e->payload.cupti_kernels.dropped_total = PT_REGS_PARM3(ctx);
		__builtin_memcpy(r->fixed, e, sizeof(r->fixed));
		if (bpf_probe_read_user(r->records, bytes, (void *)PT_REGS_PARM1(ctx)))
			((struct event_record *)r)->payload.cupti_kernels.count = 0;
		bpf_ringbuf_submit(r, 0);
		return;
	}
	case CUPTI_NAME:
		cuda_header(e, EVENT_CUPTI_NAME, id);
		e->payload.cupti_name.id = PT_REGS_PARM1(ctx);
		len = bpf_probe_read_user_str(e->user_stack, CUDA_NAME_MAX, (void *)PT_REGS_PARM2(ctx));
		if (len <= 1)
			return;
		e->payload.cupti_name.name_len = len - 1;
		size += CUDA_NAME_MAX;
		break;
	default: /* CUPTI_STATUS */
		cuda_header(e, EVENT_CUPTI_STATUS, id);
		e->payload.cupti_status.code = PT_REGS_PARM1(ctx);
		e->payload.cupti_status._pad = 0;
		e->payload.cupti_status.ready_word = PT_REGS_PARM2(ctx);
		break;
	}
	send_record(e, size, WAKE_ADAPTIVE, COUNTER_CUDA_LOST);
}

#endif
