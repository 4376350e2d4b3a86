//! The ReplicaSet and Deployment controllers on the controller runtime ([`crate::runtime`]):
//! reflector stores of Deployments, ReplicaSets and Pods; a change enqueues only the keys it
//! affects (a pod → its ReplicaSet, or the ReplicaSets selecting an orphan, and that
//! ReplicaSet's Deployment; a ReplicaSet → itself and its Deployment); workers sync one key at a
//! time from the stores, using the pure decisions of [`super::workload_core`], and issue the
//! writes of a key concurrently. Writes are remembered ("expectations", as upstream) so that a
//! lagging cache never causes duplicate pods or a second scale-down.

use crate::runtime::SlimPod;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::api::core::v1::ReplicationController;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::workload_core::{self as core, Candidate, Claim, PodView, RsDiff, RsState};
use crate::runtime::{self, Action, ControllerIndex, ObjectKey, Reconciler, WorkQueue, keys};

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
pub const HASH_LABEL: &str = "pod-template-hash";
const EXPECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Upstream's `--concurrent-replicaset-syncs` and `--concurrent-deployment-syncs` defaults.
const WORKERS: usize = 5;

/// Pending writes of one controller object.
#[derive(Default)]
struct Expect {
    created: HashSet<String>,
    deleted: HashSet<String>,
    /// ReplicaSet name -> resourceVersion our write produced.
    rs_versions: HashMap<String, u64>,
    since: Option<Instant>,
}

struct Workloads {
    client: kube::Client,
    deployments: Store<Deployment>,
    replica_sets: Store<ReplicaSet>,
    rcs: Store<ReplicationController>,
    pods: Store<SlimPod>,
    /// Pods by controller uid, orphans by namespace.
    pod_index: Arc<ControllerIndex>,
    /// ReplicaSets by controller uid, orphans by namespace.
    rs_index: Arc<ControllerIndex>,
    /// Owner uid -> writes not yet seen in the stores.
    expect: Mutex<HashMap<String, Expect>>,
}

/// The ReplicaSet controller's reconciler.
struct ReplicaSets(Arc<Workloads>);
/// The Deployment controller's reconciler.
struct Deployments(Arc<Workloads>);

impl Reconciler for ReplicaSets {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "replicaset-controller"
    }
    async fn reconcile(&self, key: &ObjectKey) -> kube::Result<Action> {
        match key.get(&self.0.replica_sets) {
            Some(rs) => self.0.sync_replica_set(&rs, false).await,
            None => Ok(Action::Done),
        }
    }
}

/// The ReplicationController controller's reconciler: a ReplicationController is synced as
/// the ReplicaSet it is equivalent to (its selector a plain label map).
struct ReplicationControllers(Arc<Workloads>);

impl Reconciler for ReplicationControllers {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "replication-controller"
    }
    async fn reconcile(&self, key: &ObjectKey) -> kube::Result<Action> {
        match key.get(&self.0.rcs) {
            Some(rc) => self.0.sync_replica_set(&rc_as_replica_set(&rc), true).await,
            None => Ok(Action::Done),
        }
    }
}

/// The ReplicaSet a ReplicationController stands for (upstream's `conversion.go` of the
/// replication manager).
pub fn rc_as_replica_set(rc: &ReplicationController) -> ReplicaSet {
    let spec = rc.spec.clone().unwrap_or_default();
    let status = rc.status.clone();
    ReplicaSet {
        metadata: rc.metadata.clone(),
        spec: ReplicaSetSpec {
            replicas: spec.replicas,
            min_ready_seconds: spec.min_ready_seconds,
            selector: LabelSelector {
                match_labels: spec.selector,
                match_expressions: None,
            },
            template: spec.template,
        },
        status: status.map(|s| k8s_openapi::api::apps::v1::ReplicaSetStatus {
            replicas: s.replicas,
            fully_labeled_replicas: s.fully_labeled_replicas,
            ready_replicas: s.ready_replicas,
            available_replicas: s.available_replicas,
            observed_generation: s.observed_generation,
            conditions: s.conditions.map(|cs| {
                cs.into_iter()
                    .map(|c| k8s_openapi::api::apps::v1::ReplicaSetCondition {
                        type_: Some(c.type_),
                        status: Some(c.status),
                        reason: c.reason,
                        message: c.message,
                        last_transition_time: c.last_transition_time,
                    })
                    .collect()
            }),
            terminating_replicas: None,
        }),
    }
}

fn rc_selects(rc: &ReplicationController, labels: &BTreeMap<String, String>) -> bool {
    rc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

impl Reconciler for Deployments {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "deployment-controller"
    }
    async fn reconcile(&self, key: &ObjectKey) -> kube::Result<Action> {
        match key.get(&self.0.deployments) {
            Some(d) => self.0.sync_deployment(&d).await,
            None => Ok(Action::Done),
        }
    }
}

fn rs_selects(rs: &ReplicaSet, labels: &BTreeMap<String, String>) -> bool {
    crate::workloads2::common::selects(&rs.spec.selector, labels)
}

fn deployment_selects(d: &Deployment, labels: &BTreeMap<String, String>) -> bool {
    crate::workloads2::common::selects(&d.spec.selector, labels)
}

