//! A recording that found almost nothing on the CPU says so in one line, with what to try: a first
//! flame graph of an idle machine is otherwise two samples and no word of why.

use std::time::Duration;

use crate::profile_kind::ProfileKind;

/// What was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    Machine,
    Pids,
    Command,
}

/// The hint after `samples` CPU samples of programs in `duration` at `frequency_hz` (gpuflame's
/// own and the kernel's threads left out: building tables at its start, or the kernel's
/// housekeeping, is no work a user asked for), when they are fewer than a twentieth of one CPU
/// busy all along; none for a command (it may just be quick), a
/// recording under a second, or one without the CPU profile.
pub(super) fn idle_hint(recorded: Recorded, samples: u64, duration: Duration, frequency_hz: u64, profiles: &[ProfileKind]) -> Option<String> {
    let secs = duration.as_secs_f64();
    if !profiles.contains(&ProfileKind::Cpu) || secs < 1.0 || (samples as f64) * 20.0 >= secs * frequency_hz as f64 {
        return None;
    }
    let seen = format!("{samples} samples in {secs:.1} s at {frequency_hz} Hz");
    match recorded {
        Recorded::Machine => Some(format!("the machine was nearly idle ({seen}): to profile a program, `gpuflame record -o flame.svg -- CMD` or `-p PID`")),
        Recorded::Pids if !profiles.iter().any(|p| matches!(p, ProfileKind::OffCpu | ProfileKind::Wall)) => {
            Some(format!("the target barely ran on a CPU ({seen}): where it waited shows with `--profiles off-cpu,wall`"))
        }
        Recorded::Pids | Recorded::Command => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_S: Duration = Duration::from_secs(5);

    #[test]
    fn an_idle_machine_gets_the_hint_and_a_busy_one_does_not() {
        let hint = idle_hint(Recorded::Machine, 2, FIVE_S, 99, &[ProfileKind::Cpu]).expect("a hint");
        assert_eq!(hint, "the machine was nearly idle (2 samples in 5.0 s at 99 Hz): to profile a program, `gpuflame record -o flame.svg -- CMD` or `-p PID`");
        // A twentieth of one CPU for 5 s at 99 Hz is 24.75 samples.
        assert!(idle_hint(Recorded::Machine, 24, FIVE_S, 99, &[ProfileKind::Cpu]).is_some());
        assert_eq!(idle_hint(Recorded::Machine, 25, FIVE_S, 99, &[ProfileKind::Cpu]), None);
        assert_eq!(idle_hint(Recorded::Machine, 495, FIVE_S, 99, &[ProfileKind::Cpu]), None);
    }

    #[test]
    fn no_hint_where_few_samples_say_nothing() {
        assert_eq!(idle_hint(Recorded::Command, 0, FIVE_S, 99, &[ProfileKind::Cpu]), None);
        assert_eq!(idle_hint(Recorded::Machine, 0, Duration::from_millis(500), 99, &[ProfileKind::Cpu]), None);
        assert_eq!(idle_hint(Recorded::Machine, 0, FIVE_S, 99, &[ProfileKind::HbmInUse]), None);
        assert_eq!(idle_hint(Recorded::Pids, 0, FIVE_S, 99, &[ProfileKind::Cpu, ProfileKind::OffCpu]), None);
        assert!(idle_hint(Recorded::Pids, 0, FIVE_S, 99, &[ProfileKind::Cpu]).is_some_and(|h| h.contains("--profiles off-cpu,wall")));
    }
}
