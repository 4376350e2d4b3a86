//! Slim projections of the API objects the proxy needs (Services, EndpointSlices, Nodes), as
//! kube-proxy's change trackers keep them. Projection is pure: an object in, an info out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;

use crate::sched::Scheduler;

/// The annotation that picks a Service's scheduler (`rr`, `random`, `lc`, `dh`, `sh`, `sed`,
/// `nq`); without it the proxy's `--scheduler` applies.
pub const SCHEDULER_ANNOTATION: &str = "ferry.dev/scheduler";
/// The annotation that makes the proxy send a PROXY protocol header (`v1` or `v2`) to backends
/// of a Service's TCP ports.
pub const PROXY_PROTOCOL_ANNOTATION: &str = "ferry.dev/proxy-protocol";
/// The seed's `spec.topologyKeys`, as an annotation (comma-separated) for API servers that
/// drop the removed field. `spec.topologyKeys` wins when both are present.
pub const TOPOLOGY_KEYS_ANNOTATION: &str = "ferry.dev/topology-keys";
/// Topology aware hints (1.23–1.26 name).
pub const HINTS_ANNOTATION: &str = "service.kubernetes.io/topology-aware-hints";
/// Topology aware routing (1.27+ name); takes precedence over [`HINTS_ANNOTATION`].
pub const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";
/// The label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Node label keys.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// The catch-all topology key.
pub const TOPOLOGY_ANY: &str = "*";
/// Default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT: Duration = Duration::from_secs(10800);

/// Transport protocol of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    /// Parses the API spelling; absent means TCP.
    pub fn parse(s: Option<&str>) -> Option<Proto> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Proto::Tcp),
            "UDP" => Some(Proto::Udp),
            "SCTP" => Some(Proto::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        })
    }
}

/// PROXY protocol version sent to backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProxyProtocol {
    V1,
    V2,
}

/// `namespace/name:port-name/PROTO`: one port of one Service (kube-proxy's ServicePortName).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    pub port: String,
    pub proto: Proto,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        write!(f, "/{}", self.proto)
    }
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub name: String,
    pub proto: Proto,
    pub port: u16,
    pub node_port: Option<u16>,
}

/// What the proxy needs of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<PortInfo>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    /// `Some(timeout)` when `sessionAffinity: ClientIP`.
    pub affinity: Option<Duration>,
    pub internal_local: bool,
    pub external_local: bool,
    /// `spec.healthCheckNodePort` (LoadBalancer with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<u16>,
    pub topology_keys: Vec<String>,
    /// Topology aware hints/routing requested (annotations or `trafficDistribution`).
    pub hints: bool,
    pub scheduler: Option<Scheduler>,
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// One endpoint address of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointInfo {
    pub ip: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    /// `hints.forZones`; `None` when the endpoint has no hints.
    pub hint_zones: Option<BTreeSet<String>>,
    /// `deprecatedTopology` (the v1beta1 `topology` map).
    pub topology: BTreeMap<String, String>,
}

/// One port of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    pub name: String,
    pub proto: Proto,
    pub port: u16,
}

/// What the proxy needs of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    pub namespace: String,
    pub name: String,
    pub service: String,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<EndpointInfo>,
}

/// What the proxy needs of a Node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// InternalIP then ExternalIP addresses.
    pub addresses: Vec<IpAddr>,
}

fn port_u16(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p > 0)
}

