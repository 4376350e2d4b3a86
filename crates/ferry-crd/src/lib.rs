//! CustomResourceDefinitions as pure functions on JSON values, matching kube-apiserver's
//! apiextensions-apiserver:
//!
//! * [`schema`]: a structural schema (`openAPIV3Schema`) applied to a custom object: validation
//!   with field paths, defaulting, pruning of unknown fields.
//! * [`structural`]: the rules a schema must follow to be structural.
//! * [`definition`]: validation and defaulting of the CRD itself, the accepted names and the
//!   `NamesAccepted` / `Established` conditions.
//! * [`validations`]: CEL `x-kubernetes-validations` rules: checked when a CRD is written,
//!   enforced on custom objects.
//! * [`jsonpath`]: the simple JSONPath of `additionalPrinterColumns` and the scale subresource.
//!
//! No IO: the API server feeds these functions and stores their output.

pub mod definition;
pub mod jsonpath;
pub mod schema;
pub mod structural;
pub mod validations;

/// What is wrong with a field (upstream `field.ErrorType`; mirrored by `ferry_api::errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    Duplicate,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
}

/// One invalid field: the dotted path (`spec.ports[0].port`), the offending value rendered as
/// upstream prints it (strings quoted), and the detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: ErrorType,
    pub field: String,
    pub value: Option<String>,
    pub detail: String,
    /// For `NotSupported`: the supported values, rendered.
    pub supported: Vec<String>,
}

impl FieldError {
    pub fn new(kind: ErrorType, field: &str, value: Option<String>, detail: String) -> Self {
        FieldError {
            kind,
            field: field.to_string(),
            value,
            detail,
            supported: Vec::new(),
        }
    }
    pub fn required(field: &str, detail: &str) -> Self {
        Self::new(ErrorType::Required, field, None, detail.to_string())
    }
    pub fn invalid(field: &str, value: String, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Invalid, field, Some(value), detail.into())
    }
    pub fn forbidden(field: &str, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Forbidden, field, None, detail.into())
    }
    pub fn duplicate(field: &str, value: String) -> Self {
        Self::new(ErrorType::Duplicate, field, Some(value), String::new())
    }
    pub fn not_supported(field: &str, value: String, supported: Vec<String>) -> Self {
        FieldError {
            kind: ErrorType::NotSupported,
            field: field.to_string(),
            value: Some(value),
            detail: String::new(),
            supported,
        }
    }
}

/// Renders a JSON value the way upstream's field errors print Go values: strings quoted,
/// numbers and booleans plain, objects and arrays as JSON.
pub fn render(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "null".to_string(),
        other => other.to_string(),
    }
}

/// Joins a field path and a child name.
pub fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Joins a field path and a list index.
pub fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// Joins a field path and a map key.
pub fn key(path: &str, k: &str) -> String {
    format!("{path}[{k}]")
}
