/* Code that no mapping user space has read covers: a program in its first milliseconds after
 * exec, a library just mapped, a process gone before its maps could be read. The sampler looks
 * up the VMA under such an address and, when user space has published a table for its file
 * (file_tables), walks on with it. A sample may look up one VMA only (a second bpf_find_vma()
 * finds the irq_work that releases the first one's mmap lock still pending: -EBUSY), so the VMAs
 * found are kept per process until user space describes the process (set_process deletes
 * them): a stack that crosses from the program into libc is whole from its second sample on. */
#ifndef GPUFLAME_FILE_VMAS_H
#define GPUFLAME_FILE_VMAS_H

#include "maps.h"
#include "unwind_state.h"

#define FILE_VMAS 8

struct file_vma {
	__u64 begin;
	__u64 end;
	__u64 load_bias;
	__u64 file_offset; /* of begin */
	struct file_table_key file;
	__u32 table_id;
	__u32 _pad;
};

struct file_vmas {
	__u32 next; /* the entry the next VMA found takes */
	__u32 _pad;
	struct file_vma vmas[FILE_VMAS];
};

/* tgid -> the VMAs with published tables its samples found. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct file_vmas);
} file_vmas_of SEC(".maps");

/* This CPU's sample: whether its one lookup was spent, and what it found. */
struct vma_lookup {
	struct file_vma found;
	__u32 spent;
	__u32 has_table;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vma_lookup);
} vma_lookups SEC(".maps");

/* Never written: what a process's first entry in file_vmas_of starts from (too big for the
 * stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct file_vmas);
} no_file_vmas SEC(".maps");

/* A new sample may look up a VMA. */
static __always_inline void new_vma_lookup(void)
{
	__u32 zero = 0;
	struct vma_lookup *l = bpf_map_lookup_elem(&vma_lookups, &zero);

	if (l)
		l->spent = 0;
}

/* Fills vma_lookups with `vma`'s file and, when its table is published, its load bias. No
 * context and little stack: every byte here adds to the deepest call chain's. */
static long vma_found(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	__u32 zero = 0;
	struct vma_lookup *l = bpf_map_lookup_elem(&vma_lookups, &zero);
	struct file *file = BPF_CORE_READ(vma, vm_file);
	struct file_table *t;

	if (!file || !l)
		return 0;
	l->found.file.ino = BPF_CORE_READ(file, f_inode, i_ino);
	l->found.file.size = BPF_CORE_READ(file, f_inode, i_size);
	l->found.file.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
	l->found.file._pad = 0;
	l->found.begin = BPF_CORE_READ(vma, vm_start);
	l->found.end = BPF_CORE_READ(vma, vm_end);
	l->found.file_offset = BPF_CORE_READ(vma, vm_pgoff) << 12;
	t = bpf_map_lookup_elem(&file_tables, &l->found.file);
	if (!t)
		return 0;
	for (int i = 0; i < FILE_TABLE_SEGMENTS; i++) {
		if (i >= t->segment_count)
			break;
		if (t->segments[i].file_offset == l->found.file_offset) {
			l->found.load_bias = l->found.begin - l->found.file_offset - t->segments[i].delta;
			l->found.table_id = t->table_id;
			l->has_table = 1;
			break;
		}
	}
	return 0;
}

/* The file under the leaf, for naming it when the process is gone before its maps are read. */
static __always_inline void note_leaf_vma(struct native_unwind_state *st, struct file_vma *v)
{
	__u32 slot = SCRATCH_SAMPLER;
	struct event_record *e = bpf_map_lookup_elem(&sample_scratch, &slot);

	if (!e || st->frames != 1 || !v->file.ino)
		return;
	e->stack.leaf_ino = v->file.ino;
	e->stack.leaf_size = v->file.size;
	e->stack.leaf_dev = v->file.dev;
	e->stack.leaf_offset = st->ip - v->begin + v->file_offset;
	e->stack.leaf_vma_begin = v->begin;
	e->stack.leaf_vma_end = v->end;
}

/* The entry of file_vmas_of[st->pid] that holds st->ip, found there or looked up now (once per
 * sample, in the sampler only: the lookup takes the mmap lock, which the scheduler's and the
 * uprobes' contexts must not); -1 when there is none with a table. The leaf's file goes into the
 * event either way. Global: checked once, its frame out of the unwinder's. */
__noinline int file_vma_index(struct native_unwind_state *st)
{
	__u32 zero = 0, pid;
	struct file_vmas *c;
	struct vma_lookup *l;
	int idx;

	if (!st || st->slot != SCRATCH_SAMPLER)
		return -1;
	/* Keys from the stack: before Linux 6.3 a map's key may not point into a global function's
	 * argument (PTR_TO_MEM). */
	pid = st->pid;
	c = bpf_map_lookup_elem(&file_vmas_of, &pid);
	if (c) {
		for (int i = 0; i < FILE_VMAS; i++) {
			if (c->vmas[i].begin <= st->ip && st->ip < c->vmas[i].end) {
				note_leaf_vma(st, &c->vmas[i]);
				return i;
			}
		}
	}
	l = bpf_map_lookup_elem(&vma_lookups, &zero);
	if (!l || l->spent)
		return -1;
	l->spent = 1;
	l->has_table = 0;
	l->found.file.ino = 0;
	bpf_find_vma(bpf_get_current_task_btf(), st->ip, vma_found, NULL, 0);
	note_leaf_vma(st, &l->found);
	if (!l->has_table)
		return -1;
	if (!c) {
		struct file_vmas *empty = bpf_map_lookup_elem(&no_file_vmas, &zero);

		if (!empty)
			return -1;
		bpf_map_update_elem(&file_vmas_of, &pid, empty, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&file_vmas_of, &pid);
		if (!c)
			return -1;
	}
	idx = c->next & (FILE_VMAS - 1);
	c->next = idx + 1;
	c->vmas[idx] = l->found;
	count(COUNTER_UNWIND_BY_FILE);
	return idx;
}

#endif
