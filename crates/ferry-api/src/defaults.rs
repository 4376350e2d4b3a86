//! Defaulting for every served kind, as upstream's `SetDefaults_*` functions do it.
//! STUB: to be filled in.
#![allow(unused_variables)]

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking;

pub fn namespace(obj: &mut core::Namespace) {}
pub fn node(obj: &mut core::Node) {}
pub fn pod(obj: &mut core::Pod) {}
pub fn service(obj: &mut core::Service) {}
pub fn endpoints(obj: &mut core::Endpoints) {}
pub fn config_map(obj: &mut core::ConfigMap) {}
pub fn secret(obj: &mut core::Secret) {}
pub fn core_event(obj: &mut core::Event) {}
pub fn service_account(obj: &mut core::ServiceAccount) {}
pub fn deployment(obj: &mut apps::Deployment) {}
pub fn replica_set(obj: &mut apps::ReplicaSet) {}
pub fn endpoint_slice(obj: &mut discovery::EndpointSlice) {}
pub fn ingress(obj: &mut networking::Ingress) {}
pub fn ingress_class(obj: &mut networking::IngressClass) {}
pub fn network_policy(obj: &mut networking::NetworkPolicy) {}
pub fn lease(obj: &mut coordination::Lease) {}
pub fn events_event(obj: &mut events::Event) {}
