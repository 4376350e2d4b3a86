//! Service and endpoint controllers (issue 4), as ordinary kube-rs clients:
//!
//! * EndpointSlice controller: slices per Service and address family, grouped by resolved port
//!   set, at most `--max-endpoints-per-slice` endpoints each ([`desired`], [`slices`]), with
//!   topology aware hints ([`hints`]);
//! * Endpoints controller ([`endpoints`]): subsets, capped at 1000 addresses;
//! * EndpointSlice mirroring for selectorless Services with user-written Endpoints ([`mirror`]);
//! * a load-balancer IP pool for `type: LoadBalancer` ([`lbpool`]).
//!
//! Watches feed in-memory caches ([`cache`]); changes enqueue the affected Services on the
//! runtime's work queue ([`crate::runtime::WorkQueue`], failed syncs back off per Service), workers reconcile one Service at a time against the caches and write
//! only the difference. A tracker of our own writes keeps a worker from acting on a cache that
//! has not seen them yet (upstream's endpointSliceTracker).

pub mod cache;
pub mod desired;
pub mod endpoints;
pub mod hints;
pub mod lbpool;
pub mod mirror;
pub mod slices;

use crate::runtime::SlimPod;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Result;
use k8s_openapi::api::core::v1::{Endpoints, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use cache::{Cache, Change, Key};

use crate::runtime::WorkQueue;

/// Flags of the service controllers.
#[derive(clap::Args, Debug, Clone)]
pub struct ServiceArgs {
    /// Most endpoints in one EndpointSlice (1..=1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_endpoints_per_slice: u32,
    /// Addresses for LoadBalancer Services: ranges `a-b`, CIDRs or single IPs, comma-separated
    /// (empty: no load-balancer addresses are handed out).
    #[arg(long, default_value = "")]
    pub loadbalancer_ip_range: String,
    /// The `loadBalancerClass` served by the pool (Services without a class are served too).
    #[arg(long, default_value = lbpool::DEFAULT_CLASS)]
    pub loadbalancer_class: String,
    /// Services synced in parallel.
    #[arg(long, default_value_t = 5)]
    pub concurrent_service_syncs: usize,
}

impl Default for ServiceArgs {
    fn default() -> Self {
        ServiceArgs {
            max_endpoints_per_slice: 100,
            loadbalancer_ip_range: String::new(),
            loadbalancer_class: lbpool::DEFAULT_CLASS.into(),
            concurrent_service_syncs: 5,
        }
    }
}

/// What we expect the slice cache to show after our own write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    AtLeast(u64),
    Gone,
}

/// Shared state of the controllers.
pub struct Controller {
    client: Client,
    args: ServiceArgs,
    pool: lbpool::Pool,
    pub services: Arc<Cache<Service>>,
    pub pods: Arc<Cache<SlimPod>>,
    pub nodes: Arc<Cache<Node>>,
    pub slices: Arc<Cache<EndpointSlice>>,
    pub endpoints: Arc<Cache<Endpoints>>,
    pub queue: Arc<WorkQueue<Key>>,
    lb_queue: Arc<tokio::sync::Notify>,
    /// Per Service: slice name -> what the cache must show before the next sync.
    expectations: Mutex<HashMap<Key, HashMap<String, Expect>>>,
    /// Per Service: the last hints state reported (None = hints on).
    hint_state: Mutex<HashMap<Key, Option<String>>>,
    /// Services whose LB state was last reported (to avoid repeating Events).
    lb_reported: Mutex<HashMap<Key, String>>,
    /// Whether pod changes are mapped to the Services selecting them. Not until every cache
    /// has been listed: the first sync visits every Service anyway ([`Self::start_pod_mapping`]),
    /// and the initial list of 150,000 pods would otherwise match each against every Service
    /// of its namespace on the way to "synced".
    map_pods: AtomicBool,
}

