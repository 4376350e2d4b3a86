//! The DaemonSet controller (`pkg/controller/daemon`): a pure planner [`plan`] from a DaemonSet,
//! the nodes, its pods and its ControllerRevisions to writes, and the thin reconciler.
//!
//! A node is eligible when the pod template's `nodeSelector` and required node affinity match it
//! and the pod (with the tolerations upstream adds to daemon pods) tolerates its NoSchedule and
//! NoExecute taints. Daemon pods are bound directly (`spec.nodeName`, plus the
//! `metadata.name` node affinity upstream sets). RollingUpdate honours `maxUnavailable` and
//! `maxSurge`; OnDelete replaces only pods deleted by the user.

use crate::runtime::SlimPod;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Taint, Toleration};
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
use crate::lifecycle::workload_core::resolve;
use crate::runtime::{self, Action, ObjectKey, Reconciler, WorkQueue};

pub const REVISION_LABEL: &str = "controller-revision-hash";
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";

#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub writes: Vec<Write>,
    pub requeue_after: Option<i64>,
}

/// The tolerations the DaemonSet controller adds to every daemon pod (`AddOrUpdateDaemonPodTolerations`).
pub fn default_tolerations(host_network: bool) -> Vec<Toleration> {
    let t = |key: &str, effect: &str| Toleration {
        key: Some(key.to_string()),
        operator: Some("Exists".to_string()),
        effect: Some(effect.to_string()),
        ..Default::default()
    };
    let mut v = vec![
        t("node.kubernetes.io/not-ready", "NoExecute"),
        t("node.kubernetes.io/unreachable", "NoExecute"),
        t("node.kubernetes.io/disk-pressure", "NoSchedule"),
        t("node.kubernetes.io/memory-pressure", "NoSchedule"),
        t("node.kubernetes.io/pid-pressure", "NoSchedule"),
        t("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        v.push(t("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    v
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty())
        && e != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.clone().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(x)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|x| x.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" { v > x } else { v < x }
        }
        _ => false,
    }
}

/// Whether a daemon pod from `ds` should run on `node`.
pub fn node_should_run(ds: &DaemonSet, node: &Node) -> bool {
    let spec = ds.spec.template.spec.clone().unwrap_or_default();
    let labels = node.labels();
    if let Some(sel) = &spec.node_selector
        && sel.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(req) = required {
        let name = node.name_any();
        let any = req.node_selector_terms.iter().any(|term| {
            let exprs = term.match_expressions.iter().flatten();
            let fields = term.match_fields.iter().flatten();
            let mut empty = true;
            let mut ok = true;
            for r in exprs {
                empty = false;
                ok &= requirement_matches(r, labels.get(&r.key).map(String::as_str));
            }
            for r in fields {
                empty = false;
                let v = (r.key == "metadata.name").then_some(name.as_str());
                ok &= requirement_matches(r, v);
            }
            !empty && ok
        });
        if !any {
            return false;
        }
    }
    let mut tolerations = spec.tolerations.unwrap_or_default();
    tolerations.extend(default_tolerations(spec.host_network == Some(true)));
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|taint| tolerations.iter().any(|t| tolerates(t, taint)))
}

fn template_value(ds: &DaemonSet) -> Value {
    serde_json::to_value(&ds.spec.template).unwrap_or(json!({}))
}

