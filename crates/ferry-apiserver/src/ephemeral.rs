//! The `pods/ephemeralcontainers` subresource (what `kubectl debug` writes), as upstream's
//! ephemeral containers strategy: an update takes only `spec.ephemeralContainers` from the
//! request (everything else stays as stored), new ephemeral containers are validated, and
//! existing ones may be neither changed nor removed. Pure. Starting the container is the node
//! agent's part.

use ferry_api::errors::{FieldError, Path, quote};
use serde_json::Value;

/// The mirror pod annotation: static pods take no ephemeral containers.
const MIRROR_POD: &str = "kubernetes.io/config.mirror";

/// Container fields an ephemeral container may not set (upstream's allow list, inverted).
const FORBIDDEN_FIELDS: &[&str] = &[
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "resources",
    "resizePolicy",
    "restartPolicy",
];

/// The stored pod with the request's `spec.ephemeralContainers`.
pub fn merge(new: &Value, old: &Value) -> Value {
    let mut merged = old.clone();
    let eph = new.pointer("/spec/ephemeralContainers").cloned();
    if let Some(spec) = merged.get_mut("spec").and_then(Value::as_object_mut) {
        match eph {
            Some(e) if !e.is_null() => {
                spec.insert("ephemeralContainers".into(), e);
            }
            _ => {
                spec.remove("ephemeralContainers");
            }
        }
    }
    merged
}

fn set(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

fn list<'a>(pod: &'a Value, field: &str) -> Vec<&'a Value> {
    pod.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn name(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("")
}

/// The errors of an ephemeral containers update from `old` to `new` (already merged).
pub fn validate(new: &Value, old: &Value) -> Vec<FieldError> {
    if old
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_POD))
    {
        return vec![FieldError::forbidden(
            "",
            "static pods do not support ephemeral containers",
        )];
    }
    let mut errs = Vec::new();
    let path = Path::new("spec").child("ephemeralContainers");
    let regular: Vec<&str> = list(new, "containers")
        .into_iter()
        .chain(list(new, "initContainers"))
        .map(name)
        .collect();
    let eph = list(new, "ephemeralContainers");
    let mut seen: Vec<&str> = regular.clone();
    for (i, c) in eph.iter().enumerate() {
        let p = path.index(i);
        let n = name(c);
        if n.is_empty() {
            errs.push(FieldError::required(p.child("name"), ""));
        } else {
            for msg in ferry_api::names::is_dns1123_label(n) {
                errs.push(FieldError::invalid_str(p.child("name"), n, msg));
            }
            if seen.contains(&n) {
                errs.push(FieldError::duplicate(p.child("name"), quote(n)));
            }
            seen.push(n);
        }
        if !set(c.get("image")) {
            errs.push(FieldError::required(p.child("image"), ""));
        }
        for f in FORBIDDEN_FIELDS {
            if set(c.get(*f)) {
                errs.push(FieldError::forbidden(
                    p.child(f),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
        if let Some(t) = c
            .get("targetContainerName")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            && !regular.contains(&t)
        {
            errs.push(FieldError::not_found(
                p.child("targetContainerName"),
                quote(t),
            ));
        }
    }
    for o in list(old, "ephemeralContainers") {
        let n = name(o);
        match eph.iter().find(|c| name(c) == n) {
            None => errs.push(FieldError::forbidden(
                path.clone(),
                format!(
                    "existing ephemeral containers {} may not be removed\n",
                    quote(n)
                ),
            )),
            Some(c) if *c != o => errs.push(FieldError::forbidden(
                path.child(n),
                format!(
                    "existing ephemeral containers {} may not be changed\n",
                    quote(n)
                ),
            )),
            Some(_) => {}
        }
    }
    errs
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(eph: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "busybox"}],
            "ephemeralContainers": eph}, "status": {"phase": "Running"}})
    }

    fn texts(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn only_ephemeral_containers_change() {
        let old = pod(json!([]));
        let mut new =
            pod(json!([{"name": "debugger", "image": "busybox", "targetContainerName": "app"}]));
        new["spec"]["containers"][0]["image"] = json!("nginx");
        new["status"]["phase"] = json!("Failed");
        let m = merge(&new, &old);
        assert_eq!(m["spec"]["containers"][0]["image"], "busybox");
        assert_eq!(m["status"]["phase"], "Running");
        assert_eq!(m["spec"]["ephemeralContainers"][0]["name"], "debugger");
        assert!(
            validate(&m, &old).is_empty(),
            "{:?}",
            texts(&validate(&m, &old))
        );
    }

    #[test]
    fn new_containers_checked() {
        let old = pod(json!([]));
        let new = pod(json!([
            {"name": "app", "image": "x"},
            {"name": "d", "ports": [{"containerPort": 80}], "resources": {}, "targetContainerName": "nope"}
        ]));
        let t = texts(&validate(&new, &old));
        assert!(
            t.iter()
                .any(|e| e.starts_with("spec.ephemeralContainers[0].name: Duplicate value")),
            "{t:?}"
        );
        assert!(
            t.iter()
                .any(|e| e.starts_with("spec.ephemeralContainers[1].image: Required value")),
            "{t:?}"
        );
        assert!(t.contains(&"spec.ephemeralContainers[1].ports: Forbidden: cannot be set for an Ephemeral Container".to_string()), "{t:?}");
        assert!(!t.iter().any(|e| e.contains("resources")), "{t:?}");
        assert!(
            t.iter().any(
                |e| e.starts_with("spec.ephemeralContainers[1].targetContainerName: Not found")
            ),
            "{t:?}"
        );
    }

    #[test]
    fn existing_ones_kept() {
        let old = pod(json!([{"name": "d", "image": "busybox"}]));
        let removed = pod(json!([]));
        let t = texts(&validate(&removed, &old));
        assert_eq!(t.len(), 1, "{t:?}");
        assert!(
            t[0].contains("existing ephemeral containers \"d\" may not be removed"),
            "{t:?}"
        );
        let changed = pod(json!([{"name": "d", "image": "nginx"}]));
        let t = texts(&validate(&changed, &old));
        assert!(t[0].starts_with("spec.ephemeralContainers.d: Forbidden: existing ephemeral containers \"d\" may not be changed"), "{t:?}");
        let added =
            pod(json!([{"name": "d", "image": "busybox"}, {"name": "e", "image": "busybox"}]));
        assert!(validate(&added, &old).is_empty());
        let mut mirror = old.clone();
        mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
        assert_eq!(
            texts(&validate(&added, &mirror)),
            [": Forbidden: static pods do not support ephemeral containers"]
        );
    }
}
