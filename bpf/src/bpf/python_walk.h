/* The Python walker: when the native unwinder reaches CPython's evaluation loop, the Python frames
 * that this call of _PyEval_EvalFrameDefault runs are read from the interpreter's memory and put
 * in the stack in its place, one frame per bpf_loop iteration, so that a sample stays one stack:
 * native callers, Python frames, native callees. */
#ifndef GPUFLAME_PYTHON_WALK_H
#define GPUFLAME_PYTHON_WALK_H

#include "maps.h"
#include "python_memory.h"
#include "python_shims.h"

enum py_mode {
	PY_MODE_IDLE = 0,
	PY_MODE_EMITTING = 1, /* emitting the Python frames of the current eval-loop frame */
	PY_MODE_DONE = 2,     /* they are out: unwind the eval-loop frame without recording it */
};

struct py_walk {
	__u64 frame;     /* the next Python frame to emit (interpreter memory) */
	__u64 next_shim; /* eval_by_shim: the shim that ends the next eval-loop call's frames */
	__u8 mode;       /* enum py_mode */
	__u8 ready;      /* 1: frame was found from the thread state; 2: and a frame was read (the
	                  * next ones go through the walk's window and code cache, python_memory.h) */
	__u8 enabled;    /* the process runs CPython */
	__u8 shim_known; /* next_shim is current */
	__u8 via_shim;   /* emitting for a frame found by its shim: no native slot to skip after */
	__u8 gap_marked; /* the gap marker is out: Python frames after an early native stop */
	__u8 mark_calls; /* the stack was copied: the frames after the gap are split by call */
	__u8 by_shim;    /* 0 not looked up yet; 1 the eval loop is known by its symbol; 2 by shims */
};

static __always_inline bool py_at_eval(struct py_process *p, __u64 ip)
{
	for (int i = 0; i < PY_MAX_EVAL_RANGES; i++)
		if (ip >= p->eval_lo[i] && ip < p->eval_hi[i])
			return true;
	return false;
}

/* Whether `ip` is in the evaluation loop of process `pid`'s Python, by symbol, as its entry says
 * now; frame_cache.h keeps the answer with the rule for the address. Global: its lookup takes no
 * room in the unwinder's frame. */
__noinline int py_eval_at(__u32 pid, __u64 ip)
{
	struct py_process *p = bpf_map_lookup_elem(&python_processes, &pid);

	return p && py_at_eval(p, ip);
}

/* Writes one Python frame (two slots) into the sample; returns false when there is no room. */
static __always_inline bool py_emit(struct event_record *e, __u32 *frames, __u64 code, __u64 second)
{
	if (*frames + 2 > MAX_USER_FRAMES)
		return false;
	e->user_stack[*frames & (MAX_USER_FRAMES - 1)] = code | PY_FRAME_TAG;
	e->user_stack[(*frames + 1) & (MAX_USER_FRAMES - 1)] = second;
	*frames += 2;
	count(COUNTER_PY_FRAMES);
	return true;
}

/* A code object's first line (low half) and a 16-bit tag of its name (high half), `name` the
 * offset of the name user space shows. The name's length and hash (PyASCIIObject: +16, +24 in
 * every version) make the tag: a code object and its name string freed and both reused at the
 * same addresses still read as new. The first line and the name's address in one copy of the code
 * object (40-90 bytes apart; the first line is an int, the low half of the word read there). */
static __always_inline __u64 py_code_read(__u64 code, __u32 line, __u32 name_at)
{
	__u64 word = 0, name = 0, tag = 0, x;
	__s64 len_hash[2] = {};

	if (name_at == PY_NO_OFFSET) {
		py_read(&word, sizeof(__s32), code + line);
	} else if (py_read_pair(code, line, name_at, &word, &name) & 2) {
		name = 0;
	}
	if (name && py_read(len_hash, sizeof(len_hash), name + 16) == 0) {
		x = (__u64)(len_hash[0] ^ len_hash[1]);
		tag = (x ^ (x >> 16) ^ (x >> 32) ^ (x >> 48)) & 0xffff;
	}
	return (tag << 32) | (__u32)word;
}

/* py_code_read's answer, for the walk that fills `e` (NULL: none): a code object that walk read
 * already is not read again (the walk's code cache, python_memory.h). Global: its reads' buffers
 * take no room in the walker's frame. */
__noinline __u64 py_code_line_tag(__u64 code, __u32 line, __u32 name_at, struct event_record *e)
{
	__u32 k;
	/* The key from read-only data, not a stack slot: the slot made the frame 72 bytes, which
	 * verifiers before 6.9 round up to 96 and which put the CUDA hooks' chain 32 bytes over 512. */
	struct py_window *win = e ? bpf_map_lookup_elem(&py_windows, (void *)&zero_key) : NULL;
	__u64 v;

	if (win && !py_window_owned(win, e->header.timestamp_ns, e->header.tid))
		py_window_claim(win, e->header.timestamp_ns, e->header.tid);
	if (win) {
		for (k = 0; k < PY_CODES; k++) {
			if (k >= win->codes || win->code[k] != code)
				continue;
			v = win->line_tag[k];
			barrier();
			/* A program that interrupted this one may have taken the window over. */
			if (py_window_owned(win, e->header.timestamp_ns, e->header.tid))
				return v;
			break;
		}
	}
	v = py_code_read(code, line, name_at);
	if (win && py_window_owned(win, e->header.timestamp_ns, e->header.tid)) {
		k = win->codes & (PY_CODES - 1);
		win->code[k] = 0;
		barrier();
		win->line_tag[k] = v;
		barrier();
		win->code[k] = code;
		win->codes++;
	}
	return v;
}

