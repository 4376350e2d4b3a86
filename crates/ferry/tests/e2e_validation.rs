//! Validation errors end to end: what kubectl prints for an invalid object, and the `Status`
//! (message and causes) a client gets, in upstream's format.

mod common;

use common::Ferry;

/// Go's `%#v` of the selector below, as upstream's field error prints it.
const FOO_SELECTOR: &str = r#"v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement{v1.LabelSelectorRequirement{Key:"app", Operator:"Foo", Values:[]string{"web"}}}}"#;
const FOO_OPERATOR: &str = r#"spec.selector.matchExpressions[0].operator: Invalid value: "Foo": not a valid selector operator"#;

/// A workload whose selector has an unknown operator (so it does not parse) and whose template
/// labels it would not select anyway.
fn workload(kind: &str) -> String {
    let extra = match kind {
        "StatefulSet" => "  serviceName: web\n",
        _ => "",
    };
    format!(
        "apiVersion: apps/v1\nkind: {kind}\nmetadata:\n  name: web\nspec:\n{extra}  selector:\n    matchExpressions:\n    - key: app\n      operator: Foo\n      values: [web]\n  template:\n    metadata:\n      labels:\n        app: other\n    spec:\n      containers:\n      - name: web\n        image: nginx\n"
    )
}

const STATUS_SCRIPT: &str = r#"
import json, sys
from kubernetes import client, config
from kubernetes.client.rest import ApiException
config.load_kube_config()
body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "Foo", "values": ["web"]}]},
                 "template": {"metadata": {"labels": {"app": "other"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}
try:
    client.AppsV1Api().create_namespaced_deployment("default", body)
    print("created")
except ApiException as e:
    s = json.loads(e.body)
    print(e.status)
    print(s["reason"])
    print(s["message"])
    for c in s["details"]["causes"]:
        print(c["reason"] + " | " + c["field"] + " | " + c["message"])
"#;

/// An unparsable workload selector (upstream `LabelSelectorAsSelector` fails): kubectl lists the
/// selector's own error, then per kind "invalid label selector" (Deployment), a detail-less
/// `spec.selector` error (StatefulSet) or nothing more (DaemonSet); never the template mismatch.
#[test]
fn unparsable_workload_selector_is_reported_as_upstream() {
    let f = Ferry::start();
    let cases = [
        (
            "Deployment",
            "deployment",
            format!(
                "The Deployment \"web\" is invalid: \n* {FOO_OPERATOR}\n* spec.selector: Invalid value: {FOO_SELECTOR}: invalid label selector\n"
            ),
        ),
        (
            "StatefulSet",
            "statefulset",
            format!(
                "The StatefulSet \"web\" is invalid: \n* {FOO_OPERATOR}\n* spec.selector: Invalid value: {FOO_SELECTOR}\n"
            ),
        ),
        (
            "DaemonSet",
            "daemonset",
            format!("The DaemonSet \"web\" is invalid: {FOO_OPERATOR}\n"),
        ),
    ];
    for (kind, resource, want) in cases {
        let out = f.k_stdin("kubectl", &["create", "-f", "-"], &workload(kind));
        assert!(!out.status.success(), "{kind} was accepted");
        assert_eq!(String::from_utf8_lossy(&out.stderr), want, "{kind}");
        assert!(
            !f.kubectl(&["get", resource, "web"]).status.success(),
            "{kind} was stored"
        );
    }

    // The Status itself: 422 Invalid, upstream's aggregated message, one cause per error.
    let got = f.python(STATUS_SCRIPT, &[]);
    let want = format!(
        "422\nInvalid\nDeployment.apps \"web\" is invalid: [{FOO_OPERATOR}, spec.selector: Invalid value: {FOO_SELECTOR}: invalid label selector]\n\
         FieldValueInvalid | spec.selector.matchExpressions[0].operator | Invalid value: \"Foo\": not a valid selector operator\n\
         FieldValueInvalid | spec.selector | Invalid value: {FOO_SELECTOR}: invalid label selector\n"
    );
    assert_eq!(got, want);
}
