//! `metadata.managedFields`: parsing and rendering the entries, and the bookkeeping of ordinary
//! writes (create, update, patch) — [`record_update`].
//!
//! `record_update` approximates upstream's field manager: the writer's `Update` entry gains every
//! leaf, list item and map that the write added or changed; every other manager loses the
//! fields the write changed or removed (an update always "forces"). Differences from upstream:
//! struct nodes never carry `.` (upstream marks pointer structs such as `rollingUpdate` when
//! they are created), and the first write of an object without managed fields does not invent a
//! `before-first-apply` manager.

use serde_json::{Map, Value, json};

use super::fieldset::{FieldSet, Node, Path, from_fields_v1, paths, stripped, to_fields_v1};
use super::json_patch::json_eq;
use super::schema::{TypeRef, root_type};

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: Option<String>,
    pub subresource: Option<String>,
    pub set: FieldSet,
}

impl Entry {
    /// Upstream identifies a manager by name, operation and subresource, plus the API version
    /// for `Update` entries.
    pub fn same_manager(
        &self,
        manager: &str,
        operation: &str,
        subresource: Option<&str>,
        api_version: &str,
    ) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
            && (operation == "Apply" || self.api_version == api_version)
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), to_fields_v1(&self.set));
        if let Some(s) = &self.subresource {
            m.insert("subresource".into(), json!(s));
        }
        Value::Object(m)
    }
}

/// The entries of `obj.metadata.managedFields` (malformed entries are skipped).
pub fn entries(obj: &Value) -> Vec<Entry> {
    let Some(Value::Array(list)) = obj.pointer("/metadata/managedFields") else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
            Some(Entry {
                manager: s("manager").unwrap_or_default(),
                operation: s("operation")?,
                api_version: s("apiVersion").unwrap_or_default(),
                time: s("time"),
                subresource: s("subresource").filter(|x| !x.is_empty()),
                set: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
            })
        })
        .collect()
}

