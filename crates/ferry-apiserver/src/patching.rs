//! The API server's view of `ferry_api::patch` and `ferry_api::protobuf`: errors become Status.
//!
//! Every patch result is bounded before anything else happens to it ([`bounded`]): nested at
//! most [`ferry_api::decode::MAX_DEPTH`] levels (`422 Invalid`, as upstream refuses a patched
//! object its decoder cannot read) and at most [`ferry_store::MAX_VALUE_BYTES`] of JSON
//! (`413 RequestEntityTooLarge`: it could not be stored). JSON patches are further held to
//! upstream's operation count and copy budget ([`ferry_api::patch::json_patch::Limits`]).

use ferry_api::patch;
use serde_json::Value;

use crate::status::ApiError;

/// `413` for an object too large to store (etcd's default request limit, 1.5 MiB).
pub fn object_too_large() -> ApiError {
    crate::body::too_large(ferry_store::MAX_VALUE_BYTES)
}

/// Holds a patch result to the depth and size every object must keep.
pub fn bounded(v: Value) -> Result<Value, ApiError> {
    let d = ferry_api::decode::depth(&v);
    if d > ferry_api::decode::MAX_DEPTH {
        return Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "the patched object is nested {d} levels deep, more than the limit of {}",
                ferry_api::decode::MAX_DEPTH
            ),
        ));
    }
    if ferry_api::decode::encoded_len_within(&v, ferry_store::MAX_VALUE_BYTES as u64).is_none() {
        return Err(object_too_large());
    }
    Ok(v)
}

pub fn merge(base: &Value, p: &Value) -> Result<Value, ApiError> {
    bounded(patch::merge::apply(base, p))
}

pub fn json_patch(base: &Value, p: &Value) -> Result<Value, ApiError> {
    bounded(patch::json_patch::apply(base, p).map_err(patch_error)?)
}

pub fn strategic(
    base: &Value,
    p: &Value,
    api_version: &str,
    kind: &str,
) -> Result<Value, ApiError> {
    match patch::root_type(api_version, kind) {
        Some(root) => bounded(patch::strategic::apply(base, p, root).map_err(patch_error)?),
        // Kinds without patch metadata take a JSON merge patch, as upstream does for custom kinds.
        None => merge(base, p),
    }
}

pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    kind: &str,
) -> Result<Value, ApiError> {
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    let root = patch::root_type(api_version, kind).unwrap_or(patch::TypeRef::UNTYPED);
    let now = crate::objects::now_rfc3339();
    let applied = patch::apply::apply(live, applied, manager, force, root, &now).map_err(|c| {
        let causes: Vec<Value> = c
            .conflicts
            .iter()
            .map(|(mgr, field)| {
                serde_json::json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{mgr}\": {field}"), "field": field})
            })
            .collect();
        let n = causes.len();
        let list = c.conflicts.iter().map(|(m, f)| format!("- {f} (conflict with \"{m}\")")).collect::<Vec<_>>().join("\n");
        ApiError::new(409, "Conflict", format!("Apply failed with {n} conflict{}: {list}", if n == 1 { "" } else { "s" }))
            .with_details(serde_json::json!({"causes": causes}))
    })?;
    bounded(applied)
}

fn patch_error(e: patch::PatchError) -> ApiError {
    ApiError::new(e.code(), e.reason(), e.to_string())
}

pub fn decode_protobuf(body: &[u8]) -> Result<Value, ApiError> {
    ferry_api::protobuf::decode_body(body).map_err(|e| {
        if e.is_unsupported() {
            ApiError::unsupported_media(&format!("application/vnd.kubernetes.protobuf ({e})"))
        } else {
            ApiError::bad_request(format!("unable to decode protobuf body: {e}"))
        }
    })
}
