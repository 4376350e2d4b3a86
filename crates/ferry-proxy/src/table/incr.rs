//! The userspace proxy's table kept up to date one Service at a time (as the kernel mode's
//! [`crate::kernel::incr`] does for nftables): a sync rebuilds only the Services the tracker
//! names ([`super::build_service`]) and hands the data path the pools and frontends that
//! differ ([`Delta`]), so one Service's change costs what it touches, whatever the number of
//! Services.
//!
//! The whole table is the union of the Services' parts. Pools never collide (a pool key names
//! its Service); a frontend claimed by several Services (two Services with the same externalIP
//! and port) goes to the first in (namespace, name) order, as [`super::build`] gives it, so
//! the claimants of every frontend are remembered and the winner recomputed when one of them
//! changes. The result is always exactly [`super::build`]'s (property-tested in
//! `crate::sync`).

use std::collections::BTreeMap;

use super::{Frontend, Pool, PoolKey, Table};

/// A Service's key: (namespace, name).
pub type SvcKey = (String, String);

/// What changed in the whole table at one [`Incremental::update`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// Pools added or changed (`Some`) and removed (`None`).
    pub pools: BTreeMap<PoolKey, Option<Pool>>,
    /// Frontends added or moved to another pool (`Some`) and removed (`None`).
    pub frontends: BTreeMap<Frontend, Option<PoolKey>>,
}

impl Delta {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty() && self.frontends.is_empty()
    }

    /// The delta taking an empty data path to `table`.
    pub fn whole(table: &Table) -> Delta {
        Delta {
            pools: table
                .pools
                .iter()
                .map(|(k, p)| (k.clone(), Some(p.clone())))
                .collect(),
            frontends: table
                .frontends
                .iter()
                .map(|(f, k)| (*f, Some(k.clone())))
                .collect(),
        }
    }
}

/// The table, kept per Service.
#[derive(Debug, Default)]
pub struct Incremental {
    /// Each Service's part (Services with no pool are not kept).
    parts: BTreeMap<SvcKey, Table>,
    /// Frontend -> the Services claiming it, in key order (the first wins).
    claims: BTreeMap<Frontend, BTreeMap<SvcKey, PoolKey>>,
    /// The union.
    table: Table,
}

impl Incremental {
    /// The whole table as it stands.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The Services that have a part.
    pub fn services(&self) -> impl Iterator<Item = &SvcKey> {
        self.parts.keys()
    }

