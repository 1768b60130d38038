//! One window's profile cut into the series the agent pushes: one per service (and per device
//! when asked), with the sample labels Pyroscope keeps and within the limits it enforces.
//!
//! Pyroscope turns every string sample label into a series label and drops numeric ones
//! (pkg/model/pprofsplit, pkg/pprof Normalize). So the thread name is not a label by default
//! (one series per thread name would follow) but a `thread:NAME` frame at the root of each
//! stack; pid and tid, which Pyroscope would drop anyway, are merged away unless asked for; and
//! `device` is written as a string.

use std::collections::HashMap;

use crate::workload::service::{Hint, Owner, Services, KERNEL_SERVICE};
use crate::output::pprof::{self, LabelStyle};
use crate::output::pprof_proto as pb;
use crate::frame::FrameKind;
use crate::profile::{Labels, Profile, ProfileCopy};
use prost::Message;

/// Pyroscope's default `validation.max-profile-stacktrace-samples`.
pub const MAX_SAMPLES: usize = 16_000;
/// Pyroscope's default `validation.max-profile-size-bytes` (of the uncompressed profile).
pub const MAX_PROFILE_BYTES: usize = 4 << 20;

/// Where thread names go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ThreadNames {
    /// A `thread:NAME` frame at the root of every stack.
    Frame,
    /// A `thread_name` sample label (Pyroscope makes it a series label: one series per name).
    Label,
    /// Nowhere.
    None,
}

/// Where the GPU of CUDA profiles goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceLabel {
    /// A `device` series label: one series per service and device.
    Series,
    /// A `device` string sample label (Pyroscope turns it into a series label when it ingests).
    Sample,
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub thread_names: ThreadNames,
    pub device: DeviceLabel,
    /// Keep pid and tid as numeric sample labels (Pyroscope drops them; other readers may not).
    pub pid_labels: bool,
    /// Push kernel threads under the service `kernel`; without, their samples are left out.
    pub kernel_threads: bool,
    pub max_samples: usize,
    pub max_bytes: usize,
}

/// What cutting a window into series did, for the metrics and the exit line.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Profiles that had to lose their smallest stacks to fit Pyroscope's limits.
    pub trimmed_profiles: u64,
    /// Stacks merged into one `[trimmed …]` stack for that.
    pub trimmed_stacks: u64,
    /// Samples of kernel threads left out (--no-kernel-threads).
    pub kernel_samples_left_out: u64,
}

/// One series of one window, encoded (not yet gzipped).
pub struct Series {
    pub service: String,
    /// The workload's labels (Kubernetes namespace, pod, container, …) and the process's (its
    /// rank), in a fixed order.
    pub labels: Vec<(String, String)>,
    /// The device, when it is a series label.
    pub device: Option<u32>,
    pub profile: pb::Profile,
}

/// The label style of pushed profiles: a process's labels are labels of its series already.
pub const STYLE: LabelStyle = LabelStyle { comm_key: "thread_name", device_as_string: true, process_labels: false };

