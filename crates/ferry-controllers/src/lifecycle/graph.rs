//! Informers of every served resource (found through discovery), as untyped objects, and the
//! owner/dependent graph built from their changes (upstream's `GraphBuilder`): the input of the
//! garbage collector and of the namespace controller. A change enqueues only the uids and
//! namespaces it affects.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::api::{Api, DynamicObject};

use crate::runtime::MetaObject;
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope, verbs};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use crate::runtime::{self, Change, ObjectKey, WorkQueue};

/// Where a watched resource's objects are cached.
#[derive(Clone)]
pub enum Source {
    /// The collector's own informer of the resource.
    Own(Store<MetaObject>),
    /// Pods: the process's shared Pod informer (no second watch, no second copy of 150k pods).
    SharedPods(crate::runtime::Informers),
}

/// One watched resource and its informer cache.
#[derive(Clone)]
pub struct Watched {
    pub ar: ApiResource,
    pub namespaced: bool,
    pub source: Source,
}

impl Watched {
    /// An API handle for an object of this resource in `ns` (ignored for cluster-scoped ones).
    pub fn api(&self, client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject> {
        match (self.namespaced, ns) {
            (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &self.ar),
            _ => Api::all_with(client.clone(), &self.ar),
        }
    }

    /// The cached object under `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<MetaObject>> {
        match &self.source {
            Source::Own(store) => {
                let r = ObjectRef::new_with(&key.name, self.ar.clone());
                store.get(&if key.namespace.is_empty() {
                    r
                } else {
                    r.within(&key.namespace)
                })
            }
            Source::SharedPods(inf) => {
                let p = key.get(&inf.pods().store())?;
                Some(Arc::new(MetaObject::from(p.as_ref())))
            }
        }
    }

    pub fn is_namespace(&self) -> bool {
        self.ar.group.is_empty() && self.ar.kind == "Namespace"
    }
}

/// A node of the graph: where the object is cached, and what it points at.
#[derive(Debug, Clone)]
pub struct Node {
    pub res: usize,
    pub key: ObjectKey,
    pub owners: Vec<String>,
    pub deleting: bool,
}

/// The owner/dependent graph by uid, and the members of each namespace.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: HashMap<String, Node>,
    dependents: HashMap<String, BTreeSet<String>>,
    members: HashMap<String, BTreeSet<String>>,
}

/// What a change asks the collectors to look at.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Affected {
    pub uids: BTreeSet<String>,
    pub namespaces: BTreeSet<String>,
}

fn uid_of(o: &MetaObject) -> Option<&str> {
    o.metadata.uid.as_deref().filter(|u| !u.is_empty())
}

fn owner_uids(o: &MetaObject) -> Vec<String> {
    o.metadata
        .owner_references
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .map(|r| r.uid.clone())
        .collect()
}

fn has_owner_finalizer(o: &MetaObject) -> bool {
    o.metadata
        .finalizers
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .any(|f| f == "orphan" || f == "foregroundDeletion")
}

impl Graph {
    pub fn node(&self, uid: &str) -> Option<&Node> {
        self.nodes.get(uid)
    }

