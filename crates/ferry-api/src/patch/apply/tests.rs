#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use super::*;
use crate::patch::managed::entries;
use crate::patch::schema::root_type;

const T1: &str = "2024-01-01T00:00:00Z";
const T2: &str = "2024-01-02T00:00:00Z";

fn svc() -> TypeRef {
    root_type("v1", "Service").unwrap()
}
fn deploy() -> TypeRef {
    root_type("apps/v1", "Deployment").unwrap()
}

fn service(labels: Value, ports: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default", "labels": labels},
           "spec": {"ports": ports, "selector": {"app": "web"}}})
}

fn fields_of(obj: &Value, manager: &str) -> Value {
    entries(obj)
        .into_iter()
        .find(|e| e.manager == manager)
        .map(|e| e.to_json()["fieldsV1"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn create_records_apply_entry() {
    let cfg = service(
        json!({"app": "web"}),
        json!([{"port": 80, "targetPort": 8080}]),
    );
    let out = apply(None, &cfg, "kubectl", false, svc(), T1).unwrap();
    assert_eq!(
        out["spec"]["ports"],
        json!([{"port": 80, "targetPort": 8080}])
    );
    assert_eq!(
        out["metadata"]["managedFields"],
        json!([{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "time": T1, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:port": {}, "f:targetPort": {}}},
                           "f:selector": {}}}}])
    );
}

#[test]
fn reapply_removes_omitted_fields_and_items() {
    let cfg1 = service(
        json!({"app": "web", "tier": "fe"}),
        json!([{"port": 80}, {"port": 443}]),
    );
    let live = apply(None, &cfg1, "kubectl", false, svc(), T1).unwrap();
    // Defaulting by the server adds a field nobody applied: it must survive.
    let mut live = live;
    live["spec"]["ports"][0]["protocol"] = json!("TCP");
    live["spec"]["type"] = json!("ClusterIP");
    let cfg2 = service(json!({"app": "web"}), json!([{"port": 80}]));
    let out = apply(Some(&live), &cfg2, "kubectl", false, svc(), T2).unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"app": "web"}));
    assert_eq!(
        out["spec"]["ports"],
        json!([{"port": 80, "protocol": "TCP"}])
    );
    assert_eq!(out["spec"]["type"], json!("ClusterIP"));
    assert_eq!(entries(&out).len(), 1);
    assert_eq!(entries(&out)[0].time.as_deref(), Some(T2));
}

#[test]
fn conflicts_and_force() {
    let live = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "managedFields": [
            {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "apps/v1", "time": T1,
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}, "f:paused": {}}}}]},
        "spec": {"replicas": 1, "paused": false}});
    let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 3, "paused": false}});
    let err = apply(Some(&live), &cfg, "kubectl", false, deploy(), T2).unwrap_err();
    assert_eq!(
        err.conflicts,
        vec![(
            "kubectl-client-side-apply".to_string(),
            ".spec.replicas".to_string()
        )]
    );
    assert_eq!(
        err.message(),
        "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\": .spec.replicas"
    );
    assert_eq!(
        err.causes(),
        vec![
            json!({"reason": "FieldManagerConflict", "message": "conflict with \"kubectl-client-side-apply\"", "field": ".spec.replicas"})
        ]
    );
    let e = crate::patch::PatchError::Conflict(err);
    assert_eq!(e.code(), 409);
    assert_eq!(
        e.status()["details"]["causes"][0]["field"],
        json!(".spec.replicas")
    );

    let out = apply(Some(&live), &cfg, "kubectl", true, deploy(), T2).unwrap();
    assert_eq!(out["spec"]["replicas"], json!(3));
    // The old manager keeps the field with the same value (shared), loses the forced one.
    assert_eq!(
        fields_of(&out, "kubectl-client-side-apply"),
        json!({"f:spec": {"f:paused": {}}})
    );
    assert_eq!(
        fields_of(&out, "kubectl"),
        json!({"f:spec": {"f:paused": {}, "f:replicas": {}}})
    );
}

#[test]
fn fields_owned_by_others_survive_omission() {
    let cfg = service(json!({"app": "web"}), json!([{"port": 80}]));
    let live = apply(None, &cfg, "a", false, svc(), T1).unwrap();
    let live = apply(
        Some(&live),
        &service(json!({"app": "web"}), json!([{"port": 81}])),
        "b",
        false,
        svc(),
        T1,
    )
    .unwrap();
    assert_eq!(live["spec"]["ports"], json!([{"port": 80}, {"port": 81}]));
    // `a` drops its label: `b` also applied it, so it stays; `a` drops port 80: it goes.
    let out = apply(Some(&live), &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}}}), "a", false, svc(), T2).unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"app": "web"}));
    assert_eq!(out["spec"]["ports"], json!([{"port": 81}]));
}

