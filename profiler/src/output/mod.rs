//! Output formats: how a [`Profile`] is written and read back.

pub mod diff;
mod drawn;
pub mod fold;
pub mod folded;
pub mod frame_names;
mod frame_text;
pub mod identity;
pub mod load;
pub mod pprof;
mod pprof_encoder;
pub mod pprof_proto;
mod pprof_read;
pub mod rendering;
pub mod select;
pub mod svg;
pub mod memory_svg;
mod visible;

pub use pprof::MAX_PROFILE_BYTES;
pub use rendering::{Detail, Rendering};

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::str::FromStr;

use fold::fold_flat;
use frame_names::FrameNames;

use crate::profile::Profile;
use crate::samples::{FlatProfile, Samples};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Folded,
    Pprof,
    Svg,
}

#[derive(Debug, thiserror::Error)]
#[error("unknown output format '{0}' (expected folded, pprof or svg)")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "folded" | "collapsed" => Ok(Format::Folded),
            "pprof" | "pb" => Ok(Format::Pprof),
            "svg" | "flamegraph" => Ok(Format::Svg),
            _ => Err(UnknownFormat(s.to_string())),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Folded => "folded",
            Format::Pprof => "pprof",
            Format::Svg => "svg",
        })
    }
}

impl Format {
    /// The format an output path asks for by its extension.
    pub fn from_path(path: &Path) -> Result<Self, UnknownFormat> {
        let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        let by_suffix = [
            (".svg", Format::Svg),
            (".pb.gz", Format::Pprof),
            (".pprof", Format::Pprof),
            (".pb", Format::Pprof),
            (".folded", Format::Folded),
            (".collapsed", Format::Folded),
            (".txt", Format::Folded),
        ];
        by_suffix
            .iter()
            .find(|(suffix, _)| name.ends_with(suffix))
            .map(|&(_, f)| f)
            .ok_or_else(|| UnknownFormat(path.extension().map_or_else(|| name.clone(), |e| e.to_string_lossy().into_owned())))
    }

    /// `--format` when given, else the path's extension.
    pub fn resolve(explicit: Option<&str>, path: &Path) -> Result<Self, UnknownFormat> {
        match explicit {
            Some(f) => f.parse(),
            None => Self::from_path(path),
        }
    }
}

pub fn write<S: Samples>(profile: &Profile<S>, format: Format, rendering: &Rendering<'_>, out: impl Write) -> std::io::Result<()> {
    match format {
        Format::Folded => folded::write(profile, rendering.detail, out),
        Format::Pprof => pprof::write(profile, out),
        Format::Svg => svg::write(profile, rendering, out),
    }
}

/// [`write`] of a profile that is not needed afterwards: folded stacks and flame graphs are made
/// from its folded lines, and the profile is let go of once they are (one of the two, not both,
/// is held while the output is written).
pub fn write_owned(profile: FlatProfile, format: Format, rendering: &Rendering<'_>, out: impl Write) -> std::io::Result<()> {
    if format == Format::Pprof {
        return pprof::write(&profile, out);
    }
    let mut names = FrameNames::default();
    let (folded, header) = fold_flat(profile, rendering.detail, &mut names);
    match format {
        Format::Svg => svg::write_folded(&header, &folded, &names, rendering, out),
        _ => folded.write(&names, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_from_paths() {
        assert_eq!(Format::from_path(Path::new("a/b.svg")).unwrap(), Format::Svg);
        assert_eq!(Format::from_path(Path::new("cpu.pb.gz")).unwrap(), Format::Pprof);
        assert_eq!(Format::from_path(Path::new("x.folded")).unwrap(), Format::Folded);
        assert_eq!(Format::from_path(Path::new("x.png")).unwrap_err().0, "png");
        assert_eq!(Format::resolve(Some("pprof"), Path::new("x.png")).unwrap(), Format::Pprof);
        assert!(Format::resolve(Some("jpeg"), Path::new("x.svg")).is_err());
    }
}
