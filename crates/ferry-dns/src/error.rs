//! The cluster DNS's error type (the library returns it; the `ferry` binary wraps it in
//! anyhow).

/// Why the DNS server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Client(#[from] ferry_kubeclient::Error),
    #[error(transparent)]
    Cidr(#[from] ipnet::AddrParseError),
    /// A failed step: what was being done, then why (`{:#}` in anyhow shows both).
    #[error(transparent)]
    Context(#[from] ferry_errors::ContextError),
    #[error("stub domain must be DOMAIN=ADDR:PORT")]
    StubSyntax,
    #[error("no port free for both UDP and TCP")]
    NoPortFree,
    #[error("a DNS watcher panicked: {0}")]
    WatcherPanicked(String),
    #[error("a DNS watcher stopped: {0}")]
    WatcherStopped(tokio::task::JoinError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use ferry_errors::Context;
