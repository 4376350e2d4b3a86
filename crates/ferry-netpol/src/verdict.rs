//! The one verdict function: (model, source, destination, protocol, port) → allowed or denied,
//! with the explanation. Semantics, as the Kubernetes API documents them and the reference
//! implementation (kube-network-policies) evaluates them:
//!
//! - A connection needs both the source's egress and the destination's ingress to allow it.
//! - A pod is isolated in a direction when at least one policy of its namespace selects it and
//!   has that direction in its `policyTypes`; otherwise everything passes in that direction.
//! - An isolated pod accepts what at least one rule of one selecting policy allows (the union).
//!   A rule matches when one of its peers matches (no peers: any) and one of its ports matches
//!   (no ports: any).
//! - `podSelector` alone selects pods in the policy's namespace; `namespaceSelector` alone every
//!   pod of the matching namespaces; both together the matching pods in the matching namespaces.
//! - `ipBlock` matches addresses, pod addresses included (the common CNI behaviour, e.g. Calico
//!   and kube-network-policies, and what upstream's e2e "except" tests rely on); `except`
//!   carves out of `cidr`.
//! - A named port matches a container port of the *destination* pod with that name, the same
//!   number and the same protocol (ingress: the isolated pod; egress: the pod connected to).
//!   Non-pod destinations never match named ports.
//! - Exceptions that no policy can remove: a pod reaching itself, and traffic between a pod and
//!   its own node (kubelet probes, host-network pods of that node).
//! - Host-network pods are never selected by a policy, and as peers they count as their
//!   address (selectors do not match them; an ipBlock may).

use std::fmt;
use std::net::IpAddr;

use crate::model::{Direction, Model, Peer, PodInfo, PodKey, PolicyKey, PortSel, Proto};

/// One side of a connection: a pod, an address, or a pod with the address it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub pod: Option<PodKey>,
    pub ip: Option<IpAddr>,
}

impl Endpoint {
    pub fn pod(key: PodKey) -> Endpoint {
        Endpoint {
            pod: Some(key),
            ip: None,
        }
    }
    pub fn ip(ip: IpAddr) -> Endpoint {
        Endpoint {
            pod: None,
            ip: Some(ip),
        }
    }
    /// The endpoint the kernel sees for `ip`: the pod that owns it, if any.
    pub fn at(model: &Model, ip: IpAddr) -> Endpoint {
        Endpoint {
            pod: model.pod_by_ip(ip).cloned(),
            ip: Some(ip),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.pod, self.ip) {
            (Some(p), Some(ip)) => write!(f, "{p} ({ip})"),
            (Some(p), None) => write!(f, "{p}"),
            (None, Some(ip)) => write!(f, "{ip}"),
            (None, None) => f.write_str("?"),
        }
    }
}

/// A connection attempt (the first packet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conn {
    pub src: Endpoint,
    pub dst: Endpoint,
    pub proto: Proto,
    pub port: u16,
}

/// Which rule allowed a direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    pub policy: PolicyKey,
    pub direction: Direction,
    pub rule: usize,
    /// The matching peer (None: the rule has no peers, so every peer matches).
    pub peer: Option<usize>,
    /// The matching port (None: the rule has no ports).
    pub port: Option<usize>,
}

/// Why traffic passes without looking at rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exemption {
    /// A pod cannot block access to itself.
    SamePod,
    /// Traffic to and from the pod's own node is always allowed.
    OwnNode,
}

/// The outcome of one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This side is not a pod (or a host-network pod): policies do not apply here.
    NotAPod,
    /// No policy selects the pod for this direction.
    NotIsolated,
    Exempt(Exemption),
    Allowed(RuleRef),
    Denied,
}

impl Outcome {
    pub fn allows(&self) -> bool {
        !matches!(self, Outcome::Denied)
    }
}

/// One direction's explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// Policies selecting the pod with this direction in their `policyTypes`.
    pub isolated_by: Vec<PolicyKey>,
    pub outcome: Outcome,
}

/// The verdict with its explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// The source pod's egress.
    pub egress: Side,
    /// The destination pod's ingress.
    pub ingress: Side,
    /// The addresses the evaluation used (a pod's address of the connection's family).
    pub src_ip: Option<IpAddr>,
    pub dst_ip: Option<IpAddr>,
}

/// A pod that policies apply to (known, not host-network).
fn policy_pod<'a>(model: &'a Model, e: &Endpoint) -> Option<(&'a PodKey, &'a PodInfo)> {
    let key = e.pod.as_ref()?;
    let (k, p) = model.pods.get_key_value(key)?;
    (!p.host_network).then_some((k, p))
}

