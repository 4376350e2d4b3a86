//! Ferry's Kubernetes-compatible API server: discovery, OpenAPI, CRUD, watch, patch, Tables,
//! `Status` errors, bearer-token authentication over TLS, served from a watch cache in front of a
//! [`ferry_store::Store`].

pub mod api;
pub mod body;
pub mod cache;
pub mod discovery;
pub mod managed;
pub mod objects;
pub mod patching;
pub mod pki;
pub mod request;
pub mod server;
pub mod status;
pub mod table;
pub mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use ferry_store::Store;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use server::Server;

/// How to run the API server.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// Serve plain HTTP instead of HTTPS (tokens still required).
    pub plain_http: bool,
    /// Extra names/IPs for the serving certificate.
    pub extra_sans: Vec<String>,
}

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
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating {}", config.data_dir.display()))?;
    let mut sans = config.extra_sans.clone();
    sans.push(config.listen.ip().to_string());
    let pki = pki::load_or_create(&config.data_dir, &sans)?;
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
                tracing::warn!("store watch ended: {err}; resuming");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                from = cache.revision();
            }
        });
    }
    let api = api::Api::new(store.clone(), cache);
    let scheme = if config.plain_http { "http" } else { "https" };
    let host = match addr.ip() {
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
        std::net::IpAddr::V4(ip) => ip.to_string(),
    };
    let url = format!("{scheme}://{host}:{}", addr.port());
    let server = Arc::new(Server {
        api,
        openapi: ferry_openapi::OpenApi::build(),
        token: Some(pki.admin_token.clone()),
        ready: false.into(),
        advertise: format!("{host}:{}", addr.port()),
    });
    let tls = if config.plain_http {
        None
    } else {
        Some(pki.server_config()?)
    };
    let done = tokio::spawn(server::serve(
        server.clone(),
        listener,
        tls,
        shutdown.clone(),
    ));
    bootstrap(&server.api).await?;
    let kubeconfig = config.data_dir.join("kubeconfig");
    pki::write_kubeconfig(&kubeconfig, &pki.kubeconfig(&url, !config.plain_http))?;
    server.ready.store(true, Ordering::SeqCst);
    Ok(Running {
        addr,
        url,
        kubeconfig,
        server,
        done,
    })
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
            Err(e) => anyhow::bail!("creating namespace {name}: {}", e.message),
        }
    }
    Ok(())
}
