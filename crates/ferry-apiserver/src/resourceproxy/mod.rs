//! The `proxy` subresources of pods, services and nodes
//! (`/api/v1/namespaces/<ns>/pods/<[scheme:]name[:port]>/proxy/<path>`, `services/...`,
//! `/api/v1/nodes/<[scheme:]name[:port]>/proxy/<path>`), as kube-apiserver serves them: every
//! method, the query string and the body passed on, WebSocket and other upgrades spliced, the
//! answer streamed back. Where the request goes is [`location`] (pure).
//!
//! How the API server reaches pods is a [`PodNetwork`]: by default it dials pod IPs directly and
//! allows only global unicast addresses (upstream's rule); `ferry up` allows its loopback pod
//! range, and in netns mode dials from the cluster network namespace (where every node's pod
//! CIDR is routed), so no agent endpoint is needed. `nodes/<name>/proxy` goes to the node
//! agent over TLS with the API server's kubelet client certificate, like `pods/log`.

pub mod location;

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::alloc::Cidr;
use crate::server::{Body, Server, error_response};
use crate::status::ApiError;
use location::{Kind, Location, ProxyPath};

/// A boxed future of a TCP connection.
pub type Dialing = Pin<Box<dyn Future<Output = io::Result<tokio::net::TcpStream>> + Send>>;

/// How the API server reaches pod (and node) addresses.
pub trait PodNetwork: Send + Sync {
    /// Whether a pod IP may be dialled (upstream: global unicast only).
    fn allowed(&self, ip: IpAddr) -> bool;
    /// A TCP connection to `addr`.
    fn dial(&self, addr: SocketAddr) -> Dialing;
}

/// Pods reached from the API server's own network namespace; `loopback` lists loopback ranges
/// that are pod ranges (ferry up's loopback pod network).
#[derive(Debug, Default, Clone)]
pub struct Direct {
    pub loopback: Vec<Cidr>,
}

impl PodNetwork for Direct {
    fn allowed(&self, ip: IpAddr) -> bool {
        location::is_global_unicast(ip)
            || (ip.is_loopback() && self.loopback.iter().any(|c| c.contains(&ip)))
    }

    fn dial(&self, addr: SocketAddr) -> Dialing {
        Box::pin(async move {
            match tokio::time::timeout(
                std::time::Duration::from_secs(30),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "i/o timeout")),
            }
        })
    }
}

/// A dial error as Go's net package prints it (`dial tcp 10.0.0.1:80: connect: connection
/// refused`).
fn dial_error(addr: &str, e: &io::Error) -> String {
    let what = match e.kind() {
        io::ErrorKind::ConnectionRefused => "connect: connection refused".to_string(),
        io::ErrorKind::TimedOut => "i/o timeout".to_string(),
        io::ErrorKind::HostUnreachable => "connect: no route to host".to_string(),
        io::ErrorKind::NetworkUnreachable => "connect: network is unreachable".to_string(),
        _ => format!("connect: {e}"),
    };
    format!("dial tcp {addr}: {what}")
}

/// Upstream's wrapping transport: a backend that cannot be reached is a 503.
fn unreachable(msg: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        503,
        "ServiceUnavailable",
        format!("error trying to reach service: {msg}"),
    )
}

/// Headers that are not passed on (hop-by-hop, and the credentials the API server consumed).
fn dropped(name: &HeaderName, upgrade: bool) -> bool {
    let n = name.as_str();
    let hop = matches!(
        n,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    );
    (hop && !(upgrade && (n == "connection" || n == "upgrade"))) || n == "authorization"
}

