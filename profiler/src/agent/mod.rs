//! `gpuflame agent`: profiles the whole machine continuously and gives every window, one series
//! per (service, profile type), to its sinks (`sink.rs`): Pyroscope's push, a directory of pprof
//! files, or both.

pub mod config;
pub mod labels;
pub mod metrics;
mod print_config;
pub mod series;
pub mod sink;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use gpuflame_bpf::Targets;
use gpuflame_server_upload::{DropReason, PushConfig, Queue, Uploader};
use tokio::sync::watch;

use crate::cuda::DutyCycle;
use crate::session::{Flow, Oom, Session, SessionConfig};
use crate::workload::service::ServiceNamer;
use crate::workload::{kube, pods};
use crate::{preflight, UserError};
use config::{AgentArgs, AgentConfig};
use metrics::AgentMetrics;
use sink::{PprofDir, PyroscopePush, Sink};

pub fn run(args: &AgentArgs) -> anyhow::Result<i32> {
    let cfg = AgentConfig::resolve(args)?;
    if args.print_config {
        print!("{}", cfg.to_toml());
        return Ok(0);
    }
    if cfg.server.is_empty() && cfg.output_dir.is_none() {
        return Err(UserError("the agent needs --server URL (or GPUFLAME_SERVER, or server in the config file), or --output-dir DIR".into()).into());
    }
    preflight::check_privileges()?;
    preflight::check_btf()?;

    let queue = Arc::new(Queue::new(cfg.queue_bytes));
    let mut seq = 0u64;
    if let Some(dir) = &cfg.spool_dir {
        let n = queue.load_spool(dir, &mut seq).with_context(|| format!("reading the spool directory {}", dir.display()))?;
        if n > 0 {
            tracing::info!(profiles = n, dir = %dir.display(), "queued profiles spooled by an earlier run");
        }
    }
    let push = PushConfig {
        url: cfg.server.clone(),
        auth: cfg.auth.clone(),
        tenant: cfg.tenant_id.clone(),
        ca_cert: cfg.ca_cert.clone(),
        request_timeout: Duration::from_secs(10),
        backoff_initial: Duration::from_millis(500).min(cfg.max_backoff),
        backoff_max: cfg.max_backoff,
        max_attempts: cfg.max_retries,
        max_age: cfg.max_age,
    };
    let uploader = match cfg.server.is_empty() {
        true => None,
        false => Some(Uploader::new(push, Arc::clone(&queue)).map_err(|e| UserError(e.to_string()))?),
    };
    let metrics_listener = match &cfg.metrics_addr {
        Some(addr) => Some(std::net::TcpListener::bind(addr).map_err(|e| UserError(format!("cannot serve metrics on {addr}: {e}")))?),
        None => None,
    };

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).context("installing the signal handler")?;
    }
    let metrics_state = Arc::new(Mutex::new(AgentMetrics::default()));
    let (shutdown_tx, shutdown_rx) = watch::channel(None);
    let upload_thread = {
        let (state, qstats) = (Arc::clone(&metrics_state), Arc::clone(&queue.stats));
        std::thread::Builder::new().name("gpuflame-upload".into()).spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            Ok::<usize, std::io::Error>(rt.block_on(async move {
                if let Some(listener) = metrics_listener {
                    tokio::spawn(metrics::serve(listener, state, qstats));
                }
                match uploader {
                    Some(uploader) => uploader.run(shutdown_rx).await,
                    // Files only: the runtime serves the metrics until the end.
                    None => {
                        let mut shutdown = shutdown_rx;
                        let _ = shutdown.changed().await;
                        0
                    }
                }
            }))
        })?
    };

    let labels: Vec<(String, String)> = cfg.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut push = PyroscopePush { queue: &queue, seq: &mut seq, hostname: &cfg.hostname, labels: &labels };
    let mut files = cfg.output_dir.clone().map(|dir| PprofDir::new(dir, cfg.output_dir_bytes));
    let mut sinks: Vec<&mut dyn Sink> = Vec::new();
    if !cfg.server.is_empty() {
        sinks.push(&mut push);
    }
    if let Some(files) = files.as_mut() {
        sinks.push(files);
    }
    let result = profile_loop(&cfg, &stop, &mut sinks, &metrics_state);
    drop(sinks);
    let _ = shutdown_tx.send(Some(Instant::now() + cfg.shutdown_timeout));
    let remaining = match upload_thread.join() {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Err(e).context("starting the upload runtime"),
        Err(_) => anyhow::bail!("the upload thread panicked"),
    };
    let windows = result?;
    let queued = seq;
    if remaining > 0 {
        match &cfg.spool_dir {
            Some(dir) => {
                let n = queue.spool_to(dir).with_context(|| format!("spooling to {}", dir.display()))?;
                tracing::warn!(profiles = n, dir = %dir.display(), "undelivered profiles spooled for the next run");
            }
            None => {
                let n = queue.drop_all(DropReason::AtExit);
                tracing::warn!(profiles = n, "undelivered profiles dropped at exit (set --spool-dir to keep them)");
            }
        }
    }
    let s = &queue.stats;
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let m = metrics_state.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // One line, "N what" between commas, so that scripts can read it.
    eprintln!(
        "gpuflame agent: {windows} windows, {queued} profiles queued, {} pushed, {} failed, {} dropped, {} retries, \
         {} dropped queue full, {} dropped retries exhausted, {} dropped too old, {} dropped at exit, \
         {} profiles trimmed, {} stacks trimmed, {} kernel samples left out{}",
        n(&s.pushed),
        n(&s.failed),
        n(&s.dropped),
        n(&s.retries),
        n(&s.dropped_queue_full),
        n(&s.dropped_retries),
        n(&s.dropped_too_old),
        n(&s.dropped_at_exit),
        m.series.trimmed_profiles,
        m.series.trimmed_stacks,
        m.series.kernel_samples_left_out,
        files.map(|f| format!(", {} files written, {} files failed", f.written(), f.failed)).unwrap_or_default(),
    );
    Ok(0)
}

