//! What a recording says when it ends: the summary line, and with `-v` what the unwinder, the
//! off-CPU program and the CUDA hooks counted, with warnings where something was lost.

use std::collections::HashSet;
use std::time::Duration;

use gpuflame_bpf::{Counters, UnwindCapacity};

use crate::cuda::hooks::{AllocatorFollowed, HookStats};
use crate::cuda::Coverage;
use crate::output::Format;
use crate::process::TrackerStats;
use crate::profile::Profile;
use crate::profile_kind::ProfileKind;
use crate::session::{LateStats, Session, UnwinderCheck, Window, WindowStats, WaitingStats};
use crate::sources::SourceStats;
use crate::workload::rank::RankStats;

/// What the session counted, kept when it ends for the report after the files are written.
pub(super) struct End {
    counters: Counters,
    malformed: u64,
    /// Device memory lines for the summary: reserved against allocated, which allocator applies.
    memory: Vec<String>,
    capacity: UnwindCapacity,
    tracker: TrackerStats,
    unknown_python: u64,
    off_cpu_threads_left: Option<u64>,
    ranks: RankStats,
    late: LateStats,
    waiting: WaitingStats,
    /// The longest a record waited in the samples ring before it was read.
    ring_lag: Duration,
    /// `--check-unwinder`: the lines that say how the unwinders compared.
    check: Option<Vec<String>>,
}

/// The summary's head: the CPU samples, or where the CPU profile was not asked for, each
/// profile's stacks (an off-CPU or a tensor recording takes no CPU sample: "0 samples from 0
/// processes" read as if nothing was recorded).
pub(super) fn recorded(stats: &WindowStats, profiles: &[(ProfileKind, Profile)]) -> String {
    let cpu = format!("{} samples from {} processes", stats.samples, stats.processes());
    if stats.samples > 0 || profiles.is_empty() || profiles.iter().any(|(k, _)| *k == ProfileKind::Cpu) {
        return cpu;
    }
    let pids: HashSet<u32> = profiles.iter().flat_map(|(_, p)| p.samples.iter().filter_map(|s| s.labels.pid)).collect();
    let each: Vec<String> = profiles.iter().map(|(kind, p)| format!("{kind} {} stacks", p.samples.len())).collect();
    format!("{} from {} processes", each.join(", "), pids.len())
}

impl End {
    /// Reads the counters; says at once what the BPF programs and the CUDA hooks cost and saw.
    pub(super) fn of(session: &Session, window: &Window) -> anyhow::Result<End> {
        let counters = session.programs().counters()?;
        if let Some((runs, ns)) = session.programs().sampler_run_stats().filter(|&(runs, _)| runs > 0) {
            tracing::info!(runs, avg_ns = ns / runs, "BPF sampling program cost (kernel.bpf_stats_enabled=1)");
        }
        let off_cpu = session.off_cpu();
        if let Some((runs, ns)) = off_cpu.then(|| session.programs().off_cpu_run_stats()).flatten().filter(|&(runs, _)| runs > 0) {
            tracing::info!(runs, avg_ns = ns / runs, "BPF context-switch program cost (kernel.bpf_stats_enabled=1)");
        }
        let mut sources = session.source_stats();
        counted_tensors(&mut sources.tensors, &counters.cuda);
        if let (Some(c), Some(coverage)) = (session.processes().cuda(), window.coverage) {
            report_cuda(&c.hooks.stats, &sources, coverage, &counters.cuda);
        }
        let mut memory = session.processes().cuda().map(|c| memory_lines(&c.hooks.stats, &sources)).unwrap_or_default();
        memory.extend(crate::cuda::live::loss_lines(&counters.cuda));
        Ok(End {
            memory,
            malformed: session.programs().malformed_records(),
            capacity: session.programs().unwind_capacity(),
            tracker: TrackerStats { rows_unaccounted: session.processes().rows_unaccounted(session.programs()), ..session.processes().tracking_stats().clone() },
            unknown_python: session.unknown_python_frames(),
            off_cpu_threads_left: off_cpu.then(|| session.programs().off_cpu_threads().ok()).flatten(),
            ranks: session.rank_stats(),
            late: session.late_stats(),
            waiting: session.waiting_stats(),
            ring_lag: session.programs().take_ring_lag(),
            check: session.unwinder_check().map(UnwinderCheck::summary),
            counters,
        })
    }

