//! API server benchmark on the embedded store: create, get and list of 10k objects, and watch
//! fan-out to 1000 watchers. Run: `cargo bench -p ferry-apiserver --bench api`.
//! Plain HTTP/1.1 on loopback, so the figures are the server's, not TLS's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio_util::sync::CancellationToken;

type C = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn req(c: &C, token: &str, method: &str, url: &str, body: Option<String>) -> (u16, Bytes) {
    let r = http::Request::builder()
        .method(method)
        .uri(url)
        .header("Authorization", format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .expect("request");
    let resp = c.request(r).await.expect("response");
    let code = resp.status().as_u16();
    let b = resp.into_body().collect().await.expect("body").to_bytes();
    (code, b)
}

fn main() {
    let n: usize = std::env::var("BENCH_OBJECTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let watchers: usize = std::env::var("BENCH_WATCHERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ferry_store::Store> =
            Arc::new(ferry_store::RedbStore::open(&dir.path().join("store.redb")).expect("store"));
        let shutdown = CancellationToken::new();
        let cfg = ferry_apiserver::Config {
            data_dir: dir.path().to_path_buf(),
            listen: "127.0.0.1:0".parse().expect("addr"),
            plain_http: true,
            extra_sans: vec![],
            ..Default::default()
        };
        let running = ferry_apiserver::start(cfg, store, shutdown.clone()).await.expect("start");
        let token = std::fs::read_to_string(dir.path().join("pki/admin.token")).expect("token").trim().to_string();
        let base = running.url.clone();
        let c: C = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(128).build_http();
        let coll = format!("{base}/api/v1/namespaces/default/configmaps");

        // Create.
        let t = Instant::now();
        let conc = 64;
        let mut tasks = Vec::new();
        for w in 0..conc {
            let c = c.clone();
            let token = token.clone();
            let coll = coll.clone();
            tasks.push(tokio::spawn(async move {
                for i in (w..n).step_by(conc) {
                    let body = format!(
                        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"cm-{i}\",\"labels\":{{\"app\":\"bench\"}}}},\"data\":{{\"k\":\"{}\"}}}}",
                        "v".repeat(512)
                    );
                    let (code, _) = req(&c, &token, "POST", &coll, Some(body)).await;
                    assert_eq!(code, 201);
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        let create = t.elapsed();
        println!("create: {n} objects, {conc} concurrent: {:.0}/s ({:?})", n as f64 / create.as_secs_f64(), create);

        // Get.
        let t = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..conc {
            let c = c.clone();
            let token = token.clone();
            let coll = coll.clone();
            tasks.push(tokio::spawn(async move {
                for i in (w..n).step_by(conc) {
                    let (code, _) = req(&c, &token, "GET", &format!("{coll}/cm-{i}"), None).await;
                    assert_eq!(code, 200);
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        let get = t.elapsed();
        println!("get: {n} objects, {conc} concurrent: {:.0}/s", n as f64 / get.as_secs_f64());

        // List.
        let mut best = Duration::MAX;
        let mut size = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let (code, b) = req(&c, &token, "GET", &coll, None).await;
            assert_eq!(code, 200);
            size = b.len();
            best = best.min(t.elapsed());
        }
        println!("list: {n} objects ({} KiB): best of 5 {:?}", size / 1024, best);
        let t = Instant::now();
        let (_, b) = req(&c, &token, "GET", &format!("{coll}?labelSelector=app%3Dbench&limit=500"), None).await;
        println!("list page of 500 with selector: {:?} ({} KiB)", t.elapsed(), b.len() / 1024);

        // Paged list, as kube-rs and client-go page (500 per page): the first and the last page
        // cost the same (a seek to the continue key, not a walk of every object).
        let t = Instant::now();
        let mut cont = String::new();
        let mut pages = Vec::new();
        loop {
            let url = if cont.is_empty() {
                format!("{coll}?limit=500")
            } else {
                format!("{coll}?limit=500&continue={cont}")
            };
            let tp = Instant::now();
            let (code, b) = req(&c, &token, "GET", &url, None).await;
            assert_eq!(code, 200);
            pages.push(tp.elapsed());
            let v: serde_json::Value = serde_json::from_slice(&b).expect("json");
            match v["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => cont = c.to_string(),
                _ => break,
            }
        }
        let first = pages[0];
        let last = pages[pages.len().saturating_sub(2)];
        println!(
            "paged list of {n} (500 per page): {} pages in {:?}; first page {:?}, last full page {:?} (ratio {:.2})",
            pages.len(),
            t.elapsed(),
            first,
            last,
            last.as_secs_f64() / first.as_secs_f64()
        );

        // Watch-list: every object as ADDED, then the initial-events-end bookmark, in one request.
        let t = Instant::now();
        let r = http::Request::builder()
            .uri(format!(
                "{coll}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
            ))
            .header("Authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let mut body = c.request(r).await.expect("response").into_body();
        let mut added = 0usize;
        let mut tail = Vec::new();
        'read: while let Some(frame) = body.frame().await {
            let Ok(data) = frame.expect("frame").into_data() else { continue };
            tail.extend_from_slice(&data);
            while let Some(i) = tail.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = tail.drain(..=i).collect();
                if line.starts_with(b"{\"type\":\"ADDED\"") {
                    added += 1;
                } else if line.starts_with(b"{\"type\":\"BOOKMARK\"") {
                    break 'read;
                }
            }
        }
        assert!(added >= n, "{added}");
        println!("watch-list of {n}: initial events + end bookmark in {:?}", t.elapsed());

        // Watch fan-out.
        let (_, b) = req(&c, &token, "GET", &coll, None).await;
        let v: serde_json::Value = serde_json::from_slice(&b).expect("json");
        let rv = v["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
        let events = 100usize;
        let wc: C = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(watchers + 8).build_http();
        let mut ws = Vec::new();
        for _ in 0..watchers {
            let wc = wc.clone();
            let url = format!("{coll}?watch=1&resourceVersion={rv}");
            let token = token.clone();
            ws.push(tokio::spawn(async move {
                let r = http::Request::get(url)
                    .header("Authorization", format!("Bearer {token}"))
                    .body(Full::new(Bytes::new()))
                    .expect("req");
                let resp = wc.request(r).await.expect("watch");
                let mut body = resp.into_body();
                let mut seen = 0usize;
                while seen < events {
                    match body.frame().await {
                        Some(Ok(f)) => {
                            if let Some(d) = f.data_ref() {
                                seen += d.iter().filter(|b| **b == b'\n').count();
                            }
                        }
                        _ => break,
                    }
                }
                Instant::now()
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t = Instant::now();
        for i in 0..events {
            let body = format!("{{\"metadata\":{{\"name\":\"w-{i}\"}},\"data\":{{\"k\":\"v\"}}}}");
            let (code, _) = req(&c, &token, "POST", &coll, Some(body)).await;
            assert_eq!(code, 201);
        }
        let mut last = t;
        for w in ws {
            last = last.max(w.await.expect("watcher"));
        }
        let fan = last - t;
        println!(
            "watch fan-out: {watchers} watchers x {events} events delivered in {:?} ({:.0} events/s)",
            fan,
            (watchers * events) as f64 / fan.as_secs_f64()
        );
        shutdown.cancel();
    });
}
