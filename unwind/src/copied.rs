//! The BPF unwinder's walk (bpf/src/bpf/native_unwind.h, no_cfi.h), over a copy of a stack: it
//! finishes the samples that BPF copied where a table was not loaded yet, and checks the BPF walk
//! frame for frame. The rules are the same, step for step: CFA and rbp rules, frame pointers and
//! stack scans for code without CFI.

use crate::rule::{CfaRule, RbpRule, UnwindRule};

/// What the process's code says at an address, as the BPF unwinder sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeAt {
    Rule(UnwindRule),
    /// In a mapping without unwind rows there (no table, or no row for the address).
    NoRow,
    /// In a mapping whose table is not loaded yet.
    Pending,
    /// In no executable mapping.
    NoMapping,
}

/// The process the stack belongs to: its mappings and tables, and its code.
pub trait ProcessCode {
    /// The rule for code at `ip`, looked up at `ip - 1` when `adjust` (a return address).
    fn code_at(&mut self, ip: u64, adjust: bool) -> CodeAt;
    /// The 8 bytes before `addr` in the process's code: whether a call ends there.
    fn code_before(&mut self, addr: u64) -> Option<[u8; 8]>;
}

/// Where a walk starts: the frame's registers, and what the walk had found before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkStart {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// After a stack scan of code without CFI: the word under the return address it found.
    pub bp_below_ra: u64,
    /// `ip` is a return address: its rule is the one of `ip - 1`.
    pub adjust: bool,
    /// Stack scans done already (at most MAX_SCANS in a walk).
    pub scans: u8,
}

/// The first frame and the stack around it.
#[derive(Debug, Clone, Copy)]
pub struct CopiedStack<'a> {
    pub start: WalkStart,
    /// The stack from `base` on (at or below sp).
    pub base: u64,
    pub bytes: &'a [u8],
}

impl CopiedStack<'_> {
    fn word(&self, addr: u64) -> Option<u64> {
        let at = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        let b = self.bytes.get(at..at.checked_add(8)?)?;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }
}

/// One frame: its instruction pointer, its sp, and its CFA (its caller's sp; 0 when the walk
/// ended at this frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkedFrame {
    pub ip: u64,
    pub sp: u64,
    pub cfa: u64,
}

/// Why the walk ended, as the BPF unwinder's statuses say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkEnd {
    EndOfStack,
    ZeroReturnAddress,
    Truncated,
    /// A read outside the copy (or, in BPF, of memory it could not read).
    ReadFault,
    BadCfa,
    NoMapping,
    /// The table of the file at this address is still not loaded.
    TablePending { ip: u64 },
    /// Code without CFI whose caller no frame pointer nor scan found.
    BadFrame,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    /// The first frame (the copy's ip) first.
    pub frames: Vec<WalkedFrame>,
    pub end: WalkEnd,
}

const SCAN_WORDS: u64 = 64;
const SCAN_CANDIDATES: u32 = 8;
const MAX_SCANS: u8 = 8;
const STACK_REACH: u64 = 1 << 20;

struct State<'a, 'c> {
    stack: &'a CopiedStack<'a>,
    code: &'c mut dyn ProcessCode,
    ip: u64,
    sp: u64,
    bp: u64,
    bp_below_ra: u64,
    scans: u8,
}

/// Walks the copied stack for at most `max_frames` frames.
pub fn walk_copied(stack: &CopiedStack<'_>, code: &mut dyn ProcessCode, max_frames: usize) -> Walk {
    let w = stack.start;
    let mut s = State { stack, code, ip: w.ip, sp: w.sp, bp: w.bp, bp_below_ra: w.bp_below_ra, scans: w.scans };
    let mut frames = Vec::new();
    let mut adjust = w.adjust;
    let end = loop {
        if frames.len() >= max_frames {
            break WalkEnd::Truncated;
        }
        frames.push(WalkedFrame { ip: s.ip, sp: s.sp, cfa: 0 });
        match s.step(adjust) {
            Ok(cfa) => {
                if let Some(f) = frames.last_mut() {
                    f.cfa = cfa;
                }
            }
            Err(end) => break end,
        }
        adjust = true;
    };
    Walk { frames, end }
}