    /// The summary line, then what went wrong or, with `-v`, what was counted. `head`: what was
    /// recorded ([`recorded`]).
    pub(super) fn report(&self, head: &str, stats: &WindowStats, duration: Duration, format: Format, written: &[String]) {
        let counters = &self.counters;
        // A stack BPF cut for want of a table and finished whole later is complete.
        let failed = (counters.kernel_stack_failed + counters.user_stack_failed).saturating_sub(self.late.finished_whole);
        let malformed = self.malformed;
        eprintln!(
            "gpuflame: {head} in {:.1} s ({} lost, {failed} incomplete stacks{}{}{}) → {} ({format})",
            duration.as_secs_f64(),
            counters.lost,
            stats.complete_fraction().map_or(String::new(), |c| format!(", {:.1}% of user stacks complete", c * 100.0)),
            late_part(&self.late),
            if malformed > 0 { format!(", {malformed} malformed records") } else { String::new() },
            written.join(", "),
        );
        for line in self.memory.iter().chain(self.check.iter().flatten()) {
            eprintln!("gpuflame: {line}");
        }
        let lag_ms = self.ring_lag.as_millis() as u64;
        tracing::info!(longest_ms = lag_ms, "records waited in the ring before they were read");
        if self.ring_lag >= Duration::from_secs(1) {
            tracing::warn!(longest_ms = lag_ms, lost = counters.lost, cuda_lost = counters.cuda.lost, "gpuflame fell behind: records waited up to {:.1} s in the ring before they were read (its CPU was taken by other work); a full ring loses records", self.ring_lag.as_secs_f64());
        }
        tracing::info!(finished = self.late.finished, whole = self.late.finished_whole, deeper_than_copy = self.late.cut_by_copy, gave_up = self.late.gave_up, turned_away = self.late.turned_away, "stacks copied where a table was missing, finished when it came");
        report_unwinding(counters, &self.tracker, self.capacity, self.unknown_python);
        report_ranks(&self.ranks);
        if let Some(left) = self.off_cpu_threads_left {
            let o = &counters.off_cpu;
            tracing::info!(
                switches = o.switches,
                drawn = o.drawn,
                unwound = o.unwound,
                waited_s = format!("{:.3}", o.waited_ns as f64 / 1e9),
                over_cpu_budget = o.over_budget,
                lost = o.lost,
                threads_full = o.threads_full,
                threads_followed = o.followed,
                threads_left = left,
                "off-CPU"
            );
            let w = &self.waiting;
            tracing::info!(
                reports = w.reports,
                waiting = w.waiting,
                stacks_read = w.stacks_read,
                whole = w.stacks_whole,
                deferred = w.deferred,
                last_pass_ms = format!("{:.1}", w.last_pass.as_secs_f64() * 1e3),
                "threads waiting at the windows' ends (their stacks read where they lie)"
            );
            if w.deferred > 0 {
                tracing::warn!(deferred = w.deferred, "some waiting threads' stacks were not read for want of time: their time is under [off-cpu: waits not unwound] until a window's end reads them");
            }
            if o.lost > 0 || o.threads_full > 0 {
                tracing::warn!(lost = o.lost, threads_not_followed = o.threads_full, "some off-CPU time was not recorded: the ring buffer was full, or no state could be made for some threads");
            }
        }
        if counters.targets_full > 0 {
            tracing::warn!(count = counters.targets_full, "new processes could not be followed: the target map was full");
        }
    }
}

/// ", N finished late" when samples waited for their tables.
fn late_part(l: &LateStats) -> String {
    let mut s = String::new();
    if l.finished > 0 {
        s += &format!(", {} finished late", l.finished);
    }
    if l.gave_up > 0 {
        s += &format!(", {} whose table never came", l.gave_up);
    }
    if l.turned_away > 0 {
        s += &format!(", {} not held (64 MiB of stacks waiting)", l.turned_away);
    }
    s
}

/// What reading processes' ranks counted (-v); a warning for values that were not numbers.
fn report_ranks(r: &RankStats) {
    tracing::info!(
        environments_read = r.environments_read,
        processes_labelled = r.processes_labelled,
        values_left_out = r.values_left_out,
        unreadable = r.unreadable,
        cut = r.cut,
        "rank labels"
    );
    if r.values_left_out > 0 {
        tracing::warn!(count = r.values_left_out, "values of rank variables were left out: not a decimal integer of at most 9 digits");
    }
}

/// Unwind failures by reason, on request (-v), or as a warning when tables could not be loaded.
fn report_unwinding(counters: &Counters, t: &TrackerStats, capacity: UnwindCapacity, unknown_python: u64) {
    // Every counter of the BPF programs, from the one list that declares them (bpf/src/counters.rs).
    let listed: Vec<String> = counters.named().into_iter().map(|(name, value)| format!("{name}={value}")).collect();
    tracing::info!("BPF counters: {}", listed.join(" "));
    tracing::info!(python_unknown_frames = unknown_python, "unwinding");
    tracing::info!(
        tables = t.tables_built,
        rows = t.rows_loaded,
        build_ms = t.build_time.as_millis() as u64,
        evicted = t.tables_evicted,
        evicted_for_room = t.tables_evicted_for_room,
        in_pieces = t.tables_in_pieces,
        failures = t.table_failures,
        files_without_cfi = t.files_without_cfi,
        functions_from_prologues = t.functions_from_prologues,
        first_demanded_table_ms = t.first_demanded_table.map(|d| d.as_millis() as u64),
        rows_in_use = capacity.rows_used,
        rows_unaccounted = t.rows_unaccounted,
        rows_budget = capacity.rows_total,
        kernel_bytes = capacity.shard_bytes,
        rules = capacity.rules,
        "unwind tables"
    );
    if t.rows_unaccounted > 0 {
        tracing::warn!(rows = t.rows_unaccounted, "unwind tables hold rows that no file owns (a bug: they stay until the end of the recording)");
    }
    if !t.no_room.is_empty() {
        let names: Vec<&str> = t.no_room.iter().map(String::as_str).take(5).collect();
        let more = t.no_room.len().saturating_sub(names.len());
        tracing::warn!(
            "unwind tables are full: {} file(s) did not fit in --unwind-memory {:.1} MiB ({}{}); their stacks stop there — raise --unwind-memory",
            t.no_room.len(),
            (capacity.rows_total * gpuflame_bpf::SamplerConfig::BYTES_PER_ROW) as f64 / f64::from(1 << 20),
            names.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        );
    }
    if t.mappings_dropped > 0 || counters.process_events_lost > 0 || counters.mmap_throttled > 0 {
        tracing::warn!(
            mappings_dropped = t.mappings_dropped,
            process_events_lost = counters.process_events_lost,
            mmap_reports_throttled = counters.mmap_throttled,
            "some code could not be described to the unwinder"
        );
    }
}

