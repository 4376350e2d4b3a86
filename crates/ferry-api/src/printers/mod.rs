//! Table printers for every served kind: the columns and cells upstream's printers produce.
//! STUB: to be filled in.
#![allow(unused_variables)]

use serde_json::Value;
use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking;

pub fn namespace(obj: &core::Namespace) -> Vec<Value> {
    Vec::new()
}
pub fn node(obj: &core::Node) -> Vec<Value> {
    Vec::new()
}
pub fn pod(obj: &core::Pod) -> Vec<Value> {
    Vec::new()
}
pub fn service(obj: &core::Service) -> Vec<Value> {
    Vec::new()
}
pub fn endpoints(obj: &core::Endpoints) -> Vec<Value> {
    Vec::new()
}
pub fn config_map(obj: &core::ConfigMap) -> Vec<Value> {
    Vec::new()
}
pub fn secret(obj: &core::Secret) -> Vec<Value> {
    Vec::new()
}
pub fn core_event(obj: &core::Event) -> Vec<Value> {
    Vec::new()
}
pub fn service_account(obj: &core::ServiceAccount) -> Vec<Value> {
    Vec::new()
}
pub fn deployment(obj: &apps::Deployment) -> Vec<Value> {
    Vec::new()
}
pub fn replica_set(obj: &apps::ReplicaSet) -> Vec<Value> {
    Vec::new()
}
pub fn endpoint_slice(obj: &discovery::EndpointSlice) -> Vec<Value> {
    Vec::new()
}
pub fn ingress(obj: &networking::Ingress) -> Vec<Value> {
    Vec::new()
}
pub fn ingress_class(obj: &networking::IngressClass) -> Vec<Value> {
    Vec::new()
}
pub fn network_policy(obj: &networking::NetworkPolicy) -> Vec<Value> {
    Vec::new()
}
pub fn lease(obj: &coordination::Lease) -> Vec<Value> {
    Vec::new()
}
pub fn events_event(obj: &events::Event) -> Vec<Value> {
    Vec::new()
}

/// Column definitions per kind.
pub mod columns {
    use crate::kinds::Column;

    pub fn namespace() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn node() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn pod() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn service() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn endpoints() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn config_map() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn secret() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn core_event() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn service_account() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn deployment() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn replica_set() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn endpoint_slice() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn ingress() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn ingress_class() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn network_policy() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn lease() -> Vec<Column> {
        vec![Column::name_column()]
    }
    pub fn events_event() -> Vec<Column> {
        vec![Column::name_column()]
    }
}
