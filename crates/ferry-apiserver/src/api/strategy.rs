//! Per-kind hooks of the REST layer that need the API server (its store, its allocators, other
//! objects), as upstream's `registry/<group>/<kind>/strategy.go` and REST storages add them to
//! the generic store: `AllowCreateOnUpdate`, `CheckGracefulDelete`, admission and `BeginCreate`
//! / `BeginUpdate` (Service allocation), `AfterDelete` (releasing what an object held), and the
//! finalizers kept outside `metadata.finalizers` (a Namespace's `spec.finalizers`).
//!
//! The kind-independent hooks (defaulting, `PrepareForCreate/Update`, validation, printing)
//! are `ferry_api::kinds::Strategy`; these complement them. Every kind is registered once, in
//! [`REGISTRY`]; a kind not listed gets [`Generic`].

use futures::future::BoxFuture;
use serde_json::Value;

use super::{Api, Resource};
use crate::alloc::Txn;
use crate::status::ApiError;
use ferry_api::errors::{ErrorType, FieldError};
use ferry_api::kinds::KindInfo;

/// What a create of a kind needs besides the generic steps.
pub struct CreateContext<'a> {
    pub api: &'a Api,
    pub res: &'a Resource,
    /// The namespace from the URL.
    pub namespace: Option<&'a str>,
    /// How admission names the object in a refusal: its name, else its generateName.
    pub requested_name: &'a str,
    pub dry_run: bool,
}

/// The REST layer's per-kind hooks (upstream's REST strategies). Every method has the generic
/// behaviour as its default.
pub trait RestStrategy: Send + Sync {
    /// A PUT (or an apply patch) of a missing object creates it (upstream
    /// `AllowCreateOnUpdate`).
    fn allow_create_on_update(&self) -> bool {
        false
    }

    /// The kind's own subresources besides `status` and `scale` (upstream's extra REST
    /// storages: a Pod's `binding` and `eviction`, a Namespace's `finalize`).
    fn subresources(&self) -> &'static [&'static str] {
        &[]
    }

    /// Finalizers outside `metadata.finalizers` that also hold the object's deletion.
    fn spec_finalizers(&self, _obj: &Value) -> Vec<String> {
        Vec::new()
    }

    /// Upstream `CheckGracefulDelete`: `Some(grace)` when deleting `obj` is graceful (it is
    /// marked and something else removes it after the grace period), `requested` being the
    /// DeleteOptions' grace period; `None` deletes without grace.
    fn graceful_delete(&self, _obj: &Value, _requested: Option<i64>) -> Option<i64> {
        None
    }

    /// Changes to an update of the main resource after the kind's own `prepare_update` and
    /// defaulting, before validation.
    fn prepare_update(&self, _new: &mut Value, _old: &Value) {}

    /// A validation error of an update that a later step settles (and validates again).
    fn deferred(&self, _e: &FieldError) -> bool {
        false
    }

    /// Admission and allocation of a create, after defaulting and before validation: may
    /// change the object, refuse it, or claim store keys the write then commits or rolls
    /// back. `Ok(None)`: nothing claimed; `Ok(Some(_))`: claimed, after checking that the
    /// namespace exists and is not terminating (the generic step then skips that check).
    fn admit_create<'a: 'b, 'b>(
        &'b self,
        _cx: CreateContext<'a>,
        _obj: &'b mut Value,
    ) -> BoxFuture<'b, Result<Option<Txn<'a>>, ApiError>> {
        Box::pin(async { Ok(None) })
    }

    /// Allocation for an update of the main resource, after validation: claims store keys the
    /// write then commits or rolls back (and validates again what it filled in).
    fn begin_update<'a: 'b, 'b>(
        &'b self,
        _api: &'a Api,
        _res: &'b Resource,
        _new: &'b mut Value,
        _old: &'b Value,
        _dry_run: bool,
    ) -> BoxFuture<'b, Result<Option<Txn<'a>>, ApiError>> {
        Box::pin(async { Ok(None) })
    }

    /// After the object was removed for good: frees what it held.
    fn after_remove<'a>(&'a self, _api: &'a Api, _last: &'a Value) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// Kinds with nothing beyond the generic store.
pub struct Generic;
impl RestStrategy for Generic {}

/// Endpoints, Events, Leases: written by controllers with PUT whether or not they exist.
pub struct CreateOnUpdate;
impl RestStrategy for CreateOnUpdate {
    fn allow_create_on_update(&self) -> bool {
        true
    }
}

