//! Small helpers on JSON objects: metadata access, selectors, time.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

pub fn meta(v: &Value) -> Option<&Map<String, Value>> {
    v.get("metadata").and_then(Value::as_object)
}

pub fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        if let Value::Object(m) = v {
            m.insert("metadata".into(), Value::Object(Map::new()));
        } else {
            *v = serde_json::json!({"metadata": {}});
        }
    }
    match v.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        // Unreachable: ensured above.
        _ => unreachable_meta(),
    }
}

#[allow(clippy::panic)]
fn unreachable_meta() -> ! {
    panic!("metadata is an object")
}

pub fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    meta(v).and_then(|m| m.get(field)).and_then(Value::as_str)
}

pub fn name(v: &Value) -> &str {
    meta_str(v, "name").unwrap_or("")
}

pub fn namespace(v: &Value) -> &str {
    meta_str(v, "namespace").unwrap_or("")
}

pub fn uid(v: &Value) -> &str {
    meta_str(v, "uid").unwrap_or("")
}

pub fn labels(v: &Value) -> BTreeMap<String, String> {
    meta(v)
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

pub fn finalizers(v: &Value) -> Vec<String> {
    meta(v)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub fn set_finalizers(v: &mut Value, f: &[String]) {
    let m = meta_mut(v);
    if f.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert(
            "finalizers".into(),
            Value::Array(f.iter().map(|s| Value::String(s.clone())).collect()),
        );
    }
}

pub fn is_deleting(v: &Value) -> bool {
    meta(v)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null())
}

/// RFC 3339, seconds precision, `Z`.
pub fn now_rfc3339() -> String {
    let ts = jiff::Timestamp::now();
    let secs = ts.as_second();
    jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| ts.to_string())
}

/// RFC 3339 `Z` timestamp `secs` seconds from now.
pub fn rfc3339_in(secs: i64) -> String {
    let now = jiff::Timestamp::now().as_second();
    jiff::Timestamp::from_second(now + secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| now_rfc3339())
}

/// The object without the fields the server manages, for "did anything change" comparisons.
pub fn without_volatile(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    c
}

/// Spec-ish content: everything but metadata and status (for generation bumps).
pub fn spec_part(v: &Value) -> Value {
    let mut c = v.clone();
    if let Value::Object(m) = &mut c {
        m.remove("metadata");
        m.remove("status");
        m.remove("kind");
        m.remove("apiVersion");
    }
    c
}

/// Five characters from upstream's generateName alphabet.
pub fn random_suffix() -> String {
    use rand::Rng;
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| char::from(ALPHA[rng.random_range(0..ALPHA.len())]))
        .collect()
}
