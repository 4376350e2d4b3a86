//! The one Pod projection every controller reads ([`SlimPod`]): exactly the fields the
//! planners use (ReplicaSet/Deployment, Job, StatefulSet, DaemonSet, disruption, EndpointSlice
//! and Endpoints, scheduler, pod GC), decoded straight from the watch stream. Nothing else of a
//! Pod is ever materialised: unknown fields are skipped by the decoder (no `serde_json::Value`,
//! no full k8s-openapi `Pod`), `managedFields` and annotations other than the ones read are
//! dropped while decoding.
//!
//! The shape follows k8s-openapi's `Pod` (same field names and types for what is kept), so
//! planners read `p.spec.as_ref()?.node_name` as on the full type. What a controller writes
//! (status patches, deletes, bindings) goes by name; no full object is kept.
//!
//! Kept fields:
//! * metadata: name, namespace, uid, resourceVersion, generateName, creationTimestamp,
//!   deletionTimestamp, deletionGracePeriodSeconds, labels, ownerReferences, finalizers, and
//!   the annotations in [`KEPT_ANNOTATIONS`];
//! * spec: nodeName, hostname, subdomain, schedulerName, schedulingGates, nodeSelector, tolerations,
//!   containers' names and ports (named targetPorts), volumes' names and claim names;
//! * status: phase, reason, conditions, podIP(s), startTime, container statuses' name,
//!   ready, restartCount and terminated state (exit code, reason, finish time).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// Pod annotations a controller reads (every other annotation is dropped while decoding).
pub const KEPT_ANNOTATIONS: &[&str] = &[
    ferry_api::workloads::JOB_COMPLETION_INDEX,
    "controller.kubernetes.io/pod-deletion-cost",
];

/// A Pod as the controllers see it (see the module docs for the fields kept).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlimPod {
    #[serde(default, deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_gates: Option<Vec<PodSchedulingGate>>,
    /// Only the volumes' names and claim references (the scheduler, the PVC protection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<PodVolume>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolume {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<ClaimSource>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSource {
    #[serde(default)]
    pub claim_name: String,
}

impl SlimPod {
    /// The claims the pod's volumes name.
    pub fn claim_names(&self) -> impl Iterator<Item = &str> {
        self.spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.as_str())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodSchedulingGate {
    #[serde(default)]
    pub name: String,
}

/// A container's name and ports (for named `targetPort`s).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ContainerPort>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    #[serde(default)]
    pub container_port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<PodCondition>>,
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Option::is_none")]
    pub pod_ips: Option<Vec<PodIP>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<ContainerStatus>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCondition {
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodIP {
    #[serde(default)]
    pub ip: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerState>,
}

/// Only the terminated state is read (exit codes for the pod failure policy, finish times).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<ContainerStateTerminated>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStateTerminated {
    #[serde(default)]
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

/// The metadata fields kept, as on the wire.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaWire {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "kept_annotations")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let w = Option::<MetaWire>::deserialize(d)?;
    Ok(w.map(|w| ObjectMeta {
        name: w.name,
        generate_name: w.generate_name,
        namespace: w.namespace,
        uid: w.uid,
        resource_version: w.resource_version,
        creation_timestamp: w.creation_timestamp,
        deletion_timestamp: w.deletion_timestamp,
        deletion_grace_period_seconds: w.deletion_grace_period_seconds,
        labels: w.labels.filter(|l| !l.is_empty()),
        annotations: w.annotations,
        owner_references: w.owner_references.filter(|r| !r.is_empty()),
        finalizers: w.finalizers.filter(|f| !f.is_empty()),
        ..ObjectMeta::default()
    })
    .unwrap_or_default())
}

/// Decodes an annotation map keeping only [`KEPT_ANNOTATIONS`] (the other values are skipped
/// without being allocated).
fn kept_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an annotation map")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_map(V)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(k) = m.next_key::<String>()? {
                if KEPT_ANNOTATIONS.contains(&k.as_ref()) {
                    let v: String = m.next_value()?;
                    out.insert(k, v);
                } else {
                    m.next_value::<IgnoredAny>()?;
                }
            }
            Ok((!out.is_empty()).then_some(out))
        }
    }
    d.deserialize_option(V)
}

ferry_kubeclient::pod_resource!(SlimPod);

impl SlimPod {
    /// The projection of a full Pod (the same result as decoding its JSON).
    pub fn from_pod(p: &k8s_openapi::api::core::v1::Pod) -> Self {
        serde_json::to_value(p)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default()
    }
}

