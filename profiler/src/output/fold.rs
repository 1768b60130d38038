//! A profile folded into its lines, `comm;root;…;leaf COUNT`, merged over pid and tid and sorted
//! as text, each line kept as the indices of its frames' names ([`FrameNames`]): the names of a
//! million lines are written once each, not once per line. Folded output, flame graphs and diffs
//! are drawn from these.

use std::collections::HashMap;
use std::io::{self, Write};

use super::frame_names::{FrameNames, Tail};
use super::frame_text::{python_name, sanitize, script_dir};
use super::rendering::Detail;
use crate::frame::FrameKind;
use crate::profile::{Location, Profile, PYTHON_MAPPING};
use crate::samples::{FlatProfile, Ids, Samples, Stack};

/// Kernel frames end with it in folded stacks (the convention of Brendan Gregg's stackcollapse
/// scripts, which inferno colours accordingly).
pub const KERNEL_SUFFIX: &str = "_[k]";

/// The folded lines of a profile, in sorted order, each stack once, none without samples.
#[derive(Debug, Default)]
pub struct FoldedLines {
    /// The names of every sample's line, one after another, in the profile's order; a line's
    /// are where its first sample's are. With `heads`, all but each line's first name.
    frames: Ids,
    starts: Vec<usize>,
    lens: Vec<u32>,
    /// Each sample's first name (its comm), where `frames` holds the rest: the profile's own
    /// stacks with their locations replaced by their names ([`fold_flat`]).
    heads: Option<Vec<u32>>,
    /// The lines, sorted: each one's first sample, and its count.
    lines: Vec<u32>,
    counts: Vec<i64>,
    /// Python frames whose file is shown shortened, with the file's full path.
    pub full_paths: HashMap<String, String>,
    /// What each frame of the lines is, by its name's index (the first location's kind, where two
    /// kinds of frame have one name).
    kinds: Vec<Option<FrameKind>>,
}

/// A folded line's names, as indices into its [`FrameNames`]: `head` then `ids`, the last one
/// replaced where `last` is given (the stacks of a diff are read with their ends trimmed).
#[derive(Debug, Clone, Copy)]
pub struct NameSeq<'a> {
    pub head: Option<u32>,
    pub ids: Stack<'a>,
    pub last: Option<u32>,
}

impl NameSeq<'_> {
    pub fn len(&self) -> usize {
        self.ids.len() + usize::from(self.head.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> u32 {
        match (self.last, self.head) {
            (Some(last), _) if i + 1 == self.len() => last,
            (_, Some(head)) if i == 0 => head,
            (_, head) => self.ids.get(i - usize::from(head.is_some())).map_or(0, |id| id as u32),
        }
    }

    pub fn iter(&self) -> NameIter<'_> {
        NameIter { head: self.head, ids: self.ids.iter(), left: self.ids.len(), last: self.last }
    }
}

/// The names of a [`NameSeq`], in order.
pub struct NameIter<'a> {
    head: Option<u32>,
    ids: crate::samples::StackIter<'a>,
    left: usize,
    last: Option<u32>,
}

impl Iterator for NameIter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if let Some(head) = self.head.take() {
            // A line of its head alone ends with it, or with what replaces it.
            return Some(if self.left == 0 { self.last.unwrap_or(head) } else { head });
        }
        let id = self.ids.next()? as u32;
        self.left -= 1;
        Some(if self.left == 0 { self.last.unwrap_or(id) } else { id })
    }
}

impl FoldedLines {
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Line `i`'s names, comm first.
    pub fn names(&self, i: usize) -> NameSeq<'_> {
        self.sample_names(self.lines[i] as usize)
    }

    fn sample_names(&self, sample: usize) -> NameSeq<'_> {
        let ids = self.frames.slice(self.starts[sample]..self.starts[sample] + self.lens[sample] as usize);
        NameSeq { head: self.heads.as_ref().map(|h| h[sample]), ids, last: None }
    }

    /// Samples for sampled-time profiles, the raw value otherwise.
    pub fn count(&self, i: usize) -> i64 {
        self.counts[i]
    }

    pub fn kind(&self, name: u32) -> Option<FrameKind> {
        self.kinds.get(name as usize).copied().flatten()
    }

    /// Line `i` as text, without its count.
    pub fn stack_text(&self, names: &FrameNames, i: usize, out: &mut String) {
        for (k, id) in self.names(i).iter().enumerate() {
            if k > 0 {
                out.push(';');
            }
            out.push_str(names.get(id));
        }
    }

    pub fn write(&self, names: &FrameNames, mut out: impl Write) -> io::Result<()> {
        let mut line = String::new();
        for i in 0..self.len() {
            line.clear();
            self.stack_text(names, i, &mut line);
            writeln!(out, "{line} {}", self.counts[i])?;
        }
        Ok(())
    }

    /// Sorts the samples' lines as text and merges those of one stack, `counts` being each
    /// sample's; lines without samples are left out.
    fn sort(&mut self, names: &FrameNames, counts: &[i64]) {
        let line = |i: u32| self.sample_names(i as usize);
        let mut order: Vec<u32> = (0..counts.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| names.cmp_lines(line(a).iter(), Tail::none, line(b).iter(), Tail::none));
        let (mut lines, mut merged) = (Vec::new(), Vec::new());
        let mut at = 0;
        while at < order.len() {
            let first = order[at];
            let run = order[at..].iter().take_while(|&&i| names.cmp_lines(line(first).iter(), Tail::none, line(i).iter(), Tail::none).is_eq()).count();
            let n: i64 = order[at..at + run].iter().map(|&i| counts[i as usize]).sum();
            if n > 0 {
                lines.push(first);
                merged.push(n);
            }
            at += run;
        }
        (self.lines, self.counts) = (lines, merged);
    }

    /// The name of comm `comm` (one per process name, "[unknown]" for none), interned once.
    fn comm(&mut self, comm: Option<&str>, names: &mut FrameNames, comms: &mut HashMap<String, u32>) -> u32 {
        // A process may name itself "": an empty first frame would make an unreadable line.
        let comm = comm.filter(|c| !c.is_empty()).unwrap_or("[unknown]");
        if let Some(&id) = comms.get(comm) {
            return id;
        }
        let id = names.id_owned(sanitize(comm));
        comms.insert(comm.to_string(), id);
        // The process's name is no location of the profile: it keeps the colour its name gave
        // it in every flame graph so far.
        self.set_kind(id, || FrameKind::guess(comm));
        id
    }
}

