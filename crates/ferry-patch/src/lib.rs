//! The patches that need no schema: JSON merge patch (RFC 7386, [`merge::apply`]) and JSON patch
//! (RFC 6902, [`json_patch::apply`]), and the error every patch function returns
//! ([`PatchError`], with the server-side apply [`ApplyConflicts`]). Pure: values in, values out.
//! Strategic merge patch and server-side apply, which need the kinds' schemas, are in
//! `ferry_api::patch`.

mod error;
pub mod json_patch;
pub mod merge;

pub use error::{ApplyConflicts, PatchError};
