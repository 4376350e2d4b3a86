//! `POST pods/<name>/eviction` (policy/v1 Eviction), as upstream's eviction REST storage
//! (`pkg/registry/core/pod/storage/eviction.go`): a pod covered by a PodDisruptionBudget is
//! deleted only when the budget allows a disruption; the budget's `disruptionsAllowed` is then
//! decremented and the pod recorded in `disruptedPods` (so the disruption controller does not
//! count it as healthy while it terminates). A budget that forbids answers 429 "Cannot evict pod
//! as it would violate the pod's disruption budget.".
//!
//! [`decide`] is the pure decision; [`evict`] reads the pod and the budgets from the store,
//! writes the budget with compare-and-swap (retrying on conflicts) and deletes the pod.

use bytes::Bytes;
use ferry_api::selectors::from_label_selector;
use serde_json::{Value, json};

use crate::api::{Api, ApiResult, Reply};
use crate::objects;
use crate::request::{Query, ResourcePath};
use crate::status::ApiError;

/// Upstream's `MaxDisruptedPodSize`.
pub const MAX_DISRUPTED_POD_SIZE: usize = 2000;

/// What an eviction does.
#[derive(Debug, Clone)]
pub enum Decision {
    /// Delete the pod without touching a budget.
    Delete,
    /// Write this budget (status decremented, pod recorded), then delete the pod.
    UpdateBudgetThenDelete(Box<Value>),
    Refuse(ApiError),
}

fn too_many_requests(cause: String) -> ApiError {
    ApiError::new(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
    )
    .with_details(json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]}))
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
}

fn int(v: &Value, ptr: &str) -> i64 {
    v.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

/// The budgets (of the pod's namespace) whose selector selects the pod.
pub fn matching_budgets<'a>(pod: &Value, budgets: &'a [Value]) -> Vec<&'a Value> {
    let labels = objects::labels(pod);
    budgets
        .iter()
        .filter(|b| {
            let Some(sel) = b.pointer("/spec/selector").filter(|s| !s.is_null()) else {
                return false;
            };
            let Ok(sel) = serde_json::from_value(sel.clone()) else {
                return false;
            };
            match from_label_selector(&sel) {
                Ok(s) => !s.is_empty() && s.matches(&labels),
                Err(_) => false,
            }
        })
        .collect()
}

