//! The nftables data path as data: the desired state of Ferry's own `inet` table (chains with
//! their rules, sets and maps with their elements), rendered from the kernel input by a pure
//! function, compared with the previous state by a pure element-level diff, and written as one
//! `nft -f` transaction.
//!
//! Layout ("maps-only", see `shared/notes/dataplane.md`): one verdict map per family keyed by
//! `daddr . l4proto . dport` sends a ClusterIP / externalIP / load-balancer frontend to a
//! shared chain for its kind and endpoint count `k`; that chain DNATs through one map per
//! family and `k` keyed by `daddr . l4proto . dport . numgen random mod k`. NodePorts use the
//! same scheme keyed by `l4proto . dport` behind `fib daddr type local`. No per-Service chain
//! or set exists, so a Service or endpoint change is a handful of element operations. Services
//! with `sessionAffinity: ClientIP`, or `externalTrafficPolicy: Local` with external
//! frontends, get chains of their own (as upstream's nftables proxier builds for every
//! Service): a chooser chain per pool and a chain per endpoint with a dynamic affinity set.
//!
//! Masquerade follows upstream kube-proxy: ClusterIP traffic from outside the pod CIDRs (all
//! of it when no pod CIDR is known and `masquerade_all` is set), external traffic with policy
//! `Cluster`, node-local traffic to external frontends with policy `Local`, and hairpin
//! (a pod reaching itself through a Service). Services without endpoints are rejected in the
//! filter hooks (`ct state new`), as upstream's `service-endpoints-check` does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use super::input::{SvcPort, Target};
use crate::model::Proto;

/// The table's default name.
pub const TABLE: &str = "ferry";
/// The mark bit that asks for masquerade (upstream's 0x4000).
pub const MASQ_MARK: u32 = 0x4000;

/// Settings of the renderer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftConfig {
    /// Pod CIDRs of the cluster: ClusterIP traffic from elsewhere is masqueraded.
    pub pod_cidrs: Vec<IpNet>,
    /// NodePort addresses; empty means every local address (`fib daddr type local`, loopback
    /// excepted as upstream's nftables mode does).
    pub node_ips: Vec<IpAddr>,
    /// Masquerade all ClusterIP traffic (upstream `--masquerade-all`).
    pub masquerade_all: bool,
}

/// IP family of a rule or map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fam {
    V4,
    V6,
}

impl Fam {
    pub fn of(ip: &IpAddr) -> Fam {
        if ip.is_ipv6() { Fam::V6 } else { Fam::V4 }
    }
    fn ip(self) -> &'static str {
        match self {
            Fam::V4 => "ip",
            Fam::V6 => "ip6",
        }
    }
    fn addr_type(self) -> &'static str {
        match self {
            Fam::V4 => "ipv4_addr",
            Fam::V6 => "ipv6_addr",
        }
    }
    fn n(self) -> u8 {
        match self {
            Fam::V4 => 4,
            Fam::V6 => 6,
        }
    }
    fn loopback(self) -> &'static str {
        match self {
            Fam::V4 => "127.0.0.0/8",
            Fam::V6 => "::1",
        }
    }
}

/// nft's name of a transport protocol.
pub fn proto_name(p: Proto) -> &'static str {
    match p {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
        Proto::Sctp => "sctp",
    }
}

/// A set or map element key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Addr(IpAddr),
    AddrPair(IpAddr, IpAddr),
    /// `daddr . l4proto . dport`
    Frontend(IpAddr, Proto, u16),
    /// `l4proto . dport`
    Port(Proto, u16),
    /// `daddr . l4proto . dport . index`
    FrontendIdx(IpAddr, Proto, u16, u32),
    /// `l4proto . dport . index`
    PortIdx(Proto, u16, u32),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Addr(a) => write!(f, "{a}"),
            Key::AddrPair(a, b) => write!(f, "{a} . {b}"),
            Key::Frontend(a, p, n) => write!(f, "{a} . {} . {n}", proto_name(*p)),
            Key::Port(p, n) => write!(f, "{} . {n}", proto_name(*p)),
            Key::FrontendIdx(a, p, n, i) => write!(f, "{a} . {} . {n} . {i}", proto_name(*p)),
            Key::PortIdx(p, n, i) => write!(f, "{} . {n} . {i}", proto_name(*p)),
        }
    }
}

/// A verdict map's value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Goto(String),
    Drop,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Goto(c) => write!(f, "goto {c}"),
            Verdict::Drop => f.write_str("drop"),
        }
    }
}

/// A set element's value (`None` for sets).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    None,
    Verdict(Verdict),
    Endpoint(SocketAddr),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::None => Ok(()),
            Value::Verdict(v) => write!(f, "{v}"),
            Value::Endpoint(e) => write!(f, "{} . {}", e.ip(), e.port()),
        }
    }
}

/// What a set or map holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// `daddr . l4proto . dport : verdict`
    FrontendVmap(Fam),
    /// `l4proto . dport : verdict`
    PortVmap,
    /// `daddr . l4proto . dport . numgen : endpoint`
    FrontendDnat(Fam),
    /// `l4proto . dport . numgen : endpoint`
    PortDnat(Fam),
    /// `addr . addr` (hairpin pairs)
    Pairs(Fam),
    /// `addr` (node IPs)
    Addrs(Fam),
    /// dynamic `addr` set with a timeout in seconds (ClientIP affinity)
    Affinity(Fam, u64),
}

