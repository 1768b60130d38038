/* Off-CPU time: how long target threads spend switched out, and the stack at which they left the
 * CPU. At a switch-out the thread is still current, so its user memory and registers are readable
 * and the CPU sampler's unwinder (native + Python) works unchanged; at the switch-in of the same
 * thread the time off is known. (The length is known only after the stack is gone: a hook that
 * runs in the woken thread, finish_task_switch by fentry or kprobe, is not available everywhere.)
 *
 * Unwinding costs tens of microseconds, a switch well under one, so each switch-out is drawn for
 * unwinding with a chance (of 1 << 32), set before the draw from what came before. The chance is
 *   - the wait's expected length over the sampling period (the CPU sampler's, 1 / frequency), at
 *     most 1: the thread's recent waits predict it, an average kept apart for preemptions (the
 *     scheduler's doing) and for its own waits, starting at a period. A thread that waits long, as
 *     a training loop waiting for its GPU does, is unwound at every wait; a thread switching every
 *     few microseconds at one wait in thousands: about one stack per period of waiting, as the
 *     CPU sampler takes one per period of running;
 *   - times the CPU's scale, set every 50 ms from what the last 50 ms asked for, so that the
 *     CPU draws about offcpu_epoch_unwinds waits per epoch: up to 64 on a CPU whose target
 *     threads wait little (every wait of 1/64 period or more is then drawn), down to 1/65536.
 * A CPU's drawn waits are also held to a budget per second, for the bursts within an epoch.
 *
 * The time itself is not left to chance: each thread sends the time of its short waits not
 * unwound (shorter than a period) as a sum, and every other wait's end on its own, with its start;
 * user space shares the time out over the unwound waits of the same kind, each weighing its time
 * over its chance (sources/offcpu.rs). A wait that outlasts a window is counted in the windows it
 * spans: at a window's end user space reads the waits going on (thread_reports.h) and counts
 * them up to then; their ends, a period long or more, come on their own and say when the wait
 * began, so that user space counts only what it had not.
 * Weighing alone (each unwound wait counting time / chance) would be unbiased, but a wait drawn
 * at a small chance that turned out long counted a thousand times its length: the service
 * benchmark's total came out at up to twice the time measured. */
#ifndef GPUFLAME_OFFCPU_H
#define GPUFLAME_OFFCPU_H

#include "maps.h"
#include "native_unwind.h"
#include "records.h"
#include "targets.h"

#define TASK_RUNNING_STATE 0x0
#define TASK_STATE_MASK 0x3 /* TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE */
#define TASK_DEAD_STATE 0x80
#define PF_EXITING_FLAG 0x00000004
#define PF_KTHREAD_FLAG 0x00200000

#define CHANCE_ONE (1ULL << 32)
#define SCALE_ONE (1ULL << 16)
#define SCALE_MAX (64 * SCALE_ONE)

/* Set before load (SamplerConfig). */
const volatile __u64 offcpu_period_ns = 10101010;   /* under 2^32 */
const volatile __u64 offcpu_chance_per_ns = 425;    /* (1 << 32) / offcpu_period_ns */
const volatile __u64 offcpu_epoch_ns = 50000000;
const volatile __u64 offcpu_epoch_unwinds = 10;     /* 200 a second */
const volatile __u64 offcpu_cpu_burst = 64;
const volatile __u64 offcpu_cpu_refill_ns = 500000; /* one unwind back every 0.5 ms: 2000/s */

struct offcpu_thread {
	__u64 off_since;   /* when it switched out; 0 while it runs */
	__u64 avg_wait_ns; /* its recent waits' length (a moving average) */
	__u64 avg_preempted_ns;
	__u64 chance;      /* the chance the current wait was drawn with; 0 when it was not drawn */
	__u64 seq;         /* the stack record of the current wait, or 0 when it was not unwound */
	__u64 next_seq;
	__u64 short_rest_ns; /* waits not unwound, shorter than a period, not yet sent */
	__u32 preempted;   /* the current wait is a preemption */
	__u32 _pad;
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

struct offcpu_cpu {
	__u64 since_ns;    /* the budget: tokens given back since */
	__u64 tokens;
	__u64 epoch_start;
	__u64 demand;      /* the chances asked for by this epoch's waits, before scaling */
	__u64 scale;       /* this epoch's factor on chances, of SCALE_ONE */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_cpu);
} offcpu_cpus SEC(".maps");

