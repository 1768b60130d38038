/* exec, executable mmaps and exit of target processes, reported to the process tracker so that unwind tables follow
 * what each process maps. */
#ifndef GPUFLAME_PROCESS_EVENTS_H
#define GPUFLAME_PROCESS_EVENTS_H

#include "maps.h"
#include "targets.h"
#include "file_vmas.h"

/* tgid -> its executable memory (mm->exec_vm) when last seen, to notice new code mapped. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} exec_vm_seen SEC(".maps");

/* Reports of new code per process: a burst, then one per MMAP_EVENT_NS. A process that maps code
 * a million times a second is reported a hundred times a second and can neither flood the ring
 * buffer that every process's exec and exit share nor keep the tracker rereading its maps. */
#define MMAP_EVENTS_BURST 64
#define MMAP_EVENT_NS (10ULL * 1000 * 1000)

struct mmap_budget {
	__u64 since_ns; /* when the last token came back */
	__u64 tokens;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct mmap_budget);
} mmap_budgets SEC(".maps");

static __always_inline bool take_mmap_token(__u32 tgid)
{
	__u64 now = bpf_ktime_get_ns(), back;
	struct mmap_budget *b = bpf_map_lookup_elem(&mmap_budgets, &tgid);

	if (!b) {
		struct mmap_budget fresh = { .since_ns = now, .tokens = MMAP_EVENTS_BURST - 1 };

		bpf_map_update_elem(&mmap_budgets, &tgid, &fresh, BPF_ANY);
		return true;
	}
	back = (now - b->since_ns) / MMAP_EVENT_NS;
	if (back) {
		b->tokens = b->tokens + back > MMAP_EVENTS_BURST ? MMAP_EVENTS_BURST : b->tokens + back;
		b->since_ns = now;
	}
	if (!b->tokens)
		return false;
	b->tokens--;
	return true;
}

/* A forked child runs its parent's code in a copy of its memory until it execs: the unwinder
 * walks it with a copy of the parent's entry, so that a child that lives a millisecond (a shell's
 * before it execs a command) is unwound at all. User space learns of the copy first: the entry
 * names the parent's tables, which it must keep while the child may use them, so no event, no
 * copy. Threads share their process's entry already. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_process_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 parent_tgid = parent->tgid, child_tgid = child->tgid;
	struct process_info *from, *copy;
	struct py_process *py;
	__u64 exec_vm;

	if (parent_tgid == child_tgid)
		return 0;
	follow_fork(parent_tgid, child_tgid);
	if (!is_target(child_tgid))
		return 0;
	from = bpf_map_lookup_elem(&processes, &parent_tgid);
	if (!from || !send_process_event_at(child_tgid, PROCESS_FORK, parent_tgid))
		return 0;
	if (bpf_map_update_elem(&processes, &child_tgid, from, BPF_ANY))
		return 0;
	copy = bpf_map_lookup_elem(&processes, &child_tgid);
	if (copy)
		copy->forked_from = parent_tgid;
	/* Rules kept for a process of the same pid before must be checked against this entry. */
	unwind_epoch_bump();
	py = bpf_map_lookup_elem(&python_processes, &parent_tgid);
	if (py)
		bpf_map_update_elem(&python_processes, &child_tgid, py, BPF_ANY);
	/* Code the child maps from now on is news: it has its parent's until then. */
	exec_vm = BPF_CORE_READ(child, mm, exec_vm);
	bpf_map_update_elem(&exec_vm_seen, &child_tgid, &exec_vm, BPF_ANY);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_process_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	__u32 tgid = task->tgid;
	__u64 none = 0;

	/* The old program's mappings (its own, or its parent's copy) are gone: unwinding the new
	 * one with them would make up stacks. Until user space reads the new ones, its samples
	 * say the process is not known. */
	if (!bpf_map_delete_elem(&processes, &tgid))
		unwind_epoch_bump();
	bpf_map_delete_elem(&python_processes, &tgid);
	bpf_map_delete_elem(&file_vmas_of, &tgid);
	if (is_target(tgid)) {
		send_process_event(tgid, PROCESS_EXEC);
		/* A new program: every library it maps from now on is news. */
		bpf_map_update_elem(&exec_vm_seen, &tgid, &none, BPF_ANY);
	}
	return 0;
}

/* An executable file mapping (dlopen, or ld.so at start): new code to unwind, and maybe CUDA to
 * hook, which should happen before the process calls it. Seen when the mapping process lets go
 * of its mmap lock with more executable memory than before. (Syscall tracepoints would see the
 * mmap itself, but while one is attached every system call of every process takes the slow path;
 * fexit and kprobes need kernel options that are not always there.) */

SEC("tp_btf/mmap_lock_released")
int BPF_PROG(on_mmap, struct mm_struct *mm, bool write)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 exec_vm, *seen;

	if (!write || !mm || !is_target(tgid))
		return 0;
	/* exit_mmap() takes the lock too: an exiting process maps nothing new. */
	if (task->flags & 0x00000004 /* PF_EXITING */)
		return 0;
	/* An exec maps the program and its loader before its own event, which reports them: a
	 * report of these too had the tracker read a shell's child's maps once more for each
	 * command it ran. */
	if (BPF_CORE_READ_BITFIELD(task, in_execve))
		return 0;
	exec_vm = mm->exec_vm;
	seen = bpf_map_lookup_elem(&exec_vm_seen, &tgid);
	if (seen && *seen >= exec_vm) {
		*seen = exec_vm; /* an unmap: nothing new to load */
		return 0;
	}
	/* Out of budget: exec_vm_seen stays behind, so that the next mapping after a token comes back
	 * is news again (and samples in code the tracker does not know ask for a refresh). */
	if (seen && !take_mmap_token(tgid)) {
		count(COUNTER_MMAP_THROTTLED);
		return 0;
	}
	bpf_map_update_elem(&exec_vm_seen, &tgid, &exec_vm, BPF_ANY);
	if (seen) /* the first sight of a process is not news: its mappings were read at start */
		send_process_event(tgid, PROCESS_MMAP_EXEC);
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
	if (!bpf_map_delete_elem(&processes, &tgid))
		unwind_epoch_bump();
	bpf_map_delete_elem(&python_processes, &tgid);
	bpf_map_delete_elem(&mmap_budgets, &tgid);
	bpf_map_delete_elem(&file_vmas_of, &tgid);
	/* A recycled pid must not inherit its predecessor's membership. */
	if (target_mode == TARGET_PIDS && follow_forks)
		bpf_map_delete_elem(&targets, &tgid);
	return 0;
}

#endif
