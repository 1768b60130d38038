/* CUDA hooks: session uprobes on CUDA runtime and driver functions, one program that runs at a
 * call's entry and, when the entry asks for it, at its return. The entry keeps the arguments per
 * thread; the return of the outermost call of its class sends one record with the result, the
 * out-pointer's value, the duration and the user stack of the caller. One link per file holds
 * both halves, so that detaching it takes the breakpoint out at once.
 *
 * Kernels before uprobe sessions (Linux 6.13) run the same two halves from an entry uprobe and a
 * return uprobe of their own (on_cuda_entry, on_cuda_return): the return half then runs after
 * every hooked call, and keeps to the recorded one by its stack slot, as it does in a session. */
#ifndef GPUFLAME_CUDA_HOOKS_H
#define GPUFLAME_CUDA_HOOKS_H

#include "cuda_records.h"
#include "cupti_transport.h"
#include "targets.h"
#include "torch_allocator.h"

#define MAX_CUDA_CALLS 65536

struct cuda_call_key {
	__u32 tid;
	__u32 cls; /* enum cuda_class */
};

struct cuda_call {
	__u64 t0;
	__u64 sp; /* at entry: the slot of the return address */
	__u64 args[4];
	__u32 api;
	__u32 device;
	__u32 flags; /* enum cuda_call_flags */
	__u32 enter_ns; /* what the entry programs took: this call's and those of the calls nested in it */
	__u64 inner; /* a runtime launch: the function handle of the driver launch it made */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CUDA_CALLS);
	__type(key, struct cuda_call_key);
	__type(value, struct cuda_call);
} cuda_calls SEC(".maps");

/* tid -> the device its last successful cudaSetDevice chose (CUDA's default is 0). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} cuda_devices SEC(".maps");

/* The kfunc took no argument in its first kernels (6.13, and 6.18 still) and takes the context in
 * later ones (7.2 has it); a kernel has one of the two, and libbpf resolves the flavour it has
 * (weak: the other is left unresolved, in code the verifier sees is dead). Loaded only where the
 * kernel has sessions. */
extern bool bpf_session_is_return___noctx(void) __ksym __weak;
extern bool bpf_session_is_return___ctx(void *ctx) __ksym __weak;

static __always_inline bool session_is_return(void *ctx)
{
	if (bpf_ksym_exists(bpf_session_is_return___ctx))
		return bpf_session_is_return___ctx(ctx);
	return bpf_session_is_return___noctx();
}

/* Programs that do nothing at entry and return, to measure what the traps alone cost. */
SEC("uprobe.session")
int on_calibrate(struct pt_regs *ctx)
{
	return 0;
}

SEC("uprobe")
int on_calibrate_entry(struct pt_regs *ctx)
{
	return 0;
}

SEC("uretprobe")
int on_calibrate_return(struct pt_regs *ctx)
{
	return 0;
}

/* The CUfunction (or CUkernel) a driver launch runs; 0 for the others. */
static __always_inline __u64 driver_launch_function(struct pt_regs *ctx, __u32 api)
{
	/* Both read first: a load at an offset chosen at run time is not allowed on ctx. */
	__u64 arg0 = PT_REGS_PARM1(ctx), arg1 = PT_REGS_PARM2(ctx);

	barrier_var(arg0);
	barrier_var(arg1);
	if (api == CU_LAUNCH_KERNEL || api == CU_LAUNCH_KERNEL_PTSZ)
		return arg0;
	if (api == CU_LAUNCH_KERNEL_EX || api == CU_LAUNCH_KERNEL_EX_PTSZ)
		return arg1;
	return 0;
}

/* At entry: 0 asks for the return half, 1 does not (the return trap is then saved). */
/* The entry of a call that is recorded per thread (all but CUPTI's and the frees). Its locals in
 * a scope of their own: the compiler then lays them over the unwinder's state of cupti_enter's
 * walk, and the entry's frame stays within what older verifiers allow a chain of calls. */
