//! Pieces of `bench/proxy/run.sh` (a benchmark, not a test):
//!
//! - `backend ADDR`: a TCP server; a client that sends `s` gets an endless byte stream
//!   (throughput), one that sends `c` gets one byte and a close (connections/s), one that
//!   sends an HTTP request gets a small HTTP/1.1 response (wrk; keep-alive unless the request
//!   says `Connection: close`).
//! - `ferry FRONT BACKEND`: ferry's userspace data path serving FRONT -> BACKEND (a static
//!   table: no API server involved, the same code the watch path drives).
//! - `floor-epoll FRONT BACKEND`, `floor-tokio FRONT BACKEND`: the least a short-connection
//!   relay can do (accept, connect, copy, close), on raw epoll and on tokio: the floor ferry's
//!   CPU per connection is compared with.
//! - `load ADDR SECONDS CONNS`: measures throughput (CONNS parallel streams) and then
//!   connections/s (CONNS parallel connect/read/close loops) against ADDR; prints one line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferry_proxy::dataplane::{Dataplane, DataplaneConfig};
use ferry_proxy::model::{EndpointInfo, PortInfo, Proto, ServiceInfo, SliceInfo, SlicePort};
use ferry_proxy::table::{self, NodeContext};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("backend") => backend(args[2].parse().unwrap()).await,
        Some("ferry") => ferry(args[2].parse().unwrap(), args[3].parse().unwrap()).await,
        Some("floor-epoll") => {
            let (front, back) = (args[2].parse().unwrap(), args[3].parse().unwrap());
            // The relay owns its one thread; the runtime only idles.
            std::thread::spawn(move || floor_epoll(front, back))
                .join()
                .unwrap();
        }
        Some("floor-tokio") => {
            floor_tokio(args[2].parse().unwrap(), args[3].parse().unwrap()).await
        }
        Some("load") => {
            load(
                args[2].parse().unwrap(),
                args[3].parse().unwrap(),
                args[4].parse().unwrap(),
                args.get(5).map_or("both", String::as_str),
            )
            .await
        }
        _ => eprintln!(
            "usage: proxy_bench backend ADDR | ferry FRONT BACKEND | floor-epoll FRONT BACKEND | floor-tokio FRONT BACKEND | load ADDR SECONDS CONNS [stream|conn|both]"
        ),
    }
}

async fn backend(addr: SocketAddr) {
    let l = TcpListener::bind(addr).await.unwrap();
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let _ = c.set_nodelay(true);
            let mut b = [0u8; 1];
            if c.read_exact(&mut b).await.is_err() {
                return;
            }
            match b[0] {
                b's' => {
                    let buf = vec![0x5au8; 256 * 1024];
                    while c.write_all(&buf).await.is_ok() {}
                }
                b'c' => {
                    let _ = c.write_all(b"k").await;
                }
                first => http(c, first).await,
            }
        });
    }
}

/// Serves HTTP/1.1 requests (no bodies) on `c` whose first byte was already read.
async fn http(mut c: TcpStream, first: u8) {
    const OK: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Type: text/plain\r\n\r\nok\n";
    const OK_CLOSE: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nok\n";
    let mut buf = Vec::with_capacity(4096);
    buf.push(first);
    let mut tmp = [0u8; 4096];
    loop {
        // One request head at a time (wrk does not pipeline).
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match c.read(&mut tmp).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
        let close = String::from_utf8_lossy(&buf[..end])
            .to_ascii_lowercase()
            .contains("connection: close");
        buf.drain(..end);
        if c.write_all(if close { OK_CLOSE } else { OK })
            .await
            .is_err()
            || close
        {
            return;
        }
    }
}

async fn ferry(front: SocketAddr, back: SocketAddr) {
    let svc = ServiceInfo {
        namespace: "bench".into(),
        name: "bench".into(),
        cluster_ips: vec![front.ip()],
        ports: vec![PortInfo {
            name: String::new(),
            proto: Proto::Tcp,
            port: front.port(),
            node_port: None,
        }],
        ..Default::default()
    };
    let slice = SliceInfo {
        namespace: "bench".into(),
        name: "bench-1".into(),
        service: "bench".into(),
        ports: vec![SlicePort {
            name: String::new(),
            proto: Proto::Tcp,
            port: back.port(),
        }],
        endpoints: vec![EndpointInfo {
            ip: back.ip(),
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            zone: None,
            hint_zones: None,
            topology: BTreeMap::new(),
        }],
    };
    let services = [(("bench".to_string(), "bench".to_string()), svc)].into();
    let slices = [(("bench".to_string(), "bench-1".to_string()), slice)].into();
    let t = table::build(
        &services,
        &slices,
        &BTreeMap::new(),
        &NodeContext::default(),
    );
    // PROXY_SPLICE=0: bulk transfers through buffers only (to compare).
    let cfg = DataplaneConfig {
        splice: std::env::var("PROXY_SPLICE").map_or(true, |v| v != "0"),
        ..DataplaneConfig::default()
    };
    let mut dp = Dataplane::new(cfg, CancellationToken::new());
    let r = dp.apply(&t);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    eprintln!("ferry proxy: {front} -> {back}");
    std::future::pending::<()>().await;
}

