//! Node IPAM decisions. Pure.
//!
//! Pools are either `ClusterCIDRConfig`s (seed 001) or the classic `--cluster-cidr` pool. For a
//! node, the matching configs are ranked by the seed's rules, in order: most matching labels;
//! fewest allocatable pod CIDRs; smallest per-node block; lowest alphanumeric label; lowest IPv4
//! CIDR. The first config with a free block in every family it has wins; the classic pool, if
//! any, comes last. Blocks never overlap each other (across all pools, which may overlap) nor the
//! excluded ranges (the service range).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ferry_api::selectors::LabelSelector;
use ipnet::IpNet;

/// One family of a pool: the CIDR and the per-node prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub cidr: IpNet,
    pub mask: u8,
}

impl Family {
    pub fn new(cidr: IpNet, mask: u8) -> Option<Family> {
        let max = cidr.max_prefix_len();
        (mask >= cidr.prefix_len() && mask <= max).then_some(Family {
            cidr: cidr.trunc(),
            mask,
        })
    }
    /// How many per-node blocks the CIDR holds (saturating).
    pub fn capacity(&self) -> u128 {
        let bits = u32::from(self.mask - self.cidr.prefix_len());
        if bits >= 128 {
            u128::MAX
        } else {
            1u128 << bits
        }
    }
    fn host_bits(&self) -> u32 {
        u32::from(self.cidr.max_prefix_len() - self.mask)
    }
}

/// A pool a node can get its pod CIDRs from.
#[derive(Debug, Clone)]
pub struct Pool {
    pub name: String,
    pub ipv4: Option<Family>,
    pub ipv6: Option<Family>,
    pub selector: LabelSelector,
    /// `key=value` of the selector's labels, sorted: the "alphanumeric label" of rule 4.
    pub label_key: String,
    /// Number of selector requirements (all must match for the pool to apply): rule 1.
    pub match_count: usize,
}

/// Rule 2's count: the blocks a pool can hand out, counted by the family that has fewer (a
/// dual-stack pool can never give out more nodes than its smaller family allows).
pub fn max_allocatable(p: &Pool) -> u128 {
    [p.ipv4, p.ipv6]
        .into_iter()
        .flatten()
        .map(|f| f.capacity())
        .min()
        .unwrap_or(u128::MAX)
}

fn rank(a: &Pool, b: &Pool) -> Ordering {
    let cap = max_allocatable;
    let host = |p: &Pool| p.ipv4.or(p.ipv6).map(|f| f.host_bits()).unwrap_or(u32::MAX);
    let v4 = |p: &Pool| {
        p.ipv4.map(|f| match f.cidr.network() {
            IpAddr::V4(a) => (u32::from(a), f.cidr.prefix_len()),
            IpAddr::V6(_) => (u32::MAX, 0),
        })
    };
    b.match_count
        .cmp(&a.match_count)
        .then(cap(a).cmp(&cap(b)))
        .then(host(a).cmp(&host(b)))
        .then(a.label_key.cmp(&b.label_key))
        .then_with(|| match (v4(a), v4(b)) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then(a.name.cmp(&b.name))
}

/// The pools that apply to a node with `labels`, best first.
pub fn candidates<'a>(pools: &'a [Pool], labels: &BTreeMap<String, String>) -> Vec<&'a Pool> {
    let mut v: Vec<&Pool> = pools
        .iter()
        .filter(|p| p.selector.matches(labels))
        .collect();
    v.sort_by(|a, b| rank(a, b));
    v
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(v: u128, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(v))
    } else {
        IpAddr::V4(Ipv4Addr::from(u32::try_from(v).unwrap_or(u32::MAX)))
    }
}

/// `[first, last]` addresses of a net.
fn span(n: &IpNet) -> (u128, u128) {
    (to_u128(n.network()), to_u128(n.broadcast()))
}

