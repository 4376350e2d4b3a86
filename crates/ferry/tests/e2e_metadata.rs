//! Metadata-only clients against a real `ferry apiserver` (TLS, embedded store): kube-rs'
//! `Api::get_metadata` / `list_metadata` (paged) and watchers of `Api<PartialObjectMeta<K>>`
//! (what `metadata_watcher` became; paged lists and streaming lists), which ask for
//! PartialObjectMetadata(List) as client-go's metadata informers (the garbage collector's) do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};

/// `ferry apiserver` on a temporary data dir; SIGKILLed on drop.
struct Server {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> (Server, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = std::fs::File::create(dir.path().join("api.log")).expect("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["apiserver", "--data-dir"])
        .arg(dir.path())
        .args(["--listen-api", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start ferry apiserver");
    let kc = dir.path().join("kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kc.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "ferry apiserver exited ({status}): {}",
                std::fs::read_to_string(dir.path().join("api.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "ferry apiserver not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50));
    (Server { child, _dir: dir }, kc)
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(cfg).expect("client")
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "meta"}},
        "data": {"payload": "x".repeat(500)},
    }))
    .expect("configmap")
}

/// Name -> (resourceVersion, labels) as a metadata watcher's events leave them.
type Seen = Arc<Mutex<BTreeMap<String, (String, BTreeMap<String, String>)>>>;

async fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn follow(
    api: Api<PartialObjectMeta<ConfigMap>>,
    cfg: watcher::Config,
    seen: Seen,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = watch_stream(api, cfg).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            let ev = ev.expect("metadata watch event");
            let mut seen = seen.lock().expect("lock");
            match ev {
                Event::Apply(m) | Event::InitApply(m) => {
                    // Metadata only: the ConfigMap's data never reaches the client.
                    assert_eq!(
                        m.types.as_ref().map(|t| t.kind.as_str()),
                        Some("PartialObjectMetadata")
                    );
                    seen.insert(
                        m.metadata.name.clone().unwrap_or_default(),
                        (
                            m.metadata.resource_version.clone().unwrap_or_default(),
                            m.metadata.labels.clone().unwrap_or_default(),
                        ),
                    );
                }
                Event::Delete(m) => {
                    seen.remove(m.metadata.name.as_deref().unwrap_or_default());
                }
                Event::Init | Event::InitDone => {}
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_metadata_clients() {
    let (server, kc) = start();
    let api: Api<ConfigMap> = Api::namespaced(client(&kc).await, "default");
    for i in 0..12 {
        api.create(&PostParams::default(), &cm(&format!("meta-{i:02}")))
            .await
            .expect("create");
    }

    // get_metadata / list_metadata (pages of 5).
    let one = api.get_metadata("meta-03").await.expect("get_metadata");
    assert_eq!(
        one.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    assert_eq!(one.metadata.name.as_deref(), Some("meta-03"));
    let full = api.get("meta-03").await.expect("get");
    assert_eq!(one.metadata, full.metadata);
    let lp = ListParams::default().labels("app=meta").limit(5);
    let first = api.list_metadata(&lp).await.expect("list_metadata");
    assert_eq!(first.items.len(), 5);
    let mut names: Vec<String> = first
        .items
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    let mut cont = first.metadata.continue_.clone();
    while let Some(c) = cont.filter(|c| !c.is_empty()) {
        let page = api
            .list_metadata(&lp.clone().continue_token(&c))
            .await
            .expect("next page");
        names.extend(page.items.iter().filter_map(|m| m.metadata.name.clone()));
        cont = page.metadata.continue_.clone();
    }
    let want: Vec<String> = (0..12).map(|i| format!("meta-{i:02}")).collect();
    assert_eq!(names, want);

    // Watchers of metadata with paged lists and with a streaming list (sendInitialEvents).
    let meta: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client(&kc).await, "default");
    let paged: Seen = Arc::default();
    let streaming: Seen = Arc::default();
    let w1 = follow(
        meta.clone(),
        watcher::Config::default().page_size(5),
        paged.clone(),
    );
    let w2 = follow(
        meta.clone(),
        watcher::Config::default().streaming_lists(),
        streaming.clone(),
    );
    for seen in [&paged, &streaming] {
        until(60, "the initial objects", || {
            seen.lock()
                .expect("lock")
                .keys()
                .filter(|n| n.starts_with("meta-"))
                .count()
                == 12
        })
        .await;
    }
    // Changes: a label, a delete, a create.
    let patched = api
        .patch(
            "meta-05",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"tier": "gold"}}})),
        )
        .await
        .expect("patch");
    api.delete("meta-07", &DeleteParams::default())
        .await
        .expect("delete");
    api.create(&PostParams::default(), &cm("meta-late"))
        .await
        .expect("create");
    let rv = patched
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    for seen in [&paged, &streaming] {
        until(60, "the changes", || {
            let s = seen.lock().expect("lock");
            s.get("meta-05")
                .is_some_and(|(r, l)| *r == rv && l.get("tier").map(String::as_str) == Some("gold"))
                && !s.contains_key("meta-07")
                && s.contains_key("meta-late")
        })
        .await;
    }
    w1.abort();
    w2.abort();
    drop(server);
}
