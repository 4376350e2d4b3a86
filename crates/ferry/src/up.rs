//! `ferry up`: the cluster's services around the API server, in one process, each an ordinary
//! client of the API server just started — controllers, cluster DNS, node agents and the
//! userspace service proxy — on one of two pod networks:
//!
//! - **netns** (as root, the default): a cluster namespace whose bridge joins one namespace per
//!   node (`--nodes N`); pods get their own namespaces from CNI plugins run inside their node's;
//!   each node namespace runs the service proxy and answers on the kube-dns address; the API
//!   server, in the machine's namespace on loopback, is reached from the cluster network through
//!   a forwarder listening on the cluster bridge's gateway address. The machine's own namespace
//!   is never changed.
//! - **loopback**: pods, Services and load balancers all in 127.0.0.0/8, so nothing touches the
//!   machine's network (rootless).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::ServerArgs;
use ferry_node::is_root;

/// The Service range of `ferry up` when none is given.
pub const SERVICE_RANGE: &str = "127.96.0.0/16";
/// The load-balancer pool of `ferry up` when none is given.
const LOADBALANCER_RANGE: &str = "127.0.0.240-127.0.0.254";

/// The tenth address of the primary Service range: the kube-dns Service (as kubeadm does).
fn kube_dns_ip(service_range: &str) -> Option<IpAddr> {
    let first = service_range.split(',').next()?.trim();
    let net: ipnet::IpNet = first.parse().ok()?;
    match net.network() {
        IpAddr::V4(a) => Some(IpAddr::V4(Ipv4Addr::from(u32::from(a).checked_add(10)?))),
        IpAddr::V6(a) => Some(IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(a).checked_add(10)?,
        ))),
    }
}

/// The kube-dns address of each family of the Service range (the tenth address of each).
fn kube_dns_ips(service_range: &str) -> Vec<IpAddr> {
    service_range
        .split(',')
        .filter_map(|r| kube_dns_ip(r.trim()))
        .take(2)
        .collect()
}

/// The kernel proxy's kube-dns endpoints: each node's address of each kube-dns family.
fn kube_dns_endpoints(
    plan: &ferry_node::netns::ClusterPlan,
    dns_ips: &[IpAddr],
) -> Vec<(IpAddr, String)> {
    plan.nodes
        .iter()
        .flat_map(|n| {
            n.ips
                .iter()
                .filter(|i| dns_ips.iter().any(|d| d.is_ipv4() == i.is_ipv4()))
                .map(|i| (*i, n.name.clone()))
        })
        .collect()
}

/// The first node-sized block of the cluster CIDR (the one node IPAM gives the only node).
fn first_pod_block(cluster_cidr: &str) -> Option<ipnet::IpNet> {
    let net: ipnet::IpNet = cluster_cidr.split(',').next()?.trim().parse().ok()?;
    let len = if net.addr().is_ipv4() { 24 } else { 64 };
    net.subnets(len.max(net.prefix_len())).ok()?.next()
}

/// The pod network `ferry up` runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodNetworkMode {
    Loopback,
    Netns,
}

/// Service range of the netns mode when none is given (dual-stack).
pub const NETNS_SERVICE_RANGE: &str = "10.96.0.0/16,fd00:10:96::/112";
/// Pod range of the netns mode when none is given (dual-stack; /24 and /64 per node).
pub const NETNS_CLUSTER_CIDR: &str = "10.244.0.0/16,fd00:10:244::/56";
/// Load-balancer pool of the netns mode (answered by every node, routed to the first from the
/// cluster namespace).
const NETNS_LOADBALANCER_RANGE: &str = "198.18.255.240-198.18.255.254";
const NETNS_LOADBALANCER_NET: &str = "198.18.255.0/24";

fn loopback_cidr(s: &str) -> bool {
    let lo: ipnet::IpNet = "127.0.0.0/8".parse().expect("literal");
    s.split(',')
        .filter_map(|c| c.trim().parse::<ipnet::IpNet>().ok())
        .any(|n| lo.contains(&n))
}

/// Decides the pod network: `--pod-network`, or `auto` — netns as root (with iproute2 and
/// nsenter) unless the given ranges are loopback ones; loopback otherwise.
pub fn pod_network_mode(a: &ServerArgs) -> PodNetworkMode {
    let have = |cmd: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
    };
    match a.pod_network.as_str() {
        "loopback" => PodNetworkMode::Loopback,
        "netns" => PodNetworkMode::Netns,
        _ => {
            let loopback_ranges = a.cluster_cidr.as_deref().is_some_and(loopback_cidr)
                || a.service_cluster_ip_range
                    .as_deref()
                    .is_some_and(loopback_cidr);
            if is_root() && have("ip") && have("nsenter") && !loopback_ranges {
                PodNetworkMode::Netns
            } else {
                PodNetworkMode::Loopback
            }
        }
    }
}

/// The service proxy mode of `ferry up`: `--proxy-mode`, else nftables on the netns pod network
/// and userspace on the loopback one. The kernel modes only ever write into node namespaces, so
/// the loopback network (the machine's own namespace) refuses them.
pub fn proxy_mode(a: &ServerArgs, net: PodNetworkMode) -> Result<ferry_proxy::ProxyMode> {
    use ferry_proxy::ProxyMode;
    let mode = match (a.proxy_mode.as_deref(), net) {
        (None, PodNetworkMode::Netns) | (Some("nftables"), _) => ProxyMode::Nftables,
        (Some("iptables"), _) => ProxyMode::Iptables,
        _ => ProxyMode::Userspace,
    };
    if net == PodNetworkMode::Loopback && mode != ProxyMode::Userspace {
        anyhow::bail!(
            "--proxy-mode {} needs the netns pod network (run as root): the loopback pod \
             network shares the machine's namespace, whose rules Ferry never changes",
            a.proxy_mode.as_deref().unwrap_or_default()
        );
    }
    Ok(mode)
}

/// The Service range `ferry up` uses when none is given.
pub fn default_service_range(a: &ServerArgs) -> &'static str {
    match pod_network_mode(a) {
        PodNetworkMode::Netns => NETNS_SERVICE_RANGE,
        PodNetworkMode::Loopback => SERVICE_RANGE,
    }
}

/// The pod range in effect.
pub fn cluster_cidr(a: &ServerArgs) -> String {
    a.cluster_cidr
        .clone()
        .unwrap_or_else(|| match pod_network_mode(a) {
            PodNetworkMode::Netns => NETNS_CLUSTER_CIDR.to_string(),
            PodNetworkMode::Loopback => LOOPBACK_CLUSTER_CIDR.to_string(),
        })
}

/// The loopback mode's pod range when none is given.
pub const LOOPBACK_CLUSTER_CIDR: &str = "127.100.0.0/16";

/// Extra names of the API server's certificate in netns mode: its address on the cluster
/// bridge and the `kubernetes` Service's ClusterIPs (pods reach it through both).
pub fn extra_sans(a: &ServerArgs) -> Vec<String> {
    if pod_network_mode(a) != PodNetworkMode::Netns {
        return Vec::new();
    }
    let mut v: Vec<String> = ferry_node::netns::ClusterPlan::new("x", &[], Vec::new())
        .gateway
        .iter()
        .map(|g| g.to_string())
        .collect();
    for r in crate::service_range(a, "up").split(',') {
        if let Ok(net) = r.trim().parse::<ipnet::IpNet>()
            && let Some(first) = nth_host(&net, 1)
        {
            v.push(first.to_string());
        }
    }
    v
}

