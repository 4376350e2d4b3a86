//! bench/ingress measurement aid: the smallest possible keep-alive TCP relay, to see how much
//! of a proxy's cost per request is the event mechanism and syscall entry/exit rather than the
//! TCP work itself. Each client connection gets its own backend connection; bytes are relayed
//! as they come (no HTTP parsing: with one request in flight per connection, a relay is a
//! proxy with zero user-space work).
//!
//!     mini_proxy MODE LISTEN BACKEND
//!
//! MODE:
//! - `epoll`: level-triggered epoll, one `recv` and one `send` per chunk (what nginx, HAProxy
//!   and tokio do: 4 socket syscalls per request plus an `epoll_wait` per batch).
//! - `uring`: io_uring, multishot accept and multishot `recv` into a provided-buffer ring,
//!   `send` submitted from the receive buffer; one `io_uring_enter` submits every send of a
//!   batch and reaps the next completions (`SINGLE_ISSUER | DEFER_TASKRUN`).
//! - `uring-fixed`: as `uring`, with the sockets in the ring's registered file table (no file
//!   reference counting per operation).
//! - `tokio`: a current-thread tokio runtime, a task per connection pair relaying with
//!   `copy_bidirectional` (what a hand-written epoll loop would save over tokio: the
//!   difference between this and `epoll`).

// io_uring shares memory with the kernel: every unsafe block below says why it is sound.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, RawFd};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(listen), Some(backend)) = (args.get(1), args.get(2), args.get(3)) else {
        return Err("usage: mini_proxy epoll|uring|uring-fixed LISTEN BACKEND".into());
    };
    let listen: SocketAddr = listen.parse()?;
    let backend: SocketAddr = backend.parse()?;
    let listener = TcpListener::bind(listen)?;
    eprintln!("mini_proxy ({mode}): listening on {listen}");
    match mode.as_str() {
        "epoll" => epoll_loop(listener, backend),
        "uring" => uring::run(listener, backend, false),
        "uring-fixed" => uring::run(listener, backend, true),
        "tokio" => tokio_loop(listener, backend),
        _ => Err(format!("unknown mode {mode}").into()),
    }
}

fn connect_backend(backend: SocketAddr) -> io::Result<TcpStream> {
    let b = TcpStream::connect(backend)?;
    b.set_nodelay(true)?;
    Ok(b)
}

fn tokio_loop(
    listener: TcpListener,
    backend: SocketAddr,
) -> Result<(), Box<dyn std::error::Error>> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        loop {
            let (mut c, _) = listener.accept().await?;
            let mut b = tokio::net::TcpStream::connect(backend).await?;
            c.set_nodelay(true)?;
            b.set_nodelay(true)?;
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut c, &mut b).await;
            });
        }
    })
}

fn epoll_loop(
    listener: TcpListener,
    backend: SocketAddr,
) -> Result<(), Box<dyn std::error::Error>> {
    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
    use nix::sys::socket::{MsgFlags, recv, send};
    listener.set_nonblocking(true)?;
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    const LISTENER: u64 = u64::MAX;
    ep.add(
        listener.as_fd(),
        EpollEvent::new(EpollFlags::EPOLLIN, LISTENER),
    )?;
    // fd -> (its stream, the peer's fd)
    let mut socks: HashMap<RawFd, (TcpStream, RawFd)> = HashMap::new();
    let mut events = vec![EpollEvent::empty(); 512];
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match ep.wait(&mut events, EpollTimeout::NONE) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for ev in &events[..n] {
            if ev.data() == LISTENER {
                while let Ok((c, _)) = listener.accept() {
                    let b = connect_backend(backend)?;
                    c.set_nodelay(true)?;
                    c.set_nonblocking(true)?;
                    b.set_nonblocking(true)?;
                    let (cf, bf) = (c.as_raw_fd(), b.as_raw_fd());
                    ep.add(c.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, cf as u64))?;
                    ep.add(b.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, bf as u64))?;
                    socks.insert(cf, (c, bf));
                    socks.insert(bf, (b, cf));
                }
                continue;
            }
            let fd = ev.data() as RawFd;
            let Some(&(_, peer)) = socks.get(&fd) else {
                continue;
            };
            let close = match recv(fd, &mut buf, MsgFlags::empty()) {
                Ok(0) => true,
                Ok(n) => {
                    // A relay of small messages: the peer's send buffer has room (a blocking
                    // retry loop is enough for this measurement aid).
                    let mut off = 0;
                    let mut bad = false;
                    while off < n {
                        match send(peer, &buf[off..n], MsgFlags::MSG_NOSIGNAL) {
                            Ok(k) => off += k,
                            Err(nix::errno::Errno::EAGAIN) => std::thread::yield_now(),
                            Err(_) => {
                                bad = true;
                                break;
                            }
                        }
                    }
                    bad
                }
                Err(nix::errno::Errno::EAGAIN) => false,
                Err(_) => true,
            };
            if close {
                for f in [fd, peer] {
                    if let Some((s, _)) = socks.remove(&f) {
                        let _ = ep.delete(s.as_fd());
                    }
                }
            }
        }
    }
}

