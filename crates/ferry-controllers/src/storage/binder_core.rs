//! The PersistentVolume controller's decisions (upstream `pkg/controller/volume/persistentvolume`:
//! `syncClaim`, `syncVolume`, `findMatchingVolume`), the built-in `ferry.dev/local-path`
//! provisioner's volume, and the protection finalizers' release. Pure: state in, one plan out.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use ferry_api::quantity::{self, Quantity};

pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
/// The built-in provisioner and its default StorageClass.
pub const LOCAL_PATH_PROVISIONER: &str = "ferry.dev/local-path";
pub const LOCAL_PATH_CLASS: &str = "local-path";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

fn ann<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The class of a claim (`spec.storageClassName`, the beta annotation first as upstream).
pub fn claim_class(c: &PersistentVolumeClaim) -> String {
    ann(&c.metadata, ANN_BETA_STORAGE_CLASS)
        .map(String::from)
        .or_else(|| c.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
        .unwrap_or_default()
}

pub fn volume_class(v: &PersistentVolume) -> String {
    ann(&v.metadata, ANN_BETA_STORAGE_CLASS)
        .map(String::from)
        .or_else(|| v.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
        .unwrap_or_default()
}

pub fn claim_request(c: &PersistentVolumeClaim) -> Quantity {
    c.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| quantity::parse(&q.0).ok())
        .unwrap_or(Quantity { milli: 0 })
}

pub fn volume_capacity(v: &PersistentVolume) -> Quantity {
    v.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| quantity::parse(&q.0).ok())
        .unwrap_or(Quantity { milli: 0 })
}

fn mode_of(m: &Option<String>) -> &str {
    m.as_deref().unwrap_or("Filesystem")
}

fn phase_of_volume(v: &PersistentVolume) -> &str {
    v.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn phase_of_claim(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn claim_ref(v: &PersistentVolume) -> Option<&ObjectReference> {
    v.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
}

/// `IsVolumeBoundToClaim`: the volume's claimRef names the claim (and its uid, when set).
pub fn bound_to(v: &PersistentVolume, c: &PersistentVolumeClaim) -> bool {
    let Some(r) = claim_ref(v) else {
        return false;
    };
    r.name == c.metadata.name
        && r.namespace == c.metadata.namespace
        && (r.uid.as_deref().unwrap_or("").is_empty() || r.uid == c.metadata.uid)
}

/// Does a node (name and labels) satisfy a volume's required node affinity? (Terms are ORed,
/// the requirements of a term ANDed; `matchFields` know `metadata.name`.)
pub fn node_fits(
    affinity: Option<&VolumeNodeAffinity>,
    node: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(terms) = affinity
        .and_then(|a| a.required.as_ref())
        .map(|r| &r.node_selector_terms)
    else {
        return true;
    };
    let req = |r: &NodeSelectorRequirement, value: Option<&str>| {
        let values = r.values.as_deref().unwrap_or_default();
        match r.operator.as_str() {
            "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
            "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "Gt" | "Lt" => {
                let (Some(v), Some(x)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    values.first().and_then(|x| x.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if r.operator == "Gt" { v > x } else { v < x }
            }
            _ => false,
        }
    };
    let term_fits = |t: &NodeSelectorTerm| {
        let exprs = t.match_expressions.as_deref().unwrap_or_default();
        let fields = t.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        exprs
            .iter()
            .all(|r| req(r, labels.get(&r.key).map(String::as_str)))
            && fields
                .iter()
                .all(|r| r.key == "metadata.name" && req(r, Some(node)))
    };
    terms.iter().any(term_fits)
}

/// The node a claim waits for (`WaitForFirstConsumer`): its selected-node annotation.
pub fn selected_node(c: &PersistentVolumeClaim) -> Option<&str> {
    ann(&c.metadata, ANN_SELECTED_NODE).filter(|n| !n.is_empty())
}

/// Upstream's `FindMatchingVolume`: a volume already bound to the claim, else the smallest
/// Available volume of the claim's class whose capacity, access modes, volume mode and labels
/// (the claim's selector) fit, and, with a node, whose node affinity admits it. `delay`: the
/// class waits for the first consumer and no node is known yet — only volumes pre-bound to the
/// claim are taken.
pub fn find_matching_volume<'a>(
    c: &PersistentVolumeClaim,
    volumes: &'a [&'a PersistentVolume],
    node: Option<(&str, &BTreeMap<String, String>)>,
    delay: bool,
) -> Option<&'a PersistentVolume> {
    let spec = c.spec.clone().unwrap_or_default();
    let want = claim_request(c);
    let class = claim_class(c);
    let modes = spec.access_modes.clone().unwrap_or_default();
    let selector = spec
        .selector
        .as_ref()
        .map(ferry_api::selectors::from_label_selector);
    let mut best: Option<&PersistentVolume> = None;
    for &v in volumes {
        let vs = v.spec.clone().unwrap_or_default();
        if mode_of(&vs.volume_mode) != mode_of(&spec.volume_mode) {
            continue;
        }
        let cap = volume_capacity(v);
        if cap < want || v.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let affinity_ok =
            node.is_none_or(|(n, labels)| node_fits(vs.node_affinity.as_ref(), n, labels));
        if bound_to(v, c) {
            if !affinity_ok {
                return None;
            }
            return Some(v);
        }
        if node.is_none() && delay {
            continue;
        }
        if phase_of_volume(v) == "Released" || vs.claim_ref.is_some() {
            continue;
        }
        let empty = BTreeMap::new();
        match &selector {
            Some(Ok(sel)) if !sel.matches(v.metadata.labels.as_ref().unwrap_or(&empty)) => {
                continue;
            }
            Some(Err(_)) => continue,
            _ => {}
        }
        if volume_class(v) != class || !affinity_ok {
            continue;
        }
        let vmodes = vs.access_modes.clone().unwrap_or_default();
        if !modes.iter().all(|m| vmodes.contains(m)) {
            continue;
        }
        if best.is_none_or(|b| volume_capacity(b) > cap) {
            best = Some(v);
        }
    }
    best
}

