//! The agent's HTTPS endpoint (kubelet's port): `/containerLogs/<ns>/<pod>/<container>` and
//! `/exec/<ns>/<pod>/<container>` (WebSocket, `v5.channel.k8s.io` / `v4.channel.k8s.io`).
//! The API server proxies `pods/log` and `pods/exec` here.
//!
//! Security model (kubelet's, with x509 authentication and a local authorizer): HTTPS only;
//! callers authenticate with a client certificate verified against `--client-ca-file` (user =
//! the certificate's `CN`, groups = its `O`s, as upstream's x509 authenticator); requests
//! without one are refused with 401 and callers outside `--authorized-users` /
//! `--authorized-groups` with 403 — before anything runs. No bearer token is accepted. Without
//! a client CA the endpoint refuses to start unless `--insecure-allow-unauthenticated` says so.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::sync::CancellationToken;

use crate::runtime::{Runtime, exec_command};

type Body = BoxBody<Bytes, Infallible>;

/// The user the API server's kubelet client certificate names (ferry-apiserver's
/// `pki::KUBELET_CLIENT_USER`), allowed by default.
pub const APISERVER_USER: &str = "ferry-apiserver-kubelet-client";
/// Groups allowed by default: cluster administrators, as upstream's webhook authorizer grants
/// `system:masters` every kubelet API.
pub const DEFAULT_AUTHORIZED_GROUPS: &str = "system:masters";

/// An authenticated caller, from its verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    /// The identity a client certificate (DER) names: `CN` is the user, each `O` a group.
    /// `None` when the certificate cannot be parsed or has no `CN`.
    pub fn from_certificate(der: &[u8]) -> Option<Identity> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let user = subject
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .filter(|u| !u.is_empty())?
            .to_string();
        let groups = subject
            .iter_organization()
            .filter_map(|a| a.as_str().ok())
            .map(str::to_string)
            .collect();
        Some(Identity { user, groups })
    }
}

/// Who may use the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Callers must present a client certificate from the client CA and be one of these users
    /// or in one of these groups.
    Authorized {
        users: Vec<String>,
        groups: Vec<String>,
    },
    /// `--insecure-allow-unauthenticated`: anyone who reaches the port.
    Open,
}

/// What [`authorize`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// 401: no (valid) client certificate.
    Unauthorized,
    /// 403 with upstream kubelet's message.
    Forbidden(String),
}

/// The API verb and `nodes` subresource a request to the endpoint stands for (upstream
/// kubelet's mapping: `/stats` → stats, `/metrics` → metrics, `/logs/` → log, else proxy —
/// exec and container logs are `nodes/proxy`).
pub fn request_attributes(method: &Method, path: &str) -> (&'static str, &'static str) {
    let verb = match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    };
    let sub_of = |p: &str| path == p || path.starts_with(&format!("{p}/"));
    let subresource = if sub_of("/stats") {
        "stats"
    } else if sub_of("/metrics") {
        "metrics"
    } else if path.starts_with("/logs/") {
        "log"
    } else {
        "proxy"
    };
    (verb, subresource)
}

/// Decides whether `who` may make this request. Pure.
pub fn authorize(access: &Access, who: Option<&Identity>, method: &Method, path: &str) -> Decision {
    let (users, groups) = match access {
        Access::Open => return Decision::Allow,
        Access::Authorized { users, groups } => (users, groups),
    };
    let Some(who) = who else {
        return Decision::Unauthorized;
    };
    if users.iter().any(|u| u == &who.user) || who.groups.iter().any(|g| groups.contains(g)) {
        return Decision::Allow;
    }
    let (verb, subresource) = request_attributes(method, path);
    Decision::Forbidden(format!(
        "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{subresource}])",
        who.user
    ))
}

/// Why the endpoint cannot start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "refusing to serve the agent endpoint without client authentication: pass \
         --client-ca-file (the cluster CA, which issues the API server's kubelet client \
         certificate) or, to let anyone who reaches the port run commands in pods, \
         --insecure-allow-unauthenticated"
    )]
    NoClientAuthentication,
    #[error("--tls-cert-file and --tls-private-key-file go together")]
    HalfKeyPair,
    #[error("{what} {path}: {msg}")]
    File {
        what: &'static str,
        path: PathBuf,
        msg: String,
    },
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
}