fn parse_ips<'a>(it: impl IntoIterator<Item = &'a String>) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in it.into_iter().filter_map(|s| s.trim().parse().ok()) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// Projects a Service; `None` for ExternalName and headless Services (nothing to proxy).
/// `raw` is the object as JSON, read for `spec.topologyKeys` (not in the typed spec).
pub fn project_service(s: &Service, raw: Option<&Value>) -> Option<ServiceInfo> {
    let namespace = s.metadata.namespace.clone()?;
    let name = s.metadata.name.clone()?;
    let spec = s.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") || spec.cluster_ip.as_deref() == Some("None") {
        return None;
    }
    let mut cluster_ips = parse_ips(spec.cluster_ips.iter().flatten());
    if cluster_ips.is_empty() {
        cluster_ips = parse_ips(spec.cluster_ip.iter());
    }
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(PortInfo {
                name: p.name.clone().unwrap_or_default(),
                proto: Proto::parse(p.protocol.as_deref())?,
                port: port_u16(p.port)?,
                node_port: p.node_port.and_then(port_u16),
            })
        })
        .collect();
    let lb_ips = s
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_ref());
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u64::try_from(t).ok())
            .filter(|t| *t > 0)
            .map_or(DEFAULT_AFFINITY_TIMEOUT, Duration::from_secs)
    });
    let ann = s.metadata.annotations.as_ref();
    let annotation = |k: &str| ann.and_then(|a| a.get(k)).map(|v| v.trim());
    let mut topology_keys: Vec<String> = raw
        .and_then(|r| r.pointer("/spec/topologyKeys"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if topology_keys.is_empty()
        && let Some(v) = annotation(TOPOLOGY_KEYS_ANNOTATION)
    {
        topology_keys = v
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
    }
    // topology-mode replaces topology-aware-hints; "" and "disabled" turn it off; the
    // trafficDistribution field (PreferClose and its successors) turns it on.
    let mode = annotation(TOPOLOGY_MODE_ANNOTATION).or_else(|| annotation(HINTS_ANNOTATION));
    let hints = match mode {
        Some(m) => !m.is_empty() && !m.eq_ignore_ascii_case("disabled"),
        None => false,
    } || matches!(
        spec.traffic_distribution.as_deref(),
        Some("PreferClose" | "PreferSameZone" | "PreferSameNode")
    );
    Some(ServiceInfo {
        namespace,
        name,
        cluster_ips,
        ports,
        external_ips: parse_ips(spec.external_ips.iter().flatten()),
        load_balancer_ips: parse_ips(lb_ips),
        affinity,
        internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
        health_check_node_port: spec.health_check_node_port.and_then(port_u16),
        topology_keys,
        hints,
        scheduler: annotation(SCHEDULER_ANNOTATION).and_then(|v| v.parse().ok()),
        proxy_protocol: match annotation(PROXY_PROTOCOL_ANNOTATION) {
            Some("v1" | "1") => Some(ProxyProtocol::V1),
            Some("v2" | "2") => Some(ProxyProtocol::V2),
            _ => None,
        },
    })
}

/// Projects an EndpointSlice; `None` without the service-name label or for FQDN slices.
pub fn project_slice(s: &EndpointSlice) -> Option<SliceInfo> {
    let namespace = s.metadata.namespace.clone()?;
    let name = s.metadata.name.clone()?;
    let service = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
    if s.address_type != "IPv4" && s.address_type != "IPv6" {
        return None;
    }
    let ports = s
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(SlicePort {
                name: p.name.clone().unwrap_or_default(),
                proto: Proto::parse(p.protocol.as_deref())?,
                port: port_u16(p.port?)?,
            })
        })
        .collect();
    let mut endpoints = Vec::new();
    for ep in s.endpoints.iter().flatten() {
        let c = ep.conditions.as_ref();
        // Unknown readiness is ready; unknown serving follows ready; unknown terminating is false.
        let ready = c.and_then(|c| c.ready).unwrap_or(true);
        let serving = c.and_then(|c| c.serving).unwrap_or(ready);
        let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
        let hint_zones = ep
            .hints
            .as_ref()
            .and_then(|h| h.for_zones.as_ref())
            .filter(|z| !z.is_empty())
            .map(|z| z.iter().map(|z| z.name.clone()).collect());
        let topology: BTreeMap<String, String> = ep
            .deprecated_topology
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        // The first address is the one kube-proxy uses.
        if let Some(ip) = ep.addresses.first().and_then(|a| a.parse().ok()) {
            endpoints.push(EndpointInfo {
                ip,
                ready,
                serving,
                terminating,
                node_name: ep.node_name.clone(),
                zone: ep.zone.clone(),
                hint_zones,
                topology,
            });
        }
    }
    Some(SliceInfo {
        namespace,
        name,
        service,
        ports,
        endpoints,
    })
}

