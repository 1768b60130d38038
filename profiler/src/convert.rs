//! `gpuflame convert`: pprof or folded in, any format out.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;

use crate::output::{self, Format};
use crate::UserError;

pub fn run(input: &Path, output_path: &Path, format: Option<&str>, frequency_hz: u64) -> anyhow::Result<()> {
    let format = Format::resolve(format, output_path).map_err(|e| UserError(e.to_string()))?;
    let bytes = fs::read(input).map_err(|e| UserError(format!("cannot read {}: {e}", input.display())))?;
    let period = 1_000_000_000 / frequency_hz.max(1) as i64;
    let profile = output::read(&bytes, period).map_err(|e| UserError(format!("{}: {e}", input.display())))?;
    let out = File::create(output_path)
        .map_err(|e| UserError(format!("cannot write the output {}: {e}", output_path.display())))?;
    let mut w = BufWriter::new(out);
    let title = format!("gpuflame: {}", input.display());
    output::write(&profile, format, &title, &mut w)
        .and_then(|()| w.flush())
        .with_context(|| format!("writing {}", output_path.display()))?;
    eprintln!("gpuflame: {} samples → {} ({format})", profile.samples.len(), output_path.display());
    Ok(())
}
