//! Pure decisions of the ReplicaSet and Deployment controllers, after upstream's
//! `pkg/controller/replicaset` and `pkg/controller/deployment`.

use std::cmp::Ordering;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// What the ReplicaSet controller knows of one of its active pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub assigned: bool,
    /// 0 Pending, 1 Unknown, 2 Running (upstream's phase order for deletion).
    pub phase_rank: u8,
    pub ready: bool,
    /// Seconds since the pod became ready (0 when not ready).
    pub ready_for: i64,
    pub restarts: i32,
    /// Creation time, seconds since the epoch.
    pub created: i64,
}

/// Orders pods so that the first ones are the best to delete (upstream `ActivePods` ranking):
/// unassigned before assigned, pending before unknown before running, not ready before ready,
/// ready for less time first, more restarts first, newer first.
pub fn deletion_order(a: &PodView, b: &PodView) -> Ordering {
    a.assigned
        .cmp(&b.assigned)
        .then(a.phase_rank.cmp(&b.phase_rank))
        .then(a.ready.cmp(&b.ready))
        .then_with(|| {
            if a.ready && b.ready {
                a.ready_for.cmp(&b.ready_for)
            } else {
                Ordering::Equal
            }
        })
        .then(b.restarts.cmp(&a.restarts))
        .then(b.created.cmp(&a.created))
        .then(a.name.cmp(&b.name))
}

/// The ReplicaSet diff: how many pods to create (positive) or which to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RsDiff {
    Create(usize),
    Delete(Vec<String>),
    None,
}

/// Upstream caps one sync's creations/deletions at 500 (`burstReplicas`).
pub const BURST: usize = 500;

pub fn replica_set_diff(want: i32, active: &[PodView]) -> RsDiff {
    let want = usize::try_from(want.max(0)).unwrap_or(0);
    match active.len().cmp(&want) {
        Ordering::Equal => RsDiff::None,
        Ordering::Less => RsDiff::Create((want - active.len()).min(BURST)),
        Ordering::Greater => {
            let mut v = active.to_vec();
            v.sort_by(deletion_order);
            let n = (active.len() - want).min(BURST);
            RsDiff::Delete(v.into_iter().take(n).map(|p| p.name).collect())
        }
    }
}

/// One candidate of a controller's claim (a pod for a ReplicaSet, a ReplicaSet for a
/// Deployment), as upstream's `ControllerRefManager` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The uid of its controller, if any.
    pub controller_uid: Option<String>,
    /// The owner's selector matches its labels.
    pub matches: bool,
    /// It has a deletionTimestamp.
    pub deleting: bool,
}

/// What a claim decides for each candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Already ours and still selected.
    Owned,
    /// An orphan the selector matches: add our controller reference.
    Adopt,
    /// Ours but no longer selected: remove our reference (the object lives on, orphaned).
    Release,
    /// Someone else's, or not to be touched.
    Ignore,
}

/// Upstream's `ClaimObject`: ours and matching → owned; ours and not matching → released
/// (not while the owner itself is being deleted); an orphan matching → adopted (not by a
/// deleting owner, not when the orphan is being deleted); another controller's → ignored.
pub fn claim(owner_uid: &str, owner_deleting: bool, c: &Candidate) -> Claim {
    match c.controller_uid.as_deref() {
        Some(u) if u == owner_uid => {
            if c.matches {
                Claim::Owned
            } else if owner_deleting || c.deleting {
                Claim::Ignore
            } else {
                Claim::Release
            }
        }
        Some(_) => Claim::Ignore,
        None if c.matches && !owner_deleting && !c.deleting => Claim::Adopt,
        None => Claim::Ignore,
    }
}

/// Upstream's `slowStartBatch` sizes for `n` creations: 1, 2, 4, ... (the last one partial);
/// the caller stops at the first batch with a failure.
pub fn slow_start_batches(n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = n;
    let mut size = 1;
    while left > 0 {
        let b = size.min(left);
        out.push(b);
        left -= b;
        size *= 2;
    }
    out
}

/// Resolves an int-or-percent against `total`, rounding up or down.
pub fn resolve(v: Option<&IntOrString>, total: i32, round_up: bool, default: &str) -> i32 {
    let s = match v {
        Some(IntOrString::Int(i)) => return (*i).max(0),
        Some(IntOrString::String(s)) => s.as_str(),
        None => default,
    };
    let Some(p) = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
        return s.parse::<i32>().unwrap_or(0).max(0);
    };
    let num = p * i64::from(total);
    let r = if round_up {
        (num + 99).div_euclid(100)
    } else {
        num.div_euclid(100)
    };
    i32::try_from(r.max(0)).unwrap_or(i32::MAX)
}

