//! gpuflame as root among hostile processes and users (issue #15): the files it writes (the CUPTI
//! library, OOM snapshots, outputs, the spool), the sizes it takes from other processes, and its
//! flags. The hostile party runs as nobody (setpriv). Every run of gpuflame is bounded by
//! `timeout`, which fails the test; memory is the peak RSS that /usr/bin/time reports. Run as root.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use common::bounded::*;
use common::others::*;
use common::*;

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A root-only file whose content must never change.
fn victim(dir: &Path) -> PathBuf {
    let path = dir.join("victim");
    fs::write(&path, "root's file\n").unwrap();
    chmod(&path, 0o600);
    path
}

fn assert_untouched(victim: &Path) {
    assert_eq!(fs::read_to_string(victim).unwrap(), "root's file\n", "{} was written", victim.display());
}

/// Row 1: another user made /tmp/gpuflame-VERSION (the old fixed directory) with a library of
/// theirs and a `.so.tmp` link to a root file. The directory is a tmpfs of that user's mounted in
/// a mount namespace of the test's own, so that no other test or recording on the machine sees
/// what is planted (and /tmp itself, where a clone's binaries may live, stays visible).
#[test]
fn the_cupti_library_comes_from_a_directory_only_root_can_write() {
    require_bpf();
    let fixture = OpenDir::new("gpuflame-cupti-");
    let dir = fixture.path();
    let app = common::cuda::build_stand_ins(dir);
    let marker = dir.join("planted-library-ran");
    fs::write(dir.join("evil.c"), format!("#include <stdio.h>\n__attribute__((constructor)) static void run(void) {{ fclose(fopen({:?}, \"w\")); }}\n", marker.display().to_string())).unwrap();
    common::cuda::cc_in(dir, &["-shared", "-fPIC", "-o", "evil.so", "evil.c"]);
    chmod(&dir.join("evil.so"), 0o644);
    let victim = victim(dir);
    let planted = format!("/tmp/gpuflame-{}", env!("CARGO_PKG_VERSION"));
    let plant = format!(
        "cp {evil} {planted}/libgpuflame_cupti.so && ln -s {victim} {planted}/libgpuflame_cupti.so.tmp",
        evil = dir.join("evil.so").display(),
        victim = victim.display()
    );
    let out = dir.join("g.folded");
    let script = format!(
        "mkdir -p {planted} && mount -t tmpfs -o mode=0777,uid=65534,gid=65534 tmpfs {planted} && {nobody} sh -c '{plant}' && exec \"$@\"",
        nobody = setpriv_nobody(&[&dir.join("evil.so"), &victim]).join(" ")
    );
    let cupti = dir.join("libcupti.so.13");
    let show = "echo injection=$CUDA_INJECTION64_PATH; exec \"$0\" launches 50";
    let run = run_bounded(
        180,
        &["unshare", "--mount", "--propagation", "private", "sh", "-c", &script, "sh"],
        &["record", "--profiles", "gpu-time", "--cuda-exact", "-o", out.to_str().unwrap(), "--", "env", &format!("GPUFLAME_CUPTI_PATH={}", cupti.display()), "sh", "-c", show, app.to_str().unwrap()],
    );
    // The empty mount point, if the test made it, is not left in the real /tmp.
    let _ = fs::remove_dir(&planted);
    assert_eq!(run.code, 0, "{}", run.context());
    assert_untouched(&victim);
    assert!(!marker.exists(), "the command loaded the library another user planted");
    let lib = run.stdout.lines().find_map(|l| l.strip_prefix("injection=")).unwrap_or_else(|| panic!("{}", run.context()));
    assert!(lib.starts_with("/run/gpuflame/"), "{lib}");
    for (path, what) in [(Path::new(lib), "library"), (Path::new("/run/gpuflame"), "directory")] {
        let meta = fs::symlink_metadata(path).unwrap();
        assert!(meta.uid() == 0 && meta.permissions().mode() & 0o022 == 0, "the {what} {} is not root's alone: {meta:?}", path.display());
    }
    assert!(fs::read(lib).unwrap() == gpuflame::cuda::injection::LIBRARY, "the command was handed gpuflame's own library");
    // Not asserted: whether the hooks caught the launches is timing (tests/cuda.rs covers it).
    let gpu = total(&read_folded(&dir.join("g.gpu-time.folded")));
    eprintln!("cupti: library {lib}, {gpu} ns of GPU time, peak RSS {} MiB", run.max_rss_mib);
}

