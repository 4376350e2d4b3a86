//! Leader election through a `coordination.k8s.io/v1` Lease, as kube-controller-manager does
//! (client-go's `leaderelection` with a `LeaseLock`).
//!
//! * Every candidate tries, every retry period, to acquire the Lease (`kube-system/ferry-controllers`
//!   by default): it takes it when the Lease does not exist, is released (empty holder) or has
//!   not changed for its `leaseDurationSeconds` *as observed locally* (the holder's clock is never
//!   compared with ours, as in client-go).
//! * The leader renews every retry period. If it could not renew for the renew deadline, it has
//!   lost: the work's token is cancelled, and once the work has stopped it becomes a candidate
//!   again.
//! * On shutdown the leader stops the work and releases the Lease (empty holder, duration 1 s) so
//!   that a standby takes over at once.
//!
//! Writes use the Lease's resourceVersion, so two candidates never both succeed. The decisions
//! are the pure functions [`decide`] and [`Observer`]; [`run_elected`] only feeds them.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::Result;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug, Clone)]
pub struct LeaderArgs {
    /// Elect a leader among `ferry controllers` processes through a Lease.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long a standby waits after the last observed renewal before taking the lease.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leading.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The Lease's name.
    #[arg(long, default_value = "ferry-controllers")]
    pub leader_elect_resource_name: String,
    /// The Lease's namespace.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
}

impl Default for LeaderArgs {
    fn default() -> Self {
        LeaderArgs {
            leader_elect: true,
            leader_elect_lease_duration: Duration::from_secs(15),
            leader_elect_renew_deadline: Duration::from_secs(10),
            leader_elect_retry_period: Duration::from_secs(2),
            leader_elect_resource_name: "ferry-controllers".into(),
            leader_elect_resource_namespace: "kube-system".into(),
        }
    }
}

/// A duration flag that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("duration {0:?}: missing unit")]
    MissingUnit(String),
    #[error("duration {0:?}: expected a number")]
    ExpectedNumber(String),
    #[error("duration {0:?}: bad number")]
    BadNumber(String),
    #[error("duration {input:?}: unknown unit {unit:?}")]
    UnknownUnit { input: String, unit: String },
}

/// Parses a Go-style duration: `15s`, `500ms`, `1m30s`, `2h`; a bare number means seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, DurationError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::MissingUnit(s.to_string()))?;
        if digits == 0 {
            return Err(DurationError::ExpectedNumber(s.to_string()));
        }
        let value: f64 = rest[..digits]
            .parse()
            .map_err(|_| DurationError::BadNumber(s.to_string()))?;
        let after = &rest[digits..];
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let unit = &after[..unit_len];
        let factor = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(DurationError::UnknownUnit {
                    input: s.to_string(),
                    unit: unit.to_string(),
                });
            }
        };
        total += Duration::from_secs_f64(value * factor);
        rest = &after[unit_len..];
    }
    Ok(total)
}

/// This process's identity in the Lease: `<hostname>_<random uuid>`.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "ferry".into());
    let r: u128 = rand::random();
    let hex = format!("{r:032x}");
    format!(
        "{host}_{}-{}-4{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// What a candidate or leader does with the Lease it just read.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// No Lease yet: create it with this spec.
    Create(LeaseSpec),
    /// Replace the spec (guarded by the resourceVersion read).
    Update(LeaseSpec),
    /// Someone else holds a valid lease.
    Wait,
}

/// Decides, for `identity`, given the Lease's current spec (`None` when absent) and whether the
/// current holder's lease has expired as observed locally.
pub fn decide(
    current: Option<&LeaseSpec>,
    identity: &str,
    now: jiff::Timestamp,
    expired: bool,
    lease_duration: Duration,
) -> Decision {
    let duration = i32::try_from(lease_duration.as_secs())
        .unwrap_or(i32::MAX)
        .max(1);
    let Some(spec) = current else {
        return Decision::Create(LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(duration),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(0),
            ..Default::default()
        });
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == identity {
        // Renew.
        return Decision::Update(LeaseSpec {
            renew_time: Some(MicroTime(now)),
            lease_duration_seconds: Some(duration),
            acquire_time: spec.acquire_time.clone().or(Some(MicroTime(now))),
            ..spec.clone()
        });
    }
    if !holder.is_empty() && !expired {
        return Decision::Wait;
    }
    Decision::Update(LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(duration),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(spec.lease_transitions.unwrap_or(0).saturating_add(1)),
        ..spec.clone()
    })
}

/// Tracks when the Lease's record last changed, by our own clock (client-go's `observedTime`).
#[derive(Debug, Default)]
pub struct Observer {
    record: Option<(String, Option<jiff::Timestamp>, i32)>,
    at: Option<Instant>,
}