/// Pods: namespace lifecycle and ServiceAccount admission on create; a pod bound to a node
/// and not finished terminates gracefully (its node agent removes it).
pub struct PodStrategy;
impl RestStrategy for PodStrategy {
    fn subresources(&self) -> &'static [&'static str] {
        &["binding", "eviction", "ephemeralcontainers"]
    }

    fn graceful_delete(&self, obj: &Value, requested: Option<i64>) -> Option<i64> {
        let bound = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let terminal = matches!(
            obj.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        if !bound || terminal {
            return None;
        }
        Some(requested.unwrap_or_else(|| {
            obj.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(30)
        }))
    }

    fn admit_create<'a: 'b, 'b>(
        &'b self,
        cx: CreateContext<'a>,
        obj: &'b mut Value,
    ) -> BoxFuture<'b, Result<Option<Txn<'a>>, ApiError>> {
        Box::pin(async move {
            // NamespaceLifecycle comes before ServiceAccount in upstream's chain.
            cx.api.check_namespace(cx.res, cx.namespace).await?;
            crate::admission::service_account(
                cx.api,
                obj,
                cx.namespace.unwrap_or(""),
                cx.requested_name,
            )
            .await?;
            crate::admission::defaults::toleration_seconds(obj);
            Ok(None)
        })
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        // DefaultTolerationSeconds runs on updates too.
        crate::admission::defaults::toleration_seconds(new);
    }
}

/// Ingresses: `DefaultIngressClass` on create.
pub struct IngressStrategy;
impl RestStrategy for IngressStrategy {
    fn admit_create<'a: 'b, 'b>(
        &'b self,
        cx: CreateContext<'a>,
        obj: &'b mut Value,
    ) -> BoxFuture<'b, Result<Option<Txn<'a>>, ApiError>> {
        Box::pin(async move {
            crate::admission::default_ingress_class(cx.api, obj);
            Ok(None)
        })
    }
}

/// Services: ClusterIPs and node ports are claimed as store keys before the write (upstream's
/// `BeginCreate` / `BeginUpdate`) and freed when the Service goes.
pub struct ServiceStrategy;
impl RestStrategy for ServiceStrategy {
    fn prepare_update(&self, new: &mut Value, old: &Value) {
        crate::alloc::prepare_update(new, old);
    }

    fn deferred(&self, e: &FieldError) -> bool {
        // Filled in by allocation (and validated again then).
        e.field == "spec.healthCheckNodePort" && e.kind == ErrorType::Required
    }

    fn admit_create<'a: 'b, 'b>(
        &'b self,
        cx: CreateContext<'a>,
        obj: &'b mut Value,
    ) -> BoxFuture<'b, Result<Option<Txn<'a>>, ApiError>> {
        Box::pin(async move {
            let name = crate::objects::name(obj).to_string();
            if name.is_empty() {
                // Refused by validation; nothing to claim.
                return Ok(None);
            }
            cx.api.check_namespace(cx.res, cx.namespace).await?;
            let key = cx.res.key(cx.namespace, &name);
            if cx.api.store.get(&key).await?.is_some() {
                return Err(ApiError::already_exists(cx.res.info(), &name));
            }
            let txn = cx
                .api
                .services
                .allocate_create(cx.api.store.as_ref(), obj, cx.dry_run)
                .await?;
            Ok(Some(txn))
        })
    }

    fn begin_update<'a: 'b, 'b>(
        &'b self,
        api: &'a Api,
        res: &'b Resource,
        new: &'b mut Value,
        old: &'b Value,
        dry_run: bool,
    ) -> BoxFuture<'b, Result<Option<Txn<'a>>, ApiError>> {
        Box::pin(async move {
            let txn = api
                .services
                .allocate_update(api.store.as_ref(), new, old, dry_run)
                .await?;
            let errs = res.strategy.validate(new, Some(old));
            if !errs.is_empty() {
                txn.rollback().await;
                return Err(ApiError::invalid(
                    res.info(),
                    crate::objects::name(old),
                    &errs,
                ));
            }
            Ok(Some(txn))
        })
    }

    fn after_remove<'a>(&'a self, api: &'a Api, last: &'a Value) -> BoxFuture<'a, ()> {
        Box::pin(async move { api.services.release(api.store.as_ref(), last).await })
    }
}

/// Namespaces: `spec.finalizers` (the namespace controller's `kubernetes`) hold the deletion
/// too; `/finalize` writes them.
pub struct NamespaceStrategy;
impl RestStrategy for NamespaceStrategy {
    fn subresources(&self) -> &'static [&'static str] {
        &["finalize"]
    }

    fn spec_finalizers(&self, obj: &Value) -> Vec<String> {
        obj.pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// PersistentVolumeClaims: namespace lifecycle, then `DefaultStorageClass` and
/// `StorageObjectInUseProtection` admission on create.
pub struct ClaimStrategy;
impl RestStrategy for ClaimStrategy {
    fn admit_create<'a: 'b, 'b>(
        &'b self,
        cx: CreateContext<'a>,
        obj: &'b mut Value,
    ) -> BoxFuture<'b, Result<Option<Txn<'a>>, ApiError>> {
        Box::pin(async move {
            cx.api.check_namespace(cx.res, cx.namespace).await?;
            crate::admission::persistent_volume_claim(cx.api, obj);
            Ok(None)
        })
    }
}

