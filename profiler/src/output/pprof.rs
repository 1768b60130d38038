//! pprof output: profile.proto, gzipped, as `go tool pprof`, Pyroscope and Grafana read it.

use std::collections::HashMap;
use std::io::{self, Read, Write};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use super::pprof_proto as pb;
use crate::frame::FrameKind;
use crate::profile::{Labels, Line, Location, Mapping, Profile, ProfileBuilder, ValueType, KERNEL_MAPPING, PYTHON_MAPPING};

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

/// The most bytes of a profile that are read, and the most a gzipped pprof may decompress to:
/// a gzip bomb stops here. 256 MiB is 2.5 times a pprof of a million distinct stacks (100 MiB),
/// far more than a recording makes; decoding costs up to ~18 times the protobuf's size in memory
/// (measured with a stack and a leaf location per sample), so this bounds `convert` to a few GiB.
pub const MAX_PROFILE_BYTES: usize = 256 << 20;

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

/// Encodes a profile into the uncompressed protobuf message.
pub fn encode(profile: &Profile) -> pb::Profile {
    encode_with(profile, LabelStyle::default())
}

/// Encodes a profile with its sample labels written as `style` says.
pub fn encode_with(profile: &Profile, style: LabelStyle) -> pb::Profile {
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

    let (pid_key, tid_key, device_key) = (strings.id("pid"), strings.id("tid"), strings.id("device"));
    let comm_key = strings.id(style.comm_key);
    let sample = profile
        .samples
        .iter()
        .map(|s| {
            let mut label = Vec::new();
            if let Some(pid) = s.labels.pid {
                label.push(pb::Label { key: pid_key, num: pid.into(), ..Default::default() });
            }
            if let Some(tid) = s.labels.tid {
                label.push(pb::Label { key: tid_key, num: tid.into(), ..Default::default() });
            }
            if let Some(comm) = &s.labels.comm {
                label.push(pb::Label { key: comm_key, str: strings.id(comm), ..Default::default() });
            }
            if let Some(device) = s.labels.device {
                label.push(if style.device_as_string {
                    pb::Label { key: device_key, str: strings.id(&device.to_string()), ..Default::default() }
                } else {
                    pb::Label { key: device_key, num: device.into(), ..Default::default() }
                });
            }
            let process = s.labels.pid.filter(|_| style.process_labels).and_then(|pid| profile.process_labels.get(&pid));
            for (k, v) in process.into_iter().flatten() {
                label.push(pb::Label { key: strings.id(k), str: strings.id(v), ..Default::default() });
            }
            pb::Sample {
                // pprof lists the leaf first.
                location_id: s.stack.iter().rev().map(|&l| l as u64 + 1).collect(),
                value: s.values.clone(),
                label,
            }
        })
        .collect();

    let comment = profile.comments.iter().map(|c| strings.id(c)).collect();
    pb::Profile {
        comment,
        sample_type,
        sample,
        mapping,
        location,
        function,
        string_table: strings.table,
        time_nanos: profile.time_nanos,
        duration_nanos: profile.duration_nanos,
        period_type,
        period: profile.period,
        ..Default::default()
    }
}

/// Writes the gzipped profile.
pub fn write(profile: &Profile, out: impl Write) -> io::Result<()> {
    gzip(&encode(profile), out)
}

/// Writes an encoded profile, gzipped.
pub fn gzip(profile: &pb::Profile, out: impl Write) -> io::Result<()> {
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum PprofError {
    #[error("not a pprof profile: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("reading the gzip stream: {0}")]
    Gzip(#[from] io::Error),
    #[error("invalid pprof profile: {0}")]
    Invalid(String),
    #[error("decompresses to more than {0} MiB, the most gpuflame reads")]
    TooLarge(usize),
}

/// Reads a pprof profile, gzipped or not, with all its sample types.
pub fn read(bytes: &[u8]) -> Result<Profile, PprofError> {
    let message = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        GzDecoder::new(bytes).take(MAX_PROFILE_BYTES as u64 + 1).read_to_end(&mut raw)?;
        if raw.len() > MAX_PROFILE_BYTES {
            return Err(PprofError::TooLarge(MAX_PROFILE_BYTES >> 20));
        }
        pb::LazyProfile::decode(bytes::Bytes::from(raw))?
    } else {
        pb::LazyProfile::decode(bytes::Bytes::copy_from_slice(bytes))?
    };
    decode(message)
}

/// [`read`] of an uncompressed profile that is not copied.
pub fn read_owned(bytes: Vec<u8>) -> Result<Profile, PprofError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return read(&bytes);
    }
    decode(pb::LazyProfile::decode(bytes::Bytes::from(bytes))?)
}

/// String labels read back per process, at most: a file's labels are not ours to trust.
const MAX_PROCESS_LABELS: usize = 16;

