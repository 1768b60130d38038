//! perf_event_open for the software CPU clock. libc has no `perf_event_attr`, so the fields that
//! gpuflame sets are laid out here, at the kernel ABI's offsets (PERF_ATTR_SIZE_VER7 = 128 bytes).

use std::fs;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const ATTR_FLAG_FREQ: u64 = 1 << 10;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_freq: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    rest: [u64; 9],
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 128);

/// Opens a CPU-clock event on `cpu` for every task, sampling at `frequency_hz`.
pub(crate) fn open_cpu_clock(cpu: u32, frequency_hz: u64) -> io::Result<OwnedFd> {
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        sample_freq: frequency_hz,
        flags: ATTR_FLAG_FREQ,
        ..Default::default()
    };
    // SAFETY: attr is a valid, fully initialised perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The online CPUs, from /sys/devices/system/cpu/online (a list such as `0-3,6`).
pub(crate) fn online_cpus() -> io::Result<Vec<u32>> {
    parse_cpu_list(fs::read_to_string("/sys/devices/system/cpu/online")?.trim())
}

fn parse_cpu_list(list: &str) -> io::Result<Vec<u32>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad CPU list {list:?}"));
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let lo: u32 = lo.parse().map_err(|_| bad())?;
        let hi: u32 = hi.parse().map_err(|_| bad())?;
        if hi < lo {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::parse_cpu_list;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0-3,6,8-9").unwrap(), vec![0, 1, 2, 3, 6, 8, 9]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
    }
}