impl State<'_, '_> {
    fn word(&self, addr: u64) -> Result<u64, WalkEnd> {
        self.stack.word(addr).ok_or(WalkEnd::ReadFault)
    }

    /// One frame up; the frame's CFA (its caller's sp).
    fn step(&mut self, adjust: bool) -> Result<u64, WalkEnd> {
        let rule = match self.code.code_at(self.ip, adjust) {
            CodeAt::NoMapping => return Err(WalkEnd::NoMapping),
            CodeAt::Pending => return Err(WalkEnd::TablePending { ip: self.ip }),
            CodeAt::NoRow | CodeAt::Rule(UnwindRule { cfa: CfaRule::NoInfo, .. }) => return self.step_without_cfi(),
            CodeAt::Rule(rule) => rule,
        };
        let cfa = match rule.cfa {
            CfaRule::RspOffset(o) => self.sp.wrapping_add_signed(i64::from(o)),
            CfaRule::RbpOffset(o) => {
                self.bp_after_scan(true, o);
                self.bp.wrapping_add_signed(i64::from(o))
            }
            CfaRule::Plt { threshold } => self.sp + 8 + if (self.ip & 15) >= u64::from(threshold) { 8 } else { 0 },
            CfaRule::DerefRbp(o) => {
                self.bp_after_scan(false, 0);
                self.word(self.bp.wrapping_add_signed(i64::from(o)))?
            }
            CfaRule::DerefRsp { slot, addend } => self.word(self.sp.wrapping_add(u64::from(slot)))?.wrapping_add_signed(i64::from(addend)),
            CfaRule::EndOfStack => return Err(WalkEnd::EndOfStack),
            CfaRule::NoInfo => unreachable!("stepped without CFI above"),
            CfaRule::Unsupported => return Err(WalkEnd::BadCfa),
        };
        if cfa == 0 {
            return Err(WalkEnd::BadCfa);
        }
        let ra = self.word(cfa.wrapping_sub(8))?;
        if matches!(rule.rbp, RbpRule::AtRbp(_)) && !matches!(rule.cfa, CfaRule::RbpOffset(_) | CfaRule::DerefRbp(_)) {
            self.bp_after_scan(false, 0);
        }
        if rule.rbp != RbpRule::Unchanged {
            self.bp_below_ra = 0;
        }
        match rule.rbp {
            RbpRule::CfaOffset(o) => self.bp = self.word(cfa.wrapping_add_signed(i64::from(o)))?,
            RbpRule::AtRbp(o) => {
                if self.bp == 0 {
                    return Err(WalkEnd::ReadFault);
                }
                self.bp = self.word(self.bp.wrapping_add_signed(i64::from(o)))?;
            }
            RbpRule::Unsupported => self.bp = 0,
            RbpRule::Unchanged => {}
        }
        if ra == 0 {
            return Err(WalkEnd::ZeroReturnAddress);
        }
        self.sp = cfa;
        self.ip = ra;
        Ok(cfa)
    }

    fn is_return_address(&mut self, ra: u64) -> bool {
        ra != 0 && self.code.code_at(ra, false) != CodeAt::NoMapping && self.code.code_before(ra).is_some_and(|b| follows_call(&b))
    }

    fn plausible_bp(&self, bp: u64) -> bool {
        bp > self.sp && bp - self.sp < STACK_REACH && bp & 7 == 0
    }

