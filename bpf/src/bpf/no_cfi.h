/* Code without CFI: frame pointers, and stack scans for return addresses. */
#ifndef GPUFLAME_NO_CFI_H
#define GPUFLAME_NO_CFI_H

#include "unwind_state.h"
#include "unwind_tables.h"

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

/* Per CPU and scratch slot: a sample that interrupts a hook's walk scans in a buffer of its own. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SCRATCH_SLOTS);
	__type(key, __u32);
	__type(value, struct scan_buffer);
} scan_buffers SEC(".maps");

struct scan_state {
	__u32 pid;
	__u32 tried;
	__s32 found; /* index of the word that is a return address, or -1 */
	__u32 slot;
};

/* One word of the scan: a candidate is a word in the process's code; the first candidate that
 * follows a call is taken, after SCAN_CANDIDATES the scan gives up. */
static long scan_word(__u32 i, void *arg)
{
	struct scan_state *s = arg;
	struct scan_buffer *buf = bpf_map_lookup_elem(&scan_buffers, &s->slot);
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

	if (!st || st->scans >= MAX_SCANS)
		return 0;
	scan.slot = st->slot;
	buf = bpf_map_lookup_elem(&scan_buffers, &scan.slot);
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
	/* rbp stays: code without CFI that kept it is right. Code that used it as a general register
	 * saved the caller's first, most often right under the return address: kept aside for a
	 * caller whose rule needs an rbp that the one left does not give (bp_after_scan). */
	st->bp_below_ra = 0;
	if (scan.found > 0)
		st->bp_below_ra = buf->words[(scan.found - 1) & (SCAN_WORDS - 1)];
	else
		bpf_probe_read_user(&st->bp_below_ra, sizeof(st->bp_below_ra), (void *)(base - 8));
	return 1;
}

/* An rbp that could be a frame's: above sp, within the stack's reach. */
static __always_inline bool plausible_bp(struct native_unwind_state *st, __u64 bp)
{
	return bp > st->sp && bp - st->sp < (1 << 20) && !(bp & 7);
}

/* The rbp for a rule that reads it, after a stack scan: the one left in the register when it is
 * plausible (and, for a CFA of rbp + cfa_offset, leads to a return address), else the word saved
 * under the scanned return address. */
static __always_inline void bp_after_scan(struct native_unwind_state *st, bool cfa_from_bp, __s32 cfa_offset)
{
	__u64 guess = st->bp_below_ra, ra = 0;

	if (!guess)
		return;
	st->bp_below_ra = 0;
	if (!plausible_bp(st, guess))
		return;
	if (plausible_bp(st, st->bp) &&
	    (!cfa_from_bp ||
	     (!bpf_probe_read_user(&ra, sizeof(ra), (void *)(st->bp + cfa_offset - 8)) && is_return_address(st->pid, ra))))
		return;
	count(COUNTER_UNWIND_BP_RECOVERED);
	st->bp = guess;
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

#endif
