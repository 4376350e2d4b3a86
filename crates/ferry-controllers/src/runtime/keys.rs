//! Keys of the work queue and the mapping of watched objects to them: the object itself,
//! its owners through `ownerReferences`, and the owners whose selector matches it.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::runtime::reflector::Store;

/// `namespace/name` of an object ("" namespace for cluster-scoped kinds).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of `o` itself.
    pub fn of<K: Resource>(o: &K) -> Self {
        let m = o.meta();
        ObjectKey::new(
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    }

    /// Looks the key up in a store.
    pub fn get<K>(&self, store: &Store<K>) -> Option<std::sync::Arc<K>>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let r = kube::runtime::reflector::ObjectRef::new(&self.name);
        let r = if self.namespace.is_empty() {
            r
        } else {
            r.within(&self.namespace)
        };
        store.get(&r)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// Whether `r` points at kind `O` (group and kind; versions may differ, as upstream).
pub fn refers_to<O: Resource<DynamicType = ()>>(r: &OwnerReference) -> bool {
    r.kind == O::kind(&()) && group_of(&r.api_version) == O::group(&())
}

/// The controller reference of `meta`, if any.
pub fn controller_ref(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The key of the object's controller when it is a `O` (namespaced owners live in the
/// dependent's namespace).
pub fn controller_key<O: Resource<DynamicType = ()>>(meta: &ObjectMeta) -> Option<ObjectKey> {
    let r = controller_ref(meta).filter(|r| refers_to::<O>(r))?;
    Some(ObjectKey::new(
        meta.namespace.clone().unwrap_or_default(),
        r.name.clone(),
    ))
}

/// The keys of every owner of kind `O`.
pub fn owner_keys<O: Resource<DynamicType = ()>>(meta: &ObjectMeta) -> Vec<ObjectKey> {
    meta.owner_references
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .filter(|r| refers_to::<O>(r))
        .map(|r| ObjectKey::new(meta.namespace.clone().unwrap_or_default(), r.name.clone()))
        .collect()
}

/// The keys of the objects in `store` of namespace `ns` whose selector (as `selects` decides)
/// matches `labels`: how a pod event reaches the ReplicaSets that could adopt it.
pub fn selecting<O, F>(
    store: &Store<O>,
    ns: &str,
    labels: &BTreeMap<String, String>,
    selects: F,
) -> Vec<ObjectKey>
where
    O: Resource<DynamicType = ()> + Clone + 'static,
    F: Fn(&O, &BTreeMap<String, String>) -> bool,
{
    store
        .state()
        .iter()
        .filter(|o| o.meta().namespace.as_deref().unwrap_or("") == ns && selects(o, labels))
        .map(|o| ObjectKey::of(o.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    use k8s_openapi::api::batch::v1::Job;

    use super::*;

    fn oref(api_version: &str, kind: &str, name: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: controller.then_some(true),
            block_owner_deletion: None,
        }
    }

    #[test]
    fn maps_owner_references_by_group_and_kind() {
        let meta = ObjectMeta {
            namespace: Some("ns".into()),
            name: Some("p".into()),
            owner_references: Some(vec![
                oref("apps/v1", "ReplicaSet", "a", false),
                oref("apps/v1beta2", "ReplicaSet", "b", true),
                oref("extensions/v1beta1", "ReplicaSet", "c", false),
                oref("batch/v1", "Job", "j", false),
            ]),
            ..Default::default()
        };
        assert_eq!(
            controller_key::<ReplicaSet>(&meta),
            Some(ObjectKey::new("ns", "b"))
        );
        assert_eq!(controller_key::<Deployment>(&meta), None);
        assert_eq!(
            owner_keys::<ReplicaSet>(&meta),
            vec![ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b")]
        );
        assert_eq!(owner_keys::<Job>(&meta), vec![ObjectKey::new("ns", "j")]);
        assert_eq!(ObjectKey::new("ns", "x").to_string(), "ns/x");
        assert_eq!(ObjectKey::new("", "node1").to_string(), "node1");
    }
}
