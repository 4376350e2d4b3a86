//! The storage admission plugins of upstream's default chain on creates:
//! `DefaultStorageClass` (a claim naming no class gets the default StorageClass) and
//! `StorageObjectInUseProtection` (claims and volumes get their protection finalizer, which
//! the PV controller's protection loops remove once nothing uses them). Pure decisions; the
//! caller reads the StorageClasses from the watch cache.

use serde_json::{Value, json};

pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
const DEFAULT_ANNOTATIONS: &[&str] = &[
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];

fn is_default(sc: &Value) -> bool {
    DEFAULT_ANNOTATIONS.iter().any(|a| {
        sc.pointer("/metadata/annotations")
            .and_then(|m| m.get(*a))
            .and_then(Value::as_str)
            == Some("true")
    })
}

/// Upstream's `GetDefaultClass`: among the classes marked default, the newest (then the name
/// first in order); `None` when no class is marked.
pub fn default_class(classes: &[Value]) -> Option<String> {
    let created = |v: &Value| {
        v.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let name = |v: &Value| {
        v.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    classes
        .iter()
        .filter(|c| is_default(c))
        .max_by(|a, b| {
            created(a)
                .cmp(&created(b))
                .then_with(|| name(b).cmp(&name(a)))
        })
        .map(name)
}

/// `DefaultStorageClass` on a claim create: sets `spec.storageClassName` when the claim has
/// none (an explicit "" stays: it asks for no class).
pub fn admit_claim_class(claim: &mut Value, classes: &[Value]) {
    if claim
        .pointer("/spec/storageClassName")
        .is_some_and(|v| !v.is_null())
    {
        return;
    }
    let Some(class) = default_class(classes) else {
        return;
    };
    if let Some(spec) = claim.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("storageClassName".into(), json!(class));
    }
}

/// `StorageObjectInUseProtection`: adds `finalizer` unless present.
pub fn add_finalizer(obj: &mut Value, finalizer: &str) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    if let Some(a) = list.as_array_mut()
        && !a.iter().any(|f| f.as_str() == Some(finalizer))
    {
        a.push(json!(finalizer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sc(name: &str, default: Option<&str>, created: &str) -> Value {
        let mut v = json!({"metadata": {"name": name, "creationTimestamp": created}});
        if let Some(d) = default {
            v["metadata"]["annotations"] =
                json!({"storageclass.kubernetes.io/is-default-class": d});
        }
        v
    }

    #[test]
    fn default_class_table() {
        let t1 = "2026-01-01T00:00:00Z";
        let t2 = "2026-01-02T00:00:00Z";
        let cases: Vec<(Vec<Value>, Option<&str>)> = vec![
            (vec![], None),
            (vec![sc("a", None, t1), sc("b", Some("false"), t1)], None),
            (
                vec![sc("a", None, t1), sc("b", Some("true"), t1)],
                Some("b"),
            ),
            (
                vec![sc("old", Some("true"), t1), sc("new", Some("true"), t2)],
                Some("new"),
            ),
            (
                vec![sc("y", Some("true"), t1), sc("x", Some("true"), t1)],
                Some("x"),
            ),
        ];
        for (classes, want) in cases {
            assert_eq!(default_class(&classes).as_deref(), want, "{classes:?}");
        }
    }

    #[test]
    fn claim_class() {
        let classes = vec![sc("local-path", Some("true"), "2026-01-01T00:00:00Z")];
        let mut c = json!({"spec": {}});
        admit_claim_class(&mut c, &classes);
        assert_eq!(c["spec"]["storageClassName"], "local-path");
        let mut c = json!({"spec": {"storageClassName": ""}});
        admit_claim_class(&mut c, &classes);
        assert_eq!(c["spec"]["storageClassName"], "");
        let mut c = json!({"spec": {"storageClassName": "fast"}});
        admit_claim_class(&mut c, &classes);
        assert_eq!(c["spec"]["storageClassName"], "fast");
        let mut c = json!({"spec": {}});
        admit_claim_class(&mut c, &[]);
        assert!(c["spec"].get("storageClassName").is_none());
    }

    #[test]
    fn finalizer_once() {
        let mut o = json!({"metadata": {"name": "x"}});
        add_finalizer(&mut o, PVC_PROTECTION);
        add_finalizer(&mut o, PVC_PROTECTION);
        assert_eq!(o["metadata"]["finalizers"], json!([PVC_PROTECTION]));
        let mut o = json!({"metadata": {"finalizers": ["a"]}});
        add_finalizer(&mut o, PV_PROTECTION);
        assert_eq!(o["metadata"]["finalizers"], json!(["a", PV_PROTECTION]));
    }
}
