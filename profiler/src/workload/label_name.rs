//! What a label name may be, for every label gpuflame writes (rank labels, the agent's series):
//! the name every Pyroscope version takes as it is.

/// Pyroscope 1.x wants Prometheus' classic names (`[a-zA-Z_][a-zA-Z0-9_]*`), later versions turn
/// dots into underscores or take any UTF-8; the classic form is the one that means the same
/// everywhere.
pub fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'A'..=b'Z' | b'_')) && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
