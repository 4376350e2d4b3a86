//! `ferry ingress`: an Ingress controller and HTTP/HTTPS proxy.
//!
//! - [`routes`]: the pure route table (hosts, wildcards, path types, default backends, classes).
//! - [`tls`]: certificates from `kubernetes.io/tls` Secrets chosen by SNI (pure table + resolver).
//! - [`pool`] and [`proxy`]: the data path (hyper + rustls), keep-alive pools to endpoints.
//! - [`controller`]: kube-rs reflectors feeding one coalescing rebuild loop, status and Events.

pub mod controller;
pub mod fast;
pub mod pool;
pub mod proxy;
pub mod routes;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use routes::CONTROLLER_NAME;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kubeconfig(#[from] ferry_kubeclient::Error),
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
    #[error("listening on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("network namespace {0}: {1}")]
    Netns(String, String),
    #[error("default certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("bad argument: {0}")]
    Arg(String),
}

/// Flags of `ferry ingress`.
#[derive(clap::Args, Debug, Clone)]
pub struct IngressArgs {
    /// The kubeconfig to reach the API server (default: `$KUBECONFIG`, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Where plain HTTP is served (`off` disables it).
    #[arg(long = "http-addr", default_value = "0.0.0.0:80")]
    pub http_addr: String,
    /// Where HTTPS is served (`off` disables it).
    #[arg(long = "https-addr", default_value = "0.0.0.0:443")]
    pub https_addr: String,
    /// The addresses written to the Ingresses' `status.loadBalancer.ingress` (IPs or host
    /// names, comma-separated). Default: the HTTP (else HTTPS) listen IP of each data path when
    /// it is not a wildcard.
    #[arg(long = "publish-address", value_delimiter = ',')]
    pub publish_address: Vec<String>,
    /// `IngressClass.spec.controller` value this controller serves.
    #[arg(long = "controller-class", default_value = routes::CONTROLLER_NAME)]
    pub controller_class: String,
    /// Class name accepted in the legacy `kubernetes.io/ingress.class` annotation (besides the
    /// names of IngressClasses of this controller).
    #[arg(long = "ingress-class", default_value = "ferry")]
    pub ingress_class: String,
    /// Serve Ingresses that name no class even when no default IngressClass is ours.
    #[arg(long = "watch-ingress-without-class")]
    pub watch_ingress_without_class: bool,
    /// `namespace/name` of a `kubernetes.io/tls` Secret for names no Ingress covers (default:
    /// a self-signed certificate).
    #[arg(long = "default-ssl-certificate")]
    pub default_ssl_certificate: Option<String>,
    /// Append to a client's X-Forwarded-For (trust the client) instead of replacing it.
    #[arg(long = "trust-forwarded-headers")]
    pub trust_forwarded_headers: bool,
    /// Concurrent client connections at most.
    #[arg(long = "max-connections", default_value_t = 16384)]
    pub max_connections: usize,
    /// Largest request head accepted, in bytes.
    #[arg(long = "max-header-bytes", default_value_t = 64 * 1024)]
    pub max_header_bytes: usize,
    /// Seconds a backend has to answer with its response head (then 504).
    #[arg(long = "upstream-timeout", default_value_t = 60)]
    pub upstream_timeout: u64,
    /// Run the data path (listeners and backend connections) inside this network namespace
    /// (e.g. `/run/netns/node1`); the API client stays in the caller's namespace.
    #[arg(long = "netns")]
    pub netns: Option<PathBuf>,
    /// Worker threads of the data path when it runs in its own namespace (`--netns`).
    #[arg(long = "netns-threads", default_value_t = 1)]
    pub netns_threads: usize,
}

/// Listeners of one data path inside a network namespace ([`Handle::serve`]).
#[derive(Debug, Clone)]
pub struct DataPath {
    pub netns: PathBuf,
    pub http: Option<SocketAddr>,
    pub https: Option<SocketAddr>,
}

impl IngressArgs {
    /// The defaults, as if no flag were given.
    pub fn defaults() -> IngressArgs {
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            a: IngressArgs,
        }
        <Wrap as clap::Parser>::parse_from(["ingress"]).a
    }
}

/// A running ingress: where it listens.
#[derive(Debug, Clone)]
pub struct Running {
    pub http: Option<SocketAddr>,
    pub https: Option<SocketAddr>,
}

