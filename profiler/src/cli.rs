//! Command-line interface, modelled on perf record and py-spy record.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub use crate::process::MAX_UNWIND_MIB;
use crate::profile_kind::{overview_help, profiles_help, profiles_long_help};
use crate::record::{RecordOptions, DEFAULT_FREQUENCY_HZ};

/// The longest `record -d`: a year. Without -d a recording runs until Ctrl-C.
pub const MAX_DURATION_S: f64 = 365.0 * 86400.0;

#[derive(Parser, Debug)]
#[command(
    name = "gpuflame",
    version,
    about = "Continuous profiler for AI infrastructure (eBPF): CPU, off-CPU and wall time, GPU time and launches, \
             CUDA API time, HBM and tensors in use, NCCL collectives and out-of-memory reports, by stack \
             (Python lines included), of whole machines, processes and commands",
    after_help = overview_help()
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Directory of separate debug files, laid out like /usr/lib/debug (.build-id/xx/rest.debug
    /// and debug-link targets); repeatable. Debuginfod servers come from DEBUGINFOD_URLS.
    #[arg(long = "debug-dir", value_name = "DIR", global = true, env = "GPUFLAME_DEBUG_DIR", value_delimiter = ':', default_value = "/usr/lib/debug")]
    pub debug_dirs: Vec<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Record profiles (CPU by default; off-CPU, GPU time, HBM, tensors… with --profiles) of the
    /// whole machine, of processes, or of a command.
    #[command(after_help = "Examples:
  gpuflame record -d 10 -o flame.svg               whole machine for 10 s, flame graph
  gpuflame record -p 1234 -p 5678 -o cpu.pb.gz     two processes until Ctrl-C, pprof
  gpuflame record -F 199 -o out.folded -- python3 train.py
                                                   a command and its children, folded stacks
  gpuflame record --profiles cpu,hbm-inuse,gpu-launches -o prof.svg -- python3 train.py
                                                   CPU, HBM in use and kernel launches: prof.cpu.svg,
                                                   prof.hbm-inuse.svg, prof.gpu-launches.svg

The output format follows the extension (.svg, .pb.gz/.pprof, .folded/.txt) unless --format says.
Ctrl-C stops the recording early and still writes the output. Needs root (or CAP_BPF + CAP_PERFMON).")]
    Record(RecordArgs),
    /// Profile the whole machine continuously and push every window to Pyroscope (or write it as
    /// pprof files).
    #[command(after_help = "Examples:
  gpuflame agent --server http://pyroscope:4040
  gpuflame agent --server https://profiles.example.com --tenant-id team-a \\
      --basic-auth-user agent --basic-auth-password-file /etc/gpuflame/password --label cluster=gpu-a
  gpuflame agent --config /etc/gpuflame/agent.toml --print-config

Secrets come from GPUFLAME_BASIC_AUTH_PASSWORD, GPUFLAME_BEARER_TOKEN, or files; a process names
its own service by setting GPUFLAME_SERVICE_NAME in its environment.")]
    Agent(Box<crate::agent::config::AgentArgs>),
    /// Write gpuflame's CUPTI injection library, for services to be started with
    /// CUDA_INJECTION64_PATH set to it (the gpu-time profile of processes gpuflame did not start).
    #[command(after_help = "Example:
  gpuflame cupti-library /opt/gpuflame/libgpuflame_cupti.so
  CUDA_INJECTION64_PATH=/opt/gpuflame/libgpuflame_cupti.so python3 -m vllm.entrypoints.openai.api_server …
  gpuflame record --profiles gpu-time -p $(pgrep -f vllm) -o gpu.svg")]
    CuptiLibrary {
        /// Where to write the library.
        path: PathBuf,
    },
    /// Convert a pprof or folded profile into pprof, folded stacks or an SVG flame graph.
    #[command(after_help = "Examples:
  gpuflame convert cpu.pb.gz -o flame.svg
  gpuflame convert stacks.folded -o cpu.pb.gz -F 99
  gpuflame convert job.cpu.pb.gz --where rank=2 -o rank2.svg       one rank of a distributed job")]
    Convert(ConvertArgs),
    /// Draw a differential flame graph: the new profile's stacks, coloured by how their time
    /// changed against the base (red: more, blue: less).
    #[command(after_help = "Examples:
  gpuflame diff before.pb.gz after.pb.gz -o diff.svg
  gpuflame diff --normalize base.folded new.folded -o diff.svg    scale the base to the new total first
  gpuflame diff after.pb.gz before.pb.gz -o gone.svg             what went away: the arguments swapped
  gpuflame diff job.pb.gz job.pb.gz --base-where rank=0 --new-where rank=2 -o straggler.svg

Widths are the new profile's; stacks only in the base have no width (swap the arguments to see
them). --format folded writes `stack BASE NEW` lines instead.")]
    Diff(DiffArgs),
    /// Where every thread of some processes is now: its state, how long it has waited, and its
    /// stack (Python, native and kernel frames); threads and ranks with the same stack grouped.
    /// Nothing is stopped: no ptrace, no signal.
    #[command(after_help = "Examples:
  gpuflame dump -p 1234                           one process
  gpuflame dump --match train.py                  every rank of a job, by its command line
  gpuflame dump --match vllm --format json        for scripts

