/* Layouts of the live set of device memory (live_allocations.h) and of the memory timeline's
 * compact records, shared with user space, which reads them by the Rust structs libbpf-cargo
 * generates from this object's BTF. */
#ifndef GPUFLAME_MEMORY_EVENTS_H
#define GPUFLAME_MEMORY_EVENTS_H

struct live_key {
	__u32 pid;
	__u32 tensor; /* 1: a tensor; 0: a segment, whose first tensor has the same address */
	__u64 addr;   /* the device pointer a tensor or segment starts at */
};

/* A tensor (PyTorch's caching allocator) or a segment (cudaMalloc and the like) live now. */
struct live_allocation {
	__u64 size;
	__u64 stack;    /* the id of its stack (stack_id_of); 0: none (live_flags say why) */
	__u64 t_ns;     /* when it was allocated (CLOCK_BOOTTIME) */
	__u64 stream;   /* the CUDA stream it was allocated for, where the allocator says; else 0 */
	__u64 freed_ns; /* 0: live. Freed and kept: at this time while an out-of-memory's holders
			 * are read, or LIVE_FREED_KEPT for the next allocation at its address */
	__u32 tid;
	__u16 api;      /* enum cuda_api of its allocation */
	__u8 device;
	__u8 flags;     /* enum live_flags */
};

/* freed_ns of an allocation freed and kept for the next one at its address: before any time. */
#define LIVE_FREED_KEPT 1

enum live_flags {
	LIVE_SAMPLED_OUT = 1,  /* a tensor whose stack byte sampling passed over */
	LIVE_STACK_LOST = 2,   /* its stack was new and the full ring turned its record away */
	LIVE_IN_ALLOCATOR = 4, /* a segment PyTorch's allocator asked for: reserved memory */
};

/* EVENT_MEMORY: one allocation or free of the live set, 48 bytes, for the memory timeline and
 * the allocation profiles. Its kind, pid, tid and time are where event_header has them: every
 * record's kind is its first word, and its time where the ring's lag is read. */
struct memory_event {
	__u32 kind; /* EVENT_MEMORY */
	__u32 pid;
	__u32 tid;
	__u16 api;   /* the allocation's enum cuda_api */
	__u8 device;
	__u8 flags;  /* enum live_flags | enum memory_event_flags */
	__u64 timestamp_ns; /* CLOCK_BOOTTIME */
	__u64 addr;
	__u64 size;  /* of the allocation, or of the one freed (0: not known) */
	__u64 stack; /* the allocation's stack id, as in live_allocation */
};

enum memory_event_flags {
	MEMORY_ALLOCATED = 0,
	MEMORY_FREED = 16,     /* a free: what it freed */
	MEMORY_UNKNOWN = 32,   /* a free of nothing in the live set: allocated before the attach */
	MEMORY_REPLACED = 64,  /* an allocation where one was live: its free was not seen */
	MEMORY_UNTRACKED = 128,/* the live set was full: this allocation is not in it */
};

#endif
