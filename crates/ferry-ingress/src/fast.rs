//! The plain-HTTP/1.1 fast path: one task per client connection parses request heads
//! (httparse), forwards them on pooled backend `TcpStream`s it drives itself, and copies the
//! response back framed by `Content-Length` or chunked encoding — no request ever crosses
//! tasks. Anything unusual (HTTP/1.0, Upgrade, `Expect`, chunked request bodies, absolute-form
//! targets, no Service route, heads httparse cannot take) is handed to the hyper path with the
//! bytes already read replayed, for the rest of the connection.
//!
//! Header handling is the hyper path's: hop-by-hop headers (and those named in `Connection`)
//! are dropped both ways; `X-Forwarded-For/-Proto/-Host/-Port` and `X-Real-IP` are set.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::routes::{Target, Upstream, normalize_host};

/// Most request headers the fast path parses; more go to the hyper path.
const MAX_HEADERS: usize = 64;
/// Most response headers accepted from a backend (hyper's client takes 100).
const MAX_RESPONSE_HEADERS: usize = 128;

/// Idle plain backend connections per endpoint.
pub struct RawPool {
    idle: Mutex<HashMap<SocketAddr, Vec<(TcpStream, Instant)>>>,
    max_idle_per_endpoint: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
}

impl RawPool {
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> RawPool {
        RawPool {
            idle: Mutex::new(HashMap::new()),
            max_idle_per_endpoint: 256,
            idle_timeout,
            connect_timeout,
        }
    }

    /// An idle connection to `ep` not seen closed by its peer (most recently used first).
    fn checkout(&self, ep: SocketAddr) -> Option<TcpStream> {
        loop {
            let (s, since) = {
                let mut idle = self.idle.lock().ok()?;
                idle.get_mut(&ep)?.pop()?
            };
            if since.elapsed() >= self.idle_timeout || !idle_usable(&s) {
                continue;
            }
            return Some(s);
        }
    }

    fn checkin(&self, ep: SocketAddr, s: TcpStream) {
        if let Ok(mut idle) = self.idle.lock() {
            let list = idle.entry(ep).or_default();
            if list.len() < self.max_idle_per_endpoint {
                list.push((s, Instant::now()));
            }
        }
    }

    async fn connect(&self, ep: SocketAddr) -> io::Result<TcpStream> {
        let s = tokio::time::timeout(self.connect_timeout, TcpStream::connect(ep))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timeout"))??;
        let _ = s.set_nodelay(true);
        Ok(s)
    }

    /// Drops idle connections that are too old or to endpoints no longer in use.
    pub fn sweep(&self, keep: impl Fn(&SocketAddr) -> bool) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain(|ep, list| {
                if !keep(ep) {
                    return false;
                }
                list.retain(|(_, since)| since.elapsed() < self.idle_timeout);
                !list.is_empty()
            });
        }
    }
}

/// A stream that first yields bytes already read from it.
pub struct Rewind {
    pre: BytesMut,
    inner: TcpStream,
}

impl Rewind {
    pub fn new(pre: BytesMut, inner: TcpStream) -> Rewind {
        Rewind { pre, inner }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(buf.remaining());
            buf.put_slice(&this.pre[..n]);
            this.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------------
// Pure framing and head rewriting.

/// An error in chunked framing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid chunked encoding")]
pub struct ChunkedError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ck {
    Size { n: u64, any: bool },
    Ext(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    TrStart,
    TrLine,
    TrLf,
    EndLf,
    Done,
}

/// Finds where a chunked body ends (RFC 9112 §7.1), fed the bytes as they arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunked(Ck);

impl Default for Chunked {
    fn default() -> Self {
        Chunked(Ck::Size { n: 0, any: false })
    }
}

impl Chunked {
    pub fn is_done(&self) -> bool {
        self.0 == Ck::Done
    }

    /// Consumes bytes of `b` that belong to the body; returns how many (fewer than `b.len()`
    /// only when the body ended there).
    pub fn feed(&mut self, b: &[u8]) -> Result<usize, ChunkedError> {
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            self.0 = match self.0 {
                Ck::Done => return Ok(i),
                Ck::Data(r) => {
                    let take = usize::try_from(r).unwrap_or(usize::MAX).min(b.len() - i);
                    i += take;
                    let left = r - take as u64;
                    self.0 = if left == 0 {
                        Ck::DataCr
                    } else {
                        Ck::Data(left)
                    };
                    continue;
                }
                Ck::Size { n, any } => match c {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let d = (c as char).to_digit(16).ok_or(ChunkedError)?;
                        let n = n
                            .checked_mul(16)
                            .and_then(|n| n.checked_add(u64::from(d)))
                            .ok_or(ChunkedError)?;
                        Ck::Size { n, any: true }
                    }
                    b';' | b' ' | b'\t' if any => Ck::Ext(n),
                    b'\r' if any => Ck::SizeLf(n),
                    _ => return Err(ChunkedError),
                },
                Ck::Ext(n) => match c {
                    b'\r' => Ck::SizeLf(n),
                    b'\n' => return Err(ChunkedError),
                    _ => Ck::Ext(n),
                },
                Ck::SizeLf(n) => match (c, n) {
                    (b'\n', 0) => Ck::TrStart,
                    (b'\n', n) => Ck::Data(n),
                    _ => return Err(ChunkedError),
                },
                Ck::DataCr if c == b'\r' => Ck::DataLf,
                Ck::DataLf if c == b'\n' => Ck::Size { n: 0, any: false },
                Ck::DataCr | Ck::DataLf => return Err(ChunkedError),
                Ck::TrStart if c == b'\r' => Ck::EndLf,
                Ck::TrStart | Ck::TrLine if c != b'\r' => {
                    if c == b'\n' {
                        return Err(ChunkedError);
                    }
                    Ck::TrLine
                }
                Ck::TrStart | Ck::TrLine => Ck::TrLf,
                Ck::TrLf if c == b'\n' => Ck::TrStart,
                Ck::EndLf if c == b'\n' => {
                    self.0 = Ck::Done;
                    return Ok(i + 1);
                }
                Ck::TrLf | Ck::EndLf => return Err(ChunkedError),
            };
            i += 1;
        }
        Ok(i)
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded; and the forwarding headers Ferry
/// sets itself (a client's are replaced).
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
const SET_BY_FERRY: [&str; 5] = [
    "x-forwarded-for",
    "x-real-ip",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-proto",
];

fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|b| *b == b',').map(|t| t.trim_ascii())
}

/// Whether `name` is hop-by-hop, by the fixed list or named in a `Connection` header
/// (`has_connection`: whether `headers` has any, found once per head rather than per header).
fn hop(name: &str, headers: &[httparse::Header<'_>], has_connection: bool) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
        || has_connection
            && headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("connection"))
                .flat_map(|h| tokens(h.value))
                .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
}

fn has_connection(headers: &[httparse::Header<'_>]) -> bool {
    headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("connection"))
}

/// A request the fast path takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqPlan<'a> {
    pub host: &'a str,
    pub path: &'a str,
    pub content_length: u64,
    /// The client asked to close after this exchange.
    pub close: bool,
    /// May be sent again when a reused backend connection failed before answering.
    pub idempotent: bool,
}

