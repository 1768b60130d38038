/* PyTorch's own USDT probes in its CUDA caching allocator (libc10_cuda.so, 2.15 on):
 * pytorch:malloc (pointer, device, size, stream) once an allocation has succeeded, and
 * pytorch:free (pointer) in the deleter of every tensor. libbpf attaches them with the probes'
 * semaphores raised through the uprobe's reference counter, so the program pays for them only
 * while gpuflame is attached. A probe is a nop, which uprobes emulate (~0.5-1 us a hit), where
 * the return-site hooks of cuda_hooks.h, used where a library has no notes, stop at a mov that
 * the kernel single-steps (6-18 us). Records are those of the hooks: user space cannot tell them
 * apart. */
#ifndef GPUFLAME_TORCH_PROBES_H
#define GPUFLAME_TORCH_PROBES_H

#include "usdt_args.h"

#include "cuda_hooks.h"
#include "targets.h"
#include "torch_allocator.h"

SEC("usdt")
int on_torch_malloc(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid(), t0;
	__u32 tid = (__u32)id, slot = SCRATCH_CUDA;
	struct cuda_call_key key = { .tid = tid, .cls = CUDA_CLASS_TENSOR_ALLOC };
	struct cuda_call_payload *c;
	struct event_record *e;
	long ptr = 0, device = 0, size = 0, stream = 0;

	if (!is_target(id >> 32))
		return 0;
	t0 = bpf_ktime_get_ns();
	/* The malloc this went through has returned: what marks the thread as allocating (malloc's
	 * entry, hooked for raw_alloc's sake where alloc_block's calls are not found; an alloc_block
	 * that threw) goes, or a segment call later would look made inside it. Looked up first: a
	 * delete takes the bucket's lock even when there is nothing to delete, as there rarely is. */
	if (bpf_map_lookup_elem(&cuda_calls, &key))
		bpf_map_delete_elem(&cuda_calls, &key);
	if (usdt_args3(ctx, &ptr, &device, &size))
		return 0;
	tensor_allocated(ptr);
	if (!ptr)
		return 0;
	/* The stream, the probe's fourth argument: kept with the tensor, not needed to count it. */
	if (bpf_usdt_arg(ctx, 3, &stream))
		stream = 0;
	count(COUNTER_CUDA_CALLS);
	if (!tensor_stack_drawn(size)) {
		live_allocated(id >> 32, tid, ptr, size, 0, C10_MALLOC, (__u8)device, LIVE_SAMPLED_OUT, stream);
		return 0;
	}
	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return 0;
	cuda_header(e, EVENT_CUDA_CALL, id);
	c = &e->payload.cuda_call;
	__builtin_memset(c, 0, sizeof(*c));
	c->api = C10_MALLOC;
	c->device = (__u8)device;
	c->size = size;
	c->addr = ptr;
	c->handle = stream;
	send_call_with_stack(e, slot, tid, C10_MALLOC, t0, 0);
	return 0;
}

SEC("usdt")
int on_torch_free(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	long ptr = 0;

	if (!is_target(id >> 32) || bpf_usdt_arg(ctx, 0, &ptr))
		return 0;
	send_tensor_free(id, C10_LOCAL_RAW_DELETE, ptr);
	return 0;
}

#endif
