//! The symbolized, format-independent profile that every writer takes and every reader returns.

use std::collections::{BTreeMap, HashMap};

use crate::frame::FrameKind;
use crate::names::sanitize_in_place;

/// A pprof-style value type, such as `cpu`/`nanoseconds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueType {
    pub kind: String,
    pub unit: String,
}

impl ValueType {
    pub fn new(kind: &str, unit: &str) -> Self {
        ValueType { kind: kind.into(), unit: unit.into() }
    }

    pub fn cpu_nanoseconds() -> Self {
        Self::new("cpu", "nanoseconds")
    }
}

/// The time one sample stands for at `frequency_hz`, in nanoseconds.
pub fn sampling_period(frequency_hz: u64) -> i64 {
    1_000_000_000 / frequency_hz.max(1) as i64
}

/// The file that code of a [`Location`] lives in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub path: String,
    /// Lowercase hex.
    pub build_id: Option<String>,
}

/// The name pprof and perf give kernel code.
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// The mapping of Python frames: their code lives in the interpreter's heap, not in a file.
pub const PYTHON_MAPPING: &str = "[python]";

/// One function of an inline chain, with where in it the code is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Line {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Location {
    /// A frame that is only a name: a marker, a CUDA call, a GPU kernel.
    pub fn named(name: impl Into<String>, kind: FrameKind) -> Self {
        Location { mapping: None, address: 0, kind, lines: vec![Line::function(name)] }
    }
}

impl Line {
    pub fn function(name: impl Into<String>) -> Self {
        Line { function: name.into(), file: None, line: None }
    }
}

/// One code address. `address` is the file offset for user code and the address for the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    pub mapping: Option<usize>,
    pub address: u64,
    /// What the frame is, for the writers that tell kinds apart (the SVG's colours); pprof and
    /// folded output do not carry it.
    pub kind: FrameKind,
    /// The inline chain, outermost function first; never empty (unknown code gets an
    /// `[unknown] (module+0xoffset)` line so that it never vanishes).
    pub lines: Vec<Line>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub comm: Option<String>,
    /// The GPU, for HBM profiles.
    pub device: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Indices into [`Profile::locations`], root first.
    pub stack: Vec<usize>,
    /// One value per sample type.
    pub values: Vec<i64>,
    pub labels: Labels,
}

impl Sample {
    /// The value of the first sample type, the one flame graphs and folded stacks show.
    pub fn value(&self) -> i64 {
        self.values.first().copied().unwrap_or(0)
    }
}

/// A profile, its samples as `S` holds them: a `Vec` of [`Sample`]s as recordings build them, or
/// a [`crate::samples::SampleTable`] (a [`crate::samples::FlatProfile`]) as files are read into,
/// a few bytes a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile<S = Vec<Sample>> {
    /// What each sample's values are, such as alloc_space/bytes and alloc_objects/count; never
    /// empty. The first is the one flame graphs show.
    pub sample_types: Vec<ValueType>,
    pub period_type: ValueType,
    /// Value of one sample, in the period type's unit (1e9 / Hz for CPU profiles).
    pub period: i64,
    /// Start of the recording, Unix epoch nanoseconds.
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub mappings: Vec<Mapping>,
    pub locations: Vec<Location>,
    pub samples: S,
    /// Notes for the reader, such as how sampled counts were scaled (pprof comments).
    pub comments: Vec<String>,
    /// Labels of whole processes, by pid, for the samples of that pid: a distributed job's rank
    /// and the like, read from the process's environment (`workload/rank.rs`).
    pub process_labels: BTreeMap<u32, Vec<(String, String)>>,
}

impl Profile {
    pub fn cpu(frequency_hz: u64) -> Self {
        Profile { period: sampling_period(frequency_hz), ..Profile::of(vec![ValueType::cpu_nanoseconds()]) }
    }

