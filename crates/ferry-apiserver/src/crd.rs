//! CustomResourceDefinitions: the registry of served custom resources and the controller that
//! keeps it in step with the stored CRDs, as apiextensions-apiserver's controllers do:
//!
//! * naming and establishing: `status.acceptedNames`, the `NamesAccepted` and `Established`
//!   conditions and `storedVersions` (the custom resources are served, with their caches filled,
//!   before `Established` is written, so `kubectl wait --for condition=established` is enough);
//! * serving: one [`Resource`] per served version, sharing one store prefix
//!   (`/registry/<group>/<plural>/`), its watch cache added or dropped with the CRD; discovery and
//!   OpenAPI follow;
//! * deletion: a CRD being deleted is `Terminating`; its custom objects are deleted (honouring
//!   their finalizers), then the `customresourcecleanup.apiextensions.k8s.io` finalizer is removed
//!   and the CRD goes. Namespaced custom objects of a terminating (or gone) namespace are deleted
//!   too.
//!
//! The decisions (names, conditions, schema logic) are pure functions of `ferry-crd`; this module
//! feeds them from the watch cache and writes their results through the REST layer.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ferry_api::kinds::Strategy;
use ferry_crd::definition::{self, CLEANUP_FINALIZER, Definition};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::api::{Resource, store_prefix};
use crate::request::{Query, ResourcePath};
use crate::server::Server;
use crate::status::ApiError;

pub const GROUP: &str = "apiextensions.k8s.io";
pub const PLURAL: &str = "customresourcedefinitions";

/// How often the controller looks again without a CRD event (objects of a terminating CRD
/// going away are not CRD events).
const RESYNC: Duration = Duration::from_secs(1);

type Key = (String, String, String);

/// The resources of custom kinds being served, by (group, version, plural).
#[derive(Default)]
pub struct Registry {
    map: RwLock<HashMap<Key, Arc<Resource>>>,
    /// (group, plural) of the CRDs being deleted: their objects can no longer be created.
    terminating: RwLock<BTreeSet<(String, String)>>,
}

impl Registry {
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<Arc<Resource>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<Resource>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Whether `res` is a custom resource whose CRD is being deleted.
    pub fn is_terminating(&self, res: &Resource) -> bool {
        self.terminating
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(res.info().group.to_string(), res.info().plural.to_string()))
    }

    /// The answer to a create while the CRD is being deleted, as upstream's.
    pub fn terminating_error() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "create not allowed while custom resource definition is terminating",
        )
    }

    /// Replaces the served set; returns whether it changed.
    fn replace(&self, new: HashMap<Key, Arc<Resource>>) -> bool {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let same = map.len() == new.len()
            && new.iter().all(|(k, r)| {
                map.get(k)
                    .is_some_and(|o| std::ptr::addr_eq(o.strategy, r.strategy))
            });
        *map = new;
        !same
    }
}

fn path(name: &str, sub: Option<&str>) -> ResourcePath {
    ResourcePath {
        group: GROUP.into(),
        version: "v1".into(),
        namespace: None,
        resource: PLURAL.into(),
        name: Some(name.to_string()),
        subresource: sub.map(String::from),
    }
}

fn name_of(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn has_cleanup_finalizer(v: &Value) -> bool {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|f| f.as_str() == Some(CLEANUP_FINALIZER)))
}

