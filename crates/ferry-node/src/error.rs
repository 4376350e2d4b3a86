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
    /// A failed step: what was being done, then why (`{:#}` shows both, as anyhow's context).
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the netns pod network needs root (use --pod-network loopback)")]
    NeedsRoot,
    #[error("stopped before node {0} got a pod CIDR")]
    StoppedBeforePodCidr(String),
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
    fn context_reads_like_anyhow() {
        let r: std::result::Result<(), std::io::Error> = Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "address in use",
        ));
        let e = r
            .with_context(|| "agent endpoint on 127.0.0.1:10250".into())
            .expect_err("an error");
        assert_eq!(e.to_string(), "agent endpoint on 127.0.0.1:10250");
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "agent endpoint on 127.0.0.1:10250: address in use"
        );
    }
}
