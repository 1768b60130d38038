/* CUDA hooks: session uprobes on CUDA runtime and driver functions, one program that runs at a
 * call's entry and, when the entry asks for it, at its return. The entry keeps the arguments per
 * thread; the return of the outermost call of its class sends one record with the result, the
 * out-pointer's value, the duration and the user stack of the caller. One link per file holds
 * both halves, so that detaching it takes the breakpoint out at once. */
#ifndef GPUFLAME_CUDA_HOOKS_H
#define GPUFLAME_CUDA_HOOKS_H

#include "maps.h"
#include "native_unwind.h"
#include "targets.h"

#define MAX_CUDA_CALLS 65536
#define CUDA_NAME_MAX 256

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

static __always_inline enum cuda_class cuda_class_of(__u32 api)
{
	if (api >= CUDA_MALLOC && api <= CU_MEM_CREATE)
		return CUDA_CLASS_ALLOC;
	if (api >= CUDA_FREE && api <= CU_MEM_RELEASE)
		return CUDA_CLASS_FREE;
	if (api == CU_MEM_MAP || api == CU_MEM_UNMAP)
		return CUDA_CLASS_MAP;
	if (api >= CUDA_LAUNCH_KERNEL && api <= CU_GRAPH_LAUNCH_PTSZ)
		return CUDA_CLASS_LAUNCH;
	if (api >= CUDA_DEVICE_SYNCHRONIZE && api <= CU_MEMCPY_DTOH_ASYNC)
		return CUDA_CLASS_API;
	if (api >= CUPTI_LAUNCH && api <= CUPTI_STATUS)
		return CUDA_CLASS_CUPTI;
	return CUDA_CLASS_META;
}

extern bool bpf_session_is_return(void) __ksym;

/* A program that does nothing at entry and return, to measure what the traps alone cost. */
SEC("uprobe.session")
int on_calibrate(struct pt_regs *ctx)
{
	return 0;
}

/* An EVENT_CUPTI_KERNELS record: a sample_event's fields up to its user stack, then records. */
struct cupti_kernels_event {
	struct {
		__u8 bytes[offsetof(struct sample_event, user_stack)];
	} header;
	__u8 records[CUPTI_BATCH_MASK + 1];
};

static __always_inline void fill_header(struct sample_event *e, __u64 id, __u32 api)
{
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->cpu = bpf_get_smp_processor_id();
	e->timestamp_ns = bpf_ktime_get_boot_ns();
	e->api = api;
	e->result = 0;
	e->device = 0;
	e->duration_ns = 0;
	e->kernel_stack_bytes = 0;
	e->size = 0;
	e->addr = 0;
	e->aux = 0;
	e->hook_ns = 0;
	e->user_frames = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
}

