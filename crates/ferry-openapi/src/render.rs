//! Renders the operation model ([`crate::ops`]) as OpenAPI v3 and Swagger 2.0 JSON.

use serde_json::{Map, Value, json};

use crate::ops::{Body, Operation, PATCH_TYPES, Param, PathItem};
use crate::schemas::{V2_REF, V3_REF};

fn v3_param(p: &Param) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), p.name.into());
    m.insert("in".into(), p.location.key().into());
    m.insert("description".into(), p.description.clone().into());
    if p.required {
        m.insert("required".into(), true.into());
    }
    m.insert("schema".into(), json!({"type": p.ty, "uniqueItems": true}));
    Value::Object(m)
}

fn v3_ref(name: &str) -> Value {
    json!({"$ref": format!("{V3_REF}{name}")})
}

fn v3_operation(op: &Operation) -> Value {
    let mut m = Map::new();
    m.insert("tags".into(), json!([op.tag]));
    m.insert("description".into(), op.description.clone().into());
    m.insert("operationId".into(), op.id.clone().into());
    if !op.params.is_empty() {
        m.insert(
            "parameters".into(),
            op.params.iter().map(v3_param).collect(),
        );
    }
    if let Some(body) = &op.body {
        let types: &[&str] = if matches!(body, Body::Patch) {
            patch_types(op)
        } else {
            &["*/*"]
        };
        let content: Map<String, Value> = types
            .iter()
            .map(|t| (t.to_string(), json!({"schema": v3_ref(body.schema())})))
            .collect();
        let mut rb = Map::new();
        rb.insert("content".into(), Value::Object(content));
        if body.required() {
            rb.insert("required".into(), true.into());
        }
        m.insert("requestBody".into(), Value::Object(rb));
    }
    let mut responses = Map::new();
    for r in &op.responses {
        let mut rm = Map::new();
        rm.insert("description".into(), r.description.into());
        if let Some(schema) = &r.schema {
            let content: Map<String, Value> = op
                .produces
                .iter()
                .map(|t| (t.to_string(), json!({"schema": v3_ref(schema)})))
                .collect();
            rm.insert("content".into(), Value::Object(content));
        }
        responses.insert(r.code.to_string(), Value::Object(rm));
    }
    m.insert("responses".into(), Value::Object(responses));
    if !op.action.is_empty() {
        m.insert("x-kubernetes-action".into(), op.action.into());
    }
    if let Some(gvk) = &op.gvk {
        m.insert("x-kubernetes-group-version-kind".into(), gvk.to_json());
    }
    Value::Object(m)
}

/// The `paths` object of a v3 document.
pub(crate) fn v3_paths(items: &[PathItem]) -> Map<String, Value> {
    items
        .iter()
        .map(|item| {
            let mut m = Map::new();
            for op in &item.ops {
                m.insert(op.method.key().into(), v3_operation(op));
            }
            if !item.params.is_empty() {
                m.insert(
                    "parameters".into(),
                    item.params.iter().map(v3_param).collect(),
                );
            }
            (item.path.clone(), Value::Object(m))
        })
        .collect()
}

fn v2_param(p: &Param) -> Value {
    let mut m = Map::new();
    m.insert("uniqueItems".into(), true.into());
    m.insert("type".into(), p.ty.into());
    m.insert("description".into(), p.description.clone().into());
    m.insert("name".into(), p.name.into());
    m.insert("in".into(), p.location.key().into());
    if p.required {
        m.insert("required".into(), true.into());
    }
    Value::Object(m)
}

fn v2_ref(name: &str) -> Value {
    json!({"$ref": format!("{V2_REF}{name}")})
}

/// The patch types of an operation: custom kinds have no strategic merge patch (kubectl then
/// falls back to JSON merge patch for client-side apply, as against kube-apiserver).
fn patch_types(op: &Operation) -> &'static [&'static str] {
    let custom = op.gvk.as_ref().is_some_and(|g| {
        let av = if g.group.is_empty() {
            g.version.clone()
        } else {
            format!("{}/{}", g.group, g.version)
        };
        ferry_api::custom::resource::by_kind(&av, &g.kind).is_some()
    });
    if custom {
        &PATCH_TYPES[..3]
    } else {
        PATCH_TYPES
    }
}

fn v2_operation(op: &Operation) -> Value {
    let mut m = Map::new();
    m.insert("description".into(), op.description.clone().into());
    if let Some(body) = &op.body {
        let types: &[&str] = if matches!(body, Body::Patch) {
            patch_types(op)
        } else {
            &["*/*"]
        };
        m.insert(
            "consumes".into(),
            types.iter().map(|t| Value::from(*t)).collect(),
        );
    }
    m.insert(
        "produces".into(),
        op.produces.iter().map(|t| Value::from(*t)).collect(),
    );
    m.insert("schemes".into(), json!(["https"]));
    m.insert("tags".into(), json!([op.tag]));
    m.insert("operationId".into(), op.id.clone().into());
    let mut params: Vec<Value> = Vec::new();
    if let Some(body) = &op.body {
        let mut b = Map::new();
        b.insert("name".into(), "body".into());
        b.insert("in".into(), "body".into());
        if body.required() {
            b.insert("required".into(), true.into());
        }
        b.insert("schema".into(), v2_ref(body.schema()));
        params.push(Value::Object(b));
    }
    params.extend(op.params.iter().map(v2_param));
    if !params.is_empty() {
        m.insert("parameters".into(), Value::Array(params));
    }
    let mut responses = Map::new();
    for r in &op.responses {
        let mut rm = Map::new();
        rm.insert("description".into(), r.description.into());
        if let Some(schema) = &r.schema {
            rm.insert("schema".into(), v2_ref(schema));
        }
        responses.insert(r.code.to_string(), Value::Object(rm));
    }
    m.insert("responses".into(), Value::Object(responses));
    if !op.action.is_empty() {
        m.insert("x-kubernetes-action".into(), op.action.into());
    }
    if let Some(gvk) = &op.gvk {
        m.insert("x-kubernetes-group-version-kind".into(), gvk.to_json());
    }
    Value::Object(m)
}

/// Adds the paths of one group version to a v2 `paths` object.
pub(crate) fn v2_paths(items: &[PathItem], out: &mut Map<String, Value>) {
    for item in items {
        let mut m = Map::new();
        for op in &item.ops {
            m.insert(op.method.key().into(), v2_operation(op));
        }
        if !item.params.is_empty() {
            m.insert(
                "parameters".into(),
                item.params.iter().map(v2_param).collect(),
            );
        }
        out.insert(item.path.clone(), Value::Object(m));
    }
}
