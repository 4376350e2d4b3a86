//! A packet tracer over the rendered nftables model: which hooks, chains, rules and map
//! elements a first packet meets, which endpoints it may be sent to (with their
//! probabilities), and whether it is masqueraded. Pure: no packet is sent.
//!
//! A source address that is local (a node IP or loopback) traverses the output hooks, any
//! other the prerouting hooks; the filter hooks see the packet as upstream's do (output's
//! `ct state new` checks run before the output DNAT; forward and input after prerouting DNAT).
//! An affinity set is taken as not yet holding the client (the first packet of a client).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use super::nft::{Fam, Hook, Key, MASQ_MARK, Rule, Ruleset, Value, Verdict};
use crate::model::Proto;

/// The packet to trace.
#[derive(Debug, Clone)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

/// Where a packet ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Sent to this endpoint with this probability; `masquerade`: its source is rewritten.
    Endpoint {
        to: SocketAddr,
        probability: f64,
        masquerade: bool,
        hairpin: bool,
    },
    /// Rejected (TCP reset for TCP, ICMP port unreachable otherwise).
    Reject { tcp_reset: bool },
    /// Dropped.
    Drop,
    /// Not a Service address: passed unchanged.
    NotAService,
}

/// The trace: the steps in order and the outcomes.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub steps: Vec<String>,
    pub outcomes: Vec<Outcome>,
}

