//! Kinds that Ferry defines itself (not in `k8s-openapi`), each with its strategy functions.

pub mod cluster_cidr_config;
pub mod crd;
pub mod resource;
