//! A structural schema applied to a custom object: [`validate`], [`default`] and [`prune`], as
//! apiextensions-apiserver does on every write (prune, default, validate) and on every read from
//! storage (prune, default).
//!
//! Schemas are the `openAPIV3Schema` JSON of a CRD version. Error messages follow kube-openapi's
//! validator as apiextensions-apiserver reports them (`spec.replicas in body should be less than or
//! equal to 10`).

use std::collections::BTreeSet;

use regex::Regex;
use serde_json::{Map, Value};

use crate::{ErrorType, FieldError, child, index, render};

fn flag(s: &Map<String, Value>, name: &str) -> bool {
    s.get(name).and_then(Value::as_bool).unwrap_or(false)
}

fn type_of(s: &Map<String, Value>) -> &str {
    s.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The JSON type name of a value as upstream names it in type errors.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(v: &Value) -> bool {
    matches!(v, Value::Number(n) if n.is_i64() || n.is_u64())
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "" => true,
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => is_integer(v),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => false,
    }
}

/// The text of a number as Go's `%v` prints it in messages (`10`, `1.5`).
fn num_text(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        Some(f) => format!("{f}"),
        None => render(v),
    }
}

/// Validates `value` against `schema`; `path` is the field path of `value` (empty at the root).
pub fn validate(schema: &Value, value: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Value::Object(s) = schema {
        validate_node(s, value, path, &mut errs);
    }
    errs
}

fn body_path(path: &str) -> &str {
    if path.is_empty() { "body" } else { path }
}

fn validate_node(s: &Map<String, Value>, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let bp = body_path(path);
    if v.is_null() {
        if flag(s, "nullable") {
            return;
        }
        // Upstream: null is only valid for nullable fields (and for schemas without a type).
        if !type_of(s).is_empty() || flag(s, "x-kubernetes-int-or-string") {
            let t = if flag(s, "x-kubernetes-int-or-string") {
                "integer,string"
            } else {
                type_of(s)
            };
            errs.push(FieldError::invalid(
                path,
                "\"null\"".to_string(),
                format!("{bp} in body must be of type {t}: \"null\""),
            ));
        }
        return;
    }
    if flag(s, "x-kubernetes-int-or-string") {
        if !(is_integer(v) || v.is_string()) {
            errs.push(FieldError::invalid(
                path,
                render(&Value::String(json_type(v).to_string())),
                format!(
                    "{bp} in body must be of type integer,string: {}",
                    render(&Value::String(json_type(v).to_string()))
                ),
            ));
            return;
        }
    } else {
        let t = type_of(s);
        if !type_matches(t, v) {
            let actual = json_type(v);
            errs.push(FieldError::invalid(
                path,
                render(&Value::String(actual.to_string())),
                format!("{bp} in body must be of type {t}: \"{actual}\""),
            ));
            return;
        }
    }
    if let Some(Value::Array(allowed)) = s.get("enum")
        && !allowed.iter().any(|a| a == v)
    {
        errs.push(FieldError::not_supported(
            path,
            render(v),
            allowed.iter().map(render).collect(),
        ));
    }
    match v {
        Value::String(text) => validate_string(s, text, v, path, errs),
        Value::Number(_) => validate_number(s, v, path, errs),
        Value::Array(items) => validate_array(s, items, v, path, errs),
        Value::Object(m) => validate_object(s, m, v, path, errs),
        _ => {}
    }
    validate_junctors(s, v, path, errs);
}

fn validate_string(
    s: &Map<String, Value>,
    text: &str,
    v: &Value,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let bp = body_path(path);
    let len = text.chars().count() as u64;
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        errs.push(FieldError::new(
            ErrorType::TooLong,
            path,
            Some(render(v)),
            format!("may not be more than {max} bytes"),
        ));
    }
    if let Some(min) = s.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        errs.push(FieldError::invalid(
            path,
            render(v),
            format!("{bp} in body should be at least {min} chars long"),
        ));
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        // Patterns were checked when the CRD was written; one that does not compile matches
        // nothing, as a Go validator would fail it.
        let ok = Regex::new(p).map(|re| re.is_match(text)).unwrap_or(false);
        if !ok {
            errs.push(FieldError::invalid(
                path,
                render(v),
                format!("{bp} in body should match '{p}'"),
            ));
        }
    }
    if let Some(f) = s.get("format").and_then(Value::as_str)
        && !format_ok(f, text)
    {
        errs.push(FieldError::invalid(
            path,
            render(v),
            format!("{bp} in body must be of type {f}: {}", render(v)),
        ));
    }
}

