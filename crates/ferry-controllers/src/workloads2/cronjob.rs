//! The CronJob controller (`pkg/controller/cronjob`, v2): a pure planner [`plan`] from a CronJob,
//! the Jobs it owns, the clock and the controller's time zone, to writes and the next wake-up.
//!
//! Jobs are named `<cronjob>-<scheduled time in minutes since the epoch>` and annotated with
//! `batch.kubernetes.io/cronjob-scheduled-timestamp`, as upstream; the deterministic name makes
//! a repeated create harmless.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::common::{self, Res, Write};
use super::job::finished;
use crate::runtime::{self, Action, ObjectKey, Reconciler, WorkQueue, keys};

pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// Upstream warns when more than this many start times were missed.
pub const TOO_MANY_MISSED: usize = 100;

#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub writes: Vec<Write>,
    /// Seconds until the next look (the next schedule time).
    pub requeue_after: Option<f64>,
    /// Why nothing was created, for an event or a log line.
    pub note: Option<String>,
    /// Events about the CronJob, as upstream's: (type, reason, message).
    pub events: Vec<(&'static str, &'static str, String)>,
}

/// A `spec.timeZone` the time zone database does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown time zone {0}")]
struct UnknownTimeZone(String);

/// The schedule's time zone: `spec.timeZone`, else the controller's.
fn zone_of(cj: &CronJob, local: &TimeZone) -> Result<TimeZone, UnknownTimeZone> {
    match cj.spec.time_zone.as_deref() {
        Some(tz) => TimeZone::get(tz).map_err(|_| UnknownTimeZone(tz.to_string())),
        None => Ok(local.clone()),
    }
}

fn ts(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Timestamp {
    t.0
}

/// The most recent schedule time in `(earliest, now]` and how many were missed, as upstream's
/// `mostRecentScheduleTime`.
pub fn most_recent(
    sched: &ferry_api::cron::Schedule,
    earliest: Timestamp,
    now: Timestamp,
    zone: &TimeZone,
) -> (Option<Timestamp>, usize) {
    let mut t = earliest;
    let mut last = None;
    let mut missed = 0usize;
    while let Some(n) = sched.next(t, zone) {
        if n > now {
            break;
        }
        last = Some(n);
        missed += 1;
        t = n;
        if missed > 100_000 {
            break;
        }
    }
    (last, missed)
}

fn job_name(cj: &CronJob, scheduled: Timestamp) -> String {
    format!("{}-{}", cj.name_any(), scheduled.as_second().div_euclid(60))
}

fn object_ref(j: &Job) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "name": j.name_any(),
        "namespace": j.namespace(), "uid": j.uid(), "resourceVersion": j.resource_version()})
}

/// The Job for one scheduled time.
pub fn new_job(cj: &CronJob, scheduled: Timestamp, zone: &TimeZone) -> Value {
    let tmpl = &cj.spec.job_template;
    let meta = tmpl.metadata.clone().unwrap_or_default();
    let mut m = json!({
        "name": job_name(cj, scheduled),
        "namespace": cj.namespace(),
        "ownerReferences": [common::controller_ref("batch/v1", "CronJob", &cj.metadata)],
    });
    if let Some(l) = meta.labels {
        m["labels"] = json!(l);
    }
    let mut ann = meta.annotations.unwrap_or_default();
    ann.insert(
        SCHEDULED_TIMESTAMP.to_string(),
        scheduled
            .to_zoned(zone.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
            .replace("+00:00", "Z"),
    );
    m["annotations"] = json!(ann);
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": m,
        "spec": serde_json::to_value(tmpl.spec.clone().unwrap_or_default()).unwrap_or(json!({}))})
}

fn job_failed(j: &Job) -> bool {
    j.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Failed" && c.status == "True")
}

