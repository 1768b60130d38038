//! The profiles made by hooks of their own (`bpf/src/bpf/stack_hooks.h`): each hook sends stacks
//! with what they weigh, tagged with the profile it was attached for; the values are summed per
//! stack. One source for all of them: a profile of this kind needs its BPF program and its
//! descriptor (`profile_kind.rs`: the program, its tracepoint, its sample type), no code here.

use std::collections::HashMap;

use super::source::{Closed, Input, Source, WindowInfo};
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, Stacks};

pub struct HookedStacks {
    /// Per profile (by its origin, [`ProfileKind::origin`]): the values summed per stack.
    values: HashMap<u64, (ProfileKind, HashMap<StackKey, i64>)>,
}

impl HookedStacks {
    pub fn new(kinds: impl IntoIterator<Item = ProfileKind>) -> Self {
        HookedStacks { values: kinds.into_iter().map(|k| (k.origin(), (k, HashMap::new()))).collect() }
    }
}

impl Source for HookedStacks {
    fn add(&mut self, input: &Input<'_>, _: &mut Stacks) {
        let Input::HookedStack { record, stack } = input else { return };
        let Some((_, values)) = self.values.get_mut(&record.origin) else { return };
        let value = i64::try_from(record.value).unwrap_or(i64::MAX);
        match values.get_mut(*stack) {
            Some(v) => *v = v.saturating_add(value),
            None => {
                values.insert((*stack).clone(), value);
            }
        }
    }

    fn close(&mut self, _: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let mut closed: Vec<Closed> = self
            .values
            .values_mut()
            .map(|(kind, values)| Closed::new(*kind, std::mem::take(values).into_iter().map(|(k, v)| (k, None, vec![v])).collect()))
            .collect();
        closed.sort_by_key(|c| c.kind);
        closed
    }
}
