//! The cluster's certificate authority, the API server's serving certificate, the API server's
//! client certificate towards node agents (as kube-apiserver's `--kubelet-client-certificate`),
//! serving certificates for agents, the admin token and the kubeconfig — generated once and
//! kept in the data directory.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Context, Error, Result};
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The user name of the API server's client certificate towards node agents.
pub const KUBELET_CLIENT_USER: &str = "ferry-apiserver-kubelet-client";
/// The group (certificate `O`) of that certificate: a dedicated one, bound to nothing on the API
/// server, as kubeadm's `kube-apiserver-kubelet-client`.
pub const KUBELET_CLIENT_GROUP: &str = "kube-apiserver-kubelet-client";

/// Everything a client needs to trust and authenticate to the API server.
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub admin_token: String,
    /// The API server's client certificate and key towards node agents.
    pub kubelet_client_cert_pem: String,
    pub kubelet_client_key_pem: String,
}

/// Writes a file only the owner can read, created `0600` (never briefly readable by others).
fn write_private(path: &Path, contents: &str) -> Result<()> {
    ferry_store::private_fs::write_private(path, contents.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
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
        // A new CA invalidates the certificates the old one issued (those issued by
        // [`Ca::ensure`] carry the CA's fingerprint and are re-issued on their own).
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
        params.subject_alt_names = san_types(&sans)?;
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
    let ca = Ca::load(data_dir)?;
    let (kc_crt, kc_key) = ca.ensure(
        &dir,
        "apiserver-kubelet-client",
        &Leaf::Client {
            user: KUBELET_CLIENT_USER.into(),
            groups: vec![KUBELET_CLIENT_GROUP.into()],
        },
    )?;
    Ok(Pki {
        ca_pem,
        cert_pem: fs::read_to_string(&crt_path)?,
        key_pem: fs::read_to_string(&key_path)?,
        admin_token: fs::read_to_string(&token_path)?.trim().to_string(),
        kubelet_client_cert_pem: fs::read_to_string(&kc_crt)?,
        kubelet_client_key_pem: fs::read_to_string(&kc_key)?,
    })
}

/// What a certificate issued by the cluster CA is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leaf {
    /// A client certificate: `CN` is the user, each `O` a group (as upstream's x509
    /// authenticator reads them).
    Client { user: String, groups: Vec<String> },
    /// A serving certificate for these DNS names and IP addresses.
    Serving { name: String, sans: Vec<String> },
}

impl Leaf {
    /// A stable description, kept beside the issued files to notice when they must be re-issued.
    fn describe(&self) -> String {
        match self {
            Leaf::Client { user, groups } => format!("client CN={user} O={}", groups.join(",")),
            Leaf::Serving { name, sans } => format!("serving CN={name} SAN={}", sans.join(",")),
        }
    }

    fn params(&self) -> Result<CertificateParams> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(2124, 1, 1);
        match self {
            Leaf::Client { user, groups } => {
                for g in groups {
                    params
                        .distinguished_name
                        .push(DnType::OrganizationName, g.as_str());
                }
                params
                    .distinguished_name
                    .push(DnType::CommonName, user.as_str());
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            }
            Leaf::Serving { name, sans } => {
                params
                    .distinguished_name
                    .push(DnType::CommonName, name.as_str());
                params.subject_alt_names = san_types(sans)?;
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                params.key_usages = vec![
                    KeyUsagePurpose::DigitalSignature,
                    KeyUsagePurpose::KeyEncipherment,
                ];
            }
        }
        Ok(params)
    }
}

fn san_types(sans: &[String]) -> Result<Vec<SanType>> {
    sans.iter()
        .map(|s| match s.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(s.as_str().try_into()?)),
        })
        .collect()
}

/// The cluster CA (`pki/ca.crt`, `pki/ca.key` in the data directory), able to issue leaves.
pub struct Ca {
    pub cert_pem: String,
    key_pem: String,
}

impl Ca {
    /// Loads the CA that [`load_or_create`] made in `data_dir`.
    pub fn load(data_dir: &Path) -> Result<Ca> {
        let dir = pki_dir(data_dir);
        let read = |f: &str| {
            fs::read_to_string(dir.join(f))
                .with_context(|| format!("reading {}", dir.join(f).display()))
        };
        Ok(Ca {
            cert_pem: read("ca.crt")?,
            key_pem: read("ca.key")?,
        })
    }

