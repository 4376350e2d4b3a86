//! Set element changes over netlink (nf_tables), without an `nft` process: one batch
//! (`NFNL_MSG_BATCH_BEGIN` … `NFT_MSG_NEWSETELEM` / `NFT_MSG_DELSETELEM` … `BATCH_END`) is one
//! kernel transaction, as `nft -f` would send. Steady-state syncs (endpoints changing,
//! Services coming and going within existing `k` groups) consist of element operations only
//! and take this path; anything structural (chains, sets, rules) goes through `nft -f`.
//!
//! Encoding: a concatenated key is each field padded to 4 bytes — addresses in network order,
//! `inet_proto` one byte, `inet_service` two bytes big-endian, the `numgen` index a host-order
//! u32 — as nft itself writes them. [`encode_batch`] is pure and tested; [`NlSocket`] only
//! sends and reads the acknowledgements.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::time::Duration;

use super::nft::{Key, Op, SetKind, Value, Verdict};
use crate::model::Proto;

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFPROTO_INET: u8 = 1;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NF_DROP: u32 = 0;
const NFT_GOTO: i32 = -4;
/// Batches larger than this go through `nft -f` (the socket buffer bounds one send).
pub const MAX_BATCH: usize = 160 * 1024;

/// Errors of the netlink path.
#[derive(Debug, thiserror::Error)]
pub enum NlError {
    #[error("netlink socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("entering network namespace {0}: {1}")]
    Netns(String, String),
    #[error("the kernel refused the batch: {0}")]
    Refused(std::io::Error),
    #[error("no acknowledgement from the kernel")]
    NoAck,
}

fn proto_num(p: Proto) -> u8 {
    match p {
        Proto::Tcp => 6,
        Proto::Udp => 17,
        Proto::Sctp => 132,
    }
}

fn put_ip(out: &mut Vec<u8>, ip: &IpAddr) {
    match ip {
        IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
        IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
    }
}

fn put_proto(out: &mut Vec<u8>, p: Proto) {
    out.extend_from_slice(&[proto_num(p), 0, 0, 0]);
}

fn put_port(out: &mut Vec<u8>, port: u16) {
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
}

/// The key bytes as nft writes them.
pub fn encode_key(k: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(40);
    match k {
        Key::Addr(a) => put_ip(&mut out, a),
        Key::AddrPair(a, b) => {
            put_ip(&mut out, a);
            put_ip(&mut out, b);
        }
        Key::Frontend(a, p, port) => {
            put_ip(&mut out, a);
            put_proto(&mut out, *p);
            put_port(&mut out, *port);
        }
        Key::Port(p, port) => {
            put_proto(&mut out, *p);
            put_port(&mut out, *port);
        }
        Key::FrontendIdx(a, p, port, i) => {
            put_ip(&mut out, a);
            put_proto(&mut out, *p);
            put_port(&mut out, *port);
            out.extend_from_slice(&i.to_ne_bytes());
        }
        Key::PortIdx(p, port, i) => {
            put_proto(&mut out, *p);
            put_port(&mut out, *port);
            out.extend_from_slice(&i.to_ne_bytes());
        }
    }
    out
}

fn endpoint_bytes(e: &SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    put_ip(&mut out, &e.ip());
    put_port(&mut out, e.port());
    out
}

/// A netlink attribute builder.
struct Attrs(Vec<u8>);

impl Attrs {
    fn put(&mut self, ty: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.0.extend_from_slice(payload);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }
    fn put_str(&mut self, ty: u16, s: &str) {
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        self.put(ty, &b);
    }
    fn nest(&mut self, ty: u16, f: impl FnOnce(&mut Attrs)) {
        let mut inner = Attrs(Vec::new());
        f(&mut inner);
        self.put(ty | NLA_F_NESTED, &inner.0);
    }
}

fn message(
    out: &mut Vec<u8>,
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    attrs: &[u8],
) {
    let len = 16 + 4 + attrs.len();
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.push(family);
    out.push(0);
    out.extend_from_slice(&res_id.to_be_bytes());
    out.extend_from_slice(attrs);
}

/// True when every operation is an element change (the netlink path applies).
pub fn elements_only(ops: &[Op]) -> bool {
    ops.iter()
        .all(|o| matches!(o, Op::AddElements(..) | Op::DeleteElements(..)))
}

