//! Field sets of structured-merge-diff: the paths of an object, encoded the way `fieldsV1`
//! encodes them (`f:<field>`, `k:{"port":80,"protocol":"TCP"}`, `v:<json>`, and `.` for a node
//! that is itself in the set).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::json_patch::json_eq;
use super::schema::{FieldMeta, TypeKind, TypeRef, key_default};

/// One path: a list of `fieldsV1` elements (`f:spec`, `k:{...}`, `v:"x"`).
pub type Path = Vec<String>;

/// A set of paths.
pub type FieldSet = BTreeSet<Path>;

/// What a path of an object points at.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// A scalar, an atomic list/map/struct or an empty map: owned as a whole.
    Leaf(Value),
    /// An item of an associative list or a set: owned itself (`.`).
    Item,
    /// A granular map (labels): owned itself (`.`) when added by an update.
    Map,
    /// A struct: never owned itself.
    Struct,
}

/// Every path of `v` (of type `t`) with what it points at.
pub fn paths(v: &Value, t: TypeRef) -> BTreeMap<Path, Node> {
    let mut out = BTreeMap::new();
    walk(v, t, FieldMeta::NONE, &mut Vec::new(), &mut out);
    out
}

/// The set an applier owns for an applied configuration: leaves and list items.
pub fn owned_by_config(v: &Value, t: TypeRef) -> FieldSet {
    paths(v, t)
        .into_iter()
        .filter(|(_, n)| matches!(n, Node::Leaf(_) | Node::Item))
        .map(|(p, _)| p)
        .collect()
}

fn walk(v: &Value, t: TypeRef, meta: FieldMeta, prefix: &mut Path, out: &mut BTreeMap<Path, Node>) {
    match v {
        Value::Object(m) => {
            let atomic = t.is_atomic_struct()
                || meta.map_type == Some("atomic")
                || t.kind() == TypeKind::Scalar;
            if atomic || m.is_empty() {
                if !prefix.is_empty() {
                    out.insert(prefix.clone(), Node::Leaf(v.clone()));
                }
                return;
            }
            if !prefix.is_empty() {
                let node = if t.kind() == TypeKind::Map {
                    Node::Map
                } else {
                    Node::Struct
                };
                out.entry(prefix.clone()).or_insert(node);
            }
            for (k, child) in m {
                if child.is_null() {
                    continue;
                }
                prefix.push(format!("f:{k}"));
                walk(child, t.child(k), t.child_meta(k), prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => match meta.list_type {
            Some("map") if !meta.list_map_keys.is_empty() => {
                let elem = t.elem();
                for item in items {
                    prefix.push(item_key(item, elem, meta.list_map_keys));
                    out.insert(prefix.clone(), Node::Item);
                    if let Value::Object(m) = item {
                        for (k, child) in m {
                            if child.is_null() {
                                continue;
                            }
                            prefix.push(format!("f:{k}"));
                            walk(child, elem.child(k), elem.child_meta(k), prefix, out);
                            prefix.pop();
                        }
                    }
                    prefix.pop();
                }
            }
            Some("set") => {
                for item in items {
                    prefix.push(format!("v:{item}"));
                    out.insert(prefix.clone(), Node::Item);
                    prefix.pop();
                }
            }
            _ => {
                out.insert(prefix.clone(), Node::Leaf(v.clone()));
            }
        },
        _ => {
            out.insert(prefix.clone(), Node::Leaf(v.clone()));
        }
    }
}

/// The key values of an associative list item, schema defaults filled in.
fn key_values(item: &Value, elem: TypeRef, keys: &[&str]) -> Map<String, Value> {
    let mut sorted: Vec<&str> = keys.to_vec();
    sorted.sort_unstable();
    let mut m = Map::new();
    for k in sorted {
        let v = match item.get(k) {
            Some(v) if !v.is_null() => v.clone(),
            _ => match elem.definition().and_then(|d| key_default(d, k)) {
                Some(d) => Value::String(d.to_string()),
                None => continue,
            },
        };
        m.insert(k.to_string(), v);
    }
    m
}

/// `k:{"port":80,"protocol":"TCP"}` for an associative list item.
pub fn item_key(item: &Value, elem: TypeRef, keys: &[&str]) -> String {
    format!("k:{}", Value::Object(key_values(item, elem, keys)))
}

/// Finds the index of the item of `list` that `element` (`k:` or `v:`) names.
fn find_item(list: &[Value], element: &str, elem: TypeRef, keys: &[&str]) -> Option<usize> {
    if let Some(k) = element.strip_prefix("k:") {
        let want: Value = serde_json::from_str(k).ok()?;
        let want = want.as_object()?;
        return list.iter().position(|item| {
            let have = key_values(item, elem, keys);
            have.len() == want.len()
                && want
                    .iter()
                    .all(|(k, v)| have.get(k).is_some_and(|h| json_eq(h, v)))
        });
    }
    if let Some(v) = element.strip_prefix("v:") {
        let want: Value = serde_json::from_str(v).ok()?;
        return list.iter().position(|item| json_eq(item, &want));
    }
    None
}

/// Removes what `path` points at from `v`. Missing paths are ignored.
pub fn remove_path(v: &mut Value, t: TypeRef, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if let Some(name) = first.strip_prefix("f:") {
        let Value::Object(m) = v else { return };
        if rest.is_empty() {
            m.shift_remove(name);
            return;
        }
        let meta = t.child_meta(name);
        let ct = t.child(name);
        match m.get_mut(name) {
            Some(Value::Array(list)) => remove_in_list(list, ct, meta, rest),
            Some(child) => remove_path(child, ct, rest),
            None => {}
        }
    }
}

fn remove_in_list(list: &mut Vec<Value>, t: TypeRef, meta: FieldMeta, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let elem = t.elem();
    let Some(i) = find_item(list, first, elem, meta.list_map_keys) else {
        return;
    };
    if rest.is_empty() {
        list.remove(i);
    } else if let Some(item) = list.get_mut(i) {
        remove_path(item, elem, rest);
    }
}

/// Encodes a set as `fieldsV1`.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Tree {
        member: bool,
        children: BTreeMap<String, Tree>,
    }
    let mut root = Tree::default();
    for p in set {
        let mut node = &mut root;
        for e in p {
            node = node.children.entry(e.clone()).or_default();
        }
        node.member = true;
    }
    fn render(t: &Tree) -> Value {
        let mut m = Map::new();
        if t.member && !t.children.is_empty() {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        for (k, c) in &t.children {
            m.insert(k.clone(), render(c));
        }
        Value::Object(m)
    }
    render(&root)
}

/// Decodes `fieldsV1` into a set.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn go(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
        let Value::Object(m) = v else { return };
        if m.is_empty() {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
            return;
        }
        for (k, c) in m {
            if k == "." {
                if !prefix.is_empty() {
                    out.insert(prefix.clone());
                }
                continue;
            }
            prefix.push(k.clone());
            go(c, prefix, out);
            prefix.pop();
        }
    }
    let mut out = FieldSet::new();
    go(v, &mut Vec::new(), &mut out);
    out
}

