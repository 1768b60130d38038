//! The agent's configuration: flags, environment (through the flags' `env`), an optional TOML
//! file, defaults — in that order of precedence.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use gpuflame_server_upload::{prepare_spool_dir, Auth, Secret};
use regex::Regex;
use serde::Deserialize;

use super::series::{DeviceLabel, ThreadNames};
use crate::process::MAX_UNWIND_MIB;
use crate::profile_kind::{profiles_help, profiles_long_help};
use crate::workload::rank::{self, RankLabels};
use crate::workload::service::{NameFrom, NameRule};
use crate::UserError;

/// Agent options. Secrets are read from the environment or from files, never from flags, so they
/// do not show in `ps`.
#[derive(Args, Debug, Default)]
pub struct AgentArgs {
    /// Pyroscope server URL, such as http://pyroscope:4040.
    #[arg(long, env = "GPUFLAME_SERVER")]
    pub server: Option<String>,
    /// TOML configuration file (same keys as the flags, with underscores).
    #[arg(long, env = "GPUFLAME_CONFIG")]
    pub config: Option<PathBuf>,
    /// Seconds per profile window [default: 15].
    #[arg(long, value_name = "SECONDS", env = "GPUFLAME_WINDOW")]
    pub window: Option<f64>,
    /// Samples per second per CPU [default: 19].
    #[arg(short = 'F', long, value_name = "HZ", env = "GPUFLAME_FREQUENCY")]
    pub frequency: Option<u64>,
    /// Label added to every series (repeatable): --label env=prod.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Where service_name comes from when no rule or GPUFLAME_SERVICE_NAME says [default: comm].
    #[arg(long, value_enum, env = "GPUFLAME_SERVICE_NAME_FROM")]
    pub service_name_from: Option<NameFrom>,
    /// Service name rule (repeatable): REGEX=NAME, the regex matched on the command line; NAME may
    /// use $1 for groups.
    #[arg(long = "service-name", value_name = "REGEX=NAME")]
    pub service_names: Vec<String>,
    /// Tenant, sent as X-Scope-OrgID.
    #[arg(long, env = "GPUFLAME_TENANT_ID")]
    pub tenant_id: Option<String>,
    /// User for basic auth; the password comes from GPUFLAME_BASIC_AUTH_PASSWORD or a file.
    #[arg(long, env = "GPUFLAME_BASIC_AUTH_USER")]
    pub basic_auth_user: Option<String>,
    #[arg(long, value_name = "FILE")]
    pub basic_auth_password_file: Option<PathBuf>,
    /// File holding a bearer token (or set GPUFLAME_BEARER_TOKEN).
    #[arg(long, value_name = "FILE")]
    pub bearer_token_file: Option<PathBuf>,
    /// PEM CA certificate(s) to trust besides the system roots.
    #[arg(long, value_name = "FILE", env = "GPUFLAME_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Bound of the upload queue in bytes; the oldest profiles are dropped (and counted) beyond it
    /// [default: 67108864].
    #[arg(long, value_name = "BYTES", env = "GPUFLAME_QUEUE_BYTES")]
    pub queue_bytes: Option<u64>,
    /// Directory where undelivered profiles are kept across restarts.
    #[arg(long, value_name = "DIR", env = "GPUFLAME_SPOOL_DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Also (or, without --server, instead) writes each series of each window as a gzipped pprof
    /// file in DIR, named WINDOW-N-TYPE-SERVICE[-deviceD].pb.gz; the oldest this run wrote go
    /// past --output-dir-bytes.
    #[arg(long, value_name = "DIR", env = "GPUFLAME_OUTPUT_DIR")]
    pub output_dir: Option<PathBuf>,
    /// The most bytes of files --output-dir keeps [default: 1073741824].
    #[arg(long, value_name = "BYTES", env = "GPUFLAME_OUTPUT_DIR_BYTES")]
    pub output_dir_bytes: Option<u64>,
    /// Seconds to deliver queued profiles after SIGTERM/SIGINT [default: 10].
    #[arg(long, value_name = "SECONDS", env = "GPUFLAME_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Option<f64>,
    /// Longest wait between retries of a failed push, in seconds [default: 30].
    #[arg(long, value_name = "SECONDS", env = "GPUFLAME_MAX_BACKOFF")]
    pub max_backoff: Option<f64>,
    /// Serve Prometheus metrics here: PORT (on 127.0.0.1) or ADDRESS:PORT.
    #[arg(long, value_name = "ADDR", env = "GPUFLAME_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// Kernel memory for unwind tables, in MiB [default: 256]; least recently used tables are
    /// evicted when it is full.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=MAX_UNWIND_MIB))]
    pub unwind_memory: Option<u64>,
    /// The hostname label [default: the kernel's hostname; in a pod, pass the node name].
    #[arg(long, env = "GPUFLAME_HOSTNAME")]
    pub hostname: Option<String>,
    // Its help comes from the profiles' descriptors (profile_kind.rs).
    #[arg(long, value_name = "LIST", env = "GPUFLAME_PROFILES", help = format!("{} [default: {DEFAULT_PROFILES}]", profiles_help("push")), long_help = profiles_long_help("push"))]
    pub profiles: Option<String>,
    /// Byte sampling of PyTorch tensors' stacks: a tensor of this many bytes or more always has
    /// its stack taken, a smaller one with probability 1 - exp(-size / BYTES), weighed by the
    /// inverse; every tensor is still counted. 0 takes every stack [default: 2097152, 2 MiB].
    #[arg(long, value_name = "BYTES", env = "GPUFLAME_TENSOR_SAMPLE_BYTES")]
    pub tensor_sample_bytes: Option<u64>,
    /// The most tensors and segments kept live at once, in the kernel (~100 bytes each when
    /// used); more are counted and left out of in-use [default: 1048576].
    #[arg(long, value_name = "N", env = "GPUFLAME_MAX_LIVE_ALLOCATIONS")]
    pub max_live_allocations: Option<u32>,
    /// Push one window and exit.
    #[arg(long)]
    pub once: bool,
    /// Print the effective configuration (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Leave kernel threads out instead of pushing them under the service `kernel`.
    #[arg(long)]
    pub no_kernel_threads: bool,
    /// Where thread names go: a `thread:NAME` root frame, a `thread_name` sample label (which
    /// Pyroscope turns into a series label), or nowhere [default: frame].
    #[arg(long, value_enum, env = "GPUFLAME_THREAD_NAMES")]
    pub thread_names: Option<ThreadNames>,
    /// Where the GPU of CUDA profiles goes: a `device` series label, or a string sample label
    /// [default: series].
    #[arg(long, value_enum, env = "GPUFLAME_DEVICE_LABEL")]
    pub device_label: Option<DeviceLabel>,
    /// Keep pid and tid as numeric sample labels (Pyroscope drops them; by default samples that
    /// differ only by them are merged).
    #[arg(long)]
    pub pid_labels: bool,
    /// Attempts of a push that the server answers with 429 or 5xx before it is dropped (while the
    /// server cannot be reached, only --max-age bounds the wait)
    /// [default: 10].
    #[arg(long, value_name = "N", env = "GPUFLAME_MAX_RETRIES")]
    pub max_retries: Option<u32>,
    /// Seconds after which a failing push is no longer retried [default: 300].
    #[arg(long, value_name = "SECONDS", env = "GPUFLAME_MAX_AGE")]
    pub max_age: Option<f64>,
    /// A series label read from each process's environment, from the first of the variables
    /// that holds a number (repeatable; replaces the default list of rank, local_rank,
    /// world_size and group_rank; `none` reads none).
    #[arg(long = "rank-label", value_name = "LABEL=VAR[,VAR…]")]
    pub rank_labels: Vec<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    server: Option<String>,
    window: Option<f64>,
    frequency: Option<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    service_name_from: Option<NameFrom>,
    #[serde(default)]
    service_names: Vec<FileRule>,
    tenant_id: Option<String>,
    basic_auth_user: Option<String>,
    basic_auth_password: Option<String>,
    basic_auth_password_file: Option<PathBuf>,
    bearer_token: Option<String>,
    bearer_token_file: Option<PathBuf>,
    ca_cert: Option<PathBuf>,
    queue_bytes: Option<u64>,
    spool_dir: Option<PathBuf>,
    output_dir: Option<PathBuf>,
    output_dir_bytes: Option<u64>,
    shutdown_timeout: Option<f64>,
    max_backoff: Option<f64>,
    metrics_addr: Option<String>,
    unwind_memory: Option<u64>,
    hostname: Option<String>,
    profiles: Option<String>,
    tensor_sample_bytes: Option<u64>,
    max_live_allocations: Option<u32>,
    kernel_threads: Option<bool>,
    thread_names: Option<ThreadNames>,
    device_label: Option<DeviceLabel>,
    pid_labels: Option<bool>,
    max_retries: Option<u32>,
    max_age: Option<f64>,
    /// As `--rank-label` takes them; empty reads none.
    rank_labels: Option<Vec<String>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct FileRule {
    pattern: String,
    name: String,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub server: String,
    pub window: Duration,
    pub frequency_hz: u64,
    pub labels: BTreeMap<String, String>,
    pub service_name_from: NameFrom,
    pub service_names: Vec<NameRule>,
    pub tenant_id: Option<String>,
    pub auth: Auth,
    pub ca_cert: Option<PathBuf>,
    pub queue_bytes: u64,
    pub spool_dir: Option<PathBuf>,
    pub output_dir: Option<PathBuf>,
    pub output_dir_bytes: u64,
    pub shutdown_timeout: Duration,
    pub max_backoff: Duration,
    pub metrics_addr: Option<String>,
    /// In MiB.
    pub unwind_memory: u64,
    pub hostname: String,
    pub profiles: Vec<crate::profile_kind::ProfileKind>,
    /// 0: every tensor's stack.
    pub tensor_sample_bytes: u64,
    pub max_live_allocations: u32,
    /// The profiles were asked for (not the defaults): tensors are then followed by hooks too
    /// where an allocator has no USDT probes.
    pub profiles_asked: bool,
    pub once: bool,
    pub kernel_threads: bool,
    pub thread_names: ThreadNames,
    pub device_label: DeviceLabel,
    pub pid_labels: bool,
    pub max_retries: u32,
    pub max_age: Duration,
    pub rank_labels: RankLabels,
}

pub const DEFAULT_FREQUENCY_HZ: u64 = 19;

/// CPU time, and device memory wherever CUDA is seen: segments (hbm-inuse: cudaMalloc and the
/// driver's allocations, a few calls a second) and PyTorch's tensors, through its USDT probes
/// (libraries without them are not hooked for tensors by default: their hooks cost 16-22 us a
/// tensor). Launches, CUDA API time and off-CPU time cost per launch or per switch, at rates no
/// continuous profile should pay: asked for, not defaults.
pub const DEFAULT_PROFILES: &str = "cpu,hbm-inuse,tensor-alloc,tensor-inuse";

/// The interval of tensors' byte sampling: the allocator's small-pool segments are 2 MiB, and
/// the tensors in them (under 1 MiB: most tensors, few of the bytes) are sampled, each of the
/// large pool's drawn with a chance of 39% or more and all of those of 2 MiB or more, which hold
/// the memory an out-of-memory failure is about.
pub const DEFAULT_TENSOR_SAMPLE_BYTES: u64 = 2 << 20;

fn err(msg: impl Into<String>) -> UserError {
    UserError(msg.into())
}

fn read_secret(path: &Path, what: &str) -> Result<Secret, UserError> {
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read the {what} file {}: {e}", path.display())))?;
    Ok(Secret::new(text.trim_end_matches(['\n', '\r'])))
}

/// Bounds of the time settings, in seconds: a window shorter than 0.1 s pushes more requests
/// than profiles; an hour is the longest any of them is useful.
const WINDOW_S: (f64, f64) = (0.1, 3600.0);
const TIMEOUT_S: (f64, f64) = (0.001, 3600.0);
/// The queue holds encoded windows in memory: at least one small window, at most 16 GiB.
const QUEUE_BYTES: (u64, u64) = (1024, 16 << 30);

fn seconds(v: f64, what: &str, (min, max): (f64, f64)) -> Result<Duration, UserError> {
    crate::seconds_in(v, what, min, max)
}

impl AgentConfig {
    pub fn resolve(args: &AgentArgs) -> Result<Self, UserError> {
        let file: FileConfig = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read the config file {}: {e}", path.display())))?;
                toml::from_str(&text).map_err(|e| err(format!("config file {}: {}", path.display(), e.message())))?
            }
            None => FileConfig::default(),
        };
        let server = args.server.clone().or(file.server).unwrap_or_default();
        let mut labels = file.labels;
        for kv in &args.labels {
            let (k, v) = kv.split_once('=').ok_or_else(|| err(format!("--label {kv:?} is not KEY=VALUE")))?;
            labels.insert(k.to_string(), v.to_string());
        }
        let rank_labels = match (args.rank_labels.as_slice(), file.rank_labels) {
            ([], Some(specs)) if specs.is_empty() => RankLabels::none(),
            ([], Some(specs)) => RankLabels::parse(&specs).map_err(|e| err(format!("{e} (rank_labels in the config file)")))?,
            (flags, _) => RankLabels::parse(flags).map_err(err)?,
        };
        let rank_names: Vec<&str> = rank_labels.names().collect();
        // A rank label of a name the agent sets otherwise would make every series a duplicate.
        for name in &rank_names {
            let default = rank::DEFAULT.iter().any(|(d, _)| d == name);
            if let Some((_, hint)) = super::labels::RESERVED.iter().find(|(r, _)| r == name).filter(|_| !default) {
                return Err(err(format!("the rank label {name} would clash with the agent's own label ({hint})")));
            }
        }
        super::labels::check_user_labels(&labels, &rank_names).map_err(err)?;
        let mut service_names = Vec::new();
        let rules = args
            .service_names
            .iter()
            .map(|r| r.rsplit_once('=').map(|(p, n)| (p.to_string(), n.to_string())).ok_or_else(|| err(format!("--service-name {r:?} is not REGEX=NAME"))))
            .chain(file.service_names.into_iter().map(|r| Ok((r.pattern, r.name))));
        for rule in rules {
            let (pattern, name) = rule?;
            if name.trim().is_empty() {
                return Err(err(format!("service-name rule {pattern:?} gives an empty name")));
            }
            let pattern = Regex::new(&pattern).map_err(|e| err(format!("service-name pattern {pattern:?}: {e}")))?;
            service_names.push(NameRule { pattern, name });
        }

