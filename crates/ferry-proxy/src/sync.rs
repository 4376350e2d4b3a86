//! Change tracking and the one coalescing sync loop (kube-proxy's change trackers and
//! `BoundedFrequencyRunner`): watch handlers record projected objects and poke the loop; the loop
//! rebuilds the table at most once per `min_interval` and at least once per `max_interval`, and
//! hands it to the data path. Health turns bad only when a recorded change has waited longer
//! than the health timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::dataplane::Dataplane;
use crate::model::{NodeInfo, ServiceInfo, SliceInfo};
use crate::sched::Scheduler;
use crate::table::incr::{Delta, Incremental};
use crate::table::{self, NodeContext, Table};

/// Object key: (namespace, name); nodes use an empty namespace.
pub type Key = (String, String);

/// Which watch has completed its first list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
}

/// The projected objects, as the watches report them. Writers go through [`State::put_service`],
/// [`State::put_slice`] and [`State::put_node`], which record what changed (kube-proxy's
/// `ServiceChangeTracker` / `EndpointsChangeTracker`): the kernel proxy then renders only the
/// Services touched since its last sync.
#[derive(Debug, Default)]
pub struct State {
    pub services: BTreeMap<Key, ServiceInfo>,
    pub slices: BTreeMap<Key, SliceInfo>,
    pub nodes: BTreeMap<String, NodeInfo>,
    /// Service key -> names of its EndpointSlices (kept by [`State::put_slice`]).
    slice_index: BTreeMap<Key, BTreeSet<String>>,
    dirty: Changes,
    /// Bumped by every recorded change (a write that bypasses the `put_*` methods is seen by
    /// [`Tracker::update`] and marks everything changed).
    marks: u64,
    pending_since: Option<Instant>,
    synced_services: bool,
    synced_slices: bool,
    synced_nodes: bool,
}

/// What changed since the last [`Tracker::take_changes`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Everything may have changed (a Node changed: topology; an untracked write).
    pub all: bool,
    /// The Services (namespace, name) whose Service or EndpointSlices changed.
    pub services: BTreeSet<Key>,
}

impl State {
    /// Records a Service (`None`: deleted); true when its projection changed.
    pub fn put_service(&mut self, key: Key, info: Option<ServiceInfo>) -> bool {
        let changed = match info {
            Some(v) if self.services.get(&key) == Some(&v) => false,
            Some(v) => {
                self.services.insert(key.clone(), v);
                true
            }
            None => self.services.remove(&key).is_some(),
        };
        if changed {
            self.marks += 1;
            self.dirty.services.insert(key);
        }
        changed
    }

    /// Records an EndpointSlice (`None`: deleted); true when its projection changed. The
    /// Services it belonged to and belongs to now are marked changed.
    pub fn put_slice(&mut self, key: Key, info: Option<SliceInfo>) -> bool {
        if info.is_some() && self.slices.get(&key) == info.as_ref() {
            return false;
        }
        let old = match info {
            Some(v) => {
                let svc = (v.namespace.clone(), v.service.clone());
                let old = self.slices.insert(key.clone(), v);
                self.slice_index
                    .entry(svc.clone())
                    .or_default()
                    .insert(key.1.clone());
                self.dirty.services.insert(svc);
                old
            }
            None => self.slices.remove(&key),
        };
        let changed = match old {
            Some(o) => {
                let svc = (o.namespace, o.service);
                let now = self.slices.get(&key).map(|s| (&s.namespace, &s.service));
                if now != Some((&svc.0, &svc.1))
                    && let Some(names) = self.slice_index.get_mut(&svc)
                {
                    names.remove(&key.1);
                    if names.is_empty() {
                        self.slice_index.remove(&svc);
                    }
                }
                self.dirty.services.insert(svc);
                true
            }
            None => self.slices.contains_key(&key),
        };
        if changed {
            self.marks += 1;
        }
        changed
    }

    /// Records a Node (`None`: deleted); true when its projection changed. Node labels feed
    /// topology, so every Service counts as changed.
    pub fn put_node(&mut self, name: String, info: Option<NodeInfo>) -> bool {
        let changed = match info {
            Some(n) if self.nodes.get(&name) == Some(&n) => false,
            Some(n) => {
                self.nodes.insert(name, n);
                true
            }
            None => self.nodes.remove(&name).is_some(),
        };
        if changed {
            self.marks += 1;
            self.dirty.all = true;
        }
        changed
    }

