//! The watch cache: every served resource kept in memory, fed by one watch on the store, as
//! kube-apiserver's cacher does. Lists and watches are answered from here; writes go to the store
//! and come back through the store's watch.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use ferry_store::{Event, Revision, Store, StoreError};
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

/// How many events per resource are kept for watches that resume from a resourceVersion.
const HISTORY: usize = 20_000;

/// One object as cached: its JSON value (with `metadata.resourceVersion` set) and the same bytes.
#[derive(Debug)]
pub struct CachedObject {
    pub value: Value,
    pub bytes: Bytes,
    pub revision: Revision,
}

impl CachedObject {
    pub fn from_store(raw: &[u8], revision: Revision) -> Option<Arc<CachedObject>> {
        let mut value: Value = serde_json::from_slice(raw).ok()?;
        set_resource_version(&mut value, revision);
        let bytes = Bytes::from(serde_json::to_vec(&value).ok()?);
        Some(Arc::new(CachedObject {
            value,
            bytes,
            revision,
        }))
    }
}

pub fn set_resource_version(value: &mut Value, revision: Revision) {
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to one object of a resource.
#[derive(Debug, Clone)]
pub struct CacheEvent {
    pub kind: EventType,
    pub revision: Revision,
    /// The object after the change (for Deleted: the last state, with the delete's revision).
    pub object: Arc<CachedObject>,
    /// The object before the change (for Modified and Deleted).
    pub prev: Option<Arc<CachedObject>>,
}

struct State {
    items: BTreeMap<String, Arc<CachedObject>>,
    /// Every recent event with the store key of its object, oldest first.
    history: VecDeque<(Arc<str>, Arc<CacheEvent>)>,
    /// Watches may resume from any revision >= this one.
    oldest: Revision,
}

/// The cache of one resource (e.g. all Services).
pub struct ResourceCache {
    state: RwLock<State>,
    events: broadcast::Sender<Arc<CacheEvent>>,
}

/// What a watch resuming from a revision gets: past events, then the live channel.
pub struct Subscription {
    pub replay: Vec<Arc<CacheEvent>>,
    pub live: broadcast::Receiver<Arc<CacheEvent>>,
}

impl ResourceCache {
    fn new(start: Revision) -> Self {
        let (events, _) = broadcast::channel(4096);
        ResourceCache {
            state: RwLock::new(State {
                items: BTreeMap::new(),
                history: VecDeque::new(),
                oldest: start,
            }),
            events,
        }
    }

    /// A snapshot of every object under `prefix` (a key prefix inside this resource).
    pub fn list(&self, prefix: &str) -> Vec<Arc<CachedObject>> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        st.items
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn get(&self, key: &str) -> Option<Arc<CachedObject>> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        st.items.get(key).cloned()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .items
            .len()
    }

    /// Every object under `prefix` as it was at revision `at`, in key order: the current objects
    /// with the changes made after `at` undone from the history (a consistent snapshot for paged
    /// lists, as etcd serves a range at a revision). `at` must be a revision the cache has
    /// applied; `Err(oldest)` when the history no longer reaches back to it.
    pub fn list_at(&self, prefix: &str, at: Revision) -> Result<Vec<Arc<CachedObject>>, Revision> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        if at < st.oldest {
            return Err(st.oldest);
        }
        // Key -> its state at `at` (None: absent), for keys changed after `at`. Walking back
        // from the newest event, the earliest change after `at` is written last.
        let mut overlay: HashMap<&str, Option<&Arc<CachedObject>>> = HashMap::new();
        for (key, ev) in st.history.iter().rev() {
            if ev.revision <= at {
                break;
            }
            if !key.starts_with(prefix) {
                continue;
            }
            let before = match ev.kind {
                EventType::Added => None,
                EventType::Modified | EventType::Deleted => ev.prev.as_ref(),
            };
            overlay.insert(key, before);
        }
        let current = st
            .items
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix));
        if overlay.is_empty() {
            return Ok(current.map(|(_, v)| v.clone()).collect());
        }
        let mut out: BTreeMap<&str, &Arc<CachedObject>> = current
            .filter(|(k, _)| !overlay.contains_key(k.as_str()))
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        for (k, v) in overlay {
            if let Some(v) = v {
                out.insert(k, v);
            }
        }
        Ok(out.into_values().cloned().collect())
    }

    /// Subscribes to live events and snapshots the current objects under `prefix`, atomically.
    pub fn snapshot_and_subscribe(
        &self,
        prefix: &str,
    ) -> (Vec<Arc<CachedObject>>, broadcast::Receiver<Arc<CacheEvent>>) {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        let live = self.events.subscribe();
        let items = st
            .items
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect();
        (items, live)
    }

    /// Subscribes to events after `after`. `Err(oldest)` when that revision is too old.
    pub fn subscribe_from(&self, after: Revision) -> Result<Subscription, Revision> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        if after < st.oldest {
            return Err(st.oldest);
        }
        let live = self.events.subscribe();
        let replay = st
            .history
            .iter()
            .filter(|(_, e)| e.revision > after)
            .map(|(_, e)| e.clone())
            .collect();
        Ok(Subscription { replay, live })
    }

    fn apply(&self, key: &str, ev: CacheEvent) {
        let ev = Arc::new(ev);
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        match ev.kind {
            EventType::Deleted => {
                st.items.remove(key);
            }
            _ => {
                st.items.insert(key.to_string(), ev.object.clone());
            }
        }
        st.history.push_back((Arc::from(key), ev.clone()));
        if st.history.len() > HISTORY
            && let Some((_, old)) = st.history.pop_front()
        {
            st.oldest = old.revision;
        }
        // No receivers is fine.
        let _ = self.events.send(ev);
    }
}

