//! Ferry's Kubernetes-compatible API server: discovery, OpenAPI, CRUD, watch, patch, Tables,
//! `Status` errors, bearer-token authentication over TLS, served from a watch cache in front of a
//! [`ferry_store::Store`]. The work and memory of one request are bounded: see [`limits`].

pub mod admission;
pub mod alloc;
pub mod api;
pub mod auth;
pub mod body;
pub mod cache;
pub mod compact;
pub mod crd;
pub mod discovery;
pub mod ephemeral;
pub mod error;
pub mod eviction;
pub mod kept;
pub mod limits;
pub mod managed;
pub mod metadata;
pub mod metrics;
pub mod objects;
pub mod patching;
pub mod pki;
pub mod podproxy;
pub mod readyz;
pub mod request;
pub mod resourceproxy;
pub mod rv;
pub mod secret;
pub mod server;
pub mod status;
pub mod strict;
pub mod table;
pub mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use error::Context;
use ferry_store::Store;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use error::{Error, Result};
pub use server::Server;

/// The embedded store's page cache (redb's default is 1 GiB). Reads are served from the watch
/// cache, so the store's cache only needs the B-tree's interior pages hot for writes; pages it
/// does not hold are read from the kernel's page cache (`pread`). Measured with 161,200 objects
/// (a 550 MB store): redb's default kept ~275 MiB of pages the watch cache's load had read
/// (RSS after a restart 601 -> 326 MiB at 64 MiB); 64 MiB were still full of such pages
/// (heaptrack: 67 MB, a quarter of the heap) and 16 MiB serve the same load as fast (RSS after
/// a restart 299 -> 246 MiB, after the load 332 -> 293 MiB; see SCALE.md).
pub const STORE_PAGE_CACHE_BYTES: usize = 16 << 20;

/// How to run the API server.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// Serve plain HTTP instead of HTTPS (tokens still required).
    pub plain_http: bool,
    /// Extra names/IPs for the serving certificate.
    pub extra_sans: Vec<String>,
    /// `--service-cluster-ip-range`: one CIDR, or two of different families (dual-stack);
    /// the first is the primary family.
    pub service_cidrs: Vec<alloc::Cidr>,
    /// `--service-node-port-range`.
    pub node_port_range: alloc::PortRange,
    /// `--audit-log-path`: `audit.k8s.io/v1` Events as JSON lines (Metadata level, mode 0600).
    pub audit_log_path: Option<PathBuf>,
    /// `--kubelet-client-certificate` / `--kubelet-client-key`: the client certificate presented
    /// to node agents (default: one the cluster CA issues, in `pki/apiserver-kubelet-client.*`).
    pub kubelet_client_certificate: Option<PathBuf>,
    pub kubelet_client_key: Option<PathBuf>,
    /// `--kubelet-certificate-authority`: agents' serving certificates must chain to it
    /// (default: the cluster CA).
    pub kubelet_certificate_authority: Option<PathBuf>,
    /// Concurrent client connections; more wait in the listen queue. 0 sizes it from the
    /// file-descriptor limit.
    pub max_connections: usize,
}

impl Default for Config {
    fn default() -> Self {
        let a = alloc::ServiceAlloc::default();
        Config {
            data_dir: PathBuf::from("."),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            plain_http: false,
            extra_sans: Vec::new(),
            service_cidrs: a.cidrs,
            node_port_range: a.node_ports,
            audit_log_path: None,
            kubelet_client_certificate: None,
            kubelet_client_key: None,
            kubelet_certificate_authority: None,
            max_connections: 0,
        }
    }
}

/// How often the allocation repair loop runs.
pub const ALLOC_REPAIR_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// A started API server.
pub struct Running {
    pub addr: SocketAddr,
    pub url: String,
    pub kubeconfig: PathBuf,
    pub server: Arc<Server>,
    pub done: tokio::task::JoinHandle<()>,
}

