//! The node side: watches of NetworkPolicies, Pods, Namespaces and Nodes feed a change
//! tracker (the model); one coalescing sync loop renders the node's table at most once per
//! `min_interval` (and at least once per `max_interval`) and applies the difference in the
//! node's network namespace. kube-proxy's pattern: handlers record, the loop applies.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::apply::{Applier, Target};
use crate::metrics::Metrics;
use crate::model::{self, Model, PodKey};
use crate::render::{RenderOptions, render};
use crate::ruleset::DiffStats;

/// The model as the watches report it, plus sync bookkeeping.
#[derive(Debug, Default)]
pub struct TrackState {
    pub model: Model,
    pending_since: Option<Instant>,
    synced: [bool; 4],
}

/// Shared by the watches (writers) and the sync loop (reader).
#[derive(Debug, Default)]
pub struct Tracker {
    state: Mutex<TrackState>,
    notify: Notify,
}

/// The watched kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Policy = 0,
    Pod = 1,
    Namespace = 2,
    Node = 3,
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, TrackState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Applies `f`; when it reports a change, queues a sync.
    pub fn update(&self, f: impl FnOnce(&mut Model) -> bool) -> bool {
        let changed = {
            let mut st = self.lock();
            let changed = f(&mut st.model);
            if changed && st.pending_since.is_none() {
                st.pending_since = Some(Instant::now());
            }
            changed
        };
        if changed {
            self.notify.notify_one();
        }
        changed
    }
    pub fn mark_synced(&self, kind: Kind) {
        self.lock().synced[kind as usize] = true;
        self.notify.notify_one();
    }
    /// Every watch has listed once.
    pub fn synced(&self) -> bool {
        self.lock().synced.iter().all(|s| *s)
    }
    /// A copy of the model.
    pub fn model(&self) -> Model {
        self.lock().model.clone()
    }
    /// How long the oldest unapplied change has waited.
    pub fn pending_for(&self) -> Option<Duration> {
        self.lock().pending_since.map(|t| t.elapsed())
    }
}

/// How one kind updates the model.
trait Tracked: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static {
    const KIND: Kind;
    fn key(&self) -> PodKey {
        PodKey::new(self.namespace().unwrap_or_default(), self.name_any())
    }
    fn upsert(&self, m: &mut Model) -> bool;
    fn remove(m: &mut Model, key: &PodKey) -> bool;
    fn keys(m: &Model) -> Vec<PodKey>;
}

fn put<K: Ord, V: PartialEq>(
    map: &mut std::collections::BTreeMap<K, V>,
    k: K,
    v: Option<V>,
) -> bool {
    match v {
        Some(v) if map.get(&k) == Some(&v) => false,
        Some(v) => {
            map.insert(k, v);
            true
        }
        None => map.remove(&k).is_some(),
    }
}

impl Tracked for NetworkPolicy {
    const KIND: Kind = Kind::Policy;
    fn upsert(&self, m: &mut Model) -> bool {
        let p = match model::project_policy(self) {
            Ok(p) => Some(p),
            Err(e) => {
                // Validated by the API server; a policy we cannot read isolates nothing.
                tracing::warn!(policy = %self.key(), "ignoring NetworkPolicy: {e}");
                None
            }
        };
        put(&mut m.policies, self.key(), p)
    }
    fn remove(m: &mut Model, key: &PodKey) -> bool {
        m.policies.remove(key).is_some()
    }
    fn keys(m: &Model) -> Vec<PodKey> {
        m.policies.keys().cloned().collect()
    }
}

impl Tracked for Pod {
    const KIND: Kind = Kind::Pod;
    fn upsert(&self, m: &mut Model) -> bool {
        match model::project_pod(self) {
            Some((k, p)) => put(&mut m.pods, k, Some(p)),
            None => false,
        }
    }
    fn remove(m: &mut Model, key: &PodKey) -> bool {
        m.pods.remove(key).is_some()
    }
    fn keys(m: &Model) -> Vec<PodKey> {
        m.pods.keys().cloned().collect()
    }
}

impl Tracked for Namespace {
    const KIND: Kind = Kind::Namespace;
    fn key(&self) -> PodKey {
        PodKey::new("", self.name_any())
    }
    fn upsert(&self, m: &mut Model) -> bool {
        match model::project_namespace(self) {
            Some((k, l)) => put(&mut m.namespaces, k, Some(l)),
            None => false,
        }
    }
    fn remove(m: &mut Model, key: &PodKey) -> bool {
        m.namespaces.remove(&key.name).is_some()
    }
    fn keys(m: &Model) -> Vec<PodKey> {
        m.namespaces
            .keys()
            .map(|n| PodKey::new("", n.clone()))
            .collect()
    }
}

