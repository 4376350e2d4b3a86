//! The API server's view of `ferry_api::patch` and `ferry_api::protobuf`: errors become Status.

use ferry_api::patch;
use serde_json::Value;

use crate::status::ApiError;

pub fn merge(base: &Value, p: &Value) -> Value {
    patch::merge::apply(base, p)
}

pub fn json_patch(base: &Value, p: &Value) -> Result<Value, ApiError> {
    patch::json_patch::apply(base, p).map_err(patch_error)
}

pub fn strategic(
    base: &Value,
    p: &Value,
    api_version: &str,
    kind: &str,
) -> Result<Value, ApiError> {
    match patch::root_type(api_version, kind) {
        Some(root) => patch::strategic::apply(base, p, root).map_err(patch_error),
        // Kinds without patch metadata take a JSON merge patch, as upstream does for custom kinds.
        None => Ok(patch::merge::apply(base, p)),
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
    patch::apply::apply(live, applied, manager, force, root, &now).map_err(|c| {
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
    })
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
