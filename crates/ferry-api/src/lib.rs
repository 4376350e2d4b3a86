//! Ferry's API types and the per-kind registry: every served kind's `Strategy` (decoding,
//! defaulting, validation, Table printing, selectors) and the patches. No IO.
//!
//! The concerns below the registry live in their own crates (so they build in parallel) and are
//! re-exported here under their old module names: `ferry_api::selectors` is `ferry-selectors`.

pub mod custom;
pub mod event_convert;
pub mod hooks;
pub mod kinds;
pub mod patch;
pub mod rbac;
pub mod shape;
pub mod workloads;

pub use ferry_apimachinery::{decode, errors, names, quantity};
pub use ferry_cron as cron;
pub use ferry_defaults as defaults;
pub use ferry_printers as printers;
pub use ferry_protobuf as protobuf;
pub use ferry_selectors as selectors;
pub use ferry_validation as validation;
pub use k8s_openapi;