/// What the controller does for one claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimPlan {
    /// Nothing to do.
    None,
    /// Bind the claim to the volume (both sides, then both statuses).
    Bind(String),
    /// Provision a volume for the claim with the built-in provisioner, on this node (if any).
    Provision(Option<String>),
    /// The claim waits; (phase, event type, reason, message) — the event only when the message
    /// is new.
    Pending(Option<(&'static str, &'static str, String)>),
    /// The claim's phase becomes Lost; (reason, message).
    Lost(&'static str, &'static str),
    /// The claim is bound: make its status say so (phase Bound, capacity and modes from the
    /// volume).
    EnsureBound(String),
}

/// `syncClaim`. `class` is the claim's StorageClass when it exists.
pub fn plan_claim(
    c: &PersistentVolumeClaim,
    volumes: &[&PersistentVolume],
    class: Option<&StorageClass>,
    node_labels: &dyn Fn(&str) -> Option<BTreeMap<String, String>>,
) -> ClaimPlan {
    let volume_name = c
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let find = |name: &str| {
        volumes
            .iter()
            .copied()
            .find(|v| v.metadata.name.as_deref() == Some(name))
    };
    let bind_completed = ann(&c.metadata, ANN_BIND_COMPLETED).is_some();
    if bind_completed {
        if volume_name.is_empty() {
            return ClaimPlan::Lost(
                "ClaimLost",
                "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
            );
        }
        let Some(v) = find(&volume_name) else {
            return ClaimPlan::Lost(
                "ClaimLost",
                "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
            );
        };
        if claim_ref(v).is_none() || bound_to(v, c) {
            if claim_ref(v).is_none()
                || phase_of_claim(c) != "Bound"
                || phase_of_volume(v) != "Bound"
            {
                return ClaimPlan::Bind(volume_name);
            }
            return ClaimPlan::EnsureBound(volume_name);
        }
        return ClaimPlan::Lost(
            "ClaimMisbound",
            "Two claims are bound to the same volume, this one is bound incorrectly",
        );
    }
    if !volume_name.is_empty() {
        // Pre-bound by the user to a named volume.
        let Some(v) = find(&volume_name) else {
            return ClaimPlan::Pending(Some((
                "Warning",
                "FailedBinding",
                format!("volume \"{volume_name}\" not found"),
            )));
        };
        if claim_ref(v).is_none() || bound_to(v, c) {
            return ClaimPlan::Bind(volume_name);
        }
        return ClaimPlan::Pending(Some((
            "Warning",
            "FailedBinding",
            format!("volume \"{volume_name}\" already bound to a different claim."),
        )));
    }
    let class_name = claim_class(c);
    let delay =
        class.is_some_and(|sc| sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    let selected = selected_node(c).map(String::from);
    let labels = selected.as_deref().and_then(node_labels);
    let node = match (&selected, &labels) {
        (Some(n), Some(l)) => Some((n.as_str(), l)),
        _ => None,
    };
    if let Some(v) = find_matching_volume(c, volumes, node, delay) {
        return ClaimPlan::Bind(v.metadata.name.clone().unwrap_or_default());
    }
    match class {
        _ if class_name.is_empty() => ClaimPlan::Pending(Some((
            "Normal",
            "FailedBinding",
            "no persistent volumes available for this claim and no storage class is set".into(),
        ))),
        None => ClaimPlan::Pending(Some((
            "Warning",
            "ProvisioningFailed",
            format!("storageclass.storage.k8s.io \"{class_name}\" not found"),
        ))),
        Some(_) if delay && selected.is_none() => ClaimPlan::Pending(Some((
            "Normal",
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding".into(),
        ))),
        Some(sc) if sc.provisioner == LOCAL_PATH_PROVISIONER => ClaimPlan::Provision(selected),
        Some(sc) if sc.provisioner == "kubernetes.io/no-provisioner" => ClaimPlan::Pending(Some((
            "Normal",
            "FailedBinding",
            "no persistent volumes available for this claim and no storage class is set".into(),
        ))),
        Some(sc) => ClaimPlan::Pending(Some((
            "Normal",
            "ExternalProvisioning",
            format!(
                "Waiting for a volume to be created either by the external provisioner '{}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.",
                sc.provisioner
            ),
        ))),
    }
}

/// What the controller does for one volume.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumePlan {
    None,
    /// Set the phase (and the message, for Failed).
    Phase(&'static str, Option<String>),
    /// Drop the claimRef (a controller-made binding to a claim bound elsewhere) → Available.
    Unbind,
    /// The claim is gone: Retain keeps it Released; Delete removes it (its directory first,
    /// for a volume of the built-in provisioner).
    Delete,
}

/// `syncVolume`. `claim` is the claim the volume's claimRef names, if it exists.
pub fn plan_volume(v: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> VolumePlan {
    let phase = phase_of_volume(v);
    let set = |p: &'static str| {
        if phase == p {
            VolumePlan::None
        } else {
            VolumePlan::Phase(p, None)
        }
    };
    let Some(r) = claim_ref(v) else {
        return set("Available");
    };
    if r.uid.as_deref().unwrap_or("").is_empty() {
        // Pre-bound to a claim that has not bound yet.
        return set("Available");
    }
    let claim = claim.filter(|c| c.metadata.uid == r.uid);
    let Some(c) = claim else {
        // Released: reclaim.
        if phase == "Failed" {
            return VolumePlan::None;
        }
        let policy = v
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .unwrap_or("Retain");
        return match policy {
            // Released first (the protection finalizer waits for a volume not Bound), then
            // deleted when the built-in provisioner made it.
            "Delete" if phase != "Released" => VolumePlan::Phase("Released", None),
            "Delete" if ann(&v.metadata, ANN_PROVISIONED_BY) == Some(LOCAL_PATH_PROVISIONER) => {
                VolumePlan::Delete
            }
            "Delete" => VolumePlan::None,
            "Recycle" => VolumePlan::Phase(
                "Failed",
                Some("No recycler plugin found for the volume!".into()),
            ),
            _ => set("Released"),
        };
    };
    let claim_volume = c
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if claim_volume.is_empty() || claim_volume == v.metadata.name.clone().unwrap_or_default() {
        if claim_volume.is_empty() {
            // The claim binds next (its own sync).
            return VolumePlan::None;
        }
        return set("Bound");
    }
    // The claim is bound to another volume.
    if ann(&v.metadata, ANN_BOUND_BY_CONTROLLER).is_some() {
        VolumePlan::Unbind
    } else {
        set("Available")
    }
}

/// The PersistentVolume the built-in provisioner creates for a claim: `pvc-<claim uid>`, a
/// `hostPath` directory (`DirectoryOrCreate`) under `root`, pinned to `node` when known,
/// pre-bound to the claim, with the class's reclaim policy.
pub fn provisioned_volume(
    c: &PersistentVolumeClaim,
    sc: &StorageClass,
    node: Option<(&str, Option<&str>)>,
    root: &str,
) -> PersistentVolume {
    let uid = c.metadata.uid.clone().unwrap_or_default();
    let ns = c.metadata.namespace.clone().unwrap_or_default();
    let name = c.metadata.name.clone().unwrap_or_default();
    let pv_name = format!("pvc-{uid}");
    let spec = c.spec.clone().unwrap_or_default();
    let request = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned();
    let path = format!("{}/{pv_name}_{ns}_{name}", root.trim_end_matches('/'));
    // The node's hostname label (as k3s's local-path provisioner pins its volumes), or its
    // name when it has no such label.
    let node_affinity = node.map(|(n, hostname)| {
        let term = match hostname {
            Some(h) => NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: HOSTNAME_LABEL.into(),
                    operator: "In".into(),
                    values: Some(vec![h.to_string()]),
                }]),
                match_fields: None,
            },
            None => NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![NodeSelectorRequirement {
                    key: "metadata.name".into(),
                    operator: "In".into(),
                    values: Some(vec![n.to_string()]),
                }]),
            },
        };
        VolumeNodeAffinity {
            required: Some(k8s_openapi::api::core::v1::NodeSelector {
                node_selector_terms: vec![term],
            }),
        }
    });
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv_name),
            annotations: Some(BTreeMap::from([(
                ANN_PROVISIONED_BY.to_string(),
                LOCAL_PATH_PROVISIONER.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            capacity: request.map(|q| BTreeMap::from([("storage".to_string(), q)])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(ns),
                name: Some(name),
                uid: Some(uid),
                resource_version: c.metadata.resource_version.clone(),
                ..Default::default()
            }),
            host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                path,
                type_: Some("DirectoryOrCreate".into()),
            }),
            node_affinity,
            persistent_volume_reclaim_policy: Some(
                sc.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            ),
            storage_class_name: sc.metadata.name.clone(),
            volume_mode: spec.volume_mode.clone(),
            mount_options: sc.mount_options.clone(),
            ..Default::default()
        }),
        status: None,
    }
}

