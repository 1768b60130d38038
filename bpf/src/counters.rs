//! The BPF programs' counters. Each is declared once, below: its field, the `enum counter` entry
//! (counters.h) that the programs count it under, and what it counts. The structs, their reading
//! from the `counters` map and their listing by name all come from that one list, so a counter
//! reported or exported generically cannot be left out of one of them. The C enum cannot be
//! generated from here (the programs are compiled before this crate), so a test holds it to the
//! list: same names, same order.

use libbpf_rs::{MapCore, MapFlags};

use crate::error::BpfError;
use crate::skel::types::counter as raw;

/// One counter with its value, for reporting or exporting the counters without naming each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// The field of [`Counters`] that holds its group (`"unwind"`, `"python"`, `"cuda"`,
    /// `"off_cpu"`), or `""` for a field of [`Counters`] itself.
    pub group: &'static str,
    /// Its field in that struct.
    pub name: &'static str,
    /// What it counts, in one line.
    pub help: &'static str,
    pub value: u64,
}

macro_rules! counters {
    (
        $(#[$meta:meta])* $name:ident { $($field:ident = $c:ident, $help:literal;)* }
        $($(#[$gmeta:meta])* $gfield:ident: $group:ident { $($gf:ident = $gc:ident, $ghelp:literal;)* })*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $(#[doc = $help] pub $field: u64,)*
            $(pub $gfield: $group,)*
        }

        impl $name {
            /// The `enum counter` names, in the order the list declares them.
            #[cfg(test)]
            fn c_names() -> Vec<&'static str> {
                let mut names = vec![$(stringify!($c)),*];
                $(names.extend([$(stringify!($gc)),*]);)*
                names
            }

            /// Reads each counter with `read`, in the list's order.
            pub(crate) fn read_with<E>(mut read: impl FnMut(raw) -> Result<u64, E>) -> Result<Self, E> {
                Ok($name { $($field: read(raw::$c)?,)* $($gfield: $group::read_with(&mut read)?,)* })
            }

            /// Every counter, its group's included, in the list's order (that of `enum counter`).
            pub fn all(&self) -> Vec<Counter> {
                let mut all = vec![$(Counter { group: "", name: stringify!($field), help: $help, value: self.$field }),*];
                $(all.extend(self.$gfield.all());)*
                all
            }

            /// (name, value) of every counter as [`Self::all`] lists them; a group's counters are
            /// named `group.field` (`"unwind.no_row"`).
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                let mut named = vec![$((stringify!($field), self.$field)),*];
                $(named.extend([$((concat!(stringify!($gfield), ".", stringify!($gf)), self.$gfield.$gf)),*]);)*
                named
            }
        }

        $(
            $(#[$gmeta])*
            #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
            pub struct $group { $(#[doc = $ghelp] pub $gf: u64,)* }

            impl $group {
                fn read_with<E>(read: &mut impl FnMut(raw) -> Result<u64, E>) -> Result<Self, E> {
                    Ok($group { $($gf: read(raw::$gc)?,)* })
                }

                /// Its counters, in the list's order.
                pub fn all(&self) -> Vec<Counter> {
                    vec![$(Counter { group: stringify!($gfield), name: stringify!($gf), help: $ghelp, value: self.$gf }),*]
                }

                /// (field name, value) of its counters, in the list's order.
                pub fn named(&self) -> Vec<(&'static str, u64)> {
                    vec![$((stringify!($gf), self.$gf)),*]
                }
            }
        )*
    };
}

counters! {
    /// The sampler's counters, summed over CPUs.
    Counters {
        samples = COUNTER_SAMPLES, "Samples of target processes taken in BPF.";
        lost = COUNTER_LOST, "Samples dropped because the ring buffer was full.";
        kernel_stack_failed = COUNTER_KSTACK_FAILED, "Kernel stack reads (bpf_get_stack) that failed.";
        user_stack_failed = COUNTER_USTACK_FAILED, "User stacks that ended before their outermost frame.";
        targets_full = COUNTER_TARGETS_FULL, "New descendants that did not fit into the target map.";
        process_events_lost = COUNTER_PROCESS_EVENTS_LOST, "Process events dropped because their ring buffer was full.";
        mmap_throttled = COUNTER_MMAP_THROTTLED, "Code mappings not reported because their process mapped code faster than its budget.";
    }
    /// Why user stacks ended early, by reason; and how frames without unwind rows were stepped.
    unwind: UnwindCounters {
        no_process = COUNTER_UNWIND_NO_PROCESS, "Stacks of processes whose mappings were not loaded yet.";
        no_mapping = COUNTER_UNWIND_NO_MAPPING, "Stacks that reached an address in no known executable mapping.";
        no_row = COUNTER_UNWIND_NO_ROW, "Stacks that reached code with no unwind row and no frame pointer to fall back to.";
        bad_cfa = COUNTER_UNWIND_BAD_CFA, "Stacks that met a rule the unwinder does not follow, or a CFA of 0.";
        read_fault = COUNTER_UNWIND_READ_FAULT, "Stacks whose memory could not be read (paged out, or garbage).";
        truncated = COUNTER_UNWIND_TRUNCATED, "Stacks deeper than the unwinder walks.";
        no_table_yet = COUNTER_UNWIND_NO_TABLE_YET, "Stacks that stopped at a file whose table was not built yet.";
        bad_frame = COUNTER_UNWIND_BAD_FRAME, "Stacks that stopped at code without CFI whose caller was not found.";
        frame_pointer_steps = COUNTER_UNWIND_FP_FALLBACK, "Frames stepped with frame pointers for lack of unwind rows.";
        frame_pointer_rejected = COUNTER_UNWIND_FP_REJECTED, "Frame-pointer steps refused: rbp did not lead to a return address.";
        scanned_frames = COUNTER_UNWIND_SCANNED, "Callers of code without CFI found by scanning the stack.";
        bp_recovered = COUNTER_UNWIND_BP_RECOVERED, "Callers of scanned frames given the rbp saved under the return address: the code without CFI had used rbp as a register.";
        by_file = COUNTER_UNWIND_BY_FILE, "Frames unwound with their file's table before the process's maps were read.";
        stack_copies = COUNTER_STACK_COPIES, "Stacks copied where the walk met a table not loaded yet, for user space to finish.";
        stack_copy_bytes = COUNTER_STACK_COPY_BYTES, "Bytes of those copies sent to the ring.";
        stack_copy_budget = COUNTER_STACK_COPY_BUDGET, "Copies the per-CPU budget turned away (the sample keeps its cut stack).";
        stack_copy_lost = COUNTER_STACK_COPY_LOST, "Copies the full ring turned away.";
    }
    /// The Python walker's counters.
    python: PythonCounters {
        frames = COUNTER_PY_FRAMES, "Python frames emitted.";
        no_thread = COUNTER_PY_NO_THREAD, "Samples of Python processes whose thread state was not found.";
        read_faults = COUNTER_PY_READ_FAULT, "Reads of interpreter memory that failed.";
        after_gap = COUNTER_PY_AFTER_GAP, "Samples whose Python frames were kept after the native walk stopped early.";
        truncated = COUNTER_PY_TRUNCATED, "Samples that had no room for all their Python frames.";
        deep = COUNTER_PY_DEEP, "Samples whose eval-loop call ran more Python frames than the walk looks through for its end: its innermost frames kept, the rest cut.";
    }
    /// The CUDA hooks' counters.
    cuda: CudaCounters {
        calls = COUNTER_CUDA_CALLS, "Outermost hooked calls seen returning.";
        lost = COUNTER_CUDA_LOST, "CUDA records dropped because the ring buffer was full.";
        table_full = COUNTER_CUDA_CALLS_FULL, "Calls not followed because the table of calls in flight was full.";
        races = COUNTER_CUDA_RACE, "CUDA records dropped because another hook reused their scratch space (preemption).";
        memory_events_lost = COUNTER_MEMORY_EVENTS_LOST, "Allocations and frees the full ring kept off the memory timeline and the allocation profiles (the live set, and so in-use, still has them).";
        memory_stacks_lost = COUNTER_MEMORY_STACKS_LOST, "Allocations whose new stack the full ring turned away: in use under [stacks lost: ring full].";
        live_full = COUNTER_LIVE_FULL, "Allocations not kept in the live set because it was full (--max-live-allocations): missing from in-use.";
        live_replaced = COUNTER_LIVE_REPLACED, "Allocations at an address that was live: the free before them was not seen.";
        tensors_allocated = COUNTER_TENSORS_ALLOCATED, "Tensors PyTorch's allocator handed out (into the live set).";
        tensors_sampled_out = COUNTER_TENSORS_SAMPLED_OUT, "Of them, those whose stack byte sampling passed over.";
        tensors_freed = COUNTER_TENSORS_FREED, "Tensors freed (out of the live set).";
        tensors_unknown_frees = COUNTER_TENSORS_UNKNOWN_FREES, "Frees of tensors the live set did not have: allocated before gpuflame attached.";
    }
    /// The off-CPU programs' counters.
    off_cpu: OffCpuCounters {
        switches = COUNTER_OFFCPU_SWITCHES, "Switch-outs of target threads.";
        drawn = COUNTER_OFFCPU_DRAWN, "Switch-outs drawn for unwinding (each with its chance, which weighs its time).";
        unwound = COUNTER_OFFCPU_UNWOUND, "Switch-outs unwound and sent with their stack.";
        over_budget = COUNTER_OFFCPU_BUDGET, "Switch-outs drawn but not unwound because their CPU's unwind budget was spent.";
        lost = COUNTER_OFFCPU_LOST, "Off-CPU records dropped because the ring buffer was full.";
        threads_full = COUNTER_OFFCPU_FULL, "Threads not followed: their off-CPU state could not be made (no memory).";
        followed = COUNTER_OFFCPU_FOLLOWED, "Target threads given off-CPU state.";
        released = COUNTER_OFFCPU_RELEASED, "Threads whose off-CPU state was released at their exit.";
        waited_ns = COUNTER_OFFCPU_WAITED_NS, "Nanoseconds target threads spent off the CPU, every wait measured (what the off-CPU profile adds up to).";
    }
}

/// Reads the per-CPU `counters` map, summed over CPUs.
pub(crate) fn read_map(map: &impl MapCore) -> Result<Counters, BpfError> {
    Counters::read_with(|c| {
        let values = map
            .lookup_percpu(&c.0.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| BpfError::Map { map: "counters", source })?
            .unwrap_or_default();
        Ok(values.iter().filter_map(|v| v.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes)).sum())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `enum counter`'s names in counters.h, in order; checks that each explicit value is its
    /// index, so that the order of the text is the order of the numbers.
    fn c_enum_names() -> Vec<String> {
        let header = include_str!("bpf/counters.h");
        let start = header.find("enum counter {").expect("counters.h declares enum counter");
        let body = &header[start + "enum counter {".len()..];
        let body = &body[..body.find("};").expect("enum counter ends")];
        let mut names = Vec::new();
        for line in body.lines() {
            let code = line.split("/*").next().unwrap_or("").trim();
            for entry in code.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let (name, value) = match entry.split_once('=') {
                    Some((n, v)) => (n.trim(), Some(v.trim().parse::<usize>().expect("a numeric value"))),
                    None => (entry, None),
                };
                if let Some(v) = value {
                    assert_eq!(v, names.len(), "{name} = {v} is not at index {v} of enum counter");
                }
                names.push(name.to_string());
            }
        }
        names
    }

    #[test]
    fn the_list_is_the_c_enum() {
        let mut c = c_enum_names();
        assert_eq!(c.pop().as_deref(), Some("COUNTER_MAX"), "enum counter ends with COUNTER_MAX");
        assert_eq!(Counters::c_names(), c, "counters.rs and counters.h list different counters, or in another order");
        assert_eq!(raw::COUNTER_MAX.0 as usize, c.len());
    }

    #[test]
    fn each_field_reads_its_own_index_and_lists_in_index_order() {
        // Each counter reads as its index + 1: the listing then counts up from 1.
        let counters = Counters::read_with(|c| Ok::<_, ()>(u64::from(c.0) + 1)).unwrap();
        let values: Vec<u64> = counters.named().iter().map(|&(_, v)| v).collect();
        assert_eq!(values, (1..=raw::COUNTER_MAX.0 as u64).collect::<Vec<_>>());
        assert_eq!(counters.unwind.no_row, u64::from(raw::COUNTER_UNWIND_NO_ROW.0) + 1);
        assert_eq!(counters.off_cpu.switches, u64::from(raw::COUNTER_OFFCPU_SWITCHES.0) + 1);
        let all = counters.all();
        assert_eq!(all.len(), values.len());
        assert!(all.iter().zip(counters.named()).all(|(c, (n, v))| c.value == v && n.ends_with(c.name)));
        let row = all.iter().find(|c| c.group == "unwind" && c.name == "no_row").unwrap();
        assert!(!row.help.is_empty());
        assert!(counters.named().contains(&("cuda.lost", counters.cuda.lost)));
        assert_eq!(counters.python.named()[3], ("after_gap", counters.python.after_gap));
    }
}
