//! [`MetaObject`]: an object of any kind as the garbage collector and the namespace controller
//! read it — name, namespace, uid, resourceVersion, ownerReferences, finalizers and the
//! deletion timestamp, plus `status.phase` (a Namespace's `Terminating`). Decoded straight from
//! a full object or from a `PartialObjectMetadata` (the metadata-only form of the API); every
//! other field (labels, annotations, managedFields, spec, data...) is skipped by the decoder,
//! never materialised.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::api::ApiResource;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// The metadata (and phase) of an object of a kind known at run time.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct MetaObject {
    /// Only name, namespace, uid, resourceVersion, ownerReferences, finalizers and
    /// deletionTimestamp are set.
    #[serde(default, deserialize_with = "gc_meta")]
    pub metadata: ObjectMeta,
    /// `status.phase`, when the object has one.
    #[serde(default, rename = "status", deserialize_with = "status_phase")]
    pub phase: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaWire {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
}

fn gc_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    Ok(Option::<MetaWire>::deserialize(d)?
        .map(|w| ObjectMeta {
            name: w.name,
            namespace: w.namespace,
            uid: w.uid,
            resource_version: w.resource_version,
            deletion_timestamp: w.deletion_timestamp,
            owner_references: w.owner_references.filter(|r| !r.is_empty()),
            finalizers: w.finalizers.filter(|f| !f.is_empty()),
            ..ObjectMeta::default()
        })
        .unwrap_or_default())
}

/// `status.phase` of any status shape: a status that is not an object, or a phase that is
/// not a string (possible in custom resources), reads as none instead of failing the decode of
/// the whole object; the rest of the status is skipped.
fn status_phase<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a status")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut phase = None;
            while let Some(k) = m.next_key::<String>()? {
                if k == "phase" {
                    phase = m
                        .next_value::<serde_json::Value>()?
                        .as_str()
                        .map(str::to_string);
                } else {
                    m.next_value::<IgnoredAny>()?;
                }
            }
            Ok(phase)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
            while s.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(V)
}

impl MetaObject {
    /// A bare object (tests, fallbacks).
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        MetaObject {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: namespace.map(str::to_string),
                ..ObjectMeta::default()
            },
            phase: None,
        }
    }
}

impl From<&super::SlimPod> for MetaObject {
    /// The collector's view of a Pod of the shared Pod informer (no second Pod watch).
    fn from(p: &super::SlimPod) -> Self {
        let m = &p.metadata;
        MetaObject {
            metadata: ObjectMeta {
                name: m.name.clone(),
                namespace: m.namespace.clone(),
                uid: m.uid.clone(),
                resource_version: m.resource_version.clone(),
                deletion_timestamp: m.deletion_timestamp.clone(),
                owner_references: m.owner_references.clone(),
                finalizers: m.finalizers.clone(),
                ..ObjectMeta::default()
            },
            phase: p.status.as_ref().and_then(|s| s.phase.clone()),
        }
    }
}

impl Resource for MetaObject {
    type DynamicType = ApiResource;
    type Scope = kube::core::DynamicResourceScope;
    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keeps_what_the_collector_reads_and_skips_the_rest() {
        let o: MetaObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "9",
                "labels": {"x": "y"}, "annotations": {"big": "z"},
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "o", "controller": true}],
                "finalizers": ["foregroundDeletion"],
                "managedFields": [{"manager": "m", "fieldsV1": {"f:data": {}}}]},
            "data": {"k": "v"}
        }))
        .unwrap();
        let m = &o.metadata;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref()),
            (Some("a"), Some("ns"), Some("u"))
        );
        assert_eq!(m.resource_version.as_deref(), Some("9"));
        assert!(m.deletion_timestamp.is_some());
        assert_eq!(m.owner_references.as_ref().unwrap()[0].uid, "o");
        assert_eq!(m.finalizers.as_ref().unwrap()[0], "foregroundDeletion");
        assert!(m.labels.is_none() && m.annotations.is_none() && m.managed_fields.is_none());
        assert_eq!(o.phase, None);
    }

    #[test]
    fn a_slim_pod_projects_to_the_same_as_decoding_the_pod() {
        let v = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
            "resourceVersion": "3", "labels": {"a": "b"}, "finalizers": ["f"],
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "o"}]},
            "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}});
        let slim: super::super::SlimPod = serde_json::from_value(v.clone()).unwrap();
        let direct: MetaObject = serde_json::from_value(v).unwrap();
        assert_eq!(MetaObject::from(&slim), direct);
    }

    #[test]
    fn reads_the_phase_of_any_status_shape() {
        let phase = |status: serde_json::Value| {
            serde_json::from_value::<MetaObject>(
                json!({"metadata": {"name": "n"}, "status": status}),
            )
            .unwrap()
            .phase
        };
        assert_eq!(
            phase(json!({"phase": "Terminating", "conditions": [{"type": "x"}]})).as_deref(),
            Some("Terminating")
        );
        assert_eq!(phase(json!({"phase": 3})), None);
        assert_eq!(phase(json!({"phase": null})), None);
        assert_eq!(phase(json!("weird")), None);
        assert_eq!(phase(json!([1, 2])), None);
        assert_eq!(phase(json!(null)), None);
        // PartialObjectMetadata (the metadata-only form) decodes too.
        let o: MetaObject = serde_json::from_value(json!({"kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "p", "uid": "u"}}))
        .unwrap();
        assert_eq!(o.metadata.uid.as_deref(), Some("u"));
    }
}
