//! Opt-in host routes (`ferry up --host-routes`): for people on their own machines who want to
//! reach pods, Services and nodes from the machine's own network namespace without
//! `ferry exec-net`. This is the only part of Ferry that changes the machine's namespace, and
//! only when asked: one veth pair between it and the cluster namespace, and routes to the
//! cluster's ranges through it. Removing the link removes its routes; removing the cluster
//! namespace (on exit, or when the next `ferry up` cleans up after a `kill -9`) removes the
//! link, since a veth pair dies with either end.
//!
//! [`HostRoutes::plan`] decides (pure, refusing ranges that overlap routes the machine
//! already has); [`HostRoutes::apply`] and [`HostRoutes::remove`] run `ip`.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::netns::{ClusterPlan, NetnsError, ip, ip_batch};

/// The transfer network between the machine's namespace and the cluster namespace.
pub const HOST_LINK_V4: &str = "198.18.1.0/30";
pub const HOST_LINK_V6: &str = "fd00:198:18:1::/64";

/// What `--host-routes` creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoutes {
    /// The veth end in the machine's namespace (unique per cluster: `fh` + the prefix's hash).
    pub link: String,
    /// Its peer, in the cluster namespace.
    pub peer: String,
    pub cluster_netns: String,
    /// Addresses of the machine's end (IPv4, IPv6).
    pub host_addrs: Vec<IpNet>,
    /// Addresses of the cluster's end: the routes' next hops.
    pub cluster_addrs: Vec<IpNet>,
    /// Destinations routed through the link, in the machine's namespace.
    pub routes: Vec<IpNet>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "--host-routes: {ours} overlaps the machine's route to {theirs}; not adding host routes"
    )]
    Overlap { ours: IpNet, theirs: IpNet },
    #[error("--host-routes: invalid built-in range {0}")]
    Range(String),
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn host(net: &IpNet, n: u128) -> IpNet {
    let addr = match net.network() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a).wrapping_add(n as u32)).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a).wrapping_add(n)).into()),
    };
    // The prefix comes from a valid network, so this cannot fail.
    IpNet::new(addr, net.prefix_len()).unwrap_or(*net)
}

impl HostRoutes {
    /// Plans the link and routes for `cluster`: its node subnets, the pod CIDRs and Service
    /// ranges given, and the cluster's local ranges (Services, load balancers). `existing`
    /// are the destinations the machine's namespace routes already (not its default routes):
    /// any overlap refuses the plan, so nothing of the machine's is shadowed.
    pub fn plan(
        cluster: &ClusterPlan,
        pod_cidrs: &[IpNet],
        service_cidrs: &[IpNet],
        existing: &[IpNet],
    ) -> Result<HostRoutes, PlanError> {
        let link_nets: Vec<IpNet> = [HOST_LINK_V4, HOST_LINK_V6]
            .iter()
            .map(|s| s.parse().map_err(|_| PlanError::Range(s.to_string())))
            .collect::<Result<_, _>>()?;
        let mut routes: Vec<IpNet> = Vec::new();
        for n in cluster
            .node_subnet
            .iter()
            .chain(pod_cidrs)
            .chain(service_cidrs)
            .chain(&cluster.local_ranges)
        {
            let n = n.trunc();
            if !routes.iter().any(|r| r.contains(&n)) {
                routes.retain(|r| !n.contains(r));
                routes.push(n);
            }
        }
        for ours in routes.iter().chain(&link_nets) {
            if let Some(theirs) = existing
                .iter()
                .find(|t| t.prefix_len() > 0 && overlaps(ours, t))
            {
                return Err(PlanError::Overlap {
                    ours: *ours,
                    theirs: *theirs,
                });
            }
        }
        let hash = cluster
            .prefix
            .strip_prefix("ferry-")
            .unwrap_or(&cluster.prefix);
        Ok(HostRoutes {
            link: format!("fh{}", &hash[..hash.len().min(12)]),
            peer: "fhost".into(),
            cluster_netns: cluster.cluster_netns.clone(),
            host_addrs: link_nets.iter().map(|n| host(n, 1)).collect(),
            cluster_addrs: link_nets.iter().map(|n| host(n, 2)).collect(),
            routes,
        })
    }

    /// The `ip -batch` script run in the machine's namespace (link, address, routes).
    pub fn host_script(&self) -> String {
        self.link_script() + &self.host_config_script()
    }

