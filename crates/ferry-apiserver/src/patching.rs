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

pub fn strategic(base: &Value, p: &Value, api_version: &str, kind: &str) -> Result<Value, ApiError> {
    // INTERIM: until ferry_api::patch::strategic lands, a merge patch.
    let _ = (api_version, kind);
    Ok(patch::merge::apply(base, p))
}

pub fn apply(live: Option<&Value>, applied: &Value, manager: &str, force: bool, api_version: &str, kind: &str) -> Result<Value, ApiError> {
    let _ = (api_version, kind, manager, force);
    // INTERIM: until ferry_api::patch::apply lands, a merge of the applied configuration.
    let r: Result<Value, patch::ApplyConflicts> = Ok(match live {
        Some(l) => patch::merge::apply(l, applied),
        None => applied.clone(),
    });
    r.map_err(|c| {
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
    ferry_api::protobuf::decode_body(body).map_err(|e| ApiError::bad_request(format!("unable to decode protobuf body: {e}")))
}
