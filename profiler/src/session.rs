//! A sampling session: the BPF sampler, the process tracker that keeps its unwind tables current,
//! and the aggregator, fed in one loop. `record` runs one for a recording, `agent` forever.

use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfError, CpuSampler, Event, SamplerConfig, Targets};

use crate::aggregate::CpuAggregator;
use crate::process::ProcessTracker;
use crate::UserError;

pub struct Session {
    pub sampler: CpuSampler,
    pub tracker: ProcessTracker,
    pub aggregator: CpuAggregator,
    pub frequency_hz: u64,
}

impl Session {
    /// Loads the programs, the unwind tables of the processes that run now (all of them when
    /// `targets` is the whole machine), then starts sampling.
    pub fn start(targets: Targets, frequency_hz: u64, unwind_rows: u64) -> anyhow::Result<Self> {
        let preload: Option<Vec<u32>> = match &targets {
            Targets::All => None,
            Targets::Processes { pids, .. } => Some(pids.clone()),
        };
        let config = SamplerConfig { frequency_hz, targets, unwind_rows };
        let mut sampler = CpuSampler::start(&config).map_err(user_facing)?;
        let mut tracker = ProcessTracker::new();
        let started = Instant::now();
        match preload {
            None => tracker.refresh_all(&mut sampler),
            Some(pids) => pids.iter().for_each(|&pid| tracker.refresh(&mut sampler, pid)),
        }
        tracing::info!(
            processes = tracker.processes(),
            tables = tracker.stats.tables_built,
            rows = tracker.stats.rows_loaded,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "unwind tables loaded"
        );
        sampler.enable(frequency_hz)?;
        Ok(Session { sampler, tracker, aggregator: CpuAggregator::new(), frequency_hz })
    }

    /// Waits up to `timeout` for events and handles them.
    pub fn pump(&mut self, timeout: Duration) -> Result<(), BpfError> {
        let events = self.sampler.poll(timeout)?;
        self.handle(events);
        Ok(())
    }

    /// Handles whatever is already in the buffers.
    pub fn drain(&mut self) -> Result<(), BpfError> {
        let events = self.sampler.drain()?;
        self.handle(events);
        Ok(())
    }

    fn handle(&mut self, events: Vec<Event>) {
        for event in events {
            match event {
                Event::Sample(sample) => self.aggregator.add(&sample, self.tracker.files(sample.pid), self.tracker.python(sample.pid)),
                Event::Process(ev) => self.tracker.handle(&mut self.sampler, ev),
            }
        }
    }
}

/// BPF failures that the user can act on become one-line usage errors.
pub fn user_facing(e: BpfError) -> anyhow::Error {
    match e {
        BpfError::PermissionDenied | BpfError::NoBtf(_) => UserError(e.to_string()).into(),
        other => other.into(),
    }
}
