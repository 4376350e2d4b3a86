//! In-process finishing of deletions: the `foregroundDeletion` and `orphan` finalizers,
//! dependents whose owners are gone, and namespace termination.
//!
//! This is the minimal garbage collector `ferry up` needs so that every DeleteOptions
//! propagation policy completes. It works from the watch cache and confirms every owner's
//! absence against the store before deleting a dependent.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::{Api, Resource};
use crate::objects;
use crate::request::{Query, ResourcePath};

struct Obj {
    res: Arc<Resource>,
    value: Value,
}

fn path_of(res: &Resource, v: &Value) -> ResourcePath {
    let info = res.info();
    ResourcePath {
        group: info.group.to_string(),
        version: info.version.to_string(),
        namespace: if info.namespaced {
            Some(objects::namespace(v).to_string())
        } else {
            None
        },
        resource: info.plural.to_string(),
        name: Some(objects::name(v).to_string()),
        subresource: None,
    }
}

fn owner_refs(v: &Value) -> Vec<Value> {
    objects::meta(v)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

pub async fn run(api: Arc<Api>, shutdown: CancellationToken) {
    let mut last_rev = -1;
    let mut idle_rounds = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let rev = api.cache.revision();
        // Rescan on change, and now and then anyway (retries after errors).
        idle_rounds += 1;
        if rev == last_rev && idle_rounds < 50 {
            continue;
        }
        idle_rounds = 0;
        last_rev = rev;
        if let Err(e) = round(&api).await {
            tracing::debug!("gc round: {}", e.message);
        }
    }
}

async fn round(api: &Api) -> Result<(), crate::status::ApiError> {
    let mut all: Vec<Obj> = Vec::new();
    for s in ferry_api::kinds::all() {
        let info = s.info();
        let Some(res) = api.resource(info.group, info.version, info.plural).cloned() else {
            continue;
        };
        if let Some(rc) = api.cache.resource(&res.prefix) {
            for o in rc.list(&res.prefix) {
                all.push(Obj {
                    res: res.clone(),
                    value: o.value.clone(),
                });
            }
        }
    }
    let uids: HashSet<&str> = all.iter().map(|o| objects::uid(&o.value)).collect();
    // uid -> dependents
    let mut dependents: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, o) in all.iter().enumerate() {
        for r in owner_refs(&o.value) {
            if let Some(u) = r.get("uid").and_then(Value::as_str) {
                dependents.entry(u.to_string()).or_default().push(i);
            }
        }
    }
    let q = Query::default();
    for o in &all {
        if !objects::is_deleting(&o.value) {
            continue;
        }
        let uid = objects::uid(&o.value).to_string();
        let fins = objects::finalizers(&o.value);
        let deps: Vec<&Obj> = dependents
            .get(&uid)
            .map(|v| v.iter().map(|i| &all[*i]).collect())
            .unwrap_or_default();
        if fins.iter().any(|f| f == "orphan") {
            for d in &deps {
                let target = uid.clone();
                let _ = api
                    .guaranteed_update(
                        &d.res,
                        &path_of(&d.res, &d.value),
                        &q,
                        None,
                        false,
                        |cur| {
                            let mut v = cur.cloned().unwrap_or(Value::Null);
                            let refs: Vec<Value> = owner_refs(&v)
                                .into_iter()
                                .filter(|r| r.get("uid").and_then(Value::as_str) != Some(&target))
                                .collect();
                            let m = objects::meta_mut(&mut v);
                            if refs.is_empty() {
                                m.remove("ownerReferences");
                            } else {
                                m.insert("ownerReferences".into(), json!(refs));
                            }
                            Ok(v)
                        },
                        None,
                        false,
                    )
                    .await;
            }
            remove_finalizer(api, o, "orphan").await;
            continue;
        }
        if fins.iter().any(|f| f == "foregroundDeletion") {
            let mut blocking = 0;
            for d in &deps {
                let blocks = owner_refs(&d.value).iter().any(|r| {
                    r.get("uid").and_then(Value::as_str) == Some(&uid)
                        && r.get("blockOwnerDeletion")
                            .and_then(Value::as_bool)
                            .unwrap_or(false)
                });
                if blocks {
                    blocking += 1;
                }
                if !objects::is_deleting(&d.value) {
                    let body = json!({"propagationPolicy": if blocks { "Foreground" } else { "Background" }});
                    let _ = api
                        .delete(&d.res, &path_of(&d.res, &d.value), &q, Some(body))
                        .await;
                }
            }
            if blocking == 0 {
                remove_finalizer(api, o, "foregroundDeletion").await;
            }
            continue;
        }
        if o.res.info().kind == "Namespace" && o.res.info().group.is_empty() {
            terminate_namespace(api, o, &all).await;
        }
    }
    // Dependents whose owners are all gone.
    for o in &all {
        let refs = owner_refs(&o.value);
        if refs.is_empty() || objects::is_deleting(&o.value) {
            continue;
        }
        let present = refs.iter().any(|r| {
            r.get("uid")
                .and_then(Value::as_str)
                .is_some_and(|u| uids.contains(u))
        });
        if present {
            continue;
        }
        // Confirm against the store: the cache may be behind.
        let mut any_alive = false;
        for r in &refs {
            if owner_alive(api, o, r).await {
                any_alive = true;
                break;
            }
        }
        if !any_alive {
            let _ = api
                .delete(
                    &o.res,
                    &path_of(&o.res, &o.value),
                    &q,
                    Some(json!({"propagationPolicy": "Background"})),
                )
                .await;
        }
    }
    Ok(())
}

