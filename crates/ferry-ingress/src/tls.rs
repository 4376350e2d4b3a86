//! Certificates from `kubernetes.io/tls` Secrets, chosen per SNI name. Building the table is
//! pure (Secrets in, certificates and problems out); the resolver reads the table in effect.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Secret;
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::routes::{Key, Problem, TlsBinding};

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("secret {0} not found")]
    NotFound(String),
    #[error("secret {0} has no {1}")]
    MissingKey(String, &'static str),
    #[error("secret {0}: tls.crt holds no PEM certificate")]
    NoCertificate(String),
    #[error("secret {0}: tls.key holds no PEM private key")]
    NoKey(String),
    #[error("secret {0}: {1}")]
    Rustls(String, rustls::Error),
    #[error("the certificate in secret {0} is not valid for {1}")]
    WrongName(String, String),
}

/// Parses a Secret's `tls.crt` (chain) and `tls.key` into a key rustls can serve.
pub fn certified_key(secret: &Secret, name: &str) -> Result<Arc<CertifiedKey>, CertError> {
    let data = secret.data.as_ref();
    let get = |k: &'static str| {
        data.and_then(|d| d.get(k))
            .map(|b| b.0.clone())
            .ok_or_else(|| CertError::MissingKey(name.to_string(), k))
    };
    let crt = get("tls.crt")?;
    let key = get("tls.key")?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&crt)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(CertError::NoCertificate(name.to_string()));
    }
    let key =
        PrivateKeyDer::from_pem_slice(&key).map_err(|_| CertError::NoKey(name.to_string()))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| CertError::Rustls(name.to_string(), e))?;
    let ck = CertifiedKey::new(chain, signer);
    ck.keys_match()
        .map_err(|e| CertError::Rustls(name.to_string(), e))?;
    ParsedCertificate::try_from(
        ck.end_entity_cert()
            .map_err(|e| CertError::Rustls(name.to_string(), e))?,
    )
    .map_err(|e| CertError::Rustls(name.to_string(), e))?;
    Ok(Arc::new(ck))
}

/// Whether `ck` is valid for `host` (a name or `*.wildcard`), per its subject alternative names.
pub fn covers(ck: &CertifiedKey, host: &str) -> bool {
    let probe = match host.strip_prefix("*.") {
        // A wildcard rule needs a certificate valid for any one label under it.
        Some(rest) => format!("ferry-probe.{rest}"),
        None => host.to_string(),
    };
    let Ok(name) = ServerName::try_from(probe) else {
        return false;
    };
    let Ok(ee) = ck.end_entity_cert() else {
        return false;
    };
    let Ok(parsed) = ParsedCertificate::try_from(ee) else {
        return false;
    };
    rustls::client::verify_server_name(&parsed, &name).is_ok()
}

/// The certificates in effect.
#[derive(Debug, Clone)]
pub struct CertTable {
    pub exact: HashMap<String, Arc<CertifiedKey>>,
    /// Keyed by the suffix after `*.`.
    pub wildcard: HashMap<String, Arc<CertifiedKey>>,
    /// For names nothing else covers (and clients without SNI).
    pub default: Arc<CertifiedKey>,
}

impl CertTable {
    pub fn pick(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        if let Some(name) = sni {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(c) = self.exact.get(&name) {
                return c.clone();
            }
            if let Some((_, suffix)) = name.split_once('.')
                && let Some(c) = self.wildcard.get(suffix)
            {
                return c.clone();
            }
        }
        self.default.clone()
    }
}

/// Builds the certificate table: for each binding (oldest Ingress first) the Secret's
/// certificate, when it parses and covers the host; otherwise a problem, and the host keeps the
/// default certificate (as ingress-nginx does).
pub fn build(
    bindings: &[TlsBinding],
    secrets: &BTreeMap<Key, Secret>,
    fallback: Arc<CertifiedKey>,
) -> (CertTable, Vec<Problem>) {
    let mut t = CertTable {
        exact: HashMap::new(),
        wildcard: HashMap::new(),
        default: fallback.clone(),
    };
    let mut default_set = false;
    let mut problems = Vec::new();
    let mut parsed: HashMap<Key, Result<Arc<CertifiedKey>, Arc<CertError>>> = HashMap::new();
    for b in bindings {
        let name = format!("{}/{}", b.secret.0, b.secret.1);
        let ck = parsed
            .entry(b.secret.clone())
            .or_insert_with(|| match secrets.get(&b.secret) {
                None => Err(Arc::new(CertError::NotFound(name.clone()))),
                Some(s) => certified_key(s, &name).map_err(Arc::new),
            })
            .clone();
        let ck = match ck {
            Ok(ck) => ck,
            Err(message) => {
                problems.push(Problem {
                    ingress: b.ingress.clone(),
                    reason: "BadSecret",
                    message: format!("{message}; using the default certificate"),
                });
                continue;
            }
        };
        match &b.host {
            None => {
                if !default_set {
                    t.default = ck;
                    default_set = true;
                }
            }
            Some(host) => {
                if !covers(&ck, host) {
                    problems.push(Problem {
                        ingress: b.ingress.clone(),
                        reason: "BadSecret",
                        message: format!(
                            "{}; using the default certificate",
                            CertError::WrongName(name, host.clone())
                        ),
                    });
                    continue;
                }
                match host.strip_prefix("*.") {
                    Some(suffix) => {
                        t.wildcard.entry(suffix.to_string()).or_insert(ck);
                    }
                    None => {
                        t.exact.entry(host.clone()).or_insert(ck);
                    }
                }
            }
        }
    }
    (t, problems)
}

