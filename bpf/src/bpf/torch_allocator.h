/* PyTorch's caching allocator: which tensors' stacks are taken (byte sampling); tensors' frees, from the entry hooks on its frees (cuda_hooks.h) and from its
 * pytorch:free probe (torch_probes.h), sent without a stack. */
#ifndef GPUFLAME_TORCH_ALLOCATOR_H
#define GPUFLAME_TORCH_ALLOCATOR_H

#include "cuda_records.h"
#include "live_allocations.h"

/* The pointer of the last tensor free a thread sent from a deleter or raw_delete: the same free
 * seen again in NativeCachingAllocator::free, which they call where a build did not inline it
 * (or tail-jump to), is not a second free. Per thread and read back at once, it costs a task
 * storage access (tens of ns) where a map of every freed pointer cost two hash updates a tensor
 * (~0.35 us by the kernel's count). An allocation on the thread of the pointer it holds clears it. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} tensor_free_marks SEC(".maps");

/* Byte sampling of tensors' stacks, as heap profilers sample: with an interval I
 * (tensor_sample_bytes, 0: every stack), a tensor of I bytes or more always has its stack taken,
 * and a smaller one of s bytes with probability 1 - exp(-s / I), by a countdown per CPU over the
 * bytes of small tensors that restarts at an exponential draw of mean I whenever it runs out.
 * User space weighs a drawn tensor by the inverse of that probability; every tensor is still
 * in the live set (live_allocations.h), so totals (allocated, reserved, cached) stay exact. Unwinding is most of what a tensor
 * costs (3.1 us of 3.7 in on_torch_malloc): that is what is saved. The draws are -ln(u) * I at
 * 1024 evenly spaced u, written by user space at load, picked at random. */
const volatile __u64 tensor_sample_bytes = 0;
#define TENSOR_DRAWS 1024

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TENSOR_DRAWS);
	__type(key, __u32);
	__type(value, __u64);
} tensor_draws SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} tensor_countdown SEC(".maps");

static __always_inline __u64 tensor_draw(void)
{
	__u32 i = bpf_get_prandom_u32() & (TENSOR_DRAWS - 1);
	__u64 *draw = bpf_map_lookup_elem(&tensor_draws, &i);

	return draw && *draw ? *draw : tensor_sample_bytes;
}

/* Whether the stack of a tensor of `size` bytes is taken. */
static __always_inline bool tensor_stack_drawn(__u64 size)
{
	__u32 zero = 0;
	__u64 *left;

	if (!tensor_sample_bytes || size >= tensor_sample_bytes)
		return true;
	left = bpf_map_lookup_elem(&tensor_countdown, &zero);
	if (!left)
		return true;
	if (!*left)
		*left = tensor_draw();
	if (size < *left) {
		*left -= size;
		return false;
	}
	*left = tensor_draw();
	return true;
}

/* An allocation handed `ptr` out again: its next free is a free. */
static __always_inline void tensor_allocated(__u64 ptr)
{
	__u64 *mark = bpf_task_storage_get(&tensor_free_marks, bpf_get_current_task_btf(), 0, 0);

	if (mark && *mark == ptr)
		*mark = 0;
}

/* PyTorch's allocator: a tensor's free is a pointer, out of the live set at once: no stack, no
 * wake-up, one trap (thousands a second). From the entry hooks on its frees and the pytorch:free
 * probe (torch_probes.h). */
static __always_inline void send_tensor_free(__u64 id, __u32 api, __u64 ptr)
{
	/* Only the outer frees set a mark; the inner one reads it. */
	__u64 *mark = bpf_task_storage_get(&tensor_free_marks, bpf_get_current_task_btf(), 0, api == C10_FREE ? 0 : BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (api == C10_FREE) {
		if (mark && *mark == ptr) {
			*mark = 0;
			return;
		}
	} else if (mark) {
		*mark = ptr;
	}
	count(COUNTER_CUDA_CALLS);
	live_freed(id >> 32, (__u32)id, ptr, api);
}

static __always_inline void tensor_freed(struct pt_regs *ctx, __u64 id, __u32 api)
{
	/* Both read first: a load at an offset chosen at run time is not allowed on ctx. */
	__u64 arg0 = PT_REGS_PARM1(ctx), arg1 = PT_REGS_PARM2(ctx);

	barrier_var(arg0);
	barrier_var(arg1);
	send_tensor_free(id, api, api == C10_LOCAL_RAW_DELETE ? arg0 : arg1);
}

#endif