async fn owner_alive(api: &Api, dep: &Obj, r: &Value) -> bool {
    let (Some(av), Some(kind), Some(name), Some(uid)) = (
        r.get("apiVersion").and_then(Value::as_str),
        r.get("kind").and_then(Value::as_str),
        r.get("name").and_then(Value::as_str),
        r.get("uid").and_then(Value::as_str),
    ) else {
        return false;
    };
    let Some(res) = api.resource_for_kind(av, kind) else {
        // An owner of a kind we do not serve: never collect on its account.
        return true;
    };
    if res.info().namespaced && !dep.res.info().namespaced {
        // A cluster-scoped dependent cannot have a namespaced owner: the reference is absent.
        return false;
    }
    let key = res.key(Some(objects::namespace(&dep.value)), name);
    match api.store.get(&key).await {
        Ok(Some(kv)) => {
            let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
            objects::uid(&v) == uid
        }
        Ok(None) => false,
        Err(_) => true,
    }
}

async fn remove_finalizer(api: &Api, o: &Obj, fin: &str) {
    let fin = fin.to_string();
    let _ = api
        .guaranteed_update(
            &o.res,
            &path_of(&o.res, &o.value),
            &Query::default(),
            None,
            false,
            |cur| {
                let mut v = cur.cloned().unwrap_or(Value::Null);
                let f: Vec<String> = objects::finalizers(&v)
                    .into_iter()
                    .filter(|x| *x != fin)
                    .collect();
                objects::set_finalizers(&mut v, &f);
                Ok(v)
            },
            None,
            false,
        )
        .await;
}

async fn terminate_namespace(api: &Api, ns: &Obj, all: &[Obj]) {
    let name = objects::name(&ns.value).to_string();
    let q = Query::default();
    if ns.value.pointer("/status/phase").and_then(Value::as_str) != Some("Terminating") {
        let mut p = path_of(&ns.res, &ns.value);
        p.subresource = Some("status".into());
        let _ = api
            .guaranteed_update(
                &ns.res,
                &p,
                &q,
                None,
                false,
                |cur| {
                    let mut v = cur.cloned().unwrap_or(Value::Null);
                    v["status"] = json!({"phase": "Terminating"});
                    Ok(v)
                },
                Some("status"),
                false,
            )
            .await;
    }
    let mut remaining = 0;
    for o in all
        .iter()
        .filter(|o| o.res.info().namespaced && objects::namespace(&o.value) == name)
    {
        remaining += 1;
        if !objects::is_deleting(&o.value) {
            let _ = api
                .delete(
                    &o.res,
                    &path_of(&o.res, &o.value),
                    &q,
                    Some(json!({"propagationPolicy": "Background"})),
                )
                .await;
        }
    }
    if remaining > 0 {
        return;
    }
    let has_spec_finalizer = ns
        .value
        .pointer("/spec/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|f| f.as_str() == Some("kubernetes")));
    if has_spec_finalizer {
        let _ = api.finalize(&ns.res, &path_of(&ns.res, &ns.value)).await;
    }
}
