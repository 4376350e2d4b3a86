//! The keyed work queue (client-go's `workqueue.TypedRateLimitingInterface`):
//!
//! * a key added while it waits is queued once (dedup);
//! * a key added while a worker holds it is handed out again only after [`WorkQueue::done`]
//!   (never two workers on one key);
//! * [`WorkQueue::add_after`] delays a key (the earliest of several delays wins);
//! * [`WorkQueue::add_rate_limited`] delays a failed key by the [`RateLimiter`];
//!   [`WorkQueue::forget`] resets its backoff after a success.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::limiter::RateLimiter;

/// What a key must be to sit in the queue.
pub trait QueueKey: Clone + Eq + Hash + Ord + Send + Sync + std::fmt::Debug + 'static {}
impl<T: Clone + Eq + Hash + Ord + Send + Sync + std::fmt::Debug + 'static> QueueKey for T {}

#[derive(Debug)]
struct State<K> {
    ready: VecDeque<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    /// Delayed keys by due time; `waiting_at` dedups them.
    waiting: BTreeMap<(Instant, u64), K>,
    waiting_at: HashMap<K, (Instant, u64)>,
    seq: u64,
    limiter: RateLimiter<K>,
    shutdown: bool,
}

/// A deduplicating, rate-limited work queue of keys; share it in an `Arc`.
#[derive(Debug)]
pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
}

impl<K: QueueKey> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::with_limiter(RateLimiter::default())
    }
}

