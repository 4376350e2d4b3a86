//! The EndpointSlice reconciler (no IO): desired endpoints + the slices this controller manages
//! for a Service -> slices to create, update and delete, with the fill rule of seed 004 §8:
//! 1. walk the existing slices, drop endpoints no longer wanted and refresh changed ones;
//! 2. fill the slices already being updated (fullest first) with new endpoints;
//! 3. put what is left into one previously unchanged slice it fits into (the tightest fit), or
//!    into new slices — one new slice is preferred over updating several.
//!
//! A Service without endpoints keeps one empty placeholder slice, as upstream does.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::desired::{Desired, PortKey, PortSet, address_types, is_headless, port_key};

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// The endpoints of a slice.
pub fn eps(s: &EndpointSlice) -> &[Endpoint] {
    s.endpoints.as_deref().unwrap_or(&[])
}

/// The endpoints of a slice, for changing.
pub fn eps_mut(s: &mut EndpointSlice) -> &mut Vec<Endpoint> {
    s.endpoints.get_or_insert_with(Vec::new)
}

/// What to write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<EndpointSlice>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// Identity of an endpoint across slices: its first address and target.
fn ep_key(ep: &Endpoint) -> (String, String) {
    (
        ep.addresses.first().cloned().unwrap_or_default(),
        ep.target_ref
            .as_ref()
            .and_then(|r| r.uid.clone().or_else(|| r.name.clone()))
            .unwrap_or_default(),
    )
}

