//! What the agent decodes from the API server: Pods, Namespaces and Nodes reduced, while they
//! are parsed, to the fields the policy model reads. Every other field of the JSON (the rest of
//! the spec, conditions, container statuses, annotations, `managedFields`...) is skipped by the
//! parser without being allocated, as CoreDNS's kubernetes plugin keeps slim objects. At
//! 150,000 Pods this is most of the decode time and transient memory of a full `k8s_openapi`
//! Pod, and the agent never holds the objects themselves: they are projected into the
//! [`Model`](crate::model::Model) (with shared label sets and node names, see
//! [`Interner`](crate::model::Interner)) and dropped.
//!
//! The types implement [`kube::Resource`] so that kube-rs watchers and lists decode them
//! directly; only `name`, `namespace` and `resourceVersion` of their `metadata` are set.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::model::{Labels, NamedPort, Proto};

/// A Pod as the policy model reads it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "wire::Pod")]
pub struct SlimPod {
    /// Only `name`, `namespace` and `resourceVersion`.
    pub metadata: ObjectMeta,
    pub labels: Labels,
    /// `spec.nodeName`.
    pub node_name: Option<String>,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// `status.phase` is Succeeded or Failed.
    pub finished: bool,
    /// `status.podIPs` (parsed, without repeats), else `status.podIP`.
    pub ips: Vec<IpAddr>,
    /// The containers' ports that have a name.
    pub ports: Vec<NamedPort>,
}

/// A Namespace's name and labels.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "wire::Namespace")]
pub struct SlimNamespace {
    /// Only `name` and `resourceVersion`.
    pub metadata: ObjectMeta,
    pub labels: Labels,
}

/// A Node's name and addresses.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "wire::Node")]
pub struct SlimNode {
    /// Only `name` and `resourceVersion`.
    pub metadata: ObjectMeta,
    /// `status.addresses` of type InternalIP or ExternalIP, parsed, without repeats.
    pub ips: Vec<IpAddr>,
}

fn push_new(ips: &mut Vec<IpAddr>, s: &str) {
    if let Ok(a) = s.parse::<IpAddr>()
        && !ips.contains(&a)
    {
        ips.push(a);
    }
}

fn named_port(
    name: Option<&str>,
    number: Option<i32>,
    protocol: Option<&str>,
) -> Option<NamedPort> {
    let name = name.filter(|n| !n.is_empty())?;
    let port = u16::try_from(number?).ok()?;
    Some(NamedPort {
        name: name.to_string(),
        port,
        proto: Proto::parse(protocol.unwrap_or("TCP")).unwrap_or(Proto::Tcp),
    })
}

fn finished(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded") | Some("Failed"))
}

fn meta(name: Option<String>, namespace: Option<String>, rv: Option<String>) -> ObjectMeta {
    ObjectMeta {
        name,
        namespace,
        resource_version: rv,
        ..ObjectMeta::default()
    }
}

/// The same reduction from a full Pod (what `ferry netpol explain --what-if` files and tests
/// hold); equal to decoding the Pod's JSON as a [`SlimPod`].
impl From<&Pod> for SlimPod {
    fn from(p: &Pod) -> SlimPod {
        let spec = p.spec.as_ref();
        let status = p.status.as_ref();
        let mut ips = Vec::new();
        if let Some(st) = status {
            for i in st.pod_ips.iter().flatten() {
                push_new(&mut ips, &i.ip);
            }
            if ips.is_empty()
                && let Some(ip) = st.pod_ip.as_deref()
            {
                push_new(&mut ips, ip);
            }
        }
        let ports = spec
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                named_port(
                    p.name.as_deref(),
                    Some(p.container_port),
                    p.protocol.as_deref(),
                )
            })
            .collect();
        SlimPod {
            metadata: meta(
                p.metadata.name.clone(),
                p.metadata.namespace.clone(),
                p.metadata.resource_version.clone(),
            ),
            labels: p.metadata.labels.clone().unwrap_or_default(),
            node_name: spec.and_then(|s| s.node_name.clone()),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            finished: finished(status.and_then(|s| s.phase.as_deref())),
            ips,
            ports,
        }
    }
}

