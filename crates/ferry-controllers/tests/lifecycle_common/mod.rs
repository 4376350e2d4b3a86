//! Shared harness for the lifecycle integration tests: an in-process API server on redb plus
//! the lifecycle controllers, as kube-rs clients.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ferry_controllers::lifecycle::{self, LifecycleArgs};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub struct Cluster {
    pub client: kube::Client,
    pub stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn start_with(args: LifecycleArgs) -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let store =
        Arc::new(ferry_store::RedbStore::open(&dir.path().join("store.redb")).expect("store"));
    let stop = CancellationToken::new();
    let config = ferry_apiserver::Config {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        plain_http: false,
        extra_sans: vec![],
        ..Default::default()
    };
    let running = ferry_apiserver::start(config, store, stop.clone())
        .await
        .expect("api server");
    let client = ferry_controllers::client(Some(&running.kubeconfig))
        .await
        .expect("client");
    let c = client.clone();
    let s = stop.clone();
    tokio::spawn(async move { lifecycle::run(c, args, s).await });
    Cluster {
        client,
        stop,
        _dir: dir,
    }
}

pub async fn start() -> Cluster {
    start_with(default_args()).await
}

pub fn default_args() -> LifecycleArgs {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct A {
        #[command(flatten)]
        l: LifecycleArgs,
    }
    A::parse_from(["x"]).l
}

pub fn args_from(flags: &[&str]) -> LifecycleArgs {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct A {
        #[command(flatten)]
        l: LifecycleArgs,
    }
    let mut v = vec!["x"];
    v.extend_from_slice(flags);
    A::parse_from(v).l
}

/// Polls `f` every 50 ms until it returns Some, for at most `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates an object from JSON through the dynamic API.
pub async fn create(client: &kube::Client, v: Value) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(v).expect("object");
    let tm = obj.types.clone().expect("types");
    let (group, version) = match tm.api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), tm.api_version.clone()),
    };
    let gvk = kube::api::GroupVersionKind::gvk(&group, &version, &tm.kind);
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .expect("discovery");
    let api: Api<DynamicObject> = match (&caps.scope, obj.metadata.namespace.as_deref()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => {
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        (kube::discovery::Scope::Namespaced, None) => {
            Api::namespaced_with(client.clone(), "default", &ar)
        }
        _ => Api::all_with(client.clone(), &ar),
    };
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create")
}