fn report_cuda(s: &HookStats, sources: &SourceStats, coverage: Coverage, counters: &gpuflame_bpf::CudaCounters) {
    let h = &sources.hbm;
    tracing::info!(
        files_hooked = s.files_hooked,
        files_searched = s.files_searched,
        attach_failures = s.attach_failures,
        max_attach_latency_ms = s.max_attach_latency.as_secs_f64() * 1e3,
        allocations = h.allocations,
        frees = h.frees,
        unknown_frees = h.unknown_frees,
        failed_allocations = h.failed_allocations,
        launches_seen = sources.launches_seen,
        hooks_attached_ms = coverage.attached.as_millis() as u64,
        scale = coverage.scale(),
        "CUDA"
    );
    if h.unknown_frees > 0 {
        tracing::info!(count = h.unknown_frees, "frees of memory allocated before the hooks were attached");
    }
    let t = &sources.tensors;
    tracing::info!(
        allocations = t.allocations,
        frees = t.frees,
        unknown_frees = t.unknown_frees,
        overwritten = t.overwritten,
        allocator_retries = sources.allocator_retries,
        "PyTorch tensors"
    );
    tracing::info!(calls = counters.calls, lost = counters.lost, table_full = counters.table_full, races = counters.races, "CUDA hook records");
    if counters.lost > 0 || counters.table_full > 0 {
        tracing::warn!(
            lost = counters.lost,
            calls_not_followed = counters.table_full,
            "some CUDA calls were not recorded: the ring buffer or the table of calls in flight was full"
        );
    }
}


/// Tensors as the programs counted them, into the live set and out: exact whatever the ring
/// lost, and counted where no record of them is sent (no timeline).
fn counted_tensors(t: &mut crate::cuda::hbm::HbmStats, c: &gpuflame_bpf::CudaCounters) {
    t.allocations = c.tensors_allocated;
    t.without_stack = c.tensors_sampled_out;
    t.frees = c.tensors_freed;
    t.unknown_frees = c.tensors_unknown_frees;
}

/// Device memory at the end: reserved against allocated per device, and whether tensors were
/// followed (PyTorch's caching allocator) or only segments, and why.
fn memory_lines(hooks: &HookStats, sources: &SourceStats) -> Vec<String> {
    let mut lines: Vec<String> = sources.devices.iter().map(|d| format!("HBM at the end: {}", d)).collect();
    let t = &sources.tensors;
    for (path, followed) in &hooks.allocators {
        match followed {
            AllocatorFollowed::Not(why) => lines.push(format!("tensors not followed in {path}: {why}; hbm-* (segments) still hold")),
            _ if t.allocations == 0 => lines.push(format!(
                "PyTorch's caching allocator in {path} is followed but handed out no tensor: another allocator (backend:cudaMallocAsync, a pluggable allocator) is in use, or none ran; hbm-* (segments) hold"
            )),
            AllocatorFollowed::ByProbes => lines.push(format!("tensors followed in {path} through its USDT probes (pytorch:malloc, pytorch:free)")),
            AllocatorFollowed::ByHooks(why) => lines.push(format!("tensors followed in {path} by hooks on its functions ({why})")),
        }
    }
    if t.allocations > 0 || t.unknown_frees > 0 {
        let mut line = format!("tensors: {} allocated, {} freed", t.allocations, t.frees);
        if t.without_stack > 0 {
            line.push_str(&format!(
                "; byte sampling took the stacks of {} of them (the others count in the totals, and in their stacks' bytes through the ones drawn)",
                t.allocations - t.without_stack
            ));
        }
        if t.unknown_frees > 0 {
            line.push_str(&format!(
                ", {} frees of tensors allocated before gpuflame attached (their bytes are unknown, and not in any profile)",
                t.unknown_frees
            ));
        }
        lines.push(line);
    }
    lines
}
