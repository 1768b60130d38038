//! What a frame of a stack is: Python, native, kernel, a CUDA call, a GPU kernel, a thread, or a
//! marker that gpuflame put there (`[truncated]`, `[off-cpu: sleeping]`). Aggregation knows it
//! and says so on every [`crate::profile::Location`]; the SVG colours and its legend come from it.
//! Only profiles read back from files (pprof, folded), which do not carry it, have it guessed
//! from names ([`FrameKind::guess`]).

use std::hash::{Hash, Hasher};

/// One frame of a stack as it is shown (its name in folded text), with what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFrame {
    pub name: String,
    pub kind: FrameKind,
}

impl NamedFrame {
    pub fn new(name: impl Into<String>, kind: FrameKind) -> Self {
        NamedFrame { name: name.into(), kind }
    }

    /// `a → b → c`, outermost first.
    pub fn joined(frames: &[NamedFrame]) -> String {
        frames.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(" → ")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum FrameKind {
    Python,
    #[default]
    Native,
    Kernel,
    CudaApi,
    GpuKernel,
    /// A thread of a process (`thread:NAME` in the agent's series).
    Thread,
    Marker,
}

/// The colour of one frame: its kind's base, varied by name so that neighbours stay apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl FrameKind {
    /// The kinds a flame graph's legend names, in its order.
    pub const LEGEND: [FrameKind; 5] = [FrameKind::Python, FrameKind::Native, FrameKind::Kernel, FrameKind::CudaApi, FrameKind::GpuKernel];

    /// Of a frame known only by its name, as folded lines write it (kernel frames marked
    /// ` [k]` or `_[k]`): the profiles read from files.
    pub fn guess(frame: &str) -> FrameKind {
        if frame.ends_with(" [k]") || frame.ends_with("_[k]") {
            FrameKind::Kernel
        } else if frame.starts_with("[gpu] ") {
            FrameKind::GpuKernel
        } else if frame == "[unknown python]" || (frame.ends_with(')') && (frame.contains(".py:") || frame.ends_with(".py)") || frame.contains("(<frozen "))) {
            FrameKind::Python
        } else if frame.starts_with("thread:") {
            FrameKind::Thread
        } else if frame.starts_with('[') {
            FrameKind::Marker
        } else if is_cuda_call(frame) {
            FrameKind::CudaApi
        } else {
            FrameKind::Native
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Python => "Python",
            FrameKind::Native => "native",
            FrameKind::Kernel => "kernel",
            FrameKind::CudaApi => "CUDA API",
            FrameKind::GpuKernel => "GPU kernel",
            FrameKind::Thread => "thread",
            FrameKind::Marker => "marker",
        }
    }

    /// A base colour per kind. Threads are drawn as markers: both are gpuflame's labels, not code.
    pub fn base(self) -> Rgb {
        match self {
            FrameKind::Python => Rgb(96, 160, 220),
            FrameKind::Native => Rgb(232, 130, 60),
            FrameKind::Kernel => Rgb(180, 180, 120),
            FrameKind::CudaApi => Rgb(90, 190, 100),
            FrameKind::GpuKernel => Rgb(170, 110, 210),
            FrameKind::Thread | FrameKind::Marker => Rgb(200, 200, 200),
        }
    }

    pub fn color(self, frame: &str) -> Rgb {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        frame.hash(&mut h);
        let v = (h.finish() % 41) as i16 - 20;
        let Rgb(r, g, b) = self.base();
        let shift = |c: u8| (c as i16 + v).clamp(0, 255) as u8;
        Rgb(shift(r), shift(g), shift(b))
    }
}

/// `cudaMalloc`, `cuLaunchKernel`: the runtime's and the driver's names.
fn is_cuda_call(name: &str) -> bool {
    name.starts_with("cuda") || name.strip_prefix("cu").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_uppercase()))
}

#[cfg(test)]
mod tests {
    use super::FrameKind;

    #[test]
    fn names_read_back_from_files_are_guessed() {
        assert_eq!(FrameKind::guess("ksys_read [k]"), FrameKind::Kernel);
        assert_eq!(FrameKind::guess("[gpu] gemm"), FrameKind::GpuKernel);
        assert_eq!(FrameKind::guess("step (nn.py:41)"), FrameKind::Python);
        assert_eq!(FrameKind::guess("[truncated]"), FrameKind::Marker);
        assert_eq!(FrameKind::guess("thread:loader"), FrameKind::Thread);
        assert_eq!(FrameKind::guess("cuLaunchKernel"), FrameKind::CudaApi);
        assert_eq!(FrameKind::guess("custom_op"), FrameKind::Native);
    }
}