    /// A profile of values that are not sampled time, such as bytes and counts.
    pub fn of(sample_types: Vec<ValueType>) -> Self {
        let period_type = sample_types.first().cloned().unwrap_or_else(|| ValueType::new("samples", "count"));
        Profile {
            sample_types,
            period_type,
            period: 1,
            time_nanos: 0,
            duration_nanos: 0,
            mappings: Vec::new(),
            locations: Vec::new(),
            samples: Vec::new(),
            comments: Vec::new(),
            process_labels: BTreeMap::new(),
        }
    }
}

impl<S> Profile<S> {
    /// The first sample type.
    pub fn sample_type(&self) -> &ValueType {
        &self.sample_types[0]
    }

    /// How many samples a value stands for: the value itself for counts, value / period for
    /// sampled time.
    pub fn sample_count(&self, value: i64) -> i64 {
        if self.sample_type().unit == "nanoseconds" && self.period > 1 {
            value / self.period
        } else {
            value
        }
    }

    /// What writers read of a profile besides its samples, locations and mappings: types,
    /// period, time, comments and process labels.
    pub fn without_samples(&self) -> Profile<()> {
        Profile { process_labels: self.process_labels.clone(), ..self.clone_header() }
    }

    /// A profile of the same types, period and time, without samples.
    pub fn clone_header<T: Default>(&self) -> Profile<T> {
        Profile {
            sample_types: self.sample_types.clone(),
            period_type: self.period_type.clone(),
            period: self.period,
            time_nanos: self.time_nanos,
            duration_nanos: self.duration_nanos,
            mappings: Vec::new(),
            locations: Vec::new(),
            samples: T::default(),
            comments: self.comments.clone(),
            // Only those of the samples copied into it (see ProfileCopy::copy).
            process_labels: BTreeMap::new(),
        }
    }
}

/// A new profile made of samples of another (a series of a window, its largest stacks), with
/// only the locations and mappings they use.
pub struct ProfileCopy {
    profile: Profile,
    builder: ProfileBuilder,
    locations: HashMap<usize, usize>,
    frames: HashMap<String, usize>,
}

impl ProfileCopy {
    /// Of the same types, period, time and comments as `from`.
    pub fn of(from: &Profile) -> Self {
        ProfileCopy { profile: from.clone_header(), builder: ProfileBuilder::default(), locations: HashMap::new(), frames: HashMap::new() }
    }

    /// Location `l` of `from`, here.
    pub fn location(&mut self, from: &Profile, l: usize) -> usize {
        let (profile, builder) = (&mut self.profile, &mut self.builder);
        *self.locations.entry(l).or_insert_with(|| {
            let mut loc = from.locations[l].clone();
            loc.mapping = loc.mapping.map(|m| builder.mapping(profile, from.mappings[m].clone()));
            builder.location(profile, loc)
        })
    }

    /// A frame of this profile's own, by name.
    pub fn frame(&mut self, name: &str, kind: FrameKind) -> usize {
        if let Some(&l) = self.frames.get(name) {
            return l;
        }
        let l = self.builder.location(&mut self.profile, Location::named(name, kind));
        self.frames.insert(name.to_string(), l);
        l
    }

    /// Sample `sample` of `from`, here, with its process's labels.
    pub fn copy(&mut self, from: &Profile, sample: &Sample) {
        if let Some(pid) = sample.labels.pid {
            if let Some(labels) = from.process_labels.get(&pid) {
                self.profile.process_labels.entry(pid).or_insert_with(|| labels.clone());
            }
        }
        let stack = sample.stack.iter().map(|&l| self.location(from, l)).collect();
        self.builder.add_values(stack, sample.labels.clone(), &sample.values);
    }

    pub fn add_values(&mut self, stack: Vec<usize>, labels: Labels, values: &[i64]) {
        self.builder.add_values(stack, labels, values);
    }

    pub fn finish(mut self) -> Profile {
        self.builder.finish(&mut self.profile);
        self.profile
    }
}