The odd rank out of a hung job stands apart: seven ranks grouped in ncclAllReduce, one elsewhere.
Needs root (or CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE to read the processes' memory).")]
    Dump(DumpArgs),
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Profile this process and all its threads (repeatable). Default: the whole machine.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Samples per second per CPU.
    #[arg(short = 'F', long, value_name = "HZ", default_value_t = DEFAULT_FREQUENCY_HZ)]
    pub frequency: u64,
    /// Stop after this many seconds (default: until Ctrl-C, or until the command or processes exit).
    #[arg(short, long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Output file.
    #[arg(short, long, value_name = "FILE", default_value = "gpuflame.svg")]
    pub output: PathBuf,
    /// Output format: svg, pprof or folded (default: from the output's extension).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// Kernel memory for unwind tables, in MiB (6 bytes per row). Tables load as samples need
    /// them; when the budget is full the least recently used are evicted, and files that still
    /// do not fit are named at the end.
    #[arg(long, value_name = "MIB", default_value_t = gpuflame_bpf::SamplerConfig::DEFAULT_UNWIND_MEMORY >> 20, value_parser = clap::value_parser!(u64).range(1..=MAX_UNWIND_MIB))]
    pub unwind_memory: u64,
    /// The same budget in rows, for tests of a full budget.
    #[arg(long, value_name = "ROWS", hide = true, conflicts_with = "unwind_memory")]
    pub unwind_rows: Option<u64>,
    // Its help comes from the profiles' descriptors (profile_kind.rs).
    #[arg(long, value_name = "LIST", default_value = "cpu", help = profiles_help("record"), long_help = profiles_long_help("record"))]
    pub profiles: String,
    /// Keep the launch and synchronisation hooks attached all the time: exact counts, at a cost
    /// of microseconds per call. By default they are attached 10 ms per second and scaled.
    #[arg(long)]
    pub cuda_exact: bool,
    /// How long the launch and synchronisation hooks stay attached each second, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10)]
    pub cuda_window_ms: u64,
    /// One Python frame per line (`step (train.py:41)`) in SVG and folded output, instead of one
    /// per function (`step (train.py)`). pprof always has both.
    #[arg(long)]
    pub lines: bool,
    /// Where to draw device memory over time, stacked by the stacks that hold it (an SVG).
    /// Default, when a memory profile (hbm-*, tensor-*) is recorded: the output's name with
    /// `.memory-timeline.svg`; `none` draws none.
    #[arg(long, value_name = "FILE")]
    pub memory_timeline: Option<PathBuf>,
    /// Byte sampling of PyTorch tensors' stacks, as the agent does it: a tensor of this many
    /// bytes or more always has its stack taken, a smaller one with probability
    /// 1 - exp(-size / BYTES), weighed by the inverse; every tensor is still counted. 0 (the
    /// default) takes every stack: exact bytes per stack.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub tensor_sample_bytes: u64,
    /// The most tensors and segments kept live at once, in the kernel (~100 bytes each when
    /// used); more are counted and left out of in-use, said in one line.
    #[arg(long, value_name = "N", default_value_t = gpuflame_bpf::SamplerConfig::DEFAULT_LIVE_ALLOCATIONS)]
    pub max_live_allocations: u32,
    /// Tests: unwind every sample's stack again in user space from a copy and report where it
    /// differs from the BPF unwinder's (the unwinder's oracle).
    #[arg(long, hide = true)]
    pub check_unwinder: bool,
    /// A sample label read from each process's environment, from the first of the variables
    /// that holds a number (repeatable; replaces the default list of rank, local_rank,
    /// world_size and group_rank; `none` reads none).
    #[arg(long = "rank-label", value_name = "LABEL=VAR[,VAR…]")]
    pub rank_labels: Vec<String>,
    /// Command to start and profile, with its descendants; its exit code is passed through.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl RecordArgs {
    pub fn options(&self) -> Result<RecordOptions, crate::UserError> {
        let duration = match self.duration {
            Some(d) => Some(crate::seconds_in(d, "duration", 0.001, MAX_DURATION_S)?),
            None => None,
        };
        if !(1..=1000).contains(&self.cuda_window_ms) {
            return Err(crate::UserError(format!("--cuda-window-ms {} is out of range (1 to 1000)", self.cuda_window_ms)));
        }
        let max_rows = (MAX_UNWIND_MIB << 20) / gpuflame_bpf::SamplerConfig::BYTES_PER_ROW;
        if let Some(rows) = self.unwind_rows.filter(|r| !(1..=max_rows).contains(r)) {
            return Err(crate::UserError(format!("--unwind-rows {rows} is out of range (1 to {max_rows})")));
        }
        Ok(RecordOptions {
            pids: self.pids.clone(),
            frequency_hz: self.frequency,
            duration,
            output: self.output.clone(),
            format: self.format.clone(),
            command: self.command.clone(),
            unwind_memory: match self.unwind_rows {
                Some(rows) => rows * gpuflame_bpf::SamplerConfig::BYTES_PER_ROW,
                None => self.unwind_memory << 20,
            },
            profiles: crate::profile_kind::ProfileKind::parse_list(&self.profiles).map_err(crate::UserError)?,
            cuda_exact: self.cuda_exact,
            cuda_window: Duration::from_millis(self.cuda_window_ms),
            detail: detail(self.lines),
            memory_timeline: self.memory_timeline.clone(),
            tensor_sample_bytes: self.tensor_sample_bytes,
            max_live_allocations: self.max_live_allocations,
            check_unwinder: self.check_unwinder,
            rank_labels: crate::workload::rank::RankLabels::parse(&self.rank_labels).map_err(crate::UserError)?,
        })
    }
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    /// A process to dump (repeatable).
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Every process whose command line contains TEXT (repeatable): the ranks of a job.
    #[arg(long = "match", value_name = "TEXT")]
    pub matching: Vec<String>,
    /// text (default) or json.
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    pub format: String,
    /// A label read from each process's environment (as record's --rank-label).
    #[arg(long = "rank-label", value_name = "LABEL=VAR[,VAR…]")]
    pub rank_labels: Vec<String>,
}