#[test]
fn multiple_conflicts_message() {
    let c = ApplyConflicts {
        conflicts: vec![
            ("a".into(), ".spec.x".into()),
            ("a".into(), ".spec.y".into()),
            ("b".into(), ".spec.z".into()),
        ],
    };
    assert_eq!(
        c.message(),
        "Apply failed with 3 conflicts: conflicts with \"a\":\n- .spec.x\n- .spec.y\nconflicts with \"b\":\n- .spec.z"
    );
}

#[test]
fn set_lists_union_and_atomic_lists_replace() {
    let live = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "finalizers": ["x"]}, "spec": {"clusterIPs": ["1.1.1.1"]}});
    let cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "finalizers": ["y"]}, "spec": {"clusterIPs": ["2.2.2.2"]}});
    let out = apply(Some(&live), &cfg, "m", false, svc(), T1).unwrap();
    assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
    assert_eq!(out["spec"]["clusterIPs"], json!(["2.2.2.2"]));
    assert_eq!(
        fields_of(&out, "m"),
        json!({"f:metadata": {"f:finalizers": {"v:\"y\"": {}}}, "f:spec": {"f:clusterIPs": {}}})
    );
}

#[test]
fn unknown_kinds_apply_untyped() {
    let cfg = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"list": [1, 2], "m": {"a": 1}}});
    let out = apply(None, &cfg, "m", false, TypeRef::UNTYPED, T1).unwrap();
    assert_eq!(
        fields_of(&out, "m"),
        json!({"f:spec": {"f:list": {}, "f:m": {"f:a": {}}}})
    );
}

fn csa_deployment(replicas: i64, last_replicas: i64) -> Value {
    let last = format!(
        "{{\"apiVersion\":\"apps/v1\",\"kind\":\"Deployment\",\"metadata\":{{\"annotations\":{{}},\"name\":\"web\"}},\"spec\":{{\"replicas\":{last_replicas}}}}}\n"
    );
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {LAST_APPLIED: last}, "managedFields": [
            {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "apps/v1", "time": T1,
             "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                 "f:spec": {"f:replicas": {}}}}]},
        "spec": {"replicas": replicas}})
}

#[test]
fn kubectl_server_side_apply_takes_over_client_side_fields() {
    let live = csa_deployment(1, 1);
    let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 3}});
    // Another manager conflicts, as always.
    let err = apply(Some(&live), &cfg, "helm", false, deploy(), T2).unwrap_err();
    assert_eq!(
        err.conflicts,
        vec![(
            "kubectl-client-side-apply".to_string(),
            ".spec.replicas".to_string()
        )]
    );
    // kubectl's apply migrates: the field still holds the last-applied value.
    let out = apply(Some(&live), &cfg, "kubectl", false, deploy(), T2).unwrap();
    assert_eq!(out["spec"]["replicas"], json!(3));
    assert_eq!(
        fields_of(&out, "kubectl"),
        json!({"f:spec": {"f:replicas": {}}})
    );
    assert_eq!(
        fields_of(&out, "kubectl-client-side-apply"),
        json!({"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}}})
    );
    // The annotation now records the server-side applied configuration.
    let text = out["metadata"]["annotations"][LAST_APPLIED]
        .as_str()
        .unwrap();
    assert!(text.ends_with('\n'));
    let recorded: Value = serde_json::from_str(text).unwrap();
    assert_eq!(recorded, cfg);
}

#[test]
fn kubectl_server_side_apply_still_conflicts_on_fields_changed_since() {
    // Someone scaled to 2 after the client-side apply of 1: that is not kubectl's value.
    let live = csa_deployment(2, 1);
    let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 3}});
    let err = apply(Some(&live), &cfg, "kubectl", false, deploy(), T2).unwrap_err();
    assert_eq!(err.conflicts.len(), 1);
    // A last-applied annotation of another version allows nothing either.
    let mut other = csa_deployment(1, 1);
    other["metadata"]["annotations"][LAST_APPLIED] = json!(
        "{\"apiVersion\":\"apps/v1beta1\",\"kind\":\"Deployment\",\"spec\":{\"replicas\":1}}"
    );
    assert!(apply(Some(&other), &cfg, "kubectl", false, deploy(), T2).is_err());
}
