//! The watch cache: every served resource kept in memory, fed by one watch on the store, as
//! kube-apiserver's cacher does. Lists and watches are answered from here; writes go to the store
//! and come back through the store's watch.
//!
//! Memory bounds (documented in ARCHITECTURE.md as this crate's invariants):
//! - per object: its served JSON bytes, exactly sized, + [`CachedObject`]'s compact metadata
//!   (name, namespace and labels, strings shared through [`compact::interner`]; the values of
//!   the kind's selectable fields, [`kept`], packed in one string: ~70 B for a Pod) + its index
//!   entry: about the JSON size + ~210 bytes + 32 bytes per label + the kept values
//!   (heaptrack, 161,200 objects: ~110 B struct, `Arc` and name, ~95 B index node and key; see
//!   SCALE.md). No parsed `serde_json::Value` is kept; code that needs one decodes the bytes
//!   ([`CachedObject::value`]). `/metrics` reports the objects and their JSON bytes per resource
//!   ([`ResourceCache::stats`]).
//! - watch history per resource: at most [`HISTORY_EVENTS`] events and [`HISTORY_BYTES`] bytes
//!   of the objects they hold, whichever is reached first; a watch or a continued list from an
//!   older revision gets 410 Gone, as upstream. The live channel buffers at most
//!   [`LIVE_BUFFER`] events; a watcher that falls further behind gets 410 and re-lists.
//! - a load or re-sync holds one chunk of stored objects at a time ([`LOAD_CHUNK`] keys).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use ferry_store::{Event, Revision, Store, StoreError};
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::{compact, kept};

/// Watch history per resource: at most this many events…
pub const HISTORY_EVENTS: usize = 10_000;
/// …and at most this many bytes of objects they hold (each event's object and previous state
/// counted in full, even when shared), whichever bound is reached first. A watch or a continued
/// list from a revision older than the history reaches gets 410 Gone, as upstream's cacher.
pub const HISTORY_BYTES: usize = 32 << 20;
/// Events buffered for live watchers of a resource.
pub const LIVE_BUFFER: usize = 4096;
/// Fixed cost charged per history entry on top of its objects' bytes (the entry, its key, the
/// event and the compact metadata of its objects).
const HISTORY_ENTRY_OVERHEAD: usize = 256;

/// One object as cached, compactly: the served JSON (with `metadata.resourceVersion` set), the
/// revision, and only what lists, selectors and watches read without decoding: name,
/// namespace and labels (strings shared through [`compact::interner`]), and the values of the
/// kind's selectable fields ([`kept`]: a Pod's `spec.nodeName`, `status.phase`...). Code that
/// needs the whole object decodes it on demand ([`CachedObject::value`]); serving never
/// re-encodes.
///
/// Memory per object: the JSON bytes (exact size) + ~110 bytes of struct, `Arc` and name, + 32
/// bytes per label (the strings themselves shared) + the kept values (one exactly sized string,
/// ~70 bytes for a Pod) + the index entry (~95 bytes: its share of a B-tree node and the key
/// string).
#[derive(Debug)]
pub struct CachedObject {
    pub bytes: Bytes,
    pub revision: Revision,
    /// The name; when the kind's selectable fields are kept and some are the object's own (a
    /// Pod's IP), followed by NUL and those values ([`kept::Kept::own`]): one allocation.
    name: Box<str>,
    namespace: Arc<str>,
    labels: Box<[(Arc<str>, Arc<str>)]>,
    /// The values of the kind's selectable fields that objects share ([`kept::Kept::shared`]),
    /// interned; `None` for kinds without a field set and for objects whose values could not be
    /// kept (the filter decodes those).
    fields: Option<Arc<str>>,
}

impl CachedObject {
    /// The cached form of a stored object at `revision`; `None` when it is not a JSON object.
    pub fn from_store(raw: &[u8], revision: Revision) -> Option<Arc<CachedObject>> {
        Self::from_store_with(raw, revision, None)
    }

    /// [`CachedObject::from_store`] for the object stored at `key`: it also keeps the values
    /// of its kind's selectable fields ([`kept::for_key`]).
    pub fn from_stored_key(key: &str, raw: &[u8], revision: Revision) -> Option<Arc<CachedObject>> {
        Self::from_store_with(raw, revision, kept::for_key(key))
    }

