//! The userspace data path: a listening socket per frontend (service address), a pool of
//! endpoints behind each, bidirectional copying for TCP and a per-client flow table for UDP.
//!
//! [`Dataplane::apply_delta`] takes what changed in the table (the sync loop keeps the table
//! per Service, [`crate::table::incr`], so a sync costs what it touches) and
//! [`Dataplane::apply`] a whole [`Table`] (walked in full); both change only what differs: they
//! swap pool endpoint sets in place (selection state and affinity survive), close the
//! listeners of frontends that went away (so a connection is refused at once) and open new
//! ones. A frontend that cannot be bound (the address is not local, the port is taken) is
//! logged and retried on every later apply.
//!
//! Copying ([`pump`]) runs both directions in the connection's one task. A direction takes a
//! 64 KiB buffer from a per-thread pool only once its source is readable and hands it back as
//! soon as the buffer is drained and the source has nothing more (as HAProxy allocates buffers
//! on demand): an idle connection holds no buffer and a short one costs no allocation. The
//! first direction to see EOF half-closes its destination (`shutdown(SHUT_WR)`); when the second
//! one ends both sockets are simply closed, which sends the last FIN. Accepted sockets inherit
//! `TCP_NODELAY` and the keepalive settings from their listener; the backend socket gets
//! `TCP_NODELAY` before `connect` and keepalive only if it lives past [`KEEPALIVE_AFTER`], and
//! a successful connect is read from epoll's readiness without `getsockopt(SO_ERROR)`: a short
//! connection costs one socket option call after accept.
//! A direction whose read fills a whole buffer is a bulk transfer: it switches to `splice(2)`
//! through a pooled pipe (held only while data is in flight, at most [`SPLICE_PIPES`] open),
//! so the proxy no longer copies the stream's bytes through user space.
//!
//! Limits (so that a flood through one Service cannot starve the process): every proxied TCP
//! connection and UDP flow holds a permit of one per-process [`ConnLimiter`]
//! (`--max-connections`). At the cap a new TCP connection is accepted and closed at once (as
//! Envoy does on overflow; waiting for a permit before `accept` would park permits on idle
//! listeners) and a datagram that would open a flow is dropped; both are logged at a bounded
//! rate. Accept errors back off (see [`ferry_limits::accept`]). A TCP connection with no
//! traffic either way for `tcp_idle` is closed, a UDP flow after `udp_idle`; both sides of a
//! TCP connection get keepalive probes, so vanished peers are noticed long before that.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_limits::{Acceptor, ConnLimiter, ConnPermit, LogLimiter};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

use crate::model::{Proto, ProxyProtocol};
use crate::proxyproto;
use crate::sched::PoolState;
use crate::table::incr::Delta;
use crate::table::{Frontend, Pool, PoolKey, Table};

/// Connect timeouts of successive attempts, as the userspace kube-proxy (each attempt asks the
/// scheduler again, avoiding endpoints that already failed).
pub const DIAL_TIMEOUTS: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

const COPY_BUF: usize = 64 * 1024;

