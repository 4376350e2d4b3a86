//! Ferry's API types and the pure per-kind logic: decoding, defaulting, validation, Table
//! printing, selectors, patches. No IO.

pub mod cron;
pub mod custom;
pub mod decode;
pub mod defaults;
pub mod errors;
pub mod event_convert;
pub mod hooks;
pub mod kinds;
pub mod names;
pub mod patch;
pub mod printers;
pub mod protobuf;
pub mod rbac;
pub mod selectors;
pub mod shape;
pub mod validation;
pub mod workloads;

pub use k8s_openapi;
