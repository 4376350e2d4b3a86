//! `apiextensions.k8s.io/v1` CustomResourceDefinition: the kind itself. Its schema logic
//! (defaulting, validation, naming) is in `ferry-crd`; the API server serves the custom kinds a
//! CRD defines through [`crate::custom::resource`].

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::errors::{ErrorList, ErrorType, FieldError, Path};
use crate::kinds::{Column, Hooks, KindInfo, StatusOnCreate, Typed};

pub const GROUP: &str = "apiextensions.k8s.io";

/// A `ferry-crd` field error as the API server reports it.
pub fn convert(e: ferry_crd::FieldError) -> FieldError {
    use ferry_crd::ErrorType as C;
    let kind = match e.kind {
        C::Required => ErrorType::Required,
        C::Invalid => ErrorType::Invalid,
        C::Duplicate => ErrorType::Duplicate,
        C::NotSupported => ErrorType::NotSupported,
        C::Forbidden => ErrorType::Forbidden,
        C::TooLong => ErrorType::TooLong,
        C::TooMany => ErrorType::TooMany,
    };
    let detail = if kind == ErrorType::NotSupported && !e.supported.is_empty() {
        format!("supported values: {}", e.supported.join(", "))
    } else {
        e.detail
    };
    FieldError {
        kind,
        field: e.field,
        value: e.value,
        detail,
    }
}

fn to_value(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(crd).unwrap_or(Value::Null)
}

fn default(crd: &mut CustomResourceDefinition) {
    let mut v = to_value(crd);
    ferry_crd::definition::default_crd(&mut v);
    if let Ok(back) = serde_json::from_value(v) {
        *crd = back;
    }
}

/// Every CRD carries the cleanup finalizer: deleting it first deletes its custom objects.
fn prepare_create(crd: &mut CustomResourceDefinition) {
    let f = crd.metadata.finalizers.get_or_insert_with(Vec::new);
    if !f
        .iter()
        .any(|x| x == ferry_crd::definition::CLEANUP_FINALIZER)
    {
        f.push(ferry_crd::definition::CLEANUP_FINALIZER.to_string());
    }
}

fn validate(crd: &CustomResourceDefinition, old: Option<&CustomResourceDefinition>) -> ErrorList {
    let mp = Path::new("metadata");
    let mut errs = match old {
        None => crate::validation::validate_object_meta(
            &crd.metadata,
            false,
            crate::names::name_is_dns_subdomain,
            &mp,
        ),
        Some(o) => crate::validation::validate_object_meta_update(&crd.metadata, &o.metadata, &mp),
    };
    // apiextensions validates metadata with apimachinery's generic rules, which do not ask for
    // finalizer names to be qualified: its own cleanup finalizer is fine.
    let cleanup = crate::errors::quote(ferry_crd::definition::CLEANUP_FINALIZER);
    errs.retain(|e| {
        !(e.field.starts_with("metadata.finalizers") && e.value.as_deref() == Some(&cleanup))
    });
    let old_v = old.map(to_value);
    errs.extend(
        ferry_crd::definition::validate_crd(&to_value(crd), old_v.as_ref())
            .into_iter()
            .map(convert),
    );
    errs
}

fn columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        Column {
            name: "Created At",
            type_: "date",
            format: "",
            description: "",
            priority: 0,
        },
    ]
}

fn row(crd: &CustomResourceDefinition) -> Vec<Value> {
    vec![
        Value::String(crd.metadata.name.clone().unwrap_or_default()),
        Value::String(
            crd.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| {
                    let ts: Timestamp = t.0;
                    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
                })
                .unwrap_or_default(),
        ),
    ]
}

/// The registry entry.
pub fn strategy() -> Typed<CustomResourceDefinition> {
    Typed {
        info: KindInfo {
            group: GROUP,
            version: "v1",
            kind: "CustomResourceDefinition",
            plural: "customresourcedefinitions",
            singular: "customresourcedefinition",
            namespaced: false,
            short_names: &["crd", "crds"],
            categories: &["api-extensions"],
            status_subresource: true,
            status_on_create: StatusOnCreate::Reset,
            generation: true,
            delete_returns_object: true,
            scale_subresource: false,
        },
        hooks: Hooks {
            default,
            prepare_create,
            prepare_update: |_, _| {},
            validate,
            validate_status: |_, _| Vec::new(),
            columns,
            row,
            field: |_, _| None,
        },
    }
}
