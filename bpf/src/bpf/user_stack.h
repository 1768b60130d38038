/* The user-stack step of a sample. Frame pointers for now; the DWARF unwinder replaces the body of
 * collect_user_stack() and nothing else. */
#ifndef GPUFLAME_USER_STACK_H
#define GPUFLAME_USER_STACK_H

#include "maps.h"

static __always_inline void collect_user_stack(void *ctx, struct sample_event *e)
{
	e->user_stack_bytes = bpf_get_stack(ctx, e->user_stack, sizeof(e->user_stack), BPF_F_USER_STACK);
	if (e->user_stack_bytes < 0)
		count(COUNTER_USTACK_FAILED);
}

#endif