/// A self-signed certificate for names no Secret covers (ingress-nginx's "Fake Certificate").
pub fn self_signed() -> Result<Arc<CertifiedKey>, rcgen::Error> {
    let mut params = rcgen::CertificateParams::new(vec!["ingress.local".to_string()])?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "Ferry Ingress Default Certificate",
    );
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    let der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|_| rcgen::Error::CouldNotParseKeyPair)?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&der)
        .map_err(|_| rcgen::Error::CouldNotParseKeyPair)?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signer,
    )))
}

/// The rustls resolver: reads the table in effect at each handshake.
#[derive(Debug)]
pub struct Resolver {
    pub table: RwLock<Arc<CertTable>>,
}

impl Resolver {
    pub fn new(t: CertTable) -> Resolver {
        Resolver {
            table: RwLock::new(Arc::new(t)),
        }
    }

    pub fn swap(&self, t: CertTable) {
        if let Ok(mut g) = self.table.write() {
            *g = Arc::new(t);
        }
    }

    fn current(&self) -> Option<Arc<CertTable>> {
        self.table.read().ok().map(|g| g.clone())
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current()?.pick(hello.server_name()))
    }
}

/// A rustls server configuration serving HTTP/2 and HTTP/1.1 (ALPN) from the resolver.
pub fn server_config(resolver: Arc<Resolver>) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| rustls::ServerConfig::builder())
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    c
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(names: &[&str]) -> Secret {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        let mut data = BTreeMap::new();
        data.insert("tls.crt".to_string(), ByteString(cert.pem().into_bytes()));
        data.insert(
            "tls.key".to_string(),
            ByteString(key.serialize_pem().into_bytes()),
        );
        Secret {
            data: Some(data),
            type_: Some("kubernetes.io/tls".into()),
            ..Default::default()
        }
    }

    fn k(s: &str) -> Key {
        ("default".into(), s.into())
    }

    fn bind(host: Option<&str>, secret: &str) -> TlsBinding {
        TlsBinding {
            host: host.map(String::from),
            secret: k(secret),
            ingress: k("ing"),
        }
    }

    #[test]
    fn sni_picks_the_secret_of_the_host() {
        let fallback = self_signed().unwrap();
        let mut secrets = BTreeMap::new();
        secrets.insert(k("a"), secret(&["a.test"]));
        secrets.insert(k("w"), secret(&["*.w.test"]));
        secrets.insert(k("other"), secret(&["other.test"]));
        let mut bad = secret(&["b.test"]);
        bad.data
            .as_mut()
            .unwrap()
            .insert("tls.key".into(), ByteString(b"junk".to_vec()));
        secrets.insert(k("bad"), bad);
        let bindings = vec![
            bind(Some("a.test"), "a"),
            bind(Some("*.w.test"), "w"),
            bind(Some("b.test"), "bad"),
            bind(Some("c.test"), "missing"),
            bind(Some("d.test"), "other"),
        ];
        let (t, problems) = build(&bindings, &secrets, fallback.clone());
        let same = |a: &Arc<CertifiedKey>, b: &Arc<CertifiedKey>| Arc::ptr_eq(a, b);
        assert!(covers(&t.pick(Some("a.test")), "a.test"));
        assert!(covers(&t.pick(Some("x.w.test")), "x.w.test"));
        assert!(same(&t.pick(Some("y.x.w.test")), &fallback));
        assert!(same(&t.pick(Some("b.test")), &fallback));
        assert!(same(&t.pick(Some("c.test")), &fallback));
        assert!(same(&t.pick(Some("d.test")), &fallback));
        assert!(same(&t.pick(None), &fallback));
        let msgs: Vec<String> = problems.iter().map(|p| p.message.clone()).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(
            msgs[0].contains("default/bad: tls.key holds no PEM private key"),
            "{msgs:?}"
        );
        assert!(
            msgs[1].contains("secret default/missing not found"),
            "{msgs:?}"
        );
        assert!(msgs[2].contains("not valid for d.test"), "{msgs:?}");
    }

    #[test]
    fn a_tls_entry_without_hosts_replaces_the_default() {
        let fallback = self_signed().unwrap();
        let mut secrets = BTreeMap::new();
        secrets.insert(k("d"), secret(&["d.test"]));
        let (t, problems) = build(&[bind(None, "d")], &secrets, fallback.clone());
        assert!(problems.is_empty());
        assert!(!Arc::ptr_eq(&t.pick(Some("zzz")), &fallback));
    }

    #[test]
    fn mismatched_key_is_refused() {
        let a = secret(&["a.test"]);
        let b = secret(&["a.test"]);
        let mut mixed = a.clone();
        mixed
            .data
            .as_mut()
            .unwrap()
            .insert("tls.key".into(), b.data.unwrap()["tls.key"].clone());
        assert!(certified_key(&a, "a").is_ok());
        assert!(certified_key(&mixed, "m").is_err());
    }
}
