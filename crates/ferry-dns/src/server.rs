//! UDP and TCP servers around the answer function.
//!
//! UDP is served by a few OS threads blocking on clones of one socket (one syscall per receive,
//! no readiness polling); each thread keeps a cache of encoded cluster answers, invalidated when
//! the index generation changes. Forwarding runs on the tokio runtime.
//!
//! TCP connections are capped ([`TcpConfig::max_connections`]): at the cap the server stops
//! accepting and new connections wait in the kernel's listen queue until a slot frees. Each
//! connection has CoreDNS's default timeouts: 3 s to read a query, 10 s idle between queries,
//! 5 s to write an answer. Accept errors back off instead of spinning.

use std::io::{IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use crate::error::{Context, Error, Result};
use ipnet::IpNet;
use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg};
use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags, SocketAddrAny};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::answer::{Outcome, Question, answer};
use crate::cache::AnswerCache;
use crate::forward::{ForwardConfig, Forwarder, truncate_reply};
use crate::index::Index;
use crate::metrics::Metrics;
use crate::wire::{self, ParseError, Request};

/// The index shared by the watchers (writers) and the servers (readers).
pub struct SharedIndex {
    index: RwLock<Index>,
    generation: AtomicU64,
    ready: AtomicBool,
}

impl SharedIndex {
    pub fn new(index: Index) -> Self {
        let generation = AtomicU64::new(index.generation());
        SharedIndex {
            index: RwLock::new(index),
            generation,
            ready: AtomicBool::new(false),
        }
    }
    /// Reads the index. A poisoned lock still yields the last index (serve-stale).
    pub fn read(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }
    /// Applies a change; returns what `f` returns.
    pub fn update<R>(&self, f: impl FnOnce(&mut Index) -> R) -> R {
        let mut g = self.index.write().unwrap_or_else(|p| p.into_inner());
        let r = f(&mut g);
        self.generation.store(g.generation(), Ordering::Release);
        r
    }
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }
    pub fn set_not_ready(&self) {
        self.ready.store(false, Ordering::Release);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// Settings of the DNS servers.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// UDP and TCP listen address (port 0 picks one; both use the UDP socket's port then).
    pub listen: SocketAddr,
    /// Threads receiving on the UDP socket.
    pub udp_workers: usize,
    /// Clients allowed to have non-cluster names resolved (everyone gets cluster answers).
    pub allow_recursion_from: Vec<IpNet>,
    pub forward: ForwardConfig,
    pub tcp: TcpConfig,
}

/// DNS-over-TCP limits.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// Concurrent connections; more wait in the listen queue.
    pub max_connections: usize,
    /// Time to read a whole query once a connection is open (CoreDNS: 3 s).
    pub read_timeout: Duration,
    /// Time a connection may stay open between queries (CoreDNS: 10 s).
    pub idle_timeout: Duration,
    /// Time to write an answer (CoreDNS: 5 s).
    pub write_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_connections: default_tcp_max_connections(),
            read_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(5),
        }
    }
}

/// The TCP cap a DNS server alone in its process gets from the descriptor limit.
pub fn default_tcp_max_connections() -> usize {
    let parts = ferry_limits::Parts {
        dns: true,
        ..Default::default()
    };
    ferry_limits::plan(ferry_limits::fdlimit::current().soft, parts).dns_tcp
}

struct Inner {
    index: Arc<SharedIndex>,
    forwarder: Forwarder,
    metrics: Arc<Metrics>,
    acl: Vec<IpNet>,
    tcp: TcpConfig,
}

/// A query parsed and keyed, waiting for its answer-cache lookup.
struct Prepared<'a> {
    req: Request<'a>,
    limit: usize,
    /// Its cache key, in the caller's key buffer.
    key: std::ops::Range<usize>,
    hash: u64,
}

/// The first half of handling a query: parsed and keyed, or already answered (malformed,
/// unsupported EDNS version: the reply is in the caller's buffer).
enum Pre<'a> {
    Ready(Prepared<'a>),
    Done(Step),
}

