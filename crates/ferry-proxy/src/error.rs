//! The service proxy's error type (the library returns it; the `ferry` binary wraps it in
//! anyhow).

/// Why the proxy (or `--cleanup`, `--dry-run`, `trace`) could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Client(#[from] ferry_kubeclient::Error),
    #[error(transparent)]
    Arg(#[from] crate::ArgError),
    /// A failed step: what was being done, then why (`{:#}` in anyhow shows both).
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("not a kernel proxy mode")]
    NotKernelMode,
    #[error("the API server did not list Services and EndpointSlices within 30 s")]
    NotListed,
    #[error("service proxy failed: {0}")]
    Failed(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Names the step that failed (anyhow's `context`/`with_context`, typed).
pub trait Context<T> {
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
    fn context(self, what: &str) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what(),
            source: Box::new(e),
        })
    }

    fn context(self, what: &str) -> Result<T> {
        self.with_context(|| what.to_string())
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
            .with_context(|| "binding the health server on 127.0.0.1:10256".into())
            .expect_err("an error");
        assert_eq!(
            e.to_string(),
            "binding the health server on 127.0.0.1:10256"
        );
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("address in use"));
    }
}
