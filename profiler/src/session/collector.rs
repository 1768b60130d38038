//! The part of a session that knows no BPF: records in, through the sources, profiles out. Each
//! record's stack is made once, by [`Stacks`], for every source that takes it.

use std::time::{Duration, SystemTime};

use gpuflame_bpf::{Event, OffCpuState, Sample, TrapCost};
use super::order::record_sample;
use super::processes::{Gone, News, ProcessView};
use super::window::{Oom, WindowStats};
use crate::cuda::Coverage;
use crate::profile::Profile;
use crate::profile_kind::ProfileKind;
use crate::sources::{self, Input, OomReport, Sources, SourceStats, WindowInfo};
use crate::stacks::{StackKey, StackValues, Stacks};
use crate::workload::rank::LabelsByPid;

pub struct Collector {
    stacks: Stacks,
    sources: Sources,
    profiles: Vec<ProfileKind>,
    frequency_hz: u64,
    stats: WindowStats,
}

impl Collector {
    /// `trap_cost`: what the traps of one hooked CUDA call cost, as calibrated.
    /// `tensor_sample_bytes`: the interval of tensors' byte sampling (0: every stack).
    pub fn new(profiles: &[ProfileKind], frequency_hz: u64, trap_cost: TrapCost, tensor_sample_bytes: u64) -> Self {
        Collector {
            stacks: Stacks::new(),
            sources: sources::for_profiles(profiles, frequency_hz, trap_cost, tensor_sample_bytes),
            profiles: profiles.to_vec(),
            frequency_hz,
            stats: WindowStats::default(),
        }
    }

    /// Takes one record, with its process as the registry knows it.
    pub fn record(&mut self, event: &Event, process: ProcessView<'_>) {
        let (stacks, sources) = (&mut self.stacks, &mut self.sources);
        let ProcessView { files, python, new_program } = process;
        if let (true, Some(s)) = (new_program, record_sample(event)) {
            stacks.program_changed(s.pid);
        }
        match event {
            Event::Sample(sample) => {
                let stack = stacks.stack(sample, files, python, false);
                self.stats.sample(sample);
                sources.all().for_each(|s| s.add(&Input::Sample { sample, stack: &stack }, stacks));
            }
            Event::OffCpu(record) => {
                let stack = stacks.wait_stack(&record.sample, files, python);
                sources.all().for_each(|s| s.add(&Input::OffCpu { record, stack: &stack }, stacks));
            }
            // Thousands a second, and no stack.
            Event::Memory(m) => self.offer(&Input::Memory(m)),
            Event::Cuda(call) => {
                // A tensor byte sampling passed over: counted in the totals, under no stack.
                let stack = if call.stack_sampled_out {
                    StackKey::marker(call.sample.pid, call.sample.comm.clone(), Vec::new())
                } else {
                    stacks.call_stack(&call.sample, files, python)
                };
                sources.all().for_each(|s| s.add(&Input::CudaCall { call, stack: &stack, files }, stacks));
            }
            Event::CuptiLaunch(launch) => {
                let stack = stacks.call_stack(&launch.sample, files, python);
                sources.all().for_each(|s| s.add(&Input::CuptiLaunch { launch, stack: &stack }, stacks));
            }
            Event::CuptiStatus(status) => self.offer(&Input::CuptiStatus(status)),
            Event::HookedStack(record) => {
                let stack = stacks.stack(&record.sample, files, python, false);
                sources.all().for_each(|s| s.add(&Input::HookedStack { record, stack: &stack }, stacks));
            }
            Event::OffCpuEnd(e) => self.offer(&Input::OffCpuEnd(e)),
            Event::KernelName(k) => self.offer(&Input::KernelName(k)),
            Event::GpuKernels(b) => self.offer(&Input::GpuKernels(b)),
            Event::GpuKernelName(n) => self.offer(&Input::GpuKernelName(n)),
            Event::Process(_) => {}
        }
    }

    /// Whether device memory is profiled: the live set is read for it.
    pub fn wants_memory(&self) -> bool {
        self.sources.memory.is_some()
    }

    /// A record without a stack.
    pub fn offer(&mut self, input: &Input<'_>) {
        for s in self.sources.all() {
            s.add(input, &mut self.stacks);
        }
    }

