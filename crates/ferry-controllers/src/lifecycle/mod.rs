//! Cluster lifecycle controllers (issue 5): the garbage collector and namespace controller
//! ([`gc`]), the ReplicaSet and Deployment controllers, a minimal scheduler and node IPAM.

pub mod gc;
pub mod gc_core;
pub mod graph;
pub mod workload_core;
pub mod workloads;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug, Clone)]
pub struct LifecycleArgs {}

pub async fn run(
    client: kube::Client,
    _args: LifecycleArgs,
    stop: CancellationToken,
) -> Result<()> {
    let gc_task = {
        let client = client.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            if let Some(caches) = graph::start(client.clone(), stop.clone()).await {
                gc::run(client, caches, stop).await;
            }
        })
    };
    let workloads_task = tokio::spawn(workloads::run(client.clone(), stop.clone()));
    stop.cancelled().await;
    let _ = gc_task.await;
    let _ = workloads_task.await;
    Ok(())
}
