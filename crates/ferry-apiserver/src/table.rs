//! `meta.k8s.io/v1` Table responses, with row objects as kubectl needs them.

use std::sync::Arc;

use ferry_api::kinds::Strategy;
use serde_json::{Value, json};

use crate::cache::CachedObject;
use crate::request::Query;

/// The row object for `includeObject`: `Metadata` (default), `Object` or `None`.
fn row_object(v: &Value, include: &str, v1beta1: bool) -> Value {
    match include {
        "None" => Value::Null,
        "Object" => v.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" },
            "metadata": v.get("metadata").cloned().unwrap_or(json!({})),
        }),
    }
}

pub fn row(strategy: &dyn Strategy, v: &Value, include: &str, v1beta1: bool) -> Value {
    let mut cells = strategy.row(v);
    if cells.is_empty() {
        // Fallback to the default columns: Name, Created At.
        cells = vec![
            json!(crate::objects::name(v)),
            json!(crate::objects::meta_str(v, "creationTimestamp").unwrap_or("")),
        ];
    }
    let mut r = json!({"cells": cells});
    let o = row_object(v, include, v1beta1);
    if !o.is_null() {
        r["object"] = o;
    }
    r
}

pub fn columns(strategy: &dyn Strategy) -> Value {
    json!(strategy.columns())
}

pub fn build(
    strategy: &dyn Strategy,
    items: &[Arc<CachedObject>],
    q: &Query,
    rv: &str,
    v1beta1: bool,
) -> Value {
    let include = q.get("includeObject").unwrap_or("Metadata");
    let rows: Vec<Value> = items
        .iter()
        .map(|o| row(strategy, &o.value(), include, v1beta1))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" },
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": columns(strategy),
        "rows": rows,
    })
}

/// A one-row Table for a watch event.
pub fn single(strategy: &dyn Strategy, v: &Value, q: &Query, v1beta1: bool) -> Value {
    let include = q.get("includeObject").unwrap_or("Metadata");
    json!({
        "kind": "Table",
        "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" },
        "metadata": {"resourceVersion": crate::objects::meta_str(v, "resourceVersion").unwrap_or("")},
        "columnDefinitions": columns(strategy),
        "rows": [row(strategy, v, include, v1beta1)],
    })
}
