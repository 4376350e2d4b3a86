#![cfg_attr(test, allow(clippy::unwrap_used))]
//! ferry-limits: how one Ferry process keeps a flood in one component from taking down the
//! others.
//!
//! - [`fdlimit`]: raise `RLIMIT_NOFILE` at start and split the descriptor budget between the
//!   components of one process ([`fdlimit::plan`], a pure function).
//! - [`conn`]: a connection limiter per component (a counting semaphore with a name).
//! - [`accept`]: an accept loop step that backs off on descriptor exhaustion (5 ms doubling to
//!   1 s, as Go's `net/http` server does) instead of spinning.
//! - [`ratelog`]: a rate limit for repeated log lines ("N similar messages suppressed").
//! - [`keepalive`]: TCP keepalive settings for long-lived proxied connections.

pub mod accept;
pub mod conn;
pub mod fdlimit;
pub mod keepalive;
pub mod ratelog;

pub use accept::{AcceptBackoff, Acceptor, ErrorClass, classify};
pub use conn::{ConnLimiter, ConnPermit};
pub use fdlimit::{Budget, FdLimit, Parts, plan, raise_nofile};
pub use ratelog::{LogLimiter, RateLimit, Verdict};
