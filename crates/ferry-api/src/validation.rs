//! Validation for every served kind, as upstream's `Validate*` functions do it.
//! STUB: to be filled in.
#![allow(unused_variables)]

use crate::errors::ErrorList;
use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking;

pub fn namespace(obj: &core::Namespace, old: Option<&core::Namespace>) -> ErrorList {
    Vec::new()
}
pub fn node(obj: &core::Node, old: Option<&core::Node>) -> ErrorList {
    Vec::new()
}
pub fn pod(obj: &core::Pod, old: Option<&core::Pod>) -> ErrorList {
    Vec::new()
}
pub fn service(obj: &core::Service, old: Option<&core::Service>) -> ErrorList {
    Vec::new()
}
pub fn endpoints(obj: &core::Endpoints, old: Option<&core::Endpoints>) -> ErrorList {
    Vec::new()
}
pub fn config_map(obj: &core::ConfigMap, old: Option<&core::ConfigMap>) -> ErrorList {
    Vec::new()
}
pub fn secret(obj: &core::Secret, old: Option<&core::Secret>) -> ErrorList {
    Vec::new()
}
pub fn core_event(obj: &core::Event, old: Option<&core::Event>) -> ErrorList {
    Vec::new()
}
pub fn service_account(obj: &core::ServiceAccount, old: Option<&core::ServiceAccount>) -> ErrorList {
    Vec::new()
}
pub fn deployment(obj: &apps::Deployment, old: Option<&apps::Deployment>) -> ErrorList {
    Vec::new()
}
pub fn replica_set(obj: &apps::ReplicaSet, old: Option<&apps::ReplicaSet>) -> ErrorList {
    Vec::new()
}
pub fn endpoint_slice(obj: &discovery::EndpointSlice, old: Option<&discovery::EndpointSlice>) -> ErrorList {
    Vec::new()
}
pub fn ingress(obj: &networking::Ingress, old: Option<&networking::Ingress>) -> ErrorList {
    Vec::new()
}
pub fn ingress_class(obj: &networking::IngressClass, old: Option<&networking::IngressClass>) -> ErrorList {
    Vec::new()
}
pub fn network_policy(obj: &networking::NetworkPolicy, old: Option<&networking::NetworkPolicy>) -> ErrorList {
    Vec::new()
}
pub fn lease(obj: &coordination::Lease, old: Option<&coordination::Lease>) -> ErrorList {
    Vec::new()
}
pub fn events_event(obj: &events::Event, old: Option<&events::Event>) -> ErrorList {
    Vec::new()
}
pub fn namespace_status(obj: &core::Namespace, old: &core::Namespace) -> ErrorList {
    Vec::new()
}
pub fn node_status(obj: &core::Node, old: &core::Node) -> ErrorList {
    Vec::new()
}
pub fn pod_status(obj: &core::Pod, old: &core::Pod) -> ErrorList {
    Vec::new()
}
pub fn service_status(obj: &core::Service, old: &core::Service) -> ErrorList {
    Vec::new()
}
pub fn deployment_status(obj: &apps::Deployment, old: &apps::Deployment) -> ErrorList {
    Vec::new()
}
pub fn replica_set_status(obj: &apps::ReplicaSet, old: &apps::ReplicaSet) -> ErrorList {
    Vec::new()
}
pub fn ingress_status(obj: &networking::Ingress, old: &networking::Ingress) -> ErrorList {
    Vec::new()
}
