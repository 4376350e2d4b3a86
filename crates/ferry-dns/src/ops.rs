//! `/healthz`, `/readyz` and `/metrics` over HTTP/1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::server::SharedIndex;

fn respond(index: &SharedIndex, metrics: &Metrics, path: &str) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match path {
        "/healthz" | "/livez" => (StatusCode::OK, "text/plain", "ok".to_string()),
        "/readyz" if index.is_ready() => (StatusCode::OK, "text/plain", "ok".to_string()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "index not synced yet".to_string(),
        ),
        "/metrics" => {
            {
                let idx = index.read();
                metrics.index_services.set(idx.service_count() as i64);
                metrics.index_pods.set(idx.pod_count() as i64);
            }
            (
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                metrics.encode(),
            )
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found".to_string()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(ctype) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

/// Binds the operations listener.
pub async fn bind(addr: SocketAddr) -> crate::Result<TcpListener> {
    Ok(TcpListener::bind(addr).await?)
}

/// Serves the operations endpoints until the task is dropped.
pub async fn serve(listener: TcpListener, index: Arc<SharedIndex>, metrics: Arc<Metrics>) {
    // Probes and scrapes are few: a small cap keeps a flood from taking DNS's descriptors.
    let limit = ferry_limits::ConnLimiter::new("dns-ops", 64);
    let mut acceptor = ferry_limits::Acceptor::new("dns-ops");
    loop {
        let permit = limit.acquire(|_| {}).await;
        let (stream, _) = acceptor.accept(&listener).await;
        let index = index.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = respond(&index, &metrics, req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            // A client that never finishes its request headers does not hold a slot.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
            drop(permit);
        });
    }
}
