//! DNS wire format: a small, allocation-light parser for queries, an encoder for the records the
//! cluster zone serves, and a scanner for upstream responses (TTLs, rcode) used by the cache.
//!
//! The authoritative hot path only ever needs one question, an optional OPT record and a handful
//! of record types, so it is hand-written; tests cross-check the output with `hickory-proto`.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_NS: u16 = 2;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_SOA: u16 = 6;
pub const TYPE_PTR: u16 = 12;
pub const TYPE_TXT: u16 = 16;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_SRV: u16 = 33;
pub const TYPE_OPT: u16 = 41;
pub const TYPE_ANY: u16 = 255;
pub const CLASS_IN: u16 = 1;
pub const CLASS_ANY: u16 = 255;

pub const RCODE_NOERROR: u16 = 0;
pub const RCODE_FORMERR: u16 = 1;
pub const RCODE_SERVFAIL: u16 = 2;
pub const RCODE_NXDOMAIN: u16 = 3;
pub const RCODE_NOTIMP: u16 = 4;
pub const RCODE_REFUSED: u16 = 5;
/// Extended rcode (needs OPT): unsupported EDNS version.
pub const RCODE_BADVERS: u16 = 16;

/// EDNS payload size we advertise (the DNS flag day 2020 recommendation).
pub const OUR_UDP_PAYLOAD: u16 = 1232;
const HEADER_LEN: usize = 12;

/// EDNS(0) information of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edns {
    pub payload: u16,
    pub version: u8,
    pub dnssec_ok: bool,
}

/// A parsed query. Borrowed from the packet it came from.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub id: u16,
    pub opcode: u8,
    pub recursion_desired: bool,
    pub checking_disabled: bool,
    /// The question exactly as sent (name in the client's case, type, class).
    pub question_wire: &'a [u8],
    /// Lower-cased, dot-separated, without the trailing dot (root = "").
    /// `None` if a label contains bytes that cannot appear in a cluster name ('.' or non-printable).
    pub qname: Option<String>,
    /// Whether the question name could be a cluster name (see `qname`).
    pub printable: bool,
    pub qtype: u16,
    pub qclass: u16,
    pub edns: Option<Edns>,
}

impl Request<'_> {
    /// The lower-cased question name in wire format (used as a cache key).
    pub fn lower_qname_wire(&self) -> Vec<u8> {
        let n = self.question_wire.len() - 4;
        self.question_wire[..n].to_ascii_lowercase()
    }

    /// The lower-cased dotted question name, computed from the wire form (for requests parsed
    /// with `parse_request_lazy`). None if it cannot be a cluster name.
    pub fn compute_qname(&self) -> Option<String> {
        if !self.printable {
            return None;
        }
        let wire = &self.question_wire[..self.question_wire.len() - 4];
        let mut out = String::with_capacity(wire.len());
        let mut pos = 0;
        while let Some(&len) = wire.get(pos) {
            if len == 0 {
                break;
            }
            if !out.is_empty() {
                out.push('.');
            }
            for &c in wire.get(pos + 1..pos + 1 + len as usize)? {
                out.push(c.to_ascii_lowercase() as char);
            }
            pos += 1 + len as usize;
        }
        Some(out)
    }

    /// Largest response this client accepts over UDP.
    pub fn udp_limit(&self) -> usize {
        match self.edns {
            Some(e) => (e.payload.clamp(512, 4096)) as usize,
            None => 512,
        }
    }
}

