//! The Job controller (`pkg/controller/job`) with the TTL-after-finished controller: a pure
//! planner [`plan`] from a Job, its pods and the clock to writes, and the thin reconciler.
//!
//! Pod tracking as upstream: every pod carries the `batch.kubernetes.io/job-tracking`
//! finalizer; a finished pod is first counted in the Job's status (its uid listed in
//! `uncountedTerminatedPods` in the same write), then its finalizer is removed, so a pod is
//! counted exactly once even if it is deleted right after it finishes.

use crate::runtime::SlimPod;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec, JobStatus};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::common::{
    self, Done, Expectations, Res, Write, is_active, is_deleting, is_ready, is_terminal, rfc3339,
};
use crate::runtime::{self, Action, ObjectKey, Reconciler, WorkQueue, keys};
use ferry_api::workloads::{JOB_COMPLETION_INDEX, JOB_TRACKING_FINALIZER};

/// Upstream's pod-recreation backoff after failures: 10 s doubling, at most 6 minutes.
pub const BACKOFF_BASE: i64 = 10;
pub const BACKOFF_MAX: i64 = 360;
/// At most this many pods are created or deleted in one sync (upstream's `MaxPodCreateDeletePerSync`).
pub const MAX_POD_CREATE_DELETE_PER_SYNC: usize = 500;

/// The writes for one Job and when to look again.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub writes: Vec<Write>,
    pub requeue_after: Option<i64>,
}

fn cond_true(st: &JobStatus, t: &str) -> bool {
    st.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == t && c.status == "True")
}

pub fn finished(st: &JobStatus) -> bool {
    cond_true(st, "Complete") || cond_true(st, "Failed")
}

fn has_finalizer(p: &SlimPod) -> bool {
    p.finalizers().iter().any(|f| f == JOB_TRACKING_FINALIZER)
}

fn index_of(p: &SlimPod) -> Option<i32> {
    p.annotations()
        .get(JOB_COMPLETION_INDEX)
        .or_else(|| p.labels().get(JOB_COMPLETION_INDEX))
        .and_then(|s| s.parse().ok())
}

/// `1,3-5,7` from a set of indexes (upstream's compressed interval list).
pub fn format_indexes(set: &BTreeSet<i32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = set.iter().peekable();
    while let Some(&start) = it.next() {
        let mut end = start;
        while it.peek().is_some_and(|&&n| n == end + 1) {
            end += 1;
            it.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

pub fn parse_indexes(s: &str) -> BTreeSet<i32> {
    let mut set = BTreeSet::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    set.extend(a..=b);
                }
            }
            None => {
                if let Ok(n) = part.parse() {
                    set.insert(n);
                }
            }
        }
    }
    set
}

/// What the pod failure policy says about a failed pod: `None` = no rule matched (count it).
pub fn failure_policy_action(spec: &JobSpec, p: &SlimPod) -> Option<(String, String)> {
    let pfp = spec.pod_failure_policy.as_ref()?;
    for (i, r) in pfp.rules.iter().enumerate() {
        if let Some(ec) = &r.on_exit_codes {
            let statuses = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default();
            for cs in statuses {
                if ec.container_name.as_deref().is_some_and(|n| n != cs.name) {
                    continue;
                }
                let Some(t) = cs.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
                    continue;
                };
                if t.exit_code == 0 {
                    continue;
                }
                let inside = ec.values.contains(&t.exit_code);
                if (ec.operator == "In") == inside {
                    let msg = format!(
                        "Container {} for pod {}/{} failed with exit code {} matching {} rule at index {}",
                        cs.name,
                        p.namespace().unwrap_or_default(),
                        p.name_any(),
                        t.exit_code,
                        r.action,
                        i
                    );
                    return Some((r.action.clone(), msg));
                }
            }
        }
        for pc in r.on_pod_conditions.iter().flatten() {
            let want = pc.status.as_deref().unwrap_or("True");
            let hit = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == pc.type_ && c.status == want);
            if hit {
                let msg = format!(
                    "Pod {}/{} has condition {} matching {} rule at index {}",
                    p.namespace().unwrap_or_default(),
                    p.name_any(),
                    pc.type_,
                    r.action,
                    i
                );
                return Some((r.action.clone(), msg));
            }
        }
    }
    None
}

fn finish_time(p: &SlimPod) -> Option<i64> {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|cs| cs.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0.as_second())
        .max()
}

fn condition(type_: &str, reason: &str, message: &str, now: i64) -> Value {
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
        "lastProbeTime": rfc3339(now), "lastTransitionTime": rfc3339(now)})
}

