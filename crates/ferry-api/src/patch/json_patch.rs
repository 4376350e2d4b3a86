//! RFC 6902 JSON patch (`application/json-patch+json`) with RFC 6901 JSON pointers.
//!
//! The operations are applied in order to a copy of the target; the first failing operation
//! aborts the whole patch. Error texts follow the Go library the API server uses
//! (`"replace operation does not apply: doc is missing path: /a/b: missing value"`,
//! `"testing value /a failed: test failed"`).

use serde_json::Value;

use super::PatchError;

/// Applies the JSON patch `ops` (an array of operation objects) to `target`.
pub fn apply(target: &Value, ops: &Value) -> Result<Value, PatchError> {
    let Value::Array(ops) = ops else {
        return Err(PatchError::bad(
            "json: cannot unmarshal into Go value of type jsonpatch.Patch: the patch must be an array",
        ));
    };
    let mut doc = target.clone();
    for op in ops {
        apply_op(&mut doc, op)?;
    }
    Ok(doc)
}

fn str_member<'a>(op: &'a Value, name: &str, kind: &str) -> Result<&'a str, PatchError> {
    match op.get(name) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(PatchError::bad(format!(
            "{kind} operation: missing or invalid \"{name}\" member"
        ))),
    }
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), PatchError> {
    let Value::Object(_) = op else {
        return Err(PatchError::bad("a JSON patch operation must be an object"));
    };
    let kind = match op.get("op") {
        Some(Value::String(s)) => s.as_str(),
        _ => {
            return Err(PatchError::bad(
                "a JSON patch operation needs an \"op\" member",
            ));
        }
    };
    let path_str = str_member(op, "path", kind)?;
    let path = parse_pointer(path_str)?;
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| PatchError::bad(format!("{kind} operation: missing \"value\" member")))
    };
    let missing = |k: &str| {
        PatchError::invalid(format!(
            "{k} operation does not apply: doc is missing path: {path_str}: missing value"
        ))
    };
    match kind {
        "add" => add(doc, &path, value()?).map_err(|_| missing("add")),
        "remove" => remove(doc, &path).map(drop).map_err(|_| missing("remove")),
        "replace" => {
            let v = value()?;
            let slot = get_mut(doc, &path).ok_or_else(|| missing("replace"))?;
            *slot = v;
            Ok(())
        }
        "move" => {
            let from_str = str_member(op, "from", kind)?;
            let from = parse_pointer(from_str)?;
            if path.len() > from.len() && path[..from.len()] == from[..] {
                return Err(PatchError::invalid(format!(
                    "move operation does not apply: \"from\" {from_str} is a prefix of \"path\" {path_str}"
                )));
            }
            let v = remove(doc, &from).map_err(|_| {
                PatchError::invalid(format!(
                    "move operation does not apply: doc is missing from path: {from_str}: missing value"
                ))
            })?;
            add(doc, &path, v).map_err(|_| missing("move"))
        }
        "copy" => {
            let from_str = str_member(op, "from", kind)?;
            let from = parse_pointer(from_str)?;
            let v = get(doc, &from).cloned().ok_or_else(|| {
                PatchError::invalid(format!(
                    "copy operation does not apply: doc is missing from path: {from_str}: missing value"
                ))
            })?;
            add(doc, &path, v).map_err(|_| missing("copy"))
        }
        "test" => {
            let want = value()?;
            match get(doc, &path) {
                Some(have) if json_eq(have, &want) => Ok(()),
                _ => Err(PatchError::TestFailed(format!(
                    "testing value {path_str} failed: test failed"
                ))),
            }
        }
        other => Err(PatchError::bad(format!("Unexpected kind: {other}"))),
    }
}

