//! Folded lines as flame graphs draw them: kernel frames marked ` [k]` so that inferno keeps the
//! mark, stacks deeper than [`MAX_DEPTH`] collapsed in the middle so that a deep import does not
//! make a picture thousands of pixels tall; put in inferno's order and cut to what it draws
//! (`visible.rs`), each line made as text only when it is read.

use inferno::flamegraph::{self, Options};

pub use super::fold::NameSeq;
use super::frame_names::{FrameNames, Tail};
use super::visible;

/// Frames drawn per stack at most: the root side and the leaf side of deeper stacks are kept.
pub const MAX_DEPTH: usize = 64;
/// Of those, frames kept on the root side.
const ROOT_SIDE: usize = 16;
/// Those kept on the leaf side.
const LEAF_SIDE: usize = MAX_DEPTH - ROOT_SIDE - 1;

pub(super) const COLLAPSED: &str = "[… deep stack: middle frames collapsed]";

/// The names frames are drawn with, by folded name.
pub struct Drawn {
    pub names: FrameNames,
    /// Each folded name's drawn name.
    of: Vec<u32>,
    /// Each folded name's drawn name with its leading whitespace trimmed, as inferno trims the
    /// lines it reads, for a line's first frame.
    first_of: Vec<u32>,
    collapsed: u32,
}

impl Drawn {
    pub fn new(folded: &FrameNames) -> Self {
        let mut names = FrameNames::default();
        let of: Vec<u32> = (0..folded.len() as u32)
            .map(|id| {
                let name = folded.get(id);
                names.id_owned(name.strip_suffix("_[k]").map_or_else(|| name.to_string(), |k| format!("{k} [k]")))
            })
            .collect();
        let first_of = of.iter().map(|&d| names.id_owned(names.get(d).trim_start().to_string())).collect();
        let collapsed = names.id(COLLAPSED);
        Drawn { names, of, first_of, collapsed }
    }

    /// The drawn names of a line, the first one trimmed when `trimmed`.
    pub fn ids<'a>(&'a self, seq: NameSeq<'a>, trimmed: bool) -> impl Iterator<Item = u32> + 'a {
        let n = seq.len();
        let drawn = n.min(MAX_DEPTH);
        (0..drawn).map(move |k| {
            let folded = match k {
                _ if n <= MAX_DEPTH => seq.get(k),
                k if k < ROOT_SIDE => seq.get(k),
                ROOT_SIDE => return self.collapsed,
                k => seq.get(n - LEAF_SIDE + (k - ROOT_SIDE - 1)),
            };
            let table = if k == 0 && trimmed { &self.first_of } else { &self.of };
            table.get(folded as usize).copied().unwrap_or(self.collapsed)
        })
    }

    /// Line `seq` with `counts` as inferno reads it, appended to `out`.
    fn text(&self, seq: NameSeq<'_>, counts: &[i64], out: &mut String) {
        for (k, id) in self.ids(seq, true).enumerate() {
            if k > 0 {
                out.push(';');
            }
            out.push_str(self.names.get(id));
        }
        // Tails are ASCII.
        out.push_str(std::str::from_utf8(Tail::counts(counts).as_bytes()).unwrap_or_default());
    }
}

/// Draws the `n` lines `line(i)` gives (names and counts: the count, or the base and the new
/// count) with inferno into `svg`. inferno is given them in its order, and only what it draws.
pub fn draw<'a, L>(drawn: &'a Drawn, n: usize, line: L, options: &mut Options<'_>, svg: &mut Vec<u8>) -> std::io::Result<()>
where
    L: Fn(usize) -> (NameSeq<'a>, [i64; 2], usize),
{
    let mut order: Vec<u32> = (0..n as u32).collect();
    let tail = |i: u32| {
        let (_, counts, k) = line(i as usize);
        move || Tail::counts(&counts[..k])
    };
    order.sort_unstable_by(|&a, &b| drawn.names.cmp_lines(drawn.ids(line(a as usize).0, true), tail(a), drawn.ids(line(b as usize).0, true), tail(b)));
    let kept = visible::lines(n, options.min_width, |i, out| {
        let (seq, counts, k) = line(order[i] as usize);
        drawn.text(seq, &counts[..k], out);
    });
    drop(order);
    flamegraph::from_lines(options, kept.iter().map(String::as_str), svg).map_err(std::io::Error::other)
}