/// A pod for the Job (index `Some` in Indexed mode).
pub fn new_pod(job: &Job, index: Option<i32>) -> Value {
    let spec = job.spec.clone().unwrap_or_default();
    let name = job.name_any();
    let t = spec.template;
    let mut meta = serde_json::to_value(t.metadata.unwrap_or_default()).unwrap_or(json!({}));
    let mut pspec = serde_json::to_value(t.spec.unwrap_or_default()).unwrap_or(json!({}));
    meta["generateName"] = json!(match index {
        Some(i) => format!("{name}-{i}-"),
        None => format!("{name}-"),
    });
    meta["namespace"] = json!(job.namespace().unwrap_or_default());
    meta["ownerReferences"] = json!([common::controller_ref("batch/v1", "Job", &job.metadata)]);
    meta["finalizers"] = json!([JOB_TRACKING_FINALIZER]);
    if let Some(i) = index {
        meta["annotations"][JOB_COMPLETION_INDEX] = json!(i.to_string());
        meta["labels"][JOB_COMPLETION_INDEX] = json!(i.to_string());
        pspec["hostname"] = json!(format!("{name}-{i}"));
        let env = json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath":
            format!("metadata.annotations['{JOB_COMPLETION_INDEX}']")}}});
        for key in ["containers", "initContainers"] {
            if let Some(cs) = pspec.get_mut(key).and_then(Value::as_array_mut) {
                for c in cs {
                    let list = c
                        .as_object_mut()
                        .map(|o| o.entry("env").or_insert_with(|| json!([])));
                    if let Some(Value::Array(l)) = list
                        && !l.iter().any(|e| e["name"] == "JOB_COMPLETION_INDEX")
                    {
                        l.push(env.clone());
                    }
                }
            }
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pspec})
}

fn remove_finalizer_patch(p: &SlimPod) -> Value {
    let rest: Vec<String> = p
        .finalizers()
        .iter()
        .filter(|f| *f != JOB_TRACKING_FINALIZER)
        .cloned()
        .collect();
    json!({"metadata": {"finalizers": if rest.is_empty() { Value::Null } else { json!(rest) },
        "resourceVersion": p.resource_version()}})
}