async fn load(addr: SocketAddr, secs: f64, conns: usize, phases: &str) {
    let dur = Duration::from_secs_f64(secs);
    let gbps = if phases == "conn" {
        0.0
    } else {
        stream(addr, dur, conns).await
    };
    let (cps, errors) = if phases == "stream" {
        (0.0, 0)
    } else {
        connections(addr, dur, conns).await
    };
    println!("gbps={gbps:.2} cps={cps:.0} errors={errors}");
}

/// CONNS parallel streams for `dur`: Gbit/s.
async fn stream(addr: SocketAddr, dur: Duration, conns: usize) -> f64 {
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let bytes = bytes.clone();
        tasks.push(tokio::spawn(async move {
            let Ok(mut s) = TcpStream::connect(addr).await else {
                return;
            };
            if s.write_all(b"s").await.is_err() {
                return;
            }
            let mut buf = vec![0u8; 256 * 1024];
            while start.elapsed() < dur {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    bytes.load(Ordering::Relaxed) as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

/// CONNS parallel connect/1-byte/close loops for `dur`: connections/s and errors.
async fn connections(addr: SocketAddr, dur: Duration, conns: usize) -> (f64, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (done, errors) = (done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < dur {
                let ok = async {
                    let mut s = TcpStream::connect(addr).await.ok()?;
                    s.write_all(b"c").await.ok()?;
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).await.ok()?;
                    Some(())
                }
                .await;
                if ok.is_some() {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let cps = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    (cps, errors.load(Ordering::Relaxed))
}

/// The floor of a short-connection relay on one thread of raw epoll (edge-triggered): accept,
/// connect the backend (`TCP_NODELAY` inherited from the listener on the client side, set
/// before `connect` on the backend), copy both ways through one stack buffer, half-close on
/// EOF, close both when both directions are done. No timers, no limits, no tasks, no logging:
/// what any relay has to pay per connection, to compare ferry's data path with.
fn floor_epoll(front: SocketAddr, back: SocketAddr) {
    use rustix::event::epoll;
    use rustix::fd::OwnedFd;
    use rustix::io::Errno;
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
    use std::mem::MaybeUninit;

    struct Side {
        fd: OwnedFd,
        /// Bytes read from the other side not yet written here (a connect still in flight or
        /// a full send buffer).
        pending: Vec<u8>,
        /// The other side reached EOF (this side was or will be half-closed).
        eof_in: bool,
    }
    struct Conn {
        sides: [Side; 2],
    }
    let family = if front.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let l = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::sockopt::set_socket_reuseaddr(&l, true).unwrap();
    rustix::net::sockopt::set_tcp_nodelay(&l, true).unwrap();
    rustix::net::bind(&l, &front).unwrap();
    rustix::net::listen(&l, 1024).unwrap();
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    const LISTENER: u64 = u64::MAX;
    epoll::add(
        &ep,
        &l,
        epoll::EventData::new_u64(LISTENER),
        epoll::EventFlags::IN,
    )
    .unwrap();
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = [MaybeUninit::<epoll::Event>::uninit(); 256];
    let mut buf = vec![0u8; 64 * 1024];
    let flags = epoll::EventFlags::IN
        | epoll::EventFlags::OUT
        | epoll::EventFlags::RDHUP
        | epoll::EventFlags::ET;
    eprintln!("floor-epoll relay: {front} -> {back}");
    loop {
        let (ready, _) = match epoll::wait(&ep, &mut events, None) {
            Ok(r) => r,
            Err(Errno::INTR) => continue,
            Err(e) => panic!("epoll_wait: {e}"),
        };
        for ev in ready.iter() {
            let (token, evflags) = (ev.data.u64(), ev.flags);
            if token == LISTENER {
                loop {
                    let c = match rustix::net::accept_with(
                        &l,
                        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
                    ) {
                        Ok(c) => c,
                        Err(_) => break,
                    };
                    let b = rustix::net::socket_with(
                        family,
                        SocketType::STREAM,
                        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
                        None,
                    )
                    .unwrap();
                    let _ = rustix::net::sockopt::set_tcp_nodelay(&b, true);
                    match rustix::net::connect(&b, &back) {
                        Ok(()) | Err(Errno::INPROGRESS) => {}
                        Err(_) => continue,
                    }
                    let idx = free.pop().unwrap_or_else(|| {
                        conns.push(None);
                        conns.len() - 1
                    });
                    let side = |fd| Side {
                        fd,
                        pending: Vec::new(),
                        eof_in: false,
                    };
                    let idx64 = idx as u64;
                    epoll::add(&ep, &c, epoll::EventData::new_u64(idx64 * 2), flags).unwrap();
                    epoll::add(&ep, &b, epoll::EventData::new_u64(idx64 * 2 + 1), flags).unwrap();
                    conns[idx] = Some(Conn {
                        sides: [side(c), side(b)],
                    });
                }
                continue;
            }
            let idx = (token / 2) as usize;
            let Some(conn) = conns.get_mut(idx).and_then(Option::as_mut) else {
                continue;
            };
            let mut broken = false;
            // Either socket's readiness may unblock either direction (edge-triggered: no
            // second notice), so both are moved on: flush what waits for the destination,
            // then read the source while the destination takes everything.
            for (from, to) in [(0, 1), (1, 0)] {
                let d = &mut conn.sides[to];
                if !d.pending.is_empty() {
                    match rustix::net::send(&d.fd, &d.pending, SendFlags::NOSIGNAL) {
                        Ok(n) => {
                            d.pending.drain(..n);
                        }
                        Err(Errno::AGAIN) | Err(Errno::NOTCONN) => {}
                        Err(_) => broken = true,
                    }
                    if d.pending.is_empty() && d.eof_in {
                        let _ = rustix::net::shutdown(&d.fd, rustix::net::Shutdown::Write);
                    }
                }
                while !broken && !conn.sides[to].eof_in && conn.sides[to].pending.is_empty() {
                    match rustix::net::recv(&conn.sides[from].fd, &mut buf[..], RecvFlags::empty())
                    {
                        Ok((0, _)) => {
                            let d = &mut conn.sides[to];
                            d.eof_in = true;
                            let _ = rustix::net::shutdown(&d.fd, rustix::net::Shutdown::Write);
                        }
                        Ok((n, _)) => {
                            let d = &mut conn.sides[to];
                            match rustix::net::send(&d.fd, &buf[..n], SendFlags::NOSIGNAL) {
                                Ok(w) => d.pending.extend_from_slice(&buf[w..n]),
                                Err(Errno::AGAIN) | Err(Errno::NOTCONN) => {
                                    d.pending.extend_from_slice(&buf[..n])
                                }
                                Err(_) => broken = true,
                            }
                        }
                        Err(Errno::AGAIN) => break,
                        Err(Errno::INTR) => {}
                        Err(_) => broken = true,
                    }
                }
            }
            let done = conn.sides.iter().all(|s| s.eof_in && s.pending.is_empty());
            if broken || done || evflags.contains(epoll::EventFlags::ERR) {
                // Closing the descriptors removes them from the epoll set.
                conns[idx] = None;
                free.push(idx);
            }
        }
    }
}

/// The same floor on tokio: a task per connection, `tokio::io::copy_bidirectional`.
async fn floor_tokio(front: SocketAddr, back: SocketAddr) {
    let sock = if front.is_ipv4() {
        tokio::net::TcpSocket::new_v4().unwrap()
    } else {
        tokio::net::TcpSocket::new_v6().unwrap()
    };
    sock.set_reuseaddr(true).unwrap();
    sock.set_nodelay(true).unwrap();
    sock.bind(front).unwrap();
    let l = sock.listen(1024).unwrap();
    eprintln!("floor-tokio relay: {front} -> {back}");
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let b = if back.is_ipv4() {
                tokio::net::TcpSocket::new_v4()
            } else {
                tokio::net::TcpSocket::new_v6()
            };
            let Ok(b) = b else { return };
            let _ = b.set_nodelay(true);
            let Ok(mut b) = b.connect(back).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut c, &mut b).await;
        });
    }
}
