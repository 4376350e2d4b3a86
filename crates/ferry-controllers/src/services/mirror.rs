//! EndpointSlice mirroring (no IO): Endpoints a user wrote for a Service without a selector are
//! mirrored into EndpointSlices, one group per subset port set and address family, at most 1000
//! addresses per subset. Not mirrored (seed 004 §8): Endpoints labelled
//! `endpointslice.kubernetes.io/skip-mirror: "true"`, Endpoints with the
//! `control-plane.alpha.kubernetes.io/leader` annotation, Endpoints whose Service does not exist,
//! and Endpoints whose Service has a selector.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::desired::{IPV4, IPV6, PortKey, port_key, selector, sort_ports};
use super::slices::{MANAGED_BY_LABEL, Plan, SERVICE_NAME_LABEL, owner_ref};

pub const MIRROR_CONTROLLER: &str = "endpointslicemirroring-controller.k8s.io";
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
pub const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";
pub const MAX_PER_SUBSET: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    SkipLabel,
    LeaderAnnotation,
    NoService,
    ServiceHasSelector,
}

/// Why `ep` is not mirrored, if it is not.
pub fn skip_reason(ep: &Endpoints, svc: Option<&Service>) -> Option<Skip> {
    if ep
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SKIP_MIRROR_LABEL))
        .is_some_and(|v| v == "true")
    {
        return Some(Skip::SkipLabel);
    }
    if ep
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(LEADER_ANNOTATION))
    {
        return Some(Skip::LeaderAnnotation);
    }
    let Some(svc) = svc else {
        return Some(Skip::NoService);
    };
    if selector(svc).is_some() {
        return Some(Skip::ServiceHasSelector);
    }
    None
}

fn family(ip: &str) -> Option<&'static str> {
    match ip.parse::<IpAddr>().ok()? {
        IpAddr::V4(_) => Some(IPV4),
        IpAddr::V6(_) => Some(IPV6),
    }
}

fn to_endpoint(a: &EndpointAddress, ready: bool) -> Endpoint {
    Endpoint {
        addresses: vec![a.ip.clone()],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            ..Default::default()
        }),
        hostname: a.hostname.clone().filter(|h| !h.is_empty()),
        node_name: a.node_name.clone().filter(|n| !n.is_empty()),
        target_ref: a.target_ref.clone(),
        ..Default::default()
    }
}

/// Desired mirrored endpoints grouped by (address type, port set).
pub fn desired(ep: &Endpoints) -> BTreeMap<(String, PortKey), (Vec<EndpointPort>, Vec<Endpoint>)> {
    let mut out: BTreeMap<(String, PortKey), (Vec<EndpointPort>, Vec<Endpoint>)> = BTreeMap::new();
    for ss in ep.subsets.iter().flatten() {
        let mut ports: Vec<EndpointPort> = ss
            .ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        sort_ports(&mut ports);
        let pk = port_key(&ports);
        let addrs = ss
            .addresses
            .iter()
            .flatten()
            .map(|a| (a, true))
            .chain(ss.not_ready_addresses.iter().flatten().map(|a| (a, false)))
            .take(MAX_PER_SUBSET);
        for (a, ready) in addrs {
            let Some(f) = family(&a.ip) else { continue };
            let g = out
                .entry((f.to_string(), pk.clone()))
                .or_insert_with(|| (ports.clone(), Vec::new()));
            if !g.1.iter().any(|e| e.addresses == [a.ip.clone()]) {
                g.1.push(to_endpoint(a, ready));
            }
        }
    }
    out
}

fn labels(ep: &Endpoints, svc_name: &str) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = ep
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != MANAGED_BY_LABEL && k != SERVICE_NAME_LABEL)
        .collect();
    l.insert(SERVICE_NAME_LABEL.into(), svc_name.into());
    l.insert(MANAGED_BY_LABEL.into(), MIRROR_CONTROLLER.into());
    l
}

