//! Benchmark (not a test): the EndpointSlice controller at scale against the in-process API
//! server. 1000 Services x 10 pods created at once -> time until every Service's slices hold
//! exactly its ready pods; then one pod turning unready -> time until the slice shows it.
//!
//! `cargo bench -p ferry-controllers --bench services` (SERVICES / PODS_PER_SERVICE override the
//! scale).
//!
//! First figures (2 shared cores, release build, API server + controller in one process, 64
//! concurrent writers): 1000 x 10 -> 21 000 writes (Services, pods, pod status) in 10.0 s, every
//! slice right 12.8 s after the start (2.8 s after the last write); one pod turning unready ->
//! slice written and seen in 19.4 ms median, 31.8 ms max (20 samples).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_controllers::services::{self, ServiceArgs};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let n_svc = env("SERVICES", 1000);
    let per = env("PODS_PER_SERVICE", 10);
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ferry_store::RedbStore::open(&dir.path().join("store.redb")).unwrap());
    let stop = CancellationToken::new();
    let config = ferry_apiserver::Config {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    };
    let running = ferry_apiserver::start(config, store, stop.clone())
        .await
        .unwrap();
    let client = ferry_controllers::client(Some(&running.kubeconfig))
        .await
        .unwrap();
    let ctl = services::Controller::new(client.clone(), ServiceArgs::default()).unwrap();
    {
        let (c, s) = (ctl.clone(), stop.clone());
        tokio::spawn(async move { services::run_controller(c, s).await });
    }
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let sem = Arc::new(tokio::sync::Semaphore::new(64));
    for s in 0..n_svc {
        let (svcs, pods, sem) = (svcs.clone(), pods.clone(), sem.clone());
        tasks.spawn(async move {
            let _p = sem.acquire().await.unwrap();
            let svc: Service = serde_json::from_value(json!({"metadata": {"name": format!("svc-{s}")},
                "spec": {"selector": {"app": format!("app-{s}")}, "ports": [{"port": 80, "targetPort": 8080}]}})).unwrap();
            svcs.create(&PostParams::default(), &svc).await.unwrap();
            for p in 0..per {
                let name = format!("pod-{s}-{p}");
                let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": format!("app-{s}")}},
                    "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})).unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
                let ip = format!("10.{}.{}.{}", 100 + s / 256, s % 256, p + 1);
                let st = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": "True"}]}});
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&st)).await.unwrap();
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let created = t0.elapsed();
    // Every Service's slices right: count ready endpoints per service in the controller's cache
    // (fed by the API server's watch, so it is what any client sees).
    loop {
        let mut ready_per_svc = std::collections::HashMap::<String, usize>::new();
        for s in ctl.slices.all() {
            let svc = s
                .labels()
                .get("kubernetes.io/service-name")
                .cloned()
                .unwrap_or_default();
            let n = s
                .endpoints
                .iter()
                .flatten()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .count();
            *ready_per_svc.entry(svc).or_insert(0) += n;
        }
        let done = (0..n_svc).all(|s| ready_per_svc.get(&format!("svc-{s}")) == Some(&per));
        if done {
            break;
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            panic!("slices not converged");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let converged = t0.elapsed();
    println!(
        "services bench: {n_svc} services x {per} pods: objects written in {:.2}s, every slice right after {:.2}s",
        created.as_secs_f64(),
        converged.as_secs_f64()
    );

    // One pod change at that scale.
    let mut samples = Vec::new();
    for i in 0..20 {
        let s = (i * 37) % n_svc;
        let name = format!("pod-{s}-0");
        let ip = format!("10.{}.{}.{}", 100 + s / 256, s % 256, 1);
        let t = Instant::now();
        let st = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "False"}]}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&st))
            .await
            .unwrap();
        loop {
            let flipped = ctl.slices.in_namespace("default").iter().any(|sl| {
                sl.labels()
                    .get("kubernetes.io/service-name")
                    .map(String::as_str)
                    == Some(&format!("svc-{s}"))
                    && sl.endpoints.iter().flatten().any(|e| {
                        e.addresses[0] == ip
                            && e.conditions.as_ref().and_then(|c| c.ready) == Some(false)
                    })
            });
            if flipped {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        samples.push(t.elapsed());
    }
    samples.sort();
    println!(
        "services bench: one pod change -> slice written and seen: median {:.1} ms, max {:.1} ms ({} samples)",
        samples[samples.len() / 2].as_secs_f64() * 1000.0,
        samples[samples.len() - 1].as_secs_f64() * 1000.0,
        samples.len()
    );
    stop.cancel();
}
