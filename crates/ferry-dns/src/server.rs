//! UDP and TCP servers around the answer function.
//!
//! UDP is served by a few OS threads blocking on clones of one socket (one syscall per receive,
//! no readiness polling); each thread keeps a cache of encoded cluster answers, invalidated when
//! the index generation changes. Forwarding runs on the tokio runtime.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use ipnet::IpNet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::answer::{Outcome, Question, answer};
use crate::forward::{ForwardConfig, Forwarder, truncate_reply};
use crate::index::Index;
use crate::metrics::Metrics;
use crate::wire::{self, ParseError, Request};

const TCP_IDLE: Duration = Duration::from_secs(10);
const ANSWER_CACHE_MAX: usize = 100_000;

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
}

struct Inner {
    index: Arc<SharedIndex>,
    forwarder: Forwarder,
    metrics: Arc<Metrics>,
    acl: Vec<IpNet>,
}

/// Encoded cluster answers of one worker, keyed by request shape.
#[derive(Default)]
struct AnswerCache {
    generation: u64,
    map: HashMap<Vec<u8>, Vec<u8>>,
    key: Vec<u8>,
}

enum Step {
    Reply(Vec<u8>, u16, u16),
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
    /// Everything that can be answered without IO. `limit` is the transport's size limit
    /// (None for TCP).
    fn handle_local(&self, pkt: &[u8], src: IpAddr, udp: bool, cache: &mut AnswerCache) -> Step {
        let mut req = match wire::parse_request_lazy(pkt) {
            Ok(r) => r,
            Err(ParseError::Drop) => return Step::Drop,
            Err(ParseError::Reply {
                id,
                opcode,
                rd,
                rcode,
            }) => {
                return Step::Reply(wire::encode_parse_error(id, opcode, rd, rcode), 0, rcode);
            }
        };
        if req.edns.is_some_and(|e| e.version > 0) {
            return Step::Reply(
                wire::encode_rcode(&req, wire::RCODE_BADVERS, true),
                req.qtype,
                wire::RCODE_BADVERS,
            );
        }
        let limit = if udp { req.udp_limit() } else { 65535 };
        let gen_now = self.index.generation();
        if cache.generation != gen_now {
            cache.map.clear();
            cache.generation = gen_now;
        }
        let key = &mut cache.key;
        key.clear();
        key.extend(req.question_wire.iter().map(u8::to_ascii_lowercase));
        key.push(
            u8::from(req.recursion_desired)
                | (u8::from(req.checking_disabled) << 1)
                | (u8::from(req.edns.is_some()) << 2)
                | (u8::from(req.edns.is_some_and(|e| e.dnssec_ok)) << 3),
        );
        key.extend_from_slice(&(limit as u16).to_be_bytes());
        if let Some(hit) = cache.map.get(cache.key.as_slice()) {
            self.metrics.answer_cache_hits.inc();
            let mut out = hit.clone();
            out[0..2].copy_from_slice(&req.id.to_be_bytes());
            out[12..12 + req.question_wire.len()].copy_from_slice(req.question_wire);
            let rcode = u16::from(out[3] & 0x0F);
            return Step::Reply(out, req.qtype, rcode);
        }
        let Some(name) = req.compute_qname() else {
            return self.forward_or_refuse(&req, src);
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
            Outcome::Answer(_) if !self.index.is_ready() => Step::Reply(
                wire::encode_rcode(&req, wire::RCODE_SERVFAIL, true),
                req.qtype,
                wire::RCODE_SERVFAIL,
            ),
            Outcome::Answer(resp) => {
                self.metrics.answer_cache_misses.inc();
                let out = wire::encode_response(&req, &resp, limit);
                if cache.map.len() >= ANSWER_CACHE_MAX {
                    cache.map.clear();
                }
                cache.map.insert(cache.key.clone(), out.clone());
                Step::Reply(out, req.qtype, resp.rcode)
            }
            Outcome::Forward => self.forward_or_refuse(&req, src),
        }
    }

    fn forward_or_refuse(&self, req: &Request<'_>, src: IpAddr) -> Step {
        if !allowed(&self.acl, src) {
            self.metrics.refused_recursion.inc();
            return Step::Reply(
                wire::encode_rcode(req, wire::RCODE_REFUSED, false),
                req.qtype,
                wire::RCODE_REFUSED,
            );
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
}

impl Server {
    /// Binds the sockets.
    pub async fn bind(
        cfg: ServerConfig,
        index: Arc<SharedIndex>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Server> {
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
                    return Err(anyhow::Error::new(e).context(format!("binding TCP {tcp_addr}")));
                }
            }
        }
        let (udp, tcp) = bound.context("no port free for both UDP and TCP")?;
        let forwarder = Forwarder::new(cfg.forward, metrics.clone());
        let inner = Arc::new(Inner {
            index,
            forwarder,
            metrics,
            acl: cfg.allow_recursion_from,
        });
        Ok(Server {
            udp,
            tcp,
            workers: cfg.udp_workers.max(1),
            inner,
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

    /// Serves until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let stop = Arc::new(AtomicBool::new(false));
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
        let accept = async move {
            loop {
                match tcp.accept().await {
                    Ok((stream, peer)) => {
                        let inner = inner.clone();
                        tokio::spawn(async move {
                            let _ = tcp_conn(stream, peer, inner).await;
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "dns tcp accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        };
        tokio::select! {
            _ = accept => {}
            _ = shutdown => {}
        }
        stop.store(true, Ordering::Release);
        tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await?;
        Ok(())
    }
}

fn udp_worker(
    sock: Arc<std::net::UdpSocket>,
    inner: Arc<Inner>,
    stop: Arc<AtomicBool>,
    rt: tokio::runtime::Handle,
) {
    let mut buf = vec![0u8; 65535];
    let mut cache = AnswerCache::default();
    while !stop.load(Ordering::Acquire) {
        let (n, src) = match sock.recv_from(&mut buf) {
            Ok(v) => v,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "dns udp recv");
                continue;
            }
        };
        let start = Instant::now();
        let pkt = &buf[..n];
        match inner.handle_local(pkt, src.ip(), true, &mut cache) {
            Step::Reply(out, qtype, rcode) => {
                let _ = sock.send_to(&out, src);
                inner.metrics.observe(qtype, rcode, start.elapsed());
            }
            Step::Drop => {
                inner.metrics.dropped.inc();
            }
            Step::Forward => {
                let pkt = pkt.to_vec();
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
}

async fn tcp_conn(
    mut stream: TcpStream,
    peer: SocketAddr,
    inner: Arc<Inner>,
) -> std::io::Result<()> {
    let mut cache = AnswerCache::default();
    loop {
        let len = match tokio::time::timeout(TCP_IDLE, stream.read_u16()).await {
            Ok(Ok(l)) => l as usize,
            _ => return Ok(()),
        };
        let mut pkt = vec![0u8; len];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut pkt)).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let start = Instant::now();
        let reply = match inner.handle_local(&pkt, peer.ip(), false, &mut cache) {
            Step::Reply(out, qtype, rcode) => Some((out, qtype, rcode)),
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
        stream.write_all(&framed).await?;
        inner.metrics.observe(qtype, rcode, start.elapsed());
    }
}
