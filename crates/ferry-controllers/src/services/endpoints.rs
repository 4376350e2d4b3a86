//! The Endpoints builder (no IO): subsets of addresses / notReadyAddresses grouped by resolved
//! port set, for the Service's primary family; capped at 1000 addresses with the
//! `endpoints.kubernetes.io/over-capacity: truncated` annotation (upstream's proportional
//! truncation, ready addresses kept first).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::runtime::SlimPod;

use super::desired::{
    HEADLESS, address_types, endpoint_ports, is_headless, pod_ip, pod_ready, pod_terminating,
    port_key, should_set_hostname,
};

pub const MAX_CAPACITY: usize = 1000;
pub const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";

/// The Endpoints object the controller wants for `svc` and its selected pods.
pub fn build(svc: &Service, pods: &[&SlimPod]) -> Endpoints {
    let family = address_types(svc).into_iter().next().unwrap_or_default();
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let mut groups: BTreeMap<
        _,
        (
            Vec<EndpointPort>,
            Vec<EndpointAddress>,
            Vec<EndpointAddress>,
        ),
    > = BTreeMap::new();
    for pod in pods {
        let terminal = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
        if terminal || (pod_terminating(pod) && !publish) {
            continue;
        }
        let Some(ip) = pod_ip(pod, &family) else {
            continue;
        };
        let ports = endpoint_ports(svc, pod);
        let addr = EndpointAddress {
            ip,
            hostname: should_set_hostname(pod, svc)
                .then(|| pod.spec.as_ref().and_then(|s| s.hostname.clone()))
                .flatten(),
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: pod.metadata.namespace.clone(),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
                ..Default::default()
            }),
        };
        let g = groups.entry(port_key(&ports)).or_insert_with(|| {
            let p = ports
                .iter()
                .map(|p| EndpointPort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    port: p.port.unwrap_or(0),
                    protocol: p.protocol.clone(),
                    app_protocol: p.app_protocol.clone(),
                })
                .collect();
            (p, Vec::new(), Vec::new())
        });
        if publish || pod_ready(pod) {
            g.1.push(addr);
        } else {
            g.2.push(addr);
        }
    }
    let mut subsets: Vec<EndpointSubset> = groups
        .into_values()
        .map(|(ports, mut ready, mut not_ready)| {
            ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            not_ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            EndpointSubset {
                addresses: (!ready.is_empty()).then_some(ready),
                not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect();
    let truncated = truncate(&mut subsets);
    let mut labels = svc.metadata.labels.clone().unwrap_or_default();
    labels.remove(HEADLESS);
    if is_headless(svc) {
        labels.insert(HEADLESS.into(), String::new());
    }
    let annotations =
        truncated.then(|| BTreeMap::from([(OVER_CAPACITY.to_string(), "truncated".to_string())]));
    Endpoints {
        metadata: ObjectMeta {
            name: svc.metadata.name.clone(),
            namespace: svc.metadata.namespace.clone(),
            labels: (!labels.is_empty()).then_some(labels),
            annotations,
            ..Default::default()
        },
        subsets: (!subsets.is_empty()).then_some(subsets),
    }
}

fn len(v: &Option<Vec<EndpointAddress>>) -> usize {
    v.as_ref().map_or(0, Vec::len)
}

/// Caps the subsets at [`MAX_CAPACITY`] addresses; true when anything was cut.
pub fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let ready: usize = subsets.iter().map(|s| len(&s.addresses)).sum();
    let not_ready: usize = subsets.iter().map(|s| len(&s.not_ready_addresses)).sum();
    if ready + not_ready <= MAX_CAPACITY {
        return false;
    }
    let truncate_ready = ready > MAX_CAPACITY;
    let (max, total) = if truncate_ready {
        (MAX_CAPACITY, ready)
    } else {
        (MAX_CAPACITY - ready, not_ready)
    };
    let mut room = max;
    for s in subsets.iter_mut() {
        let n = if truncate_ready {
            len(&s.addresses)
        } else {
            len(&s.not_ready_addresses)
        };
        let share = ((n as f64 / total as f64) * max as f64).ceil() as usize;
        let take = share.min(room);
        if truncate_ready {
            if let Some(a) = s.addresses.as_mut() {
                a.truncate(take);
            }
            s.not_ready_addresses = None;
            room -= len(&s.addresses);
        } else {
            if let Some(a) = s.not_ready_addresses.as_mut() {
                a.truncate(take);
            }
            room -= len(&s.not_ready_addresses);
        }
    }
    true
}

/// Whether two Endpoints differ in what the controller manages.
pub fn differs(a: &Endpoints, b: &Endpoints) -> bool {
    a.subsets.clone().unwrap_or_default() != b.subsets.clone().unwrap_or_default()
        || a.metadata.labels.clone().unwrap_or_default()
            != b.metadata.labels.clone().unwrap_or_default()
        || a.metadata
            .annotations
            .as_ref()
            .and_then(|m| m.get(OVER_CAPACITY))
            != b.metadata
                .annotations
                .as_ref()
                .and_then(|m| m.get(OVER_CAPACITY))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::desired::tests::{pod, service};
    use super::*;
    use serde_json::json;

    fn pods(n: usize, ready: bool) -> Vec<SlimPod> {
        (0..n)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    &format!("10.{}.{}.{}", ready as u8, i / 250, i % 250 + 1),
                    ready,
                )
            })
            .collect()
    }

    #[test]
    fn ready_and_not_ready() {
        let svc = service("web", json!({}));
        let mut ps = pods(3, true);
        ps.extend(pods(2, false));
        let refs: Vec<&SlimPod> = ps.iter().collect();
        let e = build(&svc, &refs);
        let s = &e.subsets.unwrap()[0];
        assert_eq!(len(&s.addresses), 3);
        assert_eq!(len(&s.not_ready_addresses), 2);
        assert_eq!(s.ports.as_ref().unwrap()[0].port, 8080);
        assert!(e.metadata.annotations.is_none());
    }

    #[test]
    fn over_capacity_1500() {
        let svc = service("web", json!({}));
        let ps = pods(1500, true);
        let refs: Vec<&SlimPod> = ps.iter().collect();
        let e = build(&svc, &refs);
        let total: usize = e
            .subsets
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| len(&s.addresses) + len(&s.not_ready_addresses))
            .sum();
        assert_eq!(total, 1000);
        assert_eq!(e.metadata.annotations.unwrap()[OVER_CAPACITY], "truncated");
    }

    #[test]
    fn truncation_keeps_ready_first() {
        let svc = service("web", json!({}));
        let mut ps = pods(900, true);
        ps.extend(pods(300, false));
        let refs: Vec<&SlimPod> = ps.iter().collect();
        let e = build(&svc, &refs);
        let s = &e.subsets.unwrap()[0];
        assert_eq!(len(&s.addresses), 900);
        assert_eq!(len(&s.not_ready_addresses), 100);
    }

    #[test]
    fn terminating_excluded_unless_publish() {
        let mut p = pod("p", "10.0.0.1", true);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        let e = build(&service("web", json!({})), &[&p]);
        assert!(e.subsets.is_none());
        let e = build(
            &service("web", json!({"publishNotReadyAddresses": true})),
            &[&p],
        );
        assert_eq!(len(&e.subsets.unwrap()[0].addresses), 1);
    }
}
