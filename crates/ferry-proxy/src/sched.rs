//! Backend selection: the userspace proxy's round-robin, random, and IPVS's `lc`, `dh`, `sh`,
//! `sed`, `nq`, plus `sessionAffinity: ClientIP`. Pure: time, load and randomness come in as
//! arguments.
//!
//! Every endpoint has weight 1 (EndpointSlices carry no weights), so, as in IPVS with equal
//! weights, `sed` (fewest active + 1) and `nq` (an idle server first, else `sed`) pick the same
//! backend as `lc` over active connections; they differ only in how ties and idle servers are
//! found, which this module keeps faithful to IPVS (first in list order wins).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::{Duration, Instant};

use rand::Rng;

/// A backend selection algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Scheduler {
    /// Round-robin (the userspace proxy's default).
    #[default]
    RoundRobin,
    /// Uniformly random (the iptables mode's behaviour).
    Random,
    /// `lc`: fewest active connections.
    LeastConnection,
    /// `dh`: a hash of the destination (service) IP.
    DestinationHashing,
    /// `sh`: a hash of the source (client) IP.
    SourceHashing,
    /// `sed`: shortest expected delay, (active + 1) / weight.
    ShortestExpectedDelay,
    /// `nq`: never queue: an idle backend if there is one, else `sed`.
    NeverQueue,
}

impl FromStr for Scheduler {
    type Err = crate::ArgError;
    fn from_str(s: &str) -> Result<Self, crate::ArgError> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "rr" | "roundrobin" | "round-robin" => Scheduler::RoundRobin,
            "random" => Scheduler::Random,
            "lc" => Scheduler::LeastConnection,
            "dh" => Scheduler::DestinationHashing,
            "sh" => Scheduler::SourceHashing,
            "sed" => Scheduler::ShortestExpectedDelay,
            "nq" => Scheduler::NeverQueue,
            other => return Err(crate::ArgError::Scheduler(other.to_string())),
        })
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheduler::RoundRobin => "rr",
            Scheduler::Random => "random",
            Scheduler::LeastConnection => "lc",
            Scheduler::DestinationHashing => "dh",
            Scheduler::SourceHashing => "sh",
            Scheduler::ShortestExpectedDelay => "sed",
            Scheduler::NeverQueue => "nq",
        })
    }
}

/// Multiplicative hash of an address onto 8 bits (256 buckets, as IPVS's dh/sh tables).
pub fn bucket(ip: IpAddr) -> u8 {
    let folded = match ip {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => {
            let o = a.octets();
            let w = |i: usize| u32::from_be_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            w(0) ^ w(4) ^ w(8) ^ w(12)
        }
    };
    // Golden-ratio multiplicative hashing, top 8 bits.
    (folded.wrapping_mul(0x9E37_79B1) >> 24) as u8
}

/// Picks an index among `active.len()` backends. `allowed[i]` is false for backends that
/// already failed this connection attempt; `active[i]` counts open connections (or UDP flows).
/// Returns `None` when nothing is allowed.
pub fn choose(
    sched: Scheduler,
    rr_next: &mut usize,
    src: IpAddr,
    dst: IpAddr,
    active: &[usize],
    allowed: &[bool],
    rng: &mut impl Rng,
) -> Option<usize> {
    let n = active.len().min(allowed.len());
    if n == 0 || !allowed[..n].iter().any(|a| *a) {
        return None;
    }
    // The first allowed index at or after `start`, wrapping.
    let from = |start: usize| (0..n).map(|k| (start + k) % n).find(|i| allowed[*i]);
    let least = || {
        (0..n)
            .filter(|i| allowed[*i])
            .min_by_key(|i| (active[*i], *i))
    };
    match sched {
        Scheduler::RoundRobin => {
            let i = from(*rr_next % n)?;
            *rr_next = (i + 1) % n;
            Some(i)
        }
        Scheduler::Random => {
            let pool: Vec<usize> = (0..n).filter(|i| allowed[*i]).collect();
            pool.get(rng.random_range(0..pool.len())).copied()
        }
        Scheduler::DestinationHashing => from(usize::from(bucket(dst)) % n),
        Scheduler::SourceHashing => from(usize::from(bucket(src)) % n),
        Scheduler::LeastConnection | Scheduler::ShortestExpectedDelay => least(),
        Scheduler::NeverQueue => (0..n)
            .find(|i| allowed[*i] && active[*i] == 0)
            .or_else(least),
    }
}

