//! The controllers' error type (the library returns it; the `ferry` binary wraps it in anyhow).

/// Why the controllers could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Client(#[from] ferry_kubeclient::Error),
    #[error(transparent)]
    LoadBalancerPool(#[from] crate::services::lbpool::PoolError),
    #[error(transparent)]
    Ipam(#[from] crate::lifecycle::ipam::IpamConfigError),
    #[error("controllers panicked: {0}")]
    Panicked(tokio::task::JoinError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
