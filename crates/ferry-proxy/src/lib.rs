//! `ferry proxy`: the service proxy, userspace mode.
//!
//! An ordinary Kubernetes API client (kube-rs) that watches Services, EndpointSlices and Nodes
//! ([`watch`]), keeps slim projections of them ([`model`]) in a change tracker, and runs one
//! coalescing sync loop ([`sync`]) that computes this node's service table with a pure function
//! ([`table`]) and applies it to the userspace data path ([`dataplane`]): a listener per service
//! address (every `clusterIPs` entry, NodePorts on the node IPs, `externalIPs`, load-balancer
//! ingress IPs), TCP and UDP, with the schedulers of [`sched`] and optional PROXY protocol
//! headers ([`proxyproto`]).
//!
//! Listeners bind the service IPs themselves, so the service IPs must be local addresses: in
//! `ferry up`'s loopback mode they live in 127.0.0.0/8, which Linux answers on as a whole. On a
//! real network a service IP is not local; binding it would need `IP_FREEBIND` or
//! `net.ipv4.ip_nonlocal_bind` plus routing, or the kernel dataplane (nftables, next batch).
//! Such frontends are logged and retried, never fatal.
//!
//! Per-Service annotations: `ferry.dev/scheduler` (`rr`, `random`, `lc`, `dh`, `sh`, `sed`,
//! `nq`), `ferry.dev/proxy-protocol` (`v1`, `v2`; TCP only), `ferry.dev/topology-keys`
//! (comma-separated; the seed's `spec.topologyKeys`, which is read too when the API server
//! keeps it).

pub mod dataplane;
pub mod error;
pub mod health;
pub mod kernel;
pub mod model;
pub mod proxyproto;
pub mod sched;
pub mod sync;
pub mod table;
pub mod watch;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use error::Context;
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;

pub use error::{Error, Result};
pub use sched::Scheduler;
pub use sync::SyncStatus;

/// The proxy modes `--proxy-mode` accepts.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// Accept on the service addresses and copy bytes to the chosen endpoint.
    #[default]
    Userspace,
    /// Ferry's own nftables table (maps-only layout), as root in the node's namespace.
    Nftables,
    /// kube-proxy's iptables chains through `iptables-restore` (seed 002).
    Iptables,
}

/// Subcommands of `ferry proxy`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum ProxyAction {
    /// Explain, from the nftables rules the proxy would write for the cluster as it is, what
    /// happens to a packet (no packet is sent).
    Trace(kernel::TraceArgs),
}

/// A command-line value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error("invalid duration {0:?} (use e.g. 250ms, 1s, 5m)")]
    Duration(String),
    #[error("invalid duration unit in {0:?} (ms, s, m, h)")]
    DurationUnit(String),
    #[error(transparent)]
    DurationRange(#[from] std::time::TryFromFloatSecsError),
    #[error("invalid address {0:?} (IP:port, or empty to disable)")]
    OptAddr(String),
    #[error("unknown scheduler {0:?} (expected rr, random, lc, dh, sh, sed or nq)")]
    Scheduler(String),
    #[error("unknown protocol {0:?} (tcp, udp, sctp)")]
    Protocol(String),
    #[error("invalid address {0:?} (IP:PORT or [IPv6]:PORT)")]
    Target(String),
}

fn parse_duration(s: &str) -> Result<Duration, ArgError> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let v: f64 = num.parse().map_err(|_| ArgError::Duration(s.to_string()))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(ArgError::DurationUnit(s.to_string())),
    };
    Ok(Duration::try_from_secs_f64(secs)?)
}

/// An optional listen address: `IP:port`, or empty (or `off`) for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OptAddr(pub Option<SocketAddr>);

impl std::str::FromStr for OptAddr {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        if s.is_empty() || s == "off" {
            return Ok(OptAddr(None));
        }
        s.parse()
            .map(|a| OptAddr(Some(a)))
            .map_err(|_| ArgError::OptAddr(s.to_string()))
    }
}

