//! Issue 27, the rest of the API that real tools use, end to end against `ferry up` with
//! kubectl: impersonation (`--as`, `--as-group`), the `proxy` subresources of pods and
//! services, and the default admission plugins (DefaultIngressClass, DefaultTolerationSeconds).

mod common;

use common::{Ferry, eventually, json};

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}
fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

#[test]
fn impersonation_with_kubectl() {
    let f = Ferry::start();
    // The admin (system:masters) may impersonate anyone.
    let who = json(&f.k(
        "kubectl",
        &[
            "auth",
            "whoami",
            "--as=system:serviceaccount:ux:default",
            "-o",
            "json",
        ],
    ));
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:ux:default"
    );
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        serde_json::json!([
            "system:serviceaccounts",
            "system:serviceaccounts:ux",
            "system:authenticated"
        ])
    );
    let who = json(&f.k(
        "kubectl",
        &[
            "auth",
            "whoami",
            "--as=jane",
            "--as-group=devs",
            "--as-group=ops",
            "--as-uid=42",
            "-o",
            "json",
        ],
    ));
    let u = &who["status"]["userInfo"];
    assert_eq!(u["username"], "jane");
    assert_eq!(u["uid"], "42");
    assert_eq!(
        u["groups"],
        serde_json::json!(["devs", "ops", "system:authenticated"])
    );
    // The impersonated user's own rights apply.
    let o = f.kubectl(&["get", "secrets", "--as=nobody"]);
    assert!(!o.status.success(), "nobody may not list secrets");
    assert!(
        err(&o).contains(
            "secrets is forbidden: User \"nobody\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\""
        ),
        "{}",
        err(&o)
    );

    // A ServiceAccount may impersonate only once granted `impersonate`.
    f.k("kubectl", &["create", "serviceaccount", "imp"]);
    let token = f.k("kubectl", &["create", "token", "imp"]);
    let token = token.trim();
    let as_imp = |args: &[&str]| {
        let mut v = vec!["--token", token];
        v.extend(args);
        f.kubectl_with("kubectl", &v, None)
    };
    // (kubectl auth whoami hides a 403's message; get shows it.)
    let o = as_imp(&["get", "pods", "--as=nobody"]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains(
            "users \"nobody\" is forbidden: User \"system:serviceaccount:default:imp\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        ),
        "{}",
        err(&o)
    );
    f.k(
        "kubectl",
        &[
            "create",
            "clusterrole",
            "impersonator",
            "--verb=impersonate",
            "--resource=users,groups",
        ],
    );
    f.k(
        "kubectl",
        &[
            "create",
            "clusterrolebinding",
            "imp-impersonates",
            "--clusterrole=impersonator",
            "--serviceaccount=default:imp",
        ],
    );
    assert!(
        eventually(60, || {
            let o = as_imp(&["auth", "whoami", "--as=nobody", "-o", "json"]);
            o.status.success() && json(&out(&o))["status"]["userInfo"]["username"] == "nobody"
        }),
        "impersonation allowed once granted\n{}",
        f.log()
    );
    // Groups are authorized one by one; a UID was not granted.
    let o = as_imp(&["get", "pods", "--as=nobody", "--as-uid=7"]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains(
            "uids.authentication.k8s.io \"7\" is forbidden: User \"system:serviceaccount:default:imp\" cannot impersonate resource \"uids\" in API group \"authentication.k8s.io\" at the cluster scope"
        ),
        "{}",
        err(&o)
    );
}

#[test]
fn proxy_subresources_and_default_admission() {
    let f = Ferry::start();
    f.k(
        "kubectl",
        &[
            "create",
            "deployment",
            "hostnames",
            "--image=registry.k8s.io/serve_hostname",
            "--port=9376",
        ],
    );
    f.k(
        "kubectl",
        &[
            "expose",
            "deployment",
            "hostnames",
            "--port=80",
            "--target-port=9376",
        ],
    );
    // A running pod with an IP.
    let mut pod = String::new();
    assert!(
        eventually(120, || {
            let o = f.kubectl(&[
                "get",
                "pods",
                "-l",
                "app=hostnames",
                "-o",
                "jsonpath={range .items[?(@.status.podIP)]}{.metadata.name}{\"\\n\"}{end}",
            ]);
            pod = out(&o).lines().next().unwrap_or("").to_string();
            !pod.is_empty()
        }),
        "a hostnames pod gets an IP\n{}",
        f.log()
    );
    // pods/proxy: the named port, then the first declared container port.
    let mut body = String::new();
    assert!(
        eventually(60, || {
            let o = f.kubectl(&[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/default/pods/{pod}:9376/proxy/"),
            ]);
            body = out(&o);
            o.status.success()
        }),
        "pods/proxy answers\n{body}\n{}",
        f.log()
    );
    assert_eq!(body, pod);
    let o = f.k(
        "kubectl",
        &[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/default/pods/http:{pod}:/proxy/any/path?x=1"),
        ],
    );
    assert_eq!(o.trim(), pod);
    // services/proxy: by port number and without a port (the Service's only port).
    assert!(
        eventually(60, || {
            let o = f.kubectl(&[
                "get",
                "--raw",
                "/api/v1/namespaces/default/services/hostnames:80/proxy/",
            ]);
            body = out(&o);
            o.status.success() && body.starts_with("hostnames-")
        }),
        "services/proxy answers\n{body}\n{}",
        f.log()
    );
    let o = f.k(
        "kubectl",
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/services/hostnames/proxy/",
        ],
    );
    assert!(o.starts_with("hostnames-"), "{o}");
    // Errors as upstream.
    let o = f.kubectl(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/services/hostnames:81/proxy/",
    ]);
    assert!(
        err(&o).contains("no service port 81 found for service \"hostnames\""),
        "{}",
        err(&o)
    );
    f.k(
        "kubectl",
        &["create", "service", "clusterip", "empty", "--tcp=80:80"],
    );
    assert!(
        eventually(60, || {
            let o = f.kubectl(&[
                "get",
                "--raw",
                "/api/v1/namespaces/default/services/empty:80/proxy/",
            ]);
            err(&o).contains("no endpoints available for service \"empty\"")
        }),
        "a Service without endpoints is a 503\n{}",
        f.log()
    );

    // DefaultTolerationSeconds.
    let tol = json(&f.k(
        "kubectl",
        &["get", "pod", &pod, "-o", "jsonpath={.spec.tolerations}"],
    ));
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        assert!(
            tol.as_array()
                .is_some_and(|a| a.iter().any(|t| t["key"] == key
                    && t["effect"] == "NoExecute"
                    && t["operator"] == "Exists"
                    && t["tolerationSeconds"] == 300)),
            "{key} in {tol}"
        );
    }

    // DefaultIngressClass.
    let o = f.k_stdin(
        "kubectl",
        &["apply", "-f", "-"],
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: house\n  annotations:\n    ingressclass.kubernetes.io/is-default-class: \"true\"\nspec:\n  controller: example.com/house\n",
    );
    assert!(o.status.success(), "{}", err(&o));
    f.k("kubectl", &["get", "ingressclass", "house"]);
    let o = f.k_stdin(
        "kubectl",
        &["apply", "-f", "-"],
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: web\nspec:\n  defaultBackend:\n    service:\n      name: hostnames\n      port:\n        number: 80\n",
    );
    assert!(o.status.success(), "{}", err(&o));
    let class = f.k(
        "kubectl",
        &[
            "get",
            "ingress",
            "web",
            "-o",
            "jsonpath={.spec.ingressClassName}",
        ],
    );
    assert_eq!(class.trim(), "house");
}
