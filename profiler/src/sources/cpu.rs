//! CPU time: each sample is one period of the sampling frequency.

use std::collections::HashMap;

use super::source::{Closed, Input, Source, WindowInfo};
use crate::profile::sampling_period;
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, StackValues, Stacks};

#[derive(Default)]
pub struct Cpu {
    counts: SampleCounts,
}

/// Samples per stack, as CPU time.
#[derive(Default)]
pub(super) struct SampleCounts(HashMap<StackKey, u64>);

impl SampleCounts {
    pub(super) fn add(&mut self, stack: &StackKey) {
        match self.0.get_mut(stack) {
            Some(n) => *n += 1,
            None => {
                self.0.insert(stack.clone(), 1);
            }
        }
    }

    /// Nanoseconds per stack (samples × period); the counts start again from zero.
    pub(super) fn take(&mut self, frequency_hz: u64) -> StackValues {
        let period = sampling_period(frequency_hz);
        std::mem::take(&mut self.0).into_iter().map(|(k, n)| (k, None, vec![n as i64 * period])).collect()
    }
}

impl Source for Cpu {
    fn add(&mut self, input: &Input<'_>, _: &mut Stacks) {
        if let Input::Sample { stack, .. } = input {
            self.counts.add(stack);
        }
    }

    fn close(&mut self, window: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        vec![Closed::new(ProfileKind::Cpu, self.counts.take(window.frequency_hz))]
    }
}