/// What to do with a query; a reply's bytes are in the caller's buffer.
enum Step {
    /// Send the reply (its qtype and rcode, for the metrics).
    Reply(u16, u16),
    Forward,
    Drop,
}

fn allowed(acl: &[IpNet], ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    acl.iter().any(|n| n.contains(&ip))
}

impl Inner {
    /// Everything that can be answered without IO; a reply is written to `out` (which is
    /// reused: a cached answer costs no allocation). One query: [`Self::prepare`] then
    /// [`Self::complete`] (the UDP worker runs them over a whole batch, phase by phase).
    fn handle_local(
        &self,
        pkt: &[u8],
        src: IpAddr,
        udp: bool,
        cache: &mut AnswerCache,
        out: &mut Vec<u8>,
    ) -> Step {
        cache.sync_generation(self.index.generation());
        let mut keys = Vec::new();
        let mut hits = 0;
        let step = match self.prepare(pkt, udp, cache, &mut keys, out) {
            Pre::Done(step) => step,
            Pre::Ready(p) => self.complete(p, &keys, src, cache, out, &mut hits),
        };
        self.metrics.answer_cache_hits.inc_by(hits);
        step
    }

    /// Parses a query and appends its answer-cache key to `keys`: the lower-cased question,
    /// the flags that change the reply and the size limit.
    fn prepare<'a>(
        &self,
        pkt: &'a [u8],
        udp: bool,
        cache: &AnswerCache,
        keys: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Pre<'a> {
        let req = match wire::parse_request_lazy(pkt) {
            Ok(r) => r,
            Err(ParseError::Drop) => return Pre::Done(Step::Drop),
            Err(ParseError::Reply {
                id,
                opcode,
                rd,
                rcode,
            }) => {
                *out = wire::encode_parse_error(id, opcode, rd, rcode);
                return Pre::Done(Step::Reply(0, rcode));
            }
        };
        if req.edns.is_some_and(|e| e.version > 0) {
            *out = wire::encode_rcode(&req, wire::RCODE_BADVERS, true);
            return Pre::Done(Step::Reply(req.qtype, wire::RCODE_BADVERS));
        }
        let limit = if udp { req.udp_limit() } else { 65535 };
        let start = keys.len();
        keys.extend(req.question_wire.iter().map(u8::to_ascii_lowercase));
        keys.push(
            u8::from(req.recursion_desired)
                | (u8::from(req.checking_disabled) << 1)
                | (u8::from(req.edns.is_some()) << 2)
                | (u8::from(req.edns.is_some_and(|e| e.dnssec_ok)) << 3),
        );
        keys.extend_from_slice(&(limit as u16).to_be_bytes());
        let key = start..keys.len();
        let hash = cache.hash(&keys[key.clone()]);
        Pre::Ready(Prepared {
            req,
            limit,
            key,
            hash,
        })
    }

    /// Answers a prepared query: from the cache (the reply is the cached one with the query's
    /// ID and the question in the client's case), else from the index (then cached), else
    /// forwarded or refused. Counts cache hits in `hits`.
    fn complete(
        &self,
        p: Prepared<'_>,
        keys: &[u8],
        src: IpAddr,
        cache: &mut AnswerCache,
        out: &mut Vec<u8>,
        hits: &mut u64,
    ) -> Step {
        let Prepared {
            mut req,
            limit,
            key,
            hash,
        } = p;
        let key = keys.get(key).unwrap_or_default();
        if let Some(hit) = cache.get(hash, key) {
            *hits += 1;
            out.clear();
            out.extend_from_slice(hit);
            out[0..2].copy_from_slice(&req.id.to_be_bytes());
            out[12..12 + req.question_wire.len()].copy_from_slice(req.question_wire);
            let rcode = u16::from(out[3] & 0x0F);
            return Step::Reply(req.qtype, rcode);
        }
        let Some(name) = req.compute_qname() else {
            return self.forward_or_refuse(&req, src, out);
        };
        let outcome = {
            let idx = self.index.read();
            let q = Question {
                name: &name,
                qtype: req.qtype,
                qclass: req.qclass,
            };
            answer(&q, &idx)
        };
        // The encoder compresses owner names against the question name.
        req.qname = Some(name);
        match outcome {
            // Before the first full sync the index may lack names that exist: SERVFAIL (as
            // CoreDNS answers), never a negative answer that resolvers would cache. Not cached.
            Outcome::Answer(_) if !self.index.is_ready() => {
                *out = wire::encode_rcode(&req, wire::RCODE_SERVFAIL, true);
                Step::Reply(req.qtype, wire::RCODE_SERVFAIL)
            }
            Outcome::Answer(resp) => {
                self.metrics.answer_cache_misses.inc();
                *out = wire::encode_response(&req, &resp, limit);
                cache.insert(hash, key, out);
                Step::Reply(req.qtype, resp.rcode)
            }
            Outcome::Forward => self.forward_or_refuse(&req, src, out),
        }
    }

    fn forward_or_refuse(&self, req: &Request<'_>, src: IpAddr, out: &mut Vec<u8>) -> Step {
        if !allowed(&self.acl, src) {
            self.metrics.refused_recursion.inc();
            *out = wire::encode_rcode(req, wire::RCODE_REFUSED, false);
            return Step::Reply(req.qtype, wire::RCODE_REFUSED);
        }
        Step::Forward
    }

    /// The forwarding half (async). Returns the reply, truncated to `limit` for UDP.
    async fn forward(&self, pkt: &[u8], udp: bool) -> Option<(Vec<u8>, u16, u16)> {
        let req = wire::parse_request(pkt).ok()?;
        let reply = self.forwarder.resolve(pkt, &req).await;
        let rcode = reply
            .get(3)
            .map(|b| u16::from(b & 0x0F))
            .unwrap_or(wire::RCODE_SERVFAIL);
        let reply = if udp && reply.len() > req.udp_limit() {
            truncate_reply(&reply, 12 + req.question_wire.len())
        } else {
            reply
        };
        Some((reply, req.qtype, rcode))
    }
}