    /// The EndpointSlices of Service `namespace/name` (through the index: no scan).
    pub fn slices_of<'a>(
        &'a self,
        namespace: &str,
        name: &str,
    ) -> impl Iterator<Item = (&'a Key, &'a SliceInfo)> + 'a {
        let ns = namespace.to_string();
        self.slice_index
            .get(&(namespace.to_string(), name.to_string()))
            .into_iter()
            .flatten()
            .filter_map(move |n| self.slices.get_key_value(&(ns.clone(), n.clone())))
    }
}

/// Shared between the watches (writers) and the sync loop (reader).
pub struct Tracker {
    state: Mutex<State>,
    notify: Notify,
    started: Instant,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            started: Instant::now(),
        }
    }
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `f`; when it reports a change, queues a sync.
    pub fn update(&self, f: impl FnOnce(&mut State) -> bool) -> bool {
        let changed = {
            let mut st = self.lock();
            let marks = st.marks;
            let changed = f(&mut st);
            if changed && st.marks == marks {
                // Written around the `put_*` methods: what changed is unknown.
                st.dirty.all = true;
            }
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

    /// Records that a watch listed everything once.
    pub fn mark_synced(&self, kind: Kind) {
        {
            let mut st = self.lock();
            match kind {
                Kind::Service => st.synced_services = true,
                Kind::EndpointSlice => st.synced_slices = true,
                Kind::Node => st.synced_nodes = true,
            }
        }
        self.notify.notify_one();
    }

    /// Services and slices have been listed (nodes are optional: a proxy may run before its
    /// Node exists).
    pub fn synced(&self) -> bool {
        let st = self.lock();
        st.synced_services && st.synced_slices
    }

    /// Waits for the next recorded change (or `mark_synced`).
    pub async fn changed(&self) {
        self.notify.notified().await
    }

    /// Reads the state for a sync: the pending change counts as applied from here on.
    pub fn take<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        let mut st = self.lock();
        st.pending_since = None;
        f(&st)
    }

    /// Like [`Tracker::take`], also handing over (and clearing) what changed since the last
    /// call.
    pub fn take_changes<R>(&self, f: impl FnOnce(&State, Changes) -> R) -> R {
        let mut st = self.lock();
        st.pending_since = None;
        let ch = std::mem::take(&mut st.dirty);
        f(&st, ch)
    }

    /// How long the oldest unapplied change has waited (before the first sync: since start).
    pub fn pending_for(&self) -> Option<Duration> {
        let st = self.lock();
        if !(st.synced_services && st.synced_slices) {
            return Some(self.started.elapsed());
        }
        st.pending_since.map(|t| t.elapsed())
    }
}

/// Settings of the sync loop.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    pub node_name: String,
    /// `--node-ip`: NodePort addresses; empty means the Node's addresses.
    pub node_ips: Vec<IpAddr>,
    /// `--bind-address`: serve NodePorts on this address instead of the node IPs.
    pub nodeport_bind: Option<IpAddr>,
    pub scheduler: Scheduler,
    pub min_interval: Duration,
    pub max_interval: Duration,
    /// Serve Service addresses through kernel portals instead of binding them.
    pub portals: Option<crate::kernel::portals::PortalsConfig>,
}

/// What the loop publishes after each sync.
#[derive(Debug, Clone, Default)]
pub struct SyncStatus {
    pub syncs: u64,
    pub last_sync: Option<SystemTime>,
    pub table: Arc<Table>,
    /// Frontends that could not be bound at the last sync.
    pub failed: Vec<String>,
}

fn node_context(st: &State, cfg: &SyncConfig) -> NodeContext {
    let me = st.nodes.get(&cfg.node_name);
    let mut node_ips = if let Some(ip) = cfg.nodeport_bind {
        vec![ip]
    } else if !cfg.node_ips.is_empty() {
        cfg.node_ips.clone()
    } else {
        me.map(|n| n.addresses.clone()).unwrap_or_default()
    };
    node_ips.dedup();
    NodeContext {
        name: cfg.node_name.clone(),
        labels: me.map(|n| n.labels.clone()).unwrap_or_default(),
        node_ips,
        scheduler: cfg.scheduler,
        sctp: false,
    }
}