/// How the endpoint is secured (the agent's flags).
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// `--tls-cert-file` / `--tls-private-key-file`; without them a self-signed certificate is
    /// made in `self_signed_dir`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// `--client-ca-file`: callers' client certificates must chain to it.
    pub client_ca_file: Option<PathBuf>,
    /// `--insecure-allow-unauthenticated`.
    pub insecure_allow_unauthenticated: bool,
    /// `--authorized-users` / `--authorized-groups`.
    pub authorized_users: Vec<String>,
    pub authorized_groups: Vec<String>,
    pub self_signed_dir: PathBuf,
    /// Names and addresses for a self-signed certificate.
    pub self_signed_sans: Vec<String>,
}

fn file_error(what: &'static str, path: &Path, msg: impl std::fmt::Display) -> EndpointError {
    EndpointError::File {
        what,
        path: path.to_path_buf(),
        msg: msg.to_string(),
    }
}

fn read_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, EndpointError> {
    let pem = std::fs::read(path).map_err(|e| file_error(what, path, e))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, EndpointError> {
    let pem = std::fs::read(path).map_err(|e| file_error("--tls-private-key-file", path, e))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| file_error("--tls-private-key-file", path, e))
}

fn write_private(path: &Path, contents: &str) -> Result<(), EndpointError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| file_error("writing", &tmp, e))?;
    f.write_all(contents.as_bytes())
        .map_err(|e| file_error("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| file_error("writing", path, e))
}

/// A self-signed serving certificate in `dir` (made once, then reused).
fn self_signed(dir: &Path, sans: &[String]) -> Result<(PathBuf, PathBuf), EndpointError> {
    let crt = dir.join("agent-self-signed.crt");
    let key = dir.join("agent-self-signed.key");
    let meta = dir.join("agent-self-signed.sans");
    let wanted = sans.join(",");
    if crt.exists() && key.exists() && std::fs::read_to_string(&meta).is_ok_and(|m| m == wanted) {
        return Ok((crt, key));
    }
    std::fs::create_dir_all(dir).map_err(|e| file_error("creating", dir, e))?;
    let pair = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ferry-agent (self-signed)");
    params.subject_alt_names = sans
        .iter()
        .map(|s| match s.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(rcgen::SanType::IpAddress(ip)),
            Err(_) => Ok::<_, rcgen::Error>(rcgen::SanType::DnsName(s.as_str().try_into()?)),
        })
        .collect::<Result<_, _>>()?;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(&pair)?;
    write_private(&key, &pair.serialize_pem())?;
    write_private(&crt, &cert.pem())?;
    write_private(&meta, &wanted)?;
    Ok((crt, key))
}

