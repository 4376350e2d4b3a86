//! The slim model the verdict function and the renderer work on: namespaces with their labels,
//! pods with labels, addresses and named container ports, nodes with their addresses, and
//! NetworkPolicies with their selectors already parsed. Projections from the API types live
//! here too; they apply upstream's defaults (`policyTypes`, protocol TCP) so that the rest of
//! the crate never looks at optional fields.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use ferry_api::selectors::labels::{LabelSelector, from_label_selector};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1 as net;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::slim::{SlimNamespace, SlimNode, SlimPod};

/// `kubernetes.io/metadata.name`: the label every namespace carries with its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

pub type Labels = BTreeMap<String, String>;

/// A pod's labels, shared: the pods of one ReplicaSet, Job or StatefulSet carry the same label
/// set, so the agent keeps one copy per distinct set ([`Interner`]). Reads deref to [`Labels`];
/// a write copies the set first when it is shared.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct SharedLabels(pub Arc<Labels>);

impl Deref for SharedLabels {
    type Target = Labels;
    fn deref(&self) -> &Labels {
        &self.0
    }
}

impl DerefMut for SharedLabels {
    fn deref_mut(&mut self) -> &mut Labels {
        Arc::make_mut(&mut self.0)
    }
}

impl From<Labels> for SharedLabels {
    fn from(l: Labels) -> Self {
        SharedLabels(Arc::new(l))
    }
}

impl<const N: usize> From<[(String, String); N]> for SharedLabels {
    fn from(pairs: [(String, String); N]) -> Self {
        SharedLabels(Arc::new(pairs.into()))
    }
}

impl fmt::Debug for SharedLabels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One shared copy of each distinct pod label set and node name. Entries nobody else holds any
/// more are dropped when the table has doubled since the last sweep, so it holds at most about
/// twice the live distinct values (plus a floor of [`Interner::FLOOR`]).
#[derive(Debug, Default)]
pub struct Interner {
    labels: HashSet<Arc<Labels>>,
    nodes: HashSet<Arc<str>>,
    sweep_at: usize,
}

impl Interner {
    /// Below this many entries no sweep runs.
    pub const FLOOR: usize = 1024;

    /// The shared copy of `labels`.
    pub fn labels(&mut self, labels: Labels) -> SharedLabels {
        if let Some(a) = self.labels.get(&labels) {
            return SharedLabels(a.clone());
        }
        self.maybe_sweep();
        let a = Arc::new(labels);
        self.labels.insert(a.clone());
        SharedLabels(a)
    }

    /// The shared copy of a node name.
    pub fn node(&mut self, name: &str) -> Arc<str> {
        if let Some(a) = self.nodes.get(name) {
            return a.clone();
        }
        self.maybe_sweep();
        let a: Arc<str> = Arc::from(name);
        self.nodes.insert(a.clone());
        a
    }

    /// Distinct values held (live or not yet swept).
    pub fn len(&self) -> usize {
        self.labels.len() + self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn maybe_sweep(&mut self) {
        if self.len() < self.sweep_at.max(Self::FLOOR) {
            return;
        }
        self.labels.retain(|a| Arc::strong_count(a) > 1);
        self.nodes.retain(|a| Arc::strong_count(a) > 1);
        self.sweep_at = self.len() * 2;
    }
}

/// (namespace, name) of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> PodKey {
        PodKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// (namespace, name) of a NetworkPolicy.
pub type PolicyKey = PodKey;

/// The L4 protocols a NetworkPolicy can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Tcp, Proto::Udp, Proto::Sctp];

    /// Upstream's spelling (`TCP`); unknown values are `None`.
    pub fn parse(s: &str) -> Option<Proto> {
        match s.to_ascii_uppercase().as_str() {
            "TCP" => Some(Proto::Tcp),
            "UDP" => Some(Proto::Udp),
            "SCTP" => Some(Proto::Sctp),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        }
    }
    /// The nftables keyword (`meta l4proto tcp`).
    pub fn nft(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named container port of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub port: u16,
    pub proto: Proto,
}

/// What a NetworkPolicy needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub labels: SharedLabels,
    /// `status.podIPs` (empty until the pod has an address; empty for finished pods).
    pub ips: Vec<IpAddr>,
    /// `spec.nodeName` (shared: many pods name the same node).
    pub node: Option<Arc<str>>,
    /// Host-network pods are never selected by policies and count as their node's address.
    pub host_network: bool,
    /// Container ports that have a name.
    pub ports: Vec<NamedPort>,
}