fn rv(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn svc_key_of_slice(s: &EndpointSlice) -> Option<Key> {
    let name = s.labels().get(slices::SERVICE_NAME_LABEL)?.clone();
    Some((s.namespace().unwrap_or_default(), name))
}

fn managed_by(s: &EndpointSlice) -> &str {
    s.labels()
        .get(slices::MANAGED_BY_LABEL)
        .map(String::as_str)
        .unwrap_or("")
}

impl Controller {
    pub fn new(client: Client, args: ServiceArgs) -> Result<Arc<Controller>> {
        let pool: lbpool::Pool = args.loadbalancer_ip_range.parse()?;
        Ok(Arc::new(Controller {
            client,
            args,
            pool,
            services: Arc::default(),
            pods: Arc::default(),
            nodes: Arc::default(),
            slices: Arc::default(),
            endpoints: Arc::default(),
            queue: Arc::default(),
            lb_queue: Arc::default(),
            expectations: Mutex::default(),
            hint_state: Mutex::default(),
            lb_reported: Mutex::default(),
            map_pods: AtomicBool::new(false),
        }))
    }

    /// Services in `ns` whose selector matches `labels`.
    fn services_selecting(&self, ns: &str, labels: Option<&BTreeMap<String, String>>) -> Vec<Key> {
        self.services
            .in_namespace(ns)
            .iter()
            .filter(|s| {
                desired::selector(s).is_some_and(|sel| desired::selector_matches(sel, labels))
            })
            .map(|s| (ns.to_string(), s.name_any()))
            .collect()
    }

    /// Maps pod changes to Services from now on, and queues every Service: a pod change seen
    /// before (not mapped) is covered by the sync of every Service that follows, as upstream's
    /// first sync after `WaitForCacheSync` visits every Service its informer added.
    fn start_pod_mapping(&self) {
        self.map_pods.store(true, Ordering::Release);
        self.enqueue_all_services();
    }

    fn enqueue_all_services(&self) {
        for s in self.services.all() {
            self.queue
                .add((s.namespace().unwrap_or_default(), s.name_any()));
        }
    }

    fn on_pod(&self, old: Option<&SlimPod>, new: Option<&SlimPod>) {
        if !self.map_pods.load(Ordering::Acquire) {
            return;
        }
        let mut keys = HashSet::new();
        for p in [old, new].into_iter().flatten() {
            let ns = p.namespace().unwrap_or_default();
            keys.extend(self.services_selecting(&ns, p.metadata.labels.as_ref()));
        }
        for k in keys {
            self.queue.add(k);
        }
    }

    fn on_node(&self, old: Option<&Node>, new: Option<&Node>) {
        let name = new.or(old).map(|n| n.name_any()).unwrap_or_default();
        let zone_changed = old.map(desired::node_zone) != new.map(desired::node_zone);
        let mut keys = HashSet::new();
        if zone_changed {
            for p in self.pods.all() {
                if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()) {
                    let ns = p.namespace().unwrap_or_default();
                    keys.extend(self.services_selecting(&ns, p.metadata.labels.as_ref()));
                }
            }
        }
        for s in self.services.all() {
            if hints::hints_requested(&s) {
                keys.insert((s.namespace().unwrap_or_default(), s.name_any()));
            }
        }
        for k in keys {
            self.queue.add(k);
        }
    }

    fn zone_of_node(&self, node: &str) -> Option<String> {
        self.nodes
            .get("", node)
            .and_then(|n| desired::node_zone(&n))
    }

    /// Whether the slice cache reflects our writes for `key`.
    fn cache_fresh(&self, key: &Key) -> bool {
        let mut ex = lock(&self.expectations);
        let Some(m) = ex.get_mut(key) else {
            return true;
        };
        m.retain(|name, e| {
            let cached = self.slices.get(&key.0, name);
            match e {
                Expect::AtLeast(v) => cached.is_none_or(|s| rv(&s.metadata) < *v),
                Expect::Gone => cached.is_some(),
            }
        });
        let fresh = m.is_empty();
        if fresh {
            ex.remove(key);
        }
        fresh
    }

    fn expect(&self, key: &Key, name: String, e: Expect) {
        lock(&self.expectations)
            .entry(key.clone())
            .or_default()
            .insert(name, e);
    }

    async fn event(&self, svc: &Service, type_: &str, reason: &str, message: &str) {
        use ferry_kubeclient::events::{Recorder, Source, reference};
        let recorder = Recorder::new(
            self.client.clone(),
            Source::new("endpoint-slice-controller"),
        );
        if let Err(e) = recorder
            .publish(reference(svc), type_, reason, message)
            .await
        {
            let ns = svc.namespace().unwrap_or_default();
            tracing::debug!("event for {ns}/{}: {e}", svc.name_any());
        }
    }

    /// Applies a slice plan; false when a write conflicted (the caller requeues).
    async fn apply_slices(&self, key: &Key, plan: slices::Plan) -> bool {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &key.0);
        let pp = PostParams::default();
        let mut ok = true;
        for s in plan.update {
            let name = s.name_any();
            match api.replace(&name, &pp, &s).await {
                Ok(w) => self.expect(key, name, Expect::AtLeast(rv(&w.metadata))),
                Err(e) => {
                    tracing::debug!("updating slice {}/{name}: {e}", key.0);
                    ok = false;
                }
            }
        }
        for s in plan.create {
            match api.create(&pp, &s).await {
                Ok(w) => self.expect(key, w.name_any(), Expect::AtLeast(rv(&w.metadata))),
                Err(e) => {
                    tracing::debug!("creating slice for {}/{}: {e}", key.0, key.1);
                    ok = false;
                }
            }
        }
        for s in plan.delete {
            let name = s.name_any();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => self.expect(key, name, Expect::Gone),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::debug!("deleting slice {}/{name}: {e}", key.0);
                    ok = false;
                }
            }
        }
        ok
    }

    fn slices_of(&self, key: &Key, manager: &str) -> Vec<EndpointSlice> {
        self.slices
            .in_namespace(&key.0)
            .into_iter()
            .filter(|s| svc_key_of_slice(s).as_ref() == Some(key) && managed_by(s) == manager)
            .map(|s| (*s).clone())
            .collect()
    }

    /// One sync of a Service: slices, Endpoints, mirrored slices. Ok(false) = retry soon.
    pub async fn sync(&self, key: &Key) -> Result<bool> {
        if !self.cache_fresh(key) {
            return Ok(false);
        }
        let svc = self.services.get(&key.0, &key.1);
        let mut ok = true;
        let selecting = svc.as_ref().filter(|s| {
            desired::selector(s).is_some()
                && s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) != Some("ExternalName")
        });
        let existing = self.slices_of(key, slices::CONTROLLER_NAME);
        match selecting {
            Some(svc) => {
                let sel = desired::selector(svc).cloned().unwrap_or_default();
                let pods: Vec<Arc<SlimPod>> = self
                    .pods
                    .in_namespace(&key.0)
                    .into_iter()
                    .filter(|p| desired::selector_matches(&sel, p.metadata.labels.as_ref()))
                    .collect();
                let refs: Vec<&SlimPod> = pods.iter().map(|p| p.as_ref()).collect();
                let mut want = desired::desired_endpoints(svc, &refs, &|n| self.zone_of_node(n));
                if hints::hints_requested(svc) {
                    self.apply_hints(key, svc, &mut want).await;
                } else {
                    lock(&self.hint_state).remove(key);
                }
                let plan = slices::reconcile(
                    svc,
                    &want,
                    &existing,
                    self.args.max_endpoints_per_slice as usize,
                );
                if !plan.is_empty() {
                    ok &= self.apply_slices(key, plan).await;
                }
                ok &= self.sync_endpoints(key, Some(svc), &refs).await;
            }
            None => {
                if !existing.is_empty() {
                    let plan = slices::Plan {
                        delete: existing,
                        ..Default::default()
                    };
                    ok &= self.apply_slices(key, plan).await;
                }
                if svc.is_none() {
                    ok &= self.sync_endpoints(key, None, &[]).await;
                }
            }
        }
        // Mirroring.
        let mirrored = self.slices_of(key, mirror::MIRROR_CONTROLLER);
        let plan = match self.endpoints.get(&key.0, &key.1) {
            Some(ep) => {
                let skip = mirror::skip_reason(&ep, svc.as_deref());
                mirror::reconcile(&ep, skip.is_none(), &mirrored)
            }
            None => slices::Plan {
                delete: mirrored,
                ..Default::default()
            },
        };
        if !plan.is_empty() {
            ok &= self.apply_slices(key, plan).await;
        }
        Ok(ok)
    }

    async fn apply_hints(&self, key: &Key, svc: &Service, want: &mut desired::Desired) {
        let nodes = self.nodes.all();
        let node_refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        let cpu = hints::zone_cpu(&node_refs);
        let mut by_type: BTreeMap<String, Vec<&mut k8s_openapi::api::discovery::v1::Endpoint>> =
            BTreeMap::new();
        for ((at, _), (_, eps)) in want.iter_mut() {
            by_type
                .entry(at.clone())
                .or_default()
                .extend(eps.iter_mut());
        }
        let mut withheld = None;
        for eps in by_type.values_mut() {
            if let Err(w) = hints::assign_hints(eps, cpu.as_ref().map_err(Clone::clone)) {
                withheld = Some(w);
            }
        }
        if withheld.is_some() {
            // All or nothing across families.
            for eps in by_type.values_mut() {
                for e in eps.iter_mut() {
                    e.hints = None;
                }
            }
        }
        let state = withheld.as_ref().map(hints::Withheld::message);
        let changed =
            lock(&self.hint_state).insert(key.clone(), state.clone()) != Some(state.clone());
        if changed {
            match state {
                Some(msg) => {
                    self.event(svc, "Warning", "TopologyAwareHintsDisabled", &msg)
                        .await
                }
                None => {
                    self.event(
                        svc,
                        "Normal",
                        "TopologyAwareHintsEnabled",
                        "Topology Aware Hints has been enabled, addressType: IPv4",
                    )
                    .await
                }
            }
        }
    }

    async fn sync_endpoints(&self, key: &Key, svc: Option<&Service>, pods: &[&SlimPod]) -> bool {
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &key.0);
        let current = self.endpoints.get(&key.0, &key.1);
        let Some(svc) = svc else {
            // The Service is gone: its Endpoints go too.
            if current.is_some() {
                match api.delete(&key.1, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => {
                        tracing::debug!("deleting endpoints {}/{}: {e}", key.0, key.1);
                        return false;
                    }
                }
            }
            return true;
        };
        let want = endpoints::build(svc, pods);
        let result = match current {
            None => api.create(&PostParams::default(), &want).await.map(|_| ()),
            Some(cur) => {
                if !endpoints::differs(&cur, &want) {
                    return true;
                }
                let mut next = (*cur).clone();
                next.subsets = want.subsets;
                next.metadata.labels = want.metadata.labels;
                let mut ann = next.metadata.annotations.take().unwrap_or_default();
                ann.remove(endpoints::OVER_CAPACITY);
                ann.extend(want.metadata.annotations.unwrap_or_default());
                next.metadata.annotations = (!ann.is_empty()).then_some(ann);
                api.replace(&key.1, &PostParams::default(), &next)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("writing endpoints {}/{}: {e}", key.0, key.1);
                false
            }
        }
    }

    /// Assigns load-balancer addresses to every LoadBalancer Service of our class.
    pub async fn sync_load_balancers(&self) {
        let all = self.services.all();
        let map: BTreeMap<String, &Service> = all
            .iter()
            .map(|s| {
                (
                    format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()),
                    s.as_ref(),
                )
            })
            .collect();
        let got = if self.pool.is_empty() {
            BTreeMap::new()
        } else {
            lbpool::assign(&self.pool, &map, &self.args.loadbalancer_class)
        };
        for (k, svc) in &map {
            let ours = lbpool::is_ours(svc, &self.args.loadbalancer_class);
            let current = lbpool::current_ips(svc);
            let want: Option<Vec<String>> = match got.get(k) {
                Some(lbpool::Assignment::Ips(ips)) => Some(ips.clone()),
                Some(other) => {
                    let msg = match other {
                        lbpool::Assignment::Unavailable(ip) => {
                            format!("requested loadBalancerIP {ip} is not available in the pool")
                        }
                        _ => "no free address in the load-balancer pool".to_string(),
                    };
                    let key: Key = (svc.namespace().unwrap_or_default(), svc.name_any());
                    let again =
                        lock(&self.lb_reported).insert(key, msg.clone()) == Some(msg.clone());
                    if !again {
                        self.event(svc, "Warning", "AllocationFailed", &msg).await;
                    }
                    Some(Vec::new())
                }
                // Not an LB of ours: clear addresses we handed out earlier.
                None if !ours && !self.pool.is_empty() => {
                    let ours_before = current
                        .iter()
                        .any(|ip| ip.parse().is_ok_and(|ip| self.pool.contains(&ip)));
                    let lb_other_class =
                        svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
                    (ours_before && !lb_other_class).then(Vec::new)
                }
                None => None,
            };
            let Some(want) = want else { continue };
            if want == current {
                continue;
            }
            let ingress: Vec<serde_json::Value> = want
                .iter()
                .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
                .collect();
            let patch = json!({"status": {"loadBalancer": {"ingress": if ingress.is_empty() { serde_json::Value::Null } else { json!(ingress) }}}});
            let api: Api<Service> =
                Api::namespaced(self.client.clone(), &svc.namespace().unwrap_or_default());
            if let Err(e) = api
                .patch_status(
                    &svc.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                tracing::debug!("load-balancer status of {k}: {e}");
            } else if !want.is_empty() {
                self.event(
                    svc,
                    "Normal",
                    "IPAllocated",
                    &format!("Assigned IP {:?}", want),
                )
                .await;
            }
        }
    }
}

