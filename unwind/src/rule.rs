//! The unwind rules the BPF unwinder understands, and their derivation from DWARF CFI.

use gimli::{Reader, Register, UnwindSection, X86_64};

/// How to compute the CFA (the caller's stack pointer before the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CfaRule {
    /// No unwind information covers the address (a gap between functions).
    NoInfo,
    RspOffset(i32),
    RbpOffset(i32),
    /// The PLT's expression: rsp + 8, plus 8 more when (rip & 15) ≥ `threshold`.
    Plt { threshold: u8 },
    /// CFA = *(rbp + offset): functions that realign their stack (`DW_OP_breg6 off; DW_OP_deref`).
    DerefRbp(i32),
    /// CFA = *(rsp + slot) + addend: a function without CFI that realigned its stack and keeps
    /// its frame's base in its new frame, then uses rbp as any register (MKL's sgemm kernels:
    /// `mov %rsp,%rbp; …; and $-4096,%rsp; mov %rbp,0x98(%rsp)`). Made from code (prologue.rs),
    /// never from CFI.
    DerefRsp { slot: u16, addend: i16 },
    /// The return address is undefined: the outermost frame (`_start`, a thread's entry).
    EndOfStack,
    /// Anything else; the unwinder stops here and counts it.
    Unsupported,
}

/// Where the caller's RBP is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RbpRule {
    Unchanged,
    /// Saved at CFA + offset.
    CfaOffset(i32),
    /// Saved at the function's own rbp + offset (`DW_CFA_expression: rbp (DW_OP_breg6 off)`): a
    /// function that realigns its stack through r10 (GCC's DRAP) keeps it in its frame.
    AtRbp(i32),
    Unsupported,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnwindRule {
    pub cfa: CfaRule,
    pub rbp: RbpRule,
}

impl UnwindRule {
    pub const NO_INFO: UnwindRule = UnwindRule { cfa: CfaRule::NoInfo, rbp: RbpRule::Unchanged };
}

const RA: Register = X86_64::RA;

/// Classifies one row of gimli's unwind table.
pub(crate) fn classify<R: Reader, S: UnwindSection<R>>(
    row: &gimli::UnwindTableRow<R::Offset>,
    section: &S,
) -> UnwindRule {
    // gimli keeps no entry for undefined registers: no rule for the return address means
    // DW_CFA_undefined, the outermost frame.
    let Some(ra) = row.register(RA) else {
        return UnwindRule { cfa: CfaRule::EndOfStack, rbp: RbpRule::Unchanged };
    };
    if matches!(ra, gimli::RegisterRule::Undefined) {
        return UnwindRule { cfa: CfaRule::EndOfStack, rbp: RbpRule::Unchanged };
    }
    let cfa = match row.cfa() {
        gimli::CfaRule::RegisterAndOffset { register, offset } => match (*register, i32::try_from(*offset)) {
            (X86_64::RSP, Ok(off)) => CfaRule::RspOffset(off),
            (X86_64::RBP, Ok(off)) => CfaRule::RbpOffset(off),
            _ => CfaRule::Unsupported,
        },
        gimli::CfaRule::Expression(expr) => match expr.get(section) {
            Ok(e) => classify_expression(e.0.to_slice().ok().as_deref().unwrap_or(&[])),
            Err(_) => CfaRule::Unsupported,
        },
    };
    // x86-64 code always saves the return address at CFA-8; anything else is not followed.
    let cfa = match ra {
        gimli::RegisterRule::Offset(-8) => cfa,
        _ => CfaRule::Unsupported,
    };
    let rbp = match row.register(X86_64::RBP) {
        None | Some(gimli::RegisterRule::Undefined | gimli::RegisterRule::SameValue) => RbpRule::Unchanged,
        Some(gimli::RegisterRule::Offset(off)) => i32::try_from(off).map_or(RbpRule::Unsupported, RbpRule::CfaOffset),
        Some(gimli::RegisterRule::Expression(expr)) => match expr.get(section) {
            Ok(e) => classify_rbp_expression(e.0.to_slice().ok().as_deref().unwrap_or(&[])),
            Err(_) => RbpRule::Unsupported,
        },
        _ => RbpRule::Unsupported,
    };
    UnwindRule { cfa, rbp }
}