/// Why a packet could not be served as a normal query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not worth a response (too short to have a header, or a response rather than a query).
    Drop,
    /// Answer with this rcode (FORMERR / NOTIMP), echoing the header id and opcode.
    Reply {
        id: u16,
        opcode: u8,
        rd: bool,
        rcode: u16,
    },
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Option<u8> {
        let v = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.buf.get(self.pos..self.pos + 2)?;
        self.pos += 2;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.buf.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        if self.pos + n > self.buf.len() {
            return None;
        }
        self.pos += n;
        Some(())
    }
    /// Skips a (possibly compressed) name.
    fn skip_name(&mut self) -> Option<()> {
        let mut total = 0usize;
        loop {
            let len = self.u8()?;
            match len & 0xC0 {
                0x00 => {
                    if len == 0 {
                        return Some(());
                    }
                    total += len as usize + 1;
                    if total > 255 {
                        return None;
                    }
                    self.skip(len as usize)?;
                }
                0xC0 => {
                    self.u8()?;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
    /// Reads a (possibly compressed) name as lower-case dotted text, following pointers backwards.
    fn read_name(&mut self) -> Option<String> {
        let mut out = String::new();
        let mut pos = self.pos;
        let mut jumped = false;
        let mut hops = 0;
        loop {
            let len = *self.buf.get(pos)?;
            match len & 0xC0 {
                0x00 => {
                    pos += 1;
                    if len == 0 {
                        break;
                    }
                    let label = self.buf.get(pos..pos + len as usize)?;
                    if !out.is_empty() {
                        out.push('.');
                    }
                    for &c in label {
                        out.push(c.to_ascii_lowercase() as char);
                    }
                    if out.len() > 255 {
                        return None;
                    }
                    pos += len as usize;
                }
                0xC0 => {
                    let lo = *self.buf.get(pos + 1)?;
                    let target = (((len & 0x3F) as usize) << 8) | lo as usize;
                    if !jumped {
                        self.pos = pos + 2;
                        jumped = true;
                    }
                    hops += 1;
                    if hops > 64 || target >= pos {
                        return None;
                    }
                    pos = target;
                }
                _ => return None,
            }
        }
        if !jumped {
            self.pos = pos;
        }
        Some(out)
    }
}

/// Parses a query packet. Never panics, whatever the input.
pub fn parse_request(buf: &[u8]) -> Result<Request<'_>, ParseError> {
    parse(buf, true)
}

/// Like [`parse_request`] but leaves `qname` unset (see [`Request::compute_qname`]): the hot path
/// looks up its answer cache by the wire name first.
pub fn parse_request_lazy(buf: &[u8]) -> Result<Request<'_>, ParseError> {
    parse(buf, false)
}

fn parse(buf: &[u8], want_name: bool) -> Result<Request<'_>, ParseError> {
    if buf.len() < HEADER_LEN {
        return Err(ParseError::Drop);
    }
    let id = u16::from_be_bytes([buf[0], buf[1]]);
    let flags = u16::from_be_bytes([buf[2], buf[3]]);
    if flags & 0x8000 != 0 {
        // A response: never answer those (reflection loops).
        return Err(ParseError::Drop);
    }
    let opcode = ((flags >> 11) & 0x0F) as u8;
    let rd = flags & 0x0100 != 0;
    let cd = flags & 0x0010 != 0;
    let formerr = ParseError::Reply {
        id,
        opcode,
        rd,
        rcode: RCODE_FORMERR,
    };
    if opcode != 0 {
        return Err(ParseError::Reply {
            id,
            opcode,
            rd,
            rcode: RCODE_NOTIMP,
        });
    }
    let qdcount = u16::from_be_bytes([buf[4], buf[5]]);
    let ancount = u16::from_be_bytes([buf[6], buf[7]]);
    let nscount = u16::from_be_bytes([buf[8], buf[9]]);
    let arcount = u16::from_be_bytes([buf[10], buf[11]]);
    if qdcount != 1 || ancount != 0 || nscount != 0 {
        return Err(formerr);
    }
    // Question name: plain labels only (no pointers in the first name of a packet).
    let mut pos = HEADER_LEN;
    let mut name = String::new();
    let mut printable = true;
    let mut wire_len = 0usize;
    loop {
        let Some(&len) = buf.get(pos) else {
            return Err(formerr);
        };
        pos += 1;
        wire_len += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return Err(formerr);
        }
        wire_len += len as usize;
        if wire_len > 255 {
            return Err(formerr);
        }
        let Some(label) = buf.get(pos..pos + len as usize) else {
            return Err(formerr);
        };
        if want_name && !name.is_empty() {
            name.push('.');
        }
        for &c in label {
            if c == b'.' || !c.is_ascii_graphic() {
                printable = false;
            }
            if want_name {
                name.push(c.to_ascii_lowercase() as char);
            }
        }
        pos += len as usize;
    }
    let Some(tc) = buf.get(pos..pos + 4) else {
        return Err(formerr);
    };
    let qtype = u16::from_be_bytes([tc[0], tc[1]]);
    let qclass = u16::from_be_bytes([tc[2], tc[3]]);
    pos += 4;
    let question_wire = &buf[HEADER_LEN..pos];

    let mut edns = None;
    let mut r = Reader { buf, pos };
    for _ in 0..arcount {
        let parsed = (|| {
            let name_start = r.pos;
            r.skip_name()?;
            let root = r.pos == name_start + 1;
            let rtype = r.u16()?;
            let class = r.u16()?;
            let ttl = r.u32()?;
            let rdlen = r.u16()?;
            r.skip(rdlen as usize)?;
            Some((root, rtype, class, ttl))
        })();
        let Some((root, rtype, class, ttl)) = parsed else {
            return Err(formerr);
        };
        if rtype == TYPE_OPT {
            if edns.is_some() || !root {
                return Err(formerr);
            }
            edns = Some(Edns {
                payload: class,
                version: ((ttl >> 16) & 0xFF) as u8,
                dnssec_ok: ttl & 0x8000 != 0,
            });
        }
    }
    Ok(Request {
        id,
        opcode,
        recursion_desired: rd,
        checking_disabled: cd,
        question_wire,
        qname: (printable && want_name).then_some(name),
        printable,
        qtype,
        qclass,
        edns,
    })
}