/// Flags of `ferry proxy` (and of the proxy inside `ferry up`).
#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    /// The kubeconfig to reach the API server (default: `$KUBECONFIG`, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name: endpoints on it are local (traffic policies), its labels give the
    /// zone (hints) and topology keys, its addresses serve NodePorts. Default: the hostname.
    #[arg(long = "node-name", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Addresses to serve NodePorts on (comma-separated or repeated). Default: the Node's
    /// InternalIP/ExternalIP addresses.
    #[arg(long = "node-ip", value_delimiter = ',')]
    pub node_ip: Vec<IpAddr>,
    /// Default scheduler: rr, random, lc, dh, sh, sed, nq. A Service overrides it with the
    /// `ferry.dev/scheduler` annotation.
    #[arg(long, default_value = "rr")]
    pub scheduler: Scheduler,
    /// Proxy mode: userspace, nftables or iptables.
    #[arg(
        long = "proxy-mode",
        alias = "mode",
        value_enum,
        default_value = "userspace"
    )]
    pub proxy_mode: ProxyMode,
    /// Serve NodePorts on this address instead of the node IPs (e.g. 0.0.0.0 for every local
    /// address).
    #[arg(long = "bind-address")]
    pub bind_address: Option<IpAddr>,
    /// Where `/healthz` is served (empty to disable).
    #[arg(long = "healthz-bind-address", default_value = "0.0.0.0:10256")]
    pub healthz_bind_address: OptAddr,
    /// Minimum time between two syncs of the table (changes in between are coalesced).
    #[arg(long = "min-sync-period", default_value = "50ms", value_parser = parse_duration)]
    pub min_sync_period: Duration,
    /// Maximum time between two syncs (a full resync even without changes).
    #[arg(long = "sync-period", default_value = "30s", value_parser = parse_duration)]
    pub sync_period: Duration,
    /// A change that waits longer than this for a sync makes `/healthz` fail.
    #[arg(long = "healthz-timeout", default_value = "60s", value_parser = parse_duration)]
    pub healthz_timeout: Duration,
    /// Idle timeout of a UDP flow (client address -> endpoint), as kube-proxy's userspace
    /// `--udp-timeout`.
    #[arg(long = "udp-timeout", visible_alias = "udp-idle-timeout", default_value = "250ms",
        value_parser = parse_duration)]
    pub udp_timeout: Duration,
    /// Idle timeout of a proxied TCP connection (no bytes either way); 0 for none. The default
    /// is kube-proxy's conntrack `tcp-established` timeout; keepalive probes find dead peers
    /// sooner.
    #[arg(long = "tcp-idle-timeout", default_value = "24h", value_parser = parse_duration)]
    pub tcp_idle_timeout: Duration,
    /// Concurrent proxied connections and UDP flows; beyond it new connections are closed at
    /// once and logged. 0 sizes it from the file-descriptor limit.
    #[arg(long = "max-connections", default_value_t = 0)]
    pub max_connections: usize,
    #[command(flatten)]
    pub kernel: kernel::KernelArgs,
    #[command(subcommand)]
    pub action: Option<ProxyAction>,
}

impl Default for ProxyArgs {
    fn default() -> Self {
        ProxyArgs {
            kubeconfig: None,
            node_name: None,
            node_ip: Vec::new(),
            scheduler: Scheduler::RoundRobin,
            proxy_mode: ProxyMode::Userspace,
            bind_address: None,
            healthz_bind_address: OptAddr(None),
            min_sync_period: Duration::from_millis(50),
            sync_period: Duration::from_secs(30),
            healthz_timeout: Duration::from_secs(60),
            udp_timeout: dataplane::DEFAULT_UDP_IDLE,
            tcp_idle_timeout: dataplane::DEFAULT_TCP_IDLE,
            max_connections: 0,
            kernel: kernel::KernelArgs::default(),
            action: None,
        }
    }
}

/// The host name, for the default node name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// A running proxy.
pub struct Proxy {
    /// Where `/healthz` listens, if enabled.
    pub healthz_addr: Option<SocketAddr>,
    status: tokio_watch::Receiver<SyncStatus>,
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    /// The status after the latest sync.
    pub fn status(&self) -> SyncStatus {
        self.status.borrow().clone()
    }

