//! The live set of device memory, as the programs keep it (live_allocations.h): read whole at a
//! window's end, or one process's at an out-of-memory, while the hold the failure set keeps its
//! frees from taking anything out.

use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::{MapCore, MapFlags};

use crate::error::BpfError;
use crate::events::LiveKind;
use crate::pod::{as_bytes, read_pod};
use crate::programs::BpfPrograms;
use crate::skel::types;

/// One tensor or segment live now (or, during an out-of-memory's hold, freed since it began).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveAllocation {
    pub pid: u32,
    pub tid: u32,
    pub addr: u64,
    pub size: u64,
    /// Its stack's id, as the allocation's record carried it (0: none; `kind` says why).
    pub stack: u64,
    /// When it was allocated (CLOCK_BOOTTIME).
    pub t_ns: u64,
    pub stream: u64,
    /// Freed during an out-of-memory's hold, at this time; 0: live.
    pub freed_ns: u64,
    pub kind: LiveKind,
}

/// Entries read per system call.
const BATCH: u32 = 4096;

/// Every entry of a hash map, `BATCH` a system call, until the kernel says there are no more. A
/// batch may come back short before the end (it stops at a bucket's edge): only ENOENT ends it,
/// which libbpf-rs's iterator does not wait for. A bucket bigger than the batch (ENOSPC) is read
/// with a batch of its size.
fn read_batches(fd: i32, mut each: impl FnMut(&[u8], &[u8])) -> Result<(), libbpf_rs::Error> {
    let (key_size, value_size) = (std::mem::size_of::<types::live_key>(), std::mem::size_of::<types::live_allocation>());
    let mut batch = BATCH as usize;
    let (mut keys, mut values) = (vec![0u8; batch * key_size], vec![0u8; batch * value_size]);
    let (mut token, mut next) = (vec![0u8; key_size], vec![0u8; key_size]);
    let mut first = true;
    let opts = libbpf_sys::bpf_map_batch_opts { sz: std::mem::size_of::<libbpf_sys::bpf_map_batch_opts>() as _, ..Default::default() };
    loop {
        let mut count = batch as u32;
        let in_batch = if first { std::ptr::null_mut() } else { token.as_mut_ptr().cast() };
        // SAFETY: the buffers hold `batch` keys and values of the map's sizes, and a key each for
        // the tokens; the kernel writes no more than `count` of them.
        let ret = unsafe { libbpf_sys::bpf_map_lookup_batch(fd, in_batch, next.as_mut_ptr().cast(), keys.as_mut_ptr().cast(), values.as_mut_ptr().cast(), &mut count, &opts) };
        let errno = if ret < 0 { std::io::Error::last_os_error().raw_os_error().unwrap_or(0) } else { 0 };
        if errno == libc::ENOSPC && batch < 1 << 20 {
            batch *= 4;
            keys.resize(batch * key_size, 0);
            values.resize(batch * value_size, 0);
            continue;
        }
        if ret < 0 && errno != libc::ENOENT {
            return Err(libbpf_rs::Error::from(std::io::Error::from_raw_os_error(errno)));
        }
        for i in 0..count as usize {
            each(&keys[i * key_size..][..key_size], &values[i * value_size..][..value_size]);
        }
        if errno == libc::ENOENT {
            return Ok(());
        }
        std::mem::swap(&mut token, &mut next);
        first = false;
    }
}

fn decode(key: &[u8], value: &[u8]) -> Option<LiveAllocation> {
    let types::live_key { pid, tensor: _, addr } = read_pod(key)?;
    let types::live_allocation { size, stack, t_ns, stream, freed_ns, tid, api, device, flags } = read_pod(value)?;
    Some(LiveAllocation { pid, tid, addr, size, stack, t_ns, stream, freed_ns, kind: LiveKind::of(api, device, flags) })
}

impl BpfPrograms {
    /// Every allocation in the live set now, of every process (those of processes that exited
    /// too, until [`BpfPrograms::forget_live`]).
    pub fn live_allocations(&self) -> Result<Vec<LiveAllocation>, BpfError> {
        let map = &self.skel().maps.live_allocations;
        let mut out = Vec::new();
        read_batches(map.as_fd().as_raw_fd(), |k, v| out.extend(decode(k, v))).map_err(|source| BpfError::Map { map: "live_allocations", source })?;
        Ok(out)
    }