/// Folds `profile`, its names interned in `names` (shared by the two sides of a diff, so that
/// one index is one name in both). Values are sample counts for sampled-time profiles and raw
/// values otherwise.
pub fn fold<S: Samples>(profile: &Profile<S>, detail: Detail, names: &mut FrameNames) -> FoldedLines {
    let samples = &profile.samples;
    let python: Vec<bool> = profile.locations.iter().map(|l| l.mapping.is_some_and(|m| profile.mappings[m].path == PYTHON_MAPPING)).collect();
    // The main script's directory of each process, for the stacks of its other threads too.
    let mut script_dirs: HashMap<Option<u32>, &str> = HashMap::new();
    if python.contains(&true) {
        for i in 0..samples.len() {
            if let Some(dir) = script_dir(profile, &python, samples.stack(i)) {
                script_dirs.entry(samples.labels(i).pid).or_insert(dir);
            }
        }
    }
    let mut out = FoldedLines::default();
    // Each location's names (its inline chain), once per location, or once per location and
    // script directory for Python frames, whose file is shown relative to it.
    let mut cache: Vec<u32> = Vec::new();
    let mut plain: Vec<Option<(usize, usize)>> = vec![None; profile.locations.len()];
    let mut by_dir: HashMap<(usize, Option<&str>), (usize, usize)> = HashMap::new();
    let mut comms: HashMap<String, u32> = HashMap::new();
    out.starts.reserve_exact(samples.len());
    out.lens.reserve_exact(samples.len());
    let mut counts = Vec::with_capacity(samples.len());
    for i in 0..samples.len() {
        let start = out.frames.len();
        let comm = out.comm(samples.labels(i).comm.as_deref(), names, &mut comms);
        out.frames.push(comm);
        let stack = samples.stack(i);
        let dir = if python.contains(&true) { script_dir(profile, &python, stack).or_else(|| script_dirs.get(&samples.labels(i).pid).copied()) } else { None };
        for loc in stack.iter() {
            let range = match (python[loc], plain[loc]) {
                (false, Some(range)) => range,
                (false, None) => *plain[loc].insert(out.location_names(&profile.locations[loc], None, detail, names, &mut cache)),
                (true, _) => match by_dir.get(&(loc, dir)) {
                    Some(&range) => range,
                    None => *by_dir.entry((loc, dir)).or_insert(out.location_names(&profile.locations[loc], Some(dir), detail, names, &mut cache)),
                },
            };
            cache[range.0..range.1].iter().for_each(|&id| out.frames.push(id));
        }
        out.starts.push(start);
        out.lens.push(u32::try_from(out.frames.len() - start).unwrap_or(u32::MAX));
        counts.push(profile.sample_count(samples.value(i)));
    }
    out.frames.shrink_to_fit();
    out.sort(names, &counts);
    out
}