/// Plans one sync of `cj` with the Jobs it owns.
pub fn plan(cj: &CronJob, jobs: &[&Job], now: Timestamp, local: &TimeZone) -> Plan {
    let mut out = Plan::default();
    let ns = cj.namespace().unwrap_or_default();
    let name = cj.name_any();
    let st = cj.status.clone().unwrap_or_default();
    let spec = &cj.spec;

    // Active list and last successful time from the Jobs.
    let mut active: Vec<&Job> = jobs
        .iter()
        .copied()
        .filter(|j| !finished(&j.status.clone().unwrap_or_default()))
        .collect();
    let mut last_success = st.last_successful_time.as_ref().map(ts);
    for j in jobs {
        let js = j.status.clone().unwrap_or_default();
        if finished(&js)
            && !job_failed(j)
            && let Some(c) = js.completion_time.as_ref().map(ts)
            && last_success.is_none_or(|l| c > l)
        {
            last_success = Some(c);
        }
    }
    let mut last_schedule = st.last_schedule_time.as_ref().map(ts);
    // A Job the status still lists as active has finished (upstream's SawCompletedJob).
    for j in jobs {
        let js = j.status.clone().unwrap_or_default();
        let listed = st.active.iter().flatten().any(|r| {
            r.name.as_deref() == j.metadata.name.as_deref()
                && (r.uid.is_none() || r.uid.as_deref() == j.metadata.uid.as_deref())
        });
        if listed && finished(&js) {
            let cond = if job_failed(j) { "Failed" } else { "Complete" };
            out.events.push((
                "Normal",
                "SawCompletedJob",
                format!("Saw completed job: {}, condition: {cond}", j.name_any()),
            ));
        }
    }

    let mut created = false;
    if cj.metadata.deletion_timestamp.is_none() {
        let parsed = ferry_api::cron::parse(&spec.schedule);
        let zone = zone_of(cj, local);
        match (parsed, zone) {
            (Err(e), _) => {
                out.note = Some(format!("unparseable schedule: {:?} : {e}", spec.schedule))
            }
            (_, Err(e)) => out.note = Some(e.to_string()),
            (Ok(sched), Ok(zone)) => {
                let created_at = cj
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(ts)
                    .unwrap_or(now);
                let mut earliest = last_schedule.unwrap_or(created_at);
                if let Some(sds) = spec.starting_deadline_seconds {
                    let deadline = now - jiff::SignedDuration::from_secs(sds);
                    if deadline > earliest {
                        earliest = deadline;
                    }
                }
                let next = sched.next(now, &zone);
                out.requeue_after =
                    next.map(|n| (n.as_millisecond() - now.as_millisecond()) as f64 / 1000.0 + 0.1);
                if spec.suspend == Some(true) {
                    out.note = Some("suspended".into());
                } else {
                    let (recent, missed) = most_recent(&sched, earliest, now, &zone);
                    if missed > TOO_MANY_MISSED {
                        out.note = Some(format!(
                            "too many missed start times ({missed}); check clock skew"
                        ));
                    }
                    if let Some(t) = recent {
                        let too_late = spec
                            .starting_deadline_seconds
                            .is_some_and(|sds| t + jiff::SignedDuration::from_secs(sds) < now);
                        let jname = job_name(cj, t);
                        let exists = jobs.iter().any(|j| j.name_any() == jname);
                        let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
                        if too_late {
                            out.note = Some(format!("missed scheduled time to start a job: {t}"));
                            out.events.push((
                                "Warning",
                                "MissSchedule",
                                format!(
                                    "Missed scheduled time to start a job: {}",
                                    t.strftime("%a, %d %b %Y %H:%M:%S %z")
                                ),
                            ));
                        } else if exists {
                            // Already started for this time (a status read from a lagging
                            // cache must not take lastScheduleTime back).
                            if last_schedule.is_none_or(|l| l < t) {
                                last_schedule = Some(t);
                            }
                        } else if policy == "Forbid" && !active.is_empty() {
                            out.note = Some(
                                "forbidden by concurrencyPolicy Forbid: a job is still active"
                                    .into(),
                            );
                            out.events.push((
                                "Normal",
                                "JobAlreadyActive",
                                "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
                            ));
                        } else {
                            if policy == "Replace" {
                                for j in &active {
                                    out.writes.push(Write::delete_background(
                                        Res::Jobs,
                                        &ns,
                                        &j.name_any(),
                                        j.uid().as_deref(),
                                    ));
                                }
                                active.clear();
                            }
                            out.writes
                                .push(Write::create(Res::Jobs, &ns, new_job(cj, t, &zone)));
                            out.events.push((
                                "Normal",
                                "SuccessfulCreate",
                                format!("Created job {jname}"),
                            ));
                            last_schedule = Some(t);
                            created = true;
                        }
                    }
                }
            }
        }
    }

    // History limits: the oldest finished Jobs beyond the limits go (background propagation).
    let mut succeeded: Vec<&Job> = jobs
        .iter()
        .copied()
        .filter(|j| finished(&j.status.clone().unwrap_or_default()) && !job_failed(j))
        .collect();
    let mut failed: Vec<&Job> = jobs.iter().copied().filter(|j| job_failed(j)).collect();
    for (list, limit) in [
        (&mut succeeded, spec.successful_jobs_history_limit),
        (&mut failed, spec.failed_jobs_history_limit),
    ] {
        let Some(limit) = limit else { continue };
        list.sort_by_key(|j| {
            j.status
                .as_ref()
                .and_then(|s| s.start_time.as_ref().map(ts))
                .or_else(|| j.creation_timestamp().map(|t| t.0))
        });
        let extra = list.len().saturating_sub(limit.max(0) as usize);
        for j in list.iter().take(extra) {
            out.events.push((
                "Normal",
                "SuccessfulDelete",
                format!("Deleted job {}", j.name_any()),
            ));
            out.writes.push(Write::delete_background(
                Res::Jobs,
                &ns,
                &j.name_any(),
                j.uid().as_deref(),
            ));
        }
    }

    // Status.
    let mut active_refs: Vec<Value> = active.iter().map(|j| object_ref(j)).collect();
    if created && let Some(t) = last_schedule {
        let jname = job_name(cj, t);
        active_refs
            .push(json!({"apiVersion": "batch/v1", "kind": "Job", "name": jname, "namespace": ns}));
    }
    let status = json!({
        "active": if active_refs.is_empty() { Value::Null } else { json!(active_refs) },
        "lastScheduleTime": last_schedule.map(|t| common::rfc3339(t.as_second())),
        "lastSuccessfulTime": last_success.map(|t| common::rfc3339(t.as_second())),
    });
    let before_names: Vec<String> = st
        .active
        .iter()
        .flatten()
        .map(|r| r.name.clone().unwrap_or_default())
        .collect();
    let after_names: Vec<String> = active_refs
        .iter()
        .map(|r| r["name"].as_str().unwrap_or("").to_string())
        .collect();
    let changed = before_names != after_names
        || st.last_schedule_time.as_ref().map(|t| t.0.as_second())
            != last_schedule.map(|t| t.as_second())
        || st.last_successful_time.as_ref().map(|t| t.0.as_second())
            != last_success.map(|t| t.as_second());
    if changed {
        out.writes
            .push(Write::status(Res::CronJobs, &ns, &name, status));
    }
    out
}