fn node_of(p: &SlimPod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The daemon pod for `node`.
pub fn new_pod(ds: &DaemonSet, node: &str, hash: &str) -> Value {
    let t = template_value(ds);
    let mut meta = t.get("metadata").cloned().unwrap_or(json!({}));
    let mut spec = t.get("spec").cloned().unwrap_or(json!({}));
    if !meta.is_object() {
        meta = json!({});
    }
    meta["generateName"] = json!(format!("{}-", ds.name_any()));
    meta["namespace"] = json!(ds.namespace());
    meta["ownerReferences"] = json!([common::controller_ref("apps/v1", "DaemonSet", &ds.metadata)]);
    meta["labels"][REVISION_LABEL] = json!(hash);
    meta["labels"]["pod-template-generation"] =
        json!(ds.metadata.generation.unwrap_or(1).to_string());
    spec["nodeName"] = json!(node);
    // The node affinity upstream replaces with the node's name (kept alongside nodeName).
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]});
    let mut tol: Vec<Value> = spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let host_network = spec["hostNetwork"] == json!(true);
    for d in default_tolerations(host_network) {
        let dv = serde_json::to_value(&d).unwrap_or(json!({}));
        if !tol
            .iter()
            .any(|t| t["key"] == dv["key"] && t["effect"] == dv["effect"])
        {
            tol.push(dv);
        }
    }
    spec["tolerations"] = json!(tol);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

fn pod_hash(p: &SlimPod) -> String {
    p.labels().get(REVISION_LABEL).cloned().unwrap_or_default()
}