/// The first block of `f` that overlaps nothing in `taken` (same family only).
pub fn first_free(f: &Family, taken: &[IpNet]) -> Option<IpNet> {
    let v6 = matches!(f.cidr, IpNet::V6(_));
    let mut same: Vec<(u128, u128)> = taken
        .iter()
        .filter(|n| matches!(n, IpNet::V6(_)) == v6)
        .map(span)
        .collect();
    same.sort_unstable();
    let (start, end) = span(&f.cidr);
    let size_bits = f.host_bits();
    let size: u128 = if size_bits >= 128 {
        u128::MAX
    } else {
        1u128 << size_bits
    };
    let mut cur = start;
    loop {
        let last = cur.checked_add(size - 1)?;
        if last > end {
            return None;
        }
        // The furthest end of anything overlapping [cur, last].
        let overlap = same
            .iter()
            .filter(|(a, b)| *a <= last && *b >= cur)
            .map(|(_, b)| *b)
            .max();
        match overlap {
            None => return IpNet::new(from_u128(cur, v6), f.mask).ok(),
            Some(b) => {
                // Skip to the first block boundary past the overlapping range.
                let next = b.checked_add(1)?;
                let off = next.checked_sub(start)?;
                let aligned = off.div_ceil(size).checked_mul(size)?;
                cur = start.checked_add(aligned)?;
            }
        }
    }
}

