//! Forwarding of non-cluster names to upstream servers (or stub-domain servers), with a cache
//! that honours TTLs, positive and negative (RFC 2308).

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::metrics::Metrics;
use crate::wire::{self, Request};

/// Longest TTL the cache keeps an answer for.
const MAX_CACHE_TTL: u32 = 3600;
const MAX_CACHE_ENTRIES: usize = 50_000;

#[derive(Debug, Clone)]
pub struct ForwardConfig {
    /// Default upstream servers, tried in order.
    pub upstreams: Vec<SocketAddr>,
    /// Stub domains (lower-case, no trailing dot) and their servers.
    pub stubs: Vec<(String, Vec<SocketAddr>)>,
    /// Per-server timeout.
    pub timeout: Duration,
}

struct Entry {
    bytes: Vec<u8>,
    ttl_offsets: Vec<usize>,
    stored: Instant,
    ttl: u32,
}

/// The forwarder and its cache.
pub struct Forwarder {
    cfg: ForwardConfig,
    cache: Mutex<HashMap<Vec<u8>, Entry>>,
    metrics: Arc<Metrics>,
}

fn cache_key(req: &Request<'_>) -> Vec<u8> {
    let mut k = req.question_wire.to_ascii_lowercase();
    let flags = u8::from(req.edns.is_some_and(|e| e.dnssec_ok))
        | (u8::from(req.checking_disabled) << 1)
        | (u8::from(req.edns.is_some()) << 2);
    k.push(flags);
    k
}

/// Turns a reply that does not fit into a header + question reply with TC set.
pub fn truncate_reply(reply: &[u8], question_end: usize) -> Vec<u8> {
    let mut out = reply[..question_end.min(reply.len())].to_vec();
    if out.len() >= 12 {
        out[2] |= 0x02;
        out[6..12].fill(0);
    }
    out
}

impl Forwarder {
    pub fn new(cfg: ForwardConfig, metrics: Arc<Metrics>) -> Self {
        Forwarder {
            cfg,
            cache: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// The servers responsible for a name: the longest matching stub domain, else the upstreams.
    pub fn servers_for(&self, qname: Option<&str>) -> &[SocketAddr] {
        if let Some(name) = qname {
            let best = self
                .cfg
                .stubs
                .iter()
                .filter(|(d, _)| crate::answer::relative(name, d).is_some())
                .max_by_key(|(d, _)| d.len());
            if let Some((_, servers)) = best {
                return servers;
            }
        }
        &self.cfg.upstreams
    }

    pub fn cache_len(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// A cached reply for this request, with TTLs aged and the client's id and question case.
    pub fn cached(&self, req: &Request<'_>) -> Option<Vec<u8>> {
        let key = cache_key(req);
        let mut cache = self.cache.lock().ok()?;
        let e = cache.get(&key)?;
        let age = e.stored.elapsed().as_secs() as u32;
        if age >= e.ttl {
            cache.remove(&key);
            return None;
        }
        let mut out = e.bytes.clone();
        for &off in &e.ttl_offsets {
            if let Some(b) = out.get_mut(off..off + 4) {
                let ttl = u32::from_be_bytes([b[0], b[1], b[2], b[3]]).saturating_sub(age);
                b.copy_from_slice(&ttl.to_be_bytes());
            }
        }
        drop(cache);
        out[0..2].copy_from_slice(&req.id.to_be_bytes());
        let q_end = 12 + req.question_wire.len();
        if out.len() >= q_end {
            out[12..q_end].copy_from_slice(req.question_wire);
        }
        Some(out)
    }

    fn store(&self, req: &Request<'_>, reply: &[u8], scan: &wire::ScannedResponse) {
        let ttl = match scan.rcode {
            wire::RCODE_NOERROR if scan.min_answer_ttl.is_some() => scan.min_answer_ttl,
            wire::RCODE_NOERROR | wire::RCODE_NXDOMAIN => scan.negative_ttl,
            _ => None,
        };
        let Some(ttl) = ttl.map(|t| t.min(MAX_CACHE_TTL)).filter(|t| *t > 0) else {
            return;
        };
        if scan.truncated {
            return;
        }
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        if cache.len() >= MAX_CACHE_ENTRIES {
            let now = Instant::now();
            cache.retain(|_, e| now.duration_since(e.stored).as_secs() < u64::from(e.ttl));
            if cache.len() >= MAX_CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(
            cache_key(req),
            Entry {
                bytes: reply.to_vec(),
                ttl_offsets: scan.ttl_offsets.clone(),
                stored: Instant::now(),
                ttl,
            },
        );
    }

    /// Resolves a request upstream (cache first). Returns the reply to send (client id and
    /// question case restored), or SERVFAIL if no server answered.
    pub async fn resolve(&self, raw: &[u8], req: &Request<'_>) -> Vec<u8> {
        if let Some(hit) = self.cached(req) {
            self.metrics.forward_cache_hits.inc();
            return hit;
        }
        self.metrics.forward_cache_misses.inc();
        let servers = self.servers_for(req.qname.as_deref()).to_vec();
        let id: u16 = rand::random();
        let mut query = raw.to_vec();
        query[0..2].copy_from_slice(&id.to_be_bytes());
        let want_q = req.question_wire.to_ascii_lowercase();
        for server in servers {
            let reply = match self.exchange(server, &query, id, &want_q).await {
                Some(r) => r,
                None => {
                    self.metrics.forward_failures.inc();
                    continue;
                }
            };
            let (mut reply, scan) = reply;
            self.store(req, &reply, &scan);
            reply[0..2].copy_from_slice(&req.id.to_be_bytes());
            let q_end = scan.question_end;
            if q_end == 12 + req.question_wire.len() {
                reply[12..q_end].copy_from_slice(req.question_wire);
            }
            return reply;
        }
        wire::encode_rcode(req, wire::RCODE_SERVFAIL, true)
    }

    async fn exchange(
        &self,
        server: SocketAddr,
        query: &[u8],
        id: u16,
        want_q: &[u8],
    ) -> Option<(Vec<u8>, wire::ScannedResponse)> {
        let check = |buf: &[u8]| -> Option<wire::ScannedResponse> {
            let s = wire::scan_response(buf)?;
            (s.id == id && s.question_lower == want_q).then_some(s)
        };
        let udp = async {
            let bind: SocketAddr = if server.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let sock = UdpSocket::bind(bind).await.ok()?;
            sock.connect(server).await.ok()?;
            sock.send(query).await.ok()?;
            let mut buf = vec![0u8; 65535];
            loop {
                let n = sock.recv(&mut buf).await.ok()?;
                if let Some(s) = check(&buf[..n]) {
                    buf.truncate(n);
                    return Some((buf, s));
                }
                // Mismatched id/question: ignore (spoofing attempt or stale reply), keep waiting.
            }
        };
        let (reply, scan) = tokio::time::timeout(self.cfg.timeout, udp).await.ok()??;
        if !scan.truncated {
            return Some((reply, scan));
        }
        let tcp = async {
            let mut s = TcpStream::connect(server).await.ok()?;
            let mut framed = Vec::with_capacity(query.len() + 2);
            framed.extend_from_slice(&(query.len() as u16).to_be_bytes());
            framed.extend_from_slice(query);
            s.write_all(&framed).await.ok()?;
            let len = s.read_u16().await.ok()? as usize;
            let mut buf = vec![0u8; len];
            s.read_exact(&mut buf).await.ok()?;
            let scan = check(&buf)?;
            Some((buf, scan))
        };
        tokio::time::timeout(self.cfg.timeout, tcp).await.ok()?
    }
}