/// Counts a connection (or UDP flow) against an endpoint while alive.
pub struct ActiveGuard(Arc<AtomicUsize>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct PoolInner {
    state: PoolState,
    active: HashMap<SocketAddr, Arc<AtomicUsize>>,
    proxy_protocol: Option<ProxyProtocol>,
}

/// A pool shared by its frontends' listeners and connections.
pub struct PoolHandle {
    inner: Mutex<PoolInner>,
    created: Instant,
}

/// The result of a pick.
pub struct Picked {
    pub endpoint: SocketAddr,
    pub guard: ActiveGuard,
    pub proxy_protocol: Option<ProxyProtocol>,
}

impl PoolHandle {
    fn new(pool: &Pool) -> Self {
        let mut inner = PoolInner {
            state: PoolState::new(Vec::new(), pool.scheduler, pool.affinity),
            active: HashMap::new(),
            proxy_protocol: pool.proxy_protocol,
        };
        Self::set(&mut inner, pool);
        PoolHandle {
            inner: Mutex::new(inner),
            created: Instant::now(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolInner> {
        // A panic while holding the lock leaves consistent data (plain fields); keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(inner: &mut PoolInner, pool: &Pool) {
        inner
            .state
            .update(pool.endpoints.clone(), pool.scheduler, pool.affinity);
        inner.active.retain(|e, _| pool.endpoints.contains(e));
        for e in &pool.endpoints {
            inner.active.entry(*e).or_default();
        }
        inner.proxy_protocol = pool.proxy_protocol;
    }

    fn update(&self, pool: &Pool) {
        let mut g = self.lock();
        // Most pools are unchanged at a sync (a userspace sync hands over the whole table):
        // compare before cloning anything.
        let st = &g.state;
        if st.endpoints == pool.endpoints
            && st.scheduler == pool.scheduler
            && st.affinity == pool.affinity
            && g.proxy_protocol == pool.proxy_protocol
        {
            return;
        }
        Self::set(&mut g, pool);
    }

    fn expire(&self, now: Instant) {
        self.lock().state.expire(now);
    }

    /// Picks an endpoint for a connection from `src` to the frontend address `dst`.
    pub fn pick(
        &self,
        src: IpAddr,
        dst: IpAddr,
        reset: bool,
        tried: &[SocketAddr],
    ) -> Option<Picked> {
        let mut g = self.lock();
        let inner = &mut *g;
        let active: Vec<usize> = inner
            .state
            .endpoints
            .iter()
            .map(|e| inner.active.get(e).map_or(0, |c| c.load(Ordering::Relaxed)))
            .collect();
        let now = Instant::now();
        let endpoint = inner
            .state
            .pick(src, dst, now, reset, tried, &active, &mut rand::rng())?;
        let counter = inner.active.entry(endpoint).or_default().clone();
        counter.fetch_add(1, Ordering::Relaxed);
        Some(Picked {
            endpoint,
            guard: ActiveGuard(counter),
            proxy_protocol: inner.proxy_protocol,
        })
    }

    /// Open connections/flows per endpoint (diagnostics and tests).
    pub fn active(&self) -> Vec<(SocketAddr, usize)> {
        let g = self.lock();
        g.state
            .endpoints
            .iter()
            .map(|e| (*e, g.active.get(e).map_or(0, |c| c.load(Ordering::Relaxed))))
            .collect()
    }

    /// When this pool was first created.
    pub fn created(&self) -> Instant {
        self.created
    }
}

struct Listener {
    key: PoolKey,
    cancel: CancellationToken,
}

/// The default idle timeout of a proxied TCP connection: 24 h, the established-connection
/// timeout kube-proxy gives conntrack (`--conntrack-tcp-timeout-established`) in its kernel
/// modes, so an idle connection through a Service lives as long as on any cluster. (The old
/// userspace kube-proxy had no TCP idle timeout at all.)
pub const DEFAULT_TCP_IDLE: Duration = Duration::from_secs(24 * 3600);
/// The default idle timeout of a UDP flow: kube-proxy's userspace `--udp-timeout` (250 ms).
pub const DEFAULT_UDP_IDLE: Duration = Duration::from_millis(250);

/// Data-path settings.
#[derive(Debug, Clone)]
pub struct DataplaneConfig {
    /// A UDP flow without traffic for this long is forgotten.
    pub udp_idle: Duration,
    /// A TCP connection without traffic either way for this long is closed (`None`: never).
    pub tcp_idle: Option<Duration>,
    /// Concurrent proxied connections and UDP flows of the whole proxy.
    pub max_connections: usize,
    /// Bulk transfers move through a pipe with `splice(2)` instead of a user-space buffer
    /// (see [`SPLICE_PIPES`]); off only to compare.
    pub splice: bool,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            udp_idle: DEFAULT_UDP_IDLE,
            tcp_idle: Some(DEFAULT_TCP_IDLE),
            max_connections: default_max_connections(),
            splice: true,
        }
    }
}

/// The cap a proxy alone in its process gets from the current descriptor limit.
pub fn default_max_connections() -> usize {
    let parts = ferry_limits::Parts {
        proxy: true,
        ..Default::default()
    };
    ferry_limits::plan(ferry_limits::fdlimit::current().soft, parts).proxy
}

/// What every connection task of the data path shares.
struct Limits {
    conns: ConnLimiter,
    tcp_idle: Option<Duration>,
    udp_idle: Duration,
    splice: bool,
}

/// Outcome of an apply.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    pub opened: usize,
    pub closed: usize,
    pub failed: Vec<(Frontend, String)>,
}

/// The live data path.
pub struct Dataplane {
    limits: Arc<Limits>,
    pools: HashMap<PoolKey, Arc<PoolHandle>>,
    /// Pools with session affinity (their remembered clients expire at each apply).
    affine: BTreeSet<PoolKey>,
    listeners: HashMap<Frontend, Listener>,
    /// Frontends that could not be opened, with their pool: retried at every apply.
    failed: BTreeMap<Frontend, PoolKey>,
    root: CancellationToken,
}

impl Dataplane {
    pub fn new(cfg: DataplaneConfig, root: CancellationToken) -> Self {
        Dataplane {
            limits: Arc::new(Limits {
                conns: ConnLimiter::new("proxy", cfg.max_connections),
                tcp_idle: cfg.tcp_idle.filter(|d| !d.is_zero()),
                udp_idle: cfg.udp_idle,
                splice: cfg.splice,
            }),
            pools: HashMap::new(),
            affine: BTreeSet::new(),
            listeners: HashMap::new(),
            failed: BTreeMap::new(),
            root,
        }
    }

    /// The pool handle of a key (tests and diagnostics).
    pub fn pool(&self, key: &PoolKey) -> Option<Arc<PoolHandle>> {
        self.pools.get(key).cloned()
    }

    /// The connection cap shared by every frontend.
    pub fn limiter(&self) -> &ConnLimiter {
        &self.limits.conns
    }

    /// Frontends currently listening.
    pub fn listening(&self) -> BTreeSet<Frontend> {
        self.listeners.keys().copied().collect()
    }

    /// Makes the data path serve `table` (walks all of it; [`Dataplane::apply_delta`] takes
    /// only what changed).
    pub fn apply(&mut self, table: &Table) -> ApplyReport {
        let mut report = ApplyReport::default();
        // Close listeners first so that their ports are free for rebinding.
        let stale: Vec<Frontend> = self
            .listeners
            .iter()
            .filter(|(f, l)| table.frontends.get(f) != Some(&l.key))
            .map(|(f, _)| *f)
            .collect();
        for f in stale {
            self.close(f, &mut report);
        }
        let gone: Vec<PoolKey> = self
            .pools
            .keys()
            .filter(|k| !table.pools.contains_key(k))
            .cloned()
            .collect();
        for k in gone {
            self.set_pool(&k, None);
        }
        for (k, p) in &table.pools {
            self.set_pool(k, Some(p));
        }
        self.expire();
        self.failed.retain(|f, k| table.frontends.get(f) == Some(k));
        for (f, key) in &table.frontends {
            if !self.listeners.contains_key(f) {
                self.open_frontend(*f, key, &mut report);
            }
        }
        report
    }

    /// Applies what changed in the table (from [`crate::table::incr::Incremental::update`]);
    /// costs what the delta holds (plus the frontends that failed earlier, retried).
    pub fn apply_delta(&mut self, delta: &Delta) -> ApplyReport {
        let mut report = ApplyReport::default();
        for (f, key) in &delta.frontends {
            if self
                .listeners
                .get(f)
                .is_some_and(|l| Some(&l.key) != key.as_ref())
            {
                self.close(*f, &mut report);
            }
            match key {
                Some(k) => {
                    if let Some(old) = self.failed.get_mut(f) {
                        *old = k.clone();
                    }
                }
                None => {
                    self.failed.remove(f);
                }
            }
        }
        for (k, p) in &delta.pools {
            self.set_pool(k, p.as_ref());
        }
        self.expire();
        for (f, key) in &delta.frontends {
            if let Some(k) = key
                && !self.listeners.contains_key(f)
            {
                self.open_frontend(*f, k, &mut report);
            }
        }
        let retry: Vec<(Frontend, PoolKey)> = self
            .failed
            .iter()
            .filter(|(f, _)| !delta.frontends.contains_key(f))
            .map(|(f, k)| (*f, k.clone()))
            .collect();
        for (f, k) in retry {
            self.open_frontend(f, &k, &mut report);
        }
        report
    }

    fn close(&mut self, f: Frontend, report: &mut ApplyReport) {
        if let Some(l) = self.listeners.remove(&f) {
            l.cancel.cancel();
            report.closed += 1;
            tracing::debug!(frontend = %f, "closed");
        }
    }

    /// Sets (`Some`) or removes (`None`) a pool; an existing pool is updated in place
    /// (selection state and affinity survive).
    fn set_pool(&mut self, k: &PoolKey, p: Option<&Pool>) {
        match p {
            None => {
                self.pools.remove(k);
                self.affine.remove(k);
            }
            Some(p) => {
                match self.pools.get(k) {
                    Some(h) => h.update(p),
                    None => {
                        self.pools.insert(k.clone(), Arc::new(PoolHandle::new(p)));
                    }
                }
                if p.affinity.is_some() {
                    self.affine.insert(k.clone());
                } else {
                    self.affine.remove(k);
                }
            }
        }
    }

    /// Forgets affinity entries that timed out.
    fn expire(&self) {
        let now = Instant::now();
        for k in &self.affine {
            if let Some(h) = self.pools.get(k) {
                h.expire(now);
            }
        }
    }

    /// Opens a listener for `f` serving pool `key`; a failure is remembered and retried.
    fn open_frontend(&mut self, f: Frontend, key: &PoolKey, report: &mut ApplyReport) {
        let Some(pool) = self.pools.get(key).cloned() else {
            return;
        };
        let cancel = self.root.child_token();
        match self.open(f, pool, cancel.clone()) {
            Ok(()) => {
                self.listeners.insert(
                    f,
                    Listener {
                        key: key.clone(),
                        cancel,
                    },
                );
                if self.failed.remove(&f).is_some() {
                    tracing::info!(frontend = %f, "listening after earlier failure");
                }
                report.opened += 1;
                tracing::debug!(frontend = %f, service = %key.port, "listening");
            }
            Err(e) => {
                if self.failed.insert(f, key.clone()).is_none() {
                    tracing::warn!(frontend = %f, service = %key.port, error = %e,
                        "cannot serve this service address (retrying on every sync)");
                }
                report.failed.push((f, e.to_string()));
            }
        }
    }

    fn open(
        &self,
        f: Frontend,
        pool: Arc<PoolHandle>,
        cancel: CancellationToken,
    ) -> std::io::Result<()> {
        let addr = SocketAddr::new(f.ip, f.port);
        match f.proto {
            Proto::Tcp => {
                let sock = if addr.is_ipv4() {
                    TcpSocket::new_v4()?
                } else {
                    TcpSocket::new_v6()?
                };
                sock.set_reuseaddr(true)?;
                // Inherited by every accepted connection (Linux copies the listener's TCP
                // options into the child socket), saving five calls per connection.
                sock.set_nodelay(true)?;
                ferry_limits::keepalive::set(&sock, ferry_limits::keepalive::Keepalive::default())?;
                sock.bind(addr)?;
                let listener = sock.listen(1024)?;
                tokio::spawn(serve_tcp(listener, f, pool, cancel, self.limits.clone()));
            }
            Proto::Udp => {
                let std_sock = std::net::UdpSocket::bind(addr)?;
                std_sock.set_nonblocking(true)?;
                let sock = UdpSocket::from_std(std_sock)?;
                tokio::spawn(serve_udp(
                    Arc::new(sock),
                    f,
                    pool,
                    cancel,
                    self.limits.clone(),
                ));
            }
            Proto::Sctp => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "SCTP is not supported by the userspace proxy",
                ));
            }
        }
        Ok(())
    }

    /// Closes every listener.
    pub fn shutdown(&mut self) {
        for (_, l) in self.listeners.drain() {
            l.cancel.cancel();
        }
    }
}

