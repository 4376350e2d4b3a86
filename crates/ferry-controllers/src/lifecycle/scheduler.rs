//! A minimal scheduler: binds pods without `spec.nodeName` (and with the default scheduler name)
//! through `pods/binding` to the least loaded Ready, schedulable node matching their
//! `nodeSelector`; pods that fit nowhere get `PodScheduled=False` and a `FailedScheduling` Event.

use crate::runtime::SlimPod;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::scheduler_core::{self as core, NodeInfo, PodNeeds, Taint, Toleration};

pub const SCHEDULER_NAME: &str = "default-scheduler";
const RETRY_EVENT_AFTER: Duration = Duration::from_secs(30);

fn node_info(n: &Node, pods: usize) -> NodeInfo {
    let spec = n.spec.clone().unwrap_or_default();
    NodeInfo {
        name: n.name_any(),
        labels: n.labels().clone(),
        ready: n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        unschedulable: spec.unschedulable == Some(true),
        taints: spec
            .taints
            .unwrap_or_default()
            .into_iter()
            .map(|t| Taint {
                key: t.key,
                value: t.value.unwrap_or_default(),
                effect: t.effect,
            })
            .collect(),
        pods,
    }
}

fn needs_with(
    p: &SlimPod,
    volume_affinity: Vec<k8s_openapi::api::core::v1::VolumeNodeAffinity>,
) -> PodNeeds {
    let spec = p.spec.clone().unwrap_or_default();
    PodNeeds {
        node_selector: spec.node_selector.unwrap_or_default(),
        tolerations: spec
            .tolerations
            .unwrap_or_default()
            .into_iter()
            .map(|t| Toleration {
                key: t.key.unwrap_or_default(),
                operator: t.operator.unwrap_or_else(|| "Equal".into()),
                value: t.value.unwrap_or_default(),
                effect: t.effect.unwrap_or_default(),
            })
            .collect(),
        volume_affinity,
    }
}