/// One remembered client for `sessionAffinity: ClientIP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sticky {
    pub endpoint: SocketAddr,
    pub last_used: Instant,
}

/// A pool's selection state: its endpoints, the round-robin cursor, the affinity table.
#[derive(Debug, Clone)]
pub struct PoolState {
    pub endpoints: Vec<SocketAddr>,
    pub scheduler: Scheduler,
    pub affinity: Option<Duration>,
    pub rr_next: usize,
    pub sticky: HashMap<IpAddr, Sticky>,
}

impl PoolState {
    pub fn new(
        endpoints: Vec<SocketAddr>,
        scheduler: Scheduler,
        affinity: Option<Duration>,
    ) -> Self {
        PoolState {
            endpoints,
            scheduler,
            affinity,
            rr_next: 0,
            sticky: HashMap::new(),
        }
    }

    /// Replaces the endpoint set (and policy). As the userspace proxy does, a changed set
    /// restarts round-robin; affinity entries survive only while their endpoint does.
    pub fn update(
        &mut self,
        endpoints: Vec<SocketAddr>,
        scheduler: Scheduler,
        affinity: Option<Duration>,
    ) {
        if affinity.is_none() {
            self.sticky.clear();
        }
        if endpoints != self.endpoints {
            self.rr_next = 0;
            self.sticky.retain(|_, s| endpoints.contains(&s.endpoint));
            self.endpoints = endpoints;
        }
        self.scheduler = scheduler;
        self.affinity = affinity;
    }

    /// Drops affinity entries idle longer than the timeout.
    pub fn expire(&mut self, now: Instant) {
        if let Some(t) = self.affinity {
            self.sticky
                .retain(|_, s| now.saturating_duration_since(s.last_used) < t);
        }
    }