impl From<k8s_openapi::api::core::v1::Pod> for SlimPod {
    fn from(p: k8s_openapi::api::core::v1::Pod) -> Self {
        SlimPod::from_pod(&p)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn full() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-1", "namespace": "ns", "uid": "u1", "resourceVersion": "42",
                "generateName": "web-", "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-01T00:01:00Z", "deletionGracePeriodSeconds": 30,
                "labels": {"app": "web"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\": [1, 2, 3]}",
                    "batch.kubernetes.io/job-completion-index": "3",
                    "other": "x"
                },
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                    "uid": "rs", "controller": true, "blockOwnerDeletion": true}],
                "finalizers": ["batch.kubernetes.io/job-tracking"],
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]
            },
            "spec": {
                "nodeName": "n1", "hostname": "h", "subdomain": "s",
                "schedulerName": "default-scheduler", "nodeSelector": {"disk": "ssd"},
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
                "volumes": [{"name": "v", "emptyDir": {}},
                    {"name": "d", "persistentVolumeClaim": {"claimName": "data", "readOnly": true}}],
                "containers": [{"name": "c", "image": "nginx", "env": [{"name": "A", "value": "b"}],
                    "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                    "resources": {"limits": {"cpu": "1"}}}]
            },
            "status": {
                "phase": "Running", "reason": "R", "podIP": "10.0.0.1",
                "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}],
                "hostIP": "192.0.2.1", "qosClass": "BestEffort",
                "startTime": "2026-01-01T00:00:05Z",
                "conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": "2026-01-01T00:00:10Z", "lastProbeTime": null}],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 2,
                    "image": "nginx", "imageID": "x", "started": true,
                    "state": {"terminated": {"exitCode": 3, "reason": "Error",
                        "finishedAt": "2026-01-01T00:00:20Z"}},
                    "lastState": {}}]
            }
        })
    }

    #[test]
    fn decodes_only_the_fields_the_planners_read() {
        let p: SlimPod = serde_json::from_value(full()).unwrap();
        let m = &p.metadata;
        assert_eq!(m.name.as_deref(), Some("web-1"));
        assert_eq!(m.namespace.as_deref(), Some("ns"));
        assert_eq!(m.uid.as_deref(), Some("u1"));
        assert_eq!(m.resource_version.as_deref(), Some("42"));
        assert_eq!(m.generate_name.as_deref(), Some("web-"));
        assert!(m.creation_timestamp.is_some() && m.deletion_timestamp.is_some());
        assert_eq!(m.deletion_grace_period_seconds, Some(30));
        assert_eq!(m.labels.as_ref().unwrap()["app"], "web");
        assert!(m.managed_fields.is_none());
        // Only the annotations a controller reads.
        let ann = m.annotations.as_ref().unwrap();
        assert_eq!(ann.len(), 1);
        assert_eq!(ann["batch.kubernetes.io/job-completion-index"], "3");
        assert_eq!(m.owner_references.as_ref().unwrap()[0].uid, "rs");
        assert_eq!(m.finalizers.as_ref().unwrap().len(), 1);
        let s = p.spec.as_ref().unwrap();
        assert_eq!(s.node_name.as_deref(), Some("n1"));
        assert_eq!(s.hostname.as_deref(), Some("h"));
        assert_eq!(s.subdomain.as_deref(), Some("s"));
        assert_eq!(s.node_selector.as_ref().unwrap()["disk"], "ssd");
        assert_eq!(
            s.tolerations.as_ref().unwrap()[0].operator.as_deref(),
            Some("Exists")
        );
        assert_eq!(p.claim_names().collect::<Vec<_>>(), ["data"]);
        let port = &s.containers[0].ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("http"), 80)
        );
        let st = p.status.as_ref().unwrap();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.pod_ips.as_ref().unwrap().len(), 2);
        assert_eq!(st.conditions.as_ref().unwrap()[0].type_, "Ready");
        let cs = &st.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.restart_count, 2);
        assert_eq!(
            cs.state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .exit_code,
            3
        );
        // Decoding the full k8s-openapi Pod and projecting it gives the same.
        let via_full = SlimPod::from_pod(&serde_json::from_value(full()).unwrap());
        assert_eq!(via_full, p);
    }

    #[test]
    fn absent_and_null_parts_decode_to_defaults() {
        for v in [
            json!({"metadata": {"name": "a"}}),
            json!({"metadata": {"name": "a", "annotations": null, "labels": {}}, "spec": null}),
            json!({"metadata": {"name": "a", "annotations": {"x": "y"}}, "status": {}}),
        ] {
            let p: SlimPod = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(p.metadata.name.as_deref(), Some("a"), "{v}");
            assert!(p.metadata.annotations.is_none(), "{v}");
            assert!(p.metadata.labels.is_none(), "{v}");
        }
        let p: SlimPod = serde_json::from_value(json!({})).unwrap();
        assert_eq!(p, SlimPod::default());
    }

    #[test]
    fn the_watch_decodes_a_watch_event_into_the_slim_type() {
        let ev: kube::core::WatchEvent<SlimPod> =
            serde_json::from_value(json!({"type": "MODIFIED", "object": full()})).unwrap();
        match ev {
            kube::core::WatchEvent::Modified(p) => {
                assert_eq!(p.metadata.resource_version.as_deref(), Some("42"))
            }
            other => panic!("{other:?}"),
        }
    }
}
