//! The node's NetworkPolicy table, computed from the model (pure).
//!
//! Where: the node network namespace's `forward` hook, in Ferry's own `inet ferry-netpol` table
//! (separate from the service proxy's table). Every pod-to-pod packet crosses it: routed
//! between nodes, and bridged between pods of one node because br_netfilter is on. Service
//! DNAT happens in `prerouting` (priority dstnat), before `forward`, so the rules see the
//! chosen pod's address and port: policies apply to pod IPs after Service translation, as
//! upstream requires. Traffic between a pod and its own node goes through `input`/`output`,
//! not `forward`, so it is never filtered (upstream: always allowed); the node's addresses are
//! also accepted explicitly.
//!
//! Layout (few objects, so that a change is a few element operations):
//!
//! ```text
//! chain pods_egress  { hook forward priority 0;  ct state established,related accept;
//!                      ip daddr @node4 accept; ip saddr vmap @egress4; (and ip6) }
//! chain pods_ingress { hook forward priority 1;  ct state established,related accept;
//!                      ip saddr @node4 accept; ip daddr vmap @ingress4; (and ip6) }
//! map egress4  { pod address of an egress-isolated local pod : jump e_<ns>_<pod> }
//! chain e_<ns>_<pod> { jump r_<ns>_<policy>_e<k> (each rule of each selecting policy);
//!                      limit+log group N; counter reject }
//! chain r_<ns>_<policy>_e<k> { [ip daddr @..._p4] [meta l4proto . th dport @..._n | ip daddr .
//!                      meta l4proto . th dport @..._m4] counter accept }
//! ```
//!
//! Egress accepts end `pods_egress` only; `pods_ingress` still runs, so a packet needs both.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::{Direction, Model, Peer, PodInfo, PodKey, PolicyKey, PortSel, Proto};
use crate::ruleset::{
    Action, Chain, Elem, Fam, Field, Hook, LogSpec, Match, Rule, Ruleset, Set, SetKind,
};
use crate::verdict::{self, Endpoint};

/// Ferry's table for NetworkPolicy (the service proxy has its own).
pub const TABLE: &str = "ferry-netpol";
pub const EGRESS_CHAIN: &str = "pods_egress";
pub const INGRESS_CHAIN: &str = "pods_ingress";

/// How denied connections are handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Reject (ICMP admin-prohibited) instead of silently dropping; clients fail at once.
    pub reject: bool,
    /// nflog group of the rate-limited deny log (None: no log rule, counters only).
    pub log_group: Option<u16>,
    /// Log lines per second per pod chain.
    pub log_rate: u32,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            reject: true,
            log_group: Some(100),
            log_rate: 10,
        }
    }
}

/// A short, stable hash for names too long for the kernel.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// nftables identifiers: letters, digits, `_`, `-`, `.`; at most ~120 characters here.
fn ident(prefix: &str, parts: &[&str]) -> String {
    let raw = format!("{prefix}_{}", parts.join("_"));
    let ok = raw
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if ok && raw.len() <= 120 {
        raw
    } else {
        format!("{prefix}_h{:016x}", fnv(&raw))
    }
}

/// The chain of a pod's direction.
pub fn pod_chain(dir: Direction, pod: &PodKey) -> String {
    let p = match dir {
        Direction::Ingress => "i",
        Direction::Egress => "e",
    };
    ident(p, &[&pod.namespace, &pod.name])
}

/// The chain of one rule of a policy.
pub fn rule_chain(dir: Direction, policy: &PolicyKey, rule: usize) -> String {
    let d = match dir {
        Direction::Ingress => "i",
        Direction::Egress => "e",
    };
    ident(
        "r",
        &[&policy.namespace, &policy.name, &format!("{d}{rule}")],
    )
}

fn fam_suffix(f: Fam) -> &'static str {
    match f {
        Fam::V4 => "4",
        Fam::V6 => "6",
    }
}

// ---- address ranges -------------------------------------------------------------------

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(f: Fam, v: u128) -> IpAddr {
    match f {
        Fam::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(v).unwrap_or(u32::MAX))),
        Fam::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

fn net_range(n: &ipnet::IpNet) -> (u128, u128) {
    (to_u128(n.network()), to_u128(n.broadcast()))
}

/// Sorted, merged (overlapping and adjacent joined) inclusive ranges.
fn merge(mut v: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    v.sort();
    let mut out: Vec<(u128, u128)> = Vec::new();
    for (a, b) in v {
        if let Some(last) = out.last_mut()
            && a <= last.1.saturating_add(1)
        {
            last.1 = last.1.max(b);
            continue;
        }
        out.push((a, b));
    }
    out
}

