//! `ferry agent`: registers its Node (addresses, labels, capacity, Ready condition, a Lease in
//! `kube-node-lease`) and runs the pods bound to it as processes (issue 7).
//!
//! Pure cores: [`dns`] (resolv.conf, hosts, hostname), [`envvars`] (service variables,
//! downward API), [`podstate`] (phase, conditions, back-off, probes), [`network`] (pod IPs),
//! [`images`] (built-in images). IO: [`runtime`] (processes), [`node`] (registration),
//! [`cni`] (a CNI runtime), [`netns`] (network namespaces, the cluster network of `ferry up`),
//! [`server`] (the endpoint the API server proxies `pods/log` and `pods/exec` to).

pub mod cni;
pub mod dns;
pub mod envvars;
pub mod error;
pub mod hostroutes;
pub mod images;
pub mod logs;
pub mod netns;
pub mod network;
pub mod node;
pub mod noderemoval;
pub mod podstate;
pub mod pty;
pub mod runtime;
pub mod server;
pub mod streaming;
pub mod volumes;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Context, Error, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

/// Flags of `ferry agent` (and of the agent inside `ferry up`).
#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// The kubeconfig to reach the API server (default: `$KUBECONFIG`, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Node name (default: the host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// `topology.kubernetes.io/zone` label.
    #[arg(long)]
    pub zone: Option<String>,
    /// `topology.kubernetes.io/region` label.
    #[arg(long)]
    pub region: Option<String>,
    /// The node's InternalIP (also where the agent endpoint listens unless
    /// `--endpoint-address` says otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub node_ip: IpAddr,
    /// More InternalIPs of the node (repeatable or comma-separated), e.g. its IPv6 address on a
    /// dual-stack node.
    #[arg(long = "secondary-node-ip", value_delimiter = ',')]
    pub secondary_node_ip: Vec<IpAddr>,
    /// Where the agent endpoint listens when not on the node IP (e.g. the node lives in a
    /// network namespace the API server cannot reach): the Node then carries the annotation
    /// `ferry.dev/agent-endpoint` with this address and the endpoint's port.
    #[arg(long)]
    pub endpoint_address: Option<IpAddr>,
    /// Cluster DNS server address(es) for ClusterFirst pods (repeatable).
    #[arg(long = "cluster-dns")]
    pub cluster_dns: Vec<String>,
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Pod network mode: `loopback` (pod IPs inside 127.0.0.0/8, nothing configured) or
    /// `netns` (as root: a network namespace per pod, wired by CNI plugins).
    #[arg(long, default_value = "loopback", value_parser = ["loopback", "netns"])]
    pub pod_network: String,
    /// netns mode: the CNI network configuration directory (the first `*.conflist`/`*.conf`
    /// in lexical order is used). Default: a `bridge` + `host-local` + `portmap` network
    /// rendered from the node's pod CIDRs into `<state dir>/cni/net.d`.
    #[arg(long)]
    pub cni_conf_dir: Option<PathBuf>,
    /// netns mode: where CNI plugin executables are (comma-separated; `CNI_PATH`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "/usr/lib/cni,/opt/cni/bin"
    )]
    pub cni_bin_dir: Vec<PathBuf>,
    /// netns mode: the node's network namespace (a path such as /run/netns/NAME): CNI plugins
    /// and hostNetwork pods run there, probes connect from there. Default: the agent's own.
    #[arg(long)]
    pub node_netns: Option<PathBuf>,
    /// netns mode: a namespace (name under /run/netns) holding routes between nodes; the
    /// agent routes its pod CIDRs there via its node IPs.
    #[arg(long)]
    pub cluster_netns: Option<String>,
    /// netns mode: pod namespaces are named `<prefix><pod uid>` under /run/netns.
    #[arg(long, default_value = "ferry-pod-")]
    pub pod_netns_prefix: String,
    /// Pod CIDR used when the Node has no `spec.podCIDR` (no node IPAM controller).
    #[arg(long, default_value = network::DEFAULT_LOOPBACK_POD_CIDR)]
    pub pod_cidr: ipnet::IpNet,
    /// Wait for node IPAM to set the Node's `spec.podCIDR` (reporting NotReady meanwhile)
    /// instead of falling back to `--pod-cidr`.
    #[arg(long)]
    pub wait_for_pod_cidr: bool,
    /// Where pod files (resolv.conf, hosts, logs) live.
    #[arg(long, default_value = "/var/lib/ferry/agent")]
    pub state_dir: PathBuf,
    /// Port of the agent endpoint (kubelet's 10250; 0 picks a free one).
    #[arg(long, default_value_t = 10250)]
    pub port: u16,
    /// Per-pod mount+UTS namespaces: `auto` (when root and `unshare` exists), `on`, `off`.
    #[arg(long, default_value = "auto")]
    pub isolation: String,
    /// The program that serves built-in images, as a command prefix (default: this
    /// executable with `builtin-image`).
    #[arg(long)]
    pub builtin_command: Option<String>,
    /// First restart back-off delay (seconds), doubling to 300.
    #[arg(long, default_value_t = 10)]
    pub restart_backoff_seconds: u64,
    /// Lease renew interval (seconds); the Node status is reported every 6 renewals.
    #[arg(long, default_value_t = 10)]
    pub heartbeat_seconds: u64,
    /// Allocatable pods.
    #[arg(long, default_value_t = 110)]
    pub max_pods: u32,
    /// The endpoint's serving certificate (PEM; kubelet's flag). Without it and
    /// `--tls-private-key-file` a self-signed one is made in `<state-dir>/pki`, which the API
    /// server (verifying agents against the cluster CA) refuses.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// The serving certificate's private key (PEM).
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// Callers of the endpoint must present a client certificate chaining to this CA (the
    /// cluster CA, which issues the API server's kubelet client certificate). Required unless
    /// `--insecure-allow-unauthenticated`.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Users (client certificate CN) allowed to use the endpoint (logs, exec), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = server::APISERVER_USER)]
    pub authorized_users: Vec<String>,
    /// Groups (client certificate O) allowed to use the endpoint, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = server::DEFAULT_AUTHORIZED_GROUPS)]
    pub authorized_groups: Vec<String>,
    /// DANGEROUS: serve the endpoint without client authentication — anyone who reaches the
    /// port may run commands in pods.
    #[arg(long)]
    pub insecure_allow_unauthenticated: bool,
}