/// A bound DNS server (UDP + TCP), ready to run.
pub struct Server {
    udp: std::net::UdpSocket,
    tcp: TcpListener,
    workers: usize,
    inner: Arc<Inner>,
    tcp_limit: ferry_limits::ConnLimiter,
}

/// Sets the UDP workers' stop flag when dropped, so they end even if the server task panics.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

static TCP_FULL: ferry_limits::LogLimiter =
    ferry_limits::LogLimiter::new(3, Duration::from_secs(10));

impl Server {
    /// Binds the sockets.
    pub async fn bind(
        cfg: ServerConfig,
        index: Arc<SharedIndex>,
        metrics: Arc<Metrics>,
    ) -> Result<Server> {
        // UDP and TCP share one port. With port 0 the kernel picks the UDP port, and that
        // number may already be taken for TCP by someone else: pick again a few times.
        let attempts = if cfg.listen.port() == 0 { 20 } else { 1 };
        let mut bound = None;
        for attempt in 1..=attempts {
            let udp = std::net::UdpSocket::bind(cfg.listen)
                .with_context(|| format!("binding UDP {}", cfg.listen))?;
            let tcp_addr = SocketAddr::new(cfg.listen.ip(), udp.local_addr()?.port());
            match TcpListener::bind(tcp_addr).await {
                Ok(tcp) => {
                    bound = Some((udp, tcp));
                    break;
                }
                Err(e) if attempt < attempts && e.kind() == std::io::ErrorKind::AddrInUse => {
                    continue;
                }
                Err(e) => {
                    let what = format!("binding TCP {tcp_addr}");
                    return Err(ferry_errors::ContextError::new(what, e).into());
                }
            }
        }
        let (udp, tcp) = bound.ok_or(Error::NoPortFree)?;
        let forwarder = Forwarder::new(cfg.forward, metrics.clone());
        let tcp_limit = ferry_limits::ConnLimiter::new("dns-tcp", cfg.tcp.max_connections);
        let inner = Arc::new(Inner {
            index,
            forwarder,
            metrics,
            acl: cfg.allow_recursion_from,
            tcp: cfg.tcp,
        });
        Ok(Server {
            udp,
            tcp,
            workers: cfg.udp_workers.max(1),
            inner,
            tcp_limit,
        })
    }