static __always_inline int cuda_enter_call(struct pt_regs *ctx, __u64 id, __u64 cookie, __u32 api, __u64 t0)
{
	__u32 tid = (__u32)id, *device;
	struct cuda_call_key key = { .tid = tid, .cls = cuda_class_of(api) };
	struct cuda_call call = {}, *outer;
	__u32 location_id;

	call.t0 = t0;
	call.sp = PT_REGS_SP(ctx);
	if (api == C10_MALLOC_CALLED || api == C10_ALLOC_BLOCK_CALLED) {
		/* On the call instruction: the callee's return slot is the next one down. */
		call.sp -= 8;
		if (api == C10_MALLOC_CALLED)
			api = C10_MALLOC;
	}
	/* A call of the same class deeper in this thread's stack is nested in one that counts. A
	 * recorded call whose return was never seen (its hook went away) is higher up or gone. */
	/* The allocator's malloc does not nest, and one that threw left its entry behind. */
	outer = bpf_map_lookup_elem(&cuda_calls, &key);
	/* A new segment for raw_alloc's malloc, which is recorded already and marks the thread. */
	if (api == C10_ALLOC_BLOCK_CALLED && outer && call.sp < outer->sp)
		return 1;
	if (outer && call.sp < outer->sp && key.cls != CUDA_CLASS_TENSOR_ALLOC) {
		/* The driver launch a runtime launch makes: its function handle names the kernel where
		 * the runtime's host stub has no symbol (PyTorch's libraries have no .symtab). */
		if (key.cls == CUDA_CLASS_LAUNCH && !outer->inner)
			outer->inner = driver_launch_function(ctx, api);
		if (((outer->flags >> CUDA_CALL_NESTED_SHIFT) & 0xff) < CUDA_CALL_NESTED_MAX) {
			outer->flags += 1 << CUDA_CALL_NESTED_SHIFT;
			if (cookie & CUDA_COOKIE_STEPPED)
				outer->flags += 1 << CUDA_CALL_NESTED_STEPPED_SHIFT;
		}
		outer->enter_ns += bpf_ktime_get_ns() - call.t0;
		return 1;
	}
	call.api = api;
	call.args[0] = PT_REGS_PARM1(ctx);
	call.args[1] = PT_REGS_PARM2(ctx);
	call.args[2] = PT_REGS_PARM3(ctx);
	call.args[3] = PT_REGS_PARM4(ctx);
	device = bpf_map_lookup_elem(&cuda_devices, &tid);
	call.device = device ? *device : 0;
	if (api == C10_MALLOC)
		call.device = (__u8)call.args[2];
	/* A segment the caching allocator asks for while a tensor waits: the tensor is what the
	 * program allocated; user space says so. */
	if (key.cls == CUDA_CLASS_ALLOC) {
		struct cuda_call_key tensor = { .tid = tid, .cls = CUDA_CLASS_TENSOR_ALLOC };
		outer = bpf_map_lookup_elem(&cuda_calls, &tensor);
		if (outer && call.sp < outer->sp)
			call.flags = CUDA_CALL_IN_ALLOCATOR;
	}
	/* CUmemAllocationProp: location.id, the device, is at byte 12. */
	if (api == CU_MEM_CREATE && call.args[2] &&
	    !bpf_probe_read_user(&location_id, sizeof(location_id), (void *)(call.args[2] + 12)))
		call.device = location_id;
	if (cookie & CUDA_COOKIE_STEPPED)
		call.flags |= CUDA_CALL_STEPPED;
	call.enter_ns = bpf_ktime_get_ns() - call.t0;
	if (bpf_map_update_elem(&cuda_calls, &key, &call, BPF_ANY)) {
		count(COUNTER_CUDA_CALLS_FULL);
		return 1;
	}
	/* Its return is seen where its callers resume (C10_MALLOC_RETURNED, C10_ALLOC_BLOCK_RETURNED):
	 * a return probe on a call instruction would take the caller's return address. */
	return api == C10_MALLOC || api == C10_ALLOC_BLOCK_CALLED;
}

static __always_inline int cuda_enter(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid(), cookie = bpf_get_attach_cookie(ctx), t0;
	__u32 api = cookie & CUDA_COOKIE_API_MASK, cls = cuda_class_of(api);

	if (!is_target(id >> 32))
		return 1;
	/* From here: what the program takes is part of what hooking cost the call (enter_ns). */
	t0 = bpf_ktime_get_ns();
	if (cls == CUDA_CLASS_CUPTI) {
		cupti_enter(ctx, id, api);
		return 1;
	}
	if (cls == CUDA_CLASS_TENSOR_FREE) {
		tensor_freed(ctx, id, api);
		return 1;
	}
	return cuda_enter_call(ctx, id, cookie, api, t0);
}

