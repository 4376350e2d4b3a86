//! The rules that make an `openAPIV3Schema` structural (apiextensions.k8s.io/v1 requires it):
//! every specified field has a type (or `x-kubernetes-int-or-string` /
//! `x-kubernetes-preserve-unknown-fields`), arrays have `items`, `properties` and
//! `additionalProperties` exclude each other, the root is an object, `metadata` may only restrict
//! `name` and `generateName`, list types are well-formed, patterns compile and defaults are valid
//! and already pruned.

use serde_json::{Map, Value};

use crate::{FieldError, child, render, schema};

fn flag(s: &Map<String, Value>, name: &str) -> bool {
    s.get(name).and_then(Value::as_bool).unwrap_or(false)
}

/// Checks a whole schema; `path` is the field path of the schema itself
/// (`spec.versions[0].schema.openAPIV3Schema`).
pub fn check(root: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Value::Object(s) = root else {
        errs.push(FieldError::required(path, "must not be empty"));
        return errs;
    };
    if s.get("type").and_then(Value::as_str) != Some("object") {
        errs.push(FieldError::invalid(
            &child(path, "type"),
            render(s.get("type").unwrap_or(&Value::String(String::new()))),
            "must be object at the root",
        ));
    }
    if let Some(Value::Object(props)) = s.get("properties") {
        if let Some(Value::Object(meta)) = props.get("metadata") {
            check_metadata(meta, &format!("{path}.properties[metadata]"), &mut errs);
        }
        for f in ["apiVersion", "kind"] {
            if let Some(Value::Object(ps)) = props.get(f)
                && ps.get("type").and_then(Value::as_str) != Some("string")
            {
                errs.push(FieldError::invalid(
                    &format!("{path}.properties[{f}].type"),
                    render(ps.get("type").unwrap_or(&Value::Null)),
                    "must be string",
                ));
            }
        }
    }
    node(s, path, true, &mut errs);
    errs
}

fn check_metadata(meta: &Map<String, Value>, path: &str, errs: &mut Vec<FieldError>) {
    let allowed = ["type", "properties", "description"];
    let extra = meta.keys().any(|k| !allowed.contains(&k.as_str()));
    let bad_props = meta
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.keys().any(|k| k != "name" && k != "generateName"));
    if extra || bad_props {
        errs.push(FieldError::forbidden(
            path,
            "must not specify anything other than name and generateName, but metadata is implicitly specified",
        ));
    }
}