/// Decides whether the fast path takes a parsed request; `None` hands it to the hyper path.
pub fn plan_request<'a>(req: &httparse::Request<'_, 'a>) -> Option<ReqPlan<'a>> {
    let (method, path) = (req.method?, req.path?);
    if req.version != Some(1) || !path.starts_with('/') {
        return None;
    }
    let mut host = None;
    let mut content_length: Option<u64> = None;
    let mut close = false;
    for h in req.headers.iter() {
        let n = h.name;
        if n.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return None;
            }
            host = Some(std::str::from_utf8(h.value).ok()?);
        } else if n.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value).ok()?;
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || content_length.is_some() {
                return None;
            }
            content_length = Some(v.parse().ok()?);
        } else if n.eq_ignore_ascii_case("connection") {
            for t in tokens(h.value) {
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"upgrade") {
                    return None;
                }
            }
        } else if n.eq_ignore_ascii_case("expect")
            || n.eq_ignore_ascii_case("upgrade")
            || n.eq_ignore_ascii_case("transfer-encoding")
        {
            return None;
        }
    }
    let idempotent = !matches!(method, "POST" | "PATCH" | "LOCK" | "CONNECT");
    Some(ReqPlan {
        host: host?,
        path,
        content_length: content_length.unwrap_or(0),
        close,
        idempotent,
    })
}

/// What Ferry adds to every request of one client connection.
#[derive(Debug, Clone)]
pub struct Forwarded {
    pub client_ip: String,
    pub local_port: String,
    pub https: bool,
    /// Append to a client's X-Forwarded-For instead of replacing it.
    pub trust: bool,
}

/// The head sent to the backend: origin-form target, HTTP/1.1, hop-by-hop headers dropped,
/// forwarding headers set (as the hyper path does).
pub fn write_request_head(
    out: &mut Vec<u8>,
    req: &httparse::Request<'_, '_>,
    plan: &ReqPlan<'_>,
    fwd: &Forwarded,
) {
    out.clear();
    out.extend_from_slice(req.method.unwrap_or("GET").as_bytes());
    out.push(b' ');
    out.extend_from_slice(plan.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut prev_xff: Option<&[u8]> = None;
    let conn = has_connection(req.headers);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("x-forwarded-for") {
            prev_xff.get_or_insert(h.value);
            continue;
        }
        if SET_BY_FERRY.iter().any(|s| h.name.eq_ignore_ascii_case(s))
            || hop(h.name, req.headers, conn)
        {
            continue;
        }
        header(out, h.name.as_bytes(), h.value);
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if let (true, Some(p)) = (fwd.trust, prev_xff) {
        out.extend_from_slice(p);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(fwd.client_ip.as_bytes());
    out.extend_from_slice(b"\r\n");
    header(out, b"x-real-ip", fwd.client_ip.as_bytes());
    header(out, b"x-forwarded-host", plan.host.as_bytes());
    header(out, b"x-forwarded-port", fwd.local_port.as_bytes());
    let proto: &[u8] = if fwd.https { b"https" } else { b"http" };
    header(out, b"x-forwarded-proto", proto);
    out.extend_from_slice(b"\r\n");
}

fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// Until the backend closes (the client connection closes after it too).
    Close,
}

/// What to do with a backend's response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RespPlan {
    pub status: u16,
    pub framing: Framing,
    /// The backend connection may carry another request afterwards.
    pub reusable: bool,
}

