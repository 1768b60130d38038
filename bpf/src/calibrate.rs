//! The cost of a hooked call's traps alone, which the CUDA profiles subtract: measured on a
//! function of this very process, so that it needs no other program and holds for this machine
//! (a VM's traps cost several times a bare machine's).

use std::time::{Duration, Instant};

use libbpf_rs::{ProgramMut, UprobeMultiOpts};

use crate::error::{attach_error, BpfError};

/// What one call of a function hooked by `prog` (entry and return, programs that do nothing)
/// costs beyond the bare call.
pub(crate) fn trap_cost(prog: &ProgramMut<'_>) -> Result<Duration, BpfError> {
    const CALLS: u32 = 500;
    const BATCHES: usize = 7;
    let offset = symbol_offset("gpuflame_calibration_point").ok_or_else(|| BpfError::Attach {
        what: "the calibration probe".into(),
        source: libbpf_rs::Error::from(std::io::Error::other("gpuflame_calibration_point not found in /proc/self/exe")),
    })?;
    let time = || {
        let start = Instant::now();
        for i in 0..CALLS {
            std::hint::black_box(gpuflame_calibration_point(std::hint::black_box(i)));
        }
        start.elapsed()
    };
    let bare = (0..BATCHES).map(|_| time()).min().unwrap_or_default();
    let opts = UprobeMultiOpts { offsets: vec![offset], session: true, ..Default::default() };
    let _link = prog
        .attach_uprobe_multi_with_opts(-1, "/proc/self/exe", "", opts)
        .map_err(|source| attach_error("the calibration probe", source))?;
    // The median batch: a VM's traps cost more now and then.
    let mut probed: Vec<Duration> = (0..BATCHES).map(|_| time()).collect();
    probed.sort();
    Ok(probed[BATCHES / 2].saturating_sub(bare) / CALLS)
}

/// A function for [`crate::CpuSampler::calibrate_trap_cost`] to hook: exported so that its symbol stays.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gpuflame_calibration_point(x: u32) -> u32 {
    std::hint::black_box(x.wrapping_mul(3))
}

/// The file offset of the function `name` (such as [`gpuflame_calibration_point`]) in the
/// running executable: what a uprobe on it attaches to.
pub(crate) fn symbol_offset(name: &str) -> Option<usize> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let data = std::fs::read("/proc/self/exe").ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let sym = elf.symbols().chain(elf.dynamic_symbols()).find(|s| s.name() == Ok(name))?;
    let addr = sym.address();
    elf.segments().find_map(|seg| {
        let (offset, size) = seg.file_range();
        (addr >= seg.address() && addr < seg.address() + size).then(|| (addr - seg.address() + offset) as usize)
    })
}