/// Encodes element operations as one batch; returns the bytes and the number of messages that
/// ask for an acknowledgement. `kinds` gives each set's kind (for the value encoding).
pub fn encode_batch(
    table: &str,
    kinds: &BTreeMap<String, SetKind>,
    ops: &[Op],
    seq: u32,
) -> (Vec<u8>, u32) {
    let mut out = Vec::new();
    let mut s = seq;
    message(
        &mut out,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        s,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    let mut acks = 0;
    // Chunks keep every attribute under netlink's 64 KiB attribute length.
    let mut chunked: Vec<Op> = Vec::new();
    for op in ops {
        match op {
            Op::AddElements(set, els) => chunked.extend(
                els.chunks(256)
                    .map(|c| Op::AddElements(set.clone(), c.to_vec())),
            ),
            Op::DeleteElements(set, keys) => chunked.extend(
                keys.chunks(256)
                    .map(|c| Op::DeleteElements(set.clone(), c.to_vec())),
            ),
            _ => {}
        }
    }
    for op in &chunked {
        s = s.wrapping_add(1);
        let (ty, set, flags) = match op {
            Op::AddElements(set, _) => (NFT_MSG_NEWSETELEM, set, NLM_F_CREATE),
            Op::DeleteElements(set, _) => (NFT_MSG_DELSETELEM, set, 0),
            _ => continue,
        };
        let is_map = kinds.get(set).is_some_and(|k| {
            !matches!(
                k,
                SetKind::Pairs(_) | SetKind::Addrs(_) | SetKind::Affinity(..)
            )
        });
        let mut a = Attrs(Vec::new());
        a.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
        a.put_str(NFTA_SET_ELEM_LIST_SET, set);
        a.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |l| match op {
            Op::AddElements(_, els) => {
                for (k, v) in els {
                    l.nest(NFTA_LIST_ELEM, |e| {
                        e.nest(NFTA_SET_ELEM_KEY, |d| {
                            d.put(NFTA_DATA_VALUE, &encode_key(k))
                        });
                        if !is_map {
                            return;
                        }
                        match v {
                            Value::Endpoint(ep) => e.nest(NFTA_SET_ELEM_DATA, |d| {
                                d.put(NFTA_DATA_VALUE, &endpoint_bytes(ep))
                            }),
                            Value::Verdict(verdict) => e.nest(NFTA_SET_ELEM_DATA, |d| {
                                d.nest(NFTA_DATA_VERDICT, |vd| match verdict {
                                    Verdict::Drop => {
                                        vd.put(NFTA_VERDICT_CODE, &NF_DROP.to_be_bytes())
                                    }
                                    Verdict::Goto(c) => {
                                        vd.put(NFTA_VERDICT_CODE, &NFT_GOTO.to_be_bytes());
                                        vd.put_str(NFTA_VERDICT_CHAIN, c);
                                    }
                                })
                            }),
                            Value::None => {}
                        }
                    });
                }
            }
            Op::DeleteElements(_, keys) => {
                for k in keys {
                    l.nest(NFTA_LIST_ELEM, |e| {
                        e.nest(NFTA_SET_ELEM_KEY, |d| {
                            d.put(NFTA_DATA_VALUE, &encode_key(k))
                        });
                    });
                }
            }
            _ => {}
        });
        message(
            &mut out,
            (NFNL_SUBSYS_NFTABLES << 8) | ty,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            s,
            NFPROTO_INET,
            0,
            &a.0,
        );
        acks += 1;
    }
    s = s.wrapping_add(1);
    message(
        &mut out,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        s,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    (out, acks)
}

/// A `NFT_MSG_GETTABLE` request for table `table` (family inet), acknowledged. Pure.
pub fn encode_get_table(table: &str, seq: u32) -> Vec<u8> {
    let mut a = Attrs(Vec::new());
    a.put_str(NFTA_TABLE_NAME, table);
    let mut out = Vec::new();
    message(
        &mut out,
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        NFPROTO_INET,
        0,
        &a.0,
    );
    out
}

/// The netlink messages in `buf`: (type, seq, error code for `NLMSG_ERROR`).
fn messages(buf: &[u8]) -> Vec<(u16, u32, Option<i32>)> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off + 16 <= buf.len() {
        let word = |o: usize| u32::from_ne_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
        let len = word(off) as usize;
        if len < 16 || off + len > buf.len() {
            break;
        }
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        let seq = word(off + 8);
        let code = (ty == NLMSG_ERROR && len >= 20).then(|| word(off + 16) as i32);
        out.push((ty, seq, code));
        off += len.next_multiple_of(4);
    }
    out
}

