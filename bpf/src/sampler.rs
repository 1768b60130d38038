//! The CPU sampler: a perf_event program per online CPU, samples through a ring buffer.

use std::cell::RefCell;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder};

use crate::error::{is_permission, BpfError};
use crate::perf;
use crate::skel::{types, CpuSamplerSkel, CpuSamplerSkelBuilder};

const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// Which processes are sampled. The filter runs in BPF: samples of other processes never reach
/// user space.
#[derive(Debug, Clone)]
pub enum Targets {
    /// Every process on the machine (the idle task excluded).
    All,
    /// These processes with all their threads; with `follow_forks`, every process they start too.
    Processes { pids: Vec<u32>, follow_forks: bool },
}

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Samples per second on each CPU.
    pub frequency_hz: u64,
    pub targets: Targets,
}

/// The outcome of one stack read in BPF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackRead {
    /// Instruction pointers, leaf first: the sampled address, then return addresses.
    Frames(Vec<u64>),
    /// The read failed with this errno (a kernel stack read of a user-mode sample is empty, not
    /// failed).
    Failed(i32),
}

impl StackRead {
    pub fn frames(&self) -> &[u64] {
        match self {
            StackRead::Frames(f) => f,
            StackRead::Failed(_) => &[],
        }
    }
}

/// One CPU-clock sample as BPF recorded it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// CLOCK_BOOTTIME nanoseconds.
    pub timestamp_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub comm: String,
    pub kernel_stack: StackRead,
    pub user_stack: StackRead,
}

/// The sampler's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Samples of target processes taken in BPF.
    pub samples: u64,
    /// Samples dropped because the ring buffer was full.
    pub lost: u64,
    pub kernel_stack_failed: u64,
    pub user_stack_failed: u64,
    /// New descendants that did not fit into the target map.
    pub targets_full: u64,
}

/// A loaded and attached sampler. Dropping it detaches everything.
pub struct CpuSampler {
    // Field order is drop order: detach and stop reading before the object goes.
    _links: Vec<Link>,
    ring: RingBuffer<'static>,
    inbox: Rc<RefCell<Vec<Sample>>>,
    malformed: Rc<RefCell<u64>>,
    skel: CpuSamplerSkel<'static>,
}

impl CpuSampler {
    /// Loads the programs, opens one CPU-clock event per online CPU and starts sampling.
    pub fn start(config: &SamplerConfig) -> Result<Self, BpfError> {
        if !Path::new(BTF_PATH).exists() {
            return Err(BpfError::NoBtf(BTF_PATH.into()));
        }
        // The skeleton borrows its object storage for its whole life; one small allocation per
        // sampler is leaked so that the sampler can own the skeleton.
        let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = CpuSamplerSkelBuilder::default().open(storage).map_err(BpfError::load)?;
        let (mode, follow) = match &config.targets {
            Targets::All => (types::target_mode::TARGET_ALL, false),
            Targets::Processes { follow_forks, .. } => (types::target_mode::TARGET_PIDS, *follow_forks),
        };
        let rodata = open.maps.rodata_data.as_deref_mut().ok_or_else(|| {
            BpfError::Load(libbpf_rs::Error::from(std::io::Error::other("the skeleton has no .rodata")))
        })?;
        rodata.target_mode = mode;
        rodata.follow_forks = u8::from(follow);
        let skel = open.load().map_err(BpfError::load)?;

        let mut sampler_links = Vec::new();
        if follow {
            for prog in [&skel.progs.on_process_fork, &skel.progs.on_process_exit] {
                let link = prog.attach().map_err(|source| attach_error("the fork tracepoints", source))?;
                sampler_links.push(link);
            }
        }

        let inbox = Rc::new(RefCell::new(Vec::new()));
        let malformed = Rc::new(RefCell::new(0u64));
        let ring = {
            let (inbox, malformed) = (Rc::clone(&inbox), Rc::clone(&malformed));
            let mut builder = RingBufferBuilder::new();
            builder
                .add(&skel.maps.samples, move |data: &[u8]| {
                    match decode(data) {
                        Some(sample) => inbox.borrow_mut().push(sample),
                        None => *malformed.borrow_mut() += 1,
                    }
                    0
                })
                .map_err(BpfError::RingBuffer)?;
            builder.build().map_err(BpfError::RingBuffer)?
        };

        let mut sampler = CpuSampler {
            _links: sampler_links,
            ring,
            inbox,
            malformed,
            skel,
        };
        if let Targets::Processes { pids, .. } = &config.targets {
            for &pid in pids {
                sampler.add_target(pid)?;
            }
        }
        sampler.attach_perf_events(config.frequency_hz)?;
        Ok(sampler)
    }

