/* The device memory live now, kept in the kernel as bcc's memleak keeps the heap: a map from
 * (process, pointer) to what each tensor and each cudaMalloc-style segment is. An allocation
 * inserts, a free deletes, and user space reads the map at a window's end and at an
 * out-of-memory: the in-use totals hold however far behind user space falls, since no record of
 * the ring is needed to keep them. The ring carries what the map does not: each distinct stack
 * once (the first allocation made from it sends its whole record, the others only its id), and
 * one compact record per allocation and free for the memory timeline and the allocation
 * profiles, which a full ring may cost (counted). Physical memory (cuMemCreate) stays with user
 * space: its lifetime follows mappings by address range, which a hash map cannot look up.
 *
 * A free marks its element freed (LIVE_FREED_KEPT) rather than deleting it, while fewer than
 * live_freed_kept_max are so kept: a caching allocator hands the same addresses out again and
 * again, and the next allocation at the address then writes the element in place, a look-up,
 * where an insert allocated an element and a delete gave it back (0.2 and 0.07 us a tensor).
 * Only the program of a free or an allocation at the address, which the allocator orders, and
 * user space for a process gone, take elements out: never one that an allocation may be
 * writing. */
#ifndef GPUFLAME_LIVE_ALLOCATIONS_H
#define GPUFLAME_LIVE_ALLOCATIONS_H

#include "counters.h"
#include "cuda_classes.h"
#include "events.h"
#include "maps.h"
#include "records.h"

/* User space sets the bound before the programs load (--max-live-allocations). */
#define LIVE_ALLOCATIONS_MAX (1 << 20)

/* Elements are allocated as they come (BPF_F_NO_PREALLOC): what the bound costs up front is its
 * buckets, 16 bytes each (16 MiB at the default), and user space makes the map one entry big
 * where no memory profile is asked for. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LIVE_ALLOCATIONS_MAX);
	__type(key, struct live_key);
	__type(value, struct live_allocation);
} live_allocations SEC(".maps");

/* Stack ids whose whole record went into the ring (user space has them, or will), one slot per
 * id's low bits: an array's look-up is a few instructions where an LRU hash's took locks, on
 * every tensor. An id overwritten by another of its slot is sent again, which costs a record,
 * never a stack; two CPUs marking one slot at once lose one mark the same way. */
#define STACKS_SENT_SLOTS (1 << 16)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STACKS_SENT_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} stacks_sent SEC(".maps");

/* pid -> the time of its out-of-memory, while user space reads what held the memory then: the
 * process's frees mark their allocations (freed_ns) instead of deleting them, so the read sees
 * the set as it was at the failure however late it comes. User space ends the hold. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} oom_holds SEC(".maps");

/* Holds in place: one load spares every free the lookup while there are none. User space
 * clears it with the last hold. */
volatile __u32 oom_holds_pending = 0;

/* Elements freed and kept now (a free adds one, the allocation that takes it back or user space
 * taking it out subtracts); past the bound, a free deletes. Its room is in the map's size. */
volatile __s64 live_freed_kept = 0;
const volatile __u32 live_freed_kept_max = 0;

/* 1: every allocation and free goes into the ring (a memory timeline is drawn). 0 (the agent):
 * only allocations with a stack do, for the allocation profiles; a free is a delete and a
 * count, and a tensor byte sampling passed over a count and an insert. */
const volatile __u8 memory_timeline = 1;

/* 1: a tensor's allocation with a stack goes into the ring too where no timeline is drawn, for
 * the tensor-alloc profile. 0 (in-use only): it is an insert and a count. */
const volatile __u8 tensor_allocation_records = 1;

/* The allocation being inserted, with its key: the uprobe programs' frames have no room for them
 * (on_torch_malloc and the unwinder's calls under it take all of the 512 bytes older verifiers
 * allow together). */
struct live_entry {
	struct live_key key;
	struct live_allocation value;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct live_entry);
} live_scratch SEC(".maps");

/* The id of the record's stack: its process, how the walk ended, and its frames (Python frames
 * included, as the walk spliced them). Never 0. A call of its own: its locals would otherwise
 * sit in the hooks' frames under the unwinder's calls, past the 512 bytes 6.1 allows them. */
