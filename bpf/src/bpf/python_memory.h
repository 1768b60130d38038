/* Reading CPython's memory for the Python walker (python_walk.h): a frame's fields, and the
 * thread's current frame from its thread state. Every read is fault-checked and counted when it
 * fails: the interpreter's memory belongs to another process and may change under the read. */
#ifndef GPUFLAME_PYTHON_MEMORY_H
#define GPUFLAME_PYTHON_MEMORY_H

#include "maps.h"

static __always_inline int py_read(void *dst, __u32 size, __u64 addr)
{
	if (bpf_probe_read_user(dst, size, (void *)addr)) {
		count(COUNTER_PY_READ_FAULT);
		return -1;
	}
	return 0;
}

/* A frame's fields that the walk reads, in one copy of the frame's first bytes where they all lie
 * within them (every version from 3.8: at most ~112 bytes): one fault-checked read in place of
 * four, on every Python frame of every sample. */
#define PY_FRAME_BYTES 128

/* A per-CPU buffer's fill count: moved on before a copy's bytes are written, checked after they
 * are used. A program that interrupts a walk (the sampler, in a hook's walk) fills the same
 * bytes, and the walk it interrupted sees the count moved on and reads by itself. */
static __always_inline __u64 py_fill_begin(__u64 *fills)
{
	__u64 t = *fills + 1;

	*fills = t;
	barrier();
	return t;
}

static __always_inline bool py_fill_kept(__u64 *fills, __u64 t)
{
	barrier();
	return *(volatile __u64 *)fills == t;
}

struct py_frame_copy {
	__u64 fills; /* py_fill_begin */
	__u8 b[256 + 8]; /* room for the size as masked below, and a field at any masked offset */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_frame_copy);
} py_frame_copies SEC(".maps");

struct py_frame_fields {
	__u64 previous;
	__u64 code;
	__u64 instr; /* the instruction pointer, or (3.8-3.10) f_lasti in the low 32 bits */
	__u8 marker; /* is_entry or owner; 0 for frame objects */
	__u8 previous_ok;
	__u8 code_ok;
	__u8 instr_ok;
};

static __always_inline __u32 py_max(__u32 a, __u32 b)
{
	return a > b ? a : b;
}

/* Copies `size` bytes at `addr` into the buffer: 0, or an error (also when size is over
 * PY_FRAME_BYTES). The bound is put on the very register passed, which the verifier checks: a
 * test the compiler makes on a copy of it is not seen there. */
static __always_inline long py_read_span(struct py_frame_copy *c, __u32 size, __u64 addr)
{
	if (size > PY_FRAME_BYTES)
		return -1;
	asm volatile("%0 &= 0xff" : "+r"(size));
	return bpf_probe_read_user(c->b, size, (void *)addr);
}

/* Two 8-byte words of one object (a thread state's, a code object's), at offsets `a` and `b`, in
 * one copy where both lie within PY_SPAN_BYTES: a read of the program's memory costs about as
 * much for 8 bytes as for 200 (~75-105 ns). Returns a bit per word not read (1: a, 2: b). Global:
 * its locals take no room in the walker's frames, which the verifier's stack budget holds tight. */
#define PY_SPAN_BYTES 248

__noinline int py_read_pair(__u64 obj, __u32 a, __u32 b, __u64 *va, __u64 *vb)
{
	__u32 zero = 0, lo = a < b ? a : b, span = (a > b ? a : b) + 8 - lo;
	struct py_frame_copy *c = bpf_map_lookup_elem(&py_frame_copies, &zero);

	if (!va || !vb)
		return 3;
	if (c && span <= PY_SPAN_BYTES) {
		/* The copy's token waits in *vb: a slot of this function's own frame put the deepest
		 * call chain (on_cuda_call's) 16 bytes over the verifier's 512. */
		*vb = py_fill_begin(&c->fills);
		asm volatile("%0 &= 0xff" : "+r"(span));
		if (bpf_probe_read_user(c->b, span, (void *)(obj + lo)) == 0) {
			__u64 wa = *(__u64 *)(c->b + ((a - lo) & 0xff));
			__u64 wb = *(__u64 *)(c->b + ((b - lo) & 0xff));

			if (py_fill_kept(&c->fills, *vb)) {
				*va = wa;
				*vb = wb;
				return 0;
			}
		}
	}
	return (py_read(va, sizeof(*va), obj + a) ? 1 : 0) | (py_read(vb, sizeof(*vb), obj + b) ? 2 : 0);
}