/// The string formats upstream checks that Ferry checks too; unknown formats pass, as upstream.
pub fn format_ok(format: &str, text: &str) -> bool {
    match format {
        "int32" | "int64" | "float" | "double" => true,
        "date-time" | "datetime" => {
            // RFC 3339: 2006-01-02T15:04:05(.frac)?(Z|±hh:mm)
            let re = Regex::new(
                r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$",
            );
            re.map(|r| r.is_match(text)).unwrap_or(true)
        }
        "date" => Regex::new(r"^\d{4}-\d{2}-\d{2}$")
            .map(|r| r.is_match(text))
            .unwrap_or(true),
        "byte" => {
            let t = text.trim_end_matches('=');
            t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
                && text.len().is_multiple_of(4)
        }
        "uuid" => Regex::new(
            r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
        )
        .map(|r| r.is_match(text))
        .unwrap_or(true),
        "ipv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
        _ => true,
    }
}

fn validate_number(s: &Map<String, Value>, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let bp = body_path(path);
    let Some(x) = v.as_f64() else {
        return;
    };
    if let Some(max) = s.get("maximum").filter(|m| m.is_number()) {
        let m = max.as_f64().unwrap_or(f64::MAX);
        if flag(s, "exclusiveMaximum") {
            if x >= m {
                errs.push(FieldError::invalid(
                    path,
                    render(v),
                    format!("{bp} in body should be less than {}", num_text(max)),
                ));
            }
        } else if x > m {
            errs.push(FieldError::invalid(
                path,
                render(v),
                format!(
                    "{bp} in body should be less than or equal to {}",
                    num_text(max)
                ),
            ));
        }
    }
    if let Some(min) = s.get("minimum").filter(|m| m.is_number()) {
        let m = min.as_f64().unwrap_or(f64::MIN);
        if flag(s, "exclusiveMinimum") {
            if x <= m {
                errs.push(FieldError::invalid(
                    path,
                    render(v),
                    format!("{bp} in body should be greater than {}", num_text(min)),
                ));
            }
        } else if x < m {
            errs.push(FieldError::invalid(
                path,
                render(v),
                format!(
                    "{bp} in body should be greater than or equal to {}",
                    num_text(min)
                ),
            ));
        }
    }
    if let Some(mo) = s.get("multipleOf").filter(|m| m.is_number()) {
        let m = mo.as_f64().unwrap_or(1.0);
        if m > 0.0 {
            let q = x / m;
            if (q - q.round()).abs() > 1e-9 {
                errs.push(FieldError::invalid(
                    path,
                    render(v),
                    format!("{bp} in body should be a multiple of {}", num_text(mo)),
                ));
            }
        }
    }
}

/// The key of a list-map item: the values of its map keys, rendered.
fn map_key(item: &Value, keys: &[&str]) -> String {
    keys.iter()
        .map(|k| format!("{k}={}", render(item.get(*k).unwrap_or(&Value::Null))))
        .collect::<Vec<_>>()
        .join(",")
}

fn validate_array(
    s: &Map<String, Value>,
    items: &[Value],
    v: &Value,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let bp = body_path(path);
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
        && items.len() as u64 > max
    {
        errs.push(FieldError::new(
            ErrorType::TooMany,
            path,
            Some(items.len().to_string()),
            format!("must have at most {max} items"),
        ));
    }
    if let Some(min) = s.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        errs.push(FieldError::invalid(
            path,
            render(v),
            format!("{bp} in body should have at least {min} items"),
        ));
    }
    let list_type = s
        .get("x-kubernetes-list-type")
        .and_then(Value::as_str)
        .unwrap_or("atomic");
    if flag(s, "uniqueItems") || list_type == "set" {
        let mut seen = BTreeSet::new();
        for (i, it) in items.iter().enumerate() {
            if !seen.insert(it.to_string()) {
                errs.push(FieldError::duplicate(&index(path, i), render(it)));
            }
        }
    }
    if list_type == "map" {
        let keys: Vec<&str> = s
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut seen = BTreeSet::new();
        for (i, it) in items.iter().enumerate() {
            if !it.is_object() {
                continue;
            }
            let k = map_key(it, &keys);
            if !seen.insert(k.clone()) {
                errs.push(FieldError::duplicate(
                    &index(path, i),
                    format!("map[string]interface {{}}{{{k}}}"),
                ));
            }
        }
    }
    if let Some(Value::Object(item_schema)) = s.get("items") {
        for (i, it) in items.iter().enumerate() {
            validate_node(item_schema, it, &index(path, i), errs);
        }
    }
}

