//! Network namespaces: named ones under `/run/netns` (made and removed with iproute2, as
//! `ip netns` does), running code inside one, and the cluster network of `ferry up` (a cluster
//! namespace with a bridge joining one namespace per node).
//!
//! Ferry's crates have no unsafe code, so entering a namespace uses `nix::sched::setns` on a
//! thread made for the purpose: a socket belongs for good to the namespace it was created in,
//! so a listener bound on such a thread serves that namespace wherever it is used later, and a
//! process spawned from it starts there. The pure part ([`ClusterPlan`]) decides names,
//! addresses and the `ip -batch` text per namespace; [`ClusterPlan::apply`] runs it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ipnet::IpNet;

/// Where named network namespaces live (iproute2's convention).
pub const NETNS_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("{cmd}: {msg}")]
    Command { cmd: String, msg: String },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// The path of a named namespace.
pub fn path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

pub fn exists(name: &str) -> bool {
    path(name).exists()
}

fn run(cmd: &mut Command, input: Option<&str>) -> Result<String, NetnsError> {
    let shown = format!("{cmd:?}");
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    } else {
        cmd.stdin(Stdio::null());
    }
    let mut child = cmd.spawn().map_err(|e| NetnsError::Command {
        cmd: shown.clone(),
        msg: e.to_string(),
    })?;
    if let (Some(text), Some(mut si)) = (input, child.stdin.take()) {
        use std::io::Write;
        si.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(NetnsError::Command {
            cmd: shown,
            msg: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip [-n ns] args...`
pub fn ip(ns: Option<&str>, args: &[&str]) -> Result<String, NetnsError> {
    let mut c = Command::new("ip");
    if let Some(n) = ns {
        c.arg("-n").arg(n);
    }
    c.args(args);
    run(&mut c, None)
}

/// `ip [-n ns] -batch -` with `script` (one command per line).
pub fn ip_batch(ns: Option<&str>, script: &str) -> Result<(), NetnsError> {
    let mut c = Command::new("ip");
    if let Some(n) = ns {
        c.arg("-n").arg(n);
    }
    c.args(["-batch", "-"]);
    run(&mut c, Some(script)).map(|_| ())
}

/// Creates a named namespace (nothing when it exists).
pub fn create(name: &str) -> Result<(), NetnsError> {
    if exists(name) {
        return Ok(());
    }
    ip(None, &["netns", "add", name]).map(|_| ())
}

/// Removes a named namespace (nothing when it is gone). The kernel frees it once the last
/// process inside has exited.
pub fn delete(name: &str) {
    if exists(name)
        && let Err(e) = ip(None, &["netns", "delete", name])
    {
        tracing::warn!("removing network namespace {name}: {e}");
    }
}

/// Names of the namespaces starting with `prefix`.
pub fn list_with_prefix(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Runs `f` on a new thread inside the namespace at `ns` (or here when `None`).
pub fn run_in<T: Send + 'static>(
    ns: Option<&Path>,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let file = match ns {
        Some(p) => Some(std::fs::File::open(p)?),
        None => None,
    };
    std::thread::Builder::new()
        .name("ferry-netns".into())
        .spawn(move || -> io::Result<T> {
            if let Some(f) = &file {
                nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from)?;
            }
            Ok(f())
        })?
        .join()
        .map_err(|_| io::Error::other("netns thread panicked"))?
}

/// Writes a sysctl (`net/ipv4/ip_forward` style path under /proc/sys) inside `ns`.
pub fn sysctl(ns: Option<&Path>, key: &str, value: &str) -> io::Result<()> {
    let p = Path::new("/proc/sys").join(key);
    let v = value.to_string();
    run_in(ns, move || std::fs::write(p, v))?
}

/// A TCP listener bound inside `ns` (ready for `tokio::net::TcpListener::from_std`).
pub fn bind_tcp_in(ns: Option<&Path>, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let l = run_in(ns, move || std::net::TcpListener::bind(addr))??;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// A TCP connection made from inside `ns`.
pub async fn connect_in(
    ns: Option<&Path>,
    addr: SocketAddr,
    timeout: Duration,
) -> io::Result<tokio::net::TcpStream> {
    let Some(ns) = ns else {
        return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "i/o timeout")),
        };
    };
    let ns = ns.to_path_buf();
    let s = tokio::task::spawn_blocking(move || {
        run_in(Some(&ns), move || {
            std::net::TcpStream::connect_timeout(&addr, timeout)
        })
    })
    .await
    .map_err(|_| io::Error::other("connect task failed"))???;
    s.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(s)
}

/// Runs a current-thread tokio runtime on a thread inside `ns`: every socket the future
/// creates (listeners, outgoing connections) lives in that namespace. Returns when the
/// future completes.
pub fn spawn_runtime<F, Fut>(
    ns: PathBuf,
    name: String,
    make: F,
) -> io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let file = std::fs::File::open(&ns)?;
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if let Err(e) = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET) {
                tracing::error!("{name}: entering {}: {e}", ns.display());
                return;
            }
            drop(file);
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(make()),
                Err(e) => tracing::error!("{name}: runtime: {e}"),
            }
        })
}

/// The per-data-directory prefix of every namespace a `ferry up` makes: `ferry-` and eight
/// hex digits of a hash of the directory's canonical path (short: interface and namespace
/// names have length limits, and two clusters on one machine must not collide).
pub fn prefix_for(data_dir: &Path) -> String {
    let canon = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    // FNV-1a: stable across runs and Rust versions (unlike the std hasher).
    let mut h: u32 = 0x811c_9dc5;
    for b in canon.as_os_str().as_encoded_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("ferry-{h:08x}")
}

/// One node of the cluster network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodePlan {
    /// The Kubernetes node name.
    pub name: String,
    /// Its network namespace (name under /run/netns).
    pub netns: String,
    /// Its addresses on the cluster bridge (IPv4 first, then IPv6).
    pub ips: Vec<IpAddr>,
    /// The cluster-side end of its veth.
    pub veth: String,
}

/// The cluster network of `ferry up` in netns mode.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterPlan {
    pub prefix: String,
    /// The cluster namespace: the bridge joining the nodes, routes between pod CIDRs, the
    /// API server's address for pods.
    pub cluster_netns: String,
    pub bridge: String,
    /// Gateway addresses on the cluster bridge (where the API server is reachable).
    pub gateway: Vec<IpAddr>,
    pub node_subnet: Vec<IpNet>,
    pub nodes: Vec<NodePlan>,
    /// Ranges every node answers on (Service CIDRs, load-balancer pool), routed to the first
    /// node from the cluster namespace.
    pub local_ranges: Vec<IpNet>,
    /// Whether the node namespaces hold `local_ranges` as local routes on `lo`: the userspace
    /// proxy binds addresses inside them. The kernel proxy modes DNAT them instead, which a
    /// local route would bypass (the default route carries them to the output hook).
    #[serde(default = "yes")]
    pub node_local_routes: bool,
}

fn yes() -> bool {
    true
}

/// The IPv4 and IPv6 subnets of the cluster network (between node namespaces).
pub const NODE_SUBNET_V4: &str = "198.18.0.0/24";
pub const NODE_SUBNET_V6: &str = "fd00:198:18::/64";

fn nth(net: &IpNet, n: u32) -> IpAddr {
    match net {
        IpNet::V4(v) => IpAddr::V4(Ipv4Addr::from(u32::from(v.network()).wrapping_add(n))),
        IpNet::V6(v) => IpAddr::V6(Ipv6Addr::from(
            u128::from(v.network()).wrapping_add(u128::from(n)),
        )),
    }
}

impl ClusterPlan {
    /// Plans `node_names.len()` nodes (at most 200) behind one cluster bridge.
    pub fn new(prefix: &str, node_names: &[String], local_ranges: Vec<IpNet>) -> ClusterPlan {
        let subnets: Vec<IpNet> = [NODE_SUBNET_V4, NODE_SUBNET_V6]
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect();
        let nodes = node_names
            .iter()
            .enumerate()
            .map(|(i, name)| NodePlan {
                name: name.clone(),
                netns: format!("{prefix}-node{}", i + 1),
                ips: subnets.iter().map(|s| nth(s, 11 + i as u32)).collect(),
                veth: format!("fv{}", i + 1),
            })
            .collect();
        ClusterPlan {
            prefix: prefix.to_string(),
            cluster_netns: format!("{prefix}-cluster"),
            bridge: "fbr0".into(),
            gateway: subnets.iter().map(|s| nth(s, 1)).collect(),
            node_subnet: subnets,
            nodes,
            local_ranges,
            node_local_routes: true,
        }
    }

    /// The `ip -batch` script of the cluster namespace.
    pub fn cluster_script(&self) -> String {
        let mut s = String::from("link set lo up\n");
        s += &format!("link add {} type bridge\n", self.bridge);
        for (gw, net) in self.gateway.iter().zip(&self.node_subnet) {
            let nodad = if gw.is_ipv6() { " nodad" } else { "" };
            s += &format!(
                "addr add {gw}/{} dev {}{nodad}\n",
                net.prefix_len(),
                self.bridge
            );
        }
        s += &format!("link set {} up\n", self.bridge);
        for n in &self.nodes {
            s += &format!(
                "link add {} type veth peer name eth0 netns {}\n",
                n.veth, n.netns
            );
            s += &format!("link set {} master {}\n", n.veth, self.bridge);
            s += &format!("link set {} up\n", n.veth);
        }
        // Service and load-balancer addresses from the cluster namespace (`ferry exec-net`)
        // go to the first node, whose proxy answers them.
        if let Some(first) = self.nodes.first() {
            for r in &self.local_ranges {
                if let Some(via) = first.ips.iter().find(|i| i.is_ipv4() == r.addr().is_ipv4()) {
                    s += &format!("route replace {r} via {via}\n");
                }
            }
        }
        s
    }

    /// The `ip -batch` script of a node namespace.
    pub fn node_script(&self, node: &NodePlan) -> String {
        let mut s = String::from("link set lo up\n");
        for (ip, net) in node.ips.iter().zip(&self.node_subnet) {
            let nodad = if ip.is_ipv6() { " nodad" } else { "" };
            s += &format!("addr add {ip}/{} dev eth0{nodad}\n", net.prefix_len());
        }
        s += "link set eth0 up\n";
        for gw in &self.gateway {
            let default = if gw.is_ipv6() { "::/0" } else { "0.0.0.0/0" };
            s += &format!("route add {default} via {gw}\n");
        }
        if self.node_local_routes {
            for r in &self.local_ranges {
                s += &format!("route add local {r} dev lo\n");
            }
        }
        s
    }

    /// Routes in the cluster namespace that send a node's pod CIDRs to it.
    pub fn pod_route_script(&self, node: &str, pod_cidrs: &[IpNet]) -> String {
        let Some(n) = self.nodes.iter().find(|n| n.name == node) else {
            return String::new();
        };
        let mut s = String::new();
        for c in pod_cidrs {
            if let Some(via) = n.ips.iter().find(|i| i.is_ipv4() == c.addr().is_ipv4()) {
                s += &format!("route replace {} via {via}\n", c.trunc());
            }
        }
        s
    }

    /// Every namespace name of the plan (cluster last, so nodes go first on removal).
    pub fn namespaces(&self) -> Vec<String> {
        let mut v: Vec<String> = self.nodes.iter().map(|n| n.netns.clone()).collect();
        v.push(self.cluster_netns.clone());
        v
    }

    /// Creates the namespaces, links, addresses, routes and sysctls.
    pub fn apply(&self) -> Result<(), NetnsError> {
        create(&self.cluster_netns)?;
        for n in &self.nodes {
            create(&n.netns)?;
        }
        ip_batch(Some(&self.cluster_netns), &self.cluster_script())?;
        let cns = path(&self.cluster_netns);
        sysctl(Some(&cns), "net/ipv4/ip_forward", "1")?;
        sysctl(Some(&cns), "net/ipv6/conf/all/forwarding", "1")?;
        for n in &self.nodes {
            ip_batch(Some(&n.netns), &self.node_script(n))?;
            let p = path(&n.netns);
            for (k, v) in NODE_SYSCTLS {
                if let Err(e) = sysctl(Some(&p), k, v) {
                    tracing::warn!("sysctl {k}={v} in {}: {e}", n.netns);
                }
            }
        }
        Ok(())
    }

    /// Removes every namespace of the plan (and whatever else carries its prefix: pods).
    pub fn remove(&self) {
        remove_prefix(&self.prefix);
    }
}

/// Sysctls of a node namespace: forwarding for pods, bridged traffic through netfilter (the
/// kernel proxy and NetworkPolicy rely on it), binding Service addresses of both families, no
/// DAD.
pub const NODE_SYSCTLS: &[(&str, &str)] = &[
    ("net/ipv4/ip_forward", "1"),
    ("net/ipv6/conf/all/forwarding", "1"),
    ("net/bridge/bridge-nf-call-iptables", "1"),
    ("net/bridge/bridge-nf-call-ip6tables", "1"),
    ("net/ipv4/ip_nonlocal_bind", "1"),
    ("net/ipv6/ip_nonlocal_bind", "1"),
    // Addresses here are unique by construction (IPAM): no duplicate address detection, which
    // would keep the pod bridge's IPv6 gateway tentative (unusable) for a second or two.
    ("net/ipv6/conf/default/accept_dad", "0"),
    ("net/ipv6/conf/all/accept_dad", "0"),
];

/// Removes every namespace whose name starts with `prefix-` (pods first, the cluster
/// namespace last); returns how many.
pub fn remove_prefix(prefix: &str) -> usize {
    let mut names = list_with_prefix(&format!("{prefix}-"));
    // Pods, then nodes, then the cluster namespace.
    names.sort_by_key(|n| {
        if n.ends_with("-cluster") {
            2
        } else if n.contains("-node") {
            1
        } else {
            0
        }
    });
    for n in &names {
        delete(n);
    }
    names.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> ClusterPlan {
        ClusterPlan::new(
            "ferry-0000abcd",
            &["n-1".to_string(), "n-2".to_string()],
            vec![
                "10.96.0.0/16".parse().expect("net"),
                "fd00:10:96::/112".parse().expect("net"),
            ],
        )
    }

    #[test]
    fn names_and_addresses() {
        let p = plan();
        assert_eq!(p.cluster_netns, "ferry-0000abcd-cluster");
        assert_eq!(p.nodes[1].netns, "ferry-0000abcd-node2");
        assert_eq!(
            p.nodes[0].ips,
            vec![
                "198.18.0.11".parse::<IpAddr>().expect("ip"),
                "fd00:198:18::b".parse().expect("ip")
            ]
        );
        assert_eq!(
            p.gateway,
            vec![
                "198.18.0.1".parse::<IpAddr>().expect("ip"),
                "fd00:198:18::1".parse().expect("ip")
            ]
        );
        assert_eq!(
            p.namespaces(),
            vec![
                "ferry-0000abcd-node1",
                "ferry-0000abcd-node2",
                "ferry-0000abcd-cluster"
            ]
        );
    }

    #[test]
    fn scripts() {
        let p = plan();
        let c = p.cluster_script();
        assert!(c.contains("addr add 198.18.0.1/24 dev fbr0\n"), "{c}");
        assert!(
            c.contains("addr add fd00:198:18::1/64 dev fbr0 nodad\n"),
            "{c}"
        );
        assert!(c.contains("link add fv2 type veth peer name eth0 netns ferry-0000abcd-node2\n"));
        assert!(
            c.contains("route replace 10.96.0.0/16 via 198.18.0.11\n"),
            "{c}"
        );
        assert!(
            c.contains("route replace fd00:10:96::/112 via fd00:198:18::b\n"),
            "{c}"
        );
        let n = p.node_script(&p.nodes[1]);
        assert_eq!(
            n,
            "link set lo up\naddr add 198.18.0.12/24 dev eth0\naddr add fd00:198:18::c/64 dev eth0 nodad\n\
             link set eth0 up\nroute add 0.0.0.0/0 via 198.18.0.1\nroute add ::/0 via fd00:198:18::1\n\
             route add local 10.96.0.0/16 dev lo\nroute add local fd00:10:96::/112 dev lo\n"
        );
        let r = p.pod_route_script(
            "n-2",
            &[
                "10.244.1.7/24".parse().expect("net"),
                "fd00:10:244:1::/64".parse().expect("net"),
            ],
        );
        assert_eq!(
            r,
            "route replace 10.244.1.0/24 via 198.18.0.12\nroute replace fd00:10:244:1::/64 via fd00:198:18::c\n"
        );
        assert_eq!(p.pod_route_script("other", &[]), "");
        // Kernel proxy modes: no local Service routes in the nodes; the cluster namespace
        // still sends the ranges to the first node.
        let mut k = p.clone();
        k.node_local_routes = false;
        let n = k.node_script(&k.nodes[1]);
        assert!(!n.contains("route add local"), "{n}");
        assert!(n.contains("route add 0.0.0.0/0 via 198.18.0.1\n"), "{n}");
        assert!(
            k.cluster_script()
                .contains("route replace 10.96.0.0/16 via 198.18.0.11\n")
        );
        let old: ClusterPlan = serde_json::from_value({
            let mut v = serde_json::to_value(&p).expect("json");
            v.as_object_mut()
                .expect("object")
                .remove("node_local_routes");
            v
        })
        .expect("a plan recorded before the field existed");
        assert!(old.node_local_routes);
    }

    #[test]
    fn prefix_is_stable_and_short() {
        let a = prefix_for(Path::new("/nonexistent/a"));
        assert_eq!(a, prefix_for(Path::new("/nonexistent/a")));
        assert_ne!(a, prefix_for(Path::new("/nonexistent/b")));
        assert_eq!(a.len(), "ferry-".len() + 8);
    }
}