    fn from_store_with(
        raw: &[u8],
        revision: Revision,
        set: Option<&kept::FieldSet>,
    ) -> Option<Arc<CachedObject>> {
        let s = compact::stamp(raw, revision)?;
        let intern = compact::interner();
        let kept = set
            .filter(|_| !s.name.contains('\0'))
            .and_then(|set| set.extract(raw));
        let (name, fields) = match kept {
            // (All own values empty: nothing to append; they read as "".)
            Some(k) if !k.own.is_empty() => (
                format!("{}\0{}", s.name, k.own),
                Some(intern.intern(&k.shared)),
            ),
            Some(k) => (s.name, Some(intern.intern(&k.shared))),
            None => (s.name, None),
        };
        Some(Arc::new(CachedObject {
            bytes: Bytes::from(s.bytes.into_boxed_slice()),
            revision,
            name: name.into_boxed_str(),
            namespace: intern.intern(&s.namespace),
            labels: s
                .labels
                .iter()
                .map(|(k, v)| (intern.intern(k), intern.intern(v)))
                .collect(),
            fields,
        }))
    }

    /// The cached form of an object value (served as is: its resourceVersion is not changed).
    pub fn from_value(value: &Value, revision: Revision) -> Option<Arc<CachedObject>> {
        let raw = serde_json::to_vec(value).ok()?;
        let meta = |f: &str| {
            value
                .pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let intern = compact::interner();
        Some(Arc::new(CachedObject {
            bytes: Bytes::from(raw.into_boxed_slice()),
            revision,
            name: meta("name").into(),
            namespace: intern.intern(meta("namespace")),
            labels: crate::objects::labels(value)
                .iter()
                .map(|(k, v)| (intern.intern(k), intern.intern(v)))
                .collect(),
            fields: None,
        }))
    }

    /// The kept value of the selectable field at `index` of `set`, the object's kind's
    /// [`kept::FieldSet`]; `None` when nothing is kept.
    pub fn kept_field(&self, set: &kept::FieldSet, index: usize) -> Option<&str> {
        let shared = self.fields.as_deref()?;
        let own = self.name.split_once('\0').map_or("", |(_, o)| o);
        set.value(shared, own, index)
    }

    /// The whole object, decoded from the bytes.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }

    /// The object as a typed value, decoded from the bytes.
    pub fn typed<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.bytes).ok()
    }

    pub fn name(&self) -> &str {
        match self.fields {
            Some(_) => self.name.split_once('\0').map_or(&self.name, |(n, _)| n),
            None => &self.name,
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `metadata.labels` (string values).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub fn has_labels(&self) -> bool {
        !self.labels.is_empty()
    }

    /// The bytes this object holds on the heap (for the history bound).
    fn weight(&self) -> usize {
        self.bytes.len() + self.name.len()
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

impl CacheEvent {
    fn weight(&self) -> usize {
        HISTORY_ENTRY_OVERHEAD + self.object.weight() + self.prev.as_ref().map_or(0, |p| p.weight())
    }
}

/// How much watch history a resource keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryBound {
    pub events: usize,
    pub bytes: usize,
}

impl Default for HistoryBound {
    fn default() -> Self {
        HistoryBound {
            events: HISTORY_EVENTS,
            bytes: HISTORY_BYTES,
        }
    }
}

/// The size of one resource's cache ([`ResourceCache::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    pub objects: usize,
    /// The objects' JSON bytes (the bulk of the cache's memory; see the module docs for the
    /// per-object overhead on top).
    pub object_bytes: usize,
    pub history_events: usize,
    /// The history's bytes as charged against [`HISTORY_BYTES`].
    pub history_bytes: usize,
}

struct State {
    items: BTreeMap<String, Arc<CachedObject>>,
    /// The sum of the items' JSON sizes.
    item_bytes: usize,
    /// Every recent event with the store key of its object, oldest first.
    history: VecDeque<(Arc<str>, Arc<CacheEvent>)>,
    /// The sum of the history entries' weights.
    history_bytes: usize,
    /// Watches may resume from any revision >= this one.
    oldest: Revision,
    /// The newest revision applied to this resource.
    applied: Revision,
}

/// The cache of one resource (e.g. all Services).
pub struct ResourceCache {
    state: RwLock<State>,
    events: broadcast::Sender<Arc<CacheEvent>>,
    bound: HistoryBound,
}

/// What a watch resuming from a revision gets: past events, then the live channel.
pub struct Subscription {
    pub replay: Vec<Arc<CacheEvent>>,
    pub live: broadcast::Receiver<Arc<CacheEvent>>,
}

/// One page of a list at a revision.
#[derive(Debug)]
pub struct Page {
    /// The matching objects, in key order.
    pub items: Vec<Arc<CachedObject>>,
    /// When the snapshot holds objects after the last item: the last item's store key.
    pub next: Option<String>,
    /// How many objects of the snapshot follow the last item (only when asked for, and only
    /// when there are some).
    pub remaining: Option<usize>,
}

/// Why a page could not be served.
#[derive(Debug, PartialEq, Eq)]
pub enum PageError<E> {
    /// The history no longer reaches back to the revision; the oldest it does.
    TooOld(Revision),
    /// The predicate failed.
    Filter(E),
}

/// The objects of a snapshot in key order: the current objects, with the state at the
/// snapshot's revision of the keys changed since (`overlay`: `None` = absent then).
fn merged<'a>(
    current: impl Iterator<Item = (&'a String, &'a Arc<CachedObject>)> + 'a,
    overlay: BTreeMap<&'a str, Option<&'a Arc<CachedObject>>>,
) -> impl Iterator<Item = (&'a str, &'a Arc<CachedObject>)> + 'a {
    let mut cur = current.map(|(k, v)| (k.as_str(), v)).peekable();
    let mut ov = overlay.into_iter().peekable();
    std::iter::from_fn(move || {
        loop {
            let take_overlay = match (cur.peek(), ov.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((ck, _)), Some((ok, _))) => {
                    if ck == ok {
                        cur.next();
                        true
                    } else {
                        ok < ck
                    }
                }
            };
            if take_overlay {
                match ov.next() {
                    Some((k, Some(v))) => return Some((k, v)),
                    _ => continue,
                }
            }
            return cur.next();
        }
    })
}

