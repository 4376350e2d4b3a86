//! Typed decoding of request bodies: a JSON value is read into its `k8s-openapi` type, which
//! drops fields the schema does not know; comparing before and after names those fields, which is
//! what `fieldValidation` (Strict / Warn / Ignore) reports.
//!
//! It also holds the measures the API server bounds every decoded document with: [`depth`]
//! (nesting of arrays and objects, counted without recursion) and [`encoded_len_within`] (the
//! length of the compact JSON encoding, counted without building it and given up past a cap).

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

/// Why a body is not an object of its kind. The text is the part after
/// `<Kind> in version "<v>" cannot be handled as a <Kind>: ` of the API server's 400.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The value does not deserialize as the kind's type (serde's message).
    #[error("{0}")]
    Invalid(serde_json::Error),
    /// The typed object does not serialize back to JSON.
    #[error("{0}")]
    Encode(serde_json::Error),
    /// A custom resource without `kind`.
    #[error("Object 'Kind' is missing in the request body")]
    MissingKind,
    /// A custom resource whose `metadata` is not an `ObjectMeta`.
    #[error("metadata: {0}")]
    Metadata(Box<DecodeError>),
}

/// Reads `value` as `K`.
pub fn decode<K: DeserializeOwned + Serialize>(value: &Value) -> Result<Decoded<K>, DecodeError> {
    // Deserialising from a reference reads the value in place (no copy of the whole document).
    let object: K = K::deserialize(value).map_err(DecodeError::Invalid)?;
    let back = serde_json::to_value(&object).map_err(DecodeError::Encode)?;
    let mut unknown = Vec::new();
    diff_unknown(value, &back, "", &mut unknown);
    Ok(Decoded { object, unknown })
}

/// The deepest nesting of arrays and objects any API object may have (a scalar or an empty
/// container at the top is depth 1). Every stored object must parse again with a JSON parser
/// that stops at 128 levels (serde_json's and kube-rs's default), also when it is wrapped in a
/// list (`items`, two more levels) or a watch event (`object`, one more).
pub const MAX_DEPTH: usize = 100;

/// Nesting depth of `v`: 1 for a scalar, 1 + the deepest member for arrays and objects.
/// Iterative, so a document of any depth is measured without exhausting the stack.
pub fn depth(v: &Value) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 1)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(m) => stack.extend(m.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// The length in bytes of `v`'s compact JSON encoding, or `None` when it is longer than `cap`
/// (counting stops there: no more than `cap` bytes are ever produced, and nothing is kept).
///
/// Serialisation recurses, so `v` must be of bounded depth (see [`MAX_DEPTH`]).
pub fn encoded_len_within(v: &Value, cap: u64) -> Option<u64> {
    struct Count {
        n: u64,
        cap: u64,
    }
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.n = self.n.saturating_add(buf.len() as u64);
            if self.n > self.cap {
                return Err(std::io::Error::other("over the cap"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = Count { n: 0, cap };
    serde_json::to_writer(&mut w, v).ok().map(|()| w.n)
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
    fn depth_counts_nesting() {
        let cases = [
            (json!(1), 1),
            (json!({}), 1),
            (json!([]), 1),
            (json!({"a": 1}), 2),
            (json!({"a": [1, {"b": [[]]}]}), 5),
            (json!([[], [[[]]], {}]), 4),
        ];
        for (v, want) in cases {
            assert_eq!(depth(&v), want, "{v}");
        }
        // Deeper than any recursion could take: built and measured without recursing.
        let mut v = Value::Null;
        for _ in 0..100_000 {
            v = Value::Array(vec![v]);
        }
        assert_eq!(depth(&v), 100_001);
        // Dropping it would recurse; take it apart level by level.
        while let Value::Array(mut a) = v {
            v = a.pop().unwrap_or(Value::Null);
        }
    }

    #[test]
    fn encoded_len_is_exact_and_capped() {
        let cases = [
            json!(null),
            json!({"a": [1, 2, "x\"y"], "b": {"c": 1.5}}),
            json!("é\u{1}"),
        ];
        for v in cases {
            let n = serde_json::to_vec(&v).map(|b| b.len() as u64).unwrap_or(0);
            assert_eq!(encoded_len_within(&v, n), Some(n), "{v}");
            assert_eq!(encoded_len_within(&v, n - 1), None, "{v}");
        }
    }

    #[test]
    fn type_errors_are_errors() {
        let v = json!({"spec":{"ports":[{"port":"eighty"}]}});
        assert!(decode::<Service>(&v).is_err());
    }
}