/// `(maxSurge, maxUnavailable)` for `replicas`, as upstream: surge rounds up, unavailable rounds
/// down, and both zero means one unavailable.
pub fn surge_unavailable(
    surge: Option<&IntOrString>,
    unavailable: Option<&IntOrString>,
    replicas: i32,
) -> (i32, i32) {
    let s = resolve(surge, replicas, true, "25%");
    let mut u = resolve(unavailable, replicas, false, "25%");
    if s == 0 && u == 0 {
        u = 1;
    }
    (s, u.min(replicas.max(0)))
}

/// One ReplicaSet of a Deployment, as the rolling update sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsState {
    pub replicas: i32,
    pub available: i32,
}

/// The new ReplicaSet's replica count for a rolling update step (`NewRSNewReplicas`).
pub fn rolling_new_replicas(replicas: i32, max_surge: i32, new: &RsState, all: &[RsState]) -> i32 {
    if new.replicas > replicas {
        return replicas;
    }
    let max_total = replicas + max_surge;
    let current: i32 = all.iter().map(|r| r.replicas).sum();
    if current >= max_total {
        return new.replicas;
    }
    let up = (max_total - current).min(replicas - new.replicas).max(0);
    new.replicas + up
}

/// The old ReplicaSets' new replica counts for a rolling update step (upstream
/// `reconcileOldReplicaSets`: first the unhealthy replicas, then available ones while at least
/// `replicas - maxUnavailable` stay available). `old` is ordered oldest first.
pub fn rolling_scale_down_old(
    replicas: i32,
    max_unavailable: i32,
    new: &RsState,
    old: &[RsState],
) -> Vec<i32> {
    let mut out: Vec<i32> = old.iter().map(|r| r.replicas).collect();
    let old_count: i32 = out.iter().sum();
    if old_count == 0 {
        return out;
    }
    let all_count = old_count + new.replicas;
    let min_available = replicas - max_unavailable;
    let new_unavailable = (new.replicas - new.available).max(0);
    let max_scaled_down = all_count - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return out;
    }
    // Unhealthy replicas first.
    let mut budget = max_scaled_down;
    for (i, r) in old.iter().enumerate() {
        if budget <= 0 {
            break;
        }
        let unhealthy = (out[i] - r.available).max(0);
        let n = unhealthy.min(budget);
        out[i] -= n;
        budget -= n;
    }
    let cleaned = max_scaled_down - budget;
    // Then available ones, keeping minAvailable.
    let available: i32 = old
        .iter()
        .zip(out.iter())
        .map(|(r, n)| r.available.min(*n))
        .sum::<i32>()
        + new.available.min(new.replicas);
    let mut total = (available - min_available).min(max_scaled_down - cleaned);
    for n in out.iter_mut() {
        if total <= 0 {
            break;
        }
        let d = (*n).min(total);
        *n -= d;
        total -= d;
    }
    out
}

/// Upstream's `SafeEncodeString` alphabet (no vowels, no confusable characters).
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The `pod-template-hash` of a template (its canonical JSON) and collision count: FNV-1a 32,
/// printed in decimal and mapped through the safe alphabet as upstream does.
pub fn template_hash(template_json: &str, collision_count: Option<i32>) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    feed(template_json.as_bytes());
    if let Some(c) = collision_count {
        feed(&c.to_le_bytes());
    }
    h.to_string()
        .bytes()
        .map(|b| char::from(ALPHANUMS[usize::from(b) % ALPHANUMS.len()]))
        .collect()
}

