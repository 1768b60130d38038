//! The parts of a pprof message, made from a profile: its tables once, its samples one at a time,
//! so that `pprof::write` can stream what `pprof::encode_with` builds whole. Strings are interned
//! in one order either way, so both give the same string table.

use std::collections::HashMap;

use super::pprof_proto as pb;
use crate::profile::{Profile, ValueType};
use crate::samples::Samples;

/// How sample labels are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabelStyle {
    /// The key of the thread name label.
    pub comm_key: &'static str,
    /// `device` as a string ("0"): Pyroscope drops numeric sample labels.
    pub device_as_string: bool,
    /// The labels of each sample's process (its rank), as string labels; the agent makes them
    /// series labels instead.
    pub process_labels: bool,
}

impl Default for LabelStyle {
    fn default() -> Self {
        LabelStyle { comm_key: "comm", device_as_string: false, process_labels: true }
    }
}

/// Interns strings into a pprof string table, whose entry 0 must be "".
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Strings { table: vec![String::new()], index: HashMap::from([(String::new(), 0)]) }
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        self.table.push(s.to_string());
        let i = self.table.len() as i64 - 1;
        self.index.insert(s.to_string(), i);
        i
    }
}

pub(super) struct Encoder<'p, S> {
    profile: &'p Profile<S>,
    style: LabelStyle,
    strings: Strings,
    pub(super) sample_type: Vec<pb::ValueType>,
    period_type: Option<pb::ValueType>,
    mapping: Vec<pb::Mapping>,
    location: Vec<pb::Location>,
    function: Vec<pb::Function>,
    keys: [i64; 4],
}

impl<'p, S: Samples> Encoder<'p, S> {
    /// Interns the profile's types, mappings, locations and functions, and the label keys.
    pub(super) fn new(profile: &'p Profile<S>, style: LabelStyle) -> Self {
        let mut strings = Strings::new();
        let value_type = |vt: &ValueType, s: &mut Strings| pb::ValueType { r#type: s.id(&vt.kind), unit: s.id(&vt.unit) };
        let sample_type = profile.sample_types.iter().map(|vt| value_type(vt, &mut strings)).collect();
        let period_type = Some(value_type(&profile.period_type, &mut strings));

        let mapping = profile
            .mappings
            .iter()
            .enumerate()
            .map(|(i, m)| pb::Mapping {
                id: i as u64 + 1,
                // Addresses are file offsets (or kernel addresses), so the mapping spans them all.
                memory_start: 0,
                memory_limit: u64::MAX,
                file_offset: 0,
                filename: strings.id(&m.path),
                build_id: strings.id(m.build_id.as_deref().unwrap_or("")),
                has_functions: true,
                has_filenames: true,
                has_line_numbers: true,
                has_inline_frames: true,
            })
            .collect();

        let mut functions: HashMap<(String, String), u64> = HashMap::new();
        let mut function = Vec::new();
        let location = profile
            .locations
            .iter()
            .enumerate()
            .map(|(i, loc)| pb::Location {
                id: i as u64 + 1,
                mapping_id: loc.mapping.map_or(0, |m| m as u64 + 1),
                address: loc.address,
                // pprof lists the innermost inlined function first, the caller last.
                line: loc
                    .lines
                    .iter()
                    .rev()
                    .map(|l| {
                        let key = (l.function.clone(), l.file.clone().unwrap_or_default());
                        let next_id = functions.len() as u64 + 1;
                        let function_id = *functions.entry(key).or_insert_with(|| {
                            let name = strings.id(&l.function);
                            function.push(pb::Function {
                                id: next_id,
                                name,
                                system_name: name,
                                filename: strings.id(l.file.as_deref().unwrap_or("")),
                                start_line: 0,
                            });
                            next_id
                        });
                        pb::Line { function_id, line: l.line.map_or(0, i64::from), column: 0 }
                    })
                    .collect(),
                is_folded: false,
            })
            .collect();

        let keys = [strings.id("pid"), strings.id("tid"), strings.id("device"), strings.id(style.comm_key)];
        Encoder { profile, style, strings, sample_type, period_type, mapping, location, function, keys }
    }

    /// Sample `i`'s labels, their strings interned.
    pub(super) fn labels(&mut self, i: usize) -> Vec<pb::Label> {
        let [pid_key, tid_key, device_key, comm_key] = self.keys;
        let labels = self.profile.samples.labels(i);
        let mut label = Vec::new();
        if let Some(pid) = labels.pid {
            label.push(pb::Label { key: pid_key, num: pid.into(), ..Default::default() });
        }
        if let Some(tid) = labels.tid {
            label.push(pb::Label { key: tid_key, num: tid.into(), ..Default::default() });
        }
        if let Some(comm) = &labels.comm {
            label.push(pb::Label { key: comm_key, str: self.strings.id(comm), ..Default::default() });
        }
        if let Some(device) = labels.device {
            label.push(if self.style.device_as_string {
                pb::Label { key: device_key, str: self.strings.id(&device.to_string()), ..Default::default() }
            } else {
                pb::Label { key: device_key, num: device.into(), ..Default::default() }
            });
        }
        let process = labels.pid.filter(|_| self.style.process_labels).and_then(|pid| self.profile.process_labels.get(&pid));
        for (k, v) in process.into_iter().flatten() {
            label.push(pb::Label { key: self.strings.id(k), str: self.strings.id(v), ..Default::default() });
        }
        label
    }

    pub(super) fn sample(&mut self, i: usize) -> pb::Sample {
        let label = self.labels(i);
        let samples = &self.profile.samples;
        pb::Sample {
            // pprof lists the leaf first.
            location_id: samples.stack(i).iter().rev().map(|l| l as u64 + 1).collect(),
            value: samples.values(i).to_vec(),
            label,
        }
    }

    /// The message, with `sample` as its samples; the comments' strings are interned last.
    pub(super) fn finish(self, sample: Vec<pb::Sample>) -> pb::Profile {
        let mut strings = self.strings;
        let comment = self.profile.comments.iter().map(|c| strings.id(c)).collect();
        pb::Profile {
            comment,
            sample_type: self.sample_type,
            sample,
            mapping: self.mapping,
            location: self.location,
            function: self.function,
            string_table: strings.table,
            time_nanos: self.profile.time_nanos,
            duration_nanos: self.profile.duration_nanos,
            period_type: self.period_type,
            period: self.profile.period,
            ..Default::default()
        }
    }
}
