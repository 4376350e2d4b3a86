//! The garbage collector and the namespace controller on the controller runtime, from the
//! informers and graph of [`super::graph`]: the `orphan` and `foregroundDeletion` finalizers,
//! dependents whose owners are gone, and namespace termination. Each works one key at a time
//! (an object uid; a namespace name) off its queue, with the pure decisions of
//! [`super::gc_core`]; failed writes back off per key. Every owner absence is confirmed against
//! the API server before a dependent is deleted.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use ferry_kubeclient::events;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, PropagationPolicy,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::gc_core::{self, Dependent, OwnerState, Policy, Ref, Verdict};
use super::graph::{Caches, Watched};
use super::ns_core;
use crate::runtime::{self, Action, MetaObject, Reconciler};

/// Upstream's `--concurrent-gc-syncs` and `--concurrent-namespace-syncs` defaults.
const GC_WORKERS: usize = 20;
const NS_WORKERS: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{failed} of {total} writes failed; first: {first}")]
    Writes {
        failed: usize,
        total: usize,
        first: kube::Error,
    },
    #[error("namespace {0} still has content on the API server")]
    ContentRemaining(String),
}

impl From<runtime::worker::WriteErrors<kube::Error>> for GcError {
    fn from(e: runtime::worker::WriteErrors<kube::Error>) -> Self {
        GcError::Writes {
            failed: e.failed,
            total: e.total,
            first: e.first,
        }
    }
}

/// 404 counts as done for a delete or an unlink.
fn ignore_gone<T>(r: kube::Result<T>) -> kube::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

struct Item {
    res: usize,
    obj: Arc<MetaObject>,
}

impl Item {
    fn uid(&self) -> &str {
        self.obj.metadata.uid.as_deref().unwrap_or("")
    }
    fn deleting(&self) -> bool {
        self.obj.metadata.deletion_timestamp.is_some()
    }
    fn refs(&self) -> &[OwnerReference] {
        self.obj.metadata.owner_references.as_deref().unwrap_or(&[])
    }
    fn finalizers(&self) -> &[String] {
        self.obj.metadata.finalizers.as_deref().unwrap_or(&[])
    }
}

/// Runs the collector and the namespace controller until `stop`.
pub async fn run(client: kube::Client, caches: Caches, stop: CancellationToken) {
    if !caches.wait_ready(&stop).await {
        return;
    }
    let gc = Arc::new(Gc {
        client,
        caches: caches.clone(),
        warned: Mutex::default(),
    });
    tokio::join!(
        runtime::worker::run(
            Arc::new(Collector(gc.clone())),
            caches.gc_queue.clone(),
            GC_WORKERS,
            stop.clone()
        ),
        runtime::worker::run(
            Arc::new(Namespaces(gc)),
            caches.ns_queue.clone(),
            NS_WORKERS,
            stop
        ),
    );
}

struct Gc {
    client: kube::Client,
    caches: Caches,
    /// (dependent uid, owner uid) pairs already reported as OwnerRefInvalidNamespace.
    warned: Mutex<HashSet<(String, String)>>,
}

/// The garbage collector: one object uid at a time.
struct Collector(Arc<Gc>);
/// The namespace controller: one namespace at a time.
struct Namespaces(Arc<Gc>);

impl Reconciler for Collector {
    type Key = String;
    type Error = GcError;
    fn name(&self) -> &'static str {
        "garbage-collector"
    }
    async fn reconcile(&self, uid: &String) -> Result<Action, GcError> {
        self.0.sync_object(uid).await
    }
}

impl Reconciler for Namespaces {
    type Key = String;
    type Error = GcError;
    fn name(&self) -> &'static str {
        "namespace-controller"
    }
    async fn reconcile(&self, ns: &String) -> Result<Action, GcError> {
        self.0.sync_namespace(ns).await
    }
}

fn patch_params() -> PatchParams {
    PatchParams::default()
}

fn delete_params(p: Policy) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(match p {
            Policy::Background => PropagationPolicy::Background,
            Policy::Foreground => PropagationPolicy::Foreground,
            Policy::Orphan => PropagationPolicy::Orphan,
        }),
        ..DeleteParams::default()
    }
}

impl Gc {
    fn watched(&self, i: &Item) -> &Watched {
        &self.caches.resources[i.res]
    }

    fn api_of(&self, i: &Item) -> Api<DynamicObject> {
        self.watched(i)
            .api(&self.client, i.obj.metadata.namespace.as_deref())
    }

