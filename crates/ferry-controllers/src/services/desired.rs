//! Desired endpoints of a Service (no IO): pods matched by the selector in the Service's
//! namespace, one endpoint per pod and address family, grouped by the resolved port set
//! (a named `targetPort` is resolved per pod). Conditions follow seed 004 §8 and upstream:
//! `serving` = publishNotReadyAddresses or the pod is Running and Ready; `terminating` = the pod
//! has a deletion timestamp; `ready` = publishNotReadyAddresses or (serving and not terminating).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};

use crate::runtime::SlimPod;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const HEADLESS: &str = "service.kubernetes.io/headless";

/// An address type of EndpointSlices.
pub const IPV4: &str = "IPv4";
pub const IPV6: &str = "IPv6";

/// A port set: the slice's `ports`, sorted by name then protocol then port.
pub type PortSet = Vec<EndpointPort>;

/// Endpoints grouped by (address type, port set), each list ordered by pod namespace/name.
pub type Desired = BTreeMap<(String, PortKey), (PortSet, Vec<Endpoint>)>;

/// A comparable key for a port set.
pub type PortKey = Vec<(String, String, i32, String)>;

pub fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut k: PortKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.port.unwrap_or(0),
                p.app_protocol.clone().unwrap_or_default(),
            )
        })
        .collect();
    k.sort();
    k
}

pub fn sort_ports(ports: &mut [EndpointPort]) {
    ports.sort_by_key(|p| port_key(std::slice::from_ref(p)));
}

/// Whether the Service is headless (`clusterIP: None`).
pub fn is_headless(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| ip == "None")
}

/// The address types a Service's slices use: its `ipFamilies`, else the family of its
/// ClusterIP, else IPv4.
pub fn address_types(svc: &Service) -> Vec<String> {
    let spec = svc.spec.as_ref();
    let fams: Vec<String> = spec
        .and_then(|s| s.ip_families.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f == IPV4 || f == IPV6)
        .collect();
    if !fams.is_empty() {
        return fams;
    }
    let v6 = spec
        .and_then(|s| s.cluster_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .is_some_and(|ip| ip.is_ipv6());
    vec![if v6 { IPV6 } else { IPV4 }.to_string()]
}

fn family_of(ip: &str) -> Option<&'static str> {
    match ip.parse::<IpAddr>().ok()? {
        IpAddr::V4(_) => Some(IPV4),
        IpAddr::V6(_) => Some(IPV6),
    }
}

/// The pod's IP of an address type (from `status.podIPs`, else `status.podIP`).
pub fn pod_ip(pod: &SlimPod, address_type: &str) -> Option<String> {
    let st = pod.status.as_ref()?;
    let mut ips: Vec<String> = st.pod_ips.iter().flatten().map(|p| p.ip.clone()).collect();
    if ips.is_empty()
        && let Some(ip) = st.pod_ip.clone()
    {
        ips.push(ip);
    }
    ips.into_iter()
        .find(|ip| family_of(ip) == Some(address_type))
}