    pub fn dependents(&self, uid: &str) -> Vec<String> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Uids of the objects cached in namespace `ns`.
    pub fn members(&self, ns: &str) -> Vec<String> {
        self.members
            .get(ns)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn remove(&mut self, uid: &str) {
        let Some(n) = self.nodes.remove(uid) else {
            return;
        };
        for o in &n.owners {
            if let Some(s) = self.dependents.get_mut(o) {
                s.remove(uid);
                if s.is_empty() {
                    self.dependents.remove(o);
                }
            }
        }
        if let Some(s) = self.members.get_mut(&n.key.namespace) {
            s.remove(uid);
            if s.is_empty() {
                self.members.remove(&n.key.namespace);
            }
        }
    }

    /// Applies a change of resource `res` (`is_namespace`: the Namespace resource) and returns
    /// what it affects.
    pub fn update(
        &mut self,
        res: usize,
        is_namespace: bool,
        ch: &Change<'_, MetaObject>,
    ) -> Affected {
        let mut out = Affected::default();
        let mut owners_before: Vec<String> = Vec::new();
        if let Some(old) = ch.old.and_then(uid_of) {
            owners_before = self
                .nodes
                .get(old)
                .map(|n| n.owners.clone())
                .unwrap_or_default();
            self.remove(old);
        }
        let was_deleting = ch
            .old
            .is_some_and(|o| o.metadata.deletion_timestamp.is_some());
        let subject = ch.new.or(ch.old);
        let Some(uid) = subject.and_then(uid_of).map(str::to_string) else {
            return out;
        };
        let key = subject
            .map(ObjectKey::of)
            .unwrap_or_else(|| ObjectKey::new("", ""));
        let mut owners_now: Vec<String> = Vec::new();
        if let Some(new) = ch.new {
            let deleting = new.metadata.deletion_timestamp.is_some();
            owners_now = owner_uids(new);
            for o in &owners_now {
                self.dependents
                    .entry(o.clone())
                    .or_default()
                    .insert(uid.clone());
            }
            if !key.namespace.is_empty() {
                self.members
                    .entry(key.namespace.clone())
                    .or_default()
                    .insert(uid.clone());
            }
            self.nodes.insert(
                uid.clone(),
                Node {
                    res,
                    key: key.clone(),
                    owners: owners_now.clone(),
                    deleting,
                },
            );
            // The object itself: when its references are new or point at an owner the graph
            // does not hold (upstream's attemptToDelete of dependents with absent owners), or
            // when it is an owner with finalizer work. A status update of a dependent whose
            // owners are all present costs nothing.
            let refs_new = ch.old.is_none() || owners_before != owners_now;
            let owner_absent = owners_now.iter().any(|o| !self.nodes.contains_key(o));
            if (!owners_now.is_empty() && (refs_new || owner_absent))
                || (deleting && has_owner_finalizer(new))
            {
                out.uids.insert(uid.clone());
            }
            if deleting && is_namespace {
                out.namespaces.insert(key.name.clone());
            }
        }
        let gone_or_deleting = ch.new.is_none()
            || (!was_deleting
                && ch
                    .new
                    .is_some_and(|n| n.metadata.deletion_timestamp.is_some()));
        if gone_or_deleting {
            // Its dependents may now be dangling or waiting on a foreground deletion.
            out.uids.extend(self.dependents(&uid));
            if !key.namespace.is_empty() {
                out.namespaces.insert(key.namespace.clone());
            }
        }
        // Owners being deleted wait on their dependents (foreground, orphan).
        for o in owners_before.iter().chain(owners_now.iter()) {
            if self.nodes.get(o).is_some_and(|n| n.deleting) {
                out.uids.insert(o.clone());
            }
        }
        out
    }
}

/// Every watched resource, the graph, and the queues the changes feed.
#[derive(Clone)]
pub struct Caches {
    pub resources: Arc<Vec<Watched>>,
    pub graph: Arc<Mutex<Graph>>,
    /// Uids for the garbage collector.
    pub gc_queue: Arc<WorkQueue<String>>,
    /// Namespace names for the namespace controller.
    pub ns_queue: Arc<WorkQueue<String>>,
    /// Namespaced resources the collectors do not watch (Events, see [`collector_ignores`]):
    /// the namespace controller deletes them by collection.
    pub unwatched: Arc<Vec<ApiResource>>,
}

impl Caches {
    /// The resource serving `apiVersion`/`kind`, if any.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&Watched> {
        self.resources
            .iter()
            .find(|w| w.ar.api_version == api_version && w.ar.kind == kind)
    }

    /// The graph; a panicking holder leaves it consistent (each update is applied whole or
    /// not at all per map), so a poisoned lock is taken over.
    pub fn graph(&self) -> MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached object with `uid`.
    pub fn object(&self, uid: &str) -> Option<(usize, Arc<MetaObject>)> {
        let n = self.graph().node(uid)?.clone();
        let o = self.resources.get(n.res)?.get(&n.key)?;
        Some((n.res, o))
    }

