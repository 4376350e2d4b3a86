//! RFC 6902 JSON patch (`application/json-patch+json`) with RFC 6901 JSON pointers.
//!
//! The operations are applied in order to a copy of the target; the first failing operation
//! aborts the whole patch. Error texts follow the Go library the API server uses
//! (`"replace operation does not apply: doc is missing path: /a/b: missing value"`,
//! `"testing value /a failed: test failed"`).
//!
//! The work one patch may do is bounded as kube-apiserver bounds it ([`Limits`]): at most
//! 10,000 operations (more is `413 RequestEntityTooLarge`), and at most 3 MiB added by `copy`
//! operations, counted as the compact JSON length of each copied value (more is `422`,
//! CVE-2019-1002100: a few dozen self-doubling copies would otherwise need gigabytes).
//! Operations also may not nest the document deeper than [`ferry_apimachinery::decode::MAX_DEPTH`].

use serde_json::Value;

use crate::PatchError;
use ferry_apimachinery::decode::{MAX_DEPTH, depth, encoded_len_within};

/// The most operations one JSON patch may hold (kube-apiserver's `maxJSONPatchOperations`).
pub const MAX_OPERATIONS: usize = 10_000;

/// The most bytes `copy` operations may add in one patch (kube-apiserver's
/// `JSONPatchMaxCopyBytes`: twice etcd's 1.5 MiB request limit).
pub const MAX_COPY_BYTES: u64 = 3 * 1024 * 1024;

/// Bounds on the work of one patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// More operations than this: [`PatchError::TooLarge`].
    pub max_operations: usize,
    /// More bytes added by `copy` than this: [`PatchError::Invalid`].
    pub max_copy_bytes: u64,
    /// A result nested deeper than this: [`PatchError::Invalid`].
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_operations: MAX_OPERATIONS,
            max_copy_bytes: MAX_COPY_BYTES,
            max_depth: MAX_DEPTH,
        }
    }
}

/// Applies the JSON patch `ops` (an array of operation objects) to `target`, within the
/// default [`Limits`].
pub fn apply(target: &Value, ops: &Value) -> Result<Value, PatchError> {
    apply_with(target, ops, &Limits::default())
}

/// Applies the JSON patch `ops` to `target` within `limits`.
pub fn apply_with(target: &Value, ops: &Value, limits: &Limits) -> Result<Value, PatchError> {
    let Value::Array(ops) = ops else {
        return Err(PatchError::bad(
            "json: cannot unmarshal into Go value of type jsonpatch.Patch: the patch must be an array",
        ));
    };
    if ops.len() > limits.max_operations {
        return Err(PatchError::TooLarge(format!(
            "The allowed maximum operations in a JSON patch is {}, got {}",
            limits.max_operations,
            ops.len()
        )));
    }
    let mut state = State {
        limits: *limits,
        copied: 0,
        // An upper bound of the document's depth: it only grows (removals are not counted
        // down), so a `move` needs measuring only when it could pass the limit.
        depth_bound: depth(target),
    };
    let mut doc = target.clone();
    for op in ops {
        apply_op(&mut doc, op, &mut state)?;
    }
    Ok(doc)
}

/// What one patch has used of its [`Limits`] so far.
struct State {
    limits: Limits,
    copied: u64,
    depth_bound: usize,
}

impl State {
    /// Admits a value of depth `d` placed under `path`.
    fn place(&mut self, kind: &str, path: &[String], d: usize) -> Result<(), PatchError> {
        let total = path.len() + d;
        if total > self.limits.max_depth {
            return Err(PatchError::invalid(format!(
                "{kind} operation does not apply: the result would be nested {total} levels deep, more than the limit of {}",
                self.limits.max_depth
            )));
        }
        self.depth_bound = self.depth_bound.max(total);
        Ok(())
    }

    /// Charges a copy of `v` to the copy budget (without building the copy first).
    fn charge_copy(&mut self, v: &Value) -> Result<(), PatchError> {
        let left = self.limits.max_copy_bytes.saturating_sub(self.copied);
        match encoded_len_within(v, left) {
            Some(n) => {
                self.copied += n;
                Ok(())
            }
            None => {
                // Like the Go library, report the total the copy reached.
                let n = encoded_len_within(v, u64::MAX).unwrap_or(u64::MAX);
                Err(PatchError::invalid(format!(
                    "Unable to complete the copy, the accumulated size increase of copy is {}, exceeding the limit {}",
                    self.copied.saturating_add(n),
                    self.limits.max_copy_bytes
                )))
            }
        }
    }
}

fn str_member<'a>(op: &'a Value, name: &str, kind: &str) -> Result<&'a str, PatchError> {
    match op.get(name) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(PatchError::bad(format!(
            "{kind} operation: missing or invalid \"{name}\" member"
        ))),
    }
}

