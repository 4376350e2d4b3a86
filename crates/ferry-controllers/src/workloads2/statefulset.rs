//! The StatefulSet controller (`pkg/controller/statefulset`): a pure planner [`plan`] from a
//! StatefulSet, its pods and its ControllerRevisions to writes, and the thin reconciler.
//!
//! Stable identities `<set>-<ordinal>` with `hostname`/`subdomain` (so cluster DNS serves
//! `<set>-<n>.<serviceName>.<ns>.svc`), OrderedReady (one pod at a time, in order, each Running
//! and Ready before the next; scale down from the highest ordinal) and Parallel management,
//! RollingUpdate with `partition` (highest ordinal first, one at a time) and OnDelete,
//! ControllerRevisions (what `kubectl rollout history/undo` read), and the status counters.
//! `volumeClaimTemplates`: each pod refers to its claim `<claim>-<set>-<n>`, created before the
//! pod ([`claims_for`]: the template's labels and the set's selector labels), owned per
//! `persistentVolumeClaimRetentionPolicy` (whenDeleted `Delete`: by the set; whenScaled
//! `Delete`: by the pod being scaled away), as upstream.

use crate::runtime::SlimPod;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::common::{
    self, Done, Expectations, Res, Write, controlled_by, is_available, is_deleting, is_ready,
    is_terminal, now_secs, revision_data, revision_hash,
};
use crate::runtime::{self, Action, ObjectKey, Reconciler, WorkQueue};

pub const REVISION_LABEL: &str = "controller-revision-hash";
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";

#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub writes: Vec<Write>,
    pub requeue_after: Option<i64>,
}

/// `web-3` → 3 for the set `web`.
pub fn ordinal_of(set: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(set)?.strip_prefix('-')?.parse().ok()
}

fn template_value(sts: &StatefulSet) -> Value {
    serde_json::to_value(&sts.spec.template).unwrap_or(json!({}))
}

fn revision_of(p: &SlimPod) -> String {
    p.labels().get(REVISION_LABEL).cloned().unwrap_or_default()
}

fn running_and_ready(p: &SlimPod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && is_ready(p)
}

/// The pod for `ordinal` from a template (as stored in a revision's data).
pub fn new_pod(sts: &StatefulSet, ordinal: i32, template: &Value, revision: &str) -> Value {
    let set = sts.name_any();
    let name = format!("{set}-{ordinal}");
    let mut meta = template.get("metadata").cloned().unwrap_or(json!({}));
    let mut spec = template.get("spec").cloned().unwrap_or(json!({}));
    if !meta.is_object() {
        meta = json!({});
    }
    meta["name"] = json!(name);
    meta["namespace"] = json!(sts.namespace());
    meta["ownerReferences"] = json!([common::controller_ref(
        "apps/v1",
        "StatefulSet",
        &sts.metadata
    )]);
    meta["labels"][REVISION_LABEL] = json!(revision);
    meta["labels"][POD_NAME_LABEL] = json!(name);
    meta["labels"][POD_INDEX_LABEL] = json!(ordinal.to_string());
    spec["hostname"] = json!(name);
    if let Some(svc) = sts.spec.service_name.as_deref().filter(|s| !s.is_empty()) {
        spec["subdomain"] = json!(svc);
    }
    // One claim per volumeClaimTemplate, replacing a template volume of the same name.
    let claims: Vec<String> = sts
        .spec
        .volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    if !claims.is_empty() {
        let mut vols: Vec<Value> = spec
            .get("volumes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        vols.retain(|v| !claims.iter().any(|c| v["name"] == json!(c)));
        for c in &claims {
            vols.push(json!({"name": c, "persistentVolumeClaim": {"claimName": format!("{c}-{set}-{ordinal}")}}));
        }
        spec["volumes"] = json!(vols);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

/// The claims of the pod `ordinal` (upstream `getPersistentVolumeClaims` with the retention
/// policy's owner reference on the set).
pub fn claims_for(sts: &StatefulSet, ordinal: i32) -> Vec<Value> {
    let set = sts.name_any();
    let selector_labels = sts.spec.selector.match_labels.clone().unwrap_or_default();
    let delete_with_set = sts
        .spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .and_then(|p| p.when_deleted.as_deref())
        == Some("Delete");
    sts.spec
        .volume_claim_templates
        .iter()
        .flatten()
        .map(|t| {
            let template_name = t.metadata.name.clone().unwrap_or_default();
            let mut labels = t.metadata.labels.clone().unwrap_or_default();
            labels.extend(selector_labels.clone());
            let mut meta = json!({
                "name": format!("{template_name}-{set}-{ordinal}"),
                "namespace": sts.namespace(),
                "labels": labels,
            });
            if let Some(a) = t.metadata.annotations.as_ref().filter(|a| !a.is_empty()) {
                meta["annotations"] = json!(a);
            }
            if delete_with_set {
                let mut r = common::controller_ref("apps/v1", "StatefulSet", &sts.metadata);
                r.controller = None;
                r.block_owner_deletion = None;
                meta["ownerReferences"] = json!([r]);
            }
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
                "spec": t.spec.clone().unwrap_or_default()})
        })
        .collect()
}

/// Whether claims of pods scaled away go with their pod (whenScaled `Delete`).
fn delete_when_scaled(sts: &StatefulSet) -> bool {
    sts.spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .and_then(|p| p.when_scaled.as_deref())
        == Some("Delete")
}

fn new_revision(sts: &StatefulSet, name: &str, hash: &str, data: &Value, number: i64) -> Value {
    let mut labels: BTreeMap<String, String> = sts
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(HASH_LABEL.to_string(), hash.to_string());
    json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": name, "namespace": sts.namespace(), "labels": labels,
            "ownerReferences": [common::controller_ref("apps/v1", "StatefulSet", &sts.metadata)]},
        "data": data, "revision": number})
}