/// Writes `entries` (without empty ones) into `obj.metadata.managedFields`.
pub fn set_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.set.is_empty())
        .map(Entry::to_json)
        .collect();
    let Value::Object(root) = obj else { return };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(meta) = meta else { return };
    if list.is_empty() {
        meta.shift_remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

/// The type of an object from its own `apiVersion` and `kind` (untyped when unknown).
pub(crate) fn type_of(obj: &Value) -> TypeRef {
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    root_type(av, kind).unwrap_or(TypeRef::UNTYPED)
}

/// Which paths a write through `subresource` may own: `/status` owns only status; the main
/// resource of a kind with a status subresource never owns status.
pub(crate) fn path_filter(
    obj: &Value,
    subresource: Option<&str>,
) -> impl Fn(&Path) -> bool + use<> {
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let has_status = crate::kinds::by_kind(av, kind).is_some_and(|s| s.info().status_subresource);
    let only_status = subresource == Some("status");
    move |p: &Path| {
        if stripped(p) {
            return false;
        }
        let is_status = p.first().is_some_and(|f| f == "f:status");
        if only_status {
            is_status
        } else {
            !(has_status && is_status)
        }
    }
}

/// Paths of an object without its managed fields.
pub(crate) fn object_paths(obj: &Value, t: TypeRef) -> std::collections::BTreeMap<Path, Node> {
    let mut v = obj.clone();
    if let Some(Value::Object(m)) = v.get_mut("metadata") {
        m.shift_remove("managedFields");
    }
    paths(&v, t)
}

/// The comparison of two objects: paths added or changed, and paths removed.
pub(crate) fn compare(old: &Value, new: &Value, t: TypeRef) -> (FieldSet, FieldSet) {
    let a = object_paths(old, t);
    let b = object_paths(new, t);
    let mut changed = FieldSet::new();
    for (p, n) in &b {
        match (a.get(p), n) {
            (None, _) => {
                changed.insert(p.clone());
            }
            (Some(Node::Leaf(x)), Node::Leaf(y)) if !json_eq(x, y) => {
                changed.insert(p.clone());
            }
            (Some(Node::Leaf(_)), Node::Item | Node::Map | Node::Struct)
            | (Some(Node::Item | Node::Map | Node::Struct), Node::Leaf(_)) => {
                changed.insert(p.clone());
            }
            _ => {}
        }
    }
    let removed = a.keys().filter(|p| !b.contains_key(*p)).cloned().collect();
    // Struct nodes are never owned by themselves.
    changed.retain(|p| !matches!(b.get(p), Some(Node::Struct)));
    (changed, removed)
}

/// Updates `new.metadata.managedFields` after an ordinary write (`operation` is `"Update"`) of
/// `new` over `old` (`None` for a create) by `manager`, and returns the object.
pub fn record_update(
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
    api_version: &str,
    now: &str,
) -> Value {
    let empty = json!({});
    let old_v = old.unwrap_or(&empty);
    let t = type_of(new);
    let keep = path_filter(new, subresource);
    let (mut changed, removed) = compare(old_v, new, t);
    changed.retain(|p| keep(p));

    // A client may send managedFields of its own (to reset or edit them); honour those.
    let sent = new.pointer("/metadata/managedFields");
    let before = old_v.pointer("/metadata/managedFields");
    let mut list = if sent.is_some() && sent != before {
        entries(new)
    } else {
        entries(old_v)
    };

    let mut mine_found = false;
    for e in &mut list {
        if e.same_manager(manager, operation, subresource, api_version) {
            mine_found = true;
            e.set.retain(|p| !removed.contains(p));
            if !changed.is_empty() {
                e.set.extend(changed.iter().cloned());
                e.time = Some(now.to_string());
            }
        } else {
            e.set
                .retain(|p| !removed.contains(p) && !changed.contains(p));
        }
    }
    if !mine_found && !changed.is_empty() && !manager.is_empty() {
        list.push(Entry {
            manager: manager.to_string(),
            operation: operation.to_string(),
            api_version: api_version.to_string(),
            time: Some(now.to_string()),
            subresource: subresource.map(str::to_string),
            set: changed,
        });
    }
    let mut out = new.clone();
    set_entries(&mut out, &list);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: &str = "2024-01-01T00:00:00Z";

    #[test]
    fn create_records_the_writer() {
        let new = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}},
            "status": {"replicas": 0}});
        let out = record_update(None, &new, "kubectl-create", "Update", None, "apps/v1", NOW);
        assert_eq!(
            out["metadata"]["managedFields"],
            json!([{"manager": "kubectl-create", "operation": "Update", "apiVersion": "apps/v1", "time": NOW,
                "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                    "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                        "k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}}}])
        );
    }

    #[test]
    fn update_moves_ownership() {
        let old = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "managedFields": [
            {"manager": "a", "operation": "Update", "apiVersion": "v1", "time": NOW, "fieldsType": "FieldsV1",
             "fieldsV1": {"f:data": {".": {}, "f:x": {}, "f:y": {}}}}]},
            "data": {"x": "1", "y": "2"}});
        let mut new = old.clone();
        new["data"] = json!({"x": "9", "z": "3"});
        let out = record_update(
            Some(&old),
            &new,
            "b",
            "Update",
            None,
            "v1",
            "2024-01-02T00:00:00Z",
        );
        let e = entries(&out);
        assert_eq!(e.len(), 2);
        assert_eq!(to_fields_v1(&e[0].set), json!({"f:data": {}}));
        assert_eq!(e[1].manager, "b");
        assert_eq!(
            to_fields_v1(&e[1].set),
            json!({"f:data": {"f:x": {}, "f:z": {}}})
        );
    }

    #[test]
    fn status_writes_own_only_status() {
        let old = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"type": "ClusterIP"}});
        let mut new = old.clone();
        new["status"] = json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}});
        new["spec"]["type"] = json!("NodePort");
        let out = record_update(
            Some(&old),
            &new,
            "ctrl",
            "Update",
            Some("status"),
            "v1",
            NOW,
        );
        let e = entries(&out);
        assert_eq!(e[0].subresource.as_deref(), Some("status"));
        assert_eq!(
            to_fields_v1(&e[0].set),
            json!({"f:status": {"f:loadBalancer": {"f:ingress": {}}}})
        );
        // Nothing changed: no entry.
        let same = record_update(Some(&old), &old, "x", "Update", None, "v1", NOW);
        assert!(same["metadata"].get("managedFields").is_none());
    }
}
