/* The native unwinder: walks a user stack with the DWARF-derived tables in the unwind maps, one
 * frame per bpf_loop iteration. Frame pointers are used only for code without unwind rows. */
#ifndef GPUFLAME_NATIVE_UNWIND_H
#define GPUFLAME_NATIVE_UNWIND_H

#include "maps.h"
#include "python_walk.h"

#define UNWIND_CONTINUE 0
#define UNWIND_STOP 1

struct native_unwind_state {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 pid;
	__u32 tid;
	__u32 frames;
	__u32 status;
	__u32 asked_refresh;
	__u32 leaf_done;
	__u32 slot; /* the sample_scratch entry being filled */
	__u64 xol;  /* the process's uprobe page (return trampoline), or 0 */
	struct py_walk py;
};

static __always_inline void ask_refresh(struct native_unwind_state *st)
{
	__u64 now = bpf_ktime_get_ns(), *last;

	if (st->asked_refresh)
		return;
	st->asked_refresh = 1;
	last = bpf_map_lookup_elem(&refresh_requested, &st->pid);
	if (last && now - *last < 100000000ULL) /* at most ten times a second per process */
		return;
	bpf_map_update_elem(&refresh_requested, &st->pid, &now, BPF_ANY);
	send_process_event(st->pid, PROCESS_UNKNOWN);
}

/* The binary searches are global functions: the verifier checks each once, on its own, instead of
 * once per path of its caller, which would multiply their branches. */

/* Index of the mapping of process `pid` that contains ip, or -1. */
__noinline int find_mapping_index(__u32 pid, __u64 ip)
{
	struct process_info *proc = bpf_map_lookup_elem(&processes, &pid);
	__u32 lo = 0, hi, mid;

	if (!proc)
		return -1;
	hi = proc->mapping_count;
	if (hi > MAX_PROCESS_MAPPINGS)
		return -1;
	for (int i = 0; i < 11; i++) { /* log2(MAX_PROCESS_MAPPINGS) + 1 */
		if (lo >= hi)
			break;
		mid = (lo + hi) / 2;
		if (proc->mappings[mid & (MAX_PROCESS_MAPPINGS - 1)].begin <= ip)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0 || ip >= proc->mappings[(lo - 1) & (MAX_PROCESS_MAPPINGS - 1)].end)
		return -1;
	return (lo - 1) & (MAX_PROCESS_MAPPINGS - 1);
}

/* Index into unwind_blocks of the last block of `table_id` whose first row starts at or before
 * rel, or -1. */
__noinline int find_block(__u32 table_id, __u32 rel)
{
	struct table_info *t = bpf_map_lookup_elem(&unwind_tables, &table_id);
	struct unwind_block *blk;
	__u32 lo = 0, hi, mid, key;

	if (!t)
		return -1;
	hi = t->block_count;
	for (int i = 0; i < 24; i++) {
		if (lo >= hi)
			break;
		mid = (lo + hi) / 2;
		key = t->first_block + mid;
		blk = bpf_map_lookup_elem(&unwind_blocks, &key);
		if (!blk)
			return -1;
		if (blk->pc[0] <= rel)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return -1;
	return t->first_block + lo - 1;
}

/* The rule index of the last row in block `block` that starts at or before rel (row 0 does). */
__noinline int find_row_rule(__u32 block, __u32 rel)
{
	struct unwind_block *blk = bpf_map_lookup_elem(&unwind_blocks, &block);
	__u32 lo = 1, hi = ROWS_PER_BLOCK, mid;

	if (!blk)
		return -1;
	for (int i = 0; i < 5; i++) {
		if (lo >= hi)
			break;
		mid = (lo + hi) / 2;
		if (blk->pc[mid & (ROWS_PER_BLOCK - 1)] <= rel)
			lo = mid + 1;
		else
			hi = mid;
	}
	return blk->rule[(lo - 1) & (ROWS_PER_BLOCK - 1)];
}

/* The rule for a file address, or NULL when no row covers it. */
static __always_inline struct unwind_rule *find_rule(__u32 table_id, __u64 elf_pc)
{
	struct table_info *t = bpf_map_lookup_elem(&unwind_tables, &table_id);
	int block, rule;
	__u32 key;

	if (!t || t->block_count == 0 || elf_pc < t->base || elf_pc - t->base > 0xfffffffeULL)
		return NULL;
	block = find_block(table_id, elf_pc - t->base);
	if (block < 0)
		return NULL;
	rule = find_row_rule(block, elf_pc - t->base);
	if (rule < 0)
		return NULL;
	key = rule;
	return bpf_map_lookup_elem(&unwind_rules, &key);
}

static __always_inline int stop(struct native_unwind_state *st, enum unwind_status status)
{
	st->status = status;
	return UNWIND_STOP;
}

/* One step with frame pointers: for code that has no unwind rows at all. */
static __always_inline int frame_pointer_step(struct native_unwind_state *st)
{
	__u64 frame[2]; /* saved rbp, return address */

	if (st->bp == 0 || st->bp < st->sp)
		return stop(st, UNWIND_NO_ROW);
	if (bpf_probe_read_user(frame, sizeof(frame), (void *)st->bp))
		return stop(st, UNWIND_READ_FAULT);
	count(COUNTER_UNWIND_FP_FALLBACK);
	if (frame[1] == 0)
		return stop(st, UNWIND_ZERO_RA);
	st->sp = st->bp + 16;
	st->bp = frame[0];
	st->ip = frame[1];
	return UNWIND_CONTINUE;
}

/* A return address that a uretprobe replaced with its trampoline: the original, from the task's
 * return instances, the one made for this stack slot. Global, for its loop. */
__noinline __u64 uretprobe_original(__u64 slot, __u64 ra)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct return_instance *ri;

	if (!task)
		return ra;
	ri = BPF_CORE_READ(task, utask, return_instances);
	for (int i = 0; i < 16 && ri; i++) {
		if (BPF_CORE_READ(ri, stack) == slot)
			return BPF_CORE_READ(ri, orig_ret_vaddr);
		ri = BPF_CORE_READ(ri, next);
	}
	return ra;
}

