#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::patch::merge;
use crate::patch::schema::root_type;

fn svc() -> TypeRef {
    root_type("v1", "Service").unwrap()
}
fn deploy() -> TypeRef {
    root_type("apps/v1", "Deployment").unwrap()
}
fn pod() -> TypeRef {
    root_type("v1", "Pod").unwrap()
}

fn assert_no_directives(v: &Value, ctx: &str) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                assert!(!k.starts_with('$'), "{ctx}: directive {k} left in result");
                assert_no_directives(x, ctx);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| assert_no_directives(x, ctx)),
        _ => {}
    }
}

fn check(name: &str, t: TypeRef, original: Value, patch: Value, want: Value) {
    let got = apply(&original, &patch, t).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_no_directives(&got, name);
    // Compare with the order of lists (and keys) significant, rendering as text.
    assert_eq!(got.to_string(), want.to_string(), "{name}");
}

#[test]
fn kubectl_client_side_apply_service_port_change() {
    let live = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "old\n"}},
        "spec": {"clusterIP": "10.0.0.10", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
                 "selector": {"app": "web"}, "type": "ClusterIP"}
    });
    let patch = json!({"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"new\n"}},
        "spec":{"$setElementOrder/ports":[{"port":81}],"ports":[{"name":"http","port":81,"targetPort":8080},{"$patch":"delete","port":80}]}});
    let want = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "new\n"}},
        "spec": {"clusterIP": "10.0.0.10", "ports": [{"name": "http", "port": 81, "targetPort": 8080}],
                 "selector": {"app": "web"}, "type": "ClusterIP"}
    });
    check("csa service", svc(), live, patch, want);
}

#[test]
fn kubectl_client_side_apply_deployment() {
    let live = json!({"metadata": {"name": "web"}, "spec": {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "web", "image": "nginx:1.25", "imagePullPolicy": "IfNotPresent", "ports": [{"containerPort": 80, "protocol": "TCP"}]}
    ]}}}});
    let patch = json!({"spec":{"replicas":3,"template":{"spec":{"$setElementOrder/containers":[{"name":"web"}],"containers":[{"image":"nginx:1.27","name":"web"}]}}}});
    let want = json!({"metadata": {"name": "web"}, "spec": {"replicas": 3, "template": {"spec": {"containers": [
        {"name": "web", "image": "nginx:1.27", "imagePullPolicy": "IfNotPresent", "ports": [{"containerPort": 80, "protocol": "TCP"}]}
    ]}}}});
    check("csa deployment", deploy(), live, patch, want);
}