    /// Takes these allocations of processes that exited out of the live set, those freed and
    /// kept with them. An allocation made at the same address since is put back.
    pub fn forget_live(&mut self, gone: &[LiveAllocation]) -> Result<(), BpfError> {
        let map = &self.skel().maps.live_allocations;
        let mut kept = 0i64;
        for a in gone {
            let key = types::live_key { pid: a.pid, tensor: u32::from(a.kind.api.is_some_and(crate::cuda::CudaApi::is_tensor)), addr: a.addr };
            let Ok(Some(value)) = map.lookup_and_delete(as_bytes(&key)) else { continue };
            let Some(v) = read_pod::<types::live_allocation>(&value) else { continue };
            // Between the read and now, the address was allocated again: that one stays.
            if v.t_ns != a.t_ns {
                let _ = map.update(as_bytes(&key), &value, MapFlags::NO_EXIST);
            } else if v.freed_ns != 0 {
                kept += 1;
            }
        }
        if kept > 0 {
            if let Some(bss) = self.skel_mut().maps.bss_data.as_deref_mut() {
                // SAFETY: the field is an aligned i64 of the map's mmap, which the programs change
                // with atomic adds only; so does this.
                let count = unsafe { std::sync::atomic::AtomicI64::from_ptr(std::ptr::addr_of_mut!(bss.live_freed_kept)) };
                count.fetch_sub(kept, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Freed allocations the live set keeps now for the next at their address.
    pub fn live_freed_kept(&self) -> i64 {
        self.skel().maps.bss_data.as_deref().map_or(0, |bss| bss.live_freed_kept)
    }

    /// The allocations the live set holds for `pid` as they were at its out-of-memory (those made
    /// after it left out, those freed since kept), then the hold ended.
    pub fn live_at_oom(&mut self, pid: u32) -> Result<Vec<LiveAllocation>, BpfError> {
        let holds = &self.skel().maps.oom_holds;
        let at = holds
            .lookup(&pid.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| BpfError::Map { map: "oom_holds", source })?
            .and_then(|v| v.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes));
        let mut all = self.live_allocations()?;
        all.retain(|a| a.pid == pid);
        let _ = holds.delete(&pid.to_ne_bytes());
        if holds.keys().next().is_none() {
            if let Some(bss) = self.skel_mut().maps.bss_data.as_deref_mut() {
                bss.oom_holds_pending = 0;
            }
        }
        // The frees the hold kept stay in the map, freed at their time, for the next allocation
        // at their address: taking them out here would race with one writing into them. Held at
        // the failure: allocated before it and not freed before it.
        all.retain(|a| a.freed_ns == 0 || at.is_some_and(|at| a.freed_ns >= at));
        if let Some(at) = at {
            all.retain(|a| a.t_ns <= at);
        }
        Ok(all)
    }

    /// Ends the holds of out-of-memory failures older than `older_than_ns` whose record never
    /// came (the full ring lost it): their processes' frees take allocations out again.
    pub fn end_stale_oom_holds(&mut self, older_than_ns: u64) -> Result<(), BpfError> {
        let now = crate::ring_lag::boottime_ns();
        let holds = &self.skel().maps.oom_holds;
        let stale: Vec<u32> = holds
            .keys()
            .filter_map(|k| {
                let at = holds.lookup(&k, MapFlags::ANY).ok()??;
                let at = u64::from_ne_bytes(at.get(..8)?.try_into().ok()?);
                let pid = u32::from_ne_bytes(k.get(..4)?.try_into().ok()?);
                (now.saturating_sub(at) > older_than_ns).then_some(pid)
            })
            .collect();
        for pid in stale {
            self.live_at_oom(pid)?;
        }
        Ok(())
    }

    /// Kernel memory the live set takes now, as the kernel counts it (its map's memlock in
    /// fdinfo), with the entries it holds.
    pub fn live_set_memory(&self) -> Option<u64> {
        let fd = self.skel().maps.live_allocations.as_fd().as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
        info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200,000 entries in a hash map of a million buckets: batches come back short at buckets
    /// of two or more, and every entry must still be read (libbpf-rs's iterator stopped at the
    /// first short batch: half of a 100,000-tensor live set went unread).
    #[test]
    fn every_entry_of_a_big_live_set_is_read() {
        // A test that cannot run fails, saying why: a skip would pass for a result.
        // SAFETY: geteuid has no preconditions.
        assert!(unsafe { libc::geteuid() } == 0, "this test makes a BPF map: run it as root (the test command does)");
        let opts = libbpf_sys::bpf_map_create_opts { sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _, map_flags: libbpf_sys::BPF_F_NO_PREALLOC, ..Default::default() };
        let map = libbpf_rs::MapHandle::create(libbpf_rs::MapType::Hash, Some("live_test"), 16, 48, 1 << 20, &opts).expect("a hash map");
        let n = 200_000u64;
        for i in 0..n {
            let key = types::live_key { pid: 7, tensor: 1, addr: 0x1000 * i };
            let value = types::live_allocation { size: i, ..Default::default() };
            map.update(as_bytes(&key), as_bytes(&value), MapFlags::NO_EXIST).expect("an entry");
        }
        let (mut count, mut sum) = (0u64, 0u64);
        read_batches(map.as_fd().as_raw_fd(), |k, v| {
            let a = decode(k, v).expect("decodes");
            count += 1;
            sum += a.size;
        })
        .expect("read");
        assert_eq!((count, sum), (n, n * (n - 1) / 2));
    }

    #[test]
    fn an_entry_decodes_with_its_kind() {
        let key = types::live_key { pid: 3, tensor: 0, addr: 0x7000 };
        let flags = (types::live_flags::LIVE_IN_ALLOCATOR.0 | types::live_flags::LIVE_STACK_LOST.0) as u8;
        let value = types::live_allocation { size: 20 << 20, stack: 0, t_ns: 5, stream: 9, freed_ns: 0, tid: 4, api: types::cuda_api::CUDA_MALLOC.0 as u16, device: 1, flags };
        let a = decode(as_bytes(&key), as_bytes(&value)).unwrap();
        assert_eq!((a.pid, a.addr, a.size, a.t_ns, a.stream, a.tid, a.kind.device), (3, 0x7000, 20 << 20, 5, 9, 4, 1));
        assert!(a.kind.in_allocator && a.kind.stack_lost && !a.kind.sampled_out);
        assert_eq!(a.kind.api, Some(crate::cuda::CudaApi::CudaMalloc));
        assert!(decode(&as_bytes(&key)[..8], as_bytes(&value)).is_none());
    }
}