fn nth_host(net: &ipnet::IpNet, n: u128) -> Option<IpAddr> {
    match net.network() {
        IpAddr::V4(a) => Some(IpAddr::V4(Ipv4Addr::from(
            u32::from(a).checked_add(u32::try_from(n).ok()?)?,
        ))),
        IpAddr::V6(a) => Some(IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(a).checked_add(n)?,
        ))),
    }
}

/// What `ferry up` started around the API server; [`Services::stop`] after the shutdown token
/// is cancelled waits for the node agents and removes the cluster network.
#[derive(Default)]
pub struct Services {
    agents: Vec<tokio::task::JoinHandle<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    plan: Option<ferry_node::netns::ClusterPlan>,
    data_dir: std::path::PathBuf,
    /// netns mode: the running nodes (a deleted Node's entry is taken out and torn down).
    nodes: NodeRuns,
    /// `--host-routes`: the link and routes in the machine's namespace.
    host_routes: Option<ferry_node::hostroutes::HostRoutes>,
}

/// One node of the netns cluster: what stops it and what to wait for.
struct NodeRun {
    name: String,
    stop: CancellationToken,
    agent: Option<tokio::task::JoinHandle<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    state_dir: std::path::PathBuf,
    pod_prefix: String,
}

type NodeRuns = std::sync::Arc<std::sync::Mutex<Vec<NodeRun>>>;

impl Services {
    /// Waits (bounded) for the agents to stop their pods, then removes every namespace.
    pub async fn stop(mut self) {
        let runs: Vec<NodeRun> =
            std::mem::take(&mut *self.nodes.lock().unwrap_or_else(|p| p.into_inner()));
        for r in runs {
            self.agents.extend(r.agent);
            self.threads.extend(r.thread);
        }
        let wait = async {
            for a in self.agents {
                let _ = a.await;
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(15), wait).await;
        let threads = self.threads;
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio::task::spawn_blocking(move || {
                for t in threads {
                    let _ = t.join();
                }
            }),
        )
        .await;
        if let Some(plan) = self.plan {
            let n = ferry_node::netns::remove_prefix(&plan.prefix);
            let _ = std::fs::remove_file(self.data_dir.join(NETNS_FILE));
            tracing::info!("removed {n} network namespace(s)");
        }
        // The link died with the cluster namespace; this removes it if that failed.
        if let Some(h) = self.host_routes {
            h.remove();
        }
    }
}

/// Watches Nodes; when one of the cluster's nodes is deleted (`kubectl delete node`), stops
/// its agent (which stops its pods), service proxy and DNS listener, then removes its pod
/// networks, namespace, veth and routes (the pods bound to it go through the controllers'
/// pod GC, as upstream).
async fn remove_deleted_nodes(
    client: kube::Client,
    runs: NodeRuns,
    plan: std::sync::Arc<std::sync::Mutex<ferry_node::netns::ClusterPlan>>,
    data_dir: std::path::PathBuf,
    bin_dirs: Vec<std::path::PathBuf>,
    kernel_dns: Option<Vec<IpAddr>>,
    shutdown: CancellationToken,
) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    // Nodes seen registered: only those can be deleted (an agent may not have registered yet).
    let mut seen: std::collections::HashSet<String> = Default::default();
    let mut listed: Option<std::collections::HashSet<String>> = None;
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = stream.next() => ev,
        };
        let mut deleted = Vec::new();
        match ev {
            Some(Ok(watcher::Event::Init)) => listed = Some(Default::default()),
            Some(Ok(watcher::Event::InitApply(n))) => {
                let name = kube::ResourceExt::name_any(&n);
                if let Some(l) = listed.as_mut() {
                    l.insert(name.clone());
                }
                seen.insert(name);
            }
            Some(Ok(watcher::Event::InitDone)) => {
                // A relist: nodes seen before and missing now were deleted meanwhile.
                if let Some(l) = listed.take() {
                    deleted.extend(seen.iter().filter(|n| !l.contains(*n)).cloned());
                }
            }
            Some(Ok(watcher::Event::Apply(n))) => {
                seen.insert(kube::ResourceExt::name_any(&n));
            }
            Some(Ok(watcher::Event::Delete(n))) => deleted.push(kube::ResourceExt::name_any(&n)),
            Some(Err(e)) => {
                tracing::debug!("node watch: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            None => return,
        }
        for name in deleted {
            seen.remove(&name);
            let run = {
                let mut r = runs.lock().unwrap_or_else(|p| p.into_inner());
                r.iter().position(|x| x.name == name).map(|i| r.remove(i))
            };
            let Some(run) = run else { continue };
            remove_node(run, &plan, &data_dir, &bin_dirs).await;
            // The kernel proxy's kube-dns endpoints lose the node's DNS listeners.
            if let Some(ips) = &kernel_dns {
                let p = plan.lock().unwrap_or_else(|p| p.into_inner()).clone();
                point_kube_dns_endpoints(&client, &kube_dns_endpoints(&p, ips)).await;
            }
        }
    }
}

async fn remove_node(
    mut run: NodeRun,
    plan: &std::sync::Mutex<ferry_node::netns::ClusterPlan>,
    data_dir: &Path,
    bin_dirs: &[std::path::PathBuf],
) {
    use std::time::Duration;
    let name = run.name.clone();
    eprintln!(
        "ferry up: node {name} was deleted: stopping its agent, proxy and DNS, removing its network"
    );
    run.stop.cancel();
    if let Some(a) = run.agent.take() {
        let _ = tokio::time::timeout(Duration::from_secs(20), a).await;
    }
    if let Some(t) = run.thread.take() {
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::task::spawn_blocking(move || t.join()),
        )
        .await;
    }
    let current = plan.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (state_dir, pod_prefix) = (run.state_dir.clone(), run.pod_prefix.clone());
    let (n2, bins) = (name.clone(), bin_dirs.to_vec());
    let cur2 = current.clone();
    let r = tokio::task::spawn_blocking(move || {
        ferry_node::noderemoval::remove_node(&cur2, &n2, &state_dir, &bins, &pod_prefix)
    })
    .await;
    match r {
        Ok(Ok(n)) if n > 0 => tracing::info!("node {name}: cleaned up {n} pod network(s)"),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!("removing node {name}'s network: {e}"),
        Err(e) => tracing::warn!("removing node {name}'s network: {e}"),
    }
    let _ = std::fs::remove_dir_all(&run.state_dir);
    let next = ferry_node::noderemoval::without(&current, &name);
    if let Ok(text) = serde_json::to_vec_pretty(&next) {
        let _ = std::fs::write(data_dir.join(NETNS_FILE), text);
    }
    *plan.lock().unwrap_or_else(|p| p.into_inner()) = next;
    // A removed node's agent is stopped on purpose: not a readiness failure.
    crate::supervise::add_check(&format!("ferry-agent-{name}"), || Ok(()));
    eprintln!("ferry up: node {name} removed");
}

/// Where `ferry up` records its cluster network (read by `ferry exec-net`).
pub const NETNS_FILE: &str = "netns.json";

