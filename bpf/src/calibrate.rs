//! The cost of a hooked call's traps alone, which the CUDA profiles subtract: measured on a
//! function of this very process, so that it needs no other program and holds for this machine
//! (a VM's traps cost several times a bare machine's).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use libbpf_rs::{Link, ProgramMut, UprobeMultiOpts, UprobeOpts};

use crate::error::{attach_error, BpfError};

/// What the traps of a hooked call cost on this machine, beyond its programs: an entry and a
/// return trap where the kernel emulates the function's first instruction (a `push`, as most
/// functions begin), and a third trap to step it out of line where it cannot (an `endbr64`, a
/// `sub`, a `mov`). The difference is large: 1.2 against 10 µs on a VM here, and taking one
/// for the other put an H200's launch counts at defaults at 1.2 to 1.8 times the truth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrapCost {
    pub emulated: Duration,
    pub stepped: Duration,
    /// Nested calls trap at their return too: kernels without uprobe sessions hook every return
    /// that has a half, whether or not its entry asked for it.
    pub nested_return: bool,
}

/// How a hooked call trapped: whether its own first instruction was stepped out of line, and the
/// hooked calls nested in it (an entry trap each, no return trap), how many of them stepped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookTraps {
    pub stepped: bool,
    pub nested: u32,
    pub nested_stepped: u32,
}

impl TrapCost {
    /// What the traps of one call cost.
    pub fn of(&self, traps: HookTraps) -> Duration {
        let entry = if self.nested_return { self.emulated } else { self.emulated / 2 };
        let step = self.stepped.saturating_sub(self.emulated);
        let own = if traps.stepped { self.stepped } else { self.emulated };
        own + entry * traps.nested + step * traps.nested_stepped.min(traps.nested)
    }
}

/// Measures both costs on two functions of this process hooked by `prog` (entry and return,
/// programs that do nothing): one that starts with `push %rbp`, one with `lea`.
/// The programs that hook the calibration functions, as the CUDA functions are hooked here.
pub(crate) enum Probes<'a, 'obj> {
    Session(&'a ProgramMut<'obj>),
    EntryAndReturn(&'a ProgramMut<'obj>, &'a ProgramMut<'obj>),
}

impl Probes<'_, '_> {
    fn attach(&self, offset: usize) -> Result<Vec<Link>, libbpf_rs::Error> {
        match self {
            Probes::Session(prog) => {
                let opts = UprobeMultiOpts { offsets: vec![offset], session: true, ..Default::default() };
                Ok(vec![prog.attach_uprobe_multi_with_opts(-1, "/proc/self/exe", "", opts)?])
            }
            Probes::EntryAndReturn(entry, ret) => Ok(vec![
                entry.attach_uprobe_with_opts(-1, "/proc/self/exe", offset, UprobeOpts::default())?,
                ret.attach_uprobe_with_opts(-1, "/proc/self/exe", offset, UprobeOpts { retprobe: true, ..Default::default() })?,
            ]),
        }
    }
}

pub(crate) fn trap_cost(probes: Probes<'_, '_>) -> Result<TrapCost, BpfError> {
    Ok(TrapCost {
        emulated: cost_of(&probes, "gpuflame_calibration_point", call_calibration_point)?,
        stepped: cost_of(&probes, "gpuflame_calibration_stepped", call_calibration_stepped)?,
        nested_return: matches!(probes, Probes::EntryAndReturn(..)),
    })
}

fn cost_of(probes: &Probes<'_, '_>, symbol: &str, call: fn(u32) -> u32) -> Result<Duration, BpfError> {
    const CALLS: u32 = 500;
    const BATCHES: usize = 7;
    let offset = symbol_offset(symbol).ok_or_else(|| BpfError::Attach {
        what: "the calibration probe".into(),
        source: libbpf_rs::Error::from(std::io::Error::other(format!("{symbol} not found in /proc/self/exe"))),
    })?;
    let time = || {
        let start = Instant::now();
        for i in 0..CALLS {
            std::hint::black_box(call(std::hint::black_box(i)));
        }
        start.elapsed()
    };
    let bare = (0..BATCHES).map(|_| time()).min().unwrap_or_default();
    let _links = probes.attach(offset).map_err(|source| attach_error("the calibration probe", source))?;
    // The median batch: a VM's traps cost more now and then.
    let mut probed: Vec<Duration> = (0..BATCHES).map(|_| time()).collect();
    probed.sort();
    Ok(probed[BATCHES / 2].saturating_sub(bare) / CALLS)
}