pub async fn run(client: kube::Client, informers: runtime::Informers, stop: CancellationToken) {
    let rs_queue: Arc<WorkQueue<ObjectKey>> = Arc::default();
    let rc_queue: Arc<WorkQueue<ObjectKey>> = Arc::default();
    let rcs = {
        let q = rc_queue.clone();
        runtime::reflect(
            Api::<ReplicationController>::all(client.clone()),
            watcher::Config::default(),
            stop.clone(),
            move |ch| {
                for rc in ch.objects() {
                    q.add(ObjectKey::of(rc));
                }
            },
        )
    };
    let d_queue: Arc<WorkQueue<ObjectKey>> = Arc::default();
    let pod_index: Arc<ControllerIndex> = Arc::default();
    let rs_index: Arc<ControllerIndex> = Arc::default();
    let cfg = watcher::Config::default;
    let deployments = {
        let q = d_queue.clone();
        runtime::reflect(
            Api::<Deployment>::all(client.clone()),
            cfg(),
            stop.clone(),
            move |ch| {
                for d in ch.objects() {
                    q.add(ObjectKey::of(d));
                }
            },
        )
    };
    let replica_sets = {
        let (rq, dq, ix, ds) = (
            rs_queue.clone(),
            d_queue.clone(),
            rs_index.clone(),
            deployments.clone(),
        );
        runtime::reflect(
            Api::<ReplicaSet>::all(client.clone()),
            cfg(),
            stop.clone(),
            move |ch| {
                ix.update(&ch);
                for rs in ch.objects() {
                    rq.add(ObjectKey::of(rs));
                    match keys::controller_ref(&rs.metadata) {
                        Some(_) => dq.extend(keys::controller_key::<Deployment>(&rs.metadata)),
                        None => dq.extend(keys::selecting(
                            &ds,
                            rs.metadata.namespace.as_deref().unwrap_or(""),
                            rs.labels(),
                            deployment_selects,
                        )),
                    }
                }
            },
        )
    };
    let pods = {
        let (rq, dq, ix, rss) = (
            rs_queue.clone(),
            d_queue.clone(),
            pod_index.clone(),
            replica_sets.clone(),
        );
        let (cq, rcs) = (rc_queue.clone(), rcs.clone());
        informers.pods().subscribe(move |ch| {
            ix.update(&ch);
            for p in ch.objects() {
                match keys::controller_ref(&p.metadata) {
                    Some(r) if r.kind == "ReplicationController" && r.api_version == "v1" => {
                        cq.extend(keys::controller_key::<ReplicationController>(&p.metadata));
                    }
                    Some(_) => {
                        let Some(k) = keys::controller_key::<ReplicaSet>(&p.metadata) else {
                            continue;
                        };
                        // The Deployment reads its pods' availability too.
                        if let Some(rs) = k.get(&rss) {
                            dq.extend(keys::controller_key::<Deployment>(&rs.metadata));
                        }
                        rq.add(k);
                    }
                    None => {
                        rq.extend(keys::selecting(
                            &rss,
                            p.metadata.namespace.as_deref().unwrap_or(""),
                            p.labels(),
                            rs_selects,
                        ));
                        cq.extend(keys::selecting(
                            &rcs,
                            p.metadata.namespace.as_deref().unwrap_or(""),
                            p.labels(),
                            rc_selects,
                        ));
                    }
                }
            }
        })
    };
    let synced = async {
        deployments.wait_until_ready().await.is_ok()
            && replica_sets.wait_until_ready().await.is_ok()
            && rcs.wait_until_ready().await.is_ok()
            && informers.pods().wait_synced(&stop).await
    };
    tokio::select! {
        _ = stop.cancelled() => return,
        ok = synced => if !ok { return },
    }
    let w = Arc::new(Workloads {
        client,
        deployments,
        replica_sets,
        rcs,
        pods,
        pod_index,
        rs_index,
        expect: Mutex::default(),
    });
    tokio::join!(
        runtime::worker::run(
            Arc::new(ReplicaSets(w.clone())),
            rs_queue,
            WORKERS,
            stop.clone()
        ),
        runtime::worker::run(
            Arc::new(ReplicationControllers(w.clone())),
            rc_queue,
            WORKERS,
            stop.clone()
        ),
        runtime::worker::run(Arc::new(Deployments(w)), d_queue, WORKERS, stop),
    );
}

fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).to_string(),
        kind: K::kind(&()).to_string(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn is_terminal(p: &SlimPod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// When the pod's Ready condition became true, if it is.
fn ready_since(p: &SlimPod) -> Option<i64> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| {
            c.last_transition_time
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or(0)
        })
}

fn now_secs() -> i64 {
    jiff::Timestamp::now().as_second()
}

fn is_available(p: &SlimPod, min_ready: i32) -> bool {
    match ready_since(p) {
        Some(t) => min_ready <= 0 || t + i64::from(min_ready) <= now_secs(),
        None => false,
    }
}

fn pod_view(p: &SlimPod) -> PodView {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    let ready = ready_since(p);
    PodView {
        name: p.name_any(),
        assigned: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty()),
        phase_rank: match phase {
            Some("Running") => 2,
            Some("Pending") | None => 0,
            _ => 1,
        },
        ready: ready.is_some(),
        ready_for: ready.map(|t| now_secs() - t).unwrap_or(0),
        restarts: p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|cs| cs.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0),
        created: p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second())
            .unwrap_or(0),
    }
}

