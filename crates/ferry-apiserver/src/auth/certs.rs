//! Client certificates: the serving TLS configuration asks for (but does not require) a client
//! certificate chaining to the cluster CA; a verified one names the user (CN) and groups (O).

use std::sync::Arc;

use crate::error::Result;
use ferry_auth::UserInfo;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::pki::Pki;

/// The API server's TLS configuration: its serving certificate, HTTP/2 and HTTP/1.1 by ALPN,
/// and optional client certificates verified against the cluster CA.
pub fn server_config(pki: &Pki) -> Result<Arc<rustls::ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pki.ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The user a (verified) client certificate names: CN the user, each O a group
/// (upstream's `x509.CommonNameUserConversion`).
pub fn user_of_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_string();
    if name.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(String::from))
        .collect();
    Some(UserInfo::authenticated(name, groups))
}

/// The identity of a TLS connection's verified client certificate, if it sent one.
pub fn peer_user<IO>(tls: &tokio_rustls::server::TlsStream<IO>) -> Option<super::PeerUser> {
    let (_, conn) = tls.get_ref();
    let leaf = conn.peer_certificates()?.first()?;
    user_of_certificate(leaf.as_ref()).map(super::PeerUser)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_names_user_and_groups() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let u = user_of_certificate(cert.der()).expect("user");
        assert_eq!(u.name, "system:node:n1");
        assert_eq!(u.groups, ["system:nodes", "system:authenticated"]);
        assert!(user_of_certificate(b"not a certificate").is_none());
    }
}