    fn link_script(&self) -> String {
        format!(
            "link add {} type veth peer name {} netns {}\n",
            self.link, self.peer, self.cluster_netns
        )
    }

    fn host_config_script(&self) -> String {
        let mut s = String::new();
        for a in &self.host_addrs {
            let nodad = if a.addr().is_ipv6() { " nodad" } else { "" };
            s += &format!("addr add {a} dev {}{nodad}\n", self.link);
        }
        s += &format!("link set {} up\n", self.link);
        for r in &self.routes {
            if let Some(via) = self
                .cluster_addrs
                .iter()
                .find(|a| a.addr().is_ipv4() == r.addr().is_ipv4())
            {
                s += &format!("route add {r} via {} dev {}\n", via.addr(), self.link);
            }
        }
        s
    }

    /// The `ip -batch` script run in the cluster namespace (its end of the link).
    pub fn cluster_script(&self) -> String {
        let mut s = String::new();
        for a in &self.cluster_addrs {
            let nodad = if a.addr().is_ipv6() { " nodad" } else { "" };
            s += &format!("addr add {a} dev {}{nodad}\n", self.peer);
        }
        s += &format!("link set {} up\n", self.peer);
        s
    }

    /// What removal runs in the machine's namespace (the link's routes go with it).
    pub fn remove_script(&self) -> String {
        format!("link del {}\n", self.link)
    }

    /// The warning printed when the flag is used.
    pub fn warning(&self) -> String {
        format!(
            "ferry up: WARNING: --host-routes changes this machine's own network namespace: link {} \
             (addresses {}) and routes to {} via the cluster namespace; they are removed on exit \
             (or by the next `ferry up` on this data directory after a crash)",
            self.link,
            self.host_addrs
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            self.routes
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// Creates the link, addresses and routes; on failure removes what was made.
    pub fn apply(&self) -> Result<(), NetnsError> {
        // A link left by an earlier run goes first.
        self.remove();
        let r = ip_batch(None, &self.link_script())
            .and_then(|_| ip_batch(Some(&self.cluster_netns), &self.cluster_script()))
            .and_then(|_| ip_batch(None, &self.host_config_script()));
        if r.is_err() {
            self.remove();
        }
        r
    }

    /// Removes the link (and so its routes); nothing when it is gone.
    pub fn remove(&self) {
        if ip(None, &["link", "show", &self.link]).is_ok()
            && let Err(e) = ip_batch(None, &self.remove_script())
        {
            tracing::warn!("removing host link {}: {e}", self.link);
        }
    }
}

/// Destinations of `ip -o route show` / `ip -6 -o route show` output, except default routes
/// (the input of [`HostRoutes::plan`]'s overlap check).
pub fn route_destinations(text: &str) -> Vec<IpNet> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let mut first = w.next()?;
            // Route types before the destination (`local 127.0.0.0/8`, `unreachable ...`).
            if matches!(
                first,
                "local"
                    | "broadcast"
                    | "unreachable"
                    | "blackhole"
                    | "prohibit"
                    | "throw"
                    | "anycast"
                    | "multicast"
                    | "unicast"
            ) {
                first = w.next()?;
            }
            if first == "default" {
                return None;
            }
            first
                .parse::<IpNet>()
                .ok()
                .or_else(|| first.parse::<IpAddr>().ok().map(IpNet::from))
        })
        .collect()
}