/* 3.11+: a thread's frames live in its data stack, a caller's just below its callee's (a
 * generator's and a C-stack shim's elsewhere). The frames after a walk's first (python_walk.h
 * reads that one alone) come from one copy of the PY_WINDOW_BYTES below the one asked for: a
 * copy costs about what a frame's own read does, and holds several frames (a frame is its
 * header and its locals: 100-300 bytes). Per CPU: a program that interrupts a walk (the
 * sampler, in a hook's walk) takes the window over, and the walk, checking that it still owns it
 * after copying a frame out, reads that frame again by itself. */
#define PY_WINDOW_BYTES 1024 /* a power of two: 2 and 4 KiB measured no better */

#define PY_CODES 8 /* a power of two */

struct py_window {
	__u64 walk; /* the walk's record's timestamp; 0 while it is filled */
	__u64 base; /* the address of b[0] */
	__u32 tid;  /* and its thread */
	__u32 len;  /* bytes of b read; 0 after the walk's first frame */
	__u64 fills; /* py_fill_begin, at every fill */
	__u64 floor; /* where a read below thread floor_tid's frames faulted: the page under its */
	__u32 floor_tid; /* first data-stack chunk is often not mapped, and a fault costs ~1 µs */
	__u32 _pad2;
	/* The code objects the walk read (py_code_line_tag), and what it read: a code object's
	 * functions recur in a stack (recursion; nn.Module's _call_impl at every module), and a
	 * code object cannot go while a frame of the walk holds it. */
	__u64 code[PY_CODES];
	__u64 line_tag[PY_CODES];
	__u32 codes; /* entries put in; the next goes at codes % PY_CODES */
	__u32 _pad;
	__u8 b[PY_WINDOW_BYTES + PY_FRAME_BYTES + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_window);
} py_windows SEC(".maps");

/* A walk is known by its record's timestamp and thread (e->header). */
static __always_inline bool py_window_owned(struct py_window *win, __u64 walk, __u32 tid)
{
	return win->walk == walk && win->tid == tid;
}

/* Makes the window walk's, empty. */
static __always_inline void py_window_claim(struct py_window *win, __u64 walk, __u32 tid)
{
	win->walk = walk;
	win->tid = tid;
	win->len = 0;
	win->codes = 0;
}

/* The offset in the window of `walk` (of thread `tid`) of the `span` bytes at `f`, read into it
 * if need be; -1 where they could not be read. */
static __always_inline long py_window_at(struct py_window *win, __u64 walk, __u32 tid, __u64 f, __u32 span)
{
	__u64 end = f + span, start = end - PY_WINDOW_BYTES, fill;
	__u32 len = PY_WINDOW_BYTES;
	bool above_floor;

	if (!py_window_owned(win, walk, tid))
		py_window_claim(win, walk, tid);
	else if (f >= win->base && end <= win->base + win->len)
		return f - win->base;
	win->walk = 0;
	fill = py_fill_begin(&win->fills);
	/* Short of the floor: from it. A whole window that faults: from the start of f's page (less
	 * than a window, or the read would not have reached below it), which becomes the floor. */
	above_floor = win->floor_tid == tid && start < win->floor && f >= win->floor;
	if (above_floor || bpf_probe_read_user(win->b, PY_WINDOW_BYTES, (void *)start)) {
		start = above_floor ? win->floor : f & ~4095ULL;
		win->floor = start;
		win->floor_tid = tid;
		len = end - start;
		if (len >= PY_WINDOW_BYTES || len < 8)
			return -1;
		asm volatile("%0 &= %1" : "+r"(len) : "i"(PY_WINDOW_BYTES - 1));
		if (bpf_probe_read_user(win->b, len, (void *)start))
			return -1;
	}
	win->base = start;
	win->len = len;
	barrier();
	win->walk = walk;
	if (!py_fill_kept(&win->fills, fill)) {
		win->walk = 0;
		return -1;
	}
	return f - start;
}

/* The `span` bytes at `f` in `walk`'s window, read into it if need be; NULL where they could not
 * be. `*fills` is for py_window_kept. */
static __always_inline __u8 *py_window_bytes(struct py_window *win, __u64 walk, __u32 tid, __u64 f, __u32 span, __u64 *fills)
{
	long off = py_window_at(win, walk, tid, f, span);

	if (off < 0)
		return NULL;
	*fills = win->fills;
	return win->b + (off & (PY_WINDOW_BYTES - 1));
}

/* Whether what was copied out of the window since py_window_bytes is still `walk`'s: a program
 * that interrupted this one may have taken the window over. */
static __always_inline bool py_window_kept(struct py_window *win, __u64 walk, __u32 tid, __u64 fills)
{
	return py_fill_kept(&win->fills, fills) && py_window_owned(win, walk, tid);
}

