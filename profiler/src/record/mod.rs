//! `gpuflame record`: sample, aggregate, symbolize, write.

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use gpuflame_bpf::{Counters, Targets, UnwindCapacity};

use crate::output::{self, Format};
use crate::outfile::{self, Output};
use crate::process::ProcessTracker;
use crate::cuda::{human_bytes, injection, ready, Coverage, CudaProfiles, DutyCycle};
use crate::profile_kind::ProfileKind;
use crate::session::{CudaOptions, CudaState, Session, SessionConfig};
use crate::status::StatusLine;
use crate::target::{self, GatedChild};
use crate::{preflight, UserError};

/// Default sampling frequency of `record`: 99 Hz, off the 100 Hz of timers so as not to sample in
/// lockstep with periodic work. (The agent will default to 19 Hz.)
pub const DEFAULT_FREQUENCY_HZ: u64 = 99;

#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub pids: Vec<u32>,
    pub frequency_hz: u64,
    pub duration: Option<Duration>,
    pub output: PathBuf,
    pub format: Option<String>,
    pub command: Vec<String>,
    /// Kernel memory for unwind tables, in bytes.
    pub unwind_memory: u64,
    pub profiles: Vec<ProfileKind>,
    /// Keep launch and synchronisation hooks attached: exact counts, at their full cost.
    pub cuda_exact: bool,
    /// How long the launch hooks stay attached each second when not exact.
    pub cuda_window: Duration,
    /// Python frames per function or per line in folded stacks and SVG.
    pub detail: output::Detail,
}

/// Where each profile goes: the output itself for one profile; for several, one file each,
/// named by profile (`out.svg` → `out.cpu.svg`, `out.hbm-inuse.svg`).
pub fn output_paths(output: &Path, profiles: &[ProfileKind]) -> Vec<(ProfileKind, PathBuf)> {
    if profiles.len() == 1 {
        return vec![(profiles[0], output.to_path_buf())];
    }
    profiles.iter().map(|&k| (k, with_infix(output, k.name()))).collect()
}

/// `dir/out.pb.gz` with infix `cpu` → `dir/out.cpu.pb.gz`.
pub fn with_infix(output: &Path, infix: &str) -> PathBuf {
    let name = output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (stem, ext) = match name.find('.') {
        Some(i) if i > 0 => (&name[..i], &name[i..]),
        _ => (name.as_str(), ""),
    };
    output.with_file_name(format!("{stem}.{infix}{ext}"))
}

/// Runs a recording; returns the process exit code (the command's, when one was given).
pub fn run(opts: &RecordOptions) -> anyhow::Result<i32> {
    let format = Format::resolve(opts.format.as_deref(), &opts.output).map_err(|e| UserError(e.to_string()))?;
    if opts.frequency_hz == 0 || opts.frequency_hz > 10_000 {
        return Err(UserError(format!("frequency {} Hz is out of range (1 to 10000)", opts.frequency_hz)).into());
    }
    if !opts.pids.is_empty() && !opts.command.is_empty() {
        return Err(UserError("give either -p PID or a command after --, not both".into()).into());
    }
    preflight::check_privileges()?;
    preflight::check_btf()?;
    for &pid in &opts.pids {
        target::check_pid(pid)?;
    }
    let mut opts = opts.clone();
    if opts.profiles.contains(&ProfileKind::GpuTime) {
        // Where CUPTI cannot be had, these stand in for GPU time.
        opts.profiles.extend([ProfileKind::GpuLaunches, ProfileKind::CudaApi]);
        opts.profiles.sort();
        opts.profiles.dedup();
        if opts.command.is_empty() {
            eprintln!(
                "gpuflame: gpu-time comes only from processes started with {}= gpuflame's CUPTI library (`gpuflame cupti-library PATH` writes it); the others get gpu-launches and cuda-api",
                injection::INJECTION_VAR
            );
        }
    }
    let opts = &opts;
    let mut outputs = Vec::new();
    for (kind, path) in output_paths(&opts.output, &opts.profiles) {
        match Output::open(&path) {
            Ok(out) => outputs.push((kind, out)),
            Err(e) => {
                outputs.into_iter().for_each(|(_, o): (ProfileKind, Output)| o.discard());
                return Err(UserError(e.to_string()).into());
            }
        }
    }

    let result = record(opts, format, &outputs);
    if result.is_err() {
        outputs.into_iter().for_each(|(_, o)| o.discard());
    }
    result
}