/// `ferry exec-net`: runs a command inside the cluster network of the `ferry up` using
/// `data_dir` — in the cluster namespace (every pod and, through the first node, every Service
/// address is reachable), or in a node's namespace with `--node`.
pub fn exec_net(data_dir: &Path, node: Option<&str>, cmd: &[String]) -> Result<i32> {
    let text = std::fs::read_to_string(data_dir.join(NETNS_FILE)).with_context(|| {
        format!(
            "no cluster network recorded in {} (is `ferry up` running there in netns mode?)",
            data_dir.display()
        )
    })?;
    let plan: ferry_node::netns::ClusterPlan =
        serde_json::from_str(&text).context("reading the cluster network record")?;
    let ns = match node {
        None => plan.cluster_netns.clone(),
        Some(n) => plan
            .nodes
            .iter()
            .find(|p| p.name == n || p.netns == n)
            .map(|p| p.netns.clone())
            .with_context(|| {
                format!(
                    "no node {n:?} (nodes: {})",
                    plan.nodes
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?,
    };
    let cmd: Vec<String> = if cmd.is_empty() {
        vec![std::env::var("SHELL").unwrap_or_else(|_| "sh".into())]
    } else {
        cmd.to_vec()
    };
    let status = std::process::Command::new("nsenter")
        .arg(format!("--net={}", ferry_node::netns::path(&ns).display()))
        .arg("--")
        .args(&cmd)
        .status()
        .context("running nsenter")?;
    Ok(status.code().unwrap_or(1))
}

/// Starts controllers, DNS, agents and proxies; returns once they are spawned.
pub async fn start_services(
    a: &ServerArgs,
    running: &ferry_apiserver::Running,
    shutdown: &CancellationToken,
) -> Result<Services> {
    if pod_network_mode(a) == PodNetworkMode::Netns {
        return start_netns(a, running, shutdown).await;
    }
    if a.pod_network == "auto" && !is_root() {
        eprintln!(
            "ferry up: not running as root: pods use the loopback pod network (addresses in \
             127.0.0.0/8, the host's network namespace); run as root for a network namespace per \
             pod, several nodes (--nodes) and IPv6"
        );
    }
    if a.nodes > 1 {
        anyhow::bail!(
            "--nodes {} needs the netns pod network (run as root)",
            a.nodes
        );
    }
    if a.host_routes {
        anyhow::bail!(
            "--host-routes needs the netns pod network (run as root): the loopback pod network \
             is reachable from the host already"
        );
    }
    proxy_mode(a, PodNetworkMode::Loopback)?;
    // The API server's `proxy` subresources reach loopback pods directly.
    running.server.set_pod_network(std::sync::Arc::new(
        ferry_apiserver::resourceproxy::Direct {
            loopback: ferry_apiserver::alloc::parse_service_cidrs(&cluster_cidr(a))
                .unwrap_or_default(),
        },
    ));
    // Each component with its own client certificate and least privilege (issue 14).
    let ids =
        ferry_apiserver::pki::component_kubeconfigs(&a.data_dir, &running.url, &running.kubeconfig)
            .context("issuing the components' client certificates")?;
    let service_range = crate::service_range(a, "up");
    let dns_ip =
        kube_dns_ip(&service_range).context("the Service range has no room for kube-dns")?;
    let root = is_root();
    ensure_kube_dns_service(running, &[dns_ip]).await;
    ensure_storage_class(running).await;

    let cluster_cidr = cluster_cidr(a);
    start_controllers(
        &ids.controllers,
        shutdown,
        &a.data_dir,
        &a.controllers_arg,
        &cluster_cidr,
        &service_range,
        LOADBALANCER_RANGE,
    )?;

    let dns_listen = a.listen_dns.clone().unwrap_or_else(|| {
        if root {
            format!("{}:53", bracket(dns_ip))
        } else {
            "127.0.0.1:1053".to_string()
        }
    });
    if dns_listen != "off" {
        start_dns(a, &ids.dns, shutdown, &dns_listen).await?;
    }
    if !root {
        eprintln!(
            "ferry up: not running as root, so: pods share the host's /etc/resolv.conf, /etc/hosts and \
             hostname (no mount/UTS namespaces); cluster DNS listens on {dns_listen} instead of {dns_ip}:53; \
             Service ports below 1024 cannot be served"
        );
    }

    let node_name = a.node_name.clone().unwrap_or_else(ferry_node::host_name);
    let mut agent = ferry_node::AgentArgs::defaults();
    agent.kubeconfig = Some(
        ferry_apiserver::pki::node_kubeconfig(
            &a.data_dir,
            &running.url,
            &running.kubeconfig,
            &node_name,
        )
        .context("issuing the agent's client certificate")?,
    );
    agent.node_name = Some(node_name.clone());
    agent.node_ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    agent.cluster_dns = vec![dns_ip.to_string()];
    agent.state_dir = a.data_dir.join("agent");
    agent.port = a.agent_port;
    // The agent's endpoint: HTTPS with a serving certificate from the cluster CA, callers
    // authenticated by client certificates from that CA (the API server's kubelet client one).
    let tls = ferry_apiserver::pki::issue_agent_serving(&a.data_dir, &node_name, &[agent.node_ip])
        .context("issuing the agent's serving certificate")?;
    agent.tls_cert_file = Some(tls.cert_file);
    agent.tls_private_key_file = Some(tls.key_file);
    agent.client_ca_file = Some(tls.ca_file);
    // The node is NotReady until node IPAM (in the controllers) gives it a pod CIDR.
    agent.wait_for_pod_cidr = true;
    if let Some(block) = first_pod_block(&cluster_cidr) {
        agent.pod_cidr = block;
    }
    let stop = shutdown.clone();
    let agent_task = crate::supervise::spawn(
        crate::supervise::Component::new("ferry-agent"),
        shutdown.clone(),
        move || ferry_node::run(agent.clone(), stop.clone().cancelled_owned()),
    );

    start_proxy(&ids.proxy, shutdown, &node_name, &a.proxy_healthz_listen)?;
    // The loopback pod network cannot isolate pods: every NetworkPolicy gets a Warning Event
    // saying so, and the first one is reported here, once.
    {
        let kc = ids.netpol.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            match ferry_kubeclient::client(Some(&kc)).await {
                Ok(c) => {
                    ferry_netpol::warn::run(c, "loopback".into(), stop, |name| {
                        eprintln!(
                            "ferry up: NetworkPolicy {name} (and any other) is not enforced on the \
                             loopback pod network; each gets a Warning Event (run as root for the \
                             netns pod network, which enforces them)"
                        )
                    })
                    .await
                }
                Err(e) => tracing::warn!("NetworkPolicy warnings: {e:#}"),
            }
        });
    }
    start_ingress(a, running, &ids.ingress, shutdown, root).await;
    eprintln!(
        "ferry up: node {node_name}, Services in {service_range}, pods in {cluster_cidr}, kube-dns {dns_ip}"
    );
    Ok(Services {
        agents: vec![agent_task],
        ..Default::default()
    })
}

/// Node names of a `--nodes N` cluster: the base name alone for one node, `<base>-<i>`
/// otherwise.
pub fn node_names(base: &str, n: usize) -> Vec<String> {
    if n <= 1 {
        return vec![base.to_string()];
    }
    (1..=n).map(|i| format!("{base}-{i}")).collect()
}

/// netns mode: the cluster network, the API forwarder, controllers, DNS index, and per node an
/// agent (here) plus the proxy and DNS listeners (on a thread inside the node namespace).
async fn start_netns(
    a: &ServerArgs,
    running: &ferry_apiserver::Running,
    shutdown: &CancellationToken,
) -> Result<Services> {
    use ferry_node::netns;
    let kubeconfig = running.kubeconfig.clone();
    let service_range = crate::service_range(a, "up");
    let cluster_cidr = cluster_cidr(a);
    let dns_ip =
        kube_dns_ip(&service_range).context("the Service range has no room for kube-dns")?;
    // kube-dns answers on both families of a dual-stack cluster (a PreferDualStack Service).
    let dns_ips = kube_dns_ips(&service_range);
    ensure_kube_dns_service(running, &dns_ips).await;
    ensure_storage_class(running).await;

    // The cluster network; whatever a previous run on this data directory left goes first.
    let prefix = netns::prefix_for(&a.data_dir);
    let stale = netns::remove_prefix(&prefix);
    if stale > 0 {
        eprintln!("ferry up: removed {stale} network namespace(s) a previous run left");
    }
    let base = a.node_name.clone().unwrap_or_else(ferry_node::host_name);
    let names = node_names(&base, a.nodes.max(1));
    let mut local: Vec<ipnet::IpNet> = service_range
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    if let Ok(lb) = NETNS_LOADBALANCER_NET.parse() {
        local.push(lb);
    }
    let mode = proxy_mode(a, PodNetworkMode::Netns)?;
    let kernel_proxy = mode != ferry_proxy::ProxyMode::Userspace;
    let mut plan = netns::ClusterPlan::new(&prefix, &names, local);
    // The userspace proxy binds Service addresses, so they are local in every node; the kernel
    // modes DNAT them on their way out (the default route) or through (from pods).
    plan.node_local_routes = !kernel_proxy;
    let mut services = Services {
        plan: Some(plan.clone()),
        data_dir: a.data_dir.clone(),
        ..Default::default()
    };
    if let Err(e) = plan.apply() {
        plan.remove();
        return Err(anyhow::Error::new(e).context("creating the cluster network"));
    }
    std::fs::write(
        a.data_dir.join(NETNS_FILE),
        serde_json::to_vec_pretty(&plan)?,
    )?;
    // Opt-in: routes in the machine's own namespace to the cluster's ranges.
    if a.host_routes {
        let pods: Vec<ipnet::IpNet> = cluster_cidr
            .split(',')
            .filter_map(|r| r.trim().parse().ok())
            .collect();
        let svcs: Vec<ipnet::IpNet> = service_range
            .split(',')
            .filter_map(|r| r.trim().parse().ok())
            .collect();
        let existing = ferry_node::hostroutes::machine_routes();
        let h = ferry_node::hostroutes::HostRoutes::plan(&plan, &pods, &svcs, &existing)?;
        eprintln!("{}", h.warning());
        if let Err(e) = h.apply() {
            plan.remove();
            return Err(anyhow::Error::new(e).context("adding host routes"));
        }
        services.host_routes = Some(h);
    }

    // The API server for pods: a forwarder on the cluster bridge's gateway addresses.
    let api_port = running.addr.port();
    let cluster_ns = netns::path(&plan.cluster_netns);
    // ...and pods for the API server: its `proxy` subresources dial from the cluster namespace,
    // where every node's pod CIDR is routed.
    running
        .server
        .set_pod_network(std::sync::Arc::new(ClusterNetns(cluster_ns.clone())));
    for gw in &plan.gateway {
        let addr = std::net::SocketAddr::new(*gw, api_port);
        let l = netns::bind_tcp_in(Some(&cluster_ns), addr)
            .with_context(|| format!("API forwarder on {addr}"))?;
        let l = tokio::net::TcpListener::from_std(l)?;
        tokio::spawn(forward(l, running.addr, shutdown.clone()));
    }
    let client = ferry_kubeclient::client(Some(&kubeconfig)).await?;
    // Each component with its own client certificate and least privilege (issue 14).
    let ids =
        ferry_apiserver::pki::component_kubeconfigs(&a.data_dir, &running.url, &running.kubeconfig)
            .context("issuing the components' client certificates")?;
    if let Some(gw) = plan.gateway.first() {
        point_kubernetes_endpoints(&client, *gw, api_port).await;
    }
    upgrade_kube_dns_service(&client, &dns_ips).await;
    // kube-dns: with a kernel proxy, a Service whose endpoints are the DNS listeners on the
    // node addresses (as CoreDNS pods would be); with the userspace proxy, the DNS servers
    // answer on the Service address itself and the Service has no endpoints.
    let dns_endpoints: Vec<(IpAddr, String)> = if kernel_proxy {
        kube_dns_endpoints(&plan, &dns_ips)
    } else {
        Vec::new()
    };
    if a.listen_dns.as_deref() != Some("off") {
        point_kube_dns_endpoints(&client, &dns_endpoints).await;
    }

    start_controllers(
        &ids.controllers,
        shutdown,
        &a.data_dir,
        &a.controllers_arg,
        &cluster_cidr,
        &service_range,
        NETNS_LOADBALANCER_RANGE,
    )?;

    // Cluster DNS: one index fed by watches here; each node namespace answers on the kube-dns
    // address from it.
    let dns = if a.listen_dns.as_deref() != Some("off") {
        let dns_client = ferry_kubeclient::client(Some(&ids.dns)).await?;
        Some(dns_index(a, &dns_client, shutdown).await?)
    } else {
        None
    };

    // NetworkPolicy metrics of every node (verdict counters read from each node's table).
    let netpol_metrics = std::sync::Arc::new(ferry_netpol::metrics::Metrics::new());
    if a.netpol_metrics_listen != "off" {
        match tokio::net::TcpListener::bind(&a.netpol_metrics_listen).await {
            Ok(l) => {
                if let Ok(addr) = l.local_addr() {
                    eprintln!("ferry up: NetworkPolicy metrics on http://{addr}/metrics");
                }
                tokio::spawn(ferry_netpol::metrics::serve(
                    l,
                    netpol_metrics.clone(),
                    shutdown.clone(),
                ));
            }
            Err(e) => eprintln!(
                "ferry up: NetworkPolicy metrics not served: binding {}: {e}",
                a.netpol_metrics_listen
            ),
        }
    }

    // NetworkPolicy: one set of watches (made here, as DNS's) feeds every node's sync loop.
    let netpol_tracker = ferry_netpol::agent::watch(
        ferry_kubeclient::client(Some(&ids.netpol)).await?,
        shutdown.child_token(),
    );

    // Ingress: one controller; listeners on every node's addresses, inside its namespace.
    let ingress_ports = netns_ingress_ports(a);
    let ingress = start_netns_ingress(running, &ids.ingress, &plan, ingress_ports, shutdown).await;

    for (i, node) in plan.nodes.iter().enumerate() {
        let node_ns = netns::path(&node.netns);
        let mut agent = ferry_node::AgentArgs::defaults();
        agent.kubeconfig = Some(
            ferry_apiserver::pki::node_kubeconfig(
                &a.data_dir,
                &running.url,
                &running.kubeconfig,
                &node.name,
            )
            .context("issuing the agent's client certificate")?,
        );
        agent.node_name = Some(node.name.clone());
        agent.node_ip = node.ips[0];
        agent.secondary_node_ip = node.ips[1..].to_vec();
        agent.endpoint_address = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        agent.port = if i == 0 { a.agent_port } else { 0 };
        agent.cluster_dns = dns_ips.iter().map(|i| i.to_string()).collect();
        agent.state_dir = a.data_dir.join("agent").join("nodes").join(&node.name);
        agent.wait_for_pod_cidr = true;
        agent.pod_network = "netns".into();
        agent.node_netns = Some(node_ns.clone());
        agent.cluster_netns = Some(plan.cluster_netns.clone());
        // Per node, so one node's pod namespaces can be told from another's.
        agent.pod_netns_prefix = format!("{prefix}-pod{}-", i + 1);
        let node_stop = shutdown.child_token();
        let node_state_dir = agent.state_dir.clone();
        let node_pod_prefix = agent.pod_netns_prefix.clone();
        // The agent's endpoint (on loopback, named by the Node's ferry.dev/agent-endpoint
        // annotation): HTTPS with a serving certificate from the cluster CA, as for one node.
        let mut cert_ips = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        cert_ips.extend(node.ips.iter().copied());
        let tls = ferry_apiserver::pki::issue_agent_serving(&a.data_dir, &node.name, &cert_ips)
            .context("issuing the agent's serving certificate")?;
        agent.tls_cert_file = Some(tls.cert_file);
        agent.tls_private_key_file = Some(tls.key_file);
        agent.client_ca_file = Some(tls.ca_file);
        if let Some(d) = &a.cni_conf_dir {
            agent.cni_conf_dir = Some(d.clone());
        }
        if !a.cni_bin_dir.is_empty() {
            agent.cni_bin_dir = a.cni_bin_dir.clone();
        }
        let stop = node_stop.clone();
        let agent_task = crate::supervise::spawn(
            crate::supervise::Component::new(format!("ferry-agent-{}", node.name)),
            node_stop.clone(),
            move || ferry_node::run(agent.clone(), stop.clone().cancelled_owned()),
        );

        // The node's service proxy and DNS listeners, inside its namespace. The kube client is
        // made here: its connections to the API server (on loopback) are made by this runtime.
        let proxy_client = cluster_client(&ids.proxy, &plan, api_port).await?;
        let healthz = if a.proxy_healthz_listen == "off" {
            String::new()
        } else {
            a.proxy_healthz_listen.clone()
        };
        let proxy_args = {
            #[derive(Parser)]
            struct Wrap {
                #[command(flatten)]
                p: ferry_proxy::ProxyArgs,
            }
            let ips: Vec<String> = node.ips.iter().map(|i| i.to_string()).collect();
            Wrap::try_parse_from([
                "proxy".to_string(),
                "--node-name".into(),
                node.name.clone(),
                "--node-ip".into(),
                ips.join(","),
                format!("--proxy-mode={}", mode_name(mode)),
                format!("--cluster-cidr={cluster_cidr}"),
                // Rules are written in the node's namespace, named explicitly.
                format!("--apply-in-netns={}", node.netns),
                format!("--healthz-bind-address={healthz}"),
                // The userspace proxy is reached through kernel portals in Ferry's table
                // (seed 004's userspace mode), not by binding Service addresses.
                format!("--portals={}", !kernel_proxy),
                // The process's proxy budget, shared by the nodes' proxies.
                format!(
                    "--max-connections={}",
                    (budget().proxy / plan.nodes.len().max(1)).max(16)
                ),
            ])
            .context("proxy arguments")?
            .p
        };
        let stop = node_stop.clone();
        let dns = dns.clone();
        let nodes = plan.nodes.len().max(1);
        // Every family: the kube-dns ClusterIPs (userspace proxy) or the node's addresses
        // (the kernel proxy's kube-dns endpoints).
        let dns_listens: Vec<std::net::SocketAddr> = if kernel_proxy {
            node.ips
                .iter()
                .filter(|i| dns_ips.iter().any(|d| d.is_ipv4() == i.is_ipv4()))
                .map(|i| std::net::SocketAddr::new(*i, 53))
                .collect()
        } else {
            dns_ips
                .iter()
                .map(|i| std::net::SocketAddr::new(*i, 53))
                .collect()
        };
        let name = node.name.clone();
        // NetworkPolicy enforcement of this node: Ferry's own nftables table in the node's
        // namespace, kept in line by watches and one sync loop.
        let netpol_tracker = netpol_tracker.clone();
        let mut netpol_cfg = ferry_netpol::agent::AgentConfig::new(
            node.name.clone(),
            ferry_netpol::apply::Target {
                netns: Some(node_ns.clone()),
            },
        );
        netpol_cfg.metrics = Some(netpol_metrics.clone());
        let node_thread =
            netns::spawn_runtime(node_ns, format!("node-{}", i + 1), move || async move {
                let proxy =
                    match ferry_proxy::start(proxy_client, &proxy_args, stop.child_token()).await {
                        Ok(p) => Some(p),
                        Err(e) => {
                            let e = anyhow::Error::from(e);
                            tracing::error!("service proxy of {name}: {e:#}");
                            None
                        }
                    };
                let _netpol =
                    ferry_netpol::agent::start_node(netpol_tracker, netpol_cfg, stop.child_token());
                let mut dns_tasks = Vec::new();
                if let Some((index, metrics, cfg)) = dns {
                    for listen in dns_listens {
                        let mut cfg = cfg.clone();
                        cfg.listen = listen;
                        cfg.tcp.max_connections = (budget().dns_tcp / nodes / 2).max(16);
                        match ferry_dns::server::Server::bind(cfg, index.clone(), metrics.clone())
                            .await
                        {
                            Ok(server) => {
                                let stop = stop.clone();
                                dns_tasks.push(tokio::spawn(server.run(stop.cancelled_owned())));
                            }
                            Err(e) => {
                                let e = anyhow::Error::from(e);
                                tracing::error!("cluster DNS in {name} on {listen}: {e:#}");
                            }
                        }
                    }
                }
                stop.cancelled().await;
                if let Some(p) = proxy {
                    p.stop().await;
                }
                for t in dns_tasks {
                    let _ = t.await;
                }
            })?;
        if let Some(ing) = &ingress {
            serve_node_ingress(
                ing,
                &netns::path(&node.netns),
                &node.ips,
                ingress_ports,
                &node_stop,
            )
            .await;
        }
        services
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(NodeRun {
                name: node.name.clone(),
                stop: node_stop,
                agent: Some(agent_task),
                thread: Some(node_thread),
                state_dir: node_state_dir,
                pod_prefix: node_pod_prefix,
            });
    }
    // `kubectl delete node`: that node's agent, proxy, DNS and network go.
    tokio::spawn(remove_deleted_nodes(
        client.clone(),
        services.nodes.clone(),
        std::sync::Arc::new(std::sync::Mutex::new(plan.clone())),
        a.data_dir.clone(),
        if a.cni_bin_dir.is_empty() {
            ferry_node::AgentArgs::defaults().cni_bin_dir
        } else {
            a.cni_bin_dir.clone()
        },
        (kernel_proxy && a.listen_dns.as_deref() != Some("off")).then(|| dns_ips.clone()),
        shutdown.clone(),
    ));
    if kernel_proxy {
        eprintln!(
            "ferry up: service proxy {} in every node namespace; cluster DNS (kube-dns {dns_ip}:53) \
             served on the node addresses: {}",
            mode_name(mode),
            dns_endpoints
                .iter()
                .map(|(ip, _)| format!("{}:53", bracket(*ip)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    } else {
        eprintln!(
            "ferry up: cluster DNS on {} in every node namespace (UDP and TCP)",
            dns_ips
                .iter()
                .map(|i| format!("{}:53", bracket(*i)))
                .collect::<Vec<_>>()
                .join(" and ")
        );
    }
    eprintln!(
        "ferry up: pod network netns: nodes {} ({}), Services in {service_range}, pods in {cluster_cidr}, \
         kube-dns {dns_ip}, API server for pods on {}:{api_port}; `ferry exec-net --data-dir {} -- CMD` \
         runs a command in the cluster network",
        names.join(", "),
        plan.nodes
            .iter()
            .map(|n| n.netns.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        plan.gateway
            .first()
            .map(|g| g.to_string())
            .unwrap_or_default(),
        a.data_dir.display(),
    );
    Ok(services)
}

type DnsParts = (
    std::sync::Arc<ferry_dns::SharedIndex>,
    std::sync::Arc<ferry_dns::Metrics>,
    ferry_dns::ServerConfig,
);

/// The cluster DNS index (watches), its /metrics server on the machine's loopback, and the
/// server configuration every node's listener uses.
async fn dns_index(
    a: &ServerArgs,
    client: &kube::Client,
    shutdown: &CancellationToken,
) -> Result<DnsParts> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        dns: ferry_dns::DnsArgs,
    }
    let argv: Vec<String> = vec![
        "dns".into(),
        format!("--service-cidr={}", crate::service_range(a, "up")),
        format!("--pod-cidr={}", cluster_cidr(a)),
    ];
    let args = Wrap::try_parse_from(argv).context("DNS arguments")?.dns;
    let metrics = std::sync::Arc::new(ferry_dns::Metrics::new());
    let shared = std::sync::Arc::new(ferry_dns::SharedIndex::new(ferry_dns::index::Index::new(
        args.zone_config(),
    )));
    let watchers = ferry_dns::watch::spawn_watchers(
        client.clone(),
        shared.clone(),
        metrics.clone(),
        args.pods == ferry_dns::PodsMode::Verified,
    );
    let ops = ferry_dns::ops::bind(a.dns_metrics_listen).await?;
    let ops_task = tokio::spawn(ferry_dns::ops::serve(ops, shared.clone(), metrics.clone()));
    let stop = shutdown.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        ops_task.abort();
        for w in watchers {
            w.abort();
        }
    });
    let mut cfg = args.server_config()?;
    // Only the forwarders given: the machine's resolvers are not reachable from the cluster
    // network (and tests never forward to a real upstream).
    cfg.forward.upstreams = a.dns_upstream.clone();
    Ok((shared, metrics, cfg))
}

/// A client for code running inside the cluster network: the kubeconfig's, with the server
/// replaced by the API forwarder on the cluster bridge (a kube client connects from whatever
/// thread polls its requests, here one inside a node namespace).
async fn cluster_client(
    kubeconfig: &Path,
    plan: &ferry_node::netns::ClusterPlan,
    port: u16,
) -> Result<kube::Client> {
    let gw = plan
        .gateway
        .first()
        .context("the cluster network has no gateway")?;
    let server = |old: &str| {
        let scheme = if old.starts_with("http://") {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{gw}:{port}")
    };
    Ok(ferry_kubeclient::client_with_server(kubeconfig, server).await?)
}

/// Copies connections accepted on `l` (in the cluster namespace) to the API server.
async fn forward(l: tokio::net::TcpListener, to: std::net::SocketAddr, stop: CancellationToken) {
    loop {
        let (mut inbound, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = l.accept() => match r {
                Ok(c) => c,
                Err(_) => continue,
            },
        };
        tokio::spawn(async move {
            if let Ok(mut out) = tokio::net::TcpStream::connect(to).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}

/// The `kubernetes` Endpoints name the API server's address on the cluster network.
async fn point_kubernetes_endpoints(client: &kube::Client, ip: IpAddr, port: u16) {
    use k8s_openapi::api::core::v1::Endpoints;
    let api: kube::Api<Endpoints> = kube::Api::namespaced(client.clone(), "default");
    let body = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": ip.to_string()}],
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    });
    let pp = kube::api::PatchParams::default();
    for _ in 0..20 {
        match api
            .patch("kubernetes", &pp, &kube::api::Patch::Merge(&body))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if let Ok(ep) = serde_json::from_value::<Endpoints>(body.clone())
                    && api.create(&Default::default(), &ep).await.is_ok()
                {
                    return;
                }
            }
            Err(e) => tracing::debug!("kubernetes Endpoints: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    tracing::warn!("could not point the kubernetes Endpoints at {ip}:{port}");
}

/// The `kube-system/kube-dns` Endpoints (mirrored into an EndpointSlice by the controllers):
/// the DNS listeners of the nodes, or none (the object is deleted) when the DNS servers answer
/// on the Service address themselves.
async fn point_kube_dns_endpoints(client: &kube::Client, eps: &[(IpAddr, String)]) {
    use k8s_openapi::api::core::v1::Endpoints;
    let api: kube::Api<Endpoints> = kube::Api::namespaced(client.clone(), "kube-system");
    if eps.is_empty() {
        match api.delete("kube-dns", &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!("removing the kube-dns Endpoints: {e}"),
        }
        return;
    }
    let addresses: Vec<serde_json::Value> = eps
        .iter()
        .map(|(ip, node)| json!({"ip": ip.to_string(), "nodeName": node}))
        .collect();
    let body = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kube-dns", "namespace": "kube-system",
                     "labels": {"k8s-app": "kube-dns"}},
        "subsets": [{"addresses": addresses,
                     "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                               {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}],
    });
    let pp = kube::api::PatchParams::default();
    for _ in 0..20 {
        match api
            .patch("kube-dns", &pp, &kube::api::Patch::Merge(&body))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if let Ok(ep) = serde_json::from_value::<Endpoints>(body.clone())
                    && api.create(&Default::default(), &ep).await.is_ok()
                {
                    return;
                }
            }
            Err(e) => tracing::debug!("kube-dns Endpoints: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    tracing::warn!("could not point the kube-dns Endpoints at the nodes' DNS listeners");
}

fn mode_name(m: ferry_proxy::ProxyMode) -> &'static str {
    match m {
        ferry_proxy::ProxyMode::Userspace => "userspace",
        ferry_proxy::ProxyMode::Nftables => "nftables",
        ferry_proxy::ProxyMode::Iptables => "iptables",
    }
}

fn bracket(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    }
}

/// A kube-dns Service left single-stack by an earlier run on this data directory becomes
/// PreferDualStack with the other family's address (as upstream allows: the secondary
/// ClusterIP is added, the primary kept).
async fn upgrade_kube_dns_service(client: &kube::Client, ips: &[IpAddr]) {
    use k8s_openapi::api::core::v1::Service;
    if ips.len() < 2 {
        return;
    }
    let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), "kube-system");
    let Ok(Some(svc)) = api.get_opt("kube-dns").await else {
        return;
    };
    let spec = svc.spec.unwrap_or_default();
    let have = spec.cluster_ips.unwrap_or_default();
    if have.len() != 1 || have[0] != ips[0].to_string() {
        return;
    }
    let body = json!({"spec": {
        "ipFamilyPolicy": "PreferDualStack",
        "clusterIPs": ips.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
        "ipFamilies": ips.iter().map(|i| if i.is_ipv4() { "IPv4" } else { "IPv6" }).collect::<Vec<_>>(),
    }});
    match api
        .patch(
            "kube-dns",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&body),
        )
        .await
    {
        Ok(_) => eprintln!(
            "ferry up: the kube-dns Service is now dual-stack ({})",
            ips.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => tracing::warn!("making the kube-dns Service dual-stack: {e}"),
    }
}

