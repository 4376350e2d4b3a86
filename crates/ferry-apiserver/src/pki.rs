//! The cluster's certificate authority, the API server's serving certificate, the admin token
//! and the kubeconfig — generated once and kept in the data directory.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Everything a client needs to trust and authenticate to the API server.
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub admin_token: String,
}

/// Writes a file only the owner can read, created `0600` (never briefly readable by others).
fn write_private(path: &Path, contents: &str) -> Result<()> {
    ferry_store::private_fs::write_private(path, contents.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Creates `dir` `0700`; tightens it, the directories under it (`0700`) and the files in them
/// (`0600`: keys, tokens, certificates) when an older build left them readable by others.
fn private_tree(dir: &Path) -> Result<()> {
    use ferry_store::private_fs;
    private_fs::ensure_private_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            private_tree(&path)?;
        } else {
            private_fs::tighten_if_present(&path)
                .with_context(|| format!("securing {}", path.display()))?;
        }
    }
    Ok(())
}

fn ca_params() -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "ferry-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(params)
}

fn pki_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("pki")
}

/// Loads the PKI from `data_dir/pki`, creating what is missing. The serving certificate is
/// re-issued when it does not cover `extra_sans`.
pub fn load_or_create(data_dir: &Path, extra_sans: &[String]) -> Result<Pki> {
    let dir = pki_dir(data_dir);
    private_tree(&dir)?;
    let ca_crt = dir.join("ca.crt");
    let ca_key = dir.join("ca.key");
    if !ca_crt.exists() || !ca_key.exists() {
        let key = KeyPair::generate()?;
        let cert = ca_params()?.self_signed(&key)?;
        write_private(&ca_key, &key.serialize_pem())?;
        write_private(&ca_crt, &cert.pem())?;
        // A new CA invalidates any old serving certificate.
        let _ = fs::remove_file(dir.join("apiserver.crt"));
    }
    let ca_pem = fs::read_to_string(&ca_crt)?;
    let ca_key_pem = fs::read_to_string(&ca_key)?;

    let mut sans: Vec<String> = vec![
        "localhost".into(),
        "127.0.0.1".into(),
        "::1".into(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
    ];
    for s in extra_sans {
        if !s.is_empty() && !sans.contains(s) {
            sans.push(s.clone());
        }
    }
    let crt_path = dir.join("apiserver.crt");
    let key_path = dir.join("apiserver.key");
    let sans_path = dir.join("apiserver.sans");
    let wanted = sans.join(",");
    let current = fs::read_to_string(&sans_path).unwrap_or_default();
    if !crt_path.exists() || !key_path.exists() || current != wanted {
        let issuer_key = KeyPair::from_pem(&ca_key_pem)?;
        // The CA's parameters are fixed, so the issuer is rebuilt from them and its key.
        let ca = ca_params()?;
        let issuer = Issuer::from_params(&ca, issuer_key);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.subject_alt_names = sans
            .iter()
            .map(|s| match s.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok::<_, rcgen::Error>(SanType::DnsName(s.as_str().try_into()?)),
            })
            .collect::<Result<_, _>>()?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(2124, 1, 1);
        let cert = params.signed_by(&key, &issuer)?;
        write_private(&key_path, &key.serialize_pem())?;
        write_private(&crt_path, &cert.pem())?;
        write_private(&sans_path, &wanted)?;
    }
    let token_path = dir.join("admin.token");
    if !token_path.exists() {
        let token: String = {
            use rand::Rng;
            let mut rng = rand::rng();
            (0..48)
                .map(|_| {
                    char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)])
                })
                .collect()
        };
        write_private(&token_path, &token)?;
    }
    Ok(Pki {
        ca_pem,
        cert_pem: fs::read_to_string(&crt_path)?,
        key_pem: fs::read_to_string(&key_path)?,
        admin_token: fs::read_to_string(&token_path)?.trim().to_string(),
    })
}

impl Pki {
    /// A rustls server configuration (HTTP/2 and HTTP/1.1 by ALPN).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes()).collect::<Result<_, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// A kubeconfig for the admin user.
    pub fn kubeconfig(&self, server_url: &str, tls: bool) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes());
        let ca_line = if tls {
            format!("    certificate-authority-data: {ca}\n")
        } else {
            String::new()
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: ferry\n  cluster:\n    server: {server_url}\n{ca_line}contexts:\n- name: ferry\n  context:\n    cluster: ferry\n    user: admin\n    namespace: default\ncurrent-context: ferry\nusers:\n- name: admin\n  user:\n    token: {}\npreferences: {{}}\n",
            self.admin_token
        )
    }
}

/// Writes `contents` to `path` atomically (write then rename), mode 0600.
pub fn write_kubeconfig(path: &Path, contents: &str) -> Result<()> {
    write_private(path, contents)
}
