//! The userspace data path: a listening socket per frontend (service address), a pool of
//! endpoints behind each, bidirectional copying for TCP and a per-client flow table for UDP.
//!
//! [`Dataplane::apply`] takes a whole [`Table`] and changes only what differs: it swaps pool
//! endpoint sets in place (selection state and affinity survive), closes the listeners of
//! frontends that went away (so a connection is refused at once) and opens new ones. A
//! frontend that cannot be bound (the address is not local, the port is taken) is logged and
//! retried on every later apply.
//!
//! Copying uses `tokio::io::copy_bidirectional_with_sizes` with 64 KiB buffers. `splice(2)`
//! would avoid the copy through user space, but tokio exposes no safe splice and this workspace
//! forbids `unsafe`; it is the next step for throughput.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

use crate::model::{Proto, ProxyProtocol};
use crate::proxyproto;
use crate::sched::PoolState;
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
        Self::set(&mut self.lock(), pool);
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

/// Data-path settings.
#[derive(Debug, Clone)]
pub struct DataplaneConfig {
    /// A UDP flow without traffic for this long is forgotten.
    pub udp_idle: Duration,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            udp_idle: Duration::from_millis(250),
        }
    }
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
    cfg: DataplaneConfig,
    pools: HashMap<PoolKey, Arc<PoolHandle>>,
    listeners: HashMap<Frontend, Listener>,
    failed: BTreeSet<Frontend>,
    root: CancellationToken,
}

impl Dataplane {
    pub fn new(cfg: DataplaneConfig, root: CancellationToken) -> Self {
        Dataplane {
            cfg,
            pools: HashMap::new(),
            listeners: HashMap::new(),
            failed: BTreeSet::new(),
            root,
        }
    }

    /// The pool handle of a key (tests and diagnostics).
    pub fn pool(&self, key: &PoolKey) -> Option<Arc<PoolHandle>> {
        self.pools.get(key).cloned()
    }

    /// Frontends currently listening.
    pub fn listening(&self) -> BTreeSet<Frontend> {
        self.listeners.keys().copied().collect()
    }

    /// Makes the data path serve `table`.
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
            if let Some(l) = self.listeners.remove(&f) {
                l.cancel.cancel();
                report.closed += 1;
                tracing::debug!(frontend = %f, "closed");
            }
        }
        self.pools.retain(|k, _| table.pools.contains_key(k));
        for (k, p) in &table.pools {
            match self.pools.get(k) {
                Some(h) => h.update(p),
                None => {
                    self.pools.insert(k.clone(), Arc::new(PoolHandle::new(p)));
                }
            }
        }
        let now = Instant::now();
        for h in self.pools.values() {
            h.expire(now);
        }
        self.failed.retain(|f| table.frontends.contains_key(f));
        for (f, key) in &table.frontends {
            if self.listeners.contains_key(f) {
                continue;
            }
            let Some(pool) = self.pools.get(key).cloned() else {
                continue;
            };
            let cancel = self.root.child_token();
            match self.open(*f, pool, cancel.clone()) {
                Ok(()) => {
                    self.listeners.insert(
                        *f,
                        Listener {
                            key: key.clone(),
                            cancel,
                        },
                    );
                    if self.failed.remove(f) {
                        tracing::info!(frontend = %f, "listening after earlier failure");
                    }
                    report.opened += 1;
                    tracing::debug!(frontend = %f, service = %key.port, "listening");
                }
                Err(e) => {
                    if self.failed.insert(*f) {
                        tracing::warn!(frontend = %f, service = %key.port, error = %e,
                            "cannot serve this service address (retrying on every sync)");
                    }
                    report.failed.push((*f, e.to_string()));
                }
            }
        }
        report
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
                sock.bind(addr)?;
                let listener = sock.listen(1024)?;
                tokio::spawn(serve_tcp(listener, f, pool, cancel));
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
                    self.cfg.udp_idle,
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

async fn serve_tcp(
    listener: TcpListener,
    f: Frontend,
    pool: Arc<PoolHandle>,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((conn, peer)) => {
                    tokio::spawn(proxy_tcp(conn, peer, f, pool.clone()));
                }
                Err(e) => {
                    // Out of descriptors and the like: back off briefly.
                    tracing::warn!(frontend = %f, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
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
        match tokio::time::timeout(*t, TcpStream::connect(picked.endpoint)).await {
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

async fn proxy_tcp(mut client: TcpStream, peer: SocketAddr, f: Frontend, pool: Arc<PoolHandle>) {
    let Some((mut backend, picked)) = connect_backend(&pool, peer.ip(), f.ip).await else {
        tracing::debug!(frontend = %f, client = %peer, "no endpoint reachable; closing");
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = backend.set_nodelay(true);
    if let Some(v) = picked.proxy_protocol {
        let h = proxyproto::header(v, peer, SocketAddr::new(f.ip, f.port));
        if backend.write_all(&h).await.is_err() {
            return;
        }
    }
    let _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut backend, COPY_BUF, COPY_BUF)
        .await;
    drop(picked.guard);
}

struct Flow {
    sock: Arc<UdpSocket>,
    last: AtomicU64,
    _guard: ActiveGuard,
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
    idle: Duration,
) {
    let flows: Flows = Arc::new(Mutex::new(HashMap::new()));
    let base = Instant::now();
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, client) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    // ICMP errors from earlier sends surface here; nothing to do.
                    tracing::trace!(frontend = %f, error = %e, "udp recv");
                    continue;
                }
            }
        };
        let existing = lock_flows(&flows).get(&client).cloned();
        let flow = match existing {
            Some(fl) => fl,
            None => match open_flow(&pool, client, f).await {
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

async fn open_flow(pool: &PoolHandle, client: SocketAddr, f: Frontend) -> Option<Flow> {
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
