//! The pod garbage collector, as kube-controller-manager's `podgc` controller: pods bound to a
//! node that no longer exists (orphans) are marked `Failed` with a `DisruptionTarget`
//! condition and force-deleted once the node has been missing for a quarantine period and a
//! direct read confirms it is gone; terminating pods that were never scheduled are
//! force-deleted; terminated pods beyond `--terminated-pod-gc-threshold` are deleted, oldest
//! first.
//!
//! [`Quarantine`] and [`plan`] decide (no IO); [`run`] feeds them from informers.

use crate::runtime::SlimPod;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Upstream's `gcCheckPeriod`.
const CHECK_PERIOD: Duration = Duration::from_secs(20);

/// What the collector needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub node_name: String,
    pub terminal: bool,
    pub deleting: bool,
    /// `metadata.creationTimestamp` (RFC 3339 sorts as time for one format).
    pub created: String,
}

/// Why a pod is deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Bound to a node that is gone: mark Failed with `DisruptionTarget`, then force-delete.
    Orphaned,
    /// Terminating and never scheduled: force-delete.
    UnscheduledTerminating,
    /// Over the terminated-pod threshold: delete.
    Terminated,
}

/// Nodes seen missing while pods are bound to them, with when they were first missed.
#[derive(Debug, Default)]
pub struct Quarantine {
    since: HashMap<String, Instant>,
}

impl Quarantine {
    /// Records the nodes pods are bound to that the cache does not know; returns those
    /// missing for at least `period` (to be confirmed with a direct read). Nodes that came
    /// back (or lost their pods) leave the quarantine.
    pub fn due(
        &mut self,
        pods: &[PodFacts],
        known_nodes: &BTreeSet<String>,
        period: Duration,
        now: Instant,
    ) -> Vec<String> {
        let missing: BTreeSet<&str> = pods
            .iter()
            .map(|p| p.node_name.as_str())
            .filter(|n| !n.is_empty() && !known_nodes.contains(*n))
            .collect();
        self.since.retain(|n, _| missing.contains(n.as_str()));
        let mut due = Vec::new();
        for n in missing {
            let t = *self.since.entry(n.to_string()).or_insert(now);
            if now.saturating_duration_since(t) >= period {
                due.push(n.to_string());
            }
        }
        due
    }

    /// Forgets a node (its pods were collected, or it exists after all).
    pub fn forget(&mut self, node: &str) {
        self.since.remove(node);
    }

    pub fn is_empty(&self) -> bool {
        self.since.is_empty()
    }
}

/// The pods to delete: those bound to `gone_nodes`, terminating ones never scheduled, and the
/// oldest terminated pods beyond `threshold` (0 turns that part off, as upstream).
pub fn plan(
    pods: &[PodFacts],
    gone_nodes: &BTreeSet<String>,
    threshold: usize,
) -> Vec<(usize, Reason)> {
    let mut out: Vec<(usize, Reason)> = Vec::new();
    for (i, p) in pods.iter().enumerate() {
        if !p.node_name.is_empty() && gone_nodes.contains(&p.node_name) {
            out.push((i, Reason::Orphaned));
        } else if p.node_name.is_empty() && p.deleting {
            out.push((i, Reason::UnscheduledTerminating));
        }
    }
    if threshold > 0 {
        let taken: BTreeSet<usize> = out.iter().map(|(i, _)| *i).collect();
        let mut terminated: Vec<usize> = pods
            .iter()
            .enumerate()
            .filter(|(i, p)| p.terminal && !p.deleting && !taken.contains(i))
            .map(|(i, _)| i)
            .collect();
        if terminated.len() > threshold {
            terminated.sort_by(|a, b| {
                (&pods[*a].created, &pods[*a].namespace, &pods[*a].name).cmp(&(
                    &pods[*b].created,
                    &pods[*b].namespace,
                    &pods[*b].name,
                ))
            });
            let extra = terminated.len() - threshold;
            out.extend(
                terminated
                    .into_iter()
                    .take(extra)
                    .map(|i| (i, Reason::Terminated)),
            );
        }
    }
    out
}