/// Frames a response (RFC 9112 §6.3); `None` for a head no proxy may forward (conflicting
/// lengths).
pub fn plan_response(resp: &httparse::Response<'_, '_>, head_request: bool) -> Option<RespPlan> {
    let status = resp.code?;
    let mut te_chunked = None;
    let mut length: Option<u64> = None;
    let mut close = resp.version != Some(1);
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            te_chunked = Some(
                tokens(h.value)
                    .filter(|t| !t.is_empty())
                    .last()
                    .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked")),
            );
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value).ok()?;
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u64 = v.parse().ok()?;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("connection") {
            close |= tokens(h.value).any(|t| t.eq_ignore_ascii_case(b"close"));
        }
    }
    let framing = if head_request || status == 204 || status == 304 || (100..200).contains(&status)
    {
        Framing::Length(0)
    } else {
        match (te_chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Close,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    };
    Some(RespPlan {
        status,
        framing,
        reusable: !close && framing != Framing::Close,
    })
}

/// The head sent to the client: hop-by-hop headers dropped; chunked bodies stay chunked.
pub fn write_response_head(
    out: &mut Vec<u8>,
    resp: &httparse::Response<'_, '_>,
    plan: &RespPlan,
    close: bool,
) {
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    let st = plan.status;
    out.extend_from_slice(&[
        b'0' + (st / 100 % 10) as u8,
        b'0' + (st / 10 % 10) as u8,
        b'0' + (st % 10) as u8,
    ]);
    out.push(b' ');
    out.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let conn = has_connection(resp.headers);
    for h in resp.headers.iter() {
        if hop(h.name, resp.headers, conn) {
            continue;
        }
        header(out, h.name.as_bytes(), h.value);
    }
    if plan.framing == Framing::Chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if close || plan.framing == Framing::Close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

// ---------------------------------------------------------------------------------------------
// The connection loop.

/// How a client connection left the fast path.
pub enum Outcome {
    Closed,
    /// The rest of the connection is the hyper path's; `BytesMut` was read and not handled.
    Handoff(BytesMut, TcpStream),
}

enum Sent {
    Done { keep_client: bool },
    Local(&'static [u8], bool),
    ClientGone,
}

const BAD_GATEWAY: &[u8] = b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 16\r\n\r\n502 Bad Gateway\n";
const GATEWAY_TIMEOUT: &[u8] = b"HTTP/1.1 504 Gateway Time-out\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n\r\n504 Gateway Time-out\n";

/// A connection's deadline kept on one `Sleep` that is re-armed lazily: moving the deadline
/// later (every request does) touches no timer; a sleep that fires before the current deadline
/// is re-armed to it. (A timeout per read costs a timer insertion and removal per request.)
struct Deadline {
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// The deadline, on the coarse clock ([`coarse_ms`]).
    at: u64,
    /// When the sleep fires, on the same clock.
    armed: u64,
}

/// Monotonic milliseconds from `CLOCK_MONOTONIC_COARSE`: the clock as of the last tick, read
/// from memory, where `Instant::now` reads the TSC (twice per request, ~1 % of the fast path's
/// cost). Deadlines of seconds do not need more than a tick's precision.
fn coarse_ms() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    match clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE) {
        Ok(t) => {
            let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
            secs.saturating_mul(1000).saturating_add(nanos / 1_000_000)
        }
        // Never on Linux; an unknown clock reads as "no time passed".
        Err(_) => 0,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Deadline {
    fn new(after: Duration) -> Deadline {
        let at = coarse_ms().saturating_add(millis(after));
        Deadline {
            sleep: Box::pin(tokio::time::sleep(after)),
            at,
            armed: at,
        }
    }

    /// Moves the deadline to `after` from now.
    fn set_after(&mut self, after: Duration) {
        let at = coarse_ms().saturating_add(millis(after));
        if at < self.armed {
            self.sleep
                .as_mut()
                .reset(tokio::time::Instant::now() + after);
            self.armed = at;
        }
        self.at = at;
    }

    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = coarse_ms();
            if now >= self.at {
                return Poll::Ready(());
            }
            let left = Duration::from_millis(self.at - now);
            self.sleep
                .as_mut()
                .reset(tokio::time::Instant::now() + left);
            self.armed = self.at;
        }
    }
}

enum Wait {
    Read(io::Result<usize>),
    Expired,
    Stop,
}

/// Reads what `s` has into `buf`, unless `deadline` passes first or `stop` (when given) fires.
async fn read_until<R: AsyncRead + Unpin>(
    s: &mut R,
    buf: &mut BytesMut,
    deadline: &mut Deadline,
    mut stop: Option<&mut StopWait<'_, '_>>,
) -> Wait {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = tokio_util::io::poll_read_buf(Pin::new(&mut *s), cx, buf) {
            return Poll::Ready(Wait::Read(r));
        }
        if let Some(stop) = stop.as_mut()
            && stop.poll_stopped(cx).is_ready()
        {
            return Poll::Ready(Wait::Stop);
        }
        if deadline.poll_expired(cx).is_ready() {
            return Poll::Ready(Wait::Expired);
        }
        Poll::Pending
    })
    .await
}

/// The route of a connection's last request: keep-alive clients mostly repeat Host and path,
/// so while the route table is unchanged the lookup is two comparisons.
#[derive(Default)]
struct LastRoute {
    generation: u64,
    host: Vec<u8>,
    path: Vec<u8>,
    target: Option<Arc<Target>>,
}