/// All resource caches, keyed by the store prefix of the resource (`/registry/services/`).
/// Resources of custom kinds come and go with their CRDs ([`Cache::ensure`], [`Cache::remove`]).
pub struct Cache {
    resources: RwLock<HashMap<String, Arc<ResourceCache>>>,
    revision: watch::Sender<Revision>,
}

impl Cache {
    /// Loads every resource from the store. Call [`Cache::follow`] afterwards to keep it current.
    pub async fn load(
        store: &dyn Store,
        prefixes: &[String],
    ) -> Result<(Arc<Cache>, Revision), StoreError> {
        let revision = store.current_revision().await?;
        let mut resources = HashMap::new();
        for prefix in prefixes {
            let rc = ResourceCache::new(revision);
            let res = store
                .range(
                    prefix,
                    ferry_store::RangeOptions {
                        revision,
                        ..Default::default()
                    },
                )
                .await?;
            {
                let mut st = rc.state.write().unwrap_or_else(|e| e.into_inner());
                for kv in res.kvs {
                    if let Some(obj) = CachedObject::from_store(&kv.value, kv.mod_revision) {
                        st.items.insert(kv.key.clone(), obj);
                    }
                }
            }
            resources.insert(prefix.clone(), Arc::new(rc));
        }
        let (tx, _) = watch::channel(revision);
        Ok((
            Arc::new(Cache {
                resources: RwLock::new(resources),
                revision: tx,
            }),
            revision,
        ))
    }

    /// Applies store events to the caches until the store's watch ends. Returns the error that
    /// ended it.
    pub async fn follow(self: &Arc<Self>, store: Arc<dyn Store>, from: Revision) -> StoreError {
        let mut stream = match store.watch("/registry/", from).await {
            Ok(s) => s,
            Err(e) => return e,
        };
        while let Some(item) = stream.next().await {
            match item {
                Ok(ev) => self.apply_store_event(ev),
                Err(e) => return e,
            }
        }
        StoreError::Unavailable("store watch ended".into())
    }

    fn apply_store_event(&self, ev: Event) {
        let rev = ev.revision();
        let key = ev.key().to_string();
        // Held until the revision is published, so that `ensure` sees every resource cache
        // either before or after a whole event.
        let resources = self.resources.read().unwrap_or_else(|e| e.into_inner());
        if let Some(rc) = Self::resource_for_key(&resources, &key) {
            let prev = rc.get(&key);
            let ce = match ev {
                Event::Put { kv, .. } => {
                    CachedObject::from_store(&kv.value, kv.mod_revision).map(|object| CacheEvent {
                        kind: if prev.is_some() {
                            EventType::Modified
                        } else {
                            EventType::Added
                        },
                        revision: rev,
                        object,
                        prev,
                    })
                }
                Event::Delete {
                    prev: last,
                    revision,
                } => CachedObject::from_store(&last.value, revision).map(|object| CacheEvent {
                    kind: EventType::Deleted,
                    revision,
                    object,
                    prev,
                }),
            };
            if let Some(ce) = ce {
                rc.apply(&key, ce);
            }
        }
        self.revision.send_replace(rev);
        drop(resources);
    }