static AT_CAP: LogLimiter = LogLimiter::new(3, Duration::from_secs(10));

fn log_at_cap(limiter: &ConnLimiter, f: Frontend, what: &str) {
    if let Some(suppressed) = AT_CAP.check() {
        tracing::warn!(frontend = %f, cap = limiter.capacity(), suppressed,
            "proxy connection limit reached (--max-connections): {what}");
    }
}

async fn serve_tcp(
    listener: TcpListener,
    f: Frontend,
    pool: Arc<PoolHandle>,
    cancel: CancellationToken,
    limits: Arc<Limits>,
) {
    let mut acceptor = Acceptor::new("proxy");
    loop {
        let (conn, peer) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = acceptor.accept(&listener) => r,
        };
        let Some(permit) = limits.conns.try_acquire() else {
            log_at_cap(&limits.conns, f, "closing new connections");
            drop(conn);
            continue;
        };
        tokio::spawn(proxy_tcp(
            conn,
            peer,
            f,
            pool.clone(),
            permit,
            limits.tcp_idle,
            limits.splice,
        ));
    }
}

/// Connects to a backend, retrying on the next endpoint after a failure.
pub async fn connect_backend(
    pool: &PoolHandle,
    src: IpAddr,
    dst: IpAddr,
) -> Option<(TcpStream, Picked)> {
    let mut tried = Vec::new();
    for (attempt, t) in DIAL_TIMEOUTS.iter().enumerate() {
        let picked = pool.pick(src, dst, attempt > 0, &tried)?;
        match tokio::time::timeout(*t, dial(picked.endpoint)).await {
            Ok(Ok(s)) => return Some((s, picked)),
            Ok(Err(e)) => {
                tracing::debug!(endpoint = %picked.endpoint, error = %e, "connect failed; trying the next endpoint");
            }
            Err(_) => {
                tracing::debug!(endpoint = %picked.endpoint, "connect timed out; trying the next endpoint");
            }
        }
        tried.push(picked.endpoint);
    }
    None
}