impl LastRoute {
    /// Routes `host` and `path`; `false` when nothing matches.
    fn lookup(&mut self, shared: &crate::proxy::Shared, host: &str, path: &str) -> bool {
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        let generation = shared.routes_gen();
        if self.target.is_some()
            && self.generation == generation
            && self.host == host.as_bytes()
            && self.path == path.as_bytes()
        {
            return true;
        }
        let routes = shared.routes();
        let Some(target) = routes.route(&normalize_host(host), path) else {
            return false;
        };
        self.target = Some(target.clone());
        self.generation = generation;
        self.host.clear();
        self.host.extend_from_slice(host.as_bytes());
        self.path.clear();
        self.path.extend_from_slice(path.as_bytes());
        true
    }
}

/// Whether an idle backend connection can carry a request: not seen closed by its peer.
/// Readiness is what epoll last reported: only when the socket looks readable (the backend
/// closed it, or sent something unasked) is it probed with a read.
/// (`try_io` reads the cached readiness without storing a waker: `poll_read_ready` would take
/// the socket's waiter lock and swap the task's waker out.)
fn idle_usable(s: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    let r = s.try_io(Interest::READABLE, || {
        nix::sys::socket::recv(s.as_raw_fd(), &mut b, nix::sys::socket::MsgFlags::empty())
            .map_err(io::Error::from)
    });
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// A listener's stop signal for its connections: a flag set once the listener's token is
/// cancelled, read after every request and whenever an idle connection is woken, and a `Notify`
/// that wakes idle connections after the flag is set. (The token's own future takes two locks
/// per poll — `is_cancelled` and the waiter list — and an idle wait comes once per request.)
#[derive(Clone)]
pub struct Stop {
    inner: Arc<StopInner>,
}

struct StopInner {
    flag: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Stop {
    /// Watches `token` (a task sets the flag, then wakes the idle connections, when it is
    /// cancelled). Needs a tokio runtime.
    pub fn new(token: tokio_util::sync::CancellationToken) -> Stop {
        let inner = Arc::new(StopInner {
            flag: AtomicBool::new(token.is_cancelled()),
            notify: tokio::sync::Notify::new(),
        });
        let i = inner.clone();
        tokio::spawn(async move {
            token.cancelled().await;
            i.flag.store(true, Ordering::Release);
            i.notify.notify_waiters();
        });
        Stop { inner }
    }

    fn stopping(&self) -> bool {
        self.inner.flag.load(Ordering::Acquire)
    }
}

/// A connection's wait for its listener's stop: the `Notified` is polled (its waker stored)
/// once; afterwards a wake-up is recognized by the flag, which is set before the notification.
/// A `Notified` receives `notify_waiters` from its creation on, polled or not.
struct StopWait<'s, 'n> {
    stop: &'s Stop,
    notified: Pin<&'n mut tokio::sync::futures::Notified<'s>>,
    registered: bool,
}

impl StopWait<'_, '_> {
    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.stop.stopping() {
            return Poll::Ready(());
        }
        if !self.registered {
            if self.notified.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            self.registered = true;
        }
        Poll::Pending
    }
}

/// Serves a plain HTTP connection until it closes or needs the hyper path.
pub async fn run(
    shared: &crate::proxy::Shared,
    info: crate::proxy::ConnInfo,
    client: TcpStream,
    stop: &Stop,
) -> Outcome {
    // The backend connection of the last request, kept while the next goes to the same
    // endpoint (no pool round trip); back to the pool when the client connection ends.
    let mut held = None;
    let outcome = serve_conn(shared, info, client, stop, &mut held).await;
    if let Some((ep, s)) = held {
        shared.raw.checkin(ep, s);
    }
    outcome
}

async fn serve_conn(
    shared: &crate::proxy::Shared,
    info: crate::proxy::ConnInfo,
    mut client: TcpStream,
    stop: &Stop,
    held: &mut Option<(SocketAddr, TcpStream)>,
) -> Outcome {
    let fwd = Forwarded {
        client_ip: crate::proxy::client_ip(info.peer.ip()).to_string(),
        local_port: info.local.port().to_string(),
        https: info.https,
        trust: shared.trust_forwarded,
    };
    let limits = &shared.limits;
    let mut buf = BytesMut::with_capacity(8192);
    let mut bbuf = BytesMut::with_capacity(16384);
    let mut head: Vec<u8> = Vec::with_capacity(2048);
    let mut out: Vec<u8> = Vec::with_capacity(2048);
    let mut last = LastRoute::default();
    let mut deadline = Deadline::new(limits.header_timeout);
    let notified = std::pin::pin!(stop.inner.notify.notified());
    let mut stopped = StopWait {
        stop,
        notified,
        registered: false,
    };
    loop {
        // A whole request head.
        deadline.set_after(limits.header_timeout);
        let (head_len, req) = loop {
            if !buf.is_empty() {
                // Uninitialized header slots: initializing 64 of them (2 KiB) per request
                // cost more than parsing a short head.
                let mut hs = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
                let mut req = httparse::Request::new(&mut []);
                match req.parse_with_uninit_headers(&buf, &mut hs) {
                    Ok(httparse::Status::Complete(n)) => {
                        let Some(plan) = plan_request(&req) else {
                            return Outcome::Handoff(buf, client);
                        };
                        if !last.lookup(shared, plan.host, plan.path)
                            || !matches!(last.target.as_deref(), Some(Target::Service(_)))
                        {
                            return Outcome::Handoff(buf, client);
                        }
                        write_request_head(&mut head, &req, &plan, &fwd);
                        break (
                            n,
                            Req {
                                content_length: plan.content_length,
                                close: plan.close,
                                idempotent: plan.idempotent,
                                head: req.method == Some("HEAD"),
                            },
                        );
                    }
                    Ok(httparse::Status::Partial) if buf.len() < limits.max_header_bytes => {}
                    _ => return Outcome::Handoff(buf, client),
                }
            }
            let idle = buf.is_empty();
            let stop = idle.then_some(&mut stopped);
            match read_until(&mut client, &mut buf, &mut deadline, stop).await {
                Wait::Read(Ok(0)) if !buf.is_empty() => return Outcome::Handoff(buf, client),
                Wait::Read(Ok(0) | Err(_)) | Wait::Expired | Wait::Stop => {
                    return Outcome::Closed;
                }
                Wait::Read(Ok(_)) => {}
            }
        };
        buf.advance(head_len);
        let Some(Target::Service(upstream)) = last.target.as_deref() else {
            return Outcome::Closed;
        };
        let io = Io {
            client: &mut client,
            buf: &mut buf,
            bbuf: &mut bbuf,
            out: &mut out,
            deadline: &mut deadline,
        };
        let sent = exchange(shared, upstream, io, held, &head, req).await;
        match sent {
            Sent::Done { keep_client: true } if !stop.stopping() => {}
            Sent::Local(resp, true) if !stop.stopping() => {
                if client.write_all(resp).await.is_err() {
                    return Outcome::Closed;
                }
            }
            Sent::Local(resp, _) => {
                let _ = client.write_all(resp).await;
                return Outcome::Closed;
            }
            Sent::Done { .. } | Sent::ClientGone => {
                let _ = client.shutdown().await;
                return Outcome::Closed;
            }
        }
    }
}

struct Req {
    content_length: u64,
    close: bool,
    idempotent: bool,
    head: bool,
}

/// A client connection's stream and buffers, lent to one exchange.
struct Io<'a> {
    client: &'a mut TcpStream,
    /// Bytes read from the client past the request head.
    buf: &'a mut BytesMut,
    /// Bytes read from the backend.
    bbuf: &'a mut BytesMut,
    /// The response head for the client.
    out: &'a mut Vec<u8>,
    deadline: &'a mut Deadline,
}

