//! Builds gpuflame's CUPTI injection library (cupti/gpuflame_cupti.c), which the binary carries
//! and writes out when a recording needs it.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let src = "cupti/gpuflame_cupti.c";
    let lib = out.join("libgpuflame_cupti.so");
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-g", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libgpuflame_cupti.so", "-o"])
        .arg(&lib)
        .arg(src)
        .args(["-ldl", "-lpthread"])
        .status()
        .unwrap_or_else(|e| panic!("running {cc} to build {src}: {e} (a C compiler is needed: apt install build-essential)"));
    assert!(status.success(), "building {src} failed");
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed=cupti/cupti_layout.h");
    println!("cargo:rerun-if-env-changed=CC");
}
