//! The error of every patch function, shaped so the API server can answer with a `Status`.

use std::fmt;

use serde_json::Value;

/// Apply conflicts: `(manager, field path)` pairs such as `("kubectl-client-side-apply",
/// ".spec.replicas")`, sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApplyConflicts {
    pub conflicts: Vec<(String, String)>,
}

impl ApplyConflicts {
    /// The `Status` message, as upstream words it.
    pub fn message(&self) -> String {
        match self.conflicts.as_slice() {
            [(m, f)] => format!("Apply failed with 1 conflict: conflict with \"{m}\": {f}"),
            list => {
                let mut lines = Vec::new();
                let mut last: Option<&str> = None;
                for (m, f) in list {
                    if last != Some(m.as_str()) {
                        lines.push(format!("conflicts with \"{m}\":"));
                        last = Some(m);
                    }
                    lines.push(format!("- {f}"));
                }
                format!(
                    "Apply failed with {} conflicts: {}",
                    list.len(),
                    lines.join("\n")
                )
            }
        }
    }

    /// `details.causes` of the 409 `Status`.
    pub fn causes(&self) -> Vec<Value> {
        self.conflicts
            .iter()
            .map(|(m, f)| {
                serde_json::json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\""), "field": f})
            })
            .collect()
    }
}

impl std::fmt::Display for ApplyConflicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for ApplyConflicts {}

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// The patch document is malformed (not the right JSON shape, a bad directive, a bad JSON
    /// pointer): `400 BadRequest`.
    BadRequest(String),
    /// The patch is well formed but cannot be applied to this object (a missing path, a list
    /// item without its merge key, mixed list element types): `422 Invalid`.
    Invalid(String),
    /// A JSON patch `test` operation failed: `422 Invalid`.
    TestFailed(String),
    /// Server-side apply conflicts with other field managers: `409 Conflict`.
    Conflict(ApplyConflicts),
    /// The patch asks for more work than one request may do (more JSON patch operations than
    /// allowed): `413 RequestEntityTooLarge`. The message is upstream's text after its
    /// `Request entity too large: ` prefix, which [`fmt::Display`] adds.
    TooLarge(String),
}

impl PatchError {
    /// A [`PatchError::BadRequest`].
    pub fn bad(msg: impl Into<String>) -> Self {
        PatchError::BadRequest(msg.into())
    }
    /// A [`PatchError::Invalid`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        PatchError::Invalid(msg.into())
    }

    /// The HTTP status code of the `Status` answer.
    pub fn code(&self) -> u16 {
        match self {
            PatchError::BadRequest(_) => 400,
            PatchError::Invalid(_) | PatchError::TestFailed(_) => 422,
            PatchError::Conflict(_) => 409,
            PatchError::TooLarge(_) => 413,
        }
    }

    /// The `reason` of the `Status` answer.
    pub fn reason(&self) -> &'static str {
        match self {
            PatchError::BadRequest(_) => "BadRequest",
            PatchError::Invalid(_) | PatchError::TestFailed(_) => "Invalid",
            PatchError::Conflict(_) => "Conflict",
            PatchError::TooLarge(_) => "RequestEntityTooLarge",
        }
    }

    /// A complete `metav1.Status` for this error (the caller may add `details.name`/`kind`).
    pub fn status(&self) -> serde_json::Value {
        let mut s = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.to_string(), "reason": self.reason(), "code": self.code(),
        });
        if let PatchError::Conflict(c) = self {
            s["details"] = serde_json::json!({ "causes": c.causes() });
        }
        s
    }
}

impl fmt::Display for PatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatchError::BadRequest(m) | PatchError::Invalid(m) | PatchError::TestFailed(m) => {
                f.write_str(m)
            }
            PatchError::Conflict(c) => f.write_str(&c.message()),
            PatchError::TooLarge(m) => write!(f, "Request entity too large: {m}"),
        }
    }
}

impl std::error::Error for PatchError {}