/// Mirrored slices to write for `ep` (`existing`: the mirrored slices of its Service). With
/// `mirror` false every existing mirrored slice is deleted.
pub fn reconcile(ep: &Endpoints, mirror: bool, existing: &[EndpointSlice]) -> Plan {
    let mut plan = Plan::default();
    let name = ep.metadata.name.clone().unwrap_or_default();
    let want = if mirror { desired(ep) } else { BTreeMap::new() };
    let labels = labels(ep, &name);
    let owner = owner_ref("v1", "Endpoints", &ep.metadata);
    let mut pool: Vec<&EndpointSlice> = existing.iter().collect();
    pool.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for ((at, pk), (ports, eps)) in &want {
        for chunk in eps.chunks(MAX_PER_SUBSET) {
            let idx = pool.iter().position(|s| {
                s.address_type == *at && port_key(s.ports.as_deref().unwrap_or(&[])) == *pk
            });
            let ports_opt = (!ports.is_empty()).then(|| ports.clone());
            match idx {
                Some(i) => {
                    let s = pool.remove(i);
                    if super::slices::eps(s) != chunk
                        || s.metadata.labels.as_ref() != Some(&labels)
                        || s.ports != ports_opt
                    {
                        let mut u = s.clone();
                        u.endpoints = Some(chunk.to_vec());
                        u.ports = ports_opt;
                        u.metadata.labels = Some(labels.clone());
                        u.metadata.owner_references = Some(vec![owner.clone()]);
                        plan.update.push(u);
                    }
                }
                None => {
                    let mut prefix: String = name.chars().take(57).collect();
                    prefix.push('-');
                    plan.create.push(EndpointSlice {
                        metadata: ObjectMeta {
                            generate_name: Some(prefix),
                            namespace: ep.metadata.namespace.clone(),
                            labels: Some(labels.clone()),
                            owner_references: Some(vec![owner.clone()]),
                            ..Default::default()
                        },
                        address_type: at.clone(),
                        ports: ports_opt,
                        endpoints: Some(chunk.to_vec()),
                    });
                }
            }
        }
    }
    plan.delete.extend(pool.into_iter().cloned());
    plan
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eps(extra_meta: serde_json::Value, n: usize) -> Endpoints {
        let addrs: Vec<serde_json::Value> = (0..n)
            .map(|i| json!({"ip": format!("10.9.{}.{}", i / 250, i % 250 + 1)}))
            .collect();
        let mut v = json!({
            "metadata": {"name": "ext", "namespace": "default", "uid": "u1"},
            "subsets": [
                {"addresses": addrs, "notReadyAddresses": [{"ip": "fd00::9"}],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
                {"addresses": [{"ip": "10.8.0.1"}], "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}
            ]
        });
        for (k, val) in extra_meta.as_object().unwrap() {
            v["metadata"][k] = val.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn svc(selector: bool) -> Service {
        let mut v = json!({"metadata": {"name": "ext", "namespace": "default"}, "spec": {"ports": [{"port": 80}]}});
        if selector {
            v["spec"]["selector"] = json!({"app": "x"});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn skip_rules() {
        let s = svc(false);
        assert_eq!(skip_reason(&eps(json!({}), 2), Some(&s)), None);
        assert_eq!(
            skip_reason(
                &eps(json!({"labels": {SKIP_MIRROR_LABEL: "true"}}), 2),
                Some(&s)
            ),
            Some(Skip::SkipLabel)
        );
        assert_eq!(
            skip_reason(
                &eps(json!({"annotations": {LEADER_ANNOTATION: "{}"}}), 2),
                Some(&s)
            ),
            Some(Skip::LeaderAnnotation)
        );
        assert_eq!(skip_reason(&eps(json!({}), 2), None), Some(Skip::NoService));
        assert_eq!(
            skip_reason(&eps(json!({}), 2), Some(&svc(true))),
            Some(Skip::ServiceHasSelector)
        );
    }

    #[test]
    fn mirrors_per_subset_and_family() {
        let e = eps(json!({"labels": {"team": "a"}}), 3);
        let plan = reconcile(&e, true, &[]);
        // http/IPv4 (3 ready), http/IPv6 (1 not ready), dns/IPv4 (1).
        assert_eq!(plan.create.len(), 3);
        let v6 = plan.create.iter().find(|s| s.address_type == IPV6).unwrap();
        assert_eq!(
            super::super::slices::eps(v6)[0]
                .conditions
                .as_ref()
                .unwrap()
                .ready,
            Some(false)
        );
        for s in &plan.create {
            let l = s.metadata.labels.as_ref().unwrap();
            assert_eq!(l[MANAGED_BY_LABEL], MIRROR_CONTROLLER);
            assert_eq!(l[SERVICE_NAME_LABEL], "ext");
            assert_eq!(l["team"], "a");
            assert_eq!(
                s.metadata.owner_references.as_ref().unwrap()[0].kind,
                "Endpoints"
            );
        }
        // Steady state.
        let mut existing = plan.create.clone();
        for (i, s) in existing.iter_mut().enumerate() {
            s.metadata.name = Some(format!("m{i}"));
        }
        assert!(reconcile(&e, true, &existing).is_empty());
        // Not mirrored any more: all deleted.
        assert_eq!(reconcile(&e, false, &existing).delete.len(), 3);
    }

    #[test]
    fn at_most_1000_per_subset() {
        let e = eps(json!({}), 1200);
        let d = desired(&e);
        let http_v4 = d
            .iter()
            .find(|((at, pk), _)| at == IPV4 && pk[0].2 == 80)
            .unwrap();
        assert_eq!(http_v4.1.1.len(), 1000);
        // The not-ready IPv6 address was beyond the cap.
        assert!(!d.keys().any(|(at, _)| at == IPV6));
    }
}
