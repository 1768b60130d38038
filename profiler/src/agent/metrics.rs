//! Prometheus text metrics of the agent itself, served on --metrics-addr.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use gpuflame_bpf::{Counters, UnwindCapacity};
use gpuflame_server_upload::QueueStats;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the profiling loop last reported.
#[derive(Debug, Default, Clone)]
pub struct AgentMetrics {
    pub samples: u64,
    pub counters: Counters,
    pub capacity: UnwindCapacity,
    pub windows: u64,
    pub processes_tracked: usize,
    /// Reads of processes' maps, and new programs that exited before one was needed.
    pub maps_read: u64,
    pub maps_reads_saved: u64,
    /// Functions without CFI unwound with rows made from their prologues.
    pub functions_from_prologues: u64,
    pub series: super::series::Stats,
    pub ranks: crate::workload::rank::RankStats,
    /// Samples copied where a table was missing: finished, given up, held now.
    pub late: crate::session::LateStats,
    /// The longest a record waited in the samples ring before it was read, this window so far.
    pub ring_lag: std::time::Duration,
    /// Threads waiting at the windows' ends, and their stacks read where they lie.
    pub waiting: crate::session::WaitingStats,
    /// Reserved against allocated per device.
    pub devices: Vec<crate::cuda::memory::DeviceUse>,
    pub tensors: crate::cuda::hbm::HbmStats,
}

