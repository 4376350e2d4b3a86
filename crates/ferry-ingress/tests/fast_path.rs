//! The plain-HTTP/1.1 fast path against raw backends on loopback: backends that close pooled
//! keep-alive connections, chunked and close-delimited responses, request bodies, and the
//! hand-over of upgrades to the hyper path.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use ferry_ingress::{proxy, routes};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// One request read by the raw backend.
struct Got {
    path: String,
    body: Vec<u8>,
    headers: Vec<(String, String)>,
}

async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Got> {
    loop {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut hs);
        if let Ok(httparse::Status::Complete(n)) = req.parse(buf) {
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into(),
                    )
                })
                .collect();
            let len: usize = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .map_or(0, |(_, v)| v.parse().unwrap());
            let path = req.path.unwrap().to_string();
            while buf.len() < n + len {
                let mut b = [0u8; 4096];
                let r = s.read(&mut b).await.ok()?;
                if r == 0 {
                    return None;
                }
                buf.extend_from_slice(&b[..r]);
            }
            let body = buf[n..n + len].to_vec();
            buf.drain(..n + len);
            return Some(Got {
                path,
                body,
                headers,
            });
        }
        let mut b = [0u8; 4096];
        let r = s.read(&mut b).await.ok()?;
        if r == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..r]);
    }
}

/// A hand-written HTTP/1.1 backend; counts its connections. Paths:
/// `/ok` answers `ok <conn> <body>`; `/idle-close` answers, then closes the connection 100 ms
/// later; `/drop-next` answers, then reads the next request on that connection and closes
/// without answering; `/chunked` answers chunked in two writes with a trailer; `/eof` answers
/// without a length and closes.
async fn raw_backend() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let id = c.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut drop_next = false;
                while let Some(got) = read_request(&mut s, &mut buf).await {
                    if drop_next {
                        return;
                    }
                    let xff = got
                        .headers
                        .iter()
                        .find(|(k, _)| k == "x-forwarded-for")
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default();
                    let text = format!("ok {id} {} {xff}", String::from_utf8_lossy(&got.body));
                    let fixed = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nKeep-Alive: timeout=5\r\n\r\n{text}",
                        text.len()
                    );
                    match got.path.as_str() {
                        "/chunked" => {
                            s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
                                .await
                                .unwrap();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            s.write_all(b"6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
                                .await
                                .unwrap();
                        }
                        "/eof" => {
                            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\nuntil the end").await;
                            return;
                        }
                        "/idle-close" => {
                            let _ = s.write_all(fixed.as_bytes()).await;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            return;
                        }
                        "/drop-next" => {
                            let _ = s.write_all(fixed.as_bytes()).await;
                            drop_next = true;
                        }
                        _ => {
                            let _ = s.write_all(fixed.as_bytes()).await;
                        }
                    }
                }
            });
        }
    });
    (addr, conns)
}

fn table(ep: SocketAddr) -> routes::RouteTable {
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
    inputs.slices.insert(
        key,
        vec![serde_json::from_value(json!({
            "metadata": {"name": "s-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "s"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": ep.port(), "protocol": "TCP"}],
            "endpoints": [{"addresses": [ep.ip().to_string()]}]
        }))
        .unwrap()],
    );
    routes::build(&inputs, &routes::ClassPolicy::default()).table
}

async fn start(ep: SocketAddr) -> SocketAddr {
    let shared = proxy::Shared::new(proxy::Limits::default(), false);
    shared.swap_routes(table(ep));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy::serve_http(shared, l, CancellationToken::new()));
    addr
}

type Tx = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn client(addr: SocketAddr) -> Tx {
    let s = TcpStream::connect(addr).await.unwrap();
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    tx
}

async fn call(tx: &mut Tx, method: &str, path: &str, body: &str) -> (u16, String, Vec<String>) {
    tx.ready().await.unwrap();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "h.test")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = tx.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let names = resp.headers().keys().map(|k| k.to_string()).collect();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned(), names)
}

