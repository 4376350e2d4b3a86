//! The node side: watches of NetworkPolicies, Pods, Namespaces and Nodes (the last three
//! decoded slim, see [`crate::slim`]) feed a change tracker (the model); per node, one
//! coalescing sync loop renders the node's table at most once per `min_interval` (and at least
//! once per `max_interval`) and applies the difference in the node's network namespace.
//! kube-proxy's pattern: handlers record, the loop applies. The nodes of one process (`ferry
//! up`) share one tracker and so one set of watches ([`watch()`], [`start_node`]).

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::apply::{Applier, Target};
use crate::metrics::Metrics;
use crate::model::{self, Interner, Labels, Model, PodInfo, PodKey, Policy};
use crate::render::{RenderOptions, render};
use crate::ruleset::DiffStats;
use crate::slim::{SlimNamespace, SlimNode, SlimPod};

/// The model as the watches report it, plus sync bookkeeping.
#[derive(Debug, Default)]
pub struct TrackState {
    /// Shared with the sync loops' snapshots: a write copies the model only while a snapshot
    /// of it is being rendered (copy on write), never per sync.
    pub model: Arc<Model>,
    /// Label sets and node names shared between pods.
    pub interner: Interner,
    /// Per subscribed sync loop: when its oldest unapplied change was recorded.
    pending: Vec<Option<Instant>>,
    synced: [bool; 4],
}

/// Shared by the watches (writers) and the sync loops (readers; one per node, several nodes
/// of a process can share one tracker and so one set of watches).
#[derive(Debug)]
pub struct Tracker {
    state: Mutex<TrackState>,
    /// Bumped on every change and when a watch has synced; every sync loop holds a receiver.
    changed: watch::Sender<u64>,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            state: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

/// The watched kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Policy = 0,
    Pod = 1,
    Namespace = 2,
    Node = 3,
}

/// What an update sees: the model (copied on the first write only if a sync loop holds a
/// snapshot of it) and the interner.
pub struct ModelWriter<'a> {
    model: &'a mut Arc<Model>,
    pub interner: &'a mut Interner,
}

impl ModelWriter<'_> {
    pub fn get(&self) -> &Model {
        self.model
    }
    pub fn get_mut(&mut self) -> &mut Model {
        Arc::make_mut(self.model)
    }
}

/// One sync loop's view of a [`Tracker`]: its pending-change clock (for `/healthz` and the
/// programming latency) and its change notifications.
#[derive(Debug, Clone)]
pub struct Subscriber {
    tracker: Arc<Tracker>,
    slot: usize,
}

