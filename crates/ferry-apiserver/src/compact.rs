//! The compact form of a cached object: the served JSON bytes (with `metadata.resourceVersion`
//! stamped in) plus the few metadata fields lists, watches and selectors read — name, namespace
//! and labels — taken from the stored bytes in one pass, without building a `serde_json::Value`
//! of the object. Pure.
//!
//! Stored objects are JSON written by this server, so the scan is a small structural walk
//! (strings, nesting) that records where `metadata` and its `resourceVersion` are; the bytes are
//! validated by serde (without allocating) before they are trusted.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde::de::IgnoredAny;

/// What one pass over a stored object yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamped {
    /// The object with `metadata.resourceVersion` set to the revision (replaced in place, or
    /// appended as the last field of `metadata`; unchanged when there is no `metadata` object).
    pub bytes: Vec<u8>,
    pub name: String,
    pub namespace: String,
    /// `metadata.labels` with string values, in document order.
    pub labels: Vec<(String, String)>,
}

/// Stamps `revision` into the stored JSON object `raw` and reads its name, namespace and labels.
/// `None` when `raw` is not a JSON object.
pub fn stamp(raw: &[u8], revision: i64) -> Option<Stamped> {
    serde_json::from_slice::<IgnoredAny>(raw).ok()?;
    let start = ws(raw, 0);
    let (top, _) = members(raw, start)?;
    let mut out = Stamped {
        bytes: Vec::new(),
        name: String::new(),
        namespace: String::new(),
        labels: Vec::new(),
    };
    let meta = top
        .iter()
        .rev()
        .find(|(k, _, _)| k == "metadata")
        .filter(|(_, s, _)| raw[*s] == b'{');
    let Some(&(_, ms, _)) = meta else {
        out.bytes = raw.to_vec();
        return Some(out);
    };
    let (fields, me) = members(raw, ms)?;
    let mut rv_span = None;
    for (k, s, e) in &fields {
        let v = &raw[*s..*e];
        match k.as_ref() {
            "name" => out.name = string(v).map(Cow::into_owned).unwrap_or_default(),
            "namespace" => out.namespace = string(v).map(Cow::into_owned).unwrap_or_default(),
            "labels" if v.first() == Some(&b'{') => {
                out.labels.clear();
                if let Some((labels, _)) = members(raw, *s) {
                    for (lk, ls, le) in labels {
                        if let Some(lv) = string(&raw[ls..le]) {
                            out.labels.push((lk.into_owned(), lv.into_owned()));
                        }
                    }
                }
            }
            "resourceVersion" => rv_span = Some((*s, *e)),
            _ => {}
        }
    }
    let rv = format!("\"{revision}\"");
    let mut bytes = Vec::with_capacity(raw.len() + rv.len() + 20);
    match rv_span {
        Some((s, e)) => {
            bytes.extend_from_slice(&raw[..s]);
            bytes.extend_from_slice(rv.as_bytes());
            bytes.extend_from_slice(&raw[e..]);
        }
        None => {
            // Before metadata's closing brace.
            let close = me - 1;
            bytes.extend_from_slice(&raw[..close]);
            if !fields.is_empty() {
                bytes.push(b',');
            }
            bytes.extend_from_slice(b"\"resourceVersion\":");
            bytes.extend_from_slice(rv.as_bytes());
            bytes.extend_from_slice(&raw[close..]);
        }
    }
    out.bytes = bytes;
    Some(out)
}

/// The span (start, end exclusive) of the value of the top-level member `key` of the JSON object
/// `raw` (the last one if the key repeats, as a JSON decoder keeps), without decoding the object.
/// `None` when `raw` is not an object or has no such member.
pub fn member_span(raw: &[u8], key: &str) -> Option<(usize, usize)> {
    let (top, _) = members(raw, ws(raw, 0))?;
    top.iter()
        .rev()
        .find(|(k, _, _)| k == key)
        .map(|&(_, s, e)| (s, e))
}

