//! The Node authorizer's IO edge: keeps a [`NodeGraph`] current from the watch cache's pod and
//! PersistentVolumeClaim events and asks it about node agents' requests.
//!
//! The graph subscribes to the caches' event channels once (with an atomic snapshot) and, before
//! each decision, applies every event already sent: a pod the cache holds is in the graph when a
//! node asks, so an agent that saw its pod through a watch can read the pod's Secrets at once.
//! A subscription that fell behind (more events than the channel holds between two node
//! requests) is replaced by a fresh snapshot. Nothing polls.

use std::sync::Mutex;

use ferry_auth::Attributes;
use ferry_auth::node::{NodeDecision, NodeGraph, node_identity};
use serde_json::Value;
use tokio::sync::broadcast::{self, error::TryRecvError};

use crate::api::Api;
use crate::cache::CacheEvent;

type Rx = broadcast::Receiver<std::sync::Arc<CacheEvent>>;

struct Live {
    graph: NodeGraph,
    pods: Rx,
    pvcs: Option<Rx>,
}

/// The Node authorizer of one API server.
#[derive(Default)]
pub struct NodeAuthorizer {
    live: Mutex<Option<Live>>,
}

fn ns_name(v: &Value) -> (&str, &str) {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
    (s("/metadata/namespace"), s("/metadata/name"))
}

fn subscribe(api: &Api, plural: &str) -> Option<(Vec<Value>, Rx)> {
    let res = api.resource("", "v1", plural)?;
    let rc = api.cache.resource(&res.prefix)?;
    let (items, rx) = rc.snapshot_and_subscribe(&res.prefix);
    Some((items.iter().map(|o| o.value()).collect(), rx))
}

/// Applies the pending events of `rx` with `apply`; false when events were lost.
fn drain(rx: &mut Rx, mut apply: impl FnMut(&str, &str, Option<&Value>)) -> bool {
    loop {
        match rx.try_recv() {
            Ok(ev) => {
                let value = match ev.kind {
                    crate::cache::EventType::Deleted => None,
                    _ => Some(ev.object.value()),
                };
                apply(ev.object.namespace(), ev.object.name(), value.as_ref());
            }
            Err(TryRecvError::Empty) => return true,
            Err(TryRecvError::Lagged(_)) | Err(TryRecvError::Closed) => return false,
        }
    }
}

impl NodeAuthorizer {
    fn build(api: &Api) -> Option<Live> {
        let mut graph = NodeGraph::new();
        let (pods, pods_rx) = subscribe(api, "pods")?;
        for p in &pods {
            let (ns, name) = ns_name(p);
            graph.set_pod(ns, name, Some(p));
        }
        let pvcs = subscribe(api, "persistentvolumeclaims").map(|(items, rx)| {
            for c in &items {
                let (ns, name) = ns_name(c);
                graph.set_pvc(ns, name, Some(c));
            }
            rx
        });
        Some(Live {
            graph,
            pods: pods_rx,
            pvcs,
        })
    }

    /// The Node authorizer's answer for `a`; `None` when it has no say (not a node agent, or a
    /// resource it does not subdivide).
    pub fn authorize(&self, api: &Api, a: &Attributes) -> Option<NodeDecision> {
        node_identity(&a.user)?;
        let mut slot = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let current = match slot.as_mut() {
            Some(live) => {
                let Live { graph, pods, pvcs } = live;
                let pods_ok = drain(pods, |ns, n, v| graph.set_pod(ns, n, v));
                let pvcs_ok = pvcs
                    .as_mut()
                    .is_none_or(|rx| drain(rx, |ns, n, v| graph.set_pvc(ns, n, v)));
                pods_ok && pvcs_ok
            }
            None => false,
        };
        if !current {
            *slot = Self::build(api);
            if slot.is_none() {
                tracing::warn!("node authorizer: no pod cache; node requests fall to RBAC");
            }
        }
        let graph = &slot.as_ref()?.graph;
        let d = graph.authorize(a);
        if let Some(d) = &d
            && !d.allowed
        {
            tracing::debug!(
                user = %a.user.name, verb = %a.verb, resource = %a.resource,
                namespace = %a.namespace, name = %a.name, "NODE DENY: {}", d.reason
            );
        }
        d
    }
}