    /// Issues `leaf`: (certificate PEM, private key PEM).
    pub fn issue(&self, leaf: &Leaf) -> Result<(String, String)> {
        let ca = ca_params()?;
        let issuer = Issuer::from_params(&ca, KeyPair::from_pem(&self.key_pem)?);
        let key = KeyPair::generate()?;
        let cert = leaf.params()?.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// `dir/<base>.crt` and `dir/<base>.key` (mode 0600) for `leaf`, issued now unless the files
    /// already hold one for the same leaf from this CA.
    pub fn ensure(&self, dir: &Path, base: &str, leaf: &Leaf) -> Result<(PathBuf, PathBuf)> {
        use sha2::Digest;
        ferry_store::private_fs::ensure_private_dir(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let crt = dir.join(format!("{base}.crt"));
        let key = dir.join(format!("{base}.key"));
        let meta = dir.join(format!("{base}.issued"));
        let fingerprint = sha2::Sha256::digest(self.cert_pem.as_bytes());
        let wanted = format!(
            "ca-sha256={}\n{}\n",
            fingerprint
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            leaf.describe()
        );
        let current = fs::read_to_string(&meta).unwrap_or_default();
        if !crt.exists() || !key.exists() || current != wanted {
            let (cert_pem, key_pem) = self.issue(leaf)?;
            write_private(&key, &key_pem)?;
            write_private(&crt, &cert_pem)?;
            write_private(&meta, &wanted)?;
        }
        Ok((crt, key))
    }
}

/// Files of a node agent's serving certificate, issued by the cluster CA.
#[derive(Debug, Clone)]
pub struct AgentTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The cluster CA: the agent verifies callers' client certificates against it.
    pub ca_file: PathBuf,
}

/// Issues (or reuses) the serving certificate of node `node_name`'s agent, for its name and
/// addresses, under `data_dir/pki/agents/` — what `ferry up` gives its agent.
pub fn issue_agent_serving(
    data_dir: &Path,
    node_name: &str,
    addresses: &[IpAddr],
) -> Result<AgentTls> {
    let ca = Ca::load(data_dir)?;
    let mut sans = vec![node_name.to_string()];
    sans.extend(addresses.iter().map(IpAddr::to_string));
    let leaf = Leaf::Serving {
        name: format!("system:node:{node_name}"),
        sans,
    };
    let dir = pki_dir(data_dir).join("agents");
    let (cert_file, key_file) = ca.ensure(&dir, node_name, &leaf)?;
    Ok(AgentTls {
        cert_file,
        key_file,
        ca_file: pki_dir(data_dir).join("ca.crt"),
    })
}

/// The TLS client configuration of the API server towards node agents: it presents
/// `client_cert_pem`/`client_key_pem` and trusts agents whose serving certificate `ca_pem`
/// issued (kube-apiserver's `--kubelet-client-certificate`, `--kubelet-client-key`,
/// `--kubelet-certificate-authority`). HTTP/1.1 only (exec is an HTTP/1.1 upgrade).
pub fn kubelet_client_config(
    ca_pem: &str,
    client_cert_pem: &str,
    client_key_pem: &str,
) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.context("the kubelet certificate authority")?)
            .context("the kubelet certificate authority")?;
    }
    if roots.is_empty() {
        return Err(Error::EmptyKubeletCa);
    }
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(client_cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .context("the kubelet client certificate")?;
    let key = PrivateKeyDer::from_pem_slice(client_key_pem.as_bytes())
        .context("the kubelet client key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
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

/// Issues (or reuses) a client certificate for a component of `ferry up` (`CN` = `user`, one
/// `O` = `group`) and writes its own kubeconfig, mode 0600, as `data_dir/kubeconfigs/<base>`:
/// the API server at `server_url`, the cluster CA, and the certificate and key embedded.
pub fn component_kubeconfig(
    data_dir: &Path,
    server_url: &str,
    base: &str,
    user: &str,
    group: Option<&str>,
) -> Result<PathBuf> {
    let ca = Ca::load(data_dir)?;
    let leaf = Leaf::Client {
        user: user.to_string(),
        groups: group.map(|g| vec![g.to_string()]).unwrap_or_default(),
    };
    let (crt, key) = ca.ensure(&pki_dir(data_dir).join("components"), base, &leaf)?;
    let b64 = |p: &Path| -> Result<String> {
        let bytes = fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let ca_line = if server_url.starts_with("https://") {
        format!(
            "    certificate-authority-data: {}\n",
            base64::engine::general_purpose::STANDARD.encode(ca.cert_pem.as_bytes())
        )
    } else {
        String::new()
    };
    let contents = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ferry\n  cluster:\n    server: {server_url}\n{ca_line}contexts:\n- name: {base}\n  context:\n    cluster: ferry\n    user: {base}\ncurrent-context: {base}\nusers:\n- name: {base}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\npreferences: {{}}\n",
        b64(&crt)?,
        b64(&key)?,
    );
    let dir = data_dir.join("kubeconfigs");
    ferry_store::private_fs::ensure_private_dir(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(base);
    write_private(&path, &contents)?;
    Ok(path)
}

/// The kubeconfigs of `ferry up`'s components, each its own identity (see
/// [`ferry_auth::bootstrap`] for the ClusterRoles bound to them).
#[derive(Debug, Clone)]
pub struct ComponentKubeconfigs {
    /// `system:kube-controller-manager`.
    pub controllers: PathBuf,
    /// `system:kube-proxy` (bound to `system:node-proxier`).
    pub proxy: PathBuf,
    /// `system:ferry:dns`.
    pub dns: PathBuf,
    /// `system:ferry:ingress`.
    pub ingress: PathBuf,
    /// `system:ferry:netpol`.
    pub netpol: PathBuf,
}

/// Issues (or reuses) the components' client certificates and writes their kubeconfigs. Over
/// plain HTTP no client certificate can be presented: every component then uses `admin`.
pub fn component_kubeconfigs(
    data_dir: &Path,
    server_url: &str,
    admin: &Path,
) -> Result<ComponentKubeconfigs> {
    use ferry_auth::bootstrap as b;
    let kc = |base: &str, user: &str| {
        if server_url.starts_with("http://") {
            return Ok(admin.to_path_buf());
        }
        component_kubeconfig(data_dir, server_url, base, user, None)
    };
    Ok(ComponentKubeconfigs {
        controllers: kc("controllers", b::CONTROLLERS_USER)?,
        proxy: kc("proxy", b::PROXY_USER)?,
        dns: kc("dns", b::DNS_USER)?,
        ingress: kc("ingress", b::INGRESS_USER)?,
        netpol: kc("netpol", b::NETPOL_USER)?,
    })
}

/// The kubeconfig of node `node`'s agent: `system:node:<node>` in group `system:nodes` (`admin`
/// over plain HTTP).
pub fn node_kubeconfig(
    data_dir: &Path,
    server_url: &str,
    admin: &Path,
    node: &str,
) -> Result<PathBuf> {
    if server_url.starts_with("http://") {
        return Ok(admin.to_path_buf());
    }
    component_kubeconfig(
        data_dir,
        server_url,
        &format!("node-{node}"),
        &format!("{}{node}", ferry_auth::bootstrap::NODE_USER_PREFIX),
        Some(ferry_auth::user::NODES_GROUP),
    )
}

#[cfg(test)]
mod component_tests {
    use super::*;

    #[test]
    fn component_kubeconfigs_name_their_identity() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        load_or_create(dir.path(), &[]).expect("pki");
        let admin = dir.path().join("kubeconfig");
        let kcs =
            component_kubeconfigs(dir.path(), "https://127.0.0.1:6443", &admin).expect("issue");
        let node =
            node_kubeconfig(dir.path(), "https://127.0.0.1:6443", &admin, "n1").expect("node");
        let table = [
            (&kcs.controllers, "system:kube-controller-manager", vec![]),
            (&kcs.proxy, "system:kube-proxy", vec![]),
            (&kcs.dns, "system:ferry:dns", vec![]),
            (&kcs.ingress, "system:ferry:ingress", vec![]),
            (&kcs.netpol, "system:ferry:netpol", vec![]),
            (&node, "system:node:n1", vec!["system:nodes".to_string()]),
        ];
        for (path, user, groups) in table {
            let mode = fs::metadata(path).expect("file").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
            let text = fs::read_to_string(path).expect("read");
            assert!(text.contains("certificate-authority-data: "), "{text}");
            let line = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("client-certificate-data: "))
                .expect("certificate");
            let pem = base64::engine::general_purpose::STANDARD
                .decode(line)
                .expect("base64");
            let der = CertificateDer::pem_slice_iter(&pem)
                .next()
                .expect("one")
                .expect("pem");
            let u = crate::auth::certs::user_of_certificate(&der).expect("user");
            assert_eq!(u.name, user);
            let got: Vec<String> = u
                .groups
                .into_iter()
                .filter(|g| g != "system:authenticated")
                .collect();
            assert_eq!(got, groups);
        }
        // Issued once: a second call keeps the same certificate.
        let before = fs::read_to_string(&kcs.dns).expect("read");
        component_kubeconfigs(dir.path(), "https://127.0.0.1:6443", &admin).expect("again");
        assert_eq!(fs::read_to_string(&kcs.dns).expect("read"), before);
        // Plain HTTP: the admin kubeconfig for everyone.
        let plain =
            component_kubeconfigs(dir.path(), "http://127.0.0.1:6443", &admin).expect("plain");
        assert_eq!(plain.dns, admin);
        assert_eq!(
            node_kubeconfig(dir.path(), "http://127.0.0.1:6443", &admin, "n1").expect("node"),
            admin
        );
    }
}
