//! NetworkPolicy on `ferry up`'s loopback pod network, where nothing can be enforced: every
//! policy gets a Warning Event and `ferry up` says so once; `ferry netpol explain` and `matrix`
//! evaluate the applied policies (and `--what-if` files) against the real API server.

mod common;

use std::process::Command;

use common::{Ferry, eventually, json};

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: c
    image: registry.k8s.io/serve_hostname
    ports: [{name: http, containerPort: 9376}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers: [{name: c, image: registry.k8s.io/serve_hostname}]
---
apiVersion: v1
kind: Pod
metadata: {name: other, labels: {app: other}}
spec:
  containers: [{name: c, image: registry.k8s.io/serve_hostname}]
"#;

const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-client}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: multi-port-egress}
spec:
  podSelector: {matchLabels: {app: other}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.0.0.0/24}}]
    ports: [{protocol: TCP, port: 32000, endPort: 32768}]
"#;

const WHAT_IF: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny-ingress, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
"#;

fn netpol(f: &Ferry, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("netpol")
        .arg("--kubeconfig")
        .arg(&f.kubeconfig)
        .args(args)
        .output()
        .expect("ferry netpol");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn loopback_warnings_and_explain() {
    let f = Ferry::start();
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], PODS);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], POLICIES);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // One Warning Event per policy, naming it.
    let warned = |name: &str| {
        let out = f.kubectl(&[
            "get",
            "events",
            "--field-selector",
            &format!("reason=NetworkPolicyNotEnforced,involvedObject.name={name}"),
            "-o",
            "json",
        ]);
        let items = json(&String::from_utf8_lossy(&out.stdout))["items"].clone();
        items.as_array().is_some_and(|a| {
            a.len() == 1
                && a[0]["type"] == "Warning"
                && a[0]["involvedObject"]["kind"] == "NetworkPolicy"
                && a[0]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("not enforced"))
        })
    };
    assert!(
        eventually(30, || warned("allow-client") && warned("multi-port-egress")),
        "{}",
        f.log()
    );
    // `ferry up` said it once.
    assert!(eventually(10, || f
        .log()
        .contains("is not enforced on the loopback pod network")));
    assert_eq!(
        f.log()
            .matches("is not enforced on the loopback pod network")
            .count(),
        1
    );

    // explain: by named port, with the rule that allows it.
    let (ok, out, err) = netpol(
        &f,
        &[
            "explain",
            "--from",
            "default/client",
            "--to",
            "default/web:9376/TCP",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("allowed by default/allow-client ingress[0] (peer [0] podSelector {app=client}, port [0] http/TCP)"),
        "{out}"
    );
    assert!(out.trim_end().ends_with("ALLOWED"), "{out}");
    let (ok, out, _) = netpol(
        &f,
        &[
            "explain",
            "--from",
            "default/other",
            "--to",
            "default/web:9376",
        ],
    );
    assert!(ok && out.trim_end().ends_with("DENIED"), "{out}");
    // endPort on egress to an address.
    let (_, out, _) = netpol(
        &f,
        &[
            "explain",
            "--from",
            "default/other",
            "--to",
            "10.0.0.7:32768/TCP",
        ],
    );
    assert!(out.trim_end().ends_with("ALLOWED"), "{out}");
    let (_, out, _) = netpol(
        &f,
        &[
            "explain",
            "--from",
            "default/other",
            "--to",
            "10.0.0.7:32769/TCP",
        ],
    );
    assert!(out.trim_end().ends_with("DENIED"), "{out}");

    // what-if: a default deny not applied yet isolates client too.
    let file = f.dir.path().join("what-if.yaml");
    std::fs::write(&file, WHAT_IF).expect("write");
    let (_, out, _) = netpol(
        &f,
        &[
            "explain",
            "--from",
            "default/web",
            "--to",
            "default/client:80",
        ],
    );
    assert!(out.trim_end().ends_with("ALLOWED"), "{out}");
    let (_, out, _) = netpol(
        &f,
        &[
            "explain",
            "--from",
            "default/web",
            "--to",
            "default/client:80",
            "--what-if",
            file.to_str().expect("path"),
        ],
    );
    assert!(
        out.contains("isolated by default/default-deny-ingress")
            && out.trim_end().ends_with("DENIED"),
        "{out}"
    );

    // matrix: rows are sources, columns destinations.
    let (ok, out, err) = netpol(&f, &["matrix", "-n", "default", "--port", "9376/TCP"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("9376/TCP")
            && lines[0].ends_with("default/client\tdefault/other\tdefault/web"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("default/client") && lines[1].ends_with(".\t.\t."),
        "{out}"
    );
    assert!(
        lines[2].starts_with("default/other") && lines[2].ends_with("X\t.\tX"),
        "other's egress is isolated but it reaches itself: {out}"
    );
    assert!(
        lines[3].starts_with("default/web") && lines[3].ends_with(".\t.\t."),
        "a pod reaches itself: {out}"
    );
    let (ok, _, err) = netpol(
        &f,
        &[
            "explain",
            "--from",
            "default/nope",
            "--to",
            "default/web:80",
        ],
    );
    assert!(!ok && err.contains("pod default/nope not found"), "{err}");
}
