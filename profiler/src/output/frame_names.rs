//! The names of the frames of folded lines, each once, and the order of lines made of them: a
//! line is kept as the indices of its names, and compared as the text it stands for, byte by
//! byte, without that text being made.

use std::cmp::Ordering;
use std::collections::HashMap;

/// Frame names by index.
#[derive(Debug, Default)]
pub struct FrameNames {
    names: Vec<String>,
    index: HashMap<String, u32>,
}

impl FrameNames {
    pub fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.index.get(name) {
            return id;
        }
        self.insert(name.to_string())
    }

    pub fn id_owned(&mut self, name: String) -> u32 {
        match self.index.get(&name) {
            Some(&id) => id,
            None => self.insert(name),
        }
    }

    fn insert(&mut self, name: String) -> u32 {
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.index.insert(name.clone(), id);
        self.names.push(name);
        id
    }

    /// A name's index, if it has one.
    pub fn lookup(&self, name: &str) -> Option<u32> {
        self.index.get(name).copied()
    }

    pub fn get(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// How two lines compare as the strings they stand for: their names joined by `;`, then
    /// `tail_a` and `tail_b` (a line's counts, or nothing). Equal leading names are passed over
    /// by index; the bytes are compared from the first that differ.
    pub fn cmp_lines<A, B, TA, TB>(&self, a: A, tail_a: TA, b: B, tail_b: TB) -> Ordering
    where
        A: Iterator<Item = u32>,
        B: Iterator<Item = u32>,
        TA: FnOnce() -> Tail,
        TB: FnOnce() -> Tail,
    {
        let (mut a, mut b) = (a, b);
        let mut after_first = false;
        loop {
            match (a.next(), b.next()) {
                (Some(x), Some(y)) if x == y => after_first = true,
                (x, y) => {
                    let rest_a = self.bytes(x.into_iter().chain(a), after_first, tail_a);
                    let rest_b = self.bytes(y.into_iter().chain(b), after_first, tail_b);
                    return rest_a.cmp(rest_b);
                }
            }
        }
    }

    /// The bytes of `ids` joined by `;` (after a `;` when they follow names already passed), then
    /// the tail, made only if the comparison gets that far.
    fn bytes<'a>(&'a self, ids: impl Iterator<Item = u32> + 'a, after_first: bool, tail: impl FnOnce() -> Tail + 'a) -> impl Iterator<Item = u8> + 'a {
        ids.enumerate()
            .flat_map(move |(i, id)| {
                let sep: &[u8] = if i > 0 || after_first { b";" } else { b"" };
                sep.iter().chain(self.get(id).as_bytes()).copied()
            })
            .chain(std::iter::once_with(tail).flatten())
    }
}

/// What follows a line's names in its text: ` COUNT`, ` BASE NEW`, or nothing.
pub struct Tail {
    bytes: [u8; 42],
    len: usize,
}

impl Tail {
    pub fn none() -> Self {
        Tail { bytes: [0; 42], len: 0 }
    }

    /// ` N` for each count.
    pub fn counts(counts: &[i64]) -> Self {
        use std::io::Write;
        let mut tail = Tail::none();
        let mut at = &mut tail.bytes[..];
        for n in counts.iter().take(2) {
            // 1 + 20 bytes a count: the buffer holds two.
            let _ = write!(at, " {n}");
        }
        let left = at.len();
        tail.len = 42 - left;
        tail
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl IntoIterator for Tail {
    type Item = u8;
    type IntoIter = std::iter::Take<std::array::IntoIter<u8, 42>>;

    fn into_iter(self) -> Self::IntoIter {
        self.bytes.into_iter().take(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as text, and as names: the orders agree, names that are prefixes of others and
    /// characters below `;` included.
    #[test]
    fn lines_order_as_their_text() {
        let lines: &[(&[&str], &[i64])] = &[
            (&["a", "b"], &[5]),
            (&["a", "b 12"], &[3]),
            (&["a", "b1"], &[1]),
            (&["a", "b", "c"], &[2]),
            (&["a", "b(x)"], &[2]),
            (&["a"], &[7]),
            (&["ab"], &[7]),
            (&["a", "b"], &[40]),
            (&["a", "b"], &[4, 10]),
            (&["a:", "b"], &[1]),
        ];
        let mut names = FrameNames::default();
        let ids: Vec<Vec<u32>> = lines.iter().map(|(l, _)| l.iter().map(|n| names.id(n)).collect()).collect();
        let text = |i: usize| format!("{}{}", lines[i].0.join(";"), lines[i].1.iter().map(|n| format!(" {n}")).collect::<String>());
        for i in 0..lines.len() {
            for j in 0..lines.len() {
                let by_names = names.cmp_lines(ids[i].iter().copied(), || Tail::counts(lines[i].1), ids[j].iter().copied(), || Tail::counts(lines[j].1));
                assert_eq!(by_names, text(i).cmp(&text(j)), "{} against {}", text(i), text(j));
                let stacks = names.cmp_lines(ids[i].iter().copied(), Tail::none, ids[j].iter().copied(), Tail::none);
                assert_eq!(stacks, lines[i].0.join(";").cmp(&lines[j].0.join(";")));
            }
        }
    }
}
