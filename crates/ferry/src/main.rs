//! `ferry`: Kubernetes service networking in one program.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

mod supervise;
mod up;

#[derive(Parser, Debug)]
#[command(
    name = "ferry",
    version,
    about = "Kubernetes service networking in one Rust program"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run everything in one process (API server on an embedded store, and the cluster's services).
    Up(ServerArgs),
    /// Run only the API server.
    Apiserver(ServerArgs),
    /// Run the cluster DNS server against a Kubernetes API server.
    Dns(ferry_dns::DnsArgs),
    /// Run the controllers (addresses, endpoints, lifecycle, IPAM) against an API server.
    Controllers(ferry_controllers::ControllersArgs),
    /// Run the node agent (registers a Node, runs its pods).
    Agent(ferry_node::AgentArgs),
    /// Run the service proxy.
    Proxy(ferry_proxy::ProxyArgs),
    /// NetworkPolicy tools: explain a connection, print a reachability matrix, read the verdict log.
    Netpol(ferry_netpol::NetpolArgs),
    /// Run the Ingress controller and its HTTP/HTTPS proxy.
    Ingress(ferry_ingress::IngressArgs),
    /// Run a command inside the cluster network of a `ferry up` (netns pod network): in the
    /// cluster namespace, where every pod and Service address answers, or on a node.
    #[command(alias = "shell")]
    ExecNet {
        /// The data directory of the `ferry up`.
        #[arg(long, default_value = "./.ferry")]
        data_dir: PathBuf,
        /// Run in this node's namespace instead.
        #[arg(long)]
        node: Option<String>,
        /// The command (default: $SHELL).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
    /// Issue a node agent's serving certificate from the cluster CA of a data directory (for
    /// `ferry agent --tls-cert-file/--tls-private-key-file/--client-ca-file` on another machine).
    AgentCertificate {
        /// The data directory of the API server (its `pki/ca.key` signs).
        #[arg(long, default_value = "./.ferry")]
        data_dir: PathBuf,
        /// The node's name.
        #[arg(long)]
        node_name: String,
        /// The node's addresses, where the API server dials the agent (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        node_ip: Vec<std::net::IpAddr>,
    },
    /// Run one of the built-in container images (used by the node agent).
    #[command(hide = true)]
    BuiltinImage {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Args, Debug, Clone)]
pub(crate) struct ServerArgs {
    /// Where Ferry keeps its state, certificates and the admin kubeconfig.
    #[arg(long, default_value = "./.ferry")]
    data_dir: PathBuf,
    /// The API server's listen address.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen_api: SocketAddr,
    /// Serve the API over plain HTTP instead of HTTPS (bearer tokens are still required).
    #[arg(long)]
    plain_http: bool,
    /// Extra DNS names or IPs for the API server's certificate (repeatable).
    #[arg(long = "tls-san")]
    tls_san: Vec<String>,
    /// `ferry up` only: where cluster DNS listens (UDP and TCP); `off` disables it. Default:
    /// the kube-dns Service IP, port 53, as root; 127.0.0.1:1053 otherwise.
    #[arg(long)]
    listen_dns: Option<String>,
    /// `ferry up` only: where cluster DNS serves /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:9153")]
    dns_metrics_listen: SocketAddr,
    /// `ferry up` only: forwarders for non-cluster names (default: the host's resolv.conf).
    #[arg(long, value_delimiter = ',')]
    dns_upstream: Vec<SocketAddr>,
    /// `ferry up` only: a flag passed to the controllers (repeatable), e.g.
    /// `--controllers-arg=--max-endpoints-per-slice=500`.
    #[arg(long = "controllers-arg", allow_hyphen_values = true)]
    controllers_arg: Vec<String>,
    /// Keep this many revisions of history for watches (older ones are compacted).
    #[arg(long, default_value_t = 100_000)]
    history_revisions: i64,
    /// Bytes of the embedded store's page cache (`--store redb`): reads are answered from the
    /// watch cache, so this only speeds up writes (the B-tree pages they walk).
    #[arg(long, default_value_t = ferry_apiserver::STORE_PAGE_CACHE_BYTES)]
    store_cache_size: usize,
    /// Where the state lives: `redb` (one file in --data-dir) or `etcd` (shared by several
    /// API servers).
    #[arg(long, default_value = "redb", value_parser = ["redb", "etcd"])]
    store: String,
    /// etcd client URLs for `--store etcd`, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    etcd_endpoints: Vec<String>,
    /// Prefix of every key in etcd (as kube-apiserver's --etcd-prefix).
    #[arg(long, default_value = "/registry")]
    etcd_prefix: String,
    /// Service ClusterIP range: one CIDR, or two of different families for dual-stack
    /// (the first is the primary family). Default: 10.96.0.0/12 for `ferry apiserver`;
    /// 127.96.0.0/16 for `ferry up`, whose loopback network keeps everything on this machine.
    #[arg(long)]
    service_cluster_ip_range: Option<String>,
    /// `ferry up` only: the pod network (node pod CIDRs are carved from it); one CIDR or two
    /// of different families. Default: 10.244.0.0/16,fd00:10:244::/56 with the netns pod
    /// network, 127.100.0.0/16 with the loopback one.
    #[arg(long)]
    cluster_cidr: Option<String>,
    /// `ferry up` only: `netns` (a network namespace per pod and per node; needs root),
    /// `loopback` (pods on 127.0.0.0/8 addresses in the machine's namespace), or `auto` (netns
    /// as root unless the ranges given are loopback ones).
    #[arg(long, default_value = "auto", value_parser = ["auto", "netns", "loopback"])]
    pod_network: String,
    /// `ferry up` only: how many nodes (netns pod network), each a network namespace with its
    /// own agent and proxy.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// `ferry up` only: CNI configuration directory for the node agents (default: a bridge
    /// network rendered from each node's pod CIDRs).
    #[arg(long)]
    cni_conf_dir: Option<PathBuf>,
    /// `ferry up` only: CNI plugin directories (comma-separated).
    #[arg(long, value_delimiter = ',')]
    cni_bin_dir: Vec<PathBuf>,
    /// `ferry up` only (netns pod network): add routes in this machine's own network namespace
    /// to the cluster's node, pod, Service and load-balancer ranges through a veth into the
    /// cluster namespace, so the host reaches them without `ferry exec-net`. Off by default:
    /// the only option that changes the machine's network; removed on exit.
    #[arg(long)]
    host_routes: bool,
    /// `ferry up` only: the node agent's endpoint port (logs, exec); 0 picks a free one.
    #[arg(long, default_value_t = 10250)]
    agent_port: u16,
    /// `ferry up` only: the node's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// `ferry up` only: the service proxy of every node: `nftables` (Ferry's own table in each
    /// node namespace; the default of the netns pod network), `iptables` (kube-proxy's chains
    /// through iptables-restore, netns pod network only) or `userspace` (the default, and the
    /// only mode, of the loopback pod network).
    #[arg(long, value_parser = ["nftables", "iptables", "userspace"])]
    proxy_mode: Option<String>,
    /// `ferry up` only: the proxy's /healthz address; `off` disables it.
    #[arg(long, default_value = "127.0.0.1:10256")]
    proxy_healthz_listen: String,
    /// `ferry up` only (netns pod network): where NetworkPolicy enforcement serves /metrics
    /// (verdict counters per pod and policy, sync latency) and /healthz; `off` disables it.
    #[arg(long, default_value = "127.0.0.1:9258")]
    netpol_metrics_listen: String,
    /// `ferry up` only: where the Ingress proxy serves HTTP (`off`: not at all). Default:
    /// 127.0.0.1:80 as root, 127.0.0.1:8080 otherwise.
    #[arg(long)]
    ingress_http_addr: Option<String>,
    /// `ferry up` only: where the Ingress proxy serves HTTPS (`off`: not at all). Default:
    /// 127.0.0.1:443 as root, 127.0.0.1:8443 otherwise.
    #[arg(long)]
    ingress_https_addr: Option<String>,
    /// Node port range (inclusive).
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: ferry_apiserver::alloc::PortRange,
    /// The soft file-descriptor limit (RLIMIT_NOFILE) to run with; default: raised to the
    /// hard limit. Connection caps of the API server, DNS and proxy are cut from it.
    #[arg(long)]
    max_open_files: Option<u64>,
    /// Client certificate (PEM) the API server presents to node agents for logs and exec
    /// (default: one the cluster CA issues, `<data-dir>/pki/apiserver-kubelet-client.crt`).
    #[arg(long)]
    kubelet_client_certificate: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    kubelet_client_key: Option<PathBuf>,
    /// The CA that node agents' serving certificates must chain to (default: the cluster CA).
    #[arg(long)]
    kubelet_certificate_authority: Option<PathBuf>,
    /// Write an audit log here: one `audit.k8s.io/v1` Event per request as a JSON line, at
    /// the Metadata level (who, what, the decision; no bodies), mode 0600.
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG")
                .unwrap_or_else(|_| "info,hyper=warn,kube=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = parse_cli();
    // One descriptor per connection: raise the soft limit to the hard one (or to
    // --max-open-files), before any component sizes its caps from it.
    // (Not for the built-in images: they are pods, whose output is theirs.)
    let target = match &cli.command {
        Command::Up(a) | Command::Apiserver(a) => Some(a.max_open_files),
        Command::BuiltinImage { .. } => None,
        _ => Some(None),
    };
    if let Some(target) = target {
        match ferry_limits::raise_nofile(target) {
            Ok(l) => {
                tracing::info!(before = l.before, soft = l.soft, hard = ?l.hard, "file descriptor limit")
            }
            Err(e) => tracing::warn!("{e}; keeping the current limit"),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Up(a) => run_server(a, "up").await,
            Command::Apiserver(a) => run_server(a, "apiserver").await,
            Command::Dns(a) => Ok(ferry_dns::run(a, shutdown_signal()).await?),
            Command::Controllers(a) => Ok(ferry_controllers::run(a, shutdown_signal()).await?),
            Command::Agent(a) => Ok(ferry_node::run(a, shutdown_signal()).await?),
            Command::Proxy(a) => Ok(ferry_proxy::run(a, shutdown_signal()).await?),
            Command::Netpol(a) => Ok(ferry_netpol::run(a, shutdown_signal()).await?),
            Command::Ingress(a) => Ok(ferry_ingress::run(a, shutdown_signal()).await?),
            Command::AgentCertificate {
                data_dir,
                node_name,
                node_ip,
            } => {
                let t = ferry_apiserver::pki::issue_agent_serving(&data_dir, &node_name, &node_ip)?;
                println!(
                    "--tls-cert-file={} --tls-private-key-file={} --client-ca-file={}",
                    t.cert_file.display(),
                    t.key_file.display(),
                    t.ca_file.display()
                );
                Ok(())
            }
            Command::BuiltinImage { args } => Ok(ferry_node::images::builtin_main(args).await?),
            Command::ExecNet {
                data_dir,
                node,
                cmd,
            } => std::process::exit(up::exec_net(&data_dir, node.as_deref(), &cmd)?),
        }
    })
}

/// Completes on SIGTERM or Ctrl-C. SIGTERM is registered when this is called, not when the
/// future is first polled, so a signal that arrives while a component is still starting is
/// kept for it instead of killing the process with the default action.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        match term {
            Some(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

async fn open_store(a: &ServerArgs) -> Result<Arc<dyn ferry_store::Store>> {
    if a.store == "etcd" {
        let opts = ferry_store::EtcdOptions {
            endpoints: a.etcd_endpoints.clone(),
            prefix: a.etcd_prefix.clone(),
            ..Default::default()
        };
        let store = ferry_store::EtcdStore::connect(opts)
            .await
            .with_context(|| format!("connecting to etcd at {}", a.etcd_endpoints.join(",")))?;
        return Ok(Arc::new(store));
    }
    let options = ferry_store::RedbOptions {
        cache_size: Some(a.store_cache_size),
        ..Default::default()
    };
    let store = ferry_store::RedbStore::open_with(&a.data_dir.join("store.redb"), options)
        .with_context(|| format!("opening the store in {}", a.data_dir.display()))?;
    Ok(Arc::new(store))
}

/// The Service range in effect: the flag, or the mode's default.
fn service_range(a: &ServerArgs, mode: &str) -> String {
    match &a.service_cluster_ip_range {
        Some(r) => r.clone(),
        None if mode == "up" => up::default_service_range(a).to_string(),
        None => "10.96.0.0/12".to_string(),
    }
}

async fn run_server(a: ServerArgs, mode: &str) -> Result<()> {
    // Registered before anything starts: a SIGTERM during start-up stops Ferry cleanly.
    let stop = shutdown_signal();
    if mode == "up" {
        // The loopback pod network puts pod, service and external addresses in 127.0.0.0/8.
        ferry_api::validation::allow_loopback_addresses(true);
    }
    // The data directory holds the store (every Secret), keys and tokens: owner only (0700),
    // tightened with a warning if an existing one is looser.
    ferry_store::private_fs::ensure_private_dir(&a.data_dir)
        .with_context(|| format!("creating {}", a.data_dir.display()))?;
    let store = open_store(&a).await?;
    let shutdown = CancellationToken::new();
    ferry_store::spawn_compactor(
        store.clone(),
        std::time::Duration::from_secs(60),
        a.history_revisions,
    );
    let config = ferry_apiserver::Config {
        data_dir: a.data_dir.clone(),
        listen: a.listen_api,
        plain_http: a.plain_http,
        extra_sans: if mode == "up" {
            a.tls_san
                .iter()
                .cloned()
                .chain(up::extra_sans(&a))
                .collect()
        } else {
            a.tls_san.clone()
        },
        service_cidrs: ferry_apiserver::alloc::parse_service_cidrs(&service_range(&a, mode))
            .context("--service-cluster-ip-range")?,
        node_port_range: a.service_node_port_range,
        max_connections: {
            let parts = if mode == "up" {
                ferry_limits::Parts::ALL
            } else {
                ferry_limits::Parts {
                    apiserver: true,
                    ..Default::default()
                }
            };
            ferry_limits::plan(ferry_limits::fdlimit::current().soft, parts).apiserver
        },
        kubelet_client_certificate: a.kubelet_client_certificate.clone(),
        kubelet_client_key: a.kubelet_client_key.clone(),
        kubelet_certificate_authority: a.kubelet_certificate_authority.clone(),
        audit_log_path: a.audit_log_path.clone(),
    };
    let running = ferry_apiserver::start(config, store.clone(), shutdown.clone()).await?;
    supervise::set_checks(running.server.checks.clone());
    tracing::info!(mode, url = %running.url, kubeconfig = %running.kubeconfig.display(), "ferry is ready");
    eprintln!(
        "ferry {mode}: API server ready at {} (kubeconfig: {})",
        running.url,
        running.kubeconfig.display()
    );
    // The cluster's services are clients of the API server: they stop first (releasing the
    // controllers' lease, stopping pods), then the API server.
    let clients = CancellationToken::new();
    let mut services = None;
    if mode == "up" {
        services = Some(up::start_services(&a, &running, &clients).await?);
    }
    stop.await;
    tracing::info!("shutting down");
    clients.cancel();
    if mode == "up" {
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    }
    if let Some(s) = services {
        // Pods stopped by their agents, then the cluster network removed.
        s.stop().await;
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), running.done).await;
    Ok(())
}

/// `ferry up` and `ferry apiserver` share [`ServerArgs`]: the flags documented as "`ferry up`
/// only" are hidden from `ferry apiserver --help` and refused there, so each subcommand shows
/// (and takes) only its own flags.
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    fn up_only(a: &clap::Arg) -> bool {
        a.get_help()
            .is_some_and(|h| h.to_string().starts_with("`ferry up` only"))
    }
    let mut cmd = Cli::command().mut_subcommand("apiserver", |sc| {
        let ids: Vec<clap::Id> = sc
            .get_arguments()
            .filter(|a| up_only(a))
            .map(|a| a.get_id().clone())
            .collect();
        ids.into_iter()
            .fold(sc, |sc, id| sc.mut_arg(id, |a| a.hide(true)))
    });
    let matches = cmd.clone().get_matches();
    if let Some(("apiserver", sub)) = matches.subcommand() {
        let refused: Vec<String> = cmd
            .find_subcommand("apiserver")
            .into_iter()
            .flat_map(|c| c.get_arguments())
            .filter(|a| up_only(a))
            .filter(|a| {
                sub.value_source(a.get_id().as_str())
                    == Some(clap::parser::ValueSource::CommandLine)
            })
            .map(|a| format!("--{}", a.get_long().unwrap_or(a.get_id().as_str())))
            .collect();
        if let Some(flag) = refused.first() {
            cmd.error(
                clap::error::ErrorKind::UnknownArgument,
                format!("{flag} is a flag of `ferry up` only, not of `ferry apiserver`"),
            )
            .exit();
        }
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}