/// The rustls configuration and access policy of the endpoint, from its flags. Refuses an
/// endpoint without client authentication unless explicitly allowed.
pub fn tls_setup(o: &TlsOptions) -> Result<(Arc<rustls::ServerConfig>, Access), EndpointError> {
    if o.client_ca_file.is_none() && !o.insecure_allow_unauthenticated {
        return Err(EndpointError::NoClientAuthentication);
    }
    let (cert_file, key_file) = match (&o.cert_file, &o.key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        (None, None) => {
            let (c, k) = self_signed(&o.self_signed_dir, &o.self_signed_sans)?;
            tracing::warn!(
                "agent: no --tls-cert-file/--tls-private-key-file: serving a SELF-SIGNED \
                 certificate ({}); the API server verifies agents against the cluster CA and \
                 will refuse it — give the agent a serving certificate from the cluster CA",
                c.display()
            );
            (c, k)
        }
        _ => return Err(EndpointError::HalfKeyPair),
    };
    let certs = read_certs("--tls-cert-file", &cert_file)?;
    let key = read_key(&key_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &o.client_ca_file {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs("--client-ca-file", ca)? {
                roots
                    .add(c)
                    .map_err(|e| file_error("--client-ca-file", ca, e))?;
            }
            // A certificate, when presented, must chain to the CA (else the handshake fails);
            // requests without one get a 401 from [`authorize`] (as kubelet without anonymous
            // authentication).
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| file_error("--client-ca-file", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let access = if o.insecure_allow_unauthenticated {
        tracing::warn!(
            "agent: --insecure-allow-unauthenticated: THE AGENT ENDPOINT IS OPEN — anyone who \
             can reach it may read pod logs and RUN COMMANDS IN PODS (as this agent's user). \
             Use only on a trusted, isolated network."
        );
        Access::Open
    } else {
        Access::Authorized {
            users: o.authorized_users.clone(),
            groups: o.authorized_groups.clone(),
        }
    };
    Ok((Arc::new(cfg), access))
}

pub struct Endpoint {
    pub rt: Arc<Runtime>,
    /// The TLS configuration (the endpoint serves HTTPS only).
    pub tls: Arc<rustls::ServerConfig>,
    /// Who may call.
    pub access: Access,
}

fn text(code: u16, msg: impl Into<String>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(msg.into())).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// Percent-decodes a query component (`+` is a space).
pub fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// All `key=value` pairs of a query string, decoded, in order.
pub fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

fn flag(pairs: &[(String, String)], k: &str) -> bool {
    pairs
        .iter()
        .any(|(n, v)| n == k && matches!(v.as_str(), "1" | "true" | "True" | "TRUE" | ""))
}

#[cfg(test)]
fn get<'a>(pairs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

impl Endpoint {
    /// Answers one request of the caller `who` (from its verified client certificate).
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        who: Option<&Identity>,
    ) -> Response<Body> {
        let path = req.uri().path().to_string();
        if path == "/healthz" {
            return text(200, "ok");
        }
        match authorize(&self.access, who, req.method(), &path) {
            Decision::Allow => {}
            Decision::Unauthorized => return text(401, "Unauthorized"),
            Decision::Forbidden(msg) => {
                tracing::info!("agent endpoint: {msg}");
                return text(403, msg);
            }
        }
        let pairs = query_pairs(req.uri().query());
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segs.as_slice() {
            ["containerLogs", ns, pod, container] => self.logs(ns, pod, container, &pairs).await,
            ["exec", ns, pod, container] if upgrade_of(&req) == Some(Upgrade::Spdy) => {
                self.spdy_command(req, ns, pod, container, &pairs)
            }
            ["exec", ns, pod, container] => self.exec(req, ns, pod, container, &pairs),
            ["portForward", ns, pod] => self.port_forward(req, ns, pod, &pairs),
            ["attach", ns, pod, container] => self.attach(req, ns, pod, container, &pairs),
            _ => text(404, "404 page not found"),
        }
    }

    async fn logs(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        q: &[(String, String)],
    ) -> Response<Body> {
        let Some(shared) = self.rt.find(ns, pod) else {
            return text(404, format!("pod {ns}/{pod} is not running on this node"));
        };
        let Some(info) = shared
            .containers
            .lock()
            .ok()
            .and_then(|m| m.get(container).cloned())
        else {
            return text(
                400,
                format!("container {container:?} in pod {pod:?} is waiting to start"),
            );
        };
        let previous = flag(q, "previous");
        let restart = if previous {
            if info.restart_count == 0 {
                return text(
                    400,
                    format!("previous terminated container {container:?} in pod {pod:?} not found"),
                );
            }
            info.restart_count - 1
        } else {
            info.restart_count
        };
        let file = info.log_dir.join(format!("{restart}.log"));
        let opts = match crate::logs::options_from_query(q, jiff::Timestamp::now()) {
            Ok(o) => o,
            Err(e) => return text(400, e.to_string()),
        };
        let (first, offset) = crate::logs::read_logs(&file, &opts).await;
        // Following goes on after the first window unless limitBytes was used up.
        let used_up = opts.limit_bytes.is_some_and(|l| first.len() >= l);
        let follow = flag(q, "follow") && !previous && !used_up;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let mut budget = opts.limit_bytes.map(|l| l - first.len().min(l));
        let _ = tx.try_send(Bytes::from(first));
        if follow {
            let shared = shared.clone();
            let container = container.to_string();
            tokio::spawn(async move {
                let Ok(mut f) = tokio::fs::File::open(&file).await else {
                    return;
                };
                if f.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 16384];
                let mut carry: Vec<u8> = Vec::new();
                let mut at_line_start = true;
                let mut last_round = false;
                loop {
                    match f.read(&mut buf).await {
                        Ok(0) => {
                            if last_round {
                                return;
                            }
                            let running = shared
                                .containers
                                .lock()
                                .ok()
                                .and_then(|m| m.get(&container).map(|i| (i.pid, i.restart_count)))
                                .is_some_and(|(pid, rc)| pid.is_some() && rc == restart);
                            if tx.is_closed() {
                                return;
                            }
                            if !running {
                                // One more pass for what was stored before the exit.
                                last_round = true;
                                tokio::time::sleep(Duration::from_millis(200)).await;
                                continue;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Ok(n) => {
                            carry.extend_from_slice(&buf[..n]);
                            let cut = carry.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                            let mut out = Vec::new();
                            crate::logs::render(&carry[..cut], &opts, &mut at_line_start, &mut out);
                            carry.drain(..cut);
                            if let Some(b) = budget.as_mut() {
                                out.truncate(*b);
                                *b -= out.len();
                            }
                            let done = budget == Some(0);
                            if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                                return;
                            }
                            if done {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            });
        } else {
            drop(tx);
        }
        let stream = tokio_stream_from(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
        Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "text/plain")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap_or_else(|_| text(500, "response"))
    }

    fn exec(
        &self,
        req: Request<Incoming>,
        ns: &str,
        pod: &str,
        container: &str,
        q: &[(String, String)],
    ) -> Response<Body> {
        let is_ws = req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        if !is_ws {
            return text(
                400,
                "only WebSocket exec (v5.channel.k8s.io / v4.channel.k8s.io) is supported",
            );
        }
        let offered: Vec<String> = req
            .headers()
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(',').map(|s| s.trim().to_string()))
            .collect();
        let Some(proto) = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
            .into_iter()
            .find(|p| offered.iter().any(|o| o == p))
        else {
            return text(
                400,
                format!(
                    "unsupported exec subprotocols {offered:?}: want v5.channel.k8s.io or v4.channel.k8s.io"
                ),
            );
        };
        let Some(key) = req
            .headers()
            .get(header::SEC_WEBSOCKET_KEY)
            .map(|k| k.as_bytes().to_vec())
        else {
            return text(400, "missing Sec-WebSocket-Key");
        };
        let Some(shared) = self.rt.find(ns, pod) else {
            return text(404, format!("pod {ns}/{pod} is not running on this node"));
        };
        let Some(info) = shared
            .containers
            .lock()
            .ok()
            .and_then(|m| m.get(container).cloned())
        else {
            return text(
                404,
                format!("container {container:?} not found in pod {pod:?}"),
            );
        };
        let command: Vec<String> = q
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        let want_stdin = flag(q, "stdin");
        let want_stdout = flag(q, "stdout");
        let want_stderr = flag(q, "stderr");
        let tty = flag(q, "tty");
        let cmd = if tty {
            exec_command(&shared, &info, &crate::pty::with_controlling_tty(&command))
        } else {
            exec_command(&shared, &info, &command)
        };
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
        let v5 = proto.starts_with("v5");
        tokio::spawn(async move {
            let upgraded = match hyper::upgrade::on(req).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!("exec upgrade: {e}");
                    return;
                }
            };
            let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                hyper_util::rt::TokioIo::new(upgraded),
                Role::Server,
                None,
            )
            .await;
            if tty {
                crate::streaming::run_ws_exec_tty(ws, cmd, command, want_stdin, v5).await;
            } else {
                run_exec(ws, cmd, command, want_stdin, want_stdout, want_stderr, v5).await;
            }
        });
        Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::UPGRADE, "websocket")
            .header(header::CONNECTION, "Upgrade")
            .header(header::SEC_WEBSOCKET_ACCEPT, accept)
            .header(header::SEC_WEBSOCKET_PROTOCOL, proto)
            .body(Full::new(Bytes::new()).boxed())
            .unwrap_or_else(|_| text(500, "response"))
    }
}

/// The protocol a request asks to upgrade to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    Spdy,
    WebSocket,
}

