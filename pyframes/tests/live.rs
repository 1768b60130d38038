//! The offsets checked against live interpreters: from `_PyRuntime`, through the interpreter's
//! thread list to the thread that sits in a known function, to that function's code object.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use gpuflame_pyframes::{find_interpreter, FrameEntry, Interpreter, Mapping};

const SCRIPT: &str = "import threading, time
def waiting_here():
    print(threading.get_ident(), flush=True)
    time.sleep(60)
waiting_here()
";

/// Every interpreter the tests expect; see scripts/setup.sh for where the Debian builds go.
pub fn interpreters() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for minor in 8..=13 {
        let found = std::fs::read_dir("/root/.pyenv/versions")
            .ok()
            .and_then(|d| d.flatten().map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("3.{minor}.")))).max());
        v.push(found.map(|p| p.join(format!("bin/python3.{minor}"))).unwrap_or_else(|| PathBuf::from(format!("<pyenv 3.{minor} missing>"))));
    }
    v.push(PathBuf::from("/usr/bin/python3.11"));
    let debian = std::env::var("GPUFLAME_TEST_PYTHONS").unwrap_or_else(|_| "/opt/gpuflame-pythons".into());
    for minor in [13, 14, 15] {
        v.push(Path::new(&debian).join(format!("3.{minor}/usr/bin/python3.{minor}")));
    }
    v
}

fn read_mem(pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
    let mut f = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    f.seek(SeekFrom::Start(addr)).ok()?;
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

fn read_u64(pid: u32, addr: u64) -> u64 {
    let b = read_mem(pid, addr, 8).unwrap_or_else(|| panic!("reading {addr:#x}"));
    u64::from_le_bytes(b.try_into().unwrap())
}

fn read_ascii(pid: u32, obj: u64, interp: &Interpreter) -> String {
    let len = read_u64(pid, obj + 16) as usize;
    let state = read_mem(pid, obj + 32, 1).unwrap()[0];
    assert!(state & 0x40 != 0, "not an ASCII string");
    String::from_utf8(read_mem(pid, obj + interp.offsets.ascii_object_size as u64, len).unwrap()).unwrap()
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn check(python: &Path) -> Result<String, String> {
    if !python.exists() {
        return Err(format!("{} is missing (scripts/setup.sh installs the interpreters the tests need)", python.display()));
    }
    let mut child = Killed(Command::new(python).args(["-c", SCRIPT]).stdout(Stdio::piped()).spawn().map_err(|e| e.to_string())?);
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().unwrap()).read_line(&mut line).map_err(|e| e.to_string())?;
    let ident: u64 = line.trim().parse().map_err(|_| format!("bad ident {line:?}"))?;
    let pid = child.0.id();
    let maps_text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let entries: Vec<(u64, u64, u64, String)> = maps_text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f.get(5)?.to_string();
            let (start, end) = f[0].split_once('-')?;
            Some((u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?, u64::from_str_radix(f[2], 16).ok()?, path))
        })
        .collect();
    let maps: Vec<Mapping<'_>> = entries.iter().map(|(s, e, o, p)| Mapping { start: *s, end: *e, offset: *o, path: p }).collect();
    let interp = find_interpreter(&maps, |a, n| read_mem(pid, a, n)).map_err(|e| e.to_string())?.ok_or("no interpreter found")?;
    let o = interp.offsets;
    if interp.eval_ranges.is_empty() {
        return Err("no _PyEval_EvalFrameDefault".into());
    }
    // Interpreter → threads → the main thread, by its pthread_t.
    let is = read_u64(pid, interp.runtime_addr + o.runtime_interpreters_head as u64);
    let mut ts = read_u64(pid, is + o.interp_threads_head as u64);
    let mut n = 0;
    while ts != 0 && read_u64(pid, ts + o.tstate_thread_id as u64) != ident {
        ts = read_u64(pid, ts + o.tstate_next as u64);
        n += 1;
        if n > 100 {
            return Err("thread list does not end".into());
        }
    }
    if ts == 0 {
        return Err(format!("no thread state with thread_id {ident:#x}"));
    }
    let mut frame = read_u64(pid, ts + o.tstate_frame as u64);
    if let Some(cf) = o.cframe_current_frame {
        frame = read_u64(pid, frame + cf as u64);
    }
    let code = read_u64(pid, frame + o.frame_code as u64) & !7; // 3.14 tags the reference
    let name = read_ascii(pid, read_u64(pid, code + o.code_name as u64), &interp);
    let firstlineno = u32::from_le_bytes(read_mem(pid, code + o.code_firstlineno as u64, 4).unwrap().try_into().unwrap());
    if let Some(q) = o.code_qualname {
        let qual = read_ascii(pid, read_u64(pid, code + q as u64), &interp);
        if qual != "waiting_here" {
            return Err(format!("qualname {qual:?}"));
        }
    }
    let filename = read_ascii(pid, read_u64(pid, code + o.code_filename as u64), &interp);
    if name != "waiting_here" || firstlineno != 2 || filename != "<string>" {
        return Err(format!("code object reads as {name:?} line {firstlineno} in {filename:?}"));
    }
    // The caller is the module, and for 3.12+ a C-stack shim frame ends each evaluation call.
    let caller = read_u64(pid, frame + o.frame_previous as u64);
    if let FrameEntry::Owner { offset, cstack } = o.frame_entry {
        let owner = |f: u64| read_mem(pid, f + offset as u64, 1).unwrap()[0];
        let mut f = caller;
        let mut seen = Vec::new();
        while f != 0 && seen.len() < 10 {
            seen.push(owner(f));
            f = read_u64(pid, f + o.frame_previous as u64);
        }
        if !seen.contains(&cstack) {
            return Err(format!("no frame owned by the C stack ({cstack}) below the module; owners {seen:?}"));
        }
    }
    Ok(format!("{} {}.{}: ok", python.display(), interp.version.0, interp.version.1))
}

#[test]
fn offsets_agree_with_live_interpreters() {
    let results: Vec<Result<String, String>> = interpreters().iter().map(|p| check(p).map_err(|e| format!("{}: {e}", p.display()))).collect();
    for r in &results {
        eprintln!("{}", r.as_ref().unwrap_or_else(|e| e));
    }
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failures.is_empty(), "{failures:#?}");
}