/// Plans one sync of `sts` with the pods and revisions it controls, at `now` (seconds).
pub fn plan(
    sts: &StatefulSet,
    pods: &[&SlimPod],
    revisions: &[&ControllerRevision],
    now: i64,
) -> Plan {
    let mut out = Plan::default();
    let ns = sts.namespace().unwrap_or_default();
    let set = sts.name_any();
    let spec = &sts.spec;
    let st = sts.status.clone().unwrap_or_default();
    if is_deleting(&sts.metadata) {
        return out;
    }

    // Revisions: the update revision is the one whose data is the current template.
    let data = revision_data(&template_value(sts));
    let collision = st.collision_count.unwrap_or(0);
    let max_rev = revisions
        .iter()
        .filter_map(|r| r.revision)
        .max()
        .unwrap_or(0);
    let (update_name, update_number) = match revisions.iter().find(|r| r.data.0 == data) {
        Some(r) => (r.name_any(), r.revision.unwrap_or(0)),
        None => {
            let hash = revision_hash(&data, collision);
            let name = format!("{set}-{hash}");
            out.writes.push(Write::create(
                Res::ControllerRevisions,
                &ns,
                new_revision(sts, &name, &hash, &data, max_rev + 1),
            ));
            (name, max_rev + 1)
        }
    };
    let _ = update_number;
    let current_name = st
        .current_revision
        .clone()
        .filter(|c| revisions.iter().any(|r| r.name_any() == *c))
        .unwrap_or_else(|| update_name.clone());
    let current_template = revisions
        .iter()
        .find(|r| r.name_any() == current_name)
        .and_then(|r| r.data.0.pointer("/spec/template").cloned())
        .map(|mut t| {
            if let Value::Object(m) = &mut t {
                m.remove("$patch");
            }
            t
        })
        .unwrap_or_else(|| template_value(sts));
    let update_template = template_value(sts);

    let replicas = spec.replicas.unwrap_or(1).max(0);
    let start = spec
        .ordinals
        .as_ref()
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0);
    let end = start + replicas;
    let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
    let us = spec.update_strategy.clone().unwrap_or_default();
    let rolling = us.type_.as_deref().unwrap_or("RollingUpdate") == "RollingUpdate";
    let partition = us
        .rolling_update
        .as_ref()
        .and_then(|r| r.partition)
        .unwrap_or(0);
    let min_ready = spec.min_ready_seconds.unwrap_or(0);

    let mut by_ordinal: BTreeMap<i32, &SlimPod> = BTreeMap::new();
    for p in pods {
        if let Some(o) = ordinal_of(&set, &p.name_any()) {
            by_ordinal.insert(o, p);
        }
    }
    let pod_writes_start = out.writes.len();
    // Replicas in range: create, replace failed ones, respect ordering.
    let mut blocked = false;
    for o in start..end {
        match by_ordinal.get(&o) {
            None => {
                if blocked {
                    break;
                }
                let use_current = rolling && o < start + partition;
                let (t, rev) = if use_current {
                    (&current_template, &current_name)
                } else {
                    (&update_template, &update_name)
                };
                out.writes
                    .push(Write::create(Res::Pods, &ns, new_pod(sts, o, t, rev)));
                if !parallel {
                    blocked = true;
                }
            }
            Some(p) => {
                if is_terminal(p) && !is_deleting(&p.metadata) {
                    out.writes.push(Write::delete(
                        Res::Pods,
                        &ns,
                        &p.name_any(),
                        p.uid().as_deref(),
                    ));
                    if !parallel {
                        blocked = true;
                    }
                } else if !parallel && (is_deleting(&p.metadata) || !running_and_ready(p)) {
                    blocked = true;
                }
            }
        }
        if blocked && !parallel {
            break;
        }
    }
    // Condemned pods (ordinals out of range): highest first; OrderedReady one at a time and only
    // when every other pod is healthy.
    let condemned: Vec<&&SlimPod> = by_ordinal
        .iter()
        .rev()
        .filter(|(o, _)| **o < start || **o >= end)
        .map(|(_, p)| p)
        .collect();
    let all_healthy = by_ordinal
        .iter()
        .filter(|(o, _)| **o >= start && **o < end)
        .all(|(_, p)| running_and_ready(p) && !is_deleting(&p.metadata))
        && (start..end).all(|o| by_ordinal.contains_key(&o));
    let mut scaled_down = false;
    for p in condemned {
        if is_deleting(&p.metadata) {
            if !parallel {
                scaled_down = true;
                break;
            }
            continue;
        }
        if !parallel && (!all_healthy || blocked) {
            break;
        }
        out.writes.push(Write::delete(
            Res::Pods,
            &ns,
            &p.name_any(),
            p.uid().as_deref(),
        ));
        scaled_down = true;
        if !parallel {
            break;
        }
    }
    // Rolling update: highest ordinal ≥ partition first, one at a time, when all are healthy.
    let pod_writes = out.writes.len() - pod_writes_start;
    if rolling && pod_writes == 0 && !scaled_down && all_healthy {
        let unavailable = by_ordinal.values().any(|p| is_deleting(&p.metadata));
        if !unavailable {
            for o in (start + partition..end).rev() {
                if let Some(p) = by_ordinal.get(&o)
                    && revision_of(p) != update_name
                {
                    out.writes.push(Write::delete(
                        Res::Pods,
                        &ns,
                        &p.name_any(),
                        p.uid().as_deref(),
                    ));
                    break;
                }
            }
        }
    }

    // History: keep revisionHistoryLimit revisions besides the live ones.
    let live: HashSet<String> = pods
        .iter()
        .map(|p| revision_of(p))
        .chain([current_name.clone(), update_name.clone()])
        .collect();
    let mut old: Vec<&&ControllerRevision> = revisions
        .iter()
        .filter(|r| !live.contains(&r.name_any()))
        .collect();
    old.sort_by_key(|r| r.revision.unwrap_or(0));
    let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
    for r in old.iter().take(old.len().saturating_sub(limit)) {
        out.writes.push(Write::delete(
            Res::ControllerRevisions,
            &ns,
            &r.name_any(),
            r.uid().as_deref(),
        ));
    }

    // Status.
    let counted: Vec<&&SlimPod> = pods.iter().filter(|p| !is_terminal(p)).collect();
    let status_replicas = counted.len() as i32;
    let ready = counted.iter().filter(|p| is_ready(p)).count() as i32;
    let available = counted
        .iter()
        .filter(|p| is_available(p, min_ready, now))
        .count() as i32;
    let mut current_replicas = counted
        .iter()
        .filter(|p| revision_of(p) == current_name)
        .count() as i32;
    let updated = counted
        .iter()
        .filter(|p| revision_of(p) == update_name)
        .count() as i32;
    let mut current = current_name.clone();
    if updated == replicas && ready == replicas && status_replicas == replicas {
        current = update_name.clone();
        current_replicas = updated;
    }
    if min_ready > 0 && ready > available {
        out.requeue_after = Some(i64::from(min_ready));
    }
    let status = json!({
        "observedGeneration": sts.metadata.generation,
        "replicas": status_replicas,
        "readyReplicas": ready,
        "availableReplicas": available,
        "currentReplicas": current_replicas,
        "updatedReplicas": updated,
        "currentRevision": current,
        "updateRevision": update_name,
        "collisionCount": collision,
    });
    let before = serde_json::to_value(&st).unwrap_or(json!({}));
    let changed = status.as_object().into_iter().flatten().any(|(k, v)| {
        let b = before.get(k).cloned().unwrap_or(Value::Null);
        b != *v && !(b.is_null() && v == &json!(0))
    });
    if changed {
        out.writes
            .push(Write::status(Res::StatefulSets, &ns, &set, status));
    }
    out
}

