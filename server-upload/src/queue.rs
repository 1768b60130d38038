//! The queue between profiling and upload: bounded in bytes, dropping the oldest item (counted)
//! when a new one does not fit, optionally spooled to disk. Items wait out their own retry backoff
//! in place, so that one refused item never holds back the ones behind it.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::spool;

/// One push request (one series of one window), encoded.
#[derive(Debug, Clone)]
pub struct PushItem {
    /// Monotonic per agent run; also the file name when spooled.
    pub seq: u64,
    pub body: Vec<u8>,
    /// Where this item is spooled, removed once it is delivered.
    pub spool_file: Option<PathBuf>,
    /// When it was queued: the age bound of retries counts from here.
    pub queued_at: Instant,
    /// Attempts that failed and were worth retrying.
    pub attempts: u32,
    /// Not to be sent before this (its retry backoff).
    pub not_before: Option<Instant>,
}

impl PushItem {
    pub fn new(seq: u64, body: Vec<u8>) -> Self {
        PushItem { seq, body, spool_file: None, queued_at: Instant::now(), attempts: 0, not_before: None }
    }
}

/// Why an item was given up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The queue's byte bound was reached; the oldest items go first.
    QueueFull,
    /// Retried as often as allowed.
    RetriesExhausted,
    /// Older than the age bound of retries.
    TooOld,
    /// Still queued when the agent exited without a spool directory.
    AtExit,
}

/// Counters shared with the metrics endpoint. `dropped` is the sum of the `dropped_*` counters.
#[derive(Debug, Default)]
pub struct QueueStats {
    pub pushed: AtomicU64,
    /// Refused by the server for good (4xx other than 429).
    pub failed: AtomicU64,
    pub dropped: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub dropped_retries: AtomicU64,
    pub dropped_too_old: AtomicU64,
    pub dropped_at_exit: AtomicU64,
    pub retries: AtomicU64,
    pub bytes: AtomicU64,
    pub max_bytes_seen: AtomicU64,
}

impl QueueStats {
    fn reason(&self, reason: DropReason) -> &AtomicU64 {
        match reason {
            DropReason::QueueFull => &self.dropped_queue_full,
            DropReason::RetriesExhausted => &self.dropped_retries,
            DropReason::TooOld => &self.dropped_too_old,
            DropReason::AtExit => &self.dropped_at_exit,
        }
    }

    pub fn count_drop(&self, reason: DropReason, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        self.reason(reason).fetch_add(n, Ordering::Relaxed);
    }

    fn uncount_drop(&self, reason: DropReason) {
        self.dropped.fetch_sub(1, Ordering::Relaxed);
        self.reason(reason).fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the uploader should do next.
#[derive(Debug)]
pub enum Next {
    Send(PushItem),
    /// Every queued item waits out its backoff; the earliest may go at this time.
    WaitUntil(Instant),
    Empty,
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
            self.stats.count_drop(DropReason::QueueFull, dropped);
            tracing::warn!(dropped, capacity = self.capacity, "queue full: dropped the oldest profiles");
        }
        self.notify.notify_one();
        dropped
    }

    /// The oldest item, left in the queue until [`Queue::complete`].
    pub fn front(&self) -> Option<PushItem> {
        self.lock().items.front().cloned()
    }

    /// The oldest item whose backoff is over (left in the queue until [`Queue::complete`]), or
    /// when the next one will be.
    pub fn next(&self, now: Instant) -> Next {
        let q = self.lock();
        let mut earliest: Option<Instant> = None;
        for item in &q.items {
            match item.not_before {
                Some(t) if t > now => earliest = Some(earliest.map_or(t, |e| e.min(t))),
                _ => return Next::Send(item.clone()),
            }
        }
        earliest.map_or(Next::Empty, Next::WaitUntil)
    }

    /// Holds item `seq` back until `not_before`, after a failed attempt that `counts` towards
    /// its bound. Returns false when the item is no longer queued (the bound pushed it out while
    /// it was sent).
    pub fn retry_later(&self, seq: u64, not_before: Instant, counts: bool) -> bool {
        let mut q = self.lock();
        match q.items.iter_mut().find(|i| i.seq == seq) {
            Some(item) => {
                item.attempts += u32::from(counts);
                item.not_before = Some(not_before);
                true
            }
            None => false,
        }
    }

    /// Removes the item `seq` after it was delivered or refused. An item the bound pushed out
    /// while it was being sent was counted as dropped; since it did reach its end after all,
    /// that count is taken back, so that pushed + failed + dropped stays exact.
    pub fn complete(&self, seq: u64) {
        if !self.remove(seq) {
            self.stats.uncount_drop(DropReason::QueueFull);
        }
    }

    /// Removes the item `seq` and counts it as dropped for `reason` (unless the bound already
    /// pushed it out and counted it).
    pub fn give_up(&self, seq: u64, reason: DropReason) {
        if self.remove(seq) {
            self.stats.count_drop(reason, 1);
        }
    }

    fn remove(&self, seq: u64) -> bool {
        let mut q = self.lock();
        let found = match q.items.iter().position(|i| i.seq == seq).and_then(|pos| q.items.remove(pos)) {
            Some(item) => {
                q.bytes -= item.body.len() as u64;
                drop_spool(&item);
                true
            }
            None => false,
        };
        self.stats.bytes.store(q.bytes, Ordering::Relaxed);
        found
    }

    /// Drops everything still queued (counted as dropped at exit); returns how many.
    pub fn drop_all(&self, reason: DropReason) -> u64 {
        let mut q = self.lock();
        let n = q.items.len() as u64;
        q.items.clear();
        q.bytes = 0;
        self.stats.bytes.store(0, Ordering::Relaxed);
        drop(q);
        self.stats.count_drop(reason, n);
        n
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
            self.push(PushItem { spool_file: Some(path), ..PushItem::new(*first_seq, body) });
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
        PushItem::new(seq, vec![0; size])
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

    #[test]
    fn an_item_in_backoff_lets_the_next_ones_go() {
        let q = Queue::new(1000);
        q.push(item(0, 10));
        q.push(item(1, 10));
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(5);
        assert!(q.retry_later(0, later, true));
        assert!(matches!(q.next(now), Next::Send(i) if i.seq == 1));
        q.complete(1);
        assert!(matches!(q.next(now), Next::WaitUntil(t) if t == later));
        assert!(matches!(q.next(later), Next::Send(i) if i.seq == 0 && i.attempts == 1));
        q.give_up(0, DropReason::RetriesExhausted);
        assert!(matches!(q.next(later), Next::Empty));
        assert_eq!(q.stats.dropped_retries.load(Ordering::Relaxed), 1);
        assert_eq!(q.stats.dropped.load(Ordering::Relaxed), 1);
    }
}