    fn attach_perf_events(&mut self, frequency_hz: u64) -> Result<(), BpfError> {
        for cpu in perf::online_cpus().map_err(BpfError::OnlineCpus)? {
            let fd = perf::open_cpu_clock(cpu, frequency_hz).map_err(|source| {
                if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
                    BpfError::PermissionDenied
                } else {
                    BpfError::PerfEventOpen { cpu, source }
                }
            })?;
            let link = self
                .skel
                .progs
                .on_cpu_sample
                .attach_perf_event(fd.as_raw_fd())
                .map_err(|source| attach_error(&format!("the sampler to CPU {cpu}"), source))?;
            // The link owns the perf event from here on: libbpf closes it when the link goes.
            let _ = fd.into_raw_fd();
            self._links.push(link);
        }
        Ok(())
    }

    /// Adds a process (all its threads) to the targets.
    pub fn add_target(&self, pid: u32) -> Result<(), BpfError> {
        self.skel
            .maps
            .targets
            .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .map_err(|source| BpfError::Map { map: "targets", source })
    }

    /// Waits up to `timeout` for samples and returns those that arrived.
    pub fn poll(&mut self, timeout: Duration) -> Result<Vec<Sample>, BpfError> {
        match self.ring.poll(timeout) {
            Ok(()) => {}
            // A signal (Ctrl-C) interrupts the wait; that is not an error.
            Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
            Err(e) => return Err(BpfError::RingBuffer(e)),
        }
        Ok(std::mem::take(&mut *self.inbox.borrow_mut()))
    }

    /// Reads whatever is in the ring buffer without waiting.
    pub fn drain(&mut self) -> Result<Vec<Sample>, BpfError> {
        self.ring.consume().map_err(BpfError::RingBuffer)?;
        Ok(std::mem::take(&mut *self.inbox.borrow_mut()))
    }

    /// Records that did not have the size of a sample (a layout mismatch; should stay 0).
    pub fn malformed_records(&self) -> u64 {
        *self.malformed.borrow()
    }

    pub fn counters(&self) -> Result<Counters, BpfError> {
        let read = |c: types::counter| -> Result<u64, BpfError> {
            let values = self
                .skel
                .maps
                .counters
                .lookup_percpu(&c.0.to_ne_bytes(), MapFlags::ANY)
                .map_err(|source| BpfError::Map { map: "counters", source })?
                .unwrap_or_default();
            Ok(values
                .iter()
                .filter_map(|v| v.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes))
                .sum())
        };
        Ok(Counters {
            samples: read(types::counter::COUNTER_SAMPLES)?,
            lost: read(types::counter::COUNTER_LOST)?,
            kernel_stack_failed: read(types::counter::COUNTER_KSTACK_FAILED)?,
            user_stack_failed: read(types::counter::COUNTER_USTACK_FAILED)?,
            targets_full: read(types::counter::COUNTER_TARGETS_FULL)?,
        })
    }
}

fn attach_error(what: &str, source: libbpf_rs::Error) -> BpfError {
    if is_permission(&source) {
        BpfError::PermissionDenied
    } else {
        BpfError::Attach { what: what.to_string(), source }
    }
}

fn decode(data: &[u8]) -> Option<Sample> {
    if data.len() < size_of::<types::sample_event>() {
        return None;
    }
    // SAFETY: the length was checked, sample_event is plain old data generated from the BPF
    // object's BTF, and read_unaligned makes no alignment assumption.
    let e: types::sample_event = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
    let comm_bytes: Vec<u8> = e.comm.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    Some(Sample {
        timestamp_ns: e.timestamp_ns,
        pid: e.pid,
        tid: e.tid,
        cpu: e.cpu,
        comm: String::from_utf8_lossy(&comm_bytes).into_owned(),
        kernel_stack: stack(&e.kernel_stack, e.kernel_stack_bytes),
        user_stack: stack(&e.user_stack, e.user_stack_bytes),
    })
}

fn stack(frames: &[u64], bytes: i32) -> StackRead {
    if bytes < 0 {
        // An empty kernel part of a user-mode sample reads as EFAULT: no failure, no frames.
        if -bytes == libc::EFAULT {
            return StackRead::Frames(Vec::new());
        }
        return StackRead::Failed(-bytes);
    }
    let n = (bytes as usize / size_of::<u64>()).min(frames.len());
    StackRead::Frames(frames[..n].iter().copied().take_while(|&ip| ip != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_layout_matches_the_c_header() {
        // The generated mirror must keep the header's layout: 40 bytes of fixed fields, the comm,
        // then two stacks of MAX_STACK_DEPTH (127) frames.
        assert_eq!(size_of::<types::sample_event>(), 8 + 4 * 6 + 16 + 2 * 127 * 8);
        assert_eq!(std::mem::offset_of!(types::sample_event, comm), 32);
        assert_eq!(std::mem::offset_of!(types::sample_event, kernel_stack), 48);
    }

    #[test]
    fn decodes_a_record() {
        let mut e = types::sample_event::default();
        e.pid = 42;
        e.tid = 43;
        e.comm[..3].copy_from_slice(&[b'f' as i8, b'o' as i8, b'o' as i8]);
        e.kernel_stack_bytes = -libc::EFAULT;
        e.user_stack[..2].copy_from_slice(&[0x1000, 0x2000]);
        e.user_stack_bytes = 16;
        // SAFETY: viewing a plain-old-data struct as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&e as *const types::sample_event).cast::<u8>(), size_of::<types::sample_event>())
        };
        let s = decode(bytes).unwrap();
        assert_eq!((s.pid, s.tid, s.comm.as_str()), (42, 43, "foo"));
        assert_eq!(s.kernel_stack, StackRead::Frames(vec![]));
        assert_eq!(s.user_stack, StackRead::Frames(vec![0x1000, 0x2000]));
        assert!(decode(&bytes[..10]).is_none());
    }
}