impl DumpArgs {
    pub fn options(&self) -> Result<crate::dump::DumpOptions, crate::UserError> {
        let json = match self.format.as_str() {
            "text" => false,
            "json" => true,
            other => return Err(crate::UserError(format!("unknown dump format '{other}' (expected text or json)"))),
        };
        Ok(crate::dump::DumpOptions {
            pids: self.pids.clone(),
            matching: self.matching.clone(),
            json,
            rank_labels: crate::workload::rank::RankLabels::parse(&self.rank_labels).map_err(crate::UserError)?,
        })
    }
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// A pprof profile (gzipped or not) or folded stacks.
    pub input: PathBuf,
    /// Output file.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Output format: svg, pprof or folded (default: from the output's extension).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// Sampling frequency that folded input was recorded at (each line's count × 1e9/HZ ns).
    #[arg(short = 'F', long, value_name = "HZ", default_value_t = DEFAULT_FREQUENCY_HZ)]
    pub frequency: u64,
    /// One Python frame per line (`step (train.py:41)`) in SVG and folded output, instead of one
    /// per function (`step (train.py)`). pprof always has both.
    #[arg(long)]
    pub lines: bool,
    /// Only the samples whose label LABEL is VALUE (repeatable: all must hold): a process's rank
    /// (`rank=2`), `pid`, `tid`, `comm`, `device`.
    #[arg(long = "where", value_name = "LABEL=VALUE")]
    pub conditions: Vec<crate::output::select::Where>,
}

