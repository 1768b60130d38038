//! Processes in another mount namespace (a container): their program and libraries exist only
//! there, and a different file sits at the same path on the host. Names must come from the
//! mapped files, never from the host's. Run as root.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;


/// Runs `script` with sh in a private mount namespace whose `mountpoint` is a fresh tmpfs.
fn in_namespace(mountpoint: &Path, script: &str) -> Killed {
    let mount = format!("mount -t tmpfs gpuflame-ns {} && {script}", mountpoint.display());
    Killed(Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &mount]).spawn().expect("unshare (util-linux) is needed"))
}

/// Waits until `pid` runs `comm` and maps a file under `dir`.
fn wait_until_running(pid: u32, comm: &str, dir: &Path) {
    let deadline = Instant::now() + HANG;
    loop {
        let c = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if c.trim() == comm && maps.contains(dir.to_str().unwrap()) {
            return;
        }
        assert!(Instant::now() < deadline, "pid {pid} did not start {comm} in its namespace (comm {c:?})");
        sleep(Duration::from_millis(50));
    }
}

/// The identity of the file a process maps under `dir` at `name` (through map_files).
fn mapped_identity(pid: u32, path: &Path) -> (u64, u64) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps.lines().find(|l| l.ends_with(path.to_str().unwrap())).unwrap_or_else(|| panic!("{} not mapped:\n{maps}", path.display()));
    let range = line.split_whitespace().next().unwrap();
    let meta = std::fs::metadata(format!("/proc/{pid}/map_files/{range}")).unwrap();
    (meta.dev(), meta.ino())
}

/// The namespace really hides the host file: the process maps another file at the same path.
fn assert_other_file_than_host(pid: u32, path: &Path) {
    let host = std::fs::metadata(path).unwrap_or_else(|_| panic!("the host file {} is missing", path.display()));
    assert_ne!(mapped_identity(pid, path), (host.dev(), host.ino()), "{} is the host's file: the test set-up is wrong", path.display());
}

#[test]
fn native_names_come_from_the_containers_binary_not_the_hosts() {
    require_bpf();
    let dir = tempfile::Builder::new().prefix("gpuflame-ns-").tempdir().unwrap();
    let mnt = dir.path().join("app");
    std::fs::create_dir(&mnt).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/nschain.c");
    // The host's file at the same path: the same program with other names.
    let flags = FP_FLAGS.join(" ");
    let host = mnt.join("nschain");
    let out = Command::new("cc").args(FP_FLAGS).args(["-Dns_a=host_a", "-Dns_b=host_b", "-o"]).arg(&host).arg(&src).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Built inside the namespace, into its tmpfs: it exists nowhere else.
    let child = in_namespace(&mnt, &format!("cc {flags} -o {0} {1} && exec {0} 30", host.display(), src.display()));
    let pid = child.0.id();
    wait_until_running(pid, "nschain", &mnt);
    assert_other_file_than_host(pid, &host);

    // The whole machine: the process is found among all, as an agent finds containers.
    let folded = dir.path().join("machine.folded");
    // 1.5 s of its CPU time at 199 Hz (~300 samples), however loaded the machine.
    let (status, stderr) = record_for_cpu(&["record", "-F", "199", "-o", folded.to_str().unwrap()], pid, 1.5);
    drop(child);
    assert!(status.success(), "{stderr}");
    let stacks: Vec<Stack> = read_folded(&folded).into_iter().filter(|s| s.comm() == "nschain").collect();
    let all = total(&stacks);
    assert!(all >= 150, "expected ~600 samples of nschain, got {all}:\n{}", describe(&stacks));
    let named: u64 = stacks.iter().filter(|s| s.has_sequence(&["main", "ns_a", "ns_b"])).map(|s| s.count).sum();
    let host_names: u64 = stacks.iter().filter(|s| s.user().iter().any(|f| f.contains("host_"))).map(|s| s.count).sum();
    assert_eq!(host_names, 0, "names were taken from the host's file at the same path:\n{}", describe(&stacks));
    assert!(named * 100 >= all * 95, "only {named} of {all} samples carry main;ns_a;ns_b:\n{}", describe(&stacks));
}

fn pyenv_prefix(minor: u32) -> PathBuf {
    std::fs::read_dir("/root/.pyenv/versions")
        .ok()
        .and_then(|d| d.flatten().map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("3.{minor}.")))).max())
        .unwrap_or_else(|| panic!("pyenv's Python 3.{minor} is needed (scripts/setup.sh installs it)"))
}