/// Plans one sync of `job` with the pods it controls at `now` (seconds).
pub fn plan(job: &Job, pods: &[&SlimPod], now: i64) -> Plan {
    let mut out = Plan::default();
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let spec = job.spec.clone().unwrap_or_default();
    let st = job.status.clone().unwrap_or_default();
    let pod_write =
        |p: &SlimPod| Write::patch(Res::Pods, &ns, &p.name_any(), remove_finalizer_patch(p));

    // Finished or going away: release every tracked pod; TTL.
    if finished(&st) || is_deleting(&job.metadata) {
        let failed = cond_true(&st, "Failed");
        for p in pods {
            if failed && is_active(p) {
                out.writes.push(Write::delete(
                    Res::Pods,
                    &ns,
                    &p.name_any(),
                    p.uid().as_deref(),
                ));
            }
            if has_finalizer(p) && (!is_active(p) || failed || is_deleting(&job.metadata)) {
                out.writes.push(pod_write(p));
            }
        }
        if let Some(ttl) = spec.ttl_seconds_after_finished
            && finished(&st)
            && !is_deleting(&job.metadata)
        {
            let at = st
                .completion_time
                .as_ref()
                .map(|t| t.0.as_second())
                .or_else(|| {
                    st.conditions
                        .iter()
                        .flatten()
                        .filter(|c| matches!(c.type_.as_str(), "Complete" | "Failed"))
                        .filter_map(|c| c.last_transition_time.as_ref())
                        .map(|t| t.0.as_second())
                        .max()
                })
                .unwrap_or(now);
            let expire = at + i64::from(ttl);
            if now >= expire {
                out.writes.push(Write::delete_background(
                    Res::Jobs,
                    &ns,
                    &name,
                    job.uid().as_deref(),
                ));
            } else {
                out.requeue_after = Some(expire - now);
            }
        }
        return out;
    }

    let uncounted = st.uncounted_terminated_pods.clone().unwrap_or_default();
    let already: HashSet<String> = uncounted
        .succeeded
        .iter()
        .flatten()
        .chain(uncounted.failed.iter().flatten())
        .cloned()
        .collect();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let completions = spec.completions;
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    let mut succeeded = st.succeeded.unwrap_or(0);
    let mut failed = st.failed.unwrap_or(0);
    let mut completed: BTreeSet<i32> = parse_indexes(st.completed_indexes.as_deref().unwrap_or(""));
    let mut new_uncounted_s: Vec<String> = Vec::new();
    let mut new_uncounted_f: Vec<String> = Vec::new();
    let mut release: Vec<&SlimPod> = Vec::new();
    let mut fail_reason: Option<(String, String)> = None;
    let mut last_failure: Option<i64> = None;
    for p in pods {
        let uid = p.uid().unwrap_or_default();
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("");
        let terminal_or_gone = is_terminal(p) || is_deleting(&p.metadata);
        if phase == "Failed" {
            let t = finish_time(p).unwrap_or(0);
            last_failure = Some(last_failure.map_or(t, |l: i64| l.max(t)));
        }
        if !has_finalizer(p) || !terminal_or_gone {
            continue;
        }
        if already.contains(&uid) {
            // Counted by an earlier sync: only the finalizer is left to remove.
            release.push(p);
            continue;
        }
        if phase == "Succeeded" {
            if indexed {
                if let Some(i) = index_of(p)
                    && completions.is_some_and(|c| i < c)
                {
                    completed.insert(i);
                }
            } else {
                succeeded += 1;
            }
            new_uncounted_s.push(uid);
        } else {
            // Failed, or deleted before finishing.
            match failure_policy_action(&spec, p) {
                Some((a, msg)) if a == "FailJob" => {
                    failed += 1;
                    fail_reason.get_or_insert(("PodFailurePolicy".to_string(), msg));
                }
                Some((a, _)) if a == "Ignore" => {}
                _ => failed += 1,
            }
            new_uncounted_f.push(uid);
        }
        release.push(p);
    }
    if indexed {
        succeeded = completed.len() as i32;
    }
    let active: Vec<&SlimPod> = pods.iter().copied().filter(|p| is_active(p)).collect();
    let terminating = pods
        .iter()
        .filter(|p| is_deleting(&p.metadata) && !is_terminal(p))
        .count() as i32;
    let ready = active.iter().filter(|p| is_ready(p)).count() as i32;
    let suspended = spec.suspend == Some(true);
    let start = st.start_time.as_ref().map(|t| t.0.as_second());

    // Failure and completion.
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    if fail_reason.is_none() && failed > backoff_limit {
        fail_reason = Some((
            "BackoffLimitExceeded".into(),
            "Job has reached the specified backoff limit".into(),
        ));
    }
    if fail_reason.is_none()
        && let (Some(ads), Some(s)) = (spec.active_deadline_seconds, start)
        && !suspended
    {
        if now >= s + ads {
            fail_reason = Some((
                "DeadlineExceeded".into(),
                "Job was active longer than specified deadline".into(),
            ));
        } else {
            out.requeue_after = Some(s + ads - now);
        }
    }
    let complete = fail_reason.is_none()
        && match completions {
            Some(c) => succeeded >= c,
            None => succeeded > 0 && active.is_empty(),
        };

    let mut conditions: Vec<Value> = st
        .conditions
        .clone()
        .unwrap_or_default()
        .iter()
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    let has = |conds: &Vec<Value>, t: &str| {
        conds
            .iter()
            .any(|c| c["type"] == t && c["status"] == "True")
    };
    let mut status = json!({});
    if let Some((reason, msg)) = &fail_reason {
        for p in &active {
            out.writes.push(Write::delete(
                Res::Pods,
                &ns,
                &p.name_any(),
                p.uid().as_deref(),
            ));
        }
        if !has(&conditions, "FailureTarget") {
            conditions.push(condition("FailureTarget", reason, msg, now));
        }
        conditions.push(condition("Failed", reason, msg, now));
    } else if complete {
        if !has(&conditions, "SuccessCriteriaMet") {
            conditions.push(condition(
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now,
            ));
        }
        conditions.push(condition(
            "Complete",
            "CompletionsReached",
            "Reached expected number of succeeded pods",
            now,
        ));
        status["completionTime"] = json!(rfc3339(now));
    } else if suspended {
        for p in &active {
            out.writes.push(Write::delete(
                Res::Pods,
                &ns,
                &p.name_any(),
                p.uid().as_deref(),
            ));
        }
        if !has(&conditions, "Suspended") {
            conditions.retain(|c| c["type"] != "Suspended");
            conditions.push(json!({"type": "Suspended", "status": "True", "reason": "JobSuspended",
                "message": "Job suspended", "lastProbeTime": rfc3339(now), "lastTransitionTime": rfc3339(now)}));
        }
    } else {
        if has(&conditions, "Suspended") {
            for c in conditions.iter_mut().filter(|c| c["type"] == "Suspended") {
                *c = json!({"type": "Suspended", "status": "False", "reason": "JobResumed",
                    "message": "Job resumed", "lastProbeTime": rfc3339(now), "lastTransitionTime": rfc3339(now)});
            }
        }
        // Pods to create or delete.
        let delay = if failed > 0 {
            let d = (BACKOFF_BASE << (failed - 1).clamp(0, 10)).min(BACKOFF_MAX);
            last_failure.map_or(0, |t| (t + d - now).max(0))
        } else {
            0
        };
        if indexed {
            let c = completions.unwrap_or(0);
            let running: BTreeSet<i32> = active.iter().filter_map(|p| index_of(p)).collect();
            let room = (parallelism as usize).saturating_sub(active.len());
            let missing: Vec<i32> = (0..c)
                .filter(|i| !completed.contains(i) && !running.contains(i))
                .take(room.min(MAX_POD_CREATE_DELETE_PER_SYNC))
                .collect();
            if !missing.is_empty() {
                if delay > 0 {
                    out.requeue_after = Some(out.requeue_after.map_or(delay, |r| r.min(delay)));
                } else {
                    for i in missing {
                        out.writes
                            .push(Write::create(Res::Pods, &ns, new_pod(job, Some(i))));
                    }
                }
            }
        } else {
            let want = match completions {
                None => {
                    if succeeded > 0 {
                        active.len() as i32
                    } else {
                        parallelism
                    }
                }
                Some(c) => (c - succeeded).clamp(0, parallelism),
            };
            let have = active.len() as i32;
            if want > have {
                if delay > 0 {
                    out.requeue_after = Some(out.requeue_after.map_or(delay, |r| r.min(delay)));
                } else {
                    let n = ((want - have) as usize).min(MAX_POD_CREATE_DELETE_PER_SYNC);
                    for _ in 0..n {
                        out.writes
                            .push(Write::create(Res::Pods, &ns, new_pod(job, None)));
                    }
                }
            } else if want < have {
                // Delete the not-ready ones first, then the youngest.
                let mut victims = active.clone();
                victims.sort_by_key(|p| {
                    (
                        is_ready(p),
                        std::cmp::Reverse(p.creation_timestamp().map(|t| t.0)),
                    )
                });
                for p in victims.into_iter().take((have - want) as usize) {
                    out.writes.push(Write::delete(
                        Res::Pods,
                        &ns,
                        &p.name_any(),
                        p.uid().as_deref(),
                    ));
                }
            }
        }
    }

    // Status: counters, uncounted pods, conditions.
    let planned_creates = out
        .writes
        .iter()
        .filter(|w| matches!(w.op, common::Op::Create(_)))
        .count() as i32;
    let _ = planned_creates;
    status["active"] = json!(if fail_reason.is_some() || suspended {
        0
    } else {
        active.len() as i32
    });
    status["ready"] = json!(ready);
    status["terminating"] = json!(terminating);
    status["succeeded"] = json!(succeeded);
    status["failed"] = json!(failed);
    if start.is_none() && !suspended {
        status["startTime"] = json!(rfc3339(now));
    }
    if indexed {
        status["completedIndexes"] = json!(format_indexes(&completed));
    }
    // Uids still to release stay listed until their finalizer is gone.
    let keep = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter()
            .flatten()
            .filter(|u| {
                pods.iter()
                    .any(|p| p.uid().as_deref() == Some(u.as_str()) && has_finalizer(p))
            })
            .cloned()
            .collect()
    };
    let mut us = keep(&uncounted.succeeded);
    us.extend(new_uncounted_s);
    let mut uf = keep(&uncounted.failed);
    uf.extend(new_uncounted_f);
    status["uncountedTerminatedPods"] = json!({"succeeded": us, "failed": uf});
    status["conditions"] = json!(conditions);
    let before = serde_json::to_value(&st).unwrap_or(json!({}));
    let changed = status
        .as_object()
        .into_iter()
        .flatten()
        .any(|(k, v)| normalise(before.get(k)) != normalise(Some(v)));
    if changed {
        // The status goes first: a pod's finalizer is removed only after it is counted.
        out.writes
            .insert(0, Write::status(Res::Jobs, &ns, &name, status));
    } else {
        for p in release {
            out.writes.push(pod_write(p));
        }
    }
    out
}