/// The protection controllers: may the finalizer of a deleted claim go? (No running or
/// pending pod of its namespace mounts it.)
pub fn claim_releasable(c: &PersistentVolumeClaim, pods_using: usize) -> bool {
    c.metadata.deletion_timestamp.is_some()
        && c.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == PVC_PROTECTION))
        && pods_using == 0
}

/// May the finalizer of a deleted volume go? (It is not Bound.)
pub fn volume_releasable(v: &PersistentVolume) -> bool {
    v.metadata.deletion_timestamp.is_some()
        && v.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == PV_PROTECTION))
        && phase_of_volume(v) != "Bound"
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::type_complexity)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pv(name: &str, size: &str, extra: Value) -> PersistentVolume {
        let mut v = json!({"metadata": {"name": name}, "spec": {"capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}, "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain"}, "status": {"phase": "Available"}});
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn pvc(size: &str, extra: Value) -> PersistentVolumeClaim {
        let mut v = json!({"metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}},
            "storageClassName": ""}, "status": {"phase": "Pending"}});
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn class(mode: &str, provisioner: &str) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": "local-path"}, "provisioner": provisioner,
            "reclaimPolicy": "Delete", "volumeBindingMode": mode}),
        )
        .unwrap()
    }

    fn no_nodes(_: &str) -> Option<BTreeMap<String, String>> {
        None
    }

    #[test]
    fn matcher_table() {
        let small = pv("small", "1Gi", json!({}));
        let big = pv("big", "10Gi", json!({}));
        let rwx = pv(
            "rwx",
            "2Gi",
            json!({"spec": {"accessModes": ["ReadWriteMany"]}}),
        );
        let fast = pv("fast", "2Gi", json!({"spec": {"storageClassName": "fast"}}));
        let labelled = pv(
            "labelled",
            "5Gi",
            json!({"metadata": {"labels": {"tier": "gold"}}}),
        );
        let block = pv("block", "2Gi", json!({"spec": {"volumeMode": "Block"}}));
        let taken = pv(
            "taken",
            "2Gi",
            json!({"spec": {"claimRef": {"namespace": "ns", "name": "other", "uid": "u9"}}}),
        );
        let mine = pv(
            "mine",
            "100Gi",
            json!({"spec": {"claimRef": {"namespace": "ns", "name": "c", "uid": "u1"}}}),
        );
        let all = [&small, &big, &rwx, &fast, &labelled, &block, &taken];
        let cases: Vec<(
            &str,
            PersistentVolumeClaim,
            Vec<&PersistentVolume>,
            Option<&str>,
        )> = vec![
            (
                "smallest that fits",
                pvc("1Gi", json!({})),
                all.to_vec(),
                Some("small"),
            ),
            (
                "too big for small",
                pvc("3Gi", json!({})),
                all.to_vec(),
                Some("labelled"),
            ),
            (
                "none large enough",
                pvc("20Gi", json!({})),
                all.to_vec(),
                None,
            ),
            (
                "class",
                pvc("1Gi", json!({"spec": {"storageClassName": "fast"}})),
                all.to_vec(),
                Some("fast"),
            ),
            (
                "access modes",
                pvc("1Gi", json!({"spec": {"accessModes": ["ReadWriteMany"]}})),
                all.to_vec(),
                Some("rwx"),
            ),
            (
                "selector",
                pvc(
                    "1Gi",
                    json!({"spec": {"selector": {"matchLabels": {"tier": "gold"}}}}),
                ),
                all.to_vec(),
                Some("labelled"),
            ),
            (
                "volume mode",
                pvc("1Gi", json!({"spec": {"volumeMode": "Block"}})),
                all.to_vec(),
                Some("block"),
            ),
            (
                "pre-bound volume wins",
                pvc("1Gi", json!({})),
                vec![&small, &mine],
                Some("mine"),
            ),
        ];
        for (name, c, vols, want) in cases {
            let got = find_matching_volume(&c, &vols, None, false);
            assert_eq!(got.and_then(|v| v.metadata.name.as_deref()), want, "{name}");
        }
        // Waiting for the first consumer: only the pre-bound volume without a node.
        let c = pvc("1Gi", json!({}));
        assert!(find_matching_volume(&c, &[&small], None, true).is_none());
        let labels = BTreeMap::from([(HOSTNAME_LABEL.to_string(), "n1".to_string())]);
        assert_eq!(
            find_matching_volume(&c, &[&small], Some(("n1", &labels)), true)
                .and_then(|v| v.metadata.name.as_deref()),
            Some("small")
        );
        let pinned = pv(
            "pinned",
            "1Gi",
            json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": ["n2"]}]}]}}}}),
        );
        assert!(find_matching_volume(&c, &[&pinned], Some(("n1", &labels)), true).is_none());
    }

    #[test]
    fn claim_plan_table() {
        let avail = pv("v1", "1Gi", json!({}));
        let wffc = class("WaitForFirstConsumer", LOCAL_PATH_PROVISIONER);
        let immediate = class("Immediate", LOCAL_PATH_PROVISIONER);
        let external = class("Immediate", "example.com/csi");
        let lp = json!({"spec": {"storageClassName": "local-path"}});
        let cases: Vec<(&str, PersistentVolumeClaim, Vec<&PersistentVolume>, Option<&StorageClass>, ClaimPlan)> = vec![
            ("binds a static volume", pvc("1Gi", json!({})), vec![&avail], None, ClaimPlan::Bind("v1".into())),
            ("no volume, no class", pvc("5Gi", json!({})), vec![&avail], None,
                ClaimPlan::Pending(Some(("Normal", "FailedBinding", "no persistent volumes available for this claim and no storage class is set".into())))),
            ("class missing", pvc("1Gi", lp.clone()), vec![], None,
                ClaimPlan::Pending(Some(("Warning", "ProvisioningFailed", "storageclass.storage.k8s.io \"local-path\" not found".into())))),
            ("waits for consumer", pvc("1Gi", lp.clone()), vec![], Some(&wffc),
                ClaimPlan::Pending(Some(("Normal", "WaitForFirstConsumer", "waiting for first consumer to be created before binding".into())))),
            ("provisions on the selected node",
                pvc("1Gi", json!({"metadata": {"annotations": {ANN_SELECTED_NODE: "n1"}}, "spec": {"storageClassName": "local-path"}})),
                vec![], Some(&wffc), ClaimPlan::Provision(Some("n1".into()))),
            ("provisions at once", pvc("1Gi", lp.clone()), vec![], Some(&immediate), ClaimPlan::Provision(None)),
            ("external provisioner", pvc("1Gi", lp.clone()), vec![], Some(&external),
                ClaimPlan::Pending(Some(("Normal", "ExternalProvisioning", "Waiting for a volume to be created either by the external provisioner 'example.com/csi' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.".into())))),
            ("pre-bound to a missing volume", pvc("1Gi", json!({"spec": {"volumeName": "gone"}})), vec![], None,
                ClaimPlan::Pending(Some(("Warning", "FailedBinding", "volume \"gone\" not found".into())))),
            ("bound claim lost its volume",
                pvc("1Gi", json!({"metadata": {"annotations": {ANN_BIND_COMPLETED: "yes"}}, "spec": {"volumeName": "gone"}})),
                vec![], None, ClaimPlan::Lost("ClaimLost", "Bound claim has lost its PersistentVolume. Data on the volume is lost!")),
        ];
        for (name, c, vols, sc, want) in cases {
            assert_eq!(plan_claim(&c, &vols, sc, &no_nodes), want, "{name}");
        }
        // Bound and consistent on both sides.
        let bound_pv = pv(
            "v1",
            "1Gi",
            json!({"spec": {"claimRef": {"namespace": "ns", "name": "c", "uid": "u1"}}, "status": {"phase": "Bound"}}),
        );
        let bound_pvc = pvc(
            "1Gi",
            json!({"metadata": {"annotations": {ANN_BIND_COMPLETED: "yes"}}, "spec": {"volumeName": "v1"}, "status": {"phase": "Bound"}}),
        );
        assert_eq!(
            plan_claim(&bound_pvc, &[&bound_pv], None, &no_nodes),
            ClaimPlan::EnsureBound("v1".into())
        );
        // Misbound: the volume names another claim.
        let other = pv(
            "v1",
            "1Gi",
            json!({"spec": {"claimRef": {"namespace": "ns", "name": "d", "uid": "u2"}}, "status": {"phase": "Bound"}}),
        );
        assert_eq!(
            plan_claim(&bound_pvc, &[&other], None, &no_nodes),
            ClaimPlan::Lost(
                "ClaimMisbound",
                "Two claims are bound to the same volume, this one is bound incorrectly"
            )
        );
    }

    #[test]
    fn volume_plan_table() {
        let claim = pvc("1Gi", json!({"spec": {"volumeName": "v1"}}));
        let cref = json!({"namespace": "ns", "name": "c", "uid": "u1"});
        let cases: Vec<(
            &str,
            PersistentVolume,
            Option<&PersistentVolumeClaim>,
            VolumePlan,
        )> = vec![
            (
                "unclaimed becomes Available",
                pv("v1", "1Gi", json!({"status": {"phase": "Pending"}})),
                None,
                VolumePlan::Phase("Available", None),
            ),
            (
                "Available stays",
                pv("v1", "1Gi", json!({})),
                None,
                VolumePlan::None,
            ),
            (
                "bound",
                pv("v1", "1Gi", json!({"spec": {"claimRef": cref.clone()}})),
                Some(&claim),
                VolumePlan::Phase("Bound", None),
            ),
            (
                "claim gone, Retain",
                pv(
                    "v1",
                    "1Gi",
                    json!({"spec": {"claimRef": cref.clone()}, "status": {"phase": "Bound"}}),
                ),
                None,
                VolumePlan::Phase("Released", None),
            ),
            (
                "claim gone, Delete, ours: Released first",
                pv(
                    "v1",
                    "1Gi",
                    json!({"metadata": {"annotations": {ANN_PROVISIONED_BY: LOCAL_PATH_PROVISIONER}},
                    "spec": {"claimRef": cref.clone(), "persistentVolumeReclaimPolicy": "Delete"}, "status": {"phase": "Bound"}}),
                ),
                None,
                VolumePlan::Phase("Released", None),
            ),
            (
                "claim gone, Delete, ours: then deleted",
                pv(
                    "v1",
                    "1Gi",
                    json!({"metadata": {"annotations": {ANN_PROVISIONED_BY: LOCAL_PATH_PROVISIONER}},
                    "spec": {"claimRef": cref.clone(), "persistentVolumeReclaimPolicy": "Delete"}, "status": {"phase": "Released"}}),
                ),
                None,
                VolumePlan::Delete,
            ),
            (
                "claim gone, Delete, not ours: stays Released",
                pv(
                    "v1",
                    "1Gi",
                    json!({"spec": {"claimRef": cref.clone(), "persistentVolumeReclaimPolicy": "Delete"}, "status": {"phase": "Released"}}),
                ),
                None,
                VolumePlan::None,
            ),
            (
                "claim gone, Recycle",
                pv(
                    "v1",
                    "1Gi",
                    json!({"spec": {"claimRef": cref.clone(), "persistentVolumeReclaimPolicy": "Recycle"}, "status": {"phase": "Bound"}}),
                ),
                None,
                VolumePlan::Phase(
                    "Failed",
                    Some("No recycler plugin found for the volume!".into()),
                ),
            ),
            (
                "claim recreated with another uid",
                pv(
                    "v1",
                    "1Gi",
                    json!({"spec": {"claimRef": {"namespace": "ns", "name": "c", "uid": "old"}}, "status": {"phase": "Bound"}}),
                ),
                Some(&claim),
                VolumePlan::Phase("Released", None),
            ),
            (
                "claim bound elsewhere, controller binding",
                pv(
                    "v2",
                    "1Gi",
                    json!({"metadata": {"annotations": {ANN_BOUND_BY_CONTROLLER: "yes"}}, "spec": {"claimRef": cref.clone()}, "status": {"phase": "Bound"}}),
                ),
                Some(&claim),
                VolumePlan::Unbind,
            ),
        ];
        for (name, v, c, want) in cases {
            assert_eq!(plan_volume(&v, c), want, "{name}");
        }
    }

    #[test]
    fn provisioned_volume_shape() {
        let c = pvc(
            "2Gi",
            json!({"metadata": {"resourceVersion": "7"}, "spec": {"storageClassName": "local-path"}}),
        );
        let sc = class("WaitForFirstConsumer", LOCAL_PATH_PROVISIONER);
        let v = provisioned_volume(&c, &sc, Some(("n1", Some("host1"))), "/data/storage/");
        let j = serde_json::to_value(&v).unwrap();
        assert_eq!(j["metadata"]["name"], "pvc-u1");
        assert_eq!(j["spec"]["hostPath"]["path"], "/data/storage/pvc-u1_ns_c");
        assert_eq!(j["spec"]["capacity"]["storage"], "2Gi");
        assert_eq!(j["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(j["spec"]["claimRef"]["uid"], "u1");
        assert_eq!(
            j["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            json!(["host1"])
        );
        let labels = BTreeMap::from([(HOSTNAME_LABEL.to_string(), "host1".to_string())]);
        assert!(node_fits(
            v.spec.as_ref().unwrap().node_affinity.as_ref(),
            "n1",
            &labels
        ));
        assert!(!node_fits(
            v.spec.as_ref().unwrap().node_affinity.as_ref(),
            "n2",
            &BTreeMap::new()
        ));
        // A node without a hostname label: pinned by name.
        let by_name = provisioned_volume(&c, &sc, Some(("n1", None)), "/d");
        let a = by_name.spec.as_ref().unwrap().node_affinity.as_ref();
        assert!(node_fits(a, "n1", &BTreeMap::new()));
        assert!(!node_fits(a, "n2", &BTreeMap::new()));
        // The provisioned volume is pre-bound: the claim binds to it.
        let vols = [&v];
        assert_eq!(
            plan_claim(&c, &vols, Some(&sc), &no_nodes),
            ClaimPlan::Bind("pvc-u1".into())
        );
    }

    #[test]
    fn protection() {
        let mut c = pvc(
            "1Gi",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": [PVC_PROTECTION]}}),
        );
        assert!(claim_releasable(&c, 0));
        assert!(!claim_releasable(&c, 1));
        c.metadata.deletion_timestamp = None;
        assert!(!claim_releasable(&c, 0));
        let v = pv(
            "v",
            "1Gi",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": [PV_PROTECTION]}, "status": {"phase": "Bound"}}),
        );
        assert!(!volume_releasable(&v));
        let v = pv(
            "v",
            "1Gi",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": [PV_PROTECTION]}, "status": {"phase": "Released"}}),
        );
        assert!(volume_releasable(&v));
    }
}