/// The namespaces every cluster has.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Starts the API server on `store`; returns once it is ready and the kubeconfig is written.
pub async fn start(
    config: Config,
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
) -> Result<Running> {
    ferry_store::private_fs::ensure_private_dir(&config.data_dir)
        .with_context(|| format!("creating {}", config.data_dir.display()))?;
    let mut sans = config.extra_sans.clone();
    sans.push(config.listen.ip().to_string());
    let pki = pki::load_or_create(&config.data_dir, &sans)?;
    let kubelet_tls = kubelet_tls(&config, &pki)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr()?;

    let (cache, rev) = cache::Cache::load(store.as_ref(), &api::Api::all_prefixes()).await?;
    {
        let cache = cache.clone();
        let store = store.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut from = rev;
            loop {
                let err = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    e = cache.follow(store.clone(), from) => e,
                };
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                if matches!(err, ferry_store::StoreError::Compacted { .. }) {
                    tracing::warn!("store watch ended: {err}; re-listing");
                    match cache.resync(store.as_ref()).await {
                        Ok(rev) => from = rev,
                        Err(e) => tracing::warn!("re-list failed: {e}"),
                    }
                } else {
                    tracing::warn!("store watch ended: {err}; resuming");
                    from = cache.revision();
                }
            }
        });
    }
    let service_alloc = alloc::ServiceAlloc {
        cidrs: if config.service_cidrs.is_empty() {
            alloc::ServiceAlloc::default().cidrs
        } else {
            config.service_cidrs.clone()
        },
        node_ports: config.node_port_range,
    };
    let api = api::Api::new(store.clone(), cache).with_service_alloc(service_alloc.clone());
    let scheme = if config.plain_http { "http" } else { "https" };
    let host = match addr.ip() {
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
        std::net::IpAddr::V4(ip) => ip.to_string(),
    };
    let url = format!("{scheme}://{host}:{}", addr.port());
    let server = Arc::new(Server {
        api,
        openapi: std::sync::RwLock::new(Arc::new(ferry_openapi::OpenApi::build())),
        token: Some(pki.admin_token.clone()),
        ready: false.into(),
        checks: Default::default(),
        advertise: format!("{host}:{}", addr.port()),
        auth: auth::Auth::load(&config.data_dir, config.audit_log_path.as_deref())?,
        kubelet_tls,
        pod_network: std::sync::RwLock::new(Arc::new(resourceproxy::Direct::default())),
    });
    server
        .checks
        .add(readyz::STORE_CHECK, readyz::store_check(store.clone()));
    let tls = if config.plain_http {
        None
    } else {
        Some(auth::certs::server_config(&pki)?)
    };
    // Once the server has drained, the store stops cleanly (redb: everything in the database
    // file, no write-ahead log left to replay at the next start).
    let serve = server::serve(
        server.clone(),
        listener,
        tls,
        ferry_limits::ConnLimiter::new(
            "apiserver",
            if config.max_connections == 0 {
                let parts = ferry_limits::Parts {
                    apiserver: true,
                    ..Default::default()
                };
                ferry_limits::plan(ferry_limits::fdlimit::current().soft, parts).apiserver
            } else {
                config.max_connections
            },
        ),
        shutdown.clone(),
    );
    let done = {
        let store = store.clone();
        tokio::spawn(async move {
            serve.await;
            match store.shutdown().await {
                Ok(()) => tracing::info!("store shut down cleanly"),
                Err(e) => tracing::warn!("store shutdown: {e}"),
            }
        })
    };
    bootstrap(&server.api).await?;
    bootstrap_identity(&server.api, &pki.ca_pem).await?;
    auth::bootstrap_policy(&server.api).await?;
    let endpoint_ip = match addr.ip() {
        ip if ip.is_unspecified() => std::net::IpAddr::from([127, 0, 0, 1]),
        ip => ip,
    };
    bootstrap_kubernetes_service(&server.api, endpoint_ip, addr.port()).await?;
    {
        let api_for_repair = Arc::new(
            api::Api::new(store.clone(), server.api.cache.clone())
                .with_service_alloc(service_alloc),
        );
        tokio::spawn(alloc::repair::run(
            api_for_repair,
            ALLOC_REPAIR_INTERVAL,
            shutdown.clone(),
        ));
    }
    let kubeconfig = config.data_dir.join("kubeconfig");
    pki::write_kubeconfig(&kubeconfig, &pki.kubeconfig(&url, !config.plain_http))?;
    // Custom kinds of the stored CRDs are served from the start.
    if let Err(e) = crd::sync(&server).await {
        tracing::warn!(
            "serving the stored CustomResourceDefinitions: {}",
            e.message
        );
    }
    tokio::spawn(crd::run(server.clone(), shutdown.clone()));
    server.ready.store(true, Ordering::SeqCst);
    Ok(Running {
        addr,
        url,
        kubeconfig,
        server,
        done,
    })
}

/// The TLS client configuration towards node agents, from the `--kubelet-*` flags or the PKI.
fn kubelet_tls(config: &Config, pki: &pki::Pki) -> Result<Arc<rustls::ClientConfig>> {
    let read = |p: &Option<PathBuf>, flag: &str, default: &str| -> Result<String> {
        match p {
            Some(p) => Ok(std::fs::read_to_string(p)
                .with_context(|| format!("{flag}: reading {}", p.display()))?),
            None => Ok(default.to_string()),
        }
    };
    if config.kubelet_client_certificate.is_some() != config.kubelet_client_key.is_some() {
        return Err(Error::KubeletClientPair);
    }
    pki::kubelet_client_config(
        &read(
            &config.kubelet_certificate_authority,
            "--kubelet-certificate-authority",
            &pki.ca_pem,
        )?,
        &read(
            &config.kubelet_client_certificate,
            "--kubelet-client-certificate",
            &pki.kubelet_client_cert_pem,
        )?,
        &read(
            &config.kubelet_client_key,
            "--kubelet-client-key",
            &pki.kubelet_client_key_pem,
        )?,
    )
}

