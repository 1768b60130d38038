/* The rule found for a frame's address, kept for the next walk that passes it: the same call
 * sites come back in every stack of a loop (an allocation's, a hot function's callers), and
 * finding a rule is a search of the process's mappings and then of its table's blocks and rows
 * (~90 ns a frame by the kernel's count). An entry is used only while the mapping it was found
 * in is still the process's, with the same table and load bias: user space replacing a mapping,
 * or a table going or coming, changes one of them, and the search runs again. That check needs
 * the process's entry, a hash map's lookup (~26 ns a frame): an entry checked while the unwinder's
 * maps stayed as they are (the epoch of maps.h) is used without it. An entry also says whether
 * the address is in the evaluation loop of the process's Python: every native frame of a Python
 * process asks, and the interpreter's entry is a hash map's lookup too (~26 ns a frame; 0.7 µs on
 * a 26-frame stack under a Python call). Per CPU and two ways a set: no lock, and a third address
 * of a set costs a search. */
#ifndef GPUFLAME_FRAME_CACHE_H
#define GPUFLAME_FRAME_CACHE_H

#include "events.h"
#include "maps.h"
#include "python_walk.h"
#include "unwind_state.h"

#define FRAME_CACHE_ENTRIES 1024 /* a power of two */
#define FRAME_PY_EVAL_UNKNOWN 0xff

struct frame_cache_entry {
	__u64 ip;
	__u64 begin;     /* the mapping's */
	__u64 load_bias; /* the mapping's */
	__u64 epoch;     /* unwind_epoch when the mapping was last found as it was */
	__u32 pid;
	__u32 table_id;
	__u16 mapping;   /* its index in process_info.mappings */
	__u8 adjust;     /* 1: ip was a return address, its rule the call's */
	__u8 py_eval;    /* ip is in the evaluation loop of the process's Python (py_eval_at), or
	                  * FRAME_PY_EVAL_UNKNOWN */
	__u8 newer;      /* way 0 of a set: 1 when way 1 was put in last */
	__u8 _pad[3];
	struct unwind_rule rule;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FRAME_CACHE_ENTRIES);
	__type(key, __u32);
	__type(value, struct frame_cache_entry);
} frame_cache SEC(".maps");

/* Two ways a set: with one, two of the thirty-odd frames of a deep stack share an entry in about
 * a third of runs (the birthday odds of 30 addresses in 1,024 entries; ASLR moves them from run
 * to run), and both were searched for in every walk: the Python tensor loop's on_torch_malloc
 * took 2.9 µs in one run and 4.6 µs in the next. A set is an even key and the odd one after it. */
static __always_inline __u32 frame_cache_set(__u32 pid, __u64 ip)
{
	return (__u32)((ip ^ (ip >> 17) ^ ((__u64)pid * 0x9e3779b1ULL)) & (FRAME_CACHE_ENTRIES - 2));
}

/* The entry for `ip` of `pid`, or the set's second, which the caller checks. */
static __always_inline struct frame_cache_entry *frame_cache_slot(__u32 pid, __u64 ip)
{
	__u32 key = frame_cache_set(pid, ip);
	struct frame_cache_entry *c = bpf_map_lookup_elem(&frame_cache, &key);

	if (c && c->ip == ip && c->pid == pid)
		return c;
	key |= 1;
	return bpf_map_lookup_elem(&frame_cache, &key);
}

/* The entry to put `ip` of `pid` in: the set's entry for it, else the one of the two put in
 * less recently (way 0's `newer` says which was last). */
static __always_inline struct frame_cache_entry *frame_cache_victim(__u32 pid, __u64 ip)
{
	__u32 key = frame_cache_set(pid, ip);
	struct frame_cache_entry *c0 = bpf_map_lookup_elem(&frame_cache, &key), *c1;

	key |= 1;
	c1 = bpf_map_lookup_elem(&frame_cache, &key);
	if (!c0 || !c1)
		return NULL;
	if (c1->ip == ip && c1->pid == pid) {
		c0->newer = 1;
		return c1;
	}
	if ((c0->ip == ip && c0->pid == pid) || c0->newer) {
		c0->newer = 0;
		return c0;
	}
	c0->newer = 1;
	return c1;
}

