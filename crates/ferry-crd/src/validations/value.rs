//! A custom object's JSON as the CEL value a rule sees, typed by its structural schema as
//! upstream's `UnstructuredToVal` does: objects with `properties` are maps whose declared
//! property names are escaped (`foo-bar` → `foo__dash__bar`), `additionalProperties` maps
//! keep their keys, `integer` is `int`, `number` is `double`, `int-or-string` is either,
//! strings of format `byte` are `bytes`, and unknown fields kept by
//! `x-kubernetes-preserve-unknown-fields` (or in an embedded resource) are converted by
//! their JSON type.

use std::collections::HashMap;
use std::sync::Arc;

use cel::Value as Cel;
use cel::objects::{Key, Map};
use serde_json::Value;

const RESERVED: [&str; 21] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The CEL name of a declared property, or `None` when it cannot be escaped (then a rule
/// cannot name it).
pub fn escape(name: &str) -> Option<String> {
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "_.-/".contains(c));
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c)) {
        return None;
    }
    Some(
        name.replace("__", "__underscores__")
            .replace('.', "__dot__")
            .replace('-', "__dash__")
            .replace('/', "__slash__"),
    )
}

fn schema_type(schema: &Value) -> &str {
    schema.get("type").and_then(Value::as_str).unwrap_or("")
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool) == Some(true)
}

/// Decodes standard base64 (with or without padding).
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (bits < 6).then_some(out)
}

fn number(v: &serde_json::Number, ty: &str) -> Cel {
    match ty {
        "number" => Cel::Float(v.as_f64().unwrap_or(f64::NAN)),
        _ => match v.as_i64() {
            Some(i) => Cel::Int(i),
            None => match v.as_u64() {
                Some(u) => Cel::UInt(u),
                None => Cel::Float(v.as_f64().unwrap_or(f64::NAN)),
            },
        },
    }
}

fn map(entries: HashMap<Key, Cel>) -> Cel {
    Cel::Map(Map {
        map: Arc::new(entries),
    })
}

/// `value` typed by `schema`. `root` marks the resource root: there, as upstream,
/// `metadata` shows only `name` and `generateName`.
pub fn to_cel(schema: &Value, value: &Value, root: bool) -> Cel {
    let ty = schema_type(schema);
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => number(n, ty),
        Value::String(s) => {
            if ty == "string" && schema.get("format").and_then(Value::as_str) == Some("byte") {
                return match base64_decode(s) {
                    Some(b) => Cel::Bytes(Arc::new(b)),
                    None => Cel::String(Arc::new(s.clone())),
                };
            }
            Cel::String(Arc::new(s.clone()))
        }
        Value::Array(items) => {
            let item_schema = schema.get("items").unwrap_or(&Value::Null);
            Cel::List(Arc::new(
                items
                    .iter()
                    .map(|i| to_cel(item_schema, i, false))
                    .collect(),
            ))
        }
        Value::Object(obj) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let dynamic = flag(schema, "x-kubernetes-preserve-unknown-fields")
                || flag(schema, "x-kubernetes-embedded-resource");
            let mut out = HashMap::new();
            for (k, v) in obj {
                if root && k == "metadata" {
                    let mut meta = HashMap::new();
                    for f in ["name", "generateName"] {
                        if let Some(Value::String(s)) = v.get(f) {
                            meta.insert(Key::String(Arc::new(f.to_string())), Cel::from(s.clone()));
                        }
                    }
                    out.insert(Key::String(Arc::new("metadata".into())), map(meta));
                    continue;
                }
                if let Some(p) = props.and_then(|p| p.get(k)) {
                    if let Some(name) = escape(k) {
                        out.insert(Key::String(Arc::new(name)), to_cel(p, v, false));
                    }
                } else if let Some(a) = additional {
                    out.insert(Key::String(Arc::new(k.clone())), to_cel(a, v, false));
                } else if dynamic || props.is_none() || root {
                    out.insert(
                        Key::String(Arc::new(k.clone())),
                        to_cel(&Value::Null, v, false),
                    );
                }
            }
            map(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escaping() {
        assert_eq!(escape("foo").as_deref(), Some("foo"));
        assert_eq!(escape("if").as_deref(), Some("__if__"));
        assert_eq!(escape("foo-bar").as_deref(), Some("foo__dash__bar"));
        assert_eq!(escape("a.b/c").as_deref(), Some("a__dot__b__slash__c"));
        assert_eq!(escape("a__b").as_deref(), Some("a__underscores__b"));
        assert_eq!(escape("3x"), None);
        assert_eq!(escape("x y"), None);
    }

    #[test]
    fn base64() {
        assert_eq!(base64_decode("aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(base64_decode("aGVsbG8").as_deref(), Some(&b"hello"[..]));
        assert_eq!(base64_decode("a$"), None);
    }

    #[test]
    fn typed_by_schema() {
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "number"}, "i": {"type": "integer"},
            "b": {"type": "string", "format": "byte"},
            "x-y": {"type": "string"},
            "m": {"type": "object", "additionalProperties": {"type": "string"}}}});
        let v = to_cel(
            &schema,
            &json!({"n": 1, "i": 2, "b": "aGk=", "x-y": "z", "m": {"a-b": "c"}}),
            false,
        );
        let Cel::Map(m) = v else { panic!("not a map") };
        let get = |k: &str| m.map.get(&Key::String(Arc::new(k.into()))).cloned();
        assert_eq!(get("n"), Some(Cel::Float(1.0)));
        assert_eq!(get("i"), Some(Cel::Int(2)));
        assert_eq!(get("b"), Some(Cel::Bytes(Arc::new(b"hi".to_vec()))));
        assert_eq!(get("x__dash__y"), Some(Cel::from("z")));
        let Some(Cel::Map(inner)) = get("m") else {
            panic!("m")
        };
        assert!(inner.map.contains_key(&Key::String(Arc::new("a-b".into()))));
    }
}