/// Upstream's `getJobsToBeReconciled`: a CronJob never adopts Jobs; it reconciles the Jobs
/// whose controller reference names it (by name, as upstream, so Jobs a same-named
/// predecessor left behind are counted too), whatever their labels.
pub fn is_its_job(
    cronjob: &str,
    job: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    crate::runtime::keys::controller_ref(job)
        .is_some_and(|r| r.kind == "CronJob" && r.name == cronjob)
}

// ---- the reconciler ----

pub struct CronJobController {
    client: kube::Client,
    cronjobs: Store<CronJob>,
    jobs: Store<Job>,
    zone: TimeZone,
}

impl Reconciler for CronJobController {
    type Key = ObjectKey;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        "cronjob-controller"
    }
    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, kube::Error> {
        let Some(cj) = key.get(&self.cronjobs) else {
            return Ok(Action::Done);
        };
        let all = self.jobs.state();
        let jobs: Vec<&Job> = all
            .iter()
            .map(|j| j.as_ref())
            .filter(|j| j.namespace() == cj.namespace() && is_its_job(&cj.name_any(), &j.metadata))
            .collect();
        let plan = plan(&cj, &jobs, Timestamp::now(), &self.zone);
        if let Some(n) = &plan.note {
            tracing::debug!(cronjob = %key, "{n}");
        }
        for (type_, reason, message) in &plan.events {
            crate::lifecycle::events::record(
                &self.client,
                crate::lifecycle::events::reference(cj.as_ref()),
                type_,
                reason,
                message.clone(),
                "cronjob-controller",
            );
        }
        runtime::execute_all(plan.writes, |w| common::exec(&self.client, w))
            .await
            .map_err(|e| e.first)?;
        Ok(match plan.requeue_after {
            Some(s) => Action::RequeueAfter(Duration::from_secs_f64(s.max(0.1))),
            None => Action::Done,
        })
    }
}