#[allow(clippy::type_complexity)]
#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, assigned: bool, phase: u8, ready: bool, created: i64) -> PodView {
        PodView {
            name: name.into(),
            assigned,
            phase_rank: phase,
            ready,
            ready_for: if ready { 100 - created } else { 0 },
            restarts: 0,
            created,
        }
    }

    #[test]
    fn rs_diff_table() {
        let pods = vec![
            pod("running-ready-old", true, 2, true, 1),
            pod("running-ready-new", true, 2, true, 5),
            pod("pending", true, 0, false, 2),
            pod("unassigned", false, 0, false, 3),
            pod("running-notready", true, 2, false, 4),
        ];
        let cases: Vec<(i32, RsDiff)> = vec![
            (5, RsDiff::None),
            (8, RsDiff::Create(3)),
            (
                0,
                RsDiff::Delete(pods.iter().map(|_| String::new()).collect()),
            ),
            (
                3,
                RsDiff::Delete(vec!["unassigned".into(), "pending".into()]),
            ),
            (
                1,
                RsDiff::Delete(vec![
                    "unassigned".into(),
                    "pending".into(),
                    "running-notready".into(),
                    "running-ready-new".into(),
                ]),
            ),
        ];
        for (want, expect) in cases {
            let got = replica_set_diff(want, &pods);
            match (&expect, &got) {
                (RsDiff::Delete(e), RsDiff::Delete(g)) if want == 0 => {
                    assert_eq!(e.len(), g.len())
                }
                _ => assert_eq!(got, expect, "want {want}"),
            }
        }
        assert_eq!(replica_set_diff(-1, &[]), RsDiff::None);
        assert_eq!(replica_set_diff(10_000, &[]), RsDiff::Create(BURST));
    }

    #[test]
    fn surge_unavailable_table() {
        let i = IntOrString::Int;
        let s = |x: &str| IntOrString::String(x.into());
        let cases: Vec<(Option<IntOrString>, Option<IntOrString>, i32, (i32, i32))> = vec![
            (None, None, 4, (1, 1)),
            (None, None, 10, (3, 2)),
            (Some(i(0)), Some(i(0)), 3, (0, 1)),
            (Some(s("50%")), Some(s("50%")), 3, (2, 1)),
            (Some(i(2)), Some(i(0)), 4, (2, 0)),
            (Some(s("100%")), Some(s("0%")), 4, (4, 0)),
            (Some(i(1)), Some(i(9)), 4, (1, 4)),
        ];
        for (su, un, r, want) in cases {
            assert_eq!(
                surge_unavailable(su.as_ref(), un.as_ref(), r),
                want,
                "{su:?} {un:?} {r}"
            );
        }
    }

    fn st(replicas: i32, available: i32) -> RsState {
        RsState {
            replicas,
            available,
        }
    }

    #[test]
    fn rolling_new_table() {
        // (replicas, surge, new, all, want)
        let cases = vec![
            (4, 1, st(0, 0), vec![st(4, 4), st(0, 0)], 1),
            (4, 1, st(1, 0), vec![st(4, 4), st(1, 0)], 1),
            (4, 1, st(1, 1), vec![st(3, 3), st(1, 1)], 2),
            (4, 0, st(0, 0), vec![st(4, 4), st(0, 0)], 0),
            (4, 2, st(3, 3), vec![st(0, 0), st(3, 3)], 4),
            (2, 1, st(4, 4), vec![st(4, 4)], 2),
        ];
        for (r, s, new, all, want) in cases {
            assert_eq!(rolling_new_replicas(r, s, &new, &all), want);
        }
    }

    #[test]
    fn rolling_old_table() {
        // (replicas, maxUnavailable, new, old, want)
        let cases = vec![
            // Nothing new available yet: may drop one (4 - 1 = 3 must stay available).
            (4, 1, st(1, 0), vec![st(4, 4)], vec![3]),
            // New one available: drop one more.
            (4, 1, st(2, 1), vec![st(3, 3)], vec![2]),
            (4, 0, st(1, 0), vec![st(4, 4)], vec![4]),
            (4, 0, st(1, 1), vec![st(4, 4)], vec![3]),
            // Unhealthy old replicas go first, within what may be scaled down.
            (4, 1, st(1, 0), vec![st(4, 2)], vec![3]),
            (4, 1, st(0, 0), vec![st(4, 2)], vec![3]),
            (4, 2, st(0, 0), vec![st(4, 2)], vec![2]),
            // Oldest first.
            (4, 1, st(4, 4), vec![st(1, 1), st(1, 1)], vec![0, 0]),
            (2, 0, st(0, 0), vec![st(0, 0)], vec![0]),
        ];
        for (r, u, new, old, want) in cases {
            assert_eq!(
                rolling_scale_down_old(r, u, &new, &old),
                want,
                "{r} {u} {new:?} {old:?}"
            );
        }
    }

    #[test]
    fn claim_table() {
        let c = |uid: Option<&str>, matches: bool, deleting: bool| Candidate {
            controller_uid: uid.map(String::from),
            matches,
            deleting,
        };
        // (owner deleting, candidate, want)
        let cases = vec![
            (false, c(Some("me"), true, false), Claim::Owned),
            (true, c(Some("me"), true, false), Claim::Owned),
            (false, c(Some("me"), false, false), Claim::Release),
            (true, c(Some("me"), false, false), Claim::Ignore),
            (false, c(Some("me"), false, true), Claim::Ignore),
            (false, c(Some("other"), true, false), Claim::Ignore),
            (false, c(Some("other"), false, false), Claim::Ignore),
            (false, c(None, true, false), Claim::Adopt),
            (true, c(None, true, false), Claim::Ignore),
            (false, c(None, true, true), Claim::Ignore),
            (false, c(None, false, false), Claim::Ignore),
        ];
        for (deleting, cand, want) in cases {
            assert_eq!(claim("me", deleting, &cand), want, "{deleting} {cand:?}");
        }
    }

    #[test]
    fn slow_start_table() {
        assert_eq!(slow_start_batches(0), Vec::<usize>::new());
        assert_eq!(slow_start_batches(1), vec![1]);
        assert_eq!(slow_start_batches(5), vec![1, 2, 2]);
        assert_eq!(slow_start_batches(10), vec![1, 2, 4, 3]);
        assert_eq!(slow_start_batches(500).iter().sum::<usize>(), 500);
    }

    #[test]
    fn percentages_round_as_upstream() {
        // maxSurge rounds up, maxUnavailable down (intstr.GetScaledValueFromIntOrPercent).
        let s = |x: &str| IntOrString::String(x.into());
        let cases = vec![
            ("25%", 1, (1, 0)),
            ("25%", 3, (1, 0)),
            ("25%", 5, (2, 1)),
            ("33%", 10, (4, 3)),
            ("10%", 9, (1, 0)),
            ("0%", 10, (0, 0)),
            ("150%", 2, (3, 3)),
        ];
        for (pct, total, (up, down)) in cases {
            assert_eq!(
                resolve(Some(&s(pct)), total, true, "25%"),
                up,
                "{pct} of {total} up"
            );
            assert_eq!(
                resolve(Some(&s(pct)), total, false, "25%"),
                down,
                "{pct} of {total} down"
            );
        }
        // Defaults 25%/25% for 1 replica: surge 1, unavailable 0.
        assert_eq!(surge_unavailable(None, None, 1), (1, 0));
        // 0%/0% would block the rollout: one unavailable.
        assert_eq!(
            surge_unavailable(Some(&s("0%")), Some(&s("0%")), 10),
            (0, 1)
        );
    }

    /// A full rolling update, step by step, with every new pod becoming available at once:
    /// 4 replicas, maxSurge 1, maxUnavailable 1 ends with the new set at 4, the old at 0, and
    /// never more than 5 pods or fewer than 3 available.
    #[test]
    fn rolling_update_converges_within_bounds() {
        let (replicas, surge, unavail) = (4, 1, 1);
        let mut new = st(0, 0);
        let mut old = vec![st(4, 4)];
        for _ in 0..20 {
            let mut all = old.clone();
            all.push(new.clone());
            let n = rolling_new_replicas(replicas, surge, &new, &all);
            if n != new.replicas {
                new = st(n, n);
            } else {
                let outs = rolling_scale_down_old(replicas, unavail, &new, &old);
                for (o, n) in old.iter_mut().zip(outs) {
                    *o = st(n, n.min(o.available));
                }
            }
            let total: i32 = old.iter().map(|o| o.replicas).sum::<i32>() + new.replicas;
            let available: i32 = old.iter().map(|o| o.available).sum::<i32>() + new.available;
            assert!(total <= replicas + surge, "{total} pods");
            assert!(available >= replicas - unavail, "{available} available");
        }
        assert_eq!(new, st(4, 4));
        assert_eq!(old, vec![st(0, 0)]);
    }

    #[test]
    fn hash_is_stable_and_safe() {
        let a = template_hash("{\"a\":1}", None);
        assert_eq!(a, template_hash("{\"a\":1}", None));
        assert_ne!(a, template_hash("{\"a\":1}", Some(1)));
        assert!(a.bytes().all(|b| ALPHANUMS.contains(&b)));
    }

    proptest::proptest! {
        /// A rolling update step never takes availability below `replicas - maxUnavailable`
        /// counting only what is available now, and never exceeds `replicas + maxSurge`.
        #[test]
        fn rolling_step_bounds(replicas in 1i32..12, surge in 0i32..4, unavail in 0i32..4,
                               new_r in 0i32..12, new_a in 0i32..12, old_r in 0i32..12, old_a in 0i32..12) {
            let (surge, unavail) = if surge == 0 && unavail == 0 { (0, 1) } else { (surge, unavail.min(replicas)) };
            let new = st(new_r.min(replicas), new_a.min(new_r.min(replicas)));
            let old = vec![st(old_r, old_a.min(old_r))];
            let before_available = new.available + old[0].available;
            let after = rolling_scale_down_old(replicas, unavail, &new, &old);
            let kept_available = new.available + old[0].available.min(after[0]);
            let min_available = replicas - unavail;
            if before_available >= min_available {
                proptest::prop_assert!(kept_available >= min_available, "{:?}", after);
            } else {
                proptest::prop_assert_eq!(old[0].available.min(after[0]), old[0].available);
            }
            let all = vec![new.clone(), old[0].clone()];
            let n = rolling_new_replicas(replicas, surge, &new, &all);
            proptest::prop_assert!(n <= replicas);
            if n > new.replicas {
                proptest::prop_assert!(n + old[0].replicas <= replicas + surge);
            }
        }
    }
}
