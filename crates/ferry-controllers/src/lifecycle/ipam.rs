//! Node IPAM: gives each Node `spec.podCIDR`/`spec.podCIDRs` once, from the best matching
//! `ClusterCIDRConfig` (see [`super::ipam_core`]) or the classic `--cluster-cidr` pool. A block
//! is free again as soon as its node is gone (allocations are read back from the nodes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_api::custom::cluster_cidr_config::ClusterCIDRConfig;
use ferry_api::selectors::{LabelSelector, from_optional_label_selector};
use futures::FutureExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::ipam_core::{self as core, Family, Pool};

/// The classic pool and the ranges blocks must avoid.
#[derive(Debug, Clone, Default)]
pub struct IpamConfig {
    /// `--cluster-cidr`: at most one CIDR per family.
    pub cluster_cidrs: Vec<IpNet>,
    pub mask_v4: u8,
    pub mask_v6: u8,
    /// Never handed out (the service range).
    pub excluded: Vec<IpNet>,
}

/// A `--cluster-cidr` configuration node IPAM cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamConfigError {
    #[error("--cluster-cidr takes at most one CIDR per family")]
    TwoPerFamily,
    #[error("node CIDR mask /{mask} does not fit in --cluster-cidr {cidr}")]
    MaskDoesNotFit { mask: u8, cidr: IpNet },
}

impl IpamConfig {
    /// The classic pool, if `--cluster-cidr` is set.
    pub fn classic(&self) -> Result<Option<Pool>, IpamConfigError> {
        if self.cluster_cidrs.is_empty() {
            return Ok(None);
        }
        let mut ipv4 = None;
        let mut ipv6 = None;
        for c in &self.cluster_cidrs {
            let (slot, mask) = match c {
                IpNet::V4(_) => (&mut ipv4, self.mask_v4),
                IpNet::V6(_) => (&mut ipv6, self.mask_v6),
            };
            if slot.is_some() {
                return Err(IpamConfigError::TwoPerFamily);
            }
            *slot = Some(
                Family::new(*c, mask).ok_or(IpamConfigError::MaskDoesNotFit { mask, cidr: *c })?,
            );
        }
        Ok(Some(Pool {
            name: "--cluster-cidr".into(),
            ipv4,
            ipv6,
            selector: LabelSelector::everything(),
            label_key: String::new(),
            match_count: 0,
        }))
    }
}

