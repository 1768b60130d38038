/* Target selection in the kernel: which tgids are sampled, and following their descendants. */
#ifndef GPUFLAME_TARGETS_H
#define GPUFLAME_TARGETS_H

#include "maps.h"

const volatile enum target_mode target_mode = TARGET_ALL;
const volatile __u8 follow_forks = 0;

static __always_inline bool is_target(__u32 tgid)
{
	if (tgid == 0) /* the idle task is not CPU time of anybody */
		return false;
	if (target_mode == TARGET_ALL)
		return true;
	return bpf_map_lookup_elem(&targets, &tgid) != NULL;
}

/* A new process whose parent is a target becomes one before it can run, so no sample of it is
 * filtered out for lack of a user-space round trip. */
static __always_inline void follow_fork(__u32 parent_tgid, __u32 child_tgid)
{
	__u8 one = 1;

	if (target_mode != TARGET_PIDS || !follow_forks)
		return;
	if (!bpf_map_lookup_elem(&targets, &parent_tgid))
		return;
	if (bpf_map_update_elem(&targets, &child_tgid, &one, BPF_NOEXIST) && !bpf_map_lookup_elem(&targets, &child_tgid))
		count(COUNTER_TARGETS_FULL);
}

#endif