#[test]
fn python_in_a_container_has_its_frames_and_its_libpythons_names() {
    require_bpf();
    let prefix = pyenv_prefix(11);
    let dir = tempfile::Builder::new().prefix("gpuflame-ns-").tempdir().unwrap();
    let mnt = dir.path().join("py");
    std::fs::create_dir(&mnt).unwrap();
    // On the host, other files at the container's paths: Python 3.12 under 3.11's names. Read
    // by mistake, they give a wrong _PyRuntime (no Python frames) and wrong native names.
    let other = pyenv_prefix(12);
    std::fs::copy(other.join("bin/python3.12"), mnt.join("python3.11")).unwrap();
    std::fs::copy(other.join("lib/libpython3.12.so.1.0"), mnt.join("libpython3.11.so.1.0")).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pyspin.py");
    let m = mnt.display();
    let p = prefix.display();
    let child = in_namespace(
        &mnt,
        &format!("cp {p}/bin/python3.11 {p}/lib/libpython3.11.so.1.0 {m}/ && LD_LIBRARY_PATH={m} PYTHONHOME={p} exec {m}/python3.11 {}", script.display()),
    );
    let pid = child.0.id();
    wait_until_running(pid, "python3.11", &mnt);
    let libpython = mnt.join("libpython3.11.so.1.0");
    // Mapped from the namespace's tmpfs, not from pyenv's lib (LD_LIBRARY_PATH beats RUNPATH).
    let deadline = Instant::now() + HANG;
    while !std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().contains(libpython.to_str().unwrap()) {
        assert!(Instant::now() < deadline, "the interpreter did not map {}", libpython.display());
        sleep(Duration::from_millis(50));
    }
    assert_other_file_than_host(pid, &libpython);
    assert_other_file_than_host(pid, &mnt.join("python3.11"));
    sleep(Duration::from_millis(300));

    let folded = dir.path().join("py.folded");
    let pid_arg = pid.to_string();
    let (status, stderr) = record_for_cpu(&["record", "-F", "199", "-p", &pid_arg, "-o", folded.to_str().unwrap()], pid, 1.5);
    drop(child);
    assert!(status.success(), "{stderr}");
    let stacks = read_folded(&folded);
    let all = total(&stacks);
    assert!(all >= 150, "expected ~600 samples, got {all}:\n{}", describe(&stacks));
    let right: u64 = stacks
        .iter()
        .filter(|s| {
            let user = s.user();
            let py: Vec<&str> = user.iter().filter(|f| f.contains("(pyspin.py")).map(|f| f.split(" (").next().unwrap_or("")).collect();
            // The interpreter's own frames under the Python ones, named from the namespace's
            // libpython.
            let first_py = user.iter().position(|f| f.contains("(pyspin.py")).unwrap_or(0);
            let native = ["Py_BytesMain", "Py_RunMain", "PyEval_EvalCode"].iter().all(|n| user[..first_py].contains(n));
            py == ["<module>", "top", "middle", "leaf"] && native && user.first() == Some(&"_start")
        })
        .map(|s| s.count)
        .sum();
    assert!(right * 100 >= all * 90, "only {right} of {all} samples have <module>;top;middle;leaf over Py_BytesMain;Py_RunMain;PyEval_EvalCode:\n{}", describe(&stacks));
}

/// Programs whose mapped file is not at its path any more: run from a memfd, or replaced by a
/// rename with another program. Both are named from the mapped file.
#[test]
fn programs_not_at_their_path_are_named_from_the_mapped_file() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", FP_FLAGS);
    let memfd_exec = build_c(dir.path(), "memfd_exec", &["-O2"]);
    let from_memfd = Killed(Command::new(&memfd_exec).arg(&chain).arg("30").spawn().unwrap());
    let renamed = dir.path().join("renamed");
    std::fs::copy(&chain, &renamed).unwrap();
    let replaced = Killed(Command::new(&renamed).arg("30").spawn().unwrap());
    let deadline = Instant::now() + HANG;
    for (pid, needle) in [(from_memfd.0.id(), "/memfd:chainmem"), (replaced.0.id(), renamed.to_str().unwrap())] {
        while !std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().contains(needle) {
            assert!(Instant::now() < deadline, "{needle} did not start");
            sleep(Duration::from_millis(20));
        }
    }
    // Another program renamed over the running one's path: same names would be wrong ones.
    let other = dir.path().join("other");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/nschain.c");
    let out = Command::new("cc").args(FP_FLAGS).args(["-Dns_a=host_a", "-Dns_b=host_b", "-o"]).arg(&other).arg(&src).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&other, &renamed).unwrap();

    let folded = dir.path().join("moved.folded");
    let (a, b) = (from_memfd.0.id().to_string(), replaced.0.id().to_string());
    let (status, stderr) = record_for_cpu_all(&["record", "-F", "199", "-p", &a, "-p", &b, "-o", folded.to_str().unwrap()], &[from_memfd.0.id(), replaced.0.id()], 1.5);
    drop((from_memfd, replaced));
    assert!(status.success(), "{stderr}");
    let stacks = read_folded(&folded);
    for comm in ["chainmem", "renamed"] {
        let mine: Vec<Stack> = stacks.iter().filter(|s| s.comm() == comm || s.comm() == format!("memfd:{comm}")).cloned().collect();
        let all = total(&mine);
        let named: u64 = mine.iter().filter(|s| s.has_sequence(&["main", "a", "b", "c"])).map(|s| s.count).sum();
        assert!(all >= 150, "expected ~600 samples of {comm}, got {all}:\n{}", describe(&stacks));
        assert!(named * 100 >= all * 95, "only {named} of {all} samples of {comm} carry main;a;b;c:\n{}", describe(&mine));
    }
}