/// Why a backend exchange failed.
enum Fail {
    /// Nothing of a response was received: another connection may be tried.
    NoResponse,
    Timeout,
    /// Unusable response or failure mid-response.
    Bad,
    Client,
}

async fn exchange(
    shared: &crate::proxy::Shared,
    upstream: &Upstream,
    mut io: Io<'_>,
    held: &mut Option<(SocketAddr, TcpStream)>,
    head: &[u8],
    req: Req,
) -> Sent {
    // A body wholly read already can be sent again; one still streaming from the client cannot.
    let buffered = req.content_length <= io.buf.len() as u64;
    let replayable = buffered && req.idempotent;
    let result = 'eps: {
        let mut last = Fail::NoResponse;
        for ep in upstream.order() {
            for _attempt in 0..4 {
                let kept = match held.take() {
                    Some((h, s)) if h == ep => Some(s).filter(idle_usable),
                    Some((h, s)) => {
                        shared.raw.checkin(h, s);
                        None
                    }
                    None => None,
                };
                let (mut be, reused) = match kept.or_else(|| shared.raw.checkout(ep)) {
                    Some(s) => (s, true),
                    None => match shared.raw.connect(ep).await {
                        Ok(s) => (s, false),
                        Err(e) => {
                            tracing::debug!(upstream = upstream.name, %ep, "connect: {e}");
                            break;
                        }
                    },
                };
                match one(shared, &mut be, &mut io, head, &req).await {
                    Ok(keep) => {
                        if keep {
                            *held = Some((ep, be));
                        }
                        break 'eps Ok(());
                    }
                    Err(Fail::NoResponse) if reused && replayable => {
                        // The backend closed an idle connection: its other idle ones to
                        // this endpoint are suspect too; try a fresh one.
                        shared.raw.sweep(|x| x != &ep);
                        continue;
                    }
                    Err(Fail::NoResponse) if !buffered || !req.idempotent => {
                        break 'eps Err(Fail::Bad);
                    }
                    Err(Fail::NoResponse) => {
                        last = Fail::NoResponse;
                        break;
                    }
                    Err(f) => break 'eps Err(f),
                }
            }
        }
        Err(last)
    };
    match result {
        Ok(()) => Sent::Done {
            keep_client: !req.close,
        },
        Err(Fail::Client) => Sent::ClientGone,
        Err(f) => {
            // The request body, when it was all read, is consumed; otherwise the connection
            // cannot go on.
            let keep = buffered && !req.close;
            if buffered {
                io.buf.advance(
                    usize::try_from(req.content_length)
                        .unwrap_or(0)
                        .min(io.buf.len()),
                );
            }
            let resp = match (f, keep) {
                (Fail::Timeout, true) => GATEWAY_TIMEOUT,
                (Fail::Timeout, false) => GATEWAY_TIMEOUT_CLOSE,
                (_, true) => BAD_GATEWAY,
                (_, false) => BAD_GATEWAY_CLOSE,
            };
            Sent::Local(resp, keep)
        }
    }
}

