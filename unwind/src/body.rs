//! The rows of a function without CFI through its whole body, once its prologue kept the frame's
//! base in a realigned frame (`prologue.rs`, `BaseSaved`): MKL's sgemm kernels then use rbp as
//! any register, and the CFA is *(rsp+slot)+addend for as long as rsp stays where the prologue
//! left it. The whole function is decoded to check that it does: the only writes of rsp allowed
//! are calls (the callee's return address, popped before the next instruction) and the epilogue,
//! which takes rsp back from the slot (`mov slot(%rsp),%rax; mov %rax,%rsp`, or straight into
//! rsp) and then pops or adds its way to `ret`:
//!
//! ```text
//! mov 0x98(%rsp),%rax; mov %rax,%rsp; mov (%rsp),%rbx; …; add $0x40,%rsp; ret
//! ```
//!
//! Code after a `ret` (or a tail jump) is reached from the body, and has its rule. Any other write
//! of rsp, or bytes that do not decode, and the body gives no rows: the prologue's hold.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpKind, Register};

use crate::prologue::{is_immediate, writes, BaseSaved};
use crate::rule::{CfaRule, UnwindRule};
use crate::table::UnwindRow;

/// Functions bigger than this are not decoded whole (MKL's biggest kernels are ~110 KiB).
pub(crate) const MAX_BODY_BYTES: usize = 1 << 20;

/// The rows from `base.after` to the end of `code` (the function's bytes from `base.after`), or
/// None when the body moves rsp in a way this does not know.
pub(crate) fn rows_through_body(code: &[u8], base: &BaseSaved) -> Option<Vec<UnwindRow>> {
    let body = UnwindRule { cfa: CfaRule::DerefRsp { slot: base.slot, addend: base.addend }, rbp: base.rbp };
    let mut rows = vec![UnwindRow { pc: base.after, rule: body }];
    let mut decoder = Decoder::with_ip(64, code, base.after, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut insn = Instruction::default();
    // In an epilogue: CFA = rsp + this.
    let mut epilogue: Option<i32> = None;
    // The register the previous instruction loaded from the slot, if it did.
    let mut loaded: Option<Register> = None;
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            return None;
        }
        let from_slot = loads_slot(&insn, base.slot);
        let next = match epilogue {
            None if writes(&mut info, &insn, Register::RSP) => {
                let is_call = matches!(insn.flow_control(), FlowControl::Call | FlowControl::IndirectCall);
                if is_call {
                    None
                } else if takes_rsp_back(&insn, base.slot, loaded) {
                    Some(Some(i32::from(base.addend)))
                } else {
                    return None;
                }
            }
            None => None,
            Some(cfa) => match insn.mnemonic() {
                Mnemonic::Add if insn.op0_register() == Register::RSP && is_immediate(insn.op1_kind()) => {
                    Some(Some(cfa.checked_sub(i32::try_from(insn.immediate(1) as i64).ok()?)?))
                }
                Mnemonic::Pop if insn.op0_kind() == OpKind::Register && insn.op0_register().size() == 8 => Some(Some(cfa.checked_sub(8)?)),
                // The epilogue ends; what follows is reached from the body.
                Mnemonic::Ret => Some(None),
                _ if insn.flow_control() == FlowControl::UnconditionalBranch => Some(None),
                _ if insn.flow_control() != FlowControl::Next || writes(&mut info, &insn, Register::RSP) => return None,
                _ => None,
            },
        };
        if let Some(state) = next {
            epilogue = state;
            let rule = match state {
                Some(cfa) => UnwindRule { cfa: CfaRule::RspOffset(cfa), rbp: base.rbp },
                None => body,
            };
            rows.push(UnwindRow { pc: insn.next_ip(), rule });
        }
        loaded = from_slot;
    }
    Some(rows)
}

/// `mov slot(%rsp),%reg`: the register it loads.
fn loads_slot(insn: &Instruction, slot: u16) -> Option<Register> {
    (insn.mnemonic() == Mnemonic::Mov
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register().size() == 8
        && insn.op1_kind() == OpKind::Memory
        && insn.memory_base() == Register::RSP
        && insn.memory_index() == Register::None
        && insn.memory_displacement64() == u64::from(slot))
    .then(|| insn.op0_register())
}

