//! RFC 7386 JSON merge patch (`application/merge-patch+json`).

use serde_json::{Map, Value};

/// Applies the merge patch `patch` to `target`: objects are merged recursively, `null` removes a
/// member, anything else (arrays included) replaces the target value.
pub fn apply(target: &Value, patch: &Value) -> Value {
    let Value::Object(p) = patch else {
        return patch.clone();
    };
    let mut out = match target {
        Value::Object(t) => t.clone(),
        _ => Map::new(),
    };
    for (k, v) in p {
        if v.is_null() {
            out.remove(k);
        } else {
            let merged = apply(out.get(k).unwrap_or(&Value::Null), v);
            out.insert(k.clone(), merged);
        }
    }
    Value::Object(out)
}

/// The merge patch that turns `from` into `to` (`apply(from, &diff(from, to)) == to` for
/// objects whose values contain no `null`).
pub fn diff(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut out = Map::new();
            for (k, fv) in f {
                match t.get(k) {
                    None => {
                        out.insert(k.clone(), Value::Null);
                    }
                    Some(tv) if tv != fv => {
                        out.insert(k.clone(), diff(fv, tv));
                    }
                    Some(_) => {}
                }
            }
            for (k, tv) in t {
                if !f.contains_key(k) {
                    out.insert(k.clone(), tv.clone());
                }
            }
            Value::Object(out)
        }
        _ => to.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The examples of RFC 7386, appendix A.
    #[test]
    fn rfc_examples() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (t, p, want) in cases {
            assert_eq!(apply(&t, &p), want, "target {t} patch {p}");
        }
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            "[a-z]{0,3}".prop_map(Value::from)
        ]
    }

    fn doc() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::btree_map("[a-d]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn object() -> impl Strategy<Value = Value> {
        prop::collection::btree_map("[a-d]", doc(), 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    proptest! {
        #[test]
        fn diff_then_apply_reproduces_target(from in object(), to in object()) {
            let p = diff(&from, &to);
            prop_assert_eq!(apply(&from, &p), to);
        }

        #[test]
        fn apply_is_idempotent(t in object(), p in object()) {
            let once = apply(&t, &p);
            prop_assert_eq!(apply(&once, &p), once);
        }
    }
}