    /// Waits until the first sync after `after` syncs (e.g. `status().syncs`) has completed.
    pub async fn wait_syncs(&self, after: u64) -> Result<SyncStatus> {
        let mut rx = self.status.clone();
        let st = rx
            .wait_for(|s| s.syncs > after)
            .await
            .context("proxy stopped")?;
        Ok(st.clone())
    }

    /// Completes when one of the proxy's tasks (watchers, sync loop) has ended on its own, a
    /// panic or an error; the proxy no longer follows the cluster then.
    pub async fn failed(&mut self) -> String {
        loop {
            if self.tasks.is_empty() {
                return std::future::pending().await;
            }
            let (r, i, _) = futures::future::select_all(self.tasks.iter_mut()).await;
            let what = if i + 1 == self.tasks.len() {
                "sync loop"
            } else {
                "watcher"
            };
            self.tasks.remove(i);
            match r {
                // The sync loop ends only when cancelled; a helper task may end normally.
                Ok(()) if what == "watcher" => continue,
                Ok(()) => return format!("{what} ended"),
                Err(e) if e.is_panic() => {
                    return format!("{what} panicked: {}", panic_message(e));
                }
                Err(e) => return format!("{what} stopped: {e}"),
            }
        }
    }

    /// Stops watches, the loop and every listener.
    pub async fn stop(self) {
        self.cancel.cancel();
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

/// Starts the proxy with a client; it runs until `cancel` (or [`Proxy::stop`]).
pub async fn start(
    client: kube::Client,
    args: &ProxyArgs,
    cancel: CancellationToken,
) -> Result<Proxy> {
    if args.proxy_mode != ProxyMode::Userspace {
        return kernel::start(client, args, cancel).await;
    }
    let node_name = args.node_name.clone().unwrap_or_else(hostname);
    let tracker = Arc::new(sync::Tracker::default());
    let (status_tx, status_rx) = tokio_watch::channel(SyncStatus::default());
    let healthz_addr = match args.healthz_bind_address.0 {
        Some(a) => Some(
            health::serve(
                a,
                tracker.clone(),
                status_rx.clone(),
                args.healthz_timeout,
                cancel.clone(),
            )
            .await
            .with_context(|| format!("binding the health server on {a}"))?,
        ),
        None => None,
    };
    let mut tasks = watch::spawn(client, tracker.clone());
    let max_connections = if args.max_connections == 0 {
        dataplane::default_max_connections()
    } else {
        args.max_connections
    };
    let dp = dataplane::Dataplane::new(
        dataplane::DataplaneConfig {
            udp_idle: args.udp_timeout,
            tcp_idle: Some(args.tcp_idle_timeout).filter(|d| !d.is_zero()),
            max_connections,
            splice: true,
        },
        cancel.child_token(),
    );
    let cfg = sync::SyncConfig {
        node_name: node_name.clone(),
        node_ips: args.node_ip.clone(),
        nodeport_bind: args.bind_address,
        scheduler: args.scheduler,
        min_interval: args.min_sync_period,
        max_interval: args.sync_period.max(args.min_sync_period),
        portals: args.kernel.portals.then(|| kernel::portals::PortalsConfig {
            table: args.kernel.nft_table.clone(),
            netns: args.kernel.apply_in_netns.clone(),
        }),
    };
    tasks.push(tokio::spawn(sync::run(
        tracker,
        dp,
        cfg,
        status_tx,
        cancel.clone(),
    )));
    tracing::info!(node = %node_name, scheduler = %args.scheduler, healthz = ?healthz_addr,
        max_connections, tcp_idle_timeout = ?args.tcp_idle_timeout, udp_timeout = ?args.udp_timeout,
        "service proxy started (userspace mode)");
    Ok(Proxy {
        healthz_addr,
        status: status_rx,
        cancel,
        tasks,
    })
}

/// Runs `ferry proxy` until `shutdown` completes.
pub async fn run(
    args: ProxyArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    if args.kernel.cleanup {
        return kernel::cleanup(&args);
    }
    let client = ferry_kubeclient::client(args.kubeconfig.as_deref()).await?;
    if let Some(ProxyAction::Trace(t)) = &args.action {
        print!("{}", kernel::trace_cmd(client, &args, t).await?);
        return Ok(());
    }
    if args.kernel.dry_run {
        print!("{}", kernel::dry_run(client, &args).await?);
        return Ok(());
    }
    let cancel = CancellationToken::new();
    let mut proxy = start(client, &args, cancel.clone()).await?;
    let failure = tokio::select! {
        _ = shutdown => None,
        f = proxy.failed() => Some(f),
    };
    proxy.stop().await;
    match failure {
        None => Ok(()),
        Some(f) => Err(Error::Failed(f)),
    }
}

/// The message of a panicked task.
pub fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(non-string panic payload)".into()),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        proxy: ProxyArgs,
    }