/// Record data the cluster zone can serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RData {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    Cname(String),
    Ptr(String),
    Ns(String),
    Txt(String),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        target: String,
    },
    Soa {
        mname: String,
        rname: String,
        serial: u32,
        refresh: u32,
        retry: u32,
        expire: u32,
        minimum: u32,
    },
}

impl RData {
    pub fn rtype(&self) -> u16 {
        match self {
            RData::A(_) => TYPE_A,
            RData::Aaaa(_) => TYPE_AAAA,
            RData::Cname(_) => TYPE_CNAME,
            RData::Ptr(_) => TYPE_PTR,
            RData::Ns(_) => TYPE_NS,
            RData::Txt(_) => TYPE_TXT,
            RData::Srv { .. } => TYPE_SRV,
            RData::Soa { .. } => TYPE_SOA,
        }
    }
}

/// One resource record. `name` is lower-case dotted without the trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub ttl: u32,
    pub data: RData,
}

impl Record {
    pub fn new(name: impl Into<String>, ttl: u32, data: RData) -> Self {
        Record {
            name: name.into(),
            ttl,
            data,
        }
    }
}

/// The outcome of the answer function for a cluster name, before encoding.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Response {
    pub rcode: u16,
    pub authoritative: bool,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
    pub additional: Vec<Record>,
}

struct Encoder {
    buf: Vec<u8>,
    /// Lower-case name suffixes already written, with their offsets (for compression).
    names: Vec<(String, u16)>,
}

impl Encoder {
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn name(&mut self, name: &str) {
        let mut rest = name;
        loop {
            if rest.is_empty() {
                self.buf.push(0);
                return;
            }
            if let Some((_, off)) = self.names.iter().find(|(n, _)| n == rest) {
                let off = *off;
                self.u16(0xC000 | off);
                return;
            }
            let here = self.buf.len();
            if here < 0x3FFF {
                self.names.push((rest.to_string(), here as u16));
            }
            let (label, tail) = match rest.split_once('.') {
                Some((l, t)) => (l, t),
                None => (rest, ""),
            };
            let label = &label.as_bytes()[..label.len().min(63)];
            self.buf.push(label.len() as u8);
            self.buf.extend_from_slice(label);
            rest = tail;
        }
    }
    fn record(&mut self, r: &Record) {
        self.name(&r.name);
        self.u16(r.data.rtype());
        self.u16(CLASS_IN);
        self.u32(r.ttl);
        let len_at = self.buf.len();
        self.u16(0);
        match &r.data {
            RData::A(ip) => self.buf.extend_from_slice(&ip.octets()),
            RData::Aaaa(ip) => self.buf.extend_from_slice(&ip.octets()),
            RData::Cname(n) | RData::Ptr(n) | RData::Ns(n) => self.name(n),
            RData::Txt(t) => {
                for chunk in t.as_bytes().chunks(255) {
                    self.buf.push(chunk.len() as u8);
                    self.buf.extend_from_slice(chunk);
                }
                if t.is_empty() {
                    self.buf.push(0);
                }
            }
            RData::Srv {
                priority,
                weight,
                port,
                target,
            } => {
                self.u16(*priority);
                self.u16(*weight);
                self.u16(*port);
                // RFC 2782: the target must not be compressed.
                for label in target.split('.').filter(|l| !l.is_empty()) {
                    let label = &label.as_bytes()[..label.len().min(63)];
                    self.buf.push(label.len() as u8);
                    self.buf.extend_from_slice(label);
                }
                self.buf.push(0);
            }
            RData::Soa {
                mname,
                rname,
                serial,
                refresh,
                retry,
                expire,
                minimum,
            } => {
                self.name(mname);
                self.name(rname);
                for v in [*serial, *refresh, *retry, *expire, *minimum] {
                    self.u32(v);
                }
            }
        }
        let rdlen = (self.buf.len() - len_at - 2) as u16;
        self.buf[len_at..len_at + 2].copy_from_slice(&rdlen.to_be_bytes());
    }
}