impl Observer {
    /// Notes the record read at `now`.
    pub fn observe(&mut self, spec: &LeaseSpec, now: Instant) {
        let record = (
            spec.holder_identity.clone().unwrap_or_default(),
            spec.renew_time.as_ref().map(|t| t.0),
            spec.lease_duration_seconds.unwrap_or(0),
        );
        if self.record.as_ref() != Some(&record) {
            self.record = Some(record);
            self.at = Some(now);
        }
    }

    /// Whether the observed holder's lease has run out at `now` (an empty holder always has).
    pub fn expired(&self, now: Instant) -> bool {
        match (&self.record, self.at) {
            (Some((holder, _, _)), _) if holder.is_empty() => true,
            (Some((_, _, secs)), Some(at)) => {
                let d = Duration::from_secs(u64::try_from(*secs).unwrap_or(0));
                now.duration_since(at) >= d
            }
            _ => true,
        }
    }
}

struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    args: LeaderArgs,
    observer: Observer,
}

impl Elector {
    /// One acquire-or-renew attempt; `Ok(true)` when we hold the lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let current = self.api.get_opt(&self.name).await?;
        let now_i = Instant::now();
        let now = jiff::Timestamp::now();
        if let Some(spec) = current.as_ref().and_then(|l| l.spec.as_ref()) {
            self.observer.observe(spec, now_i);
        }
        let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        let decision = decide(
            spec.as_ref(),
            &self.identity,
            now,
            self.observer.expired(now_i),
            self.args.leader_elect_lease_duration,
        );
        match decision {
            Decision::Wait => Ok(false),
            Decision::Create(spec) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.args.leader_elect_resource_namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec.clone()),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => {
                        self.observer.observe(&spec, now_i);
                        Ok(true)
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Decision::Update(spec) => {
                let Some(mut lease) = current else {
                    return Ok(false);
                };
                lease.spec = Some(spec.clone());
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => {
                        self.observer.observe(&spec, now_i);
                        Ok(true)
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    async fn attempt(&mut self) -> bool {
        let limit = self
            .args
            .leader_elect_renew_deadline
            .max(Duration::from_secs(1));
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(Ok(held)) => held,
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, "leader election: {e:#}");
                false
            }
            Err(_) => {
                tracing::warn!(lease = %self.name, "leader election: request timed out");
                false
            }
        }
    }

    /// Tries until the lease is ours (`true`) or `stop` is cancelled (`false`).
    async fn acquire(&mut self, stop: &CancellationToken) -> bool {
        let mut logged = false;
        loop {
            if stop.is_cancelled() {
                return false;
            }
            if self.attempt().await {
                return true;
            }
            if !logged {
                tracing::info!(
                    lease = %self.name,
                    identity = %self.identity,
                    "waiting to acquire the leader lease"
                );
                logged = true;
            }
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(jittered(self.args.leader_elect_retry_period)) => {}
            }
        }
    }

    /// Gives the lease up (only if we still hold it).
    async fn release(&mut self) {
        let fut = async {
            let Some(mut lease) = self.api.get_opt(&self.name).await? else {
                return Ok::<(), kube::Error>(());
            };
            let spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            let now = MicroTime(jiff::Timestamp::now());
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..spec
            });
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await?;
            Ok(())
        };
        match tokio::time::timeout(Duration::from_secs(5), fut).await {
            Ok(Ok(())) => tracing::info!(lease = %self.name, "released the leader lease"),
            Ok(Err(e)) => tracing::warn!(lease = %self.name, "releasing the lease: {e}"),
            Err(_) => tracing::warn!(lease = %self.name, "releasing the lease timed out"),
        }
    }
}

/// `d` plus up to 20% (client-go's JitterFactor 1.2 for the acquire loop).
fn jittered(d: Duration) -> Duration {
    let f: f64 = rand::random::<f64>() * 0.2;
    d + d.mul_f64(f)
}

/// Why a term of leadership ended.
enum TermEnd {
    Shutdown,
    Lost,
    WorkEnded(Result<()>),
}

