//! Scale benchmark client (bench/scale): a plain kube-rs client that lists + watches Pods,
//! Services and EndpointSlices into reflector stores (full k8s-openapi types, pages of 500 as
//! kube-rs's watcher asks by default), and prints the time until all three stores are synced,
//! the object counts and this process's RSS.
//!
//! Usage: `scale_sync` (kubeconfig from $KUBECONFIG); `STREAMING=1` lists with one streaming
//! watch each (`sendInitialEvents`, kube-rs's `streaming_lists()`) instead of pages.

use std::time::Instant;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn spawn_reflector<K>(client: Client) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let api: Api<K> = Api::all(client);
    let mut cfg = watcher::Config::default().page_size(500);
    if std::env::var_os("STREAMING").is_some_and(|v| v == "1") {
        cfg = cfg.streaming_lists();
    }
    let stream = reflector::reflector(writer, watcher::watcher(api, cfg)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream.applied_objects());
        while stream.next().await.is_some() {}
    });
    reader
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let start = Instant::now();
    let client = Client::try_default().await.context("kube client")?;
    let pods = spawn_reflector::<Pod>(client.clone());
    let services = spawn_reflector::<Service>(client.clone());
    let slices = spawn_reflector::<EndpointSlice>(client);
    let (p, s, e) = (pods.clone(), services.clone(), slices.clone());
    let timed = |name: &'static str, fut: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>| async move {
        fut.await;
        println!("synced {name} after {:.2} s", start.elapsed().as_secs_f64());
    };
    tokio::join!(
        timed(
            "pods",
            Box::pin(async move {
                p.wait_until_ready().await.ok();
            })
        ),
        timed(
            "services",
            Box::pin(async move {
                s.wait_until_ready().await.ok();
            })
        ),
        timed(
            "endpointslices",
            Box::pin(async move {
                e.wait_until_ready().await.ok();
            })
        ),
    );
    let secs = start.elapsed().as_secs_f64();
    println!(
        "kube-rs list+watch of {} pods, {} services, {} endpointslices: {secs:.2} s, RSS {} MiB",
        pods.state().len(),
        services.state().len(),
        slices.state().len(),
        rss_kib() / 1024
    );
    Ok(())
}