const DW_OP_BREG6: u8 = 0x76; // rbp
const DW_OP_BREG7: u8 = 0x77; // rsp
const DW_OP_BREG16: u8 = 0x80; // rip
const DW_OP_DEREF: u8 = 0x06;
const DW_OP_LIT0: u8 = 0x30;
const DW_OP_AND: u8 = 0x1a;
const DW_OP_GE: u8 = 0x2a;
const DW_OP_SHL: u8 = 0x24;
const DW_OP_PLUS: u8 = 0x22;

/// Recognises the two CFA expressions that compilers and linkers emit on x86-64.
pub(crate) fn classify_expression(e: &[u8]) -> CfaRule {
    // PLT: breg7 8; breg16 0; lit15; and; lit10|lit11; ge; lit3; shl; plus
    if let [DW_OP_BREG7, 8, DW_OP_BREG16, 0, lit15, DW_OP_AND, threshold, DW_OP_GE, lit3, DW_OP_SHL, DW_OP_PLUS] = *e {
        if lit15 == DW_OP_LIT0 + 15 && lit3 == DW_OP_LIT0 + 3 && (DW_OP_LIT0..DW_OP_LIT0 + 16).contains(&threshold) {
            return CfaRule::Plt { threshold: threshold - DW_OP_LIT0 };
        }
    }
    // Stack realignment: breg6 OFFSET (SLEB128); deref
    if e.first() == Some(&DW_OP_BREG6) && e.last() == Some(&DW_OP_DEREF) {
        if let Some(off) = sleb128(&e[1..e.len() - 1]) {
            if let Ok(off) = i32::try_from(off) {
                return CfaRule::DerefRbp(off);
            }
        }
    }
    CfaRule::Unsupported
}

/// Recognises where a realigned frame saves the caller's rbp: `breg6 OFFSET` (an address).
pub(crate) fn classify_rbp_expression(e: &[u8]) -> RbpRule {
    match e.split_first() {
        Some((&DW_OP_BREG6, off)) => sleb128(off).and_then(|o| i32::try_from(o).ok()).map_or(RbpRule::Unsupported, RbpRule::AtRbp),
        _ => RbpRule::Unsupported,
    }
}

/// Decodes a whole slice as one SLEB128 number.
fn sleb128(bytes: &[u8]) -> Option<i64> {
    let mut result: i64 = 0;
    let mut shift = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if shift >= 63 {
            return None;
        }
        result |= i64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            if i + 1 != bytes.len() {
                return None;
            }
            if shift < 64 && b & 0x40 != 0 {
                result |= -1i64 << shift;
            }
            return Some(result);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plt_expressions() {
        let plt = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(classify_expression(&plt), CfaRule::Plt { threshold: 11 });
        let mut plt10 = plt;
        plt10[6] = 0x3a;
        assert_eq!(classify_expression(&plt10), CfaRule::Plt { threshold: 10 });
        assert_eq!(classify_expression(&plt[..10]), CfaRule::Unsupported);
    }

    #[test]
    fn realignment_expression() {
        assert_eq!(classify_expression(&[0x76, 0x78, 0x06]), CfaRule::DerefRbp(-8));
        assert_eq!(classify_expression(&[0x76, 0x10, 0x06]), CfaRule::DerefRbp(16));
        assert_eq!(classify_expression(&[0x76, 0x78]), CfaRule::Unsupported);
    }

    #[test]
    fn rbp_saved_in_a_realigned_frame() {
        // GCC's DRAP prologue: DW_CFA_expression: r6 (rbp) (DW_OP_breg6 (rbp): 0)
        assert_eq!(classify_rbp_expression(&[0x76, 0x00]), RbpRule::AtRbp(0));
        assert_eq!(classify_rbp_expression(&[0x76, 0x78]), RbpRule::AtRbp(-8));
        // A value, not an address, or another register: not followed.
        assert_eq!(classify_rbp_expression(&[0x76, 0x00, 0x06]), RbpRule::Unsupported);
        assert_eq!(classify_rbp_expression(&[0x77, 0x00]), RbpRule::Unsupported);
        assert_eq!(classify_rbp_expression(&[]), RbpRule::Unsupported);
    }
}