/// A rule's port entry after defaulting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMatch {
    pub proto: Proto,
    pub port: PortSel,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSel {
    /// No `port`: every port of the protocol.
    Any,
    /// `port` (and `endPort`), inclusive.
    Range(u16, u16),
    /// A named port, resolved against the destination pod's container ports.
    Named(String),
}

impl fmt::Display for PortMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.port {
            PortSel::Any => write!(f, "any/{}", self.proto),
            PortSel::Range(a, b) if a == b => write!(f, "{a}/{}", self.proto),
            PortSel::Range(a, b) => write!(f, "{a}-{b}/{}", self.proto),
            PortSel::Named(n) => write!(f, "{n}/{}", self.proto),
        }
    }
}

/// One `from`/`to` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// `podSelector` and/or `namespaceSelector`. With only `pods`, the policy's own namespace.
    Pods {
        pods: Option<LabelSelector>,
        namespaces: Option<LabelSelector>,
    },
    IpBlock {
        cidr: IpNet,
        except: Vec<IpNet>,
    },
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sel = |s: &LabelSelector| {
            if s.is_empty() {
                "{}".to_string()
            } else {
                format!("{{{s}}}")
            }
        };
        match self {
            Peer::Pods { pods, namespaces } => {
                let mut parts = Vec::new();
                if let Some(n) = namespaces {
                    parts.push(format!("namespaceSelector {}", sel(n)));
                }
                if let Some(p) = pods {
                    parts.push(format!("podSelector {}", sel(p)));
                }
                if parts.is_empty() {
                    parts.push("no selector".into());
                }
                f.write_str(&parts.join(" + "))
            }
            Peer::IpBlock { cidr, except } => {
                write!(f, "ipBlock {cidr}")?;
                if !except.is_empty() {
                    let ex: Vec<String> = except.iter().map(|e| e.to_string()).collect();
                    write!(f, " except {}", ex.join(","))?;
                }
                Ok(())
            }
        }
    }
}

/// One ingress or egress rule. Empty `peers` allows every peer; empty `ports` every port.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    pub peers: Vec<Peer>,
    pub ports: Vec<PortMatch>,
}

/// A NetworkPolicy after defaulting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub pod_selector: LabelSelector,
    /// `policyTypes` contains Ingress.
    pub ingress_isolates: bool,
    /// `policyTypes` contains Egress.
    pub egress_isolates: bool,
    pub ingress: Vec<Rule>,
    pub egress: Vec<Rule>,
}

impl Policy {
    pub fn key(&self) -> PolicyKey {
        PodKey::new(self.namespace.clone(), self.name.clone())
    }
    pub fn rules(&self, dir: Direction) -> &[Rule] {
        match dir {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
    pub fn isolates(&self, dir: Direction) -> bool {
        match dir {
            Direction::Ingress => self.ingress_isolates,
            Direction::Egress => self.egress_isolates,
        }
    }
    /// Whether the policy applies to `pod` (same namespace, selector matches, not host network).
    pub fn selects(&self, key: &PodKey, pod: &PodInfo) -> bool {
        !pod.host_network
            && key.namespace == self.namespace
            && self.pod_selector.matches(&pod.labels)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "Ingress",
            Direction::Egress => "Egress",
        }
    }
}

/// Everything the verdict function looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    /// Namespace labels (including `kubernetes.io/metadata.name`).
    pub namespaces: BTreeMap<String, Labels>,
    pub pods: BTreeMap<PodKey, PodInfo>,
    pub policies: BTreeMap<PolicyKey, Policy>,
    /// Node addresses by node name.
    pub nodes: BTreeMap<String, Vec<IpAddr>>,
}

impl Model {
    /// A namespace's labels; a namespace not (yet) seen still carries its name label.
    pub fn namespace_labels(&self, ns: &str) -> Labels {
        match self.namespaces.get(ns) {
            Some(l) => l.clone(),
            None => [(NAMESPACE_NAME_LABEL.to_string(), ns.to_string())]
                .into_iter()
                .collect(),
        }
    }

    /// The pod (not host-network) that owns `ip`, if any.
    pub fn pod_by_ip(&self, ip: IpAddr) -> Option<&PodKey> {
        self.pods
            .iter()
            .find(|(_, p)| !p.host_network && p.ips.contains(&ip))
            .map(|(k, _)| k)
    }

    /// Inserts or replaces a namespace, adding the name label as the API server does.
    pub fn put_namespace(&mut self, name: &str, mut labels: Labels) {
        labels
            .entry(NAMESPACE_NAME_LABEL.to_string())
            .or_insert_with(|| name.to_string());
        self.namespaces.insert(name.to_string(), labels);
    }
}