/// A `ClusterCIDRConfig` as a pool; `None` when it is unusable (validation keeps those out).
pub fn pool_of(c: &ClusterCIDRConfig) -> Option<Pool> {
    let fam = |b: &Option<ferry_api::custom::cluster_cidr_config::CidrBlock>| -> Result<Option<Family>, ()> {
        match b {
            None => Ok(None),
            Some(b) => {
                let net: IpNet = b.cidr.parse().map_err(|_| ())?;
                let mask = u8::try_from(b.per_node_mask_size).map_err(|_| ())?;
                Family::new(net, mask).map(Some).ok_or(())
            }
        }
    };
    let ipv4 = fam(&c.spec.ipv4).ok()?;
    let ipv6 = fam(&c.spec.ipv6).ok()?;
    if ipv4.is_none() && ipv6.is_none() {
        return None;
    }
    let sel = c.spec.node_selector.as_ref();
    // No nodeSelector: a per-cluster config that applies to every node (seed 001).
    let selector = match sel {
        None => LabelSelector::everything(),
        Some(_) => from_optional_label_selector(sel).ok()?,
    };
    let mut labels: Vec<String> = sel
        .and_then(|s| s.match_labels.as_ref())
        .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
        .unwrap_or_default();
    labels.extend(
        sel.and_then(|s| s.match_expressions.as_ref())
            .map(|e| {
                e.iter()
                    .map(|r| {
                        format!(
                            "{} {} {}",
                            r.key,
                            r.operator,
                            r.values.clone().unwrap_or_default().join(",")
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default(),
    );
    labels.sort();
    Some(Pool {
        name: c.name_any(),
        ipv4,
        ipv6,
        match_count: selector.requirements().len(),
        selector,
        label_key: labels.join(","),
    })
}

fn node_cidrs(n: &Node) -> Vec<IpNet> {
    let spec = n.spec.clone().unwrap_or_default();
    let mut v: Vec<IpNet> = spec
        .pod_cidrs
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect();
    if v.is_empty()
        && let Some(c) = spec.pod_cidr.and_then(|c| c.parse().ok())
    {
        v.push(c);
    }
    v
}

pub async fn run(client: kube::Client, cfg: IpamConfig, stop: CancellationToken) {
    let classic = match cfg.classic() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("node IPAM disabled: {e}");
            None
        }
    };
    let notify = Arc::new(Notify::new());
    let nodes: Store<Node> = super::informer(&client, notify.clone(), stop.clone());
    let configs: Store<ClusterCIDRConfig> = super::informer(&client, notify.clone(), stop.clone());
    for s in [
        nodes.wait_until_ready().boxed(),
        configs.wait_until_ready().boxed(),
    ] {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = s => {}
        }
    }
    let api: Api<Node> = Api::all(client.clone());
    // Written but not yet seen in the cache: node name -> blocks.
    let mut pending: HashMap<String, (Vec<IpNet>, Instant)> = HashMap::new();
    // Nodes already told (by an Event) that no pod CIDR is available, until they get one.
    let mut reported: HashSet<String> = HashSet::new();
    loop {
        let all: BTreeMap<String, Arc<Node>> = nodes
            .state()
            .into_iter()
            .map(|n| (n.name_any(), n))
            .collect();
        pending.retain(|name, (_, t)| {
            t.elapsed() < Duration::from_secs(10)
                && all.get(name).is_some_and(|n| node_cidrs(n).is_empty())
        });
        let config_objs = configs.state();
        // A config being deleted hands out nothing new (it waits for its nodes to go).
        let pools: Vec<Pool> = config_objs
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| pool_of(c))
            .collect();
        let mut taken: Vec<IpNet> = cfg.excluded.clone();
        for n in all.values() {
            taken.extend(node_cidrs(n));
        }
        let node_blocks = taken[cfg.excluded.len()..].to_vec();
        sync_finalizers(&client, &config_objs, &node_blocks).await;
        reported.retain(|name| all.get(name).is_some_and(|n| node_cidrs(n).is_empty()));
        for (blocks, _) in pending.values() {
            taken.extend(blocks.iter().copied());
        }
        for (name, n) in &all {
            if !node_cidrs(n).is_empty()
                || pending.contains_key(name)
                || n.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let mut cands = core::candidates(&pools, n.labels());
            if let Some(c) = &classic {
                cands.push(c);
            }
            let Some((pool, blocks)) = core::allocate(&cands, &taken) else {
                if reported.insert(name.clone()) {
                    tracing::warn!("node {name}: no pod CIDR available");
                    cidr_not_available(&client, n);
                }
                continue;
            };
            let strs: Vec<String> = blocks.iter().map(|b| b.to_string()).collect();
            let patch = json!({"metadata": {"resourceVersion": n.resource_version()},
                "spec": {"podCIDR": strs[0], "podCIDRs": strs}});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!("node {name}: pod CIDRs {strs:?} from {pool}");
                    taken.extend(blocks.iter().copied());
                    pending.insert(name.clone(), (blocks, Instant::now()));
                }
                Err(e) => tracing::debug!("node {name}: set pod CIDRs: {e}"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = notify.notified() => tokio::time::sleep(Duration::from_millis(20)).await,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

/// Upstream's node status Event when node IPAM has no block for a node
/// (`Node <name> status is now: CIDRNotAvailable`, reported by `cidrAllocator`).
fn cidr_not_available(client: &kube::Client, n: &Node) {
    let name = n.name_any();
    let about = ObjectReference {
        kind: Some("Node".into()),
        name: Some(name.clone()),
        // As upstream's node status events: the node's name stands in for its uid.
        uid: Some(name.clone()),
        ..Default::default()
    };
    super::events::record(
        client,
        about,
        "Normal",
        "CIDRNotAvailable",
        format!("Node {name} status is now: CIDRNotAvailable"),
        "cidrAllocator",
    );
}

/// Keeps [`core::CONFIG_FINALIZER`] on live configs and takes it off deleted ones that no node
/// uses any more. Conflicts are left to the next pass.
async fn sync_finalizers(
    client: &kube::Client,
    configs: &[Arc<ClusterCIDRConfig>],
    node_blocks: &[IpNet],
) {
    let states: Vec<core::ConfigState> = configs
        .iter()
        .map(|c| core::ConfigState {
            name: c.name_any(),
            has_finalizer: c.finalizers().iter().any(|f| f == core::CONFIG_FINALIZER),
            deleting: c.metadata.deletion_timestamp.is_some(),
            cidrs: [&c.spec.ipv4, &c.spec.ipv6]
                .into_iter()
                .flatten()
                .filter_map(|b| b.cidr.parse().ok())
                .collect(),
        })
        .collect();
    let api: Api<ClusterCIDRConfig> = Api::all(client.clone());
    for action in core::finalizer_actions(&states, node_blocks) {
        let (name, add) = match &action {
            core::FinalizerAction::Add(n) => (n, true),
            core::FinalizerAction::Remove(n) => (n, false),
        };
        let Some(c) = configs.iter().find(|c| c.name_any() == *name) else {
            continue;
        };
        let mut fins: Vec<String> = c
            .finalizers()
            .iter()
            .filter(|f| *f != core::CONFIG_FINALIZER)
            .cloned()
            .collect();
        if add {
            fins.push(core::CONFIG_FINALIZER.to_string());
        }
        let patch =
            json!({"metadata": {"resourceVersion": c.resource_version(), "finalizers": fins}});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => tracing::info!("ClusterCIDRConfig {name}: {action:?}"),
            Err(e) => tracing::debug!("ClusterCIDRConfig {name}: finalizer: {e}"),
        }
    }
}