/// Creates the system namespaces when missing.
async fn bootstrap(api: &api::Api) -> Result<()> {
    let Some(ns) = api.resource("", "v1", "namespaces").cloned() else {
        return Ok(());
    };
    for name in SYSTEM_NAMESPACES {
        let p = request::ResourcePath {
            group: String::new(),
            version: "v1".into(),
            namespace: None,
            resource: "namespaces".into(),
            name: None,
            subresource: None,
        };
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        match api.create(&ns, &p, &request::Query::default(), body).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => {
                return Err(Error::Bootstrap {
                    what: format!("namespace {name}"),
                    message: e.message,
                });
            }
        }
    }
    Ok(())
}

/// What the root CA publisher writes in `kube-root-ca.crt`'s description annotation.
const ROOT_CA_DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// Creates, when missing, the `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap of
/// the system namespaces (the identity controllers keep them, and those of every other
/// namespace, from then on): pods in `default` are admitted and get their token volume even
/// while no controller runs, e.g. against a lone `ferry apiserver`.
async fn bootstrap_identity(api: &api::Api, ca_pem: &str) -> Result<()> {
    let objects = [("serviceaccounts", None), ("configmaps", Some(ca_pem))];
    for (plural, ca) in objects {
        let Some(res) = api.resource("", "v1", plural).cloned() else {
            continue;
        };
        for ns in SYSTEM_NAMESPACES {
            let p = request::ResourcePath {
                group: String::new(),
                version: "v1".into(),
                namespace: Some(ns.to_string()),
                resource: plural.into(),
                name: None,
                subresource: None,
            };
            let body = match ca {
                None => json!({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": ns}}),
                Some(ca) => json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                        "annotations": {"kubernetes.io/description": ROOT_CA_DESCRIPTION}},
                    "data": {"ca.crt": ca}}),
            };
            match api.create(&res, &p, &request::Query::default(), body).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => {
                    return Err(Error::Bootstrap {
                        what: format!("the {plural} of namespace {ns}"),
                        message: e.message,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Creates the `kubernetes` Service in `default` (ClusterIP = first address of the primary range,
/// port 443 named `https`) when missing.
async fn bootstrap_kubernetes_service(
    api: &api::Api,
    endpoint_ip: std::net::IpAddr,
    port: u16,
) -> Result<()> {
    let Some(res) = api.resource("", "v1", "services").cloned() else {
        return Ok(());
    };
    let Some(ip) = api.services.cidrs.first().and_then(|c| c.first()) else {
        return Ok(());
    };
    let p = request::ResourcePath {
        group: String::new(),
        version: "v1".into(),
        namespace: Some("default".into()),
        resource: "services".into(),
        name: None,
        subresource: None,
    };
    let body = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip.to_string(), "sessionAffinity": "None",
                 "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]},
    });
    match api.create(&res, &p, &request::Query::default(), body).await {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => tracing::warn!("creating the kubernetes Service: {}", e.message),
    }
    // Its Endpoints name this API server (the mirroring controller turns them into a slice);
    // Endpoints may not hold loopback addresses (unless Ferry's loopback pod network is on), so
    // an API server on loopback otherwise has none.
    let Some(eres) = api.resource("", "v1", "endpoints").cloned().filter(|_| {
        !endpoint_ip.is_loopback() || ferry_api::validation::loopback_addresses_allowed()
    }) else {
        return Ok(());
    };
    let ep = request::ResourcePath {
        resource: "endpoints".into(),
        name: Some("kubernetes".into()),
        ..p
    };
    let desired = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": endpoint_ip.to_string()}],
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    });
    let create_path = request::ResourcePath {
        name: None,
        ..ep.clone()
    };
    let q = request::Query::default();
    let result = match api.create(&eres, &create_path, &q, desired.clone()).await {
        Err(e) if e.code == 409 => api
            .guaranteed_update(
                &eres,
                &ep,
                &q,
                None,
                false,
                |old| {
                    let mut next = desired.clone();
                    if let Some(rv) = old.and_then(|o| o.pointer("/metadata/resourceVersion")) {
                        next["metadata"]["resourceVersion"] = rv.clone();
                    }
                    Ok(next)
                },
                None,
                true,
            )
            .await
            .map(|_| ()),
        other => other.map(|_| ()),
    };
    if let Err(e) = result {
        tracing::warn!("writing the kubernetes Endpoints: {}", e.message);
    }
    Ok(())
}
