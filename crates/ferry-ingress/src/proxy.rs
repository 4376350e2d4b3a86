//! The HTTP and HTTPS listeners and the forwarding of one request.
//!
//! Every request reads the route table in effect when it arrives (an `Arc` swapped whole by
//! the controller), so a table change never disturbs a request in flight.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::fast::{self, RawPool, Rewind};
use crate::pool::{Pool, PooledBody, ReqBody, Sender};
use crate::routes::{RouteTable, Target, Upstream, normalize_host};

/// Bounds on what clients may do.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request head (request line and headers) accepted.
    pub max_header_bytes: usize,
    /// Time allowed for a client to send a request head (also the keep-alive idle timeout).
    pub header_timeout: Duration,
    /// Time allowed for a backend to answer with its response head.
    pub response_timeout: Duration,
    /// Time allowed for a TLS handshake.
    pub handshake_timeout: Duration,
    /// Concurrent client connections.
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub max_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 64 * 1024,
            header_timeout: Duration::from_secs(60),
            response_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 16384,
            max_streams: 256,
        }
    }
}

/// State shared by every connection.
pub struct Shared {
    routes: RwLock<Arc<RouteTable>>,
    /// Bumped after every route table swap (the fast path caches a connection's last route).
    routes_gen: AtomicU64,
    pub pool: Arc<Pool>,
    /// Plain backend connections of the HTTP/1.1 fast path.
    pub raw: RawPool,
    /// Plain HTTP connections start on the fast path (else hyper serves them throughout).
    fast_path: AtomicBool,
    pub limits: Limits,
    /// Append to a client's X-Forwarded-For instead of replacing it.
    pub trust_forwarded: bool,
    conns: Arc<Semaphore>,
}

impl Shared {
    pub fn new(limits: Limits, trust_forwarded: bool) -> Arc<Shared> {
        Arc::new(Shared {
            routes: RwLock::new(Arc::new(RouteTable::default())),
            routes_gen: AtomicU64::new(0),
            pool: Arc::new(Pool::new(Duration::from_secs(5), Duration::from_secs(60))),
            raw: RawPool::new(Duration::from_secs(5), Duration::from_secs(60)),
            fast_path: AtomicBool::new(true),
            conns: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            trust_forwarded,
        })
    }

    /// Puts a new table in effect; requests already routed keep the old one.
    pub fn swap_routes(&self, t: RouteTable) {
        let keep: std::collections::HashSet<SocketAddr> = t
            .exact
            .values()
            .chain(t.wildcard.values())
            .chain(std::iter::once(&t.catch_all))
            .flat_map(|s| {
                s.routes
                    .iter()
                    .map(|r| &r.target)
                    .chain(s.default.iter())
                    .filter_map(|t| match t.as_ref() {
                        Target::Service(u) => Some(u.endpoints.clone()),
                        _ => None,
                    })
                    .flatten()
                    .collect::<Vec<_>>()
            })
            .collect();
        if let Ok(mut g) = self.routes.write() {
            *g = Arc::new(t);
        }
        self.routes_gen.fetch_add(1, Ordering::Release);
        self.pool.sweep(|ep| keep.contains(ep));
        self.raw.sweep(|ep| keep.contains(ep));
    }

    /// Turns the HTTP/1.1 fast path on or off for connections accepted from now on (off:
    /// hyper serves every plain HTTP connection, as for HTTPS).
    pub fn set_fast_path(&self, on: bool) {
        self.fast_path.store(on, Ordering::Relaxed);
    }

    /// Changes whenever the route table does: a route looked up under one value stays valid
    /// while it is current.
    pub fn routes_gen(&self) -> u64 {
        self.routes_gen.load(Ordering::Acquire)
    }