    fn item(&self, uid: &str) -> Option<Item> {
        self.caches.object(uid).map(|(res, obj)| Item { res, obj })
    }

    /// One object: an owner being deleted (orphan / foreground finalizers), or a dependent
    /// whose owners may be gone.
    async fn sync_object(&self, uid: &str) -> Result<Action, GcError> {
        let Some(o) = self.item(uid) else {
            return Ok(Action::Done);
        };
        if o.deleting() {
            // (The graph lock is released before the objects are looked up.)
            let uids = self.caches.graph().dependents(uid);
            let deps: Vec<Item> = uids.iter().filter_map(|d| self.item(d)).collect();
            return self.owner_work(&o, &deps).await.map(|()| Action::Done);
        }
        if o.refs().is_empty() {
            return Ok(Action::Done);
        }
        let mut refs = Vec::new();
        for r in o.refs() {
            let cached = self.item(&r.uid);
            let state = self.owner_state(&o, r, cached.as_ref()).await;
            refs.push(Ref {
                uid: r.uid.clone(),
                block_owner_deletion: r.block_owner_deletion.unwrap_or(false),
                state,
            });
        }
        match gc_core::decide(&refs, o.finalizers(), o.deleting()) {
            Verdict::Keep => {}
            Verdict::RemoveRefs(uids) => self.remove_refs(&o, &uids).await?,
            Verdict::Delete(p) => {
                tracing::info!(
                    "gc: deleting {} {}/{} (owners gone)",
                    self.watched(&o).ar.kind,
                    o.obj.metadata.namespace.as_deref().unwrap_or(""),
                    o.obj.name_any()
                );
                let mut dp = delete_params(p);
                dp.preconditions = Some(kube::api::Preconditions {
                    uid: Some(uid.to_string()),
                    resource_version: None,
                });
                ignore_gone(self.api_of(&o).delete(&o.obj.name_any(), &dp).await)?;
            }
        }
        Ok(Action::Done)
    }

    /// An owner with the `orphan` or `foregroundDeletion` finalizer: the planned writes, issued
    /// concurrently, then the finalizer once they all succeeded.
    async fn owner_work(&self, owner: &Item, deps: &[Item]) -> Result<(), GcError> {
        let uid = owner.uid();
        let views: Vec<Dependent> = deps
            .iter()
            .map(|d| Dependent {
                blocks: d
                    .refs()
                    .iter()
                    .any(|r| r.uid == uid && r.block_owner_deletion == Some(true)),
                deleting: d.deleting(),
            })
            .collect();
        let plan = gc_core::owner_plan(owner.deleting(), owner.finalizers(), &views);
        runtime::execute_all(plan.unlink, |i| {
            let d = &deps[i];
            async move { ignore_gone(self.unlink(d, uid).await) }
        })
        .await?;
        runtime::execute_all(plan.delete, |(i, p)| {
            let d = &deps[i];
            async move {
                ignore_gone(
                    self.api_of(d)
                        .delete(&d.obj.name_any(), &delete_params(p))
                        .await,
                )
            }
        })
        .await?;
        if let Some(f) = plan.remove_finalizer {
            ignore_gone(self.remove_finalizer(owner, f).await)?;
        }
        Ok(())
    }

    /// A namespace being deleted: delete its content, confirm it is gone, finalize.
    async fn sync_namespace(&self, name: &str) -> Result<Action, GcError> {
        let Some(w) = self.caches.resources.iter().find(|w| w.is_namespace()) else {
            return Ok(Action::Done);
        };
        let Some(ns) = w.get(&crate::runtime::ObjectKey::new("", name)) else {
            return Ok(Action::Done);
        };
        if ns.metadata.deletion_timestamp.is_none() {
            return Ok(Action::Done);
        }
        self.terminate_namespace(&ns).await
    }