/// Row 2: the process that runs out of memory planted a link to a root file at the name of its
/// own snapshot, in a sticky world-writable output directory.
#[test]
fn an_oom_snapshot_is_not_written_through_a_planted_link() {
    require_bpf();
    let fixture = OpenDir::new("gpuflame-oom-");
    let dir = fixture.path();
    let app = common::cuda::build_stand_ins(dir);
    let victim = victim(dir);
    let outdir = dir.join("out");
    fs::create_dir(&outdir).unwrap();
    chmod(&outdir, 0o1777);
    let out = outdir.join("oom.folded");
    // setpriv and sh exec: $$ is the pid the OOM is reported for.
    let script = format!("ln -s {} {}/oom.oom-$$-1.folded && exec env FAKE_CUDA_BUDGET=104857600 {} oom", victim.display(), outdir.display(), app.display());
    let mut args = vec!["record", "--profiles", "hbm-inuse", "-o", out.to_str().unwrap(), "--"];
    args.extend(setpriv_nobody(&[&app, &outdir]));
    args.extend(["sh", "-c", &script]);
    let run = run_bounded(120, &[], &args);
    assert_eq!(run.code, 0, "{}", run.context());
    assert_untouched(&victim);
    let line = run.stderr.lines().find(|l| l.contains("out of memory in pid")).unwrap_or_else(|| panic!("no OOM line: {}", run.context()));
    let snapshot = PathBuf::from(line.rsplit("→ ").next().unwrap().trim());
    let name = snapshot.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("oom.oom-") && name.ends_with("-2.folded"), "the next number is taken: {name}");
    let planted = outdir.join(name.replace("-2.folded", "-1.folded"));
    assert_eq!(fs::read_link(&planted).unwrap(), victim, "the planted link is left as it was");
    let meta = fs::symlink_metadata(&snapshot).unwrap();
    assert!(meta.file_type().is_file() && meta.uid() == 0);
    assert!(fs::read_to_string(&snapshot).unwrap().contains("[out of memory] 128.0 MiB requested"));
}

/// Row 3: outputs that are not regular files, planted or given, are refused with one line and
/// left as they were; nothing gpuflame did not create is removed.
#[test]
fn outputs_that_are_not_regular_files_are_refused_and_left_alone() {
    require_bpf();
    let fixture = OpenDir::with_mode("gpuflame-out-", 0o1777);
    let dir = fixture.path();
    let victim = victim(dir);
    for dev in ["/dev/null", "/dev/full"] {
        let rdev = fs::metadata(dev).unwrap().rdev();
        let run = run_bounded(60, &[], &["record", "-o", dev, "--format", "folded", "--", "/nonexistent/command"]);
        run.assert_user_error("it is a character device, not a regular file; refused");
        let meta = fs::symlink_metadata(dev).unwrap();
        assert!(meta.file_type().is_char_device() && meta.rdev() == rdev, "{dev} is no longer the device: {meta:?}");
    }
    let fifo = dir.join("fifo.folded");
    let link = dir.join("link.folded");
    sh_as(&NOBODY, &format!("mkfifo {} && ln -s {} {}", fifo.display(), victim.display(), link.display()));
    let run = run_bounded(60, &[], &["record", "-d", "1", "-o", fifo.to_str().unwrap()]);
    run.assert_user_error("it is a FIFO, not a regular file; refused");
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    let run = run_bounded(60, &[], &["record", "-d", "1", "-o", link.to_str().unwrap()]);
    run.assert_user_error("it is a symbolic link");
    assert_untouched(&victim);
    assert_eq!(fs::read_link(&link).unwrap(), victim);
}

#[test]
fn a_failed_recording_keeps_an_existing_output_and_removes_only_its_own() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("existing.folded");
    fs::write(&existing, "previous;profile 1\n").unwrap();
    let run = run_bounded(60, &[], &["record", "-o", existing.to_str().unwrap(), "--", "/nonexistent/command"]);
    run.assert_user_error("cannot start the command");
    assert_eq!(fs::read_to_string(&existing).unwrap(), "previous;profile 1\n", "untouched until there is something to write");
    let new = dir.path().join("new.folded");
    let run = run_bounded(60, &[], &["record", "-o", new.to_str().unwrap(), "--", "/nonexistent/command"]);
    run.assert_user_error("cannot start the command");
    assert!(!new.exists(), "the file gpuflame created for the failed recording is removed");
    let run = run_bounded(90, &[], &["record", "-F", "49", "-o", existing.to_str().unwrap(), "--", "sleep", "0.5"]);
    assert_eq!(run.code, 0, "{}", run.context());
    assert!(!fs::read_to_string(&existing).unwrap().contains("previous"), "rewritten once the profile is there");
}