/* The kernel handle cuModuleGetFunction or cuLibraryGetKernel returned, with its name. */
static __always_inline void send_kernel_name(struct event_record *e, __u64 id, struct cuda_call *call)
{
	__u64 handle = 0;
	long len;

	if (bpf_probe_read_user(&handle, sizeof(handle), (void *)call->args[0]) || !handle)
		return;
	cuda_header(e, EVENT_CUDA_KERNEL, id);
	len = bpf_probe_read_user_str(e->user_stack, CUDA_NAME_MAX, (void *)call->args[2]);
	if (len <= 1)
		return;
	e->payload.kernel_name.handle = handle;
	e->payload.kernel_name.name_len = len - 1;
	e->payload.kernel_name._pad = 0;
	send_record(e, EVENT_FIXED_BYTES + CUDA_NAME_MAX, WAKE_ADAPTIVE, COUNTER_CUDA_LOST);
}

/* `api`: the call whose return this is. */
static __always_inline int forget_call(struct cuda_call_key *key)
{
	bpf_map_delete_elem(&cuda_calls, key);
	return 0;
}

static __always_inline int cuda_return(struct pt_regs *ctx, __u32 api)
{
	__u64 id = bpf_get_current_pid_tgid(), now = bpf_ktime_get_ns();
	__u32 tid = (__u32)id;
	struct cuda_call_key key = { .tid = tid, .cls = cuda_class_of(api) };
	struct cuda_call *call;
	struct cuda_call_payload *c;
	struct event_record *e;
	__s32 result;

	call = bpf_map_lookup_elem(&cuda_calls, &key);
	/* Only the return of the recorded call itself: its ret popped the slot it was called with. */
	if (!call || PT_REGS_SP(ctx) != call->sp + 8 || call->api != api)
		return 0;
	/* The segment calls alloc_block made are made for a tensor; it sends nothing itself. */
	if (api == C10_ALLOC_BLOCK_CALLED)
		return forget_call(&key);
	/* Read where it is, and forgotten on the way out: a copy on the stack left too little of
	 * it for the unwinder's calls. */
	result = (__s32)PT_REGS_RC(ctx);
	count(COUNTER_CUDA_CALLS);

	if (api == CUDA_SET_DEVICE) {
		__u32 device = (__u32)call->args[0];
		if (result == 0)
			bpf_map_update_elem(&cuda_devices, &tid, &device, BPF_ANY);
		return forget_call(&key);
	}
	e = bpf_map_lookup_elem(&sample_scratch, (__u32 *)&scratch_cuda_key);
	if (!e)
		return forget_call(&key);
	if (api == CU_MODULE_GET_FUNCTION || api == CU_LIBRARY_GET_KERNEL) {
		if (result == 0)
			send_kernel_name(e, id, call);
		return forget_call(&key);
	}

	cuda_header(e, EVENT_CUDA_CALL, id);
	c = &e->payload.cuda_call;
	c->api = api;
	c->result = result;
	c->device = call->device;
	c->flags = call->flags;
	c->duration_ns = now - call->t0;
	c->size = 0;
	c->addr = 0;
	c->handle = 0;
	c->hook_ns = 0;
	c->stack_id = 0;
	switch (cuda_class_of(api)) {
	case CUDA_CLASS_ALLOC:
		c->size = call->args[1];
		if (result == 0 && bpf_probe_read_user(&c->addr, sizeof(c->addr), (void *)call->args[0]))
			c->addr = 0;
		/* Out of memory outside PyTorch's allocator (which retries): what held it is read. */
		if (result == 2 && !(call->flags & CUDA_CALL_IN_ALLOCATOR))
			live_hold_for_oom(id >> 32);
		break;
	case CUDA_CLASS_FREE:
		c->addr = call->args[0];
		/* Out of the live set now; the record goes on for the CUDA API profile. */
		if (result == 0 && c->addr && api != CU_MEM_RELEASE)
			live_freed(id >> 32, tid, c->addr, api);
		break;
	case CUDA_CLASS_TENSOR_OOM: {
		/* The allocator reports, then throws: the malloc it is in never returns, and is
		 * forgotten here, or a later call on this thread would look nested in it. c10::Device,
		 * by value: its type in the low byte, its index in the next. */
		struct cuda_call_key alloc = { .tid = tid, .cls = CUDA_CLASS_TENSOR_ALLOC };

		bpf_map_delete_elem(&cuda_calls, &alloc);
		live_hold_for_oom(id >> 32);
		c->result = 2;
		c->size = call->args[0];
		c->addr = call->args[1];
		c->handle = call->args[2];
		c->device = (__u8)(call->args[3] >> 8);
		break;
	}
	case CUDA_CLASS_TENSOR_ALLOC:
		/* malloc returns nothing: the block is what it wrote to *ptr. */
		c->result = 0;
		c->size = call->args[3];
		if (bpf_probe_read_user(&c->addr, sizeof(c->addr), (void *)call->args[1]))
			c->addr = 0;
		tensor_allocated(c->addr);
		if (c->addr && !tensor_stack_drawn(c->size)) {
			live_allocated(id >> 32, tid, c->addr, c->size, 0, C10_MALLOC, c->device, LIVE_SAMPLED_OUT, 0, bpf_ktime_get_boot_ns());
			return forget_call(&key);
		}
		break;
	case CUDA_CLASS_MAP:
		c->addr = call->args[0];
		c->size = call->args[1];
		c->handle = call->args[3];
		break;
	case CUDA_CLASS_LAUNCH:
		c->addr = (api == CUDA_LAUNCH_KERNEL_EXC || api == CUDA_LAUNCH_KERNEL_EXC_PTSZ ||
			   api == CU_LAUNCH_KERNEL_EX || api == CU_LAUNCH_KERNEL_EX_PTSZ) ? call->args[1] : call->args[0];
		c->handle = call->inner;
		break;
	case CUDA_CLASS_COLLECTIVE:
		/* The element count and the datatype; user space knows the datatypes' sizes. */
		if (api == NCCL_BCAST || api == NCCL_SEND || api == NCCL_RECV) {
			c->size = call->args[1];
			c->handle = call->args[2];
		} else {
			c->size = call->args[2];
			c->handle = call->args[3];
		}
		break;
	default:
		break;
	}
	send_call_with_stack(e, SCRATCH_CUDA, tid, api, now, call->enter_ns);
	return forget_call(&key);
}