impl From<&Namespace> for SlimNamespace {
    fn from(n: &Namespace) -> SlimNamespace {
        SlimNamespace {
            metadata: meta(
                n.metadata.name.clone(),
                None,
                n.metadata.resource_version.clone(),
            ),
            labels: n.metadata.labels.clone().unwrap_or_default(),
        }
    }
}

impl From<&Node> for SlimNode {
    fn from(n: &Node) -> SlimNode {
        let mut ips = Vec::new();
        for a in n
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
        {
            if a.type_ == "InternalIP" || a.type_ == "ExternalIP" {
                push_new(&mut ips, &a.address);
            }
        }
        SlimNode {
            metadata: meta(
                n.metadata.name.clone(),
                None,
                n.metadata.resource_version.clone(),
            ),
            ips,
        }
    }
}

/// The JSON shapes decoded; unknown fields are skipped, `null` reads as absent.
mod wire {
    use serde::Deserialize;

    use super::Labels;

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Meta {
        pub name: Option<String>,
        pub namespace: Option<String>,
        #[serde(rename = "resourceVersion")]
        pub resource_version: Option<String>,
        pub labels: Option<Labels>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Pod {
        pub metadata: Option<Meta>,
        pub spec: Option<PodSpec>,
        pub status: Option<PodStatus>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct PodSpec {
        #[serde(rename = "nodeName")]
        pub node_name: Option<String>,
        #[serde(rename = "hostNetwork")]
        pub host_network: Option<bool>,
        pub containers: Option<Vec<Container>>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Container {
        pub ports: Option<Vec<Port>>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Port {
        pub name: Option<String>,
        #[serde(rename = "containerPort")]
        pub container_port: Option<i32>,
        pub protocol: Option<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct PodStatus {
        pub phase: Option<String>,
        #[serde(rename = "podIP")]
        pub pod_ip: Option<String>,
        #[serde(rename = "podIPs")]
        pub pod_ips: Option<Vec<PodIp>>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct PodIp {
        pub ip: String,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Namespace {
        pub metadata: Option<Meta>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Node {
        pub metadata: Option<Meta>,
        pub status: Option<NodeStatus>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct NodeStatus {
        pub addresses: Option<Vec<NodeAddress>>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct NodeAddress {
        #[serde(rename = "type")]
        pub type_: String,
        pub address: String,
    }
}

impl From<wire::Pod> for SlimPod {
    fn from(w: wire::Pod) -> SlimPod {
        let m = w.metadata.unwrap_or_default();
        let spec = w.spec.unwrap_or_default();
        let status = w.status.unwrap_or_default();
        let mut ips = Vec::new();
        for i in status.pod_ips.iter().flatten() {
            push_new(&mut ips, &i.ip);
        }
        if ips.is_empty()
            && let Some(ip) = status.pod_ip.as_deref()
        {
            push_new(&mut ips, ip);
        }
        let ports = spec
            .containers
            .iter()
            .flatten()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| named_port(p.name.as_deref(), p.container_port, p.protocol.as_deref()))
            .collect();
        SlimPod {
            metadata: meta(m.name, m.namespace, m.resource_version),
            labels: m.labels.unwrap_or_default(),
            node_name: spec.node_name,
            host_network: spec.host_network.unwrap_or(false),
            finished: finished(status.phase.as_deref()),
            ips,
            ports,
        }
    }
}

impl From<wire::Namespace> for SlimNamespace {
    fn from(w: wire::Namespace) -> SlimNamespace {
        let m = w.metadata.unwrap_or_default();
        SlimNamespace {
            metadata: meta(m.name, None, m.resource_version),
            labels: m.labels.unwrap_or_default(),
        }
    }
}

impl From<wire::Node> for SlimNode {
    fn from(w: wire::Node) -> SlimNode {
        let m = w.metadata.unwrap_or_default();
        let mut ips = Vec::new();
        for a in w.status.and_then(|s| s.addresses).into_iter().flatten() {
            if a.type_ == "InternalIP" || a.type_ == "ExternalIP" {
                push_new(&mut ips, &a.address);
            }
        }
        SlimNode {
            metadata: meta(m.name, None, m.resource_version),
            ips,
        }
    }
}

ferry_kubeclient::pod_resource!(SlimPod);
ferry_kubeclient::core_v1_resource!(
    SlimNamespace,
    "Namespace",
    "namespaces",
    ClusterResourceScope
);
ferry_kubeclient::core_v1_resource!(SlimNode, "Node", "nodes", ClusterResourceScope);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::Resource;
    use serde_json::{Value, json};

    fn pods() -> Vec<Value> {
        vec![
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "a", "namespace": "x", "resourceVersion": "7", "uid": "u",
                    "labels": {"pod": "a", "app": "web"}, "annotations": {"k": "v"},
                    "managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}}}]},
                "spec": {"nodeName": "n1", "restartPolicy": "Always", "containers": [
                    {"name": "c", "image": "i", "ports": [
                        {"name": "serve-80-tcp", "containerPort": 80},
                        {"name": "serve-81-udp", "containerPort": 81, "protocol": "UDP"},
                        {"containerPort": 82},
                        {"name": "big", "containerPort": 70000}]},
                    {"name": "d", "image": "i", "ports": [{"name": "sctp", "containerPort": 9, "protocol": "SCTP"}]}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1",
                    "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}, {"ip": "10.0.0.1"}],
                    "conditions": [{"type": "Ready", "status": "True"}]}
            }),
            // Only podIP; host network; finished.
            json!({"metadata": {"name": "b", "namespace": "y", "labels": null},
                "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "i", "ports": null}]},
                "status": {"phase": "Succeeded", "podIP": "198.18.0.1", "podIPs": null}}),
            // Nothing yet: no node, no status.
            json!({"metadata": {"name": "c", "namespace": "z"}, "spec": {"containers": []}}),
        ]
    }

    #[test]
    fn decoding_equals_the_reduction_of_the_full_pod() {
        for v in pods() {
            let full: Pod = serde_json::from_value(v.clone()).unwrap();
            let slim: SlimPod = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(slim, SlimPod::from(&full), "{v}");
        }
        let a: SlimPod = serde_json::from_value(pods()[0].clone()).unwrap();
        assert_eq!(a.metadata.resource_version.as_deref(), Some("7"));
        assert!(a.metadata.annotations.is_none() && a.metadata.managed_fields.is_none());
        assert_eq!(
            a.ips,
            [
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        let names: Vec<&str> = a.ports.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["serve-80-tcp", "serve-81-udp", "sctp"]);
        assert_eq!(a.ports[1].proto, Proto::Udp);
        assert_eq!(a.ports[2].proto, Proto::Sctp);
        let b: SlimPod = serde_json::from_value(pods()[1].clone()).unwrap();
        assert!(b.host_network && b.finished && b.labels.is_empty());
        assert_eq!(b.ips, ["198.18.0.1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn namespaces_and_nodes_decode_slim() {
        let v = json!({"metadata": {"name": "x", "resourceVersion": "3", "labels": {"team": "a"},
            "annotations": {"k": "v"}}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        let full: Namespace = serde_json::from_value(v.clone()).unwrap();
        let slim: SlimNamespace = serde_json::from_value(v).unwrap();
        assert_eq!(slim, SlimNamespace::from(&full));
        assert_eq!(slim.labels.get("team").map(String::as_str), Some("a"));

        let v = json!({"metadata": {"name": "n1", "resourceVersion": "4"}, "status": {
            "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "198.18.0.1"},
                {"type": "ExternalIP", "address": "fd00::1"}, {"type": "InternalIP", "address": "198.18.0.1"}],
            "images": [{"names": ["a"], "sizeBytes": 1}]}});
        let full: Node = serde_json::from_value(v.clone()).unwrap();
        let slim: SlimNode = serde_json::from_value(v).unwrap();
        assert_eq!(slim, SlimNode::from(&full));
        assert_eq!(slim.ips.len(), 2);
    }

    #[test]
    fn a_watch_event_and_a_list_decode_into_slim_objects() {
        let ev: kube::core::WatchEvent<SlimPod> =
            serde_json::from_value(json!({"type": "MODIFIED", "object": pods()[0].clone()}))
                .unwrap();
        let kube::core::WatchEvent::Modified(p) = ev else {
            panic!("not Modified")
        };
        assert_eq!(p.metadata.name.as_deref(), Some("a"));
        let list: kube::core::ObjectList<SlimPod> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": pods()
        }))
        .unwrap();
        assert_eq!(list.items.len(), 3);
        assert_eq!(SlimPod::kind(&()), "Pod");
        assert_eq!(SlimNamespace::plural(&()), "namespaces");
    }

    use proptest::prelude::*;

    fn opt<T: Strategy>(t: T) -> impl Strategy<Value = Option<T::Value>>
    where
        T::Value: std::fmt::Debug,
    {
        prop::option::of(t)
    }

    /// Pods as the API serves them, with the fields the projection reads present, absent or
    /// `null`, and fields it skips.
    fn pod_json() -> impl Strategy<Value = Value> {
        let ip = prop_oneof![
            (0u8..4).prop_map(|i| format!("10.0.0.{i}")),
            (0u8..3).prop_map(|i| format!("fd00::{i}")),
            Just("not-an-ip".to_string()),
        ];
        let port = (
            opt(prop_oneof![
                Just("http".to_string()),
                Just("dns".to_string()),
                Just(String::new())
            ]),
            prop_oneof![Just(0i32), Just(53), Just(8080), Just(65535), Just(70000)],
            opt(prop_oneof![
                Just("TCP"),
                Just("UDP"),
                Just("SCTP"),
                Just("udp"),
                Just("ICMP")
            ]),
        )
            .prop_map(|(name, n, proto)| {
                let mut p = json!({"containerPort": n});
                if let Some(name) = name {
                    p["name"] = json!(name);
                }
                if let Some(proto) = proto {
                    p["protocol"] = json!(proto);
                }
                p
            });
        let container = opt(prop::collection::vec(port, 0..3)).prop_map(|ports| {
            let mut c = json!({"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]});
            if let Some(ports) = ports {
                c["ports"] = json!(ports);
            }
            c
        });
        (
            opt(prop::collection::btree_map("[a-c]", "[x-z]{0,2}", 0..3)),
            opt(prop_oneof![Just("n1"), Just("n2")]),
            opt(any::<bool>()),
            prop::collection::vec(container, 0..3),
            opt(prop_oneof![
                Just("Pending"),
                Just("Running"),
                Just("Succeeded"),
                Just("Failed")
            ]),
            opt(ip.clone()),
            opt(prop::collection::vec(ip, 0..3)),
            any::<bool>(),
        )
            .prop_map(
                |(labels, node, host, containers, phase, pod_ip, pod_ips, nulls)| {
                    let mut v = json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "p", "namespace": "x", "resourceVersion": "1",
                            "annotations": {"a": "b"}},
                        "spec": {"containers": containers, "restartPolicy": "Always"},
                        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                    });
                    // Absent, or `null` (both read as absent).
                    let set = |v: &mut Value, path: &[&str], x: Option<Value>| {
                        if x.is_none() && !nulls {
                            return;
                        }
                        let slot = path.iter().fold(v, |v, k| &mut v[*k]);
                        *slot = x.unwrap_or(Value::Null);
                    };
                    set(&mut v, &["metadata", "labels"], labels.map(|l| json!(l)));
                    set(&mut v, &["spec", "nodeName"], node.map(|n| json!(n)));
                    set(&mut v, &["spec", "hostNetwork"], host.map(|h| json!(h)));
                    set(&mut v, &["status", "phase"], phase.map(|p| json!(p)));
                    set(&mut v, &["status", "podIP"], pod_ip.map(|i| json!(i)));
                    set(
                        &mut v,
                        &["status", "podIPs"],
                        pod_ips.map(|ips| {
                            json!(ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>())
                        }),
                    );
                    v
                },
            )
    }

    proptest! {
        /// Decoding the JSON as a slim Pod gives what reducing the full k8s-openapi Pod gives.
        #[test]
        fn slim_decoding_matches_the_full_pod(v in pod_json()) {
            let full: Pod = serde_json::from_value(v.clone()).unwrap();
            let slim: SlimPod = serde_json::from_value(v.clone()).unwrap();
            prop_assert_eq!(slim, SlimPod::from(&full), "{}", v);
        }
    }
}