/* Whether the entry kept for `ip` of `pid` is for the mapping the process has now, as the walk
 * that read `epoch` sees it; if so it carries that epoch from now on. Global: the process's
 * entry and mapping take no room in the unwinder's frame, in the deepest call chain. */
__noinline bool frame_cache_recheck(__u32 pid, __u64 ip, __u64 epoch)
{
	struct frame_cache_entry *c = frame_cache_slot(pid, ip);
	struct process_info *proc = bpf_map_lookup_elem(&processes, &pid);
	struct exec_mapping *m;

	if (!c || c->ip != ip || c->pid != pid || !proc)
		return false;
	m = &proc->mappings[c->mapping & (MAX_PROCESS_MAPPINGS - 1)];
	if (m->begin != c->begin || m->load_bias != c->load_bias || m->table_id != c->table_id ||
	    (m->flags & (MAPPING_HAS_TABLE | MAPPING_TABLE_PENDING)) != MAPPING_HAS_TABLE || ip >= m->end)
		return false;
	/* The epoch moves on when user space writes the Python entry too. */
	c->py_eval = py_eval_at(pid, ip);
	c->epoch = epoch;
	return true;
}

/* Learns whether the entry kept for `ip` of `pid` is in its Python's evaluation loop; returns it.
 * Global, as frame_cache_recheck. */
__noinline bool frame_cache_learn_eval(__u32 pid, __u64 ip)
{
	struct frame_cache_entry *c = frame_cache_slot(pid, ip);
	bool eval = py_eval_at(pid, ip);

	if (c && c->ip == ip && c->pid == pid)
		c->py_eval = eval;
	return eval;
}

/* Whether `ip` of process `pid` may be in its Python's evaluation loop: false only where an entry
 * checked in this walk's epoch says it is not, which spares the walk the interpreter's entry. A
 * lookup of its own, ahead of frame_cache_get's: one lookup for both kept the rule live across
 * py_begin, and the unwinder's frame went past the verifier's stack budget. */
static __always_inline bool frame_cache_maybe_eval(__u32 pid, __u64 ip, __u8 adjust, __u64 epoch)
{
	struct frame_cache_entry *c = frame_cache_slot(pid, ip);

	if (!c || c->ip != ip || c->pid != pid || c->adjust != adjust || c->epoch != epoch)
		return true;
	if (c->py_eval == FRAME_PY_EVAL_UNKNOWN)
		return frame_cache_learn_eval(pid, ip);
	return c->py_eval;
}

/* The rule kept for `ip` of process `pid`, copied into `out`, if its mapping is still as it was
 * found; the table it came from in `*table_id`. `epoch`: unwind_epoch as the walk read it before
 * it looked any process up; an entry checked in another is checked again. */
static __always_inline bool frame_cache_get(__u32 pid, __u64 ip, __u8 adjust, __u64 epoch, struct unwind_rule *out, __u32 *table_id)
{
	struct frame_cache_entry *c = frame_cache_slot(pid, ip);

	if (!c || c->ip != ip || c->pid != pid || c->adjust != adjust)
		return false;
	if (c->epoch != epoch && !frame_cache_recheck(pid, ip, epoch))
		return false;
	*out = c->rule;
	*table_id = c->table_id;
	/* A program that took the CPU from this one midway may have rewritten the entry: the
	 * writer clears ip first and sets it last. */
	barrier();
	return c->ip == ip && c->pid == pid;
}

/* Keeps `rule`, found for the walk's current frame in mapping `m` (index `idx`). Global: the
 * choice of an entry takes no room in the unwinder's frame. Returns whether it was kept. */
__noinline int frame_cache_put(struct native_unwind_state *st, struct exec_mapping *m, int idx, struct unwind_rule *rule)
{
	struct frame_cache_entry *c;

	if (!st || !m || !rule)
		return 0;
	c = frame_cache_victim(st->pid, st->ip);
	if (!c)
		return 0;
	c->ip = 0;
	barrier();
	c->pid = st->pid;
	c->adjust = st->adjust;
	c->mapping = (__u16)idx;
	c->begin = m->begin;
	c->load_bias = m->load_bias;
	c->table_id = m->table_id;
	c->epoch = st->epoch;
	c->py_eval = FRAME_PY_EVAL_UNKNOWN;
	c->rule = *rule;
	barrier();
	c->ip = st->ip;
	return 1;
}

#endif
