//! `gpuflame record`: one window of a session, written to files.

mod command_files;
mod hint;
mod report;

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gpuflame_bpf::Targets;

use crate::cuda::{human_bytes, injection, ready, DutyCycle};
use crate::outfile::{self, Output};
use crate::output::{self, Format};
use crate::profile_kind::ProfileKind;
use crate::session::{Flow, Oom, Session, SessionConfig};
use crate::status::StatusLine;
use crate::target::{self, GatedChild};
use crate::workload::rank::RankLabels;
use crate::{preflight, UserError};

/// How long a command waits for the tables of its files before it runs regardless (their builds
/// go on, and its first samples wait for them).
const PRELOAD_WAIT: Duration = Duration::from_secs(10);

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
    /// The labels read from each process's environment (its rank in a job).
    pub rank_labels: RankLabels,
    /// `--memory-timeline`: None for the default.
    pub memory_timeline: Option<PathBuf>,
    /// Byte sampling of tensors' stacks: the interval, 0 for every stack.
    pub tensor_sample_bytes: u64,
    /// The live set's bound (`SamplerConfig::max_live_allocations`).
    pub max_live_allocations: u32,
    /// `--check-unwinder` (tests).
    pub check_unwinder: bool,
}

impl RecordOptions {
    /// Where the memory timeline goes, if one is drawn.
    pub fn memory_timeline_path(&self) -> Option<PathBuf> {
        match &self.memory_timeline {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(p.clone()),
            None => self
                .profiles
                .iter()
                .any(|k| ProfileKind::MEMORY.contains(k))
                .then(|| self.output.with_file_name(format!("{}.memory-timeline.svg", name_parts(&self.output).0))),
        }
    }
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
    let (stem, ext) = name_parts(output);
    output.with_file_name(format!("{stem}.{infix}{ext}"))
}

