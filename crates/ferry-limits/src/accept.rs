//! Accepting connections without spinning when the process is out of descriptors.
//!
//! `accept(2)` fails with `EMFILE`/`ENFILE` when the process or the system has no descriptor
//! left, and with `ENOBUFS`/`ENOMEM` under memory pressure. The pending connection stays in
//! the kernel's queue, so the listener stays readable and an immediate retry fails again: a
//! loop that only logs and retries burns a core and floods the log. Go's `net/http` server
//! sleeps on such errors, 5 ms doubling up to 1 s, and resets after a success; so does
//! [`AcceptBackoff`]. Errors that concern only the one aborted connection (`ECONNABORTED`,
//! `EPROTO`, `EPERM` from a firewall...) are retried at once.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::ratelog::LogLimiter;

/// First delay after a resource error.
pub const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What an accept error means for the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Out of descriptors or buffers: wait before retrying.
    Exhausted,
    /// Only that connection failed: retry at once.
    Connection,
    /// Anything else: also wait (a broken listener must not spin either).
    Other,
}

/// Classifies an accept error.
pub fn classify(e: &std::io::Error) -> ErrorClass {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    const ECONNABORTED: i32 = 103;
    const EPROTO: i32 = 71;
    const EPERM: i32 = 1;
    const ECONNRESET: i32 = 104;
    const EINTR: i32 = 4;
    match e.raw_os_error() {
        Some(EMFILE | ENFILE | ENOBUFS | ENOMEM) => ErrorClass::Exhausted,
        Some(ECONNABORTED | EPROTO | EPERM | ECONNRESET | EINTR) => ErrorClass::Connection,
        _ => match e.kind() {
            std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::Interrupted => ErrorClass::Connection,
            _ => ErrorClass::Other,
        },
    }
}

/// The delay schedule (pure): `next()` after each failure, `reset()` after a success.
#[derive(Debug, Clone, Default)]
pub struct AcceptBackoff {
    current: Option<Duration>,
}

impl AcceptBackoff {
    /// The delay to sleep after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let d = match self.current {
            None => BACKOFF_MIN,
            Some(d) => (d * 2).min(BACKOFF_MAX),
        };
        self.current = Some(d);
        d
    }
    pub fn reset(&mut self) {
        self.current = None;
    }
    /// The delay in force (None right after a success).
    pub fn current(&self) -> Option<Duration> {
        self.current
    }
}

/// Accepts connections for one listener: backs off on errors and logs them at a bounded rate.
pub struct Acceptor {
    component: &'static str,
    backoff: AcceptBackoff,
    log: LogLimiter,
    failures: u64,
}

impl Acceptor {
    /// `component` names the listener in logs (e.g. `"proxy"`).
    pub fn new(component: &'static str) -> Self {
        Acceptor {
            component,
            backoff: AcceptBackoff::default(),
            log: LogLimiter::new(3, Duration::from_secs(10)),
            failures: 0,
        }
    }

    /// Waits for the next connection. Cancel-safe: dropping the future loses no connection.
    pub async fn accept(&mut self, listener: &TcpListener) -> (TcpStream, SocketAddr) {
        loop {
            match listener.accept().await {
                Ok(x) => {
                    self.backoff.reset();
                    return x;
                }
                Err(e) => self.failed(&e).await,
            }
        }
    }

    /// Handles one failed accept: logs (rate-limited) and sleeps as the error deserves.
    pub async fn failed(&mut self, e: &std::io::Error) {
        self.failures += 1;
        let class = classify(e);
        let delay = match class {
            ErrorClass::Connection => None,
            ErrorClass::Exhausted | ErrorClass::Other => Some(self.backoff.next_delay()),
        };
        if let Some(suppressed) = self.log.check() {
            match class {
                ErrorClass::Exhausted => tracing::warn!(
                    component = self.component, error = %e, retry_in = ?delay, suppressed,
                    "accept failed: out of file descriptors or buffers; backing off"
                ),
                ErrorClass::Connection => tracing::debug!(
                    component = self.component, error = %e, suppressed,
                    "accept failed for one connection"
                ),
                ErrorClass::Other => tracing::warn!(
                    component = self.component, error = %e, retry_in = ?delay, suppressed,
                    "accept failed; backing off"
                ),
            }
        }
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
    }

    /// Failed accepts so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// The backoff in force (tests, diagnostics).
    pub fn backoff(&self) -> Option<Duration> {
        self.backoff.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule() {
        let mut b = AcceptBackoff::default();
        let got: Vec<u128> = (0..10).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.current(), None);
        assert_eq!(b.next_delay(), BACKOFF_MIN);
    }

    #[test]
    fn classes() {
        let os = std::io::Error::from_raw_os_error;
        assert_eq!(classify(&os(24)), ErrorClass::Exhausted);
        assert_eq!(classify(&os(23)), ErrorClass::Exhausted);
        assert_eq!(classify(&os(105)), ErrorClass::Exhausted);
        assert_eq!(classify(&os(103)), ErrorClass::Connection);
        assert_eq!(classify(&os(71)), ErrorClass::Connection);
        assert_eq!(classify(&os(22)), ErrorClass::Other);
        assert_eq!(
            classify(&std::io::Error::from(std::io::ErrorKind::ConnectionAborted)),
            ErrorClass::Connection
        );
    }
}
