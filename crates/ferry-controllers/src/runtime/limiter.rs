//! Rate limiters of the work queue, as client-go's `workqueue.DefaultControllerRateLimiter()`:
//! the larger of a per-key exponential backoff (5 ms doubling up to 1000 s) and an overall
//! token bucket (10 per second, burst 100). Pure: the caller passes the time.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// First retry delay of a failing key (client-go: 5 ms).
pub const BASE_DELAY: Duration = Duration::from_millis(5);
/// Longest retry delay of a failing key (client-go: 1000 s).
pub const MAX_DELAY: Duration = Duration::from_secs(1000);
/// Overall retries per second (client-go: 10).
pub const BUCKET_QPS: f64 = 10.0;
/// Overall burst of retries (client-go: 100).
pub const BUCKET_BURST: f64 = 100.0;

/// Per-key exponential backoff (client-go's `ItemExponentialFailureRateLimiter`).
#[derive(Debug)]
pub struct ItemBackoff<K> {
    base: Duration,
    max: Duration,
    failures: HashMap<K, u32>,
}

impl<K: Hash + Eq + Clone> ItemBackoff<K> {
    pub fn new(base: Duration, max: Duration) -> Self {
        ItemBackoff {
            base,
            max,
            failures: HashMap::new(),
        }
    }

    /// The delay before the next retry of `key`, counting one more failure.
    pub fn when(&mut self, key: &K) -> Duration {
        let n = self.failures.entry(key.clone()).or_insert(0);
        let exp = *n;
        *n = n.saturating_add(1);
        let factor = 2f64.powi(i32::try_from(exp).unwrap_or(i32::MAX));
        let secs = self.base.as_secs_f64() * factor;
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// Failures counted for `key` since its last success.
    pub fn retries(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }

    /// Forgets `key`'s failures (after a success).
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }
}

/// A token bucket over all keys (client-go's `BucketRateLimiter` on `rate.Limiter`): a retry
/// reserves a token; when none is left the retry waits for the refill. Reservations may drive
/// the balance negative, as `rate.Limiter.Reserve` does.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    pub fn new(rate_per_sec: f64, burst: f64) -> Self {
        TokenBucket {
            rate: rate_per_sec,
            burst,
            tokens: burst,
            last: None,
        }
    }

    /// Reserves one token at `now`; returns how long the caller must wait for it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        }
        self.last = Some(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 || self.rate <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

/// The queue's limiter: the larger of the two delays (client-go's `MaxOfRateLimiter`).
#[derive(Debug)]
pub struct RateLimiter<K> {
    pub item: ItemBackoff<K>,
    pub bucket: TokenBucket,
}

impl<K: Hash + Eq + Clone> Default for RateLimiter<K> {
    fn default() -> Self {
        RateLimiter {
            item: ItemBackoff::new(BASE_DELAY, MAX_DELAY),
            bucket: TokenBucket::new(BUCKET_QPS, BUCKET_BURST),
        }
    }
}

/// Longest retry delay of a namespace whose content is not gone yet (upstream's
/// `nsControllerRateLimiter`: a namespace being deleted is retried at least once a minute).
pub const NAMESPACE_MAX_DELAY: Duration = Duration::from_secs(60);

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// The namespace controller's limiter: the default one with the per-key backoff capped at
    /// [`NAMESPACE_MAX_DELAY`] instead of 1000 s.
    pub fn namespace() -> Self {
        RateLimiter {
            item: ItemBackoff::new(BASE_DELAY, NAMESPACE_MAX_DELAY),
            bucket: TokenBucket::new(BUCKET_QPS, BUCKET_BURST),
        }
    }

    pub fn when(&mut self, key: &K, now: Instant) -> Duration {
        let a = self.item.when(key);
        let b = self.bucket.reserve(now);
        a.max(b)
    }
    pub fn forget(&mut self, key: &K) {
        self.item.forget(key);
    }
    pub fn retries(&self, key: &K) -> u32 {
        self.item.retries(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_backoff_is_capped_at_a_minute() {
        let mut l = RateLimiter::<&str>::namespace();
        let t0 = Instant::now();
        let mut last = Duration::ZERO;
        for i in 0..40 {
            // Far apart, so the bucket never adds to the delay.
            last = l.when(&"ns", t0 + Duration::from_secs(100 * i));
        }
        assert_eq!(last, NAMESPACE_MAX_DELAY);
        let mut d = RateLimiter::<&str>::default();
        for i in 0..40 {
            last = d.when(&"ns", t0 + Duration::from_secs(100 * i));
        }
        assert_eq!(last, MAX_DELAY);
    }
    #[test]
    fn item_backoff_doubles_from_5ms_to_the_cap() {
        let mut b = ItemBackoff::new(BASE_DELAY, MAX_DELAY);
        let want = [5u64, 10, 20, 40, 80, 160];
        for w in want {
            assert_eq!(b.when(&"a"), Duration::from_millis(w));
        }
        // Another key starts from the base.
        assert_eq!(b.when(&"b"), Duration::from_millis(5));
        // 5 ms * 2^18 = 1310.72 s > 1000 s.
        for _ in 6..18 {
            b.when(&"a");
        }
        assert_eq!(b.when(&"a"), MAX_DELAY);
        for _ in 0..100 {
            assert_eq!(b.when(&"a"), MAX_DELAY);
        }
        assert_eq!(b.retries(&"a"), 119);
        b.forget(&"a");
        assert_eq!(b.retries(&"a"), 0);
        assert_eq!(b.when(&"a"), BASE_DELAY);
    }

    #[test]
    fn bucket_allows_the_burst_then_paces_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 100.0);
        for _ in 0..100 {
            assert_eq!(b.reserve(t0), Duration::ZERO);
        }
        // The 101st waits one token's refill (100 ms), the 102nd two.
        assert_eq!(b.reserve(t0), Duration::from_millis(100));
        assert_eq!(b.reserve(t0), Duration::from_millis(200));
        // After 1 s, 10 tokens came back; the debt of 2 is paid, 8 remain.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..8 {
            assert_eq!(b.reserve(t1), Duration::ZERO);
        }
        assert_eq!(b.reserve(t1), Duration::from_millis(100));
        // Refill never exceeds the burst.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..100 {
            assert_eq!(b.reserve(t2), Duration::ZERO);
        }
        assert!(b.reserve(t2) > Duration::ZERO);
    }

    #[test]
    fn limiter_takes_the_larger_delay() {
        let t0 = Instant::now();
        let mut l: RateLimiter<u32> = RateLimiter::default();
        // Different keys: per-key delays stay at 5 ms, the bucket kicks in after 100.
        for k in 0..100 {
            assert_eq!(l.when(&k, t0), BASE_DELAY);
        }
        assert_eq!(l.when(&100, t0), Duration::from_millis(100));
        // One key failing often: its own backoff dominates.
        let mut l: RateLimiter<u32> = RateLimiter::default();
        for i in 0..10 {
            let d = l.when(&7, t0);
            assert_eq!(d, BASE_DELAY * 2u32.pow(i));
        }
        l.forget(&7);
        assert_eq!(l.retries(&7), 0);
    }
}
