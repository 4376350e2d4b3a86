//! Informers of every served resource (found through discovery), as untyped objects: the input
//! of the garbage collector and of the namespace controller.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope, verbs};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// One watched resource and its informer cache.
#[derive(Clone)]
pub struct Watched {
    pub ar: ApiResource,
    pub namespaced: bool,
    pub store: Store<DynamicObject>,
}

impl Watched {
    /// An API handle for an object of this resource in `ns` (ignored for cluster-scoped ones).
    pub fn api(&self, client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject> {
        match (self.namespaced, ns) {
            (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &self.ar),
            _ => Api::all_with(client.clone(), &self.ar),
        }
    }
}

/// Every watched resource, plus a signal raised on any change.
#[derive(Clone)]
pub struct Caches {
    pub resources: Arc<Vec<Watched>>,
    pub changed: Arc<Notify>,
}

impl Caches {
    /// The resource serving `apiVersion`/`kind`, if any.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&Watched> {
        self.resources
            .iter()
            .find(|w| w.ar.api_version == api_version && w.ar.kind == kind)
    }

    /// Whether every informer has listed once.
    pub async fn wait_ready(&self, stop: &CancellationToken) {
        for w in self.resources.iter() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = w.store.wait_until_ready() => {}
            }
        }
    }
}

/// Discovers the resources that can be listed, watched and deleted, and starts an informer on
/// each. Retries discovery until it succeeds or `stop` fires.
pub async fn start(client: kube::Client, stop: CancellationToken) -> Option<Caches> {
    let discovery = loop {
        match Discovery::new(client.clone()).run().await {
            Ok(d) => break d,
            Err(e) => {
                tracing::warn!("discovery failed: {e}");
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    let changed = Arc::new(Notify::new());
    let mut resources = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            if !wanted(&ar, &caps) {
                continue;
            }
            let writer = reflector::store::Writer::new(ar.clone());
            let reader = writer.as_reader();
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let notify = changed.clone();
            let stop = stop.clone();
            let plural = ar.plural.clone();
            tokio::spawn(async move {
                let stream = reflector::reflector(
                    writer,
                    watcher(api, watcher::Config::default()).default_backoff(),
                );
                futures::pin_mut!(stream);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        ev = stream.next() => match ev {
                            Some(Ok(_)) => notify.notify_one(),
                            Some(Err(e)) => tracing::debug!("watch {plural}: {e}"),
                            None => return,
                        }
                    }
                }
            });
            resources.push(Watched {
                namespaced: caps.scope == Scope::Namespaced,
                ar,
                store: reader,
            });
        }
    }
    Some(Caches {
        resources: Arc::new(resources),
        changed,
    })
}

fn wanted(ar: &ApiResource, caps: &ApiCapabilities) -> bool {
    // Upstream's collector ignores events; the namespace controller still deletes them.
    caps.supports_operation(verbs::LIST)
        && caps.supports_operation(verbs::WATCH)
        && caps.supports_operation(verbs::DELETE)
        && !ar.plural.contains('/')
}