/// Row 4: a spool directory others can write to is refused at start; in a private one, entries
/// that are not regular files of root's are skipped, never read, pushed, followed or removed.
#[test]
fn the_spool_directory_must_be_private_and_its_strange_entries_are_skipped() {
    require_bpf();
    let fixture = OpenDir::new("gpuflame-spool-");
    let dir = fixture.path();
    let secret = dir.join("secret");
    fs::write(&secret, "SECRET-ROOT-ONLY-CONTENT").unwrap();
    chmod(&secret, 0o600);
    let victim = victim(dir);
    let mut receiver = common::receiver::Receiver::start(Box::new(|_| 200));
    let url = receiver.url();
    let open = dir.join("open");
    fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let plant = |d: &Path| format!("ln -s {s} {d}/1-00000000.pushreq && mkfifo {d}/2-00000000.pushreq && ln -s {v} {d}/.9-00000000.pushreq.0.tmp", s = secret.display(), v = victim.display(), d = d.display());
    sh_as(&NOBODY, &plant(&open));
    let agent = |spool: &Path| run_bounded(120, &[], &["agent", "--server", &url, "--once", "--window", "1", "-F", "49", "--shutdown-timeout", "1", "--spool-dir", spool.to_str().unwrap()]);
    agent(&open).assert_user_error("refusing the spool directory");

    // Entries a private directory could only hold from before it was private: planted by root
    // here, one of them handed to nobody.
    let private = dir.join("private");
    fs::create_dir(&private).unwrap();
    chmod(&private, 0o700);
    sh_as(&[], &plant(&private));
    let others = private.join("3-00000000.pushreq");
    fs::write(&others, "not a push request").unwrap();
    std::os::unix::fs::chown(&others, Some(65534), Some(65534)).unwrap();
    let run = agent(&private);
    assert_eq!(run.code, 0, "{}", run.context());
    assert_eq!(run.stderr.matches("spool file skipped").count(), 3, "{}", run.context());
    receiver.stop();
    assert!(receiver.received().iter().all(|r| !String::from_utf8_lossy(&r.raw).contains("SECRET")));
    assert!(!receiver.received().is_empty(), "the window itself was pushed");
    assert_untouched(&victim);
    for name in ["1-00000000.pushreq", "2-00000000.pushreq", "3-00000000.pushreq", ".9-00000000.pushreq.0.tmp"] {
        assert!(fs::symlink_metadata(private.join(name)).is_ok(), "{name} was removed");
    }
}