impl SetKind {
    fn is_map(&self) -> bool {
        !matches!(
            self,
            SetKind::Pairs(_) | SetKind::Addrs(_) | SetKind::Affinity(..)
        )
    }
    /// Elements the kernel adds itself; never diffed.
    pub fn is_dynamic(&self) -> bool {
        matches!(self, SetKind::Affinity(..))
    }
    fn decl(&self) -> String {
        match self {
            SetKind::FrontendVmap(f) => {
                format!(
                    "type {} . inet_proto . inet_service : verdict;",
                    f.addr_type()
                )
            }
            SetKind::PortVmap => "type inet_proto . inet_service : verdict;".into(),
            SetKind::FrontendDnat(f) => format!(
                "typeof {ip} daddr . meta l4proto . th dport . numgen random mod 1 : {ip} daddr . th dport;",
                ip = f.ip()
            ),
            SetKind::PortDnat(f) => format!(
                "typeof meta l4proto . th dport . numgen random mod 1 : {} daddr . th dport;",
                f.ip()
            ),
            SetKind::Pairs(f) => format!("type {a} . {a};", a = f.addr_type()),
            SetKind::Addrs(f) => format!("type {};", f.addr_type()),
            SetKind::Affinity(f, t) => format!(
                "type {}; flags dynamic,timeout; timeout {t}s;",
                f.addr_type()
            ),
        }
    }
}

/// A named set or map.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Set {
    pub kind: Option<SetKind>,
    pub elements: BTreeMap<Key, Value>,
}

impl Set {
    fn new(kind: SetKind) -> Set {
        Set {
            kind: Some(kind),
            elements: BTreeMap::new(),
        }
    }
}

/// Base chain types and hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    NatPrerouting,
    NatOutput,
    NatPostrouting,
    FilterInput,
    FilterForward,
    FilterOutput,
}

impl Hook {
    fn decl(self) -> &'static str {
        match self {
            Hook::NatPrerouting => "type nat hook prerouting priority -100; policy accept;",
            Hook::NatOutput => "type nat hook output priority -100; policy accept;",
            Hook::NatPostrouting => "type nat hook postrouting priority 100; policy accept;",
            Hook::FilterInput => "type filter hook input priority -110; policy accept;",
            Hook::FilterForward => "type filter hook forward priority -110; policy accept;",
            Hook::FilterOutput => "type filter hook output priority -110; policy accept;",
        }
    }
}

/// One rule. Structured, so that the tracer can evaluate it; [`Rule::render`] writes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    Jump(String),
    CtNewJump(String),
    Goto(String),
    /// `ip daddr . meta l4proto . th dport vmap @map`
    FrontendVmap {
        fam: Fam,
        map: String,
    },
    /// NodePorts: `fib daddr type local ip daddr != 127.0.0.0/8` (or `ip daddr @addrs`)
    /// `meta l4proto . th dport vmap @map`
    NodePortVmap {
        fam: Fam,
        map: String,
        addrs: Option<String>,
    },
    /// `ip saddr != { cidrs } meta mark set meta mark | 0x4000` (no cidrs: every packet)
    MasqUnlessFrom {
        fam: Fam,
        cidrs: Vec<IpNet>,
    },
    /// `meta mark set meta mark | 0x4000`
    MarkMasq,
    /// `fib saddr type local meta mark set meta mark | 0x4000`
    MarkMasqIfLocalSource,
    /// `ip saddr { cidrs } goto chain`
    GotoIfFrom {
        fam: Fam,
        cidrs: Vec<IpNet>,
        chain: String,
    },
    /// `fib saddr type local goto chain`
    GotoIfLocalSource(String),
    /// `dnat ip to [ip daddr .] meta l4proto . th dport . numgen random mod k map @map`
    DnatMap {
        fam: Fam,
        map: String,
        by_addr: bool,
        k: u32,
    },
    /// `meta l4proto tcp dnat ip to addr:port`
    Dnat {
        proto: Proto,
        to: SocketAddr,
    },
    /// `ip saddr @set goto chain`
    AffinityCheck {
        fam: Fam,
        set: String,
        chain: String,
    },
    /// `update @set { ip saddr }`
    AffinityUpdate {
        fam: Fam,
        set: String,
    },
    /// `numgen random mod k vmap { 0 : goto a, 1 : goto b }`
    NumgenVmap(Vec<String>),
    /// `ct status dnat ip saddr . ip daddr @set masquerade`
    HairpinMasq {
        fam: Fam,
        set: String,
    },
    /// `meta mark & 0x4000 == 0 return`
    ReturnUnmarked,
    /// `meta mark set meta mark ^ 0x4000`
    ClearMark,
    /// `masquerade fully-random`
    Masquerade,
    /// `meta l4proto tcp reject with tcp reset`
    RejectTcpReset,
    /// `reject` (ICMP / ICMPv6 port unreachable)
    Reject,
    /// `drop`
    Drop,
}

fn cidr_list(cidrs: &[IpNet]) -> String {
    if cidrs.len() == 1 {
        cidrs[0].to_string()
    } else {
        let v: Vec<String> = cidrs.iter().map(|c| c.to_string()).collect();
        format!("{{ {} }}", v.join(", "))
    }
}

