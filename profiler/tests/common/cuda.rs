//! The CUDA stand-ins (tests/programs/cuda): libcuda.so.1, libcudart.so.13, libcupti.so.13 and
//! the cuda_app program that drives them, built for a test.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `key=value` lines a stand-in program printed.
pub fn key_values(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect()
}

/// The folder of the stand-ins' sources.
pub fn source(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/cuda").join(file).display().to_string()
}

/// Runs `cc ARGS` in `dir`; fails the test with the compiler's output if it fails.
pub fn cc_in(dir: &Path, args: &[&str]) {
    let out = Command::new("cc").args(args).current_dir(dir).output().expect("a C compiler (cc) is needed");
    assert!(out.status.success(), "cc {args:?}:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// Builds the stand-ins and cuda_app into `dir`; returns cuda_app's path.
pub fn build_stand_ins(dir: &Path) -> PathBuf {
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    cc_in(dir, &["-O2", "-g", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", "libcuda.so.1", &source("fake_cuda.c"), "-lpthread", "-ldl"]);
    cc_in(dir, &[
        "-O2", "-g", "-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o", "libcudart.so.13", &source("fake_cudart.c"), "-L.", "-l:libcuda.so.1",
        "-Wl,-rpath,$ORIGIN", "-ldl", "-lpthread",
    ]);
    cc_in(dir, &["-O2", "-g", "-shared", "-fPIC", "-Wl,-soname,libcupti.so.13", "-o", "libcupti.so.13", &source("fake_cupti.c"), "-lpthread"]);
    cc_in(dir, &[
        "-O2", "-s", "-shared", "-fPIC", "-Wl,-soname,libtorch_kernels.so", "-o", "libtorch_kernels.so", &source("torch_kernels.c"), "-L.", "-l:libcudart.so.13",
        "-Wl,-rpath,$ORIGIN",
    ]);
    cc_in(dir, &["-O2", "-g", "-rdynamic", "-o", "cuda_app", &source("cuda_app.c"), "-L.", "-l:libcudart.so.13", "-l:libcuda.so.1", &rpath]);
    dir.join("cuda_app")
}

/// Builds the stand-in libnccl.so.2 into `dir`, next to the stand-in driver it launches through
/// (build_stand_ins first); returns its path.
pub fn build_nccl(dir: &Path) -> PathBuf {
    cc_in(dir, &[
        "-O2", "-g", "-Wall", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", "libnccl.so.2", &source("fake_nccl.c"), "-L.", "-l:libcuda.so.1",
        "-Wl,-rpath,$ORIGIN", "-ldl", "-lpthread", "-lrt",
    ]);
    dir.join("libnccl.so.2")
}

/// Runs `c++ ARGS` in `dir`; fails the test with the compiler's output if it fails.
pub fn cxx_in(dir: &Path, args: &[&str]) {
    let out = Command::new("c++").args(args).current_dir(dir).output().expect("a C++ compiler (c++) is needed");
    assert!(out.status.success(), "c++ {args:?}:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// Builds the stand-ins of PyTorch's libc10.so and libc10_cuda.so (its CUDA caching allocator,
/// under the real mangled names, local symbols as in the real library: -fvisibility=hidden; with
/// PyTorch's USDT probes pytorch:malloc and pytorch:free, as 2.15 has them) into `dir`, on the
/// stand-in runtime there (build_stand_ins first), and tensor_app, the C++ program that allocates
/// tensors through it; returns tensor_app's path.
pub fn build_c10(dir: &Path) -> PathBuf {
    build_c10_with(dir, true, &[])
}

/// As build_c10; `notes`: with the USDT probes, or without (an older or a custom build); `defines`
/// choose among its other shapes (`-DGF_DELETER_CALLS_FREE`; `-DGF_SDT_ARGS_IN_FRAME`: the
/// probe's pointer and device read from the frame, not from registers as in the real library).
pub fn build_c10_with(dir: &Path, notes: bool, defines: &[&str]) -> PathBuf {
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    cxx_in(dir, &["-O2", "-g", "-shared", "-fPIC", "-Wl,-soname,libc10.so", "-o", "libc10.so", &source("fake_c10.cpp")]);
    assert!(!notes || Path::new("/usr/include/x86_64-linux-gnu/sys/sdt.h").exists() || Path::new("/usr/include/sys/sdt.h").exists(), "sys/sdt.h is needed for the USDT probes (systemtap-sdt-dev; scripts/setup.sh)");
    let c10_cuda = source("fake_c10_cuda.cpp");
    let mut args = vec!["-O2", "-g", "-shared", "-fPIC", "-fvisibility=hidden", if notes { "-DGF_SDT" } else { "-UGF_SDT" }];
    args.extend_from_slice(defines);
    args.extend_from_slice(&["-Wl,-soname,libc10_cuda.so", "-o", "libc10_cuda.so", &c10_cuda, "-L.", "-l:libcudart.so.13", "-l:libc10.so", "-Wl,-rpath,$ORIGIN", "-lpthread"]);
    cxx_in(dir, &args);
    cxx_in(dir, &["-O2", "-g", "-rdynamic", "-o", "tensor_app", &source("tensor_app.cpp"), "-L.", "-l:libc10_cuda.so", &rpath]);
    dir.join("tensor_app")
}

/// The stand-ins (CUDA and NCCL) built into a new folder; the Python the ranks run on.
pub fn nccl_stand_ins() -> (tempfile::TempDir, PathBuf, &'static str) {
    super::require_bpf();
    let python = "/usr/bin/python3.11";
    assert!(Path::new(python).exists(), "Debian's python3.11 is needed (scripts/setup.sh installs python3)");
    let dir = tempfile::tempdir().unwrap();
    build_stand_ins(dir.path());
    let nccl = build_nccl(dir.path());
    (dir, nccl, python)
}