/// The addresses of both sides: explicit ones win; a pod uses its first address of a family
/// both sides have (or its first address).
fn addresses(model: &Model, c: &Conn) -> (Option<IpAddr>, Option<IpAddr>) {
    let ips = |e: &Endpoint| -> Vec<IpAddr> {
        match e.ip {
            Some(ip) => vec![ip],
            None => e
                .pod
                .as_ref()
                .and_then(|k| model.pods.get(k))
                .map(|p| p.ips.clone())
                .unwrap_or_default(),
        }
    };
    let (s, d) = (ips(&c.src), ips(&c.dst));
    for a in &s {
        if let Some(b) = d.iter().find(|b| b.is_ipv4() == a.is_ipv4()) {
            return (Some(*a), Some(*b));
        }
    }
    (s.first().copied(), d.first().copied())
}

fn in_block(ip: Option<IpAddr>, cidr: &ipnet::IpNet, except: &[ipnet::IpNet]) -> bool {
    match ip {
        Some(ip) => cidr.contains(&ip) && !except.iter().any(|e| e.contains(&ip)),
        None => false,
    }
}

/// Whether `peer` (of a policy in `policy_ns`) matches the other side of the connection.
pub fn peer_matches(
    model: &Model,
    policy_ns: &str,
    peer: &Peer,
    other: &Endpoint,
    other_ip: Option<IpAddr>,
) -> bool {
    match peer {
        Peer::IpBlock { cidr, except } => in_block(other_ip, cidr, except),
        Peer::Pods { pods, namespaces } => {
            let Some((key, pod)) = policy_pod(model, other) else {
                return false;
            };
            let ns_ok = match namespaces {
                Some(sel) => sel.matches(&model.namespace_labels(&key.namespace)),
                None => {
                    if pods.is_none() {
                        return false;
                    }
                    key.namespace == policy_ns
                }
            };
            ns_ok && pods.as_ref().is_none_or(|sel| sel.matches(&pod.labels))
        }
    }
}

/// Whether a port entry matches, named ports resolved against `dst_pod`.
pub fn port_matches(
    sel: &PortSel,
    want: Proto,
    proto: Proto,
    port: u16,
    dst_pod: Option<&PodInfo>,
) -> bool {
    if want != proto {
        return false;
    }
    match sel {
        PortSel::Any => true,
        PortSel::Range(a, b) => *a <= port && port <= *b,
        PortSel::Named(n) => dst_pod.is_some_and(|p| {
            p.ports
                .iter()
                .any(|np| &np.name == n && np.port == port && np.proto == proto)
        }),
    }
}

/// Policies isolating `pod` in `dir`, in key order.
pub fn isolating(model: &Model, key: &PodKey, pod: &PodInfo, dir: Direction) -> Vec<PolicyKey> {
    model
        .policies
        .values()
        .filter(|p| p.isolates(dir) && p.selects(key, pod))
        .map(|p| p.key())
        .collect()
}

fn own_node(model: &Model, pod: &PodInfo, other: &Endpoint, other_ip: Option<IpAddr>) -> bool {
    let Some(node) = pod.node.as_deref() else {
        return false;
    };
    if let Some(ip) = other_ip
        && model.nodes.get(node).is_some_and(|ips| ips.contains(&ip))
    {
        return true;
    }
    // A host-network pod of the same node is the node.
    other
        .pod
        .as_ref()
        .and_then(|k| model.pods.get(k))
        .is_some_and(|o| o.host_network && o.node.as_deref() == Some(node))
}

/// Evaluates one direction for the pod `me`, the other side being `other`.
fn side(
    model: &Model,
    dir: Direction,
    me: &Endpoint,
    other: &Endpoint,
    other_ip: Option<IpAddr>,
    c: &Conn,
    dst_pod: Option<&PodInfo>,
) -> Side {
    let Some((key, pod)) = policy_pod(model, me) else {
        return Side {
            isolated_by: Vec::new(),
            outcome: Outcome::NotAPod,
        };
    };
    let isolated_by = isolating(model, key, pod, dir);
    let outcome = if isolated_by.is_empty() {
        Outcome::NotIsolated
    } else if other.pod.as_ref() == Some(key) {
        Outcome::Exempt(Exemption::SamePod)
    } else if own_node(model, pod, other, other_ip) {
        Outcome::Exempt(Exemption::OwnNode)
    } else {
        find_rule(model, dir, &isolated_by, other, other_ip, c, dst_pod)
            .map(Outcome::Allowed)
            .unwrap_or(Outcome::Denied)
    };
    Side {
        isolated_by,
        outcome,
    }
}

