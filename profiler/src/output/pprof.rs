//! pprof output: profile.proto, gzipped, as `go tool pprof`, Pyroscope and Grafana read it.

use std::io::{self, Write};

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use super::pprof_encoder::Encoder;
pub use super::pprof_encoder::LabelStyle;
use super::pprof_proto as pb;
pub use super::pprof_read::{read_flat, PprofError, MAX_PROFILE_BYTES};
use crate::profile::Profile;
use crate::samples::Samples;

/// Encodes a profile into the uncompressed protobuf message.
pub fn encode<S: Samples>(profile: &Profile<S>) -> pb::Profile {
    encode_with(profile, LabelStyle::default())
}

/// Encodes a profile with its sample labels written as `style` says.
pub fn encode_with<S: Samples>(profile: &Profile<S>, style: LabelStyle) -> pb::Profile {
    let mut e = Encoder::new(profile, style);
    let samples = (0..profile.samples.len()).map(|i| e.sample(i)).collect();
    e.finish(samples)
}

/// Writes the gzipped profile. The message is encoded as [`encode`] would encode it, its samples
/// one at a time straight into its bytes: a million samples are never held as messages. The
/// bytes are compressed in one piece, as they always were: the compressor's output depends on
/// how its input is cut.
pub fn write<S: Samples>(profile: &Profile<S>, out: impl Write) -> io::Result<()> {
    let mut e = Encoder::new(profile, LabelStyle::default());
    let mut message = pb::Profile { sample_type: e.sample_type.clone(), ..Default::default() }.encode_to_vec();
    // The string table follows the samples and their labels add to it: they are interned first,
    // in the order encode_with interns them.
    for i in 0..profile.samples.len() {
        e.labels(i);
    }
    for i in 0..profile.samples.len() {
        prost::encoding::message::encode(2, &e.sample(i), &mut message);
    }
    let mut rest = e.finish(Vec::new());
    rest.sample_type.clear();
    message.extend_from_slice(&rest.encode_to_vec());
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&message)?;
    gz.finish()?;
    Ok(())
}

/// Writes an encoded profile, gzipped.
pub fn gzip(profile: &pb::Profile, out: impl Write) -> io::Result<()> {
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}

/// Reads a pprof profile, gzipped or not, with all its sample types.
pub fn read(bytes: &[u8]) -> Result<Profile, PprofError> {
    Ok(read_flat(bytes.to_vec())?.expand())
}

/// [`read`] of bytes that are not copied.
pub fn read_owned(bytes: Vec<u8>) -> Result<Profile, PprofError> {
    Ok(read_flat(bytes)?.expand())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameKind;
    use crate::profile::{Labels, Line, Location, Mapping, ProfileBuilder, Sample, KERNEL_MAPPING};

    fn sample_profile() -> Profile {
        let mut profile = Profile::cpu(99);
        profile.time_nanos = 1_700_000_000_000_000_000;
        profile.duration_nanos = 5_000_000_000;
        let mut b = ProfileBuilder::default();
        let exe = b.mapping(&mut profile, Mapping { path: "/bin/app".into(), build_id: Some("abcd".into()) });
        let k = b.mapping(&mut profile, Mapping { path: KERNEL_MAPPING.into(), build_id: None });
        let main = b.location(&mut profile, Location { mapping: Some(exe), address: 0x1000, kind: FrameKind::Native, lines: vec![Line { function: "main".into(), file: Some("app.c".into()), line: Some(10) }] });
        let inl = b.location(
            &mut profile,
            Location {
                mapping: Some(exe),
                address: 0x1100,
                kind: FrameKind::Native,
                lines: vec![Line { function: "outer".into(), file: Some("app.c".into()), line: Some(20) }, Line { function: "inlined".into(), file: Some("app.h".into()), line: Some(3) }],
            },
        );
        let kread = b.location(&mut profile, Location { mapping: Some(k), address: 0xffff_ffff_8100_0000, kind: FrameKind::Kernel, lines: vec![Line::function("ksys_read")] });
        let labels = Labels { pid: Some(7), tid: Some(8), comm: Some("app".into()), device: None };
        b.add(vec![main, inl], labels.clone(), 3 * profile.period);
        b.add(vec![main, kread], labels, profile.period);
        b.finish(&mut profile);
        profile
    }

    #[test]
    fn written_as_encoded() {
        let profile = sample_profile();
        let (mut written, mut encoded) = (Vec::new(), Vec::new());
        write(&profile, &mut written).unwrap();
        gzip(&encode(&profile), &mut encoded).unwrap();
        assert_eq!(written, encoded);
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