        let password = match (&args.basic_auth_password_file, std::env::var("GPUFLAME_BASIC_AUTH_PASSWORD").ok(), &file.basic_auth_password_file, file.basic_auth_password) {
            (Some(f), _, _, _) => Some(read_secret(f, "password")?),
            (None, Some(p), _, _) => Some(Secret::new(p)),
            (None, None, Some(f), _) => Some(read_secret(f, "password")?),
            (None, None, None, p) => p.map(Secret::new),
        };
        let token = match (&args.bearer_token_file, std::env::var("GPUFLAME_BEARER_TOKEN").ok(), &file.bearer_token_file, file.bearer_token) {
            (Some(f), _, _, _) => Some(read_secret(f, "bearer token")?),
            (None, Some(t), _, _) => Some(Secret::new(t)),
            (None, None, Some(f), _) => Some(read_secret(f, "bearer token")?),
            (None, None, None, t) => t.map(Secret::new),
        };
        let user = args.basic_auth_user.clone().or(file.basic_auth_user);
        let auth = match (user, password, token) {
            (Some(_), _, Some(_)) => return Err(err("give basic auth or a bearer token, not both")),
            (Some(user), Some(password), None) => Auth::Basic { user, password },
            (Some(_), None, None) => return Err(err("basic auth needs a password: GPUFLAME_BASIC_AUTH_PASSWORD or --basic-auth-password-file")),
            (None, Some(_), _) => return Err(err("a basic-auth password was given without --basic-auth-user")),
            (None, None, Some(t)) => Auth::Bearer(t),
            (None, None, None) => Auth::None,
        };

