/* exec and exit of target processes, reported to the process tracker so that unwind tables follow
 * what each process maps. */
#ifndef GPUFLAME_PROCESS_EVENTS_H
#define GPUFLAME_PROCESS_EVENTS_H

#include "maps.h"
#include "targets.h"

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_process_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	__u32 tgid = task->tgid;

	if (is_target(tgid))
		send_process_event(tgid, PROCESS_EXEC);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_process_exit, struct task_struct *task)
{
	__u32 tgid = task->tgid;

	if (task->pid != task->tgid) /* a thread: the process goes on */
		return 0;
	if (!is_target(tgid))
		return 0;
	send_process_event(tgid, PROCESS_EXIT);
	bpf_map_delete_elem(&processes, &tgid);
	bpf_map_delete_elem(&python_processes, &tgid);
	/* A recycled pid must not inherit its predecessor's membership. */
	if (target_mode == TARGET_PIDS && follow_forks)
		bpf_map_delete_elem(&targets, &tgid);
	return 0;
}

#endif