/// Empty lists and objects compare equal to absent ones.
fn normalise(v: Option<&Value>) -> Value {
    match v {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Array(a)) if a.is_empty() => Value::Null,
        Some(Value::Object(o)) if o.values().all(|x| normalise(Some(x)) == Value::Null) => {
            Value::Null
        }
        Some(v) => v.clone(),
    }
}

/// Upstream's `ControllerRefManager.ClaimPods` for a Job: the namespace's pods its selector
/// matches are adopted (with the tracking finalizer), owned pods it no longer matches are released.
pub fn claim(job: &Job, candidates: &[&SlimPod]) -> common::ClaimPlan<SlimPod> {
    let owner = common::Claimer {
        api_version: "batch/v1",
        kind: "Job",
        meta: &job.metadata,
        finalizer: Some(JOB_TRACKING_FINALIZER),
    };
    common::plan_claim(&owner, Res::Pods, candidates, |p: &SlimPod| {
        job.spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|sel| common::selects(sel, p.labels()))
    })
}

// ---- orphan pods (upstream's `orphanQueue` / `syncOrphanPod`) ----

/// A Job as the orphan-pod decisions see it: its uid and whether it has finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRef {
    pub uid: String,
    pub finished: bool,
}

/// The Job a controller reference resolves to (upstream's `resolveControllerRef`: a `Job` of
/// that name whose uid is the reference's), from `job_named` (a lookup in the Job cache).
fn resolve_job(
    r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    job_named: &dyn Fn(&str) -> Option<JobRef>,
) -> Option<JobRef> {
    if r.kind != "Job" {
        return None;
    }
    job_named(&r.name).filter(|j| j.uid == r.uid)
}

/// Whether a pod change hands the pod to the orphan worker (upstream's pod event handlers): it
/// carries the tracking finalizer and either has no controller (the garbage collector orphaned
/// it, e.g. after a Job deleted with `orphan` propagation, batch/v1's default) or is being
/// deleted (`gone`: deletionTimestamp set, or the delete event) while its Job is gone or
/// finished — cases in which no Job sync will remove the finalizer.
pub fn orphan_needs_release(
    p: &SlimPod,
    gone: bool,
    job_named: &dyn Fn(&str) -> Option<JobRef>,
) -> bool {
    if !has_finalizer(p) {
        return false;
    }
    match keys::controller_ref(&p.metadata) {
        None => true,
        Some(r) => {
            (gone || is_deleting(&p.metadata))
                && resolve_job(r, job_named).is_none_or(|j| j.finished)
        }
    }
}

