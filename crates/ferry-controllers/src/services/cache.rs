//! Informer-style caches fed by kube-rs watchers (the work queue is [`crate::runtime::WorkQueue`]).
//!
//! A poisoned lock (a panic while a guard was held) is taken over rather than read as an empty
//! cache: every critical section is a single map operation, so the data stays consistent, and
//! an empty read could make a sync delete every endpoint of a Service.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// `namespace/name` ("" namespace for cluster-scoped objects).
pub type Key = (String, String);

/// Objects of one kind by namespace and name.
pub struct Cache<K> {
    data: RwLock<HashMap<String, HashMap<String, Arc<K>>>>,
    synced: AtomicBool,
    pub synced_notify: Notify,
}

impl<K: Resource> Default for Cache<K> {
    fn default() -> Self {
        Cache {
            data: RwLock::new(HashMap::new()),
            synced: AtomicBool::new(false),
            synced_notify: Notify::new(),
        }
    }
}

fn key_of<K: Resource>(o: &K) -> Key {
    (o.namespace().unwrap_or_default(), o.name_any())
}

impl<K: Resource> Cache<K> {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, HashMap<String, Arc<K>>>> {
        self.data.read().unwrap_or_else(PoisonError::into_inner)
    }
    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, HashMap<String, Arc<K>>>> {
        self.data.write().unwrap_or_else(PoisonError::into_inner)
    }
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<K>> {
        self.read().get(ns).and_then(|m| m.get(name)).cloned()
    }
    pub fn in_namespace(&self, ns: &str) -> Vec<Arc<K>> {
        self.read()
            .get(ns)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
    pub fn all(&self) -> Vec<Arc<K>> {
        self.read()
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }
    pub fn len(&self) -> usize {
        self.read().values().map(HashMap::len).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }
    fn put(&self, o: K) -> (Option<Arc<K>>, Arc<K>) {
        let (ns, name) = key_of(&o);
        let o = Arc::new(o);
        let old = self.write().entry(ns).or_default().insert(name, o.clone());
        (old, o)
    }
    fn remove(&self, o: &K) -> Option<Arc<K>> {
        let (ns, name) = key_of(o);
        let mut d = self.write();
        let m = d.get_mut(&ns)?;
        let old = m.remove(&name);
        if m.is_empty() {
            d.remove(&ns);
        }
        old
    }
    /// Caches an object shared with another store (a [`crate::runtime::SharedInformer`]'s).
    pub fn put_shared(&self, o: Arc<K>) -> Option<Arc<K>> {
        let (ns, name) = key_of(o.as_ref());
        self.write().entry(ns).or_default().insert(name, o)
    }
    /// Drops `o`'s entry (for caches fed by [`Cache::put_shared`]).
    pub fn remove_shared(&self, o: &K) -> Option<Arc<K>> {
        self.remove(o)
    }
    /// Marks the cache listed (for caches fed by [`Cache::put_shared`]).
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::SeqCst);
        self.synced_notify.notify_waiters();
    }
    fn replace(&self, items: Vec<K>) -> Vec<Arc<K>> {
        let mut next: HashMap<String, HashMap<String, Arc<K>>> = HashMap::new();
        for o in items {
            let (ns, name) = key_of(&o);
            next.entry(ns).or_default().insert(name, Arc::new(o));
        }
        let old = std::mem::replace(&mut *self.write(), next);
        old.into_values().flat_map(|m| m.into_values()).collect()
    }
}

/// What a watch reports to its handler.
pub enum Change<K> {
    /// Created or updated (`old` = the cached version before).
    Apply {
        old: Option<Arc<K>>,
        new: Arc<K>,
    },
    Delete {
        old: Arc<K>,
    },
    /// A (re)list replaced the cache; `old` is what was cached before.
    Resync {
        old: Vec<Arc<K>>,
    },
}

/// Runs a watcher of `api` into `cache` until `stop`, calling `on` for every change.
pub async fn run_watch<K>(
    api: Api<K>,
    cache: Arc<Cache<K>>,
    on: impl Fn(Change<K>) + Send + Sync + 'static,
    stop: CancellationToken,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let mut stream = crate::runtime::reflect::watch_stream(api, watcher::Config::default())
        .modify(crate::runtime::reflect::slim_meta::<K>)
        .default_backoff()
        .boxed();
    let mut buffer: Vec<K> = Vec::new();
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            ev = stream.next() => ev,
        };
        let Some(ev) = ev else { return };
        match ev {
            Ok(watcher::Event::Init) => buffer.clear(),
            Ok(watcher::Event::InitApply(o)) => buffer.push(o),
            Ok(watcher::Event::InitDone) => {
                let old = cache.replace(std::mem::take(&mut buffer));
                cache.synced.store(true, Ordering::SeqCst);
                cache.synced_notify.notify_waiters();
                on(Change::Resync { old });
            }
            Ok(watcher::Event::Apply(o)) => {
                let (old, new) = cache.put(o);
                on(Change::Apply { old, new });
            }
            Ok(watcher::Event::Delete(o)) => {
                let old = cache.remove(&o).unwrap_or_else(|| Arc::new(o));
                on(Change::Delete { old });
            }
            Err(e) => tracing::debug!("watch error: {e}"),
        }
    }
}

/// Waits until the cache has been listed once.
pub async fn wait_synced<K: Resource>(cache: &Cache<K>, stop: &CancellationToken) -> bool {
    loop {
        let n = cache.synced_notify.notified();
        if cache.is_synced() {
            return true;
        }
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = n => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn pod(ns: &str, name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p
    }

    #[test]
    fn a_poisoned_cache_still_reads_its_contents() {
        let c: Arc<Cache<Pod>> = Arc::default();
        c.put(pod("ns", "a"));
        c.put(pod("ns", "b"));
        let cc = c.clone();
        // A panic while the write guard is held poisons the lock.
        let r = std::thread::spawn(move || {
            let _g = cc.data.write();
            panic!("poison");
        })
        .join();
        assert!(r.is_err());
        assert!(c.data.is_poisoned());
        assert_eq!(c.len(), 2);
        assert_eq!(c.in_namespace("ns").len(), 2);
        assert!(c.get("ns", "a").is_some());
        c.put(pod("ns", "c"));
        assert_eq!(c.all().len(), 3);
        assert!(c.remove(&pod("ns", "a")).is_some());
        assert_eq!(c.replace(vec![pod("x", "y")]).len(), 2);
        assert_eq!(c.len(), 1);
    }
}