#[derive(clap::Parser)]
struct Wrapper {
    #[command(flatten)]
    args: AgentArgs,
}

impl AgentArgs {
    /// The defaults, as if no flag were given (for embedding and tests).
    pub fn defaults() -> AgentArgs {
        use clap::Parser;
        Wrapper::parse_from(["ferry-agent"]).args
    }
}

/// The host name (`uname(2)`'s node name, then `$HOSTNAME`).
pub fn host_name() -> String {
    Some(
        rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .trim()
            .to_lowercase(),
    )
    .filter(|s| !s.is_empty())
    .or_else(|| std::env::var("HOSTNAME").ok())
    .unwrap_or_else(|| "localhost".into())
}

/// Whether this process runs as root (effective uid 0): what creating network namespaces, veth
/// pairs and mount namespaces needs. The one check every subcommand uses.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn have(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

/// A running agent (for embedding and tests).
pub struct Agent {
    pub endpoint: SocketAddr,
    pub node_name: String,
    pub runtime: Arc<runtime::Runtime>,
}

/// Runs the agent until `shutdown` completes.
pub async fn run(
    args: AgentArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        s.cancel();
    });
    let (_agent, done) = start(args, stop).await?;
    done.await.ok();
    Ok(())
}

/// Starts the agent; the returned handle completes after `stop` is cancelled and every pod
/// process is gone.
pub async fn start(
    args: AgentArgs,
    stop: CancellationToken,
) -> Result<(Agent, tokio::task::JoinHandle<()>)> {
    let client = ferry_kubeclient::client(args.kubeconfig.as_deref()).await?;
    let node_name = args.node_name.clone().unwrap_or_else(host_name);
    let root = is_root();
    let isolate = match args.isolation.as_str() {
        "on" => true,
        "off" => false,
        _ => root && have("unshare") && have("nsenter"),
    };
    if !isolate {
        tracing::warn!(
            "agent: pods run without their own mount/UTS namespace (needs root and unshare): \
             they see the host's /etc/resolv.conf, /etc/hosts and hostname"
        );
    }
    let builtin: Vec<String> = match &args.builtin_command {
        Some(c) => c.split_whitespace().map(str::to_string).collect(),
        None => vec![
            std::env::current_exe()?.display().to_string(),
            "builtin-image".into(),
        ],
    };
    let netns_mode = args.pod_network == "netns";
    if netns_mode && !root {
        return Err(Error::NeedsRoot);
    }
    let mut node_ips = vec![args.node_ip];
    node_ips.extend(args.secondary_node_ip.iter().copied());
    // Pod logs, tokens and keys live here: owner only (0700), tightened if looser.
    ferry_store::private_fs::ensure_private_dir(&args.state_dir)
        .with_context(|| format!("creating {}", args.state_dir.display()))?;
    let reaped = runtime::reap_stale(&args.state_dir);
    if reaped > 0 {
        tracing::warn!("stopped {reaped} pod process(es) left running by a previous agent");
    }

    // The endpoint's TLS and access policy first: an agent that would serve an open endpoint
    // does not start.
    let (endpoint_tls, endpoint_access) = server::tls_setup(&server::TlsOptions {
        cert_file: args.tls_cert_file.clone(),
        key_file: args.tls_private_key_file.clone(),
        client_ca_file: args.client_ca_file.clone(),
        insecure_allow_unauthenticated: args.insecure_allow_unauthenticated,
        authorized_users: args.authorized_users.clone(),
        authorized_groups: args.authorized_groups.clone(),
        self_signed_dir: args.state_dir.join("pki"),
        self_signed_sans: std::iter::once(node_name.clone())
            .chain(node_ips.iter().map(|i| i.to_string()))
            .chain(args.endpoint_address.map(|i| i.to_string()))
            .collect(),
    })?;
    let bind_ip = args.endpoint_address.unwrap_or(node_ips[0]);
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(bind_ip, args.port))
        .await
        .with_context(|| format!("agent endpoint on {bind_ip}:{}", args.port))?;
    let endpoint = listener.local_addr()?;
    let mut annotations = Vec::new();
    if args.endpoint_address.is_some() {
        annotations.push(("ferry.dev/agent-endpoint".to_string(), endpoint.to_string()));
    }
    let facts = node::NodeFacts {
        name: node_name.clone(),
        ips: node_ips.clone(),
        annotations,
        zone: args.zone.clone(),
        region: args.region.clone(),
        port: endpoint.port(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1),
        memory_bytes: node::host_memory(),
        max_pods: args.max_pods,
        labels: Vec::new(),
        network_ready: !args.wait_for_pod_cidr,
    };
    let mut facts = facts;
    let mut node_obj = node::register(&client, &facts).await?;
    let assigned = |n: &k8s_openapi::api::core::v1::Node| -> Option<ipnet::IpNet> {
        n.spec
            .as_ref()
            .and_then(|s| s.pod_cidr.as_deref())
            .and_then(|c| c.parse().ok())
    };
    let all_assigned = |n: &k8s_openapi::api::core::v1::Node| -> Vec<ipnet::IpNet> {
        let spec = n.spec.as_ref();
        let mut v: Vec<ipnet::IpNet> = spec
            .and_then(|s| s.pod_cidrs.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.parse().ok())
            .collect();
        if v.is_empty()
            && let Some(c) = spec
                .and_then(|s| s.pod_cidr.as_deref())
                .and_then(|c| c.parse().ok())
        {
            v.push(c);
        }
        v
    };
    if args.wait_for_pod_cidr {
        // NotReady until node IPAM gives this node its pod CIDR (as kubelet with a CNI does).
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        while assigned(&node_obj).is_none() {
            tokio::select! {
                _ = stop.cancelled() => return Err(Error::StoppedBeforePodCidr(node_name.clone())),
                _ = tokio::time::sleep(Duration::from_millis(300)) => {}
            }
            if let Ok(n) = nodes.get(&node_name).await {
                node_obj = n;
            }
        }
        facts.network_ready = true;
        node_obj = node::register(&client, &facts).await?;
    }
    let pod_cidr = assigned(&node_obj).unwrap_or(args.pod_cidr);
    let network: Arc<dyn network::PodNetwork> = if netns_mode {
        let mut cidrs = all_assigned(&node_obj);
        if cidrs.is_empty() {
            cidrs.push(args.pod_cidr);
        }
        Arc::new(netns_network(&args, &node_name, &node_ips, &cidrs)?)
    } else {
        Arc::new(network::Loopback::new(pod_cidr)?)
    };
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let network_name = network.name();
    let pods_runtime = Arc::new(runtime::process::ProcessRuntime::new(
        runtime::process::ProcessConfig {
            network,
            node_ips: node_ips.clone(),
            node_netns: args.node_netns.clone().filter(|_| netns_mode),
            isolate,
            builtin,
            sandbox_root: args.state_dir.join("pods"),
        },
    ));
    let rt = Arc::new(runtime::Runtime {
        client: client.clone(),
        node_name: node_name.clone(),
        node_ips: node_ips.clone(),
        pods_runtime,
        cluster_dns: dns::ClusterDns {
            servers: args.cluster_dns.clone(),
            domain: args.cluster_domain.clone(),
            host: dns::ResolvConf::parse(&host_resolv),
        },
        state_dir: args.state_dir.clone(),
        isolate,
        node_netns: args.node_netns.clone().filter(|_| netns_mode),
        backoff: podstate::Backoff {
            base: Duration::from_secs(args.restart_backoff_seconds.max(1)),
            ..Default::default()
        },
        pods: Mutex::new(HashMap::new()),
        shutting_down: Default::default(),
    });
    let ep = Arc::new(server::Endpoint {
        rt: rt.clone(),
        tls: endpoint_tls,
        access: endpoint_access,
    });
    tokio::spawn(server::serve(ep, listener, stop.clone()));
    let hb = Duration::from_secs(args.heartbeat_seconds.max(1));
    tokio::spawn(node::heartbeat(
        client.clone(),
        facts,
        node_obj.metadata.uid.clone(),
        hb,
        hb * 6,
        stop.clone(),
    ));
    tracing::info!(
        "agent {node_name}: endpoint {endpoint}, pod network {}, pod CIDR {pod_cidr}, isolation {}",
        network_name,
        if isolate {
            "mount+uts namespaces"
        } else {
            "none"
        }
    );
    let rt2 = rt.clone();
    let done = tokio::spawn(async move {
        let pods: Api<Pod> = Api::all(client);
        // Only this node's pods (field-selected by the server, as kubelet's watch), synced
        // with one streaming list (paged lists when the server refuses it).
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let mut stream = ferry_kubeclient::watch::stream(pods, cfg, "agent Pod").boxed();
        let mut seen_in_init: Option<std::collections::HashSet<String>> = None;
        let mut listed = false;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => break,
                ev = stream.next() => ev,
            };
            match ev {
                Some(Ok(watcher::Event::Init)) => seen_in_init = Some(Default::default()),
                Some(Ok(watcher::Event::InitApply(p))) => {
                    if let (Some(s), Some(uid)) = (seen_in_init.as_mut(), p.metadata.uid.clone()) {
                        s.insert(uid);
                    }
                    rt2.apply(p);
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if !listed {
                        listed = true;
                        tracing::info!(
                            "agent {node_name}: pods listed ({} bound to this node)",
                            seen_in_init.as_ref().map_or(0, |s| s.len())
                        );
                    }
                    if let Some(seen) = seen_in_init.take() {
                        let known: Vec<String> = rt2
                            .pods
                            .lock()
                            .map(|m| m.keys().cloned().collect())
                            .unwrap_or_default();
                        for uid in known.into_iter().filter(|u| !seen.contains(u)) {
                            let rt = rt2.clone();
                            tokio::spawn(async move { rt.confirm_gone(&uid).await });
                        }
                    }
                }
                Some(Ok(watcher::Event::Apply(p))) => rt2.apply(p),
                Some(Ok(watcher::Event::Delete(p))) => {
                    if let Some(uid) = p.metadata.uid.as_deref() {
                        rt2.gone(uid);
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!("pod watch: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                None => break,
            }
        }
        // Shutdown: processes go with the agent; pods stay bound (as when kubelet stops).
        rt2.kill_all(Duration::from_secs(1)).await;
    });
    Ok((
        Agent {
            endpoint,
            node_name: rt.node_name.clone(),
            runtime: rt,
        },
        done,
    ))
}