/// The decision for evicting `pod` given the budgets of its namespace; `now` is RFC 3339.
pub fn decide(pod: &Value, budgets: &[Value], now: &str, dry_run: bool) -> Decision {
    // A pod that is done, not started or already going can always be deleted.
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed" | "Pending" | "") || objects::is_deleting(pod) {
        return Decision::Delete;
    }
    let matching = matching_budgets(pod, budgets);
    let pdb = match matching.as_slice() {
        [] => return Decision::Delete,
        [one] => *one,
        _ => {
            return Decision::Refuse(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    let ready = pod_ready(pod);
    let policy = pdb
        .pointer("/spec/unhealthyPodEvictionPolicy")
        .and_then(Value::as_str)
        .unwrap_or("IfHealthyBudget");
    let current = int(pdb, "/status/currentHealthy");
    let desired = int(pdb, "/status/desiredHealthy");
    if !ready && policy == "AlwaysAllow" {
        return Decision::Delete;
    }
    if !ready && current >= desired && desired > 0 {
        return Decision::Delete;
    }
    let name = objects::name(pdb);
    let observed = int(pdb, "/status/observedGeneration");
    let generation = int(pdb, "/metadata/generation");
    if observed < generation {
        return Decision::Refuse(too_many_requests(format!(
            "The disruption budget {name} is still being processed by the server."
        )));
    }
    let allowed = int(pdb, "/status/disruptionsAllowed");
    if allowed < 0 {
        return Decision::Refuse(ApiError::forbidden(format!(
            "poddisruptionbudgets.policy \"{name}\" is forbidden: pdb disruptions allowed is negative"
        )));
    }
    let disrupted = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .map_or(0, |m| m.len());
    if disrupted > MAX_DISRUPTED_POD_SIZE {
        return Decision::Refuse(ApiError::forbidden(format!(
            "poddisruptionbudgets.policy \"{name}\" is forbidden: DisruptedPods map too big - too many evictions not confirmed by PDB controller"
        )));
    }
    if allowed == 0 {
        return Decision::Refuse(too_many_requests(format!(
            "The disruption budget {name} needs {desired} healthy pods and has {current} currently"
        )));
    }
    if dry_run {
        return Decision::Delete;
    }
    let mut b = pdb.clone();
    if !b.get("status").is_some_and(Value::is_object) {
        b["status"] = json!({});
    }
    b["status"]["disruptionsAllowed"] = json!(allowed - 1);
    if allowed - 1 == 0 {
        set_disruption_allowed_condition(&mut b, now);
    }
    if !b["status"]
        .get("disruptedPods")
        .is_some_and(Value::is_object)
    {
        b["status"]["disruptedPods"] = json!({});
    }
    b["status"]["disruptedPods"][objects::name(pod)] = json!(now);
    Decision::UpdateBudgetThenDelete(Box::new(b))
}

/// `DisruptionAllowed` False / `InsufficientPods`, as upstream's `UpdateDisruptionAllowedCondition`
/// sets it when the last allowed disruption is used.
fn set_disruption_allowed_condition(b: &mut Value, now: &str) {
    let observed = b.pointer("/status/observedGeneration").cloned();
    let mut conds: Vec<Value> = b["status"]
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let prev = conds
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionAllowed"))
        .cloned();
    conds.retain(|c| c.get("type").and_then(Value::as_str) != Some("DisruptionAllowed"));
    let unchanged = prev
        .as_ref()
        .is_some_and(|p| p.get("status").and_then(Value::as_str) == Some("False"));
    let ltt = if unchanged {
        prev.as_ref()
            .and_then(|p| p.get("lastTransitionTime").cloned())
            .unwrap_or(json!(now))
    } else {
        json!(now)
    };
    let mut c = json!({"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
        "message": "", "lastTransitionTime": ltt});
    if let Some(o) = observed {
        c["observedGeneration"] = o;
    }
    conds.push(c);
    b["status"]["conditions"] = json!(conds);
}

/// Handles `POST /api/v1/namespaces/<ns>/pods/<name>/eviction`.
pub async fn evict(api: &Api, p: &ResourcePath, q: &Query, body: Value) -> ApiResult {
    let ns = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
    if !kind.is_empty() && kind != "Eviction" {
        return Err(ApiError::bad_request(format!(
            "unexpected kind {kind:?}, expected Eviction"
        )));
    }
    let ev_name = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !ev_name.is_empty() && ev_name != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let delete_options = body.get("deleteOptions").filter(|d| d.is_object()).cloned();
    let dry_run = q.dry_run()?
        || delete_options
            .as_ref()
            .and_then(|d| d.get("dryRun"))
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|v| v == "All"));
    let pods = api
        .resource("", "v1", "pods")
        .cloned()
        .ok_or_else(|| ApiError::internal("pods not served"))?;
    let pdbs = api
        .resource("policy", "v1", "poddisruptionbudgets")
        .cloned()
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets not served"))?;
    for _attempt in 0..16 {
        let Some(kv) = api.store.get(&pods.key(Some(&ns), &name)).await? else {
            return Err(ApiError::not_found(pods.info(), &name));
        };
        let pod: Value =
            serde_json::from_slice(&kv.value).map_err(|e| ApiError::internal(e.to_string()))?;
        let range = api
            .store
            .range(&pdbs.list_prefix(Some(&ns)), Default::default())
            .await?;
        let mut budgets = Vec::new();
        let mut revisions = Vec::new();
        for kv in &range.kvs {
            if let Ok(v) = serde_json::from_slice::<Value>(&kv.value) {
                revisions.push((objects::name(&v).to_string(), kv.mod_revision));
                budgets.push(v);
            }
        }
        match decide(&pod, &budgets, &objects::now_rfc3339(), dry_run) {
            Decision::Refuse(e) => return Err(e),
            Decision::Delete => {}
            Decision::UpdateBudgetThenDelete(b) => {
                let bname = objects::name(&b).to_string();
                let Some((_, rev)) = revisions.iter().find(|(n, _)| *n == bname) else {
                    continue;
                };
                let bytes = Bytes::from(
                    serde_json::to_vec(&*b).map_err(|e| ApiError::internal(e.to_string()))?,
                );
                match api
                    .store
                    .update(&pdbs.key(Some(&ns), &bname), bytes, *rev)
                    .await
                {
                    Ok(_) => {}
                    Err(ferry_store::StoreError::Conflict { .. })
                    | Err(ferry_store::StoreError::NotFound) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // Delete the pod we decided about (its uid as a precondition), with the eviction's
        // delete options.
        let mut opts = delete_options.clone().unwrap_or_else(|| json!({}));
        if opts.get("preconditions").is_none() {
            opts["preconditions"] = json!({"uid": objects::uid(&pod)});
        }
        let mut dp = p.clone();
        dp.subresource = None;
        let mut dq = q.clone();
        if dry_run {
            dq.set("dryRun", "All");
        }
        match api.delete(&pods, &dp, &dq, Some(opts)).await {
            Ok(_) => {}
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
        return Ok(Reply::json(
            201,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        ));
    }
    Err(ApiError::new(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(phase: &str, ready: bool) -> Value {
        json!({"metadata": {"name": "web-0", "namespace": "d", "uid": "u", "labels": {"app": "web"}},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    fn pdb(allowed: i64, current: i64, desired: i64, policy: Option<&str>) -> Value {
        let mut b = json!({"metadata": {"name": "web-pdb", "namespace": "d", "generation": 1},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": current, "desiredHealthy": desired,
                "expectedPods": 3, "observedGeneration": 1}});
        if let Some(p) = policy {
            b["spec"]["unhealthyPodEvictionPolicy"] = json!(p);
        }
        b
    }

    const NOW: &str = "2026-01-01T00:00:00Z";

    #[test]
    fn decisions() {
        // No budget, a finished pod, a pending pod: delete.
        assert!(matches!(
            decide(&pod("Running", true), &[], NOW, false),
            Decision::Delete
        ));
        assert!(matches!(
            decide(&pod("Succeeded", false), &[pdb(0, 2, 2, None)], NOW, false),
            Decision::Delete
        ));
        assert!(matches!(
            decide(&pod("Pending", false), &[pdb(0, 2, 2, None)], NOW, false),
            Decision::Delete
        ));
        // A budget selecting other pods does not apply.
        let mut other = pdb(0, 2, 2, None);
        other["spec"]["selector"] = json!({"matchLabels": {"app": "db"}});
        assert!(matches!(
            decide(&pod("Running", true), &[other], NOW, false),
            Decision::Delete
        ));
        // Allowed: decrement and record.
        match decide(&pod("Running", true), &[pdb(1, 3, 2, None)], NOW, false) {
            Decision::UpdateBudgetThenDelete(b) => {
                assert_eq!(b["status"]["disruptionsAllowed"], json!(0));
                assert_eq!(b["status"]["disruptedPods"]["web-0"], json!(NOW));
                assert_eq!(
                    b["status"]["conditions"][0]["reason"],
                    json!("InsufficientPods")
                );
            }
            d => panic!("{d:?}"),
        }
        // Dry run: no budget write.
        assert!(matches!(
            decide(&pod("Running", true), &[pdb(1, 3, 2, None)], NOW, true),
            Decision::Delete
        ));
        // Forbidden: 429 with the cause.
        match decide(&pod("Running", true), &[pdb(0, 2, 2, None)], NOW, false) {
            Decision::Refuse(e) => {
                assert_eq!(e.code, 429);
                assert_eq!(
                    e.message,
                    "Cannot evict pod as it would violate the pod's disruption budget."
                );
                let cause = &e.details.unwrap()["causes"][0];
                assert_eq!(cause["reason"], json!("DisruptionBudget"));
                assert_eq!(
                    cause["message"],
                    json!("The disruption budget web-pdb needs 2 healthy pods and has 2 currently")
                );
            }
            d => panic!("{d:?}"),
        }
        // Unready pods: AlwaysAllow, or the budget is met.
        assert!(matches!(
            decide(
                &pod("Running", false),
                &[pdb(0, 1, 2, Some("AlwaysAllow"))],
                NOW,
                false
            ),
            Decision::Delete
        ));
        assert!(matches!(
            decide(&pod("Running", false), &[pdb(0, 2, 2, None)], NOW, false),
            Decision::Delete
        ));
        assert!(matches!(
            decide(&pod("Running", false), &[pdb(0, 1, 2, None)], NOW, false),
            Decision::Refuse(e) if e.code == 429
        ));
        // Not yet observed by the disruption controller.
        let mut fresh = pdb(1, 3, 2, None);
        fresh["metadata"]["generation"] = json!(2);
        assert!(matches!(
            decide(&pod("Running", true), &[fresh], NOW, false),
            Decision::Refuse(e) if e.code == 429
        ));
        // Two budgets: 500.
        assert!(matches!(
            decide(&pod("Running", true), &[pdb(1, 3, 2, None), pdb(1, 3, 2, None)], NOW, false),
            Decision::Refuse(e) if e.code == 500
        ));
    }
}