fn terminal(p: &SlimPod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

pub async fn run(
    client: kube::Client,
    informers: crate::runtime::Informers,
    stop: CancellationToken,
) {
    let notify = Arc::new(Notify::new());
    let pods: Store<SlimPod> = {
        let n = notify.clone();
        informers.pods().subscribe(move |_| n.notify_one())
    };
    let nodes: Store<Node> = super::informer(&client, notify.clone(), stop.clone());
    // The pods' claims, their volumes and classes (the VolumeBinding plugin's view).
    let claims: Store<PersistentVolumeClaim> =
        super::informer(&client, notify.clone(), stop.clone());
    let volumes: Store<PersistentVolume> = super::informer(&client, notify.clone(), stop.clone());
    let classes: Store<StorageClass> = super::informer(&client, notify.clone(), stop.clone());
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
        async {
            let _ = claims.wait_until_ready().await;
            let _ = volumes.wait_until_ready().await;
            let _ = classes.wait_until_ready().await;
        }
        .boxed(),
    ] {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = s => {}
        }
    }
    // Pods bound by us but not yet seen bound in the cache: pod uid -> node.
    let mut bound: HashMap<String, (String, Instant)> = HashMap::new();
    // Pods reported unschedulable: uid -> (message, when).
    let mut reported: HashMap<String, (String, Instant)> = HashMap::new();
    loop {
        let all_pods = pods.state();
        let all_nodes = nodes.state();
        bound.retain(|_, (_, t)| t.elapsed() < Duration::from_secs(10));
        let mut load: HashMap<String, usize> = HashMap::new();
        let mut seen: HashSet<String> = HashSet::new();
        for p in &all_pods {
            let uid = p.uid().unwrap_or_default();
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            if !node.is_empty() {
                bound.remove(&uid);
                if !terminal(p) {
                    *load.entry(node).or_default() += 1;
                }
            } else if let Some((n, _)) = bound.get(&uid) {
                *load.entry(n.clone()).or_default() += 1;
            }
            seen.insert(uid);
        }
        reported.retain(|uid, _| seen.contains(uid));
        for p in &all_pods {
            let uid = p.uid().unwrap_or_default();
            // Stop between pods: a pass over many unschedulable pods writes for each of them.
            if stop.is_cancelled() {
                return;
            }
            let no_spec;
            let spec = match p.spec.as_ref() {
                Some(s) => s,
                None => {
                    no_spec = crate::runtime::pod::PodSpec::default();
                    &no_spec
                }
            };
            let name_ok = spec
                .scheduler_name
                .as_deref()
                .is_none_or(|s| s.is_empty() || s == SCHEDULER_NAME);
            if !spec.node_name.as_deref().unwrap_or("").is_empty()
                || p.metadata.deletion_timestamp.is_some()
                || terminal(p)
                || !name_ok
                || bound.contains_key(&uid)
                || spec
                    .scheduling_gates
                    .as_ref()
                    .is_some_and(|g| !g.is_empty())
            {
                continue;
            }
            let infos: Vec<NodeInfo> = all_nodes
                .iter()
                .map(|n| node_info(n, load.get(&n.name_any()).copied().unwrap_or(0)))
                .collect();
            let ns = p.namespace().unwrap_or_default();
            let api: Api<SlimPod> = Api::namespaced(client.clone(), &ns);
            let claim_names: Vec<&str> = p.claim_names().collect();
            let vols = if claim_names.is_empty() {
                Ok(core::Volumes::default())
            } else {
                core::pod_volumes(
                    &claim_names,
                    &|n| {
                        crate::runtime::ObjectKey::new(ns.clone(), n)
                            .get(&claims)
                            .map(|c| (*c).clone())
                    },
                    &|n| {
                        crate::runtime::ObjectKey::new("", n)
                            .get(&volumes)
                            .map(|v| (*v).clone())
                    },
                    &|c| {
                        crate::runtime::ObjectKey::new("", c)
                            .get(&classes)
                            .is_some_and(|sc| {
                                sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
                            })
                    },
                )
            };
            let vols = match vols {
                Ok(v) => v,
                Err(reason) => {
                    let msg = format!("0/{} nodes are available: {reason}.", infos.len());
                    let again = reported
                        .get(&uid)
                        .is_none_or(|(m, t)| *m != msg || t.elapsed() > RETRY_EVENT_AFTER);
                    if again {
                        unschedulable(&client, p, &msg).await;
                        reported.insert(uid.clone(), (msg, Instant::now()));
                    }
                    continue;
                }
            };
            match core::choose(&needs_with(p, vols.affinity.clone()), &infos) {
                Ok(node) if !vols.delayed.is_empty() => {
                    // WaitForFirstConsumer claims: provisioned (or bound) for the chosen node
                    // first; the pod is bound once every claim is.
                    for (claim, _) in vols.delayed.iter().filter(|(_, selected)| !selected) {
                        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
                        let patch = json!({"metadata": {"annotations": {
                            crate::storage::binder_core::ANN_SELECTED_NODE: node}}});
                        if let Err(e) = api
                            .patch(claim, &PatchParams::default(), &Patch::Merge(patch))
                            .await
                        {
                            tracing::debug!("selecting node {node} for claim {ns}/{claim}: {e}");
                        }
                    }
                }
                Ok(node) => {
                    let binding = json!({"apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": p.name_any(), "namespace": ns},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                    match api
                        .create_subresource::<serde_json::Value, serde_json::Value>(
                            "binding",
                            &p.name_any(),
                            &PostParams::default(),
                            &binding,
                        )
                        .await
                    {
                        Ok(_) => {
                            tracing::info!("scheduled {ns}/{} to {node}", p.name_any());
                            {
                                let (client, p) = (client.clone(), p.clone());
                                let msg = format!(
                                    "Successfully assigned {ns}/{} to {node}",
                                    p.name_any()
                                );
                                tokio::spawn(async move {
                                    pod_event(&client, &p, "Normal", "Scheduled", &msg).await;
                                });
                            }
                            *load.entry(node.clone()).or_default() += 1;
                            bound.insert(uid.clone(), (node, Instant::now()));
                            reported.remove(&uid);
                        }
                        Err(e) => tracing::debug!("bind {ns}/{}: {e}", p.name_any()),
                    }
                }
                Err(why) => {
                    let msg = core::message(infos.len(), &why);
                    let again = reported
                        .get(&uid)
                        .is_none_or(|(m, t)| *m != msg || t.elapsed() > RETRY_EVENT_AFTER);
                    if again {
                        unschedulable(&client, p, &msg).await;
                        reported.insert(uid.clone(), (msg, Instant::now()));
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = notify.notified() => tokio::time::sleep(Duration::from_millis(20)).await,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

async fn unschedulable(client: &kube::Client, p: &SlimPod, msg: &str) {
    let ns = p.namespace().unwrap_or_default();
    let now = jiff::Timestamp::now();
    let api: Api<SlimPod> = Api::namespaced(client.clone(), &ns);
    let patch = json!({"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
        "reason": "Unschedulable", "message": msg, "lastProbeTime": null, "lastTransitionTime": now.to_string()}]}});
    // A strategic merge keyed by type keeps the other conditions.
    let _ = api
        .patch_status(
            &p.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await;
    pod_event(client, p, "Warning", "FailedScheduling", msg).await;
}

/// Records an Event from the scheduler about a pod.
async fn pod_event(client: &kube::Client, p: &SlimPod, type_: &str, reason: &str, msg: &str) {
    super::events::record(
        client,
        super::events::reference(p),
        type_,
        reason,
        msg.to_string(),
        SCHEDULER_NAME,
    );
}
