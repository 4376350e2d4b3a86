//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch and
//! server-side apply. Everything is pure: values in, values (or a [`PatchError`]) out.
//!
//! * [`merge::apply`] — `application/merge-patch+json`;
//! * [`json_patch::apply`] — `application/json-patch+json` (`test` failures are
//!   [`PatchError::TestFailed`], 422);
//! * [`strategic::apply`] — `application/strategic-merge-patch+json`, with the schema from
//!   [`root_type`] (or [`TypeRef::UNTYPED`] for kinds without metadata);
//! * [`apply::apply`] — `application/apply-patch+yaml` (server-side apply), returning the object
//!   with its `metadata.managedFields` or the [`ApplyConflicts`] for a 409;
//! * [`managed::record_update`] — `managedFields` bookkeeping after create/update/patch;
//! * [`field_meta`] — the `x-kubernetes-*` patch extensions per OpenAPI definition and field,
//!   for the OpenAPI documents.
pub mod apply;
pub mod fieldset;
pub use ferry_patch::json_patch;
pub mod managed;
pub use ferry_patch::merge;
pub mod schema;
mod schema_table;
pub mod strategic;

pub use apply::ApplyConflicts;
pub use ferry_patch::PatchError;
pub use schema::{FieldMeta, TypeKind, TypeRef, field_meta, root_type};
