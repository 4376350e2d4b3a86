//! The agent's error type (the library returns it; the `ferry` binary wraps it in anyhow).

/// Why the agent (or one of its pod workers) could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Client(#[from] ferry_kubeclient::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Network(#[from] crate::network::NetworkError),
    #[error(transparent)]
    Cni(#[from] crate::cni::CniError),
    #[error(transparent)]
    Endpoint(#[from] crate::server::EndpointError),
    #[error(transparent)]
    BuiltinArgs(#[from] crate::images::BuiltinArgsError),
    /// A failed step: what was being done, then why (`{:#}` in anyhow shows both).
    #[error(transparent)]
    Context(#[from] ferry_errors::ContextError),
    #[error("the netns pod network needs root (use --pod-network loopback)")]
    NeedsRoot,
    #[error("stopped before node {0} got a pod CIDR")]
    StoppedBeforePodCidr(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use ferry_errors::Context;