/// Projects a Node.
pub fn project_node(n: &Node) -> Option<NodeInfo> {
    let name = n.metadata.name.clone()?;
    let labels = n.metadata.labels.clone().unwrap_or_default();
    let mut addresses = Vec::new();
    let addrs = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .cloned()
        .unwrap_or_default();
    for kind in ["InternalIP", "ExternalIP"] {
        for a in addrs.iter().filter(|a| a.type_ == kind) {
            if let Ok(ip) = a.address.parse::<IpAddr>()
                && !addresses.contains(&ip)
            {
                addresses.push(ip);
            }
        }
    }
    Some(NodeInfo {
        name,
        labels: labels.into_iter().collect(),
        addresses,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn svc(v: Value) -> (Service, Value) {
        (serde_json::from_value(v.clone()).unwrap(), v)
    }

    #[test]
    fn service_projection() {
        let (s, raw) = svc(json!({
            "metadata": {"namespace": "default", "name": "web", "annotations": {
                "ferry.dev/scheduler": "lc", "ferry.dev/proxy-protocol": "v2",
                "service.kubernetes.io/topology-aware-hints": "auto"}},
            "spec": {"type": "LoadBalancer", "clusterIP": "127.96.0.10",
                "clusterIPs": ["127.96.0.10", "fd00::10"],
                "ports": [{"name": "http", "port": 80, "targetPort": 9376, "nodePort": 30080},
                          {"name": "dns", "port": 53, "protocol": "UDP"},
                          {"name": "bad", "port": 70000}],
                "externalIPs": ["127.0.0.50", "127.0.0.50", "junk"],
                "sessionAffinity": "ClientIP",
                "externalTrafficPolicy": "Local",
                "topologyKeys": ["kubernetes.io/hostname", "*"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "127.0.0.60"}, {"hostname": "x"}]}}
        }));
        let i = project_service(&s, Some(&raw)).unwrap();
        assert_eq!(i.cluster_ips.len(), 2);
        assert_eq!(i.ports.len(), 2);
        assert_eq!(i.ports[0].node_port, Some(30080));
        assert_eq!(i.ports[1].proto, Proto::Udp);
        assert_eq!(
            i.external_ips,
            vec!["127.0.0.50".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(i.load_balancer_ips.len(), 1);
        assert_eq!(i.affinity, Some(DEFAULT_AFFINITY_TIMEOUT));
        assert!(i.external_local && !i.internal_local);
        assert_eq!(i.topology_keys, vec!["kubernetes.io/hostname", "*"]);
        assert!(i.hints);
        assert_eq!(i.scheduler, Some(Scheduler::LeastConnection));
        assert_eq!(i.proxy_protocol, Some(ProxyProtocol::V2));
    }

    #[test]
    fn service_projection_skips() {
        for spec in [
            json!({"type": "ExternalName", "externalName": "x.example"}),
            json!({"clusterIP": "None", "ports": [{"port": 80}]}),
        ] {
            let (s, raw) = svc(json!({"metadata": {"namespace": "a", "name": "b"}, "spec": spec}));
            assert!(project_service(&s, Some(&raw)).is_none());
        }
    }

    #[test]
    fn affinity_timeout_and_annotation_keys() {
        let (s, raw) = svc(json!({
            "metadata": {"namespace": "a", "name": "b",
                "annotations": {"ferry.dev/topology-keys": " topology.kubernetes.io/zone , *",
                    "service.kubernetes.io/topology-mode": "Disabled",
                    "service.kubernetes.io/topology-aware-hints": "auto"}},
            "spec": {"clusterIP": "127.96.0.1", "ports": [{"port": 80}],
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 5}}}
        }));
        let i = project_service(&s, Some(&raw)).unwrap();
        assert_eq!(i.affinity, Some(Duration::from_secs(5)));
        assert_eq!(i.topology_keys, vec!["topology.kubernetes.io/zone", "*"]);
        assert!(!i.hints, "topology-mode takes precedence");
    }

    #[test]
    fn slice_projection_conditions() {
        let s: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "a", "name": "b-1",
                "labels": {"kubernetes.io/service-name": "b"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 9376}],
            "endpoints": [
                {"addresses": ["127.0.0.2"]},
                {"addresses": ["127.0.0.3"], "conditions": {"ready": false, "serving": true, "terminating": true},
                 "nodeName": "n1", "zone": "z1", "hints": {"forZones": [{"name": "z1"}]}},
                {"addresses": ["nope"]}
            ]
        }))
        .unwrap();
        let i = project_slice(&s).unwrap();
        assert_eq!(i.endpoints.len(), 2);
        assert!(i.endpoints[0].ready && i.endpoints[0].serving && !i.endpoints[0].terminating);
        let e = &i.endpoints[1];
        assert!(!e.ready && e.serving && e.terminating);
        assert_eq!(e.hint_zones.as_ref().unwrap().len(), 1);
        assert_eq!(i.ports[0].proto, Proto::Tcp);
    }

    #[test]
    fn slice_without_label_or_fqdn_is_skipped() {
        for v in [
            json!({"metadata": {"namespace": "a", "name": "x"}, "addressType": "IPv4", "endpoints": []}),
            json!({"metadata": {"namespace": "a", "name": "x", "labels": {"kubernetes.io/service-name": "b"}},
                   "addressType": "FQDN", "endpoints": []}),
        ] {
            let s: EndpointSlice = serde_json::from_value(v).unwrap();
            assert!(project_slice(&s).is_none());
        }
    }

    #[test]
    fn node_projection_orders_addresses() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z"}},
            "status": {"addresses": [{"type": "Hostname", "address": "n1"},
                {"type": "ExternalIP", "address": "127.0.0.9"},
                {"type": "InternalIP", "address": "127.0.0.8"}]}
        }))
        .unwrap();
        let i = project_node(&n).unwrap();
        assert_eq!(
            i.addresses,
            vec![
                "127.0.0.8".parse::<IpAddr>().unwrap(),
                "127.0.0.9".parse().unwrap()
            ]
        );
    }
}
