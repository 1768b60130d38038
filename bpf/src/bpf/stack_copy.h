/* Stacks kept for later: when a CPU sample's walk stops at a file whose table is not loaded yet,
 * the stack above the frame it stopped at is copied and sent (EVENT_STACK_COPY) right before the
 * sample, and user space unwinds it with the same table once that is built. Copies happen only
 * while tables are missing, and within a per-CPU budget (the unwinder's oracle, a test's mode, has
 * none). */
#ifndef GPUFLAME_STACK_COPY_H
#define GPUFLAME_STACK_COPY_H

#include "counters.h"
#include "events.h"
#include "maps.h"
#include "unwind_state.h"

/* Bytes copied at most (a power of two). Measured with record --check-unwinder on the PyPI torch
 * wheel (Python 3.11): a training step's stacks reach their root within 13.7 KiB of the leaf;
 * importing torch within 32 KiB for 92% of samples (the rest are also deeper than the 512
 * frames a sample holds). OpenBLAS kernels keep 28 KiB buffers on the stack: theirs do not fit. */
#define STACK_COPY_BYTES (32 * 1024)
#define PAGE_SIZE_BYTES 4096
/* The copy starts this far below sp: the red zone, where leaf code keeps data, and the slots an
 * epilogue has just popped, which CFI may still name as where a register is saved. */
#define STACK_COPY_BELOW_SP 128

/* The copy's layout as user space reads it (generated into the Rust mirror, never copied). */
enum stack_copy_layout {
	STACK_COPY_MAX_BYTES = STACK_COPY_BYTES,
	STACK_COPY_START_BELOW_SP = STACK_COPY_BELOW_SP,
	STACK_COPY_SLACK_BYTES = PAGE_SIZE_BYTES,
};

struct stack_copy_record {
	struct event_header header;
	struct event_stack stack;
	union event_payload payload;
	/* A page more than is copied: the verifier sees each page's read end within the array. */
	__u8 bytes[STACK_COPY_BYTES + STACK_COPY_SLACK_BYTES];
};

/* One entry per CPU, indexed by the CPU's number: a per-CPU array's values are at most 32 KiB.
 * User space sets the entries to the possible CPUs before loading. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_copy_record);
} stack_copies SEC(".maps");

/* Copies a CPU may send at once, and how often it earns one more (64 a second): a burst covers a
 * CPU sampled at 99 Hz for 2.5 s, the time the biggest tables (libtorch_cpu, 2.7 M rows) take
 * to come; after that at most 2 MiB a second per CPU go to the ring. */
#define STACK_COPY_BURST 160
const volatile __u64 stack_copy_refill_ns = 1000000000ULL / 64;
/* Tests: every CPU sample's stack copied from its leaf and sent with the walk's own result, which
 * user space compares with its own unwind of the copy (the unwinder's oracle). */
const volatile __u8 copy_every_stack = 0;

struct copy_budget {
	__u64 last_ns;
	__u64 tokens;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct copy_budget);
} stack_copy_budget SEC(".maps");

/* Whether this CPU may copy a stack now; a copy turned away is counted. */
static __always_inline bool take_copy_budget(__u64 now)
{
	__u32 zero = 0;
	struct copy_budget *b = bpf_map_lookup_elem(&stack_copy_budget, &zero);
	__u64 earned;

	if (!b)
		return false;
	if (!b->last_ns) {
		b->last_ns = now;
		b->tokens = STACK_COPY_BURST;
	}
	earned = (now - b->last_ns) / stack_copy_refill_ns;
	if (earned) {
		b->last_ns += earned * stack_copy_refill_ns;
		b->tokens = b->tokens + earned > STACK_COPY_BURST ? STACK_COPY_BURST : b->tokens + earned;
	}
	if (!b->tokens) {
		count(COUNTER_STACK_COPY_BUDGET);
		return false;
	}
	b->tokens--;
	return true;
}

struct copy_pages {
	__u64 from;
	__u32 len;
};

/* One page (the first: what is left of sp's page) of the stack, until a page cannot be read (the
 * stack's end) or the copy is full. */
static long copy_page(__u32 i, void *arg)
{
	struct copy_pages *c = arg;
	__u32 cpu = bpf_get_smp_processor_id();
	struct stack_copy_record *r = bpf_map_lookup_elem(&stack_copies, &cpu);
	__u64 len = c->len, addr, chunk;

	if (!r || len >= STACK_COPY_BYTES)
		return 1;
	addr = c->from + len;
	chunk = PAGE_SIZE_BYTES - (addr & (PAGE_SIZE_BYTES - 1));
	if (chunk > STACK_COPY_BYTES - len)
		chunk = STACK_COPY_BYTES - len;
	/* The bound checked on the register passed: clang otherwise checks a copy of it. */
	asm volatile("" : "+r"(chunk));
	if (chunk > PAGE_SIZE_BYTES)
		return 1;
	asm volatile("" : "+r"(chunk));
	if (bpf_probe_read_user(&r->bytes[len & (STACK_COPY_BYTES - 1)], chunk, (void *)addr))
		return 1;
	c->len = len + chunk;
	return 0;
}

/* Copies the stack of the walk's current frame (or, from_leaf, of the sample's leaf, the task's
 * user registers) and sends it ahead of sample `e`. True when it went out. Global, so that its
 * state takes no room in the unwinder's frame. */
__noinline bool send_stack_copy(struct event_record *e, struct native_unwind_state *st, bool from_leaf)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct stack_copy_record *r = bpf_map_lookup_elem(&stack_copies, &cpu);
	struct copy_pages pages = {};
	struct stack_copy_payload *p;
	struct task_struct *task;
	struct pt_regs *regs;
	__u64 ip, sp, bp;

	/* The oracle's copies are what it checks: all of them, however many (a test's mode). */
	if (!r || !e || !st || (!from_leaf && !take_copy_budget(st->now)))
		return false;
	if (from_leaf) {
		task = bpf_get_current_task_btf();
		regs = (struct pt_regs *)bpf_task_pt_regs(task);
		if (!regs)
			return false;
		ip = BPF_CORE_READ(regs, ip);
		sp = BPF_CORE_READ(regs, sp);
		bp = BPF_CORE_READ(regs, bp);
	} else {
		ip = st->ip;
		sp = st->sp;
		bp = st->bp;
	}
	pages.from = sp - STACK_COPY_BELOW_SP;
	bpf_loop(STACK_COPY_BYTES / PAGE_SIZE_BYTES + 1, copy_page, &pages, 0);
	if (!pages.len)
		return false;
	__builtin_memcpy(&r->header, &e->header, sizeof(r->header));
	r->header.kind = EVENT_STACK_COPY;
	__builtin_memset(&r->stack, 0, sizeof(r->stack));
	__builtin_memset(&r->payload, 0, sizeof(r->payload));
	p = &r->payload.stack_copy;
	p->ip = ip;
	p->sp = sp;
	p->bp = bp;
	p->from_leaf = from_leaf;
	if (!from_leaf) {
		p->bp_below_ra = st->bp_below_ra;
		p->adjust = st->adjust;
		p->scans = st->scans;
	}
	p->bytes = pages.len;
	if (bpf_ringbuf_output(&samples, r, (EVENT_FIXED_BYTES + pages.len) & 0xffff, wake_when_filling())) {
		count(COUNTER_STACK_COPY_LOST);
		return false;
	}
	count(COUNTER_STACK_COPIES);
	count_add(COUNTER_STACK_COPY_BYTES, pages.len);
	e->stack.flags |= STACK_COPIED;
	return true;
}

#endif
