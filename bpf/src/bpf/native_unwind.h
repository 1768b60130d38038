/* The native unwinder: walks a user stack with the DWARF-derived tables in the unwind maps, one
 * frame per bpf_loop iteration. Frame pointers are used only for code without unwind rows. */
#ifndef GPUFLAME_NATIVE_UNWIND_H
#define GPUFLAME_NATIVE_UNWIND_H

#include "maps.h"
#include "python_walk.h"
#include "unwind_state.h"
#include "unwind_tables.h"
#include "no_cfi.h"
#include "file_vmas.h"
#include "stack_copy.h"
#include "stack_window.h"
#include "frame_cache.h"

/* Asks user space for the table of the file mapped at `begin`; at most every 200 ms. */
static __always_inline void ask_table(struct native_unwind_state *st, __u64 begin)
{
	struct table_request_key key = { .pid = st->pid, .begin = begin };
	__u64 *last = bpf_map_lookup_elem(&table_requested, &key), now = st->now;

	if (last && now - *last < 200000000ULL)
		return;
	/* The value from the stack: see file_vma_index. */
	bpf_map_update_elem(&table_requested, &key, &now, BPF_ANY);
	send_process_event_at(st->pid, PROCESS_NEED_TABLE, st->ip);
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

/* The file under the leaf of a sample whose process, mapping or table user space has not read
 * yet: a process living a few hundred microseconds is gone before it can, and the leaf is then
 * named from the file identity alone. */
static __always_inline void note_leaf_file(struct native_unwind_state *st)
{
	if (st->frames == 1)
		file_vma_index(st);
}

/* One step of the walk: one native frame, or one Python frame. A global function, so that the
 * verifier checks it once with the state unknown instead of along every path of the loop. */
__noinline long unwind_one(struct native_unwind_state *st)
{
	struct event_record *e;
	struct process_info *proc;
	struct exec_mapping *m;
	struct file_vmas *fv;
	struct unwind_rule *rule, found;
	__u32 slot, table_id;
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
	/* The evaluation loop's native frame is replaced by the Python frames it runs. The rule kept
	 * for the address says whether it is the loop's, without the interpreter's entry. */
	if (!recorded_python && st->py.enabled && frame_cache_maybe_eval(st->pid, st->ip, st->leaf_done, st->epoch) &&
	    py_begin(&st->py, st->pid, st->tid, st->ip))
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
	st->adjust = adjust;

	/* The rule: kept from an earlier walk through this address (frame_cache.h), or searched
	 * for in the process's mappings (a hash map's lookup) and their tables. */
	if (frame_cache_get(st->pid, st->ip, adjust, st->epoch, &found, &table_id)) {
		mark_table_used(table_id, st->now);
	} else {
		/* The key from the stack: see file_vma_index. */
		__u32 pid = st->pid;

		proc = bpf_map_lookup_elem(&processes, &pid);
		idx = proc ? mapping_index_in(proc, st->ip) : -1;
		m = NULL;
		if (idx < 0) {
			/* Walked on with the table of the VMA's file, if user space published one. */
			ask_refresh(st);
			idx = file_vma_index(st);
			fv = idx < 0 ? NULL : bpf_map_lookup_elem(&file_vmas_of, &pid);
			if (!fv)
				return stop(st, proc ? UNWIND_NO_MAPPING : UNWIND_NO_PROCESS);
			e->stack.flags |= STACK_BY_FILE;
			table_id = fv->vmas[idx & (FILE_VMAS - 1)].table_id;
			pc = st->ip - adjust - fv->vmas[idx & (FILE_VMAS - 1)].load_bias;
		} else {
			m = &proc->mappings[idx & (MAX_PROCESS_MAPPINGS - 1)];
			if (m->flags & MAPPING_TABLE_PENDING) {
				/* No frame-pointer step here: in code built without them it skips callers and
				 * makes a stack that looks whole; a stop is honest and the table comes within
				 * ~100 ms. The leaf's file too: a process of a few hundred microseconds, read
				 * once, is gone before the table and its names come (1 in 7 samples of a storm
				 * of them stayed unnamed). */
				ask_table(st, m->begin);
				note_leaf_file(st);
				return stop(st, UNWIND_NO_TABLE_YET);
			}
			if (!(m->flags & MAPPING_HAS_TABLE))
				return step_without_cfi(st);
			table_id = m->table_id;
			pc = st->ip - adjust - m->load_bias;
		}
		rule = find_rule(table_id, pc, st->now);
		if (!rule)
			return step_without_cfi(st);
		found = *rule;
		if (m)
			frame_cache_put(st, m, idx, &found);
	}
	rule = &found;
	switch (rule->cfa_kind) {
	case CFA_RSP_OFFSET:
		cfa = st->sp + rule->cfa_offset;
		break;
	case CFA_RBP_OFFSET:
		bp_after_scan(st, true, rule->cfa_offset);
		cfa = st->bp + rule->cfa_offset;
		break;
	case CFA_PLT:
		cfa = st->sp + 8 + ((st->ip & 15) >= (__u64)rule->rbp_offset ? 8 : 0);
		break;
	case CFA_DEREF_RBP:
		bp_after_scan(st, false, 0);
		if (stack_word(st, &cfa, st->bp + rule->cfa_offset))
			return stop(st, UNWIND_READ_FAULT);
		break;
	case CFA_DEREF_RSP:
		if (stack_word(st, &cfa, st->sp + (rule->cfa_offset & 0xffff)))
			return stop(st, UNWIND_READ_FAULT);
		cfa += rule->cfa_offset >> 16;
		break;
	case CFA_END_OF_STACK:
		return stop(st, UNWIND_END_OF_STACK);
	case CFA_NO_INFO:
		return step_without_cfi(st);
	default:
		return stop(st, UNWIND_BAD_CFA);
	}
	if (cfa == 0)
		return stop(st, UNWIND_BAD_CFA);
	/* A stripped interpreter's eval loop, known by the shim frame on its stack: its slot goes to
	 * the Python frames, emitted in the next iterations, and unwinding goes on from its caller. */
	if (py_frame_holds_shim(&st->py, st->pid, st->tid, st->ip, st->sp, cfa, e) && !recorded_python && st->frames > 0)
		st->frames--;
	if (stack_word(st, &ra, cfa - 8))
		return stop(st, UNWIND_READ_FAULT);
	/* A function being traced by a return probe (a CUDA hook) returns to the uprobe page. */
	if (st->xol && ra >= st->xol && ra < st->xol + 4096)
		ra = uretprobe_original(cfa - 8, ra);
	if (rule->rbp_kind == RBP_AT_RBP && rule->cfa_kind != CFA_RBP_OFFSET && rule->cfa_kind != CFA_DEREF_RBP)
		bp_after_scan(st, false, 0);
	if (rule->rbp_kind != RBP_UNCHANGED)
		st->bp_below_ra = 0; /* the caller's rbp comes from this frame's rule */
	if (rule->rbp_kind == RBP_CFA_OFFSET) {
		if (stack_word(st, &st->bp, cfa + rule->rbp_offset))
			return stop(st, UNWIND_READ_FAULT);
	} else if (rule->rbp_kind == RBP_AT_RBP) {
		/* Read with this frame's rbp, which the CFA above came from too. */
		if (!st->bp || stack_word(st, &st->bp, st->bp + rule->rbp_offset))
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
	case UNWIND_NO_TABLE_YET:
		count(COUNTER_UNWIND_NO_TABLE_YET);
		break;
	case UNWIND_BAD_FRAME:
		count(COUNTER_UNWIND_BAD_FRAME);
		break;
	}
	count(COUNTER_USTACK_FAILED);
}

/* Whether a walk that ended so left frames of the stack out (not its end, not a full sample). */
static __always_inline bool stopped_early(__u32 status)
{
	return status != UNWIND_END_OF_STACK && status != UNWIND_ZERO_RA && status != UNWIND_TRUNCATED &&
	       status != UNWIND_KERNEL_THREAD;
}

static long py_rest_step(__u32 i, void *arg)
{
	struct native_unwind_state *st = arg;

	return py_emit_rest(&st->py, st->pid, st->tid, &st->frames, st->slot) ? 1 : 0;
}

/* Unwinds the current task's user stack into `e`, which is sample_scratch entry `slot`. */
static __always_inline void unwind_user_stack(struct event_record *e, __u32 slot)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs;
	struct native_unwind_state st = {};
	struct process_info *proc;
	struct xol_area *xol;

	e->stack.user_frames = 0;
	e->stack.leaf_ino = 0;
	e->stack.forked_from = 0;
	e->stack.flags = 0;
	if (task->flags & 0x00200000 /* PF_KTHREAD */ || !task->mm) {
		e->stack.unwind_status = UNWIND_KERNEL_THREAD;
		return;
	}
	/* A short-lived process spends a good part of its life here: its user registers point into
	 * the program that called execve, whose memory is (or is about to be) gone. */
	if (BPF_CORE_READ_BITFIELD(task, in_execve)) {
		e->stack.unwind_status = UNWIND_IN_EXEC;
		return;
	}
	regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs) {
		e->stack.unwind_status = UNWIND_READ_FAULT;
		count_unwind_status(UNWIND_READ_FAULT);
		return;
	}
	/* Loads through the kernel's typed pointers, not a read helper's call for each field (six
	 * calls: ~15 ns each); a fault reads 0 either way. */
	st.ip = regs->ip;
	st.sp = regs->sp;
	st.bp = regs->bp;
	st.pid = e->header.pid;
	st.tid = e->header.tid;
	st.slot = slot;
	xol = task->mm->uprobes_state.xol_area;
	st.xol = xol ? xol->vaddr : 0;
	st.status = UNWIND_TRUNCATED;
	st.now = bpf_ktime_get_ns();
	st.py.enabled = bpf_map_lookup_elem(&python_processes, &st.pid) != NULL;
	/* Before any lookup of the process: a change made after it moves the epoch on. */
	st.epoch = unwind_epoch_now();
	/* Whose mappings the walk uses: user space names the frames from the same. */
	proc = bpf_map_lookup_elem(&processes, &st.pid);
	if (proc)
		e->stack.forked_from = proc->forked_from;
	if (slot == SCRATCH_SAMPLER)
		new_vma_lookup();
	/* The oracle's copies are of the native stack alone, as the user-space unwinder reads it. */
	if (copy_every_stack && slot == SCRATCH_SAMPLER)
		st.py.enabled = 0;
	/* Python frames take steps of their own: room for a full stack of both. */
	bpf_loop(2 * MAX_USER_FRAMES + 1, unwind_step, &st, 0);
	/* A CPU sample cut where a table is missing, or in code of a known process that user space
	 * has not read yet (a library just mapped), keeps its stack, for user space to finish; the
	 * Python frames after it then say which eval-loop call runs them. */
	if (slot == SCRATCH_SAMPLER && copy_every_stack)
		send_stack_copy(e, &st, true);
	else if (slot == SCRATCH_SAMPLER && (st.status == UNWIND_NO_TABLE_YET || st.status == UNWIND_NO_MAPPING))
		st.py.mark_calls = send_stack_copy(e, &st, false);
	/* The Python frames are readable without the native stack: a gap in it keeps them. */
	if (st.py.enabled && stopped_early(st.status))
		bpf_loop(MAX_USER_FRAMES / 2, py_rest_step, &st, 0);
	e->stack.user_frames = st.frames;
	e->stack.unwind_status = st.status;
	count_unwind_status(st.status);
}

#endif