/// Runs `work` while this process leads; `work` gets a token cancelled when leadership is lost
/// or on shutdown. After a loss the process becomes a candidate again (and `work` runs again if
/// it leads again). With `--leader-elect=false` `work` runs at once, without a Lease.
pub async fn run_elected<F, Fut>(
    client: kube::Client,
    args: LeaderArgs,
    work: F,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()>
where
    F: Fn(CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let stop = CancellationToken::new();
    let s2 = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        s2.cancel();
    });
    if !args.leader_elect {
        return work(stop).await;
    }
    let api: Api<Lease> = Api::namespaced(client, &args.leader_elect_resource_namespace);
    let mut elector = Elector {
        api,
        name: args.leader_elect_resource_name.clone(),
        identity: identity(),
        args: args.clone(),
        observer: Observer::default(),
    };
    loop {
        if !elector.acquire(&stop).await {
            return Ok(());
        }
        tracing::info!(
            lease = %elector.name,
            identity = %elector.identity,
            "acquired the leader lease; starting controllers"
        );
        let token = stop.child_token();
        let mut handle = tokio::spawn(work(token.clone()));
        let mut last_renew = Instant::now();
        let end = loop {
            tokio::select! {
                _ = stop.cancelled() => break TermEnd::Shutdown,
                r = &mut handle => {
                    break TermEnd::WorkEnded(r.unwrap_or_else(|e| Err(crate::Error::Panicked(e))));
                }
                _ = tokio::time::sleep(args.leader_elect_retry_period) => {}
            }
            if elector.attempt().await {
                last_renew = Instant::now();
            } else if last_renew.elapsed() >= args.leader_elect_renew_deadline {
                break TermEnd::Lost;
            }
        };
        match end {
            TermEnd::WorkEnded(r) => {
                elector.release().await;
                return r;
            }
            TermEnd::Shutdown => {
                token.cancel();
                if tokio::time::timeout(Duration::from_secs(10), &mut handle)
                    .await
                    .is_err()
                {
                    handle.abort();
                }
                elector.release().await;
                return Ok(());
            }
            TermEnd::Lost => {
                tracing::error!(lease = %elector.name, "leader lease lost; stopping controllers");
                token.cancel();
                if tokio::time::timeout(Duration::from_secs(10), &mut handle)
                    .await
                    .is_err()
                {
                    handle.abort();
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(secs).unwrap()
    }

    fn spec(holder: &str, renew: i64, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(ts(1))),
            renew_time: Some(MicroTime(ts(renew))),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let d15 = Duration::from_secs(15);
        let now = ts(100);
        // (current, expired, expected holder after / Wait, transitions, acquire time moved)
        type Case = (Option<LeaseSpec>, bool, Option<(&'static str, i32, bool)>);
        let cases: Vec<Case> = vec![
            (None, false, Some(("me", 0, true))),
            (Some(spec("me", 90, 3)), false, Some(("me", 3, false))),
            (Some(spec("me", 10, 3)), true, Some(("me", 3, false))),
            (Some(spec("other", 95, 3)), false, None),
            (Some(spec("other", 50, 3)), true, Some(("me", 4, true))),
            (Some(spec("", 95, 3)), false, Some(("me", 4, true))),
            (Some(LeaseSpec::default()), false, Some(("me", 1, true))),
        ];
        for (i, (current, expired, expected)) in cases.into_iter().enumerate() {
            let got = decide(current.as_ref(), "me", now, expired, d15);
            match (got, expected) {
                (Decision::Wait, None) => {}
                (Decision::Create(s) | Decision::Update(s), Some((holder, tr, moved))) => {
                    assert_eq!(s.holder_identity.as_deref(), Some(holder), "case {i}");
                    assert_eq!(s.lease_transitions, Some(tr), "case {i}");
                    assert_eq!(s.renew_time, Some(MicroTime(now)), "case {i}");
                    assert_eq!(s.lease_duration_seconds, Some(15), "case {i}");
                    assert_eq!(
                        s.acquire_time == Some(MicroTime(now)),
                        moved,
                        "case {i}: acquire time"
                    );
                }
                (got, expected) => panic!("case {i}: {got:?} vs {expected:?}"),
            }
        }
        assert!(matches!(
            decide(None, "me", now, false, d15),
            Decision::Create(_)
        ));
    }

    #[test]
    fn observer_uses_local_time() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        assert!(o.expired(t0), "nothing observed: free");
        let s = spec("other", 1000, 0);
        o.observe(&s, t0);
        assert!(!o.expired(t0 + Duration::from_secs(14)));
        // The same record seen again does not restart the clock...
        o.observe(&s, t0 + Duration::from_secs(10));
        assert!(o.expired(t0 + Duration::from_secs(15)));
        // ...a renewal does.
        o.observe(&spec("other", 1002, 0), t0 + Duration::from_secs(12));
        assert!(!o.expired(t0 + Duration::from_secs(20)));
        assert!(o.expired(t0 + Duration::from_secs(27)));
        // A released lease is free at once.
        let mut released = spec("", 1003, 0);
        released.lease_duration_seconds = Some(1);
        o.observe(&released, t0 + Duration::from_secs(13));
        assert!(o.expired(t0 + Duration::from_secs(13)));
    }

    #[test]
    fn durations() {
        let cases = [
            ("15s", Some(15_000)),
            ("500ms", Some(500)),
            ("1m30s", Some(90_000)),
            ("2h", Some(7_200_000)),
            ("1.5s", Some(1_500)),
            ("7", Some(7_000)),
            ("", None),
            ("s", None),
            ("10x", None),
            ("10", Some(10_000)),
        ];
        for (s, ms) in cases {
            assert_eq!(
                parse_duration(s).ok().map(|d| d.as_millis() as u64),
                ms,
                "{s:?}"
            );
        }
    }

    #[test]
    fn identities() {
        let a = identity();
        let b = identity();
        assert_ne!(a, b);
        let (_, uuid) = a.rsplit_once('_').unwrap();
        assert_eq!(uuid.len(), 36);
        assert_eq!(uuid.matches('-').count(), 4);
    }
}