/// Records `huge_names.py 200 60 CHARS`, run by nobody, for 8 s to folded stacks.
fn record_python_names(chars: usize) -> (Run, String) {
    let programs = OpenDir::new("gpuflame-names-");
    let script = programs.copy(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/huge_names.py"));
    let mut python = as_nobody("/usr/bin/python3.11", &[script.to_str().unwrap(), "200", "60", &chars.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(python.stdout.as_mut().unwrap()), &mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("names.folded");
    let run = run_bounded(120, &[], &["record", "-F", "499", "-d", "8", "-p", &python.id().to_string(), "-o", out.to_str().unwrap()]);
    let _ = python.kill();
    let _ = python.wait();
    assert_eq!(run.code, 0, "{}", run.context());
    (run, fs::read_to_string(&out).unwrap())
}

/// How much more peak RSS than a baseline recording with short names (the base depends on the
/// machine) long names may cost: a few KiB per name, plus, for ELF symbols, the private copy of
/// the file's symbols and DWARF while it is symbolized (67 MiB of them for the 8 MiB names, of
/// which 24 MiB showed in RSS). Read whole, the 8 MiB names cost 132 MiB more.
const NAMES_RSS_MIB: u64 = 64;

/// Row 5, Python: 200 code objects with names of a million characters, and a file name as long,
/// made by a process of nobody's. Names are read only as far as profiles keep them (their last
/// 4096 characters), so gpuflame's memory does not grow with them (read whole, they took over
/// 2 minutes of a debug build and hundreds of MiB) and the output stays small.
#[test]
fn python_names_of_a_million_characters_cost_bounded_memory() {
    require_bpf();
    let (base, _) = record_python_names(30);
    let (run, text) = record_python_names(1_000_000);
    let names: std::collections::BTreeSet<&str> = text.split(';').filter(|f| f.contains("_tail")).map(|f| f.split(" (").next().unwrap()).collect();
    eprintln!(
        "python: peak RSS {} MiB (short names: {} MiB), output {} KiB, {} distinct long names",
        run.max_rss_mib,
        base.max_rss_mib,
        text.len() >> 10,
        names.len()
    );
    assert!(names.len() >= 20, "the long names were sampled: {}", run.context());
    for name in &names {
        assert!(name.len() <= 4096 && name.starts_with('…') && name.contains("nnn_tail"), "{}…", &name[..64]);
    }
    assert!(run.max_rss_mib < base.max_rss_mib + NAMES_RSS_MIB, "peak RSS {} MiB, {} MiB with short names", run.max_rss_mib, base.max_rss_mib);
    assert!(text.len() < 64 << 20, "output of {} bytes", text.len());
}

/// Builds and records a program with four functions named by mangled names whose one component
/// is `len` bytes long (in .symtab and DWARF); the folded output.
fn record_long_symbols(len: usize) -> (Run, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from("#include <stdlib.h>\n#include <time.h>\n");
    let component = "c".repeat(len);
    for i in 0..4 {
        src += &format!("__attribute__((noinline)) long hot{i}(long n) __asm__(\"_ZN{len}{component}5hot{i:02}Ev\");\n");
        src += &format!("__attribute__((noinline)) long hot{i}(long n) {{ long x = 0; for (long j = 0; j < n; j++) x += j * {}; return x; }}\n", i + 1);
    }
    src += "int main(int argc, char **argv) { time_t end = time(0) + atoi(argv[1]); long t = 0;\n\
            while (time(0) < end) t += hot0(2000000) + hot1(2000000) + hot2(2000000) + hot3(2000000); return (int)(t & 1); }\n";
    fs::write(dir.path().join("names.c"), src).unwrap();
    common::cuda::cc_in(dir.path(), &["-O1", "-g", "-fno-omit-frame-pointer", "-o", "names", "names.c"]);
    let out = dir.path().join("names.folded");
    let exe = dir.path().join("names");
    let run = run_bounded(120, &[], &["record", "-F", "499", "-o", out.to_str().unwrap(), "--", exe.to_str().unwrap(), "5"]);
    assert_eq!(run.code, 0, "{}", run.context());
    (run, fs::read_to_string(&out).unwrap())
}

/// Row 5, native: four functions with mangled names of 8 MiB each. They are not demangled (past
/// 64 KiB) and keep their last 4096 bytes; read whole and demangled they cost 110 MiB more.
#[test]
fn symbol_names_of_eight_mib_cost_bounded_memory() {
    require_bpf();
    let (base, _) = record_long_symbols(10);
    let (run, text) = record_long_symbols(8 << 20);
    let hot: std::collections::BTreeSet<&str> = text.split(';').map(|f| f.rsplit_once(' ').map_or(f, |(name, _)| name)).filter(|f| f.contains("5hot0")).collect();
    eprintln!(
        "symbols: peak RSS {} MiB (short names: {} MiB), output {} KiB, names {:?}",
        run.max_rss_mib,
        base.max_rss_mib,
        text.len() >> 10,
        hot.iter().map(|n| (n.len(), &n[n.len() - 12..])).collect::<Vec<_>>()
    );
    let expected: Vec<String> = (0..4).map(|i| format!("5hot0{i}Ev")).collect();
    assert!(hot.len() == 4 && hot.iter().zip(&expected).all(|(n, e)| n.len() <= 4096 && n.starts_with('…') && n.ends_with(e.as_str())), "{}", run.context());
    assert!(run.max_rss_mib < base.max_rss_mib + NAMES_RSS_MIB, "peak RSS {} MiB, {} MiB with short names", run.max_rss_mib, base.max_rss_mib);
    assert!(text.len() < 4 << 20, "output of {} bytes", text.len());
}

/// Row 6: durations and sizes out of range, from flags, the environment and the config file.
#[test]
fn durations_and_sizes_out_of_range_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.svg");
    let out = out.to_str().unwrap();
    for (args, needle) in [
        (vec!["record", "-d", "1e20", "-o", out], "duration 1e20 is out of range"),
        (vec!["record", "-d", "inf", "-o", out], "duration inf is out of range"),
        (vec!["record", "-d=-1", "-o", out], "duration -1 is out of range"),
        (vec!["record", "--cuda-window-ms", "0", "-o", out], "--cuda-window-ms 0 is out of range"),
        (vec!["record", "--unwind-rows", "18446744073709551615", "-o", out], "--unwind-rows 18446744073709551615 is out of range"),
        (vec!["agent", "--server", "http://127.0.0.1:9", "--window", "1e300"], "window 1e300 is out of range"),
        (vec!["agent", "--server", "http://127.0.0.1:9", "--shutdown-timeout", "1e20"], "shutdown timeout 1e20 is out of range"),
        (vec!["agent", "--server", "http://127.0.0.1:9", "--max-backoff", "NaN"], "max backoff NaN is out of range"),
        (vec!["agent", "--server", "http://127.0.0.1:9", "--queue-bytes", "0"], "queue_bytes 0 is out of range"),
        (vec!["convert", "-F", "0", out, "-o", out], "frequency 0 Hz is out of range"),
    ] {
        run_bounded(30, &[], &args).assert_user_error(needle);
    }
    let config = dir.path().join("agent.toml");
    fs::write(&config, "server = \"http://127.0.0.1:9\"\nwindow = 1e300\n").unwrap();
    run_bounded(30, &[], &["agent", "--config", config.to_str().unwrap()]).assert_user_error("window 1e300 is out of range");
    let env = run_bounded(30, &["env", "GPUFLAME_WINDOW=1e20"], &["agent", "--server", "http://127.0.0.1:9"]);
    env.assert_user_error("window 1e20 is out of range");
}

/// Row 7: a gzip bomb (512 MiB of zeros in 2 MiB) stops at the bound on what is decompressed,
/// 256 MiB, with one line; a real profile of a million samples converts in bounded memory.
#[test]
fn convert_bounds_what_it_decompresses_and_holds() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.pb.gz");
    let made = Command::new("sh").arg("-c").arg(format!("head -c 512M /dev/zero | gzip -1 -c > {}", bomb.display())).status().unwrap();
    assert!(made.success());
    let svg = dir.path().join("bomb.svg");
    let run = run_bounded(120, &[], &["convert", bomb.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    run.assert_user_error("decompresses to more than 256 MiB");
    eprintln!("gzip bomb: peak RSS {} MiB", run.max_rss_mib);
    assert!(run.max_rss_mib < 320, "{}", run.context());
    assert!(!svg.exists());

    let big = dir.path().join("million.pb");
    fs::write(&big, million_sample_pprof()).unwrap();
    let folded = dir.path().join("million.folded");
    let run = run_bounded(300, &[], &["convert", big.to_str().unwrap(), "-o", folded.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.context());
    eprintln!("1M samples ({} MiB of pprof): peak RSS {} MiB", fs::metadata(&big).unwrap().len() >> 20, run.max_rss_mib);
    assert_eq!(read_folded(&folded).len(), 1_000_000);
    assert!(run.max_rss_mib < 640, "{}", run.context());
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field(out: &mut Vec<u8>, tag: u64, payload: &[u8]) {
    varint(out, tag << 3 | 2);
    varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

fn varint_field(out: &mut Vec<u8>, tag: u64, v: u64) {
    varint(out, tag << 3);
    varint(out, v);
}

/// A pprof (uncompressed protobuf) of 1,000,000 samples with distinct stacks of three of 1000
/// functions, encoded directly: the debug build's encoder would take minutes.
fn million_sample_pprof() -> Vec<u8> {
    const FUNCTIONS: u64 = 1000;
    let mut p = Vec::new();
    let mut vt = Vec::new();
    varint_field(&mut vt, 1, 1);
    varint_field(&mut vt, 2, 2);
    field(&mut p, 1, &vt);
    for i in 0..1_000_000u64 {
        let (mut ids, mut sample) = (Vec::new(), Vec::new());
        for id in [i % FUNCTIONS, i / FUNCTIONS % FUNCTIONS, 7] {
            varint(&mut ids, id + 1);
        }
        field(&mut sample, 1, &ids);
        let mut value = Vec::new();
        varint(&mut value, 10_101_010);
        field(&mut sample, 2, &value);
        field(&mut p, 2, &sample);
    }
    for id in 1..=FUNCTIONS {
        let (mut loc, mut line, mut function) = (Vec::new(), Vec::new(), Vec::new());
        varint_field(&mut line, 1, id);
        varint_field(&mut loc, 1, id);
        field(&mut loc, 4, &line);
        field(&mut p, 4, &loc);
        varint_field(&mut function, 1, id);
        varint_field(&mut function, 2, id + 2);
        field(&mut p, 5, &function);
    }
    for s in ["", "cpu", "nanoseconds"].into_iter().map(String::from).chain((1..=FUNCTIONS).map(|i| format!("function_{i}"))) {
        field(&mut p, 6, s.as_bytes());
    }
    varint_field(&mut p, 12, 10_101_010);
    p
}
