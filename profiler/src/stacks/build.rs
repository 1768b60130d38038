//! A window's stacks, symbolized: one batch of user addresses and one of kernel addresses are
//! looked up, then each stack becomes the locations of a [`Profile`], each frame with its kind.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuflame_symbolizer::{demangle, Symbol, UserAddr};

use crate::workload::rank::{LabelsByPid, ProcessLabels};
use super::{StackKey, StackValues, Stacks, TailFrame, UserKey};
use crate::frame::{FrameKind, NamedFrame};
use crate::output::fold::fold;
use crate::output::frame_names::FrameNames;
use crate::output::Detail;
use crate::profile::{Labels, Line, Location, Mapping, Profile, ProfileBuilder, KERNEL_MAPPING, PYTHON_MAPPING};

impl Stacks {
    /// Fills `profile` with these stacks, their values, device labels and their processes'
    /// labels, symbolized.
    /// `labels`: of the processes, as the registry knows them (their rank in a job).
    pub fn build(&mut self, profile: &mut Profile, values: StackValues, start: SystemTime, duration: Duration, process_labels: &dyn LabelsByPid) {
        profile.time_nanos = start.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
        profile.duration_nanos = duration.as_nanos() as i64;

        let stub = |t: &TailFrame| match t {
            TailFrame::KernelStub(a, _) => Some(*a),
            _ => None,
        };
        let mut user_addrs: Vec<UserAddr> = values
            .iter()
            .flat_map(|(k, _, _)| {
                k.user
                    .iter()
                    .filter_map(|u| match u {
                        UserKey::Native(a) => Some(*a),
                        UserKey::Python(_) | UserKey::Gap(_) => None,
                    })
                    .chain(k.tail.iter().filter_map(stub))
            })
            .collect();
        user_addrs.sort_unstable();
        user_addrs.dedup();
        let mut kernel_addrs: Vec<u64> = values.iter().flat_map(|(k, _, _)| k.kernel.iter().copied()).collect();
        kernel_addrs.sort_unstable();
        kernel_addrs.dedup();
        let user_syms: HashMap<UserAddr, Symbol> =
            user_addrs.iter().copied().zip(self.symbolizer.symbolize_user(&user_addrs)).collect();
        let kernel_syms: HashMap<u64, Symbol> =
            kernel_addrs.iter().copied().zip(self.symbolizer.symbolize_kernel(&kernel_addrs)).collect();

        let mut b = ProfileBuilder::default();
        let kernel_mapping = b.mapping(profile, Mapping { path: KERNEL_MAPPING.into(), build_id: None });
        let python_mapping = b.mapping(profile, Mapping { path: PYTHON_MAPPING.into(), build_id: None });
        let mut user_locations: HashMap<UserKey, usize> = HashMap::new();
        let mut kernel_locations: HashMap<u64, usize> = HashMap::new();
        for (key, device, vals) in &values {
            let mut stack = Vec::with_capacity(key.user.len() + key.kernel.len() + key.tail.len() + 1);
            if let Some(root) = key.root {
                let location = Location::named(root, FrameKind::Marker);
                stack.push(b.location(profile, location));
            }
            for frame in key.user.iter().rev() {
                let loc = *user_locations.entry(*frame).or_insert_with(|| {
                    let location = match frame {
                        UserKey::Native(addr) => self.user_location(&mut b, profile, *addr, &user_syms[addr]),
                        UserKey::Python(id) => {
                            let py = &self.py_frames[*id as usize];
                            let line = Line { function: py.function.to_string(), file: Some(py.file.to_string()), line: py.line };
                            // A frame that could not be read is gpuflame's marker, not code.
                            let kind = if py.line.is_none() && py.file.is_empty() { FrameKind::Marker } else { FrameKind::Python };
                            Location { mapping: Some(python_mapping), address: 0, kind, lines: vec![line] }
                        }
                        UserKey::Gap(label) => Location::named(*label, FrameKind::Marker),
                    };
                    b.location(profile, location)
                });
                stack.push(loc);
            }
            for frame in &key.tail {
                let (name, kind) = match frame {
                    TailFrame::Call(name) => (name.clone(), FrameKind::CudaApi),
                    TailFrame::Marker(name) => (name.clone(), FrameKind::Marker),
                    // The driver and CUPTI give kernels their mangled names.
                    TailFrame::Kernel(name) => (format!("[gpu] {}", demangle(name)), FrameKind::GpuKernel),
                    TailFrame::KernelStub(addr, driver_name) => match (user_syms[addr].lines.last(), driver_name) {
                        (Some(line), _) => (format!("[gpu] {}", line.function), FrameKind::GpuKernel),
                        (None, Some(name)) => (format!("[gpu] {}", demangle(name)), FrameKind::GpuKernel),
                        (None, None) => ("[gpu] [unknown kernel]".to_string(), FrameKind::GpuKernel),
                    },
                };
                stack.push(b.location(profile, Location::named(name, kind)));
            }
            // An off-CPU stack was taken inside the sched_switch tracepoint: its leaf frames are
            // the program and the tracepoint's plumbing, which differ from call to call.
            let plumbing = if key.leaf.is_some() {
                key.kernel.iter().take_while(|a| kernel_syms[a].lines.first().is_some_and(|l| is_tracepoint_plumbing(&l.function))).count()
            } else {
                0
            };
            for addr in key.kernel[plumbing..].iter().rev() {
                let loc = *kernel_locations.entry(*addr).or_insert_with(|| {
                    let lines = lines_or_unknown(&kernel_syms[addr], || format!("[unknown] ({KERNEL_MAPPING}+{addr:#x})"));
                    b.location(profile, Location { mapping: Some(kernel_mapping), address: *addr, kind: FrameKind::Kernel, lines })
                });
                stack.push(loc);
            }
            if let Some(label) = key.leaf {
                stack.push(b.location(profile, Location::named(label, FrameKind::Marker)));
            }
            let labels = Labels { pid: Some(key.pid), tid: Some(key.tid), comm: Some(key.comm.clone()), device: *device };
            b.add_values(stack, labels, vals);
            if let Some(labels) = process_labels.labels_of(key.pid) {
                profile.process_labels.entry(key.pid).or_insert_with(|| labels.to_vec());
            }
        }
        b.finish(profile);
    }

