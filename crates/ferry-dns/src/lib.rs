#![cfg_attr(test, allow(clippy::unwrap_used))]
//! ferry-dns: cluster DNS per the Kubernetes DNS specification.
//!
//! Layers: [`wire`] (packet parsing/encoding), [`index`] (slim projections, answers precomputed
//! per name), [`answer`] (the pure answer function), and the IO edges: [`server`] (UDP/TCP),
//! [`forward`] (upstreams, stub domains, cache), [`watch`] (kube watchers), [`ops`] (health and
//! metrics over HTTP).
//!
//! Running against any API server: `ferry dns --kubeconfig ~/.kube/config --listen 127.0.0.1:1053
//! --metrics-listen 127.0.0.1:9153`, then `dig @127.0.0.1 -p 1053 kubernetes.default.svc.cluster.local`.

pub mod answer;
pub mod cache;
pub mod error;
pub mod forward;
pub mod index;
pub mod metrics;
pub mod ops;
pub mod server;
pub mod watch;
pub mod wire;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use error::Context;
use ipnet::IpNet;

pub use error::{Error, Result};
pub use index::{Index, PodsMode, ZoneConfig};
pub use metrics::Metrics;
pub use server::{ServerConfig, SharedIndex, TcpConfig};

/// `ferry dns` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DnsArgs {
    /// Kubeconfig of the API server to watch (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// UDP and TCP listen address.
    #[arg(long, default_value = "0.0.0.0:53")]
    pub listen: SocketAddr,
    /// Cluster domain served authoritatively.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Upstream servers for other names (default: nameservers of /etc/resolv.conf).
    #[arg(long, value_delimiter = ',')]
    pub upstream: Vec<SocketAddr>,
    /// Stub domain: DOMAIN=ADDR:PORT[,ADDR:PORT...] (repeatable).
    #[arg(long = "stub-domain")]
    pub stub_domain: Vec<String>,
    /// Pod records (`a-b-c-d.ns.pod.<domain>`).
    #[arg(long, value_enum, default_value = "insecure")]
    pub pods: PodsMode,
    /// Clients allowed to resolve non-cluster names (default: loopback, service and pod CIDRs).
    #[arg(long, value_delimiter = ',')]
    pub allow_recursion_from: Vec<IpNet>,
    /// Service CIDRs (part of the default recursion ACL).
    #[arg(long, value_delimiter = ',', default_value = "10.96.0.0/12")]
    pub service_cidr: Vec<IpNet>,
    /// Pod CIDRs (part of the default recursion ACL).
    #[arg(long, value_delimiter = ',', default_value = "10.244.0.0/16")]
    pub pod_cidr: Vec<IpNet>,
    /// Listen address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:9153")]
    pub metrics_listen: SocketAddr,
    /// TTL of cluster records.
    #[arg(long, default_value_t = 5)]
    pub ttl: u32,
    /// Addresses served for the zone's name server `ns.dns.<domain>` (NS glue).
    #[arg(long = "ns-ip", value_delimiter = ',')]
    pub ns_ip: Vec<IpAddr>,
    /// UDP receive threads (default: number of CPUs).
    #[arg(long)]
    pub udp_workers: Option<usize>,
    /// Concurrent DNS-over-TCP connections; more wait in the listen queue. 0 sizes it from
    /// the file-descriptor limit.
    #[arg(long, default_value_t = 0)]
    pub tcp_max_connections: usize,
    /// How long a DNS-over-TCP connection may stay open between queries (CoreDNS: 10s).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub tcp_idle_timeout: Duration,
}

/// A `--tcp-idle-timeout` that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?} (use e.g. 500ms, 10s, 2m)")]
    Number(String),
    #[error("invalid duration unit in {0:?} (ms, s, m)")]
    Unit(String),
}

/// Parses `250ms`, `10s`, `2m` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| DurationError::Number(s.to_string()))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        _ => Err(DurationError::Unit(s.to_string())),
    }
}

