//! The Ingress data path alone, for bench/ingress: one Ingress (`bench.test` and a catch-all
//! rule, Prefix `/`) to a Service whose EndpointSlice lists the given backends, routed through
//! the same pure table and proxy as `ferry ingress`, without an API server.
//!
//!     ingress_bench LISTEN BACKEND[,BACKEND...] [WORKER_THREADS]
//!
//! WORKER_THREADS 0 (default) runs a current-thread runtime (one core). `FERRY_INGRESS_FAST=0`
//! turns the HTTP/1.1 fast path off (hyper serves every connection), for before/after figures.
//! `FERRY_BENCH_TLS=ADDR,CERT.pem,KEY.pem` also serves HTTPS on ADDR with that certificate
//! (TLS termination as `ferry ingress` does it: rustls, then hyper).

use std::net::SocketAddr;
use std::sync::Arc;

use ferry_ingress::{proxy, routes, tls};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(backends)) = (args.get(1), args.get(2)) else {
        return Err("usage: ingress_bench LISTEN BACKEND[,BACKEND...] [THREADS]".into());
    };
    let listen: SocketAddr = listen.parse()?;
    let backends: Vec<SocketAddr> = backends
        .split(',')
        .map(|b| b.parse())
        .collect::<Result<_, _>>()?;
    let threads: usize = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(0);
    let rt = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    rt.block_on(async move {
        let mut inputs = routes::Inputs::default();
        inputs.ingresses.push(serde_json::from_value(json!({
            "metadata": {"name": "bench", "namespace": "default",
                         "annotations": {"kubernetes.io/ingress.class": "ferry"}},
            "spec": {"rules": [
                {"host": "bench.test", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "origin", "port": {"number": 80}}}}]}},
                {"http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "origin", "port": {"number": 80}}}}]}}
            ]}
        }))?);
        let key = ("default".to_string(), "origin".to_string());
        inputs.services.insert(
            key.clone(),
            serde_json::from_value(json!({
                "metadata": {"name": "origin", "namespace": "default"},
                "spec": {"ports": [{"name": "http", "port": 80}]}
            }))?,
        );
        let eps: Vec<_> = backends
            .iter()
            .map(|b| json!({"addresses": [b.ip().to_string()], "conditions": {"ready": true}}))
            .collect();
        inputs.slices.insert(
            key,
            vec![serde_json::from_value(json!({
                "metadata": {"name": "origin-1", "namespace": "default",
                             "labels": {"kubernetes.io/service-name": "origin"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": backends[0].port(), "protocol": "TCP"}],
                "endpoints": eps
            }))?],
        );
        let built = routes::build(&inputs, &routes::ClassPolicy::default());
        let shared = proxy::Shared::new(proxy::Limits::default(), false);
        shared.swap_routes(built.table);
        shared.set_fast_path(std::env::var("FERRY_INGRESS_FAST").as_deref() != Ok("0"));
        if let Ok(spec) = std::env::var("FERRY_BENCH_TLS") {
            let parts: Vec<&str> = spec.split(',').collect();
            let [addr, crt, key] = parts[..] else {
                return Err("FERRY_BENCH_TLS=ADDR,CERT,KEY".into());
            };
            let addr: SocketAddr = addr.parse()?;
            let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
                "metadata": {"name": "bench-tls", "namespace": "default"},
                "type": "kubernetes.io/tls",
            }))?;
            let mut secret = secret;
            secret.data = Some(
                [("tls.crt", crt), ("tls.key", key)]
                    .into_iter()
                    .map(|(k, f)| Ok((k.to_string(), k8s_openapi::ByteString(std::fs::read(f)?))))
                    .collect::<Result<_, std::io::Error>>()?,
            );
            let ck = tls::certified_key(&secret, "default/bench-tls")?;
            let table = tls::CertTable {
                exact: Default::default(),
                wildcard: Default::default(),
                default: ck,
            };
            let config = tls::server_config(Arc::new(tls::Resolver::new(table)));
            let l = tokio::net::TcpListener::bind(addr).await?;
            eprintln!("ingress_bench: listening on {addr} (HTTPS)");
            tokio::spawn(proxy::serve_https(
                shared.clone(),
                l,
                Arc::new(config),
                CancellationToken::new(),
            ));
        }
        let listener = tokio::net::TcpListener::bind(listen).await?;
        eprintln!("ingress_bench: listening on {listen}");
        proxy::serve_http(shared, listener, CancellationToken::new()).await;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