fn rv(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The template without the `pod-template-hash` label, for comparison.
fn template_sans_hash(t: Option<&PodTemplateSpec>) -> Value {
    let mut v = serde_json::to_value(t).unwrap_or(Value::Null);
    if let Some(labels) = v
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove(HASH_LABEL);
        if labels.is_empty()
            && let Some(m) = v.pointer_mut("/metadata").and_then(Value::as_object_mut)
        {
            m.remove("labels");
        }
    }
    v
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// The patch adding `owner` as controller of an object (resourceVersion precondition).
fn adopt_patch(meta: &ObjectMeta, owner: &OwnerReference) -> Value {
    let mut refs = meta.owner_references.clone().unwrap_or_default();
    refs.push(owner.clone());
    json!({"metadata": {"ownerReferences": refs, "resourceVersion": meta.resource_version}})
}

/// The patch removing the reference to `owner_uid` (upstream's release).
fn release_patch(meta: &ObjectMeta, owner_uid: &str) -> Value {
    let keep: Vec<&OwnerReference> = meta
        .owner_references
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .filter(|r| r.uid != owner_uid)
        .collect();
    json!({"metadata": {
        "ownerReferences": if keep.is_empty() { Value::Null } else { json!(keep) },
        "resourceVersion": meta.resource_version,
    }})
}

/// Adopts and releases `candidates` for an owner (upstream's `ClaimPods`/`ClaimReplicaSets`),
/// the patches of one claim issued concurrently; returns the objects owned afterwards.
async fn claim_all<K, O>(
    api: &Api<K>,
    owner: &O,
    owner_ref: &OwnerReference,
    selects: impl Fn(&K) -> bool,
    candidates: Vec<Arc<K>>,
) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    O: Resource<DynamicType = ()>,
{
    let owner_uid = owner.meta().uid.clone().unwrap_or_default();
    let owner_deleting = owner.meta().deletion_timestamp.is_some();
    let mut owned = Vec::new();
    let mut patches = Vec::new();
    for c in candidates {
        let view = Candidate {
            controller_uid: keys::controller_ref(c.meta()).map(|r| r.uid.clone()),
            matches: selects(&c),
            deleting: c.meta().deletion_timestamp.is_some(),
        };
        match core::claim(&owner_uid, owner_deleting, &view) {
            Claim::Owned => owned.push(c),
            Claim::Adopt => patches.push((adopt_patch(c.meta(), owner_ref), true, c)),
            Claim::Release => patches.push((release_patch(c.meta(), &owner_uid), false, c)),
            Claim::Ignore => {}
        }
    }
    let done = futures::future::join_all(patches.into_iter().map(|(p, adopt, c)| async move {
        let name = c.meta().name.clone().unwrap_or_default();
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&p))
            .await
        {
            Ok(o) => adopt.then(|| Arc::new(o)),
            Err(e) => {
                tracing::info!(
                    "{} {name}: {}: {e}",
                    K::kind(&()),
                    if adopt { "adopt" } else { "release" }
                );
                None
            }
        }
    }))
    .await;
    owned.extend(done.into_iter().flatten());
    owned
}

impl Workloads {
    fn expectations(&self) -> MutexGuard<'_, HashMap<String, Expect>> {
        self.expect.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn expectations_met(&self, uid: &str, ns: &str) -> bool {
        let mut ex = self.expectations();
        // Expectations of owners that went away expire as upstream's (by time).
        ex.retain(|_, e| e.since.is_none_or(|s| s.elapsed() <= EXPECT_TIMEOUT));
        let Some(e) = ex.get(uid) else {
            return true;
        };
        let pod = |name: &str| ObjectKey::new(ns, name).get(&self.pods);
        let created = e.created.iter().all(|n| pod(n).is_some());
        let deleted = e
            .deleted
            .iter()
            .all(|n| pod(n).is_none_or(|p| p.metadata.deletion_timestamp.is_some()));
        let versions = e.rs_versions.iter().all(|(n, v)| {
            ObjectKey::new(ns, n)
                .get(&self.replica_sets)
                .is_some_and(|r| rv(&r.metadata) >= *v)
        });
        let met = created && deleted && versions;
        if met {
            ex.remove(uid);
        }
        met
    }

    fn set_expectations(&self, uid: &str, e: Expect) {
        self.expectations().insert(uid.to_string(), e);
    }

    fn pods_of(&self, uid: &str) -> Vec<Arc<SlimPod>> {
        self.pod_index
            .controlled_by(uid)
            .iter()
            .filter_map(|k| k.get(&self.pods))
            .collect()
    }