/* One step of the walk: one native frame, or one Python frame. A global function, so that the
 * verifier checks it once with the state unknown instead of along every path of the loop. */
__noinline long unwind_one(struct native_unwind_state *st)
{
	struct sample_event *e;
	struct process_info *proc;
	struct exec_mapping *m;
	struct unwind_rule *rule;
	__u32 slot;
	__u64 pc, cfa, ra;
	int idx;
	bool recorded_python;
	__u64 adjust;

	if (!st)
		return UNWIND_STOP;
	slot = st->slot;
	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return UNWIND_STOP;
	if (st->py.mode == PY_MODE_EMITTING)
		return py_step(&st->py, st->pid, &st->frames, e) ? UNWIND_CONTINUE : stop(st, UNWIND_TRUNCATED);
	recorded_python = st->py.mode == PY_MODE_DONE;
	st->py.mode = PY_MODE_IDLE;
	/* The evaluation loop's native frame is replaced by the Python frames it runs. */
	if (!recorded_python && py_begin(&st->py, st->pid, st->tid, st->ip))
		return py_step(&st->py, st->pid, &st->frames, e) ? UNWIND_CONTINUE : stop(st, UNWIND_TRUNCATED);
	if (!recorded_python) {
		if (st->frames >= MAX_USER_FRAMES)
			return stop(st, UNWIND_TRUNCATED);
		e->user_stack[st->frames & (MAX_USER_FRAMES - 1)] = st->ip;
		st->frames++;
	}
	/* Return addresses point after the call; the call itself is what the rows describe. */
	adjust = st->leaf_done ? 1 : 0;
	st->leaf_done = 1;

	proc = bpf_map_lookup_elem(&processes, &st->pid);
	if (!proc) {
		ask_refresh(st);
		return stop(st, UNWIND_NO_PROCESS);
	}
	idx = find_mapping_index(st->pid, st->ip);
	if (idx < 0) {
		ask_refresh(st);
		return stop(st, UNWIND_NO_MAPPING);
	}
	m = &proc->mappings[idx & (MAX_PROCESS_MAPPINGS - 1)];
	if (!(m->flags & MAPPING_HAS_TABLE))
		return frame_pointer_step(st);
	pc = st->ip - adjust - m->load_bias;
	rule = find_rule(m->table_id, pc);
	if (!rule)
		return frame_pointer_step(st);

	switch (rule->cfa_kind) {
	case CFA_RSP_OFFSET:
		cfa = st->sp + rule->cfa_offset;
		break;
	case CFA_RBP_OFFSET:
		cfa = st->bp + rule->cfa_offset;
		break;
	case CFA_PLT:
		cfa = st->sp + 8 + ((st->ip & 15) >= (__u64)rule->rbp_offset ? 8 : 0);
		break;
	case CFA_DEREF_RBP:
		if (bpf_probe_read_user(&cfa, sizeof(cfa), (void *)(st->bp + rule->cfa_offset)))
			return stop(st, UNWIND_READ_FAULT);
		break;
	case CFA_END_OF_STACK:
		return stop(st, UNWIND_END_OF_STACK);
	case CFA_NO_INFO:
		return frame_pointer_step(st);
	default:
		return stop(st, UNWIND_BAD_CFA);
	}
	if (cfa == 0)
		return stop(st, UNWIND_BAD_CFA);
	/* A stripped interpreter's eval loop, known by the shim frame on its stack: its slot goes to
	 * the Python frames, emitted in the next iterations, and unwinding goes on from its caller. */
	if (py_frame_holds_shim(&st->py, st->pid, st->tid, st->sp, cfa) && !recorded_python && st->frames > 0)
		st->frames--;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)))
		return stop(st, UNWIND_READ_FAULT);
	/* A function being traced by a return probe (a CUDA hook) returns to the uprobe page. */
	if (st->xol && ra >= st->xol && ra < st->xol + 4096)
		ra = uretprobe_original(cfa - 8, ra);
	if (rule->rbp_kind == RBP_CFA_OFFSET) {
		if (bpf_probe_read_user(&st->bp, sizeof(st->bp), (void *)(cfa + rule->rbp_offset)))
			return stop(st, UNWIND_READ_FAULT);
	} else if (rule->rbp_kind != RBP_UNCHANGED) {
		/* The caller's rbp is unknown; a later rbp-based rule would go wrong, so it stops. */
		st->bp = 0;
	}
	if (ra == 0)
		return stop(st, UNWIND_ZERO_RA);
	st->sp = cfa;
	st->ip = ra;
	return UNWIND_CONTINUE;
}

