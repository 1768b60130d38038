//! Unwind rows made from a function's prologue, for code that has no CFI: MKL's hand-written
//! sgemm kernels (in libtorch_cpu.so) are the reason. Their frames are tens of KiB and page-aligned,
//! so a stack scan cannot find the return address, and rbp is not a frame pointer; but their
//! prologue says where the frame is:
//!
//! ```text
//! sub $0x40,%rsp; mov %rbx,(%rsp); mov %rbp,0x8(%rsp); ...; mov %rsp,%rbp; ...; and $-4096,%rsp
//! ```
//!
//! after which the CFA is rbp+0x48, until the kernel keeps rbp in its new frame (`mov
//! %rbp,0x98(%rsp)`) and uses it as any register: from there the CFA is *(rsp+0x98)+0x48, which
//! holds through a body that does not move rsp (`body.rs` checks the whole function). The forms
//! known:
//! - `sub $N,%rsp` with register saves, then `mov %rsp,%rbp`: CFA rsp+N+8, then rbp+N+8;
//! - `push %rbp; mov %rsp,%rbp` (with or without `and $-K,%rsp`): CFA rbp+16;
//! - pushes of callee-saved registers, then `sub $N,%rsp`: CFA rsp+8+8×pushes+N.
//!
//! Anything else that moves rsp or writes rbp before the form is complete, and a function that
//! does neither, gives no rows: its code keeps today's way (frame pointers, the stack scan). The
//! rows hold from the instruction that makes each true to the function's end; only a body
//! checked by `body.rs` has its epilogue modelled.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};

use crate::rule::{CfaRule, RbpRule, UnwindRule};
use crate::table::UnwindRow;

/// The prologue is read this far at most.
pub(crate) const PROLOGUE_BYTES: usize = 256;
const MAX_INSTRUCTIONS: usize = 48;

/// Where the CFA is while the prologue runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// CFA = rsp + offset.
    Rsp(i32),
    /// CFA = rbp + offset: established, to the end.
    Rbp(i32),
}

/// What a prologue says.
pub(crate) struct Prologue {
    pub rows: Vec<UnwindRow>,
    /// The rbp frame's base stored in the realigned frame, after which rbp is free: the rows from
    /// there are the body's to give (`body.rs`), else these rows hold to the end.
    pub base_saved: Option<BaseSaved>,
}

/// `mov %rbp,slot(%rsp)` once the stack was realigned below an rbp frame of CFA rbp+addend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BaseSaved {
    /// The address after the store.
    pub after: u64,
    pub slot: u16,
    pub addend: i16,
    pub rbp: RbpRule,
}