/// The listen IPs of the data paths (HTTP, else HTTPS), wildcards left out, each once.
fn publish_addresses(running: &[Running]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in running {
        if let Some(a) = r.http.or(r.https).filter(|a| !a.ip().is_unspecified()) {
            let ip = a.ip().to_string();
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
    }
    out
}

fn parse_addr(s: &str) -> Result<Option<SocketAddr>, Error> {
    if s.is_empty() || s == "off" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| Error::Arg(format!("{s} is not an address:port")))
}

async fn client_for(args: &IngressArgs) -> Result<kube::Client, Error> {
    Ok(ferry_kubeclient::client(args.kubeconfig.as_deref()).await?)
}

/// Binds the listeners (in `--netns` when given) and starts the proxy and the controller;
/// returns once listening. Everything stops when `stop` is cancelled.
pub async fn start(args: &IngressArgs, stop: CancellationToken) -> Result<Running, Error> {
    let client = client_for(args).await?;
    start_with_client(client, args, stop).await
}

pub async fn start_with_client(
    client: kube::Client,
    args: &IngressArgs,
    stop: CancellationToken,
) -> Result<Running, Error> {
    let http = parse_addr(&args.http_addr)?;
    let https = parse_addr(&args.https_addr)?;
    let parts = Parts::new(args)?;
    let netns = args.netns.clone().map(|p| (p, args.netns_threads.max(1)));
    let running = serve_data_path(
        parts.shared.clone(),
        http,
        https,
        parts.tls_config.clone(),
        netns,
        stop.clone(),
    )
    .await?;
    let publish = if args.publish_address.is_empty() {
        publish_addresses(std::slice::from_ref(&running))
    } else {
        args.publish_address.clone()
    };
    parts.run_controller(client, args, publish, stop)?;
    Ok(running)
}

/// One controller and route table whose data paths are added one by one ([`Handle::serve`]),
/// each with its own lifetime: `ferry up` in netns mode serves Ingresses on every node's
/// addresses, inside the node's namespace, and stops a node's listeners with the node.
pub struct Handle {
    parts: Parts,
    threads: usize,
}

impl Handle {
    /// Starts the controller; `publish` are the addresses written to the Ingresses' status
    /// (the listeners are added with [`Handle::serve`]).
    pub fn start(
        client: kube::Client,
        args: &IngressArgs,
        publish: Vec<String>,
        stop: CancellationToken,
    ) -> Result<Handle, Error> {
        let parts = Parts::new(args)?;
        let handle = Handle {
            parts: parts.clone(),
            threads: args.netns_threads.max(1),
        };
        parts.run_controller(client, args, publish, stop)?;
        Ok(handle)
    }

    /// Listens for one data path inside its namespace until `stop`.
    pub async fn serve(&self, dp: DataPath, stop: CancellationToken) -> Result<Running, Error> {
        serve_data_path(
            self.parts.shared.clone(),
            dp.http,
            dp.https,
            self.parts.tls_config.clone(),
            Some((dp.netns, self.threads)),
            stop,
        )
        .await
    }
}

/// The proxy's shared state, the certificate resolver and TLS configuration.
#[derive(Clone)]
struct Parts {
    shared: Arc<proxy::Shared>,
    resolver: Arc<tls::Resolver>,
    tls_config: Arc<rustls::ServerConfig>,
    fallback: Arc<rustls::sign::CertifiedKey>,
}

impl Parts {
    fn new(args: &IngressArgs) -> Result<Parts, Error> {
        let limits = proxy::Limits {
            max_header_bytes: args.max_header_bytes,
            response_timeout: Duration::from_secs(args.upstream_timeout.max(1)),
            max_connections: args.max_connections.max(1),
            ..Default::default()
        };
        let shared = proxy::Shared::new(limits, args.trust_forwarded_headers);
        let fallback = tls::self_signed()?;
        let resolver = Arc::new(tls::Resolver::new(tls::CertTable {
            exact: Default::default(),
            wildcard: Default::default(),
            default: fallback.clone(),
        }));
        let tls_config = Arc::new(tls::server_config(resolver.clone()));
        Ok(Parts {
            shared,
            resolver,
            tls_config,
            fallback,
        })
    }

    fn run_controller(
        self,
        client: kube::Client,
        args: &IngressArgs,
        publish: Vec<String>,
        stop: CancellationToken,
    ) -> Result<(), Error> {
        let default_certificate = match &args.default_ssl_certificate {
            None => None,
            Some(s) => match s.split_once('/') {
                Some((ns, n)) => Some((ns.to_string(), n.to_string())),
                None => {
                    return Err(Error::Arg(format!(
                        "--default-ssl-certificate {s}: want namespace/name"
                    )));
                }
            },
        };
        let settings = controller::Settings {
            policy: routes::ClassPolicy {
                controller: args.controller_class.clone(),
                class_name: args.ingress_class.clone(),
                watch_without_class: args.watch_ingress_without_class,
            },
            publish,
            default_certificate,
            fallback_cert: self.fallback,
            min_sync: Duration::from_millis(20),
        };
        tokio::spawn(controller::run(
            client,
            self.shared,
            self.resolver,
            settings,
            stop,
        ));
        Ok(())
    }
}

