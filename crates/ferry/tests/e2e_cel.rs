//! CEL `x-kubernetes-validations` end to end with kubectl against `ferry up`: the Gateway API
//! v1.6.1 standard CRDs (shared beside the checkout, unchanged) apply, an HTTPRoute breaking
//! one of their rules is refused with upstream's message, a CRD whose rule does not compile
//! is refused, and a transition rule guards an update.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{Ferry, json};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `shared/gateway-api` in the first ancestor of this crate that has it.
fn gateway_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|a| a.join("shared/gateway-api"))
        .find(|p| p.is_dir())
        .expect("shared/gateway-api beside the checkout")
}

const GOOD_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: good
spec:
  parentRefs:
  - name: gw
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /old
    filters:
    - type: RequestRedirect
      requestRedirect:
        path:
          type: ReplacePrefixMatch
          replacePrefixMatch: /new
"#;

#[test]
fn gateway_api_crds_and_their_rules() {
    let f = Ferry::start();
    let dir = gateway_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read gateway-api dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10, "{files:?}");
    for file in &files {
        let path = file.display().to_string();
        let out = f.kubectl(&["apply", "--server-side", "-f", &path]);
        assert!(out.status.success(), "apply {path}: {}", stderr(&out));
    }
    f.k(
        "kubectl",
        &[
            "wait",
            "--for",
            "condition=established",
            "crd/httproutes.gateway.networking.k8s.io",
            "crd/gateways.gateway.networking.k8s.io",
            "--timeout=60s",
        ],
    );

    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], GOOD_ROUTE);
    assert!(out.status.success(), "good route: {}", stderr(&out));

    // An Exact match with a ReplacePrefixMatch redirect breaks the rule on spec.rules[*].
    let bad = GOOD_ROUTE
        .replace("name: good", "name: bad")
        .replace("type: PathPrefix", "type: Exact");
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &bad);
    assert!(!out.status.success(), "bad route accepted");
    let err = stderr(&out);
    assert!(
        err.contains(r#"The HTTPRoute "bad" is invalid: spec.rules[0]: Invalid value: "object": When using RequestRedirect filter with path.replacePrefixMatch, exactly one PathPrefix match must be specified"#),
        "{err}"
    );
    let routes = f.k("kubectl", &["get", "httproutes", "-o", "name"]);
    assert_eq!(routes.trim(), "httproute.gateway.networking.k8s.io/good");

    // A redirect and a rewrite in one rule: the rule on the filters list.
    let both = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: both
spec:
  rules:
  - filters:
    - type: RequestRedirect
      requestRedirect:
        statusCode: 302
    - type: URLRewrite
      urlRewrite:
        hostname: x.example
"#;
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], both);
    assert!(!out.status.success(), "route with both filters accepted");
    assert!(
        stderr(&out).contains(r#"spec.rules[0].filters: Invalid value: "array": May specify either httpRouteFilterRequestRedirect or httpRouteFilterRequestRewrite, but not both"#),
        "{}",
        stderr(&out)
    );

    // A Gateway's listener rules (isIP, size, exists_one...) accept a plain listener.
    let gw = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
spec:
  gatewayClassName: example
  listeners:
  - name: http
    protocol: HTTP
    port: 80
"#;
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], gw);
    assert!(out.status.success(), "gateway: {}", stderr(&out));
}

const WIDGET_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.cel.example.com
spec:
  group: cel.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "self.minReplicas <= self.replicas"
              messageExpression: "'replicas ' + string(self.replicas) + ' below minReplicas ' + string(self.minReplicas)"
            properties:
              minReplicas: {type: integer}
              replicas: {type: integer}
              owner:
                type: string
                x-kubernetes-validations:
                - rule: "self == oldSelf"
                  message: owner is immutable
"#;

fn widget(replicas: i64, owner: &str) -> String {
    format!(
        "apiVersion: cel.example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  minReplicas: 2\n  replicas: {replicas}\n  owner: {owner}\n"
    )
}

#[test]
fn rules_on_a_crd_of_our_own() {
    let f = Ferry::start();
    // A rule that does not compile: the CRD is refused as upstream words it.
    let broken = WIDGET_CRD.replace(
        "self.minReplicas <= self.replicas",
        "self.minReplicas <= self.replicas2",
    );
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &broken);
    assert!(!out.status.success(), "broken CRD accepted");
    let err = stderr(&out);
    assert!(
        err.contains(r#"spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: apiextensions.ValidationRule{Rule:"self.minReplicas <= self.replicas2""#)
            && err.contains("compilation failed: ERROR: <input>:1:")
            && err.contains("undefined field 'replicas2'"),
        "{err}"
    );

    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], WIDGET_CRD);
    assert!(out.status.success(), "CRD: {}", stderr(&out));
    f.k(
        "kubectl",
        &[
            "wait",
            "--for",
            "condition=established",
            "crd/widgets.cel.example.com",
            "--timeout=60s",
        ],
    );
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &widget(1, "alice"));
    assert!(!out.status.success(), "replicas below min accepted");
    assert!(
        stderr(&out).contains(
            r#"The Widget "w" is invalid: spec: Invalid value: "object": replicas 1 below minReplicas 2"#
        ),
        "{}",
        stderr(&out)
    );
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &widget(3, "alice"));
    assert!(out.status.success(), "{}", stderr(&out));
    // transition rule: the owner may not change, other fields may
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &widget(3, "bob"));
    assert!(!out.status.success(), "owner change accepted");
    assert!(
        stderr(&out).contains(r#"spec.owner: Invalid value: "string": owner is immutable"#),
        "{}",
        stderr(&out)
    );
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &widget(4, "alice"));
    assert!(out.status.success(), "{}", stderr(&out));
    let w = json(&f.k("kubectl", &["get", "widget", "w", "-o", "json"]));
    assert_eq!(w["spec"]["replicas"], 4);
    assert_eq!(w["spec"]["owner"], "alice");
}