static __noinline __u64 stack_id_of(struct event_record *e)
{
	__u32 frames = record_user_frames(e);
	__u64 h = 0xcbf29ce484222325ULL;

	h = (h ^ (((__u64)e->header.pid << 32) | e->stack.unwind_status)) * 0x100000001b3ULL;
	h = (h ^ (((__u64)e->stack.flags << 32) | e->stack.forked_from)) * 0x100000001b3ULL;
	/* Four frames a turn, in two lanes, while four are left: a Python stack is a few hundred
	 * words, and a turn's bounds checks cost more than its arithmetic. */
	__u64 g = 0x84222325cbf29ce4ULL;
	__u32 i = 0;
#pragma clang loop unroll(disable)
	for (__u32 t = 0; t < MAX_USER_FRAMES / 4; t++) {
		if (i + 4 > frames)
			break;
		h = (h ^ e->user_stack[i & (MAX_USER_FRAMES - 1)]) * 0x100000001b3ULL;
		g = (g ^ e->user_stack[(i + 1) & (MAX_USER_FRAMES - 1)]) * 0x100000001b3ULL;
		h = (h ^ e->user_stack[(i + 2) & (MAX_USER_FRAMES - 1)]) * 0x100000001b3ULL;
		g = (g ^ e->user_stack[(i + 3) & (MAX_USER_FRAMES - 1)]) * 0x100000001b3ULL;
		i += 4;
	}
#pragma clang loop unroll(disable)
	for (__u32 t = 0; t < 3; t++) {
		if (i >= frames)
			break;
		h = (h ^ e->user_stack[i & (MAX_USER_FRAMES - 1)]) * 0x100000001b3ULL;
		i++;
	}
	return (h ^ (g * 0x9e3779b97f4a7c15ULL)) | 1;
}

/* One compact record of the memory timeline: an allocation, or a free with what it freed (`api`:
 * the free's, said where the allocation is not known). */
static __always_inline void send_memory_event(__u32 pid, __u32 tid, __u64 addr, struct live_allocation *a, __u32 api, __u8 flags, __u64 now)
{
	struct memory_event *m = bpf_ringbuf_reserve(&samples, sizeof(*m), 0);

	if (!m) {
		count(COUNTER_MEMORY_EVENTS_LOST);
		return;
	}
	m->kind = EVENT_MEMORY;
	m->pid = pid;
	m->timestamp_ns = now;
	m->addr = addr;
	m->size = a ? a->size : 0;
	m->stack = a ? a->stack : 0;
	m->tid = tid;
	m->api = a ? a->api : api;
	m->device = a ? a->device : 0;
	m->flags = flags | (a ? a->flags : 0);
	bpf_ringbuf_submit(m, wake_when_filling());
}

/* The element at the address of allocation `a` becomes `a`'s: it was freed and kept, or is live
 * because its free was not seen (true, counted). A call of its own: the copy's registers in
 * on_cuda_return's frame took the 512 bytes 6.1 allows with the unwinder's calls past it. */
static __noinline bool live_take(struct live_allocation *kept, struct live_allocation *a)
{
	bool replaced = !kept->freed_ns;

	if (replaced)
		count(COUNTER_LIVE_REPLACED);
	else
		__sync_fetch_and_add(&live_freed_kept, -1);
	kept->size = a->size;
	kept->stack = a->stack;
	kept->t_ns = a->t_ns;
	kept->stream = a->stream;
	kept->tid = a->tid;
	kept->api = a->api;
	kept->device = a->device;
	kept->flags = a->flags;
	/* Live last: a read of the map sees the old allocation freed or the new one whole. */
	asm volatile("" ::: "memory");
	kept->freed_ns = 0;
	return replaced;
}

/* An allocation of `size` bytes at `addr`, live from `now` (the time of its record, where it has
 * one): into the map, and on the timeline. */
static __always_inline void live_allocated(__u32 pid, __u32 tid, __u64 addr, __u64 size, __u64 stack, __u32 api, __u32 device, __u8 flags, __u64 stream, __u64 now)
{
	struct live_entry *s = bpf_map_lookup_elem(&live_scratch, (__u32 *)&zero_key);
	struct live_allocation *a, *kept;
	__u8 event = MEMORY_ALLOCATED;

	if (!s)
		return;
	s->key.pid = pid;
	s->key.tensor = api == C10_MALLOC;
	s->key.addr = addr;
	a = &s->value;
	a->size = size;
	a->stack = stack;
	a->t_ns = now;
	a->stream = stream;
	a->freed_ns = 0;
	a->tid = tid;
	a->api = api;
	a->device = device;
	a->flags = flags;
	if (api == C10_MALLOC) {
		count(COUNTER_TENSORS_ALLOCATED);
		if (flags & LIVE_SAMPLED_OUT)
			count(COUNTER_TENSORS_SAMPLED_OUT);
	}
	kept = bpf_map_lookup_elem(&live_allocations, &s->key);
	if (kept) {
		if (live_take(kept, a))
			event |= MEMORY_REPLACED;
	} else if (bpf_map_update_elem(&live_allocations, &s->key, a, BPF_NOEXIST)) {
		/* The set is full (or the address was taken since the look-up, which the allocator's
		 * order rules out): the element there, if any, becomes this allocation's. */
		if (bpf_map_update_elem(&live_allocations, &s->key, a, BPF_EXIST)) {
			count(COUNTER_LIVE_FULL);
			event |= MEMORY_UNTRACKED;
		} else {
			count(COUNTER_LIVE_REPLACED);
			event |= MEMORY_REPLACED;
		}
	}
	if (memory_timeline || event != MEMORY_ALLOCATED ||
	    (!(flags & LIVE_SAMPLED_OUT) && (api != C10_MALLOC || tensor_allocation_records)))
		send_memory_event(pid, tid, addr, a, api, event, a->t_ns);
}