    pub fn routes(&self) -> Arc<RouteTable> {
        match self.routes.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// The response body: the backend's (pooled), or one Ferry wrote.
pub enum RespBody {
    Upstream(PooledBody),
    Local(Full<Bytes>),
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RespBody::Upstream(b) => Pin::new(b).poll_frame(cx),
            RespBody::Local(b) => match Pin::new(b).poll_frame(cx) {
                Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
                Poll::Ready(Some(Err(e))) => match e {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Upstream(b) => b.is_end_stream(),
            RespBody::Local(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Upstream(b) => b.size_hint(),
            RespBody::Local(b) => b.size_hint(),
        }
    }
}

fn local(status: StatusCode, text: &'static str) -> Response<RespBody> {
    let mut r = Response::new(RespBody::Local(Full::new(Bytes::from_static(
        text.as_bytes(),
    ))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// What the proxy knows about a client connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub https: bool,
}

/// Headers that concern one connection only (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in &HOP_BY_HOP {
        h.remove(n);
    }
}

fn wants_upgrade(req: &Request<Incoming>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let conn_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if conn_upgrade {
        req.headers().get(header::UPGRADE).cloned()
    } else {
        None
    }
}

fn host_of(req: &Request<Incoming>) -> Option<String> {
    if let Some(h) = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    {
        return Some(h.to_string());
    }
    req.uri().authority().map(|a| a.as_str().to_string())
}

pub(crate) fn client_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Handles one request.
pub async fn handle(
    shared: Arc<Shared>,
    conn: ConnInfo,
    mut req: Request<Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    // An HTTP/1.0 request without Host goes to the rules without a host.
    let raw_host = host_of(&req).unwrap_or_default();
    let routes = shared.routes();
    let host = normalize_host(&raw_host);
    let target = routes.route(&host, req.uri().path()).cloned();
    let Some(target) = target else {
        return Ok(local(StatusCode::NOT_FOUND, "default backend - 404\n"));
    };
    let upstream = match target.as_ref() {
        Target::Service(u) => u,
        Target::Unsupported(_) => {
            return Ok(local(StatusCode::NOT_FOUND, "default backend - 404\n"));
        }
        Target::Unavailable(why) => {
            tracing::debug!(host, path = req.uri().path(), "503: {why}");
            return Ok(local(
                StatusCode::SERVICE_UNAVAILABLE,
                "503 Service Temporarily Unavailable\n",
            ));
        }
    };

    let upgrade = wants_upgrade(&req);
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let h = &mut parts.headers;
    if let Some(u) = &upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, u.clone());
    }
    if !h.contains_key(header::HOST)
        && !raw_host.is_empty()
        && let Ok(v) = HeaderValue::from_str(&raw_host)
    {
        h.insert(header::HOST, v);
    }
    let ip = client_ip(conn.peer.ip()).to_string();
    let xff = match (shared.trust_forwarded, h.get("x-forwarded-for")) {
        (true, Some(prev)) => format!("{}, {ip}", prev.to_str().unwrap_or("")),
        _ => ip.clone(),
    };
    set(h, "x-forwarded-for", &xff);
    set(h, "x-real-ip", &ip);
    set(h, "x-forwarded-host", &raw_host);
    set(h, "x-forwarded-port", &conn.local.port().to_string());
    set(
        h,
        "x-forwarded-proto",
        if conn.https { "https" } else { "http" },
    );
    // Origin form towards the backend: the path and query only.
    let uri = match parts.uri.path_and_query() {
        Some(pq) => {
            let mut up = http::uri::Parts::default();
            up.path_and_query = Some(pq.clone());
            Uri::from_parts(up).unwrap_or_else(|_| Uri::from_static("/"))
        }
        None => Uri::from_static("/"),
    };
    let replayable = body.is_end_stream() && upgrade.is_none();
    let mut out = Request::from_parts(parts, ReqBody::Stream(body));
    *out.uri_mut() = uri;
    *out.version_mut() = Version::HTTP_11;

    let resp = match send(&shared, upstream, out, replayable).await {
        Ok(r) => r,
        Err(status) => {
            let text = if status == StatusCode::GATEWAY_TIMEOUT {
                "504 Gateway Time-out\n"
            } else {
                "502 Bad Gateway\n"
            };
            return Ok(local(status, text));
        }
    };
    let (ep, tx, mut resp) = resp;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_up) = client_upgrade {
            let backend_up = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                match tokio::try_join!(client_up, backend_up) {
                    Ok((c, b)) => {
                        let mut c = TokioIo::new(c);
                        let mut b = TokioIo::new(b);
                        let _ = tokio::io::copy_bidirectional(&mut c, &mut b).await;
                    }
                    Err(e) => tracing::debug!("upgrade: {e}"),
                }
            });
        }
        drop(tx);
        let (p, b) = resp.into_parts();
        return Ok(Response::from_parts(
            p,
            RespBody::Upstream(PooledBody::unpooled(b)),
        ));
    }
    let (mut p, b) = resp.into_parts();
    strip_hop_by_hop(&mut p.headers);
    Ok(Response::from_parts(
        p,
        RespBody::Upstream(PooledBody::new(b, shared.pool.clone(), ep, tx)),
    ))
}

fn set(h: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(HeaderName::from_static(name), v);
    }
}

type Sent = (SocketAddr, Sender, Response<Incoming>);

/// A connection idle this long may be closed by the backend (its keep-alive timeout) just as
/// a request is written on it: a bodyless request sent on it is kept, to be sent again.
const STALE_AFTER: Duration = Duration::from_secs(1);