#[test]
fn table() {
    type Case = (&'static str, fn() -> TypeRef, Value, Value, Value);
    let cases: Vec<Case> = vec![
        (
            "null deletes a map key; maps merge",
            svc,
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}}),
        ),
        (
            "list without merge strategy is replaced",
            pod,
            json!({"spec": {"containers": [{"name": "a", "args": ["x", "y"]}]}}),
            json!({"spec": {"containers": [{"name": "a", "args": ["z"]}]}}),
            json!({"spec": {"containers": [{"name": "a", "args": ["z"]}]}}),
        ),
        (
            "merge by key keeps server-only items in place",
            svc,
            json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}}),
            json!({"spec": {"ports": [{"port": 443, "name": "tls"}]}}),
            json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "tls"}]}}),
        ),
        // Upstream's mergeSortedSlice puts patch items first when their place cannot be compared.
        (
            "new items without $setElementOrder come first",
            svc,
            json!({"spec": {"ports": [{"port": 80}]}}),
            json!({"spec": {"ports": [{"port": 8080, "name": "alt"}]}}),
            json!({"spec": {"ports": [{"port": 8080, "name": "alt"}, {"port": 80}]}}),
        ),
        // Upstream test "add an item in a list and preserve order" (three-way case).
        (
            "add an item in a list and preserve order",
            pod,
            json!({"spec": {"containers": [{"name": 1, "other": "a"}, {"name": 2, "value": 2, "other": "b"}]}}),
            json!({"spec": {"$setElementOrder/containers": [{"name": 3}, {"name": 1}, {"name": 2}], "containers": [{"name": 3, "value": 3}]}}),
            json!({"spec": {"containers": [{"name": 3, "value": 3}, {"name": 1, "other": "a"}, {"name": 2, "value": 2, "other": "b"}]}}),
        ),
        // Upstream test "add multiple items in a list and preserve order".
        (
            "add multiple items in a list and preserve order",
            pod,
            json!({"spec": {"containers": [{"name": 1, "other": "a"}, {"name": 2, "value": 2, "other": "b"}]}}),
            json!({"spec": {"$setElementOrder/containers": [{"name": 1}, {"name": 4}, {"name": 2}, {"name": 3}], "containers": [{"name": 4, "value": 4}, {"name": 3, "value": 3}]}}),
            json!({"spec": {"containers": [{"name": 1, "other": "a"}, {"name": 4, "value": 4}, {"name": 2, "value": 2, "other": "b"}, {"name": 3, "value": 3}]}}),
        ),
        (
            "merge key numbers compare as numbers",
            svc,
            json!({"spec": {"ports": [{"port": 80, "name": "a"}]}}),
            json!({"spec": {"ports": [{"port": 80.0, "name": "b"}]}}),
            json!({"spec": {"ports": [{"port": 80.0, "name": "b"}]}}),
        ),
        (
            "$patch: delete item",
            pod,
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}], "volumes": [{"name": "v", "emptyDir": {}}]}}),
            json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}),
            json!({"spec": {"containers": [{"name": "b"}], "volumes": [{"name": "v", "emptyDir": {}}]}}),
        ),
        (
            "$patch: replace item replaces the list",
            pod,
            json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b"}]}}),
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "c", "image": "y"}]}}),
            json!({"spec": {"containers": [{"name": "c", "image": "y"}]}}),
        ),
        (
            "$patch: replace in a map",
            svc,
            json!({"spec": {"selector": {"app": "a", "tier": "b"}, "type": "ClusterIP"}}),
            json!({"spec": {"selector": {"$patch": "replace", "app": "z"}}}),
            json!({"spec": {"selector": {"app": "z"}, "type": "ClusterIP"}}),
        ),
        (
            "$patch: replace of a whole struct",
            svc,
            json!({"spec": {"selector": {"app": "a"}, "type": "ClusterIP"}}),
            json!({"spec": {"$patch": "replace", "type": "NodePort"}}),
            json!({"spec": {"type": "NodePort"}}),
        ),
        (
            "$patch: delete in a map empties it",
            svc,
            json!({"metadata": {"name": "x", "labels": {"a": "1"}}}),
            json!({"metadata": {"labels": {"$patch": "delete"}}}),
            json!({"metadata": {"name": "x", "labels": {}}}),
        ),
        (
            "$patch: delete of an absent map adds nothing",
            svc,
            json!({"metadata": {"name": "x"}}),
            json!({"metadata": {"labels": {"$patch": "delete"}}}),
            json!({"metadata": {"name": "x"}}),
        ),
        (
            "$patch: merge is a no-op directive",
            svc,
            json!({"metadata": {"labels": {"a": "1"}}}),
            json!({"metadata": {"labels": {"$patch": "merge", "b": "2"}}}),
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
        ),
        (
            "finalizers merge as a set",
            svc,
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"finalizers": ["c", "a"]}}),
            json!({"metadata": {"finalizers": ["c", "a", "b"]}}),
        ),
        (
            "$deleteFromPrimitiveList",
            svc,
            json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "zz"]}}),
            json!({"metadata": {"finalizers": ["a", "c"]}}),
        ),
        (
            "$deleteFromPrimitiveList with $setElementOrder and additions",
            svc,
            json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
            json!({"metadata": {"$setElementOrder/finalizers": ["d", "a", "c"], "$deleteFromPrimitiveList/finalizers": ["b"], "finalizers": ["d"]}}),
            json!({"metadata": {"finalizers": ["d", "a", "c"]}}),
        ),
        (
            "$setElementOrder reorders without changes",
            pod,
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "A"}, {"name": "B"}, {"name": "C"}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "$setElementOrder/env": [{"name": "C"}, {"name": "A"}, {"name": "B"}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "C"}, {"name": "A"}, {"name": "B"}]}]}}),
        ),
        (
            "$setElementOrder keeps server-only items in place",
            pod,
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c", "image": "1"}]}}),
            json!({"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "c"}], "containers": [{"name": "c", "image": "2"}]}}),
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c", "image": "2"}]}}),
        ),
        (
            "$setElementOrder for a list that is new",
            deploy,
            json!({"spec": {}}),
            json!({"spec": {"template": {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}], "containers": [{"name": "b"}, {"name": "a", "$setElementOrder/env": [{"name": "X"}], "env": [{"name": "X", "value": "1"}]}]}}}}),
            json!({"spec": {"template": {"spec": {"containers": [{"name": "b"}, {"name": "a", "env": [{"name": "X", "value": "1"}]}]}}}}),
        ),
        (
            "$retainKeys clears other keys (Deployment strategy)",
            deploy,
            json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
            json!({"spec": {"strategy": {"type": "Recreate"}}}),
        ),
        (
            "$retainKeys on a volume source (volumes: merge,retainKeys)",
            pod,
            json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}),
            json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["configMap", "name"], "configMap": {"name": "cm"}}]}}),
            json!({"spec": {"volumes": [{"name": "v", "configMap": {"name": "cm"}}]}}),
        ),
        (
            "null deletes a list",
            pod,
            json!({"spec": {"containers": [{"name": "a", "args": ["x"]}]}}),
            json!({"spec": {"containers": [{"name": "a", "args": null}]}}),
            json!({"spec": {"containers": [{"name": "a"}]}}),
        ),
        (
            "directive items of a replaced list are dropped",
            pod,
            json!({"spec": {"containers": [{"name": "a", "args": ["x"]}]}}),
            json!({"spec": {"containers": [{"name": "a", "command": [{"$patch": "delete"}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "args": ["x"], "command": []}]}}),
        ),
        (
            "owner references merge by uid",
            svc,
            json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]}}),
            json!({"metadata": {"ownerReferences": [{"uid": "2", "name": "b"}]}}),
            json!({"metadata": {"ownerReferences": [{"uid": "2", "name": "b"}, {"uid": "1", "name": "a"}]}}),
        ),
        (
            "conditions merge by type",
            svc,
            json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}]}}),
            json!({"status": {"conditions": [{"type": "B", "status": "True"}]}}),
            json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "True"}]}}),
        ),
        (
            "container ports merge by containerPort, volumeMounts by mountPath",
            pod,
            json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80}], "volumeMounts": [{"mountPath": "/a", "name": "x"}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 81}], "volumeMounts": [{"mountPath": "/a", "readOnly": true}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 81}, {"containerPort": 80}], "volumeMounts": [{"mountPath": "/a", "name": "x", "readOnly": true}]}]}}),
        ),
        (
            "type change replaces",
            svc,
            json!({"spec": {"ports": [{"port": 80}]}}),
            json!({"spec": {"ports": {"weird": true}}}),
            json!({"spec": {"ports": {"weird": true}}}),
        ),
        (
            "unknown fields are merged untyped",
            svc,
            json!({"spec": {"bogus": {"a": [1, 2], "b": 1}}}),
            json!({"spec": {"bogus": {"a": [3]}}}),
            json!({"spec": {"bogus": {"a": [3], "b": 1}}}),
        ),
        (
            "untyped schema: lists replaced, maps merged",
            || TypeRef::UNTYPED,
            json!({"spec": {"ports": [{"port": 80}], "x": {"a": 1}}}),
            json!({"spec": {"ports": [{"port": 81}], "x": {"b": 2}}}),
            json!({"spec": {"ports": [{"port": 81}], "x": {"a": 1, "b": 2}}}),
        ),
        (
            "unknown $ keys are dropped",
            svc,
            json!({"metadata": {"name": "x"}}),
            json!({"metadata": {"$frob": 1}}),
            json!({"metadata": {"name": "x"}}),
        ),
        (
            "root $patch: replace",
            svc,
            json!({"metadata": {"name": "x"}, "spec": {"type": "A"}}),
            json!({"$patch": "replace", "metadata": {"name": "y"}}),
            json!({"metadata": {"name": "y"}}),
        ),
    ];
    for (name, t, original, patch, want) in cases {
        check(name, t(), original, patch, want);
    }
}