/// The rows of the function whose code starts at `start` with bytes `code` (its first bytes, up to
/// [`PROLOGUE_BYTES`]), or None when its prologue is of no known form.
pub(crate) fn rows_from_prologue(code: &[u8], start: u64) -> Option<Prologue> {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut insn = Instruction::default();
    let mut frame = Frame::Rsp(8);
    let mut rbp = RbpRule::Unchanged;
    let mut rows = vec![UnwindRow { pc: start, rule: rule(frame, rbp) }];
    let mut moved = false;
    // Whether the walk stopped at a write of rsp or rbp that no form has.
    let mut unknown_write = false;
    // rsp moved below an rbp frame (`sub %rax,%rsp; and $-4096,%rsp`).
    let mut realigned = false;
    let mut base_saved = None;
    for _ in 0..MAX_INSTRUCTIONS {
        if !decoder.can_decode() {
            break;
        }
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            // Past an rbp frame the bytes read may end inside an instruction: the frame stands.
            if matches!(frame, Frame::Rbp(_)) {
                break;
            }
            return None;
        }
        if let Frame::Rbp(addend) = frame {
            // The frame is known; what follows may only say that rbp is about to go free.
            if realigned && stores_rbp_at_rsp(&insn) {
                if let (Ok(slot), Ok(addend)) = (u16::try_from(insn.memory_displacement64()), i16::try_from(addend)) {
                    base_saved = Some(BaseSaved { after: insn.next_ip(), slot, addend, rbp });
                }
                break;
            }
            if insn.flow_control() != FlowControl::Next || writes(&mut info, &insn, Register::RBP) {
                break;
            }
            realigned |= writes(&mut info, &insn, Register::RSP);
            continue;
        }
        let Frame::Rsp(cfa) = frame else { break };
        let before = (frame, rbp);
        match insn.mnemonic() {
            Mnemonic::Endbr64 | Mnemonic::Nop => {}
            Mnemonic::Push if insn.op0_kind() == OpKind::Register && insn.op0_register().size() == 8 => {
                frame = Frame::Rsp(cfa.checked_add(8)?);
                if insn.op0_register() == Register::RBP {
                    rbp = RbpRule::CfaOffset(-(cfa + 8));
                }
            }
            Mnemonic::Sub if insn.op0_register() == Register::RSP && is_immediate(insn.op1_kind()) => {
                let n = i32::try_from(insn.immediate(1) as i64).ok().filter(|&n| n > 0)?;
                frame = Frame::Rsp(cfa.checked_add(n)?);
            }
            // rbp saved in the frame: where the caller's rbp is. (Other registers' saves change
            // nothing the unwinder follows.)
            Mnemonic::Mov if stores_rbp_at_rsp(&insn) => {
                let at = i32::try_from(insn.memory_displacement64() as i64).ok()?;
                rbp = RbpRule::CfaOffset(at.checked_sub(cfa)?);
            }
            Mnemonic::Mov if insn.op0_register() == Register::RBP && insn.op1_kind() == OpKind::Register && insn.op1_register() == Register::RSP => {
                // The caller's rbp must be kept somewhere first, or it is lost with this.
                if rbp == RbpRule::Unchanged {
                    return None;
                }
                frame = Frame::Rbp(cfa);
            }
            // A branch or call: the body (a call's push of its return address is the callee's).
            _ if insn.flow_control() != FlowControl::Next => break,
            _ if writes_frame_register(&mut info, &insn) => {
                unknown_write = true;
                break;
            }
            _ => {}
        }
        if (frame, rbp) != before {
            moved = true;
            rows.push(UnwindRow { pc: insn.next_ip(), rule: rule(frame, rbp) });
        }
    }
    // Without an rbp frame, only a prologue that moved rsp and then went on to the body without
    // a write of rsp or rbp that no form has is known (else the function keeps today's way).
    match frame {
        Frame::Rbp(_) => Some(Prologue { rows, base_saved }),
        Frame::Rsp(cfa) if moved && cfa > 8 && !unknown_write => Some(Prologue { rows, base_saved: None }),
        Frame::Rsp(_) => None,
    }
}

/// `mov %rbp,disp(%rsp)`.
fn stores_rbp_at_rsp(insn: &Instruction) -> bool {
    insn.mnemonic() == Mnemonic::Mov
        && insn.op0_kind() == OpKind::Memory
        && insn.memory_base() == Register::RSP
        && insn.memory_index() == Register::None
        && insn.op1_kind() == OpKind::Register
        && insn.op1_register() == Register::RBP
}

fn rule(frame: Frame, rbp: RbpRule) -> UnwindRule {
    let cfa = match frame {
        Frame::Rsp(n) => CfaRule::RspOffset(n),
        Frame::Rbp(n) => CfaRule::RbpOffset(n),
    };
    UnwindRule { cfa, rbp }
}

pub(crate) fn is_immediate(kind: OpKind) -> bool {
    matches!(kind, OpKind::Immediate8 | OpKind::Immediate8to64 | OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate16 | OpKind::Immediate8to32)
}

/// Whether the instruction writes rsp or rbp (any width).
fn writes_frame_register(info: &mut InstructionInfoFactory, insn: &Instruction) -> bool {
    writes(info, insn, Register::RSP) || writes(info, insn, Register::RBP)
}