    #[test]
    fn flags() {
        let c = Cli::try_parse_from([
            "x",
            "--node-name",
            "n1",
            "--node-ip",
            "127.0.0.1,127.0.0.2",
            "--scheduler",
            "sh",
            "--proxy-mode",
            "userspace",
            "--healthz-bind-address",
            "",
            "--min-sync-period",
            "100ms",
            "--udp-idle-timeout",
            "1s",
            "--tcp-idle-timeout",
            "0",
            "--max-connections",
            "100",
        ])
        .unwrap();
        assert_eq!(c.proxy.node_ip.len(), 2);
        assert_eq!(c.proxy.scheduler, Scheduler::SourceHashing);
        assert_eq!(c.proxy.healthz_bind_address, OptAddr(None));
        assert_eq!(c.proxy.min_sync_period, Duration::from_millis(100));
        assert_eq!(c.proxy.udp_timeout, Duration::from_secs(1));
        assert_eq!(c.proxy.tcp_idle_timeout, Duration::ZERO);
        assert_eq!(c.proxy.max_connections, 100);
        let d = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(
            d.proxy.healthz_bind_address,
            OptAddr(Some("0.0.0.0:10256".parse().unwrap()))
        );
        assert_eq!(d.proxy.scheduler, Scheduler::RoundRobin);
        assert_eq!(d.proxy.udp_timeout, Duration::from_millis(250));
        assert_eq!(d.proxy.tcp_idle_timeout, Duration::from_secs(86400));
        assert_eq!(d.proxy.max_connections, 0);
        assert!(Cli::try_parse_from(["x", "--scheduler", "wlc"]).is_err());
        assert!(Cli::try_parse_from(["x", "--proxy-mode", "ipvs"]).is_err());
        let k = Cli::try_parse_from([
            "x",
            "--mode",
            "iptables",
            "--dry-run",
            "--cluster-cidr",
            "10.244.0.0/16,fd00:10::/64",
        ])
        .unwrap();
        assert_eq!(k.proxy.proxy_mode, ProxyMode::Iptables);
        assert!(k.proxy.kernel.dry_run);
        assert_eq!(k.proxy.kernel.cluster_cidr.len(), 2);
        let t = Cli::try_parse_from([
            "x",
            "trace",
            "--from",
            "10.0.0.1",
            "--to",
            "10.96.0.1:80/tcp",
        ])
        .unwrap();
        assert!(matches!(t.proxy.action, Some(ProxyAction::Trace(_))));
        assert!(Cli::try_parse_from(["x", "--sync-period", "5x"]).is_err());
    }

    #[test]
    fn durations() {
        for (s, want) in [
            ("250ms", Some(Duration::from_millis(250))),
            ("2", Some(Duration::from_secs(2))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("5m", Some(Duration::from_secs(300))),
            ("1h", Some(Duration::from_secs(3600))),
            ("x", None),
            ("-1s", None),
        ] {
            assert_eq!(parse_duration(s).ok(), want, "{s}");
        }
    }
}