/// `dir/out.pb.gz` → (`out`, `.pb.gz`).
fn name_parts(output: &Path) -> (String, String) {
    let name = output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.find('.') {
        Some(i) if i > 0 => (name[..i].to_string(), name[i..].to_string()),
        _ => (name, String::new()),
    }
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
    if opts.profiles.contains(&ProfileKind::CollectiveTime) && opts.command.is_empty() {
        eprintln!(
            "gpuflame: collective-time comes only from processes started with {}= gpuflame's CUPTI library (`gpuflame cupti-library PATH` writes it); the collectives profile counts the calls of the others",
            injection::INJECTION_VAR
        );
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

    match record(opts, format, &outputs) {
        Ok((code, written)) => {
            // A profile this kernel could not run was said so: no empty file stands for it.
            outputs.into_iter().filter(|(k, _)| !written.contains(k)).for_each(|(_, o)| o.discard());
            Ok(code)
        }
        Err(e) => {
            outputs.into_iter().for_each(|(_, o)| o.discard());
            Err(e)
        }
    }
}

/// Records and writes the outputs; the exit code and the profiles written.
fn record(opts: &RecordOptions, format: Format, outputs: &[(ProfileKind, Output)]) -> anyhow::Result<(i32, Vec<ProfileKind>)> {
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
    let mut session = Session::start(SessionConfig {
        targets,
        frequency_hz: opts.frequency_hz,
        unwind_memory: opts.unwind_memory,
        profiles: opts.profiles.clone(),
        cuda_duty: (!opts.cuda_exact).then_some(DutyCycle { on: opts.cuda_window, ..DutyCycle::DEFAULT }),
        rank_labels: opts.rank_labels.clone(),
        memory_timeline: opts.memory_timeline_path().is_some(),
        tensor_sample_bytes: opts.tensor_sample_bytes,
        max_live_allocations: opts.max_live_allocations,
        tensors_by_hooks: true,
        service_names: None,
        check_unwinder: opts.check_unwinder,
        thread_reports: false,
    })?;
    let mut ooms = OomWriter { output: opts.output.clone(), format, detail: opts.detail, count: 0 };
    let mut child = start_command(opts, &mut session)?;

    let start = Instant::now();
    let mut status = StatusLine::new();
    let mut child_status = None;
    let mut last_liveness_check = Instant::now();
    let window = session.window(opts.duration, |session| {
        ooms.write_all(session);
        if status.due() {
            status.show(start.elapsed(), session.samples_in_window(), session.programs().counters()?.lost);
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(Flow::Stop);
        }
        if let Some(c) = child.as_mut() {
            if let Some(s) = c.try_wait().context("waiting for the command")? {
                child_status = Some(s);
                return Ok(Flow::Stop);
            }
        }
        if !opts.pids.is_empty() && last_liveness_check.elapsed() >= Duration::from_millis(500) {
            last_liveness_check = Instant::now();
            if !opts.pids.iter().any(|&p| target::process_alive(p)) {
                tracing::info!("every target process has exited");
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    })?;
    ooms.write_all(&mut session);
    status.clear();
    let end = report::End::of(&session, &window)?;
    let timeline = opts.memory_timeline_path().map(|path| (path, session.memory_timeline()));
    drop(session);

    let head = report::recorded(&window.stats, &window.profiles);
    let mut profiles = window.profiles;
    if !opts.command.is_empty() {
        for (_, profile) in profiles.iter_mut() {
            // First, so that a subtitle cut to its length still shows it.
            profile.comments.insert(0, format!("command: {}", opts.command.join(" ")));
        }
    }
    let mut written = Vec::new();
    let mut kinds_written = Vec::new();
    for (kind, out) in outputs {
        let Some((_, profile)) = profiles.iter().find(|(k, _)| k == kind) else { continue };
        kinds_written.push(*kind);
        let title = format!("{} · {kind}", describe_targets(opts));
        let rendering = output::Rendering { title: &title, detail: opts.detail };
        out.write_with(|w| output::write(profile, format, &rendering, w)).with_context(|| format!("writing {}", out.path().display()))?;
        written.push(out.path().display().to_string());
    }
    if let Some((path, charts)) = timeline {
        if charts.is_empty() {
            tracing::info!("no device memory was allocated: no memory timeline");
        } else {
            let title = format!("gpuflame: device memory over time · {}", describe_targets(opts));
            match Output::open(&path) {
                Ok(out) => {
                    out.write_with(|w| output::memory_svg::write_svg(&charts, &title, w)).with_context(|| format!("writing {}", path.display()))?;
                    written.push(path.display().to_string());
                }
                Err(e) => tracing::warn!(error = %e, "cannot write the memory timeline"),
            }
        }
    }
    end.report(&head, &window.stats, window.duration, format, &written);
    let recorded = match (opts.command.is_empty(), opts.pids.is_empty()) {
        (false, _) => hint::Recorded::Command,
        (true, false) => hint::Recorded::Pids,
        (true, true) => hint::Recorded::Machine,
    };
    if let Some(hint) = hint::idle_hint(recorded, window.stats.program_samples, window.duration, opts.frequency_hz, &opts.profiles) {
        eprintln!("gpuflame: {hint}");
    }

    let code = match (child, child_status) {
        (Some(_), Some(s)) => target::exit_code(s),
        (Some(mut c), None) => target::exit_code(c.wait().context("waiting for the command")?),
        _ => 0,
    };
    Ok((code, kinds_written))
}

/// Starts the command after `--`, if there is one, held until the session follows it.
fn start_command(opts: &RecordOptions, session: &mut Session) -> anyhow::Result<Option<std::process::Child>> {
    if opts.command.is_empty() {
        return Ok(None);
    }
    let mut env = Vec::new();
    if crate::profile_kind::needs_of(&opts.profiles).cupti {
        if let Some(existing) = std::env::var_os(injection::INJECTION_VAR) {
            eprintln!(
                "gpuflame: {} is already set ({}): gpu-time and collective-time come only if that is gpuflame's library; gpu-launches, cuda-api and collectives stand in",
                injection::INJECTION_VAR,
                existing.to_string_lossy()
            );
        } else {
            let lib = injection::install_default().map_err(|e| UserError(format!("cannot write the CUPTI injection library: {e}")))?;
            // Hooked before the command runs: the driver loads it during cuInit and calls it
            // at once.
            session.hook_library(&lib);
            env.push((injection::INJECTION_VAR.to_string(), lib.display().to_string()));
            if std::env::var_os(ready::WAIT_VAR).is_none() {
                env.push((ready::WAIT_VAR.to_string(), ready::WAIT_MS.to_string()));
            }
            // Exact asks for every launch's stack; the library passes a sample of them otherwise.
            if opts.cuda_exact && std::env::var_os(injection::LAUNCH_RATE_VAR).is_none() {
                env.push((injection::LAUNCH_RATE_VAR.to_string(), "0".to_string()));
            }
        }
    }
    let gated = GatedChild::spawn(&opts.command, &env)?;
    session.add_target(gated.pid())?;
    // The tables of what the command maps first, in before it runs: its stacks are whole from
    // its first sample, not from the first read of its maps.
    let started = Instant::now();
    let files = command_files::command_files(&opts.command, &env);
    let ready = session.preload(gated.pid(), &files, PRELOAD_WAIT);
    tracing::debug!(files = files.len(), ready, ms = started.elapsed().as_millis() as u64, "the command's tables built before it runs");
    Ok(Some(gated.release()?))
}

/// Writes the in-use snapshot of each process that ran out of memory, next to the output.
struct OomWriter {
    output: PathBuf,
    format: Format,
    detail: output::Detail,
    count: u32,
}

impl OomWriter {
    fn write_all(&mut self, session: &mut Session) {
        for Oom { report, snapshot: profile, stack, holders } in session.take_ooms() {
            let title = format!("gpuflame: HBM in use when {} of {} failed in pid {}", report.failed_call(), human_bytes(report.requested), report.pid);
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
            let unplaced = report.stack.unplaced_frames();
            if unplaced > 0 {
                tracing::warn!(
                    pid = report.pid,
                    unplaced,
                    frames = report.stack.user.len(),
                    files_known = session.processes().files_known(report.pid),
                    "the out-of-memory stack has frames in no known file: anonymous code, or the process's mappings were not read while it lived"
                );
            }
            match written {
                Ok(()) => {
                    eprintln!(
                        "gpuflame: out of memory in pid {} ({}): {} of {} on device {} failed holding {}; {}; stack: {stack}; in-use snapshot → {}",
                        report.pid,
                        report.comm,
                        report.failed_call(),
                        human_bytes(report.requested),
                        report.device,
                        human_bytes(report.in_use),
                        report.usage,
                        path.display()
                    );
                    if let Some((allocated, reserved)) = report.allocator_says {
                        eprintln!("gpuflame:   PyTorch's allocator says: allocated {}, reserved {}", human_bytes(allocated), human_bytes(reserved));
                    }
                    for (bytes, label, whole) in &holders {
                        eprintln!("gpuflame:   {:>10} held by {label}   [{whole}]", human_bytes(*bytes));
                    }
                }
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot write the out-of-memory snapshot"),
            }
        }
    }
}

/// What a flame graph's title names: the program (the script, for an interpreter), PIDs, or the
/// machine; the whole command line goes into the subtitle.
fn describe_targets(opts: &RecordOptions) -> String {
    if !opts.command.is_empty() {
        crate::workload::service::program_name(&opts.command).unwrap_or_else(|| opts.command.join(" "))
    } else if !opts.pids.is_empty() {
        let pids: Vec<String> = opts.pids.iter().map(u32::to_string).collect();
        format!("PID {}", pids.join(", "))
    } else {
        "whole machine".into()
    }
}