/// Cuts `profile` into series; none when nothing was sampled.
pub fn split(profile: &Profile, services: &mut Services<'_>, opts: &Options, stats: &mut Stats) -> Vec<Series> {
    let mut hints: HashMap<u32, (Option<&str>, &str)> = HashMap::new();
    for s in &profile.samples {
        let pid = s.labels.pid.unwrap_or(0);
        let comm = s.labels.comm.as_deref().unwrap_or("");
        let hint = hints.entry(pid).or_insert((None, comm));
        if s.labels.tid == Some(pid) {
            hint.0 = Some(comm);
        }
    }
    // A process's own labels (its rank) follow its workload's: one series per rank.
    let owners: HashMap<u32, (Owner, Vec<(String, String)>)> = hints
        .into_iter()
        .map(|(pid, (leader_comm, thread_comm))| {
            // Named first: that reads the process, whose workload labels follow.
            let (owner, mut labels) = services.of(pid, Hint { leader_comm, thread_comm });
            labels.extend(profile.process_labels.get(&pid).into_iter().flatten().cloned());
            (pid, (owner, labels))
        })
        .collect();

    type Key = (String, Vec<(String, String)>, Option<u32>);
    let mut groups: HashMap<Key, ProfileCopy> = HashMap::new();
    for s in &profile.samples {
        let (owner, workload) = &owners[&s.labels.pid.unwrap_or(0)];
        let service = match owner {
            Owner::Process(name) => name.clone(),
            Owner::Kernel if opts.kernel_threads => KERNEL_SERVICE.to_string(),
            Owner::Kernel => {
                stats.kernel_samples_left_out += 1;
                continue;
            }
        };
        let device = if opts.device == DeviceLabel::Series { s.labels.device } else { None };
        let group = groups.entry((service, workload.clone(), device)).or_insert_with(|| ProfileCopy::of(profile));
        let thread = s.labels.comm.as_deref().unwrap_or("[unknown]");
        let mut stack = Vec::with_capacity(s.stack.len() + 1);
        if opts.thread_names == ThreadNames::Frame {
            stack.push(group.frame(&format!("thread:{thread}"), FrameKind::Thread));
        }
        stack.extend(s.stack.iter().map(|&l| group.location(profile, l)));
        let labels = Labels {
            pid: s.labels.pid.filter(|_| opts.pid_labels),
            tid: s.labels.tid.filter(|_| opts.pid_labels),
            comm: (opts.thread_names == ThreadNames::Label).then(|| thread.to_string()),
            device: s.labels.device.filter(|_| opts.device == DeviceLabel::Sample),
        };
        group.add_values(stack, labels, &s.values);
    }
    let mut keys: Vec<Key> = groups.keys().cloned().collect();
    keys.sort();
    keys.into_iter()
        .filter_map(|key| {
            let profile = groups.remove(&key)?.finish();
            let (encoded, trimmed) = fit(&profile, opts.max_samples, opts.max_bytes);
            if trimmed > 0 {
                stats.trimmed_profiles += 1;
                stats.trimmed_stacks += trimmed as u64;
                tracing::debug!(service = %key.0, stacks = profile.samples.len(), trimmed, "profile trimmed of its smallest stacks to fit Pyroscope's limits");
            }
            Some(Series { service: key.0, labels: key.1, device: key.2, profile: encoded })
        })
        .collect()
}

/// The gzipped bytes of an encoded profile.
pub fn gzip(profile: &pb::Profile) -> Vec<u8> {
    let mut raw = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = pprof::gzip(profile, &mut raw);
    raw
}

/// `profile` encoded within `max_samples` samples and `max_bytes` bytes: when it is larger, its
/// smallest stacks are merged into one `[trimmed: N smaller stacks]` stack, so that totals stay
/// right. Returns the encoding and how many stacks were merged.
pub fn fit(profile: &Profile, max_samples: usize, max_bytes: usize) -> (pb::Profile, usize) {
    let mut encoded = pprof::encode_with(profile, STYLE);
    let n = profile.samples.len();
    let mut keep = n;
    loop {
        let size = encoded.encoded_len();
        if encoded.sample.len() <= max_samples && size <= max_bytes {
            return (encoded, n - keep);
        }
        // One sample of the limit goes to the merged stack; the size shrinks about in
        // proportion to the samples kept (locations and names go with them).
        let by_size = (keep as f64 * max_bytes as f64 / size as f64 * 0.9) as usize;
        let next = keep.min(max_samples.saturating_sub(1)).min(by_size);
        keep = if next < keep { next } else { keep * 9 / 10 };
        encoded = pprof::encode_with(&keep_largest(profile, keep), STYLE);
    }
}