impl Subscriber {
    /// How long this loop's oldest unapplied change has waited.
    pub fn pending_for(&self) -> Option<Duration> {
        self.tracker
            .lock()
            .pending
            .get(self.slot)
            .copied()
            .flatten()
            .map(|t| t.elapsed())
    }
    pub fn tracker(&self) -> &Arc<Tracker> {
        &self.tracker
    }
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, TrackState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// A new sync loop's handle.
    pub fn subscribe(self: &Arc<Self>) -> Subscriber {
        let mut st = self.lock();
        st.pending.push(None);
        Subscriber {
            tracker: self.clone(),
            slot: st.pending.len() - 1,
        }
    }
    /// Applies `f` with the interner; when it reports a change, queues a sync of every loop.
    pub fn update_with(&self, f: impl FnOnce(&mut ModelWriter<'_>) -> bool) -> bool {
        let changed = {
            let mut st = self.lock();
            let st = &mut *st;
            let mut w = ModelWriter {
                model: &mut st.model,
                interner: &mut st.interner,
            };
            let changed = f(&mut w);
            if changed {
                let now = Instant::now();
                for p in st.pending.iter_mut().filter(|p| p.is_none()) {
                    *p = Some(now);
                }
            }
            changed
        };
        if changed {
            self.changed.send_modify(|g| *g += 1);
        }
        changed
    }
    /// Applies `f`; when it reports a change, queues a sync.
    pub fn update(&self, f: impl FnOnce(&mut Model) -> bool) -> bool {
        self.update_with(|w| f(w.get_mut()))
    }
    pub fn mark_synced(&self, kind: Kind) {
        self.lock().synced[kind as usize] = true;
        self.changed.send_modify(|g| *g += 1);
    }
    /// Every watch has listed once.
    pub fn synced(&self) -> bool {
        self.lock().synced.iter().all(|s| *s)
    }
    /// Returns once every watch has listed once.
    pub async fn wait_synced(&self) {
        let mut changes = self.changed.subscribe();
        while !self.synced() {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }
    /// The current model (a shared snapshot: later changes do not show in it).
    pub fn model(&self) -> Arc<Model> {
        self.lock().model.clone()
    }
    /// How long the oldest unapplied change of any loop has waited.
    pub fn pending_for(&self) -> Option<Duration> {
        self.lock()
            .pending
            .iter()
            .flatten()
            .min()
            .map(|t| t.elapsed())
    }
    /// Distinct label sets and node names the interner holds.
    pub fn interned(&self) -> usize {
        self.lock().interner.len()
    }
}

/// How one kind maps onto one map of the model.
trait Tracked: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static {
    const KIND: Kind;
    type Key: Ord + Hash + Clone + Send + std::fmt::Display;
    type Value: PartialEq;
    fn map(m: &Model) -> &BTreeMap<Self::Key, Self::Value>;
    fn map_mut(m: &mut Model) -> &mut BTreeMap<Self::Key, Self::Value>;
    /// None for an object without a name (nothing to record).
    fn key(&self) -> Option<Self::Key>;
    /// None removes the key.
    fn project(&self, interner: &mut Interner) -> Option<Self::Value>;
}

fn ns_key<K: Resource>(o: &K) -> Option<PodKey> {
    Some(PodKey::new(
        o.meta()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        o.meta().name.clone()?,
    ))
}

impl Tracked for NetworkPolicy {
    const KIND: Kind = Kind::Policy;
    type Key = PodKey;
    type Value = Policy;
    fn map(m: &Model) -> &BTreeMap<PodKey, Policy> {
        &m.policies
    }
    fn map_mut(m: &mut Model) -> &mut BTreeMap<PodKey, Policy> {
        &mut m.policies
    }
    fn key(&self) -> Option<PodKey> {
        ns_key(self)
    }
    fn project(&self, _: &mut Interner) -> Option<Policy> {
        match model::project_policy(self) {
            Ok(p) => Some(p),
            Err(e) => {
                // Validated by the API server; a policy we cannot read isolates nothing.
                tracing::warn!(policy = %format!("{}/{}", self.namespace().unwrap_or_default(), self.name_any()), "ignoring NetworkPolicy: {e}");
                None
            }
        }
    }
}

impl Tracked for SlimPod {
    const KIND: Kind = Kind::Pod;
    type Key = PodKey;
    type Value = PodInfo;
    fn map(m: &Model) -> &BTreeMap<PodKey, PodInfo> {
        &m.pods
    }
    fn map_mut(m: &mut Model) -> &mut BTreeMap<PodKey, PodInfo> {
        &mut m.pods
    }
    fn key(&self) -> Option<PodKey> {
        ns_key(self)
    }
    fn project(&self, interner: &mut Interner) -> Option<PodInfo> {
        model::project_slim_pod(self, interner).map(|(_, p)| p)
    }
}

impl Tracked for SlimNamespace {
    const KIND: Kind = Kind::Namespace;
    type Key = String;
    type Value = Labels;
    fn map(m: &Model) -> &BTreeMap<String, Labels> {
        &m.namespaces
    }
    fn map_mut(m: &mut Model) -> &mut BTreeMap<String, Labels> {
        &mut m.namespaces
    }
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn project(&self, _: &mut Interner) -> Option<Labels> {
        model::project_slim_namespace(self).map(|(_, l)| l)
    }
}

impl Tracked for SlimNode {
    const KIND: Kind = Kind::Node;
    type Key = String;
    type Value = Vec<std::net::IpAddr>;
    fn map(m: &Model) -> &BTreeMap<String, Vec<std::net::IpAddr>> {
        &m.nodes
    }
    fn map_mut(m: &mut Model) -> &mut BTreeMap<String, Vec<std::net::IpAddr>> {
        &mut m.nodes
    }
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn project(&self, _: &mut Interner) -> Option<Vec<std::net::IpAddr>> {
        model::project_slim_node(self).map(|(_, ips)| ips)
    }
}

/// Records `o`; true when the model changed (an unchanged object copies nothing).
fn upsert<K: Tracked>(w: &mut ModelWriter<'_>, o: &K) -> bool {
    let Some(k) = o.key() else { return false };
    match o.project(w.interner) {
        Some(v) if K::map(w.get()).get(&k) == Some(&v) => false,
        Some(v) => {
            K::map_mut(w.get_mut()).insert(k, v);
            true
        }
        None => remove::<K>(w, &k),
    }
}

fn remove<K: Tracked>(w: &mut ModelWriter<'_>, k: &K::Key) -> bool {
    K::map(w.get()).contains_key(k) && K::map_mut(w.get_mut()).remove(k).is_some()
}

/// What a (re)list has seen so far: nothing to compare when the map was empty at its start
/// (the first list), else the keys seen.
type Relist<K> = Option<Option<HashSet<K>>>;

/// Applies one watch event; objects missing from a re-list are removed at `InitDone`.
fn apply_event<K: Tracked>(tracker: &Tracker, relist: &mut Relist<K::Key>, ev: Event<K>) -> bool {
    match ev {
        Event::Init => {
            let empty = K::map(&tracker.lock().model).is_empty();
            *relist = Some((!empty).then(HashSet::new));
            false
        }
        Event::InitApply(o) => {
            if let Some(Some(seen)) = relist.as_mut()
                && let Some(k) = o.key()
            {
                seen.insert(k);
            }
            tracker.update_with(|w| upsert(w, &o));
            false
        }
        Event::InitDone => {
            if let Some(Some(seen)) = relist.take() {
                tracker.update_with(|w| {
                    let stale = K::map(w.get()).keys().any(|k| !seen.contains(k));
                    stale && {
                        K::map_mut(w.get_mut()).retain(|k, _| seen.contains(k));
                        true
                    }
                });
            }
            true
        }
        Event::Apply(o) => {
            tracker.update_with(|w| upsert(w, &o));
            false
        }
        Event::Delete(o) => {
            if let Some(k) = o.key() {
                tracker.update_with(|w| remove::<K>(w, &k));
            }
            false
        }
    }
}

async fn watch_kind<K: Tracked>(api: Api<K>, tracker: Arc<Tracker>)
where
    K::DynamicType: Default,
{
    let mut stream = ferry_kubeclient::watch::stream(
        api,
        watcher::Config::default(),
        format!("netpol {:?}", K::KIND),
    )
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

/// Starts the four watches (Pods, Namespaces and Nodes decoded slim, see [`crate::slim`]).
pub fn spawn_watches(client: Client, tracker: Arc<Tracker>) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(watch_kind::<NetworkPolicy>(
            Api::all(client.clone()),
            tracker.clone(),
        )),
        tokio::spawn(watch_kind::<SlimPod>(
            Api::all(client.clone()),
            tracker.clone(),
        )),
        tokio::spawn(watch_kind::<SlimNamespace>(
            Api::all(client.clone()),
            tracker.clone(),
        )),
        tokio::spawn(watch_kind::<SlimNode>(Api::all(client), tracker)),
    ]
}

/// One tracker fed by one set of watches until `cancel`, for the sync loops of every node of
/// a process ([`start_node`]): the API server serves one set of watches however many nodes.
pub fn watch(client: Client, cancel: CancellationToken) -> Arc<Tracker> {
    let tracker = Arc::new(Tracker::default());
    let tasks = spawn_watches(client, tracker.clone());
    tokio::spawn(async move {
        cancel.cancelled().await;
        for t in tasks {
            t.abort();
        }
    });
    tracker
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

/// The sync loop of one node: runs until `cancel`.
pub async fn run_sync(
    sub: Subscriber,
    cfg: AgentConfig,
    status: watch::Sender<SyncStatus>,
    cancel: CancellationToken,
) {
    let tracker = sub.tracker.clone();
    let mut changes = tracker.changed.subscribe();
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = tracker.wait_synced() => {}
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
        // Changes after this point wake the loop again.
        changes.borrow_and_update();
        let (model, pending_since) = {
            let mut st = tracker.lock();
            let pending = st.pending.get_mut(sub.slot).and_then(Option::take);
            (st.model.clone(), pending)
        };
        let node = cfg.node_name.clone();
        let opts = cfg.render.clone();
        let ap = applier.clone();
        let started = Instant::now();
        let result = tokio::task::spawn_blocking(move || {
            let table = render(&model, &node, &opts);
            // The snapshot goes before the kernel work: watches stop copying the model.
            drop(model);
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
            _ = changes.changed() => {}
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

/// Starts watches and the sync loop for one node (`target` = the node's network namespace).
pub fn start(client: Client, cfg: AgentConfig, cancel: CancellationToken) -> Running {
    start_node(watch(client, cancel.clone()), cfg, cancel)
}

/// Starts the sync loop of one node on a tracker fed by [`watch()`] (shared by the nodes of a
/// process, as the node agents of `ferry up` share it).
pub fn start_node(tracker: Arc<Tracker>, cfg: AgentConfig, cancel: CancellationToken) -> Running {
    let sub = tracker.subscribe();
    if let Some(m) = &cfg.metrics {
        m.add_node(&cfg.node_name, cfg.target.clone(), Some(sub.clone()));
    }
    let (tx, rx) = watch::channel(SyncStatus::default());
    let tasks = vec![tokio::spawn(run_sync(sub, cfg, tx, cancel))];
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

    fn pod(name: &str, app: &str) -> SlimPod {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "x", "labels": {"app": app}},
            "spec": {"nodeName": "n1", "containers": []}, "status": {"podIP": "10.0.0.1"}}),
        )
        .unwrap()
    }

    #[test]
    fn events_update_the_model_and_relists_drop_stale_objects() {
        let t = Arc::new(Tracker::default());
        let sub = t.subscribe();
        let mut relist = None;
        let a = pod("a", "web");
        assert!(!apply_event::<SlimPod>(&t, &mut relist, Event::Init));
        assert!(
            matches!(relist, Some(None)),
            "the first list compares nothing"
        );
        apply_event(&t, &mut relist, Event::InitApply(a.clone()));
        apply_event(&t, &mut relist, Event::InitApply(pod("b", "web")));
        assert!(apply_event::<SlimPod>(&t, &mut relist, Event::InitDone));
        assert_eq!(t.model().pods.len(), 2);
        assert!(sub.pending_for().is_some());
        // The same object again is no change (and copies nothing).
        t.lock().pending[sub.slot] = None;
        let snapshot = t.model();
        apply_event(&t, &mut relist, Event::Apply(a.clone()));
        assert!(sub.pending_for().is_none());
        assert!(Arc::ptr_eq(&snapshot, &t.model()));
        // A change while a snapshot is held copies the model; the snapshot keeps its state.
        apply_event(&t, &mut relist, Event::Apply(pod("a", "db")));
        assert!(sub.pending_for().is_some());
        assert_eq!(snapshot.pods[&PodKey::new("x", "a")].labels["app"], "web");
        assert_eq!(t.model().pods[&PodKey::new("x", "a")].labels["app"], "db");
        // A re-list without "a" removes it.
        apply_event::<SlimPod>(&t, &mut relist, Event::Init);
        apply_event(&t, &mut relist, Event::InitApply(pod("b", "web")));
        apply_event::<SlimPod>(&t, &mut relist, Event::InitDone);
        let keys: Vec<_> = t.model().pods.keys().cloned().collect();
        assert_eq!(keys, [PodKey::new("x", "b")]);
        apply_event(&t, &mut relist, Event::Delete(pod("b", "web")));
        assert!(t.model().pods.is_empty());

        let np: NetworkPolicy = serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {}}}),
        )
        .unwrap();
        let mut prelist = None;
        apply_event(&t, &mut prelist, Event::Apply(np.clone()));
        assert_eq!(t.model().policies.len(), 1);
        // A policy that cannot be read isolates nothing: it is removed.
        let bad: NetworkPolicy =
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 70000}]}]}}))
            .unwrap();
        apply_event(&t, &mut prelist, Event::Apply(bad));
        assert!(t.model().policies.is_empty());
        apply_event(&t, &mut prelist, Event::Apply(np.clone()));
        apply_event(&t, &mut prelist, Event::Delete(np));
        assert!(t.model().policies.is_empty());

        let ns: SlimNamespace =
            serde_json::from_value(json!({"metadata": {"name": "x", "labels": {"team": "a"}}}))
                .unwrap();
        let mut nrelist = None;
        apply_event(&t, &mut nrelist, Event::Apply(ns));
        assert_eq!(t.model().namespace_labels("x")["team"], "a");
        assert_eq!(
            t.model().namespace_labels("x")[model::NAMESPACE_NAME_LABEL],
            "x"
        );

        assert!(!t.synced());
        for k in [Kind::Policy, Kind::Pod, Kind::Namespace, Kind::Node] {
            t.mark_synced(k);
        }
        assert!(t.synced());
    }

    #[test]
    fn every_subscribed_loop_sees_each_change() {
        let t = Arc::new(Tracker::default());
        let (s1, s2) = (t.subscribe(), t.subscribe());
        let mut rx = t.changed.subscribe();
        rx.borrow_and_update();
        t.update(|m| {
            m.nodes.insert("n1".into(), Vec::new());
            true
        });
        assert!(rx.has_changed().unwrap());
        assert!(s1.pending_for().is_some() && s2.pending_for().is_some());
        // One loop applying does not clear the other's clock.
        t.lock().pending[s1.slot] = None;
        assert!(s1.pending_for().is_none() && s2.pending_for().is_some());
        assert!(t.pending_for().is_some());
        // No change, no notification.
        rx.borrow_and_update();
        assert!(!t.update(|_| false));
        assert!(!rx.has_changed().unwrap());
    }
}
