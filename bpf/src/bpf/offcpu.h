/* Off-CPU time: how long target threads spend switched out, and the stack at which they left the
 * CPU. At a switch-out the thread is still current, so its user memory and registers are readable
 * and the CPU sampler's unwinder (native + Python) works unchanged; at the switch-in of the same
 * thread the time off is known. Unwinding every switch-out would cost too much at 100k+ switches
 * a second, so a switch-out is unwound only while its thread has unwinds left (a burst, then one
 * back per offcpu_interval_ns) and its CPU too (a budget per second); the others only add their
 * time to the thread's "not unwound" total, which user space spreads over that thread's unwound
 * waits. A thread that waits long is not switching often: its burst is full when it blocks.
 * Preemptions take only from the CPU's budget: a thread busy on a crowded CPU is preempted every
 * few ms, and when they spent its own unwinds its next sleep went unwound and its time was spread
 * over the preemptions (a 300 ms sleep chain got 1.4 s of 1.8 beside a CPU hog). The scheduler,
 * not the thread, decides how often it is preempted; the CPU's budget bounds that cost. */
#ifndef GPUFLAME_OFFCPU_H
#define GPUFLAME_OFFCPU_H

#include "maps.h"
#include "native_unwind.h"
#include "targets.h"

#define TASK_RUNNING_STATE 0x0
#define TASK_STATE_MASK 0x3 /* TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE */
#define TASK_DEAD_STATE 0x80
#define PF_EXITING_FLAG 0x00000004
#define PF_KTHREAD_FLAG 0x00200000

/* Set before load (SamplerConfig): the per-thread unwind interval and the per-CPU budget. */
const volatile __u64 offcpu_interval_ns = 10000000;
const volatile __u64 offcpu_thread_burst = 16;
const volatile __u64 offcpu_cpu_burst = 64;
const volatile __u64 offcpu_cpu_refill_ns = 500000; /* one unwind back every 0.5 ms: 2000/s */

struct offcpu_thread {
	__u64 off_since;     /* when it switched out; 0 while it runs */
	__u64 refilled;      /* when its unwinds were last given back */
	__u64 tokens;        /* unwinds it has left */
	__u64 seq;           /* the stack record of the current wait, or 0 when it was not unwound */
	__u64 next_seq;
	__u64 unsent_ns;     /* off time of waits not unwound, not yet sent */
};

/* Per-thread state in the task itself: a pointer away from the task_struct the tracepoint hands
 * over, where a hash map cost a lookup by tid on every switch-out and switch-in; freed with the
 * task, so no entry can outlive its thread. A thread has state only once it is known to be a
 * target, so having state also answers "is it a target" without the targets map. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct offcpu_thread);
} offcpu_threads SEC(".maps");

struct offcpu_budget {
	__u64 since_ns;
	__u64 tokens;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_budget);
} offcpu_budgets SEC(".maps");

static __always_inline bool take_unwind_token(__u64 now)
{
	__u32 zero = 0;
	struct offcpu_budget *b = bpf_map_lookup_elem(&offcpu_budgets, &zero);
	__u64 back;

	if (!b)
		return false;
	if (!b->since_ns) {
		b->since_ns = now;
		b->tokens = offcpu_cpu_burst;
	}
	back = (now - b->since_ns) / (offcpu_cpu_refill_ns ? offcpu_cpu_refill_ns : 1);
	if (back) {
		b->tokens = b->tokens + back > offcpu_cpu_burst ? offcpu_cpu_burst : b->tokens + back;
		b->since_ns = now;
	}
	if (!b->tokens)
		return false;
	b->tokens--;
	return true;
}

/* The end of a wait: the time goes to the stack record `seq` (0: none), with the time of waits not
 * unwound since the last record of the thread. A header-sized record, no stack. */
static __always_inline void send_offcpu_end(struct task_struct *task, struct offcpu_thread *t, __u64 off_ns)
{
	struct event_record *e;
	__u32 slot = SCRATCH_OFFCPU;

	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return;
	e->header.kind = EVENT_OFFCPU_END;
	e->header.pid = task->tgid;
	e->header.tid = task->pid;
	e->header.cpu = bpf_get_smp_processor_id();
	e->header.timestamp_ns = bpf_ktime_get_boot_ns();
	__builtin_memcpy(e->header.comm, task->comm, sizeof(e->header.comm));
	__builtin_memset(&e->stack, 0, sizeof(e->stack));
	e->payload.offcpu_end.wait = t->seq;
	e->payload.offcpu_end.off_ns = off_ns;
	e->payload.offcpu_end.not_unwound_ns = t->unsent_ns;
	if (bpf_ringbuf_output(&samples, e, EVENT_FIXED_BYTES, BPF_RB_NO_WAKEUP))
		count(COUNTER_OFFCPU_LOST);
	else
		t->unsent_ns = 0;
}

/* The switch-out of the current task `prev`: unwinds it (when its turn) and sends the stack, cut
 * after its used entries with the kernel frames right after the user ones. */
