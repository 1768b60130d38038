//! Reading pprof into a [`FlatProfile`]: the message's tables (strings, mappings, locations,
//! functions) are decoded first, then its samples one at a time into the table, each pass
//! inflating the file as it reads: neither the inflated message nor a million samples as
//! messages are ever held.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};

use flate2::read::GzDecoder;
use prost::encoding::encode_varint;
use prost::Message;

use super::pprof_proto as pb;
use crate::frame::FrameKind;
use crate::profile::{Labels, Line, Location, Mapping, ValueType, KERNEL_MAPPING, PYTHON_MAPPING};
use crate::samples::{FlatProfile, TableBuilder};

/// The most bytes of a profile that are read, and the most a gzipped pprof may decompress to:
/// a gzip bomb stops here. 256 MiB is 2.5 times a pprof of a million distinct stacks (100 MiB),
/// far more than a recording makes. A profile is held in about its inflated protobuf's size
/// (BENCHMARKS: a million stacks of 30 frames, 69 MB inflated, are converted in 120 MiB and
/// diffed against themselves in 250 MiB), and folded text in half its size or less.
pub const MAX_PROFILE_BYTES: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum PprofError {
    #[error("not a pprof profile: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("reading the gzip stream: {0}")]
    Gzip(#[from] io::Error),
    #[error("invalid pprof profile: {0}")]
    Invalid(String),
    /// The message's fields cannot be told apart: it is no protobuf message at all.
    #[error("not a pprof profile: {0}")]
    Malformed(&'static str),
    #[error("decompresses to more than {0} MiB, the most gpuflame reads")]
    TooLarge(usize),
}

/// String labels read back per process, at most: a file's labels are not ours to trust.
const MAX_PROCESS_LABELS: usize = 16;

/// The profile in `bytes`, gzipped or not. It is read twice, inflated as it is read and never
/// whole: once for its tables, the samples passed over, then for its samples.
pub fn read_flat(bytes: Vec<u8>) -> Result<FlatProfile, PprofError> {
    let gzipped = bytes.starts_with(&[0x1f, 0x8b]);
    let open = || -> Box<dyn Read + '_> {
        match gzipped {
            true => Box::new(GzDecoder::new(bytes.as_slice())),
            false => Box::new(bytes.as_slice()),
        }
    };
    let mut tables = Vec::new();
    fields(open(), Some(&mut tables), &mut |_| Ok(()))?;
    let tables = pb::LazyProfile::decode(tables.as_slice())?;
    let (builder, mut profile) = decode(&tables, |sample| fields(open(), None, sample))?;
    // The samples are all in the table: the file is let go of before they are sorted.
    drop((tables, bytes));
    builder.finish(&mut profile);
    Ok(profile)
}

fn truncated() -> PprofError {
    PprofError::Malformed("the message ends inside a field")
}

/// A varint, or None at the end of the input.
fn varint(input: &mut impl Read) -> Result<Option<u64>, PprofError> {
    let mut value = 0;
    for shift in (0..64).step_by(7) {
        let mut byte = [0];
        if input.read(&mut byte)? == 0 {
            return if shift == 0 { Ok(None) } else { Err(truncated()) };
        }
        value |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] < 0x80 {
            return Ok(Some(value));
        }
    }
    Err(PprofError::Malformed("a varint longer than 10 bytes"))
}

/// The fields of `pb::LazyProfile`: the message's tables and header, which `rest` keeps.
const TABLE_FIELDS: [u64; 10] = [1, 3, 4, 5, 6, 9, 10, 11, 12, 13];

/// Reads the message in `input` a field at a time: each sample (field 2) goes to `sample`, and
/// the fields of its tables, when `rest` is given, are appended to it as they were, for the
/// tables to be decoded from; other fields are passed over. A message of more than
/// [`MAX_PROFILE_BYTES`] is refused as such, whatever else is wrong with it, as when it was read
/// whole before it was decoded.
fn fields(input: impl Read, rest: Option<&mut Vec<u8>>, sample: &mut dyn FnMut(&[u8]) -> Result<(), PprofError>) -> Result<(), PprofError> {
    let mut input = BufReader::with_capacity(1 << 16, input.take(MAX_PROFILE_BYTES as u64 + 1));
    let read = walk(&mut input, rest, sample);
    if matches!(read, Err(PprofError::Decode(_) | PprofError::Invalid(_) | PprofError::Malformed(_))) {
        io::copy(&mut input, &mut io::sink())?;
    }
    if input.get_ref().limit() == 0 {
        return Err(PprofError::TooLarge(MAX_PROFILE_BYTES >> 20));
    }
    read
}