/// Samples in windows until stopped; returns the number of windows.
fn profile_loop(cfg: &AgentConfig, stop: &AtomicBool, sinks: &mut [&mut dyn Sink], metrics: &Mutex<AgentMetrics>) -> anyhow::Result<u64> {
    let mut namer = ServiceNamer::new(cfg.service_name_from, cfg.service_names.clone());
    // In a Kubernetes pod (the DaemonSet): this node's pods name and label their processes.
    match kube::KubeConfig::from_env(&cfg.hostname) {
        None => {}
        Some(Err(e)) => tracing::warn!(error = %e, "in Kubernetes, but without the pod's service account; pods are labelled from their cgroups only"),
        Some(Ok(kube_cfg)) => {
            let pods = pods::Pods::default();
            let node = kube_cfg.node.clone();
            match kube::spawn_watcher(kube_cfg, pods.clone()) {
                Ok(()) => namer = namer.with_pods(pods, node),
                Err(e) => tracing::warn!(error = %e, "cannot start the Kubernetes watcher; pods are labelled from their cgroups only"),
            }
        }
    }
    let mut session = Session::start(SessionConfig {
        targets: Targets::All,
        frequency_hz: cfg.frequency_hz,
        unwind_memory: cfg.unwind_memory << 20,
        profiles: cfg.profiles.clone(),
        cuda_duty: Some(DutyCycle::DEFAULT),
        rank_labels: cfg.rank_labels.clone(),
        memory_timeline: false,
        tensor_sample_bytes: cfg.tensor_sample_bytes,
        max_live_allocations: cfg.max_live_allocations,
        tensors_by_hooks: cfg.profiles_asked,
        service_names: Some(namer),
        check_unwinder: false,
        thread_reports: false,
    })?;
    let mut to: Vec<String> = Vec::new();
    if !cfg.server.is_empty() {
        to.push(gpuflame_server_upload::redact_url(&cfg.server));
    }
    if let Some(dir) = &cfg.output_dir {
        to.push(format!("{} (pprof files)", dir.display()));
    }
    eprintln!("gpuflame agent: profiling the whole machine ({} processes) at {} Hz, every {} s to {}", session.processes().tracked(), cfg.frequency_hz, cfg.window.as_secs_f64(), to.join(" and "));
    let options = series::Options {
        thread_names: cfg.thread_names,
        device: cfg.device_label,
        pid_labels: cfg.pid_labels,
        kernel_threads: cfg.kernel_threads,
        max_samples: series::MAX_SAMPLES,
        max_bytes: series::MAX_PROFILE_BYTES,
    };
    let mut stats = series::Stats::default();
    let run_id = format!("{:x}", SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
    let mut windows = 0u64;
    let mut total_samples = 0u64;
    let mut last_metrics = Instant::now();
    let mut ooms = Vec::new();
    loop {
        // The longest a record waited in the ring before it was read, this window so far.
        let mut ring_lag = Duration::ZERO;
        let window = session.window(Some(cfg.window), |session| {
            ooms.extend(log_ooms(session));
            ring_lag = ring_lag.max(session.programs().take_ring_lag());
            let stopping = stop.load(Ordering::SeqCst);
            if stopping || last_metrics.elapsed() >= Duration::from_secs(1) {
                last_metrics = Instant::now();
                let mut m = metrics.lock().unwrap_or_else(|p| p.into_inner());
                m.samples = total_samples + session.samples_in_window();
                m.counters = session.programs().counters()?;
                m.capacity = session.programs().unwind_capacity();
                m.windows = windows;
                m.processes_tracked = session.processes().tracked();
                let tracking = session.processes().tracking_stats();
                m.maps_read = tracking.maps_read;
                m.maps_reads_saved = tracking.reads_saved;
                m.functions_from_prologues = tracking.functions_from_prologues as u64;
                m.series = stats;
                m.ranks = session.rank_stats();
                m.late = session.late_stats();
                m.waiting = session.waiting_stats();
                m.ring_lag = ring_lag;
                let sources = session.source_stats();
                m.devices = sources.devices;
                m.tensors = sources.tensors;
            }
            Ok(if stopping { Flow::Stop } else { Flow::Continue })
        })?;
        ooms.extend(log_ooms(&mut session));
        total_samples += window.stats.samples;
        let id = format!("{run_id}-{windows}");
        windows += 1;
        let mut services = session.service_names().context("the agent's session names services")?;
        // What was in use when memory ran out, by stack, with the failing call: a profile type
        // of its own, found in Grafana beside the process's other series.
        for oom in ooms.drain(..) {
            for s in series::split(&oom.snapshot, &mut services, &options, &mut stats) {
                sinks.iter_mut().for_each(|sink| sink.series(&s, MEMORY_AT_OOM, &id));
            }
        }
        for (kind, profile) in &window.profiles {
            for s in series::split(profile, &mut services, &options, &mut stats) {
                sinks.iter_mut().for_each(|sink| sink.series(&s, kind.descriptor().pyroscope, &id));
            }
        }
        metrics.lock().unwrap_or_else(|p| p.into_inner()).series = stats;
        if window.stopped || cfg.once {
            return Ok(windows);
        }
    }
}

/// The series name of the in-use snapshot of an out-of-memory failure.
pub const MEMORY_AT_OOM: &str = "memory_at_oom";

/// The agent writes no files: an out-of-memory failure is a warning with its stack, and its
/// snapshot is pushed (returned here) as a series of its own.
fn log_ooms(session: &mut Session) -> Vec<Oom> {
    let ooms = session.take_ooms();
    for oom in &ooms {
        let r = &oom.report;
        let holders: Vec<String> = oom.holders.iter().map(|(bytes, label, _)| format!("{} {label}", crate::cuda::human_bytes(*bytes))).collect();
        tracing::warn!(
            pid = r.pid,
            comm = %r.comm,
            requested = r.requested,
            in_use = r.in_use,
            device = r.device,
            memory = %r.usage,
            holders = %holders.join("; "),
            stack = %oom.stack,
            "out of memory: {} failed",
            r.failed_call()
        );
    }
    ooms
}