/// One pass of the controller. Returns whether the served set changed.
pub async fn sync(server: &Server) -> Result<bool, ApiError> {
    let api = &server.api;
    let Some(crd_res) = api.resource(GROUP, "v1", PLURAL).cloned() else {
        return Ok(false);
    };
    let Some(rc) = api.cache.resource(&crd_res.prefix) else {
        return Ok(false);
    };
    let mut crds: Vec<Value> = rc.list(&crd_res.prefix).iter().map(|o| o.value()).collect();
    // Older CRDs keep their names when two ask for the same ones (upstream: first come).
    crds.sort_by(|a, b| {
        let ts = |v: &Value| {
            v.pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        ts(a).cmp(&ts(b)).then(name_of(a).cmp(name_of(b)))
    });

    // Naming and establishing, on the latest view of every CRD.
    let now = crate::objects::now_rfc3339();
    let mut changed_status = Vec::new();
    for i in 0..crds.len() {
        let desired = {
            let others: Vec<&Value> = crds
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, v)| v)
                .collect();
            definition::desired_status(&crds[i], &others, &now)
        };
        if crds[i].get("status") != Some(&desired) {
            crds[i]["status"] = desired.clone();
            changed_status.push((name_of(&crds[i]).to_string(), desired));
        }
    }

    // Serve every established CRD (also while terminating, so its objects can be deleted).
    let defs: Vec<Definition> = crds.iter().filter_map(Definition::from_crd).collect();
    let kinds = ferry_api::custom::resource::install(&defs);
    let mut map = HashMap::new();
    let mut prefixes = BTreeSet::new();
    for k in kinds {
        let info = k.info();
        let prefix = store_prefix(info);
        if !prefixes.contains(&prefix) {
            api.cache.ensure(api.store.as_ref(), &prefix).await?;
            prefixes.insert(prefix.clone());
        }
        map.insert(
            (
                info.group.to_string(),
                info.version.to_string(),
                info.plural.to_string(),
            ),
            Arc::new(Resource {
                strategy: k as &'static dyn Strategy,
                prefix,
                as_stored: false,
            }),
        );
    }
    *api.crds
        .terminating
        .write()
        .unwrap_or_else(|e| e.into_inner()) = crds
        .iter()
        .filter(|c| deleting(c))
        .map(|c| {
            let p = |ptr: &str| {
                c.pointer(ptr)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            (p("/spec/group"), p("/status/acceptedNames/plural"))
        })
        .collect();
    let old_prefixes: BTreeSet<String> = api.crds.all().iter().map(|r| r.prefix.clone()).collect();
    let changed = api.crds.replace(map);
    for p in old_prefixes.difference(&prefixes) {
        api.cache.remove(p);
    }
    if changed {
        // Building every document takes a while: off the request threads.
        match tokio::task::spawn_blocking(ferry_openapi::OpenApi::build).await {
            Ok(o) => server.set_openapi(o),
            Err(e) => tracing::warn!("rebuilding the OpenAPI documents: {e}"),
        }
    }

    let q = Query::default();
    for (name, status) in changed_status {
        let r = api
            .guaranteed_update(
                &crd_res,
                &path(&name, Some("status")),
                &q,
                None,
                false,
                |old| {
                    let mut n = old.cloned().unwrap_or(Value::Null);
                    n["status"] = status.clone();
                    Ok(n)
                },
                Some("status"),
                false,
            )
            .await;
        if let Err(e) = r
            && e.code != 404
        {
            tracing::warn!("CRD {name}: writing status: {}", e.message);
        }
    }

    // Custom objects of a namespace that is terminating or gone are deleted here: the namespace
    // controller discovers its resources once, before custom kinds may exist.
    for res in api.crds.all() {
        if res.info().namespaced
            && res.info().version == storage_version(&defs, res.info().group, res.info().plural)
        {
            delete_orphaned(server, &res).await;
        }
    }

    // Deletion: objects first, then the finalizer.
    for crd in crds
        .iter()
        .filter(|c| deleting(c) && has_cleanup_finalizer(c))
    {
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let plural = crd
            .pointer("/status/acceptedNames/plural")
            .and_then(Value::as_str)
            .unwrap_or("");
        let res = api
            .crds
            .all()
            .into_iter()
            .find(|r| r.info().group == group && r.info().plural == plural);
        let remaining = match &res {
            Some(res) => delete_objects(server, res).await,
            None => 0,
        };
        if remaining == 0 {
            remove_finalizer(server, &crd_res, name_of(crd)).await;
        }
    }
    Ok(changed)
}

/// The storage version of the custom resource `plural.group` (one resource per kind is enough
/// to reach its objects: every version shares the store prefix).
fn storage_version<'a>(defs: &'a [Definition], group: &str, plural: &str) -> &'a str {
    defs.iter()
        .find(|d| d.group == group && d.plural == plural)
        .and_then(|d| d.storage_version())
        .map(|v| v.name.as_str())
        .unwrap_or("")
}

/// Deletes the objects of a namespaced custom resource whose namespace is terminating or gone.
async fn delete_orphaned(server: &Server, res: &Arc<Resource>) {
    let api = &server.api;
    let (Some(rc), Some(ns_rc)) = (
        api.cache.resource(&res.prefix),
        api.cache.resource("/registry/namespaces/"),
    ) else {
        return;
    };
    let q = Query::default();
    for o in rc.list(&res.prefix) {
        let o_value = o.value();
        if deleting(&o_value) {
            continue;
        }
        let ns = o_value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        let gone = match ns_rc.get(&format!("/registry/namespaces/{ns}")) {
            None => true,
            Some(n) => deleting(&n.value()),
        };
        if !gone {
            continue;
        }
        let p = ResourcePath {
            group: res.info().group.to_string(),
            version: res.info().version.to_string(),
            namespace: Some(ns.to_string()),
            resource: res.info().plural.to_string(),
            name: Some(name_of(&o_value).to_string()),
            subresource: None,
        };
        if let Err(e) = api.delete(res, &p, &q, None).await
            && e.code != 404
        {
            tracing::debug!(
                "deleting {} {ns}/{}: {}",
                res.info().kind,
                name_of(&o_value),
                e.message
            );
        }
    }
}

