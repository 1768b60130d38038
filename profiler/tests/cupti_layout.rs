//! The CUPTI layout the injection library reads (profiler/cupti/cupti_layout.h) against the real
//! headers of CUPTI 12 and 13, as NVIDIA ships them on PyPI (scripts/setup.sh unpacks them into
//! /opt/gpuflame-cupti): every field offset of every CUpti_ActivityKernel version the headers
//! declare, and of CUpti_CallbackData, compiled with offsetof. No GPU needed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where setup.sh puts the headers: one `include` directory per CUPTI major version.
const HEADERS: &str = "/opt/gpuflame-cupti";

/// (field in CUpti_ActivityKernelN, gpuflame's offset macro).
const KERNEL_FIELDS: &[(&str, &str)] = &[
    ("kind", "K_KIND"),
    ("start", "K_START"),
    ("end", "K_END"),
    ("deviceId", "K_DEVICE"),
    ("streamId", "K_STREAM"),
    ("correlationId", "K_CORRELATION"),
    ("name", "K_NAME"),
    ("graphNodeId", "K_GRAPH_NODE"),
    ("graphId", "K_GRAPH"),
];

/// (field in CUpti_CallbackData, field in gpuflame's struct cupti_callback_data).
const CALLBACK_FIELDS: &[(&str, &str)] = &[
    ("callbackSite", "callback_site"),
    ("functionName", "function_name"),
    ("functionParams", "function_params"),
    ("functionReturnValue", "function_return_value"),
    ("symbolName", "symbol_name"),
    ("context", "context"),
    ("contextUid", "context_uid"),
    ("correlationData", "correlation_data"),
    ("correlationId", "correlation_id"),
];

/// The CUpti_ActivityKernelN structs a header declares, with their text.
fn kernel_structs(text: &str) -> Vec<(u32, &str)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(end) = rest.find("} CUpti_ActivityKernel") {
        let after = &rest[end + "} CUpti_ActivityKernel".len()..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        let body_start = rest[..end].rfind("typedef struct").unwrap_or(0);
        if let (Ok(n), true) = (digits.parse::<u32>(), after[digits.len()..].starts_with(';')) {
            out.push((n, &rest[body_start..end]));
        }
        rest = after;
    }
    out
}

/// Whether a struct body declares `field` (as `type field;`).
fn declares(body: &str, field: &str) -> bool {
    body.lines().any(|l| l.trim_end().strip_suffix(';').is_some_and(|decl| decl.split(|c: char| c.is_whitespace() || c == '*').next_back() == Some(field)))
}

/// A C file of static assertions for one CUPTI version; also how many kernel versions it checks.
fn checks(include: &Path) -> (String, usize) {
    let mut c = String::from("#include <stddef.h>\n#include <cupti_activity.h>\n#include <cupti_callbacks.h>\n#include \"cupti_layout.h\"\n");
    c.push_str("#define CHECK(type, field, off) _Static_assert(offsetof(type, field) == (off), #type \".\" #field \" is not at \" #off)\n");
    let mut versions = 0;
    for header in ["cupti_activity.h", "cupti_activity_deprecated.h"] {
        let Ok(text) = std::fs::read_to_string(include.join(header)) else { continue };
        for (n, body) in kernel_structs(&text).into_iter().filter(|&(n, _)| n >= 4) {
            versions += 1;
            for (field, off) in KERNEL_FIELDS.iter().filter(|(f, _)| declares(body, f)) {
                c.push_str(&format!("CHECK(CUpti_ActivityKernel{n}, {field}, {off});\n"));
            }
        }
    }
    for (theirs, ours) in CALLBACK_FIELDS {
        c.push_str(&format!("CHECK(CUpti_CallbackData, {theirs}, offsetof(struct cupti_callback_data, {ours}));\n"));
    }
    (c, versions)
}

#[test]
fn the_injection_library_reads_cupti_12_and_13_records_at_their_real_offsets() {
    let layout = Path::new(env!("CARGO_MANIFEST_DIR")).join("cupti");
    let dir = tempfile::tempdir().unwrap();
    for major in ["12", "13"] {
        let include: PathBuf = Path::new(HEADERS).join(major).join("include");
        assert!(
            include.join("cupti_activity.h").exists(),
            "CUPTI {major} headers are missing at {} (scripts/setup.sh unpacks them from PyPI's nvidia-cuda-cupti wheels)",
            include.display()
        );
        let (source, versions) = checks(&include);
        assert!(versions >= 4, "CUPTI {major}: only {versions} CUpti_ActivityKernel versions found in {}", include.display());
        let file = dir.path().join(format!("check{major}.c"));
        std::fs::write(&file, &source).unwrap();
        let out = Command::new("cc").args(["-fsyntax-only", "-std=c11", "-Wall"]).arg("-I").arg(&include).arg("-I").arg(&layout).arg(&file).output().unwrap();
        assert!(out.status.success(), "CUPTI {major}: the layout does not match:\n{}\n{source}", String::from_utf8_lossy(&out.stderr));
        eprintln!("CUPTI {major}: {} offsets in {versions} kernel record versions and CUpti_CallbackData match", source.matches("CHECK(").count() - 1);
    }
}

#[test]
fn struct_parsing_finds_fields() {
    let text = "typedef struct PACKED_ALIGNMENT {\n  CUpti_ActivityKind kind;\n  uint64_t start;\n  const char *name;\n} CUpti_ActivityKernel9;\n";
    let structs = kernel_structs(text);
    assert_eq!(structs.len(), 1);
    assert_eq!(structs[0].0, 9);
    assert!(declares(structs[0].1, "kind") && declares(structs[0].1, "name") && !declares(structs[0].1, "graphId"));
}