/// PersistentVolumes: `StorageObjectInUseProtection` admission on create.
pub struct VolumeStrategy;
impl RestStrategy for VolumeStrategy {
    fn admit_create<'a: 'b, 'b>(
        &'b self,
        _cx: CreateContext<'a>,
        obj: &'b mut Value,
    ) -> BoxFuture<'b, Result<Option<Txn<'a>>, ApiError>> {
        Box::pin(async move {
            crate::admission::storage::add_finalizer(obj, crate::admission::storage::PV_PROTECTION);
            Ok(None)
        })
    }
}

/// `(group, kind)` → its hooks; the kinds not listed are [`Generic`]. An empty kind stands for
/// every kind of the group.
pub static REGISTRY: &[(&str, &str, &dyn RestStrategy)] = &[
    ("", "Pod", &PodStrategy),
    ("", "Service", &ServiceStrategy),
    ("", "Namespace", &NamespaceStrategy),
    ("networking.k8s.io", "Ingress", &IngressStrategy),
    ("", "PersistentVolumeClaim", &ClaimStrategy),
    ("", "PersistentVolume", &VolumeStrategy),
    ("", "Endpoints", &CreateOnUpdate),
    ("", "Event", &CreateOnUpdate),
    ("coordination.k8s.io", "Lease", &CreateOnUpdate),
    ("events.k8s.io", "", &CreateOnUpdate),
];

/// The hooks of a kind.
pub fn for_kind(info: &KindInfo) -> &'static dyn RestStrategy {
    REGISTRY
        .iter()
        .find(|(g, k, _)| *g == info.group && (k.is_empty() || *k == info.kind))
        .map(|(_, _, s)| *s)
        .unwrap_or(&Generic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info(group: &'static str, kind: &'static str) -> KindInfo {
        let mut i = ferry_api::kinds::all()
            .iter()
            .map(|s| s.info().clone())
            .next()
            .expect("a kind");
        i.group = group;
        i.kind = kind;
        i
    }

    #[test]
    fn registry() {
        let create_on_update = |g, k| for_kind(&info(g, k)).allow_create_on_update();
        let table = [
            ("", "Endpoints", true),
            ("", "Event", true),
            ("coordination.k8s.io", "Lease", true),
            ("events.k8s.io", "Event", true),
            ("", "Pod", false),
            ("", "ConfigMap", false),
            ("apps", "Deployment", false),
            // Same kind name, other group: not the core kind's hooks.
            ("example.com", "Event", false),
        ];
        for (g, k, want) in table {
            assert_eq!(create_on_update(g, k), want, "{g}/{k}");
        }
        let ns = json!({"spec": {"finalizers": ["kubernetes"]}});
        assert_eq!(
            for_kind(&info("", "Namespace")).spec_finalizers(&ns),
            vec!["kubernetes".to_string()]
        );
        assert!(
            for_kind(&info("example.com", "Namespace"))
                .spec_finalizers(&ns)
                .is_empty()
        );
        assert!(
            for_kind(&info("", "Namespace"))
                .spec_finalizers(&json!({}))
                .is_empty()
        );
        let subresources = |g, k| for_kind(&info(g, k)).subresources();
        assert_eq!(
            subresources("", "Pod"),
            ["binding", "eviction", "ephemeralcontainers"]
        );
        assert_eq!(subresources("", "Namespace"), ["finalize"]);
        assert!(subresources("example.com", "Namespace").is_empty());
        assert!(subresources("", "Service").is_empty());
    }

    #[test]
    fn pod_graceful_delete() {
        let pod = |node: &str, phase: &str, tgps: Option<i64>| {
            let mut p = json!({"spec": {"nodeName": node}, "status": {"phase": phase}});
            if let Some(t) = tgps {
                p["spec"]["terminationGracePeriodSeconds"] = json!(t);
            }
            p
        };
        let s = PodStrategy;
        let table = [
            // (pod, requested, want)
            (pod("", "Pending", None), None, None),
            (pod("", "Pending", None), Some(10), None),
            (pod("n1", "Running", None), None, Some(30)),
            (pod("n1", "Running", Some(5)), None, Some(5)),
            (pod("n1", "Running", Some(5)), Some(0), Some(0)),
            (pod("n1", "Running", Some(5)), Some(60), Some(60)),
            (pod("n1", "Succeeded", None), None, None),
            (pod("n1", "Failed", Some(5)), Some(3), None),
        ];
        for (p, requested, want) in table {
            assert_eq!(s.graceful_delete(&p, requested), want, "{p} {requested:?}");
        }
        assert_eq!(
            Generic.graceful_delete(&pod("n1", "Running", None), None),
            None
        );
    }

    #[test]
    fn service_defers_health_check_node_port() {
        let required = FieldError::required("spec.healthCheckNodePort", "");
        let other = FieldError::required("spec.ports", "");
        assert!(ServiceStrategy.deferred(&required));
        assert!(!ServiceStrategy.deferred(&other));
        assert!(!Generic.deferred(&required));
    }
}