pub fn upgrade_of<B>(req: &Request<B>) -> Option<Upgrade> {
    let v = req.headers().get(header::UPGRADE)?.to_str().ok()?;
    if v.eq_ignore_ascii_case("websocket") {
        Some(Upgrade::WebSocket)
    } else if v.to_ascii_uppercase().starts_with("SPDY/3") {
        Some(Upgrade::Spdy)
    } else {
        None
    }
}

fn header_values<B>(req: &Request<B>, name: &str) -> Vec<String> {
    let vals: Vec<&str> = req
        .headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    crate::streaming::header_list(&vals)
}

fn spdy_switch(protocol: &str) -> Response<Body> {
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", protocol)
        .body(Full::new(Bytes::new()).boxed())
        .unwrap_or_else(|_| text(500, "response"))
}

fn ws_switch(key: &[u8], protocol: &str) -> Response<Body> {
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key);
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(Full::new(Bytes::new()).boxed())
        .unwrap_or_else(|_| text(500, "response"))
}

impl Endpoint {
    /// `exec` over SPDY (kubectl up to 1.29, client-go's SPDY executor).
    fn spdy_command(
        &self,
        req: Request<Incoming>,
        ns: &str,
        pod: &str,
        container: &str,
        q: &[(String, String)],
    ) -> Response<Body> {
        use crate::streaming::{CommandOptions, REMOTECOMMAND_PROTOCOLS, negotiate};
        let offered = header_values(&req, "x-stream-protocol-version");
        let Some(protocol) = negotiate(&offered, REMOTECOMMAND_PROTOCOLS) else {
            return text(
                403,
                format!(
                    "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {REMOTECOMMAND_PROTOCOLS:?}"
                ),
            );
        };
        let Some(shared) = self.rt.find(ns, pod) else {
            return text(404, format!("pod {ns}/{pod} is not running on this node"));
        };
        let Some(info) = shared
            .containers
            .lock()
            .ok()
            .and_then(|m| m.get(container).cloned())
        else {
            return text(
                404,
                format!("container {container:?} not found in pod {pod:?}"),
            );
        };
        let opts = CommandOptions {
            command: q
                .iter()
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| v.clone())
                .collect(),
            stdin: flag(q, "stdin"),
            stdout: flag(q, "stdout"),
            stderr: flag(q, "stderr"),
            tty: flag(q, "tty"),
        };
        if !(opts.stdin || opts.stdout || opts.stderr) {
            return text(400, "you must specify at least 1 of stdin, stdout, stderr");
        }
        let cmd = if opts.tty {
            exec_command(
                &shared,
                &info,
                &crate::pty::with_controlling_tty(&opts.command),
            )
        } else {
            exec_command(&shared, &info, &opts.command)
        };
        on_upgrade(req, "exec", move |io| {
            crate::streaming::serve_spdy_exec(io, protocol, opts, cmd)
        });
        spdy_switch(protocol)
    }

    /// `attach` to a running container: SPDY or WebSocket.
    fn attach(
        &self,
        req: Request<Incoming>,
        ns: &str,
        pod: &str,
        container: &str,
        q: &[(String, String)],
    ) -> Response<Body> {
        use crate::streaming::{CommandOptions, REMOTECOMMAND_PROTOCOLS, negotiate};
        let Some(shared) = self.rt.find(ns, pod) else {
            return text(404, format!("pod {ns}/{pod} is not running on this node"));
        };
        let Some(cio) = shared.containers.lock().ok().and_then(|m| {
            m.get(container)
                .filter(|i| i.pid.is_some())
                .and_then(|i| i.io.clone())
        }) else {
            return text(
                400,
                format!("container {container} not found or not running in pod {pod}"),
            );
        };
        let opts = CommandOptions {
            command: Vec::new(),
            stdin: flag(q, "stdin"),
            stdout: flag(q, "stdout"),
            stderr: flag(q, "stderr"),
            tty: flag(q, "tty"),
        };
        if !(opts.stdin || opts.stdout || opts.stderr) {
            return text(400, "you must specify at least 1 of stdin, stdout, stderr");
        }
        match upgrade_of(&req) {
            Some(Upgrade::Spdy) => {
                let offered = header_values(&req, "x-stream-protocol-version");
                let Some(protocol) = negotiate(&offered, REMOTECOMMAND_PROTOCOLS) else {
                    return text(
                        403,
                        format!(
                            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}"
                        ),
                    );
                };
                on_upgrade(req, "attach", move |io| {
                    crate::streaming::serve_spdy_attach(io, protocol, opts, cio)
                });
                spdy_switch(protocol)
            }
            Some(Upgrade::WebSocket) => {
                let offered = header_values(&req, "sec-websocket-protocol");
                let Some(protocol) =
                    negotiate(&offered, &["v5.channel.k8s.io", "v4.channel.k8s.io"])
                else {
                    return text(
                        400,
                        format!(
                            "unsupported attach subprotocols {offered:?}: want v5.channel.k8s.io or v4.channel.k8s.io"
                        ),
                    );
                };
                let Some(key) = req
                    .headers()
                    .get(header::SEC_WEBSOCKET_KEY)
                    .map(|k| k.as_bytes().to_vec())
                else {
                    return text(400, "missing Sec-WebSocket-Key");
                };
                on_upgrade(req, "attach", move |io| async move {
                    let ws = server_websocket(io).await;
                    crate::streaming::serve_ws_attach(ws, protocol.starts_with("v5"), opts, cio)
                        .await;
                });
                ws_switch(&key, protocol)
            }
            None => text(400, "attach needs an upgrade to SPDY/3.1 or WebSocket"),
        }
    }

    /// `portForward`: SPDY, SPDY tunnelled in WebSocket, or WebSocket channels.
    fn port_forward(
        &self,
        req: Request<Incoming>,
        ns: &str,
        pod: &str,
        q: &[(String, String)],
    ) -> Response<Body> {
        use crate::streaming::{
            PORTFORWARD_PROTOCOL, TUNNEL_PROTOCOL, WS_PORTFORWARD_PROTOCOL, negotiate,
        };
        let target = match crate::streaming::pod_target(&self.rt, ns, pod) {
            Ok(t) => t,
            Err(e) => return text(404, e.to_string()),
        };
        let name = format!("{ns}/{pod}");
        match upgrade_of(&req) {
            Some(Upgrade::Spdy) => {
                let offered = header_values(&req, "x-stream-protocol-version");
                if negotiate(&offered, &[PORTFORWARD_PROTOCOL]).is_none() {
                    return text(
                        403,
                        format!(
                            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts [\"{PORTFORWARD_PROTOCOL}\"]"
                        ),
                    );
                }
                on_upgrade(req, "portforward", move |io| {
                    crate::streaming::serve_spdy_portforward(io, target, name)
                });
                spdy_switch(PORTFORWARD_PROTOCOL)
            }
            Some(Upgrade::WebSocket) => {
                let offered = header_values(&req, "sec-websocket-protocol");
                let Some(protocol) =
                    negotiate(&offered, &[TUNNEL_PROTOCOL, WS_PORTFORWARD_PROTOCOL])
                else {
                    return text(
                        400,
                        format!(
                            "unsupported port-forward subprotocols {offered:?}: want {TUNNEL_PROTOCOL} or {WS_PORTFORWARD_PROTOCOL}"
                        ),
                    );
                };
                let ports = if protocol == WS_PORTFORWARD_PROTOCOL {
                    match crate::streaming::ws_ports(q) {
                        Ok(p) => p,
                        Err(e) => return text(400, e.to_string()),
                    }
                } else {
                    Vec::new()
                };
                let Some(key) = req
                    .headers()
                    .get(header::SEC_WEBSOCKET_KEY)
                    .map(|k| k.as_bytes().to_vec())
                else {
                    return text(400, "missing Sec-WebSocket-Key");
                };
                on_upgrade(req, "portforward", move |io| async move {
                    let ws = server_websocket(io).await;
                    if protocol == TUNNEL_PROTOCOL {
                        let io = crate::streaming::ws_byte_stream(ws);
                        crate::streaming::serve_spdy_portforward(io, target, name).await;
                    } else {
                        crate::streaming::serve_ws_portforward(ws, target, ports, name).await;
                    }
                });
                ws_switch(&key, protocol)
            }
            None => text(
                400,
                "port forwarding needs an upgrade to SPDY/3.1 or WebSocket",
            ),
        }
    }
}