/* A freed allocation's element: kept, marked at `freed_ns`, while there is room for it (always
 * during an out-of-memory's hold, whose read needs it), else deleted. */
static __always_inline void live_mark_freed(struct live_key *key, struct live_allocation *a, __u64 freed_ns, bool held)
{
	if (held || live_freed_kept < live_freed_kept_max) {
		__sync_fetch_and_add(&live_freed_kept, 1);
		a->freed_ns = freed_ns;
	} else {
		bpf_map_delete_elem(&live_allocations, key);
	}
}

/* The allocation at `addr` freed by `api` (a tensor's free, or a segment's): marked freed in the
 * map (or out of it), and on the timeline with what it was. A call of its own, as live_take. */
static __noinline void live_freed(__u32 pid, __u32 tid, __u64 addr, __u32 api)
{
	struct live_key key = { .pid = pid, .tensor = cuda_class_of(api) == CUDA_CLASS_TENSOR_FREE, .addr = addr };
	struct live_allocation *a = bpf_map_lookup_elem(&live_allocations, &key);
	bool known = a && !a->freed_ns;
	__u64 *hold, now;

	if (key.tensor)
		count(known ? COUNTER_TENSORS_FREED : COUNTER_TENSORS_UNKNOWN_FREES);
	/* No timeline and no hold: what was freed is not needed. */
	if (!memory_timeline && !oom_holds_pending) {
		if (known)
			live_mark_freed(&key, a, LIVE_FREED_KEPT, false);
		return;
	}
	now = bpf_ktime_get_boot_ns();
	if (!known) {
		send_memory_event(pid, tid, addr, NULL, api, MEMORY_FREED | MEMORY_UNKNOWN, now);
		return;
	}
	/* What it was goes out before the element may go back to the allocator. */
	send_memory_event(pid, tid, addr, a, api, MEMORY_FREED, now);
	hold = oom_holds_pending ? bpf_map_lookup_elem(&oom_holds, &pid) : NULL;
	live_mark_freed(&key, a, hold ? now : LIVE_FREED_KEPT, hold != NULL);
}

/* The process failed an allocation for lack of memory now: its frees are held until user space
 * has read what held the memory. */
static __always_inline void live_hold_for_oom(__u32 pid)
{
	__u64 now = bpf_ktime_get_boot_ns();

	bpf_map_update_elem(&oom_holds, &pid, &now, BPF_ANY);
	oom_holds_pending = 1;
}

/* A successful allocation whose record `e` has its caller's stack unwound: live, and its stack
 * sent if it is new (`always`: the whole record goes anyway, for the CUDA API profile). A
 * tensor's record carries its stream in `handle`. The hooks' time (`t0`, `enter_ns`: as in
 * send_call_with_stack) is read only for a record that goes. */
static __always_inline void send_allocation(struct event_record *e, bool always, enum record_wake wake, __u64 t0, __u64 enter_ns)
{
	struct cuda_call_payload *c = &e->payload.cuda_call;
	__u64 id = stack_id_of(e);
	__u32 slot = (__u32)id & (STACKS_SENT_SLOTS - 1);
	__u64 *mark = bpf_map_lookup_elem(&stacks_sent, &slot);
	bool sent = mark && *mark == id;
	__u8 flags = c->flags & CUDA_CALL_IN_ALLOCATOR ? LIVE_IN_ALLOCATOR : 0;

	c->stack_id = id;
	if (always || !sent) {
		c->hook_ns = bpf_ktime_get_ns() - t0 + enter_ns;
		if (send_record(e, record_bytes_with_frames(e), wake, COUNTER_CUDA_LOST)) {
			if (mark)
				*mark = id;
		} else if (!sent) {
			count(COUNTER_MEMORY_STACKS_LOST);
			flags |= LIVE_STACK_LOST;
			id = 0;
		}
	}
	live_allocated(e->header.pid, e->header.tid, c->addr, c->size, id, c->api, c->device, flags, c->api == C10_MALLOC ? c->handle : 0, e->header.timestamp_ns);
}

#endif