#[test]
fn errors() {
    let cases: Vec<(Value, Value, u16, &str)> = vec![
        (json!({}), json!([1]), 400, "invalid JSON document"),
        (
            json!({"spec": {"ports": [{"port": 80}]}}),
            json!({"spec": {"ports": [{"name": "x"}]}}),
            422,
            "does not contain declared merge key: port",
        ),
        (
            json!({"spec": {"ports": [{"port": 80}]}}),
            json!({"spec": {"ports": [{"$patch": "delete"}]}}),
            422,
            "merge key",
        ),
        (
            json!({"spec": {"ports": [{"port": 80}]}}),
            json!({"spec": {"ports": [{"$patch": "merge", "port": 80}]}}),
            422,
            "merging lists cannot yet be specified",
        ),
        (
            json!({"spec": {"ports": [{"port": 80}]}}),
            json!({"spec": {"ports": [{"$patch": "frob", "port": 80}]}}),
            400,
            "unknown patch type",
        ),
        (
            json!({"spec": {}}),
            json!({"spec": {"$patch": "frob"}}),
            400,
            "unknown patch type",
        ),
        (
            json!({"spec": {"ports": [{"port": 80}]}}),
            json!({"spec": {"$setElementOrder/ports": {"port": 80}}}),
            400,
            "setElementOrder",
        ),
        (
            json!({"spec": {"ports": [{"port": 80}, {"port": 81}]}}),
            json!({"spec": {"$setElementOrder/ports": [{"port": 80}], "ports": [{"port": 81}]}}),
            400,
            "doesn't match $setElementOrder",
        ),
        (
            json!({"metadata": {"finalizers": ["a"]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
            400,
            "primitive list",
        ),
        (
            json!({"spec": {"strategy": {}}}),
            json!({"spec": {"strategy": {"$retainKeys": "type"}}}),
            400,
            "retainKeys",
        ),
        (
            json!({"spec": {"strategy": {}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {}}}}),
            400,
            "retainKeys",
        ),
        (
            json!({"metadata": {"finalizers": ["a"]}}),
            json!({"metadata": {"finalizers": [{"x": 1}]}}),
            422,
            "not identical",
        ),
        (
            json!({"metadata": {"finalizers": ["a"]}}),
            json!({"metadata": {"finalizers": [["x"]]}}),
            422,
            "lists of lists",
        ),
    ];
    for (original, patch, code, msg) in cases {
        let t = if patch.to_string().contains("strategy") {
            deploy()
        } else {
            svc()
        };
        let e = apply(&original, &patch, t).expect_err(&patch.to_string());
        assert_eq!(e.code(), code, "{patch}: {e}");
        assert!(e.to_string().contains(msg), "{patch}: {e}");
    }
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<bool>().prop_map(Value::from),
        any::<i8>().prop_map(Value::from),
        "[a-z]{0,2}".prop_map(Value::from)
    ]
}

fn doc() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 20, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map("[a-c]", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Patches: objects whose members may be `null` (deletions), never inside arrays.
fn patch_doc() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![3 => doc(), 1 => Just(Value::Null)];
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop::collection::btree_map("[a-c]", inner, 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    })
}

