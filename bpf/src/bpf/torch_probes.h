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
	__u64 id = bpf_get_current_pid_tgid(), t0, ptr, size, device;
	__u32 tid = (__u32)id;
	struct cuda_call_key key = { .tid = tid, .cls = CUDA_CLASS_TENSOR_ALLOC };
	struct cuda_call_payload *c;
	struct event_record *e;

	if (!is_target(id >> 32))
		return 0;
	t0 = bpf_ktime_get_ns();
	/* The malloc this went through has returned: what marks the thread as allocating (malloc's
	 * entry, hooked for raw_alloc's sake where alloc_block's calls are not found; an alloc_block
	 * that threw) goes, or a segment call later would look made inside it. Looked up first: a
	 * delete takes the bucket's lock even when there is nothing to delete, as there rarely is. */
	if (bpf_map_lookup_elem(&cuda_calls, &key))
		bpf_map_delete_elem(&cuda_calls, &key);
	/* The arguments are read into the record being built, not into locals: the frame of this
	 * program and the unwinder's calls under it must stay within 512 bytes on older verifiers
	 * (6.1 counts them together). The stream, the fourth, is kept with the tensor. */
	e = bpf_map_lookup_elem(&sample_scratch, (__u32 *)&scratch_cuda_key);
	if (!e)
		return 0;
	c = &e->payload.cuda_call;
	if (usdt_args4(ctx, (long *)&c->addr, (long *)&c->duration_ns, (long *)&c->size, (long *)&c->handle))
		return 0;
	ptr = c->addr;
	size = c->size;
	device = (__u8)c->duration_ns;
	tensor_allocated(ptr);
	if (!ptr)
		return 0;
	count(COUNTER_CUDA_CALLS);
	if (!tensor_stack_drawn(size)) {
		live_allocated(id >> 32, tid, ptr, size, 0, C10_MALLOC, device, LIVE_SAMPLED_OUT, c->handle, bpf_ktime_get_boot_ns());
		return 0;
	}
	cuda_header(e, EVENT_CUDA_CALL, id);
	c->api = C10_MALLOC;
	c->result = 0;
	c->device = device;
	c->flags = 0;
	c->duration_ns = 0;
	c->size = size;
	c->addr = ptr;
	c->hook_ns = 0;
	c->stack_id = 0;
	send_call_with_stack(e, SCRATCH_CUDA, tid, C10_MALLOC, t0, 0);
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