impl ResourceCache {
    fn new(start: Revision) -> Self {
        Self::with_bound(start, HistoryBound::default())
    }

    fn with_bound(start: Revision, bound: HistoryBound) -> Self {
        let (events, _) = broadcast::channel(LIVE_BUFFER);
        ResourceCache {
            state: RwLock::new(State {
                items: BTreeMap::new(),
                item_bytes: 0,
                history: VecDeque::new(),
                history_bytes: 0,
                oldest: start,
                applied: start,
            }),
            events,
            bound,
        }
    }

    /// A snapshot of every object under `prefix` (a key prefix inside this resource).
    pub fn list(&self, prefix: &str) -> Vec<Arc<CachedObject>> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        st.items
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
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

    /// The history's size: (events, bytes charged) and the oldest revision watches may resume
    /// from.
    pub fn history_size(&self) -> (usize, usize, Revision) {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        (st.history.len(), st.history_bytes, st.oldest)
    }

    /// What this resource holds: its objects (count and JSON bytes) and its watch history.
    pub fn stats(&self) -> CacheStats {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        CacheStats {
            objects: st.items.len(),
            object_bytes: st.item_bytes,
            history_events: st.history.len(),
            history_bytes: st.history_bytes,
        }
    }

    /// Every object under `prefix` as it was at revision `at`, in key order: the current objects
    /// with the changes made after `at` undone from the history (a consistent snapshot for paged
    /// lists, as etcd serves a range at a revision). `at` must be a revision the cache has
    /// applied; `Err(oldest)` when the history no longer reaches back to it.
    pub fn list_at(&self, prefix: &str, at: Revision) -> Result<Vec<Arc<CachedObject>>, Revision> {
        match self.page(prefix, at, None, None, false, |_| Ok::<_, ()>(true)) {
            Ok(p) => Ok(p.items),
            Err(PageError::TooOld(r)) => Err(r),
            Err(PageError::Filter(())) => Ok(Vec::new()),
        }
    }

