//! Field errors, shaped like upstream's `field.Error` so that the API server can turn a list of
//! them into a `422 Invalid` `Status` whose `details.causes` kubectl and the Python client read.

use std::fmt;

/// What is wrong with a field (upstream `field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    Duplicate,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
    NotFound,
    Internal,
}

impl ErrorType {
    /// The `reason` of a `StatusCause` (upstream `metav1.CauseType`).
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::Internal => "InternalError",
        }
    }
}

/// One invalid field. `field` is the dotted path (`spec.ports[0].port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: ErrorType,
    pub field: String,
    /// The offending value rendered as upstream does (`"abc"` for strings, `70000` for numbers),
    /// or `None` where upstream omits it.
    pub value: Option<String>,
    pub detail: String,
}

/// A list of field errors; empty means valid.
pub type ErrorList = Vec<FieldError>;

/// Renders a string value the way Go's `%q` does for the common cases.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::Required,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }
    /// `value` is already rendered (use [`quote`] for strings).
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            kind: ErrorType::Invalid,
            field: field.into(),
            value: Some(value.into()),
            detail: detail.into(),
        }
    }
    pub fn invalid_str(field: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        Self::invalid(field, quote(value), detail)
    }
    pub fn duplicate(field: impl Into<String>, value: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::Duplicate,
            field: field.into(),
            value: Some(value.into()),
            detail: String::new(),
        }
    }
    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list = supported
            .iter()
            .map(|s| quote(s))
            .collect::<Vec<_>>()
            .join(", ");
        let detail = if list.is_empty() {
            String::new()
        } else {
            format!("supported values: {list}")
        };
        FieldError {
            kind: ErrorType::NotSupported,
            field: field.into(),
            value: Some(quote(value)),
            detail,
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::Forbidden,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        FieldError {
            kind: ErrorType::TooLong,
            field: field.into(),
            value: None,
            detail: format!("may not be more than {max} bytes"),
        }
    }
    pub fn too_many(field: impl Into<String>, actual: usize, max: usize) -> Self {
        FieldError {
            kind: ErrorType::TooMany,
            field: field.into(),
            value: Some(actual.to_string()),
            detail: format!("must have at most {max} items"),
        }
    }
    pub fn not_found(field: impl Into<String>, value: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::NotFound,
            field: field.into(),
            value: Some(value.into()),
            detail: String::new(),
        }
    }

    /// The text upstream puts in `StatusCause.message` (`field.Error.ErrorBody()`).
    pub fn body(&self) -> String {
        let mut s = match self.kind {
            ErrorType::Required => "Required value".to_string(),
            ErrorType::Invalid => match &self.value {
                Some(v) => format!("Invalid value: {v}"),
                None => "Invalid value".to_string(),
            },
            ErrorType::Duplicate => match &self.value {
                Some(v) => format!("Duplicate value: {v}"),
                None => "Duplicate value".to_string(),
            },
            ErrorType::NotSupported => match &self.value {
                Some(v) => format!("Unsupported value: {v}"),
                None => "Unsupported value".to_string(),
            },
            ErrorType::Forbidden => "Forbidden".to_string(),
            ErrorType::TooLong => "Too long".to_string(),
            ErrorType::TooMany => match &self.value {
                Some(v) => format!("Too many: {v}"),
                None => "Too many".to_string(),
            },
            ErrorType::NotFound => match &self.value {
                Some(v) => format!("Not found: {v}"),
                None => "Not found".to_string(),
            },
            ErrorType::Internal => "Internal error".to_string(),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Builds child paths: `Path::new("spec").child("ports").index(0).child("port")`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    pub fn new(root: &str) -> Self {
        Path(root.to_string())
    }
    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(format!("{}.{}", self.0, name))
        }
    }
    pub fn index(&self, i: usize) -> Self {
        Path(format!("{}[{}]", self.0, i))
    }
    pub fn key(&self, k: &str) -> Self {
        Path(format!("{}[{}]", self.0, k))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Path> for String {
    fn from(p: Path) -> String {
        p.0
    }
}
impl From<&Path> for String {
    fn from(p: &Path) -> String {
        p.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_match_upstream() {
        assert_eq!(
            FieldError::required("spec.ports", "").body(),
            "Required value"
        );
        assert_eq!(
            FieldError::invalid(
                "spec.ports[0].port",
                "0",
                "must be between 1 and 65535, inclusive"
            )
            .body(),
            "Invalid value: 0: must be between 1 and 65535, inclusive"
        );
        assert_eq!(
            FieldError::not_supported("spec.type", "Bogus", &["ClusterIP", "NodePort"]).body(),
            "Unsupported value: \"Bogus\": supported values: \"ClusterIP\", \"NodePort\""
        );
        assert_eq!(
            FieldError::duplicate("spec.ports[1].name", "\"http\"").body(),
            "Duplicate value: \"http\""
        );
        assert_eq!(
            Path::new("spec")
                .child("ports")
                .index(2)
                .child("name")
                .as_str(),
            "spec.ports[2].name"
        );
    }
}