/// The `kube-system/kube-dns` Service (selectorless: the in-process DNS serves its address).
async fn ensure_kube_dns_service(running: &ferry_apiserver::Running, ips: &[IpAddr]) {
    let Some(ip) = ips.first().copied() else {
        return;
    };
    let api = &running.server.api;
    let Some(res) = api.resource("", "v1", "services").cloned() else {
        return;
    };
    let path = ferry_apiserver::request::ResourcePath {
        group: String::new(),
        version: "v1".into(),
        namespace: Some("kube-system".into()),
        resource: "services".into(),
        name: None,
        subresource: None,
    };
    let body = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "kube-dns",
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS", "kubernetes.io/cluster-service": "true"}
        },
        "spec": {
            "clusterIP": ip.to_string(),
            "clusterIPs": ips.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
            "ipFamilies": ips.iter().map(|i| if i.is_ipv4() { "IPv4" } else { "IPv6" }).collect::<Vec<_>>(),
            "ipFamilyPolicy": if ips.len() > 1 { "PreferDualStack" } else { "SingleStack" },
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153}
            ]
        }
    });
    match api
        .create(
            &res,
            &path,
            &ferry_apiserver::request::Query::default(),
            body,
        )
        .await
    {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => tracing::warn!("creating the kube-dns Service: {}", e.message),
    }
}