/// Whether `pod` is a member of the set by name (`<set>-<ordinal>`, upstream's `isMemberOf`).
fn is_member(set: &str, pod: &str) -> bool {
    pod.strip_prefix(set)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()))
}

/// Upstream's `getPodsForStatefulSet`: the set claims the namespace's pods its selector
/// matches and whose name makes them members (`<set>-<ordinal>`); it releases the others.
pub fn claim(sts: &StatefulSet, candidates: &[&SlimPod]) -> common::ClaimPlan<SlimPod> {
    let owner = common::Claimer {
        api_version: "apps/v1",
        kind: "StatefulSet",
        meta: &sts.metadata,
        finalizer: None,
    };
    let set = sts.name_any();
    common::plan_claim(&owner, Res::Pods, candidates, |p: &SlimPod| {
        common::selects(&sts.spec.selector, p.labels()) && is_member(&set, &p.name_any())
    })
}

// ---- the reconciler ----

pub struct StatefulSetController {
    client: kube::Client,
    sets: Store<StatefulSet>,
    pods: Store<SlimPod>,
    revisions: Store<ControllerRevision>,
    expect: Expectations,
}

impl Reconciler for StatefulSetController {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "statefulset-controller"
    }
    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, kube::Error> {
        let Some(sts) = key.get(&self.sets) else {
            return Ok(Action::Done);
        };
        let uid = sts.uid().unwrap_or_default();
        let all = self.pods.state();
        let candidates: Vec<&SlimPod> = all
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| p.namespace() == sts.namespace())
            .collect();
        let claimed = claim(&sts, &candidates);
        if !common::exec_claim(
            &self.client,
            Res::StatefulSets,
            &sts.metadata,
            claimed.writes,
        )
        .await?
        {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let pods: Vec<&SlimPod> = claimed.owned.iter().collect();
        let revs = self.revisions.state();
        let revisions: Vec<&ControllerRevision> = revs
            .iter()
            .map(|r| r.as_ref())
            .filter(|r| r.namespace() == sts.namespace() && controlled_by(&r.metadata, &uid))
            .collect();
        let present: HashSet<String> = pods
            .iter()
            .map(|p| p.name_any())
            .chain(revisions.iter().map(|r| r.name_any()))
            .collect();
        if !self.expect.satisfied(&uid, &present) {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let plan = plan(&sts, &pods, &revisions, now_secs());
        self.claims_before_writes(&sts, &pods, &plan.writes).await?;
        // Revisions first (pods refer to them), then the rest.
        let (revs_w, rest): (Vec<Write>, Vec<Write>) = plan.writes.into_iter().partition(|w| {
            w.res == Res::ControllerRevisions && matches!(w.op, common::Op::Create(_))
        });
        let done: Vec<Done> = common::exec_in_order(&self.client, revs_w, rest).await?;
        self.expect.record(&uid, &done, 0);
        Ok(common::requeue(plan.requeue_after))
    }
}

