//! Label and field selectors, and the field-selector fields each kind supports beyond
//! `metadata.name` / `metadata.namespace` (which the server handles for every kind), as upstream
//! registers them (`GetAttrs` / `SelectableFields` and the field-label conversion functions).
//!
//! A per-kind function answers `None` when the kind does not support the field; the server turns
//! that into `400 field label not supported: <field>`.

mod error;
pub mod fields;
pub mod labels;

#[cfg(test)]
mod tests;

pub use error::SelectorError;
pub use fields::{FieldSelector, FieldTerm, escape_value, parse_field_selector, unescape_value};
pub use labels::{
    LabelSelector, Operator, Requirement, format_label_selector, format_labels,
    from_label_selector, from_optional_label_selector, parse_label_selector, selector_from_map,
};

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking;

fn s(v: &Option<String>) -> Option<String> {
    Some(v.clone().unwrap_or_default())
}

pub fn namespace(obj: &core::Namespace, field: &str) -> Option<String> {
    match field {
        "status.phase" => s(&obj.status.as_ref().and_then(|st| st.phase.clone())),
        _ => None,
    }
}

pub fn node(obj: &core::Node, field: &str) -> Option<String> {
    match field {
        "spec.unschedulable" => Some(
            obj.spec
                .as_ref()
                .and_then(|sp| sp.unschedulable)
                .unwrap_or(false)
                .to_string(),
        ),
        _ => None,
    }
}

pub fn pod(obj: &core::Pod, field: &str) -> Option<String> {
    let spec = obj.spec.as_ref();
    let status = obj.status.as_ref();
    match field {
        // `spec.host` is the old name of `spec.nodeName`, still accepted.
        "spec.nodeName" | "spec.host" => s(&spec.and_then(|sp| sp.node_name.clone())),
        "spec.restartPolicy" => s(&spec.and_then(|sp| sp.restart_policy.clone())),
        "spec.schedulerName" => s(&spec.and_then(|sp| sp.scheduler_name.clone())),
        "spec.serviceAccountName" => s(&spec.and_then(|sp| sp.service_account_name.clone())),
        "spec.hostNetwork" => Some(
            spec.and_then(|sp| sp.host_network)
                .unwrap_or(false)
                .to_string(),
        ),
        "status.phase" => s(&status.and_then(|st| st.phase.clone())),
        "status.podIP" => {
            let from_list = status
                .and_then(|st| st.pod_ips.as_ref())
                .and_then(|ips| ips.first())
                .map(|ip| ip.ip.clone());
            s(&from_list.or_else(|| status.and_then(|st| st.pod_ip.clone())))
        }
        "status.nominatedNodeName" => s(&status.and_then(|st| st.nominated_node_name.clone())),
        _ => None,
    }
}

pub fn service(obj: &core::Service, field: &str) -> Option<String> {
    let spec = obj.spec.as_ref();
    match field {
        "spec.clusterIP" => s(&spec.and_then(|sp| sp.cluster_ip.clone())),
        "spec.type" => s(&spec.and_then(|sp| sp.type_.clone())),
        _ => None,
    }
}

pub fn endpoints(_obj: &core::Endpoints, _field: &str) -> Option<String> {
    None
}

pub fn config_map(_obj: &core::ConfigMap, _field: &str) -> Option<String> {
    None
}

pub fn secret(obj: &core::Secret, field: &str) -> Option<String> {
    match field {
        "type" => s(&obj.type_),
        _ => None,
    }
}

pub fn core_event(obj: &core::Event, field: &str) -> Option<String> {
    let io = &obj.involved_object;
    match field {
        "involvedObject.kind" => s(&io.kind),
        "involvedObject.namespace" => s(&io.namespace),
        "involvedObject.name" => s(&io.name),
        "involvedObject.uid" => s(&io.uid),
        "involvedObject.apiVersion" => s(&io.api_version),
        "involvedObject.resourceVersion" => s(&io.resource_version),
        "involvedObject.fieldPath" => s(&io.field_path),
        "reason" => s(&obj.reason),
        "reportingComponent" => s(&obj.reporting_component),
        "source" => {
            let component = obj
                .source
                .as_ref()
                .and_then(|src| src.component.clone())
                .filter(|c| !c.is_empty());
            s(&component.or_else(|| obj.reporting_component.clone()))
        }
        "type" => s(&obj.type_),
        _ => None,
    }
}

pub fn service_account(_obj: &core::ServiceAccount, _field: &str) -> Option<String> {
    None
}

pub fn deployment(_obj: &apps::Deployment, _field: &str) -> Option<String> {
    None
}

pub fn replica_set(obj: &apps::ReplicaSet, field: &str) -> Option<String> {
    match field {
        "status.replicas" => Some(
            obj.status
                .as_ref()
                .map(|st| st.replicas)
                .unwrap_or(0)
                .to_string(),
        ),
        _ => None,
    }
}

pub fn endpoint_slice(_obj: &discovery::EndpointSlice, _field: &str) -> Option<String> {
    None
}

pub fn ingress(_obj: &networking::Ingress, _field: &str) -> Option<String> {
    None
}

pub fn ingress_class(_obj: &networking::IngressClass, _field: &str) -> Option<String> {
    None
}

pub fn network_policy(_obj: &networking::NetworkPolicy, _field: &str) -> Option<String> {
    None
}

pub fn lease(_obj: &coordination::Lease, _field: &str) -> Option<String> {
    None
}

/// events.k8s.io names for the core Event's selectable fields (`regarding.*` for
/// `involvedObject.*`, `reportingController` for `reportingComponent`).
pub fn events_event(obj: &events::Event, field: &str) -> Option<String> {
    let regarding = obj.regarding.clone().unwrap_or_default();
    match field {
        "regarding.kind" => s(&regarding.kind),
        "regarding.namespace" => s(&regarding.namespace),
        "regarding.name" => s(&regarding.name),
        "regarding.uid" => s(&regarding.uid),
        "regarding.apiVersion" => s(&regarding.api_version),
        "regarding.resourceVersion" => s(&regarding.resource_version),
        "regarding.fieldPath" => s(&regarding.field_path),
        "reason" => s(&obj.reason),
        "reportingController" => s(&obj.reporting_controller),
        "type" => s(&obj.type_),
        _ => None,
    }
}

pub fn replication_controller(obj: &core::ReplicationController, field: &str) -> Option<String> {
    match field {
        "status.replicas" => Some(
            obj.status
                .as_ref()
                .map(|st| st.replicas)
                .unwrap_or(0)
                .to_string(),
        ),
        _ => None,
    }
}

pub fn persistent_volume(obj: &core::PersistentVolume, field: &str) -> Option<String> {
    match field {
        "status.phase" => Some(
            obj.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
        ),
        _ => None,
    }
}

pub fn persistent_volume_claim(obj: &core::PersistentVolumeClaim, field: &str) -> Option<String> {
    match field {
        "status.phase" => Some(
            obj.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
        ),
        _ => None,
    }
}

pub fn storage_class(
    _obj: &k8s_openapi::api::storage::v1::StorageClass,
    _field: &str,
) -> Option<String> {
    None
}