/// Errors of the projections (the API server validates policies, so these are rare).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProjectError {
    #[error("{0}: invalid selector: {1}")]
    Selector(String, String),
    #[error("{0}: invalid CIDR {1:?}")]
    Cidr(String, String),
    #[error("{0}: invalid port: {1}")]
    Port(String, String),
    #[error("{0}: unknown protocol {1:?}")]
    Protocol(String, String),
    #[error("object without a name")]
    NoName,
}

fn selector(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    at: &str,
) -> Result<LabelSelector, ProjectError> {
    from_label_selector(sel).map_err(|e| ProjectError::Selector(at.to_string(), e.into()))
}

fn cidr(s: &str, at: &str) -> Result<IpNet, ProjectError> {
    let s = s.trim();
    if let Ok(n) = s.parse::<IpNet>() {
        return Ok(n.trunc());
    }
    // A bare address is accepted as a host route, as many CNIs do.
    s.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| ProjectError::Cidr(at.to_string(), s.to_string()))
}

fn peer(p: &net::NetworkPolicyPeer, at: &str) -> Result<Peer, ProjectError> {
    if let Some(b) = &p.ip_block {
        let mut except = Vec::new();
        for (i, e) in b.except.iter().flatten().enumerate() {
            except.push(cidr(e, &format!("{at}.ipBlock.except[{i}]"))?);
        }
        return Ok(Peer::IpBlock {
            cidr: cidr(&b.cidr, &format!("{at}.ipBlock.cidr"))?,
            except,
        });
    }
    Ok(Peer::Pods {
        pods: p
            .pod_selector
            .as_ref()
            .map(|s| selector(s, &format!("{at}.podSelector")))
            .transpose()?,
        namespaces: p
            .namespace_selector
            .as_ref()
            .map(|s| selector(s, &format!("{at}.namespaceSelector")))
            .transpose()?,
    })
}

fn port(p: &net::NetworkPolicyPort, at: &str) -> Result<PortMatch, ProjectError> {
    let proto = match p.protocol.as_deref() {
        None | Some("") => Proto::Tcp,
        Some(s) => Proto::parse(s).ok_or_else(|| ProjectError::Protocol(at.into(), s.into()))?,
    };
    let sel = match &p.port {
        None => PortSel::Any,
        Some(IntOrString::Int(n)) => {
            let start = u16::try_from(*n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| ProjectError::Port(at.into(), n.to_string()))?;
            let end = match p.end_port {
                None => start,
                Some(e) => u16::try_from(e)
                    .ok()
                    .filter(|e| *e >= start)
                    .ok_or_else(|| ProjectError::Port(at.into(), format!("endPort {e}")))?,
            };
            PortSel::Range(start, end)
        }
        Some(IntOrString::String(s)) => match s.parse::<u16>() {
            // A number written as a string is a number (intstr.IntValue semantics).
            Ok(n) if n > 0 => PortSel::Range(
                n,
                p.end_port
                    .and_then(|e| u16::try_from(e).ok())
                    .unwrap_or(n)
                    .max(n),
            ),
            _ => PortSel::Named(s.clone()),
        },
    };
    Ok(PortMatch { proto, port: sel })
}

fn rule(
    peers: Option<&Vec<net::NetworkPolicyPeer>>,
    ports: Option<&Vec<net::NetworkPolicyPort>>,
    at: &str,
    peer_field: &str,
) -> Result<Rule, ProjectError> {
    let mut r = Rule::default();
    for (i, p) in peers.into_iter().flatten().enumerate() {
        r.peers.push(peer(p, &format!("{at}.{peer_field}[{i}]"))?);
    }
    for (i, p) in ports.into_iter().flatten().enumerate() {
        r.ports.push(port(p, &format!("{at}.ports[{i}]"))?);
    }
    Ok(r)
}

/// A NetworkPolicy as the model sees it; `policyTypes` defaults as upstream: Ingress always,
/// Egress when the policy has egress rules.
pub fn project_policy(np: &net::NetworkPolicy) -> Result<Policy, ProjectError> {
    let name = np.metadata.name.clone().ok_or(ProjectError::NoName)?;
    let namespace = np
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let spec = np.spec.clone().unwrap_or_default();
    // Absent (newer API versions make it optional) selects every pod, as `{}` does.
    let pod_selector = match &spec.pod_selector {
        Some(s) => selector(s, "spec.podSelector")?,
        None => LabelSelector::everything(),
    };
    let egress_present = spec.egress.as_ref().is_some_and(|e| !e.is_empty());
    let (ingress_isolates, egress_isolates) = match spec.policy_types.as_deref() {
        Some(types) if !types.is_empty() => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        _ => (true, egress_present),
    };
    let mut ingress = Vec::new();
    for (i, r) in spec.ingress.iter().flatten().enumerate() {
        ingress.push(rule(
            r.from.as_ref(),
            r.ports.as_ref(),
            &format!("spec.ingress[{i}]"),
            "from",
        )?);
    }
    let mut egress = Vec::new();
    for (i, r) in spec.egress.iter().flatten().enumerate() {
        egress.push(rule(
            r.to.as_ref(),
            r.ports.as_ref(),
            &format!("spec.egress[{i}]"),
            "to",
        )?);
    }
    Ok(Policy {
        namespace,
        name,
        pod_selector,
        ingress_isolates,
        egress_isolates,
        ingress,
        egress,
    })
}