/// Whether the instruction writes `register` (a full register; any width of it).
pub(crate) fn writes(info: &mut InstructionInfoFactory, insn: &Instruction, register: Register) -> bool {
    info.info(insn).used_registers().iter().any(|r| {
        r.register().full_register() == register
            && matches!(r.access(), OpAccess::Write | OpAccess::ReadWrite | OpAccess::CondWrite | OpAccess::ReadCondWrite)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(code: &[u8]) -> Option<Vec<(u64, UnwindRule)>> {
        rows_from_prologue(code, 0x1000).map(|p| p.rows.into_iter().map(|r| (r.pc - 0x1000, r.rule)).collect())
    }

    fn r(cfa: CfaRule, rbp: RbpRule) -> UnwindRule {
        UnwindRule { cfa, rbp }
    }

    /// MKL's sgemm kernels' prologue (libtorch_cpu.so, mkl_blas_avx512_sgemm_kernel_nocopy_NN_b1).
    #[test]
    fn mkls_sub_saves_and_mov_rsp_rbp_make_an_rbp_frame() {
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, // endbr64
            0x48, 0x83, 0xec, 0x40, // sub $0x40,%rsp
            0x48, 0x89, 0x1c, 0x24, // mov %rbx,(%rsp)
            0x48, 0x89, 0x6c, 0x24, 0x08, // mov %rbp,0x8(%rsp)
            0x4c, 0x89, 0x64, 0x24, 0x10, // mov %r12,0x10(%rsp)
            0x4c, 0x8b, 0x5c, 0x24, 0x48, // mov 0x48(%rsp),%r11
            0x48, 0x89, 0xe5, // mov %rsp,%rbp
            0x48, 0x29, 0xc4, // sub %rax,%rsp
            0x48, 0x81, 0xe4, 0x00, 0xf0, 0xff, 0xff, // and $-4096,%rsp
        ];
        assert_eq!(
            rules(&code).unwrap(),
            vec![
                (0, r(CfaRule::RspOffset(8), RbpRule::Unchanged)),
                (8, r(CfaRule::RspOffset(0x48), RbpRule::Unchanged)),
                (17, r(CfaRule::RspOffset(0x48), RbpRule::CfaOffset(-0x40))),
                (30, r(CfaRule::RbpOffset(0x48), RbpRule::CfaOffset(-0x40))),
            ]
        );
    }

    #[test]
    fn push_rbp_mov_rsp_rbp_with_realignment_is_cfa_rbp_16() {
        // push %rbp; mov %rsp,%rbp; and $-64,%rsp; sub $0x100,%rsp
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xe4, 0xc0, 0x48, 0x81, 0xec, 0x00, 0x01, 0x00, 0x00];
        assert_eq!(
            rules(&code).unwrap(),
            vec![
                (0, r(CfaRule::RspOffset(8), RbpRule::Unchanged)),
                (1, r(CfaRule::RspOffset(16), RbpRule::CfaOffset(-16))),
                (4, r(CfaRule::RbpOffset(16), RbpRule::CfaOffset(-16))),
            ]
        );
    }

    #[test]
    fn pushes_then_sub_is_an_rsp_frame_to_the_end() {
        // push %r15; push %r14; push %rbx; sub $0x20,%rsp; mov %rdi,%rbx; call ...
        let code = [0x41, 0x57, 0x41, 0x56, 0x53, 0x48, 0x83, 0xec, 0x20, 0x48, 0x89, 0xfb, 0xe8, 0, 0, 0, 0];
        let rows = rules(&code).unwrap();
        assert_eq!(rows.last().unwrap(), &(9, r(CfaRule::RspOffset(8 + 24 + 0x20), RbpRule::Unchanged)));
    }

    #[test]
    fn what_no_form_knows_gives_no_rows() {
        // A leaf that touches no stack: today's way (its caller's frame is found by the scan).
        assert_eq!(rules(&[0x48, 0x89, 0xf8, 0xc3]), None); // mov %rdi,%rax; ret
        // Go's prologue: lea into rbp is not a form.
        assert_eq!(rules(&[0x48, 0x83, 0xec, 0x18, 0x48, 0x89, 0x6c, 0x24, 0x10, 0x48, 0x8d, 0x6c, 0x24, 0x10]), None);
        // mov %rsp,%rbp with the caller's rbp kept nowhere.
        assert_eq!(rules(&[0x48, 0x83, 0xec, 0x40, 0x48, 0x89, 0xe5]), None);
        // rsp moved by a register before any frame: unknown size.
        assert_eq!(rules(&[0x48, 0x83, 0xec, 0x40, 0x48, 0x29, 0xc4, 0x90]), None);
        // Garbage.
        assert_eq!(rules(&[0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(rules(&[]), None);
    }
}
