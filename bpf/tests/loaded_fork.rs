//! The fork and exec programs loaded for real: a forked child is unwound with a copy of its
//! parent's entry, says so in its records and in a `Fork` event, and loses the copy when it execs.
//! Loading needs root (or CAP_BPF and CAP_PERFMON).

use std::ffi::CString;
use std::hint::black_box;
use std::time::Duration;

use gpuflame_bpf::*;

mod common;
use common::spin;

/// Forks a child that spins, then (with `exec`) execs it; waits for it.
fn child(exec: Option<&[CString]>) -> u32 {
    let argv: Vec<*const libc::c_char> = exec.map_or(Vec::new(), |a| a.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect());
    // SAFETY: the child spins, execs or exits: it touches no lock another thread may hold.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        black_box(spin(Duration::from_millis(300)));
        if !argv.is_empty() {
            // SAFETY: argv is a null-terminated array of C strings made before the fork.
            unsafe { libc::execv(argv[0], argv.as_ptr()) };
        }
        // SAFETY: ends the child without running this process's exit handlers.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    pid as u32
}

#[test]
fn a_forked_child_unwinds_with_its_parents_copy_until_it_execs() {
    // SAFETY: geteuid has no preconditions.
    assert!(unsafe { libc::geteuid() } == 0, "this test loads the BPF programs: run it as root (the test command does)");
    let me = std::process::id();
    let config = SamplerConfig {
        frequency_hz: 999,
        targets: Targets::Processes { pids: vec![me], follow_forks: true },
        unwind_memory: 16 << 20,
        off_cpu: OffCpuSampling::default(),
        ring: RingUse::Any,
        lazy_process_events: false,
        tensor_sample_bytes: 0,
        max_live_allocations: 1024,
        memory_timeline: true,
        tensor_allocation_records: true,
        copy_every_stack: false,
        programs: OptionalPrograms::ALL,
    };
    let mut sampler = BpfPrograms::start(&config).unwrap_or_else(|e| panic!("{e}"));
    // An entry without mappings: a copy of it makes the child's walks stop at an unknown
    // address, not at an unknown process.
    sampler.set_process(me, &[], None).unwrap();
    sampler.enable(999).unwrap();
    let forked = child(None);
    // A shell that counts for a while after the exec: long enough to be sampled as itself.
    let shell: Vec<CString> = ["/bin/sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"].iter().map(|s| CString::new(*s).unwrap()).collect();
    let execed = child(Some(&shell));
    let events = sampler.drain().unwrap();

    let forks: Vec<ProcessEvent> = events.iter().filter_map(|e| if let Event::Process(p) = e { Some(*p) } else { None }).filter(|p| matches!(p.kind, ProcessEventKind::Fork { .. })).collect();
    for pid in [forked, execed] {
        assert!(forks.contains(&ProcessEvent { pid, kind: ProcessEventKind::Fork { parent: me } }), "no fork event of {pid}: {forks:?}");
    }
    let samples = |pid| events.iter().filter_map(move |e| if let Event::Sample(s) = e { Some(s) } else { None }).filter(move |s| s.pid == pid);
    let child_samples: Vec<&Sample> = samples(forked).collect();
    assert!(child_samples.len() > 20, "{} samples of the child", child_samples.len());
    for s in &child_samples {
        assert_eq!((s.forked_from, s.unwind), (Some(me), UnwindStatus::NoMapping), "{s:?}");
    }
    // After its exec the shell is a new program: no copy, nothing known of it.
    let shell_samples: Vec<&Sample> = samples(execed).filter(|s| s.comm == "sh").collect();
    assert!(shell_samples.len() > 5, "{} samples of the shell", shell_samples.len());
    for s in &shell_samples {
        assert_eq!(s.forked_from, None, "{s:?}");
        assert!(matches!(s.unwind, UnwindStatus::NoProcess | UnwindStatus::InExec), "{s:?}");
    }
}