pub fn render(m: &AgentMetrics, q: &QueueStats) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, values: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in values {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let u = &m.counters.unwind;
    metric("gpuflame_samples_total", "counter", "CPU samples taken in BPF.", &[("", m.counters.samples)]);
    metric("gpuflame_samples_aggregated_total", "counter", "CPU samples that reached user space.", &[("", m.samples)]);
    metric("gpuflame_samples_lost_total", "counter", "Samples dropped because the ring buffer was full.", &[("", m.counters.lost)]);
    metric(
        "gpuflame_unwind_errors_total",
        "counter",
        "User stacks that ended before their outermost frame, by reason.",
        &[
            ("{reason=\"no_process\"}", u.no_process),
            ("{reason=\"no_mapping\"}", u.no_mapping),
            ("{reason=\"no_row\"}", u.no_row),
            ("{reason=\"bad_cfa\"}", u.bad_cfa),
            ("{reason=\"read_fault\"}", u.read_fault),
            ("{reason=\"truncated\"}", u.truncated),
        ],
    );
    metric("gpuflame_kernel_stack_errors_total", "counter", "Kernel stack reads that failed.", &[("", m.counters.kernel_stack_failed)]);
    // Every counter of the BPF programs, from the one list that declares them (bpf/src/counters.rs).
    let bpf: Vec<(String, u64)> = m.counters.named().into_iter().map(|(name, v)| (format!("{{counter=\"{name}\"}}"), v)).collect();
    let bpf: Vec<(&str, u64)> = bpf.iter().map(|(l, v)| (l.as_str(), *v)).collect();
    metric("gpuflame_bpf_counter_total", "counter", "The BPF programs' counters, by name (group.field).", &bpf);
    let l = &m.late;
    metric(
        "gpuflame_late_stacks_total",
        "counter",
        "CPU samples whose stack BPF copied where a table was missing: finished once it came, sent on cut (it did not come in 10 s, or 64 MiB of stacks were waiting).",
        &[("{outcome=\"finished\"}", l.finished), ("{outcome=\"gave_up\"}", l.gave_up), ("{outcome=\"not_held\"}", l.turned_away)],
    );
    metric("gpuflame_late_stack_bytes", "gauge", "Bytes of copied stacks waiting for their tables.", &[("", l.waiting_bytes)]);
    metric(
        "gpuflame_ring_lag_milliseconds",
        "gauge",
        "The longest any record waited in the samples ring before gpuflame read it, this window so far: how far behind a starved agent fell (records are lost once the ring is full: gpuflame_samples_lost_total and the cuda.lost counter).",
        &[("", m.ring_lag.as_millis() as u64)],
    );
    let w = &m.waiting;
    metric(
        "gpuflame_waiting_stacks_total",
        "counter",
        "Stacks of threads waiting at a window's end that the switch program had not unwound, read from user space: read (whole or not), and deferred to a later window for want of time.",
        &[("{outcome=\"read\"}", w.stacks_read), ("{outcome=\"whole\"}", w.stacks_whole), ("{outcome=\"deferred\"}", w.deferred)],
    );
    metric(
        "gpuflame_window_end_threads_milliseconds",
        "gauge",
        "How long the last report of the threads at a window's end took (task iterator and stack reads).",
        &[("", w.last_pass.as_millis() as u64)],
    );
    metric("gpuflame_windows_total", "counter", "Profile windows completed.", &[("", m.windows)]);
    metric("gpuflame_profiles_pushed_total", "counter", "Push requests delivered.", &[("", q.pushed.load(Ordering::Relaxed))]);
    metric("gpuflame_profiles_failed_total", "counter", "Push requests the server refused (4xx).", &[("", q.failed.load(Ordering::Relaxed))]);
    metric("gpuflame_profiles_dropped_total", "counter", "Push requests dropped, all reasons.", &[("", q.dropped.load(Ordering::Relaxed))]);
    metric(
        "gpuflame_profiles_dropped_by_reason_total",
        "counter",
        "Push requests dropped: queue bound reached, retried as often as allowed, too old to retry, undelivered at exit.",
        &[
            ("{reason=\"queue_full\"}", q.dropped_queue_full.load(Ordering::Relaxed)),
            ("{reason=\"retries_exhausted\"}", q.dropped_retries.load(Ordering::Relaxed)),
            ("{reason=\"too_old\"}", q.dropped_too_old.load(Ordering::Relaxed)),
            ("{reason=\"at_exit\"}", q.dropped_at_exit.load(Ordering::Relaxed)),
        ],
    );
    metric("gpuflame_profiles_trimmed_total", "counter", "Profiles that lost their smallest stacks to fit Pyroscope's limits.", &[("", m.series.trimmed_profiles)]);
    metric("gpuflame_stacks_trimmed_total", "counter", "Stacks merged into one [trimmed] stack to fit Pyroscope's limits.", &[("", m.series.trimmed_stacks)]);
    metric("gpuflame_kernel_samples_left_out_total", "counter", "Samples of kernel threads left out (--no-kernel-threads).", &[("", m.series.kernel_samples_left_out)]);
    let r = &m.ranks;
    metric("gpuflame_rank_environments_read_total", "counter", "Process environments read for rank labels (once a process, again after exec).", &[("", r.environments_read)]);
    metric("gpuflame_rank_processes_labelled_total", "counter", "Environments read that gave rank labels.", &[("", r.processes_labelled)]);
    metric("gpuflame_rank_values_left_out_total", "counter", "Values of rank variables left out: not a decimal integer of at most 9 digits.", &[("", r.values_left_out)]);
    metric("gpuflame_rank_environments_unreadable_total", "counter", "Environments that could not be read (the process was gone, or access denied): no rank labels.", &[("", r.unreadable)]);
    metric("gpuflame_rank_environments_cut_total", "counter", "Environments read only in part, up to 8 MiB.", &[("", r.cut)]);
    metric("gpuflame_push_retries_total", "counter", "Push attempts that will be retried.", &[("", q.retries.load(Ordering::Relaxed))]);
    metric("gpuflame_queue_bytes", "gauge", "Bytes waiting in the upload queue.", &[("", q.bytes.load(Ordering::Relaxed))]);
    metric("gpuflame_queue_bytes_max", "gauge", "Most bytes the upload queue has held.", &[("", q.max_bytes_seen.load(Ordering::Relaxed))]);
    metric(
        "gpuflame_bpf_map_entries",
        "gauge",
        "BPF map use: unwind rows in use and their capacity.",
        &[("{map=\"unwind_rows\",kind=\"used\"}", m.capacity.rows_used), ("{map=\"unwind_rows\",kind=\"capacity\"}", m.capacity.rows_total)],
    );
    metric("gpuflame_processes_tracked", "gauge", "Processes whose unwind tables are loaded.", &[("", m.processes_tracked as u64)]);
    metric("gpuflame_process_maps_read_total", "counter", "Reads of a process's /proc/PID/maps.", &[("", m.maps_read)]);
    metric(
        "gpuflame_unwind_functions_from_prologues_total",
        "counter",
        "Functions without unwind information (hand-written kernels) unwound with rows made from their prologues.",
        &[("", m.functions_from_prologues)],
    );
    metric(
        "gpuflame_process_maps_reads_saved_total",
        "counter",
        "New programs that exited before their maps were needed, and were never read (at low frequencies).",
        &[("", m.maps_reads_saved)],
    );
    let per_device = |f: &dyn Fn(&crate::cuda::memory::DeviceUse) -> Option<u64>| -> Vec<(String, u64)> {
        m.devices.iter().filter_map(|d| f(d).map(|v| (format!("{{device=\"{}\"}}", d.device), v))).collect()
    };
    for (name, help, values) in [
        ("gpuflame_hbm_reserved_bytes", "Device memory PyTorch's caching allocator holds in segments (all segments where no allocator is seen), per device, in the processes profiled.", per_device(&|d| Some(d.reserved))),
        ("gpuflame_hbm_allocated_bytes", "Device memory live tensors hold, per device (where PyTorch's caching allocator is followed).", per_device(&|d| d.allocated)),
        ("gpuflame_hbm_cached_bytes", "Reserved but held by no tensor: the allocator's cache, per device.", per_device(&|d| d.cached())),
        ("gpuflame_hbm_outside_allocator_bytes", "Device memory allocated outside PyTorch's caching allocator (NCCL, workspaces, raw CUDA), per device.", per_device(&|d| d.allocator_seen().then_some(d.outside))),
    ] {
        let values: Vec<(&str, u64)> = values.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric(name, "gauge", help, &values);
    }
    metric(
        "gpuflame_tensor_frees_unknown_total",
        "counter",
        "Frees of tensors allocated before the agent attached: their bytes are unknown.",
        &[("", m.tensors.unknown_frees)],
    );
    out
}