/// Connects to `endpoint` with `TCP_NODELAY` set before the handshake (keepalive comes later,
/// [`KEEPALIVE_AFTER`]). The outcome is read from the readiness epoll reports: a refused or
/// failed connect shows as an error (`EPOLLERR`), and only then is `SO_ERROR` asked for the
/// reason, so a successful connect costs no `getsockopt` (HAProxy does the same).
async fn dial(endpoint: SocketAddr) -> std::io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = if endpoint.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::sockopt::set_tcp_nodelay(&fd, true)?;
    match rustix::net::connect(&fd, &endpoint) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let stream = TcpStream::from_std(std::net::TcpStream::from(fd))?;
    let ready = stream.ready(Interest::WRITABLE).await?;
    if (ready.is_error() || ready.is_write_closed())
        && let Some(e) = stream.take_error()?
    {
        return Err(e);
    }
    Ok(stream)
}

/// A proxied connection still open after this long gets keepalive probes on its backend
/// socket (the client socket has them from the listener). Short connections, the common
/// case, never pay the four `setsockopt` calls; the probes start `Keepalive::idle` (15 s)
/// after the last traffic either way.
pub const KEEPALIVE_AFTER: Duration = Duration::from_secs(1);

async fn proxy_tcp(
    client: TcpStream,
    peer: SocketAddr,
    f: Frontend,
    pool: Arc<PoolHandle>,
    permit: ConnPermit,
    idle: Option<Duration>,
    splice: bool,
) {
    let _permit = permit;
    let Some((mut backend, picked)) = connect_backend(&pool, peer.ip(), f.ip).await else {
        tracing::debug!(frontend = %f, client = %peer, "no endpoint reachable; closing");
        return;
    };
    if let Some(v) = picked.proxy_protocol {
        let h = proxyproto::header(v, peer, SocketAddr::new(f.ip, f.port));
        if backend.write_all(&h).await.is_err() {
            return;
        }
    }
    let activity = Activity::new();
    let copy = pump(&client, &backend, &activity, splice);
    // One timer per connection: keepalive on the backend once it outlives a short one, then
    // the idle timeout.
    let watch = async {
        tokio::time::sleep(KEEPALIVE_AFTER).await;
        if let Err(e) =
            ferry_limits::keepalive::set(&backend, ferry_limits::keepalive::Keepalive::default())
        {
            tracing::debug!(frontend = %f, error = %e, "backend keepalive");
        }
        match idle {
            Some(idle) => activity.idle_for(idle).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = copy => {}
        _ = watch => {
            tracing::debug!(frontend = %f, client = %peer, ?idle, "idle timeout; closing");
        }
    }
    drop(picked.guard);
}

/// When a connection last carried data (milliseconds since its start).
#[derive(Clone)]
struct Activity {
    base: Instant,
    last: Arc<AtomicU64>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            base: Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
        }
    }
    fn touch(&self) {
        self.last.store(millis_since(self.base), Ordering::Relaxed);
    }
    /// Completes once nothing was touched for `idle`.
    async fn idle_for(&self, idle: Duration) {
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        loop {
            let quiet = millis_since(self.base).saturating_sub(self.last.load(Ordering::Relaxed));
            if quiet >= idle_ms {
                return;
            }
            tokio::time::sleep(Duration::from_millis(idle_ms - quiet)).await;
        }
    }
}

/// Copy buffers kept per thread for reuse: enough for the connections one thread moves data
/// for at the same instant, not for every open connection.
const POOLED_BUFS: usize = 32;

thread_local! {
    static BUFS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn take_buf() -> Vec<u8> {
    BUFS.with(|b| b.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; COPY_BUF])
}

fn give_buf(buf: Vec<u8>) {
    BUFS.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < POOLED_BUFS {
            b.push(buf);
        }
    });
}

/// How a buffered copy stopped.
enum Copied {
    /// `src` reached EOF.
    Eof,
    /// A read filled the whole buffer (and was written out): a bulk transfer, worth a pipe.
    Bulk,
}

/// Copies `src` to `dst` until EOF on `src` (returns the bytes copied) or an error.
///
/// Every transfer starts with a pooled user-space buffer ([`copy_buffered`]): a short
/// connection costs no pipe. Once a read fills a whole buffer (a bulk transfer) and `splice`
/// is on, the data moves through a pipe with `splice(2)` instead ([`copy_spliced`]): the pages
/// the kernel received are handed to the destination socket without being copied into and out
/// of the proxy (HAProxy's `option splice-auto` does the same for streams). When no pipe can be
/// had (see [`SPLICE_PIPES`]) the buffer path carries on.
async fn copy_half(
    src: &TcpStream,
    dst: &TcpStream,
    activity: &Activity,
    splice: bool,
) -> std::io::Result<u64> {
    let mut total = 0u64;
    loop {
        match copy_buffered(src, dst, activity, splice, &mut total).await? {
            Copied::Eof => return Ok(total),
            Copied::Bulk => {
                if let Some(pipe) = Pipe::take()
                    && let Copied::Eof = copy_spliced(src, dst, activity, pipe, &mut total).await?
                {
                    return Ok(total);
                }
            }
        }
    }
}