        let frequency_hz = args.frequency.or(file.frequency).unwrap_or(DEFAULT_FREQUENCY_HZ);
        if frequency_hz == 0 || frequency_hz > 10_000 {
            return Err(err(format!("frequency {frequency_hz} Hz is out of range (1 to 10000)")));
        }
        let asked = args.profiles.clone().or(file.profiles);
        let profiles_asked = asked.is_some();
        let profiles = crate::profile_kind::ProfileKind::parse_list(&asked.unwrap_or_else(|| DEFAULT_PROFILES.into())).map_err(err)?;
        if let Some(k) = profiles.iter().find(|k| k.descriptor().needs.cupti) {
            // The agent starts no program, so it cannot load the injection library into one; a
            // program started with it has kernel records all the same.
            eprintln!(
                "gpuflame agent: {k} comes only from processes started with {}= gpuflame's CUPTI library (`gpuflame cupti-library PATH` writes it)",
                crate::cuda::injection::INJECTION_VAR
            );
        }
        let metrics_addr = args.metrics_addr.clone().or(file.metrics_addr).map(|a| if a.contains(':') { a } else { format!("127.0.0.1:{a}") });
        Ok(AgentConfig {
            server,
            window: seconds(args.window.or(file.window).unwrap_or(15.0), "window", WINDOW_S)?,
            frequency_hz,
            labels,
            service_name_from: args.service_name_from.or(file.service_name_from).unwrap_or(NameFrom::Comm),
            service_names,
            tenant_id: args.tenant_id.clone().or(file.tenant_id),
            auth,
            ca_cert: args.ca_cert.clone().or(file.ca_cert),
            queue_bytes: match args.queue_bytes.or(file.queue_bytes).unwrap_or(64 << 20) {
                b if (QUEUE_BYTES.0..=QUEUE_BYTES.1).contains(&b) => b,
                b => return Err(err(format!("queue_bytes {b} is out of range ({} to {})", QUEUE_BYTES.0, QUEUE_BYTES.1))),
            },
            // Checked (and created) now, so that an unsafe directory is an error at start; from
            // here on the resolved path is used, not a link that could be re-pointed.
            spool_dir: match args.spool_dir.clone().or(file.spool_dir) {
                Some(dir) if !args.print_config => Some(prepare_spool_dir(&dir).map_err(|e| err(e.to_string()))?),
                other => other,
            },
            output_dir: match args.output_dir.clone().or(file.output_dir) {
                Some(dir) if !args.print_config => Some(prepare_spool_dir(&dir).map_err(|e| err(format!("--output-dir: {}", e.to_string().replacen("spool directory", "directory", 1))))?),
                other => other,
            },
            output_dir_bytes: args.output_dir_bytes.or(file.output_dir_bytes).unwrap_or(1 << 30),
            shutdown_timeout: seconds(args.shutdown_timeout.or(file.shutdown_timeout).unwrap_or(10.0), "shutdown timeout", TIMEOUT_S)?,
            max_backoff: seconds(args.max_backoff.or(file.max_backoff).unwrap_or(30.0), "max backoff", TIMEOUT_S)?,
            metrics_addr,
            unwind_memory: match args.unwind_memory.or(file.unwind_memory).unwrap_or(gpuflame_bpf::SamplerConfig::DEFAULT_UNWIND_MEMORY >> 20) {
                m if (1..=MAX_UNWIND_MIB).contains(&m) => m,
                m => return Err(err(format!("unwind_memory {m} MiB is out of range (1 to {MAX_UNWIND_MIB})"))),
            },
            hostname: match args.hostname.clone().or(file.hostname) {
                // Pyroscope refuses every series whose label value is over the limit.
                Some(h) if h.is_empty() || h.len() > super::labels::MAX_VALUE_BYTES => {
                    return Err(err(format!("--hostname must be 1 to {} bytes long", super::labels::MAX_VALUE_BYTES)));
                }
                Some(h) => h,
                None => std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "unknown".into()),
            },
            profiles,
            profiles_asked,
            tensor_sample_bytes: match args.tensor_sample_bytes.or(file.tensor_sample_bytes).unwrap_or(DEFAULT_TENSOR_SAMPLE_BYTES) {
                b if b <= 1 << 40 => b,
                b => return Err(err(format!("tensor_sample_bytes {b} is out of range (0 to 1 TiB)"))),
            },
            max_live_allocations: match args.max_live_allocations.or(file.max_live_allocations).unwrap_or(gpuflame_bpf::SamplerConfig::DEFAULT_LIVE_ALLOCATIONS) {
                0 => return Err(err("max_live_allocations 0: the live set needs room for one allocation at least")),
                n => n,
            },
            once: args.once,
            kernel_threads: !args.no_kernel_threads && file.kernel_threads.unwrap_or(true),
            thread_names: args.thread_names.or(file.thread_names).unwrap_or(ThreadNames::Frame),
            device_label: args.device_label.or(file.device_label).unwrap_or(DeviceLabel::Series),
            pid_labels: args.pid_labels || file.pid_labels.unwrap_or(false),
            max_retries: match args.max_retries.or(file.max_retries).unwrap_or(10) {
                0 => return Err(err("max_retries must be at least 1 (the first attempt counts)")),
                n => n,
            },
            max_age: seconds(args.max_age.or(file.max_age).unwrap_or(300.0), "max age", (1.0, 86400.0))?,
            rank_labels,
        })
    }
}