/// A pod as the model sees it (finished pods have no addresses: theirs may be reused); label
/// sets and node names come from `interner`.
pub fn project_slim_pod(pod: &SlimPod, interner: &mut Interner) -> Option<(PodKey, PodInfo)> {
    let key = PodKey::new(
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone()?,
    );
    Some((
        key,
        PodInfo {
            labels: interner.labels(pod.labels.clone()),
            ips: if pod.finished {
                Vec::new()
            } else {
                pod.ips.clone()
            },
            node: pod.node_name.as_deref().map(|n| interner.node(n)),
            host_network: pod.host_network,
            ports: pod.ports.clone(),
        },
    ))
}

/// [`project_slim_pod`] of a full Pod.
pub fn project_pod(pod: &Pod) -> Option<(PodKey, PodInfo)> {
    project_slim_pod(&SlimPod::from(pod), &mut Interner::default())
}

/// A namespace's labels, with the name label the API server adds.
pub fn project_slim_namespace(ns: &SlimNamespace) -> Option<(String, Labels)> {
    let name = ns.metadata.name.clone()?;
    let mut labels = ns.labels.clone();
    labels
        .entry(NAMESPACE_NAME_LABEL.to_string())
        .or_insert_with(|| name.clone());
    Some((name, labels))
}

/// [`project_slim_namespace`] of a full Namespace.
pub fn project_namespace(ns: &Namespace) -> Option<(String, Labels)> {
    project_slim_namespace(&SlimNamespace::from(ns))
}

/// A node's addresses (InternalIP/ExternalIP).
pub fn project_slim_node(node: &SlimNode) -> Option<(String, Vec<IpAddr>)> {
    Some((node.metadata.name.clone()?, node.ips.clone()))
}