/// [`fold`] of a profile that is not needed afterwards, and what is left of it (see
/// [`Profile::without_samples`]). Where every location is one name (no inlined functions, no
/// Python frames, whose names depend on the stack), the lines are the profile's own stacks, each
/// location replaced by its name where it lies: no second copy of the stacks is made.
pub fn fold_flat(profile: FlatProfile, detail: Detail, names: &mut FrameNames) -> (FoldedLines, Profile<()>) {
    let python = |l: &Location| l.mapping.is_some_and(|m| profile.mappings[m].path == PYTHON_MAPPING);
    if profile.locations.iter().any(|l| l.lines.len() != 1 || python(l)) {
        let folded = fold(&profile, detail, names);
        return (folded, profile.without_samples());
    }
    let samples = &profile.samples;
    let mut out = FoldedLines::default();
    let (mut cache, mut comms) = (Vec::new(), HashMap::new());
    let mut name_of: Vec<Option<u32>> = vec![None; profile.locations.len()];
    let (mut heads, mut counts) = (Vec::with_capacity(samples.len()), Vec::with_capacity(samples.len()));
    // Names are made in the order fold makes them, for the first location of each name to give
    // its kind.
    for i in 0..samples.len() {
        heads.push(out.comm(samples.labels(i).comm.as_deref(), names, &mut comms));
        for loc in samples.stack(i).iter() {
            if name_of[loc].is_none() {
                let (at, _) = out.location_names(&profile.locations[loc], None, detail, names, &mut cache);
                name_of[loc] = Some(cache[at]);
            }
        }
        counts.push(profile.sample_count(samples.value(i)));
    }
    let header = profile.without_samples();
    let (mut frames, starts, lens) = profile.samples.into_stacks();
    // Every location a stack holds has been named; those only repeated samples held are unused.
    frames.map_in_place(|loc| name_of.get(loc as usize).copied().flatten().unwrap_or(0));
    (out.frames, out.starts, out.lens, out.heads) = (frames, starts, lens, Some(heads));
    out.sort(names, &counts);
    (out, header)
}

impl FoldedLines {
    fn set_kind(&mut self, name: u32, kind: impl FnOnce() -> FrameKind) {
        let at = name as usize;
        if self.kinds.len() <= at {
            self.kinds.resize(at + 1, None);
        }
        self.kinds[at].get_or_insert_with(kind);
    }

    /// Interns the names of `location`'s inline chain into `cache`, and gives their range there.
    /// `dir` is the script directory of the stack, for Python frames.
    fn location_names(&mut self, location: &Location, dir: Option<Option<&str>>, detail: Detail, names: &mut FrameNames, cache: &mut Vec<u32>) -> (usize, usize) {
        let start = cache.len();
        for line in &location.lines {
            let mut name = match dir {
                Some(script_dir) => {
                    let (name, full) = python_name(line, script_dir, detail);
                    if let Some(full) = full {
                        self.full_paths.entry(name.clone()).or_insert_with(|| full.to_string());
                    }
                    name
                }
                None => sanitize(&line.function),
            };
            // Marked as folded text marks the kernel's frames, unless read from folded text that
            // marked it perf's way (` [k]`, kept in its name).
            if location.kind == FrameKind::Kernel && !name.ends_with(" [k]") {
                name.push_str(KERNEL_SUFFIX);
            }
            let id = names.id_owned(name);
            self.set_kind(id, || location.kind);
            cache.push(id);
        }
        (start, cache.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Labels, Line, Mapping, ProfileBuilder, KERNEL_MAPPING};

    fn text(folded: &FoldedLines, names: &FrameNames) -> String {
        let mut out = Vec::new();
        folded.write(names, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// A profile's own stacks, named where they lie, fold to what a copy folds to: lines, counts
    /// and the kind of each name (the first location's, where two kinds share a name).
    #[test]
    fn folding_in_place_gives_the_lines_of_folding_a_copy() {
        let mut profile = Profile::cpu(100);
        let mut b = ProfileBuilder::default();
        let k = b.mapping(&mut profile, Mapping { path: KERNEL_MAPPING.into(), build_id: None });
        let mut loc = |name: &str, kind, kernel: bool| {
            let location = Location { mapping: kernel.then_some(k), address: 0, kind, lines: vec![Line::function(name)] };
            b.location(&mut profile, location)
        };
        let (main, step, read, python) = (loc("main", FrameKind::Native, false), loc("step", FrameKind::Native, false), loc("ksys_read", FrameKind::Kernel, true), loc("python3", FrameKind::Marker, false));
        let labels = |pid, comm: &str| Labels { pid: Some(pid), comm: Some(comm.into()), ..Default::default() };
        for (stack, pid, comm, n) in [(vec![main, step], 1, "python3", 3), (vec![main, read], 2, "python3", 2), (vec![python, step], 3, "x;y", 1), (vec![main, step], 4, "python3", 4), (vec![], 5, "", 1)] {
            b.add(stack, labels(pid, comm), n * profile.period);
        }
        b.finish(&mut profile);
        let flat = profile.flatten();
        let (mut copied, mut in_place) = (FrameNames::default(), FrameNames::default());
        let by_copy = fold(&flat, Detail::Functions, &mut copied);
        let (named, header) = fold_flat(flat, Detail::Functions, &mut in_place);
        assert!(named.heads.is_some(), "folded in place");
        assert_eq!(text(&named, &in_place), "[unknown] 1\npython3;main;ksys_read_[k] 2\npython3;main;step 7\nx:y;python3;step 1\n");
        assert_eq!(text(&named, &in_place), text(&by_copy, &copied));
        for name in ["python3", "main", "ksys_read_[k]", "x:y"] {
            let kind = |names: &FrameNames, f: &FoldedLines| names.lookup(name).and_then(|id| f.kind(id));
            assert_eq!(kind(&in_place, &named), kind(&copied, &by_copy), "{name}");
        }
        assert_eq!(header.period, profile.period);
    }
}
