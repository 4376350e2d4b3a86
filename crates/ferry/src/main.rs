//! `ferry`: Kubernetes service networking in one program.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

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
}

#[derive(Args, Debug, Clone)]
struct ServerArgs {
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
    /// `ferry up` only: where cluster DNS listens (UDP and TCP); `off` disables it.
    #[arg(long, default_value = "127.0.0.1:1053")]
    listen_dns: String,
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
    /// (the first is the primary family).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// Node port range (inclusive).
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: ferry_apiserver::alloc::PortRange,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG")
                .unwrap_or_else(|_| "info,hyper=warn,kube=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Up(a) => run_server(a, "up").await,
            Command::Apiserver(a) => run_server(a, "apiserver").await,
            Command::Dns(a) => ferry_dns::run(a, shutdown_signal()).await,
            Command::Controllers(a) => ferry_controllers::run(a, shutdown_signal()).await,
            Command::Agent(a) => ferry_node::run(a, shutdown_signal()).await,
            Command::Proxy(a) => ferry_proxy::run(a, shutdown_signal()).await,
        }
    })
}

/// The load-balancer pool of `ferry up` when none is given.
const UP_LOADBALANCER_RANGE: &str = "127.0.0.240-127.0.0.254";

/// The controllers inside `ferry up`, as ordinary clients of the API server just started.
/// `extra` are `ferry controllers` flags passed through (`--controllers-arg=--flag=value`).
fn start_controllers(
    kubeconfig: &std::path::Path,
    shutdown: &CancellationToken,
    extra: &[String],
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
    // `ferry up` is a one-machine cluster: LoadBalancer Services get loopback addresses
    // (as k3s ServiceLB hands out the node's address) unless a range is given.
    if !extra
        .iter()
        .any(|a| a.starts_with("--loadbalancer-ip-range"))
    {
        argv.push(format!("--loadbalancer-ip-range={UP_LOADBALANCER_RANGE}"));
    }
    argv.extend(extra.iter().cloned());
    let args = Wrap::try_parse_from(argv)
        .context("controller arguments")?
        .c;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = ferry_controllers::run(args, stop.cancelled_owned()).await {
            tracing::error!("controllers stopped: {e:#}");
        }
    });
    Ok(())
}

/// Cluster DNS inside `ferry up`, as an ordinary client of the API server just started.
fn start_dns(
    a: &ServerArgs,
    kubeconfig: &std::path::Path,
    shutdown: &CancellationToken,
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
        a.listen_dns.clone(),
        "--metrics-listen".into(),
        a.dns_metrics_listen.to_string(),
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
    let args = Wrap::try_parse_from(argv).context("DNS arguments")?.dns;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = ferry_dns::run(args, stop.cancelled_owned()).await {
            tracing::error!("cluster DNS stopped: {e:#}");
        }
    });
    eprintln!("ferry up: cluster DNS on {} (UDP and TCP)", a.listen_dns);
    Ok(())
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
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
    let store = ferry_store::redb_store::RedbStore::open(&a.data_dir.join("store.redb"))
        .with_context(|| format!("opening the store in {}", a.data_dir.display()))?;
    Ok(Arc::new(store))
}

async fn run_server(a: ServerArgs, mode: &str) -> Result<()> {
    std::fs::create_dir_all(&a.data_dir)
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
        extra_sans: a.tls_san.clone(),
        service_cidrs: ferry_apiserver::alloc::parse_service_cidrs(&a.service_cluster_ip_range)
            .context("--service-cluster-ip-range")?,
        node_port_range: a.service_node_port_range,
    };
    let running = ferry_apiserver::start(config, store.clone(), shutdown.clone()).await?;
    tracing::info!(mode, url = %running.url, kubeconfig = %running.kubeconfig.display(), "ferry is ready");
    eprintln!(
        "ferry {mode}: API server ready at {} (kubeconfig: {})",
        running.url,
        running.kubeconfig.display()
    );
    if mode == "up" {
        start_controllers(&running.kubeconfig, &shutdown, &a.controllers_arg)?;
        if a.listen_dns != "off" {
            start_dns(&a, &running.kubeconfig, &shutdown)?;
        }
    }
    shutdown_signal().await;
    tracing::info!("shutting down");
    shutdown.cancel();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), running.done).await;
    Ok(())
}