/// `--lines` as the writers take it.
pub fn detail(lines: bool) -> crate::output::Detail {
    if lines {
        crate::output::Detail::Lines
    } else {
        crate::output::Detail::Functions
    }
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The profile before the change (pprof or folded stacks).
    pub base: PathBuf,
    /// The profile after it.
    pub new: PathBuf,
    /// Output file.
    #[arg(short, long, value_name = "FILE", default_value = "diff.svg")]
    pub output: PathBuf,
    /// Output format: svg, or folded (`stack BASE NEW` lines); default from the extension.
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// Scale the base to the new profile's total before comparing (recordings of different
    /// lengths or loads).
    #[arg(long)]
    pub normalize: bool,
    /// Sampling frequency that folded input was recorded at.
    #[arg(short = 'F', long, value_name = "HZ", default_value_t = DEFAULT_FREQUENCY_HZ)]
    pub frequency: u64,
    /// One Python frame per line instead of per function.
    #[arg(long)]
    pub lines: bool,
    /// Only the base's samples whose label LABEL is VALUE (repeatable), such as `rank=0`: two
    /// ranks of one recording compared as two runs.
    #[arg(long = "base-where", value_name = "LABEL=VALUE")]
    pub base_where: Vec<crate::output::select::Where>,
    /// Only the new profile's samples whose label LABEL is VALUE (repeatable), such as `rank=2`.
    #[arg(long = "new-where", value_name = "LABEL=VALUE")]
    pub new_where: Vec<crate::output::select::Where>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_agent_help_list_every_profile() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        for (sub, verb) in [("record", "record"), ("agent", "push")] {
            let cmd = cli.find_subcommand_mut(sub).expect(sub);
            let arg = cmd.get_arguments().find(|a| a.get_id() == "profiles").expect("--profiles");
            let help = arg.get_long_help().expect("long help").to_string();
            assert!(help.starts_with(&profiles_help(verb)), "{help}");
            for d in crate::profile_kind::DESCRIPTORS {
                assert!(help.contains(&format!("  {:<13} {}", d.name, d.about)), "{sub} --help lacks {}: {help}", d.name);
            }
        }
    }

    /// `gpuflame --help` names every profile of the table, as `record --help` does.
    #[test]
    fn top_level_help_names_every_profile() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        for d in crate::profile_kind::DESCRIPTORS {
            assert!(help.contains(&format!("  {:<13} {}", d.name, d.about)), "gpuflame --help lacks {}: {help}", d.name);
        }
        assert!(help.contains("GPU time") && help.contains("tensors"), "{help}");
    }
}
