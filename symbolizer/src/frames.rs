use std::sync::Arc;

use blazesym::symbolize::{CodeInfo, Symbolized};

use crate::demangle::{demangle, keep_end};

/// One function in the inline chain of an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SymbolLine {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// What an address resolved to: its inline chain, outermost function first (the function that
/// owns the code, then what was inlined into it). Empty when nothing was found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Symbol {
    pub lines: Arc<[SymbolLine]>,
}

impl Symbol {
    pub fn unknown() -> Self {
        Symbol { lines: Arc::from(Vec::new()) }
    }

    pub fn is_unknown(&self) -> bool {
        self.lines.is_empty()
    }

    /// A function known by its name alone (a symbol table's).
    pub(crate) fn function(name: String) -> Self {
        Symbol { lines: Arc::from(vec![SymbolLine { function: name, file: None, line: None }]) }
    }
}

fn file_of(info: &Option<CodeInfo<'_>>) -> (Option<String>, Option<u32>) {
    match info {
        Some(ci) => (Some(keep_end(&ci.to_path().to_string_lossy())), ci.line),
        None => (None, None),
    }
}

/// blazesym gives each function in the chain the code location inside it: the owning function's
/// is the call site of the first inlined one, and so on down to the address itself.
pub(crate) fn symbol_from(s: Symbolized<'_>) -> Symbol {
    let Some(sym) = s.into_sym() else {
        return Symbol::unknown();
    };
    let mut lines = Vec::with_capacity(1 + sym.inlined.len());
    let (file, line) = file_of(&sym.code_info.map(|b| *b));
    lines.push(SymbolLine { function: demangle(&sym.name), file, line });
    for inl in sym.inlined.into_vec() {
        let (file, line) = file_of(&inl.code_info);
        lines.push(SymbolLine { function: demangle(&inl.name), file, line });
    }
    Symbol { lines: Arc::from(lines) }
}
