//! kube-rs watches of Services, EndpointSlices and Nodes feeding the [`Tracker`], each synced
//! with one streaming list (paged lists when the server refuses it, see
//! [`ferry_kubeclient::watch`]). Only changes of the projections queue a sync (a Node heartbeat
//! does not). On errors the watcher backs off and retries while the proxy keeps serving its
//! last table.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::model::{project_node, project_service, project_slice};
use crate::sync::{Key, Kind, State, Tracker};

/// How one watched kind maps onto the tracker state.
pub trait Watched: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static {
    const KIND: Kind;
    fn key(&self) -> Key {
        (self.namespace().unwrap_or_default(), self.name_any())
    }
    /// Records the object; true when the projection changed.
    fn upsert(&self, st: &mut State) -> bool;
    fn remove(st: &mut State, key: &Key) -> bool;
    fn keys(st: &State) -> Vec<Key>;
}

/// Services are watched untyped so that `spec.topologyKeys` (not in the typed spec) is seen.
impl Watched for DynamicObject {
    const KIND: Kind = Kind::Service;
    fn upsert(&self, st: &mut State) -> bool {
        let raw = serde_json::to_value(self).ok();
        let info = raw.as_ref().and_then(|raw| {
            let typed: Service = serde_json::from_value(raw.clone()).ok()?;
            project_service(&typed, Some(raw))
        });
        st.put_service(self.key(), info)
    }
    fn remove(st: &mut State, key: &Key) -> bool {
        st.put_service(key.clone(), None)
    }
    fn keys(st: &State) -> Vec<Key> {
        st.services.keys().cloned().collect()
    }
}

impl Watched for EndpointSlice {
    const KIND: Kind = Kind::EndpointSlice;
    fn upsert(&self, st: &mut State) -> bool {
        st.put_slice(self.key(), project_slice(self))
    }
    fn remove(st: &mut State, key: &Key) -> bool {
        st.put_slice(key.clone(), None)
    }
    fn keys(st: &State) -> Vec<Key> {
        st.slices.keys().cloned().collect()
    }
}

impl Watched for Node {
    const KIND: Kind = Kind::Node;
    fn upsert(&self, st: &mut State) -> bool {
        let name = self.name_any();
        st.put_node(name, project_node(self))
    }
    fn remove(st: &mut State, key: &Key) -> bool {
        st.put_node(key.1.clone(), None)
    }
    fn keys(st: &State) -> Vec<Key> {
        st.nodes
            .keys()
            .map(|n| (String::new(), n.clone()))
            .collect()
    }
}

/// Applies one watch event; `relist` collects keys seen during a (re)list so that objects
/// deleted while disconnected go away at `InitDone`. Returns true at `InitDone`.
pub fn apply_event<K: Watched>(
    tracker: &Tracker,
    relist: &mut Option<HashSet<Key>>,
    ev: Event<K>,
) -> bool {
    match ev {
        Event::Init => {
            *relist = Some(HashSet::new());
            false
        }
        Event::InitApply(obj) => {
            if let Some(seen) = relist.as_mut() {
                seen.insert(obj.key());
            }
            tracker.update(|st| obj.upsert(st));
            false
        }
        Event::InitDone => {
            let seen = relist.take().unwrap_or_default();
            tracker.update(|st| {
                let stale: Vec<Key> = K::keys(st)
                    .into_iter()
                    .filter(|k| !seen.contains(k))
                    .collect();
                let mut changed = false;
                for k in stale {
                    changed |= K::remove(st, &k);
                }
                changed
            });
            true
        }
        Event::Apply(obj) => {
            tracker.update(|st| obj.upsert(st));
            false
        }
        Event::Delete(obj) => {
            let k = obj.key();
            tracker.update(|st| K::remove(st, &k));
            false
        }
    }
}

async fn watch_kind<K: Watched>(api: Api<K>, tracker: Arc<Tracker>)
where
    K::DynamicType: Default,
{
    run_stream(
        ferry_kubeclient::watch::stream(
            api,
            watcher::Config::default(),
            format!("proxy {:?}", K::KIND),
        )
        .default_backoff()
        .boxed(),
        tracker,
    )
    .await;
}

async fn run_stream<K: Watched>(
    mut stream: futures::stream::BoxStream<'static, Result<Event<K>, watcher::Error>>,
    tracker: Arc<Tracker>,
) {
    let mut relist = None;
    let mut synced = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                if apply_event(&tracker, &mut relist, ev) && !synced {
                    synced = true;
                    tracing::debug!(kind = ?K::KIND, "proxy watch synced");
                    tracker.mark_synced(K::KIND);
                }
            }
            Err(e) => {
                tracing::warn!(kind = ?K::KIND, error = %e, "watch failed; serving the last table");
            }
        }
    }
}

/// Starts the three watches.
pub fn spawn(client: Client, tracker: Arc<Tracker>) -> Vec<tokio::task::JoinHandle<()>> {
    let svc_ar = ApiResource::erase::<Service>(&());
    let services: Api<DynamicObject> = Api::all_with(client.clone(), &svc_ar);
    vec![
        tokio::spawn(run_stream(
            ferry_kubeclient::watch::stream(services, watcher::Config::default(), "proxy Service")
                .default_backoff()
                .boxed(),
            tracker.clone(),
        )),
        tokio::spawn(watch_kind::<EndpointSlice>(
            Api::all(client.clone()),
            tracker.clone(),
        )),
        tokio::spawn(watch_kind::<Node>(Api::all(client), tracker)),
    ]
}
