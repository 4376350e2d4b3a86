//! The pure core: (Services, EndpointSlices, Nodes, this node) -> this node's service table.
//!
//! For each Service port the table has up to four pools of endpoints (internal/external traffic,
//! IPv4/IPv6) and a frontend for every address the port answers on: each `clusterIPs` entry
//! (internal), and the node IPs (NodePort), `externalIPs` and load-balancer ingress IPs
//! (external). A frontend whose pool is empty is left out, so nothing listens there and a
//! connection is refused at once.
//!
//! Endpoint selection follows kube-proxy's `CategorizeEndpoints`: ready endpoints (filtered by
//! topology hints when usable), else serving-and-terminating ones; with a `Local` traffic policy
//! only this node's endpoints (ready, else serving-and-terminating). The seed's `topologyKeys`
//! (kube-proxy <= 1.21 `FilterTopologyEndpoint`) replaces hints when set.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::model::*;
use crate::sched::Scheduler;

/// Which traffic a pool serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reach {
    /// ClusterIP traffic (`internalTrafficPolicy`).
    Internal,
    /// NodePort, externalIPs, load-balancer IPs (`externalTrafficPolicy`).
    External,
}

/// Identifies a pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub port: ServicePortName,
    pub reach: Reach,
    pub ipv6: bool,
}

/// The endpoints behind a set of frontends and how to choose among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub endpoints: Vec<SocketAddr>,
    pub scheduler: Scheduler,
    pub affinity: Option<Duration>,
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// An address the proxy answers on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    pub ip: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", SocketAddr::new(self.ip, self.port), self.proto)
    }
}

/// This node's service table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// Pools with at least one endpoint.
    pub pools: BTreeMap<PoolKey, Pool>,
    /// Frontends whose pool is in `pools`.
    pub frontends: BTreeMap<Frontend, PoolKey>,
}

/// What the table is computed for.
#[derive(Debug, Clone, Default)]
pub struct NodeContext {
    /// This node's name (endpoints with this `nodeName` are local).
    pub name: String,
    /// This node's labels (zone for hints; topologyKeys).
    pub labels: BTreeMap<String, String>,
    /// The addresses NodePorts are served on.
    pub node_ips: Vec<IpAddr>,
    /// Default scheduler (`--scheduler`).
    pub scheduler: Scheduler,
    /// Serve SCTP ports? (The userspace proxy cannot; they are skipped.)
    pub sctp: bool,
}

/// The merged, deduplicated endpoints of one service port.
fn port_endpoints<'a>(
    port: &PortInfo,
    slices: impl Iterator<Item = &'a SliceInfo>,
    node: &str,
) -> Vec<(SocketAddr, &'a EndpointInfo)> {
    let mut out: BTreeMap<SocketAddr, &'a EndpointInfo> = BTreeMap::new();
    for slice in slices {
        let Some(sp) = slice
            .ports
            .iter()
            .find(|p| p.name == port.name && p.proto == port.proto)
        else {
            continue;
        };
        for ep in &slice.endpoints {
            let addr = SocketAddr::new(ep.ip, sp.port);
            let local = ep.node_name.as_deref() == Some(node);
            // The same address in two slices (during a move between slices): prefer the
            // ready copy, then the local one (kube-proxy favours local), else the first.
            let replace = match out.get(&addr) {
                None => true,
                Some(old) => {
                    let old_local = old.node_name.as_deref() == Some(node);
                    (ep.ready && !old.ready) || (ep.ready == old.ready && local && !old_local)
                }
            };
            if replace {
                out.insert(addr, ep);
            }
        }
    }
    out.into_iter().collect()
}

/// kube-proxy's `canUseTopology`: hints requested, node has a zone, every ready endpoint has
/// hints, and at least one is hinted for this zone.
fn can_use_hints(
    svc: &ServiceInfo,
    eps: &[(SocketAddr, &EndpointInfo)],
    labels: &BTreeMap<String, String>,
) -> bool {
    if !svc.hints {
        return false;
    }
    let Some(zone) = labels.get(LABEL_ZONE).filter(|z| !z.is_empty()) else {
        return false;
    };
    let mut for_zone = false;
    for (_, ep) in eps.iter().filter(|(_, e)| e.ready) {
        match &ep.hint_zones {
            None => return false,
            Some(z) => for_zone |= z.contains(zone),
        }
    }
    for_zone
}

