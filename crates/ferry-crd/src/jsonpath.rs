//! The JSONPath subset of `additionalPrinterColumns[].jsonPath` and the scale subresource's
//! paths: `.spec.replicas`, `.metadata.labels.app`, `.spec.list[0].name`, `.a['b.c']`,
//! `.status.conditions[?(@.type=="Ready")].status`.

use serde_json::Value;

/// One step of a path.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Field(String),
    Index(usize),
    /// `[?(@.<field>=="<value>")]`: every array item whose field equals the value.
    Filter {
        field: String,
        value: String,
    },
}

/// Parses a path; `None` when it is not in the supported subset.
pub fn parse(path: &str) -> Option<Vec<Step>> {
    let p = path.trim();
    let p = p
        .strip_prefix('{')
        .and_then(|x| x.strip_suffix('}'))
        .unwrap_or(p);
    let mut rest = p.strip_prefix('.')?;
    if rest.is_empty() {
        return None;
    }
    let mut steps = Vec::new();
    loop {
        if rest.is_empty() {
            break;
        }
        if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(f) = inner.strip_prefix("?(@.").and_then(|x| x.strip_suffix(')')) {
                let (field, value) = f.split_once("==")?;
                let value = value.trim().trim_matches('"').trim_matches('\'');
                steps.push(Step::Filter {
                    field: field.trim().to_string(),
                    value: value.to_string(),
                });
            } else if let Ok(i) = inner.parse::<usize>() {
                steps.push(Step::Index(i));
            } else {
                let k = inner.trim_matches('\'').trim_matches('"');
                if k.is_empty() {
                    return None;
                }
                steps.push(Step::Field(k.to_string()));
            }
            rest = rest.strip_prefix('.').unwrap_or(rest);
            continue;
        }
        // A field name up to the next unescaped '.' or '['.
        let mut name = String::new();
        let mut chars = rest.char_indices().peekable();
        let mut consumed = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        name.push(n);
                    }
                }
                '.' | '[' => {
                    consumed = i;
                    break;
                }
                c if c.is_alphanumeric() || c == '_' || c == '-' || c == '/' => name.push(c),
                _ => return None,
            }
        }
        if name.is_empty() {
            return None;
        }
        steps.push(Step::Field(name));
        rest = &rest[consumed..];
        rest = rest.strip_prefix('.').unwrap_or(rest);
    }
    Some(steps)
}

/// Every value the path reaches in `v`, in document order.
pub fn eval<'a>(steps: &[Step], v: &'a Value) -> Vec<&'a Value> {
    let mut cur = vec![v];
    for s in steps {
        let mut next = Vec::new();
        for x in cur {
            match s {
                Step::Field(f) => {
                    if let Some(y) = x.get(f.as_str()) {
                        next.push(y);
                    }
                }
                Step::Index(i) => {
                    if let Some(y) = x.get(*i) {
                        next.push(y);
                    }
                }
                Step::Filter { field, value } => {
                    if let Value::Array(items) = x {
                        for it in items {
                            let m = match it.get(field.as_str()) {
                                Some(Value::String(s)) => s == value,
                                Some(other) => {
                                    serde_json::to_string(other).is_ok_and(|t| t == *value)
                                }
                                None => false,
                            };
                            if m {
                                next.push(it);
                            }
                        }
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

/// The first value `path` reaches, if the path parses and reaches anything.
pub fn get<'a>(path: &str, v: &'a Value) -> Option<&'a Value> {
    let steps = parse(path)?;
    eval(&steps, v).into_iter().next()
}

/// Sets the value at a path of plain fields (`.spec.replicas`), creating objects on the way.
/// Returns false when the path is not made of fields only or crosses a non-object.
pub fn set(path: &str, v: &mut Value, new: Value) -> bool {
    let Some(steps) = parse(path) else {
        return false;
    };
    let mut cur = v;
    for (i, s) in steps.iter().enumerate() {
        let Step::Field(f) = s else {
            return false;
        };
        let Value::Object(m) = cur else {
            return false;
        };
        if i + 1 == steps.len() {
            m.insert(f.clone(), new);
            return true;
        }
        cur = m
            .entry(f.clone())
            .or_insert_with(|| Value::Object(Default::default()));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths() {
        let v = json!({
            "spec": {"replicas": 3, "list": [{"name": "a"}, {"name": "b"}]},
            "metadata": {"labels": {"app.kubernetes.io/name": "x", "k": "v"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "False"}]}
        });
        let cases = [
            (".spec.replicas", Some(json!(3))),
            ("{.spec.replicas}", Some(json!(3))),
            (".spec.list[1].name", Some(json!("b"))),
            (".metadata.labels.k", Some(json!("v"))),
            (
                ".metadata.labels['app.kubernetes.io/name']",
                Some(json!("x")),
            ),
            (
                ".metadata.labels.app\\.kubernetes\\.io/name",
                Some(json!("x")),
            ),
            (
                ".status.conditions[?(@.type==\"Ready\")].status",
                Some(json!("True")),
            ),
            (".spec.missing", None),
            ("spec.replicas", None),
            (".", None),
        ];
        for (p, want) in cases {
            assert_eq!(get(p, &v).cloned(), want, "{p}");
        }
    }

    #[test]
    fn set_creates_objects() {
        let mut v = json!({"spec": {}});
        assert!(set(".spec.replicas", &mut v, json!(5)));
        assert!(set(".status.a.b", &mut v, json!(1)));
        assert_eq!(
            v,
            json!({"spec": {"replicas": 5}, "status": {"a": {"b": 1}}})
        );
        assert!(!set(".spec.list[0]", &mut v, json!(1)));
        assert!(!set(".spec.replicas.x", &mut v, json!(1)));
    }
}