/// Reads the machine's routes of both families (for the overlap check).
pub fn machine_routes() -> Vec<IpNet> {
    let mut v = Vec::new();
    for fam in ["-4", "-6"] {
        if let Ok(out) = ip(None, &[fam, "-o", "route", "show", "table", "main"]) {
            v.extend(route_destinations(&out));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    fn cluster() -> ClusterPlan {
        ClusterPlan::new(
            "ferry-0000abcd",
            &["n-1".to_string(), "n-2".to_string()],
            vec![
                net("10.96.0.0/16"),
                net("fd00:10:96::/112"),
                net("198.18.255.0/24"),
            ],
        )
    }

    #[test]
    fn plan_routes_every_cluster_range_through_one_link() {
        let p = HostRoutes::plan(
            &cluster(),
            &[net("10.244.0.0/16"), net("fd00:10:244::/56")],
            &[net("10.96.0.0/16"), net("fd00:10:96::/112")],
            &[net("192.168.1.0/24"), net("fe80::/64")],
        )
        .expect("plan");
        assert_eq!(p.link, "fh0000abcd");
        assert_eq!(p.peer, "fhost");
        assert_eq!(
            p.routes,
            vec![
                net("198.18.0.0/24"),
                net("fd00:198:18::/64"),
                net("10.244.0.0/16"),
                net("fd00:10:244::/56"),
                net("10.96.0.0/16"),
                net("fd00:10:96::/112"),
                net("198.18.255.0/24"),
            ],
            "deduplicated, in order"
        );
        assert_eq!(
            p.host_script(),
            "link add fh0000abcd type veth peer name fhost netns ferry-0000abcd-cluster\n\
             addr add 198.18.1.1/30 dev fh0000abcd\n\
             addr add fd00:198:18:1::1/64 dev fh0000abcd nodad\n\
             link set fh0000abcd up\n\
             route add 198.18.0.0/24 via 198.18.1.2 dev fh0000abcd\n\
             route add fd00:198:18::/64 via fd00:198:18:1::2 dev fh0000abcd\n\
             route add 10.244.0.0/16 via 198.18.1.2 dev fh0000abcd\n\
             route add fd00:10:244::/56 via fd00:198:18:1::2 dev fh0000abcd\n\
             route add 10.96.0.0/16 via 198.18.1.2 dev fh0000abcd\n\
             route add fd00:10:96::/112 via fd00:198:18:1::2 dev fh0000abcd\n\
             route add 198.18.255.0/24 via 198.18.1.2 dev fh0000abcd\n"
        );
        assert_eq!(
            p.cluster_script(),
            "addr add 198.18.1.2/30 dev fhost\naddr add fd00:198:18:1::2/64 dev fhost nodad\n\
             link set fhost up\n"
        );
        assert_eq!(p.remove_script(), "link del fh0000abcd\n");
        let w = p.warning();
        assert!(w.contains("WARNING") && w.contains("fh0000abcd") && w.contains("10.244.0.0/16"));
    }

    #[test]
    fn a_wider_range_absorbs_a_narrower_one() {
        let p = HostRoutes::plan(
            &cluster(),
            &[net("10.244.1.0/24"), net("10.244.0.0/16")],
            &[],
            &[],
        )
        .expect("plan");
        assert!(p.routes.contains(&net("10.244.0.0/16")));
        assert!(!p.routes.contains(&net("10.244.1.0/24")));
    }

    #[test]
    fn overlapping_machine_routes_refuse_the_plan() {
        for (theirs, ours) in [
            ("10.244.5.0/24", "10.244.0.0/16"),
            ("10.0.0.0/8", "10.244.0.0/16"),
            ("198.18.1.0/24", "198.18.1.0/30"),
            ("fd00::/8", "fd00:198:18::/64"),
        ] {
            let e = HostRoutes::plan(
                &cluster(),
                &[net("10.244.0.0/16"), net("fd00:10:244::/56")],
                &[],
                &[net(theirs)],
            )
            .expect_err(theirs);
            assert_eq!(
                e,
                PlanError::Overlap {
                    ours: net(ours),
                    theirs: net(theirs)
                },
                "{theirs}"
            );
            assert!(e.to_string().contains("not adding host routes"));
        }
        // Default routes never conflict.
        assert!(HostRoutes::plan(&cluster(), &[], &[], &[net("0.0.0.0/0"), net("::/0")]).is_ok());
    }

    #[test]
    fn machine_route_parsing() {
        let v4 = "default via 172.16.0.1 dev eth0 \n172.16.0.0/24 dev eth0 proto kernel scope link src 172.16.0.2 \n\
                  10.1.2.3 via 172.16.0.1 dev eth0\nunreachable 10.9.0.0/16 \n";
        assert_eq!(
            route_destinations(v4),
            vec![net("172.16.0.0/24"), net("10.1.2.3/32"), net("10.9.0.0/16")]
        );
        let v6 = "fe80::/64 dev eth0 proto kernel metric 256 pref medium\ndefault via fe80::1 dev eth0\n";
        assert_eq!(route_destinations(v6), vec![net("fe80::/64")]);
        assert!(route_destinations("").is_empty());
    }
}