/// Parses an RFC 6901 pointer into unescaped reference tokens.
pub fn parse_pointer(p: &str) -> Result<Vec<String>, PatchError> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(PatchError::bad(format!(
            "invalid JSON pointer {p:?}: must be empty or start with \"/\""
        )));
    };
    rest.split('/')
        .map(|t| {
            let mut out = String::with_capacity(t.len());
            let mut chars = t.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => {
                            return Err(PatchError::bad(format!(
                                "invalid JSON pointer {p:?}: bad escape"
                            )));
                        }
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}

/// An array index token: decimal digits without leading zeros.
fn index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    if token == "-" {
        return allow_end.then_some(len);
    }
    if token.is_empty()
        || !token.bytes().all(|b| b.is_ascii_digit())
        || (token.len() > 1 && token.starts_with('0'))
    {
        return None;
    }
    let i: usize = token.parse().ok()?;
    let limit = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    (i <= limit && (allow_end || len > 0)).then_some(i)
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get(t),
        Value::Array(a) => index(t, a.len(), false).and_then(|i| a.get(i)),
        _ => None,
    })
}

fn get_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => {
            let len = a.len();
            index(t, len, false).and_then(move |i| a.get_mut(i))
        }
        _ => None,
    })
}

fn add(doc: &mut Value, path: &[String], v: Value) -> Result<(), ()> {
    let Some((last, parent)) = path.split_last() else {
        *doc = v;
        return Ok(());
    };
    match get_mut(doc, parent).ok_or(())? {
        Value::Object(m) => {
            m.insert(last.clone(), v);
            Ok(())
        }
        Value::Array(a) => {
            let i = index(last, a.len(), true).ok_or(())?;
            a.insert(i, v);
            Ok(())
        }
        _ => Err(()),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, ()> {
    let Some((last, parent)) = path.split_last() else {
        return Err(());
    };
    match get_mut(doc, parent).ok_or(())? {
        Value::Object(m) => m.shift_remove(last).ok_or(()),
        Value::Array(a) => {
            let i = index(last, a.len(), false).ok_or(())?;
            Ok(a.remove(i))
        }
        _ => Err(()),
    }
}

/// JSON equality where `1` and `1.0` are the same number.
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || (x.as_f64().is_some() && x.as_f64() == y.as_f64())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn operations() {
        let doc = json!({"foo": "bar", "a/b": 1, "m~n": 2, "arr": [1, 2, 3], "o": {"x": 1}});
        let cases = [
            (
                json!([{"op":"add","path":"/baz","value":"qux"}]),
                json!({"foo":"bar","a/b":1,"m~n":2,"arr":[1,2,3],"o":{"x":1},"baz":"qux"}),
            ),
            (
                json!([{"op":"add","path":"/arr/1","value":9}]),
                json!({"foo":"bar","a/b":1,"m~n":2,"arr":[1,9,2,3],"o":{"x":1}}),
            ),
            (
                json!([{"op":"add","path":"/arr/-","value":9}]),
                json!({"foo":"bar","a/b":1,"m~n":2,"arr":[1,2,3,9],"o":{"x":1}}),
            ),
            (
                json!([{"op":"add","path":"/arr/3","value":9}]),
                json!({"foo":"bar","a/b":1,"m~n":2,"arr":[1,2,3,9],"o":{"x":1}}),
            ),
            (
                json!([{"op":"remove","path":"/a~1b"}]),
                json!({"foo":"bar","m~n":2,"arr":[1,2,3],"o":{"x":1}}),
            ),
            (
                json!([{"op":"remove","path":"/m~0n"}]),
                json!({"foo":"bar","a/b":1,"arr":[1,2,3],"o":{"x":1}}),
            ),
            (
                json!([{"op":"remove","path":"/arr/0"}]),
                json!({"foo":"bar","a/b":1,"m~n":2,"arr":[2,3],"o":{"x":1}}),
            ),
            (
                json!([{"op":"replace","path":"/foo","value":{"z":1}}]),
                json!({"foo":{"z":1},"a/b":1,"m~n":2,"arr":[1,2,3],"o":{"x":1}}),
            ),
            (
                json!([{"op":"move","from":"/o/x","path":"/y"}]),
                json!({"foo":"bar","a/b":1,"m~n":2,"arr":[1,2,3],"o":{},"y":1}),
            ),
            (
                json!([{"op":"move","from":"/arr/0","path":"/arr/-"}]),
                json!({"foo":"bar","a/b":1,"m~n":2,"arr":[2,3,1],"o":{"x":1}}),
            ),
            (
                json!([{"op":"copy","from":"/o","path":"/p"}]),
                json!({"foo":"bar","a/b":1,"m~n":2,"arr":[1,2,3],"o":{"x":1},"p":{"x":1}}),
            ),
            (
                json!([{"op":"test","path":"/arr","value":[1,2,3]},{"op":"test","path":"/o/x","value":1.0}]),
                doc.clone(),
            ),
            (json!([{"op":"add","path":"","value":[1]}]), json!([1])),
            (json!([]), doc.clone()),
        ];
        for (ops, want) in cases {
            assert_eq!(apply(&doc, &ops).unwrap(), want, "{ops}");
        }
    }

    #[test]
    fn errors() {
        let doc = json!({"foo": "bar", "arr": [1], "o": {"x": 1}});
        let cases: &[(Value, u16, &str)] = &[
            (json!({"op":"add"}), 400, "must be an array"),
            (
                json!([{"op":"add","path":"/a/b","value":1}]),
                422,
                "add operation does not apply: doc is missing path: /a/b: missing value",
            ),
            (
                json!([{"op":"remove","path":"/nope"}]),
                422,
                "remove operation does not apply",
            ),
            (
                json!([{"op":"replace","path":"/nope","value":1}]),
                422,
                "replace operation does not apply",
            ),
            (
                json!([{"op":"replace","path":"/arr/1","value":1}]),
                422,
                "replace operation",
            ),
            (
                json!([{"op":"add","path":"/arr/2","value":1}]),
                422,
                "add operation",
            ),
            (
                json!([{"op":"add","path":"/arr/01","value":1}]),
                422,
                "add operation",
            ),
            (
                json!([{"op":"remove","path":"/arr/-"}]),
                422,
                "remove operation",
            ),
            (
                json!([{"op":"test","path":"/foo","value":"baz"}]),
                422,
                "testing value /foo failed: test failed",
            ),
            (
                json!([{"op":"test","path":"/nope","value":null}]),
                422,
                "test failed",
            ),
            (
                json!([{"op":"frob","path":"/foo"}]),
                400,
                "Unexpected kind: frob",
            ),
            (
                json!([{"op":"add","path":"foo","value":1}]),
                400,
                "invalid JSON pointer",
            ),
            (
                json!([{"op":"add","path":"/foo"}]),
                400,
                "missing \"value\"",
            ),
            (
                json!([{"op":"move","from":"/o","path":"/o/y"}]),
                422,
                "prefix",
            ),
            (
                json!([{"op":"copy","from":"/zz","path":"/y"}]),
                422,
                "copy operation",
            ),
        ];
        for (ops, code, msg) in cases {
            let e = apply(&doc, ops).unwrap_err();
            assert_eq!(e.code(), *code, "{ops}: {e}");
            assert!(e.to_string().contains(msg), "{ops}: {e}");
        }
        let e = apply(&doc, &json!([{"op":"test","path":"/foo","value":"x"}])).unwrap_err();
        assert!(matches!(e, PatchError::TestFailed(_)));
    }

    #[test]
    fn failure_leaves_target_untouched_and_aborts() {
        let doc = json!({"a": 1});
        let ops = json!([{"op":"add","path":"/b","value":2},{"op":"test","path":"/a","value":2}]);
        assert!(apply(&doc, &ops).is_err());
        assert_eq!(doc, json!({"a": 1}));
    }
}