impl Rule {
    /// The rule in nft syntax.
    pub fn render(&self) -> String {
        let mark = format!("meta mark set meta mark | {MASQ_MARK:#x}");
        match self {
            Rule::Jump(c) => format!("jump {c}"),
            Rule::CtNewJump(c) => format!("ct state new jump {c}"),
            Rule::Goto(c) => format!("goto {c}"),
            Rule::FrontendVmap { fam, map } => {
                format!("{} daddr . meta l4proto . th dport vmap @{map}", fam.ip())
            }
            Rule::NodePortVmap { fam, map, addrs } => match addrs {
                Some(set) => format!(
                    "{} daddr @{set} meta l4proto . th dport vmap @{map}",
                    fam.ip()
                ),
                None => format!(
                    "fib daddr type local {} daddr != {} meta l4proto . th dport vmap @{map}",
                    fam.ip(),
                    fam.loopback()
                ),
            },
            Rule::MasqUnlessFrom { fam, cidrs } => {
                if cidrs.is_empty() {
                    format!("meta nfproto ipv{} {mark}", fam.n())
                } else {
                    format!("{} saddr != {} {mark}", fam.ip(), cidr_list(cidrs))
                }
            }
            Rule::MarkMasq => mark,
            Rule::MarkMasqIfLocalSource => format!("fib saddr type local {mark}"),
            Rule::GotoIfFrom { fam, cidrs, chain } => {
                format!("{} saddr {} goto {chain}", fam.ip(), cidr_list(cidrs))
            }
            Rule::GotoIfLocalSource(c) => format!("fib saddr type local goto {c}"),
            Rule::DnatMap {
                fam,
                map,
                by_addr,
                k,
            } => {
                let ip = fam.ip();
                let daddr = if *by_addr {
                    format!("{ip} daddr . ")
                } else {
                    String::new()
                };
                format!(
                    "dnat {ip} to {daddr}meta l4proto . th dport . numgen random mod {k} map @{map}"
                )
            }
            Rule::Dnat { proto, to } => {
                let ip = if to.is_ipv6() { "ip6" } else { "ip" };
                let dest = match to {
                    SocketAddr::V4(a) => a.to_string(),
                    SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
                };
                format!("meta l4proto {} dnat {ip} to {dest}", proto_name(*proto))
            }
            Rule::AffinityCheck { fam, set, chain } => {
                format!("{} saddr @{set} goto {chain}", fam.ip())
            }
            Rule::AffinityUpdate { fam, set } => format!("update @{set} {{ {} saddr }}", fam.ip()),
            Rule::NumgenVmap(chains) => {
                let arms: Vec<String> = chains
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("{i} : goto {c}"))
                    .collect();
                format!(
                    "numgen random mod {} vmap {{ {} }}",
                    chains.len(),
                    arms.join(", ")
                )
            }
            Rule::HairpinMasq { fam, set } => format!(
                "ct status dnat {ip} saddr . {ip} daddr @{set} masquerade",
                ip = fam.ip()
            ),
            Rule::ReturnUnmarked => format!("meta mark & {MASQ_MARK:#x} == 0 return"),
            Rule::ClearMark => format!("meta mark set meta mark ^ {MASQ_MARK:#x}"),
            Rule::Masquerade => "masquerade fully-random".into(),
            Rule::RejectTcpReset => "meta l4proto tcp reject with tcp reset".into(),
            Rule::Reject => "reject".into(),
            Rule::Drop => "drop".into(),
        }
    }
}

/// A chain: a base chain has a hook.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chain {
    pub hook: Option<Hook>,
    pub rules: Vec<Rule>,
}

/// The whole desired state of Ferry's table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
}

/// First 16 characters of base32(sha256(s)), as upstream names its chains.
pub fn hash16(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    base32(&digest)[..16].to_string()
}

