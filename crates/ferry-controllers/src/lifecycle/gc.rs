//! The garbage collector and the namespace controller, from the informers of [`super::graph`]:
//! the `orphan` and `foregroundDeletion` finalizers, dependents whose owners are gone, and
//! namespace termination. Every owner absence is confirmed against the API server before a
//! dependent is deleted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, Namespace, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference, Time};
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, PropagationPolicy,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::gc_core::{self, Dependent, OwnerState, Policy, Ref, Verdict};
use super::graph::{Caches, Watched};

struct Item {
    res: usize,
    obj: Arc<DynamicObject>,
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

/// Runs rounds on every change (and every few seconds, to retry) until `stop`.
pub async fn run(client: kube::Client, caches: Caches, stop: CancellationToken) {
    caches.wait_ready(&stop).await;
    let mut gc = Gc {
        client,
        caches,
        warned: HashSet::new(),
    };
    loop {
        gc.round().await;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = gc.caches.changed.notified() => {
                // Let a burst of events settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

struct Gc {
    client: kube::Client,
    caches: Caches,
    /// (dependent uid, owner uid) pairs already reported as OwnerRefInvalidNamespace.
    warned: HashSet<(String, String)>,
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

    async fn round(&mut self) {
        let mut all: Vec<Item> = Vec::new();
        for (res, w) in self.caches.resources.iter().enumerate() {
            for obj in w.store.state() {
                all.push(Item { res, obj });
            }
        }
        let by_uid: HashMap<&str, usize> =
            all.iter().enumerate().map(|(i, o)| (o.uid(), i)).collect();
        let mut dependents: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, o) in all.iter().enumerate() {
            for r in o.refs() {
                dependents.entry(r.uid.as_str()).or_default().push(i);
            }
        }
        // Owners being deleted: orphan and foreground finalizers.
        for o in all.iter().filter(|o| o.deleting()) {
            let deps: Vec<&Item> = dependents
                .get(o.uid())
                .map(|v| v.iter().map(|i| &all[*i]).collect())
                .unwrap_or_default();
            if o.finalizers().iter().any(|f| f == "orphan") {
                self.orphan(o, &deps).await;
            } else if o.finalizers().iter().any(|f| f == "foregroundDeletion") {
                self.foreground(o, &deps).await;
            }
        }
        // Namespaces being deleted.
        for o in all.iter().filter(|o| o.deleting()) {
            let w = self.watched(o);
            if w.ar.group.is_empty() && w.ar.kind == "Namespace" {
                self.terminate_namespace(o, &all).await;
            }
        }
        // Dependents: dangling owners.
        for o in all.iter().filter(|o| !o.refs().is_empty() && !o.deleting()) {
            let mut refs = Vec::new();
            for r in o.refs() {
                let state = self
                    .owner_state(o, r, by_uid.get(r.uid.as_str()).map(|i| &all[*i]))
                    .await;
                refs.push(Ref {
                    uid: r.uid.clone(),
                    block_owner_deletion: r.block_owner_deletion.unwrap_or(false),
                    state,
                });
            }
            match gc_core::decide(&refs, o.finalizers(), o.deleting()) {
                Verdict::Keep => {}
                Verdict::RemoveRefs(uids) => self.remove_refs(o, &uids).await,
                Verdict::Delete(p) => {
                    tracing::info!(
                        "gc: deleting {} {}/{} (owners gone)",
                        self.watched(o).ar.kind,
                        o.obj.metadata.namespace.as_deref().unwrap_or(""),
                        o.obj.name_any()
                    );
                    let uid = o.uid().to_string();
                    let mut dp = delete_params(p);
                    dp.preconditions = Some(kube::api::Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    });
                    let _ = self.api_of(o).delete(&o.obj.name_any(), &dp).await;
                }
            }
        }
    }

    /// The state of the owner named by `r` for dependent `dep`; `cached` is the cached object
    /// with that uid, if any. Absence is confirmed with a GET.
    async fn owner_state(
        &mut self,
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

    async fn warn_invalid_namespace(&mut self, dep: &Item, r: &OwnerReference) {
        let key = (dep.uid().to_string(), r.uid.clone());
        if self.warned.contains(&key) {
            return;
        }
        let w = self.watched(dep);
        let ns = dep
            .obj
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let message = format!(
            "ownerRef [{}/{}, namespace: {}, name: {}, uid: {}] does not exist in namespace {:?}",
            r.api_version,
            r.kind,
            dep.obj.metadata.namespace.as_deref().unwrap_or(""),
            r.name,
            r.uid,
            dep.obj.metadata.namespace.as_deref().unwrap_or("")
        );
        let now = jiff::Timestamp::now();
        let ev = Event {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(format!("{}.", dep.obj.name_any())),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some(w.ar.api_version.clone()),
                kind: Some(w.ar.kind.clone()),
                name: Some(dep.obj.name_any()),
                namespace: dep.obj.metadata.namespace.clone(),
                uid: dep.obj.metadata.uid.clone(),
                resource_version: dep.obj.metadata.resource_version.clone(),
                ..Default::default()
            },
            reason: Some("OwnerRefInvalidNamespace".into()),
            message: Some(message),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some("garbage-collector-controller".into()),
                host: None,
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            count: Some(1),
            reporting_component: Some("garbage-collector-controller".into()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        match api.create(&PostParams::default(), &ev).await {
            Ok(_) => {
                self.warned.insert(key);
            }
            Err(e) => tracing::debug!("event: {e}"),
        }
    }

    async fn remove_refs(&self, o: &Item, uids: &[String]) {
        let keep: Vec<&OwnerReference> =
            o.refs().iter().filter(|r| !uids.contains(&r.uid)).collect();
        let patch = json!({"metadata": {
            "resourceVersion": o.obj.metadata.resource_version,
            "ownerReferences": if keep.is_empty() { serde_json::Value::Null } else { json!(keep) },
        }});
        let _ = self
            .api_of(o)
            .patch(&o.obj.name_any(), &patch_params(), &Patch::Merge(&patch))
            .await;
    }

    async fn remove_finalizer(&self, o: &Item, fin: &str) {
        let keep: Vec<&String> = o.finalizers().iter().filter(|f| *f != fin).collect();
        let patch = json!({"metadata": {
            "resourceVersion": o.obj.metadata.resource_version,
            "finalizers": if keep.is_empty() { serde_json::Value::Null } else { json!(keep) },
        }});
        let _ = self
            .api_of(o)
            .patch(&o.obj.name_any(), &patch_params(), &Patch::Merge(&patch))
            .await;
    }

    async fn orphan(&self, owner: &Item, deps: &[&Item]) {
        let mut ok = true;
        for d in deps {
            let uid = owner.uid().to_string();
            let keep: Vec<&OwnerReference> = d.refs().iter().filter(|r| r.uid != uid).collect();
            let patch = json!({"metadata": {
                "resourceVersion": d.obj.metadata.resource_version,
                "ownerReferences": if keep.is_empty() { serde_json::Value::Null } else { json!(keep) },
            }});
            match self
                .api_of(d)
                .patch(&d.obj.name_any(), &patch_params(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(_) => ok = false,
            }
        }
        if ok {
            self.remove_finalizer(owner, "orphan").await;
        }
    }

    async fn foreground(&self, owner: &Item, deps: &[&Item]) {
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
        let (delete, done) = gc_core::foreground(&views);
        for (i, p) in delete {
            let d = deps[i];
            let _ = self
                .api_of(d)
                .delete(&d.obj.name_any(), &delete_params(p))
                .await;
        }
        if done {
            self.remove_finalizer(owner, "foregroundDeletion").await;
        }
    }

    async fn terminate_namespace(&self, ns: &Item, all: &[Item]) {
        let name = ns.obj.name_any();
        let api: Api<Namespace> = Api::all(self.client.clone());
        let phase = ns
            .obj
            .data
            .pointer("/status/phase")
            .and_then(|v| v.as_str());
        if phase != Some("Terminating") {
            let patch = json!({"status": {"phase": "Terminating"}});
            let _ = api
                .patch_status(&name, &patch_params(), &Patch::Merge(&patch))
                .await;
        }
        let mut remaining = 0;
        for o in all.iter().filter(|o| {
            self.watched(o).namespaced && o.obj.metadata.namespace.as_deref() == Some(&name)
        }) {
            remaining += 1;
            if !o.deleting() {
                let _ = self
                    .api_of(o)
                    .delete(&o.obj.name_any(), &delete_params(Policy::Background))
                    .await;
            }
        }
        if remaining > 0 {
            return;
        }
        // Confirm emptiness against the API server, not the informers.
        for w in self.caches.resources.iter().filter(|w| w.namespaced) {
            let api = w.api(&self.client, Some(&name));
            match api.list_metadata(&ListParams::default().limit(1)).await {
                Ok(l) if l.items.is_empty() => {}
                _ => return,
            }
        }
        let Ok(Some(mut cur)) = api.get_opt(&name).await else {
            return;
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
            if let Err(e) = api
                .replace_subresource("finalize", &name, &PostParams::default(), &cur)
                .await
            {
                tracing::debug!("finalize namespace {name}: {e}");
            }
        }
    }
}