pub async fn run(client: kube::Client, stop: CancellationToken) {
    let queue: Arc<WorkQueue<ObjectKey>> = Arc::default();
    let q = queue.clone();
    let cronjobs = runtime::reflect(
        Api::<CronJob>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                q.add(ObjectKey::of(o));
            }
        },
    );
    let q = queue.clone();
    let jobs = runtime::reflect(
        Api::<Job>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |ch| {
            for o in ch.objects() {
                if let Some(k) = keys::controller_key::<CronJob>(&o.metadata) {
                    q.add(k);
                }
            }
        },
    );
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = async { let _ = cronjobs.wait_until_ready().await; let _ = jobs.wait_until_ready().await; } => {}
    }
    let ctl = Arc::new(CronJobController {
        client,
        cronjobs,
        jobs,
        zone: TimeZone::system(),
    });
    runtime::worker::run(ctl, queue, 2, stop).await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn cj(spec: Value, status: Value) -> CronJob {
        let mut s = json!({"schedule": "*/1 * * * *", "concurrencyPolicy": "Allow", "suspend": false,
            "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1,
            "jobTemplate": {"metadata": {"labels": {"app": "x"}}, "spec": {"template": {"spec": {
                "restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox"}]}}}}});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        serde_json::from_value(
            json!({"metadata": {"name": "hello", "namespace": "d", "uid": "cu",
            "creationTimestamp": "2026-01-01T00:00:10Z"}, "spec": s, "status": status}),
        )
        .unwrap()
    }

    fn job(name: &str, status: Value) -> Job {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "d", "uid": format!("u-{name}"),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "hello", "uid": "cu", "controller": true}]},
            "spec": {"template": {}}, "status": status}))
        .unwrap()
    }

    fn created(p: &Plan) -> Vec<Value> {
        p.writes
            .iter()
            .filter_map(|w| match &w.op {
                common::Op::Create(v) => Some(v.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn fires_once_per_schedule_time() {
        let utc = TimeZone::UTC;
        let c = cj(json!({}), json!({}));
        // Before the first minute: nothing, wake at 00:01.
        let p = plan(&c, &[], t("2026-01-01T00:00:30Z"), &utc);
        assert!(created(&p).is_empty());
        assert!((p.requeue_after.unwrap() - 30.1).abs() < 0.01);
        // At 00:01:02: the 00:01 Job.
        let p = plan(&c, &[], t("2026-01-01T00:01:02Z"), &utc);
        let jobs = created(&p);
        assert_eq!(jobs.len(), 1);
        let minutes = t("2026-01-01T00:01:00Z").as_second() / 60;
        assert_eq!(
            jobs[0]["metadata"]["name"],
            json!(format!("hello-{minutes}"))
        );
        assert_eq!(
            jobs[0]["metadata"]["annotations"][SCHEDULED_TIMESTAMP],
            json!("2026-01-01T00:01:00Z")
        );
        assert_eq!(jobs[0]["metadata"]["labels"]["app"], json!("x"));
        assert_eq!(
            jobs[0]["metadata"]["ownerReferences"][0]["kind"],
            json!("CronJob")
        );
        let st = p
            .writes
            .iter()
            .find_map(|w| match &w.op {
                common::Op::Patch {
                    patch,
                    status: true,
                    ..
                } => Some(patch["status"].clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(st["lastScheduleTime"], json!("2026-01-01T00:01:00Z"));
        // Once recorded, no second Job for that minute.
        let c2 = cj(
            json!({}),
            json!({"lastScheduleTime": "2026-01-01T00:01:00Z"}),
        );
        assert!(created(&plan(&c2, &[], t("2026-01-01T00:01:30Z"), &utc)).is_empty());
    }

    #[test]
    fn concurrency_deadline_suspend_history() {
        let utc = TimeZone::UTC;
        let running = job("hello-1", json!({"active": 1}));
        let st = json!({"lastScheduleTime": "2026-01-01T00:01:00Z"});
        let now = t("2026-01-01T00:02:05Z");
        let forbid = cj(json!({"concurrencyPolicy": "Forbid"}), st.clone());
        assert!(created(&plan(&forbid, &[&running], now, &utc)).is_empty());
        let replace = cj(json!({"concurrencyPolicy": "Replace"}), st.clone());
        let p = plan(&replace, &[&running], now, &utc);
        assert_eq!(created(&p).len(), 1);
        assert!(
            p.writes
                .iter()
                .any(|w| matches!(&w.op, common::Op::Delete { name, .. } if name == "hello-1"))
        );
        let allow = cj(json!({}), st.clone());
        assert_eq!(created(&plan(&allow, &[&running], now, &utc)).len(), 1);
        // startingDeadlineSeconds: 00:02 is 15 s ago, more than 10 s: missed.
        let late = cj(json!({"startingDeadlineSeconds": 10}), st.clone());
        assert!(created(&plan(&late, &[], t("2026-01-01T00:02:15Z"), &utc)).is_empty());
        assert_eq!(created(&plan(&late, &[], now, &utc)).len(), 1);
        let suspended = cj(json!({"suspend": true}), st.clone());
        assert!(created(&plan(&suspended, &[], now, &utc)).is_empty());
        // Two successful Jobs with a limit of 1: the older goes.
        let done = |n: &str, start: &str| {
            job(
                n,
                json!({"startTime": start, "completionTime": start,
            "conditions": [{"type": "Complete", "status": "True"}]}),
            )
        };
        let a = done("hello-a", "2026-01-01T00:00:00Z");
        let b = done("hello-b", "2026-01-01T00:01:00Z");
        let lim = cj(
            json!({"successfulJobsHistoryLimit": 1}),
            json!({"lastScheduleTime": "2026-01-01T00:02:00Z"}),
        );
        let p = plan(&lim, &[&a, &b], t("2026-01-01T00:02:30Z"), &utc);
        let deleted: Vec<_> = p
            .writes
            .iter()
            .filter_map(|w| match &w.op {
                common::Op::Delete { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, vec!["hello-a".to_string()]);
    }

    #[test]
    fn time_zones() {
        // 09:00 in Tokyo is 00:00 UTC.
        let c = cj(
            json!({"schedule": "0 9 * * *", "timeZone": "Asia/Tokyo"}),
            json!({"lastScheduleTime": "2026-01-01T00:00:00Z"}),
        );
        let p = plan(&c, &[], t("2026-01-02T00:00:01Z"), &TimeZone::UTC);
        let jobs = created(&p);
        assert_eq!(jobs.len(), 1);
        assert_eq!(
            jobs[0]["metadata"]["annotations"][SCHEDULED_TIMESTAMP],
            json!("2026-01-02T09:00:00+09:00")
        );
        // The controller's zone applies without timeZone.
        let c = cj(
            json!({"schedule": "0 9 * * *"}),
            json!({"lastScheduleTime": "2026-01-01T09:00:00Z"}),
        );
        let tokyo = TimeZone::get("Asia/Tokyo").unwrap();
        assert_eq!(
            created(&plan(&c, &[], t("2026-01-02T00:00:01Z"), &tokyo)).len(),
            1
        );
        assert!(created(&plan(&c, &[], t("2026-01-02T00:00:01Z"), &TimeZone::UTC)).is_empty());
        let (last, missed) = most_recent(
            &ferry_api::cron::parse("*/1 * * * *").unwrap(),
            t("2026-01-01T00:00:00Z"),
            t("2026-01-01T03:00:30Z"),
            &TimeZone::UTC,
        );
        assert_eq!(last, Some(t("2026-01-01T03:00:00Z")));
        assert_eq!(missed, 180);
    }

    #[test]
    fn reconciles_jobs_by_controller_name_never_adopts() {
        let meta = |refs: Value| -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            serde_json::from_value(
                json!({"name": "j", "labels": {"app": "x"}, "ownerReferences": refs}),
            )
            .unwrap()
        };
        let r = |kind: &str, name: &str, controller: bool| {
            json!([{"apiVersion": "batch/v1", "kind": kind,
            "name": name, "uid": "any", "controller": controller}])
        };
        assert!(is_its_job("hello", &meta(r("CronJob", "hello", true))));
        assert!(!is_its_job("hello", &meta(r("CronJob", "other", true))));
        assert!(!is_its_job("hello", &meta(r("CronJob", "hello", false))));
        assert!(!is_its_job("hello", &meta(r("Deployment", "hello", true))));
        assert!(
            !is_its_job("hello", &meta(Value::Null)),
            "orphans are not adopted"
        );
    }

    #[test]
    fn events_as_upstream() {
        let utc = TimeZone::UTC;
        let reasons = |p: &Plan| p.events.iter().map(|e| e.1).collect::<Vec<_>>();
        let running = job("hello-1", json!({"active": 1}));
        let st = json!({"lastScheduleTime": "2026-01-01T00:01:00Z"});
        let now = t("2026-01-01T00:02:05Z");
        let forbid = cj(json!({"concurrencyPolicy": "Forbid"}), st.clone());
        assert_eq!(
            reasons(&plan(&forbid, &[&running], now, &utc)),
            ["JobAlreadyActive"]
        );
        let p = plan(&cj(json!({}), st.clone()), &[&running], now, &utc);
        assert_eq!(reasons(&p), ["SuccessfulCreate"]);
        assert!(
            p.events[0].2.starts_with("Created job hello-"),
            "{:?}",
            p.events
        );
        // A Job the status lists as active has completed.
        let listed = json!({"lastScheduleTime": "2026-01-01T00:01:00Z",
            "active": [{"apiVersion": "batch/v1", "kind": "Job", "name": "hello-1", "namespace": "d"}]});
        let done = job(
            "hello-1",
            json!({"succeeded": 1, "completionTime": "2026-01-01T00:01:30Z",
            "conditions": [{"type": "Complete", "status": "True"}]}),
        );
        let p = plan(
            &cj(json!({}), listed),
            &[&done],
            t("2026-01-01T00:01:40Z"),
            &utc,
        );
        assert_eq!(reasons(&p), ["SawCompletedJob"]);
        assert_eq!(
            p.events[0].2,
            "Saw completed job: hello-1, condition: Complete"
        );
    }
}
