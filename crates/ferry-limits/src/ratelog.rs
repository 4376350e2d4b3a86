//! Rate limits for repeated log lines.
//!
//! A condition that repeats (accept failing, a connection cap reached, a datagram dropped)
//! must not write a line per occurrence: at most `burst` lines per `interval` are let
//! through, and the first line of a later interval carries how many were suppressed.
//!
//! ```
//! # use std::time::Duration;
//! static FULL: ferry_limits::LogLimiter = ferry_limits::LogLimiter::new(5, Duration::from_secs(10));
//! if let Some(suppressed) = FULL.check() {
//!     tracing::warn!(suppressed, "connection limit reached");
//! }
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The verdict for one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write the line; `suppressed` occurrences were dropped since the last written one.
    Log { suppressed: u64 },
    /// Drop it (counted).
    Suppress,
}

/// The pure core: a fixed window of `interval` that lets `burst` occurrences through.
#[derive(Debug, Clone)]
pub struct RateLimit {
    burst: u32,
    interval: Duration,
    window: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

impl RateLimit {
    pub const fn new(burst: u32, interval: Duration) -> Self {
        RateLimit {
            burst,
            interval,
            window: None,
            in_window: 0,
            suppressed: 0,
        }
    }

    /// Decides for an occurrence at `now`.
    pub fn check(&mut self, now: Instant) -> Verdict {
        let fresh = self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= self.interval);
        if fresh {
            self.window = Some(now);
            self.in_window = 0;
        }
        if self.in_window < self.burst.max(1) {
            self.in_window += 1;
            let suppressed = std::mem::take(&mut self.suppressed);
            Verdict::Log { suppressed }
        } else {
            self.suppressed += 1;
            Verdict::Suppress
        }
    }

    /// Occurrences dropped since the last written line.
    pub fn pending(&self) -> u64 {
        self.suppressed
    }
}

/// A shareable [`RateLimit`] (usable in a `static`).
#[derive(Debug)]
pub struct LogLimiter(Mutex<RateLimit>);

impl LogLimiter {
    pub const fn new(burst: u32, interval: Duration) -> Self {
        LogLimiter(Mutex::new(RateLimit::new(burst, interval)))
    }

    /// `Some(suppressed)` when this occurrence should be logged.
    pub fn check(&self) -> Option<u64> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match g.check(Instant::now()) {
            Verdict::Log { suppressed } => Some(suppressed),
            Verdict::Suppress => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window() {
        let t0 = Instant::now();
        let ms = |m| t0 + Duration::from_millis(m);
        let mut r = RateLimit::new(2, Duration::from_secs(1));
        let got: Vec<Verdict> = [0, 10, 20, 30, 999, 1000, 1001, 1002, 5000]
            .into_iter()
            .map(|m| r.check(ms(m)))
            .collect();
        use Verdict::*;
        assert_eq!(
            got,
            [
                Log { suppressed: 0 },
                Log { suppressed: 0 },
                Suppress,
                Suppress,
                Suppress,
                Log { suppressed: 3 },
                Log { suppressed: 0 },
                Suppress,
                Log { suppressed: 1 },
            ]
        );
    }

    #[test]
    fn a_million_occurrences_write_a_handful_of_lines() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(3, Duration::from_secs(10));
        let mut written = 0;
        // One occurrence every 60 µs for 60 s.
        for i in 0..1_000_000u64 {
            if matches!(
                r.check(t0 + Duration::from_micros(i * 60)),
                Verdict::Log { .. }
            ) {
                written += 1;
            }
        }
        assert_eq!(written, 3 * 6);
    }

    #[test]
    fn shared() {
        let l = LogLimiter::new(1, Duration::from_secs(3600));
        assert_eq!(l.check(), Some(0));
        assert_eq!(l.check(), None);
        assert_eq!(l.check(), None);
    }
}