    pub fn udp_addr(&self) -> SocketAddr {
        self.udp
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }
    pub fn tcp_addr(&self) -> SocketAddr {
        self.tcp
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The TCP connection cap (tests, diagnostics).
    pub fn tcp_limiter(&self) -> ferry_limits::ConnLimiter {
        self.tcp_limit.clone()
    }

    /// Serves until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_guard = StopOnDrop(stop.clone());
        let rt = tokio::runtime::Handle::current();
        self.udp
            .set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut threads = Vec::new();
        for i in 0..self.workers {
            let sock = Arc::new(self.udp.try_clone()?);
            let inner = self.inner.clone();
            let stop = stop.clone();
            let rt = rt.clone();
            let t = std::thread::Builder::new()
                .name(format!("dns-udp-{i}"))
                .spawn(move || udp_worker(sock, inner, stop, rt))?;
            threads.push(t);
        }
        let inner = self.inner.clone();
        let tcp = self.tcp;
        let limit = self.tcp_limit.clone();
        let accept = async move {
            let mut acceptor = ferry_limits::Acceptor::new("dns-tcp");
            loop {
                // A slot first: at the cap, new connections wait in the listen queue.
                let permit = limit
                    .acquire(|l| {
                        if let Some(suppressed) = TCP_FULL.check() {
                            tracing::warn!(
                                cap = l.capacity(),
                                suppressed,
                                "DNS TCP connection limit reached; new connections wait"
                            );
                        }
                    })
                    .await;
                let (stream, peer) = acceptor.accept(&tcp).await;
                let inner = inner.clone();
                tokio::spawn(async move {
                    let _ = tcp_conn(stream, peer, inner).await;
                    drop(permit);
                });
            }
        };
        tokio::select! {
            _ = accept => {}
            _ = shutdown => {}
        }
        drop(stop_guard);
        tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await?;
        Ok(())
    }
}

/// Queries a UDP worker takes from the socket per system call, and replies it sends per call.
/// A receive returns as soon as one query is there (`MSG_WAITFORONE`) with whatever else has
/// arrived meanwhile: batching never waits for a batch to fill, it only saves system calls
/// (and wakeups of the clients) when queries arrive faster than one at a time.
const UDP_BATCH: usize = 32;
/// Receive buffer per query: the largest UDP payload.
const UDP_SLOT: usize = 65_535;

/// One received query: where it is in the receive buffer, who sent it.
#[derive(Clone, Copy)]
struct Received {
    len: usize,
    from: Option<SockaddrStorage>,
}

/// The worker's reusable buffers: nothing is allocated per query once the answers are cached.
struct UdpBuffers {
    /// `UDP_BATCH` slots of `UDP_SLOT` bytes (untouched pages cost no memory).
    recv: Vec<u8>,
    recv_headers: MultiHeaders<SockaddrStorage>,
    received: [Received; UDP_BATCH],
    /// Reply buffer per received query (kept between batches).
    replies: Vec<Vec<u8>>,
    /// The answer-cache keys of the batch.
    keys: Vec<u8>,
    /// The replies to send: which query each answers, its address and its metric labels.
    order: Vec<usize>,
    to: Vec<SocketAddrAny>,
    labels: Vec<(u16, u16)>,
}

