//! The workload controllers of issue 16, on the controller runtime ([`crate::runtime`]): each is
//! a pure planner (`plan(state, now) -> writes`) plus a thin reconciler.
//!
//! - [`job`]: Jobs (completions, parallelism, backoff limit, deadline, pod failure policy,
//!   Indexed mode, `job-tracking` finalizers) and the TTL-after-finished controller.
//! - [`cronjob`]: CronJobs (cron schedules with time zones, concurrency policy, starting
//!   deadline, history limits, suspend).
//! - [`daemonset`]: DaemonSets (one pod per eligible node: nodeSelector, node affinity,
//!   taints and the default daemon tolerations; RollingUpdate with maxUnavailable/maxSurge).
//! - [`disruption`]: PodDisruptionBudget status (the eviction subresource reads it).
//! - [`statefulset`]: StatefulSets (ordinals, OrderedReady/Parallel, RollingUpdate with
//!   partition, OnDelete, ControllerRevisions, status).

pub mod common;
pub mod cronjob;
pub mod daemonset;
pub mod disruption;
pub mod job;
pub mod statefulset;

use tokio_util::sync::CancellationToken;

/// Runs every controller of this module until `stop`.
pub async fn run(
    client: kube::Client,
    informers: crate::runtime::Informers,
    stop: CancellationToken,
) {
    tokio::join!(
        job::run(client.clone(), informers.clone(), stop.clone()),
        cronjob::run(client.clone(), stop.clone()),
        statefulset::run(client.clone(), informers.clone(), stop.clone()),
        daemonset::run(client.clone(), informers.clone(), stop.clone()),
        disruption::run(client.clone(), informers, stop.clone()),
    );
}
