//! Folded stacks as gpuflame writes them, read back for the tests' assertions.

use std::path::Path;

/// One folded line: frames root first (the first is the command name) and its count.
#[derive(Debug, Clone)]
pub struct Stack {
    pub frames: Vec<String>,
    pub count: u64,
}

impl Stack {
    pub fn comm(&self) -> &str {
        &self.frames[0]
    }

    /// User frames, root first (everything after the command name that is not a kernel frame).
    pub fn user(&self) -> Vec<&str> {
        self.frames[1..].iter().filter(|f| !f.ends_with("_[k]")).map(String::as_str).collect()
    }

    pub fn kernel(&self) -> Vec<&str> {
        self.frames[1..].iter().filter(|f| f.ends_with("_[k]")).map(|f| f.trim_end_matches("_[k]")).collect()
    }

    /// Kernel frames come after every user frame, as the folded format puts them.
    pub fn kernel_below_user(&self) -> bool {
        let first_kernel = self.frames.iter().position(|f| f.ends_with("_[k]")).unwrap_or(self.frames.len());
        self.frames[first_kernel..].iter().all(|f| f.ends_with("_[k]"))
    }

    /// The stack stopped where the program's files were not known to the unwinder yet: its maps
    /// not read, or a table not loaded (marked at the root). A program started with the
    /// recording has such stacks for its first ~10-200 ms, depending on the machine's load.
    pub fn before_tables(&self) -> bool {
        matches!(self.user().first(), Some(&"[native: unwind table not loaded yet]" | &"[native: unknown code]"))
    }

    pub fn has_sequence(&self, seq: &[&str]) -> bool {
        let user = self.user();
        user.windows(seq.len()).any(|w| w == seq)
    }
}

pub fn parse_folded(text: &str) -> Vec<Stack> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (stack, count) = l.rsplit_once(' ').unwrap_or_else(|| panic!("bad folded line {l:?}"));
            Stack {
                frames: stack.split(';').map(str::to_string).collect(),
                count: count.parse().unwrap_or_else(|_| panic!("bad count in {l:?}")),
            }
        })
        .collect()
}

pub fn read_folded(path: &Path) -> Vec<Stack> {
    parse_folded(&std::fs::read_to_string(path).expect("reading the folded output"))
}

pub fn total(stacks: &[Stack]) -> u64 {
    stacks.iter().map(|s| s.count).sum()
}

pub fn describe(stacks: &[Stack]) -> String {
    let mut v: Vec<_> = stacks.iter().collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.count));
    v.iter().take(15).map(|s| format!("{} {}", s.frames.join(";"), s.count)).collect::<Vec<_>>().join("\n")
}