impl Tracked for Node {
    const KIND: Kind = Kind::Node;
    fn key(&self) -> PodKey {
        PodKey::new("", self.name_any())
    }
    fn upsert(&self, m: &mut Model) -> bool {
        match model::project_node(self) {
            Some((k, ips)) => put(&mut m.nodes, k, Some(ips)),
            None => false,
        }
    }
    fn remove(m: &mut Model, key: &PodKey) -> bool {
        m.nodes.remove(&key.name).is_some()
    }
    fn keys(m: &Model) -> Vec<PodKey> {
        m.nodes.keys().map(|n| PodKey::new("", n.clone())).collect()
    }
}

/// Applies one watch event; objects missing from a re-list are removed at `InitDone`.
fn apply_event<K: Tracked>(
    tracker: &Tracker,
    relist: &mut Option<HashSet<PodKey>>,
    ev: Event<K>,
) -> bool {
    match ev {
        Event::Init => {
            *relist = Some(HashSet::new());
            false
        }
        Event::InitApply(o) => {
            if let Some(seen) = relist.as_mut() {
                seen.insert(o.key());
            }
            tracker.update(|m| o.upsert(m));
            false
        }
        Event::InitDone => {
            let seen = relist.take().unwrap_or_default();
            tracker.update(|m| {
                let stale: Vec<PodKey> = K::keys(m)
                    .into_iter()
                    .filter(|k| !seen.contains(k))
                    .collect();
                let mut changed = false;
                for k in stale {
                    changed |= K::remove(m, &k);
                }
                changed
            });
            true
        }
        Event::Apply(o) => {
            tracker.update(|m| o.upsert(m));
            false
        }
        Event::Delete(o) => {
            let k = o.key();
            tracker.update(|m| K::remove(m, &k));
            false
        }
    }
}

async fn watch_kind<K: Tracked>(api: Api<K>, tracker: Arc<Tracker>)
where
    K::DynamicType: Default,
{
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut relist = None;
    let mut synced = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                if apply_event(&tracker, &mut relist, ev) && !synced {
                    synced = true;
                    tracker.mark_synced(K::KIND);
                }
            }
            Err(e) => {
                tracing::warn!(kind = ?K::KIND, "netpol watch failed: {e}; keeping the last rules")
            }
        }
    }
}

/// Starts the four watches.
pub fn spawn_watches(client: Client, tracker: Arc<Tracker>) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(watch_kind::<NetworkPolicy>(
            Api::all(client.clone()),
            tracker.clone(),
        )),
        tokio::spawn(watch_kind::<Pod>(Api::all(client.clone()), tracker.clone())),
        tokio::spawn(watch_kind::<Namespace>(
            Api::all(client.clone()),
            tracker.clone(),
        )),
        tokio::spawn(watch_kind::<Node>(Api::all(client), tracker)),
    ]
}

/// Settings of a node's enforcement.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    /// The node's network namespace (None: this process's).
    pub target: Target,
    pub render: RenderOptions,
    pub min_interval: Duration,
    pub max_interval: Duration,
    /// Remove the table when stopping (left in place by default: enforcement outlives a
    /// restart of the agent, as with kube-proxy's rules).
    pub cleanup_on_exit: bool,
    /// Where syncs are recorded and the node's verdict counters are exported.
    pub metrics: Option<Arc<Metrics>>,
}

impl AgentConfig {
    pub fn new(node_name: impl Into<String>, target: Target) -> AgentConfig {
        AgentConfig {
            node_name: node_name.into(),
            target,
            render: RenderOptions::default(),
            min_interval: Duration::from_millis(100),
            max_interval: Duration::from_secs(60),
            cleanup_on_exit: false,
            metrics: None,
        }
    }
}

/// What the loop publishes after each sync.
#[derive(Debug, Clone, Default)]
pub struct SyncStatus {
    pub syncs: u64,
    pub last_sync: Option<SystemTime>,
    pub last_diff: DiffStats,
    pub last_error: Option<String>,
    pub isolated_chains: usize,
}