    fn bp_after_scan(&mut self, cfa_from_bp: bool, cfa_offset: i32) {
        let guess = self.bp_below_ra;
        if guess == 0 {
            return;
        }
        self.bp_below_ra = 0;
        if !self.plausible_bp(guess) {
            return;
        }
        if self.plausible_bp(self.bp) {
            if !cfa_from_bp {
                return;
            }
            let ra = self.stack.word(self.bp.wrapping_add_signed(i64::from(cfa_offset)).wrapping_sub(8));
            if ra.is_some_and(|ra| self.is_return_address(ra)) {
                return;
            }
        }
        self.bp = guess;
    }

    /// Code without CFI: its caller by frame pointer, else by a scan for a return address. The
    /// frame's CFA is the caller's sp.
    fn step_without_cfi(&mut self) -> Result<u64, WalkEnd> {
        if self.bp >= self.sp && self.bp - self.sp < STACK_REACH {
            if let (Some(saved_bp), Some(ra)) = (self.stack.word(self.bp), self.stack.word(self.bp + 8)) {
                if ra == 0 {
                    return Err(WalkEnd::ZeroReturnAddress);
                }
                if self.is_return_address(ra) {
                    self.sp = self.bp + 16;
                    self.bp = saved_bp;
                    self.ip = ra;
                    return Ok(self.sp);
                }
            }
        }
        if self.scan_from(self.sp) {
            return Ok(self.sp);
        }
        Err(WalkEnd::BadFrame)
    }

    /// The first of SCAN_WORDS words from `base` up that is a return address (of at most
    /// SCAN_CANDIDATES words in the process's code); the caller's frame starts above it.
    fn scan_from(&mut self, base: u64) -> bool {
        if self.scans >= MAX_SCANS {
            return false;
        }
        self.scans += 1;
        let Some(words) = (0..SCAN_WORDS).map(|i| self.stack.word(base + 8 * i)).collect::<Option<Vec<u64>>>() else {
            return false;
        };
        let mut tried = 0;
        for (i, &w) in words.iter().enumerate() {
            if w < 4096 || (w >> 47) != 0 || self.code.code_at(w, false) == CodeAt::NoMapping {
                continue;
            }
            tried += 1;
            if tried > SCAN_CANDIDATES {
                return false;
            }
            let follows = self.code.code_before(w).is_some_and(|b| follows_call(&b));
            if !follows {
                continue;
            }
            self.ip = w;
            self.sp = base + 8 * (i as u64 + 1);
            self.bp_below_ra = if i > 0 { words[i - 1] } else { self.stack.word(base.wrapping_sub(8)).unwrap_or(0) };
            return true;
        }
        false
    }
}

/// Whether the 8 bytes before a return address end with a call instruction: e8 rel32, or ff /2
/// in one of its encodings (no_cfi.h's follows_call). `b[8 - n]` is the byte at ra - n.
pub fn follows_call(b: &[u8; 8]) -> bool {
    let call = |m: u8| (m >> 3) & 7 == 2;
    let (md, rm) = (|m: u8| m >> 6, |m: u8| m & 7);
    if b[3] == 0xe8 {
        return true;
    }
    let m = b[7];
    if b[6] == 0xff && call(m) && (md(m) == 3 || (md(m) == 0 && rm(m) != 4 && rm(m) != 5)) {
        return true;
    }
    let m = b[6];
    if b[5] == 0xff && call(m) && ((md(m) == 1 && rm(m) != 4) || (md(m) == 0 && rm(m) == 4 && (b[7] & 7) != 5)) {
        return true;
    }
    let m = b[5];
    if b[4] == 0xff && call(m) && md(m) == 1 && rm(m) == 4 {
        return true;
    }
    let m = b[3];
    if b[2] == 0xff && call(m) && ((md(m) == 2 && rm(m) != 4) || (md(m) == 0 && rm(m) == 5)) {
        return true;
    }
    let m = b[2];
    b[1] == 0xff && call(m) && rm(m) == 4 && (md(m) == 2 || (md(m) == 0 && (b[3] & 7) == 5))
}

#[cfg(test)]
#[path = "copied_tests.rs"]
mod tests;
