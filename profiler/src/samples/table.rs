//! The [`Samples`] of a profile as writers read them, and the flat [`SampleTable`] of profiles
//! read from files.

use super::ids::{Ids, Stack};
use crate::profile::{Labels, Profile, Sample};

/// The samples of a profile, by index.
pub trait Samples {
    fn len(&self) -> usize;
    /// Location indices, root first.
    fn stack(&self, i: usize) -> Stack<'_>;
    /// One value per sample type.
    fn values(&self, i: usize) -> &[i64];
    fn labels(&self, i: usize) -> &Labels;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of the first sample type, the one flame graphs and folded stacks show.
    fn value(&self, i: usize) -> i64 {
        self.values(i).first().copied().unwrap_or(0)
    }
}

impl Samples for Vec<Sample> {
    fn len(&self) -> usize {
        <[Sample]>::len(self)
    }

    fn stack(&self, i: usize) -> Stack<'_> {
        Stack::Full(&self[i].stack)
    }

    fn values(&self, i: usize) -> &[i64] {
        &self[i].values
    }

    fn labels(&self, i: usize) -> &Labels {
        &self[i].labels
    }
}

/// Samples stored flat (see the module's documentation), in the order a
/// [`crate::profile::ProfileBuilder`] gives them: by stack, then labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SampleTable {
    pub(super) frames: Ids,
    /// Where each sample's stack starts in `frames`, and its length.
    pub(super) starts: Vec<usize>,
    pub(super) lens: Vec<u32>,
    /// Values per sample: the profile's number of sample types.
    pub(super) width: usize,
    pub(super) values: Vec<i64>,
    /// Each sample's index into `label_sets`.
    pub(super) labels: Vec<u32>,
    pub(super) label_sets: Vec<Labels>,
}

/// A profile as `convert` and `diff` hold it.
pub type FlatProfile = Profile<SampleTable>;

impl SampleTable {
    /// The stacks: every sample's location indices, where each sample's start, and how many.
    pub fn into_stacks(self) -> (Ids, Vec<usize>, Vec<u32>) {
        (self.frames, self.starts, self.lens)
    }
}

impl Samples for SampleTable {
    fn len(&self) -> usize {
        self.starts.len()
    }

    fn stack(&self, i: usize) -> Stack<'_> {
        let start = self.starts[i];
        self.frames.slice(start..start + self.lens[i] as usize)
    }

    fn values(&self, i: usize) -> &[i64] {
        &self.values[i * self.width..(i + 1) * self.width]
    }

    fn labels(&self, i: usize) -> &Labels {
        &self.label_sets[self.labels[i] as usize]
    }
}

