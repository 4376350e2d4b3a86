//! Validation for every served kind, as upstream's `Validate*` functions do it: the same checks,
//! the same field paths and the same messages (kubectl shows them to users verbatim).
//!
//! Each public function takes the object as decoded and defaulted; `old` is `Some` on update.

mod apps;
mod common;
mod core_kinds;
mod networking;
mod pod;
mod service;
pub mod storage;
pub mod workloads;

#[cfg(test)]
mod tests;

pub use storage::{
    persistent_volume, persistent_volume_claim, persistent_volume_claim_status,
    persistent_volume_status, replication_controller, replication_controller_status, storage_class,
};

pub use common::{
    allow_loopback_addresses, loopback_addresses_allowed, validate_label_selector, validate_labels,
    validate_object_meta, validate_object_meta_update,
};

use ferry_apimachinery::errors::ErrorList;
use k8s_openapi::api::apps::v1 as apps_v1;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking_v1;

pub fn namespace(obj: &core::Namespace, old: Option<&core::Namespace>) -> ErrorList {
    core_kinds::namespace(obj, old)
}
pub fn node(obj: &core::Node, old: Option<&core::Node>) -> ErrorList {
    core_kinds::node(obj, old)
}
pub fn pod(obj: &core::Pod, old: Option<&core::Pod>) -> ErrorList {
    pod::pod(obj, old)
}
pub fn service(obj: &core::Service, old: Option<&core::Service>) -> ErrorList {
    service::service(obj, old)
}
pub fn endpoints(obj: &core::Endpoints, old: Option<&core::Endpoints>) -> ErrorList {
    core_kinds::endpoints(obj, old)
}
pub fn config_map(obj: &core::ConfigMap, old: Option<&core::ConfigMap>) -> ErrorList {
    core_kinds::config_map(obj, old)
}
pub fn secret(obj: &core::Secret, old: Option<&core::Secret>) -> ErrorList {
    core_kinds::secret(obj, old)
}
pub fn core_event(obj: &core::Event, old: Option<&core::Event>) -> ErrorList {
    core_kinds::core_event(obj, old)
}
pub fn service_account(
    obj: &core::ServiceAccount,
    old: Option<&core::ServiceAccount>,
) -> ErrorList {
    core_kinds::service_account(obj, old)
}
pub fn deployment(obj: &apps_v1::Deployment, old: Option<&apps_v1::Deployment>) -> ErrorList {
    apps::deployment(obj, old)
}
pub fn replica_set(obj: &apps_v1::ReplicaSet, old: Option<&apps_v1::ReplicaSet>) -> ErrorList {
    apps::replica_set(obj, old)
}
pub fn endpoint_slice(
    obj: &discovery::EndpointSlice,
    old: Option<&discovery::EndpointSlice>,
) -> ErrorList {
    networking::endpoint_slice(obj, old)
}
pub fn ingress(obj: &networking_v1::Ingress, old: Option<&networking_v1::Ingress>) -> ErrorList {
    networking::ingress(obj, old)
}
pub fn ingress_class(
    obj: &networking_v1::IngressClass,
    old: Option<&networking_v1::IngressClass>,
) -> ErrorList {
    networking::ingress_class(obj, old)
}
pub fn network_policy(
    obj: &networking_v1::NetworkPolicy,
    old: Option<&networking_v1::NetworkPolicy>,
) -> ErrorList {
    networking::network_policy(obj, old)
}
pub fn lease(obj: &coordination::Lease, old: Option<&coordination::Lease>) -> ErrorList {
    core_kinds::lease(obj, old)
}
pub fn events_event(obj: &events::Event, old: Option<&events::Event>) -> ErrorList {
    core_kinds::events_event(obj, old)
}
pub fn namespace_status(obj: &core::Namespace, old: &core::Namespace) -> ErrorList {
    core_kinds::namespace_status(obj, old)
}
pub fn node_status(obj: &core::Node, old: &core::Node) -> ErrorList {
    core_kinds::node(obj, Some(old))
}
pub fn pod_status(obj: &core::Pod, old: &core::Pod) -> ErrorList {
    pod::pod_status(obj, old)
}
pub fn service_status(obj: &core::Service, old: &core::Service) -> ErrorList {
    service::service_status(obj, old)
}
pub fn deployment_status(obj: &apps_v1::Deployment, old: &apps_v1::Deployment) -> ErrorList {
    apps::deployment_status(obj, old)
}
pub fn replica_set_status(obj: &apps_v1::ReplicaSet, old: &apps_v1::ReplicaSet) -> ErrorList {
    apps::replica_set_status(obj, old)
}
pub fn ingress_status(obj: &networking_v1::Ingress, old: &networking_v1::Ingress) -> ErrorList {
    networking::ingress_status(obj, old)
}

