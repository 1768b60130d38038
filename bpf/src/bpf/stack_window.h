/* Words of the user stack that the native walk reads (return addresses, saved rbp), served from
 * a window of it read once: a read of the program's memory costs ~75 ns on the machines measured,
 * 8 bytes or 256 alike nearly (~105 ns), and a walk reads one or two words a frame, going up the
 * stack a frame's size at a time. A page's worth: a Python call's stack under its native callee
 * (26 frames, 2.7 KiB from the allocator to _start) is read in one or two reads, where a window of
 * 256 bytes took a dozen (on_torch_malloc in the Python tensor loop 3.9 -> 2.7 µs; the C++ loop's
 * shallow stack 1.25 -> 1.2 µs). The window is per CPU and per scratch slot (a sample can
 * interrupt a hook's walk, each has its own slot), and is used only by the walk that read it
 * (its thread, its start time): another walk on the CPU, after a preemption, reads its own. */
#ifndef GPUFLAME_STACK_WINDOW_H
#define GPUFLAME_STACK_WINDOW_H

#include "events.h"
#include "unwind_state.h"

#define STACK_WINDOW_BYTES 4096 /* a power of two, at most a page (the fallback reads to its end) */

struct stack_window {
	__u64 walk; /* the walk's start time (native_unwind_state.now) */
	__u64 base; /* the address of b[0] */
	__u32 tid;
	__u32 len;  /* bytes of b read */
	__u64 end;  /* where thread end_tid's stack ended: a read past it faulted */
	__u32 end_tid;
	__u32 _pad;
	/* Room for a word at any offset the mask below leaves. */
	__u8 b[STACK_WINDOW_BYTES + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SCRATCH_SLOTS);
	__type(key, __u32);
	__type(value, struct stack_window);
} stack_windows SEC(".maps");

/* Reads the window of walk `st` from `addr`: STACK_WINDOW_BYTES, or less where the thread's stack
 * ends before. A read past the end faults, and a fault costs more than the walk (~1.8 µs a
 * walk, measured on the C++ tensor loop): where one did, the window of this thread ends there
 * from then on. The size is bounded on the register passed. */
static __always_inline bool stack_window_fill(struct stack_window *w, struct native_unwind_state *st, __u64 addr)
{
	__u64 page_end = (addr | 4095) + 1;
	__u32 len = STACK_WINDOW_BYTES;

	w->tid = 0;
	if (w->end_tid == st->tid && addr < w->end && w->end - addr < STACK_WINDOW_BYTES)
		len = w->end - addr;
	if (len == STACK_WINDOW_BYTES) {
		if (bpf_probe_read_user(w->b, STACK_WINDOW_BYTES, (void *)addr) == 0)
			goto read;
		if (page_end - addr >= STACK_WINDOW_BYTES)
			return false;
		len = page_end - addr;
		w->end = page_end;
		w->end_tid = st->tid;
	}
	if (len < 8)
		return false;
	asm volatile("%0 &= %1" : "+r"(len) : "i"(STACK_WINDOW_BYTES - 1));
	if (bpf_probe_read_user(w->b, len, (void *)addr))
		return false;
read:
	w->len = len;
	w->base = addr;
	w->walk = st->now;
	w->tid = st->tid;
	return true;
}

/* The stack word at `addr`, for the walk `st`: 0, or the read's error. */
static __always_inline long stack_word(struct native_unwind_state *st, __u64 *out, __u64 addr)
{
	__u32 slot = st->slot;
	struct stack_window *w = bpf_map_lookup_elem(&stack_windows, &slot);
	__u64 off;

	if (!w)
		return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
	off = addr - w->base;
	if (w->tid != st->tid || w->walk != st->now || addr < w->base || off + 8 > w->len) {
		if (!stack_window_fill(w, st, addr))
			return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
		off = 0;
	}
	asm volatile("%0 &= %1" : "+r"(off) : "i"(STACK_WINDOW_BYTES - 1));
	*out = *(__u64 *)(w->b + off);
	return 0;
}

#endif
