//! The repair loop: frees allocation keys whose Service is gone (leaked by a crash between the
//! claim and the Service write, or by a delete path that did not release) and reports Services
//! whose addresses or ports are not held for them (re-claiming free ones, an Event otherwise).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ferry_store::{RangeOptions, Revision, Store, StoreError};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{IP_PREFIX, Owner, PORT_PREFIX, held_keys};
use crate::api::Api;

/// One stored allocation key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    pub key: String,
    pub holder: Option<Owner>,
    pub mod_revision: Revision,
}

/// What one repair pass decides (pure).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Leaked keys to delete (seen leaked with the same revision in the previous pass too).
    pub free: Vec<(String, Revision)>,
    /// Keys a Service uses that nobody holds: claim them for it.
    pub reclaim: Vec<(String, Owner)>,
    /// A Service uses a key another Service holds.
    pub duplicates: Vec<(Owner, String, Option<Owner>)>,
    /// Keys leaked in this pass (to confirm next pass).
    pub suspects: HashMap<String, Revision>,
}

/// Decides a repair pass from the Services (with the keys they use) and the stored keys.
pub fn plan(
    services: &[(Owner, Vec<String>)],
    keys: &[HeldKey],
    previous_suspects: &HashMap<String, Revision>,
) -> Plan {
    let mut p = Plan::default();
    let stored: HashMap<&str, &HeldKey> = keys.iter().map(|k| (k.key.as_str(), k)).collect();
    let mut used_by: HashMap<&str, Vec<&Owner>> = HashMap::new();
    for (owner, ks) in services {
        for k in ks {
            used_by.entry(k.as_str()).or_default().push(owner);
        }
    }
    for k in keys {
        let holder_uses = k.holder.as_ref().is_some_and(|h| {
            used_by
                .get(k.key.as_str())
                .is_some_and(|us| us.iter().any(|u| u.uid == h.uid))
        });
        if holder_uses {
            continue;
        }
        if previous_suspects.get(&k.key) == Some(&k.mod_revision) {
            p.free.push((k.key.clone(), k.mod_revision));
        } else {
            p.suspects.insert(k.key.clone(), k.mod_revision);
        }
    }
    let mut reclaimed = HashSet::new();
    for (owner, ks) in services {
        for k in ks {
            match stored.get(k.as_str()) {
                Some(h) if h.holder.as_ref().is_some_and(|h| h.uid == owner.uid) => {}
                Some(h) => {
                    // Held by someone else (or unreadable): a duplicate, unless that holder is
                    // gone, in which case the key is freed (above) and re-claimed next pass.
                    let holder_alive = h.holder.as_ref().is_some_and(|hh| {
                        services
                            .iter()
                            .any(|(o, ks)| o.uid == hh.uid && ks.contains(k))
                    });
                    if holder_alive {
                        p.duplicates
                            .push((owner.clone(), k.clone(), h.holder.clone()));
                    }
                }
                None => {
                    if reclaimed.insert(k.clone()) {
                        p.reclaim.push((k.clone(), owner.clone()));
                    } else {
                        p.duplicates.push((owner.clone(), k.clone(), None));
                    }
                }
            }
        }
    }
    p
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub freed: Vec<String>,
    pub reclaimed: Vec<String>,
    pub duplicates: Vec<(Owner, String)>,
}

