/* Lookups in the unwind maps: the mapping of an address, and the unwind rule of a file address. */
#ifndef GPUFLAME_UNWIND_TABLES_H
#define GPUFLAME_UNWIND_TABLES_H

#include "maps.h"

/* The binary searches are global functions: the verifier checks each once, on its own, instead of
 * once per path of its caller, which would multiply their branches. */

/* Index of the mapping of `proc` (an entry of processes) that contains ip, or -1. */
__noinline int mapping_index_in(struct process_info *proc, __u64 ip)
{
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

/* Index of the mapping of process `pid` that contains ip, or -1. */
static __always_inline int find_mapping_index(__u32 pid, __u64 ip)
{
	return mapping_index_in(bpf_map_lookup_elem(&processes, &pid), ip);
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

/* Marks a table used by a walk, for eviction: once a second at most, as a store to a shared
 * cache line on every frame would cost more. */
static __always_inline void mark_used(struct table_info *t, __u64 now)
{
	if (now - t->last_used > 1000000000ULL)
		t->last_used = now;
}

/* The same, for a rule found without a search (frame_cache.h). */
static __always_inline void mark_table_used(__u32 table_id, __u64 now)
{
	struct table_info *t = bpf_map_lookup_elem(&unwind_tables, &table_id);

	if (t)
		mark_used(t, now);
}

/* The index among unwind_rules of the rule for `elf_pc` in table `table_id`, or -1. Global, so
 * that its lookups' keys and state take no room in the unwinder's frame, the deepest chain's. */
__noinline int find_rule_index(__u32 table_id, __u64 elf_pc, __u64 now)
{
	struct table_info *t = bpf_map_lookup_elem(&unwind_tables, &table_id);
	int block;

	if (!t || t->block_count == 0 || elf_pc < t->base || elf_pc - t->base > 0xfffffffeULL)
		return -1;
	mark_used(t, now);
	block = find_block(table_id, elf_pc - t->base);
	if (block < 0)
		return -1;
	return find_row_rule(block, elf_pc - t->base);
}

/* The rule for a file address, or NULL when no row covers it. Marks the table used. */
static __always_inline struct unwind_rule *find_rule(__u32 table_id, __u64 elf_pc, __u64 now)
{
	int rule = find_rule_index(table_id, elf_pc, now);
	__u32 key;

	if (rule < 0)
		return NULL;
	key = rule;
	return bpf_map_lookup_elem(&unwind_rules, &key);
}

#endif
