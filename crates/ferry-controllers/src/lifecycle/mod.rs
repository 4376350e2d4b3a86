//! Cluster lifecycle controllers (issue 5): the garbage collector and namespace controller
//! ([`gc`]), the ReplicaSet and Deployment controllers, a minimal scheduler and node IPAM.

pub(crate) mod events;
pub mod gc;
pub mod gc_core;
pub mod graph;
pub mod ipam;
pub mod ipam_core;
pub mod ns_core;
pub mod podgc;
pub mod scheduler;
pub mod scheduler_core;
pub mod workload_core;
pub mod workloads;

use crate::error::Result;
use kube::runtime::WatchStreamExt;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug, Clone)]
pub struct LifecycleArgs {
    /// Node IPAM, classic mode: the pod network, one CIDR or two of different families
    /// (comma-separated). Without it, nodes get pod CIDRs only from ClusterCIDRConfigs.
    #[arg(long = "cluster-cidr", value_delimiter = ',')]
    pub cluster_cidr: Vec<ipnet::IpNet>,
    /// Prefix length of each node's IPv4 block in the classic mode.
    #[arg(long = "node-cidr-mask-size-ipv4", default_value_t = 24)]
    pub node_cidr_mask_size_ipv4: u8,
    /// Prefix length of each node's IPv6 block in the classic mode.
    #[arg(long = "node-cidr-mask-size-ipv6", default_value_t = 64)]
    pub node_cidr_mask_size_ipv6: u8,
    /// Ranges never given to nodes (the service cluster IP range), comma-separated.
    #[arg(
        long = "node-ipam-excluded-cidrs",
        value_delimiter = ',',
        default_value = "10.96.0.0/12"
    )]
    pub node_ipam_excluded_cidrs: Vec<ipnet::IpNet>,
    /// Run node IPAM (pod CIDRs for nodes).
    #[arg(long = "allocate-node-cidrs", default_value_t = true, action = clap::ArgAction::Set)]
    pub allocate_node_cidrs: bool,
    /// Run the minimal scheduler.
    #[arg(long = "run-scheduler", default_value_t = true, action = clap::ArgAction::Set)]
    pub run_scheduler: bool,
    /// Pod GC: terminated pods kept before the oldest are deleted (0: no limit).
    #[arg(long = "terminated-pod-gc-threshold", default_value_t = 12500)]
    pub terminated_pod_gc_threshold: usize,
    /// Pod GC: seconds a node must be missing before the pods bound to it are deleted
    /// (upstream's fixed quarantine is 40).
    #[arg(long = "pod-gc-orphan-quarantine-seconds", default_value_t = 40)]
    pub pod_gc_orphan_quarantine_seconds: u64,
}

pub async fn run(client: kube::Client, args: LifecycleArgs, stop: CancellationToken) -> Result<()> {
    let informers = crate::runtime::Informers::new(client.clone(), stop.clone());
    run_with(client, args, informers, stop).await
}

