//! Typed decoding of request bodies: a JSON value is read into its `k8s-openapi` type, which
//! drops fields the schema does not know; comparing before and after names those fields, which is
//! what `fieldValidation` (Strict / Warn / Ignore) reports.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The result of decoding one object.
#[derive(Debug, Clone)]
pub struct Decoded<K> {
    pub object: K,
    /// Paths of fields the schema does not know, upstream style (`spec.bogus`, `spec.ports[0].x`).
    pub unknown: Vec<String>,
}

/// Reads `value` as `K`. The error text is the part after
/// `<Kind> in version "<v>" cannot be handled as a <Kind>: `.
pub fn decode<K: DeserializeOwned + Serialize>(value: &Value) -> Result<Decoded<K>, String> {
    let object: K = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    let mut unknown = Vec::new();
    diff_unknown(value, &back, "", &mut unknown);
    Ok(Decoded { object, unknown })
}

/// Serialises a typed object back to a JSON value.
pub fn encode<K: Serialize>(object: &K) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Collects paths present (and non-null) in `given` but absent from `kept`.
/// `kind` and `apiVersion` at the top level are always known.
pub fn diff_unknown(given: &Value, kept: &Value, prefix: &str, out: &mut Vec<String>) {
    match (given, kept) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, gv) in g {
                if prefix.is_empty() && (key == "kind" || key == "apiVersion") {
                    continue;
                }
                match k.get(key) {
                    Some(kv) => diff_unknown(gv, kv, &join(prefix, key), out),
                    None => {
                        if !is_empty_value(gv) {
                            out.push(join(prefix, key));
                        }
                    }
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k.iter()).enumerate() {
                diff_unknown(gv, kv, &format!("{prefix}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Values a typed round trip may legitimately drop without the field being unknown.
fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_empty_value),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    #[test]
    fn finds_unknown_fields() {
        let v = json!({"apiVersion":"v1","kind":"Service","metadata":{"name":"a","creationTimestamp":null},
            "spec":{"bogus":1,"ports":[{"port":80,"x":true}]},"status":{"loadBalancer":{}}});
        let d = decode::<Service>(&v).expect("decodes");
        assert_eq!(
            d.unknown,
            vec!["spec.bogus".to_string(), "spec.ports[0].x".to_string()]
        );
    }

    #[test]
    fn type_errors_are_errors() {
        let v = json!({"spec":{"ports":[{"port":"eighty"}]}});
        assert!(decode::<Service>(&v).is_err());
    }
}
