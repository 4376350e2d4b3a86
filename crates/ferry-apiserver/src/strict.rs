//! Duplicate JSON object keys in a request body, which `fieldValidation=Strict` refuses and
//! `Warn` reports (upstream's strict decoding: `duplicate field "spec.replicas"`). Pure.

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The dotted paths of every key that appears twice in one JSON object of `body`, in document
/// order. A body that is not JSON has none (decoding reports that separately).
pub fn duplicate_fields(body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let walk = Walk {
        path: String::new(),
        out: &mut out,
    };
    if walk.deserialize(&mut de).is_err() {
        return Vec::new();
    }
    out
}

struct Walk<'a> {
    path: String,
    out: &'a mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.out;
        let mut i = 0usize;
        loop {
            let child = Walk {
                path: format!("{}[{i}]", self.path),
                out: &mut *out,
            };
            if seq.next_element_seed(child)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.out;
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            if !seen.insert(key) {
                out.push(path.clone());
            }
            map.next_value_seed(Walk {
                path,
                out: &mut *out,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_duplicates_with_paths() {
        let cases: &[(&str, &[&str])] = &[
            (r#"{"a":1,"b":2}"#, &[]),
            (r#"{"a":1,"a":2}"#, &["a"]),
            (
                r#"{"spec":{"replicas":1,"replicas":2,"template":{"x":[{"n":1,"n":2}]}}}"#,
                &["spec.replicas", "spec.template.x[0].n"],
            ),
            (r#"{"a":{"b":1},"c":{"b":1}}"#, &[]),
            (r#"[{"k":1,"k":1}]"#, &["[0].k"]),
            ("not json", &[]),
        ];
        for (body, want) in cases {
            assert_eq!(duplicate_fields(body.as_bytes()), *want, "{body}");
        }
    }
}