/// The netns pod network of a node: the CNI configuration (given, or the default one rendered
/// from the pod CIDRs), pod CIDR routes in the cluster namespace, and a clean-up of whatever
/// a previous agent left attached (DEL from the result cache).
fn netns_network(
    args: &AgentArgs,
    node_name: &str,
    node_ips: &[IpAddr],
    cidrs: &[ipnet::IpNet],
) -> Result<network::NetNs> {
    let cni_dir = args.state_dir.join("cni");
    let conf = match args
        .cni_conf_dir
        .as_deref()
        .map(cni::ConfList::load_dir)
        .transpose()?
        .flatten()
    {
        Some((file, c)) => {
            tracing::info!(
                "agent {node_name}: CNI network {:?} from {}",
                c.name,
                file.display()
            );
            c
        }
        None => {
            if let Some(d) = &args.cni_conf_dir {
                tracing::warn!(
                    "agent {node_name}: no CNI configuration in {}; using the default bridge network",
                    d.display()
                );
            }
            let c = cni::default_conflist("ferry", cidrs, &cni_dir.join("ipam"));
            let dir = cni_dir.join("net.d");
            std::fs::create_dir_all(&dir)?;
            std::fs::write(
                dir.join("10-ferry.conflist"),
                serde_json::to_string_pretty(&c.to_json())?,
            )?;
            c
        }
    };
    let net = network::NetNs {
        cni: cni::Cni {
            bin_dirs: args.cni_bin_dir.clone(),
            exec_netns: args.node_netns.clone(),
            cache_dir: cni_dir.join("results"),
        },
        conf,
        netns_prefix: args.pod_netns_prefix.clone(),
    };
    let cleaned = net.gc();
    if cleaned > 0 {
        tracing::warn!("agent {node_name}: removed {cleaned} pod network(s) a previous agent left");
    }
    if let Some(cluster) = &args.cluster_netns {
        let mut script = String::new();
        for c in cidrs {
            if let Some(via) = node_ips.iter().find(|i| i.is_ipv4() == c.addr().is_ipv4()) {
                script += &format!("route replace {} via {via}\n", c.trunc());
            }
        }
        netns::ip_batch(Some(cluster), &script)
            .with_context(|| format!("routing pod CIDRs in {cluster}"))?;
    }
    Ok(net)
}