/// The value of a topology key for an endpoint: its deprecated topology map, then its `zone`
/// and `nodeName`, then its node's labels.
fn endpoint_topology<'a>(
    ep: &'a EndpointInfo,
    key: &str,
    nodes: &'a BTreeMap<String, NodeInfo>,
) -> Option<&'a str> {
    if let Some(v) = ep.topology.get(key) {
        return Some(v);
    }
    let node = ep.node_name.as_deref();
    let from_node = node
        .and_then(|n| nodes.get(n))
        .and_then(|n| n.labels.get(key))
        .map(String::as_str);
    match key {
        LABEL_ZONE => ep.zone.as_deref().or(from_node),
        LABEL_HOSTNAME => from_node.or(node),
        _ => from_node,
    }
}

/// The seed's `topologyKeys`: the endpoints matching this node on the first key that matches
/// any; `*` matches all; no match on any key -> none (traffic is refused).
fn filter_topology_keys<'a>(
    keys: &[String],
    eps: Vec<(SocketAddr, &'a EndpointInfo)>,
    ctx: &NodeContext,
    nodes: &BTreeMap<String, NodeInfo>,
) -> Vec<(SocketAddr, &'a EndpointInfo)> {
    if keys.is_empty() {
        return eps;
    }
    for key in keys {
        if key == TOPOLOGY_ANY {
            return eps;
        }
        let Some(mine) = (match key.as_str() {
            LABEL_HOSTNAME => ctx
                .labels
                .get(key)
                .map(String::as_str)
                .or(Some(ctx.name.as_str())),
            _ => ctx.labels.get(key).map(String::as_str),
        }) else {
            continue;
        };
        let hit: Vec<_> = eps
            .iter()
            .filter(|(_, e)| endpoint_topology(e, key, nodes) == Some(mine))
            .cloned()
            .collect();
        if !hit.is_empty() {
            return hit;
        }
    }
    Vec::new()
}

/// Selects the endpoints of one pool.
fn select(
    svc: &ServiceInfo,
    reach: Reach,
    eps: &[(SocketAddr, &EndpointInfo)],
    ctx: &NodeContext,
    nodes: &BTreeMap<String, NodeInfo>,
) -> Vec<SocketAddr> {
    let local_policy = match reach {
        Reach::Internal => svc.internal_local,
        Reach::External => svc.external_local,
    };
    let is_local = |e: &EndpointInfo| e.node_name.as_deref() == Some(ctx.name.as_str());
    let serving_terminating = |e: &EndpointInfo| e.serving && e.terminating;
    if local_policy {
        let ready: Vec<SocketAddr> = eps
            .iter()
            .filter(|(_, e)| is_local(e) && e.ready)
            .map(|(a, _)| *a)
            .collect();
        if !ready.is_empty() {
            return ready;
        }
        return eps
            .iter()
            .filter(|(_, e)| is_local(e) && serving_terminating(e))
            .map(|(a, _)| *a)
            .collect();
    }
    let ready: Vec<(SocketAddr, &EndpointInfo)> =
        eps.iter().filter(|(_, e)| e.ready).cloned().collect();
    let chosen: Vec<SocketAddr> = if !svc.topology_keys.is_empty() {
        filter_topology_keys(&svc.topology_keys, ready, ctx, nodes)
            .into_iter()
            .map(|(a, _)| a)
            .collect()
    } else if can_use_hints(svc, eps, &ctx.labels) {
        let zone = ctx.labels.get(LABEL_ZONE).cloned().unwrap_or_default();
        ready
            .iter()
            .filter(|(_, e)| e.hint_zones.as_ref().is_some_and(|z| z.contains(&zone)))
            .map(|(a, _)| *a)
            .collect()
    } else {
        ready.iter().map(|(a, _)| *a).collect()
    };
    if !chosen.is_empty() {
        return chosen;
    }
    // No ready endpoint: fall back to serving-and-terminating ones, ignoring topology (a best
    // effort not to drop connections), unless topologyKeys deliberately matched nothing among
    // ready endpoints that exist.
    if !svc.topology_keys.is_empty() && eps.iter().any(|(_, e)| e.ready) {
        return Vec::new();
    }
    eps.iter()
        .filter(|(_, e)| serving_terminating(e))
        .map(|(a, _)| *a)
        .collect()
}

