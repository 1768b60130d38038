//! gpuflame: the profiler. BPF events → session → sources → stacks (symbolized) → profile →
//! writers and uploader. docs/ARCHITECTURE.md is the map.

pub mod agent;
pub mod cli;
pub mod convert;
pub mod cuda;
pub mod dump;
pub mod frame;
pub mod names;
pub mod outfile;
pub mod output;
pub mod preflight;
pub mod process;
pub mod profile;
pub mod profile_kind;
pub mod samples;
pub mod record;
pub mod session;
pub mod sources;
pub mod stacks;
pub mod status;
pub mod target;
pub mod units;
pub mod workload;

/// A failure the user caused or can fix (bad flag, missing privilege, unknown PID): reported as
/// one line, exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UserError(pub String);

/// `v` seconds as a [`std::time::Duration`] if it lies in `min..=max`: `Duration::from_secs_f64`
/// panics on what it cannot hold (`-d 1e20`), and a 1e300 s window is no setting anyone means.
pub fn seconds_in(v: f64, what: &str, min: f64, max: f64) -> Result<std::time::Duration, UserError> {
    match std::time::Duration::try_from_secs_f64(v) {
        Ok(d) if v >= min && v <= max => Ok(d),
        _ => Err(UserError(format!("{what} {} is out of range ({min} to {max} seconds)", short(v)))),
    }
}

/// `v` as a person would write it: 1e300 rather than 301 digits.
fn short(v: f64) -> String {
    if v.is_finite() && v != 0.0 && !(1e-3..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_out_of_range_are_errors_not_panics() {
        for v in [1e300, 1e20, f64::INFINITY, f64::NAN, -1.0, 0.0, 1e-12] {
            assert!(super::seconds_in(v, "x", 0.001, 100.0).is_err(), "{v}");
        }
        assert_eq!(super::seconds_in(0.5, "x", 0.001, 100.0).unwrap(), std::time::Duration::from_millis(500));
    }
}