pub(crate) fn normal_close() -> Message {
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures::Stream<Item = Bytes> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The `Status` sent on the error channel when the command ends.
pub fn exit_status(
    command: &[String],
    code: Option<i32>,
    err: Option<String>,
) -> serde_json::Value {
    match (code, err) {
        (_, Some(e)) => json!({"metadata": {}, "status": "Failure", "message": e,
            "reason": "InternalError", "code": 500}),
        (Some(0), None) => json!({"metadata": {}, "status": "Success"}),
        (c, None) => {
            let c = c.unwrap_or(1);
            json!({"metadata": {}, "status": "Failure",
                "message": format!("command terminated with non-zero exit code: error executing command {command:?}, exit code {c}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": c.to_string()}]}})
        }
    }
}

async fn run_exec<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    cmd: Result<tokio::process::Command, crate::streaming::StreamError>,
    command: Vec<String>,
    want_stdin: bool,
    want_stdout: bool,
    want_stderr: bool,
    v5: bool,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (otx, mut orx) = tokio::sync::mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(m) = orx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let send_status = |v: serde_json::Value| {
        let mut b = vec![3u8];
        b.extend(serde_json::to_vec(&v).unwrap_or_default());
        Message::Binary(b.into())
    };
    let mut cmd = match cmd {
        Ok(c) => c,
        Err(e) => {
            let _ = otx
                .send(send_status(exit_status(
                    &command,
                    None,
                    Some(e.to_string()),
                )))
                .await;
            let _ = otx.send(normal_close()).await;
            drop(otx);
            let _ = writer.await;
            return;
        }
    };
    cmd.stdin(if want_stdin {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stdout(if want_stdout {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stderr(if want_stderr {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("failed to exec in container: {e}");
            let _ = otx
                .send(send_status(exit_status(&command, None, Some(msg))))
                .await;
            let _ = otx.send(normal_close()).await;
            drop(otx);
            let _ = writer.await;
            return;
        }
    };
    let mut pumps = tokio::task::JoinSet::new();
    for (ch, pipe) in [
        (
            1u8,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            2u8,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let Some(mut pipe) = pipe else { continue };
        let otx = otx.clone();
        pumps.spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match pipe.read(&mut buf[1..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        buf[0] = ch;
                        if otx
                            .send(Message::Binary(Bytes::copy_from_slice(&buf[..n + 1])))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
    }
    let mut stdin = child.stdin.take();
    let client_gone = CancellationToken::new();
    let reader = {
        let client_gone = client_gone.clone();
        tokio::spawn(async move {
            while let Some(m) = stream.next().await {
                match m {
                    Ok(Message::Binary(b)) if !b.is_empty() => match b[0] {
                        0 => {
                            if let Some(s) = stdin.as_mut()
                                && s.write_all(&b[1..]).await.is_err()
                            {
                                stdin = None;
                            }
                        }
                        255 if v5 && b.get(1) == Some(&0) => stdin = None,
                        _ => {}
                    },
                    Ok(Message::Close(_)) | Err(_) => break,
                    _ => {}
                }
            }
            client_gone.cancel();
        })
    };
    let code = tokio::select! {
        st = child.wait() => st.ok().and_then(|s| s.code().or(Some(1))),
        _ = client_gone.cancelled() => { let _ = child.kill().await; None }
    };
    while pumps.join_next().await.is_some() {}
    let mut reader = reader;
    if !client_gone.is_cancelled() {
        let _ = otx
            .send(send_status(exit_status(&command, code, None)))
            .await;
        let _ = otx.send(normal_close()).await;
    }
    drop(otx);
    let _ = writer.await;
    // Wait for the client's close reply before the connection is dropped: dropping it first
    // can reset it, and the status still on its way through the API server would be lost.
    if tokio::time::timeout(Duration::from_secs(5), &mut reader)
        .await
        .is_err()
    {
        reader.abort();
    }
}

/// How long a client may take to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the endpoint (HTTPS) until `stop`. A plain-HTTP request gets a 400 and the
/// connection is closed, as Go's servers answer.
pub async fn serve(ep: Arc<Endpoint>, listener: TcpListener, stop: CancellationToken) {
    let acceptor = tokio_rustls::TlsAcceptor::from(ep.tls.clone());
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("agent endpoint: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let ep = ep.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let mut first = [0u8; 1];
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
                Ok(Ok(1)) if first[0] != 0x16 => {
                    let mut stream = stream;
                    let _ = stream
                        .write_all(
                            b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\r\n\
                              Client sent an HTTP request to an HTTPS server.\n",
                        )
                        .await;
                    let _ = stream.shutdown().await;
                    return;
                }
                Ok(Ok(1)) => {}
                _ => return,
            }
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::info!("agent endpoint: TLS handshake with {peer} refused: {e}");
                    return;
                }
                Err(_) => return,
            };
            let who: Option<Arc<Identity>> = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| Identity::from_certificate(c))
                .map(Arc::new);
            let svc = hyper::service::service_fn(move |req| {
                let ep = ep.clone();
                let who = who.clone();
                async move { Ok::<_, Infallible>(ep.handle(req, who.as_deref()).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .with_upgrades()
                .await;
        });
    }
}

type UpgradedIo = hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>;

/// Serves the connection `req` upgrades to (SPDY or WebSocket), once the switching response
/// has gone out.
fn on_upgrade<F, Fut>(req: Request<Incoming>, what: &'static str, serve: F)
where
    F: FnOnce(UpgradedIo) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(u) => serve(hyper_util::rt::TokioIo::new(u)).await,
            Err(e) => tracing::debug!("{what} upgrade: {e}"),
        }
    });
}

/// The server side of a WebSocket over an upgraded connection.
async fn server_websocket(io: UpgradedIo) -> tokio_tungstenite::WebSocketStream<UpgradedIo> {
    tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Server, None).await
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn query_decoding() {
        let p = query_pairs(Some(
            "command=cat&command=%2Fetc%2Fresolv.conf&stdout=true&x=a+b&stdin",
        ));
        assert_eq!(get(&p, "x"), Some("a b"));
        let cmds: Vec<&str> = p
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(cmds, vec!["cat", "/etc/resolv.conf"]);
        assert!(flag(&p, "stdout") && flag(&p, "stdin") && !flag(&p, "stderr"));
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
    }

    fn id(user: &str, groups: &[&str]) -> Identity {
        Identity {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn authorization() {
        let access = Access::Authorized {
            users: vec![APISERVER_USER.into()],
            groups: vec!["system:masters".into()],
        };
        let apiserver = id(APISERVER_USER, &["kube-apiserver-kubelet-client"]);
        let admin = id("kubernetes-admin", &["system:masters"]);
        let node = id("system:node:a", &["system:nodes"]);
        let lookalike = id("ferry-apiserver-kubelet-client-2", &["system:masters-x"]);
        let exec = "/exec/default/p/c";
        let logs = "/containerLogs/default/p/c";
        for (who, method, path, want) in [
            (Some(&apiserver), Method::GET, exec, Decision::Allow),
            (Some(&apiserver), Method::POST, exec, Decision::Allow),
            (Some(&apiserver), Method::GET, logs, Decision::Allow),
            (Some(&admin), Method::GET, exec, Decision::Allow),
            (None, Method::GET, exec, Decision::Unauthorized),
            (None, Method::GET, logs, Decision::Unauthorized),
            (
                Some(&node),
                Method::POST,
                exec,
                Decision::Forbidden(
                    "Forbidden (user=system:node:a, verb=create, resource=nodes, subresource(s)=[proxy])"
                        .into(),
                ),
            ),
            (
                Some(&lookalike),
                Method::GET,
                "/stats/summary",
                Decision::Forbidden(
                    "Forbidden (user=ferry-apiserver-kubelet-client-2, verb=get, resource=nodes, subresource(s)=[stats])"
                        .into(),
                ),
            ),
        ] {
            assert_eq!(authorize(&access, who, &method, path), want, "{who:?} {method} {path}");
        }
        assert_eq!(
            authorize(&Access::Open, None, &Method::GET, exec),
            Decision::Allow
        );
        let nobody = Access::Authorized {
            users: vec![],
            groups: vec![],
        };
        assert!(matches!(
            authorize(&nobody, Some(&admin), &Method::GET, exec),
            Decision::Forbidden(_)
        ));
    }

    #[test]
    fn attributes() {
        for (m, p, want) in [
            (Method::GET, "/exec/a/b/c", ("get", "proxy")),
            (Method::POST, "/exec/a/b/c", ("create", "proxy")),
            (Method::GET, "/containerLogs/a/b/c", ("get", "proxy")),
            (Method::GET, "/logs/syslog", ("get", "log")),
            (Method::GET, "/logs", ("get", "proxy")),
            (Method::GET, "/metrics", ("get", "metrics")),
            (Method::GET, "/metrics/cadvisor", ("get", "metrics")),
            (Method::GET, "/metricsx", ("get", "proxy")),
            (Method::GET, "/stats/summary", ("get", "stats")),
            (Method::DELETE, "/pods", ("delete", "proxy")),
            (Method::PUT, "/x", ("update", "proxy")),
            (Method::PATCH, "/x", ("patch", "proxy")),
        ] {
            assert_eq!(request_attributes(&m, p), want, "{m} {p}");
        }
    }

    #[test]
    fn identities_from_certificates() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "g1");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(
            Identity::from_certificate(cert.der()),
            Some(id("alice", &["g1"]))
        );
        // No CN: no identity.
        let params = rcgen::CertificateParams::new(vec!["x".to_string()]).expect("params");
        let mut params = params;
        params.distinguished_name = rcgen::DistinguishedName::new();
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(Identity::from_certificate(cert.der()), None);
        assert_eq!(Identity::from_certificate(b"not a certificate"), None);
    }

    #[test]
    fn refuses_to_start_open_without_the_flag() {
        let dir = tempfile::tempdir().expect("tmp");
        let o = TlsOptions {
            self_signed_dir: dir.path().to_path_buf(),
            self_signed_sans: vec!["127.0.0.1".into()],
            ..Default::default()
        };
        assert!(matches!(
            tls_setup(&o),
            Err(EndpointError::NoClientAuthentication)
        ));
        let open = TlsOptions {
            insecure_allow_unauthenticated: true,
            ..o.clone()
        };
        let (_, access) = tls_setup(&open).expect("insecure");
        assert_eq!(access, Access::Open);
        assert!(dir.path().join("agent-self-signed.crt").exists());
        let half = TlsOptions {
            cert_file: Some(dir.path().join("agent-self-signed.crt")),
            insecure_allow_unauthenticated: true,
            ..o
        };
        assert!(matches!(tls_setup(&half), Err(EndpointError::HalfKeyPair)));
    }

    #[test]
    fn statuses() {
        let c = vec!["sh".to_string(), "-c".to_string(), "exit 3".to_string()];
        assert_eq!(exit_status(&c, Some(0), None)["status"], "Success");
        let f = exit_status(&c, Some(3), None);
        assert_eq!(f["reason"], "NonZeroExitCode");
        assert_eq!(f["details"]["causes"][0]["message"], "3");
    }
}