/// Whether the kernel's uprobes step this first instruction out of line (x86-64,
/// arch/x86/kernel/uprobes.c): all but those it emulates, a `push` of a register, a `nop`, and
/// relative jumps and calls. Unknown bytes count as stepped, the dearer guess.
pub fn first_instruction_stepped(code: &[u8]) -> bool {
    let (rex, rest) = match code {
        [r @ 0x40..=0x4f, rest @ ..] => (Some(*r), rest),
        rest => (None, rest),
    };
    let emulated = match rest {
        // push %reg (with REX.B for r8-r15), nop, jmp rel8/rel32, call rel32, jcc rel8
        [0x50..=0x57, ..] => rex.is_none_or(|r| r & 0x08 == 0),
        [0x90, ..] | [0xe8, ..] | [0xe9, ..] | [0xeb, ..] | [0x70..=0x7f, ..] => rex.is_none(),
        // jcc rel32, multi-byte nop
        [0x0f, 0x80..=0x8f, ..] | [0x0f, 0x1f, ..] => rex.is_none(),
        [0x66, 0x90, ..] | [0x66, 0x0f, 0x1f, ..] => rex.is_none(),
        _ => false,
    };
    !emulated
}

/// For each of `offsets` in the file at `path`: whether its first instruction is stepped.
pub(crate) fn stepped_at(path: &Path, offsets: &[u64]) -> Vec<bool> {
    let file = File::open(path).ok();
    offsets
        .iter()
        .map(|&off| {
            let mut code = [0u8; 4];
            match &file {
                Some(f) if f.read_exact_at(&mut code, off).is_ok() => first_instruction_stepped(&code),
                _ => true,
            }
        })
        .collect()
}

// Functions for [`crate::BpfPrograms::calibrate_trap_cost`] to hook, in assembly so that their
// first instructions are what the costs are of: `push %rbp` as the hooked CUDA functions begin
// (cudaLaunchKernel: push %rbp; mov %rsp,%rbp), which the kernel emulates under a uprobe; and
// `lea`, which it steps out of line.
std::arch::global_asm!(
    ".pushsection .text.gpuflame_calibration,\"ax\",@progbits",
    ".globl gpuflame_calibration_point",
    ".type gpuflame_calibration_point,@function",
    "gpuflame_calibration_point:",
    "push rbp",
    "mov rbp, rsp",
    "lea eax, [rdi + rdi * 2]",
    "pop rbp",
    "ret",
    ".size gpuflame_calibration_point, . - gpuflame_calibration_point",
    ".globl gpuflame_calibration_stepped",
    ".type gpuflame_calibration_stepped,@function",
    "gpuflame_calibration_stepped:",
    "lea eax, [rdi + rdi * 2]",
    "ret",
    ".size gpuflame_calibration_stepped, . - gpuflame_calibration_stepped",
    ".popsection",
);

extern "C" {
    fn gpuflame_calibration_point(x: u32) -> u32;
    fn gpuflame_calibration_stepped(x: u32) -> u32;
}

#[inline(never)]
fn call_calibration_point(x: u32) -> u32 {
    // SAFETY: the function above reads only its argument register and keeps the stack balanced.
    unsafe { gpuflame_calibration_point(x) }
}

#[inline(never)]
fn call_calibration_stepped(x: u32) -> u32 {
    // SAFETY: as above.
    unsafe { gpuflame_calibration_stepped(x) }
}

/// The file offset of the function `name` (such as [`gpuflame_calibration_point`]) in the
/// running executable: what a uprobe on it attaches to.
pub fn symbol_offset(name: &str) -> Option<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_instructions_the_kernel_emulates() {
        for code in [&[0x55u8][..], &[0x41, 0x57], &[0x41, 0x54], &[0x90], &[0x0f, 0x1f, 0x44, 0x00], &[0xe9, 0, 0, 0, 0], &[0x66, 0x90]] {
            assert!(!first_instruction_stepped(code), "{code:x?}");
        }
        // endbr64, sub $8,%rsp, mov %rdi,%rax, lea, push with REX.W (no such encoding), nothing.
        for code in [&[0xf3u8, 0x0f, 0x1e, 0xfa][..], &[0x48, 0x83, 0xec, 0x08], &[0x48, 0x89, 0xf8], &[0x8d, 0x04, 0x7f], &[0x48, 0x55], &[]] {
            assert!(first_instruction_stepped(code), "{code:x?}");
        }
    }

    #[test]
    fn a_call_costs_its_own_traps_and_an_entry_trap_per_nested_call() {
        let cost = TrapCost { emulated: Duration::from_nanos(1_200), stepped: Duration::from_nanos(10_000), nested_return: false };
        assert_eq!(cost.of(HookTraps::default()), Duration::from_nanos(1_200));
        assert_eq!(cost.of(HookTraps { stepped: true, ..Default::default() }), Duration::from_nanos(10_000));
        // A runtime launch (emulated) with its driver launch nested: one entry trap more, and a
        // step where the driver's function is stepped.
        assert_eq!(cost.of(HookTraps { stepped: false, nested: 1, nested_stepped: 0 }), Duration::from_nanos(1_800));
        assert_eq!(cost.of(HookTraps { stepped: false, nested: 1, nested_stepped: 1 }), Duration::from_nanos(10_600));
    }
}
