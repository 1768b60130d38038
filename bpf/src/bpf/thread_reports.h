/* Threads as they are now, for user space: a task iterator over every thread of the target
 * processes says whether each runs, and for one that does not, its user registers (saved at its
 * last entry into the kernel: a system call, an interrupt, a fault), its kernel stack and its wait
 * as the switch programs follow it. Nothing is stopped nor signalled: a thread that waits is read
 * where it lies; user space copies its stack and unwinds it (session/waiting.rs).
 *
 * Why an iterator and not /proc/PID/task/TID/syscall: one pass over every target thread (10,000
 * threads in milliseconds, no file per thread), all registers rather than sp and pc (rbp, which
 * frame-pointer code needs), threads preempted or in a page fault as well as those in a system
 * call, their pthread_t (fsbase) that finds their Python thread state, and the off-CPU state of
 * their wait in the same read.
 *
 * Two programs: `report_threads` only reads (gpuflame dump); `report_threads_following` (a
 * window's end, the start of off-CPU following) also gives a waiting thread that has no off-CPU
 * state one, its wait begun now: a thread that waited since before gpuflame followed it then has
 * its end sent by the switch programs like any other, and its time counted from here on. */
#ifndef GPUFLAME_THREAD_REPORTS_H
#define GPUFLAME_THREAD_REPORTS_H

#include "events.h"
#include "offcpu.h"
#include "targets.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct thread_report);
} thread_report_scratch SEC(".maps");

/* Nanoseconds since the task last ran, by the scheduler's accounting: exec_start is its run
 * queue's task clock when it was last charged (at its switch-out), which the run queue's clock
 * leads by the time spent in interrupts; both read on its run queue, so a stale clock (an idle
 * CPU's) moves both alike. 0 when the kernel has no run queue behind the entity. */
static __always_inline __u64 task_idle_ns(struct task_struct *task, __u64 now)
{
	if (!bpf_core_field_exists(struct cfs_rq, rq))
		return 0;
	struct cfs_rq *cfs = BPF_CORE_READ(task, se.cfs_rq);
	struct rq *rq = cfs ? BPF_CORE_READ(cfs, rq) : NULL;
	__u64 exec_start = BPF_CORE_READ(task, se.exec_start), clock, clock_task, left;

	if (!rq || !exec_start)
		return 0;
	clock = BPF_CORE_READ(rq, clock);
	clock_task = BPF_CORE_READ(rq, clock_task);
	left = exec_start + (clock > clock_task ? clock - clock_task : 0);
	return now > left ? now - left : 0;
}

static __always_inline void report_regs(struct thread_report *r, struct task_struct *task)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);

	if (!regs)
		return;
	r->ip = BPF_CORE_READ(regs, ip);
	r->sp = BPF_CORE_READ(regs, sp);
	r->bp = BPF_CORE_READ(regs, bp);
	r->syscall = (__s64)BPF_CORE_READ(regs, orig_ax);
	/* Saved on entry from user mode: the low bits of cs are its privilege level. */
	r->user_regs = (BPF_CORE_READ(regs, cs) & 3) == 3;
}

static __always_inline int report_thread(struct bpf_iter__task *ctx, bool follow)
{
	struct seq_file *seq = ctx->meta->seq;
	struct task_struct *task = ctx->task;
	struct offcpu_thread *t;
	struct thread_report *r;
	__u32 zero = 0, bytes;
	__u64 now;
	long k;

	if (!task || task->flags & (PF_KTHREAD_FLAG | PF_EXITING_FLAG) || !is_target(task->tgid))
		return 0;
	r = bpf_map_lookup_elem(&thread_report_scratch, &zero);
	if (!r)
		return 0;
	__builtin_memset(r, 0, __builtin_offsetof(struct thread_report, kernel_stack));
	now = switch_time(bpf_get_current_task_btf());
	r->pid = task->tgid;
	r->tid = task->pid;
	r->state = BPF_CORE_READ(task, __state);
	/* An int up to 7.1, a u8 from 7.2: read at the kernel's own size, not the compiled one (the
	 * int's four bytes held on_rq and more, and every thread read as running). */
	r->on_cpu = BPF_CORE_READ_BITFIELD_PROBED(task, on_cpu) != 0;
	r->now = now;
	r->syscall = -1;
	/* Saved at its last switch-out; the current one is read as the sampler reads it. */
	r->fsbase = BPF_CORE_READ(task, thread.fsbase);
	BPF_CORE_READ_STR_INTO(&r->comm, task, comm);
	t = bpf_task_storage_get(&offcpu_threads, task, 0, 0);
	if (!t && follow && !r->on_cpu) {
		t = bpf_task_storage_get(&offcpu_threads, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (t) {
			count(COUNTER_OFFCPU_FOLLOWED);
			t->avg_wait_ns = offcpu_period_ns;
			t->avg_preempted_ns = offcpu_period_ns;
			t->preempted = r->state == TASK_RUNNING_STATE;
			t->off_since = now;
		}
	}
	if (t) {
		r->followed = 1;
		r->since = t->off_since;
		r->preempted = t->preempted;
		r->unwound = t->seq != 0;
		r->chance = t->chance;
	}
	if (!r->on_cpu) {
		r->waited_ns = task_idle_ns(task, now);
		report_regs(r, task);
		k = bpf_get_task_stack(task, r->kernel_stack, sizeof(r->kernel_stack), 0);
		r->kernel_stack_bytes = k;
	}
	bytes = r->kernel_stack_bytes > 0 ? r->kernel_stack_bytes : 0;
	if (bytes > sizeof(r->kernel_stack))
		bytes = sizeof(r->kernel_stack);
	/* Whole frames, at most 127 of them (1016 = 0x3f8): a bound the verifier sees on the copy
	 * of `bytes` that the call takes. */
	bytes &= 0x3f8;
	bpf_seq_write(seq, r, __builtin_offsetof(struct thread_report, kernel_stack) + bytes);
	return 0;
}

SEC("iter/task")
int report_threads(struct bpf_iter__task *ctx)
{
	return report_thread(ctx, false);
}

SEC("iter/task")
int report_threads_following(struct bpf_iter__task *ctx)
{
	return report_thread(ctx, true);
}

#endif
