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
    #[error(transparent)]
    Context(#[from] ferry_errors::ContextError),
    #[error("--kubelet-client-certificate and --kubelet-client-key go together")]
    KubeletClientPair,
    #[error("the kubelet certificate authority holds no certificate")]
    EmptyKubeletCa,
    /// A bootstrap object could not be created (`what`, then the API error's message).
    #[error("creating {what}: {message}")]
    Bootstrap { what: String, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use ferry_errors::Context;

#[cfg(test)]
mod tests {
    use super::*;

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