/// Starts the listeners of the data path: here, or — with `netns` (path, worker threads) — on
/// threads inside that network namespace. Returns once listening.
pub async fn serve_data_path(
    shared: Arc<proxy::Shared>,
    http: Option<SocketAddr>,
    https: Option<SocketAddr>,
    tls_config: Arc<rustls::ServerConfig>,
    netns: Option<(PathBuf, usize)>,
    stop: CancellationToken,
) -> Result<Running, Error> {
    match netns {
        None => serve_here(shared, http, https, tls_config, stop).await,
        Some((path, threads)) => {
            // The namespace thread reports through a blocking channel.
            tokio::task::spawn_blocking(move || {
                serve_in_netns(path, threads, shared, http, https, tls_config, stop)
            })
            .await
            .map_err(|e| Error::Netns("(thread)".into(), e.to_string()))?
        }
    }
}

async fn serve_here(
    shared: Arc<proxy::Shared>,
    http: Option<SocketAddr>,
    https: Option<SocketAddr>,
    tls_config: Arc<rustls::ServerConfig>,
    stop: CancellationToken,
) -> Result<Running, Error> {
    let mut running = Running {
        http: None,
        https: None,
    };
    if let Some(a) = http {
        let l = TcpListener::bind(a)
            .await
            .map_err(|e| Error::Listen(a, e))?;
        running.http = l.local_addr().ok();
        tokio::spawn(proxy::serve_http(shared.clone(), l, stop.clone()));
    }
    if let Some(a) = https {
        let l = TcpListener::bind(a)
            .await
            .map_err(|e| Error::Listen(a, e))?;
        running.https = l.local_addr().ok();
        tokio::spawn(proxy::serve_https(shared, l, tls_config, stop));
    }
    Ok(running)
}

/// Runs the data path on threads that entered the network namespace at `path`: sockets made
/// there (listeners, backend connections) belong to that namespace.
fn serve_in_netns(
    path: PathBuf,
    threads: usize,
    shared: Arc<proxy::Shared>,
    http: Option<SocketAddr>,
    https: Option<SocketAddr>,
    tls_config: Arc<rustls::ServerConfig>,
    stop: CancellationToken,
) -> Result<Running, Error> {
    let name = path.display().to_string();
    let file = std::fs::File::open(&path).map_err(|e| Error::Netns(name.clone(), e.to_string()))?;
    let file = Arc::new(file);
    let (tx, rx) = std::sync::mpsc::channel::<Result<Running, Error>>();
    let enter = {
        let file = file.clone();
        move || nix::sched::setns(file.as_ref(), nix::sched::CloneFlags::CLONE_NEWNET)
    };
    // The main thread of the data path enters first, so that a failure is reported.
    let n2 = name.clone();
    std::thread::Builder::new()
        .name("ferry-ingress-netns".into())
        .spawn(move || {
            if let Err(e) = enter() {
                let _ = tx.send(Err(Error::Netns(n2, e.to_string())));
                return;
            }
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .on_thread_start(move || {
                    if let Err(e) =
                        nix::sched::setns(file.as_ref(), nix::sched::CloneFlags::CLONE_NEWNET)
                    {
                        tracing::error!(
                            "ingress data path thread could not enter its namespace: {e}"
                        );
                    }
                })
                .build();
            let rt = match rt {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(Error::Netns(n2, e.to_string())));
                    return;
                }
            };
            rt.block_on(async move {
                let r = serve_here(shared, http, https, tls_config, stop.clone()).await;
                let ok = r.is_ok();
                let _ = tx.send(r);
                if ok {
                    stop.cancelled().await;
                    // Let the listeners drain.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        })
        .map_err(|e| Error::Netns(name.clone(), e.to_string()))?;
    rx.recv()
        .map_err(|_| Error::Netns(name, "data path thread ended".into()))?
}

/// `ferry ingress`: runs until `shutdown`.
pub async fn run(
    args: IngressArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let stop = CancellationToken::new();
    let running = start(&args, stop.clone()).await?;
    tracing::info!(http = ?running.http, https = ?running.https, "ingress proxy listening");
    shutdown.await;
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}