/// RFC 4648 base32 (with padding), as Go's `base32.StdEncoding`.
pub fn base32(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    for chunk in data.chunks(5) {
        let mut buf = [0u8; 5];
        buf[..chunk.len()].copy_from_slice(chunk);
        let v = buf.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        let chars = (chunk.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < chars {
                let idx = ((v >> (35 - i * 5)) & 31) as usize;
                out.push(ALPHABET[idx] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// Fixed names.
pub const SERVICES: &str = "services";
pub const MASQUERADING: &str = "masquerading";
pub const ENDPOINTS_CHECK: &str = "endpoints-check";
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub const REJECT_CHAIN: &str = "reject-chain";

pub fn svc_map(f: Fam) -> String {
    format!("svc{}", f.n())
}
pub fn np_map(f: Fam) -> String {
    format!("np{}", f.n())
}
pub fn noep_map(f: Fam) -> String {
    format!("noep{}", f.n())
}
pub fn noep_np_map(f: Fam) -> String {
    format!("noep-np{}", f.n())
}
pub fn hairpin_set(f: Fam) -> String {
    format!("hairpin{}", f.n())
}
pub fn nodeips_set(f: Fam) -> String {
    format!("nodeips{}", f.n())
}

/// The base of the table: hooks, the dispatch chains and the always-present maps.
fn base(cfg: &NftConfig) -> Ruleset {
    let mut rs = Ruleset::default();
    let mut chain = |name: &str, hook: Option<Hook>, rules: Vec<Rule>| {
        rs.chains.insert(name.to_string(), Chain { hook, rules });
    };
    chain(
        "nat-prerouting",
        Some(Hook::NatPrerouting),
        vec![Rule::Jump(SERVICES.into())],
    );
    chain(
        "nat-output",
        Some(Hook::NatOutput),
        vec![Rule::Jump(SERVICES.into())],
    );
    chain(
        "nat-postrouting",
        Some(Hook::NatPostrouting),
        vec![Rule::Jump(MASQUERADING.into())],
    );
    chain(
        MASQUERADING,
        None,
        vec![
            Rule::HairpinMasq {
                fam: Fam::V4,
                set: hairpin_set(Fam::V4),
            },
            Rule::HairpinMasq {
                fam: Fam::V6,
                set: hairpin_set(Fam::V6),
            },
            Rule::ReturnUnmarked,
            Rule::ClearMark,
            Rule::Masquerade,
        ],
    );
    let v4_np = cfg.node_ips.iter().any(|i| i.is_ipv4());
    let v6_np = cfg.node_ips.iter().any(|i| i.is_ipv6());
    let np_addrs = |f: Fam| -> Option<String> {
        if cfg.node_ips.is_empty() {
            None
        } else {
            Some(nodeips_set(f))
        }
    };
    let mut services = Vec::new();
    let mut epcheck = Vec::new();
    let mut npcheck = Vec::new();
    for f in [Fam::V4, Fam::V6] {
        services.push(Rule::FrontendVmap {
            fam: f,
            map: svc_map(f),
        });
        epcheck.push(Rule::FrontendVmap {
            fam: f,
            map: noep_map(f),
        });
    }
    for f in [Fam::V4, Fam::V6] {
        let has = match f {
            Fam::V4 => v4_np,
            Fam::V6 => v6_np,
        };
        if cfg.node_ips.is_empty() || has {
            services.push(Rule::NodePortVmap {
                fam: f,
                map: np_map(f),
                addrs: np_addrs(f),
            });
            npcheck.push(Rule::NodePortVmap {
                fam: f,
                map: noep_np_map(f),
                addrs: np_addrs(f),
            });
        }
    }
    chain(SERVICES, None, services);
    chain(ENDPOINTS_CHECK, None, epcheck);
    chain(NODEPORT_ENDPOINTS_CHECK, None, npcheck);
    chain(
        "filter-input",
        Some(Hook::FilterInput),
        vec![
            Rule::CtNewJump(NODEPORT_ENDPOINTS_CHECK.into()),
            Rule::CtNewJump(ENDPOINTS_CHECK.into()),
        ],
    );
    chain(
        "filter-forward",
        Some(Hook::FilterForward),
        vec![Rule::CtNewJump(ENDPOINTS_CHECK.into())],
    );
    chain(
        "filter-output",
        Some(Hook::FilterOutput),
        vec![
            Rule::CtNewJump(NODEPORT_ENDPOINTS_CHECK.into()),
            Rule::CtNewJump(ENDPOINTS_CHECK.into()),
        ],
    );
    chain(REJECT_CHAIN, None, vec![Rule::RejectTcpReset, Rule::Reject]);
    for f in [Fam::V4, Fam::V6] {
        rs.sets
            .insert(svc_map(f), Set::new(SetKind::FrontendVmap(f)));
        rs.sets
            .insert(noep_map(f), Set::new(SetKind::FrontendVmap(f)));
        rs.sets.insert(np_map(f), Set::new(SetKind::PortVmap));
        rs.sets.insert(noep_np_map(f), Set::new(SetKind::PortVmap));
        rs.sets.insert(hairpin_set(f), Set::new(SetKind::Pairs(f)));
    }
    if !cfg.node_ips.is_empty() {
        for f in [Fam::V4, Fam::V6] {
            let mut s = Set::new(SetKind::Addrs(f));
            for ip in cfg.node_ips.iter().filter(|i| Fam::of(i) == f) {
                s.elements.insert(Key::Addr(*ip), Value::None);
            }
            rs.sets.insert(nodeips_set(f), s);
        }
    }
    rs
}

struct Builder<'a> {
    cfg: &'a NftConfig,
    rs: Ruleset,
}

impl Builder<'_> {
    fn ensure_chain(&mut self, name: &str, rules: impl FnOnce() -> Vec<Rule>) {
        if !self.rs.chains.contains_key(name) {
            self.rs.chains.insert(
                name.to_string(),
                Chain {
                    hook: None,
                    rules: rules(),
                },
            );
        }
    }
    fn set(&mut self, name: &str, kind: SetKind) -> &mut Set {
        self.rs
            .sets
            .entry(name.to_string())
            .or_insert_with(|| Set::new(kind))
    }
    /// Inserts into a verdict map unless the key is taken (first claim wins).
    fn claim(&mut self, map: &str, key: Key, v: Verdict) -> bool {
        let Some(s) = self.rs.sets.get_mut(map) else {
            return false;
        };
        if s.elements.contains_key(&key) {
            return false;
        }
        s.elements.insert(key, Value::Verdict(v));
        true
    }
    fn hairpin(&mut self, f: Fam, eps: &[SocketAddr]) {
        let name = hairpin_set(f);
        if let Some(s) = self.rs.sets.get_mut(&name) {
            for e in eps {
                s.elements
                    .insert(Key::AddrPair(e.ip(), e.ip()), Value::None);
            }
        }
    }
    fn cluster_masq(&self, f: Fam) -> Option<Rule> {
        let cidrs: Vec<IpNet> = self
            .cfg
            .pod_cidrs
            .iter()
            .filter(|c| Fam::of(&c.addr()) == f)
            .copied()
            .collect();
        if self.cfg.masquerade_all {
            Some(Rule::MasqUnlessFrom {
                fam: f,
                cidrs: Vec::new(),
            })
        } else if !cidrs.is_empty() {
            Some(Rule::MasqUnlessFrom { fam: f, cidrs })
        } else {
            None
        }
    }
    fn pod_cidrs(&self, f: Fam) -> Vec<IpNet> {
        self.cfg
            .pod_cidrs
            .iter()
            .filter(|c| Fam::of(&c.addr()) == f)
            .copied()
            .collect()
    }

    /// Frontends with no pool: into the filter-hook maps.
    fn no_endpoints(&mut self, sp: &SvcPort, f: Fam, target: &Target, internal: bool) {
        let v = match target {
            Target::Drop => Verdict::Drop,
            _ => Verdict::Goto(REJECT_CHAIN.into()),
        };
        let proto = sp.name.proto;
        if internal {
            for ip in &sp.cluster_ips {
                self.claim(&noep_map(f), Key::Frontend(*ip, proto, sp.port), v.clone());
            }
        } else {
            for (ip, _) in &sp.externals {
                self.claim(&noep_map(f), Key::Frontend(*ip, proto, sp.port), v.clone());
            }
            if let Some(np) = sp.node_port {
                self.claim(&noep_np_map(f), Key::Port(proto, np), v);
            }
        }
    }

    /// The shared-chain path.
    fn simple(&mut self, sp: &SvcPort, f: Fam) {
        let proto = sp.name.proto;
        let n = f.n();
        match &sp.internal {
            Target::Pool(eps) => {
                let k = eps.len() as u32;
                let chain = format!("cl{n}-{k}");
                let dmap = format!("dnat{n}-{k}");
                let masq = self.cluster_masq(f);
                let c_map = dmap.clone();
                self.ensure_chain(&chain, || {
                    let mut r: Vec<Rule> = masq.into_iter().collect();
                    r.push(Rule::DnatMap {
                        fam: f,
                        map: c_map,
                        by_addr: true,
                        k,
                    });
                    r
                });
                self.set(&dmap, SetKind::FrontendDnat(f));
                for ip in &sp.cluster_ips {
                    if self.claim(
                        &svc_map(f),
                        Key::Frontend(*ip, proto, sp.port),
                        Verdict::Goto(chain.clone()),
                    ) {
                        let s = self.set(&dmap, SetKind::FrontendDnat(f));
                        for (i, e) in eps.iter().enumerate() {
                            s.elements.insert(
                                Key::FrontendIdx(*ip, proto, sp.port, i as u32),
                                Value::Endpoint(*e),
                            );
                        }
                    }
                }
                self.hairpin(f, eps);
            }
            t => self.no_endpoints(sp, f, t, true),
        }
        if !sp.has_external() {
            return;
        }
        match &sp.external {
            Target::Pool(eps) => {
                let k = eps.len() as u32;
                if !sp.externals.is_empty() {
                    let chain = format!("ex{n}-{k}");
                    let dmap = format!("dnat{n}-{k}");
                    let c_map = dmap.clone();
                    self.ensure_chain(&chain, || {
                        vec![
                            Rule::MarkMasq,
                            Rule::DnatMap {
                                fam: f,
                                map: c_map,
                                by_addr: true,
                                k,
                            },
                        ]
                    });
                    self.set(&dmap, SetKind::FrontendDnat(f));
                    for (ip, _) in &sp.externals {
                        if self.claim(
                            &svc_map(f),
                            Key::Frontend(*ip, proto, sp.port),
                            Verdict::Goto(chain.clone()),
                        ) {
                            let s = self.set(&dmap, SetKind::FrontendDnat(f));
                            for (i, e) in eps.iter().enumerate() {
                                s.elements.insert(
                                    Key::FrontendIdx(*ip, proto, sp.port, i as u32),
                                    Value::Endpoint(*e),
                                );
                            }
                        }
                    }
                }
                if let Some(np) = sp.node_port {
                    let chain = format!("np{n}-{k}");
                    let dmap = format!("npdnat{n}-{k}");
                    let c_map = dmap.clone();
                    self.ensure_chain(&chain, || {
                        vec![
                            Rule::MarkMasq,
                            Rule::DnatMap {
                                fam: f,
                                map: c_map,
                                by_addr: false,
                                k,
                            },
                        ]
                    });
                    self.set(&dmap, SetKind::PortDnat(f));
                    if self.claim(&np_map(f), Key::Port(proto, np), Verdict::Goto(chain)) {
                        let s = self.set(&dmap, SetKind::PortDnat(f));
                        for (i, e) in eps.iter().enumerate() {
                            s.elements
                                .insert(Key::PortIdx(proto, np, i as u32), Value::Endpoint(*e));
                        }
                    }
                }
                self.hairpin(f, eps);
            }
            t => self.no_endpoints(sp, f, t, false),
        }
    }

    /// A chooser chain over `eps` (with affinity checks first) and the endpoint chains.
    fn chooser(&mut self, sp: &SvcPort, f: Fam, name: &str, eps: &[SocketAddr]) {
        let spn = sp.name.to_string();
        let mut rules = Vec::new();
        let mut seps = Vec::new();
        for e in eps {
            let h = hash16(&format!("{spn}{e}"));
            let sep = format!("sep{}-{h}", f.n());
            let mut sep_rules = Vec::new();
            if let Some(t) = sp.affinity {
                let set = format!("aff{}-{h}", f.n());
                self.set(&set, SetKind::Affinity(f, t.as_secs().max(1)));
                rules.push(Rule::AffinityCheck {
                    fam: f,
                    set: set.clone(),
                    chain: sep.clone(),
                });
                sep_rules.push(Rule::AffinityUpdate { fam: f, set });
            }
            sep_rules.push(Rule::Dnat {
                proto: sp.name.proto,
                to: *e,
            });
            self.rs.chains.insert(
                sep.clone(),
                Chain {
                    hook: None,
                    rules: sep_rules,
                },
            );
            seps.push(sep);
        }
        if seps.len() == 1 {
            rules.push(Rule::Goto(seps[0].clone()));
        } else {
            rules.push(Rule::NumgenVmap(seps));
        }
        self.rs
            .chains
            .insert(name.to_string(), Chain { hook: None, rules });
        self.hairpin(f, eps);
    }

    /// The per-Service path (affinity, or external policy `Local`).
    fn special(&mut self, sp: &SvcPort, f: Fam) {
        let proto = sp.name.proto;
        let n = f.n();
        let h = hash16(&format!("{}{}", sp.name, n));
        let int_pool = format!("svc{n}-{h}");
        let ext_pool = format!("svl{n}-{h}");
        let entry_ci = format!("ci{n}-{h}");
        let entry_ext = format!("ext{n}-{h}");
        if let Target::Pool(eps) = &sp.internal {
            self.chooser(sp, f, &int_pool, eps);
            let mut rules: Vec<Rule> = self.cluster_masq(f).into_iter().collect();
            rules.push(Rule::Goto(int_pool.clone()));
            self.rs
                .chains
                .insert(entry_ci.clone(), Chain { hook: None, rules });
            for ip in &sp.cluster_ips {
                self.claim(
                    &svc_map(f),
                    Key::Frontend(*ip, proto, sp.port),
                    Verdict::Goto(entry_ci.clone()),
                );
            }
        } else {
            self.no_endpoints(sp, f, &sp.internal.clone(), true);
        }
        if !sp.has_external() {
            return;
        }
        if let Target::Pool(eps) = &sp.external {
            self.chooser(sp, f, &ext_pool, eps);
            let mut rules = Vec::new();
            if sp.external_local {
                let has_int = matches!(sp.internal, Target::Pool(_));
                let cidrs = self.pod_cidrs(f);
                if has_int && !cidrs.is_empty() {
                    // Pod traffic to an external frontend is short-circuited to the cluster
                    // endpoints, as upstream does.
                    rules.push(Rule::GotoIfFrom {
                        fam: f,
                        cidrs,
                        chain: int_pool.clone(),
                    });
                }
                // Node-local clients: masqueraded, and sent to the cluster endpoints.
                rules.push(Rule::MarkMasqIfLocalSource);
                if has_int {
                    rules.push(Rule::GotoIfLocalSource(int_pool.clone()));
                }
            } else {
                rules.push(Rule::MarkMasq);
            }
            rules.push(Rule::Goto(ext_pool.clone()));
            self.rs
                .chains
                .insert(entry_ext.clone(), Chain { hook: None, rules });
            for (ip, _) in &sp.externals {
                self.claim(
                    &svc_map(f),
                    Key::Frontend(*ip, proto, sp.port),
                    Verdict::Goto(entry_ext.clone()),
                );
            }
            if let Some(np) = sp.node_port {
                self.claim(
                    &np_map(f),
                    Key::Port(proto, np),
                    Verdict::Goto(entry_ext.clone()),
                );
            }
        } else if sp.external_local
            && sp.external == Target::Drop
            && matches!(sp.internal, Target::Pool(_))
        {
            // No local endpoint for external traffic, but the Service has endpoints: pods and
            // node-local clients are still short-circuited to the cluster endpoints (as
            // upstream's external chain does before its filter drops the rest); others drop.
            let mut rules = Vec::new();
            let cidrs = self.pod_cidrs(f);
            if !cidrs.is_empty() {
                rules.push(Rule::GotoIfFrom {
                    fam: f,
                    cidrs,
                    chain: int_pool.clone(),
                });
            }
            rules.push(Rule::MarkMasqIfLocalSource);
            rules.push(Rule::GotoIfLocalSource(int_pool.clone()));
            rules.push(Rule::Drop);
            self.rs
                .chains
                .insert(entry_ext.clone(), Chain { hook: None, rules });
            for (ip, _) in &sp.externals {
                self.claim(
                    &svc_map(f),
                    Key::Frontend(*ip, proto, sp.port),
                    Verdict::Goto(entry_ext.clone()),
                );
            }
            if let Some(np) = sp.node_port {
                self.claim(
                    &np_map(f),
                    Key::Port(proto, np),
                    Verdict::Goto(entry_ext.clone()),
                );
            }
        } else {
            self.no_endpoints(sp, f, &sp.external.clone(), false);
        }
    }
}

/// Renders the desired state of the table. Pure.
pub fn render(ports: &[SvcPort], cfg: &NftConfig) -> Ruleset {
    let mut b = Builder { cfg, rs: base(cfg) };
    for sp in ports {
        b.port(sp);
    }
    b.rs
}

impl Builder<'_> {
    fn port(&mut self, sp: &SvcPort) {
        let f = if sp.ipv6 { Fam::V6 } else { Fam::V4 };
        let special = sp.affinity.is_some() || (sp.external_local && sp.has_external());
        if special {
            self.special(sp, f);
        } else {
            self.simple(sp, f);
        }
    }
}

/// The always-present maps and sets of the table (no chains): what a fragment is rendered
/// against (its claims need the maps). Pure.
pub fn skeleton(cfg: &NftConfig) -> Ruleset {
    let mut rs = base(cfg);
    rs.chains.clear();
    rs
}

/// Renders `ports` alone on top of `skeleton` (from [`skeleton`]): the chains, sets and
/// elements they add to the table. Pure; see [`super::incr`].
pub fn render_on(ports: &[SvcPort], cfg: &NftConfig, skeleton: &Ruleset) -> Ruleset {
    let mut b = Builder {
        cfg,
        rs: skeleton.clone(),
    };
    for sp in ports {
        b.port(sp);
    }
    b.rs
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    AddChain(String, Option<Hook>),
    AddSet(String, SetKind),
    AddElements(String, Vec<(Key, Value)>),
    DeleteElements(String, Vec<Key>),
    FlushChain(String),
    AddRules(String, Vec<Rule>),
    DeleteSet(String, SetKind),
    DeleteChain(String),
}

/// The operations turning `old` into `new`, in an order the kernel accepts in one transaction:
/// new chains and sets first, then element changes, then rules, then deletions of what nothing
/// references any more. Dynamic sets keep their learned elements.
pub fn diff(old: &Ruleset, new: &Ruleset) -> Vec<Op> {
    let mut adds_chain = Vec::new();
    let mut adds_set = Vec::new();
    let mut dels_el = Vec::new();
    let mut adds_el = Vec::new();
    let mut rules = Vec::new();
    let mut dels_set = Vec::new();
    let mut dels_chain = Vec::new();
    let mut flush_dead = Vec::new();
    // Chains whose hook changed are deleted and re-added (base chains are never referenced).
    for (name, c) in &new.chains {
        match old.chains.get(name) {
            None => {
                adds_chain.push(Op::AddChain(name.clone(), c.hook));
                if !c.rules.is_empty() {
                    rules.push(Op::AddRules(name.clone(), c.rules.clone()));
                }
            }
            Some(o) if o.hook != c.hook => {
                dels_chain.push(Op::DeleteChain(name.clone()));
                flush_dead.push(Op::FlushChain(name.clone()));
                // Re-added after the deletion (see the end).
            }
            Some(o) if o.rules != c.rules => {
                rules.push(Op::FlushChain(name.clone()));
                if !c.rules.is_empty() {
                    rules.push(Op::AddRules(name.clone(), c.rules.clone()));
                }
            }
            Some(_) => {}
        }
    }
    let mut readd = Vec::new();
    for (name, c) in &new.chains {
        if let Some(o) = old.chains.get(name)
            && o.hook != c.hook
        {
            readd.push(Op::AddChain(name.clone(), c.hook));
            if !c.rules.is_empty() {
                readd.push(Op::AddRules(name.clone(), c.rules.clone()));
            }
        }
    }
    for name in old.chains.keys() {
        if !new.chains.contains_key(name) {
            flush_dead.push(Op::FlushChain(name.clone()));
            dels_chain.push(Op::DeleteChain(name.clone()));
        }
    }
    let mut readd_sets = Vec::new();
    for (name, s) in &new.sets {
        match old.sets.get(name) {
            Some(o) if o.kind == s.kind => {
                if s.kind.as_ref().is_some_and(SetKind::is_dynamic) {
                    continue;
                }
                let del: Vec<Key> = o
                    .elements
                    .iter()
                    .filter(|(k, v)| s.elements.get(*k) != Some(*v))
                    .map(|(k, _)| k.clone())
                    .collect();
                let add: Vec<(Key, Value)> = s
                    .elements
                    .iter()
                    .filter(|(k, v)| o.elements.get(*k) != Some(*v))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if !del.is_empty() {
                    dels_el.push(Op::DeleteElements(name.clone(), del));
                }
                if !add.is_empty() {
                    adds_el.push(Op::AddElements(name.clone(), add));
                }
            }
            other => {
                let Some(kind) = s.kind.clone() else { continue };
                let target = if let Some(o) = other {
                    if let Some(k) = o.kind.clone() {
                        dels_set.push(Op::DeleteSet(name.clone(), k));
                    }
                    &mut readd_sets
                } else {
                    &mut adds_set
                };
                target.push(Op::AddSet(name.clone(), kind));
                if !s.elements.is_empty() {
                    target.push(Op::AddElements(
                        name.clone(),
                        s.elements
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    ));
                }
            }
        }
    }
    for (name, s) in &old.sets {
        if !new.sets.contains_key(name)
            && let Some(k) = s.kind.clone()
        {
            dels_set.push(Op::DeleteSet(name.clone(), k));
        }
    }
    let mut ops = Vec::new();
    ops.extend(adds_chain);
    ops.extend(adds_set);
    ops.extend(dels_el);
    ops.extend(adds_el);
    ops.extend(rules);
    ops.extend(flush_dead);
    ops.extend(dels_set);
    ops.extend(dels_chain);
    ops.extend(readd_sets);
    ops.extend(readd);
    ops
}

/// Errors of [`apply_ops`] (an operation that the kernel would refuse too).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("{0} already exists")]
    Exists(String),
    #[error("{0} does not exist")]
    Missing(String),
    #[error("{0} is still referenced")]
    Busy(String),
    #[error("chain {0} is not empty")]
    NotEmpty(String),
}

/// Applies operations to a model of the kernel's table, refusing what the kernel refuses
/// (adding what exists, deleting what does not, deleting a chain that still has rules).
pub fn apply_ops(rs: &mut Ruleset, ops: &[Op]) -> Result<(), ModelError> {
    for op in ops {
        match op {
            Op::AddChain(n, hook) => {
                if rs.chains.contains_key(n) {
                    return Err(ModelError::Exists(n.clone()));
                }
                rs.chains.insert(
                    n.clone(),
                    Chain {
                        hook: *hook,
                        rules: Vec::new(),
                    },
                );
            }
            Op::AddSet(n, k) => {
                if rs.sets.contains_key(n) {
                    return Err(ModelError::Exists(n.clone()));
                }
                rs.sets.insert(n.clone(), Set::new(k.clone()));
            }
            Op::AddElements(n, els) => {
                let s = rs
                    .sets
                    .get_mut(n)
                    .ok_or_else(|| ModelError::Missing(n.clone()))?;
                for (k, v) in els {
                    if s.elements.contains_key(k) {
                        return Err(ModelError::Exists(format!("{n} {k}")));
                    }
                    s.elements.insert(k.clone(), v.clone());
                }
            }
            Op::DeleteElements(n, keys) => {
                let s = rs
                    .sets
                    .get_mut(n)
                    .ok_or_else(|| ModelError::Missing(n.clone()))?;
                for k in keys {
                    if s.elements.remove(k).is_none() {
                        return Err(ModelError::Missing(format!("{n} {k}")));
                    }
                }
            }
            Op::FlushChain(n) => {
                rs.chains
                    .get_mut(n)
                    .ok_or_else(|| ModelError::Missing(n.clone()))?
                    .rules
                    .clear();
            }
            Op::AddRules(n, rules) => {
                rs.chains
                    .get_mut(n)
                    .ok_or_else(|| ModelError::Missing(n.clone()))?
                    .rules
                    .extend(rules.iter().cloned());
            }
            Op::DeleteSet(n, _) => {
                let s = rs
                    .sets
                    .remove(n)
                    .ok_or_else(|| ModelError::Missing(n.clone()))?;
                if dangling(rs).contains(&format!("set {n}")) {
                    rs.sets.insert(n.clone(), s);
                    return Err(ModelError::Busy(n.clone()));
                }
            }
            Op::DeleteChain(n) => {
                let c = rs
                    .chains
                    .get(n)
                    .ok_or_else(|| ModelError::Missing(n.clone()))?;
                if !c.rules.is_empty() {
                    return Err(ModelError::NotEmpty(n.clone()));
                }
                let c = rs.chains.remove(n);
                if dangling(rs).contains(&format!("chain {n}")) {
                    if let Some(c) = c {
                        rs.chains.insert(n.clone(), c);
                    }
                    return Err(ModelError::Busy(n.clone()));
                }
            }
        }
    }
    Ok(())
}

fn write_elements(out: &mut String, els: &[(Key, Value)]) {
    for (i, (k, v)) in els.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{k}");
        if *v != Value::None {
            let _ = write!(out, " : {v}");
        }
    }
}

