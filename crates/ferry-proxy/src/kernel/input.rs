//! The kernel proxy's input: this node's service table ([`crate::table`]) regrouped per Service
//! port and IP family, with what a kernel data path needs on top of the userspace one: what to
//! do when a pool is empty (`DROP` when endpoints exist but none may be used here, as with a
//! `Local` traffic policy; `REJECT` when the Service has no usable endpoint at all), and every
//! frontend (ClusterIPs, NodePort, externalIPs, load-balancer IPs) whether or not it has
//! endpoints.
//!
//! Endpoint selection (ready, then serving-and-terminating; topology hints; `topologyKeys`;
//! traffic policies) is the table's: it is not repeated here.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::model::{NodeInfo, ServiceInfo, ServicePortName, SliceInfo};
use crate::table::{self, NodeContext, PoolKey, Reach};

/// What traffic to one kind of frontend becomes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// DNAT to one of these endpoints (never empty).
    Pool(Vec<SocketAddr>),
    /// Endpoints exist but none may serve this traffic here (traffic policy `Local` without
    /// local endpoints, `topologyKeys` without a match): dropped, as upstream does.
    Drop,
    /// The Service has no usable endpoint: rejected (TCP reset, ICMP port unreachable).
    Reject,
}

/// Why an external address answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExternalKind {
    ExternalIp,
    LoadBalancer,
}

/// One port of one Service in one IP family, as the kernel data path serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvcPort {
    pub name: ServicePortName,
    pub ipv6: bool,
    pub port: u16,
    pub node_port: Option<u16>,
    pub cluster_ips: Vec<IpAddr>,
    /// externalIPs and load-balancer ingress IPs of this family.
    pub externals: Vec<(IpAddr, ExternalKind)>,
    /// ClusterIP traffic (`internalTrafficPolicy` applied).
    pub internal: Target,
    /// NodePort / external / load-balancer traffic (`externalTrafficPolicy` applied).
    pub external: Target,
    /// `sessionAffinity: ClientIP` timeout.
    pub affinity: Option<Duration>,
    pub internal_local: bool,
    pub external_local: bool,
    /// `healthCheckNodePort` (with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<u16>,
}

impl SvcPort {
    /// True when the port answers on anything besides its ClusterIPs.
    pub fn has_external(&self) -> bool {
        self.node_port.is_some() || !self.externals.is_empty()
    }
}

/// Does any usable endpoint (ready, or serving and terminating) of this family exist for the
/// port, on any node?
fn any_usable(
    svc: &ServiceInfo,
    port_name: &str,
    proto: crate::model::Proto,
    ipv6: bool,
    slices: &[&SliceInfo],
) -> bool {
    slices.iter().any(|s| {
        s.ports
            .iter()
            .any(|p| p.name == port_name && p.proto == proto)
            && s.endpoints
                .iter()
                .any(|e| e.ip.is_ipv6() == ipv6 && (e.ready || (e.serving && e.terminating)))
    }) && !svc.ports.is_empty()
}

/// Builds the kernel input for the node `node` (name and labels; NodePorts are served on every
/// local address, the kernel rules decide which addresses are local).
pub fn build(
    services: &BTreeMap<(String, String), ServiceInfo>,
    slices: &BTreeMap<(String, String), SliceInfo>,
    nodes: &BTreeMap<String, NodeInfo>,
    node: &str,
    labels: &BTreeMap<String, String>,
) -> (Vec<SvcPort>, table::Table) {
    let ctx = NodeContext {
        name: node.to_string(),
        labels: labels.clone(),
        // Unspecified addresses of both families make the table compute the external pools
        // of every family a NodePort may be reached in.
        node_ips: vec![
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        ],
        scheduler: crate::Scheduler::Random,
        sctp: true,
    };
    let t = table::build(services, slices, nodes, &ctx);
    let mut by_service: BTreeMap<(&str, &str), Vec<&SliceInfo>> = BTreeMap::new();
    for s in slices.values() {
        by_service
            .entry((s.namespace.as_str(), s.service.as_str()))
            .or_default()
            .push(s);
    }
    let mut out = Vec::new();
    for svc in services.values() {
        let svc_slices = by_service
            .get(&(svc.namespace.as_str(), svc.name.as_str()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        for port in &svc.ports {
            let name = ServicePortName {
                namespace: svc.namespace.clone(),
                name: svc.name.clone(),
                port: port.name.clone(),
                proto: port.proto,
            };
            for ipv6 in [false, true] {
                let cluster_ips: Vec<IpAddr> = svc
                    .cluster_ips
                    .iter()
                    .filter(|ip| ip.is_ipv6() == ipv6)
                    .copied()
                    .collect();
                // A Service is proxied in the families it has a ClusterIP of (upstream runs
                // one proxier per family and skips Services without an IP of its own).
                if cluster_ips.is_empty() {
                    continue;
                }
                let mut externals: Vec<(IpAddr, ExternalKind)> = Vec::new();
                for ip in svc.external_ips.iter().filter(|ip| ip.is_ipv6() == ipv6) {
                    externals.push((*ip, ExternalKind::ExternalIp));
                }
                for ip in svc
                    .load_balancer_ips
                    .iter()
                    .filter(|ip| ip.is_ipv6() == ipv6)
                {
                    if !externals.iter().any(|(e, _)| e == ip) {
                        externals.push((*ip, ExternalKind::LoadBalancer));
                    }
                }
                let usable = any_usable(svc, &port.name, port.proto, ipv6, svc_slices);
                let target = |reach: Reach| {
                    let key = PoolKey {
                        port: name.clone(),
                        reach,
                        ipv6,
                    };
                    match t.pools.get(&key) {
                        Some(p) if !p.endpoints.is_empty() => Target::Pool(p.endpoints.clone()),
                        _ if usable => Target::Drop,
                        _ => Target::Reject,
                    }
                };
                let internal = target(Reach::Internal);
                let external = if port.node_port.is_some() || !externals.is_empty() {
                    target(Reach::External)
                } else {
                    Target::Reject
                };
                out.push(SvcPort {
                    name: name.clone(),
                    ipv6,
                    port: port.port,
                    node_port: port.node_port,
                    cluster_ips,
                    externals,
                    internal,
                    external,
                    affinity: svc.affinity,
                    internal_local: svc.internal_local,
                    external_local: svc.external_local,
                    health_check_node_port: svc
                        .health_check_node_port
                        .filter(|_| svc.external_local),
                });
            }
        }
    }
    (out, t)
}

/// The kernel input of the Services `keys` alone (a Service that is gone gives no ports), with
/// their part of the service table: what [`build`] gives for them, at a cost that depends on
/// those Services only (their EndpointSlices are found through the state's index). A
/// Service's ports depend on nothing of the other Services.
pub fn build_services<'k>(
    st: &crate::sync::State,
    keys: impl IntoIterator<Item = &'k (String, String)>,
    node: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<((String, String), Vec<SvcPort>, table::Table)> {
    let mut out = Vec::new();
    for key in keys {
        let mut services = BTreeMap::new();
        let mut slices = BTreeMap::new();
        if let Some(svc) = st.services.get(key) {
            services.insert(key.clone(), svc.clone());
            for (k, s) in st.slices_of(&key.0, &key.1) {
                slices.insert(k.clone(), s.clone());
            }
        }
        let (ports, t) = build(&services, &slices, &st.nodes, node, labels);
        out.push((key.clone(), ports, t));
    }
    out
}