/// `profile` with only its `keep` largest samples and one more that sums the others.
fn keep_largest(profile: &Profile, keep: usize) -> Profile {
    let mut order: Vec<usize> = (0..profile.samples.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(profile.samples[i].value().unsigned_abs()), i));
    let mut out = ProfileCopy::of(profile);
    for &i in &order[..keep.min(order.len())] {
        out.copy(profile, &profile.samples[i]);
    }
    let rest = &order[keep.min(order.len())..];
    if !rest.is_empty() {
        let mut sum = vec![0i64; profile.sample_types.len()];
        for &i in rest {
            for (s, v) in sum.iter_mut().zip(&profile.samples[i].values) {
                *s = s.saturating_add(*v);
            }
        }
        let name = format!("[trimmed: {} smaller stacks]", rest.len());
        let l = out.frame(&name, FrameKind::Marker);
        out.add_values(vec![l], Labels::default(), &sum);
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Line, Location, Mapping, ProfileBuilder};

    /// A CPU profile of `n` distinct stacks of `depth` frames, stack i of weight i + 1.
    fn many_stacks(n: usize, depth: usize) -> Profile {
        let mut p = Profile::cpu(100);
        let mut b = ProfileBuilder::default();
        let m = b.mapping(&mut p, Mapping { path: "/usr/lib/libbig.so".into(), build_id: None });
        for i in 0..n {
            let stack = (0..depth)
                .map(|d| {
                    let name = if d + 1 == depth { format!("leaf_{i}") } else { format!("frame_{d}_{}", i % 7) };
                    let loc = Location { mapping: Some(m), address: (i * depth + d) as u64, kind: FrameKind::Native, lines: vec![Line::function(name)] };
                    b.location(&mut p, loc)
                })
                .collect();
            b.add(stack, Labels { pid: Some(1), tid: Some(1), comm: Some("t".into()), device: None }, (i as i64 + 1) * p.period);
        }
        b.finish(&mut p);
        p
    }

    #[test]
    fn thirty_thousand_stacks_are_trimmed_to_the_limits_and_keep_the_total() {
        let p = many_stacks(30_000, 12);
        let (encoded, trimmed) = fit(&p, MAX_SAMPLES, MAX_PROFILE_BYTES);
        assert!(encoded.sample.len() <= MAX_SAMPLES, "{} samples", encoded.sample.len());
        assert!(encoded.encoded_len() <= MAX_PROFILE_BYTES);
        assert_eq!(trimmed, 30_000 - (encoded.sample.len() - 1));
        let total: i64 = encoded.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, p.total(), "the trimmed stacks' time is kept in one stack");
        // The largest stacks are the ones kept.
        let smallest_kept = encoded.sample.iter().filter(|s| s.location_id.len() > 1).map(|s| s.value[0]).min().unwrap();
        assert_eq!(smallest_kept, (trimmed as i64 + 1) * p.period);
    }

    #[test]
    fn each_rank_is_a_series_and_its_labels_are_not_sample_labels() {
        // Two ranks of one program and a process without a rank; pids no process has, so that
        // they are named from their samples.
        let (r0, r1, plain) = (u32::MAX - 10, u32::MAX - 11, u32::MAX - 12);
        let mut p = many_stacks(3, 2);
        for (s, pid) in p.samples.iter_mut().zip([r0, r1, plain]) {
            s.labels = Labels { pid: Some(pid), tid: Some(pid), comm: Some("train".into()), device: None };
        }
        p.process_labels.insert(r0, vec![("rank".into(), "0".into()), ("world_size".into(), "2".into())]);
        p.process_labels.insert(r1, vec![("rank".into(), "1".into()), ("world_size".into(), "2".into())]);
        let opts = Options {
            thread_names: ThreadNames::Label,
            device: DeviceLabel::Series,
            pid_labels: true,
            kernel_threads: true,
            max_samples: MAX_SAMPLES,
            max_bytes: MAX_PROFILE_BYTES,
        };
        let namer = crate::workload::service::ServiceNamer::new(crate::workload::service::NameFrom::Comm, vec![]);
        let mut store: std::collections::HashMap<u32, Option<crate::workload::service::ProcessService>> = std::collections::HashMap::new();
        let series = split(&p, &mut Services { namer: &namer, store: &mut store }, &opts, &mut Stats::default());
        let got: Vec<_> = series.iter().map(|s| (s.service.as_str(), s.labels.clone(), s.profile.sample.len())).collect();
        let l = |r: &str| vec![("rank".to_string(), r.to_string()), ("world_size".to_string(), "2".to_string())];
        assert_eq!(got, [("train", vec![], 1), ("train", l("0"), 1), ("train", l("1"), 1)]);
        for s in &series {
            let keys: Vec<&str> = s.profile.sample.iter().flat_map(|x| &x.label).map(|l| s.profile.string_table[l.key as usize].as_str()).collect();
            assert!(keys.iter().all(|k| ["pid", "tid", "thread_name"].contains(k)), "sample labels {keys:?}");
        }
    }

    #[test]
    fn the_byte_limit_trims_too() {
        let p = many_stacks(2_000, 40);
        let (full, trimmed) = fit(&p, MAX_SAMPLES, usize::MAX);
        assert_eq!(trimmed, 0);
        let limit = full.encoded_len() / 3;
        let (small, trimmed) = fit(&p, MAX_SAMPLES, limit);
        assert!(small.encoded_len() <= limit && trimmed > 0, "{} bytes, {trimmed} trimmed", small.encoded_len());
    }
}