/// Serves a proxy request.
pub async fn handle(
    server: Arc<Server>,
    req: Request<Incoming>,
    path: &ProxyPath,
) -> Response<Body> {
    match proxy(server, req, path).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn object(
    server: &Server,
    plural: &str,
    ns: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    let res = server
        .api
        .resource("", "v1", plural)
        .cloned()
        .ok_or_else(ApiError::not_found_path)?;
    crate::auth::lookup(&server.api, "", plural, ns, name)
        .ok_or_else(|| ApiError::not_found(res.info(), name))
}

/// Where the request goes, and how to get there.
enum Target {
    /// A pod, service endpoint or node port, through the pod network.
    Plain(Location),
    /// The node agent over TLS with the kubelet client certificate.
    Agent(String),
}

async fn locate(server: &Server, p: &ProxyPath) -> Result<Target, ApiError> {
    let invalid = || {
        ApiError::bad_request(format!(
            "invalid {} request {}",
            match p.kind {
                Kind::Pods => "pod",
                Kind::Services => "service",
                Kind::Nodes => "node",
            },
            ferry_auth::message::go_quote(&p.id)
        ))
    };
    let (scheme, name, port) = location::split_scheme_name_port(&p.id).ok_or_else(invalid)?;
    let ns = p.namespace.as_deref();
    let net = server.pod_network();
    match p.kind {
        Kind::Pods => {
            let pod = object(server, "pods", ns, name).await?;
            let allowed = |ip: IpAddr| net.allowed(ip);
            location::pod_location(&pod, scheme, port, &allowed).map(Target::Plain)
        }
        Kind::Services => {
            let ns = ns.unwrap_or("default");
            let mut port_name = port.to_string();
            if port.parse::<i64>().is_ok() {
                let svc = object(server, "services", Some(ns), name).await?;
                port_name = location::service_port_name(&svc, name, port)?;
            }
            let eps = object(server, "endpoints", Some(ns), name).await?;
            let pod_ips = |pod: &str| {
                crate::auth::lookup(&server.api, "", "pods", Some(ns), pod).map(|p| {
                    p.pointer("/status/podIPs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|i| i.get("ip").and_then(Value::as_str).map(String::from))
                        .collect()
                })
            };
            let seed = rand::random::<u32>() as usize;
            location::service_location(&eps, ns, &p.id, scheme, name, &port_name, seed, &pod_ips)
                .map(Target::Plain)
        }
        Kind::Nodes => {
            let node = object(server, "nodes", None, name).await?;
            let agent = crate::podproxy::agent_address(&node).ok_or_else(|| {
                ApiError::new(
                    503,
                    "ServiceUnavailable",
                    format!("node {name} does not report an agent endpoint"),
                )
            })?;
            let agent_port = node
                .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
                .and_then(Value::as_u64)
                .map(|p| p.to_string())
                .unwrap_or_default();
            if port.is_empty() || port == agent_port {
                return Ok(Target::Agent(agent));
            }
            // Another port of the node: its InternalIP, through the pod network.
            let ip = node
                .pointer("/status/addresses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|a| a.get("type").and_then(Value::as_str) == Some("InternalIP"))
                .and_then(|a| a.get("address").and_then(Value::as_str))
                .and_then(|a| a.parse::<IpAddr>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(format!("no preferred addresses found for node {name}"))
                })?;
            let port = port
                .parse::<u16>()
                .map_err(|_| ApiError::bad_request(format!("invalid port {port:?}")))?;
            Ok(Target::Plain(Location {
                scheme: if scheme.is_empty() { "http" } else { scheme }.to_string(),
                ip,
                port: Some(port),
            }))
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Accepts any certificate: upstream's proxy transport to pods and services does not verify
/// them either (`InsecureSkipVerify`).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn insecure_tls() -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

async fn connect(server: &Server, target: &Target) -> Result<(Box<dyn Io>, String), ApiError> {
    match target {
        Target::Agent(addr) => {
            let sa: SocketAddr = tokio::net::lookup_host(addr.as_str())
                .await
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| unreachable(format!("dial tcp {addr}: no such host")))?;
            let stream = tokio::net::TcpStream::connect(sa)
                .await
                .map_err(|e| unreachable(dial_error(addr, &e)))?;
            let name = crate::podproxy::server_name(addr)
                .ok_or_else(|| unreachable(format!("invalid agent address {addr}")))?;
            let tls = tokio_rustls::TlsConnector::from(server.kubelet_tls.clone())
                .connect(name, stream)
                .await
                .map_err(|e| unreachable(format!("tls: agent {addr}: {e}")))?;
            Ok((Box::new(tls), addr.clone()))
        }
        Target::Plain(loc) => {
            let addr = SocketAddr::new(loc.ip, loc.port_or_default());
            let stream = server
                .pod_network()
                .dial(addr)
                .await
                .map_err(|e| unreachable(dial_error(&addr.to_string(), &e)))?;
            if loc.scheme == "https" {
                let name = rustls_pki_types::ServerName::IpAddress(loc.ip.into());
                let cfg = insecure_tls().map_err(|e| unreachable(format!("tls: {e}")))?;
                let tls = tokio_rustls::TlsConnector::from(cfg)
                    .connect(name, stream)
                    .await
                    .map_err(|e| unreachable(format!("tls: {addr}: {e}")))?;
                Ok((Box::new(tls), loc.host()))
            } else {
                Ok((Box::new(stream), loc.host()))
            }
        }
    }
}

async fn proxy(
    server: Arc<Server>,
    mut req: Request<Incoming>,
    p: &ProxyPath,
) -> Result<Response<Body>, ApiError> {
    let upgrade = req.headers().contains_key(header::UPGRADE);
    // `.../proxy` without a slash: upstream redirects to `.../proxy/` (its issue 4958).
    if p.rest.is_empty() && !upgrade {
        let loc = match req.uri().query().filter(|q| !q.is_empty()) {
            Some(q) => format!("{}/?{q}", req.uri().path()),
            None => format!("{}/", req.uri().path()),
        };
        return Response::builder()
            .status(StatusCode::MOVED_PERMANENTLY)
            .header(header::LOCATION, loc)
            .body(Full::new(Bytes::new()).boxed())
            .map_err(|e| ApiError::new(500, "InternalError", e.to_string()));
    }
    let target = locate(&server, p).await?;
    let uri = location::upstream_path(&p.rest, req.uri().query());
    let (io, host) = connect(&server, &target).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(unreachable)?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut out = Request::builder()
        .method(req.method().clone())
        .uri(&uri)
        .header(header::HOST, &host);
    for (k, v) in req.headers() {
        if k == header::HOST || dropped(k, upgrade) {
            continue;
        }
        out = out.header(k, v);
    }
    if let Some(crate::auth::PeerAddr(a)) = req.extensions().get::<crate::auth::PeerAddr>() {
        out = out.header("X-Forwarded-For", a.ip().to_string());
    }
    let on_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let body = if upgrade {
        http_body_util::Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed()
    } else {
        req.into_body().map_err(io::Error::other).boxed()
    };
    let out = out
        .body(body)
        .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))?;
    let mut resp = sender.send_request(out).await.map_err(unreachable)?;
    let status = resp.status();
    let mut builder = Response::builder().status(status);
    for (k, v) in resp.headers() {
        if dropped(k, status == StatusCode::SWITCHING_PROTOCOLS) {
            continue;
        }
        builder = builder.header(k, v);
    }
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let backend = hyper::upgrade::on(&mut resp);
        if let Some(client) = on_upgrade {
            tokio::spawn(async move {
                if let (Ok(c), Ok(b)) = tokio::join!(client, backend) {
                    let mut c = hyper_util::rt::TokioIo::new(c);
                    let mut b = hyper_util::rt::TokioIo::new(b);
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut b).await;
                }
            });
        }
        return builder
            .body(Full::new(Bytes::new()).boxed())
            .map_err(|e| ApiError::new(500, "InternalError", e.to_string()));
    }
    let body = {
        use futures::StreamExt;
        let s = http_body_util::BodyStream::new(resp.into_body())
            .take_while(|r| futures::future::ready(r.is_ok()))
            .filter_map(|r| futures::future::ready(r.ok()))
            .map(Ok::<_, std::convert::Infallible>);
        BodyExt::boxed(http_body_util::StreamBody::new(s))
    };
    builder
        .body(body)
        .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn direct_network_allows_pod_loopback_only() {
        let d = Direct {
            loopback: crate::alloc::cidr::parse_service_cidrs("127.100.0.0/16").unwrap(),
        };
        assert!(d.allowed("127.100.0.7".parse().unwrap()));
        assert!(!d.allowed("127.0.0.1".parse().unwrap()));
        assert!(d.allowed("10.244.0.3".parse().unwrap()));
        assert!(!Direct::default().allowed("127.100.0.7".parse().unwrap()));
    }

    #[test]
    fn headers_passed_on() {
        let h = |s: &'static str| HeaderName::from_static(s);
        assert!(dropped(&h("authorization"), false));
        assert!(dropped(&h("connection"), false));
        assert!(!dropped(&h("connection"), true));
        assert!(!dropped(&h("upgrade"), true));
        assert!(!dropped(&h("accept"), false));
        assert_eq!(
            dial_error(
                "10.0.0.1:80",
                &io::Error::from(io::ErrorKind::ConnectionRefused)
            ),
            "dial tcp 10.0.0.1:80: connect: connection refused"
        );
    }
}
