//! [`MetaObject`]: an object of any kind as the garbage collector and the namespace controller
//! read it — name, namespace, uid, resourceVersion, ownerReferences, finalizers and the
//! deletion timestamp, plus `status.phase` (a Namespace's `Terminating`). Decoded straight from
//! a full object or from a `PartialObjectMetadata` (the metadata-only form of the API); every
//! other field (labels, annotations, managedFields, spec, data...) is skipped by the decoder,
//! never materialised.

use std::borrow::Cow;
use std::fmt;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::ApiResource;
use kube::runtime::watcher;
use kube::{Api, Resource};
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

impl MetaWire {
    /// The kept fields as an `ObjectMeta` (the one place that says what the collector keeps:
    /// empty owner and finalizer lists are dropped).
    fn into_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            deletion_timestamp: self.deletion_timestamp,
            owner_references: self.owner_references.filter(|r| !r.is_empty()),
            finalizers: self.finalizers.filter(|f| !f.is_empty()),
            ..ObjectMeta::default()
        }
    }
}

fn gc_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    Ok(Option::<MetaWire>::deserialize(d)?
        .map(MetaWire::into_meta)
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

impl<K> From<kube::core::PartialObjectMeta<K>> for MetaObject {
    /// The projection of a metadata-only answer (or of a full object decoded as one).
    fn from(p: kube::core::PartialObjectMeta<K>) -> Self {
        let m = p.metadata;
        let wire = MetaWire {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            deletion_timestamp: m.deletion_timestamp,
            owner_references: m.owner_references,
            finalizers: m.finalizers,
        };
        MetaObject {
            metadata: wire.into_meta(),
            phase: None,
        }
    }
}

/// The watch a metadata informer uses, decided on the server's first answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaWatch {
    /// `PartialObjectMetadata` with one streaming list (`sendInitialEvents`).
    StreamingMetadata,
    /// `PartialObjectMetadataList` pages (a server without streaming lists).
    PagedMetadata,
    /// Full objects decoded into [`MetaObject`] (a server that does not serve metadata-only
    /// answers: 406 Not Acceptable).
    FullObjects,
}

fn status_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::InitialListFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    }
}

/// The watch to switch to after `e` was the first answer to `current` (None: keep it; the
/// watcher retries with backoff).
pub fn next_watch(current: MetaWatch, e: &watcher::Error) -> Option<MetaWatch> {
    let refused = ferry_kubeclient::watch::refuses_streaming(e);
    match (current, status_code(e)) {
        (MetaWatch::FullObjects, _) => None,
        (_, Some(406)) => Some(MetaWatch::FullObjects),
        (MetaWatch::StreamingMetadata, _) if refused => Some(MetaWatch::PagedMetadata),
        _ => None,
    }
}

fn metadata_events<S>(s: S) -> BoxStream<'static, watcher::Result<watcher::Event<MetaObject>>>
where
    S: Stream<Item = watcher::Result<watcher::Event<kube::core::PartialObjectMeta<MetaObject>>>>
        + Send
        + 'static,
{
    s.map(|r| {
        r.map(|ev| match ev {
            watcher::Event::Apply(o) => watcher::Event::Apply(o.into()),
            watcher::Event::Delete(o) => watcher::Event::Delete(o.into()),
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitApply(o) => watcher::Event::InitApply(o.into()),
            watcher::Event::InitDone => watcher::Event::InitDone,
        })
    })
    .boxed()
}

fn start_watch(
    mode: MetaWatch,
    client: &kube::Client,
    ar: &ApiResource,
    config: &watcher::Config,
) -> BoxStream<'static, watcher::Result<watcher::Event<MetaObject>>> {
    // An `Api` of PartialObjectMeta asks for metadata-only answers.
    let meta = || Api::<kube::core::PartialObjectMeta<MetaObject>>::all_with(client.clone(), ar);
    let config = config.clone();
    match mode {
        MetaWatch::StreamingMetadata => {
            metadata_events(watcher::watcher(meta(), config.streaming_lists()))
        }
        MetaWatch::PagedMetadata => metadata_events(watcher::watcher(meta(), config)),
        MetaWatch::FullObjects => ferry_kubeclient::watch::stream(
            Api::<MetaObject>::all_with(client.clone(), ar),
            config,
            ar.kind.clone(),
        ),
    }
}

/// A metadata-only watch of the resource `ar` (as upstream's metadata informers and kube-rs'
/// `metadata_watcher`): streaming metadata lists first, paged metadata lists when the server
/// refuses streaming lists, full objects when it does not serve metadata at all (decided once,
/// on the first answer). A server that answers a plain object to the metadata request is read
/// as well: the object decodes as its metadata.
pub fn metadata_stream(
    client: kube::Client,
    ar: ApiResource,
    config: watcher::Config,
) -> BoxStream<'static, watcher::Result<watcher::Event<MetaObject>>> {
    let first = MetaWatch::StreamingMetadata;
    let stream = start_watch(first, &client, &ar, &config);
    futures::stream::unfold(
        (stream, Some(first), client, ar, config),
        |(mut stream, mut deciding, client, ar, config)| async move {
            loop {
                let item = stream.next().await?;
                if let Some(mode) = deciding {
                    match &item {
                        Ok(_) => deciding = None,
                        Err(e) => {
                            if let Some(next) = next_watch(mode, e) {
                                tracing::info!(kind = %ar.kind, ?next, "metadata watch: {e}");
                                stream = start_watch(next, &client, &ar, &config);
                                deciding = (next != MetaWatch::FullObjects).then_some(next);
                                continue;
                            }
                        }
                    }
                }
                return Some((item, (stream, deciding, client, ar, config)));
            }
        },
    )
    .boxed()
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
    fn the_watch_falls_back_by_the_first_answer() {
        use kube::core::Status;
        let api =
            |code: u16| kube::Error::Api(Box::new(Status::failure("no", "x").with_code(code)));
        let start = |c| watcher::Error::WatchStartFailed(api(c));
        let list = |c| watcher::Error::InitialListFailed(api(c));
        use MetaWatch::*;
        for (mode, err, want) in [
            (StreamingMetadata, start(422), Some(PagedMetadata)),
            (StreamingMetadata, start(400), Some(PagedMetadata)),
            (StreamingMetadata, start(406), Some(FullObjects)),
            (StreamingMetadata, start(500), None),
            (StreamingMetadata, start(403), None),
            (PagedMetadata, list(406), Some(FullObjects)),
            (PagedMetadata, start(422), None),
            (PagedMetadata, list(500), None),
            (FullObjects, start(406), None),
        ] {
            assert_eq!(next_watch(mode, &err), want, "{mode:?} {err}");
        }
    }

    #[test]
    fn a_plain_object_answers_a_metadata_request_too() {
        let v = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "4",
                "labels": {"x": "y"}, "finalizers": ["orphan"],
                "managedFields": [{"manager": "m"}]},
            "data": {"k": "v"}});
        let partial: kube::core::PartialObjectMeta<MetaObject> =
            serde_json::from_value(v.clone()).unwrap();
        let direct: MetaObject = serde_json::from_value(v).unwrap();
        assert_eq!(MetaObject::from(partial), direct);
        let meta_only: kube::core::PartialObjectMeta<MetaObject> = serde_json::from_value(
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "4",
                "finalizers": ["orphan"]}}),
        )
        .unwrap();
        assert_eq!(MetaObject::from(meta_only), direct);
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