fn walk(input: &mut impl BufRead, mut rest: Option<&mut Vec<u8>>, sample: &mut dyn FnMut(&[u8]) -> Result<(), PprofError>) -> Result<(), PprofError> {
    let mut payload = Vec::new();
    while let Some(key) = varint(input)? {
        let (tag, wire_type) = (key >> 3, key & 7);
        if tag == 0 {
            return Err(PprofError::Malformed("a field numbered 0"));
        }
        let len = match wire_type {
            0 => {
                let value = varint(input)?.ok_or_else(truncated)?;
                if let Some(rest) = rest.as_deref_mut().filter(|_| TABLE_FIELDS.contains(&tag)) {
                    encode_varint(key, rest);
                    encode_varint(value, rest);
                }
                continue;
            }
            1 => 8,
            5 => 4,
            2 => varint(input)?.ok_or_else(truncated)?,
            _ => return Err(PprofError::Malformed("a field of a wire type pprof does not use (a group)")),
        };
        let keep = rest.is_some() && TABLE_FIELDS.contains(&tag);
        if !(keep || (tag == 2 && wire_type == 2)) {
            if io::copy(&mut input.take(len), &mut io::sink())? != len {
                return Err(truncated());
            }
            continue;
        }
        payload.clear();
        if input.take(len).read_to_end(&mut payload)? as u64 != len {
            return Err(truncated());
        }
        if tag == 2 && wire_type == 2 {
            sample(&payload)?;
        } else if let Some(rest) = rest.as_deref_mut() {
            encode_varint(key, rest);
            if wire_type == 2 {
                encode_varint(len, rest);
            }
            rest.extend_from_slice(&payload);
        }
    }
    Ok(())
}

/// The profile whose tables are `p` and whose samples `samples` reads, handing each encoded
/// sample to the function it is given; its samples are left in the builder.
fn decode<F>(p: &pb::LazyProfile, samples: F) -> Result<(TableBuilder, FlatProfile), PprofError>
where
    F: FnOnce(&mut dyn FnMut(&[u8]) -> Result<(), PprofError>) -> Result<(), PprofError>,
{
    let invalid = |what: String| PprofError::Invalid(what);
    let string = |i: i64| -> Result<&str, PprofError> {
        p.string_table.get(usize::try_from(i).unwrap_or(usize::MAX)).map(String::as_str).ok_or_else(|| invalid(format!("string index {i} out of range")))
    };
    let value_type = |vt: &pb::ValueType| -> Result<ValueType, PprofError> { Ok(ValueType::new(string(vt.r#type)?, string(vt.unit)?)) };
    let first_type = p.sample_type.first().ok_or_else(|| invalid("no sample type".into()))?;
    let mut profile = FlatProfile {
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
        samples: Default::default(),
        comments: p.comment.iter().map(|&i| string(i).map(str::to_string)).collect::<Result<_, _>>()?,
        process_labels: Default::default(),
    };
    let mut builder = TableBuilder::new(profile.sample_types.len());

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
        let location = Location { mapping, address: l.address, kind, lines };
        locations.insert(l.id, builder.location(&mut profile, location));
    }
    let mut stack = Vec::new();
    let mut values = Vec::new();
    samples(&mut |encoded| {
        let s = pb::Sample::decode(encoded)?;
        stack.clear();
        for id in s.location_id.iter().rev() {
            stack.push(locations.get(id).copied().ok_or_else(|| invalid(format!("unknown location id {id}")))?);
        }
        let mut labels = Labels::default();
        let mut others = Vec::new();
        for label in &s.label {
            match string(label.key)? {
                "pid" => labels.pid = u32::try_from(label.num).ok(),
                "tid" => labels.tid = u32::try_from(label.num).ok(),
                "comm" | "thread_name" => labels.comm = Some(string(label.str)?.to_string()),
                "device" if label.str != 0 => labels.device = string(label.str)?.parse().ok(),
                "device" => labels.device = u32::try_from(label.num).ok(),
                k if label.str != 0 && others.len() < MAX_PROCESS_LABELS => others.push((k.to_string(), string(label.str)?.to_string())),
                _ => {}
            }
        }
        // Other string labels are the process's (its rank): what gpuflame writes on every
        // sample of a process, read back once per pid.
        if let (Some(pid), false) = (labels.pid, others.is_empty()) {
            profile.process_labels.entry(pid).or_insert(others);
        }
        values.clear();
        values.extend_from_slice(&s.value);
        values.resize(profile.sample_types.len(), 0);
        builder.add(stack.iter().copied(), labels, &values);
        Ok(())
    })?;
    Ok((builder, profile))
}