fn facts(p: &SlimPod) -> PodFacts {
    PodFacts {
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        node_name: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        terminal: matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        ),
        deleting: p.metadata.deletion_timestamp.is_some(),
        created: p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    }
}

/// Settings of the collector.
#[derive(Debug, Clone)]
pub struct PodGcConfig {
    /// How long a node must be missing before its pods are collected (upstream: 40 s).
    pub quarantine: Duration,
    /// Terminated pods kept before the oldest are deleted; 0: no limit.
    pub terminated_threshold: usize,
}

pub async fn run(
    client: kube::Client,
    informers: crate::runtime::Informers,
    cfg: PodGcConfig,
    stop: CancellationToken,
) {
    let notify = Arc::new(Notify::new());
    let pods: Store<SlimPod> = {
        let n = notify.clone();
        informers.pods().subscribe(move |_| n.notify_one())
    };
    let nodes: Store<Node> = super::informer(&client, notify.clone(), stop.clone());
    // Not `pods.wait_until_ready()`: the shared store's readiness wakes only one waiter.
    for s in [
        async {
            informers.pods().wait_synced(&stop).await;
        }
        .boxed(),
        async {
            let _ = nodes.wait_until_ready().await;
        }
        .boxed(),
    ] {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = s => {}
        }
    }
    let node_api: Api<Node> = Api::all(client.clone());
    let mut quarantine = Quarantine::default();
    loop {
        let all: Vec<Arc<SlimPod>> = pods.state();
        let list: Vec<PodFacts> = all.iter().map(|p| facts(p)).collect();
        let known: BTreeSet<String> = nodes.state().iter().map(|n| n.name_any()).collect();
        let mut gone = BTreeSet::new();
        for n in quarantine.due(&list, &known, cfg.quarantine, Instant::now()) {
            // The cache may lag: only a direct read saying 404 confirms the node is gone.
            match node_api.get_opt(&n).await {
                Ok(None) => {
                    gone.insert(n);
                }
                Ok(Some(_)) => quarantine.forget(&n),
                Err(e) => tracing::debug!("pod GC: reading node {n}: {e}"),
            }
        }
        for (i, why) in plan(&list, &gone, cfg.terminated_threshold) {
            collect(&client, &all[i], &list[i], &why).await;
        }
        for n in &gone {
            quarantine.forget(n);
        }
        // Quarantined nodes are looked at again soon; otherwise on change or every period.
        let wait = if quarantine.is_empty() {
            CHECK_PERIOD
        } else {
            (cfg.quarantine / 4).clamp(Duration::from_millis(250), CHECK_PERIOD)
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = notify.notified() => tokio::time::sleep(Duration::from_millis(50)).await,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn collect(client: &kube::Client, pod: &SlimPod, f: &PodFacts, why: &Reason) {
    let api: Api<SlimPod> = Api::namespaced(client.clone(), &f.namespace);
    if *why == Reason::Orphaned && !f.terminal {
        let now = jiff::Timestamp::now().to_string();
        let patch = json!({"status": {"phase": "Failed", "conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
            "message": "PodGC: node no longer exists", "lastTransitionTime": now}]}});
        if let Err(e) = api
            .patch_status(&f.name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            tracing::debug!("pod GC: marking {}/{} failed: {e}", f.namespace, f.name);
        }
    }
    let dp = match why {
        Reason::Terminated => DeleteParams::default(),
        _ => DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    };
    let dp = DeleteParams {
        preconditions: pod.uid().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..dp
    };
    match api.delete(&f.name, &dp).await {
        Ok(_) => tracing::info!(
            "pod GC: deleted {}/{} ({})",
            f.namespace,
            f.name,
            match why {
                Reason::Orphaned => format!("node {} no longer exists", f.node_name),
                Reason::UnscheduledTerminating => "terminating, never scheduled".into(),
                Reason::Terminated => "over the terminated-pod threshold".into(),
            }
        ),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => tracing::warn!("pod GC: deleting {}/{}: {e}", f.namespace, f.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str, terminal: bool, deleting: bool, created: &str) -> PodFacts {
        PodFacts {
            namespace: "default".into(),
            name: name.into(),
            node_name: node.into(),
            terminal,
            deleting,
            created: created.into(),
        }
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn quarantine_waits_then_reports_and_forgets_returning_nodes() {
        let pods = vec![
            pod("a", "n1", false, false, "1"),
            pod("b", "n2", false, false, "1"),
            pod("c", "", false, false, "1"),
        ];
        let mut q = Quarantine::default();
        let t0 = Instant::now();
        let period = Duration::from_secs(40);
        assert!(q.due(&pods, &set(&["n1"]), period, t0).is_empty());
        assert!(!q.is_empty(), "n2 is quarantined");
        assert!(
            q.due(&pods, &set(&["n1"]), period, t0 + Duration::from_secs(39))
                .is_empty()
        );
        assert_eq!(
            q.due(&pods, &set(&["n1"]), period, t0 + Duration::from_secs(40)),
            vec!["n2".to_string()]
        );
        // The node came back: out of quarantine, and the clock starts again next time.
        assert!(
            q.due(
                &pods,
                &set(&["n1", "n2"]),
                period,
                t0 + Duration::from_secs(41)
            )
            .is_empty()
        );
        assert!(q.is_empty());
        assert!(
            q.due(&pods, &set(&["n1"]), period, t0 + Duration::from_secs(42))
                .is_empty()
        );
        // No quarantine at all: due at once.
        let mut q = Quarantine::default();
        assert_eq!(
            q.due(&pods, &set(&[]), Duration::ZERO, t0),
            vec!["n1".to_string(), "n2".to_string()]
        );
    }

    #[test]
    fn plan_table() {
        let pods = vec![
            pod("on-gone", "gone", false, false, "2024-01-01T00:00:05Z"),
            pod("done-on-gone", "gone", true, false, "2024-01-01T00:00:01Z"),
            pod("alive", "n1", false, false, "2024-01-01T00:00:00Z"),
            pod("pending", "", false, false, "2024-01-01T00:00:00Z"),
            pod("unsched-deleting", "", false, true, "2024-01-01T00:00:00Z"),
            pod("t1", "n1", true, false, "2024-01-01T00:00:03Z"),
            pod("t2", "n1", true, false, "2024-01-01T00:00:02Z"),
            pod("t3", "n1", true, true, "2024-01-01T00:00:00Z"),
        ];
        let names = |v: Vec<(usize, Reason)>| -> Vec<(String, Reason)> {
            v.into_iter()
                .map(|(i, r)| (pods[i].name.clone(), r))
                .collect()
        };
        assert_eq!(
            names(plan(&pods, &set(&["gone"]), 0)),
            vec![
                ("on-gone".to_string(), Reason::Orphaned),
                ("done-on-gone".to_string(), Reason::Orphaned),
                (
                    "unsched-deleting".to_string(),
                    Reason::UnscheduledTerminating
                ),
            ]
        );
        // Threshold 1: of the terminated pods not already collected (done-on-gone, t1, t2;
        // t3 is being deleted), the two oldest go.
        assert_eq!(
            names(plan(&pods, &set(&[]), 1)),
            vec![
                (
                    "unsched-deleting".to_string(),
                    Reason::UnscheduledTerminating
                ),
                ("done-on-gone".to_string(), Reason::Terminated),
                ("t2".to_string(), Reason::Terminated),
            ]
        );
        assert_eq!(names(plan(&pods, &set(&[]), 3)).len(), 1);
        assert!(plan(&[], &set(&["gone"]), 1).is_empty());
    }
}
