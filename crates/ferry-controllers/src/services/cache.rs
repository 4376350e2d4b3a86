//! Informer-style caches fed by kube-rs watchers, and a coalescing work queue keyed by Service.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
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
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<K>> {
        self.data
            .read()
            .ok()?
            .get(ns)
            .and_then(|m| m.get(name))
            .cloned()
    }
    pub fn in_namespace(&self, ns: &str) -> Vec<Arc<K>> {
        self.data
            .read()
            .map(|d| {
                d.get(ns)
                    .map(|m| m.values().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }
    pub fn all(&self) -> Vec<Arc<K>> {
        self.data
            .read()
            .map(|d| d.values().flat_map(|m| m.values().cloned()).collect())
            .unwrap_or_default()
    }
    pub fn len(&self) -> usize {
        self.data
            .read()
            .map(|d| d.values().map(HashMap::len).sum())
            .unwrap_or(0)
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
        let old = self
            .data
            .write()
            .ok()
            .and_then(|mut d| d.entry(ns).or_default().insert(name, o.clone()));
        (old, o)
    }
    fn remove(&self, o: &K) -> Option<Arc<K>> {
        let (ns, name) = key_of(o);
        let mut d = self.data.write().ok()?;
        let m = d.get_mut(&ns)?;
        let old = m.remove(&name);
        if m.is_empty() {
            d.remove(&ns);
        }
        old
    }
    fn replace(&self, items: Vec<K>) -> Vec<Arc<K>> {
        let mut next: HashMap<String, HashMap<String, Arc<K>>> = HashMap::new();
        for o in items {
            let (ns, name) = key_of(&o);
            next.entry(ns).or_default().insert(name, Arc::new(o));
        }
        let old = match self.data.write() {
            Ok(mut d) => std::mem::replace(&mut *d, next),
            Err(_) => HashMap::new(),
        };
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
{
    let mut stream = watcher(api, watcher::Config::default())
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

/// A coalescing work queue: a key queued while waiting is queued once; a key queued while being
/// processed is processed again afterwards (never by two workers at once).
#[derive(Default)]
pub struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
}

#[derive(Default)]
struct QueueState {
    queue: VecDeque<Key>,
    dirty: HashSet<Key>,
    processing: HashSet<Key>,
}

impl Queue {
    pub fn add(&self, k: Key) {
        let Ok(mut s) = self.state.lock() else { return };
        if !s.dirty.insert(k.clone()) {
            return;
        }
        if !s.processing.contains(&k) {
            s.queue.push_back(k);
            drop(s);
            self.notify.notify_one();
        }
    }
    pub fn add_after(self: &Arc<Self>, k: Key, after: Duration) {
        let q = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            q.add(k);
        });
    }
    pub fn len(&self) -> usize {
        self.state.lock().map(|s| s.queue.len()).unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The next key to process; None once `stop` is cancelled.
    pub async fn get(&self, stop: &CancellationToken) -> Option<Key> {
        loop {
            let n = self.notify.notified();
            if let Ok(mut s) = self.state.lock()
                && let Some(k) = s.queue.pop_front()
            {
                s.dirty.remove(&k);
                s.processing.insert(k.clone());
                return Some(k);
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = n => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
    pub fn done(&self, k: &Key) {
        let Ok(mut s) = self.state.lock() else { return };
        s.processing.remove(k);
        if s.dirty.contains(k) {
            s.queue.push_back(k.clone());
            drop(s);
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Key {
        ("ns".into(), s.into())
    }

    #[tokio::test]
    async fn coalesces_and_serialises() {
        let q = Queue::default();
        let stop = CancellationToken::new();
        q.add(k("a"));
        q.add(k("a"));
        q.add(k("b"));
        assert_eq!(q.len(), 2);
        let a = q.get(&stop).await;
        assert_eq!(a, Some(k("a")));
        // Re-added while processing: not handed out until done.
        q.add(k("a"));
        assert_eq!(q.get(&stop).await, Some(k("b")));
        assert!(q.is_empty());
        q.done(&k("a"));
        assert_eq!(q.get(&stop).await, Some(k("a")));
        q.done(&k("a"));
        q.done(&k("b"));
        assert!(q.is_empty());
    }
}
