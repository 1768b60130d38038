//! Builds a [`SampleTable`]: what [`crate::profile::ProfileBuilder`] does for recordings, for
//! profiles read from files. Samples are appended as they come, with nothing hashed by stack, and
//! sorted and summed once at the end; a file rarely repeats a stack, and when it does the
//! repeat's frames stay unused in the table, which the input's size bounds.

use std::collections::HashMap;

use super::table::{FlatProfile, SampleTable, Samples};
use crate::names::sanitize_in_place;
use crate::profile::{Interner, Labels, Location, Mapping};

pub struct TableBuilder {
    interner: Interner,
    table: SampleTable,
    label_ids: HashMap<Labels, u32>,
}

impl TableBuilder {
    /// For samples of `width` values each (the profile's number of sample types).
    pub fn new(width: usize) -> Self {
        TableBuilder { interner: Interner::default(), table: SampleTable { width, ..SampleTable::default() }, label_ids: HashMap::new() }
    }

    pub fn mapping(&mut self, profile: &mut FlatProfile, mapping: Mapping) -> usize {
        self.interner.mapping(profile, mapping)
    }

    pub fn location(&mut self, profile: &mut FlatProfile, location: Location) -> usize {
        self.interner.location(profile, location)
    }

    /// Adds a sample: location indices root first, and one value per sample type (missing ones
    /// are 0). Samples of one stack and labels are summed by [`TableBuilder::finish`].
    pub fn add(&mut self, stack: impl IntoIterator<Item = usize>, mut labels: Labels, values: &[i64]) {
        if let Some(comm) = &mut labels.comm {
            sanitize_in_place(comm);
        }
        let t = &mut self.table;
        let label = match self.label_ids.get(&labels) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(t.label_sets.len()).unwrap_or(u32::MAX);
                t.label_sets.push(labels.clone());
                self.label_ids.insert(labels, id);
                id
            }
        };
        let start = t.frames.len();
        // A location index is below the number of locations, which memory holds far fewer than
        // 2^32 of.
        stack.into_iter().for_each(|l| t.frames.push(u32::try_from(l).unwrap_or(u32::MAX)));
        t.starts.push(start);
        t.lens.push(u32::try_from(t.frames.len() - start).unwrap_or(u32::MAX));
        t.labels.push(label);
        t.values.extend((0..t.width).map(|i| values.get(i).copied().unwrap_or(0)));
    }

    /// Puts the samples into `profile`: sorted by stack, then labels, as a
    /// [`crate::profile::ProfileBuilder`] sorts them, those of one stack and labels summed.
    pub fn finish(self, profile: &mut FlatProfile) {
        let t = self.table;
        // A table holds fewer than 2^32 samples: each is at least a byte of a file of at most
        // MAX_PROFILE_BYTES, or a sample of a recording in memory.
        let mut order: Vec<u32> = (0..t.len() as u32).collect();
        let by_key = |&a: &u32, &b: &u32| {
            let (a, b) = (a as usize, b as usize);
            t.stack(a).cmp_ids(&t.stack(b)).then_with(|| if t.labels[a] == t.labels[b] { std::cmp::Ordering::Equal } else { t.labels(a).cmp(t.labels(b)) })
        };
        order.sort_unstable_by(by_key);
        let mut out = SampleTable { width: t.width, ..SampleTable::default() };
        let mut at = 0;
        while at < order.len() {
            let first = order[at];
            let run = order[at..].iter().take_while(|&&i| by_key(&first, &i).is_eq()).count();
            let f = first as usize;
            out.starts.push(t.starts[f]);
            out.lens.push(t.lens[f]);
            out.labels.push(t.labels[f]);
            let sums = (0..t.width).map(|v| order[at..at + run].iter().map(|&i| t.values[i as usize * t.width + v]).sum::<i64>());
            out.values.extend(sums);
            at += run;
        }
        out.frames = t.frames;
        out.frames.shrink_to_fit();
        out.label_sets = t.label_sets;
        profile.samples = out;
    }
}