fn header_flags(opcode: u8, aa: bool, tc: bool, rd: bool, ra: bool, cd: bool, rcode: u16) -> u16 {
    let mut f = 0x8000u16 | ((opcode as u16 & 0x0F) << 11) | (rcode & 0x0F);
    if aa {
        f |= 0x0400;
    }
    if tc {
        f |= 0x0200;
    }
    if rd {
        f |= 0x0100;
    }
    if ra {
        f |= 0x0080;
    }
    if cd {
        f |= 0x0010;
    }
    f
}

fn push_opt(buf: &mut Vec<u8>, rcode: u16, edns: &Edns) {
    buf.push(0);
    buf.extend_from_slice(&TYPE_OPT.to_be_bytes());
    buf.extend_from_slice(&OUR_UDP_PAYLOAD.to_be_bytes());
    let ext = ((rcode >> 4) & 0xFF) as u32;
    let mut ttl = ext << 24;
    if edns.dnssec_ok {
        ttl |= 0x8000;
    }
    buf.extend_from_slice(&ttl.to_be_bytes());
    buf.extend_from_slice(&0u16.to_be_bytes());
}

/// Encodes `resp` as the reply to `req`, in at most `limit` bytes.
///
/// Additional records are optional (RFC 2181 section 9): when the whole reply does not fit, as
/// many of them as fit are kept, in order, and the reply goes out without TC. Only when the
/// answer and authority sections themselves do not fit is a truncated reply sent instead (TC set,
/// no records besides OPT), so the client retries over TCP.
pub fn encode_response(req: &Request<'_>, resp: &Response, limit: usize) -> Vec<u8> {
    let rcode = resp.rcode;
    let mut e = Encoder {
        buf: Vec::with_capacity(512),
        names: Vec::with_capacity(8),
    };
    e.u16(req.id);
    e.u16(header_flags(
        req.opcode,
        resp.authoritative,
        false,
        req.recursion_desired,
        true,
        req.checking_disabled,
        rcode,
    ));
    e.u16(1);
    e.u16(resp.answers.len() as u16);
    e.u16(resp.authority.len() as u16);
    // ARCOUNT is written once the additional records that fit are known.
    e.u16(0);
    e.buf.extend_from_slice(req.question_wire);
    if let Some(q) = &req.qname {
        e.names.push((q.clone(), HEADER_LEN as u16));
    }
    for r in resp.answers.iter().chain(&resp.authority) {
        e.record(r);
    }
    let mut opt = Vec::new();
    if let Some(edns) = &req.edns {
        push_opt(&mut opt, rcode, edns);
    }
    let room = limit.saturating_sub(opt.len());
    if e.buf.len() > room {
        return truncated(req, resp.authoritative, rcode);
    }
    let mut kept = 0usize;
    for r in &resp.additional {
        let before = e.buf.len();
        e.record(r);
        if e.buf.len() > room {
            // Later records never point into the dropped bytes: encoding stops here.
            e.buf.truncate(before);
            break;
        }
        kept += 1;
    }
    let arcount = (kept + usize::from(req.edns.is_some())) as u16;
    e.buf[10..12].copy_from_slice(&arcount.to_be_bytes());
    e.buf.extend_from_slice(&opt);
    e.buf
}