/// Parses `DOMAIN=ADDR:PORT[,ADDR:PORT]`.
pub fn parse_stub(s: &str) -> Result<(String, Vec<SocketAddr>)> {
    let (domain, servers) = s.split_once('=').ok_or(Error::StubSyntax)?;
    let servers = servers
        .split(',')
        .map(|a| {
            a.trim()
                .parse::<SocketAddr>()
                .with_context(|| format!("bad stub server {a:?}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((domain.trim_end_matches('.').to_ascii_lowercase(), servers))
}

/// Nameservers of a resolv.conf text (port 53).
pub fn resolv_conf_nameservers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

impl DnsArgs {
    pub fn zone_config(&self) -> ZoneConfig {
        ZoneConfig {
            zone: self
                .cluster_domain
                .trim_end_matches('.')
                .to_ascii_lowercase(),
            ttl: self.ttl,
            pods: self.pods,
            ns_ips: self.ns_ip.clone(),
        }
    }

    pub fn server_config(&self) -> Result<ServerConfig> {
        let upstreams = if self.upstream.is_empty() {
            resolv_conf_nameservers(
                &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
            )
        } else {
            self.upstream.clone()
        };
        let stubs = self
            .stub_domain
            .iter()
            .map(|s| parse_stub(s))
            .collect::<Result<Vec<_>>>()?;
        let acl = if self.allow_recursion_from.is_empty() {
            let mut v: Vec<IpNet> = vec!["127.0.0.0/8".parse()?, "::1/128".parse()?];
            v.extend(self.service_cidr.iter().copied());
            v.extend(self.pod_cidr.iter().copied());
            v
        } else {
            self.allow_recursion_from.clone()
        };
        Ok(ServerConfig {
            listen: self.listen,
            udp_workers: self.udp_workers.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            }),
            allow_recursion_from: acl,
            forward: forward::ForwardConfig {
                upstreams,
                stubs,
                timeout: Duration::from_secs(2),
            },
            tcp: TcpConfig {
                max_connections: if self.tcp_max_connections == 0 {
                    server::default_tcp_max_connections()
                } else {
                    self.tcp_max_connections
                },
                idle_timeout: self.tcp_idle_timeout,
                ..TcpConfig::default()
            },
        })
    }
}

async fn kube_client(path: Option<&PathBuf>) -> Result<kube::Client> {
    Ok(ferry_kubeclient::client(path.map(PathBuf::as_path)).await?)
}

/// Runs `ferry dns` until `shutdown` completes.
pub async fn run(args: DnsArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
    prepare(&args).await?.run(shutdown).await
}

/// `ferry dns` with its sockets bound, not yet serving: binding is where a taken port shows,
/// so a caller (`ferry up`) can fail at once, naming the address.
pub struct Prepared {
    args: DnsArgs,
    server: server::Server,
    ops_listener: tokio::net::TcpListener,
    shared: Arc<SharedIndex>,
    metrics: Arc<Metrics>,
}

/// Binds the DNS (UDP and TCP) and operations sockets.
pub async fn prepare(args: &DnsArgs) -> Result<Prepared> {
    let metrics = Arc::new(Metrics::new());
    let shared = Arc::new(SharedIndex::new(Index::new(args.zone_config())));
    let server = server::Server::bind(args.server_config()?, shared.clone(), metrics.clone())
        .await
        .with_context(|| format!("cluster DNS cannot listen on {}", args.listen))?;
    let ops_listener = ops::bind(args.metrics_listen).await.with_context(|| {
        format!(
            "cluster DNS cannot serve /readyz on {}",
            args.metrics_listen
        )
    })?;
    Ok(Prepared {
        args: args.clone(),
        server,
        ops_listener,
        shared,
        metrics,
    })
}

impl Prepared {
    /// The UDP address (its port is the TCP one too).
    pub fn udp_addr(&self) -> SocketAddr {
        self.server.udp_addr()
    }

    /// Whether the index has its first full lists (the `/readyz` of the ops endpoint).
    pub fn readiness(&self) -> Arc<SharedIndex> {
        self.shared.clone()
    }

    /// Serves until `shutdown` completes; fails if a watcher or the server ends on its own.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let Prepared {
            args,
            server,
            ops_listener,
            shared,
            metrics,
        } = self;
        let client = kube_client(args.kubeconfig.as_ref()).await?;
        let mut watchers = watch::spawn_watchers(
            client,
            shared.clone(),
            metrics.clone(),
            args.pods == PodsMode::Verified,
        );
        let ops_task = tokio::spawn(ops::serve(ops_listener, shared.clone(), metrics.clone()));
        tracing::info!(udp = %server.udp_addr(), tcp = %server.tcp_addr(), "ferry dns serving");
        // A watcher that panics or fails leaves the index stale; the task that only marks
        // the index ready ends normally once it has.
        let watch_failed = async {
            loop {
                if watchers.is_empty() {
                    return std::future::pending().await;
                }
                let (r, i, _) = futures::future::select_all(watchers.iter_mut()).await;
                watchers.remove(i);
                match r {
                    Ok(()) => continue,
                    Err(e) if e.is_panic() => {
                        return Error::WatcherPanicked(panic_text(e));
                    }
                    Err(e) => return Error::WatcherStopped(e),
                }
            }
        };
        let result = tokio::select! {
            r = server.run(shutdown) => r,
            e = watch_failed => {
                // Answers would go stale: not ready until restarted.
                shared.set_not_ready();
                Err(e)
            }
        };
        ops_task.abort();
        for w in watchers {
            w.abort();
        }
        result
    }
}

fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(non-string panic payload)".into()),
        Err(e) => e.to_string(),
    }
}

/// A DNS server running in-process from a prebuilt index (tests, benchmarks).
pub struct Running {
    pub udp_addr: SocketAddr,
    pub tcp_addr: SocketAddr,
    pub index: Arc<SharedIndex>,
    pub metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<()>>,
}

/// Starts UDP/TCP servers answering from `index` (marked ready).
pub async fn start_with_index(index: Index, cfg: ServerConfig) -> Result<Running> {
    let metrics = Arc::new(Metrics::new());
    let shared = Arc::new(SharedIndex::new(index));
    shared.set_ready();
    let server = server::Server::bind(cfg, shared.clone(), metrics.clone()).await?;
    let (udp_addr, tcp_addr) = (server.udp_addr(), server.tcp_addr());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    Ok(Running {
        udp_addr,
        tcp_addr,
        index: shared,
        metrics,
        stop: Some(tx),
        task,
    })
}

impl Running {
    /// Stops the servers and waits for them.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_helpers() {
        assert_eq!(
            parse_stub("Corp.Example.=10.0.0.1:53,10.0.0.2:5353").unwrap(),
            (
                "corp.example".to_string(),
                vec![
                    "10.0.0.1:53".parse().unwrap(),
                    "10.0.0.2:5353".parse().unwrap()
                ]
            )
        );
        assert!(parse_stub("nope").is_err());
        let ns = resolv_conf_nameservers(
            "# x\nnameserver 127.0.0.53\nsearch a\nnameserver fe80::1%eth0\n",
        );
        assert_eq!(
            ns,
            vec![
                "127.0.0.53:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
    }
}