/// Answers every HTTP request on `listener` with the metrics.
pub async fn serve(listener: std::net::TcpListener, state: Arc<Mutex<AgentMetrics>>, queue: Arc<QueueStats>) {
    let listener = match listener.set_nonblocking(true).and_then(|()| tokio::net::TcpListener::from_std(listener)) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "metrics endpoint");
            return;
        }
    };
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let body = {
            let m = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
            render(&m, &queue)
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn.read(&mut buf)).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(response.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bpf_counter_is_exported_by_name() {
        let mut m = AgentMetrics::default();
        m.counters.unwind.no_row = 7;
        m.counters.off_cpu.switches = 3;
        let text = render(&m, &QueueStats::default());
        for (name, _) in m.counters.named() {
            assert!(text.contains(&format!("gpuflame_bpf_counter_total{{counter=\"{name}\"}} ")), "{name} missing:\n{text}");
        }
        assert!(text.contains("gpuflame_bpf_counter_total{counter=\"unwind.no_row\"} 7"), "{text}");
        assert!(text.contains("gpuflame_bpf_counter_total{counter=\"off_cpu.switches\"} 3"), "{text}");
    }

    #[test]
    fn reserved_against_allocated_is_exported_per_device() {
        use crate::cuda::memory::DeviceUse;
        let devices = vec![
            DeviceUse { device: 0, reserved: 300, allocated: Some(250), outside: 8 },
            DeviceUse { device: 1, reserved: 40, allocated: None, outside: 0 },
        ];
        let m = AgentMetrics { devices, ..Default::default() };
        let text = render(&m, &QueueStats::default());
        for line in [
            "gpuflame_hbm_reserved_bytes{device=\"0\"} 300",
            "gpuflame_hbm_reserved_bytes{device=\"1\"} 40",
            "gpuflame_hbm_allocated_bytes{device=\"0\"} 250",
            "gpuflame_hbm_cached_bytes{device=\"0\"} 50",
            "gpuflame_hbm_outside_allocator_bytes{device=\"0\"} 8",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        // Where no allocator was seen there is no allocated, cached or outside figure.
        assert!(!text.contains("gpuflame_hbm_allocated_bytes{device=\"1\"}") && !text.contains("gpuflame_hbm_cached_bytes{device=\"1\"}"), "{text}");
    }

    #[test]
    fn rank_counts_are_exported() {
        let ranks = crate::workload::rank::RankStats { environments_read: 5, processes_labelled: 4, values_left_out: 3, unreadable: 2, cut: 1 };
        let m = AgentMetrics { ranks, ..Default::default() };
        let text = render(&m, &QueueStats::default());
        for line in [
            "gpuflame_rank_environments_read_total 5",
            "gpuflame_rank_processes_labelled_total 4",
            "gpuflame_rank_values_left_out_total 3",
            "gpuflame_rank_environments_unreadable_total 2",
            "gpuflame_rank_environments_cut_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }
}
