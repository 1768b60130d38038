// SPDX-License-Identifier: GPL-2.0
/* The profiler's BPF object. CPU-time sampling (here): a perf_event program on the software CPU
 * clock of every online CPU. CUDA hooks, off-CPU time, unwinding, Python walking and process
 * events come from the headers included below. */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "events.h"
#include "maps.h"
#include "records.h"
#include "native_unwind.h"
#include "cuda_hooks.h"
#include "torch_probes.h"
#include "process_events.h"
#include "offcpu.h"
#include "thread_reports.h"
#include "stack_hooks.h"
#include "targets.h"

#ifndef EFAULT
#define EFAULT 14
#endif

char LICENSE[] SEC("license") = "GPL";

/* Keep these types in the object's BTF so that libbpf-cargo generates their Rust mirror. */
struct event_record layout_event_record = {};
struct process_event layout_process_event = {};
enum counter layout_counter = COUNTER_SAMPLES;
enum unwind_status layout_unwind_status = UNWIND_END_OF_STACK;
enum process_event_kind layout_process_event_kind = PROCESS_EXEC;
enum cfa_kind layout_cfa_kind = CFA_NO_INFO;
enum rbp_kind layout_rbp_kind = RBP_UNCHANGED;
struct py_process layout_py_process = {};
struct thread_report layout_thread_report = {};
enum py_frame_kind layout_py_frame_kind = PY_FRAME_OBJECT;
enum frame_tag layout_frame_tag = FRAME_TAG_GAP;
enum event_kind layout_event_kind = EVENT_CPU_SAMPLE;
enum cuda_api layout_cuda_api = CUDA_API_NONE;
enum cuda_class layout_cuda_class = CUDA_CLASS_ALLOC;
enum cuda_call_flags layout_cuda_call_flags = CUDA_CALL_IN_ALLOCATOR;
enum cuda_cookie layout_cuda_cookie = CUDA_COOKIE_STEPPED;
struct cupti_kernel layout_cupti_kernel = {};
enum exec_mapping_flags layout_mapping_flags = MAPPING_HAS_TABLE;
enum stack_flags layout_stack_flags = STACK_BY_FILE;
struct file_table layout_file_table = {};
struct file_table_key layout_file_table_key = {};
enum shard_layout layout_shard_layout = SHARD_BLOCKS;
enum stack_copy_layout layout_stack_copy_layout = STACK_COPY_MAX_BYTES;
struct table_info layout_table_info = {};
struct unwind_block layout_unwind_block = {};
struct memory_event layout_memory_event = {};
enum live_flags layout_live_flags = LIVE_SAMPLED_OUT;
enum memory_event_flags layout_memory_event_flags = MEMORY_FREED;

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, slot = SCRATCH_SAMPLER;
	struct event_record *e;

	if (!is_target(tgid))
		return 0;
	count(COUNTER_SAMPLES);

	e = bpf_map_lookup_elem(&sample_scratch, &slot);
	if (!e)
		return 0;
	record_header(e, EVENT_CPU_SAMPLE, tgid, (__u32)id, NULL);

	/* A sample taken in user mode has no kernel part; only real failures are counted. */
	e->stack.kernel_stack_bytes = bpf_get_stack(ctx, e->kernel_stack, sizeof(e->kernel_stack), 0);
	if (e->stack.kernel_stack_bytes < 0 && e->stack.kernel_stack_bytes != -EFAULT)
		count(COUNTER_KSTACK_FAILED);
	unwind_user_stack(e, slot);

	send_record(e, sizeof(*e), WAKE_WHEN_FILLING, COUNTER_LOST);
	return 0;
}