/* The injection library's calls: everything is in their arguments, so they are sent at entry. */
static __always_inline void cupti_enter(struct pt_regs *ctx, __u64 id, __u32 api)
{
	__u32 slot = SCRATCH_CUDA, n, frames, bytes;
	struct sample_event *e = bpf_map_lookup_elem(&sample_scratch, &slot);
	__u64 size = offsetof(struct sample_event, user_stack);
	long len;

	if (!e)
		return;
	fill_header(e, id, api);
	switch (api) {
	case CUPTI_LAUNCH:
		e->kind = EVENT_CUDA_CALL;
		e->addr = PT_REGS_PARM1(ctx) & 0xffffffff;
		e->aux = PT_REGS_PARM2(ctx) & 0xffffffff;
		unwind_user_stack(e, slot);
		if (e->tid != (__u32)id || e->api != api) {
			count(COUNTER_CUDA_RACE);
			return;
		}
		frames = e->user_frames;
		if (frames > MAX_USER_FRAMES)
			frames = MAX_USER_FRAMES;
		size += (__u64)frames * sizeof(__u64);
		break;
	case CUPTI_KERNELS: {
		/* Too big for the scratch entry: built in the ring buffer itself. */
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
		e->kind = EVENT_CUPTI_KERNELS;
		e->size = PT_REGS_PARM3(ctx);
		e->user_frames = n;
		__builtin_memcpy(&r->header, e, sizeof(r->header));
		if (bpf_probe_read_user(r->records, bytes, (void *)PT_REGS_PARM1(ctx)))
			((struct sample_event *)r)->user_frames = 0;
		bpf_ringbuf_submit(r, 0);
		return;
	}
	case CUPTI_NAME:
		e->kind = EVENT_CUPTI_NAME;
		e->addr = PT_REGS_PARM1(ctx) & 0xffffffff;
		len = bpf_probe_read_user_str(e->user_stack, CUDA_NAME_MAX, (void *)PT_REGS_PARM2(ctx));
		if (len <= 1)
			return;
		e->size = len - 1;
		size += CUDA_NAME_MAX;
		break;
	default: /* CUPTI_STATUS */
		e->kind = EVENT_CUDA_CALL;
		e->result = PT_REGS_PARM1(ctx) & 0xffffffff;
		e->addr = PT_REGS_PARM2(ctx);
		break;
	}
	if (bpf_ringbuf_output(&samples, e, size, 0))
		count(COUNTER_CUDA_LOST);
}

/* At entry: 0 asks for the return half, 1 does not (the return trap is then saved). */
static __always_inline int cuda_enter(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id, *device;
	__u32 api = (__u32)bpf_get_attach_cookie(ctx);
	struct cuda_call_key key = { .tid = tid, .cls = cuda_class_of(api) };
	struct cuda_call call = {}, *outer;
	__u32 location_id;

	if (!is_target(tgid))
		return 1;
	if (key.cls == CUDA_CLASS_CUPTI) {
		cupti_enter(ctx, id, api);
		return 1;
	}
	call.sp = PT_REGS_SP(ctx);
	/* A call of the same class deeper in this thread's stack is nested in one that counts. A
	 * recorded call whose return was never seen (its hook went away) is higher up or gone. */
	outer = bpf_map_lookup_elem(&cuda_calls, &key);
	if (outer && call.sp < outer->sp)
		return 1;
	call.t0 = bpf_ktime_get_ns();
	call.api = api;
	call.args[0] = PT_REGS_PARM1(ctx);
	call.args[1] = PT_REGS_PARM2(ctx);
	call.args[2] = PT_REGS_PARM3(ctx);
	call.args[3] = PT_REGS_PARM4(ctx);
	device = bpf_map_lookup_elem(&cuda_devices, &tid);
	call.device = device ? *device : 0;
	/* CUmemAllocationProp: location.id, the device, is at byte 12. */
	if (api == CU_MEM_CREATE && call.args[2] &&
	    !bpf_probe_read_user(&location_id, sizeof(location_id), (void *)(call.args[2] + 12)))
		call.device = location_id;
	if (bpf_map_update_elem(&cuda_calls, &key, &call, BPF_ANY)) {
		count(COUNTER_CUDA_CALLS_FULL);
		return 1;
	}
	return 0;
}

/* The kernel handle cuModuleGetFunction returned, with its name. */
static __always_inline void send_kernel_name(struct sample_event *e, struct cuda_call *call)
{
	__u64 handle = 0;
	long len;

	if (bpf_probe_read_user(&handle, sizeof(handle), (void *)call->args[0]) || !handle)
		return;
	len = bpf_probe_read_user_str(e->user_stack, CUDA_NAME_MAX, (void *)call->args[2]);
	if (len <= 1)
		return;
	e->kind = EVENT_CUDA_KERNEL;
	e->addr = handle;
	e->size = len - 1;
	e->user_frames = 0;
	if (bpf_ringbuf_output(&samples, e, offsetof(struct sample_event, user_stack) + CUDA_NAME_MAX, 0))
		count(COUNTER_CUDA_LOST);
}