/// The buffered copy: until EOF on `src`, or (when `stop_on_bulk`) until a read fills the
/// whole buffer. Holds a pooled buffer only while data is in flight.
///
/// When the readiness that woke the read already says the peer has finished (`EPOLLRDHUP`
/// without an error) and the read drained the socket, the data is the last there is: it is
/// sent with `MSG_MORE` and EOF returned at once, so the caller's half-close puts the FIN in the
/// same segment as the data (as HAProxy does) and the read that would return 0 is skipped.
async fn copy_buffered(
    src: &TcpStream,
    dst: &TcpStream,
    activity: &Activity,
    stop_on_bulk: bool,
    total: &mut u64,
) -> std::io::Result<Copied> {
    let mut buf: Option<Vec<u8>> = None;
    // The peer's FIN has arrived (as of the last readiness seen).
    let mut fin = false;
    loop {
        // Read: without a buffer, wait until the source has something first.
        let n = loop {
            let b = match buf.as_mut() {
                Some(b) => b,
                None => {
                    let ready = src.ready(Interest::READABLE).await?;
                    fin = ready.is_read_closed() && !ready.is_error();
                    buf.insert(take_buf())
                }
            };
            match src.try_read(b) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // Drained: the buffer goes back to the pool while we wait.
                    if let Some(b) = buf.take() {
                        give_buf(b);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if let Some(b) = buf.take() {
                        give_buf(b);
                    }
                    return Err(e);
                }
            }
        };
        let Some(b) = buf.as_ref() else { continue };
        if n == 0 {
            if let Some(b) = buf.take() {
                give_buf(b);
            }
            return Ok(Copied::Eof);
        }
        activity.touch();
        // A short read after the FIN: nothing follows but EOF.
        let last = fin && n < b.len();
        let mut off = 0;
        while off < n {
            let r = if last {
                dst.try_io(Interest::WRITABLE, || {
                    rustix::net::send(
                        dst,
                        &b[off..n],
                        rustix::net::SendFlags::MORE
                            | rustix::net::SendFlags::NOSIGNAL
                            | rustix::net::SendFlags::DONTWAIT,
                    )
                    .map_err(std::io::Error::from)
                })
            } else {
                dst.try_write(&b[off..n])
            };
            match r {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(w) => off += w,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => dst.writable().await?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        *total += n as u64;
        if last {
            if let Some(b) = buf.take() {
                give_buf(b);
            }
            return Ok(Copied::Eof);
        }
        if n < b.len() {
            // A short read means the socket had no more (tokio's own `poll_read` assumes the
            // same): give the buffer back and wait for readiness without a read that would
            // only return EAGAIN. A FIN that came with the data keeps the socket readable.
            if let Some(b) = buf.take() {
                give_buf(b);
            }
            let _ = src.try_io(Interest::READABLE, || {
                Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
            });
        } else if stop_on_bulk {
            if let Some(b) = buf.take() {
                give_buf(b);
            }
            return Ok(Copied::Bulk);
        }
    }
}

/// Pipes open at once in the whole process (pooled ones included): each holds two
/// descriptors beyond the two sockets a connection is budgeted for
/// ([`ferry_limits::plan`]), so they come out of the budget's reserve; beyond this many
/// concurrent bulk transfers, the rest use buffers.
pub const SPLICE_PIPES: usize = 64;
/// The capacity asked for each pipe (`F_SETPIPE_SZ`): one `splice` moves up to this much.
const PIPE_SIZE: usize = 256 * 1024;
/// Empty pipes kept per thread for reuse.
const POOLED_PIPES: usize = 8;

static PIPES_OPEN: AtomicUsize = AtomicUsize::new(0);
/// Bytes moved by `splice` since the process started (diagnostics and tests).
static SPLICED: AtomicU64 = AtomicU64::new(0);

/// Bytes the TCP data path moved through pipes (`splice`) rather than buffers.
pub fn spliced_bytes() -> u64 {
    SPLICED.load(Ordering::Relaxed)
}

/// A pipe for splicing, counted against [`SPLICE_PIPES`] while open.
struct Pipe {
    r: rustix::fd::OwnedFd,
    w: rustix::fd::OwnedFd,
}

thread_local! {
    static PIPES: std::cell::RefCell<Vec<Pipe>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Pipe {
    /// An empty pipe from this thread's pool or a new one; `None` at the cap or when the
    /// process is out of descriptors.
    fn take() -> Option<Pipe> {
        if let Some(p) = PIPES.with(|p| p.borrow_mut().pop()) {
            return Some(p);
        }
        if PIPES_OPEN.fetch_add(1, Ordering::Relaxed) >= SPLICE_PIPES {
            PIPES_OPEN.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        match rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::NONBLOCK | rustix::pipe::PipeFlags::CLOEXEC,
        ) {
            Ok((r, w)) => {
                // A larger pipe moves more per call; the default (64 KiB) still works.
                let _ = rustix::pipe::fcntl_setpipe_size(&w, PIPE_SIZE);
                Some(Pipe { r, w })
            }
            Err(e) => {
                PIPES_OPEN.fetch_sub(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "no pipe for splicing; copying through a buffer");
                None
            }
        }
    }

    /// Hands an empty pipe back to this thread's pool (or closes it).
    fn give(self) {
        PIPES.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < POOLED_PIPES {
                p.push(self);
            }
        });
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        PIPES_OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The spliced copy: `src` -> pipe -> `dst`, each chunk drained before the next is read (so an
/// `EAGAIN` from the first splice always means the socket is empty, never a full pipe). Holds
/// the pipe only while data is in flight, as [`copy_buffered`] holds its buffer; returns
/// [`Copied::Bulk`] when the source went quiet and no pipe is left to resume with.
async fn copy_spliced(
    src: &TcpStream,
    dst: &TcpStream,
    activity: &Activity,
    pipe: Pipe,
    total: &mut u64,
) -> std::io::Result<Copied> {
    use rustix::pipe::{SpliceFlags, splice};
    let mut pipe = Some(pipe);
    loop {
        let p = match pipe.as_ref() {
            Some(p) => p,
            None => {
                src.readable().await?;
                match Pipe::take() {
                    Some(p) => pipe.insert(p),
                    None => return Ok(Copied::Bulk),
                }
            }
        };
        let r = src.try_io(Interest::READABLE, || {
            splice(
                src,
                None,
                &p.w,
                None,
                PIPE_SIZE,
                SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
            )
            .map_err(std::io::Error::from)
        });
        let n = match r {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Drained (the pipe is empty): it goes back to the pool while we wait.
                if let Some(p) = pipe.take() {
                    p.give();
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                if let Some(p) = pipe.take() {
                    p.give();
                }
                return Err(e);
            }
        };
        if n == 0 {
            if let Some(p) = pipe.take() {
                p.give();
            }
            return Ok(Copied::Eof);
        }
        activity.touch();
        let mut left = n;
        while left > 0 {
            let r = dst.try_io(Interest::WRITABLE, || {
                splice(
                    &p.r,
                    None,
                    dst,
                    None,
                    left,
                    SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
                )
                .map_err(std::io::Error::from)
            });
            match r {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(w) => left -= w,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => dst.writable().await?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The pipe still holds data: it is closed (dropped), not pooled.
                Err(e) => return Err(e),
            }
        }
        *total += n as u64;
        SPLICED.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Copies both ways between `client` and `backend` until both directions have seen EOF or
/// either fails. The first direction to end half-closes its destination (the peer learns that
/// no more data comes, the other direction keeps flowing); the caller's drop of both sockets
/// then closes them, which sends the remaining FIN without a second `shutdown`.
async fn pump(
    client: &TcpStream,
    backend: &TcpStream,
    activity: &Activity,
    splice: bool,
) -> std::io::Result<()> {
    let up = copy_half(client, backend, activity, splice);
    let down = copy_half(backend, client, activity, splice);
    tokio::pin!(up, down);
    tokio::select! {
        r = &mut up => {
            r?;
            half_close(backend);
            down.await?;
        }
        r = &mut down => {
            r?;
            half_close(client);
            up.await?;
        }
    }
    Ok(())
}

/// `shutdown(SHUT_WR)`; a peer that is already gone is no error worth reporting.
fn half_close(s: &TcpStream) {
    let _ = rustix::net::shutdown(s, rustix::net::Shutdown::Write);
}

struct Flow {
    sock: Arc<UdpSocket>,
    last: AtomicU64,
    _guard: ActiveGuard,
    _permit: ConnPermit,
}

fn millis_since(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX)
}

type Flows = Arc<Mutex<HashMap<SocketAddr, Arc<Flow>>>>;

fn lock_flows(f: &Flows) -> MutexGuard<'_, HashMap<SocketAddr, Arc<Flow>>> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

async fn serve_udp(
    sock: Arc<UdpSocket>,
    f: Frontend,
    pool: Arc<PoolHandle>,
    cancel: CancellationToken,
    limits: Arc<Limits>,
) {
    let idle = limits.udp_idle;
    let flows: Flows = Arc::new(Mutex::new(HashMap::new()));
    let base = Instant::now();
    let mut buf = vec![0u8; 65536];
    let mut backoff = ferry_limits::AcceptBackoff::default();
    loop {
        let (n, client) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => {
                    backoff.reset();
                    x
                }
                // ICMP errors from earlier sends surface here; nothing to do.
                Err(e) if matches!(e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset) => {
                    tracing::trace!(frontend = %f, error = %e, "udp recv");
                    continue;
                }
                Err(e) => {
                    let d = backoff.next_delay();
                    tracing::trace!(frontend = %f, error = %e, "udp recv failed; backing off");
                    tokio::time::sleep(d).await;
                    continue;
                }
            }
        };
        let existing = lock_flows(&flows).get(&client).cloned();
        let flow = match existing {
            Some(fl) => fl,
            None => match open_flow(&pool, client, f, &limits.conns).await {
                Some(fl) => {
                    let fl = Arc::new(fl);
                    lock_flows(&flows).insert(client, fl.clone());
                    tokio::spawn(udp_replies(
                        sock.clone(),
                        fl.clone(),
                        flows.clone(),
                        client,
                        base,
                        idle,
                        cancel.clone(),
                    ));
                    fl
                }
                None => continue,
            },
        };
        flow.last.store(millis_since(base), Ordering::Relaxed);
        if let Err(e) = flow.sock.send(&buf[..n]).await {
            tracing::debug!(frontend = %f, error = %e, "udp send to backend failed");
        }
    }
}

async fn open_flow(
    pool: &PoolHandle,
    client: SocketAddr,
    f: Frontend,
    conns: &ConnLimiter,
) -> Option<Flow> {
    let Some(permit) = conns.try_acquire() else {
        log_at_cap(conns, f, "dropping datagrams of new UDP flows");
        return None;
    };
    let picked = pool.pick(client.ip(), f.ip, false, &[])?;
    let any: SocketAddr = if picked.endpoint.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any).await.ok()?;
    s.connect(picked.endpoint).await.ok()?;
    Some(Flow {
        sock: Arc::new(s),
        last: AtomicU64::new(0),
        _guard: picked.guard,
        _permit: permit,
    })
}

async fn udp_replies(
    front: Arc<UdpSocket>,
    flow: Arc<Flow>,
    flows: Flows,
    client: SocketAddr,
    base: Instant,
    idle: Duration,
    cancel: CancellationToken,
) {
    let mut buf = vec![0u8; 65536];
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = tokio::time::timeout(idle, flow.sock.recv(&mut buf)) => match r {
                Ok(Ok(n)) => {
                    flow.last.store(millis_since(base), Ordering::Relaxed);
                    let _ = front.send_to(&buf[..n], client).await;
                }
                // The backend refused (ICMP port unreachable) or the socket broke.
                Ok(Err(_)) => break,
                Err(_) => {
                    let last = flow.last.load(Ordering::Relaxed);
                    if millis_since(base).saturating_sub(last) >= idle_ms {
                        break;
                    }
                }
            }
        }
    }
    let mut g = lock_flows(&flows);
    if g.get(&client).is_some_and(|f| Arc::ptr_eq(f, &flow)) {
        g.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets (connecting side, accepted side).
    async fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let (a, b) = tokio::join!(TcpStream::connect(l.local_addr().unwrap()), l.accept());
        (a.unwrap(), b.unwrap().0)
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Runs `pump` between (client, backend) pairs: the test holds `user` (the client's
    /// peer) and `server` (the backend's peer).
    async fn proxied() -> (
        TcpStream,
        TcpStream,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (user, client) = pair(&l).await;
        let (backend, server) = pair(&l).await;
        let task = tokio::spawn(async move {
            let activity = Activity::new();
            pump(&client, &backend, &activity, true).await
        });
        (user, server, task)
    }

    #[tokio::test]
    async fn client_half_close_then_large_reply() {
        let (mut user, mut server, task) = proxied().await;
        let request = pattern(100_000, 1);
        user.write_all(&request).await.unwrap();
        user.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, request, "request bytes and then EOF reach the backend");
        // The other direction still flows after the client's FIN.
        let reply = pattern(1_000_000, 7);
        server.write_all(&reply).await.unwrap();
        drop(server);
        let mut got = Vec::new();
        user.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), reply.len());
        assert!(got == reply);
        task.await.unwrap().unwrap();
    }

    /// Data and FIN already queued when the pump first looks (the `MSG_MORE` + half-close
    /// path): the data arrives whole, then EOF, and the other direction still flows.
    #[tokio::test]
    async fn data_with_fin_already_queued() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (mut user, client) = pair(&l).await;
        let (backend, mut server) = pair(&l).await;
        let request = pattern(40_000, 5);
        user.write_all(&request).await.unwrap();
        user.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let task = tokio::spawn(async move {
            let activity = Activity::new();
            pump(&client, &backend, &activity, true).await
        });
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert!(got == request, "{} of {} bytes", got.len(), request.len());
        server.write_all(b"reply").await.unwrap();
        drop(server);
        let mut got = Vec::new();
        user.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"reply");
        task.await.unwrap().unwrap();
    }

    /// Bulk both ways at once goes through pipes (spliced bytes grow), arrives whole and in
    /// order, and every pipe is back in a pool or closed afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_transfers_are_spliced_whole() {
        let (user, server, task) = proxied().await;
        let before = spliced_bytes();
        let up = pattern(3_000_000, 11);
        let down = pattern(5_000_000, 13);
        let (mut ur, mut uw) = user.into_split();
        let (mut sr, mut sw) = server.into_split();
        let (u2, d2) = (up.clone(), down.clone());
        let w1 = tokio::spawn(async move {
            uw.write_all(&u2).await.unwrap();
            uw.shutdown().await.unwrap();
        });
        let w2 = tokio::spawn(async move {
            sw.write_all(&d2).await.unwrap();
            sw.shutdown().await.unwrap();
        });
        let (mut got_up, mut got_down) = (Vec::new(), Vec::new());
        let (a, b) = tokio::join!(sr.read_to_end(&mut got_up), ur.read_to_end(&mut got_down));
        a.unwrap();
        b.unwrap();
        w1.await.unwrap();
        w2.await.unwrap();
        task.await.unwrap().unwrap();
        assert!(got_up == up, "{} of {} bytes up", got_up.len(), up.len());
        assert!(
            got_down == down,
            "{} of {} bytes down",
            got_down.len(),
            down.len()
        );
        // Other tests splice concurrently, so only a lower bound holds: most of the bytes
        // of both directions (all but the first buffer-sized reads) went through pipes.
        let spliced = spliced_bytes() - before;
        assert!(spliced >= 6_000_000, "only {spliced} bytes spliced");
        assert!(PIPES_OPEN.load(Ordering::Relaxed) <= SPLICE_PIPES);
    }

    /// With splicing off the same transfer moves through buffers.
    #[tokio::test]
    async fn buffered_copy_without_splice() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (mut user, client) = pair(&l).await;
        let (backend, mut server) = pair(&l).await;
        let task = tokio::spawn(async move {
            let activity = Activity::new();
            pump(&client, &backend, &activity, false).await
        });
        let reply = pattern(2_000_000, 17);
        server.write_all(&reply).await.unwrap();
        drop(server);
        let mut got = Vec::new();
        user.read_to_end(&mut got).await.unwrap();
        assert!(got == reply, "{} of {} bytes", got.len(), reply.len());
        drop(user);
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn backend_closes_first_client_keeps_sending() {
        let (mut user, mut server, task) = proxied().await;
        server.write_all(b"hello").await.unwrap();
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        user.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
        // Half-closed towards the client only: the client's data still reaches the backend.
        let more = pattern(300_000, 3);
        user.write_all(&more).await.unwrap();
        drop(user);
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert!(got == more, "{} of {} bytes", got.len(), more.len());
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_reset_ends_both_directions() {
        let (user, mut server, task) = proxied().await;
        // Unread data at close makes the kernel send a RST.
        server.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        rustix::net::sockopt::set_socket_linger(&user, Some(Duration::ZERO)).unwrap();
        drop(user);
        let r = tokio::time::timeout(Duration::from_secs(30), task).await;
        assert!(r.is_ok(), "the pump ends after a reset");
        let mut sink = Vec::new();
        // The backend side is closed too (EOF or reset, but never a hang).
        let _ = tokio::time::timeout(Duration::from_secs(30), server.read_to_end(&mut sink))
            .await
            .unwrap();
    }

    /// The data path relies on Linux copying a listener's TCP options into accepted sockets.
    #[tokio::test]
    async fn accepted_sockets_inherit_nodelay_and_keepalive() {
        let sock = TcpSocket::new_v4().unwrap();
        sock.set_nodelay(true).unwrap();
        let ka = ferry_limits::keepalive::Keepalive::default();
        ferry_limits::keepalive::set(&sock, ka).unwrap();
        sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = sock.listen(16).unwrap();
        let (_c, accepted) = pair(&l).await;
        assert!(accepted.nodelay().unwrap());
        assert!(rustix::net::sockopt::socket_keepalive(&accepted).unwrap());
        assert_eq!(
            rustix::net::sockopt::tcp_keepidle(&accepted).unwrap(),
            ka.idle
        );
        assert_eq!(
            rustix::net::sockopt::tcp_keepcnt(&accepted).unwrap(),
            ka.count
        );
        // A listener without them gives sockets without them (the check can fail).
        let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_c, accepted) = pair(&plain).await;
        assert!(!accepted.nodelay().unwrap());
        assert!(!rustix::net::sockopt::socket_keepalive(&accepted).unwrap());
    }

    fn one_pool_table(fronts: &[SocketAddr], ep: &str) -> Table {
        let key = PoolKey {
            port: crate::model::ServicePortName {
                namespace: "ns".into(),
                name: "a".into(),
                port: "p".into(),
                proto: Proto::Tcp,
            },
            reach: crate::table::Reach::Internal,
            ipv6: false,
        };
        let mut t = Table::default();
        t.pools.insert(
            key.clone(),
            Pool {
                endpoints: vec![ep.parse().unwrap()],
                scheduler: crate::sched::Scheduler::RoundRobin,
                affinity: Some(Duration::from_secs(5)),
                proxy_protocol: None,
            },
        );
        for f in fronts {
            t.frontends.insert(
                Frontend {
                    ip: f.ip(),
                    port: f.port(),
                    proto: Proto::Tcp,
                },
                key.clone(),
            );
        }
        t
    }

    /// Deltas open and close listeners; a frontend that cannot be bound is retried at every
    /// later apply (also an empty delta) and forgotten when the table drops it.
    #[tokio::test]
    async fn deltas_open_close_and_retry_failed_frontends() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = taken.local_addr().unwrap();
        let free = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let mut inc = crate::table::incr::Incremental::default();
        let mut dp = Dataplane::new(DataplaneConfig::default(), CancellationToken::new());
        let svc = ("ns".to_string(), "a".to_string());
        let d = inc.update([(svc.clone(), one_pool_table(&[busy, free], "10.0.0.1:80"))]);
        let r = dp.apply_delta(&d);
        assert_eq!(r.opened, 1);
        assert_eq!(r.failed.len(), 1, "{r:?}");
        assert_eq!(dp.listening().len(), 1);
        assert_eq!(dp.affine.len(), 1);
        // Still taken: retried (and failing) with nothing changed.
        let r = dp.apply_delta(&Default::default());
        assert_eq!((r.opened, r.failed.len()), (0, 1));
        drop(taken);
        let r = dp.apply_delta(&Default::default());
        assert_eq!((r.opened, r.failed.len()), (1, 0));
        assert_eq!(dp.listening().len(), 2);
        // The endpoint changes: the pool is updated in place, no listener moves.
        let before = dp.pool(inc.table().pools.keys().next().unwrap()).unwrap();
        let d = inc.update([(svc.clone(), one_pool_table(&[busy, free], "10.0.0.2:80"))]);
        assert!(d.frontends.is_empty());
        let r = dp.apply_delta(&d);
        assert_eq!((r.opened, r.closed), (0, 0));
        let after = dp.pool(inc.table().pools.keys().next().unwrap()).unwrap();
        assert!(Arc::ptr_eq(&before, &after));
        assert_eq!(after.active(), vec![("10.0.0.2:80".parse().unwrap(), 0)]);
        // The Service goes: everything closes.
        let d = inc.update([(svc, Table::default())]);
        let r = dp.apply_delta(&d);
        assert_eq!(r.closed, 2);
        assert!(dp.listening().is_empty() && dp.pools.is_empty() && dp.affine.is_empty());
        // A frontend that failed and then left the table is not retried.
        let hold = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut inc = crate::table::incr::Incremental::default();
        let k = ("ns".to_string(), "b".to_string());
        let t = one_pool_table(&[hold.local_addr().unwrap()], "10.0.0.1:80");
        assert_eq!(
            dp.apply_delta(&inc.update([(k.clone(), t)])).failed.len(),
            1
        );
        dp.apply_delta(&inc.update([(k, Table::default())]));
        assert!(dp.failed.is_empty());
        assert!(dp.apply_delta(&Default::default()).failed.is_empty());
    }

    /// The connect outcome comes from epoll readiness: a refused connect is an error (so the
    /// next endpoint is tried), an accepted one a stream with `TCP_NODELAY` and no keepalive yet.
    #[tokio::test]
    async fn dial_reports_refusal_and_connects_without_keepalive() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let err = dial(closed).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = dial(l.local_addr().unwrap()).await.unwrap();
        assert!(s.nodelay().unwrap());
        assert!(!rustix::net::sockopt::socket_keepalive(&s).unwrap());
        assert_eq!(s.peer_addr().unwrap(), l.local_addr().unwrap(), "connected");
        // connect_backend skips a refusing endpoint for a live one.
        let pool = PoolHandle::new(&Pool {
            endpoints: vec![closed, l.local_addr().unwrap()],
            scheduler: crate::sched::Scheduler::RoundRobin,
            affinity: None,
            proxy_protocol: None,
        });
        for _ in 0..4 {
            let (s, picked) = connect_backend(&pool, "127.0.0.1".parse().unwrap(), closed.ip())
                .await
                .unwrap();
            assert_eq!(picked.endpoint, l.local_addr().unwrap());
            assert_eq!(s.peer_addr().unwrap(), l.local_addr().unwrap());
        }
    }

    #[test]
    fn buffer_pool_is_bounded_and_reused() {
        let bufs: Vec<Vec<u8>> = (0..POOLED_BUFS + 5).map(|_| take_buf()).collect();
        let ptrs: BTreeSet<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        for b in bufs {
            assert_eq!(b.len(), COPY_BUF);
            give_buf(b);
        }
        assert_eq!(BUFS.with(|b| b.borrow().len()), POOLED_BUFS);
        let again = take_buf();
        assert!(
            ptrs.contains(&(again.as_ptr() as usize)),
            "a pooled buffer is reused"
        );
    }
}
