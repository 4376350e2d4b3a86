//! API errors as `metav1.Status`, shaped exactly as kubectl and the Python client read them.

use ferry_api::errors::FieldError;
use ferry_api::kinds::KindInfo;
use serde_json::{Value, json};

/// An error answer: HTTP code plus the Status body.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<Value>>,
    /// `metadata.continue` of the Status (an expired continue token's replacement).
    pub continue_token: Option<String>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            continue_token: None,
        }
    }
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(Box::new(details));
        self
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn not_found_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }
    pub fn not_found(info: &KindInfo, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", info.qualified_resource(), name),
        )
        .with_details(details(info, name))
    }
    pub fn namespace_not_found(ns: &str) -> Self {
        Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
            .with_details(json!({"name": ns, "kind": "namespaces"}))
    }
    pub fn already_exists(info: &KindInfo, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", info.qualified_resource(), name),
        )
        .with_details(details(info, name))
    }
    pub fn conflict(info: &KindInfo, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                info.qualified_resource(),
                name
            ),
        )
        .with_details(details(info, name))
    }
    pub fn conflict_msg(info: &KindInfo, name: &str, msg: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                info.qualified_resource(),
                name,
                msg
            ),
        )
        .with_details(details(info, name))
    }
    /// 422 Invalid with field causes; `details.kind` is the Kind, as kubectl expects.
    pub fn invalid(info: &KindInfo, name: &str, errors: &[FieldError]) -> Self {
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.kind.reason(), "message": e.body(), "field": e.field}))
            .collect();
        // The message lists each distinct error once (upstream's ErrorList.ToAggregate); the
        // causes keep every one.
        let mut messages: Vec<String> = Vec::with_capacity(errors.len());
        for m in errors.iter().map(|e| e.to_string()) {
            if !messages.contains(&m) {
                messages.push(m);
            }
        }
        let list = if messages.len() == 1 {
            messages.swap_remove(0)
        } else {
            format!("[{}]", messages.join(", "))
        };
        let mut d = json!({"name": name, "kind": info.kind, "causes": causes});
        if !info.group.is_empty() {
            d["group"] = json!(info.group);
        }
        Self::new(
            422,
            "Invalid",
            format!("{} \"{}\" is invalid: {}", qualified_kind(info), name, list),
        )
        .with_details(d)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }
    pub fn unsupported_media(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {ct})"
            ),
        )
    }
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    pub fn gone_too_old(rev: i64) -> Self {
        Self::expired(format!("too old resource version: {rev}"))
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = (**d).clone();
        }
        if let Some(c) = &self.continue_token {
            s["metadata"]["continue"] = json!(c);
        }
        // Upstream's shape: reason before details before code.
        reorder(s)
    }
}

fn reorder(s: Value) -> Value {
    let Value::Object(m) = s else { return s };
    let mut out = serde_json::Map::new();
    for k in [
        "kind",
        "apiVersion",
        "metadata",
        "status",
        "message",
        "reason",
        "details",
        "code",
    ] {
        if let Some(v) = m.get(k) {
            out.insert(k.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

fn details(info: &KindInfo, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": info.plural});
    if !info.group.is_empty() {
        d = json!({"name": name, "group": info.group, "kind": info.plural});
    }
    d
}

/// `Service` or `Deployment.apps`, as upstream names kinds in Invalid messages.
fn qualified_kind(info: &KindInfo) -> String {
    if info.group.is_empty() {
        info.kind.to_string()
    } else {
        format!("{}.{}", info.kind, info.group)
    }
}

/// A `Status` Success for deletes of kinds that answer with one.
pub fn success_status(info: &KindInfo, name: &str, uid: &str) -> Value {
    let mut details = json!({"name": name});
    if !info.group.is_empty() {
        details["group"] = json!(info.group);
    }
    details["kind"] = json!(info.plural);
    details["uid"] = json!(uid);
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

impl From<ferry_store::StoreError> for ApiError {
    fn from(e: ferry_store::StoreError) -> Self {
        match e {
            ferry_store::StoreError::Compacted { requested, .. } => {
                ApiError::gone_too_old(requested)
            }
            ferry_store::StoreError::Unavailable(m) => ApiError::unavailable(m),
            ferry_store::StoreError::TooLarge { limit, .. } => crate::body::too_large(limit),
            other => ApiError::internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployments() -> &'static KindInfo {
        ferry_api::kinds::by_resource("apps", "v1", "deployments")
            .map(|s| s.info())
            .expect("deployments are served")
    }

    #[test]
    fn invalid_lists_each_distinct_message_once_and_keeps_every_cause() {
        let e = FieldError::required("spec.selector", "");
        let other =
            FieldError::invalid_str("spec.replicas", "-1", "must be greater than or equal to 0");
        // One distinct message, twice: no brackets, as upstream's aggregate of one error.
        let s = ApiError::invalid(deployments(), "web", &[e.clone(), e.clone()]);
        assert_eq!(
            s.message,
            "Deployment.apps \"web\" is invalid: spec.selector: Required value"
        );
        let causes = s
            .details
            .as_ref()
            .map(|d| d["causes"].clone())
            .unwrap_or_default();
        assert_eq!(causes.as_array().map(Vec::len), Some(2));
        // Two distinct messages, one repeated: each once, in first-seen order.
        let s = ApiError::invalid(deployments(), "web", &[e.clone(), other.clone(), e]);
        assert_eq!(
            s.message,
            "Deployment.apps \"web\" is invalid: [spec.selector: Required value, spec.replicas: Invalid value: \"-1\": must be greater than or equal to 0]"
        );
        let causes = s
            .details
            .as_ref()
            .map(|d| d["causes"].clone())
            .unwrap_or_default();
        assert_eq!(causes.as_array().map(Vec::len), Some(3));
    }
}