    /// Waits until every informer has listed once; false when `stop` fired first.
    pub async fn wait_ready(&self, stop: &CancellationToken) -> bool {
        for w in self.resources.iter() {
            match &w.source {
                Source::Own(store) => {
                    tokio::select! {
                        _ = stop.cancelled() => return false,
                        _ = store.wait_until_ready() => {}
                    }
                }
                Source::SharedPods(inf) => {
                    if !inf.pods().wait_synced(stop).await {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// Discovers the resources that can be listed, watched and deleted, and starts an informer on
/// each. Retries discovery until it succeeds or `stop` fires.
/// Pods come from `pods` (the process's shared Pod informer) when given.
pub async fn start(
    client: kube::Client,
    pods: Option<runtime::Informers>,
    stop: CancellationToken,
) -> Option<Caches> {
    let mut delay = Duration::from_millis(200);
    let discovery = loop {
        match Discovery::new(client.clone()).run().await {
            Ok(d) => break d,
            Err(e) => {
                tracing::warn!(retry_in = ?delay, "discovery failed: {e}");
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    };
    let graph: Arc<Mutex<Graph>> = Arc::default();
    let gc_queue: Arc<WorkQueue<String>> = Arc::default();
    let ns_queue: Arc<WorkQueue<String>> = Arc::new(WorkQueue::with_limiter(
        runtime::limiter::RateLimiter::namespace(),
    ));
    let mut resources = Vec::new();
    let mut unwatched = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            if !wanted(&ar, &caps) {
                continue;
            }
            if collector_ignores(&ar) {
                if caps.scope == Scope::Namespaced {
                    unwatched.push(ar);
                }
                continue;
            }
            let res = resources.len();
            let is_namespace = ar.group.is_empty() && ar.kind == "Namespace";
            let (g, gq, nq) = (graph.clone(), gc_queue.clone(), ns_queue.clone());
            let on_change = move |ch: &Change<'_, MetaObject>| {
                let affected =
                    g.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .update(res, is_namespace, ch);
                gq.extend(affected.uids);
                nq.extend(affected.namespaces);
            };
            let is_pods = ar.group.is_empty() && ar.kind == "Pod";
            let source = match pods.as_ref().filter(|_| is_pods) {
                Some(inf) => {
                    // Until this generation ends (the handler holds its graph and queues).
                    inf.pods().subscribe_until(stop.clone(), move |ch| {
                        let old = ch.old.map(MetaObject::from);
                        let new = ch.new.map(MetaObject::from);
                        on_change(&Change {
                            old: old.as_ref(),
                            new: new.as_ref(),
                        });
                    });
                    Source::SharedPods(inf.clone())
                }
                // The collectors read only metadata (upstream's use metadata informers): a
                // metadata-only watch. The namespace controller also reads a Namespace's
                // phase: Namespaces are watched whole, decoded straight into the projection.
                None if is_namespace => Source::Own(runtime::reflect_slim(
                    Api::<MetaObject>::all_with(client.clone(), &ar),
                    watcher::Config::default(),
                    ar.clone(),
                    |_| {},
                    stop.clone(),
                    move |ch| on_change(&ch),
                )),
                None => Source::Own(runtime::reflect_stream(
                    runtime::meta::metadata_stream(
                        client.clone(),
                        ar.clone(),
                        watcher::Config::default(),
                    ),
                    ar.clone(),
                    stop.clone(),
                    move |ch| on_change(&ch),
                )),
            };
            resources.push(Watched {
                namespaced: caps.scope == Scope::Namespaced,
                ar,
                source,
            });
        }
    }
    Some(Caches {
        resources: Arc::new(resources),
        graph,
        gc_queue,
        ns_queue,
        unwatched: Arc::new(unwatched),
    })
}

/// Resources upstream's collector ignores (`ignoredResources`): Events, by far the most numerous
/// and short-lived objects (a scheduler pass over 150k unschedulable pods writes one each),
/// never owners and never dependents worth an informer. The namespace controller still deletes
/// them, by collection, as upstream's namespace deleter does.
pub fn collector_ignores(ar: &ApiResource) -> bool {
    ar.kind == "Event" && (ar.group.is_empty() || ar.group == "events.k8s.io")
}

fn wanted(ar: &ApiResource, caps: &ApiCapabilities) -> bool {
    caps.supports_operation(verbs::LIST)
        && caps.supports_operation(verbs::WATCH)
        && caps.supports_operation(verbs::DELETE)
        && !ar.plural.contains('/')
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    use super::*;

    fn obj(ns: &str, name: &str, owners: &[&str], deleting: bool, fins: &[&str]) -> MetaObject {
        let mut o = MetaObject::new((!ns.is_empty()).then_some(ns), name);
        o.metadata.uid = Some(format!("u-{name}"));
        o.metadata.owner_references = Some(
            owners
                .iter()
                .map(|u| OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: u.to_string(),
                    uid: format!("u-{u}"),
                    ..Default::default()
                })
                .collect(),
        );
        o.metadata.deletion_timestamp = deleting.then_some(Time(jiff::Timestamp::UNIX_EPOCH));
        o.metadata.finalizers = Some(fins.iter().map(|f| f.to_string()).collect());
        o
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_collectors_ignore_events_only() {
        use k8s_openapi::api::core::v1 as core;
        assert!(collector_ignores(&ApiResource::erase::<core::Event>(&())));
        assert!(collector_ignores(&ApiResource::erase::<
            k8s_openapi::api::events::v1::Event,
        >(&())));
        assert!(!collector_ignores(&ApiResource::erase::<core::Pod>(&())));
        assert!(!collector_ignores(&ApiResource::erase::<core::ConfigMap>(
            &()
        )));
        let mut custom = ApiResource::erase::<core::Event>(&());
        custom.group = "example.com".into();
        assert!(
            !collector_ignores(&custom),
            "a custom kind named Event is collected"
        );
    }

    #[test]
    fn changes_enqueue_only_affected_uids() {
        let mut g = Graph::default();
        let owner = obj("ns", "owner", &[], false, &[]);
        let a = g.update(
            0,
            false,
            &Change {
                old: None,
                new: Some(&owner),
            },
        );
        assert_eq!(
            a,
            Affected::default(),
            "an owner without work is not enqueued"
        );
        let dep = obj("ns", "dep", &["owner"], false, &[]);
        let a = g.update(
            0,
            false,
            &Change {
                old: None,
                new: Some(&dep),
            },
        );
        assert_eq!(a.uids, set(&["u-dep"]));
        assert_eq!(g.dependents("u-owner"), vec!["u-dep".to_string()]);
        // A change of the dependent that keeps its (present) owners: nothing to do.
        let mut dep_status = dep.clone();
        dep_status.metadata.resource_version = Some("2".into());
        let a = g.update(
            0,
            false,
            &Change {
                old: Some(&dep),
                new: Some(&dep_status),
            },
        );
        assert_eq!(a, Affected::default());
        // A dependent whose owner the graph does not hold is looked at on every change.
        let stray = obj("ns", "stray", &["nobody"], false, &[]);
        let a = g.update(
            0,
            false,
            &Change {
                old: None,
                new: Some(&stray),
            },
        );
        assert_eq!(a.uids, set(&["u-stray"]));
        let a = g.update(
            0,
            false,
            &Change {
                old: Some(&stray),
                new: Some(&stray),
            },
        );
        assert_eq!(a.uids, set(&["u-stray"]));
        // The owner starts a foreground deletion: itself and its dependents.
        let owner2 = obj("ns", "owner", &[], true, &["foregroundDeletion"]);
        let a = g.update(
            0,
            false,
            &Change {
                old: Some(&owner),
                new: Some(&owner2),
            },
        );
        assert_eq!(a.uids, set(&["u-owner", "u-dep"]));
        assert_eq!(a.namespaces, set(&["ns"]));
        // The dependent goes: the waiting owner is looked at again.
        let a = g.update(
            0,
            false,
            &Change {
                old: Some(&dep),
                new: None,
            },
        );
        assert_eq!(a.uids, set(&["u-owner"]));
        assert!(g.dependents("u-owner").is_empty());
        // The owner goes.
        let a = g.update(
            0,
            false,
            &Change {
                old: Some(&owner2),
                new: None,
            },
        );
        assert!(a.uids.is_empty());
        assert_eq!(g.members("ns"), vec!["u-stray".to_string()]);
        assert!(g.node("u-owner").is_none());
    }

    #[test]
    fn a_deleting_namespace_is_enqueued() {
        let mut g = Graph::default();
        let ns = obj("", "team", &[], true, &[]);
        let a = g.update(
            3,
            true,
            &Change {
                old: None,
                new: Some(&ns),
            },
        );
        assert_eq!(a.namespaces, set(&["team"]));
        let cm = obj("team", "cm", &[], false, &[]);
        g.update(
            0,
            false,
            &Change {
                old: None,
                new: Some(&cm),
            },
        );
        assert_eq!(g.members("team"), vec!["u-cm".to_string()]);
        let a = g.update(
            0,
            false,
            &Change {
                old: Some(&cm),
                new: None,
            },
        );
        assert_eq!(a.namespaces, set(&["team"]));
    }
}
