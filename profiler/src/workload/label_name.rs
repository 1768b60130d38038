//! What a label may be, for every label gpuflame writes (rank labels, service names, the agent's
//! series): the names every Pyroscope version takes as they are, and Pyroscope's limits.

/// Pyroscope 1.x wants Prometheus' classic names (`[a-zA-Z_][a-zA-Z0-9_]*`), later versions turn
/// dots into underscores or take any UTF-8; the classic form is the one that means the same
/// everywhere.
pub fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'A'..=b'Z' | b'_')) && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Pyroscope's default `validation.max-length-label-name`.
pub const MAX_NAME_BYTES: usize = 1024;
/// Pyroscope's default `validation.max-length-label-value`.
pub const MAX_VALUE_BYTES: usize = 2048;

/// `value` cut to at most [`MAX_VALUE_BYTES`], at a character boundary, ending in `…` when cut.
pub fn fit_value(value: &str) -> String {
    if value.len() <= MAX_VALUE_BYTES {
        return value.to_string();
    }
    const CUT: &str = "…";
    let mut end = MAX_VALUE_BYTES - CUT.len();
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &value[..end])
}