    /// Re-lists every resource from the store after the watch lost history (compaction):
    /// differences from the cached state become synthetic events at the new revision, so caches
    /// and their watchers converge without a gap. Returns the revision to follow from.
    pub async fn resync(&self, store: &dyn Store) -> Result<Revision, StoreError> {
        let revision = store.current_revision().await?;
        for (prefix, rc) in self.resources() {
            let prefix = &prefix;
            let res = store
                .range(
                    prefix,
                    ferry_store::RangeOptions {
                        revision,
                        ..Default::default()
                    },
                )
                .await?;
            let mut fresh: BTreeMap<String, Arc<CachedObject>> = BTreeMap::new();
            for kv in res.kvs {
                if let Some(obj) = CachedObject::from_store(&kv.value, kv.mod_revision) {
                    fresh.insert(kv.key, obj);
                }
            }
            let old: Vec<(String, Arc<CachedObject>)> = {
                let st = rc.state.read().unwrap_or_else(|e| e.into_inner());
                st.items
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            };
            let mut events: Vec<(String, CacheEvent)> = Vec::new();
            for (key, prev) in &old {
                if !fresh.contains_key(key)
                    && let Some(object) = CachedObject::from_store(&prev.bytes, revision)
                {
                    events.push((
                        key.clone(),
                        CacheEvent {
                            kind: EventType::Deleted,
                            revision,
                            object,
                            prev: Some(prev.clone()),
                        },
                    ));
                }
            }
            let old: BTreeMap<String, Arc<CachedObject>> = old.into_iter().collect();
            for (key, obj) in fresh {
                let ev = match old.get(&key) {
                    Some(prev) if prev.revision == obj.revision => continue,
                    Some(prev) => CacheEvent {
                        kind: EventType::Modified,
                        revision: obj.revision,
                        object: obj,
                        prev: Some(prev.clone()),
                    },
                    None => CacheEvent {
                        kind: EventType::Added,
                        revision: obj.revision,
                        object: obj,
                        prev: None,
                    },
                };
                events.push((key, ev));
            }
            // Watchers skip revisions they have passed: deliver in revision order.
            events.sort_by_key(|(_, e)| e.revision);
            for (key, ev) in events {
                rc.apply(&key, ev);
            }
        }
        self.revision.send_replace(revision);
        Ok(revision)
    }

