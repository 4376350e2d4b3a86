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
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
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

/// Names the step that failed (anyhow's `with_context`, typed).
pub trait Context<T> {
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what(),
            source: Box::new(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_cause_as_source() {
        let r: std::result::Result<(), std::io::Error> = Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "address in use",
        ));
        let e = r
            .with_context(|| "binding TCP 127.0.0.1:53".into())
            .expect_err("an error");
        assert_eq!(e.to_string(), "binding TCP 127.0.0.1:53");
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("address in use"));
    }
}
