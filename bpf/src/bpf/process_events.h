/* exec, executable mmaps and exit of target processes, reported to the process tracker so that unwind tables follow
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

/* An executable file mapping (dlopen, or ld.so at start): new code to unwind, and maybe CUDA to
 * hook, which should happen before the process calls it. The syscall's entry says whether the
 * mapping is of a file and executable; its exit, whether it happened. (fexit on vm_mmap_pgoff would
 * see both at once but needs ftrace, which kernels do not always allow.) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} mmap_exec_pending SEC(".maps");

struct mmap_enter_args {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__u64 addr, len, prot, flags, fd, off;
};

struct mmap_exit_args {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__s64 ret;
};

SEC("tracepoint/syscalls/sys_enter_mmap")
int on_mmap_enter(struct mmap_enter_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	__u8 one = 1;

	if (!(ctx->prot & 0x4 /* PROT_EXEC */) || (__s64)ctx->fd < 0 || (ctx->flags & 0x20 /* MAP_ANONYMOUS */))
		return 0;
	if (is_target(id >> 32))
		bpf_map_update_elem(&mmap_exec_pending, &tid, &one, BPF_ANY);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_mmap")
int on_mmap_exit(struct mmap_exit_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;

	if (!bpf_map_lookup_elem(&mmap_exec_pending, &tid))
		return 0;
	bpf_map_delete_elem(&mmap_exec_pending, &tid);
	if (ctx->ret < 0 && ctx->ret > -4096)
		return 0;
	send_process_event(id >> 32, PROCESS_MMAP_EXEC);
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