fn obj(v: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    prop::collection::btree_map("[a-c]", v, 0..4)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

proptest! {
    /// Without schema and without directives, a strategic merge patch is a JSON merge patch.
    #[test]
    fn untyped_equals_merge_patch(original in obj(doc()), patch in obj(patch_doc())) {
        let s = apply(&original, &patch, TypeRef::UNTYPED).unwrap();
        prop_assert_eq!(s, merge::apply(&original, &patch));
    }

    /// Merging Service ports by key never loses a port and never leaves a directive.
    #[test]
    fn service_ports_merge_by_key(live in prop::collection::btree_set(1u16..6, 0..4), patch in prop::collection::btree_set(1u16..6, 0..4), del in prop::collection::btree_set(1u16..6, 0..2)) {
        let live_ports: Vec<Value> = live.iter().map(|p| json!({"port": p, "name": "live"})).collect();
        let mut items: Vec<Value> = patch.iter().map(|p| json!({"port": p, "name": "patch"})).collect();
        items.extend(del.iter().filter(|d| !patch.contains(d)).map(|d| json!({"port": d, "$patch": "delete"})));
        let got = apply(&json!({"spec": {"ports": live_ports}}), &json!({"spec": {"ports": items}}), svc()).unwrap();
        assert_no_directives(&got, "prop");
        let ports = got["spec"]["ports"].as_array().unwrap();
        let want: std::collections::BTreeSet<u16> = live.iter().chain(&patch).copied().filter(|p| patch.contains(p) || !del.contains(p)).collect();
        let have: std::collections::BTreeSet<u16> = ports.iter().map(|p| p["port"].as_u64().unwrap() as u16).collect();
        prop_assert_eq!(have, want);
        prop_assert_eq!(ports.len(), ports.iter().map(|p| p["port"].clone()).collect::<std::collections::HashSet<_>>().len());
        for p in ports {
            let n = p["port"].as_u64().unwrap() as u16;
            prop_assert_eq!(p["name"].as_str().unwrap(), if patch.contains(&n) { "patch" } else { "live" });
        }
    }
}
