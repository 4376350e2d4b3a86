//! Issue 14, identities and authorization, end to end against `ferry up` with kubectl: three
//! identities (the admin, a ServiceAccount bound to `view` in one namespace, an unbound
//! ServiceAccount) — `kubectl auth can-i` answers as upstream, and the requests themselves are
//! allowed or refused with upstream's 403 message; `auth whoami`, `auth can-i --list`,
//! `create token`; the identity controllers (`default` ServiceAccount, `kube-root-ca.crt`,
//! aggregated `view`).

mod common;

use common::{Ferry, eventually, json};

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}
fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

/// kubectl as the holder of `token` (empty: the kubeconfig's admin).
fn as_user(f: &Ferry, token: &str, args: &[&str]) -> std::process::Output {
    let mut v: Vec<&str> = Vec::new();
    if !token.is_empty() {
        v.extend(["--token", token]);
    }
    v.extend(args);
    f.kubectl_with("kubectl", &v, None)
}

/// `kubectl auth can-i` as `token`: Some(true) for "yes" (exit 0), Some(false) for "no" (exit 1).
fn can_i(f: &Ferry, token: &str, args: &[&str]) -> bool {
    let mut v = vec!["auth", "can-i"];
    v.extend(args);
    let o = as_user(f, token, &v);
    match (o.status.code(), out(&o).as_str()) {
        (Some(0), "yes") => true,
        (Some(1), s) if s.starts_with("no") => false,
        _ => panic!(
            "auth can-i {args:?}: {:?} {} {}\n{}",
            o.status,
            out(&o),
            err(&o),
            f.log()
        ),
    }
}

