/* The rule found for a frame's address, kept for the next walk that passes it: the same call
 * sites come back in every stack of a loop (an allocation's, a hot function's callers), and
 * finding a rule is a search of the process's mappings and then of its table's blocks and rows
 * (~90 ns a frame by the kernel's count). An entry is used only while the mapping it was found
 * in is still the process's, with the same table and load bias: user space replacing a mapping,
 * or a table going or coming, changes one of them, and the search runs again. That check needs
 * the process's entry, a hash map's lookup (~26 ns a frame): an entry checked while the unwinder's
 * maps stayed as they are (the epoch of maps.h) is used without it. Per CPU and direct-mapped: no
 * lock, and a collision costs a search. */
#ifndef GPUFLAME_FRAME_CACHE_H
#define GPUFLAME_FRAME_CACHE_H

#include "events.h"
#include "maps.h"

#define FRAME_CACHE_ENTRIES 1024 /* a power of two */

struct frame_cache_entry {
	__u64 ip;
	__u64 begin;     /* the mapping's */
	__u64 load_bias; /* the mapping's */
	__u64 epoch;     /* unwind_epoch when the mapping was last found as it was */
	__u32 pid;
	__u32 table_id;
	__u16 mapping;   /* its index in process_info.mappings */
	__u8 adjust;     /* 1: ip was a return address, its rule the call's */
	__u8 _pad[5];
	struct unwind_rule rule;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FRAME_CACHE_ENTRIES);
	__type(key, __u32);
	__type(value, struct frame_cache_entry);
} frame_cache SEC(".maps");

static __always_inline struct frame_cache_entry *frame_cache_slot(__u32 pid, __u64 ip)
{
	__u32 key = (__u32)((ip ^ (ip >> 17) ^ ((__u64)pid * 0x9e3779b1ULL)) & (FRAME_CACHE_ENTRIES - 1));

	return bpf_map_lookup_elem(&frame_cache, &key);
}

/* Whether the entry kept for `ip` of `pid` is for the mapping the process has now, as the walk
 * that read `epoch` sees it; if so it carries that epoch from now on. Global: the process's
 * entry and mapping take no room in the unwinder's frame, in the deepest call chain. */
__noinline bool frame_cache_recheck(__u32 pid, __u64 ip, __u64 epoch)
{
	struct frame_cache_entry *c = frame_cache_slot(pid, ip);
	struct process_info *proc = bpf_map_lookup_elem(&processes, &pid);
	struct exec_mapping *m;

	if (!c || !proc)
		return false;
	m = &proc->mappings[c->mapping & (MAX_PROCESS_MAPPINGS - 1)];
	if (m->begin != c->begin || m->load_bias != c->load_bias || m->table_id != c->table_id ||
	    (m->flags & (MAPPING_HAS_TABLE | MAPPING_TABLE_PENDING)) != MAPPING_HAS_TABLE || ip >= m->end)
		return false;
	c->epoch = epoch;
	return true;
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

static __always_inline void frame_cache_put(struct exec_mapping *m, __u32 pid, __u64 ip, __u8 adjust, __u64 epoch, int idx, struct unwind_rule *rule)
{
	struct frame_cache_entry *c = frame_cache_slot(pid, ip);

	if (!c)
		return;
	c->ip = 0;
	barrier();
	c->pid = pid;
	c->adjust = adjust;
	c->mapping = (__u16)idx;
	c->begin = m->begin;
	c->load_bias = m->load_bias;
	c->table_id = m->table_id;
	c->epoch = epoch;
	c->rule = *rule;
	barrier();
	c->ip = ip;
}

#endif