impl StatefulSetController {
    /// Each pod to create gets its claims first (an existing claim is kept); each pod scaled
    /// away under whenScaled `Delete` first becomes an owner of its claims.
    async fn claims_before_writes(
        &self,
        sts: &StatefulSet,
        pods: &[&SlimPod],
        writes: &[Write],
    ) -> Result<(), kube::Error> {
        use k8s_openapi::api::core::v1::PersistentVolumeClaim;
        use kube::api::{Patch, PatchParams, PostParams};
        let ns = sts.namespace().unwrap_or_default();
        let set = sts.name_any();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let replicas = sts.spec.replicas.unwrap_or(1);
        for w in writes.iter().filter(|w| w.res == Res::Pods) {
            match &w.op {
                common::Op::Create(pod) => {
                    let name = pod["metadata"]["name"].as_str().unwrap_or("");
                    let Some(ordinal) = ordinal_of(&set, name) else {
                        continue;
                    };
                    for claim in claims_for(sts, ordinal) {
                        let Ok(c) = serde_json::from_value::<PersistentVolumeClaim>(claim) else {
                            continue;
                        };
                        match api.create(&PostParams::default(), &c).await {
                            Ok(_) => {}
                            Err(kube::Error::Api(s)) if s.code == 409 => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                common::Op::Delete { name, .. } if delete_when_scaled(sts) => {
                    let Some(ordinal) = ordinal_of(&set, name).filter(|o| *o >= replicas) else {
                        continue;
                    };
                    let Some(pod) = pods.iter().find(|p| p.name_any() == *name) else {
                        continue;
                    };
                    for claim in claims_for(sts, ordinal) {
                        let mut refs: Vec<Value> = claim["metadata"]["ownerReferences"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default();
                        refs.push(json!({"apiVersion": "v1", "kind": "Pod", "name": name,
                            "uid": pod.metadata.uid}));
                        let cname = claim["metadata"]["name"].as_str().unwrap_or("");
                        match api
                            .patch(
                                cname,
                                &PatchParams::default(),
                                &Patch::Merge(json!({"metadata": {"ownerReferences": refs}})),
                            )
                            .await
                        {
                            Ok(_) => {}
                            Err(kube::Error::Api(s)) if s.code == 404 => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

pub async fn run(client: kube::Client, informers: runtime::Informers, stop: CancellationToken) {
    let queue: Arc<WorkQueue<ObjectKey>> = Arc::default();
    let q = queue.clone();
    let sets = runtime::reflect(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                q.add(ObjectKey::of(o));
            }
        },
    );
    let pods = common::reflect_pods_for(&informers, &queue, sets.clone(), |s: &StatefulSet, l| {
        common::selects(&s.spec.selector, l)
    });
    let revisions = common::reflect_revisions_for::<StatefulSet>(&client, &queue, stop.clone());
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = async {
            let _ = sets.wait_until_ready().await;
            informers.pods().wait_synced(&stop).await;
            let _ = revisions.wait_until_ready().await;
        } => {}
    }
    let ctl = Arc::new(StatefulSetController {
        client,
        sets,
        pods,
        revisions,
        expect: Expectations::default(),
    });
    runtime::worker::run(ctl, queue, 4, stop).await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn sts(extra: Value) -> StatefulSet {
        let mut spec = json!({"replicas": 3, "serviceName": "nginx", "podManagementPolicy": "OrderedReady",
            "selector": {"matchLabels": {"app": "web"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(
            json!({"metadata": {"name": "web", "namespace": "d", "uid": "su", "generation": 1},
            "spec": spec}),
        )
        .unwrap()
    }

    fn rev_of(s: &StatefulSet, number: i64) -> ControllerRevision {
        let data = revision_data(&template_value(s));
        let hash = revision_hash(&data, 0);
        serde_json::from_value(new_revision(
            s,
            &format!("web-{hash}"),
            &hash,
            &data,
            number,
        ))
        .unwrap()
    }

    fn pod(o: i32, rev: &str, ready: bool) -> SlimPod {
        serde_json::from_value(json!({"metadata": {"name": format!("web-{o}"), "namespace": "d", "uid": format!("p{o}"),
            "labels": {"app": "web", REVISION_LABEL: rev},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "su", "controller": true}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                "lastTransitionTime": common::rfc3339(NOW - 100)}]}})).unwrap()
    }

    fn summary(p: &Plan) -> Vec<String> {
        p.writes
            .iter()
            .map(|w| match &w.op {
                common::Op::Create(v) => format!(
                    "create {:?} {}",
                    w.res,
                    v["metadata"]["name"].as_str().unwrap_or("")
                ),
                common::Op::Delete { name, .. } => format!("delete {:?} {name}", w.res),
                common::Op::Patch { .. } => format!("status {:?}", w.res),
            })
            .collect()
    }

    #[test]
    fn ordered_ready_creates_one_at_a_time() {
        let s = sts(json!({}));
        let r = rev_of(&s, 1);
        let rn = r.name_any();
        // Nothing yet: the revision and web-0 only.
        let p = plan(&s, &[], &[], NOW);
        let sm = summary(&p);
        assert!(sm[0].starts_with("create ControllerRevisions web-"));
        assert_eq!(sm[1], "create Pods web-0");
        assert_eq!(sm.len(), 3, "{sm:?}");
        let pod0 = match &p.writes[1].op {
            common::Op::Create(v) => v.clone(),
            _ => unreachable!(),
        };
        assert_eq!(pod0["spec"]["hostname"], json!("web-0"));
        assert_eq!(pod0["spec"]["subdomain"], json!("nginx"));
        assert_eq!(pod0["metadata"]["labels"][POD_INDEX_LABEL], json!("0"));
        assert_eq!(pod0["metadata"]["labels"][REVISION_LABEL], json!(rn));
        // web-0 not ready: wait.
        let p0 = pod(0, &rn, false);
        assert!(
            !summary(&plan(&s, &[&p0], &[&r], NOW))
                .iter()
                .any(|w| w.contains("create Pods"))
        );
        // web-0 ready: web-1.
        let p0 = pod(0, &rn, true);
        assert_eq!(
            summary(&plan(&s, &[&p0], &[&r], NOW))[0],
            "create Pods web-1"
        );
        // Parallel: both at once.
        let sp = sts(json!({"podManagementPolicy": "Parallel"}));
        let rp = rev_of(&sp, 1);
        let sm = summary(&plan(&sp, &[], &[&rp], NOW));
        assert_eq!(
            &sm[..3],
            &[
                "create Pods web-0",
                "create Pods web-1",
                "create Pods web-2"
            ]
        );
    }

    #[test]
    fn scale_down_highest_first_and_status() {
        let s = sts(json!({"replicas": 1}));
        let r = rev_of(&s, 1);
        let rn = r.name_any();
        let (a, b, c) = (pod(0, &rn, true), pod(1, &rn, true), pod(2, &rn, true));
        let p = plan(&s, &[&a, &b, &c], &[&r], NOW);
        let sm = summary(&p);
        assert_eq!(sm[0], "delete Pods web-2");
        assert!(!sm.iter().any(|w| w == "delete Pods web-1"));
        let st = match &p.writes.last().unwrap().op {
            common::Op::Patch { patch, .. } => patch["status"].clone(),
            _ => unreachable!(),
        };
        assert_eq!(st["replicas"], json!(3));
        assert_eq!(st["readyReplicas"], json!(3));
        assert_eq!(st["updateRevision"], json!(rn));
    }

    #[test]
    fn rolling_update_with_partition() {
        let old = sts(json!({}));
        let r1 = rev_of(&old, 1);
        let new = sts(
            json!({"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
        );
        let r2 = rev_of(&new, 2);
        let mut new = new;
        new.status = Some(
            serde_json::from_value(json!({"replicas": 3, "currentRevision": r1.name_any()}))
                .unwrap(),
        );
        let (a, b, c) = (
            pod(0, &r1.name_any(), true),
            pod(1, &r1.name_any(), true),
            pod(2, &r1.name_any(), true),
        );
        let sm = summary(&plan(&new, &[&a, &b, &c], &[&r1, &r2], NOW));
        assert_eq!(sm[0], "delete Pods web-2");
        // web-2 updated: web-1 next.
        let c2 = pod(2, &r2.name_any(), true);
        assert_eq!(
            summary(&plan(&new, &[&a, &b, &c2], &[&r1, &r2], NOW))[0],
            "delete Pods web-1"
        );
        // partition 2: web-1 and web-0 stay at the old revision.
        let mut part = new.clone();
        part.spec.update_strategy = Some(
            serde_json::from_value(
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}),
            )
            .unwrap(),
        );
        assert!(
            !summary(&plan(&part, &[&a, &b, &c2], &[&r1, &r2], NOW))
                .iter()
                .any(|w| w.starts_with("delete Pods"))
        );
        // A recreated pod below the partition gets the current revision's template.
        let p = plan(&part, &[&a, &c2], &[&r1, &r2], NOW);
        let created = p
            .writes
            .iter()
            .find_map(|w| match &w.op {
                common::Op::Create(v) => Some(v.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(created["metadata"]["name"], json!("web-1"));
        assert_eq!(created["spec"]["containers"][0]["image"], json!("nginx:1"));
        assert_eq!(
            created["metadata"]["labels"][REVISION_LABEL],
            json!(r1.name_any())
        );
        // OnDelete: nothing is deleted.
        let mut od = new.clone();
        od.spec.update_strategy =
            Some(serde_json::from_value(json!({"type": "OnDelete"})).unwrap());
        assert!(
            !summary(&plan(&od, &[&a, &b, &c], &[&r1, &r2], NOW))
                .iter()
                .any(|w| w.starts_with("delete Pods"))
        );
    }

    #[test]
    fn claims_and_history() {
        let s = sts(
            json!({"volumeClaimTemplates": [{"metadata": {"name": "www"}, "spec": {"accessModes": ["ReadWriteOnce"]}}],
            "revisionHistoryLimit": 1}),
        );
        let p = new_pod(&s, 2, &template_value(&s), "r");
        assert_eq!(
            p["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            json!("www-web-2")
        );
        let r = rev_of(&s, 5);
        let mk = |n: i64| -> ControllerRevision {
            serde_json::from_value(json!({"metadata": {"name": format!("web-old{n}"), "namespace": "d", "uid": format!("r{n}")},
                "data": {"spec": {}}, "revision": n})).unwrap()
        };
        let (o1, o2, o3) = (mk(1), mk(2), mk(3));
        let sm = summary(&plan(&s, &[], &[&r, &o1, &o2, &o3], NOW));
        assert!(sm.contains(&"delete ControllerRevisions web-old1".to_string()));
        assert!(sm.contains(&"delete ControllerRevisions web-old2".to_string()));
        assert!(!sm.contains(&"delete ControllerRevisions web-old3".to_string()));
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        // The claims of ordinal 2: template and selector labels; owned by the set only under
        // whenDeleted Delete.
        let c = claims_for(&s, 2);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0]["metadata"]["name"], "www-web-2");
        assert_eq!(
            c[0]["metadata"]["labels"],
            s.spec
                .selector
                .match_labels
                .clone()
                .map(|m| json!(m))
                .unwrap()
        );
        assert!(c[0]["metadata"].get("ownerReferences").is_none());
        assert_eq!(c[0]["spec"]["accessModes"], json!(["ReadWriteOnce"]));
        let mut d = s.clone();
        d.spec.persistent_volume_claim_retention_policy =
            serde_json::from_value(json!({"whenDeleted": "Delete", "whenScaled": "Retain"}))
                .unwrap();
        let c = claims_for(&d, 0);
        assert_eq!(
            c[0]["metadata"]["ownerReferences"][0]["kind"],
            "StatefulSet"
        );
        assert!(
            c[0]["metadata"]["ownerReferences"][0]
                .get("controller")
                .is_none()
        );
        assert!(!delete_when_scaled(&d));
        assert_eq!(ordinal_of("web", "webx-1"), None);
    }

    fn claim_pod(name: &str, labels: Value, owner: Option<&str>, deleting: bool) -> SlimPod {
        let mut p = json!({"metadata": {"name": name, "namespace": "d", "uid": format!("u-{name}"),
            "resourceVersion": "7", "labels": labels}});
        if let Some(o) = owner {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": "x", "uid": o, "controller": true}]);
        }
        if deleting {
            p["metadata"]["deletionTimestamp"] = json!("2027-01-01T00:00:00Z");
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn claims_adopt_orphan_members_and_release_non_matching() {
        let set = sts(json!({}));
        let app = json!({"app": "web"});
        let pods = [
            claim_pod("web-0", app.clone(), Some("su"), false), // ours, matching
            claim_pod("web-1", app.clone(), None, false),       // orphan member
            claim_pod("web-2", json!({"app": "other"}), Some("su"), false), // ours, relabelled
            claim_pod("web-3", app.clone(), Some("other-uid"), false), // someone else's
            claim_pod("web-4", app.clone(), None, true),        // orphan being deleted
            claim_pod("db-0", app.clone(), None, false),        // not a member by name
            claim_pod("web-x", app.clone(), None, false),       // no ordinal
            claim_pod("web-5", app.clone(), Some("su"), true),  // ours, deleting, matching
        ];
        let refs: Vec<&SlimPod> = pods.iter().collect();
        let names: Vec<&str> = [
            "web-0", "web-1", "web-2", "web-3", "web-4", "db-0", "web-x", "web-5",
        ]
        .into();
        let plan = claim(&set, &refs);
        assert_eq!(
            common::claim_outcomes(&plan, &names, "su"),
            [
                "web-0=owned",
                "web-1=adopt",
                "web-2=release",
                "web-3=-",
                "web-4=-",
                "db-0=-",
                "web-x=-",
                "web-5=owned"
            ]
        );
        // The adoption: our controller reference appended, with uid and resourceVersion
        // preconditions; the adopted pod is counted as owned.
        let adopt = plan
            .writes
            .iter()
            .find_map(|w| match &w.op {
                common::Op::Patch { name, patch, .. } if name == "web-1" => Some(patch.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(adopt["metadata"]["ownerReferences"][0]["uid"], json!("su"));
        assert_eq!(
            adopt["metadata"]["ownerReferences"][0]["controller"],
            json!(true)
        );
        assert_eq!(adopt["metadata"]["uid"], json!("u-web-1"));
        assert_eq!(adopt["metadata"]["resourceVersion"], json!("7"));
        assert!(
            plan.owned
                .iter()
                .any(|p| p.name_any() == "web-1" && controlled_by(&p.metadata, "su"))
        );
        assert!(!plan.owned.iter().any(|p| p.name_any() == "web-2"));
        let release = plan
            .writes
            .iter()
            .find_map(|w| match &w.op {
                common::Op::Patch { name, patch, .. } if name == "web-2" => Some(patch.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(release["metadata"]["ownerReferences"], Value::Null);

        // A set being deleted neither adopts nor releases.
        let mut dying = sts(json!({}));
        dying.metadata.deletion_timestamp = pods[4].metadata.deletion_timestamp.clone();
        let plan = claim(&dying, &refs);
        assert!(plan.writes.is_empty());
        assert_eq!(
            common::claim_outcomes(&plan, &names[..3], "su"),
            ["web-0=owned", "web-1=-", "web-2=-"]
        );
    }
}