static __always_inline int cuda_return(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid(), now = bpf_ktime_get_ns(), size, flags;
	__u32 tgid = id >> 32, tid = (__u32)id, api = (__u32)bpf_get_attach_cookie(ctx);
	__u32 slot = SCRATCH_CUDA, frames;
	struct cuda_call_key key = { .tid = tid, .cls = cuda_class_of(api) };
	struct cuda_call *found, call;
	struct sample_event *e;
	__s32 result;

	found = bpf_map_lookup_elem(&cuda_calls, &key);
	/* Only the return of the recorded call itself: its ret popped the slot it was called with. */
	if (!found || PT_REGS_SP(ctx) != found->sp + 8 || found->api != api)
		return 0;
	call = *found;
	bpf_map_delete_elem(&cuda_calls, &key);
	result = (__s32)PT_REGS_RC(ctx);
	count(COUNTER_CUDA_CALLS);

	if (api == CUDA_SET_DEVICE) {
		__u32 device = (__u32)call.args[0];
		if (result == 0)
			bpf_map_update_elem(&cuda_devices, &tid, &device, BPF_ANY);
		return 0;
	}
	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return 0;
	e->tid = tid;
	e->pid = tgid;
	e->cpu = bpf_get_smp_processor_id();
	e->timestamp_ns = bpf_ktime_get_boot_ns();
	e->api = api;
	e->result = result;
	e->device = call.device;
	e->duration_ns = now - call.t0;
	e->kernel_stack_bytes = 0;
	e->aux = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	if (api == CU_MODULE_GET_FUNCTION) {
		if (result == 0)
			send_kernel_name(e, &call);
		return 0;
	}

	e->kind = EVENT_CUDA_CALL;
	e->size = 0;
	e->addr = 0;
	switch (cuda_class_of(api)) {
	case CUDA_CLASS_ALLOC:
		e->size = call.args[1];
		if (result == 0 && bpf_probe_read_user(&e->addr, sizeof(e->addr), (void *)call.args[0]))
			e->addr = 0;
		break;
	case CUDA_CLASS_FREE:
		e->addr = call.args[0];
		break;
	case CUDA_CLASS_MAP:
		e->addr = call.args[0];
		e->size = call.args[1];
		e->aux = call.args[3];
		break;
	case CUDA_CLASS_LAUNCH:
		e->addr = (api == CUDA_LAUNCH_KERNEL_EXC || api == CUDA_LAUNCH_KERNEL_EXC_PTSZ ||
			   api == CU_LAUNCH_KERNEL_EX || api == CU_LAUNCH_KERNEL_EX_PTSZ) ? call.args[1] : call.args[0];
		break;
	default:
		break;
	}
	unwind_user_stack(e, slot);
	/* A hook on another thread of this CPU may have taken the scratch entry meanwhile (uprobe
	 * programs can be preempted): such a record is dropped, and counted. */
	if (e->tid != tid || e->api != api) {
		count(COUNTER_CUDA_RACE);
		return 0;
	}
	e->hook_ns = bpf_ktime_get_ns() - now;
	frames = e->user_frames;
	if (frames > MAX_USER_FRAMES)
		frames = MAX_USER_FRAMES;
	size = offsetof(struct sample_event, user_stack) + (__u64)frames * sizeof(__u64);
	/* Memory calls are rare, and user space must name their Python frames while the process
	 * lives (and hear of an out-of-memory at once): they wake it. */
	flags = cuda_class_of(api) <= CUDA_CLASS_MAP ||
			bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) > SAMPLES_WAKEUP_BYTES
		? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&samples, e, size, flags))
		count(COUNTER_CUDA_LOST);
	return 0;
}


SEC("uprobe.session")
int on_cuda_call(struct pt_regs *ctx)
{
	return bpf_session_is_return() ? cuda_return(ctx) : cuda_enter(ctx);
}

#endif
