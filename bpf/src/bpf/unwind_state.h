/* The state of one native unwind walk, shared by the unwinder's steps. */
#ifndef GPUFLAME_UNWIND_STATE_H
#define GPUFLAME_UNWIND_STATE_H

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
	__u32 slot; /* the sample_scratch entry being filled */
	__u8 asked_refresh;
	__u8 leaf_done;
	__u8 adjust; /* the current frame's: 1 when its ip is a return address */
	__u8 scans; /* stack scans done for code without CFI */
	/* After a stack scan: the word under the return address found, which is the caller's rbp
	 * when the code without CFI pushed rbp first (as compilers do) and then used it as a
	 * general register (MKL's kernels); 0 once the walk has a known rbp again. */
	__u64 bp_below_ra;
	__u64 xol;  /* the process's uprobe page (return trampoline), or 0 */
	__u64 now;
	__u64 epoch; /* unwind_epoch when the walk began (frame_cache.h) */
	struct py_walk py;
};

static __always_inline void ask_refresh(struct native_unwind_state *st)
{
	__u64 now = bpf_ktime_get_ns(), *last;
	__u32 pid = st->pid; /* a key from the stack: see file_vma_index */

	if (st->asked_refresh)
		return;
	st->asked_refresh = 1;
	last = bpf_map_lookup_elem(&refresh_requested, &pid);
	if (last && now - *last < 100000000ULL) /* at most ten times a second per process */
		return;
	bpf_map_update_elem(&refresh_requested, &pid, &now, BPF_ANY);
	send_process_event(st->pid, PROCESS_UNKNOWN);
}

static __always_inline int stop(struct native_unwind_state *st, enum unwind_status status)
{
	st->status = status;
	return UNWIND_STOP;
}

#endif
