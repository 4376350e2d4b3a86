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
    #[error(transparent)]
    Context(#[from] ferry_errors::ContextError),
    #[error("not a kernel proxy mode")]
    NotKernelMode,
    #[error("the API server did not list Services and EndpointSlices within 30 s")]
    NotListed,
    #[error("service proxy failed: {0}")]
    Failed(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use ferry_errors::Context;