#[test]
fn three_identities_with_kubectl() {
    let f = Ferry::start();
    // The identity controllers.
    f.k("kubectl", &["create", "namespace", "team-a"]);
    assert!(
        eventually(60, || f
            .kubectl(&["get", "serviceaccount", "default", "-n", "team-a"])
            .status
            .success()),
        "the default ServiceAccount appears in a new namespace\n{}",
        f.log()
    );
    assert!(
        eventually(60, || {
            let o = f.kubectl(&[
                "get",
                "configmap",
                "kube-root-ca.crt",
                "-n",
                "team-a",
                "-o",
                "json",
            ]);
            o.status.success()
                && json(&out(&o))["data"]["ca.crt"]
                    .as_str()
                    .is_some_and(|c| c.contains("BEGIN CERTIFICATE"))
        }),
        "kube-root-ca.crt is published"
    );
    assert!(
        eventually(60, || {
            let v = json(&f.k("kubectl", &["get", "clusterrole", "view", "-o", "json"]));
            v["rules"].as_array().is_some_and(|r| !r.is_empty())
        }),
        "view is aggregated from system:aggregate-to-view"
    );
    let table = f.k(
        "kubectl",
        &["get", "clusterrolebinding", "cluster-admin", "-o", "wide"],
    );
    assert!(
        table.contains("ClusterRole/cluster-admin") && table.contains("system:masters"),
        "{table}"
    );

    // Two ServiceAccounts; `reader` may view team-a.
    f.k(
        "kubectl",
        &["create", "serviceaccount", "reader", "-n", "team-a"],
    );
    f.k(
        "kubectl",
        &["create", "serviceaccount", "nobody", "-n", "team-a"],
    );
    f.k(
        "kubectl",
        &[
            "create",
            "rolebinding",
            "reader-view",
            "--clusterrole=view",
            "--serviceaccount=team-a:reader",
            "-n",
            "team-a",
        ],
    );
    f.k(
        "kubectl",
        &[
            "create",
            "configmap",
            "c1",
            "-n",
            "team-a",
            "--from-literal=a=1",
        ],
    );
    f.k(
        "kubectl",
        &[
            "create",
            "secret",
            "generic",
            "s1",
            "-n",
            "team-a",
            "--from-literal=a=1",
        ],
    );
    let reader = f
        .k("kubectl", &["create", "token", "reader", "-n", "team-a"])
        .trim()
        .to_string();
    let nobody = f
        .k(
            "kubectl",
            &[
                "create",
                "token",
                "nobody",
                "-n",
                "team-a",
                "--duration=20m",
            ],
        )
        .trim()
        .to_string();
    assert_eq!(reader.split('.').count(), 3, "a JWT: {reader}");

    // whoami.
    let who = out(&as_user(&f, &reader, &["auth", "whoami", "-o", "json"]));
    let who = json(&who);
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:team-a:reader"
    );
    let who = out(&as_user(&f, "", &["auth", "whoami"]));
    assert!(
        who.contains("admin") && who.contains("system:masters"),
        "{who}"
    );

    // can-i as upstream answers it for each identity.
    let cases: &[(&str, &[&str], [bool; 3])] = &[
        (
            "list pods in team-a",
            &["list", "pods", "-n", "team-a"],
            [true, true, false],
        ),
        (
            "get pods/log in team-a",
            &["get", "pods", "--subresource=log", "-n", "team-a"],
            [true, true, false],
        ),
        (
            "watch deployments in team-a",
            &["watch", "deployments.apps", "-n", "team-a"],
            [true, true, false],
        ),
        (
            "list secrets in team-a",
            &["list", "secrets", "-n", "team-a"],
            [true, false, false],
        ),
        (
            "create configmaps in team-a",
            &["create", "configmaps", "-n", "team-a"],
            [true, false, false],
        ),
        (
            "list pods in default",
            &["list", "pods", "-n", "default"],
            [true, false, false],
        ),
        ("list nodes", &["list", "nodes"], [true, false, false]),
        (
            "create selfsubjectaccessreviews",
            &["create", "selfsubjectaccessreviews.authorization.k8s.io"],
            [true, true, true],
        ),
        ("get /api", &["get", "/api"], [true, true, true]),
        ("get /metrics", &["get", "/metrics"], [true, false, false]),
    ];
    for (what, args, want) in cases {
        for (i, token) in ["", reader.as_str(), nobody.as_str()]
            .into_iter()
            .enumerate()
        {
            assert_eq!(can_i(&f, token, args), want[i], "{what} as identity {i}");
        }
    }

    // The requests themselves.
    let o = as_user(&f, &reader, &["get", "configmaps", "-n", "team-a"]);
    assert!(o.status.success() && out(&o).contains("c1"), "{}", err(&o));
    let o = as_user(&f, &reader, &["get", "pods", "-n", "team-a"]);
    assert!(o.status.success(), "{}", err(&o));
    let o = as_user(&f, &reader, &["get", "secrets", "-n", "team-a"]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains(
            "Error from server (Forbidden): secrets is forbidden: User \"system:serviceaccount:team-a:reader\" cannot list resource \"secrets\" in API group \"\" in the namespace \"team-a\""
        ),
        "{}",
        err(&o)
    );
    let o = as_user(&f, &reader, &["delete", "configmap", "c1", "-n", "team-a"]);
    assert!(
        err(&o).contains(
            "configmaps \"c1\" is forbidden: User \"system:serviceaccount:team-a:reader\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team-a\""
        ),
        "{}",
        err(&o)
    );
    let o = as_user(&f, &nobody, &["get", "configmaps", "-n", "team-a"]);
    assert!(
        err(&o).contains(
            "configmaps is forbidden: User \"system:serviceaccount:team-a:nobody\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team-a\""
        ),
        "{}",
        err(&o)
    );
    let o = as_user(&f, &nobody, &["get", "nodes"]);
    assert!(
        err(&o).contains(
            "nodes is forbidden: User \"system:serviceaccount:team-a:nobody\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        ),
        "{}",
        err(&o)
    );
    // The configmap is still there, the admin may do anything.
    f.k("kubectl", &["get", "configmap", "c1", "-n", "team-a"]);
    f.k("kubectl", &["get", "secrets", "-A"]);

    // can-i --list.
    let list = out(&as_user(
        &f,
        &reader,
        &["auth", "can-i", "--list", "-n", "team-a"],
    ));
    assert!(
        list.lines()
            .any(|l| l.starts_with("pods ") && l.contains("[get list watch]")),
        "{list}"
    );
    assert!(!list.lines().any(|l| l.starts_with("secrets ")), "{list}");
    let list = out(&as_user(&f, "", &["auth", "can-i", "--list"]));
    assert!(
        list.lines()
            .any(|l| l.starts_with("*.*") && l.contains("[*]")),
        "{list}"
    );

    // A client certificate from the cluster CA: CN is the user, O the group.
    let d = f.dir.path();
    let run = |args: &[&str]| {
        let o = std::process::Command::new("openssl")
            .args(args)
            .current_dir(d)
            .output()
            .expect("openssl");
        assert!(o.status.success(), "openssl {args:?}: {}", err(&o));
    };
    std::fs::write(
        d.join("client.ext"),
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .expect("ext");
    run(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        "jane.key",
    ]);
    run(&[
        "req",
        "-new",
        "-key",
        "jane.key",
        "-subj",
        "/O=viewers/CN=jane",
        "-out",
        "jane.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "jane.csr",
        "-CA",
        "pki/ca.crt",
        "-CAkey",
        "pki/ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "client.ext",
        "-out",
        "jane.crt",
    ]);
    let admin_kc = std::fs::read_to_string(d.join("kubeconfig")).expect("kubeconfig");
    let server = admin_kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("server");
    let kc = d.join("jane.kubeconfig");
    let write = |user_lines: &str| {
        let ca = d.join("pki/ca.crt");
        std::fs::write(
            &kc,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n{user_lines}",
                ca.display()
            ),
        )
        .expect("write kubeconfig");
    };
    write(&format!(
        "    client-certificate: {}\n    client-key: {}\n",
        d.join("jane.crt").display(),
        d.join("jane.key").display()
    ));
    let jane = |args: &[&str]| {
        let mut v = vec!["--kubeconfig", kc.to_str().expect("path")];
        v.extend(args);
        f.kubectl_with("kubectl", &v, None)
    };
    let who = json(&out(&jane(&["auth", "whoami", "-o", "json"])));
    assert_eq!(who["status"]["userInfo"]["username"], "jane", "{who}");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        serde_json::json!(["viewers", "system:authenticated"])
    );
    f.k(
        "kubectl",
        &[
            "create",
            "rolebinding",
            "viewers",
            "--clusterrole=view",
            "--group=viewers",
            "-n",
            "team-a",
        ],
    );
    assert!(eventually(30, || jane(&[
        "get",
        "configmaps",
        "-n",
        "team-a"
    ])
    .status
    .success()));
    let o = jane(&["get", "secrets", "-n", "team-a"]);
    assert!(
        err(&o).contains("secrets is forbidden: User \"jane\" cannot list resource \"secrets\" in API group \"\" in the namespace \"team-a\""),
        "{}",
        err(&o)
    );
    // A certificate from another CA is no identity.
    run(&[
        "req",
        "-x509",
        "-new",
        "-key",
        "jane.key",
        "-subj",
        "/O=system:masters/CN=mallory",
        "-days",
        "1",
        "-out",
        "self.crt",
    ]);
    write(&format!(
        "    client-certificate: {}\n    client-key: {}\n",
        d.join("self.crt").display(),
        d.join("jane.key").display()
    ));
    let o = jane(&["get", "secrets", "-A"]);
    assert!(
        !o.status.success(),
        "a self-signed certificate must not authenticate"
    );

    // Deleting the ServiceAccount revokes its tokens.
    f.k(
        "kubectl",
        &["delete", "serviceaccount", "reader", "-n", "team-a"],
    );
    assert!(
        eventually(30, || {
            let o = as_user(&f, &reader, &["get", "pods", "-n", "team-a"]);
            err(&o).contains("Unauthorized")
        }),
        "the deleted ServiceAccount's token is refused"
    );
}