    /// One page of the list of `prefix` at revision `at`: the objects from key `start` on
    /// (inclusive) for which `keep` holds, at most `limit` of them. Seeks to `start` in the
    /// ordered index and stops after `limit` matches, so a page costs O(limit + changes since
    /// `at` + skipped non-matching objects), not O(all objects). `count_remaining`: count the
    /// snapshot's objects after the page (upstream's `remainingItemCount`, for unfiltered lists).
    pub fn page<E>(
        &self,
        prefix: &str,
        at: Revision,
        start: Option<&str>,
        limit: Option<usize>,
        count_remaining: bool,
        mut keep: impl FnMut(&CachedObject) -> Result<bool, E>,
    ) -> Result<Page, PageError<E>> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        if at < st.oldest {
            return Err(PageError::TooOld(st.oldest));
        }
        let lo = match start {
            Some(s) if s > prefix => s,
            _ => prefix,
        };
        // Key -> its state at `at` (None: absent), for keys changed after `at`. Walking back
        // from the newest event, the earliest change after `at` is written last.
        let mut overlay: BTreeMap<&str, Option<&Arc<CachedObject>>> = BTreeMap::new();
        for (key, ev) in st.history.iter().rev() {
            if ev.revision <= at {
                break;
            }
            if !key.starts_with(prefix) || &**key < lo {
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
            .range::<str, _>((Bound::Included(lo), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix));
        let mut all = merged(current, overlay);
        let mut items = Vec::new();
        let mut last_key = None;
        let limit = limit.unwrap_or(usize::MAX);
        if limit > 0 {
            for (k, o) in all.by_ref() {
                if keep(o).map_err(PageError::Filter)? {
                    items.push(o.clone());
                    if items.len() >= limit {
                        last_key = Some(k);
                        break;
                    }
                }
            }
        }
        let (next, remaining) = match last_key {
            None => (None, None),
            Some(k) => {
                if count_remaining {
                    let n = all.count();
                    ((n > 0).then(|| k.to_string()), (n > 0).then_some(n))
                } else {
                    (all.next().map(|_| k.to_string()), None)
                }
            }
        };
        Ok(Page {
            items,
            next,
            remaining,
        })
    }

    /// Subscribes to live events and snapshots the current objects under `prefix`, atomically.
    pub fn snapshot_and_subscribe(
        &self,
        prefix: &str,
    ) -> (Vec<Arc<CachedObject>>, broadcast::Receiver<Arc<CacheEvent>>) {
        let (items, live, _) = self.snapshot_at(prefix, || 0);
        (items, live)
    }

    /// Subscribes to live events and snapshots the current objects under `prefix` atomically,
    /// with the snapshot's revision: everything up to it is in the snapshot, every later
    /// change comes through the receiver. `published` reads the cache-wide revision (every
    /// event up to it is applied to every resource).
    pub fn snapshot_at(
        &self,
        prefix: &str,
        published: impl Fn() -> Revision,
    ) -> (
        Vec<Arc<CachedObject>>,
        broadcast::Receiver<Arc<CacheEvent>>,
        Revision,
    ) {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        let live = self.events.subscribe();
        let rev = published().max(st.applied);
        let items = st
            .items
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect();
        (items, live, rev)
    }

    /// Subscribes to events after `after`. `Err(oldest)` when that revision is too old.
    pub fn subscribe_from(&self, after: Revision) -> Result<Subscription, Revision> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        if after < st.oldest {
            return Err(st.oldest);
        }
        let live = self.events.subscribe();
        // Events are in revision order: binary search the first one after `after`.
        let from = st.history.partition_point(|(_, e)| e.revision <= after);
        let replay = st.history.range(from..).map(|(_, e)| e.clone()).collect();
        Ok(Subscription { replay, live })
    }