fn truncated(req: &Request<'_>, aa: bool, rcode: u16) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(&req.id.to_be_bytes());
    let flags = header_flags(
        req.opcode,
        aa,
        true,
        req.recursion_desired,
        true,
        req.checking_disabled,
        rcode,
    );
    buf.extend_from_slice(&flags.to_be_bytes());
    buf.extend_from_slice(&1u16.to_be_bytes());
    buf.extend_from_slice(&0u16.to_be_bytes());
    buf.extend_from_slice(&0u16.to_be_bytes());
    buf.extend_from_slice(&u16::from(req.edns.is_some()).to_be_bytes());
    buf.extend_from_slice(req.question_wire);
    if let Some(edns) = &req.edns {
        push_opt(&mut buf, rcode, edns);
    }
    buf
}

/// A bare reply with only a header and the question (REFUSED, SERVFAIL, ...).
pub fn encode_rcode(req: &Request<'_>, rcode: u16, ra: bool) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(&req.id.to_be_bytes());
    let flags = header_flags(
        req.opcode,
        false,
        false,
        req.recursion_desired,
        ra,
        false,
        rcode,
    );
    buf.extend_from_slice(&flags.to_be_bytes());
    buf.extend_from_slice(&1u16.to_be_bytes());
    buf.extend_from_slice(&[0, 0, 0, 0]);
    buf.extend_from_slice(&u16::from(req.edns.is_some()).to_be_bytes());
    buf.extend_from_slice(req.question_wire);
    if let Some(edns) = &req.edns {
        push_opt(&mut buf, rcode, edns);
    }
    buf
}

/// The reply to a packet that failed to parse (header only).
pub fn encode_parse_error(id: u16, opcode: u8, rd: bool, rcode: u16) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_LEN);
    buf.extend_from_slice(&id.to_be_bytes());
    let flags = header_flags(opcode, false, false, rd, false, false, rcode);
    buf.extend_from_slice(&flags.to_be_bytes());
    buf.extend_from_slice(&[0; 8]);
    buf
}

/// What the forwarding cache needs to know about an upstream response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedResponse {
    pub id: u16,
    pub rcode: u16,
    pub truncated: bool,
    /// Byte offsets of every TTL field outside the OPT record.
    pub ttl_offsets: Vec<usize>,
    /// Minimum TTL over answer records (None if no answers).
    pub min_answer_ttl: Option<u32>,
    /// Negative-caching TTL from the authority SOA: min(SOA TTL, SOA minimum).
    pub negative_ttl: Option<u32>,
    /// Question end offset (header + question), to rewrite the question's case.
    pub question_end: usize,
    /// The question (lower-case wire name, type, class), to match it with the query.
    pub question_lower: Vec<u8>,
}

/// Scans an upstream response. `None` if it is malformed.
pub fn scan_response(buf: &[u8]) -> Option<ScannedResponse> {
    let mut r = Reader { buf, pos: 0 };
    let id = r.u16()?;
    let flags = r.u16()?;
    if flags & 0x8000 == 0 {
        return None;
    }
    let qd = r.u16()?;
    let an = r.u16()?;
    let ns = r.u16()?;
    let ar = r.u16()?;
    if qd != 1 {
        return None;
    }
    let qstart = r.pos;
    r.skip_name()?;
    r.skip(4)?;
    let question_end = r.pos;
    let question_lower = buf[qstart..question_end].to_ascii_lowercase();
    let mut ttl_offsets = Vec::new();
    let mut min_answer_ttl: Option<u32> = None;
    let mut negative_ttl = None;
    let mut ext_rcode = 0u16;
    for section in 0..3 {
        let count = [an, ns, ar][section];
        for _ in 0..count {
            r.skip_name()?;
            let rtype = r.u16()?;
            r.u16()?;
            let ttl_at = r.pos;
            let ttl = r.u32()?;
            let rdlen = r.u16()? as usize;
            let rdata_start = r.pos;
            if rtype == TYPE_OPT {
                ext_rcode = ((ttl >> 24) & 0xFF) as u16;
            } else {
                ttl_offsets.push(ttl_at);
                if section == 0 {
                    min_answer_ttl = Some(min_answer_ttl.map_or(ttl, |m| m.min(ttl)));
                }
                if section == 1 && rtype == TYPE_SOA {
                    let mut s = Reader {
                        buf,
                        pos: rdata_start,
                    };
                    s.skip_name()?;
                    s.skip_name()?;
                    s.skip(16)?;
                    let minimum = s.u32()?;
                    negative_ttl = Some(ttl.min(minimum));
                }
            }
            r.pos = rdata_start;
            r.skip(rdlen)?;
        }
    }
    Some(ScannedResponse {
        id,
        rcode: (ext_rcode << 4) | (flags & 0x0F),
        truncated: flags & 0x0200 != 0,
        ttl_offsets,
        min_answer_ttl,
        negative_ttl,
        question_end,
        question_lower,
    })
}