/// `ranges` minus `holes` (both merged).
fn subtract(ranges: &[(u128, u128)], holes: &[(u128, u128)]) -> Vec<(u128, u128)> {
    let mut out = Vec::new();
    for &(a, b) in ranges {
        let mut start = a;
        let mut open = true;
        for &(ha, hb) in holes {
            if hb < start || ha > b {
                continue;
            }
            if ha > start {
                out.push((start, ha - 1));
            }
            if hb >= b {
                open = false;
                break;
            }
            start = hb + 1;
        }
        if open && start <= b {
            out.push((start, b));
        }
    }
    out
}

/// The addresses a rule's peers match, per family, as merged ranges.
fn peer_ranges(model: &Model, policy_ns: &str, peers: &[Peer]) -> BTreeMap<Fam, Vec<(u128, u128)>> {
    let mut by: BTreeMap<Fam, Vec<(u128, u128)>> = BTreeMap::new();
    for peer in peers {
        match peer {
            Peer::IpBlock { cidr, except } => {
                let f = Fam::of(&cidr.addr());
                let holes = merge(
                    except
                        .iter()
                        .filter(|e| Fam::of(&e.addr()) == f)
                        .map(net_range)
                        .collect(),
                );
                by.entry(f)
                    .or_default()
                    .extend(subtract(&[net_range(cidr)], &holes));
            }
            Peer::Pods { .. } => {
                for (k, p) in &model.pods {
                    if p.host_network || p.ips.is_empty() {
                        continue;
                    }
                    let e = Endpoint::pod(k.clone());
                    if verdict::peer_matches(model, policy_ns, peer, &e, None) {
                        for ip in &p.ips {
                            let v = to_u128(*ip);
                            by.entry(Fam::of(ip)).or_default().push((v, v));
                        }
                    }
                }
            }
        }
    }
    by.into_iter().map(|(f, v)| (f, merge(v))).collect()
}

/// Numeric ports of a rule as merged per-protocol ranges.
fn numeric_ports(rule: &crate::model::Rule) -> BTreeSet<Elem> {
    let mut by: BTreeMap<Proto, Vec<(u128, u128)>> = BTreeMap::new();
    for p in &rule.ports {
        let r = match p.port {
            PortSel::Any => (0, 65535),
            PortSel::Range(a, b) => (u128::from(a), u128::from(b)),
            PortSel::Named(_) => continue,
        };
        by.entry(p.proto).or_default().push(r);
    }
    let mut out = BTreeSet::new();
    for (proto, v) in by {
        for (a, b) in merge(v) {
            out.insert(Elem::Ports(
                proto,
                u16::try_from(a).unwrap_or(u16::MAX),
                u16::try_from(b).unwrap_or(u16::MAX),
            ));
        }
    }
    out
}

/// Named ports of a rule resolved against the possible destination pods.
fn named_ports<'a>(
    rule: &crate::model::Rule,
    dsts: impl Iterator<Item = &'a PodInfo> + Clone,
) -> BTreeMap<Fam, BTreeSet<Elem>> {
    let mut by: BTreeMap<Fam, BTreeSet<Elem>> = BTreeMap::new();
    for p in &rule.ports {
        let PortSel::Named(name) = &p.port else {
            continue;
        };
        for pod in dsts.clone() {
            for np in &pod.ports {
                if &np.name == name && np.proto == p.proto {
                    for ip in &pod.ips {
                        by.entry(Fam::of(ip))
                            .or_default()
                            .insert(Elem::AddrPort(*ip, np.proto, np.port));
                    }
                }
            }
        }
    }
    by
}

fn hook(priority: i32) -> Option<Hook> {
    Some(Hook {
        hook: "forward",
        priority,
    })
}

fn add_set(rs: &mut Ruleset, name: &str, kind: SetKind, elements: BTreeSet<Elem>) {
    rs.sets.insert(name.to_string(), Set { kind, elements });
}