/// Plans one sync of `ds` over `nodes` with the pods and revisions it controls at `now`.
pub fn plan(
    ds: &DaemonSet,
    nodes: &[&Node],
    pods: &[&SlimPod],
    revisions: &[&ControllerRevision],
    now: i64,
) -> Plan {
    let mut out = Plan::default();
    let ns = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
    if is_deleting(&ds.metadata) {
        return out;
    }
    let st = ds.status.clone().unwrap_or_default();
    let collision = st.collision_count.unwrap_or(0);
    let data = revision_data(&template_value(ds));
    let max_rev = revisions
        .iter()
        .filter_map(|r| r.revision)
        .max()
        .unwrap_or(0);
    let hash = match revisions.iter().find(|r| r.data.0 == data) {
        Some(r) => r
            .labels()
            .get(HASH_LABEL)
            .cloned()
            .unwrap_or_else(|| revision_hash(&data, collision)),
        None => {
            let hash = revision_hash(&data, collision);
            let mut labels: BTreeMap<String, String> = ds
                .spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            labels.insert(HASH_LABEL.to_string(), hash.clone());
            out.writes.push(Write::create(
                Res::ControllerRevisions,
                &ns,
                json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                    "metadata": {"name": format!("{name}-{hash}"), "namespace": ns, "labels": labels,
                        "ownerReferences": [common::controller_ref("apps/v1", "DaemonSet", &ds.metadata)]},
                    "data": data, "revision": max_rev + 1}),
            ));
            hash
        }
    };
    let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
    let mut by_node: BTreeMap<String, Vec<&SlimPod>> = BTreeMap::new();
    for p in pods {
        by_node.entry(node_of(p)).or_default().push(p);
    }
    let eligible: Vec<String> = nodes
        .iter()
        .filter(|n| node_should_run(ds, n))
        .map(|n| n.name_any())
        .collect();
    let eligible_set: HashSet<&String> = eligible.iter().collect();
    let del = |p: &SlimPod| Write::delete(Res::Pods, &ns, &p.name_any(), p.uid().as_deref());

    // Pods on nodes that should not run them, or on nodes that are gone.
    let mut misscheduled = 0;
    for (node, ps) in &by_node {
        if !eligible_set.contains(node) {
            if ps.iter().any(|p| !is_terminal(p)) {
                misscheduled += 1;
            }
            for p in ps.iter().filter(|p| !is_deleting(&p.metadata)) {
                out.writes.push(del(p));
            }
        }
    }
    let us = ds.spec.update_strategy.clone().unwrap_or_default();
    let rolling = us.type_.as_deref().unwrap_or("RollingUpdate") == "RollingUpdate";
    let desired = eligible.len() as i32;
    let ru = us.rolling_update.clone().unwrap_or_default();
    let max_surge = if rolling {
        resolve(ru.max_surge.as_ref(), desired, true, "0")
    } else {
        0
    };
    let max_unavailable = if rolling {
        let u = resolve(ru.max_unavailable.as_ref(), desired, true, "1");
        if u == 0 && max_surge == 0 { 1 } else { u }
    } else {
        0
    };

    let (mut current, mut ready, mut available, mut updated) = (0, 0, 0, 0);
    // Per eligible node: (old available pods, new pod state).
    let mut unavailable_nodes = 0;
    let mut old_candidates: Vec<(&SlimPod, bool, bool)> = Vec::new(); // (pod, available, new_available)
    let mut surging = 0;
    for node in &eligible {
        let ps: Vec<&SlimPod> = by_node.get(node).cloned().unwrap_or_default();
        // Failed pods are deleted (and replaced on a later sync).
        for p in ps
            .iter()
            .filter(|p| is_terminal(p) && !is_deleting(&p.metadata))
        {
            out.writes.push(del(p));
        }
        let mut live: Vec<&SlimPod> = ps.iter().copied().filter(|p| !is_terminal(p)).collect();
        live.sort_by_key(|p| p.creation_timestamp().map(|t| t.0));
        let (new, old): (Vec<&SlimPod>, Vec<&SlimPod>) =
            live.iter().partition(|p| pod_hash(p) == hash);
        let active_new: Vec<&SlimPod> = new
            .iter()
            .copied()
            .filter(|p| !is_deleting(&p.metadata))
            .collect();
        let active_old: Vec<&SlimPod> = old
            .iter()
            .copied()
            .filter(|p| !is_deleting(&p.metadata))
            .collect();
        if !live.is_empty() {
            current += 1;
        }
        if live.iter().any(|p| is_ready(p)) {
            ready += 1;
        }
        let node_available = live
            .iter()
            .any(|p| is_available(p, min_ready, now) && !is_deleting(&p.metadata));
        if node_available {
            available += 1;
        } else {
            unavailable_nodes += 1;
        }
        if !new.is_empty() {
            updated += 1;
        }
        // Extra pods: keep the oldest new (or old) one.
        if active_new.len() > 1 {
            for p in &active_new[1..] {
                out.writes.push(del(p));
            }
        }
        if live.is_empty() {
            out.writes
                .push(Write::create(Res::Pods, &ns, new_pod(ds, node, &hash)));
            continue;
        }
        if !active_old.is_empty() {
            let new_available = active_new
                .first()
                .is_some_and(|p| is_available(p, min_ready, now));
            if !active_new.is_empty() {
                surging += 1;
                if new_available {
                    for p in &active_old {
                        out.writes.push(del(p));
                    }
                }
            } else if rolling {
                for p in &active_old {
                    old_candidates.push((p, is_available(p, min_ready, now), false));
                }
            }
            if active_old.len() > 1 {
                for p in &active_old[1..] {
                    out.writes.push(del(p));
                }
            }
        }
    }
    // Rolling update of old pods: unavailable old pods first (free), then within budget.
    if rolling {
        let mut budget = max_unavailable - unavailable_nodes;
        let mut surge_budget = max_surge - surging;
        old_candidates.sort_by_key(|(p, avail, _)| (*avail, p.name_any()));
        for (p, avail, _) in old_candidates {
            if !avail {
                out.writes.push(del(p));
            } else if surge_budget > 0 {
                out.writes.push(Write::create(
                    Res::Pods,
                    &ns,
                    new_pod(ds, &node_of(p), &hash),
                ));
                surge_budget -= 1;
            } else if budget > 0 {
                out.writes.push(del(p));
                budget -= 1;
            }
        }
    }
    // History.
    let live_hashes: HashSet<String> = pods
        .iter()
        .map(|p| pod_hash(p))
        .chain([hash.clone()])
        .collect();
    let mut old: Vec<&&ControllerRevision> = revisions
        .iter()
        .filter(|r| {
            !live_hashes.contains(r.labels().get(HASH_LABEL).map(String::as_str).unwrap_or(""))
        })
        .collect();
    old.sort_by_key(|r| r.revision.unwrap_or(0));
    let limit = ds.spec.revision_history_limit.unwrap_or(10).max(0) as usize;
    for r in old.iter().take(old.len().saturating_sub(limit)) {
        out.writes.push(Write::delete(
            Res::ControllerRevisions,
            &ns,
            &r.name_any(),
            r.uid().as_deref(),
        ));
    }
    if min_ready > 0 && ready > available {
        out.requeue_after = Some(i64::from(min_ready));
    }
    let status = json!({
        "observedGeneration": ds.metadata.generation,
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": current,
        "numberMisscheduled": misscheduled,
        "numberReady": ready,
        "updatedNumberScheduled": updated,
        "numberAvailable": available,
        "numberUnavailable": desired - available,
    });
    let before = serde_json::to_value(&st).unwrap_or(json!({}));
    let changed = status.as_object().into_iter().flatten().any(|(k, v)| {
        let b = before.get(k).cloned().unwrap_or(Value::Null);
        b != *v && !(b.is_null() && v == &json!(0))
    });
    if changed {
        out.writes
            .push(Write::status(Res::DaemonSets, &ns, &name, status));
    }
    out
}