/// Deletes every object of a custom resource that is not being deleted yet; returns how many
/// objects remain.
async fn delete_objects(server: &Server, res: &Arc<Resource>) -> usize {
    let api = &server.api;
    let Some(rc) = api.cache.resource(&res.prefix) else {
        return 0;
    };
    let objects = rc.list(&res.prefix);
    let q = Query::default();
    for o in &objects {
        let o_value = o.value();
        if deleting(&o_value) {
            continue;
        }
        let ns = o_value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && res.info().namespaced)
            .map(String::from);
        let p = ResourcePath {
            group: res.info().group.to_string(),
            version: res.info().version.to_string(),
            namespace: ns,
            resource: res.info().plural.to_string(),
            name: Some(name_of(&o_value).to_string()),
            subresource: None,
        };
        if let Err(e) = api.delete(res, &p, &q, None).await
            && e.code != 404
        {
            tracing::warn!(
                "deleting {} {}: {}",
                res.info().kind,
                name_of(&o_value),
                e.message
            );
        }
    }
    objects.len()
}

async fn remove_finalizer(server: &Server, crd_res: &Arc<Resource>, name: &str) {
    let r = server
        .api
        .guaranteed_update(
            crd_res,
            &path(name, None),
            &Query::default(),
            None,
            false,
            |old| {
                let mut n = old.cloned().unwrap_or(Value::Null);
                if let Some(Value::Array(f)) = n.pointer_mut("/metadata/finalizers") {
                    f.retain(|x| x.as_str() != Some(CLEANUP_FINALIZER));
                }
                Ok(n)
            },
            None,
            false,
        )
        .await;
    if let Err(e) = r
        && e.code != 404
    {
        tracing::warn!("CRD {name}: removing the cleanup finalizer: {}", e.message);
    }
}

/// Runs the controller until `shutdown`: a pass on every CRD event and every [`RESYNC`].
pub async fn run(server: Arc<Server>, shutdown: CancellationToken) {
    let prefix = format!("/registry/{GROUP}/{PLURAL}/");
    let Some(rc) = server.api.cache.resource(&prefix) else {
        return;
    };
    let (_, mut live) = rc.snapshot_and_subscribe(&prefix);
    loop {
        if let Err(e) = sync(&server).await {
            tracing::warn!("CRD controller: {}", e.message);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = live.recv() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use ferry_store::Store;

    use crate::cache::Cache;

    fn obj(name: &str, v: u32) -> Bytes {
        Bytes::from(format!(r#"{{"metadata":{{"name":"{name}"}},"v":{v}}}"#))
    }

    fn names(cache: &Cache, prefix: &str) -> Vec<(String, u64)> {
        cache
            .resource(prefix)
            .map(|rc| rc.list(prefix))
            .unwrap_or_default()
            .iter()
            .map(|o| (o.name().to_string(), o.value()["v"].as_u64().unwrap_or(0)))
            .collect()
    }

    /// A resource cache added at runtime (a new custom kind) holds what the store holds, and
    /// follows later writes; dropping it stops that.
    #[tokio::test]
    async fn cache_added_at_runtime_follows_the_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            ferry_store::redb_store::RedbStore::open(&dir.path().join("db")).expect("open"),
        );
        let prefix = "/registry/stable.example.com/crontabs/";
        store
            .create(&format!("{prefix}default/a"), obj("a", 1))
            .await
            .expect("a");
        store
            .create(&format!("{prefix}default/b"), obj("b", 1))
            .await
            .expect("b");
        let (cache, rev) = Cache::load(store.as_ref(), &[]).await.expect("load");
        let follower = {
            let cache = cache.clone();
            let store = store.clone();
            tokio::spawn(async move { cache.follow(store, rev).await })
        };
        // Changes before the cache exists.
        let b = store
            .get(&format!("{prefix}default/b"))
            .await
            .expect("get")
            .expect("b");
        store
            .update(&format!("{prefix}default/b"), obj("b", 2), b.mod_revision)
            .await
            .expect("update b");
        store
            .delete(&format!("{prefix}default/a"), None)
            .await
            .expect("delete a");
        let cur = store.current_revision().await.expect("rev");
        assert!(cache.wait_for(cur, Duration::from_secs(10)).await);
        assert!(cache.resource(prefix).is_none());
        cache.ensure(store.as_ref(), prefix).await.expect("ensure");
        assert_eq!(names(&cache, prefix), vec![("b".to_string(), 2)]);
        // Later writes arrive through the watch.
        store
            .create(&format!("{prefix}ns2/c"), obj("c", 1))
            .await
            .expect("c");
        let cur = store.current_revision().await.expect("rev");
        assert!(cache.wait_for(cur, Duration::from_secs(10)).await);
        assert_eq!(
            names(&cache, prefix),
            vec![("b".to_string(), 2), ("c".to_string(), 1)]
        );
        // Idempotent; removal drops it.
        cache
            .ensure(store.as_ref(), prefix)
            .await
            .expect("ensure again");
        assert_eq!(names(&cache, prefix).len(), 2);
        cache.remove(prefix);
        assert!(cache.resource(prefix).is_none());
        follower.abort();
    }

    #[test]
    fn registry_reports_changes() {
        let reg = super::Registry::default();
        assert!(!reg.replace(Default::default()));
        assert!(reg.all().is_empty());
    }
}