    /// The state of the owner named by `r` for dependent `dep`; `cached` is the cached object
    /// with that uid, if any. Absence is confirmed with a GET.
    async fn owner_state(
        &self,
        dep: &Item,
        r: &OwnerReference,
        cached: Option<&Item>,
    ) -> OwnerState {
        let dep_ns = dep.obj.metadata.namespace.clone();
        let dep_namespaced = self.watched(dep).namespaced;
        if let Some(owner) = cached {
            let owner_namespaced = self.watched(owner).namespaced;
            let invalid =
                owner_namespaced && (!dep_namespaced || owner.obj.metadata.namespace != dep_ns);
            if invalid {
                self.warn_invalid_namespace(dep, r).await;
                return OwnerState::Dangling;
            }
            return if owner.deleting()
                && owner.finalizers().iter().any(|f| f == "foregroundDeletion")
            {
                OwnerState::Waiting
            } else {
                OwnerState::Solid
            };
        }
        let Some(w) = self.caches.by_kind(&r.api_version, &r.kind) else {
            return OwnerState::Unknown;
        };
        if w.namespaced && !dep_namespaced {
            self.warn_invalid_namespace(dep, r).await;
            return OwnerState::Dangling;
        }
        let api = w.api(&self.client, dep_ns.as_deref());
        match api.get_opt(&r.name).await {
            Ok(Some(o)) if o.metadata.uid.as_deref() == Some(r.uid.as_str()) => {
                if o.metadata.deletion_timestamp.is_some()
                    && o.metadata
                        .finalizers
                        .as_deref()
                        .unwrap_or(&[])
                        .iter()
                        .any(|f| f == "foregroundDeletion")
                {
                    OwnerState::Waiting
                } else {
                    OwnerState::Solid
                }
            }
            Ok(_) => OwnerState::Dangling,
            Err(_) => OwnerState::Unknown,
        }
    }