    /// A thread's stack as the profiles would have it: a CPU sample's, or a wait's (its
    /// off-CPU state as its leaf). For `gpuflame dump`.
    pub fn stack_key(&mut self, sample: &Sample, process: ProcessView<'_>, wait: Option<OffCpuState>) -> StackKey {
        let ProcessView { files, python, new_program } = process;
        if new_program {
            self.stacks.program_changed(sample.pid);
        }
        match wait {
            Some(state) => {
                let mut key = self.stacks.wait_stack(sample, files, python);
                key.leaf = Some(state.label());
                key
            }
            None => self.stacks.stack(sample, files, python, false),
        }
    }

    /// These stacks symbolized, each with its values (`gpuflame dump`).
    pub fn symbolize(&mut self, mut profile: Profile, values: StackValues, labels: &dyn LabelsByPid) -> Profile {
        self.stacks.build(&mut profile, values, SystemTime::now(), Duration::ZERO, labels);
        profile
    }

    /// What the registry heard in a process event: a process that runs a new program (its old
    /// program's names go), processes gone.
    pub fn heard(&mut self, news: &News) {
        if let Some(pid) = news.new_program {
            self.stacks.program_changed(pid);
        }
        self.processes_gone(&news.gone);
    }

    /// Processes the registry forgot (exited long enough ago that no record of theirs can come):
    /// what names their frames goes.
    pub fn processes_forgotten(&mut self, pids: &[u32]) {
        self.stacks.forget(pids);
    }

    /// Processes the registry says are gone: exited now (their last records may still come in
    /// this window), or found gone at a window's end (their exit was lost).
    pub fn processes_gone(&mut self, gone: &Gone) {
        for &pid in &gone.0 {
            self.stacks.process_exited(pid);
            self.offer(&Input::ProcessExited(pid));
        }
    }

    /// The window's profiles, symbolized, in the order of [`ProfileKind`], and its samples; a
    /// new window starts. `coverage`: of the duty-cycled CUDA hooks, when CUDA is hooked.
    /// `labels`: the processes' labels, as the registry knows them.
    pub fn close(&mut self, coverage: Option<Coverage>, start: SystemTime, duration: Duration, labels: &dyn LabelsByPid) -> (Vec<(ProfileKind, Profile)>, WindowStats) {
        let exact = Coverage { attached: duration, elapsed: duration, exact: true, trap_cost: TrapCost::default(), window: Duration::ZERO };
        let info = WindowInfo { frequency_hz: self.frequency_hz, coverage: coverage.unwrap_or(exact), length: duration };
        let mut profiles = Vec::new();
        for source in self.sources.all() {
            for closed in source.close(&info, &mut self.stacks) {
                if !self.profiles.contains(&closed.kind) {
                    continue;
                }
                let mut profile = closed.kind.empty_profile(self.frequency_hz);
                profile.comments = closed.comments;
                self.stacks.build(&mut profile, closed.values, start, duration, labels);
                profiles.push((closed.kind, profile));
            }
        }
        profiles.sort_by_key(|(k, _)| *k);
        self.stacks.window_closed();
        (profiles, std::mem::take(&mut self.stats))
    }

    /// The out-of-memory failures seen since the last call, with their snapshots as of `at`.
    pub fn take_ooms(&mut self, at: SystemTime, labels: &dyn LabelsByPid) -> Vec<Oom> {
        let reports: Vec<OomReport> = self.sources.memory.as_mut().map(|m| m.take_ooms()).unwrap_or_default();
        reports
            .into_iter()
            .map(|report| {
                let snapshot = report.snapshot(&mut self.stacks, at, labels);
                let stack = self.stacks.describe(&report.stack);
                let holders = report.top_holders(&mut self.stacks);
                Oom { report, snapshot, stack, holders }
            })
            .collect()
    }

    /// Keep device memory over time, for [`Collector::memory_timeline`].
    pub fn keep_memory_timeline(&mut self) {
        if let Some(m) = self.sources.memory.as_mut() {
            m.keep_memory_timeline();
        }
    }

    /// Device memory over time, per device, drawn up to `end_ns` (boot time).
    pub fn memory_timeline(&mut self, end_ns: u64) -> Vec<crate::output::memory_svg::DeviceChart> {
        let stacks = &mut self.stacks;
        self.sources.memory.as_mut().map(|m| m.memory_timeline(end_ns, stacks)).unwrap_or_default()
    }

    pub fn samples(&self) -> u64 {
        self.stats.samples
    }

    pub fn stats(&self) -> SourceStats {
        let mut stats = SourceStats::default();
        self.sources.others.iter().for_each(|s| s.stats(&mut stats));
        if let Some(m) = &self.sources.memory {
            sources::Source::stats(m, &mut stats);
        }
        stats
    }

    pub fn unknown_python_frames(&self) -> u64 {
        self.stacks.unknown_python_frames()
    }
}