/* A frame's fields from a copy `b` of its first bytes. */
static __always_inline void py_frame_fields_from(__u8 *b, struct py_offsets *o, bool marked, struct py_frame_fields *out)
{
	out->previous = *(__u64 *)(b + (o->frame_previous & (PY_FRAME_BYTES - 1)));
	out->code = *(__u64 *)(b + (o->frame_code & (PY_FRAME_BYTES - 1)));
	out->instr = *(__u64 *)(b + (o->frame_instr & (PY_FRAME_BYTES - 1)));
	out->marker = marked ? b[o->frame_entry & (PY_FRAME_BYTES - 1)] : 0;
	out->previous_ok = out->code_ok = out->instr_ok = 1;
}

/* Reads the fields of the frame at f for the walk that fills `e`: from the walk's window where it
 * can (3.11+), else at once where they fit, else one by one. Global: the verifier checks it
 * once, and its locals take no room in the walker's frame. */
__noinline int py_read_frame(struct py_offsets *o, __u64 f, struct py_frame_fields *out, struct event_record *e)
{
	__u32 zero = 0, span;
	struct py_frame_copy *c;
	struct py_window *win;
	__u64 fills = 0;
	bool marked;
	__u8 *b;

	if (!o || !out)
		return 0;
	marked = o->frame_kind != PY_FRAME_OBJECT;
	span = py_max(py_max(o->frame_previous, o->frame_code), o->frame_instr);
	if (marked)
		span = py_max(span, o->frame_entry);
	span += 8;
	win = marked && e && span <= PY_FRAME_BYTES ? bpf_map_lookup_elem(&py_windows, &zero) : NULL;
	if (win && (b = py_window_bytes(win, e->header.timestamp_ns, e->header.tid, f, span, &fills))) {
		py_frame_fields_from(b, o, true, out);
		if (py_window_kept(win, e->header.timestamp_ns, e->header.tid, fills))
			return 0;
	}
	c = bpf_map_lookup_elem(&py_frame_copies, &zero);
	if (c) {
		fills = py_fill_begin(&c->fills);
		if (py_read_span(c, span, f) == 0) {
			py_frame_fields_from(c->b, o, marked, out);
			if (py_fill_kept(&c->fills, fills))
				return 0;
		}
	}
	out->previous_ok = py_read(&out->previous, sizeof(out->previous), f + o->frame_previous) == 0;
	if (!out->previous_ok)
		return 0;
	if (marked && py_read(&out->marker, sizeof(out->marker), f + o->frame_entry))
		out->marker = 0;
	out->code_ok = py_read(&out->code, sizeof(out->code), f + o->frame_code) == 0;
	if (o->frame_kind == PY_FRAME_OBJECT) {
		__s32 lasti32 = 0;

		out->instr_ok = py_read(&lasti32, sizeof(lasti32), f + o->frame_instr) == 0;
		out->instr = (__u32)lasti32;
	} else {
		out->instr_ok = py_read(&out->instr, sizeof(out->instr), f + o->frame_instr) == 0;
	}
	return 0;
}

/* The thread's current Python frame: from its PyThreadState, matched by pthread_t (its TLS base).
 * Global, like the shim searches of python_walk.h, so that the verifier checks its loop once, on
 * its own. */
__noinline __u64 py_current_frame(__u32 pid, __u32 tid)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct py_process *p = bpf_map_lookup_elem(&python_processes, &pid);
	struct py_offsets *o;
	__u64 fsbase, ts = 0, id = 0, is = 0, frame = 0, *cached;

	if (!p || !task)
		return 0;
	o = &p->o;
	fsbase = task->thread.fsbase;

	cached = bpf_map_lookup_elem(&python_threads, &tid);
	if (cached) {
		ts = *cached;
		/* Its thread id, to know it is still this thread's, and its frame: one read. */
		if (py_read_pair(ts, o->tstate_thread_id, o->tstate_frame, &id, &frame) || id != fsbase)
			ts = 0;
	}
	if (!ts) {
		if (py_read(&is, sizeof(is), p->runtime + o->runtime_interpreters_head) || !is)
			return 0;
		if (py_read(&ts, sizeof(ts), is + o->interp_threads_head))
			return 0;
		for (int i = 0; i < 64 && ts; i++) {
			if (py_read(&id, sizeof(id), ts + o->tstate_thread_id))
				return 0;
			if (id == fsbase)
				break;
			if (py_read(&ts, sizeof(ts), ts + o->tstate_next))
				return 0;
		}
		if (!ts || id != fsbase) {
			count(COUNTER_PY_NO_THREAD);
			return 0;
		}
		bpf_map_update_elem(&python_threads, &tid, &ts, BPF_ANY);
		if (py_read(&frame, sizeof(frame), ts + o->tstate_frame))
			return 0;
	}
	if (o->cframe_current_frame != PY_NO_OFFSET && frame &&
	    py_read(&frame, sizeof(frame), frame + o->cframe_current_frame))
		return 0;
	return frame;
}

#endif