/// Labels of a managed slice: the Service's labels, then the controller's own.
pub fn slice_labels(svc: &Service, managed_by: &str) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = svc
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != SERVICE_NAME_LABEL && k != MANAGED_BY_LABEL && k != HEADLESS_LABEL)
        .collect();
    l.insert(
        SERVICE_NAME_LABEL.into(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    l.insert(MANAGED_BY_LABEL.into(), managed_by.into());
    if is_headless(svc) {
        l.insert(HEADLESS_LABEL.into(), String::new());
    }
    l
}

/// The controller reference to the Service.
pub fn owner_ref(api_version: &str, kind: &str, meta: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A new slice for `svc` (named by the server from `generateName`).
pub fn new_slice(
    svc: &Service,
    address_type: &str,
    ports: &PortSet,
    labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
) -> EndpointSlice {
    let name = svc.metadata.name.clone().unwrap_or_default();
    // generateName keeps room for the 5-character suffix within 63 characters.
    let mut prefix: String = name.chars().take(57).collect();
    prefix.push('-');
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(prefix),
            namespace: svc.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        address_type: address_type.into(),
        ports: (!ports.is_empty()).then(|| ports.clone()),
        endpoints: Some(Vec::new()),
    }
}

fn meta_differs(
    s: &EndpointSlice,
    labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
) -> bool {
    s.metadata.labels.as_ref() != Some(labels)
        || s.metadata.owner_references.as_deref() != Some(std::slice::from_ref(owner))
}

fn slice_port_key(s: &EndpointSlice) -> PortKey {
    port_key(s.ports.as_deref().unwrap_or(&[]))
}

/// Reconciles the slices of one Service (`existing`: those this controller manages).
pub fn reconcile(
    svc: &Service,
    desired: &Desired,
    existing: &[EndpointSlice],
    max_per_slice: usize,
) -> Plan {
    let max = max_per_slice.max(1);
    let labels = slice_labels(svc, CONTROLLER_NAME);
    let owner = owner_ref("v1", "Service", &svc.metadata);
    let mut plan = Plan::default();
    let mut by_key: HashMap<(String, PortKey), Vec<&EndpointSlice>> = HashMap::new();
    let mut sorted: Vec<&EndpointSlice> = existing.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let total_desired: usize = desired.values().map(|(_, e)| e.len()).sum();
    let primary = address_types(svc)
        .first()
        .cloned()
        .unwrap_or_else(|| "IPv4".into());
    // The placeholder: kept (or made) only while there is nothing else.
    let mut placeholder_kept = false;
    for s in sorted {
        let key = (s.address_type.clone(), slice_port_key(s));
        if desired.contains_key(&key) {
            by_key.entry(key).or_default().push(s);
        } else if total_desired == 0
            && !placeholder_kept
            && eps(s).is_empty()
            && s.ports.as_ref().is_none_or(|p| p.is_empty())
            && s.address_type == primary
        {
            placeholder_kept = true;
            if meta_differs(s, &labels, &owner) {
                let mut u = s.clone();
                u.metadata.labels = Some(labels.clone());
                u.metadata.owner_references = Some(vec![owner.clone()]);
                plan.update.push(u);
            }
        } else {
            plan.delete.push(s.clone());
        }
    }
    for ((at, pk), (ports, wanted)) in desired {
        let slices = by_key
            .get(&(at.clone(), pk.clone()))
            .cloned()
            .unwrap_or_default();
        let mut want: HashMap<(String, String), &Endpoint> = HashMap::new();
        for e in wanted {
            want.entry(ep_key(e)).or_insert(e);
        }
        let mut to_update: Vec<EndpointSlice> = Vec::new();
        let mut unchanged: Vec<&EndpointSlice> = Vec::new();
        // 1. Refresh existing slices.
        for s in slices {
            let mut changed = meta_differs(s, &labels, &owner);
            let mut kept = Vec::with_capacity(eps(s).len());
            for e in eps(s) {
                match want.remove(&ep_key(e)) {
                    Some(d) => {
                        if d != e {
                            changed = true;
                        }
                        kept.push(d.clone());
                    }
                    None => changed = true,
                }
            }
            if kept.is_empty() {
                plan.delete.push(s.clone());
            } else if changed {
                let mut u = s.clone();
                u.endpoints = Some(kept);
                u.metadata.labels = Some(labels.clone());
                u.metadata.owner_references = Some(vec![owner.clone()]);
                u.ports = (!ports.is_empty()).then(|| ports.clone());
                to_update.push(u);
            } else {
                unchanged.push(s);
            }
        }
        // Remaining new endpoints, in desired order.
        let mut remaining: Vec<Endpoint> = wanted
            .iter()
            .filter(|e| want.remove(&ep_key(e)).is_some())
            .cloned()
            .collect();
        remaining.reverse(); // pop from the back = desired order
        // 2. Fill slices already being updated, fullest first.
        to_update.sort_by_key(|s| std::cmp::Reverse(eps(s).len()));
        for u in &mut to_update {
            while eps(u).len() < max {
                let Some(e) = remaining.pop() else { break };
                eps_mut(u).push(e);
            }
        }
        // 3. One unchanged slice the rest fits into, else new slices.
        let mut creates = Vec::new();
        while !remaining.is_empty() {
            let fit = (remaining.len() < max)
                .then(|| {
                    unchanged
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| max.saturating_sub(eps(s).len()) >= remaining.len())
                        .min_by_key(|(_, s)| max - eps(s).len())
                        .map(|(i, _)| i)
                })
                .flatten();
            let mut target = match fit {
                Some(i) => unchanged.remove(i).clone(),
                None => new_slice(svc, at, ports, &labels, &owner),
            };
            while eps(&target).len() < max {
                let Some(e) = remaining.pop() else { break };
                eps_mut(&mut target).push(e);
            }
            if target.metadata.name.is_some() {
                to_update.push(target);
            } else {
                creates.push(target);
            }
        }
        plan.update.extend(to_update);
        plan.create.extend(creates);
    }
    if total_desired == 0 && !placeholder_kept {
        plan.create
            .push(new_slice(svc, &primary, &Vec::new(), &labels, &owner));
    }
    // Reuse slices about to be deleted instead of creating new ones (same address type).
    let mut i = 0;
    while i < plan.create.len() {
        let at = plan.create[i].address_type.clone();
        if let Some(d) = plan.delete.iter().position(|d| d.address_type == at) {
            let old = plan.delete.remove(d);
            let mut c = plan.create.remove(i);
            c.metadata.name = old.metadata.name.clone();
            c.metadata.generate_name = old.metadata.generate_name.clone();
            c.metadata.resource_version = old.metadata.resource_version.clone();
            c.metadata.uid = old.metadata.uid.clone();
            plan.update.push(c);
        } else {
            i += 1;
        }
    }
    plan
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::desired::tests::{pod, service};
    use super::super::desired::{Desired, desired_endpoints};
    use super::*;
    use crate::runtime::SlimPod;
    use serde_json::json;
    use std::collections::HashSet;

    fn pods(n: usize) -> Vec<SlimPod> {
        (0..n)
            .map(|i| {
                pod(
                    &format!("p{i:04}"),
                    &format!("10.1.{}.{}", i / 250, i % 250 + 1),
                    true,
                )
            })
            .collect()
    }

    fn desired(svc: &Service, pods: &[SlimPod]) -> Desired {
        let refs: Vec<&SlimPod> = pods.iter().collect();
        desired_endpoints(svc, &refs, &|_| None)
    }

    /// Applies a plan to a slice list, naming created slices.
    fn apply(existing: &mut Vec<EndpointSlice>, plan: &Plan, counter: &mut usize) {
        for d in &plan.delete {
            existing.retain(|s| s.metadata.name != d.metadata.name);
        }
        for u in &plan.update {
            let i = existing
                .iter()
                .position(|s| s.metadata.name == u.metadata.name)
                .unwrap();
            existing[i] = u.clone();
        }
        for c in &plan.create {
            let mut c = c.clone();
            *counter += 1;
            c.metadata.name = Some(format!("s-{counter}"));
            existing.push(c);
        }
    }

    fn addrs(slices: &[EndpointSlice]) -> Vec<String> {
        let mut v: Vec<String> = slices
            .iter()
            .flat_map(|s| eps(s).iter().map(|e| e.addresses[0].clone()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn packs_250_into_three() {
        let svc = service("web", json!({}));
        let ps = pods(250);
        let plan = reconcile(&svc, &desired(&svc, &ps), &[], 100);
        assert_eq!(plan.create.len(), 3);
        let mut sizes: Vec<usize> = plan.create.iter().map(|s| eps(s).len()).collect();
        sizes.sort();
        assert_eq!(sizes, [50, 100, 100]);
        let mut slices = Vec::new();
        apply(&mut slices, &plan, &mut 0);
        let mut want: Vec<String> = ps
            .iter()
            .map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap())
            .collect();
        want.sort();
        assert_eq!(addrs(&slices), want);
        for s in &slices {
            let l = s.metadata.labels.as_ref().unwrap();
            assert_eq!(l[SERVICE_NAME_LABEL], "web");
            assert_eq!(l[MANAGED_BY_LABEL], CONTROLLER_NAME);
            let o = &s.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (o.kind.as_str(), o.controller, o.block_owner_deletion),
                ("Service", Some(true), Some(true))
            );
        }
        // Steady state: nothing to do.
        assert!(reconcile(&svc, &desired(&svc, &ps), &slices, 100).is_empty());
    }

    #[test]
    fn one_condition_change_is_one_update() {
        let svc = service("web", json!({}));
        let mut ps = pods(250);
        let mut slices = Vec::new();
        let mut n = 0;
        apply(
            &mut slices,
            &reconcile(&svc, &desired(&svc, &ps), &[], 100),
            &mut n,
        );
        ps[137]
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".into();
        let plan = reconcile(&svc, &desired(&svc, &ps), &slices, 100);
        assert!(plan.create.is_empty() && plan.delete.is_empty());
        assert_eq!(plan.update.len(), 1);
        let ep = eps(&plan.update[0])
            .iter()
            .find(|e| e.addresses[0] == ps[137].status.as_ref().unwrap().pod_ip.clone().unwrap())
            .unwrap();
        assert_eq!(ep.conditions.as_ref().unwrap().ready, Some(false));
    }

    #[test]
    fn prefers_one_new_slice_over_many_updates() {
        // Two slices with 5 free places each; 10 new endpoints -> one new slice (seed §8).
        let svc = service("web", json!({}));
        let ps = pods(30);
        let mut slices = Vec::new();
        let mut n = 0;
        apply(
            &mut slices,
            &reconcile(&svc, &desired(&svc, &ps[..10]), &[], 10),
            &mut n,
        );
        let plan = reconcile(&svc, &desired(&svc, &ps[..20]), &slices, 10);
        apply(&mut slices, &plan, &mut n);
        assert_eq!(slices.len(), 2);
        // Make room: remove one endpoint from each... instead use max 15 with 2 slices of 10.
        let plan = reconcile(&svc, &desired(&svc, &ps), &slices, 15);
        assert_eq!(plan.update.len(), 0, "{plan:?}");
        assert_eq!(plan.create.len(), 1);
        assert_eq!(eps(&plan.create[0]).len(), 10);
    }

    #[test]
    fn small_remainder_goes_into_tightest_unchanged_slice() {
        let svc = service("web", json!({}));
        let ps = pods(30);
        let mut slices = Vec::new();
        let mut n = 0;
        apply(
            &mut slices,
            &reconcile(&svc, &desired(&svc, &ps[..10]), &[], 10),
            &mut n,
        );
        let plan = reconcile(&svc, &desired(&svc, &ps[..20]), &slices, 10);
        apply(&mut slices, &plan, &mut n);
        // Capacity 14: room 4 in each; 3 new endpoints fit into one unchanged slice.
        let plan = reconcile(&svc, &desired(&svc, &ps[..23]), &slices, 14);
        assert!(plan.create.is_empty());
        assert_eq!(plan.update.len(), 1);
        assert_eq!(eps(&plan.update[0]).len(), 13);
    }

    #[test]
    fn removals_then_fill_updated_slices() {
        let svc = service("web", json!({}));
        let ps = pods(200);
        let mut slices = Vec::new();
        let mut n = 0;
        apply(
            &mut slices,
            &reconcile(&svc, &desired(&svc, &ps[..200]), &[], 100),
            &mut n,
        );
        // Remove 5 pods from the first slice's range, add 5 new ones: no create, one update.
        let mut now: Vec<SlimPod> = ps[5..200].to_vec();
        now.extend(pods(205)[200..].iter().cloned());
        let plan = reconcile(&svc, &desired(&svc, &now), &slices, 100);
        assert!(plan.create.is_empty() && plan.delete.is_empty(), "{plan:?}");
        assert_eq!(plan.update.len(), 1);
        assert_eq!(eps(&plan.update[0]).len(), 100);
    }

    #[test]
    fn empty_service_has_one_placeholder() {
        let svc = service("web", json!({}));
        let plan = reconcile(&svc, &Desired::new(), &[], 100);
        assert_eq!(plan.create.len(), 1);
        assert!(eps(&plan.create[0]).is_empty() && plan.create[0].ports.is_none());
        let mut slices = Vec::new();
        apply(&mut slices, &plan, &mut 0);
        assert!(reconcile(&svc, &Desired::new(), &slices, 100).is_empty());
        // Endpoints arrive: the placeholder is reused (updated), not deleted + created.
        let ps = pods(3);
        let plan = reconcile(&svc, &desired(&svc, &ps), &slices, 100);
        assert!(plan.create.is_empty() && plan.delete.is_empty());
        assert_eq!(plan.update.len(), 1);
    }

    #[test]
    fn duplicates_across_slices_are_dropped() {
        let svc = service("web", json!({}));
        let ps = pods(4);
        let mut slices = Vec::new();
        let mut n = 0;
        apply(
            &mut slices,
            &reconcile(&svc, &desired(&svc, &ps), &[], 100),
            &mut n,
        );
        let mut dup = slices[0].clone();
        dup.metadata.name = Some("dup".into());
        eps_mut(&mut dup).truncate(2);
        slices.push(dup);
        let plan = reconcile(&svc, &desired(&svc, &ps), &slices, 100);
        let mut after = slices.clone();
        apply(&mut after, &plan, &mut n);
        let a = addrs(&after);
        let uniq: HashSet<&String> = a.iter().collect();
        assert_eq!(a.len(), uniq.len());
        assert_eq!(a.len(), 4);
    }

    proptest::proptest! {
        #[test]
        fn union_is_exactly_the_desired(steps in proptest::collection::vec((0usize..120, 0usize..120), 1..6), max in 1usize..40) {
            let svc = service("web", json!({}));
            let all = pods(120);
            let mut slices = Vec::new();
            let mut n = 0;
            for (a, b) in steps {
                let (lo, hi) = (a.min(b), a.max(b));
                let cur: Vec<SlimPod> = all[lo..hi].to_vec();
                let plan = reconcile(&svc, &desired(&svc, &cur), &slices, max);
                apply(&mut slices, &plan, &mut n);
                let mut want: Vec<String> = cur.iter().map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap()).collect();
                want.sort();
                proptest::prop_assert_eq!(addrs(&slices), want);
                for s in &slices {
                    proptest::prop_assert!(eps(s).len() <= max);
                }
                if cur.is_empty() {
                    proptest::prop_assert_eq!(slices.len(), 1);
                }
                // Idempotent.
                proptest::prop_assert!(reconcile(&svc, &desired(&svc, &cur), &slices, max).is_empty());
            }
        }
    }
}