impl std::fmt::Display for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for s in &self.steps {
            writeln!(f, "{s}")?;
        }
        for o in &self.outcomes {
            match o {
                Outcome::Endpoint {
                    to,
                    probability,
                    masquerade,
                    hairpin,
                } => {
                    let mut extra = String::new();
                    if *masquerade {
                        extra.push_str(", masqueraded");
                    }
                    if *hairpin {
                        extra.push_str(" (hairpin)");
                    }
                    writeln!(
                        f,
                        "=> DNAT to {to} with probability {probability:.4}{extra}"
                    )?;
                }
                Outcome::Reject { tcp_reset: true } => writeln!(f, "=> REJECT with TCP reset")?,
                Outcome::Reject { tcp_reset: false } => {
                    writeln!(f, "=> REJECT with ICMP port unreachable")?
                }
                Outcome::Drop => writeln!(f, "=> DROP")?,
                Outcome::NotAService => writeln!(f, "=> not a Service address: passed unchanged")?,
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Pkt {
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    proto: Proto,
    mark: u32,
}

#[derive(Debug, Clone)]
enum End {
    /// Fell off the end of the chain, or `return`.
    Continue(Pkt),
    Dnat(Pkt, SocketAddr),
    Drop,
    Reject(bool),
}

struct Tracer<'a> {
    rs: &'a Ruleset,
    local: &'a BTreeSet<IpAddr>,
    depth: usize,
}

fn fam_matches(fam: Fam, ip: &IpAddr) -> bool {
    Fam::of(ip) == fam
}

impl Tracer<'_> {
    fn is_local(&self, ip: &IpAddr) -> bool {
        ip.is_loopback() || self.local.contains(ip)
    }

    fn lookup(&self, map: &str, key: &Key) -> Option<&Value> {
        self.rs.sets.get(map).and_then(|s| s.elements.get(key))
    }

    /// Runs a chain; returns each possible end with its probability.
    fn chain(&mut self, name: &str, p: Pkt, prob: f64, steps: &mut Vec<String>) -> Vec<(End, f64)> {
        self.depth += 1;
        let out = self.chain_inner(name, p, prob, steps);
        self.depth -= 1;
        out
    }

    fn verdict(
        &mut self,
        v: &Verdict,
        p: Pkt,
        prob: f64,
        steps: &mut Vec<String>,
    ) -> Vec<(End, f64)> {
        match v {
            Verdict::Drop => vec![(End::Drop, prob)],
            Verdict::Goto(c) => self.chain(c, p, prob, steps),
        }
    }

    fn chain_inner(
        &mut self,
        name: &str,
        mut p: Pkt,
        prob: f64,
        steps: &mut Vec<String>,
    ) -> Vec<(End, f64)> {
        let ind = "  ".repeat(self.depth);
        let Some(chain) = self.rs.chains.get(name) else {
            steps.push(format!("{ind}chain {name}: missing"));
            return vec![(End::Continue(p), prob)];
        };
        if self.depth > 32 {
            return vec![(End::Drop, prob)];
        }
        steps.push(format!("{ind}chain {name}"));
        let mark = MASQ_MARK;
        for r in &chain.rules {
            let text = r.render();
            let hit = |steps: &mut Vec<String>, what: &str| {
                steps.push(format!("{ind}  {text}    # {what}"));
            };
            match r {
                Rule::Jump(c) | Rule::CtNewJump(c) => {
                    hit(steps, "jump");
                    let ends = self.chain(c, p.clone(), prob, steps);
                    let mut rest = Vec::new();
                    let mut cont = None;
                    for (e, pr) in ends {
                        match e {
                            End::Continue(q) => cont = Some(q),
                            other => rest.push((other, pr)),
                        }
                    }
                    match cont {
                        Some(q) if rest.is_empty() => p = q,
                        Some(_) | None => return rest,
                    }
                }
                Rule::Goto(c) => {
                    hit(steps, "goto");
                    return self.chain(c, p, prob, steps);
                }
                Rule::FrontendVmap { fam, map } => {
                    if !fam_matches(*fam, &p.dst) {
                        continue;
                    }
                    let key = Key::Frontend(p.dst, p.proto, p.port);
                    if let Some(Value::Verdict(v)) = self.lookup(map, &key) {
                        hit(steps, &format!("element {key} : {v}"));
                        return self.verdict(&v.clone(), p, prob, steps);
                    }
                }
                Rule::NodePortVmap { fam, map, addrs } => {
                    if !fam_matches(*fam, &p.dst) {
                        continue;
                    }
                    let addr_ok = match addrs {
                        Some(set) => self.lookup(set, &Key::Addr(p.dst)).is_some(),
                        None => self.is_local(&p.dst) && !p.dst.is_loopback(),
                    };
                    if !addr_ok {
                        continue;
                    }
                    let key = Key::Port(p.proto, p.port);
                    if let Some(Value::Verdict(v)) = self.lookup(map, &key) {
                        hit(steps, &format!("element {key} : {v}"));
                        return self.verdict(&v.clone(), p, prob, steps);
                    }
                }
                Rule::MasqUnlessFrom { fam, cidrs } => {
                    if fam_matches(*fam, &p.src) && !cidrs.iter().any(|c| c.contains(&p.src)) {
                        hit(
                            steps,
                            "marked for masquerade (source outside the pod network)",
                        );
                        p.mark |= mark;
                    }
                }
                Rule::MarkMasq => {
                    hit(steps, "marked for masquerade");
                    p.mark |= mark;
                }
                Rule::MarkMasqIfLocalSource => {
                    if self.is_local(&p.src) {
                        hit(steps, "marked for masquerade (local source)");
                        p.mark |= mark;
                    }
                }
                Rule::GotoIfFrom { fam, cidrs, chain } => {
                    if fam_matches(*fam, &p.src) && cidrs.iter().any(|c| c.contains(&p.src)) {
                        hit(steps, "pod source");
                        return self.chain(chain, p, prob, steps);
                    }
                }
                Rule::GotoIfLocalSource(c) => {
                    if self.is_local(&p.src) {
                        hit(steps, "local source");
                        return self.chain(c, p, prob, steps);
                    }
                }
                Rule::DnatMap {
                    fam,
                    map,
                    by_addr,
                    k,
                } => {
                    if !fam_matches(*fam, &p.dst) {
                        continue;
                    }
                    hit(steps, &format!("numgen picks 0..{k} uniformly"));
                    let mut out = Vec::new();
                    for i in 0..*k {
                        let key = if *by_addr {
                            Key::FrontendIdx(p.dst, p.proto, p.port, i)
                        } else {
                            Key::PortIdx(p.proto, p.port, i)
                        };
                        let pr = prob / f64::from(*k);
                        match self.lookup(map, &key) {
                            Some(Value::Endpoint(e)) => {
                                steps.push(format!(
                                    "{ind}    @{map} {key} : {} . {}",
                                    e.ip(),
                                    e.port()
                                ));
                                out.push((End::Dnat(p.clone(), *e), pr));
                            }
                            _ => {
                                steps.push(format!("{ind}    @{map} {key} : no element (dropped)"));
                                out.push((End::Drop, pr));
                            }
                        }
                    }
                    return out;
                }
                Rule::Dnat { proto, to } => {
                    if *proto == p.proto && fam_matches(Fam::of(&to.ip()), &p.dst) {
                        hit(steps, "DNAT");
                        return vec![(End::Dnat(p, *to), prob)];
                    }
                }
                Rule::AffinityCheck { .. } => {
                    // The first packet of a client: not in the set yet.
                }
                Rule::AffinityUpdate { fam: _, set } => {
                    hit(steps, &format!("the client is remembered in @{set}"));
                }
                Rule::NumgenVmap(chains) => {
                    hit(steps, "numgen picks uniformly");
                    let k = chains.len().max(1) as f64;
                    let mut out = Vec::new();
                    for c in chains {
                        out.extend(self.chain(c, p.clone(), prob / k, steps));
                    }
                    return out;
                }
                Rule::RejectTcpReset => {
                    if p.proto == Proto::Tcp {
                        hit(steps, "reject");
                        return vec![(End::Reject(true), prob)];
                    }
                }
                Rule::Reject => {
                    hit(steps, "reject");
                    return vec![(End::Reject(false), prob)];
                }
                Rule::Drop => {
                    hit(steps, "drop");
                    return vec![(End::Drop, prob)];
                }
                // Postrouting rules are evaluated in `trace` itself.
                Rule::HairpinMasq { .. }
                | Rule::ReturnUnmarked
                | Rule::ClearMark
                | Rule::Masquerade => {}
            }
        }
        vec![(End::Continue(p), prob)]
    }

    fn hook_chains(&self, hook: Hook) -> Vec<String> {
        self.rs
            .chains
            .iter()
            .filter(|(_, c)| c.hook == Some(hook))
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// Traces the first packet of a connection. `local` holds the node's own addresses.
pub fn trace(rs: &Ruleset, pkt: &Packet, local: &BTreeSet<IpAddr>) -> Trace {
    let mut t = Tracer {
        rs,
        local,
        depth: 0,
    };
    let mut steps = Vec::new();
    let p = Pkt {
        src: pkt.src,
        dst: pkt.dst,
        port: pkt.port,
        proto: pkt.proto,
        mark: 0,
    };
    let from_local = t.is_local(&pkt.src);
    // Filter check before DNAT: output (local clients); prerouting traffic is checked in
    // forward/input, which see the packet after DNAT — a packet that was not DNATed is still
    // addressed to the Service there, so checking it first is equivalent.
    let (filter_hook, nat_hook) = if from_local {
        (Hook::FilterOutput, Hook::NatOutput)
    } else if t.is_local(&pkt.dst) {
        (Hook::FilterInput, Hook::NatPrerouting)
    } else {
        (Hook::FilterForward, Hook::NatPrerouting)
    };
    let mut outcomes = Vec::new();
    steps.push(format!(
        "packet {} -> {}/{} ({} hooks)",
        pkt.src,
        SocketAddr::new(pkt.dst, pkt.port),
        pkt.proto,
        if from_local { "output" } else { "prerouting" }
    ));
    // NAT first: a DNATed packet no longer matches the no-endpoint maps.
    let mut nat_ends = vec![(End::Continue(p.clone()), 1.0)];
    for c in t.hook_chains(nat_hook) {
        steps.push(format!("hook {nat_hook:?}:"));
        nat_ends = t.chain(&c, p.clone(), 1.0, &mut steps);
    }
    let not_nated = nat_ends.iter().all(|(e, _)| matches!(e, End::Continue(_)));
    if not_nated {
        for c in t.hook_chains(filter_hook) {
            steps.push(format!("hook {filter_hook:?} (ct state new):"));
            let ends = t.chain(&c, p.clone(), 1.0, &mut steps);
            for (e, _) in ends {
                match e {
                    End::Drop => outcomes.push(Outcome::Drop),
                    End::Reject(tcp) => outcomes.push(Outcome::Reject { tcp_reset: tcp }),
                    _ => {}
                }
            }
        }
        if outcomes.is_empty() {
            outcomes.push(Outcome::NotAService);
        }
        return Trace { steps, outcomes };
    }
    // Postrouting: hairpin pairs and the mark decide masquerade.
    for (e, pr) in nat_ends {
        match e {
            End::Dnat(q, to) => {
                let hairpin_set = super::nft::hairpin_set(Fam::of(&to.ip()));
                let hairpin = t
                    .lookup(&hairpin_set, &Key::AddrPair(q.src, to.ip()))
                    .is_some();
                outcomes.push(Outcome::Endpoint {
                    to,
                    probability: pr,
                    masquerade: hairpin || q.mark & MASQ_MARK != 0,
                    hairpin,
                });
            }
            End::Drop => outcomes.push(Outcome::Drop),
            End::Reject(tcp) => outcomes.push(Outcome::Reject { tcp_reset: tcp }),
            End::Continue(_) => outcomes.push(Outcome::NotAService),
        }
    }
    // Merge equal endpoints (several indexes may point at the same one).
    let mut merged: Vec<Outcome> = Vec::new();
    for o in outcomes {
        if let Outcome::Endpoint {
            to,
            probability,
            masquerade,
            hairpin,
        } = &o
            && let Some(Outcome::Endpoint {
                probability: p2, ..
            }) = merged.iter_mut().find(|m| {
                matches!(m, Outcome::Endpoint { to: t2, masquerade: m2, hairpin: h2, .. }
                    if t2 == to && m2 == masquerade && h2 == hairpin)
            })
        {
            *p2 += probability;
            continue;
        }
        merged.push(o);
    }
    let mut s = String::new();
    let _ = write!(s, "{} outcome(s)", merged.len());
    steps.push(s);
    Trace {
        steps,
        outcomes: merged,
    }
}

/// Parses `IP:PORT/PROTO` (`[v6]:PORT/PROTO`; the protocol defaults to TCP).
pub fn parse_target(s: &str) -> Result<(IpAddr, u16, Proto), crate::ArgError> {
    let (addr, proto) = match s.rsplit_once('/') {
        Some((a, p)) => (
            a,
            Proto::parse(Some(&p.to_ascii_uppercase()))
                .ok_or_else(|| crate::ArgError::Protocol(p.to_string()))?,
        ),
        None => (s, Proto::Tcp),
    };
    let sa: SocketAddr = addr
        .parse()
        .map_err(|_| crate::ArgError::Target(addr.to_string()))?;
    Ok((sa.ip(), sa.port(), proto))
}