fn start_controllers(
    kubeconfig: &Path,
    shutdown: &CancellationToken,
    data_dir: &Path,
    extra: &[String],
    cluster_cidr: &str,
    service_range: &str,
    lb_range: &str,
) -> Result<()> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        c: ferry_controllers::ControllersArgs,
    }
    let mut argv: Vec<String> = vec![
        "controllers".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
    ];
    let given = |flag: &str| extra.iter().any(|a| a.starts_with(flag));
    // A one-machine cluster: LoadBalancer Services get loopback addresses (as k3s ServiceLB
    // hands out the node's address), node pod CIDRs come from the loopback pod network.
    if !given("--loadbalancer-ip-range") {
        argv.push(format!("--loadbalancer-ip-range={lb_range}"));
    }
    if !given("--cluster-cidr") {
        argv.push(format!("--cluster-cidr={cluster_cidr}"));
    }
    if !given("--node-ipam-excluded-cidrs") {
        argv.push(format!("--node-ipam-excluded-cidrs={service_range}"));
    }
    // The built-in local-path provisioner's volumes (every node shares this machine's disk).
    if !given("--local-path-dir") {
        argv.push(format!(
            "--local-path-dir={}",
            data_dir.join("storage").display()
        ));
    }
    argv.extend(extra.iter().cloned());
    let args = Wrap::try_parse_from(argv)
        .context("controller arguments")?
        .c;
    let stop = shutdown.clone();
    crate::supervise::spawn(
        crate::supervise::Component::new("ferry-controllers"),
        shutdown.clone(),
        move || ferry_controllers::run(args.clone(), stop.clone().cancelled_owned()),
    );
    Ok(())
}