    /// One stack as a line for logs: `main → load → cudaMalloc`.
    pub fn describe(&mut self, stack: &StackKey) -> String {
        NamedFrame::joined(&self.frames(stack))
    }

    /// The frames of `stack` as folded text names them (line numbers included), outermost
    /// first, each with its kind: what a report picks its lines from, without reading text.
    pub fn frames(&mut self, stack: &StackKey) -> Vec<NamedFrame> {
        let mut profile = Profile::of(vec![crate::profile::ValueType::new("stack", "count")]);
        self.build(&mut profile, vec![(stack.clone(), None, vec![1])], UNIX_EPOCH, Duration::ZERO, &ProcessLabels::new());
        let mut names = FrameNames::default();
        let folded = fold(&profile, Detail::Lines, &mut names);
        if folded.is_empty() {
            return Vec::new();
        }
        // The first name is the process's.
        folded.names(0).iter().skip(1).map(|id| NamedFrame::new(names.get(id), folded.kind(id).unwrap_or_default())).collect()
    }

    fn user_location(&self, b: &mut ProfileBuilder, profile: &mut Profile, addr: UserAddr, sym: &Symbol) -> Location {
        match addr {
            UserAddr::InModule { module, file_offset } => {
                let module = self.symbolizer.module(module);
                let mapping = b.mapping(profile, Mapping { path: module.path.display().to_string(), build_id: module.build_id_hex() });
                let lines = lines_or_unknown(sym, || format!("[unknown] ({}+{file_offset:#x})", module.file_name()));
                // Code that could not be named is drawn as gpuflame's other placeholders are.
                let kind = if sym.is_unknown() { FrameKind::Marker } else { FrameKind::Native };
                Location { mapping: Some(mapping), address: file_offset, kind, lines }
            }
            UserAddr::Unmapped { addr } => {
                Location { mapping: None, address: addr, kind: FrameKind::Marker, lines: vec![Line::function(format!("[unknown] ({addr:#x})"))] }
            }
        }
    }
}

/// Kernel functions that run a BPF program at a tracepoint, and the programs themselves.
fn is_tracepoint_plumbing(function: &str) -> bool {
    ["bpf_prog_", "bpf_trace_run", "__traceiter_", "__bpf_trace_"].iter().any(|p| function.starts_with(p))
}

fn lines_or_unknown(sym: &Symbol, unknown: impl FnOnce() -> String) -> Vec<Line> {
    if sym.is_unknown() {
        return vec![Line::function(unknown())];
    }
    sym.lines.iter().map(|l| Line { function: l.function.clone(), file: l.file.clone(), line: l.line }).collect()
}

#[cfg(test)]
mod tests {
    use super::is_tracepoint_plumbing;

    #[test]
    fn tracepoint_plumbing_is_known_by_name() {
        assert!(is_tracepoint_plumbing("bpf_prog_5bfa299a51b840d9_on_sched_switch"));
        assert!(is_tracepoint_plumbing("__traceiter_sched_switch"));
        assert!(is_tracepoint_plumbing("bpf_trace_run4"));
        assert!(!is_tracepoint_plumbing("__schedule"));
    }
}