/// The pod CIDRs for a node: from the best pool with a free block in each of its families;
/// IPv4 first when the pool has both. `None` when no pool applies or all are exhausted.
pub fn allocate(pools: &[&Pool], taken: &[IpNet]) -> Option<(String, Vec<IpNet>)> {
    for p in pools {
        let mut out = Vec::new();
        let mut ok = true;
        for f in [p.ipv4, p.ipv6].into_iter().flatten() {
            match first_free(&f, taken) {
                Some(n) => out.push(n),
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if ok && !out.is_empty() {
            return Some((p.name.clone(), out));
        }
    }
    None
}

/// The finalizer node IPAM keeps on every `ClusterCIDRConfig` (upstream's name) so that a config
/// still in use by nodes is not removed while they hold its blocks.
pub const CONFIG_FINALIZER: &str = "networking.k8s.io/cluster-cidr-finalizer";

/// What node IPAM knows of one `ClusterCIDRConfig` for its finalizer.
#[derive(Debug, Clone)]
pub struct ConfigState {
    pub name: String,
    pub has_finalizer: bool,
    pub deleting: bool,
    pub cidrs: Vec<IpNet>,
}

/// A change to a config's finalizers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalizerAction {
    Add(String),
    Remove(String),
}

/// Finalizer bookkeeping (KEP-2593): a live config gets the finalizer; a config being deleted
/// keeps it while any node's pod CIDR lies inside one of its CIDRs, and loses it once none does.
pub fn finalizer_actions(configs: &[ConfigState], node_blocks: &[IpNet]) -> Vec<FinalizerAction> {
    let in_use = |c: &ConfigState| {
        node_blocks
            .iter()
            .any(|b| c.cidrs.iter().any(|cidr| cidr.contains(b)))
    };
    configs
        .iter()
        .filter_map(|c| match (c.deleting, c.has_finalizer) {
            (false, false) => Some(FinalizerAction::Add(c.name.clone())),
            (true, true) if !in_use(c) => Some(FinalizerAction::Remove(c.name.clone())),
            _ => None,
        })
        .collect()
}

#[allow(clippy::type_complexity)]
#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::selectors::selector_from_map;

    fn fam(c: &str, m: u8) -> Option<Family> {
        Family::new(c.parse().expect("cidr"), m)
    }

    fn pool(
        name: &str,
        v4: Option<(&str, u8)>,
        v6: Option<(&str, u8)>,
        labels: &[(&str, &str)],
    ) -> Pool {
        let map: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Pool {
            name: name.into(),
            ipv4: v4.and_then(|(c, m)| fam(c, m)),
            ipv6: v6.and_then(|(c, m)| fam(c, m)),
            label_key: map
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
            match_count: map.len(),
            selector: selector_from_map(&map),
        }
    }

    fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn best(pools: &[Pool], node: &[(&str, &str)]) -> String {
        candidates(pools, &labels(node))
            .first()
            .map(|p| p.name.clone())
            .unwrap_or_default()
    }

    #[test]
    fn rule_1_most_matching_labels() {
        let pools = vec![
            pool(
                "one",
                Some(("10.0.0.0/16", 24)),
                None,
                &[("node.kubernetes.io/instance-type", "medium")],
            ),
            pool(
                "two",
                Some(("192.168.0.0/16", 24)),
                None,
                &[
                    ("node.kubernetes.io/instance-type", "medium"),
                    ("rack", "rack1"),
                ],
            ),
        ];
        assert_eq!(
            best(
                &pools,
                &[
                    ("node.kubernetes.io/instance-type", "medium"),
                    ("rack", "rack1")
                ]
            ),
            "two"
        );
        assert_eq!(
            best(&pools, &[("node.kubernetes.io/instance-type", "medium")]),
            "one"
        );
        assert_eq!(best(&pools, &[("rack", "rack1")]), "");
    }

    #[test]
    fn rule_2_fewest_pod_cidrs() {
        let pools = vec![
            pool("four", Some(("192.168.0.0/20", 22)), None, &[("a", "1")]),
            pool("one", Some(("10.0.0.0/16", 16)), None, &[("a", "1")]),
        ];
        assert_eq!(best(&pools, &[("a", "1")]), "one");
    }

    #[test]
    fn rule_3_smallest_block() {
        let pools = vec![
            pool("25", Some(("10.0.0.0/21", 25)), None, &[("a", "1")]),
            pool("27", Some(("10.1.0.0/23", 27)), None, &[("a", "1")]),
        ];
        // Both hold 16 blocks; /27 has fewer addresses per node.
        assert_eq!(best(&pools, &[("a", "1")]), "27");
    }

    #[test]
    fn rule_4_lowest_label() {
        let pools = vec![
            pool(
                "it",
                Some(("10.0.0.0/16", 24)),
                None,
                &[("node.kubernetes.io/instance-type", "medium")],
            ),
            pool(
                "host",
                Some(("10.1.0.0/16", 24)),
                None,
                &[("kubernetes.io/hostname", "node-1")],
            ),
        ];
        assert_eq!(
            best(
                &pools,
                &[
                    ("node.kubernetes.io/instance-type", "medium"),
                    ("kubernetes.io/hostname", "node-1")
                ]
            ),
            "host"
        );
    }

    #[test]
    fn rule_5_lowest_ipv4() {
        let pools = vec![
            pool(
                "high",
                Some(("192.168.0.0/16", 24)),
                Some(("fd00::/112", 120)),
                &[("a", "1")],
            ),
            pool("low", Some(("10.0.0.0/16", 24)), None, &[("a", "1")]),
        ];
        assert_eq!(best(&pools, &[("a", "1")]), "low");
    }

    #[test]
    fn dual_stack_and_fallback() {
        let pools = vec![
            pool(
                "tiny",
                Some(("10.0.0.0/24", 25)),
                Some(("fd00::/120", 121)),
                &[("a", "1")],
            ),
            pool("big", Some(("10.8.0.0/16", 24)), None, &[("a", "1")]),
        ];
        let c = candidates(&pools, &labels(&[("a", "1")]));
        let mut taken: Vec<IpNet> = Vec::new();
        let got: Vec<(String, Vec<String>)> = (0..3)
            .map(|_| {
                let (p, nets) = allocate(&c, &taken).expect("allocation");
                taken.extend(nets.iter().cloned());
                (p, nets.iter().map(|n| n.to_string()).collect())
            })
            .collect();
        assert_eq!(
            got[0],
            (
                "tiny".to_string(),
                vec!["10.0.0.0/25".to_string(), "fd00::/121".to_string()]
            )
        );
        assert_eq!(
            got[1],
            (
                "tiny".to_string(),
                vec!["10.0.0.128/25".to_string(), "fd00::80/121".to_string()]
            )
        );
        assert_eq!(got[2], ("big".to_string(), vec!["10.8.0.0/24".to_string()]));
    }

    #[test]
    fn overlapping_pools_and_service_range_do_not_collide() {
        let f = fam("10.96.0.0/11", 24).expect("family");
        let taken: Vec<IpNet> = vec![
            "10.96.0.0/12".parse().expect("svc"),
            "10.112.0.0/24".parse().expect("n"),
        ];
        assert_eq!(
            first_free(&f, &taken),
            Some("10.112.1.0/24".parse().expect("net"))
        );
        // A bigger block is skipped past a smaller allocation inside it.
        let f = fam("10.0.0.0/16", 20).expect("family");
        let taken: Vec<IpNet> = vec!["10.0.3.0/24".parse().expect("n")];
        assert_eq!(
            first_free(&f, &taken),
            Some("10.0.16.0/20".parse().expect("net"))
        );
        // Exhausted.
        let f = fam("10.0.0.0/24", 24).expect("family");
        assert_eq!(first_free(&f, &["10.0.0.0/8".parse().expect("n")]), None);
        // IPv6 with a huge number of blocks.
        let f = fam("fd00::/48", 64).expect("family");
        assert_eq!(
            first_free(&f, &["fd00::/64".parse().expect("n")]),
            Some("fd00:0:0:1::/64".parse().expect("net"))
        );
    }

    proptest::proptest! {
        /// Successive allocations never overlap each other or the excluded range, and stay
        /// inside the pool.
        #[test]
        fn allocations_are_disjoint(prefix in 16u8..24, mask_extra in 0u8..6, n in 1usize..40, excl in 0u32..256) {
            let mask = (prefix + mask_extra).min(30);
            let f = Family::new(format!("10.0.0.0/{prefix}").parse().expect("cidr"), mask).expect("family");
            let excluded: IpNet = format!("10.0.{}.0/24", excl % 256).parse().expect("net");
            let mut taken = vec![excluded];
            for _ in 0..n {
                let Some(b) = first_free(&f, &taken) else { break };
                proptest::prop_assert!(f.cidr.contains(&b));
                for t in &taken {
                    proptest::prop_assert!(!t.contains(&b.network()) && !b.contains(&t.network()), "{b} overlaps {t}");
                }
                taken.push(b);
            }
        }
    }

    #[test]
    fn rule_2_counts_the_smaller_family() {
        // Dual-stack "ds": 256 IPv4 blocks but only 16 IPv6 blocks -> 16 allocatable, which
        // beats the IPv4-only pool with 64.
        let pools = vec![
            pool("v4", Some(("10.0.0.0/18", 24)), None, &[("r", "a")]),
            pool(
                "ds",
                Some(("10.1.0.0/16", 24)),
                Some(("fd00::/116", 120)),
                &[("r", "a")],
            ),
        ];
        assert_eq!(max_allocatable(&pools[1]), 16);
        assert_eq!(best(&pools, &[("r", "a")]), "ds");
    }

    #[test]
    fn finalizers_follow_use() {
        let net = |s: &str| -> IpNet { s.parse().expect("net") };
        let cfg = |name: &str, fin: bool, del: bool| ConfigState {
            name: name.into(),
            has_finalizer: fin,
            deleting: del,
            cidrs: vec![net("10.0.0.0/16"), net("fd00::/112")],
        };
        let used = [net("10.0.3.0/24")];
        let used6 = [net("fd00::100/120")];
        let other = [net("10.1.0.0/24")];
        let cases: Vec<(ConfigState, &[IpNet], Vec<FinalizerAction>)> = vec![
            (
                cfg("new", false, false),
                &used,
                vec![FinalizerAction::Add("new".into())],
            ),
            (cfg("live", true, false), &used, vec![]),
            (cfg("busy", true, true), &used, vec![]),
            (cfg("busy6", true, true), &used6, vec![]),
            (
                cfg("idle", true, true),
                &other,
                vec![FinalizerAction::Remove("idle".into())],
            ),
            (cfg("gone", false, true), &[], vec![]),
        ];
        for (c, blocks, want) in cases {
            assert_eq!(
                finalizer_actions(std::slice::from_ref(&c), blocks),
                want,
                "{}",
                c.name
            );
        }
    }
}
