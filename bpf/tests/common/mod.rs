//! What the loaded tests share.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Burns CPU on this thread for `d`: samples land in it.
pub fn spin(d: Duration) -> u64 {
    let start = Instant::now();
    let mut x = 1u64;
    while start.elapsed() < d {
        for _ in 0..10_000 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