/// Builds the rule chain (and its sets) of `policy`'s rule `ri` in `dir`.
fn build_rule_chain(
    rs: &mut Ruleset,
    model: &Model,
    policy: &crate::model::Policy,
    dir: Direction,
    ri: usize,
    local_selected: &[&PodInfo],
) -> String {
    let key = policy.key();
    let name = rule_chain(dir, &key, ri);
    if rs.chains.contains_key(&name) {
        return name;
    }
    let rule = &policy.rules(dir)[ri];
    let peer_field = match dir {
        Direction::Ingress => Field::Saddr,
        Direction::Egress => Field::Daddr,
    };
    // Peer alternatives: None = any peer.
    let mut peer_alts: Vec<Option<(Fam, String)>> = Vec::new();
    if rule.peers.is_empty() {
        peer_alts.push(None);
    } else {
        // Both families' sets exist even when empty, so that pods coming and going are
        // element operations, never rule changes.
        let mut by = peer_ranges(model, &policy.namespace, &rule.peers);
        for f in [Fam::V4, Fam::V6] {
            let ranges = by.remove(&f).unwrap_or_default();
            let set = format!("{name}_p{}", fam_suffix(f));
            let elems = ranges
                .iter()
                .map(|&(a, b)| Elem::Range(from_u128(f, a), from_u128(f, b)))
                .collect();
            add_set(rs, &set, SetKind::AddrInterval(f), elems);
            peer_alts.push(Some((f, set)));
        }
    }
    // Port alternatives: None = any port; Some((None, set)) numeric; Some((Some(f), set)) named.
    let mut port_alts: Vec<Option<(Option<Fam>, String)>> = Vec::new();
    if rule.ports.is_empty() {
        port_alts.push(None);
    } else {
        let nums = numeric_ports(rule);
        if !nums.is_empty() {
            let set = format!("{name}_n");
            add_set(rs, &set, SetKind::ProtoPorts, nums);
            port_alts.push(Some((None, set)));
        }
        let named = match dir {
            // Ingress: the destination is the isolated local pod itself.
            Direction::Ingress => named_ports(rule, local_selected.iter().copied()),
            // Egress: any pod of the cluster may be the destination.
            Direction::Egress => named_ports(rule, model.pods.values().filter(|p| !p.host_network)),
        };
        let has_named = rule
            .ports
            .iter()
            .any(|p| matches!(p.port, PortSel::Named(_)));
        let mut named = named;
        for f in [Fam::V4, Fam::V6] {
            if !has_named {
                break;
            }
            let elems = named.remove(&f).unwrap_or_default();
            let set = format!("{name}_m{}", fam_suffix(f));
            add_set(rs, &set, SetKind::AddrProtoPort(f), elems);
            port_alts.push(Some((Some(f), set)));
        }
    }
    let mut rules = Vec::new();
    for peer in &peer_alts {
        for port in &port_alts {
            if let (Some((pf, _)), Some((Some(nf), _))) = (peer, port)
                && pf != nf
            {
                continue;
            }
            let mut m = Vec::new();
            if let Some((f, set)) = peer {
                m.push(Match::Addr(*f, peer_field, set.clone()));
            }
            match port {
                Some((None, set)) => m.push(Match::ProtoPort(set.clone())),
                Some((Some(f), set)) => m.push(Match::AddrProtoPort(*f, set.clone())),
                None => {}
            }
            let mut r = Rule::new(m, Action::Accept);
            r.counter = true;
            r.comment = Some(format!(
                "allow {} {}[{ri}]",
                key,
                match dir {
                    Direction::Ingress => "ingress",
                    Direction::Egress => "egress",
                }
            ));
            rules.push(r);
        }
    }
    rs.chains.insert(name.clone(), Chain { hook: None, rules });
    name
}

