//! `gpuflame convert`: pprof or folded in, any format out; and `gpuflame diff`: two in, a
//! differential flame graph out.

use std::path::Path;

use crate::outfile::Output;
use crate::output::diff::{self, Diff};
use crate::output::fold::fold_flat;
use crate::output::frame_names::FrameNames;
use crate::output::load::{load, LoadError};
use crate::output::select::{select, Where};
use crate::output::{self, Format};
use crate::samples::{FlatProfile, Samples};
use crate::UserError;

/// The profile in `path`, the error said as `convert` and `diff` say it.
fn read(path: &Path, period: i64) -> Result<FlatProfile, UserError> {
    load(path, period).map_err(|e| match e {
        LoadError::Read(e) => UserError(format!("cannot read {}: {e}", path.display())),
        LoadError::Content(e) => UserError(format!("{}: {e}", path.display())),
    })
}

pub fn run(input: &Path, output_path: &Path, format: Option<&str>, frequency_hz: u64, detail: output::Detail, conditions: &[Where]) -> anyhow::Result<()> {
    let format = Format::resolve(format, output_path).map_err(|e| UserError(e.to_string()))?;
    if !(1..=1_000_000_000).contains(&frequency_hz) {
        return Err(UserError(format!("frequency {frequency_hz} Hz is out of range (1 to 1000000000)")).into());
    }
    let period = 1_000_000_000 / frequency_hz as i64;
    let profile = selected(read(input, period)?, conditions, input)?;
    let out = Output::open(output_path).map_err(|e| UserError(e.to_string()))?;
    let title = format!("{} · {}", input.file_name().map_or_else(|| input.display().to_string(), |n| n.to_string_lossy().into_owned()), profile.sample_type().kind);
    let amount = amount(&profile);
    // The profile is let go of as soon as what is written is made from it.
    if let Err(e) = out.write_with(|w| output::write_owned(profile, format, &output::Rendering { title: &title, detail }, w)) {
        out.discard();
        return Err(anyhow::Error::new(e).context(format!("writing {}", output_path.display())));
    }
    eprintln!("gpuflame: {amount} → {} ({format})", output_path.display());
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
    let detail = crate::cli::detail(args.lines);
    // Each profile is folded as soon as it is read, and let go of: the two are never held at once.
    let mut names = FrameNames::default();
    let (base_lines, base) = fold_flat(selected(read(&args.base, period)?, &args.base_where, &args.base)?, detail, &mut names);
    let new = selected(read(&args.new, period)?, &args.new_where, &args.new)?;
    diff::check(&base, &new).map_err(|e| UserError(e.to_string()))?;
    let (new_lines, new) = fold_flat(new, detail, &mut names);
    let lines = Diff::new(names, base_lines, new_lines, args.normalize);
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
fn selected(profile: FlatProfile, conditions: &[Where], path: &Path) -> Result<FlatProfile, UserError> {
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
fn amount(profile: &FlatProfile) -> String {
    let total: i64 = (0..profile.samples.len()).filter_map(|i| profile.samples.values(i).first()).sum();
    let t = profile.sample_type();
    let what = if t.unit == "nanoseconds" && profile.period > 1 { format!("{} samples", total / profile.period) } else { format!("{total} {}", t.unit) };
    format!("{what} in {} stacks", profile.samples.len())
}