/* Emits the frame at f, which runs code object `code`: its address tagged with its name,
 * then its first line and last instruction. `walk`: the record whose walk's code cache to use,
 * or NULL. Returns false when the sample is full. */
static __always_inline bool py_emit_frame(struct event_record *e, __u32 *frames, struct py_offsets *o, struct py_frame_fields *ff, __u64 code, struct event_record *walk)
{
	__u64 lasti = 0, line_tag;

	if (code & ~PY_ADDR_MASK)
		return true; /* not a user-space address: not a code object */
	if (ff->instr_ok && o->frame_kind == PY_FRAME_OBJECT)
		lasti = (__u32)ff->instr;
	else if (ff->instr_ok && ff->instr >= code + o->code_adaptive)
		lasti = (ff->instr - code - o->code_adaptive) / 2;
	line_tag = py_code_line_tag(code, o->code_firstlineno, o->code_name, walk);
	return py_emit(e, frames, code | ((line_tag >> 32) << PY_NAME_TAG_SHIFT), (line_tag << 32) | (lasti & 0xffffffff));
}

/* One step of emitting: one Python frame, or the end of this eval-loop call's frames.
 * Returns false when the sample is full. */
static __always_inline bool py_step(struct py_walk *w, __u32 pid, __u32 *frames, struct event_record *e)
{
	struct py_process *p = bpf_map_lookup_elem(&python_processes, &pid);
	struct event_record *walk;
	struct py_frame_fields ff = {};
	struct py_offsets *o;
	__u64 f = w->frame, code;

	if (!p || !f) {
		w->mode = PY_MODE_DONE;
		return true;
	}
	o = &p->o;
	/* A walk's first frame is read alone: a stack of one Python frame (a tensor's, from its
	 * Python line) pays nothing for the window and code cache, whose cache lines it would miss. */
	walk = w->ready == 2 ? e : NULL;
	w->ready = 2;
	py_read_frame(o, f, &ff, walk);
	if (!ff.previous_ok) {
		w->mode = PY_MODE_DONE;
		w->frame = 0;
		return true;
	}
	if (o->frame_kind == PY_FRAME_OWNER && ff.marker == o->owner_cstack) {
		/* The shim below this call's frames: skip it, and this call is done. */
		w->frame = ff.previous;
		w->mode = w->via_shim ? PY_MODE_IDLE : PY_MODE_DONE;
		w->via_shim = 0;
		return true;
	}
	if (ff.code_ok) {
		code = ff.code;
		if (o->code_tagged)
			code &= ~7ULL;
		if (code && !py_emit_frame(e, frames, o, &ff, code, walk))
			return false;
	}
	w->frame = ff.previous;
	/* 3.8-3.10: one frame per eval-loop call; 3.11: the entry frame is the call's last. */
	if (o->frame_kind == PY_FRAME_OBJECT || (o->frame_kind == PY_FRAME_IS_ENTRY && ff.marker))
		w->mode = PY_MODE_DONE;
	return true;
}

/* The end of one eval-loop call's frames after the gap (PY_CALL_MARK), where the stack was copied
 * for user space to finish: its shim's address (3.12+) or 0. Returns 1 when the sample is full. */
static __always_inline long py_mark_call(struct py_walk *w, __u32 *frames, struct event_record *e, __u64 shim)
{
	if (!w->mark_calls || !w->gap_marked)
		return 0;
	if (*frames + 2 > MAX_USER_FRAMES) {
		count(COUNTER_PY_TRUNCATED);
		return 1;
	}
	e->user_stack[*frames & (MAX_USER_FRAMES - 1)] = PY_CALL_MARK;
	e->user_stack[(*frames + 1) & (MAX_USER_FRAMES - 1)] = shim;
	*frames += 2;
	return 0;
}

/* After the native walk stopped early: the thread's Python frames that remain, all of them, after
 * a gap marker, so that a sample in code without unwind information still has its Python line.
 * Returns 1 when done, 0 to go on. Global, so that the verifier checks it once. */