/// The table for `node`: rules for the pods scheduled there.
pub fn render(model: &Model, node: &str, opts: &RenderOptions) -> Ruleset {
    let mut rs = Ruleset {
        table: TABLE.to_string(),
        ..Default::default()
    };
    // The node's own addresses (and its host-network pods').
    let mut node_ips: BTreeSet<IpAddr> = model
        .nodes
        .get(node)
        .map(|v| v.iter().copied().collect())
        .unwrap_or_default();
    for p in model.pods.values() {
        if p.host_network && p.node.as_deref() == Some(node) {
            node_ips.extend(p.ips.iter().copied());
        }
    }
    let mut vmaps: BTreeMap<(Direction, Fam), BTreeSet<Elem>> = BTreeMap::new();
    let local: Vec<(&PodKey, &PodInfo)> = model
        .pods
        .iter()
        .filter(|(_, p)| !p.host_network && !p.ips.is_empty() && p.node.as_deref() == Some(node))
        .collect();
    for dir in [Direction::Egress, Direction::Ingress] {
        for (key, pod) in &local {
            let isolating = verdict::isolating(model, key, pod, dir);
            if isolating.is_empty() {
                continue;
            }
            let chain = pod_chain(dir, key);
            let mut rules = Vec::new();
            for pk in &isolating {
                let Some(pol) = model.policies.get(pk) else {
                    continue;
                };
                let selected: Vec<&PodInfo> = local
                    .iter()
                    .filter(|(k, p)| pol.selects(k, p))
                    .map(|(_, p)| *p)
                    .collect();
                for ri in 0..pol.rules(dir).len() {
                    let rc = build_rule_chain(&mut rs, model, pol, dir, ri, &selected);
                    rules.push(Rule::new(Vec::new(), Action::Jump(rc)));
                }
            }
            let what = format!(
                "deny {} {key}",
                match dir {
                    Direction::Ingress => "ingress",
                    Direction::Egress => "egress",
                }
            );
            if let Some(group) = opts.log_group {
                let mut log = Rule::new(Vec::new(), Action::Continue);
                log.log = Some(LogSpec {
                    prefix: format!("ferry-netpol {what} "),
                    group,
                    per_second: opts.log_rate,
                });
                rules.push(log);
            }
            let mut deny = Rule::new(
                Vec::new(),
                if opts.reject {
                    Action::Reject
                } else {
                    Action::Drop
                },
            );
            deny.counter = true;
            deny.comment = Some(what);
            rules.push(deny);
            rs.chains.insert(chain.clone(), Chain { hook: None, rules });
            for ip in &pod.ips {
                vmaps
                    .entry((dir, Fam::of(ip)))
                    .or_default()
                    .insert(Elem::Jump(*ip, chain.clone()));
            }
        }
    }
    for f in [Fam::V4, Fam::V6] {
        let node_set = format!("node{}", fam_suffix(f));
        add_set(
            &mut rs,
            &node_set,
            SetKind::Addr(f),
            node_ips
                .iter()
                .filter(|ip| Fam::of(ip) == f)
                .map(|ip| Elem::Addr(*ip))
                .collect(),
        );
        for dir in [Direction::Egress, Direction::Ingress] {
            let map = format!(
                "{}{}",
                match dir {
                    Direction::Egress => "egress",
                    Direction::Ingress => "ingress",
                },
                fam_suffix(f)
            );
            add_set(
                &mut rs,
                &map,
                SetKind::Vmap(f),
                vmaps.remove(&(dir, f)).unwrap_or_default(),
            );
        }
    }
    let base = |dir: Direction| {
        let (node_field, pod_field, prefix) = match dir {
            Direction::Egress => (Field::Daddr, Field::Saddr, "egress"),
            Direction::Ingress => (Field::Saddr, Field::Daddr, "ingress"),
        };
        let mut rules = vec![Rule::new(vec![Match::Established], Action::Accept)];
        for f in [Fam::V4, Fam::V6] {
            rules.push(Rule::new(
                vec![Match::Addr(f, node_field, format!("node{}", fam_suffix(f)))],
                Action::Accept,
            ));
        }
        for f in [Fam::V4, Fam::V6] {
            rules.push(Rule::new(
                Vec::new(),
                Action::Vmap(f, pod_field, format!("{prefix}{}", fam_suffix(f))),
            ));
        }
        rules
    };
    rs.chains.insert(
        EGRESS_CHAIN.into(),
        Chain {
            hook: hook(0),
            rules: base(Direction::Egress),
        },
    );
    rs.chains.insert(
        INGRESS_CHAIN.into(),
        Chain {
            hook: hook(1),
            rules: base(Direction::Ingress),
        },
    );
    rs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_subtract() {
        assert_eq!(
            merge(vec![(5, 9), (1, 3), (4, 4), (20, 30), (25, 26)]),
            vec![(1, 9), (20, 30)]
        );
        assert_eq!(
            subtract(&[(0, 100)], &[(10, 19), (50, 100)]),
            vec![(0, 9), (20, 49)]
        );
        assert_eq!(subtract(&[(0, 100)], &[(0, 100)]), vec![]);
        assert_eq!(subtract(&[(10, 20)], &[(0, 5), (30, 40)]), vec![(10, 20)]);
        assert_eq!(
            merge(vec![(u128::MAX - 1, u128::MAX), (0, 0)]),
            vec![(0, 0), (u128::MAX - 1, u128::MAX)]
        );
    }

    #[test]
    fn identifiers_are_safe_and_bounded() {
        let k = PodKey::new("ns", "web-1.x");
        assert_eq!(pod_chain(Direction::Ingress, &k), "i_ns_web-1.x");
        let long = PodKey::new("ns", "a".repeat(200));
        let c = pod_chain(Direction::Egress, &long);
        assert!(c.starts_with("e_h") && c.len() < 40);
        assert_eq!(c, pod_chain(Direction::Egress, &long));
    }
}