fn find_rule(
    model: &Model,
    dir: Direction,
    policies: &[PolicyKey],
    other: &Endpoint,
    other_ip: Option<IpAddr>,
    c: &Conn,
    dst_pod: Option<&PodInfo>,
) -> Option<RuleRef> {
    for pk in policies {
        let Some(pol) = model.policies.get(pk) else {
            continue;
        };
        for (ri, rule) in pol.rules(dir).iter().enumerate() {
            let port = if rule.ports.is_empty() {
                Some(None)
            } else {
                rule.ports
                    .iter()
                    .position(|p| port_matches(&p.port, p.proto, c.proto, c.port, dst_pod))
                    .map(Some)
            };
            let Some(port) = port else { continue };
            let peer = if rule.peers.is_empty() {
                Some(None)
            } else {
                rule.peers
                    .iter()
                    .position(|p| peer_matches(model, &pol.namespace, p, other, other_ip))
                    .map(Some)
            };
            let Some(peer) = peer else { continue };
            return Some(RuleRef {
                policy: pk.clone(),
                direction: dir,
                rule: ri,
                peer,
                port,
            });
        }
    }
    None
}

/// The verdict for one connection.
pub fn evaluate(model: &Model, c: &Conn) -> Verdict {
    let (src_ip, dst_ip) = addresses(model, c);
    let dst_pod = policy_pod(model, &c.dst).map(|(_, p)| p);
    let egress = side(model, Direction::Egress, &c.src, &c.dst, dst_ip, c, dst_pod);
    let ingress = side(
        model,
        Direction::Ingress,
        &c.dst,
        &c.src,
        src_ip,
        c,
        dst_pod,
    );
    Verdict {
        allowed: egress.outcome.allows() && ingress.outcome.allows(),
        egress,
        ingress,
        src_ip,
        dst_ip,
    }
}

/// Shorthand: the verdict between two addresses (as the kernel sees a packet).
pub fn evaluate_ips(model: &Model, src: IpAddr, dst: IpAddr, proto: Proto, port: u16) -> Verdict {
    evaluate(
        model,
        &Conn {
            src: Endpoint::at(model, src),
            dst: Endpoint::at(model, dst),
            proto,
            port,
        },
    )
}

/// A human explanation of a verdict, one line per fact.
pub fn explain(model: &Model, c: &Conn, v: &Verdict) -> Vec<String> {
    let mut out = Vec::new();
    let side_text = |dir: Direction, who: &Endpoint, s: &Side, out: &mut Vec<String>| {
        let label = match dir {
            Direction::Egress => "egress of the source",
            Direction::Ingress => "ingress of the destination",
        };
        let sel: Vec<String> = s.isolated_by.iter().map(|k| k.to_string()).collect();
        let text = match &s.outcome {
            Outcome::NotAPod => format!("{label} {who}: not a pod, no policy applies: allowed"),
            Outcome::NotIsolated => {
                format!(
                    "{label} {who}: no policy with {} selects it, not isolated: allowed",
                    dir.as_str()
                )
            }
            Outcome::Exempt(Exemption::SamePod) => {
                format!(
                    "{label} {who}: isolated by {}, but a pod always reaches itself: allowed",
                    sel.join(", ")
                )
            }
            Outcome::Exempt(Exemption::OwnNode) => format!(
                "{label} {who}: isolated by {}, but traffic with the pod's own node always passes: allowed",
                sel.join(", ")
            ),
            Outcome::Allowed(r) => {
                let pol = model.policies.get(&r.policy);
                let rule = pol.and_then(|p| p.rules(dir).get(r.rule));
                let field = match dir {
                    Direction::Ingress => "ingress",
                    Direction::Egress => "egress",
                };
                let peer = match (r.peer, rule) {
                    (Some(i), Some(rule)) => rule
                        .peers
                        .get(i)
                        .map(|p| format!("peer [{i}] {p}"))
                        .unwrap_or_default(),
                    _ => "any peer".to_string(),
                };
                let port = match (r.port, rule) {
                    (Some(i), Some(rule)) => rule
                        .ports
                        .get(i)
                        .map(|p| format!("port [{i}] {p}"))
                        .unwrap_or_default(),
                    _ => "any port".to_string(),
                };
                format!(
                    "{label} {who}: isolated by {}; allowed by {} {field}[{}] ({peer}, {port})",
                    sel.join(", "),
                    r.policy,
                    r.rule
                )
            }
            Outcome::Denied => format!(
                "{label} {who}: isolated by {}; no rule allows {}/{}: denied",
                sel.join(", "),
                c.port,
                c.proto
            ),
        };
        out.push(text);
    };
    let src = Endpoint {
        pod: c.src.pod.clone(),
        ip: v.src_ip,
    };
    let dst = Endpoint {
        pod: c.dst.pod.clone(),
        ip: v.dst_ip,
    };
    side_text(Direction::Egress, &src, &v.egress, &mut out);
    side_text(Direction::Ingress, &dst, &v.ingress, &mut out);
    out.push(format!(
        "verdict: {} → {} {}/{}: {}",
        src,
        dst,
        c.port,
        c.proto,
        if v.allowed { "ALLOWED" } else { "DENIED" }
    ));
    out
}