/// Service `spec.topologyKeys` (Kubernetes 1.17–1.21, kept by Ferry): at most 16 keys, each a
/// qualified label key or `"*"` (only last), no duplicates, not with
/// `externalTrafficPolicy: Local` or `internalTrafficPolicy: Local`.
pub fn service_topology_keys(
    svc: &serde_json::Value,
    _old: Option<&serde_json::Value>,
) -> ErrorList {
    use ferry_apimachinery::errors::{FieldError, Path, quote};
    let Some(keys) = svc.pointer("/spec/topologyKeys") else {
        return Vec::new();
    };
    let path = Path::new("spec").child("topologyKeys");
    let Some(keys) = keys.as_array() else {
        return vec![FieldError::invalid(
            &path,
            keys.to_string(),
            "must be a list of strings",
        )];
    };
    let mut errs = Vec::new();
    if keys.is_empty() {
        return errs;
    }
    if svc
        .pointer("/spec/externalTrafficPolicy")
        .and_then(serde_json::Value::as_str)
        == Some("Local")
    {
        errs.push(FieldError::forbidden(
            &path,
            "may not be specified when `externalTrafficPolicy=Local`",
        ));
    }
    if svc
        .pointer("/spec/internalTrafficPolicy")
        .and_then(serde_json::Value::as_str)
        == Some("Local")
    {
        errs.push(FieldError::forbidden(
            &path,
            "may not be specified when `internalTrafficPolicy=Local`",
        ));
    }
    if keys.len() > 16 {
        errs.push(FieldError::too_many(&path, keys.len(), 16));
    }
    let mut seen = std::collections::HashSet::new();
    let all: Vec<String> = keys
        .iter()
        .map(|k| k.as_str().unwrap_or("").to_string())
        .collect();
    for (i, key) in keys.iter().enumerate() {
        let p = path.index(i);
        let Some(key) = key.as_str() else {
            errs.push(FieldError::invalid(&p, key.to_string(), "must be a string"));
            continue;
        };
        if !seen.insert(key) {
            errs.push(FieldError::duplicate(&p, quote(key)));
        }
        if key == "*" {
            if i != keys.len() - 1 {
                errs.push(FieldError::invalid_str(
                    &p,
                    key,
                    "\"*\" must be the last value specified",
                ));
            }
            continue;
        }
        for msg in ferry_apimachinery::names::is_qualified_name(key) {
            errs.push(FieldError::invalid(&p, format!("{all:?}"), msg));
        }
    }
    errs
}

#[cfg(test)]
mod topology_keys_tests {
    use serde_json::json;

    #[test]
    fn topology_keys() {
        let ok = json!({"spec": {"topologyKeys": ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"]}});
        assert!(super::service_topology_keys(&ok, None).is_empty());
        let cases = [
            (
                json!({"spec": {"topologyKeys": ["*", "kubernetes.io/hostname"]}}),
                "spec.topologyKeys[0]",
            ),
            (
                json!({"spec": {"topologyKeys": ["a", "a"]}}),
                "spec.topologyKeys[1]",
            ),
            (
                json!({"spec": {"topologyKeys": ["bad key!"]}}),
                "spec.topologyKeys[0]",
            ),
            (
                json!({"spec": {"externalTrafficPolicy": "Local", "topologyKeys": ["*"]}}),
                "spec.topologyKeys",
            ),
        ];
        for (svc, field) in cases {
            let errs = super::service_topology_keys(&svc, None);
            assert!(errs.iter().any(|e| e.field == field), "{svc}: {errs:?}");
        }
        let many: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
        let errs = super::service_topology_keys(&json!({"spec": {"topologyKeys": many}}), None);
        assert!(
            errs.iter().any(|e| e.body().starts_with("Too many: 17")),
            "{errs:?}"
        );
    }
}
