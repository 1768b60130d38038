//! `gpuflame convert`: pprof or folded in, any format out; and `gpuflame diff`: two in, a
//! differential flame graph out.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::outfile::Output;
use crate::output::select::{select, Where};
use crate::output::diff::{self, Diff};
use crate::output::{self, Format, MAX_PROFILE_BYTES};
use crate::UserError;

pub fn run(input: &Path, output_path: &Path, format: Option<&str>, frequency_hz: u64, detail: output::Detail, conditions: &[Where]) -> anyhow::Result<()> {
    let format = Format::resolve(format, output_path).map_err(|e| UserError(e.to_string()))?;
    if !(1..=1_000_000_000).contains(&frequency_hz) {
        return Err(UserError(format!("frequency {frequency_hz} Hz is out of range (1 to 1000000000)")).into());
    }
    let bytes = read_bounded(input).map_err(|e| UserError(format!("cannot read {}: {e}", input.display())))?;
    let period = 1_000_000_000 / frequency_hz as i64;
    let profile = output::read(bytes, period).map_err(|e| UserError(format!("{}: {e}", input.display())))?;
    let profile = selected(profile, conditions, input)?;
    let out = Output::open(output_path).map_err(|e| UserError(e.to_string()))?;
    let title = format!("{} · {}", input.file_name().map_or_else(|| input.display().to_string(), |n| n.to_string_lossy().into_owned()), profile.sample_type().kind);
    if let Err(e) = out.write_with(|w| output::write(&profile, format, &output::Rendering { title: &title, detail }, w)) {
        out.discard();
        return Err(anyhow::Error::new(e).context(format!("writing {}", output_path.display())));
    }
    eprintln!("gpuflame: {} → {} ({format})", amount(&profile), output_path.display());
    Ok(())
}

pub fn diff(args: &crate::cli::DiffArgs) -> anyhow::Result<()> {
    let format = Format::resolve(args.format.as_deref(), &args.output).map_err(|e| UserError(e.to_string()))?;
    if format == Format::Pprof {
        return Err(UserError("a differential profile is written as svg or folded (stack BASE NEW), not pprof".into()).into());
    }
    if !(1..=1_000_000_000).contains(&args.frequency) {
        return Err(UserError(format!("frequency {} Hz is out of range (1 to 1000000000)", args.frequency)).into());
    }
    let period = 1_000_000_000 / args.frequency as i64;
    let load = |path: &Path| -> Result<crate::profile::Profile, UserError> {
        let bytes = read_bounded(path).map_err(|e| UserError(format!("cannot read {}: {e}", path.display())))?;
        output::read(bytes, period).map_err(|e| UserError(format!("{}: {e}", path.display())))
    };
    let (base, new) = (selected(load(&args.base)?, &args.base_where, &args.base)?, selected(load(&args.new)?, &args.new_where, &args.new)?);
    let lines = Diff::of(&base, &new, crate::cli::detail(args.lines), args.normalize).map_err(|e| match e {
        diff::DiffError::Mismatch { .. } => anyhow::Error::from(UserError(e.to_string())),
        diff::DiffError::Io(e) => anyhow::Error::from(e),
    })?;
    let name = |p: &Path| p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned());
    let side = |p: &Path, conditions: &[Where]| match conditions {
        [] => name(p),
        c => format!("{} where {}", name(p), c.iter().map(Where::to_string).collect::<Vec<_>>().join(", ")),
    };
    let title = format!("{} → {} · {}", side(&args.base, &args.base_where), side(&args.new, &args.new_where), new.sample_type().kind);
    let subtitle = if args.normalize { "differential, base normalized to the new total" } else { "differential" };
    let count_name = if new.sample_type().unit == "nanoseconds" && new.period > 1 { "samples".to_string() } else { new.sample_type().unit.clone() };
    let out = Output::open(&args.output).map_err(|e| UserError(e.to_string()))?;
    let written = out.write_with(|w| match format {
        Format::Svg => lines.write_svg(&title, subtitle, &count_name, w),
        _ => lines.write_folded(w),
    });
    if let Err(e) = written {
        out.discard();
        return Err(anyhow::Error::new(e).context(format!("writing {}", args.output.display())));
    }
    let s = lines.summary();
    eprintln!(
        "gpuflame: {} {count_name} in the base, {} in the new profile; {} stacks grew, {} shrank or went → {} ({format})",
        s.base_samples, s.new_samples, s.grew, s.shrank, args.output.display()
    );
    Ok(())
}

/// The samples of `profile` that `conditions` select; none selected is an error that says which
/// values there are, not an empty flame graph.
fn selected(profile: crate::profile::Profile, conditions: &[Where], path: &Path) -> Result<crate::profile::Profile, UserError> {
    if conditions.is_empty() {
        return Ok(profile);
    }
    let known: std::collections::BTreeSet<String> = profile.process_labels.values().flatten().map(|(k, v)| format!("{k}={v}")).collect();
    let picked = select(profile, conditions);
    if picked.samples.is_empty() {
        let said = conditions.iter().map(Where::to_string).collect::<Vec<_>>().join(", ");
        let known = if known.is_empty() { "no process labels".to_string() } else { known.into_iter().take(20).collect::<Vec<_>>().join(", ") };
        return Err(UserError(format!("{}: no samples where {said} (its process labels: {known})", path.display())));
    }
    Ok(picked)
}

/// What a profile holds, as its summary line says it: samples for sampled time (values over the
/// period), else the total in the profile's unit; and the distinct stacks.
fn amount(profile: &crate::profile::Profile) -> String {
    let total: i64 = profile.samples.iter().filter_map(|s| s.values.first()).sum();
    let t = profile.sample_type();
    let what = if t.unit == "nanoseconds" && profile.period > 1 { format!("{} samples", total / profile.period) } else { format!("{total} {}", t.unit) };
    format!("{what} in {} stacks", profile.samples.len())
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