static __always_inline void offcpu_switch_out(void *ctx, struct task_struct *prev, unsigned int prev_state, __u64 now)
{
	__u32 tid = prev->pid, slot = SCRATCH_OFFCPU, frames;
	struct offcpu_thread *t;
	struct event_record *e;
	long kbytes;
	__u64 size;
	bool preempted;

	if (prev->flags & (PF_KTHREAD_FLAG | PF_EXITING_FLAG) || prev_state & TASK_DEAD_STATE)
		return; /* its last switches: its time ends with it */
	t = bpf_task_storage_get(&offcpu_threads, prev, 0, 0);
	if (!t) {
		if (!is_target(prev->tgid))
			return;
		t = bpf_task_storage_get(&offcpu_threads, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!t) {
			count(COUNTER_OFFCPU_FULL);
			return;
		}
		count(COUNTER_OFFCPU_FOLLOWED);
	}
	count(COUNTER_OFFCPU_SWITCHES);
	t->off_since = now;
	t->seq = 0;
	if (!t->refilled) {
		t->refilled = now;
		t->tokens = offcpu_thread_burst;
	} else if (now - t->refilled >= offcpu_interval_ns) {
		__u64 back = (now - t->refilled) / (offcpu_interval_ns ? offcpu_interval_ns : 1);

		t->tokens = t->tokens + back > offcpu_thread_burst ? offcpu_thread_burst : t->tokens + back;
		t->refilled = now;
	}
	preempted = prev_state == TASK_RUNNING_STATE;
	if (!t->tokens && !preempted)
		return;
	if (!take_unwind_token(now)) {
		count(COUNTER_OFFCPU_BUDGET);
		return;
	}
	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return;
	if (!preempted)
		t->tokens--;
	t->seq = ++t->next_seq;
	count(COUNTER_OFFCPU_UNWOUND);
	e->header.kind = EVENT_OFFCPU_STACK;
	e->header.pid = prev->tgid;
	e->header.tid = tid;
	e->header.cpu = bpf_get_smp_processor_id();
	e->header.timestamp_ns = bpf_ktime_get_boot_ns();
	bpf_get_current_comm(e->header.comm, sizeof(e->header.comm));
	e->payload.offcpu_stack.wait = t->seq;
	e->payload.offcpu_stack.state = prev_state;
	e->payload.offcpu_stack._pad = 0;
	unwind_user_stack(e, slot);
	frames = e->stack.user_frames;
	if (frames > MAX_USER_FRAMES)
		frames = MAX_USER_FRAMES;
	/* user_stack and kernel_stack are one array of MAX_USER_FRAMES + MAX_KERNEL_FRAMES slots. */
	/* Its leaf frames are this program and the tracepoint's; user space leaves them out by name
	 * (how many there are differs between calls). */
	kbytes = bpf_get_stack(ctx, &e->user_stack[frames], MAX_KERNEL_FRAMES * 8, 0);
	if (kbytes < 0) {
		count(COUNTER_KSTACK_FAILED);
		kbytes = 0;
	}
	e->stack.kernel_stack_bytes = kbytes;
	size = EVENT_FIXED_BYTES + (__u64)frames * 8 + (kbytes & 0x3ff);
	if (size > sizeof(*e))
		size = sizeof(*e);
	if (bpf_ringbuf_output(&samples, e, size, BPF_RB_NO_WAKEUP)) {
		count(COUNTER_OFFCPU_LOST);
		t->seq = 0;
	}
}

static __always_inline void offcpu_switch_in(struct task_struct *next, __u64 now)
{
	struct offcpu_thread *t = bpf_task_storage_get(&offcpu_threads, next, 0, 0);
	__u64 off;

	if (!t || !t->off_since)
		return;
	off = now - t->off_since;
	t->off_since = 0;
	if (t->seq) {
		send_offcpu_end(next, t, off);
		t->seq = 0;
	} else {
		t->unsent_ns += off;
	}
}

/* The run queue's clock, which __schedule updated right before this tracepoint, read from memory
 * instead of the clock source: on this VM a bpf_ktime_get_ns call alone cost 110 ns of a 300 ns
 * switch path. It is the scheduler's clock (sched_clock: one time base across CPUs where the TSC
 * is stable, as the scheduler itself assumes), used only for the difference between a thread's
 * switch-out and switch-in; a kernel without group scheduling (no cfs_rq->rq) reads the clock. */
static __always_inline __u64 switch_time(struct task_struct *prev)
{
	if (bpf_core_field_exists(struct cfs_rq, rq)) {
		struct cfs_rq *cfs = prev->se.cfs_rq;
		struct rq *rq = cfs ? cfs->rq : NULL;

		if (rq)
			return rq->clock;
	}
	return bpf_ktime_get_ns();
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
	__u64 now = switch_time(prev);

	offcpu_switch_out(ctx, prev, prev_state, now);
	offcpu_switch_in(next, now);
	return 0;
}

/* A thread's end: what it had not sent yet goes, and its state with it (which the task's end
 * would free anyway; deleting it here keeps the followed/released counts a live census). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_thread_exit, struct task_struct *task)
{
	struct offcpu_thread *t = bpf_task_storage_get(&offcpu_threads, task, 0, 0);

	if (!t)
		return 0;
	if (t->unsent_ns) {
		t->seq = 0;
		send_offcpu_end(task, t, 0);
	}
	if (!bpf_task_storage_delete(&offcpu_threads, task))
		count(COUNTER_OFFCPU_RELEASED);
	return 0;
}

#endif
