//! The minimal scheduler's choice for one pod. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, VolumeNodeAffinity};

/// A taint or toleration, reduced to what filtering needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toleration {
    pub key: String,
    /// `Exists` or `Equal` (default).
    pub operator: String,
    pub value: String,
    /// Empty matches every effect.
    pub effect: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ready: bool,
    pub unschedulable: bool,
    pub taints: Vec<Taint>,
    /// Non-terminal pods bound to it.
    pub pods: usize,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodNeeds {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// The node affinity of each PersistentVolume bound to the pod's claims.
    pub volume_affinity: Vec<VolumeNodeAffinity>,
}

/// The pod's claims as the scheduler sees them: the bound volumes' node affinity, and the
/// claims waiting for their first consumer (name, has a selected node already).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Volumes {
    pub affinity: Vec<VolumeNodeAffinity>,
    pub delayed: Vec<(String, bool)>,
}

/// Why a pod's claims keep it from being scheduled (upstream's VolumeBinding reasons).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct VolumeWait(pub String);

/// Upstream's VolumeBinding PreFilter: every claim exists and is not being deleted; a bound
/// claim's volume exists; an unbound claim is of a `WaitForFirstConsumer` class. `Err` is the
/// reason the pod waits.
pub fn pod_volumes(
    claims: &[&str],
    claim: &dyn Fn(&str) -> Option<PersistentVolumeClaim>,
    volume: &dyn Fn(&str) -> Option<PersistentVolume>,
    wait_for_consumer: &dyn Fn(&str) -> bool,
) -> Result<Volumes, VolumeWait> {
    let mut out = Volumes::default();
    for name in claims {
        let Some(c) = claim(name) else {
            return Err(VolumeWait(format!(
                "persistentvolumeclaim \"{name}\" not found"
            )));
        };
        if c.metadata.deletion_timestamp.is_some() {
            return Err(VolumeWait(format!(
                "persistentvolumeclaim \"{name}\" is being deleted"
            )));
        }
        let vn = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if !vn.is_empty() {
            let Some(v) = volume(&vn) else {
                return Err(VolumeWait(
                    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
                        .into(),
                ));
            };
            if let Some(a) = v.spec.and_then(|s| s.node_affinity) {
                out.affinity.push(a);
            }
            continue;
        }
        let class = crate::storage::binder_core::claim_class(&c);
        if !class.is_empty() && wait_for_consumer(&class) {
            out.delayed.push((
                name.to_string(),
                crate::storage::binder_core::selected_node(&c).is_some(),
            ));
        } else {
            return Err(VolumeWait(
                "pod has unbound immediate PersistentVolumeClaims".into(),
            ));
        }
    }
    Ok(out)
}

/// Why nodes were filtered out, for the FailedScheduling message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rejections {
    pub not_ready: usize,
    pub unschedulable: usize,
    pub selector: usize,
    pub taints: usize,
    pub volume_affinity: usize,
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if !t.effect.is_empty() && t.effect != taint.effect {
        return false;
    }
    if t.key.is_empty() {
        return t.operator == "Exists";
    }
    if t.key != taint.key {
        return false;
    }
    match t.operator.as_str() {
        "Exists" => true,
        _ => t.value == taint.value,
    }
}

/// The least loaded node (fewest pods, then lowest name) that is Ready, schedulable, matches the
/// node selector and whose NoSchedule/NoExecute taints are tolerated; or why none fits.
pub fn choose(pod: &PodNeeds, nodes: &[NodeInfo]) -> Result<String, Rejections> {
    let mut why = Rejections::default();
    let mut best: Option<&NodeInfo> = None;
    for n in nodes {
        if !n.ready {
            why.not_ready += 1;
            continue;
        }
        if n.unschedulable
            && !pod.tolerations.iter().any(|t| {
                tolerates(
                    t,
                    &Taint {
                        key: "node.kubernetes.io/unschedulable".into(),
                        value: String::new(),
                        effect: "NoSchedule".into(),
                    },
                )
            })
        {
            why.unschedulable += 1;
            continue;
        }
        if !pod
            .node_selector
            .iter()
            .all(|(k, v)| n.labels.get(k) == Some(v))
        {
            why.selector += 1;
            continue;
        }
        let untolerated = n.taints.iter().any(|taint| {
            taint.effect != "PreferNoSchedule"
                && !pod.tolerations.iter().any(|t| tolerates(t, taint))
        });
        if untolerated {
            why.taints += 1;
            continue;
        }
        if !pod
            .volume_affinity
            .iter()
            .all(|a| crate::storage::binder_core::node_fits(Some(a), &n.name, &n.labels))
        {
            why.volume_affinity += 1;
            continue;
        }
        if best.is_none_or(|b| (n.pods, &n.name) < (b.pods, &b.name)) {
            best = Some(n);
        }
    }
    best.map(|b| b.name.clone()).ok_or(why)
}