/// A `NETLINK_NETFILTER` socket, opened in a given network namespace.
pub struct NlSocket {
    fd: OwnedFd,
    seq: u32,
    /// The largest message the socket takes in one send.
    sndbuf: usize,
}

impl NlSocket {
    /// One datagram of answers; a receive timeout means the kernel did not acknowledge.
    fn recv(&self, buf: &mut [u8]) -> Result<usize, NlError> {
        rustix::net::recv(&self.fd, buf, rustix::net::RecvFlags::empty())
            .map(|(n, _)| n)
            .map_err(|e| {
                if e == rustix::io::Errno::AGAIN {
                    NlError::NoAck
                } else {
                    NlError::Io(e.into())
                }
            })
    }

    /// Opens the socket in the namespace `netns` (`/run/netns/NAME`), or in the current one.
    /// The socket stays in that namespace for its life.
    pub fn open(netns: Option<&str>) -> Result<NlSocket, NlError> {
        let open = || -> Result<OwnedFd, NlError> {
            // Close-on-exec: a child process (a pod started meanwhile) must not inherit a
            // handle on a node's nftables, nor keep the node's namespace alive after it goes.
            let fd = rustix::net::socket_with(
                rustix::net::AddressFamily::NETLINK,
                rustix::net::SocketType::RAW,
                rustix::net::SocketFlags::CLOEXEC,
                Some(rustix::net::netlink::NETFILTER),
            )
            .map_err(std::io::Error::from)?;
            rustix::net::bind(&fd, &rustix::net::netlink::SocketAddrNetlink::new(0, 0))
                .map_err(std::io::Error::from)?;
            rustix::net::sockopt::set_socket_timeout(
                &fd,
                rustix::net::sockopt::Timeout::Recv,
                Some(Duration::from_secs(5)),
            )
            .map_err(std::io::Error::from)?;
            let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&fd, 1 << 20);
            let _ = rustix::net::sockopt::set_socket_send_buffer_size(&fd, 1 << 20);
            Ok(fd)
        };
        let fd = match netns {
            None => open()?,
            Some(ns) => {
                let path = format!("/run/netns/{ns}");
                let ns = ns.to_string();
                // A thread of its own enters the namespace; the socket keeps it.
                std::thread::spawn(move || -> Result<OwnedFd, NlError> {
                    let f = std::fs::File::open(&path)?;
                    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| NlError::Netns(ns.clone(), e.to_string()))?;
                    open()
                })
                .join()
                .map_err(|_| NlError::Netns(String::new(), "thread panicked".into()))??
            }
        };
        let sndbuf = rustix::net::sockopt::socket_send_buffer_size(&fd)
            .unwrap_or(0)
            .saturating_sub(64);
        Ok(NlSocket {
            fd,
            seq: std::process::id().wrapping_mul(7919),
            sndbuf,
        })
    }

    /// Does table `table` (family inet) exist?
    pub fn table_exists(&mut self, table: &str) -> Result<bool, NlError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let buf = encode_get_table(table, seq);
        rustix::net::send(&self.fd, &buf, rustix::net::SendFlags::empty())
            .map_err(std::io::Error::from)?;
        let mut rbuf = vec![0u8; 64 * 1024];
        let mut seen = false;
        loop {
            let n = self.recv(&mut rbuf)?;
            for (ty, s, code) in messages(&rbuf[..n]) {
                if s != seq {
                    continue;
                }
                if ty == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE {
                    seen = true;
                }
                match code {
                    Some(0) => return Ok(true),
                    Some(c) if -c == rustix::io::Errno::NOENT.raw_os_error() => return Ok(seen),
                    Some(c) => {
                        return Err(NlError::Refused(std::io::Error::from_raw_os_error(-c)));
                    }
                    None => {}
                }
            }
        }
    }

    /// Sends one batch of element operations and waits for every acknowledgement.
    pub fn apply(
        &mut self,
        table: &str,
        kinds: &BTreeMap<String, SetKind>,
        ops: &[Op],
    ) -> Result<(), NlError> {
        let base = self.seq;
        let (buf, acks) = encode_batch(table, kinds, ops, base);
        self.seq = self.seq.wrapping_add(acks + 2);
        let first = base.wrapping_add(1);
        let last = base.wrapping_add(acks);
        if buf.len() + 4096 > self.sndbuf {
            // One batch is one message: the send buffer must hold it whole (nft does the
            // same). Forcing the size needs CAP_NET_ADMIN, which writing rules needs anyway.
            let want = (buf.len() + 4096).next_power_of_two();
            if rustix::net::sockopt::set_socket_send_buffer_size_force(&self.fd, want).is_ok()
                || rustix::net::sockopt::set_socket_send_buffer_size(&self.fd, want).is_ok()
            {
                self.sndbuf = rustix::net::sockopt::socket_send_buffer_size(&self.fd)
                    .unwrap_or(self.sndbuf)
                    .saturating_sub(64);
            }
        }
        rustix::net::send(&self.fd, &buf, rustix::net::SendFlags::empty())
            .map_err(std::io::Error::from)?;
        let mut got = 0u32;
        let mut rbuf = vec![0u8; 64 * 1024];
        while got < acks {
            let n = self.recv(&mut rbuf)?;
            let mut off = 0usize;
            while off + 16 <= n {
                let len =
                    u32::from_ne_bytes([rbuf[off], rbuf[off + 1], rbuf[off + 2], rbuf[off + 3]])
                        as usize;
                let ty = u16::from_ne_bytes([rbuf[off + 4], rbuf[off + 5]]);
                let seq = u32::from_ne_bytes([
                    rbuf[off + 8],
                    rbuf[off + 9],
                    rbuf[off + 10],
                    rbuf[off + 11],
                ]);
                if len < 16 || off + len > n {
                    break;
                }
                let ours = seq.wrapping_sub(first) <= last.wrapping_sub(first);
                if ty == NLMSG_ERROR && ours && len >= 20 {
                    let code = i32::from_ne_bytes([
                        rbuf[off + 16],
                        rbuf[off + 17],
                        rbuf[off + 18],
                        rbuf[off + 19],
                    ]);
                    if code != 0 {
                        return Err(NlError::Refused(std::io::Error::from_raw_os_error(-code)));
                    }
                    got += 1;
                }
                off += len.next_multiple_of(4);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn key_and_batch_encoding() {
        let k = Key::FrontendIdx("10.0.0.1".parse().unwrap(), Proto::Tcp, 80, 2);
        let mut want = vec![10, 0, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0];
        want.extend_from_slice(&2u32.to_ne_bytes());
        assert_eq!(encode_key(&k), want);
        assert_eq!(
            encode_key(&Key::Port(Proto::Udp, 53)),
            vec![17, 0, 0, 0, 0, 53, 0, 0]
        );
        assert_eq!(encode_key(&Key::Addr("fd00::1".parse().unwrap())).len(), 16);
        let kinds: BTreeMap<String, SetKind> = [(
            "svc4".to_string(),
            SetKind::FrontendVmap(super::super::nft::Fam::V4),
        )]
        .into();
        let ops = vec![
            Op::DeleteElements(
                "svc4".into(),
                vec![Key::Frontend("10.0.0.1".parse().unwrap(), Proto::Tcp, 80)],
            ),
            Op::AddElements(
                "svc4".into(),
                vec![(
                    Key::Frontend("10.0.0.1".parse().unwrap(), Proto::Tcp, 80),
                    Value::Verdict(Verdict::Goto("cl4-2".into())),
                )],
            ),
        ];
        let (buf, acks) = encode_batch("ferry", &kinds, &ops, 100);
        assert_eq!(acks, 2);
        // Four messages, each length-prefixed and 4-aligned, the batch markers around.
        let mut off = 0;
        let mut types = Vec::new();
        while off < buf.len() {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
            types.push(u16::from_ne_bytes(
                buf[off + 4..off + 6].try_into().unwrap(),
            ));
            assert_eq!(len % 4, 0);
            off += len;
        }
        assert_eq!(off, buf.len());
        assert_eq!(types, vec![16, (10 << 8) | 14, (10 << 8) | 12, 17]);
        assert!(buf.windows(6).any(|w| w == b"cl4-2\0"));
        assert!(elements_only(&ops));
        assert!(!elements_only(&[Op::FlushChain("x".into())]));
    }
}