pub(crate) fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string starting at `b[i] == '"'`.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// The end (exclusive) of the JSON value starting at `b[i]`.
pub(crate) fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// A JSON string literal's text.
pub(crate) fn string(v: &[u8]) -> Option<Cow<'_, str>> {
    if v.len() < 2 || v[0] != b'"' {
        return None;
    }
    if v.contains(&b'\\') {
        serde_json::from_slice::<String>(v).ok().map(Cow::Owned)
    } else {
        std::str::from_utf8(&v[1..v.len() - 1])
            .ok()
            .map(Cow::Borrowed)
    }
}

pub(crate) type Members<'a> = Vec<(Cow<'a, str>, usize, usize)>;

/// The members (key, value start, value end) of the object starting at `b[i] == '{'`, and the
/// object's end (exclusive).
pub(crate) fn members(b: &[u8], i: usize) -> Option<(Members<'_>, usize)> {
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let mut out = Vec::new();
    let mut j = ws(b, i + 1);
    if b.get(j) == Some(&b'}') {
        return Some((out, j + 1));
    }
    loop {
        if b.get(j) != Some(&b'"') {
            return None;
        }
        let ke = string_end(b, j)?;
        let key = string(&b[j..ke])?;
        j = ws(b, ke);
        if b.get(j) != Some(&b':') {
            return None;
        }
        j = ws(b, j + 1);
        let ve = value_end(b, j)?;
        out.push((key, j, ve));
        j = ws(b, ve);
        match *b.get(j)? {
            b',' => j = ws(b, j + 1),
            b'}' => return Some((out, j + 1)),
            _ => return None,
        }
    }
}

/// Shared copies of the strings many objects repeat (namespaces, label keys and values), so that
/// 150,000 Pods labelled `app=x` hold one `app` and one `x`. Entries nobody holds any more are
/// dropped when the table has doubled since the last sweep.
pub struct Interner {
    inner: Mutex<InternerState>,
}

struct InternerState {
    set: HashSet<Arc<str>>,
    sweep_at: usize,
}

impl Default for Interner {
    fn default() -> Self {
        Interner {
            inner: Mutex::new(InternerState {
                set: HashSet::new(),
                sweep_at: 1024,
            }),
        }
    }
}

impl Interner {
    pub fn intern(&self, s: &str) -> Arc<str> {
        let mut st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = st.set.get(s) {
            return a.clone();
        }
        if st.set.len() >= st.sweep_at {
            st.set.retain(|a| Arc::strong_count(a) > 1);
            st.sweep_at = (st.set.len() * 2).max(1024);
        }
        let a: Arc<str> = Arc::from(s);
        st.set.insert(a.clone());
        a
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The process-wide interner of the watch cache.
pub fn interner() -> &'static Interner {
    static I: std::sync::OnceLock<Interner> = std::sync::OnceLock::new();
    I.get_or_init(Interner::default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    type Fields = (Value, String, String, Vec<(String, String)>);

    /// The reference: parse, set `metadata.resourceVersion`, read the fields from the Value.
    fn reference(raw: &[u8], revision: i64) -> Option<Fields> {
        let mut v: Value = serde_json::from_slice(raw).ok()?;
        if !v.is_object() {
            return None;
        }
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("resourceVersion".into(), json!(revision.to_string()));
        }
        let s = |p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let labels = v
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, x)| x.as_str().map(|x| (k.clone(), x.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        Some((
            v.clone(),
            s("/metadata/name"),
            s("/metadata/namespace"),
            labels,
        ))
    }

    fn check(raw: &str, revision: i64) {
        let got = stamp(raw.as_bytes(), revision);
        let want = reference(raw.as_bytes(), revision);
        match (got, want) {
            (None, None) => {}
            (Some(g), Some((v, name, ns, labels))) => {
                let gv: Value = serde_json::from_slice(&g.bytes).expect("stamped bytes are JSON");
                assert_eq!(gv, v, "{raw}");
                assert_eq!(g.name, name, "{raw}");
                assert_eq!(g.namespace, ns, "{raw}");
                assert_eq!(g.labels, labels, "{raw}");
            }
            (g, w) => panic!("{raw}: stamp {g:?} vs reference {w:?}"),
        }
    }

    #[test]
    fn stamps_like_the_value_path() {
        for raw in [
            r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"7"},"spec":{}}"#,
            r#"{"metadata":{"name":"a"},"spec":{"x":[1,2,{"y":"}"}]}}"#,
            r#"{"metadata":{},"data":{}}"#,
            r#"{"kind":"X"}"#,
            r#"{"metadata":null}"#,
            r#"{"metadata":"s"}"#,
            r#" { "metadata" : { "name" : "a\"b" , "labels" : { "k" : "v" , "n" : 1 , "e\u0041" : "x\\y" } } } "#,
            r#"{"metadata":{"labels":{"a":"1","b":"2"},"resourceVersion":12,"name":"z"}}"#,
            r#"{"a":"metadata","metadata":{"name":"ünï"},"b":{"metadata":{"name":"inner"}}}"#,
            r#"[1,2]"#,
            r#""str""#,
            r#"{"metadata":{"name":"a"}"#,
            r#"not json"#,
            r#"{"metadata":{"name":"a"}} trailing"#,
        ] {
            check(raw, 42);
        }
    }