/// Upstream-style message: `0/3 nodes are available: 1 node(s) didn't match Pod's node
/// affinity/selector, 2 node(s) were not ready.`
pub fn message(total: usize, why: &Rejections) -> String {
    let mut parts = Vec::new();
    if why.selector > 0 {
        parts.push(format!(
            "{} node(s) didn't match Pod's node affinity/selector",
            why.selector
        ));
    }
    if why.taints > 0 {
        parts.push(format!("{} node(s) had untolerated taint(s)", why.taints));
    }
    if why.volume_affinity > 0 {
        parts.push(format!(
            "{} node(s) had volume node affinity conflict",
            why.volume_affinity
        ));
    }
    if why.unschedulable > 0 {
        parts.push(format!("{} node(s) were unschedulable", why.unschedulable));
    }
    if why.not_ready > 0 {
        parts.push(format!("{} node(s) were not ready", why.not_ready));
    }
    if parts.is_empty() {
        format!("0/{total} nodes are available.")
    } else {
        format!("0/{total} nodes are available: {}.", parts.join(", "))
    }
}

#[allow(clippy::type_complexity)]
#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: &[(&str, &str)], ready: bool, pods: usize) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ready,
            unschedulable: false,
            taints: vec![],
            pods,
        }
    }

    #[test]
    fn choose_table() {
        let mut cordoned = node("c", &[], true, 0);
        cordoned.unschedulable = true;
        let mut tainted = node("t", &[], true, 0);
        tainted.taints.push(Taint {
            key: "gpu".into(),
            value: "yes".into(),
            effect: "NoSchedule".into(),
        });
        let sel = |k: &str, v: &str| PodNeeds {
            node_selector: [(k.to_string(), v.to_string())].into(),
            tolerations: vec![],
            volume_affinity: vec![],
        };
        let tol = PodNeeds {
            volume_affinity: vec![],
            node_selector: BTreeMap::new(),
            tolerations: vec![Toleration {
                key: "gpu".into(),
                operator: "Equal".into(),
                value: "yes".into(),
                effect: String::new(),
            }],
        };
        let cases: Vec<(&str, PodNeeds, Vec<NodeInfo>, Result<String, Rejections>)> = vec![
            (
                "fewest pods",
                PodNeeds::default(),
                vec![node("a", &[], true, 3), node("b", &[], true, 1)],
                Ok("b".into()),
            ),
            (
                "tie by name",
                PodNeeds::default(),
                vec![node("b", &[], true, 1), node("a", &[], true, 1)],
                Ok("a".into()),
            ),
            (
                "not ready skipped",
                PodNeeds::default(),
                vec![node("a", &[], false, 0), node("b", &[], true, 9)],
                Ok("b".into()),
            ),
            (
                "selector",
                sel("disk", "ssd"),
                vec![
                    node("a", &[], true, 0),
                    node("b", &[("disk", "ssd")], true, 5),
                ],
                Ok("b".into()),
            ),
            (
                "nothing fits",
                sel("disk", "ssd"),
                vec![
                    node("a", &[], true, 0),
                    node("b", &[], false, 0),
                    cordoned.clone(),
                    tainted.clone(),
                ],
                Err(Rejections {
                    not_ready: 1,
                    unschedulable: 1,
                    selector: 2,
                    taints: 0,
                    volume_affinity: 0,
                }),
            ),
            (
                "taint tolerated",
                tol,
                vec![tainted.clone()],
                Ok("t".into()),
            ),
            (
                "taint not tolerated",
                PodNeeds::default(),
                vec![tainted],
                Err(Rejections {
                    taints: 1,
                    ..Default::default()
                }),
            ),
            (
                "no nodes",
                PodNeeds::default(),
                vec![],
                Err(Rejections::default()),
            ),
        ];
        for (name, pod, nodes, want) in cases {
            assert_eq!(choose(&pod, &nodes), want, "{name}");
        }
    }

    #[test]
    fn message_format() {
        assert_eq!(
            message(
                3,
                &Rejections {
                    selector: 1,
                    not_ready: 2,
                    ..Default::default()
                }
            ),
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) were not ready."
        );
        assert_eq!(
            message(0, &Rejections::default()),
            "0/0 nodes are available."
        );
    }

    proptest::proptest! {
        /// The chosen node is always eligible and no eligible node has fewer pods.
        #[test]
        fn chosen_is_least_loaded(loads in proptest::collection::vec((0usize..5, proptest::bool::ANY), 0..8)) {
            let nodes: Vec<NodeInfo> = loads.iter().enumerate()
                .map(|(i, (p, r))| node(&format!("n{i}"), &[], *r, *p)).collect();
            match choose(&PodNeeds::default(), &nodes) {
                Ok(n) => {
                    let chosen = nodes.iter().find(|x| x.name == n).map(|x| x.pods).unwrap_or(usize::MAX);
                    proptest::prop_assert!(nodes.iter().filter(|x| x.ready).all(|x| x.pods >= chosen));
                }
                Err(_) => proptest::prop_assert!(nodes.iter().all(|x| !x.ready)),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod volume_tests {
    use super::*;
    use serde_json::json;

    fn claim(v: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pod_volumes_table() {
        let bound = claim(json!({"metadata": {"name": "a"}, "spec": {"volumeName": "pv-a"}}));
        let wffc =
            claim(json!({"metadata": {"name": "b"}, "spec": {"storageClassName": "local-path"}}));
        let selected = claim(
            json!({"metadata": {"name": "s", "annotations": {"volume.kubernetes.io/selected-node": "n1"}},
            "spec": {"storageClassName": "local-path"}}),
        );
        let immediate =
            claim(json!({"metadata": {"name": "c"}, "spec": {"storageClassName": "fast"}}));
        let orphan = claim(json!({"metadata": {"name": "o"}, "spec": {"volumeName": "gone"}}));
        let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pv-a"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}]}}}})).unwrap();
        let claims = [bound, wffc, selected, immediate, orphan];
        let lookup = |n: &str| {
            claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(n))
                .cloned()
        };
        let vol = |n: &str| (n == "pv-a").then(|| pv.clone());
        let wait = |c: &str| c == "local-path";
        let ok = pod_volumes(&["a", "b", "s"], &lookup, &vol, &wait).unwrap();
        assert_eq!(ok.affinity.len(), 1);
        assert_eq!(
            ok.delayed,
            vec![("b".to_string(), false), ("s".to_string(), true)]
        );
        assert_eq!(
            pod_volumes(&["x"], &lookup, &vol, &wait),
            Err(VolumeWait("persistentvolumeclaim \"x\" not found".into()))
        );
        assert_eq!(
            pod_volumes(&["c"], &lookup, &vol, &wait),
            Err(VolumeWait(
                "pod has unbound immediate PersistentVolumeClaims".into()
            ))
        );
        assert!(pod_volumes(&["o"], &lookup, &vol, &wait).is_err());
        // The bound volume's affinity pins the pod to n2.
        let node = |name: &str| NodeInfo {
            name: name.into(),
            labels: [("kubernetes.io/hostname".to_string(), name.to_string())].into(),
            ready: true,
            unschedulable: false,
            taints: vec![],
            pods: 0,
        };
        let needs = PodNeeds {
            volume_affinity: ok.affinity,
            ..Default::default()
        };
        assert_eq!(
            choose(&needs, &[node("n1"), node("n2")]),
            Ok("n2".to_string())
        );
        let why = choose(&needs, &[node("n1")]).unwrap_err();
        assert_eq!(
            message(1, &why),
            "0/1 nodes are available: 1 node(s) had volume node affinity conflict."
        );
    }
}
