//! The disruption controller (`pkg/controller/disruption`): keeps each PodDisruptionBudget's
//! status (`expectedPods`, `currentHealthy`, `desiredHealthy`, `disruptionsAllowed`,
//! `disruptedPods`, the `DisruptionAllowed` condition). [`plan`] is pure.
//!
//! With an integer `minAvailable`, the expected count is the number of selected pods; with
//! `maxUnavailable` or a percentage, it is the scale of the pods' controllers (a Deployment's or
//! ReplicaSet's or StatefulSet's `spec.replicas`), as upstream; pods whose controller has no
//! scale count one each.

use crate::runtime::SlimPod;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::common::{self, Res, Write, is_deleting, is_ready};
use crate::runtime::{self, Action, ObjectKey, Reconciler, WorkQueue, keys};

/// How long an eviction's `disruptedPods` entry holds before the pod counts again.
pub const DELETION_TIMEOUT: i64 = 120;

/// `(uid of the scaled controller, its replicas)` for a pod, when known.
pub type ScaleOf<'a> = dyn Fn(&SlimPod) -> Option<(String, i32)> + 'a;

fn selects(pdb: &PodDisruptionBudget, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    match ferry_api::selectors::from_label_selector(sel) {
        Ok(s) => !s.is_empty() && s.matches(labels),
        Err(_) => false,
    }
}

fn percent(v: &IntOrString, total: i32, round_up: bool) -> i32 {
    match v {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => {
            let p: f64 = s.trim_end_matches('%').parse().unwrap_or(0.0);
            let x = p * f64::from(total) / 100.0;
            if round_up {
                x.ceil() as i32
            } else {
                x.floor() as i32
            }
        }
    }
}

/// The PDB status for the selected `pods` at `now` (seconds); `None` = unchanged.
pub fn plan(
    pdb: &PodDisruptionBudget,
    pods: &[&SlimPod],
    scale_of: &ScaleOf<'_>,
    now: i64,
) -> Option<Write> {
    let spec = pdb.spec.clone().unwrap_or_default();
    let st = pdb.status.clone().unwrap_or_default();
    let selected: Vec<&SlimPod> = pods
        .iter()
        .copied()
        .filter(|p| selects(pdb, p.labels()))
        .collect();
    // Evictions not yet seen as deletions keep their pods out of the healthy count.
    let mut disrupted: BTreeMap<String, Value> = BTreeMap::new();
    for (name, t) in st.disrupted_pods.clone().unwrap_or_default() {
        let at = t.0.as_second();
        let pod = selected.iter().find(|p| p.name_any() == name);
        let still = pod.is_some_and(|p| !is_deleting(&p.metadata));
        if still && at + DELETION_TIMEOUT > now {
            disrupted.insert(name, json!(common::rfc3339(at)));
        }
    }
    let healthy = selected
        .iter()
        .filter(|p| {
            !is_deleting(&p.metadata) && is_ready(p) && !disrupted.contains_key(&p.name_any())
        })
        .count() as i32;
    let (expected, desired) = match (&spec.min_available, &spec.max_unavailable) {
        (Some(IntOrString::Int(n)), None) => (selected.len() as i32, *n),
        (min, max) => {
            let mut scales: HashMap<String, i32> = HashMap::new();
            let mut loose = 0;
            for p in &selected {
                match scale_of(p) {
                    Some((uid, n)) => {
                        scales.insert(uid, n);
                    }
                    None => loose += 1,
                }
            }
            let expected = scales.values().sum::<i32>() + loose;
            let desired = match (min, max) {
                (Some(m), _) => percent(m, expected, true),
                (None, Some(m)) => (expected - percent(m, expected, true)).max(0),
                (None, None) => expected,
            };
            (expected, desired)
        }
    };
    let allowed = if expected == 0 {
        0
    } else {
        (healthy - desired).max(0)
    };
    let (cond_status, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let prev = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionAllowed")
        .cloned();
    let ltt = match &prev {
        Some(c) if c.status == cond_status => common::rfc3339(c.last_transition_time.0.as_second()),
        _ => common::rfc3339(now),
    };
    let generation = pdb.metadata.generation.unwrap_or(0);
    let status = json!({
        "observedGeneration": generation,
        "expectedPods": expected,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": allowed,
        "disruptedPods": if disrupted.is_empty() { Value::Null } else { json!(disrupted) },
        "conditions": [{"type": "DisruptionAllowed", "status": cond_status, "reason": reason,
            "message": "", "observedGeneration": generation, "lastTransitionTime": ltt}],
    });
    let same = st.observed_generation == Some(generation)
        && st.expected_pods == Some(expected)
        && st.current_healthy == Some(healthy)
        && st.desired_healthy == Some(desired)
        && st.disruptions_allowed == Some(allowed)
        && st.disrupted_pods.clone().unwrap_or_default().len() == disrupted.len()
        && prev.as_ref().is_some_and(|c| c.status == cond_status);
    (!same).then(|| {
        Write::status(
            Res::PodDisruptionBudgets,
            &pdb.namespace().unwrap_or_default(),
            &pdb.name_any(),
            status,
        )
    })
}

// ---- the reconciler ----

pub struct DisruptionController {
    client: kube::Client,
    pdbs: Store<PodDisruptionBudget>,
    pods: Store<SlimPod>,
    replica_sets: Store<ReplicaSet>,
    deployments: Store<Deployment>,
    stateful_sets: Store<StatefulSet>,
}

impl DisruptionController {
    fn scale_of(&self, p: &SlimPod) -> Option<(String, i32)> {
        let r = keys::controller_ref(&p.metadata)?;
        let ns = p.namespace().unwrap_or_default();
        match r.kind.as_str() {
            "ReplicaSet" => {
                let rs = ObjectKey::new(&ns, &r.name).get(&self.replica_sets)?;
                if let Some(d) =
                    keys::controller_ref(&rs.metadata).filter(|d| d.kind == "Deployment")
                    && let Some(dep) = ObjectKey::new(&ns, &d.name).get(&self.deployments)
                {
                    return Some((d.uid.clone(), dep.spec.replicas.unwrap_or(1)));
                }
                Some((r.uid.clone(), rs.spec.replicas.unwrap_or(1)))
            }
            "StatefulSet" => {
                let s = ObjectKey::new(&ns, &r.name).get(&self.stateful_sets)?;
                Some((r.uid.clone(), s.spec.replicas.unwrap_or(1)))
            }
            _ => None,
        }
    }
}

impl Reconciler for DisruptionController {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "disruption-controller"
    }
    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, kube::Error> {
        let Some(pdb) = key.get(&self.pdbs) else {
            return Ok(Action::Done);
        };
        let all = self.pods.state();
        let pods: Vec<&SlimPod> = all
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| p.namespace() == pdb.namespace())
            .collect();
        let now = common::now_secs();
        if let Some(w) = plan(&pdb, &pods, &|p| self.scale_of(p), now) {
            common::exec(&self.client, w).await?;
        }
        // Look again when the oldest disruptedPods entry expires.
        let next = pdb
            .status
            .as_ref()
            .and_then(|s| s.disrupted_pods.as_ref())
            .and_then(|m| m.values().map(|t| t.0.as_second()).min())
            .map(|at| (at + DELETION_TIMEOUT - now).max(1));
        Ok(match next {
            Some(s) => Action::RequeueAfter(Duration::from_secs(s as u64)),
            None => Action::Done,
        })
    }
}

