//! An index of objects by their controller's uid (client-go's controller-ref indexers), kept
//! current from reflector changes: how a controller finds the objects it owns, and the
//! orphans of a namespace it may adopt, without scanning the whole cache.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use kube::Resource;

use super::keys::{ObjectKey, controller_ref};
use super::reflect::Change;

#[derive(Debug, Default)]
struct Inner {
    by_uid: HashMap<String, BTreeSet<ObjectKey>>,
    orphans: HashMap<String, BTreeSet<ObjectKey>>,
}

/// Objects of one kind by controller uid, and the uncontrolled ones by namespace.
#[derive(Debug, Default)]
pub struct ControllerIndex {
    inner: Mutex<Inner>,
}

impl ControllerIndex {
    /// A panicking holder leaves the maps consistent (single operations): take the lock over.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a reflector change (remove the old version, add the new one).
    pub fn update<K: Resource>(&self, ch: &Change<'_, K>) {
        let mut g = self.lock();
        if let Some(o) = ch.old {
            remove(&mut g, o);
        }
        if let Some(n) = ch.new {
            let key = ObjectKey::of(n);
            match controller_ref(n.meta()) {
                Some(r) => g.by_uid.entry(r.uid.clone()).or_default().insert(key),
                None => g
                    .orphans
                    .entry(key.namespace.clone())
                    .or_default()
                    .insert(key),
            };
        }
    }

    /// The objects whose controller has `uid`.
    pub fn controlled_by(&self, uid: &str) -> Vec<ObjectKey> {
        self.lock()
            .by_uid
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The objects of namespace `ns` without a controller.
    pub fn orphans_in(&self, ns: &str) -> Vec<ObjectKey> {
        self.lock()
            .orphans
            .get(ns)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

fn remove<K: Resource>(g: &mut Inner, o: &K) {
    let key = ObjectKey::of(o);
    let (map, slot) = match controller_ref(o.meta()) {
        Some(r) => (&mut g.by_uid, r.uid.clone()),
        None => (&mut g.orphans, key.namespace.clone()),
    };
    if let Some(set) = map.get_mut(&slot) {
        set.remove(&key);
        if set.is_empty() {
            map.remove(&slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn pod(name: &str, owner: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("ns".into());
        p.metadata.name = Some(name.into());
        p.metadata.owner_references = owner.map(|u| {
            vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                uid: u.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]
        });
        p
    }

    #[test]
    fn follows_adoption_release_and_delete() {
        let ix = ControllerIndex::default();
        let a0 = pod("a", None);
        ix.update(&Change {
            old: None,
            new: Some(&a0),
        });
        assert_eq!(ix.orphans_in("ns"), vec![ObjectKey::new("ns", "a")]);
        let a1 = pod("a", Some("u1"));
        ix.update(&Change {
            old: Some(&a0),
            new: Some(&a1),
        });
        assert!(ix.orphans_in("ns").is_empty());
        assert_eq!(ix.controlled_by("u1"), vec![ObjectKey::new("ns", "a")]);
        let b = pod("b", Some("u1"));
        ix.update(&Change {
            old: None,
            new: Some(&b),
        });
        assert_eq!(ix.controlled_by("u1").len(), 2);
        ix.update(&Change {
            old: Some(&a1),
            new: Some(&a0),
        });
        assert_eq!(ix.controlled_by("u1"), vec![ObjectKey::new("ns", "b")]);
        ix.update(&Change {
            old: Some(&b),
            new: None,
        });
        assert!(ix.controlled_by("u1").is_empty());
        assert_eq!(ix.orphans_in("ns").len(), 1);
    }
}
