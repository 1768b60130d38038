//! What a written profile says besides its samples, for the writers that draw it.

/// How finely Python frames are told apart in folded stacks and flame graphs; pprof always has
/// the function and the line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Detail {
    /// One frame per function, `step (train.py)`: where the time goes by function, as perf,
    /// pprof and Pyroscope draw it.
    #[default]
    Functions,
    /// One frame per line, `step (train.py:41)`, as py-spy draws it.
    Lines,
}

/// What a written profile says besides its samples.
#[derive(Debug, Clone, Copy)]
pub struct Rendering<'a> {
    /// The flame graph's title.
    pub title: &'a str,
    pub detail: Detail,
}
