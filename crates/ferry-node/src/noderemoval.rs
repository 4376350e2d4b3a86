//! Removing one node of `ferry up --nodes N` when its Node object is deleted (`kubectl delete
//! node`): its agent, proxy and DNS listener stop, its pods' networks are deleted (CNI DEL,
//! namespaces), and then its namespace (with its pod bridge and the veth to the cluster
//! bridge) and every route in the cluster namespace through it go. Routes that served the
//! whole cluster through it (Service and load-balancer ranges, routed to the first node) move
//! to the first remaining node.
//!
//! [`cluster_script`] and [`routes_via`] decide (pure); `ferry up` runs the result.

use std::net::IpAddr;

use crate::netns::{ClusterPlan, NodePlan};

/// Destinations of `ip -o route show` lines (either family) whose next hop is one of `via`.
pub fn routes_via(route_show: &str, via: &[IpAddr]) -> Vec<String> {
    route_show
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let hop = w
                .iter()
                .position(|x| *x == "via")
                .and_then(|i| w.get(i + 1))
                .and_then(|h| h.parse::<IpAddr>().ok())?;
            let dest = *w.first()?;
            (via.contains(&hop) && dest != "default").then(|| dest.to_string())
        })
        .collect()
}

/// The node plans left once `removed` is gone.
pub fn remaining(plan: &ClusterPlan, removed: &str) -> Vec<NodePlan> {
    plan.nodes
        .iter()
        .filter(|n| n.name != removed)
        .cloned()
        .collect()
}

/// The `ip -batch` script for the cluster namespace once node `removed` is gone: delete each
/// route through it (`through`: destinations from [`routes_via`]), then point the cluster's
/// local ranges at the first remaining node when they went through the removed one.
pub fn cluster_script(plan: &ClusterPlan, removed: &str, through: &[String]) -> String {
    let Some(gone) = plan.nodes.iter().find(|n| n.name == removed) else {
        return String::new();
    };
    let mut s = String::new();
    for d in through {
        s += &format!("route del {d}\n");
    }
    let first_was_removed = plan.nodes.first().is_some_and(|f| f.name == gone.name);
    if first_was_removed && let Some(next) = remaining(plan, removed).first() {
        for r in &plan.local_ranges {
            if let Some(via) = next.ips.iter().find(|i| i.is_ipv4() == r.addr().is_ipv4()) {
                s += &format!("route replace {r} via {via}\n");
            }
        }
    }
    s
}

/// Tears down node `removed` of `plan` once its agent has stopped: DEL of every pod network
/// its CNI result cache (under `state_dir`) still lists, the pod namespaces named
/// `pod_prefix*`, the node's namespace, and the cluster namespace's routes through it.
/// Returns how many pod networks were cleaned up here (0 when the agent did it).
pub fn remove_node(
    plan: &ClusterPlan,
    removed: &str,
    state_dir: &std::path::Path,
    bin_dirs: &[std::path::PathBuf],
    pod_prefix: &str,
) -> Result<usize, crate::netns::NetnsError> {
    let Some(node) = plan.nodes.iter().find(|n| n.name == removed) else {
        return Ok(0);
    };
    let cni_dir = state_dir.join("cni");
    let net = crate::network::NetNs {
        cni: crate::cni::Cni {
            bin_dirs: bin_dirs.to_vec(),
            exec_netns: Some(crate::netns::path(&node.netns)),
            cache_dir: cni_dir.join("results"),
        },
        conf: crate::cni::default_conflist("ferry", &[], &cni_dir.join("ipam")),
        netns_prefix: pod_prefix.to_string(),
    };
    let cleaned = net.gc();
    crate::netns::delete(&node.netns);
    let mut routes = String::new();
    for fam in ["-4", "-6"] {
        routes += &crate::netns::ip(Some(&plan.cluster_netns), &[fam, "-o", "route", "show"])?;
    }
    let script = cluster_script(plan, removed, &routes_via(&routes, &node.ips));
    if !script.is_empty() {
        crate::netns::ip_batch(Some(&plan.cluster_netns), &script)?;
    }
    Ok(cleaned)
}

/// The plan recorded once `removed` is gone (what `ferry exec-net --node` reads).
pub fn without(plan: &ClusterPlan, removed: &str) -> ClusterPlan {
    let mut p = plan.clone();
    p.nodes.retain(|n| n.name != removed);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> ClusterPlan {
        ClusterPlan::new(
            "ferry-0000abcd",
            &["n-1".to_string(), "n-2".to_string(), "n-3".to_string()],
            vec![
                "10.96.0.0/16".parse().expect("net"),
                "fd00:10:96::/112".parse().expect("net"),
            ],
        )
    }

    const ROUTES: &str = "10.96.0.0/16 via 198.18.0.11 dev fbr0 \n\
        10.244.0.0/24 via 198.18.0.11 dev fbr0 \n\
        10.244.1.0/24 via 198.18.0.12 dev fbr0 \n\
        10.244.2.0/24 via 198.18.0.13 dev fbr0 \n\
        198.18.0.0/24 dev fbr0 proto kernel scope link src 198.18.0.1 \n\
        fd00:10:244:2::/64 via fd00:198:18::d dev fbr0 metric 1024 pref medium\n\
        fd00:10:96::/112 via fd00:198:18::b dev fbr0 metric 1024 pref medium\n\
        default via 198.18.0.13 dev fbr0\n";

    #[test]
    fn routes_through_a_node() {
        let p = plan();
        assert_eq!(
            routes_via(ROUTES, &p.nodes[2].ips),
            vec!["10.244.2.0/24", "fd00:10:244:2::/64"]
        );
        assert_eq!(
            routes_via(ROUTES, &p.nodes[0].ips),
            vec!["10.96.0.0/16", "10.244.0.0/24", "fd00:10:96::/112"]
        );
        assert!(routes_via("", &p.nodes[0].ips).is_empty());
    }

    #[test]
    fn removing_a_later_node_only_drops_its_routes() {
        let p = plan();
        let through = routes_via(ROUTES, &p.nodes[2].ips);
        assert_eq!(
            cluster_script(&p, "n-3", &through),
            "route del 10.244.2.0/24\nroute del fd00:10:244:2::/64\n"
        );
        assert_eq!(cluster_script(&p, "nope", &through), "");
        let w = without(&p, "n-3");
        assert_eq!(
            w.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            vec!["n-1", "n-2"]
        );
        assert_eq!(w.cluster_netns, p.cluster_netns);
    }

    #[test]
    fn removing_the_first_node_moves_the_service_ranges() {
        let p = plan();
        let through = routes_via(ROUTES, &p.nodes[0].ips);
        assert_eq!(
            cluster_script(&p, "n-1", &through),
            "route del 10.96.0.0/16\nroute del 10.244.0.0/24\nroute del fd00:10:96::/112\n\
             route replace 10.96.0.0/16 via 198.18.0.12\n\
             route replace fd00:10:96::/112 via fd00:198:18::c\n"
        );
        // The last node: nothing to move the ranges to.
        let one = without(&without(&p, "n-2"), "n-3");
        assert_eq!(
            cluster_script(&one, "n-1", &["10.96.0.0/16".to_string()]),
            "route del 10.96.0.0/16\n"
        );
    }
}