/// The sync loop: runs until `cancel`.
pub async fn run_sync(
    tracker: Arc<Tracker>,
    cfg: AgentConfig,
    status: watch::Sender<SyncStatus>,
    cancel: CancellationToken,
) {
    while !tracker.synced() {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tracker.notify.notified() => {}
        }
    }
    let applier = Arc::new(Mutex::new(Applier::new(cfg.target.clone())));
    let mut last_run: Option<Instant> = None;
    let mut syncs = 0u64;
    let mut max_wait = cfg.max_interval;
    loop {
        if let Some(last) = last_run {
            let since = last.elapsed();
            if since < cfg.min_interval {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(cfg.min_interval - since) => {}
                }
            }
        }
        last_run = Some(Instant::now());
        let (model, pending_since) = {
            let mut st = tracker.lock();
            (st.model.clone(), st.pending_since.take())
        };
        let node = cfg.node_name.clone();
        let opts = cfg.render.clone();
        let ap = applier.clone();
        let started = Instant::now();
        let result = tokio::task::spawn_blocking(move || {
            let table = render(&model, &node, &opts);
            let chains = table
                .chains
                .keys()
                .filter(|c| c.starts_with("i_") || c.starts_with("e_"))
                .count();
            let mut ap = ap.lock().unwrap_or_else(|e| e.into_inner());
            ap.apply(&table).map(|d| (d, chains))
        })
        .await;
        syncs += 1;
        let apply_time = started.elapsed();
        // From the first change this sync carries to the kernel holding it.
        let latency = pending_since.map(|t| t.elapsed());
        if let Some(m) = &cfg.metrics {
            let chains = match &result {
                Ok(Ok((_, c))) => Some(*c),
                _ => None,
            };
            m.record_sync(
                &cfg.node_name,
                matches!(result, Ok(Ok(_))),
                latency,
                apply_time,
                chains,
            );
        }
        let mut st = SyncStatus {
            syncs,
            last_sync: Some(SystemTime::now()),
            ..Default::default()
        };
        match result {
            Ok(Ok((diff, chains))) => {
                if !diff.is_empty() {
                    tracing::debug!(?diff, node = %cfg.node_name, ?latency, ?apply_time, "netpol sync");
                }
                st.last_diff = diff;
                st.isolated_chains = chains;
                max_wait = cfg.max_interval;
            }
            Ok(Err(e)) => {
                tracing::warn!(node = %cfg.node_name, "netpol sync failed (next sync replaces the table): {e}");
                st.last_error = Some(e.to_string());
                // Retry soon.
                max_wait = Duration::from_secs(1).min(cfg.max_interval);
            }
            Err(e) => st.last_error = Some(e.to_string()),
        }
        status.send_replace(st);
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tracker.notify.notified() => {}
            _ = tokio::time::sleep(max_wait) => {}
        }
    }
    if cfg.cleanup_on_exit {
        let _ = tokio::task::spawn_blocking(move || {
            let mut ap = applier.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = ap.remove() {
                tracing::warn!("removing the netpol table: {e}");
            }
        })
        .await;
    }
}

/// A running node enforcement.
pub struct Running {
    pub tracker: Arc<Tracker>,
    pub status: watch::Receiver<SyncStatus>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts watches and the sync loop for one node (what the node agent calls in the netns pod
/// network: `target` = the node's network namespace).
pub fn start(client: Client, cfg: AgentConfig, cancel: CancellationToken) -> Running {
    let tracker = Arc::new(Tracker::default());
    if let Some(m) = &cfg.metrics {
        m.add_node(&cfg.node_name, cfg.target.clone(), Some(tracker.clone()));
    }
    let mut tasks = spawn_watches(client, tracker.clone());
    let (tx, rx) = watch::channel(SyncStatus::default());
    let stop = cancel.clone();
    tasks.push(tokio::spawn(run_sync(tracker.clone(), cfg, tx, stop)));
    // Watches end with the process; stop them with the loop.
    let watch_tasks: Vec<_> = tasks.iter().take(4).map(|t| t.abort_handle()).collect();
    tokio::spawn(async move {
        cancel.cancelled().await;
        for t in watch_tasks {
            t.abort();
        }
    });
    Running {
        tracker,
        status: rx,
        tasks,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn events_update_the_model_and_relists_drop_stale_objects() {
        let t = Tracker::default();
        let mut relist = None;
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": "a", "namespace": "x", "labels": {"pod": "a"}},
            "spec": {"containers": []}, "status": {"podIP": "10.0.0.1"}}),
        )
        .unwrap();
        assert!(!apply_event::<Pod>(&t, &mut relist, Event::Init));
        apply_event(&t, &mut relist, Event::InitApply(pod.clone()));
        assert!(apply_event::<Pod>(&t, &mut relist, Event::InitDone));
        assert_eq!(t.model().pods.len(), 1);
        assert!(t.pending_for().is_some());
        // The same object again is no change.
        t.lock().pending_since = None;
        apply_event(&t, &mut relist, Event::Apply(pod.clone()));
        assert!(t.pending_for().is_none());
        // A re-list without it removes it.
        apply_event::<Pod>(&t, &mut relist, Event::Init);
        apply_event::<Pod>(&t, &mut relist, Event::InitDone);
        assert!(t.model().pods.is_empty());
        let np: NetworkPolicy = serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {}}}),
        )
        .unwrap();
        apply_event(&t, &mut relist, Event::Apply(np.clone()));
        assert_eq!(t.model().policies.len(), 1);
        apply_event(&t, &mut relist, Event::Delete(np));
        assert!(t.model().policies.is_empty());
        assert!(!t.synced());
        for k in [Kind::Policy, Kind::Pod, Kind::Namespace, Kind::Node] {
            t.mark_synced(k);
        }
        assert!(t.synced());
    }
}