impl<K: QueueKey> WorkQueue<K> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_limiter(limiter: RateLimiter<K>) -> Self {
        WorkQueue {
            state: Mutex::new(State {
                ready: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                waiting: BTreeMap::new(),
                waiting_at: HashMap::new(),
                seq: 0,
                limiter,
                shutdown: false,
            }),
            notify: Notify::new(),
        }
    }

    /// The queue's bookkeeping stays consistent across a panicking holder (every critical
    /// section is a few collection operations), so a poisoned lock is taken over, never
    /// treated as an empty queue.
    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add_locked(s: &mut State<K>, key: K) -> bool {
        if s.shutdown || !s.dirty.insert(key.clone()) {
            return false;
        }
        if s.processing.contains(&key) {
            return false;
        }
        s.ready.push_back(key);
        true
    }

    /// Queues `key` now (a no-op when it is already queued).
    pub fn add(&self, key: K) {
        let woke = Self::add_locked(&mut self.lock(), key);
        if woke {
            self.notify.notify_one();
        }
    }

    /// Queues every key of `keys`.
    pub fn extend(&self, keys: impl IntoIterator<Item = K>) {
        for k in keys {
            self.add(k);
        }
    }

    /// Queues `key` after `delay`; an earlier pending delay of the same key wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let due = Instant::now() + delay;
        {
            let mut s = self.lock();
            if s.shutdown {
                return;
            }
            if let Some(&(at, seq)) = s.waiting_at.get(&key) {
                if at <= due {
                    return;
                }
                s.waiting.remove(&(at, seq));
            }
            s.seq += 1;
            let slot = (due, s.seq);
            s.waiting.insert(slot, key.clone());
            s.waiting_at.insert(key, slot);
        }
        // A sleeping worker recomputes its wake-up time.
        self.notify.notify_one();
    }

    /// Queues `key` after its backoff (one more failure); returns the delay.
    pub fn add_rate_limited(&self, key: K) -> Duration {
        let delay = self.lock().limiter.when(&key, Instant::now());
        self.add_after(key.clone(), delay);
        delay
    }

    /// Forgets `key`'s failures (call after a successful sync).
    pub fn forget(&self, key: &K) {
        self.lock().limiter.forget(key);
    }

    /// Failures of `key` since its last success.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.lock().limiter.retries(key)
    }

    /// Keys ready to be handed out.
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting for a delay.
    pub fn delayed(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The next key to work on, waiting for one; `None` after [`WorkQueue::shut_down`].
    /// The caller must call [`WorkQueue::done`] with the key when finished.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next_due = {
                let mut s = self.lock();
                if s.shutdown {
                    return None;
                }
                let now = Instant::now();
                while let Some(entry) = s.waiting.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let key = entry.remove();
                    s.waiting_at.remove(&key);
                    Self::add_locked(&mut s, key);
                }
                if let Some(key) = s.ready.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    let more = !s.ready.is_empty();
                    drop(s);
                    if more {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
                s.waiting.keys().next().map(|(at, _)| *at)
            };
            match next_due {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` finished; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let woke = {
            let mut s = self.lock();
            s.processing.remove(key);
            if s.dirty.contains(key) && !s.shutdown {
                s.ready.push_back(key.clone());
                true
            } else {
                false
            }
        };
        if woke {
            self.notify.notify_one();
        }
    }

    /// Stops the queue: every `get` returns `None`, adds are ignored.
    pub fn shut_down(&self) {
        self.lock().shutdown = true;
        self.notify.notify_waiters();
    }

    pub fn is_shut_down(&self) -> bool {
        self.lock().shutdown
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::runtime::limiter::BASE_DELAY;

    #[tokio::test(start_paused = true)]
    async fn dedups_queued_keys() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.get().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_processing_waits_for_done() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        q.add("a");
        q.add("a");
        assert!(q.is_empty(), "not handed out while held");
        q.add("b");
        assert_eq!(q.get().await, Some("b"));
        q.done(&"a");
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        q.done(&"b");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_delays_and_keeps_the_earliest() {
        let q: Arc<WorkQueue<&str>> = Arc::new(WorkQueue::new());
        let t0 = Instant::now();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(3));
        q.add_after("a", Duration::from_secs(20));
        assert_eq!(q.delayed(), 1);
        assert!(q.is_empty());
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(t0.elapsed(), Duration::from_secs(3));
        q.done(&"a");
        assert_eq!(q.delayed(), 0);
        // A sleeping worker notices an earlier key.
        let qq = q.clone();
        let h = tokio::spawn(async move { qq.get().await });
        q.add_after("b", Duration::from_secs(60));
        tokio::task::yield_now().await;
        q.add_after("c", Duration::from_secs(1));
        assert_eq!(h.await.ok().flatten(), Some("c"));
        assert_eq!(t0.elapsed(), Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_retries_back_off_and_forget_resets() {
        let q: WorkQueue<&str> = WorkQueue::new();
        let mut want = BASE_DELAY;
        for _ in 0..8 {
            let t = Instant::now();
            assert_eq!(q.add_rate_limited("a"), want);
            assert_eq!(q.get().await, Some("a"));
            assert_eq!(t.elapsed(), want);
            q.done(&"a");
            want *= 2;
        }
        assert_eq!(q.num_requeues(&"a"), 8);
        q.forget(&"a");
        assert_eq!(q.num_requeues(&"a"), 0);
        assert_eq!(q.add_rate_limited("a"), BASE_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn overall_bucket_limits_many_failing_keys() {
        let q: WorkQueue<u32> = WorkQueue::new();
        for k in 0..100 {
            assert_eq!(q.add_rate_limited(k), BASE_DELAY);
        }
        // The burst is spent: further retries are paced at 10 per second.
        assert_eq!(q.add_rate_limited(100), Duration::from_millis(100));
        assert_eq!(q.add_rate_limited(101), Duration::from_millis(200));
        let t = Instant::now();
        let mut got = Vec::new();
        for _ in 0..102 {
            let Some(k) = q.get().await else { break };
            got.push(k);
            q.done(&k);
        }
        got.sort_unstable();
        assert_eq!(got, (0..102).collect::<Vec<_>>());
        assert_eq!(t.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_releases_waiting_workers() {
        let q: Arc<WorkQueue<&str>> = Arc::new(WorkQueue::new());
        let qq = q.clone();
        let h = tokio::spawn(async move { qq.get().await });
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(h.await.ok().flatten(), None);
        q.add("a");
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn workers_never_hold_one_key_at_once() {
        let q: Arc<WorkQueue<u32>> = Arc::new(WorkQueue::new());
        let active: Arc<Mutex<HashSet<u32>>> = Arc::default();
        let processed = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..4 {
            let (q, active, processed) = (q.clone(), active.clone(), processed.clone());
            workers.push(tokio::spawn(async move {
                while let Some(k) = q.get().await {
                    assert!(
                        active.lock().map(|mut a| a.insert(k)).unwrap_or(false),
                        "key {k} held twice"
                    );
                    tokio::time::sleep(Duration::from_millis(7)).await;
                    if let Ok(mut a) = active.lock() {
                        a.remove(&k);
                    }
                    processed.fetch_add(1, Ordering::SeqCst);
                    q.done(&k);
                }
            }));
        }
        for round in 0..50u64 {
            for k in 0..3 {
                q.add(k);
            }
            tokio::time::sleep(Duration::from_millis(round % 5)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.shut_down();
        for w in workers {
            assert!(w.await.is_ok(), "a worker panicked");
        }
        // Dedup: far fewer syncs than the 150 adds, but at least one per key.
        let n = processed.load(Ordering::SeqCst);
        assert!((3..150).contains(&n), "{n} syncs");
    }
}