/// The userspace sync's pure step: rebuilds the parts of the Services `ch` names (every
/// Service when `full` or `ch.all`: the first sync, a Node changed) into `inc` and returns
/// what changed in the whole table. `inc.table()` is then [`table::build`] over the whole
/// state (property-tested below).
pub fn step(
    inc: &mut Incremental,
    st: &State,
    ch: &Changes,
    full: bool,
    ctx: &NodeContext,
) -> Delta {
    let keys: BTreeSet<Key> = if full || ch.all {
        st.services.keys().chain(inc.services()).cloned().collect()
    } else {
        ch.services.clone()
    };
    let built: Vec<(Key, Table)> = keys
        .into_iter()
        .map(|k| {
            let part = match st.services.get(&k) {
                Some(svc) => {
                    let slices: Vec<&SliceInfo> = st
                        .slices_of(&svc.namespace, &svc.name)
                        .map(|(_, s)| s)
                        .collect();
                    table::build_service(svc, &slices, &st.nodes, ctx)
                }
                None => Table::default(),
            };
            (k, part)
        })
        .collect();
    inc.update(built)
}

/// The status's copy of the table costs O(Services); it is refreshed after a change once the
/// time since the last copy is at least this many times what the last copy took (at most
/// [`TABLE_REFRESH`]), so that copying stays a small share of the sync's work at any size.
const PUBLISH_FACTOR: u32 = 20;
/// The longest the status's table lags behind the data path.
const TABLE_REFRESH: Duration = Duration::from_secs(1);

/// The table the status shows, refreshed as [`PUBLISH_FACTOR`] says.
#[derive(Default)]
struct Published {
    table: Arc<Table>,
    at: Option<Instant>,
    cost: Duration,
    stale: bool,
}

impl Published {
    /// How long after the last copy the next one may be made.
    fn gap(&self) -> Duration {
        (self.cost * PUBLISH_FACTOR).min(TABLE_REFRESH)
    }

    /// Copies `t` when stale and due; returns how long until a stale copy is due. The copy
    /// stops (and is made again later) as soon as a change waits for a sync, so a large table's
    /// copy never holds a change back by more than one chunk.
    async fn refresh(&mut self, t: &Table, tracker: &Tracker) -> Option<Duration> {
        if !self.stale {
            return None;
        }
        let since = self.at.map_or(Duration::MAX, |a| a.elapsed());
        if since < self.gap() {
            return Some(self.gap() - since);
        }
        let t0 = Instant::now();
        let copy = copy_table(t, || tracker.pending_for().is_some()).await;
        self.cost = t0.elapsed();
        self.at = Some(Instant::now());
        match copy {
            Some(c) => {
                self.table = Arc::new(c);
                self.stale = false;
                None
            }
            None => Some(self.gap()),
        }
    }
}

/// Entries copied between two checks for a waiting change.
const COPY_CHUNK: usize = 512;

/// Copies `t` a chunk at a time, yielding in between; `None` once `interrupted` says so.
async fn copy_table(t: &Table, interrupted: impl Fn() -> bool) -> Option<Table> {
    let mut out = Table::default();
    let mut n = 0usize;
    let mut tick = || {
        n += 1;
        n.is_multiple_of(COPY_CHUNK)
    };
    for (k, p) in &t.pools {
        if tick() {
            if interrupted() {
                return None;
            }
            tokio::task::yield_now().await;
        }
        out.pools.insert(k.clone(), p.clone());
    }
    for (f, k) in &t.frontends {
        if tick() {
            if interrupted() {
                return None;
            }
            tokio::task::yield_now().await;
        }
        out.frontends.insert(*f, k.clone());
    }
    Some(out)
}