/// Connection caps of the components sharing this process's descriptors.
fn budget() -> ferry_limits::Budget {
    ferry_limits::plan(
        ferry_limits::fdlimit::current().soft,
        ferry_limits::Parts::ALL,
    )
}

async fn start_dns(
    a: &ServerArgs,
    kubeconfig: &Path,
    shutdown: &CancellationToken,
    listen: &str,
) -> Result<()> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        dns: ferry_dns::DnsArgs,
    }
    let mut argv: Vec<String> = vec![
        "dns".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--listen".into(),
        listen.to_string(),
        "--metrics-listen".into(),
        a.dns_metrics_listen.to_string(),
        format!("--service-cidr={}", crate::service_range(a, "up")),
        format!("--pod-cidr={}", cluster_cidr(a)),
    ];
    if !a.dns_upstream.is_empty() {
        argv.push("--upstream".into());
        argv.push(
            a.dns_upstream
                .iter()
                .map(|u| u.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    argv.push(format!("--tcp-max-connections={}", budget().dns_tcp));
    let args = Wrap::try_parse_from(argv).context("DNS arguments")?.dns;
    // Bind now: a taken port stops `ferry up` at once, naming it.
    let first = ferry_dns::prepare(&args).await?;
    let component = crate::supervise::Component::new("ferry-dns");
    // Ready once the running instance has its first full lists.
    let index: std::sync::Arc<std::sync::Mutex<Option<std::sync::Arc<ferry_dns::SharedIndex>>>> =
        Default::default();
    crate::supervise::add_check("ferry-dns", {
        let (component, index) = (component.clone(), index.clone());
        move || {
            component.check()?;
            match &*index.lock().unwrap_or_else(|p| p.into_inner()) {
                Some(i) if i.is_ready() => Ok(()),
                _ => Err("DNS has not synced Services and EndpointSlices yet".into()),
            }
        }
    });
    let mut first = Some(first);
    let stop = shutdown.clone();
    crate::supervise::spawn(component, shutdown.clone(), move || {
        let (prepared, args, stop, index) =
            (first.take(), args.clone(), stop.clone(), index.clone());
        async move {
            let p = match prepared {
                Some(p) => p,
                None => ferry_dns::prepare(&args).await?,
            };
            *index.lock().unwrap_or_else(|p| p.into_inner()) = Some(p.readiness());
            p.run(stop.cancelled_owned()).await
        }
    });
    eprintln!("ferry up: cluster DNS on {listen} (UDP and TCP)");
    Ok(())
}

/// The Ingress controller and proxy on loopback (ports 80 and 443 as root), and the default
/// IngressClass `ferry` (as k3s installs one for its bundled controller), so that Ingresses
/// naming no class are served.
async fn start_ingress(
    a: &ServerArgs,
    running: &ferry_apiserver::Running,
    kubeconfig: &Path,
    shutdown: &CancellationToken,
    root: bool,
) {
    let (http, https) = if root {
        ("127.0.0.1:80", "127.0.0.1:443")
    } else {
        ("127.0.0.1:8080", "127.0.0.1:8443")
    };
    let mut args = ferry_ingress::IngressArgs::defaults();
    args.kubeconfig = Some(kubeconfig.to_path_buf());
    args.http_addr = a.ingress_http_addr.clone().unwrap_or_else(|| http.into());
    args.https_addr = a.ingress_https_addr.clone().unwrap_or_else(|| https.into());
    if args.http_addr == "off" && args.https_addr == "off" {
        return;
    }
    ensure_ingress_class(running).await;
    let show = |a: Option<std::net::SocketAddr>, scheme: &str| {
        a.map_or("off".to_string(), |a| format!("{scheme}://{a}"))
    };
    match ferry_ingress::start(&args, shutdown.clone()).await {
        Ok(r) => eprintln!(
            "ferry up: ingress listening on {} and {} (IngressClass ferry, controller {})",
            show(r.http, "http"),
            show(r.https, "https"),
            ferry_ingress::CONTROLLER_NAME
        ),
        Err(e) => {
            tracing::warn!("ingress not started: {e}");
            eprintln!("ferry up: ingress not started: {e}");
        }
    }
}

/// The ports of the Ingress listeners on the nodes in netns mode: 80 and 443 unless
/// `--ingress-http-addr` / `--ingress-https-addr` give others (their port is used) or `off`.
fn netns_ingress_ports(a: &ServerArgs) -> (Option<u16>, Option<u16>) {
    let port = |flag: &Option<String>, default: u16| match flag.as_deref() {
        None => Some(default),
        Some("off") | Some("") => None,
        Some(s) => s
            .parse::<std::net::SocketAddr>()
            .map(|sa| sa.port())
            .ok()
            .or_else(|| s.rsplit(':').next().and_then(|p| p.parse().ok())),
    };
    (
        port(&a.ingress_http_addr, 80),
        port(&a.ingress_https_addr, 443),
    )
}

/// netns mode: the Ingress controller, publishing every node's addresses in the Ingresses'
/// status (as an ingress controller run on every node does). `None` when disabled or failed.
async fn start_netns_ingress(
    running: &ferry_apiserver::Running,
    kubeconfig: &Path,
    plan: &ferry_node::netns::ClusterPlan,
    ports: (Option<u16>, Option<u16>),
    shutdown: &CancellationToken,
) -> Option<ferry_ingress::Handle> {
    if ports == (None, None) {
        return None;
    }
    ensure_ingress_class(running).await;
    let mut args = ferry_ingress::IngressArgs::defaults();
    args.kubeconfig = Some(kubeconfig.to_path_buf());
    // IPv4 addresses of all nodes first, then IPv6.
    let mut publish: Vec<IpAddr> = plan.nodes.iter().flat_map(|n| n.ips.clone()).collect();
    publish.sort_by_key(|ip| ip.is_ipv6());
    let publish = publish.iter().map(|ip| ip.to_string()).collect();
    let client = match ferry_kubeclient::client(Some(kubeconfig)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferry up: ingress not started: {e:#}");
            return None;
        }
    };
    match ferry_ingress::Handle::start(client, &args, publish, shutdown.clone()) {
        Ok(h) => Some(h),
        Err(e) => {
            eprintln!("ferry up: ingress not started: {e}");
            None
        }
    }
}

/// One node's Ingress listeners, on each of its addresses, until the node stops.
async fn serve_node_ingress(
    ingress: &ferry_ingress::Handle,
    node_ns: &Path,
    ips: &[IpAddr],
    (http, https): (Option<u16>, Option<u16>),
    stop: &CancellationToken,
) {
    for ip in ips {
        let dp = ferry_ingress::DataPath {
            netns: node_ns.to_path_buf(),
            http: http.map(|p| std::net::SocketAddr::new(*ip, p)),
            https: https.map(|p| std::net::SocketAddr::new(*ip, p)),
        };
        match ingress.serve(dp, stop.clone()).await {
            Ok(r) => eprintln!(
                "ferry up: ingress on {}",
                [
                    r.http.map(|a| format!("http://{a}")),
                    r.https.map(|a| format!("https://{a}"))
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" and ")
            ),
            Err(e) => eprintln!("ferry up: ingress on {ip} not started: {e}"),
        }
    }
}

/// The default StorageClass `local-path` of the built-in provisioner (as k3s installs one for
/// its local-path provisioner): claims naming no class get it; volumes are made for the node
/// of the claim's first pod.
async fn ensure_storage_class(running: &ferry_apiserver::Running) {
    let api = &running.server.api;
    let Some(res) = api
        .resource("storage.k8s.io", "v1", "storageclasses")
        .cloned()
    else {
        return;
    };
    let path = ferry_apiserver::request::ResourcePath {
        group: "storage.k8s.io".into(),
        version: "v1".into(),
        namespace: None,
        resource: "storageclasses".into(),
        name: None,
        subresource: None,
    };
    let body = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": ferry_controllers::storage::binder_core::LOCAL_PATH_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}
        },
        "provisioner": ferry_controllers::storage::binder_core::LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer"
    });
    match api
        .create(
            &res,
            &path,
            &ferry_apiserver::request::Query::default(),
            body,
        )
        .await
    {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => tracing::warn!("creating the StorageClass local-path: {}", e.message),
    }
}