/// Reads a name at `pos` of `buf` (following compression), lower-cased. For tests and tools.
pub fn read_name_at(buf: &[u8], pos: usize) -> Option<String> {
    Reader { buf, pos }.read_name()
}

/// Builds a query packet (for tests, the benchmark tooling and the forwarder's own probes).
pub fn build_query(id: u16, name: &str, qtype: u16, rd: bool, edns: Option<u16>) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(&id.to_be_bytes());
    buf.extend_from_slice(&(if rd { 0x0100u16 } else { 0 }).to_be_bytes());
    buf.extend_from_slice(&1u16.to_be_bytes());
    buf.extend_from_slice(&[0, 0, 0, 0]);
    buf.extend_from_slice(&u16::from(edns.is_some()).to_be_bytes());
    for label in name.split('.').filter(|l| !l.is_empty()) {
        buf.push(label.len() as u8);
        buf.extend_from_slice(label.as_bytes());
    }
    buf.push(0);
    buf.extend_from_slice(&qtype.to_be_bytes());
    buf.extend_from_slice(&CLASS_IN.to_be_bytes());
    if let Some(size) = edns {
        buf.push(0);
        buf.extend_from_slice(&TYPE_OPT.to_be_bytes());
        buf.extend_from_slice(&size.to_be_bytes());
        buf.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_table() {
        let q = build_query(7, "Foo.Bar.SVC.cluster.local", TYPE_A, true, Some(4096));
        let r = parse_request(&q).unwrap();
        assert_eq!(r.id, 7);
        assert_eq!(r.qname.as_deref(), Some("foo.bar.svc.cluster.local"));
        assert_eq!(r.qtype, TYPE_A);
        assert!(r.recursion_desired);
        assert_eq!(
            r.edns,
            Some(Edns {
                payload: 4096,
                version: 0,
                dnssec_ok: false
            })
        );
        assert_eq!(r.udp_limit(), 4096);
        let lazy = parse_request_lazy(&q).unwrap();
        assert_eq!(lazy.qname, None);
        assert_eq!(lazy.compute_qname(), r.qname);

        let cases: Vec<(Vec<u8>, Result<(), ParseError>)> = vec![
            (vec![], Err(ParseError::Drop)),
            (vec![0; 11], Err(ParseError::Drop)),
            // response bit set
            (
                vec![0, 1, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0],
                Err(ParseError::Drop),
            ),
            // qdcount 0
            (
                vec![0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                Err(ParseError::Reply {
                    id: 1,
                    opcode: 0,
                    rd: false,
                    rcode: RCODE_FORMERR,
                }),
            ),
            // question truncated
            (
                vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, b'a'],
                Err(ParseError::Reply {
                    id: 1,
                    opcode: 0,
                    rd: true,
                    rcode: RCODE_FORMERR,
                }),
            ),
            // opcode UPDATE
            (
                vec![0, 2, 0x28, 0, 0, 1, 0, 0, 0, 0, 0, 0],
                Err(ParseError::Reply {
                    id: 2,
                    opcode: 5,
                    rd: false,
                    rcode: RCODE_NOTIMP,
                }),
            ),
        ];
        for (pkt, want) in cases {
            assert_eq!(parse_request(&pkt).map(|_| ()), want, "{pkt:?}");
        }
    }

    #[test]
    fn encode_roundtrips_through_hickory() {
        use hickory_proto::op::Message;
        let q = build_query(9, "X.ns.svc.cluster.local", TYPE_SRV, true, Some(1232));
        let req = parse_request(&q).unwrap();
        let resp = Response {
            rcode: 0,
            authoritative: true,
            answers: vec![Record::new(
                "x.ns.svc.cluster.local",
                5,
                RData::Srv {
                    priority: 0,
                    weight: 100,
                    port: 80,
                    target: "x.ns.svc.cluster.local".into(),
                },
            )],
            authority: vec![],
            additional: vec![Record::new(
                "x.ns.svc.cluster.local",
                5,
                RData::A(Ipv4Addr::new(10, 0, 0, 1)),
            )],
        };
        let out = encode_response(&req, &resp, 512);
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.id, 9);
        assert!(m.metadata.authoritative);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.additionals.len(), 1);
        assert!(m.edns.is_some());
        // owner names point at the question, so the client's case is kept
        assert_eq!(m.answers[0].name.to_string(), "X.ns.svc.cluster.local.");
        let s = scan_response(&out).unwrap();
        assert_eq!(s.min_answer_ttl, Some(5));
        assert_eq!(s.ttl_offsets.len(), 2);
    }

    #[test]
    fn truncates_over_limit() {
        let q = build_query(1, "h.ns.svc.cluster.local", TYPE_A, false, None);
        let req = parse_request(&q).unwrap();
        let answers = (0..100)
            .map(|i| {
                Record::new(
                    "h.ns.svc.cluster.local",
                    5,
                    RData::A(Ipv4Addr::new(10, 0, 0, i)),
                )
            })
            .collect();
        let resp = Response {
            answers,
            authoritative: true,
            ..Default::default()
        };
        let small = encode_response(&req, &resp, 512);
        assert_eq!(small[2] & 0x02, 0x02, "TC set");
        assert_eq!(&small[6..8], &[0, 0]);
        let big = encode_response(&req, &resp, 65535);
        assert_eq!(big[2] & 0x02, 0);
        assert_eq!(u16::from_be_bytes([big[6], big[7]]), 100);
    }

    #[test]
    fn drops_additional_before_truncating() {
        // A headless SRV answer whose glue does not fit in 512 bytes: the answers go out
        // without TC, with as many additional records as fit.
        let q = build_query(
            1,
            "_http._tcp.h.ns.svc.cluster.local",
            TYPE_SRV,
            false,
            None,
        );
        let req = parse_request(&q).unwrap();
        let target = |i: u8| format!("pod-with-a-long-hostname-{i}.h.ns.svc.cluster.local");
        let answers = (0..6)
            .map(|i| {
                Record::new(
                    "_http._tcp.h.ns.svc.cluster.local",
                    5,
                    RData::Srv {
                        priority: 0,
                        weight: 16,
                        port: 80,
                        target: target(i),
                    },
                )
            })
            .collect();
        let additional = (0..6)
            .flat_map(|i| {
                [
                    Record::new(target(i), 5, RData::A(Ipv4Addr::new(10, 0, 0, i))),
                    Record::new(
                        target(i),
                        5,
                        RData::Aaaa(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i.into())),
                    ),
                ]
            })
            .collect();
        let resp = Response {
            answers,
            additional,
            authoritative: true,
            ..Default::default()
        };
        let full = encode_response(&req, &resp, 65535);
        assert!(full.len() > 512, "fixture must overflow 512 bytes");
        let small = encode_response(&req, &resp, 512);
        assert!(small.len() <= 512);
        assert_eq!(
            small[2] & 0x02,
            0,
            "no TC when only additional records were dropped"
        );
        let m = hickory_proto::op::Message::from_vec(&small).unwrap();
        assert_eq!(m.answers.len(), 6);
        assert!(m.additionals.len() < 12);
        // Kept additional records are a prefix of the original ones.
        for (i, r) in m.additionals.iter().enumerate() {
            assert_eq!(
                r.name.to_ascii().trim_end_matches('.'),
                target((i / 2) as u8)
            );
        }
        // With EDNS the OPT record is kept and counted.
        let q = build_query(
            2,
            "_http._tcp.h.ns.svc.cluster.local",
            TYPE_SRV,
            false,
            Some(512),
        );
        let req = parse_request(&q).unwrap();
        let small = encode_response(&req, &resp, 512);
        assert!(small.len() <= 512);
        let m = hickory_proto::op::Message::from_vec(&small).unwrap();
        assert!(m.edns.is_some());
        assert_eq!(m.answers.len(), 6);
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_request(&bytes);
            let _ = scan_response(&bytes);
        }

        #[test]
        fn parse_never_panics_with_valid_header(tail in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut pkt = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1];
            pkt.extend(tail);
            if let Ok(r) = parse_request(&pkt) {
                let _ = encode_response(&r, &Response::default(), 512);
            }
        }
    }
}