    /// Replaces the parts of the given Services (an empty table: the Service is gone or
    /// serves nothing) and returns what changed in the whole table.
    pub fn update(&mut self, built: impl IntoIterator<Item = (SvcKey, Table)>) -> Delta {
        let mut delta = Delta::default();
        let mut touched: Vec<Frontend> = Vec::new();
        for (key, new) in built {
            let old = self.parts.remove(&key).unwrap_or_default();
            if old == new {
                if !new.pools.is_empty() {
                    self.parts.insert(key, new);
                }
                continue;
            }
            for k in old.pools.keys() {
                if !new.pools.contains_key(k) {
                    self.table.pools.remove(k);
                    delta.pools.insert(k.clone(), None);
                }
            }
            for (k, p) in &new.pools {
                if old.pools.get(k) != Some(p) {
                    self.table.pools.insert(k.clone(), p.clone());
                    delta.pools.insert(k.clone(), Some(p.clone()));
                }
            }
            for (f, k) in &old.frontends {
                if new.frontends.get(f) == Some(k) {
                    continue;
                }
                if let Some(c) = self.claims.get_mut(f) {
                    c.remove(&key);
                    if c.is_empty() {
                        self.claims.remove(f);
                    }
                }
                touched.push(*f);
            }
            for (f, k) in &new.frontends {
                if old.frontends.get(f) == Some(k) {
                    continue;
                }
                self.claims
                    .entry(*f)
                    .or_default()
                    .insert(key.clone(), k.clone());
                touched.push(*f);
            }
            if !new.pools.is_empty() {
                self.parts.insert(key, new);
            }
        }
        for f in touched {
            let winner = self.claims.get(&f).and_then(|c| c.values().next()).cloned();
            if self.table.frontends.get(&f) == winner.as_ref() {
                continue;
            }
            match &winner {
                Some(k) => self.table.frontends.insert(f, k.clone()),
                None => self.table.frontends.remove(&f),
            };
            delta.frontends.insert(f, winner);
        }
        delta
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{Proto, ServicePortName};
    use crate::sched::Scheduler;
    use crate::table::Reach;

    fn key(name: &str) -> PoolKey {
        PoolKey {
            port: ServicePortName {
                namespace: "ns".into(),
                name: name.into(),
                port: "p".into(),
                proto: Proto::Tcp,
            },
            reach: Reach::External,
            ipv6: false,
        }
    }

    fn part(name: &str, ep: &str, fronts: &[&str]) -> Table {
        let mut t = Table::default();
        t.pools.insert(
            key(name),
            Pool {
                endpoints: vec![ep.parse().unwrap()],
                scheduler: Scheduler::RoundRobin,
                affinity: None,
                proxy_protocol: None,
            },
        );
        for f in fronts {
            let a: std::net::SocketAddr = f.parse().unwrap();
            t.frontends.insert(
                Frontend {
                    ip: a.ip(),
                    port: a.port(),
                    proto: Proto::Tcp,
                },
                key(name),
            );
        }
        t
    }

    fn fe(s: &str) -> Frontend {
        let a: std::net::SocketAddr = s.parse().unwrap();
        Frontend {
            ip: a.ip(),
            port: a.port(),
            proto: Proto::Tcp,
        }
    }

    fn svc(name: &str) -> SvcKey {
        ("ns".into(), name.into())
    }

    #[test]
    fn a_shared_frontend_goes_to_the_first_service_and_moves_when_it_leaves() {
        let mut inc = Incremental::default();
        let d = inc.update([
            (svc("b"), part("b", "10.0.0.2:80", &["1.1.1.1:80"])),
            (
                svc("a"),
                part("a", "10.0.0.1:80", &["1.1.1.1:80", "2.2.2.2:80"]),
            ),
        ]);
        assert_eq!(d.pools.len(), 2);
        assert_eq!(d.frontends[&fe("1.1.1.1:80")], Some(key("a")));
        assert_eq!(inc.table().frontends[&fe("1.1.1.1:80")], key("a"));
        // The same parts again: nothing to do.
        assert!(
            inc.update([(
                svc("a"),
                part("a", "10.0.0.1:80", &["1.1.1.1:80", "2.2.2.2:80"])
            )])
            .is_empty()
        );
        // b's endpoints change: only its pool.
        let d = inc.update([(svc("b"), part("b", "10.0.0.3:80", &["1.1.1.1:80"]))]);
        assert_eq!(d.pools.keys().collect::<Vec<_>>(), vec![&key("b")]);
        assert!(d.frontends.is_empty());
        // a goes: its pool and its own frontend go, the shared one moves to b.
        let d = inc.update([(svc("a"), Table::default())]);
        assert_eq!(d.pools, [(key("a"), None)].into());
        assert_eq!(
            d.frontends,
            [(fe("1.1.1.1:80"), Some(key("b"))), (fe("2.2.2.2:80"), None)].into()
        );
        assert_eq!(inc.services().count(), 1);
        // b goes too: empty.
        inc.update([(svc("b"), Table::default())]);
        assert_eq!(inc.table(), &Table::default());
        assert!(inc.claims.is_empty() && inc.parts.is_empty());
    }

    #[test]
    fn whole_delta_builds_the_table() {
        let t = part("a", "10.0.0.1:80", &["1.1.1.1:80"]);
        let d = Delta::whole(&t);
        assert_eq!(d.pools.len(), 1);
        assert_eq!(d.frontends.len(), 1);
        assert!(Delta::default().is_empty() && !d.is_empty());
    }
}
