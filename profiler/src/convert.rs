//! `gpuflame convert`: pprof or folded in, any format out.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::outfile::Output;
use crate::output::{self, Format, MAX_PROFILE_BYTES};
use crate::UserError;

pub fn run(input: &Path, output_path: &Path, format: Option<&str>, frequency_hz: u64) -> anyhow::Result<()> {
    let format = Format::resolve(format, output_path).map_err(|e| UserError(e.to_string()))?;
    if !(1..=1_000_000_000).contains(&frequency_hz) {
        return Err(UserError(format!("frequency {frequency_hz} Hz is out of range (1 to 1000000000)")).into());
    }
    let bytes = read_bounded(input).map_err(|e| UserError(format!("cannot read {}: {e}", input.display())))?;
    let period = 1_000_000_000 / frequency_hz as i64;
    let profile = output::read(bytes, period).map_err(|e| UserError(format!("{}: {e}", input.display())))?;
    let out = Output::open(output_path).map_err(|e| UserError(e.to_string()))?;
    let title = format!("gpuflame: {}", input.display());
    if let Err(e) = out.write_with(|w| output::write(&profile, format, &title, w)) {
        out.discard();
        return Err(anyhow::Error::new(e).context(format!("writing {}", output_path.display())));
    }
    eprintln!("gpuflame: {} samples → {} ({format})", profile.samples.len(), output_path.display());
    Ok(())
}

/// The input, refused past [`MAX_PROFILE_BYTES`] (it may be a pipe, whose size is not known
/// until it is read).
fn read_bounded(input: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(input)?.take(MAX_PROFILE_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > MAX_PROFILE_BYTES {
        return Err(std::io::Error::other(format!("larger than {} MiB, the most gpuflame reads", MAX_PROFILE_BYTES >> 20)));
    }
    Ok(bytes)
}