fn record(opts: &RecordOptions, format: Format, outputs: &[(ProfileKind, Output)]) -> anyhow::Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    }

    let targets = if !opts.command.is_empty() {
        Targets::Processes { pids: Vec::new(), follow_forks: true }
    } else if !opts.pids.is_empty() {
        Targets::Processes { pids: opts.pids.clone(), follow_forks: false }
    } else {
        Targets::All
    };
    let wants_cuda = opts.profiles.iter().any(|k| k.is_cuda());
    let launches = opts.profiles.iter().any(|k| matches!(k, ProfileKind::GpuLaunches | ProfileKind::CudaApi | ProfileKind::GpuTime));
    let cuda = wants_cuda.then(|| CudaOptions { launches, duty: (!opts.cuda_exact).then_some(DutyCycle { on: opts.cuda_window, ..DutyCycle::DEFAULT }) });
    let mut session = Session::start(SessionConfig {
        targets,
        frequency_hz: opts.frequency_hz,
        unwind_memory: opts.unwind_memory,
        cpu: opts.profiles.iter().any(|k| k.needs_cpu_samples()),
        off_cpu: opts.profiles.iter().any(|k| k.is_off_cpu()),
        cuda,
    })?;
    let mut ooms = OomWriter { output: opts.output.clone(), format, detail: opts.detail, count: 0 };

    let mut child = None;
    if !opts.command.is_empty() {
        let mut env = Vec::new();
        if opts.profiles.contains(&ProfileKind::GpuTime) {
            if let Some(existing) = std::env::var_os(injection::INJECTION_VAR) {
                eprintln!(
                    "gpuflame: {} is already set ({}): gpu-time comes only if that is gpuflame's library; gpu-launches and cuda-api stand in",
                    injection::INJECTION_VAR,
                    existing.to_string_lossy()
                );
            } else {
                let lib = injection::install_default().map_err(|e| UserError(format!("cannot write the CUPTI injection library: {e}")))?;
                // Hooked before the command runs: the driver loads it during cuInit and calls it
                // at once.
                if let Some(c) = session.cuda.as_mut() {
                    c.hooks.hook_path(&session.sampler, &lib);
                }
                env.push((injection::INJECTION_VAR.to_string(), lib.display().to_string()));
                if std::env::var_os(ready::WAIT_VAR).is_none() {
                    env.push((ready::WAIT_VAR.to_string(), ready::WAIT_MS.to_string()));
                }
            }
        }
        let gated = GatedChild::spawn(&opts.command, &env)?;
        session.sampler.add_target(gated.pid())?;
        child = Some(gated.release()?);
    }

    let start_wall = SystemTime::now();
    let start = Instant::now();
    let mut status = StatusLine::new();
    let mut child_status = None;
    let mut last_liveness_check = Instant::now();
    loop {
        session.pump(Duration::from_millis(100))?;
        ooms.write_all(&mut session, start_wall);
        if status.due() {
            status.show(start.elapsed(), session.aggregator.samples(), session.sampler.counters()?.lost);
        }
        if stop.load(Ordering::SeqCst) || opts.duration.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        if let Some(c) = child.as_mut() {
            if let Some(s) = c.try_wait().context("waiting for the command")? {
                child_status = Some(s);
                break;
            }
        }
        if !opts.pids.is_empty() && last_liveness_check.elapsed() >= Duration::from_millis(500) {
            last_liveness_check = Instant::now();
            if !opts.pids.iter().any(|&p| target::process_alive(p)) {
                tracing::info!("every target process has exited");
                break;
            }
        }
    }
    session.drain()?;
    ooms.write_all(&mut session, start_wall);
    let duration = start.elapsed();
    let counters = session.sampler.counters()?;
    let malformed = session.sampler.malformed_records();
    if let Some((runs, ns)) = session.sampler.sampler_run_stats().filter(|&(runs, _)| runs > 0) {
        tracing::info!(runs, avg_ns = ns / runs, "BPF sampling program cost (kernel.bpf_stats_enabled=1)");
    }
    if let Some((runs, ns)) = session.off_cpu.as_ref().and_then(|_| session.sampler.off_cpu_run_stats()).filter(|&(runs, _)| runs > 0) {
        tracing::info!(runs, avg_ns = ns / runs, "BPF context-switch program cost (kernel.bpf_stats_enabled=1)");
    }
    let sampler_capacity = session.sampler.unwind_capacity();
    status.clear();

    let samples = session.aggregator.samples();
    let processes = session.aggregator.processes();
    let complete = session.aggregator.complete_fraction();
    let off_cpu_threads_left = session.off_cpu.is_some().then(|| session.sampler.off_cpu_threads().ok()).flatten();
    let mut time_profiles = Vec::new();
    if let Some(c) = session.cuda.as_mut() {
        let coverage = c.hooks.take_coverage();
        time_profiles = c.profiles.take_profiles(&mut session.aggregator, &opts.profiles, coverage, start_wall, duration);
        report_cuda(c, coverage, &counters.cuda);
    }
    time_profiles.extend(session.take_time_profiles(&opts.profiles, start_wall, duration));
    let Session { sampler, tracker, aggregator, .. } = session;
    drop(sampler);
    let unknown_python = aggregator.unknown_python_frames();
    let mut profiles = time_profiles;
    if !opts.command.is_empty() {
        for (_, profile) in profiles.iter_mut() {
            // First, so that a subtitle cut to its length still shows it.
            profile.comments.insert(0, format!("command: {}", opts.command.join(" ")));
        }
    }
    let mut written = Vec::new();
    for (kind, out) in outputs {
        let Some((_, profile)) = profiles.iter().find(|(k, _)| k == kind) else { continue };
        let title = format!("{} · {kind}", describe_targets(opts));
        let rendering = output::Rendering { title: &title, detail: opts.detail };
        out.write_with(|w| output::write(profile, format, &rendering, w)).with_context(|| format!("writing {}", out.path().display()))?;
        written.push(out.path().display().to_string());
    }

    let failed = counters.kernel_stack_failed + counters.user_stack_failed;
    eprintln!(
        "gpuflame: {samples} samples from {processes} processes in {:.1} s ({} lost, {failed} incomplete stacks{}{}) → {} ({format})",
        duration.as_secs_f64(),
        counters.lost,
        complete.map_or(String::new(), |c| format!(", {:.1}% of user stacks complete", c * 100.0)),
        if malformed > 0 { format!(", {malformed} malformed records") } else { String::new() },
        written.join(", "),
    );
    report_unwinding(&counters, &tracker, sampler_capacity, unknown_python);
    if let Some(left) = off_cpu_threads_left {
        let o = &counters.off_cpu;
        tracing::info!(
            switches = o.switches,
            unwound = o.unwound,
            over_cpu_budget = o.over_budget,
            lost = o.lost,
            threads_full = o.threads_full,
            threads_followed = o.followed,
            threads_left = left,
            "off-CPU"
        );
        if o.lost > 0 || o.threads_full > 0 {
            tracing::warn!(lost = o.lost, threads_not_followed = o.threads_full, "some off-CPU time was not recorded: the ring buffer was full, or no state could be made for some threads");
        }
    }
    if counters.targets_full > 0 {
        tracing::warn!(count = counters.targets_full, "new processes could not be followed: the target map was full");
    }

    match (child, child_status) {
        (Some(_), Some(s)) => Ok(target::exit_code(s)),
        (Some(mut c), None) => Ok(target::exit_code(c.wait().context("waiting for the command")?)),
        _ => Ok(0),
    }
}

