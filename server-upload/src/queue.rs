//! The queue between profiling and upload: bounded in bytes, dropping the oldest window (counted)
//! when a new one does not fit, optionally spooled to disk.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::spool;

/// One window's push request, encoded.
#[derive(Debug, Clone)]
pub struct PushItem {
    /// Monotonic per agent run; also the file name when spooled.
    pub seq: u64,
    pub body: Vec<u8>,
    /// Where this item is spooled, removed once it is delivered.
    pub spool_file: Option<PathBuf>,
}

/// Counters shared with the metrics endpoint.
#[derive(Debug, Default)]
pub struct QueueStats {
    pub pushed: AtomicU64,
    pub failed: AtomicU64,
    pub dropped: AtomicU64,
    pub retries: AtomicU64,
    pub bytes: AtomicU64,
    pub max_bytes_seen: AtomicU64,
}

struct Inner {
    items: VecDeque<PushItem>,
    bytes: u64,
}

/// A FIFO of push requests holding at most `capacity` bytes.
pub struct Queue {
    inner: Mutex<Inner>,
    capacity: u64,
    pub notify: Notify,
    pub stats: Arc<QueueStats>,
}

impl Queue {
    pub fn new(capacity: u64) -> Self {
        Queue { inner: Mutex::new(Inner { items: VecDeque::new(), bytes: 0 }), capacity, notify: Notify::new(), stats: Arc::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere must not stop delivery; the data is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an item, dropping the oldest ones that keep it from fitting (and the item itself
    /// if it alone is larger than the bound). Returns how many items were dropped.
    pub fn push(&self, item: PushItem) -> u64 {
        let size = item.body.len() as u64;
        let mut dropped = 0;
        {
            let mut q = self.lock();
            if size > self.capacity {
                dropped = 1;
                drop_spool(&item);
            } else {
                while q.bytes + size > self.capacity {
                    let Some(old) = q.items.pop_front() else { break };
                    q.bytes -= old.body.len() as u64;
                    drop_spool(&old);
                    dropped += 1;
                }
                q.bytes += size;
                q.items.push_back(item);
            }
            self.stats.bytes.store(q.bytes, Ordering::Relaxed);
            self.stats.max_bytes_seen.fetch_max(q.bytes, Ordering::Relaxed);
        }
        if dropped > 0 {
            self.stats.dropped.fetch_add(dropped, Ordering::Relaxed);
            tracing::warn!(dropped, capacity = self.capacity, "queue full: dropped the oldest profiles");
        }
        self.notify.notify_one();
        dropped
    }

    /// The oldest item, left in the queue until [`Queue::complete`].
    pub fn front(&self) -> Option<PushItem> {
        self.lock().items.front().cloned()
    }

    /// Removes the item `seq` after it was delivered or given up on. An item the bound pushed
    /// out while it was being sent was counted as dropped; since it did reach its end after all,
    /// that count is taken back, so that pushed + failed + dropped stays exact.
    pub fn complete(&self, seq: u64) {
        let mut q = self.lock();
        match q.items.iter().position(|i| i.seq == seq).and_then(|pos| q.items.remove(pos)) {
            Some(item) => {
                q.bytes -= item.body.len() as u64;
                drop_spool(&item);
            }
            None => {
                self.stats.dropped.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.stats.bytes.store(q.bytes, Ordering::Relaxed);
    }

    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes every queued item to `dir` (for the next run), returning how many were written.
    /// `dir` is one that [`crate::prepare_spool_dir`] checked.
    pub fn spool_to(&self, dir: &Path) -> std::io::Result<usize> {
        spool::create_dir(dir)?;
        let q = self.lock();
        let mut n = 0;
        for item in &q.items {
            if item.spool_file.as_ref().is_some_and(|f| f.exists()) {
                n += 1;
                continue;
            }
            let path = dir.join(format!("{}-{:08}.pushreq", std::process::id(), item.seq));
            spool::write_spooled(&path, &item.body)?;
            n += 1;
        }
        Ok(n)
    }

    /// Queues the items a previous run spooled to `dir`, oldest first, returning how many. Their
    /// files are removed once they are delivered. Anything that is not a regular file of this
    /// user, or is larger than the queue, is skipped with a warning and left where it is.
    pub fn load_spool(&self, dir: &Path, first_seq: &mut u64) -> std::io::Result<usize> {
        let Ok(entries) = fs::read_dir(dir) else { return Ok(0) };
        let mut files: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "pushreq")).collect();
        files.sort();
        let mut n = 0;
        for path in files {
            let body = match spool::read_spooled(&path, self.capacity) {
                Ok(body) => body,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "spool file skipped");
                    continue;
                }
            };
            self.push(PushItem { seq: *first_seq, body, spool_file: Some(path) });
            *first_seq += 1;
            n += 1;
        }
        Ok(n)
    }
}

fn drop_spool(item: &PushItem) {
    if let Some(f) = &item.spool_file {
        let _ = fs::remove_file(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(seq: u64, size: usize) -> PushItem {
        PushItem { seq, body: vec![0; size], spool_file: None }
    }

    #[test]
    fn bound_drops_oldest_and_counts() {
        let q = Queue::new(100);
        assert_eq!(q.push(item(0, 40)), 0);
        assert_eq!(q.push(item(1, 40)), 0);
        assert_eq!(q.push(item(2, 40)), 1);
        assert_eq!(q.front().unwrap().seq, 1);
        assert_eq!(q.push(item(3, 200)), 1, "an item larger than the bound is dropped itself");
        assert_eq!(q.stats.dropped.load(Ordering::Relaxed), 2);
        assert!(q.stats.max_bytes_seen.load(Ordering::Relaxed) <= 100);
        q.complete(1);
        q.complete(2);
        assert!(q.is_empty());
        assert_eq!(q.stats.bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_item_dropped_while_in_flight_is_not_counted_twice() {
        let q = Queue::new(100);
        q.push(item(0, 60));
        let in_flight = q.front().unwrap();
        q.push(item(1, 60)); // pushes item 0 out: dropped 1
        assert_eq!(q.stats.dropped.load(Ordering::Relaxed), 1);
        q.complete(in_flight.seq); // …but it was delivered
        assert_eq!(q.stats.dropped.load(Ordering::Relaxed), 0);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn spool_round_trip() {
        let dir = std::env::temp_dir().join(format!("gpuflame-spool-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let q = Queue::new(1000);
        q.push(item(5, 10));
        q.push(item(6, 20));
        assert_eq!(q.spool_to(&dir).unwrap(), 2);
        let q2 = Queue::new(1000);
        let mut seq = 0;
        assert_eq!(q2.load_spool(&dir, &mut seq).unwrap(), 2);
        assert_eq!(q2.front().unwrap().body.len(), 10);
        let f = q2.front().unwrap();
        q2.complete(f.seq);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "a delivered item's file is removed");
        let _ = fs::remove_dir_all(&dir);
    }
}