/// The default IngressClass `ferry` for the built-in controller.
async fn ensure_ingress_class(running: &ferry_apiserver::Running) {
    let api = &running.server.api;
    let Some(res) = api
        .resource("networking.k8s.io", "v1", "ingressclasses")
        .cloned()
    else {
        return;
    };
    let path = ferry_apiserver::request::ResourcePath {
        group: "networking.k8s.io".into(),
        version: "v1".into(),
        namespace: None,
        resource: "ingressclasses".into(),
        name: None,
        subresource: None,
    };
    let body = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "IngressClass",
        "metadata": {
            "name": "ferry",
            "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}
        },
        "spec": {"controller": ferry_ingress::CONTROLLER_NAME}
    });
    match api
        .create(
            &res,
            &path,
            &ferry_apiserver::request::Query::default(),
            body,
        )
        .await
    {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => tracing::warn!("creating the IngressClass ferry: {}", e.message),
    }
}

fn start_proxy(
    kubeconfig: &Path,
    shutdown: &CancellationToken,
    node_name: &str,
    healthz: &str,
) -> Result<()> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        p: ferry_proxy::ProxyArgs,
    }
    let healthz = if healthz == "off" { "" } else { healthz };
    let argv: Vec<String> = vec![
        "proxy".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--node-name".into(),
        node_name.to_string(),
        "--node-ip".into(),
        "127.0.0.1".into(),
        format!("--healthz-bind-address={healthz}"),
        format!("--max-connections={}", budget().proxy),
    ];
    let args = Wrap::try_parse_from(argv).context("proxy arguments")?.p;
    let stop = shutdown.clone();
    crate::supervise::spawn(
        crate::supervise::Component::new("ferry-proxy"),
        shutdown.clone(),
        move || ferry_proxy::run(args.clone(), stop.clone().cancelled_owned()),
    );
    Ok(())
}

