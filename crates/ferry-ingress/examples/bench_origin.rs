//! The origin of bench/ingress: a minimal HTTP/1.1 keep-alive server answering every request
//! with the same fixed response (100-byte body by default) from one epoll loop — far cheaper
//! per request than any proxy in front of it, so the benchmark measures the proxy. The same
//! origin serves all proxies.
//!
//!     bench_origin LISTEN [BODY_BYTES=100]
//!
//! Requests are parsed with httparse (bodies framed by Content-Length are skipped); pipelined
//! requests are answered in one write.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

struct Conn {
    s: TcpStream,
    inbuf: Vec<u8>,
    /// Body bytes of the current request still to skip.
    skip: usize,
    out: Vec<u8>,
    /// Registered for EPOLLOUT (a write was short).
    want_out: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(listen) = args.get(1) else {
        return Err("usage: bench_origin LISTEN [BODY_BYTES]".into());
    };
    let listen: SocketAddr = listen.parse()?;
    let body_len: usize = args.get(2).map(|b| b.parse()).transpose()?.unwrap_or(100);
    let mut response = format!(
        "HTTP/1.1 200 OK\r\nServer: bench-origin\r\nContent-Type: text/plain\r\nContent-Length: {body_len}\r\n\r\n"
    )
    .into_bytes();
    response.extend(std::iter::repeat_n(b'x', body_len.saturating_sub(1)));
    if body_len > 0 {
        response.push(b'\n');
    }

    let listener = TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    const LISTENER: u64 = u64::MAX;
    ep.add(
        listener.as_fd(),
        EpollEvent::new(EpollFlags::EPOLLIN, LISTENER),
    )?;
    eprintln!("bench_origin: listening on {listen}");
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut events = vec![EpollEvent::empty(); 512];
    let mut rbuf = vec![0u8; 64 * 1024];
    loop {
        let n = match ep.wait(&mut events, EpollTimeout::NONE) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for ev in &events[..n] {
            let key = ev.data();
            if key == LISTENER {
                loop {
                    match listener.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(true)?;
                            let _ = s.set_nodelay(true);
                            let k = s.as_raw_fd() as u64;
                            ep.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, k))?;
                            conns.insert(
                                k,
                                Conn {
                                    s,
                                    inbuf: Vec::new(),
                                    skip: 0,
                                    out: Vec::new(),
                                    want_out: false,
                                },
                            );
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            eprintln!("bench_origin: accept: {e}");
                            break;
                        }
                    }
                }
                continue;
            }
            let Some(c) = conns.get_mut(&key) else {
                continue;
            };
            let close = serve(c, &mut rbuf, &response, ev.events()).unwrap_or(true);
            if close {
                if let Some(c) = conns.remove(&key) {
                    let _ = ep.delete(c.s.as_fd());
                }
            } else if c.want_out == c.out.is_empty() {
                c.want_out = !c.out.is_empty();
                let flags = if c.want_out {
                    EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT
                } else {
                    EpollFlags::EPOLLIN
                };
                let mut e = EpollEvent::new(flags, key);
                ep.modify(c.s.as_fd(), &mut e)?;
            }
        }
    }
}

/// Handles one readiness event; `Ok(true)` closes the connection.
fn serve(c: &mut Conn, rbuf: &mut [u8], response: &[u8], ev: EpollFlags) -> io::Result<bool> {
    if ev.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
        let n = match c.s.read(rbuf) {
            Ok(0) => return Ok(true),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        c.inbuf.extend_from_slice(&rbuf[..n]);
        let mut used = 0;
        loop {
            if c.skip > 0 {
                let s = c.skip.min(c.inbuf.len() - used);
                c.skip -= s;
                used += s;
                if c.skip > 0 {
                    break;
                }
            }
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut hs);
            match req.parse(&c.inbuf[used..]) {
                Ok(httparse::Status::Complete(h)) => {
                    let cl = req
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    used += h;
                    c.skip = cl;
                    c.out.extend_from_slice(response);
                }
                Ok(httparse::Status::Partial) if c.inbuf.len() - used < 64 * 1024 => break,
                _ => return Ok(true),
            }
        }
        c.inbuf.drain(..used);
    }
    while !c.out.is_empty() {
        match c.s.write(&c.out) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                c.out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}
