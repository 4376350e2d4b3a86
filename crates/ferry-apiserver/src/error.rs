//! The API server's start-up error type (the library returns it; the `ferry` binary wraps it
//! in anyhow). Request handling has its own errors (`status::ApiError`).

/// Why the API server (its PKI, its authenticators, its bootstrap objects) could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] ferry_store::StoreError),
    #[error(transparent)]
    Certificate(#[from] rcgen::Error),
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    #[error(transparent)]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
    #[error(transparent)]
    Pem(#[from] rustls_pki_types::pem::Error),
    #[error(transparent)]
    ServiceAccountKey(#[from] ferry_auth::jwt::Error),
    /// A failed step: what was being done, then why (`{:#}` in anyhow shows both).
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("--kubelet-client-certificate and --kubelet-client-key go together")]
    KubeletClientPair,
    #[error("the kubelet certificate authority holds no certificate")]
    EmptyKubeletCa,
    /// A bootstrap object could not be created (`what`, then the API error's message).
    #[error("creating {what}: {message}")]
    Bootstrap { what: String, message: String },
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
            .with_context(|| "binding 127.0.0.1:6443".into())
            .expect_err("an error");
        assert_eq!(e.to_string(), "binding 127.0.0.1:6443");
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("address in use"));
    }

    #[test]
    fn bootstrap_reads_as_before() {
        let e = Error::Bootstrap {
            what: "namespace kube-system".into(),
            message: "etcdserver: request timed out".into(),
        };
        assert_eq!(
            e.to_string(),
            "creating namespace kube-system: etcdserver: request timed out"
        );
    }
}