/// `mov slot(%rsp),%rsp`, or `mov %reg,%rsp` right after `mov slot(%rsp),%reg`.
fn takes_rsp_back(insn: &Instruction, slot: u16, loaded: Option<Register>) -> bool {
    if loads_slot(insn, slot) == Some(Register::RSP) {
        return true;
    }
    insn.mnemonic() == Mnemonic::Mov
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register() == Register::RSP
        && insn.op1_kind() == OpKind::Register
        && Some(insn.op1_register()) == loaded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prologue::rows_from_prologue;
    use crate::rule::RbpRule;

    const START: u64 = 0x1000;

    /// The prologue's rows, then the body's, as (offset, rule); None where the body is unknown.
    fn rules(code: &[u8]) -> (Vec<(u64, UnwindRule)>, Option<Vec<(u64, UnwindRule)>>) {
        let p = rows_from_prologue(code, START).unwrap();
        let base = p.base_saved.unwrap();
        let body = rows_through_body(&code[(base.after - START) as usize..], &base);
        let rel = |rows: Vec<UnwindRow>| rows.into_iter().map(|r| (r.pc - START, r.rule)).collect::<Vec<_>>();
        (rel(p.rows), body.map(rel))
    }

    /// MKL's AVX2 sgemm kernel (libtorch_cpu.so, mkl_blas_avx2_sgemm_kernel_nocopy_NN_b1), cut
    /// short: its prologue, rbp taken for the body, a call, its epilogue, and code after the ret.
    const MKL_AVX2: [u8; 83] = [
        0xf3, 0x0f, 0x1e, 0xfa, // endbr64
        0x48, 0x83, 0xec, 0x40, // sub $0x40,%rsp
        0x48, 0x89, 0x1c, 0x24, // mov %rbx,(%rsp)
        0x48, 0x89, 0x6c, 0x24, 0x08, // mov %rbp,0x8(%rsp)
        0x4c, 0x8b, 0x5c, 0x24, 0x48, // mov 0x48(%rsp),%r11
        0x48, 0x89, 0xe5, // mov %rsp,%rbp
        0x48, 0x29, 0xc4, // sub %rax,%rsp
        0x48, 0x81, 0xe4, 0x00, 0xf0, 0xff, 0xff, // and $-4096,%rsp
        0x48, 0x89, 0xac, 0x24, 0x98, 0x00, 0x00, 0x00, // mov %rbp,0x98(%rsp)
        0x4b, 0x8d, 0x2c, 0x13, // lea (%r11,%r10,1),%rbp
        0xff, 0xd3, // call *%rbx
        0x48, 0x8b, 0x84, 0x24, 0x98, 0x00, 0x00, 0x00, // mov 0x98(%rsp),%rax
        0x48, 0x89, 0xc4, // mov %rax,%rsp
        0x48, 0x8b, 0x1c, 0x24, // mov (%rsp),%rbx
        0x48, 0x8b, 0x6c, 0x24, 0x08, // mov 0x8(%rsp),%rbp
        0xc5, 0xf8, 0x77, // vzeroupper
        0x48, 0x83, 0xc4, 0x40, // add $0x40,%rsp
        0xc3, // ret
        0x48, 0x83, 0xed, 0x20, // sub $0x20,%rbp
        0xeb, 0x9a, // jmp (back into the body)
    ];

    #[test]
    fn mkls_base_kept_in_the_realigned_frame_is_the_cfa_through_the_body_and_its_epilogue() {
        let saved = RbpRule::CfaOffset(-0x40);
        let r = |cfa| UnwindRule { cfa, rbp: saved };
        let (prologue, body) = rules(&MKL_AVX2);
        assert_eq!(prologue.last().unwrap(), &(25, r(CfaRule::RbpOffset(0x48))));
        assert_eq!(
            body.unwrap(),
            vec![
                (43, r(CfaRule::DerefRsp { slot: 0x98, addend: 0x48 })),
                (60, r(CfaRule::RspOffset(0x48))),
                (76, r(CfaRule::RspOffset(8))),
                (77, r(CfaRule::DerefRsp { slot: 0x98, addend: 0x48 })),
            ]
        );
    }

    #[test]
    fn a_body_that_moves_rsp_otherwise_gives_no_rows() {
        // push %rbx in the body, where the lea was.
        let mut code = MKL_AVX2.to_vec();
        code.splice(43..47, [0x53, 0x90, 0x90, 0x90]);
        assert_eq!(rules(&code).1, None);
        // rsp from another slot than the base's.
        let mut code = MKL_AVX2.to_vec();
        code[53] = 0x90;
        assert_eq!(rules(&code).1, None);
    }
}
