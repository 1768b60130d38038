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
	__u32 scans; /* stack scans done for code without CFI */
	__u64 xol;  /* the process's uprobe page (return trampoline), or 0 */
	__u64 now;
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

/* Block `key` of the unwind rows, in its shard. */
static __always_inline struct unwind_block *lookup_block(__u32 key)
{
	__u32 shard = key >> SHARD_BITS, index = key & (BLOCKS_PER_SHARD - 1);
	void *inner = bpf_map_lookup_elem(&unwind_shards, &shard);

	if (!inner)
		return NULL;
	return bpf_map_lookup_elem(inner, &index);
}

/* The number among all blocks of block `i` of the table whose pages start at `first_page`, or
 * 0xffffffff (no such block). */
static __always_inline __u32 table_block(__u32 first_page, __u32 i)
{
	__u32 slot = first_page + (i >> PAGE_BITS);
	__u32 *page = bpf_map_lookup_elem(&page_index, &slot);

	if (!page)
		return 0xffffffff;
	return (*page << PAGE_BITS) | (i & (BLOCKS_PER_PAGE - 1));
}

/* Index of the last block of `table_id` whose first row starts at or before
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
		key = table_block(t->first_page, mid);
		blk = lookup_block(key);
		if (!blk)
			return -1;
		if (blk->pc[0] <= rel)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return -1;
	return table_block(t->first_page, lo - 1);
}

/* The rule index of the last row in block `block` that starts at or before rel (row 0 does). */
__noinline int find_row_rule(__u32 block, __u32 rel)
{
	struct unwind_block *blk = lookup_block(block);
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

/* The rule for a file address, or NULL when no row covers it. Marks the table used. */
static __always_inline struct unwind_rule *find_rule(__u32 table_id, __u64 elf_pc, __u64 now)
{
	struct table_info *t = bpf_map_lookup_elem(&unwind_tables, &table_id);
	int block, rule;
	__u32 key;

	if (!t || t->block_count == 0 || elf_pc < t->base || elf_pc - t->base > 0xfffffffeULL)
		return NULL;
	/* Once a second at most: a store to a shared cache line on every frame would cost more. */
	if (now - t->last_used > 1000000000ULL)
		t->last_used = now;
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

/* Whether the bytes before ra end with a call instruction: e8 rel32, or ff /2 in one of its
 * encodings (register; memory with no, 8- or 32-bit displacement; SIB; RIP-relative). A REX
 * prefix before ff needs no check of its own. b[8 - n] is the byte at ra - n. */
__noinline int follows_call(__u64 ra)
{
	__u8 b[8], m;

	if (ra < 8 || bpf_probe_read_user(b, sizeof(b), (void *)(ra - 8)))
		return 0;
	if (b[3] == 0xe8)
		return 1;
#define CALL_MODRM(x) ((((x) >> 3) & 7) == 2)
#define MOD(x) ((x) >> 6)
#define RM(x) ((x) & 7)
	m = b[7];
	if (b[6] == 0xff && CALL_MODRM(m) && (MOD(m) == 3 || (MOD(m) == 0 && RM(m) != 4 && RM(m) != 5)))
		return 1;
	m = b[6];
	if (b[5] == 0xff && CALL_MODRM(m) && ((MOD(m) == 1 && RM(m) != 4) || (MOD(m) == 0 && RM(m) == 4 && (b[7] & 7) != 5)))
		return 1;
	m = b[5];
	if (b[4] == 0xff && CALL_MODRM(m) && MOD(m) == 1 && RM(m) == 4)
		return 1;
	m = b[3];
	if (b[2] == 0xff && CALL_MODRM(m) && ((MOD(m) == 2 && RM(m) != 4) || (MOD(m) == 0 && RM(m) == 5)))
		return 1;
	m = b[2];
	if (b[1] == 0xff && CALL_MODRM(m) && RM(m) == 4 && (MOD(m) == 2 || (MOD(m) == 0 && (b[3] & 7) == 5)))
		return 1;
#undef CALL_MODRM
#undef MOD
#undef RM
	return 0;
}

/* A plausible return address of process pid: in its executable code, right after a call. */
static __always_inline bool is_return_address(__u32 pid, __u64 ra)
{
	return ra && find_mapping_index(pid, ra) >= 0 && follows_call(ra) == 1;
}

#define SCAN_WORDS 64
#define SCAN_CANDIDATES 8
#define MAX_SCANS 8

struct scan_buffer {
	__u64 words[SCAN_WORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scan_buffer);
} scan_buffers SEC(".maps");

struct scan_state {
	__u32 pid;
	__u32 tried;
	__s32 found; /* index of the word that is a return address, or -1 */
};

/* One word of the scan: a candidate is a word in the process's code; the first candidate that
 * follows a call is taken, after SCAN_CANDIDATES the scan gives up. */
static long scan_word(__u32 i, void *arg)
{
	struct scan_state *s = arg;
	__u32 zero = 0;
	struct scan_buffer *buf = bpf_map_lookup_elem(&scan_buffers, &zero);
	__u64 w;

	if (!buf)
		return 1;
	w = buf->words[i & (SCAN_WORDS - 1)];
	if (w < 4096 || (w >> 47) || find_mapping_index(s->pid, w) < 0)
		return 0;
	if (++s->tried > SCAN_CANDIDATES)
		return 1;
	if (follows_call(w) != 1)
		return 0;
	s->found = i;
	return 1;
}

/* Scans the SCAN_WORDS words from `base` up for a return address; on success the caller's
 * frame starts above it. Returns 1 when found. Global, so that the verifier checks it once. */
__noinline long scan_from(struct native_unwind_state *st, __u64 base)
{
	struct scan_state scan = { .found = -1 };
	struct scan_buffer *buf;
	__u32 zero = 0;

	if (!st || st->scans >= MAX_SCANS)
		return 0;
	buf = bpf_map_lookup_elem(&scan_buffers, &zero);
	if (!buf)
		return 0;
	st->scans++;
	if (bpf_probe_read_user(buf->words, sizeof(buf->words), (void *)base))
		return 0;
	scan.pid = st->pid;
	bpf_loop(SCAN_WORDS, scan_word, &scan, 0);
	if (scan.found < 0 || scan.found >= SCAN_WORDS)
		return 0;
	count(COUNTER_UNWIND_SCANNED);
	st->ip = buf->words[scan.found & (SCAN_WORDS - 1)];
	st->sp = base + 8 * (scan.found + 1);
	/* rbp stays: code without CFI that used it saved it below and will restore it. */
	return 1;
}

enum { FP_NONE, FP_STEPPED, FP_OUTERMOST };

/* One step up the frame-pointer chain when rbp leads to a return address (a word right after a
 * call instruction in the process's code), which keeps a general-purpose rbp from being followed
 * into data. */
static __always_inline int step_frame_pointer(struct native_unwind_state *st)
{
	__u64 frame[2] = {}; /* saved rbp, return address */

	if (st->bp < st->sp || st->bp - st->sp >= (1 << 20) || bpf_probe_read_user(frame, sizeof(frame), (void *)st->bp))
		return FP_NONE;
	if (frame[1] == 0)
		return FP_OUTERMOST;
	if (!is_return_address(st->pid, frame[1])) {
		count(COUNTER_UNWIND_FP_REJECTED);
		return FP_NONE;
	}
	count(COUNTER_UNWIND_FP_FALLBACK);
	st->sp = st->bp + 16;
	st->bp = frame[0];
	st->ip = frame[1];
	return FP_STEPPED;
}

/* Code without CFI (hand-written BLAS kernels, JIT): the caller is found by frame pointer when
 * rbp leads to a return address, else by scanning the stack for the first word that is one:
 * above sp, and, at the leaf, above each callee-saved register that points a little up the
 * stack — kernels that align their stack for a big buffer keep the old sp in one (OpenBLAS's
 * dgemm kernel: mov %rsp,%rbx; sub $0x7080,%rsp; and $-4096,%rsp). Every candidate must point
 * right after a call instruction in the process's code, which keeps stale values and data out.
 * Global, so that the verifier checks it once. */
__noinline long step_without_cfi(struct native_unwind_state *st)
{
	struct task_struct *task;
	struct pt_regs *regs;
	__u64 saved[6] = {};

	if (!st)
		return UNWIND_STOP;
	switch (step_frame_pointer(st)) {
	case FP_STEPPED:
		return UNWIND_CONTINUE;
	case FP_OUTERMOST:
		st->status = UNWIND_ZERO_RA; /* the outermost frame of a frame-pointer chain */
		return UNWIND_STOP;
	}
	if (scan_from(st, st->sp))
		return UNWIND_CONTINUE;
	if (st->frames == 1 && st->slot == SCRATCH_SAMPLER) {
		task = bpf_get_current_task_btf();
		regs = task ? (struct pt_regs *)bpf_task_pt_regs(task) : NULL;
		if (regs) {
			saved[0] = BPF_CORE_READ(regs, bx);
			saved[1] = BPF_CORE_READ(regs, bp);
			saved[2] = BPF_CORE_READ(regs, r12);
			saved[3] = BPF_CORE_READ(regs, r13);
			saved[4] = BPF_CORE_READ(regs, r14);
			saved[5] = BPF_CORE_READ(regs, r15);
			for (int i = 0; i < 6; i++) {
				__u64 v = saved[i];

				if (v > st->sp && v - st->sp < (1 << 20) && scan_from(st, v))
					return UNWIND_CONTINUE;
			}
		}
	}
	st->status = UNWIND_BAD_FRAME;
	return UNWIND_STOP;
}

/* Asks user space for the table of the file mapped at `begin`; at most every 200 ms. */
static __always_inline void ask_table(struct native_unwind_state *st, __u64 begin)
{
	struct table_request_key key = { .pid = st->pid, .begin = begin };
	__u64 *last = bpf_map_lookup_elem(&table_requested, &key);

	if (last && st->now - *last < 200000000ULL)
		return;
	bpf_map_update_elem(&table_requested, &key, &st->now, BPF_ANY);
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

/* Writes the identity of the file under `*ip` into the sampler's event; its context is the
 * address alone, since every byte of stack here adds to the deepest call chain's. */
static long leaf_file_of_vma(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	__u32 slot = SCRATCH_SAMPLER;
	struct sample_event *e = bpf_map_lookup_elem(&sample_scratch, &slot);
	struct file *file = BPF_CORE_READ(vma, vm_file);
	__u64 *ip = data;

	if (!file || !e)
		return 0;
	e->leaf_ino = BPF_CORE_READ(file, f_inode, i_ino);
	e->leaf_size = BPF_CORE_READ(file, f_inode, i_size);
	e->leaf_dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
	e->leaf_offset = *ip - BPF_CORE_READ(vma, vm_start) + (BPF_CORE_READ(vma, vm_pgoff) << 12);
	return 0;
}

/* The file under the leaf of a sample whose process, mapping or table user space has not read
 * yet: a process living a few hundred microseconds is gone before it can, and the leaf is then named
 * from the file identity alone. Only in the sampler: the VMA lookup takes the mmap lock (trylock),
 * which the scheduler's and the uprobes' contexts must not. */
static __always_inline void note_leaf_file(struct native_unwind_state *st)
{
	__u64 ip = st->ip;

	if (st->frames != 1 || st->slot != SCRATCH_SAMPLER)
		return;
	bpf_find_vma(bpf_get_current_task_btf(), ip, leaf_file_of_vma, &ip, 0);
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
		note_leaf_file(st);
		return stop(st, UNWIND_NO_PROCESS);
	}
	idx = find_mapping_index(st->pid, st->ip);
	if (idx < 0) {
		ask_refresh(st);
		note_leaf_file(st);
		return stop(st, UNWIND_NO_MAPPING);
	}
	m = &proc->mappings[idx & (MAX_PROCESS_MAPPINGS - 1)];
	if (m->flags & MAPPING_TABLE_PENDING) {
		/* No frame-pointer step here: in code built without them it skips callers and makes
		 * a stack that looks whole; a stop is honest and the table comes within ~100 ms. The
		 * leaf's file too: a process of a few hundred microseconds, read once, is gone before
		 * the table and its names come (1 in 7 samples of a storm of them stayed unnamed). */
		ask_table(st, m->begin);
		note_leaf_file(st);
		return stop(st, UNWIND_NO_TABLE_YET);
	}
	if (!(m->flags & MAPPING_HAS_TABLE))
		return step_without_cfi(st);
	pc = st->ip - adjust - m->load_bias;
	rule = find_rule(m->table_id, pc, st->now);
	if (!rule)
		return step_without_cfi(st);

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
		return step_without_cfi(st);
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
static __always_inline void unwind_user_stack(struct sample_event *e, __u32 slot)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs;
	struct native_unwind_state st = {};

	e->user_frames = 0;
	e->leaf_ino = 0;
	if (task->flags & 0x00200000 /* PF_KTHREAD */ || !task->mm) {
		e->unwind_status = UNWIND_KERNEL_THREAD;
		return;
	}
	/* A short-lived process spends a good part of its life here: its user registers point into
	 * the program that called execve, whose memory is (or is about to be) gone. */
	if (BPF_CORE_READ_BITFIELD(task, in_execve)) {
		e->unwind_status = UNWIND_IN_EXEC;
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
	st.now = bpf_ktime_get_ns();
	st.py.enabled = bpf_map_lookup_elem(&python_processes, &st.pid) != NULL;
	/* Python frames take steps of their own: room for a full stack of both. */
	bpf_loop(2 * MAX_USER_FRAMES + 1, unwind_step, &st, 0);
	/* The Python frames are readable without the native stack: a gap in it keeps them. */
	if (st.py.enabled && stopped_early(st.status))
		bpf_loop(MAX_USER_FRAMES / 2, py_rest_step, &st, 0);
	e->user_frames = st.frames;
	e->unwind_status = st.status;
	count_unwind_status(st.status);
}

#endif
