use super::*;

/// Code at 0x1000..0x2000 with a rule per address range; 0x3000..0x4000 without CFI; 0x5000..
/// 0x6000 pending. Every return address follows an `e8` call.
struct Fake {
    rules: Vec<(u64, u64, UnwindRule)>,
}

impl ProcessCode for Fake {
    fn code_at(&mut self, ip: u64, adjust: bool) -> CodeAt {
        let pc = ip - u64::from(adjust);
        match pc {
            0x1000..0x2000 => self.rules.iter().find(|r| r.0 <= pc && pc < r.1).map_or(CodeAt::NoRow, |r| CodeAt::Rule(r.2)),
            0x3000..0x4000 => CodeAt::NoRow,
            0x5000..0x6000 => CodeAt::Pending,
            _ => CodeAt::NoMapping,
        }
    }

    fn code_before(&mut self, _addr: u64) -> Option<[u8; 8]> {
        Some([0, 0, 0, 0xe8, 0, 0, 0, 0])
    }
}

const SP: u64 = 0x7000_0000;

fn rsp(o: i32) -> UnwindRule {
    UnwindRule { cfa: CfaRule::RspOffset(o), rbp: RbpRule::Unchanged }
}

fn stack(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

#[test]
fn cfa_rules_walk_to_the_end_of_the_stack() {
    let mut code = Fake {
        rules: vec![
            (0x1000, 0x1100, rsp(16)),
            (0x1100, 0x1200, UnwindRule { cfa: CfaRule::RbpOffset(16), rbp: RbpRule::CfaOffset(-16) }),
            (0x1200, 0x1300, UnwindRule { cfa: CfaRule::EndOfStack, rbp: RbpRule::Unchanged }),
        ],
    };
    // Leaf 0x1010: CFA sp+16, ra at sp+8 → 0x1110. There rbp-based: CFA = rbp+16 with rbp =
    // SP+16 (the saved rbp at CFA-16 = SP+16 holds SP+48), ra at SP+24 → 0x1210: the end.
    let bytes = stack(&[0, 0x1110, 0x7777, 0x1210, 0, 0, SP + 48]);
    let copy = CopiedStack { start: WalkStart { ip: 0x1010, sp: SP, bp: SP + 16, adjust: false, ..Default::default() }, base: SP, bytes: &bytes };
    let walk = walk_copied(&copy, &mut code, 16);
    assert_eq!(walk.frames.iter().map(|f| f.ip).collect::<Vec<_>>(), [0x1010, 0x1110, 0x1210]);
    assert_eq!(walk.frames[0].cfa, SP + 16);
    assert_eq!(walk.frames[1].cfa, SP + 32);
    assert_eq!(walk.end, WalkEnd::EndOfStack);
}

#[test]
fn code_without_cfi_is_stepped_by_frame_pointer_then_by_scan() {
    let mut code = Fake { rules: vec![(0x1000, 0x1100, rsp(8))] };
    // 0x3010 without CFI: rbp = SP+16 → saved rbp 0 and ra 0x3020 (without CFI too, rbp now 0):
    // a scan from SP+32 finds 0x5010 (pending) after a word that is no code.
    let mut words = vec![0, 0, 0, 0x3020, 0x42, 0x5010];
    words.resize(80, 0); // a scan reads 64 words
    let bytes = stack(&words);
    let copy = CopiedStack { start: WalkStart { ip: 0x3010, sp: SP, bp: SP + 16, adjust: false, ..Default::default() }, base: SP, bytes: &bytes };
    let walk = walk_copied(&copy, &mut code, 16);
    assert_eq!(walk.frames.iter().map(|f| f.ip).collect::<Vec<_>>(), [0x3010, 0x3020, 0x5010]);
    assert_eq!(walk.end, WalkEnd::TablePending { ip: 0x5010 });
    assert_eq!(walk.frames[1].cfa, SP + 48);
}

#[test]
fn reads_past_the_copy_and_lost_frames_end_the_walk() {
    let mut code = Fake { rules: vec![(0x1000, 0x1100, rsp(64))] };
    let bytes = stack(&[0, 0x1010]);
    let copy = CopiedStack { start: WalkStart { ip: 0x1010, sp: SP, bp: 0, adjust: true, ..Default::default() }, base: SP, bytes: &bytes };
    assert_eq!(walk_copied(&copy, &mut code, 16).end, WalkEnd::ReadFault);
    let copy = CopiedStack { start: WalkStart { ip: 0x9000, ..copy.start }, ..copy };
    assert_eq!(walk_copied(&copy, &mut code, 16).end, WalkEnd::NoMapping);
    let mut code = Fake { rules: vec![(0x1000, 0x1100, rsp(8))] };
    let bytes = stack(&[0x1010; 8]);
    let copy = CopiedStack { start: WalkStart { ip: 0x1010, sp: SP, bp: 0, adjust: true, ..Default::default() }, base: SP, bytes: &bytes };
    let walk = walk_copied(&copy, &mut code, 4);
    assert_eq!((walk.frames.len(), walk.end), (4, WalkEnd::Truncated));
}

#[test]
fn call_encodings_are_recognized() {
    assert!(follows_call(&[0, 0, 0, 0xe8, 1, 2, 3, 4])); // call rel32
    assert!(follows_call(&[0, 0, 0, 0, 0, 0, 0xff, 0xd0])); // call *%rax
    assert!(follows_call(&[0, 0, 0, 0, 0, 0xff, 0x50, 0x08])); // call *0x8(%rax)
    assert!(follows_call(&[0, 0, 0, 0, 0xff, 0x54, 0x24, 0x08])); // call *0x8(%rsp)
    assert!(follows_call(&[0, 0, 0xff, 0x15, 1, 2, 3, 4])); // call *rel32(%rip)
    assert!(!follows_call(&[0x90; 8]));
    assert!(!follows_call(&[0, 0, 0, 0, 0, 0, 0xff, 0xe0])); // jmp *%rax
}
