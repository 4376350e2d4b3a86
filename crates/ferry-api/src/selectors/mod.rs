//! Field selectors per kind (beyond metadata.name / metadata.namespace, which are generic).
//! STUB: to be filled in.
#![allow(unused_variables)]

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking;

pub fn namespace(obj: &core::Namespace, field: &str) -> Option<String> {
    None
}
pub fn node(obj: &core::Node, field: &str) -> Option<String> {
    None
}
pub fn pod(obj: &core::Pod, field: &str) -> Option<String> {
    None
}
pub fn service(obj: &core::Service, field: &str) -> Option<String> {
    None
}
pub fn endpoints(obj: &core::Endpoints, field: &str) -> Option<String> {
    None
}
pub fn config_map(obj: &core::ConfigMap, field: &str) -> Option<String> {
    None
}
pub fn secret(obj: &core::Secret, field: &str) -> Option<String> {
    None
}
pub fn core_event(obj: &core::Event, field: &str) -> Option<String> {
    None
}
pub fn service_account(obj: &core::ServiceAccount, field: &str) -> Option<String> {
    None
}
pub fn deployment(obj: &apps::Deployment, field: &str) -> Option<String> {
    None
}
pub fn replica_set(obj: &apps::ReplicaSet, field: &str) -> Option<String> {
    None
}
pub fn endpoint_slice(obj: &discovery::EndpointSlice, field: &str) -> Option<String> {
    None
}
pub fn ingress(obj: &networking::Ingress, field: &str) -> Option<String> {
    None
}
pub fn ingress_class(obj: &networking::IngressClass, field: &str) -> Option<String> {
    None
}
pub fn network_policy(obj: &networking::NetworkPolicy, field: &str) -> Option<String> {
    None
}
pub fn lease(obj: &coordination::Lease, field: &str) -> Option<String> {
    None
}
pub fn events_event(obj: &events::Event, field: &str) -> Option<String> {
    None
}