#[tokio::test]
async fn a_pooled_connection_the_backend_closed_is_replaced() {
    let (ep, conns) = raw_backend().await;
    let addr = start(ep).await;
    let mut tx = client(addr).await;
    // The backend closes each connection shortly after answering: the next request, on the
    // same client connection, goes out on a fresh backend connection.
    for i in 1..=3 {
        let (status, body, names) = call(&mut tx, "GET", "/idle-close", "").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, format!("ok {i}  127.0.0.1"));
        assert!(!names.iter().any(|n| n == "keep-alive"), "{names:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The backend takes the next request on a pooled connection and closes it unanswered
    // (the keep-alive race): an idempotent request is sent again on a fresh connection.
    let (status, _, _) = call(&mut tx, "GET", "/drop-next", "").await;
    assert_eq!(status, 200);
    let before = conns.load(Ordering::SeqCst);
    let (status, body, _) = call(&mut tx, "GET", "/ok", "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, format!("ok {}  127.0.0.1", before + 1));
    // A POST that reached the backend is not sent twice (as nginx): 502, and the client
    // connection goes on.
    let (status, _, _) = call(&mut tx, "GET", "/drop-next", "").await;
    assert_eq!(status, 200);
    let (status, _, _) = call(&mut tx, "POST", "/ok", "data").await;
    assert_eq!(status, 502);
    let (status, body, _) = call(&mut tx, "POST", "/ok", "data").await;
    assert_eq!(status, 200);
    assert!(body.contains(" data "), "{body}");
}

/// Responses whose bodies are joined to their head (small) or sent behind it (larger) arrive
/// whole on one keep-alive connection, around the size where the two meet.
#[tokio::test]
async fn responses_around_the_join_size_arrive_whole() {
    let (ep, conns) = raw_backend().await;
    let addr = start(ep).await;
    let mut tx = client(addr).await;
    for n in [0, 1, 4000, 4060, 4070, 4080, 4090, 4100, 5000, 20_000] {
        let sent: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let (status, body, _) = call(&mut tx, "PUT", "/ok", &sent).await;
        assert_eq!(status, 200);
        assert!(body.starts_with("ok 1 "), "{n}: {body:.40}");
        assert!(body.contains(&sent), "a {n}-byte echo arrives whole");
        assert_eq!(body.len(), "ok 1 ".len() + n + " 127.0.0.1".len(), "{n}");
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn chunked_and_close_delimited_responses_and_request_bodies() {
    let (ep, conns) = raw_backend().await;
    let addr = start(ep).await;
    let mut tx = client(addr).await;
    for _ in 0..3 {
        let (status, body, _) = call(&mut tx, "GET", "/chunked", "").await;
        assert_eq!((status, body.as_str()), (200, "hello world"));
        let big = "b".repeat(200_000);
        let (status, body, _) = call(&mut tx, "PUT", "/ok", &big).await;
        assert_eq!(status, 200);
        assert!(body.contains(&big), "a 200 kB request body arrives whole");
    }
    // Keep-alive both ways: one backend connection carried all of it.
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    let (status, body, names) = call(&mut tx, "GET", "/eof", "").await;
    assert_eq!((status, body.as_str()), (200, "until the end"));
    assert!(names.iter().any(|n| n == "connection"), "{names:?}");
    // The client connection closes after a close-delimited response; a new one works.
    let mut tx = client(addr).await;
    assert_eq!(call(&mut tx, "GET", "/ok", "").await.0, 200);
}

#[tokio::test]
async fn upgrades_and_http10_are_handed_to_hyper_mid_connection() {
    let (ep, _) = raw_backend().await;
    let addr = start(ep).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A fast-path request, then (pipelined on the same connection) an HTTP/1.0 request: the
    // hyper path takes over with the bytes already read and answers both in order.
    s.write_all(
        b"GET /ok HTTP/1.1\r\nHost: h.test\r\n\r\nGET /ok HTTP/1.0\r\nHost: h.test\r\nX-Forwarded-For: 9.9.9.9\r\n\r\n",
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    assert_eq!(
        text.matches("HTTP/1.1 200 OK").count() + text.matches("HTTP/1.0 200 OK").count(),
        2,
        "{text}"
    );
    assert_eq!(text.matches(" 127.0.0.1").count(), 2, "{text}");
    assert!(!text.contains("9.9.9.9"), "{text}");
}

/// A keep-alive backend answering its name; counts the connections it accepted.
async fn named_backend(name: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while read_request(&mut s, &mut buf).await.is_some() {
                    let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n{name}");
                    if s.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, conns)
}

#[tokio::test]
async fn a_keep_alive_connection_follows_route_changes() {
    // Each request of one client connection is routed afresh when the table changed (the
    // connection caches its last route and keeps its backend connection otherwise).
    let (a, a_conns) = named_backend("A").await;
    let (b, b_conns) = named_backend("B").await;
    let shared = proxy::Shared::new(proxy::Limits::default(), false);
    shared.swap_routes(table(a));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy::serve_http(
        shared.clone(),
        l,
        CancellationToken::new(),
    ));
    let mut tx = client(addr).await;
    for _ in 0..3 {
        assert_eq!(call(&mut tx, "GET", "/x", "").await.1, "A");
    }
    // One backend connection carried all three.
    assert_eq!(a_conns.load(Ordering::SeqCst), 1);
    shared.swap_routes(table(b));
    for _ in 0..3 {
        assert_eq!(call(&mut tx, "GET", "/x", "").await.1, "B");
    }
    assert_eq!(b_conns.load(Ordering::SeqCst), 1);
    shared.swap_routes(table(a));
    assert_eq!(call(&mut tx, "GET", "/x?q=1", "").await.1, "A");
    // A host with no route goes to the hyper path (404) on the same connection.
    tx.ready().await.unwrap();
    let req = Request::builder()
        .uri("/x")
        .header("host", "other.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(tx.send_request(req).await.unwrap().status().as_u16(), 404);
}

/// Reads one `Content-Length` response from `s`; `None` at EOF.
async fn raw_response(s: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut hs = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut hs);
        if let httparse::Status::Complete(n) = resp.parse(&buf).unwrap() {
            let len: usize = resp
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
                .unwrap();
            if buf.len() >= n + len {
                return Some(String::from_utf8_lossy(&buf[n..n + len]).into_owned());
            }
        }
        let r = s.read(&mut chunk).await.unwrap();
        if r == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..r]);
    }
}

#[tokio::test]
async fn idle_keep_alive_connections_close_when_the_listener_stops() {
    let (ep, _) = raw_backend().await;
    let shared = proxy::Shared::new(proxy::Limits::default(), false);
    shared.swap_routes(table(ep));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(proxy::serve_http(shared, l, stop.clone()));
    // One connection idle after its first request, one after several (its stop wait is
    // registered once and then only the flag is read).
    let mut conns = Vec::new();
    for n in [1, 3] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        for _ in 0..n {
            s.write_all(b"GET /ok HTTP/1.1\r\nHost: h.test\r\n\r\n")
                .await
                .unwrap();
            let body = raw_response(&mut s).await.unwrap();
            assert!(body.starts_with("ok "), "{body}");
        }
        conns.push(s);
    }
    stop.cancel();
    for mut s in conns {
        // Closed by the proxy well before the header timeout (60 s; the client sends nothing).
        let r = tokio::time::timeout(Duration::from_secs(20), raw_response(&mut s))
            .await
            .expect("an idle connection outlived the stop");
        assert_eq!(r, None);
    }
}