mod uring {
    use super::*;
    use io_uring::{IoUring, cqueue, opcode, squeue, types};

    const BGID: u16 = 0;
    const NBUF: u16 = 1024;
    const BUF_LEN: usize = 4096;
    const OP_ACCEPT: u64 = 1;
    const OP_RECV: u64 = 2;
    const OP_SEND: u64 = 3;

    fn ud(op: u64, slot: u32, bid: u16) -> u64 {
        (op << 56) | (u64::from(bid) << 32) | u64::from(slot)
    }
    fn ud_parts(u: u64) -> (u64, u32, u16) {
        (u >> 56, u as u32, (u >> 32) as u16)
    }

    /// The provided-buffer ring: `NBUF` entries the kernel picks receive buffers from.
    struct BufRing {
        ring: *mut types::BufRingEntry,
        ring_layout: std::alloc::Layout,
        bufs: Vec<u8>,
        tail: u16,
    }

    impl BufRing {
        fn new() -> io::Result<BufRing> {
            let ring_layout = std::alloc::Layout::from_size_align(
                usize::from(NBUF) * std::mem::size_of::<types::BufRingEntry>(),
                4096,
            )
            .map_err(io::Error::other)?;
            // SAFETY: the layout has a non-zero size; the memory is zeroed, which is a valid
            // `BufRingEntry` array (plain integers), and freed in `Drop`.
            let ring =
                unsafe { std::alloc::alloc_zeroed(ring_layout) }.cast::<types::BufRingEntry>();
            if ring.is_null() {
                return Err(io::ErrorKind::OutOfMemory.into());
            }
            let mut r = BufRing {
                ring,
                ring_layout,
                bufs: vec![0u8; usize::from(NBUF) * BUF_LEN],
                tail: 0,
            };
            for bid in 0..NBUF {
                r.push(bid);
            }
            r.publish();
            Ok(r)
        }

        fn buf(&self, bid: u16) -> *const u8 {
            self.bufs[usize::from(bid) * BUF_LEN..].as_ptr()
        }

        /// Hands buffer `bid` back to the kernel (visible after `publish`).
        fn push(&mut self, bid: u16) {
            let idx = usize::from(self.tail & (NBUF - 1));
            // SAFETY: idx < NBUF, inside the allocation; the kernel reads entries only between
            // its head and the published tail, and this one is past the published tail.
            let e = unsafe { &mut *self.ring.add(idx) };
            e.set_addr(self.buf(bid) as u64);
            e.set_len(BUF_LEN as u32);
            e.set_bid(bid);
            self.tail = self.tail.wrapping_add(1);
        }

        fn publish(&self) {
            // SAFETY: the tail field lives in entry 0 of the ring, inside the allocation; the
            // kernel reads it with acquire semantics, so a release store publishes the entries.
            unsafe {
                let tail = types::BufRingEntry::tail(self.ring).cast_mut();
                std::sync::atomic::AtomicU16::from_ptr(tail)
                    .store(self.tail, std::sync::atomic::Ordering::Release);
            }
        }
    }