    fn resource_for_key<'a>(
        resources: &'a HashMap<String, Arc<ResourceCache>>,
        key: &str,
    ) -> Option<&'a Arc<ResourceCache>> {
        // Keys are `<prefix><ns>/<name>` or `<prefix><name>`; try the longest matching prefix.
        let mut best: Option<(&String, &Arc<ResourceCache>)> = None;
        for (p, rc) in resources {
            if key.starts_with(p.as_str()) && best.is_none_or(|(bp, _)| p.len() > bp.len()) {
                best = Some((p, rc));
            }
        }
        best.map(|(_, rc)| rc)
    }

    pub fn resource(&self, prefix: &str) -> Option<Arc<ResourceCache>> {
        self.resources
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(prefix)
            .cloned()
    }

    pub fn resources(&self) -> Vec<(String, Arc<ResourceCache>)> {
        self.resources
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Adds the cache of a resource that appeared after start (a custom kind): it follows the
    /// store's watch from the current revision on, and is filled with the objects stored at that
    /// revision (keys changed since are already current). No-op if it exists.
    pub async fn ensure(&self, store: &dyn Store, prefix: &str) -> Result<(), StoreError> {
        let (rc, revision) = {
            let mut map = self.resources.write().unwrap_or_else(|e| e.into_inner());
            if map.contains_key(prefix) {
                return Ok(());
            }
            let revision = self.revision();
            let rc = Arc::new(ResourceCache::new(revision));
            map.insert(prefix.to_string(), rc.clone());
            (rc, revision)
        };
        let res = store
            .range(
                prefix,
                ferry_store::RangeOptions {
                    revision,
                    ..Default::default()
                },
            )
            .await;
        let res = match res {
            Ok(r) => r,
            Err(e) => {
                self.resources
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(prefix);
                return Err(e);
            }
        };
        let mut st = rc.state.write().unwrap_or_else(|e| e.into_inner());
        let touched: std::collections::HashSet<Arc<str>> =
            st.history.iter().map(|(k, _)| k.clone()).collect();
        for kv in res.kvs {
            if touched.contains(kv.key.as_str()) {
                continue;
            }
            if let Some(obj) = CachedObject::from_store(&kv.value, kv.mod_revision) {
                st.items.insert(kv.key.clone(), obj);
            }
        }
        Ok(())
    }

    /// Drops the cache of a resource that is no longer served.
    pub fn remove(&self, prefix: &str) {
        self.resources
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(prefix);
    }

    /// The last store revision the cache has applied.
    pub fn revision(&self) -> Revision {
        *self.revision.borrow()
    }

    /// Waits until the cache has applied `revision` (or `timeout` passes). Returns whether it did.
    pub async fn wait_for(&self, revision: Revision, timeout: std::time::Duration) -> bool {
        let mut rx = self.revision.subscribe();
        let fut = rx.wait_for(|r| *r >= revision);
        matches!(tokio::time::timeout(timeout, fut).await, Ok(Ok(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str, v: u32, rev: Revision) -> Arc<CachedObject> {
        let raw = serde_json::json!({"metadata": {"name": name}, "data": {"v": v}}).to_string();
        CachedObject::from_store(raw.as_bytes(), rev).expect("object")
    }

    fn put(rc: &ResourceCache, name: &str, v: u32, rev: Revision) {
        let key = format!("/registry/things/{name}");
        let prev = rc.get(&key);
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        rc.apply(
            &key,
            CacheEvent {
                kind,
                revision: rev,
                object: obj(name, v, rev),
                prev,
            },
        );
    }

    fn del(rc: &ResourceCache, name: &str, rev: Revision) {
        let key = format!("/registry/things/{name}");
        let prev = rc.get(&key).expect("exists");
        rc.apply(
            &key,
            CacheEvent {
                kind: EventType::Deleted,
                revision: rev,
                object: prev.clone(),
                prev: Some(prev),
            },
        );
    }

    fn names_at(rc: &ResourceCache, at: Revision) -> Vec<(String, u64)> {
        rc.list_at("/registry/things/", at)
            .expect("in history")
            .iter()
            .map(|o| {
                (
                    o.value["metadata"]["name"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                    o.value["data"]["v"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    }

    #[test]
    fn list_at_undoes_later_changes() {
        let rc = ResourceCache::new(1);
        put(&rc, "a", 1, 2);
        put(&rc, "b", 1, 3);
        put(&rc, "c", 1, 4);
        let at4 = vec![("a".into(), 1), ("b".into(), 1), ("c".into(), 1)];
        assert_eq!(names_at(&rc, 4), at4);
        // After revision 4: b modified twice, a deleted, d added, c deleted and re-added.
        put(&rc, "b", 2, 5);
        del(&rc, "a", 6);
        put(&rc, "d", 1, 7);
        put(&rc, "b", 3, 8);
        del(&rc, "c", 9);
        put(&rc, "c", 2, 10);
        assert_eq!(names_at(&rc, 4), at4);
        assert_eq!(
            names_at(&rc, 5),
            vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 1)]
        );
        assert_eq!(
            names_at(&rc, 7),
            vec![("b".into(), 2), ("c".into(), 1), ("d".into(), 1)]
        );
        assert_eq!(names_at(&rc, 9), vec![("b".into(), 3), ("d".into(), 1)]);
        assert_eq!(
            names_at(&rc, 10),
            vec![("b".into(), 3), ("c".into(), 2), ("d".into(), 1)]
        );
        assert_eq!(names_at(&rc, 1), vec![]);
        // Another resource's prefix sees nothing.
        assert!(rc.list_at("/registry/other/", 4).expect("ok").is_empty());
    }

    #[test]
    fn list_at_before_history_is_too_old() {
        let rc = ResourceCache::new(100);
        put(&rc, "a", 1, 101);
        assert_eq!(rc.list_at("/registry/things/", 99).err(), Some(100));
        assert_eq!(names_at(&rc, 100), vec![]);
    }
}