fn pdb_selects(pdb: &PodDisruptionBudget, labels: &BTreeMap<String, String>) -> bool {
    selects(pdb, labels)
}

pub async fn run(client: kube::Client, informers: runtime::Informers, stop: CancellationToken) {
    let queue: Arc<WorkQueue<ObjectKey>> = Arc::default();
    let q = queue.clone();
    let pdbs = runtime::reflect(
        Api::<PodDisruptionBudget>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                q.add(ObjectKey::of(o));
            }
        },
    );
    let (q, ps) = (queue.clone(), pdbs.clone());
    let pods = informers.pods().subscribe(move |ch| {
        for o in ch.objects() {
            q.extend(keys::selecting(
                &ps,
                o.metadata.namespace.as_deref().unwrap_or(""),
                o.labels(),
                pdb_selects,
            ));
        }
    });
    // Scale changes of controllers change expected counts: resync the namespace's budgets.
    fn ns_budgets(q: &WorkQueue<ObjectKey>, pdbs: &Store<PodDisruptionBudget>, ns: Option<&str>) {
        for p in pdbs.state() {
            if p.namespace().as_deref() == ns {
                q.add(ObjectKey::of(p.as_ref()));
            }
        }
    }
    let (q, ps) = (queue.clone(), pdbs.clone());
    let replica_sets = runtime::reflect(
        Api::<ReplicaSet>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                ns_budgets(&q, &ps, o.metadata.namespace.as_deref());
            }
        },
    );
    let (q, ps) = (queue.clone(), pdbs.clone());
    let deployments = runtime::reflect(
        Api::<Deployment>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                ns_budgets(&q, &ps, o.metadata.namespace.as_deref());
            }
        },
    );
    let (q, ps) = (queue.clone(), pdbs.clone());
    let stateful_sets = runtime::reflect(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                ns_budgets(&q, &ps, o.metadata.namespace.as_deref());
            }
        },
    );
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = async {
            let _ = pdbs.wait_until_ready().await;
            informers.pods().wait_synced(&stop).await;
            let _ = replica_sets.wait_until_ready().await;
            let _ = deployments.wait_until_ready().await;
            let _ = stateful_sets.wait_until_ready().await;
        } => {}
    }
    let ctl = Arc::new(DisruptionController {
        client,
        pdbs,
        pods,
        replica_sets,
        deployments,
        stateful_sets,
    });
    runtime::worker::run(ctl, queue, 2, stop).await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn pdb(spec: Value, status: Value) -> PodDisruptionBudget {
        let mut s = json!({"selector": {"matchLabels": {"app": "web"}}});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "d", "generation": 1},
            "spec": s, "status": status}),
        )
        .unwrap()
    }

    fn pod(name: &str, ready: bool, owner: Option<&str>) -> SlimPod {
        let mut p = json!({"metadata": {"name": name, "namespace": "d", "labels": {"app": "web"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}});
        if let Some(o) = owner {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": o, "uid": o, "controller": true}]);
        }
        serde_json::from_value(p).unwrap()
    }

    fn status(w: Option<Write>) -> Value {
        match w.unwrap().op {
            common::Op::Patch { patch, .. } => patch["status"].clone(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn counts() {
        let (a, b, c) = (
            pod("a", true, None),
            pod("b", true, None),
            pod("c", false, None),
        );
        let none = |_: &SlimPod| None;
        let st = status(plan(
            &pdb(json!({"minAvailable": 1}), json!({})),
            &[&a, &b, &c],
            &none,
            NOW,
        ));
        assert_eq!(st["expectedPods"], json!(3));
        assert_eq!(st["currentHealthy"], json!(2));
        assert_eq!(st["desiredHealthy"], json!(1));
        assert_eq!(st["disruptionsAllowed"], json!(1));
        assert_eq!(st["conditions"][0]["reason"], json!("SufficientPods"));
        assert_eq!(st["observedGeneration"], json!(1));
        // minAvailable 2 of 2 healthy: none allowed.
        let st = status(plan(
            &pdb(json!({"minAvailable": 2}), json!({})),
            &[&a, &b, &c],
            &none,
            NOW,
        ));
        assert_eq!(st["disruptionsAllowed"], json!(0));
        assert_eq!(st["conditions"][0]["reason"], json!("InsufficientPods"));
        // maxUnavailable over the controller's scale (4 replicas, 2 healthy): 4 - 1 = 3 desired.
        let (x, y) = (pod("x", true, Some("rs1")), pod("y", true, Some("rs1")));
        let scale = |p: &SlimPod| keys::controller_ref(&p.metadata).map(|r| (r.uid.clone(), 4));
        let st = status(plan(
            &pdb(json!({"maxUnavailable": 1}), json!({})),
            &[&x, &y],
            &scale,
            NOW,
        ));
        assert_eq!(st["expectedPods"], json!(4));
        assert_eq!(st["desiredHealthy"], json!(3));
        assert_eq!(st["disruptionsAllowed"], json!(0));
        // Percentages round up.
        let st = status(plan(
            &pdb(json!({"minAvailable": "50%"}), json!({})),
            &[&a, &b, &c],
            &none,
            NOW,
        ));
        assert_eq!(st["desiredHealthy"], json!(2));
    }

    #[test]
    fn disrupted_pods_expire() {
        let (a, b) = (pod("a", true, None), pod("b", true, None));
        let none = |_: &SlimPod| None;
        let recent = pdb(
            json!({"minAvailable": 1}),
            json!({"disruptedPods": {"a": common::rfc3339(NOW - 10)}}),
        );
        let st = status(plan(&recent, &[&a, &b], &none, NOW));
        assert_eq!(st["currentHealthy"], json!(1));
        assert_eq!(st["disruptionsAllowed"], json!(0));
        let old = pdb(
            json!({"minAvailable": 1}),
            json!({"disruptedPods": {"a": common::rfc3339(NOW - 500)}}),
        );
        let st = status(plan(&old, &[&a, &b], &none, NOW));
        assert_eq!(st["currentHealthy"], json!(2));
        assert!(st["disruptedPods"].is_null());
        // Unchanged status: no write.
        let done = pdb(json!({"minAvailable": 1}), st);
        assert!(plan(&done, &[&a, &b], &none, NOW).is_none());
    }
}