__noinline long py_emit_rest(struct py_walk *w, __u32 pid, __u32 tid, __u32 *frames, __u32 slot)
{
	struct event_record *e = bpf_map_lookup_elem(&sample_scratch, &slot), *walk;
	struct py_process *p = bpf_map_lookup_elem(&python_processes, &pid);
	struct py_frame_fields ff = {};
	struct py_offsets *o;
	__u64 f, code;

	if (!w || !frames || !e || !p)
		return 1;
	o = &p->o;
	if (!w->ready) {
		w->ready = 1;
		w->frame = py_current_frame(pid, tid);
	}
	f = w->frame;
	if (!f)
		return 1;
	walk = w->ready == 2 ? e : NULL;
	w->ready = 2;
	py_read_frame(o, f, &ff, walk);
	if (!ff.previous_ok)
		return 1;
	w->frame = ff.previous;
	if (o->frame_kind == PY_FRAME_OWNER && ff.marker == o->owner_cstack)
		/* A C-stack shim: nothing to show, but the end of a call when the native stack is
		 * finished later; its address finds the eval-loop frame that holds it. */
		return py_mark_call(w, frames, e, f);
	code = ff.code;
	if (!ff.code_ok || !code)
		return 0;
	if (o->code_tagged)
		code &= ~7ULL;
	if (!w->gap_marked) {
		if (*frames >= MAX_USER_FRAMES) {
			count(COUNTER_PY_TRUNCATED);
			return 1;
		}
		e->user_stack[*frames & (MAX_USER_FRAMES - 1)] = USER_GAP_MARK;
		*frames += 1;
		w->gap_marked = 1;
		count(COUNTER_PY_AFTER_GAP);
	}
	if (!py_emit_frame(e, frames, o, &ff, code, walk)) {
		count(COUNTER_PY_TRUNCATED);
		return 1;
	}
	/* 3.8-3.10: one frame per eval-loop call; 3.11: the entry frame is the call's last. */
	if (o->frame_kind == PY_FRAME_OBJECT || (o->frame_kind == PY_FRAME_IS_ENTRY && ff.marker))
		return py_mark_call(w, frames, e, 0);
	return 0;
}

/* The process's interpreter when the walk may emit here (found by shim or not, as asked), with
 * the thread's current Python frame read once per sample. */
static __always_inline struct py_process *py_walkable(struct py_walk *w, __u32 pid, __u32 tid, bool by_shim)
{
	struct py_process *p;

	if (!w->enabled)
		return NULL;
	/* Every native frame asks both ways: the way that does not apply costs no lookup of the
	 * interpreter (a hash map's) after the first. */
	if (w->by_shim && (w->by_shim == 2) != by_shim)
		return NULL;
	p = bpf_map_lookup_elem(&python_processes, &pid);
	if (!p)
		return NULL;
	w->by_shim = p->o.eval_by_shim ? 2 : 1;
	if ((bool)p->o.eval_by_shim != by_shim)
		return NULL;
	if (!w->ready) {
		w->ready = 1;
		w->frame = py_current_frame(pid, tid);
	}
	return w->frame ? p : NULL;
}

/* 3.12+: whether the native frame spanning [sp, cfa), at ip, is an eval-loop call whose Python
 * frames should replace it. */
static __always_inline bool py_frame_holds_shim(struct py_walk *w, __u32 pid, __u32 tid, __u64 ip, __u64 sp, __u64 cfa, struct event_record *e)
{
	struct py_process *p;

	/* Most frames: the next shim is known, and not in this one; no lookup of the interpreter. */
	if (w->by_shim == 2 && w->shim_known && w->next_shim != PY_SHIM_BEYOND &&
	    (!w->next_shim || w->next_shim < sp || w->next_shim >= cfa))
		return false;
	p = py_walkable(w, pid, tid, true);
	if (!p)
		return false;
	if (!w->shim_known) {
		w->shim_known = 1;
		w->next_shim = py_find_shim(pid, w->frame, e->header.timestamp_ns, e->header.tid);
	}
	if (w->next_shim == PY_SHIM_BEYOND) {
		/* The innermost eval-loop call runs the thread's current frame: the first native frame
		 * in the evaluation loop's symbol, or with a shim where found shims sat, or (none found
		 * yet in this process: attached to a thread already this deep) with one anywhere. */
		if (!py_at_eval(p, ip) && !py_shim_in_place(p, sp, cfa)) {
			__u64 shim = p->shim_instr ? 0 : py_scan_for_shim(pid, sp, cfa);

			if (!shim)
				return false;
			py_learn_shim(p, shim, cfa);
		}
		count(COUNTER_PY_DEEP);
	} else if (!w->next_shim || w->next_shim < sp || w->next_shim >= cfa) {
		return false;
	} else if (!p->shim_instr) {
		py_learn_shim(p, w->next_shim, cfa);
	}
	w->mode = PY_MODE_EMITTING;
	w->via_shim = 1;
	w->shim_known = 0; /* the next call's shim is searched for after this one's frames */
	return true;
}

/* Before 3.12: at a native frame, starts emitting when it is the evaluation loop (by symbol) and
 * Python frames remain. */
static __always_inline bool py_begin(struct py_walk *w, __u32 pid, __u32 tid, __u64 ip)
{
	struct py_process *p = py_walkable(w, pid, tid, false);

	if (!p || !py_at_eval(p, ip))
		return false;
	w->mode = PY_MODE_EMITTING;
	return true;
}

#endif