/// Writes operations as an `nft -f` script (one transaction).
pub fn render_ops(table: &str, ops: &[Op]) -> String {
    let mut out = String::new();
    for op in ops {
        match op {
            Op::AddChain(n, hook) => match hook {
                Some(h) => {
                    let _ = writeln!(out, "add chain inet {table} {n} {{ {} }}", h.decl());
                }
                None => {
                    let _ = writeln!(out, "add chain inet {table} {n}");
                }
            },
            Op::AddSet(n, k) => {
                let word = if k.is_map() { "map" } else { "set" };
                let _ = writeln!(out, "add {word} inet {table} {n} {{ {} }}", k.decl());
            }
            Op::AddElements(n, els) => {
                // Long lists in chunks keep lines (and nft's parser) reasonable.
                for chunk in els.chunks(4096) {
                    let _ = write!(out, "add element inet {table} {n} {{ ");
                    write_elements(&mut out, chunk);
                    out.push_str(" }\n");
                }
            }
            Op::DeleteElements(n, keys) => {
                for chunk in keys.chunks(4096) {
                    let v: Vec<String> = chunk.iter().map(|k| k.to_string()).collect();
                    let _ = writeln!(
                        out,
                        "delete element inet {table} {n} {{ {} }}",
                        v.join(", ")
                    );
                }
            }
            Op::FlushChain(n) => {
                let _ = writeln!(out, "flush chain inet {table} {n}");
            }
            Op::AddRules(n, rules) => {
                for r in rules {
                    let _ = writeln!(out, "add rule inet {table} {n} {}", r.render());
                }
            }
            Op::DeleteSet(n, k) => {
                let word = if k.is_map() { "map" } else { "set" };
                let _ = writeln!(out, "delete {word} inet {table} {n}");
            }
            Op::DeleteChain(n) => {
                let _ = writeln!(out, "delete chain inet {table} {n}");
            }
        }
    }
    out
}