/// Starts the watches and workers; returns when `stop` is cancelled.
pub async fn run(client: kube::Client, args: ServiceArgs, stop: CancellationToken) -> Result<()> {
    let informers = crate::runtime::Informers::new(client.clone(), stop.clone());
    run_with(client, args, informers, stop).await
}

/// [`run`] with the process's shared informers (one Pod watch for every controller).
pub async fn run_with(
    client: kube::Client,
    args: ServiceArgs,
    informers: crate::runtime::Informers,
    stop: CancellationToken,
) -> Result<()> {
    let c = Controller::new(client.clone(), args)?;
    run_controller_with(c, informers, stop).await
}

/// Runs an already built controller (tests and benchmarks inspect its caches).
pub async fn run_controller(c: Arc<Controller>, stop: CancellationToken) -> Result<()> {
    let informers = crate::runtime::Informers::new(c.client.clone(), stop.clone());
    run_controller_with(c, informers, stop).await
}

/// [`run_controller`] with the process's shared informers.
pub async fn run_controller_with(
    c: Arc<Controller>,
    informers: crate::runtime::Informers,
    stop: CancellationToken,
) -> Result<()> {
    let client = c.client.clone();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let cc = c.clone();
        tasks.spawn(cache::run_watch(
            Api::<Service>::all(client.clone()),
            c.services.clone(),
            move |ch| {
                match &ch {
                    Change::Apply { new, .. } => cc
                        .queue
                        .add((new.namespace().unwrap_or_default(), new.name_any())),
                    Change::Delete { old } => cc
                        .queue
                        .add((old.namespace().unwrap_or_default(), old.name_any())),
                    Change::Resync { old } => {
                        for o in old {
                            cc.queue
                                .add((o.namespace().unwrap_or_default(), o.name_any()));
                        }
                        cc.enqueue_all_services();
                    }
                }
                cc.lb_queue.notify_one();
            },
            stop.clone(),
        ));
    }
    {
        // Pods come from the process's shared informer: this cache holds the same Arcs, by
        // namespace (a Service's sync reads only its namespace's pods).
        let cc = c.clone();
        let shared = informers.pods();
        let store = shared.store();
        shared.subscribe(move |ch| {
            match ch.new {
                Some(new) => {
                    let shared = store.get(&ObjectRef::from_obj(new));
                    match shared {
                        Some(o) => cc.pods.put_shared(o),
                        None => cc.pods.put_shared(Arc::new(new.clone())),
                    };
                }
                None => {
                    if let Some(old) = ch.old {
                        cc.pods.remove_shared(old);
                    }
                }
            }
            cc.on_pod(ch.old, ch.new);
        });
        let (cc, informers, stop) = (c.clone(), informers.clone(), stop.clone());
        tasks.spawn(async move {
            if informers.pods().wait_synced(&stop).await {
                cc.pods.mark_synced();
            }
        });
    }
    {
        let cc = c.clone();
        tasks.spawn(cache::run_watch(
            Api::<Node>::all(client.clone()),
            c.nodes.clone(),
            move |ch| match ch {
                Change::Apply { old, new } => cc.on_node(old.as_deref(), Some(&new)),
                Change::Delete { old } => cc.on_node(Some(&old), None),
                Change::Resync { .. } => cc.enqueue_all_services(),
            },
            stop.clone(),
        ));
    }
    {
        let cc = c.clone();
        tasks.spawn(cache::run_watch(
            Api::<EndpointSlice>::all(client.clone()),
            c.slices.clone(),
            move |ch| {
                let keys: Vec<Key> = match &ch {
                    Change::Apply { old, new } => [old.as_deref(), Some(new.as_ref())]
                        .into_iter()
                        .flatten()
                        .filter_map(svc_key_of_slice)
                        .collect(),
                    Change::Delete { old } => svc_key_of_slice(old).into_iter().collect(),
                    Change::Resync { .. } => {
                        cc.enqueue_all_services();
                        Vec::new()
                    }
                };
                for k in keys {
                    cc.queue.add(k);
                }
            },
            stop.clone(),
        ));
    }
    {
        let cc = c.clone();
        tasks.spawn(cache::run_watch(
            Api::<Endpoints>::all(client.clone()),
            c.endpoints.clone(),
            move |ch| match &ch {
                Change::Apply { new, .. } => cc
                    .queue
                    .add((new.namespace().unwrap_or_default(), new.name_any())),
                Change::Delete { old } => cc
                    .queue
                    .add((old.namespace().unwrap_or_default(), old.name_any())),
                Change::Resync { old } => {
                    for o in old {
                        cc.queue
                            .add((o.namespace().unwrap_or_default(), o.name_any()));
                    }
                    for o in cc.endpoints.all() {
                        cc.queue
                            .add((o.namespace().unwrap_or_default(), o.name_any()));
                    }
                }
            },
            stop.clone(),
        ));
    }
    // Workers start once every cache has been listed.
    let synced = async {
        cache::wait_synced(&c.services, &stop).await
            && cache::wait_synced(&c.pods, &stop).await
            && cache::wait_synced(&c.nodes, &stop).await
            && cache::wait_synced(&c.slices, &stop).await
            && cache::wait_synced(&c.endpoints, &stop).await
    };
    if !synced.await {
        return Ok(());
    }
    c.start_pod_mapping();
    tracing::info!("service controllers synced");
    for _ in 0..c.args.concurrent_service_syncs.max(1) {
        let cc = c.clone();
        tasks.spawn(async move {
            while let Some(k) = cc.queue.get().await {
                match cc.sync(&k).await {
                    Ok(true) => cc.queue.forget(&k),
                    // A write conflicted or the slice cache lags our writes: retry with the
                    // queue's backoff (upstream returns an error for both).
                    Ok(false) => {
                        let retry_in = cc.queue.add_rate_limited(k.clone());
                        tracing::debug!(service = %format!("{}/{}", k.0, k.1), ?retry_in, "sync incomplete, retrying");
                    }
                    Err(e) => {
                        let retries = cc.queue.num_requeues(&k);
                        let retry_in = cc.queue.add_rate_limited(k.clone());
                        tracing::warn!(
                            controller = "endpointslice-controller",
                            service = %format!("{}/{}", k.0, k.1),
                            retries,
                            ?retry_in,
                            "sync failed: {e}"
                        );
                    }
                }
                cc.queue.done(&k);
            }
        });
    }
    {
        let cc = c.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            loop {
                cc.sync_load_balancers().await;
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = cc.lb_queue.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
                // Coalesce bursts.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    stop.cancelled().await;
    c.queue.shut_down();
    tasks.shutdown().await;
    Ok(())
}

/// Locks bookkeeping that stays consistent across a panicking holder (single map operations):
/// a poisoned lock is taken over, never read as empty.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
