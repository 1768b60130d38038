//! ELF unwind information turned into compact unwind tables for x86-64, for the BPF unwinder.
//!
//! [`UnwindTable::from_elf`] reads `.eh_frame` (and `.debug_frame` where `.eh_frame` does not
//! cover code) with gimli and produces rows sorted by address, each saying how to find the
//! caller's frame from this one: the CFA rule, where RBP was saved, and (fixed on x86-64) the
//! return address at CFA-8. Rules the BPF unwinder cannot follow are kept as
//! [`CfaRule::Unsupported`], never guessed. [`CompactTable`] is the form that goes to BPF.

mod build;
mod compact;
mod copied;
mod elf;
mod entry;
mod error;
mod probe;
mod body;
mod prologue;
mod rule;
mod rule_table;
mod stream;
mod table;
mod without_cfi;

pub use stream::{TablePiece, TableSummary};
pub use compact::{CompactTable, RuleTable};
pub use compact::CompactError;
pub use copied::{follows_call, walk_copied, CodeAt, CopiedStack, ProcessCode, Walk, WalkEnd, WalkStart, WalkedFrame};
pub use elf::ExecutableKey;
pub use error::UnwindError;
pub use probe::{ElfProbe, ProbeError};
pub use rule::{CfaRule, RbpRule, UnwindRule};
pub use table::{load_bias, LoadSegment, TableStats, UnwindRow, UnwindTable};
pub use without_cfi::OFF_VAR as NO_PROLOGUE_ROWS_VAR;