    fn apply(&self, key: &str, ev: CacheEvent) {
        let ev = Arc::new(ev);
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        let (added, removed) = match ev.kind {
            EventType::Deleted => (0, st.items.remove(key).map_or(0, |o| o.bytes.len())),
            _ => {
                let old = if let Some(slot) = st.items.get_mut(key) {
                    std::mem::replace(slot, ev.object.clone()).bytes.len()
                } else {
                    st.items.insert(key.to_string(), ev.object.clone());
                    0
                };
                (ev.object.bytes.len(), old)
            }
        };
        st.item_bytes = (st.item_bytes + added).saturating_sub(removed);
        st.applied = st.applied.max(ev.revision);
        st.history_bytes += ev.weight();
        st.history.push_back((Arc::from(key), ev.clone()));
        while st.history.len() > self.bound.events
            || (st.history_bytes > self.bound.bytes && st.history.len() > 1)
        {
            let Some((_, old)) = st.history.pop_front() else {
                break;
            };
            st.history_bytes -= old.weight();
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

/// Keys read per store range while loading: the load's transient memory is one chunk of stored
/// objects, not a whole resource (150,000 Pods).
pub const LOAD_CHUNK: usize = 2048;

/// The objects stored under `prefix` at `revision`, in key order, in their cached form; read in
/// chunks of [`LOAD_CHUNK`] keys, each object parsed once ([`compact::stamp`]).
async fn load_range(
    store: &dyn Store,
    prefix: &str,
    revision: Revision,
) -> Result<Vec<(String, Arc<CachedObject>)>, StoreError> {
    load_chunked(store, prefix, revision, LOAD_CHUNK).await
}

async fn load_chunked(
    store: &dyn Store,
    prefix: &str,
    revision: Revision,
    chunk: usize,
) -> Result<Vec<(String, Arc<CachedObject>)>, StoreError> {
    let mut out = Vec::new();
    let mut start_after: Option<String> = None;
    loop {
        let res = store
            .range(
                prefix,
                ferry_store::RangeOptions {
                    revision,
                    limit: chunk,
                    start_after: start_after.take(),
                },
            )
            .await?;
        start_after = res.kvs.last().map(|kv| kv.key.clone());
        for kv in res.kvs {
            if let Some(obj) = CachedObject::from_stored_key(&kv.key, &kv.value, kv.mod_revision) {
                out.push((kv.key, obj));
            }
        }
        if !res.more || start_after.is_none() {
            return Ok(out);
        }
    }
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
            let objects = load_range(store, prefix, revision).await?;
            {
                let mut st = rc.state.write().unwrap_or_else(|e| e.into_inner());
                st.item_bytes += objects.iter().map(|(_, o)| o.bytes.len()).sum::<usize>();
                st.items.extend(objects);
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
                    CachedObject::from_stored_key(&key, &kv.value, kv.mod_revision).map(|object| {
                        CacheEvent {
                            kind: if prev.is_some() {
                                EventType::Modified
                            } else {
                                EventType::Added
                            },
                            revision: rev,
                            object,
                            prev,
                        }
                    })
                }
                Event::Delete {
                    prev: last,
                    revision,
                } => CachedObject::from_stored_key(&key, &last.value, revision).map(|object| {
                    CacheEvent {
                        kind: EventType::Deleted,
                        revision,
                        object,
                        prev,
                    }
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
            let fresh: BTreeMap<String, Arc<CachedObject>> = load_range(store, prefix, revision)
                .await?
                .into_iter()
                .collect();
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
                    && let Some(object) = CachedObject::from_stored_key(key, &prev.bytes, revision)
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
        let res = match load_range(store, prefix, revision).await {
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
        for (key, obj) in res {
            if !touched.contains(key.as_str()) {
                let len = obj.bytes.len();
                if let Some(old) = st.items.insert(key, obj) {
                    st.item_bytes -= old.bytes.len();
                }
                st.item_bytes += len;
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
                    o.name().to_string(),
                    o.value()["data"]["v"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    }

    #[test]
    fn stats_count_objects_bytes_and_history() {
        let rc = ResourceCache::new(0);
        let size = |name: &str, v: u32, rev: Revision| obj(name, v, rev).bytes.len();
        put(&rc, "a", 1, 1);
        put(&rc, "b", 22, 2);
        put(&rc, "a", 333, 3);
        del(&rc, "b", 4);
        let s = rc.stats();
        assert_eq!((s.objects, s.object_bytes), (1, size("a", 333, 3)));
        assert_eq!(s.history_events, 4);
        assert!(s.history_bytes >= 4 * HISTORY_ENTRY_OVERHEAD);
        let sum: usize = rc.list("").iter().map(|o| o.bytes.len()).sum();
        assert_eq!(s.object_bytes, sum);
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

    fn names(items: &[Arc<CachedObject>]) -> Vec<String> {
        items.iter().map(|o| o.name().to_string()).collect()
    }

    /// Pages through the snapshot at `at` with `limit`, as a client following continue keys.
    fn page_all(rc: &ResourceCache, at: Revision, limit: usize) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let p = rc
                .page(
                    "/registry/things/",
                    at,
                    start.as_deref(),
                    Some(limit),
                    true,
                    |_| Ok::<_, ()>(true),
                )
                .expect("in history");
            assert!(p.items.len() <= limit);
            out.extend(p.items.iter().map(|o| {
                (
                    o.name().to_string(),
                    o.value()["data"]["v"].as_u64().unwrap_or(0),
                )
            }));
            match p.next {
                // The continue token's start: the last key + "\0".
                Some(k) => start = Some(format!("{k}\u{0}")),
                None => return out,
            }
        }
    }

    #[test]
    fn pages_are_one_snapshot_across_concurrent_writes() {
        let rc = ResourceCache::new(1);
        for (i, n) in ["a", "b", "c", "d", "e", "f", "g"].iter().enumerate() {
            put(&rc, n, 1, 2 + i as i64);
        }
        let at = 8;
        let want = names_at(&rc, at);
        // First page, then writes, then the rest: still the snapshot at 8.
        let first = rc
            .page("/registry/things/", at, None, Some(3), true, |_| {
                Ok::<_, ()>(true)
            })
            .expect("page");
        assert_eq!(names(&first.items), ["a", "b", "c"]);
        assert_eq!(first.next.as_deref(), Some("/registry/things/c"));
        assert_eq!(first.remaining, Some(4));
        put(&rc, "d", 2, 9);
        del(&rc, "e", 10);
        put(&rc, "bb", 1, 11);
        put(&rc, "h", 1, 12);
        del(&rc, "a", 13);
        put(&rc, "e", 5, 14);
        assert_eq!(page_all(&rc, at, 3), want);
        assert_eq!(page_all(&rc, at, 1), want);
        assert_eq!(page_all(&rc, at, 100), want);
        // The latest snapshot sees the writes.
        let now: Vec<String> = page_all(&rc, 14, 2).into_iter().map(|(n, _)| n).collect();
        assert_eq!(now, ["b", "bb", "c", "d", "e", "f", "g", "h"]);
    }

    #[test]
    fn page_filters_and_counts_without_a_filter_only() {
        let rc = ResourceCache::new(1);
        for i in 0..10 {
            put(&rc, &format!("o{i}"), i, 2 + i64::from(i));
        }
        let odd =
            |o: &CachedObject| Ok::<_, ()>(o.value()["data"]["v"].as_u64().unwrap_or(0) % 2 == 1);
        let p = rc
            .page("/registry/things/", 11, None, Some(2), false, odd)
            .expect("page");
        assert_eq!(names(&p.items), ["o1", "o3"]);
        assert_eq!(p.next.as_deref(), Some("/registry/things/o3"));
        assert_eq!(p.remaining, None);
        // The last matching object ends the page; later non-matching ones still mean "more"
        // (upstream: the continue token is set when the range has more keys).
        let p = rc
            .page(
                "/registry/things/",
                11,
                Some("/registry/things/o7\u{0}"),
                Some(1),
                false,
                odd,
            )
            .expect("page");
        assert_eq!(names(&p.items), ["o9"]);
        assert_eq!(p.next, None);
        // A filter error ends the list.
        let err = rc
            .page("/registry/things/", 11, None, None, false, |_| {
                Err::<bool, _>("bad")
            })
            .expect_err("filter error");
        assert_eq!(err, PageError::Filter("bad"));
        // The exact last page has no continue.
        let p = rc
            .page(
                "/registry/things/",
                11,
                Some("/registry/things/o8\u{0}"),
                Some(1),
                true,
                |_| Ok::<_, ()>(true),
            )
            .expect("page");
        assert_eq!(names(&p.items), ["o9"]);
        assert_eq!((p.next, p.remaining), (None, None));
    }

    #[test]
    fn history_is_bounded_by_count_and_bytes_and_old_revisions_are_gone() {
        let rc = ResourceCache::with_bound(
            1,
            HistoryBound {
                events: 5,
                bytes: usize::MAX,
            },
        );
        for i in 0..20 {
            put(&rc, "a", i, 2 + i64::from(i));
        }
        let (events, _, oldest) = rc.history_size();
        assert_eq!(events, 5);
        assert_eq!(oldest, 16);
        assert!(rc.subscribe_from(15).is_err());
        let sub = rc.subscribe_from(16).expect("in history");
        assert_eq!(
            sub.replay.iter().map(|e| e.revision).collect::<Vec<_>>(),
            [17, 18, 19, 20, 21]
        );
        assert!(matches!(
            rc.page("/registry/things/", 15, None, None, false, |_| Ok::<_, ()>(
                true
            )),
            Err(PageError::TooOld(16))
        ));

        // By bytes: big objects push old events out long before the count bound.
        let rc = ResourceCache::with_bound(
            1,
            HistoryBound {
                events: 1000,
                bytes: 10_000,
            },
        );
        let big = "x".repeat(1000);
        for i in 0..50i64 {
            let raw = serde_json::json!({"metadata": {"name": "a"}, "data": {"v": i, "pad": big}});
            let prev = rc.get("/registry/things/a");
            rc.apply(
                "/registry/things/a",
                CacheEvent {
                    kind: if prev.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    revision: 2 + i,
                    object: CachedObject::from_store(raw.to_string().as_bytes(), 2 + i)
                        .expect("object"),
                    prev,
                },
            );
        }
        let (events, bytes, oldest) = rc.history_size();
        assert!(bytes <= 10_000, "{bytes}");
        assert!((2..10).contains(&events), "{events}");
        assert_eq!(oldest, 51 - events as i64);
        assert!(rc.subscribe_from(oldest - 1).is_err());
        assert!(rc.subscribe_from(oldest).is_ok());
    }

    #[test]
    fn cached_objects_hold_bytes_and_compact_metadata() {
        let raw = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","labels":{"app":"web","tier":"fe"},"resourceVersion":"3"},"spec":{"nodeName":"n1"}}"#;
        let o = CachedObject::from_store(raw, 77).expect("object");
        assert_eq!(o.name(), "p");
        assert_eq!(o.namespace(), "ns");
        assert_eq!(
            o.labels().into_iter().collect::<Vec<_>>(),
            [
                ("app".to_string(), "web".to_string()),
                ("tier".into(), "fe".into())
            ]
        );
        let v = o.value();
        assert_eq!(v["metadata"]["resourceVersion"], "77");
        assert_eq!(v["spec"]["nodeName"], "n1");
        // Exactly sized: no spare capacity kept per object.
        assert_eq!(o.bytes.len(), raw.len() + 1);
        // Label strings are shared between objects.
        let o2 = CachedObject::from_store(raw, 78).expect("object");
        assert!(Arc::ptr_eq(&o.labels[0].0, &o2.labels[0].0));
        assert!(Arc::ptr_eq(&o.namespace, &o2.namespace));
        assert!(CachedObject::from_store(b"[1]", 1).is_none());
        assert!(CachedObject::from_store(b"{", 1).is_none());
    }

    /// The load reads in chunks: every object, in key order, at the load's revision (later
    /// writes undone), however the chunks fall.
    #[tokio::test]
    async fn load_reads_every_chunk_at_one_revision() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ferry_store::RedbStore::open(&dir.path().join("db")).expect("open");
        let prefix = "/registry/things/";
        for i in 0..10 {
            let raw = serde_json::json!({"metadata": {"name": format!("o{i}")}, "data": {"v": i}});
            store
                .create(&format!("{prefix}o{i}"), Bytes::from(raw.to_string()))
                .await
                .expect("create");
        }
        store
            .create("/registry/thingsother/x", Bytes::from_static(b"{}"))
            .await
            .expect("create");
        let at = store.current_revision().await.expect("rev");
        store
            .delete(&format!("{prefix}o3"), None)
            .await
            .expect("delete");
        for chunk in [1, 3, 10, 11, 2048] {
            let got = load_chunked(&store, prefix, at, chunk).await.expect("load");
            let names: Vec<&str> = got.iter().map(|(_, o)| o.name()).collect();
            assert_eq!(
                names,
                ["o0", "o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8", "o9"],
                "chunk {chunk}"
            );
            assert!(
                got.iter()
                    .all(|(k, o)| *k == format!("{prefix}{}", o.name()))
            );
        }
        let now = load_chunked(&store, prefix, 0, 4).await.expect("load");
        assert_eq!(now.len(), 9);
    }
}