static __always_inline bool take_unwind_token(struct offcpu_cpu *b, __u64 now)
{
	__u64 back;

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

/* The chance of a wait that asks for `wanted` (of CHANCE_ONE), on this CPU. */
static __always_inline __u64 scaled_chance(struct offcpu_cpu *c, __u64 wanted, __u64 now)
{
	__u64 chance;

	if (now - c->epoch_start >= offcpu_epoch_ns) {
		__u64 target = offcpu_epoch_unwinds << 32;

		/* target << 16 is under 2^64 (offcpu_epoch_unwinds < 2^15). */
		__u64 fits = c->demand ? (target << 16) / c->demand : SCALE_MAX;

		/* Down at once, up by 2 at most an epoch: a quiet spell of a few hundred ms does not
		 * leave a CPU drawing every wait of the burst that ends it (a thread-per-request
		 * server's new threads, each expected to wait a period), and the epoch is short
		 * because until it ends such a burst is drawn at the scale of the quiet. */
		if (c->scale && fits > c->scale * 2)
			fits = c->scale * 2;
		c->scale = fits > SCALE_MAX ? SCALE_MAX : fits ? fits : 1;
		c->demand = 0;
		c->epoch_start = now;
	}
	if (c->demand < (1ULL << 48))
		c->demand += wanted;
	/* Under 2^16 * 2^32: no overflow. (The first call starts an epoch: scale is set.) */
	chance = (wanted >> 16) * c->scale;
	return chance > CHANCE_ONE ? CHANCE_ONE : chance;
}

/* What a wait asks for: its expected length over the period, from the thread's recent waits of
 * the same kind. */
static __always_inline __u64 wanted_chance(struct offcpu_thread *t, bool preempted)
{
	__u64 expected = preempted ? t->avg_preempted_ns : t->avg_wait_ns;

	/* A multiplication, not a division, on every switch; at most 2^32, as expected < period. */
	return expected >= offcpu_period_ns ? CHANCE_ONE : expected * offcpu_chance_per_ns;
}

/* A moving average over about the last four waits; a new thread's waits are expected to be a
 * period long. Lengths are capped at 2^32 ns: anything past a period asks for a whole chance. */
static __always_inline void learn_wait(__u64 *avg, __u64 off)
{
	if (off > 0xffffffffULL)
		off = 0xffffffffULL;
	*avg = (*avg * 3 + off) / 4;
}

/* A wait's end (`since` its start, `off_ns` its length; `seq` its stack record, 0 when it was not
 * unwound), with the time of the thread's short waits not unwound since its last record; or those
 * alone (since 0). A header-sized record, no stack. */
static __always_inline void send_offcpu_end(struct task_struct *task, struct offcpu_thread *t, __u64 seq, __u64 since, __u64 off_ns)
{
	struct event_record *e;
	__u32 slot = SCRATCH_OFFCPU;

	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return;
	record_header(e, EVENT_OFFCPU_END, task->tgid, task->pid, task);
	e->payload.offcpu_end.wait = seq;
	e->payload.offcpu_end.since = since;
	e->payload.offcpu_end.off_ns = off_ns;
	e->payload.offcpu_end.chance = seq ? t->chance : 0;
	e->payload.offcpu_end.short_rest_ns = t->short_rest_ns;
	if (!send_record(e, EVENT_FIXED_BYTES, WAKE_NEVER, COUNTER_OFFCPU_LOST))
		return;
	t->short_rest_ns = 0;
}

/* The switch-out of the current task `prev`: drawn, and unwound when drawn, its stack cut after
 * its used entries with the kernel frames right after the user ones. */
static __always_inline void offcpu_switch_out(void *ctx, struct task_struct *prev, unsigned int prev_state, __u64 now)
{
	__u32 tid = prev->pid, slot = SCRATCH_OFFCPU, zero = 0;
	struct offcpu_thread *t;
	struct offcpu_cpu *c;
	struct event_record *e;
	__u64 chance;

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
		t->avg_wait_ns = offcpu_period_ns;
		t->avg_preempted_ns = offcpu_period_ns;
	}
	count(COUNTER_OFFCPU_SWITCHES);
	t->off_since = now;
	t->seq = 0;
	t->chance = 0;
	t->preempted = prev_state == TASK_RUNNING_STATE;
	c = bpf_map_lookup_elem(&offcpu_cpus, &zero);
	if (!c)
		return;
	chance = scaled_chance(c, wanted_chance(t, t->preempted), now);
	if (chance < CHANCE_ONE && bpf_get_prandom_u32() >= chance)
		return;
	count(COUNTER_OFFCPU_DRAWN);
	t->chance = chance;
	if (!take_unwind_token(c, now)) {
		count(COUNTER_OFFCPU_BUDGET);
		return;
	}
	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return;
	t->seq = ++t->next_seq;
	count(COUNTER_OFFCPU_UNWOUND);
	record_header(e, EVENT_OFFCPU_STACK, prev->tgid, tid, NULL);
	e->payload.offcpu_stack.wait = t->seq;
	e->payload.offcpu_stack.since = now;
	e->payload.offcpu_stack.state = prev_state;
	e->payload.offcpu_stack._pad = 0;
	unwind_user_stack(e, slot);
	/* Its kernel stack's leaf frames are this program and the tracepoint's; user space leaves
	 * them out by name (how many there are differs between calls). */
	if (!send_record(e, record_kernel_stack_after_user(ctx, e), WAKE_NEVER, COUNTER_OFFCPU_LOST))
		t->seq = 0;
}

static __always_inline void offcpu_switch_in(struct task_struct *next, __u64 now)
{
	struct offcpu_thread *t = bpf_task_storage_get(&offcpu_threads, next, 0, 0);
	__u64 off, since;

	if (!t || !t->off_since)
		return;
	since = t->off_since;
	/* A time from another CPU's clock (a wait begun by the task iterator) may be ahead by a
	 * tick: such a wait lasted no time. */
	off = now > since ? now - since : 0;
	t->off_since = 0;
	count_add(COUNTER_OFFCPU_WAITED_NS, off);
	learn_wait(t->preempted ? &t->avg_preempted_ns : &t->avg_wait_ns, off);
	/* A wait a period long or more ends on its own record, unwound or not: a window's end may
	 * have counted a part of it, which user space knows by its start. */
	if (t->seq || off >= offcpu_period_ns) {
		send_offcpu_end(next, t, t->seq, since, off);
	} else {
		t->short_rest_ns += off;
		/* A thread seldom unwound still sends its time, in time for its window (and for a
		 * recording's end, which loses what is not sent: under 100 ms a thread). */
		if (t->short_rest_ns >= 100000000ULL)
			send_offcpu_end(next, t, 0, 0, 0);
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
	if (t->short_rest_ns)
		send_offcpu_end(task, t, 0, 0, 0);
	if (!bpf_task_storage_delete(&offcpu_threads, task))
		count(COUNTER_OFFCPU_RELEASED);
	return 0;
}

#endif