    impl Drop for BufRing {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.ring.cast(), self.ring_layout) }
        }
    }

    struct Sock {
        s: TcpStream,
        peer: u32,
    }

    pub fn run(
        listener: TcpListener,
        backend: SocketAddr,
        fixed: bool,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let mut ring: IoUring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(8192)
            .build(1024)?;
        let bufring = BufRing::new()?;
        // SAFETY: the ring memory lives in `bufring`, which outlives `ring` (dropped after it
        // at the end of this function, which never returns while the ring is in use).
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(bufring.ring as u64, NBUF, BGID, 0)?;
        }
        let mut bufring = bufring;
        const MAX: u32 = 4096;
        if fixed {
            ring.submitter().register_files_sparse(MAX)?;
        }
        // Slots: index into `socks` (and the registered file table when fixed).
        let mut socks: Vec<Option<Sock>> = (0..MAX).map(|_| None).collect();
        let mut free: Vec<u32> = (0..MAX).rev().collect();
        // bid -> (slot it is being sent to, len, sent so far)
        let mut sending: Vec<(u32, u32, u32)> = vec![(0, 0, 0); usize::from(NBUF)];

        let accept = opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
            .build()
            .user_data(ud(OP_ACCEPT, 0, 0));
        // SAFETY: the listener outlives the ring's use of it (this function's scope).
        unsafe { ring.submission().push(&accept)? };

        let recv_sqe = |socks: &Vec<Option<Sock>>, slot: u32| -> squeue::Entry {
            let e = if fixed {
                opcode::RecvMulti::new(types::Fixed(slot), BGID).build()
            } else {
                let fd = socks[slot as usize]
                    .as_ref()
                    .map_or(-1, |s| s.s.as_raw_fd());
                opcode::RecvMulti::new(types::Fd(fd), BGID).build()
            };
            e.user_data(ud(OP_RECV, slot, 0))
        };
        let send_sqe = |socks: &Vec<Option<Sock>>, slot: u32, p: *const u8, len: u32, bid: u16| {
            let e = if fixed {
                opcode::Send::new(types::Fixed(slot), p, len)
                    .flags(libc_msg_nosignal())
                    .build()
            } else {
                let fd = socks[slot as usize]
                    .as_ref()
                    .map_or(-1, |s| s.s.as_raw_fd());
                opcode::Send::new(types::Fd(fd), p, len)
                    .flags(libc_msg_nosignal())
                    .build()
            };
            e.user_data(ud(OP_SEND, slot, bid))
        };

        let mut pending: Vec<squeue::Entry> = Vec::new();
        let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(1024);
        loop {
            {
                let mut sq = ring.submission();
                for e in pending.drain(..) {
                    // SAFETY: every buffer an entry points at (receive buffers of `bufring`)
                    // stays allocated and untouched until its completion is reaped.
                    if unsafe { sq.push(&e) }.is_err() {
                        return Err("submission queue full".into());
                    }
                }
            }
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(4) || e.raw_os_error() == Some(16) => {}
                Err(e) => return Err(e.into()),
            }
            cqes.clear();
            cqes.extend(
                ring.completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            let mut returned = false;
            for &(u, res, flags) in &cqes {
                let (op, slot, bid) = ud_parts(u);
                match op {
                    OP_ACCEPT => {
                        if !cqueue::more(flags) {
                            pending.push(
                                opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
                                    .build()
                                    .user_data(ud(OP_ACCEPT, 0, 0)),
                            );
                        }
                        if res < 0 {
                            continue;
                        }
                        // SAFETY: `res` is a descriptor the kernel just accepted for us; nothing
                        // else owns it.
                        let c = unsafe { TcpStream::from_raw_fd(res) };
                        let Ok(b) = connect_backend(backend) else {
                            continue;
                        };
                        let _ = c.set_nodelay(true);
                        let (Some(cs), Some(bs)) = (free.pop(), free.pop()) else {
                            continue;
                        };
                        if fixed {
                            ring.submitter()
                                .register_files_update(cs, &[c.as_raw_fd()])?;
                            ring.submitter()
                                .register_files_update(bs, &[b.as_raw_fd()])?;
                        }
                        socks[cs as usize] = Some(Sock { s: c, peer: bs });
                        socks[bs as usize] = Some(Sock { s: b, peer: cs });
                        pending.push(recv_sqe(&socks, cs));
                        pending.push(recv_sqe(&socks, bs));
                    }
                    OP_RECV => {
                        let Some(peer) = socks[slot as usize].as_ref().map(|s| s.peer) else {
                            if let Some(b) = cqueue::buffer_select(flags) {
                                bufring_push(&mut bufring, b, &mut returned);
                            }
                            continue;
                        };
                        if res > 0 {
                            let Some(b) = cqueue::buffer_select(flags) else {
                                continue;
                            };
                            sending[usize::from(b)] = (peer, res as u32, 0);
                            pending.push(send_sqe(&socks, peer, bufring.buf(b), res as u32, b));
                            if !cqueue::more(flags) {
                                pending.push(recv_sqe(&socks, slot));
                            }
                        } else if res == -105 {
                            // ENOBUFS: out of buffers for now; arm again.
                            pending.push(recv_sqe(&socks, slot));
                        } else {
                            // EOF or error: close both sides.
                            close_pair(&mut ring, &mut socks, &mut free, slot, fixed);
                        }
                    }
                    OP_SEND => {
                        let (to, len, sent) = sending[usize::from(bid)];
                        if res > 0 && sent + (res as u32) < len && socks[to as usize].is_some() {
                            let sent = sent + res as u32;
                            sending[usize::from(bid)].2 = sent;
                            // SAFETY: `sent < len <= BUF_LEN`, inside buffer `bid`.
                            let p = unsafe { bufring.buf(bid).add(sent as usize) };
                            pending.push(send_sqe(&socks, to, p, len - sent, bid));
                            continue;
                        }
                        bufring_push(&mut bufring, bid, &mut returned);
                    }
                    _ => {}
                }
            }
            if returned {
                bufring.publish();
            }
        }
    }

    fn bufring_push(r: &mut BufRing, bid: u16, returned: &mut bool) {
        r.push(bid);
        *returned = true;
    }

    fn close_pair(
        ring: &mut IoUring,
        socks: &mut [Option<Sock>],
        free: &mut Vec<u32>,
        slot: u32,
        fixed: bool,
    ) {
        let Some(s) = socks[slot as usize].take() else {
            return;
        };
        let peer = s.peer;
        let p = socks[peer as usize].take();
        for (sl, sock) in [(slot, Some(s)), (peer, p)] {
            if let Some(sock) = sock {
                let _ = sock.s.shutdown(std::net::Shutdown::Both);
                if fixed {
                    let _ = ring.submitter().register_files_update(sl, &[-1]);
                }
                free.push(sl);
            }
        }
    }

    fn libc_msg_nosignal() -> i32 {
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL.bits()
    }
}
