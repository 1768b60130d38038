/* 3.12+: the C-stack shim frames that end an eval-loop call's Python frames, and where they sit
 * in the native frame of that call (python_walk.h walks with them): found by following the
 * Python frames to the next one, by scanning a native frame for one, or where found ones sat. */
#ifndef GPUFLAME_PYTHON_SHIMS_H
#define GPUFLAME_PYTHON_SHIMS_H

#include "maps.h"
#include "python_memory.h"

struct shim_search {
	__u64 f;
	__u64 found;
	__u64 walk; /* the walk's record's timestamp and thread: its window (python_memory.h) */
	__u32 tid;
	__u16 frame_entry;
	__u16 frame_previous;
	__u8 owner_cstack;
};

/* The owner of frame s->f and its previous frame, from the walk's window: the frames the search
 * goes through are those the walk then emits. Returns false where the window has not got them. */
static __always_inline bool shim_from_window(struct shim_search *s, __u8 *owner, __u64 *previous)
{
	__u32 zero = 0, span = (s->frame_entry > s->frame_previous ? s->frame_entry : s->frame_previous) + 8;
	struct py_window *win = bpf_map_lookup_elem(&py_windows, &zero);
	__u64 fills = 0;
	__u8 *b;

	if (!win || span > PY_FRAME_BYTES || !(b = py_window_bytes(win, s->walk, s->tid, s->f, span, &fills)))
		return false;
	*owner = b[s->frame_entry & (PY_FRAME_BYTES - 1)];
	*previous = *(__u64 *)(b + (s->frame_previous & (PY_FRAME_BYTES - 1)));
	return py_window_kept(win, s->walk, s->tid, fills);
}

static long shim_step(__u32 i, void *arg)
{
	struct shim_search *s = arg;
	__u64 previous = 0;
	__u8 owner = 0;

	if (!s->f)
		return 1;
	if (!shim_from_window(s, &owner, &previous)) {
		if (bpf_probe_read_user(&owner, sizeof(owner), (void *)(s->f + s->frame_entry)))
			return 1;
		if (owner != s->owner_cstack &&
		    bpf_probe_read_user(&previous, sizeof(previous), (void *)(s->f + s->frame_previous)))
			return 1;
	}
	if (owner == s->owner_cstack) {
		s->found = s->f;
		return 1;
	}
	s->f = previous;
	return 0;
}

/* The next shim frame from f on; 0 when the chain ends first; PY_SHIM_BEYOND when none is within
 * PY_SHIM_SEARCH frames. Recursion in pure Python runs thousands of frames in one eval-loop call
 * (3.11+ calls Python from Python without a new call), so the shim that ends them can be further
 * than any search goes. The walk then keeps what it can: the sample holds at most
 * MAX_USER_FRAMES / 2 Python frames, fewer than the search looked through, so the innermost
 * frames fill it and the cut falls at the root side, marked [truncated]. */
#define PY_SHIM_SEARCH 1024
#define PY_SHIM_BEYOND 1
_Static_assert(PY_SHIM_SEARCH > MAX_USER_FRAMES / 2, "a call whose shim was not found must fill the sample");
__noinline __u64 py_find_shim(__u32 pid, __u64 f, __u64 walk, __u32 tid)
{
	struct py_process *p = bpf_map_lookup_elem(&python_processes, &pid);
	struct shim_search s = { .f = f, .walk = walk, .tid = tid };

	if (!p)
		return 0;
	s.frame_entry = p->o.frame_entry;
	s.frame_previous = p->o.frame_previous;
	s.owner_cstack = p->o.owner_cstack;
	if (bpf_loop(PY_SHIM_SEARCH, shim_step, &s, 0) == PY_SHIM_SEARCH && !s.found && s.f)
		return PY_SHIM_BEYOND;
	return s.found;
}

struct shim_scan {
	__u64 at;
	__u64 end;
	__u64 none;
	__u64 found;
	__u16 frame_entry;
	__u16 frame_code;
	__u8 owner_cstack;
};

static long shim_scan_step(__u32 i, void *arg)
{
	struct shim_scan *s = arg;
	__u64 b = s->at, code = 0;
	__u8 owner = 0;

	if (b >= s->end)
		return 1;
	s->at = b + 8;
	if (bpf_probe_read_user(&owner, sizeof(owner), (void *)(b + s->frame_entry)) || owner != s->owner_cstack)
		return 0;
	if (bpf_probe_read_user(&code, sizeof(code), (void *)(b + s->frame_code)) || (code & ~7ULL) != s->none)
		return 0;
	s->found = b;
	return 1;
}

/* 3.13+, before any shim was found in this process: a shim in the native frame [sp, cfa),
 * known by its owner and the None in its code slot, looked for in the frame's first
 * PY_SHIM_SCAN slots; 0 when none. Global, so that the verifier checks its loop once. */
#define PY_SHIM_SCAN 512
__noinline __u64 py_scan_for_shim(__u32 pid, __u64 sp, __u64 cfa)
{
	struct py_process *p = bpf_map_lookup_elem(&python_processes, &pid);
	struct shim_scan s = { .at = sp };

	if (!p || !p->none_object || cfa <= sp)
		return 0;
	s.end = cfa - 8;
	s.none = p->none_object;
	s.frame_entry = p->o.frame_entry;
	s.frame_code = p->o.frame_code;
	s.owner_cstack = p->o.owner_cstack;
	bpf_loop(PY_SHIM_SCAN, shim_scan_step, &s, 0);
	return s.found;
}

/* Remembers where a shim sat in its eval-loop frame, and its instruction pointer. */
static __always_inline void py_learn_shim(struct py_process *p, __u64 shim, __u64 cfa)
{
	__u64 instr = 0;

	/* The place first, so that no CPU reads an instruction pointer without it. */
	if (py_read(&instr, sizeof(instr), shim + p->o.frame_instr) == 0 && instr) {
		p->shim_below_cfa = cfa - shim;
		p->shim_instr = instr;
	}
}

/* Whether the native frame [sp, cfa) holds a shim at the place where found shims were: the shim
 * of an eval-loop call, known without following the Python frames to it. */
static __always_inline bool py_shim_in_place(struct py_process *p, __u64 sp, __u64 cfa)
{
	__u64 shim, instr = 0;
	__u8 owner = 0;

	if (!p->shim_instr || cfa - sp < p->shim_below_cfa)
		return false;
	shim = cfa - p->shim_below_cfa;
	return py_read(&owner, sizeof(owner), shim + p->o.frame_entry) == 0 && owner == p->o.owner_cstack &&
	       py_read(&instr, sizeof(instr), shim + p->o.frame_instr) == 0 && instr == p->shim_instr;
}

#endif