    /// Picks an endpoint for a connection from `src` to `dst`. `reset` ignores (and replaces) a
    /// remembered affinity, as the userspace proxy does after a failed connect; `tried` are the
    /// endpoints that already failed for this connection (avoided while others remain).
    // The inputs of one pick are all plain data; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub fn pick(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        now: Instant,
        reset: bool,
        tried: &[SocketAddr],
        active: &[usize],
        rng: &mut impl Rng,
    ) -> Option<SocketAddr> {
        if self.endpoints.is_empty() {
            return None;
        }
        if let Some(timeout) = self.affinity
            && !reset
            && let Some(s) = self.sticky.get_mut(&src)
            && now.saturating_duration_since(s.last_used) < timeout
            && self.endpoints.contains(&s.endpoint)
            && !tried.contains(&s.endpoint)
        {
            s.last_used = now;
            return Some(s.endpoint);
        }
        let mut allowed: Vec<bool> = self.endpoints.iter().map(|e| !tried.contains(e)).collect();
        if !allowed.iter().any(|a| *a) {
            allowed.iter_mut().for_each(|a| *a = true);
        }
        let mut load = active.to_vec();
        load.resize(self.endpoints.len(), 0);
        let i = choose(
            self.scheduler,
            &mut self.rr_next,
            src,
            dst,
            &load,
            &allowed,
            rng,
        )?;
        let ep = *self.endpoints.get(i)?;
        if self.affinity.is_some() {
            self.sticky.insert(
                src,
                Sticky {
                    endpoint: ep,
                    last_used: now,
                },
            );
        }
        Some(ep)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn eps(n: u8) -> Vec<SocketAddr> {
        (1..=n)
            .map(|i| SocketAddr::from(([127, 0, 0, i], 9376)))
            .collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parse_names() {
        for (s, want) in [
            ("rr", Scheduler::RoundRobin),
            ("random", Scheduler::Random),
            ("lc", Scheduler::LeastConnection),
            ("dh", Scheduler::DestinationHashing),
            ("SH", Scheduler::SourceHashing),
            ("sed", Scheduler::ShortestExpectedDelay),
            ("nq", Scheduler::NeverQueue),
        ] {
            assert_eq!(s.parse::<Scheduler>().unwrap(), want);
            assert_eq!(want.to_string().parse::<Scheduler>().unwrap(), want);
        }
        assert!("wrr".parse::<Scheduler>().is_err());
    }

    /// Counts picks of each endpoint over `n` sequential, immediately closed connections.
    fn distribution(
        sched: Scheduler,
        n: usize,
        src: impl Fn(usize) -> IpAddr,
        hold: bool,
    ) -> Vec<usize> {
        let mut st = PoolState::new(eps(3), sched, None);
        let mut rng = StdRng::seed_from_u64(7);
        let mut active = [0usize; 3];
        let mut count = vec![0; 3];
        let now = Instant::now();
        for k in 0..n {
            let ep = st
                .pick(
                    src(k),
                    ip("127.96.0.10"),
                    now,
                    false,
                    &[],
                    &active,
                    &mut rng,
                )
                .unwrap();
            let i = st.endpoints.iter().position(|e| *e == ep).unwrap();
            count[i] += 1;
            if hold {
                active[i] += 1;
            }
        }
        count
    }

    #[test]
    fn distributions() {
        let one = |_| ip("127.0.0.1");
        let many = |k: usize| IpAddr::from([127, 1, (k / 256) as u8, (k % 256) as u8]);
        // (scheduler, sources, hold connections open, expected counts or None for "balanced")
        let cases: Vec<(Scheduler, bool, bool, Option<Vec<usize>>)> = vec![
            (
                Scheduler::RoundRobin,
                false,
                false,
                Some(vec![100, 100, 100]),
            ),
            (Scheduler::Random, false, false, None),
            // Closed at once: every backend idle, the first always wins (as IPVS).
            (
                Scheduler::LeastConnection,
                false,
                false,
                Some(vec![300, 0, 0]),
            ),
            (
                Scheduler::LeastConnection,
                false,
                true,
                Some(vec![100, 100, 100]),
            ),
            (
                Scheduler::ShortestExpectedDelay,
                false,
                true,
                Some(vec![100, 100, 100]),
            ),
            (
                Scheduler::NeverQueue,
                false,
                true,
                Some(vec![100, 100, 100]),
            ),
            (Scheduler::NeverQueue, false, false, Some(vec![300, 0, 0])),
            (Scheduler::SourceHashing, true, false, None),
        ];
        for (sched, many_src, hold, want) in cases {
            let got = if many_src {
                distribution(sched, 300, many, hold)
            } else {
                distribution(sched, 300, one, hold)
            };
            match want {
                Some(w) => assert_eq!(got, w, "{sched}"),
                None => assert!(got.iter().all(|c| *c > 60), "{sched}: {got:?}"),
            }
        }
    }

    #[test]
    fn hashing_is_sticky_per_key() {
        let mut st = PoolState::new(eps(3), Scheduler::SourceHashing, None);
        let mut rng = StdRng::seed_from_u64(1);
        let now = Instant::now();
        for c in 0..50u8 {
            let src = IpAddr::from([127, 0, 1, c]);
            let a = st.pick(src, ip("127.96.0.1"), now, false, &[], &[], &mut rng);
            let b = st.pick(src, ip("127.96.0.2"), now, false, &[], &[5, 5, 5], &mut rng);
            assert_eq!(a, b);
        }
        let mut st = PoolState::new(eps(3), Scheduler::DestinationHashing, None);
        let a = st.pick(
            ip("127.0.0.1"),
            ip("127.96.0.1"),
            now,
            false,
            &[],
            &[],
            &mut rng,
        );
        for c in 0..50u8 {
            let src = IpAddr::from([127, 0, 1, c]);
            assert_eq!(
                st.pick(src, ip("127.96.0.1"), now, false, &[], &[], &mut rng),
                a
            );
        }
    }

    #[test]
    fn affinity_sticks_until_timeout_and_reset() {
        let mut st = PoolState::new(eps(3), Scheduler::RoundRobin, Some(Duration::from_secs(10)));
        let mut rng = StdRng::seed_from_u64(1);
        let t0 = Instant::now();
        let c = ip("127.0.0.7");
        let d = ip("127.96.0.1");
        let first = st.pick(c, d, t0, false, &[], &[], &mut rng).unwrap();
        for s in 1..20 {
            let t = t0 + Duration::from_secs(s / 2);
            assert_eq!(st.pick(c, d, t, false, &[], &[], &mut rng), Some(first));
        }
        // Another client moves the cursor; the first stays put.
        let other = st
            .pick(ip("127.0.0.8"), d, t0, false, &[], &[], &mut rng)
            .unwrap();
        assert_ne!(other, first);
        // Idle past the timeout: picked afresh.
        let late = t0 + Duration::from_secs(9) + Duration::from_secs(11);
        let again = st.pick(c, d, late, false, &[], &[], &mut rng).unwrap();
        assert_ne!(again, first);
        // A reset (failed connect) picks another and remembers it.
        let moved = st.pick(c, d, late, true, &[again], &[], &mut rng).unwrap();
        assert_ne!(moved, again);
        assert_eq!(st.pick(c, d, late, false, &[], &[], &mut rng), Some(moved));
        // The remembered endpoint goes away: forgotten.
        let rest: Vec<_> = eps(3).into_iter().filter(|e| *e != moved).collect();
        st.update(
            rest.clone(),
            Scheduler::RoundRobin,
            Some(Duration::from_secs(10)),
        );
        assert!(!st.sticky.contains_key(&c));
        st.expire(late + Duration::from_secs(60));
        assert!(st.sticky.is_empty());
    }

    #[test]
    fn retry_skips_tried() {
        let mut st = PoolState::new(eps(3), Scheduler::DestinationHashing, None);
        let mut rng = StdRng::seed_from_u64(1);
        let now = Instant::now();
        let d = ip("127.96.0.1");
        let a = st.pick(d, d, now, false, &[], &[], &mut rng).unwrap();
        let b = st.pick(d, d, now, true, &[a], &[], &mut rng).unwrap();
        let c = st.pick(d, d, now, true, &[a, b], &[], &mut rng).unwrap();
        assert!(a != b && b != c && a != c);
        // All tried: any endpoint again.
        assert!(
            st.pick(d, d, now, true, &[a, b, c], &[], &mut rng)
                .is_some()
        );
    }

    proptest! {
        #[test]
        fn choose_respects_allowed(
            sched in prop::sample::select(vec![
                Scheduler::RoundRobin, Scheduler::Random, Scheduler::LeastConnection,
                Scheduler::DestinationHashing, Scheduler::SourceHashing,
                Scheduler::ShortestExpectedDelay, Scheduler::NeverQueue]),
            allowed in prop::collection::vec(any::<bool>(), 0..8),
            active in prop::collection::vec(0usize..5, 8),
            src in any::<u32>(), dst in any::<u32>(), rr in 0usize..20, seed in any::<u64>(),
        ) {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut rr = rr;
            let n = allowed.len();
            let got = choose(sched, &mut rr, IpAddr::from(src.to_be_bytes()),
                IpAddr::from(dst.to_be_bytes()), &active[..n], &allowed, &mut rng);
            match got {
                Some(i) => prop_assert!(i < n && allowed[i]),
                None => prop_assert!(!allowed.iter().any(|a| *a)),
            }
        }
    }
}