/// Sends `req` to the upstream: round-robin over its endpoints, on to the next endpoint when a
/// connection cannot be made; a request a reused connection could not carry is sent again.
async fn send(
    shared: &Shared,
    upstream: &Upstream,
    req: Request<ReqBody>,
    replayable: bool,
) -> Result<Sent, StatusCode> {
    let mut req = Some(req);
    let mut replay: Option<(Method, Uri, HeaderMap)> = None;
    for ep in upstream.order() {
        // Reused connections first, then a new one; a failure to connect moves on.
        for _attempt in 0..4 {
            let Some(r) = req.take() else {
                return Err(StatusCode::BAD_GATEWAY);
            };
            let (mut tx, reused) = match shared.pool.checkout(ep) {
                Some((tx, idle_for)) => {
                    if replayable && replay.is_none() && idle_for >= STALE_AFTER {
                        replay = Some((r.method().clone(), r.uri().clone(), r.headers().clone()));
                    }
                    (tx, true)
                }
                None => match shared.pool.connect(ep).await {
                    Ok(tx) => (tx, false),
                    Err(e) => {
                        tracing::debug!(upstream = upstream.name, %ep, "connect: {e}");
                        req = Some(r);
                        break;
                    }
                },
            };
            if tx.ready().await.is_err() {
                req = Some(r);
                continue;
            }
            let fut = tx.try_send_request(r);
            match tokio::time::timeout(shared.limits.response_timeout, fut).await {
                Err(_) => return Err(StatusCode::GATEWAY_TIMEOUT),
                Ok(Ok(resp)) => return Ok((ep, tx, resp)),
                Ok(Err(mut e)) => {
                    if let Some(back) = e.take_message() {
                        // Never written: send it on another connection.
                        req = Some(back);
                        continue;
                    }
                    let err = e.into_error();
                    tracing::debug!(upstream = upstream.name, %ep, reused, "request: {err}");
                    match (reused, replay.take()) {
                        (true, Some((m, u, h))) => {
                            let mut again = Request::new(ReqBody::Empty);
                            *again.method_mut() = m.clone();
                            *again.uri_mut() = u.clone();
                            *again.headers_mut() = h.clone();
                            replay = Some((m, u, h));
                            req = Some(again);
                            // A reused connection was closed under us: drop the others idle to
                            // this endpoint and use a fresh one.
                            shared.pool.sweep(|x| x != &ep);
                            continue;
                        }
                        _ => return Err(StatusCode::BAD_GATEWAY),
                    }
                }
            }
        }
    }
    Err(StatusCode::BAD_GATEWAY)
}

fn builder(limits: &Limits) -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
    let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(Duration::from_secs(30)));
    b
}

/// Accepts plain HTTP connections until `stop`.
pub async fn serve_http(shared: Arc<Shared>, listener: TcpListener, stop: CancellationToken) {
    serve(shared, listener, None, stop).await
}

/// Accepts HTTPS connections until `stop`.
pub async fn serve_https(
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    stop: CancellationToken,
) {
    serve(
        shared,
        listener,
        Some(tokio_rustls::TlsAcceptor::from(tls)),
        stop,
    )
    .await
}

async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: CancellationToken,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = Arc::new(builder(&shared.limits));
    // Plain HTTP is HTTP/1 only (as ingress-nginx: no cleartext HTTP/2), served directly.
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(shared.limits.header_timeout)
        .max_buf_size(shared.limits.max_header_bytes.max(8192))
        .keep_alive(true);
    let fast_stop = fast::Stop::new(stop.clone());
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => break,
            p = shared.conns.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().unwrap_or(peer);
        let info = ConnInfo {
            peer,
            local,
            https: tls.is_some(),
        };
        let sh = shared.clone();
        let service = hyper::service::service_fn(move |req| handle(sh.clone(), info, req));
        match &tls {
            None => {
                let http1 = http1.clone();
                let stop = stop.clone();
                let fast_stop = fast_stop.clone();
                let sh = shared.clone();
                let fast_path = shared.fast_path.load(Ordering::Relaxed);
                tokio::spawn(async move {
                    let _permit = permit;
                    let (pre, stream) = if fast_path {
                        match fast::run(&sh, info, stream, &fast_stop).await {
                            fast::Outcome::Closed => return,
                            fast::Outcome::Handoff(pre, stream) => (pre, stream),
                        }
                    } else {
                        (bytes::BytesMut::new(), stream)
                    };
                    let conn = http1
                        .serve_connection(TokioIo::new(Rewind::new(pre, stream)), service)
                        .with_upgrades();
                    let mut conn = std::pin::pin!(conn);
                    tokio::select! {
                        r = conn.as_mut() => if let Err(e) = r {
                            tracing::trace!("client connection: {e}");
                        },
                        _ = stop.cancelled() => {
                            // Finish the request in flight, then close.
                            conn.as_mut().graceful_shutdown();
                            let _ = tokio::time::timeout(Duration::from_secs(10), conn).await;
                        }
                    }
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let builder = builder.clone();
                let timeout = shared.limits.handshake_timeout;
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _permit = permit;
                    let tls = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, "TLS handshake: {e}");
                            return;
                        }
                        Err(_) => return,
                    };
                    let conn = builder
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .into_owned();
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::trace!("client connection: {e}");
                    }
                });
            }
        }
    }
    drop(listener);
    // Requests in flight finish; idle keep-alive connections close.
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
    let all = u32::try_from(shared.limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(10), shared.conns.acquire_many(all)).await;
}
