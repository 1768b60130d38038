use super::*;

fn py(code: u64) -> UserFrame {
    UserFrame::Python { code, name_tag: 0, first_line: 1, lasti: 0 }
}

fn frame(ip: u64, sp: u64, cfa: u64) -> WalkedFrame {
    WalkedFrame { ip, sp, cfa }
}

#[test]
fn calls_go_in_place_of_the_frames_that_hold_their_shims() {
    // BPF stopped at 0x10 (the leaf's caller); after the gap, two calls with their shims.
    let user = [UserFrame::Native(0x1), UserFrame::Native(0x10), UserFrame::Gap, py(0xa), UserFrame::CallEnd { shim: 0x1100 }, py(0xb), py(0xc), UserFrame::CallEnd { shim: 0x1300 }];
    let walk = Walk {
        frames: vec![frame(0x10, 0x1000, 0x1080), frame(0x20, 0x1080, 0x1200), frame(0x30, 0x1200, 0x1280), frame(0x40, 0x1280, 0x1400), frame(0x50, 0x1400, 0)],
        end: WalkEnd::EndOfStack,
    };
    let eval = PythonEval { ranges: vec![], by_shim: true };
    let out = merged(&user, &walk, Some(&eval));
    assert_eq!(out, [UserFrame::Native(0x1), UserFrame::Native(0x10), py(0xa), UserFrame::Native(0x30), py(0xb), py(0xc), UserFrame::Native(0x50)]);
}

#[test]
fn the_frame_bpf_stopped_at_can_be_the_eval_loop() {
    let user = [UserFrame::Native(0x10), UserFrame::Gap, py(0xa), UserFrame::CallEnd { shim: 0x1010 }];
    let walk = Walk { frames: vec![frame(0x10, 0x1000, 0x1080), frame(0x20, 0x1080, 0)], end: WalkEnd::EndOfStack };
    let eval = PythonEval { ranges: vec![], by_shim: true };
    assert_eq!(merged(&user, &walk, Some(&eval)), [py(0xa), UserFrame::Native(0x20)]);
}

#[test]
fn before_3_12_eval_frames_are_known_by_address_and_unmatched_calls_stay_after_a_gap() {
    // The frame BPF stopped at already had its frames put in (py 0x9).
    let user = [py(0x9), UserFrame::Gap, py(0xa), UserFrame::CallEnd { shim: 0 }, py(0xb), UserFrame::CallEnd { shim: 0 }];
    let walk = Walk { frames: vec![frame(0x500, 0x1000, 0x1080), frame(0x510, 0x1080, 0x1100), frame(0x20, 0x1100, 0)], end: WalkEnd::ZeroReturnAddress };
    let eval = PythonEval { ranges: vec![(0x500, 0x600)], by_shim: false };
    assert_eq!(merged(&user, &walk, Some(&eval)), [py(0x9), py(0xa), UserFrame::Native(0x20), UserFrame::Gap, py(0xb)]);
}

#[test]
fn without_python_the_walk_is_appended() {
    let user = [UserFrame::Native(0x10)];
    let walk = Walk { frames: vec![frame(0x10, 0x1000, 0x1080), frame(0x20, 0x1080, 0)], end: WalkEnd::EndOfStack };
    assert_eq!(merged(&user, &walk, None), [UserFrame::Native(0x10), UserFrame::Native(0x20)]);
}
