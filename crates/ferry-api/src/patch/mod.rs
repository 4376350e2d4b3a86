//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch and
//! server-side apply.
pub mod apply;
mod error;
pub mod fieldset;
pub mod json_patch;
pub mod managed;
pub mod merge;
pub mod schema;
mod schema_table;
pub mod strategic;

pub use apply::ApplyConflicts;
pub use error::PatchError;
pub use schema::{FieldMeta, TypeKind, TypeRef, field_meta, root_type};