/// Upstream's `ControllerRefManager.ClaimPods` for a DaemonSet: the namespace's pods its selector
/// matches are adopted (with the tracking finalizer), owned pods it no longer matches are released.
pub fn claim(ds: &DaemonSet, candidates: &[&SlimPod]) -> common::ClaimPlan<SlimPod> {
    let owner = common::Claimer {
        api_version: "apps/v1",
        kind: "DaemonSet",
        meta: &ds.metadata,
        finalizer: None,
    };
    common::plan_claim(&owner, Res::Pods, candidates, |p: &SlimPod| {
        common::selects(&ds.spec.selector, p.labels())
    })
}

// ---- the reconciler ----

pub struct DaemonSetController {
    client: kube::Client,
    sets: Store<DaemonSet>,
    nodes: Store<Node>,
    pods: Store<SlimPod>,
    revisions: Store<ControllerRevision>,
    expect: Expectations,
}

impl Reconciler for DaemonSetController {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "daemonset-controller"
    }
    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, kube::Error> {
        let Some(ds) = key.get(&self.sets) else {
            return Ok(Action::Done);
        };
        let uid = ds.uid().unwrap_or_default();
        let all = self.pods.state();
        let candidates: Vec<&SlimPod> = all
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| p.namespace() == ds.namespace())
            .collect();
        let claimed = claim(&ds, &candidates);
        if !common::exec_claim(&self.client, Res::DaemonSets, &ds.metadata, claimed.writes).await? {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let pods: Vec<&SlimPod> = claimed.owned.iter().collect();
        let revs = self.revisions.state();
        let revisions: Vec<&ControllerRevision> = revs
            .iter()
            .map(|r| r.as_ref())
            .filter(|r| r.namespace() == ds.namespace() && controlled_by(&r.metadata, &uid))
            .collect();
        let node_list = self.nodes.state();
        let nodes: Vec<&Node> = node_list.iter().map(|n| n.as_ref()).collect();
        let present: HashSet<String> = pods
            .iter()
            .map(|p| p.name_any())
            .chain(revisions.iter().map(|r| r.name_any()))
            .collect();
        if !self.expect.satisfied(&uid, &present) {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let plan = plan(&ds, &nodes, &pods, &revisions, now_secs());
        let (revs_w, rest): (Vec<Write>, Vec<Write>) = plan.writes.into_iter().partition(|w| {
            w.res == Res::ControllerRevisions && matches!(w.op, common::Op::Create(_))
        });
        let unnamed = rest
            .iter()
            .filter(|w| matches!(w.op, common::Op::Create(_)))
            .count();
        let done: Vec<Done> = common::exec_in_order(&self.client, revs_w, rest).await?;
        self.expect.record(&uid, &done, unnamed);
        Ok(common::requeue(plan.requeue_after))
    }
}