/// Unwind failures by reason, on request (-v), or as a warning when tables could not be loaded.
fn report_unwinding(counters: &Counters, tracker: &ProcessTracker, capacity: UnwindCapacity, unknown_python: u64) {
    let u = &counters.unwind;
    tracing::info!(
        no_process = u.no_process,
        no_mapping = u.no_mapping,
        no_row = u.no_row,
        bad_cfa = u.bad_cfa,
        read_fault = u.read_fault,
        truncated = u.truncated,
        no_table_yet = u.no_table_yet,
        no_unwind_info = u.bad_frame,
        frame_pointer_steps = u.frame_pointer_steps,
        frame_pointer_rejected = u.frame_pointer_rejected,
        scanned_frames = u.scanned_frames,
        python_after_gap = counters.python.after_gap,
        python_truncated = counters.python.truncated,
        python_unknown_frames = unknown_python,
        kernel_stack_failed = counters.kernel_stack_failed,
        "unwinding"
    );
    let t = &tracker.stats;
    tracing::info!(
        tables = t.tables_built,
        rows = t.rows_loaded,
        build_ms = t.build_time.as_millis() as u64,
        evicted = t.tables_evicted,
        evicted_for_room = t.tables_evicted_for_room,
        failures = t.table_failures,
        files_without_cfi = t.files_without_cfi,
        first_demanded_table_ms = t.first_demanded_table.map(|d| d.as_millis() as u64),
        rows_in_use = capacity.rows_used,
        rows_budget = capacity.rows_total,
        kernel_bytes = capacity.shard_bytes,
        rules = capacity.rules,
        "unwind tables"
    );
    if !t.no_room.is_empty() {
        let names: Vec<&str> = t.no_room.iter().map(String::as_str).take(5).collect();
        let more = t.no_room.len().saturating_sub(names.len());
        tracing::warn!(
            "unwind tables are full: {} file(s) did not fit in --unwind-memory {} MiB ({}{}); their stacks stop there — raise --unwind-memory",
            t.no_room.len(),
            (capacity.rows_total * gpuflame_bpf::SamplerConfig::BYTES_PER_ROW) >> 20,
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

/// Writes the in-use snapshot of each process that ran out of memory, next to the output.
struct OomWriter {
    output: PathBuf,
    format: Format,
    detail: output::Detail,
    count: u32,
}

impl OomWriter {
    fn write_all(&mut self, session: &mut Session, start: SystemTime) {
        for report in std::mem::take(&mut session.ooms) {
            let profile = CudaProfiles::oom_snapshot(&mut session.aggregator, &report, start);
            let title = format!("gpuflame: HBM in use when {} of {} failed in pid {}", report.api.symbol(), human_bytes(report.requested), report.pid);
            // The process that ran out of memory may have planted a link at its snapshot's
            // path: never written through, the next number is taken instead.
            let path_for = |n: u32| with_infix(&self.output, &format!("oom-{}-{n}", report.pid));
            let mut path = path_for(self.count + 1);
            let written = outfile::create_next(path_for, self.count + 1).and_then(|(f, p, n)| {
                self.count = n;
                path = p;
                let mut w = BufWriter::new(f);
                output::write(&profile, self.format, &output::Rendering { title: &title, detail: self.detail }, &mut w)?;
                std::io::Write::flush(&mut w)
            });
            let stack = session.aggregator.describe(&report.stack);
            let unplaced = report.stack.unplaced_frames();
            if unplaced > 0 {
                tracing::warn!(
                    pid = report.pid,
                    unplaced,
                    frames = report.stack.user.len(),
                    files_known = session.tracker.files(report.pid).map_or(0, <[_]>::len),
                    "the out-of-memory stack has frames in no known file: anonymous code, or the process's mappings were not read while it lived"
                );
            }
            match written {
                Ok(()) => eprintln!(
                    "gpuflame: out of memory in pid {} ({}): {} of {} on device {} failed holding {}; stack: {stack}; in-use snapshot → {}",
                    report.pid, report.comm, report.api.symbol(), human_bytes(report.requested), report.device, human_bytes(report.in_use), path.display()
                ),
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot write the out-of-memory snapshot"),
            }
        }
    }
}

fn report_cuda(c: &CudaState, coverage: Coverage, counters: &gpuflame_bpf::CudaCounters) {
    let h = &c.profiles.hbm.stats;
    let s = &c.hooks.stats;
    tracing::info!(
        files_hooked = s.files_hooked,
        files_searched = s.files_searched,
        attach_failures = s.attach_failures,
        max_attach_latency_ms = s.max_attach_latency.as_secs_f64() * 1e3,
        allocations = h.allocations,
        frees = h.frees,
        unknown_frees = h.unknown_frees,
        failed_allocations = h.failed_allocations,
        launches_seen = c.profiles.launches_seen,
        hooks_attached_ms = coverage.attached.as_millis() as u64,
        scale = coverage.scale(),
        "CUDA"
    );
    if h.unknown_frees > 0 {
        tracing::info!(count = h.unknown_frees, "frees of memory allocated before the hooks were attached");
    }
    tracing::info!(calls = counters.calls, lost = counters.lost, table_full = counters.table_full, races = counters.races, "CUDA hook records");
    if counters.lost > 0 || counters.table_full > 0 {
        tracing::warn!(
            lost = counters.lost,
            calls_not_followed = counters.table_full,
            "some CUDA calls were not recorded: the ring buffer or the table of calls in flight was full"
        );
    }
}

/// What a flame graph's title names: the program (the script, for an interpreter), PIDs, or the
/// machine; the whole command line goes into the subtitle.
fn describe_targets(opts: &RecordOptions) -> String {
    if !opts.command.is_empty() {
        crate::agent::service::program_name(&opts.command).unwrap_or_else(|| opts.command.join(" "))
    } else if !opts.pids.is_empty() {
        let pids: Vec<String> = opts.pids.iter().map(u32::to_string).collect();
        format!("PID {}", pids.join(", "))
    } else {
        "whole machine".into()
    }
}