/// Running and with condition Ready=True (seed 002).
pub fn pod_ready(pod: &SlimPod) -> bool {
    let Some(st) = pod.status.as_ref() else {
        return false;
    };
    st.phase.as_deref() == Some("Running")
        && st
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

pub fn pod_terminating(pod: &SlimPod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn pod_terminal(pod: &SlimPod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Whether the selector (a plain equality map) matches the labels.
pub fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    !selector.is_empty()
        && selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The Service's selector when it selects pods (non-empty).
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
}

/// Resolves a service port's `targetPort` for a pod: a number as is, a name through the pod's
/// container ports with that name and protocol.
pub fn resolve_target_port(
    pod: &SlimPod,
    target: Option<&IntOrString>,
    port: i32,
    protocol: &str,
) -> Option<i32> {
    match target {
        None => Some(port),
        Some(IntOrString::Int(0)) => Some(port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            if let Ok(n) = name.parse::<i32>() {
                return Some(n);
            }
            pod.spec.as_ref()?.containers.iter().find_map(|c| {
                c.ports.iter().flatten().find_map(|cp| {
                    (cp.name.as_deref() == Some(name.as_str())
                        && cp.protocol.as_deref().unwrap_or("TCP") == protocol)
                        .then_some(cp.container_port)
                })
            })
        }
    }
}

/// The endpoint ports of `svc` for `pod` (ports whose named target the pod lacks are left out).
pub fn endpoint_ports(svc: &Service, pod: &SlimPod) -> PortSet {
    let mut out: PortSet = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|sp| {
            let proto = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
            let port = resolve_target_port(pod, sp.target_port.as_ref(), sp.port, &proto)?;
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(proto),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect();
    sort_ports(&mut out);
    out
}

/// Whether the pod's hostname goes into the endpoint (hostname + subdomain naming this headless
/// Service).
pub fn should_set_hostname(pod: &SlimPod, svc: &Service) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    is_headless(svc)
        && spec.hostname.as_deref().is_some_and(|h| !h.is_empty())
        && spec.subdomain.as_deref() == svc.metadata.name.as_deref()
        && pod.metadata.namespace == svc.metadata.namespace
}

/// One pod as an endpoint of `address_type`, or None when it has no IP of that family or is
/// finished.
pub fn pod_endpoint(
    svc: &Service,
    pod: &SlimPod,
    address_type: &str,
    zone_of_node: &dyn Fn(&str) -> Option<String>,
) -> Option<Endpoint> {
    if pod_terminal(pod) {
        return None;
    }
    let ip = pod_ip(pod, address_type)?;
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let serving = publish || pod_ready(pod);
    let terminating = pod_terminating(pod);
    let ready = publish || (serving && !terminating);
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    Some(Endpoint {
        addresses: vec![ip],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname: should_set_hostname(pod, svc)
            .then(|| pod.spec.as_ref().and_then(|s| s.hostname.clone()))
            .flatten(),
        zone: node.as_deref().and_then(zone_of_node),
        node_name: node,
        target_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The zone label of a node.
pub fn node_zone(node: &Node) -> Option<String> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ZONE_LABEL))
        .filter(|z| !z.is_empty())
        .cloned()
}

/// Desired endpoints of `svc` from the pods of its namespace (the caller passes the pods the
/// selector matches, in any order).
pub fn desired_endpoints(
    svc: &Service,
    pods: &[&SlimPod],
    zone_of_node: &dyn Fn(&str) -> Option<String>,
) -> Desired {
    let mut pods: Vec<&SlimPod> = pods.to_vec();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Desired::new();
    for at in address_types(svc) {
        for pod in &pods {
            let Some(ep) = pod_endpoint(svc, pod, &at, zone_of_node) else {
                continue;
            };
            let ports = endpoint_ports(svc, pod);
            let key = (at.clone(), port_key(&ports));
            out.entry(key)
                .or_insert_with(|| (ports, Vec::new()))
                .1
                .push(ep);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn pod(name: &str, ip: &str, ready: bool) -> SlimPod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                         "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x",
                     "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                       "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .unwrap()
    }

    pub fn service(name: &str, extra: serde_json::Value) -> Service {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10",
                     "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}
        });
        for (k, val) in extra.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn conds(ep: &Endpoint) -> (bool, bool, bool) {
        let c = ep.conditions.as_ref().unwrap();
        (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap())
    }

    #[test]
    fn conditions_table() {
        // (pod ready, terminating, publishNotReady) -> (ready, serving, terminating)
        let cases = [
            (true, false, false, (true, true, false)),
            (false, false, false, (false, false, false)),
            (true, true, false, (false, true, true)),
            (false, true, false, (false, false, true)),
            (false, false, true, (true, true, false)),
            (true, true, true, (true, true, true)),
        ];
        for (ready, term, publish, want) in cases {
            let svc = service("s", json!({"publishNotReadyAddresses": publish}));
            let mut p = pod("p", "10.0.0.1", ready);
            if term {
                p.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
                );
            }
            let ep = pod_endpoint(&svc, &p, IPV4, &|_| Some("z1".into())).unwrap();
            assert_eq!(conds(&ep), want, "{ready} {term} {publish}");
            assert_eq!(ep.zone.as_deref(), Some("z1"));
            assert_eq!(ep.node_name.as_deref(), Some("n1"));
        }
    }

    #[test]
    fn pending_pod_is_not_ready() {
        let svc = service("s", json!({}));
        let mut p = pod("p", "10.0.0.1", true);
        p.status.as_mut().unwrap().phase = Some("Pending".into());
        let ep = pod_endpoint(&svc, &p, IPV4, &|_| None).unwrap();
        assert_eq!(conds(&ep), (false, false, false));
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(pod_endpoint(&svc, &p, IPV4, &|_| None).is_none());
    }

    #[test]
    fn named_target_port_groups() {
        let svc = service("s", json!({}));
        let a = pod("a", "10.0.0.1", true);
        let mut b = pod("b", "10.0.0.2", true);
        b.spec.as_mut().unwrap().containers[0]
            .ports
            .as_mut()
            .unwrap()[0]
            .container_port = 9090;
        let c = pod("c", "10.0.0.3", true);
        let d = desired_endpoints(&svc, &[&a, &b, &c], &|_| None);
        assert_eq!(d.len(), 2);
        let sizes: Vec<usize> = d.values().map(|(_, e)| e.len()).collect();
        assert!(sizes.contains(&2) && sizes.contains(&1));
        // A pod lacking the named port gets an endpoint with no ports.
        let mut e = pod("e", "10.0.0.4", true);
        e.spec.as_mut().unwrap().containers[0].ports = None;
        let d = desired_endpoints(&svc, &[&e], &|_| None);
        assert!(d.values().next().unwrap().0.is_empty());
    }

    #[test]
    fn hostname_only_for_matching_headless() {
        let mut p = pod("p", "10.0.0.1", true);
        p.spec.as_mut().unwrap().hostname = Some("host-a".into());
        p.spec.as_mut().unwrap().subdomain = Some("s".into());
        let headless = service("s", json!({"clusterIP": "None"}));
        let other = service("t", json!({"clusterIP": "None"}));
        let normal = service("s", json!({}));
        assert_eq!(
            pod_endpoint(&headless, &p, IPV4, &|_| None)
                .unwrap()
                .hostname
                .as_deref(),
            Some("host-a")
        );
        assert_eq!(
            pod_endpoint(&other, &p, IPV4, &|_| None).unwrap().hostname,
            None
        );
        assert_eq!(
            pod_endpoint(&normal, &p, IPV4, &|_| None).unwrap().hostname,
            None
        );
    }

    #[test]
    fn dual_stack_address_types() {
        let svc = service("s", json!({"ipFamilies": ["IPv6", "IPv4"]}));
        assert_eq!(address_types(&svc), vec!["IPv6", "IPv4"]);
        let mut p = pod("p", "10.0.0.1", true);
        p.status.as_mut().unwrap().pod_ips = Some(vec![
            serde_json::from_value(json!({"ip": "10.0.0.1"})).unwrap(),
            serde_json::from_value(json!({"ip": "fd00::1"})).unwrap(),
        ]);
        let d = desired_endpoints(&svc, &[&p], &|_| None);
        assert_eq!(d.len(), 2);
        assert_eq!(pod_ip(&p, IPV6).as_deref(), Some("fd00::1"));
        assert_eq!(
            address_types(&service("x", json!({"clusterIP": "fd00::5"}))),
            vec!["IPv6"]
        );
    }
}