fn decode(mut p: pb::LazyProfile) -> Result<Profile, PprofError> {
    let pb_samples = std::mem::take(&mut p.sample);
    let p = &p;
    let invalid = |what: String| PprofError::Invalid(what);
    let string = |i: i64| -> Result<&str, PprofError> {
        p.string_table.get(usize::try_from(i).unwrap_or(usize::MAX)).map(String::as_str).ok_or_else(|| invalid(format!("string index {i} out of range")))
    };
    let value_type = |vt: &pb::ValueType| -> Result<ValueType, PprofError> { Ok(ValueType::new(string(vt.r#type)?, string(vt.unit)?)) };
    let first_type = p.sample_type.first().ok_or_else(|| invalid("no sample type".into()))?;
    let mut profile = Profile {
        sample_types: p.sample_type.iter().map(value_type).collect::<Result<_, _>>()?,
        period_type: match &p.period_type {
            Some(vt) => value_type(vt)?,
            None => value_type(first_type)?,
        },
        period: p.period,
        time_nanos: p.time_nanos,
        duration_nanos: p.duration_nanos,
        mappings: Vec::new(),
        locations: Vec::new(),
        samples: Vec::new(),
        comments: p.comment.iter().map(|&i| string(i).map(str::to_string)).collect::<Result<_, _>>()?,
        process_labels: Default::default(),
    };
    let mut builder = ProfileBuilder::default();

    let mut mappings = HashMap::new();
    for m in &p.mapping {
        let build_id = string(m.build_id)?;
        let mapping = Mapping { path: string(m.filename)?.to_string(), build_id: (!build_id.is_empty()).then(|| build_id.to_string()) };
        mappings.insert(m.id, builder.mapping(&mut profile, mapping));
    }
    let functions: HashMap<u64, &pb::Function> = p.function.iter().map(|f| (f.id, f)).collect();
    let mut locations = HashMap::new();
    for l in &p.location {
        let mapping = mappings.get(&l.mapping_id).copied();
        let kernel = mapping.is_some_and(|m| profile.mappings[m].path == KERNEL_MAPPING);
        let mut lines = Vec::new();
        for line in l.line.iter().rev() {
            let f = functions.get(&line.function_id).ok_or_else(|| invalid(format!("unknown function id {}", line.function_id)))?;
            let file = string(f.filename)?;
            lines.push(Line {
                function: string(f.name)?.to_string(),
                file: (!file.is_empty()).then(|| file.to_string()),
                line: u32::try_from(line.line).ok().filter(|&n| n > 0),
            });
        }
        if lines.is_empty() {
            let module = mapping.map_or("unknown", |m| profile.mappings[m].path.as_str());
            lines.push(Line::function(format!("[unknown] ({module}+{:#x})", l.address)));
        }
        // pprof does not say what a frame is: the kernel's and Python's mappings do (a Python
        // frame that could not be read, `[unknown python]`, is a marker), and the rest goes by
        // name.
        let python = mapping.is_some_and(|m| profile.mappings[m].path == PYTHON_MAPPING);
        let kind = match lines.last() {
            _ if kernel => FrameKind::Kernel,
            Some(line) if python && !line.function.starts_with('[') => FrameKind::Python,
            Some(line) => FrameKind::guess(&line.function),
            None => FrameKind::Native,
        };
        let location = Location { mapping, address: l.address, kernel, kind, lines };
        locations.insert(l.id, builder.location(&mut profile, location));
    }
    let (pid_key, tid_key, device_key) = ("pid", "tid", "device");
    for encoded in pb_samples {
        let s = pb::Sample::decode(encoded)?;
        let stack = s
            .location_id
            .iter()
            .rev()
            .map(|id| locations.get(id).copied().ok_or_else(|| invalid(format!("unknown location id {id}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut labels = Labels::default();
        let mut others = Vec::new();
        for label in &s.label {
            match string(label.key)? {
                k if k == pid_key => labels.pid = u32::try_from(label.num).ok(),
                k if k == tid_key => labels.tid = u32::try_from(label.num).ok(),
                "comm" | "thread_name" => labels.comm = Some(string(label.str)?.to_string()),
                k if k == device_key && label.str != 0 => labels.device = string(label.str)?.parse().ok(),
                k if k == device_key => labels.device = u32::try_from(label.num).ok(),
                k if label.str != 0 && others.len() < MAX_PROCESS_LABELS => others.push((k.to_string(), string(label.str)?.to_string())),
                _ => {}
            }
        }
        // Other string labels are the process's (its rank): what gpuflame writes on every
        // sample of a process, read back once per pid.
        if let (Some(pid), false) = (labels.pid, others.is_empty()) {
            profile.process_labels.entry(pid).or_insert(others);
        }
        let mut values = s.value;
        values.resize(profile.sample_types.len(), 0);
        builder.add_values(stack, labels, &values);
    }
    builder.finish(&mut profile);
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Sample;

    fn sample_profile() -> Profile {
        let mut profile = Profile::cpu(99);
        profile.time_nanos = 1_700_000_000_000_000_000;
        profile.duration_nanos = 5_000_000_000;
        let mut b = ProfileBuilder::default();
        let exe = b.mapping(&mut profile, Mapping { path: "/bin/app".into(), build_id: Some("abcd".into()) });
        let k = b.mapping(&mut profile, Mapping { path: KERNEL_MAPPING.into(), build_id: None });
        let main = b.location(&mut profile, Location { mapping: Some(exe), address: 0x1000, kernel: false, kind: FrameKind::Native, lines: vec![Line { function: "main".into(), file: Some("app.c".into()), line: Some(10) }] });
        let inl = b.location(
            &mut profile,
            Location {
                mapping: Some(exe),
                address: 0x1100,
                kernel: false,
                kind: FrameKind::Native,
                lines: vec![Line { function: "outer".into(), file: Some("app.c".into()), line: Some(20) }, Line { function: "inlined".into(), file: Some("app.h".into()), line: Some(3) }],
            },
        );
        let kread = b.location(&mut profile, Location { mapping: Some(k), address: 0xffff_ffff_8100_0000, kernel: true, kind: FrameKind::Kernel, lines: vec![Line::function("ksys_read")] });
        let labels = Labels { pid: Some(7), tid: Some(8), comm: Some("app".into()), device: None };
        b.add(vec![main, inl], labels.clone(), 3 * profile.period);
        b.add(vec![main, kread], labels, profile.period);
        b.finish(&mut profile);
        profile
    }

    #[test]
    fn round_trip_keeps_everything() {
        let profile = sample_profile();
        let mut bytes = Vec::new();
        write(&profile, &mut bytes).unwrap();
        assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzipped");
        assert_eq!(read(&bytes).unwrap(), profile);
    }

    #[test]
    fn encoding_follows_pprof_conventions() {
        let p = encode(&sample_profile());
        assert_eq!(p.string_table[0], "");
        let st = &p.sample_type[0];
        assert_eq!((&*p.string_table[st.r#type as usize], &*p.string_table[st.unit as usize]), ("cpu", "nanoseconds"));
        assert_eq!(p.period, 1_000_000_000 / 99);
        // The inlined location lists the innermost function first.
        let inl = p.location.iter().find(|l| l.line.len() == 2).unwrap();
        let first = p.function.iter().find(|f| f.id == inl.line[0].function_id).unwrap();
        assert_eq!(p.string_table[first.name as usize], "inlined");
        assert_eq!(p.string_table[p.mapping[0].build_id as usize], "abcd");
    }

    #[test]
    fn device_as_a_string_and_thread_names_read_back() {
        let mut profile = sample_profile();
        for s in &mut profile.samples {
            s.labels.device = Some(3);
        }
        let style = LabelStyle { comm_key: "thread_name", device_as_string: true, process_labels: true };
        let p = encode_with(&profile, style);
        let key = |name: &str| p.string_table.iter().position(|s| s == name).unwrap() as i64;
        let device = p.sample[0].label.iter().find(|l| l.key == key("device")).unwrap();
        assert_eq!((device.num, p.string_table[device.str as usize].as_str()), (0, "3"), "a string label, which Pyroscope keeps");
        assert!(p.sample[0].label.iter().any(|l| l.key == key("thread_name")));
        let mut bytes = Vec::new();
        gzip(&p, &mut bytes).unwrap();
        assert_eq!(read(&bytes).unwrap(), profile);
    }

    #[test]
    fn process_labels_are_string_labels_of_each_sample_of_the_process() {
        let mut profile = sample_profile();
        let first = profile.samples[0].clone();
        profile.samples.push(Sample { labels: Labels { pid: Some(9), tid: Some(9), ..first.labels.clone() }, ..first });
        profile.process_labels.insert(7, vec![("rank".into(), "2".into()), ("world_size".into(), "4".into())]);
        let labels_of = |p: &pb::Profile| -> Vec<Vec<(String, String)>> {
            p.sample
                .iter()
                .map(|s| s.label.iter().filter(|l| l.str != 0).map(|l| (p.string_table[l.key as usize].clone(), p.string_table[l.str as usize].clone())).collect())
                .collect()
        };
        let got = labels_of(&encode(&profile));
        let ranked = vec![("comm".to_string(), "app".to_string()), ("rank".into(), "2".into()), ("world_size".into(), "4".into())];
        assert_eq!(got, [ranked.clone(), ranked, vec![("comm".to_string(), "app".to_string())]], "pid 7's samples, not pid 9's");
        let style = LabelStyle { process_labels: false, ..LabelStyle::default() };
        assert!(labels_of(&encode_with(&profile, style)).iter().all(|l| l.len() == 1), "left out when asked");
        let mut bytes = Vec::new();
        write(&profile, &mut bytes).unwrap();
        let back = read(&bytes).unwrap();
        assert_eq!(back.process_labels, profile.process_labels, "read back per pid");
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(read(b"definitely not a profile").is_err());
        assert!(read(&[0x1f, 0x8b, 0, 1, 2]).is_err());
    }
}