/// A script replacing the whole table atomically (first sync, resync): the table is created
/// if missing, deleted, and written anew, in one transaction.
pub fn render_full(table: &str, rs: &Ruleset) -> String {
    let mut out =
        format!("add table inet {table}\ndelete table inet {table}\nadd table inet {table}\n");
    out.push_str(&render_ops(table, &diff(&Ruleset::default(), rs)));
    out
}

/// A script deleting the table (cleanup); harmless when it does not exist.
pub fn render_cleanup(table: &str) -> String {
    format!("add table inet {table}\ndelete table inet {table}\n")
}

/// The chains and sets a ruleset references that it does not define (a consistency check).
pub fn dangling(rs: &Ruleset) -> BTreeSet<String> {
    let mut missing = BTreeSet::new();
    let mut need_chain = |c: &str| {
        if !rs.chains.contains_key(c) {
            missing.insert(format!("chain {c}"));
        }
    };
    for c in rs.chains.values() {
        for r in &c.rules {
            match r {
                Rule::Jump(x)
                | Rule::CtNewJump(x)
                | Rule::Goto(x)
                | Rule::GotoIfLocalSource(x)
                | Rule::GotoIfFrom { chain: x, .. }
                | Rule::AffinityCheck { chain: x, .. } => need_chain(x),
                Rule::NumgenVmap(v) => v.iter().for_each(|x| need_chain(x)),
                _ => {}
            }
        }
    }
    for s in rs.sets.values() {
        for v in s.elements.values() {
            if let Value::Verdict(Verdict::Goto(c)) = v {
                need_chain(c);
            }
        }
    }
    let mut need_set = |s: &str| {
        if !rs.sets.contains_key(s) {
            missing.insert(format!("set {s}"));
        }
    };
    for c in rs.chains.values() {
        for r in &c.rules {
            match r {
                Rule::FrontendVmap { map, .. } | Rule::DnatMap { map, .. } => need_set(map),
                Rule::NodePortVmap { map, addrs, .. } => {
                    need_set(map);
                    if let Some(a) = addrs {
                        need_set(a);
                    }
                }
                Rule::AffinityCheck { set, .. }
                | Rule::AffinityUpdate { set, .. }
                | Rule::HairpinMasq { set, .. } => need_set(set),
                _ => {}
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests;