/// The orphan worker's decision for a cached pod (upstream's `syncOrphanPod`): remove the
/// tracking finalizer unless the pod is controlled by something other than a batch/v1 Job, or
/// by a Job that exists and has not finished (it was adopted; that Job's sync releases it).
pub fn plan_orphan(p: &SlimPod, job_named: &dyn Fn(&str) -> Option<JobRef>) -> Option<Write> {
    if !has_finalizer(p) {
        return None;
    }
    if let Some(r) = keys::controller_ref(&p.metadata) {
        if r.kind != "Job" || r.api_version != "batch/v1" {
            return None;
        }
        if resolve_job(r, job_named).is_some_and(|j| !j.finished) {
            return None;
        }
    }
    Some(Write::patch(
        Res::Pods,
        &p.namespace().unwrap_or_default(),
        &p.name_any(),
        remove_finalizer_patch(p),
    ))
}

fn job_lookup(jobs: &Store<Job>, ns: &str) -> impl Fn(&str) -> Option<JobRef> {
    let (jobs, ns) = (jobs.clone(), ns.to_string());
    move |name: &str| {
        ObjectKey::new(ns.as_str(), name)
            .get(&jobs)
            .map(|j| JobRef {
                uid: j.uid().unwrap_or_default(),
                finished: j.status.as_ref().is_some_and(finished),
            })
    }
}

/// Releases the tracking finalizer of orphan pods, one pod key at a time.
pub struct OrphanPods {
    client: kube::Client,
    jobs: Store<Job>,
    pods: Store<SlimPod>,
}

impl Reconciler for OrphanPods {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "job-controller-orphan-pods"
    }
    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, kube::Error> {
        let Some(p) = key.get(&self.pods) else {
            return Ok(Action::Done);
        };
        if let Some(w) = plan_orphan(&p, &job_lookup(&self.jobs, &key.namespace)) {
            common::exec(&self.client, w).await?;
        }
        Ok(Action::Done)
    }
}

// ---- the reconciler ----

pub struct JobController {
    client: kube::Client,
    jobs: Store<Job>,
    pods: Store<SlimPod>,
    expect: Expectations,
}

impl Reconciler for JobController {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "job-controller"
    }
    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, kube::Error> {
        let Some(job) = key.get(&self.jobs) else {
            // The Job is gone: release its pods' finalizers (upstream's orphan cleanup).
            let orphans: Vec<Write> = self
                .pods
                .state()
                .iter()
                .filter(|p| {
                    p.namespace().as_deref() == Some(key.namespace.as_str())
                        && has_finalizer(p)
                        && keys::controller_ref(&p.metadata)
                            .is_some_and(|r| r.kind == "Job" && r.name == key.name)
                })
                .map(|p| {
                    Write::patch(
                        Res::Pods,
                        &key.namespace,
                        &p.name_any(),
                        remove_finalizer_patch(p),
                    )
                })
                .collect();
            runtime::execute_all(orphans, |w| common::exec(&self.client, w))
                .await
                .map_err(|e| e.first)?;
            return Ok(Action::Done);
        };
        let uid = job.uid().unwrap_or_default();
        let all = self.pods.state();
        let candidates: Vec<&SlimPod> = all
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| p.namespace() == job.namespace())
            .collect();
        let claimed = claim(&job, &candidates);
        if !common::exec_claim(&self.client, Res::Jobs, &job.metadata, claimed.writes).await? {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let pods: Vec<&SlimPod> = claimed.owned.iter().collect();
        let present: HashSet<String> = pods.iter().map(|p| p.name_any()).collect();
        if !self.expect.satisfied(&uid, &present) {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let plan = plan(&job, &pods, common::now_secs());
        let unnamed = plan
            .writes
            .iter()
            .filter(|w| matches!(w.op, common::Op::Create(_)) && w.created_name().is_none())
            .count();
        let has_status = plan.writes.first().is_some_and(|w| {
            w.res == Res::Jobs && matches!(&w.op, common::Op::Patch { status: true, .. })
        });
        // The status write goes alone first (pods are released only after it succeeds).
        let mut writes = plan.writes;
        if has_status {
            let st = writes.remove(0);
            common::exec(&self.client, st).await?;
        }
        let done: Vec<Done> = common::exec_in_order(&self.client, Vec::new(), writes).await?;
        self.expect.record(&uid, &done, unnamed);
        Ok(common::requeue(plan.requeue_after))
    }
}