/// Runs the loop until `cancel`; closes every listener on the way out.
pub async fn run(
    tracker: Arc<Tracker>,
    mut dataplane: Dataplane,
    cfg: SyncConfig,
    status: watch::Sender<SyncStatus>,
    cancel: CancellationToken,
) {
    // Wait for the first full lists, so that the first table is complete.
    while !tracker.synced() {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tracker.notify.notified() => {}
        }
    }
    let mut last_run: Option<Instant> = None;
    let mut syncs = 0u64;
    let mut portals = cfg
        .portals
        .clone()
        .map(crate::kernel::portals::Portals::new);
    let mut inc = Incremental::default();
    let mut published = Published::default();
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
        let first = syncs == 0;
        let started = Instant::now();
        let (delta, node_ips, changed) = tracker.take_changes(|st, ch| {
            let ctx = node_context(st, &cfg);
            let changed = if first || ch.all {
                st.services.len()
            } else {
                ch.services.len()
            };
            (step(&mut inc, st, &ch, first, &ctx), ctx.node_ips, changed)
        });
        let built_us = started.elapsed().as_micros() as u64;
        let report = match portals.as_mut() {
            // Portals map the whole table onto the proxy's own ports.
            Some(p) => p.apply(&mut dataplane, inc.table(), &node_ips).await,
            None => dataplane.apply_delta(&delta),
        };
        let applied_us = started.elapsed().as_micros() as u64;
        syncs += 1;
        published.stale |= first || !delta.is_empty();
        let mut publish_in = published.refresh(inc.table(), &tracker).await;
        tracing::debug!(
            changed,
            pools = delta.pools.len(),
            frontends = delta.frontends.len(),
            opened = report.opened,
            closed = report.closed,
            failed = report.failed.len(),
            built_us,
            applied_us,
            took_us = started.elapsed().as_micros() as u64,
            "proxy sync"
        );
        status.send_replace(SyncStatus {
            syncs,
            last_sync: Some(SystemTime::now()),
            table: published.table.clone(),
            failed: report
                .failed
                .iter()
                .map(|(f, e)| format!("{f}: {e}"))
                .collect(),
        });
        // Wait for a change or the periodic resync. A deferred copy of the table is made
        // meanwhile without counting as a sync, so it never makes a change that follows wait
        // out `min_interval`.
        loop {
            let resync_in = cfg.max_interval.saturating_sub(started.elapsed());
            let wait = publish_in.map_or(resync_in, |d| d.min(resync_in));
            tokio::select! {
                _ = cancel.cancelled() => {
                    dataplane.shutdown();
                    return;
                }
                _ = tracker.notify.notified() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            if publish_in.is_none()
                || started.elapsed() >= cfg.max_interval
                || tracker.pending_for().is_some()
            {
                break;
            }
            publish_in = published.refresh(inc.table(), &tracker).await;
            let table = published.table.clone();
            status.send_modify(|st| st.table = table);
        }
    }
    dataplane.shutdown();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pending_tracks_oldest_change_and_sync_state() {
        let t = Tracker::default();
        assert!(t.pending_for().is_some(), "unsynced counts as pending");
        t.mark_synced(Kind::Service);
        assert!(!t.synced());
        t.mark_synced(Kind::EndpointSlice);
        assert!(t.synced());
        assert_eq!(t.pending_for(), None);
        assert!(!t.update(|_| false));
        assert_eq!(t.pending_for(), None);
        assert!(t.update(|st| {
            st.nodes.insert("n".into(), NodeInfo::default());
            true
        }));
        let first = t.pending_for().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        t.update(|_| true);
        assert!(t.pending_for().unwrap() > first, "the oldest change counts");
    }

    fn slice(ns: &str, name: &str, svc: &str, ip: &str) -> SliceInfo {
        SliceInfo {
            namespace: ns.into(),
            name: name.into(),
            service: svc.into(),
            ports: vec![],
            endpoints: vec![crate::model::EndpointInfo {
                ip: ip.parse().unwrap(),
                ready: true,
                serving: true,
                terminating: false,
                node_name: None,
                zone: None,
                hint_zones: None,
                topology: BTreeMap::new(),
            }],
        }
    }

    fn key(ns: &str, n: &str) -> Key {
        (ns.to_string(), n.to_string())
    }

    #[test]
    fn changes_name_the_services_touched() {
        let t = Tracker::default();
        let svc = |n: &str| ServiceInfo {
            namespace: "ns".into(),
            name: n.into(),
            ..ServiceInfo::default()
        };
        assert!(t.update(|st| st.put_service(key("ns", "a"), Some(svc("a")))));
        assert!(!t.update(|st| st.put_service(key("ns", "a"), Some(svc("a")))));
        assert!(t.update(|st| {
            st.put_slice(key("ns", "a-1"), Some(slice("ns", "a-1", "b", "10.0.0.1")))
        }));
        let ch = t.take_changes(|st, ch| {
            assert_eq!(st.slices_of("ns", "b").count(), 1);
            ch
        });
        assert!(!ch.all);
        assert_eq!(ch.services, [key("ns", "a"), key("ns", "b")].into());
        assert_eq!(t.take_changes(|_, ch| ch), Changes::default(), "taken once");
        // A slice moving to another Service touches both; the index follows.
        t.update(|st| st.put_slice(key("ns", "a-1"), Some(slice("ns", "a-1", "c", "10.0.0.1"))));
        let ch = t.take_changes(|st, ch| {
            assert_eq!(st.slices_of("ns", "b").count(), 0);
            assert_eq!(st.slices_of("ns", "c").count(), 1);
            ch
        });
        assert_eq!(ch.services, [key("ns", "b"), key("ns", "c")].into());
        // Deleting touches the Service it belonged to.
        assert!(t.update(|st| st.put_slice(key("ns", "a-1"), None)));
        assert!(!t.update(|st| st.put_slice(key("ns", "a-1"), None)));
        let ch = t.take_changes(|st, ch| {
            assert_eq!(st.slices_of("ns", "c").count(), 0);
            ch
        });
        assert_eq!(ch.services, [key("ns", "c")].into());
        // Nodes (topology) and writes around the put methods change everything.
        t.update(|st| st.put_node("n".into(), Some(NodeInfo::default())));
        assert!(t.take_changes(|_, ch| ch).all);
        t.update(|st| {
            st.services.insert(key("ns", "z"), svc("z"));
            true
        });
        assert!(t.take_changes(|_, ch| ch).all);
    }

    /// One write the watches can make, over a small world (so that Services share
    /// ClusterIPs, NodePorts and externalIPs, and slices move between Services).
    /// An endpoint: (address index, ready, IPv6, node index (0: none)).
    type Ep = (u8, bool, bool, u8);

    #[derive(Debug, Clone)]
    enum Op {
        /// (ClusterIP index, externalIPs, NodePort, Local policy, affinity, dual-stack).
        Service(u8, Option<(u8, u8, bool, bool, bool, bool)>),
        /// (Service index, endpoints, UDP port).
        Slice(u8, Option<(u8, Vec<Ep>, bool)>),
        Node(u8, Option<(bool, bool)>),
    }

    fn arb_op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let svc = (
            0u8..4,
            0u8..3,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        );
        let ep = (0u8..4, any::<bool>(), any::<bool>(), 0u8..3);
        prop_oneof![
            (0u8..5, proptest::option::weighted(0.8, svc)).prop_map(|(i, v)| Op::Service(i, v)),
            (
                0u8..6,
                proptest::option::weighted(
                    0.8,
                    (0u8..5, proptest::collection::vec(ep, 0..4), any::<bool>())
                )
            )
                .prop_map(|(i, v)| Op::Slice(i, v)),
            (
                0u8..2,
                proptest::option::weighted(0.8, (any::<bool>(), any::<bool>()))
            )
                .prop_map(|(i, v)| Op::Node(i, v)),
        ]
    }

    fn ipv(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn apply_op(st: &mut State, op: &Op) {
        use crate::model::{PortInfo, Proto, SlicePort};
        match op {
            Op::Service(i, v) => {
                let name = format!("s{i}");
                let info = v.map(|(cip, ext, np, local, affinity, ipv6)| ServiceInfo {
                    namespace: "ns".into(),
                    name: name.clone(),
                    cluster_ips: if ipv6 {
                        vec![ipv(&format!("10.96.0.{cip}")), ipv(&format!("fd00::{cip}"))]
                    } else {
                        vec![ipv(&format!("10.96.0.{cip}"))]
                    },
                    ports: vec![
                        PortInfo {
                            name: "http".into(),
                            proto: Proto::Tcp,
                            port: 80,
                            node_port: np.then_some(30080),
                        },
                        PortInfo {
                            name: "dns".into(),
                            proto: Proto::Udp,
                            port: 53,
                            node_port: None,
                        },
                    ],
                    external_ips: (0..ext).map(|e| ipv(&format!("198.18.0.{e}"))).collect(),
                    external_local: local,
                    internal_local: local && ext == 2,
                    affinity: affinity.then_some(Duration::from_secs(60)),
                    ..ServiceInfo::default()
                });
                st.put_service(key("ns", &name), info);
            }
            Op::Slice(i, v) => {
                let name = format!("e{i}");
                let info = v.as_ref().map(|(svc, eps, udp)| SliceInfo {
                    namespace: "ns".into(),
                    name: name.clone(),
                    service: format!("s{svc}"),
                    ports: vec![SlicePort {
                        name: if *udp { "dns".into() } else { "http".into() },
                        proto: if *udp { Proto::Udp } else { Proto::Tcp },
                        port: 8080,
                    }],
                    endpoints: eps
                        .iter()
                        .map(|(ip, ready, v6, node)| crate::model::EndpointInfo {
                            ip: if *v6 {
                                ipv(&format!("fd00:1::{ip}"))
                            } else {
                                ipv(&format!("10.0.0.{ip}"))
                            },
                            ready: *ready,
                            serving: true,
                            terminating: !*ready,
                            node_name: (*node > 0).then(|| format!("n{node}")),
                            zone: None,
                            hint_zones: None,
                            topology: BTreeMap::new(),
                        })
                        .collect(),
                });
                st.put_slice(key("ns", &name), info);
            }
            Op::Node(i, v) => {
                let name = format!("n{}", i + 1);
                let info = v.map(|(zone, two)| NodeInfo {
                    name: name.clone(),
                    labels: if zone {
                        [(crate::model::LABEL_ZONE.to_string(), "z".to_string())].into()
                    } else {
                        BTreeMap::new()
                    },
                    addresses: if two {
                        vec![ipv("127.0.0.5"), ipv("::5")]
                    } else {
                        vec![ipv("127.0.0.5")]
                    },
                });
                st.put_node(name, info);
            }
        }
    }

    proptest::proptest! {
        /// The per-Service sync gives the whole rebuild's table after every batch of changes,
        /// and its deltas, applied in turn from nothing, give that table too.
        #[test]
        fn incremental_equals_full_rebuild(
            batches in proptest::collection::vec(proptest::collection::vec(arb_op(), 1..5), 1..12)
        ) {
            let cfg = SyncConfig {
                node_name: "n1".into(),
                node_ips: vec![],
                nodeport_bind: None,
                scheduler: Scheduler::RoundRobin,
                min_interval: Duration::ZERO,
                max_interval: Duration::from_secs(1),
                portals: None,
            };
            let t = Tracker::default();
            let mut inc = Incremental::default();
            let mut replayed = Table::default();
            for (i, batch) in batches.iter().enumerate() {
                for op in batch {
                    t.update(|st| { apply_op(st, op); true });
                }
                let (delta, full) = t.take_changes(|st, ch| {
                    let ctx = node_context(st, &cfg);
                    let d = step(&mut inc, st, &ch, i == 0, &ctx);
                    (d, table::build(&st.services, &st.slices, &st.nodes, &ctx))
                });
                proptest::prop_assert_eq!(inc.table(), &full);
                for (k, p) in delta.pools {
                    match p {
                        Some(p) => replayed.pools.insert(k, p),
                        None => replayed.pools.remove(&k),
                    };
                }
                for (f, k) in delta.frontends {
                    match k {
                        Some(k) => replayed.frontends.insert(f, k),
                        None => replayed.frontends.remove(&f),
                    };
                }
                proptest::prop_assert_eq!(&replayed, &full);
            }
        }
    }

    #[test]
    fn a_change_rebuilds_only_its_service() {
        let cfg = SyncConfig {
            node_name: "n1".into(),
            node_ips: vec![ipv("127.0.0.5")],
            nodeport_bind: None,
            scheduler: Scheduler::RoundRobin,
            min_interval: Duration::ZERO,
            max_interval: Duration::from_secs(1),
            portals: None,
        };
        let mut st = State::default();
        for i in 0..3 {
            apply_op(
                &mut st,
                &Op::Service(i, Some((i, 0, false, false, false, false))),
            );
            apply_op(
                &mut st,
                &Op::Slice(i, Some((i, vec![(i, true, false, 1)], false))),
            );
        }
        let mut inc = Incremental::default();
        let ctx = node_context(&st, &cfg);
        let d = step(&mut inc, &st, &Changes::default(), true, &ctx);
        assert_eq!((d.pools.len(), d.frontends.len()), (3, 3));
        // Nothing changed: nothing to do.
        assert!(step(&mut inc, &st, &Changes::default(), false, &ctx).is_empty());
        // s1's endpoint moves: its pool only; the frontend stays.
        st.dirty = Changes::default();
        apply_op(
            &mut st,
            &Op::Slice(1, Some((1, vec![(3, true, false, 1)], false))),
        );
        let ch = std::mem::take(&mut st.dirty);
        assert_eq!(ch.services, [key("ns", "s1")].into());
        let d = step(&mut inc, &st, &ch, false, &ctx);
        assert_eq!(d.pools.len(), 1);
        assert!(d.frontends.is_empty());
        let p = d.pools.values().next().unwrap().as_ref().unwrap();
        assert_eq!(p.endpoints, vec!["10.0.0.3:8080".parse().unwrap()]);
        // s2 loses its endpoints: its pool and frontend go.
        apply_op(&mut st, &Op::Slice(2, Some((2, vec![], false))));
        let ch = std::mem::take(&mut st.dirty);
        let d = step(&mut inc, &st, &ch, false, &ctx);
        assert_eq!(d.pools.values().filter(|p| p.is_none()).count(), 1);
        assert_eq!(d.frontends.values().filter(|k| k.is_none()).count(), 1);
        assert_eq!(
            inc.table(),
            &table::build(&st.services, &st.slices, &st.nodes, &ctx)
        );
    }

    #[tokio::test]
    async fn table_copy_is_whole_or_stops_for_a_waiting_change() {
        let mut st = State::default();
        for i in 0..300u16 {
            let name = format!("s{i}");
            st.put_service(
                key("ns", &name),
                Some(ServiceInfo {
                    namespace: "ns".into(),
                    name: name.clone(),
                    cluster_ips: vec![IpAddr::from([10, 96, (i >> 8) as u8, i as u8])],
                    ports: vec![crate::model::PortInfo {
                        name: "http".into(),
                        proto: crate::model::Proto::Tcp,
                        port: 80,
                        node_port: None,
                    }],
                    ..ServiceInfo::default()
                }),
            );
            let mut sl = slice("ns", &format!("e{i}"), &name, "10.0.0.1");
            sl.ports = vec![crate::model::SlicePort {
                name: "http".into(),
                proto: crate::model::Proto::Tcp,
                port: 8080,
            }];
            st.put_slice(key("ns", &format!("e{i}")), Some(sl));
        }
        let t = table::build(&st.services, &st.slices, &st.nodes, &NodeContext::default());
        assert_eq!((t.pools.len(), t.frontends.len()), (300, 300));
        assert_eq!(copy_table(&t, || false).await.as_ref(), Some(&t));
        assert!(copy_table(&t, || true).await.is_none());
        assert_eq!(
            copy_table(&Table::default(), || true).await,
            Some(Table::default())
        );
    }

    #[test]
    fn node_context_sources() {
        let mut st = State::default();
        st.nodes.insert(
            "n1".into(),
            NodeInfo {
                name: "n1".into(),
                labels: [("a".to_string(), "b".to_string())].into_iter().collect(),
                addresses: vec!["127.0.0.5".parse().unwrap()],
            },
        );
        let mut cfg = SyncConfig {
            node_name: "n1".into(),
            node_ips: vec![],
            nodeport_bind: None,
            scheduler: Scheduler::RoundRobin,
            min_interval: Duration::ZERO,
            max_interval: Duration::from_secs(1),
            portals: None,
        };
        let c = node_context(&st, &cfg);
        assert_eq!(c.node_ips, vec!["127.0.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(c.labels.len(), 1);
        cfg.node_ips = vec!["127.0.0.7".parse().unwrap()];
        assert_eq!(node_context(&st, &cfg).node_ips, cfg.node_ips);
        cfg.nodeport_bind = Some("0.0.0.0".parse().unwrap());
        assert_eq!(
            node_context(&st, &cfg).node_ips,
            vec!["0.0.0.0".parse::<IpAddr>().unwrap()]
        );
        cfg.node_name = "other".into();
        cfg.nodeport_bind = None;
        cfg.node_ips.clear();
        assert!(node_context(&st, &cfg).node_ips.is_empty());
    }
}
