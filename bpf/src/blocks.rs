//! Ranges of the `page_index` array handed out to tables: first fit, coalescing on free.

#[derive(Debug, Clone)]
pub(crate) struct BlockAllocator {
    /// Free ranges (start, len), sorted by start, never adjacent.
    free: Vec<(u32, u32)>,
}

impl BlockAllocator {
    pub(crate) fn new(capacity: u32) -> Self {
        BlockAllocator { free: if capacity > 0 { vec![(0, capacity)] } else { Vec::new() } }
    }

    pub(crate) fn alloc(&mut self, len: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    pub(crate) fn release(&mut self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    #[cfg(test)]
    fn free_blocks(&self) -> u32 {
        self.free.iter().map(|&(_, l)| l).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_releases_and_coalesces() {
        let mut a = BlockAllocator::new(10);
        let x = a.alloc(4).unwrap();
        let y = a.alloc(4).unwrap();
        assert_eq!((x, y), (0, 4));
        assert!(a.alloc(3).is_none());
        a.release(x, 4);
        assert_eq!(a.alloc(3), Some(0));
        a.release(0, 3);
        a.release(y, 4);
        assert_eq!(a.free_blocks(), 10);
        assert_eq!(a.alloc(10), Some(0));
    }
}