fn node(s: &Map<String, Value>, path: &str, root: bool, errs: &mut Vec<FieldError>) {
    let t = s.get("type").and_then(Value::as_str).unwrap_or("");
    let ios = flag(s, "x-kubernetes-int-or-string");
    let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
    let embedded = flag(s, "x-kubernetes-embedded-resource");
    if !t.is_empty()
        && !matches!(
            t,
            "object" | "array" | "string" | "integer" | "number" | "boolean"
        )
    {
        errs.push(FieldError::not_supported(
            &child(path, "type"),
            render(&Value::String(t.to_string())),
            ["array", "boolean", "integer", "number", "object", "string"]
                .iter()
                .map(|x| format!("\"{x}\""))
                .collect(),
        ));
    }
    if ios && !t.is_empty() {
        errs.push(FieldError::invalid(
            &child(path, "type"),
            render(&Value::String(t.to_string())),
            "must be empty if x-kubernetes-int-or-string is true",
        ));
    }
    if embedded {
        if t != "object" {
            errs.push(FieldError::invalid(
                &child(path, "type"),
                render(&Value::String(t.to_string())),
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        }
        if !preserve && s.get("properties").is_none() {
            errs.push(FieldError::required(
                &child(path, "properties"),
                "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
            ));
        }
    }
    if s.contains_key("properties") && s.contains_key("additionalProperties") {
        errs.push(FieldError::forbidden(
            &child(path, "additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if s.get("additionalProperties") == Some(&Value::Bool(false)) {
        errs.push(FieldError::forbidden(
            &child(path, "additionalProperties"),
            "must not be false in structural schemas",
        ));
    }
    if t == "array" && !s.contains_key("items") {
        errs.push(FieldError::required(
            &child(path, "items"),
            "must be specified",
        ));
    }
    if let Some(Value::String(p)) = s.get("pattern")
        && let Err(e) = regex::Regex::new(p)
    {
        errs.push(FieldError::invalid(
            &child(path, "pattern"),
            render(&Value::String(p.clone())),
            format!("must be a valid regular expression: {e}"),
        ));
    }
    list_type(s, t, path, errs);
    if let Some(d) = s.get("default") {
        let dp = child(path, "default");
        if root {
            errs.push(FieldError::forbidden(&dp, "must not be set at the root"));
        } else {
            let sv = Value::Object(s.clone());
            let mut pruned = d.clone();
            let gone = schema::prune(&sv, &mut pruned);
            for g in gone {
                errs.push(FieldError::invalid(
                    &dp,
                    render(d),
                    format!("must not have unknown fields ({g})"),
                ));
            }
            for e in schema::validate(&sv, d, "") {
                errs.push(FieldError::invalid(
                    &dp,
                    render(d),
                    if e.detail.is_empty() {
                        format!("{}: {:?}", e.field, e.kind)
                    } else {
                        e.detail
                    },
                ));
            }
        }
    }
    if let Some(Value::Object(props)) = s.get("properties") {
        if t != "object" && !t.is_empty() {
            errs.push(FieldError::forbidden(
                &child(path, "properties"),
                "must be empty for types other than object",
            ));
        }
        for (k, ps) in props {
            let pp = format!("{path}.properties[{k}]");
            match ps {
                Value::Object(m) => {
                    require_type(
                        m,
                        &pp,
                        "must not be empty for specified object fields",
                        errs,
                    );
                    if !(root && k == "metadata") {
                        node(m, &pp, false, errs);
                    }
                }
                _ => errs.push(FieldError::invalid(&pp, render(ps), "must be a schema")),
            }
        }
    }
    if let Some(Value::Object(ap)) = s.get("additionalProperties") {
        let pp = child(path, "additionalProperties");
        require_type(
            ap,
            &pp,
            "must not be empty for specified object fields",
            errs,
        );
        node(ap, &pp, false, errs);
    }
    match s.get("items") {
        Some(Value::Object(is)) => {
            let pp = child(path, "items");
            require_type(is, &pp, "must not be empty for specified array items", errs);
            node(is, &pp, false, errs);
        }
        Some(Value::Array(_)) => errs.push(FieldError::forbidden(
            &child(path, "items"),
            "items must be a schema object and not an array",
        )),
        _ => {}
    }
    for j in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(xs)) = s.get(j) {
            for (i, x) in xs.iter().enumerate() {
                if let Value::Object(m) = x {
                    junctor(m, &format!("{path}.{j}[{i}]"), errs);
                }
            }
        }
    }
    if let Some(Value::Object(m)) = s.get("not") {
        junctor(m, &child(path, "not"), errs);
    }
}

fn require_type(s: &Map<String, Value>, path: &str, msg: &str, errs: &mut Vec<FieldError>) {
    let t = s.get("type").and_then(Value::as_str).unwrap_or("");
    if t.is_empty()
        && !flag(s, "x-kubernetes-int-or-string")
        && !flag(s, "x-kubernetes-preserve-unknown-fields")
    {
        errs.push(FieldError::required(&child(path, "type"), msg));
    }
}

/// Inside `allOf`/`anyOf`/`oneOf`/`not` only value validations are allowed (upstream's
/// "must not specify type/properties/items/additionalProperties/default/..." rule).
fn junctor(s: &Map<String, Value>, path: &str, errs: &mut Vec<FieldError>) {
    for f in [
        "type",
        "additionalProperties",
        "default",
        "nullable",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string",
        "description",
    ] {
        if s.contains_key(f) {
            // Upstream allows the int-or-string anyOf idiom ({type: integer}, {type: string}).
            if f == "type" {
                continue;
            }
            errs.push(FieldError::forbidden(
                &child(path, f),
                "must be empty to be structural",
            ));
        }
    }
    if let Some(Value::Object(props)) = s.get("properties") {
        for (k, ps) in props {
            if let Value::Object(m) = ps {
                junctor(m, &format!("{path}.properties[{k}]"), errs);
            }
        }
    }
    if let Some(Value::Object(m)) = s.get("items") {
        junctor(m, &child(path, "items"), errs);
    }
}

fn list_type(s: &Map<String, Value>, t: &str, path: &str, errs: &mut Vec<FieldError>) {
    let Some(lt) = s.get("x-kubernetes-list-type") else {
        if s.contains_key("x-kubernetes-list-map-keys") {
            errs.push(FieldError::forbidden(
                &child(path, "x-kubernetes-list-map-keys"),
                "must be empty if x-kubernetes-list-type is not map",
            ));
        }
        return;
    };
    let lp = child(path, "x-kubernetes-list-type");
    if t != "array" {
        errs.push(FieldError::invalid(
            &lp,
            render(lt),
            "must only be used if type is array",
        ));
        return;
    }
    let items = s.get("items").and_then(Value::as_object);
    match lt.as_str().unwrap_or("") {
        "atomic" => {}
        "set" => {
            if let Some(is) = items
                && matches!(
                    is.get("type").and_then(Value::as_str),
                    Some("object" | "array")
                )
            {
                errs.push(FieldError::invalid(
                    &child(path, "items.type"),
                    render(is.get("type").unwrap_or(&Value::Null)),
                    "must be a scalar type if parent array's x-kubernetes-list-type is set",
                ));
            }
        }
        "map" => {
            let keys: Vec<&str> = s
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if keys.is_empty() {
                errs.push(FieldError::required(
                    &child(path, "x-kubernetes-list-map-keys"),
                    "must not be empty if x-kubernetes-list-type is map",
                ));
            }
            match items {
                Some(is) if is.get("type").and_then(Value::as_str) == Some("object") => {
                    let props = is.get("properties").and_then(Value::as_object);
                    let required: Vec<&str> = is
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    for k in keys {
                        let Some(ks) = props.and_then(|p| p.get(k)).and_then(Value::as_object)
                        else {
                            errs.push(FieldError::invalid(
                                &child(path, "x-kubernetes-list-map-keys"),
                                format!("\"{k}\""),
                                "entries must all be names of item properties",
                            ));
                            continue;
                        };
                        if !required.contains(&k) && !ks.contains_key("default") {
                            errs.push(FieldError::required(
                                &child(path, "items.required"),
                                &format!(
                                    "all map keys must be required or have a default value ({k})"
                                ),
                            ));
                        }
                        if matches!(
                            ks.get("type").and_then(Value::as_str),
                            Some("object" | "array")
                        ) {
                            errs.push(FieldError::invalid(
                                &format!("{path}.items.properties[{k}].type"),
                                render(ks.get("type").unwrap_or(&Value::Null)),
                                "must be a scalar type if parent array's x-kubernetes-list-type is map",
                            ));
                        }
                    }
                }
                _ => errs.push(FieldError::invalid(
                    &child(path, "items.type"),
                    render(
                        items
                            .and_then(|i| i.get("type"))
                            .unwrap_or(&Value::String(String::new())),
                    ),
                    "must be object if parent array's x-kubernetes-list-type is map",
                )),
            }
        }
        other => errs.push(FieldError::not_supported(
            &lp,
            format!("\"{other}\""),
            vec!["\"atomic\"".into(), "\"set\"".into(), "\"map\"".into()],
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> Vec<String> {
        check(&v, "s").into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn structural_table() {
        let ok = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "a": {"type": "string", "default": "x"},
                "p": {"x-kubernetes-int-or-string": true},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "l": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
                      "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
                "m": {"type": "object", "additionalProperties": {"type": "integer"}}
            }},
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}}
        }});
        assert_eq!(fields(ok), Vec::<String>::new());
        let cases = [
            (json!({"type": "string"}), vec!["s.type"]),
            (
                json!({"type": "object", "properties": {"a": {}}}),
                vec!["s.properties[a].type"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array"}}}),
                vec!["s.properties[a].items"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "items": {}}}}),
                vec!["s.properties[a].items.type"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}}}}),
                vec!["s.properties[a].additionalProperties"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "object", "additionalProperties": false}}}),
                vec!["s.properties[a].additionalProperties"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "x-kubernetes-int-or-string": true}}}),
                vec!["s.properties[a].type"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "integer", "default": "x"}}}),
                vec!["s.properties[a].default"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}, "default": {"c": 1}}}}),
                vec!["s.properties[a].default"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}),
                vec!["s.properties[a].pattern"],
            ),
            (
                json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}}),
                vec!["s.properties[metadata]"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "set"}}}),
                vec!["s.properties[a].items.type"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "map"}}}),
                vec![
                    "s.properties[a].x-kubernetes-list-map-keys",
                    "s.properties[a].items.type",
                ],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "x-kubernetes-list-type": "set"}}}),
                vec!["s.properties[a].x-kubernetes-list-type"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "object", "x-kubernetes-embedded-resource": true}}}),
                vec!["s.properties[a].properties"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "anyOf": [{"type": "string", "default": "x"}]}}}),
                vec!["s.properties[a].anyOf[0].default"],
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "date"}}}),
                vec!["s.properties[a].type"],
            ),
        ];
        for (schema, want) in cases {
            assert_eq!(fields(schema.clone()), want, "{schema}");
        }
    }
}