/// [`run`] with the process's shared informers (one Pod watch for every controller).
pub async fn run_with(
    client: kube::Client,
    args: LifecycleArgs,
    informers: crate::runtime::Informers,
    stop: CancellationToken,
) -> Result<()> {
    let gc_task = {
        let client = client.clone();
        let stop = stop.clone();
        let informers = informers.clone();
        tokio::spawn(async move {
            // Upstream's collector resyncs its monitors when discovery changes: custom resources
            // come and go with their CRDs. Each generation runs until the set of resources
            // changes, then the informers and collectors start again on the new set.
            loop {
                let generation = stop.child_token();
                // Taken before the informers' own discovery: a resource appearing in between
                // causes one extra restart, never a missed one.
                let known = resource_set(&client).await.unwrap_or_default();
                let Some(caches) =
                    graph::start(client.clone(), Some(informers.clone()), generation.clone()).await
                else {
                    return;
                };
                let watch = tokio::spawn(cancel_on_discovery_change(
                    client.clone(),
                    known,
                    generation.clone(),
                ));
                gc::run(client.clone(), caches, generation.clone()).await;
                generation.cancel();
                watch.abort();
                if stop.is_cancelled() {
                    return;
                }
            }
        })
    };
    let mut tasks = vec![tokio::spawn(workloads::run(
        client.clone(),
        informers.clone(),
        stop.clone(),
    ))];
    if args.run_scheduler {
        tasks.push(tokio::spawn(scheduler::run(
            client.clone(),
            informers.clone(),
            stop.clone(),
        )));
    }
    tasks.push(tokio::spawn(podgc::run(
        client.clone(),
        informers.clone(),
        podgc::PodGcConfig {
            quarantine: std::time::Duration::from_secs(args.pod_gc_orphan_quarantine_seconds),
            terminated_threshold: args.terminated_pod_gc_threshold,
        },
        stop.clone(),
    )));
    if args.allocate_node_cidrs {
        let cfg = ipam::IpamConfig {
            cluster_cidrs: args.cluster_cidr.clone(),
            mask_v4: args.node_cidr_mask_size_ipv4,
            mask_v6: args.node_cidr_mask_size_ipv6,
            excluded: args.node_ipam_excluded_cidrs.clone(),
        };
        cfg.classic()?;
        tasks.push(tokio::spawn(ipam::run(client.clone(), cfg, stop.clone())));
    }
    stop.cancelled().await;
    let _ = gc_task.await;
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

/// How often the garbage collector looks for resources that appeared or went away.
const DISCOVERY_RESYNC: std::time::Duration = std::time::Duration::from_secs(5);

/// The resources the collectors watch (`group/version/plural`): listable, watchable, deletable.
async fn resource_set(client: &kube::Client) -> Result<std::collections::BTreeSet<String>> {
    use kube::discovery::{Discovery, verbs};
    let d = Discovery::new(client.clone()).run().await?;
    let mut out = std::collections::BTreeSet::new();
    for g in d.groups() {
        for (ar, caps) in g.recommended_resources() {
            if caps.supports_operation(verbs::LIST)
                && caps.supports_operation(verbs::WATCH)
                && caps.supports_operation(verbs::DELETE)
                && !ar.plural.contains('/')
            {
                out.insert(format!("{}/{}", ar.api_version, ar.plural));
            }
        }
    }
    Ok(out)
}

/// Cancels `generation` once discovery shows another set of resources than `known`.
async fn cancel_on_discovery_change(
    client: kube::Client,
    known: std::collections::BTreeSet<String>,
    generation: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = generation.cancelled() => return,
            _ = tokio::time::sleep(DISCOVERY_RESYNC) => {}
        }
        if let Ok(now) = resource_set(&client).await
            && now != known
        {
            tracing::info!(
                "served resources changed; restarting the garbage collector's informers"
            );
            generation.cancel();
            return;
        }
    }
}

/// A reflector store of every `K`, kept current by a watch until `stop`; `notify` fires on
/// every change (the controllers' coalescing wake-up).
pub(crate) fn informer<K>(
    client: &kube::Client,
    notify: std::sync::Arc<tokio::sync::Notify>,
    stop: CancellationToken,
) -> kube::runtime::reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = kube::runtime::reflector::store();
    let api: kube::Api<K> = kube::Api::all(client.clone());
    tokio::spawn(async move {
        let stream = kube::runtime::reflector::reflector(
            writer,
            crate::runtime::reflect::watch_stream(api, kube::runtime::watcher::Config::default())
                .modify(crate::runtime::reflect::slim_meta::<K>)
                .default_backoff(),
        );
        futures::pin_mut!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                ev = futures::StreamExt::next(&mut stream) => match ev {
                    Some(Ok(_)) => notify.notify_one(),
                    Some(Err(e)) => tracing::warn!(
                        kind = %K::kind(&()),
                        "watch failed, retrying with backoff: {e}"
                    ),
                    None => return,
                }
            }
        }
    });
    reader
}