const BAD_GATEWAY_CLOSE: &[u8] = b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 16\r\nconnection: close\r\n\r\n502 Bad Gateway\n";
const GATEWAY_TIMEOUT_CLOSE: &[u8] = b"HTTP/1.1 504 Gateway Time-out\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\nconnection: close\r\n\r\n504 Gateway Time-out\n";

/// Bodies up to this size are copied behind their head and sent with it in one `send`.
const JOIN_MAX: usize = 4096;

/// Writes `head` then `body` with as few socket calls as possible: a small body is appended to
/// `head` (which it changes) and the whole goes out in one `send`.
async fn write_joined(s: &mut TcpStream, head: &mut Vec<u8>, body: &[u8]) -> io::Result<()> {
    if body.len() <= JOIN_MAX {
        head.extend_from_slice(body);
        return write2(s, head, &[]).await;
    }
    write2(s, head, body).await
}

/// Writes `a` then `b` with as few sends as possible.
async fn write2(s: &mut TcpStream, mut a: &[u8], mut b: &[u8]) -> io::Result<()> {
    while !a.is_empty() || !b.is_empty() {
        let n = if b.is_empty() {
            send1(s, a).await?
        } else {
            send2(s, a, b).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        if n >= a.len() {
            b = &b[n - a.len()..];
            a = &[];
        } else {
            a = &a[n..];
        }
    }
    Ok(())
}

/// One `send` of `a`: the cheapest socket call for one buffer (measured per request:
/// `sendmsg` costs ~0.2 µs more per call for copying in the message header and the iovec).
async fn send1(s: &TcpStream, a: &[u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    loop {
        let r = s.try_io(Interest::WRITABLE, || {
            nix::sys::socket::send(s.as_raw_fd(), a, nix::sys::socket::MsgFlags::MSG_NOSIGNAL)
                .map_err(io::Error::from)
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(s).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// One `sendmsg` of `a` and `b`: the socket call itself, without the file layer `writev`
/// goes through (fsnotify, the VFS checks: ~3 % of the fast path's cost per request).
async fn send2(s: &TcpStream, a: &[u8], b: &[u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let iov = [io::IoSlice::new(a), io::IoSlice::new(b)];
    loop {
        let r = s.try_io(Interest::WRITABLE, || {
            nix::sys::socket::sendmsg::<()>(
                s.as_raw_fd(),
                &iov,
                &[],
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(io::Error::from)
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(s).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// Waits until `s` may be writable. A send is tried first (a socket's send buffer is mostly
/// free): `writable().await` would make a readiness future whose drop takes the socket's
/// waiter lock, once per send.
async fn wait_writable(s: &TcpStream) -> io::Result<()> {
    std::future::poll_fn(|cx| s.poll_write_ready(cx)).await
}

/// One request/response on backend connection `be`; `Ok(reusable)`.
async fn one(
    shared: &crate::proxy::Shared,
    be: &mut TcpStream,
    io: &mut Io<'_>,
    head: &[u8],
    req: &Req,
) -> Result<bool, Fail> {
    let client = &mut *io.client;
    let buf = &mut *io.buf;
    let bbuf = &mut *io.bbuf;
    let out = &mut *io.out;
    let deadline = &mut *io.deadline;
    // The request: head and the body bytes at hand in one write, then the rest of the body.
    let cl = req.content_length;
    let at_hand = usize::try_from(cl).unwrap_or(usize::MAX).min(buf.len());
    write2(be, head, &buf[..at_hand])
        .await
        .map_err(|_| Fail::NoResponse)?;
    if cl > at_hand as u64 {
        buf.advance(at_hand);
        let mut left = cl - at_hand as u64;
        while left > 0 {
            if buf.is_empty() && client.read_buf(buf).await.map_err(|_| Fail::Client)? == 0 {
                return Err(Fail::Client);
            }
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            be.write_all(&buf[..n]).await.map_err(|_| Fail::Bad)?;
            buf.advance(n);
            left -= n as u64;
        }
    }
    // The response head (1xx interim responses are dropped, as the hyper client does).
    bbuf.clear();
    deadline.set_after(shared.limits.response_timeout);
    let (n, plan) = loop {
        if !bbuf.is_empty() {
            let mut hs =
                [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
            let mut resp = httparse::Response::new(&mut []);
            match httparse::ParserConfig::default()
                .parse_response_with_uninit_headers(&mut resp, bbuf, &mut hs)
            {
                Ok(httparse::Status::Complete(n)) => {
                    let code = resp.code.unwrap_or(0);
                    if (100..200).contains(&code) && code != 101 {
                        bbuf.advance(n);
                        continue;
                    }
                    let Some(plan) = plan_response(&resp, req.head) else {
                        return Err(Fail::Bad);
                    };
                    if code == 101 {
                        return Err(Fail::Bad);
                    }
                    write_response_head(out, &resp, &plan, req.close);
                    break (n, plan);
                }
                Ok(httparse::Status::Partial) if bbuf.len() < 256 * 1024 => {}
                _ => return Err(Fail::Bad),
            }
        }
        let got_any = !bbuf.is_empty();
        match read_until(be, bbuf, deadline, None).await {
            Wait::Read(Ok(0) | Err(_)) if !got_any => return Err(Fail::NoResponse),
            Wait::Read(Ok(0) | Err(_)) => return Err(Fail::Bad),
            Wait::Read(Ok(_)) => {}
            Wait::Expired | Wait::Stop => return Err(Fail::Timeout),
        }
    };
    bbuf.advance(n);
    if req.content_length <= at_hand as u64 {
        buf.advance(at_hand);
    }
    // The body, as framed.
    match plan.framing {
        Framing::Length(len) => {
            let take = usize::try_from(len).unwrap_or(usize::MAX).min(bbuf.len());
            write_joined(client, out, &bbuf[..take])
                .await
                .map_err(|_| Fail::Client)?;
            let extra = bbuf.len() > take;
            let mut left = len - take as u64;
            bbuf.clear();
            while left > 0 {
                let r = be.read_buf(bbuf).await.map_err(|_| Fail::Client)?;
                if r == 0 {
                    return Err(Fail::Client);
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(bbuf.len());
                client
                    .write_all(&bbuf[..n])
                    .await
                    .map_err(|_| Fail::Client)?;
                left -= n as u64;
                if bbuf.len() > n {
                    return Ok(false);
                }
                bbuf.clear();
            }
            Ok(plan.reusable && !extra)
        }
        Framing::Chunked => {
            let mut ck = Chunked::default();
            let mut first = true;
            loop {
                let used = ck.feed(bbuf).map_err(|_| Fail::Client)?;
                let r = if first {
                    first = false;
                    write_joined(client, out, &bbuf[..used]).await
                } else {
                    client.write_all(&bbuf[..used]).await
                };
                r.map_err(|_| Fail::Client)?;
                if ck.is_done() {
                    return Ok(plan.reusable && used == bbuf.len());
                }
                bbuf.clear();
                if be.read_buf(bbuf).await.map_err(|_| Fail::Client)? == 0 {
                    return Err(Fail::Client);
                }
            }
        }
        Framing::Close => {
            write_joined(client, out, bbuf)
                .await
                .map_err(|_| Fail::Client)?;
            loop {
                bbuf.clear();
                match be.read_buf(bbuf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => client.write_all(bbuf).await.map_err(|_| Fail::Client)?,
                }
            }
            // The client learns the end by the close.
            Err(Fail::Client)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[tokio::test]
    async fn a_lazily_rearmed_deadline_expires_at_the_latest_set_time() {
        use tokio::time::{Duration, Instant};
        let poll_now = |d: &mut Deadline| {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            d.poll_expired(&mut cx).is_ready()
        };
        let start = Instant::now();
        let mut d = Deadline::new(Duration::from_millis(50));
        // Moved later before the sleep fired: the first expiry is not reported.
        d.set_after(Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!poll_now(&mut d));
        assert!(start.elapsed() < Duration::from_secs(20));
        // Moved earlier: reported once that time passed (the coarse clock may lag real time
        // by one tick, at most 10 ms).
        let set = Instant::now();
        d.set_after(Duration::from_millis(80));
        std::future::poll_fn(|cx| d.poll_expired(cx)).await;
        assert!(set.elapsed() >= Duration::from_millis(70));
        assert!(poll_now(&mut d));
    }

    fn parse_req(raw: &[u8], f: impl FnOnce(&httparse::Request<'_, '_>)) {
        let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut hs);
        assert!(req.parse(raw).unwrap().is_complete());
        f(&req);
    }

    #[test]
    fn which_requests_take_the_fast_path() {
        let fast = |raw: &str| {
            let mut r = None;
            parse_req(raw.as_bytes(), |req| {
                r = plan_request(req).map(|p| (p.content_length, p.close, p.idempotent))
            });
            r
        };
        type Want = Option<(u64, bool, bool)>;
        let table: [(&str, Want); 13] = [
            ("GET / HTTP/1.1\r\nHost: a\r\n\r\n", Some((0, false, true))),
            (
                "HEAD /x?q HTTP/1.1\r\nhost: a\r\n\r\n",
                Some((0, false, true)),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
                Some((5, false, false)),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n",
                Some((0, true, true)),
            ),
            // HTTP/1.0, no Host, two Hosts: hyper.
            ("GET / HTTP/1.0\r\nHost: a\r\n\r\n", None),
            ("GET / HTTP/1.1\r\n\r\n", None),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", None),
            // Upgrades, Expect, chunked request bodies, odd lengths, absolute form: hyper.
            (
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                None,
            ),
            ("GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\n", None),
            (
                "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
                None,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                None,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                None,
            ),
            ("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", None),
        ];
        for (raw, want) in table {
            assert_eq!(fast(raw), want, "{raw:?}");
        }
    }

    fn head_lines(out: &[u8]) -> Vec<String> {
        String::from_utf8(out.to_vec())
            .unwrap()
            .split("\r\n")
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn request_heads_drop_hop_by_hop_and_set_forwarding_headers() {
        let raw = b"GET /p?q=1 HTTP/1.1\r\nHost: h.test:8080\r\nConnection: keep-alive, X-Secret\r\nKeep-Alive: 5\r\nX-Secret: s\r\nTE: trailers\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8\r\nX-Real-IP: 9.9.9.9\r\nX-Forwarded-Proto: https\r\nAccept: */*\r\n\r\n";
        for (trust, xff) in [
            (false, "x-forwarded-for: 10.0.0.1"),
            (true, "x-forwarded-for: 1.2.3.4, 10.0.0.1"),
        ] {
            let fwd = Forwarded {
                client_ip: "10.0.0.1".into(),
                local_port: "80".into(),
                https: false,
                trust,
            };
            let mut out = Vec::new();
            parse_req(raw, |req| {
                let plan = plan_request(req).unwrap();
                write_request_head(&mut out, req, &plan, &fwd);
            });
            assert_eq!(
                head_lines(&out),
                [
                    "GET /p?q=1 HTTP/1.1",
                    "Host: h.test:8080",
                    "Accept: */*",
                    xff,
                    "x-real-ip: 10.0.0.1",
                    "x-forwarded-host: h.test:8080",
                    "x-forwarded-port: 80",
                    "x-forwarded-proto: http",
                    "",
                    ""
                ]
            );
        }
    }

    fn resp_plan(raw: &str, head: bool) -> Option<RespPlan> {
        let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut hs);
        assert!(resp.parse(raw.as_bytes()).unwrap().is_complete());
        plan_response(&resp, head)
    }

    #[test]
    fn response_framing() {
        use Framing::*;
        let p = |status, framing, reusable| {
            Some(RespPlan {
                status,
                framing,
                reusable,
            })
        };
        let table: [(&str, bool, Option<RespPlan>); 11] = [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
                false,
                p(200, Length(100), true),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
                true,
                p(200, Length(0), true),
            ),
            (
                "HTTP/1.1 204 No Content\r\n\r\n",
                false,
                p(204, Length(0), true),
            ),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false,
                p(304, Length(0), true),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n",
                false,
                p(200, Chunked, true),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                false,
                p(200, Close, false),
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", false, p(200, Close, false)),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n",
                false,
                p(200, Length(3), false),
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n",
                false,
                p(200, Length(3), false),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                false,
                None,
            ),
            ("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false, None),
        ];
        for (raw, head, want) in table {
            assert_eq!(resp_plan(raw, head), want, "{raw:?}");
        }
    }

    #[test]
    fn response_heads_drop_hop_by_hop() {
        let raw = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Conn\r\nX-Conn: 1\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n";
        let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut hs);
        resp.parse(raw).unwrap();
        let plan = plan_response(&resp, false).unwrap();
        let mut out = Vec::new();
        write_response_head(&mut out, &resp, &plan, true);
        assert_eq!(
            head_lines(&out),
            [
                "HTTP/1.1 200 OK",
                "Content-Type: text/plain",
                "transfer-encoding: chunked",
                "connection: close",
                "",
                ""
            ]
        );
    }

    #[test]
    fn chunked_framing_table() {
        let table: [(&[u8], Result<usize, ChunkedError>, bool); 9] = [
            (b"0\r\n\r\n", Ok(5), true),
            (b"5\r\nhello\r\n0\r\n\r\nNEXT", Ok(15), true),
            (b"A;ext=1\r\n0123456789\r\n0\r\n\r\n", Ok(26), true),
            (b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n", Ok(21), true),
            (b"5\r\nhel", Ok(6), false),
            (b"\r\n", Err(ChunkedError), false),
            (b"5\r\nhelloX", Err(ChunkedError), false),
            (b"g\r\n", Err(ChunkedError), false),
            (b"fffffffffffffffff\r\n", Err(ChunkedError), false),
        ];
        for (input, want, done) in table {
            let mut c = Chunked::default();
            let got = c.feed(input);
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(input));
            if want.is_ok() {
                assert_eq!(c.is_done(), done);
            }
        }
    }

    fn encode(chunks: &[Vec<u8>], trailers: &[(String, String)]) -> Vec<u8> {
        let mut v = Vec::new();
        for c in chunks.iter().filter(|c| !c.is_empty()) {
            v.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            v.extend_from_slice(c);
            v.extend_from_slice(b"\r\n");
        }
        v.extend_from_slice(b"0\r\n");
        for (k, val) in trailers {
            v.extend_from_slice(format!("{k}: {val}\r\n").as_bytes());
        }
        v.extend_from_slice(b"\r\n");
        v
    }

    proptest! {
        /// However a chunked body is split across reads, its end is found exactly, and the
        /// bytes after it are left alone.
        #[test]
        fn chunked_end_is_found_across_any_split(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8),
            trailers in prop::collection::vec(("[a-z]{1,8}", "[a-z0-9 ]{0,12}"), 0..3),
            tail in prop::collection::vec(any::<u8>(), 0..20),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let body = encode(&chunks, &trailers);
            let mut wire = body.clone();
            wire.extend_from_slice(&tail);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
            points.push(0);
            points.push(wire.len());
            points.sort_unstable();
            let mut c = Chunked::default();
            let mut consumed = 0;
            for w in points.windows(2) {
                if c.is_done() { break; }
                let piece = &wire[w[0].max(consumed)..w[1].max(consumed)];
                consumed += c.feed(piece).unwrap();
            }
            prop_assert!(c.is_done());
            prop_assert_eq!(consumed, body.len());
        }

        /// Truncated chunked bodies are never taken as complete.
        #[test]
        fn truncated_chunked_bodies_are_incomplete(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..100), 0..5),
            cut in any::<prop::sample::Index>(),
        ) {
            let body = encode(&chunks, &[]);
            let n = cut.index(body.len());
            let mut c = Chunked::default();
            prop_assert_eq!(c.feed(&body[..n]), Ok(n));
            prop_assert!(!c.is_done());
        }
    }
}
