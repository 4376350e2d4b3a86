//! The ReplicaSet and Deployment controllers: informers on Deployments, ReplicaSets and Pods;
//! every change runs one reconcile round over all of them. Writes are remembered
//! ("expectations", as upstream) so that a lagging cache never causes duplicate pods or a second
//! scale-down.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};

use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::workload_core::{self as core, PodView, RsDiff, RsState};

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
pub const HASH_LABEL: &str = "pod-template-hash";
const EXPECT_TIMEOUT: Duration = Duration::from_secs(10);

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
    pods: Store<Pod>,
    expect: HashMap<String, Expect>,
}

pub async fn run(client: kube::Client, stop: CancellationToken) {
    let notify = Arc::new(Notify::new());
    let mut w = Workloads {
        deployments: super::informer(&client, notify.clone(), stop.clone()),
        replica_sets: super::informer(&client, notify.clone(), stop.clone()),
        pods: super::informer(&client, notify.clone(), stop.clone()),
        client,
        expect: HashMap::new(),
    };
    for ready in [
        w.deployments.wait_until_ready().boxed(),
        w.replica_sets.wait_until_ready().boxed(),
        w.pods.wait_until_ready().boxed(),
    ] {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ready => {}
        }
    }
    loop {
        w.round().await;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = notify.notified() => tokio::time::sleep(Duration::from_millis(20)).await,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
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

fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// When the pod's Ready condition became true, if it is.
fn ready_since(p: &Pod) -> Option<i64> {
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

fn is_available(p: &Pod, min_ready: i32) -> bool {
    match ready_since(p) {
        Some(t) => min_ready <= 0 || t + i64::from(min_ready) <= now_secs(),
        None => false,
    }
}

fn pod_view(p: &Pod) -> PodView {
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

fn selector_matches(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    match ferry_api::selectors::from_label_selector(sel) {
        Ok(s) => !s.is_empty() && s.matches(labels),
        Err(_) => false,
    }
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

impl Workloads {
    fn expectations_met(&mut self, uid: &str, ns: &str) -> bool {
        let Some(e) = self.expect.get(uid) else {
            return true;
        };
        if e.since.is_some_and(|s| s.elapsed() > EXPECT_TIMEOUT) {
            self.expect.remove(uid);
            return true;
        }
        let pods = &self.pods;
        let rss = &self.replica_sets;
        let pod_in_cache = |name: &str| pods.get(&reflector::ObjectRef::new(name).within(ns));
        let created = e.created.iter().all(|n| pod_in_cache(n).is_some());
        let deleted = e
            .deleted
            .iter()
            .all(|n| pod_in_cache(n).is_none_or(|p| p.metadata.deletion_timestamp.is_some()));
        let versions = e.rs_versions.iter().all(|(n, v)| {
            rss.get(&reflector::ObjectRef::new(n).within(ns))
                .is_some_and(|r| rv(&r.metadata) >= *v)
        });
        if created && deleted && versions {
            self.expect.remove(uid);
            true
        } else {
            false
        }
    }

    async fn round(&mut self) {
        let pods = self.pods.state();
        let mut by_owner: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
        let mut orphans: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
        for p in &pods {
            match controller_uid(&p.metadata) {
                Some(u) => by_owner.entry(u.to_string()).or_default().push(p.clone()),
                None => orphans
                    .entry(p.namespace().unwrap_or_default())
                    .or_default()
                    .push(p.clone()),
            }
        }
        for rs in self.replica_sets.state() {
            if let Err(e) = self.sync_replica_set(&rs, &by_owner, &orphans).await {
                tracing::debug!("replicaset {}: {e}", rs.name_any());
            }
        }
        let rss = self.replica_sets.state();
        let mut rs_by_owner: HashMap<String, Vec<Arc<ReplicaSet>>> = HashMap::new();
        for rs in &rss {
            if let Some(u) = controller_uid(&rs.metadata) {
                rs_by_owner
                    .entry(u.to_string())
                    .or_default()
                    .push(rs.clone());
            }
        }
        for d in self.deployments.state() {
            if let Err(e) = self.sync_deployment(&d, &rs_by_owner, &by_owner).await {
                tracing::debug!("deployment {}: {e}", d.name_any());
            }
        }
    }

    async fn sync_replica_set(
        &mut self,
        rs: &ReplicaSet,
        by_owner: &HashMap<String, Vec<Arc<Pod>>>,
        orphans: &HashMap<String, Vec<Arc<Pod>>>,
    ) -> kube::Result<()> {
        let uid = rs.uid().unwrap_or_default();
        let ns = rs.namespace().unwrap_or_default();
        let name = rs.name_any();
        let Some(spec) = Some(&rs.spec) else {
            return Ok(());
        };
        let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let deleting = rs.metadata.deletion_timestamp.is_some();
        let owned: Vec<Arc<Pod>> = by_owner.get(&uid).cloned().unwrap_or_default();
        let active: Vec<&Arc<Pod>> = owned
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && !is_terminal(p))
            .collect();
        // Some(None): creations succeeded or were not needed; Some(Some(e)): a creation failed.
        let mut failure: Option<Option<String>> = None;
        if !deleting && self.expectations_met(&uid, &ns) {
            // Adopt matching orphans.
            let mut adopted = 0;
            for p in orphans.get(&ns).map(Vec::as_slice).unwrap_or(&[]) {
                if p.metadata.deletion_timestamp.is_some()
                    || is_terminal(p)
                    || !selector_matches(&spec.selector, p.labels())
                {
                    continue;
                }
                let mut refs = p.metadata.owner_references.clone().unwrap_or_default();
                refs.push(controller_ref(rs));
                let patch = json!({"metadata": {"ownerReferences": refs,
                    "resourceVersion": p.metadata.resource_version}});
                if pods_api
                    .patch(
                        &p.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .is_ok()
                {
                    adopted += 1;
                }
            }
            if adopted > 0 {
                return Ok(());
            }
            let views: Vec<PodView> = active.iter().map(|p| pod_view(p)).collect();
            match core::replica_set_diff(spec.replicas.unwrap_or(1), &views) {
                RsDiff::None => failure = Some(None),
                RsDiff::Create(n) => {
                    let mut e = Expect {
                        since: Some(Instant::now()),
                        ..Default::default()
                    };
                    let template = spec.template.clone().unwrap_or_default();
                    for _ in 0..n {
                        let tm = template.metadata.clone().unwrap_or_default();
                        let pod = Pod {
                            metadata: ObjectMeta {
                                generate_name: Some(format!("{name}-")),
                                namespace: Some(ns.clone()),
                                labels: tm.labels.clone(),
                                annotations: tm.annotations.clone(),
                                finalizers: tm.finalizers.clone(),
                                owner_references: Some(vec![controller_ref(rs)]),
                                ..Default::default()
                            },
                            spec: template.spec.clone(),
                            status: None,
                        };
                        match pods_api.create(&PostParams::default(), &pod).await {
                            Ok(p) => {
                                super::events::record(
                                    &self.client,
                                    super::events::reference(rs),
                                    "Normal",
                                    "SuccessfulCreate",
                                    format!("Created pod: {}", p.name_any()),
                                    "replicaset-controller",
                                );
                                e.created.insert(p.name_any());
                            }
                            Err(err) => {
                                tracing::info!("replicaset {ns}/{name}: create pod: {err}");
                                failure = Some(Some(match &err {
                                    kube::Error::Api(s) => s.message.clone(),
                                    e => e.to_string(),
                                }));
                                break;
                            }
                        }
                    }
                    if failure.is_none() {
                        failure = Some(None);
                    }
                    self.expect.insert(uid.clone(), e);
                }
                RsDiff::Delete(names) => {
                    let mut e = Expect {
                        since: Some(Instant::now()),
                        ..Default::default()
                    };
                    for n in names {
                        if pods_api.delete(&n, &DeleteParams::default()).await.is_ok() {
                            super::events::record(
                                &self.client,
                                super::events::reference(rs),
                                "Normal",
                                "SuccessfulDelete",
                                format!("Deleted pod: {n}"),
                                "replicaset-controller",
                            );
                            e.deleted.insert(n);
                        }
                    }
                    self.expect.insert(uid.clone(), e);
                }
            }
        }
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
            let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": want})),
            )
            .await?;
        }
        Ok(())
    }

    async fn sync_deployment(
        &mut self,
        d: &Deployment,
        rs_by_owner: &HashMap<String, Vec<Arc<ReplicaSet>>>,
        pods_by_owner: &HashMap<String, Vec<Arc<Pod>>>,
    ) -> kube::Result<()> {
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let uid = d.uid().unwrap_or_default();
        let ns = d.namespace().unwrap_or_default();
        let name = d.name_any();
        let Some(spec) = Some(&d.spec) else {
            return Ok(());
        };
        if !self.expectations_met(&uid, &ns) {
            return Ok(());
        }
        let rs_api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let replicas = spec.replicas.unwrap_or(1);
        let mut owned: Vec<Arc<ReplicaSet>> = rs_by_owner
            .get(&uid)
            .cloned()
            .unwrap_or_default()
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
            let n = pods_by_owner
                .get(&r.uid().unwrap_or_default())
                .map(|ps| {
                    ps.iter()
                        .filter(|p| {
                            p.metadata.deletion_timestamp.is_none()
                                && !is_terminal(p)
                                && is_available(p, min_ready)
                        })
                        .count()
                })
                .unwrap_or(0);
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
                        self.expect.insert(uid.clone(), expect);
                        return Ok(());
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
                        return Ok(());
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
                        pods_by_owner
                            .get(&r.uid().unwrap_or_default())
                            .map(|ps| ps.iter().filter(|p| !is_terminal(p)).count())
                            .unwrap_or(0)
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
            for (rs_name, n, cur) in &writes {
                super::events::record(
                    &self.client,
                    super::events::reference(d),
                    "Normal",
                    "ScalingReplicaSet",
                    format!(
                        "Scaled {} replica set {rs_name} from {cur} to {n}",
                        if n > cur { "up" } else { "down" }
                    ),
                    "deployment-controller",
                );
                let mut ann = json!({DESIRED: replicas.to_string(), MAX_REPLICAS: (replicas + surge).to_string()});
                if *rs_name != new_rs.name_any() {
                    ann = json!({});
                }
                let p = json!({"metadata": {"annotations": ann}, "spec": {"replicas": n}});
                let r = rs_api
                    .patch(rs_name, &PatchParams::default(), &Patch::Merge(&p))
                    .await?;
                expect.rs_versions.insert(r.name_any(), rv(&r.metadata));
            }
            if !writes.is_empty() {
                self.expect.insert(uid.clone(), expect);
                return Ok(());
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
    ) -> kube::Result<()> {
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
        Ok(())
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
