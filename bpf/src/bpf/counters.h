/* Indices of the per-CPU `counters` array. Each counter is declared, with what it counts, in
 * bpf/src/counters.rs, which builds the Rust structs and their listing from that declaration;
 * this enum must name the same counters in the same order (a unit test compares the two). The
 * groups follow the Rust structs: the sampler's own, then the unwinder's, the Python walker's,
 * the CUDA hooks' and the off-CPU programs'. */
#ifndef GPUFLAME_COUNTERS_H
#define GPUFLAME_COUNTERS_H

enum counter {
	COUNTER_SAMPLES = 0,
	COUNTER_LOST,
	COUNTER_KSTACK_FAILED,
	COUNTER_USTACK_FAILED,
	COUNTER_TARGETS_FULL,
	COUNTER_PROCESS_EVENTS_LOST,
	COUNTER_MMAP_THROTTLED,
	/* UnwindCounters */
	COUNTER_UNWIND_NO_PROCESS,
	COUNTER_UNWIND_NO_MAPPING,
	COUNTER_UNWIND_NO_ROW,
	COUNTER_UNWIND_BAD_CFA,
	COUNTER_UNWIND_READ_FAULT,
	COUNTER_UNWIND_TRUNCATED,
	COUNTER_UNWIND_NO_TABLE_YET,
	COUNTER_UNWIND_BAD_FRAME,
	COUNTER_UNWIND_FP_FALLBACK,
	COUNTER_UNWIND_FP_REJECTED,
	COUNTER_UNWIND_SCANNED,
	/* PythonCounters */
	COUNTER_PY_FRAMES,
	COUNTER_PY_NO_THREAD,
	COUNTER_PY_READ_FAULT,
	COUNTER_PY_AFTER_GAP,
	COUNTER_PY_TRUNCATED,
	/* CudaCounters */
	COUNTER_CUDA_CALLS,
	COUNTER_CUDA_LOST,
	COUNTER_CUDA_CALLS_FULL,
	COUNTER_CUDA_RACE,
	/* OffCpuCounters */
	COUNTER_OFFCPU_SWITCHES,
	COUNTER_OFFCPU_UNWOUND,
	COUNTER_OFFCPU_BUDGET,
	COUNTER_OFFCPU_LOST,
	COUNTER_OFFCPU_FULL,
	COUNTER_OFFCPU_FOLLOWED,
	COUNTER_OFFCPU_RELEASED,
	COUNTER_MAX,
};

#endif
