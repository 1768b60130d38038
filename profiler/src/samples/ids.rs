//! Sequences of small indices (locations of stacks, names of folded lines) stored one after
//! another as narrowly as they allow: two bytes an index while every index fits, four after.
//! A profile of a million stacks of 30 frames is 60 MB of indices this way, 240 MB as `usize`.

use std::cmp::Ordering;
use std::ops::Range;

/// Indices, all in one vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ids {
    /// Every index below 65,536: the usual case (a profile's distinct frames number thousands).
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
}

impl Default for Ids {
    fn default() -> Self {
        Ids::Narrow(Vec::new())
    }
}

impl Ids {
    pub fn push(&mut self, id: u32) {
        match self {
            Ids::Narrow(v) => match u16::try_from(id) {
                Ok(id) => v.push(id),
                Err(_) => {
                    // The first index that does not fit: all are widened, once.
                    let mut wide = Vec::with_capacity(v.capacity().max(v.len() + 1));
                    wide.extend(v.iter().map(|&i| u32::from(i)));
                    wide.push(id);
                    *self = Ids::Wide(wide);
                }
            },
            Ids::Wide(v) => v.push(id),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Ids::Narrow(v) => v.len(),
            Ids::Wide(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn truncate(&mut self, len: usize) {
        match self {
            Ids::Narrow(v) => v.truncate(len),
            Ids::Wide(v) => v.truncate(len),
        }
    }

    pub fn shrink_to_fit(&mut self) {
        match self {
            Ids::Narrow(v) => v.shrink_to_fit(),
            Ids::Wide(v) => v.shrink_to_fit(),
        }
    }

    /// Each index replaced by `f` of it, where it lies (widened first if `f` gives one that does
    /// not fit).
    pub fn map_in_place(&mut self, f: impl Fn(u32) -> u32) {
        if let Ids::Narrow(v) = self {
            if v.iter().any(|&i| u16::try_from(f(u32::from(i))).is_err()) {
                *self = Ids::Wide(v.iter().map(|&i| u32::from(i)).collect());
            }
        }
        match self {
            // Every index fits: checked above.
            Ids::Narrow(v) => v.iter_mut().for_each(|i| *i = u16::try_from(f(u32::from(*i))).unwrap_or(u16::MAX)),
            Ids::Wide(v) => v.iter_mut().for_each(|i| *i = f(*i)),
        }
    }

    /// The indices in `range`, which must lie within.
    pub fn slice(&self, range: Range<usize>) -> Stack<'_> {
        match self {
            Ids::Narrow(v) => Stack::Narrow(&v[range]),
            Ids::Wide(v) => Stack::Wide(&v[range]),
        }
    }
}

/// A run of indices, however they are stored: a stack of location indices, root first, or the
/// name indices of a folded line.
#[derive(Debug, Clone, Copy)]
pub enum Stack<'a> {
    Narrow(&'a [u16]),
    Wide(&'a [u32]),
    /// A [`crate::profile::Sample`]'s own stack.
    Full(&'a [usize]),
}

impl<'a> Stack<'a> {
    pub fn len(&self) -> usize {
        match self {
            Stack::Narrow(s) => s.len(),
            Stack::Wide(s) => s.len(),
            Stack::Full(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<usize> {
        match self {
            Stack::Narrow(s) => s.get(i).map(|&x| usize::from(x)),
            Stack::Wide(s) => s.get(i).map(|&x| x as usize),
            Stack::Full(s) => s.get(i).copied(),
        }
    }

    pub fn first(&self) -> Option<usize> {
        self.get(0)
    }

    pub fn last(&self) -> Option<usize> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    pub fn iter(&self) -> StackIter<'a> {
        match *self {
            Stack::Narrow(s) => StackIter::Narrow(s.iter()),
            Stack::Wide(s) => StackIter::Wide(s.iter()),
            Stack::Full(s) => StackIter::Full(s.iter()),
        }
    }

    /// Index by index, as `Vec<usize>` compares: the order samples are kept in.
    pub fn cmp_ids(&self, other: &Stack<'_>) -> Ordering {
        match (self, other) {
            (Stack::Narrow(a), Stack::Narrow(b)) => a.cmp(b),
            (Stack::Wide(a), Stack::Wide(b)) => a.cmp(b),
            _ => self.iter().cmp(other.iter()),
        }
    }

    pub fn eq_ids(&self, other: &Stack<'_>) -> bool {
        match (self, other) {
            (Stack::Narrow(a), Stack::Narrow(b)) => a == b,
            (Stack::Wide(a), Stack::Wide(b)) => a == b,
            _ => self.len() == other.len() && self.iter().eq(other.iter()),
        }
    }
}

/// The indices of a [`Stack`], as `usize`.
#[derive(Debug, Clone)]
pub enum StackIter<'a> {
    Narrow(std::slice::Iter<'a, u16>),
    Wide(std::slice::Iter<'a, u32>),
    Full(std::slice::Iter<'a, usize>),
}

impl Iterator for StackIter<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            StackIter::Narrow(i) => i.next().map(|&x| usize::from(x)),
            StackIter::Wide(i) => i.next().map(|&x| x as usize),
            StackIter::Full(i) => i.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self {
            StackIter::Narrow(i) => i.len(),
            StackIter::Wide(i) => i.len(),
            StackIter::Full(i) => i.len(),
        };
        (n, Some(n))
    }
}

impl DoubleEndedIterator for StackIter<'_> {
    fn next_back(&mut self) -> Option<usize> {
        match self {
            StackIter::Narrow(i) => i.next_back().map(|&x| usize::from(x)),
            StackIter::Wide(i) => i.next_back().map(|&x| x as usize),
            StackIter::Full(i) => i.next_back().copied(),
        }
    }
}

impl ExactSizeIterator for StackIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_until_an_index_does_not_fit() {
        let mut ids = Ids::default();
        for i in [1, 2, 65_535] {
            ids.push(i);
        }
        assert!(matches!(ids, Ids::Narrow(_)));
        ids.push(65_536);
        assert!(matches!(ids, Ids::Wide(_)));
        assert_eq!(ids.slice(0..4).iter().collect::<Vec<_>>(), [1, 2, 65_535, 65_536]);
        ids.truncate(1);
        assert_eq!(ids.len(), 1);
        let mut ids = Ids::default();
        [1, 2].into_iter().for_each(|i| ids.push(i));
        ids.map_in_place(|i| i * 10);
        assert_eq!(ids, Ids::Narrow(vec![10, 20]));
        ids.map_in_place(|i| i * 10_000);
        assert_eq!(ids, Ids::Wide(vec![100_000, 200_000]));
    }

    #[test]
    fn stacks_compare_as_their_indices_whatever_their_width() {
        let narrow = [1u16, 300];
        let wide = [1u32, 70_000];
        let full = [1usize, 300];
        assert_eq!(Stack::Narrow(&narrow).cmp_ids(&Stack::Wide(&wide)), Ordering::Less);
        assert!(Stack::Narrow(&narrow).eq_ids(&Stack::Full(&full)));
        assert_eq!(Stack::Full(&full).last(), Some(300));
        assert_eq!(Stack::Wide(&wide).iter().rev().collect::<Vec<_>>(), [70_000, 1]);
    }
}