/// Builds the table. `services` and `slices` are keyed by (namespace, name); `nodes` by name.
pub fn build(
    services: &BTreeMap<(String, String), ServiceInfo>,
    slices: &BTreeMap<(String, String), SliceInfo>,
    nodes: &BTreeMap<String, NodeInfo>,
    ctx: &NodeContext,
) -> Table {
    // Slices by service.
    let mut by_service: BTreeMap<(&str, &str), Vec<&SliceInfo>> = BTreeMap::new();
    for s in slices.values() {
        by_service
            .entry((s.namespace.as_str(), s.service.as_str()))
            .or_default()
            .push(s);
    }
    let mut table = Table::default();
    for svc in services.values() {
        let svc_slices = by_service
            .get(&(svc.namespace.as_str(), svc.name.as_str()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        add_service(&mut table, svc, svc_slices, nodes, ctx);
    }
    table
}

/// One Service's part of the table: its pools and the frontends it claims, as [`build`] gives
/// them for this Service alone (`slices`: its EndpointSlices). The whole table is the union of
/// the parts, a frontend claimed by several Services going to the first in (namespace, name)
/// order ([`incr`] keeps that union up to date).
pub fn build_service(
    svc: &ServiceInfo,
    slices: &[&SliceInfo],
    nodes: &BTreeMap<String, NodeInfo>,
    ctx: &NodeContext,
) -> Table {
    let mut table = Table::default();
    add_service(&mut table, svc, slices, nodes, ctx);
    table
}

/// Adds `svc`'s pools and frontends to `table`; a frontend already claimed stays with its
/// first claimant. Only pools with endpoints are added, and only their frontends.
fn add_service(
    table: &mut Table,
    svc: &ServiceInfo,
    svc_slices: &[&SliceInfo],
    nodes: &BTreeMap<String, NodeInfo>,
    ctx: &NodeContext,
) {
    for port in &svc.ports {
        if port.proto == Proto::Sctp && !ctx.sctp {
            continue;
        }
        let spn = ServicePortName {
            namespace: svc.namespace.clone(),
            name: svc.name.clone(),
            port: port.name.clone(),
            proto: port.proto,
        };
        let all = port_endpoints(port, svc_slices.iter().copied(), &ctx.name);
        let mut fronts: Vec<(IpAddr, u16, Reach)> = Vec::new();
        fronts.extend(
            svc.cluster_ips
                .iter()
                .map(|ip| (*ip, port.port, Reach::Internal)),
        );
        if let Some(np) = port.node_port {
            fronts.extend(ctx.node_ips.iter().map(|ip| (*ip, np, Reach::External)));
        }
        fronts.extend(
            svc.external_ips
                .iter()
                .map(|ip| (*ip, port.port, Reach::External)),
        );
        fronts.extend(
            svc.load_balancer_ips
                .iter()
                .map(|ip| (*ip, port.port, Reach::External)),
        );
        for (ip, fport, reach) in fronts {
            let key = PoolKey {
                port: spn.clone(),
                reach,
                ipv6: ip.is_ipv6(),
            };
            if !table.pools.contains_key(&key) {
                let family: Vec<_> = all
                    .iter()
                    .filter(|(a, _)| a.is_ipv6() == key.ipv6)
                    .cloned()
                    .collect();
                let endpoints = select(svc, reach, &family, ctx, nodes);
                // No endpoint: no pool and no frontend (nothing listens; refused at once).
                if endpoints.is_empty() {
                    continue;
                }
                table.pools.insert(
                    key.clone(),
                    Pool {
                        endpoints,
                        scheduler: svc.scheduler.unwrap_or(ctx.scheduler),
                        affinity: svc.affinity,
                        proxy_protocol: svc.proxy_protocol.filter(|_| port.proto == Proto::Tcp),
                    },
                );
            }
            let fe = Frontend {
                ip,
                port: fport,
                proto: port.proto,
            };
            // First claim wins (services in namespace/name order) when two collide.
            table.frontends.entry(fe).or_insert(key);
        }
    }
}

/// The set of frontends that changed pool or appeared/disappeared between two tables.
pub fn frontend_diff(old: &Table, new: &Table) -> (Vec<Frontend>, Vec<Frontend>) {
    let removed = old
        .frontends
        .iter()
        .filter(|(f, k)| new.frontends.get(f) != Some(k))
        .map(|(f, _)| *f)
        .collect();
    let added = new
        .frontends
        .iter()
        .filter(|(f, k)| old.frontends.get(f) != Some(k))
        .map(|(f, _)| *f)
        .collect();
    (removed, added)
}

pub mod incr;

#[cfg(test)]
mod tests;