    #[test]
    fn replaces_in_place_and_appends_last() {
        let s = stamp(
            br#"{"metadata":{"name":"a","resourceVersion":"1","uid":"u"}}"#,
            9,
        )
        .expect("object");
        assert_eq!(
            s.bytes,
            br#"{"metadata":{"name":"a","resourceVersion":"9","uid":"u"}}"#
        );
        let s = stamp(br#"{"metadata":{"name":"a"},"spec":{}}"#, 10).expect("object");
        assert_eq!(
            s.bytes,
            br#"{"metadata":{"name":"a","resourceVersion":"10"},"spec":{}}"#
        );
        let s = stamp(br#"{"metadata":{}}"#, 3).expect("object");
        assert_eq!(s.bytes, br#"{"metadata":{"resourceVersion":"3"}}"#);
    }

    #[test]
    fn interner_shares_and_sweeps() {
        let i = Interner::default();
        let a = i.intern("app");
        let b = i.intern("app");
        assert!(Arc::ptr_eq(&a, &b));
        for n in 0..5000 {
            drop(i.intern(&format!("v{n}")));
        }
        // Unreferenced entries were swept; held ones stay shared.
        assert!(i.len() < 5000, "{}", i.len());
        assert!(Arc::ptr_eq(&a, &i.intern("app")));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z\"\\\\{}\\[\\], :é]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-zA-Z\"\\\\]{0,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn object() -> impl Strategy<Value = Value> {
        (
            prop::option::of(prop::collection::btree_map(
                prop_oneof![
                    Just("name".to_string()),
                    Just("namespace".to_string()),
                    Just("labels".to_string()),
                    Just("resourceVersion".to_string()),
                    "[a-z]{1,5}"
                ],
                prop_oneof![
                    json_value(),
                    prop::collection::btree_map("[a-z/.\\\\\"]{1,6}", "[a-z\"\\\\]{0,6}", 0..4)
                        .prop_map(|m| json!(m)),
                ],
                0..5,
            )),
            prop::collection::btree_map("[a-z]{1,6}", json_value(), 0..4),
        )
            .prop_map(|(meta, rest)| {
                let mut m: serde_json::Map<String, Value> = rest.into_iter().collect();
                if let Some(meta) = meta {
                    m.insert("metadata".into(), json!(meta));
                }
                Value::Object(m)
            })
    }

    proptest! {
        #[test]
        fn stamp_matches_reference(v in object(), rev in 1i64..1_000_000, pretty in any::<bool>()) {
            let raw = if pretty {
                serde_json::to_vec_pretty(&v).expect("json")
            } else {
                serde_json::to_vec(&v).expect("json")
            };
            check(std::str::from_utf8(&raw).expect("utf8"), rev);
        }
    }
}
