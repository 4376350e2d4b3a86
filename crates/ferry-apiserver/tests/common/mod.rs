//! An API server in this process on loopback (plain HTTP, embedded store in a temp dir) and a
//! small JSON client for it.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

type C = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

#[derive(Clone)]
pub struct Api {
    pub c: C,
    pub base: String,
    pub token: String,
}

impl Api {
    fn request(
        &self,
        method: &str,
        path: &str,
        ct: &str,
        body: Value,
    ) -> http::Request<Full<Bytes>> {
        let body = if body.is_null() {
            Bytes::new()
        } else {
            Bytes::from(body.to_string())
        };
        http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Content-Type", ct)
            .body(Full::new(body))
            .unwrap()
    }

    /// A call with an Accept header: (status, Content-Type, body).
    pub async fn call_accept(
        &self,
        method: &str,
        path: &str,
        accept: &str,
        body: Value,
    ) -> (u16, String, Value) {
        let mut req = self.request(method, path, "application/json", body);
        req.headers_mut()
            .insert("Accept", http::HeaderValue::from_str(accept).unwrap());
        let resp = self.c.request(req).await.unwrap();
        let code = resp.status().as_u16();
        let ct = resp
            .headers()
            .get("Content-Type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        (code, ct, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// A request with this body and content type as the admin.
    pub async fn send(&self, method: &str, path: &str, ct: &str, body: Vec<u8>) -> (u16, Value) {
        self.send_as(&self.token, method, path, ct, body).await
    }

    /// A request with `token` (none when empty).
    pub async fn send_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        ct: &str,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let mut r = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("Content-Type", ct);
        if !token.is_empty() {
            r = r.header("Authorization", format!("Bearer {token}"));
        }
        let resp = self
            .c
            .request(r.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap();
        let code = resp.status().as_u16();
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        (code, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// A JSON request with `token` (none when empty).
    pub async fn call_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let body = body
            .map(|b| serde_json::to_vec(&b).unwrap())
            .unwrap_or_default();
        self.send_as(token, method, path, "application/json", body)
            .await
    }

    pub async fn call(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let ct = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        let resp = self
            .c
            .request(self.request(method, path, ct, body))
            .await
            .unwrap();
        let code = resp.status().as_u16();
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        (code, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// Reads watch events until `done` says stop (or the 60 s safety net passes).
    pub async fn watch(&self, path: &str, done: impl FnMut(&[Value]) -> bool) -> (u16, Vec<Value>) {
        self.watch_accept(path, "application/json", done).await
    }

    /// [`Api::watch`] with an Accept header.
    pub async fn watch_accept(
        &self,
        path: &str,
        accept: &str,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> (u16, Vec<Value>) {
        let mut req = self.request("GET", path, "application/json", Value::Null);
        req.headers_mut()
            .insert("Accept", http::HeaderValue::from_str(accept).unwrap());
        let resp = self.c.request(req).await.unwrap();
        let code = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut buf = Vec::new();
        let mut events = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !done(&events) {
            let frame = tokio::time::timeout_at(deadline, body.frame()).await;
            let Ok(Some(Ok(frame))) = frame else { break };
            if let Ok(data) = frame.into_data() {
                buf.extend_from_slice(&data);
                while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    events.push(serde_json::from_slice(&line).unwrap());
                }
            }
        }
        (code, events)
    }
}

/// A running server; dropping it stops the server and removes its data.
pub struct Server {
    pub api: Api,
    /// The server itself (to change how it reaches pods, say).
    pub server: Arc<ferry_apiserver::Server>,
    pub shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Server {
    /// The server's data directory (its PKI, the admin token, the audit log).
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn start() -> Server {
    start_with(|_| {}).await
}

/// [`start`] with changes to the configuration (its `data_dir` is set).
pub async fn start_with(configure: impl FnOnce(&mut ferry_apiserver::Config)) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ferry_store::Store> =
        Arc::new(ferry_store::RedbStore::open(&dir.path().join("store.redb")).unwrap());
    let shutdown = CancellationToken::new();
    let mut cfg = ferry_apiserver::Config {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        plain_http: true,
        ..Default::default()
    };
    configure(&mut cfg);
    let running = ferry_apiserver::start(cfg, store, shutdown.clone())
        .await
        .unwrap();
    let token = std::fs::read_to_string(dir.path().join("pki/admin.token")).unwrap();
    let api = Api {
        c: Client::builder(TokioExecutor::new()).build_http(),
        base: format!("http://{}", running.addr),
        token: token.trim().to_string(),
    };

    Server {
        api,
        server: running.server.clone(),
        shutdown,
        _dir: dir,
    }
}