/* The call whose return a hook at the instructions after a call stands for. */
static __always_inline __u32 returned_api(__u32 api)
{
	if (api == C10_MALLOC_RETURNED)
		return C10_MALLOC;
	if (api == C10_ALLOC_BLOCK_RETURNED)
		return C10_ALLOC_BLOCK_CALLED;
	return api;
}

/* Either half of a hooked call. At entry, 0 asks for the return half (in a session). */
static __always_inline int cuda_hook(struct pt_regs *ctx, bool returned)
{
	__u32 api = (__u32)bpf_get_attach_cookie(ctx) & CUDA_COOKIE_API_MASK;

	/* One copy of the return half, for both kinds of return: its stack is large. */
	if (returned || api == C10_MALLOC_RETURNED || api == C10_ALLOC_BLOCK_RETURNED) {
		cuda_return(ctx, returned_api(api));
		return 1;
	}
	return cuda_enter(ctx);
}

SEC("uprobe.session")
int on_cuda_call(struct pt_regs *ctx)
{
	return cuda_hook(ctx, session_is_return(ctx));
}

/* Without sessions, the halves are programs of their own, so that neither takes the other's
 * stack: together they passed the 512 bytes older verifiers allow a chain of calls. */
SEC("uprobe")
int on_cuda_entry(struct pt_regs *ctx)
{
	cuda_enter(ctx);
	return 0;
}

/* Attached as a return probe to functions, and as an entry probe to the instructions after a
 * call (C10_MALLOC_RETURNED, C10_ALLOC_BLOCK_RETURNED). */
SEC("uprobe")
int on_cuda_return(struct pt_regs *ctx)
{
	cuda_hook(ctx, true);
	return 0;
}

#endif