    async fn warn_invalid_namespace(&self, dep: &Item, r: &OwnerReference) {
        let key = (dep.uid().to_string(), r.uid.clone());
        if self
            .warned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&key)
        {
            return;
        }
        let w = self.watched(dep);
        let message = format!(
            "ownerRef [{}/{}, namespace: {}, name: {}, uid: {}] does not exist in namespace {:?}",
            r.api_version,
            r.kind,
            dep.obj.metadata.namespace.as_deref().unwrap_or(""),
            r.name,
            r.uid,
            dep.obj.metadata.namespace.as_deref().unwrap_or("")
        );
        let about = ObjectReference {
            api_version: Some(w.ar.api_version.clone()),
            kind: Some(w.ar.kind.clone()),
            name: Some(dep.obj.name_any()),
            namespace: dep.obj.metadata.namespace.clone(),
            uid: dep.obj.metadata.uid.clone(),
            resource_version: dep.obj.metadata.resource_version.clone(),
            ..Default::default()
        };
        let recorder = events::Recorder::new(
            self.client.clone(),
            events::Source::new("garbage-collector-controller"),
        );
        match recorder
            .publish(about, events::WARNING, "OwnerRefInvalidNamespace", message)
            .await
        {
            Ok(_) => {
                self.warned
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key);
            }
            Err(e) => tracing::debug!("event: {e}"),
        }
    }

    async fn remove_refs(&self, o: &Item, uids: &[String]) -> kube::Result<()> {
        let keep: Vec<&OwnerReference> =
            o.refs().iter().filter(|r| !uids.contains(&r.uid)).collect();
        let patch = json!({"metadata": {
            "resourceVersion": o.obj.metadata.resource_version,
            "ownerReferences": if keep.is_empty() { serde_json::Value::Null } else { json!(keep) },
        }});
        ignore_gone(
            self.api_of(o)
                .patch(&o.obj.name_any(), &patch_params(), &Patch::Merge(&patch))
                .await,
        )
    }

    /// Removes dependent `d`'s reference to the owner `owner_uid` (orphan propagation).
    async fn unlink(&self, d: &Item, owner_uid: &str) -> kube::Result<()> {
        self.remove_refs(d, &[owner_uid.to_string()]).await
    }

    async fn remove_finalizer(&self, o: &Item, fin: &str) -> kube::Result<()> {
        let keep: Vec<&String> = o.finalizers().iter().filter(|f| *f != fin).collect();
        let patch = json!({"metadata": {
            "resourceVersion": o.obj.metadata.resource_version,
            "finalizers": if keep.is_empty() { serde_json::Value::Null } else { json!(keep) },
        }});
        ignore_gone(
            self.api_of(o)
                .patch(&o.obj.name_any(), &patch_params(), &Patch::Merge(&patch))
                .await,
        )
    }

    /// Writes the namespace's deletion conditions when they change (upstream writes them on
    /// every pass of its deleter); a failed write is logged, the pass goes on.
    async fn write_conditions(
        &self,
        api: &Api<Namespace>,
        name: &str,
        content: &ns_core::Content,
        errors: &[String],
    ) {
        let current = match api.get_opt(name).await {
            Ok(Some(ns)) => ns.status.and_then(|s| s.conditions).unwrap_or_default(),
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("namespace {name}: reading its conditions: {e}");
                return;
            }
        };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
        let Some(conditions) = ns_core::update_conditions(&current, content, errors, &now) else {
            return;
        };
        let patch = json!({"status": {"conditions": conditions}});
        if let Err(e) = api
            .patch_status(name, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            tracing::debug!("namespace {name}: writing its conditions: {e}");
        }
    }

    async fn terminate_namespace(&self, ns: &MetaObject) -> Result<Action, GcError> {
        let name = ns.name_any();
        let api: Api<Namespace> = Api::all(self.client.clone());
        let phase = ns.phase.as_deref();
        if phase != Some("Terminating") {
            let patch = json!({"status": {"phase": "Terminating"}});
            api.patch_status(&name, &patch_params(), &Patch::Merge(&patch))
                .await?;
        }
        let uids = self.caches.graph().members(&name);
        let members: Vec<Item> = uids
            .iter()
            .filter_map(|u| self.item(u))
            .filter(|o| self.watched(o).namespaced)
            .collect();
        let deleted = runtime::execute_all(
            members.iter().filter(|o| !o.deleting()).collect(),
            |o| async move {
                ignore_gone(
                    self.api_of(o)
                        .delete(&o.obj.name_any(), &delete_params(Policy::Background))
                        .await,
                )
            },
        )
        .await;
        if !members.is_empty() {
            let mut content = ns_core::Content::default();
            for o in &members {
                let w = self.watched(o);
                content.add(&w.ar.plural, &w.ar.group, o.finalizers());
            }
            let errors: Vec<String> = deleted
                .as_ref()
                .err()
                .map(|e| e.to_string())
                .into_iter()
                .collect();
            self.write_conditions(&api, &name, &content, &errors).await;
            deleted?;
            // Each member's deletion requeues the namespace; the recheck is upstream's
            // estimate-based requeue, in case a change never arrives.
            return Ok(Action::RequeueAfter(ns_core::RECHECK));
        }
        // What the collectors do not watch (Events) goes by collection.
        for ar in self.caches.unwatched.iter() {
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &name, ar);
            ignore_gone(
                api.delete_collection(&delete_params(Policy::Background), &ListParams::default())
                    .await,
            )?;
        }
        // Confirm emptiness against the API server, not the informers; what the informers
        // missed is deleted here (upstream's deleter lists and deletes every resource).
        let unwatched = self.caches.unwatched.iter().map(|ar| {
            (
                ar.clone(),
                Api::<DynamicObject>::namespaced_with(self.client.clone(), &name, ar),
            )
        });
        let watched = self
            .caches
            .resources
            .iter()
            .filter(|w| w.namespaced)
            .map(|w| (w.ar.clone(), w.api(&self.client, Some(&name))));
        let mut content = ns_core::Content::default();
        let mut errors = Vec::new();
        for (ar, rapi) in watched.chain(unwatched) {
            let l = rapi.list_metadata(&ListParams::default()).await?;
            for o in &l.items {
                content.add(
                    &ar.plural,
                    &ar.group,
                    o.metadata.finalizers.as_deref().unwrap_or(&[]),
                );
                if o.metadata.deletion_timestamp.is_none() {
                    let r = rapi
                        .delete(&o.name_any(), &delete_params(Policy::Background))
                        .await;
                    if let Err(e) = ignore_gone(r) {
                        errors.push(format!("{} \"{}\": {e}", ar.plural, o.name_any()));
                    }
                }
            }
        }
        self.write_conditions(&api, &name, &content, &errors).await;
        if !content.is_empty() {
            return Err(GcError::ContentRemaining(name));
        }
        let Some(mut cur) = api.get_opt(&name).await? else {
            return Ok(Action::Done);
        };
        let has = cur
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.as_ref())
            .is_some_and(|f| f.iter().any(|x| x == "kubernetes"));
        if has {
            if let Some(spec) = cur.spec.as_mut() {
                spec.finalizers = Some(
                    spec.finalizers
                        .take()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|f| f != "kubernetes")
                        .collect(),
                );
            }
            api.replace_subresource("finalize", &name, &PostParams::default(), &cur)
                .await?;
        }
        Ok(Action::Done)
    }
}