/// [`project_slim_node`] of a full Node.
pub fn project_node(node: &Node) -> Option<(String, Vec<IpAddr>)> {
    project_slim_node(&SlimNode::from(node))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn np(v: serde_json::Value) -> Policy {
        project_policy(&serde_json::from_value(v).unwrap()).unwrap()
    }

    #[test]
    fn policy_types_default_as_upstream() {
        let p =
            np(json!({"metadata": {"name": "a", "namespace": "x"}, "spec": {"podSelector": {}}}));
        assert!(p.ingress_isolates && !p.egress_isolates);
        let p = np(json!({"metadata": {"name": "a"}, "spec": {"podSelector": {}, "egress": [{}]}}));
        assert!(p.ingress_isolates && p.egress_isolates);
        assert_eq!(p.namespace, "default");
        let p = np(json!({"metadata": {"name": "a"}, "spec": {"podSelector": {}, "egress": []}}));
        assert!(
            !p.egress_isolates,
            "an empty egress list does not add Egress"
        );
        let p = np(
            json!({"metadata": {"name": "a"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]}}),
        );
        assert!(!p.ingress_isolates && p.egress_isolates);
    }

    #[test]
    fn ports_default_and_ranges() {
        let p = np(
            json!({"metadata": {"name": "a"}, "spec": {"podSelector": {}, "ingress": [{"ports": [
                {"port": 80}, {"protocol": "UDP"}, {"port": "http", "protocol": "SCTP"},
                {"port": 32000, "endPort": 32768}, {"port": "81"}
            ]}]}}),
        );
        let ports = &p.ingress[0].ports;
        assert_eq!(
            ports[0],
            PortMatch {
                proto: Proto::Tcp,
                port: PortSel::Range(80, 80)
            }
        );
        assert_eq!(
            ports[1],
            PortMatch {
                proto: Proto::Udp,
                port: PortSel::Any
            }
        );
        assert_eq!(
            ports[2],
            PortMatch {
                proto: Proto::Sctp,
                port: PortSel::Named("http".into())
            }
        );
        assert_eq!(ports[3].port, PortSel::Range(32000, 32768));
        assert_eq!(ports[4].port, PortSel::Range(81, 81));
        let bad: net::NetworkPolicy = serde_json::from_value(json!({"metadata": {"name": "a"}, "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 70000}]}]}})).unwrap();
        assert!(matches!(project_policy(&bad), Err(ProjectError::Port(..))));
    }

    #[test]
    fn peers_and_cidrs() {
        let p = np(
            json!({"metadata": {"name": "a"}, "spec": {"podSelector": {"matchLabels": {"role": "db"}}, "ingress": [{"from": [
                {"ipBlock": {"cidr": "172.17.0.0/16", "except": ["172.17.1.0/24"]}},
                {"namespaceSelector": {"matchLabels": {"project": "myproject"}}},
                {"podSelector": {"matchLabels": {"role": "frontend"}}},
                {"namespaceSelector": {}, "podSelector": {}}
            ]}]}}),
        );
        let peers = &p.ingress[0].peers;
        assert_eq!(peers.len(), 4);
        assert!(
            matches!(&peers[0], Peer::IpBlock { cidr, except } if cidr.to_string() == "172.17.0.0/16" && except.len() == 1)
        );
        assert!(matches!(
            &peers[1],
            Peer::Pods {
                pods: None,
                namespaces: Some(_)
            }
        ));
        assert!(matches!(
            &peers[2],
            Peer::Pods {
                pods: Some(_),
                namespaces: None
            }
        ));
        assert!(
            matches!(&peers[3], Peer::Pods { pods: Some(a), namespaces: Some(b) } if a.is_empty() && b.is_empty())
        );
        assert_eq!(
            peers[0].to_string(),
            "ipBlock 172.17.0.0/16 except 172.17.1.0/24"
        );
    }

    #[test]
    fn pods_project_addresses_and_named_ports() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"pod": "a"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [
                {"name": "serve-80-tcp", "containerPort": 80},
                {"name": "serve-81-udp", "containerPort": 81, "protocol": "UDP"},
                {"containerPort": 82}
            ]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}
        })).unwrap();
        let (k, p) = project_pod(&pod).unwrap();
        assert_eq!(k, PodKey::new("x", "a"));
        assert_eq!(p.ips.len(), 2);
        assert_eq!(p.ports.len(), 2);
        assert_eq!(p.ports[1].proto, Proto::Udp);
        assert_eq!(p.node.as_deref(), Some("n1"));
        let mut done = pod.clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(project_pod(&done).unwrap().1.ips.is_empty());
    }

    #[test]
    fn pods_share_label_sets_and_node_names() {
        let mut int = Interner::default();
        let pod = |name: &str, app: &str| -> SlimPod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "x", "labels": {"app": app}},
                "spec": {"nodeName": "n1"}, "status": {"podIP": "10.0.0.1"}
            }))
            .unwrap()
        };
        let (_, a) = project_slim_pod(&pod("a", "web"), &mut int).unwrap();
        let (_, b) = project_slim_pod(&pod("b", "web"), &mut int).unwrap();
        let (_, c) = project_slim_pod(&pod("c", "db"), &mut int).unwrap();
        assert!(Arc::ptr_eq(&a.labels.0, &b.labels.0));
        assert!(!Arc::ptr_eq(&a.labels.0, &c.labels.0));
        assert!(Arc::ptr_eq(
            a.node.as_ref().unwrap(),
            c.node.as_ref().unwrap()
        ));
        assert_eq!(int.len(), 3);
        // Equal to the projection of the full Pod, sharing aside.
        let full: Pod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": []}, "status": {"podIP": "10.0.0.1"}
        }))
        .unwrap();
        assert_eq!(project_pod(&full).unwrap().1, a);
        // A write to shared labels copies them first.
        let mut d = b.clone();
        d.labels.insert("tier".into(), "fe".into());
        assert_eq!(a.labels.len(), 1);
        assert_eq!(d.labels.len(), 2);
    }

    #[test]
    fn the_interner_sweeps_values_nobody_holds() {
        let mut int = Interner::default();
        let mut live = Vec::new();
        for i in 0..10 * Interner::FLOOR {
            let l = int.labels([("app".to_string(), format!("a{i}"))].into());
            // Every tenth set stays in use.
            if i % 10 == 0 {
                live.push(l);
            }
        }
        assert!(
            int.len() <= 2 * live.len().max(Interner::FLOOR) + 1,
            "{} held for {} live",
            int.len(),
            live.len()
        );
        // Live sets are still shared after the sweeps.
        let again = int.labels([("app".to_string(), "a0".to_string())].into());
        assert!(Arc::ptr_eq(&again.0, &live[0].0));
    }
}