/// One repair pass against the store; `suspects` carries leak candidates between passes.
pub async fn repair_once(
    store: &dyn Store,
    suspects: &mut HashMap<String, Revision>,
) -> Result<Report, StoreError> {
    let svcs = store
        .range("/registry/services/", RangeOptions::default())
        .await?;
    let mut services = Vec::new();
    for kv in &svcs.kvs {
        if let Ok(v) = serde_json::from_slice::<Value>(&kv.value) {
            services.push((Owner::of(&v), held_keys(&v)));
        }
    }
    let mut keys = Vec::new();
    for prefix in [IP_PREFIX, PORT_PREFIX] {
        for kv in store.range(prefix, RangeOptions::default()).await?.kvs {
            keys.push(HeldKey {
                holder: serde_json::from_slice(&kv.value).ok(),
                key: kv.key,
                mod_revision: kv.mod_revision,
            });
        }
    }
    let p = plan(&services, &keys, suspects);
    let mut report = Report::default();
    for (k, rev) in &p.free {
        match store.delete(k, Some(*rev)).await {
            Ok(_) => report.freed.push(k.clone()),
            Err(StoreError::NotFound | StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    for (k, owner) in &p.reclaim {
        let v = bytes::Bytes::from(serde_json::to_vec(owner).unwrap_or_default());
        match store.create(k, v).await {
            Ok(_) => report.reclaimed.push(k.clone()),
            Err(StoreError::AlreadyExists) => {}
            Err(e) => return Err(e),
        }
    }
    for (o, k, _) in &p.duplicates {
        report.duplicates.push((o.clone(), k.clone()));
    }
    *suspects = p.suspects;
    Ok(report)
}

fn reason(key: &str, duplicate: bool) -> (&'static str, String) {
    let ip = key.starts_with(IP_PREFIX);
    let what = key
        .strip_prefix(IP_PREFIX)
        .or_else(|| key.strip_prefix(PORT_PREFIX))
        .unwrap_or(key)
        .to_string();
    match (ip, duplicate) {
        (true, true) => (
            "ClusterIPAlreadyAllocated",
            format!("Cluster IP {what} was assigned to multiple services; please recreate service"),
        ),
        (true, false) => (
            "ClusterIPNotAllocated",
            format!("Cluster IP {what} is not allocated; repairing"),
        ),
        (false, true) => (
            "PortAlreadyAllocated",
            format!("Port {what} was assigned to multiple services; please recreate service"),
        ),
        (false, false) => (
            "PortNotAllocated",
            format!("Port {what} is not allocated; repairing"),
        ),
    }
}

async fn event(api: &Api, owner: &Owner, key: &str, duplicate: bool) {
    let Some(res) = api.resource("", "v1", "events").cloned() else {
        return;
    };
    let (reason, message) = reason(key, duplicate);
    let now = crate::objects::now_rfc3339();
    let body = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{}.", owner.name), "namespace": owner.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Service", "namespace": owner.namespace,
                           "name": owner.name, "uid": owner.uid},
        "reason": reason, "message": message,
        "type": if duplicate { "Warning" } else { "Normal" },
        "source": {"component": "ipallocator-repair-controller"},
        "reportingComponent": "ipallocator-repair-controller",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    let p = crate::request::ResourcePath {
        group: String::new(),
        version: "v1".into(),
        namespace: Some(owner.namespace.clone()),
        resource: "events".into(),
        name: None,
        subresource: None,
    };
    if let Err(e) = api
        .create(&res, &p, &crate::request::Query::default(), body)
        .await
    {
        tracing::debug!("repair event: {}", e.message);
    }
}

/// Runs a repair pass every `interval` until `shutdown`.
pub async fn run(api: Arc<Api>, interval: Duration, shutdown: CancellationToken) {
    let mut suspects = HashMap::new();
    let mut reported: HashSet<(String, String)> = HashSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match repair_once(api.store.as_ref(), &mut suspects).await {
            Ok(r) => {
                for k in &r.freed {
                    tracing::info!("allocation repair: freed leaked {k}");
                }
                for (o, k) in &r.duplicates {
                    if reported.insert((o.uid.clone(), k.clone())) {
                        tracing::warn!(
                            "allocation repair: {}/{} uses {k} held by another Service",
                            o.namespace,
                            o.name
                        );
                        event(&api, o, k, true).await;
                    }
                }
                for k in &r.reclaimed {
                    tracing::info!("allocation repair: re-claimed {k}");
                }
            }
            Err(e) => tracing::warn!("allocation repair: {e}"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn o(uid: &str) -> Owner {
        Owner {
            namespace: "default".into(),
            name: format!("svc-{uid}"),
            uid: uid.into(),
        }
    }
    fn hk(key: &str, uid: &str, rev: Revision) -> HeldKey {
        HeldKey {
            key: key.into(),
            holder: Some(o(uid)),
            mod_revision: rev,
        }
    }

    #[test]
    fn leaked_keys_freed_on_second_sighting() {
        let keys = vec![hk("/registry/ipaddresses/10.0.0.9", "gone", 5)];
        let p1 = plan(&[], &keys, &HashMap::new());
        assert!(p1.free.is_empty());
        assert_eq!(p1.suspects.get("/registry/ipaddresses/10.0.0.9"), Some(&5));
        let p2 = plan(&[], &keys, &p1.suspects);
        assert_eq!(
            p2.free,
            vec![("/registry/ipaddresses/10.0.0.9".to_string(), 5)]
        );
        // Re-written in between (new revision): not freed.
        let keys3 = vec![hk("/registry/ipaddresses/10.0.0.9", "gone", 6)];
        assert!(plan(&[], &keys3, &p1.suspects).free.is_empty());
    }

    #[test]
    fn missing_reclaimed_and_duplicates_reported() {
        let k = "/registry/ipaddresses/10.0.0.1".to_string();
        let services = vec![(o("a"), vec![k.clone()]), (o("b"), vec![k.clone()])];
        // Nobody holds it: the first user re-claims it, the second is a duplicate.
        let p = plan(&services, &[], &HashMap::new());
        assert_eq!(p.reclaim, vec![(k.clone(), o("a"))]);
        assert_eq!(p.duplicates.len(), 1);
        assert_eq!(p.duplicates[0].0, o("b"));
        // a holds it: b is a duplicate, nothing freed.
        let p = plan(&services, &[hk(&k, "a", 3)], &HashMap::new());
        assert!(p.reclaim.is_empty() && p.suspects.is_empty());
        assert_eq!(p.duplicates[0].0, o("b"));
        // Healthy.
        let p = plan(&services[..1], &[hk(&k, "a", 3)], &HashMap::new());
        assert_eq!(p, Plan::default());
    }
}