/// Renders a path as structured-merge-diff does in conflict messages:
/// `.spec.ports[port=80,protocol="TCP"].targetPort`, `.metadata.finalizers[="x"]`.
pub fn display(path: &[String]) -> String {
    let mut s = String::new();
    for e in path {
        if let Some(f) = e.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = e.strip_prefix("k:") {
            let parts: Vec<String> = match serde_json::from_str::<Value>(k) {
                Ok(Value::Object(m)) => m.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                _ => vec![k.to_string()],
            };
            s.push('[');
            s.push_str(&parts.join(","));
            s.push(']');
        } else if let Some(v) = e.strip_prefix("v:") {
            s.push_str("[=");
            s.push_str(v);
            s.push(']');
        } else {
            s.push_str(e);
        }
    }
    s
}

/// `true` when `p` starts with `prefix`.
pub fn has_prefix(p: &[String], prefix: &[String]) -> bool {
    p.len() >= prefix.len() && p[..prefix.len()] == *prefix
}

/// Paths upstream never records in managed fields (identity and server-set metadata).
pub fn stripped(p: &[String]) -> bool {
    const TOP: &[&str] = &["f:apiVersion", "f:kind"];
    const META: &[&str] = &[
        "f:name",
        "f:namespace",
        "f:creationTimestamp",
        "f:selfLink",
        "f:uid",
        "f:clusterName",
        "f:generation",
        "f:managedFields",
        "f:resourceVersion",
    ];
    match p {
        [] => false,
        [first, ..] if TOP.contains(&first.as_str()) => true,
        [first, second, ..] if first == "f:metadata" && META.contains(&second.as_str()) => true,
        [first] if first == "f:metadata" => false,
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::patch::schema::root_type;
    use serde_json::json;

    #[test]
    fn service_config_set() {
        let t = root_type("v1", "Service").unwrap();
        let cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "labels": {"app": "x"}},
            "spec": {"ports": [{"port": 80, "targetPort": 8080}], "selector": {"app": "x"}, "clusterIPs": ["1.2.3.4"]}});
        let set: FieldSet = owned_by_config(&cfg, t)
            .into_iter()
            .filter(|p| !stripped(p))
            .collect();
        assert_eq!(
            to_fields_v1(&set),
            json!({"f:metadata": {"f:labels": {"f:app": {}}},
                   "f:spec": {"f:clusterIPs": {}, "f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:port": {}, "f:targetPort": {}}},
                              "f:selector": {}}})
        );
        assert_eq!(from_fields_v1(&to_fields_v1(&set)), set);
        let p: Path = vec![
            "f:spec".into(),
            "f:ports".into(),
            "k:{\"port\":80,\"protocol\":\"TCP\"}".into(),
            "f:targetPort".into(),
        ];
        assert_eq!(
            display(&p),
            ".spec.ports[port=80,protocol=\"TCP\"].targetPort"
        );
        assert_eq!(
            display(&["f:metadata".into(), "f:finalizers".into(), "v:\"x\"".into()]),
            ".metadata.finalizers[=\"x\"]"
        );
    }

    #[test]
    fn remove_paths() {
        let t = root_type("v1", "Service").unwrap();
        let mut v = json!({"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}},
            "spec": {"ports": [{"port": 80, "name": "a"}, {"port": 81, "protocol": "UDP"}]}});
        remove_path(
            &mut v,
            t,
            &["f:metadata".into(), "f:finalizers".into(), "v:\"a\"".into()],
        );
        remove_path(
            &mut v,
            t,
            &["f:metadata".into(), "f:labels".into(), "f:x".into()],
        );
        remove_path(
            &mut v,
            t,
            &[
                "f:spec".into(),
                "f:ports".into(),
                "k:{\"port\":80,\"protocol\":\"TCP\"}".into(),
                "f:name".into(),
            ],
        );
        remove_path(
            &mut v,
            t,
            &[
                "f:spec".into(),
                "f:ports".into(),
                "k:{\"port\":81,\"protocol\":\"UDP\"}".into(),
            ],
        );
        remove_path(&mut v, t, &["f:spec".into(), "f:nope".into(), "f:x".into()]);
        assert_eq!(
            v,
            json!({"metadata": {"finalizers": ["b"], "labels": {"y": "2"}}, "spec": {"ports": [{"port": 80}]}})
        );
    }
}
