//! The proxy against real backends on loopback (no API server): the route table from
//! [`routes::build`] is swapped into a running proxy; requests go through hyper on both sides.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use ferry_ingress::{proxy, routes};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A backend answering `name` plus the request's headers as JSON; counts its connections.
/// A path `/slow` answers after 500 ms.
async fn backend(name: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: Request<hyper::body::Incoming>| async move {
                        if req.uri().path() == "/slow" {
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        let headers: serde_json::Map<String, serde_json::Value> = req
                            .headers()
                            .iter()
                            .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
                            .collect();
                        let body = json!({"name": name, "path": req.uri().to_string(), "headers": headers});
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body.to_string()))))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    (addr, conns)
}

/// A table: host `h.test`, Prefix `/`, to a Service with the given endpoints (all on one port
/// number is not needed: each endpoint is its own address).
fn table(endpoints: &[SocketAddr]) -> routes::RouteTable {
    let mut inputs = routes::Inputs::default();
    inputs.ingresses.push(
        serde_json::from_value(json!({
            "metadata": {"name": "i", "namespace": "default", "annotations": {"kubernetes.io/ingress.class": "ferry"}},
            "spec": {"rules": [{"host": "h.test", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "s", "port": {"number": 80}}}}]}}]}
        }))
        .unwrap(),
    );
    let key = ("default".to_string(), "s".to_string());
    inputs.services.insert(
        key.clone(),
        serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80}]}}))
        .unwrap(),
    );
    // One slice per endpoint, since their ports differ.
    inputs.slices.insert(
        key,
        endpoints
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                serde_json::from_value(json!({
                    "metadata": {"name": format!("s-{i}"), "namespace": "default", "labels": {"kubernetes.io/service-name": "s"}},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": ep.port(), "protocol": "TCP"}],
                    "endpoints": [{"addresses": [ep.ip().to_string()]}]
                }))
                .unwrap()
            })
            .collect(),
    );
    routes::build(&inputs, &routes::ClassPolicy::default()).table
}

async fn start_proxy(limits: proxy::Limits) -> (SocketAddr, Arc<proxy::Shared>) {
    let shared = proxy::Shared::new(limits, false);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy::serve_http(
        shared.clone(),
        l,
        CancellationToken::new(),
    ));
    (addr, shared)
}

async fn client(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    tx
}

async fn get(
    tx: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: &str,
    path: &str,
) -> (u16, String) {
    tx.ready().await.unwrap();
    let req = Request::builder()
        .uri(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tx.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn round_robin_pooling_retries_and_headers() {
    let (a, a_conns) = backend("a").await;
    let (b, b_conns) = backend("b").await;
    // An endpoint that refuses connections: requests move on to the others.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let (addr, shared) = start_proxy(proxy::Limits::default()).await;
    shared.swap_routes(table(&[a, b, dead]));
    let mut tx = client(addr).await;
    let mut names = Vec::new();
    for _ in 0..30 {
        let (status, body) = get(&mut tx, "h.test", "/x?y=1").await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["path"], "/x?y=1");
        assert_eq!(v["headers"]["host"], "h.test");
        assert_eq!(v["headers"]["x-forwarded-for"], "127.0.0.1");
        assert_eq!(v["headers"]["x-real-ip"], "127.0.0.1");
        assert_eq!(v["headers"]["x-forwarded-proto"], "http");
        assert_eq!(v["headers"]["x-forwarded-host"], "h.test");
        assert_eq!(v["headers"]["x-forwarded-port"], addr.port().to_string());
        names.push(v["name"].as_str().unwrap().to_string());
    }
    let na = names.iter().filter(|n| *n == "a").count();
    let nb = names.iter().filter(|n| *n == "b").count();
    assert_eq!(na + nb, 30);
    assert!(na >= 10 && nb >= 10, "balanced: a={na} b={nb}");
    // Keep-alive towards the backends: sequential requests reuse one connection each.
    assert_eq!(a_conns.load(Ordering::SeqCst), 1);
    assert_eq!(b_conns.load(Ordering::SeqCst), 1);

    // Unknown host: 404; a table without endpoints: 503.
    assert_eq!(get(&mut tx, "other.test", "/").await.0, 404);
    shared.swap_routes(table(&[]));
    assert_eq!(get(&mut tx, "h.test", "/").await.0, 503);
    // Only dead endpoints: 502.
    shared.swap_routes(table(&[dead]));
    assert_eq!(get(&mut tx, "h.test", "/").await.0, 502);
}

#[tokio::test]
async fn a_table_swap_never_drops_a_request_in_flight() {
    let (a, _) = backend("a").await;
    let (b, _) = backend("b").await;
    let (addr, shared) = start_proxy(proxy::Limits::default()).await;
    shared.swap_routes(table(&[a]));
    let mut tx = client(addr).await;
    let slow = tokio::spawn(async move { get(&mut tx, "h.test", "/slow").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Swapped mid-request to a table where `a` is gone: the request still completes on `a`.
    shared.swap_routes(table(&[b]));
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("\"name\":\"a\""), "{body}");
    let mut tx2 = client(addr).await;
    let (_, body) = get(&mut tx2, "h.test", "/").await;
    assert!(body.contains("\"name\":\"b\""), "{body}");
}

#[tokio::test]
async fn oversized_request_heads_are_refused() {
    let (a, _) = backend("a").await;
    let (addr, shared) = start_proxy(proxy::Limits {
        max_header_bytes: 8192,
        ..Default::default()
    })
    .await;
    shared.swap_routes(table(&[a]));
    let mut s = TcpStream::connect(addr).await.unwrap();
    let big = "x".repeat(20_000);
    let req = format!("GET / HTTP/1.1\r\nHost: h.test\r\nX-Big: {big}\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "a 20 kB header must not be proxied: {text}"
    );
    assert!(!text.contains("\"name\""));
}