fn validate_object(
    s: &Map<String, Value>,
    m: &Map<String, Value>,
    v: &Value,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let bp = body_path(path);
    if let Some(Value::Array(req)) = s.get("required") {
        for r in req.iter().filter_map(Value::as_str) {
            if !m.contains_key(r) {
                errs.push(FieldError::required(&child(path, r), ""));
            }
        }
    }
    if let Some(max) = s.get("maxProperties").and_then(Value::as_u64)
        && m.len() as u64 > max
    {
        errs.push(FieldError::new(
            ErrorType::TooMany,
            path,
            Some(m.len().to_string()),
            format!("must have at most {max} items"),
        ));
    }
    if let Some(min) = s.get("minProperties").and_then(Value::as_u64)
        && (m.len() as u64) < min
    {
        errs.push(FieldError::invalid(
            path,
            render(v),
            format!("{bp} in body should have at least {min} properties"),
        ));
    }
    if flag(s, "x-kubernetes-embedded-resource") {
        for f in ["apiVersion", "kind"] {
            if m.get(f).and_then(Value::as_str).unwrap_or("").is_empty() {
                errs.push(FieldError::required(&child(path, f), "must not be empty"));
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    for (k, fv) in m {
        match props.and_then(|p| p.get(k)).and_then(Value::as_object) {
            Some(ps) => validate_node(ps, fv, &child(path, k), errs),
            None => {
                if let Some(Value::Object(ap)) = s.get("additionalProperties") {
                    validate_node(ap, fv, &child(path, k), errs);
                }
            }
        }
    }
}

/// `allOf`, `anyOf`, `oneOf` and `not`: value validations only (structural schemas keep types and
/// properties out of them).
fn validate_junctors(s: &Map<String, Value>, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let bp = body_path(path);
    let sub = |x: &Value| -> Vec<FieldError> {
        let mut e = Vec::new();
        if let Value::Object(m) = x {
            validate_node(m, v, path, &mut e);
        }
        e
    };
    if let Some(Value::Array(all)) = s.get("allOf") {
        for x in all {
            errs.extend(sub(x));
        }
    }
    if let Some(Value::Array(any)) = s.get("anyOf")
        && !any.is_empty()
    {
        let results: Vec<Vec<FieldError>> = any.iter().map(sub).collect();
        if results.iter().all(|r| !r.is_empty()) {
            for r in results {
                errs.extend(r);
            }
            errs.push(FieldError::invalid(
                path,
                render(v),
                format!("{bp} in body must validate at least one schema (anyOf)"),
            ));
        }
    }
    if let Some(Value::Array(one)) = s.get("oneOf")
        && !one.is_empty()
    {
        let ok = one.iter().filter(|x| sub(x).is_empty()).count();
        if ok != 1 {
            errs.push(FieldError::invalid(
                path,
                render(v),
                format!("{bp} in body must validate one and only one schema (oneOf)"),
            ));
        }
    }
    if let Some(not) = s.get("not")
        && sub(not).is_empty()
    {
        errs.push(FieldError::invalid(
            path,
            render(v),
            format!("{bp} in body should not validate the schema (not)"),
        ));
    }
}

/// Fills defaults: a missing property (or a `null` one that is not nullable) whose schema has a
/// `default` gets that value, top-down, through properties, additionalProperties and items.
pub fn default(schema: &Value, value: &mut Value) {
    if let Value::Object(s) = schema {
        default_node(s, value);
    }
}

fn default_node(s: &Map<String, Value>, v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = s.get("properties") {
                for (k, ps) in props {
                    let Some(psm) = ps.as_object() else {
                        continue;
                    };
                    if let Some(d) = psm.get("default") {
                        let missing = match m.get(k) {
                            None => true,
                            Some(Value::Null) => !flag(psm, "nullable"),
                            Some(_) => false,
                        };
                        if missing {
                            m.insert(k.clone(), d.clone());
                        }
                    }
                }
                for (k, fv) in m.iter_mut() {
                    if let Some(Value::Object(ps)) = props.get(k) {
                        default_node(ps, fv);
                    }
                }
            } else if let Some(Value::Object(ap)) = s.get("additionalProperties") {
                for fv in m.values_mut() {
                    default_node(ap, fv);
                }
            }
        }
        Value::Array(items) => {
            if let Some(Value::Object(is)) = s.get("items") {
                for it in items.iter_mut() {
                    if it.is_null()
                        && let Some(d) = is.get("default")
                        && !flag(is, "nullable")
                    {
                        *it = d.clone();
                    }
                    default_node(is, it);
                }
            }
        }
        _ => {}
    }
}

/// Removes the fields the schema does not know (unless `x-kubernetes-preserve-unknown-fields`);
/// returns their paths (`spec.foo`). At the root `apiVersion`, `kind` and `metadata` are always
/// kept; inside an embedded resource too.
pub fn prune(schema: &Value, value: &mut Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Value::Object(s) = schema {
        prune_node(s, value, "", true, &mut out);
    }
    out
}

fn prune_node(
    s: &Map<String, Value>,
    v: &mut Value,
    path: &str,
    root: bool,
    out: &mut Vec<String>,
) {
    let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
    match v {
        Value::Object(m) => {
            let embedded = root || flag(s, "x-kubernetes-embedded-resource");
            let props = s.get("properties").and_then(Value::as_object);
            let ap = s.get("additionalProperties");
            let mut remove = Vec::new();
            for (k, fv) in m.iter_mut() {
                let p = child(path, k);
                if let Some(Value::Object(ps)) = props.and_then(|p| p.get(k)) {
                    if embedded && k == "metadata" {
                        continue;
                    }
                    prune_node(ps, fv, &p, false, out);
                    continue;
                }
                if embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match ap {
                    Some(Value::Object(aps)) => prune_node(aps, fv, &p, false, out),
                    Some(Value::Bool(true)) => {}
                    _ if preserve => {}
                    _ => remove.push(k.clone()),
                }
            }
            for k in remove {
                m.remove(&k);
                out.push(child(path, &k));
            }
        }
        Value::Array(items) => {
            if let Some(Value::Object(is)) = s.get("items") {
                for (i, it) in items.iter_mut().enumerate() {
                    prune_node(is, it, &index(path, i), false, out);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The CronTab schema of upstream's CRD documentation, with validation added.
    fn crontab() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "cronSpec": {"type": "string", "pattern": "^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$"},
                        "image": {"type": "string"},
                        "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                        "port": {"x-kubernetes-int-or-string": true},
                        "mode": {"type": "string", "enum": ["a", "b"]},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set", "maxItems": 3},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                                  "items": {"type": "object", "required": ["name"], "properties": {
                                      "name": {"type": "string"}, "port": {"type": "integer", "default": 80}}}},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                     "x-kubernetes-preserve-unknown-fields": true}
                    },
                    "required": ["cronSpec"]
                },
                "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}
            }
        })
    }

    fn fields(errs: &[FieldError]) -> Vec<(ErrorType, String)> {
        errs.iter().map(|e| (e.kind, e.field.clone())).collect()
    }

    #[test]
    fn validation_table() {
        use ErrorType::*;
        let cases: Vec<(Value, Vec<(ErrorType, &str)>)> = vec![
            (
                json!({"spec": {"cronSpec": "* * * * */5", "replicas": 3}}),
                vec![],
            ),
            (
                json!({"spec": {"cronSpec": "* * * *"}}),
                vec![(Invalid, "spec.cronSpec")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "replicas": 15}}),
                vec![(Invalid, "spec.replicas")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "replicas": 0}}),
                vec![(Invalid, "spec.replicas")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "replicas": "3"}}),
                vec![(Invalid, "spec.replicas")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "replicas": 1.5}}),
                vec![(Invalid, "spec.replicas")],
            ),
            (json!({"spec": {}}), vec![(Required, "spec.cronSpec")]),
            (
                json!({"spec": {"cronSpec": "* * * * *", "port": 80}}),
                vec![],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "port": "http"}}),
                vec![],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "port": true}}),
                vec![(Invalid, "spec.port")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "mode": "c"}}),
                vec![(NotSupported, "spec.mode")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "tags": ["x", "x"]}}),
                vec![(Duplicate, "spec.tags[1]")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "tags": ["a", "b", "c", "d"]}}),
                vec![(TooMany, "spec.tags")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "labels": {"a": 1}}}),
                vec![(Invalid, "spec.labels.a")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "ports": [{"name": "a"}, {"name": "a"}]}}),
                vec![(Duplicate, "spec.ports[1]")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "ports": [{"port": 1}]}}),
                vec![(Required, "spec.ports[0].name")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "template": {"kind": "Pod"}}}),
                vec![(Required, "spec.template.apiVersion")],
            ),
            (
                json!({"spec": {"cronSpec": "* * * * *", "image": null}}),
                vec![(Invalid, "spec.image")],
            ),
            (json!({"spec": "x"}), vec![(Invalid, "spec")]),
        ];
        for (obj, want) in cases {
            let got = validate(&crontab(), &obj, "");
            let want: Vec<(ErrorType, String)> =
                want.into_iter().map(|(k, f)| (k, f.to_string())).collect();
            assert_eq!(fields(&got), want, "{obj}: {got:?}");
        }
    }

    #[test]
    fn messages_as_upstream() {
        let errs = validate(
            &crontab(),
            &json!({"spec": {"cronSpec": "* * * *", "replicas": 15}}),
            "",
        );
        assert_eq!(
            errs[0].detail,
            "spec.cronSpec in body should match '^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$'"
        );
        assert_eq!(errs[0].value.as_deref(), Some("\"* * * *\""));
        assert_eq!(
            errs[1].detail,
            "spec.replicas in body should be less than or equal to 10"
        );
        assert_eq!(errs[1].value.as_deref(), Some("15"));
        let errs = validate(
            &crontab(),
            &json!({"spec": {"cronSpec": "* * * * *", "replicas": "3"}}),
            "",
        );
        assert_eq!(
            errs[0].detail,
            "spec.replicas in body must be of type integer: \"string\""
        );
    }

    #[test]
    fn defaults_fill_missing_and_nested() {
        let mut obj =
            json!({"spec": {"cronSpec": "x", "ports": [{"name": "a"}, {"name": "b", "port": 8}]}});
        default(&crontab(), &mut obj);
        assert_eq!(obj["spec"]["replicas"], json!(1));
        assert_eq!(obj["spec"]["ports"][0]["port"], json!(80));
        assert_eq!(obj["spec"]["ports"][1]["port"], json!(8));
        // null on a non-nullable field with a default is defaulted.
        let mut obj = json!({"spec": {"replicas": null}});
        default(&crontab(), &mut obj);
        assert_eq!(obj["spec"]["replicas"], json!(1));
        // No spec: nothing to default inside.
        let mut obj = json!({"metadata": {"name": "a"}});
        default(&crontab(), &mut obj);
        assert_eq!(obj, json!({"metadata": {"name": "a"}}));
    }

    #[test]
    fn prune_removes_unknown_keeps_preserved() {
        let mut obj = json!({
            "apiVersion": "stable.example.com/v1", "kind": "CronTab", "metadata": {"name": "a"},
            "spec": {"cronSpec": "x", "bogus": 1, "free": {"any": {"thing": 1}},
                     "labels": {"k": "v"}, "ports": [{"name": "a", "extra": true}],
                     "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}},
            "other": 2
        });
        let pruned = prune(&crontab(), &mut obj);
        assert_eq!(pruned, vec!["spec.ports[0].extra", "spec.bogus", "other"]);
        assert_eq!(obj["spec"]["free"], json!({"any": {"thing": 1}}));
        assert_eq!(obj["spec"]["template"]["spec"], json!({}));
        assert_eq!(obj["metadata"], json!({"name": "a"}));
        assert_eq!(obj["spec"]["labels"], json!({"k": "v"}));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn arb_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i32>().prop_map(|i| json!(i)),
                "[a-z* /0-9]{0,8}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map(
                        prop_oneof![
                            Just("spec".to_string()),
                            Just("cronSpec".to_string()),
                            Just("replicas".to_string()),
                            Just("ports".to_string()),
                            Just("name".to_string()),
                            "[a-z]{1,4}"
                        ],
                        inner,
                        0..4
                    )
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #[test]
            fn prune_is_idempotent_and_default_stable(v in arb_json()) {
                let s = crontab();
                let mut a = json!({"spec": v});
                prune(&s, &mut a);
                let once = a.clone();
                prop_assert!(prune(&s, &mut a).is_empty());
                prop_assert_eq!(&a, &once);
                default(&s, &mut a);
                let d = a.clone();
                default(&s, &mut a);
                prop_assert_eq!(a, d);
            }

            #[test]
            fn validate_never_panics_and_paths_are_inside(v in arb_json()) {
                let errs = validate(&crontab(), &json!({"spec": v}), "");
                for e in errs {
                    prop_assert!(e.field.starts_with("spec"), "{}", e.field);
                }
            }
        }
    }
}