/// Each component of `ferry up` runs as its own identity with least privilege: its kubeconfig
/// (mode 0600) names a client certificate of the cluster CA; what it needs works (the cluster
/// serves a Service through DNS, proxy and controllers without a single 403 in the log), what it
/// does not need is refused with upstream's message.
#[test]
fn components_run_with_their_own_identities() {
    use std::os::unix::fs::PermissionsExt;
    let f = Ferry::start();
    let dir = f.dir.path().join("kubeconfigs");
    // Written as the components start (after the API server is ready).
    let find_node = || {
        std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .find(|n| n.starts_with("node-"))
    };
    assert!(
        eventually(60, || find_node().is_some()),
        "no node kubeconfig\n{}",
        f.log()
    );
    let node = find_node().expect("a node kubeconfig");
    let node_user = format!("system:node:{}", node.trim_start_matches("node-"));
    let ids = [
        ("controllers", "system:kube-controller-manager"),
        ("proxy", "system:kube-proxy"),
        ("dns", "system:ferry:dns"),
        ("ingress", "system:ferry:ingress"),
        ("netpol", "system:ferry:netpol"),
        (node.as_str(), node_user.as_str()),
    ];
    let as_component = |base: &str, args: &[&str]| {
        let kc = dir.join(base).display().to_string();
        let mut v = vec!["--kubeconfig", kc.as_str()];
        v.extend(args);
        f.kubectl(&v)
    };
    for (base, user) in ids {
        let mode = std::fs::metadata(dir.join(base))
            .expect("kubeconfig")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{base}");
        let o = as_component(
            base,
            &[
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ],
        );
        assert_eq!(out(&o), user, "{base}: {}", err(&o));
    }
    // Allowed and refused, per identity: (kubeconfig, kubectl args, allowed, refusal).
    let forbidden = |user: &str, verb: &str, res: &str, scope: &str| {
        format!(
            "is forbidden: User \"{user}\" cannot {verb} resource \"{res}\" in API group \"\" {scope}"
        )
    };
    let cluster = "at the cluster scope";
    let table: Vec<(&str, Vec<&str>, Option<String>)> = vec![
        ("dns", vec!["get", "services", "-A"], None),
        ("dns", vec!["get", "pods", "-A"], None),
        (
            "dns",
            vec!["get", "secrets", "-A"],
            Some(forbidden("system:ferry:dns", "list", "secrets", cluster)),
        ),
        ("proxy", vec!["get", "nodes"], None),
        ("proxy", vec!["get", "endpointslices", "-A"], None),
        (
            "proxy",
            vec!["get", "secrets", "-A"],
            Some(forbidden("system:kube-proxy", "list", "secrets", cluster)),
        ),
        (
            "proxy",
            vec!["get", "pods", "-A"],
            Some(forbidden("system:kube-proxy", "list", "pods", cluster)),
        ),
        ("ingress", vec!["get", "ingresses", "-A"], None),
        (
            "ingress",
            vec!["get", "pods", "-A"],
            Some(forbidden("system:ferry:ingress", "list", "pods", cluster)),
        ),
        ("netpol", vec!["get", "networkpolicies", "-A"], None),
        (
            "netpol",
            vec!["get", "secrets", "-A"],
            Some(forbidden("system:ferry:netpol", "list", "secrets", cluster)),
        ),
        (node.as_str(), vec!["get", "nodes"], None),
        (
            node.as_str(),
            vec!["create", "namespace", "by-node"],
            Some(forbidden(&node_user, "create", "namespaces", cluster)),
        ),
        ("controllers", vec!["get", "secrets", "-A"], None),
        (
            "controllers",
            vec!["create", "clusterrolebinding", "grab", "--clusterrole=cluster-admin", "--user=x"],
            Some("is forbidden: User \"system:kube-controller-manager\" cannot create resource \"clusterrolebindings\" in API group \"rbac.authorization.k8s.io\" at the cluster scope".into()),
        ),
    ];
    for (base, args, refusal) in table {
        let o = as_component(base, &args);
        match refusal {
            None => assert!(o.status.success(), "{base} {args:?}: {}", err(&o)),
            Some(msg) => {
                assert!(!o.status.success(), "{base} {args:?} was allowed");
                assert!(err(&o).contains(&msg), "{base} {args:?}: {}", err(&o));
            }
        }
    }

    // The components do their work under these identities: a Deployment's pods become
    // endpoints of its Service (only what the components log from here on is checked).
    let seen = f.log().len();
    f.k(
        "kubectl",
        &[
            "create",
            "deployment",
            "web",
            "--image=registry.k8s.io/serve_hostname",
            "--port=9376",
        ],
    );
    f.k(
        "kubectl",
        &[
            "expose",
            "deployment",
            "web",
            "--port=80",
            "--target-port=9376",
        ],
    );
    assert!(
        eventually(90, || {
            let o = f.kubectl(&[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "-o",
                "jsonpath={.items[*].endpoints[*].conditions.ready}",
            ]);
            out(&o).contains("true")
        }),
        "web never got a ready endpoint\n{}",
        f.log()
    );
    let log = f.log().get(seen..).unwrap_or_default().to_string();
    assert!(
        !log.contains("is forbidden: User \"system:"),
        "a component was refused something it needs:\n{}",
        log.lines()
            .filter(|l| l.contains("is forbidden"))
            .take(10)
            .collect::<Vec<_>>()
            .join("\n")
    );

    // NodeRestriction: a node agent writes only its own Node and pods bound to it.
    let own = node.trim_start_matches("node-").to_string();
    let o = f.k_stdin(
        "kubectl",
        &["create", "-f", "-"],
        r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ghost-node"}}
{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray"},
 "spec": {"nodeName": "ghost-node", "containers": [{"name": "c", "image": "busybox"}]}}"#,
    );
    assert!(o.status.success(), "{}", err(&o));
    let o = as_component(&node, &["label", "node", &own, "h14=yes"]);
    assert!(o.status.success(), "{}", err(&o));
    let o = as_component(&node, &["label", "node", "ghost-node", "h14=yes"]);
    assert!(
        err(&o).contains(&format!(
            "nodes \"ghost-node\" is forbidden: node \"{own}\" is not allowed to modify node \"ghost-node\""
        )),
        "{}",
        err(&o)
    );
    let o = as_component(&node, &["delete", "pod", "stray", "--wait=false"]);
    assert!(
        err(&o).contains(&format!(
            "pods \"stray\" is forbidden: node \"{own}\" can only delete pods with spec.nodeName set to itself"
        )),
        "{}",
        err(&o)
    );

    // The Node authorizer: a node agent reads only the Secrets (ConfigMaps, ...) that pods bound
    // to it reference, one object at a time.
    let o = f.k_stdin(
        "kubectl",
        &["create", "-f", "-"],
        &format!(
            r#"{{"apiVersion": "v1", "kind": "Secret", "metadata": {{"name": "mine"}}, "stringData": {{"K": "v"}}}}
{{"apiVersion": "v1", "kind": "Secret", "metadata": {{"name": "theirs"}}, "stringData": {{"K": "v"}}}}
{{"apiVersion": "v1", "kind": "Secret", "metadata": {{"name": "nobodys"}}, "stringData": {{"K": "v"}}}}
{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "uses-mine"}},
 "spec": {{"nodeName": "{own}", "containers": [{{"name": "c", "image": "registry.k8s.io/serve_hostname",
   "envFrom": [{{"secretRef": {{"name": "mine"}}}}]}}]}}}}
{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "uses-theirs"}},
 "spec": {{"nodeName": "ghost-node", "containers": [{{"name": "c", "image": "busybox",
   "env": [{{"name": "K", "valueFrom": {{"secretKeyRef": {{"name": "theirs", "key": "K"}}}}}}]}}]}}}}"#
        ),
    );
    assert!(o.status.success(), "{}", err(&o));
    let o = as_component(
        &node,
        &["get", "secret", "mine", "-o", "jsonpath={.data.K}"],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "dg==");
    // A list or watch restricted to that one object, as kubelet's reflectors ask.
    let o = as_component(
        &node,
        &[
            "get",
            "secrets",
            "--field-selector=metadata.name=mine",
            "-o",
            "name",
        ],
    );
    assert_eq!(out(&o), "secret/mine", "{}", err(&o));
    let o = as_component(&node, &["auth", "can-i", "get", "secret/mine"]);
    assert_eq!(out(&o), "yes");
    for other in ["theirs", "nobodys"] {
        let o = as_component(&node, &["get", "secret", other]);
        let want = format!(
            "secrets \"{other}\" is forbidden: User \"{node_user}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node '{own}' and this object"
        );
        assert!(err(&o).contains(&want), "{other}: {}", err(&o));
        let o = as_component(&node, &["auth", "can-i", "get", &format!("secret/{other}")]);
        // kubectl prints the authorizer's reason after the answer, as upstream.
        assert_eq!(
            out(&o),
            format!("no - no relationship found between node '{own}' and this object"),
            "{other}"
        );
    }
    let o = as_component(&node, &["get", "secrets"]);
    assert!(
        err(&o).contains(&format!(
            "secrets is forbidden: User \"{node_user}\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\": No Object name found"
        )),
        "{}",
        err(&o)
    );
    let o = as_component(&node, &["get", "secrets", "-A"]);
    assert!(
        err(&o).contains(&format!(
            "secrets is forbidden: User \"{node_user}\" cannot list resource \"secrets\" in API group \"\" at the cluster scope: can only read namespaced object of this type"
        )),
        "{}",
        err(&o)
    );
    // The agent itself read the Secret under this authorizer: the pod runs.
    assert!(
        eventually(90, || {
            let o = f.kubectl(&["get", "pod", "uses-mine", "-o", "jsonpath={.status.phase}"]);
            out(&o) == "Running"
        }),
        "uses-mine never ran\n{}",
        f.log()
    );
    // Tokens only for the ServiceAccounts of its pods (the agent's own token requests for
    // `default` are checked by the pods above running with their projected tokens).
    let o = as_component(&node, &["create", "token", "robot"]);
    assert!(
        err(&o).contains(&format!(
            "serviceaccounts \"robot\" is forbidden: User \"{node_user}\" cannot create resource \"serviceaccounts/token\" in API group \"\" in the namespace \"default\": no relationship found between node '{own}' and this object"
        )),
        "{}",
        err(&o)
    );
    // The pod going away revokes the access.
    f.k(
        "kubectl",
        &["delete", "pod", "uses-mine", "--grace-period=0", "--force"],
    );
    assert!(
        eventually(60, || {
            let o = as_component(&node, &["get", "secret", "mine"]);
            err(&o).contains("no relationship found between node")
        }),
        "the node still reads a Secret of a deleted pod"
    );
}
