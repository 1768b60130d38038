/* Maps shared by the programs of the CPU sampler object. */
#ifndef GPUFLAME_MAPS_H
#define GPUFLAME_MAPS_H

#include "events.h"
#include "counters.h"

#define MAX_TARGETS 65536
#define MAX_PROCESSES 16384
#define MAX_TABLES 16384
#define MAX_RULES 65536

/* The most the samples ring holds; user space sizes it to what the session's events need
 * (SamplerConfig::samples_ring_bytes) before the programs load. */
#define SAMPLES_RINGBUF_BYTES (16 * 1024 * 1024)
/* Wake the reader once a quarter of the buffer is in use: set with the ring's size. */
/* Key 0 for per-CPU arrays, from read-only data: a key on the stack takes a slot of the frame,
 * which counts against the 512 bytes a chain of calls may take. */
const volatile __u32 zero_key = 0;
/* The same for the CUDA hooks' record (SCRATCH_CUDA, events.h). */
const volatile __u32 scratch_cuda_key = SCRATCH_CUDA;

const volatile __u64 samples_wakeup_bytes = SAMPLES_RINGBUF_BYTES / 4;
#define SAMPLES_WAKEUP_BYTES samples_wakeup_bytes

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SAMPLES_RINGBUF_BYTES);
} samples SEC(".maps");

/* A record's wake-up flag: waking the reader costs more than most records (an IPI, ~12 us in a
 * VM), and user space drains the buffer every 100 ms anyway: it is woken only once the buffer
 * fills past SAMPLES_WAKEUP_BYTES. */
static __always_inline __u64 wake_when_filling(void)
{
	return bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) > SAMPLES_WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} process_events SEC(".maps");

/* Out-of-memory failures' records (event_record, as in `samples`): a ring of their own, so that
 * the burst that fills `samples` while user space is behind cannot cost the report. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} oom_records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* tgid -> 1 for the processes being profiled in TARGET_PIDS mode. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TARGETS);
	__type(key, __u32);
	__type(value, __u8);
} targets SEC(".maps");

/* The records being built (SCRATCH_SAMPLER, SCRATCH_CUDA, SCRATCH_OFFCPU): too big for the BPF
 * stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SCRATCH_SLOTS);
	__type(key, __u32);
	__type(value, struct event_record);
} sample_scratch SEC(".maps");

/* tgid -> its executable mappings. Allocated on use: most processes never appear. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct process_info);
} processes SEC(".maps");

/* Moves on with every change to what a rule found through `processes` depends on: a process's
 * entry written or removed (by user space, or here at fork, exec and exit), its Python's entry
 * written, and a table removed. A rule kept for an address (frame_cache.h) with the epoch it was
 * checked in is used without looking its process (or its Python) up again while the epoch stays. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} unwind_epoch SEC(".maps");

static __always_inline __u64 unwind_epoch_now(void)
{
	__u32 zero = 0;
	__u64 *epoch = bpf_map_lookup_elem(&unwind_epoch, &zero);

	return epoch ? *(volatile __u64 *)epoch : 0;
}

static __always_inline void unwind_epoch_bump(void)
{
	__u32 zero = 0;
	__u64 *epoch = bpf_map_lookup_elem(&unwind_epoch, &zero);

	if (epoch)
		__sync_fetch_and_add(epoch, 1);
}

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_TABLES);
	__type(key, __u32);
	__type(value, struct table_info);
} unwind_tables SEC(".maps");

/* Loaded tables by their file's identity (see struct file_table). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TABLES);
	__type(key, struct file_table_key);
	__type(value, struct file_table);
} file_tables SEC(".maps");

/* All tables' rows, in shards that user space creates and fills as tables arrive, up to the
 * memory budget: kernel memory grows with what is loaded, not with a fixed capacity. */
struct unwind_shard {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, BLOCKS_PER_SHARD);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct unwind_block));
};

/* Each table's pages, in order: entry table_info.first_page + i is the i-th page's number. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PAGE_INDEX_ENTRIES);
	__type(key, __u32);
	__type(value, __u32);
} page_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_SHARDS);
	__type(key, __u32);
	__array(values, struct unwind_shard);
} unwind_shards SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RULES);
	__type(key, __u32);
	__type(value, struct unwind_rule);
} unwind_rules SEC(".maps");

/* tgid -> where its CPython interpreter is, for the Python walker. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct py_process);
} python_processes SEC(".maps");

/* tid -> its PyThreadState, found by walking the interpreter's thread list once. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} python_threads SEC(".maps");

/* tgid -> when a refresh of its mappings was last asked for, so that a process with code the
 * tracker cannot describe (JIT) does not flood user space. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} refresh_requested SEC(".maps");

/* (tgid, mapping start) -> when its table was last asked for: one request per file and process
 * every 200 ms at most, however many samples need it. */
struct table_request_key {
	__u32 pid;
	__u32 _pad;
	__u64 begin;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct table_request_key);
	__type(value, __u64);
} table_requested SEC(".maps");

static __always_inline void count_add(enum counter c, __u64 n)
{
	__u32 key = c;
	__u64 *v = bpf_map_lookup_elem(&counters, &key);
	if (v)
		*v += n;
}

static __always_inline void count(enum counter c)
{
	count_add(c, 1);
}

/* 1: user space reads a new program's maps only once it has lived a while or a sample asks
 * (the tracker's lazy reads: the agent at low frequencies). Then only what a sample asks for
 * wakes the reader; a fork, an exec, an exit and a mapping wait for its next wakeup, which comes
 * within 100 ms. A shell loop's `sleep` was four wakeups, one per event, 17% of the agent's CPU
 * under churn. */
const volatile __u8 process_events_lazy = 0;

/* Whether the event wakes the reader now. With the kernel's default, a record wakes the reader
 * only when it is the first one unread: one behind a record that did not wake would not either,
 * so the lazy mode forces what must wake. */
static __always_inline __u64 process_event_wakeup(enum process_event_kind kind)
{
	if (!process_events_lazy)
		return 0;
	switch (kind) {
	case PROCESS_UNKNOWN:
	case PROCESS_NEED_TABLE:
		return BPF_RB_FORCE_WAKEUP;
	default:
		return BPF_RB_NO_WAKEUP;
	}
}

/* Whether the event went out (false: the ring was full, and it is counted lost). */
static __always_inline bool send_process_event_at(__u32 pid, enum process_event_kind kind, __u64 addr)
{
	struct process_event ev = { .pid = pid, .kind = kind, .addr = addr };

	if (bpf_ringbuf_output(&process_events, &ev, sizeof(ev), process_event_wakeup(kind))) {
		count(COUNTER_PROCESS_EVENTS_LOST);
		return false;
	}
	return true;
}

static __always_inline void send_process_event(__u32 pid, enum process_event_kind kind)
{
	send_process_event_at(pid, kind, 0);
}

#endif
