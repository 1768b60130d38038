//! Samples as writers read them, however they are held: a recording's `Vec<Sample>`, or a
//! [`SampleTable`], which keeps a profile read from a file (`convert`, `diff`) at a few bytes a
//! frame: every stack's location indices in one [`Ids`] vector, values and labels in flat
//! vectors beside it, each distinct set of labels once. A million stacks of 30 frames take 76 MB
//! so, against 400 MB as `Sample`s (a `Vec<usize>` per stack, a `Vec<i64>` and a `String` per
//! sample).

mod builder;
mod flat;
mod ids;
mod table;

pub use builder::TableBuilder;
pub use ids::{Ids, Stack, StackIter};
pub use table::{FlatProfile, SampleTable, Samples};