    /// Syncs a ReplicaSet, or a ReplicationController seen as one (`rc`: its owner
    /// references, Events and status are the ReplicationController's).
    async fn sync_replica_set(&self, rs: &ReplicaSet, rc: bool) -> kube::Result<Action> {
        let owner_ref = if rc {
            OwnerReference {
                api_version: "v1".into(),
                kind: "ReplicationController".into(),
                ..controller_ref(rs)
            }
        } else {
            controller_ref(rs)
        };
        let component = if rc {
            "replication-controller"
        } else {
            "replicaset-controller"
        };
        let about = || {
            let mut r = super::events::reference(rs);
            if rc {
                r.kind = Some("ReplicationController".into());
                r.api_version = Some("v1".into());
            }
            r
        };
        let uid = rs.uid().unwrap_or_default();
        let ns = rs.namespace().unwrap_or_default();
        let name = rs.name_any();
        let spec = &rs.spec;
        let pods_api: Api<SlimPod> = Api::namespaced(self.client.clone(), &ns);
        let deleting = rs.metadata.deletion_timestamp.is_some();
        let owned: Vec<Arc<SlimPod>> = self.pods_of(&uid);
        let is_active = |p: &SlimPod| p.metadata.deletion_timestamp.is_none() && !is_terminal(p);
        // Claim the active pods: ours and the namespace's orphans (upstream claims only
        // active pods).
        let candidates: Vec<Arc<SlimPod>> = owned
            .iter()
            .cloned()
            .chain(
                self.pod_index
                    .orphans_in(&ns)
                    .iter()
                    .filter_map(|k| k.get(&self.pods)),
            )
            .filter(|p| is_active(p))
            .collect();
        let active: Vec<Arc<SlimPod>> = claim_all(
            &pods_api,
            rs,
            &owner_ref,
            |p: &SlimPod| crate::workloads2::common::selects(&spec.selector, p.labels()),
            candidates,
        )
        .await;
        // Some(None): creations succeeded or were not needed; Some(Some(e)): a creation failed.
        let mut failure: Option<Option<String>> = None;
        let mut write_error: Option<kube::Error> = None;
        let met = self.expectations_met(&uid, &ns);
        if !deleting && met {
            let views: Vec<PodView> = active.iter().map(|p| pod_view(p)).collect();
            match core::replica_set_diff(spec.replicas.unwrap_or(1), &views) {
                RsDiff::None => failure = Some(None),
                RsDiff::Create(n) => {
                    let mut e = Expect {
                        since: Some(Instant::now()),
                        ..Default::default()
                    };
                    let template = spec.template.clone().unwrap_or_default();
                    let tm = template.metadata.clone().unwrap_or_default();
                    let pod = k8s_openapi::api::core::v1::Pod {
                        metadata: ObjectMeta {
                            generate_name: Some(format!("{name}-")),
                            namespace: Some(ns.clone()),
                            labels: tm.labels.clone(),
                            annotations: tm.annotations.clone(),
                            finalizers: tm.finalizers.clone(),
                            owner_references: Some(vec![owner_ref.clone()]),
                            ..Default::default()
                        },
                        spec: template.spec.clone(),
                        status: None,
                    };
                    let post = PostParams::default();
                    let create_api: Api<k8s_openapi::api::core::v1::Pod> =
                        Api::namespaced(self.client.clone(), &ns);
                    // Upstream's slow start: batches of 1, 2, 4, ... issued concurrently;
                    // the first failing batch stops the rest.
                    'batches: for size in core::slow_start_batches(n) {
                        let results = futures::future::join_all(
                            (0..size).map(|_| create_api.create(&post, &pod)),
                        )
                        .await;
                        let mut failed = false;
                        for r in results {
                            match r {
                                Ok(p) => {
                                    super::events::record(
                                        &self.client,
                                        about(),
                                        "Normal",
                                        "SuccessfulCreate",
                                        format!("Created pod: {}", p.name_any()),
                                        component,
                                    );
                                    e.created.insert(p.name_any());
                                }
                                Err(err) => {
                                    failure = Some(Some(match &err {
                                        kube::Error::Api(s) => s.message.clone(),
                                        e => e.to_string(),
                                    }));
                                    write_error.get_or_insert(err);
                                    failed = true;
                                }
                            }
                        }
                        if failed {
                            break 'batches;
                        }
                    }
                    if failure.is_none() {
                        failure = Some(None);
                    }
                    self.set_expectations(&uid, e);
                }
                RsDiff::Delete(names) => {
                    let mut e = Expect {
                        since: Some(Instant::now()),
                        ..Default::default()
                    };
                    let results = futures::future::join_all(names.iter().map(|n| {
                        let api = &pods_api;
                        async move { (n, api.delete(n, &DeleteParams::default()).await) }
                    }))
                    .await;
                    for (n, r) in results {
                        match r {
                            Ok(_) => {
                                super::events::record(
                                    &self.client,
                                    about(),
                                    "Normal",
                                    "SuccessfulDelete",
                                    format!("Deleted pod: {n}"),
                                    component,
                                );
                                e.deleted.insert(n.clone());
                            }
                            Err(kube::Error::Api(s)) if s.code == 404 => {}
                            Err(err) => {
                                write_error.get_or_insert(err);
                            }
                        }
                    }
                    self.set_expectations(&uid, e);
                }
            }
        }
        let active: Vec<&Arc<SlimPod>> = active.iter().collect();
        // Status.
        let min_ready = spec.min_ready_seconds.unwrap_or(0);
        let template_labels = spec
            .template
            .as_ref()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let replicas = i32::try_from(active.len()).unwrap_or(i32::MAX);
        let ready = active.iter().filter(|p| ready_since(p).is_some()).count();
        let available = active.iter().filter(|p| is_available(p, min_ready)).count();
        let labeled = active
            .iter()
            .filter(|p| {
                template_labels
                    .iter()
                    .all(|(k, v)| p.labels().get(k) == Some(v))
            })
            .count();
        let terminating = owned
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .count();
        let want = json!({
            "replicas": replicas,
            "fullyLabeledReplicas": labeled,
            "readyReplicas": ready,
            "availableReplicas": available,
            "terminatingReplicas": terminating,
            "observedGeneration": rs.metadata.generation,
        });
        let cur = serde_json::to_value(rs.status.as_ref()).unwrap_or(Value::Null);
        let mut want = want;
        if rc && let Some(m) = want.as_object_mut() {
            // Not a field of ReplicationControllerStatus.
            m.remove("terminatingReplicas");
        }
        let mut differs = want
            .as_object()
            .is_some_and(|m| m.iter().any(|(k, v)| cur.get(k).unwrap_or(&json!(0)) != v));
        // The ReplicaFailure condition, as upstream: set when a pod cannot be created, cleared
        // once creations work again.
        let cur_conds: Vec<Value> = cur
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let has_failure = cur_conds.iter().any(|c| c["type"] == "ReplicaFailure");
        let conds = match &failure {
            Some(Some(msg)) => {
                let mut v: Vec<Value> = cur_conds
                    .iter()
                    .filter(|c| c["type"] != "ReplicaFailure")
                    .cloned()
                    .collect();
                v.push(
                    json!({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                    "message": msg, "lastTransitionTime": jiff::Timestamp::now().to_string()}),
                );
                let same = cur_conds
                    .iter()
                    .any(|c| c["type"] == "ReplicaFailure" && c["message"] == msg.as_str());
                (!same).then_some(v)
            }
            Some(None) if has_failure => Some(
                cur_conds
                    .iter()
                    .filter(|c| c["type"] != "ReplicaFailure")
                    .cloned()
                    .collect(),
            ),
            _ => None,
        };
        if let Some(c) = conds {
            want["conditions"] = if c.is_empty() { Value::Null } else { json!(c) };
            differs = true;
        }
        if differs {
            let patch = Patch::Merge(json!({"status": want}));
            if rc {
                let api: Api<ReplicationController> = Api::namespaced(self.client.clone(), &ns);
                api.patch_status(&name, &PatchParams::default(), &patch)
                    .await?;
            } else {
                let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
                api.patch_status(&name, &PatchParams::default(), &patch)
                    .await?;
            }
        }
        if let Some(e) = write_error {
            return Err(e);
        }
        if !met {
            // Our writes are not all in the stores yet: their events requeue the key; this
            // is the fallback when one never shows up.
            return Ok(Action::RequeueAfter(EXPECT_TIMEOUT));
        }
        // Pods ready but not yet available for minReadySeconds: look again when the first
        // becomes available (upstream requeues after minReadySeconds).
        let now = now_secs();
        let next_available = active
            .iter()
            .filter_map(|p| ready_since(p))
            .map(|t| t + i64::from(min_ready) - now)
            .filter(|wait| *wait > 0)
            .min();
        Ok(match next_available {
            Some(wait) => Action::RequeueAfter(Duration::from_secs(wait.unsigned_abs() + 1)),
            None => Action::Done,
        })
    }

    async fn sync_deployment(&self, d: &Deployment) -> kube::Result<Action> {
        let uid = d.uid().unwrap_or_default();
        let ns = d.namespace().unwrap_or_default();
        let name = d.name_any();
        let spec = &d.spec;
        let rs_api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        // Claim ReplicaSets: ours and the namespace's orphans the selector matches.
        let candidates: Vec<Arc<ReplicaSet>> = self
            .rs_index
            .controlled_by(&uid)
            .iter()
            .chain(self.rs_index.orphans_in(&ns).iter())
            .filter_map(|k| k.get(&self.replica_sets))
            .collect();
        let claimed = claim_all(
            &rs_api,
            d,
            &controller_ref(d),
            |r: &ReplicaSet| crate::workloads2::common::selects(&spec.selector, r.labels()),
            candidates,
        )
        .await;
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        if !self.expectations_met(&uid, &ns) {
            return Ok(Action::RequeueAfter(EXPECT_TIMEOUT));
        }
        let replicas = spec.replicas.unwrap_or(1);
        let mut owned: Vec<Arc<ReplicaSet>> = claimed
            .into_iter()
            .filter(|r| r.metadata.deletion_timestamp.is_none())
            .collect();
        owned.sort_by_key(|r| {
            (
                revision(r),
                r.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second())
                    .unwrap_or(0),
            )
        });
        let want_template = template_sans_hash(Some(&spec.template));
        let want_hash = core::template_hash(
            &serde_json::to_string(&spec.template).unwrap_or_default(),
            d.status.as_ref().and_then(|s| s.collision_count),
        );
        // The new ReplicaSet has the template (as upstream), or our hash for it (so that a
        // server that defaults the two templates differently cannot make us loop).
        let new_rs = owned
            .iter()
            .rev()
            .find(|r| {
                template_sans_hash(Some(&r.spec).and_then(|s| s.template.as_ref())) == want_template
            })
            .or_else(|| {
                owned
                    .iter()
                    .find(|r| r.labels().get(HASH_LABEL) == Some(&want_hash))
            })
            .cloned();
        let olds: Vec<Arc<ReplicaSet>> = owned
            .iter()
            .filter(|r| new_rs.as_ref().is_none_or(|n| n.uid() != r.uid()))
            .cloned()
            .collect();
        let max_rev = owned.iter().map(|r| revision(r)).max().unwrap_or(0);
        let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
        let (surge, unavailable) = if recreate {
            (0, 0)
        } else {
            let ru = spec
                .strategy
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref());
            core::surge_unavailable(
                ru.and_then(|r| r.max_surge.as_ref()),
                ru.and_then(|r| r.max_unavailable.as_ref()),
                replicas,
            )
        };
        let min_ready = spec.min_ready_seconds.unwrap_or(0);
        let available_of = |r: &ReplicaSet| -> i32 {
            let n = self
                .pods_of(&r.uid().unwrap_or_default())
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && !is_terminal(p)
                        && is_available(p, min_ready)
                })
                .count();
            let spec_r = Some(&r.spec).and_then(|s| s.replicas).unwrap_or(1);
            i32::try_from(n).unwrap_or(i32::MAX).min(spec_r)
        };
        let state = |r: &ReplicaSet| RsState {
            replicas: Some(&r.spec).and_then(|s| s.replicas).unwrap_or(1),
            available: available_of(r),
        };
        let mut expect = Expect {
            since: Some(Instant::now()),
            ..Default::default()
        };
        let paused = spec.paused == Some(true);
        let created_new: Option<String> = None;
        let new_rs = match new_rs {
            Some(n) => {
                // A template rolled back to: it becomes the newest revision.
                let rev = revision(&n);
                if rev < max_rev || n.annotations().get(REVISION).is_none() {
                    let p =
                        json!({"metadata": {"annotations": {REVISION: (max_rev + 1).to_string()}}});
                    let r = rs_api
                        .patch(&n.name_any(), &PatchParams::default(), &Patch::Merge(&p))
                        .await?;
                    expect.rs_versions.insert(r.name_any(), rv(&r.metadata));
                    Arc::new(r)
                } else {
                    n
                }
            }
            None if paused => {
                return self
                    .deployment_status(
                        d,
                        &owned,
                        None,
                        &[],
                        surge,
                        unavailable,
                        available_of,
                        false,
                    )
                    .await;
            }
            None => {
                let collision = d.status.as_ref().and_then(|s| s.collision_count);
                let hash = want_hash.clone();
                let mut template = spec.template.clone();
                let mut tm = template.metadata.clone().unwrap_or_default();
                tm.labels
                    .get_or_insert_default()
                    .insert(HASH_LABEL.into(), hash.clone());
                template.metadata = Some(tm);
                let mut selector = spec.selector.clone();
                selector
                    .match_labels
                    .get_or_insert_default()
                    .insert(HASH_LABEL.into(), hash.clone());
                let mut labels = spec
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default();
                labels.insert(HASH_LABEL.into(), hash.clone());
                let olds_state: Vec<RsState> = olds.iter().map(|r| state(r)).collect();
                let initial = if recreate {
                    0
                } else {
                    let zero = RsState {
                        replicas: 0,
                        available: 0,
                    };
                    let mut all = olds_state.clone();
                    all.push(zero.clone());
                    core::rolling_new_replicas(replicas, surge, &zero, &all)
                };
                let mut annotations: BTreeMap<String, String> = d
                    .annotations()
                    .iter()
                    .filter(|(k, _)| {
                        !k.starts_with("deployment.kubernetes.io/")
                            && *k != "kubectl.kubernetes.io/last-applied-configuration"
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                annotations.insert(REVISION.into(), (max_rev + 1).to_string());
                annotations.insert(DESIRED.into(), replicas.to_string());
                annotations.insert(MAX_REPLICAS.into(), (replicas + surge).to_string());
                let rs = ReplicaSet {
                    metadata: ObjectMeta {
                        name: Some(format!("{name}-{hash}")),
                        namespace: Some(ns.clone()),
                        labels: Some(labels),
                        annotations: Some(annotations),
                        owner_references: Some(vec![controller_ref(d)]),
                        ..Default::default()
                    },
                    spec: k8s_openapi::api::apps::v1::ReplicaSetSpec {
                        replicas: Some(initial),
                        min_ready_seconds: spec.min_ready_seconds,
                        selector,
                        template: Some(template),
                    },
                    status: None,
                };
                match rs_api.create(&PostParams::default(), &rs).await {
                    Ok(r) => {
                        if initial > 0 {
                            super::events::record(
                                &self.client,
                                super::events::reference(d),
                                "Normal",
                                "ScalingReplicaSet",
                                format!(
                                    "Scaled up replica set {} from 0 to {initial}",
                                    r.name_any()
                                ),
                                "deployment-controller",
                            );
                        }
                        expect.rs_versions.insert(r.name_any(), rv(&r.metadata));
                        self.set_expectations(&uid, expect);
                        return Ok(Action::Done);
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        // A hash collision with a ReplicaSet that is not ours: bump the count.
                        let c = collision.unwrap_or(0) + 1;
                        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
                        api.patch_status(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"collisionCount": c}})),
                        )
                        .await?;
                        return Ok(Action::Done);
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let new_state = state(&new_rs);
        let olds_state: Vec<RsState> = olds.iter().map(|r| state(r)).collect();
        if !paused {
            let set_replicas = |name: String, n: i32, cur: i32| -> Option<(String, i32, i32)> {
                (n != cur).then_some((name, n, cur))
            };
            let mut writes: Vec<(String, i32, i32)> = Vec::new();
            if recreate {
                let old_active: usize = olds
                    .iter()
                    .map(|r| {
                        self.pods_of(&r.uid().unwrap_or_default())
                            .iter()
                            .filter(|p| !is_terminal(p))
                            .count()
                    })
                    .sum();
                for (r, s) in olds.iter().zip(olds_state.iter()) {
                    writes.extend(set_replicas(r.name_any(), 0, s.replicas));
                }
                if writes.is_empty() && old_active == 0 {
                    writes.extend(set_replicas(
                        new_rs.name_any(),
                        replicas,
                        new_state.replicas,
                    ));
                }
            } else {
                let mut all = olds_state.clone();
                all.push(new_state.clone());
                let n = core::rolling_new_replicas(replicas, surge, &new_state, &all);
                writes.extend(set_replicas(new_rs.name_any(), n, new_state.replicas));
                if writes.is_empty() {
                    let outs = core::rolling_scale_down_old(
                        replicas,
                        unavailable,
                        &new_state,
                        &olds_state,
                    );
                    for ((r, s), n) in olds.iter().zip(olds_state.iter()).zip(outs) {
                        writes.extend(set_replicas(r.name_any(), n, s.replicas));
                    }
                }
            }
            if !writes.is_empty() {
                // One key's scale writes, issued concurrently.
                let new_name = new_rs.name_any();
                let result = runtime::execute_all(writes, |(rs_name, n, cur)| {
                    let (api, d, new_name) = (&rs_api, &d, &new_name);
                    async move {
                        let ann = if rs_name == *new_name {
                            json!({DESIRED: replicas.to_string(), MAX_REPLICAS: (replicas + surge).to_string()})
                        } else {
                            json!({})
                        };
                        let p = json!({"metadata": {"annotations": ann}, "spec": {"replicas": n}});
                        let r = api
                            .patch(&rs_name, &PatchParams::default(), &Patch::Merge(&p))
                            .await?;
                        super::events::record(
                            &self.client,
                            super::events::reference(*d),
                            "Normal",
                            "ScalingReplicaSet",
                            format!(
                                "Scaled {} replica set {rs_name} from {cur} to {n}",
                                if n > cur { "up" } else { "down" }
                            ),
                            "deployment-controller",
                        );
                        Ok::<_, kube::Error>((r.name_any(), rv(&r.metadata)))
                    }
                })
                .await;
                let (done, err) = match result {
                    Ok(done) => (done, None),
                    Err(e) => (Vec::new(), Some(e.first)),
                };
                expect.rs_versions.extend(done);
                self.set_expectations(&uid, expect);
                return match err {
                    Some(e) => Err(e),
                    None => Ok(Action::Done),
                };
            }
            // Old revisions beyond revisionHistoryLimit.
            let limit =
                usize::try_from(spec.revision_history_limit.unwrap_or(10).max(0)).unwrap_or(10);
            let idle: Vec<&Arc<ReplicaSet>> = olds
                .iter()
                .filter(|r| {
                    Some(&r.spec).and_then(|s| s.replicas) == Some(0)
                        && r.status.as_ref().is_none_or(|s| s.replicas == 0)
                })
                .collect();
            if idle.len() > limit {
                for r in idle.iter().take(idle.len() - limit) {
                    let _ = rs_api
                        .delete(&r.name_any(), &DeleteParams::background())
                        .await;
                }
            }
            // The Deployment's own revision annotation.
            let rev = revision(&new_rs).to_string();
            if d.annotations().get(REVISION) != Some(&rev) {
                let api: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
                let p = json!({"metadata": {"annotations": {REVISION: rev}}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&p))
                    .await?;
            }
        }
        self.deployment_status(
            d,
            &owned,
            Some(&new_rs),
            &olds,
            surge,
            unavailable,
            available_of,
            created_new.is_some(),
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn deployment_status(
        &self,
        d: &Deployment,
        owned: &[Arc<ReplicaSet>],
        new_rs: Option<&Arc<ReplicaSet>>,
        olds: &[Arc<ReplicaSet>],
        _surge: i32,
        max_unavailable: i32,
        _available_of: impl Fn(&ReplicaSet) -> i32,
        created_new: bool,
    ) -> kube::Result<Action> {
        let spec = Some(&d.spec);
        let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
        let paused = spec.and_then(|s| s.paused) == Some(true);
        let st = |r: &ReplicaSet| r.status.clone().unwrap_or_default();
        let total: i32 = owned.iter().map(|r| st(r).replicas).sum();
        let spec_total: i32 = owned
            .iter()
            .map(|r| Some(&r.spec).and_then(|s| s.replicas).unwrap_or(0))
            .sum();
        let updated = new_rs.map(|r| st(r).replicas).unwrap_or(0);
        let ready: i32 = owned
            .iter()
            .map(|r| st(r).ready_replicas.unwrap_or(0))
            .sum();
        let available: i32 = owned
            .iter()
            .map(|r| st(r).available_replicas.unwrap_or(0))
            .sum();
        let terminating: i32 = owned
            .iter()
            .map(|r| st(r).terminating_replicas.unwrap_or(0))
            .sum();
        let old_pods: i32 = olds.iter().map(|r| st(r).replicas).sum();
        let now = Time(jiff::Timestamp::now());
        let cur = d.status.clone().unwrap_or_default();
        let curv = serde_json::to_value(&cur).unwrap_or(Value::Null);
        let cur_conds: Vec<Value> = curv
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let now = serde_json::to_value(&now).unwrap_or(Value::Null);
        let cond = |type_: &str, status: &str, reason: &str, message: String| -> Value {
            let prev = cur_conds.iter().find(|c| c["type"] == type_);
            let same_status = prev.is_some_and(|p| p["status"] == status);
            let same = prev.is_some_and(|p| {
                p["status"] == status && p["reason"] == reason && p["message"] == message.as_str()
            });
            json!({
                "type": type_,
                "status": status,
                "lastUpdateTime": if same { prev.map(|p| p["lastUpdateTime"].clone()).unwrap_or(Value::Null) } else { now.clone() },
                "lastTransitionTime": if same_status { prev.map(|p| p["lastTransitionTime"].clone()).unwrap_or(Value::Null) } else { now.clone() },
                "reason": reason,
                "message": message,
            })
        };
        let available_cond = if available >= replicas - max_unavailable {
            cond(
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
            )
        } else {
            cond(
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
            )
        };
        let progressing = match new_rs {
            Some(n)
                if updated == replicas
                    && available >= replicas
                    && old_pods == 0
                    && total == replicas =>
            {
                cond(
                    "Progressing",
                    "True",
                    "NewReplicaSetAvailable",
                    format!(
                        "ReplicaSet \"{}\" has successfully progressed.",
                        n.name_any()
                    ),
                )
            }
            Some(n) if created_new => cond(
                "Progressing",
                "True",
                "NewReplicaSetCreated",
                format!("Created new replica set \"{}\"", n.name_any()),
            ),
            Some(n) => {
                // Progress (any count moved) refreshes the condition; none for
                // progressDeadlineSeconds means the rollout timed out, as upstream.
                let prev = cur_conds.iter().find(|c| c["type"] == "Progressing");
                let progressed = cur.updated_replicas != Some(updated)
                    || cur.ready_replicas != Some(ready)
                    || cur.available_replicas != Some(available)
                    || cur.replicas != Some(total);
                let deadline = spec
                    .and_then(|s| s.progress_deadline_seconds)
                    .unwrap_or(600);
                let last = prev
                    .and_then(|p| p["lastUpdateTime"].as_str())
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok());
                let timed_out = !progressed
                    && !paused
                    && (prev.is_some_and(|p| p["reason"] == "ProgressDeadlineExceeded")
                        || last.is_some_and(|t| {
                            t.as_second() + i64::from(deadline) < jiff::Timestamp::now().as_second()
                        }));
                if timed_out {
                    cond(
                        "Progressing",
                        "False",
                        "ProgressDeadlineExceeded",
                        format!("ReplicaSet \"{}\" has timed out progressing.", n.name_any()),
                    )
                } else {
                    let mut c = cond(
                        "Progressing",
                        "True",
                        "ReplicaSetUpdated",
                        format!("ReplicaSet \"{}\" is progressing.", n.name_any()),
                    );
                    if progressed {
                        c["lastUpdateTime"] = now.clone();
                    }
                    c
                }
            }
            None => cond(
                "Progressing",
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused".into(),
            ),
        };
        let mut conds: Vec<Value> = cur_conds
            .iter()
            .filter(|c| c["type"] != "Available" && c["type"] != "Progressing")
            .cloned()
            .collect();
        conds.push(available_cond);
        conds.push(progressing);
        let want = json!({
            "observedGeneration": d.metadata.generation,
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            "unavailableReplicas": (spec_total.max(replicas) - available).max(0),
            "terminatingReplicas": terminating,
            "conditions": conds,
        });
        let differs = want.as_object().is_some_and(|m| {
            m.iter().any(|(k, v)| {
                let c = curv.get(k).cloned().unwrap_or(json!(0));
                if k == "conditions" {
                    strip_times(&c) != strip_times(v)
                } else {
                    &c != v
                }
            })
        });
        if differs {
            let api: Api<Deployment> =
                Api::namespaced(self.client.clone(), &d.namespace().unwrap_or_default());
            api.patch_status(
                &d.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": want})),
            )
            .await?;
        }
        // A rollout in progress is looked at again when its progress deadline passes (upstream
        // requeues stuck deployments after progressDeadlineSeconds).
        let complete =
            updated == replicas && available >= replicas && old_pods == 0 && total == replicas;
        if complete || paused || new_rs.is_none() {
            return Ok(Action::Done);
        }
        let deadline = spec
            .and_then(|s| s.progress_deadline_seconds)
            .unwrap_or(600);
        Ok(Action::RequeueAfter(Duration::from_secs(
            u64::try_from(deadline.max(0)).unwrap_or(600) + 1,
        )))
    }
}

fn strip_times(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(a) = v.as_array_mut() {
        for c in a.iter_mut() {
            if let Some(m) = c.as_object_mut() {
                m.remove("lastUpdateTime");
                m.remove("lastTransitionTime");
            }
        }
    }
    v
}
