//! What this kernel lets a session run: the profiles whose programs it did not take are said, in
//! one line each, and dropped; the others run.

use gpuflame_bpf::{BpfPrograms, CallHooks, ProgramGroup, Unavailable, UPROBE_SESSION};

use crate::profile_kind::{needs_of, CudaHooks, ProfileKind};
use crate::UserError;

/// The profiles of `asked` that the loaded programs can make. Says on stderr which cannot, and
/// why, and what runs an older way; an error when none can run.
/// `duty_cycled`: launches were asked to be hooked part of each second.
pub fn runnable_profiles(sampler: &BpfPrograms, asked: &[ProfileKind], duty_cycled: bool) -> Result<Vec<ProfileKind>, UserError> {
    let said = KernelLimits::of(sampler.unavailable(), sampler.kernel().call_hooks(), &sampler.kernel().release, asked, duty_cycled);
    if said.runnable.is_empty() {
        return Err(UserError(said.cannot_run.join("; ")));
    }
    for line in said.cannot_run.iter().chain(&said.older_ways) {
        eprintln!("gpuflame: {line}");
    }
    Ok(said.runnable)
}

/// Whether launch hooks may be attached part of each second. Without sessions a function's entry
/// and return are two links, and attaching a window's links while the last window's are being
/// detached waited up to seconds (a loop of 600,000 launches took 14.7 s instead of 3): they stay
/// attached, and count exactly.
pub fn duty_cycles(sampler: &BpfPrograms) -> bool {
    sampler.kernel().call_hooks() == CallHooks::Sessions
}

/// What a session asked for that this kernel limits, in the words the user reads.
#[derive(Debug, PartialEq, Eq)]
struct KernelLimits {
    runnable: Vec<ProfileKind>,
    /// A line per group of profiles that cannot run.
    cannot_run: Vec<String>,
    /// A line per way the profiles run that is older than the one gpuflame prefers.
    older_ways: Vec<String>,
}

impl KernelLimits {
    fn of(unavailable: &[Unavailable], hooks: CallHooks, release: &str, asked: &[ProfileKind], duty_cycled: bool) -> Self {
        let mut runnable = asked.to_vec();
        let mut cannot_run = Vec::new();
        for u in unavailable {
            let (out, keep): (Vec<ProfileKind>, Vec<ProfileKind>) = runnable.iter().partition(|&&k| needs_group(k, u.group));
            if out.is_empty() {
                continue;
            }
            let names: Vec<&str> = out.iter().map(|k| k.name()).collect();
            let rest = if keep.is_empty() { "" } else { "; the other profiles run" };
            cannot_run.push(format!("{} cannot run: {}{rest}", names.join(", "), u.why));
            runnable = keep;
        }
        let needs = needs_of(&runnable);
        let mut older_ways = Vec::new();
        if (needs.cuda.is_some() || needs.cupti) && hooks == CallHooks::EntryAndReturn {
            let exact = if needs.cuda == Some(CudaHooks::DutyCycled) && duty_cycled {
                ", and launches are hooked all the time, not part of each second (counted exactly, at a higher cost)"
            } else {
                ""
            };
            older_ways.push(format!("this kernel ({release}) lacks {UPROBE_SESSION}: the CUDA call hooks use entry and return probes instead{exact}"));
        }
        KernelLimits { runnable, cannot_run, older_ways }
    }
}

fn needs_group(kind: ProfileKind, group: ProgramGroup) -> bool {
    let needs = kind.descriptor().needs;
    match group {
        ProgramGroup::OffCpu => needs.switches,
        ProgramGroup::Cuda => needs.cuda.is_some() || needs.cupti,
        // gpuflame dump alone: it says so when it reads the threads.
        ProgramGroup::Threads => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lacking(group: ProgramGroup, what: &str) -> Unavailable {
        Unavailable { group, why: format!("this kernel (5.10.0-32-cloud-amd64) lacks {what}") }
    }

    #[test]
    fn a_profile_the_kernel_cannot_run_is_said_in_one_line_and_the_others_run() {
        let asked = [ProfileKind::Cpu, ProfileKind::OffCpu, ProfileKind::Wall, ProfileKind::HbmInUse];
        let off_cpu = lacking(ProgramGroup::OffCpu, "task storage in tracing programs (Linux 5.11)");
        let said = KernelLimits::of(&[off_cpu], CallHooks::Sessions, "5.10.0-32-cloud-amd64", &asked, true);
        assert_eq!(said.runnable, vec![ProfileKind::Cpu, ProfileKind::HbmInUse]);
        assert_eq!(
            said.cannot_run,
            vec!["off-cpu, wall cannot run: this kernel (5.10.0-32-cloud-amd64) lacks task storage in tracing programs (Linux 5.11); the other profiles run"]
        );
        assert!(said.older_ways.is_empty());
    }

    #[test]
    fn a_kernel_without_uprobe_sessions_says_the_cuda_hooks_use_entry_and_return_probes() {
        let said = KernelLimits::of(&[], CallHooks::EntryAndReturn, "6.1.0-57-cloud-amd64", &[ProfileKind::Cpu, ProfileKind::HbmInUse], true);
        assert_eq!(said.runnable, vec![ProfileKind::Cpu, ProfileKind::HbmInUse]);
        assert!(said.cannot_run.is_empty());
        assert_eq!(said.older_ways, vec!["this kernel (6.1.0-57-cloud-amd64) lacks uprobe sessions (Linux 6.13): the CUDA call hooks use entry and return probes instead"]);
        // A profile of CPU time alone hooks no calls: nothing to say.
        let cpu = KernelLimits::of(&[], CallHooks::EntryAndReturn, "6.1.0-57-cloud-amd64", &[ProfileKind::Cpu], true);
        assert!(cpu.older_ways.is_empty());
        // Launches at defaults are hooked part of each second, which these hooks cannot be.
        let launches = KernelLimits::of(&[], CallHooks::EntryAndReturn, "6.1.0-57-cloud-amd64", &[ProfileKind::GpuLaunches], true);
        assert_eq!(launches.older_ways, vec!["this kernel (6.1.0-57-cloud-amd64) lacks uprobe sessions (Linux 6.13): the CUDA call hooks use entry and return probes instead, and launches are hooked all the time, not part of each second (counted exactly, at a higher cost)"]);
        let exact = KernelLimits::of(&[], CallHooks::EntryAndReturn, "6.1.0-57-cloud-amd64", &[ProfileKind::GpuLaunches], false);
        assert!(!exact.older_ways[0].contains("all the time"), "--cuda-exact asked for it");
    }

    #[test]
    fn when_nothing_asked_can_run_the_line_is_the_error() {
        let cuda = lacking(ProgramGroup::Cuda, "BPF attach cookies (Linux 5.15)");
        let said = KernelLimits::of(&[cuda], CallHooks::EntryAndReturn, "5.10", &[ProfileKind::HbmAlloc, ProfileKind::HbmInUse], true);
        assert!(said.runnable.is_empty());
        assert_eq!(said.cannot_run, vec!["hbm-alloc, hbm-inuse cannot run: this kernel (5.10.0-32-cloud-amd64) lacks BPF attach cookies (Linux 5.15)"]);
        assert!(said.older_ways.is_empty(), "no CUDA hooks run: no way to say");
    }
}
