//! The defaulting admission plugins upstream enables by default that Ferry runs:
//! `DefaultTolerationSeconds` and `DefaultIngressClass`. Pure: the caller supplies the
//! IngressClasses.

use serde_json::{Value, json};

pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
/// `--default-not-ready-toleration-seconds` / `--default-unreachable-toleration-seconds`.
pub const DEFAULT_TOLERATION_SECONDS: i64 = 300;

/// `ingressclass.kubernetes.io/is-default-class`.
pub const IS_DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";
/// The deprecated `kubernetes.io/ingress.class` annotation: an Ingress with it keeps no class.
pub const INGRESS_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// `DefaultTolerationSeconds` (pod create and update): a pod that does not tolerate the
/// NoExecute `not-ready` or `unreachable` taint (a toleration with that key or no key, and
/// effect NoExecute or none) gets `Exists` tolerations of them for 300 seconds.
pub fn toleration_seconds(pod: &mut Value) {
    let tolerations: Vec<Value> = pod
        .pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let tolerates = |taint: &str| {
        tolerations.iter().any(|t| {
            let key = t.get("key").and_then(Value::as_str).unwrap_or("");
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
            (key == taint || key.is_empty()) && (effect == "NoExecute" || effect.is_empty())
        })
    };
    let mut add = Vec::new();
    for taint in [NOT_READY_TAINT, UNREACHABLE_TAINT] {
        if !tolerates(taint) {
            add.push(
                json!({"key": taint, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS}),
            );
        }
    }
    if add.is_empty() {
        return;
    }
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let list = spec.entry("tolerations").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(l) = list.as_array_mut() {
        l.extend(add);
    }
}

/// `DefaultIngressClass` (Ingress create): an Ingress with neither `spec.ingressClassName`
/// nor the `kubernetes.io/ingress.class` annotation gets the default IngressClass (annotation
/// `ingressclass.kubernetes.io/is-default-class: "true"`); with several, the newest by
/// creationTimestamp, then the first by name, as upstream.
pub fn ingress_class(ingress: &mut Value, classes: &[Value]) {
    let has_class = ingress
        .pointer("/spec/ingressClassName")
        .is_some_and(|v| !v.is_null());
    let annotated = ingress
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(INGRESS_CLASS_ANNOTATION));
    if has_class || annotated {
        return;
    }
    let created = |c: &Value| {
        c.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| t.as_nanosecond())
            .unwrap_or(i128::MIN)
    };
    let name = |c: &Value| {
        c.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let chosen = classes
        .iter()
        .filter(|c| {
            c.pointer("/metadata/annotations")
                .and_then(|a| a.get(IS_DEFAULT_CLASS))
                .and_then(Value::as_str)
                == Some("true")
        })
        .min_by(|a, b| {
            created(b)
                .cmp(&created(a))
                .then_with(|| name(a).cmp(&name(b)))
        });
    let Some(class) = chosen else {
        return;
    };
    if let Some(o) = ingress.as_object_mut() {
        let spec = o.entry("spec").or_insert_with(|| json!({}));
        if let Some(s) = spec.as_object_mut() {
            s.insert("ingressClassName".into(), json!(name(class)));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tolerations_added_unless_tolerated() {
        let mut p = json!({"spec": {"containers": []}});
        toleration_seconds(&mut p);
        assert_eq!(
            p["spec"]["tolerations"],
            json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ])
        );
        // Idempotent.
        let before = p.clone();
        toleration_seconds(&mut p);
        assert_eq!(p, before);
        let mut own = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]}});
        toleration_seconds(&mut own);
        let t = own["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0]["tolerationSeconds"], 5);
        assert_eq!(t[1]["key"], "node.kubernetes.io/not-ready");
        // A toleration of every taint (no key, no effect) covers both.
        let mut all = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        toleration_seconds(&mut all);
        assert_eq!(all["spec"]["tolerations"].as_array().unwrap().len(), 1);
        // NoSchedule does not cover NoExecute.
        let mut ns =
            json!({"spec": {"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}});
        toleration_seconds(&mut ns);
        assert_eq!(ns["spec"]["tolerations"].as_array().unwrap().len(), 3);
    }

    fn class(name: &str, created: &str, default: Option<&str>) -> Value {
        let mut c = json!({"metadata": {"name": name, "creationTimestamp": created}});
        if let Some(d) = default {
            c["metadata"]["annotations"] = json!({IS_DEFAULT_CLASS: d});
        }
        c
    }

    #[test]
    fn default_class() {
        let classes = [
            class("old", "2026-01-01T00:00:00Z", Some("true")),
            class("new-b", "2026-02-01T00:00:00Z", Some("true")),
            class("new-a", "2026-02-01T00:00:00Z", Some("true")),
            class("newest-not-default", "2026-03-01T00:00:00Z", Some("false")),
            class("plain", "2026-03-01T00:00:00Z", None),
        ];
        let mut ing = json!({"metadata": {"name": "i"}, "spec": {}});
        ingress_class(&mut ing, &classes);
        assert_eq!(ing["spec"]["ingressClassName"], "new-a");
        let mut set = json!({"spec": {"ingressClassName": "mine"}});
        ingress_class(&mut set, &classes);
        assert_eq!(set["spec"]["ingressClassName"], "mine");
        let mut ann =
            json!({"metadata": {"annotations": {"kubernetes.io/ingress.class": "x"}}, "spec": {}});
        ingress_class(&mut ann, &classes);
        assert!(ann["spec"].get("ingressClassName").is_none());
        let mut none = json!({"spec": {}});
        ingress_class(&mut none, &classes[3..]);
        assert!(none["spec"].get("ingressClassName").is_none());
    }
}