pub async fn run(client: kube::Client, informers: runtime::Informers, stop: CancellationToken) {
    let queue: Arc<WorkQueue<ObjectKey>> = Arc::default();
    let q = queue.clone();
    let jobs = runtime::reflect(
        Api::<Job>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                q.add(ObjectKey::of(o));
            }
        },
    );
    let pods = common::reflect_pods_for(&informers, &queue, jobs.clone(), |s: &Job, l| {
        s.spec
            .as_ref()
            .and_then(|x| x.selector.as_ref())
            .is_some_and(|sel| common::selects(sel, l))
    });
    let orphans: Arc<WorkQueue<ObjectKey>> = Arc::default();
    {
        let (q, jobs) = (orphans.clone(), jobs.clone());
        informers.pods().subscribe(move |ch| {
            let (p, gone) = match (ch.new, ch.old) {
                (Some(p), _) => (p, false),
                (None, Some(p)) => (p, true),
                (None, None) => return,
            };
            let ns = p.namespace().unwrap_or_default();
            if orphan_needs_release(p, gone, &job_lookup(&jobs, &ns)) {
                q.add(ObjectKey::of(p));
            }
        });
    }
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = async { let _ = jobs.wait_until_ready().await; informers.pods().wait_synced(&stop).await; } => {}
    }
    let orphan_worker = Arc::new(OrphanPods {
        client: client.clone(),
        jobs: jobs.clone(),
        pods: pods.clone(),
    });
    let ctl = Arc::new(JobController {
        client,
        jobs,
        pods,
        expect: Expectations::default(),
    });
    tokio::join!(
        runtime::worker::run(ctl, queue, 4, stop.clone()),
        runtime::worker::run(orphan_worker, orphans, 1, stop),
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn job(spec: Value, status: Value) -> Job {
        let mut s = json!({"template": {"metadata": {"labels": {"app": "pi"}}, "spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}},
            "completions": 1, "parallelism": 1, "backoffLimit": 6, "completionMode": "NonIndexed"});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        serde_json::from_value(
            json!({"metadata": {"name": "pi", "namespace": "d", "uid": "ju"},
            "spec": s, "status": status}),
        )
        .unwrap()
    }

    fn pod(name: &str, phase: &str, exit: Option<i32>, finalizer: bool) -> SlimPod {
        let mut p = json!({"metadata": {"name": name, "namespace": "d", "uid": format!("u-{name}"),
            "resourceVersion": "5",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "pi", "uid": "ju", "controller": true}]},
            "status": {"phase": phase}});
        if finalizer {
            p["metadata"]["finalizers"] = json!([JOB_TRACKING_FINALIZER]);
        }
        if let Some(code) = exit {
            p["status"]["containerStatuses"] = json!([{"name": "c", "image": "busybox", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": code, "finishedAt": rfc3339(NOW - 5)}}}]);
        }
        serde_json::from_value(p).unwrap()
    }

    fn creates(p: &Plan) -> usize {
        p.writes
            .iter()
            .filter(|w| matches!(w.op, common::Op::Create(_)))
            .count()
    }

    fn status_of(p: &Plan) -> Option<Value> {
        p.writes.iter().find_map(|w| match &w.op {
            common::Op::Patch {
                patch,
                status: true,
                ..
            } => Some(patch["status"].clone()),
            _ => None,
        })
    }

    #[test]
    fn new_job_creates_pods_and_start_time() {
        let j = job(json!({"completions": 3, "parallelism": 2}), json!({}));
        let p = plan(&j, &[], NOW);
        assert_eq!(creates(&p), 2);
        let st = status_of(&p).unwrap();
        assert_eq!(st["startTime"], json!(rfc3339(NOW)));
        let pod = p
            .writes
            .iter()
            .find_map(|w| match &w.op {
                common::Op::Create(v) => Some(v.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(pod["metadata"]["generateName"], json!("pi-"));
        assert_eq!(
            pod["metadata"]["finalizers"],
            json!([JOB_TRACKING_FINALIZER])
        );
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], json!("Job"));
    }

    #[test]
    fn success_is_counted_then_released_then_complete() {
        let j = job(
            json!({}),
            json!({"startTime": rfc3339(NOW - 60), "active": 1}),
        );
        let done = pod("pi-a", "Succeeded", Some(0), true);
        // 1: counted, listed as uncounted, Complete.
        let p = plan(&j, &[&done], NOW);
        let st = status_of(&p).unwrap();
        assert_eq!(st["succeeded"], json!(1));
        assert_eq!(
            st["uncountedTerminatedPods"]["succeeded"],
            json!(["u-pi-a"])
        );
        let types: Vec<_> = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].clone())
            .collect();
        assert_eq!(types, vec![json!("SuccessCriteriaMet"), json!("Complete")]);
        assert!(st["completionTime"].is_string());
        // 2: the Job is finished: the finalizer is removed.
        let mut j2 = j.clone();
        j2.status = Some(serde_json::from_value(st).unwrap());
        let p = plan(&j2, &[&done], NOW);
        assert_eq!(p.writes.len(), 1);
        assert!(
            matches!(&p.writes[0].op, common::Op::Patch { status: false, patch, .. } if patch["metadata"]["finalizers"].is_null())
        );
    }

    #[test]
    fn backoff_limit_exceeded() {
        let j = job(
            json!({"backoffLimit": 1}),
            json!({"startTime": rfc3339(NOW - 60), "failed": 1}),
        );
        let f = pod("pi-b", "Failed", Some(1), true);
        let running = pod("pi-c", "Running", None, true);
        let p = plan(&j, &[&f, &running], NOW);
        let st = status_of(&p).unwrap();
        assert_eq!(st["failed"], json!(2));
        let failed = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Failed")
            .unwrap()
            .clone();
        assert_eq!(failed["reason"], json!("BackoffLimitExceeded"));
        assert_eq!(
            failed["message"],
            json!("Job has reached the specified backoff limit")
        );
        assert!(
            p.writes
                .iter()
                .any(|w| matches!(&w.op, common::Op::Delete { name, .. } if name == "pi-c"))
        );
        assert_eq!(creates(&p), 0);
    }

    #[test]
    fn failure_backoff_delays_the_replacement() {
        // One failure 5 s ago, counted already: the replacement waits 10 s after it.
        let j = job(
            json!({}),
            json!({"startTime": rfc3339(NOW - 60), "failed": 1}),
        );
        let f = pod("pi-b", "Failed", Some(1), false);
        let p = plan(&j, &[&f], NOW);
        assert_eq!(creates(&p), 0);
        assert_eq!(p.requeue_after, Some(5));
        let p = plan(&j, &[&f], NOW + 5);
        assert_eq!(creates(&p), 1);
    }

    #[test]
    fn deadline_and_pod_failure_policy() {
        let j = job(
            json!({"activeDeadlineSeconds": 30}),
            json!({"startTime": rfc3339(NOW - 10)}),
        );
        let r = pod("pi-r", "Running", None, true);
        assert_eq!(plan(&j, &[&r], NOW).requeue_after, Some(20));
        let st = status_of(&plan(&j, &[&r], NOW + 15)).unwrap_or(json!({}));
        assert!(st["conditions"].as_array().is_none_or(|c| c.is_empty()));
        let st = status_of(&plan(&j, &[&r], NOW + 20)).unwrap();
        assert!(
            st["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["reason"] == "DeadlineExceeded")
        );

        let pfp = json!({"podFailurePolicy": {"rules": [
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [2]}},
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}});
        let j = job(pfp, json!({"startTime": rfc3339(NOW - 10)}));
        let ignored = pod("pi-i", "Failed", Some(2), true);
        let st = status_of(&plan(&j, &[&ignored], NOW)).unwrap();
        assert_eq!(st["failed"], json!(0));
        let fatal = pod("pi-f", "Failed", Some(42), true);
        let st = status_of(&plan(&j, &[&fatal], NOW)).unwrap();
        let c = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Failed")
            .unwrap()
            .clone();
        assert_eq!(c["reason"], json!("PodFailurePolicy"));
        assert_eq!(
            c["message"],
            json!(
                "Container c for pod d/pi-f failed with exit code 42 matching FailJob rule at index 1"
            )
        );
    }

    #[test]
    fn indexed_mode() {
        let j = job(
            json!({"completionMode": "Indexed", "completions": 3, "parallelism": 3}),
            json!({"startTime": rfc3339(NOW - 10), "completedIndexes": "1"}),
        );
        let p = plan(&j, &[], NOW);
        let names: Vec<_> = p
            .writes
            .iter()
            .filter_map(|w| match &w.op {
                common::Op::Create(v) => Some(v["metadata"]["generateName"].clone()),
                _ => None,
            })
            .collect();
        assert_eq!(names, vec![json!("pi-0-"), json!("pi-2-")]);
        assert_eq!(
            format_indexes(&[0, 1, 2, 4, 6, 7].into_iter().collect()),
            "0-2,4,6-7"
        );
        assert_eq!(parse_indexes("0-2,4"), [0, 1, 2, 4].into_iter().collect());
    }

    #[test]
    fn ttl_after_finished() {
        let st = json!({"completionTime": rfc3339(NOW - 10), "conditions": [{"type": "Complete", "status": "True"}]});
        let j = job(json!({"ttlSecondsAfterFinished": 100}), st.clone());
        assert_eq!(plan(&j, &[], NOW).requeue_after, Some(90));
        let j = job(json!({"ttlSecondsAfterFinished": 5}), st);
        let p = plan(&j, &[], NOW);
        assert!(matches!(
            &p.writes[0],
            Write {
                res: Res::Jobs,
                op: common::Op::Delete { .. },
                ..
            }
        ));
    }

    #[test]
    fn claims_with_the_tracking_finalizer() {
        let j = job(
            json!({"selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "ju"}}}),
            json!({}),
        );
        let lab = json!({"batch.kubernetes.io/controller-uid": "ju"});
        let mk = |name: &str, labels: Value, owned: bool, phase: &str| {
            let mut p = serde_json::to_value(pod(name, phase, None, owned)).unwrap();
            p["metadata"]["labels"] = labels;
            if !owned {
                p["metadata"]["ownerReferences"] = Value::Null;
            }
            serde_json::from_value::<SlimPod>(p).unwrap()
        };
        let pods = [
            mk("a", lab.clone(), true, "Running"),
            mk("b", lab.clone(), false, "Running"),
            mk("c", json!({"x": "y"}), true, "Running"),
            mk("d", lab.clone(), false, "Succeeded"),
            mk("e", json!({"x": "y"}), false, "Running"),
        ];
        let refs: Vec<&SlimPod> = pods.iter().collect();
        let plan = claim(&j, &refs);
        assert_eq!(
            common::claim_outcomes(&plan, &["a", "b", "c", "d", "e"], "ju"),
            ["a=owned", "b=adopt", "c=release", "d=adopt", "e=-"]
        );
        let patch_of = |n: &str| {
            plan.writes
                .iter()
                .find_map(|w| match &w.op {
                    common::Op::Patch { name, patch, .. } if name == n => Some(patch.clone()),
                    _ => None,
                })
                .unwrap()
        };
        // Adoption adds the tracking finalizer; release removes it with the reference.
        assert_eq!(
            patch_of("b")["metadata"]["finalizers"],
            json!([JOB_TRACKING_FINALIZER])
        );
        assert_eq!(patch_of("c")["metadata"]["finalizers"], Value::Null);
        assert_eq!(patch_of("c")["metadata"]["ownerReferences"], Value::Null);
        assert!(
            plan.owned
                .iter()
                .filter(|p| p.name_any() == "b")
                .all(has_finalizer)
        );
        // A Job without a selector claims nothing new.
        let bare = job(json!({}), json!({}));
        let plan = claim(&bare, &refs);
        assert_eq!(
            common::claim_outcomes(&plan, &["a", "b"], "ju"),
            ["a=release", "b=-"]
        );
    }

    #[test]
    fn orphan_pods_lose_the_tracking_finalizer() {
        // (case, controller reference (kind, apiVersion, uid), deleting, gone, job "pi" in the
        //  cache (uid, finished), finalizer) -> (enqueued, released)
        type Owner = Option<(&'static str, &'static str, &'static str)>;
        let job_ref = Some(("Job", "batch/v1", "ju"));
        type Case = (
            &'static str,
            Owner,
            bool,
            bool,
            Option<(&'static str, bool)>,
            bool,
            (bool, bool),
        );
        let cases: Vec<Case> = vec![
            (
                "orphaned by the collector",
                None,
                false,
                false,
                Some(("ju", false)),
                true,
                (true, true),
            ),
            (
                "orphan being deleted",
                None,
                true,
                false,
                None,
                true,
                (true, true),
            ),
            (
                "orphan without the finalizer",
                None,
                true,
                false,
                None,
                false,
                (false, false),
            ),
            (
                "running pod of a live Job",
                job_ref,
                false,
                false,
                Some(("ju", false)),
                true,
                (false, false),
            ),
            (
                "deleted pod of a live Job: its sync counts it",
                job_ref,
                true,
                false,
                Some(("ju", false)),
                true,
                (false, false),
            ),
            (
                "deleted pod, Job gone",
                job_ref,
                true,
                false,
                None,
                true,
                (true, true),
            ),
            (
                "delete event, Job gone",
                job_ref,
                false,
                true,
                None,
                true,
                (true, true),
            ),
            (
                "deleted pod, Job finished",
                job_ref,
                true,
                false,
                Some(("ju", true)),
                true,
                (true, true),
            ),
            (
                "deleted pod, Job replaced (other uid)",
                job_ref,
                true,
                false,
                Some(("other", false)),
                true,
                (true, true),
            ),
            (
                "live pod, Job not cached yet: wait",
                job_ref,
                false,
                false,
                None,
                true,
                (false, true),
            ),
            (
                "controlled by a ReplicaSet",
                Some(("ReplicaSet", "apps/v1", "ju")),
                true,
                false,
                None,
                true,
                (true, false),
            ),
            (
                "controlled by another group's Job",
                Some(("Job", "example.com/v1", "ju")),
                true,
                false,
                None,
                true,
                (true, false),
            ),
        ];
        for (case, owner, deleting, gone, cached, fin, (enqueued, released)) in cases {
            let mut p = serde_json::to_value(pod("pi-x", "Failed", None, fin)).unwrap();
            p["metadata"]["ownerReferences"] = match owner {
                Some((kind, av, uid)) => json!([{"apiVersion": av, "kind": kind, "name": "pi",
                    "uid": uid, "controller": true}]),
                None => {
                    json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "c"}])
                }
            };
            if deleting {
                p["metadata"]["deletionTimestamp"] = json!(rfc3339(NOW));
            }
            let p: SlimPod = serde_json::from_value(p).unwrap();
            let lookup = |name: &str| {
                cached
                    .filter(|_| name == "pi")
                    .map(|(uid, finished)| JobRef {
                        uid: uid.to_string(),
                        finished,
                    })
            };
            assert_eq!(
                orphan_needs_release(&p, gone, &lookup),
                enqueued,
                "{case}: enqueued"
            );
            let w = plan_orphan(&p, &lookup);
            assert_eq!(w.is_some(), released, "{case}: released");
            if let Some(w) = w {
                assert_eq!(
                    w,
                    Write::patch(
                        Res::Pods,
                        "d",
                        "pi-x",
                        json!({"metadata": {"finalizers": null, "resourceVersion": "5"}})
                    ),
                    "{case}"
                );
            }
        }
    }
}