impl UdpBuffers {
    fn new() -> UdpBuffers {
        UdpBuffers {
            recv: vec![0u8; UDP_BATCH * UDP_SLOT],
            recv_headers: MultiHeaders::preallocate(UDP_BATCH, None),
            received: [Received { len: 0, from: None }; UDP_BATCH],
            replies: (0..UDP_BATCH).map(|_| Vec::new()).collect(),
            keys: Vec::with_capacity(UDP_BATCH * 64),
            order: Vec::with_capacity(UDP_BATCH),
            to: Vec::with_capacity(UDP_BATCH),
            labels: Vec::with_capacity(UDP_BATCH),
        }
    }

    /// Waits (up to the socket's read timeout) for at least one query and takes up to
    /// `UDP_BATCH` that are there. Returns how many.
    fn receive(&mut self, fd: RawFd) -> nix::Result<usize> {
        let mut chunks = self.recv.chunks_mut(UDP_SLOT);
        let mut slices: [[IoSliceMut<'_>; 1]; UDP_BATCH] =
            std::array::from_fn(|_| [IoSliceMut::new(chunks.next().unwrap_or_default())]);
        let results = recvmmsg(
            fd,
            &mut self.recv_headers,
            slices.iter_mut(),
            MsgFlags::MSG_WAITFORONE,
            None,
        )?;
        let mut n = 0;
        for (slot, msg) in self.received.iter_mut().zip(results) {
            // A truncated datagram (larger than a slot) cannot be a whole query.
            let truncated = msg.flags.contains(MsgFlags::MSG_TRUNC);
            *slot = Received {
                len: if truncated { 0 } else { msg.bytes },
                from: msg.address,
            };
            n += 1;
        }
        Ok(n)
    }

    /// Sends the queued replies (`sendmmsg`, repeated after a partial send; a reply the kernel
    /// refuses is dropped, as a lost datagram would be). Returns how many went out.
    fn send(&mut self, sock: &std::net::UdpSocket) -> usize {
        let n = self.to.len();
        let mut control: [SendAncillaryBuffer<'_, '_, '_>; UDP_BATCH] =
            std::array::from_fn(|_| SendAncillaryBuffer::default());
        let iovs: [[IoSlice<'_>; 1]; UDP_BATCH] = std::array::from_fn(|k| {
            [IoSlice::new(
                self.order
                    .get(k)
                    .and_then(|&i| self.replies.get(i))
                    .map_or(&[][..], Vec::as_slice),
            )]
        });
        let mut msgs: Vec<MMsgHdr<'_>> = Vec::with_capacity(n);
        for ((to, iov), control) in self.to.iter().zip(&iovs).zip(control.iter_mut()) {
            msgs.push(MMsgHdr::new_with_addr(to, iov, control));
        }
        let mut sent = 0;
        let mut at = 0;
        while at < n {
            match rustix::net::sendmmsg(sock, &mut msgs[at..], SendFlags::empty()) {
                Ok(k) => {
                    sent += k;
                    // A send that reports nothing sent and no error: skip one to make progress.
                    at += k.max(1);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "dns udp send");
                    at += 1;
                }
            }
        }
        sent
    }
}

fn to_std(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::from(*v4));
    }
    addr.as_sockaddr_in6().map(|v6| SocketAddr::from(*v6))
}

