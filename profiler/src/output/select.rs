//! `--where LABEL=VALUE`: the samples of a profile whose labels say so, such as one rank's of a
//! recording of the whole job (`rank=2`), so that `diff` compares two ranks as it does two runs.

use std::collections::HashMap;

use crate::profile::Profile;
use crate::samples::{FlatProfile, Samples, TableBuilder};

/// One `LABEL=VALUE` condition. LABEL is `pid`, `tid`, `comm` (or `thread_name`), `device`, or a
/// label of the sample's process (`rank`, `local_rank`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Where {
    label: String,
    value: String,
}

impl std::str::FromStr for Where {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('=') {
            Some((label, value)) if !label.trim().is_empty() => Ok(Where { label: label.trim().to_string(), value: value.to_string() }),
            _ => Err(format!("{s:?}: give LABEL=VALUE, such as rank=2 or pid=4242")),
        }
    }
}

impl std::fmt::Display for Where {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.label, self.value)
    }
}

impl Where {
    fn holds<S: Samples>(&self, profile: &Profile<S>, i: usize) -> bool {
        let number = |n: Option<u32>| n.is_some_and(|n| n.to_string() == self.value);
        let labels = profile.samples.labels(i);
        match self.label.as_str() {
            "pid" => number(labels.pid),
            "tid" => number(labels.tid),
            "device" => number(labels.device),
            "comm" | "thread_name" => labels.comm.as_deref() == Some(self.value.as_str()),
            label => labels
                .pid
                .and_then(|pid| profile.process_labels.get(&pid))
                .is_some_and(|labels| labels.iter().any(|(k, v)| k == label && *v == self.value)),
        }
    }
}

/// The samples of `profile` for which every condition holds, with the locations and mappings
/// they use (numbered in the order they are first used, as [`crate::profile::ProfileCopy`]
/// numbers them) and the labels of their processes; the profile itself when there is no
/// condition.
pub fn select(profile: FlatProfile, conditions: &[Where]) -> FlatProfile {
    if conditions.is_empty() {
        return profile;
    }
    let mut out: FlatProfile = profile.clone_header();
    let mut builder = TableBuilder::new(profile.sample_types.len());
    let mut locations: HashMap<usize, usize> = HashMap::new();
    let samples = &profile.samples;
    for i in (0..samples.len()).filter(|&i| conditions.iter().all(|c| c.holds(&profile, i))) {
        let labels = samples.labels(i);
        if let Some(process) = labels.pid.and_then(|pid| Some((pid, profile.process_labels.get(&pid)?))) {
            out.process_labels.entry(process.0).or_insert_with(|| process.1.clone());
        }
        let mut stack = Vec::with_capacity(samples.stack(i).len());
        for l in samples.stack(i).iter() {
            let here = match locations.get(&l) {
                Some(&here) => here,
                None => {
                    let mut loc = profile.locations[l].clone();
                    loc.mapping = loc.mapping.map(|m| builder.mapping(&mut out, profile.mappings[m].clone()));
                    let here = builder.location(&mut out, loc);
                    locations.insert(l, here);
                    here
                }
            };
            stack.push(here);
        }
        builder.add(stack, labels.clone(), samples.values(i));
    }
    builder.finish(&mut out);
    out.comments.push(format!("samples where {}", conditions.iter().map(Where::to_string).collect::<Vec<_>>().join(", ")));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameKind;
    use crate::profile::{Labels, Location, ProfileBuilder};

    fn job() -> FlatProfile {
        let mut p = Profile::cpu(99);
        let mut b = ProfileBuilder::default();
        let step = b.location(&mut p, Location::named("step", FrameKind::Python));
        for (pid, n) in [(10, 3), (11, 5), (12, 7)] {
            b.add(vec![step], Labels { pid: Some(pid), tid: Some(pid), comm: Some("python3".into()), device: None }, n * p.period);
        }
        b.finish(&mut p);
        p.process_labels.insert(10, vec![("rank".into(), "0".into())]);
        p.process_labels.insert(11, vec![("rank".into(), "1".into())]);
        p.flatten()
    }

    #[test]
    fn one_ranks_samples_are_selected_with_their_labels() {
        let w = |s: &str| s.parse::<Where>().unwrap();
        let rank1 = select(job(), &[w("rank=1")]);
        assert_eq!(rank1.total(), 5 * rank1.period);
        assert_eq!(rank1.process_labels.keys().copied().collect::<Vec<_>>(), [11]);
        assert!(rank1.comments.iter().any(|c| c == "samples where rank=1"));
        assert_eq!(select(job(), &[w("pid=12")]).total(), 7 * rank1.period);
        assert_eq!(select(job(), &[w("rank=1"), w("pid=10")]).total(), 0, "every condition holds");
        assert_eq!(select(job(), &[w("comm=python3")]).total(), 15 * rank1.period);
        assert_eq!(select(job(), &[]).total(), 15 * rank1.period);
        assert!("rank".parse::<Where>().is_err() && "=2".parse::<Where>().is_err());
    }
}
