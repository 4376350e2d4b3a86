//! Reflector stores fed by kube-runtime's watcher (with its default backoff), reporting every
//! change as an `(old, new)` pair after the store shows it, so handlers can map both versions
//! to the keys they affect (as client-go's informer event handlers do).

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// One change seen by a reflector: `old` is the cached version before (None on create),
/// `new` the version now (None on delete). On a relist, only objects that changed or vanished
/// are reported.
pub struct Change<'a, K> {
    pub old: Option<&'a K>,
    pub new: Option<&'a K>,
}

impl<'a, K> Change<'a, K> {
    /// Both versions, for mapping to keys.
    pub fn objects(&self) -> impl Iterator<Item = &'a K> {
        self.old.into_iter().chain(self.new)
    }
}

/// What every reflected kind must be.
pub trait Reflected:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}
impl<T: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static>
    Reflected for T
{
}

fn resource_version<K: Resource>(o: &K) -> Option<&str> {
    o.meta().resource_version.as_deref()
}

/// Starts a watch of `api` into a store until `stop`; calls `on_change` for every change,
/// after the store shows it. Watch errors are logged at warn; the watcher retries with
/// kube-runtime's default backoff. Wait for the store with `Store::wait_until_ready`.
pub fn reflect<K, F>(
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    on_change: F,
) -> Store<K>
where
    K: Reflected,
    F: FnMut(Change<'_, K>) + Send + 'static,
{
    reflect_with(api, config, (), stop, on_change)
}

/// [`reflect`] for kinds known at run time (e.g. `DynamicObject` with its `ApiResource`).
pub fn reflect_with<K, F>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    stop: CancellationToken,
    on_change: F,
) -> Store<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
    F: FnMut(Change<'_, K>) + Send + 'static,
{
    reflect_slim(api, config, dyntype, slim_meta::<K>, stop, on_change)
}

/// Drops what no controller reads from a cached object: `metadata.managedFields` (often the
/// largest part of a small object). Every reflector of this crate applies it.
pub fn slim_meta<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// A watcher that syncs with one streaming list and falls back to paged lists when the server
/// refuses it ([`ferry_kubeclient::watch::stream`]).
pub fn watch_stream<K>(
    api: Api<K>,
    config: watcher::Config,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).to_string();
    ferry_kubeclient::watch::stream(api, config, kind)
}

/// Receives a reflector's changes, and the end of each (re)list.
pub(crate) trait Sink<K>: Send + 'static {
    fn change(&mut self, ch: Change<'_, K>);
    /// A (re)list has been applied to the store and every change it made was reported.
    fn listed(&mut self) {}
}

struct FnSink<F>(F);

impl<K, F: FnMut(Change<'_, K>) + Send + 'static> Sink<K> for FnSink<F> {
    fn change(&mut self, ch: Change<'_, K>) {
        (self.0)(ch)
    }
}

/// [`reflect_with`] with `slim` applied to every object before it is cached or reported (a
/// projection of the fields the caller reads; it must keep name, namespace and
/// resourceVersion).
pub fn reflect_slim<K, F>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    slim: fn(&mut K),
    stop: CancellationToken,
    on_change: F,
) -> Store<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
    F: FnMut(Change<'_, K>) + Send + 'static,
{
    spawn_reflector(api, config, dyntype, slim, stop, FnSink(on_change))
}

pub(crate) fn spawn_reflector<K, S>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    slim: fn(&mut K),
    stop: CancellationToken,
    sink: S,
) -> Store<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
    S: Sink<K>,
{
    let kind = K::kind(&dyntype).to_string();
    let stream = ferry_kubeclient::watch::stream(api, config, kind)
        .modify(slim)
        .boxed();
    spawn_reflector_on(stream, dyntype, stop, sink)
}

/// [`reflect_with`] on a given watch stream (e.g. a metadata-only watch, see
/// [`super::meta::metadata_stream`]); kube-runtime's default backoff is applied here.
pub fn reflect_stream<K, F>(
    stream: BoxStream<'static, watcher::Result<watcher::Event<K>>>,
    dyntype: K::DynamicType,
    stop: CancellationToken,
    on_change: F,
) -> Store<K>
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
    F: FnMut(Change<'_, K>) + Send + 'static,
{
    spawn_reflector_on(stream, dyntype, stop, FnSink(on_change))
}

fn spawn_reflector_on<K, S>(
    stream: BoxStream<'static, watcher::Result<watcher::Event<K>>>,
    dyntype: K::DynamicType,
    stop: CancellationToken,
    mut sink: S,
) -> Store<K>
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
    S: Sink<K>,
{
    let writer = reflector::store::Writer::new(dyntype.clone());
    let reader = writer.as_reader();
    let mut writer = writer;
    let store = reader.clone();
    let kind = K::kind(&dyntype).to_string();
    tokio::spawn(async move {
        let mut stream = stream.default_backoff().boxed();
        // The store's contents when a relist began.
        let mut before: Option<Vec<Arc<K>>> = None;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => ev,
            };
            let ev = match ev {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(kind = %kind, "watch failed, retrying with backoff: {e}");
                    continue;
                }
                Some(Ok(ev)) => ev,
            };
            match &ev {
                watcher::Event::Apply(o) => {
                    let old = reader.get(&ObjectRef::from_obj_with(o, dyntype.clone()));
                    writer.apply_watcher_event(&ev);
                    sink.change(Change {
                        old: old.as_deref(),
                        new: Some(o),
                    });
                }
                watcher::Event::Delete(o) => {
                    let old = reader.get(&ObjectRef::from_obj_with(o, dyntype.clone()));
                    writer.apply_watcher_event(&ev);
                    sink.change(Change {
                        old: Some(old.as_deref().unwrap_or(o)),
                        new: None,
                    });
                }
                watcher::Event::Init => {
                    before = Some(reader.state());
                    writer.apply_watcher_event(&ev);
                }
                watcher::Event::InitApply(_) => writer.apply_watcher_event(&ev),
                watcher::Event::InitDone => {
                    writer.apply_watcher_event(&ev);
                    let mut old: HashMap<ObjectRef<K>, Arc<K>> = before
                        .take()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|o| (ObjectRef::from_obj_with(&*o, dyntype.clone()), o))
                        .collect();
                    for new in reader.state() {
                        // The first list (nothing cached before): every object is a creation,
                        // no lookup needed.
                        let prev = if old.is_empty() {
                            None
                        } else {
                            old.remove(&ObjectRef::from_obj_with(&*new, dyntype.clone()))
                        };
                        let same = prev.as_deref().is_some_and(|p| {
                            resource_version(p).is_some()
                                && resource_version(p) == resource_version(&*new)
                        });
                        if !same {
                            sink.change(Change {
                                old: prev.as_deref(),
                                new: Some(&new),
                            });
                        }
                    }
                    for gone in old.into_values() {
                        sink.change(Change {
                            old: Some(&gone),
                            new: None,
                        });
                    }
                    sink.listed();
                }
            }
        }
    });
    store
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slim_meta_drops_managed_fields_only() {
        let mut p = k8s_openapi::api::core::v1::Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.resource_version = Some("7".into());
        p.metadata.managed_fields = Some(vec![Default::default()]);
        slim_meta(&mut p);
        assert!(p.metadata.managed_fields.is_none());
        assert_eq!(p.metadata.name.as_deref(), Some("p"));
        assert_eq!(p.metadata.resource_version.as_deref(), Some("7"));
    }
}