/// The netns pod network as the API server reaches it: connections made from the cluster
/// namespace (global unicast pod IPs only, as upstream allows).
struct ClusterNetns(std::path::PathBuf);

impl ferry_apiserver::resourceproxy::PodNetwork for ClusterNetns {
    fn allowed(&self, ip: IpAddr) -> bool {
        ferry_apiserver::resourceproxy::location::is_global_unicast(ip)
    }

    fn dial(&self, addr: std::net::SocketAddr) -> ferry_apiserver::resourceproxy::Dialing {
        let ns = self.0.clone();
        Box::pin(async move {
            ferry_node::netns::connect_in(
                Some(ns.as_path()),
                addr,
                std::time::Duration::from_secs(30),
            )
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            kube_dns_ip("127.96.0.0/16"),
            Some("127.96.0.10".parse().expect("ip"))
        );
        assert_eq!(
            kube_dns_ip("10.96.0.0/12,fd00::/108"),
            Some("10.96.0.10".parse().expect("ip"))
        );
        assert_eq!(
            first_pod_block("127.100.0.0/16"),
            Some("127.100.0.0/24".parse().expect("net"))
        );
        assert!(loopback_cidr("127.10.0.0/16"));
        assert!(!loopback_cidr("10.244.0.0/16,fd00:10:244::/56"));
        assert_eq!(
            kube_dns_ips("10.96.0.0/16,fd00:10:96::/112"),
            vec![
                "10.96.0.10".parse::<IpAddr>().expect("ip"),
                "fd00:10:96::a".parse().expect("ip")
            ]
        );
        assert_eq!(kube_dns_ips("127.96.0.0/16").len(), 1);
        let plan = ferry_node::netns::ClusterPlan::new("p", &node_names("n", 2), Vec::new());
        let v4: IpAddr = "10.96.0.10".parse().expect("ip");
        let eps = kube_dns_endpoints(&plan, &kube_dns_ips("10.96.0.0/16,fd00:10:96::/112"));
        assert_eq!(
            eps.iter()
                .map(|(ip, n)| format!("{n}={ip}"))
                .collect::<Vec<_>>(),
            vec![
                "n-1=198.18.0.11",
                "n-1=fd00:198:18::b",
                "n-2=198.18.0.12",
                "n-2=fd00:198:18::c"
            ]
        );
        assert_eq!(kube_dns_endpoints(&plan, &[v4]).len(), 2, "IPv4 only");
        assert_eq!(node_names("n", 1), vec!["n"]);
        assert_eq!(node_names("n", 3), vec!["n-1", "n-2", "n-3"]);
        assert_eq!(
            nth_host(&"fd00:10:96::/112".parse().expect("net"), 1),
            Some("fd00:10:96::1".parse().expect("ip"))
        );
    }
}