fn apply_op(doc: &mut Value, op: &Value, state: &mut State) -> Result<(), PatchError> {
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
        "add" => {
            let v = value()?;
            state.place(kind, &path, depth(&v))?;
            add(doc, &path, v).map_err(|_| missing("add"))
        }
        "remove" => remove(doc, &path).map(drop).map_err(|_| missing("remove")),
        "replace" => {
            let v = value()?;
            state.place(kind, &path, depth(&v))?;
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
            let missing_from = || {
                PatchError::invalid(format!(
                    "move operation does not apply: doc is missing from path: {from_str}: missing value"
                ))
            };
            // A value moved no deeper than it was keeps the document within its bound.
            let could_deepen =
                path.len() + state.depth_bound.saturating_sub(from.len()) > state.limits.max_depth;
            if path.len() > from.len() {
                if could_deepen {
                    let d = get(doc, &from).map(depth).ok_or_else(missing_from)?;
                    state.place(kind, &path, d)?;
                } else {
                    let bound = path.len() + state.depth_bound - from.len();
                    state.depth_bound = state.depth_bound.max(bound);
                }
            }
            let v = remove(doc, &from).map_err(|_| missing_from())?;
            add(doc, &path, v).map_err(|_| missing("move"))
        }
        "copy" => {
            let from_str = str_member(op, "from", kind)?;
            let from = parse_pointer(from_str)?;
            let src = get(doc, &from).ok_or_else(|| {
                PatchError::invalid(format!(
                    "copy operation does not apply: doc is missing from path: {from_str}: missing value"
                ))
            })?;
            // Measured and charged before anything is copied.
            state.charge_copy(src)?;
            state.place(kind, &path, depth(src))?;
            let v = src.clone();
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
pub fn json_eq(a: &Value, b: &Value) -> bool {
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

    /// Finding 1 of issue 14: 41 copies of `/data` into itself, each doubling the document.
    fn self_doubling(n: usize) -> Value {
        Value::Array(
            (0..n)
                .map(|i| json!({"op": "copy", "from": "/data", "path": format!("/data/k{i}")}))
                .collect(),
        )
    }

    #[test]
    fn self_doubling_copies_stop_at_the_copy_limit() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "default"}, "data": {"seed": "x".repeat(40)}});
        let e = apply(&cm, &self_doubling(41)).unwrap_err();
        assert_eq!(e.code(), 422, "{e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "Unable to complete the copy, the accumulated size increase of copy is "
            ) && msg.ends_with(", exceeding the limit 3145728"),
            "{msg}"
        );
        // The total named is the first one past the limit (the document doubled each time).
        let total: u64 = msg
            .split_whitespace()
            .find_map(|w| w.trim_end_matches(',').parse().ok().filter(|n| *n > 1000))
            .unwrap();
        assert!(
            total > MAX_COPY_BYTES && total <= 2 * MAX_COPY_BYTES + 200,
            "{total}"
        );
        // Within the limit, the same copies apply.
        let small = Limits {
            max_copy_bytes: u64::MAX,
            ..Limits::default()
        };
        let out = apply_with(&cm, &self_doubling(5), &small).unwrap();
        assert_eq!(
            out["data"]["k4"]["k3"]["k2"]["k1"]["k0"]["seed"],
            json!("x".repeat(40))
        );
    }

    #[test]
    fn copy_bytes_are_counted_as_compact_json() {
        let doc = json!({"a": "xyz", "b": []});
        // `"xyz"` is 5 bytes: two copies are 10.
        let ops =
            json!([{"op":"copy","from":"/a","path":"/c"},{"op":"copy","from":"/a","path":"/d"}]);
        let lim = |n| Limits {
            max_copy_bytes: n,
            ..Limits::default()
        };
        assert!(apply_with(&doc, &ops, &lim(10)).is_ok());
        let e = apply_with(&doc, &ops, &lim(9)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Unable to complete the copy, the accumulated size increase of copy is 10, exceeding the limit 9"
        );
    }

    #[test]
    fn operation_count_is_bounded() {
        let doc = json!({"a": 0});
        let ops = |n: usize| Value::Array(vec![json!({"op":"replace","path":"/a","value":1}); n]);
        assert_eq!(apply(&doc, &ops(MAX_OPERATIONS)).unwrap(), json!({"a": 1}));
        let e = apply(&doc, &ops(20_000)).unwrap_err();
        assert_eq!((e.code(), e.reason()), (413, "RequestEntityTooLarge"));
        assert_eq!(
            e.to_string(),
            "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 20000"
        );
    }

    #[test]
    fn depth_is_bounded() {
        let lim = Limits {
            max_depth: 4,
            ..Limits::default()
        };
        let doc = json!({"a": {"b": {}}});
        // add / replace: path length + depth of the value.
        assert!(apply_with(&doc, &json!([{"op":"add","path":"/a/b/c","value":1}]), &lim).is_ok());
        for op in [
            json!({"op":"add","path":"/a/b/c","value":{"d":1}}),
            json!({"op":"replace","path":"/a/b","value":{"c":{"d":1}}}),
            // copy of a 3-deep value under a 2-long path.
            json!({"op":"copy","from":"/a","path":"/a/x"}),
            // move of the same value one level deeper.
            json!({"op":"move","from":"/a","path":"/c/a"}),
        ] {
            let d = json!({"a": {"b": {"x": 1}}, "c": {}});
            let e = apply_with(&d, &json!([op]), &lim).unwrap_err();
            assert_eq!(e.code(), 422, "{op}: {e}");
            assert!(e.to_string().contains("levels deep"), "{op}: {e}");
        }
        // Moving up, or sideways, is always fine.
        let d = json!({"a": {"b": {"x": 1}}, "c": {}});
        let out = apply_with(&d, &json!([{"op":"move","from":"/a/b","path":"/b"}]), &lim).unwrap();
        assert_eq!(out, json!({"a": {}, "c": {}, "b": {"x": 1}}));
        // Repeated copies into the deepest point cannot build a deep chain either.
        let chain = json!({"a": {"a": {}}});
        let ops = Value::Array(
            (0..60)
                .map(|_| json!({"op":"copy","from":"/a","path":"/a/a/a"}))
                .collect(),
        );
        assert_eq!(apply(&chain, &ops).unwrap_err().code(), 422);
    }

    #[test]
    fn failure_leaves_target_untouched_and_aborts() {
        let doc = json!({"a": 1});
        let ops = json!([{"op":"add","path":"/b","value":2},{"op":"test","path":"/a","value":2}]);
        assert!(apply(&doc, &ops).is_err());
        assert_eq!(doc, json!({"a": 1}));
    }
}
