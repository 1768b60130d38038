//! How far behind the reader of the samples ring is: the longest any record waited between its
//! writing (its header's time) and its reading. A starved reader (a node whose CPUs the workload
//! takes) shows here first, before the ring fills and records are lost.

use std::cell::Cell;
use std::mem::offset_of;
use std::time::Duration;

use crate::skel::types;

#[derive(Debug, Default)]
pub(crate) struct RingLag {
    longest_ns: Cell<u64>,
}

impl RingLag {
    /// A record just read: its age counts.
    pub(crate) fn read(&self, record: &[u8]) {
        let at = offset_of!(types::event_header, timestamp_ns);
        let Some(written) = record.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes) else { return };
        let age = boottime_ns().saturating_sub(written);
        if age > self.longest_ns.get() {
            self.longest_ns.set(age);
        }
    }

    /// The longest age since the last call.
    pub(crate) fn take(&self) -> Duration {
        Duration::from_nanos(self.longest_ns.replace(0))
    }
}

/// Now, on the clock the records' times are taken on (CLOCK_BOOTTIME, events.h).
pub fn boottime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::as_bytes;

    #[test]
    fn the_longest_age_of_the_records_read_is_kept_until_taken() {
        let lag = RingLag::default();
        let now = boottime_ns();
        let header = |age_ns: u64| types::event_header { timestamp_ns: now - age_ns, ..Default::default() };
        lag.read(as_bytes(&header(5_000_000)));
        lag.read(as_bytes(&header(1_000_000)));
        lag.read(&[0u8; 8]); // too short: not counted
        let longest = lag.take();
        assert!(longest >= Duration::from_millis(5) && longest < Duration::from_secs(1), "{longest:?}");
        assert!(lag.take() < Duration::from_millis(5));
    }
}