fn udp_worker(
    sock: Arc<std::net::UdpSocket>,
    inner: Arc<Inner>,
    stop: Arc<AtomicBool>,
    rt: tokio::runtime::Handle,
) {
    let fd = sock.as_raw_fd();
    let mut b = UdpBuffers::new();
    let mut cache = AnswerCache::default();
    let mut backoff = ferry_limits::AcceptBackoff::default();
    while !stop.load(Ordering::Acquire) {
        let n = match b.receive(fd) {
            Ok(n) => n,
            // The read timeout (to look at the stop flag), a signal.
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
            // ICMP errors of earlier replies.
            Err(nix::errno::Errno::ECONNREFUSED | nix::errno::Errno::ECONNRESET) => continue,
            Err(e) => {
                // Out of memory or buffers: do not spin.
                tracing::debug!(error = %e, "dns udp recv");
                std::thread::sleep(backoff.next_delay());
                continue;
            }
        };
        backoff.reset();
        let start = Instant::now();
        // Phase by phase over the batch: parse and key every query, then touch the cache
        // memory of all of them (their cache misses overlap), then answer them in order.
        cache.sync_generation(inner.index.generation());
        b.keys.clear();
        let mut prepared = Vec::with_capacity(n);
        for i in 0..n {
            let Some(src) = b.received[i].from.as_ref().and_then(to_std) else {
                continue;
            };
            let pkt = &b.recv[i * UDP_SLOT..i * UDP_SLOT + b.received[i].len];
            let pre = inner.prepare(pkt, true, &cache, &mut b.keys, &mut b.replies[i]);
            prepared.push((i, src, pre));
        }
        let mut touched = 0u64;
        for (_, _, pre) in &prepared {
            if let Pre::Ready(p) = pre {
                touched ^= cache.touch(p.hash);
            }
        }
        std::hint::black_box(touched);
        b.order.clear();
        b.to.clear();
        b.labels.clear();
        let mut hits = 0;
        for (i, src, pre) in prepared {
            let step = match pre {
                Pre::Done(step) => step,
                Pre::Ready(p) => inner.complete(
                    p,
                    &b.keys,
                    src.ip(),
                    &mut cache,
                    &mut b.replies[i],
                    &mut hits,
                ),
            };
            match step {
                Step::Reply(qtype, rcode) => {
                    b.order.push(i);
                    b.to.push(SocketAddrAny::from(src));
                    b.labels.push((qtype, rcode));
                }
                Step::Drop => {
                    inner.metrics.dropped.inc();
                }
                Step::Forward => {
                    let pkt = b.recv[i * UDP_SLOT..i * UDP_SLOT + b.received[i].len].to_vec();
                    let inner = inner.clone();
                    let sock = sock.clone();
                    rt.spawn(async move {
                        if let Some((out, qtype, rcode)) = inner.forward(&pkt, true).await {
                            let _ = sock.send_to(&out, src);
                            inner.metrics.observe(qtype, rcode, start.elapsed());
                        }
                    });
                }
            }
        }
        if hits > 0 {
            inner.metrics.answer_cache_hits.inc_by(hits);
        }
        if b.to.is_empty() {
            continue;
        }
        b.send(&sock);
        inner.metrics.observe_batch(&b.labels, start.elapsed());
    }
}

async fn tcp_conn(
    mut stream: TcpStream,
    peer: SocketAddr,
    inner: Arc<Inner>,
) -> std::io::Result<()> {
    let mut cache = AnswerCache::default();
    let cfg = inner.tcp.clone();
    let mut first = true;
    loop {
        // The first query must come within the read timeout, later ones within the idle one.
        let wait = if first {
            cfg.read_timeout
        } else {
            cfg.idle_timeout
        };
        first = false;
        let len = match tokio::time::timeout(wait, stream.read_u16()).await {
            Ok(Ok(l)) => l as usize,
            _ => return Ok(()),
        };
        let mut pkt = vec![0u8; len];
        match tokio::time::timeout(cfg.read_timeout, stream.read_exact(&mut pkt)).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let start = Instant::now();
        let mut out = Vec::new();
        let reply = match inner.handle_local(&pkt, peer.ip(), false, &mut cache, &mut out) {
            Step::Reply(qtype, rcode) => Some((out, qtype, rcode)),
            Step::Drop => {
                inner.metrics.dropped.inc();
                return Ok(());
            }
            Step::Forward => inner.forward(&pkt, false).await,
        };
        let Some((out, qtype, rcode)) = reply else {
            return Ok(());
        };
        let mut framed = Vec::with_capacity(out.len() + 2);
        framed.extend_from_slice(&(out.len() as u16).to_be_bytes());
        framed.extend_from_slice(&out);
        match tokio::time::timeout(cfg.write_timeout, stream.write_all(&framed)).await {
            Ok(r) => r?,
            Err(_) => return Ok(()),
        }
        inner.metrics.observe(qtype, rcode, start.elapsed());
    }
}