/// Builds a [`Profile`], interning mappings and locations. Every profile is built by one, from
/// records, pprof or folded input alike (files into a [`crate::samples::FlatProfile`] by a
/// [`crate::samples::TableBuilder`], which interns with the same [`Interner`]), so it is where
/// names are made safe for every writer ([`crate::names::sanitize`]).
#[derive(Default)]
pub struct ProfileBuilder {
    interner: Interner,
    samples: HashMap<(Vec<usize>, Labels), Vec<i64>>,
}

/// The mappings and locations of a profile being built, each once, their names made safe.
#[derive(Default)]
pub struct Interner {
    mappings: HashMap<Mapping, usize>,
    locations: HashMap<Location, usize>,
}

impl Interner {
    pub fn mapping<S>(&mut self, profile: &mut Profile<S>, mut mapping: Mapping) -> usize {
        sanitize_in_place(&mut mapping.path);
        if let Some(id) = &mut mapping.build_id {
            sanitize_in_place(id);
        }
        *self.mappings.entry(mapping).or_insert_with_key(|m| {
            profile.mappings.push(m.clone());
            profile.mappings.len() - 1
        })
    }

    pub fn location<S>(&mut self, profile: &mut Profile<S>, mut location: Location) -> usize {
        for line in &mut location.lines {
            sanitize_in_place(&mut line.function);
            if let Some(file) = &mut line.file {
                sanitize_in_place(file);
            }
        }
        *self.locations.entry(location).or_insert_with_key(|l| {
            profile.locations.push(l.clone());
            profile.locations.len() - 1
        })
    }
}

impl ProfileBuilder {
    pub fn mapping(&mut self, profile: &mut Profile, mapping: Mapping) -> usize {
        self.interner.mapping(profile, mapping)
    }

    pub fn location(&mut self, profile: &mut Profile, location: Location) -> usize {
        self.interner.location(profile, location)
    }

    /// Adds `value` to the sample with this stack and labels.
    pub fn add(&mut self, stack: Vec<usize>, labels: Labels, value: i64) {
        self.add_values(stack, labels, &[value]);
    }

    /// Adds `values` (one per sample type) to the sample with this stack and labels.
    pub fn add_values(&mut self, stack: Vec<usize>, mut labels: Labels, values: &[i64]) {
        if let Some(comm) = &mut labels.comm {
            sanitize_in_place(comm);
        }
        let sum = self.samples.entry((stack, labels)).or_default();
        if sum.len() < values.len() {
            sum.resize(values.len(), 0);
        }
        for (s, v) in sum.iter_mut().zip(values) {
            *s += v;
        }
    }

    /// Moves the samples into `profile`, in a stable order.
    pub fn finish(self, profile: &mut Profile) {
        let mut samples: Vec<_> = self.samples.into_iter().collect();
        samples.sort();
        profile.samples = samples
            .into_iter()
            .map(|((stack, labels), values)| Sample { stack, values, labels })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_sanitizes_every_name() {
        let mut profile = Profile::cpu(100);
        let mut b = ProfileBuilder::default();
        let mapping = b.mapping(&mut profile, Mapping { path: "/tmp/lib\n.so".into(), build_id: Some("ab\0".into()) });
        let line = Line { function: "f\x1b".into(), file: Some("x\u{85}.py".into()), line: Some(3) };
        let loc = b.location(&mut profile, Location { mapping: Some(mapping), address: 1, kind: FrameKind::Native, lines: vec![line] });
        b.add(vec![loc], Labels { comm: Some("c\t;".into()), ..Default::default() }, 1);
        b.finish(&mut profile);
        assert_eq!(profile.mappings[0], Mapping { path: r"/tmp/lib\n.so".into(), build_id: Some(r"ab\x00".into()) });
        let line = &profile.locations[0].lines[0];
        assert_eq!((line.function.as_str(), line.file.as_deref()), (r"f\x1b", Some(r"x\x85.py")));
        assert_eq!(profile.samples[0].labels.comm.as_deref(), Some(r"c\t;"));
    }
}