pub async fn run(client: kube::Client, informers: runtime::Informers, stop: CancellationToken) {
    let queue: Arc<WorkQueue<ObjectKey>> = Arc::default();
    let q = queue.clone();
    let sets = runtime::reflect(
        Api::<DaemonSet>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                q.add(ObjectKey::of(o));
            }
        },
    );
    let pods = common::reflect_pods_for(&informers, &queue, sets.clone(), |s: &DaemonSet, l| {
        common::selects(&s.spec.selector, l)
    });
    let revisions = common::reflect_revisions_for::<DaemonSet>(&client, &queue, stop.clone());
    // A node change (labels, taints, new node) concerns every DaemonSet.
    let (q, s2) = (queue.clone(), sets.clone());
    let nodes = runtime::reflect(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            let relevant = match (ch.old, ch.new) {
                (Some(a), Some(b)) => {
                    a.metadata.labels != b.metadata.labels
                        || a.spec.as_ref().map(|s| (&s.taints, s.unschedulable))
                            != b.spec.as_ref().map(|s| (&s.taints, s.unschedulable))
                }
                _ => true,
            };
            if relevant {
                for ds in s2.state() {
                    q.add(ObjectKey::of(ds.as_ref()));
                }
            }
        },
    );
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = async {
            let _ = sets.wait_until_ready().await;
            informers.pods().wait_synced(&stop).await;
            let _ = revisions.wait_until_ready().await;
            let _ = nodes.wait_until_ready().await;
        } => {}
    }
    let ctl = Arc::new(DaemonSetController {
        client,
        sets,
        nodes,
        pods,
        revisions,
        expect: Expectations::default(),
    });
    runtime::worker::run(ctl, queue, 2, stop).await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn ds(extra: Value) -> DaemonSet {
        let mut spec = json!({"selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "c", "image": "a:1"}]}}});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(
            json!({"metadata": {"name": "agent", "namespace": "d", "uid": "du", "generation": 1},
            "spec": spec}),
        )
        .unwrap()
    }

    fn node(name: &str, labels: Value, taints: Value) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}),
        )
        .unwrap()
    }

    fn pod(name: &str, node: &str, hash: &str, ready: bool) -> SlimPod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "d", "uid": format!("u-{name}"),
            "labels": {"app": "agent", REVISION_LABEL: hash},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "du", "controller": true}]},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                "lastTransitionTime": common::rfc3339(NOW - 100)}]}})).unwrap()
    }

    fn summary(p: &Plan) -> Vec<String> {
        p.writes
            .iter()
            .filter_map(|w| match &w.op {
                common::Op::Create(v) if w.res == Res::Pods => Some(format!(
                    "create {}",
                    v["spec"]["nodeName"].as_str().unwrap_or("")
                )),
                common::Op::Delete { name, .. } if w.res == Res::Pods => {
                    Some(format!("delete {name}"))
                }
                _ => None,
            })
            .collect()
    }

    fn hash_of(d: &DaemonSet) -> String {
        revision_hash(&revision_data(&template_value(d)), 0)
    }

    #[test]
    fn eligibility() {
        let d = ds(json!({}));
        let plain = node("n1", json!({}), json!(null));
        let cordoned = node(
            "n2",
            json!({}),
            json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
        );
        let tainted = node(
            "n3",
            json!({}),
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
        );
        let soft = node(
            "n4",
            json!({}),
            json!([{"key": "x", "effect": "PreferNoSchedule"}]),
        );
        assert!(node_should_run(&d, &plain));
        assert!(
            node_should_run(&d, &cordoned),
            "daemon pods tolerate unschedulable"
        );
        assert!(!node_should_run(&d, &tainted));
        assert!(node_should_run(&d, &soft));
        let tol = ds(
            json!({"template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}}}),
        );
        assert!(node_should_run(&tol, &tainted));
        let sel = ds(
            json!({"template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [],
            "nodeSelector": {"disk": "ssd"}}}}),
        );
        assert!(!node_should_run(&sel, &plain));
        assert!(node_should_run(
            &sel,
            &node("n5", json!({"disk": "ssd"}), json!(null))
        ));
        let aff = ds(
            json!({"template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}}}}}),
        );
        assert!(node_should_run(
            &aff,
            &node("n6", json!({"zone": "b"}), json!(null))
        ));
        assert!(!node_should_run(
            &aff,
            &node("n7", json!({"zone": "c"}), json!(null))
        ));
    }

    #[test]
    fn one_pod_per_node() {
        let d = ds(json!({}));
        let h = hash_of(&d);
        let (n1, n2, n3) = (
            node("n1", json!({}), json!(null)),
            node("n2", json!({}), json!(null)),
            node(
                "n3",
                json!({}),
                json!([{"key": "k", "effect": "NoExecute"}]),
            ),
        );
        let p1 = pod("agent-a", "n1", &h, true);
        let stray = pod("agent-b", "n3", &h, true);
        let p = plan(&d, &[&n1, &n2, &n3], &[&p1, &stray], &[], NOW);
        assert_eq!(summary(&p), vec!["delete agent-b", "create n2"]);
        let created = p
            .writes
            .iter()
            .find_map(|w| match &w.op {
                common::Op::Create(v) if w.res == Res::Pods => Some(v.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(created["metadata"]["generateName"], json!("agent-"));
        assert!(
            created["spec"]["tolerations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["key"] == "node.kubernetes.io/unschedulable")
        );
        assert_eq!(
            created["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"],
            json!(["n2"])
        );
        let st = p
            .writes
            .iter()
            .find_map(|w| match &w.op {
                common::Op::Patch { patch, .. } => Some(patch["status"].clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(st["desiredNumberScheduled"], json!(2));
        assert_eq!(st["currentNumberScheduled"], json!(1));
        assert_eq!(st["numberMisscheduled"], json!(1));
    }

    #[test]
    fn rolling_update() {
        let d = ds(json!({}));
        let old = "oldhash";
        let nodes: Vec<Node> = (1..=3)
            .map(|i| node(&format!("n{i}"), json!({}), json!(null)))
            .collect();
        let nr: Vec<&Node> = nodes.iter().collect();
        let pods: Vec<SlimPod> = (1..=3)
            .map(|i| pod(&format!("agent-{i}"), &format!("n{i}"), old, true))
            .collect();
        let pr: Vec<&SlimPod> = pods.iter().collect();
        // maxUnavailable 1: one old pod at a time.
        assert_eq!(
            summary(&plan(&d, &nr, &pr, &[], NOW)),
            vec!["delete agent-1"]
        );
        // maxSurge 1 (maxUnavailable 0): a new pod next to an old one first.
        let s = ds(
            json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}}),
        );
        assert_eq!(summary(&plan(&s, &nr, &pr, &[], NOW)), vec!["create n1"]);
        // ...and the old one goes when the new one is available.
        let h = hash_of(&s);
        let fresh = pod("agent-n", "n1", &h, true);
        let mut with_new = pr.clone();
        with_new.push(&fresh);
        assert_eq!(
            summary(&plan(&s, &nr, &with_new, &[], NOW)),
            vec!["delete agent-1"]
        );
        // OnDelete: nothing.
        let od = ds(json!({"updateStrategy": {"type": "OnDelete"}}));
        assert!(summary(&plan(&od, &nr, &pr, &[], NOW)).is_empty());
    }

    #[test]
    fn claims_orphans_on_any_node() {
        let d = ds(json!({}));
        let uid = d.metadata.uid.clone().unwrap();
        let mine = pod("agent-a", "n1", "h", true);
        let mut orphan = mine.clone();
        orphan.metadata.name = Some("agent-b".into());
        orphan.metadata.owner_references = None;
        let mut other = orphan.clone();
        other.metadata.name = Some("other".into());
        other.metadata.labels = Some([("app".to_string(), "x".to_string())].into());
        let pods = [&mine, &orphan, &other];
        let plan = claim(&d, &pods);
        assert_eq!(
            common::claim_outcomes(&plan, &["agent-a", "agent-b", "other"], &uid),
            ["agent-a=owned", "agent-b=adopt", "other=-"]
        );
        assert!(plan.writes.iter().all(|w| w.res == Res::Pods));
    }
}
