//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch and
//! server-side apply.
mod error;
pub mod json_patch;
pub mod merge;
pub mod schema;
mod schema_table;
pub mod strategic;

pub use error::PatchError;
pub use schema::{FieldMeta, TypeKind, TypeRef, field_meta, root_type};

/// Placeholder until apply lands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApplyConflicts {
    pub conflicts: Vec<(String, String)>,
}
impl ApplyConflicts {
    pub fn message(&self) -> String {
        String::new()
    }
    pub fn causes(&self) -> Vec<serde_json::Value> {
        Vec::new()
    }
}