static long unwind_step(__u32 i, void *arg)
{
	return unwind_one(arg) ? UNWIND_STOP : UNWIND_CONTINUE;
}

static __always_inline void count_unwind_status(__u32 status)
{
	switch (status) {
	case UNWIND_END_OF_STACK:
	case UNWIND_ZERO_RA:
	case UNWIND_KERNEL_THREAD:
		return;
	case UNWIND_TRUNCATED:
		count(COUNTER_UNWIND_TRUNCATED);
		break;
	case UNWIND_NO_PROCESS:
		count(COUNTER_UNWIND_NO_PROCESS);
		break;
	case UNWIND_NO_MAPPING:
		count(COUNTER_UNWIND_NO_MAPPING);
		break;
	case UNWIND_NO_ROW:
		count(COUNTER_UNWIND_NO_ROW);
		break;
	case UNWIND_BAD_CFA:
		count(COUNTER_UNWIND_BAD_CFA);
		break;
	case UNWIND_READ_FAULT:
		count(COUNTER_UNWIND_READ_FAULT);
		break;
	}
	count(COUNTER_USTACK_FAILED);
}

/* Walks the current task's user stack into e->user_stack. */
/* Unwinds the current task's user stack into `e`, which is sample_scratch entry `slot`. */
static __always_inline void unwind_user_stack(struct sample_event *e, __u32 slot)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs;
	struct native_unwind_state st = {};

	e->user_frames = 0;
	if (task->flags & 0x00200000 /* PF_KTHREAD */ || !task->mm) {
		e->unwind_status = UNWIND_KERNEL_THREAD;
		return;
	}
	regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs) {
		e->unwind_status = UNWIND_READ_FAULT;
		count_unwind_status(UNWIND_READ_FAULT);
		return;
	}
	st.ip = BPF_CORE_READ(regs, ip);
	st.sp = BPF_CORE_READ(regs, sp);
	st.bp = BPF_CORE_READ(regs, bp);
	st.pid = e->pid;
	st.tid = e->tid;
	st.slot = slot;
	st.xol = BPF_CORE_READ(task, mm, uprobes_state.xol_area, vaddr);
	st.status = UNWIND_TRUNCATED;
	st.py.enabled = bpf_map_lookup_elem(&python_processes, &st.pid) != NULL;
	/* Python frames take steps of their own: room for a full stack of both. */
	bpf_loop(2 * MAX_USER_FRAMES + 1, unwind_step, &st, 0);
	e->user_frames = st.frames;
	e->unwind_status = st.status;
	count_unwind_status(st.status);
}

#endif
